/* attention_decode_tc.cu - decode attention on tensor cores, flash-decoding per warp: bf16 or f16
 * queries and a cache of the same type or fp8 e4m3, head_dim 128 (k_cuda_attention_decode sends
 * everything else to the CUDA-core kernel and combines the partitions this kernel writes).
 *
 * Grid (KV head x head group, items), as the CUDA-core kernel: a block of 4 warps takes the HB
 * query heads of one KV head for each of its items (a row's partition) in turn, and warp w its
 * steps w, w + 4, ... of 16 positions. A step's K rows and then its V rows are two units of a
 * per-warp cp.async ring of 3 units in shared memory. Each copy instruction of a warp reads four
 * whole 128-byte lines (16 bytes a lane) and writes each to one aligned 128 bytes of shared memory,
 * swizzled within (chunk c of row p at c ^ (p % 8), so that the 8 rows an ldmatrix phase reads fall
 * in 8 bank groups; with rows padded instead, lines landing across 128-byte boundaries cost 1.5x
 * the L2 sectors and 2.6x the requests, ncu on the H200). A half-step of 8 rows lies in one cache
 * block (block sizes that are multiples of 8), so a step takes two block-table lookups. A
 * __syncwarp orders the lanes' copies before the warp reads them, so no block barrier guards the
 * ring.
 *
 * Per step, in registers: S^T = K Q^T by 8 mma m16n8k16 (K the 16-row operand straight from
 * ldmatrix, Q^T held as B fragments for the whole partition, heads past HB zero); an online
 * softmax with the scale folded into exp2, whose running max is raised only when a step's max
 * passes it by more than 2^8 (then the sums are rescaled; until then the weights stay below 2^8,
 * and the result is exact for any max kept, as the sum uses the same one); P rounded to the 16-bit
 * type and turned from accumulator into B layout by movmatrix.trans; O^T += V^T P^T by 8 more mma
 * with V^T from ldmatrix.trans. A lane's accumulators belong to the same two heads as its scores,
 * so the rescale needs no shuffles. At the end the 4 warps' (max, sum, O) are merged through
 * shared memory (the drained ring); a row whose context fits one partition is written normalised,
 * else the partition's un-normalised sums and (max, sum) go to the workspace.
 *
 * With an fp8 cache the mmas run in f16 whatever the activations: K and V pairs widen from e4m3
 * in one instruction (to bf16 it takes four), the bf16 queries are converted once (as_mma_pair)
 * and P is rounded to f16 (on an H100 the fp8 batch-256 decode step: 12.44 ms against 12.52).
 *
 * Measured on the H200 (bf16, batch 256 x 1024, 8 KV heads of 4 query heads, one layer), against
 * the kernel it replaced (8-position steps through the CUDA-core kernel's passes: scores to shared
 * memory, softmax, then P.V), same machine: 37.5 M warp instructions instead of 84.6 M (ncu),
 * 249.5 us instead of 251.8 us after 4 s of back-to-back launches (4.3 TB/s, the copy rate); the
 * same DRAM bytes and L2 sectors. */
#include <math.h>

#include "attention.cuh"

enum {
    DTC_D = 128,
    DTC_THREADS = 128,
    DTC_WARPS = DTC_THREADS / 32,
    DTC_STEP = 16, /* positions per step: one mma's 16 rows */
    DTC_UNITS = 3  /* ring units per warp (a step's K, or its V) */
};

/* A staged row of cache elements TC (256 bytes of 16-bit, 128 of fp8), a ring unit (a step's
 * 16 rows) and the block's rings. */
template <typename TC> struct DtcRing {
    static constexpr int ROW = DTC_D * (int)sizeof(TC);
    static constexpr int UNIT = DTC_STEP * ROW;
    static constexpr int BYTES = DTC_WARPS * DTC_UNITS * UNIT;
};

/* A step's max may pass the running max by this much (log2 units) before the sums are rescaled. */
#define DTC_RESCALE_SLACK 8.0f

/* 2^x by the special-function unit (flushes subnormal results to zero; 2^-inf = 0). */
__device__ __forceinline__ float ex2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* The transpose of an 8x8 16-bit matrix held in accumulator layout (lane 4 r + c: row r,
 * columns 2 c, 2 c + 1), in the same layout. */
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t m) {
    uint32_t t;
    asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(t) : "r"(m));
    return t;
}

/* One item (a row's partition) of the block: every thread of it. TC is T, or kv8 (fp8 cache). */
template <typename T, typename TC, int HB>
__device__ __forceinline__ void
decode_tc_item(const DecodeItems &it, T *__restrict__ out, const T *__restrict__ q,
               const TC *__restrict__ cache, const KvGeom &kg, const int32_t *query_start,
               int num_seqs, const int32_t *block_tables, int nh, int G, int part_len,
               float scale_log2, float *ws_acc, float *ws_ml, int max_parts) {
    constexpr bool FP8 = is_kv8<TC>::value;
    using MT = std::conditional_t<FP8, f16, T>; /* the mma's input type */
    constexpr int DTC_ROW_BYTES = DtcRing<TC>::ROW, DTC_UNIT_BYTES = DtcRing<TC>::UNIT;
    constexpr int CE = 16 / (int)sizeof(TC);          /* elements per 16-byte chunk */
    extern __shared__ __align__(1024) uint4 smem16[]; /* aligned: the swizzle XORs addresses */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int *tab = (int *)((char *)smem16 + DtcRing<TC>::BYTES); /* the partition's physical blocks */
    DecodeWork job;
    decode_work(job, kg, it, query_start, num_seqs, block_tables, G, HB, part_len, tab);
    const int row = job.row, h0 = job.h0, start = job.start, end = job.end, b0 = job.b0;

    /* mma fragments: lane = 4 g8 + t4. Q^T as B (16 dims x 8 heads): head g8, dims 2 t4, +1 and
     * 2 t4 + 8, +9 of each 16; zero for heads past HB. fp8: dims 4 t4, +1 and 4 t4 + 2, +3 (the
     * k order in which K's fp8 fragments arrive, below). */
    const int g8 = lane >> 2, t4 = lane & 3;
    uint32_t qb[DTC_D / 16][2];
#pragma unroll
    for (int c = 0; c < DTC_D / 16; c++) {
        qb[c][0] = qb[c][1] = 0u;
        if (g8 < HB) {
            const T *qh = q + ((size_t)row * nh + h0 + g8) * DTC_D + 16 * c + (FP8 ? 4 : 2) * t4;
            qb[c][0] = as_mma_pair<T, MT>(*(const uint32_t *)qh);
            qb[c][1] = as_mma_pair<T, MT>(*(const uint32_t *)(qh + (FP8 ? 2 : 8)));
        }
    }
    __syncthreads(); /* tab */

    /* copies: lane = 8 q + c copies 16-byte chunks c and c + 8 (fp8: c, rows of 128 bytes) of the
     * step's rows q, q + 4, q + 8 and q + 12, so that each copy instruction reads four whole
     * 128-byte lines */
    const int cp_q = lane >> 3, cp_c = lane & 7;
    const uint32_t ring = smem_addr(smem16) + warp * DTC_UNITS * DTC_UNIT_BYTES;
    /* chunk c of staged row p at byte 16 (c ^ (p % 8)) of the row: each line a lane group copies
     * lands in one aligned 128 bytes, and the 8 rows an ldmatrix phase reads fall in 8 bank
     * groups. Rows 4 r4 + q (mod 8) of this lane: */
    const uint32_t cp_dst[2] = {ring + cp_q * DTC_ROW_BYTES + 16 * (cp_c ^ cp_q),
                                ring + cp_q * DTC_ROW_BYTES + 16 * (cp_c ^ (cp_q + 4))};
    const TC *base = cache + kg.layer_off + (size_t)job.g * DTC_D + CE * cp_c;
    const unsigned block32 = (unsigned)kg.block_elems, row32 = (unsigned)kg.row;
    /* ldmatrix: lane feeds row lane % 8 of matrix i = lane / 8. K as A (positions x dims): matrix
     * i is positions 8 (i & 1) on, chunks 2 k + (i >> 1); V^T as A (dims x positions) by .trans:
     * matrix i is positions 8 (i >> 1) on, chunks 2 k + (i & 1). Chunk 2 k + b of row p is at
     * (its address for k = 0) ^ 32 k, units being 4096-byte aligned. fp8 (rows of 128 bytes):
     * k_ld serves both, matrix i being positions 8 (i & 1) on, chunk 2 k + (i >> 1), read plain
     * for K and transposed for V (fragments below). */
    const int lr = lane & 7, li = lane >> 3;
    const uint32_t k_ld = ring + (lr + 8 * (li & 1)) * DTC_ROW_BYTES + 16 * ((li >> 1) ^ lr);
    const uint32_t v_ld = ring + (lr + 8 * (li >> 1)) * DTC_ROW_BYTES + 16 * ((li & 1) ^ lr);

    /* this warp's steps: global steps warp, warp + DTC_WARPS, ... of the partition */
    const int nsteps = (end - start + DTC_STEP - 1) / DTC_STEP;
    const int mine = nsteps > warp ? (nsteps - warp + DTC_WARPS - 1) / DTC_WARPS : 0;
    auto step_start = [&](int i) { return start + (warp + i * DTC_WARPS) * DTC_STEP; };
    /* The step being loaded: the lane's rows q and 8 + q of its K (each half-step of 8 rows lies in
     * one cache block: steps start at multiples of 8 and so do blocks), and its
     * rows before the end, less q. */
    const TC *src_lo = cache, *src_hi = cache;
    int left = 0;
    auto copy_unit = [&](uint32_t unit, size_t off) {
        const TC *half[2] = {src_lo + off, src_hi + off};
#pragma unroll
        for (int hs = 0; hs < 2; hs++)
#pragma unroll
            for (int r4 = 0; r4 < 2; r4++) {
                const int r = 8 * hs + 4 * r4; /* row r + q */
                const TC *src = half[hs] + (r4 ? (size_t)4 * row32 : 0);
#pragma unroll
                for (int c8 = 0; c8 < DTC_ROW_BYTES / 128; c8++)
                    cp_async16(cp_dst[r4] + unit + r * DTC_ROW_BYTES + 128 * c8, src + 8 * CE * c8,
                               r < left);
            }
    };
    auto load_k = [&](int i, uint32_t unit) {
        if (i < mine) {
            const int p0 = step_start(i);
            left = end - p0 - cp_q;
            auto row_of = [&](int p) { /* past the end: p0's block, whose rows are zero-filled */
                                       const int pc = p < end ? p : p0, bi = kv_block_of(kg, pc);
                                       return base + ((size_t)(unsigned)tab[bi - b0] * block32 +
                                                      (unsigned)(pc - bi * kg.bs + cp_q) * row32);
            };
            src_lo = row_of(p0);
            src_hi = row_of(p0 + 8);
            copy_unit(unit, 0);
        }
        cp_async_commit(); /* empty past the end: keeps the group count uniform */
    };
    auto load_v = [&](int i, uint32_t unit) {
        if (i < mine)
            copy_unit(unit, kg.half);
        cp_async_commit();
    };

    /* ring units (byte offsets): step i's K in uk, its V in uv, the free one in uf */
    uint32_t uk = 0, uv = DTC_UNIT_BYTES, uf = 2 * DTC_UNIT_BYTES;
    load_k(0, uk);
    load_v(0, uv);
    /* running max (log2 units, per head 2 t4 + e), the lane's share of the sums, O^T fragments:
     * o[m]: dims 16 m + g8 ([0], [1]) and 16 m + g8 + 8 ([2], [3]) of heads 2 t4, 2 t4 + 1 */
    float mx[2] = {-INFINITY, -INFINITY}, sum[2] = {0.0f, 0.0f};
    float o[DTC_D / 16][4] = {};
    for (int i = 0; i < mine; i++) {
        __syncwarp(); /* every lane has read unit uf (step i - 1's V) */
        load_k(i + 1, uf);
        cp_async_wait<2>();
        __syncwarp();       /* the other lanes' copies of step i's K are visible */
        float c[2][4] = {}; /* S^T: positions g8, g8 + 8 x heads 2 t4, 2 t4 + 1; two chains */
        if constexpr (FP8) {
            /* matrix i of ldmatrix j: lane 4 g8 + t4 gets position g8 (+ 8 for i odd), bytes
             * 4 t4 .. 4 t4 + 3 of chunk 2 j + (i >> 1): widened, dims 4 t4, +1 are A's columns
             * 2 t4, +1 and dims 4 t4 + 2, +3 its columns 2 t4 + 8, +9 (as qb) */
#pragma unroll
            for (int j = 0; j < DTC_D / 32; j++) {
                uint32_t m[4];
                ldsm_x4(m, (k_ld + uk) ^ (32 * j));
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const uint32_t a[4] = {e4m3x2_to_f16x2(m[2 * h]), e4m3x2_to_f16x2(m[2 * h + 1]),
                                           e4m3x2_to_f16x2(m[2 * h] >> 16),
                                           e4m3x2_to_f16x2(m[2 * h + 1] >> 16)};
                    mma16<MT>(c[h], a, qb[2 * j + h][0], qb[2 * j + h][1]);
                }
            }
        } else {
#pragma unroll
            for (int k = 0; k < DTC_D / 16; k++) {
                uint32_t a[4];
                ldsm_x4(a, (k_ld + uk) ^ (32 * k));
                mma16<T>(c[k & 1], a, qb[k][0], qb[k][1]);
            }
        }
        float s[4];
#pragma unroll
        for (int e = 0; e < 4; e++)
            s[e] = c[0][e] + c[1][e];
        const int p0 = step_start(i);
        if (p0 + DTC_STEP > end) { /* the partition's last step: positions past the end weigh 0 */
            if (p0 + g8 >= end)
                s[0] = s[1] = -INFINITY;
            if (p0 + g8 + 8 >= end)
                s[2] = s[3] = -INFINITY;
        }
        if (p0 < job.lo) { /* the window's first step (it holds lo): positions before lo weigh 0 */
            if (p0 + g8 < job.lo)
                s[0] = s[1] = -INFINITY;
            if (p0 + g8 + 8 < job.lo)
                s[2] = s[3] = -INFINITY;
        }
        float smax[2];
#pragma unroll
        for (int e = 0; e < 2; e++) {
            float v = fmaxf(s[e], s[2 + e]);
            v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
            v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
            v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 16));
            smax[e] = v * scale_log2;
        }
        if (__any_sync(0xffffffffu, smax[0] > mx[0] + DTC_RESCALE_SLACK ||
                                        smax[1] > mx[1] + DTC_RESCALE_SLACK)) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float m = fmaxf(mx[e], smax[e]), f = ex2_ftz(mx[e] - m);
                mx[e] = m;
                sum[e] *= f;
#pragma unroll
                for (int d = 0; d < DTC_D / 16; d++) {
                    o[d][e] *= f;
                    o[d][2 + e] *= f;
                }
            }
        }
        float p[4];
#pragma unroll
        for (int e = 0; e < 4; e++)
            p[e] = ex2_ftz(fmaf(s[e], scale_log2, -mx[e & 1]));
        sum[0] += p[0] + p[2];
        sum[1] += p[1] + p[3];
        /* P^T as B (16 positions x 8 heads): the transposes of positions 0-7 and 8-15 */
        const uint32_t pb0 = movmatrix_trans(pack16<MT>(p[0], p[1]));
        const uint32_t pb1 = movmatrix_trans(pack16<MT>(p[2], p[3]));

        __syncwarp(); /* every lane has read step i's K (unit uk) */
        load_v(i + 1, uk);
        cp_async_wait<2>();
        __syncwarp();
        if constexpr (FP8) {
            /* transposed, matrix i gives lane 4 g8 + t4 bytes 2 g8, 2 g8 + 1 of positions 2 t4 and
             * 2 t4 + 1: its pairs of dim 2 g8 and of dim 2 g8 + 1 are A's rows g8 and g8 + 8, so
             * o[d] holds dims 16 d + 2 g8 ([0], [1]) and 16 d + 2 g8 + 1 ([2], [3]) */
#pragma unroll
            for (int j = 0; j < DTC_D / 32; j++) {
                uint32_t m[4];
                ldsm_x4_trans(m, (k_ld + uv) ^ (32 * j));
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const uint32_t x0 = __byte_perm(m[2 * h], 0, 0x3120),
                                   x1 = __byte_perm(m[2 * h + 1], 0, 0x3120);
                    const uint32_t a[4] = {e4m3x2_to_f16x2(x0), e4m3x2_to_f16x2(x0 >> 16),
                                           e4m3x2_to_f16x2(x1), e4m3x2_to_f16x2(x1 >> 16)};
                    mma16<MT>(o[2 * j + h], a, pb0, pb1);
                }
            }
        } else {
#pragma unroll
            for (int d = 0; d < DTC_D / 16; d++) {
                uint32_t a[4];
                ldsm_x4_trans(a, (v_ld + uv) ^ (32 * d));
                mma16<T>(o[d], a, pb0, pb1);
            }
        }
        /* step i + 1's K is in uf, its V in uk; step i's V unit is free next */
        const uint32_t t = uk;
        uk = uf;
        uf = uv;
        uv = t;
    }
    cp_async_wait<0>();
#pragma unroll
    for (int e = 0; e < 2; e++) {
        sum[e] += __shfl_xor_sync(0xffffffffu, sum[e], 4);
        sum[e] += __shfl_xor_sync(0xffffffffu, sum[e], 8);
        sum[e] += __shfl_xor_sync(0xffffffffu, sum[e], 16);
    }
    __syncthreads(); /* every warp is done with the rings: they hold the merge from here */
    float *o_s = (float *)smem16;               /* [DTC_WARPS][HB][DTC_D] */
    float *ml_s = o_s + DTC_WARPS * HB * DTC_D; /* [DTC_WARPS][HB][2]: max, sum */
#pragma unroll
    for (int e = 0; e < 2; e++) {
        const int h = 2 * t4 + e;
        if (h < HB) {
            float *dst = o_s + (warp * HB + h) * DTC_D + (FP8 ? 2 * g8 : g8);
#pragma unroll
            for (int d = 0; d < DTC_D / 16; d++) {
                dst[16 * d] = o[d][e];
                dst[16 * d + (FP8 ? 1 : 8)] = o[d][2 + e];
            }
            if (g8 == 0) {
                ml_s[2 * (warp * HB + h)] = mx[e];
                ml_s[2 * (warp * HB + h) + 1] = sum[e];
            }
        }
    }
    __syncthreads();
    for (int x = tid; x < HB * DTC_D; x += DTC_THREADS) {
        const int h = x / DTC_D, d = x - h * DTC_D;
        float m = -INFINITY;
#pragma unroll
        for (int w = 0; w < DTC_WARPS; w++)
            m = fmaxf(m, ml_s[2 * (w * HB + h)]);
        float den = 0.0f, v = 0.0f;
#pragma unroll
        for (int w = 0; w < DTC_WARPS; w++) { /* a warp without steps: max -inf, weight 0 */
            const float f = ex2_ftz(ml_s[2 * (w * HB + h)] - m);
            den = fmaf(f, ml_s[2 * (w * HB + h) + 1], den);
            v = fmaf(f, o_s[(w * HB + h) * DTC_D + d], v);
        }
        v *= kg.vs; /* an fp8 cache's V scale (1 otherwise) */
        if (job.nparts == 1) {
            out[((size_t)row * nh + h0 + h) * DTC_D + d] = from_f32<T>(v / den);
        } else {
            const size_t slot = (job.tok * nh + h0 + h) * max_parts + job.part;
            ws_acc[slot * DTC_D + d] = v;
            if (d == 0) { /* the combine's max is in units of the scaled scores */
                ws_ml[2 * slot] = m * (float)M_LN2;
                ws_ml[2 * slot + 1] = den;
            }
        }
    }
}

template <typename T, typename TC, int HB>
__global__ __launch_bounds__(DTC_THREADS, 4) void decode_tc_kernel(
    T *__restrict__ out, const T *__restrict__ q, const TC *__restrict__ cache, KvGeom kg,
    const int32_t *positions, const int32_t *query_start, int num_seqs, const int32_t *block_tables,
    int nh, int G, int part_len, float scale_log2, float *ws_acc, float *ws_ml, int max_parts) {
    kc_pdl_wait();
    kc_pdl_trigger();
    decode_items_run<DTC_WARPS>(
        kg, positions, query_start, num_seqs, part_len, max_parts, [&](const DecodeItems &it) {
            decode_tc_item<T, TC, HB>(it, out, q, cache, kg, query_start, num_seqs, block_tables,
                                      nh, G, part_len, scale_log2, ws_acc, ws_ml, max_parts);
        });
}

bool kc_decode_tc_ok(DType act, const KvLayout *l, const KvGeom &kg) {
    return (act == DT_BF16 || act == DT_F16) && (l->dtype == act || l->dtype == DT_F8E4M3) &&
           kg.D == DTC_D && kg.bs % 8 == 0 && kg.block_elems <= UINT32_MAX;
}

template <typename T, typename TC, int HB> static void launch_tc(const DecodeLaunch &a) {
    auto kern = decode_tc_kernel<T, TC, HB>;
    const size_t smem = DtcRing<TC>::BYTES + ((size_t)a.part_len / a.kg.bs + 2) * sizeof(int);
    kc_set_smem(kern, smem);
    /* an fp8 cache's K scale on the scores: with the softmax scale, in log2 units */
    kc_launch_pdl(kern, a.grid, dim3(DTC_THREADS), smem, a.stream, (T *)a.out, (const T *)a.q,
                  (const TC *)a.cache, a.kg, a.b->positions, a.b->query_start, a.b->num_seqs,
                  a.b->block_tables, a.nh, a.G, a.part_len, a.scale * a.kg.ks * (float)M_LOG2E,
                  a.ws_acc, a.ws_ml, a.max_parts);
}

template <typename T, typename TC> static void launch_tc_hb(const DecodeLaunch &a, int HB) {
    if (HB == 8)
        launch_tc<T, TC, 8>(a);
    else if (HB == 4)
        launch_tc<T, TC, 4>(a);
    else if (HB == 2)
        launch_tc<T, TC, 2>(a);
    else
        launch_tc<T, TC, 1>(a);
}

void kc_decode_tc(const DecodeLaunch &a, DType act, int HB) {
    const char *what = "k_cuda_attention_decode";
    KC_DISPATCH_ACT(act, what, T, {
        if constexpr (!std::is_same<T, float>::value) {
            if (a.kv_dtype == DT_F8E4M3)
                launch_tc_hb<T, kv8>(a, HB);
            else
                launch_tc_hb<T, T>(a, HB);
        }
    });
}
