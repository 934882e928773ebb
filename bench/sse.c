/* sse.c - an incremental text/event-stream parser: bytes arrive in whatever pieces the
 * socket gives (an event split anywhere, several events in one read); complete events come
 * out through a callback with their data lines joined. A line that is no SSE field is
 * reported, so a server answering garbage counts as "malformed SSE", not as silence. */
#include <stdlib.h>
#include <string.h>

#include "bench_internal.h"

static void grow(char **buf, size_t *cap, size_t need) {
    if (need > *cap) {
        *cap = need * 2 > 256 ? need * 2 : 256;
        *buf = pl_xrealloc(*buf, *cap);
    }
}

static void data_add(SseParser *p, const char *s, size_t n) {
    size_t extra = p->has_data ? 1 : 0;
    grow(&p->data, &p->data_cap, p->data_len + extra + n + 1);
    if (p->has_data)
        p->data[p->data_len++] = '\n';
    memcpy(p->data + p->data_len, s, n);
    p->data_len += n;
    p->data[p->data_len] = '\0';
    p->has_data = 1;
}

/* Dispatch the event gathered so far (if it has data). */
static int dispatch(SseParser *p, SseEventFn fn, void *ctx) {
    if (!p->has_data)
        return 0;
    p->has_data = 0;
    size_t n = p->data_len;
    p->data_len = 0;
    return fn(ctx, p->data, n);
}

/* One line without its terminator. Empty: end of event. */
static int line(SseParser *p, const char *s, size_t n, SseEventFn fn, void *ctx) {
    if (n == 0)
        return dispatch(p, fn, ctx);
    if (s[0] == ':') /* comment, e.g. a keep-alive ping */
        return 0;
    const char *colon = memchr(s, ':', n);
    size_t name_len = colon ? (size_t)(colon - s) : n;
    const char *value = colon ? colon + 1 : s + n;
    size_t value_len = (size_t)(s + n - value);
    if (value_len && value[0] == ' ') {
        value++;
        value_len--;
    }
    if (name_len == 4 && !memcmp(s, "data", 4)) {
        data_add(p, value, value_len);
        return 0;
    }
    if ((name_len == 5 && !memcmp(s, "event", 5)) || (name_len == 2 && !memcmp(s, "id", 2)) ||
        (name_len == 5 && !memcmp(s, "retry", 5)))
        return 0;
    size_t k = n < sizeof p->bad - 1 ? n : sizeof p->bad - 1;
    memcpy(p->bad, s, k);
    p->bad[k] = '\0';
    return -1;
}

int sse_feed(SseParser *p, const char *bytes, size_t n, SseEventFn fn, void *ctx) {
    grow(&p->buf, &p->cap, p->len + n + 1);
    memcpy(p->buf + p->len, bytes, n);
    p->len += n;
    size_t start = 0;
    int rc = 0;
    for (size_t i = 0; i < p->len && rc == 0; i++) {
        if (p->buf[i] != '\n' && p->buf[i] != '\r')
            continue;
        if (p->buf[i] == '\r' && i + 1 == p->len)
            break; /* a \r\n may be split across reads: wait for the next byte */
        size_t end = i;
        if (p->buf[i] == '\r' && p->buf[i + 1] == '\n')
            i++;
        rc = line(p, p->buf + start, end - start, fn, ctx);
        start = i + 1;
    }
    memmove(p->buf, p->buf + start, p->len - start);
    p->len -= start;
    return rc;
}

int sse_finish(SseParser *p, SseEventFn fn, void *ctx) {
    int rc = 0;
    size_t n = p->len;
    while (n && (p->buf[n - 1] == '\r' || p->buf[n - 1] == ' ' || p->buf[n - 1] == '\t'))
        n--;
    if (n)
        rc = line(p, p->buf, n, fn, ctx);
    p->len = 0;
    if (rc == 0)
        rc = dispatch(p, fn, ctx);
    return rc;
}

void sse_free(SseParser *p) {
    free(p->buf);
    free(p->data);
    memset(p, 0, sizeof *p);
}
