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

#include "prefill_tc.cuh"

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
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    TcTile tt;
    auto q_dst = [&](int v, int c) { return smem_addr(Qs + v * DS + c * 8); };
    if (!tc_tile_begin<D, TC_M>(tt, q, q_dst, kg, positions, query_start, num_seqs, block_tables,
                                nh, G, HB))
        return;
    auto load_tile = [&](int kt, int buf) {
        tc_load_kv<TC, TK, D, TC_M>(tt, kg, cache, kt, buf, K8, V8, [&](int kv, int j, int c) {
            return smem_addr((kv ? Vs : Ks) + (buf * TK + j) * DS + c * 8);
        });
    };
    const int kt0 =
        tc_first_tiles<T, MT, TK, TC_M, 2>(tt, load_tile, (uint32_t *)Qs, TC_M * DS / 2);

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
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    /* ldmatrix source rows: K non-transposed (2 position n-tiles x 2 halves of 16 dims), V
     * transposed (2 halves of 16 positions x 2 dim n-tiles) */
    const int krow = (lane & 7) + ((lane >> 4) << 3), kcol = ((lane >> 3) & 1) * 8;
    const int vrow = (lane & 7) + ((lane >> 3) & 1) * 8, vcol = (lane >> 4) * 8;

    const int ntiles = tt.maxpos / TK + 1;
    for (int kt = kt0; kt < ntiles; kt++) {
        tc_next_tile<2>(kt, ntiles, load_tile);
        __syncthreads();
        if constexpr (FP8) {
            tc_widen_kv<TK, D, TC_M>(
                K8 + (kt & 1) * TK * D, V8 + (kt & 1) * TK * D,
                [&](int kv, int j, int c) { return (kv ? Vs : Ks) + j * DS + c * 8; });
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

        uint32_t pf[NT / 2][4]; /* P as the A fragments of 16-position k-steps */
        tc_softmax_tile<MT>(sc, pf, o, m, l, tt, kg, kt * TK, scale_log2);
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
    tc_store_out<T>(out, o, l, tt, kg.vs, nh, HB);
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
    int HB;
    const dim3 grid = tc_grid(b, kg, nh, TC_M, &HB);
    const size_t smem =
        (size_t)(TC_M + (FP8 ? 2 : 4) * TK) * (D + 8) * sizeof(T) + (FP8 ? (size_t)4 * TK * D : 0);
    auto kern = prefill_tc_kernel<T, TC, D>;
    kc_set_smem(kern, smem);
    kern<<<grid, TC_THREADS, smem, stream>>>(
        (T *)out, (const T *)q, (const TC *)cache, kg, b->positions, b->query_start, b->num_seqs,
        b->block_tables, nh, nh / kg.nkv, HB, scale * kg.ks * 1.4426950408889634f);
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
