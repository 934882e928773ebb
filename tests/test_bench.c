/* test_bench.c - `pagellm bench`: the load generator against the real server on the bundled
 * model (a random and a JSONL run, and chat: no failures, token totals equal the server's own
 * usage counters, and every printed and saved number equals a brute-force recomputation from
 * the saved per-request data), against a deliberately faulty HTTP endpoint in this process
 * (dropped connections, garbage, HTTP 500, malformed SSE: failures counted with reasons) and
 * an unreachable one; the in-process throughput and latency modes; bad flags; and the units
 * underneath (SSE parsing in any split, numpy statistics, arrivals, datasets). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <curl/curl.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_internal.h"
#include "common.h"
#include "port_test_util.h"
#include "tokenizer.h"

#define PAGELLM       "build/pagellm"
#define MODEL_DIR     "models/stories260K"
#define PROMPTS_JSONL "tests/data/bench/prompts.jsonl"
#define SHAREGPT_JSON "tests/data/bench/sharegpt.json"

extern char **environ;

static char tmpdir[] = "/tmp/pagellm-bench-XXXXXX";
static pid_t server_pid = -1;
static int server_port;

/* ---- processes and HTTP ---------------------------------------------------------------- */

static size_t collect(char *p, size_t size, size_t n, void *ud) {
    char **buf = ud;
    size_t old = *buf ? strlen(*buf) : 0;
    *buf = pl_xrealloc(*buf, old + size * n + 1);
    memcpy(*buf + old, p, size * n);
    (*buf)[old + size * n] = '\0';
    return size * n;
}

/* GET http://127.0.0.1:port/path: the status (0 when unreachable), body in *body. */
static long http_get(int port, const char *path, char **body) {
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    CURL *e = curl_easy_init();
    *body = NULL;
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, body);
    curl_easy_setopt(e, CURLOPT_TIMEOUT, 5L);
    long status = 0;
    if (curl_easy_perform(e) == CURLE_OK)
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(e);
    return status;
}

static int group_setup(void **state) {
    (void)state;
    signal(SIGPIPE, SIG_IGN); /* the faulty server writes to clients that may have left */
    if (!mkdtemp(tmpdir) || curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return -1;
    server_port = test_free_port();
    char port[16], log[512];
    snprintf(port, sizeof port, "%d", server_port);
    snprintf(log, sizeof log, "%s/server.log", tmpdir);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    char *argv[] = {PAGELLM, "serve", "--port", port, "--chat-template", "chatml", NULL};
    int rc = posix_spawn(&server_pid, PAGELLM, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0)
        return -1;
    for (int i = 0; i < 300; i++) { /* up to 15 s for /health */
        char *body;
        long st = http_get(server_port, "/health", &body);
        free(body);
        if (st == 200)
            return 0;
        usleep(50000);
    }
    fprintf(stderr, "test_bench: the server did not come up (see %s)\n", log);
    return -1;
}

static int group_teardown(void **state) {
    (void)state;
    if (server_pid > 0) {
        kill(server_pid, SIGTERM);
        int st, i = 0;
        while (waitpid(server_pid, &st, WNOHANG) == 0 && i++ < 100)
            usleep(50000);
        if (i > 100) {
            kill(server_pid, SIGKILL);
            waitpid(server_pid, &st, 0);
        }
    }
    curl_global_cleanup();
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

typedef struct {
    int status;
    char *out, *err;
} RunResult;

/* Run the binary with `args` (shell syntax), capturing stdout, stderr and the exit code. */
static RunResult run(const char *fmt, ...) {
    char args[4096], cmd[8192], path[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "%s %s >%s/out 2>%s/err", PAGELLM, args, tmpdir, tmpdir);
    int st = system(cmd);
    RunResult r = {.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128};
    snprintf(path, sizeof path, "%s/out", tmpdir);
    assert_int_equal(pl_read_file(path, &r.out, NULL), PL_OK);
    snprintf(path, sizeof path, "%s/err", tmpdir);
    assert_int_equal(pl_read_file(path, &r.err, NULL), PL_OK);
    return r;
}

static void run_free(RunResult *r) {
    free(r->out);
    free(r->err);
}

/* Sum of the server's Prometheus samples called `name` (any labels). */
static double server_metric(const char *name) {
    char *body;
    assert_int_equal(http_get(server_port, "/metrics", &body), 200);
    double sum = 0;
    size_t n = strlen(name);
    for (char *line = body; line && *line;
         line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
        if (!strncmp(line, name, n) && (line[n] == '{' || line[n] == ' ')) {
            char *sp = strchr(line, ' ');
            sum += strtod(sp + 1, NULL);
        }
    free(body);
    return sum;
}

/* The number after `label` on its line of the printed result; fails when absent. */
static double printed(const char *out, const char *label) {
    const char *p = out;
    size_t n = strlen(label);
    while ((p = strstr(p, label)) && p != out && p[-1] != '\n')
        p += n;
    if (!p)
        print_error("printed result has no line '%s'\n", label);
    assert_non_null(p);
    return strtod(p + n, NULL);
}

static json_t *load_json(const char *path) {
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    if (!j)
        print_error("%s: %s\n", path, err.text);
    assert_non_null(j);
    return j;
}

/* ---- brute-force recomputation from the saved per-request data ------------------------- */

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Textbook statistics, written without looking at bench/stats.c. */
static double r_mean(const double *v, int n) {
    double s = 0;
    for (int i = 0; i < n; i++)
        s += v[i];
    return n ? s / n : 0;
}

static double r_median(double *v, int n) {
    if (!n)
        return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The percentile whose rank (p/100)(n-1) falls between two sorted values, interpolated. */
static double r_pct(double *v, int n, double p) {
    if (!n)
        return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    double rank = p / 100 * (n - 1);
    int below = (int)rank;
    if (below >= n - 1)
        return v[n - 1];
    return v[below] * (1 - (rank - below)) + v[below + 1] * (rank - below);
}

static void near(double got, double want, double tol, const char *what) {
    if (!(fabs(got - want) <= tol + 1e-9 * fabs(want))) {
        print_error("%s: %.9f, recomputed %.9f\n", what, got, want);
        fail();
    }
}

static double jnum(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    if (!json_is_number(v))
        print_error("result JSON has no number '%s'\n", key);
    assert_true(json_is_number(v));
    return json_number_value(v);
}

static double *jarray(json_t *o, const char *key, int *n) {
    json_t *a = json_object_get(o, key);
    assert_true(json_is_array(a));
    *n = (int)json_array_size(a);
    double *v = pl_xcalloc((size_t)*n + 1, sizeof *v);
    for (int i = 0; i < *n; i++)
        v[i] = json_number_value(json_array_get(a, (size_t)i));
    return v;
}

/* One metric: the JSON's mean/median/pNN equal the recomputation, the printed lines equal
 * the JSON to their two decimals. vals are seconds. */
static void check_metric(json_t *r, const char *out, const char *key, const char *name,
                         double *vals, int n, const double *pcts, int np) {
    char k[64], label[96];
    double want[2];
    snprintf(k, sizeof k, "mean_%s_ms", key);
    if (!json_object_get(r, k)) /* not among --percentile-metrics */
        return;
    want[0] = r_mean(vals, n) * 1000;
    want[1] = r_median(vals, n) * 1000;
    snprintf(k, sizeof k, "mean_%s_ms", key);
    near(jnum(r, k), want[0], 1e-9, k);
    snprintf(label, sizeof label, "Mean %s (ms):", name);
    near(printed(out, label), jnum(r, k), 0.005, label);
    snprintf(k, sizeof k, "median_%s_ms", key);
    near(jnum(r, k), want[1], 1e-9, k);
    snprintf(label, sizeof label, "Median %s (ms):", name);
    near(printed(out, label), jnum(r, k), 0.005, label);
    for (int i = 0; i < np; i++) {
        snprintf(k, sizeof k, "p%d_%s_ms", (int)pcts[i], key);
        near(jnum(r, k), r_pct(vals, n, pcts[i]) * 1000, 1e-9, k);
        snprintf(label, sizeof label, "P%d %s (ms):", (int)pcts[i], name);
        near(printed(out, label), jnum(r, k), 0.005, label);
    }
}

typedef struct {
    int completed;
    long total_input, total_output;
} Totals;

/* Recompute every summary number of a saved result and compare with the JSON and the
 * printed block. slo_ms: ttft, tpot, e2el SLOs given with --goodput (< 0 = none). */
static Totals check_result(json_t *r, const char *out, const double *pcts, int np,
                           const double *slo_ms) {
    int n, n2;
    double *ttft = jarray(r, "ttfts", &n), *lat = jarray(r, "latencies", &n2);
    assert_int_equal(n, n2);
    double *in = jarray(r, "input_lens", &n2), *outl = jarray(r, "output_lens", &n2);
    double *start = jarray(r, "start_times", &n2);
    json_t *itls = json_object_get(r, "itls"), *errors = json_object_get(r, "errors");
    double *s_ttft = pl_xcalloc((size_t)n + 1, 8), *s_e2el = pl_xcalloc((size_t)n + 1, 8);
    double *s_tpot = pl_xcalloc((size_t)n + 1, 8), *s_itl = NULL;
    int ok = 0, ntpot = 0, nitl = 0, good = 0;
    long tin = 0, tout = 0;
    double t_min = INFINITY, t_max = 0;
    for (int i = 0; i < n; i++) {
        if (strcmp(json_string_value(json_array_get(errors, (size_t)i)), ""))
            continue;
        json_t *gaps = json_array_get(itls, (size_t)i);
        double sum = 0;
        for (size_t k = 0; k < json_array_size(gaps); k++) {
            double g = json_number_value(json_array_get(gaps, k));
            assert_true(g >= 0);
            sum += g;
            s_itl = pl_xrealloc(s_itl, (size_t)(nitl + 1) * sizeof *s_itl);
            s_itl[nitl++] = g;
        }
        near(ttft[i] + sum, lat[i], 1e-9, "ttft + sum(itl) = e2el"); /* one clock, one story */
        assert_true(ttft[i] > 0 && lat[i] >= ttft[i]);
        s_ttft[ok] = ttft[i];
        s_e2el[ok] = lat[i];
        double tpot = 0;
        if (outl[i] > 1)
            s_tpot[ntpot++] = tpot = (lat[i] - ttft[i]) / (outl[i] - 1);
        good += (slo_ms[0] < 0 || ttft[i] * 1000 <= slo_ms[0]) &&
                (slo_ms[1] < 0 || tpot * 1000 <= slo_ms[1]) &&
                (slo_ms[2] < 0 || lat[i] * 1000 <= slo_ms[2]);
        tin += (long)in[i];
        tout += (long)outl[i];
        t_min = fmin(t_min, start[i]);
        t_max = fmax(t_max, start[i] + lat[i]);
        ok++;
    }
    double dur = jnum(r, "duration");
    assert_true(dur > 0);
    assert_int_equal((int)jnum(r, "completed"), ok);
    assert_int_equal((int)jnum(r, "failed"), n - ok);
    assert_int_equal((long)jnum(r, "total_input_tokens"), tin);
    assert_int_equal((long)jnum(r, "total_output_tokens"), tout);
    near(jnum(r, "request_throughput"), ok / dur, 1e-9, "request_throughput");
    near(jnum(r, "output_throughput"), tout / dur, 1e-9, "output_throughput");
    near(jnum(r, "total_token_throughput"), (tin + tout) / dur, 1e-9, "total_token_throughput");
    assert_int_equal((int)printed(out, "Successful requests:"), ok);
    assert_int_equal((int)printed(out, "Failed requests:"), n - ok);
    assert_int_equal((long)printed(out, "Total input tokens:"), tin);
    assert_int_equal((long)printed(out, "Total generated tokens:"), tout);
    near(printed(out, "Benchmark duration (s):"), dur, 0.005, "duration printed");
    near(printed(out, "Request throughput (req/s):"), ok / dur, 0.005, "req/s printed");
    near(printed(out, "Output token throughput (tok/s):"), tout / dur, 0.005, "tok/s printed");
    near(printed(out, "Total token throughput (tok/s):"), (tin + tout) / dur, 0.005, "total");
    if (slo_ms[0] >= 0 || slo_ms[1] >= 0 || slo_ms[2] >= 0) {
        near(jnum(r, "request_goodput"), good / dur, 1e-9, "request_goodput");
        near(printed(out, "Request goodput (req/s):"), good / dur, 0.005, "goodput printed");
    }
    if (ok > 0) { /* peak: text chunks per second from the first send; peak concurrency */
        int buckets = (int)ceil(t_max - t_min) + 1;
        double *per_s = pl_xcalloc((size_t)buckets, sizeof *per_s), peak = 0;
        int max_conc = 0;
        for (int i = 0; i < n; i++) {
            if (strcmp(json_string_value(json_array_get(errors, (size_t)i)), ""))
                continue;
            json_t *gaps = json_array_get(itls, (size_t)i);
            double t = start[i] + ttft[i];
            per_s[(int)(t - t_min)]++;
            for (size_t k = 0; k < json_array_size(gaps); k++) {
                t += json_number_value(json_array_get(gaps, k));
                if ((int)(t - t_min) < buckets)
                    per_s[(int)(t - t_min)]++;
            }
            int conc = 0; /* requests in flight at this one's start, itself included */
            for (int j = 0; j < n; j++)
                conc += !strcmp(json_string_value(json_array_get(errors, (size_t)j)), "") &&
                        start[j] <= start[i] && start[i] < start[j] + lat[j];
            max_conc = conc > max_conc ? conc : max_conc;
        }
        for (int b = 0; b < buckets; b++)
            peak = fmax(peak, per_s[b]);
        near(jnum(r, "max_output_tokens_per_s"), peak, 1e-9, "max_output_tokens_per_s");
        near(printed(out, "Peak output token throughput (tok/s):"), peak, 0.005, "peak printed");
        assert_int_equal((int)jnum(r, "max_concurrent_requests"), max_conc);
        free(per_s);
    }
    check_metric(r, out, "ttft", "TTFT", s_ttft, ok, pcts, np);
    check_metric(r, out, "tpot", "TPOT", s_tpot, ntpot, pcts, np);
    check_metric(r, out, "itl", "ITL", s_itl, nitl, pcts, np);
    check_metric(r, out, "e2el", "E2EL", s_e2el, ok, pcts, np);
    assert_non_null(strstr(out, "============ Serving Benchmark Result ============\n"));
    assert_non_null(strstr(out, "\n==================================================\n"));
    Totals t = {ok, tin, tout};
    free(ttft), free(lat), free(in), free(outl), free(start);
    free(s_ttft), free(s_e2el), free(s_tpot), free(s_itl);
    return t;
}

/* ---- against the real server ----------------------------------------------------------- */

static const double pcts[] = {50, 90, 99};

static void test_random_run_matches_server_and_recomputation(void **state) {
    (void)state;
    double p0 = server_metric("pagellm:request_prompt_tokens_sum");
    double g0 = server_metric("pagellm:request_generation_tokens_sum");
    RunResult r = run("bench serve --base-url http://127.0.0.1:%d --dataset-name random "
                      "--random-input-len 16 --random-output-len 8 --num-prompts 16 "
                      "--request-rate inf --max-concurrency 4 --ignore-eos --seed 1 "
                      "--percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99 "
                      "--goodput ttft:2000 tpot:500 e2el:5000 --save-result --result-dir %s "
                      "--result-filename random.json",
                      server_port, tmpdir);
    if (r.status != 0)
        print_error("exit %d\n%s%s", r.status, r.out, r.err);
    assert_int_equal(r.status, 0);
    char path[512];
    snprintf(path, sizeof path, "%s/random.json", tmpdir);
    json_t *j = load_json(path);
    static const double slo[] = {2000, 500, 5000};
    Totals t = check_result(j, r.out, pcts, 3, slo);
    for (int k = 0; k < BENCH_NUM_METRICS; k++) { /* all four were asked for */
        char key[64];
        snprintf(key, sizeof key, "p99_%s_ms", bench_metric_key(k));
        assert_non_null(json_object_get(j, key));
    }
    assert_int_equal(t.completed, 16);
    assert_int_equal(t.total_output, 16 * 8); /* ignore_eos: exactly max_tokens */
    assert_int_equal(t.total_input, 16 * 16); /* random prompts tokenize to the length */
    assert_int_equal((long)(server_metric("pagellm:request_prompt_tokens_sum") - p0),
                     t.total_input); /* the server's own count */
    assert_int_equal((long)(server_metric("pagellm:request_generation_tokens_sum") - g0),
                     t.total_output);
    assert_int_equal((int)printed(r.out, "Maximum request concurrency:"), 4);
    assert_true(jnum(j, "max_concurrent_requests") <= 4);
    assert_true(json_is_null(json_object_get(j, "burstiness")) || jnum(j, "burstiness") == 1.0);
    assert_string_equal(json_string_value(json_object_get(j, "request_rate")), "inf");
    assert_string_equal(json_string_value(json_object_get(j, "model_id")), "stories260K");
    int n;
    double *start = jarray(j, "start_times", &n); /* sent in order, four at a time */
    for (int i = 1; i < n; i++)
        assert_true(start[i] >= start[i - 1]);
    free(start);
    json_decref(j);
    run_free(&r);
}

static void test_jsonl_run_poisson(void **state) {
    (void)state;
    double p0 = server_metric("pagellm:request_prompt_tokens_sum");
    double g0 = server_metric("pagellm:request_generation_tokens_sum");
    RunResult r = run("bench serve --base-url http://127.0.0.1:%d --model stories260K "
                      "--dataset-name jsonl --dataset-path " PROMPTS_JSONL " --request-rate 100 "
                      "--burstiness 0.5 --ignore-eos --percentile-metrics ttft,tpot,itl,e2el "
                      "--metric-percentiles 50,90,99 --save-result --result-dir %s "
                      "--result-filename jsonl.json --disable-tqdm",
                      server_port, tmpdir);
    if (r.status != 0)
        print_error("exit %d\n%s%s", r.status, r.out, r.err);
    assert_int_equal(r.status, 0);
    char path[512];
    snprintf(path, sizeof path, "%s/jsonl.json", tmpdir);
    json_t *j = load_json(path);
    static const double no_slo[] = {-1, -1, -1};
    Totals t = check_result(j, r.out, pcts, 3, no_slo);
    static const int max_tokens[] = {5, 12, 3, 9, 7, 10, 4, 6};
    int n;
    double *outl = jarray(j, "output_lens", &n), *inl = jarray(j, "input_lens", &n);
    assert_int_equal(n, 8);
    Tokenizer *tok;
    assert_int_equal(tok_load(MODEL_DIR, &tok), PL_OK);
    char *data;
    assert_int_equal(pl_read_file(PROMPTS_JSONL, &data, NULL), PL_OK);
    int k = 0;
    for (char *line = strtok(data, "\n"); line; line = strtok(NULL, "\n")) {
        json_t *o = json_loads(line, 0, NULL);
        const char *p = json_string_value(json_object_get(o, "prompt"));
        int32_t *ids;
        int m;
        assert_int_equal(tok_encode(tok, p, strlen(p), 1, &ids, &m), PL_OK);
        assert_int_equal((int)inl[k], m); /* the server's usage.prompt_tokens */
        assert_int_equal((int)outl[k], max_tokens[k]);
        free(ids);
        json_decref(o);
        k++;
    }
    assert_int_equal(k, 8);
    assert_int_equal(t.total_output, 5 + 12 + 3 + 9 + 7 + 10 + 4 + 6);
    assert_int_equal((long)(server_metric("pagellm:request_prompt_tokens_sum") - p0),
                     t.total_input);
    assert_int_equal((long)(server_metric("pagellm:request_generation_tokens_sum") - g0),
                     t.total_output);
    near(printed(r.out, "Request rate configured (RPS):"), 100, 1e-9, "rate");
    assert_non_null(strstr(r.out, "Burstiness factor: 0.5 (Gamma distribution)\n"));
    near(jnum(j, "request_rate"), 100, 0, "request_rate");
    free(data);
    free(outl);
    free(inl);
    tok_destroy(tok);
    json_decref(j);
    run_free(&r);
}

static void test_chat_endpoint(void **state) {
    (void)state;
    RunResult r = run("bench serve --base-url http://127.0.0.1:%d --endpoint /v1/chat/completions "
                      "--random-input-len 12 --random-output-len 5 --num-prompts 4 --ignore-eos "
                      "--save-result --result-dir %s --result-filename chat.json",
                      server_port, tmpdir);
    assert_int_equal(r.status, 0);
    char path[512];
    snprintf(path, sizeof path, "%s/chat.json", tmpdir);
    json_t *j = load_json(path);
    static const double no_slo[] = {-1, -1, -1};
    static const double p99[] = {99};
    Totals t = check_result(j, r.out, p99, 1, no_slo);
    assert_int_equal(t.completed, 4);
    assert_int_equal(t.total_output, 4 * 5);
    assert_string_equal(json_string_value(json_object_get(j, "backend")), "openai-chat");
    json_decref(j);
    run_free(&r);
}

static void test_sweep_writes_points_and_plot(void **state) {
    (void)state;
    RunResult r = run("bench serve --base-url http://127.0.0.1:%d --random-input-len 8 "
                      "--random-output-len 4 --num-prompts 6 --ignore-eos --sweep-rates 200,inf "
                      "--result-dir %s/sweep --label sw --disable-tqdm",
                      server_port, tmpdir);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "Sweep Summary"));
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "ls %s/sweep/sw-200.0qps-stories260K-*.json "
             "%s/sweep/sw-infqps-stories260K-*.json "
             "%s/sweep/sw-sweep-stories260K-*.tsv >/dev/null 2>&1",
             tmpdir, tmpdir, tmpdir);
    assert_int_equal(system(cmd), 0);
    if (strstr(r.out, "Saved the sweep plot to ")) { /* gnuplot present */
        snprintf(cmd, sizeof cmd, "ls %s/sweep/sw-sweep-stories260K-*.png >/dev/null 2>&1", tmpdir);
        assert_int_equal(system(cmd), 0);
    } else {
        assert_non_null(strstr(r.err, "gnuplot"));
    }
    run_free(&r);
}

/* ---- a deliberately faulty endpoint ------------------------------------------------------ */

typedef struct {
    int fd, port;
    volatile int stop;
} Faulty;

static void send_all(int fd, const char *s, size_t n) {
    while (n > 0) {
        ssize_t k = send(fd, s, n, MSG_NOSIGNAL);
        if (k <= 0)
            return;
        s += k;
        n -= (size_t)k;
    }
}

static void send_str(int fd, const char *s) {
    send_all(fd, s, strlen(s));
}

#define SSE_HEAD "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
#define CHUNK(text, fin)                                                                           \
    "data: "                                                                                       \
    "{\"id\":\"x\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\"" text      \
    "\",\"finish_reason\":" fin "}]}\n\n"

/* Answer one connection as its prompt's marker says. */
static void faulty_answer(int c) {
    char req[65536];
    size_t len = 0;
    struct timeval tv = {.tv_sec = 2};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char *body = NULL;
    for (;;) { /* headers, then Content-Length bytes of body */
        ssize_t k = recv(c, req + len, sizeof req - 1 - len, 0);
        if (k <= 0)
            return;
        len += (size_t)k;
        req[len] = '\0';
        char *end = strstr(req, "\r\n\r\n");
        char *cl = strcasestr(req, "Content-Length:");
        if (end && cl && len >= (size_t)(end + 4 - req) + strtoul(cl + 15, NULL, 10)) {
            body = end + 4;
            break;
        }
    }
    if (strstr(body, "mark-ok")) {
        send_str(c, SSE_HEAD CHUNK("a", "null") CHUNK(" b", "null")
                        CHUNK(" c", "\"length\"") "data: "
                                                  "{\"choices\":[],\"usage\":{\"prompt_tokens\":5,"
                                                  "\"completion_tokens\":"
                                                  "3,\"total_tokens\":8}}\n\ndata: [DONE]\n\n");
    } else if (strstr(body, "mark-drop")) { /* chunked, cut inside the body */
        send_str(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                    "Transfer-Encoding: chunked\r\n\r\n");
        char chunk[512];
        const char *ev = CHUNK("a", "null");
        snprintf(chunk, sizeof chunk, "%zx\r\n%s\r\n", strlen(ev), ev);
        send_str(c, chunk);
    } else if (strstr(body, "mark-nodone")) { /* ends cleanly but before the stream does */
        send_str(c, SSE_HEAD CHUNK("a", "null"));
    } else if (strstr(body, "mark-garbage")) {
        send_str(c, "this is not HTTP at all\r\n\r\nnor is this\r\n");
    } else if (strstr(body, "mark-http500")) {
        const char *msg = "{\"error\":{\"message\":\"boom\",\"type\":\"internal\"}}";
        char head[256];
        snprintf(head, sizeof head,
                 "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
                 "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                 strlen(msg));
        send_str(c, head);
        send_str(c, msg);
    } else if (strstr(body, "mark-badjson")) {
        send_str(c, SSE_HEAD "data: {\"choices\": [tru\n\ndata: [DONE]\n\n");
    } else if (strstr(body, "mark-badline")) {
        send_str(c, SSE_HEAD "hello \xff world\n\ndata: [DONE]\n\n"); /* not even UTF-8 */
    }                     /* mark-hangup: nothing at all */
    shutdown(c, SHUT_WR); /* then drain, so closing sends FIN rather than RST */
    while (recv(c, req, sizeof req, 0) > 0)
        ;
}

static void *faulty_main(void *arg) {
    Faulty *f = arg;
    while (!f->stop) {
        struct pollfd p = {.fd = f->fd, .events = POLLIN};
        if (poll(&p, 1, 50) <= 0)
            continue;
        int c = accept(f->fd, NULL, NULL);
        if (c < 0)
            continue;
        faulty_answer(c);
        close(c);
    }
    return NULL;
}

static void test_faulty_endpoint_failures_are_counted(void **state) {
    (void)state;
    Faulty f = {.fd = socket(AF_INET, SOCK_STREAM, 0)};
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    assert_int_equal(bind(f.fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(f.fd, 64), 0);
    getsockname(f.fd, (struct sockaddr *)&a, &alen);
    f.port = ntohs(a.sin_port);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, faulty_main, &f), 0);

    static const struct {
        const char *mark, *reason;
    } cases[] = {
        {"mark-ok", ""},
        {"mark-drop", "closed mid-stream after 1 chunks"},
        {"mark-nodone", "closed mid-stream: the stream ended after 1 chunks"},
        {"mark-garbage", "bad HTTP response"},
        {"mark-http500", "HTTP 500: boom"},
        {"mark-badjson", "malformed SSE: event data is not a JSON object"},
        {"mark-badline", "malformed SSE: 'hello \xef\xbf\xbd world' is no SSE line"},
        {"mark-hangup", "closed before answering"},
    };
    int nc = sizeof cases / sizeof cases[0];
    char path[512];
    snprintf(path, sizeof path, "%s/faulty.jsonl", tmpdir);
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    for (int i = 0; i < nc; i++)
        fprintf(fp, "{\"prompt\": \"%s once upon a time\", \"max_tokens\": 3}\n", cases[i].mark);
    fclose(fp);
    RunResult r = run("bench serve --base-url http://127.0.0.1:%d --model fake --dataset-name "
                      "jsonl --dataset-path %s --max-concurrency 2 --timeout 20 --save-result "
                      "--result-dir %s --result-filename faulty.json",
                      f.port, path, tmpdir);
    f.stop = 1;
    pthread_join(th, NULL);
    close(f.fd);
    if (r.status != 0)
        print_error("exit %d\n%s%s", r.status, r.out, r.err);
    assert_int_equal(r.status, 0); /* one success: the run itself is fine */
    assert_int_equal((int)printed(r.out, "Successful requests:"), 1);
    assert_int_equal((int)printed(r.out, "Failed requests:"), nc - 1);
    assert_non_null(strstr(r.out, "Failed requests during benchmark run detected"));
    snprintf(path, sizeof path, "%s/faulty.json", tmpdir);
    json_t *j = load_json(path);
    json_t *errors = json_object_get(j, "errors");
    for (int i = 0; i < nc; i++) {
        const char *e = json_string_value(json_array_get(errors, (size_t)i));
        if (!e || !strstr(e, cases[i].reason) || (!cases[i].reason[0] && e[0])) {
            print_error("%s: error '%s', expected '%s'\n", cases[i].mark, e, cases[i].reason);
            fail();
        }
    }
    int n;
    double *outl = jarray(j, "output_lens", &n), *inl = jarray(j, "input_lens", &n);
    assert_int_equal((int)outl[0], 3); /* from the usage chunk */
    assert_int_equal((int)inl[0], 5);
    static const double no_slo[] = {-1, -1, -1};
    static const double p99[] = {99};
    check_result(j, r.out, p99, 1, no_slo);
    free(outl);
    free(inl);
    json_decref(j);
    run_free(&r);
}

static void test_unreachable_server(void **state) {
    (void)state;
    RunResult r = run("bench serve --base-url http://127.0.0.1:%d --model x --num-prompts 3 "
                      "--random-input-len 8 --random-output-len 2",
                      test_free_port());
    assert_int_equal(r.status, 1); /* every request failed */
    assert_int_equal((int)printed(r.out, "Failed requests:"), 3);
    assert_int_equal((int)printed(r.out, "Successful requests:"), 0);
    assert_non_null(strstr(r.out, "Error 0: connect error:"));
    assert_non_null(strstr(r.err, "every request failed"));
    run_free(&r);
    r = run("bench serve --base-url http://127.0.0.1:%d --num-prompts 3", test_free_port());
    assert_int_equal(r.status, 1); /* no model to ask for: one line that says so */
    assert_non_null(strstr(r.err, "cannot list the models (give --model)"));
    run_free(&r);
}

/* ---- in-process modes -------------------------------------------------------------------- */

static void test_throughput(void **state) {
    (void)state;
    char json[512];
    snprintf(json, sizeof json, "%s/tput.json", tmpdir);
    RunResult r = run("bench throughput --input-len 16 --output-len 8 --num-prompts 16 "
                      "--output-json %s",
                      json);
    assert_int_equal(r.status, 0);
    double rps, tps, ops;
    const char *line = strstr(r.out, "Throughput: ");
    assert_non_null(line);
    assert_int_equal(sscanf(line,
                            "Throughput: %lf requests/s, %lf total tokens/s, %lf output "
                            "tokens/s",
                            &rps, &tps, &ops),
                     3);
    assert_int_equal((long)printed(r.out, "Total num prompt tokens:"), 16 * 16);
    assert_int_equal((long)printed(r.out, "Total num output tokens:"), 16 * 8);
    assert_true(rps > 0);
    near(ops / rps, 8, 0.02 * 8, "output tokens per request");
    near(tps / rps, 24, 0.02 * 24, "tokens per request");
    json_t *j = load_json(json);
    near(jnum(j, "requests_per_second"), 16 / jnum(j, "elapsed_time"), 1e-9, "req/s json");
    near(jnum(j, "total_num_tokens"), 16 * 24, 0, "total tokens json");
    near(rps, jnum(j, "requests_per_second"), 0.005, "req/s printed");
    json_decref(j);
    run_free(&r);

    r = run("bench throughput --dataset-name jsonl --dataset-path " PROMPTS_JSONL);
    assert_int_equal(r.status, 0);
    assert_int_equal((long)printed(r.out, "Total num output tokens:"), 56);
    run_free(&r);
}

static void test_latency(void **state) {
    (void)state;
    char json[512];
    snprintf(json, sizeof json, "%s/lat.json", tmpdir);
    RunResult r = run("bench latency --batch-size 4 --input-len 8 --output-len 6 "
                      "--num-iters-warmup 1 --num-iters 3 --output-json %s",
                      json);
    assert_int_equal(r.status, 0);
    json_t *j = load_json(json);
    int n;
    double *lat = jarray(j, "latencies", &n);
    assert_int_equal(n, 3);
    near(jnum(j, "avg_latency"), r_mean(lat, n), 1e-12, "avg_latency");
    near(printed(r.out, "Avg latency:"), jnum(j, "avg_latency"), 0, "printed avg");
    static const int p[] = {10, 25, 50, 75, 90, 99};
    json_t *pj = json_object_get(j, "percentiles");
    for (int i = 0; i < 6; i++) {
        char key[8], label[64];
        snprintf(key, sizeof key, "%d", p[i]);
        near(jnum(pj, key), r_pct(lat, n, p[i]), 1e-12, key);
        snprintf(label, sizeof label, "%d%% percentile latency:", p[i]);
        near(printed(r.out, label), jnum(pj, key), 0, label);
    }
    assert_int_equal((int)jnum(j, "total_output_tokens"), 3 * 4 * 6);
    json_t *dec = json_object_get(j, "decode_step_ms");
    assert_int_equal((int)jnum(dec, "count"), 3 * (6 - 1)); /* every step after the first */
    assert_true(jnum(dec, "median") > 0 && jnum(dec, "median") < 1000);
    double *steps = jarray(j, "decode_step_times_ms", &n);
    near(jnum(dec, "median"), r_median(steps, n), 1e-9, "decode median");
    assert_non_null(strstr(r.out, "Decode step (batch 4): median "));
    free(steps);
    free(lat);
    json_decref(j);
    run_free(&r);
}

/* "pagellm: 20 decode graphs (batch 1 to 256) captured in 0.03 s", printed on a GPU. */
static int is_graph_line(const char *l) {
    const char *nl = strchr(l, '\n'), *hit = strstr(l, " decode graphs (");
    return !strncmp(l, "pagellm: ", 9) && hit && (!nl || hit < nl);
}

static void test_bad_flags_name_the_flag(void **state) {
    (void)state;
    static const struct {
        const char *args;
        int status;
        const char *needle;
    } cases[] = {
        {"bench", 2, "usage: pagellm bench"},
        {"bench frobnicate", 2, "frobnicate"},
        {"bench serve --bogus", 2, "'--bogus'"},
        {"bench serve --num-prompts abc", 2, "--num-prompts: 'abc' is not an integer"},
        {"bench serve --num-prompts", 2, "--num-prompts needs a value"},
        {"bench serve --request-rate -1", 2, "--request-rate"},
        {"bench serve --request-rate fast", 2, "--request-rate: 'fast'"},
        {"bench serve --burstiness 0", 2, "--burstiness"},
        {"bench serve --max-concurrency 0", 2, "--max-concurrency"},
        {"bench serve --percentile-metrics ttft,foo", 2, "unknown metric 'foo'"},
        {"bench serve --metric-percentiles 50,101", 2, "--metric-percentiles"},
        {"bench serve --goodput itl:5", 2, "--goodput: 'itl:5'"},
        {"bench serve --goodput", 2, "--goodput needs"},
        {"bench serve --dataset-name foo", 2, "--dataset-name: 'foo'"},
        {"bench serve --random-range-ratio 1.5", 2, "--random-range-ratio"},
        {"bench serve --sweep-rates 1,x", 2, "--sweep-rates: 'x'"},
        {"bench serve --endpoint /v1/embeddings --model m", 2, "--endpoint"},
        {"bench serve --model m --dataset-name sharegpt", 1, "needs --dataset-path"},
        {"bench serve --model m --dataset-name jsonl --dataset-path /nonexistent.jsonl", 1,
         "/nonexistent.jsonl"},
        {"bench serve --model m --tokenizer /nonexistent/dir", 1, "--tokenizer"},
        {"bench throughput --num-prompts 0", 2, "--num-prompts: 0 is out of range"},
        {"bench throughput --input-len 600 --output-len 8 --num-prompts 2", 1, "prompt 1"},
        {"bench throughput --batch-size 4", 2, "'--batch-size'"},
        {"bench latency --batch-size x", 2, "--batch-size: 'x'"},
        {"bench latency --block-size 7", 2, "--block-size"},
        {"bench latency --num-iters 0", 2, "--num-iters"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        RunResult r = run("%s", cases[i].args);
        int lines = 0; /* the engine's start-up lines (budget, graphs) are information */
        for (const char *l = r.err; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
            lines += strncmp(l, "pagellm: device ", 16) && strncmp(l, "pagellm: KV cache: ", 19) &&
                     strncmp(l, "pagellm: weights: ", 18) && !is_graph_line(l);
        int one_line = lines == 1;
        if (r.status != cases[i].status || !strstr(r.err, cases[i].needle) || (i >= 2 && !one_line))
            print_error("'%s': exit %d, stderr: %s\n", cases[i].args, r.status, r.err);
        assert_int_equal(r.status, cases[i].status);
        assert_non_null(strstr(r.err, cases[i].needle));
        if (i >= 2) /* the usage texts aside, an error is one line */
            assert_true(one_line);
        run_free(&r);
    }
    RunResult r = run("bench serve --help");
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "--max-concurrency"));
    run_free(&r);
}

/* ---- units --------------------------------------------------------------------------------- */

typedef struct {
    char got[8][64];
    int n;
} Events;

static int on_event(void *ctx, const char *data, size_t len) {
    Events *e = ctx;
    assert_true(e->n < 8 && len < 64);
    memcpy(e->got[e->n], data, len);
    e->got[e->n++][len] = '\0';
    return 0;
}

static void test_sse_parser_any_split(void **state) {
    (void)state;
    static const char stream[] = "data: {\"a\":1}\n\n: ping\n\ndata: x\r\ndata:y\r\n\r\n"
                                 "event: e\nid: 3\nretry: 10\ndata: [DONE]\n\ndata: tail";
    for (size_t split = 1; split <= sizeof stream - 1; split++) { /* every piece size */
        SseParser p = {0};
        Events e = {0};
        for (size_t at = 0; at < sizeof stream - 1; at += split) {
            size_t n = sizeof stream - 1 - at < split ? sizeof stream - 1 - at : split;
            assert_int_equal(sse_feed(&p, stream + at, n, on_event, &e), 0);
        }
        assert_int_equal(e.n, 3);
        assert_int_equal(sse_finish(&p, on_event, &e), 0);
        assert_int_equal(e.n, 4);
        assert_string_equal(e.got[0], "{\"a\":1}");
        assert_string_equal(e.got[1], "x\ny");
        assert_string_equal(e.got[2], "[DONE]");
        assert_string_equal(e.got[3], "tail");
        sse_free(&p);
    }
    SseParser p = {0};
    Events e = {0};
    assert_int_equal(sse_feed(&p, "HTTP/1.1 garbage\n\n", 18, on_event, &e), -1);
    assert_string_equal(p.bad, "HTTP/1.1 garbage");
    sse_free(&p);
}

static void test_numpy_statistics(void **state) {
    (void)state;
    const double a[] = {4, 1, 3, 2}, b[] = {15, 20, 35, 40, 50};
    near(bst_percentile(a, 4, 90), 3.7, 1e-12, "p90"); /* np.percentile([1,2,3,4], 90) */
    near(bst_percentile(b, 5, 40), 29.0, 1e-12, "p40");
    near(bst_percentile(b, 5, 0), 15, 0, "p0");
    near(bst_percentile(b, 5, 100), 50, 0, "p100");
    near(bst_median(a, 4), 2.5, 0, "median");
    near(bst_std(a, 4), 1.118033988749895, 1e-15, "std");
    near(bst_mean(NULL, 0), 0, 0, "empty mean"); /* vLLM's `x or 0` */
    near(bst_percentile(NULL, 0, 99), 0, 0, "empty percentile");
    static const struct {
        double v;
        const char *repr;
    } f[] = {{1.0, "1.0"},
             {0.25, "0.25"},
             {INFINITY, "inf"},
             {1e-05, "1e-05"},
             {0.1, "0.1"},
             {1e16, "1e+16"},
             {0.0001, "0.0001"},
             {2.5e-07, "2.5e-07"},
             {123456789.0, "123456789.0"},
             {1e15, "1000000000000000.0"},
             {0.0022464906666452102, "0.0022464906666452102"}};
    char buf[64];
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        assert_string_equal(bench_pyfloat(f[i].v, buf, sizeof buf), f[i].repr);
}

static void test_arrivals(void **state) {
    (void)state;
    enum { N = 4000 };
    static double t[N];
    for (int shape = 0; shape < 3; shape++) {
        double b = shape == 0 ? 1.0 : shape == 1 ? 4.0 : 0.25; /* CV of gaps: 1, 0.5, 2 */
        bench_arrivals(t, N, 50, b, 7);
        near(t[N - 1], N / 50.0, 1e-9, "last arrival at n / rate");
        double m = 0, s = 0, prev = 0;
        for (int i = 0; i < N; i++) {
            assert_true(t[i] >= prev);
            m += t[i] - prev;
            s += (t[i] - prev) * (t[i] - prev);
            prev = t[i];
        }
        m /= N;
        double cv = sqrt(s / N - m * m) / m;
        near(cv, 1 / sqrt(b), 0.15 / sqrt(b), "coefficient of variation of the gaps");
    }
    bench_arrivals(t, 10, INFINITY, 1, 0);
    for (int i = 0; i < 10; i++)
        assert_true(t[i] == 0);
}

static void test_datasets(void **state) {
    (void)state;
    Tokenizer *tok;
    assert_int_equal(tok_load(MODEL_DIR, &tok), PL_OK);
    BenchDatasetOptions o = bench_dataset_options_default();
    o.num_prompts = 40;
    o.input_len = 20;
    o.output_len = 10;
    o.range_ratio = 0.5;
    o.prefix_len = 3;
    o.seed = 7;
    BenchDataset a, b;
    assert_int_equal(bench_dataset_load(&o, tok, 1, &a), PL_OK);
    assert_int_equal(bench_dataset_load(&o, tok, 0, &b), PL_OK);
    assert_int_equal(a.n, 40);
    for (int i = 0; i < a.n; i++) {
        /* BOS + prefix + [floor(19 * 0.5), ceil(19 * 1.5)] random tokens */
        assert_in_range(a.items[i].prompt_len, 1 + 3 + 9, 1 + 3 + 29);
        assert_in_range(a.items[i].output_len, 5, 15);
        int32_t *ids;
        int n;
        const char *p = a.items[i].prompt;
        assert_int_equal(tok_encode(tok, p, strlen(p), 1, &ids, &n), PL_OK);
        assert_int_equal(n, a.items[i].prompt_len);
        assert_memory_equal(ids, a.items[i].ids, (size_t)n * sizeof *ids);
        assert_string_equal(p, b.items[i].prompt); /* same seed, same workload */
        assert_memory_equal(ids + 1, a.items[0].ids + 1, 3 * sizeof *ids); /* shared prefix */
        free(ids);
    }
    bench_dataset_free(&b);
    o.seed = 8;
    assert_int_equal(bench_dataset_load(&o, tok, 0, &b), PL_OK);
    assert_string_not_equal(a.items[0].prompt, b.items[0].prompt);
    bench_dataset_free(&a);
    bench_dataset_free(&b);

    /* ShareGPT: of 7 conversations only "a" (27 + 32 tokens) and "f" (first human turn
     * after a system turn: 23 + 41) pass vLLM's filter. */
    o = bench_dataset_options_default();
    o.kind = BENCH_DS_SHAREGPT;
    o.path = SHAREGPT_JSON;
    o.num_prompts = 5;
    assert_int_equal(bench_dataset_load(&o, tok, 0, &a), PL_OK);
    assert_int_equal(a.n, 5); /* two found, oversampled to five */
    int seen_a = 0, seen_f = 0;
    for (int i = 0; i < a.n; i++) {
        int is_a = a.items[i].prompt_len == 27 && a.items[i].output_len == 32;
        int is_f = a.items[i].prompt_len == 23 && a.items[i].output_len == 41;
        assert_true(is_a || is_f);
        seen_a |= is_a && i < 2;
        seen_f |= is_f && i < 2;
    }
    assert_true(seen_a && seen_f);
    bench_dataset_free(&a);
    o.sharegpt_output_len = 7;
    o.num_prompts = 2;
    assert_int_equal(bench_dataset_load(&o, tok, 0, &a), PL_OK);
    assert_int_equal(a.items[0].output_len, 7);
    bench_dataset_free(&a);

    char path[512];
    snprintf(path, sizeof path, "%s/bad.jsonl", tmpdir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"prompt\": \"ok\", \"max_tokens\": 4}\n\n{\"prompt\": 5}\n", f);
    fclose(f);
    o = bench_dataset_options_default();
    o.kind = BENCH_DS_JSONL;
    o.path = path;
    assert_int_equal(bench_dataset_load(&o, tok, 0, &a), PL_ERR_FORMAT);
    assert_non_null(strstr(pl_error(), "bad.jsonl:3"));
    tok_destroy(tok);
}

/* Issue 34: vLLM's defaults (1024-token random prompts) on a model of 512 tokens failed every
 * request. The lengths are fitted to the server's max_model_len (GET /v1/models) and stderr
 * says so; the fit keeps every request within it at the top of the range ratio. */
static void test_fit_to_max_model_len(void **state) {
    (void)state;
    char note[256];
    BenchDatasetOptions o = bench_dataset_options_default();
    assert_int_equal(bench_fit_model_len(&o, 512, note, sizeof note), 1);
    assert_int_equal(o.input_len, 384); /* the output (128) is kept */
    assert_int_equal(o.output_len, 128);
    assert_non_null(strstr(note, "--random-input-len 1024 -> 384"));
    assert_null(strstr(note, "--random-output-len"));
    assert_int_equal(bench_fit_model_len(&o, 512, note, sizeof note), 0); /* fits now */
    o = bench_dataset_options_default();
    assert_int_equal(bench_fit_model_len(&o, 0, note, sizeof note), 0); /* not listed */
    assert_int_equal(o.input_len, 1024);
    o.kind = BENCH_DS_JSONL;
    assert_int_equal(bench_fit_model_len(&o, 512, note, sizeof note), 0);
    /* a range ratio, a prefix and an output over half of the context */
    const int lens[] = {64, 100, 512, 1500};
    for (int k = 0; k < 4; k++) {
        o = bench_dataset_options_default();
        o.range_ratio = 0.5;
        o.prefix_len = 5;
        o.output_len = 300;
        assert_int_equal(bench_fit_model_len(&o, lens[k], note, sizeof note), 1);
        assert_true(o.input_len >= 1 && o.output_len >= 1);
        assert_true(5 + ceil(o.input_len * 1.5) + ceil(o.output_len * 1.5) <= lens[k]);
        if (lens[k] <= 512)
            assert_non_null(strstr(note, "--random-output-len 300 -> "));
    }
    /* the dataset made from fitted lengths stays within them */
    Tokenizer *tok;
    assert_int_equal(tok_load(MODEL_DIR, &tok), PL_OK);
    o = bench_dataset_options_default();
    o.num_prompts = 20;
    o.range_ratio = 0.25;
    assert_int_equal(bench_fit_model_len(&o, 512, note, sizeof note), 1);
    BenchDataset d;
    assert_int_equal(bench_dataset_load(&o, tok, 0, &d), PL_OK);
    for (int i = 0; i < d.n; i++)
        assert_true(d.items[i].prompt_len + d.items[i].output_len <= 512);
    bench_dataset_free(&d);
    tok_destroy(tok);
}

/* The same against the server: the defaults run, every request succeeds, stderr says why
 * the prompts are shorter than asked. */
static void test_defaults_fit_the_server(void **state) {
    (void)state;
    RunResult r =
        run("bench serve --base-url http://127.0.0.1:%d --num-prompts 4 --seed 3", server_port);
    if (r.status != 0)
        print_error("exit %d\n%s%s", r.status, r.out, r.err);
    assert_int_equal(r.status, 0);
    assert_int_equal((int)printed(r.out, "Successful requests:"), 4);
    assert_int_equal((int)printed(r.out, "Failed requests:"), 0);
    assert_non_null(strstr(r.err, "max_model_len is 512"));
    assert_non_null(strstr(r.err, "--random-input-len 1024 -> 384"));
    run_free(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sse_parser_any_split),
        cmocka_unit_test(test_numpy_statistics),
        cmocka_unit_test(test_arrivals),
        cmocka_unit_test(test_datasets),
        cmocka_unit_test(test_random_run_matches_server_and_recomputation),
        cmocka_unit_test(test_jsonl_run_poisson),
        cmocka_unit_test(test_chat_endpoint),
        cmocka_unit_test(test_sweep_writes_points_and_plot),
        cmocka_unit_test(test_faulty_endpoint_failures_are_counted),
        cmocka_unit_test(test_unreachable_server),
        cmocka_unit_test(test_fit_to_max_model_len),
        cmocka_unit_test(test_defaults_fit_the_server),
        cmocka_unit_test(test_throughput),
        cmocka_unit_test(test_latency),
        cmocka_unit_test(test_bad_flags_name_the_flag),
    };
    return cmocka_run_group_tests_name("bench", tests, group_setup, group_teardown);
}
