/* test_qkv_attention_cuda.c - decode attention fused with its RoPE and cache store
 * (k_cuda_qkv_attention_decode, kernels/cuda/attention_decode_tc.cu) against the two calls it
 * replaces, k_cuda_qkv_rope_cache then k_cuda_attention_decode, bit for bit: the output and the
 * whole cache (both layers, every block, untouched slots included) must be equal.
 *
 * Random data from fixed seeds: head_dim 128, bf16 and f16 (the tensor-core kernel, fused),
 * f32 and head_dim 64 (not fused: the two calls inside), 1, 2 and 8 KV heads of 1, 4 and 8
 * query heads, block sizes 8, 16 and 32, random non-contiguous block tables, contexts from 1
 * to 3000 (rows of several partitions, where only the last one stores the new token), and
 * padding rows as the engine's graphs have them (position 0, slot -1, block 0). A fused launch
 * that stored the token in the wrong place or too late, or rotated q or k differently, would
 * differ from the two calls.
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

#define QKV_ATTN_TESTS(X) X(test_qkv_attention_decode)

#ifndef PAGELLM_HAVE_CUDA

QKV_ATTN_TESTS(SKIP_TEST)

#else

/* Bytes where two device buffers differ; the first printed. */
static int differ(const char *what, const void *a, const void *b, size_t bytes) {
    unsigned char *ha = xmalloc(bytes), *hb = xmalloc(bytes);
    k_cuda_memcpy(ha, a, bytes);
    k_cuda_memcpy(hb, b, bytes);
    int bad = 0;
    for (size_t i = 0; i < bytes; i++)
        if (ha[i] != hb[i] && bad++ == 0)
            print_error("%s: differs first at byte %zu\n", what, i);
    free(ha);
    free(hb);
    return bad;
}

/* One case: rows decode rows of random contexts up to max_ctx, then pad padding rows. */
static int one_case(DType act, int D, int nkv, int G, int bs, int rows, int pad, int max_ctx) {
    const int nh = nkv * G, L = 2, layer = 1, n = rows + pad;
    const size_t es = pl_dtype_size(act);
    int max_blocks = (max_ctx + bs - 1) / bs, used = 0;
    int *ctx = xmalloc(sizeof(int) * (size_t)rows);
    for (int r = 0; r < rows; r++) {
        ctx[r] = 1 + rnd_int(max_ctx);
        used += (ctx[r] + bs - 1) / bs;
    }
    const int nblocks = used + 1;
    int *perm = rnd_perm(nblocks);
    int32_t *tables = xmalloc(sizeof(int32_t) * (size_t)n * max_blocks);
    int32_t *qs = xmalloc(sizeof(int32_t) * (size_t)(n + 1)), *pos = xmalloc(sizeof(int32_t) * n);
    int64_t *slots = xmalloc(sizeof(int64_t) * (size_t)n);
    for (int r = 0, next = 0; r < n; r++) {
        const int nb = r < rows ? (ctx[r] + bs - 1) / bs : 1;
        for (int i = 0; i < max_blocks; i++)
            tables[(size_t)r * max_blocks + i] = i < nb ? (r < rows ? perm[next++] : 0) : -1;
        qs[r] = r;
        pos[r] = r < rows ? ctx[r] - 1 : 0;
        slots[r] = r < rows
                       ? (int64_t)tables[(size_t)r * max_blocks + pos[r] / bs] * bs + pos[r] % bs
                       : -1;
    }
    qs[n] = n;

    KvLayout l = {
        .num_layers = L, .num_kv_heads = nkv, .head_dim = D, .block_size = bs, .dtype = act};
    const size_t cache_n = k_kv_block_elems(&l) * nblocks, row = (size_t)(nh + 2 * nkv) * D;
    float *cache = rand_vec(cache_n, -1, 1, act), *qkv = rand_vec(row * n, -2, 2, act);
    float *inv = xmalloc(sizeof(float) * (size_t)(D / 2));
    k_rope_inv_freq(inv, D, 500000.0f, 8.0f, 1.0f, 4.0f, 8192);

    void *d_cache[2] = {upload_as(cache, cache_n, act), upload_as(cache, cache_n, act)};
    void *d_qkv[2] = {upload_as(qkv, row * n, act), upload_as(qkv, row * n, act)};
    void *d_out[2], *d_q[2];
    for (int i = 0; i < 2; i++) {
        d_out[i] = k_cuda_malloc((size_t)n * nh * D * es);
        d_q[i] = k_cuda_malloc((size_t)n * nh * D * es);
        k_cuda_memset(d_out[i], 0, (size_t)n * nh * D * es);
    }
    Rope rope = {.head_dim = D, .inv_freq = upload(inv, sizeof(float) * (size_t)(D / 2))};
    AttnBatch b = {.num_tokens = n,
                   .positions = upload(pos, sizeof(int32_t) * (size_t)n),
                   .slot_mapping = upload(slots, sizeof(int64_t) * (size_t)n),
                   .num_seqs = n,
                   .query_start = upload(qs, sizeof(int32_t) * (size_t)(n + 1)),
                   .block_tables = upload(tables, sizeof(int32_t) * (size_t)n * max_blocks),
                   .max_blocks_per_seq = max_blocks,
                   .num_decode_seqs = n};
    const size_t ws_bytes = k_cuda_attention_workspace_bytes(&l, n, nh, max_blocks);
    void *ws = ws_bytes ? k_cuda_malloc(ws_bytes) : NULL;
    const float scale = 1.0f / sqrtf((float)D);

    k_cuda_qkv_rope_cache(d_q[0], d_qkv[0], act, b.positions, b.slot_mapping, n, nh, &rope,
                          d_cache[0], &l, layer, NULL);
    k_cuda_attention_decode(d_out[0], d_q[0], act, d_cache[0], &l, layer, &b, nh, scale, ws,
                            ws_bytes, NULL);
    k_cuda_qkv_attention_decode(d_out[1], d_q[1], d_qkv[1], act, &rope, d_cache[1], &l, layer, &b,
                                nh, scale, ws, ws_bytes, NULL);
    k_cuda_synchronize();

    char what[160];
    snprintf(what, sizeof what, "%s D %d kv %d x %d bs %d rows %d + %d pad, ctx <= %d", dn(act), D,
             nkv, G, bs, rows, pad, max_ctx);
    /* padding rows' outputs are unspecified: compare the real rows */
    int bad = differ(what, d_out[0], d_out[1], (size_t)rows * nh * D * es);
    bad += differ(what, d_cache[0], d_cache[1], cache_n * es);

    free(ctx);
    free(perm);
    free(tables);
    free(qs);
    free(pos);
    free(slots);
    free(cache);
    free(qkv);
    free(inv);
    void *dev[] = {d_cache[0],
                   d_cache[1],
                   d_qkv[0],
                   d_qkv[1],
                   d_out[0],
                   d_out[1],
                   d_q[0],
                   d_q[1],
                   (void *)rope.inv_freq,
                   ws,
                   (void *)b.positions,
                   (void *)b.slot_mapping,
                   (void *)b.query_start,
                   (void *)b.block_tables};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++)
        k_cuda_free(dev[i]);
    return bad;
}

static void test_qkv_attention_decode(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(61);
    const DType acts[] = {DT_BF16, DT_F16, DT_F32};
    const int kv[][2] = {{8, 4}, {2, 8}, {1, 1}, {8, 1}}, bss[] = {16, 8, 32};
    const int shapes[][3] = {{256, 0, 300}, {7, 1, 3000}, {33, 3, 1024}, {1, 0, 2000}};
    int bad = 0, cases = 0;
    for (int a = 0; a < 3; a++)
        for (int k = 0; k < 4; k++)
            for (int s = 0; s < 4; s++, cases++)
                bad += one_case(acts[a], 128, kv[k][0], kv[k][1], bss[(k + s) % 3], shapes[s][0],
                                shapes[s][1], shapes[s][2]);
    for (int s = 0; s < 4; s++, cases++) /* head_dim 64: the CUDA-core kernel */
        bad += one_case(DT_BF16, 64, 8, 4, 16, shapes[s][0], shapes[s][1], shapes[s][2]);
    print_message("qkv attention: %d cases, %d differing\n", cases, bad);
    assert_int_equal(bad, 0);
}

#endif /* PAGELLM_HAVE_CUDA */

#define UNIT(name) cmocka_unit_test(name),

int main(void) {
    const struct CMUnitTest tests[] = {QKV_ATTN_TESTS(UNIT)};
    const char *filter = getenv("PAGELLM_CUDA_TEST_FILTER");
    if (filter && *filter)
        cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
