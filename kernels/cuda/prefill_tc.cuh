/* prefill_tc.cuh - (internal to kernels/cuda/) what the two tensor-core prefill kernels share
 * (attention_prefill_tc.cu on mma.sync, attention_prefill_sm90a.cu on Hopper's wgmma), and
 * their entry points, which attention_prefill.cu calls where they apply.
 *
 * A block of M / 16 warps owns a tile of M query vectors: M / HB rows of one sequence times the
 * HB query heads of one KV head, vector v being row v / HB, head v % HB. Lane l of warp w holds
 * vectors 16w + l / 4 and 16w + l / 4 + 8, its scores and outputs as m16n8 MMA accumulator
 * fragments: element [n][c] is vector 16w + l / 4 + 8 (c >> 1), column 8n + 2 (l % 4) + (c & 1)
 * (so do a warpgroup's m64nN accumulators for its 64 vectors, element 4n + c). */
#ifndef PAGELLM_KERNELS_CUDA_PREFILL_TC_CUH
#define PAGELLM_KERNELS_CUDA_PREFILL_TC_CUH

#include "attention.cuh"

enum { TC_M = 64, TC_THREADS = 2 * TC_M }; /* the mma.sync kernel's tile */

/* The tensor-core prefill on mma.sync: bf16 or f16 queries and a cache of the same type or fp8,
 * head_dim a multiple of 16 up to 256. */
bool kc_prefill_tc_ok(DType act, const KvLayout *l);
void kc_prefill_tc(void *out, const void *q, DType act, DType kv, const void *kv_cache,
                   const KvGeom &kg, const AttnBatch *b, int nh, float scale, cudaStream_t stream);

/* The same on Hopper's wgmma: head_dim 128, on a GPU and build with the sm_90a kernels; where
 * kc_prefill_wgmma_ok says so it takes the launches kc_prefill_tc would. */
bool kc_prefill_wgmma_ok(DType act, const KvLayout *l);
void kc_prefill_wgmma(void *out, const void *q, DType act, DType kv, const void *kv_cache,
                      const KvGeom &kg, const AttnBatch *b, int nh, float scale,
                      cudaStream_t stream);

/* A block's tile and what this lane needs of it. */
typedef struct {
    int s, t0, t_end;   /* its sequence; the tile's rows are t0 .. t0 + 64 / HB - 1, below t_end */
    int g, h0;          /* its KV head and first query head */
    int minpos, maxpos; /* the smallest and largest position of its rows */
    int lo;             /* the first position any of its rows sees */
    int ta, tb;         /* this lane's two vectors' rows */
    int pos0, pos1;     /* and positions (-1 past the sequence) */
    const int32_t *table; /* the sequence's block table */
} TcTile;

/* Every thread's start of a block: finds its tile (false: the block has none), issues the
 * cp.async copies of its queries (16-byte chunk c of vector v to shared address q_dst(v, c),
 * zero-filled past the sequence; one committed group) and reads its rows' positions. */
template <int D, int M, typename T, typename QDst>
__device__ __forceinline__ bool tc_tile_begin(TcTile &tt, const T *q, QDst q_dst, const KvGeom &kg,
                                              const int32_t *positions, const int32_t *query_start,
                                              int num_seqs, const int32_t *block_tables, int nh,
                                              int G, int HB) {
    __shared__ int s_seq, s_t0, s_minpos, s_maxpos;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int rows = M / HB;
    /* Blocks start in the order of their linear index (x fastest): that order takes the tiles
     * last to first, each with every head group before the next tile, so the longest causal
     * tiles start first over all heads (x-major over (tile, head) left the last head's long
     * tiles to the end: SMs idle ~18 % of a 2048-token prompt's launch). */
    const int lin = (int)(blockIdx.x + gridDim.x * blockIdx.y), ny = (int)gridDim.y;
    const int tile = (int)gridDim.x - 1 - lin / ny, hy = lin % ny;
    if (warp == 0) {
        int s, t0;
        find_tile(query_start, num_seqs, rows, tile, &s, &t0);
        if (lane == 0) {
            s_seq = s;
            s_t0 = t0;
        }
    }
    __syncthreads();
    tt.s = s_seq;
    tt.t0 = s_t0;
    if (tt.s < 0)
        return false;
    tt.t_end = query_start[tt.s + 1];
    const int groups = G / HB;
    tt.g = hy / groups;
    tt.h0 = tt.g * G + (hy - tt.g * groups) * HB;

    for (int e = tid; e < M * (D / 8); e += 2 * M) {
        const int v = e / (D / 8), c = e - v * (D / 8), r = v / HB, t = tt.t0 + r;
        const bool ok = t < tt.t_end;
        const T *src = ok ? q + ((size_t)t * nh + tt.h0 + v - r * HB) * D + c * 8 : q;
        cp_async16(q_dst(v, c), src, ok);
    }
    cp_async_commit();
    if (warp == 0) {
        int mn = 0x7fffffff, mx = -1;
        for (int r = lane; r < rows && tt.t0 + r < tt.t_end; r += 32) {
            int p = positions[tt.t0 + r];
            mn = min(mn, p);
            mx = max(mx, p);
        }
        warp_min_max(mn, mx);
        if (lane == 0) {
            s_minpos = mn;
            s_maxpos = mx;
        }
    }
    const int v0 = warp * 16 + (lane >> 2), v1 = v0 + 8;
    tt.ta = tt.t0 + v0 / HB;
    tt.tb = tt.t0 + v1 / HB;
    tt.pos0 = tt.ta < tt.t_end ? positions[tt.ta] : -1;
    tt.pos1 = tt.tb < tt.t_end ? positions[tt.tb] : -1;
    __syncthreads();
    tt.minpos = s_minpos;
    tt.maxpos = s_maxpos;
    tt.lo = kv_window_lo(kg, tt.minpos);
    tt.table = block_tables + (size_t)tt.s * kg.max_blocks;
    return true;
}

/* After tc_tile_begin: the block's first S - 1 K/V tiles (from kt0 = lo / TK, tile kt in buffer
 * kt % S) in flight by load_tile(kt, buffer), one cp.async group each, its queries landed and,
 * for f16 MMAs on bf16 queries, converted in place (the nwords 32-bit words at q_words).
 * Returns kt0. */
template <typename T, typename MT, int TK, int M, int S, typename LoadTile>
__device__ __forceinline__ int tc_first_tiles(const TcTile &tt, LoadTile load_tile,
                                              uint32_t *q_words, int nwords) {
    const int kt0 = tt.lo / TK, ntiles = tt.maxpos / TK + 1;
#pragma unroll
    for (int i = 0; i < S - 1; i++) {
        if (kt0 + i < ntiles)
            load_tile(kt0 + i, (kt0 + i) % S);
        cp_async_commit();
    }
    cp_async_wait<S - 1>(); /* Q has landed */
    __syncthreads();
    if constexpr (!std::is_same<T, MT>::value) {
        for (int e = threadIdx.x; e < nwords; e += 2 * M)
            q_words[e] = as_mma_pair<T, MT>(q_words[e]);
        __syncthreads();
    }
    return kt0;
}

/* In the loop over K/V tiles: tile kt + S - 1 (if any) in flight, tile kt landed for this thread
 * (the caller's barrier makes it the block's). */
template <int S, typename LoadTile>
__device__ __forceinline__ void tc_next_tile(int kt, int ntiles, LoadTile load_tile) {
    if (kt + S - 1 < ntiles)
        load_tile(kt + S - 1, (kt + S - 1) % S);
    cp_async_commit();
    cp_async_wait<S - 1>();
}

/* The cache address of 16-byte chunk c of position p's K row (V is kg.half further) for the
 * tile loads, kbase the layer's K of the tile's KV head; NULL where p is outside [lo, maxpos]
 * (the copy then zero-fills: P = 0 must not meet garbage in V, and blocks before lo may be
 * gone). */
template <typename TC>
__device__ __forceinline__ const TC *tc_kv_src(const TcTile &tt, const KvGeom &kg, const TC *kbase,
                                               int p, int c) {
    if (p < tt.lo || p > tt.maxpos)
        return NULL;
    constexpr int CE = 16 / (int)sizeof(TC); /* cache elements per chunk */
    const int bi = kv_block_of(kg, p);
    return kbase + (size_t)tt.table[bi] * kg.block_elems + (size_t)(p - bi * kg.bs) * kg.row +
           c * CE;
}

/* K and V of the tile of TK positions kt into buffer buf in shared memory, zeros outside the
 * positions any row sees: an fp8 cache's bytes staged as rows of D at k8 and v8 (buffer buf
 * starting buf TK rows in), a 16-bit cache's chunk c of row j at dst16(kv, j, c) (kv 0: K,
 * 1: V). */
template <typename TC, int TK, int D, int M, typename Dst16>
__device__ __forceinline__ void tc_load_kv(const TcTile &tt, const KvGeom &kg, const TC *cache,
                                           int kt, int buf, uint8_t *k8, uint8_t *v8, Dst16 dst16) {
    constexpr int CE = 16 / (int)sizeof(TC),
                  CHC = D / CE; /* cache elements a chunk, chunks a row */
    const TC *kbase = cache + kg.layer_off + (size_t)tt.g * D;
    for (int e = threadIdx.x; e < TK * CHC; e += 2 * M) {
        const int j = e / CHC, c = e - j * CHC;
        const TC *src = tc_kv_src(tt, kg, kbase, kt * TK + j, c);
        uint32_t kd, vd;
        if constexpr (is_kv8<TC>::value) {
            kd = smem_addr(k8 + (buf * TK + j) * D + c * 16);
            vd = smem_addr(v8 + (buf * TK + j) * D + c * 16);
        } else {
            kd = dst16(0, j, c);
            vd = dst16(1, j, c);
        }
        cp_async16(kd, src ? src : cache, src != NULL);
        cp_async16(vd, src ? src + kg.half : cache, src != NULL);
    }
}

/* fp8: a staged tile of TK rows of D bytes each for K (k8) and V (v8) widened to f16, 16
 * elements a thread and pass: 8-element chunk c2 of row j to dst(kv, j, c2). */
template <int TK, int D, int M, typename Dst>
__device__ __forceinline__ void tc_widen_kv(const uint8_t *k8, const uint8_t *v8, Dst dst) {
    for (int e = threadIdx.x; e < 2 * TK * (D / 16); e += 2 * M) {
        const int kv = e >= TK * (D / 16), r = e - kv * TK * (D / 16);
        const int j = r / (D / 16), c = r - j * (D / 16);
        const uint4 u = *(const uint4 *)((kv ? v8 : k8) + j * D + c * 16);
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
        uint32_t o[8];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            o[2 * i] = e4m3x2_to_f16x2(w[i]);
            o[2 * i + 1] = e4m3x2_to_f16x2(w[i] >> 16);
        }
        *(uint4 *)dst(kv, j, 2 * c) = make_uint4(o[0], o[1], o[2], o[3]);
        *(uint4 *)dst(kv, j, 2 * c + 1) = make_uint4(o[4], o[5], o[6], o[7]);
    }
}

/* Online softmax of a lane's two vectors over the scores sc of a K/V tile of 8 NT positions
 * from k0: masks positions a row does not see (only where the tile reaches past a row's
 * position or before its window), updates the running max m and sum l, writes P rounded to MT
 * as the A fragments of NT / 2 k-steps of 16 positions, and scales the outputs o by the change
 * of max. Scores are raw: scale_log2 is the softmax scale times log2(e). */
template <typename MT, int NT, int ND>
__device__ __forceinline__ void
tc_softmax_tile(float (&sc)[NT][4], uint32_t (&pf)[NT / 2][4], float (&o)[ND][4], float (&m)[2],
                float (&l)[2], const TcTile &tt, const KvGeom &kg, int k0, float scale_log2) {
    const int tq = threadIdx.x & 3;
    const int w = kg.window; /* masks past a row's position, or before its window */
    if (k0 + 8 * NT - 1 > tt.minpos || (w > 0 && k0 <= tt.maxpos - w)) {
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int p = k0 + n * 8 + tq * 2 + (c & 1);
                if (!kv_sees(kg, c < 2 ? tt.pos0 : tt.pos1, p))
                    sc[n][c] = -INFINITY;
            }
    }
    /* each row is spread over the 4 lanes of a quad */
    float mx0 = m[0], mx1 = m[1];
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
    const float al0 = exp2f(m[0] * scale_log2 - ms0), al1 = exp2f(m[1] * scale_log2 - ms1);
    m[0] = mx0;
    m[1] = mx1;
    float rs0 = 0.0f, rs1 = 0.0f;
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
    l[0] = l[0] * al0 + rs0;
    l[1] = l[1] * al1 + rs1;
#pragma unroll
    for (int d = 0; d < ND; d++) {
        o[d][0] *= al0;
        o[d][1] *= al0;
        o[d][2] *= al1;
        o[d][3] *= al1;
    }
}

/* The lane's two output vectors O / l (times vs, an fp8 cache's V scale; 1 otherwise) to out. */
template <typename T, int ND>
__device__ __forceinline__ void tc_store_out(T *out, const float (&o)[ND][4], float (&l)[2],
                                             const TcTile &tt, float vs, int nh, int HB) {
    const int lane = threadIdx.x & 31, tq = lane & 3;
    const int v0 = (threadIdx.x >> 5) * 16 + (lane >> 2), v1 = v0 + 8;
#pragma unroll
    for (int o2 = 1; o2 <= 2; o2 <<= 1) {
        l[0] += __shfl_xor_sync(0xffffffffu, l[0], o2);
        l[1] += __shfl_xor_sync(0xffffffffu, l[1], o2);
    }
    if (tt.ta < tt.t_end) {
        const float inv = vs / l[0];
        T *dst = out + ((size_t)tt.ta * nh + tt.h0 + v0 % HB) * (ND * 8) + tq * 2;
#pragma unroll
        for (int d = 0; d < ND; d++)
            *(uint32_t *)(dst + d * 8) = pack16<T>(o[d][0] * inv, o[d][1] * inv);
    }
    if (tt.tb < tt.t_end) {
        const float inv = vs / l[1];
        T *dst = out + ((size_t)tt.tb * nh + tt.h0 + v1 % HB) * (ND * 8) + tq * 2;
#pragma unroll
        for (int d = 0; d < ND; d++)
            *(uint32_t *)(dst + d * 8) = pack16<T>(o[d][2] * inv, o[d][3] * inv);
    }
}

/* The grid of a launch of M-vector tiles: a block per tile of M / HB rows (HB: heads per tile,
 * the largest power of two dividing G, at most 8), plus one per sequence for tiles split at its
 * ends. */
static inline dim3 tc_grid(const AttnBatch *b, const KvGeom &kg, int nh, int M, int *HB) {
    const int G = nh / kg.nkv;
    *HB = 1;
    while (*HB * 2 <= 8 && G % (*HB * 2) == 0)
        *HB *= 2;
    const int rows = M / *HB;
    return dim3((unsigned)((b->num_tokens + rows - 1) / rows + b->num_seqs),
                (unsigned)(kg.nkv * (G / *HB)));
}

#endif
