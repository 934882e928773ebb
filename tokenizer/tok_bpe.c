/* tok_bpe.c - the BPE model: vocab + merge ranks from tokenizer.json, and the merge loop.
 *
 * A word starts as one symbol per character (or <0xNN> byte tokens / unk when a character is
 * not in the vocab); adjacent pairs with a merge rank go into a binary min-heap keyed by
 * (rank, position), and symbols form a doubly linked list, so merging a word of n symbols is
 * O(n log n) like HF's Word::merge_all (not the O(n^2) rescan of llama2.c). Stale heap entries
 * are detected the way HF does: the pair at that position must still produce the same id. */
#include "tok_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char METASPACE[] = "\xe2\x96\x81"; /* U+2581 */

typedef struct {
    int32_t id;
    int32_t prev, next;
    uint32_t len; /* bytes; 0 once merged into its left neighbour */
} Sym;

typedef struct {
    uint32_t rank, pos;
    int32_t new_id;
} Cand;

static const char *opt_str(const json_t *m, const char *key, size_t *len) {
    json_t *v = json_object_get(m, key);
    if (!json_is_string(v) || json_string_length(v) == 0)
        return NULL;
    *len = json_string_length(v);
    return json_string_value(v);
}

/* Grow toks / tok_len / tok_flags to hold id n - 1. */
void tok_reserve_ids(Tokenizer *t, int n) {
    if (n <= t->tok_cap)
        return;
    int cap = t->tok_cap ? t->tok_cap : 1024;
    while (cap < n)
        cap *= 2;
    t->toks = pl_xrealloc(t->toks, (size_t)cap * sizeof *t->toks);
    t->tok_len = pl_xrealloc(t->tok_len, (size_t)cap * sizeof *t->tok_len);
    t->tok_flags = pl_xrealloc(t->tok_flags, (size_t)cap);
    memset(t->toks + t->tok_cap, 0, (size_t)(cap - t->tok_cap) * sizeof *t->toks);
    memset(t->tok_len + t->tok_cap, 0, (size_t)(cap - t->tok_cap) * sizeof *t->tok_len);
    memset(t->tok_flags + t->tok_cap, 0, (size_t)(cap - t->tok_cap));
    t->tok_cap = cap;
}

void tok_bpe_vocab_init(Tokenizer *t, size_t expected) {
    tok_strmap_init(&t->vocab, expected);
    tok_reserve_ids(t, t->vocab_size > (int)expected ? t->vocab_size : (int)expected);
}

Status tok_bpe_vocab_add(Tokenizer *t, const char *s, size_t n, long id, const char *path) {
    if (id < 0 || id > (1 << 30))
        return pl_error_set(PL_ERR_FORMAT, "%s: model.vocab[\"%.*s\"] is not a valid id", path,
                            (int)(n > 100 ? 100 : n), s);
    tok_reserve_ids(t, (int)id + 1);
    char *k = tok_arena_strndup(&t->arena, s, n);
    t->toks[id] = k;
    t->tok_len[id] = (uint32_t)n;
    tok_strmap_put(&t->vocab, k, (int32_t)id);
    if (id + 1 > t->vocab_size)
        t->vocab_size = (int)id + 1;
    return PL_OK;
}

Status tok_bpe_options(Tokenizer *t, const json_t *model, const char *path) {
    t->unk_id = -1;
    size_t ulen;
    const char *unk = opt_str(model, "unk_token", &ulen);
    if (unk)
        t->unk_id = tok_strmap_get(&t->vocab, unk, ulen);
    t->byte_fallback = tok_jbool(model, "byte_fallback", 0);
    t->fuse_unk = tok_jbool(model, "fuse_unk", 0);
    t->ignore_merges = tok_jbool(model, "ignore_merges", 0);
    const char *s;
    size_t sl;
    if ((s = opt_str(model, "continuing_subword_prefix", &sl))) {
        t->cont_prefix = tok_arena_strndup(&t->arena, s, sl);
        t->cont_prefix_len = sl;
    }
    if ((s = opt_str(model, "end_of_word_suffix", &sl))) {
        t->eow_suffix = tok_arena_strndup(&t->arena, s, sl);
        t->eow_suffix_len = sl;
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_ids[b] = tok_strmap_get(&t->vocab, name, 6);
    }
    /* If no token has U+2581 right after another character, no merge can join a character to a
     * following "\u2581": a word may then be cut before each run of U+2581 and merged in
     * parts, with the same result. This keeps SentencePiece-style files without a pre-tokenizer
     * (the whole input is one word) fast and cache friendly. */
    t->split_metaspace = 1;
    for (int id = 0; id < t->vocab_size && t->split_metaspace; id++) {
        const char *k = t->toks[id];
        uint32_t n = k ? t->tok_len[id] : 0;
        for (uint32_t i = 1; i + 3 <= n; i++)
            if (!memcmp(k + i, METASPACE, 3) && (i < 3 || memcmp(k + i - 3, METASPACE, 3))) {
                t->split_metaspace = 0;
                break;
            }
    }
    return PL_OK;
}

void tok_bpe_merges_init(Tokenizer *t, size_t expected) {
    tok_u64map_init(&t->merges, expected);
    t->merge_rank = 0;
}

Status tok_bpe_merge_add(Tokenizer *t, const char *a, size_t al, const char *b, long blen,
                         const char *path) {
    size_t bl = (size_t)blen;
    if (blen < 0) { /* "a b" line, split on the one ASCII space (tokens may hold U+00A0) */
        if (al >= 8 && !memcmp(a, "#version", 8))
            return PL_OK;
        const char *sp = memchr(a, ' ', al);
        if (!sp || memchr(sp + 1, ' ', al - (size_t)(sp + 1 - a)))
            return pl_error_set(PL_ERR_FORMAT,
                                "%s: merge %u \"%.*s\" is not two tokens split by one space", path,
                                t->merge_rank, (int)(al > 100 ? 100 : al), a);
        b = sp + 1;
        bl = al - (size_t)(b - a);
        al = (size_t)(sp - a);
    }
    int32_t ia = tok_strmap_get(&t->vocab, a, al), ib = tok_strmap_get(&t->vocab, b, bl);
    /* the merged token: a + b without b's continuing_subword_prefix, as HF */
    size_t skip = t->cont_prefix_len < bl ? t->cont_prefix_len : bl;
    char small[256];
    char *cat = al + bl - skip <= sizeof small ? small : pl_xmalloc(al + bl - skip);
    memcpy(cat, a, al);
    memcpy(cat + al, b + skip, bl - skip);
    int32_t inew = tok_strmap_get(&t->vocab, cat, al + bl - skip);
    if (cat != small)
        free(cat);
    if (ia < 0 || ib < 0 || inew < 0)
        return pl_error_set(
            PL_ERR_FORMAT, "%s: merge %u (\"%.*s\" + \"%.*s\"): the %s token is not in the vocab",
            path, t->merge_rank, (int)(al > 100 ? 100 : al), a, (int)(bl > 100 ? 100 : bl), b,
            ia < 0   ? "first"
            : ib < 0 ? "second"
                     : "merged");
    tok_u64map_put(&t->merges, (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib,
                   (uint64_t)t->merge_rank << 32 | (uint32_t)inew);
    t->merge_rank++;
    return PL_OK;
}

/* ---- encoding one word --------------------------------------------------------------------- */
static inline void push_id(int32_t **ids, int *n, int *cap, int32_t id) {
    if (*n == *cap) {
        *cap = *cap ? *cap * 2 : 64;
        *ids = pl_xrealloc(*ids, (size_t)*cap * sizeof **ids);
    }
    (*ids)[(*n)++] = id;
}

static inline int cand_less(const Cand *x, const Cand *y) {
    return x->rank != y->rank ? x->rank < y->rank : x->pos < y->pos;
}

static void heap_push(Cand *h, int *n, Cand c) {
    int i = (*n)++;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!cand_less(&c, &h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static Cand heap_pop(Cand *h, int *n) {
    Cand top = h[0], last = h[--(*n)];
    int i = 0;
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        const Cand *best = &last;
        if (l < *n && cand_less(&h[l], best)) {
            m = l;
            best = &h[l];
        }
        if (r < *n && cand_less(&h[r], best))
            m = r;
        if (m == i)
            break;
        h[i] = h[m];
        i = m;
    }
    if (*n > 0)
        h[i] = last;
    return top;
}

static inline int lookup_merge(const Tokenizer *t, int32_t a, int32_t b, uint32_t *rank,
                               int32_t *nid) {
    uint64_t v;
    if (!tok_u64map_get(&t->merges, (uint64_t)(uint32_t)a << 32 | (uint32_t)b, &v))
        return 0;
    *rank = (uint32_t)(v >> 32);
    *nid = (int32_t)(uint32_t)v;
    return 1;
}

static void bpe_part(const Tokenizer *t, const char *w, size_t n, TokCtx *cx, int32_t **ids,
                     int *nids, int *cap);

void tok_bpe_word(const Tokenizer *t, const char *w, size_t n, TokCtx *cx, int32_t **ids, int *nids,
                  int *cap) {
    if (!n)
        return;
    if (t->ignore_merges) { /* Llama 3: a pre-token that is a whole vocab entry is taken as is */
        int32_t id = tok_strmap_get(&t->vocab, w, n);
        if (id >= 0) {
            push_id(ids, nids, cap, id);
            return;
        }
    }
    if (t->split_metaspace && n > 64) {
        size_t start = 0;
        for (size_t i = 1; i + 3 <= n; i++)
            if (w[i] == METASPACE[0] && !memcmp(w + i, METASPACE, 3) &&
                (i < 3 || memcmp(w + i - 3, METASPACE, 3))) {
                bpe_part(t, w + start, i - start, cx, ids, nids, cap);
                start = i;
            }
        bpe_part(t, w + start, n - start, cx, ids, nids, cap);
        return;
    }
    bpe_part(t, w, n, cx, ids, nids, cap);
}

static void bpe_part(const Tokenizer *t, const char *w, size_t n, TokCtx *cx, int32_t **ids,
                     int *nids, int *cap) {
    if ((size_t)cx->cap_sym < n) {
        cx->cap_sym = (int)n + 16;
        cx->sym = pl_xrealloc(cx->sym, (size_t)cx->cap_sym * sizeof(Sym));
    }
    Sym *sym = cx->sym;
    int ns = 0;
    int32_t unk = -1;
    uint32_t unk_len = 0;
    TBuf *key = &cx->tmp2;
    const unsigned char *u = (const unsigned char *)w;
#define ADD_SYM(ID, LEN)                                                                           \
    do {                                                                                           \
        sym[ns].id = (ID);                                                                         \
        sym[ns].len = (LEN);                                                                       \
        sym[ns].prev = ns - 1;                                                                     \
        sym[ns].next = ns + 1;                                                                     \
        ns++;                                                                                      \
    } while (0)
    for (size_t i = 0; i < n;) {
        int32_t cp;
        size_t k = (size_t)tok_utf8_next(u + i, n - i, &cp);
        int32_t id;
        if ((t->cont_prefix && i > 0) || (t->eow_suffix && i + k == n)) {
            key->n = 0;
            if (t->cont_prefix && i > 0)
                tok_buf_put(key, t->cont_prefix, t->cont_prefix_len);
            tok_buf_put(key, w + i, k);
            if (t->eow_suffix && i + k == n)
                tok_buf_put(key, t->eow_suffix, t->eow_suffix_len);
            id = tok_strmap_get(&t->vocab, key->p, key->n);
        } else
            id = tok_strmap_get(&t->vocab, w + i, k);
        if (id >= 0) {
            if (unk >= 0) {
                ADD_SYM(unk, unk_len);
                unk = -1;
            }
            ADD_SYM(id, (uint32_t)k);
        } else {
            int ok = t->byte_fallback;
            for (size_t b = 0; ok && b < k; b++)
                ok = t->byte_ids[u[i + b]] >= 0;
            if (ok) { /* as HF: byte tokens go in before a pending unk is flushed */
                for (size_t b = 0; b < k; b++)
                    ADD_SYM(t->byte_ids[u[i + b]], 1);
            } else if (t->unk_id >= 0) {
                if (unk >= 0 && t->fuse_unk)
                    unk_len += (uint32_t)k;
                else {
                    if (unk >= 0)
                        ADD_SYM(unk, unk_len);
                    unk = t->unk_id;
                    unk_len = (uint32_t)k;
                }
            } /* no unk token: the character is dropped */
        }
        i += k;
    }
    if (unk >= 0)
        ADD_SYM(unk, unk_len);
#undef ADD_SYM
    if (ns == 0)
        return;
    sym[ns - 1].next = -1;

    if (ns > 1) {
        if (cx->cap_heap < 3 * ns) {
            cx->cap_heap = 3 * ns + 16;
            cx->heap = pl_xrealloc(cx->heap, (size_t)cx->cap_heap * sizeof(Cand));
        }
        Cand *heap = cx->heap;
        int nh = 0;
        uint32_t r;
        int32_t nid;
        for (int i = 0; i + 1 < ns; i++)
            if (lookup_merge(t, sym[i].id, sym[i + 1].id, &r, &nid))
                heap_push(heap, &nh, (Cand){r, (uint32_t)i, nid});
        while (nh > 0) {
            Cand c = heap_pop(heap, &nh);
            Sym *s = &sym[c.pos];
            if (s->len == 0 || s->next < 0)
                continue;
            Sym *right = &sym[s->next];
            if (!lookup_merge(t, s->id, right->id, &r, &nid) || nid != c.new_id)
                continue;
            s->id = c.new_id;
            s->len += right->len;
            right->len = 0;
            s->next = right->next;
            if (s->next >= 0)
                sym[s->next].prev = (int32_t)c.pos;
            /* nh + 2 <= 3 * ns: each merge removes a symbol and adds at most two entries */
            if (s->prev >= 0 && lookup_merge(t, sym[s->prev].id, s->id, &r, &nid))
                heap_push(heap, &nh, (Cand){r, (uint32_t)s->prev, nid});
            if (s->next >= 0 && lookup_merge(t, s->id, sym[s->next].id, &r, &nid))
                heap_push(heap, &nh, (Cand){r, c.pos, nid});
        }
    }
    for (int i = 0; i >= 0; i = sym[i].next)
        push_id(ids, nids, cap, sym[i].id);
}
