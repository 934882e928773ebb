/* kv_fp8.cuh - (internal to kernels/cuda/) the fp8 KV cache's element type and conversions:
 * stores e4m3(x * (1 / s)) with round to nearest even and saturation (__NV_SATFINITE: as
 * pl_f32_to_f8e4m3), loads dec(q) exactly (e4m3 -> f16 is exact, one instruction per pair on
 * sm_89 and newer), and the dtype dispatch of a cache that may be fp8. The scale s itself is
 * applied by the kernels in fp32 (attention: on the scores and the output, kernels' banners). */
#ifndef PAGELLM_KERNELS_CUDA_KV_FP8_CUH
#define PAGELLM_KERNELS_CUDA_KV_FP8_CUH

#include <cuda_fp8.h>

#include "cuda_internal.cuh"

typedef __nv_fp8_e4m3 kv8; /* an element of an fp8 (DT_F8E4M3) KV cache */

template <typename TC> struct is_kv8 : std::false_type {};
template <> struct is_kv8<kv8> : std::true_type {};

__device__ __forceinline__ float to_f32(kv8 x) {
    return (float)x;
}

/* x as a cache element: rounded to TC, or for fp8 e4m3(x * inv) (inv = 1 / the scale). */
template <typename TC> __device__ __forceinline__ TC kv_enc(float x, float inv) {
    return from_f32<TC>(x);
}
template <> __device__ __forceinline__ kv8 kv_enc<kv8>(float x, float inv) {
    kv8 r;
    r.__x = __nv_cvt_float_to_fp8(x * inv, __NV_SATFINITE, __NV_E4M3);
    return r;
}

/* 8 values stored as cache elements (same alignment rules as store8; 8 bytes for fp8). */
template <typename TC> __device__ __forceinline__ void kv_store8(TC *p, const float v[8], float) {
    store8(p, v);
}
__device__ __forceinline__ void kv_store8(kv8 *p, const float v[8], float inv) {
    uint32_t w[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        uint32_t b[4];
#pragma unroll
        for (int j = 0; j < 4; j++)
            b[j] = __nv_cvt_float_to_fp8(v[4 * i + j] * inv, __NV_SATFINITE, __NV_E4M3);
        w[i] = b[0] | b[1] << 8 | b[2] << 16 | b[3] << 24;
    }
    *(uint2 *)p = make_uint2(w[0], w[1]);
}

/* Two e4m3 bytes (lo in bits 0-7) as an f16 pair (lo in the low half), exactly. */
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t two) {
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(two & 0xffffu), __NV_E4M3);
    return (uint32_t)h.x | (uint32_t)h.y << 16;
}

/* Four e4m3 bytes of u as fp32, lowest byte first. */
__device__ __forceinline__ void e4m3x4_to_f32(float f[4], uint32_t u) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const uint32_t h = e4m3x2_to_f16x2(u >> (16 * i));
        const float2 t = __half22float2(*(const __half2 *)&h);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}

/* 8 fp8 cache elements held in 8 bytes as fp32. */
__device__ __forceinline__ void unpack8(float f[8], uint2 u, const kv8 *) {
    e4m3x4_to_f32(f, u.x);
    e4m3x4_to_f32(f + 4, u.y);
}
__device__ __forceinline__ void load8(float out[8], const kv8 *p) {
    unpack8(out, *(const uint2 *)p, p);
}

/* Cache dtypes: body runs with TC bound (F32, BF16, F16, or fp8 e4m3). */
#define KC_DISPATCH_KV(dt, what, TC, ...)                                                          \
    do {                                                                                           \
        if ((dt) == DT_F8E4M3) {                                                                   \
            using TC = kv8;                                                                        \
            __VA_ARGS__;                                                                           \
        } else {                                                                                   \
            KC_DISPATCH_ACT(dt, what, TC, __VA_ARGS__);                                            \
        }                                                                                          \
    } while (0)

#endif
