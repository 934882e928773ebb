/* report.c - vLLM's "Serving Benchmark Result" block, line for line ("{:<40} {:<10.2f}"),
 * and its result JSON: the run's settings, the summary, mean/median/std/pNN of each shown
 * metric, and the per-request arrays from which every number can be recomputed. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bench_internal.h"

static const char *const keys[BENCH_NUM_METRICS] = {"ttft", "tpot", "itl", "e2el"};
static const char *const names[BENCH_NUM_METRICS] = {"TTFT", "TPOT", "ITL", "E2EL"};
static const char *const headers[BENCH_NUM_METRICS] = {"Time to First Token",
                                                       "Time per Output Token (excl. 1st token)",
                                                       "Inter-token Latency", "End-to-end Latency"};

const char *bench_metric_key(int k) {
    return keys[k];
}

/* Python's "{s:{c}^{n}}": s centred in n columns of c, the odd one on the right. */
static void centred(FILE *f, const char *s, char c, int n) {
    int len = (int)strlen(s), pad = n > len ? n - len : 0;
    for (int i = 0; i < pad / 2; i++)
        fputc(c, f);
    fputs(s, f);
    for (int i = 0; i < pad - pad / 2; i++)
        fputc(c, f);
    fputc('\n', f);
}

static void line_f(FILE *f, const char *label, double v) {
    fprintf(f, "%-40s %-10.2f\n", label, v);
}

static void line_i(FILE *f, const char *label, long v) {
    fprintf(f, "%-40s %-10ld\n", label, v);
}

const char *bench_pword(double p, char *buf, size_t size) {
    if (p == floor(p))
        snprintf(buf, size, "%d", (int)p);
    else
        bench_pyfloat(p, buf, size);
    return buf;
}

void bench_report_print(FILE *f, const BenchMetrics *m, const BenchOutcome *o, int n,
                        const BenchServeOptions *opt, double request_rate) {
    if (m->failed > 0) {
        fprintf(f, "Failed requests during benchmark run detected (capping to 10):\n");
        for (int i = 0, shown = 0; i < n && shown < 10; i++)
            if (!o[i].success)
                fprintf(f, "Error %d: %s\n", shown++, o[i].error ? o[i].error : "");
    }
    centred(f, " Serving Benchmark Result ", '=', 50);
    line_i(f, "Successful requests:", m->completed);
    line_i(f, "Failed requests:", m->failed);
    if (opt->max_concurrency > 0)
        line_i(f, "Maximum request concurrency:", opt->max_concurrency);
    if (!isinf(request_rate))
        line_f(f, "Request rate configured (RPS):", request_rate);
    line_f(f, "Benchmark duration (s):", m->duration);
    line_i(f, "Total input tokens:", m->total_input);
    line_i(f, "Total generated tokens:", m->total_output);
    line_f(f, "Request throughput (req/s):", m->request_throughput);
    int goodput = 0;
    for (int k = 0; k < BENCH_NUM_METRICS; k++)
        goodput |= opt->goodput_ms[k] >= 0;
    if (goodput)
        line_f(f, "Request goodput (req/s):", m->request_goodput);
    line_f(f, "Output token throughput (tok/s):", m->output_throughput);
    line_f(f, "Peak output token throughput (tok/s):", m->max_output_tokens_per_s);
    line_f(f, "Peak concurrent requests:", m->max_concurrent_requests);
    line_f(f, "Total token throughput (tok/s):", m->total_token_throughput);
    for (int k = 0; k < BENCH_NUM_METRICS; k++) {
        if (!opt->metrics[k])
            continue;
        const BenchDist *d = &m->dist[k];
        char label[96], p[32];
        centred(f, headers[k], '-', 50);
        snprintf(label, sizeof label, "Mean %s (ms):", names[k]);
        line_f(f, label, d->mean);
        snprintf(label, sizeof label, "Median %s (ms):", names[k]);
        line_f(f, label, d->median);
        for (int i = 0; i < opt->num_percentiles; i++) {
            snprintf(label, sizeof label,
                     "P%s %s (ms):", bench_pword(opt->percentiles[i], p, sizeof p), names[k]);
            line_f(f, label, d->pct[i]);
        }
    }
    for (int i = 0; i < 50; i++)
        fputc('=', f);
    fputc('\n', f);
    fflush(f);
}

/* A JSON string of s, invalid UTF-8 replaced (a failure reason may quote raw garbage). */
static json_t *jstr(const char *s) {
    char *v = bench_utf8_copy(s ? s : "", strlen(s ? s : ""));
    json_t *j = json_string(v);
    free(v);
    return j;
}

static json_t *real_or_null(double v) {
    return isfinite(v) ? json_real(v) : json_null();
}

json_t *bench_result_json(const BenchMetrics *m, const BenchOutcome *o, int n,
                          const BenchServeOptions *opt, const BenchRunInfo *info,
                          const char *date) {
    json_t *r = json_object();
    json_object_set_new(r, "date", json_string(date));
    json_object_set_new(r, "endpoint_type", json_string(info->backend));
    json_object_set_new(r, "backend", json_string(info->backend));
    json_object_set_new(r, "label", opt->label ? jstr(opt->label) : json_null());
    json_object_set_new(r, "model_id", jstr(info->model_id));
    json_object_set_new(r, "tokenizer_id", jstr(info->tokenizer_id));
    json_object_set_new(r, "num_prompts", json_integer(n));
    json_object_set_new(r, "request_rate",
                        isinf(info->request_rate) ? json_string("inf")
                                                  : json_real(info->request_rate));
    json_object_set_new(r, "burstiness", real_or_null(opt->burstiness));
    json_object_set_new(r, "max_concurrency",
                        opt->max_concurrency > 0 ? json_integer(opt->max_concurrency)
                                                 : json_null());
    json_object_set_new(r, "duration", json_real(m->duration));
    json_object_set_new(r, "completed", json_integer(m->completed));
    json_object_set_new(r, "failed", json_integer(m->failed));
    json_object_set_new(r, "total_input_tokens", json_integer(m->total_input));
    json_object_set_new(r, "total_output_tokens", json_integer(m->total_output));
    json_object_set_new(r, "request_throughput", json_real(m->request_throughput));
    int goodput = 0;
    for (int k = 0; k < BENCH_NUM_METRICS; k++)
        goodput |= opt->goodput_ms[k] >= 0;
    json_object_set_new(r, "request_goodput",
                        goodput ? json_real(m->request_goodput) : json_null());
    json_object_set_new(r, "output_throughput", json_real(m->output_throughput));
    json_object_set_new(r, "total_token_throughput", json_real(m->total_token_throughput));
    json_t *in = json_array(), *out = json_array(), *ttfts = json_array(), *itls = json_array(),
           *lat = json_array(), *start = json_array(), *queue = json_array(), *texts = json_array(),
           *errors = json_array();
    for (int i = 0; i < n; i++) {
        json_array_append_new(in, json_integer(o[i].prompt_len));
        json_array_append_new(out, json_integer(m->output_lens[i]));
        json_array_append_new(ttfts, json_real(o[i].ttft));
        json_t *gaps = json_array();
        for (int k = 0; k < o[i].num_itl; k++)
            json_array_append_new(gaps, json_real(o[i].itl[k]));
        json_array_append_new(itls, gaps);
        json_array_append_new(lat, json_real(o[i].latency));
        json_array_append_new(start, json_real(o[i].start_time));
        json_array_append_new(queue, json_real(o[i].queue_time));
        json_array_append_new(texts, jstr(o[i].text));
        json_array_append_new(errors, jstr(o[i].error));
    }
    json_object_set_new(r, "input_lens", in);
    json_object_set_new(r, "output_lens", out);
    json_object_set_new(r, "ttfts", ttfts);
    json_object_set_new(r, "itls", itls);
    json_object_set_new(r, "latencies", lat);
    json_object_set_new(r, "start_times", start);
    json_object_set_new(r, "queue_times", queue);
    json_object_set_new(r, "generated_texts", texts);
    json_object_set_new(r, "errors", errors);
    json_object_set_new(r, "max_output_tokens_per_s", json_real(m->max_output_tokens_per_s));
    json_object_set_new(r, "max_concurrent_requests", json_integer(m->max_concurrent_requests));
    for (int k = 0; k < BENCH_NUM_METRICS; k++) {
        if (!opt->metrics[k])
            continue;
        char key[64], p[32];
        snprintf(key, sizeof key, "mean_%s_ms", keys[k]);
        json_object_set_new(r, key, json_real(m->dist[k].mean));
        snprintf(key, sizeof key, "median_%s_ms", keys[k]);
        json_object_set_new(r, key, json_real(m->dist[k].median));
        snprintf(key, sizeof key, "std_%s_ms", keys[k]);
        json_object_set_new(r, key, json_real(m->dist[k].std));
        for (int i = 0; i < opt->num_percentiles; i++) {
            snprintf(key, sizeof key, "p%s_%s_ms", bench_pword(opt->percentiles[i], p, sizeof p),
                     keys[k]);
            json_object_set_new(r, key, json_real(m->dist[k].pct[i]));
        }
    }
    return r;
}

int bench_write_json(json_t *j, const char *dir, const char *name, char *path_out,
                     size_t path_size) {
    if (dir && *dir) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s", dir);
        for (char *p = tmp + 1; *p; p++) { /* mkdir -p */
            if (*p != '/')
                continue;
            *p = '\0';
            mkdir(tmp, 0777);
            *p = '/';
        }
        if (mkdir(tmp, 0777) != 0 && errno != EEXIST) {
            fprintf(stderr, "pagellm bench: --result-dir %s: %s\n", dir, strerror(errno));
            return 0;
        }
        snprintf(path_out, path_size, "%s/%s", dir, name);
    } else {
        snprintf(path_out, path_size, "%s", name);
    }
    if (json_dump_file(j, path_out, JSON_COMPACT | JSON_REAL_PRECISION(17)) != 0) {
        fprintf(stderr, "pagellm bench: cannot write %s: %s\n", path_out, strerror(errno));
        return 0;
    }
    return 1;
}
