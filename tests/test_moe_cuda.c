/* test_moe_cuda.c - the CUDA mixture-of-experts MLP (k_cuda_moe_mlp, kernels/cuda/moe*.cu)
 * against the CPU op (kernels/cpu/moe.c, the reference) on the same rounded inputs, over its
 * three paths and the routing cases that break grouping:
 *   GEMV path (16-bit, n <= 8): n = 1, 2, 3, 4, 7, 8 (its kernels for at most 1, 2, 4 and 8
 *   rows an expert; down blocks of 4 to 32 output rows, H not a multiple of them);
 *   tensor-core path: n = 9, 16, 64, 256, 300 (tiles of 16 to 96 rows); plain path: fp32
 *   activations or weights, and H not a multiple of 8; routing in one launch up to n = 16, in
 *   three above;
 *   top-k 2 of 8 or 16 experts (Mixtral-like) and 8 of 64 or 128 (Qwen3-MoE-like), with and
 *   without renormalization; K and N not multiples of the tiles (H 200, 320; I 96, 176, 1104);
 *   "skewed" routing: every row picks one hot expert (at n = 300, 300 rows on one expert: many
 *   tiles) and a cold one gets no row; with 128 experts and few rows most get none.
 * Tolerance: 16-bit activations round g, u, silu(g) u and each expert's down dot, errors of the
 * outputs' scale, so |gpu - ref| <= tol (1 + |ref|) with tol = 1e-2 (bf16, f16) or 1e-4 (fp32)
 * times the largest |ref| of the case. Outputs start as NaN, so unwritten rows fail. Each case
 * also runs twice and must give the same bits (the grouping's order within an expert varies;
 * the values may not), and two cases are recorded in a CUDA graph and replayed: the same bits.
 * The last test prints one layer's time at the Qwen3-30B-A3B and Mixtral-8x7B shapes against
 * its floor (never fails on speed).
 *
 * Without a GPU (CI) every test is skipped with "no CUDA device: skipped"; in a build without
 * the CUDA backend, with "CUDA backend not built: skipped". PAGELLM_CUDA_TEST_FILTER=pattern
 * runs the matching tests only; PAGELLM_CUDA_TEST_QUICK=1 drops the timings. */
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

#define MOE_TESTS(X)                                                                               \
    X(test_moe_gemv_path)                                                                          \
    X(test_moe_mma_path)                                                                           \
    X(test_moe_plain_path)                                                                         \
    X(test_moe_graph)                                                                              \
    X(test_moe_timing)

#ifndef PAGELLM_HAVE_CUDA

MOE_TESTS(SKIP_TEST)

#else

typedef struct {
    DType act, wdt;
    int n, E, H, I, top_k, renorm, skewed;
} MoeCase;

/* Inputs of a case on the host (rounded to their dtypes) and on the device. */
typedef struct {
    float *x;
    void *dx;
    Weight router, gu, dw;
} MoeInputs;

static void shape3(Weight *w, int E, int64_t rows, int64_t cols) {
    for (int i = 0; i < 2; i++) {
        Tensor *t = i ? &w->dev : &w->host;
        t->ndim = 3;
        t->shape[0] = E;
        t->shape[1] = rows;
        t->shape[2] = cols;
    }
}

/* Skewed routing: x >= 0, router row 0 a positive constant (about 5 standard deviations of the
 * other logits above them: picked by every row), row 1 its negative (never picked). */
static MoeInputs make_inputs(const MoeCase *c) {
    MoeInputs in;
    const size_t len = (size_t)c->n * c->H;
    in.x = rand_vec(len, c->skewed ? 0.0f : -1.0f, 1.0f, c->act);
    in.router = make_weight(c->wdt, 2, c->E, c->H, -0.5f, 0.5f);
    if (c->skewed) {
        const float hot = 5.0f * sqrtf((float)c->H / 36.0f) / ((float)c->H / 2.0f);
        float *rows = rand_vec((size_t)c->E * c->H, -0.5f, 0.5f, c->wdt);
        for (int k = 0; k < c->H; k++) {
            rows[k] = round_to(hot, c->wdt);
            rows[c->H + k] = round_to(-hot, c->wdt);
        }
        void *h = to_dtype(rows, (size_t)c->E * c->H, c->wdt);
        size_t bytes = (size_t)c->E * c->H * pl_dtype_size(c->wdt);
        memcpy(in.router.host.data, h, bytes);
        k_cuda_memcpy(in.router.dev.data, h, bytes);
        free(h);
        free(rows);
    }
    in.gu = make_weight(c->wdt, 2, (int64_t)c->E * 2 * c->I, c->H, -0.2f, 0.2f);
    in.dw = make_weight(c->wdt, 2, (int64_t)c->E * c->H, c->I, -0.2f, 0.2f);
    shape3(&in.gu, c->E, 2 * (int64_t)c->I, c->H);
    shape3(&in.dw, c->E, c->H, c->I);
    in.dx = upload_as(in.x, len, c->act);
    return in;
}

static void free_inputs(MoeInputs *in) {
    free(in->x);
    k_cuda_free(in->dx);
    free_weight(&in->router);
    free_weight(&in->gu);
    free_weight(&in->dw);
}

static void case_name(char *buf, size_t size, const MoeCase *c) {
    snprintf(buf, size, "moe act %s w %s n %d E %d H %d I %d top %d renorm %d%s", dn(c->act),
             dn(c->wdt), c->n, c->E, c->H, c->I, c->top_k, c->renorm, c->skewed ? " skewed" : "");
}

/* A device buffer for the case's output, every byte 0xFF (NaN in every dtype). */
static void *nan_out(const MoeCase *c) {
    size_t bytes = (size_t)c->n * c->H * pl_dtype_size(c->act);
    void *d = k_cuda_malloc(bytes);
    k_cuda_memset(d, 0xFF, bytes);
    return d;
}

/* Bytes of two device buffers equal? */
static int same_bits(const void *a, const void *b, size_t bytes) {
    unsigned char *ha = xmalloc(bytes), *hb = xmalloc(bytes);
    k_cuda_memcpy(ha, a, bytes);
    k_cuda_memcpy(hb, b, bytes);
    int same = memcmp(ha, hb, bytes) == 0;
    free(ha);
    free(hb);
    return same;
}

static int run_case(const MoeCase *c) {
    const KernelOps *cpu = test_cpu_ops();
    MoeInputs in = make_inputs(c);
    const size_t len = (size_t)c->n * c->H, bytes = len * pl_dtype_size(c->act);
    float *ref = xmalloc(len * sizeof(float)), *got = xmalloc(len * sizeof(float));
    cpu->moe_mlp(cpu, ref, in.x, &in.router.host, &in.gu.host, &in.dw.host, c->n, c->top_k,
                 c->renorm, NULL, 0);
    size_t ws_bytes = k_cuda_moe_workspace_bytes(c->act, c->n, c->E, c->H, c->I, c->top_k);
    void *ws = k_cuda_malloc(ws_bytes), *out = nan_out(c), *again = nan_out(c);
    k_cuda_moe_mlp(out, in.dx, c->act, &in.router.dev, &in.gu.dev, &in.dw.dev, c->n, c->top_k,
                   c->renorm, ws, ws_bytes, NULL);
    k_cuda_moe_mlp(again, in.dx, c->act, &in.router.dev, &in.gu.dev, &in.dw.dev, c->n, c->top_k,
                   c->renorm, ws, ws_bytes, NULL);
    k_cuda_synchronize();
    download_as(got, out, len, c->act);
    char what[160];
    case_name(what, sizeof what, c);
    double scale = 1.0;
    for (size_t i = 0; i < len; i++)
        scale = fmax(scale, fabs(ref[i]));
    int bad = check_close(what, got, ref, len, (c->act == DT_F32 ? 1e-4 : 1e-2) * scale);
    if (!same_bits(out, again, bytes)) {
        print_error("%s: a second run gave other bits\n", what);
        bad++;
    }
    k_cuda_free(ws);
    k_cuda_free(out);
    k_cuda_free(again);
    free(ref);
    free(got);
    free_inputs(&in);
    return bad;
}

static int run_cases(const MoeCase *cases, int count) {
    int bad = 0;
    for (int i = 0; i < count; i++)
        bad += run_case(&cases[i]) != 0;
    return bad;
}

static void test_moe_gemv_path(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(37);
    const MoeCase cases[] = {
        {DT_BF16, DT_BF16, 1, 8, 256, 96, 2, 1, 0},
        {DT_F16, DT_F16, 1, 8, 256, 96, 2, 1, 0},
        {DT_BF16, DT_BF16, 2, 128, 512, 128, 8, 1, 0},
        {DT_F16, DT_F16, 7, 16, 256, 1104, 2, 1, 0}, /* two chunk groups a down row */
        {DT_BF16, DT_BF16, 7, 8, 256, 96, 2, 0, 0},
        {DT_BF16, DT_BF16, 7, 64, 512, 96, 8, 1, 1},
        {DT_BF16, DT_BF16, 2, 16, 200, 176, 2, 1, 1},
        {DT_BF16, DT_BF16, 1, 128, 2048, 768, 8, 1, 0}, /* Qwen3-30B-A3B's layer */
        {DT_BF16, DT_BF16, 8, 128, 2048, 768, 8, 1, 0},
        {DT_BF16, DT_BF16, 4, 16, 256, 176, 4, 1, 0}, /* four rows an expert at most */
        {DT_F16, DT_F16, 3, 16, 256, 96, 4, 0, 1},
        {DT_BF16, DT_BF16, 1, 8, 200, 96, 2, 1, 0},    /* down blocks of 16 rows, H = 200 */
        {DT_BF16, DT_BF16, 1, 4, 48, 64, 1, 1, 0},     /* top 1: blocks of 32 rows, one cut */
        {DT_BF16, DT_BF16, 1, 8, 1024, 3584, 2, 1, 0}, /* Mixtral-like, smaller */
        {DT_F16, DT_F16, 1, 4, 4096, 128, 2, 1, 0},    /* H >= 4096: more in flight */
    };
    assert_int_equal(run_cases(cases, (int)(sizeof cases / sizeof *cases)), 0);
}

static void test_moe_mma_path(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(38);
    const MoeCase cases[] = {
        {DT_BF16, DT_BF16, 9, 8, 256, 96, 2, 1, 0},
        {DT_BF16, DT_BF16, 64, 8, 320, 96, 2, 1, 0},
        {DT_F16, DT_F16, 64, 8, 320, 96, 2, 0, 0},
        {DT_F16, DT_F16, 64, 128, 512, 128, 8, 1, 0},
        {DT_BF16, DT_BF16, 64, 64, 200, 176, 8, 1, 1},
        {DT_BF16, DT_BF16, 300, 16, 200, 176, 2, 1, 1}, /* 300 rows on one expert */
        {DT_BF16, DT_BF16, 300, 128, 256, 96, 8, 1, 0},
        {DT_F16, DT_F16, 300, 8, 256, 1104, 2, 1, 0},
        {DT_BF16, DT_BF16, 64, 128, 2048, 768, 8, 1, 0}, /* Qwen3-30B-A3B's layer */
        {DT_BF16, DT_BF16, 16, 8, 1024, 3584, 2, 1, 0},  /* Mixtral-like, smaller */
        {DT_BF16, DT_BF16, 256, 8, 1024, 3584, 2, 1, 0}, /* its batch 256: 96-row tiles */
        {DT_F16, DT_F16, 256, 8, 1024, 3584, 2, 1, 1},
    };
    /* the default kernels (wgmma on an sm_90a build's Hopper GPU), then mma.sync everywhere */
    const int count = (int)(sizeof cases / sizeof *cases);
    if (!k_cuda_wgmma_available())
        print_message("note: no wgmma kernels on this build or GPU; mma.sync twice\n");
    const int bad_default = run_cases(cases, count);
    k_cuda_moe_force_gemm(KC_MOE_GEMM_MMA);
    const int bad_mma = run_cases(cases, count);
    k_cuda_moe_force_gemm(KC_MOE_GEMM_AUTO);
    assert_int_equal(bad_default, 0);
    assert_int_equal(bad_mma, 0);
}

static void test_moe_plain_path(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(39);
    const MoeCase cases[] = {
        {DT_F32, DT_F32, 5, 4, 64, 24, 1, 0, 0},
        {DT_F32, DT_BF16, 9, 16, 128, 64, 4, 0, 0},
        {DT_F32, DT_F32, 1, 8, 64, 24, 2, 0, 0},
        {DT_F32, DT_F32, 64, 128, 256, 64, 8, 1, 0},
        {DT_BF16, DT_F32, 7, 8, 128, 48, 2, 1, 0},
        {DT_BF16, DT_BF16, 3, 8, 60, 40, 2, 1, 0}, /* H % 8 != 0 */
        {DT_F32, DT_F32, 300, 16, 64, 24, 2, 1, 1},
    };
    assert_int_equal(run_cases(cases, (int)(sizeof cases / sizeof *cases)), 0);
}

/* The op recorded in a CUDA graph through the backend's ops and replayed gives the eager
 * run's bits (no host round trip, nothing allocated inside). */
static int graph_case(const MoeCase *c) {
    const KernelOps *k = test_cuda_ops(c->act);
    MoeInputs in = make_inputs(c);
    size_t ws_bytes = k->moe_workspace_bytes(k, c->n, c->E, c->H, c->I, c->top_k);
    void *ws = k_cuda_malloc(ws_bytes), *eager = nan_out(c), *replay = nan_out(c);
    k->moe_mlp(k, eager, in.dx, &in.router.dev, &in.gu.dev, &in.dw.dev, c->n, c->top_k, c->renorm,
               ws, ws_bytes);
    k->graph_begin(k);
    k->moe_mlp(k, replay, in.dx, &in.router.dev, &in.gu.dev, &in.dw.dev, c->n, c->top_k, c->renorm,
               ws, ws_bytes);
    void *g = k->graph_end(k);
    k->graph_launch(k, g);
    k->synchronize(k);
    int bad = !same_bits(eager, replay, (size_t)c->n * c->H * pl_dtype_size(c->act));
    if (bad) {
        char what[160];
        case_name(what, sizeof what, c);
        print_error("%s: the graph's replay differs from the eager run\n", what);
    }
    k->graph_destroy(k, g);
    k_cuda_free(ws);
    k_cuda_free(eager);
    k_cuda_free(replay);
    free_inputs(&in);
    return bad;
}

static void test_moe_graph(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(40);
    const MoeCase gemv = {DT_BF16, DT_BF16, 1, 128, 512, 128, 8, 1, 0};
    const MoeCase mma = {DT_BF16, DT_BF16, 64, 16, 256, 96, 2, 1, 0};  /* 16-row tiles */
    const MoeCase wide = {DT_BF16, DT_BF16, 256, 8, 256, 96, 2, 1, 0}; /* 96-row tiles */
    int bad = graph_case(&gemv) + graph_case(&mma) + graph_case(&wide);
    k_cuda_moe_force_gemm(KC_MOE_GEMM_MMA);
    bad += graph_case(&wide);
    k_cuda_moe_force_gemm(KC_MOE_GEMM_AUTO);
    assert_int_equal(bad, 0);
}

/* Not a check: one layer's op at the Qwen3-30B-A3B and Mixtral-8x7B shapes (bf16, random
 * router and rows, constant expert weights), recorded in a graph and replayed: the mean of 20
 * replays against the floor of reading the router and the experts a batch touches (E (1 - (1 -
 * k / E)^n) expected) once at 4.23 TB/s. */
static void time_layer(int E, int H, int I, int top_k, int n, const char *label) {
    const KernelOps *k = test_cuda_ops(DT_BF16);
    const size_t expert_bytes = (size_t)3 * H * I * 2;
    Weight router = make_weight(DT_BF16, 2, E, H, -0.5f, 0.5f);
    Weight gu = {0}, dw = {0};
    gu.dev.dtype = dw.dev.dtype = DT_BF16;
    gu.dev.data = k_cuda_malloc((size_t)E * expert_bytes);
    k_cuda_memset(gu.dev.data, 0x3C, (size_t)E * expert_bytes); /* bf16 0x3C3C: 0.0115 */
    dw.dev.data = (char *)gu.dev.data + (size_t)E * 2 * I * H * 2;
    shape3(&gu, E, 2 * (int64_t)I, H);
    shape3(&dw, E, H, I);
    float *x = rand_vec((size_t)n * H, -1, 1, DT_BF16);
    void *dx = upload_as(x, (size_t)n * H, DT_BF16), *out = k_cuda_malloc((size_t)n * H * 2);
    size_t ws_bytes = k->moe_workspace_bytes(k, n, E, H, I, top_k);
    void *ws = k_cuda_malloc(ws_bytes);
    k->moe_mlp(k, out, dx, &router.dev, &gu.dev, &dw.dev, n, top_k, 1, ws, ws_bytes);
    k->graph_begin(k);
    k->moe_mlp(k, out, dx, &router.dev, &gu.dev, &dw.dev, n, top_k, 1, ws, ws_bytes);
    void *g = k->graph_end(k);
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    for (int i = 0; i < 3; i++)
        k->graph_launch(k, g);
    enum { REPLAYS = 20 };
    CUDA_CHECK(cudaEventRecord(e0, NULL));
    for (int i = 0; i < REPLAYS; i++)
        k->graph_launch(k, g);
    CUDA_CHECK(cudaEventRecord(e1, NULL));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    const double touched = E * (1 - pow(1 - (double)top_k / E, n));
    const double floor_us = (touched * expert_bytes + (double)E * H * 2) / 4.23e12 * 1e6;
    const double us = ms * 1e3 / REPLAYS;
    print_message("timing: moe E %d H %d I %d top %d, %3d rows: %8.1f us, floor %7.1f us "
                  "(%.2fx)%s\n",
                  E, H, I, top_k, n, us, floor_us, us / floor_us, label);
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    k->graph_destroy(k, g);
    k_cuda_free(ws);
    k_cuda_free(out);
    k_cuda_free(dx);
    k_cuda_free(gu.dev.data);
    free(x);
    free_weight(&router);
}

static void test_moe_timing(void **state) {
    (void)state;
    REQUIRE_GPU();
    if (quick())
        return;
    rng_seed(41);
    const int qwen_rows[] = {1, 8, 16, 64, 256};
    for (int i = 0; i < 5; i++)
        time_layer(128, 2048, 768, 8, qwen_rows[i], "");
    time_layer(8, 4096, 14336, 2, 1, "");
    time_layer(8, 4096, 14336, 2, 256, "");
    if (k_cuda_wgmma_available()) { /* the grouped GEMMs on mma.sync, for comparison */
        k_cuda_moe_force_gemm(KC_MOE_GEMM_MMA);
        time_layer(8, 4096, 14336, 2, 256, " mma.sync");
        k_cuda_moe_force_gemm(KC_MOE_GEMM_AUTO);
    }
}

#endif /* PAGELLM_HAVE_CUDA */

int main(void) {
    const struct CMUnitTest tests[] = {MOE_TESTS(UNIT)};
    RUN_CUDA_TESTS(tests);
}
