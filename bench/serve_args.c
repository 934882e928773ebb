/* serve_args.c - the flags of `pagellm bench serve`, with vLLM's names and defaults
 * (vllm bench serve), their help text, and the checks of list-valued flags
 * (--percentile-metrics, --metric-percentiles, --goodput, --sweep-rates). */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "bench_internal.h"

#define CMD "serve"

static const char help[] =
    "usage: pagellm bench serve [--base-url URL] [--endpoint PATH] [flags]\n"
    "\n"
    "Load-tests an OpenAI-compatible server (pagellm serve, vLLM, ...) with streaming\n"
    "requests and prints vLLM's \"Serving Benchmark Result\" block. Exit status 0 when the\n"
    "benchmark ran (failed requests are counted and listed), 1 when it could not run or\n"
    "every request failed, 2 for bad flags.\n"
    "\n"
    "Server:\n"
    "  --base-url URL            server (default http://{host}:{port})\n"
    "  --host H / --port P       used when --base-url is not given (127.0.0.1, 8000)\n"
    "  --endpoint PATH           /v1/completions (default) or /v1/chat/completions\n"
    "  --model NAME              model in the requests (default: first of GET /v1/models)\n"
    "  --tokenizer DIR           folder with tokenizer.json for token counts and random\n"
    "                            prompts (default: the bundled model)\n"
    "  --timeout S               seconds one request may take, 0 = none (default 21600)\n"
    "  (OPENAI_API_KEY in the environment is sent as a bearer token)\n"
    "\n"
    "Workload:\n"
    "  --dataset-name NAME       random (default), sharegpt or jsonl\n"
    "  --dataset-path F          ShareGPT JSON, or JSONL {\"prompt\": ..., \"max_tokens\": N}\n"
    "  --num-prompts N           requests (default 1000; jsonl: every line)\n"
    "  --random-input-len N      prompt tokens, special tokens included (default 1024)\n"
    "  --random-output-len N     tokens to generate (default 128; jsonl: when a line has\n"
    "                            no max_tokens)\n"
    "  --random-range-ratio R    lengths uniform in [len*(1-R), len*(1+R)] (default 0)\n"
    "  --random-prefix-len N     a random prefix shared by every prompt (default 0)\n"
    "  --input-len/--output-len  the same as --random-input-len/--random-output-len\n"
    "  --sharegpt-output-len N   fixed output length for ShareGPT (default: the reply's)\n"
    "  --seed N                  random prompts, lengths, ShareGPT order, arrivals (0)\n"
    "  --ignore-eos              send ignore_eos: generate exactly max_tokens\n"
    "  --temperature T, --top-p P, --top-k K   sampling parameters (default: the server's)\n"
    "\n"
    "Traffic:\n"
    "  --request-rate R          requests/s, or inf: all at once (default inf)\n"
    "  --burstiness B            gamma shape of the arrival gaps: 1 = Poisson (default),\n"
    "                            < 1 burstier, > 1 more even\n"
    "  --max-concurrency N       requests in flight at most (default: no limit)\n"
    "  --sweep-rates R1,R2,...   one run per rate; writes each run's JSON and a PNG of\n"
    "                            latency percentiles against output throughput (gnuplot)\n"
    "\n"
    "Results:\n"
    "  --percentile-metrics L    of ttft,tpot,itl,e2el (default ttft,tpot,itl)\n"
    "  --metric-percentiles L    e.g. 50,90,99 (default 99)\n"
    "  --goodput K:MS ...        SLOs for request goodput, K of ttft, tpot, e2el\n"
    "  --save-result             write the result JSON (summary and per-request data)\n"
    "  --result-dir D            folder for it (default: the current one)\n"
    "  --result-filename F       its name (default {label}-{rate}qps-{model}-{date}.json)\n"
    "  --label L                 name of the run (default: openai or openai-chat)\n"
    "  --disable-tqdm            no progress bar\n";

void bench_serve_print_help(FILE *f) {
    fputs(help, f);
}

void bench_serve_options_init(BenchServeOptions *o) {
    memset(o, 0, sizeof *o);
    o->host = pl_xstrdup("127.0.0.1");
    o->port = 8000;
    o->endpoint = pl_xstrdup("/v1/completions");
    o->data = bench_dataset_options_default();
    o->request_rate = INFINITY;
    o->burstiness = 1.0;
    o->metrics[BENCH_TTFT] = o->metrics[BENCH_TPOT] = o->metrics[BENCH_ITL] = 1;
    o->percentiles[0] = 99;
    o->num_percentiles = 1;
    for (int k = 0; k < BENCH_NUM_METRICS; k++)
        o->goodput_ms[k] = -1;
    o->temperature = o->top_p = -1;
    o->top_k = -2;
    o->timeout_s = 6 * 3600;
}

void bench_serve_options_free(BenchServeOptions *o) {
    free(o->base_url);
    free(o->host);
    free(o->endpoint);
    free(o->model);
    free(o->tokenizer);
    free(o->label);
    free(o->dataset_path);
    free(o->result_dir);
    free(o->result_filename);
    memset(o, 0, sizeof *o);
}

/* "inf" or a number > 0. */
static int parse_rate(const char *flag, const char *s, double *out) {
    if (!strcmp(s, "inf") || !strcmp(s, "Inf") || !strcmp(s, "infinity")) {
        *out = INFINITY;
        return 1;
    }
    if (!bflag_double(CMD, flag, s, 0, 1e12, out))
        return 0;
    if (*out <= 0) {
        fprintf(stderr, "pagellm bench serve: %s: must be > 0 or inf\n", flag);
        return 0;
    }
    return 1;
}

static int parse_metrics(const char *v, int *metrics) {
    int sel[BENCH_NUM_METRICS] = {0};
    char *copy = pl_xstrdup(v), *save = NULL;
    int ok = 1, any = 0;
    for (char *w = strtok_r(copy, ",", &save); w && ok; w = strtok_r(NULL, ",", &save)) {
        int k = 0;
        while (k < BENCH_NUM_METRICS && strcmp(w, bench_metric_key(k)))
            k++;
        if (k == BENCH_NUM_METRICS) {
            fprintf(stderr,
                    "pagellm bench serve: --percentile-metrics: unknown metric '%s' (one of "
                    "ttft, tpot, itl, e2el)\n",
                    w);
            ok = 0;
        } else {
            sel[k] = any = 1;
        }
    }
    free(copy);
    if (ok && !any) {
        fprintf(stderr, "pagellm bench serve: --percentile-metrics: empty list\n");
        ok = 0;
    }
    if (ok)
        memcpy(metrics, sel, sizeof sel);
    return ok;
}

/* Comma-separated numbers into out[max]; each checked by check (NULL = [lo, hi]). */
static int parse_list(const char *flag, const char *v, double lo, double hi, int rates, double *out,
                      int max, int *count) {
    char *copy = pl_xstrdup(v), *save = NULL;
    int n = 0, ok = 1;
    for (char *w = strtok_r(copy, ",", &save); w && ok; w = strtok_r(NULL, ",", &save)) {
        if (n == max) {
            fprintf(stderr, "pagellm bench serve: %s: more than %d values\n", flag, max);
            ok = 0;
        } else {
            ok = rates ? parse_rate(flag, w, &out[n]) : bflag_double(CMD, flag, w, lo, hi, &out[n]);
            n += ok;
        }
    }
    free(copy);
    if (ok && n == 0) {
        fprintf(stderr, "pagellm bench serve: %s: empty list\n", flag);
        ok = 0;
    }
    if (ok)
        *count = n;
    return ok;
}

/* One "ttft:500" pair (or several, comma-separated). */
static int parse_goodput(const char *v, double *slo) {
    char *copy = pl_xstrdup(v), *save = NULL;
    int ok = 1;
    for (char *w = strtok_r(copy, ",", &save); w && ok; w = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(w, ':');
        int k = -1;
        if (colon) {
            *colon = '\0';
            for (int i = 0; i < BENCH_NUM_METRICS; i++)
                if (i != BENCH_ITL && !strcmp(w, bench_metric_key(i)))
                    k = i;
        }
        if (k < 0) {
            fprintf(stderr,
                    "pagellm bench serve: --goodput: '%s%s%s' is not KEY:MS with KEY one of "
                    "ttft, tpot, e2el\n",
                    w, colon ? ":" : "", colon ? colon + 1 : "");
            ok = 0;
        } else {
            ok = bflag_double(CMD, "--goodput", colon + 1, 0, 1e12, &slo[k]);
        }
    }
    free(copy);
    return ok;
}

int bench_serve_flag(BenchServeOptions *o, int argc, char **argv, int *i) {
    const char *v;
    int r;
    if ((r = bflag_dataset(CMD, &o->data, &o->dataset_path, 1, argc, argv, i)) != 0)
        return r;
    const char *a = argv[*i];
    if (!strcmp(a, "--ignore-eos")) {
        o->ignore_eos = 1;
        return 1;
    }
    if (!strcmp(a, "--save-result")) {
        o->save_result = 1;
        return 1;
    }
    if (!strcmp(a, "--disable-tqdm")) {
        o->disable_progress = 1;
        return 1;
    }
    if (!strcmp(a, "--goodput") || !strncmp(a, "--goodput=", 10)) {
        int n = 0;
        if (a[9] == '=') {
            n = 1;
            if (!parse_goodput(a + 10, o->goodput_ms))
                return -1;
        }
        while (*i + 1 < argc && argv[*i + 1][0] != '-') { /* nargs="+", as vLLM's */
            if (!parse_goodput(argv[++*i], o->goodput_ms))
                return -1;
            n++;
        }
        if (n == 0) {
            fprintf(stderr, "pagellm bench serve: --goodput needs KEY:MS values\n");
            return -1;
        }
        return 1;
    }
    static const struct {
        const char *name;
        size_t offset;
    } strings[] = {
        {"--base-url", offsetof(BenchServeOptions, base_url)},
        {"--host", offsetof(BenchServeOptions, host)},
        {"--endpoint", offsetof(BenchServeOptions, endpoint)},
        {"--model", offsetof(BenchServeOptions, model)},
        {"--tokenizer", offsetof(BenchServeOptions, tokenizer)},
        {"--label", offsetof(BenchServeOptions, label)},
        {"--result-dir", offsetof(BenchServeOptions, result_dir)},
        {"--result-filename", offsetof(BenchServeOptions, result_filename)},
    };
    for (size_t k = 0; k < sizeof strings / sizeof strings[0]; k++) {
        if ((r = bflag_value(CMD, strings[k].name, argc, argv, i, &v)) == 0)
            continue;
        if (r < 0)
            return -1;
        if (!*v) {
            fprintf(stderr, "pagellm bench serve: %s: empty value\n", strings[k].name);
            return -1;
        }
        bflag_set_str((char **)((char *)o + strings[k].offset), v);
        return 1;
    }
#define VALUE(name) ((r = bflag_value(CMD, name, argc, argv, i, &v)) != 0)
#define CHECK(ok)   return (r < 0 || !(ok)) ? -1 : 1
    if (VALUE("--port"))
        CHECK(bflag_int(CMD, "--port", v, 1, 65535, &o->port));
    if (VALUE("--request-rate"))
        CHECK(parse_rate("--request-rate", v, &o->request_rate));
    if (VALUE("--burstiness"))
        CHECK(bflag_double(CMD, "--burstiness", v, 1e-6, INFINITY, &o->burstiness));
    if (VALUE("--max-concurrency"))
        CHECK(bflag_int(CMD, "--max-concurrency", v, 1, 1000000, &o->max_concurrency));
    if (VALUE("--percentile-metrics"))
        CHECK(parse_metrics(v, o->metrics));
    if (VALUE("--metric-percentiles"))
        CHECK(parse_list("--metric-percentiles", v, 0, 100, 0, o->percentiles,
                         BENCH_MAX_PERCENTILES, &o->num_percentiles));
    if (VALUE("--sweep-rates"))
        CHECK(parse_list("--sweep-rates", v, 0, 0, 1, o->sweep_rates, BENCH_MAX_SWEEP,
                         &o->num_sweep_rates));
    if (VALUE("--temperature"))
        CHECK(bflag_double(CMD, "--temperature", v, 0, 100, &o->temperature));
    if (VALUE("--top-p"))
        CHECK(bflag_double(CMD, "--top-p", v, 1e-9, 1, &o->top_p));
    if (VALUE("--top-k"))
        CHECK(bflag_int(CMD, "--top-k", v, -1, 1 << 24, &o->top_k));
    if (VALUE("--timeout"))
        CHECK(bflag_double(CMD, "--timeout", v, 0, 1e9, &o->timeout_s));
#undef VALUE
#undef CHECK
    return 0;
}
