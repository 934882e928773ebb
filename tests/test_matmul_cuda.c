/* test_matmul_cuda.c - k_cuda_matmul (kernels/cuda/matmul.cu) against the CPU `matmul` op
 * (test_cpu_ops(), the reference) on random data from fixed seeds: every supported dtype pair
 * (activation / weight: BF16/BF16, F16/F16, F32/F32, F32/BF16, F32/F16), batch rows n in {1, 3, 8,
 * 17, 64, 300}, shapes (N, K) = (64, 64), (172, 64), (64, 172), (72, 36) (K % 8 != 0 and offset,
 * unaligned rows), (4096, 4096) (a few n), (14336, 4096) at n = 1..8, (512, 1024) with F32, F16
 * and BF16 biases (fused epilogue and separate add), row-chunked F32-activation scratch, and a
 * CUDA graph capture. At n <= 8 both paths run too (cuBLASLt forced, and the GEMV at 1, 2 and 4
 * rows per warp), whatever the automatic choice.
 *
 * The CPU op sees exactly the values the GPU sees (x rounded to act, w to its dtype); a result
 * passes when |gpu - ref| <= tol + tol |ref| with tol 2e-2 for bf16 outputs, 5e-3 for f16
 * outputs (2.5 ulp at 2), 1e-4 for f32 outputs (F32 activations on 16-bit weights included),
 * and the first mismatches are printed.
 * Outputs are poisoned (NaN) before each launch, so unwritten elements fail.
 *
 * Without a GPU (CI) every test is skipped with "no CUDA device: skipped"; in a build without
 * the CUDA backend, with "CUDA backend not built: skipped". The last test prints timings (never
 * asserts speed) at the Llama-3-8B projection shapes: median of 20 after warm-up, weights from
 * HBM, with the ratio to the H200 floors (4.23 TB/s, 763 TFLOP/s), for back-to-back calls on a
 * stream and, at n <= 8, in a CUDA graph (as the decode step runs them), and a decoder layer's
 * four projections in a graph. PAGELLM_CUDA_TEST_QUICK=1 shrinks the sweeps and drops the
 * timing test; PAGELLM_CUDA_TEST_FILTER=pattern runs the matching tests only. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels.h"
#include "backend_test_util.h"
#ifdef PAGELLM_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels_cuda.h"
#endif
#include "cuda_test_util.h"

#define MATMUL_TESTS(X)                                                                            \
    X(test_matmul_small)                                                                           \
    X(test_matmul_unaligned)                                                                       \
    X(test_matmul_4096)                                                                            \
    X(test_matmul_14336_small_n)                                                                   \
    X(test_matmul_bias)                                                                            \
    X(test_matmul_chunked_scratch)                                                                 \
    X(test_matmul_tuned_buckets)                                                                   \
    X(test_matmul_graph)                                                                           \
    X(test_matmul_timing)

#ifndef PAGELLM_HAVE_CUDA

MATMUL_TESTS(SKIP_TEST)

#else

/* ---------------- helpers ---------------- */

static void upload_into(void *d, const float *x, size_t n, DType dt) {
    void *h = to_dtype(x, n, dt);
    k_cuda_memcpy(d, h, n * pl_dtype_size(dt));
    free(h);
}

static double tol_of(DType out) {
    return out == DT_F32 ? 1e-4 : out == DT_F16 ? 5e-3 : 2e-2;
}

/* The supported (activation, weight) pairs. */
typedef struct {
    DType act, wdt;
} Combo;
static const Combo combos[] = {
    {DT_BF16, DT_BF16}, {DT_F16, DT_F16}, {DT_F32, DT_F32}, {DT_F32, DT_BF16}, {DT_F32, DT_F16}};
enum { NCOMBOS = 5 };

/* One (weight, bias, act) setting checked at every n in ns[]: the CPU reference is computed once
 * for the largest n (a CPU row's result does not depend on n), the GPU runs each n on the
 * automatic path and, for n <= 8, forced onto cuBLASLt and onto the GEMV at 1, 2 and 4 rows per
 * warp. x_off / out_off shift the device x and out by that many elements (unaligned rows). */
static int run_case(KCudaGemm *g, const Weight *w, const Weight *bias, DType act, const int *ns,
                    int nn, size_t x_off, size_t out_off, const char *tag) {
    const KernelOps *cpu = test_cpu_ops();
    int N = (int)w->host.shape[0], K = (int)w->host.shape[1];
    int nmax = 0;
    for (int i = 0; i < nn; i++)
        nmax = ns[i] > nmax ? ns[i] : nmax;
    size_t xl = (size_t)nmax * K, ol = (size_t)nmax * N;
    float *x = rand_vec(xl, -1, 1, act);
    float *ref = xmalloc(ol * sizeof(float)), *got = xmalloc(ol * sizeof(float));
    cpu->matmul(cpu, ref, x, &w->host, bias ? &bias->host : NULL, nmax);
    for (size_t i = 0; i < ol; i++)
        ref[i] = round_to(ref[i], act);
    size_t es = pl_dtype_size(act);
    char *dxb = k_cuda_malloc((xl + x_off) * es), *dob = k_cuda_malloc((ol + out_off) * es);
    void *dx = dxb + x_off * es, *dout = dob + out_off * es;
    upload_into(dx, x, xl, act);
    int bad = 0;
    for (int ni = 0; ni < nn; ni++) {
        int n = ns[ni];
        /* variant 0: auto; 1: cuBLASLt; 2..4: GEMV with 1, 2, 4 rows per warp */
        int nvar = n <= 8 ? 5 : 1;
        for (int v = 0; v < nvar; v++) {
            static const int rows[5] = {0, 0, 1, 2, 4};
            KCudaGemmPath path = v == 0 ? KC_GEMM_AUTO : v == 1 ? KC_GEMM_CUBLASLT : KC_GEMM_GEMV;
            k_cuda_gemm_force(g, path, rows[v]);
            k_cuda_memset(dout, 0xFF, (size_t)n * N * es);
            k_cuda_matmul(g, dout, dx, act, &w->dev, bias ? &bias->dev : NULL, n, NULL);
            k_cuda_synchronize();
            download_as(got, dout, (size_t)n * N, act);
            char what[192];
            static const char *vn[5] = {"auto", "cublaslt", "gemv1", "gemv2", "gemv4"};
            snprintf(what, sizeof what, "%s act %s w %s bias %s n %d N %d K %d [%s]", tag, dn(act),
                     dn(w->host.dtype), bias ? dn(bias->host.dtype) : "-", n, N, K, vn[v]);
            bad += check_close(what, got, ref, (size_t)n * N, tol_of(act));
        }
    }
    k_cuda_gemm_force(g, KC_GEMM_AUTO, 0);
    k_cuda_free(dxb);
    k_cuda_free(dob);
    free(x);
    free(ref);
    free(got);
    return bad;
}

/* Every combo at (N, K) for the given n values. */
static int shape_sweep(KCudaGemm *g, int N, int K, const int *ns, int nn, size_t x_off,
                       size_t out_off, const char *tag) {
    int bad = 0;
    float a = 2.0f / sqrtf((float)K); /* outputs of order 1 */
    for (int c = 0; c < NCOMBOS; c++) {
        Weight w = make_weight(combos[c].wdt, 2, N, K, -a, a);
        bad += run_case(g, &w, NULL, combos[c].act, ns, nn, x_off, out_off, tag);
        free_weight(&w);
    }
    return bad;
}

static const int ns_all[] = {1, 3, 8, 17, 64, 300};

/* ---------------- correctness ---------------- */

static void test_matmul_small(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(21);
    KCudaGemm *g = k_cuda_gemm_create((size_t)300 * 4096);
    int bad = 0;
    bad += shape_sweep(g, 64, 64, ns_all, 6, 0, 0, "small");
    bad += shape_sweep(g, 172, 64, ns_all, 6, 0, 0, "small");
    bad += shape_sweep(g, 64, 172, ns_all, 6, 0, 0, "small");
    k_cuda_gemm_destroy(g);
    assert_int_equal(bad, 0);
}

/* K % 8 != 0 and x / out starting one row (or one element) into their buffers: the GEMV
 * declines, cuBLASLt runs with the alignment those pointers have. */
static void test_matmul_unaligned(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(22);
    KCudaGemm *g = k_cuda_gemm_create((size_t)300 * 4096);
    int bad = 0;
    bad += shape_sweep(g, 72, 36, ns_all, 6, 36, 72, "unaligned");
    const int ns[] = {1, 5, 17};
    bad += shape_sweep(g, 40, 64, ns, 3, 1, 1, "odd-offset");
    k_cuda_gemm_destroy(g);
    assert_int_equal(bad, 0);
}

static void test_matmul_4096(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(23);
    KCudaGemm *g = k_cuda_gemm_create((size_t)300 * 4096);
    const int ns_full[] = {1, 8, 17, 300}, ns_quick[] = {1, 17};
    int bad = quick() ? shape_sweep(g, 4096, 4096, ns_quick, 2, 0, 0, "4096")
                      : shape_sweep(g, 4096, 4096, ns_full, 4, 0, 0, "4096");
    k_cuda_gemm_destroy(g);
    assert_int_equal(bad, 0);
}

static void test_matmul_14336_small_n(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(24);
    KCudaGemm *g = k_cuda_gemm_create((size_t)8 * 4096);
    const int ns[] = {1, 2, 3, 4, 5, 6, 7, 8}, ns_quick[] = {1, 8};
    int bad = quick() ? shape_sweep(g, 14336, 4096, ns_quick, 2, 0, 0, "14336")
                      : shape_sweep(g, 14336, 4096, ns, 8, 0, 0, "14336");
    k_cuda_gemm_destroy(g);
    assert_int_equal(bad, 0);
}

/* (512, 1024) with a bias of each dtype: fused into the epilogue when it has the output's
 * dtype, added by a separate kernel otherwise; the GEMV adds it itself. */
static void test_matmul_bias(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(25);
    KCudaGemm *g = k_cuda_gemm_create((size_t)300 * 1024);
    const DType bdts[] = {DT_F32, DT_BF16, DT_F16};
    int bad = 0;
    float a = 2.0f / sqrtf(1024.0f);
    for (int c = 0; c < NCOMBOS; c++) {
        Weight w = make_weight(combos[c].wdt, 2, 512, 1024, -a, a);
        for (int bi = 0; bi < 3; bi++) {
            Weight b = make_weight(bdts[bi], 1, 512, 0, -1, 1);
            bad += run_case(g, &w, &b, combos[c].act, ns_all, 6, 0, 0, "bias");
            free_weight(&b);
        }
        free_weight(&w);
    }
    k_cuda_gemm_destroy(g);
    assert_int_equal(bad, 0);
}

/* F32 activations on 16-bit weights with scratch for 100 rows of K = 64: n = 300 runs as
 * three chunks, n = 17 as one. */
static void test_matmul_chunked_scratch(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(26);
    KCudaGemm *g = k_cuda_gemm_create((size_t)100 * 64);
    const int ns[] = {17, 100, 101, 300};
    int bad = 0;
    const DType wdts[] = {DT_BF16, DT_F16};
    for (int i = 0; i < 2; i++) {
        Weight w = make_weight(wdts[i], 2, 96, 64, -0.25f, 0.25f);
        Weight b = make_weight(DT_F32, 1, 96, 0, -1, 1);
        bad += run_case(g, &w, &b, DT_F32, ns, 4, 0, 0, "chunked");
        free_weight(&b);
        free_weight(&w);
    }
    k_cuda_gemm_destroy(g);
    assert_int_equal(bad, 0);
}

/* Row buckets: 400 rows first (the bucket of 385-400 times the heuristic's offers on that
 * call), then 385 and 392 on the algorithm it kept; 1100 then 2000 rows share the untimed
 * power-of-two bucket of 2048. Every combo, so the F32 paths' second GEMM (beta 1) reuses the
 * first one's algorithm. */
static void test_matmul_tuned_buckets(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(29);
    KCudaGemm *g = k_cuda_gemm_create((size_t)2000 * 256);
    const int ns[] = {400, 385, 392, 1100, 2000};
    int bad = shape_sweep(g, 512, 256, ns, 5, 0, 0, "buckets");
    k_cuda_gemm_destroy(g);
    assert_int_equal(bad, 0);
}

/* A stream capture of a cuBLASLt call (n = 64, with the fused bias) and a GEMV call (n = 2),
 * after one eager warm-up call of each shape, and of a cuBLASLt call whose row bucket is first
 * seen under the capture (n = 40: no timing there, the heuristic's first offer), replayed twice
 * on fresh inputs. */
static void test_matmul_graph(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(27);
    const KernelOps *cpu = test_cpu_ops();
    int N = 1024, K = 512, n1 = 64, n2 = 2, n3 = 40;
    KCudaGemm *g = k_cuda_gemm_create(0);
    float a = 2.0f / sqrtf((float)K);
    Weight w = make_weight(DT_BF16, 2, N, K, -a, a);
    Weight b = make_weight(DT_BF16, 1, N, 0, -1, 1);
    void *dx = k_cuda_malloc((size_t)n1 * K * 2), *d1 = k_cuda_malloc((size_t)n1 * N * 2);
    void *d2 = k_cuda_malloc((size_t)n2 * N * 2), *d3 = k_cuda_malloc((size_t)n3 * N * 2);
    void *stream = k_cuda_stream_create();
    k_cuda_matmul(g, d1, dx, DT_BF16, &w.dev, &b.dev, n1, stream); /* warm-up */
    k_cuda_matmul(g, d2, dx, DT_BF16, &w.dev, NULL, n2, stream);
    k_cuda_stream_synchronize(stream);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture((cudaStream_t)stream, cudaStreamCaptureModeThreadLocal));
    k_cuda_matmul(g, d1, dx, DT_BF16, &w.dev, &b.dev, n1, stream);
    k_cuda_matmul(g, d2, dx, DT_BF16, &w.dev, NULL, n2, stream);
    k_cuda_matmul(g, d3, dx, DT_BF16, &w.dev, NULL, n3, stream);
    CUDA_CHECK(cudaStreamEndCapture((cudaStream_t)stream, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    int bad = 0;
    float *ref = xmalloc(sizeof(float) * n1 * N), *got = xmalloc(sizeof(float) * n1 * N);
    for (int rep = 0; rep < 2; rep++) {
        float *x = rand_vec((size_t)n1 * K, -1, 1, DT_BF16);
        upload_into(dx, x, (size_t)n1 * K, DT_BF16);
        k_cuda_memset(d1, 0xFF, (size_t)n1 * N * 2);
        k_cuda_memset(d2, 0xFF, (size_t)n2 * N * 2);
        k_cuda_memset(d3, 0xFF, (size_t)n3 * N * 2);
        k_cuda_synchronize(); /* the copies ran on the legacy stream; the graph's is non-blocking */
        CUDA_CHECK(cudaGraphLaunch(exec, (cudaStream_t)stream));
        k_cuda_stream_synchronize(stream);
        cpu->matmul(cpu, ref, x, &w.host, &b.host, n1);
        for (int i = 0; i < n1 * N; i++)
            ref[i] = round_to(ref[i], DT_BF16);
        download_as(got, d1, (size_t)n1 * N, DT_BF16);
        bad += check_close("graph cublaslt n 64 + bias", got, ref, (size_t)n1 * N, 2e-2);
        cpu->matmul(cpu, ref, x, &w.host, NULL, n2);
        for (int i = 0; i < n2 * N; i++)
            ref[i] = round_to(ref[i], DT_BF16);
        download_as(got, d2, (size_t)n2 * N, DT_BF16);
        bad += check_close("graph gemv n 2", got, ref, (size_t)n2 * N, 2e-2);
        cpu->matmul(cpu, ref, x, &w.host, NULL, n3);
        for (int i = 0; i < n3 * N; i++)
            ref[i] = round_to(ref[i], DT_BF16);
        download_as(got, d3, (size_t)n3 * N, DT_BF16);
        bad += check_close("graph cublaslt n 40, first seen in the capture", got, ref,
                           (size_t)n3 * N, 2e-2);
        free(x);
    }
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
    k_cuda_stream_destroy(stream);
    k_cuda_free(dx);
    k_cuda_free(d1);
    k_cuda_free(d2);
    k_cuda_free(d3);
    free(ref);
    free(got);
    free_weight(&w);
    free_weight(&b);
    k_cuda_gemm_destroy(g);
    assert_int_equal(bad, 0);
}

/* ---------------- timing ---------------- */

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

enum { TIME_BATCH = 10, TIME_REPS = 20, CHAIN_LAYERS = 4 };

static float median_of(float *t, int n) {
    qsort(t, (size_t)n, sizeof t[0], cmp_float);
    return 0.5f * (t[n / 2 - 1] + t[n / 2]);
}

/* Weights of one shape for timing: enough copies for > 150 MB (three times the 50 MB L2), so
 * that cycling through them reads HBM, filled by tiling one random 4 MiB block (a random
 * matrix of the LM head's size would take seconds on the host); x and out for nmax rows. */
typedef struct {
    int N, K, ncopies;
    Tensor *ws;
    void *dx, *dout;
} TimeSet;

static TimeSet timeset_make(int N, int K, int nmax) {
    TimeSet t;
    t.N = N;
    t.K = K;
    size_t wbytes = (size_t)N * K * 2, tile = (size_t)4 << 20;
    t.ncopies = (int)((150u << 20) / wbytes) + 1;
    t.ws = xmalloc(sizeof(Tensor) * t.ncopies);
    float a = 2.0f / sqrtf((float)K);
    float *r = rand_vec(tile / 2, -a, a, DT_BF16);
    void *rb = to_dtype(r, tile / 2, DT_BF16);
    for (int c = 0; c < t.ncopies; c++) {
        memset(&t.ws[c], 0, sizeof t.ws[c]);
        t.ws[c].dtype = DT_BF16;
        t.ws[c].ndim = 2;
        t.ws[c].shape[0] = N;
        t.ws[c].shape[1] = K;
        t.ws[c].data = k_cuda_malloc(wbytes);
        for (size_t o = 0; o < wbytes; o += tile)
            k_cuda_memcpy((char *)t.ws[c].data + o, rb, wbytes - o < tile ? wbytes - o : tile);
    }
    free(r);
    free(rb);
    float *x = rand_vec((size_t)nmax * K, -1, 1, DT_BF16);
    t.dx = k_cuda_malloc((size_t)nmax * K * 2);
    t.dout = k_cuda_malloc((size_t)nmax * N * 2);
    upload_into(t.dx, x, (size_t)nmax * K, DT_BF16);
    free(x);
    return t;
}

static void timeset_free(TimeSet *t) {
    for (int c = 0; c < t->ncopies; c++)
        k_cuda_free(t->ws[c].data);
    free(t->ws);
    k_cuda_free(t->dx);
    k_cuda_free(t->dout);
}

/* Median over TIME_REPS of the per-call device time (ms) of TIME_BATCH back-to-back calls on
 * the legacy stream, cycling through the weight copies. */
static float time_calls(KCudaGemm *g, const TimeSet *t, int n, cudaEvent_t e0, cudaEvent_t e1,
                        double *host_us) {
    float ms[TIME_REPS];
    int c = 0;
    for (int i = 0; i < 3 * TIME_BATCH; i++) /* warm-up: heuristics, module loads, clocks */
        k_cuda_matmul(g, t->dout, t->dx, DT_BF16, &t->ws[c++ % t->ncopies], NULL, n, NULL);
    k_cuda_synchronize();
    double host = 0;
    for (int r = 0; r < TIME_REPS; r++) {
        CUDA_CHECK(cudaEventRecord(e0, NULL));
        double h0 = pl_now();
        for (int i = 0; i < TIME_BATCH; i++)
            k_cuda_matmul(g, t->dout, t->dx, DT_BF16, &t->ws[c++ % t->ncopies], NULL, n, NULL);
        host += pl_now() - h0;
        CUDA_CHECK(cudaEventRecord(e1, NULL));
        CUDA_CHECK(cudaEventSynchronize(e1));
        CUDA_CHECK(cudaEventElapsedTime(&ms[r], e0, e1));
        ms[r] /= TIME_BATCH;
    }
    *host_us = host / (TIME_REPS * TIME_BATCH) * 1e6;
    return median_of(ms, TIME_REPS);
}

/* Median over TIME_REPS replays of a CUDA graph (as the decode step runs) of `calls` (set,
 * copy) matmuls at n rows, divided by `per`: device ms per `per` calls. */
static float time_graph(KCudaGemm *g, TimeSet *const *sets, int calls, int per, int n, void *stream,
                        cudaEvent_t e0, cudaEvent_t e1) {
    for (int i = 0; i < calls; i++) /* eager first: heuristics are cached before the capture */
        k_cuda_matmul(g, sets[i]->dout, sets[i]->dx, DT_BF16,
                      &sets[i]->ws[(i / per) % sets[i]->ncopies], NULL, n, stream);
    k_cuda_stream_synchronize(stream);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture((cudaStream_t)stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < calls; i++)
        k_cuda_matmul(g, sets[i]->dout, sets[i]->dx, DT_BF16,
                      &sets[i]->ws[(i / per) % sets[i]->ncopies], NULL, n, stream);
    CUDA_CHECK(cudaStreamEndCapture((cudaStream_t)stream, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    float ms[TIME_REPS];
    for (int r = -3; r < TIME_REPS; r++) {
        CUDA_CHECK(cudaEventRecord(e0, (cudaStream_t)stream));
        CUDA_CHECK(cudaGraphLaunch(exec, (cudaStream_t)stream));
        CUDA_CHECK(cudaEventRecord(e1, (cudaStream_t)stream));
        CUDA_CHECK(cudaEventSynchronize(e1));
        if (r >= 0) {
            CUDA_CHECK(cudaEventElapsedTime(&ms[r], e0, e1));
            ms[r] /= (float)calls / (float)per;
        }
    }
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
    return median_of(ms, TIME_REPS);
}

/* TIME_BATCH calls of one shape in a graph, cycling the copies: device ms per call. */
static float time_graph_calls(KCudaGemm *g, TimeSet *t, int n, void *stream, cudaEvent_t e0,
                              cudaEvent_t e1) {
    TimeSet *sets[TIME_BATCH];
    for (int i = 0; i < TIME_BATCH; i++)
        sets[i] = t;
    return time_graph(g, sets, TIME_BATCH, 1, n, stream, e0, e1);
}

/* CHAIN_LAYERS decoder layers' projections (qkv, o, gate_up, down) in one graph: device ms
 * per layer (the layers share one set of weights, 436 MB, so they come from HBM). */
static float time_chain(KCudaGemm *g, TimeSet *const layer[4], int n, void *stream, cudaEvent_t e0,
                        cudaEvent_t e1) {
    TimeSet *sets[4 * CHAIN_LAYERS];
    for (int i = 0; i < 4 * CHAIN_LAYERS; i++)
        sets[i] = layer[i % 4];
    return time_graph(g, sets, 4 * CHAIN_LAYERS, 4, n, stream, e0, e1);
}

static double floor_us(int N, int K, int n) {
    double bytes = 2.0 * ((double)N * K + (double)n * K + (double)n * N);
    double flops = 2.0 * n * (double)N * K;
    double fb = bytes / 4.23e12, ff = flops / 763e12;
    return (fb > ff ? fb : ff) * 1e6;
}

static void print_row(const char *path, int N, int K, int n, float ms, double host_us) {
    double bytes = 2.0 * ((double)N * K + (double)n * K + (double)n * N);
    double flops = 2.0 * n * (double)N * K;
    double s = ms * 1e-3, fl = floor_us(N, K, n);
    print_message("timing: %6dx%-5d n %4d %-9s %9.1f us  %7.0f GB/s  %6.1f TFLOP/s  "
                  "floor %8.1f us  time/floor %5.2f  host %4.1f us/call\n",
                  N, K, n, path, s * 1e6, bytes / s / 1e9, flops / s / 1e12, fl, s * 1e6 / fl,
                  host_us);
}

/* The Llama-3-8B projections: qkv, o, gate_up, down, LM head, and up / gate alone. */
static const int time_shapes[6][2] = {{6144, 4096},  {4096, 4096},   {28672, 4096},
                                      {4096, 14336}, {128256, 4096}, {14336, 4096}};

/* Not a check: bf16 GEMM timings at the Llama-3-8B shapes, printed for the record with the
 * ratio to the floor; at n <= 8 every path side by side (legacy stream, back to back), and the
 * automatic choice also in a CUDA graph; then a decoder layer's four projections in a graph. */
static void test_matmul_timing(void **state) {
    (void)state;
    REQUIRE_GPU();
    if (quick())
        return;
    rng_seed(28);
    const int ns[] = {1, 2, 4, 8, 64, 256, 2048};
    const int nmax = 2048;
    KCudaGemm *g = k_cuda_gemm_create(0);
    void *stream = k_cuda_stream_create();
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    TimeSet sets[6];
    for (int si = 0; si < 6; si++) {
        TimeSet *t = &sets[si];
        *t = timeset_make(time_shapes[si][0], time_shapes[si][1], nmax);
        for (int ni = 0; ni < 7; ni++) {
            int n = ns[ni];
            double host;
            k_cuda_gemm_force(g, KC_GEMM_AUTO, 0);
            float ms = time_calls(g, t, n, e0, e1, &host);
            print_row("auto", t->N, t->K, n, ms, host);
            if (n <= 8) {
                ms = time_graph_calls(g, t, n, stream, e0, e1);
                print_row("graph", t->N, t->K, n, ms, 0.0);
                k_cuda_gemm_force(g, KC_GEMM_CUBLASLT, 0);
                ms = time_calls(g, t, n, e0, e1, &host);
                print_row("cublaslt", t->N, t->K, n, ms, host);
                static const int rows[3] = {1, 2, 4};
                static const char *names[3] = {"gemv-r1", "gemv-r2", "gemv-r4"};
                for (int r = 0; r < 3; r++) {
                    k_cuda_gemm_force(g, KC_GEMM_GEMV, rows[r]);
                    ms = time_calls(g, t, n, e0, e1, &host);
                    print_row(names[r], t->N, t->K, n, ms, host);
                }
            }
        }
    }
    k_cuda_gemm_force(g, KC_GEMM_AUTO, 0);
    TimeSet *layer[4] = {&sets[0], &sets[1], &sets[2], &sets[3]};
    for (int n = 1; n <= 2; n++) {
        float ms = time_chain(g, layer, n, stream, e0, e1);
        print_message("timing: layer projections (qkv, o, gate_up, down) n %d in a graph: %.1f us "
                      "per layer, floor %.1f us\n",
                      n, ms * 1e3,
                      floor_us(6144, 4096, n) + floor_us(4096, 4096, n) + floor_us(28672, 4096, n) +
                          floor_us(4096, 14336, n));
    }
    for (int si = 0; si < 6; si++)
        timeset_free(&sets[si]);
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    k_cuda_stream_destroy(stream);
    k_cuda_gemm_destroy(g);
}

#endif /* PAGELLM_HAVE_CUDA */

int main(void) {
    const struct CMUnitTest tests[] = {MATMUL_TESTS(UNIT)};
    RUN_CUDA_TESTS(tests);
}
