/* matmul_fp8_sm90a.cu - the fp8 matmul of a small decode batch (KC_F8W_MIN_ROWS to
 * KC_F8W_MAX_ROWS rows) on Hopper's fp8 tensor cores: out[n, N] = dot(q, w) * (s_x s_w)
 * (+ bias), matmul's fp8 semantics (matmul_fp8.cu), for x already quantized (q [n, K] e4m3 and
 * one scale a row, written by f8_quant_kernel or by the op that made x) and an e4m3 w [N, K]
 * with a per-tensor or per-channel scale.
 *
 * Why: matmul_fp8.cu's GEMV runs an e4m3 mma.sync, which sm_90 executes by widening both
 * operands to f16, on 8 rows of x whatever n is; its time grows with n (at 8 rows 1.4-1.6x its
 * 1-row time on Llama-3-8B's gate-up and down projections, an H100). Here the tensor copy engine
 * streams the weights and wgmma multiplies e4m3 as it is, so 8 rows cost what 1 does
 * (docs/PERFORMANCE.md: the fp8 batch-8 decode step 18 % shorter on an H100). At 1-3 rows the GEMV
 * stays faster.
 *
 * The work: w in tiles of 128 rows, each tile's K in units of 512 columns (four 128-column
 * boxes side by side: 512 contiguous bytes of each weight row a stage). All tiles' units, tile
 * by tile, are cut into one contiguous range per block, the grid at most one block an SM
 * ("stream-K"): every SM streams the same bytes whatever the tile count. A block is three
 * warpgroups: warpgroup 0's first thread streams its units through a ring of stages (the
 * unit's four 128 x 128 weight boxes and four 8 x 128 boxes of q, rows past n zero-filled), the
 * first stages' weights requested before the PDL wait; warpgroups 1 and 2 each multiply 64 of
 * the weight rows by the 8 rows of q with wgmma m64n8k32, each box's sum from zero and added to
 * fp32 registers (as the GEMV: the tensor cores' accumulation spans 128 products at most). A
 * tile inside one block's range is stored by that block. A tile cut between blocks has each of
 * them leave its sums in a workspace slot and count itself in; the last to arrive adds the
 * slots in block order and stores, so the result does not depend on which block came last. */
#include <cuda.h>

#include "sm90a.cuh"

#if PAGELLM_SM90A

namespace {

constexpr int F8W_ROWS = 128; /* weight rows of a tile: two consumer warpgroups */
constexpr int F8W_BOX = 128;  /* K columns of a box: one 128-byte swizzled row */
constexpr int F8W_BOXES = 4;  /* boxes side by side in K a stage: 512 bytes of each weight row */
constexpr int F8W_UNIT = F8W_BOX * F8W_BOXES; /* K columns of a unit (a stage) */
constexpr int F8W_W_BOX = F8W_ROWS * F8W_BOX, F8W_X_BOX = KC_F8W_MAX_ROWS * F8W_BOX;
constexpr int F8W_W_BYTES = F8W_BOXES * F8W_W_BOX;
constexpr int F8W_STAGE_BYTES = F8W_W_BYTES + F8W_BOXES * F8W_X_BOX;
constexpr int F8W_STAGES = ring_stages(F8W_STAGE_BYTES);
constexpr int F8W_SLOT_FLOATS = 2 * 128 * 4; /* a tile's sums: 4 a consumer thread */
static_assert(F8W_W_BOX % 1024 == 0 && F8W_X_BOX == 1024, "boxes on 1024-byte boundaries");

struct F8wArgs {
    void *out;
    const float *xs;      /* [n] the rows' scales */
    const float *w_scale; /* [N] per channel, [1] per tensor */
    const void *bias;     /* NULL: none */
    float *part;          /* [blocks][2] slots of F8W_SLOT_FLOATS */
    unsigned *arrivals;   /* [tiles], zero between launches */
    int bias_dt, channel, n, N, units_per_tile, units;
};

/* d[64 x 8] (+)= a[64 x 32] b[8 x 32]^T in e4m3, both K-major from shared memory; scale_d 0
 * overwrites d. */
__device__ __forceinline__ void wgmma_e4m3_n8(float (&d)[4], uint64_t da, uint64_t db,
                                              int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, %4, %5, "
                 "p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "l"(da), "l"(db), "r"(scale_d));
}

/* The first unit of block b's range, of `blocks` over `units` (b = blocks: the end). */
__device__ __forceinline__ int range_start(int b, int blocks, int units) {
    return (int)((int64_t)b * units / blocks);
}

/* The block whose range holds unit u. */
__device__ __forceinline__ int range_owner(int u, int blocks, int units) {
    return (int)((((int64_t)u + 1) * blocks - 1) / units);
}

/* Named barrier of the two consumer warpgroups (the producer warpgroup has left). */
__device__ __forceinline__ void consumers_sync(void) {
    asm volatile("bar.sync 1, 256;" ::: "memory");
}

/* Stores sums v (fragment layout of m64n8: element 2 h + j of consumer thread ct is weight row
 * 64 (ct / 128) + 16 (warp) + lane / 4 + 8 h of tile t, row of x 2 (lane % 4) + j) as out. */
template <typename XT>
__device__ __forceinline__ void store_tile(const F8wArgs &a, const float (&v)[4], int t, int ct) {
    const int lane = ct % 32, r0 = t * F8W_ROWS + ct / 32 * 16 + lane / 4;
#pragma unroll
    for (int f = 0; f < 4; f++) {
        const int row = r0 + 8 * (f >> 1), col = 2 * (lane % 4) + (f & 1);
        if (row >= a.N || col >= a.n)
            continue;
        float o = v[f] * (a.xs[col] * (a.channel ? a.w_scale[row] : a.w_scale[0]));
        if (a.bias)
            o += load_any(a.bias, a.bias_dt, row);
        ((XT *)a.out)[(size_t)col * a.N + row] = from_f32<XT>(o);
    }
}

/* Tile t's sums of this block (units [u0, u1) of it): stored, or left in slot `slot` and, by
 * the last of the tile's blocks to arrive, all slots added in block order and stored. */
template <typename XT>
__device__ void finish_tile(const F8wArgs &a, float (&v)[4], int t, int u0, int u1, int slot,
                            int ct) {
    const int ut = a.units_per_tile, t0 = t * ut;
    if (u0 == t0 && u1 == t0 + ut) {
        store_tile<XT>(a, v, t, ct);
        return;
    }
    __shared__ int last;
    float4 *mine = (float4 *)(a.part + ((size_t)blockIdx.x * 2 + slot) * F8W_SLOT_FLOATS) + ct;
    *mine = make_float4(v[0], v[1], v[2], v[3]);
    const int b0 = range_owner(t0, gridDim.x, a.units);
    const int b1 = range_owner(t0 + ut - 1, gridDim.x, a.units);
    __threadfence(); /* the slot, before the arrival is counted */
    consumers_sync();
    if (ct == 0) {
        last = atomicAdd(&a.arrivals[t], 1u) == (unsigned)(b1 - b0);
        if (last)
            a.arrivals[t] = 0;
    }
    consumers_sync();
    if (!last)
        return;
    __threadfence();
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int b = b0; b <= b1; b++) {
        /* block b's slot of tile t: 0 when t is its first tile, else 1 */
        const int bs = range_start(b, gridDim.x, a.units) / ut == t ? 0 : 1;
        const float4 p =
            __ldcg((const float4 *)(a.part + ((size_t)b * 2 + bs) * F8W_SLOT_FLOATS) + ct);
        s[0] += p.x;
        s[1] += p.y;
        s[2] += p.z;
        s[3] += p.w;
    }
    store_tile<XT>(a, s, t, ct);
}

template <typename XT>
__global__ void __launch_bounds__(WS_THREADS, 1)
    f8w_kernel(const __grid_constant__ CUtensorMap map_w, const __grid_constant__ CUtensorMap map_q,
               F8wArgs a) {
    extern __shared__ uint8_t f8w_smem_raw[];
    uint8_t *smem = ring_base(f8w_smem_raw);
    uint64_t *full = (uint64_t *)(smem + F8W_STAGES * F8W_STAGE_BYTES);
    uint64_t *empty = full + F8W_STAGES;
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    const int lo = range_start(blockIdx.x, gridDim.x, a.units);
    const int hi = range_start(blockIdx.x + 1, gridDim.x, a.units);
    const int ut = a.units_per_tile, count = hi - lo;

    ring_init(full, empty, F8W_STAGES, WS_CONSUMER_WARPS);
    __syncthreads();

    if (wg == 0) {
        if (tid != 0) {
            kc_pdl_wait();
            kc_pdl_trigger();
            return;
        }
        const uint64_t stream = l2_policy_evict_normal(), keep = l2_policy_evict_last();
        /* the weights do not depend on the kernels before: the first stages' boxes go now */
        const int pre = count < F8W_STAGES ? count : F8W_STAGES;
        auto load_w = [&](int i) {
            const int s = i % F8W_STAGES, u = lo + i;
            for (int b = 0; b < F8W_BOXES; b++)
                tma_load(smem + s * F8W_STAGE_BYTES + b * F8W_W_BOX, &map_w,
                         u % ut * F8W_UNIT + b * F8W_BOX, u / ut * F8W_ROWS, &full[s], stream);
        };
        auto load_q = [&](int i) {
            const int s = i % F8W_STAGES, u = lo + i;
            for (int b = 0; b < F8W_BOXES; b++)
                tma_load(smem + s * F8W_STAGE_BYTES + F8W_W_BYTES + b * F8W_X_BOX, &map_q,
                         u % ut * F8W_UNIT + b * F8W_BOX, 0, &full[s], keep);
        };
        for (int i = 0; i < pre; i++) {
            mbar_expect_tx(&full[i], F8W_STAGE_BYTES);
            load_w(i);
        }
        kc_pdl_wait();
        kc_pdl_trigger();
        for (int i = 0; i < pre; i++)
            load_q(i);
        for (int i = pre; i < count; i++) {
            const int s = i % F8W_STAGES;
            mbar_wait(&empty[s], ((i / F8W_STAGES) & 1) ^ 1);
            mbar_expect_tx(&full[s], F8W_STAGE_BYTES);
            load_w(i);
            load_q(i);
        }
        return;
    }
    kc_pdl_wait();
    kc_pdl_trigger();
    const int c = wg - 1, ct = c * 128 + tid, lane = tid % 32;
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f}, d[F8W_BOXES][4] = {};
    int u0 = lo; /* the first unit of the current tile in this block */
    for (int i = 0; i < count; i++) {
        const int s = i % F8W_STAGES, u = lo + i;
        const uint8_t *st = smem + s * F8W_STAGE_BYTES;
        mbar_wait(&full[s], (i / F8W_STAGES) & 1);
#pragma unroll
        for (int b = 0; b < F8W_BOXES; b++) { /* a group of MMAs a box, each box's sum from 0 */
            const uint64_t dw = smem_desc(st + b * F8W_W_BOX + c * 64 * F8W_BOX);
            const uint64_t dq = smem_desc(st + F8W_W_BYTES + b * F8W_X_BOX);
            acc_fence(d[b]);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) /* k32 steps of 32 bytes: 2 in descriptor units */
                wgmma_e4m3_n8(d[b], dw + (uint64_t)(kk * 2), dq + (uint64_t)(kk * 2), kk > 0);
            wgmma_commit();
        }
        wgmma_wait<0>();
#pragma unroll
        for (int b = 0; b < F8W_BOXES; b++) {
            acc_fence(d[b]);
#pragma unroll
            for (int f = 0; f < 4; f++)
                sum[f] += d[b][f];
        }
        if (lane == 0)
            mbar_arrive(&empty[s]);
        if ((u + 1) % ut == 0 || u + 1 == hi) {
            const int t = u / ut;
            finish_tile<XT>(a, sum, t, u0, u + 1, t == lo / ut ? 0 : 1, ct);
            u0 = u + 1;
#pragma unroll
            for (int f = 0; f < 4; f++)
                sum[f] = 0.0f;
        }
    }
}

template <typename XT>
void launch(void *out, const uint8_t *q, const float *xs, const Tensor *w, const Tensor *bias,
            int n, float *part, unsigned *arrivals, cudaStream_t s) {
    const int N = (int)w->shape[0], K = (int)w->shape[1];
    const int tiles = (N + F8W_ROWS - 1) / F8W_ROWS, upt = (K + F8W_UNIT - 1) / F8W_UNIT;
    F8wArgs a;
    a.out = out;
    a.xs = xs;
    a.w_scale = w->fp8.w_scale;
    a.bias = bias ? bias->data : NULL;
    a.bias_dt = bias ? (int)bias->dtype : 0;
    a.channel = w->fp8.kind == FP8_SCALE_CHANNEL;
    a.part = part;
    a.arrivals = arrivals;
    a.n = n;
    a.N = N;
    a.units_per_tile = upt;
    a.units = tiles * upt;
    const int blocks = a.units < kc_sm_count() ? a.units : kc_sm_count();
    const CUtensorMap mw = kc_tensor_map_8bit(w->data, N, K, K, F8W_ROWS);
    const CUtensorMap mq = kc_tensor_map_8bit(q, n, K, K, KC_F8W_MAX_ROWS);
    constexpr size_t smem = ring_smem_bytes(F8W_STAGE_BYTES);
    kc_set_smem(f8w_kernel<XT>, smem);
    kc_launch_pdl(f8w_kernel<XT>, dim3((unsigned)blocks), dim3(WS_THREADS), smem, s, mw, mq, a);
}

} // namespace

bool kc_f8w_takes(DType act, const Tensor *w, int n) {
    const int kind = (int)w->fp8.kind;
    return k_cuda_wgmma_available() && (act == DT_BF16 || act == DT_F16) && n >= KC_F8W_MIN_ROWS &&
           n <= KC_F8W_MAX_ROWS && (kind == FP8_SCALE_TENSOR || kind == FP8_SCALE_CHANNEL) &&
           w->shape[1] % 16 == 0 && (w->shape[0] + F8W_ROWS - 1) / F8W_ROWS <= KC_F8W_TILES &&
           (w->shape[1] + F8W_UNIT - 1) / F8W_UNIT * KC_F8W_TILES <= INT32_MAX &&
           (size_t)kc_sm_count() * 2 * F8W_SLOT_FLOATS <= KC_F8W_PART_FLOATS;
}

void kc_f8w_matmul(void *out, const uint8_t *q, const float *xs, DType act, const Tensor *w,
                   const Tensor *bias, int n, float *part, unsigned *arrivals, cudaStream_t s) {
    if (act == DT_BF16)
        launch<bf16>(out, q, xs, w, bias, n, part, arrivals, s);
    else
        launch<f16>(out, q, xs, w, bias, n, part, arrivals, s);
    CUDA_CHECK_LAUNCH();
}

#else /* not built for sm_90a */

bool kc_f8w_takes(DType, const Tensor *, int) {
    return false;
}

void kc_f8w_matmul(void *, const uint8_t *, const float *, DType, const Tensor *, const Tensor *,
                   int, float *, unsigned *, cudaStream_t) {
    KC_REQUIRE(0, "k_cuda_matmul: the fp8 wgmma kernel is not built (configure for sm_90)");
}

#endif
