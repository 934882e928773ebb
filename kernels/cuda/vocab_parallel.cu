/* vocab_parallel.cu - the vocabulary-parallel embedding and LM head's two kernels: the lookup
 * of the ids in this rank's slice of the embedding (zeros for the others, so that an
 * all-reduce completes every row), and the reordering of the gathered logits slices
 * [size, n, shard] into fp32 rows [n, vocab]. */
#include "cuda_internal.cuh"
#include "tensor_parallel.cuh"

template <typename TO, typename TW>
__global__ void embedding_slice_kernel(TO *out, const int32_t *ids, const TW *table, int64_t rows,
                                       int first, int H) {
    int64_t row = (int64_t)ids[blockIdx.x] - first;
    TO *o = out + (size_t)blockIdx.x * H;
    if (row < 0 || row >= rows) {
        for (int d = threadIdx.x; d < H; d += blockDim.x)
            o[d] = from_f32<TO>(0.0f);
        return;
    }
    const TW *src = table + (size_t)row * H;
    for (int d = threadIdx.x; d < H; d += blockDim.x)
        o[d] = from_f32<TO>(to_f32(src[d]));
}

void k_cuda_embedding_slice(void *out, DType act, const int32_t *ids, int n, const Tensor *table,
                            int first, cudaStream_t stream) {
    KC_REQUIRE(table->ndim == 2, "k_cuda_embedding_slice: table must be 2-D");
    if (n <= 0)
        return;
    int H = (int)table->shape[1];
    KC_DISPATCH_ACT(act, "k_cuda_embedding_slice", TO,
                    KC_DISPATCH_WEIGHT(
                        table->dtype, "k_cuda_embedding_slice", TW,
                        embedding_slice_kernel<TO, TW><<<n, 256, 0, stream>>>(
                            (TO *)out, ids, (const TW *)table->data, table->shape[0], first, H)));
    CUDA_CHECK_LAUNCH();
}

/* One thread per output element, blockIdx.y the row: coalesced writes, and reads coalesced
 * within each slice. */
template <typename T>
__global__ void vocab_logits_kernel(float *out, const T *parts, int n, int vocab, int shard) {
    int v = blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    if (v >= vocab)
        return;
    int r = v / shard;
    out[(size_t)t * vocab + v] = to_f32(parts[((size_t)r * n + t) * shard + (v - r * shard)]);
}

/* Slices a multiple of 8 wide, rows of a multiple of 4 and 16-byte aligned buffers: 8
 * consecutive ids per thread, always in one slice (one 16-byte load of a 16-bit type, two
 * 16-byte stores), the row's last vocab % 8 one at a time. (256 rows of 128256 from two
 * slices on the H200, bf16: 124.3 us with the kernel above, 58.1 so; ncu of test_kernels_cuda.) */
template <typename T>
__global__ void vocab_logits_vec_kernel(float *out, const T *parts, int n, int vocab, int shard) {
    const int v = 8 * (blockIdx.x * blockDim.x + threadIdx.x), t = blockIdx.y;
    if (v >= vocab)
        return;
    const int r = v / shard;
    const T *src = parts + ((size_t)r * n + t) * shard + (v - r * shard);
    float *dst = out + (size_t)t * vocab + v;
    if (v + 8 <= vocab) {
        float x[8];
        load8(x, src);
        store8(dst, x);
    } else {
        for (int i = 0; i < vocab - v; i++)
            dst[i] = to_f32(src[i]);
    }
}

void k_cuda_vocab_logits_f32(float *out, const void *parts, DType act, int n, int vocab, int shard,
                             int size, cudaStream_t stream) {
    KC_REQUIRE(shard > 0 && (int64_t)shard * size >= vocab,
               "k_cuda_vocab_logits_f32: %d slices of %d do not cover a vocabulary of %d", size,
               shard, vocab);
    KC_REQUIRE(n <= 65535, "k_cuda_vocab_logits_f32: %d rows, at most 65535", n);
    if (n <= 0)
        return;
    const bool vec = shard % 8 == 0 && vocab % 4 == 0 && kc_aligned16(out) && kc_aligned16(parts);
    const unsigned per_block = vec ? 8 * 256 : 256;
    dim3 grid(((unsigned)vocab + per_block - 1) / per_block, (unsigned)n);
    KC_DISPATCH_ACT(act, "k_cuda_vocab_logits_f32", T,
                    if (vec) vocab_logits_vec_kernel<T>
                    <<<grid, 256, 0, stream>>>(out, (const T *)parts, n, vocab, shard);
                    else vocab_logits_kernel<T>
                    <<<grid, 256, 0, stream>>>(out, (const T *)parts, n, vocab, shard));
    CUDA_CHECK_LAUNCH();
}
