/* matmul_fp8_fused.cu - the residual add + RMSNorm and the SiLU-times-up fused with the fp8
 * projection that reads their output. An fp8 matmul quantizes its input rows in a kernel of its
 * own before the cuBLASLt or wgmma GEMM, and the one-row GEMV in every block (matmul_fp8.cu,
 * gemv_fp8.cuh); here the op that writes those rows quantizes them instead of storing them in 16
 * bits (norm.cu's vector kernel, activation.cu's row kernel), so the GEMM or GEMV follows it
 * directly: one launch fewer per multi-row projection, no amax pass in the GEMV's blocks, and the
 * rows are neither written in 16 bits nor read back. The quantization is the same fp32
 * arithmetic on the same rounded values, so the outputs are those of the two calls. Shapes,
 * dtypes or alignment the fused kernels, cuBLASLt or the GEMV do not take run as the two calls. */
#include "cuda_internal.cuh"
#include "kernels_cuda.h"

typedef struct {
    void *residual, *normed;
    const void *delta;
    DType act;
    const Tensor *norm_w;
    int dim;
    float eps;
} NormProducer;

static void produce_norm(void *ctx, const KcF8Dst *dst, int r0, int rows, cudaStream_t s) {
    const NormProducer *p = (const NormProducer *)ctx;
    const size_t off = (size_t)r0 * p->dim * pl_dtype_size(p->act);
    kc_add_rmsnorm_f8((char *)p->residual + off, (const char *)p->delta + off,
                      (char *)p->normed + off, p->act, p->norm_w, rows, p->dim, p->eps, dst, s);
}

int k_cuda_add_rmsnorm_matmul(KCudaGemm *g, void *out, void *residual, const void *delta,
                              void *normed, DType act, const Tensor *norm_w, const Tensor *w,
                              const Tensor *bias, int n, float eps, void *stream) {
    const int dim = (int)w->shape[1];
    cudaStream_t s = kc_stream(stream);
    NormProducer p = {residual, normed, delta, act, norm_w, dim, eps};
    if (kc_add_rmsnorm_f8_ok(residual, delta, normed, act, norm_w, dim) &&
        kc_matmul_fp8_produced(g, out, normed, act, w, bias, n, produce_norm, &p, s))
        return 1;
    k_cuda_add_rmsnorm(residual, delta, normed, act, norm_w, n, dim, eps, stream);
    k_cuda_matmul(g, out, normed, act, w, bias, n, stream);
    return 0;
}

typedef struct {
    void *out;
    const void *gate_up;
    DType act;
    int dim;
} SiluProducer;

static void produce_silu(void *ctx, const KcF8Dst *dst, int r0, int rows, cudaStream_t s) {
    const SiluProducer *p = (const SiluProducer *)ctx;
    const size_t es = pl_dtype_size(p->act);
    kc_silu_mul_f8((char *)p->out + (size_t)r0 * p->dim * es,
                   (const char *)p->gate_up + (size_t)r0 * 2 * p->dim * es, p->act, rows, p->dim,
                   dst, s);
}

int k_cuda_silu_mul_matmul(KCudaGemm *g, void *out, void *act_out, const void *gate_up, DType act,
                           const Tensor *w, int n, void *stream) {
    const int dim = (int)w->shape[1];
    cudaStream_t s = kc_stream(stream);
    SiluProducer p = {act_out, gate_up, act, dim};
    if (kc_silu_mul_f8_ok(act_out, gate_up, act, dim) &&
        kc_matmul_fp8_produced(g, out, act_out, act, w, NULL, n, produce_silu, &p, s))
        return 1;
    k_cuda_silu_mul(act_out, gate_up, act, n, dim, stream);
    k_cuda_matmul(g, out, act_out, act, w, NULL, n, stream);
    return 0;
}
