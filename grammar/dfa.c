/* dfa.c - the pushdown automaton determinized on demand. A configuration is (stack, position):
 * the stack is a chain of return positions, interned so that equal stacks have one id; a DFA
 * state is the sorted set of configurations whose position reads a byte (plus the root's
 * final position when the input so far is a whole match), interned too. Each state's
 * transition on a byte is computed the first time it is asked for and kept, so a matcher
 * that goes back to a state it has seen (inside a string, between array items) only looks
 * up a table. Recursion gives a new stack per depth, hence the limits. Local states (stack
 * GR_BOTTOM in place of the context) are states of the same table. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "gr_internal.h"

/* 64K states hold at most 64 MiB of transition rows */
/* An ambiguous grammar can make a state hold exponentially many stacks (llama.cpp's stacks
 * have the same weakness): a state's configurations are bounded too. */
enum { MAX_DFA_STATES = 65536, MAX_STACK_DEPTH = 1000, MAX_CONFIGS = 20000, MAX_STACKS = 1 << 21 };

/* ---- interning ------------------------------------------------------------------------- */

static uint64_t hash_key(const uint32_t *k, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    for (size_t i = 0; i < n; i++) {
        h ^= k[i];
        h *= 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
    }
    return h;
}

static void rehash(GrIntern *t) {
    size_t ns = t->nslots ? 2 * t->nslots : 256;
    int *slots = pl_xmalloc(ns * sizeof *slots);
    memset(slots, -1, ns * sizeof *slots);
    for (int i = 0; i < t->n; i++) {
        size_t j = hash_key(t->pool + t->off[i], t->off[i + 1] - t->off[i]) & (ns - 1);
        while (slots[j] >= 0)
            j = (j + 1) & (ns - 1);
        slots[j] = i;
    }
    free(t->slots);
    t->slots = slots;
    t->nslots = ns;
}

int gr_intern(GrIntern *t, const uint32_t *key, size_t len, int *added) {
    if (2 * (size_t)(t->n + 1) > t->nslots)
        rehash(t);
    size_t j = hash_key(key, len) & (t->nslots - 1);
    for (; t->slots[j] >= 0; j = (j + 1) & (t->nslots - 1)) {
        int i = t->slots[j];
        size_t n = t->off[i + 1] - t->off[i];
        if (n == len && (!len || !memcmp(t->pool + t->off[i], key, len * sizeof *key))) {
            *added = 0;
            return i;
        }
    }
    if (t->n + 2 > t->cap) {
        t->cap = t->cap ? 2 * t->cap : 256;
        t->off = pl_xrealloc(t->off, (t->cap + 1) * sizeof *t->off);
    }
    if (t->npool + len > t->cap_pool) {
        t->cap_pool = 2 * (t->npool + len) + 1024;
        t->pool = pl_xrealloc(t->pool, t->cap_pool * sizeof *t->pool);
    }
    if (!t->n)
        t->off[0] = 0;
    if (len)
        memcpy(t->pool + t->npool, key, len * sizeof *key);
    t->npool += len;
    t->off[t->n + 1] = t->npool;
    t->slots[j] = t->n;
    *added = 1;
    return t->n++;
}

void gr_intern_free(GrIntern *t) {
    free(t->pool);
    free(t->off);
    free(t->slots);
    memset(t, 0, sizeof *t);
}

/* ---- closure --------------------------------------------------------------------------- */

typedef struct {
    uint64_t *v;
    size_t n, cap;
} Vec;

static void push(Vec *v, uint64_t x) {
    if (v->n == v->cap) {
        v->cap = v->cap ? 2 * v->cap : 64;
        v->v = pl_xrealloc(v->v, v->cap * sizeof *v->v);
    }
    v->v[v->n++] = x;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* seen: an open-addressing set of configurations (0 marks an empty slot, so keys are
 * stored plus one); v holds the slots, cap a power of two, n the keys in it. */
static int insert(Vec *seen, uint64_t conf) {
    if (2 * (seen->n + 1) > seen->cap) {
        Vec bigger = {pl_xcalloc(seen->cap ? 2 * seen->cap : 64, sizeof *seen->v), 0,
                      seen->cap ? 2 * seen->cap : 64};
        for (size_t i = 0; i < seen->cap; i++)
            if (seen->v[i])
                insert(&bigger, seen->v[i] - 1);
        free(seen->v);
        *seen = bigger;
    }
    uint64_t h = conf ^ conf >> 29; /* the stack is in the high half: mix it down */
    h *= 0xBF58476D1CE4E5B9ull;
    size_t j = (h ^ h >> 32) & (seen->cap - 1);
    for (; seen->v[j]; j = (j + 1) & (seen->cap - 1))
        if (seen->v[j] == conf + 1)
            return 0;
    seen->v[j] = conf + 1;
    seen->n++;
    return 1;
}

#define CONF(stk, q) ((uint64_t)(uint32_t)(stk) << 32 | (uint32_t)(q))

/* The stack `parent` with return position `ret` pushed; -1 past the depth limit, -2 past
 * the number of stacks (interned, so the check is on the id). */
static int push_stack(GrDfa *d, int parent, int ret) {
    uint32_t key[2] = {(uint32_t)parent, (uint32_t)ret};
    int added, id = gr_intern(&d->stacks, key, 2, &added);
    if (id >= MAX_STACKS)
        return -2;
    if (added) {
        if (id >= d->cap_stacks) {
            d->cap_stacks = 2 * id + 64;
            d->depth = pl_xrealloc(d->depth, d->cap_stacks * sizeof *d->depth);
        }
        d->depth[id] = d->depth[parent] + 1;
    }
    return d->depth[id] > MAX_STACK_DEPTH ? -1 : id;
}

/* The state of the configurations in out (sorted here); GR_ERROR past the state limit. */
static int intern_state(GrCompiled *c, Vec *out) {
    GrDfa *d = &c->dfa;
    const GrNfa *a = &c->nfa;
    if (out->n)
        qsort(out->v, out->n, sizeof *out->v, cmp_u64);
    uint32_t *key = pl_xmalloc((2 * out->n + 1) * sizeof *key);
    size_t n = 0;
    for (size_t i = 0; i < out->n; i++)
        if (!i || out->v[i] != out->v[i - 1]) {
            key[2 * n] = (uint32_t)(out->v[i] >> 32);
            key[2 * n++ + 1] = (uint32_t)out->v[i];
        }
    int added, id = gr_intern(&d->states, key, 2 * n, &added);
    free(key);
    if (id >= MAX_DFA_STATES) { /* interned, but never given a row: refused each time */
        snprintf(d->err, sizeof d->err, "the constraint needs more than %d automaton states",
                 MAX_DFA_STATES);
        return GR_ERROR;
    }
    if (added) {
        if (id >= d->cap) {
            int cap = 2 * id + 64;
            d->trans = pl_xrealloc(d->trans, cap * sizeof *d->trans);
            d->accepts = pl_xrealloc(d->accepts, cap);
            d->escapes = pl_xrealloc(d->escapes, cap);
            memset(d->trans + d->cap, 0, (cap - d->cap) * sizeof *d->trans);
            d->cap = cap;
        }
        d->accepts[id] = d->escapes[id] = 0;
        for (size_t i = 0; i < out->n; i++) {
            d->accepts[id] |= out->v[i] == CONF(0, a->final[a->root]);
            d->escapes[id] |= out->v[i] == CONF(GR_BOTTOM, a->escape);
        }
    }
    return id;
}

/* Seeds (configurations) to the state id of their closure; GR_ERROR past a limit. */
static int close_and_intern(GrCompiled *c, Vec *work, Vec *seen, Vec *out) {
    GrDfa *d = &c->dfa;
    const GrNfa *a = &c->nfa;
    if (seen->n)
        memset(seen->v, 0, seen->cap * sizeof *seen->v);
    seen->n = out->n = 0;
    while (work->n) {
        uint64_t conf = work->v[--work->n];
        if (!insert(seen, conf))
            continue;
        if (seen->n > MAX_CONFIGS) {
            snprintf(d->err, sizeof d->err,
                     "the constraint is too ambiguous (over %d parses at once)", MAX_CONFIGS);
            return GR_ERROR;
        }
        int stk = (int)(conf >> 32), q = (int)(uint32_t)conf;
        const GrState *s = &a->st[q];
        if (s->nedges)
            push(out, conf);
        for (int i = 0; i < s->neps; i++)
            push(work, CONF(stk, s->eps[i]));
        if (s->call >= 0) {
            int ns = push_stack(d, stk, s->ret);
            if (ns < 0) {
                if (ns == -1)
                    snprintf(d->err, sizeof d->err, "the constraint nests deeper than %d rules",
                             MAX_STACK_DEPTH);
                else
                    snprintf(d->err, sizeof d->err, "the constraint needs more than %d stacks",
                             MAX_STACKS);
                return GR_ERROR;
            }
            push(work, CONF(ns, a->start[s->call]));
        }
        if (s->final_of >= 0) {
            if (stk == 0)
                push(out, conf); /* the root's end: a whole match */
            else if (stk == GR_BOTTOM)
                push(out, CONF(GR_BOTTOM, a->escape));
            else {
                const uint32_t *k = d->stacks.pool + d->stacks.off[stk];
                push(work, CONF(k[0], k[1]));
            }
        }
    }
    return intern_state(c, out);
}

int gr_dfa_init(GrCompiled *c, char *err, size_t errlen) {
    GrDfa *d = &c->dfa;
    memset(d, 0, sizeof *d);
    int added;
    uint32_t root[2] = {0, 0};
    gr_intern(&d->stacks, root, 2, &added); /* stack 0: empty */
    uint32_t bottom[2] = {UINT32_MAX, UINT32_MAX};
    gr_intern(&d->stacks, bottom, 2, &added); /* GR_BOTTOM */
    d->cap_stacks = 64;
    d->depth = pl_xcalloc(d->cap_stacks, sizeof *d->depth);
    Vec work = {0}, seen = {0}, out = {0};
    int dead = close_and_intern(c, &work, &seen, &out); /* the empty set */
    push(&work, CONF(0, c->nfa.start[c->nfa.root]));
    d->initial = close_and_intern(c, &work, &seen, &out);
    free(work.v);
    free(seen.v);
    free(out.v);
    PL_CHECK(dead == GR_DEAD);
    if (d->initial < 0) {
        snprintf(err, errlen, "%s", d->err);
        return -1;
    }
    return 0;
}

int gr_dfa_step(GrCompiled *c, int s, uint8_t byte) {
    GrDfa *d = &c->dfa;
    if (!d->trans[s]) {
        d->trans[s] = pl_xmalloc(256 * sizeof **d->trans);
        for (int i = 0; i < 256; i++)
            d->trans[s][i] = s == GR_DEAD ? GR_DEAD : GR_UNKNOWN;
    }
    int t = d->trans[s][byte];
    if (t != GR_UNKNOWN)
        return t;
    Vec work = {0}, seen = {0}, out = {0};
    size_t n = (d->states.off[s + 1] - d->states.off[s]) / 2;
    for (size_t i = 0; i < n; i++) {
        const uint32_t *k = d->states.pool + d->states.off[s] + 2 * i;
        const GrState *q = &c->nfa.st[k[1]];
        for (int e = 0; e < q->nedges; e++)
            if (q->edges[e].lo <= byte && byte <= q->edges[e].hi)
                push(&work, CONF(k[0], q->edges[e].to));
    }
    t = close_and_intern(c, &work, &seen, &out);
    free(work.v);
    free(seen.v);
    free(out.v);
    if (t != GR_ERROR)
        d->trans[s][byte] = t;
    return t;
}

int gr_dfa_has_exit(GrCompiled *c, int s) {
    const GrDfa *d = &c->dfa;
    size_t n = (d->states.off[s + 1] - d->states.off[s]) / 2;
    for (size_t i = 0; i < n; i++)
        if (c->nfa.st[d->states.pool[d->states.off[s] + 2 * i + 1]].nedges)
            return 1;
    return 0;
}

/* The deepest stack that both a and b sit on (a common prefix of the two). */
static int common_stack(const GrDfa *d, int a, int b) {
    while (a != b) {
        int *deeper = d->depth[a] >= d->depth[b] ? &a : &b;
        *deeper = (int)d->stacks.pool[d->stacks.off[*deeper]];
    }
    return a;
}

int gr_dfa_local(GrCompiled *c, int s) {
    GrDfa *d = &c->dfa;
    size_t n = (d->states.off[s + 1] - d->states.off[s]) / 2;
    int cut = -1; /* the stack every configuration sits on: GR_BOTTOM replaces it */
    for (size_t i = 0; i < n; i++) {
        int stk = (int)d->states.pool[d->states.off[s] + 2 * i];
        cut = cut < 0 ? stk : common_stack(d, cut, stk);
    }
    if (cut <= 0)
        return s;
    Vec out = {0};
    int rets[64], id = 0;
    for (size_t i = 0; i < n && id >= 0; i++) {
        const uint32_t *k = d->states.pool + d->states.off[s] + 2 * i;
        int nr = 0, stk = (int)k[0];
        for (; stk != cut && nr < 64; stk = (int)d->stacks.pool[d->stacks.off[stk]])
            rets[nr++] = (int)d->stacks.pool[d->stacks.off[stk] + 1];
        for (stk = nr < 64 ? GR_BOTTOM : -1; nr && stk >= 0;)
            stk = push_stack(d, stk, rets[--nr]);
        id = stk;
        push(&out, CONF(stk, k[1]));
    }
    id = id < 0 ? s : intern_state(c, &out); /* too deep to cut: no local state */
    free(out.v);
    return id;
}

void gr_dfa_free(GrDfa *d) {
    for (int i = 0; i < d->states.n; i++)
        free(d->trans[i]);
    free(d->trans);
    free(d->accepts);
    free(d->escapes);
    free(d->depth);
    for (int i = 0; i < d->ncaches; i++) {
        for (int s = 0; s < d->caches[i].cap; s++) {
            free(d->caches[i].masks[s]);
            free(d->caches[i].esc[s]);
        }
        free(d->caches[i].masks);
        free(d->caches[i].esc);
        free(d->caches[i].nesc);
    }
    free(d->caches);
    gr_intern_free(&d->stacks);
    gr_intern_free(&d->states);
    memset(d, 0, sizeof *d);
}
