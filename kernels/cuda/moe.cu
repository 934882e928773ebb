/* moe.cu - the mixture-of-experts MLP (Mixtral, Qwen3-MoE): routing, grouping by expert, and
 * the choice of expert path. Graph-safe: nothing is allocated and the host never waits; every
 * grid is sized for the worst case and its spare blocks read the device-side counts and exit.
 *
 * Launches on the workspace (moe.cuh describes the routing it holds):
 *   route   one warp per (expert, 8 rows), 16 a block when it groups (else 4): router
 *           logits in fp32 (transformers rounds them to the model's dtype; fp32 keeps the
 *           picks those of the fp32 reference, where a 16-bit rounding would flip close
 *           ones); for n up to 16 the last block to finish (an arrival count) then routes
 *           and groups as `group` does (one row: its warp 0 alone), so a decode batch's
 *           routing is one launch; above 16 rows, with 32 experts or more and x and router of
 *           one 16-bit dtype, the logits run on tensor cores instead (moe_logits.cu);
 *   topk    (n > 16) a warp per row: fp32 softmax, top-k by repeated warp arg-max (the lower
 *           id first on ties), renormalization, the picks in increasing expert id;
 *   group   (n > 16) one block: the per-expert counts, the active experts, their offsets,
 *           each slot's position, and the tensor-core path's tile list;
 *   experts 16-bit activations and weights of the same dtype, H and I multiples of 8:
 *             n <= MOE_GEMV_MAX_ROWS: GEMVs over only the picked experts' rows (moe_gemv.cu),
 *             the combine in the down kernel;
 *             larger n: grouped GEMMs on tensor cores (moe_mma.cu), then `combine`, one thread
 *             per 8 outputs of a row summing its picks in increasing expert id;
 *           anything else (fp32): one warp per (slot, intermediate j) and per (row, output h).
 * Every path rounds g, u, silu(g) u and each expert's down dot to the act dtype and sums the
 * weighted experts in fp32 in increasing id, rounded once: the CPU op (kernels/cpu/moe.c) up to
 * the order of the K sums and these roundings. */
#include "gemv.cuh"
#include "moe.cuh"

enum {
    MOE_ALIGN = 256,
    MOE_GROUP_WARPS = 16,
    MOE_LOGIT_ROWS = 8,
    /* Routed batches with at least this many experts take the tensor-core logits: with
     * fewer the warp-per-expert kernel reads x only a few times, and Mixtral-8x7B's
     * batch-256 step was 2 % slower on tensor cores (H100, 17.97 against 17.55 ms). */
    MOE_TC_LOGITS_EXPERTS = 32,
    MOE_LOGIT_PRE = 16,       /* chunks a lane requested early by a grouping route kernel */
    MOE_LOGIT_PRE_ROUTED = 8, /* and by one that only computes logits (n > 16) */
    MOE_WARPS = 4
};

static size_t align_up(size_t b) {
    return (b + MOE_ALIGN - 1) / MOE_ALIGN * MOE_ALIGN;
}

/* The workspace's parts for `rows` rows (base NULL: only the size); act [n k, I] and y [n k, H]
 * in the act dtype follow the routing. */
static size_t moe_layout(char *base, MoeRouting *r, void **act, void **y, DType dt, int rows, int E,
                         int H, int I, int top_k) {
    const size_t slots = (size_t)rows * (size_t)top_k, es = pl_dtype_size(dt);
    const int max_tiles = moe_max_tiles((int)slots, E, MOE_MIN_TILE_ROWS);
    size_t off = 0;
    auto take = [&](size_t bytes) {
        char *p = base ? base + off : NULL;
        off += align_up(bytes);
        return p;
    };
    MoeRouting l;
    l.logits = (float *)take((size_t)rows * E * 4);
    l.ids = (int32_t *)take(slots * 4);
    l.weights = (float *)take(slots * 4);
    l.pos_of = (int32_t *)take(slots * 4);
    l.slot_at = (int32_t *)take(slots * 4);
    l.active = (int32_t *)take((size_t)E * 4);
    l.offset = (int32_t *)take((size_t)(E + 1) * 4);
    l.num_active = (int32_t *)take(4);
    l.num_tiles = (int32_t *)take(4);
    l.tile_a = (int32_t *)take((size_t)max_tiles * 4);
    l.tile_pos = (int32_t *)take((size_t)max_tiles * 4);
    l.max_tiles = max_tiles;
    void *a = take(slots * (size_t)I * es);
    void *yy = take(dt == DT_F32 ? 0 : slots * (size_t)H * es); /* the tensor-core path's */
    if (r)
        *r = l, *act = a, *y = yy;
    return off;
}

size_t k_cuda_moe_workspace_bytes(DType act, int max_rows, int num_experts, int hidden, int inter,
                                  int top_k) {
    if (max_rows <= 0 || top_k <= 0)
        return 0;
    return moe_layout(NULL, NULL, NULL, NULL, act, max_rows, num_experts, hidden, inter, top_k);
}

/* The warp's logits of expert e for rows t0 .. t0 + rows (pre: its first chunks, loaded). */
template <typename T, typename WT, int PRE>
__device__ __forceinline__ void router_logits(float *logits, const T *x, const WT *w,
                                              const uint4 (&pre)[PRE], int t0, int rows, int e,
                                              int E, int H, int vec) {
    constexpr bool wide = sizeof(WT) == 2;
    const int lane = threadIdx.x & 31;
    const T *xr = x + (size_t)t0 * H;
    float acc[MOE_LOGIT_ROWS] = {};
    auto dot_rows = [&](const float(&wf)[8], int c) {
#pragma unroll
        for (int i = 0; i < MOE_LOGIT_ROWS; i++)
            if (i < rows) {
                float xf[8];
                load8(xf, xr + (size_t)i * H + c);
#pragma unroll
                for (int q = 0; q < 8; q++)
                    acc[i] = fmaf(wf[q], xf[q], acc[i]);
            }
    };
    if (vec) { /* H % 8 == 0, 16-byte aligned rows; several loads in flight */
        int first = lane * 8;
        if constexpr (wide) {
            /* the prefetched chunks XB at a time, each row's XB chunks of x loaded together
             * first: x comes from the kernel before (L2), and one chunk at a time would wait
             * on it once per chunk (the sums are added in the same order) */
            constexpr int XB = 4;
#pragma unroll
            for (int i0 = 0; i0 < PRE; i0 += XB)
#pragma unroll
                for (int i = 0; i < MOE_LOGIT_ROWS; i++)
                    if (i < rows) {
                        float xf[XB][8];
#pragma unroll
                        for (int b = 0; b < XB; b++)
                            if ((lane + 32 * (i0 + b)) * 8 < H)
                                load8(xf[b], xr + (size_t)i * H + (lane + 32 * (i0 + b)) * 8);
#pragma unroll
                        for (int b = 0; b < XB; b++)
                            if ((lane + 32 * (i0 + b)) * 8 < H) {
                                float wf[8];
                                unpack8(wf, pre[i0 + b], (const WT *)0);
#pragma unroll
                                for (int q = 0; q < 8; q++)
                                    acc[i] = fmaf(wf[q], xf[b][q], acc[i]);
                            }
                    }
            first += PRE * 32 * 8;
        }
#pragma unroll 4
        for (int c = first; c < H; c += 32 * 8) {
            float wf[8];
            load8(wf, w + c);
            dot_rows(wf, c);
        }
    } else {
        for (int k = lane; k < H; k += 32) {
            const float wv = to_f32(w[k]);
#pragma unroll
            for (int i = 0; i < MOE_LOGIT_ROWS; i++)
                if (i < rows)
                    acc[i] = fmaf(wv, to_f32(xr[(size_t)i * H + k]), acc[i]);
        }
    }
#pragma unroll
    for (int i = 0; i < MOE_LOGIT_ROWS; i++)
        if (i < rows) {
            const float v = warp_sum(acc[i]);
            if (lane == 0)
                logits[(size_t)(t0 + i) * E + e] = v;
        }
}

/* Row t's top_k picks by the warp, PER_LANE experts a lane (E <= 32 PER_LANE): lane j < top_k
 * returns pick j's expert in *e and weight in *w, and its rank among the picks by increasing
 * expert id. */
template <int PER_LANE>
__device__ int route_row_lanes(const float *logits, int E, int top_k, int renormalize, int *e,
                               float *w) {
    const int lane = threadIdx.x & 31;
    float p[PER_LANE];
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < PER_LANE; i++) {
        const int ex = lane + 32 * i;
        p[i] = ex < E ? __ldcg(logits + ex) : -INFINITY; /* other blocks' */
        m = fmaxf(m, p[i]);
    }
    m = warp_max(m);
    float z = 0.0f;
#pragma unroll
    for (int i = 0; i < PER_LANE; i++) {
        p[i] = lane + 32 * i < E ? expf(p[i] - m) : 0.0f;
        z += p[i];
    }
    z = warp_sum(z);
#pragma unroll
    for (int i = 0; i < PER_LANE; i++)
        p[i] /= z;
    /* each pick: the largest probability's bits (>= 0, so they order as the floats do), then
     * the lowest id holding them; taken and absent experts are out of the running */
    uint32_t taken = 0;
    int my_e = 0;
    float my_p = 0.0f;
    for (int j = 0; j < top_k; j++) {
        uint32_t best = 0;
        bool any = false;
#pragma unroll
        for (int i = 0; i < PER_LANE; i++)
            if (lane + 32 * i < E && !(taken >> i & 1)) {
                best = max(best, __float_as_uint(p[i]));
                any = true;
            }
        /* a lane with candidates holds at least 0: +1 keeps "none" (0) below every real one */
        const uint32_t top = __reduce_max_sync(0xffffffffu, any ? best + 1 : 0u) - 1;
        uint32_t id = 0xffffffffu;
#pragma unroll
        for (int i = 0; i < PER_LANE; i++)
            if (lane + 32 * i < E && !(taken >> i & 1) && __float_as_uint(p[i]) == top)
                id = min(id, (uint32_t)(lane + 32 * i));
        const int ex = (int)__reduce_min_sync(0xffffffffu, id);
        if ((ex & 31) == lane)
            taken |= 1u << (ex >> 5);
        if (lane == j) {
            my_e = ex;
            my_p = __uint_as_float(top);
        }
    }
    float sum = 0.0f; /* in pick order, as the reference */
    int rank = 0;
    for (int j = 0; j < top_k; j++) {
        sum += __shfl_sync(0xffffffffu, my_p, j);
        rank += __shfl_sync(0xffffffffu, my_e, j) < my_e;
    }
    *e = my_e;
    *w = renormalize ? my_p / sum : my_p;
    return rank;
}

/* route_row_lanes with registers for E experts only (E <= MOE_MAX_EXPERTS). */
__device__ static int route_row(const float *logits, int E, int top_k, int renormalize, int *e,
                                float *w) {
    static_assert(MOE_MAX_EXPERTS <= 16 * 32, "route_row: more experts than its variants");
    if (E <= 32)
        return route_row_lanes<1>(logits, E, top_k, renormalize, e, w);
    if (E <= 64)
        return route_row_lanes<2>(logits, E, top_k, renormalize, e, w);
    if (E <= 128)
        return route_row_lanes<4>(logits, E, top_k, renormalize, e, w);
    if (E <= 256)
        return route_row_lanes<8>(logits, E, top_k, renormalize, e, w);
    return route_row_lanes<16>(logits, E, top_k, renormalize, e, w);
}

/* Rows' picks (a warp per row) into ids and weights, and per expert counts when `count`. */
__device__ static void route_rows(const MoeRouting &r, int first, int step, int n, int E, int top_k,
                                  int renormalize, int *count) {
    for (int t = first; t < n; t += step) {
        int e;
        float w;
        const int rank = route_row(r.logits + (size_t)t * E, E, top_k, renormalize, &e, &w);
        if ((threadIdx.x & 31) < top_k) {
            r.ids[t * top_k + rank] = e;
            r.weights[t * top_k + rank] = w;
            if (count)
                atomicAdd(&count[e], 1);
        }
    }
}

/* The picks of larger batches, a warp per row over many blocks (the group kernel then only
 * counts them). */
__global__ __launch_bounds__(32 * MOE_WARPS) void moe_topk_kernel(MoeRouting r, int n, int E,
                                                                  int top_k, int renormalize) {
    kc_pdl_wait();
    kc_pdl_trigger();
    route_rows(r, blockIdx.x * MOE_WARPS + (threadIdx.x >> 5), gridDim.x * MOE_WARPS, n, E, top_k,
               renormalize, NULL);
}

/* The grouping, by one block of MOE_GROUP_WARPS warps. routed: moe_topk_kernel has written
 * ids and weights; else this block routes the rows. */
__device__ static void group_block(const MoeRouting &r, int n, int E, int top_k, int renormalize,
                                   int tile_rows, int routed) {
    __shared__ int count[MOE_MAX_EXPERTS], cursor[MOE_MAX_EXPERTS], scratch[MOE_GROUP_WARPS + 1];
    const int tid = threadIdx.x, slots = n * top_k;
    for (int e = tid; e < E; e += blockDim.x)
        count[e] = 0;
    __syncthreads();
    if (routed)
        for (int s = tid; s < slots; s += blockDim.x)
            atomicAdd(&count[r.ids[s]], 1);
    else
        route_rows(r, tid >> 5, MOE_GROUP_WARPS, n, E, top_k, renormalize, count);
    __syncthreads();
    /* thread e (blockDim >= MOE_MAX_EXPERTS >= E): expert e's active index, offset, tiles */
    const int c = tid < E ? count[tid] : 0, tiles = (c + tile_rows - 1) / tile_rows;
    int num_active, total, num_tiles;
    const int a = block_scan<MOE_GROUP_WARPS>(c > 0 ? 1 : 0, &num_active, scratch);
    const int off = block_scan<MOE_GROUP_WARPS>(c, &total, scratch);
    const int first_tile = block_scan<MOE_GROUP_WARPS>(tiles, &num_tiles, scratch);
    if (c > 0) {
        r.active[a] = tid;
        r.offset[a] = off;
        cursor[tid] = off;
        for (int i = 0; i < tiles; i++) {
            r.tile_a[first_tile + i] = a;
            r.tile_pos[first_tile + i] = off + i * tile_rows;
        }
    }
    if (tid >= num_active && tid < min(E, slots))
        r.active[tid] = -1; /* no expert: the GEMV path's spare blocks exit on it */
    if (tid == 0) {
        *r.num_active = num_active;
        r.offset[num_active] = slots;
        *r.num_tiles = num_tiles;
    }
    __syncthreads();
    for (int s = tid; s < slots; s += blockDim.x) {
        const int p = atomicAdd(&cursor[r.ids[s]], 1);
        r.slot_at[p] = s;
        r.pos_of[s] = p;
    }
}

/* group_block's result for one row, by warp 0: the row's picks in increasing id are the
 * active experts, a position (and a tile) each. */
__device__ static void group_one_row(const MoeRouting &r, int E, int top_k, int renormalize) {
    if (threadIdx.x >= 32)
        return;
    int e;
    float w;
    const int lane = threadIdx.x, rank = route_row(r.logits, E, top_k, renormalize, &e, &w);
    if (lane < top_k) {
        r.ids[rank] = e;
        r.weights[rank] = w;
        r.pos_of[rank] = r.slot_at[rank] = rank;
        r.active[rank] = e;
        r.offset[rank] = r.tile_a[rank] = r.tile_pos[rank] = rank;
    }
    if (lane == 0) {
        *r.num_active = *r.num_tiles = top_k;
        r.offset[top_k] = top_k;
    }
}

__global__ __launch_bounds__(32 * MOE_GROUP_WARPS) void moe_group_kernel(MoeRouting r, int n, int E,
                                                                         int top_k, int renormalize,
                                                                         int tile_rows) {
    kc_pdl_wait();
    kc_pdl_trigger();
    group_block(r, n, E, top_k, renormalize, tile_rows, 1);
}

/* Bumped by each block of a grouping route kernel once its logits are stored; the last block
 * to arrive groups and puts it back to 0 (one count per device: MoE layers run one at a time
 * on a device, each kernel of the chain waiting for the one before). */
__device__ unsigned int moe_route_arrivals;

/* logits[t, e] = router[e] . x[t] in fp32; a warp per expert and up to 8 rows. A 16-bit
 * router row's first chunks a lane (all of it up to H = 4096 when grouping, 2048 otherwise)
 * are requested before the wait for x, so they stream in while the previous kernel drains.
 * GROUP (one block column of rows, n <= MOE_GROUP_WARPS, blocks of MOE_GROUP_WARPS warps):
 * the last block to finish routes the rows and groups them (group_block), saving a launch.
 * Without it (blocks of MOE_WARPS warps) the kernel keeps the register budget and the
 * shorter prefetch of a plain logits kernel: with the grouping kernel's, batches above 16
 * rows ran about 1 % slower (docs/PERFORMANCE.md, Mixture of experts). */
template <typename T, typename WT, bool GROUP>
__global__ __launch_bounds__(32 * (GROUP ? MOE_GROUP_WARPS : MOE_WARPS)) void moe_route_kernel(
    MoeRouting r, const T *x, const WT *router, int n, int E, int H, int vec, int top_k,
    int renormalize, int tile_rows) {
    constexpr bool wide = sizeof(WT) == 2;
    constexpr int PRE = GROUP ? MOE_LOGIT_PRE : MOE_LOGIT_PRE_ROUTED;
    const int lane = threadIdx.x & 31, e = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int t0 = blockIdx.y * MOE_LOGIT_ROWS, rows = min(MOE_LOGIT_ROWS, n - t0);
    const WT *w = router + (size_t)(e < E ? e : 0) * H;
    uint4 pre[PRE];
    if (wide && vec && e < E)
#pragma unroll
        for (int i = 0; i < PRE; i++)
            if ((lane + 32 * i) * 8 < H)
                pre[i] = ld_stream(w + (lane + 32 * i) * 8);
    kc_pdl_wait();
    kc_pdl_trigger();
    if (e < E)
        router_logits<T, WT, PRE>(r.logits, x, w, pre, t0, rows, e, E, H, vec);
    if (!GROUP)
        return;
    __shared__ int last;
    __threadfence(); /* this block's logits, before its arrival is counted */
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned blocks = gridDim.x * gridDim.y;
        last = atomicAdd(&moe_route_arrivals, 1u) == blocks - 1;
        if (last)
            moe_route_arrivals = 0;
    }
    __syncthreads();
    if (!last)
        return;
    __threadfence();
    if (n == 1)
        group_one_row(r, E, top_k, renormalize);
    else
        group_block(r, n, E, top_k, renormalize, tile_rows, 0);
}

/* The route kernel for n rows: routed (n > MOE_GROUP_WARPS), logits only, on tensor cores
 * (moe_logits.cu) where the dtypes, alignment and expert count suit it, else in blocks of
 * MOE_WARPS warps; not routed, logits, routing and grouping in blocks of MOE_GROUP_WARPS. */
template <typename T, typename RT>
static void launch_route(bool routed, const MoeRouting &r, const T *x, const RT *router, int n,
                         int E, int H, int vec, int top_k, int renormalize, int tile_rows,
                         cudaStream_t s) {
    if constexpr (std::is_same<T, RT>::value && sizeof(T) == 2)
        if (routed && vec && E >= MOE_TC_LOGITS_EXPERTS) {
            moe_logits_launch<T>(r.logits, x, router, n, E, H, s);
            return;
        }
    const int warps = routed ? MOE_WARPS : MOE_GROUP_WARPS;
    const dim3 grid((unsigned)((E + warps - 1) / warps),
                    (unsigned)((n + MOE_LOGIT_ROWS - 1) / MOE_LOGIT_ROWS));
    auto kernel = routed ? moe_route_kernel<T, RT, false> : moe_route_kernel<T, RT, true>;
    kc_launch_pdl(kernel, grid, dim3(32 * warps), 0, s, r, x, router, n, E, H, vec, top_k,
                  renormalize, tile_rows);
}

/* out[t, 8c..8c+8) = sum over t's picks (increasing id) of weight * y[position]. */
template <typename T>
__global__ __launch_bounds__(128) void moe_combine_kernel(T *out, const T *y, MoeRouting r, int H,
                                                          int top_k) {
    kc_pdl_wait();
    kc_pdl_trigger();
    const int t = blockIdx.x, c = (blockIdx.y * blockDim.x + threadIdx.x) * 8;
    if (c >= H)
        return;
    float acc[8] = {};
    for (int j = 0; j < top_k; j++) {
        const int s = t * top_k + j;
        const float w = r.weights[s];
        float v[8];
        load8(v, y + (size_t)r.pos_of[s] * H + c);
#pragma unroll
        for (int q = 0; q < 8; q++)
            acc[q] += w * v[q];
    }
    store8(out + (size_t)t * H + c, acc);
}

/* ---- the plain path (fp32 activations or weights, odd shapes) ---- */

/* sum over k < K of w[k] * x[k], the warp's lanes striding over k, reduced (every lane). */
template <typename WT, typename XT>
__device__ __forceinline__ float warp_dot(const WT *w, const XT *x, int K) {
    float acc = 0.0f;
    for (int k = threadIdx.x & 31; k < K; k += 32)
        acc = fmaf(to_f32(w[k]), to_f32(x[k]), acc);
    return warp_sum(acc);
}

template <typename T, typename WT>
__global__
__launch_bounds__(32 * MOE_WARPS) void moe_up_kernel(T *act, const T *x, const WT *gate_up,
                                                     const int32_t *ids, int H, int I, int top_k) {
    kc_pdl_wait();
    kc_pdl_trigger();
    const int s = blockIdx.x, j = blockIdx.y * MOE_WARPS + (threadIdx.x >> 5);
    if (j >= I)
        return;
    const size_t e = (size_t)ids[s];
    const T *xr = x + (size_t)(s / top_k) * H;
    const WT *g_row = gate_up + (e * 2 * I + (size_t)j) * H;
    const float g = to_f32(from_f32<T>(warp_dot(g_row, xr, H)));
    const float u = to_f32(from_f32<T>(warp_dot(g_row + (size_t)I * H, xr, H)));
    if ((threadIdx.x & 31) == 0)
        act[(size_t)s * I + j] = from_f32<T>(silu_times(g, u));
}

template <typename T, typename WT>
__global__
__launch_bounds__(32 * MOE_WARPS) void moe_down_kernel(T *out, const T *act, const WT *down,
                                                       const int32_t *ids, const float *weights,
                                                       int H, int I, int top_k) {
    kc_pdl_wait();
    kc_pdl_trigger();
    const int t = blockIdx.x, h = blockIdx.y * MOE_WARPS + (threadIdx.x >> 5);
    if (h >= H)
        return;
    float acc = 0.0f;
    for (int k = 0; k < top_k; k++) {
        const size_t s = (size_t)t * top_k + k, e = (size_t)ids[s];
        const float d = warp_dot(down + (e * H + (size_t)h) * I, act + s * I, I);
        acc += weights[s] * to_f32(from_f32<T>(d));
    }
    if ((threadIdx.x & 31) == 0)
        out[(size_t)t * H + h] = from_f32<T>(acc);
}

template <typename T>
static void plain_experts(T *out, const T *x, T *act, const Tensor *gate_up, const Tensor *down,
                          const MoeRouting &r, int n, int H, int I, int top_k, cudaStream_t s) {
    const dim3 up_grid((unsigned)(n * top_k), (unsigned)((I + MOE_WARPS - 1) / MOE_WARPS));
    const dim3 down_grid((unsigned)n, (unsigned)((H + MOE_WARPS - 1) / MOE_WARPS));
    KC_DISPATCH_WEIGHT(
        gate_up->dtype, "k_cuda_moe_mlp", WT,
        kc_launch_pdl(moe_up_kernel<T, WT>, up_grid, dim3(32 * MOE_WARPS), 0, s, act, x,
                      (const WT *)gate_up->data, (const int32_t *)r.ids, H, I, top_k);
        kc_launch_pdl(moe_down_kernel<T, WT>, down_grid, dim3(32 * MOE_WARPS), 0, s, out,
                      (const T *)act, (const WT *)down->data, (const int32_t *)r.ids,
                      (const float *)r.weights, H, I, top_k));
}

/* The experts on the routing: the GEMVs (decode batches), the grouped GEMMs and the combine,
 * or the plain path (`fast`: 16-bit activations and weights of one dtype, H and I multiples of
 * 8, 16-byte aligned operands). */
template <typename T>
static void run_experts(T *out, const T *x, T *act, T *y, const Tensor *gate_up, const Tensor *down,
                        const MoeRouting &r, int n, int E, int H, int I, int top_k, bool fast,
                        cudaStream_t s) {
    if constexpr (!std::is_same<T, float>::value) {
        const T *gu = (const T *)gate_up->data, *dw = (const T *)down->data;
        if (fast && n <= MOE_GEMV_MAX_ROWS) {
            moe_gemv_launch<T>(out, x, act, gu, dw, r, n, E, H, I, top_k, s);
            return;
        }
        if (fast) {
            moe_mma_launch<T>(act, y, x, gu, dw, r, n, E, H, I, top_k, s);
            kc_launch_pdl(moe_combine_kernel<T>, dim3((unsigned)n, (unsigned)((H / 8 + 127) / 128)),
                          dim3(128), 0, s, out, (const T *)y, r, H, top_k);
            return;
        }
    }
    plain_experts<T>(out, x, act, gate_up, down, r, n, H, I, top_k, s);
}

void k_cuda_moe_mlp(void *out, const void *x, DType act, const Tensor *router,
                    const Tensor *gate_up, const Tensor *down, int n, int top_k, int renormalize,
                    void *workspace, size_t workspace_bytes, void *stream) {
    const char *what = "k_cuda_moe_mlp";
    KC_REQUIRE(router && gate_up && down && router->ndim == 2 && gate_up->ndim == 3 &&
                   down->ndim == 3,
               "%s: router [E, H], gate_up [E, 2I, H] and down [E, H, I] expected", what);
    const int E = (int)router->shape[0], H = (int)router->shape[1], I = (int)down->shape[2];
    KC_REQUIRE(gate_up->shape[0] == E && gate_up->shape[1] == 2 * (int64_t)I &&
                   gate_up->shape[2] == H && down->shape[0] == E && down->shape[1] == H,
               "%s: expert shapes do not match the router's [%d, %d]", what, E, H);
    KC_REQUIRE(E <= MOE_MAX_EXPERTS && top_k >= 1 && top_k <= E && top_k <= MOE_MAX_TOP_K,
               "%s: %d experts, top %d (at most %d experts and top %d)", what, E, top_k,
               MOE_MAX_EXPERTS, MOE_MAX_TOP_K);
    KC_REQUIRE(gate_up->dtype == down->dtype, "%s: gate_up and down differ in dtype", what);
    if (n <= 0)
        return;
    KC_REQUIRE(workspace_bytes >= k_cuda_moe_workspace_bytes(act, n, E, H, I, top_k),
               "%s: workspace of %zu bytes is too small for %d rows", what, workspace_bytes, n);
    MoeRouting r;
    void *a, *y;
    moe_layout((char *)workspace, &r, &a, &y, act, n, E, H, I, top_k);
    cudaStream_t s = kc_stream(stream);
    const bool fast = act != DT_F32 && gate_up->dtype == act && H % 8 == 0 && I % 8 == 0 &&
                      kc_aligned16(x) && kc_aligned16(out) && kc_aligned16(gate_up->data) &&
                      kc_aligned16(down->data);
    const int tile_rows =
        fast && n > MOE_GEMV_MAX_ROWS ? moe_mma_tile_rows(n, top_k, E) : n * top_k;
    const bool routed = n > MOE_GROUP_WARPS; /* more rows than the group block's warps */
    const bool vec = H % 8 == 0 && kc_aligned16(x) && kc_aligned16(router->data);
    KC_DISPATCH_ACT(
        act, what, T,
        KC_DISPATCH_WEIGHT(router->dtype, what, RT,
                           launch_route<T, RT>(routed, r, (const T *)x, (const RT *)router->data, n,
                                               E, H, (int)vec, top_k, renormalize, tile_rows, s)));
    if (routed) {
        kc_launch_pdl(moe_topk_kernel, dim3((unsigned)((n + MOE_WARPS - 1) / MOE_WARPS)),
                      dim3(32 * MOE_WARPS), 0, s, r, n, E, top_k, renormalize);
        kc_launch_pdl(moe_group_kernel, dim3(1), dim3(32 * MOE_GROUP_WARPS), 0, s, r, n, E, top_k,
                      renormalize, tile_rows);
    }
    KC_DISPATCH_ACT(act, what, T,
                    run_experts<T>((T *)out, (const T *)x, (T *)a, (T *)y, gate_up, down, r, n, E,
                                   H, I, top_k, fast, s));
}
