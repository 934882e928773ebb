/* client_internal.h - (internal to bench/client.c and bench/stream.c) one in-flight
 * streaming request: its libcurl handle, SSE parser, chunk timestamps, usage and the
 * failure reason if any. */
#ifndef PAGELLM_BENCH_CLIENT_INTERNAL_H
#define PAGELLM_BENCH_CLIENT_INTERNAL_H

#include <curl/curl.h>

#include "bench_internal.h"

typedef struct {
    char *p;
    size_t len, cap;
} Buf;

typedef struct {
    CURL *easy;
    char *body; /* the request */
    const BenchClient *c;
    BenchOutcome *out;
    int prompt_len;    /* the dataset's count, until usage says otherwise */
    double t0;         /* the benchmark's start (pl_now) */
    double t_send;     /* pl_now when handed to libcurl */
    double queue_time; /* waited for a concurrency slot */
    double now;        /* arrival time of the bytes being parsed */
    SseParser sse;
    double *ts; /* arrival times of the chunks carrying text */
    int num_ts, cap_ts;
    double first_chunk;                 /* first chunk with choices, text or not (0 = none) */
    int num_chunks;                     /* chunks with choices */
    Buf text;                           /* generated text */
    long status;                        /* HTTP status, once headers are in */
    Buf errbody;                        /* body of a non-200 answer (first KiB) */
    int usage_prompt, usage_completion; /* -1 = no usage chunk */
    int done_seen, finish_seen, at_end;
    char *error; /* failure reason found while parsing */
    char errbuf[CURL_ERROR_SIZE];
} Xfer;

/* libcurl write callback: SSE parsing and timestamps (or the error body). */
size_t xfer_on_write(char *ptr, size_t size, size_t nmemb, void *userdata);
/* Transfer over: fill x->out (success with timings, or the failure reason). */
void xfer_settle(Xfer *x, CURLcode res);
void xfer_free(Xfer *x);

/* libcurl write callback appending to a Buf. */
size_t buf_write(char *ptr, size_t size, size_t nmemb, void *userdata);

#endif
