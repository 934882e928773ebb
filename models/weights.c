/* weights.c - bind a Llama-family decoder's tensors from a checkpoint, or make random ones.
 *
 * weights_bind looks every tensor up by its Hugging Face name and checks presence, dtype
 * (F32, F16 or BF16; tensors may mix them) and exact shape; the Tensors point into the
 * checkpoint's read-only mapping, except the fused q/k/v and gate/up projections, whose rows
 * are concatenated into owned buffers. weights_dummy fills one allocation with deterministic
 * uniform noise of the config's shapes (load-format dummy), scaled so that activations stay
 * O(1) through the layers and logits come out roughly unit-variance. */
#include "weights.h"
#include "quant.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- binding -------------------------------------------------------------------------- */

/* What errors name as the checkpoint: its file if every tensor is in one file, else the
 * folder holding its shards. */
static void checkpoint_label(const StCheckpoint *ck, char *buf, size_t cap) {
    int n = st_count(ck);
    if (n == 0) {
        snprintf(buf, cap, "checkpoint (no tensors)");
        return;
    }
    const char *first = st_tensor(ck, 0)->file;
    for (int i = 1; i < n; i++) {
        if (strcmp(st_tensor(ck, i)->file, first) != 0) {
            const char *slash = strrchr(first, '/');
            if (slash)
                snprintf(buf, cap, "%.*s", (int)(slash - first), first);
            else
                snprintf(buf, cap, ".");
            return;
        }
    }
    snprintf(buf, cap, "%s", first);
}

static void format_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (n < cap)
        snprintf(buf + n, cap - n, "]");
}

typedef struct {
    const StCheckpoint *ck;
    const ModelConfig *cfg;
    ModelWeights *w; /* owns the scales read */
    char label[512];
} Binder;

/* Bind `name` of shape [d0] (d1 == 0) or [d0, d1] into t; F8_E4M3 only when allow_fp8 (the
 * caller reads the scales). */
static Status bind_any(Binder *b, const char *name, int64_t d0, int64_t d1, Tensor *t,
                       int allow_fp8) {
    const StTensor *st = st_find(b->ck, name);
    if (!st)
        return pl_error_set(PL_ERR_FORMAT, "%s: missing tensor '%s'", b->label, name);
    if (st->dtype == DT_F8E4M3 && !allow_fp8)
        return pl_error_set(PL_ERR_UNSUPPORTED,
                            "%s: tensor '%s' has dtype F8_E4M3: fp8 is read for the attention "
                            "and dense MLP projections only (not embeddings, norms, the LM head "
                            "or mixture-of-experts layers)",
                            st->file, name);
    if (st->dtype != DT_F32 && st->dtype != DT_F16 && st->dtype != DT_BF16 &&
        st->dtype != DT_F8E4M3)
        return pl_error_set(PL_ERR_UNSUPPORTED,
                            "%s: tensor '%s' has dtype %s, expected F32, F16 or BF16", st->file,
                            name, st->dtype_name);
    int ndim = d1 ? 2 : 1;
    int64_t want[2] = {d0, d1};
    if (st->ndim != ndim || st->shape[0] != d0 || (ndim == 2 && st->shape[1] != d1)) {
        char have_s[160], want_s[64];
        format_shape(have_s, sizeof have_s, st->ndim, st->shape);
        format_shape(want_s, sizeof want_s, ndim, want);
        return pl_error_set(PL_ERR_FORMAT, "%s: tensor '%s' has shape %s, expected %s", st->file,
                            name, have_s, want_s);
    }
    /* Kernels read elements through typed pointers. The safetensors library pads the header
     * so that every tensor is aligned; a file that is not would fault or be slow later. */
    if ((uintptr_t)st->data % pl_dtype_size(st->dtype) != 0)
        return pl_error_set(PL_ERR_UNSUPPORTED,
                            "%s: tensor '%s' data is not aligned to its %zu-byte elements; "
                            "re-save the checkpoint with the safetensors library",
                            st->file, name, pl_dtype_size(st->dtype));
    memset(t, 0, sizeof *t);
    t->data = (void *)st->data; /* read-only mapping: never written */
    t->dtype = st->dtype;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    return PL_OK;
}

static Status bind(Binder *b, const char *name, int64_t d0, int64_t d1, Tensor *t) {
    return bind_any(b, name, d0, d1, t, 0);
}

static float element_f32(const void *p, DType dt, size_t i) {
    if (dt == DT_F32)
        return ((const float *)p)[i];
    if (dt == DT_F8E4M3)
        return pl_f8e4m3_to_f32(((const uint8_t *)p)[i]);
    uint16_t h = ((const uint16_t *)p)[i];
    return dt == DT_BF16 ? pl_bf16_to_f32(h) : pl_f16_to_f32(h);
}

uint16_t *weights_to_16bit(const Tensor *t, DType dt) {
    size_t ne = 1;
    for (int d = 0; d < t->ndim; d++)
        ne *= (size_t)t->shape[d];
    uint16_t (*conv)(float) = dt == DT_BF16 ? pl_f32_to_bf16 : pl_f32_to_f16;
    uint16_t *b = pl_xmalloc(ne * sizeof *b);
    for (size_t i = 0; i < ne; i++)
        b[i] = conv(element_f32(t->data, t->dtype, i));
    return b;
}

static void own(ModelWeights *w, void *buf);

/* Elements of a safetensors tensor (1 for a scalar). */
static size_t st_elems(const StTensor *st) {
    size_t n = 1;
    for (int d = 0; d < st->ndim; d++)
        n *= (size_t)st->shape[d];
    return n;
}

/* The scale tensor `name` as `count` fp32 values in a buffer owned by b->w; its shape is
 * [rows, cols] (or [rows] when cols == 1, or any shape of one element when count == 1). */
static Status read_scales(Binder *b, const char *name, int64_t rows, int64_t cols, float **out) {
    const StTensor *st = st_find(b->ck, name);
    if (!st)
        return pl_error_set(PL_ERR_FORMAT, "%s: missing tensor '%s' (the fp8 weight's scales)",
                            b->label, name);
    if (st->dtype != DT_F32 && st->dtype != DT_F16 && st->dtype != DT_BF16)
        return pl_error_set(PL_ERR_UNSUPPORTED,
                            "%s: tensor '%s' has dtype %s, expected F32, F16 or BF16", st->file,
                            name, st->dtype_name);
    size_t count = (size_t)(rows * cols);
    int ok = st_elems(st) == count &&
             (count == 1 || (st->ndim == 2 && st->shape[0] == rows && st->shape[1] == cols) ||
              (st->ndim == 1 && cols == 1 && st->shape[0] == rows));
    if (!ok) {
        char have_s[160];
        format_shape(have_s, sizeof have_s, st->ndim, st->shape);
        return pl_error_set(PL_ERR_FORMAT, "%s: tensor '%s' has shape %s, expected [%lld, %lld]",
                            st->file, name, have_s, (long long)rows, (long long)cols);
    }
    float *buf = pl_xmalloc(count * sizeof *buf);
    for (size_t i = 0; i < count; i++) {
        float f;
        if (st->dtype == DT_F32) {
            memcpy(&f, (const char *)st->data + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, (const char *)st->data + 2 * i, 2);
            f = st->dtype == DT_BF16 ? pl_bf16_to_f32(h) : pl_f16_to_f32(h);
        }
        if (!isfinite(f) || f < 0) {
            free(buf);
            return pl_error_set(PL_ERR_FORMAT, "%s: tensor '%s' element %zu is %g, not a scale",
                                st->file, name, i, f);
        }
        buf[i] = f;
    }
    own(b->w, buf);
    *out = buf;
    return PL_OK;
}

/* Bind the linear layer `module`'s weight [d0, d1]: in a float dtype, or F8_E4M3 with the
 * scales its quantization_config names, converted to fp32 into buffers owned by b->w. */
static Status bind_linear(Binder *b, const char *module, int64_t d0, int64_t d1, Tensor *t) {
    char name[256];
    snprintf(name, sizeof name, "%s.weight", module);
    Status s = bind_any(b, name, d0, d1, t, 1);
    if (s != PL_OK || t->dtype != DT_F8E4M3)
        return s;
    const ModelQuant *q = &b->cfg->quant;
    const char *file = st_find(b->ck, name)->file;
    if (q->method != QUANT_FP8 && q->method != QUANT_COMPRESSED)
        return pl_error_set(PL_ERR_FORMAT,
                            "%s: tensor '%s' is F8_E4M3 but config.json has no "
                            "quantization_config saying how it is scaled",
                            file, name);
    const char *ign = quant_ignored(q, module);
    if (ign)
        return pl_error_set(PL_ERR_FORMAT,
                            "%s: tensor '%s' is F8_E4M3 but quantization_config.%s entry '%s' "
                            "keeps it unquantized",
                            file, name,
                            q->method == QUANT_FP8 ? "modules_to_not_convert" : "ignore", ign);
    Fp8Scales sc = {.kind = q->weight_scales};
    int64_t rows = 1, cols = 1;
    if (sc.kind == FP8_SCALE_BLOCK) {
        sc.block = q->block;
        rows = (d0 + q->block - 1) / q->block;
        cols = (d1 + q->block - 1) / q->block;
    } else if (sc.kind == FP8_SCALE_CHANNEL) {
        rows = d0;
    }
    /* fp8 checkpoints name the (multiplied) scale weight_scale_inv, or per tensor also
     * weight_scale as vLLM writes them; compressed-tensors weight_scale */
    snprintf(name, sizeof name, "%s.%s", module,
             q->method == QUANT_FP8 ? "weight_scale_inv" : "weight_scale");
    if (q->method == QUANT_FP8 && sc.kind == FP8_SCALE_TENSOR && !st_find(b->ck, name))
        snprintf(name, sizeof name, "%s.weight_scale", module);
    float *ws;
    if ((s = read_scales(b, name, rows, cols, &ws)))
        return s;
    sc.w_scale = ws;
    if (q->static_input) {
        float *is;
        snprintf(name, sizeof name, "%s.input_scale", module);
        if ((s = read_scales(b, name, 1, 1, &is)))
            return s;
        if (!(is[0] > 0))
            return pl_error_set(PL_ERR_FORMAT, "%s: tensor '%s' is %g, not a positive scale",
                                b->label, name, is[0]);
        sc.input_scale = is[0];
    }
    t->fp8 = sc;
    return PL_OK;
}

/* Rows [r0, r0 + rows) of a row-major tensor: a view into the same data. */
static Tensor row_view(const Tensor *t, int64_t r0, int64_t rows) {
    Tensor v = *t;
    size_t row_bytes = (t->ndim == 2 ? (size_t)t->shape[1] : 1) * pl_dtype_size(t->dtype);
    v.data = (char *)t->data + (size_t)r0 * row_bytes;
    v.shape[0] = rows;
    if (t->dtype == DT_F8E4M3 && t->fp8.kind == FP8_SCALE_CHANNEL) {
        v.fp8.w_scale = t->fp8.w_scale + r0;
    } else if (t->dtype == DT_F8E4M3 && t->fp8.kind == FP8_SCALE_BLOCK) {
        int64_t B = t->fp8.block; /* r0 on a block boundary: check_block_cut */
        PL_CHECK(r0 % B == 0);
        v.fp8.w_scale = t->fp8.w_scale + (r0 / B) * ((t->shape[1] + B - 1) / B);
    }
    return v;
}

/* q, k, v (weights or biases) cut to the shard's heads. */
static void shard_qkv(Tensor qkv[3], const ModelShard *sh, int64_t D) {
    qkv[0] = row_view(&qkv[0], sh->first_head * D, sh->num_heads * D);
    for (int k = 1; k < 3; k++)
        qkv[k] = row_view(&qkv[k], sh->first_kv_head * D, sh->num_kv_heads * D);
}

/* w frees buf with the other host copies (weights_free_host). */
static void own(ModelWeights *w, void *buf) {
    w->fused = pl_xrealloc(w->fused, (size_t)(w->num_fused + 1) * sizeof *w->fused);
    w->fused[w->num_fused++] = buf;
}

/* Free buf now if w owns it (a fused or column copy replaced by its quantized form). */
static void disown(ModelWeights *w, void *buf) {
    for (int i = 0; i < w->num_fused; i++)
        if (w->fused[i] == buf) {
            free(buf);
            w->fused[i] = w->fused[--w->num_fused];
            return;
        }
}

/* Weight (r, c) of an fp8 tensor as the value it stands for, dec(q) * scale. */
static float fp8_value(const Tensor *t, int64_t r, int64_t c) {
    const Fp8Scales *sc = &t->fp8;
    float q = pl_f8e4m3_to_f32(((const uint8_t *)t->data)[r * t->shape[1] + c]);
    switch (sc->kind) {
        case FP8_SCALE_TENSOR:
            return q * sc->w_scale[0];
        case FP8_SCALE_CHANNEL:
            return q * sc->w_scale[r];
        default: {
            int64_t B = sc->block, kb = (t->shape[1] + B - 1) / B;
            return q * sc->w_scale[(r / B) * kb + c / B];
        }
    }
}

/* t (2-D, F32/F16/BF16) quantized per output channel into buffers owned by w (quant.h's
 * quant_fp8_rows); a buffer of w's behind t is freed. */
static void quantize_channels(ModelWeights *w, Tensor *t) {
    size_t N = (size_t)t->shape[0], K = (size_t)t->shape[1];
    uint8_t *q = pl_xmalloc(N * K > 0 ? N * K : 1);
    float *scale = pl_xmalloc((N ? N : 1) * sizeof *scale);
    quant_fp8_rows(q, scale, t->data, t->dtype, N, K);
    disown(w, t->data);
    own(w, q);
    own(w, scale);
    t->data = q;
    t->dtype = DT_F8E4M3;
    t->fp8 = (Fp8Scales){.kind = FP8_SCALE_CHANNEL, .w_scale = scale};
}

/* A tensor-parallel cut at row (or column) `first` of an fp8 weight with block scales must
 * fall on a block boundary. */
static Status check_block_cut(const Binder *b, const Tensor *t, const char *name, int64_t first,
                              int cols) {
    if (t->dtype != DT_F8E4M3 || t->fp8.kind != FP8_SCALE_BLOCK || first % t->fp8.block == 0)
        return PL_OK;
    return pl_error_set(PL_ERR_UNSUPPORTED,
                        "%s: tensor '%s' has %dx%d scale blocks; this tensor-parallel rank's "
                        "part starts at %s %lld, inside a block (use a tensor-parallel-size "
                        "that cuts on block boundaries)",
                        b->label, name, t->fp8.block, t->fp8.block, cols ? "column" : "row",
                        (long long)first);
}

/* The fp8 parts[0..n) fused into out (their rows concatenated, in a buffer owned by w), with
 * scales that keep every value: block scales when every part but the last ends on a block
 * boundary; per-channel scales (each row its part's scale) from per-tensor and per-channel
 * parts. Other mixes (block parts off the block grid: q/k/v of tiny models) are dequantized
 * and requantized per output channel, which is not exact: w->requantized counts them. A
 * static input_scale becomes the largest of the parts' (as vLLM does: they share the input). */
static Status fuse_fp8(Binder *b, ModelWeights *w, Tensor *out, const Tensor *parts, int n,
                       const char *what) {
    int64_t rows = 0, K = parts[0].shape[1];
    int block = parts[0].fp8.kind == FP8_SCALE_BLOCK, aligned = 1, statics = 0;
    float input_scale = 0;
    for (int i = 0; i < n; i++) {
        const Fp8Scales *sc = &parts[i].fp8;
        rows += parts[i].shape[0];
        if (sc->kind == FP8_SCALE_BLOCK) {
            aligned &= sc->block == parts[0].fp8.block &&
                       (i == n - 1 || parts[i].shape[0] % sc->block == 0);
        }
        block &= sc->kind == FP8_SCALE_BLOCK;
        aligned &= (sc->kind == FP8_SCALE_BLOCK) == (parts[0].fp8.kind == FP8_SCALE_BLOCK);
        statics += sc->input_scale > 0;
        input_scale = fmaxf(input_scale, sc->input_scale);
    }
    if (statics != 0 && statics != n)
        return pl_error_set(PL_ERR_FORMAT, "%s: %s: some parts have an input_scale, some not",
                            b->label, what);
    uint8_t *q = pl_xmalloc((size_t)rows * (size_t)K);
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        size_t ne = (size_t)parts[i].shape[0] * (size_t)K;
        memcpy(q + at, parts[i].data, ne);
        at += ne;
    }
    *out = parts[0];
    out->data = q;
    out->shape[0] = rows;
    out->fp8.input_scale = input_scale;
    if (block && aligned) {
        int64_t B = parts[0].fp8.block, kb = (K + B - 1) / B;
        float *sc = pl_xmalloc((size_t)((rows + B - 1) / B * kb) * sizeof *sc), *o = sc;
        for (int i = 0; i < n; i++) {
            size_t cnt = (size_t)((parts[i].shape[0] + B - 1) / B * kb);
            memcpy(o, parts[i].fp8.w_scale, cnt * sizeof *sc);
            o += cnt;
        }
        own(w, q);
        own(w, sc);
        out->fp8.w_scale = sc;
        return PL_OK;
    }
    if (!block && aligned) { /* per-tensor / per-channel: per-channel */
        float *sc = pl_xmalloc((size_t)rows * sizeof *sc);
        int64_t r = 0;
        for (int i = 0; i < n; i++)
            for (int64_t j = 0; j < parts[i].shape[0]; j++, r++)
                sc[r] = parts[i].fp8.kind == FP8_SCALE_TENSOR ? parts[i].fp8.w_scale[0]
                                                              : parts[i].fp8.w_scale[j];
        own(w, q);
        own(w, sc);
        out->fp8.kind = FP8_SCALE_CHANNEL;
        out->fp8.w_scale = sc;
        return PL_OK;
    }
    float *deq = pl_xmalloc((size_t)rows * (size_t)K * sizeof *deq), *o = deq;
    for (int i = 0; i < n; i++)
        for (int64_t r = 0; r < parts[i].shape[0]; r++)
            for (int64_t c = 0; c < K; c++)
                *o++ = fp8_value(&parts[i], r, c);
    free(q);
    own(w, deq);
    out->data = deq;
    out->dtype = DT_F32;
    quantize_channels(w, out);
    out->fp8.input_scale = input_scale;
    w->requantized++;
    return PL_OK;
}

/* The common dtype of parts[0..n) (F32 when they differ) and their rows in all. */
static DType parts_dtype(const Tensor *parts, int n, int64_t *rows) {
    DType dt = parts[0].dtype;
    *rows = 0;
    for (int i = 0; i < n; i++) {
        *rows += parts[i].shape[0];
        if (parts[i].dtype != dt)
            dt = DT_F32;
    }
    return dt;
}

/* out = the rows of parts[0..n) concatenated, in their common dtype (F32 when they differ),
 * in a buffer owned by w; fp8 parts (all or none: `what` names them in errors) by fuse_fp8. */
static Status fuse_rows(Binder *b, ModelWeights *w, Tensor *out, const Tensor *parts, int n,
                        const char *what) {
    int fp8 = 0;
    for (int i = 0; i < n; i++)
        fp8 += parts[i].dtype == DT_F8E4M3;
    if (fp8 == n)
        return fuse_fp8(b, w, out, parts, n, what);
    if (fp8)
        return pl_error_set(PL_ERR_FORMAT,
                            "%s: %s: some parts are F8_E4M3 and some not (pagellm fuses them "
                            "into one matmul: all fp8 or none)",
                            b->label, what);
    int64_t rows;
    DType dt = parts_dtype(parts, n, &rows);
    int64_t cols = parts[0].ndim == 2 ? parts[0].shape[1] : 1;
    size_t es = pl_dtype_size(dt);
    char *buf = pl_xmalloc((size_t)rows * (size_t)cols * es);
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        size_t ne = (size_t)parts[i].shape[0] * (size_t)cols;
        if (parts[i].dtype == dt) {
            memcpy(buf + at * es, parts[i].data, ne * es);
        } else {
            float *f = (float *)(void *)(buf + at * es);
            for (size_t j = 0; j < ne; j++)
                f[j] = element_f32(parts[i].data, parts[i].dtype, j);
        }
        at += ne;
    }
    own(w, buf);
    *out = parts[0];
    out->data = buf;
    out->dtype = dt;
    out->shape[0] = rows;
    return PL_OK;
}

/* Columns [c0, c0 + cols) of a 2-D tensor into a buffer owned by w (t itself when whole); an
 * fp8 weight's block scales are cut with it (c0 on a block boundary: check_block_cut). */
static void take_cols(ModelWeights *w, Tensor *t, int64_t c0, int64_t cols) {
    if (c0 == 0 && cols == t->shape[1])
        return;
    if (t->dtype == DT_F8E4M3 && t->fp8.kind == FP8_SCALE_BLOCK) {
        int64_t B = t->fp8.block, kb = (t->shape[1] + B - 1) / B, nb = (cols + B - 1) / B;
        int64_t rb = (t->shape[0] + B - 1) / B;
        PL_CHECK(c0 % B == 0);
        float *sc = pl_xmalloc((size_t)(rb * nb) * sizeof *sc);
        for (int64_t r = 0; r < rb; r++)
            memcpy(sc + r * nb, t->fp8.w_scale + r * kb + c0 / B, (size_t)nb * sizeof *sc);
        own(w, sc);
        t->fp8.w_scale = sc;
    }
    size_t es = pl_dtype_size(t->dtype), rows = (size_t)t->shape[0];
    char *buf = pl_xmalloc(rows * (size_t)cols * es);
    for (size_t r = 0; r < rows; r++)
        memcpy(buf + r * (size_t)cols * es,
               (const char *)t->data + (r * (size_t)t->shape[1] + (size_t)c0) * es,
               (size_t)cols * es);
    own(w, buf);
    t->data = buf;
    t->shape[1] = cols;
}

/* out = columns [c0, c0 + cols) of the 2-D parts[0..n) stacked row-wise, in their common dtype
 * (F32 when they differ), in a buffer owned by w: one copy, where take_cols then fuse_rows
 * would make two. */
static void fuse_cols(ModelWeights *w, Tensor *out, const Tensor *parts, int n, int64_t c0,
                      int64_t cols) {
    int64_t rows;
    DType dt = parts_dtype(parts, n, &rows);
    size_t es = pl_dtype_size(dt);
    char *buf = pl_xmalloc((size_t)rows * (size_t)cols * es);
    char *at = buf;
    for (int i = 0; i < n; i++) {
        const Tensor *p = &parts[i];
        size_t pes = pl_dtype_size(p->dtype), width = (size_t)p->shape[1];
        for (int64_t r = 0; r < p->shape[0]; r++, at += (size_t)cols * es) {
            size_t first = (size_t)r * width + (size_t)c0;
            if (p->dtype == dt)
                memcpy(at, (const char *)p->data + first * pes, (size_t)cols * es);
            else
                for (int64_t c = 0; c < cols; c++)
                    ((float *)(void *)at)[c] = element_f32(p->data, p->dtype, first + (size_t)c);
        }
    }
    own(w, buf);
    *out = parts[0];
    out->data = buf;
    out->dtype = dt;
    out->shape[0] = rows;
    out->shape[1] = cols;
}

/* The shard's vocabulary rows [first_vocab, first_vocab + num_vocab) of a [V, H] tensor: a
 * view, or (rows past V: the last slice's padding) a zero-padded copy owned by w. */
static void take_vocab_rows(ModelWeights *w, Tensor *t, const ModelShard *sh) {
    int64_t have = t->shape[0] - sh->first_vocab;
    have = have < 0 ? 0 : have > sh->num_vocab ? sh->num_vocab : have;
    if (have == sh->num_vocab) {
        *t = row_view(t, sh->first_vocab, sh->num_vocab);
        return;
    }
    size_t row_bytes = (size_t)t->shape[1] * pl_dtype_size(t->dtype);
    char *buf = pl_xcalloc((size_t)sh->num_vocab, row_bytes);
    if (have > 0)
        memcpy(buf, (const char *)t->data + (size_t)sh->first_vocab * row_bytes,
               (size_t)have * row_bytes);
    own(w, buf);
    t->data = buf;
    t->shape[0] = sh->num_vocab;
}

/* t (a norm weight w) becomes an owned F32 copy of 1 + w: Gemma's RMSNorm scale, in fp32 as
 * transformers computes it. */
static void plus_one(ModelWeights *w, Tensor *t) {
    size_t n = (size_t)t->shape[0];
    float *buf = pl_xmalloc(n * sizeof *buf);
    for (size_t i = 0; i < n; i++)
        buf[i] = 1.0f + element_f32(t->data, t->dtype, i);
    own(w, buf);
    t->data = buf;
    t->dtype = DT_F32;
}

/* Layer `layer`'s router and experts (Hub names: Mixtral's block_sparse_moe.experts.E.w1/w3/w2,
 * Qwen3-MoE's mlp.experts.E.gate_proj/up_proj/down_proj), each expert cut to the shard's
 * intermediate columns and fused: gate_up [E, 2 Im, H], down [E, H, Im]. */
static Status bind_experts(ModelWeights *w, Binder *b, const ModelConfig *cfg, const ModelShard *sh,
                           int layer, LayerWeights *l) {
    const int mixtral = strcmp(cfg->architecture, "MixtralForCausalLM") == 0;
    const char *block = mixtral ? "block_sparse_moe" : "mlp";
    const char *proj[3] = {mixtral ? "w1" : "gate_proj", mixtral ? "w3" : "up_proj",
                           mixtral ? "w2" : "down_proj"};
    const int64_t E = cfg->num_experts, H = cfg->hidden_size, I = cfg->moe_intermediate_size;
    char n[192];
    snprintf(n, sizeof n, "model.layers.%d.%s.gate.weight", layer, block);
    Status s = bind(b, n, E, H, &l->router);
    if (s != PL_OK)
        return s;
    Tensor *gu = pl_xcalloc((size_t)(2 * E), sizeof *gu), *dn = pl_xcalloc((size_t)E, sizeof *dn);
    for (int64_t e = 0; e < E && s == PL_OK; e++) {
        for (int k = 0; k < 3 && s == PL_OK; k++) {
            snprintf(n, sizeof n, "model.layers.%d.%s.experts.%lld.%s.weight", layer, block,
                     (long long)e, proj[k]);
            s = k < 2 ? bind(b, n, I, H, &gu[2 * e + k]) : bind(b, n, H, I, &dn[e]);
        }
        if (s != PL_OK)
            break;
        for (int k = 0; k < 2; k++)
            gu[2 * e + k] = row_view(&gu[2 * e + k], sh->first_moe_inter, sh->moe_intermediate);
    }
    if (s == PL_OK) {
        s = fuse_rows(b, w, &l->experts_gate_up, gu, (int)(2 * E), "experts");
    }
    if (s == PL_OK) {
        fuse_cols(w, &l->experts_down, dn, (int)E, sh->first_moe_inter, sh->moe_intermediate);
        int64_t gu_shape[3] = {E, 2 * (int64_t)sh->moe_intermediate, H};
        int64_t dn_shape[3] = {E, H, sh->moe_intermediate};
        l->experts_gate_up.ndim = l->experts_down.ndim = 3;
        memcpy(l->experts_gate_up.shape, gu_shape, sizeof gu_shape);
        memcpy(l->experts_down.shape, dn_shape, sizeof dn_shape);
        l->moe = 1;
    }
    free(gu);
    free(dn);
    return s;
}

Status weights_bind(const ModelConfig *cfg, const StCheckpoint *ck, const ModelShard *shard,
                    ModelWeights *w) {
    memset(w, 0, sizeof *w);
    ModelShard sh;
    Status s = model_shard(cfg, shard ? shard->rank : 0, shard ? shard->size : 1, &sh);
    if (s != PL_OK)
        return s;
    const int64_t D = cfg->head_dim;
    Binder b = {.ck = ck, .cfg = cfg, .w = w};
    checkpoint_label(ck, b.label, sizeof b.label);
    const int64_t H = cfg->hidden_size, I = cfg->intermediate_size, V = cfg->vocab_size;
    const int64_t QD = (int64_t)cfg->num_heads * cfg->head_dim;
    const int64_t KD = (int64_t)cfg->num_kv_heads * cfg->head_dim;
    const int phi3 = strcmp(cfg->architecture, "Phi3ForCausalLM") == 0;
    if ((s = bind(&b, "model.embed_tokens.weight", V, H, &w->embed)) ||
        (s = bind(&b, "model.norm.weight", H, 0, &w->final_norm)))
        goto fail;
    if (cfg->gemma)
        plus_one(w, &w->final_norm);
    if (cfg->tie_word_embeddings) {
        /* As in transformers, tied means the embedding, even if a copy of lm_head is saved. */
        w->lm_head = w->embed;
    } else if ((s = bind(&b, "lm_head.weight", V, H, &w->lm_head))) {
        goto fail;
    }
    if (sh.size > 1) {
        take_vocab_rows(w, &w->embed, &sh);
        if (cfg->tie_word_embeddings)
            w->lm_head = w->embed;
        else
            take_vocab_rows(w, &w->lm_head, &sh);
    }

    w->layers = pl_xcalloc((size_t)cfg->num_layers, sizeof *w->layers);
    for (int i = 0; i < cfg->num_layers; i++) {
        LayerWeights *l = &w->layers[i];
        char n[128], what[96];
#define BIND(suffix, d0, d1, dst)                                                                  \
    do {                                                                                           \
        snprintf(n, sizeof n, "model.layers.%d.%s", i, suffix);                                    \
        if ((s = bind(&b, n, d0, d1, dst)))                                                        \
            goto fail;                                                                             \
    } while (0)
/* a projection: float, or fp8 with scales; `first` where this rank's rows (or columns) start */
#define BIND_LINEAR(module, d0, d1, dst, first, cols)                                              \
    do {                                                                                           \
        snprintf(n, sizeof n, "model.layers.%d.%s", i, module);                                    \
        if ((s = bind_linear(&b, n, d0, d1, dst)) ||                                               \
            (s = check_block_cut(&b, dst, n, first, cols)))                                        \
            goto fail;                                                                             \
    } while (0)
        Tensor qkv[3], gate_up[2];
        BIND("input_layernorm.weight", H, 0, &l->attn_norm);
        if (phi3) { /* one [q; k; v] tensor in the file */
            Tensor whole;
            BIND("self_attn.qkv_proj.weight", QD + 2 * KD, H, &whole);
            qkv[0] = row_view(&whole, 0, QD);
            qkv[1] = row_view(&whole, QD, KD);
            qkv[2] = row_view(&whole, QD + KD, KD);
        } else {
            BIND_LINEAR("self_attn.q_proj", QD, H, &qkv[0], (int64_t)sh.first_head * D, 0);
            BIND_LINEAR("self_attn.k_proj", KD, H, &qkv[1], (int64_t)sh.first_kv_head * D, 0);
            BIND_LINEAR("self_attn.v_proj", KD, H, &qkv[2], (int64_t)sh.first_kv_head * D, 0);
        }
        shard_qkv(qkv, &sh, D);
        snprintf(what, sizeof what, "layer %d's q_proj, k_proj and v_proj", i);
        if ((s = fuse_rows(&b, w, &l->wqkv, qkv, 3, what)))
            goto fail;
        if (cfg->qkv_bias) {
            BIND("self_attn.q_proj.bias", QD, 0, &qkv[0]);
            BIND("self_attn.k_proj.bias", KD, 0, &qkv[1]);
            BIND("self_attn.v_proj.bias", KD, 0, &qkv[2]);
            shard_qkv(qkv, &sh, D);
            if ((s = fuse_rows(&b, w, &l->bqkv, qkv, 3, what)))
                goto fail;
        }
        BIND_LINEAR("self_attn.o_proj", H, QD, &l->wo, (int64_t)sh.first_head * D, 1);
        take_cols(w, &l->wo, (int64_t)sh.first_head * D, (int64_t)sh.num_heads * D);
        if (cfg->qk_norm) {
            BIND("self_attn.q_norm.weight", D, 0, &l->q_norm);
            BIND("self_attn.k_norm.weight", D, 0, &l->k_norm);
        }
        if (cfg->gemma) {
            BIND("post_attention_layernorm.weight", H, 0, &l->post_attn_norm);
            BIND("pre_feedforward_layernorm.weight", H, 0, &l->mlp_norm);
            BIND("post_feedforward_layernorm.weight", H, 0, &l->post_mlp_norm);
            Tensor *norms[] = {&l->attn_norm,     &l->post_attn_norm, &l->mlp_norm,
                               &l->post_mlp_norm, &l->q_norm,         &l->k_norm};
            for (size_t k = 0; k < sizeof norms / sizeof *norms; k++)
                if (norms[k]->data)
                    plus_one(w, norms[k]);
        } else {
            BIND("post_attention_layernorm.weight", H, 0, &l->mlp_norm);
        }
        if (model_layer_is_moe(cfg, i)) {
            if ((s = bind_experts(w, &b, cfg, &sh, i, l)))
                goto fail;
        } else {
            if (phi3) { /* one [gate; up] tensor in the file */
                Tensor whole;
                BIND("mlp.gate_up_proj.weight", 2 * I, H, &whole);
                gate_up[0] = row_view(&whole, 0, I);
                gate_up[1] = row_view(&whole, I, I);
            } else {
                BIND_LINEAR("mlp.gate_proj", I, H, &gate_up[0], sh.first_inter, 0);
                BIND_LINEAR("mlp.up_proj", I, H, &gate_up[1], sh.first_inter, 0);
            }
            for (int k = 0; k < 2; k++)
                gate_up[k] = row_view(&gate_up[k], sh.first_inter, sh.intermediate);
            snprintf(what, sizeof what, "layer %d's gate_proj and up_proj", i);
            if ((s = fuse_rows(&b, w, &l->w_gate_up, gate_up, 2, what)))
                goto fail;
            BIND_LINEAR("mlp.down_proj", H, I, &l->w_down, sh.first_inter, 1);
            take_cols(w, &l->w_down, sh.first_inter, sh.intermediate);
        }
#undef BIND
#undef BIND_LINEAR
        if (cfg->quant.method == QUANT_ONLINE_FP8) { /* quantization: fp8 */
            Tensor *lin[4] = {&l->wqkv, &l->wo, &l->w_gate_up, &l->w_down};
            for (int k = 0; k < 4; k++)
                if (lin[k]->data && lin[k]->dtype != DT_F8E4M3)
                    quantize_channels(w, lin[k]);
        }
    }
    return PL_OK;
fail:
    weights_free(w);
    return s;
}

/* ---- dummy weights -------------------------------------------------------------------- */

typedef enum { FILL_UNIFORM, FILL_ONES } FillKind;

typedef struct {
    Tensor *t;
    FillKind kind;
    float scale;  /* uniform in [-scale, scale) */
    size_t count; /* elements filled; the rest (vocabulary padding) stay zero */
    size_t first; /* element 0 is element `first` (even) of the stream */
    int whole;    /* drawn from the whole model's stream (a vocabulary slice), not the rank's */
    uint64_t key; /* the stream's key, set once every tensor is listed */
    DType dt;     /* the tensor's dtype */
    float wscale; /* DT_F8E4M3: every scale of the tensor (scale is then 448) */
} DummySpec;

static inline uint64_t mix64(uint64_t z) { /* splitmix64's finaliser */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Elements 2j and 2j+1 of a stream: two 24-bit uniforms in [-scale, scale) from one draw.
 * Element i depends only on (key, i), so any split of a tensor over threads gives the same
 * values. */
#define UNIFORM_PAIR(key, j, k, scale, a, b)                                                       \
    do {                                                                                           \
        uint64_t r_ = mix64((key) + (uint64_t)(j)*0x9e3779b97f4a7c15ull);                          \
        (a) = (float)(uint32_t)(r_ >> 40) * (k) - (scale);                                         \
        (b) = (float)(uint32_t)((r_ >> 8) & 0xffffffu) * (k) - (scale);                            \
    } while (0)

/* Fill elements [begin, end) of a tensor (begin even). One tight loop per dtype. */
static void fill_uniform(void *dst, DType dt, size_t begin, size_t end, uint64_t key, float scale) {
    const float k = 2.0f * scale / 16777216.0f;
    float a, b;
    size_t i = begin;
    if (dt == DT_F32) {
        float *o = dst;
        for (; i + 1 < end; i += 2) {
            UNIFORM_PAIR(key, i >> 1, k, scale, a, b);
            o[i] = a;
            o[i + 1] = b;
        }
        if (i < end) {
            UNIFORM_PAIR(key, i >> 1, k, scale, a, b);
            o[i] = a;
        }
        return;
    }
    if (dt == DT_F8E4M3) {
        uint8_t *o = dst;
        for (; i + 1 < end; i += 2) {
            UNIFORM_PAIR(key, i >> 1, k, scale, a, b);
            o[i] = pl_f32_to_f8e4m3(a);
            o[i + 1] = pl_f32_to_f8e4m3(b);
        }
        if (i < end) {
            UNIFORM_PAIR(key, i >> 1, k, scale, a, b);
            o[i] = pl_f32_to_f8e4m3(a);
        }
        return;
    }
    uint16_t (*conv)(float) = dt == DT_BF16 ? pl_f32_to_bf16 : pl_f32_to_f16;
    uint16_t *o = dst;
    for (; i + 1 < end; i += 2) {
        UNIFORM_PAIR(key, i >> 1, k, scale, a, b);
        o[i] = conv(a);
        o[i + 1] = conv(b);
    }
    if (i < end) {
        UNIFORM_PAIR(key, i >> 1, k, scale, a, b);
        o[i] = conv(a);
    }
}

static void fill_value(void *dst, DType dt, size_t begin, size_t end, float x) {
    if (dt == DT_F8E4M3) {
        memset((uint8_t *)dst + begin, pl_f32_to_f8e4m3(x), end - begin);
        return;
    }
    if (dt == DT_F32) {
        float *f = dst;
        for (size_t i = begin; i < end; i++)
            f[i] = x;
        return;
    }
    uint16_t h = dt == DT_BF16 ? pl_f32_to_bf16(x) : pl_f32_to_f16(x);
    uint16_t *u = dst;
    for (size_t i = begin; i < end; i++)
        u[i] = h;
}

static size_t tensor_elems(const Tensor *t) {
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= (size_t)t->shape[i];
    return n;
}

/* Thread `part` of `parts` fills its slice of every tensor. */
typedef struct {
    const DummySpec *spec;
    size_t num_spec;
    int part, parts;
    int inline_run;
} FillJob;

static void *fill_worker(void *arg) {
    const FillJob *j = arg;
    for (size_t i = 0; i < j->num_spec; i++) {
        const DummySpec *sp = &j->spec[i];
        size_t ne = sp->count;
        size_t lo = ne * (size_t)j->part / (size_t)j->parts & ~(size_t)1;
        size_t hi = j->part == j->parts - 1
                        ? ne
                        : ne * (size_t)(j->part + 1) / (size_t)j->parts & ~(size_t)1;
        if (sp->kind == FILL_ONES)
            fill_value(sp->t->data, sp->dt, lo, hi, 1.0f);
        else
            fill_uniform(sp->t->data, sp->dt, lo, hi, sp->key, sp->scale);
    }
    return NULL;
}

/* Element i of a stream drawn from `key` is element i - first of the stream drawn from
 * key + first / 2 golden-ratio steps (elements come in pairs, one draw each). */
static uint64_t stream_key(uint64_t seed, size_t index, size_t first) {
    return mix64(seed ^ mix64((uint64_t)index + 1)) + (uint64_t)(first / 2) * 0x9e3779b97f4a7c15ull;
}

/* A [V, H] tensor listed as the rows [first_row, first_row + rows) of the whole model's: its
 * stream, and zeros past them (padding). */
static void vocab_slice(DummySpec *sp, int64_t rows, int64_t first_row, int64_t H) {
    sp->count = (size_t)(rows * H);
    sp->first = (size_t)(first_row * H);
    sp->whole = 1;
}

/* Fill every tensor in backend memory, each from its own stream as fill_worker does. */
static void fill_on_device(const KernelOps *ops, const DummySpec *spec, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const DummySpec *sp = &spec[i];
        float scale = sp->kind == FILL_ONES ? 0.0f : sp->scale;
        ops->fill_dummy(ops, sp->t->data, sp->dt, sp->count, sp->key, scale);
    }
}

Status weights_dummy(const ModelConfig *cfg, uint64_t seed, const KernelOps *device,
                     const ModelShard *shard, ModelWeights *w) {
    memset(w, 0, sizeof *w);
    ModelShard sh;
    Status st = model_shard(cfg, shard ? shard->rank : 0, shard ? shard->size : 1, &sh);
    if (st != PL_OK)
        return st;
    /* Sharded layers get a stream of their own per rank; vocabulary slices are slices of the
     * whole model's embedding and LM head. */
    const uint64_t rank_seed = sh.rank > 0 ? mix64(seed + (uint64_t)sh.rank) : seed;
    DType dt = cfg->torch_dtype;
    if (dt != DT_F32 && dt != DT_F16 && dt != DT_BF16)
        return pl_error_set(PL_ERR_UNSUPPORTED, "dummy weights: dtype %s is not supported",
                            pl_dtype_name(dt));
    if (device && device->act != DT_F32)
        dt = device->act;
    const ModelQuant *mq = &cfg->quant;
    const int fp8 = mq->method != QUANT_NONE;
    const Fp8ScaleKind fp8_kind =
        mq->method == QUANT_ONLINE_FP8 || mq->weight_scales == FP8_SCALE_NONE ? FP8_SCALE_CHANNEL
                                                                              : mq->weight_scales;
    const int fp8_block = fp8_kind == FP8_SCALE_BLOCK ? mq->block : 0;
    /* fan-in scales are the whole model's; the shapes are the shard's */
    const int64_t H = cfg->hidden_size, I = sh.intermediate, V = sh.num_vocab;
    const int64_t QD = (int64_t)sh.num_heads * cfg->head_dim;
    const int64_t KD = (int64_t)sh.num_kv_heads * cfg->head_dim;
    const int L = cfg->num_layers;
    const float inv_qd = 1.0f / sqrtf((float)cfg->num_heads * cfg->head_dim);
    const float inv_i = 1.0f / sqrtf((float)cfg->intermediate_size);
    const float inv_mi =
        1.0f / sqrtf((float)(cfg->moe_intermediate_size > 0 ? cfg->moe_intermediate_size : 1));
    const int64_t E = cfg->num_experts, MI = sh.moe_intermediate, D = cfg->head_dim;
    w->layers = pl_xcalloc((size_t)L, sizeof *w->layers);

    /* Scales: a projection with U(-1/sqrt(fan_in), +) keeps unit-RMS input at output RMS
     * 1/sqrt(3). Embedding rows get RMS 1/sqrt(H), so tied logits (normed x . row) come out
     * with standard deviation ~1; biases are small. */
    const float inv_h = 1.0f / sqrtf((float)H);
    const float emb = sqrtf(3.0f) * inv_h;
    size_t cap = 3 + (size_t)L * LAYER_MAX_TENSORS, n = 0;
    DummySpec *spec = pl_xmalloc(cap * sizeof *spec);
#define ADD(tensor, kind_, scale_, d0, d1)                                                         \
    do {                                                                                           \
        Tensor *t_ = (tensor);                                                                     \
        t_->dtype = dt;                                                                            \
        t_->ndim = (d1) ? 2 : 1;                                                                   \
        t_->shape[0] = (d0);                                                                       \
        t_->shape[1] = (d1);                                                                       \
        spec[n++] = (DummySpec){t_, kind_, scale_, tensor_elems(t_), 0, 0, 0, dt, 0};              \
    } while (0)
    /* a projection: fp8 when the config is quantized */
#define ADD_LINEAR(tensor, scale_, d0, d1)                                                         \
    do {                                                                                           \
        ADD(tensor, FILL_UNIFORM, scale_, d0, d1);                                                 \
        if (fp8) {                                                                                 \
            DummySpec *sp_ = &spec[n - 1];                                                         \
            sp_->dt = sp_->t->dtype = DT_F8E4M3;                                                   \
            sp_->wscale = (scale_) / PL_F8E4M3_MAX;                                                \
            sp_->scale = PL_F8E4M3_MAX;                                                            \
            sp_->t->fp8 = (Fp8Scales){.kind = fp8_kind, .block = fp8_block};                       \
        }                                                                                          \
    } while (0)
#define ADD3(tensor, scale_, d0, d1, d2)                                                           \
    do {                                                                                           \
        ADD(tensor, FILL_UNIFORM, scale_, (d0) * (d1), d2);                                        \
        Tensor *t3_ = (tensor);                                                                    \
        t3_->ndim = 3;                                                                             \
        t3_->shape[0] = (d0);                                                                      \
        t3_->shape[1] = (d1);                                                                      \
        t3_->shape[2] = (d2);                                                                      \
    } while (0)
    /* the shard's vocabulary rows that exist (the last slice may end in padding) */
    int64_t vocab_rows = cfg->vocab_size - sh.first_vocab;
    vocab_rows = vocab_rows < 0 ? 0 : vocab_rows > V ? V : vocab_rows;
    ADD(&w->embed, FILL_UNIFORM, emb, V, H);
    vocab_slice(&spec[n - 1], vocab_rows, sh.first_vocab, H);
    ADD(&w->final_norm, FILL_ONES, 0, H, 0);
    if (!cfg->tie_word_embeddings) {
        ADD(&w->lm_head, FILL_UNIFORM, inv_h, V, H);
        vocab_slice(&spec[n - 1], vocab_rows, sh.first_vocab, H);
    }
    for (int i = 0; i < L; i++) {
        LayerWeights *l = &w->layers[i];
        ADD(&l->attn_norm, FILL_ONES, 0, H, 0);
        ADD_LINEAR(&l->wqkv, inv_h, QD + 2 * KD, H);
        if (cfg->qkv_bias)
            ADD(&l->bqkv, FILL_UNIFORM, 0.01f, QD + 2 * KD, 0);
        ADD_LINEAR(&l->wo, inv_qd, H, QD);
        ADD(&l->mlp_norm, FILL_ONES, 0, H, 0);
        if (cfg->gemma) {
            ADD(&l->post_attn_norm, FILL_ONES, 0, H, 0);
            ADD(&l->post_mlp_norm, FILL_ONES, 0, H, 0);
        }
        if (cfg->qk_norm) {
            ADD(&l->q_norm, FILL_ONES, 0, D, 0);
            ADD(&l->k_norm, FILL_ONES, 0, D, 0);
        }
        if (model_layer_is_moe(cfg, i)) {
            l->moe = 1;
            ADD(&l->router, FILL_UNIFORM, inv_h, E, H);
            ADD3(&l->experts_gate_up, inv_h, E, 2 * MI, H);
            ADD3(&l->experts_down, inv_mi, E, H, MI);
            continue;
        }
        ADD_LINEAR(&l->w_gate_up, inv_h, 2 * I, H);
        ADD_LINEAR(&l->w_down, inv_i, H, I);
    }
#undef ADD
#undef ADD3
#undef ADD_LINEAR
    PL_CHECK(n <= cap);
    for (size_t i = 0; i < n; i++)
        spec[i].key = stream_key(spec[i].whole ? seed : rank_seed, i, spec[i].first);

    /* One buffer, each tensor starting on a 64-byte boundary. */
    const size_t align = 64;
    size_t total = 0, scales = 0;
    for (size_t i = 0; i < n; i++) {
        total += (tensor_elems(spec[i].t) * pl_dtype_size(spec[i].dt) + align - 1) / align * align;
        scales += quant_scale_count(spec[i].t);
    }
    void *buf = NULL;
    if (device ? !(buf = device->alloc(device, total ? total : align))
               : posix_memalign(&buf, align, total ? total : align) != 0) {
        free(spec);
        weights_free(w);
        return pl_error_set(PL_ERR_NOMEM, "dummy weights: cannot allocate %.2f GiB of %s memory",
                            (double)total / PL_GIB, device ? device->name : "host");
    }
    w->dummy_storage = buf;
    w->device = device;
    size_t off = 0, elements = 0;
    for (size_t i = 0; i < n; i++) {
        Tensor *t = spec[i].t;
        size_t ne = tensor_elems(t), esize = pl_dtype_size(spec[i].dt);
        t->data = (char *)buf + off;
        off += (ne * esize + align - 1) / align * align;
        elements += ne;
        if (!device && spec[i].count < ne) /* backend memory comes zeroed, host memory not */
            memset((char *)t->data + spec[i].count * esize, 0, (ne - spec[i].count) * esize);
    }

    if (scales) { /* the fp8 weights' scales: a / 448 each */
        float *host = pl_xmalloc(scales * sizeof *host), *at = host;
        size_t *offs = pl_xmalloc(n * sizeof *offs);
        for (size_t i = 0; i < n; i++) {
            size_t c = quant_scale_count(spec[i].t);
            offs[i] = (size_t)(at - host);
            for (size_t k = 0; k < c; k++)
                at[k] = spec[i].wscale;
            at += c;
        }
        float *dev = host;
        if (device) {
            dev = device->alloc(device, scales * sizeof *dev);
            if (!dev) {
                free(host), free(offs), free(spec);
                weights_free(w);
                return pl_error_set(PL_ERR_NOMEM, "dummy weights: out of %s memory for scales",
                                    device->name);
            }
            device->to_device(device, dev, host, scales * sizeof *dev);
            free(host);
        }
        w->scale_storage = dev;
        for (size_t i = 0; i < n; i++)
            if (spec[i].dt == DT_F8E4M3)
                spec[i].t->fp8.w_scale = dev + offs[i];
        free(offs);
    }
    if (device) {
        fill_on_device(device, spec, n);
        if (cfg->tie_word_embeddings)
            w->lm_head = w->embed;
        free(spec);
        return PL_OK;
    }
    /* Fill on several threads for large models (an 8B model is 8e9 elements); the values
     * do not depend on the number of threads. */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = elements < (1u << 22) || cores < 2 ? 1 : cores > 32 ? 32 : (int)cores;
    FillJob *jobs = pl_xcalloc((size_t)nt, sizeof *jobs);
    pthread_t *tids = pl_xcalloc((size_t)nt, sizeof *tids);
    for (int t = 0; t < nt; t++) {
        jobs[t] = (FillJob){.spec = spec, .num_spec = n, .part = t, .parts = nt};
        if (t == 0 || pthread_create(&tids[t], NULL, fill_worker, &jobs[t]) != 0)
            jobs[t].inline_run = 1; /* the caller does it (thread 0, or no thread) */
    }
    for (int t = 0; t < nt; t++)
        if (jobs[t].inline_run)
            fill_worker(&jobs[t]);
    for (int t = 1; t < nt; t++)
        if (!jobs[t].inline_run)
            pthread_join(tids[t], NULL);
    free(jobs);
    free(tids);
    if (cfg->tie_word_embeddings)
        w->lm_head = w->embed;
    free(spec);
    return PL_OK;
}

void weights_free_host(ModelWeights *w) {
    if (!w->device) {
        free(w->dummy_storage);
        free(w->scale_storage);
        w->dummy_storage = w->scale_storage = NULL;
    }
    for (int i = 0; i < w->num_fused; i++)
        free(w->fused[i]);
    free(w->fused);
    w->fused = NULL;
    w->num_fused = 0;
}

void weights_free(ModelWeights *w) {
    if (!w)
        return;
    weights_free_host(w);
    if (w->device && w->dummy_storage)
        w->device->free(w->device, w->dummy_storage);
    if (w->device && w->scale_storage)
        w->device->free(w->device, w->scale_storage);
    free(w->layers);
    memset(w, 0, sizeof *w);
}
