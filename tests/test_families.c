/* test_families.c - Qwen3, Qwen3-MoE and Mixtral on the CPU backend, at the models layer.
 *
 * Reference data: tests/data/families/<name>/ holds a tiny random-weight checkpoint written by
 * transformers (tools/make_random_checkpoints.py --tiny; SOURCES.md) and expected.json: a
 * 16-token prompt, transformers' float32 logits at every prompt position and its greedy
 * 16-token continuation. The model runs the prompt as one prefill, then decodes greedily one
 * token per step through the paged KV cache; every logit row must be within 1e-4 of the
 * row's largest |logit| (float32 against float32: the two differ only in the order of their
 * sums, and pagellm accumulates dot products in wider precision, so the differences are ~1e-6
 * of the row's scale after two or three layers; 1e-4 is compare_logits.py's bound for fp32),
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

#define DATA_DIR "tests/data/families"

enum { BLOCK = 16, NUM_BLOCKS = 8, MAX_TOKENS = 64 };

static KernelOps *cpu;

static int setup(void **state) {
    KernelOpenOptions o = {.backend = "cpu", .act = DT_F32};
    return k_open(&o, &cpu) == PL_OK ? 0 : -1;
}

static int teardown(void **state) {
    k_close(&cpu, 1);
    return 0;
}

/* One sequence in blocks 0..NUM_BLOCKS-1 (in reverse order, so slots are not positions). */
typedef struct {
    Model *m;
    KvLayout layout;
    float *cache;
    int32_t table[NUM_BLOCKS];
    int vocab;
} Run;

static void run_open(Run *r, const char *dir, int dummy) {
    ModelLoadOptions opt = {
        .dir = dir, .load_dummy = dummy, .seed = 5, .max_num_tokens = MAX_TOKENS, .ops = cpu};
    if (model_load(&opt, &r->m) != PL_OK)
        fail_msg("model_load(%s): %s", dir, pl_error());
    r->layout = model_kv_layout(r->m, BLOCK);
    r->cache = calloc(k_kv_block_elems(&r->layout) * NUM_BLOCKS, sizeof(float));
    for (int b = 0; b < NUM_BLOCKS; b++)
        r->table[b] = NUM_BLOCKS - 1 - b;
    r->vocab = model_config(r->m)->vocab_size;
}

static void run_close(Run *r) {
    model_destroy(r->m);
    free(r->cache);
}

/* Tokens ids[n] at positions first.., logits of every row into logits[n, vocab]. */
static void forward(Run *r, const int32_t *ids, int n, int first, float *logits) {
    int32_t pos[MAX_TOKENS], rows[MAX_TOKENS], qs[2] = {0, n};
    int64_t slots[MAX_TOKENS];
    assert_true(n <= MAX_TOKENS && first + n <= NUM_BLOCKS * BLOCK);
    for (int i = 0; i < n; i++) {
        int p = first + i;
        pos[i] = p;
        rows[i] = i;
        slots[i] = (int64_t)r->table[p / BLOCK] * BLOCK + p % BLOCK;
    }
    AttnBatch b = {.num_tokens = n,
                   .positions = pos,
                   .slot_mapping = slots,
                   .num_seqs = 1,
                   .query_start = qs,
                   .block_tables = r->table,
                   .max_blocks_per_seq = NUM_BLOCKS,
                   .num_decode_seqs = n == 1 && first > 0};
    model_forward(r->m, ids, &b, r->cache, &r->layout, rows, n, logits);
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
    int n = (int)json_array_size(prompt), g = (int)json_array_size(greedy);
    assert_true(n > 0 && n + g <= NUM_BLOCKS * BLOCK && (int)json_array_size(want_logits) == n);

    Run r;
    run_open(&r, dir, 0);
    int32_t ids[MAX_TOKENS];
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
    run_open(&a, dir, 1);
    run_open(&b, dir, 1);
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dummy_qwen3),         cmocka_unit_test(test_dummy_qwen3_moe),
        cmocka_unit_test(test_dummy_mixtral),       cmocka_unit_test(test_qwen3_reference),
        cmocka_unit_test(test_qwen3_moe_reference), cmocka_unit_test(test_mixtral_reference),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
