/* moe_gemv.cu - the experts of a decode batch (n <= MOE_GEMV_MAX_ROWS rows): GEMVs that read
 * only the picked experts' weights, each once, with 16-byte streaming loads (gemv.cuh's
 * ld_stream), many warps in flight.
 *
 *   up    one warp per (active expert, intermediate j): gate row j and up row I + j against the
 *         expert's rows (at most n), g and u rounded to T, act[pos, j] = silu(g) u rounded;
 *   down  one warp per output h: down row h of every active expert in increasing id, two
 *         experts a step (the next two loading while these are used: up to four rows in
 *         flight, for a walk of up to 64 experts) against their act rows, each dot rounded to
 *         T, weighted and added to its row's sum; out[t, h] written once, so the combine needs
 *         no launch of its own.
 * Spare blocks (grids are sized for min(E, n top_k) active experts) exit on the device count. */
#include "gemv.cuh"
#include "moe.cuh"

enum { MG_WARPS = 4, MG_U = 4, MG_PER_STEP = 2 };

template <typename T>
__global__ __launch_bounds__(32 * MG_WARPS) void moe_gemv_up_kernel(T *act, const T *x,
                                                                    const T *gate_up, MoeRouting r,
                                                                    int H, int I, int top_k) {
    kc_pdl_wait();
    kc_pdl_trigger();
    const int lane = threadIdx.x & 31, a = blockIdx.y;
    const int j = blockIdx.x * MG_WARPS + (threadIdx.x >> 5);
    if (a >= *r.num_active || j >= I)
        return;
    const int e = r.active[a], p0 = r.offset[a], cnt = r.offset[a + 1] - p0;
    const T *xr[MOE_GEMV_MAX_ROWS];
#pragma unroll
    for (int i = 0; i < MOE_GEMV_MAX_ROWS; i++)
        xr[i] = x + (size_t)(r.slot_at[p0 + min(i, cnt - 1)] / top_k) * H;
    const T *g_row = gate_up + ((size_t)e * 2 * I + (size_t)j) * H;
    const T *u_row = g_row + (size_t)I * H;
    float ag[MOE_GEMV_MAX_ROWS] = {}, au[MOE_GEMV_MAX_ROWS] = {};
    const int H8 = H >> 3;
    for (int c = lane; c < H8; c += 32 * MG_U) {
        uint4 gv[MG_U], uv[MG_U];
#pragma unroll
        for (int u = 0; u < MG_U; u++)
            if (c + u * 32 < H8) {
                gv[u] = ld_stream(g_row + (size_t)(c + u * 32) * 8);
                uv[u] = ld_stream(u_row + (size_t)(c + u * 32) * 8);
            }
#pragma unroll
        for (int u = 0; u < MG_U; u++)
            if (c + u * 32 < H8) {
                float gf[8], uf[8];
                unpack8(gf, gv[u], (const T *)0);
                unpack8(uf, uv[u], (const T *)0);
#pragma unroll
                for (int i = 0; i < MOE_GEMV_MAX_ROWS; i++)
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
    for (int i = 0; i < MOE_GEMV_MAX_ROWS; i++)
        if (i < cnt) {
            const float g = to_f32(from_f32<T>(warp_sum(ag[i])));
            const float u = to_f32(from_f32<T>(warp_sum(au[i])));
            if (lane == 0)
                act[(size_t)(p0 + i) * I + j] = from_f32<T>(silu_times(g, u));
        }
}

/* Step `step` of a down warp's walk (experts MG_PER_STEP (step / groups) and the next ones,
 * chunk group step % groups): their up-to-MG_U 16-byte chunks of down row h. */
template <typename T>
__device__ __forceinline__ void down_chunks(uint4 (&w)[MG_PER_STEP][MG_U], const T *down,
                                            const MoeRouting &r, int na, int step, int groups,
                                            int h, int H, int I) {
    const int a0 = step / groups * MG_PER_STEP;
    const int first = (step % groups) * 32 * MG_U + (threadIdx.x & 31);
#pragma unroll
    for (int q = 0; q < MG_PER_STEP; q++)
        if (a0 + q < na) {
            const T *row = down + ((size_t)r.active[a0 + q] * H + (size_t)h) * I;
#pragma unroll
            for (int u = 0; u < MG_U; u++)
                if (first + u * 32 < (I >> 3))
                    w[q][u] = ld_stream(row + (size_t)(first + u * 32) * 8);
        }
}

template <typename T>
__global__ __launch_bounds__(32 * MG_WARPS) void moe_gemv_down_kernel(T *out, const T *act,
                                                                      const T *down, MoeRouting r,
                                                                      int n, int H, int I,
                                                                      int top_k) {
    kc_pdl_wait();
    kc_pdl_trigger();
    const int lane = threadIdx.x & 31, h = blockIdx.x * MG_WARPS + (threadIdx.x >> 5);
    if (h >= H)
        return;
    const int na = *r.num_active, I8 = I >> 3, groups = (I8 + 32 * MG_U - 1) / (32 * MG_U);
    const int steps = (na + MG_PER_STEP - 1) / MG_PER_STEP * groups;
    float acc[MOE_GEMV_MAX_ROWS] = {}, part[MG_PER_STEP][MOE_GEMV_MAX_ROWS] = {};
    uint4 cur[MG_PER_STEP][MG_U], nxt[MG_PER_STEP][MG_U];
    if (steps > 0)
        down_chunks(cur, down, r, na, 0, groups, h, H, I);
    int p0[MG_PER_STEP] = {}, cnt[MG_PER_STEP] = {};
    for (int s = 0; s < steps; s++) {
        const int a0 = s / groups * MG_PER_STEP, g = s % groups;
        if (g == 0)
#pragma unroll
            for (int q = 0; q < MG_PER_STEP; q++) {
                p0[q] = a0 + q < na ? r.offset[a0 + q] : 0;
                cnt[q] = a0 + q < na ? r.offset[a0 + q + 1] - p0[q] : 0;
            }
        if (s + 1 < steps)
            down_chunks(nxt, down, r, na, s + 1, groups, h, H, I);
        const int first = g * 32 * MG_U + lane;
#pragma unroll
        for (int q = 0; q < MG_PER_STEP; q++)
#pragma unroll
            for (int u = 0; u < MG_U; u++)
                if (first + u * 32 < I8 && cnt[q] > 0) {
                    float wf[8];
                    unpack8(wf, cur[q][u], (const T *)0);
#pragma unroll
                    for (int i = 0; i < MOE_GEMV_MAX_ROWS; i++)
                        if (i < cnt[q]) {
                            float af[8];
                            load8(af, act + (size_t)(p0[q] + i) * I + (size_t)(first + u * 32) * 8);
#pragma unroll
                            for (int e = 0; e < 8; e++)
                                part[q][i] = fmaf(wf[e], af[e], part[q][i]);
                        }
                }
        if (g == groups - 1) /* the step's experts are done: add them in increasing id */
#pragma unroll
            for (int q = 0; q < MG_PER_STEP; q++)
#pragma unroll
                for (int i = 0; i < MOE_GEMV_MAX_ROWS; i++)
                    if (i < cnt[q]) {
                        const float d = to_f32(from_f32<T>(warp_sum(part[q][i])));
                        const int slot = r.slot_at[p0[q] + i], t = slot / top_k;
                        const float v = r.weights[slot] * d;
#pragma unroll
                        for (int j = 0; j < MOE_GEMV_MAX_ROWS; j++)
                            if (j == t)
                                acc[j] += v;
                        part[q][i] = 0.0f;
                    }
#pragma unroll
        for (int q = 0; q < MG_PER_STEP; q++)
#pragma unroll
            for (int u = 0; u < MG_U; u++)
                cur[q][u] = nxt[q][u];
    }
    float mine = 0.0f;
#pragma unroll
    for (int j = 0; j < MOE_GEMV_MAX_ROWS; j++)
        if (j == lane)
            mine = acc[j];
    if (lane < n)
        out[(size_t)lane * H + h] = from_f32<T>(mine);
}

template <typename T>
void moe_gemv_launch(T *out, const T *x, T *act, const T *gate_up, const T *down,
                     const MoeRouting &r, int n, int E, int H, int I, int top_k, cudaStream_t s) {
    const int max_active = n * top_k < E ? n * top_k : E;
    const dim3 up_grid((unsigned)((I + MG_WARPS - 1) / MG_WARPS), (unsigned)max_active);
    kc_launch_pdl(moe_gemv_up_kernel<T>, up_grid, dim3(32 * MG_WARPS), 0, s, act, x, gate_up, r, H,
                  I, top_k);
    kc_launch_pdl(moe_gemv_down_kernel<T>, dim3((unsigned)((H + MG_WARPS - 1) / MG_WARPS)),
                  dim3(32 * MG_WARPS), 0, s, out, (const T *)act, down, r, n, H, I, top_k);
}

template void moe_gemv_launch<bf16>(bf16 *, const bf16 *, bf16 *, const bf16 *, const bf16 *,
                                    const MoeRouting &, int, int, int, int, int, cudaStream_t);
template void moe_gemv_launch<f16>(f16 *, const f16 *, f16 *, const f16 *, const f16 *,
                                   const MoeRouting &, int, int, int, int, int, cudaStream_t);
