/* test_gemv_fused_cuda.c - the fused decode projections (kernels/cuda/gemv_fused.cu) against
 * the two calls they replace, bit for bit:
 *   k_cuda_matmul_qkv_rope_cache  vs  k_cuda_matmul then k_cuda_qkv_rope_cache
 *   k_cuda_matmul_silu_mul        vs  k_cuda_matmul then k_cuda_silu_mul
 * on random data from fixed seeds, for every GEMV dtype pair (BF16/BF16, F16/F16, F32/BF16,
 * F32/F16) and F32/F32, n = 1, 2 (fused) and 3, 5 (the two calls), head dims 8, 64, 128 and
 * 6 (odd pairs), grouped and plain attention, K = 64, 1024 and 36 (K % 8 != 0: no GEMV, so no
 * fusion), at every n no bias, an f32 bias with the last row padding (slot -1), and a bias in
 * the act dtype, at random non-zero positions (k rotated into the cache). The whole cache is
 * compared, untouched slots included, and q_out / out exactly. With Qwen3's q/k norms the
 * fused op must run as the two calls (the norm in the rope launch), with the same bits. The
 * qkv projection also with an fp8 KV cache (per-layer k and v scales), and with fp8 weights
 * (per-channel and per-tensor scales: fused at n = 1 by gemv_fp8.cuh's GEMV) under each
 * activation dtype. With a block boundary passed in (`pre`: residual + delta normed first; at one
 * row of fp8 weights the norm quantizes x for the GEMV) the residual, q_out and the cache must
 * equal k_cuda_add_rmsnorm's followed by the two calls.
 *
 * Which path ran is observed, not assumed: the fused kernel never writes the projection's
 * scratch (qkv / gate_up), the two calls do. So each case poisons the scratch and checks that
 * it stays poisoned exactly when the fused kernel should have taken the call (n <= 2, 16-bit
 * weights, K % 8 == 0, the GEMV path not forced off, for qkv a cache in the act dtype or fp8;
 * fp8 weights: n = 1, K % 16 == 0) and is
 * overwritten otherwise; forcing cuBLASLt (k_cuda_gemm_force) or an f32 cache under bf16
 * activations must turn the fusion off.
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

#define FUSED_TESTS(X)                                                                             \
    X(test_fused_qkv_rope_cache)                                                                   \
    X(test_fused_silu_mul)                                                                         \
    X(test_fused_fallbacks)

#ifndef PAGELLM_HAVE_CUDA

FUSED_TESTS(SKIP_TEST)

#else

typedef struct {
    DType act, wdt;
} Combo;
static const Combo combos[] = {
    {DT_BF16, DT_BF16}, {DT_F16, DT_F16}, {DT_F32, DT_BF16}, {DT_F32, DT_F16}, {DT_F32, DT_F32}};
enum { NCOMBOS = 5 };

/* Device bytes to a fresh host buffer. */
static unsigned char *fetch(const void *d, size_t bytes) {
    unsigned char *h = xmalloc(bytes);
    k_cuda_memcpy(h, d, bytes);
    return h;
}

/* Count the bytes where two device buffers differ; print the first element index. */
static int differ(const char *what, const void *a, const void *b, size_t bytes, size_t es) {
    unsigned char *ha = fetch(a, bytes), *hb = fetch(b, bytes);
    int bad = 0;
    for (size_t i = 0; i < bytes; i++)
        if (ha[i] != hb[i] && bad++ == 0)
            print_error("%s: differs first at element %zu\n", what, i / es);
    free(ha);
    free(hb);
    return bad;
}

/* Rotary frequencies for head dim D on the device (Llama 3 scaling). */
typedef struct {
    Rope rope;
    float *d_inv;
} DevRope;

static DevRope rope_dev(int D) {
    float *inv = xmalloc(sizeof(float) * (size_t)(D / 2));
    k_rope_inv_freq(inv, D, 500000.0f, 8.0f, 1.0f, 4.0f, 8192);
    DevRope r = {.rope = {.head_dim = D}, .d_inv = upload(inv, sizeof(float) * (size_t)(D / 2))};
    r.rope.inv_freq = r.d_inv;
    free(inv);
    return r;
}

/* Whether the fused kernel should take a call with these operands (the contract above). */
static int expect_fused(DType act, DType wdt, int K, int n, int forced_off) {
    if (wdt == DT_F8E4M3)
        return K % 16 == 0 && n == 1 && !forced_off;
    int w16 = wdt == DT_BF16 || wdt == DT_F16;
    return w16 && (act == wdt || act == DT_F32) && K % 8 == 0 && n >= 1 && n <= 2 && !forced_off;
}

/* A weight [N, K]: make_weight's, or for DT_F8E4M3 random e4m3 codes with per-channel
 * (channel set) or per-tensor scales on the device. */
static Weight qkv_weight(DType wdt, int N, int K, int channel) {
    if (wdt != DT_F8E4M3)
        return make_weight(wdt, 2, N, K, -0.5f, 0.5f);
    Weight w;
    memset(&w, 0, sizeof w);
    size_t n = (size_t)N * K;
    unsigned char *q = xmalloc(n);
    for (size_t i = 0; i < n; i++)
        q[i] = pl_f32_to_f8e4m3(rnd(-448, 448));
    int ns = channel ? N : 1;
    float *sc = xmalloc(sizeof(float) * (size_t)ns);
    for (int i = 0; i < ns; i++)
        sc[i] = rnd(1e-4f, 3e-3f);
    w.host.dtype = DT_F8E4M3;
    w.host.ndim = 2;
    w.host.shape[0] = N;
    w.host.shape[1] = K;
    w.host.data = q;
    w.host.fp8.kind = channel ? FP8_SCALE_CHANNEL : FP8_SCALE_TENSOR;
    w.host.fp8.input_scale = 0;
    w.dev = w.host;
    w.dev.data = upload(q, n);
    w.dev.fp8.w_scale = upload(sc, sizeof(float) * (size_t)ns);
    free(sc);
    return w;
}

static void free_qkv_weight(Weight *w) {
    if (w->dev.dtype == DT_F8E4M3)
        k_cuda_free((void *)w->dev.fp8.w_scale);
    free_weight(w);
}

/* One qkv case: dtypes, heads, K, rows, the bias dtype (DT_OTHER: none), the cache dtype,
 * whether the last row is padding (slot -1), and whether cuBLASLt is forced. */
typedef struct {
    Combo c;
    int D, nh, nkv, K, n;
    DType bias_dt, cache_dt;
    int pad_last, forced_off;
    int qk_norm; /* Qwen3's per-head q/k norms (in the weight dtype): never fused */
} QkvCase;

/* The fused op and the two calls from the same cache; 0 when q_out and the whole cache are
 * equal and the path taken is the expected one. Positions are random and non-zero, so k is
 * rotated on its way into the cache. With `pre`, x is made by a residual add + RMSNorm: by
 * k_cuda_add_rmsnorm before the two calls, by the fused op from its AddNormIn (the residuals
 * must then be equal too). */
static int qkv_case_pre(KCudaGemm *g, QkvCase q, int pre) {
    const int bs = 16, nblocks = 5, layer = 1, n = q.n, N = (q.nh + 2 * q.nkv) * q.D;
    KvLayout l = {.num_layers = 2,
                  .num_kv_heads = q.nkv,
                  .head_dim = q.D,
                  .block_size = bs,
                  .dtype = q.cache_dt};
    const float kv_scale[4] = {0.5f, 2.0f, 0.25f, 4.0f}; /* layer 1: k 0.25, v 4 */
    if (q.cache_dt == DT_F8E4M3)
        l.kv_scale = kv_scale;
    const size_t es = pl_dtype_size(q.c.act), ces = pl_dtype_size(q.cache_dt);
    const size_t cache_n = k_kv_block_elems(&l) * nblocks;
    Weight w = qkv_weight(q.c.wdt, N, q.K, q.bias_dt != DT_F32);
    Weight b = q.bias_dt != DT_OTHER ? make_weight(q.bias_dt, 1, N, 0, -1, 1) : (Weight){0};
    float *x = rand_vec((size_t)n * q.K, -1, 1, q.c.act);
    /* an fp8 cache starts as random codes (rand_vec's values are 16-bit: their bytes will do) */
    const DType init_dt = q.cache_dt == DT_F8E4M3 ? DT_BF16 : q.cache_dt;
    const size_t init_n = q.cache_dt == DT_F8E4M3 ? (cache_n + 1) / 2 : cache_n;
    float *cache = rand_vec(init_n, -1, 1, init_dt);
    int32_t pos[8];
    int64_t slots[8];
    int *perm = rnd_perm(nblocks * bs);
    for (int t = 0; t < n; t++) {
        pos[t] = 1 + rnd_int(8191);
        slots[t] = q.pad_last && t == n - 1 ? -1 : perm[t];
    }
    DevRope rope = rope_dev(q.D);
    void *dx = upload_as(x, (size_t)n * q.K, q.c.act),
         *dx_b = upload_as(x, (size_t)n * q.K, q.c.act);
    float *res = rand_vec((size_t)n * q.K, -1, 1, q.c.act);
    void *dres_a = upload_as(res, (size_t)n * q.K, q.c.act),
         *dres_b = upload_as(res, (size_t)n * q.K, q.c.act),
         *ddelta = upload_as(x, (size_t)n * q.K, q.c.act);
    Weight nw = make_weight(q.c.act == DT_F32 ? DT_F32 : DT_BF16, 1, q.K, 0, 0.5f, 1.5f);
    const AddNormIn add_norm = {dres_b, ddelta, &nw.dev, 1e-5f};
    void *cache_a = upload_as(cache, init_n, init_dt);
    void *cache_b = upload_as(cache, init_n, init_dt);
    int32_t *dpos = upload(pos, sizeof pos);
    int64_t *dslots = upload(slots, sizeof slots);
    size_t qn = (size_t)n * q.nh * q.D, qkvn = (size_t)n * N;
    void *q_a = k_cuda_malloc(qn * es), *q_b = k_cuda_malloc(qn * es);
    void *qkv_a = k_cuda_malloc(qkvn * es), *qkv_b = k_cuda_malloc(qkvn * es);
    k_cuda_memset(q_a, POISON, qn * es);
    k_cuda_memset(q_b, POISON, qn * es);
    k_cuda_memset(qkv_b, POISON, qkvn * es);
    const Tensor *bias = q.bias_dt != DT_OTHER ? &b.dev : NULL;
    Weight qw = {0}, kw = {0};
    QkNorm qk = {0};
    if (q.qk_norm) {
        qw = make_weight(q.c.wdt, 1, q.D, 0, 0.5f, 1.5f);
        kw = make_weight(q.c.wdt, 1, q.D, 0, 0.5f, 1.5f);
        qk = (QkNorm){qw.dev, kw.dev, 1e-6f};
    }
    const QkNorm *qkp = q.qk_norm ? &qk : NULL;
    if (pre)
        k_cuda_add_rmsnorm(dres_a, ddelta, dx, q.c.act, &nw.dev, n, q.K, 1e-5f, NULL);
    k_cuda_matmul(g, qkv_a, dx, q.c.act, &w.dev, bias, n, NULL);
    k_cuda_qkv_rope_cache(q_a, qkv_a, q.c.act, dpos, dslots, n, q.nh, &rope.rope, qkp, cache_a, &l,
                          layer, NULL);
    k_cuda_matmul_qkv_rope_cache(g, q_b, qkv_b, dx_b, pre ? &add_norm : NULL, q.c.act, &w.dev, bias,
                                 dpos, dslots, n, q.nh, &rope.rope, qkp, cache_b, &l, layer, NULL);
    k_cuda_synchronize();
    char what[192];
    snprintf(what, sizeof what, "qkv act %s w %s bias %s cache %s D %d nh %d nkv %d K %d n %d%s%s",
             dn(q.c.act), dn(q.c.wdt), q.bias_dt != DT_OTHER ? dn(q.bias_dt) : "-", dn(q.cache_dt),
             q.D, q.nh, q.nkv, q.K, n, q.pad_last ? " last row padding" : "",
             q.forced_off ? " (cuBLASLt forced)"
             : q.qk_norm  ? " qk_norm"
             : pre        ? " pre add+norm"
                          : "");
    int bad = differ(what, q_a, q_b, qn * es, es);
    bad += differ(what, cache_a, cache_b, cache_n * ces, ces);
    if (pre)
        bad += differ(what, dres_a, dres_b, (size_t)n * q.K * es, es);
    int fused = expect_fused(q.c.act, q.c.wdt, q.K, n, q.forced_off) &&
                (q.cache_dt == q.c.act || q.cache_dt == DT_F8E4M3) && !q.qk_norm;
    if (still_poisoned(qkv_b, qkvn * es) != fused) {
        print_error("%s: expected the %s\n", what, fused ? "fused kernel" : "two calls");
        bad++;
    }
    free_qkv_weight(&w);
    if (bias)
        free_weight(&b);
    if (q.qk_norm) {
        free_weight(&qw);
        free_weight(&kw);
    }
    free_weight(&nw);
    free(x);
    free(res);
    free(cache);
    free(perm);
    k_cuda_free(rope.d_inv);
    void *dev[] = {dx,   dx_b,   dres_a, dres_b, ddelta, cache_a, cache_b,
                   dpos, dslots, q_a,    q_b,    qkv_a,  qkv_b};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++)
        k_cuda_free(dev[i]);
    return bad;
}

static int qkv_case(KCudaGemm *g, QkvCase q) {
    return qkv_case_pre(g, q, 0);
}

static void test_fused_qkv_rope_cache(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(41);
    KCudaGemm *g = k_cuda_gemm_create(1 << 20);
    /* head dim, q heads, kv heads */
    const int heads[][3] = {{128, 8, 2}, {64, 4, 4}, {8, 2, 1}, {6, 3, 1}};
    const int ks[] = {64, 1024, 36}, ns[] = {1, 2, 3, 5};
    int bad = 0, cases = 0;
    for (int ci = 0; ci < NCOMBOS; ci++)
        for (int hi = 0; hi < 4; hi++)
            for (int ki = 0; ki < 3; ki++)
                for (int ni = 0; ni < 4; ni++)
                    for (int bi = 0; bi < 3; bi++, cases++) {
                        Combo c = combos[ci];
                        /* no bias, an f32 bias (and the last row padding), one in the act
                         * dtype */
                        DType bdt = bi == 1 ? DT_F32 : bi == 2 ? c.act : DT_OTHER;
                        QkvCase q = {c,      heads[hi][0], heads[hi][1], heads[hi][2], ks[ki],
                                     ns[ni], bdt,          c.act,        bi == 1,      0,
                                     0};
                        bad += qkv_case(g, q);
                    }
    /* an fp8 cache, and fp8 weights (every activation dtype, per-channel scales, per-tensor
     * with the f32 bias) into either cache */
    const Combo f8[] = {{DT_BF16, DT_F8E4M3}, {DT_F16, DT_F8E4M3}, {DT_F32, DT_F8E4M3}};
    for (int ci = 0; ci < NCOMBOS + 3; ci++)
        for (int hi = 0; hi < 4; hi++)
            for (int ki = 0; ki < 3; ki++)
                for (int ni = 0; ni < 3; ni++)
                    for (int bi = 0; bi < 2; bi++) {
                        Combo c = ci < NCOMBOS ? combos[ci] : f8[ci - NCOMBOS];
                        for (int fc = c.wdt != DT_F8E4M3; fc < 2; fc++, cases++) {
                            QkvCase q = {c,
                                         heads[hi][0],
                                         heads[hi][1],
                                         heads[hi][2],
                                         ks[ki],
                                         ns[ni],
                                         bi ? DT_F32 : DT_OTHER,
                                         fc ? DT_F8E4M3 : c.act,
                                         bi,
                                         0,
                                         0};
                            bad += qkv_case(g, q);
                        }
                    }
    /* with q/k norms the decode-sized call runs as the two calls, the norm in the rope launch */
    for (int ci = 0; ci < NCOMBOS; ci++)
        for (int ni = 0; ni < 3; ni++, cases++) {
            QkvCase q = {combos[ci], 128, 4, 2, 1024, ns[ni], DT_OTHER, combos[ci].act, 0, 0, 1};
            bad += qkv_case(g, q);
        }
    /* the block boundary passed in: at one row of fp8 weights its norm quantizes x for the GEMV
     * (with the f32 bias and the last row padding into an fp8 cache, or plain into an act one) */
    const Combo pres[] = {combos[0], f8[0], f8[1], f8[2]};
    for (int ci = 0; ci < 4; ci++)
        for (int ki = 0; ki < 2; ki++)
            for (int ni = 0; ni < 3; ni++)
                for (int fc = 0; fc < 2; fc++, cases++) {
                    const Combo c = pres[ci];
                    const DType bdt = fc ? DT_F32 : DT_OTHER, cdt = fc ? DT_F8E4M3 : c.act;
                    QkvCase q = {c, 128, 8, 2, ks[ki], ns[ni], bdt, cdt, fc, 0, 0};
                    bad += qkv_case_pre(g, q, 1);
                }
    print_message("fused qkv: %d cases, %d differing\n", cases, bad);
    k_cuda_gemm_destroy(g);
    assert_int_equal(bad, 0);
}

/* One gate-up case: out from the fused op and from the two calls. */
static int silu_case(KCudaGemm *g, Combo c, int dim, int K, int n, int forced_off) {
    const size_t es = pl_dtype_size(c.act);
    Weight w = make_weight(c.wdt, 2, 2 * dim, K, -0.5f, 0.5f);
    float *x = rand_vec((size_t)n * K, -1, 1, c.act);
    void *dx = upload_as(x, (size_t)n * K, c.act);
    size_t on = (size_t)n * dim, gn = 2 * on;
    void *out_a = k_cuda_malloc(on * es), *out_b = k_cuda_malloc(on * es);
    void *gu_a = k_cuda_malloc(gn * es), *gu_b = k_cuda_malloc(gn * es);
    k_cuda_memset(out_a, POISON, on * es);
    k_cuda_memset(out_b, POISON, on * es);
    k_cuda_memset(gu_b, POISON, gn * es);
    k_cuda_matmul(g, gu_a, dx, c.act, &w.dev, NULL, n, NULL);
    k_cuda_silu_mul(out_a, gu_a, c.act, n, dim, NULL);
    k_cuda_matmul_silu_mul(g, out_b, gu_b, dx, c.act, &w.dev, n, NULL);
    k_cuda_synchronize();
    char what[128];
    snprintf(what, sizeof what, "silu act %s w %s dim %d K %d n %d%s", dn(c.act), dn(c.wdt), dim, K,
             n, forced_off ? " (cuBLASLt forced)" : "");
    int bad = differ(what, out_a, out_b, on * es, es);
    int fused = expect_fused(c.act, c.wdt, K, n, forced_off);
    if (still_poisoned(gu_b, gn * es) != fused) {
        print_error("%s: expected the %s\n", what, fused ? "fused kernel" : "two calls");
        bad++;
    }
    free_weight(&w);
    free(x);
    void *dev[] = {dx, out_a, out_b, gu_a, gu_b};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++)
        k_cuda_free(dev[i]);
    return bad;
}

static void test_fused_silu_mul(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(42);
    KCudaGemm *g = k_cuda_gemm_create(1 << 20);
    /* beyond the GEMV the pair is compared with itself: the own GEMM's sums differ in order
     * (test_gemm_sm90a_cuda checks it) */
    k_cuda_gemm_force_silu_mul(g, KC_SILU_MUL_PAIR);
    const int dims[] = {1, 7, 172, 1408}, ks[] = {64, 1024, 36}, ns[] = {1, 2, 3, 5};
    int bad = 0, cases = 0;
    for (int ci = 0; ci < NCOMBOS; ci++)
        for (int di = 0; di < 4; di++)
            for (int ki = 0; ki < 3; ki++)
                for (int ni = 0; ni < 4; ni++, cases++)
                    bad += silu_case(g, combos[ci], dims[di], ks[ki], ns[ni], 0);
    print_message("fused silu: %d cases, %d differing\n", cases, bad);
    k_cuda_gemm_destroy(g);
    assert_int_equal(bad, 0);
}

/* The two calls where the fused kernel must not run: cuBLASLt forced, and (qkv) a cache in
 * another dtype than the activations. */
static void test_fused_fallbacks(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(43);
    KCudaGemm *g = k_cuda_gemm_create(1 << 20);
    int bad = 0;
    for (int n = 1; n <= 2; n++) {
        QkvCase q = {combos[0], 128, 8, 2, 512, n, DT_OTHER, DT_F32, 0, 0, 0};
        bad += qkv_case(g, q); /* bf16 activations, f32 cache */
    }
    k_cuda_gemm_force(g, KC_GEMM_CUBLASLT, 0);
    for (int n = 1; n <= 2; n++) {
        QkvCase q = {combos[0], 128, 8, 2, 512, n, DT_OTHER, combos[0].act, 0, 1, 0};
        bad += qkv_case(g, q);
        bad += silu_case(g, combos[0], 172, 512, n, 1);
    }
    k_cuda_gemm_destroy(g);
    assert_int_equal(bad, 0);
}

#endif /* PAGELLM_HAVE_CUDA */

int main(void) {
    const struct CMUnitTest tests[] = {FUSED_TESTS(UNIT)};
    RUN_CUDA_TESTS(tests);
}
