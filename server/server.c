/* server.c - the HTTP daemon (libmicrohttpd, epoll, internal thread pool, suspend/resume),
 * routing of every endpoint, authentication, body limits (a declared oversized body is refused
 * before it is read), framing checks (Content-Length / Transfer-Encoding), the per-address
 * connection limit, the watcher that aborts the requests of clients that left, the engine
 * thread and shutdown (draining: /health answers 503). */
#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <semaphore.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server_internal.h"

#define PAGELLM_VERSION "0.1.0"

static volatile sig_atomic_t signals_seen, serving; /* for the signal handler */
static void catch_signals(void);

/* Per-connection state while the request body arrives. */
typedef struct {
    char *body;
    size_t len, cap;
    int too_big;
    CompletionReq *cr; /* set once a completion was submitted */
    uint64_t watch;    /* its watch (see below), 0 = none */
} ConnCtx;

/* ---- clients that leave mid-request --------------------------------------------------
 *
 * A suspended connection (a non-streaming request waits for its whole answer so, and a
 * streaming one between tokens) is outside libmicrohttpd's event loop: a client that closes
 * its socket is noticed only when the answer is written, for a non-streaming request at the
 * end of the whole generation (an abandoned n = 64 x 400-token request kept the engine busy
 * to the end). So every connection with a completion in flight is also in an epoll set of
 * the watcher's own, for EPOLLRDHUP only (the client's FIN, a reset or an error: never the
 * data of a pipelined next request), and the watcher thread abandons the request of a
 * connection whose client has gone (completion_abandon: its engine runs are aborted and
 * their KV blocks freed at the next step; the answer then fails to be written and
 * libmicrohttpd closes the connection). A watch is removed (on_completed) before
 * libmicrohttpd closes its fd and before the request's HTTP reference is let go, and epoll
 * events carry the watch's serial number, not a pointer, so a late event of a removed watch
 * finds nothing.
 *
 * A connection whose request body is still arriving is watched too (cr NULL): libmicrohttpd
 * (0.9.75, epoll) misses a client that sends part of a body and closes at once, and would
 * keep its descriptor until request-timeout. Such a connection's socket is shut down (as
 * Deadlines does at the timeout; libmicrohttpd then closes it) once the client's FIN is a
 * second old and the body is still not complete: a client that half-closes after its whole
 * body has its request dispatched (and this watch removed) long before. */
typedef struct {
    uint64_t id;
    int fd;
    CompletionReq *cr; /* NULL: the body is still arriving */
    double gone_at;    /* body watches: when the client's FIN came, 0 = not yet */
} Watch;

#define BODY_GONE_WAIT 1.0 /* seconds from a body watch's FIN to its shutdown */

struct Watcher {
    pthread_mutex_t mu;
    int epfd, wake; /* the epoll set; an eventfd that stops the thread */
    Watch *w;
    int n, cap;
    uint64_t next_id;
    pthread_t thread;
    int started;
};

/* Shut down the body watches whose FIN is BODY_GONE_WAIT old; returns the epoll timeout, ms,
 * until the next one is due (-1: none waits). Called with wt->mu held. */
static int shut_gone_uploads(struct Watcher *wt) {
    double now = pl_now(), next = HUGE_VAL;
    for (int k = 0; k < wt->n;) {
        Watch *w = &wt->w[k];
        if (w->cr || !w->gone_at) {
            k++;
        } else if (now - w->gone_at >= BODY_GONE_WAIT) {
            shutdown(w->fd, SHUT_RDWR); /* still libmicrohttpd's: on_completed removes first */
            *w = wt->w[--wt->n];
        } else {
            next = fmin(next, w->gone_at + BODY_GONE_WAIT);
            k++;
        }
    }
    return next == HUGE_VAL ? -1 : (int)ceil((next - now) * 1000);
}

static void *watcher_loop(void *arg) {
    struct Watcher *wt = arg;
    struct epoll_event ev[64];
    int timeout_ms = -1;
    for (;;) {
        int n = epoll_wait(wt->epfd, ev, 64, timeout_ms);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return NULL;
        pthread_mutex_lock(&wt->mu);
        for (int i = 0; i < n; i++) {
            if (ev[i].data.u64 == 0) { /* the wake-up: stop */
                pthread_mutex_unlock(&wt->mu);
                return NULL;
            }
            for (int k = 0; k < wt->n; k++) {
                Watch *w = &wt->w[k];
                if (w->id != ev[i].data.u64)
                    continue;
                epoll_ctl(wt->epfd, EPOLL_CTL_DEL, w->fd, NULL);
                if (w->cr) {
                    completion_abandon(w->cr);
                    *w = wt->w[--wt->n];
                } else {
                    w->gone_at = pl_now(); /* shut down later, unless removed by then */
                }
                break;
            }
        }
        timeout_ms = shut_gone_uploads(wt);
        pthread_mutex_unlock(&wt->mu);
    }
}

static struct Watcher *watcher_start(void) {
    struct Watcher *wt = pl_xcalloc(1, sizeof *wt);
    pthread_mutex_init(&wt->mu, NULL);
    wt->epfd = epoll_create1(EPOLL_CLOEXEC);
    wt->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 0};
    if (wt->epfd < 0 || wt->wake < 0 || epoll_ctl(wt->epfd, EPOLL_CTL_ADD, wt->wake, &ev) != 0 ||
        pthread_create(&wt->thread, NULL, watcher_loop, wt) != 0)
        pl_fatal(__FILE__, __LINE__, "cannot start the connection watcher: %s", strerror(errno));
    wt->started = 1;
    return wt;
}

/* Stop the thread; the set stays usable (watches are removed until the daemon stops). */
static void watcher_stop_thread(struct Watcher *wt) {
    if (!wt || !wt->started)
        return;
    uint64_t one = 1;
    if (write(wt->wake, &one, sizeof one) != sizeof one)
        pl_fatal(__FILE__, __LINE__, "cannot stop the connection watcher");
    pthread_join(wt->thread, NULL);
    wt->started = 0;
}

static void watcher_destroy(struct Watcher *wt) {
    if (!wt)
        return;
    watcher_stop_thread(wt);
    close(wt->epfd);
    close(wt->wake);
    free(wt->w);
    pthread_mutex_destroy(&wt->mu);
    free(wt);
}

/* Watch the connection of request cr, or (cr NULL) of a request whose body is arriving;
 * returns the watch's id (0 if it cannot be watched). */
static uint64_t watch_add(struct Watcher *wt, struct MHD_Connection *conn, CompletionReq *cr) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!wt || !ci)
        return 0;
    pthread_mutex_lock(&wt->mu);
    uint64_t id = ++wt->next_id;
    struct epoll_event ev = {.events = EPOLLRDHUP, .data.u64 = id};
    if (epoll_ctl(wt->epfd, EPOLL_CTL_ADD, ci->connect_fd, &ev) != 0) {
        pthread_mutex_unlock(&wt->mu);
        return 0;
    }
    if (wt->n == wt->cap) {
        wt->cap = wt->cap ? 2 * wt->cap : 64;
        wt->w = pl_xrealloc(wt->w, (size_t)wt->cap * sizeof *wt->w);
    }
    wt->w[wt->n++] = (Watch){.id = id, .fd = ci->connect_fd, .cr = cr};
    pthread_mutex_unlock(&wt->mu);
    return id;
}

static void watch_remove(struct Watcher *wt, uint64_t id) {
    if (!wt || !id)
        return;
    pthread_mutex_lock(&wt->mu);
    for (int k = 0; k < wt->n; k++) {
        if (wt->w[k].id != id)
            continue;
        if (!wt->w[k].gone_at) /* a body watch that saw the FIN has left the set already */
            epoll_ctl(wt->epfd, EPOLL_CTL_DEL, wt->w[k].fd, NULL);
        wt->w[k] = wt->w[--wt->n];
        break;
    }
    pthread_mutex_unlock(&wt->mu);
}

static ConnClock *clock_of(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* Request smuggling behind a proxy (issue 34): libmicrohttpd 0.9.75 takes the first of two
 * Content-Length headers and lets Transfer-Encoding: chunked override a Content-Length, where a
 * proxy in front may have framed the body by the other one; and it waits for the end of a body
 * in a transfer coding it does not know. Such requests are refused before the body is read:
 * 400 for two different Content-Length values, two Transfer-Encoding headers, or both headers;
 * 501 for a Transfer-Encoding other than chunked. */
typedef struct {
    int num_cl, num_te, cl_differ;
    unsigned long long cl;
    const char *te;
} Framing;

static int parse_length(const char *v, unsigned long long *out) {
    char *end;
    errno = 0;
    *out = strtoull(v, &end, 10);
    return v[0] >= '0' && v[0] <= '9' && end != v && !*end && errno == 0;
}

static enum MHD_Result framing_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                      const char *value) {
    (void)kind;
    Framing *f = cls;
    unsigned long long n = 0;
    if (!strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) {
        int ok = value && parse_length(value, &n);
        if (f->num_cl++ ? !ok || n != f->cl : 0)
            f->cl_differ = 1;
        f->cl = n;
    } else if (!strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING)) {
        f->num_te++;
        f->te = value ? value : "";
    }
    return MHD_YES;
}

/* Read the request's framing headers into *f; 0 when they are fine, else the status to
 * refuse it with (err filled). */
static int bad_framing(struct MHD_Connection *conn, Framing *f, ApiError *err) {
    *f = (Framing){0};
    MHD_get_connection_values(conn, MHD_HEADER_KIND, framing_header, f);
    const char *why = NULL;
    if (f->cl_differ)
        why = "two different Content-Length headers";
    else if (f->num_te > 1)
        why = "more than one Transfer-Encoding header";
    else if (f->num_te && f->num_cl)
        why = "both Content-Length and Transfer-Encoding";
    if (why) {
        api_error_set(err, 400, "invalid_request_error", NULL,
                      "the request has %s: its body's length is ambiguous", why);
        return 400;
    }
    if (f->num_te && strcasecmp(f->te, "chunked") != 0) {
        api_error_set(err, 501, "invalid_request_error", NULL,
                      "Transfer-Encoding '%.64s' is not supported (only chunked)", f->te);
        return 501;
    }
    return 0;
}

/* Queue `body` (malloc'd, taken) with a content type and at most one extra header. */
static enum MHD_Result respond(Server *s, struct MHD_Connection *conn, int status, const char *type,
                               char *body, const char *header, const char *value) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", type);
    if (header)
        MHD_add_response_header(r, header, value);
    cors_add_headers(s, conn, r);
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)status, r);
    MHD_destroy_response(r);
    met_http_request(s->metrics, status);
    return ret;
}

enum MHD_Result srv_send_json(Server *s, struct MHD_Connection *conn, int status, char *body) {
    int busy = status == MHD_HTTP_SERVICE_UNAVAILABLE;
    return respond(s, conn, status, "application/json", body, busy ? "Retry-After" : NULL, "1");
}

enum MHD_Result srv_send_error(Server *s, struct MHD_Connection *conn, const ApiError *err) {
    return srv_send_json(s, conn, err->status, api_error_json(err));
}

int srv_model_known(const Server *s, const char *model, ApiError *err) {
    if (!model || !strcmp(model, s->model_name))
        return 1;
    api_error_set(err, 404, "not_found_error", "model", "The model '%s' does not exist.", model);
    return 0;
}

/* Constant-time comparison of the bearer token with the configured key. */
static int authorized(const Server *s, struct MHD_Connection *conn) {
    const char *key = s->cfg->api_key;
    if (!key)
        return 1;
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7) != 0)
        return 0;
    h += 7;
    size_t hl = strlen(h), kl = strlen(key);
    unsigned char diff = (unsigned char)(hl != kl);
    for (size_t i = 0; i < kl; i++)
        diff |= (unsigned char)(key[i] ^ (i < hl ? h[i] : 0));
    return diff == 0;
}

/* The model folder's last name ("stories260K" for /srv/models/stories260K/): /v1/models says
 * which model this is without telling clients the server's file system. */
static void model_root(const char *dir, char *out, size_t size) {
    size_t end = strlen(dir);
    while (end > 1 && dir[end - 1] == '/')
        end--;
    size_t start = end;
    while (start > 0 && dir[start - 1] != '/')
        start--;
    snprintf(out, size, "%.*s", (int)(end - start), dir + start);
}

/* vLLM's model card: id (served name), root (the model, here by its folder's name only, never
 * a path), parent, max_model_len (the effective one, after any cap to the KV cache). */
static enum MHD_Result models(Server *s, struct MHD_Connection *conn) {
    char root[1024];
    model_root(s->cfg->engine.model_dir, root, sizeof root);
    json_t *m =
        json_pack("{s:s, s:s, s:I, s:s, s:s, s:n, s:i}", "id", s->model_name, "object", "model",
                  "created", (json_int_t)time(NULL), "owned_by", "pagellm", "root", root, "parent",
                  "max_model_len", s->engine ? eng_max_model_len(s->engine) : 0);
    json_t *list = json_pack("{s:s, s:[o]}", "object", "list", "data", m);
    char *body = json_dumps(list, JSON_COMPACT);
    json_decref(list);
    return srv_send_json(s, conn, 200, body);
}

static enum MHD_Result metrics(Server *s, struct MHD_Connection *conn) {
    pthread_mutex_lock(&s->stats_mu);
    EngineStats st = s->stats;
    pthread_mutex_unlock(&s->stats_mu);
    return respond(s, conn, 200, MET_CONTENT_TYPE, met_render(s->metrics, &st), NULL, NULL);
}

typedef enum { GET_ROUTE, COMPLETIONS, CHAT, TOKENIZE, DETOKENIZE } RouteKind;

typedef struct {
    const char *path;
    const char *method;
    int needs_model; /* 503 while loading */
    RouteKind kind;
} Route;

static const Route routes[] = {
    {"/health", "GET", 1, GET_ROUTE},
    {"/version", "GET", 0, GET_ROUTE},
    {"/v1/models", "GET", 1, GET_ROUTE},
    {"/metrics", "GET", 0, GET_ROUTE},
    {"/v1/completions", "POST", 1, COMPLETIONS},
    {"/v1/chat/completions", "POST", 1, CHAT},
    {"/tokenize", "POST", 1, TOKENIZE},
    {"/detokenize", "POST", 1, DETOKENIZE},
};

static const Route *find_route(const char *url, int *path_known) {
    *path_known = 0;
    for (size_t i = 0; i < sizeof routes / sizeof *routes; i++)
        if (!strcmp(url, routes[i].path)) {
            *path_known = 1;
            return &routes[i];
        }
    return NULL;
}

static enum MHD_Result fail(Server *s, struct MHD_Connection *conn, int status, const char *type,
                            const char *fmt, const char *arg) {
    ApiError err;
    api_error_set(&err, status, type, NULL, fmt, arg);
    return srv_send_error(s, conn, &err);
}

/* The final call for a request whose body is complete. */
static enum MHD_Result dispatch(Server *s, struct MHD_Connection *conn, const char *url,
                                const char *method, ConnCtx *c) {
    if (cors_is_preflight(s, conn, method)) /* before routes and the API key, as Starlette */
        return cors_preflight(s, conn);
    int known;
    const Route *rt = find_route(url, &known);
    if (!known)
        return fail(s, conn, 404, "not_found_error", "no route %s", url);
    if (strcmp(method, rt->method) != 0) {
        ApiError err;
        api_error_set(&err, 405, "invalid_request_error", NULL, "method not allowed; use %s",
                      rt->method);
        return respond(s, conn, 405, "application/json", api_error_json(&err), "Allow", rt->method);
    }
    if (strcmp(url, "/health") != 0 && !authorized(s, conn))
        return fail(s, conn, 401, "authentication_error", "%s",
                    "missing or invalid API key (Authorization: Bearer ...)");
    if (c->too_big) {
        ApiError err;
        api_error_set(&err, 413, "invalid_request_error", NULL,
                      "request body exceeds max-request-bytes (%d)", s->cfg->max_request_bytes);
        return srv_send_error(s, conn, &err);
    }
    dl_set_receiving(s->deadlines, clock_of(conn), 0); /* complete: the answer is owed */
    if (rt->needs_model && !atomic_load(&s->ready))
        return fail(s, conn, 503, "server_error", "%s", "the model is still loading");
    if (!strcmp(url, "/health")) {
        /* draining after SIGTERM: a load balancer's health check sees it and stops sending */
        if (atomic_load(&s->stopping))
            return fail(s, conn, 503, "server_error", "%s", "the server is shutting down");
        return respond(s, conn, 200, "text/plain", pl_xstrdup(""), NULL, NULL);
    }
    if (!strcmp(url, "/version"))
        return srv_send_json(s, conn, 200, pl_xstrdup("{\"version\": \"" PAGELLM_VERSION "\"}"));
    if (!strcmp(url, "/v1/models"))
        return models(s, conn);
    if (!strcmp(url, "/metrics"))
        return metrics(s, conn);
    if (rt->kind == TOKENIZE || rt->kind == DETOKENIZE)
        return tokenize_answer(s, conn, rt->kind == DETOKENIZE, c->body ? c->body : "", c->len);
    if (atomic_load(&s->stopping))
        return fail(s, conn, 503, "server_error", "%s", "the server is shutting down");
    enum MHD_Result ret =
        completion_start(s, conn, rt->kind == CHAT, c->body ? c->body : "", c->len, &c->cr);
    if (c->cr) { /* before on_completed can run: this thread handles the connection */
        atomic_fetch_add(&s->open_answers, 1);
        c->watch = watch_add(s->watcher, conn, c->cr);
    }
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_size, void **con_cls) {
    Server *s = cls;
    ConnCtx *c = *con_cls;
    if (!c) {
        *con_cls = c = pl_xcalloc(1, sizeof *c);
        ApiError err;
        Framing f;
        /* bad framing is refused before the body is read; the connection closes */
        if (bad_framing(conn, &f, &err))
            return respond(s, conn, err.status, "application/json", api_error_json(&err),
                           MHD_HTTP_HEADER_CONNECTION, "close");
        /* Refuse a declared oversized body at once (401/404/405 first, as for any request):
         * libmicrohttpd then closes the connection without reading the body. */
        if (f.num_cl && f.cl > (unsigned long long)s->cfg->max_request_bytes) {
            c->too_big = 1;
            return dispatch(s, conn, url, method, c);
        }
        if (f.num_te || f.cl > 0) /* a body is to come */
            c->watch = watch_add(s->watcher, conn, NULL);
        return MHD_YES;
    }
    if (c->cr) /* resumed after the engine finished a non-streaming request */
        return completion_resume(c->cr, conn);
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (c->too_big || c->len + n > (size_t)s->cfg->max_request_bytes) {
            c->too_big = 1;
            return MHD_YES;
        }
        if (c->len + n + 1 > c->cap) {
            c->cap = (c->len + n + 1) * 2;
            c->body = pl_xrealloc(c->body, c->cap);
        }
        memcpy(c->body + c->len, upload_data, n);
        c->len += n;
        c->body[c->len] = '\0';
        return MHD_YES;
    }
    watch_remove(s->watcher, c->watch); /* the body is complete */
    c->watch = 0;
    return dispatch(s, conn, url, method, c);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    ConnCtx *c = *con_cls;
    Server *s = cls;
    dl_set_receiving(s->deadlines, clock_of(conn), 1); /* a next request may arrive */
    if (!c)
        return;
    watch_remove(s->watcher, c->watch);
    if (c->cr) {
        completion_release_http(c->cr, toe == MHD_REQUEST_TERMINATED_COMPLETED_OK);
        atomic_fetch_sub(&s->open_answers, 1); /* all sent, or the client is gone */
    }
    free(c->body);
    free(c);
    *con_cls = NULL;
}

/* libmicrohttpd's own messages: while the daemon starts, the last one is kept (the start-up
 * error names the cause in its one line); afterwards each is one "pagellm: http:" line, but
 * a message repeated within 10 s of its last printing is only counted, the count printed
 * before the next message (a client refused by max-connections-per-ip thousands of times must
 * not flood the log). */
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    Server *s = cls;
    char msg[sizeof s->mhd_error];
    vsnprintf(msg, sizeof msg, fmt, ap);
    msg[strcspn(msg, "\r\n")] = '\0';
    if (atomic_load(&s->listening)) {
        static char last[sizeof msg];
        static double last_time;
        static long repeats;
        pthread_mutex_lock(&s->stats_mu);
        double now = pl_now();
        if (!strcmp(msg, last) && now - last_time < 10) {
            repeats++;
        } else {
            if (repeats)
                fprintf(stderr, "pagellm: http: (the message above %ld more times)\n", repeats);
            fprintf(stderr, "pagellm: http: %s\n", msg);
            memcpy(last, msg, sizeof msg);
            last_time = now;
            repeats = 0;
        }
        pthread_mutex_unlock(&s->stats_mu);
        return;
    }
    pthread_mutex_lock(&s->stats_mu); /* its worker threads may log while it starts */
    memcpy(s->mhd_error, msg, sizeof msg);
    pthread_mutex_unlock(&s->stats_mu);
}

/* Connections open and close: their request-timeout clocks. */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    Server *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        *socket_context = ci ? dl_open(s->deadlines, ci->connect_fd) : NULL;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        dl_close(s->deadlines, *socket_context);
        *socket_context = NULL;
    }
}

static void *engine_loop(void *arg) {
    Server *s = arg;
    Emitter *em = emitter_start(s);
    for (;;) {
        if (!eng_has_work(s->engine)) {
            if (atomic_load(&s->stopping) && atomic_load(&s->in_flight) == 0)
                break;
            eng_wait_for_work(s->engine, 100);
            continue;
        }
        const EngEvent *ev;
        emitter_push(em, ev, eng_step(s->engine, &ev));
        EngineStats st = eng_stats(s->engine);
        pthread_mutex_lock(&s->stats_mu);
        s->stats = st;
        pthread_mutex_unlock(&s->stats_mu);
    }
    emitter_close(em); /* in_flight is 0: every final event was applied */
    return NULL;
}

/* 1,000+ concurrent connections need more descriptors than the usual soft limit. */
static void raise_fd_limit(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

/* The chat template (parsed once here; a parse error stops the start), with the tokenizer's
 * BOS / EOS texts where tokenizer_config.json names none. */
static Status load_chat_template(Server *s) {
    const Tokenizer *tok = eng_tokenizer(s->engine);
    int bos = tok ? tok_bos_id(tok) : -1, eos = tok ? tok_eos_id(tok) : -1;
    ApiChatTemplateSpec spec = {.setting = s->cfg->chat_template,
                                .model_dir = s->cfg->engine.model_dir,
                                .bos_token = bos >= 0 ? tok_id_to_token(tok, bos) : NULL,
                                .eos_token = eos >= 0 ? tok_id_to_token(tok, eos) : NULL};
    return api_chat_template_load(&spec, &s->chat_template);
}

Status srv_start(const Config *cfg, Server **out) {
    *out = NULL;
    Server *s = pl_xcalloc(1, sizeof *s);
    s->cfg = cfg;
    s->model_name = cfg->served_model_name ? cfg->served_model_name : cfg->engine.model_dir;
    pthread_mutex_init(&s->stats_mu, NULL);
    s->metrics = met_create(s->model_name);
    signal(SIGPIPE, SIG_IGN);
    catch_signals();
    raise_fd_limit();
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)cfg->port)};
    if (inet_pton(AF_INET, cfg->host, &addr.sin_addr) != 1) {
        srv_destroy(s);
        return pl_error_set(PL_ERR_INVALID, "host '%s' is not an IPv4 address", cfg->host);
    }
    /* request-timeout twice: libmicrohttpd closes a connection idle that long (rounded up to
     * whole seconds), and deadline.c one that has not sent its whole request in that time */
    unsigned timeout = cfg->request_timeout > 0 ? (unsigned)ceil(cfg->request_timeout) : 0;
    s->deadlines = dl_create(cfg->request_timeout);
    s->watcher = watcher_start();
    /* max-connections-per-ip: libmicrohttpd closes a connection past it as soon as it is
     * accepted, counting per address over all its threads */
    s->daemon = MHD_start_daemon(
        MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG,
        (uint16_t)cfg->port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, &addr,
        MHD_OPTION_THREAD_POOL_SIZE, 4u, MHD_OPTION_CONNECTION_LIMIT, 8192u,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)cfg->max_connections_per_ip,
        MHD_OPTION_CONNECTION_TIMEOUT, timeout, MHD_OPTION_LISTEN_BACKLOG_SIZE, 4096u,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, on_connection,
        s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s, MHD_OPTION_END);
    if (!s->daemon) {
        int err = errno;
        char why[sizeof s->mhd_error];
        snprintf(why, sizeof why, "%s", s->mhd_error[0] ? s->mhd_error : strerror(err));
        srv_destroy(s);
        return pl_error_set(PL_ERR_IO, "cannot listen on %s:%d: %s", cfg->host, cfg->port, why);
    }
    atomic_store(&s->listening, 1);
    fprintf(stderr, "pagellm: listening on http://%s:%d, loading %s\n", cfg->host, cfg->port,
            cfg->engine.model_dir);
    Status st = eng_create(&cfg->engine, &s->engine);
    if (st == PL_OK)
        st = load_chat_template(s);
    if (st != PL_OK) {
        srv_destroy(s);
        return st;
    }
    s->stats = eng_stats(s->engine);
    if (pthread_create(&s->engine_thread, NULL, engine_loop, s) != 0)
        pl_fatal(__FILE__, __LINE__, "cannot start the engine thread");
    s->engine_thread_started = 1;
    serving = 1;
    atomic_store(&s->ready, 1);
    fprintf(stderr, "pagellm: serving %s on http://%s:%d\n", s->model_name, cfg->host, cfg->port);
    *out = s;
    return PL_OK;
}

static sem_t signal_sem;

static void on_signal(int sig) {
    (void)sig;
    if (!serving || ++signals_seen > 1)
        _exit(1); /* while loading, or a second signal: stop at once */
    sem_post(&signal_sem);
}

/* Installed before the daemon starts: a SIGTERM that comes just after /health turned 200
 * drains like any other instead of killing the process (the default action), and one while
 * the model loads ends it at once with status 1. */
static void catch_signals(void) {
    sem_init(&signal_sem, 0, 0);
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

void srv_wait_and_drain(Server *s, double grace_seconds) {
    while (sem_wait(&signal_sem) != 0) /* EINTR */
        ;
    atomic_store(&s->stopping, 1); /* before the message: who reads it sees /health at 503 */
    fprintf(stderr, "pagellm: shutting down: %d requests in flight\n", atomic_load(&s->in_flight));
    /* the engine's work is not enough: a large answer may still be on its way to a slow
     * client, and stopping the daemon would cut it */
    double until = pl_now() + grace_seconds;
    while ((atomic_load(&s->in_flight) > 0 || atomic_load(&s->open_answers) > 0) &&
           pl_now() < until)
        usleep(10000);
}

void srv_destroy(Server *s) {
    if (!s)
        return;
    atomic_store(&s->stopping, 1);
    watcher_stop_thread(s->watcher); /* its watches are still removed as connections end */
    if (s->daemon)
        MHD_quiesce_daemon(s->daemon);
    if (s->engine_thread_started) {
        /* abort what is left; the engine thread ends once their last events are out */
        eng_abort_all(s->engine);
        pthread_join(s->engine_thread, NULL);
    }
    if (s->daemon)
        MHD_stop_daemon(s->daemon);
    dl_destroy(s->deadlines);
    watcher_destroy(s->watcher);
    eng_destroy(s->engine);
    met_destroy(s->metrics);
    api_chat_template_free(s->chat_template);
    pthread_mutex_destroy(&s->stats_mu);
    free(s);
}
