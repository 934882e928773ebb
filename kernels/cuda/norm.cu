/* norm.cu - RMSNorm and the fused residual-add + RMSNorm of the pre-norm block boundary, one
 * block per row (a register-resident vector kernel where the shape allows, else a loop). As the CPU
 * op: out = w * (x * rsqrt(mean(x^2) + eps)), weight multiplied last; the sum of squares is a fp32
 * tree reduction. With a delta, residual + delta is rounded to the activation dtype, stored, and
 * that stored value is what gets normalised (as transformers does in bf16). The delta may also
 * come as S fp32 split-K partials of a projection (kc_add_rmsnorm_ex): their sum is
 * rounded to the activation dtype first, as the projection's own output would have been. The
 * vector kernel can also quantize the rows it writes for the fp8 GEMM after it
 * (kc_add_rmsnorm_f8, the producer of k_cuda_add_rmsnorm_matmul). */
#include "fp8_quant.cuh"

enum { NORM_THREADS = 256, NORM_VEC = 4, NORM_MAX_THREADS = 1024 };

/* x and res_out may alias (the add_rmsnorm case): each element is read, then written, by the
 * same thread. Any dim. */
template <typename T, typename TW>
__global__ __launch_bounds__(NORM_THREADS) void norm_kernel(T *out, const T *x, const T *delta,
                                                            T *res_out, const TW *w, int dim,
                                                            float eps) {
    kc_pdl_wait();
    kc_pdl_trigger();
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

/* d = the S fp32 partials at p, p + stride, ... summed in order, rounded to T. */
template <typename T, int S>
__device__ __forceinline__ void sum_partials(float d[8], const float *p, size_t stride) {
    load8(d, p);
#pragma unroll
    for (int k = 1; k < S; k++) {
        float e[8];
        load8(e, p + (size_t)k * stride);
#pragma unroll
        for (int i = 0; i < 8; i++)
            d[i] += e[i];
    }
#pragma unroll
    for (int i = 0; i < 8; i++)
        d[i] = to_f32(from_f32<T>(d[i]));
}

/* dim % 8 == 0, dim <= 8 * NORM_VEC * NORM_MAX_THREADS, 16-byte aligned rows: each thread
 * holds up to NORM_VEC 8-element vectors in registers between the sum and the scaling, so a
 * row is read once, with all its loads in flight together (a batch-1 row is one block). With
 * Q, the first f8.rows rows are quantized into f8 (KcF8Dst) instead of written to out. */
template <typename T, typename TW, int S = 0, bool Q = false>
__global__ __launch_bounds__(NORM_MAX_THREADS) void norm_vec_kernel(
    T *out, const T *x, const T *delta, T *res_out, const TW *w, int dim, float eps,
    const float *partials, size_t split_stride, KcF8Dst f8) {
    kc_pdl_wait();
    kc_pdl_trigger();
    __shared__ float scratch[32];
    const size_t base = (size_t)blockIdx.x * dim;
    const int nvec = dim / 8;
    /* 16-bit weights are loaded with the row, before the block's sum, and unpacked after it
     * (4 registers per 8 weights; fp32 ones, 8 registers, would spill: loaded after the sum) */
    constexpr bool early_w = sizeof(TW) == 2;
    float v[NORM_VEC][8];
    uint4 wr[NORM_VEC];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < NORM_VEC; j++) {
        int c = threadIdx.x + j * blockDim.x;
        if (c >= nvec)
            break;
        if constexpr (early_w)
            wr[j] = *(const uint4 *)(w + (size_t)c * 8);
        load8(v[j], x + base + (size_t)c * 8);
        if (S > 0 || delta) {
            float d[8];
            if constexpr (S > 0)
                sum_partials<T, S>(d, partials + base + (size_t)c * 8, split_stride);
            else
                load8(d, delta + base + (size_t)c * 8);
#pragma unroll
            for (int e = 0; e < 8; e++)
                v[j][e] = to_f32(from_f32<T>(v[j][e] + d[e]));
            store8(res_out + base + (size_t)c * 8, v[j]);
        }
#pragma unroll
        for (int e = 0; e < 8; e++)
            ss += v[j][e] * v[j][e];
    }
    ss = block_sum(ss, scratch);
    float inv = 1.0f / sqrtf(ss / (float)dim + eps);
#pragma unroll
    for (int j = 0; j < NORM_VEC; j++) {
        int c = threadIdx.x + j * blockDim.x;
        if (c >= nvec)
            break;
        float wv[8];
        if constexpr (early_w)
            unpack8(wv, wr[j], w);
        else
            load8(wv, w + (size_t)c * 8);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            v[j][e] = wv[e] * (v[j][e] * inv);
            if constexpr (Q)
                v[j][e] = to_f32(from_f32<T>(v[j][e])); /* as stored: what matmul would read */
        }
        if (!Q || (int)blockIdx.x >= f8.rows) /* a quantized row's 16-bit copy is not read */
            store8(out + base + (size_t)c * 8, v[j]);
    }
    if constexpr (Q) {
        f8_fill_wvec(f8);
        if ((int)blockIdx.x < f8.rows)
            f8_quant_row<NORM_VEC>(v, dim, blockIdx.x, f8, scratch);
    }
}

/* The vector kernel's shape and alignment: 16-byte alignment of every row (fp32 vectors are two
 * 16-byte loads). */
static bool norm_vec_ok(const void *out, const void *x, const void *delta, const Tensor *w,
                        DType act, int dim) {
    return dim % 8 == 0 && dim <= 8 * NORM_VEC * NORM_MAX_THREADS && kc_aligned16(out) &&
           kc_aligned16(x) && kc_aligned16(delta) && kc_aligned16(w->data) &&
           ((size_t)dim * pl_dtype_size(act)) % 16 == 0;
}

static int norm_vec_threads(int dim) {
    int threads = (dim / 8 + NORM_VEC - 1) / NORM_VEC;
    return ((threads + 31) / 32) * 32;
}

static void launch_norm(void *out, const void *x, const void *delta, void *res_out, DType act,
                        const Tensor *w, int n, int dim, float eps, void *stream,
                        const char *what) {
    KC_REQUIRE(w->ndim == 1 && w->shape[0] == dim, "%s: weight shape does not match dim %d", what,
               dim);
    if (n <= 0)
        return;
    bool vec = norm_vec_ok(out, x, delta, w, act, dim);
    int threads = norm_vec_threads(dim);
    KC_DISPATCH_ACT(
        act, what, T,
        KC_DISPATCH_WEIGHT(
            w->dtype, what, TW,
            if (vec) kc_launch_pdl(norm_vec_kernel<T, TW>, dim3(n), dim3(threads), 0,
                                   kc_stream(stream), (T *)out, (const T *)x, (const T *)delta,
                                   (T *)res_out, (const TW *)w->data, dim, eps,
                                   (const float *)nullptr, (size_t)0, KcF8Dst{});
            else kc_launch_pdl(norm_kernel<T, TW>, dim3(n), dim3(NORM_THREADS), 0,
                               kc_stream(stream), (T *)out, (const T *)x, (const T *)delta,
                               (T *)res_out, (const TW *)w->data, dim, eps)));
}

void k_cuda_rmsnorm(void *out, const void *x, DType act, const Tensor *w, int n, int dim, float eps,
                    void *stream) {
    launch_norm(out, x, NULL, NULL, act, w, n, dim, eps, stream, "k_cuda_rmsnorm");
}

void k_cuda_add_rmsnorm(void *residual, const void *delta, void *out, DType act, const Tensor *w,
                        int n, int dim, float eps, void *stream) {
    launch_norm(out, residual, delta, residual, act, w, n, dim, eps, stream, "k_cuda_add_rmsnorm");
}

bool kc_add_rmsnorm_partials_ok(const void *residual, const void *out, const float *partials,
                                DType act, const Tensor *w, int dim) {
    return (act == DT_BF16 || act == DT_F16) && w->ndim == 1 && w->shape[0] == dim &&
           norm_vec_ok(out, residual, partials, w, act, dim);
}

void kc_add_rmsnorm_ex(void *res_out, const void *residual, const void *delta, int splits,
                       size_t split_stride, void *out, DType act, const Tensor *w, int n, int dim,
                       float eps, cudaStream_t s) {
    if (splits == 0) {
        launch_norm(out, residual, delta, res_out, act, w, n, dim, eps, s, "kc_add_rmsnorm_ex");
        return;
    }
    const float *partials = (const float *)delta;
    KC_REQUIRE(kc_add_rmsnorm_partials_ok(residual, out, partials, act, w, dim) &&
                   kc_aligned16(res_out) && split_stride % 4 == 0,
               "kc_add_rmsnorm_ex: shape, dtype or alignment the vector kernel does not take");
    if (n <= 0)
        return;
    const dim3 grid(n), block(norm_vec_threads(dim));
#define NORM_PARTIALS_CASE(S)                                                                      \
    case S:                                                                                        \
        KC_DISPATCH_ACT(                                                                           \
            act, "kc_add_rmsnorm_ex", T,                                                           \
            KC_DISPATCH_WEIGHT(w->dtype, "kc_add_rmsnorm_ex", TW,                                  \
                               kc_launch_pdl(norm_vec_kernel<T, TW, S>, grid, block, 0, s,         \
                                             (T *)out, (const T *)residual, (const T *)nullptr,    \
                                             (T *)res_out, (const TW *)w->data, dim, eps,          \
                                             partials, split_stride, KcF8Dst{})));                 \
        break;
    switch (splits) {
        NORM_PARTIALS_CASE(2)
        NORM_PARTIALS_CASE(4)
        default:
            pl_fatal(__FILE__, __LINE__, "kc_add_rmsnorm_ex: %d partials (0, 2 or 4)", splits);
    }
#undef NORM_PARTIALS_CASE
}

bool kc_add_rmsnorm_f8_ok(const void *residual, const void *delta, const void *out, DType act,
                          const Tensor *w, int dim) {
    return w->ndim == 1 && w->shape[0] == dim && norm_vec_ok(out, residual, delta, w, act, dim);
}

void kc_add_rmsnorm_f8(void *residual, const void *delta, void *out, DType act, const Tensor *w,
                       int n, int dim, float eps, const KcF8Dst *dst, cudaStream_t s) {
    KC_REQUIRE(kc_add_rmsnorm_f8_ok(residual, delta, out, act, w, dim),
               "kc_add_rmsnorm_f8: shape, dtype or alignment the vector kernel does not take");
    if (n <= 0)
        return;
    KC_DISPATCH_ACT(act, "kc_add_rmsnorm_f8", T,
                    KC_DISPATCH_WEIGHT(w->dtype, "kc_add_rmsnorm_f8", TW,
                                       kc_launch_pdl(norm_vec_kernel<T, TW, 0, true>, dim3(n),
                                                     dim3(norm_vec_threads(dim)), 0, s, (T *)out,
                                                     (const T *)residual, (const T *)delta,
                                                     (T *)residual, (const TW *)w->data, dim, eps,
                                                     (const float *)nullptr, (size_t)0, *dst)));
}
