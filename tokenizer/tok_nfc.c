/* tok_nfc.c - the NFC normalizer (Qwen2 and others): canonical decomposition, canonical
 * ordering, canonical composition, per UAX #15, with Hangul done arithmetically. Tables are in
 * tok_nfc_data.c. Ill-formed UTF-8 bytes pass through unchanged and block composition. */
#include "tok_internal.h"

#include <pthread.h>
#include <stdlib.h>

extern const uint32_t tok_nfc_decomp[][3];
extern const int tok_nfc_ndecomp;
extern const uint32_t tok_nfc_ccc[][3];
extern const int tok_nfc_nccc;

enum { COMPOSES = 0x80000000u, RAW = 0x80000000u }; /* RAW marks an ill-formed byte */
enum { SBASE = 0xAC00, LBASE = 0x1100, VBASE = 0x1161, TBASE = 0x11A7 };
enum { LCOUNT = 19, VCOUNT = 21, TCOUNT = 28, NCOUNT = VCOUNT * TCOUNT, SCOUNT = LCOUNT * NCOUNT };

static int ccc_of(uint32_t cp) {
    if (cp < 0x300 || cp & RAW)
        return 0;
    int lo = 0, hi = tok_nfc_nccc - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < tok_nfc_ccc[mid][0])
            hi = mid - 1;
        else if (cp > tok_nfc_ccc[mid][1])
            lo = mid + 1;
        else
            return (int)tok_nfc_ccc[mid][2];
    }
    return 0;
}

static const uint32_t *decomp_of(uint32_t cp) {
    int lo = 0, hi = tok_nfc_ndecomp - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        uint32_t c = tok_nfc_decomp[mid][0] & ~COMPOSES;
        if (cp < c)
            hi = mid - 1;
        else if (cp > c)
            lo = mid + 1;
        else
            return tok_nfc_decomp[mid];
    }
    return NULL;
}

/* rows that compose, sorted by (first, second) */
static int *pairs, npairs;
static int pair_cmp(const void *x, const void *y) {
    const uint32_t *a = tok_nfc_decomp[*(const int *)x], *b = tok_nfc_decomp[*(const int *)y];
    return a[1] != b[1] ? (a[1] < b[1] ? -1 : 1) : a[2] != b[2] ? (a[2] < b[2] ? -1 : 1) : 0;
}
static void init_pairs(void) {
    pairs = pl_xmalloc((size_t)tok_nfc_ndecomp * sizeof *pairs);
    for (int i = 0; i < tok_nfc_ndecomp; i++)
        if (tok_nfc_decomp[i][0] & COMPOSES)
            pairs[npairs++] = i;
    qsort(pairs, (size_t)npairs, sizeof *pairs, pair_cmp);
}

static uint32_t compose(uint32_t a, uint32_t b) {
    if (a >= LBASE && a < LBASE + LCOUNT && b >= VBASE && b < VBASE + VCOUNT)
        return SBASE + ((a - LBASE) * VCOUNT + (b - VBASE)) * TCOUNT;
    if (a >= SBASE && a < SBASE + SCOUNT && (a - SBASE) % TCOUNT == 0 && b > TBASE &&
        b < TBASE + TCOUNT)
        return a + (b - TBASE);
    int lo = 0, hi = npairs - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const uint32_t *r = tok_nfc_decomp[pairs[mid]];
        if (a < r[1] || (a == r[1] && b < r[2]))
            hi = mid - 1;
        else if (a > r[1] || b > r[2])
            lo = mid + 1;
        else
            return r[0] & ~COMPOSES;
    }
    return 0;
}

typedef struct {
    uint32_t *v;
    size_t n, cap;
} CpVec;

static void cp_push(CpVec *c, uint32_t cp) {
    if (c->n == c->cap) {
        c->cap = c->cap ? c->cap * 2 : 64;
        c->v = pl_xrealloc(c->v, c->cap * sizeof *c->v);
    }
    c->v[c->n++] = cp;
}

static void decompose(CpVec *c, uint32_t cp) {
    if (cp >= SBASE && cp < SBASE + SCOUNT) {
        uint32_t s = cp - SBASE;
        cp_push(c, LBASE + s / NCOUNT);
        cp_push(c, VBASE + (s % NCOUNT) / TCOUNT);
        if (s % TCOUNT)
            cp_push(c, TBASE + s % TCOUNT);
        return;
    }
    const uint32_t *d = cp >= 0xC0 ? decomp_of(cp) : NULL;
    if (!d) {
        cp_push(c, cp);
        return;
    }
    decompose(c, d[1]);
    if (d[2])
        decompose(c, d[2]);
}

void tok_nfc(const char *s, size_t n, TBuf *out) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n && u[i] < 0xCC) /* every char below U+0300 is stable under NFC */
        i++;
    if (i == n) {
        tok_buf_put(out, s, n);
        return;
    }
    pthread_once(&once, init_pairs);
    CpVec c = {0};
    for (i = 0; i < n;) {
        int32_t cp;
        int k = tok_utf8_next(u + i, n - i, &cp);
        if (cp < 0)
            cp_push(&c, RAW | u[i]);
        else
            decompose(&c, (uint32_t)cp);
        i += (size_t)k;
    }
    /* canonical ordering: stable insertion sort of each run of non-starters by class */
    for (size_t a = 1; a < c.n; a++) {
        uint32_t x = c.v[a];
        int kx = ccc_of(x);
        if (!kx)
            continue;
        size_t b = a;
        while (b > 0 && ccc_of(c.v[b - 1]) > kx) { /* starters (class 0) stop the move */
            c.v[b] = c.v[b - 1];
            b--;
        }
        c.v[b] = x;
    }
    /* composition */
    size_t w = 0, starter = 0;
    int last = 256, have_starter = 0;
    for (size_t r = 0; r < c.n; r++) {
        uint32_t ch = c.v[r];
        int k = ccc_of(ch);
        if (have_starter && !(ch & RAW) && !(c.v[starter] & RAW) && (last < k || last == 0)) {
            uint32_t comp = compose(c.v[starter], ch);
            if (comp) {
                c.v[starter] = comp;
                continue;
            }
        }
        if (k == 0) {
            starter = w;
            have_starter = 1;
        }
        last = k;
        c.v[w++] = ch;
    }
    for (size_t r = 0; r < w; r++) {
        if (c.v[r] & RAW)
            tok_buf_putc(out, (char)(c.v[r] & 0xff));
        else {
            char e[4];
            tok_buf_put(out, e, (size_t)tok_utf8_encode(c.v[r], e));
        }
    }
    free(c.v);
}
