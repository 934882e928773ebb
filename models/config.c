/* config.c - parse a Hugging Face config.json (+ generation_config.json) into ModelConfig.
 *
 * Accepts what transformers 4.x and 5.x write for LlamaForCausalLM, MistralForCausalLM,
 * Qwen2ForCausalLM, Qwen3ForCausalLM, MixtralForCausalLM and Qwen3MoeForCausalLM: `torch_dtype`
 * or (5.x) `dtype`; `rope_theta` + `rope_scaling` or (5.x) `rope_parameters` holding both. Every
 * error is one line naming the file and the key. */
#include "model.h"
#include "quant.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Each supported architecture and the model_type that names it in config.json files without
 * `architectures`. */
static const struct {
    const char *arch, *model_type;
} supported_archs[] = {
    {"LlamaForCausalLM", "llama"},     {"MistralForCausalLM", "mistral"},
    {"Qwen2ForCausalLM", "qwen2"},     {"Qwen3ForCausalLM", "qwen3"},
    {"MixtralForCausalLM", "mixtral"}, {"Qwen3MoeForCausalLM", "qwen3_moe"},
};
enum { NUM_ARCHS = sizeof supported_archs / sizeof supported_archs[0] };
#define SUPPORTED_LIST                                                                             \
    "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "                   \
    "MixtralForCausalLM, Qwen3MoeForCausalLM"

static const char *arch_from_model_type(const char *mt) {
    for (int i = 0; mt && i < NUM_ARCHS; i++)
        if (strcmp(mt, supported_archs[i].model_type) == 0)
            return supported_archs[i].arch;
    return NULL;
}

/* A key that is present and not null. */
static json_t *get(json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    return json_is_null(v) ? NULL : v;
}

/* Integer key in [lo, INT_MAX]; absent/null gives `dflt` unless required. */
static Status get_int(json_t *obj, const char *path, const char *key, int required, int dflt,
                      long long lo, int *out) {
    json_t *v = get(obj, key);
    if (!v) {
        if (required)
            return pl_error_set(PL_ERR_FORMAT, "%s: missing key '%s'", path, key);
        *out = dflt;
        return PL_OK;
    }
    if (!json_is_integer(v))
        return pl_error_set(PL_ERR_FORMAT, "%s: key '%s' must be an integer", path, key);
    long long x = json_integer_value(v);
    if (x < lo || x > INT_MAX)
        return pl_error_set(PL_ERR_FORMAT, "%s: key '%s' is %lld, must be %s", path, key, x,
                            lo > 0 ? "a positive integer" : "a non-negative integer");
    *out = (int)x;
    return PL_OK;
}

/* Number key (integer or real) that is finite and > 0; absent/null gives `dflt` unless
 * required. `what` names the key in errors ("rope_scaling.factor"). */
static Status get_pos_float(json_t *obj, const char *path, const char *key, const char *what,
                            int required, float dflt, float *out) {
    json_t *v = get(obj, key);
    if (!v) {
        if (required)
            return pl_error_set(PL_ERR_FORMAT, "%s: missing key '%s'", path, what);
        *out = dflt;
        return PL_OK;
    }
    if (!json_is_number(v))
        return pl_error_set(PL_ERR_FORMAT, "%s: key '%s' must be a number", path, what);
    double x = json_number_value(v);
    if (!(x > 0) || !isfinite((float)x) || !((float)x > 0)) /* also: not 0 once a float */
        return pl_error_set(PL_ERR_FORMAT, "%s: key '%s' is %g, must be a positive number", path,
                            what, x);
    *out = (float)x;
    return PL_OK;
}

static Status get_bool(json_t *obj, const char *path, const char *key, int dflt, int *out) {
    json_t *v = get(obj, key);
    if (!v) {
        *out = dflt;
        return PL_OK;
    }
    if (!json_is_boolean(v))
        return pl_error_set(PL_ERR_FORMAT, "%s: key '%s' must be true or false", path, key);
    *out = json_is_true(v);
    return PL_OK;
}

/* eos_token_id: an int or a list of ints (null: none). */
static Status parse_eos(json_t *v, const char *path, ModelConfig *cfg) {
    cfg->num_eos = 0;
    if (!v || json_is_null(v))
        return PL_OK;
    size_t n = 1;
    if (json_is_array(v)) {
        n = json_array_size(v);
        if (n > MODEL_MAX_EOS)
            return pl_error_set(PL_ERR_UNSUPPORTED,
                                "%s: key 'eos_token_id' lists %zu ids (at most %d supported)", path,
                                n, MODEL_MAX_EOS);
    }
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > INT_MAX)
            return pl_error_set(PL_ERR_FORMAT,
                                "%s: key 'eos_token_id' must be a non-negative integer or a "
                                "list of them",
                                path);
        cfg->eos_token_ids[cfg->num_eos++] = (int)json_integer_value(e);
    }
    return PL_OK;
}

static Status parse_bos(json_t *v, const char *path, ModelConfig *cfg) {
    if (!v || json_is_null(v)) {
        cfg->bos_token_id = -1;
        return PL_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT_MAX)
        return pl_error_set(PL_ERR_FORMAT, "%s: key 'bos_token_id' must be a non-negative integer",
                            path);
    cfg->bos_token_id = (int)json_integer_value(v);
    return PL_OK;
}

/* RoPE: theta and optional llama3 scaling, from the 4.x keys (rope_theta, rope_scaling) or
 * the 5.x `rope_parameters` object. As transformers does, rope_scaling wins over
 * rope_parameters, and a theta inside rope_parameters over the top-level one. */
static Status parse_rope(json_t *root, const char *path, ModelConfig *cfg) {
    json_t *params = get(root, "rope_parameters");
    json_t *scaling = get(root, "rope_scaling");
    if (params && !json_is_object(params))
        return pl_error_set(PL_ERR_FORMAT, "%s: key 'rope_parameters' must be an object", path);
    if (scaling && !json_is_object(scaling))
        return pl_error_set(PL_ERR_FORMAT, "%s: key 'rope_scaling' must be an object or null",
                            path);
    Status s;
    cfg->rope_theta = 10000.0f;
    if (params && get(params, "rope_theta"))
        s = get_pos_float(params, path, "rope_theta", "rope_parameters.rope_theta", 1, 0,
                          &cfg->rope_theta);
    else
        s = get_pos_float(root, path, "rope_theta", "rope_theta", 0, 10000.0f, &cfg->rope_theta);
    if (s != PL_OK)
        return s;

    json_t *sc = scaling ? scaling : params;
    const char *sc_name = scaling ? "rope_scaling" : "rope_parameters";
    cfg->rope_llama3_factor = 0;
    cfg->rope_low_freq_factor = 0;
    cfg->rope_high_freq_factor = 0;
    cfg->rope_original_max_position = 0;
    if (!sc)
        return PL_OK;
    json_t *jt = get(sc, "rope_type");
    if (!jt)
        jt = get(sc, "type");
    if (jt && !json_is_string(jt))
        return pl_error_set(PL_ERR_FORMAT, "%s: key '%s.rope_type' must be a string", path,
                            sc_name);
    const char *type = jt ? json_string_value(jt) : "default";
    /* Partial rotary embedding is not something these architectures do. */
    json_t *prf = get(sc, "partial_rotary_factor");
    if (prf && (!json_is_number(prf) || json_number_value(prf) != 1.0))
        return pl_error_set(PL_ERR_UNSUPPORTED,
                            "%s: key '%s.partial_rotary_factor' other than 1 is not supported",
                            path, sc_name);
    if (strcmp(type, "default") == 0)
        return PL_OK;
    if (strcmp(type, "llama3") != 0)
        return pl_error_set(PL_ERR_UNSUPPORTED,
                            "%s: %s type '%s' is not supported (supported: default, llama3)", path,
                            sc_name, type);
    char what[96];
    snprintf(what, sizeof what, "%s.factor", sc_name);
    if ((s = get_pos_float(sc, path, "factor", what, 1, 0, &cfg->rope_llama3_factor)) != PL_OK)
        return s;
    snprintf(what, sizeof what, "%s.low_freq_factor", sc_name);
    if ((s = get_pos_float(sc, path, "low_freq_factor", what, 1, 0, &cfg->rope_low_freq_factor)) !=
        PL_OK)
        return s;
    snprintf(what, sizeof what, "%s.high_freq_factor", sc_name);
    if ((s = get_pos_float(sc, path, "high_freq_factor", what, 1, 0,
                           &cfg->rope_high_freq_factor)) != PL_OK)
        return s;
    if (cfg->rope_high_freq_factor <= cfg->rope_low_freq_factor)
        return pl_error_set(PL_ERR_FORMAT,
                            "%s: key '%s.high_freq_factor' (%g) must be larger than "
                            "low_freq_factor (%g)",
                            path, sc_name, cfg->rope_high_freq_factor, cfg->rope_low_freq_factor);
    json_t *om = get(sc, "original_max_position_embeddings");
    if (!om)
        return pl_error_set(PL_ERR_FORMAT, "%s: missing key '%s.original_max_position_embeddings'",
                            path, sc_name);
    if (!json_is_integer(om) || json_integer_value(om) <= 0 || json_integer_value(om) > INT_MAX)
        return pl_error_set(PL_ERR_FORMAT,
                            "%s: key '%s.original_max_position_embeddings' must be a positive "
                            "integer",
                            path, sc_name);
    cfg->rope_original_max_position = (int)json_integer_value(om);
    return PL_OK;
}

static Status parse_dtype(json_t *root, const char *path, ModelConfig *cfg) {
    const char *key = "dtype"; /* transformers 5 */
    json_t *v = get(root, key);
    if (!v) {
        key = "torch_dtype";
        v = get(root, key);
    }
    cfg->torch_dtype = DT_F32;
    if (!v)
        return PL_OK;
    if (!json_is_string(v))
        return pl_error_set(PL_ERR_FORMAT, "%s: key '%s' must be a string", path, key);
    const char *name = json_string_value(v);
    if (strncmp(name, "torch.", 6) == 0)
        name += 6;
    if (strcmp(name, "float32") == 0)
        cfg->torch_dtype = DT_F32;
    else if (strcmp(name, "float16") == 0)
        cfg->torch_dtype = DT_F16;
    else if (strcmp(name, "bfloat16") == 0)
        cfg->torch_dtype = DT_BF16;
    else
        return pl_error_set(PL_ERR_UNSUPPORTED,
                            "%s: key '%s' is '%s' (supported: float32, float16, bfloat16)", path,
                            key, json_string_value(v));
    return PL_OK;
}

/* Sliding-window attention is not implemented; attention over a context no longer than the
 * window is the same computation, so the usable context is capped at the window. */
static Status apply_sliding_window(json_t *root, const char *path, ModelConfig *cfg) {
    int use = 1;
    Status s;
    if (strncmp(cfg->architecture, "Qwen", 4) == 0) { /* Qwen2, Qwen3, Qwen3-MoE */
        if ((s = get_bool(root, path, "use_sliding_window", 0, &use)) != PL_OK)
            return s;
        int max_window_layers = 0;
        if (use &&
            (s = get_int(root, path, "max_window_layers", 0, 0, 0, &max_window_layers)) != PL_OK)
            return s;
        if (max_window_layers >= cfg->num_layers)
            use = 0; /* only layers >= max_window_layers slide */
    }
    if (!use)
        return PL_OK;
    int window = 0;
    if ((s = get_int(root, path, "sliding_window", 0, 0, 1, &window)) != PL_OK)
        return s;
    if (window > 0 && window < cfg->max_position_embeddings)
        cfg->max_position_embeddings = window;
    return PL_OK;
}

/* Mixture-of-experts keys: Mixtral's num_local_experts (every layer sparse, always
 * renormalized) or Qwen3-MoE's num_experts, norm_topk_prob, decoder_sparse_step and
 * mlp_only_layers. transformers 5 writes Qwen3-MoE's expert count as num_local_experts too
 * (Hub configs say num_experts): either is taken, num_experts first. */
static Status parse_moe(json_t *root, const char *path, ModelConfig *cfg) {
    int mixtral = strcmp(cfg->architecture, "MixtralForCausalLM") == 0;
    if (!mixtral && strcmp(cfg->architecture, "Qwen3MoeForCausalLM") != 0)
        return PL_OK;
    Status s;
    cfg->decoder_sparse_step = 1;
    const char *count = mixtral ? "num_local_experts" : "num_experts";
    if (!get(root, count))
        count = mixtral ? "num_experts" : "num_local_experts";
    if (!get(root, count))
        return pl_error_set(PL_ERR_FORMAT, "%s: missing key '%s'", path,
                            mixtral ? "num_local_experts" : "num_experts");
    if (mixtral) {
        cfg->moe_intermediate_size = cfg->intermediate_size;
        cfg->norm_topk_prob = 1;
        s = get_int(root, path, count, 1, 0, 1, &cfg->num_experts);
    } else if (!(s = get_int(root, path, count, 1, 0, 1, &cfg->num_experts)) &&
               !(s = get_int(root, path, "moe_intermediate_size", 1, 0, 1,
                             &cfg->moe_intermediate_size)) &&
               !(s = get_bool(root, path, "norm_topk_prob", 0, &cfg->norm_topk_prob))) {
        s = get_int(root, path, "decoder_sparse_step", 0, 1, 1, &cfg->decoder_sparse_step);
    }
    if (s || (s = get_int(root, path, "num_experts_per_tok", 1, 0, 1, &cfg->num_experts_per_tok)))
        return s;
    if (cfg->num_experts_per_tok > cfg->num_experts)
        return pl_error_set(PL_ERR_FORMAT,
                            "%s: key 'num_experts_per_tok' (%d) is more than the %d experts", path,
                            cfg->num_experts_per_tok, cfg->num_experts);
    json_t *only = mixtral ? NULL : get(root, "mlp_only_layers");
    if (only && !json_is_array(only))
        return pl_error_set(PL_ERR_FORMAT, "%s: key 'mlp_only_layers' must be a list of layers",
                            path);
    if (only && json_array_size(only) > MODEL_MAX_MLP_ONLY)
        return pl_error_set(PL_ERR_UNSUPPORTED,
                            "%s: key 'mlp_only_layers' lists %zu layers (at most %d supported)",
                            path, json_array_size(only), MODEL_MAX_MLP_ONLY);
    for (size_t i = 0; only && i < json_array_size(only); i++) {
        json_t *v = json_array_get(only, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= cfg->num_layers)
            return pl_error_set(PL_ERR_FORMAT,
                                "%s: key 'mlp_only_layers' must list layers in [0, %d)", path,
                                cfg->num_layers);
        cfg->mlp_only_layers[cfg->num_mlp_only++] = (int)json_integer_value(v);
    }
    return PL_OK;
}

int model_layer_is_moe(const ModelConfig *c, int layer) {
    if (c->num_experts <= 0 ||
        (layer + 1) % (c->decoder_sparse_step > 0 ? c->decoder_sparse_step : 1) != 0)
        return 0;
    for (int i = 0; i < c->num_mlp_only; i++)
        if (c->mlp_only_layers[i] == layer)
            return 0;
    return 1;
}

Status model_config_parse(const char *json_text, const char *path, ModelConfig *cfg) {
    memset(cfg, 0, sizeof *cfg);
    json_error_t jerr;
    json_t *root = json_loads(json_text, 0, &jerr);
    if (!root)
        return pl_error_set(PL_ERR_FORMAT, "%s: invalid JSON: %s (line %d, column %d)", path,
                            jerr.text, jerr.line, jerr.column);
    Status s = PL_OK;
    if (!json_is_object(root)) {
        s = pl_error_set(PL_ERR_FORMAT, "%s: not a JSON object", path);
        goto done;
    }

    /* Architecture. */
    const char *arch = NULL;
    json_t *archs = get(root, "architectures");
    if (archs) {
        if (!json_is_array(archs) || json_array_size(archs) < 1 ||
            !json_is_string(json_array_get(archs, 0))) {
            s = pl_error_set(PL_ERR_FORMAT, "%s: key 'architectures' must be a list of strings",
                             path);
            goto done;
        }
        arch = json_string_value(json_array_get(archs, 0));
    } else {
        arch = arch_from_model_type(json_string_value(get(root, "model_type")));
        if (!arch) {
            s = pl_error_set(PL_ERR_FORMAT, "%s: missing key 'architectures'", path);
            goto done;
        }
    }
    int known = 0;
    for (int i = 0; i < NUM_ARCHS; i++)
        known |= strcmp(arch, supported_archs[i].arch) == 0;
    if (!known) {
        s = pl_error_set(PL_ERR_UNSUPPORTED,
                         "%s: unsupported architecture '%s' (supported: " SUPPORTED_LIST ")", path,
                         arch);
        goto done;
    }
    snprintf(cfg->architecture, sizeof cfg->architecture, "%s", arch);
    int is_qwen2 = strcmp(arch, "Qwen2ForCausalLM") == 0;
    cfg->qk_norm =
        strcmp(arch, "Qwen3ForCausalLM") == 0 || strcmp(arch, "Qwen3MoeForCausalLM") == 0;

    /* Sizes. */
    if ((s = get_int(root, path, "hidden_size", 1, 0, 1, &cfg->hidden_size)) ||
        (s = get_int(root, path, "intermediate_size", 1, 0, 1, &cfg->intermediate_size)) ||
        (s = get_int(root, path, "num_hidden_layers", 1, 0, 1, &cfg->num_layers)) ||
        (s = get_int(root, path, "num_attention_heads", 1, 0, 1, &cfg->num_heads)) ||
        (s = get_int(root, path, "vocab_size", 1, 0, 1, &cfg->vocab_size)) ||
        (s = get_int(root, path, "num_key_value_heads", 0, cfg->num_heads, 1,
                     &cfg->num_kv_heads)) ||
        (s = get_int(root, path, "max_position_embeddings", 0, 2048, 1,
                     &cfg->max_position_embeddings)))
        goto done;
    if (get(root, "head_dim")) {
        if ((s = get_int(root, path, "head_dim", 1, 0, 1, &cfg->head_dim)))
            goto done;
    } else {
        if (cfg->hidden_size % cfg->num_heads != 0) {
            s = pl_error_set(PL_ERR_FORMAT,
                             "%s: key 'hidden_size' (%d) must be divisible by "
                             "num_attention_heads (%d) when head_dim is not given",
                             path, cfg->hidden_size, cfg->num_heads);
            goto done;
        }
        cfg->head_dim = cfg->hidden_size / cfg->num_heads;
    }
    if (cfg->num_heads % cfg->num_kv_heads != 0) {
        s = pl_error_set(PL_ERR_FORMAT,
                         "%s: key 'num_key_value_heads' (%d) must divide num_attention_heads (%d)",
                         path, cfg->num_kv_heads, cfg->num_heads);
        goto done;
    }
    if (cfg->head_dim % 2 != 0) {
        s = pl_error_set(PL_ERR_FORMAT, "%s: key 'head_dim' (%d) must be even (RoPE pairs)", path,
                         cfg->head_dim);
        goto done;
    }
    if ((long long)cfg->num_heads * cfg->head_dim > INT_MAX) {
        s = pl_error_set(PL_ERR_FORMAT, "%s: key 'head_dim' (%d) is too large", path,
                         cfg->head_dim);
        goto done;
    }

    /* Norm, RoPE, dtype. */
    if ((s = get_pos_float(root, path, "rms_norm_eps", "rms_norm_eps", 0, 1e-6f,
                           &cfg->rms_norm_eps)) ||
        (s = parse_rope(root, path, cfg)) || (s = parse_dtype(root, path, cfg)))
        goto done;

    /* Structure flags. */
    json_t *act = get(root, "hidden_act");
    if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0)) {
        s = pl_error_set(PL_ERR_UNSUPPORTED, "%s: key 'hidden_act' must be \"silu\"", path);
        goto done;
    }
    int mlp_bias = 0, attn_bias = 0;
    if ((s = get_bool(root, path, "tie_word_embeddings", 0, &cfg->tie_word_embeddings)) ||
        (s = get_bool(root, path, "attention_bias", 0, &attn_bias)) ||
        (s = get_bool(root, path, "mlp_bias", 0, &mlp_bias)))
        goto done;
    if (mlp_bias) {
        s = pl_error_set(PL_ERR_UNSUPPORTED, "%s: key 'mlp_bias' true is not supported", path);
        goto done;
    }
    cfg->qkv_bias = is_qwen2 || attn_bias;
    if ((s = apply_sliding_window(root, path, cfg)) || (s = parse_moe(root, path, cfg)))
        goto done;
    /* fp8 checkpoints (older compressed-tensors files call it compression_config) */
    json_t *qc = get(root, "quantization_config");
    if ((s = quant_config_parse(qc ? qc : get(root, "compression_config"), path, &cfg->quant)))
        goto done;

    /* Special tokens. */
    if ((s = parse_bos(get(root, "bos_token_id"), path, cfg)) ||
        (s = parse_eos(get(root, "eos_token_id"), path, cfg)))
        goto done;

done:
    json_decref(root);
    return s;
}

Status model_config_load(const char *dir, ModelConfig *cfg) {
    size_t dl = strlen(dir);
    char *path = pl_xmalloc(dl + 32);
    snprintf(path, dl + 32, "%s/config.json", dir);
    char *text = NULL;
    Status s = pl_read_file(path, &text, NULL);
    if (s != PL_OK)
        goto done;
    s = model_config_parse(text, path, cfg);
    free(text);
    text = NULL;
    if (s != PL_OK)
        goto done;

    /* generation_config.json's special tokens override config.json's. */
    snprintf(path, dl + 32, "%s/generation_config.json", dir);
    if (access(path, F_OK) != 0)
        goto done;
    if ((s = pl_read_file(path, &text, NULL)) != PL_OK)
        goto done;
    json_error_t jerr;
    json_t *gen = json_loads(text, 0, &jerr);
    if (!gen || !json_is_object(gen)) {
        s = pl_error_set(PL_ERR_FORMAT, "%s: invalid JSON: %s (line %d)", path,
                         gen ? "not an object" : jerr.text, gen ? 1 : jerr.line);
        json_decref(gen);
        goto done;
    }
    /* An explicit null keeps config.json's value rather than dropping the stop token. */
    json_t *eos = get(gen, "eos_token_id"), *bos = get(gen, "bos_token_id");
    if (eos)
        s = parse_eos(eos, path, cfg);
    if (s == PL_OK && bos)
        s = parse_bos(bos, path, cfg);
    json_decref(gen);
done:
    free(text);
    free(path);
    return s;
}
