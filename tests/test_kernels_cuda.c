/* test_kernels_cuda.c - the CUDA element-wise, norm, rope/KV-cache, copy and fill kernels
 * (include/kernels_cuda.h) against the CPU op of the same name (test_cpu_ops(), the reference),
 * on random data from fixed seeds, sweeping shapes, head dims, GQA ratios, block sizes,
 * padding slots and activation / cache dtypes f32 and bf16. The CPU op sees exactly the
 * values the GPU sees (inputs rounded to the GPU's dtype first); a result passes when
 * |gpu - ref| <= atol + rtol |ref| (f32: 1e-4, bf16: 1e-2), and the first mismatches are
 * printed. Outputs are poisoned (NaN) before each launch, so unwritten elements fail.
 * Attention has its own file (test_attention_cuda.c), as do the GEMMs, sampling and the
 * mixture-of-experts MLP (test_moe_cuda.c). The scatter of sampled ids into a step's input ids
 * (asynchronous scheduling) is here too.
 *
 * Without a GPU (CI) every test is skipped with "no CUDA device: skipped"; in a build without
 * the CUDA backend, with "CUDA backend not built: skipped". PAGELLM_CUDA_TEST_QUICK=1 shrinks
 * the sweeps (for runs under compute-sanitizer); PAGELLM_CUDA_TEST_FILTER=pattern runs the
 * matching tests only. */
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
#include "weights.h"
#ifdef PAGELLM_HAVE_CUDA
#include "kernels_cuda.h"
#endif
#include "cuda_test_util.h"

#define CUDA_TESTS(X)                                                                              \
    X(test_embedding)                                                                              \
    X(test_rmsnorm)                                                                                \
    X(test_add_rmsnorm)                                                                            \
    X(test_silu_mul)                                                                               \
    X(test_to_f32)                                                                                 \
    X(test_vocab_logits)                                                                           \
    X(test_gather_rows)                                                                            \
    X(test_rope)                                                                                   \
    X(test_kv_write)                                                                               \
    X(test_qkv_rope_cache)                                                                         \
    X(test_qkv_rope_cache_qk_norm)                                                                 \
    X(test_kv_cache_fp8)                                                                           \
    X(test_copy_blocks)                                                                            \
    X(test_scatter_tokens)                                                                         \
    X(test_dummy_fill)                                                                             \
    X(test_dummy_fill_fp8)                                                                         \
    X(test_gelu_tanh_mul)                                                                          \
    X(test_scale_softcap)                                                                          \
    X(test_rope_scaled)                                                                            \
    X(test_attention_capped)

#ifndef PAGELLM_HAVE_CUDA

CUDA_TESTS(SKIP_TEST)

#else

/* ---------------- helpers ---------------- */

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

static const DType acts[] = {DT_F32, DT_BF16, DT_F16};
enum { N_ACTS = sizeof acts / sizeof *acts };
static const DType wdts[] = {DT_F32, DT_F16, DT_BF16};

/* ---------------- embedding, norms, activation, gather ---------------- */

static void test_embedding(void **state) {
    (void)state;
    REQUIRE_GPU();
    const KernelOps *cpu = test_cpu_ops();
    rng_seed(1);
    const int hiddens[] = {8, 64, 100, 4096};
    int bad = 0;
    for (int ai = 0; ai < N_ACTS; ai++)
        for (int wi = 0; wi < 3; wi++)
            for (int hi = 0; hi < 4; hi++) {
                DType act = acts[ai];
                int V = 50, H = hiddens[hi], n = 9;
                Weight tab = make_weight(wdts[wi], 2, V, H, -2, 2);
                int32_t ids[9] = {0, 49, 3, 3, 17, 25, 48, 1, 0};
                float *ref = xmalloc(sizeof(float) * n * H), *got = xmalloc(sizeof(float) * n * H);
                cpu->embedding(cpu, ref, ids, n, &tab.host);
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
    const KernelOps *cpu = test_cpu_ops();
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
        cpu->add_rmsnorm(cpu, res_ref, with_delta ? delta : NULL, ref, &w.host, n, dim, eps);
        k_cuda_add_rmsnorm(d_x, with_delta ? d_delta : NULL, d_out, act, &w.dev, n, dim, eps, NULL);
        download_as(res_got, d_x, len, act);
        char rw[160];
        snprintf(rw, sizeof rw, "%s residual", what);
        bad += check_close(rw, res_got, res_ref, len, atol_of(act));
    } else {
        cpu->rmsnorm(cpu, ref, x, &w.host, n, dim, eps);
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
    for (int ai = 0; ai < N_ACTS; ai++)
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
    for (int ai = 0; ai < N_ACTS; ai++)
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
    const KernelOps *cpu = test_cpu_ops();
    rng_seed(4);
    const int shapes[][2] = {{1, 8}, {3, 100}, {16, 14336}, {5, 1}};
    int bad = 0;
    for (int ai = 0; ai < N_ACTS; ai++)
        for (int si = 0; si < 4; si++) {
            DType act = acts[ai];
            int n = shapes[si][0], dim = shapes[si][1];
            size_t len = (size_t)n * dim;
            /* rows of the fused projection: gate half in [-8, 8), up half in [-2, 2) */
            float *g = rand_vec(2 * len, -8, 8, act), *u = rand_vec(len, -2, 2, act);
            for (int r = 0; r < n; r++)
                memcpy(g + (size_t)r * 2 * dim + dim, u + (size_t)r * dim, sizeof(float) * dim);
            float *ref = xmalloc(len * sizeof(float)), *got = xmalloc(len * sizeof(float));
            cpu->silu_mul(cpu, ref, g, n, dim);
            void *dg = upload_as(g, 2 * len, act);
            void *dout = poisoned(len, act);
            k_cuda_silu_mul(dout, dg, act, n, dim, NULL);
            download_as(got, dout, len, act);
            char what[64];
            snprintf(what, sizeof what, "silu_mul act %s [%d, %d]", dn(act), n, dim);
            bad += check_close(what, got, ref, len, atol_of(act));
            k_cuda_free(dg);
            k_cuda_free(dout);
            free(g);
            free(u);
            free(ref);
            free(got);
        }
    assert_int_equal(bad, 0);
}

/* An fp32 op's output of n elements written at dout + off (off 0 or 1) in a poisoned buffer
 * of n + 2: the elements that differ from want, plus one if the op wrote beside its output
 * (the element before a shifted output, the one past the end). Frees dout. */
static int check_shifted_f32(const char *what, float *dout, const float *want, size_t n, int off) {
    float *got = xmalloc((n + 2) * sizeof(float));
    download_as(got, dout, n + 2, DT_F32);
    int bad = check_close(what, got + off, want, n, 0.0);
    if (!isnan(got[off + n]) || (off && !isnan(got[0]))) {
        print_error("%s: wrote outside the output\n", what);
        bad++;
    }
    free(got);
    k_cuda_free(dout);
    return bad;
}

/* Widening is exact: every element equals its input. Lengths around the 8-element groups and
 * a row of logits; the input or output one element off 16-byte alignment takes the scalar
 * kernel for all of it, an aligned pair the 8-wide one and the scalar tail. */
static void test_to_f32(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(12);
    const size_t lens[] = {1, 7, 8, 9, 131, 3 * 128256 + 5};
    int bad = 0;
    for (int ai = 0; ai < N_ACTS; ai++)
        for (size_t li = 0; li < sizeof lens / sizeof *lens; li++)
            for (int off = 0; off < 3; off++) {
                DType act = acts[ai];
                size_t n = lens[li];
                int in_off = off == 1, out_off = off == 2;
                float *x = rand_vec(n + 1, -60, 60, act);
                void *din = upload_as(x, n + 1, act);
                float *dout = poisoned(n + 2, DT_F32);
                k_cuda_to_f32(dout + out_off, (char *)din + in_off * pl_dtype_size(act), act, n,
                              NULL);
                char what[80];
                snprintf(what, sizeof what, "to_f32 %s n %zu in+%d out+%d", dn(act), n, in_off,
                         out_off);
                bad += check_shifted_f32(what, dout, x + in_off, n, out_off);
                k_cuda_free(din);
                free(x);
            }
    assert_int_equal(bad, 0);
}

/* The vocabulary-parallel LM head's reorder of parts[size, n, shard] into fp32 rows [n, vocab]
 * against the CPU op, exactly: slices a multiple of 8 (the model's VOCAB_SLICE_ALIGN) with
 * vocabularies a multiple of 8, of 4 (a 4-wide tail per row) and odd (the one-per-thread
 * kernel), a misaligned output (the same), a 128256 vocabulary at 2-256 rows (a decode step's
 * logits, by each kernel); padding ids are never written. */
static void test_vocab_logits(void **state) {
    (void)state;
    REQUIRE_GPU();
    const KernelOps *cpu = test_cpu_ops();
    rng_seed(13);
    const int cases[][4] = {/* vocab, ranks, rows, output offset */
                            {512, 2, 3, 0},     {1004, 2, 5, 0}, {1004, 3, 2, 0},
                            {509, 2, 4, 0},     {1000, 4, 1, 1}, {128256, 2, 3, 0},
                            {128256, 4, 2, 0},  {40, 1, 7, 0},   {128256, 2, 256, 0},
                            {128256, 2, 256, 1}};
    int bad = 0;
    for (int ai = 0; ai < N_ACTS; ai++)
        for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
            DType act = acts[ai];
            const int vocab = cases[ci][0], size = cases[ci][1], n = cases[ci][2],
                      off = cases[ci][3];
            const int shard = ((vocab + size - 1) / size + 7) & ~7;
            const size_t np = (size_t)size * n * shard, nout = (size_t)n * vocab;
            float *parts = rand_vec(np, -30, 30, act);
            float *ref = xmalloc(nout * sizeof(float));
            cpu->vocab_logits_f32(cpu, ref, parts, n, vocab, shard, size);
            void *dparts = upload_as(parts, np, act);
            float *dout = poisoned(nout + 2, DT_F32);
            test_cuda_ops(act)->vocab_logits_f32(test_cuda_ops(act), dout + off, dparts, n, vocab,
                                                 shard, size);
            char what[96];
            snprintf(what, sizeof what, "vocab_logits %s vocab %d ranks %d rows %d out+%d", dn(act),
                     vocab, size, n, off);
            bad += check_shifted_f32(what, dout, ref, nout, off);
            k_cuda_free(dparts);
            free(parts);
            free(ref);
        }
    assert_int_equal(bad, 0);
}

static void test_gather_rows(void **state) {
    (void)state;
    REQUIRE_GPU();
    const KernelOps *cpu = test_cpu_ops();
    rng_seed(5);
    int bad = 0;
    for (int ai = 0; ai < N_ACTS; ai++) {
        DType act = acts[ai];
        int rows_in = 37, dim = 96, n = 6;
        int32_t rows[6] = {36, 0, 5, 5, 17, 2};
        float *in = rand_vec((size_t)rows_in * dim, -5, 5, act);
        float *ref = xmalloc(sizeof(float) * n * dim), *got = xmalloc(sizeof(float) * n * dim);
        cpu->gather_rows(cpu, ref, in, rows, n, dim);
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
    const KernelOps *cpu = test_cpu_ops();
    rng_seed(6);
    const int dims[] = {8, 64, 80, 96, 128, 256};
    const int gqa[] = {1, 4, 8};
    int bad = 0;
    for (int ai = 0; ai < N_ACTS; ai++)
        for (int di = 0; di < 6; di++)
            for (int gi = 0; gi < 3; gi++) {
                DType act = acts[ai];
                /* head_dim 128: enough (token, head) pairs for several heads per block */
                int D = dims[di], nkv = 2, nh = nkv * gqa[gi], n = D == 128 ? 203 : 11;
                RopePair rp = make_rope(D, gi == 1);
                int32_t pos[203];
                for (int t = 0; t < n; t++)
                    pos[t] = t < 3 ? t : rnd_int(32768);
                size_t nq = (size_t)n * nh * D, nk = (size_t)n * nkv * D;
                float *q = rand_vec(nq, -2, 2, act), *k = rand_vec(nk, -2, 2, act);
                void *dq = upload_as(q, nq, act), *dk = upload_as(k, nk, act);
                int32_t *dpos = upload(pos, sizeof(int32_t) * n);
                cpu->rope(cpu, q, k, pos, n, nh, nkv, &rp.host);
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

/* One qkv_rope_cache (or kv_write alone) case against cpu rope then cpu kv_write on an F32
 * cache: q, k and the whole cache (untouched slots included) are compared. With qk (fused
 * only: Qwen3's q/k norms of dtype qk_dt), against the CPU qkv_rope_cache with them. */
static int kv_case_qk(DType act, DType cdt, int D, int nkv, int G, int bs, int fused, int qk,
                      DType qk_dt) {
    const KernelOps *cpu = test_cpu_ops();
    KvLayout l = {
        .num_layers = 3, .num_kv_heads = nkv, .head_dim = D, .block_size = bs, .dtype = DT_F32};
    int layer = 1, nblocks = 7, nh = nkv * G, n = 2 * bs + 3;
    size_t half = (size_t)bs * nkv * D, block = (size_t)l.num_layers * 2 * half;
    size_t cache_n = block * nblocks;
    float *cache = rand_vec(cache_n, -1, 1, cdt);
    /* distinct random slots, every 5th token padding */
    int nslots = nblocks * bs;
    int *perm = rnd_perm(nslots);
    int64_t *slots = xmalloc(sizeof(int64_t) * n);
    int32_t *pos = xmalloc(sizeof(int32_t) * n);
    for (int t = 0; t < n; t++) {
        slots[t] = t % 5 == 4 ? -1 : perm[t];
        pos[t] = rnd_int(8192);
    }
    size_t nq = (size_t)n * nh * D, nk = (size_t)n * nkv * D;
    float *q = rand_vec(nq, -2, 2, act), *k = rand_vec(nk, -2, 2, act),
          *v = rand_vec(nk, -2, 2, act);
    size_t qd = (size_t)nh * D, kvd = (size_t)nkv * D, row = qd + 2 * kvd;
    float *qkv = xmalloc((size_t)n * row * sizeof(float)); /* the fused projection's rows */
    for (int t = 0; t < n; t++) {
        memcpy(qkv + t * row, q + t * qd, qd * sizeof(float));
        memcpy(qkv + t * row + qd, k + t * kvd, kvd * sizeof(float));
        memcpy(qkv + t * row + qd + kvd, v + t * kvd, kvd * sizeof(float));
    }
    void *dqkv = upload_as(qkv, (size_t)n * row, act), *dq = poisoned(nq, act);
    void *dk = upload_as(k, nk, act), *dv = upload_as(v, nk, act);
    void *dcache = upload_as(cache, cache_n, cdt);
    int64_t *dslots = upload(slots, sizeof(int64_t) * n);
    int32_t *dpos = upload(pos, sizeof(int32_t) * n);
    RopePair rp = make_rope(D, 0);
    KvLayout dl = l;
    dl.dtype = cdt;
    Weight qw = {0}, kw = {0};
    if (qk) {
        qw = make_weight(qk_dt, 1, D, 0, 0.5f, 1.5f);
        kw = make_weight(qk_dt, 1, D, 0, 0.5f, 1.5f);
        QkNorm hn = {qw.host, kw.host, 1e-6f}, dn_ = {qw.dev, kw.dev, 1e-6f};
        k_cuda_qkv_rope_cache(dq, dqkv, act, dpos, dslots, n, nh, &rp.dev, &dn_, dcache, &dl, layer,
                              NULL);
        /* the reference: the CPU op itself on the same rows (k left rotated in qkv) */
        cpu->qkv_rope_cache(cpu, q, qkv, pos, slots, n, nh, &rp.host, &hn, cache, &l, layer);
        for (int t = 0; t < n; t++)
            memcpy(k + t * kvd, qkv + t * row + qd, kvd * sizeof(float));
    } else if (fused) {
        cpu->rope(cpu, q, k, pos, n, nh, nkv, &rp.host);
        k_cuda_qkv_rope_cache(dq, dqkv, act, dpos, dslots, n, nh, &rp.dev, NULL, dcache, &dl, layer,
                              NULL);
    } else {
        k_cuda_kv_write(dcache, &dl, layer, dk, dv, act, dslots, n, NULL);
    }
    if (!qk) {
        /* what the CPU sequence stores: k as rounded to act by the rope, in the cache's dtype */
        for (size_t i = 0; i < nk; i++) {
            k[i] = round_to(k[i], act);
        }
        cpu->kv_write(cpu, cache, &l, layer, k, v, slots, n);
    }
    int bad = 0;
    char what[128];
    snprintf(what, sizeof what, "%s act %s cache %s D %d nkv %d G %d bs %d%s%s",
             fused ? "qkv_rope_cache" : "kv_write", dn(act), dn(cdt), D, nkv, G, bs,
             qk ? " qk_norm " : "", qk ? dn(qk_dt) : "");
    float *got = xmalloc(cache_n * sizeof(float));
    download_as(got, dcache, cache_n, cdt);
    char cw[160];
    snprintf(cw, sizeof cw, "%s: cache", what);
    bad += check_close(cw, got, cache, cache_n, atol_of(cdt != DT_F32 ? cdt : act));
    if (fused) {
        float *gq = xmalloc(nq * sizeof(float)), *gk = xmalloc(nk * sizeof(float));
        download_as(gq, dq, nq, act);
        float *gqkv = xmalloc((size_t)n * row * sizeof(float));
        download_as(gqkv, dqkv, (size_t)n * row, act);
        for (int t = 0; t < n; t++) /* k rotated in place in the qkv rows */
            memcpy(gk + t * kvd, gqkv + t * row + qd, kvd * sizeof(float));
        free(gqkv);
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
    free(qkv);
    k_cuda_free(dqkv);
    k_cuda_free(dq);
    k_cuda_free(dk);
    k_cuda_free(dv);
    k_cuda_free(dcache);
    k_cuda_free(dslots);
    k_cuda_free(dpos);
    free_rope(&rp);
    if (qk) {
        free_weight(&qw);
        free_weight(&kw);
    }
    return bad;
}

static int kv_case(DType act, DType cdt, int D, int nkv, int G, int bs, int fused) {
    return kv_case_qk(act, cdt, D, nkv, G, bs, fused, 0, DT_F32);
}

static void kv_sweep(int fused) {
    const int dims[] = {8, 64, 128, 256};
    const int kvh[] = {1, 2, 8};
    const int bss[] = {8, 16, 32};
    int bad = 0;
    for (int ai = 0; ai < N_ACTS; ai++)
        for (int ci = 0; ci < N_ACTS; ci++)
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

static void test_qkv_rope_cache(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(8);
    kv_sweep(1);
}

/* Qwen3's per-head q/k RMSNorm before the rotation: head dims with pairs that fill a warp,
 * do not (48: 24 pairs) and span several passes (256), GQA, norm weights in each dtype. */
/* kv_write and qkv_rope_cache into an fp8 cache (scales 0.02 / 3 on the written layer, so that
 * some k saturate), against the CPU ops on the same bytes with k rounded to act as the rope
 * leaves it: kv_write's codes equal exactly; the fused op's may differ by one code where the
 * GPU's rotated k rounds to act differently (counted, at most 1% of them), and bytes of other
 * slots and layers stay untouched. */
static void test_kv_cache_fp8(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(23);
    const KernelOps *cpu = test_cpu_ops();
    const DType acts[] = {DT_F32, DT_BF16, DT_F16};
    const float scales[6] = {1, 1, 0.02f, 3.0f, 1, 1};
    int bad = 0;
    for (int ai = 0; ai < 3; ai++)
        for (int fused = 0; fused < 2; fused++)
            for (int di = 0; di < 2; di++) {
                DType act = acts[ai];
                int D = di ? 128 : 40, nkv = 2, nh = 8, bs = 16, nblocks = 5, n = 37, layer = 1;
                KvLayout l = {.num_layers = 3,
                              .num_kv_heads = nkv,
                              .head_dim = D,
                              .block_size = bs,
                              .dtype = DT_F8E4M3,
                              .kv_scale = scales};
                size_t cache_n = k_kv_block_elems(&l) * nblocks;
                uint8_t *want = xmalloc(cache_n), *got = xmalloc(cache_n);
                memset(want, 0x5a, cache_n);
                int *perm = rnd_perm(nblocks * bs);
                int64_t slots[37];
                int32_t pos[37];
                for (int t = 0; t < n; t++) {
                    slots[t] = t % 5 == 4 ? -1 : perm[t];
                    pos[t] = rnd_int(4096);
                }
                size_t qd = (size_t)nh * D, kvd = (size_t)nkv * D, row = qd + 2 * kvd;
                float *qkv = rand_vec((size_t)n * row, -12, 12, act); /* k / 0.02 > 448 often */
                float *k = xmalloc(n * kvd * sizeof(float)), *v = xmalloc(n * kvd * sizeof(float));
                float *q = xmalloc(n * qd * sizeof(float));
                for (int t = 0; t < n; t++) {
                    memcpy(q + t * qd, qkv + t * row, qd * sizeof(float));
                    memcpy(k + t * kvd, qkv + t * row + qd, kvd * sizeof(float));
                    memcpy(v + t * kvd, qkv + t * row + qd + kvd, kvd * sizeof(float));
                }
                void *dcache = upload(want, cache_n), *dqkv = upload_as(qkv, (size_t)n * row, act);
                void *dk = upload_as(k, n * kvd, act), *dv = upload_as(v, n * kvd, act);
                void *dq = k_cuda_malloc(n * qd * pl_dtype_size(act));
                int64_t *dslots = upload(slots, sizeof slots);
                int32_t *dpos = upload(pos, sizeof pos);
                RopePair rp = make_rope(D, 0);
                if (fused) {
                    cpu->rope(cpu, q, k, pos, n, nh, nkv, &rp.host);
                    for (size_t i = 0; i < n * kvd; i++)
                        k[i] = round_to(k[i], act);
                    k_cuda_qkv_rope_cache(dq, dqkv, act, dpos, dslots, n, nh, &rp.dev, NULL, dcache,
                                          &l, layer, NULL);
                } else {
                    k_cuda_kv_write(dcache, &l, layer, dk, dv, act, dslots, n, NULL);
                }
                cpu->kv_write(cpu, want, &l, layer, k, v, slots, n);
                k_cuda_memcpy(got, dcache, cache_n);
                int diff = 0, far = 0, sat = 0;
                for (size_t i = 0; i < cache_n; i++) {
                    sat += (want[i] & 0x7f) == 0x7e;
                    if (got[i] == want[i])
                        continue;
                    diff++;
                    int a = got[i] & 0x7f, b = want[i] & 0x7f;
                    far += (got[i] ^ want[i]) & 0x80 ? a + b > 1 : abs(a - b) > 1;
                }
                if (far || (!fused && diff) || diff > (int)(n * kvd / 50) || sat == 0) {
                    print_error("kv fp8 %s act %s D %d: %d codes differ (%d by more than one), "
                                "%d saturated\n",
                                fused ? "qkv_rope_cache" : "kv_write", dn(act), D, diff, far, sat);
                    bad++;
                }
                free(want);
                free(got);
                free(perm);
                free(qkv);
                free(k);
                free(v);
                free(q);
                k_cuda_free(dcache);
                k_cuda_free(dqkv);
                k_cuda_free(dk);
                k_cuda_free(dv);
                k_cuda_free(dq);
                k_cuda_free(dslots);
                k_cuda_free(dpos);
                free_rope(&rp);
            }
    assert_int_equal(bad, 0);
}

static void test_qkv_rope_cache_qk_norm(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(18);
    const int dims[] = {48, 64, 128, 256};
    const int kvh[] = {1, 2, 8};
    int bad = 0;
    for (int ai = 0; ai < N_ACTS; ai++)
        for (int di = 0; di < 4; di++)
            for (int hi = 0; hi < 3; hi++)
                bad += kv_case_qk(acts[ai], acts[(ai + hi) % N_ACTS], dims[di], kvh[hi],
                                  hi == 2 ? 4 : 2, 16, 1, 1, wdts[(di + hi) % 3]);
    assert_int_equal(bad, 0);
}

/* ---------------- copy_blocks ---------------- */

static void test_copy_blocks(void **state) {
    (void)state;
    REQUIRE_GPU();
    const KernelOps *cpu = test_cpu_ops();
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
        cpu->copy_blocks(cpu, dst, src, pairs, n, bb);
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
        cpu->copy_blocks(cpu, src, src, pairs, n, bb);
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

/* ---------------- scatter_tokens ---------------- */

/* Input ids taken from the previous step's sampled tokens (asynchronous scheduling): distinct
 * destinations in a shuffled order, any source rows; untouched ids keep their values. */
static void test_scatter_tokens(void **state) {
    (void)state;
    REQUIRE_GPU();
    const KernelOps *cpu = test_cpu_ops();
    rng_seed(10);
    enum { T = 4096, ROWS = 256 };
    const int counts[] = {1, 7, 256, 300, 2048};
    int bad = 0;
    for (int ci = 0; ci < 5; ci++) {
        int n = counts[ci];
        int32_t *tokens = xmalloc(T * sizeof(int32_t)), *sampled = xmalloc(ROWS * sizeof(int32_t));
        int32_t *pairs = xmalloc((size_t)n * 2 * sizeof(int32_t));
        for (int i = 0; i < T; i++)
            tokens[i] = rnd_int(128256);
        for (int i = 0; i < ROWS; i++)
            sampled[i] = rnd_int(128256);
        int *dst = rnd_perm(T);
        for (int i = 0; i < n; i++) {
            pairs[2 * i] = dst[i];
            pairs[2 * i + 1] = rnd_int(ROWS);
        }
        int32_t *dtokens = upload(tokens, T * sizeof(int32_t));
        int32_t *dsampled = upload(sampled, ROWS * sizeof(int32_t));
        int32_t *dpairs = upload(pairs, (size_t)n * 2 * sizeof(int32_t));
        cpu->scatter_tokens(cpu, tokens, sampled, pairs, n);
        k_cuda_scatter_tokens(dtokens, dsampled, dpairs, n, NULL);
        int32_t *got = xmalloc(T * sizeof(int32_t));
        k_cuda_memcpy(got, dtokens, T * sizeof(int32_t));
        if (memcmp(got, tokens, T * sizeof(int32_t)) != 0) {
            print_error("scatter_tokens of %d ids differs\n", n);
            bad++;
        }
        free(tokens);
        free(sampled);
        free(pairs);
        free(dst);
        free(got);
        k_cuda_free(dtokens);
        k_cuda_free(dsampled);
        k_cuda_free(dpairs);
    }
    assert_int_equal(bad, 0);
}

/* Dummy weights filled on the GPU equal the host fill: bit for bit in the checkpoint's dtype
 * (F32 activations keep it), and as the bf16 rounding of the host's F32 values when the
 * activations are bf16. */
static void test_dummy_fill(void **state) {
    (void)state;
    REQUIRE_GPU();
    ModelConfig cfg = {.hidden_size = 64,
                       .intermediate_size = 96,
                       .num_layers = 2,
                       .num_heads = 4,
                       .num_kv_heads = 2,
                       .head_dim = 16,
                       .vocab_size = 300,
                       .qkv_bias = 1,
                       .torch_dtype = DT_F32};
    ModelWeights host, dev;
    int bad = 0;
    for (int ai = 0; ai < N_ACTS; ai++) {
        const KernelOps *ops = test_cuda_ops(acts[ai]);
        assert_int_equal(weights_dummy(&cfg, 1234, NULL, NULL, &host), PL_OK);
        assert_int_equal(weights_dummy(&cfg, 1234, ops, NULL, &dev), PL_OK);
        const Tensor *h[] = {&host.embed,           &host.lm_head,        &host.final_norm,
                             &host.layers[1].wqkv,  &host.layers[1].bqkv, &host.layers[0].w_gate_up,
                             &host.layers[0].w_down};
        const Tensor *d[] = {&dev.embed,           &dev.lm_head,        &dev.final_norm,
                             &dev.layers[1].wqkv,  &dev.layers[1].bqkv, &dev.layers[0].w_gate_up,
                             &dev.layers[0].w_down};
        for (size_t t = 0; t < sizeof h / sizeof *h; t++) {
            size_t n = (size_t)h[t]->shape[0] * (h[t]->ndim == 2 ? (size_t)h[t]->shape[1] : 1);
            assert_int_equal(d[t]->dtype, acts[ai]);
            size_t es = pl_dtype_size(d[t]->dtype);
            unsigned char *got = xmalloc(n * es);
            k_cuda_memcpy(got, d[t]->data, n * es);
            for (size_t i = 0; i < n; i++) {
                float want = ((const float *)h[t]->data)[i];
                uint16_t h16 = acts[ai] == DT_BF16 ? pl_f32_to_bf16(want) : pl_f32_to_f16(want);
                int same = acts[ai] == DT_F32 ? !memcmp(got + i * 4, &want, 4)
                                              : ((const uint16_t *)got)[i] == h16;
                if (!same && bad++ < 5)
                    print_error("dummy fill %s tensor %zu element %zu differs\n", dn(acts[ai]), t,
                                i);
            }
            free(got);
        }
        weights_free(&host);
        weights_free(&dev);
    }
    assert_int_equal(bad, 0);
}

/* fp8 dummy weights (quantization: fp8, load-format dummy) made on the GPU: the projections'
 * e4m3 codes and their scales equal the host fill's, bit for bit. */
static void test_dummy_fill_fp8(void **state) {
    (void)state;
    REQUIRE_GPU();
    ModelConfig cfg = {.hidden_size = 64,
                       .intermediate_size = 96,
                       .num_layers = 2,
                       .num_heads = 4,
                       .num_kv_heads = 2,
                       .head_dim = 16,
                       .vocab_size = 300,
                       .torch_dtype = DT_BF16};
    cfg.quant.method = QUANT_ONLINE_FP8;
    ModelWeights host, dev;
    int bad = 0;
    const KernelOps *ops = test_cuda_ops(DT_BF16);
    assert_int_equal(weights_dummy(&cfg, 99, NULL, NULL, &host), PL_OK);
    assert_int_equal(weights_dummy(&cfg, 99, ops, NULL, &dev), PL_OK);
    for (int l = 0; l < 2; l++) {
        const Tensor *h[] = {&host.layers[l].wqkv, &host.layers[l].wo, &host.layers[l].w_gate_up,
                             &host.layers[l].w_down};
        const Tensor *d[] = {&dev.layers[l].wqkv, &dev.layers[l].wo, &dev.layers[l].w_gate_up,
                             &dev.layers[l].w_down};
        for (size_t t = 0; t < 4; t++) {
            size_t N = (size_t)h[t]->shape[0], n = N * (size_t)h[t]->shape[1];
            assert_int_equal(d[t]->dtype, DT_F8E4M3);
            assert_int_equal(d[t]->fp8.kind, FP8_SCALE_CHANNEL);
            uint8_t *got = xmalloc(n);
            float *sc = xmalloc(N * sizeof *sc);
            k_cuda_memcpy(got, d[t]->data, n);
            k_cuda_memcpy(sc, d[t]->fp8.w_scale, N * sizeof *sc);
            for (size_t i = 0; i < n; i++)
                if (got[i] != ((const uint8_t *)h[t]->data)[i] && bad++ < 5)
                    print_error("fp8 dummy layer %d tensor %zu element %zu: %#x, host %#x\n", l, t,
                                i, got[i], ((const uint8_t *)h[t]->data)[i]);
            for (size_t r = 0; r < N; r++)
                if (sc[r] != h[t]->fp8.w_scale[r] && bad++ < 5)
                    print_error("fp8 dummy layer %d tensor %zu scale %zu differs\n", l, t, r);
            free(got);
            free(sc);
        }
    }
    weights_free(&host);
    weights_free(&dev);
    assert_int_equal(bad, 0);
}

/* ---------------- Gemma's and Phi-3's ops ---------------- */

static void test_gelu_tanh_mul(void **state) {
    (void)state;
    REQUIRE_GPU();
    const KernelOps *cpu = test_cpu_ops();
    rng_seed(41);
    const int shapes[][2] = {{1, 8}, {3, 100}, {16, 9216}, {5, 1}};
    int bad = 0;
    for (int ai = 0; ai < N_ACTS; ai++)
        for (int si = 0; si < 4; si++) {
            DType act = acts[ai];
            int n = shapes[si][0], dim = shapes[si][1];
            size_t len = (size_t)n * dim;
            float *g = rand_vec(2 * len, -6, 6, act);
            float *ref = xmalloc(len * sizeof(float)), *got = xmalloc(len * sizeof(float));
            cpu->gelu_tanh_mul(cpu, ref, g, n, dim);
            void *dg = upload_as(g, 2 * len, act), *dout = poisoned(len, act);
            k_cuda_gelu_tanh_mul(dout, dg, act, n, dim, NULL);
            download_as(got, dout, len, act);
            char what[64];
            snprintf(what, sizeof what, "gelu_tanh_mul act %s [%d, %d]", dn(act), n, dim);
            bad += check_close(what, got, ref, len, atol_of(act));
            k_cuda_free(dg);
            k_cuda_free(dout);
            free(g);
            free(ref);
            free(got);
        }
    assert_int_equal(bad, 0);
}

static void test_scale_softcap(void **state) {
    (void)state;
    REQUIRE_GPU();
    const KernelOps *cpu = test_cpu_ops();
    rng_seed(42);
    int bad = 0;
    const size_t n = 4099;
    for (int ai = 0; ai < N_ACTS; ai++) {
        DType act = acts[ai];
        float s = round_to(sqrtf(2304.0f), act);
        float *x = rand_vec(n, -3, 3, act), *got = xmalloc(n * sizeof(float));
        void *dx = upload_as(x, n, act);
        k_cuda_scale(dx, act, n, s, NULL);
        cpu->scale(cpu, x, n, s);
        download_as(got, dx, n, act);
        bad += check_close("scale", got, x, n, atol_of(act));
        k_cuda_free(dx);
        free(x);
        free(got);
    }
    float *l = rand_vec(n, -80, 80, DT_F32), *got = xmalloc(n * sizeof(float));
    float *dl = upload(l, n * sizeof(float));
    k_cuda_logits_softcap(dl, n, 30.0f, NULL);
    cpu->logits_softcap(cpu, l, n, 30.0f);
    download_as(got, dl, n, DT_F32);
    bad += check_close("logits_softcap", got, l, n, 1e-5);
    k_cuda_free(dl);
    free(l);
    free(got);
    assert_int_equal(bad, 0);
}

/* Partial rotation (3/4 of the head), a cos / sin factor and LongRoPE's long table from
 * position 5 on: k_cuda_rope and the rotation of qkv_rope_cache against the CPU op. */
static void test_rope_scaled(void **state) {
    (void)state;
    REQUIRE_GPU();
    const KernelOps *cpu = test_cpu_ops();
    rng_seed(43);
    int bad = 0;
    const int dims[] = {16, 64, 128};
    for (int ai = 0; ai < N_ACTS; ai++)
        for (int di = 0; di < 3; di++) {
            DType act = acts[ai];
            int D = dims[di], rot = D * 3 / 4 / 2 * 2, half = rot / 2, nh = 4, nkv = 2, n = 13;
            float *inv = xmalloc(sizeof(float) * half), *lng = xmalloc(sizeof(float) * half);
            RopeScaling sc = {.type = ROPE_LONGROPE,
                              .original_max_position = 5,
                              .max_position = 80,
                              .num_factors = half};
            for (int i = 0; i < half; i++) {
                sc.short_factor[i] = 1.0f + 0.1f * i;
                sc.long_factor[i] = 1.0f + 2.0f * i;
            }
            float att = k_rope_freqs(inv, lng, rot, 10000.0f, &sc);
            float *dinv = upload(inv, sizeof(float) * half),
                  *dlng = upload(lng, sizeof(float) * half);
            Rope host = {.head_dim = D,
                         .inv_freq = inv,
                         .rot_dim = rot,
                         .attn_factor = att,
                         .long_inv_freq = lng,
                         .long_from = 5};
            Rope dev = host;
            dev.inv_freq = dinv;
            dev.long_inv_freq = dlng;
            int32_t pos[13];
            for (int t = 0; t < n; t++)
                pos[t] = t < 8 ? t : rnd_int(4096);
            size_t nq = (size_t)n * nh * D, nk = (size_t)n * nkv * D;
            float *q = rand_vec(nq, -2, 2, act), *k = rand_vec(nk, -2, 2, act);
            void *dq = upload_as(q, nq, act), *dk = upload_as(k, nk, act);
            int32_t *dpos = upload(pos, sizeof(int32_t) * n);
            cpu->rope(cpu, q, k, pos, n, nh, nkv, &host);
            k_cuda_rope(dq, dk, act, dpos, n, nh, nkv, &dev, NULL);
            float *gq = xmalloc(nq * sizeof(float)), *gk = xmalloc(nk * sizeof(float));
            download_as(gq, dq, nq, act);
            download_as(gk, dk, nk, act);
            char what[96];
            snprintf(what, sizeof what, "scaled rope act %s D %d rot %d q", dn(act), D, rot);
            bad += check_close(what, gq, q, nq, atol_of(act));
            bad += check_close(what, gk, k, nk, atol_of(act));
            free(q);
            free(k);
            free(gq);
            free(gk);
            free(inv);
            free(lng);
            k_cuda_free(dq);
            k_cuda_free(dk);
            k_cuda_free(dpos);
            k_cuda_free(dinv);
            k_cuda_free(dlng);
        }
    assert_int_equal(bad, 0);
}

/* Attention with soft-capped scores and a sliding window (gemma.cu's kernel, which ops.cu
 * routes such calls to) against the CPU op: a prompt chunk of 7 rows and a decode row over
 * random block tables, every dtype pair, head dims 64 and 256, GQA 1 and 4. */
static void test_attention_capped(void **state) {
    (void)state;
    REQUIRE_GPU();
    const KernelOps *cpu = test_cpu_ops();
    rng_seed(44);
    int bad = 0;
    const int dims[] = {64, 256}, gqa[] = {1, 4};
    const float caps[] = {0.0f, 2.0f, 50.0f};
    const int windows[] = {0, 5, 17};
    for (int ai = 0; ai < N_ACTS; ai++)
        for (int di = 0; di < 2; di++)
            for (int ci = 0; ci < 3; ci++) {
                DType act = acts[ai];
                int D = dims[di], nkv = 2, nh = nkv * gqa[ci % 2], bs = 16, nb = 8, mb = 4;
                float cap = caps[ci];
                int window = windows[(ci + di) % 3];
                if (cap == 0 && window == 0)
                    window = 9;
                KvLayout l = {.num_layers = 2,
                              .num_kv_heads = nkv,
                              .head_dim = D,
                              .block_size = bs,
                              .dtype = act};
                size_t ce = k_kv_block_elems(&l) * nb;
                float *cache = rand_vec(ce, -1, 1, act);
                int *perm = rnd_perm(nb);
                int32_t tables[2 * 4];
                for (int i = 0; i < 8; i++)
                    tables[i] = perm[i];
                /* sequence 0: rows at positions 40..46, sequence 1: one row at position 22 */
                int32_t pos[8], qs[3] = {0, 7, 8};
                for (int t = 0; t < 7; t++)
                    pos[t] = 40 + t;
                pos[7] = 22;
                size_t nq = (size_t)8 * nh * D;
                float *q = rand_vec(nq, -1, 1, act);
                float *ref = xmalloc(nq * sizeof(float)), *got = xmalloc(nq * sizeof(float));
                AttnBatch hb = {.num_tokens = 8,
                                .positions = pos,
                                .num_seqs = 2,
                                .query_start = qs,
                                .block_tables = tables,
                                .max_blocks_per_seq = mb};
                KvLayout lf = l;
                lf.dtype = DT_F32;
                float scale = 1.0f / sqrtf((float)D);
                cpu->attention(cpu, ref, q, cache, &lf, 1, &hb, nh, scale, cap, window);
                void *dcache = upload_as(cache, ce, act), *dq = upload_as(q, nq, act);
                void *dout = poisoned(nq, act);
                AttnBatch db = hb;
                db.positions = upload(pos, sizeof pos);
                db.query_start = upload(qs, sizeof qs);
                db.block_tables = upload(tables, sizeof tables);
                k_cuda_attention_capped(dout, dq, act, dcache, &l, 1, &db, nh, scale, cap, window,
                                        NULL);
                download_as(got, dout, nq, act);
                char what[96];
                snprintf(what, sizeof what, "capped attention %s D %d nh %d cap %g window %d",
                         dn(act), D, nh, cap, window);
                bad += check_close(what, got, ref, nq, atol_of(act));
                k_cuda_free(dcache);
                k_cuda_free(dq);
                k_cuda_free(dout);
                k_cuda_free((void *)db.positions);
                k_cuda_free((void *)db.query_start);
                k_cuda_free((void *)db.block_tables);
                free(cache);
                free(perm);
                free(q);
                free(ref);
                free(got);
            }
    assert_int_equal(bad, 0);
}

#endif /* PAGELLM_HAVE_CUDA */

int main(void) {
    const struct CMUnitTest tests[] = {CUDA_TESTS(UNIT)};
    RUN_CUDA_TESTS(tests);
}
