/* tok_normalize.c - tokenizer.json normalizers: Sequence, Prepend, Replace (String or Regex),
 * Lowercase, Strip, NFC (tok_nfc.c). The other Unicode forms (NFD, NFKC, NFKD) and the BERT /
 * SentencePiece "Precompiled" normalizers are refused with PL_ERR_UNSUPPORTED naming the type:
 * silently skipping one would give wrong ids. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "tok_internal.h"

#include <locale.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <wctype.h>

Status tok_parse_normalizer(const json_t *j, Normalizer **out, const char *path) {
    *out = NULL;
    if (json_is_null(j) || !j)
        return PL_OK;
    const char *type = tok_jstr(j, "type");
    if (!type)
        return pl_error_set(PL_ERR_FORMAT, "%s: normalizer without a \"type\"", path);
    Normalizer *n = pl_xcalloc(1, sizeof *n);
    Status st = PL_OK;
    if (!strcmp(type, "Sequence")) {
        n->type = NORM_SEQUENCE;
        json_t *arr = json_object_get(j, "normalizers");
        if (!json_is_array(arr)) {
            st = pl_error_set(PL_ERR_FORMAT, "%s: normalizer Sequence without \"normalizers\"",
                              path);
            goto fail;
        }
        n->kids = pl_xcalloc(json_array_size(arr), sizeof *n->kids);
        for (size_t i = 0; i < json_array_size(arr); i++) {
            if ((st = tok_parse_normalizer(json_array_get(arr, i), &n->kids[n->nkids], path)))
                goto fail;
            if (n->kids[n->nkids])
                n->nkids++;
        }
    } else if (!strcmp(type, "Prepend")) {
        n->type = NORM_PREPEND;
        json_t *v = json_object_get(j, "prepend");
        if (!json_is_string(v)) {
            st = pl_error_set(PL_ERR_FORMAT, "%s: normalizer Prepend without \"prepend\"", path);
            goto fail;
        }
        n->str_len = json_string_length(v);
        n->str = pl_xstrdup(json_string_value(v));
    } else if (!strcmp(type, "Replace")) {
        n->type = NORM_REPLACE;
        json_t *v = json_object_get(j, "content");
        if (!json_is_string(v)) {
            st = pl_error_set(PL_ERR_FORMAT, "%s: normalizer Replace without \"content\"", path);
            goto fail;
        }
        n->str_len = json_string_length(v);
        n->str = pl_xstrdup(json_string_value(v));
        if ((st = tok_jpattern(json_object_get(j, "pattern"), &n->pat, path, "normalizer Replace")))
            goto fail;
    } else if (!strcmp(type, "NFC")) {
        n->type = NORM_NFC;
    } else if (!strcmp(type, "Lowercase")) {
        n->type = NORM_LOWERCASE;
    } else if (!strcmp(type, "Strip")) {
        n->type = NORM_STRIP;
        n->left = tok_jbool(j, "strip_left", 1);
        n->right = tok_jbool(j, "strip_right", 1);
        if ((st = tok_pattern_compile_regex(&n->pat, "\\s", 2, path, "Strip")))
            goto fail;
    } else {
        st = pl_error_set(PL_ERR_UNSUPPORTED, "%s: normalizer type \"%s\" is not supported", path,
                          type);
        goto fail;
    }
    *out = n;
    return PL_OK;
fail:
    tok_free_normalizer(n);
    return st;
}

void tok_free_normalizer(Normalizer *n) {
    if (!n)
        return;
    for (int i = 0; i < n->nkids; i++)
        tok_free_normalizer(n->kids[i]);
    free(n->kids);
    free(n->str);
    tok_pattern_free(&n->pat);
    free(n);
}

/* Replace every non-overlapping match of pat in s with rep. */
static void replace_all(const Pattern *pat, const char *s, size_t n, const char *rep,
                        size_t rep_len, TBuf *out, TokCtx *cx) {
    tok_pattern_find_all(pat, s, n, cx->md, &cx->mv);
    size_t prev = 0;
    for (int i = 0; i < cx->mv.n; i++) {
        size_t a = cx->mv.v[2 * i], b = cx->mv.v[2 * i + 1];
        tok_buf_put(out, s + prev, a - prev);
        tok_buf_put(out, rep, rep_len);
        prev = b;
    }
    tok_buf_put(out, s + prev, n - prev);
}

static locale_t utf8_locale;
static void init_locale(void) {
    utf8_locale = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0);
}

static void lowercase(const char *s, size_t n, TBuf *out) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, init_locale);
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        int32_t cp;
        int k = tok_utf8_next(u + i, n - i, &cp);
        if (cp < 0x80) { /* ASCII or an invalid byte: keep the byte, lowercase ASCII */
            char c = (char)u[i];
            tok_buf_putc(out, (c >= 'A' && c <= 'Z') ? (char)(c + 32) : c);
        } else {
            wint_t lc = utf8_locale ? towlower_l((wint_t)cp, utf8_locale) : (wint_t)cp;
            char e[4];
            tok_buf_put(out, e, (size_t)tok_utf8_encode((uint32_t)lc, e));
        }
        i += (size_t)k;
    }
}

static void strip(const Normalizer *nz, const char *s, size_t n, TBuf *out, TokCtx *cx) {
    size_t a = 0, b = n;
    if (nz->left)
        while (a < b && tok_pattern_match_char(&nz->pat, s + a, b - a, cx->md)) {
            int32_t cp;
            a += (size_t)tok_utf8_next((const unsigned char *)s + a, b - a, &cp);
        }
    if (nz->right)
        while (b > a) {
            size_t c = b - 1; /* start of the last character */
            while (c > a && b - c < 4 && ((unsigned char)s[c] & 0xc0) == 0x80)
                c--;
            if (!tok_pattern_match_char(&nz->pat, s + c, b - c, cx->md))
                break;
            b = c;
        }
    tok_buf_put(out, s + a, b - a);
}

static void apply1(const Normalizer *nz, const char *s, size_t n, TBuf *out, TokCtx *cx) {
    switch (nz->type) {
        case NORM_PREPEND:
            if (n)
                tok_buf_put(out, nz->str, nz->str_len);
            tok_buf_put(out, s, n);
            break;
        case NORM_REPLACE:
            replace_all(&nz->pat, s, n, nz->str, nz->str_len, out, cx);
            break;
        case NORM_LOWERCASE:
            lowercase(s, n, out);
            break;
        case NORM_STRIP:
            strip(nz, s, n, out, cx);
            break;
        case NORM_NFC:
            tok_nfc(s, n, out);
            break;
        case NORM_SEQUENCE:
            PL_CHECK(0);
            break;
    }
}

void tok_normalize(const Normalizer *nz, const char *s, size_t n, TBuf *out, TokCtx *cx) {
    out->n = 0;
    if (!nz) {
        tok_buf_put(out, s, n);
        return;
    }
    if (nz->type != NORM_SEQUENCE) {
        apply1(nz, s, n, out, cx);
        return;
    }
    /* Sequence: ping-pong between out and cx->tmp2 */
    tok_buf_put(out, s, n);
    for (int i = 0; i < nz->nkids; i++) {
        TBuf *src = out, *dst = &cx->tmp2;
        dst->n = 0;
        if (nz->kids[i]->type == NORM_SEQUENCE) {
            TBuf saved = cx->tmp2; /* nested sequences are rare: recurse on a private buffer */
            TBuf sub = {0};
            cx->tmp2 = (TBuf){0};
            tok_normalize(nz->kids[i], src->p, src->n, &sub, cx);
            tok_buf_free(&cx->tmp2);
            cx->tmp2 = saved;
            src->n = 0;
            tok_buf_put(src, sub.p, sub.n);
            tok_buf_free(&sub);
            continue;
        }
        apply1(nz->kids[i], src->p, src->n, dst, cx);
        TBuf t = *out;
        *out = *dst;
        cx->tmp2 = t;
    }
}
