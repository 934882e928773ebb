/* step.c - one engine step: take new requests and aborts from the inbox, let the scheduler
 * plan the batch, perform its block copies, run the model over the packed batch, sample,
 * and turn the new tokens into output events (text in context, finish reasons).
 *
 * With asynchronous scheduling (overlap.c) a step that may overlap is launched and left
 * running: its tokens are read by the next eng_step, after it has launched its own step. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"

_Static_assert(sizeof(BlockCopy) == 2 * sizeof(int32_t), "BlockCopy is a (src, dst) pair");

/* Copy s[0..n) (which may hold NUL characters) into the step's text arena and terminate it;
 * returns its offset (events store offsets until the step ends, since the arena may move
 * while it grows). */
static size_t arena_put(Engine *e, const char *s, size_t n) {
    size_t at = e->text_len;
    if (at + n + 1 > e->text_cap) {
        e->text_cap = (at + n + 1) * 2;
        e->text = pl_xrealloc(e->text, e->text_cap);
    }
    memcpy(e->text + at, s, n);
    e->text[at + n] = '\0';
    e->text_len += n + 1;
    return at;
}

/* Append s[0..n) to the text put last. */
static void arena_extend(Engine *e, const char *s, size_t n) {
    e->text_len--; /* over its terminator */
    arena_put(e, s, n);
}

static void emit(Engine *e, Request *r, int index, int32_t token, size_t text_at, size_t text_len,
                 FinishReason finish, const RowLogprobs *lp) {
    if (e->events_n == e->events_cap) {
        e->events_cap = e->events_cap ? 2 * e->events_cap : 64;
        e->events = pl_xrealloc(e->events, (size_t)e->events_cap * sizeof *e->events);
    }
    e->events[e->events_n++] =
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
        EngEvent *ev = &e->events[e->events_n - 1];
        ev->logprob = (lp->raw ? lp->raw[token] : lp->token_logit) - lp->lse;
        ev->top_ids = (const int32_t *)(uintptr_t)lp->top_at; /* offsets until the step ends */
        ev->num_top = lp->num_top;
    }
}

static void start_sequence(Engine *e, Request *r, int index, Sequence *seq) {
    SeqData *d = &r->data[index];
    d->req = r;
    d->index = index;
    d->sampling = r->params.sampling;
    d->sampling.seed += (uint64_t)index;
    d->stream = e->tok ? tok_stream_create(e->tok, r->prompt, r->num_prompt) : NULL;
    d->pending_row = -1;
    seq->owner = d;
    r->seqs[index] = seq;
    r->num_started++;
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
static void abort_request(Engine *e, Request *r) {
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

static void take_inbox(Engine *e) {
    pthread_mutex_lock(&e->mu);
    Request **inbox = e->inbox;
    int n = e->inbox_n;
    uint64_t *aborts = e->aborts;
    int na = e->aborts_n;
    e->inbox = NULL;
    e->inbox_n = e->inbox_cap = 0;
    e->aborts = NULL;
    e->aborts_n = e->aborts_cap = 0;
    e->busy += n;
    pthread_mutex_unlock(&e->mu);

    for (int i = 0; i < n; i++) {
        Request *r = inbox[i];
        Sequence *seq =
            seq_create(e->next_seq_id++, r->prompt, r->num_prompt, r->params.max_tokens);
        start_sequence(e, r, 0, seq);
        PL_CHECK(sched_add(e->sched, seq) == PL_OK); /* validated by eng_add_request */
        /* logit edits: min_tokens' masks follow each token, so the host must have seen the
         * last one; and only waiting steps fall back to the host when they are too many */
        r->sync_sampling = r->params.logprobs || eng_has_penalty(&r->params.sampling) ||
                           r->params.min_tokens > 0 || r->params.num_logit_bias > 0;
        e->num_sync_requests += r->sync_sampling || r->n > 1;
        if (e->active_n == e->active_cap) {
            e->active_cap = e->active_cap ? 2 * e->active_cap : 16;
            e->active = pl_xrealloc(e->active, (size_t)e->active_cap * sizeof *e->active);
        }
        e->active[e->active_n++] = r;
    }
    for (int a = 0; a < na; a++)
        for (int i = 0; i < e->active_n; i++)
            if (e->active[i]->id == aborts[a] || aborts[a] == ENG_ABORT_ALL)
                abort_request(e, e->active[i]);
    free(inbox);
    free(aborts);
}

/* The decode graph for this step, -1 for an eager forward: a graph needs a pure-decode step
 * (one token per sequence, every one sampled). */
static int pick_graph(const Engine *e, const SchedulerOutput *o) {
    if (e->num_graphs == 0)
        return -1;
    for (int i = 0; i < o->num_seqs; i++)
        if (o->seqs[i].num_tokens != 1 || !o->seqs[i].sample)
            return -1;
    return eng_graph_for(e, o->num_seqs);
}

/* Pack the scheduled tokens into the host step batch (padded to the graph's rows when
 * `graph` >= 0) and describe it in j (each rank uploads it). Single-token sequences come first in
 * the batch (so the backend can give them its decode attention), prompt chunks after; the logit
 * rows stay in the scheduler's order, which is the order sampling walks. */
static void build_batch(Engine *e, const SchedulerOutput *o, int graph, RankJob *j) {
    BatchBuffers *h = &e->h;
    int bs = e->cfg.block_size, t = 0, rows = 0, at = 0, num_decode = 0, scatter = 0;
    int last_row[o->num_seqs > 0 ? o->num_seqs : 1];
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < o->num_seqs; i++) {
            const ScheduledSeq *ss = &o->seqs[i];
            if ((ss->num_tokens == 1) != (pass == 0))
                continue;
            const Sequence *seq = ss->seq;
            h->query_start[at] = t;
            for (int j = 0; j < ss->num_tokens; j++, t++) {
                int p = ss->start + j;
                h->tokens[t] = seq->tokens[p];
                h->positions[t] = p;
                h->slots[t] = (int64_t)seq->table.blocks[p / bs] * bs + p % bs;
                if (h->tokens[t] < 0) { /* a placeholder: sampled by the pending step */
                    const SeqData *d = seq->owner;
                    PL_CHECK(e->pending.active && d->pending_row >= 0);
                    h->tokens[t] = 0;
                    h->scatter[2 * scatter] = t;
                    h->scatter[2 * scatter + 1] = d->pending_row;
                    scatter++;
                }
            }
            PL_CHECK(seq->table.num_blocks <= e->max_blocks_per_seq);
            memcpy(h->block_tables + (size_t)at * e->max_blocks_per_seq, seq->table.blocks,
                   (size_t)seq->table.num_blocks * sizeof(int32_t));
            last_row[i] = t - 1;
            at++;
            num_decode += pass == 0;
        }
    }
    for (int i = 0; i < o->num_seqs; i++)
        if (o->seqs[i].sample)
            h->logit_rows[rows++] = last_row[i];
    h->query_start[o->num_seqs] = t;
    int seqs = o->num_seqs;
    if (graph >= 0) {
        seqs = rows = t = num_decode = e->graph_size[graph];
        eng_pad_decode_rows(e, o->num_seqs, seqs);
    }
    *j = (RankJob){.kind = JOB_STEP,
                   .o = o,
                   .num_tokens = t,
                   .num_seqs = seqs,
                   .num_rows = rows,
                   .graph = graph,
                   .num_decode = num_decode,
                   .num_scatter = scatter,
                   .scatter_src =
                       e->ops->host_memory ? e->step_tokens[e->pending.parity] : e->ds.d_tokens};
}

static SampleRequest sample_request(const Sequence *seq) {
    const SeqData *d = seq->owner;
    return (SampleRequest){.params = &d->sampling,
                           .prompt = seq->tokens,
                           .num_prompt = seq->num_prompt,
                           .output = seq->tokens + seq->num_prompt,
                           .num_output = seq->num_tokens - seq->num_prompt};
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
    if (is_stop_token(e, d, token)) {
        finish_sequence(e, seq, FINISH_STOP, -1, "", 0, NULL);
        return;
    }
    seq_append(seq, token);
    d->num_generated++;
    e->generated_tokens++;
    size_t len = 0;
    const char *text = d->stream ? tok_stream_push(d->stream, token, &len) : "";
    if (d->num_generated >= r->params.max_tokens || seq->num_tokens >= e->max_model_len) {
        finish_sequence(e, seq, FINISH_LENGTH, token, text, len, lp);
        return;
    }
    emit(e, r, d->index, token, arena_put(e, text, len), len, FINISH_NONE, lp);
}

/* The k most likely tokens of a row of `vocab` logits into ids/vals (best first); returns
 * how many (k, or vocab when smaller). k must be at least 1. */
static int row_top_k(const float *row, int vocab, int k, int32_t *ids, float *vals) {
    PL_CHECK(k >= 1 && vocab >= 1);
    if (k > vocab)
        k = vocab;
    int n = 0;
    for (int i = 0; i < vocab; i++) { /* insertion into a sorted top-k: k is small */
        if (n == k && row[i] <= vals[k - 1])
            continue;
        int j = n < k ? n++ : k - 1;
        while (j > 0 && vals[j - 1] < row[i]) {
            vals[j] = vals[j - 1];
            ids[j] = ids[j - 1];
            j--;
        }
        vals[j] = row[i];
        ids[j] = i;
    }
    return n;
}

/* Before sampling changes the row: keep its raw logits, its log-sum-exp and its k most
 * likely tokens (best first; none for k = 0, the chosen token's logprob alone) for the
 * events. */
static void row_logprobs(Engine *e, const float *row, int vocab, int slot, int k, RowLogprobs *lp) {
    PL_CHECK((size_t)(slot + 1) * vocab <= e->raw_cap); /* sized by sample_and_emit */
    PL_CHECK(k >= 0);
    float *raw = e->raw_rows + (size_t)slot * vocab;
    memcpy(raw, row, (size_t)vocab * sizeof(float));
    float max = raw[0];
    for (int i = 1; i < vocab; i++)
        max = raw[i] > max ? raw[i] : max;
    double sum = 0;
    for (int i = 0; i < vocab; i++)
        sum += exp((double)(raw[i] - max));
    lp->wanted = 1;
    lp->raw = raw;
    lp->lse = max + (float)log(sum);
    size_t at = eng_top_reserve(e, (size_t)k);
    int n = k > 0 ? row_top_k(raw, vocab, k, e->top_ids + at, e->top_vals + at) : 0;
    for (int i = 0; i < n; i++)
        e->top_vals[at + i] -= lp->lse;
    lp->top_at = at;
    lp->num_top = n;
    e->top_len = at + (size_t)n; /* give back what the row did not fill */
}

/* The prompt's first sample of an n > 1 request: fork the other samples off it, each
 * drawing its own first token from a copy of the same logits row. */
static void fork_samples(Engine *e, Sequence *parent, const float *row, int vocab,
                         const RowLogprobs *lp) {
    Request *r = ((SeqData *)parent->owner)->req;
    for (int i = 1; i < r->n; i++) {
        Sequence *child =
            seq_create(e->next_seq_id++, parent->tokens, parent->num_tokens, r->params.max_tokens);
        start_sequence(e, r, i, child);
        sched_fork(e->sched, parent, child);
        memcpy(e->fork_logits, row, (size_t)vocab * sizeof(float));
        SampleRequest sr = sample_request(child);
        int32_t token;
        k_cpu_ops()->sample(&token, e->fork_logits, 1, vocab, &sr);
        eng_accept_token(e, child, token, lp, 0);
    }
    if (!r->sync_sampling) /* forked: its steps may overlap now */
        e->num_sync_requests--;
}

/* The logits are on the host: logprobs, forks and sampling there (the CPU sampler). */
void eng_sample_on_host(Engine *e, const SchedulerOutput *o, int32_t *tokens, RowLogprobs *lps) {
    int vocab = model_config(e->model)->vocab_size, k = 0, wanted = 0;
    const float *dev_logits = e->ranks[0].d.logits;
    if (dev_logits != e->h.logits) {
        int rows = 0;
        for (int i = 0; i < o->num_seqs; i++)
            rows += o->seqs[i].sample;
        e->ops->to_host(e->h.logits, dev_logits, (size_t)rows * vocab * sizeof(float));
    }
    /* room for the raw rows first: their events point into it until the step ends */
    for (int i = 0; i < o->num_seqs; i++)
        wanted += o->seqs[i].sample && ((SeqData *)o->seqs[i].seq->owner)->req->params.logprobs;
    if ((size_t)wanted * vocab > e->raw_cap) {
        e->raw_cap = (size_t)wanted * vocab * 2;
        free(e->raw_rows);
        e->raw_rows = pl_xmalloc(e->raw_cap * sizeof(float));
    }
    int num_raw = 0;
    for (int i = 0; i < o->num_seqs; i++) {
        if (!o->seqs[i].sample)
            continue;
        Sequence *seq = o->seqs[i].seq;
        Request *r = ((SeqData *)seq->owner)->req;
        float *row = e->h.logits + (size_t)k * vocab;
        lps[k] = (RowLogprobs){0};
        if (r->params.logprobs)
            row_logprobs(e, row, vocab, num_raw++, r->params.top_logprobs, &lps[k]);
        const SeqData *d = seq->owner;
        int edits = eng_collect_edits(e, &d, 1);
        if (edits) /* after the raw logprobs, before forks copy the row */
            k_cpu_ops()->logits_add(row, vocab, e->edits, edits);
        if (r->n > r->num_started) /* before sampling modifies the row in place */
            fork_samples(e, seq, row, vocab, &lps[k]);
        e->sample_reqs[k++] = sample_request(seq);
    }
    k_cpu_ops()->sample(tokens, e->h.logits, k, vocab, e->sample_reqs);
}

/* Sample every row that wants a token (on the backend when it can), then turn the tokens
 * into events; *t_sampled is when the sampling ended. */
static void sample_and_emit(Engine *e, const SchedulerOutput *o, double *t_sampled) {
    RowLogprobs lps[o->num_seqs > 0 ? o->num_seqs : 1];
    if (eng_device_sample_ok(e, o))
        eng_device_sample(e, o, e->sampled, lps);
    else
        eng_sample_on_host(e, o, e->sampled, lps);
    *t_sampled = pl_now();
    int k = 0;
    for (int i = 0; i < o->num_seqs; i++) {
        if (o->seqs[i].sample) {
            eng_accept_token(e, o->seqs[i].seq, e->sampled[k], &lps[k], 0);
            k++;
        }
    }
}

/* Drop requests whose samples have all finished (the pending step forgets their rows). */
static void retire_finished(Engine *e) {
    eng_forget_finished_rows(e);
    int kept = 0, retired = 0;
    for (int i = 0; i < e->active_n; i++) {
        Request *r = e->active[i];
        if (r->num_finished >= r->n) {
            e->num_sync_requests -= r->sync_sampling || r->n > r->num_started;
            eng_request_free(e, r);
            retired++;
        } else {
            e->active[kept++] = r;
        }
    }
    e->active_n = kept;
    if (retired) {
        pthread_mutex_lock(&e->mu);
        e->busy -= retired;
        pthread_mutex_unlock(&e->mu);
    }
}

/* Whether this step may be overlapped: on, and no active request needs the host to see
 * each token before the next step is launched. */
static int overlap_now(const Engine *e) {
    return e->overlap && e->num_sync_requests == 0;
}

int eng_step(Engine *e, const EngEvent **events) {
    e->events_n = 0;
    e->text_len = 0;
    e->top_len = 0;
    double t[6];
    t[0] = pl_now();
    take_inbox(e);
    int overlap = overlap_now(e);
    if (!overlap) /* a step that must wait for its tokens starts from a finished one */
        eng_finish_pending(e);
    const SchedulerOutput *o = sched_schedule(e->sched);
    if (o->num_seqs == 0) {
        if (o->num_swap_out || o->num_swap_in || o->num_copies) {
            RankJob copies = {.kind = JOB_STEP, .o = o, .swaps = eng_plan_swaps(e, o)};
            eng_ranks_run(e, &copies); /* block copies only */
        }
        eng_finish_pending(e);
    }
    int decode = o->num_seqs > 0;
    for (int i = 0; i < o->num_seqs; i++)
        decode &= o->seqs[i].num_tokens == 1;
    if (o->num_seqs > 0) {
        double now = pl_now();
        for (int i = 0; i < o->num_seqs; i++) {
            Request *r = ((SeqData *)o->seqs[i].seq->owner)->req;
            if (r->t_scheduled == 0)
                r->t_scheduled = now;
        }
        RankJob job;
        t[1] = pl_now();
        build_batch(e, o, pick_graph(e, o), &job);
        job.swaps = eng_plan_swaps(e, o);
        t[2] = pl_now();
        eng_ranks_run(e, &job); /* block copies, upload and forward on every rank */
        if (overlap) {
            int parity = (int)(++e->step_id & 1);
            eng_sample_async(e, o, parity);
            eng_stamp_blocks(e, o, e->step_id);
            e->overlapped_steps += e->pending.active;
            eng_finish_pending(e); /* the previous step's tokens, while this one runs */
            t[3] = t[4] = pl_now();
            sched_step_done(e->sched, o);
            eng_make_pending(e, o, parity);
        } else {
            if (e->ops->synchronize) /* the forward phase ends when the device is done */
                e->ops->synchronize();
            t[3] = pl_now();
            sched_step_done(e->sched, o);
            sample_and_emit(e, o, &t[4]);
        }
        t[5] = pl_now();
        if (decode) {
            e->decode_steps++;
            e->decode_rows += o->num_seqs;
            for (int i = 0; i < 5; i++)
                e->decode_seconds[i] += t[i + 1] - t[i];
        } else {
            e->other_steps++;
            e->other_tokens += o->num_batched_tokens;
        }
    }
    for (int i = 0; i < e->events_n; i++) { /* offsets become pointers: the arenas are final */
        EngEvent *ev = &e->events[i];
        ev->text = e->text + (uintptr_t)ev->text;
        if (ev->num_top > 0) {
            size_t at = (uintptr_t)ev->top_ids;
            ev->top_ids = e->top_ids + at;
            ev->top_logprobs = e->top_vals + at;
        } else {
            ev->top_ids = NULL;
        }
    }
    retire_finished(e);
    *events = e->events;
    return e->events_n;
}
