/* tok_pattern.c - the String / Regex patterns of tokenizer.json (Split, Replace) through
 * PCRE2 with UTF + UCP, so \p{L}, \p{N}, \s see Unicode as Oniguruma (HF's engine) does.
 * PCRE2_MATCH_INVALID_UTF lets any bytes through: ill-formed sequences simply never match. */
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>

/* Oniguruma's \s is Unicode White_Space, which has U+0085 (NEL); PCRE2's \s with UCP does not.
 * Rewrite \s to include it, inside and outside character classes. */
static char *rewrite_space(const char *src, size_t len, size_t *out_len) {
    TBuf b = {0};
    int in_class = 0;
    for (size_t i = 0; i < len; i++) {
        char c = src[i];
        if (c == '\\' && i + 1 < len) {
            char d = src[i + 1];
            if (d == 's')
                tok_buf_put(&b, in_class ? "\\s\\x{85}" : "[\\s\\x{85}]", in_class ? 8 : 10);
            else if (d == 'S' && !in_class)
                tok_buf_put(&b, "[^\\s\\x{85}]", 11);
            else
                tok_buf_put(&b, src + i, 2);
            i++;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = 1;
            tok_buf_putc(&b, c);
            /* a ']' right after '[' or '[^' is literal */
            if (i + 1 < len && src[i + 1] == '^') {
                tok_buf_putc(&b, '^');
                i++;
            }
            if (i + 1 < len && src[i + 1] == ']') {
                tok_buf_putc(&b, ']');
                i++;
            }
            continue;
        }
        if (in_class && c == '[' && i + 1 < len && src[i + 1] == ':') { /* [:alpha:] */
            const char *end = memchr(src + i + 2, ']', len - i - 2);
            if (end) {
                size_t k = (size_t)(end - (src + i)) + 1;
                tok_buf_put(&b, src + i, k);
                i += k - 1;
                continue;
            }
        }
        if (in_class && c == ']')
            in_class = 0;
        tok_buf_putc(&b, c);
    }
    if (!b.p)
        tok_buf_reserve(&b, 0);
    *out_len = b.n;
    return b.p;
}

Status tok_pattern_compile_regex(Pattern *p, const char *src, size_t len, const char *path,
                                 const char *what) {
    memset(p, 0, sizeof *p);
    size_t rlen;
    char *rsrc = rewrite_space(src, len, &rlen);
    int err;
    PCRE2_SIZE off;
    p->re = pcre2_compile((PCRE2_SPTR)rsrc, rlen, PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF,
                          &err, &off, NULL);
    free(rsrc);
    if (!p->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return pl_error_set(PL_ERR_FORMAT, "%s: %s regex /%.*s/ does not compile: %s", path, what,
                            (int)(len > 200 ? 200 : len), src, (const char *)msg);
    }
    pcre2_jit_compile(p->re, PCRE2_JIT_COMPLETE); /* best effort; falls back to the interpreter */
    return PL_OK;
}

void tok_pattern_set_literal(Pattern *p, const char *s, size_t n) {
    memset(p, 0, sizeof *p);
    p->lit = pl_xmalloc(n + 1);
    memcpy(p->lit, s, n);
    p->lit[n] = 0;
    p->lit_len = n;
}

void tok_pattern_free(Pattern *p) {
    free(p->lit);
    pcre2_code_free(p->re);
    p->lit = NULL;
    p->re = NULL;
}

/* memmem through memchr: sanitizers' memmem checks the whole haystack on every call, which made
 * a replace-all over a long text quadratic under TSan. */
static const char *find_lit(const char *s, size_t n, const char *lit, size_t k) {
    const char *end = s + n;
    while ((size_t)(end - s) >= k) {
        const char *q = memchr(s, lit[0], (size_t)(end - s) - k + 1);
        if (!q)
            return NULL;
        if (!memcmp(q + 1, lit + 1, k - 1))
            return q;
        s = q + 1;
    }
    return NULL;
}

static int re_match(const pcre2_code *re, const char *s, size_t n, size_t from, uint32_t opts,
                    pcre2_match_data *md) {
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, from, opts, md, NULL);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
        rc = pcre2_match(re, (PCRE2_SPTR)s, n, from, opts | PCRE2_NO_JIT, md, NULL);
    return rc;
}

int tok_pattern_find(const Pattern *p, const char *s, size_t n, size_t from, pcre2_match_data *md,
                     size_t *ms, size_t *me) {
    if (from > n)
        return 0;
    if (p->lit) {
        if (!p->lit_len)
            return 0;
        const char *q = find_lit(s + from, n - from, p->lit, p->lit_len);
        if (!q)
            return 0;
        *ms = (size_t)(q - s);
        *me = *ms + p->lit_len;
        return 1;
    }
    if (!p->re)
        return 0;
    int rc = re_match(p->re, s, n, from, 0, md);
    if (rc < 0)
        return 0; /* no match (or a resource limit: treat as no more matches) */
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    *ms = ov[0];
    *me = ov[1];
    if (*me < *ms) /* \K tricks; keep callers sane */
        *me = *ms;
    return 1;
}

static void mv_push(MatchVec *v, size_t a, size_t b) {
    if (v->n == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 64;
        v->v = pl_xrealloc(v->v, (size_t)v->cap * 2 * sizeof *v->v);
    }
    v->v[2 * v->n] = a;
    v->v[2 * v->n + 1] = b;
    v->n++;
}

void tok_pattern_find_all(const Pattern *p, const char *s, size_t n, pcre2_match_data *md,
                          MatchVec *out) {
    out->n = 0;
    size_t pos = 0, last_end = (size_t)-1;
    while (pos <= n) {
        size_t a, b;
        if (!tok_pattern_find(p, s, n, pos, md, &a, &b))
            break;
        if (a == b && a == last_end) {
            /* no empty match right after the previous match: step one character */
            if (a >= n)
                break;
            int32_t cp;
            pos = a + (size_t)tok_utf8_next((const unsigned char *)s + a, n - a, &cp);
            continue;
        }
        mv_push(out, a, b);
        last_end = b;
        if (b > pos)
            pos = b;
        else { /* empty match: advance one character */
            if (b >= n)
                break;
            int32_t cp;
            pos = b + (size_t)tok_utf8_next((const unsigned char *)s + b, n - b, &cp);
        }
    }
}

int tok_pattern_match_char(const Pattern *p, const char *s, size_t n, pcre2_match_data *md) {
    if (!n || !p->re)
        return 0;
    int32_t cp;
    size_t k = (size_t)tok_utf8_next((const unsigned char *)s, n, &cp);
    return re_match(p->re, s, k, 0, PCRE2_ANCHORED, md) >= 0;
}

Status tok_jpattern(const json_t *obj, Pattern *out, const char *path, const char *what) {
    memset(out, 0, sizeof *out);
    json_t *v;
    if (json_is_object(obj) && json_is_string(v = json_object_get(obj, "String"))) {
        tok_pattern_set_literal(out, json_string_value(v), json_string_length(v));
        return PL_OK;
    }
    if (json_is_object(obj) && json_is_string(v = json_object_get(obj, "Regex")))
        return tok_pattern_compile_regex(out, json_string_value(v), json_string_length(v), path,
                                         what);
    return pl_error_set(PL_ERR_FORMAT,
                        "%s: %s pattern must be {\"String\": ...} or {\"Regex\": ...}", path, what);
}
