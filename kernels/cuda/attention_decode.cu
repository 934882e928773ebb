/* attention_decode.cu - paged attention for decode: one query row per sequence (any number of
 * rows handled correctly), memory-bound, any cache / activation dtype pair (an fp8 cache's K
 * scale folded into the queries' scale, its V scale applied to the output). 16-bit queries on a
 * cache of the same type or fp8 at head_dim 128 go to the tensor-core kernel
 * (attention_decode_tc.cu); this file holds the CUDA-core kernel for every other case, the launcher
 * and the combine of partitions.
 *
 * Grid (KV head x head group, items): an item is one row's partition of part_len positions, and
 * each block takes its share of the launch's items in turn (attention.cuh). A block of 4 warps
 * takes HB query heads of one KV head (all G of them unless G is odd or large), so every K and V
 * row is read from the cache once for the whole group. A row of D elements is LPR lanes' 16-byte
 * chunks (8 elements each, CPL chunks per lane when D > 256), 32 / LPR rows per warp, U rows
 * per lane per step (when the block size is a multiple of a step's rows, a step lies in one
 * cache block: one block-table lookup per step, a row stride after it). Each warp streams its
 * steps' K rows, then their V rows, through its own cp.async ring in shared memory, S - 1 steps
 * ahead (no registers held by loads in flight, and the first V rows load during the softmax); each
 * lane copies exactly the chunks it reads, so no barrier guards the ring. Scores: each lane dots
 * its chunk with the HB queries (held in registers), and the HB x U partial sums of a lane group
 * are summed by a reduce-scatter (N - 1 shuffles for N values instead of N log2 LPR), each lane
 * storing the scores it ends up with to shared memory. After the partition's softmax, the V pass
 * accumulates P.V per lane (no shuffles per position); lane groups and warps are summed once at the
 * end.
 *
 * Partitions are 2048 positions on tensor cores (1024 here: shared memory holds a partition's
 * scores), halved (down to 32) while the grid would be small and the workspace allows: a long
 * partition spreads a block's fill, drain and merge over more positions (measured on the H200:
 * 512 blocks of 1024 positions beat 2048 of 256 at batch 64 x 1024). A partition writes its
 * un-normalised output with its max and sum to the workspace and a second kernel combines them
 * (split-K; a block per head for many partitions, a warp for a few); when a row's context fits
 * one partition the block writes the output directly. */
#include <math.h>

#include "attention.cuh"

/* DEC_PART: the partition length the workspace is sized for (longer and shorter ones are
 * chosen per launch, from DEC_MAX_PART (tensor cores) or DEC_CHUNK (CUDA cores, whose shared
 * memory holds a partition's scores) down); DEC_TARGET_BLOCKS: grid size below which partitions
 * are shortened; DEC_GRID_BLOCKS: blocks a launch with several partitions a row aims at (each
 * takes its share of the items, attention.cuh). */
enum {
    DEC_THREADS = 128,
    DEC_WARPS = DEC_THREADS / 32,
    DEC_PART = 256,
    DEC_MAX_PART = 2048,
    DEC_CHUNK = 1024,
    DEC_MIN_PART = 32,
    DEC_WS_FLOOR = 256,
    DEC_TARGET_BLOCKS = 512,
    DEC_GRID_BLOCKS = 1024
};

/* 8 cache elements from a stage of the ring (16-byte units, unit `i` of a lane at
 * ring[i * 32 + lane], so a warp's reads are conflict-free) as fp32. */
template <typename T16>
__device__ __forceinline__ void cvt8(float o[8], const uint4 *ring, int i, int lane, const T16 *t) {
    unpack8(o, ring[i * 32 + lane], t);
}
/* fp8: 8-byte units, unit i of a lane at ((uint2 *)ring)[i * 32 + lane] */
__device__ __forceinline__ void cvt8(float o[8], const uint4 *ring, int i, int lane, const kv8 *t) {
    unpack8(o, ((const uint2 *)ring)[i * 32 + lane], t);
}
__device__ __forceinline__ void cvt8(float o[8], const uint4 *ring, int i, int lane,
                                     const float *) {
    float4 a = *(const float4 *)&ring[2 * i * 32 + lane],
           b = *(const float4 *)&ring[(2 * i + 1) * 32 + lane];
    o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w;
    o[4] = b.x, o[5] = b.y, o[6] = b.z, o[7] = b.w;
}

/* Sum v[N] over aligned groups of 2 * O lanes (N a power of two). Each step trades half of
 * the remaining values with the partner lane, so afterwards lane i of a group of L lanes holds
 * in v[0 .. max(N / L, 1)) the full sums of elements i * N / L onwards (for N < L, the L / N
 * lanes i with the same i * N / L hold the same sum). */
template <int N, int O> __device__ __forceinline__ void reduce_scatter(float *v, int lane) {
    if constexpr (O > 0) {
        if constexpr (N > 1) {
            constexpr int H = N / 2;
            const bool upper = (lane & O) != 0;
#pragma unroll
            for (int i = 0; i < H; i++) {
                float send = upper ? v[i] : v[i + H];
                float keep = upper ? v[i + H] : v[i];
                v[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
            }
            reduce_scatter<H, O / 2>(v, lane);
        } else {
            v[0] += __shfl_xor_sync(0xffffffffu, v[0], O);
            reduce_scatter<1, O / 2>(v, lane);
        }
    }
}

/* Rows per lane per step (U: 4, fewer when a row is several chunks per lane), and the
 * cp.async ring of each warp: S stages of SLOT 16-byte units. An 8-element chunk is UNITS
 * 16-byte copies (2 for fp32, 1 for 16-bit types), or one 8-byte copy for fp8 (UNITS 0). */
template <typename TC, int CPL> struct DecRing {
    static constexpr int U = CPL == 1 ? 4 : CPL == 2 ? 2 : 1;
    static constexpr int UNITS = (int)sizeof(TC) / 2; /* 16-byte units per 8-element chunk */
    static constexpr int SLOT = U * CPL * 32 * (int)sizeof(TC) / 2;
    static constexpr int S = SLOT * 16 <= 2048 ? 3 : 2;
};

/* 16-byte units of shared memory that hold the rings and later the warps' partial sums. */
template <typename TC, int CPL, int HB> __host__ __device__ inline int dec_region(int D) {
    using R = DecRing<TC, CPL>;
    int ring = DEC_WARPS * R::S * R::SLOT, red = (DEC_WARPS * HB * D + 3) / 4;
    return ring > red ? ring : red;
}

/* One item (a row's partition) of the block: every thread of it. */
template <typename TQ, typename TC, int LPR, int CPL, int HB>
__device__ __forceinline__ void
decode_item(const DecodeItems &it, TQ *__restrict__ out, const TQ *__restrict__ q,
            const TC *__restrict__ cache, const KvGeom &kg, const int32_t *query_start,
            int num_seqs, const int32_t *block_tables, int nh, int G, int part_len, float scale,
            float *ws_acc, float *ws_ml, int max_parts) {
    using R = DecRing<TC, CPL>;
    constexpr int U = R::U, UNITS = R::UNITS, SLOT = R::SLOT, S = R::S;
    constexpr int RPW = 32 / LPR, N = HB * U, STEP = RPW * U;
    extern __shared__ uint4 smem16[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, D = kg.D, D8 = D >> 3;
    /* the rings, then (once drained) the warps' partial P.V sums; scores, max / sum, blocks */
    uint4 *ring = smem16 + warp * S * SLOT;                         /* [DEC_WARPS][S][SLOT] */
    float *red = (float *)smem16;                                   /* [DEC_WARPS][HB][D] */
    float *logits = (float *)(smem16 + dec_region<TC, CPL, HB>(D)); /* [HB][part_len] */
    float *ml = logits + HB * part_len;                             /* [2][HB] max, sum */
    int *tab = (int *)(ml + 2 * HB); /* the partition's physical blocks */
    DecodeWork job;
    decode_work(job, kg, it, query_start, num_seqs, block_tables, G, HB, part_len, tab);
    const int row = job.row, h0 = job.h0, start = job.start, end = job.end, b0 = job.b0;

    /* lane = r * LPR + sub: row r of the warp's rows, chunks sub + k * LPR of 8 elements */
    const int sub = lane % LPR, r = lane / LPR;
    const float qscale = scale * kg.ks; /* an fp8 cache's K scale, on the scores */
    float qr[HB][CPL][8];
#pragma unroll
    for (int h = 0; h < HB; h++)
#pragma unroll
        for (int k = 0; k < CPL; k++) {
            int c = sub + k * LPR;
            if (c < D8) {
                float t[8];
                load8(t, q + ((size_t)row * nh + h0 + h) * D + c * 8);
#pragma unroll
                for (int i = 0; i < 8; i++)
                    qr[h][k][i] = t[i] * qscale;
            } else {
#pragma unroll
                for (int i = 0; i < 8; i++)
                    qr[h][k][i] = 0.0f;
            }
        }
    __syncthreads(); /* tab */

    const TC *base = cache + kg.layer_off + (size_t)job.g * D;
    /* steps start at multiples of STEP: with STEP dividing the block size and the partition
     * length, each step's rows lie in one cache block */
    const bool one_block = kg.bs % STEP == 0 && part_len % STEP == 0;
    /* The warp's steps: positions p0 + u * RPW + r, p0 = first + i * DEC_WARPS * STEP for
     * i < nit; load j < nit is step j's K rows, load nit + j its V rows. Each lane copies the
     * chunks it reads itself, so its own cp.async groups are all the ordering it needs. */
    const int first = start + warp * STEP;
    const int nit = first < end ? (end - first + DEC_WARPS * STEP - 1) / (DEC_WARPS * STEP) : 0;
    auto issue = [&](int j) {
        if (j < 2 * nit) {
            const int v = j >= nit, p0 = first + (j - v * nit) * DEC_WARPS * STEP;
            const uint32_t dst = smem_addr(ring + (j % S) * SLOT);
            /* the step's rows in one cache block: one lookup, then a row stride */
            const TC *blk = cache;
            if (one_block) {
                const int bi = kv_block_of(kg, p0);
                blk = base + (size_t)tab[bi - b0] * kg.block_elems +
                      (size_t)(p0 - bi * kg.bs + r) * kg.row + v * kg.half;
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int p = p0 + u * RPW + r;
                const TC *src = cache;
                if (one_block) {
                    src = blk + (size_t)(u * RPW) * kg.row;
                } else if (p < end) {
                    const int bi = kv_block_of(kg, p);
                    src = base + (size_t)tab[bi - b0] * kg.block_elems +
                          (size_t)(p - bi * kg.bs) * kg.row + v * kg.half;
                }
#pragma unroll
                for (int k = 0; k < CPL; k++) {
                    const int c = sub + k * LPR;
                    const bool ok = p < end && c < D8; /* else zeros */
                    if constexpr (UNITS == 0)
                        cp_async8(dst + 8 * ((u * CPL + k) * 32 + lane), ok ? src + c * 8 : cache,
                                  ok);
#pragma unroll
                    for (int x = 0; x < UNITS; x++)
                        cp_async16(dst + 16 * (((u * CPL + k) * UNITS + x) * 32 + lane),
                                   ok ? src + c * 8 + x * (8 / (UNITS > 0 ? UNITS : 1)) : cache,
                                   ok);
                }
            }
        }
        cp_async_commit(); /* empty past the end: keeps the group count uniform */
    };
#pragma unroll
    for (int j = 0; j < S - 1; j++)
        issue(j);

    /* scores */
    for (int it = 0; it < nit; it++) {
        issue(it + S - 1);
        cp_async_wait<S - 1>();
        const uint4 *slot = ring + (it % S) * SLOT;
        const int p0 = first + it * DEC_WARPS * STEP;
        float sc[N];
#pragma unroll
        for (int i = 0; i < N; i++)
            sc[i] = 0.0f;
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int k = 0; k < CPL; k++) {
                float kf[8];
                cvt8(kf, slot, u * CPL + k, lane, (const TC *)NULL);
#pragma unroll
                for (int h = 0; h < HB; h++)
#pragma unroll
                    for (int i = 0; i < 8; i++)
                        sc[h * U + u] = fmaf(qr[h][k][i], kf[i], sc[h * U + u]);
            }
        reduce_scatter<N, LPR / 2>(sc, lane);
        if constexpr (N >= LPR) {
#pragma unroll
            for (int i = 0; i < N / LPR; i++) {
                const int idx = sub * (N / LPR) + i, h = idx / U, u = idx % U;
                const int p = p0 + u * RPW + r;
                if (p < end)
                    logits[h * part_len + p - start] = p >= job.lo ? sc[i] : -INFINITY;
            }
        } else if (sub % (LPR / N) == 0) {
            const int idx = sub / (LPR / N), h = idx / U, u = idx % U;
            const int p = p0 + u * RPW + r;
            if (p < end)
                logits[h * part_len + p - start] = p >= job.lo ? sc[0] : -INFINITY;
        }
    }
    __syncthreads(); /* the first V rows are in flight meanwhile */

    /* softmax over the partition, one warp per head */
    const int n = end - start;
    for (int h = warp; h < HB; h += DEC_WARPS) {
        float *lg = logits + h * part_len;
        float mx = -INFINITY;
        for (int j = lane; j < n; j += 32)
            mx = fmaxf(mx, lg[j]);
        mx = warp_max(mx);
        float sum = 0.0f;
        for (int j = lane; j < n; j += 32) {
            float e = __expf(lg[j] - mx);
            lg[j] = e;
            sum += e;
        }
        sum = warp_sum(sum);
        if (lane == 0) {
            ml[h] = mx;
            ml[HB + h] = sum;
        }
    }
    __syncthreads();

    /* P.V */
    float acc[HB][CPL][8];
#pragma unroll
    for (int h = 0; h < HB; h++)
#pragma unroll
        for (int k = 0; k < CPL; k++)
#pragma unroll
            for (int i = 0; i < 8; i++)
                acc[h][k][i] = 0.0f;
    for (int it = 0; it < nit; it++) {
        issue(nit + it + S - 1);
        cp_async_wait<S - 1>();
        const uint4 *slot = ring + ((nit + it) % S) * SLOT;
        const int p0 = first + it * DEC_WARPS * STEP;
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int p = p0 + u * RPW + r;
            float w[HB];
#pragma unroll
            for (int h = 0; h < HB; h++)
                w[h] = p < end ? logits[h * part_len + p - start] : 0.0f;
#pragma unroll
            for (int k = 0; k < CPL; k++) {
                float vf[8];
                cvt8(vf, slot, u * CPL + k, lane, (const TC *)NULL);
#pragma unroll
                for (int h = 0; h < HB; h++)
#pragma unroll
                    for (int i = 0; i < 8; i++)
                        acc[h][k][i] = fmaf(w[h], vf[i], acc[h][k][i]);
            }
        }
    }
    /* sum the warp's row groups, then the warps (red overlays the rings: all drained first) */
#pragma unroll
    for (int x = LPR; x < 32; x <<= 1)
#pragma unroll
        for (int h = 0; h < HB; h++)
#pragma unroll
            for (int k = 0; k < CPL; k++)
#pragma unroll
                for (int i = 0; i < 8; i++)
                    acc[h][k][i] += __shfl_xor_sync(0xffffffffu, acc[h][k][i], x);
    __syncthreads();
    if (r == 0) {
#pragma unroll
        for (int h = 0; h < HB; h++)
#pragma unroll
            for (int k = 0; k < CPL; k++) {
                int c = sub + k * LPR;
                if (c < D8) {
                    float4 *dst = (float4 *)(red + (warp * HB + h) * D + c * 8);
                    dst[0] = make_float4(acc[h][k][0], acc[h][k][1], acc[h][k][2], acc[h][k][3]);
                    dst[1] = make_float4(acc[h][k][4], acc[h][k][5], acc[h][k][6], acc[h][k][7]);
                }
            }
    }
    __syncthreads();
    for (int e = tid; e < HB * D; e += DEC_THREADS) {
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; w++)
            v += red[w * HB * D + e];
        v *= kg.vs; /* an fp8 cache's V scale, on the output */
        const int h = e / D, d = e - h * D;
        if (job.nparts == 1)
            out[((size_t)row * nh + h0 + h) * D + d] = from_f32<TQ>(v / ml[HB + h]);
        else
            ws_acc[((job.tok * nh + h0 + h) * max_parts + job.part) * D + d] = v;
    }
    if (job.nparts > 1 && tid < HB) {
        size_t i = (job.tok * nh + h0 + tid) * max_parts + job.part;
        ws_ml[2 * i] = ml[tid];
        ws_ml[2 * i + 1] = ml[HB + tid];
    }
}

template <typename TQ, typename TC, int LPR, int CPL, int HB>
__global__ __launch_bounds__(DEC_THREADS) void decode_kernel(
    TQ *__restrict__ out, const TQ *__restrict__ q, const TC *__restrict__ cache, KvGeom kg,
    const int32_t *positions, const int32_t *query_start, int num_seqs, const int32_t *block_tables,
    int nh, int G, int part_len, float scale, float *ws_acc, float *ws_ml, int max_parts) {
    kc_pdl_wait();
    kc_pdl_trigger();
    decode_items_run<DEC_WARPS>(
        kg, positions, query_start, num_seqs, part_len, max_parts, [&](const DecodeItems &it) {
            decode_item<TQ, TC, LPR, CPL, HB>(it, out, q, cache, kg, query_start, num_seqs,
                                              block_tables, nh, G, part_len, scale, ws_acc, ws_ml,
                                              max_parts);
        });
}

/* Combining the partitions of (row, head): out = sum_p w_p acc_p / sum_p w_p l_p,
 * w_p = exp(m_p - max_p m_p); rows whose context fit one partition were written by the decode
 * kernel. Two kernels, each where it measured faster on the H200:
 *
 * Many partitions (short ones: batch 1): decode_reduce_kernel, block (row, y) takes heads y,
 * y + gridDim.y, ... (several per block when the rows are many, so that rows needing no
 * combine cost few blocks). Warp i sums partitions i, i + RED_WARPS, ... (four dims per lane,
 * loads unrolled so that many partitions are in flight), then the warps' sums are added.
 * RED_MANY_ROWS: rows from which a block takes RED_HEADS heads. (Batch 1, context 1024, 32
 * partitions: 7.7 us per layer with the decode kernel, in a graph; 9.5 with a four-warp
 * form of the kernel below per head.)
 *
 * At most RED_FEW_PARTS (long partitions of many rows): decode_reduce_warp_kernel, one warp
 * per (row, head), no shared memory and no barrier. (Batch 256, two partitions: 36.7 us per
 * layer in ncu for the block kernel, whose barriers between max, weights and sums wait on
 * latency, not bytes; the decode step 17.733 -> 17.297 ms.) */
enum {
    RED_THREADS = 256,
    RED_WARPS = RED_THREADS / 32,
    RED_MANY_ROWS = 64,
    RED_HEADS = 8,
    RED_FEW_PARTS = 8,
    RED_WARP_THREADS = 128
};

/* One head's combine: `base` indexes its first partition in the workspace. */
template <typename TQ>
__device__ __forceinline__ void combine_head(TQ *out, const float *ws_acc, const float *ws_ml,
                                             int row, int h, size_t base, int nh, int D, int nparts,
                                             float4 *part_sum, float *w, float *scratch) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    float mx = -INFINITY;
    for (int p = tid; p < nparts; p += RED_THREADS)
        mx = fmaxf(mx, ws_ml[2 * (base + p)]);
    mx = warp_max(mx);
    if (lane == 0)
        scratch[warp] = mx;
    __syncthreads();
    mx = scratch[0];
#pragma unroll
    for (int i = 1; i < RED_WARPS; i++)
        mx = fmaxf(mx, scratch[i]);
    float den = 0.0f;
    for (int p = tid; p < nparts; p += RED_THREADS) {
        float wp = __expf(ws_ml[2 * (base + p)] - mx);
        w[p] = wp;
        den += wp * ws_ml[2 * (base + p) + 1];
    }
    den = block_sum(den, scratch); /* its barriers also publish w[] */
    const float4 *acc4 = (const float4 *)(ws_acc + base * D);
    const int D4 = D / 4;
    for (int d4 = lane; d4 < D4; d4 += 32) {
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
        for (int p = warp; p < nparts; p += RED_WARPS) {
            const float wp = w[p];
            const float4 x = acc4[(size_t)p * D4 + d4];
            v.x = fmaf(wp, x.x, v.x);
            v.y = fmaf(wp, x.y, v.y);
            v.z = fmaf(wp, x.z, v.z);
            v.w = fmaf(wp, x.w, v.w);
        }
        part_sum[warp * D4 + d4] = v;
    }
    __syncthreads();
    const float inv = 1.0f / den;
    for (int d = tid; d < D; d += RED_THREADS) {
        float v = 0.0f;
#pragma unroll
        for (int i = 0; i < RED_WARPS; i++)
            v += ((const float *)part_sum)[i * D + d];
        out[((size_t)row * nh + h) * D + d] = from_f32<TQ>(v * inv);
    }
}

template <typename TQ>
__global__ __launch_bounds__(RED_THREADS) void decode_reduce_kernel(
    TQ *out, const float *ws_acc, const float *ws_ml, const int32_t *positions,
    const int32_t *query_start, int num_seqs, int nh, int D, int part_len, int max_parts,
    KvGeom kg) {
    kc_pdl_wait();
    kc_pdl_trigger();
    extern __shared__ float4 red_smem[];
    __shared__ float scratch[32];
    const int qs0 = query_start[0], row = qs0 + blockIdx.x;
    if (row >= query_start[num_seqs])
        return;
    int first;
    const int nparts = (kv_decode_span(kg, positions[row], &first) + part_len - 1) / part_len;
    if (nparts <= 1)
        return;
    float4 *part_sum = red_smem;                        /* [RED_WARPS][D / 4] */
    float *w = (float *)(red_smem + RED_WARPS * D / 4); /* [nparts] */
    for (int h = blockIdx.y; h < nh; h += gridDim.y) {
        __syncthreads(); /* the previous head's reads of w, scratch and part_sum are done */
        combine_head(out, ws_acc, ws_ml, row, h, ((size_t)(row - qs0) * nh + h) * max_parts, nh, D,
                     nparts, part_sum, w, scratch);
    }
}

/* Lane j reads partition j's max and sum (32 partitions at a time); the loop over partitions,
 * four dims per lane, takes w_p from lane p by a shuffle, its loads unrolled so that all of a
 * row's few partitions are in flight. */
template <typename TQ>
__global__ __launch_bounds__(RED_WARP_THREADS) void decode_reduce_warp_kernel(
    TQ *out, const float *ws_acc, const float *ws_ml, const int32_t *positions,
    const int32_t *query_start, int num_seqs, int nh, int D, int part_len, int max_parts,
    KvGeom kg) {
    kc_pdl_wait();
    kc_pdl_trigger();
    const int lane = threadIdx.x & 31;
    const int h = blockIdx.x * (RED_WARP_THREADS / 32) + (threadIdx.x >> 5);
    const int qs0 = query_start[0], row = qs0 + blockIdx.y;
    if (h >= nh || row >= query_start[num_seqs])
        return;
    int first;
    const int nparts = (kv_decode_span(kg, positions[row], &first) + part_len - 1) / part_len;
    if (nparts <= 1)
        return;
    const size_t base = ((size_t)(row - qs0) * nh + h) * max_parts;
    const float2 *ml = (const float2 *)ws_ml + base; /* (max, sum) per partition */
    float mx = -INFINITY;
    for (int p = lane; p < nparts; p += 32)
        mx = fmaxf(mx, ml[p].x);
    mx = warp_max(mx);
    float den = 0.0f;
    for (int p = lane; p < nparts; p += 32) {
        const float2 v = ml[p];
        den += __expf(v.x - mx) * v.y;
    }
    const float inv = 1.0f / warp_sum(den);
    const float4 *acc = (const float4 *)(ws_acc + base * D);
    const int D4 = D / 4;
    for (int d0 = 0; d0 < D4; d0 += 32) { /* every lane in the loop: it shuffles */
        const int d4 = d0 + lane;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int p0 = 0; p0 < nparts; p0 += 32) {
            const float wl = p0 + lane < nparts ? __expf(ml[p0 + lane].x - mx) : 0.0f;
            const int m = min(32, nparts - p0);
#pragma unroll 8
            for (int j = 0; j < m; j++) {
                const float wp = __shfl_sync(0xffffffffu, wl, j);
                if (d4 < D4) {
                    const float4 x = acc[(size_t)(p0 + j) * D4 + d4];
                    v.x = fmaf(wp, x.x, v.x);
                    v.y = fmaf(wp, x.y, v.y);
                    v.z = fmaf(wp, x.z, v.z);
                    v.w = fmaf(wp, x.w, v.w);
                }
            }
        }
        if (d4 < D4) {
            TQ *o = out + ((size_t)row * nh + h) * D + 4 * d4;
            o[0] = from_f32<TQ>(v.x * inv);
            o[1] = from_f32<TQ>(v.y * inv);
            o[2] = from_f32<TQ>(v.z * inv);
            o[3] = from_f32<TQ>(v.w * inv);
        }
    }
}

/* Partial results (row x partition pairs, each nh x (D + 2) floats) of a split at
 * DEC_PART positions, and at least DEC_WS_FLOOR of them: room for short partitions when a
 * small batch would leave the GPU idle. */
static size_t ws_partials(const KvLayout *l, int num_tokens, int max_blocks_per_seq) {
    size_t ctx = (size_t)max_blocks_per_seq * (size_t)l->block_size;
    size_t n = (size_t)num_tokens * ((ctx + DEC_PART - 1) / DEC_PART);
    return n > DEC_WS_FLOOR ? n : DEC_WS_FLOOR;
}

size_t k_cuda_attention_workspace_bytes(const KvLayout *l, int num_tokens, int nh,
                                        int max_blocks_per_seq) {
    if (num_tokens <= 0 || (size_t)max_blocks_per_seq * l->block_size <= DEC_MIN_PART)
        return 0;
    return ws_partials(l, num_tokens, max_blocks_per_seq) * nh * ((size_t)l->head_dim + 2) *
           sizeof(float);
}

template <typename TQ, typename TC, int LPR, int CPL, int HB>
static void launch_kernel(const DecodeLaunch &a) {
    auto kern = decode_kernel<TQ, TC, LPR, CPL, HB>;
    size_t smem = (size_t)dec_region<TC, CPL, HB>(a.kg.D) * 16 +
                  ((size_t)HB * a.part_len + 2 * HB) * sizeof(float) +
                  ((size_t)a.part_len / a.kg.bs + 2) * sizeof(int);
    kc_set_smem(kern, smem);
    kc_launch_pdl(kern, a.grid, dim3(DEC_THREADS), smem, a.stream, (TQ *)a.out, (const TQ *)a.q,
                  (const TC *)a.cache, a.kg, a.b->positions, a.b->query_start, a.b->num_seqs,
                  a.b->block_tables, a.nh, a.G, a.part_len, a.scale, a.ws_acc, a.ws_ml,
                  a.max_parts);
}

/* heads per block: the largest of 8, 4, 2, 1 dividing G, at most 8 / CPL (registers) */
template <typename TQ, typename TC, int LPR, int CPL>
static void launch_decode_hb(const DecodeLaunch &a, int HB) {
    if (HB == 8 && CPL == 1)
        launch_kernel<TQ, TC, LPR, CPL, (CPL == 1 ? 8 : 1)>(a);
    else if (HB >= 4 && CPL <= 2)
        launch_kernel<TQ, TC, LPR, CPL, (CPL <= 2 ? 4 : 1)>(a);
    else if (HB >= 2)
        launch_kernel<TQ, TC, LPR, CPL, 2>(a);
    else
        launch_kernel<TQ, TC, LPR, CPL, 1>(a);
}

void k_cuda_attention_decode(void *out, const void *q, DType act, const void *kv_cache,
                             const KvLayout *l, int layer, const AttnBatch *b, int nh, float scale,
                             int window, void *workspace, size_t workspace_bytes, void *stream) {
    const char *what = "k_cuda_attention_decode";
    KvGeom kg = kc_attn_check(l, layer, b, nh, window, what);
    if (b->num_tokens <= 0 || b->num_seqs <= 0)
        return;
    const int D = kg.D, D8 = D / 8, G = nh / kg.nkv;
    size_t need = k_cuda_attention_workspace_bytes(l, b->num_tokens, nh, b->max_blocks_per_seq);
    KC_REQUIRE(workspace_bytes >= need && (need == 0 || workspace),
               "%s: workspace of %zu bytes, %zu needed", what, workspace_bytes, need);
    KC_REQUIRE(b->num_tokens <= 65535, "%s: %d rows, at most 65535", what, b->num_tokens);

    const int LPR = D8 > 16 ? 32 : D8 > 8 ? 16 : D8 > 4 ? 8 : D8 > 2 ? 4 : D8;
    const int CPL = (D8 + 31) / 32;
    int HB = 1;
    for (int c = 2; c <= 8 / CPL; c *= 2)
        if (G % c == 0)
            HB = c;
    /* the CUDA-core kernel holds a partition's scores in shared memory; tensor cores need not */
    const bool tc = kc_decode_tc_ok(act, l, kg);
    /* the alignment of a step's positions: tensor cores 8 (a half-step, in one cache block),
     * CUDA cores a step, (32 / LPR) x (4, 2 or 1 rows per lane) */
    const int step = tc ? 8 : 32 / LPR * (CPL == 1 ? 4 : CPL == 2 ? 2 : 1);
    /* Partition length: DEC_MAX_PART (tensor cores) or DEC_CHUNK, halved (down to DEC_MIN_PART)
     * while the grid is small and the partial results still fit the workspace. ctx is the bound,
     * not the rows' actual contexts: the block tables', or a window's (from its first position
     * rounded down to a step). */
    size_t ctx = (size_t)b->max_blocks_per_seq * kg.bs;
    if (kg.window > 0 && (size_t)kg.window + step - 1 < ctx)
        ctx = (size_t)kg.window + step - 1;
    const size_t base = (size_t)b->num_tokens * kg.nkv * (G / HB);
    int part_len = tc ? DEC_MAX_PART : DEC_CHUNK;
    auto parts_of = [&](int len) { return (ctx + len - 1) / len; };
    auto bytes_of = [&](int len) {
        return parts_of(len) <= 1 ? 0 : (size_t)b->num_tokens * parts_of(len) * nh * (D + 2) * 4;
    };
    while (part_len > DEC_MIN_PART && base * parts_of(part_len) < DEC_TARGET_BLOCKS &&
           bytes_of(part_len / 2) <= workspace_bytes)
        part_len /= 2;
    const int parts = (int)parts_of(part_len);
    KC_REQUIRE(parts <= 12288, "%s: %d partitions of %d positions: context too long", what, parts,
               part_len);
    const int max_parts = parts; /* the workspace layout's partitions per (row, head) */
    /* a window's first position rounded down to a step that lies in one cache block (the
     * steps' alignment; it divides the block size, so no released block is read) */
    if (tc || (kg.bs % step == 0 && part_len % step == 0))
        kg.win_align = step;
    DecodeLaunch a;
    a.out = out;
    a.q = q;
    a.cache = kv_cache;
    a.kg = kg;
    a.b = b;
    a.nh = nh;
    a.G = G;
    a.part_len = part_len;
    a.max_parts = max_parts;
    a.scale = scale;
    a.ws_acc = (float *)workspace;
    a.ws_ml = a.ws_acc ? a.ws_acc + (size_t)b->num_tokens * nh * max_parts * D : NULL;
    /* Items (a row's partition) spread over Y blocks per head group: one row each when a row
     * has one partition; else enough blocks for DEC_GRID_BLOCKS in all, at least a row's worth
     * each, at most an item each (attention.cuh) */
    const size_t gx = (size_t)kg.nkv * (G / HB);
    size_t rows_y = (size_t)b->num_tokens;
    if (parts > 1) {
        const size_t want = (DEC_GRID_BLOCKS + gx - 1) / gx;
        rows_y = want > rows_y ? want : rows_y;
        if (rows_y > (size_t)b->num_tokens * parts)
            rows_y = (size_t)b->num_tokens * parts;
    }
    a.grid = dim3((unsigned)gx, (unsigned)rows_y, 1);
    a.stream = kc_stream(stream);
    a.kv_dtype = l->dtype;
    KC_DISPATCH_ATTN(act, l->dtype, what, {
        if (tc)
            kc_decode_tc(a, act, HB);
        else
            switch (LPR * 8 + CPL) {
                case 1 * 8 + 1:
                    launch_decode_hb<TQ, TC, 1, 1>(a, HB);
                    break;
                case 2 * 8 + 1:
                    launch_decode_hb<TQ, TC, 2, 1>(a, HB);
                    break;
                case 4 * 8 + 1:
                    launch_decode_hb<TQ, TC, 4, 1>(a, HB);
                    break;
                case 8 * 8 + 1:
                    launch_decode_hb<TQ, TC, 8, 1>(a, HB);
                    break;
                case 16 * 8 + 1:
                    launch_decode_hb<TQ, TC, 16, 1>(a, HB);
                    break;
                case 32 * 8 + 1:
                    launch_decode_hb<TQ, TC, 32, 1>(a, HB);
                    break;
                case 32 * 8 + 2:
                    launch_decode_hb<TQ, TC, 32, 2>(a, HB);
                    break;
                case 32 * 8 + 3:
                    launch_decode_hb<TQ, TC, 32, 3>(a, HB);
                    break;
                default:
                    launch_decode_hb<TQ, TC, 32, 4>(a, HB);
            }
        if (parts > RED_FEW_PARTS) {
            const int per_block = b->num_tokens >= RED_MANY_ROWS ? RED_HEADS : 1;
            dim3 rgrid((unsigned)b->num_tokens, (unsigned)((nh + per_block - 1) / per_block));
            /* w[] padded to 16 bytes: ptxas may merge the loop's tail loads of w into one
             * wide (speculative) load, which compute-sanitizer flags past an unpadded end */
            size_t rsmem =
                (size_t)RED_WARPS * D * sizeof(float) + (size_t)((parts + 3) & ~3) * sizeof(float);
            auto rkern = decode_reduce_kernel<TQ>;
            kc_set_smem(rkern, rsmem);
            kc_launch_pdl(rkern, rgrid, dim3(RED_THREADS), rsmem, a.stream, (TQ *)out, a.ws_acc,
                          a.ws_ml, b->positions, b->query_start, b->num_seqs, nh, D, part_len,
                          max_parts, a.kg);
        } else if (parts > 1) {
            dim3 rgrid((unsigned)((nh * 32 + RED_WARP_THREADS - 1) / RED_WARP_THREADS),
                       (unsigned)b->num_tokens);
            kc_launch_pdl(decode_reduce_warp_kernel<TQ>, rgrid, dim3(RED_WARP_THREADS), 0, a.stream,
                          (TQ *)out, a.ws_acc, a.ws_ml, b->positions, b->query_start, b->num_seqs,
                          nh, D, part_len, max_parts, a.kg);
        }
    });
}
