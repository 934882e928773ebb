/* fp8_quant.cuh - the activation quantization of matmul's fp8 semantics (include/kernels.h,
 * kernels/cpu/matmul_fp8.c), as device pieces shared by the fp8 matmul (matmul_fp8.cu) and the
 * ops that quantize the rows they write for the fp8 GEMM after them (norm.cu, activation.cu):
 * a group's scale s = input_scale, or max(amax / 448, PL_F8E4M3_MIN_SCALE) by IEEE division,
 * its inverse 1 / s likewise, and q = e4m3 satfinite of one rounded product x * (1 / s); and
 * the e4m3 tensor-core mma the fp8 GEMVs multiply with (matmul_fp8.cu, gemv_fp8.cuh). */
#pragma once

#include <cuda_fp8.h>

#include "cuda_internal.cuh"

enum { F8_GROUP = 128 }; /* columns of a block-scale group (128 x 128 weight blocks) */

/* The scale of a group whose largest magnitude is amax, as the CPU computes it. */
__device__ __forceinline__ float f8_scale(float amax, float input_scale) {
    if (input_scale > 0.0f)
        return input_scale;
    return fmaxf(__fdiv_rn(amax, PL_F8E4M3_MAX), PL_F8E4M3_MIN_SCALE);
}

/* Four values times inv, as e4m3 satfinite, packed lowest first (memory order). */
__device__ __forceinline__ uint32_t f8_pack4(const float *f, float inv) {
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(
        make_float2(__fmul_rn(f[0], inv), __fmul_rn(f[1], inv)), __NV_SATFINITE, __NV_E4M3);
    const uint32_t hi = __nv_cvt_float2_to_fp8x2(
        make_float2(__fmul_rn(f[2], inv), __fmul_rn(f[3], inv)), __NV_SATFINITE, __NV_E4M3);
    return lo | hi << 16;
}

/* d += A B on the tensor cores, e4m3 operands (4 a register) and an fp32 accumulator: an m16n8k32
 * mma, A row-major (a0/a2 row g, a1/a3 row g + 8; k 4t.. in a0/a1, 16 + 4t.. in a2/a3), B
 * column-major (column g; k 4t.. in b0, 16 + 4t.. in b1), lane (g = lane / 4, t = lane % 4). */
__device__ __forceinline__ void mma_e4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* sS[g], sI[g] = the scale of group g of one row of x and its inverse, g < groups (the whole
 * row when !block, else 128-column blocks), computed by the whole block (blockDim.x a multiple
 * of 32, at most 1024); red holds 32 floats. Callers __syncthreads() before reading them. */
template <typename XT>
__device__ void f8_row_scales(const XT *__restrict__ row, int K, bool block, float input_scale,
                              float *sS, float *sI, float *red) {
    const int tid = threadIdx.x, nt = blockDim.x, chunks = K >> 3;
    if (input_scale > 0.0f) {
        const int groups = block ? (K + F8_GROUP - 1) / F8_GROUP : 1;
        for (int g = tid; g < groups; g += nt) {
            sS[g] = input_scale;
            sI[g] = __fdiv_rn(1.0f, input_scale);
        }
        return;
    }
    if (block) {
        /* 16 chunks of 8 are one group: a half-warp's, at every step of the loop */
        for (int c0 = 0; c0 < chunks; c0 += nt) {
            const int c = c0 + tid;
            float m = 0.0f;
            if (c < chunks) {
                float f[8];
                load8(f, row + (size_t)c * 8);
#pragma unroll
                for (int e = 0; e < 8; e++)
                    m = fmaxf(m, fabsf(f[e]));
            }
#pragma unroll
            for (int o = 8; o > 0; o >>= 1)
                m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
            if ((tid & 15) == 0 && c < chunks) {
                const float s = f8_scale(m, 0.0f);
                sS[c >> 4] = s;
                sI[c >> 4] = __fdiv_rn(1.0f, s);
            }
        }
        return;
    }
    float m = 0.0f;
    for (int c = tid; c < chunks; c += nt) {
        float f[8];
        load8(f, row + (size_t)c * 8);
#pragma unroll
        for (int e = 0; e < 8; e++)
            m = fmaxf(m, fabsf(f[e]));
    }
    m = block_max(m, red);
    if (tid == 0) {
        const float s = f8_scale(m, 0.0f);
        sS[0] = s;
        sI[0] = __fdiv_rn(1.0f, s);
    }
}

/* Writes wvec_n copies of *w_scale0 into wvec (when set): the per-tensor weight scale as the
 * per-channel vector cuBLASLt reads, refreshed by every quantization launch (the buffer is
 * shared by the weights). The whole grid calls it. */
__device__ __forceinline__ void f8_fill_wvec(const KcF8Dst &d) {
    if (!d.wvec)
        return;
    const size_t nt = (size_t)gridDim.x * gridDim.y * blockDim.x;
    const size_t first = ((size_t)blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x;
    for (size_t j = first; j < (size_t)d.wvec_n; j += nt)
        d.wvec[j] = *d.w_scale0;
}

/* Quantizes row r of x[., K] (K = 8 chunks) held in registers: thread t holds chunk
 * c = t + j blockDim.x in v[j] (j < NV; chunks past K hold anything), already rounded to the
 * activation dtype, as the rows matmul would read. Writes q[r, K] and the scales
 * xs[g * d.rows + r]. The whole block calls it (blockDim.x a multiple of 32); red holds 32 floats
 * and is reusable afterwards. */
template <int NV>
__device__ __forceinline__ void f8_quant_row(const float (&v)[NV][8], int K, int r,
                                             const KcF8Dst &d, float *red) {
    const int tid = threadIdx.x, chunks = K >> 3;
    float inv[NV];
    if (d.input_scale > 0.0f) {
        const float i = __fdiv_rn(1.0f, d.input_scale);
#pragma unroll
        for (int j = 0; j < NV; j++)
            inv[j] = i;
        const int groups = d.block ? (K + F8_GROUP - 1) / F8_GROUP : 1;
        for (int g = tid; g < groups; g += blockDim.x)
            d.xs[(size_t)g * d.rows + r] = d.input_scale;
    } else if (d.block) {
        /* 16 chunks of 8 are one group: a half-warp's for each j */
#pragma unroll
        for (int j = 0; j < NV; j++) {
            const int c = tid + j * blockDim.x;
            float m = 0.0f;
            if (c < chunks)
#pragma unroll
                for (int e = 0; e < 8; e++)
                    m = fmaxf(m, fabsf(v[j][e]));
#pragma unroll
            for (int o = 8; o > 0; o >>= 1)
                m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
            const float s = f8_scale(m, 0.0f);
            inv[j] = __fdiv_rn(1.0f, s);
            if ((tid & 15) == 0 && c < chunks)
                d.xs[(size_t)(c >> 4) * d.rows + r] = s;
        }
    } else {
        float m = 0.0f;
#pragma unroll
        for (int j = 0; j < NV; j++)
            if (tid + j * (int)blockDim.x < chunks)
#pragma unroll
                for (int e = 0; e < 8; e++)
                    m = fmaxf(m, fabsf(v[j][e]));
        const float s = f8_scale(block_max(m, red), 0.0f);
        if (tid == 0)
            d.xs[r] = s;
        const float i = __fdiv_rn(1.0f, s);
#pragma unroll
        for (int j = 0; j < NV; j++)
            inv[j] = i;
    }
    uint8_t *qr = d.q + (size_t)r * K;
#pragma unroll
    for (int j = 0; j < NV; j++) {
        const int c = tid + j * blockDim.x;
        if (c < chunks)
            *(uint2 *)(qr + (size_t)c * 8) =
                make_uint2(f8_pack4(v[j], inv[j]), f8_pack4(v[j] + 4, inv[j]));
    }
}
