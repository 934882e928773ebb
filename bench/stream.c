/* stream.c - what one streamed completion measures, as vLLM's client does: TTFT is the
 * time to the first chunk carrying text, each later text chunk adds an inter-token latency,
 * E2EL ends at the last text chunk; generated tokens come from the final usage chunk
 * (usage.completion_tokens, stream_options.include_usage), else from the number of text
 * chunks. A transfer that ends any other way than with a complete stream is a failure with
 * a reason that says which way. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"

static void buf_add(Buf *b, const char *s, size_t n, size_t limit) {
    if (limit && b->len + n > limit)
        n = b->len < limit ? limit - b->len : 0;
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->p = pl_xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

size_t buf_write(char *ptr, size_t size, size_t nmemb, void *userdata) {
    buf_add(userdata, ptr, size * nmemb, 0);
    return size * nmemb;
}

static char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static char *fmt(const char *f, ...) {
    va_list ap;
    va_start(ap, f);
    char *s = NULL;
    if (vasprintf(&s, f, ap) < 0)
        s = pl_xstrdup(f);
    va_end(ap);
    return s;
}

/* Up to 120 bytes of s as one printable line (for messages). */
static void snippet(const char *s, size_t n, char *out, size_t size) {
    size_t k = 0;
    for (size_t i = 0; i < n && k + 4 < size && i < 120; i++)
        out[k++] = (s[i] == '\n' || s[i] == '\r' || s[i] == '\t') ? ' ' : s[i];
    if (n > 120 && k + 4 < size) {
        memcpy(out + k, "...", 3);
        k += 3;
    }
    out[k] = '\0';
}

static void fail(Xfer *x, char *why) {
    if (!x->error)
        x->error = why;
    else
        free(why);
}

/* One SSE event's data. */
static int on_event(void *ctx, const char *data, size_t len) {
    Xfer *x = ctx;
    char snip[160];
    if (x->done_seen)
        return 0; /* anything after [DONE] is ignored */
    if (len == 6 && !memcmp(data, "[DONE]", 6)) {
        x->done_seen = 1;
        return 0;
    }
    json_t *j = json_loadb(data, len, 0, NULL);
    if (!json_is_object(j)) {
        json_decref(j);
        snippet(data, len, snip, sizeof snip);
        fail(x, x->at_end ? fmt("closed mid-stream: the last event is incomplete ('%s')", snip)
                          : fmt("malformed SSE: event data is not a JSON object: '%s'", snip));
        return 1;
    }
    json_t *err = json_object_get(j, "error");
    if (err && !json_is_null(err)) {
        const char *m = json_string_value(json_object_get(err, "message"));
        snippet(m ? m : data, strlen(m ? m : data), snip, sizeof snip);
        fail(x, fmt("server error in stream: %s", snip));
        json_decref(j);
        return 1;
    }
    json_t *choices = json_object_get(j, "choices");
    if (json_array_size(choices) > 0) {
        json_t *c0 = json_array_get(choices, 0);
        const char *text =
            x->c->chat ? json_string_value(json_object_get(json_object_get(c0, "delta"), "content"))
                       : json_string_value(json_object_get(c0, "text"));
        x->num_chunks++;
        if (!x->first_chunk)
            x->first_chunk = x->now;
        if (text && *text) {
            if (x->num_ts == x->cap_ts) {
                x->cap_ts = x->cap_ts ? 2 * x->cap_ts : 64;
                x->ts = pl_xrealloc(x->ts, (size_t)x->cap_ts * sizeof *x->ts);
            }
            x->ts[x->num_ts++] = x->now;
            buf_add(&x->text, text, strlen(text), 0);
        }
        if (json_string_value(json_object_get(c0, "finish_reason")))
            x->finish_seen = 1;
    }
    json_t *usage = json_object_get(j, "usage");
    if (json_is_object(usage)) {
        json_t *ct = json_object_get(usage, "completion_tokens");
        json_t *pt = json_object_get(usage, "prompt_tokens");
        if (json_is_integer(ct))
            x->usage_completion = (int)json_integer_value(ct);
        if (json_is_integer(pt))
            x->usage_prompt = (int)json_integer_value(pt);
    }
    json_decref(j);
    return 0;
}

size_t xfer_on_write(char *ptr, size_t size, size_t nmemb, void *userdata) {
    Xfer *x = userdata;
    size_t n = size * nmemb;
    if (!x->status)
        curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &x->status);
    if (x->status != 200) {
        buf_add(&x->errbody, ptr, n, 1024);
        return n;
    }
    x->now = pl_now();
    int rc = sse_feed(&x->sse, ptr, n, on_event, x);
    if (rc == -1)
        fail(x, fmt("malformed SSE: '%s' is no SSE line", x->sse.bad));
    return rc ? 0 : n; /* anything but n aborts the transfer */
}

/* The message of an HTTP error body: OpenAI's error.message, else the text itself. */
static char *http_error(const Xfer *x) {
    char snip[160] = "";
    json_t *j = x->errbody.p ? json_loads(x->errbody.p, 0, NULL) : NULL;
    json_t *err = json_object_get(j, "error");
    const char *m = json_string_value(json_object_get(err, "message"));
    if (!m)
        m = json_string_value(err);
    if (!m)
        m = json_string_value(json_object_get(j, "message"));
    if (!m)
        m = json_string_value(json_object_get(j, "detail"));
    if (m)
        snippet(m, strlen(m), snip, sizeof snip);
    else if (x->errbody.len)
        snippet(x->errbody.p, x->errbody.len, snip, sizeof snip);
    json_decref(j);
    return snip[0] ? fmt("HTTP %ld: %s", x->status, snip) : fmt("HTTP %ld", x->status);
}

static char *curl_failure(const Xfer *x, CURLcode res) {
    const char *m = x->errbuf[0] ? x->errbuf : curl_easy_strerror(res);
    switch (res) {
        case CURLE_COULDNT_CONNECT:
        case CURLE_COULDNT_RESOLVE_HOST:
        case CURLE_COULDNT_RESOLVE_PROXY:
            return fmt("connect error: %s", m);
        case CURLE_OPERATION_TIMEDOUT:
            return fmt("timeout: %s", m);
        case CURLE_GOT_NOTHING:
            return fmt("closed before answering: %s", m);
        case CURLE_WEIRD_SERVER_REPLY:
        case CURLE_UNSUPPORTED_PROTOCOL:
            return fmt("bad HTTP response: %s", m);
        case CURLE_PARTIAL_FILE:
        case CURLE_RECV_ERROR:
        case CURLE_SEND_ERROR:
            if (x->status == 200)
                return fmt("closed mid-stream after %d chunks: %s", x->num_chunks, m);
            return fmt("connection error: %s", m);
        default:
            return fmt("transfer error: %s", m);
    }
}

void xfer_settle(Xfer *x, CURLcode res) {
    BenchOutcome *o = x->out;
    if (!x->error && res == CURLE_OK && x->status == 200) {
        x->at_end = 1; /* an event cut off by the end of the body */
        if (sse_finish(&x->sse, on_event, x) == -1)
            fail(x, fmt("malformed SSE: '%s' is no SSE line", x->sse.bad));
    }
    o->prompt_len = x->usage_prompt >= 0 ? x->usage_prompt : x->prompt_len;
    o->start_time = x->t_send - x->t0;
    o->queue_time = x->queue_time;
    char *why = NULL;
    if (x->error) {
        why = x->error;
        x->error = NULL;
    } else if (res != CURLE_OK) {
        why = curl_failure(x, res);
    } else if (x->status != 200) {
        why = http_error(x);
    } else if (!x->done_seen && !x->finish_seen) {
        why = fmt("closed mid-stream: the stream ended after %d chunks without a finish_reason "
                  "or [DONE]",
                  x->num_chunks);
    } else if (x->num_chunks == 0) {
        why = fmt("no tokens: the stream held no completion chunk");
    }
    if (why) {
        o->error = why;
        o->success = 0;
        return;
    }
    o->success = 1;
    if (x->num_ts > 0) {
        o->ttft = x->ts[0] - x->t_send;
        o->latency = x->ts[x->num_ts - 1] - x->t_send;
        o->num_itl = x->num_ts - 1;
        o->itl = pl_xmalloc((size_t)(o->num_itl > 0 ? o->num_itl : 1) * sizeof *o->itl);
        for (int i = 1; i < x->num_ts; i++)
            o->itl[i - 1] = x->ts[i] - x->ts[i - 1];
    } else { /* chunks without text only (e.g. special tokens): time the first */
        o->ttft = o->latency = x->first_chunk - x->t_send;
    }
    o->output_len = x->usage_completion >= 0 ? x->usage_completion : x->num_ts;
    o->text = x->text.p ? x->text.p : pl_xstrdup("");
    x->text.p = NULL;
}

void xfer_free(Xfer *x) {
    if (!x)
        return;
    curl_easy_cleanup(x->easy);
    free(x->body);
    sse_free(&x->sse);
    free(x->ts);
    free(x->text.p);
    free(x->errbody.p);
    free(x->error);
    free(x);
}

void bench_outcomes_free(BenchOutcome *o, int n) {
    for (int i = 0; o && i < n; i++) {
        free(o[i].itl);
        free(o[i].text);
        free(o[i].error);
    }
}
