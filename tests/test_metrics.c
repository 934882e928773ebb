/* test_metrics.c - the /metrics exposition text (server/metrics.c).
 *
 * Every test renders and reads the text back with a strict little parser of the Prometheus
 * 0.0.4 text format written here: each line is `# HELP`, `# TYPE` or a sample
 * `name{label="value",...} value`, names and label names valid, label values with only the
 * three legal escapes, HELP and TYPE once per family and before its samples, a family's
 * samples contiguous, every sample labelled with the model name. Then the values: engine
 * gauges (cache usage, waste, hit rate), counters, histograms (vLLM's bucket lists,
 * cumulative and monotone counts, +Inf == _count, _sum), label escaping, the C locale, and
 * exact counts after 4 threads x 10k observations raced against a scraping thread. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <ctype.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"

/* ---- a strict parser of the text format ----------------------------------------------- */

#define MAX_LABELS 4

typedef struct {
    char name[64];
    char value[256]; /* unescaped */
} Label;

typedef struct {
    char name[128];
    Label labels[MAX_LABELS];
    int num_labels;
    double value;
    int family;
} Sample;

typedef struct {
    char name[128];
    char type[16];
    char help[256];
    int num_help, num_type;
    int num_samples;
    int closed; /* samples of another family came after this one's */
} Family;

typedef struct {
    Sample *samples;
    int num_samples;
    Family families[64];
    int num_families;
} Parsed;

static int is_name_start(int c, int colon) {
    return isalpha(c) || c == '_' || (colon && c == ':');
}

static int is_name_char(int c, int colon) {
    return isalnum(c) || c == '_' || (colon && c == ':');
}

/* Reads a metric name (colon = 1) or label name at *p into out; NULL if not one. */
static const char *read_name(const char *p, char *out, size_t cap, int colon) {
    size_t n = 0;
    if (!is_name_start((unsigned char)*p, colon))
        return NULL;
    while (is_name_char((unsigned char)*p, colon)) {
        if (n + 1 >= cap)
            return NULL;
        out[n++] = *p++;
    }
    out[n] = 0;
    return p;
}

static int valid_metric_name(const char *s) {
    char buf[128];
    const char *end = read_name(s, buf, sizeof buf, 1);
    return end && *end == 0;
}

static int parse_value(const char *s, double *v) {
    if (strcmp(s, "+Inf") == 0) {
        *v = INFINITY;
        return 1;
    }
    if (strcmp(s, "-Inf") == 0) {
        *v = -INFINITY;
        return 1;
    }
    if (strcmp(s, "NaN") == 0) {
        *v = NAN;
        return 1;
    }
    char *end;
    if (!*s || isspace((unsigned char)*s))
        return 0;
    *v = strtod(s, &end);
    return *end == 0 && !isnan(*v) && !isinf(*v);
}

static Family *family_named(Parsed *P, const char *name) {
    for (int i = 0; i < P->num_families; i++)
        if (strcmp(P->families[i].name, name) == 0)
            return &P->families[i];
    return NULL;
}

static Family *family_add(Parsed *P, const char *name, int line) {
    Family *f = family_named(P, name);
    if (f)
        return f;
    if (P->num_families == 64)
        fail_msg("line %d: too many families", line);
    f = &P->families[P->num_families++];
    memset(f, 0, sizeof *f);
    snprintf(f->name, sizeof f->name, "%s", name);
    return f;
}

/* The family a sample belongs to: its own name for counters and gauges, the name less
 * _bucket / _sum / _count for histograms. */
static Family *family_of_sample(Parsed *P, const char *name) {
    Family *f = family_named(P, name);
    if (f && strcmp(f->type, "histogram") != 0)
        return f;
    static const char *const suffixes[] = {"_bucket", "_sum", "_count"};
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(name), k = strlen(suffixes[i]);
        if (n > k && strcmp(name + n - k, suffixes[i]) == 0) {
            char base[128];
            snprintf(base, sizeof base, "%.*s", (int)(n - k), name);
            f = family_named(P, base);
            if (f && strcmp(f->type, "histogram") == 0)
                return f;
        }
    }
    return NULL;
}

static void parse_comment(Parsed *P, const char *line, int ln) {
    int help = strncmp(line, "# HELP ", 7) == 0, type = strncmp(line, "# TYPE ", 7) == 0;
    if (!help && !type)
        fail_msg("line %d: comment that is neither HELP nor TYPE: %s", ln, line);
    char name[128];
    const char *p = read_name(line + 7, name, sizeof name, 1);
    if (!p || *p != ' ')
        fail_msg("line %d: bad family name: %s", ln, line);
    p++;
    Family *f = family_add(P, name, ln);
    if (f->num_samples)
        fail_msg("line %d: %s after samples of %s", ln, help ? "HELP" : "TYPE", name);
    if (help) {
        f->num_help++;
        if (!*p)
            fail_msg("line %d: empty HELP", ln);
        snprintf(f->help, sizeof f->help, "%s", p);
        for (const char *q = p; *q; q++) /* only \\ and \n escapes */
            if (*q == '\\' && (q[1] == '\\' || q[1] == 'n'))
                q++;
            else if (*q == '\\')
                fail_msg("line %d: bad escape in HELP", ln);
    } else {
        f->num_type++;
        if (strcmp(p, "counter") && strcmp(p, "gauge") && strcmp(p, "histogram"))
            fail_msg("line %d: unexpected type '%s'", ln, p);
        snprintf(f->type, sizeof f->type, "%s", p);
    }
}

static void parse_sample(Parsed *P, const char *line, int ln, const char *model) {
    Sample s;
    memset(&s, 0, sizeof s);
    const char *p = read_name(line, s.name, sizeof s.name, 1);
    if (!p || *p != '{')
        fail_msg("line %d: bad sample name or no labels: %s", ln, line);
    p++;
    while (*p != '}') {
        if (s.num_labels == MAX_LABELS)
            fail_msg("line %d: too many labels", ln);
        Label *l = &s.labels[s.num_labels++];
        p = read_name(p, l->name, sizeof l->name, 0);
        if (!p || p[0] != '=' || p[1] != '"')
            fail_msg("line %d: bad label: %s", ln, line);
        p += 2;
        size_t n = 0;
        for (; *p != '"'; p++) {
            if (!*p)
                fail_msg("line %d: unterminated label value", ln);
            char c = *p;
            if (c == '\\') {
                p++;
                c = *p == 'n' ? '\n' : *p == '\\' ? '\\' : *p == '"' ? '"' : 0;
                if (!c)
                    fail_msg("line %d: bad escape in label value", ln);
            }
            if (n + 1 >= sizeof l->value)
                fail_msg("line %d: label value too long", ln);
            l->value[n++] = c;
        }
        l->value[n] = 0;
        p++;
        for (int i = 0; i < s.num_labels - 1; i++)
            if (strcmp(s.labels[i].name, l->name) == 0)
                fail_msg("line %d: label %s twice", ln, l->name);
        if (*p == ',')
            p++;
        else if (*p != '}')
            fail_msg("line %d: expected , or } after a label: %s", ln, line);
    }
    if (p[1] != ' ')
        fail_msg("line %d: no single space before the value: %s", ln, line);
    if (!parse_value(p + 2, &s.value))
        fail_msg("line %d: bad value '%s'", ln, p + 2);

    Family *f = family_of_sample(P, s.name);
    if (!f || !f->num_type || !f->num_help)
        fail_msg("line %d: sample %s without HELP and TYPE before it", ln, s.name);
    if (f->closed)
        fail_msg("line %d: samples of %s are not contiguous", ln, f->name);
    s.family = (int)(f - P->families);
    for (int i = 0; i < P->num_families; i++) /* every other family with samples is done */
        if (&P->families[i] != f && P->families[i].num_samples)
            P->families[i].closed = 1;
    f->num_samples++;
    if (s.num_labels < 1 || strcmp(s.labels[0].name, "model_name") != 0 ||
        strcmp(s.labels[0].value, model) != 0)
        fail_msg("line %d: first label is not model_name=\"%s\": %s", ln, model, line);
    P->samples = realloc(P->samples, (size_t)(P->num_samples + 1) * sizeof *P->samples);
    P->samples[P->num_samples++] = s;
}

/* Parse all of `text`, failing the test on the first malformed line. */
static void parse(const char *text, const char *model, Parsed *P) {
    memset(P, 0, sizeof *P);
    size_t len = strlen(text);
    assert_true(len > 0);
    assert_int_equal(text[len - 1], '\n');
    int ln = 0;
    for (const char *line = text; *line;) {
        const char *nl = strchr(line, '\n');
        char buf[1024];
        ln++;
        if (nl - line >= (long)sizeof buf)
            fail_msg("line %d too long", ln);
        memcpy(buf, line, (size_t)(nl - line));
        buf[nl - line] = 0;
        if (!buf[0])
            fail_msg("line %d is empty", ln);
        if (buf[0] == '#')
            parse_comment(P, buf, ln);
        else
            parse_sample(P, buf, ln, model);
        line = nl + 1;
    }
    for (int i = 0; i < P->num_families; i++) {
        Family *f = &P->families[i];
        if (f->num_help != 1 || f->num_type != 1)
            fail_msg("family %s: %d HELP and %d TYPE lines", f->name, f->num_help, f->num_type);
        if (!strcmp(f->type, "counter") &&
            (strlen(f->name) < 6 || strcmp(f->name + strlen(f->name) - 6, "_total")))
            fail_msg("counter %s does not end in _total", f->name);
    }
}

static void parsed_free(Parsed *P) {
    free(P->samples);
}

static const char *label(const Sample *s, const char *name) {
    for (int i = 0; i < s->num_labels; i++)
        if (strcmp(s->labels[i].name, name) == 0)
            return s->labels[i].value;
    return NULL;
}

/* The one sample called `name` (with label_name=label_value when label_name is set, and no
 * label besides model_name and that one). */
static double value_of(const Parsed *P, const char *name, const char *label_name,
                       const char *label_value) {
    const Sample *found = NULL;
    for (int i = 0; i < P->num_samples; i++) {
        const Sample *s = &P->samples[i];
        if (strcmp(s->name, name) != 0 || s->num_labels != (label_name ? 2 : 1))
            continue;
        if (label_name) {
            const char *v = label(s, label_name);
            if (!v || strcmp(v, label_value) != 0)
                continue;
        }
        if (found)
            fail_msg("two samples %s", name);
        found = s;
    }
    if (!found)
        fail_msg("no sample %s{%s=\"%s\"}", name, label_name ? label_name : "",
                 label_value ? label_value : "");
    return found->value;
}

static int has_sample(const Parsed *P, const char *name, const char *label_name,
                      const char *label_value) {
    for (int i = 0; i < P->num_samples; i++) {
        const Sample *s = &P->samples[i];
        const char *v = label_name ? label(s, label_name) : "";
        if (strcmp(s->name, name) == 0 && v && strcmp(v, label_value ? label_value : "") == 0)
            return 1;
    }
    return 0;
}

static const char *type_of(Parsed *P, const char *family) {
    Family *f = family_named(P, family);
    if (!f) {
        fail_msg("no family %s", family);
        return "";
    }
    return f->type;
}

static void assert_near(double got, double want, const char *what) {
    if (fabs(got - want) > 1e-12 * fmax(1, fabs(want)))
        fail_msg("%s = %.17g, want %.17g", what, got, want);
}

/* ---- histograms ----------------------------------------------------------------------- */

static const double TTFT[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                              1,     2.5,   5,    7.5,  10,   20,   40,   80,  160,  640, 2560};
static const double TPOT[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                              0.75, 1,     2.5,  5,     7.5, 10,   20,  40,  80};
static const double LATENCY[] = {0.3, 0.5, 0.8, 1,  1.5, 2,   2.5, 5,   10,   15,  20,
                                 30,  40,  50,  60, 120, 240, 480, 960, 1920, 7680};
static const double TOKENS[] = {1,   2,    5,    10,   20,    50,    100,   200,
                                500, 1000, 2000, 5000, 10000, 20000, 50000, 100000};
#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))

typedef struct {
    int num_buckets;
    double le[32];
    double cum[32];
    double sum, count;
} HistView;

/* Check the structure of histogram `family` (bucket bounds exactly `bounds`, then +Inf;
 * counts cumulative; +Inf == _count) and return its numbers. */
static HistView check_histogram(Parsed *P, const char *family, const double *bounds, int nb) {
    HistView h;
    memset(&h, 0, sizeof h);
    assert_string_equal(type_of(P, family), "histogram");
    char bucket[160], sum[160], count[160];
    snprintf(bucket, sizeof bucket, "%s_bucket", family);
    snprintf(sum, sizeof sum, "%s_sum", family);
    snprintf(count, sizeof count, "%s_count", family);
    for (int i = 0; i < P->num_samples; i++) {
        const Sample *s = &P->samples[i];
        if (strcmp(s->name, bucket) != 0)
            continue;
        const char *le = label(s, "le");
        if (!le || s->num_labels != 2)
            fail_msg("%s without le", bucket);
        assert_true(h.num_buckets < 32);
        if (!parse_value(le, &h.le[h.num_buckets]))
            fail_msg("%s: bad le '%s'", family, le);
        h.cum[h.num_buckets++] = s->value;
    }
    if (h.num_buckets != nb + 1)
        fail_msg("%s: %d buckets, want %d", family, h.num_buckets, nb + 1);
    for (int i = 0; i < h.num_buckets; i++) {
        double want = i < nb ? bounds[i] : INFINITY;
        if (h.le[i] != want)
            fail_msg("%s: bucket %d le=%.17g, want %.17g", family, i, h.le[i], want);
        if (i && !(h.le[i] > h.le[i - 1]))
            fail_msg("%s: le not increasing", family);
        if (h.cum[i] < 0 || h.cum[i] != floor(h.cum[i]))
            fail_msg("%s: bucket count %.17g", family, h.cum[i]);
        if (i && h.cum[i] < h.cum[i - 1])
            fail_msg("%s: bucket counts not cumulative (%.17g after %.17g)", family, h.cum[i],
                     h.cum[i - 1]);
    }
    h.sum = value_of(P, sum, NULL, NULL);
    h.count = value_of(P, count, NULL, NULL);
    if (h.cum[nb] != h.count)
        fail_msg("%s: +Inf bucket %.17g != _count %.17g", family, h.cum[nb], h.count);
    return h;
}

/* Cumulative count of the bucket with upper bound `le` (which must exist). */
static double cum_at(const HistView *h, double le) {
    for (int i = 0; i < h->num_buckets; i++)
        if (h->le[i] == le)
            return h->cum[i];
    fail_msg("no bucket le=%g", le);
    return -1;
}

/* ---- fixtures ------------------------------------------------------------------------- */

static EngineStats sample_stats(void) {
    EngineStats s;
    memset(&s, 0, sizeof s);
    s.num_requests_running = 3;
    s.num_requests_waiting = 5;
    s.num_requests_swapped = 1;
    s.sched.preempt_swap = 4;
    s.sched.preempt_recompute = 3;
    s.sched.prompt_tokens = 1234;
    s.generated_tokens = 567;
    s.overlapped_steps = 345;
    s.sched.cached_prompt_tokens = 64;
    s.blocks.prefix_queries = 200;
    s.blocks.prefix_hits = 50;
    s.blocks.swapped_out = 11;
    s.blocks.swapped_in = 9;
    s.num_gpu_blocks = 100;
    s.free_gpu_blocks = 25;
    s.num_cpu_blocks = 40;
    s.free_cpu_blocks = 30;
    s.kv_slots_allocated = 160;
    s.kv_slots_used = 120;
    return s;
}

#define P_ "pagellm:"

/* Every family the server promises, with its type. */
static const char *const FAMILIES[][2] = {
    {P_ "num_requests_running", "gauge"},
    {P_ "num_requests_waiting", "gauge"},
    {P_ "num_requests_swapped", "gauge"},
    {P_ "gpu_cache_usage_perc", "gauge"},
    {P_ "cpu_cache_usage_perc", "gauge"},
    {P_ "num_gpu_blocks", "gauge"},
    {P_ "num_free_gpu_blocks", "gauge"},
    {P_ "num_cpu_blocks", "gauge"},
    {P_ "num_free_cpu_blocks", "gauge"},
    {P_ "kv_cache_waste_perc", "gauge"},
    {P_ "num_preemptions_total", "counter"},
    {P_ "num_preemptions_by_kind_total", "counter"},
    {P_ "swapped_out_blocks_total", "counter"},
    {P_ "swapped_in_blocks_total", "counter"},
    {P_ "overlapped_steps_total", "counter"},
    {P_ "prompt_tokens_total", "counter"},
    {P_ "generation_tokens_total", "counter"},
    {P_ "prefix_cache_queries_total", "counter"},
    {P_ "prefix_cache_hits_total", "counter"},
    {P_ "gpu_prefix_cache_hit_rate", "gauge"},
    {P_ "request_success_total", "counter"},
    {P_ "request_prompt_tokens", "histogram"},
    {P_ "request_generation_tokens", "histogram"},
    {P_ "time_to_first_token_seconds", "histogram"},
    {P_ "time_per_output_token_seconds", "histogram"},
    {P_ "e2e_request_latency_seconds", "histogram"},
    {P_ "request_queue_time_seconds", "histogram"},
    {P_ "http_requests_total", "counter"},
};

static void check_families(Parsed *P) {
    assert_int_equal(P->num_families, N(FAMILIES));
    for (int i = 0; i < N(FAMILIES); i++)
        if (strcmp(type_of(P, FAMILIES[i][0]), FAMILIES[i][1]) != 0)
            fail_msg("%s has type %s, want %s", FAMILIES[i][0], type_of(P, FAMILIES[i][0]),
                     FAMILIES[i][1]);
    for (int i = 0; i < P->num_samples; i++)
        assert_true(valid_metric_name(P->samples[i].name));
}

/* ---- tests ---------------------------------------------------------------------------- */

static void test_render_values(void **state) {
    Metrics *m = met_create("stories260K");
    /* Two finished requests and an aborted one that never got a token. */
    MetRequestTimes a = {.queue_seconds = 0.2,
                         .ttft_seconds = 0.1, /* on a bucket bound: counted in le="0.1" */
                         .e2e_seconds = 1.5,
                         .prompt_tokens = 7,
                         .generation_tokens = 16,
                         .finish_reason = "length"};
    MetRequestTimes b = {.queue_seconds = 3.0,
                         .ttft_seconds = 3.5,
                         .e2e_seconds = 12.0,
                         .prompt_tokens = 300,
                         .generation_tokens = 2,
                         .finish_reason = "stop"};
    MetRequestTimes c = {.queue_seconds = 9000, /* past the last bound: only in +Inf */
                         .ttft_seconds = -1,    /* no token: not observed */
                         .e2e_seconds = 9000,
                         .prompt_tokens = 150000,
                         .generation_tokens = 0,
                         .finish_reason = "abort"};
    met_request_done(m, &a);
    met_request_done(m, &b);
    met_request_done(m, &c);
    const double itl[] = {0.01, 0.02, 0.03, 0.2, 100};
    for (int i = 0; i < N(itl); i++)
        met_observe_itl(m, itl[i]);
    met_observe_itl(m, NAN); /* skipped */
    for (int i = 0; i < 3; i++)
        met_http_request(m, 200);
    met_http_request(m, 404);
    met_http_request(m, 418); /* not in the table: its class */
    met_http_request(m, 99);  /* nonsense: other */

    EngineStats st = sample_stats();
    char *text = met_render(m, &st);
    if (getenv("PL_TEST_VERBOSE"))
        fputs(text, stderr);
    Parsed P;
    parse(text, "stories260K", &P);
    check_families(&P);

    assert_near(value_of(&P, P_ "num_requests_running", NULL, NULL), 3, "running");
    assert_near(value_of(&P, P_ "num_requests_waiting", NULL, NULL), 5, "waiting");
    assert_near(value_of(&P, P_ "num_requests_swapped", NULL, NULL), 1, "swapped");
    assert_near(value_of(&P, P_ "gpu_cache_usage_perc", NULL, NULL), 0.75, "gpu usage");
    assert_near(value_of(&P, P_ "cpu_cache_usage_perc", NULL, NULL), 0.25, "cpu usage");
    assert_near(value_of(&P, P_ "kv_cache_waste_perc", NULL, NULL), 0.25, "waste");
    assert_near(value_of(&P, P_ "num_gpu_blocks", NULL, NULL), 100, "gpu blocks");
    assert_near(value_of(&P, P_ "num_free_gpu_blocks", NULL, NULL), 25, "free gpu blocks");
    assert_near(value_of(&P, P_ "num_cpu_blocks", NULL, NULL), 40, "cpu blocks");
    assert_near(value_of(&P, P_ "num_free_cpu_blocks", NULL, NULL), 30, "free cpu blocks");
    assert_near(value_of(&P, P_ "num_preemptions_total", NULL, NULL), 7, "preemptions");
    assert_near(value_of(&P, P_ "num_preemptions_by_kind_total", "kind", "swap"), 4, "swap");
    assert_near(value_of(&P, P_ "num_preemptions_by_kind_total", "kind", "recompute"), 3,
                "recompute");
    assert_near(value_of(&P, P_ "swapped_out_blocks_total", NULL, NULL), 11, "out");
    assert_near(value_of(&P, P_ "swapped_in_blocks_total", NULL, NULL), 9, "in");
    assert_near(value_of(&P, P_ "overlapped_steps_total", NULL, NULL), 345, "overlapped");
    assert_near(value_of(&P, P_ "prompt_tokens_total", NULL, NULL), 1234, "prompt");
    assert_near(value_of(&P, P_ "generation_tokens_total", NULL, NULL), 567, "generation");
    assert_near(value_of(&P, P_ "prefix_cache_queries_total", NULL, NULL), 200, "queries");
    assert_near(value_of(&P, P_ "prefix_cache_hits_total", NULL, NULL), 50, "hits");
    assert_near(value_of(&P, P_ "gpu_prefix_cache_hit_rate", NULL, NULL), 0.25, "hit rate");

    const char *fr = "finished_reason";
    assert_near(value_of(&P, P_ "request_success_total", fr, "stop"), 1, "stop");
    assert_near(value_of(&P, P_ "request_success_total", fr, "length"), 1, "length");
    assert_near(value_of(&P, P_ "request_success_total", fr, "abort"), 1, "abort");
    assert_false(has_sample(&P, P_ "request_success_total", fr, "other"));

    HistView h = check_histogram(&P, P_ "time_to_first_token_seconds", TTFT, N(TTFT));
    assert_near(h.count, 2, "ttft count");
    assert_near(h.sum, 3.6, "ttft sum");
    assert_near(cum_at(&h, 0.08), 0, "ttft le 0.08");
    assert_near(cum_at(&h, 0.1), 1, "ttft le 0.1");
    assert_near(cum_at(&h, 2.5), 1, "ttft le 2.5");
    assert_near(cum_at(&h, 5), 2, "ttft le 5");

    h = check_histogram(&P, P_ "time_per_output_token_seconds", TPOT, N(TPOT));
    assert_near(h.count, 5, "tpot count");
    assert_near(h.sum, 100.26, "tpot sum");
    assert_near(cum_at(&h, 0.01), 1, "tpot le 0.01");
    assert_near(cum_at(&h, 0.025), 2, "tpot le 0.025");
    assert_near(cum_at(&h, 0.05), 3, "tpot le 0.05");
    assert_near(cum_at(&h, 0.2), 4, "tpot le 0.2");
    assert_near(cum_at(&h, 80), 4, "tpot le 80");

    h = check_histogram(&P, P_ "request_queue_time_seconds", LATENCY, N(LATENCY));
    assert_near(h.count, 3, "queue count");
    assert_near(h.sum, 9003.2, "queue sum");
    assert_near(cum_at(&h, 0.3), 1, "queue le 0.3");
    assert_near(cum_at(&h, 5), 2, "queue le 5");
    assert_near(cum_at(&h, 7680), 2, "queue le 7680");

    h = check_histogram(&P, P_ "e2e_request_latency_seconds", LATENCY, N(LATENCY));
    assert_near(h.count, 3, "e2e count");
    assert_near(h.sum, 9013.5, "e2e sum");
    assert_near(cum_at(&h, 1.5), 1, "e2e le 1.5");
    assert_near(cum_at(&h, 15), 2, "e2e le 15");

    h = check_histogram(&P, P_ "request_prompt_tokens", TOKENS, N(TOKENS));
    assert_near(h.count, 3, "prompt count");
    assert_near(h.sum, 150307, "prompt sum");
    assert_near(cum_at(&h, 5), 0, "prompt le 5");
    assert_near(cum_at(&h, 10), 1, "prompt le 10");
    assert_near(cum_at(&h, 500), 2, "prompt le 500");
    assert_near(cum_at(&h, 100000), 2, "prompt le 100000");

    h = check_histogram(&P, P_ "request_generation_tokens", TOKENS, N(TOKENS));
    assert_near(h.count, 3, "generation count");
    assert_near(h.sum, 18, "generation sum");
    assert_near(cum_at(&h, 1), 1, "generation le 1"); /* the 0 */
    assert_near(cum_at(&h, 2), 2, "generation le 2");
    assert_near(cum_at(&h, 20), 3, "generation le 20");

    assert_near(value_of(&P, P_ "http_requests_total", "status", "200"), 3, "200");
    assert_near(value_of(&P, P_ "http_requests_total", "status", "404"), 1, "404");
    assert_near(value_of(&P, P_ "http_requests_total", "status", "4xx"), 1, "4xx");
    assert_near(value_of(&P, P_ "http_requests_total", "status", "other"), 1, "other");
    assert_false(has_sample(&P, P_ "http_requests_total", "status", "500"));

    /* le spelled as vLLM's (Python) client does, so exact-match queries carry over. */
    assert_non_null(strstr(text, "pagellm:time_to_first_token_seconds_bucket{model_name="
                                 "\"stories260K\",le=\"0.001\"} 0\n"));
    assert_non_null(strstr(text, "_bucket{model_name=\"stories260K\",le=\"1.0\"}"));
    assert_non_null(strstr(text, "_bucket{model_name=\"stories260K\",le=\"2560.0\"}"));
    assert_non_null(strstr(text, "_bucket{model_name=\"stories260K\",le=\"100000.0\"}"));
    assert_non_null(strstr(text, "_bucket{model_name=\"stories260K\",le=\"+Inf\"}"));
    /* Shortest round-trip floats: 0.75, not 0.75000000000000000 or 7.5e-01. */
    assert_non_null(strstr(text, "pagellm:gpu_cache_usage_perc{model_name=\"stories260K\"} "
                                 "0.75\n"));
    assert_non_null(strstr(text, "\npagellm:num_requests_running{model_name=\"stories260K\"} 3\n"));
    assert_non_null(strstr(text, "# TYPE pagellm:time_to_first_token_seconds histogram\n"));

    parsed_free(&P);
    free(text);
    met_destroy(m);
}

/* Nothing observed, no engine yet: every family still there, every value 0, no division by
 * zero in the ratios. */
static void test_render_empty(void **state) {
    Metrics *m = met_create("m");
    char *text = met_render(m, NULL);
    Parsed P;
    parse(text, "m", &P);
    check_families(&P);
    const char *zeros[] = {P_ "num_requests_running",       P_ "gpu_cache_usage_perc",
                           P_ "cpu_cache_usage_perc",       P_ "kv_cache_waste_perc",
                           P_ "num_preemptions_total",      P_ "prompt_tokens_total",
                           P_ "prefix_cache_queries_total", P_ "gpu_prefix_cache_hit_rate"};
    for (int i = 0; i < N(zeros); i++)
        assert_near(value_of(&P, zeros[i], NULL, NULL), 0, zeros[i]);
    HistView h = check_histogram(&P, P_ "e2e_request_latency_seconds", LATENCY, N(LATENCY));
    assert_near(h.count, 0, "count");
    assert_near(h.sum, 0, "sum");
    assert_near(value_of(&P, P_ "request_success_total", "finished_reason", "stop"), 0, "stop");
    assert_int_equal(family_named(&P, P_ "http_requests_total")->num_samples, 0);
    parsed_free(&P);
    free(text);

    /* Pools of zero blocks and nothing allocated, with free counts inconsistent. */
    EngineStats s;
    memset(&s, 0, sizeof s);
    s.free_gpu_blocks = 3;
    s.kv_slots_used = 5;
    text = met_render(m, &s);
    parse(text, "m", &P);
    assert_near(value_of(&P, P_ "gpu_cache_usage_perc", NULL, NULL), 0, "gpu usage");
    assert_near(value_of(&P, P_ "kv_cache_waste_perc", NULL, NULL), 0, "waste");
    parsed_free(&P);
    free(text);

    /* A full pool and every block a hit. */
    s = sample_stats();
    s.free_gpu_blocks = 0;
    s.blocks.prefix_hits = s.blocks.prefix_queries;
    s.kv_slots_used = s.kv_slots_allocated;
    text = met_render(m, &s);
    parse(text, "m", &P);
    assert_near(value_of(&P, P_ "gpu_cache_usage_perc", NULL, NULL), 1, "gpu usage");
    assert_near(value_of(&P, P_ "gpu_prefix_cache_hit_rate", NULL, NULL), 1, "hit rate");
    assert_near(value_of(&P, P_ "kv_cache_waste_perc", NULL, NULL), 0, "waste");
    parsed_free(&P);
    free(text);

    met_destroy(m);
    met_destroy(NULL);
}

static void test_unknown_finish_reason(void **state) {
    Metrics *m = met_create("m");
    MetRequestTimes t = {.queue_seconds = NAN, .ttft_seconds = NAN, .e2e_seconds = NAN};
    met_request_done(m, &t); /* NULL reason, NaN times: only counts and token histograms */
    t.finish_reason = "weird\"reason";
    met_request_done(m, &t);
    char *text = met_render(m, NULL);
    Parsed P;
    parse(text, "m", &P);
    assert_near(value_of(&P, P_ "request_success_total", "finished_reason", "other"), 2, "other");
    HistView h = check_histogram(&P, P_ "request_queue_time_seconds", LATENCY, N(LATENCY));
    assert_near(h.count, 0, "queue count");
    h = check_histogram(&P, P_ "e2e_request_latency_seconds", LATENCY, N(LATENCY));
    assert_near(h.count, 0, "e2e count");
    h = check_histogram(&P, P_ "request_prompt_tokens", TOKENS, N(TOKENS));
    assert_near(h.count, 2, "prompt count");
    assert_near(cum_at(&h, 1), 2, "prompt le 1");
    parsed_free(&P);
    free(text);
    met_destroy(m);
}

/* A model name with a backslash, quotes and a newline is escaped in every sample, and reads
 * back unchanged. */
static void test_label_escaping(void **state) {
    const char *name = "org\\my \"model\"\nv2";
    Metrics *m = met_create(name);
    met_http_request(m, 200);
    EngineStats st = sample_stats();
    char *text = met_render(m, &st);
    Parsed P;
    parse(text, name, &P); /* checks every sample's model_name reads back as `name` */
    assert_true(P.num_samples > 100);
    assert_non_null(strstr(text, "{model_name=\"org\\\\my \\\"model\\\"\\nv2\""));
    assert_null(strstr(text, "model\"\n"));
    parsed_free(&P);
    free(text);
    met_destroy(m);

    m = met_create(NULL); /* "" */
    text = met_render(m, NULL);
    parse(text, "", &P);
    assert_non_null(strstr(text, "{model_name=\"\"}"));
    parsed_free(&P);
    free(text);
    met_destroy(m);
}

/* A locale whose decimal point is a comma: an installed one, else one compiled with
 * localedef into a temporary folder (only LC_NUMERIC defined) and found through LOCPATH.
 * Returns its name, or NULL; *tmpdir gets the folder to remove ("" if none). */
static const char *set_comma_locale(char tmpdir[64]) {
    static const char *const installed[] = {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8",
                                            "fr_FR.utf8"};
    tmpdir[0] = 0;
    for (int i = 0; i < N(installed); i++)
        if (setlocale(LC_NUMERIC, installed[i]))
            return installed[i];
    snprintf(tmpdir, 64, "/tmp/pagellm_locale_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        tmpdir[0] = 0;
        return NULL;
    }
    char path[128], cmd[512];
    snprintf(path, sizeof path, "%s/comma.src", tmpdir);
    FILE *f = fopen(path, "w");
    if (!f)
        return NULL;
    fputs("LC_NUMERIC\ndecimal_point \",\"\nthousands_sep \".\"\ngrouping 3;3\n"
          "END LC_NUMERIC\n",
          f);
    fclose(f);
    /* -c: write it although the other categories are missing (exit status 1, ignored). */
    snprintf(cmd, sizeof cmd, "localedef -c -i %s -f ISO-8859-1 %s/xx_XX >/dev/null 2>&1", path,
             tmpdir);
    if (system(cmd) == -1)
        return NULL;
    setenv("LOCPATH", tmpdir, 1);
    return setlocale(LC_NUMERIC, "xx_XX") ? "xx_XX" : NULL;
}

static void unset_comma_locale(const char *tmpdir) {
    setlocale(LC_NUMERIC, "C");
    unsetenv("LOCPATH");
    if (tmpdir[0]) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
        assert_int_equal(system(cmd), 0);
    }
}

/* Numbers come out in the C locale even when the process uses a decimal comma. */
static void test_locale(void **state) {
    char tmpdir[64];
    const char *used = set_comma_locale(tmpdir);
    char probe[16];
    snprintf(probe, sizeof probe, "%.2f", 0.5);
    if (!used || strcmp(probe, "0,50") != 0) {
        unset_comma_locale(tmpdir);
        skip(); /* neither an installed comma locale nor localedef */
        return;
    }
    Metrics *m = met_create("m");
    met_observe_itl(m, 0.125);
    EngineStats st = sample_stats();
    char *text = met_render(m, &st);
    unset_comma_locale(tmpdir);
    if (getenv("PL_TEST_VERBOSE"))
        fprintf(stderr, "  rendered under LC_NUMERIC=%s\n", used);
    Parsed P;
    parse(text, "m", &P);
    assert_near(value_of(&P, P_ "gpu_cache_usage_perc", NULL, NULL), 0.75, "gpu usage");
    assert_near(value_of(&P, P_ "time_per_output_token_seconds_sum", NULL, NULL), 0.125, "sum");
    assert_non_null(strstr(text, "le=\"0.025\""));
    assert_null(strstr(text, "0,"));
    parsed_free(&P);
    free(text);
    met_destroy(m);
}

/* ---- concurrency ---------------------------------------------------------------------- */

#define THREADS    4
#define PER_THREAD 10000

static int observers_done; /* atomically incremented */

static void *observer(void *arg) {
    Metrics *m = arg;
    for (int i = 0; i < PER_THREAD; i++) {
        /* Dyadic values: sums are exact whatever the order of the additions. */
        met_observe_itl(m, i % 2 ? 0.5 : 0.25);
        MetRequestTimes t = {.queue_seconds = 0.25,
                             .ttft_seconds = 0.5,
                             .e2e_seconds = 2.0,
                             .prompt_tokens = 3,
                             .generation_tokens = 100,
                             .finish_reason = i % 4 == 0 ? "stop" : "length"};
        met_request_done(m, &t);
        met_http_request(m, i % 10 == 0 ? 503 : 200);
    }
    __atomic_add_fetch(&observers_done, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

/* 4 threads observe while this one scrapes (cmocka asserts only from the test's thread):
 * every histogram is self-consistent in every scrape, and the final counts are exact. */
static void test_concurrent_observations(void **state) {
    Metrics *m = met_create("m");
    pthread_t th[THREADS];
    observers_done = 0;
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, observer, m), 0);
    EngineStats st = sample_stats();
    int scrapes = 0;
    while (__atomic_load_n(&observers_done, __ATOMIC_SEQ_CST) < THREADS) {
        char *text = met_render(m, &st);
        Parsed P;
        parse(text, "m", &P);
        HistView h = check_histogram(&P, P_ "time_per_output_token_seconds", TPOT, N(TPOT));
        HistView e = check_histogram(&P, P_ "e2e_request_latency_seconds", LATENCY, N(LATENCY));
        assert_true(e.sum == 2.0 * e.count);
        assert_true(h.sum >= 0.25 * h.count && h.sum <= 0.5 * h.count);
        assert_true(value_of(&P, P_ "request_success_total", "finished_reason", "stop") +
                        value_of(&P, P_ "request_success_total", "finished_reason", "length") ==
                    e.count);
        parsed_free(&P);
        free(text);
        scrapes++;
    }
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);

    const double n = THREADS * PER_THREAD;
    char *text = met_render(m, NULL);
    Parsed P;
    parse(text, "m", &P);
    HistView h = check_histogram(&P, P_ "time_per_output_token_seconds", TPOT, N(TPOT));
    assert_true(h.count == n);
    assert_true(h.sum == n / 2 * 0.25 + n / 2 * 0.5);
    assert_true(cum_at(&h, 0.2) == 0);
    assert_true(cum_at(&h, 0.3) == n / 2);
    assert_true(cum_at(&h, 0.5) == n);
    h = check_histogram(&P, P_ "time_to_first_token_seconds", TTFT, N(TTFT));
    assert_true(h.count == n && h.sum == n * 0.5 && cum_at(&h, 0.25) == 0);
    h = check_histogram(&P, P_ "request_queue_time_seconds", LATENCY, N(LATENCY));
    assert_true(h.count == n && h.sum == n * 0.25 && cum_at(&h, 0.3) == n);
    h = check_histogram(&P, P_ "e2e_request_latency_seconds", LATENCY, N(LATENCY));
    assert_true(h.count == n && h.sum == n * 2 && cum_at(&h, 1.5) == 0 && cum_at(&h, 2) == n);
    h = check_histogram(&P, P_ "request_generation_tokens", TOKENS, N(TOKENS));
    assert_true(h.count == n && h.sum == n * 100 && cum_at(&h, 50) == 0);
    h = check_histogram(&P, P_ "request_prompt_tokens", TOKENS, N(TOKENS));
    assert_true(h.count == n && h.sum == n * 3);
    assert_true(value_of(&P, P_ "request_success_total", "finished_reason", "stop") == n / 4);
    assert_true(value_of(&P, P_ "request_success_total", "finished_reason", "length") == n * 3 / 4);
    assert_true(value_of(&P, P_ "http_requests_total", "status", "503") == n / 10);
    assert_true(value_of(&P, P_ "http_requests_total", "status", "200") == n * 9 / 10);
    if (getenv("PL_TEST_VERBOSE"))
        fprintf(stderr, "  %d scrapes during the run\n", scrapes);
    parsed_free(&P);
    free(text);
    met_destroy(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_render_values),
        cmocka_unit_test(test_render_empty),
        cmocka_unit_test(test_unknown_finish_reason),
        cmocka_unit_test(test_label_escaping),
        cmocka_unit_test(test_locale),
        cmocka_unit_test(test_concurrent_observations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
