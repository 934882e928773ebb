/* test_engine.c - the continuous-batching engine on the bundled model: many concurrent
 * requests under KV-memory pressure (swap and recompute) give exactly the completions of
 * undisturbed runs, blocks never leak (aborts included), forked samples share their
 * prompt's blocks, prefix caching skips recomputation, and KV waste stays under a block. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "kernels.h"
#include "backend_test_util.h"

#define MODEL_DIR    "models/stories260K"
#define NUM_REQUESTS 64
#define MAX_OUT      64

static const char *sentences[] = {
    "Once upon a time",       "Lily and Tom",
    "The cat sat on the",     "One day, a little bird",
    "Tim had a big red ball", "The sun was shining and",
    "Mom said to Sue",        "There was a small dog named Max. He",
};

typedef struct {
    int32_t prompt[64];
    int num_prompt;
    int max_tokens;
    int32_t out[MAX_OUT];
    int num_out;
    FinishReason finish;
} Job;

/* kv-cache-dtype of every engine the tests make (1: fp8, for the fp8 runs of a test). */
static int kv_fp8;

static EngineConfig base_config(void) {
    EngineConfig c = eng_config_default();
    c.model_dir = MODEL_DIR;
    c.quiet = 1;
    c.kv_cache_fp8 = kv_fp8;
    return c;
}

static Engine *make_engine(const EngineConfig *c) {
    Engine *e = NULL;
    if (eng_create(c, &e) != PL_OK)
        fail_msg("eng_create: %s", pl_error());
    return e;
}

/* Bytes of one KV block of the bundled model (fp32 K and V of every layer; fp8: a quarter). */
static double block_gib(int block_size) {
    return 5.0 * 2 * block_size * 4 * 8 * (kv_fp8 ? 1 : 4) / (1024.0 * 1024.0 * 1024.0);
}

static void make_jobs(Engine *e, Job *jobs, int n) {
    for (int i = 0; i < n; i++) {
        const char *text = sentences[i % 8];
        int32_t *ids;
        int len;
        assert_int_equal(tok_encode(eng_tokenizer(e), text, strlen(text), 1, &ids, &len), PL_OK);
        memcpy(jobs[i].prompt, ids, (size_t)len * sizeof(int32_t));
        free(ids);
        /* vary prompts beyond the 8 sentences so that prefixes are shared but not all */
        jobs[i].prompt[len++] = 300 + i;
        jobs[i].num_prompt = len;
        jobs[i].max_tokens = 24 + (i * 7) % 40;
        jobs[i].num_out = 0;
        jobs[i].finish = FINISH_NONE;
    }
}

/* Job i with its own parameters, from the step `at` on; returns the number of steps. */
static int run_staggered(Engine *e, Job *jobs, const GenerateParams *gp, const int *at, int n) {
    int steps = 0, added = 0;
    while (added < n || eng_has_work(e)) {
        for (int i = 0; i < n; i++) {
            if (at[i] != steps)
                continue;
            EngRequest r = {.prompt = jobs[i].prompt,
                            .num_prompt = jobs[i].num_prompt,
                            .params = gp[i],
                            .user = &jobs[i]};
            assert_int_equal(eng_add_request(e, &r, NULL), PL_OK);
            added++;
        }
        const EngEvent *ev;
        int count = eng_step(e, &ev);
        for (int k = 0; k < count; k++) {
            Job *j = ev[k].user;
            if (ev[k].token >= 0) {
                assert_true(j->num_out < MAX_OUT);
                j->out[j->num_out++] = ev[k].token;
            }
            if (ev[k].finish != FINISH_NONE)
                j->finish = ev[k].finish;
        }
        assert_true(++steps < 100000);
    }
    return steps;
}

/* Run every job concurrently to the end; returns the number of steps. */
static int run_jobs(Engine *e, Job *jobs, int n, const GenerateParams *base) {
    GenerateParams gp[n];
    int at[n];
    for (int i = 0; i < n; i++) {
        gp[i] = *base;
        gp[i].max_tokens = jobs[i].max_tokens;
        at[i] = 0;
    }
    return run_staggered(e, jobs, gp, at, n);
}

static void assert_all_blocks_free(Engine *e) {
    EngineStats s = eng_stats(e);
    assert_int_equal(s.free_gpu_blocks, s.num_gpu_blocks);
    assert_int_equal(s.free_cpu_blocks, s.num_cpu_blocks);
    assert_int_equal(s.sched.num_running + s.sched.num_waiting + s.sched.num_swapped, 0);
}

/* Reference: each job alone on a roomy engine, every step waiting for its tokens. */
static void run_alone(Job *jobs, int n, const GenerateParams *gp) {
    EngineConfig c = base_config();
    c.enable_prefix_caching = 0;
    c.async_scheduling = 0;
    Engine *e = make_engine(&c);
    for (int i = 0; i < n; i++)
        run_jobs(e, &jobs[i], 1, gp);
    assert_all_blocks_free(e);
    eng_destroy(e);
}

static void assert_same_outputs(const Job *a, const Job *b, int n) {
    for (int i = 0; i < n; i++) {
        if (a[i].num_out != b[i].num_out || memcmp(a[i].out, b[i].out, a[i].num_out * 4))
            fail_msg("request %d: %d tokens vs %d alone, or different tokens", i, a[i].num_out,
                     b[i].num_out);
        assert_int_equal(a[i].finish, b[i].finish);
    }
}

/* 64 concurrent requests on a pool too small for them (asynchronous scheduling on, as by
 * default): outputs equal each one's run alone; `eos`: they may stop early, so that
 * sequences are scheduled once past their end and the overlapped step's row dropped. Admission
 * reserves nothing (schedule conservativeness 0), so blocks run out as sequences grow, unless
 * `reserve`: then (with default conservativeness) nothing may be preempted. */
static void pressure_run(int swap_blocks, int expect_swap, int expect_recompute, int seeded,
                         int eos, int reserve) {
    EngineConfig c = base_config();
    c.num_gpu_blocks_override = 40; /* 64 requests need ~250 blocks at once */
    if (!reserve)
        c.schedule_conservativeness = 0;
    c.swap_space_gib = swap_blocks * block_gib(16);
    c.max_num_batched_tokens = 64;
    GenerateParams gp = {.sampling = sampling_params_default(), .ignore_eos = !eos};
    if (seeded) {
        gp.sampling.temperature = 0.8f;
        gp.sampling.top_p = 0.9f;
        gp.sampling.seed = 1234;
    }
    Engine *e = make_engine(&c);
    int32_t stop_id = 0, *ids;
    int len;
    if (eos) { /* the bundled model rarely ends a story this soon: stop at a full stop too */
        assert_int_equal(tok_encode(eng_tokenizer(e), ".", 1, 0, &ids, &len), PL_OK);
        stop_id = ids[len - 1];
        free(ids);
        gp.stop_token_ids = &stop_id;
        gp.num_stop_token_ids = 1;
    }
    static Job batch[NUM_REQUESTS], alone[NUM_REQUESTS];
    make_jobs(e, batch, NUM_REQUESTS);
    memcpy(alone, batch, sizeof batch);
    run_jobs(e, batch, NUM_REQUESTS, &gp);
    EngineStats s = eng_stats(e);
    print_message("swap blocks %d: preempt swap %lld, recompute %lld, swapped out %lld, in %lld\n",
                  swap_blocks, (long long)s.sched.preempt_swap,
                  (long long)s.sched.preempt_recompute, (long long)s.blocks.swapped_out,
                  (long long)s.blocks.swapped_in);
    if (expect_swap) {
        assert_true(s.sched.preempt_swap > 0);
        assert_true(s.blocks.swapped_out > 0);
        assert_true(s.blocks.swapped_in > 0);
    }
    if (expect_recompute)
        assert_true(s.sched.preempt_recompute > 0);
    if (reserve)
        assert_int_equal(s.sched.preempt_swap + s.sched.preempt_recompute, 0);
    assert_true(s.overlapped_steps > 0);
    assert_all_blocks_free(e);
    eng_destroy(e);
    run_alone(alone, NUM_REQUESTS, &gp);
    assert_same_outputs(batch, alone, NUM_REQUESTS);
    if (eos) { /* the early stops happened */
        int stopped = 0;
        for (int i = 0; i < NUM_REQUESTS; i++)
            stopped += batch[i].finish == FINISH_STOP;
        print_message("%d of %d requests stopped at their stop token\n", stopped, NUM_REQUESTS);
        assert_true(stopped > 0);
    }
}

/* The same 64 requests with admission reserving their growth (the default): none is ever
 * preempted, outputs equal solo runs. */
static void test_reserving_admission_never_preempts(void **state) {
    (void)state;
    pressure_run(0, 0, 0, 0, 0, 1);
}

/* Roomy swap pool: preemption by swapping; outputs equal solo runs. */
static void test_swap_preemption_keeps_outputs(void **state) {
    (void)state;
    pressure_run(400, 1, 0, 0, 0, 0);
}

/* Tiny swap pool: swapping until it is full, then recompute; outputs still equal. */
static void test_swap_and_recompute_keep_outputs(void **state) {
    (void)state;
    pressure_run(6, 1, 1, 0, 0, 0);
}

/* No swap space: recompute only; sampled (seeded) outputs equal too. */
static void test_recompute_keeps_seeded_outputs(void **state) {
    (void)state;
    pressure_run(0, 0, 1, 1, 0, 0);
}

/* Sampled requests that stop early (a stop token), under swap pressure, overlapped. */
static void test_overlapped_steps_stop_and_swap_like_solo_runs(void **state) {
    (void)state;
    pressure_run(400, 1, 0, 1, 1, 0);
}

/* Requests that make steps wait (logprobs, penalties) arrive and leave among overlapped
 * ones, under swap pressure: the engine switches between both kinds of step many times and
 * every output still equals its run alone. */
static void test_switching_between_overlapped_and_waiting_steps(void **state) {
    (void)state;
    enum { N = 48 };
    EngineConfig c = base_config();
    c.num_gpu_blocks_override = 40;
    c.swap_space_gib = 400 * block_gib(16);
    c.max_num_batched_tokens = 64;
    c.schedule_conservativeness = 0; /* admit freely: blocks run out */
    Engine *e = make_engine(&c);
    static Job batch[N], alone[N];
    GenerateParams gp[N];
    int at[N];
    make_jobs(e, batch, N);
    for (int i = 0; i < N; i++) {
        gp[i] = (GenerateParams){.sampling = sampling_params_default(),
                                 .ignore_eos = 1,
                                 .max_tokens = batch[i].max_tokens};
        gp[i].sampling.temperature = 0.8f;
        gp[i].sampling.seed = 99;
        at[i] = i % 2 ? 0 : 3 * i; /* half at once, half spread over the run */
        if (i % 6 == 2) {          /* waits for each step while it runs */
            gp[i].logprobs = 1;
            gp[i].top_logprobs = 2;
            gp[i].max_tokens = batch[i].max_tokens = 6;
        } else if (i % 6 == 4) {
            gp[i].sampling.presence_penalty = 0.5f;
            gp[i].max_tokens = batch[i].max_tokens = 8;
        }
    }
    memcpy(alone, batch, sizeof batch);
    int steps = run_staggered(e, batch, gp, at, N);
    EngineStats s = eng_stats(e);
    print_message("%lld of %d steps overlapped, %lld swap-outs\n", (long long)s.overlapped_steps,
                  steps, (long long)s.blocks.swapped_out);
    assert_true(s.overlapped_steps > 0 && s.overlapped_steps < steps / 2);
    assert_true(s.blocks.swapped_out > 0);
    assert_all_blocks_free(e);
    eng_destroy(e);
    EngineConfig cs = base_config();
    cs.async_scheduling = 0;
    Engine *solo = make_engine(&cs);
    for (int i = 0; i < N; i++) {
        int at_once[1] = {0};
        run_staggered(solo, &alone[i], &gp[i], at_once, 1);
    }
    eng_destroy(solo);
    assert_same_outputs(batch, alone, N);
}

static void test_abort_frees_blocks(void **state) {
    (void)state;
    EngineConfig c = base_config();
    c.max_num_batched_tokens = 4; /* prompts take several steps to prefill */
    Engine *e = make_engine(&c);
    static Job jobs[8];
    make_jobs(e, jobs, 8);
    uint64_t ids[8];
    GenerateParams gp = {.sampling = sampling_params_default(), .ignore_eos = 1, .max_tokens = 50};
    for (int i = 0; i < 8; i++) {
        EngRequest r = {.prompt = jobs[i].prompt,
                        .num_prompt = jobs[i].num_prompt,
                        .params = gp,
                        .user = &jobs[i]};
        assert_int_equal(eng_add_request(e, &r, &ids[i]), PL_OK);
    }
    const EngEvent *ev;
    int aborted = 0;
    for (int step = 0; eng_has_work(e); step++) {
        if (step == 1) {
            eng_abort(e, ids[0]); /* mid-prefill */
            eng_abort(e, ids[7]); /* still waiting */
        } else if (step == 30) {
            for (int i = 1; i < 7; i++) /* mid-decode */
                eng_abort(e, ids[i]);
        }
        int n = eng_step(e, &ev);
        for (int k = 0; k < n; k++) {
            Job *j = ev[k].user;
            if (ev[k].finish != FINISH_NONE)
                j->finish = ev[k].finish;
            aborted += ev[k].finish == FINISH_ABORT;
        }
    }
    assert_int_equal(aborted, 8);
    for (int i = 0; i < 8; i++)
        assert_int_equal(jobs[i].finish, FINISH_ABORT);
    assert_all_blocks_free(e);
    eng_destroy(e);
}

/* n = 4 with a seed: the samples share the prompt's blocks and equal four separate
 * requests seeded seed + i. */
static void test_forked_samples_share_blocks(void **state) {
    (void)state;
    EngineConfig c = base_config();
    c.enable_prefix_caching = 0;
    Engine *e = make_engine(&c);
    int32_t prompt[40];
    for (int i = 0; i < 40; i++)
        prompt[i] = i == 0 ? 1 : 259 + (i * 13) % 200; /* 40 tokens: 2 full blocks + 8 */
    GenerateParams gp = {
        .sampling = sampling_params_default(), .max_tokens = 20, .ignore_eos = 1, .n = 4};
    gp.sampling.temperature = 1.0f;
    gp.sampling.seed = 99;
    static Job forked[4];
    EngRequest r = {.prompt = prompt, .num_prompt = 40, .params = gp};
    assert_int_equal(eng_add_request(e, &r, NULL), PL_OK);
    const EngEvent *ev;
    int max_used = 0;
    while (eng_has_work(e)) {
        int n = eng_step(e, &ev);
        for (int k = 0; k < n; k++)
            if (ev[k].token >= 0)
                forked[ev[k].index].out[forked[ev[k].index].num_out++] = ev[k].token;
        EngineStats s = eng_stats(e);
        if (s.num_gpu_blocks - s.free_gpu_blocks > max_used)
            max_used = s.num_gpu_blocks - s.free_gpu_blocks;
    }
    /* separate: 4 x ceil(60/16) = 16 blocks; shared: 2 prompt blocks + 4 x 2 = 10 */
    print_message("forked samples used at most %d blocks\n", max_used);
    assert_true(max_used <= 10);
    assert_all_blocks_free(e);
    for (int i = 0; i < 4; i++) {
        Job alone = {.num_prompt = 40, .max_tokens = 20};
        memcpy(alone.prompt, prompt, sizeof prompt);
        GenerateParams one = gp;
        one.n = 1;
        one.sampling.seed = 99 + i;
        run_jobs(e, &alone, 1, &one);
        assert_int_equal(alone.num_out, 20);
        assert_int_equal(forked[i].num_out, 20);
        assert_memory_equal(alone.out, forked[i].out, 20 * sizeof(int32_t));
    }
    assert_true(memcmp(forked[0].out, forked[1].out, 20 * sizeof(int32_t)) != 0);
    eng_destroy(e);
}

/* A request sharing a long prefix with an earlier one prefills only its new tokens. */
static void test_prefix_cache_hit(void **state) {
    (void)state;
    static Job with[2], without[2];
    int32_t prefix[50];
    for (int i = 0; i < 50; i++)
        prefix[i] = i == 0 ? 1 : 259 + (i * 31) % 240;
    for (int j = 0; j < 2; j++) {
        memcpy(with[j].prompt, prefix, sizeof prefix);
        with[j].prompt[50] = 400 + j;
        with[j].prompt[51] = 410 + j;
        with[j].num_prompt = 52;
        with[j].max_tokens = 16;
    }
    memcpy(without, with, sizeof with);
    GenerateParams gp = {.sampling = sampling_params_default(), .ignore_eos = 1};
    EngineConfig c = base_config();
    Engine *e = make_engine(&c);
    run_jobs(e, &with[0], 1, &gp);
    EngineStats before = eng_stats(e);
    run_jobs(e, &with[1], 1, &gp);
    EngineStats after = eng_stats(e);
    int64_t computed = after.sched.prompt_tokens - before.sched.prompt_tokens;
    int64_t cached = after.sched.cached_prompt_tokens - before.sched.cached_prompt_tokens;
    print_message("second request: %lld prompt tokens computed, %lld from cache\n",
                  (long long)computed, (long long)cached);
    assert_int_equal(cached, 48); /* the 3 full blocks of the shared 50-token prefix */
    assert_int_equal(computed, 52 - 48);
    assert_true(after.blocks.prefix_hits - before.blocks.prefix_hits >= 3);
    assert_all_blocks_free(e);
    eng_destroy(e);
    c.enable_prefix_caching = 0;
    e = make_engine(&c);
    run_jobs(e, without, 2, &gp);
    assert_int_equal(eng_stats(e).sched.cached_prompt_tokens, 0);
    eng_destroy(e);
    assert_same_outputs(with, without, 2);
}

/* Allocated slots minus used slots stays under one block per running sequence. */
static void test_kv_waste_under_one_block_per_sequence(void **state) {
    (void)state;
    EngineConfig c = base_config();
    Engine *e = make_engine(&c);
    static Job jobs[32];
    make_jobs(e, jobs, 32);
    GenerateParams gp = {.sampling = sampling_params_default(), .ignore_eos = 1};
    for (int i = 0; i < 32; i++) {
        EngRequest r = {.prompt = jobs[i].prompt,
                        .num_prompt = jobs[i].num_prompt,
                        .params = gp,
                        .user = &jobs[i]};
        r.params.max_tokens = jobs[i].max_tokens;
        assert_int_equal(eng_add_request(e, &r, NULL), PL_OK);
    }
    double worst = 0;
    while (eng_has_work(e)) {
        const EngEvent *ev;
        eng_step(e, &ev);
        EngineStats s = eng_stats(e);
        int64_t waste = s.kv_slots_allocated - s.kv_slots_used;
        assert_true(waste >= 0);
        assert_true(waste < (int64_t)s.sched.num_running * 16 || s.sched.num_running == 0);
        if (s.kv_slots_allocated > 0 && (double)waste / s.kv_slots_allocated > worst)
            worst = (double)waste / s.kv_slots_allocated;
    }
    print_message("worst KV waste: %.1f%% of allocated slots\n", worst * 100);
    assert_all_blocks_free(e);
    eng_destroy(e);
}

/* An fp8 KV cache: swapping (and on the CPU backend recomputing) under pressure keeps every
 * output equal to its run alone (also fp8), as with the fp32 cache. A swap moves the cache's
 * bytes as they are, on every backend. Recompute writes K and V again from a prefill, whose
 * GPU GEMMs may differ from the decode steps' in the last bit of a 16/32-bit value; fp8
 * rounding can turn that into one e4m3 step (~6 %) and a different greedy token, so on a GPU
 * recompute is checked with the 16/32-bit cache only (test_swap_and_recompute_keep_outputs). */
static void test_fp8_kv_preemption_keeps_outputs(void **state) {
    (void)state;
    kv_fp8 = 1;
    if (k_device_count("cuda") == 0)
        pressure_run(6, 1, 1, 0, 0, 0);
    else
        print_message("a GPU is used: fp8 recompute is not bit-stable there (see above)\n");
    pressure_run(400, 1, 0, 1, 0, 0);
}

/* Teardown of the fp8 tests: later tests make fp32-cache engines again, even after a failure. */
static int fp8_off(void **state) {
    (void)state;
    kv_fp8 = 0;
    return 0;
}

/* The fp8 KV cache against the fp32 one (kv-cache-dtype auto on the cpu backend) on the bundled
 * model: the same memory holds four times the blocks; teacher-forced logits over the 8 prompts
 * each followed by 48 greedy tokens of the fp32 run differ by at most FP8_LOGIT_DIFF, their
 * argmax agrees at FP8_ARGMAX_AGREE of the positions or more, and free-running greedy
 * continuations keep at least FP8_GREEDY_PREFIX tokens equal on average. Measured (the model
 * has no k_scale / v_scale: scales 1): max |logit diff| 2.27 (logits span about +-20), argmax
 * agreement 434 of 446 positions (97.3 %), greedy prefix 21.9 of 48 tokens; the bounds leave a
 * margin for other compilers' rounding. */
#define FP8_LOGIT_DIFF    3.5
#define FP8_ARGMAX_AGREE  0.93
#define FP8_GREEDY_PREFIX 12.0
static void test_fp8_kv_against_auto(void **state) {
    (void)state;
    enum { GEN = 48 };
    EngineConfig c = base_config();
    c.kv_cache_fp8 = 0;
    c.kv_cache_memory_gib = 64 * block_gib(16);
    c.enable_prefix_caching = 0;
    c.async_scheduling = 0;
    Engine *e32 = make_engine(&c);
    c.kv_cache_fp8 = 1;
    Engine *e8 = make_engine(&c);
    EngineStats s32 = eng_stats(e32), s8 = eng_stats(e8);
    print_message("KV blocks in %.3f MiB: %d fp32, %d fp8\n", c.kv_cache_memory_gib * 1024,
                  s32.num_gpu_blocks, s8.num_gpu_blocks);
    assert_int_equal(s8.num_gpu_blocks, 4 * s32.num_gpu_blocks);
    const int vocab = 512;
    double worst = 0, prefix_sum = 0;
    int agree = 0, positions = 0;
    for (int i = 0; i < 8; i++) {
        Job j32[1], j8[1];
        make_jobs(e32, j32, 1);
        const char *text = sentences[i];
        int32_t *ids;
        int len;
        assert_int_equal(tok_encode(eng_tokenizer(e32), text, strlen(text), 1, &ids, &len), PL_OK);
        memcpy(j32[0].prompt, ids, (size_t)len * sizeof(int32_t));
        free(ids);
        j32[0].num_prompt = len;
        j32[0].max_tokens = GEN;
        j8[0] = j32[0];
        GenerateParams gp = {.sampling = sampling_params_default(), .ignore_eos = 1};
        run_jobs(e32, j32, 1, &gp);
        run_jobs(e8, j8, 1, &gp);
        int prefix = 0;
        while (prefix < GEN && j8[0].out[prefix] == j32[0].out[prefix])
            prefix++;
        prefix_sum += prefix;
        int n = len + GEN - 1; /* the prompt and the fp32 run's tokens, teacher-forced */
        int32_t seq[64 + GEN];
        memcpy(seq, j32[0].prompt, (size_t)len * sizeof(int32_t));
        memcpy(seq + len, j32[0].out, (size_t)(GEN - 1) * sizeof(int32_t));
        float *l32 = malloc(sizeof(float) * n * vocab), *l8 = malloc(sizeof(float) * n * vocab);
        assert_int_equal(eng_prompt_logits(e32, seq, n, l32), PL_OK);
        assert_int_equal(eng_prompt_logits(e8, seq, n, l8), PL_OK);
        for (int t = 0; t < n; t++) {
            int a32 = 0, a8 = 0;
            for (int v = 0; v < vocab; v++) {
                double d = fabs((double)l32[t * vocab + v] - l8[t * vocab + v]);
                worst = d > worst ? d : worst;
                a32 = l32[t * vocab + v] > l32[t * vocab + a32] ? v : a32;
                a8 = l8[t * vocab + v] > l8[t * vocab + a8] ? v : a8;
            }
            agree += a32 == a8;
            positions++;
        }
        free(l32);
        free(l8);
    }
    print_message("fp8 KV vs fp32: max |logit diff| %.4f, argmax agreement %d / %d, greedy "
                  "prefix kept %.1f of %d tokens on average\n",
                  worst, agree, positions, prefix_sum / 8, GEN);
    assert_true(worst <= FP8_LOGIT_DIFF);
    assert_true(agree >= FP8_ARGMAX_AGREE * positions);
    assert_true(prefix_sum / 8 >= FP8_GREEDY_PREFIX);
    eng_destroy(e32);
    eng_destroy(e8);
}

/* Settings the engine cannot honour are one-line errors naming them, not crashes. */
static void test_unsupported_settings_are_errors(void **state) {
    (void)state;
    EngineConfig c = base_config();
    c.device = "cpu";
    c.tensor_parallel_size = 2;
    Engine *e = NULL;
    assert_int_equal(eng_create(&c, &e), PL_ERR_UNSUPPORTED);
    assert_null(e);
    assert_non_null(strstr(pl_error(), "tensor-parallel-size 2 on the cpu backend runs as 2 MPI"));
    c = base_config();
    c.device = "cpu";
    c.dtype = "bfloat16";
    assert_int_equal(eng_create(&c, &e), PL_ERR_UNSUPPORTED);
    assert_non_null(strstr(pl_error(), "dtype bfloat16: the cpu backend computes in float32"));
    c.dtype = "float16";
    assert_int_equal(eng_create(&c, &e), PL_ERR_UNSUPPORTED);
    assert_non_null(strstr(pl_error(), "dtype float16: the cpu backend computes in float32"));
    c.dtype = "double";
    assert_int_equal(eng_create(&c, &e), PL_ERR_INVALID);
    assert_non_null(strstr(pl_error(), "dtype 'double'"));
    c.dtype = "float32"; /* what the cpu backend computes in: fine */
    assert_int_equal(eng_create(&c, &e), PL_OK);
    eng_destroy(e);
}

/* max-num-seqs left at 0 is chosen by the device: 256 on the CPU (1024 only on a GPU with 70
 * GiB free); a value given is kept. */
static void test_automatic_batch_limits(void **state) {
    (void)state;
    EngineConfig c = base_config();
    assert_int_equal(c.max_num_seqs, 0);
    Engine *e = make_engine(&c);
    if (!strcmp(eng_device_name(e), "cpu"))
        assert_int_equal(eng_max_num_seqs(e), 256);
    else
        assert_true(eng_max_num_seqs(e) == 256 || eng_max_num_seqs(e) == 1024);
    eng_destroy(e);
    c.max_num_seqs = 3;
    e = make_engine(&c);
    assert_int_equal(eng_max_num_seqs(e), 3);
    eng_destroy(e);
}

static void test_impossible_requests_are_rejected(void **state) {
    (void)state;
    EngineConfig c = base_config();
    c.num_gpu_blocks_override = 4; /* 64 tokens: max-model-len is capped to fit */
    Engine *e = make_engine(&c);
    assert_true(eng_max_model_len(e) <= 64);
    int32_t prompt[100];
    for (int i = 0; i < 100; i++)
        prompt[i] = 1 + i;
    EngRequest r = {.prompt = prompt,
                    .num_prompt = 100,
                    .params = {.max_tokens = 4, .sampling = sampling_params_default()}};
    assert_int_equal(eng_add_request(e, &r, NULL), PL_ERR_INVALID);
    assert_non_null(strstr(pl_error(), "max-model-len"));
    r.num_prompt = 0;
    assert_int_equal(eng_add_request(e, &r, NULL), PL_ERR_INVALID);
    r.num_prompt = 10;
    r.params.max_tokens = 0;
    assert_int_equal(eng_add_request(e, &r, NULL), PL_ERR_INVALID);
    eng_destroy(e);
    c = base_config();
    c.enable_chunked_prefill = 0;
    c.max_num_batched_tokens = 32;
    e = make_engine(&c);
    r.num_prompt = 40;
    r.params.max_tokens = 4;
    assert_int_equal(eng_add_request(e, &r, NULL), PL_ERR_INVALID);
    assert_non_null(strstr(pl_error(), "chunked prefill"));
    eng_destroy(e);
}

/* Logprobs are the log-softmax of the raw logits; the greedy token is the top one; a stop
 * token id ends the sample with "stop". */
static void test_logprobs_and_stop_token_ids(void **state) {
    (void)state;
    EngineConfig c = base_config();
    Engine *e = make_engine(&c);
    int32_t prompt[] = {1, 403, 407, 261, 378};
    GenerateParams gp = {
        .sampling = sampling_params_default(), .max_tokens = 3, .logprobs = 1, .top_logprobs = 5};
    EngRequest r = {.prompt = prompt, .num_prompt = 5, .params = gp};
    assert_int_equal(eng_add_request(e, &r, NULL), PL_OK);
    const EngEvent *ev;
    int32_t first = -1;
    float first_lp = 0, top_lp[5];
    int32_t top_ids[5];
    while (eng_has_work(e)) {
        int n = eng_step(e, &ev);
        for (int k = 0; k < n; k++) {
            if (ev[k].token >= 0) /* it ran, so its wait in the queue is known */
                assert_true(ev[k].queue_seconds >= 0 && ev[k].queue_seconds < 10);
            if (ev[k].token < 0 || first >= 0)
                continue;
            first = ev[k].token;
            first_lp = ev[k].logprob;
            assert_int_equal(ev[k].num_top, 5);
            memcpy(top_ids, ev[k].top_ids, sizeof top_ids);
            memcpy(top_lp, ev[k].top_logprobs, sizeof top_lp);
        }
    }
    /* golden.json: first greedy token 432, then 383, 322, 353, 323 */
    assert_int_equal(first, 432);
    static const int32_t want_top[5] = {432, 383, 322, 353, 323};
    assert_memory_equal(top_ids, want_top, sizeof want_top);
    for (int i = 1; i < 5; i++)
        assert_true(top_lp[i] <= top_lp[i - 1]);
    float logits[5 * 512];
    assert_int_equal(eng_prompt_logits(e, prompt, 5, logits), PL_OK);
    const float *row = logits + 4 * 512;
    double sum = 0;
    for (int i = 0; i < 512; i++)
        sum += exp(row[i] - row[432]);
    assert_float_equal(first_lp, -log(sum), 1e-4);
    assert_float_equal(top_lp[0], first_lp, 1e-6);
    assert_float_equal(top_lp[1] - top_lp[0], 14.28126 - 17.7994, 1e-3);

    int32_t stop_ids[] = {383}; /* the second greedy token */
    gp.stop_token_ids = stop_ids;
    gp.num_stop_token_ids = 1;
    gp.max_tokens = 10;
    r.params = gp;
    Job j = {.num_out = 0};
    r.user = &j;
    assert_int_equal(eng_add_request(e, &r, NULL), PL_OK);
    while (eng_has_work(e)) {
        int n = eng_step(e, &ev);
        for (int k = 0; k < n; k++) {
            if (ev[k].token >= 0)
                j.out[j.num_out++] = ev[k].token;
            if (ev[k].finish)
                j.finish = ev[k].finish;
        }
    }
    assert_int_equal(j.num_out, 1);
    assert_int_equal(j.out[0], 432);
    assert_int_equal(j.finish, FINISH_STOP);
    eng_destroy(e);
}

/* logprobs with no top alternatives (top_logprobs 0), alone and with forked samples (n > 1,
 * whose first tokens are drawn on the host from the parent's row): every token carries its
 * logprob and no top list. */
static void test_logprobs_without_top_alternatives(void **state) {
    (void)state;
    EngineConfig c = base_config();
    Engine *e = make_engine(&c);
    int32_t prompt[] = {1, 403, 407, 261, 378};
    for (int n = 1; n <= 3; n += 2) {
        GenerateParams gp = {.sampling = sampling_params_default(),
                             .max_tokens = 4,
                             .n = n,
                             .logprobs = 1,
                             .top_logprobs = 0};
        gp.sampling.temperature = 1.0f;
        gp.sampling.seed = 5;
        EngRequest r = {.prompt = prompt, .num_prompt = 5, .params = gp};
        assert_int_equal(eng_add_request(e, &r, NULL), PL_OK);
        const EngEvent *ev;
        int tokens = 0;
        while (eng_has_work(e)) {
            int k = eng_step(e, &ev);
            for (int i = 0; i < k; i++) {
                if (ev[i].token < 0)
                    continue;
                tokens++;
                assert_int_equal(ev[i].num_top, 0);
                assert_true(ev[i].logprob <= 0 && ev[i].logprob > -100);
            }
        }
        assert_int_equal(tokens, 4 * n);
    }
    eng_destroy(e);
}

/* Greedy tokens of the golden prompt under `gp` (max 16), and the finish reason. */
static int greedy_run(Engine *e, GenerateParams gp, int32_t *out, FinishReason *finish) {
    int32_t prompt[] = {1, 403, 407, 261, 378};
    gp.sampling = sampling_params_default();
    EngRequest r = {.prompt = prompt, .num_prompt = 5, .params = gp};
    assert_int_equal(eng_add_request(e, &r, NULL), PL_OK);
    const EngEvent *ev;
    int n = 0;
    while (eng_has_work(e)) {
        int k = eng_step(e, &ev);
        for (int i = 0; i < k; i++) {
            if (ev[i].token >= 0)
                out[n++] = ev[i].token;
            if (ev[i].finish)
                *finish = ev[i].finish;
        }
    }
    return n;
}

/* logit_bias moves the greedy choice (-100 on the greedy token: the runner-up wins; +100 on
 * another: it wins every step); min_tokens masks the stop tokens until reached. */
static void test_logit_bias_and_min_tokens(void **state) {
    (void)state;
    EngineConfig c = base_config();
    Engine *e = make_engine(&c);
    int32_t out[16];
    FinishReason fin = FINISH_NONE;
    GenerateParams gp = {.max_tokens = 4};
    assert_int_equal(greedy_run(e, gp, out, &fin), 4);
    assert_int_equal(out[0], 432); /* golden.json: 432, then 383 (runner-up of the first) */

    LogitBias down = {432, -100.0f}, up = {200, 100.0f};
    gp.logit_bias = &down;
    gp.num_logit_bias = 1;
    assert_int_equal(greedy_run(e, gp, out, &fin), 4);
    assert_int_equal(out[0], 383);
    for (int i = 0; i < 4; i++)
        assert_int_not_equal(out[i], 432);
    gp.logit_bias = &up;
    assert_int_equal(greedy_run(e, gp, out, &fin), 4);
    for (int i = 0; i < 4; i++)
        assert_int_equal(out[i], 200);

    /* every token but 200 stops the sample: with min_tokens 5 the first five are 200 (all
     * else masked), then the mask lifts and the greedy token stops it */
    int32_t stops[511];
    for (int i = 0, k = 0; i < 512; i++)
        if (i != 200)
            stops[k++] = i;
    gp = (GenerateParams){.max_tokens = 16, .stop_token_ids = stops, .num_stop_token_ids = 511};
    assert_int_equal(greedy_run(e, gp, out, &fin), 0);
    assert_int_equal(fin, FINISH_STOP);
    gp.min_tokens = 5;
    assert_int_equal(greedy_run(e, gp, out, &fin), 5);
    assert_int_equal(fin, FINISH_STOP);
    for (int i = 0; i < 5; i++)
        assert_int_equal(out[i], 200);

    gp.min_tokens = 17; /* more than max_tokens */
    int32_t prompt[] = {1, 403};
    EngRequest bad = {.prompt = prompt, .num_prompt = 2, .params = gp};
    assert_int_equal(eng_add_request(e, &bad, NULL), PL_ERR_INVALID);
    LogitBias outside = {512, 1.0f};
    bad.params = (GenerateParams){.max_tokens = 4, .logit_bias = &outside, .num_logit_bias = 1};
    assert_int_equal(eng_add_request(e, &bad, NULL), PL_ERR_INVALID);
    eng_destroy(e);
}

/* allowed_token_ids: every token drawn (greedy, and sampled at temperature 1 with n = 3) is one
 * of them, the best of them under greedy; with a constraint-free request the mask alone
 * decides. bad_words: a one-token word is never drawn; a two-token word lets its first token
 * through and bans its second right after it only. */
static void test_allowed_token_ids_and_bad_words(void **state) {
    (void)state;
    EngineConfig c = base_config();
    Engine *e = make_engine(&c);
    int32_t golden[16], out[16];
    FinishReason fin = FINISH_NONE;
    GenerateParams gp = {.max_tokens = 8};
    assert_int_equal(greedy_run(e, gp, golden, &fin), 8);

    int32_t allowed[] = {383, 200, 17};
    gp.allowed_token_ids = allowed;
    gp.num_allowed_token_ids = 3;
    assert_int_equal(greedy_run(e, gp, out, &fin), 8);
    assert_int_equal(out[0], 383); /* the runner-up of the first step (golden.json) */
    for (int i = 0; i < 8; i++)
        assert_true(out[i] == 383 || out[i] == 200 || out[i] == 17);
    int32_t prompt[] = {1, 403, 407, 261, 378};
    GenerateParams hot = gp;
    hot.sampling = sampling_params_default();
    hot.sampling.temperature = 1.0f;
    hot.sampling.seed = 9;
    hot.n = 3;
    EngRequest r = {.prompt = prompt, .num_prompt = 5, .params = hot};
    assert_int_equal(eng_add_request(e, &r, NULL), PL_OK);
    const EngEvent *ev;
    int drawn = 0;
    while (eng_has_work(e)) {
        int k = eng_step(e, &ev);
        for (int i = 0; i < k; i++)
            if (ev[i].token >= 0) {
                assert_true(ev[i].token == 383 || ev[i].token == 200 || ev[i].token == 17);
                drawn++;
            }
    }
    assert_int_equal(drawn, 24);
    /* the only allowed token is EOS, which min_tokens holds back: nothing can be drawn, and
     * the sample ends (abort) instead of drawing outside the list */
    int32_t eos[] = {2};
    gp = (GenerateParams){.max_tokens = 8, .min_tokens = 2};
    gp.allowed_token_ids = eos;
    gp.num_allowed_token_ids = 1;
    assert_int_equal(greedy_run(e, gp, out, &fin), 0);
    assert_int_equal(fin, FINISH_ABORT);

    gp = (GenerateParams){.max_tokens = 8};
    int32_t one[] = {golden[0]}, one_len[] = {1};
    gp.bad_words = one;
    gp.bad_word_lens = one_len;
    gp.num_bad_words = 1;
    assert_int_equal(greedy_run(e, gp, out, &fin), 8);
    for (int i = 0; i < 8; i++)
        assert_int_not_equal(out[i], golden[0]);
    int32_t two[] = {golden[0], golden[1]}, two_len[] = {2};
    gp.bad_words = two;
    gp.bad_word_lens = two_len;
    assert_int_equal(greedy_run(e, gp, out, &fin), 8);
    assert_int_equal(out[0], golden[0]);
    assert_int_not_equal(out[1], golden[1]);
    for (int i = 1; i < 8; i++)
        assert_false(out[i - 1] == golden[0] && out[i] == golden[1]);

    int32_t outside[] = {512}, zero_len[] = {0};
    EngRequest bad = {.prompt = prompt, .num_prompt = 5};
    bad.params =
        (GenerateParams){.max_tokens = 4, .allowed_token_ids = outside, .num_allowed_token_ids = 1};
    assert_int_equal(eng_add_request(e, &bad, NULL), PL_ERR_INVALID);
    bad.params = (GenerateParams){
        .max_tokens = 4, .bad_words = outside, .bad_word_lens = one_len, .num_bad_words = 1};
    assert_int_equal(eng_add_request(e, &bad, NULL), PL_ERR_INVALID);
    bad.params.bad_word_lens = zero_len;
    assert_int_equal(eng_add_request(e, &bad, NULL), PL_ERR_INVALID);
    eng_destroy(e);
}

/* A backend whose memory runs out: loading says so in one line instead of crashing. */
static size_t budget_left;
static void *limited_alloc(const KernelOps *ops, size_t bytes) {
    if (bytes > budget_left)
        return NULL;
    budget_left -= bytes;
    return test_cpu_ops()->alloc(test_cpu_ops(), bytes);
}

static void test_out_of_backend_memory_is_an_error(void **state) {
    (void)state;
    KernelOps ops = *test_cpu_ops();
    ops.host_memory = 0; /* weights are copied into "device" memory, as on a GPU */
    ops.alloc = limited_alloc;
    ModelLoadOptions mo = {.dir = MODEL_DIR, .max_num_tokens = 64, .ops = &ops};
    Model *m = NULL;
    budget_left = 100000; /* the bundled model's weights are about 1 MB */
    assert_int_equal(model_load(&mo, &m), PL_ERR_NOMEM);
    assert_null(m);
    assert_non_null(strstr(pl_error(), "the weights need"));
    budget_left = 1100000; /* weights fit, the activations of 2048 tokens do not */
    mo.max_num_tokens = 2048;
    assert_int_equal(model_load(&mo, &m), PL_ERR_NOMEM);
    assert_non_null(strstr(pl_error(), "max-num-batched-tokens"));
    budget_left = (size_t)1 << 30; /* with room it loads */
    mo.max_num_tokens = 64;
    assert_int_equal(model_load(&mo, &m), PL_OK);
    model_destroy(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reserving_admission_never_preempts),
        cmocka_unit_test(test_swap_preemption_keeps_outputs),
        cmocka_unit_test_teardown(test_fp8_kv_preemption_keeps_outputs, fp8_off),
        cmocka_unit_test_teardown(test_fp8_kv_against_auto, fp8_off),
        cmocka_unit_test(test_swap_and_recompute_keep_outputs),
        cmocka_unit_test(test_recompute_keeps_seeded_outputs),
        cmocka_unit_test(test_overlapped_steps_stop_and_swap_like_solo_runs),
        cmocka_unit_test(test_switching_between_overlapped_and_waiting_steps),
        cmocka_unit_test(test_abort_frees_blocks),
        cmocka_unit_test(test_forked_samples_share_blocks),
        cmocka_unit_test(test_prefix_cache_hit),
        cmocka_unit_test(test_kv_waste_under_one_block_per_sequence),
        cmocka_unit_test(test_automatic_batch_limits),
        cmocka_unit_test(test_impossible_requests_are_rejected),
        cmocka_unit_test(test_unsupported_settings_are_errors),
        cmocka_unit_test(test_logprobs_and_stop_token_ids),
        cmocka_unit_test(test_logprobs_without_top_alternatives),
        cmocka_unit_test(test_logit_bias_and_min_tokens),
        cmocka_unit_test(test_allowed_token_ids_and_bad_words),
        cmocka_unit_test(test_out_of_backend_memory_is_an_error),
    };
    return cmocka_run_group_tests_name("engine", tests, NULL, NULL);
}
