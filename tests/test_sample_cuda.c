/* test_sample_cuda.c - k_cuda_sample and k_cuda_logprobs (kernels/cuda/sample.cu, logprobs.cu)
 * against the CPU backend's `sample` and `logprobs` ops (test_cpu_ops(), the reference), on
 * random batches from fixed seeds.
 *
 * Sampling: every batch mixes rows of different kinds (uniform, flat, peaked, bf16-rounded with
 * many equal logits, NaN and -inf entries, wide ranges where most weights underflow) and
 * parameters (greedy, temperature only, top-k from 1 to beyond the vocabulary, top-p, min-p,
 * all three, repetition / frequency / presence penalties over random prompt and output
 * histories, greedy with penalties), random seeds, vocabularies 512, 1000 (unaligned rows)
 * and 128256, n from 1 to 256, through the general path and through the flags' fast paths.
 * The GPU token must equal the CPU token, and token_logits the raw logit of that token.
 *
 * Floating-point sums differ between the two (fixed-point on the GPU, double on the CPU; exp
 * may differ by an ulp), so equality is guaranteed only away from near-ties: a mismatch is
 * excused when an oracle (the CPU semantics again, by a full sort in double) finds the top-p
 * cut or the draw within 1e-8 of the mass of a token boundary, or a token within 1e-6 of the
 * min-p threshold, or for a temperature-only row (the exponential race) the GPU's token
 * scoring within 1e-4 of the best (the GPU's fast logarithms). Random logits make that rare (each
 * row's chance is about 1e-8 times its number of candidate boundaries near the target, or ~1e-4 for
 * a race); excused mismatches are counted and printed. Special rows force every path of the
 * selection: all-equal logits (ties broken by id), a bin of 20000 distinct logits too large for
 * shared memory, NaN / inf rows. Temperature-only rows alone (the race) run over many seeds,
 * temperatures and row kinds (test_sample_race), and the race's rewritten arithmetic is checked
 * against the plain formulas in host arithmetic (test_race_arithmetic, which needs no GPU).
 *
 * Logprobs: lse within 1e-5 relative, top ids equal, top logprobs within 1e-5.
 *
 * Without a GPU every test but test_race_arithmetic is skipped with "no CUDA device: skipped";
 * in a build without the CUDA backend, with "CUDA backend not built: skipped". The last test
 * prints timings (cudaEvent, median of 20); PAGELLM_SAMPLE_TIMING=ROWSxVOCAB (e.g. 256x128256)
 * makes it time temperature-only sampling of that shape alone. PAGELLM_CUDA_TEST_QUICK=1 shrinks
 * the sweeps and drops the timing test; PAGELLM_CUDA_TEST_FILTER=pattern runs the matching tests
 * only. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels.h"
#include "backend_test_util.h"
#ifdef PAGELLM_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels_cuda.h"
#endif
#include "cuda_test_util.h"

#define SAMPLE_TESTS(X)                                                                            \
    X(test_sample_sweep)                                                                           \
    X(test_sample_special)                                                                         \
    X(test_sample_race)                                                                            \
    X(test_logprobs)                                                                               \
    X(test_logits_add)                                                                             \
    X(test_logits_mask)                                                                            \
    X(test_sample_timing)

#ifndef PAGELLM_HAVE_CUDA

SAMPLE_TESTS(SKIP_TEST)

#else

/* ---------------- batches ---------------- */

enum {
    ROW_UNIFORM,  /* U(-8, 8) */
    ROW_FLAT,     /* U(-2, 2): large nuclei */
    ROW_PEAKED,   /* a bell-shaped bulk and 1..30 hot tokens among the low ids */
    ROW_BF16,     /* ROW_PEAKED rounded to bf16: many equal logits */
    ROW_HOLES,    /* U(-8, 8) with 3% NaN and 3% -inf */
    ROW_WIDE,     /* U(-60, 60): most weights underflow */
    ROW_EQUAL,    /* every logit 1.5 */
    ROW_BIG_BIN,  /* 20000 logits within 0.02 of 5 (one bin of more than 8192), the rest lower */
    ROW_ALL_NINF, /* -inf everywhere but for a few NaN */
    ROW_INF,      /* U(-8, 8) with two +inf */
    ROW_TINY,     /* U(-1, 1) 2^-118: divided by 98, many are subnormal (the race's race_fix) */
    ROW_KINDS_RANDOM = ROW_WIDE + 1
};

static void gen_row(float *row, int V, int kind) {
    for (int i = 0; i < V; i++) {
        switch (kind) {
            case ROW_UNIFORM:
            case ROW_HOLES:
            case ROW_INF:
                row[i] = rnd(-8, 8);
                break;
            case ROW_FLAT:
                row[i] = rnd(-2, 2);
                break;
            case ROW_PEAKED:
            case ROW_BF16:
                row[i] = -5.0f + 3.0f * (rnd(0, 1) + rnd(0, 1) + rnd(0, 1) - 1.5f);
                break;
            case ROW_WIDE:
                row[i] = rnd(-60, 60);
                break;
            case ROW_EQUAL:
                row[i] = 1.5f;
                break;
            case ROW_BIG_BIN:
                row[i] = rnd(-10, 0);
                break;
            case ROW_TINY:
                row[i] = ldexpf(rnd(-1, 1), -118);
                break;
            default:
                row[i] = -INFINITY;
        }
    }
    if (kind == ROW_PEAKED || kind == ROW_BF16) {
        int hot = 1 + rnd_int(30);
        for (int h = 0; h < hot; h++)
            row[rnd_int(V < 50 ? V : 50)] = rnd(4, 12);
    }
    if (kind == ROW_BF16)
        for (int i = 0; i < V; i++)
            row[i] = round_to(row[i], DT_BF16);
    if (kind == ROW_HOLES)
        for (int i = 0; i < V; i++) {
            int r = rnd_int(100);
            row[i] = r < 3 ? NAN : r < 6 ? -INFINITY : row[i];
        }
    if (kind == ROW_BIG_BIN)
        for (int i = 0; i < 20000 && i < V; i++)
            row[(i * 7) % V] = 5.0f + rnd(0, 0.02f);
    if (kind == ROW_ALL_NINF)
        for (int i = 0; i < 3; i++)
            row[rnd_int(V)] = NAN;
    if (kind == ROW_INF) {
        row[rnd_int(V)] = INFINITY;
        row[rnd_int(V)] = INFINITY;
    }
}

/* Random parameters: greedy, temperature only, top-k, top-p, min-p, all three, penalties with
 * some filters, penalties with temperature only, greedy with penalties. */
static SamplingParams gen_params(int V) {
    SamplingParams p = sampling_params_default();
    p.seed = rng_next();
    int mode = rnd_int(9);
    const float temps[] = {0.3f, 0.7f, 1.0f, 1.5f};
    const int ks[] = {1, 2, 10, 50, V / 3, V - 1, V + 5};
    const float ps[] = {0.05f, 0.5f, 0.9f, 0.99f};
    const float mps[] = {0.001f, 0.05f, 0.3f};
    if (mode != 0 && mode != 8)
        p.temperature = temps[rnd_int(4)];
    if (mode == 2 || mode == 5 || (mode == 6 && rnd_int(2)))
        p.top_k = ks[rnd_int(7)];
    if (mode == 3 || mode == 5 || (mode == 6 && rnd_int(2)))
        p.top_p = ps[rnd_int(4)];
    if (mode == 4 || mode == 5 || (mode == 6 && rnd_int(2)))
        p.min_p = mps[rnd_int(3)];
    if (mode >= 6) {
        const float reps[] = {1.0f, 1.3f, 0.8f}, freqs[] = {0.0f, 0.4f, -0.3f};
        p.repetition_penalty = reps[rnd_int(3)];
        p.frequency_penalty = freqs[rnd_int(3)];
        p.presence_penalty = rnd_int(2) ? 0.6f : 0.0f;
        if (p.repetition_penalty == 1.0f && p.frequency_penalty == 0.0f &&
            p.presence_penalty == 0.0f)
            p.repetition_penalty = 1.3f;
    }
    return p;
}

typedef struct {
    int n, V;
    float *logits; /* [n, V] raw */
    SamplingParams *params;
    int32_t *hist; /* packed: each row's prompt then output */
    int hist_len;
    int *off, *np, *no;
} Batch;

/* A batch of n rows of the given kind (-1: random kinds), parameters from gen_params unless
 * fixed is given. Histories draw 70% of their tokens from the 50 lowest ids (repeats, and
 * the peaked rows' hot tokens), the rest from the whole vocabulary. */
static Batch make_batch(int n, int V, int kind, const SamplingParams *fixed) {
    Batch b = {.n = n, .V = V};
    b.logits = xmalloc(sizeof(float) * (size_t)n * V);
    b.params = xmalloc(sizeof(SamplingParams) * n);
    b.off = xmalloc(sizeof(int) * n);
    b.np = xmalloc(sizeof(int) * n);
    b.no = xmalloc(sizeof(int) * n);
    b.hist = xmalloc(sizeof(int32_t) * (size_t)n * 100);
    for (int i = 0; i < n; i++) {
        gen_row(b.logits + (size_t)i * V, V, kind >= 0 ? kind : rnd_int(ROW_KINDS_RANDOM));
        b.params[i] = fixed ? *fixed : gen_params(V);
        if (fixed)
            b.params[i].seed = rng_next();
        b.off[i] = b.hist_len;
        b.np[i] = rnd_int(60);
        b.no[i] = rnd_int(40);
        for (int j = 0; j < b.np[i] + b.no[i]; j++)
            b.hist[b.hist_len++] = rnd_int(10) < 7 ? rnd_int(V < 50 ? V : 50) : rnd_int(V);
    }
    return b;
}

static void free_batch(Batch *b) {
    free(b->logits);
    free(b->params);
    free(b->hist);
    free(b->off);
    free(b->np);
    free(b->no);
}

static TestDraw request_of(const Batch *b, int i, const SamplingParams *p) {
    return (TestDraw){.params = p,
                      .prompt = b->hist + b->off[i],
                      .num_prompt = b->np[i],
                      .output = b->hist + b->off[i] + b->np[i],
                      .num_output = b->no[i]};
}

static int has_penalty(const SamplingParams *p) {
    return (p->repetition_penalty != 1.0f && p->repetition_penalty > 0.0f) ||
           p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f;
}

/* ---------------- the near-tie oracle ---------------- */

typedef struct {
    float v;
    int32_t id;
} Ranked;

static int rank_cmp(const void *a, const void *b) {
    const Ranked *x = a, *y = b;
    if (x->v != y->v)
        return x->v > y->v ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static int close_to(double cum, double target, double scale) {
    return fabs(cum - target) < 1e-8 * scale;
}

/* Row i by the CPU semantics with a full sort: 1 when a cut or the draw is a near-tie (see
 * the file comment), for a race when the GPU's token `gpu` scored within the logarithms'
 * differences of the best; *oracle_token gets its token. Greedy rows and rows without a finite
 * distribution have no near-ties. */
static int near_tie(const Batch *b, int i, int32_t gpu, int32_t *oracle_token) {
    const SamplingParams *p = &b->params[i];
    int V = b->V;
    *oracle_token = -1;
    if (sampling_greedy(p))
        return 0;
    /* the penalised, scaled row: the CPU op with every filter off leaves it behind */
    SamplingParams plain = *p;
    plain.top_k = 0;
    plain.top_p = 1.0f;
    plain.min_p = 0.0f;
    float *v = xmalloc(sizeof(float) * V);
    memcpy(v, b->logits + (size_t)i * V, sizeof(float) * V);
    TestDraw rq = request_of(b, i, &plain);
    int32_t t;
    test_sample(test_cpu_ops(), &t, v, 1, V, &rq);
    Ranked *r = xmalloc(sizeof(Ranked) * V);
    float lmax = -INFINITY;
    for (int j = 0; j < V; j++) {
        r[j] = (Ranked){v[j], j};
        lmax = v[j] > lmax ? v[j] : lmax;
    }
    int near = 0;
    if (!(lmax > -INFINITY) || lmax == INFINITY)
        goto done;
    if (sampling_temperature_only(p, V)) {
        /* the race: near when the GPU's token scored within the logarithms' differences of
         * the best */
        uint64_t bits = k_random_bits(p->seed, (uint64_t)b->no[i]);
        float best = -INFINITY, at_gpu = -INFINITY;
        for (int j = 0; j < V; j++) {
            float score = v[j] - logf(k_random_exponential(bits, (uint32_t)j));
            if (score > best) {
                best = score;
                *oracle_token = j;
            }
            if (j == gpu)
                at_gpu = score;
        }
        near = best - at_gpu < 1e-4f + 1e-6f * fabsf(best);
        goto done;
    }
    qsort(r, V, sizeof(Ranked), rank_cmp);
    double *w = xmalloc(sizeof(double) * V);
    int m = 0;
    for (int j = 0; j < V; j++) {
        w[j] = expf(r[j].v - lmax);
        m += w[j] > 0.0;
    }
    if (p->top_k > 0 && p->top_k < V)
        m = p->top_k;
    double total = 0.0;
    for (int j = 0; j < m; j++)
        total += w[j];
    int keep = m;
    double kept = total, cum = 0.0;
    if (p->top_p < 1.0f) {
        double target = (double)p->top_p * total;
        for (int j = 0; j < m; j++) {
            double prev = cum;
            cum += w[j];
            if (cum >= target) {
                near |= close_to(cum, target, total) || close_to(prev, target, total);
                keep = j + 1;
                kept = cum;
                break;
            }
        }
    }
    if (p->min_p > 0.0f) {
        double thr = p->min_p < 1.0f ? p->min_p : 1.0f;
        int j = 0;
        kept = 0.0;
        for (int e = 0; e < keep; e++) {
            near |= fabs(w[e] - thr) <= 1e-6 * thr;
            if (w[e] >= thr) {
                kept += w[e];
                j++;
            }
        }
        keep = j;
    }
    double target = (double)k_random_uniform(p->seed, (uint64_t)b->no[i]) * kept;
    cum = 0.0;
    for (int j = 0; j < keep; j++) {
        double prev = cum;
        cum += w[j];
        if (cum > target) {
            near |= close_to(cum, target, kept) || close_to(prev, target, kept);
            *oracle_token = r[j].id;
            break;
        }
    }
    free(w);
done:
    free(v);
    free(r);
    return near;
}

/* ---------------- running a batch both ways ---------------- */

typedef struct {
    int rows, bad, near;
} Tally;

/* CPU tokens of batch b. */
static int32_t *cpu_tokens(const Batch *b) {
    float *l = xmalloc(sizeof(float) * (size_t)b->n * b->V);
    memcpy(l, b->logits, sizeof(float) * (size_t)b->n * b->V);
    TestDraw *reqs = xmalloc(sizeof(TestDraw) * b->n);
    for (int i = 0; i < b->n; i++)
        reqs[i] = request_of(b, i, &b->params[i]);
    int32_t *t = xmalloc(sizeof(int32_t) * b->n);
    test_sample(test_cpu_ops(), t, l, b->n, b->V, reqs);
    free(l);
    free(reqs);
    return t;
}

static KCudaSampleRow row_of(const Batch *b, int i) {
    return k_sample_row(&b->params[i], b->np[i], b->no[i], b->off[i]);
}

/* Device copies of a batch's rows and history, and a workspace. */
typedef struct {
    float *logits;
    KCudaSampleRow *rows;
    int32_t *hist, *tokens;
    float *token_logits;
    void *ws;
    size_t ws_bytes;
} DevBatch;

static DevBatch upload_batch(const Batch *b) {
    DevBatch d;
    KCudaSampleRow *rows = xmalloc(sizeof(KCudaSampleRow) * b->n);
    for (int i = 0; i < b->n; i++)
        rows[i] = row_of(b, i);
    d.logits = k_cuda_malloc(sizeof(float) * (size_t)b->n * b->V);
    d.rows = upload(rows, sizeof(KCudaSampleRow) * b->n);
    d.hist = upload(b->hist, sizeof(int32_t) * (b->hist_len ? b->hist_len : 1));
    d.tokens = k_cuda_malloc(sizeof(int32_t) * b->n);
    d.token_logits = k_cuda_malloc(sizeof(float) * b->n);
    d.ws_bytes = k_cuda_sample_workspace_bytes(b->n, b->V, b->hist_len);
    d.ws = k_cuda_malloc(d.ws_bytes);
    k_cuda_memset(d.ws, 0xA5, d.ws_bytes); /* garbage: no zeroing is needed */
    free(rows);
    return d;
}

static void free_dev(DevBatch *d) {
    k_cuda_free(d->logits);
    k_cuda_free(d->rows);
    k_cuda_free(d->hist);
    k_cuda_free(d->tokens);
    k_cuda_free(d->token_logits);
    k_cuda_free(d->ws);
}

/* Sample b on the GPU with `flags` and compare with the CPU tokens `want`. */
static void check_gpu(const Batch *b, DevBatch *d, const int32_t *want, int flags, Tally *t,
                      const char *what) {
    size_t bytes = sizeof(float) * (size_t)b->n * b->V;
    k_cuda_memcpy(d->logits, b->logits, bytes);
    k_cuda_memset(d->tokens, 0xFF, sizeof(int32_t) * b->n);
    k_cuda_memset(d->token_logits, 0xFF, sizeof(float) * b->n);
    k_cuda_sample(d->tokens, d->token_logits, d->logits, b->n, b->V, d->rows, d->hist, flags, d->ws,
                  d->ws_bytes, NULL);
    int32_t *got = xmalloc(sizeof(int32_t) * b->n);
    float *tl = xmalloc(sizeof(float) * b->n);
    k_cuda_memcpy(got, d->tokens, sizeof(int32_t) * b->n);
    k_cuda_memcpy(tl, d->token_logits, sizeof(float) * b->n);
    for (int i = 0; i < b->n; i++) {
        t->rows++;
        const SamplingParams *p = &b->params[i];
        if (got[i] == want[i]) {
            float raw = b->logits[(size_t)i * b->V + want[i]];
            if (memcmp(&raw, &tl[i], sizeof raw) != 0 && !(isnan(raw) && isnan(tl[i]))) {
                if (t->bad++ < 10)
                    print_error("%s row %d: token_logits %.9g, raw logit %.9g\n", what, i,
                                (double)tl[i], (double)raw);
            }
            continue;
        }
        int32_t oracle;
        int near = near_tie(b, i, got[i], &oracle);
        if (near)
            t->near++;
        else
            t->bad++;
        if (!near || t->near <= 5)
            print_message("%s%s row %d (V %d): gpu %d cpu %d oracle %d; T %g k %d p %g min-p %g "
                          "rep %g freq %g pres %g hist %d+%d\n",
                          near ? "near-tie (excused) " : "MISMATCH ", what, i, b->V, got[i],
                          want[i], oracle, (double)p->temperature, p->top_k, (double)p->top_p,
                          (double)p->min_p, (double)p->repetition_penalty,
                          (double)p->frequency_penalty, (double)p->presence_penalty, b->np[i],
                          b->no[i]);
    }
    free(got);
    free(tl);
}

/* The batch through the general path, and through the fast paths its rows allow. */
static void run_batch(const Batch *b, Tally *t, const char *what) {
    int32_t *want = cpu_tokens(b);
    DevBatch d = upload_batch(b);
    check_gpu(b, &d, want, 0, t, what);
    int argmax_only = 1, pen = 0;
    for (int i = 0; i < b->n; i++) {
        argmax_only &=
            sampling_greedy(&b->params[i]) || sampling_temperature_only(&b->params[i], b->V);
        pen |= has_penalty(&b->params[i]);
    }
    int flags = (argmax_only ? KC_SAMPLE_ARGMAX_ONLY : 0) | (pen ? 0 : KC_SAMPLE_NO_PENALTIES);
    if (flags)
        check_gpu(b, &d, want, flags, t, what);
    free_dev(&d);
    free(want);
}

static void test_sample_sweep(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(101);
    Tally t = {0};
    const int ns_small[] = {1, 3, 64, 256};
    for (int rep = 0; rep < (quick() ? 1 : 3); rep++)
        for (int a = 0; a < 4; a++) {
            Batch b = make_batch(ns_small[a], 512, -1, NULL);
            run_batch(&b, &t, "V 512");
            free_batch(&b);
        }
    for (int a = 0; a < 2; a++) {
        Batch b = make_batch(a ? 100 : 5, 1000, -1, NULL);
        run_batch(&b, &t, "V 1000");
        free_batch(&b);
    }
    const int ns_big[] = {1, 16, 256};
    for (int a = 0; a < (quick() ? 1 : 3); a++) {
        Batch b = make_batch(ns_big[a], 128256, -1, NULL);
        run_batch(&b, &t, "V 128256");
        free_batch(&b);
    }
    /* all greedy, then all temperature-only (the race), with and without penalties: the
     * argmax kernel */
    const char *names[4] = {"greedy", "greedy+penalty", "race T 0.7", "race T 0.7+penalty"};
    for (int a = 0; a < 4; a++) {
        SamplingParams g = sampling_params_default();
        g.temperature = a >= 2 ? 0.7f : 0.0f;
        g.repetition_penalty = a % 2 ? 1.3f : 1.0f;
        Batch b = make_batch(quick() ? 8 : 256, quick() ? 1000 : 128256, -1, &g);
        run_batch(&b, &t, names[a]);
        free_batch(&b);
    }
    print_message("sample sweep: %d rows compared, %d mismatches, %d excused near-ties\n", t.rows,
                  t.bad, t.near);
    assert_int_equal(t.bad, 0);
}

/* Rows that force the rare paths: equal logits (more than 8192 tokens of one value, taken in
 * id order), one bin of 20000 distinct logits (narrowed by key histograms), NaN / inf rows,
 * extreme parameters. */
static void test_sample_special(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(202);
    Tally t = {0};
    const int kinds[] = {ROW_EQUAL, ROW_BIG_BIN, ROW_ALL_NINF, ROW_INF, ROW_BF16, ROW_HOLES};
    const char *names[] = {"equal", "big bin", "all -inf", "+inf", "bf16", "holes"};
    SamplingParams ps[8];
    for (int j = 0; j < 8; j++) {
        ps[j] = sampling_params_default();
        ps[j].temperature = 1.0f;
    }
    ps[1].top_k = 100000;
    ps[2].top_p = 0.5f;
    ps[3].min_p = 0.5f;
    ps[4].top_p = 0.0f; /* the best token only */
    ps[5].min_p = 1.0f; /* the tokens of the largest logit */
    ps[6].top_k = 9000;
    ps[6].top_p = 0.95f;
    ps[7].temperature = 1e-5f; /* the smallest sampling temperature */
    ps[7].top_p = 0.9f;
    for (int v = 0; v < 2; v++) {
        int V = v ? 128256 : 20000;
        for (int k = 0; k < 6; k++)
            for (int j = 0; j < 8; j++) {
                if (quick() && V > 20000 && j > 2)
                    continue;
                Batch b = make_batch(4, V, kinds[k], &ps[j]);
                char what[64];
                snprintf(what, sizeof what, "%s params %d", names[k], j);
                run_batch(&b, &t, what);
                free_batch(&b);
            }
    }
    print_message("sample special: %d rows compared, %d mismatches, %d excused near-ties\n", t.rows,
                  t.bad, t.near);
    assert_int_equal(t.bad, 0);
}

/* The race's m = k_random_exponential's 53 bits for `token` (kernels/kernels.c): the series
 * gives E when m < 2^48. */
static uint64_t race_m(uint64_t bits, int32_t token) {
    uint64_t z = bits ^ ((uint64_t)(uint32_t)token * 0x9fb21c651e98df25ull + 0x2545f4914f6cdd1dull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (z ^ (z >> 31)) >> 11;
}

/* Temperature-only rows alone (the exponential race, kernels/cuda/sample.cu's race_pass and
 * race_argmax) over many seeds: temperatures 1 (no division), 0.7, 1.3, 1e-5 and 98 (with tiny
 * logits, quotients that come out subnormal), row kinds from flat (the winner's E almost always
 * comes from the series branch) to peaked (from the logarithm), NaN / -inf holes, +inf and
 * all -inf rows (the race gives no token: the argmax), with and without penalties, through the
 * general kernel and the argmax one. */
static void test_sample_race(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(505);
    Tally t = {0};
    const float temps[] = {1.0f, 0.7f, 1.3f, 1e-5f, 98.0f};
    const int kinds[] = {ROW_FLAT, ROW_UNIFORM, ROW_PEAKED, ROW_BF16,    ROW_HOLES,
                         ROW_WIDE, ROW_TINY,    ROW_INF,    ROW_ALL_NINF};
    const char *names[] = {"flat", "uniform", "peaked", "bf16",    "holes",
                           "wide", "tiny",    "+inf",   "all -inf"};
    long series = 0, raced = 0;
    for (int big = 0; big < 2; big++)
        for (int ti = 0; ti < 5; ti++)
            for (int k = 0; k < 9; k++) {
                if (big && (ti > 1 || k > 2))
                    continue; /* vocab 128256: temperatures 1 and 0.7, three kinds */
                const int V = big ? 128256 : 1000, n = big ? (quick() ? 2 : 48) : quick() ? 8 : 256;
                SamplingParams g = sampling_params_default();
                g.temperature = temps[ti];
                g.repetition_penalty = (ti + k) % 2 ? 1.3f : 1.0f;
                Batch b = make_batch(n, V, kinds[k], &g);
                char what[80];
                snprintf(what, sizeof what, "race V %d T %g %s%s", V, (double)g.temperature,
                         names[k], g.repetition_penalty != 1.0f ? " +penalty" : "");
                run_batch(&b, &t, what);
                /* how often the CPU's winner drew E from the series (m < 2^48) */
                if (kinds[k] < ROW_EQUAL) {
                    int32_t *want = cpu_tokens(&b);
                    for (int i = 0; i < n; i++) {
                        uint64_t bits = k_random_bits(b.params[i].seed, (uint64_t)b.no[i]);
                        series += race_m(bits, want[i]) < (1ull << 48);
                        raced++;
                    }
                    free(want);
                }
                free_batch(&b);
            }
    /* race_m is k_random_exponential's m */
    for (int i = 0; i < 1000; i++) {
        uint64_t bits = rng_next();
        int32_t tok = rnd_int(1 << 20);
        assert_true(k_random_exponential(bits, (uint32_t)tok) ==
                    k_random_exponential_of(race_m(bits, tok)));
    }
    print_message("sample race: %d rows compared, %d mismatches, %d excused near-ties; the "
                  "winner's E from the series in %ld of %ld finite rows\n",
                  t.rows, t.bad, t.near, series, raced);
    assert_int_equal(t.bad, 0);
    assert_true(series > raced / 10 && series < raced); /* both branches decide rows */
}

/* ---------------- logprobs ---------------- */

static int logprobs_case(int n, int V, int k, int kind) {
    float *l = xmalloc(sizeof(float) * (size_t)n * V);
    for (int i = 0; i < n; i++)
        gen_row(l + (size_t)i * V, V, kind);
    float *want_lse = xmalloc(sizeof(float) * n), *got_lse = xmalloc(sizeof(float) * n);
    int32_t *want_ids = xmalloc(sizeof(int32_t) * n * (k + 1));
    int32_t *got_ids = xmalloc(sizeof(int32_t) * n * (k + 1));
    float *want_lp = xmalloc(sizeof(float) * n * (k + 1));
    float *got_lp = xmalloc(sizeof(float) * n * (k + 1));
    test_cpu_ops()->logprobs(test_cpu_ops(), want_lse, want_ids, want_lp, l, n, V,
                             k); /* the reference */
    float *dl = upload(l, sizeof(float) * (size_t)n * V);
    float *dlse = k_cuda_malloc(sizeof(float) * n);
    int32_t *dids = k_cuda_malloc(sizeof(int32_t) * n * (k + 1));
    float *dlp = k_cuda_malloc(sizeof(float) * n * (k + 1));
    k_cuda_memset(dlse, 0xFF, sizeof(float) * n);
    k_cuda_memset(dids, 0xFF, sizeof(int32_t) * n * (k + 1));
    k_cuda_memset(dlp, 0xFF, sizeof(float) * n * (k + 1));
    k_cuda_logprobs(dlse, dids, dlp, dl, n, V, k, NULL);
    k_cuda_memcpy(got_lse, dlse, sizeof(float) * n);
    k_cuda_memcpy(got_ids, dids, sizeof(int32_t) * n * k);
    k_cuda_memcpy(got_lp, dlp, sizeof(float) * n * k);
    char what[96];
    snprintf(what, sizeof what, "logprobs n %d V %d k %d kind %d: lse", n, V, k, kind);
    int bad = check_close(what, got_lse, want_lse, n, 1e-5);
    snprintf(what, sizeof what, "logprobs n %d V %d k %d kind %d: top logprobs", n, V, k, kind);
    bad += check_close(what, got_lp, want_lp, (size_t)n * k, 1e-5);
    int idbad = 0;
    for (int i = 0; i < n * k; i++)
        if (got_ids[i] != want_ids[i] && idbad++ < 5)
            print_error("logprobs n %d V %d k %d kind %d: row %d rank %d id %d, want %d\n", n, V, k,
                        kind, i / k, i % k, got_ids[i], want_ids[i]);
    k_cuda_free(dl);
    k_cuda_free(dlse);
    k_cuda_free(dids);
    k_cuda_free(dlp);
    free(l);
    free(want_lse);
    free(got_lse);
    free(want_ids);
    free(got_ids);
    free(want_lp);
    free(got_lp);
    return bad + idbad;
}

static void test_logprobs(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(303);
    const int Vs[] = {20, 512, 1000, 128256}, ks[] = {0, 1, 5, 20};
    const int kinds[] = {ROW_UNIFORM, ROW_PEAKED, ROW_BF16, ROW_WIDE};
    int bad = 0, cases = 0;
    for (int v = 0; v < 4; v++)
        for (int k = 0; k < 4; k++)
            for (int kind = 0; kind < 4; kind++) {
                if (quick() && Vs[v] > 1000 && kind > 0)
                    continue;
                int n = Vs[v] > 1000 ? (quick() ? 2 : 64) : 37;
                bad += logprobs_case(n, Vs[v], ks[k], kinds[kind]);
                cases++;
            }
    print_message("logprobs: %d cases, %d mismatches\n", cases, bad);
    assert_int_equal(bad, 0);
}

/* k_cuda_logits_add equals the CPU op, bit for bit: logits and biases on a 1/1024 grid, so
 * that sums of several edits of one logit (in any order) are exact; -inf masks included. */
static void test_logits_add(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(404);
    const int Vs[] = {512, 1000, 128256};
    for (int v = 0; v < 3; v++) {
        int V = Vs[v], rows = 9, n = 3000;
        size_t cells = (size_t)rows * V;
        float *want = xmalloc(cells * sizeof(float)), *got = xmalloc(cells * sizeof(float));
        for (size_t i = 0; i < cells; i++)
            want[i] = roundf(rnd(-20, 20) * 1024) / 1024;
        LogitEdit *edits = xmalloc((size_t)n * sizeof *edits);
        for (int i = 0; i < n; i++) {
            int dup = i > 0 && rng_next() % 4 == 0; /* a second edit of an earlier logit */
            LogitEdit prev = dup ? edits[rng_next() % (uint64_t)i] : (LogitEdit){0};
            edits[i] = (LogitEdit){
                .row = dup ? prev.row : (int32_t)(rng_next() % (uint64_t)rows),
                .token = dup ? prev.token : (int32_t)(rng_next() % (uint64_t)V),
                .add = rng_next() % 10 == 0 ? -INFINITY : roundf(rnd(-100, 100) * 1024) / 1024};
        }
        float *d_logits;
        LogitEdit *d_edits;
        CUDA_CHECK(cudaMalloc((void **)&d_logits, cells * sizeof(float)));
        CUDA_CHECK(cudaMalloc((void **)&d_edits, (size_t)n * sizeof *edits));
        CUDA_CHECK(cudaMemcpy(d_logits, want, cells * sizeof(float), cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(d_edits, edits, (size_t)n * sizeof *edits, cudaMemcpyHostToDevice));
        test_cpu_ops()->logits_add(test_cpu_ops(), want, V, edits, n);
        k_cuda_logits_add(d_logits, V, d_edits, n, NULL);
        CUDA_CHECK(cudaMemcpy(got, d_logits, cells * sizeof(float), cudaMemcpyDeviceToHost));
        size_t bad = 0;
        for (size_t i = 0; i < cells; i++)
            if (memcmp(&got[i], &want[i], sizeof(float)) && bad++ < 5)
                print_error("V %d: logit %zu: %g, want %g\n", V, i, (double)got[i],
                            (double)want[i]);
        CUDA_CHECK(cudaFree(d_logits));
        CUDA_CHECK(cudaFree(d_edits));
        free(want);
        free(got);
        free(edits);
        assert_int_equal(bad, 0);
    }
}

/* The mask kernel gives the CPU op's rows bit for bit: random masks (all-ones, all-zero and
 * mixed words), rows in any order, vocabularies with a partial last word. */
static void test_logits_mask(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(405);
    const int Vs[] = {70, 1000, 128256};
    for (int v = 0; v < 3; v++) {
        int V = Vs[v], rows = 7, n = 5, words = (V + 31) / 32;
        size_t cells = (size_t)rows * V;
        float *want = xmalloc(cells * sizeof(float)), *got = xmalloc(cells * sizeof(float));
        for (size_t i = 0; i < cells; i++)
            want[i] = rnd(-20, 20);
        uint32_t *masks = xmalloc((size_t)n * words * sizeof *masks);
        for (int i = 0; i < n * words; i++) {
            uint64_t kind = rng_next() % 4;
            masks[i] = kind == 0 ? 0u : kind == 1 ? 0xffffffffu : (uint32_t)rng_next();
        }
        int32_t idx[5] = {6, 0, 3, 2, 5};
        float *d_logits;
        uint32_t *d_masks;
        int32_t *d_rows;
        CUDA_CHECK(cudaMalloc((void **)&d_logits, cells * sizeof(float)));
        CUDA_CHECK(cudaMalloc((void **)&d_masks, (size_t)n * words * sizeof *masks));
        CUDA_CHECK(cudaMalloc((void **)&d_rows, sizeof idx));
        CUDA_CHECK(cudaMemcpy(d_logits, want, cells * sizeof(float), cudaMemcpyHostToDevice));
        CUDA_CHECK(
            cudaMemcpy(d_masks, masks, (size_t)n * words * sizeof *masks, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(d_rows, idx, sizeof idx, cudaMemcpyHostToDevice));
        test_cpu_ops()->logits_mask(test_cpu_ops(), want, V, masks, idx, n);
        k_cuda_logits_mask(d_logits, V, d_masks, d_rows, n, NULL);
        CUDA_CHECK(cudaMemcpy(got, d_logits, cells * sizeof(float), cudaMemcpyDeviceToHost));
        size_t bad = 0, masked = 0;
        for (size_t i = 0; i < cells; i++) {
            masked += isinf(want[i]);
            if (memcmp(&got[i], &want[i], sizeof(float)) && bad++ < 5)
                print_error("V %d: logit %zu: %g, want %g\n", V, i, (double)got[i],
                            (double)want[i]);
        }
        CUDA_CHECK(cudaFree(d_logits));
        CUDA_CHECK(cudaFree(d_masks));
        CUDA_CHECK(cudaFree(d_rows));
        free(want);
        free(got);
        free(masks);
        assert_int_equal(bad, 0);
        assert_true(masked > 0);
    }
}

/* ---------------- timing ---------------- */

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

enum { TIME_REPS = 20 };

/* Median device time (us) of one k_cuda_sample call (logprobs when lp_k >= 0). */
static float time_sample(const Batch *b, DevBatch *d, int flags, int lp_k, cudaEvent_t e0,
                         cudaEvent_t e1) {
    k_cuda_memcpy(d->logits, b->logits, sizeof(float) * (size_t)b->n * b->V);
    float *lse = k_cuda_malloc(sizeof(float) * b->n);
    int32_t *ids = k_cuda_malloc(sizeof(int32_t) * b->n * 20);
    float *lp = k_cuda_malloc(sizeof(float) * b->n * 20);
    float t[TIME_REPS];
    for (int r = -3; r < TIME_REPS; r++) {
        CUDA_CHECK(cudaEventRecord(e0, NULL));
        if (lp_k >= 0)
            k_cuda_logprobs(lse, ids, lp, d->logits, b->n, b->V, lp_k, NULL);
        else
            k_cuda_sample(d->tokens, d->token_logits, d->logits, b->n, b->V, d->rows, d->hist,
                          flags, d->ws, d->ws_bytes, NULL);
        CUDA_CHECK(cudaEventRecord(e1, NULL));
        CUDA_CHECK(cudaEventSynchronize(e1));
        if (r >= 0)
            CUDA_CHECK(cudaEventElapsedTime(&t[r], e0, e1));
    }
    k_cuda_free(lse);
    k_cuda_free(ids);
    k_cuda_free(lp);
    qsort(t, TIME_REPS, sizeof t[0], cmp_float);
    return 500.0f * (t[TIME_REPS / 2 - 1] + t[TIME_REPS / 2]);
}

/* PAGELLM_SAMPLE_TIMING=ROWSxVOCAB: temperature-only rows (the exponential race) of that shape
 * alone, peaked rows (the race's cost does not depend on the logits), at temperature 1 (no
 * division) and 0.7 through the argmax kernel, and at temperature 1 through the general one (a
 * race row batched with top-p rows). */
static void time_race_only(const char *spec, cudaEvent_t e0, cudaEvent_t e1) {
    int n = 0, V = 0;
    char end = 0;
    if (sscanf(spec, "%dx%d%c", &n, &V, &end) != 2 || n < 1 || n > 4096 || V < 1 ||
        (double)n * V > 1.5e9 / sizeof(float))
        fail_msg("PAGELLM_SAMPLE_TIMING=%s: expected ROWSxVOCAB (e.g. 256x128256), rows 1-4096, "
                 "at most 1.5 GB of logits",
                 spec);
    const struct {
        const char *name;
        float temp;
        int flags;
    } cases[] = {
        {"race T 1, flags ARGMAX_ONLY | NO_PENALTIES", 1.0f,
         KC_SAMPLE_ARGMAX_ONLY | KC_SAMPLE_NO_PENALTIES},
        {"race T 0.7, flags ARGMAX_ONLY | NO_PENALTIES", 0.7f,
         KC_SAMPLE_ARGMAX_ONLY | KC_SAMPLE_NO_PENALTIES},
        {"race T 1, general kernel (flags NO_PENALTIES)", 1.0f, KC_SAMPLE_NO_PENALTIES},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        SamplingParams g = sampling_params_default();
        g.temperature = cases[c].temp;
        Batch b = make_batch(n, V, ROW_PEAKED, &g);
        DevBatch d = upload_batch(&b);
        float us = time_sample(&b, &d, cases[c].flags, -1, e0, e1);
        double pass_us = (double)n * V * 4 / 4.2e12 * 1e6;
        print_message("timing: n %d V %d %-48s %8.1f us per call (%.2f ns per token, %.1f row "
                      "reads)\n",
                      n, V, cases[c].name, (double)us, us * 1e3 / ((double)n * V), us / pass_us);
        free_dev(&d);
        free_batch(&b);
    }
}

/* Not a check: n = 256 rows of vocab 128256 (128 MB of logits; one read is 31 us at
 * 4.2 TB/s), peaked rows (ROW_PEAKED) unless said otherwise; then the first six cases (the
 * decode step's critical path) at n = 1 and 8. PAGELLM_SAMPLE_TIMING=ROWSxVOCAB times the race
 * at that shape instead (time_race_only). */
static void test_sample_timing(void **state) {
    (void)state;
    REQUIRE_GPU();
    if (quick())
        return;
    rng_seed(404);
    const int V = 128256;
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    const char *only = getenv("PAGELLM_SAMPLE_TIMING");
    if (only && *only) {
        time_race_only(only, e0, e1);
        CUDA_CHECK(cudaEventDestroy(e0));
        CUDA_CHECK(cudaEventDestroy(e1));
        return;
    }
    struct {
        const char *name;
        int kind, flags, lp_k;
        SamplingParams p;
    } cases[12];
    for (int c = 0; c < 12; c++) {
        cases[c].kind = ROW_PEAKED;
        cases[c].flags = KC_SAMPLE_NO_PENALTIES;
        cases[c].lp_k = -1;
        cases[c].p = sampling_params_default();
    }
    cases[0].name = "greedy, flags ARGMAX_ONLY | NO_PENALTIES";
    cases[0].flags |= KC_SAMPLE_ARGMAX_ONLY;
    cases[1].name = "greedy, general path (flags 0)";
    cases[1].flags = 0;
    cases[2].name = "temperature 1 (race), flags ARGMAX_ONLY | NO_PENALTIES";
    cases[2].flags |= KC_SAMPLE_ARGMAX_ONLY;
    cases[2].p.temperature = 1.0f;
    cases[3].name = "top-p 0.9, temperature 0.8";
    cases[3].p.temperature = 0.8f;
    cases[3].p.top_p = 0.9f;
    cases[4].name = "top-k 50 + top-p 0.95 + min-p 0.05";
    cases[4].p.temperature = 1.0f;
    cases[4].p.top_k = 50;
    cases[4].p.top_p = 0.95f;
    cases[4].p.min_p = 0.05f;
    cases[5].name = "temperature 1 on flat U(-2, 2) rows (as the dummy 8B's), general kernel";
    cases[5].kind = ROW_FLAT;
    cases[5].p.temperature = 1.0f;
    cases[6].name = "top-p 0.9 on flat U(-2, 2) rows (nucleus ~100k)";
    cases[6].kind = ROW_FLAT;
    cases[6].p.temperature = 1.0f;
    cases[6].p.top_p = 0.9f;
    cases[7].name = "top-p 0.9 + penalties (rep 1.1, freq 0.2, ~50 history tokens)";
    cases[7].flags = 0;
    cases[7].p.temperature = 1.0f;
    cases[7].p.top_p = 0.9f;
    cases[7].p.repetition_penalty = 1.1f;
    cases[7].p.frequency_penalty = 0.2f;
    cases[8].name = "logprobs k 20";
    cases[8].lp_k = 20;
    cases[9].name = "logprobs k 0 (lse only)";
    cases[9].lp_k = 0;
    cases[10].name = "temperature 1 on wide U(-60, 60) rows";
    cases[10].kind = ROW_WIDE;
    cases[10].p.temperature = 1.0f;
    cases[11].name = "logprobs k 5";
    cases[11].lp_k = 5;
    const int ns[3] = {256, 1, 8}, ncases[3] = {12, 6, 6};
    for (int ni = 0; ni < 3; ni++)
        for (int c = 0; c < ncases[ni]; c++) {
            int n = ns[ni];
            double pass_us = (double)n * V * 4 / 4.2e12 * 1e6;
            Batch b = make_batch(n, V, cases[c].kind, &cases[c].p);
            DevBatch d = upload_batch(&b);
            float us = time_sample(&b, &d, cases[c].flags, cases[c].lp_k, e0, e1);
            print_message("timing: n %3d V %d %-62s %8.1f us (%.1f row reads)\n", n, V,
                          cases[c].name, (double)us, us / pass_us);
            free_dev(&d);
            free_batch(&b);
        }
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
}

#endif /* PAGELLM_HAVE_CUDA */

/* ---------------- the race's arithmetic (no GPU needed) ---------------- */

/* kernels/cuda/sample.cu computes the race's E and x / T by rewritten formulas that it shows give
 * the bits of the plain ones (see its race section); the identities are checked here in the
 * host's IEEE arithmetic (binary32 and binary64, round to nearest, as the GPU's __fmul_rn,
 * __fmaf_rn, __ll2float_rn, __dmul_rn, __double2float_rn and __fdiv_rn), with log2f standing in
 * for the GPU's lg2.approx (the identities hold for any logarithm, provided it never sees a
 * subnormal argument, where lg2.approx.ftz and __logf's lg2.approx differ; that is counted). */
#define RACE_LN2 0x1.62e430p-1f

static float race_lg2(float x, long *subnormal) {
    *subnormal += x != 0.0f && fabsf(x) < 0x1p-126f;
    return log2f(x);
}

/* E from the hash h (m = h >> 11) as race_score forms it: one signed conversion, one fma. */
static float race_e_new(uint64_t h, long *subnormal) {
    uint64_t m = h >> 11;
    int series = (uint32_t)(h >> 32) < (1u << 27);
    long long n = series ? (long long)m : (long long)m - (1ll << 53);
    float u = fabsf((float)n) * 0x1p-53f, s = u * u;
    float e =
        series ? fmaf(s, 0.5f, u) + (s * u) * (1.0f / 3.0f) : race_lg2(u, subnormal) * -RACE_LN2;
    race_lg2(e, subnormal); /* the score's logarithm */
    return e;
}

/* E as the plain formula: k_random_exponential_of's series, or -__logf(w) = -(lg2(w) LN2). */
static float race_e_old(uint64_t m, long *subnormal) {
    if (m < (1ull << 48))
        return k_random_exponential_of(m);
    return -(race_lg2((float)((1ull << 53) - m) * 0x1p-53f, subnormal) * RACE_LN2);
}

/* x / t as race_value and race_fix form it. */
static float race_div(float x, float t) {
    float v = (float)((double)x * (1.0 / (double)t));
    if (fabsf(v) < 0x1p-126f && x != 0.0f)
        v = x / t;
    return v;
}

static uint64_t race_rng(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int same_bits(float a, float b) {
    return memcmp(&a, &b, sizeof a) == 0;
}

static void test_race_arithmetic(void **state) {
    (void)state;
    uint64_t st = 606;
    long subnormal = 0, bad = 0, checked = 0;
    /* E: every m below 2^20, 2^20 m on each side of 2^48 and below 2^53, 11 2^20 random m of every
     * magnitude; the 11 low bits of h, below m, are random */
    for (long j = 0; j < (11l << 20) + (4l << 20); j++) {
        uint64_t r = race_rng(&st), m;
        long k = j & ((1l << 20) - 1);
        switch (j >> 20) {
            case 0:
                m = (uint64_t)k;
                break;
            case 1:
                m = (1ull << 48) - 1 - (uint64_t)k;
                break;
            case 2:
                m = (1ull << 48) + (uint64_t)k;
                break;
            case 3:
                m = (1ull << 53) - 1 - (uint64_t)k;
                break;
            default:
                m = (r >> 11) >> (race_rng(&st) % 54);
        }
        float a = race_e_old(m, &subnormal), b = race_e_new(m << 11 | (r & 2047), &subnormal);
        checked++;
        if (!same_bits(a, b) && bad++ < 5)
            print_error("race E: m %llu: plain %a, rewritten %a\n", (unsigned long long)m,
                        (double)a, (double)b);
    }
    /* x / T: random floats of every magnitude, and tiny ones whose quotient is subnormal */
    const float temps[] = {0.7f, 1.3f, 98.0f, 1e-5f, 100.0f, 0.1f, 3.0f, 0x1.fffffep0f};
    for (int ti = 0; ti < 8; ti++)
        for (long j = 0; j < (1l << 20); j++) {
            uint64_t r = race_rng(&st);
            float x, t = temps[ti];
            uint32_t u = (uint32_t)r;
            memcpy(&x, &u, sizeof x);
            if (j & 1)
                x = ldexpf((float)(r >> 40) * 0x1p-24f, -120 - (int)((r >> 32) % 36)) * t;
            if (isnan(x))
                continue;
            checked++;
            if (!same_bits(race_div(x, t), x / t) && bad++ < 5)
                print_error("race x / T: %a / %a: %a, want %a\n", (double)x, (double)t,
                            (double)race_div(x, t), (double)(x / t));
        }
    /* the product alone misrounds an exact subnormal midpoint: x / 98 = 0x1.8p-149 */
    float x = 0x1.26p-142f;
    assert_false(same_bits((float)((double)x * (1.0 / 98.0)), x / 98.0f));
    assert_true(same_bits(race_div(x, 98.0f), x / 98.0f));
    print_message("race arithmetic: %ld values, %ld differ, %ld subnormal logarithm arguments\n",
                  checked, bad, subnormal);
    assert_int_equal(bad, 0);
    assert_int_equal(subnormal, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_race_arithmetic), SAMPLE_TESTS(UNIT)};
    RUN_CUDA_TESTS(tests);
}
