/* fuzz_config_json.c - libFuzzer target: a Hugging Face config.json through
 * model_config_parse, and (when the input holds a NUL byte) config.json plus
 * generation_config.json through model_config_load.
 *
 * Input: the config.json text; if it contains a NUL byte, what follows the first NUL is
 * written as generation_config.json next to it and the pair is loaded from a folder.
 * Invariants on success: the shapes the model code divides by are positive and consistent
 * (heads divisible by KV heads, even head_dim, head count * head_dim fits an int), floats
 * are finite and positive, at most MODEL_MAX_EOS EOS ids, a supported architecture. On
 * failure: an error message is set. */
#include <limits.h>
#include <math.h>

#include "fuzz_common.h"
#include "model.h"

/* A size or rate that must be a positive finite float once stored (regression:
 * crashes/config_json/rms_norm_eps_underflows_to_zero.json, 1e-50 once became 0). */
static int pos(float x) {
    return isfinite(x) && x > 0;
}

static void check(const ModelConfig *c, const char *what) {
    static const char *const archs[] = {
        "LlamaForCausalLM",  "MistralForCausalLM", "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",  "MixtralForCausalLM", "Qwen3MoeForCausalLM",
        "Gemma2ForCausalLM", "Gemma3ForCausalLM",  "Phi3ForCausalLM"};
    int known = 0;
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        known |= !strcmp(c->architecture, archs[i]);
    FUZZ_CHECK(known, "%s: architecture '%s'", what, c->architecture);
    FUZZ_CHECK(c->hidden_size > 0 && c->intermediate_size > 0 && c->num_layers > 0 &&
                   c->num_heads > 0 && c->num_kv_heads > 0 && c->head_dim > 0 &&
                   c->vocab_size > 0 && c->max_position_embeddings > 0,
               "%s: a size is not positive (hidden %d inter %d layers %d heads %d kv %d hd %d "
               "vocab %d maxpos %d)",
               what, c->hidden_size, c->intermediate_size, c->num_layers, c->num_heads,
               c->num_kv_heads, c->head_dim, c->vocab_size, c->max_position_embeddings);
    FUZZ_CHECK(c->num_heads % c->num_kv_heads == 0, "%s: heads %d kv %d", what, c->num_heads,
               c->num_kv_heads);
    FUZZ_CHECK(c->head_dim % 2 == 0, "%s: head_dim %d", what, c->head_dim);
    FUZZ_CHECK((long long)c->num_heads * c->head_dim <= INT_MAX, "%s: heads*head_dim overflows",
               what);
    FUZZ_CHECK(pos(c->rms_norm_eps), "%s: rms_norm_eps %g", what, c->rms_norm_eps);
    FUZZ_CHECK(pos(c->rope_theta), "%s: rope_theta %g", what, c->rope_theta);
    if (c->rope_llama3_factor != 0 || c->rope_original_max_position != 0) {
        FUZZ_CHECK(pos(c->rope_llama3_factor) && pos(c->rope_low_freq_factor) &&
                       pos(c->rope_high_freq_factor) &&
                       c->rope_high_freq_factor > c->rope_low_freq_factor &&
                       c->rope_original_max_position > 0,
                   "%s: llama3 rope %g %g %g %d", what, c->rope_llama3_factor,
                   c->rope_low_freq_factor, c->rope_high_freq_factor,
                   c->rope_original_max_position);
    }
    FUZZ_CHECK(c->torch_dtype == DT_F32 || c->torch_dtype == DT_F16 || c->torch_dtype == DT_BF16,
               "%s: torch_dtype %d", what, (int)c->torch_dtype);
    FUZZ_CHECK(c->num_eos >= 0 && c->num_eos <= MODEL_MAX_EOS, "%s: num_eos %d", what, c->num_eos);
    for (int i = 0; i < c->num_eos; i++)
        FUZZ_CHECK(c->eos_token_ids[i] >= 0, "%s: eos %d = %d", what, i, c->eos_token_ids[i]);
    FUZZ_CHECK(c->bos_token_id >= -1, "%s: bos %d", what, c->bos_token_id);
    FUZZ_CHECK(c->tie_word_embeddings == 0 || c->tie_word_embeddings == 1, "%s: tie %d", what,
               c->tie_word_embeddings);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fz_cstr(data, size); /* model_config_parse takes a C string */
    ModelConfig cfg;
    if (model_config_parse(text, "fuzz/config.json", &cfg) == PL_OK)
        check(&cfg, "model_config_parse");
    else
        FUZZ_CHECK(pl_error()[0], "model_config_parse failed without a message");

    const uint8_t *nul = memchr(data, 0, size);
    if (nul) {
        size_t k = (size_t)(nul - data);
        fz_write_file("config.json", data, k);
        fz_write_file("generation_config.json", nul + 1, size - k - 1);
        if (model_config_load(fz_scratch(), &cfg) == PL_OK)
            check(&cfg, "model_config_load");
        else
            FUZZ_CHECK(pl_error()[0], "model_config_load failed without a message");
    }
    free(text);
    return 0;
}
