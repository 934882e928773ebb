/* matmul_fp8_generic.cu - the fp8-weight matmul for what matmul_fp8.cu's fast paths cannot
 * take: an input size K that is not a multiple of 16 (the bundled stories260K's down
 * projection, K = 172), x or w off a 16-byte boundary, or block scales other than 128 x 128.
 * Plain CUDA cores, scalar loads, dequantizing as it goes: meant for tiny models, where it
 * costs little, not for speed.
 *
 * Same arithmetic as the reference (kernels/cpu/matmul_fp8.c, include/kernels.h): each group
 * of a row of x (the whole row, or B columns with FP8_SCALE_BLOCK) gets the scale s =
 * input_scale, or max(amax / 448, PL_F8E4M3_MIN_SCALE) (IEEE division), and its values become
 * e4m3 satfinite of x * (1 / s), one rounded multiply; out = sum over groups of
 * dot(q, w) * (s_x s_w), fp32, plus the bias, rounded once to the act dtype. Products of two
 * e4m3 values are exact in fp32, so only the order of the sums differs from the CPU's.
 *
 * Block (bx, i) has 8 warps: they first compute the scales of row i of x (warp w takes groups
 * w, w + 8, ...; dynamic shared memory, 2 floats a group), then warp w computes output
 * (i, 8 bx + w), lane l summing the group's columns l, l + 32, ... */
#include "cuda_internal.cuh"
#include "kv_fp8.cuh" /* kv8: the e4m3 element, its exact decode and satfinite encode */

enum { F8G_WARPS = 8 };

template <typename XT>
__global__ void __launch_bounds__(F8G_WARPS * 32)
    f8_generic_kernel(XT *__restrict__ out, const XT *__restrict__ x, const kv8 *__restrict__ w,
                      const float *__restrict__ w_scale, int kind, int group, const void *bias,
                      int bias_dt, float input_scale, int N, int K) {
    extern __shared__ float f8g_smem[];
    const int groups = (K + group - 1) / group;
    float *sS = f8g_smem, *sI = f8g_smem + groups;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, i = blockIdx.y;
    const XT *xr = x + (size_t)i * K;
    for (int g = warp; g < groups; g += F8G_WARPS) {
        const int c0 = g * group, len = min(group, K - c0);
        float s = input_scale;
        if (s <= 0.0f) {
            float amax = 0.0f;
            for (int k = lane; k < len; k += 32)
                amax = fmaxf(amax, fabsf(to_f32(xr[c0 + k])));
            s = fmaxf(__fdiv_rn(warp_max(amax), PL_F8E4M3_MAX), PL_F8E4M3_MIN_SCALE);
        }
        if (lane == 0) {
            sS[g] = s;
            sI[g] = __fdiv_rn(1.0f, s);
        }
    }
    __syncthreads();
    const int j = blockIdx.x * F8G_WARPS + warp;
    if (j >= N)
        return;
    const kv8 *wr = w + (size_t)j * K;
    float acc = 0.0f;
    for (int g = 0; g < groups; g++) {
        const int c0 = g * group, len = min(group, K - c0);
        const float inv = sI[g];
        float dot = 0.0f;
        for (int k = c0 + lane; k < c0 + len; k += 32)
            dot += to_f32(kv_enc<kv8>(to_f32(xr[k]), inv)) * to_f32(wr[k]);
        dot = warp_sum(dot);
        const float ws = kind == FP8_SCALE_TENSOR    ? w_scale[0]
                         : kind == FP8_SCALE_CHANNEL ? w_scale[j]
                                                     : w_scale[(size_t)(j / group) * groups + g];
        acc += dot * (sS[g] * ws);
    }
    if (lane == 0) {
        if (bias)
            acc += load_any(bias, bias_dt, j);
        out[(size_t)i * N + j] = from_f32<XT>(acc);
    }
}

bool kc_fp8_generic_takes(const Tensor *w, const void *x) {
    const Fp8Scales *sc = &w->fp8;
    return w->shape[1] % 16 != 0 || !kc_aligned16(x) || !kc_aligned16(w->data) ||
           (sc->kind == FP8_SCALE_BLOCK && sc->block != 128);
}

void kc_matmul_fp8_generic(void *out, const void *x, DType act, const Tensor *w, const Tensor *bias,
                           int n, cudaStream_t s) {
    const Fp8Scales *sc = &w->fp8;
    const int N = (int)w->shape[0], K = (int)w->shape[1];
    KC_REQUIRE(sc->w_scale && sc->kind >= FP8_SCALE_TENSOR && sc->kind <= FP8_SCALE_BLOCK &&
                   (sc->kind != FP8_SCALE_BLOCK || sc->block > 0),
               "k_cuda_matmul: fp8 weight %dx%d without scales", N, K);
    const int group = sc->kind == FP8_SCALE_BLOCK ? sc->block : K;
    const size_t smem = 2 * sizeof(float) * (size_t)((K + group - 1) / group);
    KC_REQUIRE(smem <= 48 * 1024, "k_cuda_matmul fp8: %d scale groups in a row", K / group);
    KC_REQUIRE(n <= 65535, "k_cuda_matmul fp8: %d rows of x at once", n);
    const dim3 grid((unsigned)((N + F8G_WARPS - 1) / F8G_WARPS), (unsigned)n);
    const void *b = bias ? bias->data : NULL;
    const int bdt = bias ? (int)bias->dtype : 0;
    const kv8 *wq = (const kv8 *)w->data;
    if (act == DT_BF16)
        f8_generic_kernel<bf16><<<grid, F8G_WARPS * 32, smem, s>>>(
            (bf16 *)out, (const bf16 *)x, wq, sc->w_scale, (int)sc->kind, group, b, bdt,
            sc->input_scale, N, K);
    else if (act == DT_F16)
        f8_generic_kernel<f16><<<grid, F8G_WARPS * 32, smem, s>>>((f16 *)out, (const f16 *)x, wq,
                                                                  sc->w_scale, (int)sc->kind, group,
                                                                  b, bdt, sc->input_scale, N, K);
    else if (act == DT_F32)
        f8_generic_kernel<float><<<grid, F8G_WARPS * 32, smem, s>>>(
            (float *)out, (const float *)x, wq, sc->w_scale, (int)sc->kind, group, b, bdt,
            sc->input_scale, N, K);
    else
        pl_fatal(__FILE__, __LINE__, "k_cuda_matmul: fp8 weights with %s activations",
                 pl_dtype_name(act));
    CUDA_CHECK_LAUNCH();
}
