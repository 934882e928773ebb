/* matcher.c - one sequence's walk through a compiled constraint. The state is a DFA state id
 * (dfa.c); the history of ids makes rollback and copies cheap. A mask is the vocabulary trie
 * scanned with the automaton (a subtree is skipped as soon as its first byte is rejected),
 * kept per (vocabulary, state) in the GrCompiled, so every later visit of that state by any
 * matcher is a copy. A state first seen in a new context (a string in another property) starts
 * from the mask of its local state, kept too: only the subtrees where a token leaves the
 * rule it is in (a closing quote) are walked again, as xgrammar's context-independent token
 * cache does. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "gr_internal.h"

/* Masks kept per vocabulary (4096 states at 128k tokens): beyond that, masks are computed but
 * not kept. */
enum { MASK_CACHE_BYTES = 64 << 20, FINISHED = -1 };

struct GrMatcher {
    GrCompiled *c;
    const GrVocab *v;
    int *hist; /* [n + 1]: state before each accepted token; hist[n] is the current one */
    int n, cap;
    char err[256];
};

static int current(const GrMatcher *m) {
    return m->hist[m->n];
}

static void push_state(GrMatcher *m, int s) {
    if (m->n + 2 > m->cap) {
        m->cap = 2 * m->cap + 16;
        m->hist = pl_xrealloc(m->hist, m->cap * sizeof *m->hist);
    }
    m->hist[++m->n] = s;
}

GrMatcher *gr_matcher_new(GrCompiled *c, const GrVocab *v) {
    GrMatcher *m = pl_xcalloc(1, sizeof *m);
    m->c = c;
    m->v = v;
    m->cap = 16;
    m->hist = pl_xmalloc(m->cap * sizeof *m->hist);
    m->hist[0] = c->dfa.initial;
    return m;
}

void gr_matcher_free(GrMatcher *m) {
    if (!m)
        return;
    free(m->hist);
    free(m);
}

GrMatcher *gr_matcher_copy(const GrMatcher *m) {
    GrMatcher *c = pl_xmalloc(sizeof *c);
    *c = *m;
    c->hist = pl_xmalloc(m->cap * sizeof *m->hist);
    memcpy(c->hist, m->hist, (m->n + 1) * sizeof *m->hist);
    return c;
}

void gr_matcher_reset(GrMatcher *m) {
    m->n = 0;
    m->err[0] = 0;
}

const char *gr_matcher_error(const GrMatcher *m) {
    return m->err;
}

/* The state after `len` bytes from s (under the lock): GR_DEAD or GR_ERROR on failure. */
static int walk(GrCompiled *c, int s, const uint8_t *p, size_t len) {
    for (size_t i = 0; i < len && s > GR_DEAD; i++)
        s = gr_dfa_step(c, s, p[i]);
    return s;
}

/* Walk the trie nodes [from, to), the states above them in st (by depth), setting the bits
 * of the tokens the automaton accepts; with esc (a local walk), also list the nodes whose
 * state escapes. -1 on GR_ERROR. */
static int walk_trie(GrCompiled *c, const GrVocab *v, int *st, int from, int to, uint32_t *mask,
                     GrMaskCache *esc_of, int local) {
    int32_t **trans = c->dfa.trans; /* moves when a new state is made */
    for (int i = from; i < to;) {
        const GrTrieNode *nd = &v->node[i];
        int t = st[nd->depth - 1];
        int32_t *row = trans[t];
        if (!row || (t = row[nd->byte]) == GR_UNKNOWN) {
            t = gr_dfa_step(c, st[nd->depth - 1], nd->byte);
            trans = c->dfa.trans;
        }
        if (t == GR_ERROR)
            return -1;
        if (t == GR_DEAD) {
            i = nd->skip;
            continue;
        }
        if (esc_of && c->dfa.escapes[t]) {
            int *n = &esc_of->nesc[local];
            if (!(*n & (*n + 1))) /* a power of two minus one: grow */
                esc_of->esc[local] =
                    pl_xrealloc(esc_of->esc[local], 2 * (*n + 1) * sizeof **esc_of->esc);
            esc_of->esc[local][(*n)++] = i;
        }
        st[nd->depth] = t;
        for (int tok = nd->token; tok >= 0; tok = v->same[tok])
            mask[tok >> 5] |= 1u << (tok & 31);
        i++;
    }
    return 0;
}

static void cache_room(GrMaskCache *mc, int s) {
    if (s < mc->cap)
        return;
    int cap = 2 * s + 64;
    mc->masks = pl_xrealloc(mc->masks, cap * sizeof *mc->masks);
    mc->esc = pl_xrealloc(mc->esc, cap * sizeof *mc->esc);
    mc->nesc = pl_xrealloc(mc->nesc, cap * sizeof *mc->nesc);
    memset(mc->masks + mc->cap, 0, (cap - mc->cap) * sizeof *mc->masks);
    memset(mc->esc + mc->cap, 0, (cap - mc->cap) * sizeof *mc->esc);
    memset(mc->nesc + mc->cap, 0, (cap - mc->cap) * sizeof *mc->nesc);
    mc->cap = cap;
}

/* The mask of s from its local state L's (xgrammar's context-independent tokens): the tokens L
 * accepts hold in any context; only below the nodes where L escapes does the walk go on from
 * s itself, there the state the node's bytes lead s to. -1 on GR_ERROR. */
static int mask_from_local(GrCompiled *c, GrMaskCache *mc, const GrVocab *v, int s, int L, int *st,
                           uint32_t *mask) {
    size_t words = gr_vocab_mask_words(v);
    cache_room(mc, L);
    if (!mc->masks[L]) {
        uint32_t *lm = pl_xcalloc(words, sizeof *lm);
        st[0] = L;
        mc->nesc[L] = 0; /* what a failed walk left */
        if (walk_trie(c, v, st, 0, v->nnodes, lm, mc, L)) {
            free(lm);
            return -1;
        }
        mc->masks[L] = lm;
        mc->bytes += words * sizeof *lm + mc->nesc[L] * sizeof **mc->esc;
    }
    memcpy(mask, mc->masks[L], words * sizeof *mask);
    int *path = st + v->max_depth + 1;
    for (int k = 0, end = 0; k < mc->nesc[L]; k++) {
        int e = mc->esc[L][k], np = 0, t = s;
        if (e < end)
            continue; /* inside a subtree walked already */
        for (int j = e; j >= 0; j = v->node[j].parent)
            path[np++] = j;
        while (np && t > GR_DEAD)
            t = gr_dfa_step(c, t, v->node[path[--np]].byte);
        if (t == GR_ERROR)
            return -1;
        if (t == GR_DEAD)
            continue;
        st[v->node[e].depth] = t;
        if (walk_trie(c, v, st, e + 1, v->node[e].skip, mask, NULL, 0))
            return -1;
        end = v->node[e].skip;
    }
    return 0;
}

/* The mask of state s over v, computed (under the lock); -1 on GR_ERROR. */
static int compute_mask(GrCompiled *c, GrMaskCache *mc, const GrVocab *v, int s, uint32_t *mask) {
    size_t words = gr_vocab_mask_words(v);
    memset(mask, 0, words * sizeof *mask);
    int *st = pl_xmalloc(2 * (v->max_depth + 1) * sizeof *st);
    int L = gr_dfa_local(c, s), rc = -1;
    if (L >= 0 && (L == s || c->dfa.escapes[L])) { /* nothing to share: walk from s */
        st[0] = s;
        rc = walk_trie(c, v, st, 0, v->nnodes, mask, NULL, 0);
    } else if (L >= 0) {
        rc = mask_from_local(c, mc, v, s, L, st, mask);
    }
    free(st);
    if (c->dfa.accepts[s])
        for (int i = 0; i < v->neos; i++)
            mask[v->eos[i] >> 5] |= 1u << (v->eos[i] & 31);
    return rc;
}

static GrMaskCache *cache_of(GrDfa *d, const GrVocab *v) {
    for (int i = 0; i < d->ncaches; i++)
        if (d->caches[i].vocab_id == v->id)
            return &d->caches[i];
    d->caches = pl_xrealloc(d->caches, (d->ncaches + 1) * sizeof *d->caches);
    GrMaskCache *mc = &d->caches[d->ncaches++];
    memset(mc, 0, sizeof *mc);
    mc->vocab_id = v->id;
    return mc;
}

int gr_matcher_fill_mask(GrMatcher *m, uint32_t *mask) {
    size_t words = gr_vocab_mask_words(m->v);
    int s = current(m);
    if (s == FINISHED) {
        memset(mask, 0, words * sizeof *mask);
        return 0;
    }
    GrCompiled *c = m->c;
    pthread_mutex_lock(&c->mu);
    GrMaskCache *mc = cache_of(&c->dfa, m->v);
    int rc = 0;
    if (s < mc->cap && mc->masks[s]) {
        memcpy(mask, mc->masks[s], words * sizeof *mask);
    } else if ((rc = compute_mask(c, mc, m->v, s, mask)) == 0 &&
               mc->bytes + words * sizeof *mask <= MASK_CACHE_BYTES) {
        cache_room(mc, s);
        mc->masks[s] = pl_xmalloc(words * sizeof *mask);
        memcpy(mc->masks[s], mask, words * sizeof *mask);
        mc->bytes += words * sizeof *mask;
    }
    if (rc)
        snprintf(m->err, sizeof m->err, "%s", c->dfa.err);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int gr_matcher_accept(GrMatcher *m, int token) {
    const GrVocab *v = m->v;
    int s = current(m);
    if (token < 0 || token >= v->n) {
        snprintf(m->err, sizeof m->err, "token %d is outside the vocabulary", token);
        return -1;
    }
    if (s == FINISHED) {
        snprintf(m->err, sizeof m->err, "token %d after the end of the constrained output", token);
        return -1;
    }
    GrCompiled *c = m->c;
    pthread_mutex_lock(&c->mu);
    int t = v->is_eos[token]  ? (c->dfa.accepts[s] ? FINISHED : GR_DEAD)
            : v->bytes[token] ? walk(c, s, v->bytes[token], v->lens[token])
                              : GR_DEAD;
    if (t == GR_ERROR)
        snprintf(m->err, sizeof m->err, "%s", c->dfa.err);
    pthread_mutex_unlock(&c->mu);
    if (t == GR_DEAD)
        snprintf(m->err, sizeof m->err, "token %d is not allowed by the constraint here", token);
    if (t == GR_DEAD || t == GR_ERROR)
        return -1;
    push_state(m, t);
    return 0;
}

int gr_matcher_accept_bytes(GrMatcher *m, const char *bytes, size_t len) {
    int s = current(m);
    if (s == FINISHED) {
        snprintf(m->err, sizeof m->err, "text after the end of the constrained output");
        return -1;
    }
    pthread_mutex_lock(&m->c->mu);
    int t = walk(m->c, s, (const uint8_t *)bytes, len);
    if (t == GR_ERROR)
        snprintf(m->err, sizeof m->err, "%s", m->c->dfa.err);
    pthread_mutex_unlock(&m->c->mu);
    if (t == GR_DEAD)
        snprintf(m->err, sizeof m->err, "the text is not allowed by the constraint here");
    if (t <= GR_DEAD)
        return -1;
    push_state(m, t);
    return 0;
}

int gr_matcher_can_end(GrMatcher *m) {
    int s = current(m);
    if (s == FINISHED)
        return 1;
    pthread_mutex_lock(&m->c->mu);
    int acc = m->c->dfa.accepts[s];
    pthread_mutex_unlock(&m->c->mu);
    return acc;
}

int gr_matcher_is_finished(GrMatcher *m) {
    int s = current(m);
    if (s == FINISHED)
        return 1;
    pthread_mutex_lock(&m->c->mu);
    int done = m->c->dfa.accepts[s] && !gr_dfa_has_exit(m->c, s);
    pthread_mutex_unlock(&m->c->mu);
    return done;
}

int gr_matcher_rollback(GrMatcher *m, int n) {
    if (n < 0 || n > m->n) {
        snprintf(m->err, sizeof m->err, "cannot roll back %d of %d tokens", n, m->n);
        return -1;
    }
    m->n -= n;
    return 0;
}

int gr_matcher_num_accepted(const GrMatcher *m) {
    return m->n;
}

int gr_compiled_accepts(GrCompiled *c, const char *bytes, size_t len) {
    pthread_mutex_lock(&c->mu);
    int s = walk(c, c->dfa.initial, (const uint8_t *)bytes, len);
    int acc = s > GR_DEAD && c->dfa.accepts[s];
    pthread_mutex_unlock(&c->mu);
    return acc;
}
