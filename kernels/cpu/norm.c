/* norm.c - RMSNorm and the fused residual-add + RMSNorm of the pre-norm block boundary.
 *
 * As transformers' LlamaRMSNorm in fp32: out = w * (x * rsqrt(mean(x^2) + eps)), the weight
 * multiplied last. The sum of squares is accumulated in double (in 8 fixed lanes, so it can
 * be vectorised), which is at least as accurate as torch's float reduction. */
#include <math.h>

#include "cpu_internal.h"

static void norm_row(float *out, const float *x, const Tensor *w, int dim, float eps) {
    double lane[8] = {0};
    int i = 0;
    for (; i + 8 <= dim; i += 8)
        for (int j = 0; j < 8; j++)
            lane[j] += (double)x[i + j] * (double)x[i + j];
    double ss =
        ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
    for (; i < dim; i++)
        ss += (double)x[i] * (double)x[i];
    float var = (float)(ss / dim);
    float inv = 1.0f / sqrtf(var + eps);
    switch (w->dtype) {
        case DT_F32: {
            const float *wf = w->data;
            for (i = 0; i < dim; i++)
                out[i] = wf[i] * (x[i] * inv);
            break;
        }
        default:
            for (i = 0; i < dim; i++)
                out[i] = cpu_load_f32(w->data, w->dtype, (size_t)i) * (x[i] * inv);
            break;
    }
}

void cpu_rmsnorm(const KernelOps *ops, void *out_, const void *x_, const Tensor *w, int n, int dim,
                 float eps) {
    float *out = out_;
    const float *x = x_;
    PL_CHECK(w->ndim == 1 && w->shape[0] == dim);
    for (int r = 0; r < n; r++)
        norm_row(out + (size_t)r * dim, x + (size_t)r * dim, w, dim, eps);
}

void cpu_add_rmsnorm(const KernelOps *ops, void *residual_, const void *delta_, void *out_,
                     const Tensor *w, int n, int dim, float eps) {
    float *residual = residual_, *out = out_;
    const float *delta = delta_;
    PL_CHECK(w->ndim == 1 && w->shape[0] == dim);
    for (int r = 0; r < n; r++) {
        float *res = residual + (size_t)r * dim;
        if (delta) {
            const float *d = delta + (size_t)r * dim;
            for (int i = 0; i < dim; i++)
                res[i] += d[i];
        }
        norm_row(out + (size_t)r * dim, res, w, dim, eps);
    }
}
