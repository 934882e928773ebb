/* sample.cuh - (internal to kernels/cuda/) what sample.cu and logprobs.cu share: the value a
 * logit is read as (NaN = -inf, as the CPU sampler treats it), the order-preserving integer
 * key of a float, a block-wide argmax with the CPU's tie rule (first index of the maximum),
 * a vectorised walk over one row, and block reductions and scans of 64-bit integers. Every
 * kernel here runs one block of SAMPLE_THREADS threads per row. */
#ifndef PAGELLM_KERNELS_CUDA_SAMPLE_CUH
#define PAGELLM_KERNELS_CUDA_SAMPLE_CUH

#include <limits.h>

#include "cuda_internal.cuh"

enum { SAMPLE_THREADS = 512, SAMPLE_WARPS = SAMPLE_THREADS / 32 };

typedef unsigned long long u64; /* the type CUDA's 64-bit atomics and shuffles take */

__device__ __forceinline__ float sample_canon(float x) {
    return isnan(x) ? -INFINITY : x;
}

/* Key of v, ascending as v descends (-0 and +0 share one key); no NaN. Sorting (key << 32 |
 * id) ascending is the CPU ranking: logit descending, then id ascending. */
__device__ __forceinline__ uint32_t desc_key(float v) {
    uint32_t u = __float_as_uint(v == 0.0f ? 0.0f : v);
    uint32_t asc = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ~asc;
}

__device__ __forceinline__ float desc_key_value(uint32_t key) {
    uint32_t asc = ~key;
    return __uint_as_float((asc & 0x80000000u) ? (asc & 0x7fffffffu) : ~asc);
}

/* f(i, row[i]) for every i in [lo, hi), split over the block: a scalar head up to 16-byte
 * alignment, float4 loads four at a time, a scalar tail; f4(i, q) takes q = row[i .. i + 3] of
 * the float4 loads at once (so a caller can share work between four consecutive tokens). Each
 * thread visits its indices in increasing order. */
template <typename F, typename F4>
__device__ __forceinline__ void slice_for_each_quad(const float *row, int lo, int hi, F f, F4 f4) {
    const float *p = row + lo;
    const int len = hi - lo;
    int head = (int)(((16 - ((uintptr_t)p & 15)) & 15) / 4);
    head = head < len ? head : len;
    if ((int)threadIdx.x < head)
        f(lo + (int)threadIdx.x, p[threadIdx.x]);
    const float4 *vec = (const float4 *)(p + head);
    int nvec = (len - head) / 4, k = threadIdx.x;
    for (; k + 3 * SAMPLE_THREADS < nvec; k += 4 * SAMPLE_THREADS) {
        float4 a[4];
#pragma unroll
        for (int u = 0; u < 4; u++)
            a[u] = __ldg(vec + k + u * SAMPLE_THREADS);
#pragma unroll
        for (int u = 0; u < 4; u++)
            f4(lo + head + 4 * (k + u * SAMPLE_THREADS), a[u]);
    }
    for (; k < nvec; k += SAMPLE_THREADS)
        f4(lo + head + 4 * k, __ldg(vec + k));
    for (int i = head + 4 * nvec + threadIdx.x; i < len; i += SAMPLE_THREADS)
        f(lo + i, p[i]);
}

template <typename F>
__device__ __forceinline__ void slice_for_each(const float *row, int lo, int hi, F f) {
    slice_for_each_quad(row, lo, hi, f, [&](int i, float4 q) {
        f(i, q.x);
        f(i + 1, q.y);
        f(i + 2, q.z);
        f(i + 3, q.w);
    });
}

/* (value, index) with the CPU argmax rule: larger value wins, the lower index on equal values
 * (so -0 and +0 tie, and an all -inf row gives index 0). */
struct ArgMax {
    float v;
    int i;
};

__device__ __forceinline__ void argmax_take(ArgMax &a, float v, int i) {
    if (v > a.v || (v == a.v && i < a.i)) {
        a.v = v;
        a.i = i;
    }
}

/* Every thread gets the block's result. `scratch` holds SAMPLE_WARPS entries. */
__device__ __forceinline__ ArgMax block_argmax(ArgMax a, ArgMax *scratch) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        argmax_take(a, __shfl_xor_sync(0xffffffffu, a.v, o), __shfl_xor_sync(0xffffffffu, a.i, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0)
        scratch[threadIdx.x >> 5] = a;
    __syncthreads();
    ArgMax r = scratch[0];
    for (int w = 1; w < SAMPLE_WARPS; w++)
        argmax_take(r, scratch[w].v, scratch[w].i);
    return r;
}

__device__ __forceinline__ u64 block_sum_u64(u64 x, u64 *scratch) {
    u64 total;
    block_scan<SAMPLE_WARPS>(x, &total, scratch);
    return total;
}

#endif
