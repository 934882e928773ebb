/* quant.c - fp8 weights on the loading side: what config.json's quantization_config says
 * (Hugging Face "fp8" / FineGrainedFP8 and "compressed-tensors" float 8-bit checkpoints), its
 * list of modules left unquantized, and the host quantization of a 16/32-bit weight per output
 * channel (quantization: fp8). Only schemes the matmul op computes exactly as written are
 * accepted: every other one is refused by name rather than run approximately. */
#include "quant.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define QC "quantization_config"

static json_t *get(json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    return json_is_null(v) ? NULL : v;
}

/* A string key that must be one of `allowed` (NULL-terminated) when present; *out its value
 * (NULL when absent). `where` is the key's path for messages ("quantization_config.fmt"). */
static Status get_choice(json_t *obj, const char *path, const char *where, const char *key,
                         const char *const *allowed, const char *supported, const char **out) {
    json_t *v = get(obj, key);
    *out = NULL;
    if (!v)
        return PL_OK;
    if (!json_is_string(v))
        return pl_error_set(PL_ERR_FORMAT, "%s: key '%s.%s' must be a string", path, where, key);
    for (const char *const *a = allowed; *a; a++)
        if (!strcmp(json_string_value(v), *a)) {
            *out = *a;
            return PL_OK;
        }
    return pl_error_set(PL_ERR_UNSUPPORTED, "%s: key '%s.%s' is '%s' (supported: %s)", path, where,
                        key, json_string_value(v), supported);
}

static Status add_ignore(ModelQuant *q, const char *path, const char *key, json_t *list) {
    if (!list)
        return PL_OK;
    if (!json_is_array(list))
        return pl_error_set(PL_ERR_FORMAT, "%s: key '" QC ".%s' must be a list of strings", path,
                            key);
    size_t used = 0;
    for (int i = 0; i < q->num_ignore; i++)
        used += strlen(q->ignore + used) + 1;
    size_t i;
    json_t *v;
    json_array_foreach(list, i, v) {
        if (!json_is_string(v))
            return pl_error_set(PL_ERR_FORMAT, "%s: key '" QC ".%s' must be a list of strings",
                                path, key);
        size_t len = strlen(json_string_value(v));
        if (used + len + 1 > sizeof q->ignore)
            return pl_error_set(PL_ERR_UNSUPPORTED, "%s: key '" QC ".%s' is longer than %zu bytes",
                                path, key, sizeof q->ignore);
        memcpy(q->ignore + used, json_string_value(v), len + 1);
        used += len + 1;
        q->num_ignore++;
    }
    return PL_OK;
}

/* An integer key that must equal `want` when present. */
static Status expect_int(json_t *obj, const char *path, const char *where, const char *key,
                         long long want) {
    json_t *v = get(obj, key);
    if (!v)
        return PL_OK;
    if (!json_is_integer(v) || json_integer_value(v) != want)
        return pl_error_set(PL_ERR_UNSUPPORTED, "%s: key '%s.%s' is %s (supported: %lld)", path,
                            where, key, json_is_integer(v) ? "another value" : "not an integer",
                            want);
    return PL_OK;
}

static Status expect_bool(json_t *obj, const char *path, const char *where, const char *key,
                          int want) {
    json_t *v = get(obj, key);
    if (v && (!json_is_boolean(v) || json_is_true(v) != want))
        return pl_error_set(PL_ERR_UNSUPPORTED, "%s: key '%s.%s' is %s (supported: %s)", path,
                            where, key, json_is_true(v) ? "true" : "not false",
                            want ? "true" : "false");
    return PL_OK;
}

/* {quant_method: "fp8", fmt, activation_scheme, weight_block_size, modules_to_not_convert,
 * scale_fmt (transformers 5: "float", or "ue8m0" for power-of-two E8M0 scales)} */
static Status parse_fp8(json_t *qc, const char *path, ModelQuant *q) {
    static const char *const fmts[] = {"e4m3", NULL}, *const schemes[] = {"dynamic", "static",
                                                                          NULL};
    static const char *const scale_fmts[] = {"float", NULL};
    const char *fmt, *scheme, *scale_fmt;
    Status s;
    if ((s = get_choice(qc, path, QC, "fmt", fmts, "e4m3", &fmt)) ||
        (s = get_choice(qc, path, QC, "activation_scheme", schemes, "dynamic, static", &scheme)) ||
        (s = get_choice(qc, path, QC, "scale_fmt", scale_fmts, "float", &scale_fmt)))
        return s;
    q->static_input = scheme && !strcmp(scheme, "static");
    json_t *bs = get(qc, "weight_block_size");
    if (!bs) {
        q->weight_scales = FP8_SCALE_TENSOR;
    } else {
        json_t *b0 = json_array_get(bs, 0), *b1 = json_array_get(bs, 1);
        if (!json_is_array(bs) || json_array_size(bs) != 2 || !json_is_integer(b0) ||
            !json_is_integer(b1) || json_integer_value(b0) <= 0 || json_integer_value(b0) > 4096)
            return pl_error_set(PL_ERR_FORMAT,
                                "%s: key '" QC ".weight_block_size' must be a list of two "
                                "positive integers",
                                path);
        if (json_integer_value(b0) != json_integer_value(b1))
            return pl_error_set(PL_ERR_UNSUPPORTED,
                                "%s: key '" QC ".weight_block_size' is [%lld, %lld] (supported: "
                                "square blocks, such as [128, 128])",
                                path, json_integer_value(b0), json_integer_value(b1));
        q->weight_scales = FP8_SCALE_BLOCK;
        q->block = (int)json_integer_value(b0);
        if (q->static_input)
            return pl_error_set(PL_ERR_UNSUPPORTED,
                                "%s: key '" QC ".activation_scheme' is 'static' with "
                                "weight_block_size (supported: dynamic)",
                                path);
    }
    return add_ignore(q, path, "modules_to_not_convert", get(qc, "modules_to_not_convert"));
}

/* One config group of compressed-tensors: weights {type float, num_bits 8, strategy channel |
 * tensor, symmetric}, input_activations dynamic per token or static per tensor. */
static Status parse_group(json_t *g, const char *name, const char *path, ModelQuant *q, int first) {
    char where[256];
    static const char *const types[] = {"float", NULL};
    static const char *const wstrats[] = {"channel", "tensor", NULL};
    static const char *const astrats[] = {"token", "tensor", NULL};
    const char *type, *strat;
    Status s;
    if (!json_is_object(g))
        return pl_error_set(PL_ERR_FORMAT, "%s: key '" QC ".config_groups.%s' must be an object",
                            path, name);
    json_t *w = get(g, "weights");
    snprintf(where, sizeof where, QC ".config_groups.%s.weights", name);
    if (!json_is_object(w))
        return pl_error_set(PL_ERR_UNSUPPORTED, "%s: key '%s' is missing or not an object", path,
                            where);
    if ((s = get_choice(w, path, where, "type", types, "float (fp8 e4m3)", &type)) ||
        (s = expect_int(w, path, where, "num_bits", 8)) ||
        (s = get_choice(w, path, where, "strategy", wstrats, "channel, tensor", &strat)) ||
        (s = expect_bool(w, path, where, "dynamic", 0)) ||
        (s = expect_bool(w, path, where, "symmetric", 1)))
        return s;
    if (!type || !strat || !get(w, "num_bits"))
        return pl_error_set(PL_ERR_FORMAT, "%s: key '%s' needs type, num_bits and strategy", path,
                            where);
    Fp8ScaleKind kind = !strcmp(strat, "channel") ? FP8_SCALE_CHANNEL : FP8_SCALE_TENSOR;
    json_t *a = get(g, "input_activations");
    snprintf(where, sizeof where, QC ".config_groups.%s.input_activations", name);
    if (!a)
        return pl_error_set(PL_ERR_UNSUPPORTED,
                            "%s: key '%s' is null: weight-only fp8 is not supported (pagellm "
                            "multiplies fp8 weights by fp8 activations)",
                            path, where);
    if (!json_is_object(a))
        return pl_error_set(PL_ERR_FORMAT, "%s: key '%s' must be an object", path, where);
    const char *astrat;
    if ((s = get_choice(a, path, where, "type", types, "float (fp8 e4m3)", &type)) ||
        (s = expect_int(a, path, where, "num_bits", 8)) ||
        (s = get_choice(a, path, where, "strategy", astrats, "token, tensor", &astrat)) ||
        (s = expect_bool(a, path, where, "symmetric", 1)))
        return s;
    json_t *dyn = get(a, "dynamic");
    int dynamic = dyn && json_is_true(dyn);
    if (!astrat || (dynamic != !strcmp(astrat, "token")))
        return pl_error_set(PL_ERR_UNSUPPORTED,
                            "%s: key '%s' is strategy %s with dynamic %s (supported: token with "
                            "dynamic true, tensor with dynamic false)",
                            path, where, astrat ? astrat : "(none)", dynamic ? "true" : "false");
    if (get(g, "output_activations"))
        return pl_error_set(PL_ERR_UNSUPPORTED,
                            "%s: key '" QC ".config_groups.%s.output_activations' is set "
                            "(supported: null)",
                            path, name);
    if (!first && (kind != q->weight_scales || q->static_input != !dynamic))
        return pl_error_set(PL_ERR_UNSUPPORTED,
                            "%s: key '" QC ".config_groups.%s' has another scheme than the "
                            "first group (supported: one scheme for every layer)",
                            path, name);
    q->weight_scales = kind;
    q->static_input = !dynamic;
    return PL_OK;
}

static Status parse_compressed(json_t *qc, const char *path, ModelQuant *q) {
    static const char *const formats[] = {"float-quantized", "naive-quantized", NULL};
    const char *format;
    Status s =
        get_choice(qc, path, QC, "format", formats, "float-quantized, naive-quantized", &format);
    if (s)
        return s;
    if (get(qc, "sparsity_config"))
        return pl_error_set(PL_ERR_UNSUPPORTED,
                            "%s: key '" QC ".sparsity_config' is set (supported: null)", path);
    json_t *groups = get(qc, "config_groups");
    if (!json_is_object(groups) || json_object_size(groups) == 0)
        return pl_error_set(PL_ERR_FORMAT,
                            "%s: key '" QC ".config_groups' must be an object "
                            "with at least one group",
                            path);
    const char *name;
    json_t *g;
    int first = 1;
    json_object_foreach(groups, name, g) {
        if ((s = parse_group(g, name, path, q, first)))
            return s;
        first = 0;
    }
    /* kv_cache_scheme (fp8 KV scales k_scale / v_scale) is not read: the cache stays in the
     * activation dtype unless kv-cache-dtype says otherwise. */
    return add_ignore(q, path, "ignore", get(qc, "ignore"));
}

Status quant_config_parse(void *quantization_config, const char *path, ModelQuant *q) {
    json_t *qc = quantization_config;
    memset(q, 0, sizeof *q);
    if (!qc || json_is_null(qc))
        return PL_OK;
    if (!json_is_object(qc))
        return pl_error_set(PL_ERR_FORMAT, "%s: key '" QC "' must be an object", path);
    json_t *m = get(qc, "quant_method");
    if (!json_is_string(m))
        return pl_error_set(PL_ERR_FORMAT,
                            "%s: key '" QC ".quant_method' is missing or not a "
                            "string",
                            path);
    const char *method = json_string_value(m);
    Status s;
    if (!strcmp(method, "fp8")) {
        q->method = QUANT_FP8;
        s = parse_fp8(qc, path, q);
    } else if (!strcmp(method, "compressed-tensors")) {
        q->method = QUANT_COMPRESSED;
        s = parse_compressed(qc, path, q);
    } else {
        s = pl_error_set(PL_ERR_UNSUPPORTED,
                         "%s: key '" QC ".quant_method' is '%s' (supported: fp8, "
                         "compressed-tensors with fp8 weights)",
                         path, method);
    }
    if (s != PL_OK)
        memset(q, 0, sizeof *q);
    return s;
}

/* A Python regex as POSIX extended, anchored at the start as re.match is: the escapes \d, \w
 * and \s spelt as classes. */
static int regex_matches(const char *pattern, const char *name) {
    size_t n = strlen(pattern);
    char *ere = pl_xmalloc(n * 16 + 8), *o = ere;
    o += sprintf(o, "^(");
    for (size_t i = 0; i < n; i++) {
        if (pattern[i] == '\\' && i + 1 < n && strchr("dws", pattern[i + 1])) {
            char c = pattern[++i];
            o += sprintf(o, "%s", c == 'd' ? "[0-9]" : c == 'w' ? "[A-Za-z0-9_]" : "[[:space:]]");
        } else {
            *o++ = pattern[i];
        }
    }
    sprintf(o, ")");
    regex_t re;
    int ok = regcomp(&re, ere, REG_EXTENDED | REG_NOSUB) == 0;
    int hit = ok && regexec(&re, name, 0, NULL, 0) == 0;
    if (ok)
        regfree(&re);
    free(ere);
    return hit;
}

const char *quant_ignored(const ModelQuant *q, const char *module) {
    const char *e = q->ignore;
    for (int i = 0; i < q->num_ignore; i++, e += strlen(e) + 1) {
        if (q->method == QUANT_FP8  ? strstr(module, e) != NULL
            : !strncmp(e, "re:", 3) ? regex_matches(e + 3, module)
                                    : !strcmp(e, module))
            return e;
    }
    return NULL;
}

/* ---- per-channel quantization on the host --------------------------------------------- */

typedef struct {
    uint8_t *q;
    float *scale;
    const void *src;
    DType dt;
    size_t rows, cols, r0, r1;
} QuantJob;

/* Row r of src as fp32 into row (one loop per dtype: this runs over every weight). */
static void load_row(float *row, const void *src, DType dt, size_t r, size_t cols) {
    if (dt == DT_F32) {
        memcpy(row, (const float *)src + r * cols, cols * sizeof *row);
    } else if (dt == DT_BF16) {
        const uint16_t *h = (const uint16_t *)src + r * cols;
        for (size_t c = 0; c < cols; c++) {
            uint32_t u = (uint32_t)h[c] << 16;
            memcpy(&row[c], &u, 4);
        }
    } else {
        const uint16_t *h = (const uint16_t *)src + r * cols;
        for (size_t c = 0; c < cols; c++)
            row[c] = pl_f16_to_f32(h[c]);
    }
}

static void *quant_worker(void *arg) {
    const QuantJob *j = arg;
    float *row = pl_xmalloc(j->cols * sizeof *row);
    for (size_t r = j->r0; r < j->r1; r++) {
        float amax = 0.0f;
        load_row(row, j->src, j->dt, r, j->cols);
        for (size_t c = 0; c < j->cols; c++)
            amax = fmaxf(amax, fabsf(row[c]));
        float s = fmaxf(amax / PL_F8E4M3_MAX, PL_F8E4M3_MIN_SCALE), inv = 1.0f / s;
        uint8_t *out = j->q + r * j->cols;
        for (size_t c = 0; c < j->cols; c++)
            out[c] = pl_f32_to_f8e4m3(row[c] * inv);
        j->scale[r] = s;
    }
    free(row);
    return NULL;
}

void quant_fp8_rows(uint8_t *q, float *scale, const void *src, DType dt, size_t rows, size_t cols) {
    PL_CHECK(dt == DT_F32 || dt == DT_F16 || dt == DT_BF16);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = rows * cols < (1u << 20) || cores < 2 ? 1 : cores > 64 ? 64 : (int)cores;
    if ((size_t)nt > rows)
        nt = rows ? (int)rows : 1;
    QuantJob jobs[64];
    pthread_t tids[64];
    int started[64] = {0};
    for (int t = 0; t < nt; t++) {
        jobs[t] = (QuantJob){q, scale, src, dt, rows, cols, rows * t / nt, rows * (t + 1) / nt};
        started[t] = t > 0 && pthread_create(&tids[t], NULL, quant_worker, &jobs[t]) == 0;
    }
    for (int t = 0; t < nt; t++)
        if (!started[t])
            quant_worker(&jobs[t]);
    for (int t = 1; t < nt; t++)
        if (started[t])
            pthread_join(tids[t], NULL);
}

size_t quant_scale_count(const Tensor *t) {
    if (t->dtype != DT_F8E4M3)
        return 0;
    switch (t->fp8.kind) {
        case FP8_SCALE_TENSOR:
            return 1;
        case FP8_SCALE_CHANNEL:
            return (size_t)t->shape[0];
        case FP8_SCALE_BLOCK: {
            size_t b = (size_t)t->fp8.block;
            return ((size_t)t->shape[0] + b - 1) / b * (((size_t)t->shape[1] + b - 1) / b);
        }
        default:
            return 0;
    }
}

void quant_describe(const ModelQuant *q, int any_fp8, char *buf, size_t size) {
    if (!any_fp8) {
        snprintf(buf, size, "no fp8 layers");
        return;
    }
    const char *how = q->method == QUANT_ONLINE_FP8   ? " (quantized at load)"
                      : q->method == QUANT_COMPRESSED ? " (compressed-tensors)"
                                                      : " (fp8 checkpoint)";
    const char *act = q->static_input ? "static" : "dynamic per-token";
    if (q->weight_scales == FP8_SCALE_BLOCK)
        snprintf(buf, size, "fp8 e4m3, block %dx%d scales, dynamic per-%d activation scales%s",
                 q->block, q->block, q->block, how);
    else
        snprintf(buf, size, "fp8 e4m3, per-%s scales, %s activation scales%s",
                 q->weight_scales == FP8_SCALE_TENSOR ? "tensor" : "channel", act, how);
}
