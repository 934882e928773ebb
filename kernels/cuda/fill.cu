/* fill.cu - load-format dummy weights generated in place on the GPU: the same values as the
 * host fill in models/weights.c (element i of a tensor depends only on the tensor's key and
 * i), so a model filled here equals one filled on the host and uploaded, without the host
 * generating and copying gigabytes at start-up.
 *
 * Element pair (2j, 2j+1) comes from one 64-bit draw r = splitmix64(key + j * golden ratio):
 * the top 24 bits and bits 8..31 scaled to [-scale, scale). Products and differences use
 * explicit round-to-nearest intrinsics so the compiler cannot fuse them into an FMA, which
 * the host code (no FMA on baseline x86-64) does not do either. */
#include "cuda_internal.cuh"

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

template <typename T>
__global__ void fill_dummy_kernel(T *dst, size_t n, uint64_t key, float scale, float k) {
    size_t pairs = (n + 1) / 2;
    for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < pairs;
         j += (size_t)gridDim.x * blockDim.x) {
        float a = 1.0f, b = 1.0f;
        if (scale > 0.0f) {
            uint64_t r = mix64(key + (uint64_t)j * 0x9e3779b97f4a7c15ull);
            a = __fsub_rn(__fmul_rn((float)(uint32_t)(r >> 40), k), scale);
            b = __fsub_rn(__fmul_rn((float)(uint32_t)((r >> 8) & 0xffffffu), k), scale);
        }
        dst[2 * j] = from_f32<T>(a);
        if (2 * j + 1 < n)
            dst[2 * j + 1] = from_f32<T>(b);
    }
}

void k_cuda_fill_dummy(void *dst, DType dt, size_t n, uint64_t key, float scale, void *stream) {
    if (n == 0)
        return;
    float k = 2.0f * scale / 16777216.0f;
    KC_DISPATCH_WEIGHT(
        dt, "k_cuda_fill_dummy", T,
        fill_dummy_kernel<T>
        <<<kc_blocks((n + 1) / 2, 256), 256, 0, kc_stream(stream)>>>((T *)dst, n, key, scale, k));
    CUDA_CHECK_LAUNCH();
}
