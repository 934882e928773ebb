/* copy.cu - data movement on the device: gathering the rows whose logits are wanted,
 * whole-KV-block copies (copy-on-write) for many (src, dst) pairs in one launch, 16 bytes per
 * thread when the block size allows, and a step's input ids taken from the tokens its
 * predecessor sampled (asynchronous scheduling). Host<->device swaps are cudaMemcpyAsync calls made
 * by the engine (one contiguous copy per block thanks to the block-major layout). */
#include "cuda_internal.cuh"

template <typename T>
__global__ void gather_rows_kernel(T *out, const T *in, const int32_t *rows, int dim) {
    const T *src = in + (size_t)rows[blockIdx.x] * dim;
    T *dst = out + (size_t)blockIdx.x * dim;
    for (int d = threadIdx.x; d < dim; d += blockDim.x)
        dst[d] = src[d];
}

void k_cuda_gather_rows(void *out, const void *in, const int32_t *rows, DType act, int n, int dim,
                        void *stream) {
    if (n <= 0 || dim <= 0)
        return;
    KC_DISPATCH_ACT(act, "k_cuda_gather_rows", T,
                    gather_rows_kernel<T>
                    <<<n, 256, 0, kc_stream(stream)>>>((T *)out, (const T *)in, rows, dim));
    CUDA_CHECK_LAUNCH();
}

/* grid (pair, slice): slice y of pair x copies every gridDim.y-th run of blockDim.x units. */
template <typename U>
__global__ void copy_blocks_kernel(char *dst_pool, const char *src_pool, const int32_t *src_dst,
                                   size_t block_bytes) {
    size_t src = (size_t)src_dst[2 * blockIdx.x], dst = (size_t)src_dst[2 * blockIdx.x + 1];
    const U *s = (const U *)(src_pool + src * block_bytes);
    U *d = (U *)(dst_pool + dst * block_bytes);
    size_t units = block_bytes / sizeof(U);
    for (size_t i = (size_t)blockIdx.y * blockDim.x + threadIdx.x; i < units;
         i += (size_t)gridDim.y * blockDim.x)
        d[i] = s[i];
}

void k_cuda_copy_blocks(void *dst_pool, const void *src_pool, const int32_t *src_dst, int n,
                        size_t block_bytes, void *stream) {
    if (n <= 0 || block_bytes == 0)
        return;
    int vec =
        block_bytes % 16 == 0 && (uintptr_t)dst_pool % 16 == 0 && (uintptr_t)src_pool % 16 == 0;
    size_t units = vec ? block_bytes / 16 : block_bytes;
    size_t slices = (units + 255) / 256;
    dim3 grid((unsigned)n, (unsigned)(slices < 32 ? slices : 32));
    if (vec)
        copy_blocks_kernel<uint4><<<grid, 256, 0, kc_stream(stream)>>>(
            (char *)dst_pool, (const char *)src_pool, src_dst, block_bytes);
    else
        copy_blocks_kernel<unsigned char><<<grid, 256, 0, kc_stream(stream)>>>(
            (char *)dst_pool, (const char *)src_pool, src_dst, block_bytes);
    CUDA_CHECK_LAUNCH();
}

__global__ void scatter_tokens_kernel(int32_t *tokens, const int32_t *sampled, const int32_t *pairs,
                                      int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        tokens[pairs[2 * i]] = sampled[pairs[2 * i + 1]];
}

void k_cuda_scatter_tokens(int32_t *tokens, const int32_t *sampled, const int32_t *pairs, int n,
                           void *stream) {
    if (n <= 0)
        return;
    scatter_tokens_kernel<<<(n + 255) / 256, 256, 0, kc_stream(stream)>>>(tokens, sampled, pairs,
                                                                          n);
    CUDA_CHECK_LAUNCH();
}
