/* weights.h - (internal to models/) the weight tensors of a Llama-family decoder and how
 * they are bound from a safetensors checkpoint or filled randomly (load-format dummy). */
#ifndef PAGELLM_MODELS_WEIGHTS_H
#define PAGELLM_MODELS_WEIGHTS_H

#include "kernels.h"
#include "model.h"
#include "safetensors.h"

/* q/k/v and gate/up projections are fused (their rows concatenated in that order), so each
 * pair or triple is one GEMM over the same input. */
typedef struct {
    Tensor attn_norm;      /* [H] input_layernorm */
    Tensor wqkv;           /* [(Hq + 2 Hkv) D, H]: q_proj, k_proj, v_proj rows */
    Tensor bqkv;           /* [(Hq + 2 Hkv) D]; data NULL when no qkv bias */
    Tensor wo;             /* [H, Hq*D] */
    Tensor mlp_norm;       /* [H] post_attention_layernorm (Gemma: pre_feedforward_layernorm) */
    Tensor post_attn_norm; /* [H] Gemma's post_attention_layernorm (of the attention's output) */
    Tensor post_mlp_norm;  /* [H] Gemma's post_feedforward_layernorm */
    Tensor w_gate_up;      /* [2 I, H]: gate_proj rows, then up_proj rows (dense layers) */
    Tensor w_down;         /* [H, I] (dense layers) */
    Tensor q_norm;         /* [D] self_attn.q_norm (Qwen3); data NULL when none */
    Tensor k_norm;         /* [D] self_attn.k_norm */
    /* a mixture-of-experts layer (moe 1): router and the experts' fused projections */
    int moe;
    Tensor router;          /* [E, H] mlp.gate / block_sparse_moe.gate */
    Tensor experts_gate_up; /* [E, 2 Im, H]: expert e's gate_proj (w1) rows, then up_proj (w3) */
    Tensor experts_down;    /* [E, H, Im]: down_proj (w2) */
} LayerWeights;

/* Tensors of one layer at most (list_tensors in llama.c). */
enum { LAYER_MAX_TENSORS = 14 };

typedef struct {
    Tensor embed;            /* [V, H] model.embed_tokens.weight */
    Tensor final_norm;       /* [H] model.norm.weight */
    Tensor lm_head;          /* [V, H] lm_head.weight, or the embedding when tied */
    LayerWeights *layers;    /* [num_layers] */
    void *dummy_storage;     /* owned buffer behind dummy weights, NULL for mmapped ones */
    const KernelOps *device; /* dummy_storage is this backend's memory (NULL: host) */
    void **fused;            /* owned buffers behind the fused tensors of bound weights, and
                              * fp8 weights' scales and quantized data */
    int num_fused;
    void *scale_storage; /* owned buffer behind dummy fp8 weights' scales (memory of `device`) */
    int requantized;     /* fused fp8 layers requantized per channel (block grid mismatch) */
} ModelWeights;

/* Bind every tensor the config needs from `ck`, checking presence, shape and dtype (F32, F16
 * or BF16). Phi-3's fused qkv_proj and gate_up_proj are taken as they are (sliced per rank);
 * Gemma's norm weights w become owned F32 copies of 1 + w (its RMSNorm multiplies by 1 + w in
 * fp32), which stay F32 on every backend. Errors name the checkpoint file and tensor. Unfused
 * tensors stay in the mapping; fused ones are copied into owned buffers (in their dtype, or F32
 * when the parts differ).
 * Projections may be F8_E4M3 as cfg->quant describes (Tensor.fp8 gets their scales, fp32 in
 * owned buffers): fused per-tensor scales become per-channel ones, fused block scales stay
 * when the parts end on block boundaries (else the fused tensor is requantized per channel,
 * w->requantized counts it), and a tensor-parallel cut inside a block is an error. With
 * cfg->quant.method QUANT_ONLINE_FP8 every float projection is quantized per channel.
 * With a shard (NULL: the whole model) only that rank's rows of q/k/v and gate/up and its
 * columns of o_proj and down_proj are taken (columns copied into owned buffers), and its
 * vocabulary rows of the embedding and the LM head (a zero-padded copy when the last slice
 * runs past the vocabulary); norms are whole on every rank. */
Status weights_bind(const ModelConfig *cfg, const StCheckpoint *ck, const ModelShard *shard,
                    ModelWeights *w);

/* Random weights of the config's shape (deterministic in `seed`): projections ~ U(-a, a) with
 * a = 1/sqrt(fan_in), norms 1, biases small. With cfg->quant.method set the projections are
 * fp8 from the start: e4m3 of U(-448, 448) with every scale a / 448 (per channel, or the
 * checkpoint's block / per-tensor layout), dynamic activation scales. device NULL: in host memory,
 * in cfg->torch_dtype. Else filled in place in that backend's memory by its fill_dummy op (no host
 * copy, no upload), in bfloat16 when its activations are bfloat16; the values are the host fill's,
 * converted. A shard (NULL: whole) gets its own shapes; its embedding and LM head are the whole
 * model's rows (padding rows zero), its layers get values seeded by its rank (dummy weights are for
 * speed, not for comparing outputs across sizes). */
Status weights_dummy(const ModelConfig *cfg, uint64_t seed, const KernelOps *device,
                     const ModelShard *shard, ModelWeights *w);

/* A malloc'd copy of a tensor's data in dt, DT_BF16 or DT_F16 (round to nearest even). */
uint16_t *weights_to_16bit(const Tensor *t, DType dt);

/* Release the host buffers behind dummy and fused weights once they were copied to a device
 * (the tensor structs, now pointing at device memory, stay). */
void weights_free_host(ModelWeights *w);

/* Free what weights_bind / weights_dummy allocated (not the checkpoint). */
void weights_free(ModelWeights *w);

#endif
