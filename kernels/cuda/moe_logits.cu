/* moe_logits.cu - the router logits of a routed batch (more than 16 rows) on tensor cores:
 * logits[t, e] = x[t] . router[e] in fp32, for 16-bit x and router of the same dtype.
 *
 * Why: the warp-per-expert route kernel (moe.cu) reads each row of x once per expert, from L2
 * (Qwen3-30B-A3B's batch 256: 128 MB for 0.5 MB of router), and keeps few warps busy where
 * the experts are few (Mixtral's 8). Here a block owns one 16 x 16 tile of (rows, experts):
 * its LG_WARPS warps each take every LG_WARPS-th 64-element slice of K, stage it through
 * their own shared memory (zero past n, E and H), multiply it with wmma (fp32 accumulators)
 * while the next slice is being loaded, and the block adds the warps' tiles in warp order, so
 * the result does not depend on timing. */
#include <mma.h>

#include "moe.cuh"

namespace {

constexpr int LG_WARPS = 8, LG_K = 64, LG_TILE = 16;
constexpr int LG_CHUNKS = LG_TILE * LG_K / 8 / 32; /* 16-byte chunks a lane copies per operand */

/* the lane's chunks of one slice: row r of the tile, elements c .. c + 7 of the slice */
__device__ __forceinline__ void lg_chunk(int lane, int i, int *r, int *c) {
    const int chunk = lane + 32 * i;
    *r = chunk / (LG_K / 8);
    *c = chunk % (LG_K / 8) * 8;
}

template <typename T>
__device__ __forceinline__ void lg_load(uint4 (&xv)[LG_CHUNKS], uint4 (&wv)[LG_CHUNKS], const T *x,
                                        const T *w, int t0, int e0, int n, int E, int H, int k0,
                                        int lane) {
#pragma unroll
    for (int i = 0; i < LG_CHUNKS; i++) {
        int r, c;
        lg_chunk(lane, i, &r, &c);
        const int k = k0 + c;
        xv[i] = t0 + r < n && k < H ? *(const uint4 *)(x + (size_t)(t0 + r) * H + k) : uint4{};
        wv[i] = e0 + r < E && k < H ? *(const uint4 *)(w + (size_t)(e0 + r) * H + k) : uint4{};
    }
}

template <typename T>
__global__ __launch_bounds__(32 * LG_WARPS) void moe_logits_kernel(float *logits, const T *x,
                                                                   const T *w, int n, int E,
                                                                   int H) {
    using namespace nvcuda;
    __shared__ __align__(32) T xs[LG_WARPS][LG_TILE * LG_K];
    __shared__ __align__(32) T ws[LG_WARPS][LG_TILE * LG_K];
    __shared__ __align__(32) float part[LG_WARPS][LG_TILE * LG_TILE];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int e0 = blockIdx.x * LG_TILE, t0 = blockIdx.y * LG_TILE;
    const int slices = (H + LG_K - 1) / LG_K;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    uint4 xv[LG_CHUNKS], wv[LG_CHUNKS];
    kc_pdl_wait();
    kc_pdl_trigger();
    if (warp < slices)
        lg_load(xv, wv, x, w, t0, e0, n, E, H, warp * LG_K, lane);
    for (int s = warp; s < slices; s += LG_WARPS) {
#pragma unroll
        for (int i = 0; i < LG_CHUNKS; i++) {
            int r, c;
            lg_chunk(lane, i, &r, &c);
            *(uint4 *)&xs[warp][r * LG_K + c] = xv[i];
            *(uint4 *)&ws[warp][r * LG_K + c] = wv[i];
        }
        __syncwarp();
        if (s + LG_WARPS < slices) /* the next slice in flight during this one's MMAs */
            lg_load(xv, wv, x, w, t0, e0, n, E, H, (s + LG_WARPS) * LG_K, lane);
#pragma unroll
        for (int kk = 0; kk < LG_K; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a; /* bf16, f16 */
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b;
            wmma::load_matrix_sync(a, &xs[warp][kk], LG_K);
            wmma::load_matrix_sync(b, &ws[warp][kk], LG_K); /* b[k][e] = router[e0 + e][k] */
            wmma::mma_sync(acc, a, b, acc);
        }
        __syncwarp();
    }
    wmma::store_matrix_sync(part[warp], acc, LG_TILE, wmma::mem_row_major);
    __syncthreads();
    for (int i = threadIdx.x; i < LG_TILE * LG_TILE; i += blockDim.x) {
        const int t = t0 + i / LG_TILE, e = e0 + i % LG_TILE;
        float v = 0.0f;
        for (int q = 0; q < LG_WARPS; q++)
            v += part[q][i];
        if (t < n && e < E)
            logits[(size_t)t * E + e] = v;
    }
}

} // namespace

template <typename T>
void moe_logits_launch(float *logits, const T *x, const T *router, int n, int E, int H,
                       cudaStream_t s) {
    const dim3 grid((unsigned)((E + LG_TILE - 1) / LG_TILE),
                    (unsigned)((n + LG_TILE - 1) / LG_TILE));
    kc_launch_pdl(moe_logits_kernel<T>, grid, dim3(32 * LG_WARPS), 0, s, logits, x, router, n, E,
                  H);
}

template void moe_logits_launch<bf16>(float *, const bf16 *, const bf16 *, int, int, int,
                                      cudaStream_t);
template void moe_logits_launch<f16>(float *, const f16 *, const f16 *, int, int, int,
                                     cudaStream_t);
