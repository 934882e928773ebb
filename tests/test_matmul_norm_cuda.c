/* test_matmul_norm_cuda.c - the fused projection + residual add + RMSNorm
 * (k_cuda_matmul_add_rmsnorm, kernels/cuda/matmul_norm.cu) against the two calls it replaces,
 * k_cuda_matmul then k_cuda_add_rmsnorm, on random data from fixed seeds: BF16 and F16 (where
 * the partials can run) and F32 (always the two calls), N = 1024 then 256 (the partials buffer
 * is sized by the first call), K = 1024 (2 or 4 partials) and 80 (2 only: K % 32 != 0), n = 1
 * and 2 (the GEMV: two calls), 3, 64, 256, and
 * 513 (above the partials' row limit), with each split forced and with the measured choice.
 *
 * The residual and the normed rows must match within two ulps of bf16 (the partials are summed
 * in another order than cuBLASLt's, so their rounding may differ by one ulp). Which path ran is
 * observed, not assumed: only the two calls write the projection's scratch, so each case
 * poisons it and checks that it stays poisoned exactly when the forced split could run.
 *
 * Without a GPU (CI) every test is skipped with "no CUDA device: skipped"; in a build without
 * the CUDA backend, with "CUDA backend not built: skipped". PAGELLM_CUDA_TEST_FILTER=pattern
 * runs the matching tests only. */
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
#include "kernels_cuda.h"
#endif
#include "cuda_test_util.h"

#define MATMUL_NORM_TESTS(X)                                                                       \
    X(test_matmul_norm_forced)                                                                     \
    X(test_matmul_norm_measured)

#ifndef PAGELLM_HAVE_CUDA

MATMUL_NORM_TESTS(SKIP_TEST)

#else

enum { MAX_ROWS = 512 };
static const float EPS = 1e-5f, TOL = 2.0f / 256.0f;

/* Whether a forced split runs for this call (matmul_norm.cu's contract). */
static int expect_partials(DType act, int K, int n, int splits) {
    return (act == DT_BF16 || act == DT_F16) && splits > 0 && K % (8 * splits) == 0 && n > 2 &&
           n <= MAX_ROWS;
}

/* One case: the fused op (splits forced, or -1: measured) and the two calls on copies of the
 * same residual; the number of mismatches (path included). */
static int one_case(KCudaGemm *g, KCudaProjNorm *p, DType act, int N, int K, int n, int splits) {
    const size_t es = pl_dtype_size(act), rn = (size_t)n * N;
    Weight w = make_weight(act, 2, N, K, -0.05f, 0.05f);
    Weight norm = make_weight(act, 1, N, 0, 0.5f, 1.5f);
    float *x = rand_vec((size_t)n * K, -1, 1, act), *res = rand_vec(rn, -1, 1, act);
    void *dx = upload_as(x, (size_t)n * K, act);
    void *res_a = upload_as(res, rn, act), *res_b = upload_as(res, rn, act);
    void *out_a = k_cuda_malloc(rn * es), *out_b = k_cuda_malloc(rn * es);
    void *proj_a = k_cuda_malloc(rn * es), *proj_b = k_cuda_malloc(rn * es);
    k_cuda_memset(out_b, POISON, rn * es);
    k_cuda_memset(proj_b, POISON, rn * es);

    k_cuda_matmul(g, proj_a, dx, act, &w.dev, NULL, n, NULL);
    k_cuda_add_rmsnorm(res_a, proj_a, out_a, act, &norm.dev, n, N, EPS, NULL);
    k_cuda_proj_norm_force(p, splits);
    k_cuda_matmul_add_rmsnorm(p, g, res_b, out_b, proj_b, dx, act, &w.dev, &norm.dev, n, EPS, NULL);
    k_cuda_proj_norm_force(p, -1);
    k_cuda_synchronize();

    char what[128];
    snprintf(what, sizeof what, "%s N %d K %d n %d splits %d", dn(act), N, K, n, splits);
    float *ga = xmalloc(rn * sizeof(float)), *gb = xmalloc(rn * sizeof(float));
    download_as(ga, res_a, rn, act);
    download_as(gb, res_b, rn, act);
    int bad = check_close(what, gb, ga, rn, TOL);
    download_as(ga, out_a, rn, act);
    download_as(gb, out_b, rn, act);
    bad += check_close(what, gb, ga, rn, TOL);
    if (splits >= 0 && still_poisoned(proj_b, rn * es) != expect_partials(act, K, n, splits)) {
        print_error("%s: expected the %s\n", what,
                    expect_partials(act, K, n, splits) ? "partials" : "two calls");
        bad++;
    }
    free(ga);
    free(gb);
    free(x);
    free(res);
    free_weight(&w);
    free_weight(&norm);
    void *dev[] = {dx, res_a, res_b, out_a, out_b, proj_a, proj_b};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++)
        k_cuda_free(dev[i]);
    return bad;
}

static int sweep(const int *splits, int num_splits) {
    const DType acts[] = {DT_BF16, DT_F16, DT_F32};
    const int Ns[] = {1024, 256}, Ks[] = {1024, 80}, ns[] = {1, 2, 3, 64, 256, 513};
    int bad = 0, cases = 0;
    for (int a = 0; a < 3; a++) {
        /* one state per dtype, as the backend keeps one per activation table */
        KCudaGemm *g = k_cuda_gemm_create(acts[a] == DT_F32 ? 1 << 22 : 0);
        KCudaProjNorm *p = k_cuda_proj_norm_create();
        for (int ni = 0; ni < 2; ni++)
            for (int ki = 0; ki < 2; ki++)
                for (int r = 0; r < 6; r++)
                    for (int s = 0; s < num_splits; s++, cases++)
                        bad += one_case(g, p, acts[a], Ns[ni], Ks[ki], ns[r], splits[s]);
        k_cuda_proj_norm_destroy(p);
        k_cuda_gemm_destroy(g);
    }
    print_message("matmul + add_rmsnorm: %d cases, %d differing\n", cases, bad);
    return bad;
}

static void test_matmul_norm_forced(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(51);
    const int splits[] = {0, 2, 4};
    assert_int_equal(sweep(splits, 3), 0);
}

/* The measured choice (whichever split won on this GPU) gives the same results. */
static void test_matmul_norm_measured(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(52);
    const int splits[] = {-1};
    assert_int_equal(sweep(splits, 1), 0);
}

#endif /* PAGELLM_HAVE_CUDA */

int main(void) {
    const struct CMUnitTest tests[] = {MATMUL_NORM_TESTS(UNIT)};
    RUN_CUDA_TESTS(tests);
}
