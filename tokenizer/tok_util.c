/* tok_util.c - tokenizer plumbing: byte buffers, string arena, open-addressing hash tables,
 * piece lists, per-call scratch and JSON helpers. UTF-8 and the byte map are in tok_utf8.c. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* ---- big zeroed allocations ------------------------------------------------------------------
 * The vocab/merge tables of a 128k-vocab tokenizer are tens of MB touched in random order. Take
 * them from mmap with MAP_POPULATE (one kernel call instead of a page fault per 4 KiB page,
 * which costs ~50 us each in some VMs) and ask for transparent huge pages. */
enum { BIG = 1 << 20 };

void *tok_big_alloc(size_t n) {
    if (n < BIG)
        return pl_xcalloc(1, n);
    void *p =
        mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED)
        pl_fatal(__FILE__, __LINE__, "out of memory mapping %zu bytes", n);
#ifdef MADV_HUGEPAGE
    madvise(p, n, MADV_HUGEPAGE);
#endif
    return p;
}

void tok_big_free(void *p, size_t n) {
    if (!p)
        return;
    if (n < BIG)
        free(p);
    else
        munmap(p, n);
}

/* ---- TBuf ------------------------------------------------------------------------------- */
void tok_buf_reserve(TBuf *b, size_t extra) {
    size_t need = b->n + extra + 1;
    if (need <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need)
        cap *= 2;
    b->p = pl_xrealloc(b->p, cap);
    b->cap = cap;
}

void tok_buf_put(TBuf *b, const void *s, size_t n) {
    tok_buf_reserve(b, n);
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void tok_buf_free(TBuf *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

/* ---- Arena ------------------------------------------------------------------------------ */
struct ArenaBlock {
    ArenaBlock *next;
    size_t used, cap;
    char data[];
};

char *tok_arena_strndup(Arena *a, const char *s, size_t n) {
    size_t need = (4 + n + 1 + 3) & ~(size_t)3; /* length prefix, bytes, NUL; 4-aligned */
    ArenaBlock *b = a->head;
    if (!b || b->cap - b->used < need) {
        size_t cap = need > BIG - 64 ? need : BIG - 64;
        b = tok_big_alloc(sizeof *b + cap);
        b->next = a->head;
        b->used = 0;
        b->cap = cap;
        a->head = b;
    }
    char *p = b->data + b->used;
    uint32_t len = (uint32_t)n;
    memcpy(p, &len, 4);
    if (n)
        memcpy(p + 4, s, n);
    p[4 + n] = 0;
    b->used += need;
    return p + 4;
}

void tok_arena_free(Arena *a) {
    ArenaBlock *b = a->head;
    while (b) {
        ArenaBlock *next = b->next;
        tok_big_free(b, sizeof *b + b->cap);
        b = next;
    }
    a->head = NULL;
}

/* ---- hashing ---------------------------------------------------------------------------- */
static inline uint64_t mix64(uint64_t x) { /* splitmix64 finalizer */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

uint32_t tok_hash_bytes(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = mix64(h ^ w);
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    for (size_t i = 0; i < n; i++)
        w |= (uint64_t)s[i] << (8 * i);
    h = mix64(h ^ w ^ 0xff);
    return (uint32_t)h;
}

static uint32_t table_size(size_t expected) {
    uint32_t cap = 16;
    while (cap < expected * 2 + 1)
        cap *= 2;
    return cap;
}

void tok_strmap_init(StrMap *m, size_t expected) {
    uint32_t cap = table_size(expected);
    m->slots = tok_big_alloc((size_t)cap * sizeof *m->slots);
    m->mask = cap - 1;
    m->count = 0;
}

static void tok_strmap_grow(StrMap *m) {
    StrMap nm;
    tok_strmap_init(&nm, (size_t)(m->mask + 1));
    for (uint32_t i = 0; i <= m->mask; i++) {
        StrSlot *s = &m->slots[i];
        if (!s->key)
            continue;
        uint32_t j = s->hash & nm.mask;
        while (nm.slots[j].key)
            j = (j + 1) & nm.mask;
        nm.slots[j] = *s;
        nm.count++;
    }
    tok_strmap_free(m);
    *m = nm;
}

void tok_strmap_put(StrMap *m, const char *key, int32_t val) {
    if ((m->count + 1) * 2 > m->mask + 1)
        tok_strmap_grow(m);
    uint32_t len = tok_arena_len(key);
    uint32_t h = tok_hash_bytes(key, len);
    uint32_t j = h & m->mask;
    for (;; j = (j + 1) & m->mask) {
        StrSlot *s = &m->slots[j];
        if (!s->key) {
            s->key = key;
            s->hash = h;
            s->val = val;
            m->count++;
            return;
        }
        if (s->hash == h && tok_arena_len(s->key) == len && memcmp(s->key, key, len) == 0) {
            s->val = val;
            return;
        }
    }
}

int32_t tok_strmap_get(const StrMap *m, const char *key, size_t len) {
    if (!m->slots)
        return -1;
    uint32_t h = tok_hash_bytes(key, len);
    for (uint32_t j = h & m->mask;; j = (j + 1) & m->mask) {
        const StrSlot *s = &m->slots[j];
        if (!s->key)
            return -1;
        if (s->hash == h && tok_arena_len(s->key) == len && memcmp(s->key, key, len) == 0)
            return s->val;
    }
}

void tok_strmap_free(StrMap *m) {
    if (m->slots)
        tok_big_free(m->slots, (size_t)(m->mask + 1) * sizeof *m->slots);
    m->slots = NULL;
}

void tok_u64map_init(U64Map *m, size_t expected) {
    uint32_t cap = table_size(expected);
    m->keys = tok_big_alloc((size_t)cap * sizeof *m->keys);
    memset(m->keys, 0xff, (size_t)cap * sizeof *m->keys);
    m->vals = tok_big_alloc((size_t)cap * sizeof *m->vals);
    m->mask = cap - 1;
    m->count = 0;
}

static void tok_u64map_grow(U64Map *m) {
    U64Map nm;
    tok_u64map_init(&nm, (size_t)(m->mask + 1));
    for (uint32_t i = 0; i <= m->mask; i++)
        if (m->keys[i] != UINT64_MAX)
            tok_u64map_put(&nm, m->keys[i], m->vals[i]);
    tok_u64map_free(m);
    *m = nm;
}

void tok_u64map_put(U64Map *m, uint64_t key, uint64_t val) {
    if ((m->count + 1) * 2 > m->mask + 1)
        tok_u64map_grow(m);
    for (uint32_t j = (uint32_t)mix64(key) & m->mask;; j = (j + 1) & m->mask) {
        if (m->keys[j] == key) {
            m->vals[j] = val;
            return;
        }
        if (m->keys[j] == UINT64_MAX) {
            m->keys[j] = key;
            m->vals[j] = val;
            m->count++;
            return;
        }
    }
}

int tok_u64map_get(const U64Map *m, uint64_t key, uint64_t *val) {
    if (!m->keys)
        return 0;
    for (uint32_t j = (uint32_t)mix64(key) & m->mask;; j = (j + 1) & m->mask) {
        if (m->keys[j] == key) {
            *val = m->vals[j];
            return 1;
        }
        if (m->keys[j] == UINT64_MAX)
            return 0;
    }
}

void tok_u64map_free(U64Map *m) {
    if (m->keys) {
        tok_big_free(m->keys, (size_t)(m->mask + 1) * sizeof *m->keys);
        tok_big_free(m->vals, (size_t)(m->mask + 1) * sizeof *m->vals);
    }
    m->keys = m->vals = NULL;
}

/* ---- pieces ----------------------------------------------------------------------------- */
void tok_pieces_reset(PieceList *l) {
    l->n = 0;
    l->text.n = 0;
}

void tok_pieces_free(PieceList *l) {
    tok_buf_free(&l->text);
    free(l->v);
    l->v = NULL;
    l->n = l->cap = 0;
}

static Piece *tok_pieces_add(PieceList *l) {
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 32;
        l->v = pl_xrealloc(l->v, (size_t)l->cap * sizeof *l->v);
    }
    return &l->v[l->n++];
}

void tok_pieces_push_text(PieceList *l, const char *s, size_t n, uint32_t flags) {
    if (!n)
        return;
    Piece *p = tok_pieces_add(l);
    p->off = (uint32_t)l->text.n;
    p->len = (uint32_t)n;
    p->id = -1;
    p->flags = flags;
    tok_buf_put(&l->text, s, n);
}

void tok_pieces_push_bytelevel(PieceList *l, const char *s, size_t n, uint32_t flags) {
    if (!n)
        return;
    tok_buf_reserve(&l->text, 2 * n); /* every byte becomes one char of U+0021..U+0143 */
    char *o = l->text.p + l->text.n;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += (size_t)tok_utf8_encode(tok_byte_to_cp[(unsigned char)s[i]], o + k);
    o[k] = 0;
    Piece *p = tok_pieces_add(l);
    p->off = (uint32_t)l->text.n;
    p->len = (uint32_t)k;
    p->id = -1;
    p->flags = flags;
    l->text.n += k;
}

void tok_pieces_push_id(PieceList *l, int32_t id) {
    Piece *p = tok_pieces_add(l);
    p->off = p->len = 0;
    p->id = id;
    p->flags = 0;
}

void tok_ctx_init(TokCtx *cx) {
    memset(cx, 0, sizeof *cx);
    cx->md = pcre2_match_data_create(1, NULL);
    PL_CHECK(cx->md != NULL);
}

void tok_ctx_free(TokCtx *cx) {
    pcre2_match_data_free(cx->md);
    free(cx->mv.v);
    tok_buf_free(&cx->tmp);
    tok_buf_free(&cx->tmp2);
    free(cx->segs);
    free(cx->sym);
    free(cx->heap);
}

/* ---- JSON helpers ----------------------------------------------------------------------- */
const char *tok_jstr(const json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

int tok_jbool(const json_t *obj, const char *key, int dflt) {
    json_t *v = json_object_get(obj, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}
