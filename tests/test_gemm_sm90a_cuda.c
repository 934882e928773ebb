/* test_gemm_sm90a_cuda.c - the own Hopper GEMM (kernels/cuda/gemm_sm90a.cu): the gate-up
 * projection with SiLU times up in its epilogue, each tile variant forced, against the pair it
 * replaces (k_cuda_matmul then k_cuda_silu_mul, forced through k_cuda_gemm_force_silu_mul):
 * bf16 and f16, dims 336, 448 and 1792 (3, 4 and 16 column tiles of 112) and 200 (no tile
 * fits: the pair), K 64, 1024 and 4096, 3 to 512 rows (partial row tiles; 1 to 4 row tiles, so
 * the CTA pairs take even counts and fall back to the pair on odd ones). The two differ only in the
 * order of the K sums, so gate and up can round to the other neighbour of the 16-bit grid now and
 * then: every element must lie within 1/32 relative (plus a small absolute floor) of the pair's,
 * and at least 95 % must be bit-equal (a wrong tile, fragment or pairing of gate and up columns
 * leaves almost none equal).
 *
 * The path taken is observed: the own GEMM never writes the projection's scratch (gate_up), the
 * pair does. A variant that cannot take a call (CTA pairs over an odd number of row tiles, a
 * dim not a multiple of 112) must fall back to the pair, and the measured path (KC_SILU_MUL_AUTO)
 * must give one of the two results.
 *
 * PAGELLM_WGMMA_TIMING=1 also times the Llama-3-8B gate-up (dim 14336, K 4096) at 128-512 rows
 * and a TP=2 rank's (dim 7168) at 256 by every path that takes the shape (cudaEvent, median of
 * 9 runs of 20 calls) and prints it. Without a GPU (CI) every
 * test is skipped with "no CUDA device: skipped"; on a GPU or build without the sm_90a kernels
 * with "no sm_90a kernels for this device: skipped". */
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
#ifdef PAGELLM_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels_cuda.h"
#endif
#include "cuda_test_util.h"

#define WGMMA_TESTS(X)                                                                             \
    X(test_wgmma_silu_mul)                                                                         \
    X(test_wgmma_timing)

#ifndef PAGELLM_HAVE_CUDA

WGMMA_TESTS(SKIP_TEST)

#else

#define REQUIRE_WGMMA()                                                                            \
    do {                                                                                           \
        REQUIRE_GPU();                                                                             \
        if (!k_cuda_wgmma_available()) {                                                           \
            print_message("no sm_90a kernels for this device: skipped\n");                         \
            skip();                                                                                \
        }                                                                                          \
    } while (0)

static const char *path_name(KCudaSiluMulPath p) {
    static const char *names[] = {"auto", "pair", "n224", "n224 cluster 1x2"};
    return names[p - KC_SILU_MUL_AUTO];
}

/* Whether a forced variant takes out[n, dim] (the contract in gemm_sm90a.cu): 224 weight rows
 * (112 output columns) by 128 rows of x a tile; the CTA pairs need an even number of row
 * tiles. */
static int variant_takes(KCudaSiluMulPath p, int dim, int n) {
    return dim % 112 == 0 && (p == KC_SILU_MUL_N224 || (n + 127) / 128 % 2 == 0);
}

/* out from path p; gate_up poisoned first, and whether the call left it so. */
static float *run_path(KCudaGemm *g, KCudaSiluMulPath p, const void *dx, DType act, const Tensor *w,
                       int n, int dim, int *untouched) {
    const size_t es = pl_dtype_size(act), on = (size_t)n * dim, gn = 2 * on;
    void *out = k_cuda_malloc(on * es), *gu = k_cuda_malloc(gn * es);
    k_cuda_memset(out, POISON, on * es);
    k_cuda_memset(gu, POISON, gn * es);
    k_cuda_gemm_force_silu_mul(g, p);
    k_cuda_matmul_silu_mul(g, out, gu, dx, act, w, n, NULL);
    k_cuda_synchronize();
    float *h = xmalloc(on * sizeof(float));
    download_as(h, out, on, act);
    *untouched = still_poisoned(gu, gn * es);
    k_cuda_free(out);
    k_cuda_free(gu);
    return h;
}

/* Elements of got not within 1/32 relative (+ atol) of want, or -1 when fewer than 95 % are
 * bit-equal; the first few printed. */
static int compare(const char *what, const float *got, const float *want, size_t n, float atol) {
    int bad = 0;
    size_t equal = 0;
    for (size_t i = 0; i < n; i++) {
        const float err = fabsf(got[i] - want[i]);
        equal += got[i] == want[i];
        if (!(err <= atol + fabsf(want[i]) / 32.0f) && bad++ < 3)
            print_error("%s: element %zu: got %.6g want %.6g\n", what, i, got[i], want[i]);
    }
    if (!bad && equal < n - n / 20) {
        print_error("%s: only %zu of %zu elements bit-equal\n", what, equal, n);
        return -1;
    }
    return bad;
}

static int silu_case(KCudaGemm *g, DType act, int dim, int K, int n) {
    Weight w = make_weight(act, 2, 2 * dim, K, -0.5f, 0.5f);
    float *x = rand_vec((size_t)n * K, -1, 1, act);
    void *dx = upload_as(x, (size_t)n * K, act);
    /* gate and up sums have a spread of about sqrt(K / 36); their products of that squared */
    const float atol = 1e-3f * (float)K / 36.0f;
    int untouched = 0, bad = 0;
    float *want = run_path(g, KC_SILU_MUL_PAIR, dx, act, &w.dev, n, dim, &untouched);
    char what[160];
    for (KCudaSiluMulPath p = KC_SILU_MUL_AUTO; p <= KC_SILU_MUL_N224_CLUSTER2; p++) {
        if (p == KC_SILU_MUL_PAIR)
            continue;
        float *got = run_path(g, p, dx, act, &w.dev, n, dim, &untouched);
        snprintf(what, sizeof what, "silu %s dim %d K %d n %d path %s", dn(act), dim, K, n,
                 path_name(p));
        const int c = compare(what, got, want, (size_t)n * dim, atol);
        bad += c != 0;
        if (p != KC_SILU_MUL_AUTO && untouched != variant_takes(p, dim, n)) {
            print_error("%s: expected the %s\n", what, untouched ? "pair" : "own GEMM");
            bad++;
        }
        free(got);
    }
    free(want);
    free_weight(&w);
    free(x);
    k_cuda_free(dx);
    return bad;
}

static void test_wgmma_silu_mul(void **state) {
    (void)state;
    REQUIRE_WGMMA();
    rng_seed(90);
    KCudaGemm *g = k_cuda_gemm_create(0);
    const DType acts[] = {DT_BF16, DT_F16};
    const int dims[] = {200, 336, 448, 1792}, ks[] = {64, 1024, 4096};
    const int all[] = {3, 17, 64, 128, 129, 200, 256, 300, 512}, few[] = {3, 129, 256};
    const int *ns = quick() ? few : all;
    const int nn = quick() ? 3 : (int)(sizeof all / sizeof all[0]);
    int bad = 0, cases = 0;
    for (int a = 0; a < 2; a++)
        for (int d = 0; d < 4; d++)
            for (int k = 0; k < 3; k++)
                for (int i = 0; i < nn; i++, cases++)
                    bad += silu_case(g, acts[a], dims[d], ks[k], ns[i]);
    print_message("wgmma silu: %d cases x 3 paths, %d failing\n", cases, bad);
    k_cuda_gemm_destroy(g);
    assert_int_equal(bad, 0);
}

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Every path on gate-up [2 dim, 4096] at n rows (bf16, dummy weights): us per call, the median
 * of RUNS runs of REPS back-to-back calls; a variant that does not take the shape is not run. */
static void time_shape(KCudaGemm *g, int dim, int n, cudaEvent_t e0, cudaEvent_t e1) {
    enum { REPS = 20, RUNS = 9, K = 4096 };
    const size_t wn = (size_t)2 * dim * K;
    Tensor w = {.dtype = DT_BF16, .ndim = 2, .shape = {2 * dim, K}};
    w.data = k_cuda_malloc(wn * 2);
    k_cuda_fill_dummy(w.data, DT_BF16, wn, 7, 0.02f, NULL);
    void *x = k_cuda_malloc((size_t)n * K * 2), *out = k_cuda_malloc((size_t)n * dim * 2);
    void *gu = k_cuda_malloc((size_t)n * 2 * dim * 2);
    k_cuda_fill_dummy(x, DT_BF16, (size_t)n * K, 8, 1.0f, NULL);
    const double flop = 2.0 * n * 2 * dim * K;
    for (KCudaSiluMulPath p = KC_SILU_MUL_PAIR; p <= KC_SILU_MUL_N224_CLUSTER2; p++) {
        if (p != KC_SILU_MUL_PAIR && !variant_takes(p, dim, n))
            continue;
        k_cuda_gemm_force_silu_mul(g, p);
        float ms[RUNS];
        for (int r = 0; r < RUNS; r++) {
            k_cuda_matmul_silu_mul(g, out, gu, x, DT_BF16, &w, n, NULL);
            cudaEventRecord(e0, NULL);
            for (int i = 0; i < REPS; i++)
                k_cuda_matmul_silu_mul(g, out, gu, x, DT_BF16, &w, n, NULL);
            cudaEventRecord(e1, NULL);
            cudaEventSynchronize(e1);
            cudaEventElapsedTime(&ms[r], e0, e1);
        }
        qsort(ms, RUNS, sizeof ms[0], cmp_float);
        const double us = ms[RUNS / 2] * 1e3 / REPS;
        print_message("timing: gate-up + silu, %3d x %5d x %d, %-17s %7.1f us per call, %.0f "
                      "TFLOP/s\n",
                      n, 2 * dim, K, path_name(p), us, flop / us * 1e-6);
    }
    k_cuda_free(w.data);
    k_cuda_free(x);
    k_cuda_free(out);
    k_cuda_free(gu);
}

/* PAGELLM_WGMMA_TIMING set: the Llama-3-8B gate-up at 128-512 rows and one TP=2 rank's (dim
 * 7168) at 256, by every path; set to a row count (say 256), only the shapes of that many rows
 * (for a profiler). */
static void test_wgmma_timing(void **state) {
    (void)state;
    const char *t = getenv("PAGELLM_WGMMA_TIMING");
    if (!t || !*t || strcmp(t, "0") == 0) {
        print_message("PAGELLM_WGMMA_TIMING unset: skipped\n");
        skip();
    }
    REQUIRE_WGMMA();
    const int shapes[][2] = {{14336, 128}, {14336, 192}, {14336, 256},
                             {14336, 384}, {14336, 512}, {7168, 256}};
    KCudaGemm *g = k_cuda_gemm_create(0);
    cudaEvent_t e0, e1;
    assert_int_equal(cudaEventCreate(&e0), cudaSuccess);
    assert_int_equal(cudaEventCreate(&e1), cudaSuccess);
    const int rows = atoi(t), only_rows = rows > 1 ? rows : 0; /* a row count: its shapes */
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (!only_rows || shapes[i][1] == only_rows)
            time_shape(g, shapes[i][0], shapes[i][1], e0, e1);
    k_cuda_gemm_destroy(g);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
}

#endif /* PAGELLM_HAVE_CUDA */

int main(void) {
    const struct CMUnitTest tests[] = {WGMMA_TESTS(UNIT)};
    RUN_CUDA_TESTS(tests);
}
