/* moe.c - the mixture-of-experts MLP (Mixtral, Qwen3-MoE): routing and the experts of each row.
 *
 * The reference every backend's moe_mlp is compared with, written for clarity over speed: per
 * row, router logits (dot products accumulated in double, rounded to float as a projection's
 * output), softmax in fp32 (max subtracted), top-k by repeated selection (the lower expert id
 * first on ties, as a stable sort would), optional renormalization, then each picked expert's
 * SwiGLU MLP in fp32, its output scaled by the expert's weight and added to the row's sum in
 * increasing expert id (the order in which transformers' loop over experts adds them). Rows
 * are independent: they are shared out over the worker pool and a row's result does not
 * depend on the split. */
#include <math.h>

#include "cpu_internal.h"

enum { MOE_MAX_TOP_K = 64 };

/* sum_k w[row, k] x[k] for a row of a F32 / F16 / BF16 matrix with K columns. */
static float dot_row(const Tensor *w, size_t row, const float *x, int64_t K) {
    double acc = 0;
    size_t base = row * (size_t)K;
    if (w->dtype == DT_F32) {
        const float *wf = (const float *)w->data + base;
        for (int64_t k = 0; k < K; k++)
            acc += (double)wf[k] * x[k];
    } else {
        for (int64_t k = 0; k < K; k++)
            acc += (double)cpu_load_f32(w->data, w->dtype, base + (size_t)k) * x[k];
    }
    return (float)acc;
}

/* The top_k experts of probabilities p[E] (ids[] in increasing id, weights[] theirs). */
static void route(const float *p, int E, int top_k, int renormalize, int *ids, float *weights) {
    int picked[MOE_MAX_TOP_K];
    for (int j = 0; j < top_k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++)
                taken |= picked[i] == e;
            if (!taken && (best < 0 || p[e] > p[best]))
                best = e;
        }
        picked[j] = best;
    }
    float sum = 0;
    for (int j = 0; j < top_k; j++)
        sum += p[picked[j]];
    /* increasing expert id: the order of the sum over experts */
    for (int j = 0; j < top_k; j++) {
        int lo = j;
        for (int i = j + 1; i < top_k; i++)
            if (picked[i] < picked[lo])
                lo = i;
        int t = picked[j];
        picked[j] = picked[lo];
        picked[lo] = t;
        ids[j] = picked[j];
        weights[j] = renormalize ? p[picked[j]] / sum : p[picked[j]];
    }
}

typedef struct {
    float *out;
    const float *x;
    const Tensor *router, *gate_up, *down;
    int n, E, H, I, top_k, renormalize;
} MoeJob;

static void moe_task(void *ctx, int tid, int nt) {
    const MoeJob *j = ctx;
    const int E = j->E, H = j->H, I = j->I;
    float *p = cpu_scratch(0, (size_t)E * sizeof(float));
    float *act = cpu_scratch(1, (size_t)I * sizeof(float));
    float *sum = cpu_scratch(2, (size_t)H * sizeof(float));
    int lo = (int)((int64_t)j->n * tid / nt), hi = (int)((int64_t)j->n * (tid + 1) / nt);
    for (int t = lo; t < hi; t++) {
        const float *x = j->x + (size_t)t * H;
        float m = -INFINITY, z = 0;
        for (int e = 0; e < E; e++) {
            p[e] = dot_row(j->router, (size_t)e, x, H);
            m = fmaxf(m, p[e]);
        }
        for (int e = 0; e < E; e++)
            z += p[e] = expf(p[e] - m);
        for (int e = 0; e < E; e++)
            p[e] /= z;
        int ids[MOE_MAX_TOP_K];
        float weights[MOE_MAX_TOP_K];
        route(p, E, j->top_k, j->renormalize, ids, weights);
        for (int h = 0; h < H; h++)
            sum[h] = 0;
        for (int k = 0; k < j->top_k; k++) {
            size_t e = (size_t)ids[k];
            for (int i = 0; i < I; i++) {
                float g = dot_row(j->gate_up, e * 2 * I + (size_t)i, x, H);
                float u = dot_row(j->gate_up, e * 2 * I + (size_t)(I + i), x, H);
                act[i] = g / (1.0f + expf(-g)) * u;
            }
            for (int h = 0; h < H; h++)
                sum[h] += weights[k] * dot_row(j->down, e * H + (size_t)h, act, I);
        }
        memcpy(j->out + (size_t)t * H, sum, (size_t)H * sizeof(float));
    }
}

size_t cpu_moe_workspace_bytes(const KernelOps *ops, int max_rows, int num_experts, int hidden,
                               int inter, int top_k) {
    return 0; /* per-thread scratch instead */
}

void cpu_moe_mlp(const KernelOps *ops, void *out, const void *x, const Tensor *router,
                 const Tensor *gate_up, const Tensor *down, int n, int top_k, int renormalize,
                 void *workspace, size_t workspace_bytes) {
    PL_CHECK(router->ndim == 2 && gate_up->ndim == 3 && down->ndim == 3);
    const int E = (int)router->shape[0], H = (int)router->shape[1], I = (int)down->shape[2];
    PL_CHECK(gate_up->shape[0] == E && gate_up->shape[1] == 2 * (int64_t)I &&
             gate_up->shape[2] == H && down->shape[0] == E && down->shape[1] == H);
    PL_CHECK(top_k >= 1 && top_k <= E && top_k <= MOE_MAX_TOP_K);
    if (n <= 0)
        return;
    MoeJob j = {out, x, router, gate_up, down, n, E, H, I, top_k, renormalize};
    cpu_parallel(cpu_pool(ops), moe_task, &j, n);
}
