/* activation.cu - the gated MLP activation out = silu(gate) * up, silu(g) = g / (1 + e^-g)
 * (torch's formula, accurate expf), element-wise over [n, dim]. */
#include "cuda_internal.cuh"

template <typename T>
__global__ void silu_mul_kernel(T *out, const T *gate, const T *up, size_t total) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = to_f32(gate[i]);
        out[i] = from_f32<T>(g / (1.0f + expf(-g)) * to_f32(up[i]));
    }
}

void k_cuda_silu_mul(void *out, const void *gate, const void *up, DType act, int n, int dim,
                     void *stream) {
    size_t total = (size_t)(n > 0 ? n : 0) * (size_t)(dim > 0 ? dim : 0);
    if (total == 0)
        return;
    KC_DISPATCH_ACT(act, "k_cuda_silu_mul", T,
                    silu_mul_kernel<T><<<kc_blocks(total, 256), 256, 0, kc_stream(stream)>>>(
                        (T *)out, (const T *)gate, (const T *)up, total));
    CUDA_CHECK_LAUNCH();
}
