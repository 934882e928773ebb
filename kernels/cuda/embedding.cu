/* embedding.cu - token embedding lookup: rows of an F32/F16/BF16 table copied out in the
 * activation dtype, one block per token. */
#include <stdio.h>

#include "cuda_internal.cuh"

template <typename TO, typename TW>
__global__ void embedding_kernel(TO *out, const int32_t *ids, const TW *table, int64_t vocab,
                                 int H) {
    int i = blockIdx.x;
    int id = ids[i];
    if (id < 0 || id >= vocab) {
        if (threadIdx.x == 0)
            printf("k_cuda_embedding: token id %d outside the table of %lld rows\n", id,
                   (long long)vocab);
        __trap();
    }
    const TW *row = table + (size_t)id * H;
    TO *o = out + (size_t)i * H;
    for (int d = threadIdx.x; d < H; d += blockDim.x)
        o[d] = from_f32<TO>(to_f32(row[d]));
}

void k_cuda_embedding(void *out, DType act, const int32_t *ids, int n, const Tensor *table,
                      void *stream) {
    KC_REQUIRE(table->ndim == 2, "k_cuda_embedding: table must be 2-D");
    if (n <= 0)
        return;
    int H = (int)table->shape[1];
    KC_DISPATCH_ACT(
        act, "k_cuda_embedding", TO,
        KC_DISPATCH_WEIGHT(table->dtype, "k_cuda_embedding", TW,
                           embedding_kernel<TO, TW><<<n, 256, 0, kc_stream(stream)>>>(
                               (TO *)out, ids, (const TW *)table->data, table->shape[0], H)));
    CUDA_CHECK_LAUNCH();
}
