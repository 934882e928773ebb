/* test_kernels_cpu.c - the CPU ops against naive references written here (double precision
 * where cheap), on random data from a fixed seed, sweeping head dims, GQA ratios, block
 * sizes and weight dtypes. Mismatches print the first few indices with got / want. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../kernels/cpu/cpu_internal.h"
#include "kernels.h"
#include "backend_test_util.h"

/* ---------------- helpers ---------------- */

static uint64_t rng_state;

static void rng_seed(uint64_t s) {
    rng_state = s;
}

static uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in [lo, hi) */
static float rnd(float lo, float hi) {
    return lo + (hi - lo) * (float)((rng_next() >> 40) * (1.0 / 16777216.0));
}

static int rnd_int(int n) {
    return (int)(rng_next() % (uint64_t)n);
}

static void fill(float *x, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++)
        x[i] = rnd(lo, hi);
}

/* Count elements outside |got - want| <= atol + rtol |want| (tol_scale[i] * atol when a
 * per-element scale is given); print the first few. */
static int report(const char *what, const float *got, const double *want, const double *scale,
                  size_t n, double atol, double rtol) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        double a = scale ? atol * scale[i] : atol;
        double err = fabs((double)got[i] - want[i]);
        if (!(err <= a + rtol * fabs(want[i]))) {
            if (bad < 5)
                print_error("%s: mismatch at %zu: got %.9g want %.9g (err %.3g)\n", what, i,
                            (double)got[i], want[i], err);
            bad++;
        }
    }
    if (bad)
        print_error("%s: %d of %zu elements differ\n", what, bad, n);
    return bad;
}

/* A weight tensor in `dt` with its values as the reference sees them (rounded to dt). */
typedef struct {
    Tensor t;
    float *ref;
} Weight;

static Weight make_weight(DType dt, int ndim, int64_t d0, int64_t d1, float lo, float hi) {
    size_t n = (size_t)d0 * (size_t)(ndim == 2 ? d1 : 1);
    Weight w;
    memset(&w, 0, sizeof w);
    w.t.dtype = dt;
    w.t.ndim = ndim;
    w.t.shape[0] = d0;
    w.t.shape[1] = ndim == 2 ? d1 : 0;
    w.t.data = malloc(n * pl_dtype_size(dt) + 1);
    w.ref = malloc(n * sizeof(float) + 1);
    for (size_t i = 0; i < n; i++) {
        float v = rnd(lo, hi);
        if (dt == DT_F32) {
            ((float *)w.t.data)[i] = v;
        } else if (dt == DT_F16) {
            ((uint16_t *)w.t.data)[i] = pl_f32_to_f16(v);
            v = pl_f16_to_f32(((uint16_t *)w.t.data)[i]);
        } else {
            ((uint16_t *)w.t.data)[i] = pl_f32_to_bf16(v);
            v = pl_bf16_to_f32(((uint16_t *)w.t.data)[i]);
        }
        w.ref[i] = v;
    }
    return w;
}

static void free_weight(Weight *w) {
    free(w->t.data);
    free(w->ref);
}

static const DType dtypes[] = {DT_F32, DT_F16, DT_BF16};

/* ---------------- embedding ---------------- */

static void test_embedding(void **state) {
    (void)state;
    const KernelOps *ops = test_cpu_ops();
    rng_seed(1);
    const int hiddens[] = {8, 64, 100};
    for (int di = 0; di < 3; di++) {
        for (int hi = 0; hi < 3; hi++) {
            int V = 50, H = hiddens[hi], n = 7;
            Weight tab = make_weight(dtypes[di], 2, V, H, -2, 2);
            int32_t ids[7] = {0, 49, 3, 3, 17, 25, 48};
            float *out = malloc(sizeof(float) * n * H);
            ops->embedding(ops, out, ids, n, &tab.t);
            for (int i = 0; i < n; i++)
                for (int d = 0; d < H; d++)
                    assert_true(out[i * H + d] == tab.ref[(size_t)ids[i] * H + d]);
            free(out);
            free_weight(&tab);
        }
    }
}

/* ---------------- rmsnorm ---------------- */

static void ref_rmsnorm(double *out, const float *x, const float *w, int n, int dim, float eps) {
    for (int r = 0; r < n; r++) {
        double ss = 0;
        for (int i = 0; i < dim; i++)
            ss += (double)x[r * dim + i] * x[r * dim + i];
        double inv = 1.0 / sqrt(ss / dim + eps);
        for (int i = 0; i < dim; i++)
            out[r * dim + i] = (double)w[i] * x[r * dim + i] * inv;
    }
}

static void test_rmsnorm(void **state) {
    (void)state;
    const KernelOps *ops = test_cpu_ops();
    rng_seed(2);
    const int dims[] = {8, 64, 128, 100, 4096};
    for (int di = 0; di < 3; di++) {
        for (int k = 0; k < 5; k++) {
            int dim = dims[k], n = 3;
            float eps = k % 2 ? 1e-6f : 1e-5f;
            Weight w = make_weight(dtypes[di], 1, dim, 0, 0.5f, 1.5f);
            float *x = malloc(sizeof(float) * n * dim), *out = malloc(sizeof(float) * n * dim);
            double *want = malloc(sizeof(double) * n * dim);
            fill(x, (size_t)n * dim, -3, 3);
            x[0] = 0; /* includes an exact zero */
            ops->rmsnorm(ops, out, x, &w.t, n, dim, eps);
            ref_rmsnorm(want, x, w.ref, n, dim, eps);
            char what[64];
            snprintf(what, sizeof what, "rmsnorm %s dim %d", pl_dtype_name(dtypes[di]), dim);
            assert_int_equal(report(what, out, want, NULL, (size_t)n * dim, 1e-6, 2e-6), 0);
            free(x);
            free(out);
            free(want);
            free_weight(&w);
        }
    }
}

static void test_add_rmsnorm(void **state) {
    (void)state;
    const KernelOps *ops = test_cpu_ops();
    rng_seed(3);
    for (int di = 0; di < 3; di++) {
        for (int with_delta = 0; with_delta < 2; with_delta++) {
            int dim = 96, n = 5;
            Weight w = make_weight(dtypes[di], 1, dim, 0, 0.5f, 1.5f);
            size_t sz = (size_t)n * dim;
            float *res = malloc(sizeof(float) * sz), *delta = malloc(sizeof(float) * sz);
            float *sum = malloc(sizeof(float) * sz), *out = malloc(sizeof(float) * sz);
            double *want = malloc(sizeof(double) * sz);
            fill(res, sz, -2, 2);
            fill(delta, sz, -1, 1);
            for (size_t i = 0; i < sz; i++)
                sum[i] = with_delta ? res[i] + delta[i] : res[i];
            ops->add_rmsnorm(ops, res, with_delta ? delta : NULL, out, &w.t, n, dim, 1e-5f);
            for (size_t i = 0; i < sz; i++)
                assert_true(res[i] == sum[i]); /* the residual stream is updated exactly */
            ref_rmsnorm(want, sum, w.ref, n, dim, 1e-5f);
            assert_int_equal(report("add_rmsnorm", out, want, NULL, sz, 1e-6, 2e-6), 0);
            free(res);
            free(delta);
            free(sum);
            free(out);
            free(want);
            free_weight(&w);
        }
    }
}

/* ---------------- matmul ---------------- */

static int check_matmul(int n, int N, int K, DType wdt, int bias_mode, int simd) {
    const KernelOps *ops = test_cpu_ops();
    Weight w = make_weight(wdt, 2, N, K, -1, 1);
    Weight b = make_weight(bias_mode == 2 ? DT_BF16 : DT_F32, 1, N, 0, -1, 1);
    float *x = malloc(sizeof(float) * (size_t)n * K + 1);
    float *out = malloc(sizeof(float) * (size_t)n * N);
    double *want = malloc(sizeof(double) * (size_t)n * N);
    double *mag = malloc(sizeof(double) * (size_t)n * N);
    fill(x, (size_t)n * K, -1, 1);
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < N; j++) {
            double s = 0, m = 0;
            for (int k = 0; k < K; k++) {
                double p = (double)x[(size_t)i * K + k] * w.ref[(size_t)j * K + k];
                s += p;
                m += fabs(p);
            }
            if (bias_mode) {
                s += b.ref[j];
                m += fabs(b.ref[j]);
            }
            want[(size_t)i * N + j] = s;
            mag[(size_t)i * N + j] = m + 1.0;
        }
    }
    int prev = cpu_set_simd(simd);
    ops->matmul(ops, out, x, &w.t, bias_mode ? &b.t : NULL, n);
    cpu_set_simd(prev);
    char what[128];
    snprintf(what, sizeof what, "matmul n=%d N=%d K=%d %s bias=%d simd=%d", n, N, K,
             pl_dtype_name(wdt), bias_mode, simd);
    /* fp32 accumulation: error bounded relative to sum |x w| */
    int bad = report(what, out, want, mag, (size_t)n * N, 2e-6, 0);
    free(x);
    free(out);
    free(want);
    free(mag);
    free_weight(&w);
    free_weight(&b);
    return bad;
}

static void test_matmul(void **state) {
    (void)state;
    rng_seed(4);
    const int ns[] = {1, 2, 3, 5, 17};
    const int Ns[] = {1, 3, 4, 7, 33};
    const int Ks[] = {1, 7, 8, 9, 64, 100, 129};
    int bad = 0;
    for (int simd = 0; simd < 2; simd++)
        for (int di = 0; di < 3; di++)
            for (int a = 0; a < 5; a++)
                for (int c = 0; c < 5; c++)
                    for (int k = 0; k < 7; k++)
                        bad += check_matmul(ns[a], Ns[c], Ks[k], dtypes[di], (a + c + k) % 3, simd);
    assert_int_equal(bad, 0);
}

static void test_matmul_large(void **state) {
    (void)state;
    rng_seed(5);
    int bad = 0;
    for (int simd = 0; simd < 2; simd++)
        for (int di = 0; di < 3; di++) {
            bad += check_matmul(64, 256, 1024, dtypes[di], 1, simd); /* threaded, tiled */
            bad += check_matmul(3, 130, 4100, dtypes[di], 0, simd);  /* tile of 14 rows */
            bad += check_matmul(1, 1027, 512, dtypes[di], 2, simd);
        }
    assert_int_equal(bad, 0);
}

/* A row's result must not depend on the batch it is computed in (bit for bit). */
static void test_matmul_batch_invariant(void **state) {
    (void)state;
    const KernelOps *ops = test_cpu_ops();
    rng_seed(6);
    for (int di = 0; di < 3; di++) {
        int n = 37, N = 203, K = 777;
        Weight w = make_weight(dtypes[di], 2, N, K, -1, 1);
        Weight b = make_weight(DT_F32, 1, N, 0, -1, 1);
        float *x = malloc(sizeof(float) * n * K), *out = malloc(sizeof(float) * n * N);
        float *one = malloc(sizeof(float) * N);
        fill(x, (size_t)n * K, -1, 1);
        ops->matmul(ops, out, x, &w.t, &b.t, n);
        for (int i = 0; i < n; i += 6) {
            ops->matmul(ops, one, x + (size_t)i * K, &w.t, &b.t, 1);
            assert_memory_equal(one, out + (size_t)i * N, sizeof(float) * N);
        }
        /* the same row at an odd position of a 3-row batch */
        ops->matmul(ops, out, x + (size_t)10 * K, &w.t, &b.t, 3);
        ops->matmul(ops, one, x + (size_t)11 * K, &w.t, &b.t, 1);
        assert_memory_equal(one, out + N, sizeof(float) * N);
        free(x);
        free(out);
        free(one);
        free_weight(&w);
        free_weight(&b);
    }
}

/* Several threads calling ops at once (the pool runs one region at a time; the others run
 * alone): every caller still gets the single-caller result bit for bit. */
typedef struct {
    const float *x;
    const Tensor *w;
    const float *want;
    int n, N, reps, ok;
} ConcurrentMatmul;

static void *concurrent_matmul_main(void *arg) {
    ConcurrentMatmul *c = arg;
    float *out = malloc(sizeof(float) * c->n * c->N);
    c->ok = 1;
    for (int r = 0; r < c->reps; r++) {
        test_cpu_ops()->matmul(test_cpu_ops(), out, c->x, c->w, NULL, c->n);
        if (memcmp(out, c->want, sizeof(float) * c->n * c->N) != 0)
            c->ok = 0;
    }
    free(out);
    return NULL;
}

static void test_matmul_concurrent_callers(void **state) {
    (void)state;
    rng_seed(12);
    int n = 9, N = 300, K = 512;
    Weight w = make_weight(DT_BF16, 2, N, K, -1, 1);
    float *x = malloc(sizeof(float) * n * K), *want = malloc(sizeof(float) * n * N);
    fill(x, (size_t)n * K, -1, 1);
    test_cpu_ops()->matmul(test_cpu_ops(), want, x, &w.t, NULL, n);
    enum { T = 3 };
    pthread_t th[T];
    ConcurrentMatmul c[T];
    for (int t = 0; t < T; t++) {
        c[t] = (ConcurrentMatmul){x, &w.t, want, n, N, 40, 0};
        assert_int_equal(pthread_create(&th[t], NULL, concurrent_matmul_main, &c[t]), 0);
    }
    for (int t = 0; t < T; t++) {
        pthread_join(th[t], NULL);
        assert_true(c[t].ok);
    }
    free(x);
    free(want);
    free_weight(&w);
}

/* ---------------- rope ---------------- */

static void test_rope(void **state) {
    (void)state;
    const KernelOps *ops = test_cpu_ops();
    rng_seed(7);
    const int Ds[] = {8, 64, 128};
    const int ratios[] = {1, 2, 4};
    for (int di = 0; di < 3; di++) {
        for (int gi = 0; gi < 3; gi++) {
            int D = Ds[di], nkv = 2, nh = nkv * ratios[gi], n = 6;
            int32_t pos[6] = {0, 1, 7, 100, 4095, 131071};
            float inv[64];
            k_rope_inv_freq(inv, D, 10000.0f, 0, 0, 0, 0);
            Rope rope = {.head_dim = D, .inv_freq = inv};
            size_t qn = (size_t)n * nh * D, kn = (size_t)n * nkv * D;
            float *q = malloc(sizeof(float) * qn), *k = malloc(sizeof(float) * kn);
            float *q0 = malloc(sizeof(float) * qn), *k0 = malloc(sizeof(float) * kn);
            double *wq = malloc(sizeof(double) * qn), *wk = malloc(sizeof(double) * kn);
            fill(q0, qn, -2, 2);
            fill(k0, kn, -2, 2);
            memcpy(q, q0, sizeof(float) * qn);
            memcpy(k, k0, sizeof(float) * kn);
            for (int pass = 0; pass < 2; pass++) {
                const float *src = pass ? k0 : q0;
                double *dst = pass ? wk : wq;
                int heads = pass ? nkv : nh;
                for (int t = 0; t < n; t++)
                    for (int h = 0; h < heads; h++)
                        for (int i = 0; i < D / 2; i++) {
                            size_t o = ((size_t)t * heads + h) * D;
                            double ang = (double)((float)pos[t] * inv[i]);
                            double x1 = src[o + i], x2 = src[o + i + D / 2];
                            dst[o + i] = x1 * cos(ang) - x2 * sin(ang);
                            dst[o + i + D / 2] = x2 * cos(ang) + x1 * sin(ang);
                        }
            }
            ops->rope(ops, q, k, pos, n, nh, nkv, &rope);
            char what[64];
            snprintf(what, sizeof what, "rope q D=%d nh=%d", D, nh);
            assert_int_equal(report(what, q, wq, NULL, qn, 2e-6, 2e-6), 0);
            snprintf(what, sizeof what, "rope k D=%d nkv=%d", D, nkv);
            assert_int_equal(report(what, k, wk, NULL, kn, 2e-6, 2e-6), 0);
            free(q);
            free(k);
            free(q0);
            free(k0);
            free(wq);
            free(wk);
        }
    }
}

static void test_rope_inv_freq_default(void **state) {
    (void)state;
    float inv[64];
    k_rope_inv_freq(inv, 128, 10000.0f, 0, 0, 0, 0);
    for (int i = 0; i < 64; i++) {
        double want = 1.0 / pow(10000.0, 2.0 * i / 128.0);
        assert_true(fabs(inv[i] - want) <= 1e-6 * want);
    }
    k_rope_inv_freq(inv, 8, 1e6f, 0, 0, 0, 0);
    assert_true(inv[0] == 1.0f);
    assert_true(fabs(inv[3] - 1.0 / pow(1e6, 6.0 / 8.0)) <= 1e-6 * inv[3]);
}

/* Llama 3.1 scaling (factor 8, low 1, high 4, original context 8192, theta 500000, D 128),
 * values computed by hand in double from transformers' _compute_llama3_parameters:
 * wavelen < 2048 keeps the frequency, wavelen > 8192 divides it by 8, in between it is
 * interpolated. */
static void test_rope_inv_freq_llama3(void **state) {
    (void)state;
    float inv[64];
    k_rope_inv_freq(inv, 128, 500000.0f, 8.0f, 1.0f, 4.0f, 8192);
    static const struct {
        int i;
        double want;
    } cases[] = {
        {0, 1.0},                     /* high frequency: unchanged */
        {20, 0.016560440080994446},   /* high frequency (wavelen 379): unchanged */
        {29, 0.002166570763503359},   /* medium band (wavelen 2402): smoothed */
        {31, 0.0008567514129196321},  /* medium band (wavelen 3619) */
        {34, 0.00017850781276799638}, /* medium band (wavelen 6695) */
        {35, 9.556212353964683e-05},  /* low frequency (wavelen 8219): / 8 */
        {40, 3.428102195952591e-05},  /* low frequency */
        {63, 3.068925988914511e-07},  /* low frequency */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        double got = inv[cases[c].i], want = cases[c].want;
        if (!(fabs(got - want) <= 1e-6 * want))
            print_error("llama3 inv_freq[%d]: got %.9g want %.9g\n", cases[c].i, got, want);
        assert_true(fabs(got - want) <= 1e-6 * want);
    }
    /* no scaling leaves the unscaled values */
    float plain[64];
    k_rope_inv_freq(plain, 128, 500000.0f, 0, 1, 4, 8192);
    assert_true(plain[20] == inv[20]);
    assert_true(fabs(plain[40] / 8.0f - inv[40]) <= 1e-6 * inv[40]);
}

/* ---------------- silu_mul ---------------- */

static void test_silu_mul(void **state) {
    (void)state;
    const KernelOps *ops = test_cpu_ops();
    rng_seed(8);
    int n = 3, dim = 77;
    size_t sz = (size_t)n * dim;
    float *g = malloc(sizeof(float) * sz), *u = malloc(sizeof(float) * sz);
    float *out = malloc(sizeof(float) * sz);
    double *want = malloc(sizeof(double) * sz);
    fill(g, sz, -12, 12);
    fill(u, sz, -3, 3);
    g[0] = 0.0f;
    g[1] = -90.0f; /* exp overflow side: silu -> -0 */
    g[2] = 90.0f;
    for (size_t i = 0; i < sz; i++)
        want[i] = (double)g[i] / (1.0 + exp(-(double)g[i])) * u[i];
    float *gate_up = malloc(sizeof(float) * 2 * sz); /* rows: gate half, then up half */
    for (int r = 0; r < n; r++) {
        memcpy(gate_up + (size_t)r * 2 * dim, g + (size_t)r * dim, sizeof(float) * dim);
        memcpy(gate_up + (size_t)r * 2 * dim + dim, u + (size_t)r * dim, sizeof(float) * dim);
    }
    ops->silu_mul(ops, out, gate_up, n, dim);
    assert_int_equal(report("silu_mul", out, want, NULL, sz, 1e-6, 2e-6), 0);
    free(gate_up);
    free(g);
    free(u);
    free(out);
    free(want);
}

/* ---------------- KV cache and paged attention ---------------- */

static size_t kv_offset(const KvLayout *l, int64_t slot, int layer, int is_v, int h, int d) {
    size_t half = (size_t)l->block_size * l->num_kv_heads * l->head_dim;
    size_t block = (size_t)l->num_layers * 2 * half;
    return (size_t)(slot / l->block_size) * block + (size_t)layer * 2 * half + (is_v ? half : 0) +
           (size_t)(slot % l->block_size) * l->num_kv_heads * l->head_dim +
           (size_t)h * l->head_dim + d;
}

static void test_kv_geometry(void **state) {
    (void)state;
    KvLayout l = {
        .num_layers = 3, .num_kv_heads = 2, .head_dim = 64, .block_size = 16, .dtype = DT_F32};
    assert_int_equal(k_kv_half_elems(&l), 16 * 2 * 64);
    assert_int_equal(k_kv_block_elems(&l), 3 * 2 * 16 * 2 * 64);
}

static void test_kv_write(void **state) {
    (void)state;
    const KernelOps *ops = test_cpu_ops();
    rng_seed(9);
    KvLayout l = {
        .num_layers = 3, .num_kv_heads = 2, .head_dim = 8, .block_size = 4, .dtype = DT_F32};
    int num_blocks = 5, n = 6, row = 16;
    size_t total = (size_t)num_blocks * k_kv_block_elems(&l);
    float *cache = malloc(sizeof(float) * total);
    for (size_t i = 0; i < total; i++)
        cache[i] = -777.0f;
    float k[6 * 16], v[6 * 16];
    fill(k, sizeof k / sizeof k[0], -1, 1);
    fill(v, sizeof v / sizeof v[0], -1, 1);
    int64_t slots[6] = {13, -1, 0, 19, -1, 6};
    ops->kv_write(ops, cache, &l, 1, k, v, slots, n);
    size_t written = 0;
    for (size_t i = 0; i < total; i++)
        written += cache[i] != -777.0f;
    assert_int_equal(written, 4 * 2 * row); /* the two padding rows wrote nothing */
    for (int t = 0; t < n; t++) {
        if (slots[t] < 0)
            continue;
        for (int h = 0; h < 2; h++)
            for (int d = 0; d < 8; d++) {
                assert_true(cache[kv_offset(&l, slots[t], 1, 0, h, d)] == k[t * row + h * 8 + d]);
                assert_true(cache[kv_offset(&l, slots[t], 1, 1, h, d)] == v[t * row + h * 8 + d]);
            }
    }
    free(cache);
}

/* ---- fp8 KV cache: an e4m3 reference of its own (every finite code's value in double, the
 * nearest taken, ties to the even code, beyond 448 saturated) ---- */

static double ref_e4m3_value(int code) { /* code 0..126: non-negative finite values */
    int e = code >> 3, m = code & 7;
    return e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
}

static uint8_t ref_e4m3_encode(float x) {
    double a = fabs((double)x);
    int best = 0;
    for (int c = 1; c <= 126; c++) {
        double dc = fabs(ref_e4m3_value(c) - a), db = fabs(ref_e4m3_value(best) - a);
        if (dc < db || (dc == db && (c & 1) == 0))
            best = c;
    }
    return (uint8_t)((signbit(x) ? 0x80 : 0) | best);
}

static double ref_e4m3_decode(uint8_t q) {
    double v = ref_e4m3_value(q & 0x7f);
    return q & 0x80 ? -v : v;
}

/* What an fp8 cache with scale s reads back for x: dec(e4m3(x * (1 / s))) * s as a float. */
static float ref_kv_fp8(float x, float s) {
    return (float)(ref_e4m3_decode(ref_e4m3_encode(x * (1.0f / s))) * s);
}

/* kv_write into an fp8 cache: each stored byte is the reference's code of x / s (scales != 1,
 * values beyond 448 s saturating), padding rows and the other layers untouched. */
static void test_kv_write_fp8(void **state) {
    (void)state;
    const KernelOps *ops = test_cpu_ops();
    rng_seed(19);
    const float scales[6] = {1.0f, 1.0f, 0.015625f, 2.5f, 0.0023f, 1.0f}; /* [2 layer + v] */
    KvLayout l = {.num_layers = 3,
                  .num_kv_heads = 2,
                  .head_dim = 8,
                  .block_size = 4,
                  .dtype = DT_F8E4M3,
                  .kv_scale = scales};
    int num_blocks = 5, n = 6, row = 16;
    size_t total = (size_t)num_blocks * k_kv_block_elems(&l);
    uint8_t *cache = malloc(total);
    memset(cache, 0x5a, total);
    float k[6 * 16], v[6 * 16];
    fill(k, sizeof k / sizeof k[0], -8, 8);
    fill(v, sizeof v / sizeof v[0], -1.5f, 1.5f); /* / 0.0023: some beyond 448 */
    k[3] = 1e30f;                                 /* saturates to +448 */
    k[4] = -INFINITY;                             /* saturates to -448 */
    v[5] = 0.0f;
    v[6] = 1e-9f; /* underflows to zero */
    int64_t slots[6] = {13, -1, 0, 19, -1, 6};
    ops->kv_write(ops, cache, &l, 1, k, v, slots, n);
    size_t written = 0;
    for (size_t i = 0; i < total; i++)
        written += cache[i] != 0x5a;
    assert_true(written <= 4 * 2 * (size_t)row); /* the padding rows wrote nothing */
    int saturated = 0;
    for (int t = 0; t < n; t++) {
        if (slots[t] < 0)
            continue;
        for (int h = 0; h < 2; h++)
            for (int d = 0; d < 8; d++) {
                int i = t * row + h * 8 + d;
                uint8_t qk = cache[kv_offset(&l, slots[t], 1, 0, h, d)];
                uint8_t qv = cache[kv_offset(&l, slots[t], 1, 1, h, d)];
                assert_int_equal(qk, ref_e4m3_encode(k[i] * (1.0f / scales[2])));
                assert_int_equal(qv, ref_e4m3_encode(v[i] * (1.0f / scales[3])));
                saturated += (qk & 0x7f) == 0x7e;
            }
    }
    assert_int_equal(cache[kv_offset(&l, 13, 1, 0, 0, 3)], 0x7e);
    assert_int_equal(cache[kv_offset(&l, 13, 1, 0, 0, 4)], 0xfe);
    assert_int_equal(cache[kv_offset(&l, 13, 1, 1, 0, 6)] & 0x7f, 0);
    /* layer 2's V scale: |v| / 0.0023 passes 448 for |v| > 1.03 */
    ops->kv_write(ops, cache, &l, 2, v, v, slots, n);
    for (int t = 0; t < n; t++)
        for (int j = 0; j < row && slots[t] >= 0; j++) {
            uint8_t q = cache[kv_offset(&l, slots[t], 2, 1, j / 8, j % 8)];
            assert_int_equal(q, ref_e4m3_encode(v[t * row + j] * (1.0f / scales[5])));
            saturated += (q & 0x7f) == 0x7e;
        }
    assert_true(saturated >= 4);
    /* the encoder agrees with the reference on every float near each code and midpoint */
    for (int c = 0; c <= 126; c++) {
        double x = ref_e4m3_value(c), nx = c < 126 ? ref_e4m3_value(c + 1) : 464.0;
        float probe[5] = {(float)x, (float)((x + nx) / 2), nextafterf((float)((x + nx) / 2), 0),
                          nextafterf((float)((x + nx) / 2), 1e9f), -(float)((x + nx) / 2)};
        for (int i = 0; i < 5; i++)
            assert_int_equal(pl_f32_to_f8e4m3(probe[i]), ref_e4m3_encode(probe[i]));
    }
    free(cache);
}

/* The fused op on qkv rows gives exactly rope on separate q, k and then kv_write. */
static void qkv_rope_cache_case(DType cache_dt) {
    const KernelOps *ops = test_cpu_ops();
    rng_seed(10);
    enum { N = 5, NH = 4, NKV = 2, D = 16, QD = NH * D, KVD = NKV * D, ROW = QD + 2 * KVD };
    const float scales[4] = {0.5f, 2.0f, 0.01f, 0.003f};
    KvLayout l = {.num_layers = 2,
                  .num_kv_heads = NKV,
                  .head_dim = D,
                  .block_size = 8,
                  .dtype = cache_dt,
                  .kv_scale = cache_dt == DT_F8E4M3 ? scales : NULL};
    size_t total = 3 * k_kv_block_elems(&l) * pl_dtype_size(cache_dt);
    char *fused_cache = calloc(total, 1), *ref_cache = calloc(total, 1);
    float qkv[N * ROW], q[N * QD], k[N * KVD], v[N * KVD], q_out[N * QD];
    fill(qkv, N * ROW, -2, 2);
    for (int t = 0; t < N; t++) {
        memcpy(q + t * QD, qkv + t * ROW, sizeof(float) * QD);
        memcpy(k + t * KVD, qkv + t * ROW + QD, sizeof(float) * KVD);
        memcpy(v + t * KVD, qkv + t * ROW + QD + KVD, sizeof(float) * KVD);
    }
    float inv[D / 2];
    k_rope_inv_freq(inv, D, 10000.0f, 0, 0, 0, 0);
    Rope rope = {.head_dim = D, .inv_freq = inv};
    int32_t pos[N] = {0, 3, 9, 17, 22};
    int64_t slots[N] = {8, -1, 2, 23, 16};
    ops->rope(ops, q, k, pos, N, NH, NKV, &rope);
    ops->kv_write(ops, ref_cache, &l, 1, k, v, slots, N);
    ops->qkv_rope_cache(ops, q_out, qkv, pos, slots, N, NH, &rope, NULL, fused_cache, &l, 1);
    assert_memory_equal(q_out, q, sizeof q);
    assert_memory_equal(fused_cache, ref_cache, total);
    for (int t = 0; t < N; t++) /* k is left rotated in place, v untouched */
        assert_memory_equal(qkv + t * ROW + QD, k + t * KVD, sizeof(float) * KVD);
    if (cache_dt == DT_F8E4M3) /* and those bytes are the rotated k's codes */
        for (int j = 0; j < KVD; j++)
            assert_int_equal((uint8_t)ref_cache[kv_offset(&l, slots[0], 1, 0, j / D, j % D)],
                             ref_e4m3_encode(k[j] * (1.0f / scales[2])));
    free(fused_cache);
    free(ref_cache);
}

static void test_qkv_rope_cache(void **state) {
    (void)state;
    qkv_rope_cache_case(DT_F32);
    qkv_rope_cache_case(DT_F8E4M3);
}

/* With a QkNorm: each q and k head normalized (reference in double) before the rotation. */
static void test_qkv_rope_cache_qk_norm(void **state) {
    (void)state;
    const KernelOps *ops = test_cpu_ops();
    rng_seed(11);
    enum { N = 4, NH = 4, NKV = 2, D = 16, QD = NH * D, KVD = NKV * D, ROW = QD + 2 * KVD };
    KvLayout l = {
        .num_layers = 2, .num_kv_heads = NKV, .head_dim = D, .block_size = 8, .dtype = DT_F32};
    size_t total = 3 * k_kv_block_elems(&l);
    float *cache = calloc(total, sizeof(float)), *ref_cache = calloc(total, sizeof(float));
    float qkv[N * ROW], q[N * QD], k[N * KVD], v[N * KVD], q_out[N * QD], qw[D], kw[D];
    fill(qkv, N * ROW, -3, 3);
    fill(qw, D, 0.5f, 1.5f);
    fill(kw, D, 0.5f, 1.5f);
    const float eps = 1e-6f;
    for (int t = 0; t < N; t++) {
        for (int h = 0; h < NH + NKV; h++) {
            const float *x = qkv + t * ROW + h * D;
            float *dst = h < NH ? q + t * QD + h * D : k + t * KVD + (h - NH) * D;
            const float *w = h < NH ? qw : kw;
            double ss = 0;
            for (int d = 0; d < D; d++)
                ss += (double)x[d] * x[d];
            double inv = 1.0 / sqrt(ss / D + eps);
            for (int d = 0; d < D; d++)
                dst[d] = (float)(w[d] * (x[d] * inv));
        }
        memcpy(v + t * KVD, qkv + t * ROW + QD + KVD, sizeof(float) * KVD);
    }
    float inv_freq[D / 2];
    k_rope_inv_freq(inv_freq, D, 1e6f, 0, 0, 0, 0);
    Rope rope = {.head_dim = D, .inv_freq = inv_freq};
    int32_t pos[N] = {0, 5, 11, 30};
    int64_t slots[N] = {3, 9, -1, 17};
    ops->rope(ops, q, k, pos, N, NH, NKV, &rope);
    ops->kv_write(ops, ref_cache, &l, 0, k, v, slots, N);
    QkNorm qk = {{.data = qw, .dtype = DT_F32, .ndim = 1, .shape = {D}},
                 {.data = kw, .dtype = DT_F32, .ndim = 1, .shape = {D}},
                 eps};
    ops->qkv_rope_cache(ops, q_out, qkv, pos, slots, N, NH, &rope, &qk, cache, &l, 0);
    double want_q[N * QD], *want_cache = malloc(total * sizeof(double));
    for (int i = 0; i < N * QD; i++)
        want_q[i] = q[i];
    for (size_t i = 0; i < total; i++)
        want_cache[i] = ref_cache[i];
    assert_int_equal(report("qk_norm q", q_out, want_q, NULL, N * QD, 1e-6, 1e-5), 0);
    assert_int_equal(report("qk_norm cache", cache, want_cache, NULL, total, 1e-6, 1e-5), 0);
    free(want_cache);
    free(cache);
    free(ref_cache);
}

/* moe_mlp reference in double: router softmax, top-k (lower id first on ties), experts. */
static void ref_moe(double *out, const float *x, const float *router, const float *gate_up,
                    const float *down, int n, int E, int H, int I, int top_k, int renorm) {
    for (int t = 0; t < n; t++) {
        const float *xr = x + (size_t)t * H;
        double p[16], z = 0, mx = -INFINITY;
        for (int e = 0; e < E; e++) {
            double a = 0;
            for (int h = 0; h < H; h++)
                a += (double)router[e * H + h] * xr[h];
            p[e] = a;
            mx = fmax(mx, a);
        }
        for (int e = 0; e < E; e++)
            z += p[e] = exp(p[e] - mx);
        int taken[16] = {0};
        double sel = 0, wgt[16] = {0};
        for (int j = 0; j < top_k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++)
                if (!taken[e] && (best < 0 || p[e] > p[best]))
                    best = e;
            taken[best] = 1;
            sel += p[best] / z;
        }
        for (int e = 0; e < E; e++)
            if (taken[e])
                wgt[e] = renorm ? p[e] / z / sel : p[e] / z;
        for (int h = 0; h < H; h++)
            out[t * H + h] = 0;
        for (int e = 0; e < E; e++) {
            if (!taken[e])
                continue;
            double act[64];
            for (int i = 0; i < I; i++) {
                double g = 0, u = 0;
                for (int h = 0; h < H; h++) {
                    g += (double)gate_up[((size_t)e * 2 * I + i) * H + h] * xr[h];
                    u += (double)gate_up[((size_t)e * 2 * I + I + i) * H + h] * xr[h];
                }
                act[i] = g / (1 + exp(-g)) * u;
            }
            for (int h = 0; h < H; h++) {
                double d = 0;
                for (int i = 0; i < I; i++)
                    d += (double)down[((size_t)e * H + h) * I + i] * act[i];
                out[t * H + h] += wgt[e] * d;
            }
        }
    }
}

static void test_moe_mlp(void **state) {
    (void)state;
    const KernelOps *ops = test_cpu_ops();
    rng_seed(12);
    enum { N = 6, E = 5, H = 24, I = 16 };
    float x[N * H], router[E * H], gate_up[E * 2 * I * H], down[E * H * I], out[N * H], one[H];
    fill(x, N * H, -1, 1);
    fill(router, E * H, -0.5f, 0.5f);
    fill(gate_up, E * 2 * I * H, -0.3f, 0.3f);
    fill(down, E * H * I, -0.3f, 0.3f);
    Tensor tr = {.data = router, .dtype = DT_F32, .ndim = 2, .shape = {E, H}},
           tg = {.data = gate_up, .dtype = DT_F32, .ndim = 3, .shape = {E, 2 * I, H}},
           td = {.data = down, .dtype = DT_F32, .ndim = 3, .shape = {E, H, I}};
    double want[N * H];
    for (int top_k = 1; top_k <= 3; top_k++)
        for (int renorm = 0; renorm < 2; renorm++) {
            ops->moe_mlp(ops, out, x, &tr, &tg, &td, N, top_k, renorm, NULL, 0);
            ref_moe(want, x, router, gate_up, down, N, E, H, I, top_k, renorm);
            char what[64];
            snprintf(what, sizeof what, "moe top %d renorm %d", top_k, renorm);
            assert_int_equal(report(what, out, want, NULL, N * H, 1e-6, 1e-5), 0);
            /* a row alone gives the same bits as in the batch */
            ops->moe_mlp(ops, one, x + 3 * H, &tr, &tg, &td, 1, top_k, renorm, NULL, 0);
            assert_memory_equal(one, out + 3 * H, sizeof one);
        }
    /* bf16 weights: the same op on the rounded values */
    uint16_t gu16[E * 2 * I * H], dn16[E * H * I];
    for (int i = 0; i < E * 2 * I * H; i++)
        gate_up[i] = pl_bf16_to_f32(gu16[i] = pl_f32_to_bf16(gate_up[i]));
    for (int i = 0; i < E * H * I; i++)
        down[i] = pl_bf16_to_f32(dn16[i] = pl_f32_to_bf16(down[i]));
    Tensor tg16 = {.data = gu16, .dtype = DT_BF16, .ndim = 3, .shape = {E, 2 * I, H}},
           td16 = {.data = dn16, .dtype = DT_BF16, .ndim = 3, .shape = {E, H, I}};
    ops->moe_mlp(ops, out, x, &tr, &tg16, &td16, N, 2, 1, NULL, 0);
    ref_moe(want, x, router, gate_up, down, N, E, H, I, 2, 1);
    assert_int_equal(report("moe bf16", out, want, NULL, N * H, 1e-6, 1e-5), 0);
    /* equal probabilities (a zero router): the lower ids win, weights 1/2 each renormalized */
    memset(router, 0, sizeof router);
    ops->moe_mlp(ops, out, x, &tr, &tg16, &td16, N, 2, 1, NULL, 0);
    ref_moe(want, x, router, gate_up, down, N, E, H, I, 2, 1);
    assert_int_equal(report("moe ties", out, want, NULL, N * H, 1e-6, 1e-5), 0);
    Tensor tg0 = tg16, td0 = td16; /* experts 0 and 1 alone: the same sum */
    tg0.shape[0] = td0.shape[0] = 2;
    Tensor tr0 = tr;
    tr0.shape[0] = 2;
    float two[N * H];
    ops->moe_mlp(ops, two, x, &tr0, &tg0, &td0, N, 2, 1, NULL, 0);
    assert_memory_equal(two, out, sizeof two);
}

/* One sequence of the attention test: its full K/V history and where the batch starts. */
typedef struct {
    int len;        /* tokens known after this step */
    int cached;     /* tokens already in the cache before this step */
    float *k, *v;   /* [len, nkv, D] */
    float *kr, *vr; /* what the cache reads back for them: k and v, or their fp8 round trip */
    int32_t *table;
} TestSeq;

/* Contiguous causal attention in double for token at position p of sequence sq. */
static void ref_attention(double *out, const float *q, const TestSeq *sq, int p, int nh, int nkv,
                          int D, float scale) {
    int G = nh / nkv;
    double *w = malloc(sizeof(double) * (p + 1));
    for (int h = 0; h < nh; h++) {
        int g = h / G;
        double mx = -INFINITY;
        for (int j = 0; j <= p; j++) {
            double s = 0;
            for (int d = 0; d < D; d++)
                s += (double)q[h * D + d] * sq->kr[((size_t)j * nkv + g) * D + d];
            w[j] = s * scale;
            mx = w[j] > mx ? w[j] : mx;
        }
        double z = 0;
        for (int j = 0; j <= p; j++) {
            w[j] = exp(w[j] - mx);
            z += w[j];
        }
        for (int d = 0; d < D; d++) {
            double o = 0;
            for (int j = 0; j <= p; j++)
                o += w[j] * sq->vr[((size_t)j * nkv + g) * D + d];
            out[h * D + d] = o / z;
        }
    }
    free(w);
}

static int64_t slot_of(const TestSeq *sq, int p, int bs) {
    return (int64_t)sq->table[p / bs] * bs + p % bs;
}

/* Mixed batch over a paged cache: a decode token (long cached context), a fresh prefill and
 * a prefill chunk continuing a cached prefix, plus padding rows; then the same sequences
 * compared against contiguous causal attention. With kv_scale (scales of 2 layers, K and V)
 * the cache is fp8 and the reference attends over the values it reads back (ref_kv_fp8).
 * Returns mismatches. */
static int run_attention_case_ex(int D, int G, int bs, float qscale, int lens_scale,
                                 const float *kv_scale) {
    const KernelOps *ops = test_cpu_ops();
    int nkv = 2, nh = nkv * G, L = 2, layer = 1;
    const int fp8 = kv_scale != NULL;
    KvLayout l = {.num_layers = L,
                  .num_kv_heads = nkv,
                  .head_dim = D,
                  .block_size = bs,
                  .dtype = fp8 ? DT_F8E4M3 : DT_F32,
                  .kv_scale = kv_scale};
    enum { S = 3 };
    TestSeq seqs[S] = {
        {.len = 38 * lens_scale, .cached = 38 * lens_scale - 1}, /* decode */
        {.len = 20, .cached = 0},                                /* fresh prefill */
        {.len = 41 * lens_scale, .cached = 23 * lens_scale},     /* chunk after a prefix */
    };
    int max_blocks = (41 * lens_scale + bs - 1) / bs + 2;
    int blocks_needed = 0;
    for (int s = 0; s < S; s++)
        blocks_needed += (seqs[s].len + bs - 1) / bs;
    int num_blocks = blocks_needed + 7;
    /* random non-contiguous assignment: a shuffled list of physical blocks */
    int *perm = malloc(sizeof(int) * num_blocks);
    for (int i = 0; i < num_blocks; i++)
        perm[i] = i;
    for (int i = num_blocks - 1; i > 0; i--) {
        int j = rnd_int(i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int32_t *tables = malloc(sizeof(int32_t) * S * max_blocks);
    int next = 0;
    for (int s = 0; s < S; s++) {
        seqs[s].table = tables + (size_t)s * max_blocks;
        int nb = (seqs[s].len + bs - 1) / bs;
        for (int b = 0; b < max_blocks; b++)
            seqs[s].table[b] = b < nb ? perm[next++] : -5; /* never read */
        size_t sz = (size_t)seqs[s].len * nkv * D;
        seqs[s].k = malloc(sizeof(float) * sz);
        seqs[s].v = malloc(sizeof(float) * sz);
        fill(seqs[s].k, sz, -1, 1);
        fill(seqs[s].v, sz, -1, 1);
        seqs[s].kr = seqs[s].k;
        seqs[s].vr = seqs[s].v;
        if (fp8) {
            seqs[s].kr = malloc(sizeof(float) * sz);
            seqs[s].vr = malloc(sizeof(float) * sz);
            for (size_t i = 0; i < sz; i++) {
                seqs[s].kr[i] = ref_kv_fp8(seqs[s].k[i], kv_scale[2 * layer]);
                seqs[s].vr[i] = ref_kv_fp8(seqs[s].v[i], kv_scale[2 * layer + 1]);
            }
        }
    }
    size_t cache_elems = (size_t)num_blocks * k_kv_block_elems(&l);
    float *cache = malloc(sizeof(float) * cache_elems); /* fp8: the first quarter used */
    fill(cache, cache_elems, -50, 50);                  /* garbage everywhere not written */
    size_t row = (size_t)nkv * D;

    /* earlier step: the cached prefixes of every sequence, layer 1, in one kv_write; layer 0
     * gets different values that attention on layer 1 must not see */
    int ncached = 0;
    for (int s = 0; s < S; s++)
        ncached += seqs[s].cached;
    if (ncached > 0) {
        float *kk = malloc(sizeof(float) * ncached * row),
              *vv = malloc(sizeof(float) * ncached * row);
        int64_t *sl = malloc(sizeof(int64_t) * ncached);
        int r = 0;
        for (int s = 0; s < S; s++)
            for (int p = 0; p < seqs[s].cached; p++, r++) {
                memcpy(kk + r * row, seqs[s].k + (size_t)p * row, sizeof(float) * row);
                memcpy(vv + r * row, seqs[s].v + (size_t)p * row, sizeof(float) * row);
                sl[r] = slot_of(&seqs[s], p, bs);
            }
        ops->kv_write(ops, cache, &l, layer, kk, vv, sl, ncached);
        for (size_t i = 0; i < ncached * row; i++)
            kk[i] = -kk[i] * 3.0f;
        ops->kv_write(ops, cache, &l, 0, kk, kk, sl, ncached);
        free(kk);
        free(vv);
        free(sl);
    }

    /* this step: new tokens of every sequence, then 2 padding rows */
    int ntok = 0;
    for (int s = 0; s < S; s++)
        ntok += seqs[s].len - seqs[s].cached;
    int nrows = ntok + 2;
    int32_t *positions = malloc(sizeof(int32_t) * nrows);
    int64_t *slots = malloc(sizeof(int64_t) * nrows);
    int32_t qstart[S + 1];
    float *kk = malloc(sizeof(float) * nrows * row), *vv = malloc(sizeof(float) * nrows * row);
    float *q = malloc(sizeof(float) * nrows * nh * D);
    fill(q, (size_t)nrows * nh * D, -qscale, qscale);
    fill(kk, (size_t)nrows * row, 100, 200); /* padding rows: must not land anywhere */
    fill(vv, (size_t)nrows * row, 100, 200);
    int r = 0;
    for (int s = 0; s < S; s++) {
        qstart[s] = r;
        for (int p = seqs[s].cached; p < seqs[s].len; p++, r++) {
            positions[r] = p;
            slots[r] = slot_of(&seqs[s], p, bs);
            memcpy(kk + r * row, seqs[s].k + (size_t)p * row, sizeof(float) * row);
            memcpy(vv + r * row, seqs[s].v + (size_t)p * row, sizeof(float) * row);
        }
    }
    qstart[S] = r;
    for (; r < nrows; r++) {
        positions[r] = 0;
        slots[r] = -1;
    }
    ops->kv_write(ops, cache, &l, layer, kk, vv, slots, nrows);

    AttnBatch batch = {
        .num_tokens = nrows,
        .positions = positions,
        .slot_mapping = slots,
        .num_seqs = S,
        .query_start = qstart,
        .block_tables = tables,
        .max_blocks_per_seq = max_blocks,
    };
    size_t on = (size_t)nrows * nh * D;
    float *out = malloc(sizeof(float) * on);
    for (size_t i = 0; i < on; i++)
        out[i] = 12345.0f;
    float scale = 1.0f / sqrtf((float)D);
    ops->attention(ops, out, q, cache, &l, layer, &batch, nh, scale, 0.0f, 0);

    int bad = 0;
    double *want = malloc(sizeof(double) * nh * D);
    char what[128];
    for (int s = 0; s < S; s++) {
        for (int t = qstart[s]; t < qstart[s + 1]; t++) {
            ref_attention(want, q + (size_t)t * nh * D, &seqs[s], positions[t], nh, nkv, D, scale);
            snprintf(what, sizeof what, "attention D=%d G=%d bs=%d seq %d pos %d", D, G, bs, s,
                     positions[t]);
            bad += report(what, out + (size_t)t * nh * D, want, NULL, (size_t)nh * D, 1e-5, 1e-5);
        }
    }
    for (size_t i = (size_t)ntok * nh * D; i < on; i++)
        if (out[i] != 12345.0f) {
            print_error("attention wrote padding row element %zu\n", i);
            bad++;
            break;
        }

    /* the portable build of attention gives the same bits as the AVX2 one */
    float *out_base = malloc(sizeof(float) * on);
    memcpy(out_base, out, sizeof(float) * on);
    int prev = cpu_set_simd(0);
    ops->attention(ops, out_base, q, cache, &l, layer, &batch, nh, scale, 0.0f, 0);
    cpu_set_simd(prev);
    if (memcmp(out_base, out, sizeof(float) * on) != 0) {
        print_error("attention: the portable path differs from the SIMD path\n");
        bad++;
    }
    free(out_base);

    /* the chunk sequence alone gives bit-identical rows (batch composition invariance) */
    AttnBatch alone = batch;
    int32_t qs2[2] = {qstart[2], qstart[3]};
    alone.num_seqs = 1;
    alone.query_start = qs2;
    alone.block_tables = tables + 2 * max_blocks;
    float *out2 = malloc(sizeof(float) * on);
    ops->attention(ops, out2, q, cache, &l, layer, &alone, nh, scale, 0.0f, 0);
    if (memcmp(out2 + (size_t)qstart[2] * nh * D, out + (size_t)qstart[2] * nh * D,
               sizeof(float) * (qstart[3] - qstart[2]) * nh * D) != 0) {
        print_error("attention: a sequence alone differs from the same sequence in a batch\n");
        bad++;
    }

    free(out2);
    free(want);
    free(out);
    free(q);
    free(kk);
    free(vv);
    free(positions);
    free(slots);
    free(cache);
    for (int s = 0; s < S; s++) {
        if (fp8) {
            free(seqs[s].kr);
            free(seqs[s].vr);
        }
        free(seqs[s].k);
        free(seqs[s].v);
    }
    free(tables);
    free(perm);
    return bad;
}

static int run_attention_case(int D, int G, int bs, float qscale, int lens_scale) {
    return run_attention_case_ex(D, G, bs, qscale, lens_scale, NULL);
}

static void test_attention_paged(void **state) {
    (void)state;
    rng_seed(10);
    const int Ds[] = {8, 64, 128};
    const int Gs[] = {1, 2, 4};
    const int bss[] = {8, 16, 32};
    int bad = 0;
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 3; c++)
                bad += run_attention_case(Ds[a], Gs[b], bss[c], 1.0f, 1);
    assert_int_equal(bad, 0);
}

/* Long contexts, blocks larger than the 64-position chunk, and peaked scores (large q) that
 * make the running maximum jump between chunks. */
static void test_attention_long(void **state) {
    (void)state;
    rng_seed(11);
    int bad = 0;
    bad += run_attention_case(64, 4, 128, 1.0f, 8);
    bad += run_attention_case(128, 2, 16, 6.0f, 5);
    bad += run_attention_case(8, 1, 8, 20.0f, 3);
    bad += run_attention_case(8, 2, 16, 80.0f, 2); /* scores beyond expf's range */
    assert_int_equal(bad, 0);
}

/* An fp8 cache: attention equals attention over the values the cache reads back (the
 * reference's own e4m3 round trip), with scales 1, small, large, and ones that saturate
 * (|k| / s beyond 448). */
static void test_attention_fp8(void **state) {
    (void)state;
    rng_seed(12);
    const float ones[4] = {1, 1, 1, 1}, mixed[4] = {1, 1, 0.0125f, 3.0f},
                sat[4] = {1, 1, 1.0f / 600, 1.0f / 1000}; /* layer 1's K and V saturate */
    int bad = 0;
    const int Ds[] = {8, 64, 128};
    for (int a = 0; a < 3; a++) {
        bad += run_attention_case_ex(Ds[a], 2, 16, 1.0f, 1, ones);
        bad += run_attention_case_ex(Ds[a], 4, 8, 1.0f, 1, mixed);
        bad += run_attention_case_ex(Ds[a], 1, 32, 1.0f, 1, sat);
    }
    bad += run_attention_case_ex(64, 4, 128, 3.0f, 4, mixed);
    assert_int_equal(bad, 0);
}

/* kv_write then attention over layer 0 of a one-layer cache of a single token: softmax of a
 * single score is 1, so out equals v exactly. */
static void test_attention_single(void **state) {
    (void)state;
    const KernelOps *ops = test_cpu_ops();
    KvLayout l = {
        .num_layers = 1, .num_kv_heads = 1, .head_dim = 8, .block_size = 8, .dtype = DT_F32};
    float *cache = calloc(3 * k_kv_block_elems(&l), sizeof(float));
    float k[8] = {1, 2, 3, 4, 5, 6, 7, 8}, v[8] = {-1, 0.5f, 2, 3, -4, 5, 6, 7}, q[16], out[16];
    fill(q, 16, -1, 1);
    int64_t slot = 2 * 8 + 0;
    ops->kv_write(ops, cache, &l, 0, k, v, &slot, 1);
    int32_t pos = 0, qs[2] = {0, 1}, table[1] = {2};
    AttnBatch b = {1, &pos, &slot, 1, qs, table, 1, 1};
    ops->attention(ops, out, q, cache, &l, 0, &b, 2, 0.3f, 0.0f, 0);
    for (int h = 0; h < 2; h++)
        for (int d = 0; d < 8; d++)
            assert_true(out[h * 8 + d] == v[d]);
    free(cache);
}

/* ---------------- data movement ---------------- */

static void test_gather_rows(void **state) {
    (void)state;
    float in[5 * 3], out[4 * 3];
    for (int i = 0; i < 15; i++)
        in[i] = (float)i;
    int32_t rows[4] = {4, 0, 4, 2};
    test_cpu_ops()->gather_rows(test_cpu_ops(), out, in, rows, 4, 3);
    for (int i = 0; i < 4; i++)
        for (int d = 0; d < 3; d++)
            assert_true(out[i * 3 + d] == in[rows[i] * 3 + d]);
}

/* Whole-block copies within a pool (copy-on-write) and between pools (swap). */
static void test_copy_blocks(void **state) {
    (void)state;
    KvLayout l = {
        .num_layers = 2, .num_kv_heads = 2, .head_dim = 8, .block_size = 4, .dtype = DT_F32};
    size_t be = k_kv_block_elems(&l), bytes = be * sizeof(float);
    float *gpu = malloc(bytes * 6), *host = malloc(bytes * 3);
    for (size_t i = 0; i < be * 6; i++)
        gpu[i] = (float)i;
    for (size_t i = 0; i < be * 3; i++)
        host[i] = -1.0f;
    int32_t out_pairs[4] = {5, 0, 1, 2}; /* gpu 5 -> host 0, gpu 1 -> host 2 */
    test_cpu_ops()->copy_blocks(test_cpu_ops(), host, gpu, out_pairs, 2, bytes);
    assert_memory_equal(host, gpu + 5 * be, bytes);
    assert_memory_equal(host + 2 * be, gpu + 1 * be, bytes);
    assert_true(host[be] == -1.0f && host[2 * be - 1] == -1.0f); /* block 1 untouched */
    int32_t cow[2] = {3, 4};                                     /* same pool: gpu 3 -> gpu 4 */
    test_cpu_ops()->copy_blocks(test_cpu_ops(), gpu, gpu, cow, 1, bytes);
    assert_memory_equal(gpu + 4 * be, gpu + 3 * be, bytes);
    free(gpu);
    free(host);
}

/* cpu-threads: a backend's cpu_threads caps the threads its regions run on (1 = the caller
 * alone), never beyond the CPUs this process may run on, and 0 gives them all; each backend
 * has its own pool. */
static int pool_threads(int cpu_threads) {
    KernelOpenOptions o = {.backend = "cpu", .act = DT_F32, .cpu_threads = cpu_threads};
    KernelOps *k = NULL;
    assert_int_equal(k_open(&o, &k), PL_OK);
    int n = cpu_pool_threads(cpu_pool(k));
    k_close(&k, 1);
    return n;
}

static void test_thread_cap(void **state) {
    (void)state;
    int all = pool_threads(0);
    assert_true(all >= 1);
    assert_int_equal(pool_threads(1), 1);
    assert_int_equal(pool_threads(all + 5), all);
    if (all > 1)
        assert_int_equal(pool_threads(all - 1), all - 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_add_rmsnorm),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_matmul_large),
        cmocka_unit_test(test_matmul_batch_invariant),
        cmocka_unit_test(test_matmul_concurrent_callers),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_rope_inv_freq_default),
        cmocka_unit_test(test_rope_inv_freq_llama3),
        cmocka_unit_test(test_silu_mul),
        cmocka_unit_test(test_kv_geometry),
        cmocka_unit_test(test_kv_write),
        cmocka_unit_test(test_kv_write_fp8),
        cmocka_unit_test(test_qkv_rope_cache),
        cmocka_unit_test(test_qkv_rope_cache_qk_norm),
        cmocka_unit_test(test_moe_mlp),
        cmocka_unit_test(test_attention_paged),
        cmocka_unit_test(test_attention_long),
        cmocka_unit_test(test_attention_fp8),
        cmocka_unit_test(test_attention_single),
        cmocka_unit_test(test_gather_rows),
        cmocka_unit_test(test_copy_blocks),
        cmocka_unit_test(test_thread_cap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
