/* output.c - what clients see of their samples: each accepted token checked against the
 * request's stop tokens and lengths, turned into text in context by the sample's detokenizer,
 * and recorded as an output event; a sample's end (flushing held-back text, releasing its
 * blocks) and a request's abort. The events of a step, and the text they point into, live
 * here until the next step. Called by the engine loop (step.c, overlap.c); calls only the
 * scheduler, the tokenizer and request.c. */
#include <string.h>

#include "engine_internal.h"

/* Copy s[0..n) (which may hold NUL characters) into the step's text arena and terminate it;
 * returns its offset (events store offsets until the step ends, since the arena may move
 * while it grows). */
static size_t arena_put(Engine *e, const char *s, size_t n) {
    size_t at = e->out.text_len;
    if (at + n + 1 > e->out.text_cap) {
        e->out.text_cap = (at + n + 1) * 2;
        e->out.text = pl_xrealloc(e->out.text, e->out.text_cap);
    }
    memcpy(e->out.text + at, s, n);
    e->out.text[at + n] = '\0';
    e->out.text_len += n + 1;
    return at;
}

/* Append s[0..n) to the text put last. */
static void arena_extend(Engine *e, const char *s, size_t n) {
    e->out.text_len--; /* over its terminator */
    arena_put(e, s, n);
}

static void emit(Engine *e, Request *r, int index, int32_t token, size_t text_at, size_t text_len,
                 FinishReason finish, const RowLogprobs *lp) {
    if (e->out.events_n == e->out.events_cap) {
        e->out.events_cap = e->out.events_cap ? 2 * e->out.events_cap : 64;
        e->out.events =
            pl_xrealloc(e->out.events, (size_t)e->out.events_cap * sizeof *e->out.events);
    }
    e->out.events[e->out.events_n++] =
        (EngEvent){.request_id = r->id,
                   .user = r->user,
                   .index = index,
                   .token = token,
                   .text = (const char *)(uintptr_t)text_at,
                   .text_len = text_len,
                   .finish = finish,
                   .num_prompt_tokens = r->num_prompt,
                   .num_generated = r->data[index].num_generated,
                   .queue_seconds = r->t_scheduled > 0 ? r->t_scheduled - r->t_added : -1};
    if (lp && lp->wanted && token >= 0) {
        EngEvent *ev = &e->out.events[e->out.events_n - 1];
        ev->logprob = (lp->raw ? lp->raw[token] : lp->token_logit) - lp->lse;
        ev->top_ids = (const int32_t *)(uintptr_t)lp->top_at; /* offsets until the step ends */
        ev->num_top = lp->num_top;
    }
}

/* End one sample: flush held-back text, emit its last event, release its blocks. */
static void finish_sequence(Engine *e, Sequence *seq, FinishReason why, int32_t token,
                            const char *text, size_t len, const RowLogprobs *lp) {
    SeqData *d = seq->owner;
    Request *r = d->req;
    /* The stream's buffer holding `text` is reused by tok_stream_finish: copy it first. */
    size_t at = arena_put(e, text, len);
    if (d->stream) {
        size_t rest_len;
        const char *rest = tok_stream_finish(d->stream, &rest_len);
        if (rest_len) {
            arena_extend(e, rest, rest_len);
            len += rest_len;
        }
    }
    d->finish = why;
    emit(e, r, d->index, token, at, len, why, lp);
    sched_remove(e->sched, seq);
    r->num_finished++;
}

/* Finish every unfinished sample of a request with "abort" (once). */
void eng_abort_request(Engine *e, Request *r) {
    if (r->aborted)
        return;
    r->aborted = 1;
    for (int j = 0; j < r->num_started; j++)
        if (r->data[j].finish == FINISH_NONE)
            finish_sequence(e, r->seqs[j], FINISH_ABORT, -1, "", 0, NULL);
    /* samples not forked yet will never start: they end here too */
    for (int j = r->num_started; j < r->n; j++)
        emit(e, r, j, -1, arena_put(e, "", 0), 0, FINISH_ABORT, NULL);
    r->num_finished += r->n - r->num_started;
}

/* Whether `t` ends sample d now: a stop token, once min_tokens are generated (before that
 * they are masked out of the logits; this holds even if every other token was masked too). */
static int is_stop_token(const Engine *e, const SeqData *d, int32_t t) {
    if (d->num_generated < d->req->params.min_tokens)
        return 0;
    int32_t s;
    for (int i = 0; (s = eng_stop_token(e, d->req, i)) >= 0; i++)
        if (s == t)
            return 1;
    return 0;
}

/* Record a sampled token on its sequence (in place of its placeholder when `placeholder`):
 * stop on EOS or a stop token, append, check lengths, emit. */
void eng_accept_token(Engine *e, Sequence *seq, int32_t token, const RowLogprobs *lp,
                      int placeholder) {
    SeqData *d = seq->owner;
    Request *r = d->req;
    if (placeholder) /* the last token stands for this one */
        seq->num_tokens--;
    int complete = eng_constraint_accept(e, d, token);
    const uint32_t *allowed = r->allowed_mask;
    if (complete < 0 || (allowed && !(allowed[token / 32] >> (token % 32) & 1u))) {
        /* a token outside the constraint or allowed_token_ids: nothing allowed could be drawn
         * (say, min_tokens holding back the only allowed token, EOS) */
        finish_sequence(e, seq, FINISH_ABORT, -1, "", 0, NULL);
        return;
    }
    if (is_stop_token(e, d, token)) {
        finish_sequence(e, seq, FINISH_STOP, -1, "", 0, NULL);
        return;
    }
    seq_append(seq, token);
    d->num_generated++;
    e->generated_tokens++;
    size_t len = 0;
    const char *text = d->stream ? tok_stream_push(d->stream, token, &len) : "";
    if (complete || d->num_generated >= r->params.max_tokens ||
        seq->num_tokens >= e->max_model_len) {
        finish_sequence(e, seq, complete ? FINISH_STOP : FINISH_LENGTH, token, text, len, lp);
        return;
    }
    emit(e, r, d->index, token, arena_put(e, text, len), len, FINISH_NONE, lp);
}

void eng_output_begin_step(Engine *e) {
    e->out.events_n = 0;
    e->out.text_len = 0;
}

void eng_output_end_step(Engine *e, const int32_t *top_ids, const float *top_vals) {
    for (int i = 0; i < e->out.events_n; i++) { /* offsets become pointers: the arenas are final */
        EngEvent *ev = &e->out.events[i];
        ev->text = e->out.text + (uintptr_t)ev->text;
        if (ev->num_top > 0) {
            size_t at = (uintptr_t)ev->top_ids;
            ev->top_ids = top_ids + at;
            ev->top_logprobs = top_vals + at;
        } else {
            ev->top_ids = NULL;
        }
    }
}
