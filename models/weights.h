/* weights.h - (internal to models/) the weight tensors of a Llama-family decoder and how
 * they are bound from a safetensors checkpoint or filled randomly (load-format dummy). */
#ifndef PAGELLM_MODELS_WEIGHTS_H
#define PAGELLM_MODELS_WEIGHTS_H

#include "kernels.h"
#include "model.h"
#include "safetensors.h"

typedef struct {
    Tensor attn_norm;    /* [H] input_layernorm */
    Tensor wq, wk, wv;   /* [Hq*D, H], [Hkv*D, H], [Hkv*D, H] */
    Tensor bq, bk, bv;   /* [Hq*D], [Hkv*D], [Hkv*D]; data NULL when no qkv bias */
    Tensor wo;           /* [H, Hq*D] */
    Tensor mlp_norm;     /* [H] post_attention_layernorm */
    Tensor w_gate, w_up; /* [I, H] */
    Tensor w_down;       /* [H, I] */
} LayerWeights;

typedef struct {
    Tensor embed;         /* [V, H] model.embed_tokens.weight */
    Tensor final_norm;    /* [H] model.norm.weight */
    Tensor lm_head;       /* [V, H] lm_head.weight, or the embedding when tied */
    LayerWeights *layers; /* [num_layers] */
    void *dummy_storage;  /* owned buffer behind dummy weights, NULL for mmapped ones */
} ModelWeights;

/* Bind every tensor the config needs from `ck` (tensor data stays in the mapping), checking
 * presence, shape and dtype (F32, F16 or BF16). Errors name the checkpoint file and tensor. */
Status weights_bind(const ModelConfig *cfg, const StCheckpoint *ck, ModelWeights *w);

/* Random weights of the config's shape in cfg->torch_dtype (deterministic in `seed`):
 * projections ~ U(-a, a) with a = 1/sqrt(fan_in), norms 1, biases small. */
Status weights_dummy(const ModelConfig *cfg, uint64_t seed, ModelWeights *w);

/* Release the host buffer behind dummy weights once they were copied to a device (the
 * tensor structs, now pointing at device memory, stay). */
void weights_free_host(ModelWeights *w);

/* Free what weights_bind / weights_dummy allocated (not the checkpoint). */
void weights_free(ModelWeights *w);

#endif
