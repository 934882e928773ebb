/* attention.cuh - (internal to kernels/cuda/) what the paged-attention kernels share: the
 * argument checks, the KV-cache geometry of one layer in elements, the mapping of a prefill
 * grid's blocks to (sequence, query tile), cp.async and tensor-core (ldmatrix, mma.sync)
 * helpers (prefill_tc.cuh has what the tensor-core prefill kernels share). */
#ifndef PAGELLM_KERNELS_CUDA_ATTENTION_CUH
#define PAGELLM_KERNELS_CUDA_ATTENTION_CUH

#include <stdio.h>

#include "kv_fp8.cuh"

enum { ATTN_MAX_HEAD_DIM = 1024 };

/* Cache geometry handed to the kernels: element offsets of one layer's K half within a block
 * (V is `half` further), the block stride, and the row stride of one token; the layer's K
 * and V scales (1 unless the cache is fp8, whose elements stand for dec(q) * ks, dec(q) * vs);
 * and its sliding window. A row at position p attends to positions lo(p) = p - window + 1 (0
 * without a window, or before it) .. p. The kernels skip whole tiles or partitions before
 * lo(p) and mask inside the first one; they never read a cache block wholly before the window
 * of every row of a launch (the block manager may have released it: its block-table entry is
 * then a sentinel). Decode partitions start at lo(p) rounded down to win_align, a divisor of
 * the block size (so still in lo(p)'s block) that keeps the kernel's steps aligned. */
typedef struct {
    size_t block_elems, half, layer_off, row;
    int bs, nkv, D, max_blocks;
    int bs_shift; /* log2(bs) when bs is a power of two, else -1 (then divide) */
    float ks, vs;
    int window;    /* > 0: the last `window` positions only */
    int win_align; /* decode: the first position read is a multiple of it (1: lo(p) itself) */
} KvGeom;

/* mn and mx become their minimum and maximum over the warp (every lane calls). */
__device__ __forceinline__ void warp_min_max(int &mn, int &mx) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        mn = min(mn, __shfl_xor_sync(0xffffffffu, mn, o));
        mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    }
}

/* Index into a block table of position p: p / bs, a shift for power-of-two block sizes. */
__device__ __forceinline__ int kv_block_of(const KvGeom &kg, int p) {
    return kg.bs_shift >= 0 ? p >> kg.bs_shift : p / kg.bs;
}

static inline KvGeom kc_attn_check(const KvLayout *l, int layer, const AttnBatch *b, int nh,
                                   int window, const char *what) {
    KC_REQUIRE(l->num_kv_heads > 0 && nh > 0 && nh % l->num_kv_heads == 0,
               "%s: %d query heads are not a multiple of %d kv heads", what, nh, l->num_kv_heads);
    KC_REQUIRE(l->head_dim > 0 && l->head_dim % 8 == 0 && l->head_dim <= ATTN_MAX_HEAD_DIM,
               "%s: head_dim %d unsupported (a multiple of 8, at most %d)", what, l->head_dim,
               ATTN_MAX_HEAD_DIM);
    KC_REQUIRE(layer >= 0 && layer < l->num_layers, "%s: layer %d of %d", what, layer,
               l->num_layers);
    KC_REQUIRE(l->block_size > 0 && b->max_blocks_per_seq > 0, "%s: empty block tables", what);
    KvGeom g;
    g.half = (size_t)l->block_size * l->num_kv_heads * l->head_dim;
    g.block_elems = (size_t)l->num_layers * 2 * g.half;
    g.layer_off = (size_t)layer * 2 * g.half;
    g.row = (size_t)l->num_kv_heads * l->head_dim;
    g.bs = l->block_size;
    g.nkv = l->num_kv_heads;
    g.D = l->head_dim;
    g.max_blocks = b->max_blocks_per_seq;
    g.ks = k_kv_scale(l, layer, 0);
    g.vs = k_kv_scale(l, layer, 1);
    g.window = window > 0 ? window : 0;
    g.win_align = 1;
    g.bs_shift = -1;
    for (int sh = 0; sh < 31; sh++)
        if (l->block_size == 1 << sh)
            g.bs_shift = sh;
    return g;
}

/* The first position a row at `pos` attends to (its window's first; 0 without one). */
__device__ __forceinline__ int kv_window_lo(const KvGeom &kg, int pos) {
    return kg.window > 0 && pos >= kg.window ? pos - kg.window + 1 : 0;
}

/* Whether a row at `pos` attends to position p >= 0: p in [kv_window_lo(pos), pos]. */
__device__ __forceinline__ bool kv_sees(const KvGeom &kg, int pos, int p) {
    return p <= pos && p >= kv_window_lo(kg, pos);
}

/* The positions a decode row at `pos` reads: [*first, pos], *first its window's first rounded
 * down to win_align. Returns their count. */
__device__ __forceinline__ int kv_decode_span(const KvGeom &kg, int pos, int *first) {
    const int lo = kv_window_lo(kg, pos);
    *first = lo - lo % kg.win_align;
    return pos + 1 - *first;
}

/* ---- decode work: items (row, partition) ----
 * A decode launch's work is its rows' partitions of part_len positions, ctx / part_len rounded up
 * per row (ctx: the positions it reads, from its window's first on), numbered row by row: N
 * items in all. Block (x, y) takes its contiguous share of them
 * (N / Y or one more, Y = gridDim.y) in turn, so that rows of any mix of lengths spread
 * evenly over a grid sized for the parallelism wanted rather than for the block tables' bound (a
 * grid of bound / part_len partitions per row spends most of its blocks on partitions past every
 * context: at max-model-len 131072, a batch-256 decode step of the 8B shape took 14.0 ms instead
 * of 9.4 on the H200). With one partition per row (max_parts 1) item y is row y, no scan. */
typedef struct {
    int row, part, ctx; /* the next item: partition `part` of row `row`, of ctx positions */
    int left;           /* items left to this block */
    int first;          /* the row's first position read (kv_decode_span) */
} DecodeItems;

/* Partitions of a row of ctx positions, at most max_parts + 1 (a row past the block tables
 * traps in decode_work; the bound keeps N within int). */
__device__ __forceinline__ int decode_nparts(int ctx, int part_len, int max_parts) {
    return min((ctx - 1) / part_len + 1, max_parts + 1);
}

/* Block y's share of `total` items: its first and count, the first blocks taking one more
 * (fewer items than blocks: item y to block y, the first blocks the GPU starts). */
__device__ __forceinline__ void decode_share(int total, int *first, int *left) {
    const int y = blockIdx.y, each = total / gridDim.y, more = total % gridDim.y;
    *first = y * each + min(y, more);
    *left = each + (y < more);
}

/* This block's first item and count (the same in every thread). One row (batch 1, where the
 * latency counts): no scan; up to a row per thread: one scan; more: a pass for the total, then
 * tiles of a row per thread until the first item's. */
template <int WARPS>
__device__ __forceinline__ void
decode_items_begin(DecodeItems &it, const KvGeom &kg, const int32_t *positions,
                   const int32_t *query_start, int num_seqs, int part_len, int max_parts) {
    constexpr int threads = WARPS * 32;
    /* block_scan's WARPS + 1, then the row, part and context found */
    __shared__ int scratch[WARPS + 4];
    const int r0 = query_start[0], rows = query_start[num_seqs] - r0, y = blockIdx.y;
    if (max_parts == 1) {
        it.row = r0 + y;
        it.part = 0;
        it.left = y < rows;
        it.ctx = y < rows ? kv_decode_span(kg, positions[r0 + y], &it.first) : 0;
        return;
    }
    int first = 0, total = 0;
    if (rows <= 1) {
        it.ctx = rows ? kv_decode_span(kg, positions[r0], &it.first) : 0;
        total = rows ? decode_nparts(it.ctx, part_len, max_parts) : 0;
        decode_share(total, &first, &it.left);
        it.row = r0;
        it.part = first;
        return;
    }
    if (rows > threads) {
        int n = 0;
        for (int i = threadIdx.x; i < rows; i += threads) {
            int f;
            n += decode_nparts(kv_decode_span(kg, positions[r0 + i], &f), part_len, max_parts);
        }
        block_scan<WARPS>(n, &total, scratch);
        decode_share(total, &first, &it.left);
        if (it.left == 0)
            return;
    }
    /* the row holding item `first`: prefix sums over tiles of a row per thread */
    for (int t0 = 0, before = 0; t0 < rows; t0 += threads) {
        int f = 0;
        const int i = t0 + threadIdx.x,
                  ctx = i < rows ? kv_decode_span(kg, positions[r0 + i], &f) : 0;
        const int np = ctx ? decode_nparts(ctx, part_len, max_parts) : 0;
        int tile = 0;
        const int from = before + block_scan<WARPS>(np, &tile, scratch);
        if (rows <= threads) { /* one tile: its sum is the total */
            decode_share(tile, &first, &it.left);
            if (it.left == 0)
                return;
        }
        if (np && first >= from && first < from + np) { /* exactly one thread */
            scratch[WARPS + 1] = i;
            scratch[WARPS + 2] = first - from;
            scratch[WARPS + 3] = ctx;
        }
        __syncthreads();
        if (first < before + tile) {
            it.row = r0 + scratch[WARPS + 1];
            it.part = scratch[WARPS + 2];
            it.ctx = scratch[WARPS + 3];
            it.first = positions[it.row] + 1 - it.ctx;
            return;
        }
        before += tile;
    }
}

/* Past the item just done to the next (of the same row, or the next row's first). */
__device__ __forceinline__ void decode_items_next(DecodeItems &it, const KvGeom &kg,
                                                  const int32_t *positions, int part_len,
                                                  int max_parts) {
    if (--it.left > 0 && ++it.part == decode_nparts(it.ctx, part_len, max_parts)) {
        it.row++;
        it.part = 0;
        it.ctx = kv_decode_span(kg, positions[it.row], &it.first);
    }
}

/* item(it) for each of this block's items in turn (every thread calls it; shared memory is
 * free again between items), in a block of WARPS warps. */
template <int WARPS, typename Item>
__device__ __forceinline__ void decode_items_run(const KvGeom &kg, const int32_t *positions,
                                                 const int32_t *query_start, int num_seqs,
                                                 int part_len, int max_parts, Item item) {
    DecodeItems it;
    decode_items_begin<WARPS>(it, kg, positions, query_start, num_seqs, part_len, max_parts);
    for (; it.left > 0; decode_items_next(it, kg, positions, part_len, max_parts)) {
        item(it);
        __syncthreads(); /* the next item reuses the block's shared memory */
    }
}

/* What a decode block does for item `it`: heads h0 .. h0 + HB - 1 of KV head g (from blockIdx.x),
 * row it.row (tok-th of the launch), positions [start, end) of its context (nparts partitions of
 * part_len from it.first), of which those before lo are masked (the window), and cache blocks
 * b0 .. b0 + nb - 1 of its sequence, whose physical numbers are copied to tab (then a
 * __syncthreads is due). A row beyond its block tables traps. */
typedef struct {
    int g, h0, row, part, nparts, start, end, b0, lo;
    size_t tok;
} DecodeWork;

__device__ __forceinline__ void decode_work(DecodeWork &w, const KvGeom &kg, const DecodeItems &it,
                                            const int32_t *query_start, int num_seqs,
                                            const int32_t *block_tables, int G, int HB,
                                            int part_len, int *tab) {
    const int groups = G / HB;
    w.g = blockIdx.x / groups;
    w.h0 = w.g * G + (blockIdx.x - w.g * groups) * HB;
    w.row = it.row;
    w.tok = (size_t)(it.row - query_start[0]);
    w.part = it.part;
    const int ctx = it.ctx, pos = it.first + ctx - 1;
    if (pos >= kg.max_blocks * kg.bs) {
        if (w.part == 0 && blockIdx.x == 0 && threadIdx.x == 0)
            printf("k_cuda_attention_decode: row %d at position %d is beyond max_blocks_per_seq "
                   "%d\n",
                   w.row, pos, kg.max_blocks);
        __trap();
    }
    w.nparts = (ctx + part_len - 1) / part_len;
    w.start = it.first + w.part * part_len;
    w.end = min(pos + 1, w.start + part_len);
    w.lo = kv_window_lo(kg, pos);
    const int32_t *table =
        block_tables + (size_t)seq_of_row(query_start, num_seqs, w.row) * kg.max_blocks;
    w.b0 = kv_block_of(kg, w.start);
    const int nb = kv_block_of(kg, w.end - 1) - w.b0 + 1;
    for (int i = threadIdx.x; i < nb; i += blockDim.x)
        tab[i] = table[w.b0 + i];
}

/* Both dtypes at once: body runs with TQ (activations) and TC (cache, possibly fp8) bound. */
#define KC_DISPATCH_ATTN(act, kvdt, what, ...)                                                     \
    KC_DISPATCH_ACT(act, what, TQ, KC_DISPATCH_KV(kvdt, what, TC, __VA_ARGS__))

/* ---- cp.async: 16-byte global -> shared copies that bypass registers ---- */

/* 16 bytes global -> shared, zero-filled when !valid (src is then not read). */
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}
/* 8 bytes global -> shared (through L1), zero-filled when !valid: an fp8 row chunk. */
__device__ __forceinline__ void cp_async8(uint32_t dst, const void *src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 8 : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* ---- tensor cores: ldmatrix and mma.sync (bf16 or f16 in, fp32 accumulators) ---- */

__device__ __forceinline__ void ldsm_x4(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* A pair of 16-bit values of type T as the mma's input type MT: the same bits, or bf16 to f16
 * (exact within f16's range; beyond +-65504 saturated, and below 2^-24 rounded to f16's
 * subnormals). */
template <typename T, typename MT> __device__ __forceinline__ uint32_t as_mma_pair(uint32_t two) {
    if constexpr (std::is_same<T, MT>::value) {
        return two;
    } else {
        const float2 f = __bfloat1622float2(*(const __nv_bfloat162 *)&two);
        const float lim = 65504.0f;
        return pack16<f16>(fminf(fmaxf(f.x, -lim), lim), fminf(fmaxf(f.y, -lim), lim));
    }
}

/* c[16x8] += a[16x8] b[8x8] (m16n8k8), 16-bit inputs, fp32 accumulators. */
template <typename T>
__device__ __forceinline__ void mma8(float c[4], uint32_t a0, uint32_t a1, uint32_t b) {
    if constexpr (std::is_same<T, bf16>::value)
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5}, {%6}, {%0, %1, %2, %3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a0), "r"(a1), "r"(b));
    else
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5}, {%6}, {%0, %1, %2, %3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a0), "r"(a1), "r"(b));
}

/* Prefill grids number their query tiles sequence by sequence, ceil(len / rows) tiles each;
 * warp 0 finds which (sequence, first row) tile `target` is. Returns s = -1 past the last
 * tile. */
__device__ static inline void find_tile(const int32_t *query_start, int num_seqs, int rows,
                                        int target, int *s_out, int *t0_out) {
    const int lane = threadIdx.x & 31;
    int done = 0, found_s = -1, found_t0 = 0;
    for (int base = 0; base < num_seqs; base += 32) {
        int s = base + lane, cnt = 0, qs = 0;
        if (s < num_seqs) {
            qs = query_start[s];
            cnt = (query_start[s + 1] - qs + rows - 1) / rows;
        }
        int incl = cnt;
        for (int o = 1; o < 32; o <<= 1) {
            int y = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o)
                incl += y;
        }
        int first = done + incl - cnt;
        unsigned hit =
            __ballot_sync(0xffffffffu, cnt > 0 && target >= first && target < done + incl);
        if (hit) {
            int src = __ffs(hit) - 1;
            if (lane == src) {
                found_s = s;
                found_t0 = qs + (target - first) * rows;
            }
            found_s = __shfl_sync(0xffffffffu, found_s, src);
            found_t0 = __shfl_sync(0xffffffffu, found_t0, src);
            break;
        }
        done += __shfl_sync(0xffffffffu, incl, 31);
    }
    *s_out = found_s;
    *t0_out = found_t0;
}

/* Copy 8 cache elements at `src` into shared memory `dst` (16-byte aligned) as fp32, times s
 * (an fp8 cache's scale: dec(q) * s, as the CPU reads it; 1 otherwise). */
template <typename TC> __device__ __forceinline__ void stage8(float *dst, const TC *src, float s) {
    float v[8];
    load8(v, src);
    if constexpr (is_kv8<TC>::value) {
#pragma unroll
        for (int i = 0; i < 8; i++)
            v[i] *= s;
    }
    *(float4 *)dst = make_float4(v[0], v[1], v[2], v[3]);
    *(float4 *)(dst + 4) = make_float4(v[4], v[5], v[6], v[7]);
}

/* One decode launch (attention_decode.cu): the grid is (KV head x head group, item blocks);
 * partitions of part_len positions write to ws_acc / ws_ml when a row has several. */
typedef struct {
    void *out;
    const void *q, *cache;
    KvGeom kg;
    const AttnBatch *b;
    int nh, G, part_len, max_parts;
    float scale;
    float *ws_acc, *ws_ml;
    dim3 grid;
    cudaStream_t stream;
    DType kv_dtype; /* the cache's element type */
} DecodeLaunch;

/* The tensor-core decode (attention_decode_tc.cu): bf16 or f16 queries and a cache of the same
 * type or fp8, head_dim 128, block size a multiple of 8, a cache block's elements (all layers)
 * within 32 bits; HB heads a block. */
bool kc_decode_tc_ok(DType act, const KvLayout *l, const KvGeom &kg);
void kc_decode_tc(const DecodeLaunch &a, DType act, int HB);

#endif
