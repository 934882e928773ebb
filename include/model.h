/* model.h - model configuration (config.json), weights and the forward pass.
 *
 * A Model is a decoder-only transformer of the Llama family (LlamaForCausalLM,
 * MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, the mixture-of-experts
 * MixtralForCausalLM and Qwen3MoeForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM (text) and
 * Phi3ForCausalLM): its config, its weights (mmapped from
 * safetensors, or random for load-format dummy) and its scratch buffers. model_forward runs one
 * step of a batch over the paged KV cache through a backend's KernelOps. */
#ifndef PAGELLM_MODEL_H
#define PAGELLM_MODEL_H

#include <stdint.h>

#include "common.h"
#include "kernels.h"

#define MODEL_MAX_EOS      8
#define MODEL_MAX_MLP_ONLY 256   /* Qwen3-MoE mlp_only_layers entries */
#define MODEL_MAX_LAYERS   1024  /* layers whose attention kind is listed (layer_types) */
#define MODEL_QUANT_IGNORE 16384 /* bytes of a quantization_config's ignore list */

/* How the linear layers (q/k/v, o, gate/up, down projections) are stored (models/quant.c).
 * QUANT_FP8: config.json's quantization_config {quant_method: "fp8"}: e4m3 weights with
 * weight_scale_inv (blocks of weight_block_size) or one weight_scale per tensor.
 * QUANT_COMPRESSED: {quant_method: "compressed-tensors"} with fp8 weights (float, 8 bits) and
 * weight_scale per output channel or per tensor, optional static input_scale.
 * QUANT_ONLINE_FP8: a 16/32-bit checkpoint quantized at load (quantization: fp8): per-channel
 * scales, dynamic per-token activation scales. Embeddings, norms and the LM head are never
 * fp8; a linear layer stored in a float dtype (an ignored one) stays in it. */
typedef enum { QUANT_NONE, QUANT_FP8, QUANT_COMPRESSED, QUANT_ONLINE_FP8 } QuantMethod;
typedef struct {
    QuantMethod method;
    Fp8ScaleKind weight_scales; /* FP8_SCALE_TENSOR, _CHANNEL or _BLOCK */
    int block;                  /* FP8_SCALE_BLOCK: B of the B x B blocks */
    int static_input;           /* activations scaled by the checkpoint's input_scale tensors */
    int num_ignore;             /* modules kept unquantized: names, or "re:" regexes */
    char ignore[MODEL_QUANT_IGNORE]; /* num_ignore NUL-terminated strings, one after another */
} ModelQuant;

typedef struct {
    char architecture[64]; /* "LlamaForCausalLM", ... */
    int hidden_size;
    int intermediate_size;
    int num_layers;
    int num_heads;
    int num_kv_heads;
    int head_dim; /* config "head_dim", else hidden_size / num_heads */
    int vocab_size;
    int max_position_embeddings;
    float rms_norm_eps;
    float rope_theta;
    /* rope_scaling {rope_type: llama3}; factor 0 = no scaling (also in rope_scaling below) */
    float rope_llama3_factor;
    float rope_low_freq_factor;
    float rope_high_freq_factor;
    int rope_original_max_position;
    RopeScaling rope_scaling; /* any type (kernels.h); DEFAULT: none. Gemma 3: the global layers' */
    int rotary_dim;         /* dims of a head that RoPE rotates (partial_rotary_factor: Phi-3/4) */
    float rope_local_theta; /* Gemma 3's sliding layers (unscaled RoPE); 0: as the others */
    /* Gemma 2 / 3 */
    int gemma; /* norms multiply by (1 + w), embedding x sqrt(hidden) (rounded to the act dtype),
                * a norm after attention and after the MLP (post_attention_layernorm,
                * post_feedforward_layernorm; pre_feedforward_layernorm before the MLP) */
    int gelu;  /* the MLP's activation is gelu_pytorch_tanh (GeGLU), not silu */
    float query_pre_attn_scalar; /* attention scale = its^-1/2; 0: head_dim's */
    float attn_softcap;          /* attn_logit_softcapping; 0: none */
    float final_softcap;         /* final_logit_softcapping; 0: none */
    int sliding_window;          /* > 0: the layers layer_sliding marks see the last this many */
    unsigned char layer_sliding[MODEL_MAX_LAYERS]; /* layer_types: 1 = sliding_attention */
    int tie_word_embeddings;
    int qkv_bias; /* Qwen2, or attention_bias: q/k/v projections carry biases */
    int qk_norm;  /* Qwen3: per-head RMSNorm of q and k before RoPE */
    /* Mixture of experts (num_experts 0: a dense MLP in every layer). Layer l is sparse when
     * model_layer_is_moe says so; the others are dense with intermediate_size. */
    int num_experts;           /* Mixtral num_local_experts, Qwen3-MoE num_experts */
    int num_experts_per_tok;   /* top-k */
    int moe_intermediate_size; /* each expert's (Mixtral: intermediate_size) */
    int norm_topk_prob;        /* renormalize the top-k weights (Mixtral: always) */
    int decoder_sparse_step;   /* Qwen3-MoE: layers l with (l + 1) % step == 0 are sparse */
    int num_mlp_only;          /* Qwen3-MoE mlp_only_layers: dense whatever the step */
    int mlp_only_layers[MODEL_MAX_MLP_ONLY];
    DType torch_dtype;                /* dtype the checkpoint declares */
    int bos_token_id;                 /* -1 if none */
    int eos_token_ids[MODEL_MAX_EOS]; /* from generation_config.json, else config.json */
    int num_eos;
    ModelQuant quant; /* quantization_config (method QUANT_NONE without one) */
} ModelConfig;

/* The attention window of layer l: sliding_window on sliding layers, else 0 (all positions). */
int model_layer_window(const ModelConfig *cfg, int layer);

/* The window when every layer slides (Mistral-7B-v0.1), else 0: no layer reads a position more
 * than this far behind the newest, so the KV cache may release what falls out of it. */
int model_kv_window(const ModelConfig *cfg);

/* Whether layer l's MLP is a mixture of experts (else the dense SwiGLU MLP). */
int model_layer_is_moe(const ModelConfig *cfg, int layer);

/* Parse config.json text (`path` names it in errors) into cfg. */
Status model_config_parse(const char *json_text, const char *path, ModelConfig *cfg);

/* Read dir/config.json and, if present, dir/generation_config.json (its eos_token_id,
 * an int or a list, overrides config.json's). */
Status model_config_load(const char *dir, ModelConfig *cfg);

/* One tensor-parallel rank's part of the model (Megatron-style): query heads, KV heads
 * (replicated when there are fewer KV heads than ranks), MLP columns (of every expert: the
 * router is whole on every rank) and vocabulary rows of
 * the embedding and LM head. The vocabulary is cut into `size` slices of num_vocab rows
 * (ceil(vocab / size) rounded up to a multiple of 8); rows past the vocabulary are padding
 * (zero weights, their logits dropped). */
typedef struct {
    int rank, size;                                          /* rank in [0, size) */
    int num_heads, num_kv_heads, intermediate, num_vocab;    /* this rank's */
    int first_head, first_kv_head, first_inter, first_vocab; /* where they start in the whole */
    int moe_intermediate, first_moe_inter; /* each expert's columns (0 without experts) */
} ModelShard;

/* The shard of `rank` of `size` ranks; errors when the heads or the MLP do not split. */
Status model_shard(const ModelConfig *cfg, int rank, int size, ModelShard *out);

typedef struct {
    const char *dir;          /* Hugging Face model folder */
    int load_dummy;           /* load-format dummy: random weights of the config's shape */
    uint64_t seed;            /* for dummy weights */
    int max_num_tokens;       /* largest batch (tokens per forward) the scratch buffers hold */
    const KernelOps *ops;     /* the opened backend (k_open) the model runs on */
    int tp_rank, tp_size;     /* tensor parallelism (size 0 or 1: the whole model); size > 1 needs
                               * the backend's all_reduce, called on every rank's thread at once */
    const char *quantization; /* NULL: the checkpoint's; "fp8": a 16/32-bit checkpoint's linear
                               * layers quantized at load (an fp8 one loads as it is), dummy
                               * weights made in fp8 */
    int kv_cache_fp8;         /* 1: the KV cache is fp8 e4m3 (kv-cache-dtype fp8), with each layer's
                               * k_scale / v_scale from the checkpoint, else 1 */
} ModelLoadOptions;

typedef struct Model Model;

/* Load config and weights. Errors name the file and tensor (missing, wrong shape or dtype,
 * out-of-file data) and leave *out NULL. */
Status model_load(const ModelLoadOptions *opt, Model **out);

void model_destroy(Model *m);

const ModelConfig *model_config(const Model *m);

/* Device bytes of the weights and of the scratch activations (for the memory budget). */
size_t model_weight_bytes(const Model *m);
size_t model_activation_bytes(const Model *m);

/* The weights' format in words for the start-up log: "float32", or "fp8 e4m3, block 128x128
 * scales" / "fp8 e4m3, per-channel scales (quantized at load)", ... */
void model_weight_format(const Model *m, char *buf, size_t size);

/* Geometry of a KV cache for this model (this rank's KV heads) with the given block size,
 * in the backend's act dtype, or fp8 e4m3 with the model's per-layer scales (owned by the
 * model) when it was loaded with kv_cache_fp8. */
KvLayout model_kv_layout(const Model *m, int block_size);

/* One forward step: token_ids[batch->num_tokens] at the batch's positions and slots, K/V
 * written into `kv_cache` (layout from model_kv_layout), logits of the rows listed in
 * logits_rows written to logits[num_logits, vocab]. num_tokens <= max_num_tokens. */
void model_forward(Model *m, const int32_t *token_ids, const AttnBatch *batch, void *kv_cache,
                   const KvLayout *kv_layout, const int32_t *logits_rows, int num_logits,
                   float *logits);

#endif
