/* matmul_norm.cu - a projection whose output is added to the residual stream, fused with the
 * residual add + RMSNorm after it (k_cuda_matmul_add_rmsnorm: the o and down projections).
 *
 * At decode batch sizes these GEMMs have few output tiles (Llama-3-8B at 256 rows: [256, 4096]),
 * so cuBLASLt splits their K to fill the GPU and sums the partial products in a reduction
 * kernel of its own, which writes the activation-dtype output the add + RMSNorm then reads.
 * Here the partials are one strided-batched GEMM of fp32 outputs (K in 2 or 4 slices) and the
 * add + RMSNorm kernel sums them as it reads them: one kernel and one round trip fewer. The
 * sum is rounded to the activation dtype before the add, as the projection's output would be,
 * so the result differs from the two calls only in the order the K products are summed.
 *
 * Whether that pays depends on the shape, so it is measured: the first eager call of a
 * (row bucket, N, K) times the plain pair (k_cuda_matmul, then the add + RMSNorm) and each
 * split on its own operands, writing scratch instead of the residual, and keeps the fastest.
 * A bucket first seen under graph capture takes the plain pair. The partials buffer (fp32,
 * PN_MAX_SPLITS x PN_MAX_ROWS rows of the first call's N) is allocated by the first eager call,
 * which the engine's warm-up makes before it sizes the KV cache. */
#include <string.h>

#include "gemv.cuh"

enum {
    PN_MAX_ROWS = 512, /* above this, enough output tiles: the plain pair */
    PN_MAX_SPLITS = 4,
    PN_REPS = 3,
};

struct KCudaProjNorm {
    float *partials;
    size_t split_stride; /* elements between partials: PN_MAX_ROWS x N */
    int N;               /* the N the buffer was sized for */
    KcChoices choices;   /* splits per shape, 0 the plain pair */
    int forced;          /* k_cuda_proj_norm_force: -1 none */
};

KCudaProjNorm *k_cuda_proj_norm_create(void) {
    KCudaProjNorm *p = (KCudaProjNorm *)pl_xcalloc(1, sizeof(KCudaProjNorm));
    p->forced = -1;
    return p;
}

void k_cuda_proj_norm_force(KCudaProjNorm *p, int splits) {
    KC_REQUIRE(p && (splits == -1 || splits == 0 || splits == 2 || splits == 4),
               "k_cuda_proj_norm_force: splits %d (-1, 0, 2 or 4)", splits);
    p->forced = splits;
}

void k_cuda_proj_norm_destroy(KCudaProjNorm *p) {
    if (!p)
        return;
    k_cuda_free(p->partials);
    free(p);
}

/* Which splits this call could take (bit s set: s partials; bit 0: the plain pair). */
static unsigned candidates(const KCudaProjNorm *p, KCudaGemm *g, const void *residual,
                           const void *normed, const void *x, DType act, const Tensor *w,
                           const Tensor *norm_w, int n) {
    const int N = (int)w->shape[0], K = (int)w->shape[1];
    unsigned c = 1; /* fp8 weights (w->dtype != act) always take the plain pair */
    if (!p->partials || N > p->N || n > PN_MAX_ROWS || w->dtype != act ||
        kc_gemv_takes(g, act, w, x, n) ||
        !kc_add_rmsnorm_partials_ok(residual, normed, p->partials, act, norm_w, N))
        return c;
    for (int s = 2; s <= PN_MAX_SPLITS; s *= 2)
        if (K % (8 * s) == 0)
            c |= 1u << s;
    return c;
}

/* One way of doing the call: splits 0 the plain pair, else that many partials; the residual
 * sum goes to res_out (the residual itself, or scratch while timing). */
static void run(KCudaProjNorm *p, KCudaGemm *g, int splits, void *res_out, const void *residual,
                void *normed, void *proj, const void *x, DType act, const Tensor *w,
                const Tensor *norm_w, int n, float eps, cudaStream_t s) {
    const int N = (int)w->shape[0];
    if (splits == 0) {
        k_cuda_matmul(g, proj, x, act, w, NULL, n, s);
        kc_add_rmsnorm_ex(res_out, residual, proj, 0, 0, normed, act, norm_w, n, N, eps, s);
        return;
    }
    kc_matmul_partials(g, p->partials, (int64_t)p->split_stride, x, act, w, n, splits, s);
    kc_add_rmsnorm_ex(res_out, residual, p->partials, splits, p->split_stride, normed, act, norm_w,
                      n, N, eps, s);
}

/* The fastest of the candidates on this call's operands: each runs once untimed (its GEMMs
 * pick their algorithms), then PN_REPS times between two events. The residual sum goes to
 * scratch (the partials buffer's tail for the plain pair, proj for the splits). */
static int fastest(KCudaProjNorm *p, KCudaGemm *g, unsigned cand, const void *residual,
                   void *normed, void *proj, const void *x, DType act, const Tensor *w,
                   const Tensor *norm_w, int n, float eps, cudaStream_t s) {
    cudaEvent_t ev[2 * (PN_MAX_SPLITS + 1)];
    int best = 0;
    float best_ms = 0.0f;
    for (int splits = 0; splits <= PN_MAX_SPLITS; splits++) {
        if (!(cand >> splits & 1))
            continue;
        void *scratch = splits ? proj : (void *)(p->partials + p->split_stride);
        cudaEvent_t *e = &ev[2 * splits];
        CUDA_CHECK(cudaEventCreate(&e[0]));
        CUDA_CHECK(cudaEventCreate(&e[1]));
        run(p, g, splits, scratch, residual, normed, proj, x, act, w, norm_w, n, eps, s);
        CUDA_CHECK(cudaEventRecord(e[0], s));
        for (int r = 0; r < PN_REPS; r++)
            run(p, g, splits, scratch, residual, normed, proj, x, act, w, norm_w, n, eps, s);
        CUDA_CHECK(cudaEventRecord(e[1], s));
        CUDA_CHECK(cudaEventSynchronize(e[1]));
        float ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&ms, e[0], e[1]));
        CUDA_CHECK(cudaEventDestroy(e[0]));
        CUDA_CHECK(cudaEventDestroy(e[1]));
        if (splits == 0 || ms < best_ms) {
            best = splits;
            best_ms = ms;
        }
    }
    return best;
}

void k_cuda_matmul_add_rmsnorm(KCudaProjNorm *p, KCudaGemm *g, void *residual, void *normed,
                               void *proj, const void *x, DType act, const Tensor *w,
                               const Tensor *norm_w, int n, float eps, void *stream) {
    KC_REQUIRE(p && g && w && w->ndim == 2 && norm_w,
               "k_cuda_matmul_add_rmsnorm: needs its state, a gemm, a 2-D weight and a norm");
    if (n <= 0)
        return;
    cudaStream_t s = kc_stream(stream);
    const int N = (int)w->shape[0], K = (int)w->shape[1];
    /* the capture status (a driver call) is asked only when allocating or timing */
    if (!p->partials && (act == DT_BF16 || act == DT_F16) && !kc_capturing(s)) {
        p->N = N;
        p->split_stride = (size_t)PN_MAX_ROWS * (size_t)N;
        p->partials = (float *)k_cuda_malloc(PN_MAX_SPLITS * p->split_stride * sizeof(float));
    }
    unsigned cand = candidates(p, g, residual, normed, x, act, w, norm_w, n);
    int splits = 0;
    if (p->forced >= 0) {
        splits = cand >> p->forced & 1 ? p->forced : 0;
    } else if (cand != 1) {
        const int mb = (n + 15) / 16 * 16;
        const int c = kc_choice_find(&p->choices, KC_OP_ADD_RMSNORM, mb, N, K);
        if (c != KC_NO_CHOICE && (cand >> c & 1)) {
            splits = c;
        } else if (c == KC_NO_CHOICE && !kc_choice_full(&p->choices) && !kc_capturing(s)) {
            splits = fastest(p, g, cand, residual, normed, proj, x, act, w, norm_w, n, eps, s);
            kc_choice_add(&p->choices, KC_OP_ADD_RMSNORM, mb, N, K, splits);
        }
    }
    run(p, g, splits, residual, residual, normed, proj, x, act, w, norm_w, n, eps, s);
}
