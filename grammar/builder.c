/* builder.c - the rule trees front ends build: an arena of nodes, named rules, and character
 * classes turned into UTF-8 byte sequences (the automaton reads bytes, never code points). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "gr_internal.h"

typedef struct Block {
    struct Block *next;
    size_t used, size;
    _Alignas(16) unsigned char data[];
} Block;

void gr_builder_init(GrBuilder *b) {
    memset(b, 0, sizeof *b);
}

void gr_builder_free(GrBuilder *b) {
    for (Block *k = b->arena, *next; k; k = next) {
        next = k->next;
        free(k);
    }
    for (int i = 0; i < b->nrules; i++)
        free(b->names[i]);
    free(b->names);
    free(b->bodies);
    free(b->used_at);
    gr_intern_free(&b->index);
    memset(b, 0, sizeof *b);
}

void *gr_alloc(GrBuilder *b, size_t n) {
    n = (n + 15) & ~(size_t)15;
    Block *k = b->arena;
    if (!k || k->used + n > k->size) {
        size_t size = n > 65536 ? n : 65536;
        k = pl_xmalloc(sizeof *k + size);
        k->size = size;
        k->used = 0;
        k->next = b->arena;
        b->arena = k;
    }
    void *p = k->data + k->used;
    k->used += n;
    return memset(p, 0, n);
}

void *gr_fail(GrBuilder *b, const char *fmt, ...) {
    if (!b->err[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(b->err, sizeof b->err, fmt, ap);
        va_end(ap);
    }
    return NULL;
}

int gr_rule(GrBuilder *b, const char *name, size_t len) {
    uint32_t *key = pl_xcalloc(len / 4 + 2, sizeof *key);
    key[0] = (uint32_t)len;
    memcpy(key + 1, name, len);
    int added, r = gr_intern(&b->index, key, len / 4 + 2, &added);
    free(key);
    if (!added)
        return r;
    if (b->nrules == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 32;
        b->names = pl_xrealloc(b->names, b->cap * sizeof *b->names);
        b->bodies = pl_xrealloc(b->bodies, b->cap * sizeof *b->bodies);
        b->used_at = pl_xrealloc(b->used_at, b->cap * sizeof *b->used_at);
    }
    char *copy = pl_xmalloc(len + 1);
    memcpy(copy, name, len);
    copy[len] = 0;
    b->names[b->nrules] = copy;
    b->bodies[b->nrules] = NULL;
    b->used_at[b->nrules] = -1;
    return b->nrules++;
}

static GrNode *node(GrBuilder *b, GrNodeKind kind) {
    GrNode *x = gr_alloc(b, sizeof *x);
    x->kind = kind;
    return x;
}

GrNode *gr_bytes(GrBuilder *b, const void *s, size_t n) {
    GrNode *x = node(b, GN_BYTES);
    x->bytes = gr_alloc(b, n);
    memcpy(x->bytes, s, n);
    x->n = (int)n;
    return x;
}

GrNode *gr_str(GrBuilder *b, const char *s) {
    return gr_bytes(b, s, strlen(s));
}

GrNode *gr_range(GrBuilder *b, uint8_t lo, uint8_t hi) {
    GrNode *x = node(b, GN_RANGE);
    x->lo = lo;
    x->hi = hi;
    return x;
}

GrNode *gr_ref(GrBuilder *b, int rule) {
    GrNode *x = node(b, GN_REF);
    x->rule = rule;
    return x;
}

GrNode *gr_rep(GrBuilder *b, GrNode *x, int min, int max) {
    if (!x)
        return NULL;
    GrNode *r = node(b, GN_REP);
    r->kids = gr_alloc(b, sizeof *r->kids);
    r->kids[0] = x;
    r->min = min;
    r->max = max;
    return r;
}

GrNode *gr_list(GrBuilder *b, GrNodeKind kind, GrNode **kids, int n) {
    for (int i = 0; i < n; i++)
        if (!kids[i])
            return NULL;
    if (n == 1)
        return kids[0];
    GrNode *x = node(b, kind);
    x->n = n;
    x->kids = gr_alloc(b, n * sizeof *kids);
    memcpy(x->kids, kids, n * sizeof *kids);
    return x;
}

static GrNode *list_va(GrBuilder *b, GrNodeKind kind, int n, va_list ap) {
    GrNode *kids[16];
    PL_CHECK(n <= 16);
    for (int i = 0; i < n; i++)
        kids[i] = va_arg(ap, GrNode *);
    return gr_list(b, kind, kids, n);
}

GrNode *gr_seq(GrBuilder *b, int n, ...) {
    va_list ap;
    va_start(ap, n);
    GrNode *x = list_va(b, GN_SEQ, n, ap);
    va_end(ap);
    return x;
}

GrNode *gr_alt(GrBuilder *b, int n, ...) {
    va_list ap;
    va_start(ap, n);
    GrNode *x = list_va(b, GN_ALT, n, ap);
    va_end(ap);
    return x;
}

GrNode *gr_empty(GrBuilder *b) {
    return node(b, GN_SEQ);
}

int gr_utf8_encode(uint32_t cp, uint8_t out[4]) {
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | cp >> 6);
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | cp >> 12);
        out[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | cp >> 18);
    out[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

int gr_utf8_decode(const char *s, const char *end, uint32_t *cp) {
    const uint8_t *p = (const uint8_t *)s;
    int n = *p < 0x80 ? 1 : *p >= 0xF8 ? 0 : *p >= 0xF0 ? 4 : *p >= 0xE0 ? 3 : *p >= 0xC0 ? 2 : 0;
    if (!n || s + n > end)
        return 0;
    *cp = n == 1 ? *p : (uint32_t)(*p & (0x7F >> n));
    for (int i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80)
            return 0;
        *cp = *cp << 6 | (p[i] & 0x3F);
    }
    return n;
}

int gr_hex(char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

void gr_nodes_push(GrNodes *l, GrNode *x) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 8;
        l->v = pl_xrealloc(l->v, l->cap * sizeof *l->v);
    }
    l->failed |= !x;
    l->v[l->n++] = x;
}

GrNode *gr_nodes_finish(GrBuilder *b, GrNodes *l, GrNodeKind kind) {
    GrNode *x = l->failed ? NULL : l->n ? gr_list(b, kind, l->v, l->n) : gr_empty(b);
    free(l->v);
    memset(l, 0, sizeof *l);
    return x;
}

/* Split [lo, hi] (one encoded length, no surrogates) until each piece is a sequence of byte
 * ranges, the way regex engines compile Unicode classes (Rust's Utf8Sequences). */
static void utf8_ranges(GrBuilder *b, GrNodes *a, uint32_t lo, uint32_t hi) {
    if (lo > hi)
        return;
    static const uint32_t bounds[] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= bounds[i] && hi > bounds[i]) {
            utf8_ranges(b, a, lo, bounds[i]);
            utf8_ranges(b, a, bounds[i] + 1, hi);
            return;
        }
    uint8_t el[4], eh[4];
    int n = gr_utf8_encode(lo, el);
    gr_utf8_encode(hi, eh);
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if (lo & m) {
                utf8_ranges(b, a, lo, lo | m);
                utf8_ranges(b, a, (lo | m) + 1, hi);
                return;
            }
            if ((hi & m) != m) {
                utf8_ranges(b, a, lo, (hi & ~m) - 1);
                utf8_ranges(b, a, hi & ~m, hi);
                return;
            }
        }
    }
    GrNode *seq[4];
    for (int i = 0; i < n; i++)
        seq[i] = gr_range(b, el[i], eh[i]);
    gr_nodes_push(a, gr_list(b, GN_SEQ, seq, n));
}

static int cmp_range(const void *x, const void *y) {
    const uint32_t *a = x, *c = y;
    return a[0] < c[0] ? -1 : a[0] > c[0];
}

GrNode *gr_class(GrBuilder *b, const uint32_t *ranges, int n, int negate, int json_safe) {
    /* sort, merge, complement if asked, cut out the surrogates */
    uint32_t *r = pl_xmalloc((2 * n + 4) * sizeof *r);
    for (int i = 0; i < n; i++) {
        uint32_t lo = ranges[2 * i], hi = ranges[2 * i + 1];
        r[2 * i] = lo < hi ? lo : hi;
        r[2 * i + 1] = lo < hi ? hi : lo;
    }
    qsort(r, n, 2 * sizeof *r, cmp_range);
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m && r[2 * i] <= r[2 * m - 1] + 1) {
            if (r[2 * i + 1] > r[2 * m - 1])
                r[2 * m - 1] = r[2 * i + 1];
        } else {
            r[2 * m] = r[2 * i];
            r[2 * m + 1] = r[2 * i + 1];
            m++;
        }
    }
    uint32_t *out = pl_xmalloc((2 * m + 4) * sizeof *out);
    int k = 0;
    if (negate) {
        uint32_t next = 0;
        for (int i = 0; i < m; i++) {
            if (r[2 * i] > next) {
                out[2 * k] = next;
                out[2 * k++ + 1] = r[2 * i] - 1;
            }
            next = r[2 * i + 1] + 1;
        }
        if (next <= 0x10FFFF) {
            out[2 * k] = next;
            out[2 * k++ + 1] = 0x10FFFF;
        }
    } else {
        memcpy(out, r, 2 * m * sizeof *r);
        k = m;
    }
    /* holes: the surrogates, and for JSON strings what they must escape */
    static const uint32_t holes[][2] = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}, {0xD800, 0xDFFF}};
    GrNodes a = {0};
    for (int i = 0; i < k; i++) {
        uint32_t lo = out[2 * i], hi = out[2 * i + 1] > 0x10FFFF ? 0x10FFFF : out[2 * i + 1];
        for (int h = json_safe ? 0 : 3; h < 4 && lo <= hi; h++) {
            if (holes[h][1] < lo || holes[h][0] > hi)
                continue;
            if (lo < holes[h][0])
                utf8_ranges(b, &a, lo, holes[h][0] - 1);
            lo = holes[h][1] + 1;
        }
        if (lo <= hi)
            utf8_ranges(b, &a, lo, hi);
    }
    free(r);
    free(out);
    if (!a.n)
        return NULL;
    return gr_nodes_finish(b, &a, GN_ALT);
}
