/* metrics.h - the numbers behind GET /metrics, in Prometheus text exposition format 0.0.4.
 *
 * Names follow vLLM's with a `pagellm:` prefix (pagellm:num_requests_running,
 * pagellm:time_to_first_token_seconds, ...) and every sample carries a model_name label, so
 * dashboards and tooling written for vLLM work unchanged after a prefix substitution.
 * Histogram buckets are vLLM's (vllm/v1/metrics/loggers.py); the token-count histograms use
 * vLLM's 1-2-5 series up to 100000 (vLLM stops the series at max-model-len).
 *
 * Two kinds of numbers:
 *   - observations kept here: per-request histograms and counters (met_request_done),
 *     inter-token latency (met_observe_itl) and HTTP statuses (met_http_request). These may
 *     be called from any thread at any rate: each is a short critical section under one
 *     mutex (no allocation, no formatting).
 *   - engine state passed to met_render as an EngineStats snapshot (eng_stats): queue
 *     lengths, cache usage, preemptions, swapped blocks, token and prefix-cache counters.
 *
 * met_render copies the observations under the lock and formats outside it, so a scrape
 * never stalls the engine; within a histogram the buckets, _sum and _count always agree. */
#ifndef PAGELLM_METRICS_H
#define PAGELLM_METRICS_H

#include "engine.h"

typedef struct Metrics Metrics;

/* One finished request (any finish reason, aborts included). */
typedef struct {
    double queue_seconds; /* arrival -> first scheduled; < 0: never scheduled, not observed */
    double ttft_seconds;  /* arrival -> first output token; < 0: no token, not observed */
    double e2e_seconds;   /* arrival -> finished */
    int prompt_tokens;
    int generation_tokens;
    /* "stop", "length" or "abort" (eng_finish_reason_str). Anything else, NULL included, is
     * counted as finished_reason="other" (label values stay a small fixed set). */
    const char *finish_reason;
} MetRequestTimes;

/* model_name is the served model name put in every sample's model_name label (copied; any
 * bytes, escaped on output). NULL means "". Never fails (allocation failure aborts). */
Metrics *met_create(const char *model_name);
void met_destroy(Metrics *m); /* NULL is fine */

/* A request finished: observes request_queue_time_seconds, time_to_first_token_seconds,
 * e2e_request_latency_seconds, request_prompt_tokens, request_generation_tokens and counts
 * request_success_total{finished_reason}. NaN times are skipped. Thread-safe. */
void met_request_done(Metrics *m, const MetRequestTimes *t);

/* Time between two consecutive output tokens of one sequence (every token after the first):
 * time_per_output_token_seconds, vLLM's inter-token latency. NaN is skipped. Thread-safe. */
void met_observe_itl(Metrics *m, double seconds);

/* An HTTP response was sent: pagellm:http_requests_total{status="404"}. Common codes (200,
 * 400, 401, 403, 404, 405, 408, 413, 422, 429, 500, 501, 503, 504) keep their own label;
 * any other code is counted under its class ("2xx" ... "5xx"), and anything outside
 * 100..599 as "other". Thread-safe. */
void met_http_request(Metrics *m, int status);

/* The whole exposition text (malloc'd, NUL-terminated, caller frees): engine gauges and
 * counters from `s` (NULL = all zero, e.g. while the model loads) followed by the observed
 * histograms and counters. Every family has one # HELP and one # TYPE line. Numbers are
 * printed in the C locale whatever the process locale. Thread-safe. Serve it with
 * Content-Type MET_CONTENT_TYPE. */
char *met_render(Metrics *m, const EngineStats *s);

#define MET_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

#endif
