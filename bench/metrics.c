/* metrics.c - vLLM's calculate_metrics over the request outcomes: totals, throughputs,
 * goodput against --goodput SLOs, peak output throughput (tokens per one-second bucket from
 * the first send), peak concurrency, and mean / median / std / percentiles of TTFT, TPOT
 * (per request: (E2EL - TTFT) / (output tokens - 1), only when more than one token), ITL
 * (every gap of every request) and E2EL, in milliseconds. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench_internal.h"

typedef struct {
    double *v;
    int n, cap;
} Vec;

static void push(Vec *a, double x) {
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 64;
        a->v = pl_xrealloc(a->v, (size_t)a->cap * sizeof *a->v);
    }
    a->v[a->n++] = x;
}

static void dist(const Vec *a, const BenchServeOptions *opt, BenchDist *d) {
    d->mean = bst_mean(a->v, a->n) * 1000;
    d->median = bst_median(a->v, a->n) * 1000;
    d->std = bst_std(a->v, a->n) * 1000;
    for (int i = 0; i < opt->num_percentiles; i++)
        d->pct[i] = bst_percentile(a->v, a->n, opt->percentiles[i]) * 1000;
}

typedef struct {
    double t;
    int delta;
} Edge;

static int cmp_edge(const void *a, const void *b) {
    const Edge *x = a, *y = b;
    if (x->t != y->t)
        return x->t < y->t ? -1 : 1;
    return x->delta - y->delta; /* a departure before an arrival at the same instant */
}

/* Most text chunks in one second (buckets from the first send) and the most requests in
 * flight at once, over the successful requests. */
static void peaks(const BenchOutcome *o, int n, BenchMetrics *m) {
    double t_min = INFINITY, t_max = -INFINITY;
    int ok = 0;
    for (int i = 0; i < n; i++)
        if (o[i].success) {
            ok++;
            t_min = fmin(t_min, o[i].start_time);
            t_max = fmax(t_max, o[i].start_time + o[i].latency);
        }
    if (!ok)
        return;
    int buckets = (int)ceil(t_max - t_min) + 1;
    double *per_s = pl_xcalloc((size_t)buckets, sizeof *per_s);
    Edge *edges = pl_xmalloc((size_t)ok * 2 * sizeof *edges);
    int ne = 0;
    for (int i = 0; i < n; i++) {
        if (!o[i].success)
            continue;
        double t = o[i].start_time + o[i].ttft;
        for (int k = 0; k <= o[i].num_itl; k++) {
            if (k > 0)
                t += o[i].itl[k - 1];
            int b = (int)(t - t_min);
            if (b >= 0 && b < buckets)
                per_s[b] += 1;
        }
        edges[ne++] = (Edge){o[i].start_time, +1};
        edges[ne++] = (Edge){o[i].start_time + o[i].latency, -1};
    }
    for (int b = 0; b < buckets; b++)
        m->max_output_tokens_per_s = fmax(m->max_output_tokens_per_s, per_s[b]);
    qsort(edges, (size_t)ne, sizeof *edges, cmp_edge);
    int cur = 0;
    for (int k = 0; k < ne; k++) {
        cur += edges[k].delta;
        if (cur > m->max_concurrent_requests)
            m->max_concurrent_requests = cur;
    }
    free(per_s);
    free(edges);
}

void bench_metrics_compute(const BenchOutcome *o, int n, double duration,
                           const BenchServeOptions *opt, BenchMetrics *m) {
    memset(m, 0, sizeof *m);
    m->duration = duration;
    m->output_lens = pl_xcalloc((size_t)(n > 0 ? n : 1), sizeof *m->output_lens);
    Vec ttft = {0}, tpot = {0}, itl = {0}, e2el = {0};
    int good = 0;
    for (int i = 0; i < n; i++) {
        if (!o[i].success) {
            m->failed++;
            continue;
        }
        int out = o[i].output_len;
        m->output_lens[i] = out;
        m->total_output += out;
        m->total_input += o[i].prompt_len;
        double t = 0; /* a request of one token has TPOT 0 for goodput, none in the stats */
        if (out > 1) {
            t = (o[i].latency - o[i].ttft) / (out - 1);
            push(&tpot, t);
        }
        for (int k = 0; k < o[i].num_itl; k++)
            push(&itl, o[i].itl[k]);
        push(&ttft, o[i].ttft);
        push(&e2el, o[i].latency);
        m->completed++;
        const double *slo = opt->goodput_ms;
        if ((slo[BENCH_TTFT] < 0 || slo[BENCH_TTFT] / 1000 >= o[i].ttft) &&
            (slo[BENCH_TPOT] < 0 || slo[BENCH_TPOT] / 1000 >= t) &&
            (slo[BENCH_E2EL] < 0 || slo[BENCH_E2EL] / 1000 >= o[i].latency))
            good++;
    }
    double d = duration > 0 ? duration : 1e-9;
    m->request_throughput = m->completed / d;
    m->request_goodput = good / d;
    m->output_throughput = m->total_output / d;
    m->total_token_throughput = (m->total_input + m->total_output) / d;
    dist(&ttft, opt, &m->dist[BENCH_TTFT]);
    dist(&tpot, opt, &m->dist[BENCH_TPOT]);
    dist(&itl, opt, &m->dist[BENCH_ITL]);
    dist(&e2el, opt, &m->dist[BENCH_E2EL]);
    peaks(o, n, m);
    free(ttft.v);
    free(tpot.v);
    free(itl.v);
    free(e2el.v);
}

void bench_metrics_free(BenchMetrics *m) {
    free(m->output_lens);
    m->output_lens = NULL;
}
