/* activation.cu - element-wise ops on activations: the gated MLP activation
 * out = silu(gate) * up, silu(g) = g / (1 + e^-g) (torch's formula, accurate expf), over the
 * fused gate-up projection's rows [n, 2 dim]; and the widening of activations to fp32. */
#include "cuda_internal.cuh"

template <typename T>
__global__ void silu_mul_kernel(T *out, const T *gate_up, size_t total, int dim) {
    kc_pdl_wait();
    kc_pdl_trigger();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / (size_t)dim, j = i - r * (size_t)dim;
        const T *gate = gate_up + r * 2 * (size_t)dim;
        float g = to_f32(gate[j]);
        out[i] = from_f32<T>(g / (1.0f + expf(-g)) * to_f32(gate[dim + j]));
    }
}

void k_cuda_silu_mul(void *out, const void *gate_up, DType act, int n, int dim, void *stream) {
    size_t total = (size_t)(n > 0 ? n : 0) * (size_t)(dim > 0 ? dim : 0);
    if (total == 0)
        return;
    KC_DISPATCH_ACT(act, "k_cuda_silu_mul", T,
                    kc_launch_pdl(silu_mul_kernel<T>, dim3(kc_blocks(total, 256)), dim3(256), 0,
                                  kc_stream(stream), (T *)out, (const T *)gate_up, total, dim));
}

template <typename T> __global__ void to_f32_kernel(float *out, const T *in, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = to_f32(in[i]);
}

void k_cuda_to_f32(float *out, const void *in, DType act, size_t n, void *stream) {
    if (n == 0)
        return;
    KC_DISPATCH_ACT(act, "k_cuda_to_f32", T,
                    to_f32_kernel<T>
                    <<<kc_blocks(n, 256), 256, 0, kc_stream(stream)>>>(out, (const T *)in, n));
    CUDA_CHECK_LAUNCH();
}
