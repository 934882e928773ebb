/* test_sampling.c - the CPU sampler (test_cpu_ops()->sample), the per-request random stream
 * and the default parameters: greedy and ties, temperature frequencies, seeding, top-k,
 * top-p, min-p, the three penalties and independence of batch rows. Everything is seeded,
 * so the statistical checks are deterministic. */
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
#include "sampling.h"

static int32_t sample1(const float *logits, int V, const SamplingParams *p, const int32_t *prompt,
                       int np, const int32_t *output, int no, float *row_out) {
    float *row = malloc(sizeof(float) * V);
    memcpy(row, logits, sizeof(float) * V);
    TestDraw rq = {p, prompt, np, output, no};
    int32_t tok = -1;
    test_sample(test_cpu_ops(), &tok, row, 1, V, &rq);
    if (row_out)
        memcpy(row_out, row, sizeof(float) * V);
    free(row);
    return tok;
}

/* Histogram of tokens drawn for `draws` seeds (batches of rows, one seed per row). */
static void histogram(const float *logits, int V, SamplingParams p, int draws, int *hist) {
    enum { BATCH = 64 };
    float *rows = malloc(sizeof(float) * (size_t)V * BATCH);
    SamplingParams ps[BATCH];
    TestDraw rq[BATCH];
    int32_t tok[BATCH];
    memset(hist, 0, sizeof(int) * V);
    for (int d0 = 0; d0 < draws; d0 += BATCH) {
        int n = draws - d0 < BATCH ? draws - d0 : BATCH;
        for (int i = 0; i < n; i++) {
            memcpy(rows + (size_t)i * V, logits, sizeof(float) * V);
            ps[i] = p;
            ps[i].seed = 1000 + (uint64_t)(d0 + i);
            rq[i] = (TestDraw){&ps[i], NULL, 0, NULL, 0};
        }
        test_sample(test_cpu_ops(), tok, rows, n, V, rq);
        for (int i = 0; i < n; i++) {
            assert_true(tok[i] >= 0 && tok[i] < V);
            hist[tok[i]]++;
        }
    }
    free(rows);
}

static void test_defaults(void **state) {
    (void)state;
    SamplingParams p = sampling_params_default();
    assert_true(p.temperature == 0.0f);
    assert_true(p.top_p == 1.0f);
    assert_int_equal(p.top_k, 0);
    assert_true(p.min_p == 0.0f);
    assert_true(p.repetition_penalty == 1.0f);
    assert_true(p.presence_penalty == 0.0f);
    assert_true(p.frequency_penalty == 0.0f);
    assert_int_equal(p.seed, 0);
}

static void test_random_uniform(void **state) {
    (void)state;
    double sum = 0;
    int distinct_first = 0;
    for (uint64_t i = 0; i < 100000; i++) {
        float u = k_random_uniform(42, i);
        assert_true(u >= 0.0f && u < 1.0f);
        sum += u;
    }
    assert_true(fabs(sum / 100000 - 0.5) < 0.005);
    for (uint64_t s = 0; s < 100; s++)
        distinct_first += k_random_uniform(s, 0) != k_random_uniform(s + 1, 0);
    assert_true(distinct_first >= 99);
    assert_true(k_random_uniform(7, 3) == k_random_uniform(7, 3));
    assert_true(k_random_uniform(7, 3) != k_random_uniform(7, 4));
}

/* k_random_exponential against Exp(1): P(E < t) = 1 - e^-t at thresholds from the series
 * branch (v < 2^-5, E < ~0.0317) to the far tail, each within 6 binomial standard deviations
 * over 2M variates (fixed seeds: no flakiness), the mean within 6 / sqrt(N), every value
 * finite and in [0, 36.8]. */
static void test_random_exponential(void **state) {
    (void)state;
    enum { STEPS = 2000, TOKENS = 1000 };
    const double t[] = {1e-3, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0};
    enum { NT = sizeof t / sizeof t[0] };
    long below[NT] = {0};
    double sum = 0;
    for (uint64_t s = 0; s < STEPS; s++) {
        uint64_t bits = k_random_bits(77, s);
        for (uint32_t j = 0; j < TOKENS; j++) {
            float e = k_random_exponential(bits, j);
            assert_true(e >= 0.0f && e <= 36.8f);
            sum += e;
            for (int k = 0; k < NT; k++)
                below[k] += e < t[k];
        }
    }
    const double n = (double)STEPS * TOKENS;
    print_message("exponential: mean %.5f over %.0f\n", sum / n, n);
    assert_true(fabs(sum / n - 1.0) < 6.0 / sqrt(n));
    for (int k = 0; k < NT; k++) {
        double p = 1.0 - exp(-t[k]), sd = sqrt(n * p * (1.0 - p));
        if (fabs((double)below[k] - n * p) >= 6.0 * sd)
            fail_msg("P(E < %g): %ld of %.0f, expected %.1f (sd %.1f)", t[k], below[k], n, n * p,
                     sd);
    }
    /* the value of the 53 bits against -log1p(-v) in double, over the series branch, its
     * edge (2^48) and the logarithm's up to the last m below 2^53 */
    const uint64_t edge[] = {1,
                             2,
                             1ull << 20,
                             (1ull << 48) - 1,
                             1ull << 48,
                             1ull << 52,
                             (1ull << 53) - (1ull << 28),
                             (1ull << 53) - 1};
    for (int k = 0; k < 8 + 4000; k++) {
        uint64_t m = k < 8 ? edge[k] : k_random_bits(3, (uint64_t)k) >> (11 + k % 40);
        double want = -log1p(-(double)m * 0x1p-53), got = k_random_exponential_of(m);
        if (!(fabs(got - want) <= 2e-5 * want))
            fail_msg("k_random_exponential_of(%llu): %.9g, -log1p(-v) %.9g", (unsigned long long)m,
                     got, want);
    }
    assert_true(k_random_exponential_of(0) == 0.0f);
    /* the token indexes the variates: neighbours differ */
    uint64_t bits = k_random_bits(5, 0);
    assert_true(k_random_exponential(bits, 1) != k_random_exponential(bits, 2));
    assert_true(k_random_exponential(bits, 1) == k_random_exponential(bits, 1));
}

static void test_greedy(void **state) {
    (void)state;
    SamplingParams p = sampling_params_default();
    float a[6] = {0.1f, 3.0f, -2.0f, 2.9f, 3.0f, 1.0f}; /* tie between 1 and 4 */
    assert_int_equal(sample1(a, 6, &p, NULL, 0, NULL, 0, NULL), 1);
    float b[4] = {-INFINITY, -5.0f, -5.0f, -INFINITY};
    assert_int_equal(sample1(b, 4, &p, NULL, 0, NULL, 0, NULL), 1);
    float c[3] = {NAN, 0.5f, 0.25f}; /* NaN is never picked */
    assert_int_equal(sample1(c, 3, &p, NULL, 0, NULL, 0, NULL), 1);
    p.temperature = 5e-6f; /* below 1e-5 counts as greedy */
    p.seed = 9;
    assert_int_equal(sample1(a, 6, &p, NULL, 0, NULL, 0, NULL), 1);

    /* several rows in one call */
    float rows[3][4] = {{0, 1, 2, 3}, {3, 2, 1, 0}, {1, 5, 5, 1}};
    SamplingParams g = sampling_params_default();
    TestDraw rq[3] = {{&g, NULL, 0, NULL, 0}, {&g, NULL, 0, NULL, 0}, {&g, NULL, 0, NULL, 0}};
    int32_t tok[3];
    test_sample(test_cpu_ops(), tok, &rows[0][0], 3, 4, rq);
    assert_int_equal(tok[0], 3);
    assert_int_equal(tok[1], 0);
    assert_int_equal(tok[2], 1);
}

/* chi-square statistic of observed counts against probabilities */
static double chi2(const int *hist, const double *prob, int V, int draws) {
    double x = 0;
    for (int i = 0; i < V; i++) {
        double e = prob[i] * draws;
        if (e > 0)
            x += (hist[i] - e) * (hist[i] - e) / e;
        else
            assert_int_equal(hist[i], 0);
    }
    return x;
}

/* Temperature alone samples by the exponential race; a min-p of 1e-30 cuts nothing but
 * sends the row through the filters and the inverse-CDF draw. Both must give softmax(x / T). */
static const char *const path_names[2] = {"race", "draw"};
static SamplingParams at_temperature(float temperature, int path, int V) {
    SamplingParams p = sampling_params_default();
    p.temperature = temperature;
    p.min_p = path ? 1e-30f : 0.0f;
    assert_int_equal(sampling_temperature_only(&p, V), !path);
    return p;
}

static void test_temperature_frequencies(void **state) {
    (void)state;
    const double prob[4] = {0.1, 0.2, 0.3, 0.4};
    float logits[4];
    for (int i = 0; i < 4; i++)
        logits[i] = (float)log(prob[i]) + 1.5f; /* an offset changes nothing */
    /* T = 0.5 squares the probabilities */
    double sq[4], z = 0;
    for (int i = 0; i < 4; i++)
        z += sq[i] = prob[i] * prob[i];
    for (int i = 0; i < 4; i++)
        sq[i] /= z;
    int hist[4], draws = 40000;
    for (int path = 0; path < 2; path++) {
        histogram(logits, 4, at_temperature(1.0f, path, 4), draws, hist);
        /* 3 degrees of freedom: P(chi2 > 16.27) = 0.001 */
        double x = chi2(hist, prob, 4, draws);
        print_message("%s T=1 counts %d %d %d %d chi2 %.2f\n", path_names[path], hist[0], hist[1],
                      hist[2], hist[3], x);
        assert_true(x < 16.27);
        histogram(logits, 4, at_temperature(0.5f, path, 4), draws, hist);
        x = chi2(hist, sq, 4, draws);
        print_message("%s T=0.5 counts %d %d %d %d chi2 %.2f\n", path_names[path], hist[0], hist[1],
                      hist[2], hist[3], x);
        assert_true(x < 16.27);
    }
}

/* The same with more than a handful of tokens (the draw's quickselect path): p_i ~ (i + 1). */
static void test_temperature_frequencies_many(void **state) {
    (void)state;
    enum { V = 40 };
    double prob[V], z = V * (V + 1) / 2.0;
    float logits[V];
    for (int i = 0; i < V; i++) {
        prob[i] = (i + 1) / z;
        logits[(i * 7) % V] = (float)log(prob[i]); /* scattered ids */
    }
    double permuted[V];
    for (int i = 0; i < V; i++)
        permuted[(i * 7) % V] = prob[i];
    int hist[V], draws = 40000;
    for (int path = 0; path < 2; path++) {
        histogram(logits, V, at_temperature(1.0f, path, V), draws, hist);
        double x = chi2(hist, permuted, V, draws);
        print_message("%s, 40 tokens: chi2 %.2f (39 dof)\n", path_names[path], x);
        assert_true(x < 72.05); /* P = 0.001 */
    }
}

static void test_seed_determinism(void **state) {
    (void)state;
    enum { V = 1000 };
    float logits[V];
    for (int i = 0; i < V; i++)
        logits[i] = 0.0f; /* uniform: every draw is informative */
    SamplingParams p = sampling_params_default();
    p.temperature = 1.0f;
    p.seed = 123;
    int32_t first = sample1(logits, V, &p, NULL, 0, NULL, 0, NULL);
    for (int r = 0; r < 5; r++)
        assert_int_equal(sample1(logits, V, &p, NULL, 0, NULL, 0, NULL), first);
    /* the output position indexes the stream: draws at different positions differ */
    int32_t out[64];
    for (int i = 0; i < 64; i++)
        out[i] = 0;
    int distinct = 0, prev = -1;
    for (int n = 0; n < 20; n++) {
        int32_t t = sample1(logits, V, &p, NULL, 0, out, n, NULL);
        distinct += t != prev;
        prev = t;
    }
    assert_true(distinct >= 18);
    /* another seed, another stream */
    int same = 0;
    for (int n = 0; n < 20; n++) {
        SamplingParams q = p;
        q.seed = 124;
        same += sample1(logits, V, &p, NULL, 0, out, n, NULL) ==
                sample1(logits, V, &q, NULL, 0, out, n, NULL);
    }
    assert_true(same <= 2);
}

static void fill_random_logits(float *x, int V, uint64_t seed) {
    for (int i = 0; i < V; i++)
        x[i] = 8.0f * (k_random_uniform(seed, (uint64_t)i) - 0.5f);
}

static void test_top_k(void **state) {
    (void)state;
    enum { V = 5000 };
    float *logits = malloc(sizeof(float) * V), *row = malloc(sizeof(float) * V);
    fill_random_logits(logits, V, 5);
    logits[77] = logits[78] = 10.0f; /* a tie at the top: id 77 wins */
    SamplingParams g = sampling_params_default();
    int32_t greedy = sample1(logits, V, &g, NULL, 0, NULL, 0, NULL);
    assert_int_equal(greedy, 77);
    SamplingParams p = sampling_params_default();
    p.temperature = 1.3f;
    p.top_k = 1;
    for (uint64_t s = 0; s < 50; s++) {
        p.seed = s;
        assert_int_equal(sample1(logits, V, &p, NULL, 0, NULL, 0, NULL), greedy);
    }
    /* top_k = 3 over a flat-ish head: exactly ids {77, 78, 500} appear */
    logits[500] = 9.5f;
    p.top_k = 3;
    p.temperature = 1.0f;
    int *hist = malloc(sizeof(int) * V);
    histogram(logits, V, p, 3000, hist);
    int others = 0;
    for (int i = 0; i < V; i++)
        if (i != 77 && i != 78 && i != 500)
            others += hist[i];
    assert_int_equal(others, 0);
    assert_true(hist[77] > 0 && hist[78] > 0 && hist[500] > 0);
    /* the row left behind has exactly k finite logits */
    p.seed = 1;
    sample1(logits, V, &p, NULL, 0, NULL, 0, row);
    int finite = 0;
    for (int i = 0; i < V; i++)
        finite += isfinite(row[i]);
    assert_int_equal(finite, 3);
    /* top_k >= vocab is off */
    p.top_k = V + 5;
    assert_true(sample1(logits, V, &p, NULL, 0, NULL, 0, NULL) >= 0);
    free(hist);
    free(logits);
    free(row);
}

/* logits for a permuted 4-token distribution 0.5 / 0.25 / 0.15 / 0.1 at ids 2, 0, 3, 1 */
static void perm_logits(float *l) {
    l[2] = logf(0.5f);
    l[0] = logf(0.25f);
    l[3] = logf(0.15f);
    l[1] = logf(0.1f);
}

static void test_top_p(void **state) {
    (void)state;
    float l[4];
    perm_logits(l);
    int hist[4];
    SamplingParams p = sampling_params_default();
    p.temperature = 1.0f;
    p.top_p = 0.7f; /* 0.5 + 0.25 = 0.75 >= 0.7: keep ids 2 and 0 */
    histogram(l, 4, p, 4000, hist);
    assert_true(hist[2] > 0 && hist[0] > 0);
    assert_int_equal(hist[1] + hist[3], 0);
    /* kept mass renormalised: 2/3 vs 1/3 */
    assert_true(fabs(hist[2] / 4000.0 - 2.0 / 3.0) < 0.03);

    p.top_p = 0.8f; /* 0.75 < 0.8, + 0.15 = 0.9: keep 2, 0, 3 */
    histogram(l, 4, p, 4000, hist);
    assert_true(hist[2] > 0 && hist[0] > 0 && hist[3] > 0);
    assert_int_equal(hist[1], 0);

    p.top_p = 0.3f; /* the top token alone already covers it */
    histogram(l, 4, p, 500, hist);
    assert_int_equal(hist[2], 500);
    p.top_p = 0.0f; /* degenerate: still keeps the top token */
    histogram(l, 4, p, 100, hist);
    assert_int_equal(hist[2], 100);
    {
        enum { BIG = 1000 }; /* same through the quickselect rounds (more than 16 tokens) */
        float lb[BIG];
        fill_random_logits(lb, BIG, 3);
        int hb[BIG];
        SamplingParams g = sampling_params_default();
        int32_t top = sample1(lb, BIG, &g, NULL, 0, NULL, 0, NULL);
        histogram(lb, BIG, p, 50, hb);
        assert_int_equal(hb[top], 50);
    }

    /* top-p over the top-k set, renormalised: top_k 3 leaves 0.5/0.9, 0.25/0.9, 0.15/0.9;
     * top_p 0.8: 0.556 + 0.278 = 0.833 >= 0.8 keeps ids 2 and 0 */
    p.top_k = 3;
    p.top_p = 0.8f;
    histogram(l, 4, p, 2000, hist);
    assert_true(hist[2] > 0 && hist[0] > 0);
    assert_int_equal(hist[1] + hist[3], 0);
}

/* top-p through the quickselect: 10 tokens of 0.08 and 90 of 0.2/90; top_p 0.75 keeps
 * exactly the 10 (0.72 after nine, 0.80 after ten). */
static void test_top_p_many(void **state) {
    (void)state;
    enum { V = 100 };
    float l[V];
    int big[V] = {0};
    for (int i = 0; i < V; i++)
        l[i] = logf(0.2f / 90.0f);
    for (int j = 0; j < 10; j++) {
        int id = (j * 37 + 11) % V;
        big[id] = 1;
        l[id] = logf(0.08f);
    }
    int hist[V];
    SamplingParams p = sampling_params_default();
    p.temperature = 1.0f;
    p.top_p = 0.75f;
    histogram(l, V, p, 2000, hist);
    for (int i = 0; i < V; i++) {
        if (big[i])
            assert_true(hist[i] > 0);
        else
            assert_int_equal(hist[i], 0);
    }
}

/* A large vocabulary: one strong token and 50000 weak ones that together hold about 4% of
 * the mass, which the draw must reach in the right proportion. */
static void test_large_vocab_tail(void **state) {
    (void)state;
    enum { V = 50001, DRAWS = 4000 };
    float *l = malloc(sizeof(float) * V);
    for (int i = 0; i < V; i++)
        l[i] = -14.0f;
    l[12345] = 0.0f;
    double tail_p = (V - 1) * exp(-14.0) / (1.0 + (V - 1) * exp(-14.0));
    int *hist = malloc(sizeof(int) * V);
    SamplingParams p = sampling_params_default();
    p.temperature = 1.0f;
    histogram(l, V, p, DRAWS, hist);
    int tail = DRAWS - hist[12345];
    double sd = sqrt(DRAWS * tail_p * (1 - tail_p));
    print_message("tail draws %d expected %.1f\n", tail, DRAWS * tail_p);
    assert_true(fabs(tail - DRAWS * tail_p) < 4 * sd);

    /* top_p 0.9 keeps only the strong token (0.958 >= 0.9) */
    p.top_p = 0.9f;
    histogram(l, V, p, 500, hist);
    assert_int_equal(hist[12345], 500);

    /* random logits: every draw lies in the top-p set computed here in double */
    fill_random_logits(l, V, 77);
    p.top_p = 0.5f;
    p.temperature = 0.7f;
    histogram(l, V, p, 300, hist);
    double z = 0;
    for (int i = 0; i < V; i++)
        z += exp((double)l[i] / 0.7);
    for (int i = 0; i < V; i++) {
        if (!hist[i])
            continue;
        /* mass strictly above token i must be < top_p for i to be kept */
        double above = 0;
        for (int j = 0; j < V; j++)
            if (l[j] > l[i] || (l[j] == l[i] && j < i))
                above += exp((double)l[j] / 0.7) / z;
        assert_true(above < 0.5 + 1e-6);
    }
    free(l);
    free(hist);
}

static void test_min_p(void **state) {
    (void)state;
    float l[4];
    l[0] = logf(0.5f);
    l[1] = logf(0.3f);
    l[2] = logf(0.15f);
    l[3] = logf(0.05f);
    int hist[4];
    SamplingParams p = sampling_params_default();
    p.temperature = 1.0f;
    p.min_p = 0.2f; /* threshold 0.1: drops id 3 only */
    histogram(l, 4, p, 4000, hist);
    assert_true(hist[0] > 0 && hist[1] > 0 && hist[2] > 0);
    assert_int_equal(hist[3], 0);
    p.min_p = 0.5f; /* threshold 0.25: keeps 0 and 1 */
    histogram(l, 4, p, 2000, hist);
    assert_true(hist[0] > 0 && hist[1] > 0);
    assert_int_equal(hist[2] + hist[3], 0);
    p.min_p = 1.0f; /* only the top token */
    histogram(l, 4, p, 300, hist);
    assert_int_equal(hist[0], 300);
}

static void test_repetition_penalty(void **state) {
    (void)state;
    SamplingParams p = sampling_params_default();
    p.repetition_penalty = 1.2f;
    float l[4] = {2.0f, 1.9f, -1.0f, -1.1f}, row[4];
    int32_t prompt[3] = {0, 0, 2};
    int32_t out[2] = {2, 0};
    /* positive logit divided, negative multiplied, once per distinct token */
    int32_t t = sample1(l, 4, &p, prompt, 3, out, 2, row);
    assert_int_equal(t, 1);
    assert_true(row[0] == 2.0f / 1.2f);
    assert_true(row[1] == 1.9f);
    assert_true(row[2] == -1.0f * 1.2f);
    assert_true(row[3] == -1.1f);
    /* output-only history counts too */
    float m[2] = {-1.0f, -1.1f};
    int32_t o1[1] = {0};
    assert_int_equal(sample1(m, 2, &p, NULL, 0, o1, 1, NULL), 1);
    /* the scratch counts were cleared: no history, no penalty */
    assert_int_equal(sample1(l, 4, &p, NULL, 0, NULL, 0, row), 0);
    assert_true(row[0] == 2.0f);
}

static void test_frequency_presence_penalty(void **state) {
    (void)state;
    float l[3] = {3.0f, 2.0f, 1.0f}, row[3];
    int32_t out[4] = {0, 0, 0, 1};
    int32_t prompt[2] = {2, 2};
    SamplingParams p = sampling_params_default();
    p.frequency_penalty = 0.5f; /* token 0: 3 - 1.5 = 1.5 < 2 - 0.5 = 1.5? tie -> id 0 */
    assert_int_equal(sample1(l, 3, &p, prompt, 2, out, 4, row), 0);
    assert_true(row[0] == 1.5f && row[1] == 1.5f && row[2] == 1.0f); /* prompt not penalised */
    p.frequency_penalty = 0.6f; /* 3 - 1.8 = 1.2 < 2 - 0.6 = 1.4 */
    assert_int_equal(sample1(l, 3, &p, prompt, 2, out, 4, NULL), 1);

    p = sampling_params_default();
    p.presence_penalty = 1.5f; /* once per distinct token: 1.5, 0.5, 1.0 */
    assert_int_equal(sample1(l, 3, &p, prompt, 2, out, 4, row), 0);
    assert_true(row[0] == 1.5f && row[1] == 0.5f && row[2] == 1.0f);
    p.presence_penalty = 2.5f; /* 0.5, -0.5, 1.0 */
    assert_int_equal(sample1(l, 3, &p, prompt, 2, out, 4, NULL), 2);

    /* all three together, vLLM order: repetition first, then frequency and presence */
    p = sampling_params_default();
    p.repetition_penalty = 2.0f;
    p.frequency_penalty = 0.25f;
    p.presence_penalty = 0.1f;
    sample1(l, 3, &p, prompt, 2, out, 4, row);
    assert_true(row[0] == 3.0f / 2.0f - 0.75f - 0.1f);
    assert_true(row[1] == 2.0f / 2.0f - 0.25f - 0.1f);
    assert_true(row[2] == 1.0f / 2.0f);
}

/* Rows with different parameters give the same tokens alone, in a batch, and in a batch
 * in another order. */
static void test_batch_rows_independent(void **state) {
    (void)state;
    enum { V = 3000, R = 8 };
    SamplingParams ps[R];
    for (int i = 0; i < R; i++) {
        ps[i] = sampling_params_default();
        ps[i].seed = 31 * (uint64_t)i + 5;
    }
    ps[1].temperature = 0.8f;
    ps[2].temperature = 1.0f, ps[2].top_k = 20;
    ps[3].temperature = 1.2f, ps[3].top_p = 0.6f;
    ps[4].temperature = 0.9f, ps[4].min_p = 0.1f;
    ps[5].temperature = 1.0f, ps[5].repetition_penalty = 1.3f, ps[5].frequency_penalty = 0.2f;
    ps[6].temperature = 1.5f, ps[6].top_k = 50, ps[6].top_p = 0.9f, ps[6].min_p = 0.05f;
    ps[7].presence_penalty = 0.7f;
    int32_t hist[R][6];
    for (int i = 0; i < R; i++)
        for (int j = 0; j < 6; j++)
            hist[i][j] = (int32_t)((i * 97 + j * 13) % V);
    float *base = malloc(sizeof(float) * V * R);
    for (int i = 0; i < R; i++)
        fill_random_logits(base + (size_t)i * V, V, 900 + (uint64_t)i);

    int32_t alone[R];
    for (int i = 0; i < R; i++)
        alone[i] = sample1(base + (size_t)i * V, V, &ps[i], hist[i], 3, hist[i] + 3, 3, NULL);

    const int orders[2][R] = {{0, 1, 2, 3, 4, 5, 6, 7}, {5, 2, 7, 0, 6, 3, 1, 4}};
    float *rows = malloc(sizeof(float) * V * R);
    for (int o = 0; o < 2; o++) {
        TestDraw rq[R];
        int32_t tok[R];
        for (int r = 0; r < R; r++) {
            int i = orders[o][r];
            memcpy(rows + (size_t)r * V, base + (size_t)i * V, sizeof(float) * V);
            rq[r] = (TestDraw){&ps[i], hist[i], 3, hist[i] + 3, 3};
        }
        test_sample(test_cpu_ops(), tok, rows, R, V, rq);
        for (int r = 0; r < R; r++)
            assert_int_equal(tok[r], alone[orders[o][r]]);
    }
    free(base);
    free(rows);
}

/* logits_mask: a masked row keeps exactly the tokens whose bit is set (vocab not a multiple
 * of 32, so the last word is partial), rows not listed are untouched, and greedy sampling then
 * picks the best allowed token. */
static void test_logits_mask(void **state) {
    (void)state;
    enum { V = 70, WORDS = (V + 31) / 32 };
    float logits[3][V];
    for (int r = 0; r < 3; r++)
        for (int t = 0; t < V; t++)
            logits[r][t] = (float)((t * 7 + r * 13) % 23) - 11.0f;
    float before[3][V];
    memcpy(before, logits, sizeof logits);
    uint32_t masks[2][WORDS] = {{0x5u, 0, 0x20u}, {0xffffffffu, 0x80000000u, 0}};
    int32_t rows[2] = {2, 0};
    const KernelOps *k = test_cpu_ops();
    k->logits_mask(k, &logits[0][0], V, &masks[0][0], rows, 2);
    for (int i = 0; i < 2; i++)
        for (int t = 0; t < V; t++) {
            int keep = masks[i][t / 32] >> (t % 32) & 1u;
            float got = logits[rows[i]][t], want = keep ? before[rows[i]][t] : -INFINITY;
            assert_memory_equal(&got, &want, sizeof got);
        }
    assert_memory_equal(logits[1], before[1], sizeof logits[1]); /* not listed */
    SamplingParams g = sampling_params_default();
    TestDraw d = {&g, NULL, 0, NULL, 0};
    int32_t tok = -1;
    test_sample(k, &tok, logits[2], 1, V, &d);
    int32_t best = before[2][0] >= before[2][2] ? 0 : 2; /* allowed: 0, 2 and 69 */
    best = before[2][69] > before[2][best] ? 69 : best;
    assert_int_equal(tok, best);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_random_uniform),
        cmocka_unit_test(test_random_exponential),
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_temperature_frequencies),
        cmocka_unit_test(test_temperature_frequencies_many),
        cmocka_unit_test(test_seed_determinism),
        cmocka_unit_test(test_top_k),
        cmocka_unit_test(test_top_p),
        cmocka_unit_test(test_top_p_many),
        cmocka_unit_test(test_large_vocab_tail),
        cmocka_unit_test(test_min_p),
        cmocka_unit_test(test_repetition_penalty),
        cmocka_unit_test(test_frequency_presence_penalty),
        cmocka_unit_test(test_batch_rows_independent),
        cmocka_unit_test(test_logits_mask),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
