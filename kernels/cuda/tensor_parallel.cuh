/* tensor_parallel.cuh - (internal to kernels/cuda/) what ops.cu uses for tensor parallelism
 * besides NCCL: the one-shot all-reduce over peer memory (allreduce.cu), alone or fused with
 * the residual add + RMSNorm that follows it, and the vocabulary-parallel embedding and
 * logits kernels (vocab_parallel.cu). Every call acts on the calling thread's current device,
 * device i being tensor-parallel rank i. */
#ifndef PAGELLM_KERNELS_CUDA_TENSOR_PARALLEL_CUH
#define PAGELLM_KERNELS_CUDA_TENSOR_PARALLEL_CUH

#include <cuda_runtime.h>
#include <stddef.h>

#include "kernels.h"

/* Enable peer access between devices 0..n-1 and give each its staging buffer, inbox and
 * flags.
 * Returns 0 when the one-shot path is on; -1 (nothing set up) when some pair of devices cannot
 * reach each other's memory: NCCL does every all-reduce. */
int k_cuda_ar_init(int n);
void k_cuda_ar_destroy(int n);

/* Whether the one-shot path is on for the current device and takes `bytes` of activations at
 * `buf` (16-byte aligned, at most the staging size; rows of `dim` elements a multiple of 16
 * bytes for the fused op, dim 0 for a plain sum). */
int k_cuda_ar_fits(const void *buf, size_t bytes, int dim, DType act);

/* buf[count] summed over the ranks in place; every rank's thread calls it at once. */
void k_cuda_ar_sum(void *buf, DType act, size_t count, cudaStream_t stream);

/* delta summed over the ranks (ranks in order, fp32), residual += that sum (rounded to the act
 * dtype), out = rmsnorm(residual) * w, rows [n, dim]; delta is only read. */
void k_cuda_ar_add_rmsnorm(void *residual, const void *delta, void *out, DType act, const Tensor *w,
                           int n, int dim, float eps, cudaStream_t stream);

/* out[n, H] = table[ids[i] - first] for ids inside the table's rows, else zeros. */
void k_cuda_embedding_slice(void *out, DType act, const int32_t *ids, int n, const Tensor *table,
                            int first, cudaStream_t stream);

/* out[n, vocab] (fp32) from parts[size, n, shard] (act dtype), ids >= vocab dropped. */
void k_cuda_vocab_logits_f32(float *out, const void *parts, DType act, int n, int vocab, int shard,
                             int size, cudaStream_t stream);

#endif
