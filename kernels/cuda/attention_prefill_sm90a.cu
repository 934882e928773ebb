/* attention_prefill_sm90a.cu - causal prefill attention on Hopper's warpgroup MMA (wgmma) for
 * head_dim 128: bf16 (or f16) queries, a cache of the same type or fp8, fp32 accumulation and
 * softmax. Where it applies (kc_prefill_wgmma_ok) it replaces attention_prefill_tc.cu's
 * mma.sync kernel, whose 16 x 8 MMAs fed by ldmatrix left the tensor pipe idle most of the time.
 *
 * The tiling is attention_prefill_tc.cu's (prefill_tc.cuh) with tiles twice as large: grid
 * (query tile, KV head x head group), tiles in reverse order, a tile 128 query vectors (128 / HB
 * rows of one sequence times the HB query heads of one KV head), K/V tiles of 64 positions
 * gathered from the cache's blocks by cp.async, two buffers: the next tile is in flight while
 * one is used (a third buffer measured 2 % slower on an H100: PERFORMANCE.md). Two warpgroups run a
 * block, each on 64 of the vectors (warp w owns vectors 16w .. 16w + 15), sharing every K/V tile:
 * half the tile loads per FLOP of 64-vector tiles, which would ask more of L2 than it gives. Each
 * warpgroup's Q and the K/V tiles sit in shared memory in the layout wgmma reads with 128-byte
 * swizzle: two panels of 64 dimensions, each 64 rows of 128 bytes, the 16-byte chunk c of row r
 * stored at chunk c ^ (r % 8). Per K/V tile and warpgroup:
 *   S = Q K^T: eight m64n64k16 wgmmas, both operands from shared memory (K-major);
 *   causal (and sliding-window) mask, online softmax in registers, exp2 with the scale folded in;
 *   O += P V: four m64n128k16 wgmmas, P from registers (the S accumulators rounded to the MMA
 *   type, whose fragment layout is wgmma's A layout), V from shared memory read N-major
 *   (transposed: the same tile layout, panels 8 KB apart, 8-row groups 1 KB apart).
 * An fp8 cache: tiles are staged as bytes (two buffers) and widened once into the f16 tiles
 * (one buffer), the K scale folded into the softmax scale and the V scale onto the output; the
 * MMAs then run in f16 (bf16 queries converted once per block), as in attention_prefill_tc.cu.
 * Writes by cp.async and by threads reach the MMAs (the async proxy) through
 * fence.proxy.async and a block barrier.
 *
 * Built only for sm_90a (configure.py, as gemm_sm90a.cu); elsewhere kc_prefill_wgmma_ok is
 * false. Results differ from attention_prefill_tc.cu's only in the order products are summed. */
#include "prefill_tc.cuh"
#include "sm90a.cuh"

#if PAGELLM_SM90A

namespace {

constexpr int WP_D = 128, WP_TK = 64; /* head_dim, positions per K/V tile */
constexpr int WP_WGS = 2;             /* warpgroups a block, 64 query vectors each */
constexpr int WP_STAGES = 2;          /* K/V tiles in flight or in use (16-bit cache) */
constexpr int PANEL = 64 * 128;       /* bytes: one 64-dimension panel of a 64-row tile */
constexpr int TILE = 2 * PANEL;       /* a 64 x 128 tile of 16-bit elements */
constexpr int STAGE8 = WP_TK * WP_D;  /* an fp8 tile's staged bytes */

/* Byte offset in a swizzled tile of 16-byte chunk c (0 .. 15: dimensions 8c .. 8c + 7) of row
 * r (0 .. 63). */
__device__ __forceinline__ uint32_t swz(int r, int c) {
    return (uint32_t)((c >> 3) * PANEL + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

/* The K-major descriptor's step to k16 slice kk (0 .. 7) of a tile: 32 bytes within a panel,
 * the next panel after four (units of 16 bytes). */
__device__ __forceinline__ uint64_t k_step(int kk) {
    return (uint64_t)((kk >> 2) * (PANEL >> 4) + (kk & 3) * 2);
}

/* N-major (transposed) descriptor of 16 rows of a tile from `rows`: the N panels LBO = PANEL
 * apart, 8-row groups SBO = 1024 bytes apart, 128-byte swizzle. */
__device__ __forceinline__ uint64_t desc_n_major(const void *rows) {
    return (uint64_t)((smem_addr(rows) & 0x3ffff) >> 4) | (uint64_t)(PANEL >> 4) << 16 |
           (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}

__device__ __forceinline__ void fence_proxy_async(void) {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

/* d[64 x 128] += p[64 x 16] v[16 x 128], p from registers (four pairs a thread), v N-major. */
#define WGMMA_PV(AB)                                                                               \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                      \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." #AB "." #AB " {" WG_REGS_64        \
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"                                  \
                 : WG_D64                                                                          \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(dv), "r"(1))
template <typename MT>
__device__ __forceinline__ void wgmma_pv(float (&d)[64], const uint32_t (&a)[4], uint64_t dv) {
    if constexpr (std::is_same<MT, bf16>::value)
        WGMMA_PV(bf16);
    else
        WGMMA_PV(f16);
}
#undef WGMMA_PV

template <typename T, typename TC, int WGS, int S>
__global__ __launch_bounds__(128 * WGS, 2 / WGS) void prefill_wgmma_kernel(
    T *__restrict__ out, const T *__restrict__ q, const TC *__restrict__ cache, KvGeom kg,
    const int32_t *positions, const int32_t *query_start, int num_seqs, const int32_t *block_tables,
    int nh, int G, int HB, float scale_log2) {
    constexpr bool FP8 = is_kv8<TC>::value;
    using MT = std::conditional_t<FP8, f16, T>; /* the MMAs' input type */
    constexpr int NB = FP8 ? 1 : S;             /* 16-bit K/V tile buffers */
    constexpr int D = WP_D, TK = WP_TK, NT = TK / 8, ND = D / 8, M = 64 * WGS;
    extern __shared__ uint8_t smem_wp[];
    uint8_t *Qs = ring_base(smem_wp); /* [WGS] tiles, 1024-byte aligned as the swizzle needs */
    uint8_t *Ks = Qs + WGS * TILE;    /* [NB] tiles */
    uint8_t *Vs = Ks + NB * TILE;     /* [NB] tiles */
    uint8_t *K8 = Vs + NB * TILE;     /* fp8: [S] staged tiles */
    uint8_t *V8 = K8 + S * STAGE8;

    TcTile tt;
    auto q_dst = [&](int v, int c) { return smem_addr(Qs + (v >> 6) * TILE + swz(v & 63, c)); };
    if (!tc_tile_begin<D, M>(tt, q, q_dst, kg, positions, query_start, num_seqs, block_tables, nh,
                             G, HB))
        return;
    auto load_tile = [&](int kt, int buf) {
        tc_load_kv<TC, TK, D, M>(tt, kg, cache, kt, buf, K8, V8, [&](int kv, int j, int c) {
            return smem_addr((kv ? Vs : Ks) + buf * TILE + swz(j, c));
        });
    };
    const int kt0 = tc_first_tiles<T, MT, TK, M, S>(tt, load_tile, (uint32_t *)Qs, WGS * TILE / 4);
    const uint64_t dq = smem_desc(Qs + (threadIdx.x >> 7) * TILE); /* this warpgroup's queries */

    float o[ND][4];
#pragma unroll
    for (int d = 0; d < ND; d++)
        o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    float(&o_acc)[ND * 4] = *reinterpret_cast<float(*)[ND * 4]>(&o[0][0]);
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    const int ntiles = tt.maxpos / TK + 1;
    for (int kt = kt0; kt < ntiles; kt++) {
        tc_next_tile<S>(kt, ntiles, load_tile);
        if constexpr (FP8) {
            __syncthreads(); /* every thread's staged bytes have landed */
            tc_widen_kv<TK, D, M>(K8 + (kt % S) * STAGE8, V8 + (kt % S) * STAGE8,
                                  [&](int kv, int j, int c) { return (kv ? Vs : Ks) + swz(j, c); });
        }
        fence_proxy_async(); /* this thread's writes, visible to the MMAs after the barrier */
        __syncthreads();
        const int cur = FP8 ? 0 : kt % S;
        const uint8_t *Kb = Ks + cur * TILE, *Vb = Vs + cur * TILE;

        float sc[NT][4]; /* S = Q K^T */
#pragma unroll
        for (int n = 0; n < NT; n++)
            sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
        float(&s_acc)[NT * 4] = *reinterpret_cast<float(*)[NT * 4]>(&sc[0][0]);
        const uint64_t dk = smem_desc(Kb);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)
            wgmma_n64<MT>(s_acc, dq + k_step(kk), dk + k_step(kk), 1);
        wgmma_commit();
        wgmma_wait<0>();
        acc_fence(s_acc);

        uint32_t pf[NT / 2][4]; /* P as the A fragments of 16-position k-steps */
        tc_softmax_tile<MT>(sc, pf, o, m, l, tt, kg, kt * TK, scale_log2);
        wgmma_fence();
#pragma unroll
        for (int kc = 0; kc < TK / 16; kc++)
            wgmma_pv<MT>(o_acc, pf[kc], desc_n_major(Vb + kc * 16 * 128));
        wgmma_commit();
        wgmma_wait<0>();
        acc_fence(o_acc);
        __syncthreads(); /* this buffer is refilled by the next iteration's load */
    }
    tc_store_out<T>(out, o, l, tt, kg.vs, nh, HB);
}

template <typename T, typename TC, int WGS, int S>
void launch(void *out, const void *q, const void *cache, const KvGeom &kg, const AttnBatch *b,
            int nh, float scale, cudaStream_t stream) {
    constexpr bool FP8 = is_kv8<TC>::value;
    int HB;
    const dim3 grid = tc_grid(b, kg, nh, 64 * WGS, &HB);
    const size_t smem =
        1024 + (size_t)(WGS + 2 * (FP8 ? 1 : S)) * TILE + (FP8 ? (size_t)2 * S * STAGE8 : 0);
    auto kern = prefill_wgmma_kernel<T, TC, WGS, S>;
    kc_set_smem(kern, smem);
    kern<<<grid, 128 * WGS, smem, stream>>>(
        (T *)out, (const T *)q, (const TC *)cache, kg, b->positions, b->query_start, b->num_seqs,
        b->block_tables, nh, nh / kg.nkv, HB, scale * kg.ks * 1.4426950408889634f);
    CUDA_CHECK_LAUNCH();
}

} // namespace

bool kc_prefill_wgmma_ok(DType act, const KvLayout *l) {
    return k_cuda_wgmma_available() && (act == DT_BF16 || act == DT_F16) &&
           (l->dtype == act || l->dtype == DT_F8E4M3) && l->head_dim == WP_D;
}

void kc_prefill_wgmma(void *out, const void *q, DType act, DType kv, const void *kv_cache,
                      const KvGeom &kg, const AttnBatch *b, int nh, float scale,
                      cudaStream_t stream) {
    if (act == DT_BF16 && kv == DT_F8E4M3)
        launch<bf16, kv8, WP_WGS, WP_STAGES>(out, q, kv_cache, kg, b, nh, scale, stream);
    else if (act == DT_BF16)
        launch<bf16, bf16, WP_WGS, WP_STAGES>(out, q, kv_cache, kg, b, nh, scale, stream);
    else if (kv == DT_F8E4M3)
        launch<f16, kv8, WP_WGS, WP_STAGES>(out, q, kv_cache, kg, b, nh, scale, stream);
    else
        launch<f16, f16, WP_WGS, WP_STAGES>(out, q, kv_cache, kg, b, nh, scale, stream);
}

#else /* not built for sm_90a */

bool kc_prefill_wgmma_ok(DType, const KvLayout *) {
    return false;
}

void kc_prefill_wgmma(void *, const void *, DType, DType, const void *, const KvGeom &,
                      const AttnBatch *, int, float, cudaStream_t) {
    pl_fatal(__FILE__, __LINE__, "attention_prefill_sm90a: this build has no sm_90a code");
}

#endif
