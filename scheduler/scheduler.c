/* scheduler.c - continuous batching with chunked prefill and preemption (see scheduler.h
 * for the policy). Queues are arrays kept sorted by sequence id (= arrival order), so
 * "oldest first" and "preempt the newest" are the two ends of the running array. */
#include <stdlib.h>
#include <string.h>

#include "scheduler.h"

typedef struct {
    Sequence **v;
    int n, cap;
} SeqList;

struct Scheduler {
    SchedulerConfig cfg;
    BlockManager *bm;
    SeqList waiting, running, swapped;
    SchedulerOutput out;
    int seqs_cap, copies_cap; /* capacities of out.seqs and of each copy array */
    SchedulerCounters counters;
    double budget_used; /* moving average over finished sequences of generated / max_new */
};

/* Weight of one finished sequence in budget_used. */
#define BUDGET_USED_WEIGHT (1.0 / 32)

static void list_insert_sorted(SeqList *l, Sequence *s) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 16;
        l->v = pl_xrealloc(l->v, (size_t)l->cap * sizeof *l->v);
    }
    int i = l->n;
    while (i > 0 && l->v[i - 1]->id > s->id)
        i--;
    memmove(l->v + i + 1, l->v + i, (size_t)(l->n - i) * sizeof *l->v);
    l->v[i] = s;
    l->n++;
}

static void list_remove_at(SeqList *l, int i) {
    memmove(l->v + i, l->v + i + 1, (size_t)(l->n - i - 1) * sizeof *l->v);
    l->n--;
}

static int list_find(const SeqList *l, const Sequence *s) {
    for (int i = 0; i < l->n; i++)
        if (l->v[i] == s)
            return i;
    return -1;
}

Scheduler *sched_create(const SchedulerConfig *cfg, BlockManager *bm) {
    if (cfg->max_num_seqs <= 0 || cfg->max_num_batched_tokens <= 0 || cfg->max_model_len <= 0 ||
        !(cfg->conservativeness >= 0)) {
        pl_error_set(PL_ERR_INVALID, "max-num-seqs, max-num-batched-tokens and max-model-len "
                                     "must be positive, schedule-conservativeness not negative");
        return NULL;
    }
    Scheduler *s = pl_xcalloc(1, sizeof *s);
    s->cfg = *cfg;
    s->bm = bm;
    s->budget_used = 1.0;
    return s;
}

void sched_destroy(Scheduler *s) {
    if (!s)
        return;
    free(s->waiting.v);
    free(s->running.v);
    free(s->swapped.v);
    free(s->out.seqs);
    free(s->out.swap_out);
    free(s->out.swap_in);
    free(s->out.copies);
    free(s);
}

/* GPU blocks a sequence of `tokens` holds computing `step` tokens a step (blk_held_blocks:
 * fewer behind a sliding window). */
static int held_blocks(const Scheduler *s, int tokens, int step) {
    return blk_held_blocks(blk_config(s->bm), tokens, step);
}

Status sched_add(Scheduler *s, Sequence *seq) {
    if (seq->num_tokens > s->cfg.max_model_len)
        return pl_error_set(PL_ERR_INVALID, "the prompt has %d tokens, more than max-model-len %d",
                            seq->num_tokens, s->cfg.max_model_len);
    if (!s->cfg.enable_chunked_prefill && seq->num_tokens > s->cfg.max_num_batched_tokens)
        return pl_error_set(PL_ERR_INVALID,
                            "the prompt has %d tokens, more than max-num-batched-tokens %d "
                            "(and chunked prefill is off)",
                            seq->num_tokens, s->cfg.max_num_batched_tokens);
    if (blk_can_allocate(s->bm, seq->tokens, seq->num_tokens) == BLK_ALLOC_NEVER)
        return pl_error_set(
            PL_ERR_INVALID, "the prompt needs %d KV-cache blocks; the cache holds only %d",
            held_blocks(s, seq->num_tokens, s->cfg.max_num_batched_tokens), blk_num_gpu(s->bm));
    seq->state = SEQ_WAITING;
    list_insert_sorted(&s->waiting, seq);
    return PL_OK;
}

void sched_fork(Scheduler *s, Sequence *parent, Sequence *child) {
    PL_CHECK(parent->state == SEQ_RUNNING);
    blk_fork(s->bm, &parent->table, &child->table);
    child->num_computed = parent->num_computed;
    child->state = SEQ_RUNNING;
    list_insert_sorted(&s->running, child);
}

/* Room for n more entries in each copy array (a sequence adds at most its block count). */
static void reserve_copies(Scheduler *s, int n) {
    SchedulerOutput *o = &s->out;
    int need = o->num_swap_out + o->num_swap_in + o->num_copies + n;
    if (need <= s->copies_cap)
        return;
    s->copies_cap = need * 2;
    o->swap_out = pl_xrealloc(o->swap_out, (size_t)s->copies_cap * sizeof(BlockCopy));
    o->swap_in = pl_xrealloc(o->swap_in, (size_t)s->copies_cap * sizeof(BlockCopy));
    o->copies = pl_xrealloc(o->copies, (size_t)s->copies_cap * sizeof(BlockCopy));
}

/* Take a running sequence off the GPU: swap it out if the mode and the CPU pool allow,
 * else free its blocks so it is recomputed from its tokens when readmitted. */
static void preempt(Scheduler *s, int running_index) {
    Sequence *seq = s->running.v[running_index];
    list_remove_at(&s->running, running_index);
    seq->num_preemptions++;
    if (s->cfg.preemption_mode == PREEMPT_SWAP) {
        reserve_copies(s, seq->table.num_blocks);
        int n = blk_swap_out(s->bm, &seq->table, s->out.swap_out + s->out.num_swap_out);
        if (n >= 0) {
            s->out.num_swap_out += n;
            seq->state = SEQ_SWAPPED;
            list_insert_sorted(&s->swapped, seq);
            s->counters.preempt_swap++;
            return;
        }
    }
    blk_free(s->bm, &seq->table);
    seq->num_computed = 0;
    seq->state = SEQ_WAITING;
    list_insert_sorted(&s->waiting, seq);
    s->counters.preempt_recompute++;
}

static void add_scheduled(Scheduler *s, Sequence *seq, int chunk) {
    SchedulerOutput *o = &s->out;
    if (o->num_seqs == s->seqs_cap) {
        s->seqs_cap = s->seqs_cap ? 2 * s->seqs_cap : 64;
        o->seqs = pl_xrealloc(o->seqs, (size_t)s->seqs_cap * sizeof *o->seqs);
    }
    o->seqs[o->num_seqs++] = (ScheduledSeq){.seq = seq,
                                            .start = seq->num_computed,
                                            .num_tokens = chunk,
                                            .sample = seq->num_computed + chunk == seq->num_tokens};
    o->num_batched_tokens += chunk;
}

/* Tokens of `seq` to compute this step given the remaining budget (0 = none fit). */
static int chunk_size(const Scheduler *s, const Sequence *seq, int budget) {
    int need = seq->num_tokens - seq->num_computed;
    if (need <= budget)
        return need;
    return s->cfg.enable_chunked_prefill ? budget : 0;
}

/* Give the table slots up to num_computed + chunk (decode: one new slot), copying a shared
 * block first if needed. */
static void grow_table(Scheduler *s, Sequence *seq, int chunk) {
    int need = seq->num_computed + chunk - seq->table.num_tokens;
    if (need <= 0)
        return;
    BlockCopy cow;
    reserve_copies(s, 1);
    if (blk_append(s->bm, &seq->table, need, &cow))
        s->out.copies[s->out.num_copies++] = cow;
}

/* Step 1: running sequences, oldest first, preempting the newest when blocks run out.
 * Returns the number of preemptions. */
static int schedule_running(Scheduler *s, int *budget) {
    int preempted = 0;
    for (int i = 0; i<s->running.n && * budget> 0 && s->out.num_seqs < s->cfg.max_num_seqs;) {
        Sequence *seq = s->running.v[i];
        int chunk = chunk_size(s, seq, *budget);
        if (chunk == 0) {
            i++;
            continue;
        }
        int need = seq->num_computed + chunk - seq->table.num_tokens;
        int self_preempted = 0;
        while (need > 0 && !blk_can_append(s->bm, &seq->table, need)) {
            int victim = s->running.n - 1;
            preempt(s, victim);
            preempted++;
            if (victim == i) {
                self_preempted = 1;
                break;
            }
        }
        if (self_preempted)
            break;
        grow_table(s, seq, chunk);
        add_scheduled(s, seq, chunk);
        *budget -= chunk;
        i++;
    }
    return preempted;
}

/* Step 2: bring swapped sequences back, oldest first, while blocks and budget allow. */
static void schedule_swapped(Scheduler *s, int *budget) {
    while (s->swapped.n > 0 && *budget > 0 && s->running.n < s->cfg.max_num_seqs) {
        Sequence *seq = s->swapped.v[0];
        int chunk = chunk_size(s, seq, *budget);
        if (chunk == 0)
            break;
        int extra = seq->num_computed + chunk - seq->table.num_tokens;
        if (blk_can_swap_in(s->bm, &seq->table, extra > 0 ? extra : 0) != BLK_ALLOC_OK)
            break;
        reserve_copies(s, seq->table.num_blocks);
        s->out.num_swap_in += blk_swap_in(s->bm, &seq->table, s->out.swap_in + s->out.num_swap_in);
        list_remove_at(&s->swapped, 0);
        seq->state = SEQ_RUNNING;
        list_insert_sorted(&s->running, seq);
        grow_table(s, seq, chunk);
        add_scheduled(s, seq, chunk);
        *budget -= chunk;
    }
}

/* Blocks `seq` is expected to add to those it holds before it finishes: up to its prompt plus
 * the recently used share of its budget (max-model-len at most), from `have` blocks; behind a
 * sliding window, up to the blocks its decode steps hold. */
static int expected_growth(const Scheduler *s, const Sequence *seq, int have) {
    double share = s->budget_used * s->cfg.conservativeness;
    int len = seq->num_prompt + (int)((share < 1 ? share : 1) * seq->max_new + 0.999);
    if (len > s->cfg.max_model_len)
        len = s->cfg.max_model_len;
    int grow = held_blocks(s, len, 1) - have;
    return grow > 0 ? grow : 0;
}

/* Step 3: admit waiting sequences, FCFS, prefilling what fits, while the free blocks cover
 * their prompts and the expected growth of every running sequence and of them (summed over
 * the running ones only when a candidate gets that far: a pure decode step skips it). */
static void schedule_waiting(Scheduler *s, int *budget) {
    int reserved = -1;
    while (s->waiting.n > 0 && *budget > 0 && s->running.n < s->cfg.max_num_seqs) {
        Sequence *seq = s->waiting.v[0];
        if (blk_can_allocate(s->bm, seq->tokens, seq->num_tokens) != BLK_ALLOC_OK)
            break;
        if (reserved < 0) {
            reserved = 0;
            for (int i = 0; i < s->running.n; i++) {
                const BlockTable *t = &s->running.v[i]->table;
                reserved += expected_growth(s, s->running.v[i], t->num_blocks - t->num_released);
            }
        }
        /* worst case: no cache hit (behind a window: its first chunk's, not the prompt's) */
        const int prompt = held_blocks(s, seq->num_tokens, s->cfg.max_num_batched_tokens);
        const int grow = expected_growth(s, seq, prompt);
        if (s->running.n > 0 && blk_num_free_gpu(s->bm) - prompt < reserved + grow)
            break;
        reserved += grow;
        /* Without chunking the whole uncached prompt must fit; the cache hit is only known
         * after allocation, so check the worst case first. */
        if (!s->cfg.enable_chunked_prefill && seq->num_tokens > *budget)
            break;
        int cached = blk_allocate(s->bm, &seq->table, seq->tokens, seq->num_tokens);
        seq->num_computed = cached;
        s->counters.cached_prompt_tokens += cached;
        list_remove_at(&s->waiting, 0);
        seq->state = SEQ_RUNNING;
        list_insert_sorted(&s->running, seq);
        int chunk = chunk_size(s, seq, *budget);
        add_scheduled(s, seq, chunk);
        *budget -= chunk;
    }
}

const SchedulerOutput *sched_schedule(Scheduler *s) {
    SchedulerOutput *o = &s->out;
    o->num_seqs = o->num_batched_tokens = 0;
    o->num_swap_out = o->num_swap_in = o->num_copies = 0;
    int budget = s->cfg.max_num_batched_tokens;
    int preempted = schedule_running(s, &budget);
    if (preempted == 0)
        schedule_swapped(s, &budget);
    if (s->swapped.n == 0)
        schedule_waiting(s, &budget);
    return o;
}

void sched_step_done(Scheduler *s, const SchedulerOutput *out) {
    for (int i = 0; i < out->num_seqs; i++) {
        const ScheduledSeq *ss = &out->seqs[i];
        Sequence *seq = ss->seq;
        if (seq->state == SEQ_FINISHED) /* stopped (or aborted) while the step ran */
            continue;
        int prompt_part = seq->num_prompt - ss->start;
        if (prompt_part > ss->num_tokens)
            prompt_part = ss->num_tokens;
        if (prompt_part < 0)
            prompt_part = 0;
        s->counters.prompt_tokens += prompt_part;
        s->counters.generation_tokens += ss->num_tokens - prompt_part;
        seq->num_computed = ss->start + ss->num_tokens;
        blk_mark_computed(s->bm, &seq->table, seq->tokens, seq->num_computed);
        blk_release_behind(s->bm, &seq->table, seq->num_computed);
    }
}

void sched_remove(Scheduler *s, Sequence *seq) {
    SeqList *lists[] = {&s->running, &s->waiting, &s->swapped};
    for (int l = 0; l < 3; l++) {
        int i = list_find(lists[l], seq);
        if (i >= 0) {
            list_remove_at(lists[l], i);
            break;
        }
    }
    if (seq->state != SEQ_WAITING && seq->max_new > 0) { /* it ran: how much budget it used */
        double used = (double)(seq->num_tokens - seq->num_prompt) / seq->max_new;
        used = used < 0 ? 0 : used > 1 ? 1 : used;
        s->budget_used += (used - s->budget_used) * BUDGET_USED_WEIGHT;
    }
    blk_free(s->bm, &seq->table);
    seq->state = SEQ_FINISHED;
}

int sched_has_work(const Scheduler *s) {
    return s->waiting.n + s->running.n + s->swapped.n > 0;
}

SchedulerCounters sched_counters(const Scheduler *s) {
    SchedulerCounters c = s->counters;
    c.num_running = s->running.n;
    c.num_waiting = s->waiting.n;
    c.num_swapped = s->swapped.n;
    return c;
}

int sched_sequences(const Scheduler *s, Sequence **out, int max) {
    const SeqList *lists[] = {&s->running, &s->waiting, &s->swapped};
    int n = 0;
    for (int l = 0; l < 3; l++)
        for (int i = 0; i < lists[l]->n; i++, n++)
            if (n < max)
                out[n] = lists[l]->v[i];
    return n;
}
