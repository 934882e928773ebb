/* matmul_fp8.c - the reference of matmul with an fp8 weight (include/kernels.h, matmul): the
 * rows of x quantized to e4m3 (per row, or per row and block of B columns), multiplied by the
 * e4m3 weight, each group's dot product scaled by its activation and weight scales.
 *
 * Decoding e4m3 is exact and so is the product of two e4m3 values in fp32, so a GPU kernel
 * computing the same groups differs from this only in the order it sums the products. Each
 * dot is 8 fp32 lanes (lane l summing k = l mod 8 of the group in order) reduced as
 * ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), then the group's tail in order; the group terms are
 * added in increasing g, then the bias. The quantized x is made once by the calling thread;
 * the worker pool splits N. */
#include <math.h>
#include <pthread.h>

#include "cpu_internal.h"

static float e4m3_table[256];
static pthread_once_t e4m3_once = PTHREAD_ONCE_INIT;

static void e4m3_table_init(void) {
    for (int q = 0; q < 256; q++)
        e4m3_table[q] = pl_f8e4m3_to_f32((uint8_t)q);
}

typedef struct {
    float *out;
    const float *xq; /* [n, K]: x quantized to e4m3 and decoded */
    const float *xs; /* [n, groups]: the activation scale of each group */
    const uint8_t *w;
    const Fp8Scales *sc;
    const void *bias; /* NULL = none */
    DType bdt;
    int n, N, K;
    int group, groups; /* columns per group (K unless block scales), groups per row */
} Fp8MatmulJob;

static float dot8(const float *a, const float *b, int len) {
    float l[8] = {0};
    int k = 0;
    for (; k + 8 <= len; k += 8)
        for (int t = 0; t < 8; t++)
            l[t] += a[k + t] * b[k + t];
    float s = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
    for (; k < len; k++)
        s += a[k] * b[k];
    return s;
}

static float weight_scale(const Fp8MatmulJob *jb, int j, int g) {
    switch (jb->sc->kind) {
        case FP8_SCALE_TENSOR:
            return jb->sc->w_scale[0];
        case FP8_SCALE_CHANNEL:
            return jb->sc->w_scale[j];
        case FP8_SCALE_BLOCK:
            return jb->sc->w_scale[(size_t)(j / jb->sc->block) * (size_t)jb->groups + (size_t)g];
        default:
            pl_fatal(__FILE__, __LINE__, "fp8 weight without scales");
    }
}

static void fp8_task(void *ctx, int tid, int nt) {
    const Fp8MatmulJob *jb = ctx;
    int j0 = (int)((int64_t)jb->N * tid / nt), j1 = (int)((int64_t)jb->N * (tid + 1) / nt);
    float *wrow = cpu_scratch(0, (size_t)jb->K * sizeof(float));
    for (int j = j0; j < j1; j++) {
        const uint8_t *wq = jb->w + (size_t)j * (size_t)jb->K;
        for (int k = 0; k < jb->K; k++)
            wrow[k] = e4m3_table[wq[k]];
        for (int i = 0; i < jb->n; i++) {
            const float *x = jb->xq + (size_t)i * (size_t)jb->K;
            float acc = 0.0f;
            for (int g = 0; g < jb->groups; g++) {
                int c0 = g * jb->group, len = c0 + jb->group < jb->K ? jb->group : jb->K - c0;
                float s =
                    jb->xs[(size_t)i * (size_t)jb->groups + (size_t)g] * weight_scale(jb, j, g);
                acc += dot8(x + c0, wrow + c0, len) * s;
            }
            if (jb->bias)
                acc += cpu_load_f32(jb->bias, jb->bdt, (size_t)j);
            jb->out[(size_t)i * (size_t)jb->N + (size_t)j] = acc;
        }
    }
}

/* Quantize x[n, K] group by group into xq (decoded values) and xs (scales). */
static void quantize_rows(float *xq, float *xs, const float *x, int n, int K, int group, int groups,
                          float input_scale) {
    for (int i = 0; i < n; i++) {
        for (int g = 0; g < groups; g++) {
            const float *src = x + (size_t)i * K + (size_t)g * group;
            float *dst = xq + (size_t)i * K + (size_t)g * group;
            int len = (g + 1) * group <= K ? group : K - g * group;
            float s = input_scale;
            if (s <= 0.0f) {
                float amax = 0.0f;
                for (int k = 0; k < len; k++)
                    amax = fmaxf(amax, fabsf(src[k]));
                s = fmaxf(amax / PL_F8E4M3_MAX, PL_F8E4M3_MIN_SCALE);
            }
            float inv = 1.0f / s;
            for (int k = 0; k < len; k++)
                dst[k] = e4m3_table[pl_f32_to_f8e4m3(src[k] * inv)];
            xs[(size_t)i * groups + g] = s;
        }
    }
}

void cpu_matmul_fp8(const KernelOps *ops, float *out, const float *x, const Tensor *w,
                    const Tensor *bias, int n) {
    const Fp8Scales *sc = &w->fp8;
    PL_CHECK(w->ndim == 2 && sc->w_scale && sc->kind != FP8_SCALE_NONE);
    PL_CHECK(sc->kind != FP8_SCALE_BLOCK || sc->block > 0);
    pthread_once(&e4m3_once, e4m3_table_init);
    int N = (int)w->shape[0], K = (int)w->shape[1];
    if (n <= 0 || N <= 0)
        return;
    int group = sc->kind == FP8_SCALE_BLOCK ? sc->block : K;
    int groups = (K + group - 1) / group;
    size_t xq_bytes = (size_t)n * (size_t)K * sizeof(float);
    float *xq = cpu_scratch(3, xq_bytes + (size_t)n * (size_t)groups * sizeof(float));
    float *xs = xq + (size_t)n * (size_t)K;
    quantize_rows(xq, xs, x, n, K, group, groups, sc->input_scale);
    Fp8MatmulJob jb = {
        .out = out,
        .xq = xq,
        .xs = xs,
        .w = w->data,
        .sc = sc,
        .bias = bias ? bias->data : NULL,
        .bdt = bias ? bias->dtype : DT_F32,
        .n = n,
        .N = N,
        .K = K,
        .group = group,
        .groups = groups,
    };
    double macs = (double)n * N * K;
    cpu_parallel(cpu_pool(ops), fp8_task, &jb, macs < 256.0 * 1024 ? 1 : N);
}
