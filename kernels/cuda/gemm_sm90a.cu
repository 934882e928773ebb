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

#include "sm90a.cuh"

#if PAGELLM_SM90A
#include <cooperative_groups.h>

namespace {

WGMMA_DEFINE(224, WG_REGS_112, WG_D112, 112, 113, 114)

/* silu(g) * u of sums rounded to T first, as the projection's stored output would be. */
template <typename T> __device__ __forceinline__ float swiglu(float g, float u) {
    return silu_times(to_f32(from_f32<T>(g)), to_f32(from_f32<T>(u)));
}

/* The tile: rows [blockIdx.y BM, + BM) of x by output columns [blockIdx.x HALF, + HALF), whose
 * gate rows start at that column of w and up rows `dim` rows further. CLUSTER = 2: the two row
 * tiles of a column tile are a cluster; rank 0 loads the gate rows, rank 1 the up rows, each
 * multicast to both, so the weights are read once, in one wave. */
template <int CLUSTER, typename T>
__global__ void __launch_bounds__(WS_THREADS, 1)
    swiglu_gemm_kernel(const __grid_constant__ CUtensorMap map_x,
                       const __grid_constant__ CUtensorMap map_w, T *__restrict__ out, int n,
                       int dim, int K) {
    constexpr int BM = 128, WG_M = 64, BN = 224, HALF = BN / 2;
    constexpr int X_BYTES = BM * ROW_BYTES, W_BYTES = BN * ROW_BYTES;
    constexpr int STAGE_BYTES = X_BYTES + W_BYTES, STAGES = ring_stages(STAGE_BYTES);
    static_assert(X_BYTES % 1024 == 0 && (HALF * ROW_BYTES) % 1024 == 0 &&
                      (CLUSTER == 1 || CLUSTER == 2),
                  "tiles on 1024-byte boundaries (128-byte swizzle)");
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = ring_base(smem_raw);
    uint64_t *full = (uint64_t *)(smem + STAGES * STAGE_BYTES);
    uint64_t *empty = full + STAGES;
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    const int col0 = blockIdx.x * HALF, row0 = blockIdx.y * BM, kb_count = K / BK;
    const int rank = CLUSTER > 1 ? (int)(blockIdx.y % CLUSTER) : 0;

    ring_init(full, empty, STAGES, CLUSTER * WS_CONSUMER_WARPS);
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

template <int CLUSTER, typename T>
void launch(void *out, const void *x, DType act, const Tensor *w, int n, cudaStream_t s) {
    constexpr int BM = 128, BN = 224, STAGE_BYTES = (BM + BN) * ROW_BYTES;
    const int dim = (int)(w->shape[0] / 2), K = (int)w->shape[1];
    const size_t smem = ring_smem_bytes(STAGE_BYTES);
    auto kernel = swiglu_gemm_kernel<CLUSTER, T>;
    kc_set_smem(kernel, smem);
    const CUtensorMap mx = kc_tensor_map_16bit(x, act, n, K, K, BM);
    const CUtensorMap mw = kc_tensor_map_16bit(w->data, act, 2 * dim, K, K, BN / 2);
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
    cfg.blockDim = dim3(WS_THREADS, 1, 1);
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

static PFN_cuTensorMapEncodeTiled_v12000 encode_fn;
static pthread_once_t encode_once = PTHREAD_ONCE_INIT;

static void find_encode(void) {
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
        encode_fn = (PFN_cuTensorMapEncodeTiled_v12000)fn;
    else
        (void)cudaGetLastError();
}

static CUtensorMap tensor_map(const void *base, CUtensorMapDataType type, int elem_bytes,
                              int64_t rows, int64_t cols, int64_t ld, int box_rows) {
    CUtensorMap m;
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)(ld * elem_bytes)};
    const cuuint32_t box[2] = {(cuuint32_t)(128 / elem_bytes), (cuuint32_t)box_rows};
    const cuuint32_t elem[2] = {1, 1};
    const CUresult r =
        encode_fn(&m, type, 2, (void *)base, dims, strides, box, elem,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                  CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    KC_REQUIRE(r == CUDA_SUCCESS, "gemm_sm90a: cuTensorMapEncodeTiled failed (%d)", (int)r);
    return m;
}

CUtensorMap kc_tensor_map_16bit(const void *base, DType dt, int64_t rows, int64_t cols, int64_t ld,
                                int box_rows) {
    return tensor_map(
        base, dt == DT_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,
        rows, cols, ld, box_rows);
}

CUtensorMap kc_tensor_map_8bit(const void *base, int64_t rows, int64_t cols, int64_t ld,
                               int box_rows) {
    return tensor_map(base, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, rows, cols, ld, box_rows);
}

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
