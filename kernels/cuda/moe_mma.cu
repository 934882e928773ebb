/* moe_mma.cu - the experts of larger batches: grouped GEMMs on tensor cores (mma.sync
 * m16n8k16, 16-bit in, fp32 accumulators) over the routing's tile list, so each expert's
 * weights are read once per tile of up to 96 of its rows, and experts without rows not at all.
 *
 * A block computes 128 weight rows against one tile's rows: weights are the mma's A operand
 * (rows of W are the M dimension), the tile's activation rows its B operand (N = 16, 32, 64 or
 * 96 rows: moe_mma_tile_rows picks the size from the rows an expert gets on average), both
 * K-contiguous as they lie in memory. 64-wide K slices stream through a 3-stage cp.async
 * pipeline into XOR-swizzled shared memory (conflict-free ldmatrix); 4 warps own 32 weight
 * rows each. Rows past the end (weights or tile) and K past K are zero-filled. 96-row tiles
 * (84 KB of stages) run 2 blocks an SM, the others 3 (mma_blocks_per_sm).
 *   up    the 128 rows are 64 gate rows and the same 64 up rows, interleaved by 16 so that a
 *         warp holds g and u of the same (j, row) in its two m-tiles: act[pos, j] =
 *         silu(g) u, each rounded to T; the tile's rows are x rows gathered by slot;
 *   down  128 rows of down against act's rows at the tile's positions: y[pos, h] rounded to T.
 * Grids: x over the most tiles the routing can make (spare blocks exit), y over weight tiles:
 * an expert's tiles are neighbours in x, so with many tiles (prefill) the blocks that read one
 * weight tile run together and all but the first find it in L2. */
#include "attention.cuh"
#include "moe.cuh"

enum { MM_THREADS = 128, MM_ROWS = 128, MM_BK = 64, MM_STAGES = 3 };

template <int NT> constexpr size_t mma_smem_bytes() {
    return (size_t)MM_STAGES * (MM_ROWS + 8 * NT) * MM_BK * 2;
}

/* Blocks an SM the stages leave room for (sm_90: 228 KB of shared memory an SM, 1 KB of it
 * reserved per block), at most 3: the register budget __launch_bounds__ asks for. */
template <int NT> constexpr int mma_blocks_per_sm() {
    constexpr int fit = (int)(228 * 1024 / (mma_smem_bytes<NT>() + 1024));
    return fit < 3 ? fit : 3;
}

/* Element offset of 16-byte chunk c of row r in a [rows][64] swizzled tile. */
__device__ __forceinline__ int swz(int r, int c) {
    return r * MM_BK + ((c ^ (r & 7)) << 3);
}

template <typename T, int NT, bool UP>
__global__ void __launch_bounds__(MM_THREADS, mma_blocks_per_sm<NT>())
    moe_mma_kernel(T *out, const T *src, const T *w, MoeRouting r, int N, int K, int top_k) {
    constexpr int BN = 8 * NT, B_PER_THREAD = BN / 16;
    kc_pdl_wait();
    kc_pdl_trigger();
    const int tile = blockIdx.x;
    if (tile >= *r.num_tiles)
        return;
    extern __shared__ __align__(128) unsigned char moe_smem[];
    T *As = (T *)moe_smem;                    /* [MM_STAGES][MM_ROWS][MM_BK] */
    T *Bs = As + MM_STAGES * MM_ROWS * MM_BK; /* [MM_STAGES][BN][MM_BK] */
    const int a = r.tile_a[tile], pos0 = r.tile_pos[tile];
    const int rows = min(BN, r.offset[a + 1] - pos0);
    const size_t e = (size_t)r.active[a];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, ch = tid & 7;

    /* this thread's copies: weight rows tid / 8 + 16 i, tile rows tid / 8 + 16 i, chunk ch */
    const T *arow[MM_ROWS / 16];
    bool aok[MM_ROWS / 16];
#pragma unroll
    for (int i = 0; i < MM_ROWS / 16; i++) {
        const int rr = (tid >> 3) + 16 * i;
        int src_row;
        if (UP) { /* smem row rr: warp rr / 32, gate (m-tile 0) or up (1), j within 16 */
            const int j = blockIdx.y * 64 + (rr >> 5) * 16 + (rr & 15);
            aok[i] = j < N;
            src_row = ((rr >> 4) & 1) ? N + j : j;
        } else {
            src_row = blockIdx.y * MM_ROWS + rr;
            aok[i] = src_row < N;
        }
        arow[i] = w + (e * (UP ? 2 : 1) * N + (size_t)(aok[i] ? src_row : 0)) * K;
    }
    const T *brow[B_PER_THREAD];
    bool bok[B_PER_THREAD];
#pragma unroll
    for (int i = 0; i < B_PER_THREAD; i++) {
        const int c = (tid >> 3) + 16 * i;
        bok[i] = c < rows;
        const int p = pos0 + (bok[i] ? c : 0);
        brow[i] = UP ? src + (size_t)(r.slot_at[p] / top_k) * K : src + (size_t)p * K;
    }
    auto load_stage = [&](int buf, int kt) {
        const int k = kt * MM_BK + ch * 8;
        const bool kok = k < K;
#pragma unroll
        for (int i = 0; i < MM_ROWS / 16; i++) {
            const int rr = (tid >> 3) + 16 * i;
            cp_async16(smem_addr(As + buf * MM_ROWS * MM_BK + swz(rr, ch)), arow[i] + k,
                       aok[i] && kok);
        }
#pragma unroll
        for (int i = 0; i < B_PER_THREAD; i++) {
            const int c = (tid >> 3) + 16 * i;
            cp_async16(smem_addr(Bs + buf * BN * MM_BK + swz(c, ch)), brow[i] + k, bok[i] && kok);
        }
    };

    float acc[2][NT][4];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int q = 0; q < 4; q++)
                acc[m][n][q] = 0.0f;

    const int nk = (K + MM_BK - 1) / MM_BK;
#pragma unroll
    for (int st = 0; st < MM_STAGES - 1; st++) {
        if (st < nk)
            load_stage(st, st);
        cp_async_commit();
    }
    for (int kt = 0; kt < nk; kt++) {
        cp_async_wait<MM_STAGES - 2>();
        __syncthreads();
        if (kt + MM_STAGES - 1 < nk)
            load_stage((kt + MM_STAGES - 1) % MM_STAGES, kt + MM_STAGES - 1);
        cp_async_commit();
        const T *Ab = As + (kt % MM_STAGES) * MM_ROWS * MM_BK;
        const T *Bb = Bs + (kt % MM_STAGES) * BN * MM_BK;
#pragma unroll
        for (int ks = 0; ks < MM_BK / 16; ks++) {
            uint32_t af[2][4];
#pragma unroll
            for (int m = 0; m < 2; m++) {
                const int rr = warp * 32 + m * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
                ldsm_x4(af[m], smem_addr(Ab + swz(rr, ks * 2 + (lane >> 4))));
            }
#pragma unroll
            for (int p = 0; p < NT / 2; p++) {
                const int rr = p * 16 + (lane & 7) + (lane >> 4) * 8;
                uint32_t bf[4];
                ldsm_x4(bf, smem_addr(Bb + swz(rr, ks * 2 + ((lane >> 3) & 1))));
#pragma unroll
                for (int m = 0; m < 2; m++) {
                    mma16<T>(acc[m][2 * p], af[m], bf[0], bf[1]);
                    mma16<T>(acc[m][2 * p + 1], af[m], bf[2], bf[3]);
                }
            }
        }
    }

    /* accumulator q of an m16n8 tile: weight row g (+8 for q >= 2), tile row 2 (lane % 4) + q % 2
     */
    const int g = lane >> 2, c0 = (lane & 3) * 2;
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int col = n * 8 + c0 + (q & 1);
            if (col >= rows)
                continue;
            const size_t orow = (size_t)(pos0 + col) * N;
            if (UP) {
                const int j = blockIdx.y * 64 + warp * 16 + g + (q >> 1) * 8;
                if (j < N) {
                    const float gv = to_f32(from_f32<T>(acc[0][n][q]));
                    const float uv = to_f32(from_f32<T>(acc[1][n][q]));
                    out[orow + j] = from_f32<T>(silu_times(gv, uv));
                }
            } else {
#pragma unroll
                for (int m = 0; m < 2; m++) {
                    const int h = blockIdx.y * MM_ROWS + warp * 32 + m * 16 + g + (q >> 1) * 8;
                    if (h < N)
                        out[orow + h] = from_f32<T>(acc[m][n][q]);
                }
            }
        }
}

int moe_mma_tile_rows(int n, int top_k, int E) {
    /* room for 1.5x the average rows of an expert that gets any: Mixtral-8x7B's batch 256 (64
     * on average) takes 96-row tiles, so an expert a little above the average does not take a
     * second tile of a few rows (on an H100, a 16-layer copy of its shape at batch 256: decode
     * step 18.4 ms with them, 19.4 ms with 64-row tiles) */
    const long slots = (long)n * top_k, avg = slots > E ? slots / E : 1, need = avg * 3 / 2;
    return need <= 16 ? 16 : need <= 32 ? 32 : need <= 64 ? 64 : 96;
}

template <typename T, int NT>
static void mma_pair(T *act, T *y, const T *x, const T *gate_up, const T *down, const MoeRouting &r,
                     int tiles, int H, int I, int top_k, cudaStream_t s) {
    constexpr size_t smem = mma_smem_bytes<NT>();
    kc_set_smem(moe_mma_kernel<T, NT, true>, smem);
    kc_set_smem(moe_mma_kernel<T, NT, false>, smem);
    kc_launch_pdl(moe_mma_kernel<T, NT, true>, dim3((unsigned)tiles, (unsigned)((I + 63) / 64)),
                  dim3(MM_THREADS), smem, s, act, x, gate_up, r, I, H, top_k);
    kc_launch_pdl(moe_mma_kernel<T, NT, false>,
                  dim3((unsigned)tiles, (unsigned)((H + MM_ROWS - 1) / MM_ROWS)), dim3(MM_THREADS),
                  smem, s, y, (const T *)act, down, r, H, I, top_k);
}

static KCudaMoeGemm forced_gemm = KC_MOE_GEMM_AUTO;

void k_cuda_moe_force_gemm(KCudaMoeGemm gemm) {
    forced_gemm = gemm;
}

template <typename T>
void moe_mma_launch(T *act, T *y, const T *x, const T *gate_up, const T *down, const MoeRouting &r,
                    int n, int E, int H, int I, int top_k, cudaStream_t s) {
    const int tile_rows = moe_mma_tile_rows(n, top_k, E);
    const int tiles = moe_max_tiles(n * top_k, E, tile_rows);
    KC_REQUIRE(tiles <= r.max_tiles, "moe: %d tiles of %d rows", tiles, tile_rows);
    if (forced_gemm == KC_MOE_GEMM_AUTO &&
        moe_wgmma_try<T>(act, y, x, gate_up, down, r, n, E, H, I, top_k, tile_rows, tiles, s))
        return;
    if (tile_rows == 16)
        mma_pair<T, 2>(act, y, x, gate_up, down, r, tiles, H, I, top_k, s);
    else if (tile_rows == 32)
        mma_pair<T, 4>(act, y, x, gate_up, down, r, tiles, H, I, top_k, s);
    else if (tile_rows == 64)
        mma_pair<T, 8>(act, y, x, gate_up, down, r, tiles, H, I, top_k, s);
    else
        mma_pair<T, 12>(act, y, x, gate_up, down, r, tiles, H, I, top_k, s);
}

template void moe_mma_launch<bf16>(bf16 *, bf16 *, const bf16 *, const bf16 *, const bf16 *,
                                   const MoeRouting &, int, int, int, int, int, cudaStream_t);
template void moe_mma_launch<f16>(f16 *, f16 *, const f16 *, const f16 *, const f16 *,
                                  const MoeRouting &, int, int, int, int, int, cudaStream_t);
