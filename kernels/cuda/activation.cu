/* activation.cu - element-wise ops on activations: the gated MLP activation
 * out = silu(gate) * up, silu(g) = g / (1 + e^-g) (torch's formula, accurate expf), over the
 * fused gate-up projection's rows [n, 2 dim] (8 elements per thread where rows allow), also as a
 * row per block that quantizes the rows it writes for the fp8 GEMM after it (kc_silu_mul_f8, the
 * producer of k_cuda_silu_mul_matmul); and the widening of activations to fp32. */
#include "fp8_quant.cuh"

enum { SILU_THREADS = 128, SILU_ROW_VEC = 4 };

/* Any shape: one element per thread, grid-stride. */
template <typename T>
__global__ void silu_mul_kernel(T *out, const T *gate_up, size_t total, int dim) {
    kc_pdl_wait();
    kc_pdl_trigger();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / (size_t)dim, j = i - r * (size_t)dim;
        const T *gate = gate_up + r * 2 * (size_t)dim;
        out[i] = from_f32<T>(silu_times(to_f32(gate[j]), to_f32(gate[dim + j])));
    }
}

/* dim % 8 == 0 and 16-byte aligned rows: block (x, row) takes 8 elements per thread of one
 * row, so each thread makes two 16-byte loads and one 16-byte store, with no division. */
template <typename T>
__global__ __launch_bounds__(SILU_THREADS) void silu_mul_vec_kernel(T *out, const T *gate_up,
                                                                    int dim) {
    kc_pdl_wait();
    kc_pdl_trigger();
    const int c = (blockIdx.x * SILU_THREADS + threadIdx.x) * 8;
    if (c >= dim)
        return;
    const size_t r = blockIdx.y;
    float g[8], u[8];
    load8(g, gate_up + r * 2 * (size_t)dim + c);
    load8(u, gate_up + r * 2 * (size_t)dim + dim + c);
#pragma unroll
    for (int e = 0; e < 8; e++)
        g[e] = silu_times(g[e], u[e]);
    store8(out + r * (size_t)dim + c, g);
}

/* Row blockIdx.x, SILU_ROW_VEC 8-element chunks per thread (c = t + j blockDim.x) held in
 * registers until the row's scales are known; the first f8.rows rows quantized into f8
 * instead of written to out. */
template <typename T>
__global__ __launch_bounds__(1024) void silu_mul_f8_kernel(T *out, const T *gate_up, int dim,
                                                           KcF8Dst f8) {
    kc_pdl_wait();
    kc_pdl_trigger();
    __shared__ float red[32];
    const size_t r = blockIdx.x;
    float v[SILU_ROW_VEC][8];
#pragma unroll
    for (int j = 0; j < SILU_ROW_VEC; j++) {
        const int c = (threadIdx.x + j * blockDim.x) * 8;
        if (c >= dim)
            break;
        float u[8];
        load8(v[j], gate_up + r * 2 * (size_t)dim + c);
        load8(u, gate_up + r * 2 * (size_t)dim + dim + c);
#pragma unroll
        for (int e = 0; e < 8; e++)
            v[j][e] = to_f32(from_f32<T>(silu_times(v[j][e], u[e]))); /* as stored */
        if ((int)r >= f8.rows) /* a quantized row's 16-bit copy is not read */
            store8(out + r * (size_t)dim + c, v[j]);
    }
    f8_fill_wvec(f8);
    if ((int)r < f8.rows)
        f8_quant_row<SILU_ROW_VEC>(v, dim, (int)r, f8, red);
}

static int silu_f8_threads(int dim) {
    const int threads = (dim / 8 + SILU_ROW_VEC - 1) / SILU_ROW_VEC;
    return (threads + 31) / 32 * 32;
}

bool kc_silu_mul_f8_ok(const void *out, const void *gate_up, DType act, int dim) {
    return dim % 8 == 0 && dim <= 8 * SILU_ROW_VEC * 1024 && kc_aligned16(out) &&
           kc_aligned16(gate_up) && (dim * pl_dtype_size(act)) % 16 == 0;
}

void kc_silu_mul_f8(void *out, const void *gate_up, DType act, int n, int dim, const KcF8Dst *dst,
                    cudaStream_t s) {
    KC_REQUIRE(kc_silu_mul_f8_ok(out, gate_up, act, dim),
               "kc_silu_mul_f8: shape or alignment the row kernel does not take (dim %d)", dim);
    if (n <= 0)
        return;
    KC_DISPATCH_ACT(act, "kc_silu_mul_f8", T,
                    kc_launch_pdl(silu_mul_f8_kernel<T>, dim3((unsigned)n),
                                  dim3(silu_f8_threads(dim)), 0, s, (T *)out, (const T *)gate_up,
                                  dim, *dst));
}

void k_cuda_silu_mul(void *out, const void *gate_up, DType act, int n, int dim, void *stream) {
    size_t total = (size_t)(n > 0 ? n : 0) * (size_t)(dim > 0 ? dim : 0);
    if (total == 0)
        return;
    const bool vec = dim % 8 == 0 && n <= 65535 && ((uintptr_t)out & 15) == 0 &&
                     ((uintptr_t)gate_up & 15) == 0 && (dim * pl_dtype_size(act)) % 16 == 0;
    KC_DISPATCH_ACT(
        act, "k_cuda_silu_mul", T,
        if (vec) kc_launch_pdl(
            silu_mul_vec_kernel<T>,
            dim3((unsigned)((dim / 8 + SILU_THREADS - 1) / SILU_THREADS), (unsigned)n),
            dim3(SILU_THREADS), 0, kc_stream(stream), (T *)out, (const T *)gate_up, dim);
        else kc_launch_pdl(silu_mul_kernel<T>, dim3(kc_blocks(total, 256)), dim3(256), 0,
                           kc_stream(stream), (T *)out, (const T *)gate_up, total, dim));
}

/* Any length and alignment: one element per thread, grid-stride. */
template <typename T> __global__ void to_f32_kernel(float *out, const T *in, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = to_f32(in[i]);
}

/* 16-byte aligned input and output: 8 elements per thread and step (one 16-byte load for a
 * 16-bit type, two 16-byte stores), grid-stride over the n8 groups of 8; the n % 8 tail is
 * left to the scalar kernel. (The logits of a 256-row decode step, 128256 wide, on the H200:
 * 91.8 us with the scalar kernel alone, 54-58 us so.) */
template <typename T> __global__ void to_f32_vec_kernel(float *out, const T *in, size_t n8) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n8;
         i += (size_t)gridDim.x * blockDim.x) {
        float v[8];
        load8(v, in + 8 * i);
        store8(out + 8 * i, v);
    }
}

void k_cuda_to_f32(float *out, const void *in, DType act, size_t n, void *stream) {
    if (n == 0)
        return;
    cudaStream_t s = kc_stream(stream);
    const size_t n8 = kc_aligned16(out) && kc_aligned16(in) ? n / 8 : 0, tail = n - 8 * n8;
    KC_DISPATCH_ACT(act, "k_cuda_to_f32", T, {
        if (n8) {
            to_f32_vec_kernel<T><<<kc_blocks(n8, 256), 256, 0, s>>>(out, (const T *)in, n8);
            CUDA_CHECK_LAUNCH();
        }
        if (tail) {
            to_f32_kernel<T>
                <<<kc_blocks(tail, 256), 256, 0, s>>>(out + 8 * n8, (const T *)in + 8 * n8, tail);
            CUDA_CHECK_LAUNCH();
        }
    });
}
