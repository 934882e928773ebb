/* cuda_internal.cuh - (internal to kernels/cuda/) what the .cu files share: element types and
 * their fp32 conversions, 8-element vector loads, 16-bit pairs packed into a register,
 * shared-memory addresses, warp reductions, the dtype dispatch that
 * turns a DType into a template argument (with a loud error for anything else), and the
 * launch checks. */
#ifndef PAGELLM_KERNELS_CUDA_INTERNAL_CUH
#define PAGELLM_KERNELS_CUDA_INTERNAL_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

#include "kernels_cuda.h"

typedef __nv_bfloat16 bf16;
typedef __half f16;

/* Abort unless the launch just made was accepted (bad configuration, no kernel image). */
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

/* Abort with the launcher's name when an argument check fails. */
#define KC_REQUIRE(cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond))                                                                               \
            pl_fatal(__FILE__, __LINE__, __VA_ARGS__);                                             \
    } while (0)

static inline cudaStream_t kc_stream(void *s) {
    return (cudaStream_t)s;
}

/* Whether work on `s` is being recorded into a CUDA graph (no allocation, no host sync). */
static inline bool kc_capturing(cudaStream_t s) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(s, &cs));
    return cs != cudaStreamCaptureStatusNone;
}

/* ---- element conversions (fp32 math everywhere; round to nearest even on the way down) ---- */

__device__ __forceinline__ float to_f32(float x) {
    return x;
}
__device__ __forceinline__ float to_f32(bf16 x) {
    return __bfloat162float(x);
}
__device__ __forceinline__ float to_f32(f16 x) {
    return __half2float(x);
}

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) {
    return x;
}
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float x) {
    return __float2bfloat16_rn(x);
}
template <> __device__ __forceinline__ f16 from_f32<f16>(float x) {
    return __float2half_rn(x);
}

/* silu(g) * u, silu(g) = g / (1 + e^-g) (torch's formula, accurate expf): the SwiGLU MLP's
 * activation (activation.cu, and the fused gate-up projection of gemv_fused.cu). */
__device__ __forceinline__ float silu_times(float g, float u) {
    return g / (1.0f + expf(-g)) * u;
}

/* Element j of a bias or norm weight in any of the weight dtypes, as fp32. */
__device__ __forceinline__ float load_any(const void *p, int dt, int j) {
    switch (dt) {
        case DT_F32:
            return ((const float *)p)[j];
        case DT_F16:
            return __half2float(((const f16 *)p)[j]);
        default:
            return __bfloat162float(((const bf16 *)p)[j]);
    }
}

/* 8 consecutive elements (16-byte aligned for 16-bit types and for float) as fp32. */
__device__ __forceinline__ void load8(float out[8], const float *p) {
    float4 a = *(const float4 *)p, b = *(const float4 *)(p + 4);
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
    out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
}

/* 8 16-bit elements held in 16 bytes (lowest address first) as fp32; the last argument only
 * selects the type. bf16 widens exactly by a shift into the high half of the fp32 word. */
__device__ __forceinline__ void unpack8(float f[8], uint4 u, const bf16 *) {
    const uint32_t v[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(v[i] << 16);
        f[2 * i + 1] = __uint_as_float(v[i] & 0xffff0000u);
    }
}
__device__ __forceinline__ void unpack8(float f[8], uint4 u, const f16 *) {
    const __half2 *h = (const __half2 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 t = __half22float2(h[i]);
        f[2 * i] = t.x, f[2 * i + 1] = t.y;
    }
}

__device__ __forceinline__ void load8(float out[8], const bf16 *p) {
    unpack8(out, *(const uint4 *)p, p);
}
__device__ __forceinline__ void load8(float out[8], const f16 *p) {
    unpack8(out, *(const uint4 *)p, p);
}

/* 8 fp32 values rounded to the element type and stored together (same alignment as load8). */
__device__ __forceinline__ void store8(float *p, const float v[8]) {
    *(float4 *)p = make_float4(v[0], v[1], v[2], v[3]);
    *(float4 *)(p + 4) = make_float4(v[4], v[5], v[6], v[7]);
}
__device__ __forceinline__ void store8(bf16 *p, const float v[8]) {
    uint4 u;
    __nv_bfloat162 *h = (__nv_bfloat162 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++)
        h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    *(uint4 *)p = u;
}
__device__ __forceinline__ void store8(f16 *p, const float v[8]) {
    uint4 u;
    __half2 *h = (__half2 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++)
        h[i] = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
    *(uint4 *)p = u;
}

/* Two fp32 values rounded to T and packed into one 32-bit register (lo in the low half). */
template <typename T> __device__ __forceinline__ uint32_t pack16(float lo, float hi) {
    uint32_t r;
    if constexpr (std::is_same<T, bf16>::value) {
        __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        r = *(uint32_t *)&h;
    } else {
        __half2 h = __floats2half2_rn(lo, hi);
        r = *(uint32_t *)&h;
    }
    return r;
}

/* The shared-memory address of a generic pointer into shared memory (for cp.async, ldmatrix,
 * mbarrier and TMA operands). */
__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* c[16x8] += a[16x16] b[16x8], 16-bit inputs (T: bf16 or f16), fp32 accumulators. */
template <typename T>
__device__ __forceinline__ void mma16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    if constexpr (std::is_same<T, bf16>::value)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* v reduced by the warp reduction WR (warp_sum, warp_max) over all threads of a block of at
 * most 1024 threads (blockDim.x a multiple of 32), lanes past the warps padded with 0; every
 * thread gets the result. `scratch` holds 32 floats; reusable after the call. */
template <float (*WR)(float)>
__device__ __forceinline__ float block_reduce(float v, float *scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = WR(v);
    __syncthreads(); /* scratch may still be read by a previous call */
    if (lane == 0)
        scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : 0.0f;
    return WR(v);
}
__device__ __forceinline__ float block_sum(float v, float *scratch) {
    return block_reduce<warp_sum>(v, scratch);
}
/* Of non-negative values (the 0 padding). */
__device__ __forceinline__ float block_max(float v, float *scratch) {
    return block_reduce<warp_max>(v, scratch);
}

/* Exclusive prefix sum of x over a block of WARPS warps (its whole size) in thread order;
 * *total gets the block's sum. `scratch` holds WARPS + 1 entries; reusable after the call. */
template <int WARPS, typename V>
__device__ __forceinline__ V block_scan(V x, V *total, V *scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    V incl = x;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        V y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o)
            incl += y;
    }
    __syncthreads(); /* scratch may still be read by a previous call */
    if (lane == 31)
        scratch[warp] = incl;
    __syncthreads();
    if (threadIdx.x == 0) {
        V run = 0;
        for (int w = 0; w < WARPS; w++) {
            V t = scratch[w];
            scratch[w] = run;
            run += t;
        }
        scratch[WARPS] = run;
    }
    __syncthreads();
    *total = scratch[WARPS];
    return scratch[warp] + incl - x;
}

/* Row index of the sequence holding query row `row`: the last s with query_start[s] <= row.
 * First the guess that every sequence before it has one row (a decode batch, and the decode
 * rows ahead of a step's prompts), checked with two loads in flight together; else a binary
 * search, a load per halving (ten at 1024 sequences, each waiting on the one before). */
__device__ __forceinline__ int seq_of_row(const int32_t *query_start, int num_seqs, int row) {
    const int guess = row - query_start[0];
    if (guess >= 0 && guess < num_seqs) {
        const int at = query_start[guess], next = query_start[guess + 1];
        if (at <= row && row < next)
            return guess;
    }
    int lo = 0, hi = num_seqs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (query_start[mid] <= row)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* ---- dtype dispatch: body runs with `using T = <C++ type of dt>` ----
 * KC_DISPATCH_ACT for activations, KC_DISPATCH_WEIGHT for 16/32-bit weights: the same three
 * types, an error naming `what` and which operand otherwise. */

#define KC_DISPATCH_FLOAT(dt, what, operand, T, ...)                                               \
    do {                                                                                           \
        switch (dt) {                                                                              \
            case DT_F32: {                                                                         \
                using T = float;                                                                   \
                __VA_ARGS__;                                                                       \
                break;                                                                             \
            }                                                                                      \
            case DT_BF16: {                                                                        \
                using T = bf16;                                                                    \
                __VA_ARGS__;                                                                       \
                break;                                                                             \
            }                                                                                      \
            case DT_F16: {                                                                         \
                using T = f16;                                                                     \
                __VA_ARGS__;                                                                       \
                break;                                                                             \
            }                                                                                      \
            default:                                                                               \
                pl_fatal(__FILE__, __LINE__, "%s: unsupported %s %s (F32, BF16 or F16)", what,     \
                         operand, pl_dtype_name(dt));                                              \
        }                                                                                          \
    } while (0)
#define KC_DISPATCH_ACT(dt, what, T, ...) KC_DISPATCH_FLOAT(dt, what, "dtype", T, __VA_ARGS__)
#define KC_DISPATCH_WEIGHT(dt, what, T, ...)                                                       \
    KC_DISPATCH_FLOAT(dt, what, "weight dtype", T, __VA_ARGS__)

/* ---- programmatic dependent launch (Hopper) ----
 * A kernel launched by kc_launch_pdl may start while the kernel before it on the stream is
 * still running: its blocks become resident as soon as every block of that kernel has called
 * kc_pdl_trigger, and wait in kc_pdl_wait until it has completed and its writes are visible.
 * Such a kernel must call kc_pdl_wait before it reads or writes any activation (it may read
 * weights before, which is how a GEMV streams its first weights during the previous kernel),
 * then kc_pdl_trigger, so that the next kernel can start the same way. Both are no-ops when
 * the kernel was launched normally or below sm_90. In a CUDA graph these become programmatic
 * edges. */
__device__ __forceinline__ void kc_pdl_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void kc_pdl_trigger(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

int kc_pdl_enabled(void); /* runtime.cu: sm_90 or newer */
int kc_sm_count(void);    /* runtime.cu: the current device's SMs, looked up once per device */

template <typename... KArgs, typename... Args>
static inline void kc_launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                 cudaStream_t stream, Args... args) {
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = &attr;
    cfg.numAttrs = kc_pdl_enabled() ? 1 : 0;
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, ((KArgs)args)...));
}

/* p on a 16-byte boundary (NULL counts as aligned: an absent operand) */
static inline bool kc_aligned16(const void *p) {
    return ((uintptr_t)p & 15) == 0;
}

/* Blocks for a grid-stride loop over `total` elements with `threads` per block. */
static inline unsigned kc_blocks(size_t total, int threads) {
    size_t b = (total + (size_t)threads - 1) / (size_t)threads;
    if (b < 1)
        b = 1;
    if (b > 65535u * 16u)
        b = 65535u * 16u;
    return (unsigned)b;
}

/* ---- the pieces of k_cuda_matmul_add_rmsnorm (matmul_norm.cu) ---- */

/* partials[i] = x[:, slice i] w[:, slice i]^T in fp32 for the `splits` (> 1) equal slices of K,
 * each [n, N], split_stride elements apart (16-bit x and w of the same dtype, K % (8 splits)
 * == 0); cuBLASLt, one strided-batched call (matmul.cu). */
void kc_matmul_partials(KCudaGemm *g, float *partials, int64_t split_stride, const void *x,
                        DType act, const Tensor *w, int n, int splits, cudaStream_t s);

/* res_out = residual + delta rounded to act, out = rmsnorm(res_out) * w (norm.cu). delta is
 * [n, dim] in act (splits 0), or `splits` (2 or 4) fp32 partials split_stride elements apart
 * (a multiple of 4: each 16-byte aligned), summed and rounded to act first; res_out may be
 * residual. The partials take the vector kernel only: kc_add_rmsnorm_partials_ok says whether
 * the operands fit it. */
void kc_add_rmsnorm_ex(void *res_out, const void *residual, const void *delta, int splits,
                       size_t split_stride, void *out, DType act, const Tensor *w, int n, int dim,
                       float eps, cudaStream_t s);
bool kc_add_rmsnorm_partials_ok(const void *residual, const void *out, const float *partials,
                                DType act, const Tensor *w, int dim);

/* ---- fp8 weights (matmul_fp8.cu) ---- */

/* out[n, N] = x w^T (+ bias) for an fp8 weight (w->dtype DT_F8E4M3) with matmul's fp8
 * semantics (include/kernels.h); k_cuda_matmul hands such calls here after its checks (bias
 * NULL or 1-D of length N). */
void kc_matmul_fp8(KCudaGemm *g, void *out, const void *x, DType act, const Tensor *w,
                   const Tensor *bias, int n, cudaStream_t s);

/* Where a producing op (a norm, SiLU times up) writes the rows it makes quantized for the fp8
 * GEMM after it (fp8_quant.cuh's f8_quant_row): of the launch's rows (one chunk of the GEMM's),
 * the first `rows` go to q[rows, K] (e4m3) and their scales to xs[g * rows + r] (g a
 * 128-column group with block scales, else 0); the scale s = input_scale when > 0, else from
 * the group's amax. wvec (NULL: none) gets wvec_n copies of *w_scale0 (a per-tensor weight
 * scale). */
typedef struct {
    uint8_t *q;
    float *xs;
    int rows, block;
    float input_scale;
    float *wvec;
    const float *w_scale0;
    int wvec_n;
} KcF8Dst;

/* Launches the producing op on rows [r0, r0 + rows) of its output (rows >= dst->rows: the last
 * chunk also makes the 1-3 rows the GEMV takes, unquantized), quantized into dst. */
typedef void (*KcF8Produce)(void *ctx, const KcF8Dst *dst, int r0, int rows, cudaStream_t s);

/* out = x w^T (+ bias) as kc_matmul_fp8, x [n, K] made by `produce` (its other outputs too),
 * chunk by chunk, quantizing as it writes; false (nothing launched) where cuBLASLt has no
 * algorithm: then the caller runs the op and the matmul apart. */
bool kc_matmul_fp8_produced(KCudaGemm *g, void *out, const void *x, DType act, const Tensor *w,
                            const Tensor *bias, int n, KcF8Produce produce, void *ctx,
                            cudaStream_t s);

/* Where one row of x for the one-row fp8 GEMV on w goes quantized (the gemm's fp8 buffers:
 * d->q [1, K], d->xs [1]; gemv_fp8_run then reads them); false where they cannot be allocated
 * now (a graph capture before any eager fp8 call). */
bool kc_fp8_row_dst(KCudaGemm *g, const Tensor *w, KcF8Dst *d, cudaStream_t s);

/* The producers: add_rmsnorm (norm.cu's vector kernel) and silu_mul (activation.cu, a row a
 * block) on n rows, the first dst->rows of them quantized into dst and not written to out (the
 * GEMM reads them from dst; out gets only the rows after them, which the GEMV reads); the _ok
 * functions say whether the shapes and alignment fit them (else the caller runs the plain op
 * and matmul). */
bool kc_add_rmsnorm_f8_ok(const void *residual, const void *delta, const void *out, DType act,
                          const Tensor *w, int dim);
void kc_add_rmsnorm_f8(void *residual, const void *delta, void *out, DType act, const Tensor *w,
                       int n, int dim, float eps, const KcF8Dst *dst, cudaStream_t s);
bool kc_silu_mul_f8_ok(const void *out, const void *gate_up, DType act, int dim);
void kc_silu_mul_f8(void *out, const void *gate_up, DType act, int n, int dim, const KcF8Dst *dst,
                    cudaStream_t s);

/* matmul_fp8_sm90a.cu: out[n, N] for KC_F8W_MIN_ROWS to KC_F8W_MAX_ROWS rows already quantized (q
 * [n, K], xs [n]: KcF8Dst's layout with one scale a row) and a per-tensor or per-channel fp8 w, on
 * Hopper's fp8 wgmma, with matmul's fp8 semantics; bias as the GEMV takes it. kc_f8w_takes says
 * whether it takes (act, w, n) at all (never in a build without sm_90a). Its workspace: part,
 * KC_F8W_PART_FLOATS floats, and arrivals, KC_F8W_TILES counters zeroed once. */
enum {
    KC_F8W_MIN_ROWS = 4,
    KC_F8W_MAX_ROWS = 8,
    KC_F8W_PART_FLOATS = 1 << 19,
    KC_F8W_TILES = 4096
};
bool kc_f8w_takes(DType act, const Tensor *w, int n);
void kc_f8w_matmul(void *out, const uint8_t *q, const float *xs, DType act, const Tensor *w,
                   const Tensor *bias, int n, float *part, unsigned *arrivals, cudaStream_t s);

/* The gemm's fp8 state (NULL until the first fp8 call that needs it), freed and counted with
 * the gemm. */
typedef struct KcFp8 KcFp8;
KcFp8 **kc_gemm_fp8(KCudaGemm *g);
void kc_fp8_destroy(KcFp8 *f);
size_t kc_fp8_device_bytes(const KcFp8 *f);

/* The gemm's cuBLASLt handle (a cublasLtHandle_t) and workspace, and its forced path
 * (KCudaGemmPath), for matmul_fp8.cu. */
void *kc_gemm_lt(KCudaGemm *g, void **workspace, size_t *workspace_bytes);
int kc_gemm_forced_path(const KCudaGemm *g);
/* The GEMV rows per warp forced by k_cuda_gemm_force (0: the default), matmul.cu; for fp8, 2
 * means two m16 tiles per block (32 weight rows), else one. */
int kc_gemm_forced_rows(const KCudaGemm *g);

/* Whether kc_matmul_fp8 runs all n rows of x on gemv_fp8.cuh's one-row GEMV (gemv_fused.cu
 * then runs that GEMV with an epilogue of its own). */
bool kc_fp8_row_gemv_takes(KCudaGemm *g, DType act, const Tensor *w, const void *x, int n);
/* Whether kc_matmul_fp8 hands w (with x) to kc_matmul_fp8_generic: K % 16 != 0, x or w off a
 * 16-byte boundary, or block scales other than 128 x 128 (matmul_fp8_generic.cu). */
bool kc_fp8_generic_takes(const Tensor *w, const void *x);
void kc_matmul_fp8_generic(void *out, const void *x, DType act, const Tensor *w, const Tensor *bias,
                           int n, cudaStream_t s);

/* out[i, j] += bias[j] over out[n, N] in act (matmul.cu). */
void kc_bias_add(void *out, DType act, const Tensor *bias, int n, int N, cudaStream_t s);

/* ---- the own Hopper GEMM (gemm_sm90a.cu) ---- */

/* Variants are KCudaSiluMulPath's KC_SILU_MUL_N224 and KC_SILU_MUL_N224_CLUSTER2 (kernels_cuda.h).
 */
enum { KC_WGMMA_VARIANTS = 2, KC_WGMMA_MAX_ROWS = 512 };

/* k_cuda_matmul_silu_mul beyond the GEMV's rows: runs the call on the own GEMM and returns true
 * where that is the gemm's forced or measured path for it (kernels_cuda.h), false where the
 * caller is to make the two calls. */
bool kc_wgmma_silu_mul_try(KCudaGemm *g, void *out, void *gate_up, const void *x, DType act,
                           const Tensor *w, int n, cudaStream_t s);

/* ---- what a fused op measured fastest, per (op, row bucket, N, K) ---- */

/* A fused op times its forms on the first eager call of a shape and keeps the fastest here;
 * once the table is full, new shapes take the op's default form untimed. */
enum { KC_NO_CHOICE = -100, KC_CHOICES_MAX = 256, KC_OP_SILU_MUL = 1, KC_OP_ADD_RMSNORM = 2 };
typedef struct {
    int op, mb, N, K, choice;
} KcChoice;
typedef struct {
    KcChoice entry[KC_CHOICES_MAX];
    int count;
} KcChoices;

/* The choice stored for the shape, or KC_NO_CHOICE. */
static inline int kc_choice_find(const KcChoices *t, int op, int mb, int N, int K) {
    for (int i = 0; i < t->count; i++) {
        const KcChoice *c = &t->entry[i];
        if (c->op == op && c->mb == mb && c->N == N && c->K == K)
            return c->choice;
    }
    return KC_NO_CHOICE;
}
static inline bool kc_choice_full(const KcChoices *t) {
    return t->count == KC_CHOICES_MAX;
}
/* Only when !kc_choice_full(t). */
static inline void kc_choice_add(KcChoices *t, int op, int mb, int N, int K, int choice) {
    t->entry[t->count++] = KcChoice{op, mb, N, K, choice};
}

KcChoices *kc_gemm_choices(KCudaGemm *g);                   /* the gemm's table (matmul.cu) */
KCudaSiluMulPath kc_gemm_silu_mul_path(const KCudaGemm *g); /* forced, or KC_SILU_MUL_AUTO */

/* Raise a kernel's dynamic shared-memory limit once it asks for more than the default 48 KB.
 * The attribute is per kernel and device, so each thread remembers the largest limit it set
 * for each (kernel, device) and calls cudaFuncSetAttribute only when a launch needs more: an
 * eager launch then costs no driver call (tensor-parallel ranks each drive their device from
 * their own thread; a thread that has seen more kernels than the table holds just sets the
 * attribute again). */
struct KcSmemLimit {
    const void *kernel;
    int device;
    size_t bytes;
};
enum { KC_SMEM_LIMITS = 32 };

template <typename K> static inline void kc_set_smem(K kernel, size_t bytes) {
    if (bytes <= 48 * 1024)
        return;
    static thread_local KcSmemLimit set[KC_SMEM_LIMITS];
    static thread_local int num_set;
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    KcSmemLimit *slot = NULL;
    for (int i = 0; i < num_set && !slot; i++)
        if (set[i].kernel == (const void *)kernel && set[i].device == device)
            slot = &set[i];
    if (slot && slot->bytes >= bytes)
        return;
    CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    if (!slot && num_set < KC_SMEM_LIMITS)
        slot = &set[num_set++];
    if (slot)
        *slot = KcSmemLimit{(const void *)kernel, device, bytes};
}

#endif
