/* moe_sm90a.cu - the grouped expert GEMMs of moe_mma.cu on Hopper (moe_wgmma_try): wgmma from
 * shared memory that the tensor copy engine (TMA) fills, for 16-bit experts. Built only for
 * sm_90a (PAGELLM_SM90A, as gemm_sm90a.cu) and run where k_cuda_wgmma_available(); elsewhere
 * moe_mma.cu's mma.sync kernels take the batch.
 *
 * Why: moe_mma.cu's blocks stage both operands through registers (ldmatrix) and read each
 * tile's activation rows once per 128 weight rows; here the weights stream through a ring of
 * stages by TMA alone, the MMAs read both operands from shared memory, and a block covers 256
 * weight rows.
 *
 * The activations first go in expert order: a gather copies x[row of pos] to xg[pos] (in the
 * workspace's y, free until the down GEMM writes it), so that a tile's rows are one TMA box.
 * A block takes one tile of the routing's tile list (BN = 64 or 96 positions, of which
 * the tile's `rows` are its own) by 256 weight rows, in three warpgroups: warpgroup 0's first
 * thread streams K in 64-element slices, each stage four 64-row weight boxes and the tile's
 * BN-row activation box (128-byte swizzle) completing on a `full` mbarrier; warpgroups 1 and 2
 * each multiply two of the weight boxes (wgmma m64nBNk16, both operands K-major in shared
 * memory) into two accumulators, keep one group of MMAs in flight and give a stage back on its
 * `empty` mbarrier when the group that read it has completed.
 *   up    warpgroup c's boxes are gate rows j0 + 64 c .. + 63 of the expert and the up rows of
 *         the same j (I rows further): act[pos, j] = silu(g) u, each rounded to T;
 *   down  its boxes are rows h0 + 128 c .. + 127 of the expert's down projection against act:
 *         y[pos, h] rounded to T.
 * Only tiles of 64 and 96 rows come here (moe_wgmma_try says why).
 * Box rows past the expert's own (an I or H not a multiple of 64) are computed and not
 * stored; rows and K past the tensors' ends are zero-filled by the copy engine. Results
 * differ from moe_mma.cu's only in the order the K products are summed. */
#include "moe.cuh"
#include "sm90a.cuh"

#if PAGELLM_SM90A

namespace {

constexpr int MW_BOX_ROWS = 64;
constexpr int MW_BOX_BYTES = MW_BOX_ROWS * ROW_BYTES, MW_A_BYTES = 4 * MW_BOX_BYTES;

template <int BN> __host__ __device__ constexpr int mw_stage_bytes() {
    return MW_A_BYTES + BN * ROW_BYTES;
}

WGMMA_DEFINE(96, WG_REGS_48, WG_D48, 48, 49, 50)

template <typename T, int BN>
__device__ __forceinline__ void wgmma_tile(float (&d)[BN / 2], uint64_t da, uint64_t db,
                                           int scale_d) {
    if constexpr (BN == 64)
        wgmma_n64<T>(d, da, db, scale_d);
    else
        wgmma_n96<T>(d, da, db, scale_d);
}

/* xg[pos] = x[row of pos's slot], 16 bytes a thread at a time (H % 8 == 0). */
template <typename T>
__global__ void __launch_bounds__(128)
    moe_gather_kernel(T *xg, const T *x, const int32_t *slot_at, int H, int top_k) {
    kc_pdl_wait();
    kc_pdl_trigger();
    const int p = blockIdx.x;
    const uint4 *src = (const uint4 *)(x + (size_t)(slot_at[p] / top_k) * H);
    uint4 *dst = (uint4 *)(xg + (size_t)p * H);
    for (int i = threadIdx.x; i < H / 8; i += blockDim.x)
        dst[i] = src[i];
}

/* out[pos, col] for the tile blockIdx.x of the routing and weight rows of block row blockIdx.y
 * (file comment); map_w: the experts' weights as [E rows_per_expert, K], map_x: the activations
 * in position order as [slots, K]; N: out's width (I up, H down). */
template <typename T, int BN, bool UP>
__global__ void __launch_bounds__(WS_THREADS, 1)
    moe_wgmma_kernel(const __grid_constant__ CUtensorMap map_w,
                     const __grid_constant__ CUtensorMap map_x, T *__restrict__ out, MoeRouting r,
                     int N, int K) {
    constexpr int STAGE_BYTES = mw_stage_bytes<BN>(), STAGES = ring_stages(STAGE_BYTES);
    static_assert((BN * ROW_BYTES) % 1024 == 0 && BN <= 256, "tiles on 1024-byte boundaries");
    extern __shared__ uint8_t mw_smem_raw[];
    uint8_t *smem = ring_base(mw_smem_raw);
    uint64_t *full = (uint64_t *)(smem + STAGES * STAGE_BYTES);
    uint64_t *empty = full + STAGES;
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;

    ring_init(full, empty, STAGES, WS_CONSUMER_WARPS);
    __syncthreads();
    kc_pdl_wait();
    kc_pdl_trigger();
    const int tile = blockIdx.x;
    if (tile >= *r.num_tiles)
        return;
    const int a = r.tile_a[tile], pos0 = r.tile_pos[tile];
    const int rows = min(BN, r.offset[a + 1] - pos0);
    const int e = r.active[a], kb_count = (K + BK - 1) / BK;

    if (wg == 0) {
        if (tid == 0) {
            /* a tile's activations are re-read by every block row: kept in L2 */
            const uint64_t keep = l2_policy_evict_last(), normal = l2_policy_evict_normal();
            int wrow[4]; /* the first weight row of each box */
            for (int b = 0; b < 4; b++)
                wrow[b] = UP ? e * 2 * N + (b & 1) * N + (int)blockIdx.y * 128 + (b >> 1) * 64
                             : e * N + (int)blockIdx.y * 256 + b * 64;
            for (int kb = 0; kb < kb_count; kb++) {
                const int s = kb % STAGES;
                uint8_t *as = smem + s * STAGE_BYTES;
                mbar_wait(&empty[s], ((kb / STAGES) & 1) ^ 1);
                mbar_expect_tx(&full[s], STAGE_BYTES);
                for (int b = 0; b < 4; b++)
                    tma_load(as + b * MW_BOX_BYTES, &map_w, kb * BK, wrow[b], &full[s], normal);
                tma_load(as + MW_A_BYTES, &map_x, kb * BK, pos0, &full[s], keep);
            }
        }
        return;
    }
    const int c = wg - 1, warp = tid / 32, lane = tid % 32;
    float acc0[BN / 2], acc1[BN / 2];
    for (int kb = 0; kb < kb_count; kb++) {
        const int s = kb % STAGES;
        const uint8_t *as = smem + s * STAGE_BYTES;
        mbar_wait(&full[s], (kb / STAGES) & 1);
        const uint64_t d0 = smem_desc(as + 2 * c * MW_BOX_BYTES);
        const uint64_t d1 = smem_desc(as + (2 * c + 1) * MW_BOX_BYTES);
        const uint64_t dx = smem_desc(as + MW_A_BYTES);
        acc_fence(acc0);
        acc_fence(acc1);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            const int keep = kb > 0 || kk > 0;
            wgmma_tile<T, BN>(acc0, d0 + (uint64_t)(kk * 2), dx + (uint64_t)(kk * 2), keep);
            wgmma_tile<T, BN>(acc1, d1 + (uint64_t)(kk * 2), dx + (uint64_t)(kk * 2), keep);
        }
        wgmma_commit();
        acc_fence(acc0);
        acc_fence(acc1);
        wgmma_wait<1>();
        if (kb > 0 && lane == 0)
            mbar_arrive(&empty[(kb - 1) % STAGES]);
    }
    wgmma_wait<0>();
    acc_fence(acc0);
    acc_fence(acc1);
    /* fragment layout of m64nBN: element 4 i + 2 h + q of a thread is box row warp 16 + lane / 4
     * + 8 h, tile position 8 i + 2 (lane % 4) + q */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int rr = warp * 16 + lane / 4 + 8 * h;
#pragma unroll
        for (int i = 0; i < BN / 8; i++)
#pragma unroll
            for (int q = 0; q < 2; q++) {
                const int col = 8 * i + 2 * (lane % 4) + q, f = 4 * i + 2 * h + q;
                if (col >= rows)
                    continue;
                T *orow = out + (size_t)(pos0 + col) * N;
                if (UP) {
                    const int j = (int)blockIdx.y * 128 + c * 64 + rr;
                    if (j < N) {
                        const float g = to_f32(from_f32<T>(acc0[f]));
                        const float u = to_f32(from_f32<T>(acc1[f]));
                        orow[j] = from_f32<T>(silu_times(g, u));
                    }
                } else {
                    const int h0 = (int)blockIdx.y * 256 + c * 128 + rr;
                    if (h0 < N)
                        orow[h0] = from_f32<T>(acc0[f]);
                    if (h0 + 64 < N)
                        orow[h0 + 64] = from_f32<T>(acc1[f]);
                }
            }
    }
}

template <typename T, int BN, bool UP>
void launch_gemm(T *out, const T *w, const T *xs, DType dt, const MoeRouting &r, int slots,
                 int tiles, int E, int N, int K, cudaStream_t s) {
    const int64_t w_rows = (int64_t)E * (UP ? 2 : 1) * N;
    const CUtensorMap mw = kc_tensor_map_16bit(w, dt, w_rows, K, K, MW_BOX_ROWS);
    const CUtensorMap mx = kc_tensor_map_16bit(xs, dt, slots, K, K, BN);
    auto kernel = moe_wgmma_kernel<T, BN, UP>;
    constexpr size_t smem = ring_smem_bytes(mw_stage_bytes<BN>());
    kc_set_smem(kernel, smem);
    const int block_rows = UP ? 128 : 256;
    kc_launch_pdl(kernel, dim3((unsigned)tiles, (unsigned)((N + block_rows - 1) / block_rows)),
                  dim3(WS_THREADS), smem, s, mw, mx, out, r, N, K);
}

template <typename T, int BN>
void launch_experts(T *act, T *y, const T *x, const T *gate_up, const T *down, const MoeRouting &r,
                    int n, int tiles, int E, int H, int I, int top_k, cudaStream_t s) {
    const DType dt = std::is_same<T, bf16>::value ? DT_BF16 : DT_F16;
    const int slots = n * top_k;
    kc_launch_pdl(moe_gather_kernel<T>, dim3((unsigned)slots), dim3(128), 0, s, y, x,
                  (const int32_t *)r.slot_at, H, top_k);
    launch_gemm<T, BN, true>(act, gate_up, y, dt, r, slots, tiles, E, I, H, s);
    launch_gemm<T, BN, false>(y, down, act, dt, r, slots, tiles, E, H, I, s);
}

} // namespace

template <typename T>
bool moe_wgmma_try(T *act, T *y, const T *x, const T *gate_up, const T *down, const MoeRouting &r,
                   int n, int E, int H, int I, int top_k, int tile_rows, int tiles,
                   cudaStream_t s) {
    /* TMA: row pitches of 16-byte multiples, weight row coordinates within int */
    if (!k_cuda_wgmma_available() || H % 8 != 0 || I % 8 != 0 ||
        (int64_t)E * 2 * I > INT32_MAX - 256 || (int64_t)E * H > INT32_MAX - 256)
        return false;
    /* Tiles of 16 and 32 rows stay on mma.sync: on an H200 this kernel with them made
     * Qwen3-30B-A3B's batch-256 decode step 8 % slower (22.57 against 20.84 ms), where
     * Mixtral-8x7B's, on 96-row tiles, took 11 % less (30.47 against 34.30 ms). */
    if (tile_rows == 64)
        launch_experts<T, 64>(act, y, x, gate_up, down, r, n, tiles, E, H, I, top_k, s);
    else if (tile_rows == 96)
        launch_experts<T, 96>(act, y, x, gate_up, down, r, n, tiles, E, H, I, top_k, s);
    else
        return false;
    return true;
}

#else /* not built for sm_90a */

template <typename T>
bool moe_wgmma_try(T *, T *, const T *, const T *, const T *, const MoeRouting &, int, int, int,
                   int, int, int, int, cudaStream_t) {
    return false;
}

#endif

template bool moe_wgmma_try<bf16>(bf16 *, bf16 *, const bf16 *, const bf16 *, const bf16 *,
                                  const MoeRouting &, int, int, int, int, int, int, int,
                                  cudaStream_t);
template bool moe_wgmma_try<f16>(f16 *, f16 *, const f16 *, const f16 *, const f16 *,
                                 const MoeRouting &, int, int, int, int, int, int, int,
                                 cudaStream_t);
