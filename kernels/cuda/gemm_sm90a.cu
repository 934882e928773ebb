/* gemm_sm90a.cu - an own Hopper GEMM for decode-sized batches: the gate-up projection with
 * SiLU times up in its epilogue (kc_wgmma_silu_mul_try), out[n, dim] = silu(x w_gate^T) * (x
 * w_up^T) for x [n, K] and the fused gate-up weight [2 dim, K] (gate rows first), 16-bit in and
 * out, fp32 accumulation.
 *
 * Why: cuBLASLt writes the [n, 2 dim] projection that a second kernel reads back for SiLU
 * times up. Here a tile is 128 rows of x by 224 weight rows: the gate and the up rows of the same
 * 112 output columns, so each thread holds the gate and up sums of its outputs in registers; the
 * epilogue rounds both to the activation dtype (as the projection's output would be), applies
 * silu_times and stores out. The projection is never written. (Measured on the H200, docs/
 * PERFORMANCE.md session 18: so far no faster than the pair on the Llama-3-8B shapes, which the
 * per-bucket timing therefore keeps; the next step is a persistent grid.)
 *
 * The kernel: one CTA of three warpgroups per tile. Warpgroup 0's first thread is the producer:
 * it streams K in 64-element slices through a ring of shared-memory stages (as many as fit,
 * 5 of 44 KB) with the tensor copy engine (TMA, 128-byte swizzle), each stage completing on a
 * `full` mbarrier. Warpgroups 1 and 2 each multiply 64 of the tile's rows with wgmma
 * (m64n224k16, both operands K-major from shared memory), keep one group of MMAs in flight, and
 * give a stage back on its `empty` mbarrier (one arrival per consumer warp) when the group that
 * read it has completed. With CLUSTER = 2 the two row tiles of a column tile are one cluster:
 * one CTA loads the gate rows, the other the up rows, and the copy engine multicasts each into
 * both, so the weights leave HBM once and in one wave (without it the grid's second row tile
 * runs a wave later and reads them again); a stage is then free only when the consumers of both
 * CTAs have released it (they arrive on both CTAs' barriers).
 *
 * Built only for sm_90a (configure.py compiles this file with -gencode arch=compute_90a, and
 * defines PAGELLM_SM90A); elsewhere k_cuda_wgmma_available() is 0 and nothing here is launched.
 * Results differ from k_cuda_matmul then k_cuda_silu_mul only in the order the K products are
 * summed. */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <pthread.h>

#include "cuda_internal.cuh"

#if PAGELLM_SM90A
#include <cooperative_groups.h>

namespace {

constexpr int BK = 64;            /* K elements per stage: one 128-byte swizzled row */
constexpr int ROW_BYTES = BK * 2; /* 16-bit elements */
constexpr int THREADS = 384;      /* producer warpgroup + two consumer warpgroups */
constexpr int CONSUMER_WARPS = 8;
constexpr int SMEM_LIMIT = 227 * 1024; /* a block's dynamic shared memory on sm_90 */

/* Ring stages that fit beside the alignment slack and the barriers, at most 8. */
__host__ __device__ constexpr int stages_for(int stage_bytes) {
    return (SMEM_LIMIT - 1024 - 128) / stage_bytes < 8 ? (SMEM_LIMIT - 1024 - 128) / stage_bytes
                                                       : 8;
}

/* ---- shared memory, mbarriers and the tensor copy engine ---- */

__device__ __forceinline__ void mbar_init(uint64_t *bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}

__device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
                 "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t *bar, unsigned parity) {
    const uint32_t a = smem_addr(bar);
    uint32_t done = 0;
    while (!done)
        asm volatile("{\n.reg .pred p;\n"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(a), "r"(parity)
                     : "memory");
}

/* One arrival on the barrier at the same offset in CTA `cta` of the cluster (itself included).
 * Default semantics (release at CTA scope): a .release.cluster arrive costs a memory barrier
 * per call, which ncu showed as 37 % of the warps' stalls. What it orders is the consumers'
 * MMAs' reads of the stage, complete once wgmma.wait_group has returned. */
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t *bar, unsigned cta) {
    asm volatile("{\n.reg .b32 remote;\n"
                 "mapa.shared::cluster.u32 remote, %0, %1;\n"
                 "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(smem_addr(bar)),
                 "r"(cta)
                 : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

/* The box at (k, row) of `map` into dst, completing on bar, with an L2 eviction policy. */
__device__ __forceinline__ void tma_load(void *dst, const CUtensorMap *map, int k, int row,
                                         uint64_t *bar, uint64_t policy) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 ".L2::cache_hint [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(smem_addr(dst)),
                 "l"(map), "r"(smem_addr(bar)), "r"(k), "r"(row), "l"(policy)
                 : "memory");
}

/* The same into dst of every CTA of the cluster in `mask`, each completing on its own bar. */
__device__ __forceinline__ void tma_load_multicast(void *dst, const CUtensorMap *map, int k,
                                                   int row, uint64_t *bar, uint16_t mask) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 ".multicast::cluster [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(smem_addr(dst)),
                 "l"(map), "r"(smem_addr(bar)), "r"(k), "r"(row), "h"(mask)
                 : "memory");
}

__device__ __forceinline__ uint64_t l2_policy_evict_normal(void) {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(p));
    return p;
}

__device__ __forceinline__ uint64_t l2_policy_evict_last(void) {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
    return p;
}

/* ---- wgmma ---- */

/* Shared-memory matrix descriptor of a K-major tile written by the copy engine with 128-byte
 * swizzle: rows of 128 bytes, 8-row groups 1024 bytes apart (stride byte offset), layout type 1
 * (128B swizzle) in bits 62-63. The tile must start on a 1024-byte boundary; a k16 step within
 * the row adds 32 bytes to the start address (field units of 16 bytes). */
__device__ __forceinline__ uint64_t smem_desc(const void *tile) {
    return (uint64_t)((smem_addr(tile) & 0x3ffff) >> 4) | (uint64_t)1 << 16 |
           (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}

__device__ __forceinline__ void wgmma_fence(void) {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit(void) {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N> __device__ __forceinline__ void wgmma_wait(void) {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
/* Keeps the compiler from moving accumulator reads or writes across the asynchronous MMAs. */
template <int R> __device__ __forceinline__ void acc_fence(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; i++)
        asm volatile("" : "+f"(d[i])::"memory");
}

#define WG_D8(i)                                                                                   \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]),    \
        "+f"(d[i + 6]), "+f"(d[i + 7])
#define WG_D56  WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24), WG_D8(32), WG_D8(40), WG_D8(48)
#define WG_D112 WG_D56, WG_D8(56), WG_D8(64), WG_D8(72), WG_D8(80), WG_D8(88), WG_D8(96), WG_D8(104)
#define WG_REGS_64                                                                                 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                       \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, "                       \
    "%30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "                       \
    "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, "                       \
    "%58, %59, %60, %61, %62, %63"
#define WG_REGS_112                                                                                \
    WG_REGS_64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, "          \
               "%78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, "       \
               "%93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, "           \
               "%106, %107, %108, %109, %110, %111"

/* d[64 x N] (+)= a[64 x 16] b[N x 16]^T, this warpgroup's fragment of d (N / 2 per thread);
 * scale_d 0 overwrites d. IA, IB, IS: the operand numbers after the N / 2 accumulators. */
#define WGMMA_DEFINE(N, AB, REGS, DOPS, IA, IB, IS)                                                \
    __device__ __forceinline__ void wgmma_##AB##_n##N(float(&d)[N / 2], uint64_t da, uint64_t db,  \
                                                      int scale_d) {                               \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #IS ", 0;\n"                             \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #AB "." #AB " {" REGS       \
                     "}, %" #IA ", %" #IB ", p, 1, 1, 0, 0;\n}\n"                                  \
                     : DOPS                                                                        \
                     : "l"(da), "l"(db), "r"(scale_d));                                            \
    }
WGMMA_DEFINE(224, bf16, WG_REGS_112, WG_D112, 112, 113, 114)
WGMMA_DEFINE(224, f16, WG_REGS_112, WG_D112, 112, 113, 114)

template <typename T>
__device__ __forceinline__ void wgmma_n224(float (&d)[112], uint64_t da, uint64_t db, int scale_d) {
    if constexpr (std::is_same<T, bf16>::value)
        wgmma_bf16_n224(d, da, db, scale_d);
    else
        wgmma_f16_n224(d, da, db, scale_d);
}

/* silu(g) * u of sums rounded to T first, as the projection's stored output would be. */
template <typename T> __device__ __forceinline__ float swiglu(float g, float u) {
    return silu_times(to_f32(from_f32<T>(g)), to_f32(from_f32<T>(u)));
}

/* The tile: rows [blockIdx.y BM, + BM) of x by output columns [blockIdx.x HALF, + HALF), whose
 * gate rows start at that column of w and up rows `dim` rows further. CLUSTER = 2: the two row
 * tiles of a column tile are a cluster; rank 0 loads the gate rows, rank 1 the up rows, each
 * multicast to both, so the weights are read once, in one wave. */
template <int CLUSTER, typename T>
__global__ void __launch_bounds__(THREADS, 1)
    swiglu_gemm_kernel(const __grid_constant__ CUtensorMap map_x,
                       const __grid_constant__ CUtensorMap map_w, T *__restrict__ out, int n,
                       int dim, int K) {
    constexpr int BM = 128, WG_M = 64, BN = 224, HALF = BN / 2;
    constexpr int X_BYTES = BM * ROW_BYTES, W_BYTES = BN * ROW_BYTES;
    constexpr int STAGE_BYTES = X_BYTES + W_BYTES, STAGES = stages_for(STAGE_BYTES);
    static_assert(X_BYTES % 1024 == 0 && (HALF * ROW_BYTES) % 1024 == 0 &&
                      (CLUSTER == 1 || CLUSTER == 2),
                  "tiles on 1024-byte boundaries (128-byte swizzle)");
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    uint64_t *full = (uint64_t *)(smem + STAGES * STAGE_BYTES);
    uint64_t *empty = full + STAGES;
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    const int col0 = blockIdx.x * HALF, row0 = blockIdx.y * BM, kb_count = K / BK;
    const int rank = CLUSTER > 1 ? (int)(blockIdx.y % CLUSTER) : 0;

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], CLUSTER * CONSUMER_WARPS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    if constexpr (CLUSTER > 1)
        cooperative_groups::this_cluster().sync();
    else
        __syncthreads();
    kc_pdl_wait();
    kc_pdl_trigger();

    if (wg == 0) {
        if (tid == 0) {
            /* x is re-read by every column tile: kept in L2; the weights by each row tile */
            const uint64_t keep = l2_policy_evict_last(), normal = l2_policy_evict_normal();
            for (int kb = 0; kb < kb_count; kb++) {
                const int s = kb % STAGES;
                uint8_t *xs = smem + s * STAGE_BYTES, *ws = xs + X_BYTES;
                mbar_wait(&empty[s], ((kb / STAGES) & 1) ^ 1);
                mbar_expect_tx(&full[s], STAGE_BYTES);
                tma_load(xs, &map_x, kb * BK, row0, &full[s], keep);
                if constexpr (CLUSTER > 1) {
                    tma_load_multicast(ws + rank * HALF * ROW_BYTES, &map_w, kb * BK,
                                       rank * dim + col0, &full[s], (uint16_t)3);
                } else {
                    tma_load(ws, &map_w, kb * BK, col0, &full[s], normal);
                    tma_load(ws + HALF * ROW_BYTES, &map_w, kb * BK, dim + col0, &full[s], normal);
                }
            }
        }
    } else {
        const int c = wg - 1, warp = tid / 32, lane = tid % 32;
        float acc[BN / 2];
        for (int kb = 0; kb < kb_count; kb++) {
            const int s = kb % STAGES;
            const uint8_t *xs = smem + s * STAGE_BYTES, *ws = xs + X_BYTES;
            mbar_wait(&full[s], (kb / STAGES) & 1);
            const uint64_t dx = smem_desc(xs + c * WG_M * ROW_BYTES), dw = smem_desc(ws);
            acc_fence(acc);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++)
                wgmma_n224<T>(acc, dx + (uint64_t)(kk * 2), dw + (uint64_t)(kk * 2),
                              kb > 0 || kk > 0);
            wgmma_commit();
            acc_fence(acc);
            wgmma_wait<1>();
            if (kb > 0 && lane == 0) {
                if constexpr (CLUSTER > 1)
                    for (int r = 0; r < CLUSTER; r++)
                        mbar_arrive_cluster(&empty[(kb - 1) % STAGES], (unsigned)r);
                else
                    mbar_arrive(&empty[(kb - 1) % STAGES]);
            }
        }
        wgmma_wait<0>();
        acc_fence(acc);
        /* fragment layout of m64nN: element 4j + 2h + e of a thread is row warp*16 + lane/4 +
         * 8h, column 8j + 2 (lane % 4) + e; gate column j pairs with up column j + HALF / 8 */
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int row = row0 + c * WG_M + warp * 16 + lane / 4 + 8 * h;
            if (row >= n)
                continue;
            uint32_t *o = (uint32_t *)(out + (size_t)row * dim + col0 + 2 * (lane % 4));
#pragma unroll
            for (int j = 0; j < HALF / 8; j++) {
                const float *g = &acc[4 * j + 2 * h], *u = &acc[4 * (j + HALF / 8) + 2 * h];
                o[4 * j] = pack16<T>(swiglu<T>(g[0], u[0]), swiglu<T>(g[1], u[1]));
            }
        }
    }
    if constexpr (CLUSTER > 1)
        cooperative_groups::this_cluster().sync(); /* no CTA leaves while its peers multicast */
}

/* ---- host side ---- */

PFN_cuTensorMapEncodeTiled_v12000 encode_fn;
pthread_once_t encode_once = PTHREAD_ONCE_INIT;

void find_encode(void) {
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
        encode_fn = (PFN_cuTensorMapEncodeTiled_v12000)fn;
    else
        (void)cudaGetLastError();
}

/* A 2-D row-major [rows, cols] 16-bit tensor of row pitch `ld` elements in boxes of
 * box_rows x BK, 128-byte swizzle, zero fill beyond the edges. */
CUtensorMap tensor_map(const void *base, DType dt, int rows, int cols, int ld, int box_rows) {
    CUtensorMap m;
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)ld * 2};
    const cuuint32_t box[2] = {BK, (cuuint32_t)box_rows}, elem[2] = {1, 1};
    const CUresult r = encode_fn(
        &m, dt == DT_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,
        (void *)base, dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
        CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    KC_REQUIRE(r == CUDA_SUCCESS, "gemm_sm90a: cuTensorMapEncodeTiled failed (%d)", (int)r);
    return m;
}

template <int CLUSTER, typename T>
void launch(void *out, const void *x, DType act, const Tensor *w, int n, cudaStream_t s) {
    constexpr int BM = 128, BN = 224, STAGE_BYTES = (BM + BN) * ROW_BYTES;
    const int dim = (int)(w->shape[0] / 2), K = (int)w->shape[1];
    const size_t smem = 1024 + (size_t)stages_for(STAGE_BYTES) * STAGE_BYTES + 128;
    auto kernel = swiglu_gemm_kernel<CLUSTER, T>;
    kc_set_smem(kernel, smem);
    const CUtensorMap mx = tensor_map(x, act, n, K, K, BM);
    const CUtensorMap mw = tensor_map(w->data, act, 2 * dim, K, K, BN / 2);
    cudaLaunchAttribute attr[2];
    int na = 0;
    if (CLUSTER > 1) {
        attr[na].id = cudaLaunchAttributeClusterDimension;
        attr[na].val.clusterDim.x = 1;
        attr[na].val.clusterDim.y = CLUSTER;
        attr[na].val.clusterDim.z = 1;
        na++;
    }
    if (kc_pdl_enabled()) {
        attr[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[na].val.programmaticStreamSerializationAllowed = 1;
        na++;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)(dim / (BN / 2)), (unsigned)((n + BM - 1) / BM), 1);
    cfg.blockDim = dim3(THREADS, 1, 1);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = (unsigned)na;
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, mx, mw, (T *)out, n, dim, K));
}

template <typename T>
void launch_variant(int variant, void *out, const void *x, DType act, const Tensor *w, int n,
                    cudaStream_t s) {
    if (variant == KC_SILU_MUL_N224_CLUSTER2)
        launch<2, T>(out, x, act, w, n, s);
    else
        launch<1, T>(out, x, act, w, n, s);
}

} // namespace

int k_cuda_wgmma_available(void) {
    static int available = -1; /* one answer per process: every GPU of a TP host is the same */
    if (available < 0) {
        int device = 0;
        cudaDeviceProp p;
        pthread_once(&encode_once, find_encode);
        available = cudaGetDevice(&device) == cudaSuccess &&
                    cudaGetDeviceProperties(&p, device) == cudaSuccess && p.major == 9 &&
                    p.minor == 0 && encode_fn != NULL;
        (void)cudaGetLastError();
    }
    return available;
}

/* Bit v set: variant v takes out[n, dim] = silu(x w_gate^T) * (x w_up^T) for these operands
 * (16-bit act == w->dtype, dim % 112 == 0, K % 64 == 0, n <= KC_WGMMA_MAX_ROWS, x and w 16-byte
 * aligned, out 4-byte aligned); 0 when none does. */
static unsigned variants_for(const void *out, const void *x, DType act, const Tensor *w, int n) {
    if (!k_cuda_wgmma_available() || (act != DT_BF16 && act != DT_F16) || !w || w->ndim != 2 ||
        w->dtype != act || n <= 0 || n > KC_WGMMA_MAX_ROWS || w->shape[0] % 2 != 0 ||
        w->shape[1] % BK != 0 || w->shape[0] > (1 << 30) || !kc_aligned16(x) ||
        !kc_aligned16(w->data) || ((uintptr_t)out & 3) != 0)
        return 0;
    const int64_t dim = w->shape[0] / 2, row_tiles = (n + 127) / 128;
    if (dim % 112 != 0)
        return 0;
    /* CTA pairs need an even number of row tiles */
    return 1u << KC_SILU_MUL_N224 | (row_tiles % 2 == 0 ? 1u << KC_SILU_MUL_N224_CLUSTER2 : 0u);
}

/* A variant that variants_for said takes the call. */
static void launch_checked(int variant, void *out, const void *x, DType act, const Tensor *w, int n,
                           cudaStream_t s) {
    if (act == DT_BF16)
        launch_variant<bf16>(variant, out, x, act, w, n, s);
    else
        launch_variant<f16>(variant, out, x, act, w, n, s);
    CUDA_CHECK_LAUNCH();
}

#else /* not built for sm_90a */

int k_cuda_wgmma_available(void) {
    return 0;
}

static unsigned variants_for(const void *, const void *, DType, const Tensor *, int) {
    return 0;
}

static void launch_checked(int, void *, const void *, DType, const Tensor *, int, cudaStream_t) {
    pl_fatal(__FILE__, __LINE__, "gemm_sm90a: this build has no sm_90a code");
}

#endif

/* ---- the path of k_cuda_matmul_silu_mul beyond the GEMV (built either way) ---- */

enum { TIMING_REPS = 3 };

/* choice -1: the cuBLASLt projection then SiLU times up; else the own GEMM's variant */
static void run_choice(int choice, KCudaGemm *g, void *out, void *gate_up, const void *x, DType act,
                       const Tensor *w, int n, cudaStream_t s) {
    if (choice >= 0) {
        launch_checked(choice, out, x, act, w, n, s);
        return;
    }
    k_cuda_matmul(g, gate_up, x, act, w, NULL, n, s);
    k_cuda_silu_mul(out, gate_up, act, n, (int)(w->shape[0] / 2), s);
}

/* The fastest of the pair and the variants in `v` on this call's operands: each runs once
 * untimed (the pair's GEMM picks its algorithm), then TIMING_REPS times between two events. */
static int fastest(unsigned v, KCudaGemm *g, void *out, void *gate_up, const void *x, DType act,
                   const Tensor *w, int n, cudaStream_t s) {
    int best = KC_SILU_MUL_PAIR;
    float best_ms = 0.0f;
    cudaEvent_t e[2];
    CUDA_CHECK(cudaEventCreate(&e[0]));
    CUDA_CHECK(cudaEventCreate(&e[1]));
    for (int c = KC_SILU_MUL_PAIR; c < KC_WGMMA_VARIANTS; c++) {
        if (c >= 0 && !(v >> c & 1))
            continue;
        run_choice(c, g, out, gate_up, x, act, w, n, s);
        CUDA_CHECK(cudaEventRecord(e[0], s));
        for (int r = 0; r < TIMING_REPS; r++)
            run_choice(c, g, out, gate_up, x, act, w, n, s);
        CUDA_CHECK(cudaEventRecord(e[1], s));
        CUDA_CHECK(cudaEventSynchronize(e[1]));
        float ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&ms, e[0], e[1]));
        if (c == KC_SILU_MUL_PAIR || ms < best_ms) {
            best = c;
            best_ms = ms;
        }
    }
    CUDA_CHECK(cudaEventDestroy(e[0]));
    CUDA_CHECK(cudaEventDestroy(e[1]));
    return best;
}

bool kc_wgmma_silu_mul_try(KCudaGemm *g, void *out, void *gate_up, const void *x, DType act,
                           const Tensor *w, int n, cudaStream_t s) {
    const KCudaSiluMulPath forced = kc_gemm_silu_mul_path(g);
    if (forced == KC_SILU_MUL_PAIR)
        return false;
    const unsigned v = variants_for(out, x, act, w, n);
    if (!v)
        return false;
    int choice = forced;
    if (forced == KC_SILU_MUL_AUTO) {
        const int mb = (n + 15) / 16 * 16, N = (int)w->shape[0], K = (int)w->shape[1];
        KcChoices *memo = kc_gemm_choices(g);
        choice = kc_choice_find(memo, KC_OP_SILU_MUL, mb, N, K);
        if (choice == KC_NO_CHOICE) {
            if (kc_choice_full(memo) || kc_capturing(s))
                return false;
            choice = fastest(v, g, out, gate_up, x, act, w, n, s);
            kc_choice_add(memo, KC_OP_SILU_MUL, mb, N, K, choice);
        }
    }
    if (choice < 0 || !(v >> choice & 1))
        return false;
    launch_checked(choice, out, x, act, w, n, s);
    return true;
}
