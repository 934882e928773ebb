/* fuzz_sse.c - libFuzzer target: what `pagellm bench serve` does with a server's streamed
 * answer. Two layers:
 *
 *   1. bench/sse.c (sse_feed / sse_finish): the stream is fed whole and again in random
 *      pieces (split anywhere, \r\n pairs included); both must deliver the same events,
 *      the same return code and the same offending line.
 *   2. bench/stream.c (xfer_on_write / xfer_settle, libcurl's write callback and the end
 *      of a transfer): the pieces go through a real Xfer as libcurl would hand them over,
 *      with the HTTP status and the transfer's CURLcode taken from the input; the outcome
 *      must be a success or carry an error, never both, and the result JSON built from it
 *      (bench_metrics_compute + bench_result_json, as --save-result does) must serialise
 *      with one entry per request.
 *
 * Input layout:
 *   byte 0   flags: bit 0 chat endpoint; bits 1-2 HTTP status (0,1: 200; 2: 500; 3: 404);
 *            bits 3-5 the transfer's end (0-3 CURLE_OK, 4 PARTIAL_FILE, 5 RECV_ERROR,
 *            6 OPERATION_TIMEDOUT, 7 WEIRD_SERVER_REPLY)
 *   byte 1   seed of the split points
 *   rest     the response body bytes */
#include <math.h>

#include "bench_internal.h"
#include "client_internal.h"
#include "fuzz_common.h"

/* ---- layer 1 -------------------------------------------------------------------------- */

typedef struct {
    char *p;
    size_t len, cap;
    int count;
} Events;

static int on_event(void *ctx, const char *data, size_t len) {
    Events *e = ctx;
    FUZZ_CHECK(data[len] == '\0', "event data not NUL-terminated");
    size_t need = e->len + len + 16;
    if (need > e->cap) {
        e->cap = need * 2;
        e->p = realloc(e->p, e->cap);
    }
    e->len += (size_t)sprintf(e->p + e->len, "%zu:", len);
    memcpy(e->p + e->len, data, len);
    e->len += len;
    e->count++;
    return len == 4 && !memcmp(data, "STOP", 4) ? 7 : 0; /* a callback may stop the feed */
}

typedef struct {
    uint32_t s;
} Rng;

static uint32_t rng_next(Rng *r) {
    r->s ^= r->s << 13;
    r->s ^= r->s >> 17;
    r->s ^= r->s << 5;
    return r->s;
}

/* Length of the next piece: mostly tiny (1-3 bytes, to cut every \r\n and field name),
 * sometimes larger. */
static size_t piece_len(Rng *r, size_t left) {
    uint32_t x = rng_next(r);
    size_t n = (x & 3) ? 1 + (x >> 8) % 3 : 1 + (x >> 8) % 64;
    return n < left ? n : left;
}

typedef struct {
    int rc;
    char bad[96];
    Events ev;
} Parse;

static void parse(const char *body, size_t n, uint8_t seed, int whole, Parse *out) {
    SseParser p;
    memset(&p, 0, sizeof p);
    memset(out, 0, sizeof *out);
    Rng r = {0x9e3779b9u ^ (seed * 0x01000193u) ^ (uint32_t)n};
    if (!r.s)
        r.s = 1;
    int rc = 0;
    size_t at = 0;
    if (whole) {
        rc = sse_feed(&p, body, n, on_event, &out->ev);
        at = n;
    }
    while (rc == 0 && at < n) {
        size_t k = piece_len(&r, n - at);
        rc = sse_feed(&p, body + at, k, on_event, &out->ev);
        at += k;
    }
    if (rc == 0)
        rc = sse_finish(&p, on_event, &out->ev);
    out->rc = rc;
    if (rc == -1)
        memcpy(out->bad, p.bad, sizeof out->bad);
    FUZZ_CHECK(rc == 0 || rc == -1 || rc == 7, "sse returned %d", rc);
    sse_free(&p);
}

static void layer1(const char *body, size_t n, uint8_t seed) {
    Parse a, b;
    parse(body, n, seed, 1, &a);
    parse(body, n, seed, 0, &b);
    FUZZ_CHECK(a.rc == b.rc, "return code %d whole, %d in pieces", a.rc, b.rc);
    FUZZ_CHECK(a.ev.count == b.ev.count && a.ev.len == b.ev.len &&
                   (a.ev.len == 0 || !memcmp(a.ev.p, b.ev.p, a.ev.len)),
               "events differ: %d whole, %d in pieces\n  whole:  %.*s\n  pieces: %.*s", a.ev.count,
               b.ev.count, (int)a.ev.len, a.ev.p ? a.ev.p : "", (int)b.ev.len,
               b.ev.p ? b.ev.p : "");
    if (a.rc == -1)
        FUZZ_CHECK(!strcmp(a.bad, b.bad), "bad line '%s' whole, '%s' in pieces", a.bad, b.bad);
    free(a.ev.p);
    free(b.ev.p);
}

/* ---- layer 2 -------------------------------------------------------------------------- */

static void layer2(const char *body, size_t n, uint8_t flags, uint8_t seed) {
    static const long statuses[] = {200, 200, 500, 404};
    static const CURLcode ends[] = {CURLE_OK,
                                    CURLE_OK,
                                    CURLE_OK,
                                    CURLE_OK,
                                    CURLE_PARTIAL_FILE,
                                    CURLE_RECV_ERROR,
                                    CURLE_OPERATION_TIMEDOUT,
                                    CURLE_WEIRD_SERVER_REPLY};
    BenchServeOptions opt;
    bench_serve_options_init(&opt);
    BenchClient client = {
        .url = "http://127.0.0.1:1/v1/completions", .model = "m", .chat = flags & 1, .opt = &opt};
    BenchOutcome out;
    memset(&out, 0, sizeof out);

    Xfer *x = pl_xcalloc(1, sizeof *x);
    x->c = &client;
    x->out = &out;
    x->prompt_len = 5;
    x->usage_prompt = x->usage_completion = -1;
    x->t0 = pl_now();
    x->t_send = x->t0;
    x->status = statuses[(flags >> 1) & 3]; /* as if libcurl had the headers */

    Rng r = {0x85ebca6bu ^ (seed * 0x27d4eb2du) ^ (uint32_t)n};
    if (!r.s)
        r.s = 1;
    CURLcode res = ends[(flags >> 3) & 7];
    size_t at = 0;
    while (at < n) {
        size_t k = piece_len(&r, n - at);
        size_t got = xfer_on_write((char *)body + at, 1, k, x);
        at += k;
        if (got != k) { /* libcurl ends the transfer with a write error */
            res = CURLE_WRITE_ERROR;
            break;
        }
    }
    xfer_settle(x, res);

    FUZZ_CHECK(out.success == (out.error == NULL), "success %d with error %s", out.success,
               out.error ? out.error : "(none)");
    if (out.error)
        FUZZ_CHECK(out.error[0], "empty error message");
    if (out.success) {
        FUZZ_CHECK(x->status == 200 && res == CURLE_OK, "success with HTTP %ld, CURLcode %d",
                   x->status, (int)res);
        FUZZ_CHECK(out.text != NULL, "success without text");
        FUZZ_CHECK(fz_utf8_valid(out.text, strlen(out.text)), "generated text is not UTF-8");
        FUZZ_CHECK(out.output_len >= 0, "output_len %d", out.output_len);
        FUZZ_CHECK(out.num_itl >= 0 && (out.num_itl == 0 || out.itl), "num_itl %d", out.num_itl);
        FUZZ_CHECK(isfinite(out.ttft) && isfinite(out.latency), "ttft %g latency %g", out.ttft,
                   out.latency);
    }

    /* What --save-result writes for this one request. */
    BenchMetrics m;
    memset(&m, 0, sizeof m);
    bench_metrics_compute(&out, 1, 1.0, &opt, &m);
    BenchRunInfo info = {.backend = client.chat ? "openai-chat" : "openai",
                         .model_id = "m",
                         .tokenizer_id = "t",
                         .request_rate = INFINITY};
    json_t *j = bench_result_json(&m, &out, 1, &opt, &info, "20260101-000000");
    FUZZ_CHECK(j != NULL, "bench_result_json returned NULL");
    char *s = json_dumps(j, JSON_COMPACT);
    FUZZ_CHECK(s != NULL, "result JSON does not serialise");
    FUZZ_CHECK(json_array_size(json_object_get(j, "errors")) == 1 &&
                   json_array_size(json_object_get(j, "generated_texts")) == 1,
               "result JSON lost the request: %s", s);
    free(s);
    json_decref(j);
    bench_metrics_free(&m);

    bench_outcomes_free(&out, 1);
    xfer_free(x); /* x->easy is NULL: curl_easy_cleanup(NULL) is a no-op */
    bench_serve_options_free(&opt);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2)
        return 0;
    const char *body = (const char *)data + 2;
    size_t n = size - 2;
    layer1(body, n, data[1]);
    layer2(body, n, data[0], data[1]);
    return 0;
}
