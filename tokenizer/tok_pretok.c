/* tok_pretok.c - tokenizer.json pre-tokenizers: Sequence, ByteLevel (GPT-2 regex + byte map),
 * Split (String/Regex, the five split behaviours, invert), Digits, Punctuation, Metaspace,
 * Whitespace, WhitespaceSplit, BertPreTokenizer, CharDelimiterSplit. The split behaviours
 * follow HF's NormalizedString::split exactly, since Falcon and Llama 3 depend on them. */
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>

/* HF's GPT-2 pattern (pre_tokenizers/byte_level.rs) */
static const char GPT2_RE[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
/* Rust char::is_ascii_punctuation || unicode punctuation (Pc Pd Ps Pe Pi Pf Po) */
static const char PUNCT_RE[] = "[\\p{P}!-/:-@\\[-`{-~]";

static int parse_behavior(const json_t *j, const char *key, SplitBehavior dflt, SplitBehavior *out,
                          const char *path) {
    const char *b = tok_jstr(j, key);
    *out = dflt;
    if (!b)
        return 0;
    static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                                  "Contiguous"};
    for (int i = 0; i < 5; i++)
        if (!strcmp(b, names[i])) {
            *out = (SplitBehavior)i;
            return 0;
        }
    pl_error_set(PL_ERR_UNSUPPORTED, "%s: split behavior \"%s\" is not supported", path, b);
    return -1;
}

static int prepend_scheme(const json_t *j) {
    const char *s = tok_jstr(j, "prepend_scheme");
    if (s)
        return !strcmp(s, "first")   ? PREPEND_FIRST
               : !strcmp(s, "never") ? PREPEND_NEVER
                                     : PREPEND_ALWAYS;
    return tok_jbool(j, "add_prefix_space", 1) ? PREPEND_ALWAYS : PREPEND_NEVER; /* legacy key */
}

static int metaspace_char(const json_t *j, char *out) {
    const char *r = tok_jstr(j, "replacement");
    if (!r)
        r = tok_jstr(j, "str_rep");
    if (!r || !*r)
        r = "\xe2\x96\x81"; /* U+2581 */
    int32_t cp;
    int k = tok_utf8_next((const unsigned char *)r, strlen(r), &cp);
    memcpy(out, r, (size_t)k);
    return k;
}

Status tok_parse_pretok(const json_t *j, PreTok **out, const char *path) {
    *out = NULL;
    if (!j || json_is_null(j))
        return PL_OK;
    const char *type = tok_jstr(j, "type");
    if (!type)
        return pl_error_set(PL_ERR_FORMAT, "%s: pre_tokenizer without a \"type\"", path);
    PreTok *p = pl_xcalloc(1, sizeof *p);
    Status st = PL_OK;
    if (!strcmp(type, "Sequence")) {
        p->type = PT_SEQUENCE;
        json_t *arr = json_object_get(j, "pretokenizers");
        if (!json_is_array(arr)) {
            st = pl_error_set(PL_ERR_FORMAT, "%s: pre_tokenizer Sequence without \"pretokenizers\"",
                              path);
            goto fail;
        }
        p->kids = pl_xcalloc(json_array_size(arr), sizeof *p->kids);
        for (size_t i = 0; i < json_array_size(arr); i++) {
            if ((st = tok_parse_pretok(json_array_get(arr, i), &p->kids[p->nkids], path)))
                goto fail;
            if (p->kids[p->nkids])
                p->nkids++;
        }
    } else if (!strcmp(type, "ByteLevel")) {
        p->type = PT_BYTELEVEL;
        p->add_prefix_space = tok_jbool(j, "add_prefix_space", 1);
        p->use_regex = tok_jbool(j, "use_regex", 1);
        if (p->use_regex &&
            (st = tok_pattern_compile_regex(&p->pat, GPT2_RE, strlen(GPT2_RE), path, "ByteLevel")))
            goto fail;
    } else if (!strcmp(type, "Split")) {
        p->type = PT_SPLIT;
        if ((st =
                 tok_jpattern(json_object_get(j, "pattern"), &p->pat, path, "pre_tokenizer Split")))
            goto fail;
        if (parse_behavior(j, "behavior", SPLIT_ISOLATED, &p->behavior, path)) {
            st = PL_ERR_UNSUPPORTED;
            goto fail;
        }
        p->invert = tok_jbool(j, "invert", 0);
    } else if (!strcmp(type, "Digits")) {
        p->type = PT_DIGITS;
        p->behavior = tok_jbool(j, "individual_digits", 0) ? SPLIT_ISOLATED : SPLIT_CONTIGUOUS;
        if ((st = tok_pattern_compile_regex(&p->pat, "\\p{N}", 5, path, "Digits")))
            goto fail;
    } else if (!strcmp(type, "Punctuation")) {
        p->type = PT_PUNCT;
        if (parse_behavior(j, "behavior", SPLIT_ISOLATED, &p->behavior, path)) {
            st = PL_ERR_UNSUPPORTED;
            goto fail;
        }
        if ((st = tok_pattern_compile_regex(&p->pat, PUNCT_RE, strlen(PUNCT_RE), path,
                                            "Punctuation")))
            goto fail;
    } else if (!strcmp(type, "Metaspace")) {
        p->type = PT_METASPACE;
        p->repl_len = metaspace_char(j, p->repl);
        p->prepend_scheme = prepend_scheme(j);
        p->split = tok_jbool(j, "split", 1);
        tok_pattern_set_literal(&p->pat, p->repl, (size_t)p->repl_len);
    } else if (!strcmp(type, "Whitespace")) {
        p->type = PT_WHITESPACE;
        static const char ws_re[] = "\\w+|[^\\w\\s]+";
        st = tok_pattern_compile_regex(&p->pat, ws_re, strlen(ws_re), path, "Whitespace");
    } else if (!strcmp(type, "WhitespaceSplit")) {
        p->type = PT_WSPLIT;
        st = tok_pattern_compile_regex(&p->pat, "\\s", 2, path, "WhitespaceSplit");
    } else if (!strcmp(type, "BertPreTokenizer")) {
        p->type = PT_BERT;
        if (!(st = tok_pattern_compile_regex(&p->pat, "\\s", 2, path, "BertPreTokenizer")))
            st = tok_pattern_compile_regex(&p->pat2, PUNCT_RE, strlen(PUNCT_RE), path,
                                           "BertPreTokenizer");
    } else if (!strcmp(type, "CharDelimiterSplit")) {
        p->type = PT_CHARDELIM;
        const char *d = tok_jstr(j, "delimiter");
        if (!d || !*d) {
            st = pl_error_set(PL_ERR_FORMAT, "%s: CharDelimiterSplit without \"delimiter\"", path);
            goto fail;
        }
        tok_pattern_set_literal(&p->pat, d, strlen(d));
    } else {
        st = pl_error_set(PL_ERR_UNSUPPORTED, "%s: pre_tokenizer type \"%s\" is not supported",
                          path, type);
    }
    if (st)
        goto fail;
    *out = p;
    return PL_OK;
fail:
    tok_free_pretok(p);
    return st;
}

void tok_free_pretok(PreTok *p) {
    if (!p)
        return;
    for (int i = 0; i < p->nkids; i++)
        tok_free_pretok(p->kids[i]);
    free(p->kids);
    tok_pattern_free(&p->pat);
    tok_pattern_free(&p->pat2);
    free(p);
}

/* ---- splitting ---------------------------------------------------------------------------- */
static void seg_push(TokCtx *cx, size_t a, size_t b, int m) {
    if (cx->nsegs == cx->capsegs) {
        cx->capsegs = cx->capsegs ? cx->capsegs * 2 : 64;
        cx->segs = pl_xrealloc(cx->segs, (size_t)cx->capsegs * 3 * sizeof *cx->segs);
    }
    int32_t *s = cx->segs + 3 * cx->nsegs++;
    s[0] = (int32_t)a;
    s[1] = (int32_t)b;
    s[2] = m;
}

static void push_mapped(PieceList *out, const char *s, size_t n, uint32_t flags, int byte_map) {
    if (byte_map)
        tok_pieces_push_bytelevel(out, s, n, flags);
    else
        tok_pieces_push_text(out, s, n, flags);
}

/* HF NormalizedString::split(pattern, behavior) on s[0..n), pushing the parts to out. */
static void split_text(const char *s, size_t n, uint32_t flags, const Pattern *pat,
                       SplitBehavior beh, int invert, int byte_map, PieceList *out, TokCtx *cx) {
    tok_pattern_find_all(pat, s, n, cx->md, &cx->mv);
    cx->nsegs = 0;
    size_t prev = 0;
    for (int i = 0; i < cx->mv.n; i++) {
        size_t a = cx->mv.v[2 * i], b = cx->mv.v[2 * i + 1];
        if (prev != a)
            seg_push(cx, prev, a, invert);
        seg_push(cx, a, b, !invert);
        prev = b;
    }
    if (prev != n)
        seg_push(cx, prev, n, invert);

    /* fold the (start, end, is_match) list by behaviour, in place */
    int32_t *sg = cx->segs;
    int m = 0, prev_match = 0;
    switch (beh) {
        case SPLIT_ISOLATED:
            m = cx->nsegs;
            break;
        case SPLIT_REMOVED:
            for (int i = 0; i < cx->nsegs; i++)
                if (!sg[3 * i + 2]) {
                    memmove(sg + 3 * m, sg + 3 * i, 3 * sizeof *sg);
                    m++;
                }
            break;
        case SPLIT_MERGED_PREV:
        case SPLIT_CONTIGUOUS:
            for (int i = 0; i < cx->nsegs; i++) {
                int is_match = sg[3 * i + 2];
                int merge =
                    beh == SPLIT_CONTIGUOUS ? is_match == prev_match : (is_match && !prev_match);
                if (merge && m > 0)
                    sg[3 * (m - 1) + 1] = sg[3 * i + 1];
                else {
                    memmove(sg + 3 * m, sg + 3 * i, 3 * sizeof *sg);
                    m++;
                }
                prev_match = is_match;
            }
            break;
        case SPLIT_MERGED_NEXT: /* fold from the right, then the kept parts are in order */
            m = 0;
            for (int i = cx->nsegs - 1; i >= 0; i--) {
                int is_match = sg[3 * i + 2];
                /* acc grows leftwards from the end of the array */
                int top = cx->nsegs - m; /* index of the last pushed (leftmost) element */
                if (is_match && !prev_match && m > 0)
                    sg[3 * top] = sg[3 * i];
                else {
                    int dst = cx->nsegs - 1 - m;
                    memmove(sg + 3 * dst, sg + 3 * i, 3 * sizeof *sg);
                    m++;
                }
                prev_match = is_match;
            }
            memmove(sg, sg + 3 * (cx->nsegs - m), (size_t)m * 3 * sizeof *sg);
            break;
    }
    for (int i = 0; i < m; i++) {
        size_t a = (size_t)sg[3 * i], b = (size_t)sg[3 * i + 1];
        push_mapped(out, s + a, b - a, a == 0 ? flags : 0, byte_map);
    }
}

static void pretok_piece(const PreTok *pt, const char *s, size_t n, uint32_t flags, PieceList *out,
                         TokCtx *cx) {
    switch (pt->type) {
        case PT_BYTELEVEL: {
            const char *src = s;
            if (pt->add_prefix_space && s[0] != ' ') {
                cx->tmp.n = 0;
                tok_buf_putc(&cx->tmp, ' ');
                tok_buf_put(&cx->tmp, s, n);
                src = cx->tmp.p;
                n = cx->tmp.n;
            }
            if (pt->use_regex)
                split_text(src, n, flags, &pt->pat, SPLIT_ISOLATED, 0, 1, out, cx);
            else
                push_mapped(out, src, n, flags, 1);
            break;
        }
        case PT_SPLIT:
            split_text(s, n, flags, &pt->pat, pt->behavior, pt->invert, 0, out, cx);
            break;
        case PT_DIGITS:
        case PT_PUNCT:
            split_text(s, n, flags, &pt->pat, pt->behavior, 0, 0, out, cx);
            break;
        case PT_WHITESPACE:
            split_text(s, n, flags, &pt->pat, SPLIT_REMOVED, 1, 0, out, cx);
            break;
        case PT_WSPLIT:
        case PT_CHARDELIM:
            split_text(s, n, flags, &pt->pat, SPLIT_REMOVED, 0, 0, out, cx);
            break;
        case PT_METASPACE: {
            TBuf *t = &cx->tmp;
            t->n = 0;
            int starts = n >= (size_t)pt->repl_len && !memcmp(s, pt->repl, (size_t)pt->repl_len);
            if (s[0] == ' ')
                starts = 1;
            if (!starts && (pt->prepend_scheme == PREPEND_ALWAYS ||
                            (pt->prepend_scheme == PREPEND_FIRST && (flags & PIECE_AT_START))))
                tok_buf_put(t, pt->repl, (size_t)pt->repl_len);
            for (size_t i = 0; i < n; i++) {
                if (s[i] == ' ')
                    tok_buf_put(t, pt->repl, (size_t)pt->repl_len);
                else
                    tok_buf_putc(t, s[i]);
            }
            if (pt->split)
                split_text(t->p, t->n, flags, &pt->pat, SPLIT_MERGED_NEXT, 0, 0, out, cx);
            else
                tok_pieces_push_text(out, t->p, t->n, flags);
            break;
        }
        case PT_BERT:
        case PT_SEQUENCE:
            PL_CHECK(0);
            break;
    }
}

static void pretok_list(const PreTok *pt, PieceList *in, PieceList *out, TokCtx *cx) {
    tok_pieces_reset(out);
    for (int i = 0; i < in->n; i++) {
        const Piece *pc = &in->v[i];
        if (pc->id >= 0)
            tok_pieces_push_id(out, pc->id);
        else
            pretok_piece(pt, in->text.p + pc->off, pc->len, pc->flags, out, cx);
    }
}

static void swap_lists(PieceList *a, PieceList *b) {
    PieceList t = *a;
    *a = *b;
    *b = t;
}

void tok_pretokenize(const PreTok *pt, PieceList *in, PieceList *spare, TokCtx *cx) {
    if (!pt)
        return;
    if (pt->type == PT_SEQUENCE) {
        for (int i = 0; i < pt->nkids; i++)
            tok_pretokenize(pt->kids[i], in, spare, cx);
        return;
    }
    if (pt->type == PT_BERT) { /* whitespace removed, then punctuation isolated */
        PreTok ws = {.type = PT_WSPLIT, .pat = pt->pat};
        PreTok pu = {.type = PT_PUNCT, .pat = pt->pat2, .behavior = SPLIT_ISOLATED};
        pretok_list(&ws, in, spare, cx);
        swap_lists(in, spare);
        pretok_list(&pu, in, spare, cx);
        swap_lists(in, spare);
        return;
    }
    pretok_list(pt, in, spare, cx);
    swap_lists(in, spare);
}
