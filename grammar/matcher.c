/* matcher.c - one sequence's walk through a compiled constraint. The state is a DFA state id
 * (dfa.c); the history of ids makes rollback and copies cheap. A mask is the vocabulary trie
 * scanned with the automaton (a subtree is skipped as soon as its first byte is rejected),
 * kept per (vocabulary, state) in the GrCompiled, so every later visit of that state by any
 * matcher is a copy. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "gr_internal.h"

/* Masks kept per vocabulary: beyond this many bytes, masks are computed but not kept. */
enum { MASK_CACHE_BYTES = 256 << 20, FINISHED = -1 };

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

/* The mask of state s over v, computed (under the lock); -1 on GR_ERROR. */
static int compute_mask(GrCompiled *c, const GrVocab *v, int s, uint32_t *mask) {
    size_t words = gr_vocab_mask_words(v);
    memset(mask, 0, words * sizeof *mask);
    int *st = pl_xmalloc((v->max_depth + 1) * sizeof *st);
    st[0] = s;
    int32_t **trans = c->dfa.trans; /* moves when a new state is made */
    for (int i = 0; i < v->nnodes;) {
        const GrTrieNode *nd = &v->node[i];
        int t = st[nd->depth - 1];
        int32_t *row = trans[t];
        if (!row || (t = row[nd->byte]) == GR_UNKNOWN) {
            t = gr_dfa_step(c, st[nd->depth - 1], nd->byte);
            trans = c->dfa.trans;
        }
        if (t == GR_ERROR) {
            free(st);
            return -1;
        }
        if (t == GR_DEAD) {
            i = nd->skip;
            continue;
        }
        st[nd->depth] = t;
        for (int tok = nd->token; tok >= 0; tok = v->same[tok])
            mask[tok >> 5] |= 1u << (tok & 31);
        i++;
    }
    free(st);
    if (c->dfa.accepts[s])
        for (int i = 0; i < v->neos; i++)
            mask[v->eos[i] >> 5] |= 1u << (v->eos[i] & 31);
    return 0;
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
    } else if ((rc = compute_mask(c, m->v, s, mask)) == 0 &&
               mc->bytes + words * sizeof *mask <= MASK_CACHE_BYTES) {
        if (s >= mc->cap) {
            int cap = 2 * s + 64;
            mc->masks = pl_xrealloc(mc->masks, cap * sizeof *mc->masks);
            memset(mc->masks + mc->cap, 0, (cap - mc->cap) * sizeof *mc->masks);
            mc->cap = cap;
        }
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
