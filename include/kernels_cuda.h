/* kernels_cuda.h - the CUDA backend's kernel launchers (the .cu files of kernels/cuda/), as a
 * C ABI.
 *
 * Each launcher has the semantics of the CPU op of the same name (kernels/cpu/, the
 * reference its test compares against), with these differences:
 *   - every pointer argument is device memory, except Tensor / KvLayout / AttnBatch / Rope
 *     structs themselves, which are host structs whose data pointers are device memory;
 *   - activations are in `DType act` (DT_F32, DT_BF16 or DT_F16; the math inside is fp32),
 *     weights F32 / F16 / BF16, the KV cache in KvLayout.dtype (DT_F32, DT_BF16, DT_F16, or
 *     DT_F8E4M3 with its per-layer scales: kernels/cuda/kv_fp8.cuh);
 *   - `stream` is a cudaStream_t (NULL = the legacy default stream), so C callers need no
 *     CUDA header; launches are asynchronous on it;
 *   - launchers never allocate, never synchronize, and are safe to capture in a CUDA graph
 *     (grids are sized from host-side bounds, never from device data). Bad arguments and
 *     unsupported dtypes abort with a message (pl_fatal); CUDA errors through CUDA_CHECK.
 *
 * Shape limits: head_dim a multiple of 8, at most 1024; rows of any length elsewhere. */
#ifndef PAGELLM_KERNELS_CUDA_H
#define PAGELLM_KERNELS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus /* kernels.h has no linkage block of its own */
extern "C" {
#endif

#include "common.h"
#include "kernels.h"

/* ---- runtime helpers (kernels/cuda/runtime.cu) ---- */

/* Abort with "CUDA error <name> (<string>) in <expr> at file:line". `err` is a cudaError_t. */
PL_NORETURN void k_cuda_check_fail(int err, const char *expr, const char *file, int line);

/* CUDA_CHECK(cudaMalloc(...)): abort with the expression, file and line unless it returns
 * cudaSuccess (0). Usable from C files that include cuda_runtime.h, and from .cu files. */
#ifndef CUDA_CHECK
#define CUDA_CHECK(expr)                                                                           \
    do {                                                                                           \
        int cuda_check_err_ = (int)(expr);                                                         \
        if (cuda_check_err_ != 0)                                                                  \
            k_cuda_check_fail(cuda_check_err_, #expr, __FILE__, __LINE__);                         \
    } while (0)
#endif

/* Number of usable CUDA devices; 0 when there is no driver or no GPU (never aborts, and
 * leaves no sticky error behind). */
int k_cuda_device_count(void);

/* Plain device memory (cudaMalloc; aborts on failure) and synchronous copies in any
 * direction (unified addressing decides host or device). For start-up and tests: the step
 * loop never calls these. k_cuda_free(NULL) is a no-op. */
void *k_cuda_malloc(size_t bytes);
void k_cuda_free(void *p);
void k_cuda_memcpy(void *dst, const void *src, size_t bytes);
void k_cuda_memset(void *dst, int byte, size_t bytes);
void k_cuda_synchronize(void); /* the whole device, then checks for a pending error */

/* A non-blocking stream (as void *), and its destruction and synchronization. */
void *k_cuda_stream_create(void);
void k_cuda_stream_destroy(void *stream);
void k_cuda_stream_synchronize(void *stream);

/* k_open and k_close of the "cuda" backend (kernels/cuda/ops.cu): o->size ranks, rank r on
 * device r, with activations and KV cache in o->act (DT_F32: exact, for comparisons; DT_BF16:
 * the fast configuration; DT_F16: the same in fp16). A group of several ranks gets one NCCL
 * communicator per device (ncclCommInitAll) and, with o->custom_all_reduce, the one-shot
 * NVLink all-reduce for decode-sized messages where the GPUs reach each other's memory. */
Status k_cuda_open(const KernelOpenOptions *o, KernelOps **ranks);
void k_cuda_close(KernelOps **ranks, int size);

/* The cuda backend as one rank per MPI process (kernels.c drives it): a group id made once by
 * k_cuda_group_id (on rank 0) and sent to every rank, then k_cuda_open_rank on each opens
 * rank `rank` of o->size on GPU `device` into *out and joins the group's NCCL communicator
 * (ncclCommInitRank: it waits for every rank). No one-shot all-reduce across processes. */
enum { K_CUDA_GROUP_ID_BYTES = 128 };
Status k_cuda_group_id(void *id);
Status k_cuda_open_rank(const KernelOpenOptions *o, int rank, int device, const void *group_id,
                        KernelOps **out);

/* ---- element-wise and row ops ---- */

/* out[n, H] (act) = table[ids[i], :], H = table->shape[1]; ids [n] int32 on the device.
 * An id outside the table traps the kernel (a sticky CUDA error: the next CUDA_CHECK aborts). */
void k_cuda_embedding(void *out, DType act, const int32_t *ids, int n, const Tensor *table,
                      void *stream);

/* out[i] = x[i] / rms(x[i]) * w, rows of `dim`, all in `act`; w [dim] F32/F16/BF16. */
void k_cuda_rmsnorm(void *out, const void *x, DType act, const Tensor *w, int n, int dim, float eps,
                    void *stream);

/* residual += delta (rounded to act); out = rmsnorm(residual). delta may be NULL (norm only).
 * residual, delta and out are [n, dim] in act; out must not alias residual. */
void k_cuda_add_rmsnorm(void *residual, const void *delta, void *out, DType act, const Tensor *w,
                        int n, int dim, float eps, void *stream);

/* out[i, j] = silu(gate_up[i, j]) * gate_up[i, dim + j]: the fused gate-up rows [n, 2 dim] to
 * out [n, dim] (act); out must not alias gate_up. */
void k_cuda_silu_mul(void *out, const void *gate_up, DType act, int n, int dim, void *stream);

/* Gemma's ops (gemma.cu; kernels.h gives their meaning): GeGLU, x *= s in the act dtype, fp32
 * logits soft-capped in place, and attention with soft-capped scores and / or a sliding window
 * (window 0: none), a plain kernel that any AttnBatch may take. */
void k_cuda_gelu_tanh_mul(void *out, const void *gate_up, DType act, int n, int dim, void *stream);
void k_cuda_scale(void *x, DType act, size_t n, float s, void *stream);
void k_cuda_logits_softcap(float *logits, size_t n, float cap, void *stream);
void k_cuda_attention_capped(void *out, const void *q, DType act, const void *kv_cache,
                             const KvLayout *l, int layer, const AttnBatch *b, int nh, float scale,
                             float softcap, int window, void *stream);

/* The KernelOps fill_dummy op (load-format dummy weights made on the GPU): n elements of dt
 * (F32 / F16 / BF16, or F8E4M3: e4m3 of the value) at dst, uniform in [-scale, scale) from
 * stream `key`, bit-identical to models/weights.c's host fill, or all 1 when scale == 0. */
void k_cuda_fill_dummy(void *dst, DType dt, size_t n, uint64_t key, float scale, void *stream);

/* out[i] = (float)in[i] for i < n, in in `act` (the logits). */
void k_cuda_to_f32(float *out, const void *in, DType act, size_t n, void *stream);

/* out[i, :] = in[rows[i], :] for i < n, rows [n] int32 on the device, rows of `dim` (act). */
void k_cuda_gather_rows(void *out, const void *in, const int32_t *rows, DType act, int n, int dim,
                        void *stream);

/* ---- rotary embedding and the paged KV cache ---- */

/* HF rotate-half RoPE in place on q[n, nh, D] and k[n, nkv, D] (act; either may be NULL) at
 * positions[n]; rope->inv_freq [D/2] is device memory. */
void k_cuda_rope(void *q, void *k, DType act, const int32_t *positions, int n, int nh, int nkv,
                 const Rope *rope, void *stream);

/* Store k, v [n, nkv, D] (act) of `layer` into the cache slots slot_mapping[n] (int64 on the
 * device; -1 = padding, skipped), converting to l->dtype. */
void k_cuda_kv_write(void *kv_cache, const KvLayout *l, int layer, const void *k, const void *v,
                     DType act, const int64_t *slot_mapping, int n, void *stream);

/* The CPU qkv_rope_cache op in one launch on the fused projection's rows qkv[n, (nh + 2 nkv) D]
 * (nkv = l->num_kv_heads, rope->head_dim = l->head_dim): q rotated into q_out [n, nh, D], k
 * rotated in place, the rotated k and v converted into the cache. */
void k_cuda_qkv_rope_cache(void *q_out, void *qkv, DType act, const int32_t *positions,
                           const int64_t *slot_mapping, int n, int nh, const Rope *rope,
                           const QkNorm *qk_norm, void *kv_cache, const KvLayout *l, int layer,
                           void *stream);

/* The CPU moe_mlp op (kernels/cuda/moe.cu): router logits in fp32, top-k routing and the rows
 * grouped by expert on the device, then for 16-bit activations and weights GEMVs over the
 * picked experts (decode batches) or grouped tensor-core GEMMs and a weighted combine. */
size_t k_cuda_moe_workspace_bytes(DType act, int max_rows, int num_experts, int hidden, int inter,
                                  int top_k);
void k_cuda_moe_mlp(void *out, const void *x, DType act, const Tensor *router,
                    const Tensor *gate_up, const Tensor *down, int n, int top_k, int renormalize,
                    void *workspace, size_t workspace_bytes, void *stream);
/* The grouped GEMMs' kernels for the process: wgmma where this build and GPU have it and the
 * tiles hold 64 or more rows, else mma.sync (default); or mma.sync everywhere (tests compare
 * the two). */
typedef enum { KC_MOE_GEMM_AUTO, KC_MOE_GEMM_MMA } KCudaMoeGemm;
void k_cuda_moe_force_gemm(KCudaMoeGemm gemm);

/* Copy whole KV blocks in one launch: block src_dst[2i] of src_pool to block src_dst[2i+1] of
 * dst_pool for i < n (src_dst [2n] int32 on the device; both pools device memory, possibly
 * the same: copy-on-write). Host<->device swaps are cudaMemcpyAsync calls, not this. */
void k_cuda_copy_blocks(void *dst_pool, const void *src_pool, const int32_t *src_dst, int n,
                        size_t block_bytes, void *stream);

/* tokens[pairs[2i]] = sampled[pairs[2i+1]] for i < n (all on the device). */
void k_cuda_scatter_tokens(int32_t *tokens, const int32_t *sampled, const int32_t *pairs, int n,
                           void *stream);

/* ---- attention over the paged cache ----
 *
 * Both kernels compute exactly the CPU `attention` op for any AttnBatch (its arrays are
 * device copies): out[t, h, :] for rows t in [query_start[0], query_start[num_seqs]), each
 * attending causally to positions 0..positions[t] of its sequence, query head h reading KV
 * head h / (nh / nkv). Rows are absolute, so a batch ordered decodes-first can be split into
 * two views by offsetting query_start and block_tables (positions stay whole):
 *     decode view  {num_tokens = nd, num_seqs = nd, query_start, block_tables}
 *     prefill view {num_tokens = T - nd, num_seqs = S - nd, query_start + nd,
 *                   block_tables + nd * max_blocks_per_seq}
 * b->num_tokens must be at least the rows of the view (it sizes the grid; extra rows, e.g.
 * graph padding after query_start[num_seqs], are left untouched). b->max_blocks_per_seq
 * bounds every context (it sizes the split over the sequence). q, out: [rows, nh, D] in act.
 *
 * Math is fp32 (scores, softmax, accumulation); where the tensor cores are used, the inputs
 * are the bf16 values themselves and P is rounded to bf16 before P.V (within bf16 tolerance).
 *
 * decode (attention_decode.cu): memory-bound, every dtype pair; tensor cores (mma.sync) for a
 * bf16 or f16 cache with queries of the same type at head_dim 128, CUDA cores otherwise. One
 * block per (KV head x head group, row, partition of up to 2048 positions on tensor cores,
 * 1024 otherwise) handling all query heads of that KV head together (each K/V row loaded once
 * for the group, cp.async rings per warp; a tensor-core partition scored in chunks of 1024 with
 * a running max and sum), partitions combined by a second kernel when the bound allows more
 * than one (a block per head for many partitions, a warp for a few). Best for one query row
 * per sequence.
 * prefill (attention_prefill.cu, attention_prefill_tc.cu): one block per (tile of query rows
 * of one sequence x heads of one KV head), K/V tiles in shared memory reused by every row and
 * head of the tile, online softmax (flash-attention style). bf16 q on a bf16 cache with
 * head_dim a multiple of 16 up to 256 runs on tensor cores (mma.sync, cp.async double
 * buffering); anything else on an fp32 CUDA-core kernel. Best for prompt chunks.
 * window > 0 (sliding-window layers): a row at position p attends to p - window + 1 .. p only,
 * as the CPU op; both kernels skip the positions before the first any row of the launch reads
 * and never read a cache block wholly before it (its block-table entry may be a sentinel). */

/* Scratch bytes k_cuda_attention_decode needs for the split over the sequence: partial
 * results for 256-position partitions of every row, and at least 256 (row, partition) pairs
 * so that small batches can use shorter partitions (0 only when max_blocks_per_seq covers at
 * most 32 positions). Allocate it once for the largest batch and reuse it: a launch picks its
 * partition length from the workspace it is given, never asking for more than this. */
size_t k_cuda_attention_workspace_bytes(const KvLayout *l, int num_tokens, int nh,
                                        int max_blocks_per_seq);

void k_cuda_attention_decode(void *out, const void *q, DType act, const void *kv_cache,
                             const KvLayout *l, int layer, const AttnBatch *b, int nh, float scale,
                             int window, void *workspace, size_t workspace_bytes, void *stream);

void k_cuda_attention_prefill(void *out, const void *q, DType act, const void *kv_cache,
                              const KvLayout *l, int layer, const AttnBatch *b, int nh, float scale,
                              int window, void *stream);

/* ---- linear layers (kernels/cuda/matmul.cu) ----
 *
 * k_cuda_matmul has the CPU `matmul` op's semantics: out[n, N] = x[n, K] w^T (+ bias), w of
 * shape [N, K] (row-major, F32/F16/BF16), bias [N] (any of those dtypes) or NULL, fp32
 * accumulation, x and out in `act`. Supported (act / weight): BF16 / BF16 (the fast path),
 * F16 / F16, F32 / F32 (exact fp32, no TF32), F32 / BF16 and F32 / F16 (fp32 activations on 16-bit
 * weights, within fp32 tolerance of the CPU op: x is split into two 16-bit halves in the
 * gemm's scratch), and BF16, F16 or F32 on DT_F8E4M3 weights with matmul's fp8 semantics
 * (kernels/cuda/matmul_fp8.cu: x quantized to e4m3 per row or 128-column block; K % 16 == 0,
 * x and w 16-byte aligned, block scales of 128 x 128; n <= 8 an own tensor-core GEMV, larger
 * n cuBLASLt's fp8 GEMM with per-row / per-channel or block scales, its buffers (33.5 MiB)
 * allocated by the first such eager call); anything else aborts. Small batches with 16-bit weights,
 * K % 8 == 0 and 16-byte aligned x and w take a memory-bound GEMV kernel where it measured faster
 * than cuBLASLt on the H200 (BF16 and F16 activations: n <= 2; F32 activations: n <= 8); everything
 * else goes through cuBLASLt.
 *
 * A KCudaGemm holds the cuBLASLt handle, a 32 MiB workspace, the F32-activation scratch and a
 * cache of algorithms per (row bucket, N, K, dtypes, bias, alignment). It is created once per
 * device (at start-up: it allocates) and used by one thread at a time. The first eager call of
 * a bucket of at most 1024 rows times cuBLASLt's candidates on its operands, so it waits for
 * the stream once; calls never allocate once a shape's bucket has been seen, so run each shape
 * once before capturing a CUDA graph (as the warm-up does), after which calls are capturable
 * (a bucket first seen under capture takes the heuristic's first candidate, untimed). */
typedef struct KCudaGemm KCudaGemm;

/* max_rows_times_k bounds n * K of F32-activation calls on 16-bit weights that take cuBLASLt
 * (n > 8, K % 8 != 0 or x not 16-byte aligned); larger batches are done in row chunks, and
 * 0 allows none (such a call aborts). Device memory: 32 MiB + 4 * max_rows_times_k bytes. */
KCudaGemm *k_cuda_gemm_create(size_t max_rows_times_k);
void k_cuda_gemm_destroy(KCudaGemm *g); /* NULL: no-op */

/* Device bytes the gemm holds (workspace + scratch), for the memory budget. */
size_t k_cuda_gemm_device_bytes(const KCudaGemm *g);

/* out[n, N] (act) = x[n, K] (act) * w^T (+ bias) on `stream`; out must not alias x. */
void k_cuda_matmul(KCudaGemm *g, void *out, const void *x, DType act, const Tensor *w,
                   const Tensor *bias, int n, void *stream);

/* A projection and the op after it, fused where k_cuda_matmul would take its GEMV (n <= 2,
 * 16-bit weights; for qkv also a cache in the act dtype and no qk_norm), else the two calls; the
 * same results either way. k_cuda_matmul_qkv_rope_cache = k_cuda_matmul(qkv, x, w, bias) then
 * k_cuda_qkv_rope_cache(q_out, qkv, ...); k_cuda_matmul_silu_mul = k_cuda_matmul(gate_up, x,
 * w) then k_cuda_silu_mul(out, gate_up, n, N / 2) (beyond the GEMV's rows also the own GEMM
 * below, equal but for the order of the K sums). qkv and gate_up are scratch of the
 * projection's size whose contents afterwards are unspecified. k_cuda_matmul_qkv_rope_cache
 * with `pre` first runs k_cuda_add_rmsnorm(pre->residual, pre->delta, x, ...), or, for the
 * one-row fp8 GEMV, the norm quantizes x straight for it (x is then not written).
 * (kernels/cuda/gemv_fused.cu) */
void k_cuda_matmul_qkv_rope_cache(KCudaGemm *g, void *q_out, void *qkv, void *x,
                                  const AddNormIn *pre, DType act, const Tensor *w,
                                  const Tensor *bias, const int32_t *positions,
                                  const int64_t *slot_mapping, int n, int nh, const Rope *rope,
                                  const QkNorm *qk_norm, void *kv_cache, const KvLayout *l,
                                  int layer, void *stream);
void k_cuda_matmul_silu_mul(KCudaGemm *g, void *out, void *gate_up, const void *x, DType act,
                            const Tensor *w, int n, void *stream);

/* Beyond the GEMV's rows, on an sm_90a build and a compute capability 9.0 GPU,
 * k_cuda_matmul_silu_mul can run as one own wgmma GEMM with SiLU times up in its epilogue
 * (kernels/cuda/gemm_sm90a.cu; the same results but for the order of the K sums): its tile
 * variants are timed against the pair on the first eager call of each row bucket (16-bit
 * activations and weights, up to 512 rows) and the fastest is kept. Forcing a path (tests,
 * benchmarks: k_cuda_gemm_force_silu_mul) skips the timing; a forced variant that does not
 * take a call runs the pair. The paths: the pair, the own GEMM (tiles of 128 rows by 224
 * weight rows), and its CTA pairs (the two row tiles of a column tile share the weights by
 * multicast; an even number of row tiles only). */
typedef enum {
    KC_SILU_MUL_AUTO = -2,
    KC_SILU_MUL_PAIR = -1,
    KC_SILU_MUL_N224 = 0,
    KC_SILU_MUL_N224_CLUSTER2,
} KCudaSiluMulPath;
void k_cuda_gemm_force_silu_mul(KCudaGemm *g, KCudaSiluMulPath path);
int k_cuda_wgmma_available(void); /* 1: this build has the sm_90a kernels and the GPU runs them */

/* residual += x w^T, then normed = rmsnorm(residual) * norm_w: k_cuda_matmul(proj, x, w) then
 * k_cuda_add_rmsnorm(residual, proj, normed, norm_w, n, N), or, where it measured faster for
 * the shape (16-bit activations and weights, 3 to 512 rows), K split into 2 or 4 fp32 partial
 * products that the add + RMSNorm sums: the same results but for the order of the K sums.
 * proj is scratch of [n, N] whose contents afterwards are unspecified. A KCudaProjNorm holds
 * the partials buffer (allocated by the first eager call) and the per-shape choices; one per
 * device and activation dtype, used by one thread at a time; run each shape eagerly before
 * capturing it, as for k_cuda_matmul. (kernels/cuda/matmul_norm.cu) */
typedef struct KCudaProjNorm KCudaProjNorm;
KCudaProjNorm *k_cuda_proj_norm_create(void);
void k_cuda_proj_norm_destroy(KCudaProjNorm *p); /* NULL: no-op */
void k_cuda_matmul_add_rmsnorm(KCudaProjNorm *p, KCudaGemm *g, void *residual, void *normed,
                               void *proj, const void *x, DType act, const Tensor *w,
                               const Tensor *norm_w, int n, float eps, void *stream);
/* For tests: every later call of p takes `splits` partials (2 or 4) where the call can, else
 * the plain pair (0: always); -1 restores the measured choice. */
void k_cuda_proj_norm_force(KCudaProjNorm *p, int splits);

/* An op and the fp8 projection reading its output, fused where k_cuda_matmul would quantize
 * that output (an fp8 w beyond the GEMV's rows for cuBLASLt or the wgmma kernel, or one row for
 * the one-row GEMV; kernels/cuda/matmul_fp8.cu): the op's kernel quantizes the rows as it writes
 * them, and the GEMM or GEMV follows; else the two calls.
 * The same out and residual either way; where fused, the rows of normed / act_out that the
 * GEMM reads quantized are not written. 1 when fused, else 0. k_cuda_add_rmsnorm_matmul =
 * k_cuda_add_rmsnorm(residual, delta, normed, norm_w, n, K) then k_cuda_matmul(out, normed, w,
 * bias, n); k_cuda_silu_mul_matmul = k_cuda_silu_mul(act_out, gate_up, n, K) then
 * k_cuda_matmul(out, act_out, w, NULL, n), K = w->shape[1]. (kernels/cuda/matmul_fp8_fused.cu) */
int k_cuda_add_rmsnorm_matmul(KCudaGemm *g, void *out, void *residual, const void *delta,
                              void *normed, DType act, const Tensor *norm_w, const Tensor *w,
                              const Tensor *bias, int n, float eps, void *stream);
int k_cuda_silu_mul_matmul(KCudaGemm *g, void *out, void *act_out, const void *gate_up, DType act,
                           const Tensor *w, int n, void *stream);

/* For tests and benchmarks: force every later call of g onto one path (KC_GEMM_GEMV applies
 * only where the GEMV can run, else cuBLASLt; KC_GEMM_CUBLASLT also turns the fused
 * projections into their two calls), and the GEMV's weight rows per warp (1, 2 or 4; 0 = the
 * tuned choice; the fused projections always take 2). KC_GEMM_AUTO, 0 restores the default. */
typedef enum { KC_GEMM_AUTO = 0, KC_GEMM_CUBLASLT = 1, KC_GEMM_GEMV = 2 } KCudaGemmPath;
void k_cuda_gemm_force(KCudaGemm *g, KCudaGemmPath path, int gemv_rows);

/* ---- sampling and logprobs (kernels/cuda/sample.cu, kernels/cuda/logprobs.cu) ----
 *
 * k_cuda_sample picks the next token of every row of logits[n, vocab] in one call, with the
 * CPU `sample` op's semantics (kernels/cpu/sample.c): repetition penalty over prompt and
 * output tokens, frequency and presence penalties over output tokens, temperature (< 1e-5:
 * argmax, lowest id on ties), top-k, top-p, min-p, and one draw u = k_random_uniform(seed,
 * num_output) (bit-exact on the device) walked down the ranking (logit descending, id
 * ascending); rows with temperature alone take the CPU op's exponential race instead
 * (k_random_exponential, bit-exact here but for the logarithms). Same inputs, same token as
 * the CPU op, except at a near-tie: where the draw or the top-p cut falls within rounding
 * (about 1e-9 of the mass) of a boundary between two tokens, a weight within an ulp of min_p,
 * since sums are fixed-point here and double there and exp may differ by an ulp, or where
 * the race's two best scores lie within ~1e-4 (fast logarithms here). Seeded results never
 * depend on the batch.
 *
 * The logits are modified in place only by the penalties (the history tokens' entries, NaN
 * read as -inf there); NaN elsewhere reads as -inf and nothing else is written (the CPU op
 * also leaves the scaled, filtered row behind). Rows sampled twice (forks of an n > 1 request)
 * need a copy each. A row is read by a cluster of up to 8 blocks (fewer as rows grow, one at
 * 256 rows), once for greedy and temperature-only rows (the argmax, or the race's argmax) and 3
 * to 5 times for the others (argmax, weight histogram, one gather per top-k / top-p / draw) plus
 * small sorts in shared memory. On the H200 (vocab 128256): 1 row 9.7 us greedy, 17.2 us at
 * temperature 1 (the race), 45 us with top-p; 256 rows 39 us greedy, 103 us at temperature 1
 * (73.6 us since the race's per-token arithmetic was trimmed, session 15), 285 us with top-p
 * (KC_SAMPLE_ARGMAX_ONLY where it applies; tests/test_sample_cuda.c prints
 * the cases). */
/* One row's parameters (kernels.h). */
typedef SampleRow KCudaSampleRow;

/* k_cuda_sample flags: promises about every row that skip work (a broken promise gives wrong
 * tokens, nothing worse). */
enum {
    KC_SAMPLE_NO_PENALTIES = SAMPLE_NO_PENALTIES, /* no penalty pass, history unread */
    KC_SAMPLE_ARGMAX_ONLY = SAMPLE_ARGMAX_ONLY,   /* greedy or temperature-only rows: an
                                                   * argmax kernel without shared memory */
};

/* Workspace bytes for up to max_rows rows of `vocab` with at most max_history packed history
 * tokens (about 16 MiB of occurrence counts at vocab 128256, plus 4 bytes a history token).
 * Allocate once; calls need no zeroing between them. */
size_t k_cuda_sample_workspace_bytes(int max_rows, int vocab, int max_history);

/* tokens[n] (device) = the token picked from each row; token_logits[n] (device, or NULL) = that
 * token's logit before penalties (the logprob is token_logits[i] - lse[i] of k_cuda_logprobs).
 * rows[n] (device) describes each row; history (device) holds the packed token ids the rows
 * point into, read only for rows with a penalty (may be NULL under KC_SAMPLE_NO_PENALTIES,
 * as may the workspace). A history token outside the vocabulary, or a history range beyond
 * max_history, traps the kernel. Capturable; never allocates. */
void k_cuda_sample(int32_t *tokens, float *token_logits, float *logits, int n, int vocab,
                   const KCudaSampleRow *rows, const int32_t *history, int flags, void *workspace,
                   size_t workspace_bytes, void *stream);

/* Most top logprobs per row k_cuda_logprobs returns (the backend's max_top_logprobs). */
#define KC_MAX_TOP_LOGPROBS 20

/* Log-softmax statistics of raw rows (call before k_cuda_sample modifies them), as the engine
 * computes them on the host: lse[n] = max + log(sum exp(x - max)), and the k (0..20, at most
 * vocab) best (id, logit - lse) of each row in top_ids[n, k], top_logprobs[n, k], best first,
 * the lower id first on equal logits. NaN reads as -inf. One pass over each row. */
void k_cuda_logprobs(float *lse, int32_t *top_ids, float *top_logprobs, const float *logits, int n,
                     int vocab, int k, void *stream);

/* logits[edits[i].row, edits[i].token] += edits[i].add for i < n (edits in device memory;
 * entries for the same logit sum, in any order). Capturable; never allocates. */
void k_cuda_logits_add(float *logits, int vocab, const LogitEdit *edits, int n, void *stream);

/* The logits_mask op (kernels.h): rows rows[i] of logits keep the tokens whose bit is set in
 * masks[i] ((vocab + 31) / 32 words), the others become -inf (all in device memory, n rows, at
 * most 65535). Capturable; never allocates. */
void k_cuda_logits_mask(float *logits, int vocab, const uint32_t *masks, const int32_t *rows, int n,
                        void *stream);

#ifdef __cplusplus
}
#endif

#endif
