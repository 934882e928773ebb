/* bench_internal.h - (internal to bench/) the pieces behind bench.h: a seeded random
 * generator, statistics as numpy computes them, an incremental SSE parser, the per-request
 * outcome of a streamed completion, vLLM's metrics over those outcomes, the result block and
 * JSON, and the libcurl multi client loop. */
#ifndef PAGELLM_BENCH_INTERNAL_H
#define PAGELLM_BENCH_INTERNAL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "bench.h"

/* ---- rng.c: xoshiro256** seeded through splitmix64 ------------------------------------ */

typedef struct {
    uint64_t s[4];
} BenchRng;

void brng_seed(BenchRng *r, uint64_t seed);
uint64_t brng_next(BenchRng *r);
double brng_uniform(BenchRng *r);                      /* [0, 1) */
int64_t brng_int(BenchRng *r, int64_t lo, int64_t hi); /* uniform in [lo, hi] */
double brng_normal(BenchRng *r);
double brng_gamma(BenchRng *r, double shape, double scale); /* shape > 0 */
void brng_shuffle_int(BenchRng *r, int *a, int n);

/* ---- stats.c: numpy semantics (an empty list reads as [0], as vLLM's `x or 0`) --------- */

double bst_mean(const double *x, int n);
double bst_std(const double *x, int n); /* population, np.std */
/* np.percentile(x, p) with linear interpolation, p in [0, 100]; x need not be sorted. */
double bst_percentile(const double *x, int n, double p);
double bst_median(const double *x, int n);

/* Python's repr of a float ("1.0", "0.25", "inf", "1e-05"): shortest text that reads back. */
const char *bench_pyfloat(double v, char *buf, size_t size);

/* ---- sse.c: text/event-stream, fed in arbitrary pieces --------------------------------- */

typedef struct {
    char *buf; /* bytes of the event being read */
    size_t len, cap;
    char *data; /* the current event's data lines, joined by "\n" */
    size_t data_len, data_cap;
    int has_data;
    char bad[96]; /* the offending line when sse_feed returns -1 */
} SseParser;

/* Called with each complete event's data (NUL-terminated); non-zero stops the feed. */
typedef int (*SseEventFn)(void *ctx, const char *data, size_t len);

/* Feed bytes. Events end at a blank line (\n\n or \r\n\r\n); "data:" lines are joined,
 * comment lines (":...") and the event/id/retry fields are skipped. Returns 0, the
 * callback's non-zero value, or -1 for a line that is no SSE field (p->bad holds it). */
int sse_feed(SseParser *p, const char *bytes, size_t n, SseEventFn fn, void *ctx);
/* End of stream: an event left without its blank line is delivered too (as vLLM's
 * client does). Same returns as sse_feed. */
int sse_finish(SseParser *p, SseEventFn fn, void *ctx);
void sse_free(SseParser *p);

/* ---- dataset*.c ------------------------------------------------------------------------ */

/* Tokens of text (-1 with the error set); *ids_out gets them when not NULL. */
int ds_count_tokens(const Tokenizer *t, const char *text, int add_special, int32_t **ids_out);
/* Append a prompt (takes prompt and ids). */
void ds_add(BenchDataset *d, int *cap, char *prompt, int prompt_len, int output_len, int32_t *ids);
void ds_add_copy(BenchDataset *d, int *cap, int k);
Status ds_load_random(const BenchDatasetOptions *o, const Tokenizer *t, int keep_ids,
                      BenchDataset *d);
Status ds_load_sharegpt(const BenchDatasetOptions *o, const Tokenizer *t, int keep_ids,
                        BenchDataset *d);
/* A copy of s with every invalid UTF-8 byte replaced by U+FFFD (JSON needs valid text). */
char *bench_utf8_copy(const char *s, size_t n);

/* ---- one request's outcome ------------------------------------------------------------- */

typedef struct {
    int success;
    int prompt_len;    /* from the dataset, replaced by usage.prompt_tokens */
    int output_len;    /* usage.completion_tokens, else the number of text chunks */
    double ttft;       /* seconds from sending to the first chunk with text */
    double latency;    /* E2EL: seconds from sending to the last chunk with text */
    double start_time; /* seconds from the benchmark's start to sending */
    double queue_time; /* seconds waiting for a --max-concurrency slot */
    double *itl;       /* gaps between consecutive text chunks */
    int num_itl;
    char *text;  /* generated text */
    char *error; /* NULL on success: "connect error: ...", "HTTP 500: ...", ... */
} BenchOutcome;

void bench_outcomes_free(BenchOutcome *o, int n);

/* ---- metrics.c: vLLM's calculate_metrics ----------------------------------------------- */

typedef struct {
    double mean, median, std;
    double pct[BENCH_MAX_PERCENTILES]; /* at the options' percentiles */
} BenchDist;

typedef struct {
    int completed, failed;
    long total_input, total_output;
    double duration;
    double request_throughput, request_goodput, output_throughput, total_token_throughput;
    double max_output_tokens_per_s;
    int max_concurrent_requests;
    BenchDist dist[BENCH_NUM_METRICS]; /* ms */
    int *output_lens;                  /* [n]: 0 for failed requests */
} BenchMetrics;

void bench_metrics_compute(const BenchOutcome *o, int n, double duration,
                           const BenchServeOptions *opt, BenchMetrics *m);
void bench_metrics_free(BenchMetrics *m);

/* ---- report.c: the printed block and the result JSON ------------------------------------ */

typedef struct {
    const char *backend; /* "openai" or "openai-chat" */
    const char *model_id;
    const char *tokenizer_id;
    double request_rate;
} BenchRunInfo;

void bench_report_print(FILE *f, const BenchMetrics *m, const BenchOutcome *o, int n,
                        const BenchServeOptions *opt, double request_rate);
/* vLLM's result JSON: run settings, summary, per-metric mean/median/std/pNN, and the
 * per-request arrays (input_lens, output_lens, ttfts, itls, latencies, start_times,
 * queue_times, generated_texts, errors). Caller owns the reference. */
json_t *bench_result_json(const BenchMetrics *m, const BenchOutcome *o, int n,
                          const BenchServeOptions *opt, const BenchRunInfo *info, const char *date);
/* Write JSON to path (making dir first when given); prints the path or the error. */
int bench_write_json(json_t *j, const char *dir, const char *name, char *path_out,
                     size_t path_size);
/* "ttft", "tpot", "itl", "e2el". */
const char *bench_metric_key(int k);
/* A percentile as vLLM names it: "99" for 99.0, "99.9" for 99.9. */
const char *bench_pword(double p, char *buf, size_t size);

/* ---- client.c: the libcurl multi loop -------------------------------------------------- */

typedef struct {
    const char *url;   /* base + endpoint */
    const char *model; /* "model" in each request */
    int chat;          /* chat/completions: messages + max_completion_tokens */
    const BenchServeOptions *opt;
} BenchClient;

/* Send every prompt at the arrival times of `request_rate` (with opt->burstiness and the
 * dataset seed), at most opt->max_concurrency at once; fill out[ds->n]. *duration gets
 * the benchmark's wall time. Returns 0, or -1 when libcurl cannot start (message printed). */
int bench_client_run(const BenchClient *c, const BenchDataset *ds, double request_rate,
                     BenchOutcome *out, double *duration);

/* The request body for one prompt (caller frees). */
char *bench_request_body(const BenchClient *c, const BenchPrompt *p);

/* Arrival offsets in seconds (vLLM's get_request: gamma gaps, rescaled so the last lands at
 * n / rate); all 0 for an infinite rate. */
void bench_arrivals(double *t, int n, double rate, double burstiness, uint64_t seed);

/* GET {base}/v1/models: the first model id (malloc'd), or NULL with *err set (malloc'd).
 * *max_model_len (when not NULL) gets the max_model_len the server lists for `model` (for the
 * first model when `model` is NULL), 0 when it lists none. */
char *bench_first_model(const char *base_url, const char *model, int *max_model_len, char **err);

/* Fit the random dataset's lengths into a server's max_model_len (prompt + max_tokens, at
 * the top of --random-range-ratio, with the prefix): the input length is lowered first, the
 * output length too when it alone takes more than half. Returns 1 when a length changed, with
 * a one-line note naming the flags in note; 0 when everything fits, the dataset is not random
 * or max_model_len is unknown (<= 0). */
int bench_fit_model_len(BenchDatasetOptions *o, int max_model_len, char *note, size_t size);

/* ---- sweep.c: --sweep-rates summary, data file and gnuplot PNG -------------------------- */

typedef struct {
    double rate; /* configured (INFINITY possible) */
    int completed, failed;
    double request_throughput, output_throughput;
    BenchDist dist[BENCH_NUM_METRICS];
} BenchSweepPoint;

/* Print the sweep table, write {dir}/{stem}.tsv and, through gnuplot, {dir}/{stem}.png
 * (latency median and percentiles against output throughput, one panel per metric).
 * Without gnuplot it says so and keeps the data. Returns 1 when the PNG was written. */
int bench_sweep_report(const BenchSweepPoint *p, int n, const BenchServeOptions *o,
                       const char *model, const char *dir, const char *stem);

/* ---- throughput.c / latency.c ----------------------------------------------------------- */

/* n random prompt ids in the model's vocabulary, no BOS or EOS among them. */
int32_t *bench_random_ids(BenchRng *rng, int n, const Engine *e);
/* Write j (reference taken) to path, indented as vLLM's --output-json; 0 on failure. */
int bench_write_offline_json(json_t *j, const char *path);
/* Print where the engine's pure-decode steps between two eng_stats snapshots spent their
 * time, per step, and the share of the host-only phases (nothing when there were none). */
void bench_print_decode_phases(const EngineStats *before, const EngineStats *after);

/* ---- progress.c ------------------------------------------------------------------------- */

typedef struct {
    int total, done, failed;
    int tty; /* redraw one line; else a line at each quarter */
    int disabled;
    int last_quarter;
    double t0, last_draw;
    const char *what;
} BenchProgress;

void bench_progress_start(BenchProgress *p, int total, const char *what, int disabled);
void bench_progress_step(BenchProgress *p, int ok);
void bench_progress_tick(BenchProgress *p); /* redraw now and then on a terminal */
void bench_progress_end(BenchProgress *p);

/* ---- flags.c: shared flag helpers ------------------------------------------------------- */

/* If argv[*i] is `--name` or `--name=V`, set *value (the next word, or V) and return 1;
 * a missing value prints "pagellm bench CMD: --name needs a value" and returns -1; any
 * other word returns 0. */
int bflag_value(const char *cmd, const char *name, int argc, char **argv, int *i,
                const char **value);
int bflag_int(const char *cmd, const char *flag, const char *s, long lo, long hi, int *out);
int bflag_double(const char *cmd, const char *flag, const char *s, double lo, double hi,
                 double *out);
/* Replace an owned string. */
void bflag_set_str(char **dst, const char *s);
/* The dataset flags shared by serve and throughput (--dataset-name, --dataset-path,
 * --num-prompts, --input-len, --output-len, --random-*, --sharegpt-output-len, --seed when
 * with_seed): 1 / 0 / -1 as a *_flag function. */
int bflag_dataset(const char *cmd, BenchDatasetOptions *d, char **path_owned, int with_seed,
                  int argc, char **argv, int *i);

#endif
