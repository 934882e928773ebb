/* bench.h - benchmarks: `pagellm bench serve` (a load generator for any OpenAI-compatible
 * server: libcurl multi, many streaming requests from one thread) and the in-process
 * `pagellm bench throughput` / `pagellm bench latency` (the engine API, no HTTP).
 *
 * The numbers mean what vLLM's `vllm bench serve | throughput | latency` mean: the same
 * datasets (random, ShareGPT, plus JSONL), the same arrival process (Poisson or gamma with
 * a burstiness shape), the same per-request measurements (TTFT, ITL, TPOT, E2EL) and the
 * same "Serving Benchmark Result" block and result JSON keys.
 *
 * Flag parsing follows config.h's cfg_parse_flag: a *_flag function takes argv[*i] when
 * it is one of its flags (returns 1, *i left on the last word used), returns 0 when it is
 * not, and -1 after printing a one-line error that names the flag. */
#ifndef PAGELLM_BENCH_H
#define PAGELLM_BENCH_H

#include <stdint.h>
#include <stdio.h>

#include "engine.h"
#include "tokenizer.h"

/* ---- workloads ------------------------------------------------------------------------- */

typedef enum { BENCH_DS_RANDOM, BENCH_DS_SHAREGPT, BENCH_DS_JSONL } BenchDatasetKind;

typedef struct {
    BenchDatasetKind kind;
    const char *path;        /* sharegpt / jsonl file; not owned */
    int num_prompts;         /* requests to make (default 1000) */
    int num_prompts_set;     /* given explicitly (jsonl: else every line once) */
    int input_len;           /* random: tokens per prompt, special tokens included (1024) */
    int output_len;          /* random: tokens to generate (128) */
    double range_ratio;      /* random: lengths uniform in [len*(1-r), len*(1+r)], [0, 1) */
    int prefix_len;          /* random: a shared random prefix of this many tokens (0) */
    int sharegpt_output_len; /* sharegpt: fixed output length; 0 = the reply's length */
    uint64_t seed;           /* sampling of lengths, tokens and ShareGPT order (0) */
} BenchDatasetOptions;

typedef struct {
    char *prompt;   /* owned; the text sent */
    int prompt_len; /* its tokens, as the server counts them (special tokens included) */
    int output_len; /* max_tokens asked for */
    int32_t *ids;   /* owned; the tokenized prompt (offline benchmarks); NULL for serve */
} BenchPrompt;

typedef struct {
    BenchPrompt *items;
    int n;
} BenchDataset;

/* vLLM's defaults listed above. */
BenchDatasetOptions bench_dataset_options_default(void);

/* Build the requests. `t` counts tokens (and makes the random prompts); with keep_ids each
 * prompt also gets its token ids. Errors (unreadable or malformed file, too few usable
 * entries, impossible lengths) name the file and line or the flag. */
Status bench_dataset_load(const BenchDatasetOptions *o, const Tokenizer *t, int keep_ids,
                          BenchDataset *out);
void bench_dataset_free(BenchDataset *d);

/* ---- bench serve ----------------------------------------------------------------------- */

enum { BENCH_TTFT, BENCH_TPOT, BENCH_ITL, BENCH_E2EL, BENCH_NUM_METRICS };
#define BENCH_MAX_PERCENTILES 16
#define BENCH_MAX_SWEEP       64

typedef struct {
    char *base_url;  /* owned; NULL = http://{host}:{port} */
    char *host;      /* owned; default 127.0.0.1 */
    int port;        /* default 8000 */
    char *endpoint;  /* owned; /v1/completions or /v1/chat/completions */
    char *model;     /* owned; NULL = the first id of GET /v1/models */
    char *tokenizer; /* owned; tokenizer.json folder; NULL = caller's default */
    char *label;     /* owned; result label; NULL = backend ("openai", "openai-chat") */
    BenchDatasetOptions data;
    char *dataset_path; /* owned copy behind data.path */
    int ignore_eos;
    double request_rate;            /* requests/s; INFINITY = all at once */
    double burstiness;              /* gamma shape of the inter-arrival times; 1 = Poisson */
    int max_concurrency;            /* requests in flight at most; 0 = no limit */
    int metrics[BENCH_NUM_METRICS]; /* percentile metrics shown (default ttft,tpot,itl) */
    double percentiles[BENCH_MAX_PERCENTILES]; /* --metric-percentiles (default 99) */
    int num_percentiles;
    double goodput_ms[BENCH_NUM_METRICS]; /* SLOs in ms for ttft, tpot, e2el; < 0 = none */
    int save_result;
    char *result_dir;      /* owned; NULL = the current folder */
    char *result_filename; /* owned; NULL = vLLM's {label}-{rate}qps-{model}-{date}.json */
    double sweep_rates[BENCH_MAX_SWEEP]; /* --sweep-rates; each may be INFINITY */
    int num_sweep_rates;
    int disable_progress;      /* --disable-tqdm */
    double temperature, top_p; /* sent only when >= 0 */
    int top_k;                 /* sent only when != -2 */
    double timeout_s;          /* per request; 0 = none (default 6 h, as vLLM) */
} BenchServeOptions;

void bench_serve_options_init(BenchServeOptions *o);
void bench_serve_options_free(BenchServeOptions *o);
int bench_serve_flag(BenchServeOptions *o, int argc, char **argv, int *i);
void bench_serve_print_help(FILE *f);

/* Run the benchmark (or the sweep) and print the results. Returns the exit code: 0 when
 * it ran (failed requests are results, counted and listed), 1 when it could not run
 * (no model, no tokenizer, bad dataset) or when every request failed. */
int bench_serve_run(const BenchServeOptions *o);

/* ---- bench throughput / latency -------------------------------------------------------- */

typedef struct {
    BenchDatasetOptions data; /* throughput: random (input/output len) or a dataset */
    char *dataset_path;       /* owned copy behind data.path */
    int batch_size;           /* latency: 8 */
    int num_iters_warmup;     /* latency: 10 */
    int num_iters;            /* latency: 30 */
    int swap_blocks;          /* latency: KV blocks to time a swap round trip of; 0 = none */
    char *json_schema;        /* latency: owned path of a JSON schema every request follows */
    char *output_json;        /* owned; NULL = none */
    int disable_progress;
} BenchOfflineOptions;

/* latency = 1 for `bench latency` defaults (input 32, output 128), else throughput's. */
void bench_offline_options_init(BenchOfflineOptions *o, int latency);
void bench_offline_options_free(BenchOfflineOptions *o);
int bench_offline_flag(BenchOfflineOptions *o, int latency, int argc, char **argv, int *i);
void bench_offline_print_help(FILE *f, int latency);

/* All prompts into the engine at once, stepped to completion (ignore_eos, temperature 1):
 * prints vLLM's "Throughput: ..." and token totals. `seed` seeds the prompts. */
int bench_throughput_run(Engine *e, const BenchOfflineOptions *o, uint64_t seed);

/* batch_size random prompts of input_len tokens, output_len tokens each (ignore_eos), run
 * to completion per iteration: prints vLLM's average and percentile latencies plus the
 * median time of a decode step. */
int bench_latency_run(Engine *e, const BenchOfflineOptions *o, uint64_t seed);

#endif
