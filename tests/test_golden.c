/* test_golden.c - the bundled stories260K model reproduces its golden greedy completions
 * (models/stories260K/golden.json: ids, text and finish reason) through the engine. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

#define MODEL_DIR "models/stories260K"

typedef struct {
    int32_t ids[512];
    int n;
    char text[8192];
    size_t len;
} Collected;

static int collect(void *ctx, int32_t token, const char *text, size_t n) {
    Collected *c = ctx;
    if (token >= 0)
        c->ids[c->n++] = token;
    assert_int_equal(n, strlen(text)); /* the golden texts hold no NUL */
    assert_true(c->len + n < sizeof c->text);
    memcpy(c->text + c->len, text, n + 1);
    c->len += n;
    return 0;
}

static int setup(void **state) {
    EngineConfig cfg = eng_config_default();
    cfg.model_dir = MODEL_DIR;
    Engine *e;
    if (eng_create(&cfg, &e) != PL_OK) {
        print_error("eng_create: %s\n", pl_error());
        return -1;
    }
    *state = e;
    return 0;
}

static int teardown(void **state) {
    eng_destroy(*state);
    return 0;
}

static void check_case(Engine *e, json_t *c) {
    const char *prompt = json_string_value(json_object_get(c, "prompt"));
    json_t *want_prompt = json_object_get(c, "prompt_ids");
    json_t *want_ids = json_object_get(c, "completion_ids");
    const char *want_text = json_string_value(json_object_get(c, "text"));
    const char *want_finish = json_string_value(json_object_get(c, "finish_reason"));
    int max_tokens = (int)json_integer_value(json_object_get(c, "max_tokens"));

    int32_t *ids;
    int n;
    assert_int_equal(tok_encode(eng_tokenizer(e), prompt, strlen(prompt), 1, &ids, &n), PL_OK);
    assert_int_equal(n, (int)json_array_size(want_prompt));
    for (int i = 0; i < n; i++)
        assert_int_equal(ids[i], json_integer_value(json_array_get(want_prompt, i)));

    GenerateParams gp = {.max_tokens = max_tokens, .sampling = sampling_params_default()};
    Collected got = {.n = 0, .len = 0};
    got.text[0] = '\0';
    GenerateResult res;
    assert_int_equal(eng_generate(e, ids, n, &gp, collect, &got, &res), PL_OK);
    free(ids);
    if (got.n != (int)json_array_size(want_ids) || strcmp(got.text, want_text) != 0)
        print_error("prompt '%s': got '%s'\n want '%s'\n", prompt, got.text, want_text);
    assert_int_equal(got.n, (int)json_array_size(want_ids));
    for (int i = 0; i < got.n; i++)
        assert_int_equal(got.ids[i], json_integer_value(json_array_get(want_ids, i)));
    assert_string_equal(got.text, want_text);
    assert_string_equal(eng_finish_reason_str(res.finish_reason), want_finish);
    assert_int_equal(res.num_generated_tokens, got.n);
}

static json_t *load_cases(void) {
    json_error_t err;
    json_t *root = json_load_file(MODEL_DIR "/golden.json", 0, &err);
    if (!root)
        fail_msg("golden.json: %s", err.text);
    json_t *cases = json_object_get(root, "cases");
    assert_true(json_array_size(cases) >= 6);
    json_incref(cases);
    json_decref(root);
    return cases;
}

/* Every golden case, one engine, one after another (the KV cache is reused). */
static void test_golden_cases(void **state) {
    json_t *cases = load_cases();
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) check_case(*state, c);
    json_decref(cases);
}

/* Small prefill chunks and other block sizes give the same greedy tokens. */
static void test_golden_chunked_prefill_and_block_sizes(void **state) {
    (void)state;
    static const int block_sizes[] = {8, 32, 128};
    json_t *cases = load_cases();
    for (size_t b = 0; b < sizeof block_sizes / sizeof *block_sizes; b++) {
        EngineConfig cfg = eng_config_default();
        cfg.model_dir = MODEL_DIR;
        cfg.block_size = block_sizes[b];
        cfg.max_num_batched_tokens = 3; /* prompts span several chunks */
        Engine *e;
        assert_int_equal(eng_create(&cfg, &e), PL_OK);
        size_t i;
        json_t *c;
        json_array_foreach(cases, i, c) check_case(e, c);
        eng_destroy(e);
    }
    json_decref(cases);
}

/* max_tokens beyond max-model-len stops at the model length with finish "length". */
static void test_max_model_len_bounds_generation(void **state) {
    (void)state;
    EngineConfig cfg = eng_config_default();
    cfg.model_dir = MODEL_DIR;
    cfg.max_model_len = 12;
    Engine *e;
    assert_int_equal(eng_create(&cfg, &e), PL_OK);
    int32_t prompt[] = {1, 403, 407, 261, 378};
    GenerateParams gp = {.max_tokens = 100, .sampling = sampling_params_default()};
    GenerateResult res;
    assert_int_equal(eng_generate(e, prompt, 5, &gp, NULL, NULL, &res), PL_OK);
    assert_int_equal(res.num_generated_tokens, 7);
    assert_string_equal(eng_finish_reason_str(res.finish_reason), "length");
    int32_t long_prompt[12] = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315};
    assert_int_equal(eng_generate(e, long_prompt, 12, &gp, NULL, NULL, &res), PL_ERR_INVALID);
    assert_non_null(strstr(pl_error(), "max-model-len"));
    int32_t bad[] = {1, 9999};
    assert_int_equal(eng_generate(e, bad, 2, &gp, NULL, NULL, &res), PL_ERR_INVALID);
    assert_non_null(strstr(pl_error(), "9999"));
    eng_destroy(e);
}

/* The model ends stories with BOS (eos list [2, 1]): ignore_eos runs past it. */
static void test_eos_stops_unless_ignored(void **state) {
    Engine *e = *state;
    int32_t prompt[] = {1};
    GenerateParams gp = {.max_tokens = 400, .sampling = sampling_params_default()};
    GenerateResult res;
    assert_int_equal(eng_generate(e, prompt, 1, &gp, NULL, NULL, &res), PL_OK);
    assert_string_equal(eng_finish_reason_str(res.finish_reason), "stop");
    assert_true(res.num_generated_tokens < 400);
    gp.max_tokens = res.num_generated_tokens + 5;
    gp.ignore_eos = 1;
    assert_int_equal(eng_generate(e, prompt, 1, &gp, NULL, NULL, &res), PL_OK);
    assert_string_equal(eng_finish_reason_str(res.finish_reason), "length");
    assert_int_equal(res.num_generated_tokens, gp.max_tokens);
}

/* Same seed, same sampled text; a different seed changes it. */
static void test_seeded_sampling_is_reproducible(void **state) {
    Engine *e = *state;
    int32_t prompt[] = {1, 403, 407, 261, 378};
    GenerateParams gp = {.max_tokens = 24, .sampling = sampling_params_default()};
    gp.sampling.temperature = 1.0f;
    gp.sampling.top_p = 0.95f;
    gp.sampling.seed = 42;
    Collected a = {0}, b = {0}, c = {0};
    GenerateResult res;
    assert_int_equal(eng_generate(e, prompt, 5, &gp, collect, &a, &res), PL_OK);
    assert_int_equal(eng_generate(e, prompt, 5, &gp, collect, &b, &res), PL_OK);
    gp.sampling.seed = 7;
    assert_int_equal(eng_generate(e, prompt, 5, &gp, collect, &c, &res), PL_OK);
    assert_string_equal(a.text, b.text);
    assert_true(a.n > 0);
    assert_true(strcmp(a.text, c.text) != 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_cases),
        cmocka_unit_test(test_golden_chunked_prefill_and_block_sizes),
        cmocka_unit_test(test_max_model_len_bounds_generation),
        cmocka_unit_test(test_eos_stops_unless_ignored),
        cmocka_unit_test(test_seeded_sampling_is_reproducible),
    };
    return cmocka_run_group_tests_name("golden", tests, setup, teardown);
}
