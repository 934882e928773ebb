/* vocab.c - a model's vocabulary as a byte trie laid out in depth-first preorder: node i has
 * the byte of its incoming edge, its depth and the index just past its subtree, so a mask is
 * one forward scan that jumps over every subtree the automaton rejects at its first byte. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "gr_internal.h"

static atomic_uint_fast64_t next_vocab_id = 1;

typedef struct {
    const uint8_t *s;
    uint32_t len;
    int id;
} Tok;

static int cmp_tok(const void *x, const void *y) {
    const Tok *a = x, *b = y;
    uint32_t n = a->len < b->len ? a->len : b->len;
    int c = memcmp(a->s, b->s, n);
    if (c)
        return c;
    if (a->len != b->len)
        return a->len < b->len ? -1 : 1;
    return a->id - b->id;
}

GrVocab *gr_vocab_new(const char *const *token_bytes, const size_t *lens, int n, const int *eos_ids,
                      int n_eos, char *err, size_t errlen) {
    if (n <= 0 || n_eos < 0 || (n_eos && !eos_ids)) {
        snprintf(err, errlen, "a vocabulary needs tokens (n = %d, %d EOS ids)", n, n_eos);
        return NULL;
    }
    for (int i = 0; i < n_eos; i++)
        if (eos_ids[i] < 0 || eos_ids[i] >= n) {
            snprintf(err, errlen, "EOS id %d is outside the vocabulary of %d", eos_ids[i], n);
            return NULL;
        }
    GrVocab *v = pl_xcalloc(1, sizeof *v);
    v->n = n;
    v->id = atomic_fetch_add(&next_vocab_id, 1);
    v->bytes = pl_xcalloc(n, sizeof *v->bytes);
    v->lens = pl_xcalloc(n, sizeof *v->lens);
    v->is_eos = pl_xcalloc(n, 1);
    v->same = pl_xmalloc(n * sizeof *v->same);
    v->eos = pl_xmalloc((n_eos + 1) * sizeof *v->eos);
    v->neos = n_eos;
    for (int i = 0; i < n_eos; i++) {
        v->eos[i] = eos_ids[i];
        v->is_eos[eos_ids[i]] = 1;
    }
    Tok *toks = pl_xmalloc(n * sizeof *toks);
    int nt = 0;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        v->same[i] = -1;
        if (!token_bytes[i] || !lens[i] || v->is_eos[i] || lens[i] > 65535)
            continue;
        v->lens[i] = (uint32_t)lens[i];
        v->bytes[i] = pl_xmalloc(lens[i]);
        memcpy(v->bytes[i], token_bytes[i], lens[i]);
        toks[nt++] = (Tok){v->bytes[i], (uint32_t)lens[i], i};
        total += lens[i];
    }
    qsort(toks, nt, sizeof *toks, cmp_tok);
    /* at most one node per byte of all tokens */
    v->node = pl_xmalloc((total + 1) * sizeof *v->node);
    int *path = pl_xmalloc((65536 + 1) * sizeof *path); /* node at each depth of the last token */
    int depth = 0, nn = 0;
    for (int t = 0; t < nt; t++) {
        uint32_t lcp = 0;
        if (t) {
            const Tok *p = &toks[t - 1];
            while (lcp < p->len && lcp < toks[t].len && p->s[lcp] == toks[t].s[lcp])
                lcp++;
        }
        for (; depth > (int)lcp; depth--)
            v->node[path[depth]].skip = nn;
        if (lcp == toks[t].len && t) { /* same bytes as the previous token */
            int last = v->node[path[depth]].token;
            while (v->same[last] >= 0)
                last = v->same[last];
            v->same[last] = toks[t].id;
            continue;
        }
        for (uint32_t i = lcp; i < toks[t].len; i++) {
            v->node[nn] = (GrTrieNode){.depth = (uint16_t)(i + 1),
                                       .byte = toks[t].s[i],
                                       .token = -1,
                                       .parent = depth ? path[depth] : -1};
            path[++depth] = nn++;
        }
        v->node[path[depth]].token = toks[t].id;
        if (depth > v->max_depth)
            v->max_depth = depth;
    }
    for (; depth > 0; depth--)
        v->node[path[depth]].skip = nn;
    v->nnodes = nn;
    free(path);
    free(toks);
    return v;
}

void gr_vocab_free(GrVocab *v) {
    if (!v)
        return;
    for (int i = 0; i < v->n; i++)
        free(v->bytes[i]);
    free(v->bytes);
    free(v->lens);
    free(v->is_eos);
    free(v->same);
    free(v->eos);
    free(v->node);
    free(v);
}

int gr_vocab_size(const GrVocab *v) {
    return v->n;
}

size_t gr_vocab_mask_words(const GrVocab *v) {
    return ((size_t)v->n + 31) / 32;
}

const char *gr_vocab_token(const GrVocab *v, int id, size_t *len) {
    int in = id >= 0 && id < v->n && v->bytes[id];
    *len = in ? v->lens[id] : 0;
    return in ? (const char *)v->bytes[id] : NULL;
}
