/* tokenizer.c - the public tokenizer API (include/tokenizer.h): encode, decode and lookups.
 *
 * encode = cut raw-matched added tokens -> normalize each remaining part -> cut normalized
 * added tokens -> pre-tokenize -> BPE each piece -> post-process (BOS/EOS), the order of HF's
 * TokenizerImpl::encode. Loading lives in tok_load.c, streaming in tok_stream.c. */
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>

int tok_vocab_size(const Tokenizer *t) {
    return t->vocab_size;
}

int tok_bos_id(const Tokenizer *t) {
    return t->bos_id;
}

int tok_eos_id(const Tokenizer *t) {
    return t->eos_id;
}

const char *tok_id_to_token(const Tokenizer *t, int id) {
    if (id < 0 || id >= t->vocab_size)
        return NULL;
    return t->toks[id];
}

int tok_token_to_id(const Tokenizer *t, const char *token) {
    size_t n = strlen(token);
    int32_t id = tok_strmap_get(&t->added_map, token, n);
    return id >= 0 ? id : tok_strmap_get(&t->vocab, token, n);
}

int tok_is_special(const Tokenizer *t, int id) {
    return id >= 0 && id < t->vocab_size && (t->tok_flags[id] & TOKF_SPECIAL);
}

static void add_ids(int32_t **ids, int *n, int *cap, const int32_t *src, int k) {
    if (*n + k > *cap) {
        while (*n + k > *cap)
            *cap = *cap ? *cap * 2 : 64;
        *ids = pl_xrealloc(*ids, (size_t)*cap * sizeof **ids);
    }
    memcpy(*ids + *n, src, (size_t)k * sizeof *src);
    *n += k;
}

/* BOS/EOS: add_bos_token / add_eos_token from tokenizer_config.json replace a template
 * post-processor (as transformers' LlamaTokenizerFast does); otherwise the post-processor. */
static void post_process(const Tokenizer *t, int32_t **ids, int *n, int *cap) {
    const int32_t *tm = t->post.tmpl;
    int ntm = t->post.ntmpl;
    int32_t cfg[3];
    if ((t->cfg_add_bos >= 0 || t->cfg_add_eos >= 0) && (!t->post.present || t->post.is_template)) {
        ntm = 0;
        if (t->cfg_add_bos == 1 && t->bos_id >= 0)
            cfg[ntm++] = t->bos_id;
        cfg[ntm++] = -1;
        if (t->cfg_add_eos == 1 && t->eos_id >= 0)
            cfg[ntm++] = t->eos_id;
        tm = cfg;
    } else if (!t->post.present)
        return;
    int before = 0, after = 0, seen = 0;
    for (int i = 0; i < ntm; i++) {
        if (tm[i] == -1)
            seen = 1;
        else if (seen)
            after++;
        else
            before++;
    }
    if (!before && !after)
        return;
    int32_t *out = pl_xmalloc((size_t)(*n + before + after + 1) * sizeof *out);
    int k = 0;
    for (int i = 0; i < ntm; i++) {
        if (tm[i] == -1) {
            if (*n)
                memcpy(out + k, *ids, (size_t)*n * sizeof *out);
            k += *n;
        } else
            out[k++] = tm[i];
    }
    free(*ids);
    *ids = out;
    *n = k;
    *cap = k;
}

Status tok_encode(const Tokenizer *t, const char *text, size_t len, int add_special,
                  int32_t **ids_out, int *n_out) {
    *ids_out = NULL;
    *n_out = 0;
    if (!text && len)
        return pl_error_set(PL_ERR_INVALID, "tok_encode: NULL text");
    if (len > (size_t)1 << 30)
        return pl_error_set(PL_ERR_INVALID, "tok_encode: text of %zu bytes is too long", len);
    if (!text)
        text = "";
    TokCtx cx;
    tok_ctx_init(&cx);
    PieceList a = {0}, b = {0};

    /* 1. added tokens matched in the raw text */
    tok_split_added(t, &t->trie_raw, text, len, PIECE_AT_START, &a, &cx);
    /* 2. normalize each remaining part, then cut the normalized added tokens */
    for (int i = 0; i < a.n; i++) {
        const Piece *p = &a.v[i];
        if (p->id >= 0) {
            tok_pieces_push_id(&b, p->id);
            continue;
        }
        const char *s = a.text.p + p->off;
        size_t n = p->len;
        if (t->norm) {
            tok_normalize(t->norm, s, n, &cx.tmp, &cx);
            s = cx.tmp.p;
            n = cx.tmp.n;
        }
        tok_split_added(t, &t->trie_norm, s, n, p->flags, &b, &cx);
    }
    /* 3. pre-tokenize */
    tok_pretokenize(t->pretok, &b, &a, &cx);
    /* 4. the model */
    int32_t *ids = NULL;
    int nids = 0, cap = 0;
    for (int i = 0; i < b.n; i++) {
        const Piece *p = &b.v[i];
        if (p->id >= 0)
            add_ids(&ids, &nids, &cap, &p->id, 1);
        else
            tok_bpe_word(t, b.text.p + p->off, p->len, &cx, &ids, &nids, &cap);
    }
    tok_pieces_free(&a);
    tok_pieces_free(&b);
    tok_ctx_free(&cx);
    /* 5. post-processor */
    if (add_special)
        post_process(t, &ids, &nids, &cap);
    if (!ids)
        ids = pl_xmalloc(sizeof *ids);
    *ids_out = ids;
    *n_out = nids;
    return PL_OK;
}

char *tok_token_bytes(const Tokenizer *t, int id, size_t *len) {
    *len = 0;
    if (id < 0 || id >= t->vocab_size || !t->toks[id] || (t->tok_flags[id] & TOKF_SPECIAL))
        return NULL;
    DecCtx dc = {0};
    TBuf out = {0};
    int32_t one = id;
    tok_decode_into(t, &one, 1, 0, DECODE_TOKEN, &dc, &out);
    tok_decctx_free(&dc);
    *len = out.p ? out.n : 0;
    return out.p ? out.p : pl_xstrdup("");
}

char *tok_decode(const Tokenizer *t, const int32_t *ids, int n, int skip_special, size_t *len) {
    DecCtx dc = {0};
    TBuf out = {0};
    tok_decode_into(t, ids, n, skip_special, DECODE_HF, &dc, &out);
    tok_decctx_free(&dc);
    if (len)
        *len = out.p ? out.n : 0;
    return out.p ? out.p : pl_xstrdup("");
}
