/* moe_gemv.cu - the experts of a decode batch (n <= MOE_GEMV_MAX_ROWS rows): GEMVs that read
 * only the picked experts' weights, each once, with 16-byte streaming loads (gemv.cuh's
 * ld_stream), many loads in flight. Both kernels are templated on NX, a bound on the rows an
 * expert holds (n rounded up to 1, 2, 4 or 8), so a batch of one keeps few registers and many
 * blocks resident.
 *
 *   up    one warp per (active expert, intermediate j): gate row j and up row I + j against the
 *         expert's rows, g and u rounded to T, act[pos, j] = silu(g) u rounded; the first
 *         chunks are requested before the routing of the rows is read. Spare blocks (the grid
 *         has min(E, n top_k) expert columns) find active[a] < 0 and exit.
 *   down  a block per MD_ROWS << spread output rows h: its warps take the tasks (active expert,
 *         MD_ROWS consecutive rows h) in turn, each dot rounded to T and weighted into shared
 *         memory by position; then one thread per (row t, h) adds t's picks in increasing
 *         expert id and writes out[t, h] once (no combine launch). The routing comes from two
 *         kernels back (complete once this kernel starts), so a warp requests its first
 *         weights before the wait for act: they stream in while the up kernel drains. */
#include "gemv.cuh"
#include "moe.cuh"

enum { MG_WARPS = 4, MD_WARPS = 8, MD_ROWS = 4 };

/* Blocks of the up kernel an SM must hold at U chunks in flight per lane and weight row: at
 * one row an expert gemv.cuh's choice for its batch-1 GEMV (12 at two chunks, for one wave of
 * blocks at the Qwen3-30B-A3B shape; 8 at four, for deep rows). */
template <int NX, int U>
constexpr int mg_min_blocks = NX == 1   ? (U >= 4 ? 8 : 12)
                              : NX == 2 ? 6
                                        : 1;

/* Chunks a lane requests per weight row and step of the down kernel. */
template <int NX> constexpr int md_u = NX <= 2 ? 4 : 2;

template <typename T, int NX, int U>
__global__ __launch_bounds__(32 * MG_WARPS, (mg_min_blocks<NX, U>)) void moe_gemv_up_kernel(
    T *act, const T *x, const T *gate_up, MoeRouting r, int H, int I, int top_k) {
    kc_pdl_wait();
    kc_pdl_trigger();
    const int lane = threadIdx.x & 31, a = blockIdx.y;
    const int j = blockIdx.x * MG_WARPS + (threadIdx.x >> 5);
    if (j >= I)
        return;
    const int e = r.active[a];
    if (e < 0)
        return;
    const T *g_row = gate_up + ((size_t)e * 2 * I + (size_t)j) * H;
    const T *u_row = g_row + (size_t)I * H;
    const int H8 = H >> 3;
    uint4 gv[U], uv[U];
    auto request = [&](int c) {
#pragma unroll
        for (int u = 0; u < U; u++)
            if (c + u * 32 < H8) {
                gv[u] = ld_stream(g_row + (size_t)(c + u * 32) * 8);
                uv[u] = ld_stream(u_row + (size_t)(c + u * 32) * 8);
            }
    };
    request(lane);
    const int p0 = r.offset[a], cnt = min(r.offset[a + 1] - p0, NX);
    const T *xr[NX];
#pragma unroll
    for (int i = 0; i < NX; i++)
        xr[i] = x + (size_t)(r.slot_at[p0 + min(i, cnt - 1)] / top_k) * H;
    float ag[NX] = {}, au[NX] = {};
    for (int c = lane; c < H8; c += 32 * U) {
        if (c != lane)
            request(c);
#pragma unroll
        for (int u = 0; u < U; u++)
            if (c + u * 32 < H8) {
                float gf[8], uf[8];
                unpack8(gf, gv[u], (const T *)0);
                unpack8(uf, uv[u], (const T *)0);
#pragma unroll
                for (int i = 0; i < NX; i++)
                    if (i < cnt) {
                        float xf[8];
                        load8(xf, xr[i] + (size_t)(c + u * 32) * 8);
#pragma unroll
                        for (int q = 0; q < 8; q++) {
                            ag[i] = fmaf(gf[q], xf[q], ag[i]);
                            au[i] = fmaf(uf[q], xf[q], au[i]);
                        }
                    }
            }
    }
#pragma unroll
    for (int i = 0; i < NX; i++)
        if (i < cnt) {
            const float g = to_f32(from_f32<T>(warp_sum(ag[i])));
            const float u = to_f32(from_f32<T>(warp_sum(au[i])));
            if (lane == 0)
                act[(size_t)(p0 + i) * I + j] = from_f32<T>(silu_times(g, u));
        }
}

/* part[pos * HB + (h - h0)] = weight of pos's slot * (down_e row h . act[pos]) rounded to T,
 * for the block's rows h0 .. h0 + HB, HB = MD_ROWS << spread; then out[t, h]. */
template <typename T, int NX>
__global__ __launch_bounds__(32 * MD_WARPS,
                             2) void moe_gemv_down_kernel(T *out, const T *act, const T *down,
                                                          MoeRouting r, int n, int H, int I,
                                                          int top_k, int spread) {
    constexpr int U = md_u<NX>;
    extern __shared__ float part[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int HB = MD_ROWS << spread, h0 = blockIdx.x * HB, I8 = I >> 3;
    const int na = __ldcg(r.num_active), tasks = na << spread;
    bool waited = false;
    for (int task = warp; task < tasks; task += MD_WARPS) {
        const int a = task % na, hr = h0 + task / na * MD_ROWS;
        const int e = __ldcg(r.active + a);
        const T *w[MD_ROWS];
#pragma unroll
        for (int q = 0; q < MD_ROWS; q++)
            w[q] = down + ((size_t)e * H + (size_t)min(hr + q, H - 1)) * I;
        int p0 = 0, cnt = 0;
        float acc[MD_ROWS][NX] = {};
        for (int c0 = 0; c0 < I8; c0 += 32 * U) {
            uint4 wv[U][MD_ROWS];
#pragma unroll
            for (int u = 0; u < U; u++)
                if (c0 + lane + u * 32 < I8)
#pragma unroll
                    for (int q = 0; q < MD_ROWS; q++)
                        wv[u][q] = ld_stream(w[q] + (size_t)(c0 + lane + u * 32) * 8);
            if (!waited) {
                kc_pdl_wait();
                kc_pdl_trigger();
                waited = true;
            }
            if (c0 == 0) {
                p0 = r.offset[a];
                cnt = min(r.offset[a + 1] - p0, NX);
            }
#pragma unroll
            for (int u = 0; u < U; u++)
                if (c0 + lane + u * 32 < I8) {
                    const size_t k = (size_t)(c0 + lane + u * 32) * 8;
                    float wf[MD_ROWS][8];
#pragma unroll
                    for (int q = 0; q < MD_ROWS; q++)
                        unpack8(wf[q], wv[u][q], (const T *)0);
#pragma unroll
                    for (int i = 0; i < NX; i++)
                        if (i < cnt) {
                            float af[8];
                            load8(af, act + (size_t)(p0 + i) * I + k);
#pragma unroll
                            for (int q = 0; q < MD_ROWS; q++)
#pragma unroll
                                for (int v = 0; v < 8; v++)
                                    acc[q][i] = fmaf(wf[q][v], af[v], acc[q][i]);
                        }
                }
        }
#pragma unroll
        for (int q = 0; q < MD_ROWS; q++)
#pragma unroll
            for (int i = 0; i < NX; i++)
                if (i < cnt) { /* the same for the whole warp */
                    const float d = to_f32(from_f32<T>(warp_sum(acc[q][i])));
                    if (lane == q * NX + i && hr + q < H)
                        part[(p0 + i) * HB + (hr - h0 + q)] = r.weights[r.slot_at[p0 + i]] * d;
                }
    }
    if (!waited) {
        kc_pdl_wait();
        kc_pdl_trigger();
    }
    __syncthreads();
    for (int q = threadIdx.x; q < n * HB; q += blockDim.x) {
        const int t = q / HB, h = h0 + q % HB;
        if (h >= H)
            continue;
        float sum = 0.0f; /* t's picks are in increasing expert id */
        for (int k = 0; k < top_k; k++)
            sum += part[r.pos_of[t * top_k + k] * HB + q % HB];
        out[(size_t)t * H + h] = from_f32<T>(sum);
    }
}

template <typename T, int NX>
static void launch_nx(T *out, const T *x, T *act, const T *gate_up, const T *down,
                      const MoeRouting &r, int n, int E, int H, int I, int top_k, cudaStream_t s) {
    const int max_active = n * top_k < E ? n * top_k : E;
    const dim3 up_grid((unsigned)((I + MG_WARPS - 1) / MG_WARPS), (unsigned)max_active);
    auto up = moe_gemv_up_kernel<T, NX, 4>;
    if constexpr (NX == 1)
        if (H < 4096)
            up = moe_gemv_up_kernel<T, 1, 2>;
    kc_launch_pdl(up, up_grid, dim3(32 * MG_WARPS), 0, s, act, x, gate_up, r, H, I, top_k);
    int spread = 0; /* row groups a block: about one task a warp when few experts are active */
    while ((max_active << (spread + 1)) <= MD_WARPS)
        spread++;
    const int rows = MD_ROWS << spread;
    const size_t smem = (size_t)n * top_k * rows * sizeof(float);
    kc_launch_pdl(moe_gemv_down_kernel<T, NX>, dim3((unsigned)((H + rows - 1) / rows)),
                  dim3(32 * MD_WARPS), smem, s, out, (const T *)act, down, r, n, H, I, top_k,
                  spread);
}

template <typename T>
void moe_gemv_launch(T *out, const T *x, T *act, const T *gate_up, const T *down,
                     const MoeRouting &r, int n, int E, int H, int I, int top_k, cudaStream_t s) {
    if (n <= 1)
        launch_nx<T, 1>(out, x, act, gate_up, down, r, n, E, H, I, top_k, s);
    else if (n <= 2)
        launch_nx<T, 2>(out, x, act, gate_up, down, r, n, E, H, I, top_k, s);
    else if (n <= 4)
        launch_nx<T, 4>(out, x, act, gate_up, down, r, n, E, H, I, top_k, s);
    else
        launch_nx<T, 8>(out, x, act, gate_up, down, r, n, E, H, I, top_k, s);
}

template void moe_gemv_launch<bf16>(bf16 *, const bf16 *, bf16 *, const bf16 *, const bf16 *,
                                    const MoeRouting &, int, int, int, int, int, cudaStream_t);
template void moe_gemv_launch<f16>(f16 *, const f16 *, f16 *, const f16 *, const f16 *,
                                   const MoeRouting &, int, int, int, int, int, cudaStream_t);
