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

/* The one-shot all-reduce group of devices 0..n-1 (ranks = devices): peer access enabled
 * between them and each given its staging buffer, inbox and flags. NULL (nothing set up) when
 * n is not in [2, 8] or some pair of devices cannot reach each other's memory: NCCL does
 * every all-reduce. Destroy after every rank's work has finished (NULL: no-op). */
typedef struct KCudaArGroup KCudaArGroup;
KCudaArGroup *k_cuda_ar_create(int n);
void k_cuda_ar_destroy(KCudaArGroup *g);

/* Whether group g (NULL: none) takes `bytes` of activations at `buf` (16-byte aligned, at most
 * the staging size; rows of `dim` elements a multiple of 16 bytes for the fused op, dim 0 for
 * a plain sum). */
int k_cuda_ar_fits(const KCudaArGroup *g, const void *buf, size_t bytes, int dim, DType act);

/* buf[count] summed over the ranks in place; every rank's thread calls it at once with its
 * rank, on a stream of the rank's device. */
void k_cuda_ar_sum(const KCudaArGroup *g, int rank, void *buf, DType act, size_t count,
                   cudaStream_t stream);

/* delta summed over the ranks (ranks in order, fp32), residual += that sum (rounded to the act
 * dtype), out = rmsnorm(residual) * w, rows [n, dim]; delta is only read. */
void k_cuda_ar_add_rmsnorm(const KCudaArGroup *g, int rank, void *residual, const void *delta,
                           void *out, DType act, const Tensor *w, int n, int dim, float eps,
                           cudaStream_t stream);

/* out[n, H] = table[ids[i] - first] for ids inside the table's rows, else zeros. */
void k_cuda_embedding_slice(void *out, DType act, const int32_t *ids, int n, const Tensor *table,
                            int first, cudaStream_t stream);

/* out[n, vocab] (fp32) from parts[size, n, shard] (act dtype), ids >= vocab dropped. */
void k_cuda_vocab_logits_f32(float *out, const void *parts, DType act, int n, int vocab, int shard,
                             int size, cudaStream_t stream);

#endif
