/* tok_decode.c - tokenizer.json decoders and ids -> text.
 *
 * As HF's decode: special tokens are dropped first (skip_special), then the decoder chain
 * (Sequence, Replace, ByteFallback, Fuse, Strip, ByteLevel, Metaspace, BPEDecoder) rewrites the
 * list of token strings, which is finally joined ("" with a decoder, " " without one).
 * ByteLevel output is converted like Rust's from_utf8_lossy; ByteFallback turns a run of
 * <0xNN> tokens into its text, or into one U+FFFD per byte if the run is not valid UTF-8.
 * DECODE_STREAM holds back a truncated character at the end instead (see tok_stream.c). */
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>

Status tok_parse_decoder(const json_t *j, Decoder **out, const char *path) {
    *out = NULL;
    if (!j || json_is_null(j))
        return PL_OK;
    const char *type = tok_jstr(j, "type");
    if (!type)
        return pl_error_set(PL_ERR_FORMAT, "%s: decoder without a \"type\"", path);
    Decoder *d = pl_xcalloc(1, sizeof *d);
    Status st = PL_OK;
    if (!strcmp(type, "Sequence")) {
        d->type = DEC_SEQUENCE;
        json_t *arr = json_object_get(j, "decoders");
        if (!json_is_array(arr)) {
            st = pl_error_set(PL_ERR_FORMAT, "%s: decoder Sequence without \"decoders\"", path);
            goto fail;
        }
        d->kids = pl_xcalloc(json_array_size(arr), sizeof *d->kids);
        for (size_t i = 0; i < json_array_size(arr); i++) {
            if ((st = tok_parse_decoder(json_array_get(arr, i), &d->kids[d->nkids], path)))
                goto fail;
            if (d->kids[d->nkids])
                d->nkids++;
        }
    } else if (!strcmp(type, "Replace")) {
        d->type = DEC_REPLACE;
        json_t *v = json_object_get(j, "content");
        if (!json_is_string(v)) {
            st = pl_error_set(PL_ERR_FORMAT, "%s: decoder Replace without \"content\"", path);
            goto fail;
        }
        d->str_len = json_string_length(v);
        d->str = pl_xmalloc(d->str_len + 1);
        memcpy(d->str, json_string_value(v), d->str_len + 1);
        st = tok_jpattern(json_object_get(j, "pattern"), &d->pat, path, "decoder Replace");
    } else if (!strcmp(type, "ByteFallback")) {
        d->type = DEC_BYTEFALLBACK;
    } else if (!strcmp(type, "Fuse")) {
        d->type = DEC_FUSE;
    } else if (!strcmp(type, "Strip")) {
        d->type = DEC_STRIP;
        const char *c = tok_jstr(j, "content");
        if (!c || !*c)
            c = " ";
        int32_t cp;
        d->strip_ch_len = tok_utf8_next((const unsigned char *)c, strlen(c), &cp);
        memcpy(d->strip_ch, c, (size_t)d->strip_ch_len);
        json_t *a = json_object_get(j, "start"), *b = json_object_get(j, "stop");
        d->start = json_is_integer(a) ? (int)json_integer_value(a) : 0;
        d->stop = json_is_integer(b) ? (int)json_integer_value(b) : 0;
    } else if (!strcmp(type, "ByteLevel")) {
        d->type = DEC_BYTELEVEL;
    } else if (!strcmp(type, "Metaspace")) {
        d->type = DEC_METASPACE;
        const char *r = tok_jstr(j, "replacement");
        if (!r || !*r)
            r = "\xe2\x96\x81";
        int32_t cp;
        d->repl_len = tok_utf8_next((const unsigned char *)r, strlen(r), &cp);
        memcpy(d->repl, r, (size_t)d->repl_len);
        const char *ps = tok_jstr(j, "prepend_scheme");
        d->prepend_scheme =
            ps ? (!strcmp(ps, "never") ? PREPEND_NEVER : PREPEND_ALWAYS)
               : (tok_jbool(j, "add_prefix_space", 1) ? PREPEND_ALWAYS : PREPEND_NEVER);
    } else if (!strcmp(type, "BPEDecoder")) {
        d->type = DEC_BPE_SUFFIX;
        const char *sfx = tok_jstr(j, "suffix");
        d->str = pl_xstrdup(sfx ? sfx : "</w>");
        d->str_len = strlen(d->str);
    } else {
        st = pl_error_set(PL_ERR_UNSUPPORTED, "%s: decoder type \"%s\" is not supported", path,
                          type);
    }
    if (st)
        goto fail;
    *out = d;
    return PL_OK;
fail:
    tok_free_decoder(d);
    return st;
}

void tok_free_decoder(Decoder *d) {
    if (!d)
        return;
    for (int i = 0; i < d->nkids; i++)
        tok_free_decoder(d->kids[i]);
    free(d->kids);
    free(d->str);
    tok_pattern_free(&d->pat);
    free(d);
}

void tok_decctx_free(DecCtx *dc) {
    tok_buf_free(&dc->a.text);
    tok_buf_free(&dc->b.text);
    free(dc->a.o);
    free(dc->b.o);
    tok_buf_free(&dc->bytes);
    if (dc->md)
        pcre2_match_data_free(dc->md);
    memset(dc, 0, sizeof *dc);
}

/* ---- token lists ---------------------------------------------------------------------------- */
static void tl_reset(TList *l) {
    l->n = 0;
    l->text.n = 0;
}

/* Start a new token at the end of l's text; the caller appends bytes, then tl_end. */
static void tl_begin(TList *l) {
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 64;
        l->o = pl_xrealloc(l->o, (size_t)l->cap * 2 * sizeof *l->o);
    }
    l->o[2 * l->n] = (uint32_t)l->text.n;
}
static void tl_end(TList *l) {
    l->o[2 * l->n + 1] = (uint32_t)l->text.n - l->o[2 * l->n];
    l->n++;
}
static void tl_push(TList *l, const char *s, size_t n) {
    tl_begin(l);
    tok_buf_put(&l->text, s, n);
    tl_end(l);
}
#define TOK(l, i)  ((l)->text.p + (l)->o[2 * (i)])
#define TLEN(l, i) ((size_t)(l)->o[2 * (i) + 1])

static int byte_token(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>')
        return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

static void flush_bytes(DecCtx *dc, TList *out, int mode, int at_end) {
    TBuf *b = &dc->bytes;
    if (!b->n)
        return;
    tl_begin(out);
    if (mode == DECODE_TOKEN) {
        tok_buf_put(&out->text, b->p, b->n);
    } else if (mode == DECODE_HF) {
        if (tok_utf8_is_valid(b->p, b->n))
            tok_buf_put(&out->text, b->p, b->n);
        else
            for (size_t i = 0; i < b->n; i++)
                tok_buf_put(&out->text, "\xef\xbf\xbd", 3);
    } else {
        size_t hold = 0;
        tok_utf8_lossy(&out->text, b->p, b->n, mode == DECODE_STREAM && at_end ? &hold : NULL);
        dc->held = hold;
    }
    tl_end(out);
    b->n = 0;
}

static void apply(const Decoder *d, DecCtx *dc, TList **in, TList **out, int mode) {
    TList *src = *in, *dst = *out;
    if (d->type == DEC_SEQUENCE) {
        for (int i = 0; i < d->nkids; i++)
            apply(d->kids[i], dc, in, out, mode);
        return;
    }
    tl_reset(dst);
    switch (d->type) {
        case DEC_REPLACE:
            for (int i = 0; i < src->n; i++) {
                const char *s = src->text.p ? TOK(src, i) : ""; /* no text yet: empty tokens */
                size_t n = TLEN(src, i), prev = 0, pos = 0, a, b;
                tl_begin(dst);
                while (pos <= n && tok_pattern_find(&d->pat, s, n, pos, dc->md, &a, &b)) {
                    if (b == a) { /* empty match: replace nothing, step one character */
                        int32_t cp;
                        if (a >= n)
                            break;
                        pos = a + (size_t)tok_utf8_next((const unsigned char *)s + a, n - a, &cp);
                        continue;
                    }
                    tok_buf_put(&dst->text, s + prev, a - prev);
                    tok_buf_put(&dst->text, d->str, d->str_len);
                    prev = pos = b;
                }
                tok_buf_put(&dst->text, s + prev, n - prev);
                tl_end(dst);
            }
            break;
        case DEC_BYTEFALLBACK:
            dc->bytes.n = 0;
            for (int i = 0; i < src->n; i++) {
                int v = byte_token(TOK(src, i), TLEN(src, i));
                if (v >= 0) {
                    tok_buf_putc(&dc->bytes, (char)v);
                    continue;
                }
                flush_bytes(dc, dst, mode, 0);
                tl_push(dst, TOK(src, i), TLEN(src, i));
            }
            flush_bytes(dc, dst, mode, 1);
            break;
        case DEC_FUSE:
            tl_begin(dst);
            for (int i = 0; i < src->n; i++)
                tok_buf_put(&dst->text, TOK(src, i), TLEN(src, i));
            tl_end(dst);
            break;
        case DEC_STRIP:
            for (int i = 0; i < src->n; i++) {
                const char *s = src->text.p ? TOK(src, i) : ""; /* no text yet: empty tokens */
                size_t a = 0, b = TLEN(src, i), cl = (size_t)d->strip_ch_len;
                if (mode == DECODE_TOKEN) { /* the text's ends are elsewhere */
                    tl_push(dst, s, b);
                    continue;
                }
                for (int k = 0; k < d->start && b - a >= cl && !memcmp(s + a, d->strip_ch, cl); k++)
                    a += cl;
                for (int k = 0; k < d->stop && b - a >= cl && !memcmp(s + b - cl, d->strip_ch, cl);
                     k++)
                    b -= cl;
                tl_push(dst, s + a, b - a);
            }
            break;
        case DEC_BYTELEVEL: {
            TBuf *raw = &dc->bytes;
            raw->n = 0;
            for (int i = 0; i < src->n; i++) {
                const unsigned char *s = (const unsigned char *)TOK(src, i);
                size_t n = TLEN(src, i), start = raw->n, j = 0;
                while (j < n) {
                    int32_t cp;
                    int k = tok_utf8_next(s + j, n - j, &cp);
                    int byte = tok_cp_to_byte(cp);
                    if (byte < 0)
                        break;
                    tok_buf_putc(raw, (char)byte);
                    j += (size_t)k;
                }
                if (j < n) { /* not all chars are byte chars: the token's own bytes */
                    raw->n = start;
                    tok_buf_put(raw, s, n);
                }
            }
            tl_begin(dst);
            size_t hold = 0;
            if (mode == DECODE_TOKEN)
                tok_buf_put(&dst->text, raw->p ? raw->p : "", raw->n);
            else
                tok_utf8_lossy(&dst->text, raw->p ? raw->p : "", raw->n,
                               mode == DECODE_STREAM ? &hold : NULL);
            dc->held = hold;
            tl_end(dst);
            break;
        }
        case DEC_METASPACE:
            for (int i = 0; i < src->n; i++) {
                const char *s = src->text.p ? TOK(src, i) : ""; /* no text yet: empty tokens */
                size_t n = TLEN(src, i), rl = (size_t)d->repl_len;
                int drop = i == 0 && d->prepend_scheme != PREPEND_NEVER && mode != DECODE_TOKEN;
                tl_begin(dst);
                for (size_t j = 0; j < n;) {
                    if (n - j >= rl && !memcmp(s + j, d->repl, rl)) {
                        if (!drop)
                            tok_buf_putc(&dst->text, ' ');
                        j += rl;
                    } else
                        tok_buf_putc(&dst->text, s[j++]);
                }
                tl_end(dst);
            }
            break;
        case DEC_BPE_SUFFIX:
            for (int i = 0; i < src->n; i++) {
                const char *s = src->text.p ? TOK(src, i) : ""; /* no text yet: empty tokens */
                size_t n = TLEN(src, i), j = 0;
                tl_begin(dst);
                while (j < n) {
                    if (d->str_len && n - j >= d->str_len && !memcmp(s + j, d->str, d->str_len)) {
                        if (i != src->n - 1 || mode == DECODE_TOKEN)
                            tok_buf_putc(&dst->text, ' ');
                        j += d->str_len;
                    } else
                        tok_buf_putc(&dst->text, s[j++]);
                }
                tl_end(dst);
            }
            break;
        case DEC_SEQUENCE:
            break;
    }
    *in = dst;
    *out = src;
}

size_t tok_decode_into(const Tokenizer *t, const int32_t *ids, int n, int skip_special, int mode,
                       DecCtx *dc, TBuf *out) {
    if (!dc->md) {
        dc->md = pcre2_match_data_create(1, NULL);
        PL_CHECK(dc->md != NULL);
    }
    dc->held = 0;
    TList *in = &dc->a, *spare = &dc->b;
    tl_reset(in);
    for (int i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->vocab_size || !t->toks[id])
            continue;
        if (skip_special && (t->tok_flags[id] & TOKF_SPECIAL))
            continue;
        tl_push(in, t->toks[id], t->tok_len[id]);
    }
    if (t->dec)
        apply(t->dec, dc, &in, &spare, mode);
    out->n = 0;
    tok_buf_reserve(out, in->text.n + (size_t)in->n);
    out->p[0] = 0;
    for (int i = 0; i < in->n; i++) {
        if (i && !t->dec)
            tok_buf_putc(out, ' ');
        tok_buf_put(out, TOK(in, i), TLEN(in, i));
    }
    if (mode != DECODE_TOKEN && !tok_utf8_is_valid(out->p, out->n)) { /* stay valid */
        TBuf fixed = {0};
        tok_utf8_lossy(&fixed, out->p, out->n, NULL);
        tok_buf_free(out);
        *out = fixed;
    }
    return dc->held;
}
