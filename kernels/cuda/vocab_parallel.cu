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

void k_cuda_vocab_logits_f32(float *out, const void *parts, DType act, int n, int vocab, int shard,
                             int size, cudaStream_t stream) {
    KC_REQUIRE(shard > 0 && (int64_t)shard * size >= vocab,
               "k_cuda_vocab_logits_f32: %d slices of %d do not cover a vocabulary of %d", size,
               shard, vocab);
    KC_REQUIRE(n <= 65535, "k_cuda_vocab_logits_f32: %d rows, at most 65535", n);
    if (n <= 0)
        return;
    dim3 grid((unsigned)(vocab + 255) / 256, (unsigned)n);
    KC_DISPATCH_ACT(act, "k_cuda_vocab_logits_f32", T,
                    vocab_logits_kernel<T>
                    <<<grid, 256, 0, stream>>>(out, (const T *)parts, n, vocab, shard));
    CUDA_CHECK_LAUNCH();
}
