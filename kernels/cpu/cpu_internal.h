/* cpu_internal.h - (internal to kernels/cpu/) the CPU ops, shared by ops.c's table, plus the
 * helpers they share: dtype conversion, per-thread scratch and the worker pool.
 *
 * Determinism rule for every op here: the floating-point operations that produce one output
 * element depend only on that element's inputs and the shapes, never on the batch size, the
 * row's position in the batch or the number of threads. So a sequence computes bit-identical
 * values whatever it is batched with, and after preemption. */
#ifndef PAGELLM_KERNELS_CPU_INTERNAL_H
#define PAGELLM_KERNELS_CPU_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common.h"
#include "kernels.h"

/* ---- ops (one file each; gather_rows and copy_blocks in copy.c) ---- */
void cpu_embedding(const KernelOps *ops, void *out, const int32_t *ids, int n, const Tensor *table);
void cpu_embedding_slice(const KernelOps *ops, void *out, const int32_t *ids, int n,
                         const Tensor *table, int first);
void cpu_rmsnorm(const KernelOps *ops, void *out, const void *x, const Tensor *w, int n, int dim,
                 float eps);
void cpu_add_rmsnorm(const KernelOps *ops, void *residual, const void *delta, void *out,
                     const Tensor *w, int n, int dim, float eps);
void cpu_matmul(const KernelOps *ops, void *out, const void *x, const Tensor *w, const Tensor *bias,
                int n);
/* matmul with an fp8 weight (matmul_fp8.c; cpu_matmul calls it for DT_F8E4M3 weights). */
void cpu_matmul_fp8(const KernelOps *ops, float *out, const float *x, const Tensor *w,
                    const Tensor *bias, int n);
void cpu_rope(const KernelOps *ops, void *q, void *k, const int32_t *positions, int n, int nh,
              int nkv, const Rope *rope);
void cpu_kv_write(const KernelOps *ops, void *kv_cache, const KvLayout *l, int layer, const void *k,
                  const void *v, const int64_t *slot_mapping, int n);
void cpu_qkv_rope_cache(const KernelOps *ops, void *q_out, void *qkv, const int32_t *positions,
                        const int64_t *slot_mapping, int n, int nh, const Rope *rope,
                        const QkNorm *qk_norm, void *kv_cache, const KvLayout *l, int layer);
size_t cpu_moe_workspace_bytes(const KernelOps *ops, int max_rows, int num_experts, int hidden,
                               int inter, int top_k);
void cpu_moe_mlp(const KernelOps *ops, void *out, const void *x, const Tensor *router,
                 const Tensor *gate_up, const Tensor *down, int n, int top_k, int renormalize,
                 void *workspace, size_t workspace_bytes);
void cpu_attention(const KernelOps *ops, void *out, const void *q, const void *kv_cache,
                   const KvLayout *l, int layer, const AttnBatch *b, int nh, float scale,
                   float softcap, int window);
void cpu_silu_mul(const KernelOps *ops, void *out, const void *gate_up, int n, int dim);
void cpu_gelu_tanh_mul(const KernelOps *ops, void *out, const void *gate_up, int n, int dim);
void cpu_scale(const KernelOps *ops, void *x, size_t n, float s);
void cpu_logits_softcap(const KernelOps *ops, float *logits, size_t n, float cap);
void cpu_gather_rows(const KernelOps *ops, void *out, const void *in, const int32_t *rows, int n,
                     int dim);
void cpu_to_f32_op(const KernelOps *ops, float *out, const void *in, size_t n);
void cpu_vocab_logits_f32(const KernelOps *ops, float *out, const void *parts, int n, int vocab,
                          int shard, int size);
void *cpu_alloc(const KernelOps *ops, size_t bytes);
void cpu_free(const KernelOps *ops, void *p);
void cpu_copy(const KernelOps *ops, void *dst, const void *src, size_t bytes);
void cpu_copy_rows(const KernelOps *ops, void *dst, const void *src, size_t pitch, size_t row_bytes,
                   int rows);
size_t cpu_free_memory(const KernelOps *ops);
void cpu_copy_blocks(const KernelOps *ops, void *dst_pool, const void *src_pool,
                     const int32_t *src_dst, int n, size_t block_bytes);
void cpu_swap_blocks(const KernelOps *ops, void *dst_pool, const void *src_pool,
                     const int32_t *src_dst, int n, size_t block_bytes, int after_compute);
void cpu_scatter_tokens(const KernelOps *ops, int32_t *tokens, const int32_t *sampled,
                        const int32_t *pairs, int n);
void cpu_sample_rows(const KernelOps *ops, int32_t *tokens, float *token_logits, float *logits,
                     int n, int vocab, const SampleRow *rows, const int32_t *history, int flags,
                     void *workspace, size_t workspace_bytes);
void cpu_logits_add(const KernelOps *ops, float *logits, int vocab, const LogitEdit *edits, int n);
void cpu_logits_mask(const KernelOps *ops, float *logits, int vocab, const uint32_t *masks,
                     const int32_t *rows, int n);
void cpu_logprobs(const KernelOps *ops, float *lse, int32_t *top_ids, float *top_logprobs,
                  const float *logits, int n, int vocab, int k);

/* ---- SIMD dispatch (util.c) ---- */

/* 1 where this build has x86-64 AVX2 code paths (gcc or clang), else 0. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CPU_X86_SIMD 1
#else
#define CPU_X86_SIMD 0
#endif

/* 1 if the AVX2 paths run: the build has them, the CPU has AVX2, FMA and F16C with YMM state
 * enabled by the OS, and they are not switched off; else 0 (portable C). Probed once. */
int cpu_simd_level(void);

/* Tests only: 0 forces the portable paths, 1 allows the SIMD ones where the CPU has them.
 * Returns the previous setting. Set it while no op is running. */
int cpu_set_simd(int enable);

/* ---- dtype helpers (util.c) ---- */

/* Element i of a F32 / F16 / BF16 array as fp32. */
static inline float cpu_load_f32(const void *p, DType dt, size_t i) {
    switch (dt) {
        case DT_F32:
            return ((const float *)p)[i];
        case DT_F16:
            return pl_f16_to_f32(((const uint16_t *)p)[i]);
        case DT_BF16: {
            uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
            float f;
            memcpy(&f, &u, 4);
            return f;
        }
        default:
            pl_fatal(__FILE__, __LINE__, "unsupported dtype %s", pl_dtype_name(dt));
    }
}

/* dst[0..n) = src[first .. first+n) converted to fp32. */
void cpu_to_f32(float *dst, const void *src, DType dt, size_t first, size_t n);

/* A per-thread buffer of at least `bytes` for scratch slot `slot` (< CPU_SCRATCH_SLOTS),
 * 64-byte aligned. It grows (never shrinks) and lives as long as the thread; contents are
 * not preserved across growth. No allocation once it has reached the working size. */
enum { CPU_SCRATCH_SLOTS = 4 };
void *cpu_scratch(int slot, size_t bytes);

/* ---- worker pool (pool.c) and the backend's state (ops.c) ---- */

/* One share of a parallel region: do part `tid` of `nthreads`. */
typedef void (*CpuTaskFn)(void *ctx, int tid, int nthreads);

/* A pool of worker threads: `threads` >= 1 of them at most, the caller included, else one per
 * CPU this process may run on; started by the first parallel region. */
typedef struct CpuPool CpuPool;
CpuPool *cpu_pool_create(int threads);
void cpu_pool_destroy(CpuPool *pool); /* joins the workers; NULL: no-op */

/* Threads a region of the pool can use, the caller included (>= 1); starts the workers. */
int cpu_pool_threads(CpuPool *pool);

/* Run fn(ctx, tid, nt) for tid in [0, nt) on nt threads, nt = min(want, the pool's threads),
 * the caller running tid 0, and return when all are done. If the pool is already in use by
 * another thread, or want <= 1, the caller runs fn(ctx, 0, 1) alone: every op is written so
 * that the split does not change its results. */
void cpu_parallel(CpuPool *pool, CpuTaskFn fn, void *ctx, int want);

/* A CPU backend's state (KernelOps.state). */
typedef struct {
    CpuPool *pool;
    float *gather;       /* MPI rank: all_reduce's [size, count] parts (grown as needed) */
    size_t gather_count; /* its capacity in floats */
} CpuState;

static inline CpuPool *cpu_pool(const KernelOps *ops) {
    return ((CpuState *)ops->state)->pool;
}

/* The CPU backend's k_open and k_close (one rank). */
Status cpu_open(const KernelOpenOptions *o, KernelOps **out);
void cpu_close(KernelOps *ops);

/* An opened CPU rank becomes rank `rank` of an MPI job of `size` processes (kernels/mpi.c):
 * its all_reduce, all_reduce_add_rmsnorm and all_gather over MPI. PL_ERR_UNSUPPORTED without
 * an MPI build. */
Status cpu_mpi_join(KernelOps *ops, int size);

#endif
