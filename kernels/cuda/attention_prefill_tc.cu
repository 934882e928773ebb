/* attention_prefill_tc.cu - causal prefill attention over the paged cache on tensor cores: bf16
 * (or f16) queries and cache of the same type, head_dim D a multiple of 16 up to 256, fp32
 * accumulation and softmax (k_cuda_attention_prefill sends everything else to the CUDA-core
 * kernel).
 *
 * Grid (query tile, KV head x head group), query tiles in reverse order so that the tiles with
 * the longest contexts start first. A tile is 64 query vectors: 64 / HB rows of one sequence
 * times the HB query heads of one KV head, so each K/V tile serves every row and head of the
 * tile; each of the 4 warps owns 16 vectors. K/V tiles of TK positions are gathered from the
 * cache's blocks by cp.async into shared memory, double-buffered (the next tile loads while
 * this one is used); rows are padded by 16 bytes so that ldmatrix reads are conflict-free.
 * Per tile, flash-attention 2 style: S = Q K^T by mma.sync m16n8k16 (16-bit in, fp32 out; Q
 * fragments stay in registers up to D = 128, else are reloaded from shared memory), causal
 * mask by each vector's own position (only on tiles that reach past the tile's first row; with
 * a sliding window the tiles start at the first position any row's window holds, positions
 * before it never loaded, and the tiles before the last row's window start are masked too),
 * online softmax in registers (exp2 with the scale folded in), then O += P V with P rounded
 * to the 16-bit type straight from the S accumulators into A fragments and V read by
 * ldmatrix.trans. The row sums are reduced across each quad once at the end.
 *
 * An fp8 cache: the tiles' bytes are gathered by cp.async into fp8 staging buffers (double-
 * buffered, half the bytes of a 16-bit tile), and each tile is widened once, exactly, into the
 * f16 K and V tiles the loop above reads (one buffer: the widening of tile kt + 1 waits for
 * tile kt's last reads); the K scale goes into the softmax scale, the V scale onto the output,
 * both in fp32. The mmas then run in f16 whatever the activations: e4m3 pairs widen to f16 in
 * one instruction (to bf16 in four), bf16 queries are converted once per block (exact within
 * f16's range, saturated beyond +-65504) and P is rounded to f16 (3 more bits than bf16). */
#include <math.h>

#include "attention.cuh"

enum { TC_THREADS = 128, TC_M = 64 };

template <typename T, typename TC, int D>
__global__ __launch_bounds__(TC_THREADS, 2) void prefill_tc_kernel(
    T *__restrict__ out, const T *__restrict__ q, const TC *__restrict__ cache, KvGeom kg,
    const int32_t *positions, const int32_t *query_start, int num_seqs, const int32_t *block_tables,
    int nh, int G, int HB, float scale_log2) {
    constexpr bool FP8 = is_kv8<TC>::value;
    using MT = std::conditional_t<FP8, f16, T>; /* the mmas' input type, of Qs, Ks and Vs */
    constexpr int NB = FP8 ? 1 : 2;             /* 16-bit K/V tile buffers */
    constexpr int TK = D <= 128 ? 64 : 32;      /* positions per K/V tile */
    constexpr int DS = D + 8;                   /* shared row stride in elements (16-byte pad) */
    constexpr int CH = D / 8;                   /* 16-byte chunks per row */
    constexpr int KD = D / 16;                  /* k-steps of Q K^T */
    constexpr int NT = TK / 8;                  /* position n-tiles of S */
    constexpr int ND = D / 8;                   /* dim n-tiles of O */
    constexpr bool QREG = D <= 128;             /* Q fragments held in registers */
    extern __shared__ uint4 smem_tc[];
    T *Qs = (T *)smem_tc;                         /* [TC_M][DS] */
    T *Ks = Qs + TC_M * DS;                       /* [NB][TK][DS] */
    T *Vs = Ks + NB * TK * DS;                    /* [NB][TK][DS] */
    uint8_t *K8 = (uint8_t *)(Vs + NB * TK * DS); /* fp8: [2][TK][D] staged bytes */
    uint8_t *V8 = K8 + 2 * TK * D;                /* [2][TK][D] */
    __shared__ int s_seq, s_t0, s_minpos, s_maxpos;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int rows = TC_M / HB;

    if (warp == 0) {
        int s, t0;
        find_tile(query_start, num_seqs, rows, (int)(gridDim.x - 1 - blockIdx.x), &s, &t0);
        if (lane == 0) {
            s_seq = s;
            s_t0 = t0;
        }
    }
    __syncthreads();
    const int s = s_seq, t0 = s_t0;
    if (s < 0)
        return;
    const int t_end = query_start[s + 1];
    const int groups = G / HB;
    const int g = blockIdx.y / groups;
    const int h0 = g * G + (blockIdx.y - g * groups) * HB;

    for (int e = tid; e < TC_M * CH; e += TC_THREADS) {
        const int v = e / CH, c = e - v * CH, r = v / HB, t = t0 + r;
        const bool ok = t < t_end;
        const T *src = ok ? q + ((size_t)t * nh + h0 + v - r * HB) * D + c * 8 : q;
        cp_async16(smem_addr(Qs + v * DS + c * 8), src, ok);
    }
    cp_async_commit();
    if (warp == 0) {
        int mn = 0x7fffffff, mx = -1;
        for (int r = lane; r < rows && t0 + r < t_end; r += 32) {
            int p = positions[t0 + r];
            mn = min(mn, p);
            mx = max(mx, p);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            mn = min(mn, __shfl_xor_sync(0xffffffffu, mn, o));
            mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        }
        if (lane == 0) {
            s_minpos = mn;
            s_maxpos = mx;
        }
    }
    /* this lane's two vectors: rows gq and gq + 8 of the warp's 16 */
    const int gq = lane >> 2, tq = lane & 3;
    const int v0 = warp * 16 + gq, v1 = v0 + 8;
    const int ta = t0 + v0 / HB, tb = t0 + v1 / HB;
    const int pos0 = ta < t_end ? positions[ta] : -1, pos1 = tb < t_end ? positions[tb] : -1;
    __syncthreads();
    const int minpos = s_minpos, maxpos = s_maxpos, lo = kv_window_lo(kg, minpos);

    const int32_t *table = block_tables + (size_t)s * kg.max_blocks;
    const TC *kbase = cache + kg.layer_off + (size_t)g * D;
    constexpr int CE = 16 / (int)sizeof(TC), CHC = D / CE; /* cache elements per copy, copies */
    auto load_tile = [&](int kt, int buf) {
        const int k0 = kt * TK;
        for (int e = tid; e < TK * CHC; e += TC_THREADS) {
            const int j = e / CHC, c = e - j * CHC, p = k0 + j;
            /* zeros past it: P = 0 must not meet garbage in V; before lo, blocks may be gone */
            const bool ok = p >= lo && p <= maxpos;
            const TC *src = cache;
            if (ok) {
                const int bi = kv_block_of(kg, p);
                src = kbase + (size_t)table[bi] * kg.block_elems +
                      (size_t)(p - bi * kg.bs) * kg.row + c * CE;
            }
            uint32_t kd, vd;
            if constexpr (FP8) {
                kd = smem_addr(K8 + (buf * TK + j) * D + c * 16);
                vd = smem_addr(V8 + (buf * TK + j) * D + c * 16);
            } else {
                kd = smem_addr(Ks + (buf * TK + j) * DS + c * 8);
                vd = smem_addr(Vs + (buf * TK + j) * DS + c * 8);
            }
            cp_async16(kd, src, ok);
            cp_async16(vd, ok ? src + kg.half : cache, ok);
        }
    };
    /* fp8: staged tile `buf` widened into Ks, Vs (16 elements a thread and pass) */
    auto widen_tile = [&](int buf) {
        for (int e = tid; e < 2 * TK * (D / 16); e += TC_THREADS) {
            const int kv = e >= TK * (D / 16), r = e - kv * TK * (D / 16);
            const int j = r / (D / 16), c = r - j * (D / 16);
            const uint4 u = *(const uint4 *)((kv ? V8 : K8) + (buf * TK + j) * D + c * 16);
            const uint32_t w[4] = {u.x, u.y, u.z, u.w};
            uint32_t o[8];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                o[2 * i] = e4m3x2_to_f16x2(w[i]);
                o[2 * i + 1] = e4m3x2_to_f16x2(w[i] >> 16);
            }
            uint4 *dst = (uint4 *)((kv ? Vs : Ks) + j * DS + c * 16);
            dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
            dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
        }
    };
    const int kt0 = lo / TK;
    load_tile(kt0, kt0 & 1);
    cp_async_commit();
    cp_async_wait<1>(); /* Q has landed */
    __syncthreads();
    if constexpr (!std::is_same<T, MT>::value) { /* Q to the mmas' type, once */
        for (int e = tid; e < TC_M * D / 2; e += TC_THREADS) {
            uint32_t *pair = (uint32_t *)(Qs + (e / (D / 2)) * DS) + e % (D / 2);
            *pair = as_mma_pair<T, MT>(*pair);
        }
        __syncthreads();
    }

    uint32_t qf[QREG ? KD : 1][4];
    const T *qrow = Qs + (warp * 16 + (lane & 15)) * DS + (lane >> 4) * 8;
    if constexpr (QREG) {
#pragma unroll
        for (int kk = 0; kk < KD; kk++)
            ldsm_x4(qf[kk], smem_addr(qrow + kk * 16));
    }
    float o[ND][4];
#pragma unroll
    for (int d = 0; d < ND; d++)
        o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    /* ldmatrix source rows: K non-transposed (2 position n-tiles x 2 halves of 16 dims), V
     * transposed (2 halves of 16 positions x 2 dim n-tiles) */
    const int krow = (lane & 7) + ((lane >> 4) << 3), kcol = ((lane >> 3) & 1) * 8;
    const int vrow = (lane & 7) + ((lane >> 3) & 1) * 8, vcol = (lane >> 4) * 8;

    const int ntiles = maxpos / TK + 1;
    for (int kt = kt0; kt < ntiles; kt++) {
        if (kt + 1 < ntiles)
            load_tile(kt + 1, (kt + 1) & 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        if constexpr (FP8) {
            widen_tile(kt & 1);
            __syncthreads();
        }
        const int cur = FP8 ? 0 : kt & 1;
        const T *Kb = Ks + cur * TK * DS, *Vb = Vs + cur * TK * DS;

        float sc[NT][4];
#pragma unroll
        for (int n = 0; n < NT; n++)
            sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KD; kk++) {
            uint32_t a[4];
            if constexpr (QREG) {
#pragma unroll
                for (int i = 0; i < 4; i++)
                    a[i] = qf[kk][i];
            } else {
                ldsm_x4(a, smem_addr(qrow + kk * 16));
            }
#pragma unroll
            for (int n = 0; n < NT; n += 2) {
                uint32_t b[4];
                ldsm_x4(b, smem_addr(Kb + (n * 8 + krow) * DS + kk * 16 + kcol));
                mma16<MT>(sc[n], a, b[0], b[1]);
                mma16<MT>(sc[n + 1], a, b[2], b[3]);
            }
        }

        const int k0 = kt * TK;
        const int w = kg.window; /* masks past a row's position, or before its window */
        if (k0 + TK - 1 > minpos || (w > 0 && k0 <= maxpos - w)) {
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    const int p = k0 + n * 8 + tq * 2 + (c & 1);
                    if (!kv_sees(kg, c < 2 ? pos0 : pos1, p))
                        sc[n][c] = -INFINITY;
                }
        }

        /* online softmax; each row is spread over the 4 lanes of a quad */
        float mx0 = m0, mx1 = m1;
#pragma unroll
        for (int n = 0; n < NT; n++) {
            mx0 = fmaxf(mx0, fmaxf(sc[n][0], sc[n][1]));
            mx1 = fmaxf(mx1, fmaxf(sc[n][2], sc[n][3]));
        }
#pragma unroll
        for (int o2 = 1; o2 <= 2; o2 <<= 1) {
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o2));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o2));
        }
        const float ms0 = mx0 == -INFINITY ? 0.0f : mx0 * scale_log2;
        const float ms1 = mx1 == -INFINITY ? 0.0f : mx1 * scale_log2;
        const float al0 = exp2f(m0 * scale_log2 - ms0), al1 = exp2f(m1 * scale_log2 - ms1);
        m0 = mx0;
        m1 = mx1;
        float rs0 = 0.0f, rs1 = 0.0f;
        uint32_t pf[NT / 2][4]; /* P as the A fragments of 16-position k-steps */
#pragma unroll
        for (int n = 0; n < NT; n++) {
            const float p0 = exp2f(fmaf(sc[n][0], scale_log2, -ms0));
            const float p1 = exp2f(fmaf(sc[n][1], scale_log2, -ms0));
            const float p2 = exp2f(fmaf(sc[n][2], scale_log2, -ms1));
            const float p3 = exp2f(fmaf(sc[n][3], scale_log2, -ms1));
            rs0 += p0 + p1;
            rs1 += p2 + p3;
            pf[n / 2][(n & 1) * 2] = pack16<MT>(p0, p1);
            pf[n / 2][(n & 1) * 2 + 1] = pack16<MT>(p2, p3);
        }
        l0 = l0 * al0 + rs0;
        l1 = l1 * al1 + rs1;
#pragma unroll
        for (int d = 0; d < ND; d++) {
            o[d][0] *= al0;
            o[d][1] *= al0;
            o[d][2] *= al1;
            o[d][3] *= al1;
        }
#pragma unroll
        for (int kc = 0; kc < TK / 16; kc++)
#pragma unroll
            for (int d = 0; d < ND; d += 2) {
                uint32_t b[4];
                ldsm_x4_trans(b, smem_addr(Vb + (kc * 16 + vrow) * DS + d * 8 + vcol));
                mma16<MT>(o[d], pf[kc], b[0], b[1]);
                mma16<MT>(o[d + 1], pf[kc], b[2], b[3]);
            }
        __syncthreads(); /* this buffer is refilled by the next iteration's load */
    }

#pragma unroll
    for (int o2 = 1; o2 <= 2; o2 <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, o2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, o2);
    }
    if (ta < t_end) {
        const float inv = kg.vs / l0; /* an fp8 cache's V scale (1 otherwise) */
        T *dst = out + ((size_t)ta * nh + h0 + v0 % HB) * D + tq * 2;
#pragma unroll
        for (int d = 0; d < ND; d++)
            *(uint32_t *)(dst + d * 8) = pack16<T>(o[d][0] * inv, o[d][1] * inv);
    }
    if (tb < t_end) {
        const float inv = kg.vs / l1;
        T *dst = out + ((size_t)tb * nh + h0 + v1 % HB) * D + tq * 2;
#pragma unroll
        for (int d = 0; d < ND; d++)
            *(uint32_t *)(dst + d * 8) = pack16<T>(o[d][2] * inv, o[d][3] * inv);
    }
}

bool kc_prefill_tc_ok(DType act, const KvLayout *l) {
    return (act == DT_BF16 || act == DT_F16) && (l->dtype == act || l->dtype == DT_F8E4M3) &&
           l->head_dim % 16 == 0 && l->head_dim <= 256;
}

template <typename T, typename TC, int D>
static void launch_tc(void *out, const void *q, const void *cache, const KvGeom &kg,
                      const AttnBatch *b, int nh, float scale, cudaStream_t stream) {
    constexpr int TK = D <= 128 ? 64 : 32;
    constexpr bool FP8 = is_kv8<TC>::value;
    const int G = nh / kg.nkv;
    int HB = 1; /* heads per tile: the largest power of two dividing G, at most 8 */
    while (HB * 2 <= 8 && G % (HB * 2) == 0)
        HB *= 2;
    const int rows = TC_M / HB;
    dim3 grid((unsigned)((b->num_tokens + rows - 1) / rows + b->num_seqs),
              (unsigned)(kg.nkv * (G / HB)));
    const size_t smem =
        (size_t)(TC_M + (FP8 ? 2 : 4) * TK) * (D + 8) * sizeof(T) + (FP8 ? (size_t)4 * TK * D : 0);
    auto kern = prefill_tc_kernel<T, TC, D>;
    kc_set_smem(kern, smem);
    kern<<<grid, TC_THREADS, smem, stream>>>(
        (T *)out, (const T *)q, (const TC *)cache, kg, b->positions, b->query_start, b->num_seqs,
        b->block_tables, nh, G, HB, scale * kg.ks * 1.4426950408889634f);
    CUDA_CHECK_LAUNCH();
}

void kc_prefill_tc(void *out, const void *q, DType act, DType kv, const void *kv_cache,
                   const KvGeom &kg, const AttnBatch *b, int nh, float scale, cudaStream_t stream) {
#define TC_CASE(d)                                                                                 \
    case d:                                                                                        \
        if (act == DT_BF16 && kv == DT_F8E4M3)                                                     \
            launch_tc<bf16, kv8, d>(out, q, kv_cache, kg, b, nh, scale, stream);                   \
        else if (act == DT_BF16)                                                                   \
            launch_tc<bf16, bf16, d>(out, q, kv_cache, kg, b, nh, scale, stream);                  \
        else if (kv == DT_F8E4M3)                                                                  \
            launch_tc<f16, kv8, d>(out, q, kv_cache, kg, b, nh, scale, stream);                    \
        else                                                                                       \
            launch_tc<f16, f16, d>(out, q, kv_cache, kg, b, nh, scale, stream);                    \
        break;
    switch (kg.D) {
        TC_CASE(16)
        TC_CASE(32)
        TC_CASE(48)
        TC_CASE(64)
        TC_CASE(80)
        TC_CASE(96)
        TC_CASE(112)
        TC_CASE(128)
        TC_CASE(144)
        TC_CASE(160)
        TC_CASE(176)
        TC_CASE(192)
        TC_CASE(208)
        TC_CASE(224)
        TC_CASE(240)
        TC_CASE(256)
        default:
            pl_fatal(__FILE__, __LINE__, "k_cuda_attention_prefill: head_dim %d on tensor cores",
                     kg.D);
    }
#undef TC_CASE
}
