/* sample.c - next-token selection with vLLM's sampling semantics, deterministic per request.
 *
 * Per row: (1) repetition penalty over prompt and output tokens, then frequency and presence
 * penalties over output tokens; (2) temperature ~0: argmax, lowest id on ties; otherwise
 * (3) logits /= temperature, (4) top-k, (5) top-p over the top-k set renormalised,
 * (6) min-p relative to the top probability, (7) one draw u = k_random_uniform(seed,
 * num_output) walked down the kept tokens in descending probability (ties: lower id first).
 * A row with temperature alone (no top-k, top-p or min-p) skips (4)-(7): the exponential race
 * argmax_i logit_i / T - log(E_i), with E_i = k_random_exponential(k_random_bits(seed,
 * num_output), i), picks token i with probability softmax(logits / T)_i in one pass, as vLLM's
 * sampler does for such rows (it is what the CUDA sampler can do in one read of the row).
 *
 * Every filter keeps a prefix of the tokens ranked by (logit desc, id asc), and the draw is
 * the inverse CDF along that ranking, so nothing is fully sorted: top-k selects k tokens
 * with a bounded heap (O(V log k)); the top-p cut and the draw are weighted quickselects
 * (O(V) expected) that find where the cumulative mass along the ranking crosses a target.
 * Filtered-out logits are set to -inf, so the row left behind is the distribution that was
 * sampled from. Rows run in parallel on the worker pool. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#include "cpu_internal.h"

typedef struct {
    float v; /* logit after penalties and temperature */
    float w; /* expf(v - max logit): unnormalised probability */
    int32_t id;
} Cand;

/* Ranking: a is worse than b if its logit is lower, or equal with a higher id. */
static inline int worse(Cand a, Cand b) {
    return a.v < b.v || (a.v == b.v && a.id > b.id);
}

static inline void swap(Cand *a, Cand *b) {
    Cand t = *a;
    *a = *b;
    *b = t;
}

/* Heap whose root is the worst element. */
static void sift_down(Cand *a, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && worse(a[l], a[m]))
            m = l;
        if (r < n && worse(a[r], a[m]))
            m = r;
        if (m == i)
            return;
        swap(&a[i], &a[m]);
        i = m;
    }
}

/* Sort best first (heapsort: in place, no allocation, O(n log n) worst case). */
static void sort_best_first(Cand *a, int n) {
    for (int i = n / 2 - 1; i >= 0; i--)
        sift_down(a, n, i);
    for (int end = n - 1; end > 0; end--) {
        swap(&a[0], &a[end]);
        sift_down(a, end, 0);
    }
}

static inline int reached(double cum, double target, int inclusive) {
    return inclusive ? cum >= target : cum > target;
}

/* Weighted selection: find the first element, in rank order, at which the cumulative weight
 * reaches `target` (cum > target, or cum >= target when inclusive) without sorting: a
 * quickselect that recurses into the side holding the crossing point, O(n) expected. On
 * return a[0..r) all rank before a[r] and a[r+1..n) after it. Returns -1 when the total
 * falls short of the target (only by rounding). After too many rounds (bad pivots) the rest
 * is heapsorted, so the worst case stays O(n log n). Deterministic. */
static int mass_select(Cand *a, int n, double target, int inclusive) {
    int lo = 0, hi = n, rounds = 0;
    double before = 0.0; /* weight of a[0..lo), all ranked before a[lo..hi) */
    while (hi - lo > 16 && rounds++ < 64) {
        /* median of three by rank, moved to a[hi - 1] */
        int mid = lo + (hi - lo) / 2;
        if (worse(a[mid], a[lo]))
            swap(&a[mid], &a[lo]);
        if (worse(a[hi - 1], a[lo]))
            swap(&a[hi - 1], &a[lo]);
        if (worse(a[mid], a[hi - 1]))
            swap(&a[mid], &a[hi - 1]);
        Cand piv = a[hi - 1];
        int s = lo;
        double better = 0.0;
        for (int j = lo; j < hi - 1; j++) {
            if (worse(piv, a[j])) {
                better += a[j].w;
                swap(&a[s], &a[j]);
                s++;
            }
        }
        swap(&a[s], &a[hi - 1]);
        if (s > lo && reached(before + better, target, inclusive)) {
            hi = s;
            continue;
        }
        before += better;
        if (reached(before + a[s].w, target, inclusive))
            return s;
        before += a[s].w;
        lo = s + 1;
    }
    sort_best_first(a + lo, hi - lo);
    for (int j = lo; j < hi; j++) {
        before += a[j].w;
        if (reached(before, target, inclusive))
            return j;
    }
    return -1;
}

/* Per-thread occurrence counts, [vocab], all zero between calls (cleared through the
 * history, not by a memset of the vocabulary). A thread-specific key frees them when the
 * thread (a pool worker, the engine thread) exits. */
typedef struct {
    size_t cap;
    uint32_t n[];
} Counts;
static pthread_key_t counts_key;
static pthread_once_t counts_once = PTHREAD_ONCE_INIT;

static void counts_key_create(void) {
    PL_CHECK(pthread_key_create(&counts_key, free) == 0);
}

/* This thread's counts, room for V. */
static uint32_t *thread_counts(int V) {
    pthread_once(&counts_once, counts_key_create);
    Counts *c = pthread_getspecific(counts_key);
    if (!c || c->cap < (size_t)V) {
        free(c);
        c = pl_xcalloc(1, sizeof *c + (size_t)V * sizeof(uint32_t));
        c->cap = (size_t)V;
        PL_CHECK(pthread_setspecific(counts_key, c) == 0);
    }
    return c->n;
}

enum { REP_DONE = 1u << 31, FP_DONE = 1u << 30, COUNT_MASK = FP_DONE - 1 };

/* One row's input: its parameters and its token history. */
typedef struct {
    SamplingParams p;
    const int32_t *prompt, *output;
    int num_prompt, num_output;
} RowInput;

static RowInput row_input(const SampleRow *r, const int32_t *history, int flags) {
    RowInput in = {.p = {.temperature = r->temperature,
                         .top_p = r->top_p,
                         .top_k = r->top_k,
                         .min_p = r->min_p,
                         .repetition_penalty = r->repetition_penalty,
                         .presence_penalty = r->presence_penalty,
                         .frequency_penalty = r->frequency_penalty,
                         .seed = r->seed},
                   .num_prompt = r->num_prompt,
                   .num_output = r->num_output};
    if (flags & SAMPLE_NO_PENALTIES) { /* the promise: no row has one, the history is unread */
        in.p.repetition_penalty = 1.0f;
        in.p.presence_penalty = in.p.frequency_penalty = 0.0f;
    } else if (history) {
        in.prompt = history + r->history_offset;
        in.output = in.prompt + r->num_prompt;
    }
    return in;
}

static void apply_penalties(float *lg, int V, const RowInput *rq) {
    const SamplingParams *p = &rq->p;
    int rep = p->repetition_penalty != 1.0f && p->repetition_penalty > 0.0f;
    int fp = p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f;
    if (!rep && !fp)
        return;
    PL_CHECK(rq->prompt != NULL); /* a row with a penalty has its history */
    uint32_t *counts = thread_counts(V);
    for (int i = 0; i < rq->num_prompt; i++)
        PL_CHECK(rq->prompt[i] >= 0 && rq->prompt[i] < V);
    for (int i = 0; i < rq->num_output; i++) {
        PL_CHECK(rq->output[i] >= 0 && rq->output[i] < V);
        counts[rq->output[i]]++;
    }
    if (rep) {
        float r = p->repetition_penalty;
        for (int pass = 0; pass < 2; pass++) {
            const int32_t *toks = pass ? rq->output : rq->prompt;
            int nt = pass ? rq->num_output : rq->num_prompt;
            for (int i = 0; i < nt; i++) {
                int32_t t = toks[i];
                if (counts[t] & REP_DONE)
                    continue;
                counts[t] |= REP_DONE;
                lg[t] = lg[t] > 0.0f ? lg[t] / r : lg[t] * r;
            }
        }
    }
    if (fp) {
        for (int i = 0; i < rq->num_output; i++) {
            int32_t t = rq->output[i];
            if (counts[t] & FP_DONE)
                continue;
            float c = (float)(counts[t] & COUNT_MASK);
            counts[t] |= FP_DONE;
            lg[t] -= p->frequency_penalty * c;
            lg[t] -= p->presence_penalty;
        }
    }
    for (int i = 0; i < rq->num_prompt; i++)
        counts[rq->prompt[i]] = 0;
    for (int i = 0; i < rq->num_output; i++)
        counts[rq->output[i]] = 0;
}

/* Largest value in 8 lanes (vectorisable; no NaN left by then). */
static float row_max(const float *lg, int V) {
    float lane[8];
    for (int j = 0; j < 8; j++)
        lane[j] = -INFINITY;
    int i = 0;
    for (; i + 8 <= V; i += 8)
        for (int j = 0; j < 8; j++)
            lane[j] = lg[i + j] > lane[j] ? lg[i + j] : lane[j];
    float m = -INFINITY;
    for (int j = 0; j < 8; j++)
        m = lane[j] > m ? lane[j] : m;
    for (; i < V; i++)
        m = lg[i] > m ? lg[i] : m;
    return m;
}

/* First index holding the largest logit. */
static int32_t argmax(const float *lg, int V) {
    float m = row_max(lg, V);
    for (int i = 0; i < V; i++)
        if (lg[i] == m)
            return i;
    return 0;
}

/* The exponential race over a scaled row with a finite maximum (lowest id on ties; a token at
 * -inf never wins). */
static int32_t race(const float *lg, int V, uint64_t seed, int num_output) {
    uint64_t bits = k_random_bits(seed, (uint64_t)num_output);
    float best = -INFINITY;
    int32_t at = -1;
    for (int i = 0; i < V; i++) {
        float score = lg[i] - logf(k_random_exponential(bits, (uint32_t)i));
        if (score > best) {
            best = score;
            at = i;
        }
    }
    return at >= 0 ? at : argmax(lg, V);
}

static int32_t sample_row(float *lg, int V, const RowInput *rq, Cand *cand) {
    const SamplingParams *p = &rq->p;
    for (int i = 0; i < V; i++)
        if (isnan(lg[i]))
            lg[i] = -INFINITY;
    apply_penalties(lg, V, rq);
    if (sampling_greedy(p))
        return argmax(lg, V);

    float temp = p->temperature;
    for (int i = 0; i < V; i++)
        lg[i] /= temp;
    float lmax = row_max(lg, V);
    if (!(lmax > -INFINITY) || lmax == INFINITY)
        return argmax(lg, V); /* no finite distribution to draw from */
    if (sampling_temperature_only(p, V))
        return race(lg, V, p->seed, rq->num_output);

    /* candidates: the top-k tokens, or every token of nonzero weight */
    int m = 0;
    int k = p->top_k > 0 && p->top_k < V ? p->top_k : V;
    if (k < V) {
        /* bounded heap of the k best, root = worst kept: O(V log k), usually O(V) */
        for (int i = 0; i < V; i++) {
            Cand c = {lg[i], 0.0f, i};
            if (m < k) {
                cand[m++] = c;
                if (m == k)
                    for (int j = k / 2 - 1; j >= 0; j--)
                        sift_down(cand, k, j);
            } else if (worse(cand[0], c)) {
                cand[0] = c;
                sift_down(cand, k, 0);
            }
        }
        for (int j = 0; j < m; j++)
            cand[j].w = expf(cand[j].v - lmax);
    } else {
        for (int i = 0; i < V; i++) {
            float w = expf(lg[i] - lmax);
            if (w > 0.0f)
                cand[m++] = (Cand){lg[i], w, i};
        }
    }
    double total = 0.0;
    for (int j = 0; j < m; j++)
        total += (double)cand[j].w;

    /* top-p over the (top-k) candidates: keep up to the token where the mass reaches p */
    int keep = m;
    double kept_total = total;
    if (p->top_p < 1.0f) {
        int r = mass_select(cand, m, (double)p->top_p * total, 1);
        if (r >= 0 && r + 1 < m) {
            keep = r + 1;
            kept_total = 0.0;
            for (int j = 0; j < keep; j++)
                kept_total += (double)cand[j].w;
        }
    }
    /* min-p relative to the top token (weight 1), which always stays */
    if (p->min_p > 0.0f) {
        float thr = p->min_p < 1.0f ? p->min_p : 1.0f;
        int j = 0;
        for (int i = 0; i < keep; i++)
            if (cand[i].w >= thr)
                cand[j++] = cand[i];
        if (j < keep) {
            keep = j;
            kept_total = 0.0;
            for (int i = 0; i < keep; i++)
                kept_total += (double)cand[i].w;
        }
    }

    double u = (double)k_random_uniform(p->seed, (uint64_t)rq->num_output);
    int r = mass_select(cand, keep, u * kept_total, 0);
    if (r < 0) { /* rounding put the target past the end: the last token of nonzero weight */
        for (int j = 0; j < keep; j++)
            if (cand[j].w > 0.0f && (r < 0 || worse(cand[j], cand[r])))
                r = j;
    }
    PL_CHECK(r >= 0);
    int32_t token = cand[r].id;

    /* leave the sampled-from distribution in the row: everything ranked after the worst kept
     * token becomes -inf (zero-weight tokens are left alone when nothing was cut) */
    if (k < V || keep < m) {
        Cand last = cand[0];
        for (int j = 1; j < keep; j++)
            if (worse(cand[j], last))
                last = cand[j];
        for (int i = 0; i < V; i++) {
            Cand c = {lg[i], 0.0f, i};
            if (worse(c, last))
                lg[i] = -INFINITY;
        }
    }
    return token;
}

typedef struct {
    int32_t *tokens;
    float *logits;
    int n, vocab;
    float *token_logits;
    const SampleRow *rows;
    const int32_t *history;
    int flags;
} SampleJob;

static void sample_task(void *ctx, int tid, int nt) {
    const SampleJob *jb = ctx;
    Cand *cand = NULL;
    for (int i = tid; i < jb->n; i += nt) {
        if (!cand)
            cand = cpu_scratch(1, (size_t)jb->vocab * sizeof(Cand));
        float *row = jb->logits + (size_t)i * jb->vocab;
        RowInput in = row_input(&jb->rows[i], jb->history, jb->flags);
        if (!jb->token_logits) {
            jb->tokens[i] = sample_row(row, jb->vocab, &in, cand);
            continue;
        }
        float *raw = cpu_scratch(2, (size_t)jb->vocab * sizeof(float));
        memcpy(raw, row, (size_t)jb->vocab * sizeof(float));
        jb->tokens[i] = sample_row(row, jb->vocab, &in, cand);
        jb->token_logits[i] = raw[jb->tokens[i]];
    }
}

void cpu_sample_rows(const KernelOps *ops, int32_t *tokens, float *token_logits, float *logits,
                     int n, int vocab, const SampleRow *rows, const int32_t *history, int flags,
                     void *workspace, size_t workspace_bytes) {
    PL_CHECK(vocab > 0);
    SampleJob jb = {tokens, logits, n, vocab, token_logits, rows, history, flags};
    cpu_parallel(cpu_pool(ops), sample_task, &jb, (double)n * vocab < 65536.0 ? 1 : n);
}

void cpu_logits_add(const KernelOps *ops, float *logits, int vocab, const LogitEdit *edits, int n) {
    for (int i = 0; i < n; i++) {
        PL_CHECK(edits[i].row >= 0 && edits[i].token >= 0 && edits[i].token < vocab);
        logits[(size_t)edits[i].row * vocab + edits[i].token] += edits[i].add;
    }
}

void cpu_logits_mask(const KernelOps *ops, float *logits, int vocab, const uint32_t *masks,
                     const int32_t *rows, int n) {
    size_t words = ((size_t)vocab + 31) / 32;
    for (int i = 0; i < n; i++) {
        PL_CHECK(rows[i] >= 0);
        float *row = logits + (size_t)rows[i] * vocab;
        const uint32_t *m = masks + (size_t)i * words;
        for (int t = 0; t < vocab; t++)
            if (!(m[t / 32] >> (t % 32) & 1u))
                row[t] = -INFINITY;
    }
}

/* The k best of a row into ids / vals (best first, the lower id first on equal logits),
 * k <= vocab: insertion into a sorted list, k is small. */
static void row_top_k(const float *row, int vocab, int k, int32_t *ids, float *vals) {
    int n = 0;
    for (int i = 0; i < vocab; i++) {
        if (n == k && row[i] <= vals[k - 1])
            continue;
        int j = n < k ? n++ : k - 1;
        while (j > 0 && vals[j - 1] < row[i]) {
            vals[j] = vals[j - 1];
            ids[j] = ids[j - 1];
            j--;
        }
        vals[j] = row[i];
        ids[j] = i;
    }
}

void cpu_logprobs(const KernelOps *ops, float *lse, int32_t *top_ids, float *top_logprobs,
                  const float *logits, int n, int vocab, int k) {
    PL_CHECK(vocab >= 1 && k >= 0 && k <= vocab);
    for (int r = 0; r < n; r++) {
        const float *row = logits + (size_t)r * vocab;
        float max = row[0];
        for (int i = 1; i < vocab; i++)
            max = row[i] > max ? row[i] : max;
        double sum = 0;
        for (int i = 0; i < vocab; i++)
            sum += exp((double)(row[i] - max));
        lse[r] = max + (float)log(sum);
        if (k == 0)
            continue;
        int32_t *ids = top_ids + (size_t)r * k;
        float *vals = top_logprobs + (size_t)r * k;
        row_top_k(row, vocab, k, ids, vals);
        for (int i = 0; i < k; i++)
            vals[i] -= lse[r];
    }
}
