/* server.h - the OpenAI-compatible HTTP server: libmicrohttpd front end, one engine
 * thread, streaming responses, metrics, graceful shutdown.
 *
 * HTTP threads parse, validate, tokenize and enqueue; the engine thread runs steps and
 * pushes each event to its request, resuming the (suspended) connection so tokens reach the
 * client as soon as they are sampled. Nothing polls: idle connections and an idle engine
 * sleep until there is work. */
#ifndef PAGELLM_SERVER_H
#define PAGELLM_SERVER_H

#include "common.h"
#include "config.h"

typedef struct Server Server;

/* Start listening (GET /health answers 503 while loading), load the model, start the
 * engine thread. The Config must outlive the server. Errors: address in use, model load
 * failures (message set). SIGINT and SIGTERM are caught from the start: one while the model
 * loads exits at once (status 1); once serving, srv_wait_and_drain handles them. */
Status srv_start(const Config *cfg, Server **out);

/* Block until SIGINT or SIGTERM, then drain: stop accepting, let in-flight requests finish
 * and their answers be sent for up to `grace_seconds` in all, and return (srv_destroy
 * aborts the rest). */
void srv_wait_and_drain(Server *s, double grace_seconds);

/* Stop everything and free. NULL is a no-op. */
void srv_destroy(Server *s);

#endif
