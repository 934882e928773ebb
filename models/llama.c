/* llama.c - the Llama-family decoder (Llama 2/3, Mistral, Qwen2, Qwen3, the mixture-of-experts
 * Mixtral and Qwen3-MoE, Gemma 2 / 3 and Phi-3 / 4): load and forward pass.
 *
 * Gemma's layer differs by a norm after the attention and one after the MLP (their outputs are
 * normed before the residual add), GeGLU, the embedding times sqrt(hidden), soft-capped
 * attention and final logits (Gemma 2) and sliding-window layers (Gemma 3 with a RoPE base of
 * their own); Phi-3 by partial rotation and LongRoPE. The sliding window (Mistral, Qwen2,
 * Gemma) is an attention argument: each sliding layer reads the last W positions at any
 * length; when every layer slides the block manager releases the KV blocks behind the window
 * (model_kv_window).
 *
 * The forward pass is a fixed sequence of KernelOps calls over a packed batch (prefill
 * chunks and decode tokens of many sequences together), with K/V written to and read from
 * the paged, block-major cache, activations in the backend's act dtype and logits widened
 * to fp32 at the end. Scratch activations are allocated once at load for max_num_tokens rows;
 * model_forward allocates nothing and copies nothing from the host, so a backend can record
 * it as a graph. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "quant.h"
#include "safetensors.h"
#include "weights.h"

struct Model {
    ModelConfig cfg;   /* the whole model's */
    ModelConfig local; /* this tensor-parallel rank's heads and MLP columns */
    ModelShard shard;
    const KernelOps *ops;
    StCheckpoint *ckpt; /* NULL for dummy weights */
    ModelWeights w;     /* tensor data in backend memory */
    void **uploaded;    /* device copies of the weights (NULL on a host-memory backend) */
    int num_uploaded;
    float *inv_freq;       /* [rot_dim / 2], backend memory */
    float *long_inv_freq;  /* LongRoPE's long factors' (NULL: none) */
    float *local_inv_freq; /* Gemma 3's sliding layers' (NULL: none) */
    Rope rope, rope_local;
    int max_num_tokens;
    /* scratch in backend memory (act dtype), rows = max_num_tokens */
    void *residual; /* [T, H] */
    void *normed;   /* [T, H] */
    void *qkv;      /* [T, (Hq + 2 Hkv) D] fused projection */
    void *q;        /* [T, Hq * D] rotated queries */
    void *attn;     /* [T, Hq * D] */
    void *proj;     /* [T, H]: attention-out, then MLP-down */
    void *gate_up;  /* [T, 2 I] fused projection */
    void *act;      /* [T, I] silu(gate) * up */
    void *picked;   /* [T, H]: normed rows whose logits are wanted */
    void *logits;   /* [T, V] in act dtype, before widening (unused when act is F32); with
                     * tensor parallelism every rank's LM-head slice [size, T, num_vocab] */
    void *moe_ws;   /* the backend's moe_mlp workspace for T rows (NULL: none needed) */
    size_t moe_ws_bytes;
    size_t scratch_bytes;
    float *kv_scale; /* fp8 KV cache: [2 L] k and v scales of each layer (host); else NULL */
};

static Status alloc_scratch(Model *m) {
    const ModelConfig *c = &m->local;
    const KernelOps *ops = m->ops;
    size_t t = (size_t)m->max_num_tokens * pl_dtype_size(ops->act);
    size_t logits = m->shard.size > 1    ? (size_t)m->shard.size * m->shard.num_vocab
                    : ops->act == DT_F32 ? 0
                                         : (size_t)c->vocab_size;
    size_t qd = (size_t)c->num_heads * c->head_dim, kvd = (size_t)c->num_kv_heads * c->head_dim;
    int dense = 0; /* a layer with the dense MLP, whose scratch is below (Mixtral has none) */
    for (int l = 0; l < c->num_layers; l++)
        dense |= !model_layer_is_moe(c, l);
    const size_t inter = dense ? (size_t)c->intermediate_size : 0;
    m->moe_ws_bytes =
        c->num_experts > 0
            ? ops->moe_workspace_bytes(ops, m->max_num_tokens, c->num_experts, c->hidden_size,
                                       m->shard.moe_intermediate, c->num_experts_per_tok)
            : 0;
    struct {
        void **p;
        size_t bytes;
    } s[] = {{&m->residual, t * c->hidden_size},
             {&m->normed, t * c->hidden_size},
             {&m->qkv, t * (qd + 2 * kvd)},
             {&m->q, t * qd},
             {&m->attn, t * qd},
             {&m->proj, t * c->hidden_size},
             {&m->gate_up, t * 2 * inter},
             {&m->act, t * inter},
             {&m->picked, t * c->hidden_size},
             {&m->logits, t * logits},
             {&m->moe_ws, m->moe_ws_bytes}};
    for (size_t i = 0; i < sizeof s / sizeof *s; i++) {
        m->scratch_bytes += s[i].bytes;
        if (s[i].bytes && !(*s[i].p = ops->alloc(ops, s[i].bytes)))
            return pl_error_set(PL_ERR_NOMEM,
                                "not enough %s memory for the activations of %d batched tokens "
                                "(%.2f GiB): lower max-num-batched-tokens",
                                ops->name, m->max_num_tokens, (double)m->scratch_bytes / PL_GIB);
    }
    return PL_OK;
}

/* Every weight tensor of the model (tied LM head included once: it shares the embedding). */
static int list_tensors(ModelWeights *w, int num_layers, Tensor **out) {
    int n = 0;
    out[n++] = &w->embed;
    out[n++] = &w->final_norm;
    if (w->lm_head.data != w->embed.data)
        out[n++] = &w->lm_head;
    for (int l = 0; l < num_layers; l++) {
        LayerWeights *lw = &w->layers[l];
        Tensor *t[LAYER_MAX_TENSORS] = {&lw->attn_norm,
                                        &lw->wqkv,
                                        &lw->bqkv,
                                        &lw->wo,
                                        &lw->mlp_norm,
                                        &lw->w_gate_up,
                                        &lw->w_down,
                                        &lw->q_norm,
                                        &lw->k_norm,
                                        &lw->router,
                                        &lw->experts_gate_up,
                                        &lw->experts_down,
                                        &lw->post_attn_norm,
                                        &lw->post_mlp_norm};
        for (size_t i = 0; i < sizeof t / sizeof *t; i++)
            if (t[i]->data)
                out[n++] = t[i];
    }
    return n;
}

static size_t tensor_bytes(const Tensor *t) {
    size_t n = pl_dtype_size(t->dtype);
    for (int d = 0; d < t->ndim; d++)
        n *= (size_t)t->shape[d];
    return n;
}

/* Gemma's norm weights (1 + w, F32 from weights_bind) stay F32 on 16-bit backends. */
static int keep_f32(const Model *m, const Tensor *t) {
    return m->cfg.gemma && t->ndim == 1 && t->dtype == DT_F32;
}

/* Bytes of an fp8 weight's scales (0 for other tensors). */
static size_t scale_bytes(const Tensor *t) {
    return quant_scale_count(t) * sizeof(float);
}

/* Copy the weights into backend memory (once, at load) unless the backend reads host
 * memory; the host copies (mapping or dummy buffer) are released afterwards. With 16-bit
 * activations every weight goes up in that dtype (the GEMMs multiply bf16 by bf16, or f16 by
 * f16), except fp8 weights, which go up as they are with their fp32 scales. */
static Status upload_weights(Model *m) {
    if (m->ops->host_memory || m->w.device)
        return PL_OK;
    Tensor **list = pl_xmalloc((size_t)(3 + LAYER_MAX_TENSORS * m->cfg.num_layers) * sizeof *list);
    int n = list_tensors(&m->w, m->cfg.num_layers, list);
    int tied = m->w.lm_head.data == m->w.embed.data;
    m->uploaded = pl_xcalloc((size_t)(2 * n), sizeof *m->uploaded);
    int widen = m->ops->act != DT_F32; /* every weight goes up in the 16-bit act dtype, */
    size_t total = 0, done = 0;
    for (int i = 0; i < n; i++) /* except Gemma's (1 + w) norms: fp32 math, as transformers' */
        total += list[i]->dtype == DT_F8E4M3
                     ? tensor_bytes(list[i]) + scale_bytes(list[i])
                     : tensor_bytes(list[i]) / pl_dtype_size(list[i]->dtype) *
                           (widen && !keep_f32(m, list[i]) ? 2 : pl_dtype_size(list[i]->dtype));
    for (int i = 0; i < n; i++) {
        void *converted = NULL;
        size_t sb = scale_bytes(list[i]);
        if (sb) {
            float *dev = m->ops->alloc(m->ops, sb);
            if (!dev) {
                free(list);
                return pl_error_set(PL_ERR_NOMEM, "out of %s memory for the fp8 scales",
                                    m->ops->name);
            }
            m->ops->to_device(m->ops, dev, list[i]->fp8.w_scale, sb);
            m->uploaded[m->num_uploaded++] = dev;
            list[i]->fp8.w_scale = dev;
            done += sb;
        }
        if (widen && list[i]->dtype != m->ops->act && list[i]->dtype != DT_F8E4M3 &&
            !keep_f32(m, list[i])) {
            converted = weights_to_16bit(list[i], m->ops->act);
            list[i]->data = converted;
            list[i]->dtype = m->ops->act;
        }
        size_t bytes = tensor_bytes(list[i]);
        void *dev = m->ops->alloc(m->ops, bytes);
        if (!dev) {
            free(converted);
            free(list);
            return pl_error_set(PL_ERR_NOMEM,
                                "the weights need %.2f GiB of %s memory; only %.2f GiB fit "
                                "(a smaller model, or tensor-parallel-size > 1)",
                                (double)total / PL_GIB, m->ops->name, (double)done / PL_GIB);
        }
        done += bytes;
        m->ops->to_device(m->ops, dev, list[i]->data, bytes);
        free(converted);
        m->uploaded[m->num_uploaded++] = dev;
        list[i]->data = dev;
    }
    if (tied)
        m->w.lm_head = m->w.embed; /* data and (converted) dtype */
    free(list);
    weights_free_host(&m->w);
    st_close(m->ckpt);
    m->ckpt = NULL;
    return PL_OK;
}

/* Vocabulary slices are a multiple of this many rows, so that every rank's logits start
 * aligned in the gathered [size, T, slice] buffer. */
enum { VOCAB_SLICE_ALIGN = 8 };

Status model_shard(const ModelConfig *c, int rank, int size, ModelShard *out) {
    const int moe_inter = c->num_experts > 0 ? c->moe_intermediate_size : 0;
    if (size <= 1) {
        *out = (ModelShard){.rank = 0,
                            .size = 1,
                            .num_heads = c->num_heads,
                            .num_kv_heads = c->num_kv_heads,
                            .intermediate = c->intermediate_size,
                            .num_vocab = c->vocab_size,
                            .moe_intermediate = moe_inter};
        return PL_OK;
    }
    if (c->num_heads % size || c->intermediate_size % size ||
        (c->num_kv_heads % size && size % c->num_kv_heads))
        return pl_error_set(PL_ERR_INVALID,
                            "tensor-parallel-size %d does not split this model: %d attention "
                            "heads, %d KV heads and intermediate size %d must divide by it (or "
                            "the KV heads divide it)",
                            size, c->num_heads, c->num_kv_heads, c->intermediate_size);
    if (moe_inter % size)
        return pl_error_set(PL_ERR_INVALID,
                            "tensor-parallel-size %d does not split this model: the experts' "
                            "intermediate size %d must divide by it",
                            size, moe_inter);
    ModelShard s = {.rank = rank, .size = size};
    s.moe_intermediate = moe_inter / size;
    s.first_moe_inter = rank * s.moe_intermediate;
    s.num_heads = c->num_heads / size;
    s.first_head = rank * s.num_heads;
    s.intermediate = c->intermediate_size / size;
    s.first_inter = rank * s.intermediate;
    s.num_vocab = (c->vocab_size + size - 1) / size;
    s.num_vocab = (s.num_vocab + VOCAB_SLICE_ALIGN - 1) / VOCAB_SLICE_ALIGN * VOCAB_SLICE_ALIGN;
    s.first_vocab = rank * s.num_vocab;
    if (c->num_kv_heads >= size) {
        s.num_kv_heads = c->num_kv_heads / size;
        s.first_kv_head = rank * s.num_kv_heads;
    } else { /* replicated: the one KV head this rank's query heads read */
        s.num_kv_heads = 1;
        s.first_kv_head = s.first_head / (c->num_heads / c->num_kv_heads);
    }
    *out = s;
    return PL_OK;
}

/* A table of `count` floats in backend memory (NULL when out of it). */
static float *upload_floats(const Model *m, const float *host, int count) {
    size_t bytes = (size_t)count * sizeof(float);
    float *dev = m->ops->alloc(m->ops, bytes);
    if (dev)
        m->ops->to_device(m->ops, dev, host, bytes);
    return dev;
}

/* The RoPE tables (k_rope_freqs): the model's (with LongRoPE's long table too), and Gemma 3's
 * sliding layers' of their own base. */
static Status setup_rope(Model *m) {
    const ModelConfig *c = &m->cfg;
    const int rot = c->rotary_dim > 0 ? c->rotary_dim : c->head_dim, half = rot / 2;
    const int longrope = c->rope_scaling.type == ROPE_LONGROPE;
    float *freq = pl_xmalloc(2 * (size_t)half * sizeof *freq);
    float att = k_rope_freqs(freq, freq + half, rot, c->rope_theta, &c->rope_scaling);
    m->inv_freq = upload_floats(m, freq, half);
    if (longrope)
        m->long_inv_freq = upload_floats(m, freq + half, half);
    if (c->rope_local_theta > 0) {
        k_rope_freqs(freq, NULL, rot, c->rope_local_theta, NULL);
        m->local_inv_freq = upload_floats(m, freq, half);
    }
    free(freq);
    if (!m->inv_freq || (longrope && !m->long_inv_freq) ||
        (c->rope_local_theta > 0 && !m->local_inv_freq))
        return pl_error_set(PL_ERR_NOMEM, "out of %s memory", m->ops->name);
    /* LongRoPE: the long factors from original_max_position_embeddings on, per position (see
     * docs/ARCHITECTURE.md: transformers switches the whole sequence once it is longer) */
    m->rope = (Rope){.head_dim = c->head_dim,
                     .inv_freq = m->inv_freq,
                     .rot_dim = rot,
                     .attn_factor = att,
                     .long_inv_freq = m->long_inv_freq,
                     .long_from = c->rope_scaling.original_max_position};
    m->rope_local = m->rope;
    if (m->local_inv_freq)
        m->rope_local =
            (Rope){.head_dim = c->head_dim, .inv_freq = m->local_inv_freq, .rot_dim = rot};
    return PL_OK;
}

/* A scalar scale tensor of the checkpoint (shape [], [1] or [1, 1]; F32, BF16 or F16) into
 * *out; absent: *out unchanged. It must be finite and positive. */
static Status read_scale(const StCheckpoint *ck, const char *name, float *out) {
    const StTensor *t = st_find(ck, name);
    if (!t)
        return PL_OK;
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    if (n != 1 || !(t->dtype == DT_F32 || t->dtype == DT_BF16 || t->dtype == DT_F16))
        return pl_error_set(PL_ERR_FORMAT, "%s: tensor %s must be one F32, BF16 or F16 value",
                            t->file, name);
    uint32_t u32;
    uint16_t u16;
    float v;
    if (t->dtype == DT_F32) {
        memcpy(&u32, t->data, 4);
        memcpy(&v, &u32, 4);
    } else {
        memcpy(&u16, t->data, 2);
        v = t->dtype == DT_BF16 ? pl_bf16_to_f32(u16) : pl_f16_to_f32(u16);
    }
    if (!(v > 0.0f) || !isfinite(v))
        return pl_error_set(PL_ERR_FORMAT, "%s: KV-cache scale %s is %g, not a positive number",
                            t->file, name, (double)v);
    *out = v;
    return PL_OK;
}

/* The fp8 KV cache's per-layer scales, as vLLM reads them: self_attn.k_scale / v_scale (or
 * compressed-tensors' k_proj.output_scale / v_proj.output_scale), 1 where absent or with dummy
 * weights. */
static Status load_kv_scales(Model *m) {
    const int L = m->cfg.num_layers;
    m->kv_scale = pl_xmalloc((size_t)2 * L * sizeof(float));
    for (int i = 0; i < 2 * L; i++)
        m->kv_scale[i] = 1.0f;
    if (!m->ckpt)
        return PL_OK;
    static const char *const names[2][2] = {{"k_scale", "k_proj.output_scale"},
                                            {"v_scale", "v_proj.output_scale"}};
    char name[256];
    for (int l = 0; l < L; l++)
        for (int v = 0; v < 2; v++)
            for (int alt = 1; alt >= 0; alt--) { /* the plain name wins when both are there */
                snprintf(name, sizeof name, "model.layers.%d.self_attn.%s", l, names[v][alt]);
                Status st = read_scale(m->ckpt, name, &m->kv_scale[2 * l + v]);
                if (st != PL_OK)
                    return st;
            }
    return PL_OK;
}

Status model_load(const ModelLoadOptions *opt, Model **out) {
    *out = NULL;
    if (opt->max_num_tokens <= 0)
        return pl_error_set(PL_ERR_INVALID, "max_num_tokens must be positive");
    PL_CHECK(opt->ops != NULL);
    Model *m = pl_xcalloc(1, sizeof *m);
    m->ops = opt->ops;
    m->max_num_tokens = opt->max_num_tokens;
    Status st = model_config_load(opt->dir, &m->cfg);
    if (st == PL_OK)
        st = model_shard(&m->cfg, opt->tp_rank, opt->tp_size, &m->shard);
    if (st == PL_OK && m->shard.size > 1 &&
        !(m->ops->all_reduce && m->ops->all_reduce_add_rmsnorm && m->ops->all_gather &&
          m->ops->embedding_slice && m->ops->vocab_logits_f32))
        st = pl_error_set(PL_ERR_UNSUPPORTED,
                          "tensor-parallel-size %d: the %s backend has no "
                          "all-reduce (needs CUDA with NCCL)",
                          m->shard.size, m->ops->name);
    if (st == PL_OK && m->cfg.num_experts > 0 && !m->ops->moe_mlp)
        st = pl_error_set(PL_ERR_UNSUPPORTED, "%s: the %s backend has no mixture-of-experts op",
                          m->cfg.architecture, m->ops->name);
    if (st == PL_OK && opt->quantization && strcmp(opt->quantization, "fp8"))
        st = pl_error_set(PL_ERR_UNSUPPORTED, "quantization '%s' is not supported (supported: fp8)",
                          opt->quantization);
    if (st == PL_OK && m->cfg.num_experts > 0 && (m->cfg.quant.method || opt->quantization))
        st = pl_error_set(
            PL_ERR_UNSUPPORTED, "%s: %s: mixture-of-experts models are not supported in fp8 yet",
            m->cfg.architecture,
            opt->quantization ? "quantization fp8" : "config.json quantization_config");
    /* quantization: fp8 quantizes a 16/32-bit checkpoint; an fp8 one loads as it is */
    if (st == PL_OK && opt->quantization && m->cfg.quant.method == QUANT_NONE)
        m->cfg.quant = (ModelQuant){.method = QUANT_ONLINE_FP8, .weight_scales = FP8_SCALE_CHANNEL};
    if (st != PL_OK)
        goto fail;
    m->local = m->cfg;
    m->local.num_heads = m->shard.num_heads;
    m->local.num_kv_heads = m->shard.num_kv_heads;
    m->local.intermediate_size = m->shard.intermediate;
    m->local.moe_intermediate_size = m->shard.moe_intermediate;
    if (opt->load_dummy) {
        st = weights_dummy(&m->cfg, opt->seed,
                           m->ops->host_memory || !m->ops->fill_dummy ? NULL : m->ops, &m->shard,
                           &m->w);
    } else {
        st = st_open(opt->dir, &m->ckpt);
        if (st == PL_OK)
            st = weights_bind(&m->cfg, m->ckpt, &m->shard, &m->w);
    }
    if (st == PL_OK)
        st = upload_weights(m);
    if (st == PL_OK && opt->kv_cache_fp8)
        st = load_kv_scales(m);
    if (st != PL_OK)
        goto fail;
    if ((st = setup_rope(m)) != PL_OK)
        goto fail;
    if ((st = alloc_scratch(m)) != PL_OK)
        goto fail;
    *out = m;
    return PL_OK;
fail:
    model_destroy(m);
    return st;
}

void model_destroy(Model *m) {
    if (!m)
        return;
    const KernelOps *ops = m->ops;
    for (int i = 0; i < m->num_uploaded; i++)
        ops->free(ops, m->uploaded[i]);
    free(m->uploaded);
    free(m->kv_scale);
    weights_free(&m->w);
    st_close(m->ckpt);
    void *scratch[] = {
        m->inv_freq, m->long_inv_freq, m->local_inv_freq, m->residual, m->normed, m->qkv,
        m->q,        m->attn,          m->proj,           m->gate_up,  m->act,    m->picked,
        m->logits,   m->moe_ws};
    for (size_t i = 0; i < sizeof scratch / sizeof *scratch; i++)
        if (scratch[i])
            ops->free(ops, scratch[i]);
    free(m);
}

const ModelConfig *model_config(const Model *m) {
    return &m->cfg;
}

KvLayout model_kv_layout(const Model *m, int block_size) {
    return (KvLayout){.num_layers = m->cfg.num_layers,
                      .num_kv_heads = m->local.num_kv_heads,
                      .head_dim = m->cfg.head_dim,
                      .block_size = block_size,
                      .dtype = m->kv_scale ? DT_F8E4M3 : m->ops->act,
                      .kv_scale = m->kv_scale};
}

/* x rounded to the act dtype (transformers' normalizer tensor of the hidden states' dtype). */
static float act_round(DType act, double x) {
    if (act == DT_BF16)
        return pl_bf16_to_f32(pl_f32_to_bf16((float)x));
    if (act == DT_F16)
        return pl_f16_to_f32(pl_f32_to_f16((float)x));
    return (float)x;
}

static const Tensor *bias_or_null(const Tensor *b) {
    return b->data ? b : NULL;
}

/* residual += m->proj (summed over the ranks first when they hold partial sums), then normed =
 * rmsnorm(residual) * norm. */
static void add_norm(Model *m, const Tensor *norm, int n) {
    const ModelConfig *c = &m->local;
    const KernelOps *ops = m->ops;
    if (m->shard.size > 1)
        ops->all_reduce_add_rmsnorm(ops, m->residual, m->proj, m->normed, norm, n, c->hidden_size,
                                    c->rms_norm_eps);
    else
        ops->add_rmsnorm(ops, m->residual, m->proj, m->normed, norm, n, c->hidden_size,
                         c->rms_norm_eps);
}

/* Whether the projection w reading the next block boundary's normed rows takes the residual
 * add and norm into one op with it (add_rmsnorm_matmul: for an fp8 w the backend may quantize
 * the rows as the norm writes them); NULL w: nothing known reads them but the LM head. */
static int fuses_norm(const Model *m, const Tensor *w) {
    return w && w->dtype == DT_F8E4M3 && m->ops->add_rmsnorm_matmul && m->shard.size == 1;
}

/* The block boundary after m->proj: residual += proj and normed = rmsnorm(residual) * norm now,
 * or, returning 1, left pending for the projection `next` to do (project_normed). */
static int finish_add_norm(Model *m, const Tensor *norm, int n, const Tensor *next) {
    if (fuses_norm(m, next))
        return 1;
    add_norm(m, norm, n);
    return 0;
}

/* out = normed w^T (+ bias); with `pending`, the block boundary left by finish_add_norm (norm
 * `norm`) in one op with it. */
static void project_normed(Model *m, void *out, const Tensor *w, const Tensor *bias,
                           const Tensor *norm, int pending, int n) {
    const KernelOps *ops = m->ops;
    if (pending)
        ops->add_rmsnorm_matmul(ops, out, m->residual, m->proj, m->normed, norm, w, bias, n,
                                m->local.rms_norm_eps);
    else
        ops->matmul(ops, out, m->normed, w, bias, n);
}

/* residual += x w^T (a row-parallel projection), then normed = rmsnorm(residual) * norm (or
 * left pending for `next`, as finish_add_norm); one op where the backend fuses them. The fused
 * matmul ops (here and in mlp_activation) are used for 16/32-bit weights only: fp8 weights take
 * the plain matmul, the one op every backend implements for them (attention_input's qkv op
 * also takes fp8 at the rows the backend names). */
static int project_add_norm(Model *m, const Tensor *w, const void *x, const Tensor *norm, int n,
                            const Tensor *next) {
    const KernelOps *ops = m->ops;
    if (!fuses_norm(m, next) && m->shard.size == 1 && ops->matmul_add_rmsnorm &&
        w->dtype != DT_F8E4M3) {
        ops->matmul_add_rmsnorm(ops, m->residual, m->normed, m->proj, x, w, norm, n,
                                m->local.rms_norm_eps);
        return 0;
    }
    ops->matmul(ops, m->proj, x, w, NULL, n);
    return finish_add_norm(m, norm, n, next);
}

/* Gemma's block end: proj = x w^T (summed over the ranks), normed by `post` (in place) before
 * the residual add, then normed = rmsnorm(residual) * next. */
static void project_norm_add_norm(Model *m, const Tensor *w, const void *x, const Tensor *post,
                                  const Tensor *next, int n) {
    const ModelConfig *c = &m->local;
    const KernelOps *ops = m->ops;
    ops->matmul(ops, m->proj, x, w, NULL, n);
    if (m->shard.size > 1)
        ops->all_reduce(ops, m->proj, (size_t)n * c->hidden_size);
    ops->rmsnorm(ops, m->proj, m->proj, post, n, c->hidden_size, c->rms_norm_eps);
    ops->add_rmsnorm(ops, m->residual, m->proj, m->normed, next, n, c->hidden_size,
                     c->rms_norm_eps);
}

/* The attention block's input: q rotated into m->q, k and v of layer l into the cache (one
 * fused op where the backend has it); `pending`: the pre-norm is still to do
 * (finish_add_norm). */
static void attention_input(Model *m, const LayerWeights *lw, const AttnBatch *batch,
                            void *kv_cache, const KvLayout *kv_layout, int l, const Rope *rope,
                            int pending) {
    const KernelOps *ops = m->ops;
    const int n = batch->num_tokens, nh = m->local.num_heads; /* this rank's heads */
    const QkNorm qk = {lw->q_norm, lw->k_norm, m->local.rms_norm_eps};
    const QkNorm *qk_norm = lw->q_norm.data ? &qk : NULL;
    const int fp8 = lw->wqkv.dtype == DT_F8E4M3;
    if (ops->matmul_qkv_rope_cache && (fp8 ? n <= ops->fused_fp8_max_rows : !pending)) {
        const AddNormIn pre = {m->residual, m->proj, &lw->attn_norm, m->local.rms_norm_eps};
        ops->matmul_qkv_rope_cache(ops, m->q, m->qkv, m->normed, pending ? &pre : NULL, &lw->wqkv,
                                   bias_or_null(&lw->bqkv), batch->positions, batch->slot_mapping,
                                   n, nh, rope, qk_norm, kv_cache, kv_layout, l);
        return;
    }
    project_normed(m, m->qkv, &lw->wqkv, bias_or_null(&lw->bqkv), &lw->attn_norm, pending, n);
    ops->qkv_rope_cache(ops, m->q, m->qkv, batch->positions, batch->slot_mapping, n, nh, rope,
                        qk_norm, kv_cache, kv_layout, l);
}

/* The MLP's activation: m->act = silu(gate) * up of the normed rows (one fused op where the
 * backend has it); `pending`: the pre-norm is still to do (finish_add_norm). */
static void mlp_activation(Model *m, const LayerWeights *lw, int n, int pending) {
    const KernelOps *ops = m->ops;
    if (m->local.gelu) { /* GeGLU */
        project_normed(m, m->gate_up, &lw->w_gate_up, NULL, &lw->mlp_norm, pending, n);
        ops->gelu_tanh_mul(ops, m->act, m->gate_up, n, m->local.intermediate_size);
        return;
    }
    if (!pending && ops->matmul_silu_mul && lw->w_gate_up.dtype != DT_F8E4M3) {
        ops->matmul_silu_mul(ops, m->act, m->gate_up, m->normed, &lw->w_gate_up, n);
        return;
    }
    project_normed(m, m->gate_up, &lw->w_gate_up, NULL, &lw->mlp_norm, pending, n);
    ops->silu_mul(ops, m->act, m->gate_up, n, m->local.intermediate_size);
}

/* The MLP block of layer lw on the normed rows (`pending`: its pre-norm still to do), its
 * output added to the residual stream and normed by `next` (the next layer's pre-norm or the
 * final norm), or that left pending for the projection next_w (returns 1, as
 * finish_add_norm): a dense SwiGLU MLP, or a mixture of experts in one op (its partial sums
 * all-reduced with tensor parallelism). */
static int mlp_block(Model *m, const LayerWeights *lw, const Tensor *next, int n, int pending,
                     const Tensor *next_w) {
    const ModelConfig *c = &m->local;
    const KernelOps *ops = m->ops;
    if (c->gemma) {
        mlp_activation(m, lw, n, pending);
        project_norm_add_norm(m, &lw->w_down, m->act, &lw->post_mlp_norm, next, n);
        return 0;
    }
    if (!lw->moe) {
        if (!c->gelu && lw->w_down.dtype == DT_F8E4M3 && ops->silu_mul_matmul) {
            /* fp8: the activation quantized for the down projection as it is written */
            project_normed(m, m->gate_up, &lw->w_gate_up, NULL, &lw->mlp_norm, pending, n);
            ops->silu_mul_matmul(ops, m->proj, m->act, m->gate_up, &lw->w_down, n);
            return finish_add_norm(m, next, n, next_w);
        }
        mlp_activation(m, lw, n, pending);
        return project_add_norm(m, &lw->w_down, m->act, next, n, next_w);
    }
    ops->moe_mlp(ops, m->proj, m->normed, &lw->router, &lw->experts_gate_up, &lw->experts_down, n,
                 c->num_experts_per_tok, c->norm_topk_prob, m->moe_ws, m->moe_ws_bytes);
    return finish_add_norm(m, next, n, next_w);
}

/* Vocabulary-parallel LM head: this rank's logits slice for the picked rows, written in place
 * into its part of the gathered buffer, gathered from every rank and reordered to
 * logits[num_logits, vocab] (fp32). */
static void lm_head_parallel(Model *m, int num_logits, float *logits) {
    const KernelOps *ops = m->ops;
    size_t part = (size_t)num_logits * m->shard.num_vocab;
    char *mine = (char *)m->logits + (size_t)m->shard.rank * part * pl_dtype_size(ops->act);
    ops->matmul(ops, mine, m->picked, &m->w.lm_head, NULL, num_logits);
    ops->all_gather(ops, m->logits, mine, part);
    ops->vocab_logits_f32(ops, logits, m->logits, num_logits, m->cfg.vocab_size, m->shard.num_vocab,
                          m->shard.size);
}

void model_forward(Model *m, const int32_t *token_ids, const AttnBatch *batch, void *kv_cache,
                   const KvLayout *kv_layout, const int32_t *logits_rows, int num_logits,
                   float *logits) {
    const ModelConfig *c = &m->local; /* this rank's heads and MLP columns */
    const KernelOps *ops = m->ops;
    const int n = batch->num_tokens, hidden = c->hidden_size;
    const float scale = c->query_pre_attn_scalar > 0
                            ? (float)pow((double)c->query_pre_attn_scalar, -0.5)
                            : 1.0f / sqrtf((float)c->head_dim);
    PL_CHECK(n > 0 && n <= m->max_num_tokens);

    if (m->shard.size > 1) { /* vocabulary-parallel: each id's row is on one rank */
        ops->embedding_slice(ops, m->residual, token_ids, n, &m->w.embed, m->shard.first_vocab);
        ops->all_reduce(ops, m->residual, (size_t)n * hidden);
    } else {
        ops->embedding(ops, m->residual, token_ids, n, &m->w.embed);
    }
    if (c->gemma) /* times sqrt(hidden), that factor rounded to the act dtype as transformers' */
        ops->scale(ops, m->residual, (size_t)n * hidden, act_round(ops->act, sqrt((double)hidden)));
    ops->rmsnorm(ops, m->normed, m->residual, &m->w.layers[0].attn_norm, n, hidden,
                 c->rms_norm_eps);
    int pending = 0; /* a block boundary left for the projection after it */
    for (int l = 0; l < c->num_layers; l++) {
        const LayerWeights *lw = &m->w.layers[l];
        const int window = model_layer_window(c, l);
        attention_input(m, lw, batch, kv_cache, kv_layout, l, window ? &m->rope_local : &m->rope,
                        pending);
        ops->attention(ops, m->attn, m->q, kv_cache, kv_layout, l, batch, c->num_heads, scale,
                       c->attn_softcap, window);
        if (c->gemma) {
            project_norm_add_norm(m, &lw->wo, m->attn, &lw->post_attn_norm, &lw->mlp_norm, n);
            pending = 0;
        } else {
            pending = project_add_norm(m, &lw->wo, m->attn, &lw->mlp_norm, n,
                                       lw->moe ? NULL : &lw->w_gate_up);
        }
        /* then the next layer's pre-norm; after the last layer the final norm, if logits are
         * wanted (else nothing reads the last MLP's output) */
        if (l + 1 < c->num_layers)
            pending = mlp_block(m, lw, &m->w.layers[l + 1].attn_norm, n, pending,
                                c->gemma ? NULL : &m->w.layers[l + 1].wqkv);
        else if (num_logits > 0)
            pending = mlp_block(m, lw, &m->w.final_norm, n, pending, NULL);
    }
    if (num_logits == 0)
        return;
    ops->gather_rows(ops, m->picked, m->normed, logits_rows, num_logits, hidden);
    if (m->shard.size > 1) {
        lm_head_parallel(m, num_logits, logits);
    } else if (ops->act == DT_F32) {
        ops->matmul(ops, logits, m->picked, &m->w.lm_head, NULL, num_logits);
    } else {
        ops->matmul(ops, m->logits, m->picked, &m->w.lm_head, NULL, num_logits);
        ops->to_f32(ops, logits, m->logits, (size_t)num_logits * c->vocab_size);
    }
    if (c->final_softcap > 0) /* Gemma 2 */
        ops->logits_softcap(ops, logits, (size_t)num_logits * c->vocab_size, c->final_softcap);
}

size_t model_weight_bytes(const Model *m) {
    Tensor *list[3 + LAYER_MAX_TENSORS * m->cfg.num_layers];
    ModelWeights w = m->w;
    int n = list_tensors(&w, m->cfg.num_layers, list);
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += tensor_bytes(list[i]) + scale_bytes(list[i]);
    return total;
}

void model_weight_format(const Model *m, char *buf, size_t size) {
    Tensor *list[3 + LAYER_MAX_TENSORS * m->cfg.num_layers];
    ModelWeights w = m->w;
    int n = list_tensors(&w, m->cfg.num_layers, list), fp8 = 0;
    for (int i = 0; i < n; i++)
        fp8 += list[i]->dtype == DT_F8E4M3;
    if (!fp8) {
        snprintf(buf, size, "%s", pl_dtype_name(w.embed.dtype));
        return;
    }
    char q[192];
    quant_describe(&m->cfg.quant, 1, q, sizeof q);
    int k = snprintf(buf, size, "%s; embeddings, norms and LM head %s", q,
                     pl_dtype_name(w.embed.dtype));
    if (w.requantized > 0 && k > 0 && (size_t)k < size)
        snprintf(buf + k, size - (size_t)k,
                 "; %d fused layers requantized per channel (parts off the block grid)",
                 w.requantized);
}

size_t model_activation_bytes(const Model *m) {
    return m->scratch_bytes;
}
