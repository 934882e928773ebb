/* serve.c - `pagellm bench serve`: find the model, build the workload with the tokenizer,
 * run the client at each request rate (one, or every --sweep-rates value), print vLLM's
 * result block, save the result JSON, and for a sweep the plot. */
#include <curl/curl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_internal.h"

/* vLLM's file name: {label}-{rate}qps[-concurrency{N}]-{model basename}-{date}.json; with a
 * --result-filename and a sweep, the rate goes before its extension. */
static void result_name(const BenchServeOptions *o, const char *label, const char *model,
                        double rate, const char *date, int sweep, char *out, size_t size) {
    char r[64];
    bench_pyfloat(rate, r, sizeof r);
    if (o->result_filename) {
        const char *dot = strrchr(o->result_filename, '.');
        if (!sweep || !dot)
            snprintf(out, size, "%s%s%s%s", o->result_filename, sweep ? "-" : "", sweep ? r : "",
                     sweep ? "qps" : "");
        else
            snprintf(out, size, "%.*s-%sqps%s", (int)(dot - o->result_filename), o->result_filename,
                     r, dot);
        return;
    }
    const char *base = strrchr(model, '/') ? strrchr(model, '/') + 1 : model;
    char conc[48] = "";
    if (o->max_concurrency > 0)
        snprintf(conc, sizeof conc, "-concurrency%d", o->max_concurrency);
    snprintf(out, size, "%s-%sqps%s-%s-%s.json", label, r, conc, base, date);
}

static void print_traffic(const BenchServeOptions *o, double rate) {
    char r[64], b[64];
    printf("Traffic request rate: %s\n", bench_pyfloat(rate, r, sizeof r));
    printf("Burstiness factor: %s (%s)\n", bench_pyfloat(o->burstiness, b, sizeof b),
           o->burstiness == 1.0 ? "Poisson process" : "Gamma distribution");
    if (o->max_concurrency > 0)
        printf("Maximum request concurrency: %d\n", o->max_concurrency);
    else
        printf("Maximum request concurrency: None\n");
    fflush(stdout);
}

/* One run at `rate`: returns the number of successful requests, or -1 if the client
 * could not start. */
static int run_one(const BenchClient *c, const BenchDataset *ds, const BenchRunInfo *info,
                   const char *date, int sweep, BenchSweepPoint *point) {
    const BenchServeOptions *o = c->opt;
    print_traffic(o, info->request_rate);
    BenchOutcome *out = pl_xcalloc((size_t)ds->n, sizeof *out);
    double duration;
    if (bench_client_run(c, ds, info->request_rate, out, &duration) != 0) {
        free(out);
        return -1;
    }
    BenchMetrics m;
    bench_metrics_compute(out, ds->n, duration, o, &m);
    bench_report_print(stdout, &m, out, ds->n, o, info->request_rate);
    if (o->save_result || sweep) {
        json_t *j = bench_result_json(&m, out, ds->n, o, info, date);
        char name[1024], path[4096];
        const char *label = o->label ? o->label : info->backend;
        result_name(o, label, info->model_id, info->request_rate, date, sweep, name, sizeof name);
        if (bench_write_json(j, o->result_dir, name, path, sizeof path))
            printf("Saved the result to %s\n", path);
        json_decref(j);
    }
    *point = (BenchSweepPoint){.rate = info->request_rate,
                               .completed = m.completed,
                               .failed = m.failed,
                               .request_throughput = m.request_throughput,
                               .output_throughput = m.output_throughput};
    memcpy(point->dist, m.dist, sizeof m.dist);
    int ok = m.completed;
    bench_metrics_free(&m);
    bench_outcomes_free(out, ds->n);
    free(out);
    return ok;
}

int bench_serve_run(const BenchServeOptions *o) {
    char base[2048], url[4096], date[32];
    if (o->base_url)
        snprintf(base, sizeof base, "%s", o->base_url);
    else
        snprintf(base, sizeof base, "http://%s:%d", o->host, o->port);
    for (size_t n = strlen(base); n > 0 && base[n - 1] == '/'; n--)
        base[n - 1] = '\0';
    snprintf(url, sizeof url, "%s%s%s", base, o->endpoint[0] == '/' ? "" : "/", o->endpoint);
    int chat = strstr(o->endpoint, "chat/completions") != NULL;
    if (!chat && !strstr(o->endpoint, "completions")) {
        fprintf(stderr,
                "pagellm bench serve: --endpoint %s: expected /v1/completions or "
                "/v1/chat/completions\n",
                o->endpoint);
        return 2;
    }
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y%m%d-%H%M%S", localtime(&now));
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fprintf(stderr, "pagellm bench serve: libcurl does not initialise\n");
        return 1;
    }
    int rc = 1;
    char *model = o->model ? pl_xstrdup(o->model) : NULL, *err = NULL;
    Tokenizer *tok = NULL;
    BenchDataset ds = {0};
    BenchDatasetOptions data = o->data;
    int max_model_len = 0; /* the server's, from /v1/models; 0 = not listed */
    if (!model) {
        printf("Model not specified, fetching first model from server...\n");
        if (!(model = bench_first_model(base, NULL, &max_model_len, &err))) {
            fprintf(stderr, "pagellm bench serve: cannot list the models (give --model): %s\n",
                    err);
            goto done;
        }
        printf("First model name: %s\n", model);
    } else { /* only for max_model_len: a server without /v1/models is fine */
        free(bench_first_model(base, model, &max_model_len, &err));
        free(err);
        err = NULL;
    }
    /* Requests longer than the model's context all fail (vLLM's defaults, 1024-token prompts,
     * on a 512-token model): shorten the random lengths to fit, and say so. */
    char note[256];
    if (bench_fit_model_len(&data, max_model_len, note, sizeof note))
        fprintf(stderr, "pagellm bench serve: %s\n", note);
    if (!o->tokenizer) {
        fprintf(stderr, "pagellm bench serve: --tokenizer DIR is needed to count tokens\n");
        goto done;
    }
    if (tok_load(o->tokenizer, &tok) != PL_OK) {
        fprintf(stderr, "pagellm bench serve: --tokenizer: %s\n", pl_error());
        goto done;
    }
    printf("Tokenizer: %s\n", o->tokenizer);
    if (bench_dataset_load(&data, tok, 0, &ds) != PL_OK) {
        fprintf(stderr, "pagellm bench serve: %s\n", pl_error());
        goto done;
    }
    int too_long = 0;
    for (int i = 0; max_model_len > 0 && i < ds.n; i++)
        too_long += ds.items[i].prompt_len + ds.items[i].output_len > max_model_len;
    if (too_long)
        fprintf(stderr,
                "pagellm bench serve: %d of %d requests are longer (prompt + output tokens) than "
                "the server's max_model_len %d: expect them to fail\n",
                too_long, ds.n, max_model_len);
    BenchClient c = {.url = url, .model = model, .chat = chat, .opt = o};
    BenchRunInfo info = {.backend = chat ? "openai-chat" : "openai",
                         .model_id = model,
                         .tokenizer_id = o->tokenizer};
    int sweep = o->num_sweep_rates > 0, runs = sweep ? o->num_sweep_rates : 1, ok = 0;
    BenchSweepPoint *points = pl_xcalloc((size_t)runs, sizeof *points);
    printf("Starting main benchmark run: %d requests to %s\n", ds.n, url);
    for (int r = 0; r < runs; r++) {
        info.request_rate = sweep ? o->sweep_rates[r] : o->request_rate;
        int got = run_one(&c, &ds, &info, date, sweep, &points[r]);
        if (got < 0) {
            free(points);
            goto done;
        }
        ok += got;
    }
    if (sweep) {
        char stem[1024];
        const char *label = o->label ? o->label : info.backend;
        const char *mb = strrchr(model, '/') ? strrchr(model, '/') + 1 : model;
        snprintf(stem, sizeof stem, "%s-sweep-%s-%s", label, mb, date);
        bench_sweep_report(points, runs, o, model, o->result_dir, stem);
    }
    free(points);
    if (ok == 0)
        fprintf(stderr, "pagellm bench serve: every request failed (the reasons are above)\n");
    rc = ok > 0 ? 0 : 1;
done:
    bench_dataset_free(&ds);
    tok_destroy(tok);
    free(model);
    free(err);
    curl_global_cleanup();
    return rc;
}
