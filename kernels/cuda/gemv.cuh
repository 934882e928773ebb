/* gemv.cuh - (internal to kernels/cuda/) the memory-bound GEMV of decode-sized batches: out =
 * x[n, K] w^T for n <= GEMV_MAX_N, one warp per task of R weight rows, and the epilogues that
 * decide what a task's R x n dot products become.
 *
 * A warp streams its R rows with 16-byte non-allocating loads, U chunks of 8 elements per row
 * in flight per lane, dots them with every row of x (read through L1), accumulates in fp32 and
 * reduces across the warp; the epilogue then gets all R x n sums in every lane. Which rows a
 * task reads and where its results go is the epilogue's: GemvStore writes them as a matmul
 * does (matmul.cu); gemv_fused.cu's epilogues pair rows so that the op after the projection
 * (RoPE and the KV-cache store, or SiLU times up) happens in the same kernel. A row's sum does
 * not depend on R, U or the epilogue (each lane adds its chunks in K order, then the same warp
 * reduction), so a fused epilogue gives exactly the plain GEMV's values. */
#ifndef PAGELLM_KERNELS_CUDA_GEMV_CUH
#define PAGELLM_KERNELS_CUDA_GEMV_CUH

#include "cuda_internal.cuh"

enum {
    GEMV_MAX_N = 8,
    GEMV_THREADS = 128, /* 4 warps, one task each */
};

/* Whether k_cuda_matmul takes the GEMV for n rows of x against w (matmul.cu; it checks the
 * dtype pair itself): 16-bit weights, K % 8 == 0, 16-byte aligned x and w, and n within
 * GEMV_MAX_N_16 for 16-bit activations (GEMV_MAX_N for fp32 ones), unless a path is forced. */
int kc_gemv_takes(const KCudaGemm *g, DType act, const Tensor *w, const void *x, int n);

/* 16 bytes of a weight row, bypassing L1 (streamed once; L1 is kept for x). */
__device__ __forceinline__ uint4 ld_stream(const void *p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}

/* One 8-element chunk at column k of every weight row against every x row. */
template <int NX, int R, typename XT, typename WT>
__device__ __forceinline__ void gemv_chunk(float (&acc)[R][NX], const uint4 (&wv)[R],
                                           const XT *__restrict__ x, int K, int k) {
    float wf[R][8];
#pragma unroll
    for (int r = 0; r < R; r++)
        unpack8(wf[r], wv[r], (const WT *)0);
#pragma unroll
    for (int i = 0; i < NX; i++) {
        float xf[8];
        load8(xf, x + (size_t)i * K + k);
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int e = 0; e < 8; e++)
                acc[r][i] = fmaf(wf[r][e], xf[e], acc[r][i]);
    }
}

/* Chunks in flight per lane and row by default: 4 at one row per warp, 2 at two or more. */
template <int R> constexpr int gemv_default_u = R >= 4 ? 2 : 4 / R;

/* Blocks per SM the register allocation must allow: at one row per warp and n = 1, 12 (at
 * most 40 registers a thread, down from 42: ptxas spills nothing for bf16 and fp32
 * activations, 4 bytes for f16), so that the 1536 blocks of N = 6144 were resident in one
 * wave on 132 SMs, not 1320 and a tail of 216. Measured on the H200 when the 8B's qkv
 * projection took this path: its batch-1 decode step 4.307 / 4.332 -> 4.261 / 4.248 ms (two
 * runs each). (At n = 2 the bound would spill 62 bytes.) With 8 chunks in flight (K >= 4096,
 * matmul.cu), 8 (64 registers, no spill); the 12 holds for the shallower rows. */
template <int NX, int R, int U>
constexpr int gemv_min_blocks = R == 1 && NX == 1 ? (U >= 8 ? 8 : 12) : 1;

/* Task t of `tasks` (one per warp) reads weight rows epi.row<R>(t, r), r < R, and hands the
 * sums to epi.store<NX, R>(acc, t, lane). */
template <int NX, int R, int U, class Epi, typename XT, typename WT>
__global__ void __launch_bounds__(GEMV_THREADS, (gemv_min_blocks<NX, R, U>))
    gemv_kernel(Epi epi, int tasks, const XT *__restrict__ x, const WT *__restrict__ w, int K) {
    const int lane = threadIdx.x & 31;
    const int t = blockIdx.x * (GEMV_THREADS / 32) + (threadIdx.x >> 5);
    if (t >= tasks)
        return;
    const int K8 = K >> 3;
    const WT *wr[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        wr[r] = w + (size_t)epi.template row<R>(t, r) * K;
    float acc[R][NX];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int i = 0; i < NX; i++)
            acc[r][i] = 0.0f;
    int c = lane;
    bool waited = false; /* the first weights are requested before the wait for x */
    for (; c + (U - 1) * 32 < K8; c += U * 32) {
        uint4 wv[U][R];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < R; r++)
                wv[u][r] = ld_stream(wr[r] + (size_t)(c + u * 32) * 8);
        if (!waited) {
            kc_pdl_wait();
            kc_pdl_trigger();
            waited = true;
        }
#pragma unroll
        for (int u = 0; u < U; u++)
            gemv_chunk<NX, R, XT, WT>(acc, wv[u], x, K, (c + u * 32) * 8);
    }
    if (!waited) {
        kc_pdl_wait();
        kc_pdl_trigger();
    }
    for (; c < K8; c += 32) {
        uint4 wv[R];
#pragma unroll
        for (int r = 0; r < R; r++)
            wv[r] = ld_stream(wr[r] + (size_t)c * 8);
        gemv_chunk<NX, R, XT, WT>(acc, wv, x, K, c * 8);
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int i = 0; i < NX; i++)
            acc[r][i] = warp_sum(acc[r][i]); /* every lane holds every sum now */
    epi.template store<NX, R>(acc, t, lane);
}

/* A bias the epilogues can read (load_any): F32, F16 or BF16. */
static inline bool gemv_bias_dtype_ok(DType dt) {
    return dt == DT_F32 || dt == DT_F16 || dt == DT_BF16;
}

/* fn((XT *)0, (WT *)0) with the element types of a GEMV dtype pair (activation / weight):
 * BF16 / BF16, F16 / F16, F32 / BF16, F32 / F16; the caller has checked that it is one. */
template <class Fn> static void gemv_dtypes(DType act, DType wt, Fn fn) {
    if (act == DT_BF16)
        fn((bf16 *)0, (bf16 *)0);
    else if (act == DT_F16)
        fn((f16 *)0, (f16 *)0);
    else if (wt == DT_BF16)
        fn((float *)0, (bf16 *)0);
    else
        fn((float *)0, (f16 *)0);
}

/* The matmul's epilogue: task t owns rows [t R, t R + R) of out[n, N] (+ bias); lane r*n+i
 * writes (i, t R + r). */
template <typename XT> struct GemvStore {
    XT *out;
    const void *bias;
    int bias_dt, N;
    template <int R> __device__ int row(int t, int r) const {
        return min(t * R + r, N - 1);
    }
    template <int NX, int R>
    __device__ void store(const float (&acc)[R][NX], int t, int lane) const {
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int i = 0; i < NX; i++)
                if (lane == r * NX + i && t * R + r < N) {
                    float v = acc[r][i];
                    if (bias)
                        v += load_any(bias, bias_dt, t * R + r);
                    out[(size_t)i * N + t * R + r] = from_f32<XT>(v);
                }
    }
};

/* Launch `tasks` warps of R rows for n (1..nmax) rows of x, U chunks in flight. */
template <int R, int U, int NMAX, class Epi, typename XT, typename WT>
static void gemv_run(int n, int tasks, const Epi &epi, const XT *x, const WT *w, int K,
                     cudaStream_t s) {
    static_assert(NMAX >= 1 && NMAX <= GEMV_MAX_N, "gemv: 1 to GEMV_MAX_N rows of x");
    const unsigned blocks = (unsigned)((tasks + GEMV_THREADS / 32 - 1) / (GEMV_THREADS / 32));
#define GEMV_CASE(NX)                                                                              \
    case NX:                                                                                       \
        if constexpr (NX <= NMAX) {                                                                \
            kc_launch_pdl(gemv_kernel<NX, R, U, Epi, XT, WT>, dim3(blocks), dim3(GEMV_THREADS), 0, \
                          s, epi, tasks, x, w, K);                                                 \
            break;                                                                                 \
        }                                                                                          \
        [[fallthrough]];
    switch (n) {
        GEMV_CASE(1)
        GEMV_CASE(2)
        GEMV_CASE(3)
        GEMV_CASE(4)
        GEMV_CASE(5)
        GEMV_CASE(6)
        GEMV_CASE(7)
        GEMV_CASE(8)
        default:
            pl_fatal(__FILE__, __LINE__, "gemv: n %d out of range (1..%d)", n, NMAX);
    }
#undef GEMV_CASE
    CUDA_CHECK_LAUNCH();
}

#endif
