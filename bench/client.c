/* client.c - the load generator's engine room: one thread, one libcurl multi handle, many
 * streaming requests in flight. Requests arrive at precomputed times (vLLM's Poisson or
 * gamma process), wait for a --max-concurrency slot, and stream their SSE chunks through
 * stream.c, which timestamps each chunk as it arrives. When a transfer ends its outcome is
 * settled: a success with its timings, or a failure with the reason (connect error, HTTP
 * status, malformed SSE, closed mid-stream, timeout). Nothing here aborts the run. */
#include <curl/curl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench_internal.h"
#include "client_internal.h"

void bench_arrivals(double *t, int n, double rate, double burstiness, uint64_t seed) {
    BenchRng rng;
    brng_seed(&rng, seed ^ 0xA5A5F00DBEEF1234ull); /* independent of the dataset's draws */
    double sum = 0;
    for (int i = 0; i < n; i++) {
        double gap = isinf(rate)         ? 0
                     : isinf(burstiness) ? 1.0 / rate
                                         : brng_gamma(&rng, burstiness, 1.0 / (rate * burstiness));
        t[i] = (sum += gap);
    }
    /* vLLM rescales so the last request goes out at n / rate: the throughput then does not
     * wobble by the 1-2% that the random gaps' sum would add. */
    if (n > 0 && !isinf(rate) && t[n - 1] > 0) {
        double f = (n / rate) / t[n - 1];
        for (int i = 0; i < n; i++)
            t[i] *= f;
    }
}

char *bench_request_body(const BenchClient *c, const BenchPrompt *p) {
    const BenchServeOptions *o = c->opt;
    json_t *req = json_object();
    json_object_set_new(req, "model", json_string(c->model));
    if (c->chat) {
        json_object_set_new(req, "messages",
                            json_pack("[{s:s, s:s}]", "role", "user", "content", p->prompt));
        json_object_set_new(req, "max_completion_tokens", json_integer(p->output_len));
    } else {
        json_object_set_new(req, "prompt", json_string(p->prompt));
        json_object_set_new(req, "max_tokens", json_integer(p->output_len));
    }
    json_object_set_new(req, "stream", json_true());
    json_object_set_new(req, "stream_options", json_pack("{s:b}", "include_usage", 1));
    if (o->ignore_eos)
        json_object_set_new(req, "ignore_eos", json_true());
    if (o->temperature >= 0)
        json_object_set_new(req, "temperature", json_real(o->temperature));
    if (o->top_p >= 0)
        json_object_set_new(req, "top_p", json_real(o->top_p));
    if (o->top_k != -2)
        json_object_set_new(req, "top_k", json_integer(o->top_k));
    char *body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    return body;
}

static Xfer *xfer_start(CURLM *multi, const BenchClient *c, const BenchPrompt *p, BenchOutcome *out,
                        struct curl_slist *headers) {
    Xfer *x = pl_xcalloc(1, sizeof *x);
    x->c = c;
    x->out = out;
    x->usage_prompt = x->usage_completion = -1;
    x->body = bench_request_body(c, p);
    x->easy = curl_easy_init();
    if (!x->easy || !x->body) {
        free(x->body);
        free(x);
        return NULL;
    }
    CURL *e = x->easy;
    curl_easy_setopt(e, CURLOPT_URL, c->url);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, x->body);
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE, (long)strlen(x->body));
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, xfer_on_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, x->errbuf);
    curl_easy_setopt(e, CURLOPT_PRIVATE, x);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, 30000L);
    if (c->opt->timeout_s > 0)
        curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)(c->opt->timeout_s * 1000));
    x->t_send = pl_now();
    if (curl_multi_add_handle(multi, e) != CURLM_OK) {
        curl_easy_cleanup(e);
        free(x->body);
        free(x);
        return NULL;
    }
    return x;
}

static struct curl_slist *make_headers(void) {
    struct curl_slist *h = NULL;
    h = curl_slist_append(h, "Content-Type: application/json");
    h = curl_slist_append(h, "Accept: text/event-stream");
    h = curl_slist_append(h, "Expect:"); /* no 100-continue round trip for larger bodies */
    const char *key = getenv("OPENAI_API_KEY");
    if (key && *key) {
        char line[1024];
        snprintf(line, sizeof line, "Authorization: Bearer %s", key);
        h = curl_slist_append(h, line);
    }
    return h;
}

/* Index queue of requests that arrived and wait for a slot. */
typedef struct {
    int *items, head, tail;
} Fifo;

int bench_client_run(const BenchClient *c, const BenchDataset *ds, double request_rate,
                     BenchOutcome *out, double *duration) {
    const BenchServeOptions *o = c->opt;
    int n = ds->n;
    CURLM *multi = curl_multi_init();
    if (!multi) {
        fprintf(stderr, "pagellm bench serve: libcurl cannot create a multi handle\n");
        return -1;
    }
    struct curl_slist *headers = make_headers();
    double *arrive = pl_xmalloc((size_t)(n > 0 ? n : 1) * sizeof *arrive);
    double *arrived_at = pl_xmalloc((size_t)(n > 0 ? n : 1) * sizeof *arrived_at);
    bench_arrivals(arrive, n, request_rate, o->burstiness, o->data.seed);
    Fifo q = {.items = pl_xmalloc((size_t)(n > 0 ? n : 1) * sizeof(int))};
    memset(out, 0, (size_t)n * sizeof *out);
    BenchProgress bar;
    bench_progress_start(&bar, n, "requests", o->disable_progress);

    double t0 = pl_now();
    int next = 0, active = 0, finished = 0;
    while (finished < n) {
        double now = pl_now() - t0;
        for (; next < n && arrive[next] <= now; next++) {
            arrived_at[next] = now;
            q.items[q.tail++] = next;
        }
        while (q.head < q.tail && (o->max_concurrency <= 0 || active < o->max_concurrency)) {
            int k = q.items[q.head++];
            Xfer *x = xfer_start(multi, c, &ds->items[k], &out[k], headers);
            if (!x) { /* out of resources: a failed request, not a failed run */
                out[k].prompt_len = ds->items[k].prompt_len;
                out[k].error = pl_xstrdup("client error: libcurl could not start the request");
                out[k].start_time = pl_now() - t0;
                finished++;
                bench_progress_step(&bar, 0);
                continue;
            }
            x->prompt_len = ds->items[k].prompt_len;
            x->t0 = t0;
            x->queue_time = (x->t_send - t0) - arrived_at[k];
            active++;
        }
        int running;
        curl_multi_perform(multi, &running);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(multi, &left))) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            Xfer *x;
            CURL *e = msg->easy_handle;
            CURLcode res = msg->data.result;
            curl_easy_getinfo(e, CURLINFO_PRIVATE, (char **)&x);
            curl_multi_remove_handle(multi, e);
            xfer_settle(x, res);
            bench_progress_step(&bar, x->out->success);
            xfer_free(x);
            active--;
            finished++;
        }
        if (finished >= n)
            break;
        if (q.head < q.tail && (o->max_concurrency <= 0 || active < o->max_concurrency))
            continue;      /* a slot opened: fill it now */
        int wait_ms = 100; /* wake up now and then for the progress bar and arrivals */
        if (next < n) {
            double until = (arrive[next] - (pl_now() - t0)) * 1000;
            wait_ms = until <= 0 ? 0 : until < wait_ms ? (int)ceil(until) : wait_ms;
        }
        if (wait_ms > 0)
            curl_multi_poll(multi, NULL, 0, wait_ms, NULL);
        bench_progress_tick(&bar);
    }
    *duration = pl_now() - t0;
    bench_progress_end(&bar);
    free(q.items);
    free(arrive);
    free(arrived_at);
    curl_slist_free_all(headers);
    curl_multi_cleanup(multi);
    return 0;
}

char *bench_first_model(const char *base_url, const char *model, int *max_model_len, char **err) {
    if (max_model_len)
        *max_model_len = 0;
    char url[4096];
    snprintf(url, sizeof url, "%s/v1/models", base_url);
    CURL *e = curl_easy_init();
    Buf body = {0};
    char errbuf[CURL_ERROR_SIZE] = "";
    struct curl_slist *h = make_headers();
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, buf_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &body);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT, 60L);
    CURLcode res = curl_easy_perform(e);
    long status = 0;
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(e);
    curl_slist_free_all(h);
    char *id = NULL, msg[512];
    msg[0] = '\0';
    if (res != CURLE_OK) {
        snprintf(msg, sizeof msg, "%s", errbuf[0] ? errbuf : curl_easy_strerror(res));
    } else if (status != 200) {
        snprintf(msg, sizeof msg, "HTTP %ld", status);
    } else {
        json_t *j = json_loadb(body.p ? body.p : "", body.len, 0, NULL);
        json_t *data = json_object_get(j, "data");
        const char *s = json_string_value(json_object_get(json_array_get(data, 0), "id"));
        if (s)
            id = pl_xstrdup(s);
        else
            snprintf(msg, sizeof msg, "the answer lists no model (no data[0].id)");
        for (size_t i = 0; max_model_len && i < json_array_size(data); i++) {
            json_t *m = json_array_get(data, i);
            const char *mid = json_string_value(json_object_get(m, "id"));
            json_t *len = json_object_get(m, "max_model_len");
            if (mid && (model ? !strcmp(mid, model) : i == 0) && json_is_integer(len) &&
                json_integer_value(len) > 0 && json_integer_value(len) <= INT32_MAX) {
                *max_model_len = (int)json_integer_value(len);
                break;
            }
        }
        json_decref(j);
    }
    free(body.p);
    if (!id) {
        size_t need = strlen(url) + strlen(msg) + 8;
        *err = pl_xmalloc(need);
        snprintf(*err, need, "GET %s: %s", url, msg);
    }
    return id;
}
