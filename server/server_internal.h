/* server_internal.h - (internal to server/) the server's state shared by server.c (daemon,
 * routes, engine thread, shutdown) and completion.c (completion requests: submission,
 * engine events, JSON and SSE output). */
#ifndef PAGELLM_SERVER_INTERNAL_H
#define PAGELLM_SERVER_INTERNAL_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>

#include "api.h"
#include "engine.h"
#include "metrics.h"
#include "server.h"

/* emitter.c: the engine's events applied to their requests on a thread of their own, in
 * step order, while the engine runs its next step. */
typedef struct Emitter Emitter;
Emitter *emitter_start(Server *s);
void emitter_push(Emitter *em, const EngEvent *ev, int n); /* copies them */
void emitter_close(Emitter *em); /* applies what is queued, then stops; NULL is fine */

/* deadline.c: request-timeout as a deadline for receiving a whole request (headers and body),
 * enforced by a watchdog thread that shuts down the sockets of connections past it. */
typedef struct Deadlines Deadlines;
typedef struct ConnClock ConnClock;
Deadlines *dl_create(double seconds);      /* NULL (no deadline) when seconds <= 0 */
void dl_destroy(Deadlines *d);             /* NULL is fine */
ConnClock *dl_open(Deadlines *d, int fd);  /* a connection opened: its clock runs */
void dl_close(Deadlines *d, ConnClock *c); /* before the fd is closed */
/* 0: the request is complete (the clock stops); 1: the next one may arrive (it restarts). */
void dl_set_receiving(Deadlines *d, ConnClock *c, int receiving);

struct Server {
    const Config *cfg;
    const char *model_name; /* served-model-name, else the model folder */
    struct MHD_Daemon *daemon;
    Deadlines *deadlines; /* request-timeout for receiving requests, or NULL */
    Engine *engine;
    ApiChatTemplate *chat_template; /* NULL: the model has none and no key names one */
    Metrics *metrics;
    atomic_int listening;    /* the daemon started (libmicrohttpd's messages go to stderr) */
    char mhd_error[256];     /* libmicrohttpd's last message while the daemon starts */
    atomic_int ready;        /* model loaded */
    atomic_int stopping;     /* engine thread should exit once idle */
    atomic_int in_flight;    /* completion requests admitted and not yet finished */
    atomic_int open_answers; /* completion requests whose HTTP answer is not yet all sent */

    /* issue 34: their sequences (prompts x best_of), counted against max-queue-len; and
     * server.c's watcher of the connections whose client may leave mid-request */
    atomic_int in_flight_seqs;
    struct Watcher *watcher;
    pthread_t engine_thread;
    int engine_thread_started;
    pthread_mutex_t stats_mu;
    EngineStats stats; /* snapshot taken by the engine thread after each step */
    atomic_ullong next_id;
};

/* One choice of a completion response. */
typedef struct {
    char *text; /* generated text (prompt excluded); may hold NUL characters */
    size_t len, cap;
    size_t sent; /* bytes of text already streamed */
    int num_tokens;
    int32_t prev_token; /* last token so far (the prompt's last at first) */
    double cum_logprob;
    FinishReason finish;
    int stopped_by_string;   /* finished early on a stop string */
    int echoed;              /* streaming with echo: the prompt's chunk was sent */
    int sent_role;           /* chat streaming: its first delta carried the role */
    ApiOutputParser *parser; /* chat streaming with tools or reasoning: splits the deltas */
    /* logprobs (when asked): one entry per token */
    char **tok_text;
    size_t *tok_len; /* of tok_text (NUL characters count) */
    float *tok_logprob;
    char **top_json; /* serialised top_logprobs object per token */
    size_t *tok_offset;
    int lp_cap;
} Choice;

/* The engine request of one prompt (events carry a pointer to it). */
typedef struct CompletionReq CompletionReq;
typedef struct {
    CompletionReq *cr;
    int prompt_index;
    uint64_t engine_id;
    int num_prompt_tokens;
    int num_finished; /* samples of this prompt finished */
    int aborted;
} PromptRun;

struct CompletionReq {
    Server *srv;
    pthread_mutex_t mu;
    int refs; /* HTTP side, engine side, streaming response */
    struct MHD_Connection *conn;
    int suspended;
    ApiRequest req;
    char id[48];
    long created;
    PromptRun *runs;    /* [num_prompts] */
    char **prompt_text; /* [num_prompts] decoded prompts (for echo) */
    size_t *prompt_len; /* [num_prompts] their lengths (NUL characters count) */
    Choice *choices;    /* [num_prompts * best_of] */
    int num_choices;
    int num_done; /* choices finished */
    int done;     /* every choice finished: the response is complete */
    int client_gone;
    char *out; /* streaming: SSE bytes, [out_sent, out_len) not yet sent; else the final JSON */
    size_t out_len, out_sent, out_cap; /* out_cap: bytes allocated (streaming) */
    int status;                        /* HTTP status of a non-streaming reply */
    double t_arrival, t_first_token, t_last_token;
    double queue_seconds; /* reported by the engine; -1 until known */
};

/* POST /v1/completions and /v1/chat/completions, body complete: validate, tokenize, submit.
 * Queues a response or suspends the connection; returns MHD_YES/MHD_NO. *ctx gets the
 * CompletionReq (or NULL when answered at once). */
enum MHD_Result completion_start(Server *s, struct MHD_Connection *conn, int is_chat,
                                 const char *body, size_t len, CompletionReq **ctx);

/* Called again by MHD after a resumed non-streaming request: queue its JSON. */
enum MHD_Result completion_resume(CompletionReq *cr, struct MHD_Connection *conn);

/* Event thread (emitter.c): apply one event to its request (locks it). */
void completion_on_event(Server *s, const EngEvent *ev);

/* The HTTP side is done with the request (connection closed or answered). */
void completion_release_http(CompletionReq *cr, int completed_ok);

/* The client went away before the answer was complete: abort the request's engine runs (its
 * KV blocks are freed at the next step). Safe to call more than once. */
void completion_abandon(CompletionReq *cr);

/* tokenize.c: POST /tokenize (detokenize 0) and /detokenize (1), body complete. */
enum MHD_Result tokenize_answer(Server *s, struct MHD_Connection *conn, int detokenize,
                                const char *body, size_t len);

/* cors.c: CORS headers (allowed-origins and the keys after it). */
/* 1 when the request is a CORS preflight this server answers (allowed-origins is set). */
int cors_is_preflight(const Server *s, struct MHD_Connection *conn, const char *method);
/* Answer the preflight: 204, or 400 naming what is not allowed. */
enum MHD_Result cors_preflight(Server *s, struct MHD_Connection *conn);
/* Add Access-Control-Allow-Origin (and Vary, -Credentials) for the request's Origin. */
void cors_add_headers(const Server *s, struct MHD_Connection *conn, struct MHD_Response *r);

/* 0 with a 404 in *err when `model` (NULL: not named) is not the served model's name. */
int srv_model_known(const Server *s, const char *model, ApiError *err);

/* Send an OpenAI-shaped error. */
enum MHD_Result srv_send_error(Server *s, struct MHD_Connection *conn, const ApiError *err);

/* Send a JSON body with a status. Takes ownership of `body` (malloc'd). */
enum MHD_Result srv_send_json(Server *s, struct MHD_Connection *conn, int status, char *body);

#endif
