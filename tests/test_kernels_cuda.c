/* test_kernels_cuda.c - every CUDA kernel (include/kernels_cuda.h) against the CPU op of the
 * same name (k_cpu_ops(), the reference), on random data from fixed seeds, sweeping head dims,
 * GQA ratios, block sizes, random non-contiguous block tables, padding slots and rows, mixed
 * batches (decode + a prompt chunk continuing a cached prefix + a fresh prompt), contexts up
 * to 32k (split over the sequence), and activation / cache dtypes f32 and bf16. The CPU op sees
 * exactly the values the GPU sees (inputs rounded to the GPU's dtype first); a result passes
 * when |gpu - ref| <= atol + rtol |ref| (f32: 1e-4, bf16: 1e-2), and the first mismatches are
 * printed. Outputs are poisoned (NaN) before each launch, so unwritten elements fail.
 *
 * Without a GPU (CI) every test is skipped with "no CUDA device: skipped"; in a build without
 * the CUDA backend, with "CUDA backend not built: skipped". The last test prints timings.
 * PAGELLM_CUDA_TEST_QUICK=1 shrinks the sweeps and drops the long and timing tests (for runs
 * under compute-sanitizer); PAGELLM_CUDA_TEST_FILTER=pattern runs the matching tests only. */
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

#define CUDA_TESTS(X)                                                                              \
    X(test_embedding)                                                                              \
    X(test_rmsnorm)                                                                                \
    X(test_add_rmsnorm)                                                                            \
    X(test_silu_mul)                                                                               \
    X(test_gather_rows)                                                                            \
    X(test_rope)                                                                                   \
    X(test_kv_write)                                                                               \
    X(test_rope_kv_write)                                                                          \
    X(test_copy_blocks)                                                                            \
    X(test_attention_sweep)                                                                        \
    X(test_attention_long)                                                                         \
    X(test_attention_timing)

#ifndef PAGELLM_HAVE_CUDA

#define SKIP_TEST(name)                                                                            \
    static void name(void **state) {                                                               \
        (void)state;                                                                               \
        print_message("CUDA backend not built: skipped\n");                                        \
        skip();                                                                                    \
    }
CUDA_TESTS(SKIP_TEST)

#else

/* ---------------- helpers ---------------- */

#include "cuda_test_util.h"

static int rnd_int(int n) {
    return (int)(rng_next() % (uint64_t)n);
}

/* Device copy of x[n] in dt (x already holds dt-representable values). */
static void *upload_as(const float *x, size_t n, DType dt) {
    void *h = to_dtype(x, n, dt);
    void *d = upload(h, n * pl_dtype_size(dt));
    free(h);
    return d;
}

/* A device buffer of n elements of dt filled with NaN (0xFF bytes). */
static void *poisoned(size_t n, DType dt) {
    size_t bytes = n * pl_dtype_size(dt);
    void *d = k_cuda_malloc(bytes);
    k_cuda_memset(d, 0xFF, bytes);
    return d;
}

static double atol_of(DType dt) {
    return dt == DT_F32 ? 1e-4 : 1e-2;
}

static const DType acts[] = {DT_F32, DT_BF16};
static const DType wdts[] = {DT_F32, DT_F16, DT_BF16};

/* ---------------- embedding, norms, activation, gather ---------------- */

static void test_embedding(void **state) {
    (void)state;
    REQUIRE_GPU();
    const KernelOps *cpu = k_cpu_ops();
    rng_seed(1);
    const int hiddens[] = {8, 64, 100, 4096};
    int bad = 0;
    for (int ai = 0; ai < 2; ai++)
        for (int wi = 0; wi < 3; wi++)
            for (int hi = 0; hi < 4; hi++) {
                DType act = acts[ai];
                int V = 50, H = hiddens[hi], n = 9;
                Weight tab = make_weight(wdts[wi], 2, V, H, -2, 2);
                int32_t ids[9] = {0, 49, 3, 3, 17, 25, 48, 1, 0};
                float *ref = xmalloc(sizeof(float) * n * H), *got = xmalloc(sizeof(float) * n * H);
                cpu->embedding(ref, ids, n, &tab.host);
                for (int i = 0; i < n * H; i++)
                    ref[i] = round_to(ref[i], act);
                int32_t *d_ids = upload(ids, sizeof ids);
                void *d_out = poisoned((size_t)n * H, act);
                k_cuda_embedding(d_out, act, d_ids, n, &tab.dev, NULL);
                download_as(got, d_out, (size_t)n * H, act);
                char what[96];
                snprintf(what, sizeof what, "embedding act %s table %s H %d", dn(act), dn(wdts[wi]),
                         H);
                bad += check_close(what, got, ref, (size_t)n * H, 0.0);
                k_cuda_free(d_ids);
                k_cuda_free(d_out);
                free(ref);
                free(got);
                free_weight(&tab);
            }
    assert_int_equal(bad, 0);
}

/* rmsnorm, or add_rmsnorm with (delta != 0) or without a delta. */
static int norm_case(DType act, DType wdt, int n, int dim, int add, int with_delta) {
    const KernelOps *cpu = k_cpu_ops();
    size_t len = (size_t)n * dim;
    float eps = 1e-5f;
    Weight w = make_weight(wdt, 1, dim, 0, -2, 2);
    float *x = rand_vec(len, -3, 3, act), *delta = rand_vec(len, -1, 1, act);
    float *ref = xmalloc(len * sizeof(float)), *got = xmalloc(len * sizeof(float));
    float *res_ref = xmalloc(len * sizeof(float)), *res_got = xmalloc(len * sizeof(float));
    memcpy(res_ref, x, len * sizeof(float));
    void *d_x = upload_as(x, len, act), *d_delta = upload_as(delta, len, act);
    void *d_out = poisoned(len, act);
    int bad = 0;
    char what[128];
    snprintf(what, sizeof what, "%s act %s w %s n %d dim %d%s", add ? "add_rmsnorm" : "rmsnorm",
             dn(act), dn(wdt), n, dim, add && !with_delta ? " (no delta)" : "");
    if (add) {
        cpu->add_rmsnorm(res_ref, with_delta ? delta : NULL, ref, &w.host, n, dim, eps);
        k_cuda_add_rmsnorm(d_x, with_delta ? d_delta : NULL, d_out, act, &w.dev, n, dim, eps, NULL);
        download_as(res_got, d_x, len, act);
        char rw[160];
        snprintf(rw, sizeof rw, "%s residual", what);
        bad += check_close(rw, res_got, res_ref, len, atol_of(act));
    } else {
        cpu->rmsnorm(ref, x, &w.host, n, dim, eps);
        k_cuda_rmsnorm(d_out, d_x, act, &w.dev, n, dim, eps, NULL);
    }
    download_as(got, d_out, len, act);
    bad += check_close(what, got, ref, len, atol_of(act));
    k_cuda_free(d_x);
    k_cuda_free(d_delta);
    k_cuda_free(d_out);
    free(x);
    free(delta);
    free(ref);
    free(got);
    free(res_ref);
    free(res_got);
    free_weight(&w);
    return bad;
}

static const int norm_dims[] = {8, 64, 100, 288, 4096, 5120};

static void test_rmsnorm(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(2);
    int bad = 0;
    for (int ai = 0; ai < 2; ai++)
        for (int wi = 0; wi < 3; wi++)
            for (int di = 0; di < 6; di++)
                bad += norm_case(acts[ai], wdts[wi], di % 2 ? 7 : 1, norm_dims[di], 0, 0);
    assert_int_equal(bad, 0);
}

static void test_add_rmsnorm(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(3);
    int bad = 0;
    for (int ai = 0; ai < 2; ai++)
        for (int wi = 0; wi < 3; wi++)
            for (int di = 0; di < 6; di++)
                bad += norm_case(acts[ai], wdts[wi], di % 2 ? 5 : 3, norm_dims[di], 1, 1);
    bad += norm_case(DT_F32, DT_F32, 4, 64, 1, 0);
    bad += norm_case(DT_BF16, DT_BF16, 4, 4096, 1, 0);
    assert_int_equal(bad, 0);
}

static void test_silu_mul(void **state) {
    (void)state;
    REQUIRE_GPU();
    const KernelOps *cpu = k_cpu_ops();
    rng_seed(4);
    const int shapes[][2] = {{1, 8}, {3, 100}, {16, 14336}, {5, 1}};
    int bad = 0;
    for (int ai = 0; ai < 2; ai++)
        for (int si = 0; si < 4; si++) {
            DType act = acts[ai];
            int n = shapes[si][0], dim = shapes[si][1];
            size_t len = (size_t)n * dim;
            float *g = rand_vec(len, -8, 8, act), *u = rand_vec(len, -2, 2, act);
            float *ref = xmalloc(len * sizeof(float)), *got = xmalloc(len * sizeof(float));
            cpu->silu_mul(ref, g, u, n, dim);
            void *dg = upload_as(g, len, act), *du = upload_as(u, len, act);
            void *dout = poisoned(len, act);
            k_cuda_silu_mul(dout, dg, du, act, n, dim, NULL);
            download_as(got, dout, len, act);
            char what[64];
            snprintf(what, sizeof what, "silu_mul act %s [%d, %d]", dn(act), n, dim);
            bad += check_close(what, got, ref, len, atol_of(act));
            k_cuda_silu_mul(dg, dg, du, act, n, dim, NULL); /* in place over gate */
            download_as(got, dg, len, act);
            bad += check_close("silu_mul in place", got, ref, len, atol_of(act));
            k_cuda_free(dg);
            k_cuda_free(du);
            k_cuda_free(dout);
            free(g);
            free(u);
            free(ref);
            free(got);
        }
    assert_int_equal(bad, 0);
}

static void test_gather_rows(void **state) {
    (void)state;
    REQUIRE_GPU();
    const KernelOps *cpu = k_cpu_ops();
    rng_seed(5);
    int bad = 0;
    for (int ai = 0; ai < 2; ai++) {
        DType act = acts[ai];
        int rows_in = 37, dim = 96, n = 6;
        int32_t rows[6] = {36, 0, 5, 5, 17, 2};
        float *in = rand_vec((size_t)rows_in * dim, -5, 5, act);
        float *ref = xmalloc(sizeof(float) * n * dim), *got = xmalloc(sizeof(float) * n * dim);
        cpu->gather_rows(ref, in, rows, n, dim);
        void *din = upload_as(in, (size_t)rows_in * dim, act),
             *dout = poisoned((size_t)n * dim, act);
        int32_t *drows = upload(rows, sizeof rows);
        k_cuda_gather_rows(dout, din, drows, act, n, dim, NULL);
        download_as(got, dout, (size_t)n * dim, act);
        bad += check_close(act == DT_F32 ? "gather_rows f32" : "gather_rows bf16", got, ref,
                           (size_t)n * dim, 0.0);
        k_cuda_free(din);
        k_cuda_free(dout);
        k_cuda_free(drows);
        free(in);
        free(ref);
        free(got);
    }
    assert_int_equal(bad, 0);
}

/* ---------------- rope, kv_write, fused ---------------- */

/* Device-side Rope for head_dim D: the frequencies on the host (ref) and device (dev). */
typedef struct {
    Rope host, dev;
    float *h_inv;
    float *d_inv;
} RopePair;

static RopePair make_rope(int D, int llama3) {
    RopePair r;
    r.h_inv = xmalloc(sizeof(float) * (size_t)(D / 2));
    if (llama3)
        k_rope_inv_freq(r.h_inv, D, 500000.0f, 8.0f, 1.0f, 4.0f, 8192);
    else
        k_rope_inv_freq(r.h_inv, D, 10000.0f, 0.0f, 0.0f, 0.0f, 0);
    r.d_inv = upload(r.h_inv, sizeof(float) * (size_t)(D / 2));
    r.host.head_dim = r.dev.head_dim = D;
    r.host.inv_freq = r.h_inv;
    r.dev.inv_freq = r.d_inv;
    return r;
}

static void free_rope(RopePair *r) {
    free(r->h_inv);
    k_cuda_free(r->d_inv);
}

static void test_rope(void **state) {
    (void)state;
    REQUIRE_GPU();
    const KernelOps *cpu = k_cpu_ops();
    rng_seed(6);
    const int dims[] = {8, 64, 80, 96, 128, 256};
    const int gqa[] = {1, 4, 8};
    int bad = 0;
    for (int ai = 0; ai < 2; ai++)
        for (int di = 0; di < 6; di++)
            for (int gi = 0; gi < 3; gi++) {
                DType act = acts[ai];
                int D = dims[di], nkv = 2, nh = nkv * gqa[gi], n = 11;
                RopePair rp = make_rope(D, gi == 1);
                int32_t pos[11];
                for (int t = 0; t < n; t++)
                    pos[t] = t < 3 ? t : rnd_int(32768);
                size_t nq = (size_t)n * nh * D, nk = (size_t)n * nkv * D;
                float *q = rand_vec(nq, -2, 2, act), *k = rand_vec(nk, -2, 2, act);
                void *dq = upload_as(q, nq, act), *dk = upload_as(k, nk, act);
                int32_t *dpos = upload(pos, sizeof pos);
                cpu->rope(q, k, pos, n, nh, nkv, &rp.host);
                k_cuda_rope(dq, dk, act, dpos, n, nh, nkv, &rp.dev, NULL);
                float *gq = xmalloc(nq * sizeof(float)), *gk = xmalloc(nk * sizeof(float));
                download_as(gq, dq, nq, act);
                download_as(gk, dk, nk, act);
                char what[96];
                snprintf(what, sizeof what, "rope act %s D %d nh %d nkv %d q", dn(act), D, nh, nkv);
                bad += check_close(what, gq, q, nq, atol_of(act));
                what[strlen(what) - 1] = 'k';
                bad += check_close(what, gk, k, nk, atol_of(act));
                free(q);
                free(k);
                free(gq);
                free(gk);
                k_cuda_free(dq);
                k_cuda_free(dk);
                k_cuda_free(dpos);
                free_rope(&rp);
            }
    assert_int_equal(bad, 0);
}

/* One rope + kv_write (or kv_write alone) case against cpu rope then cpu kv_write on an F32
 * cache: q, k and the whole cache (untouched slots included) are compared. */
static int kv_case(DType act, DType cdt, int D, int nkv, int G, int bs, int fused) {
    const KernelOps *cpu = k_cpu_ops();
    KvLayout l = {
        .num_layers = 3, .num_kv_heads = nkv, .head_dim = D, .block_size = bs, .dtype = DT_F32};
    int layer = 1, nblocks = 7, nh = nkv * G, n = 2 * bs + 3;
    size_t half = (size_t)bs * nkv * D, block = (size_t)l.num_layers * 2 * half;
    size_t cache_n = block * nblocks;
    float *cache = rand_vec(cache_n, -1, 1, cdt);
    /* distinct random slots, every 5th token padding */
    int nslots = nblocks * bs;
    int *perm = xmalloc(sizeof(int) * nslots);
    for (int i = 0; i < nslots; i++)
        perm[i] = i;
    for (int i = nslots - 1; i > 0; i--) {
        int j = rnd_int(i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int64_t *slots = xmalloc(sizeof(int64_t) * n);
    int32_t *pos = xmalloc(sizeof(int32_t) * n);
    for (int t = 0; t < n; t++) {
        slots[t] = t % 5 == 4 ? -1 : perm[t];
        pos[t] = rnd_int(8192);
    }
    size_t nq = (size_t)n * nh * D, nk = (size_t)n * nkv * D;
    float *q = rand_vec(nq, -2, 2, act), *k = rand_vec(nk, -2, 2, act),
          *v = rand_vec(nk, -2, 2, act);
    void *dq = upload_as(q, nq, act), *dk = upload_as(k, nk, act), *dv = upload_as(v, nk, act);
    void *dcache = upload_as(cache, cache_n, cdt);
    int64_t *dslots = upload(slots, sizeof(int64_t) * n);
    int32_t *dpos = upload(pos, sizeof(int32_t) * n);
    RopePair rp = make_rope(D, 0);
    KvLayout dl = l;
    dl.dtype = cdt;
    if (fused) {
        cpu->rope(q, k, pos, n, nh, nkv, &rp.host);
        k_cuda_rope_kv_write(dq, dk, dv, act, dpos, dslots, n, nh, &rp.dev, dcache, &dl, layer,
                             NULL);
    } else {
        k_cuda_kv_write(dcache, &dl, layer, dk, dv, act, dslots, n, NULL);
    }
    /* what the CPU sequence stores: k as rounded to act by the rope, in the cache's dtype */
    for (size_t i = 0; i < nk; i++) {
        k[i] = round_to(k[i], act);
    }
    cpu->kv_write(cache, &l, layer, k, v, slots, n);
    int bad = 0;
    char what[128];
    snprintf(what, sizeof what, "%s act %s cache %s D %d nkv %d G %d bs %d",
             fused ? "rope_kv_write" : "kv_write", dn(act), dn(cdt), D, nkv, G, bs);
    float *got = xmalloc(cache_n * sizeof(float));
    download_as(got, dcache, cache_n, cdt);
    char cw[160];
    snprintf(cw, sizeof cw, "%s: cache", what);
    bad += check_close(cw, got, cache, cache_n, atol_of(cdt == DT_BF16 ? cdt : act));
    if (fused) {
        float *gq = xmalloc(nq * sizeof(float)), *gk = xmalloc(nk * sizeof(float));
        download_as(gq, dq, nq, act);
        download_as(gk, dk, nk, act);
        snprintf(cw, sizeof cw, "%s: q", what);
        bad += check_close(cw, gq, q, nq, atol_of(act));
        snprintf(cw, sizeof cw, "%s: k", what);
        bad += check_close(cw, gk, k, nk, atol_of(act));
        free(gq);
        free(gk);
    }
    free(got);
    free(cache);
    free(perm);
    free(slots);
    free(pos);
    free(q);
    free(k);
    free(v);
    k_cuda_free(dq);
    k_cuda_free(dk);
    k_cuda_free(dv);
    k_cuda_free(dcache);
    k_cuda_free(dslots);
    k_cuda_free(dpos);
    free_rope(&rp);
    return bad;
}

static void kv_sweep(int fused) {
    const int dims[] = {8, 64, 128, 256};
    const int kvh[] = {1, 2, 8};
    const int bss[] = {8, 16, 32};
    int bad = 0;
    for (int ai = 0; ai < 2; ai++)
        for (int ci = 0; ci < 2; ci++)
            for (int di = 0; di < 4; di++)
                for (int hi = 0; hi < 3; hi++)
                    bad += kv_case(acts[ai], acts[ci], dims[di], kvh[hi], hi == 2 ? 4 : 1,
                                   bss[(di + hi) % 3], fused);
    assert_int_equal(bad, 0);
}

static void test_kv_write(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(7);
    kv_sweep(0);
}

static void test_rope_kv_write(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(8);
    kv_sweep(1);
}

/* ---------------- copy_blocks ---------------- */

static void test_copy_blocks(void **state) {
    (void)state;
    REQUIRE_GPU();
    const KernelOps *cpu = k_cpu_ops();
    rng_seed(9);
    const size_t sizes[] = {2 * 8 * 2 * 64 * 2, 4096 * 3, 6 * 7}; /* 16-byte multiple, odd */
    int bad = 0;
    for (int si = 0; si < 3; si++) {
        size_t bb = sizes[si];
        int nblocks = 40, n = 13;
        size_t bytes = bb * nblocks;
        unsigned char *src = xmalloc(bytes), *dst = xmalloc(bytes);
        for (size_t i = 0; i < bytes; i++) {
            src[i] = (unsigned char)rng_next();
            dst[i] = (unsigned char)rng_next();
        }
        int32_t pairs[26];
        for (int i = 0; i < n; i++) { /* distinct destinations 0..12 shuffled, any sources */
            pairs[2 * i] = rnd_int(nblocks);
            pairs[2 * i + 1] = (i * 7) % n + 20;
        }
        void *dsrc = upload(src, bytes), *ddst = upload(dst, bytes);
        int32_t *dpairs = upload(pairs, sizeof pairs);
        cpu->copy_blocks(dst, src, pairs, n, bb);
        k_cuda_copy_blocks(ddst, dsrc, dpairs, n, bb, NULL);
        unsigned char *got = xmalloc(bytes);
        k_cuda_memcpy(got, ddst, bytes);
        if (memcmp(got, dst, bytes) != 0) {
            print_error("copy_blocks (two pools) block_bytes %zu differs\n", bb);
            bad++;
        }
        /* copy-on-write inside one pool: sources 0..12, destinations 20..32 */
        for (int i = 0; i < n; i++)
            pairs[2 * i] = i;
        k_cuda_memcpy(dpairs, pairs, sizeof pairs);
        cpu->copy_blocks(src, src, pairs, n, bb);
        k_cuda_copy_blocks(dsrc, dsrc, dpairs, n, bb, NULL);
        k_cuda_memcpy(got, dsrc, bytes);
        if (memcmp(got, src, bytes) != 0) {
            print_error("copy_blocks (same pool) block_bytes %zu differs\n", bb);
            bad++;
        }
        free(src);
        free(dst);
        free(got);
        k_cuda_free(dsrc);
        k_cuda_free(ddst);
        k_cuda_free(dpairs);
    }
    assert_int_equal(bad, 0);
}

/* ---------------- attention ---------------- */

typedef struct {
    int prefix; /* positions already in the cache */
    int qlen;   /* query rows this step (1 = decode) */
} SeqSpec;

enum { MODE_DECODE = 1, MODE_PREFILL = 2, MODE_SPLIT = 4 };

/* One batch: sequences `specs` (decodes first), pad_rows padding rows after the last one.
 * The cache holds random values in every position (the step's own K/V included, as after
 * kv_write); the block tables are a random permutation of the pool. The CPU attention over an
 * F32 copy of the cache is the reference for each requested mode. */
static int attention_case(int D, int nkv, int G, int bs, DType act, DType cdt, const SeqSpec *specs,
                          int ns, int pad_rows, int modes) {
    const KernelOps *cpu = k_cpu_ops();
    int nh = nkv * G, L = 2, layer = 1;
    int T = 0, max_blocks = 1, used = 0, nd = 0;
    for (int s = 0; s < ns; s++) {
        T += specs[s].qlen;
        int nb = (specs[s].prefix + specs[s].qlen + bs - 1) / bs;
        used += nb;
        if (nb + 1 > max_blocks)
            max_blocks = nb + 1;
        if (specs[s].qlen == 1 && nd == s)
            nd++;
    }
    int rows = T + pad_rows, nblocks = used + 3;
    KvLayout l = {
        .num_layers = L, .num_kv_heads = nkv, .head_dim = D, .block_size = bs, .dtype = DT_F32};
    size_t block = (size_t)L * 2 * bs * nkv * D, cache_n = block * nblocks;

    int *perm = xmalloc(sizeof(int) * nblocks);
    for (int i = 0; i < nblocks; i++)
        perm[i] = i;
    for (int i = nblocks - 1; i > 0; i--) {
        int j = rnd_int(i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int32_t *tables = xmalloc(sizeof(int32_t) * ns * max_blocks);
    int32_t *qs = xmalloc(sizeof(int32_t) * (ns + 1));
    int32_t *pos = xmalloc(sizeof(int32_t) * rows);
    int next = 0, row = 0;
    for (int s = 0; s < ns; s++) {
        int nb = (specs[s].prefix + specs[s].qlen + bs - 1) / bs;
        for (int i = 0; i < max_blocks; i++)
            tables[s * max_blocks + i] = i < nb ? perm[next++] : -1;
        qs[s] = row;
        for (int i = 0; i < specs[s].qlen; i++)
            pos[row++] = specs[s].prefix + i;
    }
    qs[ns] = row;
    for (; row < rows; row++)
        pos[row] = 0;

    float *cache = rand_vec(cache_n, -1, 1, cdt);
    size_t nq = (size_t)rows * nh * D;
    float *q = rand_vec(nq, -4, 4, act);
    float *ref = xmalloc(nq * sizeof(float)), *got = xmalloc(nq * sizeof(float));
    float scale = 1.0f / sqrtf((float)D);
    AttnBatch hb = {.num_tokens = T,
                    .positions = pos,
                    .slot_mapping = NULL,
                    .num_seqs = ns,
                    .query_start = qs,
                    .block_tables = tables,
                    .max_blocks_per_seq = max_blocks};
    cpu->attention(ref, q, cache, &l, layer, &hb, nh, scale);
    for (size_t i = 0; i < nq; i++)
        ref[i] = round_to(ref[i], act);

    KvLayout dl = l;
    dl.dtype = cdt;
    void *dcache = upload_as(cache, cache_n, cdt), *dq = upload_as(q, nq, act);
    int32_t *dpos = upload(pos, sizeof(int32_t) * rows),
            *dqs = upload(qs, sizeof(int32_t) * (ns + 1));
    int32_t *dtab = upload(tables, sizeof(int32_t) * ns * max_blocks);
    size_t ws_bytes = k_cuda_attention_workspace_bytes(&dl, rows, nh, max_blocks);
    void *ws = ws_bytes ? k_cuda_malloc(ws_bytes) : NULL;
    void *dout = k_cuda_malloc(nq * pl_dtype_size(act));
    AttnBatch db = {.num_tokens = rows,
                    .positions = dpos,
                    .slot_mapping = NULL,
                    .num_seqs = ns,
                    .query_start = dqs,
                    .block_tables = dtab,
                    .max_blocks_per_seq = max_blocks};

    int bad = 0;
    for (int mode = MODE_DECODE; mode <= MODE_SPLIT; mode <<= 1) {
        if (!(modes & mode))
            continue;
        k_cuda_memset(dout, 0xFF, nq * pl_dtype_size(act));
        if (mode == MODE_DECODE) {
            k_cuda_attention_decode(dout, dq, act, dcache, &dl, layer, &db, nh, scale, ws, ws_bytes,
                                    NULL);
        } else if (mode == MODE_PREFILL) {
            k_cuda_attention_prefill(dout, dq, act, dcache, &dl, layer, &db, nh, scale, NULL);
        } else {
            AttnBatch dv = db, pv = db;
            dv.num_tokens = nd;
            dv.num_seqs = nd;
            pv.num_tokens = T - nd;
            pv.num_seqs = ns - nd;
            pv.query_start = dqs + nd;
            pv.block_tables = dtab + (size_t)nd * max_blocks;
            if (nd > 0)
                k_cuda_attention_decode(dout, dq, act, dcache, &dl, layer, &dv, nh, scale, ws,
                                        ws_bytes, NULL);
            if (ns > nd)
                k_cuda_attention_prefill(dout, dq, act, dcache, &dl, layer, &pv, nh, scale, NULL);
        }
        download_as(got, dout, nq, act);
        char what[160];
        snprintf(what, sizeof what, "attention %s act %s cache %s D %d nkv %d G %d bs %d",
                 mode == MODE_DECODE    ? "decode"
                 : mode == MODE_PREFILL ? "prefill"
                                        : "split",
                 dn(act), dn(cdt), D, nkv, G, bs);
        size_t real = (size_t)T * nh * D;
        double tol = atol_of(act == DT_BF16 || cdt == DT_BF16 ? DT_BF16 : DT_F32);
        bad += check_close(what, got, ref, real, tol);
        int touched = 0; /* padding rows stay poisoned */
        for (size_t i = real; i < nq; i++)
            touched += !isnan(got[i]);
        if (touched) {
            print_error("%s: %d padding-row elements written\n", what, touched);
            bad++;
        }
    }
    k_cuda_free(dcache);
    k_cuda_free(dq);
    k_cuda_free(dpos);
    k_cuda_free(dqs);
    k_cuda_free(dtab);
    k_cuda_free(ws);
    k_cuda_free(dout);
    free(perm);
    free(tables);
    free(qs);
    free(pos);
    free(cache);
    free(q);
    free(ref);
    free(got);
    return bad;
}

/* Head dims x GQA ratios x block sizes x dtypes, each on a mixed batch: three decodes (up to
 * three 256-position partitions), a chunk continuing a cached prefix, a fresh prompt, and
 * two padding rows; every kernel mode (decode, prefill, decode+prefill views). */
static void test_attention_sweep(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(10);
    const int dims[] = {8, 64, 80, 96, 128, 256};
    const int gqa[] = {1, 4, 8};
    const int bss[] = {8, 16, 32};
    const DType pairs[][2] = {{DT_F32, DT_F32}, {DT_BF16, DT_BF16}};
    int bad = 0, cases = 0;
    for (int di = 0; di < 6; di++)
        for (int gi = 0; gi < 3; gi++)
            for (int bi = 0; bi < 3; bi++)
                for (int pi = 0; pi < 2; pi++) {
                    if (quick() && ((di != 0 && di != 4) || bi != 1))
                        continue;
                    SeqSpec specs[5] = {
                        {rnd_int(700), 1},
                        {rnd_int(300), 1},
                        {0, 1},
                        {100 + rnd_int(100), 37 + rnd_int(30)},
                        {0, 20 + rnd_int(60)},
                    };
                    bad += attention_case(dims[di], 2, gqa[gi], bss[bi], pairs[pi][0], pairs[pi][1],
                                          specs, 5, 2, MODE_DECODE | MODE_PREFILL | MODE_SPLIT);
                    cases++;
                }
    /* mixed dtypes, a non-power-of-two group (Qwen2-7B: 28 / 4 = 7), one sequence alone */
    SeqSpec mix[3] = {{500, 1}, {64, 65}, {0, 33}};
    bad += attention_case(128, 2, 4, 16, DT_F32, DT_BF16, mix, 3, 0, 7);
    bad += attention_case(128, 2, 4, 16, DT_BF16, DT_F32, mix, 3, 0, 7);
    bad += attention_case(128, 4, 7, 16, DT_BF16, DT_BF16, mix, 3, 1, 7);
    bad += attention_case(64, 1, 16, 8, DT_F32, DT_F32, mix, 3, 0, 7);
    SeqSpec one[1] = {{0, 200}};
    bad += attention_case(128, 8, 4, 32, DT_BF16, DT_BF16, one, 1, 0, 7);
    SeqSpec big[2] = {{300, 1}, {40, 9}};
    bad += attention_case(512, 1, 2, 16, DT_F32, DT_F32, big, 2, 0, 7); /* large-D paths */
    cases += 6;
    print_message("attention sweep: %d batches x 3 modes, %d mismatching comparisons\n", cases,
                  bad);
    assert_int_equal(bad, 0);
}

/* Long contexts: many partitions of the split over the sequence (4k and 32k decode rows, a
 * chunk continuing a 4000-token prefix) for f32 and bf16, block sizes 16 and 32. */
static void test_attention_long(void **state) {
    (void)state;
    REQUIRE_GPU();
    if (quick())
        return;
    rng_seed(11);
    SeqSpec specs[6] = {{32767, 1}, {4095, 1}, {4094, 1}, {256, 1}, {0, 1}, {4000, 64}};
    int bad = 0;
    bad += attention_case(128, 2, 4, 16, DT_F32, DT_F32, specs, 6, 1, 7);
    bad += attention_case(128, 2, 4, 16, DT_BF16, DT_BF16, specs, 6, 1, 7);
    SeqSpec specs2[3] = {{4096, 1}, {2047, 1}, {3000, 100}};
    bad += attention_case(64, 2, 8, 32, DT_BF16, DT_BF16, specs2, 3, 0, 7);
    bad += attention_case(256, 1, 1, 32, DT_F32, DT_F32, specs2, 3, 0, 7);
    bad += attention_case(8, 2, 4, 8, DT_F32, DT_F32, specs2, 3, 0, 7);
    assert_int_equal(bad, 0);
}

/* Not a check: wall-clock timings of the attention kernels at Llama-3-8B head shapes (32 query
 * heads, 8 KV heads, head_dim 128, bf16, block size 16), printed for the record. */
static void test_attention_timing(void **state) {
    (void)state;
    REQUIRE_GPU();
    if (quick())
        return;
    rng_seed(12);
    const int D = 128, nkv = 8, nh = 32, bs = 16;
    KvLayout l = {
        .num_layers = 1, .num_kv_heads = nkv, .head_dim = D, .block_size = bs, .dtype = DT_BF16};
    const int batch = 64, ctx = 2048, prompt = 2048;
    int max_blocks = ctx / bs;
    int nblocks = batch * max_blocks;
    size_t block_bytes = (size_t)2 * bs * nkv * D * 2;
    void *cache = k_cuda_malloc(block_bytes * nblocks);
    k_cuda_memset(cache, 0x3C, block_bytes * nblocks); /* bf16 0x3C3C = 0.0115, not zeros */
    int32_t *tables = xmalloc(sizeof(int32_t) * nblocks);
    for (int i = 0; i < nblocks; i++)
        tables[i] = i;
    int32_t *qs = xmalloc(sizeof(int32_t) * (batch + 1)), *pos = xmalloc(sizeof(int32_t) * prompt);
    for (int s = 0; s <= batch; s++)
        qs[s] = s;
    for (int s = 0; s < batch; s++)
        pos[s] = ctx - 1;
    float *q = rand_vec((size_t)prompt * nh * D, -2, 2, DT_BF16);
    void *dq = upload_as(q, (size_t)prompt * nh * D, DT_BF16);
    void *dout = k_cuda_malloc((size_t)prompt * nh * D * 2);
    int32_t *dtab = upload(tables, sizeof(int32_t) * nblocks);
    int32_t *dqs = upload(qs, sizeof(int32_t) * (batch + 1));
    int32_t *dpos = upload(pos, sizeof(int32_t) * batch);
    AttnBatch db = {.num_tokens = batch,
                    .positions = dpos,
                    .num_seqs = batch,
                    .query_start = dqs,
                    .block_tables = dtab,
                    .max_blocks_per_seq = max_blocks};
    size_t ws_bytes = k_cuda_attention_workspace_bytes(&l, batch, nh, max_blocks);
    void *ws = k_cuda_malloc(ws_bytes ? ws_bytes : 16);
    float scale = 1.0f / sqrtf((float)D);
    const int iters = 20;
    for (int i = 0; i < 3; i++)
        k_cuda_attention_decode(dout, dq, DT_BF16, cache, &l, 0, &db, nh, scale, ws, ws_bytes,
                                NULL);
    k_cuda_synchronize();
    double t0 = pl_now();
    for (int i = 0; i < iters; i++)
        k_cuda_attention_decode(dout, dq, DT_BF16, cache, &l, 0, &db, nh, scale, ws, ws_bytes,
                                NULL);
    k_cuda_synchronize();
    double dec = (pl_now() - t0) / iters;
    double kv_bytes = (double)batch * ctx * nkv * D * 2 * 2;
    print_message("timing: decode batch %d ctx %d (32/8 heads, D 128, bf16): %.1f us, "
                  "KV read %.2f TB/s\n",
                  batch, ctx, dec * 1e6, kv_bytes / dec / 1e12);

    /* one fresh 2048-token prompt */
    k_cuda_free(dqs);
    k_cuda_free(dpos);
    free(pos);
    pos = xmalloc(sizeof(int32_t) * prompt);
    for (int i = 0; i < prompt; i++)
        pos[i] = i;
    int32_t qs1[2] = {0, prompt};
    dqs = upload(qs1, sizeof qs1);
    dpos = upload(pos, sizeof(int32_t) * prompt);
    AttnBatch pb = {.num_tokens = prompt,
                    .positions = dpos,
                    .num_seqs = 1,
                    .query_start = dqs,
                    .block_tables = dtab,
                    .max_blocks_per_seq = max_blocks};
    for (int i = 0; i < 2; i++)
        k_cuda_attention_prefill(dout, dq, DT_BF16, cache, &l, 0, &pb, nh, scale, NULL);
    k_cuda_synchronize();
    t0 = pl_now();
    for (int i = 0; i < 5; i++)
        k_cuda_attention_prefill(dout, dq, DT_BF16, cache, &l, 0, &pb, nh, scale, NULL);
    k_cuda_synchronize();
    double pre = (pl_now() - t0) / 5;
    double flops = 4.0 * nh * D * ((double)prompt * (prompt + 1) / 2);
    print_message("timing: prefill one %d-token prompt (32/8 heads, D 128, bf16): %.2f ms, "
                  "%.1f TFLOP/s (causal)\n",
                  prompt, pre * 1e3, flops / pre / 1e12);

    k_cuda_free(cache);
    k_cuda_free(dq);
    k_cuda_free(dout);
    k_cuda_free(dtab);
    k_cuda_free(dqs);
    k_cuda_free(dpos);
    k_cuda_free(ws);
    free(tables);
    free(qs);
    free(pos);
    free(q);
}

#endif /* PAGELLM_HAVE_CUDA */

#define UNIT(name) cmocka_unit_test(name),

int main(void) {
    const struct CMUnitTest tests[] = {CUDA_TESTS(UNIT)};
    const char *filter = getenv("PAGELLM_CUDA_TEST_FILTER");
    if (filter && *filter)
        cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
