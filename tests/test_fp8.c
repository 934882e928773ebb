/* test_fp8.c - fp8 e4m3 arithmetic on the CPU: the conversions against a brute-force search of
 * the 256 codes, and the reference matmul with an fp8 weight (per-tensor, per-channel and
 * 128 x 128 block scales, dynamic and static activation scales) against a straightforward
 * dequantize-then-multiply in double precision. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common.h"
#include "kernels.h"
#include "backend_test_util.h"

static uint64_t rng_state = 1;

static float rnd(float lo, float hi) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return lo + (hi - lo) * (float)((z >> 40) * (1.0 / 16777216.0));
}

/* The e4m3 code nearest to f by search over every finite code, ties to the even code;
 * beyond 448 the largest. */
static uint8_t nearest_code(float f) {
    if (fabsf(f) >= 448.0f)
        return f < 0 ? 0xfe : 0x7e;
    uint8_t best = 0;
    double best_err = INFINITY;
    int sign = signbit(f) ? 0x80 : 0;
    for (int q = sign; q < sign + 0x7f; q++) {
        double err = fabs((double)pl_f8e4m3_to_f32((uint8_t)q) - (double)f);
        if (err < best_err || (err == best_err && !(q & 1))) {
            best = (uint8_t)q;
            best_err = err;
        }
    }
    return best;
}

static void test_decode_known_values(void **state) {
    (void)state;
    assert_true(pl_f8e4m3_to_f32(0x38) == 1.0f);
    assert_true(pl_f8e4m3_to_f32(0xb8) == -1.0f);
    assert_true(pl_f8e4m3_to_f32(0x7e) == 448.0f);
    assert_true(pl_f8e4m3_to_f32(0x08) == ldexpf(1.0f, -6)); /* smallest normal */
    assert_true(pl_f8e4m3_to_f32(0x01) == ldexpf(1.0f, -9)); /* smallest subnormal */
    assert_true(pl_f8e4m3_to_f32(0x07) == 7 * ldexpf(1.0f, -9));
    assert_true(pl_f8e4m3_to_f32(0x3d) == 1.625f);
    assert_true(isnan(pl_f8e4m3_to_f32(0x7f)) && isnan(pl_f8e4m3_to_f32(0xff)));
    assert_true(pl_f8e4m3_to_f32(0x00) == 0.0f && signbit(pl_f8e4m3_to_f32(0x80)));
}

static void test_encode_round_trip_and_saturation(void **state) {
    (void)state;
    for (int q = 0; q < 256; q++)
        if ((q & 0x7f) != 0x7f)
            assert_int_equal(pl_f32_to_f8e4m3(pl_f8e4m3_to_f32((uint8_t)q)), q);
    assert_int_equal(pl_f32_to_f8e4m3(460.0f), 0x7e);
    assert_int_equal(pl_f32_to_f8e4m3(1e30f), 0x7e);
    assert_int_equal(pl_f32_to_f8e4m3(-INFINITY), 0xfe);
    assert_int_equal(pl_f32_to_f8e4m3(NAN) & 0x7f, 0x7f);
    assert_int_equal(pl_f32_to_f8e4m3(1e-30f), 0x00);
}

/* Every midpoint between neighbouring codes goes to the even one; a hair either side goes to
 * the nearer. */
static void test_encode_midpoints(void **state) {
    (void)state;
    for (int q = 0; q < 0x7e; q++) {
        float a = pl_f8e4m3_to_f32((uint8_t)q), b = pl_f8e4m3_to_f32((uint8_t)(q + 1));
        float mid = (a + b) / 2; /* exact: both have few bits */
        assert_int_equal(pl_f32_to_f8e4m3(mid), (q & 1) ? q + 1 : q);
        assert_int_equal(pl_f32_to_f8e4m3(-mid), ((q & 1) ? q + 1 : q) | 0x80);
        assert_int_equal(pl_f32_to_f8e4m3(nextafterf(mid, 0)), q);
        assert_int_equal(pl_f32_to_f8e4m3(nextafterf(mid, 1000)), q + 1);
    }
}

static void test_encode_matches_search(void **state) {
    (void)state;
    const float ranges[] = {1e-3f, 0.02f, 1.0f, 30.0f, 500.0f};
    for (int r = 0; r < 5; r++)
        for (int i = 0; i < 4000; i++) {
            float f = rnd(-ranges[r], ranges[r]);
            assert_int_equal(pl_f32_to_f8e4m3(f), nearest_code(f));
        }
}

/* ---- matmul ---- */

typedef struct {
    Fp8ScaleKind kind;
    int N, K, n;
    float input_scale;
    int with_bias;
} Fp8Case;

static double weight_scale(const Fp8Case *c, const float *ws, int j, int k) {
    int kb = (c->K + 127) / 128;
    switch (c->kind) {
        case FP8_SCALE_TENSOR:
            return ws[0];
        case FP8_SCALE_CHANNEL:
            return ws[j];
        default:
            return ws[(j / 128) * kb + k / 128];
    }
}

/* The activation scale of x's row i over columns [k0, k0 + len), as matmul documents it. */
static float activation_scale(const Fp8Case *c, const float *row, int k0, int len) {
    if (c->input_scale > 0)
        return c->input_scale;
    float amax = 0;
    for (int k = k0; k < k0 + len; k++)
        amax = fmaxf(amax, fabsf(row[k]));
    return fmaxf(amax / 448.0f, PL_F8E4M3_MIN_SCALE);
}

static int check_case(const Fp8Case *c) {
    const KernelOps *ops = test_cpu_ops();
    int N = c->N, K = c->K, n = c->n, group = c->kind == FP8_SCALE_BLOCK ? 128 : K;
    int nws = c->kind == FP8_SCALE_TENSOR    ? 1
              : c->kind == FP8_SCALE_CHANNEL ? N
                                             : ((N + 127) / 128) * ((K + 127) / 128);
    uint8_t *wq = malloc((size_t)N * K);
    float *ws = malloc(sizeof(float) * nws), *x = malloc(sizeof(float) * n * K);
    float *bias = malloc(sizeof(float) * N), *out = malloc(sizeof(float) * n * N);
    for (size_t i = 0; i < (size_t)N * K; i++)
        wq[i] = pl_f32_to_f8e4m3(rnd(-448, 448));
    for (int i = 0; i < nws; i++)
        ws[i] = rnd(1e-4f, 3e-3f);
    for (size_t i = 0; i < (size_t)n * K; i++)
        x[i] = rnd(-2, 2) * (i % 7 == 0 ? 20.0f : 1.0f);   /* some outliers */
    memset(x + (size_t)(n - 1) * K, 0, sizeof(float) * K); /* an all-zero row */
    for (int j = 0; j < N; j++)
        bias[j] = rnd(-1, 1);
    Tensor w = {.data = wq, .dtype = DT_F8E4M3, .ndim = 2, .shape = {N, K}};
    w.fp8 =
        (Fp8Scales){.kind = c->kind, .block = 128, .w_scale = ws, .input_scale = c->input_scale};
    Tensor b = {.data = bias, .dtype = DT_F32, .ndim = 1, .shape = {N}};
    ops->matmul(ops, out, x, &w, c->with_bias ? &b : NULL, n);

    int bad = 0;
    for (int i = 0; i < n; i++) {
        const float *row = x + (size_t)i * K;
        for (int j = 0; j < N; j++) {
            double want = c->with_bias ? bias[j] : 0, mag = fabs(want);
            for (int k0 = 0; k0 < K; k0 += group) {
                int len = k0 + group <= K ? group : K - k0;
                float s = activation_scale(c, row, k0, len);
                for (int k = k0; k < k0 + len; k++) {
                    double xv = (double)pl_f8e4m3_to_f32(pl_f32_to_f8e4m3(row[k] * (1.0f / s))) * s;
                    double wv =
                        (double)pl_f8e4m3_to_f32(wq[(size_t)j * K + k]) * weight_scale(c, ws, j, k);
                    want += xv * wv;
                    mag += fabs(xv * wv);
                }
            }
            double got = out[(size_t)i * N + j];
            if (fabs(got - want) > 2e-6 * mag + 1e-30) {
                if (bad++ < 3)
                    print_error("kind %d n %d N %d K %d: out[%d, %d] = %.9g, want %.9g\n", c->kind,
                                n, N, K, i, j, got, want);
            }
        }
    }
    free(wq), free(ws), free(x), free(bias), free(out);
    return bad;
}

static void test_matmul_fp8_matches_dequantized(void **state) {
    (void)state;
    const Fp8Case cases[] = {
        {FP8_SCALE_TENSOR, 33, 100, 3, 0, 1},     {FP8_SCALE_TENSOR, 64, 256, 5, 0.01f, 0},
        {FP8_SCALE_CHANNEL, 70, 129, 4, 0, 1},    {FP8_SCALE_CHANNEL, 300, 1024, 9, 0, 1},
        {FP8_SCALE_CHANNEL, 16, 64, 2, 0.02f, 1}, {FP8_SCALE_BLOCK, 256, 384, 4, 0, 0},
        {FP8_SCALE_BLOCK, 200, 300, 3, 0, 1},     {FP8_SCALE_BLOCK, 130, 1000, 17, 0, 1},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        bad += check_case(&cases[i]);
    assert_int_equal(bad, 0);
}

/* A static scale too small for x saturates at +-448 rather than overflowing. */
static void test_matmul_fp8_static_scale_saturates(void **state) {
    (void)state;
    const KernelOps *ops = test_cpu_ops();
    uint8_t wq[2] = {0x38, 0x38}; /* 1, 1 */
    float ws = 1.0f, x[2] = {1000.0f, -5.0f}, out;
    Tensor w = {.data = wq, .dtype = DT_F8E4M3, .ndim = 2, .shape = {1, 2}};
    w.fp8 = (Fp8Scales){.kind = FP8_SCALE_TENSOR, .w_scale = &ws, .input_scale = 1.0f};
    ops->matmul(ops, &out, x, &w, NULL, 1);
    assert_true(out == 448.0f - 5.0f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_known_values),
        cmocka_unit_test(test_encode_round_trip_and_saturation),
        cmocka_unit_test(test_encode_midpoints),
        cmocka_unit_test(test_encode_matches_search),
        cmocka_unit_test(test_matmul_fp8_matches_dequantized),
        cmocka_unit_test(test_matmul_fp8_static_scale_saturates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
