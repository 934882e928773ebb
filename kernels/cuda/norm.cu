/* norm.cu - RMSNorm and the fused residual-add + RMSNorm of the pre-norm block boundary, one
 * block per row. As the CPU op: out = w * (x * rsqrt(mean(x^2) + eps)), weight multiplied
 * last; the sum of squares is a fp32 tree reduction. With a delta, residual + delta is
 * rounded to the activation dtype, stored, and that stored value is what gets normalised
 * (as transformers does in bf16). */
#include "cuda_internal.cuh"

enum { NORM_THREADS = 256 };

/* x and res_out may alias (the add_rmsnorm case): each element is read, then written, by the
 * same thread. */
template <typename T, typename TW>
__global__ __launch_bounds__(NORM_THREADS) void norm_kernel(T *out, const T *x, const T *delta,
                                                            T *res_out, const TW *w, int dim,
                                                            float eps) {
    __shared__ float scratch[32];
    size_t base = (size_t)blockIdx.x * dim;
    float ss = 0.0f;
    for (int d = threadIdx.x; d < dim; d += NORM_THREADS) {
        float v = to_f32(x[base + d]);
        if (delta) {
            T r = from_f32<T>(v + to_f32(delta[base + d]));
            res_out[base + d] = r;
            v = to_f32(r);
        }
        ss += v * v;
    }
    ss = block_sum(ss, scratch);
    float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    const T *src = delta ? res_out : x;
    for (int d = threadIdx.x; d < dim; d += NORM_THREADS)
        out[base + d] = from_f32<T>(to_f32(w[d]) * (to_f32(src[base + d]) * inv));
}

static void launch_norm(void *out, const void *x, const void *delta, void *res_out, DType act,
                        const Tensor *w, int n, int dim, float eps, void *stream,
                        const char *what) {
    KC_REQUIRE(w->ndim == 1 && w->shape[0] == dim, "%s: weight shape does not match dim %d", what,
               dim);
    if (n <= 0)
        return;
    KC_DISPATCH_ACT(act, what, T,
                    KC_DISPATCH_WEIGHT(w->dtype, what, TW,
                                       norm_kernel<T, TW>
                                       <<<n, NORM_THREADS, 0, kc_stream(stream)>>>(
                                           (T *)out, (const T *)x, (const T *)delta, (T *)res_out,
                                           (const TW *)w->data, dim, eps)));
    CUDA_CHECK_LAUNCH();
}

void k_cuda_rmsnorm(void *out, const void *x, DType act, const Tensor *w, int n, int dim, float eps,
                    void *stream) {
    launch_norm(out, x, NULL, NULL, act, w, n, dim, eps, stream, "k_cuda_rmsnorm");
}

void k_cuda_add_rmsnorm(void *residual, const void *delta, void *out, DType act, const Tensor *w,
                        int n, int dim, float eps, void *stream) {
    launch_norm(out, residual, delta, residual, act, w, n, dim, eps, stream, "k_cuda_add_rmsnorm");
}
