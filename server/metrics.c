/* metrics.c - Prometheus text exposition (format 0.0.4) of pagellm's metrics.
 *
 * Observations land in fixed arrays under one mutex: a histogram keeps one (non-cumulative)
 * count per bucket plus the overflow (+Inf) bucket, its sum and its count; labelled
 * counters are small fixed tables, so nothing is allocated after met_create. met_render
 * copies those arrays under the lock and formats the copy afterwards, making buckets, _sum
 * and _count of a histogram agree with each other at every scrape.
 *
 * Output rules (https://prometheus.io/docs/instrumenting/exposition_formats/):
 *   # HELP <family> <text, with \ and newline escaped>
 *   # TYPE <family> counter|gauge|histogram
 *   <name>{model_name="<value, with \ " and newline escaped>",...} <value>
 * A counter family is named with its _total suffix (as Python's prometheus_client writes
 * 0.0.4); a histogram's samples are <family>_bucket{le=...} (cumulative, ending with +Inf),
 * <family>_sum and <family>_count. Floats print as the shortest text that reads back to the
 * same double, in the C locale; le values look like Python's ("1.0", "0.25", "+Inf") so the
 * label values match vLLM's exactly. */
#include <inttypes.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"

#define PREFIX "pagellm:"

/* ---- histogram definitions (vLLM's buckets) ------------------------------------------- */

static const double TTFT_BUCKETS[] = {0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
                                      0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
                                      20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
static const double TPOT_BUCKETS[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                      0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
static const double LATENCY_BUCKETS[] = {0.3,  0.5,   0.8,   1.0,   1.5,   2.0,    2.5,
                                         5.0,  10.0,  15.0,  20.0,  30.0,  40.0,   50.0,
                                         60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
static const double TOKEN_BUCKETS[] = {1,   2,    5,    10,   20,    50,    100,   200,
                                       500, 1000, 2000, 5000, 10000, 20000, 50000, 100000};

#define COUNT_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define MAX_BUCKETS 24

typedef struct {
    const char *name; /* without prefix */
    const char *help;
    const double *bounds;
    int num_bounds;
} HistDef;

enum { H_PROMPT_TOKENS, H_GENERATION_TOKENS, H_TTFT, H_TPOT, H_E2E, H_QUEUE, NUM_HISTS };

static const HistDef HISTS[NUM_HISTS] = {
    [H_PROMPT_TOKENS] = {"request_prompt_tokens", "Number of prefill tokens processed.",
                         TOKEN_BUCKETS, COUNT_OF(TOKEN_BUCKETS)},
    [H_GENERATION_TOKENS] = {"request_generation_tokens", "Number of generation tokens processed.",
                             TOKEN_BUCKETS, COUNT_OF(TOKEN_BUCKETS)},
    [H_TTFT] = {"time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                TTFT_BUCKETS, COUNT_OF(TTFT_BUCKETS)},
    [H_TPOT] = {"time_per_output_token_seconds", "Histogram of time per output token in seconds.",
                TPOT_BUCKETS, COUNT_OF(TPOT_BUCKETS)},
    [H_E2E] = {"e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
               LATENCY_BUCKETS, COUNT_OF(LATENCY_BUCKETS)},
    [H_QUEUE] = {"request_queue_time_seconds",
                 "Histogram of time spent in WAITING phase for request.", LATENCY_BUCKETS,
                 COUNT_OF(LATENCY_BUCKETS)},
};

typedef struct {
    uint64_t buckets[MAX_BUCKETS + 1]; /* [num_bounds] is the overflow (+Inf only) bucket */
    uint64_t count;
    double sum;
} Hist;

/* ---- labelled counters ---------------------------------------------------------------- */

static const char *const FINISH_REASONS[] = {"stop", "length", "abort", "other"};
#define NUM_REASONS  COUNT_OF(FINISH_REASONS)
#define REASON_OTHER (NUM_REASONS - 1)

static const int HTTP_CODES[] = {200, 400, 401, 403, 404, 405, 408,
                                 413, 422, 429, 500, 501, 503, 504};
#define NUM_HTTP_CODES COUNT_OF(HTTP_CODES)
/* Slots: the codes above, then classes 1xx..5xx, then "other". */
#define HTTP_CLASS_SLOT(c) (NUM_HTTP_CODES + (c)-1)
#define HTTP_OTHER_SLOT    (NUM_HTTP_CODES + 5)
#define NUM_HTTP_SLOTS     (NUM_HTTP_CODES + 6)

typedef struct {
    Hist hists[NUM_HISTS];
    uint64_t success[NUM_REASONS];
    uint64_t http[NUM_HTTP_SLOTS];
} Observed;

struct Metrics {
    pthread_mutex_t mu;
    Observed obs;      /* under mu */
    char *model_label; /* escaped model name, ready to print between quotes */
    locale_t c_locale; /* for formatting numbers whatever the process locale */
};

/* ---- escaping ------------------------------------------------------------------------- */

/* Escape `s` for a label value (quote = 1: \ " newline) or a HELP text (quote = 0: \ and
 * newline). Returns a malloc'd string. */
static char *escape(const char *s, int quote) {
    size_t n = strlen(s);
    char *out = pl_xmalloc(2 * n + 1), *o = out;
    for (; *s; s++) {
        if (*s == '\\') {
            *o++ = '\\';
            *o++ = '\\';
        } else if (*s == '\n') {
            *o++ = '\\';
            *o++ = 'n';
        } else if (*s == '"' && quote) {
            *o++ = '\\';
            *o++ = '"';
        } else {
            *o++ = *s;
        }
    }
    *o = 0;
    return out;
}

/* ---- create / destroy ----------------------------------------------------------------- */

Metrics *met_create(const char *model_name) {
    Metrics *m = pl_xcalloc(1, sizeof *m);
    PL_CHECK(pthread_mutex_init(&m->mu, NULL) == 0);
    m->model_label = escape(model_name ? model_name : "", 1);
    m->c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0);
    if (!m->c_locale)
        pl_fatal(__FILE__, __LINE__, "newlocale(\"C\") failed");
    for (int i = 0; i < NUM_HISTS; i++)
        PL_CHECK(HISTS[i].num_bounds <= MAX_BUCKETS);
    return m;
}

void met_destroy(Metrics *m) {
    if (!m)
        return;
    pthread_mutex_destroy(&m->mu);
    freelocale(m->c_locale);
    free(m->model_label);
    free(m);
}

/* ---- observations --------------------------------------------------------------------- */

/* Index of the bucket holding v: the first bound >= v (Prometheus buckets are "le"), or
 * num_bounds (the +Inf bucket) past the last. */
static int bucket_index(const HistDef *d, double v) {
    int lo = 0, hi = d->num_bounds;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (v <= d->bounds[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* Caller holds m->mu. */
static void observe_locked(Metrics *m, int h, double v) {
    Hist *x = &m->obs.hists[h];
    x->buckets[bucket_index(&HISTS[h], v)]++;
    x->count++;
    x->sum += v;
}

static int reason_slot(const char *r) {
    for (int i = 0; r && i < REASON_OTHER; i++)
        if (strcmp(r, FINISH_REASONS[i]) == 0)
            return i;
    return REASON_OTHER;
}

void met_request_done(Metrics *m, const MetRequestTimes *t) {
    int reason = reason_slot(t->finish_reason);
    pthread_mutex_lock(&m->mu);
    if (t->queue_seconds >= 0) /* false for NaN too */
        observe_locked(m, H_QUEUE, t->queue_seconds);
    if (t->ttft_seconds >= 0)
        observe_locked(m, H_TTFT, t->ttft_seconds);
    if (!isnan(t->e2e_seconds))
        observe_locked(m, H_E2E, t->e2e_seconds);
    observe_locked(m, H_PROMPT_TOKENS, t->prompt_tokens);
    observe_locked(m, H_GENERATION_TOKENS, t->generation_tokens);
    m->obs.success[reason]++;
    pthread_mutex_unlock(&m->mu);
}

void met_observe_itl(Metrics *m, double seconds) {
    if (isnan(seconds))
        return;
    pthread_mutex_lock(&m->mu);
    observe_locked(m, H_TPOT, seconds);
    pthread_mutex_unlock(&m->mu);
}

static int http_slot(int status) {
    for (int i = 0; i < NUM_HTTP_CODES; i++)
        if (HTTP_CODES[i] == status)
            return i;
    if (status >= 100 && status <= 599)
        return HTTP_CLASS_SLOT(status / 100);
    return HTTP_OTHER_SLOT;
}

void met_http_request(Metrics *m, int status) {
    int slot = http_slot(status);
    pthread_mutex_lock(&m->mu);
    m->obs.http[slot]++;
    pthread_mutex_unlock(&m->mu);
}

/* ---- text output ---------------------------------------------------------------------- */

typedef struct {
    char *p;
    size_t len, cap;
} Buf;

static void buf_printf(Buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void buf_printf(Buf *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        PL_CHECK(n >= 0);
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        b->cap = 2 * b->cap + (size_t)n + 1;
        b->p = pl_xrealloc(b->p, b->cap);
    }
}

/* Shortest text (%g, up to 17 digits) that reads back as v; NaN and infinities spelled as
 * the exposition format wants. With python_style, an integral value gets ".0" (the le label
 * values of Python's prometheus_client, hence vLLM's). Runs under the C locale. */
static void fmt_double(char out[40], double v, int python_style) {
    if (isnan(v)) {
        strcpy(out, "NaN");
        return;
    }
    if (isinf(v)) {
        strcpy(out, v > 0 ? "+Inf" : "-Inf");
        return;
    }
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(out, 40, "%.*g", prec, v);
        if (strtod(out, NULL) == v)
            break;
    }
    if (python_style && !strpbrk(out, ".e"))
        strcat(out, ".0");
}

typedef struct {
    Buf buf;
    const char *model; /* escaped model label value */
} Out;

static void family(Out *o, const char *name, const char *type, const char *help) {
    char *h = escape(help, 0);
    buf_printf(&o->buf, "# HELP " PREFIX "%s %s\n# TYPE " PREFIX "%s %s\n", name, h, name, type);
    free(h);
}

/* One sample line; `label`/`value_escaped` add a second label when label is non-NULL. */
static void sample_text(Out *o, const char *name, const char *label, const char *label_value,
                        const char *value) {
    buf_printf(&o->buf, PREFIX "%s{model_name=\"%s\"", name, o->model);
    if (label)
        buf_printf(&o->buf, ",%s=\"%s\"", label, label_value);
    buf_printf(&o->buf, "} %s\n", value);
}

static void sample_u64(Out *o, const char *name, const char *label, const char *label_value,
                       uint64_t v) {
    char text[32];
    snprintf(text, sizeof text, "%" PRIu64, v);
    sample_text(o, name, label, label_value, text);
}

static void sample_double(Out *o, const char *name, double v) {
    char text[40];
    fmt_double(text, v, 0);
    sample_text(o, name, NULL, NULL, text);
}

static uint64_t nonneg(int64_t v) {
    return v > 0 ? (uint64_t)v : 0;
}

static void gauge_int(Out *o, const char *name, const char *help, int64_t v) {
    char text[32];
    family(o, name, "gauge", help);
    snprintf(text, sizeof text, "%" PRId64, v);
    sample_text(o, name, NULL, NULL, text);
}

static void gauge_double(Out *o, const char *name, const char *help, double v) {
    family(o, name, "gauge", help);
    sample_double(o, name, v);
}

static void counter(Out *o, const char *name, const char *help, int64_t v) {
    family(o, name, "counter", help);
    sample_u64(o, name, NULL, NULL, nonneg(v));
}

/* part / whole, 0 when whole is 0, clamped to [0, 1]. */
static double ratio(double part, double whole) {
    if (!(whole > 0))
        return 0;
    double r = part / whole;
    return r < 0 ? 0 : r > 1 ? 1 : r;
}

static void histogram(Out *o, const HistDef *d, const Hist *h) {
    char name[128], le[40];
    family(o, d->name, "histogram", d->help);
    snprintf(name, sizeof name, "%s_bucket", d->name);
    uint64_t cum = 0;
    for (int i = 0; i <= d->num_bounds; i++) {
        cum += h->buckets[i];
        if (i < d->num_bounds)
            fmt_double(le, d->bounds[i], 1);
        else
            strcpy(le, "+Inf");
        sample_u64(o, name, "le", le, cum);
    }
    snprintf(name, sizeof name, "%s_sum", d->name);
    sample_double(o, name, h->sum);
    snprintf(name, sizeof name, "%s_count", d->name);
    sample_u64(o, name, NULL, NULL, h->count);
}

static void engine_metrics(Out *o, const EngineStats *s) {
    const SchedulerCounters *c = &s->sched;
    gauge_int(o, "num_requests_running", "Number of requests in model execution batches.",
              s->num_requests_running);
    gauge_int(o, "num_requests_waiting", "Number of requests waiting to be processed.",
              s->num_requests_waiting);
    gauge_int(o, "num_requests_swapped", "Number of requests swapped to CPU.",
              s->num_requests_swapped);
    gauge_double(o, "gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.",
                 ratio((double)s->num_gpu_blocks - s->free_gpu_blocks, s->num_gpu_blocks));
    gauge_double(o, "cpu_cache_usage_perc", "CPU KV-cache usage. 1 means 100 percent usage.",
                 ratio((double)s->num_cpu_blocks - s->free_cpu_blocks, s->num_cpu_blocks));
    /* Block counts as well as the ratios: "every block free" is exact whatever the pool size
     * (free counts include cached prefix blocks nobody holds, which are reusable at once). */
    gauge_int(o, "num_gpu_blocks", "KV-cache blocks in the GPU pool.", s->num_gpu_blocks);
    gauge_int(o, "num_free_gpu_blocks",
              "Free KV-cache blocks in the GPU pool (cached prefix blocks no request holds "
              "included).",
              s->free_gpu_blocks);
    gauge_int(o, "num_cpu_blocks", "KV-cache blocks in the CPU swap pool.", s->num_cpu_blocks);
    gauge_int(o, "num_free_cpu_blocks", "Free KV-cache blocks in the CPU swap pool.",
              s->free_cpu_blocks);
    gauge_double(o, "kv_cache_waste_perc",
                 "Fraction of the KV-cache token slots held by running requests that hold no "
                 "token (partly filled blocks).",
                 ratio((double)s->kv_slots_allocated - (double)s->kv_slots_used,
                       (double)s->kv_slots_allocated));

    counter(o, "num_preemptions_total", "Cumulative number of preemption from the engine.",
            c->preempt_swap + c->preempt_recompute);
    family(o, "num_preemptions_by_kind_total", "counter",
           "Cumulative number of preemptions, by kind: swap (blocks moved to CPU) or recompute "
           "(blocks freed, prompt recomputed).");
    sample_u64(o, "num_preemptions_by_kind_total", "kind", "swap", nonneg(c->preempt_swap));
    sample_u64(o, "num_preemptions_by_kind_total", "kind", "recompute",
               nonneg(c->preempt_recompute));
    counter(o, "swapped_out_blocks_total", "KV-cache blocks copied from GPU to CPU (swap out).",
            s->blocks.swapped_out);
    counter(o, "swapped_in_blocks_total", "KV-cache blocks copied from CPU to GPU (swap in).",
            s->blocks.swapped_in);
    counter(o, "overlapped_steps_total",
            "Engine steps launched before the previous step's tokens were read (asynchronous "
            "scheduling).",
            s->overlapped_steps);
    counter(o, "prompt_tokens_total", "Number of prefill tokens processed.", c->prompt_tokens);
    counter(o, "generation_tokens_total", "Number of generation tokens processed.",
            s->generated_tokens);
    counter(o, "prefix_cache_queries_total",
            "Prefix cache queries, in terms of number of queried blocks.",
            s->blocks.prefix_queries);
    counter(o, "prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached blocks.",
            s->blocks.prefix_hits);
    gauge_double(o, "gpu_prefix_cache_hit_rate",
                 "GPU prefix cache block hit rate (hits / queries since start).",
                 ratio((double)s->blocks.prefix_hits, (double)s->blocks.prefix_queries));
}

static void observed_metrics(Out *o, const Observed *obs) {
    family(o, "request_success_total", "counter", "Count of successfully processed requests.");
    for (int i = 0; i < NUM_REASONS; i++)
        if (i != REASON_OTHER || obs->success[i])
            sample_u64(o, "request_success_total", "finished_reason", FINISH_REASONS[i],
                       obs->success[i]);
    for (int i = 0; i < NUM_HISTS; i++)
        histogram(o, &HISTS[i], &obs->hists[i]);

    family(o, "http_requests_total", "counter", "Number of HTTP responses, by status code.");
    for (int i = 0; i < NUM_HTTP_SLOTS; i++) {
        if (!obs->http[i])
            continue;
        char status[16];
        if (i < NUM_HTTP_CODES)
            snprintf(status, sizeof status, "%d", HTTP_CODES[i]);
        else if (i == HTTP_OTHER_SLOT)
            strcpy(status, "other");
        else
            snprintf(status, sizeof status, "%dxx", i - NUM_HTTP_CODES + 1);
        sample_u64(o, "http_requests_total", "status", status, obs->http[i]);
    }
}

char *met_render(Metrics *m, const EngineStats *s) {
    Observed obs;
    pthread_mutex_lock(&m->mu);
    obs = m->obs;
    pthread_mutex_unlock(&m->mu);

    EngineStats zero;
    if (!s) {
        memset(&zero, 0, sizeof zero);
        s = &zero;
    }
    locale_t old = uselocale(m->c_locale);
    Out o = {.buf = {.p = pl_xmalloc(16384), .len = 0, .cap = 16384}, .model = m->model_label};
    engine_metrics(&o, s);
    observed_metrics(&o, &obs);
    uselocale(old);
    return o.buf.p;
}
