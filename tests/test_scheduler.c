/* test_scheduler.c - scheduling policy on a real block manager with tiny pools: token
 * budget and chunked prefill, FCFS admission, preemption of the newest sequence (swap, or
 * recompute when the swap pool is full or the mode says so), swapped sequences coming back
 * before new ones, rejection of requests that could never run, and admission that reserves
 * the expected growth of running sequences (schedule conservativeness; the other tests turn it
 * off to create block pressure), and sequences behind a sliding window holding only its blocks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "scheduler.h"

#define BS 4 /* block size */

typedef struct {
    BlockManager *bm;
    Scheduler *s;
    Sequence *seqs[64];
    int n;
} Fixture;

/* The sliding window of the next fixtures' block manager (0: none). */
static int fixture_window = 0;

static Fixture *make_reserving(int gpu_blocks, int cpu_blocks, int budget, int max_seqs,
                               int chunked, PreemptionMode mode, double conservativeness) {
    Fixture *f = calloc(1, sizeof *f);
    BlockManagerConfig bc = {.num_gpu_blocks = gpu_blocks,
                             .num_cpu_blocks = cpu_blocks,
                             .block_size = BS,
                             .watermark = 0,
                             .enable_prefix_caching = 0,
                             .sliding_window = fixture_window,
                             .max_step_tokens = budget};
    f->bm = blk_create(&bc);
    assert_non_null(f->bm);
    SchedulerConfig sc = {.max_num_seqs = max_seqs,
                          .max_num_batched_tokens = budget,
                          .max_model_len = 64,
                          .enable_chunked_prefill = chunked,
                          .preemption_mode = mode,
                          .conservativeness = conservativeness};
    f->s = sched_create(&sc, f->bm);
    assert_non_null(f->s);
    return f;
}

/* Admission without reservation: blocks run out while sequences grow. */
static Fixture *make(int gpu_blocks, int cpu_blocks, int budget, int max_seqs, int chunked,
                     PreemptionMode mode) {
    return make_reserving(gpu_blocks, cpu_blocks, budget, max_seqs, chunked, mode, 0);
}

static void destroy(Fixture *f) {
    for (int i = 0; i < f->n; i++) {
        if (f->seqs[i]->state != SEQ_FINISHED)
            sched_remove(f->s, f->seqs[i]);
        seq_destroy(f->seqs[i]);
    }
    assert_int_equal(blk_num_free_gpu(f->bm), blk_num_gpu(f->bm));
    assert_int_equal(blk_num_free_cpu(f->bm), blk_num_cpu(f->bm));
    sched_destroy(f->s);
    blk_destroy(f->bm);
    free(f);
}

/* Add a sequence with a prompt of `len` distinct tokens and a budget of max_new; returns it. */
static Sequence *add_budget(Fixture *f, int len, int max_new) {
    int32_t prompt[64];
    for (int i = 0; i < len; i++)
        prompt[i] = 100 * f->n + i;
    Sequence *q = seq_create(f->n, prompt, len, max_new);
    f->seqs[f->n++] = q;
    assert_int_equal(sched_add(f->s, q), PL_OK);
    return q;
}

static Sequence *add(Fixture *f, int len) {
    return add_budget(f, len, 8);
}

/* Plan a step, mark it computed, and append a token to every sequence that samples. */
static const SchedulerOutput *step(Fixture *f) {
    const SchedulerOutput *o = sched_schedule(f->s);
    sched_step_done(f->s, o);
    for (int i = 0; i < o->num_seqs; i++)
        if (o->seqs[i].sample)
            seq_append(o->seqs[i].seq, 7);
    return o;
}

static const ScheduledSeq *find(const SchedulerOutput *o, const Sequence *q) {
    for (int i = 0; i < o->num_seqs; i++)
        if (o->seqs[i].seq == q)
            return &o->seqs[i];
    return NULL;
}

static void test_budget_and_chunked_prefill(void **state) {
    (void)state;
    Fixture *f = make(64, 0, 8, 8, 1, PREEMPT_SWAP);
    Sequence *a = add(f, 5), *b = add(f, 10);
    const SchedulerOutput *o = step(f);
    /* a's 5 tokens, then 3 of b's 10 under the budget of 8 */
    assert_int_equal(o->num_batched_tokens, 8);
    assert_int_equal(find(o, a)->num_tokens, 5);
    assert_true(find(o, a)->sample);
    assert_int_equal(find(o, b)->num_tokens, 3);
    assert_false(find(o, b)->sample);
    o = step(f);
    /* decode first: a's 1 token, then b's next chunk of 7 */
    assert_int_equal(find(o, a)->num_tokens, 1);
    assert_int_equal(find(o, b)->start, 3);
    assert_int_equal(find(o, b)->num_tokens, 7);
    assert_true(find(o, b)->sample);
    o = step(f);
    assert_int_equal(o->num_batched_tokens, 2);
    destroy(f);
}

static void test_no_chunking_waits_for_room(void **state) {
    (void)state;
    Fixture *f = make(64, 0, 8, 8, 0, PREEMPT_SWAP);
    Sequence *a = add(f, 5), *b = add(f, 6);
    const SchedulerOutput *o = step(f);
    assert_non_null(find(o, a));
    assert_null(find(o, b)); /* 6 tokens do not fit the remaining 3 */
    o = step(f);
    assert_int_equal(find(o, b)->num_tokens, 6);
    int32_t long_prompt[9] = {0};
    Sequence *c = seq_create(99, long_prompt, 9, 1);
    assert_int_equal(sched_add(f->s, c), PL_ERR_INVALID);
    assert_non_null(strstr(pl_error(), "chunked prefill"));
    seq_destroy(c);
    destroy(f);
}

static void test_max_num_seqs(void **state) {
    (void)state;
    Fixture *f = make(64, 0, 64, 2, 1, PREEMPT_SWAP);
    add(f, 2);
    add(f, 2);
    Sequence *c = add(f, 2);
    const SchedulerOutput *o = step(f);
    assert_int_equal(o->num_seqs, 2);
    assert_null(find(o, c));
    assert_int_equal(c->state, SEQ_WAITING);
    destroy(f);
}

/* 4 GPU blocks of 4 tokens: two 8-token prompts fill them; the first decode needs a 5th. */
static void test_preempts_newest_by_swap_then_swaps_back_first(void **state) {
    (void)state;
    Fixture *f = make(4, 8, 64, 8, 1, PREEMPT_SWAP);
    Sequence *a = add(f, 8), *b = add(f, 8);
    step(f); /* prefill both: 2 blocks each, pool full */
    Sequence *c = add(f, 3);
    const SchedulerOutput *o = step(f); /* a needs a block for token 9: b (newest) goes */
    assert_int_equal(b->state, SEQ_SWAPPED);
    assert_int_equal(o->num_swap_out, 2);
    assert_non_null(find(o, a));
    assert_null(find(o, c)); /* nothing admitted while a sequence is swapped */
    assert_int_equal(sched_counters(f->s).preempt_swap, 1);
    /* finish a: b must come back before c is admitted */
    sched_remove(f->s, a);
    o = step(f);
    assert_int_equal(b->state, SEQ_RUNNING);
    assert_int_equal(o->num_swap_in, 2);
    assert_non_null(find(o, b));
    assert_int_equal(find(o, b)->num_tokens, 1); /* its pending decode token */
    destroy(f);
}

static void test_recompute_when_swap_pool_full(void **state) {
    (void)state;
    Fixture *f = make(4, 1, 64, 8, 1, PREEMPT_SWAP);
    Sequence *a = add(f, 8), *b = add(f, 8);
    step(f); /* prefill */
    step(f); /* b is preempted: 2 blocks do not fit 1 CPU block -> recompute */
    assert_int_equal(b->state, SEQ_WAITING);
    assert_int_equal(b->num_computed, 0);
    assert_int_equal(sched_counters(f->s).preempt_recompute, 1);
    assert_int_equal(sched_counters(f->s).preempt_swap, 0);
    sched_remove(f->s, a);
    const SchedulerOutput *o = step(f); /* b re-prefills prompt + its sampled token */
    assert_int_equal(find(o, b)->start, 0);
    assert_int_equal(find(o, b)->num_tokens, 9);
    assert_true(find(o, b)->sample);
    destroy(f);
}

static void test_recompute_mode(void **state) {
    (void)state;
    Fixture *f = make(4, 8, 64, 8, 1, PREEMPT_RECOMPUTE);
    add(f, 8);
    Sequence *b = add(f, 8);
    step(f);
    step(f);
    assert_int_equal(b->state, SEQ_WAITING);
    assert_int_equal(sched_counters(f->s).preempt_recompute, 1);
    assert_int_equal(blk_num_free_cpu(f->bm), 8);
    destroy(f);
}

/* A lone sequence that cannot grow preempts itself rather than looping. */
static void test_self_preemption(void **state) {
    (void)state;
    Fixture *f = make(2, 0, 64, 8, 1, PREEMPT_SWAP);
    Sequence *a = add(f, 8);
    step(f); /* 2 blocks, full */
    const SchedulerOutput *o = step(f);
    assert_null(find(o, a));
    assert_int_equal(a->state, SEQ_WAITING);
    destroy(f);
}

static void test_rejects_impossible_prompts(void **state) {
    (void)state;
    Fixture *f = make(4, 0, 64, 8, 1, PREEMPT_SWAP);
    int32_t prompt[65] = {0};
    Sequence *q = seq_create(1, prompt, 65, 1);
    assert_int_equal(sched_add(f->s, q), PL_ERR_INVALID);
    assert_non_null(strstr(pl_error(), "max-model-len"));
    seq_destroy(q);
    q = seq_create(2, prompt, 20, 1); /* 5 blocks > 4 in the pool */
    assert_int_equal(sched_add(f->s, q), PL_ERR_INVALID);
    assert_non_null(strstr(pl_error(), "blocks"));
    seq_destroy(q);
    destroy(f);
}

/* Steps until every sequence is done, each finishing after `stop_after` generated tokens (its
 * budget when larger); returns the most sequences that ran at once. */
static int run_all(Fixture *f, int stop_after) {
    int most = 0;
    for (int guard = 0; sched_has_work(f->s) && guard < 10000; guard++) {
        step(f);
        int running = sched_counters(f->s).num_running;
        most = running > most ? running : most;
        for (int i = 0; i < f->n; i++) {
            Sequence *q = f->seqs[i];
            int gen = q->num_tokens - q->num_prompt;
            if (q->state == SEQ_RUNNING && (gen >= q->max_new || gen >= stop_after))
                sched_remove(f->s, q);
        }
    }
    assert_false(sched_has_work(f->s));
    return most;
}

/* 16 blocks of 4 tokens; 6 sequences of 4 prompt tokens that each generate 12 (4 blocks at
 * the end): reserving their growth, 4 run at once and nothing is ever preempted; admitting
 * whenever a prompt fits, all 6 start and the newest are preempted as they grow. */
static void test_admission_reserves_growth(void **state) {
    (void)state;
    Fixture *f = make_reserving(16, 0, 64, 8, 1, PREEMPT_SWAP, 1.0);
    for (int i = 0; i < 6; i++)
        add_budget(f, 4, 12);
    assert_int_equal(run_all(f, 1 << 30), 4);
    SchedulerCounters c = sched_counters(f->s);
    assert_int_equal(c.preempt_swap + c.preempt_recompute, 0);
    assert_int_equal(c.generation_tokens, 6 * 12 - 6); /* the first token comes with the prompt */
    destroy(f);

    f = make(16, 0, 64, 8, 1, PREEMPT_SWAP);
    for (int i = 0; i < 6; i++)
        add_budget(f, 4, 12);
    assert_int_equal(run_all(f, 1 << 30), 6);
    c = sched_counters(f->s);
    assert_true(c.preempt_recompute > 0);
    destroy(f);
}

/* Sequences with a budget of 28 that stop after 4 tokens: at first each reserves its whole
 * budget (2 run at once in 16 blocks); as they finish early the reservation shrinks and more
 * run together, still without preemption. A larger conservativeness keeps it at 2. */
static void test_admission_learns_early_stops(void **state) {
    (void)state;
    Fixture *f = make_reserving(16, 0, 64, 8, 1, PREEMPT_SWAP, 1.0);
    for (int i = 0; i < 4; i++)
        add_budget(f, 4, 28);
    assert_int_equal(run_all(f, 4), 2);
    for (int i = 0; i < 56; i++)
        add_budget(f, 4, 28);
    int most = run_all(f, 4);
    print_message("most running after early stops: %d\n", most);
    assert_true(most > 2);
    SchedulerCounters c = sched_counters(f->s);
    assert_int_equal(c.preempt_swap + c.preempt_recompute, 0);
    destroy(f);

    f = make_reserving(16, 0, 64, 8, 1, PREEMPT_SWAP, 1e9);
    for (int i = 0; i < 60; i++)
        add_budget(f, 4, 28);
    assert_int_equal(run_all(f, 4), 2);
    destroy(f);
}

/* A sliding window of 8 on every layer: four sequences of a 20-token prompt and 100 new tokens
 * each (30 blocks of 4 apiece without the window) run together in a pool of 12 blocks, admitted
 * for their first chunk and the window's blocks (blk_held_blocks), and finish without a single
 * preemption; each holds at most ceil((8 - 1 + 8) / 4) + 1 = 5 blocks while prefilling in chunks
 * of 8, 3 while decoding. */
static void test_window_bounds_blocks(void **state) {
    (void)state;
    fixture_window = 8;
    Fixture *f = make_reserving(12, 0, 8, 8, 1, PREEMPT_RECOMPUTE, 1.0);
    fixture_window = 0;
    for (int i = 0; i < 4; i++)
        add_budget(f, 20, 100);
    const BlockManagerConfig *cfg = blk_config(f->bm);
    int finished = 0, most_decoding = 0;
    for (int it = 0; it < 1000 && finished < 4; it++) {
        step(f);
        for (int i = 0; i < f->n; i++) {
            Sequence *q = f->seqs[i];
            if (q->state != SEQ_RUNNING)
                continue;
            const int held = q->table.num_blocks - q->table.num_released;
            assert_true(held <= blk_held_blocks(cfg, q->num_tokens, 8));
            if (q->num_computed > q->num_prompt)
                most_decoding = held > most_decoding ? held : most_decoding;
            if (q->num_tokens - q->num_prompt == q->max_new) {
                sched_remove(f->s, q);
                finished++;
            }
        }
    }
    assert_int_equal(finished, 4);
    assert_int_equal(most_decoding, 3);
    SchedulerCounters c = sched_counters(f->s);
    assert_int_equal(c.preempt_swap + c.preempt_recompute, 0);
    assert_true(blk_stats(f->bm).released >= 4 * ((120 - 8) / 4 - 1));
    destroy(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_budget_and_chunked_prefill),
        cmocka_unit_test(test_no_chunking_waits_for_room),
        cmocka_unit_test(test_max_num_seqs),
        cmocka_unit_test(test_preempts_newest_by_swap_then_swaps_back_first),
        cmocka_unit_test(test_recompute_when_swap_pool_full),
        cmocka_unit_test(test_recompute_mode),
        cmocka_unit_test(test_self_preemption),
        cmocka_unit_test(test_rejects_impossible_prompts),
        cmocka_unit_test(test_admission_reserves_growth),
        cmocka_unit_test(test_admission_learns_early_stops),
        cmocka_unit_test(test_window_bounds_blocks),
    };
    return cmocka_run_group_tests_name("scheduler", tests, NULL, NULL);
}
