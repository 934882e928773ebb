/* overlap.c - asynchronous scheduling (Engine.overlap): a step is launched (swaps, forward,
 * sampling, the copy of its tokens to pinned memory) and the engine goes on without waiting
 * for it. Each sequence that will go on gets a placeholder token (-1), so the next eng_step
 * can schedule and launch step N + 1 at once, its input ids for those placeholders scattered
 * on the device from step N's sampled tokens (with tensor parallelism rank 0 copies them to
 * the other ranks' devices, whose scatter waits for that); only then does it wait for step
 * N's tokens and turn them into events, so the host's work runs while the device computes. A
 * sequence that stops on a sampled token has been scheduled once more by then: that step's
 * row is dropped. Every block is stamped with the last step reading and writing it, so that
 * swaps of blocks the running step does not touch start at once, beside it. Requests whose
 * sampling reads the host's token history (penalties), wants logprobs, or still has n > 1
 * samples to fork make the engine wait for each step, as without overlap. */
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"

/* Asynchronous scheduling's buffers, when the configuration and the backend allow it: the
 * backend must be synchronous (CPU) or copy and signal asynchronously and sample on the
 * device (CUDA); with several ranks it must also copy between devices (rank 0's sampled
 * tokens to the others). */
Status eng_overlap_start(Engine *e) {
    const KernelOps *ops = e->ops;
    int backend =
        ops->scatter_tokens &&
        (ops->host_memory || (ops->to_host_async && ops->event_create && e->smp.dev.d_rows));
    /* ranks as MPI processes: not yet (the sampled tokens would go to the others by MPI) */
    int ranks =
        e->run.tp == 1 || (!e->run.mpi && ops->copy_peer && ops->stream_wait && ops->event_create);
    e->overlap = e->cfg.async_scheduling && ranks && backend;
    if (!e->overlap)
        return PL_OK;
    size_t s = (size_t)e->cfg.max_num_seqs;
    for (int p = 0; p < 2; p++) {
        if (!(e->step_tokens[p] = ops->alloc_host(ops, s * sizeof(int32_t))))
            return pl_error_set(PL_ERR_NOMEM, "out of pinned host memory for the sampled tokens");
        e->step_event[p] = ops->event_create ? ops->event_create(ops) : NULL;
    }
    if (e->run.tp > 1)
        e->tokens_copied = ops->event_create(ops);
    e->pending.rows = pl_xcalloc(s, sizeof *e->pending.rows);
    e->block_read_step = pl_xcalloc((size_t)e->num_gpu_blocks, sizeof(int64_t));
    e->block_written_step = pl_xcalloc((size_t)e->num_gpu_blocks, sizeof(int64_t));
    return PL_OK;
}

void eng_overlap_stop(Engine *e) {
    if (e->pending.active && e->ops->synchronize) /* its copies must land first */
        e->ops->synchronize(e->ops);
    for (int p = 0; p < 2; p++) {
        if (e->step_tokens[p])
            e->ops->free_host(e->ops, e->step_tokens[p]);
        if (e->step_event[p])
            e->ops->event_destroy(e->ops, e->step_event[p]);
    }
    if (e->tokens_copied)
        e->ops->event_destroy(e->ops, e->tokens_copied);
    free(e->pending.rows);
    free(e->block_read_step);
    free(e->block_written_step);
    for (int k = 0; k < SWAP_KINDS; k++)
        free(e->swap_plan.pairs[k]);
}

/* Record which blocks step `id` reads and writes (its swaps-to-be-overlapped check them). */
void eng_stamp_blocks(Engine *e, const SchedulerOutput *o, int64_t id) {
    int bs = e->cfg.block_size;
    for (int i = 0; i < o->num_seqs; i++) {
        const ScheduledSeq *ss = &o->seqs[i];
        const BlockTable *t = &ss->seq->table;
        for (int b = t->num_released; b < t->num_blocks; b++) /* released: BLK_RELEASED */
            e->block_read_step[t->blocks[b]] = id;
        for (int p = ss->start; p < ss->start + ss->num_tokens; p += bs - p % bs)
            e->block_written_step[t->blocks[p / bs]] = id;
    }
}

/* Order the step's swaps so that those not touching the pending step's blocks go first
 * and overlap it: a swap-out waits only if the pending step writes its block, a swap-in only
 * if the pending step reads (or writes) the block it fills. Returns the plan, or NULL. */
const SwapPlan *eng_plan_swaps(Engine *e, const SchedulerOutput *o) {
    if (o->num_swap_out + o->num_swap_in == 0)
        return NULL;
    SwapPlan *p = &e->swap_plan;
    int need = o->num_swap_out > o->num_swap_in ? o->num_swap_out : o->num_swap_in;
    if (need > p->cap) {
        p->cap = 2 * need;
        for (int k = 0; k < SWAP_KINDS; k++)
            p->pairs[k] = pl_xrealloc(p->pairs[k], (size_t)p->cap * sizeof(BlockCopy));
    }
    int64_t busy = e->pending.active ? e->pending.id : -1;
    memset(p->n, 0, sizeof p->n);
    for (int i = 0; i < o->num_swap_out; i++) {
        BlockCopy c = o->swap_out[i];
        int k = e->block_written_step && e->block_written_step[c.src] == busy ? SWAP_OUT_AFTER
                                                                              : SWAP_OUT_NOW;
        p->pairs[k][p->n[k]++] = c;
    }
    for (int i = 0; i < o->num_swap_in; i++) {
        BlockCopy c = o->swap_in[i];
        int k =
            e->block_read_step && e->block_read_step[c.dst] == busy ? SWAP_IN_AFTER : SWAP_IN_NOW;
        p->pairs[k][p->n[k]++] = c;
    }
    return p;
}

/* Launch the sampling of an overlapped step: its tokens land in step_tokens[parity] (an
 * event marks when, on an asynchronous backend). */
void eng_sample_async(Engine *e, const SchedulerOutput *o, int parity) {
    if (e->ops->host_memory) {
        RowLogprobs lps[o->num_seqs > 0 ? o->num_seqs : 1];
        eng_sample_on_host(e, o, e->step_tokens[parity], lps);
        return;
    }
    int n = eng_device_sample_async(e, o, e->step_tokens[parity]);
    e->ops->event_record(e->ops, e->step_event[parity]);
    if (e->run.tp == 1 || n == 0)
        return;
    for (int r = 1; r < e->run.tp; r++) /* the other ranks scatter them too */
        e->ops->copy_peer(e->ops, e->run.ranks[r].d_pending_tokens, e->run.ranks[r].ops->device,
                          e->smp.dev.d_tokens, (size_t)n * sizeof(int32_t));
    e->ops->event_record(e->ops, e->tokens_copied);
}

/* The launched step `o` becomes the pending one: each sequence that goes on past its token
 * gets a placeholder for it, so the next step can be scheduled before the token is known. */
void eng_make_pending(Engine *e, const SchedulerOutput *o, int parity) {
    PendingStep *p = &e->pending;
    int k = 0;
    for (int i = 0; i < o->num_seqs; i++) {
        if (!o->seqs[i].sample)
            continue;
        Sequence *seq = o->seqs[i].seq;
        SeqData *d = seq->owner;
        PendingRow *row = &p->rows[k];
        *row = (PendingRow){.seq = seq};
        if (seq->state == SEQ_FINISHED) { /* stopped by the step before: row dropped */
            row->seq = NULL;
        } else {
            d->pending_row = k;
            /* a token ending it (length) needs no placeholder: nothing follows */
            if (d->num_generated + 1 < d->req->params.max_tokens &&
                seq->num_tokens + 1 < e->max_model_len) {
                seq_append(seq, -1);
                row->placeholder = 1;
            }
        }
        k++;
    }
    p->num_rows = k;
    p->parity = parity;
    p->id = e->step_id;
    p->active = 1;
}

/* Wait for the pending step's tokens and accept them (stop checks, text, events). */
void eng_finish_pending(Engine *e) {
    PendingStep *p = &e->pending;
    if (!p->active)
        return;
    p->active = 0;
    if (e->step_event[p->parity])
        e->ops->event_wait(e->ops, e->step_event[p->parity]);
    const int32_t *tokens = e->step_tokens[p->parity];
    for (int k = 0; k < p->num_rows; k++) {
        Sequence *seq = p->rows[k].seq;
        if (!seq)
            continue;
        ((SeqData *)seq->owner)->pending_row = -1;
        if (seq->state != SEQ_FINISHED) /* else aborted meanwhile */
            eng_accept_token(e, seq, tokens[k], NULL, p->rows[k].placeholder);
    }
}

/* Forget the pending step's rows of finished sequences (they are freed with their request). */
void eng_forget_finished_rows(Engine *e) {
    for (int k = 0; e->pending.active && k < e->pending.num_rows; k++) {
        Sequence *seq = e->pending.rows[k].seq;
        if (seq && seq->state == SEQ_FINISHED)
            e->pending.rows[k].seq = NULL;
    }
}
