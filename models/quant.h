/* quant.h - (internal to models/) fp8 weights: config.json's quantization_config, the
 * modules it keeps unquantized, and per-output-channel e4m3 quantization on the host. */
#ifndef PAGELLM_MODELS_QUANT_H
#define PAGELLM_MODELS_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "kernels.h"
#include "model.h"

/* Parse quantization_config (a jansson json_t *, passed as void * so that this header needs
 * no jansson) into q. Anything pagellm cannot run (another method, an int or e5m2 scheme,
 * group or block strategies of compressed-tensors, weight-only or static per-token
 * activations, non-square blocks) is one PL_ERR_UNSUPPORTED error naming the key and value,
 * e.g. "config.json: key 'quantization_config.quant_method' is 'awq' (supported: ...)". */
Status quant_config_parse(void *quantization_config, const char *path, ModelQuant *q);

/* The entry of q's ignore list (modules_to_not_convert, ignore) that keeps `module`
 * ("model.layers.0.mlp.down_proj") unquantized, or NULL. compressed-tensors entries match the
 * whole name, or with "re:" a regex from the name's start; fp8 entries match any part of it
 * (transformers' rule). */
const char *quant_ignored(const ModelQuant *q, const char *module);

/* Quantize rows x cols elements of src (F32, F16 or BF16, row-major) per row: scale[r] =
 * max(amax_r / 448, PL_F8E4M3_MIN_SCALE) and q = e4m3(w * (1 / scale[r])) (vLLM's dynamic fp8
 * weight quantization). Runs on several threads for large tensors. */
void quant_fp8_rows(uint8_t *q, float *scale, const void *src, DType dt, size_t rows, size_t cols);

/* The fp32 scales behind an fp8 weight of t's shape and t->fp8.kind (0 for others). */
size_t quant_scale_count(const Tensor *t);

/* The weights' format in words (model_weight_format). */
void quant_describe(const ModelQuant *q, int any_fp8, char *buf, size_t size);

#endif
