/* scheduler.h - continuous batching: which sequences run in the next step, and how many of
 * their tokens, under the token and sequence budgets, with preemption when KV blocks run out.
 *
 * Queues: waiting (FCFS; preempted-for-recompute sequences go back to its front), running
 * (in arrival order) and swapped. Each step (sched_schedule):
 *   1. running sequences first, oldest first: a decode token each, or the next chunk of a
 *      prompt still being prefilled; when one cannot get a block, the newest running
 *      sequences are preempted (swapped out if the CPU pool has room and the mode allows,
 *      else freed for recompute) until it can, or it is preempted itself;
 *   2. then swapped sequences come back (unless this step preempted);
 *   3. then, only when nothing is left swapped, waiting sequences are admitted, their prompt
 *      prefilled in chunks that fit the remaining token budget (chunked prefill), as long as
 *      the free blocks also cover what the running sequences and the new one are expected to
 *      still generate: each sequence its budget (max_new) times the share of their budget
 *      that recently finished sequences used (1 until some finish; a moving average), times
 *      `conservativeness` (at most the whole budget; 0 reserves nothing). Work that would be
 *      preempted and recomputed is thus not admitted in the first place (an offline batch
 *      whose sequences all run to max_new never preempts), while requests that stop early
 *      soon let more in. With nothing running, the oldest is admitted anyway. Behind a sliding
 *      window on every layer (BlockManagerConfig.sliding_window) a sequence counts the blocks
 *      it holds, its window's and a chunk's (blk_held_blocks), not its length's; after each
 *      step the blocks behind its window are released (sched_step_done).
 * One engine thread owns the scheduler, its sequences and the block manager: no locks. */
#ifndef PAGELLM_SCHEDULER_H
#define PAGELLM_SCHEDULER_H

#include <stdint.h>

#include "block_manager.h"
#include "common.h"

/* swap: swap out while the CPU pool has room, recompute when it is full (nothing ever aborts
 * for lack of swap space); recompute: always free and recompute. */
typedef enum { PREEMPT_SWAP, PREEMPT_RECOMPUTE } PreemptionMode;

typedef enum { SEQ_WAITING, SEQ_RUNNING, SEQ_SWAPPED, SEQ_FINISHED } SeqState;

typedef struct Sequence {
    int64_t id;      /* unique, increasing: arrival order */
    int32_t *tokens; /* [num_tokens] prompt, then generated tokens */
    int num_tokens;
    int capacity;
    int num_prompt;   /* leading tokens that are the prompt */
    int max_new;      /* tokens it may generate at most; 0 = unknown (nothing reserved) */
    int num_computed; /* leading tokens whose KV is in the cache */
    BlockTable table;
    SeqState state;
    int num_preemptions;
    void *owner; /* the engine's data for this sequence */
} Sequence;

/* Make a sequence holding a copy of the prompt; room for max_new more tokens (its budget;
 * 0 = unknown). */
Sequence *seq_create(int64_t id, const int32_t *prompt, int n, int max_new);
/* Append a generated token (capacity grows if needed). */
void seq_append(Sequence *s, int32_t token);
/* Free the sequence (its blocks must have been released by the scheduler). */
void seq_destroy(Sequence *s);

typedef struct {
    int max_num_seqs;           /* sequences per step */
    int max_num_batched_tokens; /* tokens per step */
    int max_model_len;          /* prompt + output */
    int enable_chunked_prefill; /* else a prompt must fit one step's budget whole */
    PreemptionMode preemption_mode;
    double conservativeness; /* scales the growth reserved at admission; 0 = none */
} SchedulerConfig;

/* One sequence's share of a step: tokens [start, start + num_tokens) are computed; when
 * `sample` is set the step ends the sequence's pending tokens and its next token is drawn
 * from the logits of the last one. */
typedef struct {
    Sequence *seq;
    int start;
    int num_tokens;
    int sample;
} ScheduledSeq;

typedef struct {
    ScheduledSeq *seqs; /* [num_seqs], decodes and prefill chunks mixed */
    int num_seqs;
    int num_batched_tokens;
    BlockCopy *swap_out; /* GPU -> CPU copies, done before the step */
    int num_swap_out;
    BlockCopy *swap_in; /* CPU -> GPU copies, after the swap-outs */
    int num_swap_in;
    BlockCopy *copies; /* GPU -> GPU copy-on-write, after the swaps */
    int num_copies;
} SchedulerOutput;

typedef struct {
    int num_running, num_waiting, num_swapped;
    int64_t preempt_swap;         /* preemptions by swap-out */
    int64_t preempt_recompute;    /* preemptions by recompute */
    int64_t prompt_tokens;        /* prompt tokens computed (cache hits excluded) */
    int64_t generation_tokens;    /* decode tokens computed */
    int64_t cached_prompt_tokens; /* prompt tokens served from the prefix cache */
} SchedulerCounters;

typedef struct Scheduler Scheduler;

/* The scheduler uses (does not own) the block manager. NULL + pl_error on a bad config. */
Scheduler *sched_create(const SchedulerConfig *cfg, BlockManager *bm);
void sched_destroy(Scheduler *s);

/* Queue a new sequence (state WAITING). Refuses (PL_ERR_INVALID, with a message) a prompt
 * that can never run: longer than max_model_len, more blocks than the whole pool, or longer
 * than the step budget with chunked prefill off. */
Status sched_add(Scheduler *s, Sequence *seq);

/* Put `child` (a fresh sequence with the parent's tokens) next to its running parent,
 * sharing every block; it is scheduled from the next step on. */
void sched_fork(Scheduler *s, Sequence *parent, Sequence *child);

/* Plan the next step. The output and its arrays stay valid until the next call. */
const SchedulerOutput *sched_schedule(Scheduler *s);

/* After the step ran: record that `out`'s tokens are computed (registering full blocks in
 * the prefix cache), skipping sequences finished meanwhile. The engine appends sampled
 * tokens itself. */
void sched_step_done(Scheduler *s, const SchedulerOutput *out);

/* Remove a sequence from whichever queue holds it and release its blocks (finish, abort).
 * The caller still owns (and destroys) the sequence. */
void sched_remove(Scheduler *s, Sequence *seq);

int sched_has_work(const Scheduler *s);
SchedulerCounters sched_counters(const Scheduler *s);

/* Sequences currently known (waiting, running, swapped): for invariant checks. Writes up to
 * `max` pointers and returns how many there are. */
int sched_sequences(const Scheduler *s, Sequence **out, int max);

#endif
