/* config.c - parse a Hugging Face config.json (+ generation_config.json) into ModelConfig.
 *
 * Accepts what transformers 4.x and 5.x write for LlamaForCausalLM, MistralForCausalLM,
 * Qwen2ForCausalLM, Qwen3ForCausalLM, MixtralForCausalLM, Qwen3MoeForCausalLM,
 * Gemma2ForCausalLM, Gemma3ForCausalLM and Phi3ForCausalLM: `torch_dtype` or (5.x) `dtype`;
 * `rope_theta` + `rope_scaling` or (5.x) `rope_parameters` holding both (Gemma 3: one per layer
 * kind, or 4.x's rope_local_base_freq); RoPE types default, linear, dynamic, yarn, longrope
 * (su) and llama3. Every error is one line naming the file and the key. */
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
    {"Gemma2ForCausalLM", "gemma2"},   {"Gemma3ForCausalLM", "gemma3_text"},
    {"Phi3ForCausalLM", "phi3"},
};
enum { NUM_ARCHS = sizeof supported_archs / sizeof supported_archs[0] };
#define SUPPORTED_LIST                                                                             \
    "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "                   \
    "MixtralForCausalLM, Qwen3MoeForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, "              \
    "Phi3ForCausalLM"

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

/* A number key of obj that may be absent (dflt), else finite; `what` names it in errors. */
static Status get_number(json_t *obj, const char *path, const char *key, const char *what,
                         float dflt, float *out) {
    json_t *v = get(obj, key);
    *out = dflt;
    if (!v)
        return PL_OK;
    if (!json_is_number(v) || !isfinite((float)json_number_value(v)))
        return pl_error_set(PL_ERR_FORMAT, "%s: key '%s' must be a number", path, what);
    *out = (float)json_number_value(v);
    return PL_OK;
}

/* LongRoPE's short_factor or long_factor: a list of rot_dim / 2 positive numbers. */
static Status get_factors(json_t *sc, const char *path, const char *sc_name, const char *key, int n,
                          float *out) {
    json_t *v = get(sc, key);
    if (!v || !json_is_array(v) || (int)json_array_size(v) != n)
        return pl_error_set(PL_ERR_FORMAT, "%s: key '%s.%s' must be a list of %d numbers", path,
                            sc_name, key, n);
    for (int i = 0; i < n; i++) {
        json_t *e = json_array_get(v, (size_t)i);
        if (!json_is_number(e) || !(json_number_value(e) > 0))
            return pl_error_set(PL_ERR_FORMAT, "%s: key '%s.%s' must hold positive numbers", path,
                                sc_name, key);
        out[i] = (float)json_number_value(e);
    }
    return PL_OK;
}

/* One RoPE scaling object `sc` (rope_scaling, rope_parameters or one layer kind's entry) into
 * out. Phi-3 spells LongRoPE "su" (and, as transformers maps it, "yarn"). */
static Status parse_scaling(json_t *root, json_t *sc, const char *sc_name, const char *path,
                            ModelConfig *cfg, RopeScaling *out) {
    memset(out, 0, sizeof *out);
    out->max_position = cfg->max_position_embeddings;
    out->truncate = 1;
    json_t *jt = get(sc, "rope_type");
    if (!jt)
        jt = get(sc, "type");
    if (jt && !json_is_string(jt))
        return pl_error_set(PL_ERR_FORMAT, "%s: key '%s.rope_type' must be a string", path,
                            sc_name);
    const char *type = jt ? json_string_value(jt) : "default";
    const int phi3 = strcmp(cfg->architecture, "Phi3ForCausalLM") == 0;
    static const struct {
        const char *name;
        RopeType type;
    } types[] = {{"default", ROPE_DEFAULT}, {"linear", ROPE_LINEAR},     {"dynamic", ROPE_DYNAMIC},
                 {"yarn", ROPE_YARN},       {"longrope", ROPE_LONGROPE}, {"su", ROPE_LONGROPE},
                 {"llama3", ROPE_LLAMA3}};
    int found = 0;
    for (size_t i = 0; i < sizeof types / sizeof *types; i++)
        if (strcmp(type, types[i].name) == 0) {
            out->type = types[i].type;
            found = 1;
        }
    if (!found)
        return pl_error_set(PL_ERR_UNSUPPORTED,
                            "%s: %s type '%s' is not supported (supported: default, linear, "
                            "dynamic, yarn, longrope, su, llama3)",
                            path, sc_name, type);
    if (phi3 && out->type == ROPE_YARN)
        out->type = ROPE_LONGROPE;
    if (out->type == ROPE_DEFAULT)
        return PL_OK;
    char what[128];
    Status s;
    const int need_factor = out->type != ROPE_YARN && out->type != ROPE_LONGROPE;
    snprintf(what, sizeof what, "%s.factor", sc_name);
    if ((s = get_pos_float(sc, path, "factor", what, need_factor, 0, &out->factor)))
        return s;
    /* the pre-extension length: rope_scaling's, else (Phi-3, which keeps it outside, first)
     * config.json's original_max_position_embeddings, else max_position_embeddings */
    json_t *om = get(sc, "original_max_position_embeddings");
    if (phi3 && get(root, "original_max_position_embeddings"))
        om = get(root, "original_max_position_embeddings");
    if (!om && out->type == ROPE_LLAMA3)
        return pl_error_set(PL_ERR_FORMAT, "%s: missing key '%s.original_max_position_embeddings'",
                            path, sc_name);
    if (!om)
        om = get(root, "original_max_position_embeddings");
    out->original_max_position = cfg->max_position_embeddings;
    if (om) {
        if (!json_is_integer(om) || json_integer_value(om) <= 0 || json_integer_value(om) > INT_MAX)
            return pl_error_set(PL_ERR_FORMAT,
                                "%s: key '%s.original_max_position_embeddings' must be a positive "
                                "integer",
                                path, sc_name);
        out->original_max_position = (int)json_integer_value(om);
    }
    switch (out->type) {
        case ROPE_LLAMA3:
            snprintf(what, sizeof what, "%s.low_freq_factor", sc_name);
            if ((s = get_pos_float(sc, path, "low_freq_factor", what, 1, 0, &out->low_freq_factor)))
                return s;
            snprintf(what, sizeof what, "%s.high_freq_factor", sc_name);
            if ((s = get_pos_float(sc, path, "high_freq_factor", what, 1, 0,
                                   &out->high_freq_factor)))
                return s;
            if (out->high_freq_factor <= out->low_freq_factor)
                return pl_error_set(PL_ERR_FORMAT,
                                    "%s: key '%s.high_freq_factor' (%g) must be larger than "
                                    "low_freq_factor (%g)",
                                    path, sc_name, out->high_freq_factor, out->low_freq_factor);
            break;
        case ROPE_YARN: {
            static const char *keys[] = {"beta_fast", "beta_slow", "mscale", "mscale_all_dim",
                                         "attention_factor"};
            float *dst[] = {&out->beta_fast, &out->beta_slow, &out->mscale, &out->mscale_all_dim,
                            &out->attention_factor};
            for (int i = 0; i < 5; i++) {
                snprintf(what, sizeof what, "%s.%s", sc_name, keys[i]);
                if ((s = get_number(sc, path, keys[i], what, 0, dst[i])))
                    return s;
            }
            snprintf(what, sizeof what, "%s.truncate", sc_name);
            if ((s = get_bool(sc, path, "truncate", 1, &out->truncate)))
                return pl_error_set(PL_ERR_FORMAT, "%s: key '%s' must be true or false", path,
                                    what);
            break;
        }
        case ROPE_LONGROPE:
            snprintf(what, sizeof what, "%s.attention_factor", sc_name);
            out->num_factors = cfg->rotary_dim / 2;
            if ((s = get_number(sc, path, "attention_factor", what, 0, &out->attention_factor)) ||
                (s = get_factors(sc, path, sc_name, "short_factor", out->num_factors,
                                 out->short_factor)) ||
                (s = get_factors(sc, path, sc_name, "long_factor", out->num_factors,
                                 out->long_factor)))
                return s;
            break;
        default:
            break;
    }
    return PL_OK;
}

/* partial_rotary_factor (rope_parameters' in 5.x, config.json's in 4.x): Phi-3 / Phi-4 only. */
static Status parse_partial_rotary(json_t *root, json_t *sc, const char *sc_name, const char *path,
                                   ModelConfig *cfg) {
    cfg->rotary_dim = cfg->head_dim;
    json_t *prf = sc ? get(sc, "partial_rotary_factor") : NULL;
    const char *where = sc_name;
    if (!prf) {
        prf = get(root, "partial_rotary_factor");
        where = NULL;
    }
    if (!prf)
        return PL_OK;
    char key[96];
    snprintf(key, sizeof key, "%s%spartial_rotary_factor", where ? where : "", where ? "." : "");
    if (!json_is_number(prf) || !(json_number_value(prf) > 0) || json_number_value(prf) > 1)
        return pl_error_set(PL_ERR_FORMAT, "%s: key '%s' must be a number in (0, 1]", path, key);
    double f = json_number_value(prf);
    if (f != 1.0 && strcmp(cfg->architecture, "Phi3ForCausalLM") != 0)
        return pl_error_set(PL_ERR_UNSUPPORTED, "%s: key '%s' other than 1 is not supported for %s",
                            path, key, cfg->architecture);
    cfg->rotary_dim = (int)(cfg->head_dim * f); /* as transformers: int(head_dim * factor) */
    if (cfg->rotary_dim < 2 || cfg->rotary_dim % 2)
        return pl_error_set(PL_ERR_FORMAT, "%s: key '%s' (%g) leaves %d rotary dims, not even",
                            path, key, f, cfg->rotary_dim);
    return PL_OK;
}

/* RoPE: theta and scaling, from the 4.x keys (rope_theta, rope_scaling) or the 5.x
 * `rope_parameters` object. As transformers does, rope_scaling wins over rope_parameters, and
 * a theta inside rope_parameters over the top-level one. Gemma 3's rope_parameters hold one
 * object per layer kind (full_attention: rope_theta and scaling; sliding_attention: the local
 * theta, unscaled); 4.x Gemma 3 configs give rope_local_base_freq instead. */
static Status parse_rope(json_t *root, const char *path, ModelConfig *cfg) {
    json_t *params = get(root, "rope_parameters");
    json_t *scaling = get(root, "rope_scaling");
    if (params && !json_is_object(params))
        return pl_error_set(PL_ERR_FORMAT, "%s: key 'rope_parameters' must be an object", path);
    if (scaling && !json_is_object(scaling))
        return pl_error_set(PL_ERR_FORMAT, "%s: key 'rope_scaling' must be an object or null",
                            path);
    const int gemma3 = strcmp(cfg->architecture, "Gemma3ForCausalLM") == 0;
    const char *params_name = "rope_parameters";
    Status s;
    json_t *local = params ? get(params, "sliding_attention") : NULL;
    json_t *full = params ? get(params, "full_attention") : NULL;
    if ((local || full) && !gemma3)
        return pl_error_set(PL_ERR_UNSUPPORTED,
                            "%s: key 'rope_parameters' per layer kind is not supported for %s",
                            path, cfg->architecture);
    if (full) {
        if (!json_is_object(full) || (local && !json_is_object(local)))
            return pl_error_set(PL_ERR_FORMAT,
                                "%s: keys 'rope_parameters.full_attention' and "
                                "'.sliding_attention' must be objects",
                                path);
        params = full;
        params_name = "rope_parameters.full_attention";
    }
    const float dflt_theta = gemma3 ? 1000000.0f : 10000.0f;
    char what[96];
    snprintf(what, sizeof what, "%s.rope_theta", params_name);
    if (params && get(params, "rope_theta"))
        s = get_pos_float(params, path, "rope_theta", what, 1, 0, &cfg->rope_theta);
    else
        s = get_pos_float(root, path, "rope_theta", "rope_theta", 0, dflt_theta, &cfg->rope_theta);
    if (s != PL_OK)
        return s;
    if (gemma3) { /* the sliding layers' theta, unscaled */
        if (local) {
            json_t *lt = get(local, "rope_type");
            if (lt && (!json_is_string(lt) || strcmp(json_string_value(lt), "default") != 0))
                return pl_error_set(PL_ERR_UNSUPPORTED,
                                    "%s: key 'rope_parameters.sliding_attention.rope_type' must "
                                    "be \"default\"",
                                    path);
            s = get_pos_float(local, path, "rope_theta",
                              "rope_parameters.sliding_attention."
                              "rope_theta",
                              0, 10000.0f, &cfg->rope_local_theta);
        } else {
            s = get_pos_float(root, path, "rope_local_base_freq", "rope_local_base_freq", 0,
                              10000.0f, &cfg->rope_local_theta);
        }
        if (s != PL_OK)
            return s;
    }

    json_t *sc = scaling ? scaling : params;
    const char *sc_name = scaling ? "rope_scaling" : params_name;
    if ((s = parse_partial_rotary(root, params ? params : scaling,
                                  params ? params_name : "rope_scaling", path, cfg)))
        return s;
    cfg->rope_llama3_factor = 0;
    cfg->rope_low_freq_factor = 0;
    cfg->rope_high_freq_factor = 0;
    cfg->rope_original_max_position = 0;
    if (!sc)
        return PL_OK;
    if ((s = parse_scaling(root, sc, sc_name, path, cfg, &cfg->rope_scaling)))
        return s;
    if (cfg->rope_scaling.type == ROPE_LLAMA3) {
        cfg->rope_llama3_factor = cfg->rope_scaling.factor;
        cfg->rope_low_freq_factor = cfg->rope_scaling.low_freq_factor;
        cfg->rope_high_freq_factor = cfg->rope_scaling.high_freq_factor;
        cfg->rope_original_max_position = cfg->rope_scaling.original_max_position;
    }
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

/* Which layers slide, from layer_types (transformers 5 writes it for the families that have
 * it): *found = 1 when the key is there. Refuses more layers than layer_sliding lists, which
 * the callers fill otherwise. */
static Status parse_layer_types(json_t *root, const char *path, ModelConfig *cfg, int *found) {
    if (cfg->num_layers > MODEL_MAX_LAYERS)
        return pl_error_set(PL_ERR_UNSUPPORTED, "%s: %d layers (at most %d supported)", path,
                            cfg->num_layers, MODEL_MAX_LAYERS);
    json_t *types = get(root, "layer_types");
    *found = types != NULL;
    if (!types)
        return PL_OK;
    if (!json_is_array(types) || (int)json_array_size(types) != cfg->num_layers)
        return pl_error_set(PL_ERR_FORMAT,
                            "%s: key 'layer_types' must list num_hidden_layers (%d) kinds", path,
                            cfg->num_layers);
    for (int l = 0; l < cfg->num_layers; l++) {
        const char *k = json_string_value(json_array_get(types, (size_t)l));
        if (!k || (strcmp(k, "sliding_attention") && strcmp(k, "full_attention")))
            return pl_error_set(PL_ERR_UNSUPPORTED,
                                "%s: key 'layer_types' entry %d must be \"sliding_attention\" "
                                "or \"full_attention\"",
                                path, l);
        cfg->layer_sliding[l] = strcmp(k, "sliding_attention") == 0;
    }
    return PL_OK;
}

/* Mistral, Mixtral, Phi-3 and the Qwens (not Gemma: parse_gemma) as transformers reads them:
 * sliding_window (absent or null: none) on the layers layer_types marks, else on every layer;
 * the Qwens only with use_sliding_window, and without layer_types on the layers from
 * max_window_layers on (transformers' default 28, 48 for Qwen3-MoE). Each sliding layer
 * attends to its last sliding_window positions at any context length. */
static Status apply_sliding_window(json_t *root, const char *path, ModelConfig *cfg) {
    int use = 1, window = 0, found = 0;
    Status s;
    const int qwen = strncmp(cfg->architecture, "Qwen", 4) == 0; /* Qwen2, Qwen3, Qwen3-MoE */
    if (qwen && (s = get_bool(root, path, "use_sliding_window", 0, &use)) != PL_OK)
        return s;
    if (!use)
        return PL_OK;
    if ((s = get_int(root, path, "sliding_window", 0, 0, 0, &window)) != PL_OK || window == 0)
        return s;
    cfg->sliding_window = window;
    if ((s = parse_layer_types(root, path, cfg, &found)) != PL_OK || found)
        return s;
    int first = 0;
    if (qwen && (s = get_int(root, path, "max_window_layers", 0,
                             strcmp(cfg->architecture, "Qwen3MoeForCausalLM") ? 28 : 48, 0,
                             &first)) != PL_OK)
        return s;
    for (int l = 0; l < cfg->num_layers; l++)
        cfg->layer_sliding[l] = l >= first;
    return PL_OK;
}

/* Gemma 2 / 3: the MLP activation, attention scale and soft-capping, and which layers slide
 * (layer_types; else Gemma 2's every other layer from the first, Gemma 3's
 * sliding_window_pattern: all but every pattern-th). The window applies per layer: the context
 * is not capped. */
static Status parse_gemma(json_t *root, const char *path, ModelConfig *cfg) {
    const int gemma3 = strcmp(cfg->architecture, "Gemma3ForCausalLM") == 0;
    Status s;
    const char *act_key = get(root, "hidden_activation") ? "hidden_activation" : "hidden_act";
    json_t *act = get(root, act_key);
    if (act && (!json_is_string(act) || strcmp(json_string_value(act), "gelu_pytorch_tanh") != 0))
        return pl_error_set(PL_ERR_UNSUPPORTED, "%s: key '%s' must be \"gelu_pytorch_tanh\"", path,
                            act_key);
    cfg->gelu = 1;
    int bidirectional = 0;
    if ((s = get_bool(root, path, "use_bidirectional_attention", 0, &bidirectional)))
        return s;
    if (bidirectional)
        return pl_error_set(PL_ERR_UNSUPPORTED,
                            "%s: key 'use_bidirectional_attention' true is not supported", path);
    if ((s = get_pos_float(root, path, "query_pre_attn_scalar", "query_pre_attn_scalar", 0, 256.0f,
                           &cfg->query_pre_attn_scalar)) ||
        (s = get_pos_float(
             root, path, "attn_logit_softcapping", "attn_logit_softcapping", 0,
             gemma3 || json_is_null(json_object_get(root, "attn_logit_softcapping")) ? 0.0f : 50.0f,
             &cfg->attn_softcap)) ||
        (s = get_pos_float(root, path, "final_logit_softcapping", "final_logit_softcapping", 0,
                           gemma3 || json_is_null(json_object_get(root, "final_logit_softcapping"))
                               ? 0.0f
                               : 30.0f,
                           &cfg->final_softcap)))
        return s;
    /* sliding_window: absent gives transformers' default (4096), null none */
    json_t *sw = json_object_get(root, "sliding_window");
    if (json_is_null(sw))
        cfg->sliding_window = 0;
    else if ((s = get_int(root, path, "sliding_window", 0, 4096, 1, &cfg->sliding_window)))
        return s;
    int found = 0;
    if ((s = parse_layer_types(root, path, cfg, &found)))
        return s;
    if (!found) {
        int pattern = 2;
        if (gemma3 && (s = get_int(root, path, "sliding_window_pattern", 0, 6, 1, &pattern)))
            return s;
        for (int l = 0; l < cfg->num_layers; l++)
            cfg->layer_sliding[l] = (l + 1) % pattern != 0;
    }
    return PL_OK;
}

int model_layer_window(const ModelConfig *c, int layer) {
    return c->sliding_window > 0 && layer >= 0 && layer < MODEL_MAX_LAYERS &&
                   c->layer_sliding[layer]
               ? c->sliding_window
               : 0;
}

int model_kv_window(const ModelConfig *c) {
    for (int l = 0; l < c->num_layers; l++)
        if (!model_layer_window(c, l))
            return 0;
    return c->num_layers > 0 ? c->sliding_window : 0;
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
    cfg->gemma = strncmp(arch, "Gemma", 5) == 0;
    cfg->qk_norm = strcmp(arch, "Qwen3ForCausalLM") == 0 ||
                   strcmp(arch, "Qwen3MoeForCausalLM") == 0 ||
                   strcmp(arch, "Gemma3ForCausalLM") == 0;

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
    if (get(root, "head_dim") || cfg->gemma) { /* Gemma's default: 256 */
        if ((s = get_int(root, path, "head_dim", 0, 256, 1, &cfg->head_dim)))
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
    if (cfg->gemma) {
        if ((s = parse_gemma(root, path, cfg)))
            goto done;
    } else if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0)) {
        s = pl_error_set(PL_ERR_UNSUPPORTED, "%s: key 'hidden_act' must be \"silu\"", path);
        goto done;
    }
    int mlp_bias = 0, attn_bias = 0;
    if ((s = get_bool(root, path, "tie_word_embeddings", cfg->gemma, &cfg->tie_word_embeddings)) ||
        (s = get_bool(root, path, "attention_bias", 0, &attn_bias)) ||
        (s = get_bool(root, path, "mlp_bias", 0, &mlp_bias)))
        goto done;
    if (mlp_bias) {
        s = pl_error_set(PL_ERR_UNSUPPORTED, "%s: key 'mlp_bias' true is not supported", path);
        goto done;
    }
    cfg->qkv_bias = is_qwen2 || attn_bias;
    if ((!cfg->gemma && (s = apply_sliding_window(root, path, cfg))) ||
        (s = parse_moe(root, path, cfg)))
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
