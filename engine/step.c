/* step.c - the engine loop, one step at a time: take new requests and aborts from the inbox,
 * let the scheduler plan the batch, pack it for the model runner, which performs the block
 * copies and runs the model, have the sampler pick the tokens, start the samples that
 * forking prompts begin, and hand the tokens to the output (events: text in context,
 * finish reasons).
 *
 * With asynchronous scheduling (overlap.c) a step that may overlap is launched and left
 * running: its tokens are read by the next eng_step, after it has launched its own step. */
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"

_Static_assert(sizeof(BlockCopy) == 2 * sizeof(int32_t), "BlockCopy is a (src, dst) pair");

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
        eng_start_sequence(e, r, 0, seq);
        PL_CHECK(sched_add(e->sched, seq) == PL_OK); /* validated by eng_add_request */
        /* logit edits: min_tokens' and bad words' masks follow each token, so the host must
         * have seen the last one; and only waiting steps fall back to the host when they are
         * too many */
        r->sync_sampling = r->params.logprobs || eng_has_penalty(&r->params.sampling) ||
                           r->params.min_tokens > 0 || r->params.num_logit_bias > 0 ||
                           r->params.num_bad_words > 0;
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
                eng_abort_request(e, e->active[i]);
    free(inbox);
    free(aborts);
}

/* The decode graph for this step, -1 for an eager forward: a graph needs a pure-decode step
 * (one token per sequence, every one sampled). */
static int pick_graph(const Engine *e, const SchedulerOutput *o) {
    if (e->run.num_graphs == 0)
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
    BatchBuffers *h = &e->run.h;
    int bs = e->cfg.block_size, t = 0, rows = 0, at = 0, num_decode = 0, scatter = 0;
    int width = 1; /* block-table entries a row uses; padding rows read entry 0 */
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
            PL_CHECK(seq->table.num_blocks <= e->run.max_blocks_per_seq);
            width = seq->table.num_blocks > width ? seq->table.num_blocks : width;
            memcpy(h->block_tables + (size_t)at * e->run.max_blocks_per_seq, seq->table.blocks,
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
        seqs = rows = t = num_decode = e->run.graph_size[graph];
        eng_pad_decode_rows(e, o->num_seqs, seqs);
    }
    *j = (RankJob){.kind = JOB_STEP,
                   .o = o,
                   .num_tokens = t,
                   .num_seqs = seqs,
                   .num_rows = rows,
                   .graph = graph,
                   .num_decode = num_decode,
                   .table_width = width,
                   .num_scatter = scatter,
                   .scatter_src = e->ops->host_memory ? e->step_tokens[e->pending.parity]
                                                      : e->smp.dev.d_tokens};
}

/* The samples that prompts fork this step (n > 1): each a child sharing its parent's blocks,
 * with the first token the sampler drew for it (e->smp.fork_tokens, in row order). */
static void fork_samples(Engine *e, const SchedulerOutput *o, const RowLogprobs *lps) {
    int k = 0, f = 0;
    for (int i = 0; i < o->num_seqs; i++) {
        if (!o->seqs[i].sample)
            continue;
        Sequence *parent = o->seqs[i].seq;
        Request *r = ((SeqData *)parent->owner)->req;
        if (r->n > r->num_started) {
            for (int c = 1; c < r->n; c++) {
                Sequence *child = seq_create(e->next_seq_id++, parent->tokens, parent->num_tokens,
                                             r->params.max_tokens);
                eng_start_sequence(e, r, c, child);
                sched_fork(e->sched, parent, child);
                eng_accept_token(e, child, e->smp.fork_tokens[f++], &lps[k], 0);
            }
            if (!r->sync_sampling) /* forked: its steps may overlap now */
                e->num_sync_requests--;
        }
        k++;
    }
    PL_CHECK(f == e->smp.num_fork_tokens);
}

/* Sample every row that wants a token (on the backend when it can), then turn the tokens
 * into events; *t_sampled is when the sampling ended. */
static void sample_and_emit(Engine *e, const SchedulerOutput *o, double *t_sampled) {
    RowLogprobs lps[o->num_seqs > 0 ? o->num_seqs : 1];
    if (eng_device_sample_ok(e, o))
        eng_device_sample(e, o, e->smp.sampled, lps);
    else
        eng_sample_on_host(e, o, e->smp.sampled, lps);
    *t_sampled = pl_now();
    fork_samples(e, o, lps);
    int k = 0;
    for (int i = 0; i < o->num_seqs; i++) {
        if (o->seqs[i].sample) {
            eng_accept_token(e, o->seqs[i].seq, e->smp.sampled[k], &lps[k], 0);
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
    eng_output_begin_step(e);
    e->smp.top_len = 0;
    e->smp.num_fork_tokens = 0; /* whichever path samples, only the host path forks */
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
            eng_stamp_blocks(e, o, e->step_id);
            e->overlapped_steps += e->pending.active;
            /* while this step's forward runs: the previous step's tokens (their matchers
             * advance), then this step's sampling, its constrained rows masked as they now
             * allow (the forward needs no mask, only the sampling does) */
            eng_finish_pending(e);
            eng_sample_async(e, o, parity);
            t[3] = t[4] = pl_now();
            sched_step_done(e->sched, o);
            eng_make_pending(e, o, parity);
        } else {
            if (e->ops->synchronize) /* the forward phase ends when the device is done */
                e->ops->synchronize(e->ops);
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
    eng_output_end_step(e, e->smp.top_ids, e->smp.top_vals);
    retire_finished(e);
    *events = e->out.events;
    return e->out.events_n;
}
