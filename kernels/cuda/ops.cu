/* ops.cu - the CUDA backend's KernelOps table: the model's op sequence on one GPU, with
 * fp32 activations (the first, exact configuration: outputs match the CPU reference within
 * fp32 tolerance) over fp32 or 16-bit weights and an fp32 KV cache. Everything runs on the
 * default stream, so the synchronous copies order themselves with the kernels.
 *
 * State shared by the ops (the cuBLASLt handle, the decode-attention workspace, the device
 * copy of copy-on-write pairs) is created on first use of the table and kept for the process:
 * one GPU per process for now (tensor parallelism will give each rank its own). Sampling is
 * not here: the engine samples on the host from the logits it copies back. */
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.cuh"

/* Largest n * K of an fp32-activation matmul on 16-bit weights done in one piece (larger
 * batches are split into row chunks by k_cuda_matmul). */
#define GEMM_SCRATCH_ELEMS ((size_t)2048 * 16384)

static KCudaGemm *gemm;
static void *attn_workspace;
static size_t attn_workspace_bytes;
static int32_t *cow_pairs; /* device copy of copy-on-write pairs */
static int cow_pairs_cap;

static void *ops_alloc(size_t bytes) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError(); /* not sticky: clear it and let the caller report */
        return NULL;
    }
    CUDA_CHECK(e);
    k_cuda_memset(p, 0, bytes);
    return p;
}

static size_t ops_free_memory(void) {
    size_t free_bytes = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    return free_bytes;
}

static void *ops_alloc_host(size_t bytes) {
    void *p = NULL;
    cudaError_t e = cudaMallocHost(&p, bytes ? bytes : 1);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        return NULL;
    }
    CUDA_CHECK(e);
    memset(p, 0, bytes);
    return p;
}

static void ops_free_host(void *p) {
    if (p)
        CUDA_CHECK(cudaFreeHost(p));
}

static void ops_swap_blocks(void *dst_pool, const void *src_pool, const int32_t *src_dst, int n,
                            size_t block_bytes) {
    for (int i = 0; i < n; i++) /* block-major: one contiguous copy per block */
        CUDA_CHECK(cudaMemcpyAsync((char *)dst_pool + (size_t)src_dst[2 * i + 1] * block_bytes,
                                   (const char *)src_pool + (size_t)src_dst[2 * i] * block_bytes,
                                   block_bytes, cudaMemcpyDefault, 0));
    CUDA_CHECK(cudaStreamSynchronize(0));
}

static void ops_copy_blocks(void *dst_pool, const void *src_pool, const int32_t *src_dst, int n,
                            size_t block_bytes) {
    if (n > cow_pairs_cap) {
        k_cuda_free(cow_pairs);
        cow_pairs_cap = n * 2;
        cow_pairs = (int32_t *)k_cuda_malloc((size_t)cow_pairs_cap * 2 * sizeof(int32_t));
    }
    k_cuda_memcpy(cow_pairs, src_dst, (size_t)n * 2 * sizeof(int32_t));
    k_cuda_copy_blocks(dst_pool, src_pool, cow_pairs, n, block_bytes, NULL);
}

static void ops_embedding(float *out, const int32_t *ids, int n, const Tensor *table) {
    k_cuda_embedding(out, DT_F32, ids, n, table, NULL);
}

static void ops_rmsnorm(float *out, const float *x, const Tensor *w, int n, int dim, float eps) {
    k_cuda_rmsnorm(out, x, DT_F32, w, n, dim, eps, NULL);
}

static void ops_add_rmsnorm(float *residual, const float *delta, float *out, const Tensor *w, int n,
                            int dim, float eps) {
    k_cuda_add_rmsnorm(residual, delta, out, DT_F32, w, n, dim, eps, NULL);
}

static void ops_matmul(float *out, const float *x, const Tensor *w, const Tensor *bias, int n) {
    if (!gemm)
        gemm = k_cuda_gemm_create(GEMM_SCRATCH_ELEMS);
    k_cuda_matmul(gemm, out, x, DT_F32, w, bias, n, NULL);
}

static void ops_rope(float *q, float *k, const int32_t *positions, int n, int nh, int nkv,
                     const Rope *rope) {
    k_cuda_rope(q, k, DT_F32, positions, n, nh, nkv, rope, NULL);
}

static void ops_kv_write(void *kv_cache, const KvLayout *l, int layer, const float *k,
                         const float *v, const int64_t *slot_mapping, int n) {
    k_cuda_kv_write(kv_cache, l, layer, k, v, DT_F32, slot_mapping, n, NULL);
}

/* A batch of single-token sequences (pure decode) takes the decode kernel, anything with a
 * prompt chunk the prefill kernel (both are exact for any batch). */
static void ops_attention(float *out, const float *q, const void *kv_cache, const KvLayout *l,
                          int layer, const AttnBatch *b, int nh, float scale) {
    if (b->num_tokens != b->num_seqs) {
        k_cuda_attention_prefill(out, q, DT_F32, kv_cache, l, layer, b, nh, scale, NULL);
        return;
    }
    size_t need = k_cuda_attention_workspace_bytes(l, b->num_tokens, nh, b->max_blocks_per_seq);
    if (need > attn_workspace_bytes) {
        k_cuda_free(attn_workspace);
        attn_workspace_bytes = need * 2;
        attn_workspace = k_cuda_malloc(attn_workspace_bytes);
    }
    k_cuda_attention_decode(out, q, DT_F32, kv_cache, l, layer, b, nh, scale, attn_workspace,
                            attn_workspace_bytes, NULL);
}

static void ops_silu_mul(float *out, const float *gate, const float *up, int n, int dim) {
    k_cuda_silu_mul(out, gate, up, DT_F32, n, dim, NULL);
}

static void ops_gather_rows(float *out, const float *in, const int32_t *rows, int n, int dim) {
    k_cuda_gather_rows(out, in, rows, DT_F32, n, dim, NULL);
}

static KernelOps make_ops(void) {
    KernelOps o;
    memset(&o, 0, sizeof o);
    o.name = "cuda";
    o.host_memory = 0;
    o.alloc = ops_alloc;
    o.free = k_cuda_free;
    o.to_device = k_cuda_memcpy;
    o.to_host = k_cuda_memcpy;
    o.free_memory = ops_free_memory;
    o.alloc_host = ops_alloc_host;
    o.free_host = ops_free_host;
    o.swap_blocks = ops_swap_blocks;
    o.embedding = ops_embedding;
    o.rmsnorm = ops_rmsnorm;
    o.add_rmsnorm = ops_add_rmsnorm;
    o.matmul = ops_matmul;
    o.rope = ops_rope;
    o.kv_write = ops_kv_write;
    o.attention = ops_attention;
    o.silu_mul = ops_silu_mul;
    o.gather_rows = ops_gather_rows;
    o.copy_blocks = ops_copy_blocks;
    o.sample = NULL; /* the engine samples on the host */
    return o;
}

static const KernelOps cuda_ops = make_ops();

const KernelOps *k_cuda_ops(void) {
    return &cuda_ops;
}
