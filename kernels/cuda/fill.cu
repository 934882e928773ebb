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

/* e4m3 of f, bit for bit as common.c's pl_f32_to_f8e4m3 (round to nearest even, saturating
 * at +-448, NaN kept): the host fill and this one must agree. */
__device__ __forceinline__ uint8_t f32_to_e4m3(float f) {
    uint32_t u = __float_as_uint(f);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return sign | 0x7f;
    if (a >= 0x43e00000u)
        return sign | 0x7e;
    if (a < 0x3c800000u) /* a multiple of 2^-9 below 2^-6: exact product, rintf ties to even */
        return sign | (uint8_t)rintf(__fmul_rn(__uint_as_float(a), 512.0f));
    uint32_t q = ((((a >> 23) & 0xffu) - 127u + 7u) << 3) | ((a >> 20) & 7u);
    uint32_t rem = a & 0xfffffu;
    if (rem > 0x80000u || (rem == 0x80000u && (q & 1u)))
        q++;
    return sign | (uint8_t)q;
}

/* The fp8 weights of load-format dummy: e4m3 of the same uniforms (scale 448 for them). */
struct E4m3Out {
    uint8_t v;
};
template <typename T> __device__ __forceinline__ T fill_out(float x) {
    return from_f32<T>(x);
}
template <> __device__ __forceinline__ E4m3Out fill_out<E4m3Out>(float x) {
    return E4m3Out{f32_to_e4m3(x)};
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
        dst[2 * j] = fill_out<T>(a);
        if (2 * j + 1 < n)
            dst[2 * j + 1] = fill_out<T>(b);
    }
}

void k_cuda_fill_dummy(void *dst, DType dt, size_t n, uint64_t key, float scale, void *stream) {
    if (n == 0)
        return;
    float k = 2.0f * scale / 16777216.0f;
    if (dt == DT_F8E4M3) {
        fill_dummy_kernel<E4m3Out><<<kc_blocks((n + 1) / 2, 256), 256, 0, kc_stream(stream)>>>(
            (E4m3Out *)dst, n, key, scale, k);
        CUDA_CHECK_LAUNCH();
        return;
    }
    KC_DISPATCH_WEIGHT(
        dt, "k_cuda_fill_dummy", T,
        fill_dummy_kernel<T>
        <<<kc_blocks((n + 1) / 2, 256), 256, 0, kc_stream(stream)>>>((T *)dst, n, key, scale, k));
    CUDA_CHECK_LAUNCH();
}
