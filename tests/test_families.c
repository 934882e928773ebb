/* test_families.c - Qwen3, Qwen3-MoE, Mixtral, Gemma 2, Gemma 3, Phi-3, Llamas with linear,
 * dynamic and YaRN RoPE scaling, and sliding-window Mistral and Qwen2 on the CPU backend, at the
 * models layer.
 *
 * Reference data: tests/data/families/<name>/ holds a tiny random-weight checkpoint written by
 * transformers (tools/make_random_checkpoints.py --tiny; SOURCES.md) and expected.json: a 16-token
 * (sliding-window ones: 24-token) prompt, transformers' float32 logits at every prompt position
 * and its greedy 16-token (24-token) continuation. The model runs the prompt as one prefill, then
 * decodes greedily one token per step through the paged KV cache; every logit row must be within
 * 1e-4 of the row's largest |logit| (float32 against float32: the two differ only in the order of
 * their sums, and pagellm accumulates dot products in wider precision, so the differences are
 * ~1e-6 of the row's scale after two or three layers; 1e-4 is compare_logits.py's bound for fp32),
 * and the greedy ids must be the same. A folder that is not there is skipped.
 *
 * Without data: each family's config loads with load-format dummy, runs a prompt, and its
 * logits are finite and the same whether the prompt is one prefill or one token per step. */
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
#include <sys/stat.h>
#include <unistd.h>

#include "kernels.h"
#include "model.h"
#include "model_run_util.h"

#define DATA_DIR "tests/data/families"

static KernelOps *cpu;

static int setup(void **state) {
    KernelOpenOptions o = {.backend = "cpu", .act = DT_F32};
    return k_open(&o, &cpu) == PL_OK ? 0 : -1;
}

static int teardown(void **state) {
    k_close(&cpu, 1);
    return 0;
}

/* Tokens ids[n] at positions first.., logits of every row into logits[n, vocab]. */
static void forward(Run *r, const int32_t *ids, int n, int first, float *logits) {
    int32_t rows[RUN_MAX_TOKENS];
    for (int i = 0; i < n; i++)
        rows[i] = i;
    run_forward(r, ids, n, first, rows, n, logits);
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* ---- reference data ---- */

static void check_family(const char *name) {
    char dir[256], path[320];
    snprintf(dir, sizeof dir, DATA_DIR "/%s", name);
    snprintf(path, sizeof path, "%s/expected.json", dir);
    if (access(path, R_OK) != 0) {
        print_message("%s: no reference data, skipped\n", path);
        skip();
    }
    json_error_t err;
    json_t *doc = json_load_file(path, 0, &err);
    if (!doc)
        fail_msg("%s: %s", path, err.text);
    json_t *prompt = json_object_get(doc, "prompt_ids"),
           *want_logits = json_object_get(doc, "logits");
    json_t *greedy = json_object_get(doc, "greedy_ids"),
           *margins = json_object_get(doc, "greedy_margins");
    int n = (int)json_array_size(prompt),
        g = (int)json_array_size(greedy); /* 16 + 16, or 24 + 24 */
    assert_true(n > 0 && n + g <= RUN_BLOCKS * RUN_BLOCK && (int)json_array_size(want_logits) == n);

    Run r;
    run_open(&r, cpu, dir, 0, NULL);
    int32_t ids[RUN_MAX_TOKENS];
    for (int i = 0; i < n; i++)
        ids[i] = (int32_t)json_integer_value(json_array_get(prompt, i));
    float *logits = malloc(sizeof(float) * (size_t)n * r.vocab);
    forward(&r, ids, n, 0, logits);
    double worst = 0;
    for (int t = 0; t < n; t++) {
        json_t *row = json_array_get(want_logits, t);
        assert_int_equal((int)json_array_size(row), r.vocab);
        double scale = 0, err = 0;
        for (int v = 0; v < r.vocab; v++)
            scale = fmax(scale, fabs(json_number_value(json_array_get(row, v))));
        for (int v = 0; v < r.vocab; v++)
            err = fmax(err, fabs(logits[(size_t)t * r.vocab + v] -
                                 json_number_value(json_array_get(row, v))));
        worst = fmax(worst, err / scale);
        if (err > 1e-4 * scale)
            fail_msg("%s: position %d: max |logit error| %.3g > 1e-4 x %.4g", name, t, err, scale);
    }
    print_message("%s: %d prompt positions, worst relative logit error %.3g\n", name, n, worst);
    int next = argmax(logits + (size_t)(n - 1) * r.vocab, r.vocab);
    for (int i = 0; i < g; i++) {
        int want = (int)json_integer_value(json_array_get(greedy, i));
        if (next != want)
            fail_msg("%s: greedy token %d is %d, transformers %d (its top-2 margin %g)", name, i,
                     next, want, json_number_value(json_array_get(margins, i)));
        int32_t tok = next;
        forward(&r, &tok, 1, n + i, logits);
        next = argmax(logits, r.vocab);
    }
    free(logits);
    run_close(&r);
    json_decref(doc);
}

static void test_qwen3_reference(void **state) {
    check_family("qwen3");
}

static void test_qwen3_moe_reference(void **state) {
    check_family("qwen3-moe");
}

static void test_mixtral_reference(void **state) {
    check_family("mixtral");
}

/* Gemma 2 (soft-capping, GeGLU, 4 norms, sliding window 8 on layers 0 and 2: the 16-token
 * prompt and its continuation cross it), Gemma 3 (q/k norms, local and global RoPE bases, the
 * global one linearly scaled), Phi-3 (fused tensors, partial rotation, LongRoPE's short
 * factors and cos / sin factor) and the RoPE-scaled Llamas. */
static void test_gemma2_reference(void **state) {
    check_family("gemma2");
}

static void test_gemma3_reference(void **state) {
    check_family("gemma3");
}

static void test_phi3_reference(void **state) {
    check_family("phi3");
}

/* Mistral (every layer slides) and Qwen2 with use_sliding_window (layer 0 attends to all, the
 * others slide), window 16: a 24-token prompt and 24 greedy tokens, 3x the window. */
static void test_mistral_reference(void **state) {
    check_family("mistral");
}

static void test_qwen2_sliding_reference(void **state) {
    check_family("qwen2-sliding");
}

static void test_llama_rope_scalings_reference(void **state) {
    check_family("llama-linear");
    check_family("llama-dynamic");
    check_family("llama-yarn");
}

/* expected.json's "rope" (transformers' own inverse frequencies and cos / sin factor; LongRoPE's
 * long ones too) against k_rope_freqs with the folder's config. */
static void check_rope_tables(const char *name) {
    char dir[256], path[320];
    snprintf(dir, sizeof dir, DATA_DIR "/%s", name);
    snprintf(path, sizeof path, "%s/expected.json", dir);
    json_t *doc = json_load_file(path, 0, NULL), *rope = json_object_get(doc, "rope");
    if (!rope) {
        print_message("%s: no rope tables, skipped\n", path);
        json_decref(doc);
        return;
    }
    ModelConfig *c = malloc(sizeof *c);
    assert_int_equal(model_config_load(dir, c), PL_OK);
    int rot = c->rotary_dim > 0 ? c->rotary_dim : c->head_dim, half = rot / 2;
    float inv[512], lng[512];
    float att = k_rope_freqs(inv, lng, rot, c->rope_theta, &c->rope_scaling);
    json_t *want = json_object_get(rope, "inv_freq"),
           *want_long = json_object_get(rope, "long_inv_freq");
    assert_int_equal((int)json_array_size(want), half);
    for (int i = 0; i < half; i++) {
        double w = json_number_value(json_array_get(want, i));
        if (fabs(inv[i] - w) > 1e-6 * fabs(w))
            fail_msg("%s: inv_freq[%d] %.9g, transformers %.9g", name, i, inv[i], w);
        if (want_long && fabs(lng[i] - json_number_value(json_array_get(want_long, i))) >
                             1e-6 * fabs(json_number_value(json_array_get(want_long, i))))
            fail_msg("%s: long_inv_freq[%d] %.9g", name, i, lng[i]);
    }
    assert_float_equal(att, json_number_value(json_object_get(rope, "attention_scaling")), 1e-6);
    print_message("%s: rope tables equal transformers' (attention factor %g)\n", name, att);
    free(c);
    json_decref(doc);
}

static void test_rope_tables(void **state) {
    static const char *const with_tables[] = {"phi3", "llama-linear", "llama-dynamic", "llama-yarn",
                                              "gemma2"};
    int any = 0;
    for (size_t i = 0; i < sizeof with_tables / sizeof *with_tables; i++) {
        char path[320];
        snprintf(path, sizeof path, DATA_DIR "/%s/expected.json", with_tables[i]);
        if (access(path, R_OK) != 0)
            continue;
        any = 1;
        check_rope_tables(with_tables[i]);
    }
    if (!any)
        skip();
}

/* ---- dummy weights ---- */

static void dummy_consistent(const char *config_json) {
    char dir[] = "/tmp/pagellm_test_families_XXXXXX", path[64];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(config_json, f);
    fclose(f);
    Run a, b;
    run_open(&a, cpu, dir, 1, NULL);
    run_open(&b, cpu, dir, 1, NULL);
    enum { N = 12 };
    int32_t ids[N];
    for (int i = 0; i < N; i++)
        ids[i] = (int32_t)((i * 37 + 11) % a.vocab);
    float *all = malloc(sizeof(float) * N * a.vocab), *one = malloc(sizeof(float) * a.vocab);
    forward(&a, ids, N, 0, all);
    for (int i = 0; i < N * a.vocab; i++)
        assert_true(isfinite(all[i]));
    for (int t = 0; t < N; t++) { /* token by token: the same bits (CPU ops are batch-invariant) */
        forward(&b, ids + t, 1, t, one);
        assert_memory_equal(one, all + (size_t)t * a.vocab, sizeof(float) * a.vocab);
    }
    free(all);
    free(one);
    run_close(&a);
    run_close(&b);
    unlink(path);
    rmdir(dir);
}

static void test_dummy_qwen3(void **state) {
    dummy_consistent("{\"architectures\": [\"Qwen3ForCausalLM\"], \"hidden_size\": 64,"
                     " \"intermediate_size\": 96, \"num_hidden_layers\": 2,"
                     " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 32,"
                     " \"vocab_size\": 200, \"tie_word_embeddings\": true}");
}

static void test_dummy_qwen3_moe(void **state) {
    dummy_consistent("{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"hidden_size\": 64,"
                     " \"intermediate_size\": 96, \"num_hidden_layers\": 3,"
                     " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16,"
                     " \"vocab_size\": 200, \"num_experts\": 6, \"num_experts_per_tok\": 2,"
                     " \"moe_intermediate_size\": 32, \"norm_topk_prob\": true,"
                     " \"mlp_only_layers\": [1]}");
}

static void test_dummy_mixtral(void **state) {
    dummy_consistent("{\"architectures\": [\"MixtralForCausalLM\"], \"hidden_size\": 64,"
                     " \"intermediate_size\": 48, \"num_hidden_layers\": 2,"
                     " \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
                     " \"vocab_size\": 200, \"num_local_experts\": 4,"
                     " \"num_experts_per_tok\": 2}");
}

static void test_dummy_gemma2(void **state) {
    dummy_consistent("{\"architectures\": [\"Gemma2ForCausalLM\"], \"hidden_size\": 64,"
                     " \"intermediate_size\": 96, \"num_hidden_layers\": 3,"
                     " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16,"
                     " \"vocab_size\": 200, \"query_pre_attn_scalar\": 24,"
                     " \"attn_logit_softcapping\": 3.0, \"final_logit_softcapping\": 5.0,"
                     " \"sliding_window\": 5}");
}

static void test_dummy_gemma3(void **state) {
    dummy_consistent("{\"architectures\": [\"Gemma3ForCausalLM\"], \"hidden_size\": 64,"
                     " \"intermediate_size\": 96, \"num_hidden_layers\": 3,"
                     " \"num_attention_heads\": 4, \"num_key_value_heads\": 1, \"head_dim\": 32,"
                     " \"vocab_size\": 200, \"sliding_window\": 4, \"sliding_window_pattern\": 3,"
                     " \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 8}}");
}

static void test_dummy_phi3(void **state) {
    dummy_consistent(
        "{\"architectures\": [\"Phi3ForCausalLM\"], \"hidden_size\": 64,"
        " \"intermediate_size\": 96, \"num_hidden_layers\": 2,"
        " \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
        " \"vocab_size\": 200, \"max_position_embeddings\": 64,"
        " \"original_max_position_embeddings\": 6,"
        " \"rope_parameters\": {\"rope_type\": \"longrope\", \"rope_theta\": 10000,"
        " \"partial_rotary_factor\": 0.75, \"short_factor\": [1, 1.1, 1.2, 1.3, 1.4, 1.5],"
        " \"long_factor\": [1, 2, 3, 4, 5, 6]}}");
}

/* Mistral with a window of 5 on every layer, Qwen2 with use_sliding_window from layer 1 on:
 * the 12-token prompt crosses the window, prefilled at once or a token a step. */
static void test_dummy_sliding(void **state) {
    dummy_consistent("{\"architectures\": [\"MistralForCausalLM\"], \"hidden_size\": 64,"
                     " \"intermediate_size\": 96, \"num_hidden_layers\": 2,"
                     " \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
                     " \"vocab_size\": 200, \"sliding_window\": 5}");
    dummy_consistent("{\"architectures\": [\"Qwen2ForCausalLM\"], \"hidden_size\": 64,"
                     " \"intermediate_size\": 96, \"num_hidden_layers\": 3,"
                     " \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
                     " \"vocab_size\": 200, \"use_sliding_window\": true,"
                     " \"sliding_window\": 5, \"max_window_layers\": 1}");
}

/* Gemma 2's sliding window against the same model with the window covering everything: equal
 * up to the window, different after (the layers that slide no longer see the first tokens). */
static void test_sliding_window_bites(void **state) {
    static const char *fmt =
        "{\"architectures\": [\"Gemma2ForCausalLM\"], \"hidden_size\": 64,"
        " \"intermediate_size\": 96, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
        " \"num_key_value_heads\": 2, \"head_dim\": 16, \"vocab_size\": 200,"
        " \"sliding_window\": %d}";
    char dir[2][40] = {"/tmp/pagellm_test_sw_XXXXXX", "/tmp/pagellm_test_sw_XXXXXX"};
    Run r[2];
    enum { N = 12, W = 5 };
    float *logits[2];
    int32_t ids[N];
    for (int i = 0; i < N; i++)
        ids[i] = (int32_t)((i * 53 + 7) % 200);
    for (int k = 0; k < 2; k++) {
        char path[80], text[512];
        assert_non_null(mkdtemp(dir[k]));
        snprintf(path, sizeof path, "%s/config.json", dir[k]);
        snprintf(text, sizeof text, fmt, k ? 4096 : W);
        FILE *f = fopen(path, "w");
        fputs(text, f);
        fclose(f);
        run_open(&r[k], cpu, dir[k], 1, NULL);
        logits[k] = malloc(sizeof(float) * N * 200);
        forward(&r[k], ids, N, 0, logits[k]);
        run_close(&r[k]);
        unlink(path);
        rmdir(dir[k]);
    }
    assert_memory_equal(logits[0], logits[1], sizeof(float) * W * 200);
    assert_memory_not_equal(logits[0] + (N - 1) * 200, logits[1] + (N - 1) * 200,
                            sizeof(float) * 200);
    free(logits[0]);
    free(logits[1]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dummy_qwen3),
        cmocka_unit_test(test_dummy_qwen3_moe),
        cmocka_unit_test(test_dummy_mixtral),
        cmocka_unit_test(test_qwen3_reference),
        cmocka_unit_test(test_qwen3_moe_reference),
        cmocka_unit_test(test_mixtral_reference),
        cmocka_unit_test(test_dummy_gemma2),
        cmocka_unit_test(test_dummy_gemma3),
        cmocka_unit_test(test_dummy_phi3),
        cmocka_unit_test(test_sliding_window_bites),
        cmocka_unit_test(test_dummy_sliding),
        cmocka_unit_test(test_gemma2_reference),
        cmocka_unit_test(test_gemma3_reference),
        cmocka_unit_test(test_phi3_reference),
        cmocka_unit_test(test_llama_rope_scalings_reference),
        cmocka_unit_test(test_mistral_reference),
        cmocka_unit_test(test_qwen2_sliding_reference),
        cmocka_unit_test(test_rope_tables),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
