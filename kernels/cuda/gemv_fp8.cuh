/* gemv_fp8.cuh - (internal to kernels/cuda/) the batch-1 GEMV on fp8 weights, streamed as the
 * bf16 GEMV streams its weights (gemv.cuh): a warp owns two whole weight rows, each of its loads
 * covers 512 contiguous bytes of one row (16 a lane), GEMV_FP8_U such spans in flight a row, the
 * first requested before the wait for x. Per-tensor and per-channel weight scales, with matmul's
 * fp8 semantics (matmul_fp8.cu): every block computes the scale of the row of x (dynamic, or the
 * static input scale) and quantizes the row once into shared memory (K bytes), from which each
 * lane reads the 16 values its weights meet. Where the op that makes x (the norm before a
 * projection, SiLU times up) quantizes it as it writes it (kc_fp8_row_dst), blocks only copy
 * those K bytes and read the scale: no amax pass, no block reduction.
 *
 * The products go through the tensor cores as e4m3 operands, with no exchange between lanes: in
 * an m16n8k32 e4m3 mma (mma_e4m3, fp8_quant.cuh), A row g (g = lane / 4) holds 8 of the lane's
 * weight bytes of the first row, A row g + 8 the same columns of the second, and B column g the
 * lane's quantized x bytes of those columns, so D[g][g] and D[g + 8][g] are the two rows' dots
 * over the 32 columns that lanes 4g to 4g + 3 hold (the other outputs are not used); two mmas
 * cover a span. Lane (g, g / 2) keeps them and a warp reduction sums the eight g at the end. The
 * tensor cores' own sums are added into fp32 every 128 products of a dot (two spans), as
 * matmul_fp8.cu's multi-row GEMV does, so results match the CPU reference to the rounding of
 * those partial sums rather than bit for bit.
 *
 * As with gemv.cuh's kernel, an epilogue decides which rows a task reads and where its sums go:
 * task t reads rows epi.row<2>(t, 0) and epi.row<2>(t, 1) and hands the two scaled sums to
 * epi.store<1, 2>(acc, t, lane), every lane holding both. */
#ifndef PAGELLM_KERNELS_CUDA_GEMV_FP8_CUH
#define PAGELLM_KERNELS_CUDA_GEMV_FP8_CUH

#include <cuda_fp8.h>

#include <type_traits>

#include "fp8_quant.cuh"
#include "gemv.cuh"

enum {
    GEMV_FP8_THREADS = 128,     /* 4 warps, two weight rows each */
    GEMV_FP8_SPAN = 512,        /* columns of a row one warp load covers */
    GEMV_FP8_U = 4,             /* spans in flight a row (8 measured no faster: PERFORMANCE.md) */
    GEMV_FP8_MAX_K = 64 * 1024, /* x quantized in shared memory: K bytes a block */
};

struct GemvFp8Args {
    const uint8_t *w;     /* [N, K] e4m3 */
    const float *w_scale; /* [1] or [N] */
    int per_channel, K, tasks;
    float input_scale;
    const float *x_scale; /* x already quantized (XT uint8_t): its scale */
};

/* 8 blocks an SM: 64 registers, no spills (fp32 activations spill a few bytes). */
template <class Epi, typename XT>
__global__ void __launch_bounds__(GEMV_FP8_THREADS, 8)
    gemv_fp8_kernel(GemvFp8Args a, Epi epi, const XT *__restrict__ x) {
    constexpr int U = GEMV_FP8_U;
    extern __shared__ uint4 xq[]; /* x quantized, 16 values an entry */
    __shared__ float sS, sI, red[32];
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int task = blockIdx.x * (GEMV_FP8_THREADS / 32) + (threadIdx.x >> 5);
    const int tk = min(task, a.tasks - 1); /* every warp joins the block's scale reduction */
    const int K = a.K, spans = (K + GEMV_FP8_SPAN - 1) / GEMV_FP8_SPAN, col = lane * 16;
    const int row0 = epi.template row<2>(tk, 0), row1 = epi.template row<2>(tk, 1);
    const uint8_t *w0 = a.w + (size_t)row0 * K, *w1 = a.w + (size_t)row1 * K;
    uint4 v[U][2];
    auto load = [&](int s0) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int k = (s0 + u) * GEMV_FP8_SPAN + col;
            const bool in = s0 + u < spans && k < K;
            v[u][0] = in ? ld_stream(w0 + k) : make_uint4(0, 0, 0, 0);
            v[u][1] = in ? ld_stream(w1 + k) : make_uint4(0, 0, 0, 0);
        }
    };
    load(0); /* the first weights are requested before the wait for x */
    kc_pdl_wait();
    kc_pdl_trigger();
    if constexpr (std::is_same<XT, uint8_t>::value) { /* quantized by the op that made it */
        (void)red;
        const uint4 *xv = (const uint4 *)x;
        for (int c = threadIdx.x; c < K / 16; c += GEMV_FP8_THREADS)
            xq[c] = xv[c];
        if (threadIdx.x == 0)
            sS = *a.x_scale;
    } else {
        f8_row_scales(x, K, false, a.input_scale, &sS, &sI, red);
        __syncthreads();
        const float inv = sI;
        for (int c = threadIdx.x; c < K / 16; c += GEMV_FP8_THREADS) {
            float f[16];
            load8(f, x + c * 16);
            load8(f + 8, x + c * 16 + 8);
            xq[c] = make_uint4(f8_pack4(f, inv), f8_pack4(f + 4, inv), f8_pack4(f + 8, inv),
                               f8_pack4(f + 12, inv));
        }
    }
    __syncthreads();
    float acc[4] = {};
    /* the tensor cores' sums d into fp32, d from zero again */
    auto flush = [&](float(&d)[4]) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            acc[e] += d[e];
            d[e] = 0.0f;
        }
    };
    for (int s0 = 0; s0 < spans; s0 += U) {
        if (s0)
            load(s0);
        float d[4] = {}; /* the tensor cores' sums, from zero every two spans */
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int k = (s0 + u) * GEMV_FP8_SPAN + col;
            if (s0 + u >= spans) /* the whole warp: mma.sync needs every lane */
                break;
            /* x beyond K (and its weights) are 0 */
            const uint4 xk = k < K ? xq[k >> 4] : make_uint4(0, 0, 0, 0);
            const uint4 &r0 = v[u][0], &r1 = v[u][1];
            mma_e4m3(d, r0.x, r1.x, r0.y, r1.y, xk.x, xk.y);
            mma_e4m3(d, r0.z, r1.z, r0.w, r1.w, xk.z, xk.w);
            if (u & 1) /* every 128 products of a dot */
                flush(d);
        }
        flush(d); /* an odd last span */
    }
    /* D[g][g] and D[g + 8][g] sit in lane (g, g / 2), elements g & 1 and 2 + (g & 1) */
    const bool diag = t == g >> 1, odd = g & 1;
    const float s = sS;
    float out[2][1];
    out[0][0] =
        warp_sum(diag ? (odd ? acc[1] : acc[0]) : 0.0f) * (s * a.w_scale[a.per_channel ? row0 : 0]);
    out[1][0] =
        warp_sum(diag ? (odd ? acc[3] : acc[2]) : 0.0f) * (s * a.w_scale[a.per_channel ? row1 : 0]);
    if (task < a.tasks)
        epi.template store<1, 2>(out, task, lane);
}

/* Whether the fp8 GEMV takes n rows of x (act) against w: one row, per-tensor or per-channel
 * scales, K % 16 == 0 and at most GEMV_FP8_MAX_K, 16-byte aligned x and w, 16- or 32-bit float
 * activations. */
static inline bool gemv_fp8_takes(DType act, const Tensor *w, const void *x, int n) {
    const int K = w->ndim == 2 ? (int)w->shape[1] : 0;
    return n == 1 && w->dtype == DT_F8E4M3 && w->fp8.w_scale &&
           (w->fp8.kind == FP8_SCALE_TENSOR || w->fp8.kind == FP8_SCALE_CHANNEL) && K > 0 &&
           K % 16 == 0 && K <= GEMV_FP8_MAX_K && kc_aligned16(x) && kc_aligned16(w->data) &&
           (act == DT_BF16 || act == DT_F16 || act == DT_F32);
}

/* Launch `tasks` warps of two rows of w against the one row x (XT), as gemv_fp8_takes allowed;
 * XT uint8_t: x already quantized (K e4m3 bytes, 16-byte aligned) with its scale at x_scale. */
template <class Epi, typename XT>
static void gemv_fp8_run(int tasks, const Epi &epi, const XT *x, const Tensor *w, cudaStream_t s,
                         const float *x_scale = NULL) {
    GemvFp8Args a;
    a.w = (const uint8_t *)w->data;
    a.w_scale = w->fp8.w_scale;
    a.per_channel = w->fp8.kind == FP8_SCALE_CHANNEL;
    a.K = (int)w->shape[1];
    a.tasks = tasks;
    a.input_scale = w->fp8.input_scale;
    a.x_scale = x_scale;
    const dim3 grid((unsigned)((tasks + GEMV_FP8_THREADS / 32 - 1) / (GEMV_FP8_THREADS / 32)));
    kc_set_smem(gemv_fp8_kernel<Epi, XT>, (size_t)a.K);
    kc_launch_pdl(gemv_fp8_kernel<Epi, XT>, grid, dim3(GEMV_FP8_THREADS), (size_t)a.K, s, a, epi,
                  x);
    CUDA_CHECK_LAUNCH();
}

#endif
