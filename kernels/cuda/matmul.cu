/* matmul.cu - the linear layers: out[n, N] = x[n, K] w[N, K]^T (+ bias), fp32 accumulation,
 * through cuBLASLt for most shapes and a memory-bound GEMV for decode-sized batches.
 *
 * Row-major to cuBLAS: the row-major out[n, N] is the column-major matrix C [N, n] (ld N), so
 * the product is computed as C = W * X^T in column-major terms: A = w, read column-major as
 * [K, N] (ld K) with op T, B = x as [K, n] (ld K) with op N. No transposed copy is made.
 *
 * Dtype combinations (activation / weight):
 *   BF16 / BF16  bf16 in, fp32 compute, bf16 out; bias fused through CUBLASLT_EPILOGUE_BIAS when
 *                it is bf16 (cuBLASLt wants the bias in the output type), else a small kernel.
 *   F16 / F16    the same in fp16 (CUDA_R_16F in and out, fp32 compute, an f16 bias fused).
 *   F32 / F32    plain fp32 (CUBLAS_COMPUTE_32F: no TF32).
 *   F32 / BF16, F32 / F16: x is split into hi = w_type(x) and lo = w_type(x - hi) in the gemm's
 *                scratch, and out = W hi + W lo (two GEMMs, fp32 out, the second with beta 1),
 *                so x keeps ~16 (bf16) / ~22 (f16) bits: within fp32 tolerance of the CPU op,
 *                which multiplies fp32 x by the converted weight. Rows beyond the scratch are
 *                done in chunks. (|x| above 65504 overflows f16: use bf16 weights for such
 *                activations.)
 *
 * Small batches (n <= 8, 16-bit weights, K % 8 == 0, 16-byte aligned x and w): the GEMV of
 * gemv.cuh, one warp per R weight rows streaming them with 16-byte non-allocating loads,
 * several in flight per lane, dotting them with all n rows of x (read through L1, in act: F32,
 * BF16 or F16), fp32 accumulate, a warp reduction, bias in fp32, rounding once (gemv_fused.cu
 * puts the op after a projection into the same kernel). It is used where it measured faster than
 * cuBLASLt (the table below); cuBLASLt itself reached 3.61 TB/s at n = 1 on 14336x4096 here,
 * not the 2.2 TB/s issue 7 quotes, so the margin is 9-31 %, largest on 4096x4096.
 *
 * Algorithms are cached per (row bucket, N, K, dtypes, bias, pointer alignments). Up to 1024
 * rows a bucket is a multiple of 16 -- the engine captures its decode graphs at multiples of 16,
 * so every graph's GEMMs get an algorithm of their own -- and the first call of a bucket, when
 * it is not being captured and overwrites its output (beta 0), times cuBLASLt's first
 * GEMM_TUNE_CANDIDATES heuristic offers on its own operands and keeps the fastest. Measured on
 * the H200 against the heuristic's first offer for power-of-two buckets (8B shapes, us per
 * call at 400 rows: 28672x4096 170.1 -> 153.7, 4096x14336 82.0 -> 72.7, the other two equal):
 * a decode step at batch 400, context ~1000 went 25.89 -> 24.96 ms, graph capture 1.3 -> 4.3 s;
 * timing 16 offers was no faster. Above 1024 rows a bucket is the next power of two and the
 * first offer is used untimed (those GEMMs ran at 800-818 TFLOP/s in ncu). Offers are asked
 * for at the bucket's top so the workspace bound holds for every n in it. Descriptors are
 * initialised on the stack (cublasLt*Init into opaque structs), so after the first call of a
 * bucket a call makes no allocation and no heuristic query, and it can be captured in a CUDA
 * graph. */
#include <cublasLt.h>
#include <stdlib.h>
#include <string.h>

#include "cublas_util.cuh"
#include "gemv.cuh"

enum {
    GEMM_WORKSPACE_BYTES = 32 << 20,
    GEMM_CACHE_SLOTS = 1024, /* a power of two: an open-addressing hash table */
    GEMM_TUNE_MAX_ROWS = 1024,
    GEMM_TUNE_CANDIDATES = 8,
    GEMM_TUNE_REPS = 3,
};

/* What a cached algorithm is for: ints only (compared and hashed as a whole). */
typedef struct {
    int mb, N, K;                  /* row bucket, output features, input features */
    int at, bt, ct;                /* cudaDataType of w, x, out */
    int bias;                      /* 1: CUBLASLT_EPILOGUE_BIAS */
    int splits;                    /* > 1: K in that many slices, a batch of fp32 partials */
    int al_a, al_b, al_c, al_bias; /* pointer / leading-dimension alignment in bytes (<= 256) */
} AlgoKey;

typedef struct {
    int valid;
    AlgoKey key;
    cublasLtMatmulAlgo_t algo;
} AlgoEntry;

struct KCudaGemm {
    cublasLtHandle_t lt;
    void *workspace;
    size_t workspace_bytes;
    void *scratch; /* hi and lo halves, max_rows_times_k 16-bit elements each */
    size_t max_rows_times_k;
    AlgoEntry cache[GEMM_CACHE_SLOTS];
    int cached;                     /* valid entries; the table is cleared when it is 3/4 full */
    int force_path;                 /* KCudaGemmPath */
    int force_rows;                 /* GEMV rows per warp when forced (0 = the table's) */
    KcChoices fused;                /* the fused ops' measured forms (gemm_sm90a.cu) */
    KCudaSiluMulPath silu_mul_path; /* forced, or KC_SILU_MUL_AUTO */
    KcFp8 *fp8;                     /* fp8-weight state (matmul_fp8.cu), made on first use */
};

/* Where the GEMV beats cuBLASLt, measured on the H200 (2026-11-30, bf16, weights cycled
 * through > 150 MB so they come from HBM; tests/test_matmul_cuda.c test_matmul_timing, back-to-
 * back calls on a stream), per call in us, cuBLASLt / GEMV at its best rows per warp:
 *              n = 1         n = 2         n = 4         n = 8
 *   14336x4096  32.5 / 28.7   32.4 / 30.1   32.8 / 31.9   32.7 / 50.7
 *   4096x4096   14.0 /  9.6   13.7 /  9.7   13.7 / 12.1   13.6 / 14.4
 *   4096x14336  32.6 / 29.8   33.0 / 29.3   33.1 / 34.7   33.6 / 44.3
 * so bf16 activations take the GEMV at n <= 2 only (at n = 4 it wins on two shapes and loses
 * on the third), and f16 ones too (the same bytes per weight; not measured separately). (At
 * n = 8 it falls behind, presumably on its fp32 FMAs per weight byte and the x re-reads through
 * L1 -- not profiled; a tensor-core small-n kernel would be the next thing to try.) F32
 * activations on 16-bit weights take it at every n <= 8 (their cuBLASLt path is a conversion
 * plus two GEMMs). */
enum { GEMV_MAX_N_16 = 2 };

/* Weight rows per warp, as measured at n = 1 and 2 on the Llama-3-8B projections (CUDA graph
 * of back-to-back calls, weights from HBM; per call in us at 1 / 2 / 4 rows per warp):
 *                 n = 1                n = 2
 *   6144x4096     14.5 / 16.0 / 14.2   14.5 / 15.3 / 15.9
 *   4096x4096      9.1 / 10.1 / 11.2    9.1 / 11.7 / 10.7
 *   4096x14336    29.8 / 29.0 / 34.3   28.4 / 35.6 / 30.7
 *   14336x4096    28.5 / 27.8 / 29.2   30.5 / 29.3 / 29.3
 *   28672x4096    56.3 / 52.2 / 52.9   56.9 / 58.9 / 52.8
 *   128256x4096  237.2 / 228.6 / 229.2 238.6 / 233.2 / 230.2
 * so at n = 1 one row per warp where N and K are below 14336, else 2; at n = 2 one row where
 * N is below 14336, else 4; at larger n (F32 activations only) 2, the best or near it at
 * n = 4 and 8 on 14336x4096, 4096x4096 and 4096x14336. */
/* At n = 1 and one row per warp, rows of K >= GEMV_DEEP_K stream GEMV_DEEP_U chunks in flight
 * per lane instead of 4. In a CUDA graph of back-to-back calls on the H200 (session 11), us at 4
 * / 8: 4096x4096 9.4 / 8.6, 4096x7168 16.5 / 13.6, 3072x4096 7.9 / 6.9, 6144x4096 12.4 / 12.6,
 * but 4096x2048 4.7 / 5.0 (hence the K bound). Batch-1 decode steps with the fused
 * projections (gemv_fused.cu), ms, 4 / 8: Llama-3-8B shape 4.064 / 4.069, one TP=2 rank's
 * shapes alone 2.259 / 2.224 (its down projection, 4096x7168, takes this path, its o
 * projection, 4096x2048, does not; of the 8B's, the o projection, 4096x4096). */
enum { GEMV_DEEP_K = 4096, GEMV_DEEP_U = 8 };

static int gemv_rows(int n, int N, int K) {
    if (n == 1)
        return N >= 14336 || K >= 14336 ? 2 : 1;
    if (n == 2)
        return N >= 14336 ? 4 : 1;
    return 2;
}

/* ---------------- small kernels ---------------- */

/* out[i, j] += bias[j] over [n, N] (used when the epilogue cannot take the bias). */
template <typename OT, typename BT>
__global__ void bias_add_kernel(OT *out, const BT *bias, int N, size_t total) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = from_f32<OT>(to_f32(out[i]) + to_f32(bias[i % (size_t)N]));
}

/* hi = WT(x), lo = WT(x - hi): x as the sum of two 16-bit numbers. */
template <typename WT> __global__ void split_kernel(WT *hi, WT *lo, const float *x, size_t total) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = x[i];
        WT h = from_f32<WT>(v);
        hi[i] = h;
        lo[i] = from_f32<WT>(v - to_f32(h));
    }
}

/* ---------------- GEMV for n <= 8 (gemv.cuh) ---------------- */

template <typename XT, typename WT>
static void gemv_launch(int n, int rows, XT *out, const XT *xx, const WT *ww, const void *bias,
                        int bias_dt, int N, int K, cudaStream_t s) {
    const GemvStore<XT> epi = {out, bias, bias_dt, N};
    const int tasks = (N + rows - 1) / rows;
    switch (rows) {
        case 1:
            if (n == 1 && K >= GEMV_DEEP_K)
                gemv_run<1, GEMV_DEEP_U, 1>(n, tasks, epi, xx, ww, K, s);
            else
                gemv_run<1, gemv_default_u<1>, GEMV_MAX_N>(n, tasks, epi, xx, ww, K, s);
            break;
        case 2:
            gemv_run<2, gemv_default_u<2>, GEMV_MAX_N>(n, tasks, epi, xx, ww, K, s);
            break;
        case 4:
            gemv_run<4, gemv_default_u<4>, GEMV_MAX_N>(n, tasks, epi, xx, ww, K, s);
            break;
        default:
            pl_fatal(__FILE__, __LINE__, "gemv: %d rows per warp (1, 2 or 4)", rows);
    }
}

/* ---------------- cuBLASLt ---------------- */

static cudaDataType cuda_type(DType dt) {
    switch (dt) {
        case DT_F32:
            return CUDA_R_32F;
        case DT_F16:
            return CUDA_R_16F;
        case DT_BF16:
            return CUDA_R_16BF;
        default:
            pl_fatal(__FILE__, __LINE__, "k_cuda_matmul: unsupported dtype %s", pl_dtype_name(dt));
    }
}

typedef struct {
    cublasLtMatmulDescOpaque_t desc;
    cublasLtMatrixLayoutOpaque_t la, lb, lc;
} LtProblem;

/* With k->splits S > 1 the problem is a strided batch of S: batch i multiplies the K / S
 * columns from i K / S of w and x (both read in place, leading dimension K) into its own
 * [rows, N] slice of d, `split_stride` elements after the previous one. */
static void lt_problem(LtProblem *p, const AlgoKey *k, const void *bias, int rows,
                       int64_t split_stride) {
    CUBLAS_CHECK(cublasLtMatmulDescInit(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    int32_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (k->bias) {
        uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                                    sizeof epi));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                    &bias, sizeof bias));
    }
    const int kk = k->K / k->splits;
    CUBLAS_CHECK(cublasLtMatrixLayoutInit(&p->la, (cudaDataType)k->at, kk, k->N, k->K));
    CUBLAS_CHECK(cublasLtMatrixLayoutInit(&p->lb, (cudaDataType)k->bt, kk, rows, k->K));
    CUBLAS_CHECK(cublasLtMatrixLayoutInit(&p->lc, (cudaDataType)k->ct, k->N, rows, k->N));
    if (k->splits == 1)
        return;
    const int32_t count = k->splits;
    const int64_t offset[3] = {kk, kk, split_stride};
    cublasLtMatrixLayoutOpaque_t *l[3] = {&p->la, &p->lb, &p->lc};
    for (int i = 0; i < 3; i++) {
        CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                      &count, sizeof count));
        CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
            l[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &offset[i], sizeof offset[i]));
    }
}

/* cuBLASLt's heuristic offers for `rows` rows, best first, at most `max`; how many. */
static int lt_offers(KCudaGemm *g, const AlgoKey *k, const void *bias, int rows,
                     int64_t split_stride, cublasLtMatmulHeuristicResult_t *res, int max) {
    LtProblem p;
    lt_problem(&p, k, bias, rows, split_stride);
    cublasLtMatmulPreferenceOpaque_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceInit(&pref));
    uint64_t ws = g->workspace_bytes;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        &pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    uint32_t al[4] = {(uint32_t)k->al_a, (uint32_t)k->al_b, (uint32_t)k->al_c, (uint32_t)k->al_c};
    const cublasLtMatmulPreferenceAttributes_t which[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++)
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(&pref, which[i], &al[i], sizeof al[i]));
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(g->lt, &p.desc, &p.la, &p.lb, &p.lc, &p.lc,
                                                       &pref, max, res, &found);
    if (st != CUBLAS_STATUS_SUCCESS)
        return 0;
    int n = 0;
    for (int i = 0; i < found; i++)
        if (res[i].state == CUBLAS_STATUS_SUCCESS)
            res[n++] = res[i];
    return n;
}

/* d = beta d + w x^T with `algo`, the problem set up for `rows` rows. */
static cublasStatus_t lt_run(KCudaGemm *g, const AlgoKey *k, const cublasLtMatmulAlgo_t *algo,
                             void *d, const void *x, const void *w, const void *bias, int rows,
                             int64_t split_stride, float beta, cudaStream_t s) {
    LtProblem p;
    lt_problem(&p, k, bias, rows, split_stride);
    float alpha = 1.0f;
    return cublasLtMatmul(g->lt, &p.desc, &alpha, w, &p.la, x, &p.lb, &beta, d, &p.lc, d, &p.lc,
                          algo, g->workspace, g->workspace_bytes, s);
}

/* The fastest of the offers on this call's operands (the output is overwritten, beta 0): each
 * runs once untimed, then GEMM_TUNE_REPS times between two events; an offer that fails to
 * launch is skipped. Index into offers[]. */
static int lt_fastest(KCudaGemm *g, const AlgoKey *k, const cublasLtMatmulHeuristicResult_t *offers,
                      int n, void *d, const void *x, const void *w, const void *bias, int rows,
                      int64_t split_stride, cudaStream_t s) {
    cudaEvent_t ev[2 * GEMM_TUNE_CANDIDATES];
    int ran[GEMM_TUNE_CANDIDATES];
    for (int i = 0; i < 2 * n; i++)
        CUDA_CHECK(cudaEventCreate(&ev[i]));
    for (int i = 0; i < n; i++) {
        ran[i] = lt_run(g, k, &offers[i].algo, d, x, w, bias, rows, split_stride, 0.0f, s) ==
                 CUBLAS_STATUS_SUCCESS;
        CUDA_CHECK(cudaEventRecord(ev[2 * i], s));
        for (int r = 0; ran[i] && r < GEMM_TUNE_REPS; r++)
            CUBLAS_CHECK(lt_run(g, k, &offers[i].algo, d, x, w, bias, rows, split_stride, 0.0f, s));
        CUDA_CHECK(cudaEventRecord(ev[2 * i + 1], s));
    }
    CUDA_CHECK(cudaEventSynchronize(ev[2 * n - 1]));
    int best = -1;
    float best_ms = 0.0f;
    for (int i = 0; i < n; i++) {
        float ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
        if (ran[i] && (best < 0 || ms < best_ms)) {
            best = i;
            best_ms = ms;
        }
    }
    for (int i = 0; i < 2 * n; i++)
        CUDA_CHECK(cudaEventDestroy(ev[i]));
    return best < 0 ? 0 : best;
}

static int bucket_of(int n) {
    if (n > 16 && n <= GEMM_TUNE_MAX_ROWS)
        return (n + 15) / 16 * 16;
    int b = 1;
    while (b < n)
        b <<= 1;
    return b;
}

static AlgoEntry *cache_slot(KCudaGemm *g, const AlgoKey *key) {
    return kc_cache_slot(g->cache, GEMM_CACHE_SLOTS, key);
}

/* d[rows, N] (dt) = beta d + x[rows, K] (xt) w[N, K]^T (wt) (+ bias, in dt, when non-NULL);
 * with splits > 1 (no bias, beta 0), d holds that many partial products over K's slices, each
 * [rows, N], split_stride elements apart (lt_problem). */
static void lt_gemm(KCudaGemm *g, void *d, DType dt, const void *x, DType xt, const void *w,
                    DType wt, const void *bias, int rows, int N, int K, float beta, int splits,
                    int64_t split_stride, cudaStream_t s) {
    AlgoKey key;
    key.mb = bucket_of(rows);
    key.N = N;
    key.K = K;
    key.at = cuda_type(wt);
    key.bt = cuda_type(xt);
    key.ct = cuda_type(dt);
    key.bias = bias != NULL;
    key.splits = splits;
    /* every batch's operands start a slice (or a stride) after the first: aligned as those */
    const size_t slice = splits > 1 ? (size_t)(K / splits) : 0;
    const size_t stride_bytes = (size_t)split_stride * pl_dtype_size(dt);
    key.al_a = kc_lt_alignment(w, ((size_t)K | slice) * pl_dtype_size(wt));
    key.al_b = kc_lt_alignment(x, ((size_t)K | slice) * pl_dtype_size(xt));
    key.al_c = kc_lt_alignment(d, (size_t)N * pl_dtype_size(dt) | stride_bytes);
    key.al_bias = bias ? kc_lt_alignment(bias, 0) : 0;

    AlgoEntry *e = cache_slot(g, &key);
    if (!e->valid) {
        cublasLtMatmulHeuristicResult_t offers[GEMM_TUNE_CANDIDATES];
        int n = lt_offers(g, &key, bias, key.mb, split_stride, offers, GEMM_TUNE_CANDIDATES);
        if (n == 0)
            n = lt_offers(g, &key, bias, rows, split_stride, offers, GEMM_TUNE_CANDIDATES);
        if (n == 0)
            pl_fatal(__FILE__, __LINE__,
                     "k_cuda_matmul: cuBLASLt has no algorithm for [%d, %d] x [%d, %d]^T "
                     "(%s x %s -> %s, bias %d, %d K slices, alignments %d/%d/%d)",
                     rows, K, N, K, pl_dtype_name(xt), pl_dtype_name(wt), pl_dtype_name(dt),
                     key.bias, splits, key.al_b, key.al_a, key.al_c);
        int pick = 0;
        if (n > 1 && beta == 0.0f && key.mb <= GEMM_TUNE_MAX_ROWS && !kc_capturing(s))
            pick = lt_fastest(g, &key, offers, n, d, x, w, bias, rows, split_stride, s);
        if (g->cached >= GEMM_CACHE_SLOTS / 4 * 3) {
            memset(g->cache, 0, sizeof g->cache);
            g->cached = 0;
            e = cache_slot(g, &key);
        }
        e->valid = 1;
        e->key = key;
        e->algo = offers[pick].algo;
        g->cached++;
    }

    cublasStatus_t st = lt_run(g, &key, &e->algo, d, x, w, bias, rows, split_stride, beta, s);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) {
        /* the bucket's algorithm does not take this row count: ask for this exact size */
        cublasLtMatmulHeuristicResult_t exact;
        if (!lt_offers(g, &key, bias, rows, split_stride, &exact, 1))
            pl_fatal(__FILE__, __LINE__, "k_cuda_matmul: cuBLASLt has no algorithm for %d rows",
                     rows);
        st = lt_run(g, &key, &exact.algo, d, x, w, bias, rows, split_stride, beta, s);
    }
    CUBLAS_CHECK(st);
}

void kc_bias_add(void *out, DType act, const Tensor *bias, int n, int N, cudaStream_t s) {
    size_t total = (size_t)n * (size_t)N;
    KC_DISPATCH_ACT(act, "k_cuda_matmul", OT,
                    KC_DISPATCH_WEIGHT(bias->dtype, "k_cuda_matmul bias", BT,
                                       bias_add_kernel<OT, BT>
                                       <<<kc_blocks(total, 256), 256, 0, s>>>(
                                           (OT *)out, (const BT *)bias->data, N, total)));
    CUDA_CHECK_LAUNCH();
}

/* ---------------- public ---------------- */

int kc_gemv_takes(const KCudaGemm *g, DType act, const Tensor *w, const void *x, int n) {
    const int w16 = w->dtype == DT_BF16 || w->dtype == DT_F16;
    if (!w16 || n > GEMV_MAX_N || w->shape[1] % 8 != 0 || !kc_aligned16(x) ||
        !kc_aligned16(w->data) || g->force_path == KC_GEMM_CUBLASLT)
        return 0;
    return g->force_path == KC_GEMM_GEMV || act == DT_F32 || n <= GEMV_MAX_N_16;
}

KCudaGemm *k_cuda_gemm_create(size_t max_rows_times_k) {
    KCudaGemm *g = (KCudaGemm *)pl_xcalloc(1, sizeof *g);
    CUBLAS_CHECK(cublasLtCreate(&g->lt));
    g->workspace_bytes = GEMM_WORKSPACE_BYTES;
    CUDA_CHECK(cudaMalloc(&g->workspace, g->workspace_bytes));
    g->max_rows_times_k = max_rows_times_k;
    g->silu_mul_path = KC_SILU_MUL_AUTO;
    if (max_rows_times_k)
        CUDA_CHECK(cudaMalloc(&g->scratch, 2 * max_rows_times_k * sizeof(uint16_t)));
    return g;
}

void k_cuda_gemm_destroy(KCudaGemm *g) {
    if (!g)
        return;
    if (g->lt)
        CUBLAS_CHECK(cublasLtDestroy(g->lt));
    k_cuda_free(g->workspace);
    k_cuda_free(g->scratch);
    kc_fp8_destroy(g->fp8);
    free(g);
}

size_t k_cuda_gemm_device_bytes(const KCudaGemm *g) {
    return g ? g->workspace_bytes + 2 * g->max_rows_times_k * sizeof(uint16_t) +
                   kc_fp8_device_bytes(g->fp8)
             : 0;
}

void k_cuda_gemm_force(KCudaGemm *g, KCudaGemmPath path, int gemv_rows) {
    KC_REQUIRE(g, "k_cuda_gemm_force: NULL gemm");
    KC_REQUIRE(gemv_rows == 0 || gemv_rows == 1 || gemv_rows == 2 || gemv_rows == 4,
               "k_cuda_gemm_force: gemv_rows %d (0, 1, 2 or 4)", gemv_rows);
    g->force_path = (int)path;
    g->force_rows = gemv_rows;
}

void k_cuda_gemm_force_silu_mul(KCudaGemm *g, KCudaSiluMulPath path) {
    KC_REQUIRE(g && path >= KC_SILU_MUL_AUTO && path <= KC_SILU_MUL_N224_CLUSTER2,
               "k_cuda_gemm_force_silu_mul: path %d", (int)path);
    g->silu_mul_path = path;
}

KCudaSiluMulPath kc_gemm_silu_mul_path(const KCudaGemm *g) {
    return g->silu_mul_path;
}

KcChoices *kc_gemm_choices(KCudaGemm *g) {
    return &g->fused;
}

KcFp8 **kc_gemm_fp8(KCudaGemm *g) {
    return &g->fp8;
}

void *kc_gemm_lt(KCudaGemm *g, void **workspace, size_t *workspace_bytes) {
    *workspace = g->workspace;
    *workspace_bytes = g->workspace_bytes;
    return (void *)g->lt;
}

int kc_gemm_forced_path(const KCudaGemm *g) {
    return g->force_path;
}

int kc_gemm_forced_rows(const KCudaGemm *g) {
    return g->force_rows;
}

void k_cuda_matmul(KCudaGemm *g, void *out, const void *x, DType act, const Tensor *w,
                   const Tensor *bias, int n, void *stream) {
    KC_REQUIRE(g && w && w->ndim == 2, "k_cuda_matmul: needs a gemm and a 2-D weight");
    const int N = (int)w->shape[0], K = (int)w->shape[1];
    const Tensor *b = bias && bias->data ? bias : NULL;
    KC_REQUIRE(!b || (b->ndim == 1 && b->shape[0] == N),
               "k_cuda_matmul: bias must be 1-D of length %d", N);
    if (n <= 0 || N <= 0)
        return;
    KC_REQUIRE(K > 0, "k_cuda_matmul: K must be positive");
    const DType wt = w->dtype;
    if (wt == DT_F8E4M3) { /* fp8 weights: quantized activations (matmul_fp8.cu) */
        kc_matmul_fp8(g, out, x, act, w, b, n, kc_stream(stream));
        return;
    }
    const int w16 = wt == DT_BF16 || wt == DT_F16;
    const int same16 = (act == DT_BF16 || act == DT_F16) && wt == act;
    const int f32x16 = act == DT_F32 && w16;
    if (!same16 && !f32x16 && !(act == DT_F32 && wt == DT_F32))
        pl_fatal(__FILE__, __LINE__,
                 "k_cuda_matmul: activations %s with weights %s unsupported (BF16/BF16, "
                 "F16/F16, F32/F32, F32/BF16, F32/F16)",
                 pl_dtype_name(act), pl_dtype_name(wt));
    cudaStream_t s = kc_stream(stream);

    /* small batches: the GEMV */
    if (kc_gemv_takes(g, act, w, x, n)) {
        int rows = g->force_rows ? g->force_rows : gemv_rows(n, N, K);
        const void *bp = b ? b->data : NULL;
        int bdt = b ? (int)b->dtype : 0;
        if (b)
            KC_REQUIRE(gemv_bias_dtype_ok(b->dtype), "k_cuda_matmul: bias dtype %s",
                       pl_dtype_name(b->dtype));
        gemv_dtypes(act, wt, [&](auto *xt, auto *wtp) {
            gemv_launch(n, rows, (decltype(xt))out, (decltype(xt))x, (decltype(wtp))w->data, bp,
                        bdt, N, K, s);
        });
        return;
    }

    /* the bias goes in the epilogue when it has the output's type and a sane alignment */
    const int fuse_bias = b && b->dtype == act && ((uintptr_t)b->data & 15) == 0;
    const void *ep_bias = fuse_bias ? b->data : NULL;
    if (!f32x16) {
        lt_gemm(g, out, act, x, act, w->data, wt, ep_bias, n, N, K, 0.0f, 1, 0, s);
    } else {
        KC_REQUIRE(g->max_rows_times_k >= (size_t)K,
                   "k_cuda_matmul: F32 activations with %s weights need scratch for a row of "
                   "%d (k_cuda_gemm_create's max_rows_times_k is %zu)",
                   pl_dtype_name(wt), K, g->max_rows_times_k);
        const int chunk =
            (int)(g->max_rows_times_k / (size_t)K < (size_t)n ? g->max_rows_times_k / (size_t)K
                                                              : (size_t)n);
        uint16_t *hi = (uint16_t *)g->scratch, *lo = hi + g->max_rows_times_k;
        for (int r0 = 0; r0 < n; r0 += chunk) {
            int rows = n - r0 < chunk ? n - r0 : chunk;
            size_t total = (size_t)rows * (size_t)K;
            const float *xr = (const float *)x + (size_t)r0 * K;
            float *o = (float *)out + (size_t)r0 * N;
            if (wt == DT_BF16)
                split_kernel<bf16>
                    <<<kc_blocks(total, 256), 256, 0, s>>>((bf16 *)hi, (bf16 *)lo, xr, total);
            else
                split_kernel<f16>
                    <<<kc_blocks(total, 256), 256, 0, s>>>((f16 *)hi, (f16 *)lo, xr, total);
            CUDA_CHECK_LAUNCH();
            lt_gemm(g, o, DT_F32, hi, wt, w->data, wt, ep_bias, rows, N, K, 0.0f, 1, 0, s);
            lt_gemm(g, o, DT_F32, lo, wt, w->data, wt, NULL, rows, N, K, 1.0f, 1, 0, s);
        }
    }
    if (b && !fuse_bias)
        kc_bias_add(out, act, b, n, N, s);
}

void kc_matmul_partials(KCudaGemm *g, float *partials, int64_t split_stride, const void *x,
                        DType act, const Tensor *w, int n, int splits, cudaStream_t s) {
    const int N = (int)w->shape[0], K = (int)w->shape[1];
    KC_REQUIRE((act == DT_BF16 || act == DT_F16) && w->dtype == act && splits > 1 &&
                   K % (8 * splits) == 0 && split_stride >= (int64_t)n * N,
               "kc_matmul_partials: %s x %s, K %d in %d slices, stride %lld for %d x %d",
               pl_dtype_name(act), pl_dtype_name(w->dtype), K, splits, (long long)split_stride, n,
               N);
    if (n > 0)
        lt_gemm(g, partials, DT_F32, x, act, w->data, act, NULL, n, N, K, 0.0f, splits,
                split_stride, s);
}
