/* kernels.h - the compute ops every backend implements, behind one table of C functions.
 *
 * models/ calls only these ops, so the same forward pass runs on the CPU backend
 * (kernels/cpu, plain C, fp32 math, also the reference every GPU kernel is tested against)
 * and on CUDA (kernels/cuda). Pointers are in the backend's memory. Activations (the void *
 * arguments of the compute ops) and the KV cache are in the table's `act` dtype: F32 on the
 * CPU backend, F32, BF16 or F16 on CUDA (one table each); weights may be fp32, fp16 or bf16
 * (converted on the fly); the math is fp32 everywhere.
 *
 * The KV cache is block-major (DESIGN.md 2): physical block b holds, contiguously, every
 * layer's K and V for block_size tokens:
 *     block[b] = layer[0..L) x {K, V} x token[0..block_size) x kv_head[0..Hkv) x dim[0..D)
 * and token position p of a sequence lives in slot block_table[p / block_size] * block_size
 * + p % block_size. Swapping or copying a block is one contiguous copy. */
#ifndef PAGELLM_KERNELS_H
#define PAGELLM_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "sampling.h"

/* How an fp8 weight is scaled (Tensor.fp8; kind FP8_SCALE_NONE for every other tensor).
 * Element (r, c) of an fp8 weight [N, K] stands for dec(q[r, c]) * s, s the scale of its group:
 *   FP8_SCALE_TENSOR   w_scale[0]
 *   FP8_SCALE_CHANNEL  w_scale[r]                     (one per output row)
 *   FP8_SCALE_BLOCK    w_scale[(r / B) * ceil(K / B) + c / B], B = block (blocks of B x B;
 *                      the layout of "fp8" checkpoints' weight_scale_inv)
 * input_scale > 0 is a static scale for the activations matmul quantizes (compressed-tensors'
 * input_scale); 0 means dynamic scales, computed per row of x (per row and block of B columns
 * with FP8_SCALE_BLOCK). */
typedef enum { FP8_SCALE_NONE, FP8_SCALE_TENSOR, FP8_SCALE_CHANNEL, FP8_SCALE_BLOCK } Fp8ScaleKind;
typedef struct {
    Fp8ScaleKind kind;
    int block;            /* B, FP8_SCALE_BLOCK only */
    const float *w_scale; /* fp32, backend memory */
    float input_scale;
} Fp8Scales;

/* A weight or activation in backend memory, row-major. 1-D tensors have ndim 1. A DT_F8E4M3
 * tensor is a weight with its scales in fp8 (zeros elsewhere: designated initializers leave
 * it so). */
typedef struct {
    void *data;
    DType dtype;
    int ndim;
    int64_t shape[4];
    Fp8Scales fp8;
} Tensor;

/* Shape of the paged KV pool (one tensor-parallel rank's heads). */
typedef struct {
    int num_layers;
    int num_kv_heads;
    int head_dim;
    int block_size; /* tokens per block */
    DType dtype;    /* element type stored in the cache: the ops' act dtype, or DT_F8E4M3 */
    /* DT_F8E4M3 only: per-layer scales, host memory, kv_scale[2 layer] for K and [2 layer + 1]
     * for V (NULL: all 1). A value x is stored as e4m3(x * (1 / s)), rounded to the act dtype
     * first as a 16-bit cache would hold it, and read back as dec(q) * s, in fp32. */
    const float *kv_scale;
} KvLayout;

/* Elements in one physical block, and in one layer's K (or V) half of it. A block is
 * k_kv_block_elems * pl_dtype_size(l->dtype) bytes (half of a 16-bit cache's in fp8). */
size_t k_kv_block_elems(const KvLayout *l);
size_t k_kv_half_elems(const KvLayout *l);

/* The scale s of `layer`'s K (v = 0) or V (v = 1) in an fp8 cache: l->kv_scale[2 layer + v],
 * 1 when there are none or the cache is not fp8. Inline: the CUDA library reads it too. */
static inline float k_kv_scale(const KvLayout *l, int layer, int v) {
    return l->dtype == DT_F8E4M3 && l->kv_scale ? l->kv_scale[2 * layer + v] : 1.0f;
}

/* Attention metadata of one forward step over a batch of sequences. Tokens of sequence s
 * occupy rows [query_start[s], query_start[s+1]); each token attends causally to positions
 * 0..positions[t] of its sequence, all of which are in the cache once kv_write has run. */
typedef struct {
    int num_tokens;
    const int32_t *positions;    /* [num_tokens] position of each token in its sequence */
    const int64_t *slot_mapping; /* [num_tokens] cache slot to write, -1 = padding (skip) */
    int num_seqs;
    const int32_t *query_start;  /* [num_seqs + 1] row offsets of each sequence's tokens */
    const int32_t *block_tables; /* [num_seqs, max_blocks_per_seq] physical block ids */
    int max_blocks_per_seq;
    int num_decode_seqs; /* host value: the first num_decode_seqs sequences have one row each
                          * (a backend may give them a decode kernel); 0 = not known */
} AttnBatch;

/* Rotary embedding frequencies, precomputed once per model (k_rope_freqs: the scaling folded
 * in). The first rot_dim elements of each head are rotated (rotate-half within them: pairs
 * (i, i + rot_dim / 2)); the rest pass unchanged (partial_rotary_factor, Phi-4-mini). cos and
 * sin are multiplied by attn_factor (YaRN's and LongRoPE's attention scaling, as transformers
 * does). A token at position p >= long_from uses long_inv_freq (LongRoPE's long factors) when
 * that is not NULL. Zero rot_dim means head_dim, zero attn_factor 1. */
typedef struct {
    int head_dim;
    const float *inv_freq;      /* [rot_dim / 2], backend memory */
    int rot_dim;                /* 0: head_dim */
    float attn_factor;          /* 0: 1 */
    const float *long_inv_freq; /* [rot_dim / 2], backend memory, or NULL */
    int long_from;              /* first position that uses long_inv_freq */
} Rope;

/* RoPE scaling (config.json rope_scaling / rope_parameters), as transformers 5's
 * modeling_rope_utils computes it:
 *   DEFAULT  inv_freq_i = theta^(-2i / rot_dim)
 *   LINEAR   inv_freq / factor
 *   DYNAMIC  NTK: transformers recomputes theta from the sequence length L once L exceeds
 *            max_position_embeddings; for L <= max_position_embeddings it is DEFAULT, and so it
 *            is here (pagellm's context is at most max_position_embeddings)
 *   YARN     interpolation / extrapolation ramp between beta_fast and beta_slow rotations over
 *            original_max_position (truncate: floor / ceil of the bounds), cos and sin scaled by
 *            attention_factor (else 0.1 ln(factor) + 1, or its mscale / mscale_all_dim ratio)
 *   LONGROPE inv_freq_i / short_factor[i] (long_factor[i] past original_max_position), cos and
 *            sin scaled by attention_factor (else sqrt(1 + ln(f) / ln(original_max_position)),
 *            f = factor, else max_position / original_max_position)
 *   LLAMA3   Llama 3.1's wavelength bands */
typedef enum {
    ROPE_DEFAULT = 0,
    ROPE_LINEAR,
    ROPE_DYNAMIC,
    ROPE_YARN,
    ROPE_LONGROPE,
    ROPE_LLAMA3
} RopeType;

enum { ROPE_MAX_FACTORS = 512 }; /* rot_dim / 2 at most */

typedef struct {
    RopeType type;
    float factor;                 /* 0: none given (yarn, longrope: derived) */
    float low_freq_factor;        /* llama3 */
    float high_freq_factor;       /* llama3 */
    int original_max_position;    /* llama3, yarn, longrope */
    int max_position;             /* max_position_embeddings (dynamic, yarn, longrope) */
    float beta_fast, beta_slow;   /* yarn; 0: 32 and 1 */
    float mscale, mscale_all_dim; /* yarn; 0: not given */
    float attention_factor;       /* yarn, longrope; 0: derived */
    int truncate;                 /* yarn: round the correction range (transformers: true) */
    int num_factors;              /* longrope: entries of short_factor and long_factor */
    float short_factor[ROPE_MAX_FACTORS];
    float long_factor[ROPE_MAX_FACTORS];
} RopeScaling;

/* Per-head RMSNorm of q and k after the projection and before RoPE (Qwen3's q_norm, k_norm):
 * each head's vector x[D] becomes w * (x * rsqrt(mean(x^2) + eps)), the weight multiplied last
 * as rmsnorm does; q and k are weights of shape [D] in backend memory. */
typedef struct {
    Tensor q;
    Tensor k;
    float eps;
} QkNorm;

/* A block boundary that a fused op makes its input x from: residual += delta, then
 * x = rmsnorm(residual) * norm (as add_rmsnorm, eps its epsilon). */
typedef struct {
    void *residual;
    const void *delta;
    const Tensor *norm;
    float eps;
} AddNormIn;

/* One row of sampling (arrays of these in backend memory): a sequence's sampling parameters
 * (SamplingParams' fields) and where its tokens are in the packed history. */
typedef struct {
    float temperature;
    float top_p;
    float min_p;
    float repetition_penalty;
    float presence_penalty;
    float frequency_penalty;
    int32_t top_k;
    int32_t num_output;     /* tokens generated so far: the draw index, and the output length */
    uint64_t seed;          /* the sequence's seed (SamplingParams.seed) */
    int32_t history_offset; /* history[off, off + num_prompt + num_output): prompt then output */
    int32_t num_prompt;
} SampleRow;

/* The row of a draw with parameters p: num_prompt prompt and num_output output tokens of its
 * history, at history_offset of the packed history when p has a penalty. */
SampleRow k_sample_row(const SamplingParams *p, int num_prompt, int num_output, int history_offset);

/* One change to a logit before sampling: logits[row, token] += add (a request's logit_bias,
 * or -inf to forbid a token, e.g. EOS before min_tokens). */
typedef struct {
    int32_t row;
    int32_t token;
    float add;
} LogitEdit;

/* sample_rows flags: promises about every row that let the backend skip work. */
enum {
    SAMPLE_NO_PENALTIES = 1, /* no row has a penalty: the history is not read */
    SAMPLE_ARGMAX_ONLY = 2,  /* every row is greedy or temperature-only (no top-k, top-p or
                              * min-p): an argmax, of the logits or of the exponential race */
};

/* An opened backend: its identity, the state it owns and its ops. Every op takes the backend
 * first and acts through its state (CUDA: its streams, cuBLASLt handles, workspaces and
 * communicator; CPU: its worker pool), so several backends (the ranks of a tensor-parallel
 * group, or a CUDA backend and the CPU backend beside it) live in one process without
 * globals. A thread drives a backend after bind (CUDA: its device current on that thread);
 * one thread at a time issues its ops. k_open makes them, k_close frees them. */
typedef struct KernelOps KernelOps;
struct KernelOps {
    const char *name;     /* "cpu", "cuda" */
    DType act;            /* activations and KV cache: DT_F32, DT_BF16 or DT_F16 */
    int device;           /* the GPU it drives (CUDA); 0 on the CPU */
    int rank, size;       /* its place in its tensor-parallel group: rank 0 of 1 alone */
    int max_top_logprobs; /* most top logprobs per row its logprobs op returns */
    void *state;          /* the backend's own; opaque to callers */

    /* Backend memory ("device" memory; plain host memory on the CPU backend, which sets
     * host_memory so that mmapped weights are used in place). alloc returns zeroed memory
     * and aborts on failure; copies are synchronous and happen only outside the hot loop
     * or for the small per-step metadata and logits. */
    int host_memory;
    void *(*alloc)(const KernelOps *ops, size_t bytes);
    void (*free)(const KernelOps *ops, void *p);
    void (*to_device)(const KernelOps *ops, void *dst, const void *src, size_t bytes);
    void (*to_host)(const KernelOps *ops, void *dst, const void *src, size_t bytes);
    /* The first row_bytes of each of `rows` rows, `pitch` bytes apart in src and in dst (a
     * table's used columns), as to_device. */
    void (*to_device_rows)(const KernelOps *ops, void *dst, const void *src, size_t pitch,
                           size_t row_bytes, int rows);
    size_t (*free_memory)(const KernelOps *ops); /* bytes of backend memory free now */

    /* Host memory for the swap pool (pinned on CUDA) and whole-block copies between it and
     * the device pool: block src_dst[2i] of src_pool to block src_dst[2i+1] of dst_pool,
     * one pool on the host and one on the device (src_dst in host memory). The copies run
     * beside the compute ops (CUDA: on a stream of their own, in call order); with
     * after_compute they start only once every op issued so far has finished (a block that
     * a running step reads or writes), else at once. Ops issued after the call wait for
     * them. */
    void *(*alloc_host)(const KernelOps *ops, size_t bytes); /* NULL when out of memory */
    void (*free_host)(const KernelOps *ops, void *p);
    void (*swap_blocks)(const KernelOps *ops, void *dst_pool, const void *src_pool,
                        const int32_t *src_dst, int n, size_t block_bytes, int after_compute);

    /* Asynchronous steps (NULL on backends whose ops are synchronous): to_host_async copies
     * to pinned host memory after the ops issued so far, without waiting; an event recorded
     * after some ops lets the host wait for just those (event_wait). */
    void (*to_host_async)(const KernelOps *ops, void *dst, const void *src, size_t bytes);
    void *(*event_create)(const KernelOps *ops);
    void (*event_record)(const KernelOps *ops, void *event);
    void (*event_wait)(const KernelOps *ops, void *event);
    void (*event_destroy)(const KernelOps *ops, void *event);

    /* tokens[pairs[2i]] = sampled[pairs[2i+1]] for i < n (backend memory): the input ids of a
     * step that are the tokens its predecessor sampled and the host has not seen yet. */
    void (*scatter_tokens)(const KernelOps *ops, int32_t *tokens, const int32_t *sampled,
                           const int32_t *pairs, int n);

    /* Tensor parallelism with asynchronous steps (NULL without): copy_peer copies bytes of
     * this device's memory to device dst_device's after the ops issued so far; stream_wait
     * makes this device's later ops wait for an event recorded on any device. */
    void (*copy_peer)(const KernelOps *ops, void *dst, int dst_device, const void *src,
                      size_t bytes);
    void (*stream_wait)(const KernelOps *ops, void *event);

    /* out[n, H] = table[ids[i], :], H = table->shape[1]. */
    void (*embedding)(const KernelOps *ops, void *out, const int32_t *ids, int n,
                      const Tensor *table);

    /* out[i] = x[i] / rms(x[i]) * w, rows of `dim`. */
    void (*rmsnorm)(const KernelOps *ops, void *out, const void *x, const Tensor *w, int n, int dim,
                    float eps);

    /* residual += delta; out = rmsnorm(residual) (the pre-norm block boundary). */
    void (*add_rmsnorm)(const KernelOps *ops, void *residual, const void *delta, void *out,
                        const Tensor *w, int n, int dim, float eps);

    /* out[n, N] = x[n, K] * w^T (+ bias), w of shape [N, K], bias [N] or NULL.
     * An fp8 weight (w->dtype DT_F8E4M3, scales in w->fp8) multiplies fp8 activations: each
     * group of x's row i (the whole row; blocks of B columns with FP8_SCALE_BLOCK), its values
     * as fp32, gets the scale s = input_scale, or when that is 0, max(amax / 448,
     * PL_F8E4M3_MIN_SCALE) over the group, and is quantized to q = e4m3(x * (1 / s)); then
     *     out[i, j] = sum over groups g of dot_g(dec(q_i), dec(w_j)) * (s_x[i, g] * s_w(j, g))
     * (+ bias), fp32 products and sums (the order within a dot is the backend's, and a GPU's
     * tensor cores may sum with fewer bits: CUDA's cuBLASLt path stays within ~2^-9 of the
     * sum of |products|), rounded once to the act dtype. kernels/cpu/matmul_fp8.c is the
     * reference. */
    void (*matmul)(const KernelOps *ops, void *out, const void *x, const Tensor *w,
                   const Tensor *bias, int n);

    /* HF rotate-half RoPE in place on q[n, nh, D] and k[n, nkv, D] at the given positions. */
    void (*rope)(const KernelOps *ops, void *q, void *k, const int32_t *positions, int n, int nh,
                 int nkv, const Rope *rope);

    /* Store k, v [n, nkv, D] of `layer` into the cache slots (slot -1 skipped). */
    void (*kv_write)(const KernelOps *ops, void *kv_cache, const KvLayout *l, int layer,
                     const void *k, const void *v, const int64_t *slot_mapping, int n);

    /* The attention block's input in one op, on the fused projection's output
     * qkv[n, (nh + 2 nkv) D] (each row: q heads, k heads, v heads): q_out[n, nh, D] = q rotated
     * by rope, and the rotated k and v stored in the cache slots as kv_write does (qkv's k
     * part is left rotated). nkv = l->num_kv_heads. Same results as rope then kv_write. With
     * qk_norm (NULL: none), each q and k head is first normalized by it (rounded to the act
     * dtype, as an rmsnorm's output), then rotated. */
    void (*qkv_rope_cache)(const KernelOps *ops, void *q_out, void *qkv, const int32_t *positions,
                           const int64_t *slot_mapping, int n, int nh, const Rope *rope,
                           const QkNorm *qk_norm, void *kv_cache, const KvLayout *l, int layer);

    /* Causal GQA attention of q[num_tokens, nh, D] over the paged cache: out[num_tokens, nh, D].
     * Query head h reads KV head h / (nh / nkv). Scores are s = scale q.k; with softcap > 0
     * (Gemma 2) s = softcap tanh(s / softcap) before the softmax; with window > 0 (sliding-window
     * layers) a token at position p attends to positions max(0, p - window + 1) .. p only; the
     * block-table entries of blocks wholly before every row's window are never read (the block
     * manager may have released them: BLK_RELEASED). */
    void (*attention)(const KernelOps *ops, void *out, const void *q, const void *kv_cache,
                      const KvLayout *l, int layer, const AttnBatch *b, int nh, float scale,
                      float softcap, int window);

    /* out[i, j] = silu(gate_up[i, j]) * gate_up[i, dim + j]: the fused gate-up projection's
     * rows [n, 2 dim] (gate half first) to out[n, dim]. */
    void (*silu_mul)(const KernelOps *ops, void *out, const void *gate_up, int n, int dim);

    /* out[i, j] = gelu_tanh(gate_up[i, j]) * gate_up[i, dim + j], as silu_mul with torch's
     * gelu(approximate="tanh") (transformers' gelu_pytorch_tanh, Gemma's GeGLU):
     * gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))). */
    void (*gelu_tanh_mul)(const KernelOps *ops, void *out, const void *gate_up, int n, int dim);

    /* x[i] = x[i] * s for i < n, in the act dtype (each product rounded to it): Gemma's
     * embedding times sqrt(hidden), s already rounded to the act dtype as transformers does. */
    void (*scale)(const KernelOps *ops, void *x, size_t n, float s);

    /* logits[i] = cap * tanh(logits[i] / cap) for i < n, fp32 in place (backend memory):
     * Gemma 2's final logit soft-capping, after the LM head. */
    void (*logits_softcap)(const KernelOps *ops, float *logits, size_t n, float cap);

    /* Optional fusions (NULL: the model makes the two calls). matmul_qkv_rope_cache =
     * matmul(qkv, x, w, bias, n) then qkv_rope_cache(q_out, qkv, ...); matmul_silu_mul =
     * matmul(gate_up, x, w, NULL, n) then silu_mul(out, gate_up, n, w->shape[0] / 2). Same
     * results; qkv and gate_up are scratch, unspecified afterwards. matmul_qkv_rope_cache with
     * `pre` first makes x from it (add_rmsnorm(pre->residual, pre->delta, x, ...)); x is then
     * unspecified too (a backend may quantize the rows for w without writing them). */
    void (*matmul_qkv_rope_cache)(const KernelOps *ops, void *q_out, void *qkv, void *x,
                                  const AddNormIn *pre, const Tensor *w, const Tensor *bias,
                                  const int32_t *positions, const int64_t *slot_mapping, int n,
                                  int nh, const Rope *rope, const QkNorm *qk_norm, void *kv_cache,
                                  const KvLayout *l, int layer);
    /* The most rows at which matmul_qkv_rope_cache fuses an fp8 projection (0: never; the
     * model then leaves the pre-norm to add_rmsnorm_matmul, which may quantize the rows). */
    int fused_fp8_max_rows;

    /* A mixture-of-experts MLP (Mixtral, Qwen3-MoE) in one op, on rows x[n, H]. Per row:
     * router logits r = x router^T (router [E, H]), p = softmax(r) in fp32, the top_k experts
     * by p (the lower id first on ties), their p divided by their sum when renormalize; then
     *     out[i] = sum over those experts e, in increasing e, of p_e * down_e(silu(g) * u),
     *     [g; u] = gate_up_e x_i
     * with gate_up [E, 2 I, H] (expert e's gate rows, then its up rows) and down [E, H, I].
     * Each expert's intermediate dim may be one tensor-parallel rank's slice (out is then a
     * partial sum to all-reduce). The workspace (backend memory) holds
     * moe_workspace_bytes(max_rows >= n, E, H, I, top_k) bytes; a backend is free to route,
     * group the rows by expert and run grouped GEMMs in it. Nothing is allocated and the
     * host never waits (the op can be recorded in a graph). NULL on backends without it. */
    size_t (*moe_workspace_bytes)(const KernelOps *ops, int max_rows, int num_experts, int hidden,
                                  int inter, int top_k);
    void (*moe_mlp)(const KernelOps *ops, void *out, const void *x, const Tensor *router,
                    const Tensor *gate_up, const Tensor *down, int n, int top_k, int renormalize,
                    void *workspace, size_t workspace_bytes);
    void (*matmul_silu_mul)(const KernelOps *ops, void *out, void *gate_up, const void *x,
                            const Tensor *w, int n);

    /* Optional (NULL: the model makes the two calls): matmul(proj, x, w, NULL, n) then
     * add_rmsnorm(residual, proj, normed, norm_w, n, w->shape[0], eps), a projection feeding
     * the residual stream and the pre-norm after it. The same results up to the order in which
     * the products over K are summed; proj is scratch, unspecified afterwards. */
    void (*matmul_add_rmsnorm)(const KernelOps *ops, void *residual, void *normed, void *proj,
                               const void *x, const Tensor *w, const Tensor *norm_w, int n,
                               float eps);

    /* Optional (NULL: the model makes the two calls): add_rmsnorm(residual, delta, normed,
     * norm_w, n, K, eps) then matmul(out, normed, w, bias, n); and silu_mul(act, gate_up, n, K)
     * then matmul(out, act, w, NULL, n), K = w->shape[1]: a block boundary, or the MLP's
     * activation, and the projection reading it, whose fp8 activation quantization the backend
     * may do as the first op writes. The same out and residual as the two calls; normed and act
     * are scratch afterwards (rows quantized for w need not be written in 16 bits). */
    void (*add_rmsnorm_matmul)(const KernelOps *ops, void *out, void *residual, const void *delta,
                               void *normed, const Tensor *norm_w, const Tensor *w,
                               const Tensor *bias, int n, float eps);
    void (*silu_mul_matmul)(const KernelOps *ops, void *out, void *act, const void *gate_up,
                            const Tensor *w, int n);

    /* out[i, :] = in[rows[i], :] for i < n, rows of `dim` (the rows whose logits are wanted). */
    void (*gather_rows)(const KernelOps *ops, void *out, const void *in, const int32_t *rows, int n,
                        int dim);

    /* out[i] = (float)in[i] for i < n: activations to fp32 (the logits). */
    void (*to_f32)(const KernelOps *ops, float *out, const void *in, size_t n);

    /* Copy whole KV blocks within the device pool (copy-on-write): block src_dst[2i] to
     * block src_dst[2i+1]; src_dst is host memory. */
    void (*copy_blocks)(const KernelOps *ops, void *dst_pool, const void *src_pool,
                        const int32_t *src_dst, int n, size_t block_bytes);

    /* Sampling where the logits are, with vLLM's semantics (kernels/cpu/sample.c, the
     * reference): tokens[i] = the next token of row i of logits[n, vocab], rows[i] its
     * parameters; penalties over the row's prompt and output tokens (packed in history, read
     * only for rows with a penalty; NULL under SAMPLE_NO_PENALTIES), temperature, top-k,
     * top-p, min-p and one seeded draw; the logits are modified in place. token_logits[i]
     * (NULL: not wanted) gets the picked token's logit before penalties. Every array is
     * backend memory. logprobs gives, for raw rows (call it before sample_rows), lse[i] =
     * log sum exp and the k best (id, logprob), best first, lower id first on ties (k <=
     * vocab and k <= max_top_logprobs). The workspace holds up to max_rows rows with
     * max_history history tokens (0 bytes: none needed). */
    size_t (*sample_workspace_bytes)(const KernelOps *ops, int max_rows, int vocab,
                                     int max_history);
    void (*sample_rows)(const KernelOps *ops, int32_t *tokens, float *token_logits, float *logits,
                        int n, int vocab, const SampleRow *rows, const int32_t *history, int flags,
                        void *workspace, size_t workspace_bytes);
    void (*logprobs)(const KernelOps *ops, float *lse, int32_t *top_ids, float *top_logprobs,
                     const float *logits, int n, int vocab, int k);

    /* Apply edits[n] (backend memory; rows and tokens in range, the same entry may appear
     * twice: the additions sum) to logits[rows, vocab] in backend memory. */
    void (*logits_add)(const KernelOps *ops, float *logits, int vocab, const LogitEdit *edits,
                       int n);

    /* Constrained decoding: for i < n, row rows[i] of logits[., vocab] keeps the logit of token
     * t only where bit t % 32 of masks[i * words + t / 32] is set, words = (vocab + 31) / 32;
     * the others become -inf. masks and rows in backend memory. */
    void (*logits_mask)(const KernelOps *ops, float *logits, int vocab, const uint32_t *masks,
                        const int32_t *rows, int n);

    /* Fill n elements of dt (F32 / F16 / BF16, or F8E4M3: the value's e4m3 code) at dst with
     * load-format dummy values: scale > 0: uniform in [-scale, scale), element i depending only
     * on (key, i) exactly as models/weights.c's host fill; scale == 0: every element 1. NULL:
     * the host fills. */
    void (*fill_dummy)(const KernelOps *ops, void *dst, DType dt, size_t n, uint64_t key,
                       float scale);

    /* Replayable op sequences (CUDA graphs); NULL on backends without them. Ops issued
     * between graph_begin and graph_end are recorded, not run; graph_launch replays them
     * with the same pointers and shapes (the data behind the pointers may change). An op
     * that would allocate or copy from the host must not be recorded. */
    void (*graph_begin)(const KernelOps *ops);
    void *(*graph_end)(const KernelOps *ops);
    void (*graph_launch)(const KernelOps *ops, void *graph);
    void (*graph_destroy)(const KernelOps *ops, void *graph);

    /* Wait until every op issued so far has finished (NULL: ops are synchronous). */
    void (*synchronize)(const KernelOps *ops);

    /* Make the calling thread the one that drives this backend (CUDA: its device current). */
    void (*bind)(const KernelOps *ops);

    /* Tensor parallelism (NULL on backends without it): all_reduce sums buf[count] (act
     * dtype) over the group's ranks in place, called on every rank's thread at once. */
    void (*all_reduce)(const KernelOps *ops, void *buf, size_t count);

    /* all_reduce(delta) then add_rmsnorm(residual, delta, out, ...) in one op (the row-parallel
     * projection's partial sums into the next pre-norm); delta's contents afterwards are
     * unspecified. Every rank's residual and out come out identical. */
    void (*all_reduce_add_rmsnorm)(const KernelOps *ops, void *residual, void *delta, void *out,
                                   const Tensor *w, int n, int dim, float eps);

    /* out[size, count] = every rank's in[count], in rank order (act dtype). In place when
     * in == out + rank * count. */
    void (*all_gather)(const KernelOps *ops, void *out, const void *in, size_t count);

    /* Vocabulary-parallel embedding: out[i] = table[ids[i] - first] when first <= ids[i] <
     * first + table rows, else zeros (summed over the ranks, every id is found once). */
    void (*embedding_slice)(const KernelOps *ops, void *out, const int32_t *ids, int n,
                            const Tensor *table, int first);

    /* Logits of a vocabulary-parallel LM head to fp32: parts[size, n, shard] (act dtype; slice
     * r holds vocabulary ids [r * shard, (r + 1) * shard)) to out[n, vocab], ids >= vocab
     * (padding) dropped. */
    void (*vocab_logits_f32)(const KernelOps *ops, float *out, const void *parts, int n, int vocab,
                             int shard, int size);
};

/* What to open: a backend by name, its activation dtype and its tensor-parallel group. */
typedef struct {
    const char *backend;   /* "cpu" (always built) or "cuda" */
    DType act;             /* cpu: DT_F32; cuda: DT_F32, DT_BF16 or DT_F16 */
    int size;              /* ranks of the tensor-parallel group (devices 0..size-1); 0 = 1 */
    int cpu_threads;       /* cpu: threads of its ops, the caller included: n >= 1 caps them
                            * at n (never more than the CPUs this process may run on); 0 = all */
    int custom_all_reduce; /* cuda, size > 1: the one-shot all-reduce over peer memory for
                            * small messages where the GPUs reach each other (else NCCL) */
    int mpi;               /* size > 1: the ranks are the processes of an MPI job (k_mpi_init
                            * called, its size = size): open only this process's rank, into
                            * ranks[0], its collectives over MPI (cpu) or over NCCL between
                            * the processes (cuda: one GPU per process, by host-local rank) */
} KernelOpenOptions;

/* Devices of a backend this process can open: 1 for "cpu"; the visible GPUs for "cuda" (0
 * without a GPU or in a build without CUDA); 0 for an unknown name. Never aborts. */
int k_device_count(const char *backend);

/* Open o->size ranks of a backend into ranks[0..size): rank r drives device r, the group's
 * communicators made (NCCL for CUDA). The calling thread is bound to rank 0. An error
 * (unknown backend or dtype, too few devices, no NCCL) returns its Status with a message
 * and opens nothing. */
Status k_open(const KernelOpenOptions *o, KernelOps **ranks);

/* ---- MPI: tensor-parallel ranks as the processes of an MPI job (kernels/mpi.c) ---------
 * One process per rank, started by mpirun; rank 0 drives the others with broadcasts. Without
 * an MPI build (no PAGELLM_HAVE_MPI) k_mpi_init fails with how to get one and the rest are
 * no-ops. MPI is called from one thread at a time (MPI_THREAD_SERIALIZED). */

/* The size of the job this process was started in by an MPI launcher (Open MPI's
 * OMPI_COMM_WORLD_SIZE, else PMI_SIZE), 0 when none started it. Needs no MPI. */
int k_mpi_launched_size(void);

/* Initialise MPI (once): this process's rank and the job's size. */
Status k_mpi_init(int *rank, int *size);

/* The job's size after k_mpi_init succeeded with more than one process, else 0. */
int k_mpi_active(void);

/* This process's rank among the job's processes on its host (0 without MPI): the cuda backend
 * drives GPU k_mpi_local_rank() of the host's visible GPUs. */
int k_mpi_local_rank(void);

/* Broadcast bytes from rank 0. Ranks > 0 wait for it sleeping between polls, for ever (rank 0
 * may be idle); rank 0's send returns once it is on its way. */
Status k_mpi_bcast(void *buf, size_t bytes);

/* Rank 0: gather `bytes` from every rank into all[size][bytes] (its own included), waiting at
 * most timeout_s seconds (<= 0: for ever); on a timeout, late[r] = 1 for the ranks that did
 * not answer and PL_ERR_IO. Ranks > 0: send theirs (late and all unused). */
Status k_mpi_gather(const void *mine, void *all, size_t bytes, double timeout_s, int *late);

/* End MPI: finalize (every rank, at the end), or abort the whole job with `code`. */
void k_mpi_finalize(void);
void k_mpi_abort(int code);

/* Close the ranks k_open made (all of them, after every op has finished); NULL entries are
 * skipped. */
void k_close(KernelOps **ranks, int size);

/* Fill inv_freq[head_dim/2] for rope_theta with optional llama3 scaling
 * (factor <= 0 means none). Host memory; shared by every backend. k_rope_freqs with a
 * RopeScaling of type LLAMA3 (or DEFAULT). */
void k_rope_inv_freq(float *inv_freq, int head_dim, float theta, float llama3_factor,
                     float low_freq_factor, float high_freq_factor, int original_max_pos);

/* The CPU reference of RoPE scaling (RopeScaling above; s NULL: DEFAULT): inv_freq[rot_dim / 2]
 * for rope_theta, and for LONGROPE the long-context ones into long_inv_freq (NULL: not wanted;
 * other types copy inv_freq there). Returns the cos / sin factor (Rope.attn_factor): YaRN's and
 * LongRoPE's attention factor, else 1. Host memory, float32 steps as torch takes them. */
float k_rope_freqs(float *inv_freq, float *long_inv_freq, int rot_dim, float theta,
                   const RopeScaling *s);

/* The per-request random stream: 64 bits that depend only on (seed, index), and the uniform
 * float in [0, 1) of their top 24. */
uint64_t k_random_bits(uint64_t seed, uint64_t index);
float k_random_uniform(uint64_t seed, uint64_t index);

/* An Exp(1) variate for `token` from one step's k_random_bits, finite (at most 36.8): the
 * exponential race samples softmax(x / T) as argmax over tokens of x_i / T - log(E_i) (sample
 * ops' temperature-only rows). The CUDA sampler computes it bit for bit except the logarithm
 * (its fast one differs by up to ~2e-5 relative). */
float k_random_exponential(uint64_t bits, uint32_t token);
/* Its value for the 53 uniform bits m (< 2^53) it draws: -log(1 - m 2^-53) as a float. */
float k_random_exponential_of(uint64_t m);

#endif
