/* emitter.c - a thread of its own for the engine's output events: the engine thread copies
 * each step's events into one buffer and goes on to the next step at once, while this thread
 * applies them to their requests (detokenized text, stop strings, SSE chunks, resuming the
 * connections), so the HTTP work of step N overlaps the GPU running step N + 1 instead of
 * delaying it. Steps are applied one at a time in step order, so a request sees its events
 * in order. At most EMIT_MAX_PENDING steps wait; beyond that the engine thread waits too
 * (a stalled emitter cannot grow memory without bound). */
#include <stdalign.h>
#include <stdlib.h>
#include <string.h>

#include "server_internal.h"

enum { EMIT_MAX_PENDING = 4 };

/* One step's events; their strings and arrays follow in the same allocation. */
typedef struct EmitBatch {
    struct EmitBatch *next;
    int n;
    EngEvent ev[];
} EmitBatch;

struct Emitter {
    Server *server;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t have_batch, have_room;
    EmitBatch *head, *tail;
    int pending; /* batches queued, not yet taken */
    int closing;
};

static size_t round_up(size_t n, size_t a) {
    return (n + a - 1) / a * a;
}

/* A deep copy of n events: the EngEvent array, then the top-logprob arrays, then the texts. */
static EmitBatch *copy_batch(const EngEvent *ev, int n) {
    size_t arrays = 0, texts = 0;
    for (int i = 0; i < n; i++) {
        arrays += (size_t)ev[i].num_top * (sizeof(int32_t) + sizeof(float));
        texts += (ev[i].text ? ev[i].text_len : 0) + 1;
    }
    size_t head = round_up(sizeof(EmitBatch) + (size_t)n * sizeof(EngEvent), alignof(max_align_t));
    EmitBatch *b = pl_xmalloc(head + arrays + texts);
    b->next = NULL;
    b->n = n;
    char *arr = (char *)b + head, *txt = arr + arrays;
    for (int i = 0; i < n; i++) {
        EngEvent *e = &b->ev[i];
        *e = ev[i];
        size_t k = (size_t)ev[i].num_top;
        if (k) {
            memcpy(arr, ev[i].top_logprobs, k * sizeof(float));
            e->top_logprobs = (const float *)arr;
            arr += k * sizeof(float);
            memcpy(arr, ev[i].top_ids, k * sizeof(int32_t));
            e->top_ids = (const int32_t *)arr;
            arr += k * sizeof(int32_t);
        }
        e->text_len = ev[i].text ? ev[i].text_len : 0;
        memcpy(txt, ev[i].text ? ev[i].text : "", e->text_len + 1); /* NUL-terminated */
        e->text = txt;
        txt += e->text_len + 1;
    }
    return b;
}

static void *emit_loop(void *arg) {
    Emitter *em = arg;
    for (;;) {
        pthread_mutex_lock(&em->mu);
        while (!em->head && !em->closing)
            pthread_cond_wait(&em->have_batch, &em->mu);
        EmitBatch *b = em->head;
        if (b) {
            em->head = b->next;
            if (!em->head)
                em->tail = NULL;
            em->pending--;
            pthread_cond_signal(&em->have_room);
        }
        pthread_mutex_unlock(&em->mu);
        if (!b)
            return NULL; /* closing, and everything applied */
        for (int i = 0; i < b->n; i++)
            completion_on_event(em->server, &b->ev[i]);
        free(b);
    }
}

Emitter *emitter_start(Server *s) {
    Emitter *em = pl_xcalloc(1, sizeof *em);
    em->server = s;
    pthread_mutex_init(&em->mu, NULL);
    pthread_cond_init(&em->have_batch, NULL);
    pthread_cond_init(&em->have_room, NULL);
    if (pthread_create(&em->thread, NULL, emit_loop, em) != 0)
        pl_fatal(__FILE__, __LINE__, "cannot start the event thread");
    return em;
}

void emitter_push(Emitter *em, const EngEvent *ev, int n) {
    if (n <= 0)
        return;
    EmitBatch *b = copy_batch(ev, n);
    pthread_mutex_lock(&em->mu);
    while (em->pending >= EMIT_MAX_PENDING)
        pthread_cond_wait(&em->have_room, &em->mu);
    if (em->tail)
        em->tail->next = b;
    else
        em->head = b;
    em->tail = b;
    em->pending++;
    pthread_cond_signal(&em->have_batch);
    pthread_mutex_unlock(&em->mu);
}

void emitter_close(Emitter *em) {
    if (!em)
        return;
    pthread_mutex_lock(&em->mu);
    em->closing = 1;
    pthread_cond_signal(&em->have_batch);
    pthread_mutex_unlock(&em->mu);
    pthread_join(em->thread, NULL);
    pthread_mutex_destroy(&em->mu);
    pthread_cond_destroy(&em->have_batch);
    pthread_cond_destroy(&em->have_room);
    free(em);
}
