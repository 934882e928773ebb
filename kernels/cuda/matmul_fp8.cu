/* matmul_fp8.cu - the linear layers on fp8 weights: out[n, N] = x[n, K] w^T (+ bias) for w in
 * DT_F8E4M3 with its scales (Tensor.fp8), following matmul's fp8 semantics exactly
 * (include/kernels.h; kernels/cpu/matmul_fp8.c is the reference): each group of a row of x
 * (the whole row; 128-column blocks with FP8_SCALE_BLOCK) gets the scale s = input_scale, or
 * max(amax / 448, PL_F8E4M3_MIN_SCALE), and is quantized to q = e4m3 satfinite of x * (1 / s)
 * (the same fp32 operations as the CPU: IEEE division, one rounded multiply, cvt.rn.satfinite);
 * then out = sum over groups of dot(q, w) * (s_x s_w), fp32 accumulation, bias, rounded once.
 * Products of two e4m3 values are exact in fp32, so the results differ from the CPU's only in
 * the order of the fp32 sums (and the tensor cores' accumulation inside one 32-deep mma).
 *
 * Two paths:
 *   - Small n (decode, n <= F8_GEMV_MAX_N): f8_gemv_kernel, a memory-bound tensor-core GEMV.
 *     A block owns 16 or 32 weight rows (one or two m16n8k32 e4m3 mma tiles) and 8 rows of x
 *     (the mma's n), its 8 warps split K in 128-column units. Each lane streams 16 bytes = 16
 *     weights of two rows per 64 columns with non-allocating loads (gemv.cuh's ld_stream),
 *     F8_FLIGHT tile-units (8 KiB a warp) in flight, the first ones requested before the PDL
 *     wait. x is quantized in the kernel: every block first computes the scales of its rows of
 *     x (one pass over them, from L2, while its first weights arrive), then each lane
 *     quantizes the 16 values of x its B fragment needs as it goes. Its epilogue may also be
 *     the op after the projection (kc_fp8_silu_mul: gate and up rows in one tile, SiLU times
 *     up; kc_fp8_qkv_rope_cache: the rows i and i + D/2 of a head in one tile, RoPE and the
 *     KV-cache store, bf16 or fp8 cache), one launch instead of two. The mma's k order is
 *     permuted (a lane's 16 contiguous bytes feed two mmas) identically in A and B, which the
 *     semantics allow ("the order within a dot is the backend's"). Each unit's mma sum starts from zero and is
 *     added to fp32 registers (block scales: times s_x s_w of that group), so the tensor
 *     cores' limited accumulation precision spans 128 products at most, as in DeepGEMM.
 *     The same kernel, tiled over x's rows (grid.y), is the fallback for any shape cuBLASLt
 *     refuses (and the n % 4 tail rows of the cuBLASLt path).
 *   - Larger n: f8_quant_kernel writes q [rows, K] e4m3 and the scales into this gemm's
 *     buffers (one block a row, read once; allocated by the first such eager call; chunks of
 *     rows beyond them), then one
 *     cuBLASLt fp8 GEMM (TN: A = w [K, N] op T, B = q [K, rows], both K-major; fp32 compute,
 *     act out): per-tensor and per-channel weights with CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F
 *     on both sides (A: the N channel scales, or N copies of the tensor scale; B: the per-row
 *     x scales), 128 x 128 block weights with A BLK128x128_32F (the checkpoint's scale layout
 *     itself, when ceil(K / 128) % 4 == 0) and B VEC128_32F (x scales [group, row], row-major
 *     by group). Those modes are Hopper-only in cuBLASLt 12.9+; cuBLAS wants M and N (here N
 *     and the rows) multiples of 4 for them, so the rows are taken 4 at a time and the 1-3 left
 *     go to the GEMV. A combination the heuristic refuses falls back to the tiled GEMV; which
 *     path each (N, K, scale kind) takes is printed once to stderr.
 *
 * These need K % 16 == 0, x and w 16-byte aligned, block scales of 128: anything else goes to
 * matmul_fp8_generic.cu. F32, BF16 and F16 activations all work (cuBLASLt writes fp32 for F32). */
#include <cublasLt.h>
#include <cuda_fp8.h>
#include <stdio.h>
#include <string.h>

#include <mutex>

#include "cublas_util.cuh"
#include "gemv.cuh"
#include "rope.cuh"


enum {
    F8_GEMV_MAX_N = 8,     /* n at or below: the GEMV (measured: see PERFORMANCE.md) */
    F8_TILE_N = 16,        /* weight rows per block: one m16 mma tile */
    F8_TILE_X = 8,         /* rows of x per block: the mma's n */
    F8_WARPS = 8,          /* warps per block, splitting K */
    F8_FLIGHT = 4,         /* tile-units (16 rows x 128 columns) in flight per warp */
    F8_Q_CHUNKS = 4,       /* 8-element chunks of a row per thread of the quantization */
    F8_UNIT = 128,         /* columns per unit of work (a block-scale group) */
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
    F8Entry cache[F8_CACHE];
    int cached;
};

void kc_fp8_destroy(KcFp8 *f) {
    if (!f)
        return;
    k_cuda_free(f->q);
    k_cuda_free(f->xs);
    k_cuda_free(f->wvec);
    free(f);
}

size_t kc_fp8_device_bytes(const KcFp8 *f) {
    return f ? (size_t)F8_Q_BYTES + sizeof(float) * (F8_XS_FLOATS + F8_WVEC_FLOATS) : 0;
}

/* ---------------- shared device pieces ---------------- */

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

/* sS[i gs + g], sI[i gs + g] = the scale of group g of row i < nrows (<= F8_TILE_X) of x[nrows,
 * K] and its inverse, g < gs groups (the whole row when !block, else 128-column blocks),
 * computed by the whole block (blockDim.x a multiple of 32, at most 1024); red holds nrows x 32
 * floats. Callers __syncthreads() before reading them. A scale is a maximum's, exact in any
 * order, so the loads are arranged for latency: several in flight per thread, all rows at
 * once where the groups allow (x comes from L2). */
template <typename XT>
__device__ void f8_row_scales(const XT *__restrict__ x, int nrows, int K, bool block,
                              float input_scale, float *sS, float *sI, float *red) {
    const int tid = threadIdx.x, nt = blockDim.x, chunks = K >> 3;
    const int gs = block ? (K + F8_UNIT - 1) / F8_UNIT : 1;
    if (input_scale > 0.0f) {
        for (int g = tid; g < nrows * gs; g += nt) {
            sS[g] = input_scale;
            sI[g] = __fdiv_rn(1.0f, input_scale);
        }
        return;
    }
    if (block) {
        /* 16 chunks of 8 are one group: a half-warp's, at every step of the loop */
        for (int i = 0; i < nrows; i++) {
            const XT *row = x + (size_t)i * K;
#pragma unroll 4
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
                    sS[i * gs + (c >> 4)] = s;
                    sI[i * gs + (c >> 4)] = __fdiv_rn(1.0f, s);
                }
            }
        }
        return;
    }
    /* the rows are contiguous: chunk j of them all is in row j / chunks */
    float m[F8_TILE_X] = {};
    const int total = nrows * chunks;
#pragma unroll 4
    for (int j = tid; j < total; j += nt) {
        float f[8];
        load8(f, x + (size_t)j * 8);
        float v = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; e++)
            v = fmaxf(v, fabsf(f[e]));
        const int r = j / chunks;
#pragma unroll
        for (int i = 0; i < F8_TILE_X; i++)
            if (i == r)
                m[i] = fmaxf(m[i], v);
    }
#pragma unroll
    for (int i = 0; i < F8_TILE_X; i++) {
        if (i >= nrows)
            break;
        const float w = warp_max(m[i]);
        if ((tid & 31) == 0)
            red[i * 32 + (tid >> 5)] = w;
    }
    __syncthreads();
    if (tid < nrows) {
        float mm = red[tid * 32];
        for (int w = 1; w < nt / 32; w++)
            mm = fmaxf(mm, red[tid * 32 + w]);
        const float s = f8_scale(mm, 0.0f);
        sS[tid] = s;
        sI[tid] = __fdiv_rn(1.0f, s);
    }
}

/* ---------------- the GEMV (and tiled fallback), with its fused epilogues ---------------- */

/* What a block does with its sums: store them (the matmul), SiLU(gate) times up, or RoPE and
 * the KV-cache store (f8_half_row says which rows a tile pairs for them). */
enum { F8_EPI_STORE = 0, F8_EPI_SILU = 1, F8_EPI_QKV = 2 };

template <typename XT> struct F8GemvArgs {
    XT *out;                  /* STORE: [n, N]; SILU: [n, N / 2]; QKV: unused */
    const XT *x;              /* [n, K] */
    const uint8_t *w;         /* [N, K] */
    const float *w_scale;     /* per kind */
    const void *bias;         /* NULL: none */
    int bias_dt, kind, N, K, n;
    int groups;               /* block kind: ceil(K / 128); else 1 */
    float input_scale;
    RopeKv rope;              /* QKV: q_out, positions, inv_freq, heads and the cache */
    int rot_tiles;            /* QKV: tiles of 8 rotated pairs, (nh + nkv) D / 16 */
    int rot_blocks;           /* QKV: blocks of them, ceil(rot_tiles / MT); v blocks after */
};

__device__ __forceinline__ void mma_e4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* The weight rows of a lane: half h of m16 tile m of this block is 8 rows, lane (g, t) has
 * row f8_half_row(a, m, h) + g. STORE: 16 consecutive rows a tile. The fused epilogues pair a
 * tile's halves: SILU's tile p = MT bx + m is gate rows [8 p, +8) and the up rows N / 2 after
 * them; QKV's rotated tile p is rows [i, i + 8) and [i + D/2, +8) of one q or k head (p <
 * rot_tiles), then 16 consecutive v rows a tile. A tile past its range (the epilogue skips it)
 * reads rows within the weight. */
template <int EPI, int MT, typename XT>
__device__ __forceinline__ int f8_half_row(const F8GemvArgs<XT> &a, int m, int h) {
    const int p = blockIdx.x * MT + m;
    if constexpr (EPI == F8_EPI_SILU) {
        return 8 * p + h * (a.N / 2);
    } else if constexpr (EPI == F8_EPI_QKV) {
        const int D = a.rope.D, hd = D / 2, per_head = hd / 8;
        if (blockIdx.x < a.rot_blocks)
            return (p / per_head) * D + (p % per_head) * 8 + h * hd;
        return (a.rope.nh + a.rope.nkv) * D + F8_TILE_N * (p - a.rot_blocks * MT) + 8 * h;
    } else {
        return F8_TILE_N * p + 8 * h;
    }
}

/* What the sums v[m][e] of lane (g, t) become: v[m][e] is weight row row[m][e >> 1] against x
 * row c0 + 2 t + (e & 1), fully scaled and biased. The values a projection would have stored
 * are v rounded to XT; the fused epilogues start from those, as the op after the projection
 * does (silu_mul, rope_kv_vec_kernel). */
template <int EPI, int MT, typename XT, typename TC>
__device__ __forceinline__ void f8_epilogue(const F8GemvArgs<XT> &a, const float (&v)[MT][4],
                                            const int (&row)[MT][2], int t, int c0, int nx) {
#pragma unroll
    for (int m = 0; m < MT; m++) {
        const int p = blockIdx.x * MT + m;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int col = 2 * t + (e & 1), tok = c0 + col, r = row[m][e >> 1];
            if (col >= nx)
                continue;
            if constexpr (EPI == F8_EPI_STORE) {
                if (r < a.N)
                    a.out[(size_t)tok * a.N + r] = from_f32<XT>(v[m][e]);
            } else if constexpr (EPI == F8_EPI_SILU) {
                if (e >= 2 || r >= a.N / 2)
                    continue;
                const float gate = to_f32(from_f32<XT>(v[m][e]));
                const float up = to_f32(from_f32<XT>(v[m][e + 2]));
                a.out[(size_t)tok * (a.N / 2) + r] = from_f32<XT>(silu_times(gate, up));
            } else {
                const RopeKv &k = a.rope;
                const int vrow = (k.nh + k.nkv) * k.D;
                TC *kdst = cache_row<TC>(k, tok);
                if (blockIdx.x >= a.rot_blocks) { /* v rows: only cached */
                    if (kdst && r < a.N)
                        kdst[k.half + (size_t)(r - vrow)] =
                            kv_enc<TC>(to_f32(from_f32<XT>(v[m][e])), k.v_inv);
                    continue;
                }
                if (e >= 2 || p >= a.rot_tiles)
                    continue;
                const int h = r / k.D, d = r % k.D, hd = k.D / 2;
                float x1 = to_f32(from_f32<XT>(v[m][e])), x2 = to_f32(from_f32<XT>(v[m][e + 2]));
                rope_rotate<XT>(x1, x2, (float)k.positions[tok], k.inv_freq[d]);
                if (h < k.nh) {
                    XT *q = (XT *)k.r.q_out + ((size_t)tok * k.nh + h) * k.D;
                    q[d] = from_f32<XT>(x1);
                    q[d + hd] = from_f32<XT>(x2);
                } else if (kdst) {
                    kdst[(size_t)(h - k.nh) * k.D + d] = kv_enc<TC>(x1, k.k_inv);
                    kdst[(size_t)(h - k.nh) * k.D + d + hd] = kv_enc<TC>(x2, k.k_inv);
                }
            }
        }
    }
}

/* Block (blockIdx.x, blockIdx.y): MT m16 tiles of weight rows (f8_half_row) against rows
 * [8 by, +8) of x. Lane (g = lane / 4, t = lane % 4) holds weight row g of each half of each
 * tile (the mma's rows g and g + 8) and x row g of the mma; for the 64 columns from k0 it reads
 * columns k0 + 16 t .. + 16 of each, the first 8 for one mma and the last 8 for the next (A's
 * a0/a2 and B's b0/b1 take the 4-byte halves: the same permutation of k on both sides). Warp w
 * takes the 128-column units w, w + 8, w + 16, ...; F8_FLIGHT / MT of them are in flight per
 * warp at any time (a ring of registers: a unit's slot is refilled with the unit F8_FLIGHT /
 * MT ahead as soon as its mmas are issued), the first ones requested before the PDL wait, so
 * that the scales of x and the previous kernel's tail overlap the weights' first bytes. The sum
 * of a row does not depend on MT or on the epilogue (the same units per warp, added in the same
 * order, the same reduction, no FMA contraction), so the fused epilogues see exactly the plain
 * GEMV's values.
 * Dynamic shared memory: the x scales and inverses, [8][groups] each. */
template <typename XT, typename TC, int MT, int EPI>
__global__ void __launch_bounds__(F8_WARPS * 32, 2) f8_gemv_kernel(F8GemvArgs<XT> a) {
    constexpr int P = F8_FLIGHT / MT;
    extern __shared__ float f8_smem[];
    __shared__ float red[F8_WARPS][32][4 * MT];
    __shared__ float rmax[F8_TILE_X * 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int c0 = blockIdx.y * F8_TILE_X;
    const int nx = min(F8_TILE_X, a.n - c0), K = a.K, units = (K + F8_UNIT - 1) / F8_UNIT;
    const bool block = a.kind == FP8_SCALE_BLOCK;
    const int gs = block ? a.groups : 1;
    float *sS = f8_smem, *sI = f8_smem + F8_TILE_X * gs;
    int row[MT][2];            /* this lane's weight rows: [tile][half] */
    const uint8_t *wr[2 * MT]; /* the same, clamped into the weight */
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            row[m][h] = f8_half_row<EPI, MT>(a, m, h) + g;
            wr[2 * m + h] = a.w + (size_t)min(row[m][h], a.N - 1) * K;
        }

    /* one unit's weights: [step][tile][row g, row g + 8], zero beyond K */
    auto load_unit = [&](int u, uint4 (&v)[4 * MT]) {
#pragma unroll
        for (int s = 0; s < 2; s++) {
            const int kk = u * F8_UNIT + s * 64 + t * 16;
#pragma unroll
            for (int i = 0; i < 2 * MT; i++)
                v[s * 2 * MT + i] =
                    u < units && kk < K ? ld_stream(wr[i] + kk) : make_uint4(0, 0, 0, 0);
        }
    };

    const int mine = warp < units ? (units - warp + F8_WARPS - 1) / F8_WARPS : 0;
    uint4 ring[P][4 * MT];
#pragma unroll
    for (int p = 0; p < P; p++)
        load_unit(warp + p * F8_WARPS, ring[p]);
    kc_pdl_wait();
    kc_pdl_trigger();
    f8_row_scales(a.x + (size_t)c0 * K, nx, K, block, a.input_scale, sS, sI, rmax);
    __syncthreads();

    const XT *xr = a.x + (size_t)(c0 + g) * K;
    const bool has_x = g < nx;
    float acc[MT][4] = {};
    for (int i0 = 0; i0 < mine; i0 += P) {
#pragma unroll
        for (int p = 0; p < P; p++) {
            if (i0 + p >= mine)
                break;
            const int u = warp + (i0 + p) * F8_WARPS;
            const float inv = has_x ? sI[g * gs + (block ? u : 0)] : 0.0f;
            float d[MT][4] = {}; /* this unit's sums, from zero */
#pragma unroll
            for (int s = 0; s < 2; s++) {
                const int kk = u * F8_UNIT + s * 64 + t * 16;
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
                for (int m = 0; m < MT; m++) {
                    const uint4 &lo = ring[p][s * 2 * MT + 2 * m];
                    const uint4 &hi = ring[p][s * 2 * MT + 2 * m + 1];
                    mma_e4m3(d[m], lo.x, hi.x, lo.y, hi.y, b[0], b[1]);
                    mma_e4m3(d[m], lo.z, hi.z, lo.w, hi.w, b[2], b[3]);
                }
            }
            load_unit(u + P * F8_WARPS, ring[p]);
#pragma unroll
            for (int m = 0; m < MT; m++) {
                if (block) {
                    /* d[m][e]: weight row row[m][e >> 1], x row 2t + (e & 1); a half's 8 rows
                     * share one 128-row scale block */
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int col = 2 * t + (e & 1);
                        const float ws = a.w_scale[(size_t)(min(row[m][e >> 1], a.N - 1) / F8_UNIT) *
                                                       a.groups +
                                                   u];
                        const float xs = col < nx ? sS[col * gs + u] : 0.0f;
                        acc[m][e] = __fadd_rn(acc[m][e], __fmul_rn(d[m][e], __fmul_rn(xs, ws)));
                    }
                } else {
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        acc[m][e] += d[m][e];
                }
            }
        }
    }
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            red[warp][lane][4 * m + e] = acc[m][e];
    __syncthreads();
    if (warp != 0)
        return;
    float v[MT][4];
#pragma unroll
    for (int m = 0; m < MT; m++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float s = red[0][lane][4 * m + e];
            for (int w = 1; w < F8_WARPS; w++)
                s += red[w][lane][4 * m + e];
            const int r = min(row[m][e >> 1], a.N - 1), col = 2 * t + (e & 1);
            /* no contraction into FMAs: the same bits in every instantiation (MT, epilogue) */
            if (!block && col < nx)
                s = __fmul_rn(s, __fmul_rn(sS[col], a.kind == FP8_SCALE_CHANNEL ? a.w_scale[r]
                                                                                : a.w_scale[0]));
            if (a.bias)
                s = __fadd_rn(s, load_any(a.bias, a.bias_dt, r));
            v[m][e] = s;
        }
    }
    f8_epilogue<EPI, MT, XT, TC>(a, v, row, t, c0, nx);
}

/* The arguments of a GEMV on w for n rows of x (the epilogue's own fields left zero). */
template <typename XT>
static F8GemvArgs<XT> f8_args(void *out, const void *x, const Tensor *w, const Tensor *b, int n) {
    F8GemvArgs<XT> a;
    memset(&a, 0, sizeof a);
    a.out = (XT *)out;
    a.x = (const XT *)x;
    a.w = (const uint8_t *)w->data;
    a.w_scale = w->fp8.w_scale;
    a.bias = b ? b->data : NULL;
    a.bias_dt = b ? (int)b->dtype : 0;
    a.kind = (int)w->fp8.kind;
    a.N = (int)w->shape[0];
    a.K = (int)w->shape[1];
    a.n = n;
    a.groups = (a.K + F8_UNIT - 1) / F8_UNIT;
    a.input_scale = w->fp8.input_scale;
    return a;
}

/* Dynamic shared memory of a GEMV launch: the x scales and inverses. */
static size_t f8_gemv_smem(const Tensor *w) {
    const int K = (int)w->shape[1];
    const int gs = w->fp8.kind == FP8_SCALE_BLOCK ? (K + F8_UNIT - 1) / F8_UNIT : 1;
    return 2 * sizeof(float) * F8_TILE_X * (size_t)gs;
}

template <typename XT, typename TC, int MT, int EPI>
static void f8_launch(const F8GemvArgs<XT> &a, const Tensor *w, unsigned blocks, cudaStream_t s) {
    const size_t smem = f8_gemv_smem(w);
    KC_REQUIRE(smem <= 48 * 1024, "k_cuda_matmul fp8: K %d too deep for block scales", a.K);
    const dim3 grid(blocks, (unsigned)((a.n + F8_TILE_X - 1) / F8_TILE_X));
    kc_launch_pdl(f8_gemv_kernel<XT, TC, MT, EPI>, grid, dim3(F8_WARPS * 32), smem, s, a);
    CUDA_CHECK_LAUNCH();
}

/* mt: m16 tiles per block (1 or 2). */
template <typename XT>
static void f8_gemv(void *out, const void *x, const Tensor *w, const Tensor *b, int n, int mt,
                    cudaStream_t s) {
    const F8GemvArgs<XT> a = f8_args<XT>(out, x, w, b, n);
    const int rows = F8_TILE_N * mt;
    const unsigned blocks = (unsigned)((a.N + rows - 1) / rows);
    if (mt == 2)
        f8_launch<XT, XT, 2, F8_EPI_STORE>(a, w, blocks, s);
    else
        f8_launch<XT, XT, 1, F8_EPI_STORE>(a, w, blocks, s);
}

/* ---------------- quantization for cuBLASLt ---------------- */

/* Block r quantizes row r of x[rows, K] into q (e4m3) and its scales into xs[g * ld + r];
 * wvec (when non-NULL) gets wvec_n copies of *w_scale0. The row is read once: thread t holds
 * chunks t + j blockDim.x (j < F8_Q_CHUNKS, 8 elements each) in registers from the load to the
 * store, so all of its loads are in flight together; blockDim.x = f8_quant_threads(K). With
 * block scales, a group (16 chunks) is a half-warp's at every j. */
template <typename XT>
__global__ void __launch_bounds__(1024)
    f8_quant_kernel(uint8_t *__restrict__ q, float *__restrict__ xs, int ld,
                    const XT *__restrict__ x, int K, int block, float input_scale, float *wvec,
                    const float *w_scale0, int wvec_n) {
    __shared__ float red[32];
    const int r = blockIdx.x, tid = threadIdx.x, nt = blockDim.x, chunks = K >> 3;
    kc_pdl_wait();
    kc_pdl_trigger();
    if (wvec)
        for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < wvec_n;
             j += gridDim.x * blockDim.x)
            wvec[j] = *w_scale0;
    const XT *row = x + (size_t)r * K;
    uint8_t *qrow = q + (size_t)r * K;
    float f[F8_Q_CHUNKS][8], am[F8_Q_CHUNKS];
#pragma unroll
    for (int j = 0; j < F8_Q_CHUNKS; j++) {
        const int c = tid + j * nt;
        am[j] = 0.0f;
        if (c < chunks) {
            load8(f[j], row + (size_t)c * 8);
#pragma unroll
            for (int e = 0; e < 8; e++)
                am[j] = fmaxf(am[j], fabsf(f[j][e]));
        }
    }
    float s_row = input_scale;
    if (!block && input_scale <= 0.0f) {
        float m = 0.0f;
#pragma unroll
        for (int j = 0; j < F8_Q_CHUNKS; j++)
            m = fmaxf(m, am[j]);
        m = warp_max(m);
        if ((tid & 31) == 0)
            red[tid >> 5] = m;
        __syncthreads();
        m = red[0];
        for (int w = 1; w < nt / 32; w++)
            m = fmaxf(m, red[w]);
        s_row = f8_scale(m, 0.0f);
    }
    if (!block && tid == 0)
        xs[r] = s_row;
#pragma unroll
    for (int j = 0; j < F8_Q_CHUNKS; j++) {
        const int c = tid + j * nt;
        float s = s_row;
        if (block) {
            float m = am[j];
#pragma unroll
            for (int o = 8; o > 0; o >>= 1)
                m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
            s = f8_scale(m, input_scale);
            if ((tid & 15) == 0 && c < chunks)
                xs[(size_t)(c >> 4) * ld + r] = s;
        }
        if (c < chunks) {
            const float inv = __fdiv_rn(1.0f, s);
            *(uint2 *)(qrow + (size_t)c * 8) =
                make_uint2(f8_pack4(f[j], inv), f8_pack4(f[j] + 4, inv));
        }
    }
}

/* Threads of f8_quant_kernel for rows of K: enough for F8_Q_CHUNKS chunks each, whole warps
 * (0 when K is too deep for one block). */
static int f8_quant_threads(int K) {
    const int chunks = K / 8, threads = (chunks + F8_Q_CHUNKS - 1) / F8_Q_CHUNKS;
    return threads > 1024 ? 0 : (threads + 31) / 32 * 32;
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
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof ma));
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof mb));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                &a_scale, sizeof a_scale));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                &b_scale, sizeof b_scale));
    if (k->bias) {
        uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                                    sizeof epi));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                    &bias, sizeof bias));
        int32_t bt = k->ct;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
            &p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
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

/* The GEMV rows per warp forced by k_cuda_gemm_force (0: the default), matmul.cu; for fp8, 1
 * means one m16 tile per block (16 weight rows), 2 two. */
int kc_gemm_forced_rows(const KCudaGemm *g);

/* m16 tiles per GEMV block: the forced count, else 1 at n = 1 (F8_FLIGHT units a warp: at K =
 * 4096 a warp's whole share of the row in one round of loads, and twice the blocks to spread
 * over the SMs) and 2 for more rows of x (each quantized x fragment feeds two tiles); the
 * timing test prints both. */
static int f8_gemv_tiles(const KCudaGemm *g, int n) {
    const int forced = kc_gemm_forced_rows(g);
    if (forced == 1 || forced == 2)
        return forced;
    return n == 1 ? 1 : 2;
}

enum {
    F8_PATH_GEMV = 0,
    F8_PATH_TILED = 1,
    F8_PATH_LT_OUTER = 2,
    F8_PATH_LT_BLOCK = 3,
    F8_PATH_SILU = 4,
    F8_PATH_QKV = 5
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
                                  "fp8 GEMV + SiLU-mul (n <= 8)",
                                  "fp8 GEMV + RoPE + KV-cache store (n <= 8)"};
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

static KcFp8 *f8_state(KCudaGemm *g, cudaStream_t s) {
    KcFp8 **fp = kc_gemm_fp8(g);
    if (!*fp) {
        KC_REQUIRE(!kc_capturing(s),
                   "k_cuda_matmul: the first fp8 call beyond %d rows allocates: make it before "
                   "graph capture",
                   F8_GEMV_MAX_N);
        KcFp8 *f = (KcFp8 *)pl_xcalloc(1, sizeof *f);
        f->q = (uint8_t *)k_cuda_malloc(F8_Q_BYTES);
        f->xs = (float *)k_cuda_malloc(sizeof(float) * F8_XS_FLOATS);
        f->wvec = (float *)k_cuda_malloc(sizeof(float) * F8_WVEC_FLOATS);
        *fp = f;
    }
    return *fp;
}

/* The cuBLASLt path on rows [0, n) (n % 4 == 0), in chunks that fit the buffers; false (nothing
 * done) where cuBLASLt has no algorithm for it. */
static bool f8_lt(KCudaGemm *g, void *out, const void *x, DType act, const Tensor *w,
                  const Tensor *b, int n, cudaStream_t s) {
    const Fp8Scales *sc = &w->fp8;
    const int N = (int)w->shape[0], K = (int)w->shape[1];
    const bool block = sc->kind == FP8_SCALE_BLOCK;
    const int groups = block ? (K + F8_UNIT - 1) / F8_UNIT : 1;
    if (N % 4 != 0 || (block && groups % 4 != 0) ||
        (sc->kind == FP8_SCALE_TENSOR && N > F8_WVEC_FLOATS) || groups > 1024 ||
        f8_quant_threads(K) == 0)
        return false;
    KcFp8 *f = f8_state(g, s);
    int chunk = F8_Q_BYTES / K;
    if (chunk > F8_XS_FLOATS / groups)
        chunk = F8_XS_FLOATS / groups;
    chunk &= ~3;
    const size_t es = pl_dtype_size(act);
    const bool fuse_bias = b && b->dtype == act && kc_aligned16(b->data);
    F8Key key;
    memset(&key, 0, sizeof key);
    key.N = N;
    key.K = K;
    key.mode = block ? F8_MODE_BLOCK : F8_MODE_OUTER;
    key.ct = (int)f8_cuda_type(act);
    key.bias = fuse_bias;
    key.al_w = kc_lt_alignment(w->data, (size_t)K);
    key.al_out = kc_lt_alignment(out, (size_t)N * es);
    const void *a_scale = sc->kind == FP8_SCALE_TENSOR ? (const void *)f->wvec : sc->w_scale;
    const void *bias = fuse_bias ? b->data : NULL;
    void *ws;
    size_t ws_bytes;
    cublasLtHandle_t lt = (cublasLtHandle_t)kc_gemm_lt(g, &ws, &ws_bytes);
    for (int r0 = 0; r0 < n; r0 += chunk) {
        const int rows = n - r0 < chunk ? n - r0 : chunk;
        key.mb = f8_bucket(rows);
        const cublasLtMatmulAlgo_t *algo = f8_algo(g, f, &key, rows, a_scale, f->xs, bias);
        if (!algo) {
            KC_REQUIRE(r0 == 0, "k_cuda_matmul fp8: cuBLASLt refused a later chunk");
            return false;
        }
        f8_dispatch_act(act, [&](auto *xt) {
            using XT = std::remove_pointer_t<decltype(xt)>;
            kc_launch_pdl(f8_quant_kernel<XT>, dim3((unsigned)rows),
                          dim3((unsigned)f8_quant_threads(K)), 0, s, f->q,
                          f->xs, rows, (const XT *)x + (size_t)r0 * K, K, (int)block,
                          sc->input_scale, sc->kind == FP8_SCALE_TENSOR ? f->wvec : (float *)NULL,
                          sc->w_scale, N);
        });
        CUDA_CHECK_LAUNCH();
        F8Problem p;
        f8_problem(&p, &key, rows, a_scale, f->xs, bias);
        const float alpha = 1.0f, beta = 0.0f;
        void *o = (char *)out + (size_t)r0 * N * es;
        cublasStatus_t st = cublasLtMatmul(lt, &p.desc, &alpha, w->data, &p.la, f->q, &p.lb,
                                           &beta, o, &p.lc, o, &p.lc, algo, ws, ws_bytes, s);
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
    if (b && !fuse_bias)
        kc_bias_add(out, act, b, n, N, s);
    return true;
}

void kc_matmul_fp8(KCudaGemm *g, void *out, const void *x, DType act, const Tensor *w,
                   const Tensor *bias, int n, cudaStream_t s) {
    const Fp8Scales *sc = &w->fp8;
    const int N = (int)w->shape[0], K = (int)w->shape[1];
    KC_REQUIRE(sc->w_scale && sc->kind >= FP8_SCALE_TENSOR && sc->kind <= FP8_SCALE_BLOCK,
               "k_cuda_matmul: fp8 weight %dx%d without scales", N, K);
    if (kc_fp8_generic_takes(w, x)) /* any K, alignment, block size: matmul_fp8_generic.cu */
        return kc_matmul_fp8_generic(out, x, act, w, bias, n, s);
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
    const int forced = kc_gemm_forced_path(g);
    int done = 0, path = F8_PATH_GEMV;
    if (forced == KC_GEMM_CUBLASLT || (forced != KC_GEMM_GEMV && n > F8_GEMV_MAX_N)) {
        const int n4 = n & ~3;
        if (n4 > 0 && f8_lt(g, out, x, act, w, bias, n4, s)) {
            done = n4;
            path = sc->kind == FP8_SCALE_BLOCK ? F8_PATH_LT_BLOCK : F8_PATH_LT_OUTER;
        } else if (n4 > 0) {
            path = F8_PATH_TILED;
        }
    }
    f8_log(N, K, (int)sc->kind, path);
    if (done == n)
        return;
    const size_t es = pl_dtype_size(act);
    f8_dispatch_act(act, [&](auto *xt) {
        using XT = std::remove_pointer_t<decltype(xt)>;
        f8_gemv<XT>((char *)out + (size_t)done * N * es, (const char *)x + (size_t)done * K * es,
                    w, bias, n - done, f8_gemv_tiles(g, n - done), s);
    });
}

/* Whether the GEMV takes n rows of x against w: what kc_matmul_fp8 requires (loudly), n <= 8
 * and no forced cuBLASLt. */
static bool f8_gemv_ok(KCudaGemm *g, const void *x, DType act, const Tensor *w, int n) {
    const Fp8Scales *sc = &w->fp8;
    return n >= 1 && n <= F8_GEMV_MAX_N && kc_gemm_forced_path(g) != KC_GEMM_CUBLASLT &&
           w->ndim == 2 && sc->w_scale && sc->kind >= FP8_SCALE_TENSOR &&
           sc->kind <= FP8_SCALE_BLOCK && (sc->kind != FP8_SCALE_BLOCK || sc->block == F8_UNIT) &&
           w->shape[1] % 16 == 0 && kc_aligned16(x) && kc_aligned16(w->data) &&
           (act == DT_BF16 || act == DT_F16 || act == DT_F32) && f8_gemv_smem(w) <= 48 * 1024;
}

bool kc_fp8_silu_mul(KCudaGemm *g, void *out, const void *x, DType act, const Tensor *w, int n,
                     cudaStream_t s) {
    const int N = (int)w->shape[0], mt = f8_gemv_tiles(g, n);
    if (N % 16 != 0 || !f8_gemv_ok(g, x, act, w, n))
        return false;
    f8_log(N, (int)w->shape[1], (int)w->fp8.kind, F8_PATH_SILU);
    const unsigned blocks = (unsigned)((N / 16 + mt - 1) / mt); /* tiles of 8 gate-up pairs */
    f8_dispatch_act(act, [&](auto *xt) {
        using XT = std::remove_pointer_t<decltype(xt)>;
        const F8GemvArgs<XT> a = f8_args<XT>(out, x, w, NULL, n);
        if (mt == 2)
            f8_launch<XT, XT, 2, F8_EPI_SILU>(a, w, blocks, s);
        else
            f8_launch<XT, XT, 1, F8_EPI_SILU>(a, w, blocks, s);
    });
    return true;
}

bool kc_fp8_qkv_rope_cache(KCudaGemm *g, const RopeKv *r, DType cache_dt, const void *x, DType act,
                           const Tensor *w, const Tensor *bias, int n, cudaStream_t s) {
    const int D = r->D, mt = f8_gemv_tiles(g, n);
    if (D % 16 != 0 || (cache_dt != act && cache_dt != DT_F8E4M3) || !f8_gemv_ok(g, x, act, w, n))
        return false;
    f8_log((int)w->shape[0], (int)w->shape[1], (int)w->fp8.kind, F8_PATH_QKV);
    const int rot_tiles = (r->nh + r->nkv) * D / 16, v_tiles = r->nkv * D / F8_TILE_N;
    const int rot_blocks = (rot_tiles + mt - 1) / mt;
    const unsigned blocks = (unsigned)(rot_blocks + (v_tiles + mt - 1) / mt);
    f8_dispatch_act(act, [&](auto *xt) {
        using XT = std::remove_pointer_t<decltype(xt)>;
        F8GemvArgs<XT> a = f8_args<XT>(NULL, x, w, bias, n);
        a.rope = *r;
        a.rot_tiles = rot_tiles;
        a.rot_blocks = rot_blocks;
        if (cache_dt == DT_F8E4M3 && mt == 2)
            f8_launch<XT, kv8, 2, F8_EPI_QKV>(a, w, blocks, s);
        else if (cache_dt == DT_F8E4M3)
            f8_launch<XT, kv8, 1, F8_EPI_QKV>(a, w, blocks, s);
        else if (mt == 2)
            f8_launch<XT, XT, 2, F8_EPI_QKV>(a, w, blocks, s);
        else
            f8_launch<XT, XT, 1, F8_EPI_QKV>(a, w, blocks, s);
    });
    return true;
}
