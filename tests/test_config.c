/* test_config.c - config.json / generation_config.json parsing (models/config.c).
 *
 * The bundled stories260K config, Llama-3 (rope_scaling llama3, 4.x and 5.x spellings),
 * Qwen2 (q/k/v biases) and Mistral configs, eos as int and list, and one case per error:
 * each error case checks the status and that the message names the key or file. Run from
 * the repository root. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model.h"

#define STORIES "models/stories260K"

/* Assert that `s` is `want` and that the message holds `needle` (and `needle2` if given). */
static void expect_error(Status s, Status want, const char *needle, const char *needle2) {
    const char *msg = pl_error();
    if (getenv("PL_TEST_VERBOSE")) /* to read the messages */
        fprintf(stderr, "  error: %s\n", msg);
    if (s != want || !strstr(msg, needle) || (needle2 && !strstr(msg, needle2)))
        fail_msg("status %s (want %s), message '%s' (want '%s'%s%s)", pl_status_str(s),
                 pl_status_str(want), msg, needle, needle2 ? " and " : "", needle2 ? needle2 : "");
}

static Status parse(const char *json, ModelConfig *cfg) {
    return model_config_parse(json, "test/config.json", cfg);
}

/* A minimal valid Llama config with one substitution: `extra` is spliced in as more keys. */
static char *llama_with(const char *extra) {
    static char buf[4096];
    snprintf(buf, sizeof buf,
             "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 256,"
             " \"intermediate_size\": 512, \"num_hidden_layers\": 2,"
             " \"num_attention_heads\": 4, \"vocab_size\": 1000%s%s}",
             extra && *extra ? ", " : "", extra ? extra : "");
    return buf;
}

/* ---- valid configs -------------------------------------------------------------------- */

static void test_stories260k(void **state) {
    ModelConfig c;
    assert_int_equal(model_config_load(STORIES, &c), PL_OK);
    assert_string_equal(c.architecture, "LlamaForCausalLM");
    assert_int_equal(c.hidden_size, 64);
    assert_int_equal(c.intermediate_size, 172);
    assert_int_equal(c.num_layers, 5);
    assert_int_equal(c.num_heads, 8);
    assert_int_equal(c.num_kv_heads, 4);
    assert_int_equal(c.head_dim, 8);
    assert_int_equal(c.vocab_size, 512);
    assert_int_equal(c.max_position_embeddings, 512);
    assert_float_equal(c.rms_norm_eps, 1e-5f, 1e-12);
    assert_float_equal(c.rope_theta, 10000.0f, 0);
    assert_float_equal(c.rope_llama3_factor, 0, 0);
    assert_true(c.tie_word_embeddings);
    assert_false(c.qkv_bias);
    assert_int_equal(c.torch_dtype, DT_F32);
    assert_int_equal(c.bos_token_id, 1);
    /* generation_config.json's [2, 1] overrides config.json's 2. */
    assert_int_equal(c.num_eos, 2);
    assert_int_equal(c.eos_token_ids[0], 2);
    assert_int_equal(c.eos_token_ids[1], 1);
}

static void test_defaults(void **state) {
    ModelConfig c;
    assert_int_equal(parse(llama_with(NULL), &c), PL_OK);
    assert_int_equal(c.num_kv_heads, 4);
    assert_int_equal(c.head_dim, 64);
    assert_int_equal(c.max_position_embeddings, 2048);
    assert_float_equal(c.rms_norm_eps, 1e-6f, 1e-12);
    assert_float_equal(c.rope_theta, 10000.0f, 0);
    assert_false(c.tie_word_embeddings);
    assert_false(c.qkv_bias);
    assert_int_equal(c.torch_dtype, DT_F32);
    assert_int_equal(c.bos_token_id, -1);
    assert_int_equal(c.num_eos, 0);
}

/* Llama-3.1-8B as transformers 4.x writes it. */
static const char *llama31 =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false,"
    " \"attention_dropout\": 0.0, \"bos_token_id\": 128000,"
    " \"eos_token_id\": [128001, 128008, 128009], \"head_dim\": 128, \"hidden_act\": \"silu\","
    " \"hidden_size\": 4096, \"initializer_range\": 0.02, \"intermediate_size\": 14336,"
    " \"max_position_embeddings\": 131072, \"mlp_bias\": false, \"model_type\": \"llama\","
    " \"num_attention_heads\": 32, \"num_hidden_layers\": 32, \"num_key_value_heads\": 8,"
    " \"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05,"
    " \"rope_scaling\": {\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,"
    "   \"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"},"
    " \"rope_theta\": 500000.0, \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\","
    " \"transformers_version\": \"4.43.0.dev0\", \"use_cache\": true, \"vocab_size\": 128256}";

static void check_llama31(const ModelConfig *c) {
    assert_int_equal(c->hidden_size, 4096);
    assert_int_equal(c->intermediate_size, 14336);
    assert_int_equal(c->num_layers, 32);
    assert_int_equal(c->num_heads, 32);
    assert_int_equal(c->num_kv_heads, 8);
    assert_int_equal(c->head_dim, 128);
    assert_int_equal(c->vocab_size, 128256);
    assert_int_equal(c->max_position_embeddings, 131072);
    assert_float_equal(c->rope_theta, 500000.0f, 0);
    assert_float_equal(c->rope_llama3_factor, 8.0f, 0);
    assert_float_equal(c->rope_low_freq_factor, 1.0f, 0);
    assert_float_equal(c->rope_high_freq_factor, 4.0f, 0);
    assert_int_equal(c->rope_original_max_position, 8192);
    assert_int_equal(c->torch_dtype, DT_BF16);
    assert_int_equal(c->bos_token_id, 128000);
    assert_int_equal(c->num_eos, 3);
    assert_int_equal(c->eos_token_ids[0], 128001);
    assert_int_equal(c->eos_token_ids[2], 128009);
    assert_false(c->tie_word_embeddings);
    assert_false(c->qkv_bias);
}

static void test_llama3_rope_scaling(void **state) {
    ModelConfig c;
    assert_int_equal(parse(llama31, &c), PL_OK);
    check_llama31(&c);
}

/* The same model as transformers 5 writes it: `dtype`, and rope_parameters carrying theta. */
static void test_llama3_transformers5(void **state) {
    const char *v5 =
        "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false,"
        " \"bos_token_id\": 128000, \"dtype\": \"bfloat16\","
        " \"eos_token_id\": [128001, 128008, 128009], \"head_dim\": 128,"
        " \"hidden_act\": \"silu\", \"hidden_size\": 4096, \"intermediate_size\": 14336,"
        " \"max_position_embeddings\": 131072, \"mlp_bias\": false, \"model_type\": \"llama\","
        " \"num_attention_heads\": 32, \"num_hidden_layers\": 32, \"num_key_value_heads\": 8,"
        " \"pad_token_id\": null, \"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05,"
        " \"rope_parameters\": {\"factor\": 8.0, \"high_freq_factor\": 4.0,"
        "   \"low_freq_factor\": 1.0, \"original_max_position_embeddings\": 8192,"
        "   \"rope_theta\": 500000.0, \"rope_type\": \"llama3\"},"
        " \"tie_word_embeddings\": false, \"transformers_version\": \"5.17.0\","
        " \"use_cache\": true, \"vocab_size\": 128256}";
    ModelConfig c;
    assert_int_equal(parse(v5, &c), PL_OK);
    check_llama31(&c);

    /* rope_parameters of type default: theta only, no scaling. */
    assert_int_equal(parse(llama_with("\"rope_parameters\": {\"rope_theta\": 1000000.0,"
                                      " \"rope_type\": \"default\"}"),
                           &c),
                     PL_OK);
    assert_float_equal(c.rope_theta, 1e6f, 0);
    assert_float_equal(c.rope_llama3_factor, 0, 0);

    /* Old-style `type` key, null rope_scaling. */
    assert_int_equal(parse(llama_with("\"rope_scaling\": {\"type\": \"llama3\", \"factor\": 32,"
                                      " \"low_freq_factor\": 1, \"high_freq_factor\": 4,"
                                      " \"original_max_position_embeddings\": 8192}"),
                           &c),
                     PL_OK);
    assert_float_equal(c.rope_llama3_factor, 32.0f, 0);
    assert_int_equal(parse(llama_with("\"rope_scaling\": null, \"head_dim\": null"), &c), PL_OK);
    assert_float_equal(c.rope_llama3_factor, 0, 0);
    assert_int_equal(c.head_dim, 64);
}

/* config.json exactly as transformers 5.17 save_pretrained wrote it for the random models
 * of tools/make_random_checkpoints.py. */
static const char *v517_llama =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false,"
    " \"attention_dropout\": 0.0, \"bos_token_id\": 1, \"dtype\": \"float32\","
    " \"eos_token_id\": 2, \"head_dim\": 128, \"hidden_act\": \"silu\", \"hidden_size\": 512,"
    " \"initializer_range\": 0.02, \"intermediate_size\": 1024,"
    " \"max_position_embeddings\": 131072, \"mlp_bias\": false, \"model_type\": \"llama\","
    " \"num_attention_heads\": 4, \"num_hidden_layers\": 3, \"num_key_value_heads\": 1,"
    " \"pad_token_id\": null, \"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05,"
    " \"rope_parameters\": {\"factor\": 8.0, \"high_freq_factor\": 4.0,"
    " \"low_freq_factor\": 1.0, \"original_max_position_embeddings\": 8192,"
    " \"rope_theta\": 500000.0, \"rope_type\": \"llama3\"}, \"tie_word_embeddings\": false,"
    " \"transformers_version\": \"5.17.0\", \"use_cache\": true, \"vocab_size\": 1024}";
static const char *v517_qwen2 =
    "{\"architectures\": [\"Qwen2ForCausalLM\"], \"attention_dropout\": 0.0,"
    " \"bos_token_id\": 1, \"dtype\": \"float32\", \"eos_token_id\": [2, 3],"
    " \"hidden_act\": \"silu\", \"hidden_size\": 512, \"initializer_range\": 0.02,"
    " \"intermediate_size\": 1024, \"layer_types\": [\"full_attention\", \"full_attention\","
    " \"full_attention\"], \"max_position_embeddings\": 4096, \"max_window_layers\": 28,"
    " \"model_type\": \"qwen2\", \"num_attention_heads\": 8, \"num_hidden_layers\": 3,"
    " \"num_key_value_heads\": 2, \"pad_token_id\": null, \"rms_norm_eps\": 1e-06,"
    " \"rope_parameters\": {\"rope_theta\": 1000000.0, \"rope_type\": \"default\"},"
    " \"sliding_window\": null, \"tie_word_embeddings\": true,"
    " \"transformers_version\": \"5.17.0\", \"use_cache\": true,"
    " \"use_sliding_window\": false, \"vocab_size\": 1024}";

static void test_transformers_517_output(void **state) {
    ModelConfig c;
    assert_int_equal(parse(v517_llama, &c), PL_OK);
    assert_int_equal(c.hidden_size, 512);
    assert_int_equal(c.num_heads, 4);
    assert_int_equal(c.num_kv_heads, 1);
    assert_int_equal(c.head_dim, 128);
    assert_int_equal(c.num_layers, 3);
    assert_int_equal(c.vocab_size, 1024);
    assert_float_equal(c.rope_theta, 500000.0f, 0);
    assert_float_equal(c.rope_llama3_factor, 8.0f, 0);
    assert_float_equal(c.rope_low_freq_factor, 1.0f, 0);
    assert_float_equal(c.rope_high_freq_factor, 4.0f, 0);
    assert_int_equal(c.rope_original_max_position, 8192);
    assert_int_equal(c.torch_dtype, DT_F32);
    assert_false(c.tie_word_embeddings);
    assert_false(c.qkv_bias);

    assert_int_equal(parse(v517_qwen2, &c), PL_OK);
    assert_string_equal(c.architecture, "Qwen2ForCausalLM");
    assert_int_equal(c.head_dim, 64);
    assert_int_equal(c.num_kv_heads, 2);
    assert_float_equal(c.rope_theta, 1e6f, 0);
    assert_float_equal(c.rope_llama3_factor, 0, 0);
    assert_int_equal(c.max_position_embeddings, 4096);
    assert_true(c.qkv_bias);
    assert_true(c.tie_word_embeddings);
    assert_int_equal(c.num_eos, 2);
    assert_int_equal(c.eos_token_ids[1], 3);
}

static void test_qwen2(void **state) {
    /* Qwen2.5-0.5B-Instruct's config.json. */
    const char *q =
        "{\"architectures\": [\"Qwen2ForCausalLM\"], \"attention_dropout\": 0.0,"
        " \"bos_token_id\": 151643, \"eos_token_id\": 151645, \"hidden_act\": \"silu\","
        " \"hidden_size\": 896, \"initializer_range\": 0.02, \"intermediate_size\": 4864,"
        " \"max_position_embeddings\": 32768, \"max_window_layers\": 21,"
        " \"model_type\": \"qwen2\", \"num_attention_heads\": 14, \"num_hidden_layers\": 24,"
        " \"num_key_value_heads\": 2, \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0,"
        " \"sliding_window\": 32768, \"tie_word_embeddings\": true,"
        " \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.43.1\","
        " \"use_cache\": true, \"use_sliding_window\": false, \"vocab_size\": 151936}";
    ModelConfig c;
    assert_int_equal(parse(q, &c), PL_OK);
    assert_string_equal(c.architecture, "Qwen2ForCausalLM");
    assert_true(c.qkv_bias);
    assert_true(c.tie_word_embeddings);
    assert_int_equal(c.hidden_size, 896);
    assert_int_equal(c.num_heads, 14);
    assert_int_equal(c.num_kv_heads, 2);
    assert_int_equal(c.head_dim, 64);
    assert_int_equal(c.max_position_embeddings, 32768);
    assert_float_equal(c.rope_theta, 1e6f, 0);
    assert_int_equal(c.torch_dtype, DT_BF16);
    assert_int_equal(c.num_eos, 1);
    assert_int_equal(c.eos_token_ids[0], 151645);
    assert_int_equal(c.bos_token_id, 151643);
}

static void test_mistral_and_sliding_window(void **state) {
    /* Mistral-7B-v0.1: a 4096 window on every layer, the context not capped by it. */
    const char *m =
        "{\"architectures\": [\"MistralForCausalLM\"], \"bos_token_id\": 1,"
        " \"eos_token_id\": 2, \"hidden_act\": \"silu\", \"hidden_size\": 4096,"
        " \"intermediate_size\": 14336, \"max_position_embeddings\": 32768,"
        " \"model_type\": \"mistral\", \"num_attention_heads\": 32, \"num_hidden_layers\": 32,"
        " \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0,"
        " \"sliding_window\": 4096, \"tie_word_embeddings\": false,"
        " \"torch_dtype\": \"bfloat16\", \"vocab_size\": 32000}";
    ModelConfig c;
    assert_int_equal(parse(m, &c), PL_OK);
    assert_string_equal(c.architecture, "MistralForCausalLM");
    assert_int_equal(c.max_position_embeddings, 32768);
    assert_int_equal(model_layer_window(&c, 0), 4096);
    assert_int_equal(model_layer_window(&c, 31), 4096);
    assert_int_equal(model_kv_window(&c), 4096);
    assert_false(c.qkv_bias);
    assert_int_equal(c.head_dim, 128);

    /* Qwen2 with use_sliding_window: layers from max_window_layers on slide, the context is
     * not capped, and the cache keeps everything (layers 0 and 1 see all of it). */
    const char *q = "{\"architectures\": [\"Qwen2ForCausalLM\"], \"hidden_size\": 64,"
                    " \"intermediate_size\": 128, \"num_hidden_layers\": 4,"
                    " \"num_attention_heads\": 4, \"vocab_size\": 100,"
                    " \"max_position_embeddings\": 32768, \"use_sliding_window\": %s,"
                    " \"sliding_window\": 1024, \"max_window_layers\": 2%s}";
    char text[600];
    snprintf(text, sizeof text, q, "true", "");
    assert_int_equal(parse(text, &c), PL_OK);
    assert_int_equal(c.max_position_embeddings, 32768);
    const int want[4] = {0, 0, 1024, 1024};
    for (int l = 0; l < 4; l++)
        assert_int_equal(model_layer_window(&c, l), want[l]);
    assert_int_equal(model_kv_window(&c), 0);
    /* transformers 5's layer_types wins over max_window_layers */
    snprintf(text, sizeof text, q, "true",
             ", \"layer_types\": [\"sliding_attention\", \"full_attention\","
             " \"sliding_attention\", \"sliding_attention\"]");
    assert_int_equal(parse(text, &c), PL_OK);
    const int typed[4] = {1024, 0, 1024, 1024};
    for (int l = 0; l < 4; l++)
        assert_int_equal(model_layer_window(&c, l), typed[l]);
    /* use_sliding_window false (Qwen2.5's configs): no window whatever sliding_window says */
    snprintf(text, sizeof text, q, "false", "");
    assert_int_equal(parse(text, &c), PL_OK);
    for (int l = 0; l < 4; l++)
        assert_int_equal(model_layer_window(&c, l), 0);
    /* a null window: none */
    assert_int_equal(parse(llama_with("\"sliding_window\": null"), &c), PL_OK);
    assert_int_equal(model_layer_window(&c, 0), 0);
}

static void test_attention_bias_and_model_type(void **state) {
    ModelConfig c;
    assert_int_equal(parse(llama_with("\"attention_bias\": true"), &c), PL_OK);
    assert_true(c.qkv_bias);
    /* No `architectures`: model_type names the family. */
    const char *mt = "{\"model_type\": \"qwen2\", \"hidden_size\": 64,"
                     " \"intermediate_size\": 128, \"num_hidden_layers\": 1,"
                     " \"num_attention_heads\": 4, \"vocab_size\": 100}";
    assert_int_equal(parse(mt, &c), PL_OK);
    assert_string_equal(c.architecture, "Qwen2ForCausalLM");
    assert_true(c.qkv_bias);
}

/* Qwen3-0.6B's config.json (transformers 4.51): explicit head_dim 128 with hidden 1024 and 16
 * heads, q/k norms, no q/k/v bias, tied embeddings, no sliding window. */
static void test_qwen3(void **state) {
    ModelConfig c;
    const char *j =
        "{\"architectures\": [\"Qwen3ForCausalLM\"], \"attention_bias\": false,"
        " \"attention_dropout\": 0.0, \"bos_token_id\": 151643, \"eos_token_id\": 151645,"
        " \"head_dim\": 128, \"hidden_act\": \"silu\", \"hidden_size\": 1024,"
        " \"initializer_range\": 0.02, \"intermediate_size\": 3072,"
        " \"max_position_embeddings\": 40960, \"max_window_layers\": 28, \"model_type\": \"qwen3\","
        " \"num_attention_heads\": 16, \"num_hidden_layers\": 28, \"num_key_value_heads\": 8,"
        " \"rms_norm_eps\": 1e-06, \"rope_scaling\": null, \"rope_theta\": 1000000,"
        " \"sliding_window\": null, \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\","
        " \"transformers_version\": \"4.51.0\", \"use_cache\": true, \"use_sliding_window\": false,"
        " \"vocab_size\": 151936}";
    assert_int_equal(parse(j, &c), PL_OK);
    assert_string_equal(c.architecture, "Qwen3ForCausalLM");
    assert_int_equal(c.head_dim, 128);
    assert_int_equal(c.num_heads * c.head_dim, 2048); /* != hidden_size */
    assert_true(c.qk_norm);
    assert_false(c.qkv_bias);
    assert_true(c.tie_word_embeddings);
    assert_int_equal(c.num_experts, 0);
    assert_int_equal(c.max_position_embeddings, 40960);
    assert_false(model_layer_is_moe(&c, 0));
    /* model_type alone */
    const char *mt = "{\"model_type\": \"qwen3\", \"hidden_size\": 64,"
                     " \"intermediate_size\": 128, \"num_hidden_layers\": 1,"
                     " \"num_attention_heads\": 4, \"vocab_size\": 100}";
    assert_int_equal(parse(mt, &c), PL_OK);
    assert_string_equal(c.architecture, "Qwen3ForCausalLM");
    assert_false(c.qkv_bias);
}

/* Qwen3-30B-A3B's config.json: 128 experts of 768, top 8, renormalized, every layer sparse. */
static void test_qwen3_moe(void **state) {
    ModelConfig c;
    const char *j =
        "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"attention_bias\": false,"
        " \"bos_token_id\": 151643, \"decoder_sparse_step\": 1, \"eos_token_id\": 151645,"
        " \"head_dim\": 128, \"hidden_act\": \"silu\", \"hidden_size\": 2048,"
        " \"intermediate_size\": 6144, \"max_position_embeddings\": 40960,"
        " \"max_window_layers\": 48, \"mlp_only_layers\": [], \"model_type\": \"qwen3_moe\","
        " \"moe_intermediate_size\": 768, \"norm_topk_prob\": true, \"num_attention_heads\": 32,"
        " \"num_experts\": 128, \"num_experts_per_tok\": 8, \"num_hidden_layers\": 48,"
        " \"num_key_value_heads\": 4, \"output_router_logits\": false, \"rms_norm_eps\": 1e-06,"
        " \"rope_scaling\": null, \"rope_theta\": 1000000.0, \"router_aux_loss_coef\": 0.001,"
        " \"sliding_window\": null, \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\","
        " \"use_sliding_window\": false, \"vocab_size\": 151936}";
    assert_int_equal(parse(j, &c), PL_OK);
    assert_string_equal(c.architecture, "Qwen3MoeForCausalLM");
    assert_true(c.qk_norm);
    assert_int_equal(c.num_experts, 128);
    assert_int_equal(c.num_experts_per_tok, 8);
    assert_int_equal(c.moe_intermediate_size, 768);
    assert_true(c.norm_topk_prob);
    for (int l = 0; l < 48; l++)
        assert_true(model_layer_is_moe(&c, l));
    /* dense layers: mlp_only_layers and decoder_sparse_step */
    const char *base = "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"hidden_size\": 64,"
                       " \"intermediate_size\": 128, \"num_hidden_layers\": 6,"
                       " \"num_attention_heads\": 4, \"vocab_size\": 100, \"num_experts\": 8,"
                       " \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32";
    char buf[1024];
    snprintf(buf, sizeof buf, "%s, \"decoder_sparse_step\": 2, \"mlp_only_layers\": [3]}", base);
    assert_int_equal(parse(buf, &c), PL_OK);
    assert_false(c.norm_topk_prob); /* transformers' default */
    int want[6] = {0, 1, 0, 0, 0, 1};
    for (int l = 0; l < 6; l++)
        assert_int_equal(model_layer_is_moe(&c, l), want[l]);
    snprintf(buf, sizeof buf, "%s, \"mlp_only_layers\": [6]}", base);
    expect_error(parse(buf, &c), PL_ERR_FORMAT, "test/config.json", "'mlp_only_layers'");
    snprintf(buf, sizeof buf, "%s, \"num_experts_per_tok\": 9}", base);
    expect_error(parse(buf, &c), PL_ERR_FORMAT, "test/config.json", "'num_experts_per_tok'");
    const char *no_experts = "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"hidden_size\": 64,"
                             " \"intermediate_size\": 128, \"num_hidden_layers\": 6,"
                             " \"num_attention_heads\": 4, \"vocab_size\": 100}";
    expect_error(parse(no_experts, &c), PL_ERR_FORMAT, "test/config.json", "'num_experts'");
    /* transformers 5.17 writes Qwen3-MoE's count as num_local_experts */
    const char *v5 = "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"hidden_size\": 64,"
                     " \"intermediate_size\": 64, \"num_hidden_layers\": 2,"
                     " \"num_attention_heads\": 2, \"vocab_size\": 256, \"num_local_experts\": 4,"
                     " \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 48,"
                     " \"norm_topk_prob\": true, \"mlp_only_layers\": [0]}";
    assert_int_equal(parse(v5, &c), PL_OK);
    assert_int_equal(c.num_experts, 4);
    assert_false(model_layer_is_moe(&c, 0));
    assert_true(model_layer_is_moe(&c, 1));
}

/* Mixtral-8x7B's config.json: 8 local experts of intermediate_size, top 2, always
 * renormalized; a null sliding_window. */
static void test_mixtral(void **state) {
    ModelConfig c;
    const char *j =
        "{\"architectures\": [\"MixtralForCausalLM\"], \"attention_dropout\": 0.0,"
        " \"bos_token_id\": 1, \"eos_token_id\": 2, \"hidden_act\": \"silu\","
        " \"hidden_size\": 4096, \"initializer_range\": 0.02, \"intermediate_size\": 14336,"
        " \"max_position_embeddings\": 32768, \"model_type\": \"mixtral\","
        " \"num_attention_heads\": 32, \"num_experts_per_tok\": 2, \"num_hidden_layers\": 32,"
        " \"num_key_value_heads\": 8, \"num_local_experts\": 8, \"output_router_logits\": false,"
        " \"rms_norm_eps\": 1e-05, \"rope_theta\": 1000000.0, \"router_aux_loss_coef\": 0.02,"
        " \"sliding_window\": null, \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\","
        " \"use_cache\": true, \"vocab_size\": 32000}";
    assert_int_equal(parse(j, &c), PL_OK);
    assert_string_equal(c.architecture, "MixtralForCausalLM");
    assert_false(c.qk_norm);
    assert_false(c.qkv_bias);
    assert_int_equal(c.num_experts, 8);
    assert_int_equal(c.num_experts_per_tok, 2);
    assert_int_equal(c.moe_intermediate_size, 14336);
    assert_true(c.norm_topk_prob);
    assert_int_equal(c.max_position_embeddings, 32768);
    assert_true(model_layer_is_moe(&c, 0) && model_layer_is_moe(&c, 31));
    ModelShard sh;
    assert_int_equal(model_shard(&c, 1, 2, &sh), PL_OK);
    assert_int_equal(sh.moe_intermediate, 7168);
    assert_int_equal(sh.first_moe_inter, 7168);
}

/* google/gemma-2-2b-it's config.json (transformers 4.42 wrote it). */
static void test_gemma2(void **state) {
    const char *j =
        "{\"architectures\": [\"Gemma2ForCausalLM\"], \"attention_bias\": false,"
        " \"attention_dropout\": 0.0, \"attn_logit_softcapping\": 50.0, \"bos_token_id\": 2,"
        " \"cache_implementation\": \"hybrid\", \"eos_token_id\": [1, 107],"
        " \"final_logit_softcapping\": 30.0, \"head_dim\": 256, \"hidden_act\": "
        "\"gelu_pytorch_tanh\","
        " \"hidden_activation\": \"gelu_pytorch_tanh\", \"hidden_size\": 2304,"
        " \"initializer_range\": 0.02, \"intermediate_size\": 9216, \"max_position_embeddings\": "
        "8192,"
        " \"model_type\": \"gemma2\", \"num_attention_heads\": 8, \"num_hidden_layers\": 26,"
        " \"num_key_value_heads\": 4, \"pad_token_id\": 0, \"query_pre_attn_scalar\": 256,"
        " \"rms_norm_eps\": 1e-06, \"rope_theta\": 10000.0, \"sliding_window\": 4096,"
        " \"torch_dtype\": \"float32\", \"transformers_version\": \"4.42.4\", \"use_cache\": true,"
        " \"vocab_size\": 256000}";
    ModelConfig c;
    assert_int_equal(parse(j, &c), PL_OK);
    assert_true(c.gemma && c.gelu && c.tie_word_embeddings && !c.qk_norm);
    assert_int_equal(c.head_dim, 256);
    assert_int_equal(c.max_position_embeddings, 8192); /* not capped: the window is per layer */
    assert_float_equal(c.attn_softcap, 50.0f, 0);
    assert_float_equal(c.final_softcap, 30.0f, 0);
    assert_float_equal(c.query_pre_attn_scalar, 256.0f, 0);
    assert_int_equal(model_layer_window(&c, 0), 4096); /* even layers slide */
    assert_int_equal(model_layer_window(&c, 1), 0);
    assert_int_equal(model_layer_window(&c, 24), 4096);
    assert_int_equal(c.num_eos, 2);
    expect_error(parse("{\"architectures\": [\"Gemma2ForCausalLM\"], \"hidden_size\": 64,"
                       " \"intermediate_size\": 64, \"num_hidden_layers\": 2,"
                       " \"num_attention_heads\": 2, \"vocab_size\": 100,"
                       " \"hidden_activation\": \"gelu\"}",
                       &c),
                 PL_ERR_UNSUPPORTED, "test/config.json", "'hidden_activation'");
}

/* Gemma 3 (text) as transformers 5.17 writes it: layer_types, rope_parameters per layer kind
 * (gemma-3-4b's global linear scaling 8), and as 4.5x wrote it (rope_local_base_freq,
 * sliding_window_pattern). */
static void test_gemma3(void **state) {
    const char *v5 =
        "{\"architectures\": [\"Gemma3ForCausalLM\"], \"attention_bias\": false,"
        " \"attn_logit_softcapping\": null, \"bos_token_id\": 2, \"dtype\": \"bfloat16\","
        " \"eos_token_id\": 1, \"final_logit_softcapping\": null, \"head_dim\": 256,"
        " \"hidden_activation\": \"gelu_pytorch_tanh\", \"hidden_size\": 2560,"
        " \"intermediate_size\": 10240, \"layer_types\": [\"sliding_attention\","
        " \"sliding_attention\", \"sliding_attention\", \"sliding_attention\","
        " \"sliding_attention\", \"full_attention\"], \"max_position_embeddings\": 131072,"
        " \"model_type\": \"gemma3_text\", \"num_attention_heads\": 8, \"num_hidden_layers\": 6,"
        " \"num_key_value_heads\": 4, \"query_pre_attn_scalar\": 256, \"rms_norm_eps\": 1e-06,"
        " \"rope_parameters\": {\"full_attention\": {\"factor\": 8.0, \"rope_theta\": 1000000.0,"
        " \"rope_type\": \"linear\"}, \"sliding_attention\": {\"rope_theta\": 10000.0,"
        " \"rope_type\": \"default\"}}, \"sliding_window\": 1024, \"tie_word_embeddings\": true,"
        " \"transformers_version\": \"5.17.0\", \"use_bidirectional_attention\": false,"
        " \"vocab_size\": 262208}";
    ModelConfig c;
    assert_int_equal(parse(v5, &c), PL_OK);
    assert_true(c.gemma && c.gelu && c.qk_norm && c.tie_word_embeddings);
    assert_float_equal(c.attn_softcap, 0, 0);
    assert_float_equal(c.final_softcap, 0, 0);
    assert_float_equal(c.rope_theta, 1e6f, 0);
    assert_float_equal(c.rope_local_theta, 1e4f, 0);
    assert_int_equal(c.rope_scaling.type, ROPE_LINEAR);
    assert_float_equal(c.rope_scaling.factor, 8.0f, 0);
    for (int l = 0; l < 5; l++)
        assert_int_equal(model_layer_window(&c, l), 1024);
    assert_int_equal(model_layer_window(&c, 5), 0);
    const char *v4 =
        "{\"architectures\": [\"Gemma3ForCausalLM\"], \"head_dim\": 256, \"hidden_size\": 1152,"
        " \"intermediate_size\": 6912, \"model_type\": \"gemma3_text\","
        " \"num_attention_heads\": 4, \"num_hidden_layers\": 26, \"num_key_value_heads\": 1,"
        " \"query_pre_attn_scalar\": 256, \"rope_local_base_freq\": 10000,"
        " \"rope_scaling\": null, \"rope_theta\": 1000000, \"sliding_window\": 512,"
        " \"sliding_window_pattern\": 6, \"vocab_size\": 262144}";
    assert_int_equal(parse(v4, &c), PL_OK);
    assert_int_equal(c.rope_scaling.type, ROPE_DEFAULT);
    assert_float_equal(c.rope_local_theta, 1e4f, 0);
    assert_int_equal(model_layer_window(&c, 4), 512);
    assert_int_equal(model_layer_window(&c, 5), 0);
    assert_int_equal(model_layer_window(&c, 11), 0);
    assert_int_equal(model_layer_window(&c, 12), 512);
}

/* Phi-3-mini-128k-instruct (rope_scaling "su"... now "longrope", factors outside) and
 * Phi-4-mini (partial_rotary_factor 0.75) as transformers 5 writes them. */
static void test_phi3(void **state) {
    char j[8192], sf[2048] = "", lf[2048] = "";
    for (int i = 0; i < 48; i++) {
        snprintf(sf + strlen(sf), sizeof sf - strlen(sf), "%s%g", i ? ", " : "", 1.0 + i * 0.01);
        snprintf(lf + strlen(lf), sizeof lf - strlen(lf), "%s%g", i ? ", " : "", 1.0 + i * 0.5);
    }
    snprintf(j, sizeof j,
             "{\"architectures\": [\"Phi3ForCausalLM\"], \"hidden_act\": \"silu\","
             " \"hidden_size\": 3072, \"intermediate_size\": 8192,"
             " \"max_position_embeddings\": 131072, \"model_type\": \"phi3\","
             " \"num_attention_heads\": 32, \"num_hidden_layers\": 32, \"num_key_value_heads\": 32,"
             " \"original_max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-05,"
             " \"rope_scaling\": {\"long_factor\": [%s], \"short_factor\": [%s], \"type\": \"su\"},"
             " \"rope_theta\": 10000.0, \"sliding_window\": 262144, \"vocab_size\": 32064}",
             lf, sf);
    ModelConfig c;
    assert_int_equal(parse(j, &c), PL_OK);
    assert_int_equal(c.rope_scaling.type, ROPE_LONGROPE);
    assert_int_equal(c.rope_scaling.num_factors, 48);
    assert_int_equal(c.rope_scaling.original_max_position, 4096);
    assert_float_equal(c.rope_scaling.long_factor[2], 2.0f, 1e-6);
    assert_int_equal(c.rotary_dim, 96);
    assert_false(c.gemma || c.gelu);
    float inv[48], lng[48];
    float att = k_rope_freqs(inv, lng, 96, 10000.0f, &c.rope_scaling);
    assert_float_equal(att, sqrtf(1 + logf(32) / logf(4096)), 1e-6);
    assert_float_equal(inv[2] * 1.02f, lng[2] * 2.0f, 1e-7);
    /* Phi-4-mini: 24 heads of 128, 0.75 of each rotated: 48 factors */
    char sf2[1024] = "", j2[4096];
    for (int i = 0; i < 48; i++)
        snprintf(sf2 + strlen(sf2), sizeof sf2 - strlen(sf2), "%s1", i ? ", " : "");
    snprintf(j2, sizeof j2,
             "{\"architectures\": [\"Phi3ForCausalLM\"], \"hidden_size\": 3072,"
             " \"intermediate_size\": 8192, \"max_position_embeddings\": 131072,"
             " \"num_attention_heads\": 24, \"num_hidden_layers\": 32, \"num_key_value_heads\": 8,"
             " \"original_max_position_embeddings\": 4096, \"vocab_size\": 200064,"
             " \"tie_word_embeddings\": true, \"rope_parameters\": {\"rope_type\": \"longrope\","
             " \"long_factor\": [%s], \"short_factor\": [%s], \"rope_theta\": 10000.0,"
             " \"partial_rotary_factor\": 0.75, \"original_max_position_embeddings\": 4096}}",
             sf2, sf2);
    assert_int_equal(parse(j2, &c), PL_OK);
    assert_int_equal(c.rotary_dim, 96);
    assert_int_equal(c.head_dim, 128);
    assert_int_equal(c.rope_scaling.num_factors, 48);
    /* a factor list of the wrong length names it */
    snprintf(j2, sizeof j2,
             "{\"architectures\": [\"Phi3ForCausalLM\"], \"hidden_size\": 3072,"
             " \"intermediate_size\": 8192, \"num_attention_heads\": 24, \"num_hidden_layers\": 2,"
             " \"vocab_size\": 200064, \"partial_rotary_factor\": 1.0, \"rope_scaling\":"
             " {\"type\": \"longrope\", \"long_factor\": [%s], \"short_factor\": [%s]}}",
             sf2, sf2);
    expect_error(parse(j2, &c), PL_ERR_FORMAT, "'rope_scaling.short_factor'", "64 numbers");
}

/* linear, dynamic and yarn scaling of a Llama (transformers 5's rope_parameters), and the
 * frequencies they give (the reference values are transformers' formulas, in double). */
static void test_rope_scalings(void **state) {
    ModelConfig c;
    assert_int_equal(parse(llama_with("\"rope_parameters\": {\"rope_type\": \"linear\","
                                      " \"factor\": 4.0, \"rope_theta\": 10000.0}"),
                           &c),
                     PL_OK);
    assert_int_equal(c.rope_scaling.type, ROPE_LINEAR);
    float inv[32], def[32];
    k_rope_freqs(def, NULL, 64, 10000.0f, NULL);
    assert_float_equal(k_rope_freqs(inv, NULL, 64, 10000.0f, &c.rope_scaling), 1.0f, 0);
    for (int i = 0; i < 32; i++)
        assert_float_equal(inv[i], def[i] / 4.0f, 0);
    assert_int_equal(
        parse(llama_with("\"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 2}"), &c), PL_OK);
    assert_int_equal(c.rope_scaling.type, ROPE_DYNAMIC);
    k_rope_freqs(inv, NULL, 64, 10000.0f, &c.rope_scaling);
    assert_memory_equal(inv, def, sizeof inv); /* up to max_position_embeddings */
    assert_int_equal(parse(llama_with("\"max_position_embeddings\": 128, \"rope_scaling\":"
                                      " {\"rope_type\": \"yarn\", \"factor\": 4.0,"
                                      " \"original_max_position_embeddings\": 32,"
                                      " \"beta_fast\": 32, \"beta_slow\": 1}"),
                           &c),
                     PL_OK);
    assert_int_equal(c.rope_scaling.type, ROPE_YARN);
    assert_true(c.rope_scaling.truncate);
    float att = k_rope_freqs(inv, NULL, 64, 10000.0f, &c.rope_scaling);
    assert_float_equal(att, 0.1 * log(4.0) + 1.0, 1e-6);
    /* the ramp: low = floor(64 ln(32 / (32 2 pi)) / (2 ln 1e4)), high = ceil(... beta 1) */
    double lo = floor(64 * log(32 / (32 * 2 * M_PI)) / (2 * log(1e4)));
    double hi = ceil(64 * log(32 / (1 * 2 * M_PI)) / (2 * log(1e4)));
    lo = lo < 0 ? 0 : lo;
    for (int i = 0; i < 32; i++) {
        double ramp = (i - lo) / (hi - lo);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        double want = def[i] / 4.0 * ramp + def[i] * (1 - ramp);
        assert_float_equal(inv[i], want, 1e-6 * def[i]);
    }
    /* mscale / mscale_all_dim (DeepSeek style) set the attention factor */
    assert_int_equal(parse(llama_with("\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 40,"
                                      " \"original_max_position_embeddings\": 4096,"
                                      " \"mscale\": 0.707, \"mscale_all_dim\": 0.707}"),
                           &c),
                     PL_OK);
    assert_float_equal(k_rope_freqs(inv, NULL, 64, 10000.0f, &c.rope_scaling), 1.0f, 1e-6);
}

static void test_eos_forms(void **state) {
    ModelConfig c;
    assert_int_equal(parse(llama_with("\"eos_token_id\": 7, \"bos_token_id\": null"), &c), PL_OK);
    assert_int_equal(c.num_eos, 1);
    assert_int_equal(c.eos_token_ids[0], 7);
    assert_int_equal(c.bos_token_id, -1);
    assert_int_equal(parse(llama_with("\"eos_token_id\": [5, 6, 9]"), &c), PL_OK);
    assert_int_equal(c.num_eos, 3);
    assert_int_equal(c.eos_token_ids[2], 9);
    assert_int_equal(parse(llama_with("\"eos_token_id\": null"), &c), PL_OK);
    assert_int_equal(c.num_eos, 0);
    expect_error(parse(llama_with("\"eos_token_id\": [1, 2, 3, 4, 5, 6, 7, 8, 9]"), &c),
                 PL_ERR_UNSUPPORTED, "test/config.json", "eos_token_id");
    expect_error(parse(llama_with("\"eos_token_id\": \"2\""), &c), PL_ERR_FORMAT,
                 "test/config.json", "eos_token_id");
    expect_error(parse(llama_with("\"eos_token_id\": [2, -1]"), &c), PL_ERR_FORMAT,
                 "test/config.json", "eos_token_id");
    expect_error(parse(llama_with("\"bos_token_id\": 1.5"), &c), PL_ERR_FORMAT, "test/config.json",
                 "bos_token_id");
}

static void test_dtypes(void **state) {
    ModelConfig c;
    assert_int_equal(parse(llama_with("\"torch_dtype\": \"float16\""), &c), PL_OK);
    assert_int_equal(c.torch_dtype, DT_F16);
    assert_int_equal(parse(llama_with("\"dtype\": \"float32\""), &c), PL_OK);
    assert_int_equal(c.torch_dtype, DT_F32);
    /* transformers 5 writes `dtype`; it wins over a stale torch_dtype. */
    assert_int_equal(parse(llama_with("\"dtype\": \"bfloat16\", \"torch_dtype\": \"float32\""), &c),
                     PL_OK);
    assert_int_equal(c.torch_dtype, DT_BF16);
    expect_error(parse(llama_with("\"torch_dtype\": \"float8_e4m3fn\""), &c), PL_ERR_UNSUPPORTED,
                 "torch_dtype", "float8_e4m3fn");
    expect_error(parse(llama_with("\"dtype\": 16"), &c), PL_ERR_FORMAT, "test/config.json",
                 "'dtype'");
}

/* ---- errors --------------------------------------------------------------------------- */

static void test_unknown_architecture(void **state) {
    ModelConfig c;
    const char *j = "{\"architectures\": [\"GPT2LMHeadModel\"], \"hidden_size\": 64}";
    expect_error(parse(j, &c), PL_ERR_UNSUPPORTED, "test/config.json", "'GPT2LMHeadModel'");
    assert_non_null(strstr(pl_error(), "LlamaForCausalLM"));
    assert_non_null(strstr(pl_error(), "Qwen3ForCausalLM"));
    assert_non_null(strstr(pl_error(), "MixtralForCausalLM"));
    assert_non_null(strstr(pl_error(), "Qwen3MoeForCausalLM"));
    assert_non_null(strstr(pl_error(), "Gemma2ForCausalLM"));
    assert_non_null(strstr(pl_error(), "Gemma3ForCausalLM"));
    assert_non_null(strstr(pl_error(), "Phi3ForCausalLM"));
    /* the multimodal Gemma 3 is not its text model */
    j = "{\"architectures\": [\"Gemma3ForConditionalGeneration\"], \"text_config\": {}}";
    expect_error(parse(j, &c), PL_ERR_UNSUPPORTED, "test/config.json",
                 "'Gemma3ForConditionalGeneration'");
    /* a family of the same makers that is not supported stays an error naming it */
    j = "{\"architectures\": [\"Qwen2MoeForCausalLM\"], \"hidden_size\": 64}";
    expect_error(parse(j, &c), PL_ERR_UNSUPPORTED, "test/config.json", "'Qwen2MoeForCausalLM'");
    expect_error(parse("{\"hidden_size\": 64}", &c), PL_ERR_FORMAT, "test/config.json",
                 "'architectures'");
    expect_error(parse("{\"architectures\": \"LlamaForCausalLM\"}", &c), PL_ERR_FORMAT,
                 "test/config.json", "'architectures'");
}

static void test_missing_keys(void **state) {
    static const char *keys[] = {"hidden_size", "intermediate_size", "num_hidden_layers",
                                 "num_attention_heads", "vocab_size"};
    for (size_t k = 0; k < 5; k++) {
        /* Build a config holding every required key but keys[k]. */
        char j[1024] = "{\"architectures\": [\"LlamaForCausalLM\"]";
        for (size_t i = 0; i < 5; i++)
            if (i != k)
                snprintf(j + strlen(j), sizeof j - strlen(j), ", \"%s\": 64", keys[i]);
        strcat(j, "}");
        ModelConfig c;
        char want[64];
        snprintf(want, sizeof want, "missing key '%s'", keys[k]);
        expect_error(parse(j, &c), PL_ERR_FORMAT, "test/config.json", want);
    }
}

static void test_wrong_types(void **state) {
    ModelConfig c;
    const char *j = "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": \"64\","
                    " \"intermediate_size\": 512, \"num_hidden_layers\": 2,"
                    " \"num_attention_heads\": 4, \"vocab_size\": 1000}";
    expect_error(parse(j, &c), PL_ERR_FORMAT, "test/config.json",
                 "key 'hidden_size' must be an integer");
    expect_error(parse(llama_with("\"num_key_value_heads\": 2.0"), &c), PL_ERR_FORMAT,
                 "test/config.json", "key 'num_key_value_heads' must be an integer");
    expect_error(parse(llama_with("\"rms_norm_eps\": \"1e-5\""), &c), PL_ERR_FORMAT,
                 "test/config.json", "'rms_norm_eps'");
    expect_error(parse(llama_with("\"rope_theta\": true"), &c), PL_ERR_FORMAT, "test/config.json",
                 "'rope_theta'");
    expect_error(parse(llama_with("\"tie_word_embeddings\": 1"), &c), PL_ERR_FORMAT,
                 "test/config.json", "'tie_word_embeddings'");
    expect_error(parse(llama_with("\"rope_scaling\": 8"), &c), PL_ERR_FORMAT, "test/config.json",
                 "'rope_scaling'");
}

static void test_bad_values(void **state) {
    ModelConfig c;
    const char *j = "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 0,"
                    " \"intermediate_size\": 512, \"num_hidden_layers\": 2,"
                    " \"num_attention_heads\": 4, \"vocab_size\": 1000}";
    expect_error(parse(j, &c), PL_ERR_FORMAT, "test/config.json", "'hidden_size'");
    expect_error(parse(llama_with("\"num_key_value_heads\": 3"), &c), PL_ERR_FORMAT,
                 "test/config.json", "'num_key_value_heads'");
    expect_error(parse(llama_with("\"num_key_value_heads\": -1"), &c), PL_ERR_FORMAT,
                 "test/config.json", "'num_key_value_heads'");
    expect_error(parse(llama_with("\"head_dim\": 7"), &c), PL_ERR_FORMAT, "test/config.json",
                 "'head_dim'");
    expect_error(parse(llama_with("\"rms_norm_eps\": 0"), &c), PL_ERR_FORMAT, "test/config.json",
                 "'rms_norm_eps'");
    expect_error(parse(llama_with("\"rope_theta\": -1"), &c), PL_ERR_FORMAT, "test/config.json",
                 "'rope_theta'");
    expect_error(parse(llama_with("\"max_position_embeddings\": 0"), &c), PL_ERR_FORMAT,
                 "test/config.json", "'max_position_embeddings'");
    expect_error(parse(llama_with("\"vocab_size\": 5000000000"), &c), PL_ERR_FORMAT,
                 "test/config.json", "'vocab_size'");
    /* hidden not divisible by heads with no head_dim. */
    const char *h = "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 100,"
                    " \"intermediate_size\": 512, \"num_hidden_layers\": 2,"
                    " \"num_attention_heads\": 3, \"vocab_size\": 1000}";
    expect_error(parse(h, &c), PL_ERR_FORMAT, "test/config.json", "'hidden_size'");
    /* Unsupported model features name their key. */
    expect_error(
        parse(llama_with("\"rope_scaling\": {\"rope_type\": \"proportional\", \"factor\": 4}"), &c),
        PL_ERR_UNSUPPORTED, "test/config.json", "'proportional'");
    expect_error(parse(llama_with("\"rope_scaling\": {\"type\": \"mrope\", \"factor\": 2}"), &c),
                 PL_ERR_UNSUPPORTED, "rope_scaling", "'mrope'");
    expect_error(parse(llama_with("\"rope_scaling\": {\"type\": \"linear\"}"), &c), PL_ERR_FORMAT,
                 "test/config.json", "'rope_scaling.factor'");
    expect_error(parse(llama_with("\"partial_rotary_factor\": 0.5"), &c), PL_ERR_UNSUPPORTED,
                 "'partial_rotary_factor'", "LlamaForCausalLM");
    expect_error(parse(llama_with("\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8,"
                                  " \"low_freq_factor\": 1, \"high_freq_factor\": 4}"),
                       &c),
                 PL_ERR_FORMAT, "test/config.json", "original_max_position_embeddings");
    expect_error(parse(llama_with("\"rope_parameters\": {\"rope_type\": \"llama3\","
                                  " \"low_freq_factor\": 1, \"high_freq_factor\": 4,"
                                  " \"original_max_position_embeddings\": 8192}"),
                       &c),
                 PL_ERR_FORMAT, "test/config.json", "'rope_parameters.factor'");
    expect_error(parse(llama_with("\"mlp_bias\": true"), &c), PL_ERR_UNSUPPORTED,
                 "test/config.json", "'mlp_bias'");
    expect_error(parse(llama_with("\"hidden_act\": \"gelu\""), &c), PL_ERR_UNSUPPORTED,
                 "test/config.json", "'hidden_act'");
}

static void test_invalid_json(void **state) {
    ModelConfig c;
    expect_error(parse("{\"architectures\": [\"LlamaForCausalLM\"],", &c), PL_ERR_FORMAT,
                 "test/config.json", "invalid JSON");
    expect_error(parse("[1, 2]", &c), PL_ERR_FORMAT, "test/config.json", "object");
    expect_error(parse("", &c), PL_ERR_FORMAT, "test/config.json", "invalid JSON");
}

/* ---- model_config_load on files ------------------------------------------------------- */

static char tmp_root[256];

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    return remove(p);
}

static int setup_tmp(void **state) {
    snprintf(tmp_root, sizeof tmp_root, "/tmp/pagellm_test_config_XXXXXX");
    return mkdtemp(tmp_root) ? 0 : -1;
}

static int teardown_tmp(void **state) {
    return nftw(tmp_root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void write_text(const char *dir, const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static char *make_dir(const char *name) {
    static char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", tmp_root, name);
    assert_int_equal(mkdir(dir, 0755), 0);
    return dir;
}

static void test_load_missing_file(void **state) {
    char *dir = make_dir("empty");
    ModelConfig c;
    char want[600];
    snprintf(want, sizeof want, "%s/config.json", dir);
    expect_error(model_config_load(dir, &c), PL_ERR_IO, want, NULL);
    expect_error(model_config_load("/nonexistent/model", &c), PL_ERR_IO,
                 "/nonexistent/model/config.json", NULL);
}

static void test_load_generation_config(void **state) {
    char *dir = make_dir("gen");
    ModelConfig c;
    write_text(dir, "config.json", llama_with("\"eos_token_id\": 2, \"bos_token_id\": 1"));
    write_text(dir, "generation_config.json", "{\"eos_token_id\": 9, \"bos_token_id\": 8}");
    assert_int_equal(model_config_load(dir, &c), PL_OK);
    assert_int_equal(c.num_eos, 1);
    assert_int_equal(c.eos_token_ids[0], 9);
    assert_int_equal(c.bos_token_id, 8);

    /* A generation config without token keys (or with null) keeps config.json's. */
    write_text(dir, "generation_config.json", "{\"do_sample\": true, \"eos_token_id\": null}");
    assert_int_equal(model_config_load(dir, &c), PL_OK);
    assert_int_equal(c.num_eos, 1);
    assert_int_equal(c.eos_token_ids[0], 2);
    assert_int_equal(c.bos_token_id, 1);

    /* Errors in it name generation_config.json. */
    write_text(dir, "generation_config.json", "{\"eos_token_id\": [1, \"x\"]}");
    expect_error(model_config_load(dir, &c), PL_ERR_FORMAT, "generation_config.json",
                 "eos_token_id");
    write_text(dir, "generation_config.json", "{\"eos_token_id\": ");
    expect_error(model_config_load(dir, &c), PL_ERR_FORMAT, "generation_config.json",
                 "invalid JSON");

    /* config.json errors name config.json with its folder. */
    write_text(dir, "config.json", "{\"architectures\": [\"LlamaForCausalLM\"]}");
    char want[600];
    snprintf(want, sizeof want, "%s/config.json: missing key 'hidden_size'", dir);
    expect_error(model_config_load(dir, &c), PL_ERR_FORMAT, want, NULL);
}

/* A positive double that is 0 as a float is refused (regression: the fuzzer's
 * tests/fuzz/crashes/config_json/rms_norm_eps_underflows_to_zero.json). */
static void test_float_underflow_refused(void **state) {
    (void)state;
    ModelConfig cfg;
    expect_error(parse(llama_with("\"rms_norm_eps\": 1e-50"), &cfg), PL_ERR_FORMAT, "rms_norm_eps",
                 NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories260k),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_llama3_rope_scaling),
        cmocka_unit_test(test_llama3_transformers5),
        cmocka_unit_test(test_transformers_517_output),
        cmocka_unit_test(test_qwen2),
        cmocka_unit_test(test_mistral_and_sliding_window),
        cmocka_unit_test(test_attention_bias_and_model_type),
        cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_qwen3_moe),
        cmocka_unit_test(test_mixtral),
        cmocka_unit_test(test_gemma2),
        cmocka_unit_test(test_gemma3),
        cmocka_unit_test(test_phi3),
        cmocka_unit_test(test_rope_scalings),
        cmocka_unit_test(test_eos_forms),
        cmocka_unit_test(test_dtypes),
        cmocka_unit_test(test_unknown_architecture),
        cmocka_unit_test(test_missing_keys),
        cmocka_unit_test(test_wrong_types),
        cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_invalid_json),
        cmocka_unit_test(test_load_missing_file),
        cmocka_unit_test(test_load_generation_config),
        cmocka_unit_test(test_float_underflow_refused),
    };
    return cmocka_run_group_tests_name("config", tests, setup_tmp, teardown_tmp);
}
