/* test_families_engine.c - the tiny Qwen3, Qwen3-MoE, Mixtral, Gemma 2 / 3, Phi-3, RoPE-scaled
 * Llama and sliding-window Mistral and Qwen2 checkpoints of
 * tests/data/families/ (transformers' fp32 logits and greedy continuation in expected.json;
 * SOURCES.md) through the whole engine, on every backend this machine has:
 *   cpu float32        every prompt position's logits within 1e-4 of the row's largest |logit|
 *                      (as test_families, compare_logits.py's fp32 bound), greedy ids exact
 *   cuda float32       the same (the GPU's q/k-norm rope launch and moe_mlp kernels, and the
 *                      decode steps from CUDA graphs)
 *   cuda bfloat16      logits within 5e-2 of the row's scale (bf16 rounding); greedy ids
 *                      printed, not required (bf16 may flip a close pick)
 *   cuda float32 TP=2  with two GPUs: logits within 1e-4 (every expert's columns split)
 * Greedy runs go through the step loop (prefill, decode steps, EOS ignored): the sliding-window
 * Mistral's (window 16, 24 + 24 tokens, every layer sliding) with the KV blocks behind its window
 * released as it goes. A missing folder, GPU or second GPU is a skip that says so.
 *
 * test_window_blocks_bounded needs no data: a dummy-weight Mistral (window 16) generates 40x its
 * window in a pool of 8 blocks of 16 tokens, and the block manager's counters, read after every
 * step, show at most 2 blocks in use while it decodes; its tokens are those of one prefill of
 * the whole sequence over a full block table. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "engine_run_util.h"
#include "kernels.h"

#define DATA_DIR "tests/data/families"

static const char *const names[] = {"qwen3",      "qwen3-moe", "mixtral",      "gemma2",
                                    "gemma3",     "phi3",      "llama-linear", "llama-dynamic",
                                    "llama-yarn", "mistral",   "qwen2-sliding"};
enum { NUM_NAMES = sizeof names / sizeof *names };

typedef struct {
    json_t *doc;
    int32_t prompt[64];
    int n, vocab;
    int32_t greedy[64];
    int g;
} Expected;

static int load_expected(const char *name, Expected *x) {
    char path[256];
    snprintf(path, sizeof path, DATA_DIR "/%s/expected.json", name);
    if (access(path, R_OK) != 0)
        return 0;
    json_error_t err;
    x->doc = json_load_file(path, 0, &err);
    if (!x->doc)
        fail_msg("%s: %s", path, err.text);
    json_t *p = json_object_get(x->doc, "prompt_ids"), *g = json_object_get(x->doc, "greedy_ids");
    x->n = (int)json_array_size(p);
    x->g = (int)json_array_size(g);
    assert_true(x->n > 0 && x->n <= 64 && x->g <= 64);
    for (int i = 0; i < x->n; i++)
        x->prompt[i] = (int32_t)json_integer_value(json_array_get(p, i));
    for (int i = 0; i < x->g; i++)
        x->greedy[i] = (int32_t)json_integer_value(json_array_get(g, i));
    x->vocab = (int)json_array_size(json_array_get(json_object_get(x->doc, "logits"), 0));
    return 1;
}

/* Worst row of max |got - want| / max |want| over the prompt positions. */
static double logit_error(const Expected *x, const float *got) {
    json_t *rows = json_object_get(x->doc, "logits");
    double worst = 0;
    for (int t = 0; t < x->n; t++) {
        json_t *row = json_array_get(rows, t);
        double scale = 1e-30, err = 0;
        for (int v = 0; v < x->vocab; v++) {
            double w = json_number_value(json_array_get(row, v));
            scale = fmax(scale, fabs(w));
            err = fmax(err, fabs(got[(size_t)t * x->vocab + v] - w));
        }
        worst = fmax(worst, err / scale);
    }
    return worst;
}

typedef struct {
    int32_t ids[64];
    int n;
} Collected;

static void collect(void *ctx, const EngEvent *ev) {
    Collected *got = ctx;
    if (ev->token >= 0 && got->n < 64)
        got->ids[got->n++] = ev->token;
}

/* One family on one configuration: logits within tol; greedy ids exact when must_match. */
static int run_case(const char *name, const char *device, const char *dtype, int tp, double tol,
                    int must_match) {
    Expected x;
    if (!load_expected(name, &x)) {
        print_message(DATA_DIR "/%s: no reference data\n", name);
        return 0;
    }
    char dir[256];
    snprintf(dir, sizeof dir, DATA_DIR "/%s", name);
    EngineConfig c = eng_config_default();
    c.model_dir = dir;
    c.device = device;
    c.dtype = dtype;
    c.tensor_parallel_size = tp;
    c.quiet = 1;
    Engine *e = NULL;
    if (eng_create(&c, &e) != PL_OK)
        fail_msg("%s on %s %s tp %d: %s", name, device, dtype, tp, pl_error());
    float *logits = malloc(sizeof(float) * (size_t)x.n * x.vocab);
    assert_int_equal(eng_prompt_logits(e, x.prompt, x.n, logits), PL_OK);
    double err = logit_error(&x, logits);
    /* greedy through the step loop (eng_generate wants a tokenizer; these folders have none) */
    EngRequest req = {.prompt = x.prompt, .num_prompt = x.n};
    req.params =
        (GenerateParams){.max_tokens = x.g, .ignore_eos = 1, .sampling = sampling_params_default()};
    Collected got = {.n = 0};
    run_request(e, &req, collect, &got);
    int same = got.n == x.g;
    for (int i = 0; same && i < x.g; i++)
        same = got.ids[i] == x.greedy[i];
    print_message("%s on %s %s tp %d: worst relative logit error %.3g (tol %g), greedy %s\n", name,
                  device, dtype, tp, err, tol, same ? "identical" : "DIFFERS");
    if (!same)
        for (int i = 0; i < got.n && i < x.g; i++)
            if (got.ids[i] != x.greedy[i]) {
                print_message(
                    "  first difference at %d: %d, transformers %d (its margin %g)\n", i,
                    got.ids[i], x.greedy[i],
                    json_number_value(json_array_get(json_object_get(x.doc, "greedy_margins"), i)));
                break;
            }
    eng_destroy(e);
    free(logits);
    json_decref(x.doc);
    assert_true(err <= tol);
    if (must_match)
        assert_true(same);
    return 1;
}

/* Every family on one configuration; a skip when none has its data. */
static void run_all(const char *device, const char *dtype, int tp, double tol, int must_match) {
    int ran = 0;
    for (int i = 0; i < NUM_NAMES; i++)
        ran += run_case(names[i], device, dtype, tp, tol, must_match);
    if (!ran)
        skip();
}

static void test_cpu(void **state) {
    run_all("cpu", "float32", 1, 1e-4, 1);
}

static int gpus(int n) {
    if (k_device_count("cuda") >= n)
        return 1;
    print_message("fewer than %d CUDA device(s): skipped\n", n);
    return 0;
}

static void test_cuda_float32(void **state) {
    if (!gpus(1))
        skip();
    run_all("cuda", "float32", 1, 1e-4, 1);
}

static void test_cuda_bfloat16(void **state) {
    if (!gpus(1))
        skip();
    run_all("cuda", "bfloat16", 1, 5e-2, 0);
}

static void test_cuda_tp2(void **state) {
    if (!gpus(2))
        skip();
    run_all("cuda", "float32", 2, 1e-4, 1);
}

/* A dummy Mistral (window 16 on every layer) in a fresh folder dir. */
static void write_window_model(char *dir) {
    char path[64];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"architectures\": [\"MistralForCausalLM\"], \"hidden_size\": 64,"
          " \"intermediate_size\": 96, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
          " \"num_key_value_heads\": 2, \"vocab_size\": 200, \"sliding_window\": 16,"
          " \"max_position_embeddings\": 4096}",
          f);
    fclose(f);
}

/* The dummy model on `device` in float32 (blocks 0 and batched 0: the defaults). */
static Engine *window_engine(const char *dir, const char *device, int blocks, int batched) {
    EngineConfig c = eng_config_default();
    c.model_dir = dir;
    c.device = device;
    c.dtype = "float32";
    c.load_dummy = 1;
    c.block_size = 16;
    c.num_gpu_blocks_override = blocks;
    if (batched)
        c.max_num_batched_tokens = batched;
    c.quiet = 1;
    Engine *e = NULL;
    if (eng_create(&c, &e) != PL_OK)
        fail_msg("dummy Mistral on %s: %s", device, pl_error());
    return e;
}

/* A long generation of a model whose every layer slides holds a bounded number of KV blocks:
 * the blocks behind the window are released as it advances (the pool could not hold the
 * sequence otherwise), at most ceil(16 / 16) + 1 = 2 in use while decoding (blk_held_blocks),
 * whatever the backend (CUDA too where there is one). Its greedy tokens are those of one
 * prefill of the whole sequence over a full block table (eng_prompt_logits: a private cache,
 * nothing released), a near tie (top-2 margin under 1e-4) aside. */
static void window_blocks_bounded(const char *device) {
    char dir[] = "/tmp/pagellm_test_window_XXXXXX", path[64];
    write_window_model(dir);
    Engine *e = window_engine(dir, device, 8, 64); /* 128 tokens: the sequence is 640 */
    assert_int_equal(eng_max_model_len(e), 4096);  /* not capped by the window, nor the pool */
    enum { PROMPT = 40, NEW = 600, VOCAB = 200 };
    int32_t seq[PROMPT + NEW];
    for (int i = 0; i < PROMPT; i++)
        seq[i] = (i * 37 + 11) % VOCAB;
    EngRequest req = {.prompt = seq, .num_prompt = PROMPT};
    req.params =
        (GenerateParams){.max_tokens = NEW, .ignore_eos = 1, .sampling = sampling_params_default()};
    uint64_t id;
    assert_int_equal(eng_add_request(e, &req, &id), PL_OK);
    int generated = 0, most = 0, first = 1;
    for (int done = 0, steps = 0; !done; steps++) {
        assert_true(steps < 2 * NEW);
        const EngEvent *ev;
        int count = eng_step(e, &ev);
        for (int i = 0; i < count; i++) {
            if (ev[i].request_id == id && ev[i].token >= 0 && generated < NEW)
                seq[PROMPT + generated++] = ev[i].token;
            done |= ev[i].request_id == id && ev[i].finish != FINISH_NONE;
        }
        EngineStats st = eng_stats(e);
        const int in_use = st.num_gpu_blocks - st.free_gpu_blocks;
        if (!first) /* after the prompt's step: decoding */
            most = in_use > most ? in_use : most;
        first = 0;
    }
    EngineStats st = eng_stats(e);
    print_message("window 16 on %s: %d tokens generated, at most %d of %d blocks in use while "
                  "decoding, %lld blocks released\n",
                  device, generated, most, st.num_gpu_blocks, (long long)st.blocks.released);
    assert_int_equal(generated, NEW);
    assert_true(most <= 2);
    assert_true(st.blocks.released >= (PROMPT + NEW - 16) / 16 - 1);
    eng_destroy(e);

    Engine *full = window_engine(dir, device, 0, 0);
    float *logits = malloc(sizeof(float) * (PROMPT + NEW - 1) * VOCAB);
    assert_int_equal(eng_prompt_logits(full, seq, PROMPT + NEW - 1, logits), PL_OK);
    int differ = 0, ties = 0;
    for (int i = 0; i < NEW; i++) {
        const float *row = logits + (size_t)(PROMPT - 1 + i) * VOCAB;
        int best = 0;
        for (int v = 1; v < VOCAB; v++)
            best = row[v] > row[best] ? v : best;
        if (best == seq[PROMPT + i])
            continue;
        if (row[best] - row[seq[PROMPT + i]] <= 1e-4f * (1.0f + fabsf(row[best])))
            ties++;
        else if (differ++ == 0)
            print_message("  token %d: %d, one prefill's argmax %d (margin %g)\n", i,
                          seq[PROMPT + i], best, row[best] - row[seq[PROMPT + i]]);
    }
    print_message("  the same as one prefill over the whole sequence: %d of %d (%d near ties)\n",
                  NEW - differ - ties, NEW, ties);
    assert_int_equal(differ, 0);
    free(logits);
    eng_destroy(full);
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    rmdir(dir);
}

static void test_window_blocks_bounded(void **state) {
    window_blocks_bounded("cpu");
    if (k_device_count("cuda") >= 1)
        window_blocks_bounded("cuda");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_window_blocks_bounded),
        cmocka_unit_test(test_cpu),
        cmocka_unit_test(test_cuda_float32),
        cmocka_unit_test(test_cuda_bfloat16),
        cmocka_unit_test(test_cuda_tp2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
