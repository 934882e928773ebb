/* matmul_fp8.cu - the linear layers on fp8 weights: out[n, N] = x[n, K] w^T (+ bias) for w in
 * DT_F8E4M3 with its scales (Tensor.fp8), following matmul's fp8 semantics exactly
 * (include/kernels.h; kernels/cpu/matmul_fp8.c is the reference): each group of a row of x
 * (the whole row; 128-column blocks with FP8_SCALE_BLOCK) gets the scale s = input_scale, or
 * max(amax / 448, PL_F8E4M3_MIN_SCALE), and is quantized to q = e4m3 satfinite of x * (1 / s)
 * (the same fp32 operations as the CPU: IEEE division, one rounded multiply, cvt.rn.satfinite);
 * then out = sum over groups of dot(q, w) * (s_x s_w), fp32 accumulation, bias, rounded once.
 * Products of two e4m3 values are exact in fp32, so the results differ from the CPU's only in
 * the order of the fp32 sums and the tensor cores' accumulation: inside one 32-deep mma in the
 * own kernels, over all of K in cuBLASLt's GEMM on per-tensor and per-channel weights.
 *
 * Three paths (four on Hopper):
 *   - One row of x with per-tensor or per-channel scales: gemv_fp8.cuh's GEMV, two whole
 *     weight rows a warp as the bf16 GEMV reads them (batch-1 decode; measured faster than the
 *     kernel below there, PERFORMANCE.md).
 *   - Small n (decode, n <= F8_GEMV_MAX_N): f8_gemv_kernel, a memory-bound tensor-core GEMV.
 *     A block owns 16 weight rows and up to 8 rows of x (the m16n8k32 e4m3 mma's n), its 8
 *     warps split K in 128-column units. Each lane streams 16 weights of a row at a time with
 *     non-allocating loads (gemv.cuh's ld_stream), the first unit requested before the PDL
 *     wait; up to 4 rows of x, a warp load covers 128 contiguous bytes of 4 weight rows (each
 *     row's two 64-column halves in two mma rows, each x row's in two B columns), beyond that
 *     64 bytes of 8 rows. x is quantized in the kernel: every block first computes
 *     the scales of its rows of x (one pass over them, from L2), then each lane quantizes the
 *     16 values of x its B fragment needs as it goes. The mma's k order is permuted (a lane's
 *     16 contiguous bytes feed two mmas) identically in A and B, which the semantics allow
 *     ("the order within a dot is the backend's"). Each unit's mma sum starts from zero and is
 *     added to fp32 registers (block scales: times s_x s_w of that group), so the tensor
 *     cores' limited accumulation precision spans 128 products at most, as in DeepGEMM.
 *     The same kernel, tiled over x's rows (grid.y), is the fallback for any shape cuBLASLt
 *     refuses (and the n % 4 tail rows of the cuBLASLt path).
 *   - On Hopper, n of 4 to 8 with per-tensor or per-channel scales and 16-bit activations:
 *     x quantized as for cuBLASLt (below), then matmul_fp8_sm90a.cu's stream-K wgmma kernel.
 *   - Larger n: f8_quant_kernel writes q [rows, K] e4m3 and the scales into this gemm's
 *     buffers (allocated by the first such eager call; chunks of rows beyond them), or the op
 *     that makes x does as it writes it (kc_matmul_fp8_produced, for matmul_fp8_fused.cu), then one
 *     cuBLASLt fp8 GEMM (TN: A = w [K, N] op T, B = q [K, rows], both K-major; fp32 compute,
 *     act out): per-tensor and per-channel weights with CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F
 *     on both sides (A: the N channel scales, or N copies of the tensor scale; B: the per-row
 *     x scales), 128 x 128 block weights with A BLK128x128_32F (the checkpoint's scale layout
 *     itself, when ceil(K / 128) % 4 == 0) and B VEC128_32F (x scales [group, row], row-major
 *     by group). Per-tensor and per-channel GEMMs run with fast accumulation
 *     (CUBLASLT_MATMUL_DESC_FAST_ACCUM: the tensor cores sum all of K in their own accumulator
 *     instead of cuBLASLt adding partial sums into fp32 every few k-steps, as vLLM's Hopper fp8
 *     GEMMs do). On an H100 that made the 128/128 x 4096 throughput row 7.9 % faster, at
 *     ~1.2e-3 of the magnitudes' error against ~1.4e-4 (PERFORMANCE.md). The scale modes are
 *     Hopper-only in cuBLASLt 12.9+; cuBLAS wants M and N (here N and the rows) multiples of 4
 *     for them, so the rows are taken 4 at a time and the 1-3 left go to the GEMV. A
 *     combination the heuristic refuses falls back to the tiled GEMV; which path each (N, K,
 *     scale kind) takes is printed once to stderr.
 *
 * These need K % 16 == 0, x and w 16-byte aligned, block scales of 128: anything else goes to
 * matmul_fp8_generic.cu. F32, BF16 and F16 activations all work (cuBLASLt writes fp32 for F32). */
#include <cublasLt.h>
#include <cuda_fp8.h>
#include <stdio.h>
#include <string.h>

#include <mutex>

#include "cublas_util.cuh"
#include "fp8_quant.cuh"
#include "gemv_fp8.cuh"

enum {
    F8_GEMV_MAX_N = 8,     /* n at or below: the GEMV (measured: see PERFORMANCE.md) */
    F8_TILE_N = 16,        /* weight rows per block: one m16 mma tile */
    F8_TILE_X = 8,         /* rows of x per block: the mma's n */
    F8_WARPS = 8,          /* warps per block, splitting K */
    F8_UNIT = F8_GROUP,    /* columns per unit of work (a block-scale group) */
    F8_Q_BYTES = 32 << 20, /* quantized rows of x for cuBLASLt, per chunk */
    F8_XS_FLOATS = 1 << 18,
    F8_WVEC_FLOATS = 1 << 17, /* N copies of a per-tensor weight scale */
    F8_CACHE = 512,
    F8_LOGGED = 128,
};

/* How cuBLASLt is asked: scale modes of A (w) and B (x). */
enum { F8_MODE_OUTER = 1, F8_MODE_BLOCK = 2 };

typedef struct {
    int mb, N, K, mode, ct, bias, al_w, al_out;
} F8Key;

typedef struct {
    int valid, ok; /* ok 0: cuBLASLt refused this problem */
    F8Key key;
    cublasLtMatmulAlgo_t algo;
} F8Entry;

typedef struct {
    int N, K, kind, path;
} F8Logged;

struct KcFp8 {
    uint8_t *q;  /* [rows, K] quantized x of one chunk */
    float *xs;   /* x scales: [groups, rows] */
    float *wvec; /* N copies of a per-tensor weight scale */
    float *part; /* the wgmma kernel's workspace (matmul_fp8_sm90a.cu) */
    unsigned *arrivals;
    F8Entry cache[F8_CACHE];
    int cached;
};

void kc_fp8_destroy(KcFp8 *f) {
    if (!f)
        return;
    k_cuda_free(f->q);
    k_cuda_free(f->xs);
    k_cuda_free(f->wvec);
    k_cuda_free(f->part);
    k_cuda_free(f->arrivals);
    free(f);
}

size_t kc_fp8_device_bytes(const KcFp8 *f) {
    return f ? (size_t)F8_Q_BYTES + sizeof(float) * (F8_XS_FLOATS + F8_WVEC_FLOATS) +
                   sizeof(float) * KC_F8W_PART_FLOATS + sizeof(unsigned) * KC_F8W_TILES
             : 0;
}

/* ---------------- the GEMV (and tiled fallback) ---------------- */

template <typename XT> struct F8GemvArgs {
    XT *out;              /* [n, N] */
    const XT *x;          /* [n, K] */
    const uint8_t *w;     /* [N, K] */
    const float *w_scale; /* per kind */
    const void *bias;     /* NULL: none */
    int bias_dt, kind, N, K, n;
    int groups; /* block kind: ceil(K / 128); else 1 */
    float input_scale;
};

/* Block (blockIdx.x, blockIdx.y): weight rows [16 MT bx, +16 MT) (MT m16 mma tiles) against
 * rows [TX by, +TX) of x; lane (g = lane / 4, t = lane % 4). A unit is 128 columns of those
 * rows, 4 MT loads of 16 bytes a lane, in one of two layouts:
 *   - PAIR false (TX = 8 rows of x, the mma's n): lane (g, t) holds weight rows 16 m + g and
 *     16 m + g + 8 of tile m and x row g; for each 64 columns from k0 it reads columns
 *     k0 + 16 t .. + 16 of each, the first 8 for one mma and the last 8 for the next (A's
 *     a0/a2 and B's b0/b1 take the 4-byte halves: the same permutation of k on both sides).
 *     A warp load covers 64 bytes of 8 rows.
 *   - PAIR true (TX = 4): the two 64-column halves of a weight row are mma rows 2 j and 2 j + 1
 *     of a tile of 8 weight rows, and the same halves of x row c are B columns 2 c and 2 c + 1:
 *     lane (g, t) reads columns 64 (g & 1) + 16 t .. + 16 of weight rows 4 i + g / 2 (i < 4 MT)
 *     and of x row g / 2. A warp load covers 128 contiguous bytes of 4 rows, which streams
 *     faster at this occupancy (PERFORMANCE.md, fp8 section), and a lane quantizes 16 values of
 *     x a unit instead of 32. Of the mma's outputs only the matching halves (row 2 j + e,
 *     column 2 c + e) are kept; lanes g and g ^ 1 sum a row's two halves at the end.
 * Dynamic shared memory: the x scales and inverses, [8][groups] each. */
template <typename XT, int MT, bool PAIR>
__global__ void __launch_bounds__(F8_WARPS * 32) f8_gemv_kernel(F8GemvArgs<XT> a) {
    constexpr int TX = PAIR ? F8_TILE_X / 2 : F8_TILE_X;
    constexpr int NR = PAIR ? 4 * MT : 2 * MT; /* weight rows a lane reads */
    constexpr int STEPS = PAIR ? 1 : 2;        /* 16-byte loads a row a unit */
    constexpr int NT = NR / 2;                 /* mma tiles (of 16 or 8 weight rows) */
    constexpr int KEPT = PAIR ? 2 : 4;         /* sums a lane keeps a tile */
    extern __shared__ float f8_smem[];
    __shared__ float red[F8_WARPS][32][4 * MT];
    __shared__ float rmax[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3, half = g & 1;
    const int r0 = blockIdx.x * F8_TILE_N * MT, c0 = blockIdx.y * TX;
    const int nx = min(TX, a.n - c0), K = a.K, units = (K + F8_UNIT - 1) / F8_UNIT;
    const bool block = a.kind == FP8_SCALE_BLOCK;
    const int gs = block ? a.groups : 1;
    const int xg = PAIR ? g >> 1 : g; /* this lane's row of x, from c0 */
    /* this lane's first column in a unit (PAIR), or in each 64-column step of one */
    const int lane_k = PAIR ? 64 * half + 16 * t : 16 * t;
    float *sS = f8_smem, *sI = f8_smem + F8_TILE_X * gs;
    const uint8_t *wr[NR];
#pragma unroll
    for (int i = 0; i < NR; i++)
        wr[i] = a.w + (size_t)min(r0 + (PAIR ? 4 * i + xg : 8 * i + g), a.N - 1) * K;

    /* one unit's weights: [step][row], zero beyond K */
    auto load_unit = [&](int u, uint4(&v)[STEPS * NR]) {
#pragma unroll
        for (int s = 0; s < STEPS; s++) {
            const int kk = u * F8_UNIT + s * 64 + lane_k;
#pragma unroll
            for (int i = 0; i < NR; i++)
                v[s * NR + i] =
                    u < units && kk < K ? ld_stream(wr[i] + kk) : make_uint4(0, 0, 0, 0);
        }
    };

    int u = warp;
    uint4 cur[STEPS * NR];
    load_unit(u, cur); /* the first weights are requested before the wait for x */
    kc_pdl_wait();
    kc_pdl_trigger();
    for (int i = 0; i < nx; i++)
        f8_row_scales(a.x + (size_t)(c0 + i) * K, K, block, a.input_scale, sS + i * gs, sI + i * gs,
                      rmax);
    __syncthreads();

    const XT *xr = a.x + (size_t)(c0 + xg) * K;
    const bool has_x = xg < nx;
    float acc[NT][KEPT] = {}; /* PAIR: the kept half of rows g and g + 8 */
    for (; u < units; u += F8_WARPS) {
        uint4 nxt[STEPS * NR];
        load_unit(u + F8_WARPS, nxt);
        const float inv = has_x ? sI[xg * gs + (block ? u : 0)] : 0.0f;
        float d[NT][4] = {}; /* this unit's sums, from zero */
#pragma unroll
        for (int s = 0; s < STEPS; s++) {
            const int kk = u * F8_UNIT + s * 64 + lane_k;
            uint32_t b[4] = {0u, 0u, 0u, 0u};
            if (has_x && kk < K) {
                float f[16];
                load8(f, xr + kk);
                load8(f + 8, xr + kk + 8);
#pragma unroll
                for (int j = 0; j < 4; j++)
                    b[j] = f8_pack4(f + 4 * j, inv);
            }
#pragma unroll
            for (int m = 0; m < NT; m++) {
                const uint4 &lo = cur[s * NR + 2 * m], &hi = cur[s * NR + 2 * m + 1];
                mma_e4m3(d[m], lo.x, hi.x, lo.y, hi.y, b[0], b[1]);
                mma_e4m3(d[m], lo.z, hi.z, lo.w, hi.w, b[2], b[3]);
            }
        }
#pragma unroll
        for (int m = 0; m < NT; m++) {
            /* d[m][e]: mma row g (+8 for e >= 2), column 2t + (e & 1) */
            const float ws =
                block ? a.w_scale[(size_t)((r0 + (PAIR ? 8 : 16) * m) / F8_UNIT) * a.groups + u]
                      : 1.0f;
#pragma unroll
            for (int e = 0; e < KEPT; e++) {
                /* PAIR: mma row g (e 0) or g + 8 (e 1), column 2t + half */
                const float v = PAIR ? (half ? d[m][2 * e + 1] : d[m][2 * e]) : d[m][e];
                const int col = PAIR ? t : 2 * t + (e & 1);
                if (block)
                    acc[m][e] += v * ((col < nx ? sS[col * gs + u] : 0.0f) * ws);
                else
                    acc[m][e] += v;
            }
        }
#pragma unroll
        for (int i = 0; i < STEPS * NR; i++)
            cur[i] = nxt[i];
    }
#pragma unroll
    for (int m = 0; m < NT; m++)
#pragma unroll
        for (int e = 0; e < KEPT; e++)
            red[warp][lane][KEPT * m + e] = acc[m][e];
    __syncthreads();
    if (warp != 0)
        return;
#pragma unroll
    for (int i = 0; i < 4 * MT; i++) {
        float v = red[0][lane][i];
        for (int w = 1; w < F8_WARPS; w++)
            v += red[w][lane][i];
        int row, col;
        if (PAIR) {
            v += __shfl_xor_sync(0xffffffffu, v, 4); /* the row's other half, lane g ^ 1 */
            row = r0 + 4 * i + xg;
            col = half ? TX : t;
        } else {
            row = r0 + 16 * (i / 4) + g + (i % 4 >= 2 ? 8 : 0);
            col = 2 * t + (i & 1);
        }
        if (row >= a.N || col >= nx)
            continue;
        if (!block) {
            const float ws = a.kind == FP8_SCALE_CHANNEL ? a.w_scale[row] : a.w_scale[0];
            v *= sS[col] * ws;
        }
        if (a.bias)
            v += load_any(a.bias, a.bias_dt, row);
        a.out[(size_t)(c0 + col) * a.N + row] = from_f32<XT>(v);
    }
}

/* mt: m16 tiles per block (1 or 2); up to 4 rows of x in the PAIR layout. */
template <typename XT>
static void f8_gemv(void *out, const void *x, const Tensor *w, const Tensor *b, int n, int mt,
                    cudaStream_t s) {
    const int N = (int)w->shape[0], K = (int)w->shape[1];
    F8GemvArgs<XT> a;
    a.out = (XT *)out;
    a.x = (const XT *)x;
    a.w = (const uint8_t *)w->data;
    a.w_scale = w->fp8.w_scale;
    a.bias = b ? b->data : NULL;
    a.bias_dt = b ? (int)b->dtype : 0;
    a.kind = (int)w->fp8.kind;
    a.N = N;
    a.K = K;
    a.n = n;
    a.groups = (K + F8_UNIT - 1) / F8_UNIT;
    a.input_scale = w->fp8.input_scale;
    const int gs = a.kind == FP8_SCALE_BLOCK ? a.groups : 1;
    const size_t smem = 2 * sizeof(float) * F8_TILE_X * (size_t)gs;
    KC_REQUIRE(smem <= 48 * 1024, "k_cuda_matmul fp8: K %d too deep for block scales", K);
    const int rows = F8_TILE_N * mt;
    const bool pair = n <= F8_TILE_X / 2;
    const dim3 grid((unsigned)((N + rows - 1) / rows), (unsigned)((n + F8_TILE_X - 1) / F8_TILE_X));
    auto kernel = mt == 2 ? (pair ? f8_gemv_kernel<XT, 2, true> : f8_gemv_kernel<XT, 2, false>)
                          : (pair ? f8_gemv_kernel<XT, 1, true> : f8_gemv_kernel<XT, 1, false>);
    kc_launch_pdl(kernel, grid, dim3(F8_WARPS * 32), smem, s, a);
    CUDA_CHECK_LAUNCH();
}

/* ---------------- quantization for cuBLASLt ---------------- */

/* Block r quantizes row r of x[rows, K] into d (KcF8Dst: q, the scales, the per-tensor weight
 * scale copies). Dynamic shared memory: 2 x groups. */
template <typename XT>
__global__ void __launch_bounds__(256) f8_quant_kernel(KcF8Dst d, const XT *__restrict__ x, int K) {
    extern __shared__ float f8_smem[];
    __shared__ float rmax[32];
    const int r = blockIdx.x, groups = d.block ? (K + F8_UNIT - 1) / F8_UNIT : 1;
    float *sS = f8_smem, *sI = f8_smem + groups;
    kc_pdl_wait();
    kc_pdl_trigger();
    f8_fill_wvec(d);
    const XT *row = x + (size_t)r * K;
    f8_row_scales(row, K, d.block != 0, d.input_scale, sS, sI, rmax);
    __syncthreads();
    const int chunks = K >> 3;
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
        float f[8];
        load8(f, row + (size_t)c * 8);
        const float inv = sI[d.block ? c >> 4 : 0];
        *(uint2 *)(d.q + (size_t)r * K + (size_t)c * 8) =
            make_uint2(f8_pack4(f, inv), f8_pack4(f + 4, inv));
    }
    for (int g = threadIdx.x; g < groups; g += blockDim.x)
        d.xs[(size_t)g * d.rows + r] = sS[g];
}

/* ---------------- cuBLASLt ---------------- */

static cudaDataType f8_cuda_type(DType dt) {
    return dt == DT_F32 ? CUDA_R_32F : dt == DT_F16 ? CUDA_R_16F : CUDA_R_16BF;
}

typedef struct {
    cublasLtMatmulDescOpaque_t desc;
    cublasLtMatrixLayoutOpaque_t la, lb, lc;
} F8Problem;

static void f8_problem(F8Problem *p, const F8Key *k, int rows, const void *a_scale,
                       const void *b_scale, const void *bias) {
    CUBLAS_CHECK(cublasLtMatmulDescInit(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    int32_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    int32_t ma = k->mode == F8_MODE_BLOCK ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                                          : CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    int32_t mb = k->mode == F8_MODE_BLOCK ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                                          : CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma,
                                                sizeof ma));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb,
                                                sizeof mb));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                &a_scale, sizeof a_scale));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                &b_scale, sizeof b_scale));
    if (k->mode != F8_MODE_BLOCK) {
        int8_t fast = 1; /* fast accumulation: the banner's "Larger n" */
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM,
                                                    &fast, sizeof fast));
    }
    if (k->bias) {
        uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                                    sizeof epi));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                    &bias, sizeof bias));
        int32_t bt = k->ct;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                    &bt, sizeof bt));
    }
    CUBLAS_CHECK(cublasLtMatrixLayoutInit(&p->la, CUDA_R_8F_E4M3, k->K, k->N, k->K));
    CUBLAS_CHECK(cublasLtMatrixLayoutInit(&p->lb, CUDA_R_8F_E4M3, k->K, rows, k->K));
    CUBLAS_CHECK(cublasLtMatrixLayoutInit(&p->lc, (cudaDataType)k->ct, k->N, rows, k->N));
}

static int f8_bucket(int n) {
    if (n <= 1024)
        return (n + 15) / 16 * 16;
    int b = 1024;
    while (b < n)
        b <<= 1;
    return b;
}

static F8Entry *f8_slot(KcFp8 *f, const F8Key *key) {
    return kc_cache_slot(f->cache, F8_CACHE, key);
}

/* The heuristic's first algorithm for key's problem at `rows` rows; false when it has none. */
static bool f8_query(KCudaGemm *g, const F8Key *key, int rows, const void *a_scale,
                     const void *b_scale, const void *bias, cublasLtMatmulAlgo_t *algo) {
    void *ws;
    size_t ws_bytes;
    cublasLtHandle_t lt = (cublasLtHandle_t)kc_gemm_lt(g, &ws, &ws_bytes);
    cublasLtMatmulPreferenceOpaque_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceInit(&pref));
    uint64_t wsb = ws_bytes;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        &pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
    uint32_t al[4] = {(uint32_t)key->al_w, 256u, (uint32_t)key->al_out, (uint32_t)key->al_out};
    const cublasLtMatmulPreferenceAttributes_t which[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++)
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(&pref, which[i], &al[i], sizeof al[i]));
    F8Problem p;
    f8_problem(&p, key, rows, a_scale, b_scale, bias);
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    if (cublasLtMatmulAlgoGetHeuristic(lt, &p.desc, &p.la, &p.lb, &p.lc, &p.lc, &pref, 1, &res,
                                       &found) != CUBLAS_STATUS_SUCCESS ||
        found < 1 || res.state != CUBLAS_STATUS_SUCCESS)
        return false;
    *algo = res.algo;
    return true;
}

/* The cached algorithm for key (asked of the heuristic at the bucket's top, then at `rows`),
 * or NULL when cuBLASLt has none. */
static const cublasLtMatmulAlgo_t *f8_algo(KCudaGemm *g, KcFp8 *f, const F8Key *key, int rows,
                                           const void *a_scale, const void *b_scale,
                                           const void *bias) {
    F8Entry *e = f8_slot(f, key);
    if (e->valid)
        return e->ok ? &e->algo : NULL;
    cublasLtMatmulAlgo_t algo;
    const bool ok = f8_query(g, key, key->mb, a_scale, b_scale, bias, &algo) ||
                    f8_query(g, key, rows, a_scale, b_scale, bias, &algo);
    if (f->cached >= F8_CACHE / 4 * 3) {
        memset(f->cache, 0, sizeof f->cache);
        f->cached = 0;
        e = f8_slot(f, key);
    }
    e->valid = 1;
    e->ok = ok;
    e->key = *key;
    e->algo = algo;
    f->cached++;
    return ok ? &e->algo : NULL;
}

/* ---------------- dispatch ---------------- */

enum {
    F8_PATH_GEMV = 0,
    F8_PATH_TILED = 1,
    F8_PATH_LT_OUTER = 2,
    F8_PATH_LT_BLOCK = 3,
    F8_PATH_WGMMA = 4
};

/* Print once per process which path a (N, K, scale kind) takes. */
static void f8_log(int N, int K, int kind, int path) {
    static std::mutex mu;
    static F8Logged logged[F8_LOGGED];
    static int nlogged;
    std::lock_guard<std::mutex> lock(mu);
    for (int i = 0; i < nlogged; i++)
        if (logged[i].N == N && logged[i].K == K && logged[i].kind == kind &&
            logged[i].path == path)
            return;
    if (nlogged == F8_LOGGED)
        return;
    logged[nlogged++] = F8Logged{N, K, kind, path};
    static const char *kinds[] = {"none", "tensor", "channel", "block"};
    static const char *paths[] = {"fp8 GEMV (n <= 8)", "fp8 tiled GEMV (cuBLASLt refused)",
                                  "cuBLASLt fp8, outer-vector scales",
                                  "cuBLASLt fp8, 128x128 / 1x128 block scales",
                                  "fp8 wgmma stream-K (n 4-8)"};
    fprintf(stderr, "k_cuda_matmul: fp8 %dx%d (%s scales): %s\n", N, K, kinds[kind], paths[path]);
}

template <class Fn> static void f8_dispatch_act(DType act, Fn fn) {
    if (act == DT_BF16)
        fn((bf16 *)0);
    else if (act == DT_F16)
        fn((f16 *)0);
    else
        fn((float *)0);
}

/* Rows [0, d.rows) of x[., K] quantized into d by f8_quant_kernel (groups: the scale groups of a
 * row, 1 or ceil(K / 128)). */
static void f8_quantize(const KcF8Dst &d, const void *x, DType act, int K, int groups,
                        cudaStream_t s) {
    f8_dispatch_act(act, [&](auto *xt) {
        using XT = std::remove_pointer_t<decltype(xt)>;
        kc_launch_pdl(f8_quant_kernel<XT>, dim3((unsigned)d.rows), dim3(256),
                      2 * sizeof(float) * (size_t)groups, s, d, (const XT *)x, K);
    });
}

/* The gemm's fp8 buffers, allocated by the first call that needs them; NULL where that call is
 * being captured into a graph (it cannot allocate). */
static KcFp8 *f8_state_try(KCudaGemm *g, cudaStream_t s) {
    KcFp8 **fp = kc_gemm_fp8(g);
    if (!*fp && !kc_capturing(s)) {
        KcFp8 *f = (KcFp8 *)pl_xcalloc(1, sizeof *f);
        f->q = (uint8_t *)k_cuda_malloc(F8_Q_BYTES);
        f->xs = (float *)k_cuda_malloc(sizeof(float) * F8_XS_FLOATS);
        f->wvec = (float *)k_cuda_malloc(sizeof(float) * F8_WVEC_FLOATS);
        f->part = (float *)k_cuda_malloc(sizeof(float) * KC_F8W_PART_FLOATS);
        f->arrivals = (unsigned *)k_cuda_malloc(sizeof(unsigned) * KC_F8W_TILES);
        CUDA_CHECK(cudaMemsetAsync(f->arrivals, 0, sizeof(unsigned) * KC_F8W_TILES, s));
        *fp = f;
    }
    return *fp;
}

static KcFp8 *f8_state(KCudaGemm *g, cudaStream_t s) {
    KcFp8 *f = f8_state_try(g, s);
    KC_REQUIRE(f,
               "k_cuda_matmul: the first fp8 call beyond %d rows allocates: make it before "
               "graph capture",
               F8_GEMV_MAX_N);
    return f;
}

/* Whether cuBLASLt's scale modes can take w's shape and scales at all. */
static bool f8_lt_shape_ok(const Tensor *w) {
    const Fp8Scales *sc = &w->fp8;
    const int N = (int)w->shape[0], K = (int)w->shape[1];
    const bool block = sc->kind == FP8_SCALE_BLOCK;
    const int groups = block ? (K + F8_UNIT - 1) / F8_UNIT : 1;
    return N % 4 == 0 && (!block || groups % 4 == 0) &&
           (sc->kind != FP8_SCALE_TENSOR || N <= F8_WVEC_FLOATS) && groups <= 1024;
}

/* The cuBLASLt path on rows [0, n4), n4 = n & ~3, in chunks that fit the buffers: each chunk's
 * rows of x quantized by f8_quant_kernel, or by `produce` (NULL: none), which also makes the
 * n - n4 rows after them with the last chunk (unquantized: the GEMV takes them). False
 * (nothing launched) where cuBLASLt has no algorithm for it. */
static bool f8_lt(KCudaGemm *g, void *out, const void *x, DType act, const Tensor *w,
                  const Tensor *b, int n, KcF8Produce produce, void *ctx, cudaStream_t s) {
    const Fp8Scales *sc = &w->fp8;
    const int N = (int)w->shape[0], K = (int)w->shape[1], n4 = n & ~3;
    const bool block = sc->kind == FP8_SCALE_BLOCK;
    const int groups = block ? (K + F8_UNIT - 1) / F8_UNIT : 1;
    if (n4 == 0 || !f8_lt_shape_ok(w))
        return false;
    KcFp8 *f = f8_state(g, s);
    int chunk = F8_Q_BYTES / K;
    if (chunk > F8_XS_FLOATS / groups)
        chunk = F8_XS_FLOATS / groups;
    chunk &= ~3;
    const size_t es = pl_dtype_size(act);
    F8Key key;
    memset(&key, 0, sizeof key);
    key.N = N;
    key.K = K;
    key.mode = block ? F8_MODE_BLOCK : F8_MODE_OUTER;
    key.ct = (int)f8_cuda_type(act);
    key.bias = b && b->dtype == act && kc_aligned16(b->data);
    key.al_w = kc_lt_alignment(w->data, (size_t)K);
    key.al_out = kc_lt_alignment(out, (size_t)N * es);
    const void *a_scale = sc->kind == FP8_SCALE_TENSOR ? (const void *)f->wvec : sc->w_scale;
    const void *bias = key.bias ? b->data : NULL;
    void *ws;
    size_t ws_bytes;
    cublasLtHandle_t lt = (cublasLtHandle_t)kc_gemm_lt(g, &ws, &ws_bytes);
    for (int r0 = 0; r0 < n4; r0 += chunk) {
        const int rows = n4 - r0 < chunk ? n4 - r0 : chunk;
        key.mb = f8_bucket(rows);
        const cublasLtMatmulAlgo_t *algo = f8_algo(g, f, &key, rows, a_scale, f->xs, bias);
        if (!algo && key.bias && r0 == 0 && !block) {
            /* cuBLASLt has no bias epilogue for this case (f32 output with an f32 bias): the GEMM
             * alone, the bias added after it. Block scales keep the tiled GEMV there: cuBLASLt's
             * block-scaled f32 output fell outside test_fp8_f32_act's tolerance (an H100). */
            key.bias = 0;
            bias = NULL;
            algo = f8_algo(g, f, &key, rows, a_scale, f->xs, bias);
        }
        if (!algo) {
            KC_REQUIRE(r0 == 0, "k_cuda_matmul fp8: cuBLASLt refused a later chunk");
            return false;
        }
        const KcF8Dst d = {f->q,
                           f->xs,
                           rows,
                           (int)block,
                           sc->input_scale,
                           sc->kind == FP8_SCALE_TENSOR ? f->wvec : (float *)NULL,
                           sc->w_scale,
                           N};
        if (produce) {
            produce(ctx, &d, r0, r0 + rows == n4 ? n - r0 : rows, s);
        } else {
            f8_quantize(d, (const char *)x + (size_t)r0 * K * es, act, K, groups, s);
        }
        CUDA_CHECK_LAUNCH();
        F8Problem p;
        f8_problem(&p, &key, rows, a_scale, f->xs, bias);
        const float alpha = 1.0f, beta = 0.0f;
        void *o = (char *)out + (size_t)r0 * N * es;
        cublasStatus_t st = cublasLtMatmul(lt, &p.desc, &alpha, w->data, &p.la, f->q, &p.lb, &beta,
                                           o, &p.lc, o, &p.lc, algo, ws, ws_bytes, s);
        if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) {
            /* the bucket's algorithm does not take this row count: ask for this exact size */
            cublasLtMatmulAlgo_t exact;
            KC_REQUIRE(f8_query(g, &key, rows, a_scale, f->xs, bias, &exact),
                       "k_cuda_matmul fp8: cuBLASLt has no algorithm for %d rows", rows);
            st = cublasLtMatmul(lt, &p.desc, &alpha, w->data, &p.la, f->q, &p.lb, &beta, o, &p.lc,
                                o, &p.lc, &exact, ws, ws_bytes, s);
        }
        CUBLAS_CHECK(st);
    }
    if (b && !key.bias)
        kc_bias_add(out, act, b, n4, N, s);
    return true;
}

/* Whether the fast paths take w with x at all (else matmul_fp8_generic.cu does); fatal for
 * what no path takes. */
static bool f8_fast_ok(const void *x, DType act, const Tensor *w, const Tensor *bias) {
    const Fp8Scales *sc = &w->fp8;
    const int N = (int)w->shape[0], K = (int)w->shape[1];
    KC_REQUIRE(sc->w_scale && sc->kind >= FP8_SCALE_TENSOR && sc->kind <= FP8_SCALE_BLOCK,
               "k_cuda_matmul: fp8 weight %dx%d without scales", N, K);
    if (kc_fp8_generic_takes(w, x)) /* any K, alignment, block size: matmul_fp8_generic.cu */
        return false;
    KC_REQUIRE(sc->kind != FP8_SCALE_BLOCK || sc->block == F8_UNIT,
               "k_cuda_matmul: fp8 block scales of %d x %d (the CUDA backend takes 128 x 128)",
               sc->block, sc->block);
    KC_REQUIRE(K % 16 == 0 && kc_aligned16(x) && kc_aligned16(w->data),
               "k_cuda_matmul: fp8 weights need K %% 16 == 0 and 16-byte aligned x and w (K %d)",
               K);
    KC_REQUIRE(act == DT_BF16 || act == DT_F16 || act == DT_F32,
               "k_cuda_matmul: fp8 weights with %s activations", pl_dtype_name(act));
    if (bias)
        KC_REQUIRE(gemv_bias_dtype_ok(bias->dtype), "k_cuda_matmul: bias dtype %s",
                   pl_dtype_name(bias->dtype));
    return true;
}

/* Whether n rows go to cuBLASLt (at least its 4-row unit; the default above F8_GEMV_MAX_N, or
 * forced). */
static bool f8_wants_lt(const KCudaGemm *g, int n) {
    const int forced = kc_gemm_forced_path(g);
    return n >= 4 && (forced == KC_GEMM_CUBLASLT || (forced != KC_GEMM_GEMV && n > F8_GEMV_MAX_N));
}

/* Whether a GEMV's n rows of x run on gemv_fp8.cuh's one-row GEMV: where it takes them and 32
 * rows a block are not forced (else f8_gemv_kernel). */
static bool f8_row_gemv(const KCudaGemm *g, DType act, const Tensor *w, const void *x, int n) {
    return kc_gemm_forced_rows(g) != 2 && gemv_fp8_takes(act, w, x, n);
}

/* out[N] (XT) = the one row x w^T (+ bias) on gemv_fp8.cuh's GEMV; X is XT, or uint8_t for a
 * row already quantized with its scale at x_scale. */
template <typename XT, typename X>
static void f8_row_gemv_run(void *out, const X *x, const Tensor *w, const Tensor *bias,
                            cudaStream_t s, const float *x_scale = NULL) {
    const int N = (int)w->shape[0];
    const GemvStore<XT> st = {(XT *)out, bias ? bias->data : NULL, bias ? (int)bias->dtype : 0, N};
    gemv_fp8_run((N + 1) / 2, st, x, w, s, x_scale);
}

/* Rows [done, n) by a GEMV (f8_row_gemv's choice). */
static void f8_gemv_rows(KCudaGemm *g, void *out, const void *x, DType act, const Tensor *w,
                         const Tensor *bias, int done, int n, cudaStream_t s) {
    const int N = (int)w->shape[0], K = (int)w->shape[1];
    const size_t es = pl_dtype_size(act);
    void *o = (char *)out + (size_t)done * N * es;
    const void *xd = (const char *)x + (size_t)done * K * es;
    const bool rows = f8_row_gemv(g, act, w, xd, n - done);
    f8_dispatch_act(act, [&](auto *xt) {
        using XT = std::remove_pointer_t<decltype(xt)>;
        if (rows) {
            f8_row_gemv_run<XT>(o, (const XT *)xd, w, bias, s);
            return;
        }
        f8_gemv<XT>(o, xd, w, bias, n - done, kc_gemm_forced_rows(g) == 2 ? 2 : 1, s);
    });
}

/* cuBLASLt on rows [0, n & ~3) (x quantized as f8_lt says), the GEMV on the 1-3 after them;
 * false (nothing launched) where cuBLASLt has no algorithm. */
static bool f8_lt_rows(KCudaGemm *g, void *out, const void *x, DType act, const Tensor *w,
                       const Tensor *bias, int n, KcF8Produce produce, void *ctx, cudaStream_t s) {
    if (!f8_lt(g, out, x, act, w, bias, n, produce, ctx, s))
        return false;
    const Fp8Scales *sc = &w->fp8;
    f8_log((int)w->shape[0], (int)w->shape[1], (int)sc->kind,
           sc->kind == FP8_SCALE_BLOCK ? F8_PATH_LT_BLOCK : F8_PATH_LT_OUTER);
    if (n & 3)
        f8_gemv_rows(g, out, x, act, w, bias, n & ~3, n, s);
    return true;
}

/* Whether n rows go to the Hopper wgmma kernel (matmul_fp8_sm90a.cu): where it takes them and
 * no path is forced. */
static bool f8_wants_wgmma(const KCudaGemm *g, DType act, const Tensor *w, int n) {
    return kc_gemm_forced_path(g) == KC_GEMM_AUTO && kc_f8w_takes(act, w, n);
}

/* The wgmma kernel on all n rows, x quantized by f8_quant_kernel or by `produce` (NULL: none);
 * false (nothing launched) where the buffers cannot be allocated now (a graph capture). */
static bool f8_wgmma_rows(KCudaGemm *g, void *out, const void *x, DType act, const Tensor *w,
                          const Tensor *bias, int n, KcF8Produce produce, void *ctx,
                          cudaStream_t s) {
    KcFp8 *f = f8_state_try(g, s);
    if (!f)
        return false;
    const Fp8Scales *sc = &w->fp8;
    const int N = (int)w->shape[0], K = (int)w->shape[1];
    const KcF8Dst d = {f->q, f->xs, n, 0, sc->input_scale, NULL, sc->w_scale, N};
    if (produce)
        produce(ctx, &d, 0, n, s);
    else
        f8_quantize(d, x, act, K, 1, s);
    CUDA_CHECK_LAUNCH();
    kc_f8w_matmul(out, f->q, f->xs, act, w, bias, n, f->part, f->arrivals, s);
    f8_log(N, K, (int)sc->kind, F8_PATH_WGMMA);
    return true;
}

bool kc_fp8_row_gemv_takes(KCudaGemm *g, DType act, const Tensor *w, const void *x, int n) {
    return !kc_fp8_generic_takes(w, x) && !f8_wants_lt(g, n) && !f8_wants_wgmma(g, act, w, n) &&
           f8_row_gemv(g, act, w, x, n);
}

void kc_matmul_fp8(KCudaGemm *g, void *out, const void *x, DType act, const Tensor *w,
                   const Tensor *bias, int n, cudaStream_t s) {
    if (!f8_fast_ok(x, act, w, bias))
        return kc_matmul_fp8_generic(out, x, act, w, bias, n, s);
    const bool lt = f8_wants_lt(g, n);
    if (lt && f8_lt_rows(g, out, x, act, w, bias, n, NULL, NULL, s))
        return;
    if (!lt && f8_wants_wgmma(g, act, w, n) &&
        f8_wgmma_rows(g, out, x, act, w, bias, n, NULL, NULL, s))
        return;
    f8_log((int)w->shape[0], (int)w->shape[1], (int)w->fp8.kind, lt ? F8_PATH_TILED : F8_PATH_GEMV);
    f8_gemv_rows(g, out, x, act, w, bias, 0, n, s);
}

/* Whether kc_matmul_fp8_produced may take an fp8 weight w at n rows (of x at x): the cuBLASLt
 * and wgmma paths, whose quantization a producing op can do. */
static bool f8_produced_ok(KCudaGemm *g, const Tensor *w, const Tensor *bias, const void *x,
                           DType act, int n) {
    /* anything k_cuda_matmul would refuse or treat apart goes the plain way */
    const bool bias_ok = !bias || (bias->data && bias->ndim == 1 && bias->shape[0] == w->shape[0]);
    return w->dtype == DT_F8E4M3 && w->ndim == 2 && bias_ok &&
           (f8_wants_lt(g, n) || f8_wants_wgmma(g, act, w, n)) && f8_fast_ok(x, act, w, bias);
}

bool kc_fp8_row_dst(KCudaGemm *g, const Tensor *w, KcF8Dst *d, cudaStream_t s) {
    KcFp8 *f = f8_state_try(g, s);
    if (!f)
        return false;
    *d = KcF8Dst{f->q, f->xs, 1, 0, w->fp8.input_scale, NULL, w->fp8.w_scale, (int)w->shape[0]};
    return true;
}

/* One row by the one-row GEMV, x quantized by `produce` into the fp8 state's buffers; false
 * (nothing launched) where the GEMV does not take it or the buffers cannot be allocated now. */
static bool f8_gemv_produced(KCudaGemm *g, void *out, const void *x, DType act, const Tensor *w,
                             const Tensor *bias, int n, KcF8Produce produce, void *ctx,
                             cudaStream_t s) {
    if (n != 1 || !kc_fp8_row_gemv_takes(g, act, w, x, n))
        return false;
    KcF8Dst d;
    if (!kc_fp8_row_dst(g, w, &d, s))
        return false;
    produce(ctx, &d, 0, 1, s);
    CUDA_CHECK_LAUNCH();
    f8_dispatch_act(act, [&](auto *xt) {
        f8_row_gemv_run<std::remove_pointer_t<decltype(xt)>>(out, (const uint8_t *)d.q, w, bias, s,
                                                             d.xs);
    });
    f8_log((int)w->shape[0], (int)w->shape[1], (int)w->fp8.kind, F8_PATH_GEMV);
    return true;
}

bool kc_matmul_fp8_produced(KCudaGemm *g, void *out, const void *x, DType act, const Tensor *w,
                            const Tensor *bias, int n, KcF8Produce produce, void *ctx,
                            cudaStream_t s) {
    if (f8_gemv_produced(g, out, x, act, w, bias, n, produce, ctx, s))
        return true;
    if (!f8_produced_ok(g, w, bias, x, act, n))
        return false;
    if (f8_wants_lt(g, n))
        return f8_lt_rows(g, out, x, act, w, bias, n, produce, ctx, s);
    return f8_wgmma_rows(g, out, x, act, w, bias, n, produce, ctx, s);
}
