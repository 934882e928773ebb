/* moe.cu - the mixture-of-experts MLP (Mixtral, Qwen3-MoE), a first version: correct and
 * graph-safe (no host round trip, nothing allocated), reading only the experts each row picked,
 * but without grouped GEMMs: every (row, expert) pair is a set of warp dot products.
 *
 * Three launches on the workspace ([n, top_k] expert ids, their fp32 weights, and the
 * [n, top_k, I] activations in the act dtype):
 *   route  one warp per row: router logits in fp32 (transformers rounds them to the model's
 *          dtype; fp32 keeps the picks those of the fp32 reference, where a 16-bit rounding
 *          would flip close ones), fp32 softmax, top-k by repeated selection (the lower id
 *          first on ties), renormalization, the picks sorted by expert id;
 *   up     one warp per (row, pick, j): gate row j and up row I + j of the expert against the
 *          row, each rounded to the act dtype, act = silu(g) * u rounded;
 *   down   one warp per (row, output h): sum over the picks, in increasing expert id, of
 *          weight * (down row h . act), each product's dot rounded to the act dtype; the sum
 *          in fp32, rounded once.
 * As the CPU op (kernels/cpu/moe.c) up to the order of the K sums and these roundings. The
 * grouped version (rows gathered by expert, one GEMM per expert or a grouped GEMM) replaces
 * the up and down launches and keeps the route one. */
#include "cuda_internal.cuh"

enum { MOE_MAX_EXPERTS = 512, MOE_MAX_TOP_K = 32, MOE_WARPS = 4, MOE_ALIGN = 256 };

/* Workspace parts: ids [rows, k] int32, weights [rows, k] fp32, act [rows, k, I] act dtype. */
static size_t align_up(size_t b) {
    return (b + MOE_ALIGN - 1) / MOE_ALIGN * MOE_ALIGN;
}

size_t k_cuda_moe_workspace_bytes(DType act, int max_rows, int num_experts, int inter, int top_k) {
    size_t slots = (size_t)(max_rows > 0 ? max_rows : 0) * (size_t)(top_k > 0 ? top_k : 0);
    return align_up(slots * 4) * 2 + align_up(slots * (size_t)inter * pl_dtype_size(act));
}

/* sum over k < K of w[k] * x[k], the warp's lanes striding over k, reduced (every lane). */
template <typename WT, typename XT>
__device__ __forceinline__ float warp_dot(const WT *w, const XT *x, int K) {
    float acc = 0.0f;
    for (int k = threadIdx.x & 31; k < K; k += 32)
        acc = fmaf(to_f32(w[k]), to_f32(x[k]), acc);
    return warp_sum(acc);
}

template <typename T>
__global__ __launch_bounds__(32) void moe_route_kernel(const T *x, const void *router,
                                                       int router_dt, int E, int H, int top_k,
                                                       int renormalize, int32_t *ids,
                                                       float *weights) {
    kc_pdl_wait();
    kc_pdl_trigger();
    __shared__ float p[MOE_MAX_EXPERTS];
    const int t = blockIdx.x, lane = threadIdx.x;
    const T *xr = x + (size_t)t * H;
    for (int e = 0; e < E; e++) {
        float acc = 0.0f;
        for (int k = lane; k < H; k += 32)
            acc = fmaf(load_any(router, router_dt, e * H + k), to_f32(xr[k]), acc);
        acc = warp_sum(acc);
        if (lane == 0)
            p[e] = acc;
    }
    __syncwarp();
    if (lane != 0)
        return;
    float m = -INFINITY, z = 0.0f;
    for (int e = 0; e < E; e++)
        m = fmaxf(m, p[e]);
    for (int e = 0; e < E; e++)
        z += p[e] = expf(p[e] - m);
    for (int e = 0; e < E; e++)
        p[e] /= z;
    int picked[MOE_MAX_TOP_K];
    float pw[MOE_MAX_TOP_K], sum = 0.0f;
    for (int j = 0; j < top_k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (p[e] >= 0.0f && (best < 0 || p[e] > p[best]))
                best = e;
        picked[j] = best;
        pw[j] = p[best];
        sum += p[best];
        p[best] = -1.0f; /* taken (probabilities are >= 0) */
    }
    for (int j = 0; j < top_k; j++) { /* increasing expert id */
        int lo = j;
        for (int i = j + 1; i < top_k; i++)
            if (picked[i] < picked[lo])
                lo = i;
        const int e = picked[lo];
        const float pe = pw[lo];
        picked[lo] = picked[j];
        pw[lo] = pw[j];
        picked[j] = e;
        pw[j] = pe;
        ids[(size_t)t * top_k + j] = e;
        weights[(size_t)t * top_k + j] = renormalize ? pe / sum : pe;
    }
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
    KC_REQUIRE(workspace_bytes >= k_cuda_moe_workspace_bytes(act, n, E, I, top_k),
               "%s: workspace of %zu bytes is too small for %d rows", what, workspace_bytes, n);
    const size_t slots = (size_t)n * top_k;
    int32_t *ids = (int32_t *)workspace;
    float *weights = (float *)((char *)workspace + align_up(slots * 4));
    void *a = (char *)workspace + 2 * align_up(slots * 4);
    cudaStream_t s = kc_stream(stream);
    const dim3 up_grid((unsigned)slots, (unsigned)((I + MOE_WARPS - 1) / MOE_WARPS));
    const dim3 down_grid((unsigned)n, (unsigned)((H + MOE_WARPS - 1) / MOE_WARPS));
    KC_DISPATCH_ACT(
        act, what, T,
        kc_launch_pdl(moe_route_kernel<T>, dim3((unsigned)n), dim3(32), 0, s, (const T *)x,
                      (const void *)router->data, (int)router->dtype, E, H, top_k, renormalize, ids,
                      weights);
        KC_DISPATCH_ACT(gate_up->dtype, what, WT,
                        kc_launch_pdl(moe_up_kernel<T, WT>, up_grid, dim3(32 * MOE_WARPS), 0, s,
                                      (T *)a, (const T *)x, (const WT *)gate_up->data,
                                      (const int32_t *)ids, H, I, top_k);
                        kc_launch_pdl(moe_down_kernel<T, WT>, down_grid, dim3(32 * MOE_WARPS), 0, s,
                                      (T *)out, (const T *)a, (const WT *)down->data,
                                      (const int32_t *)ids, (const float *)weights, H, I, top_k)));
}
