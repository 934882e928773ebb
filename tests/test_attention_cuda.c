/* test_attention_cuda.c - the paged-attention kernels (k_cuda_attention_decode and
 * k_cuda_attention_prefill, kernels/cuda/attention_*.cu) against the CPU `attention` op
 * (test_cpu_ops(), the reference) on random data from fixed seeds. Sweeps head dims (64, 80, 96,
 * 128, 256 on the tensor-core prefill paths, 128 on Hopper's wgmma kernel where the build has
 * the sm_90a kernels; 8, 24, 40 on the CUDA-core fallback; 48, 176 and
 * large ones 512, 1024 besides), GQA ratios 1/4/8 (and 7, 16), block sizes 8..128, random
 * non-contiguous block tables with padding entries (-1), padding rows, mixed batches (decodes,
 * a prompt chunk continuing a cached prefix, a fresh prompt) run as a decode launch, a prefill
 * launch, and the decode + prefill views of kernels_cuda.h, contexts up to 32k (split over the
 * sequence for decode; a prefill chunk after a 32k prefix), a batch wide enough for decode's
 * long partitions, and activation / cache dtypes f32, bf16 and f16 (and mixed; f16 in decode
 * only, where bf16 and f16 q on a cache of the same type with head_dim a multiple of 16 up to
 * 256 run on tensor cores, and every other pair on CUDA cores), and a sharp softmax (queries 24x
 * larger, so that a decode kernel's running max rises mid-partition). Decode launches must also
 * be deterministic: a second launch on the same input gives the same bits.
 *
 * The CPU op sees exactly the values the GPU sees (inputs rounded to the GPU's dtypes first,
 * then an f32 copy); a result passes when |gpu - ref| <= tol + tol |ref| (tol 1e-4 for f32,
 * 1e-2 when activations or cache are 16-bit), and the first mismatches are printed. Outputs are
 * poisoned (NaN) before each launch, so unwritten elements fail, and padding rows must stay
 * untouched.
 *
 * Without a GPU (CI) every test is skipped with "no CUDA device: skipped"; in a build without
 * the CUDA backend, with "CUDA backend not built: skipped". The last test prints timings (never
 * asserts speed) at Llama-3-8B head shapes (bf16, and f16 for two decode shapes), CUDA-event
 * medians (and per launch in a CUDA graph of back-to-back launches), with the ratio to the H200
 * floors (4.23 TB/s for decode's K/V bytes, 763 TFLOP/s bf16 for prefill's causal FLOPs).
 * PAGELLM_CUDA_TEST_QUICK=1 shrinks the sweeps and drops the long and timing tests (for runs
 * under compute-sanitizer); PAGELLM_CUDA_TEST_FILTER=pattern runs the matching tests only;
 * PAGELLM_ATTN_TIMING=BATCHxCTX (or BATCHxFROMxTOxBOUND: contexts spread over FROM-TO, block
 * tables of BOUND positions) times that decode case alone (to profile it), =prefill the prefill
 * cases alone, and with PAGELLM_ATTN_SUSTAIN=SECONDS also after that many seconds of back-to-back
 * launches (the time once the board's power limit has set the clock; read the power beside it with
 * nvidia-smi), and with PAGELLM_ATTN_WINDOW=W under a sliding window of W positions.
 * test_attention_window checks sliding windows on every path, the blocks behind every row's window
 * absent (-1) from the block tables. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "kernels.h"
#include "backend_test_util.h"
#ifdef PAGELLM_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels_cuda.h"
#endif
#include "cuda_test_util.h"

#define ATTN_TESTS(X)                                                                              \
    X(test_attention_sweep)                                                                        \
    X(test_attention_shapes)                                                                       \
    X(test_attention_long)                                                                         \
    X(test_attention_sharp)                                                                        \
    X(test_attention_fp8)                                                                          \
    X(test_attention_window)                                                                       \
    X(test_attention_timing)

#ifndef PAGELLM_HAVE_CUDA

ATTN_TESTS(SKIP_TEST)

#else

/* ---------------- helpers ---------------- */

static double atol_of(DType dt) {
    return dt == DT_F32 ? 1e-4 : 1e-2;
}

/* ---------------- correctness ---------------- */

typedef struct {
    int prefix; /* positions already in the cache */
    int qlen;   /* query rows this step (1 = decode) */
} SeqSpec;

enum { MODE_DECODE = 1, MODE_PREFILL = 2, MODE_SPLIT = 4 };

/* Queries are drawn from [-q_range, q_range] (the cache from [-1, 1]). */
static float q_range = 4.0f;

/* The block tables' width at least this many blocks (0: one past the longest sequence's), as
 * when max-model-len is far above every context. */
static int min_table_blocks = 0;

/* The sliding window of the cases (0: none). With one, the block-table entries of blocks wholly
 * before the window of every row of their sequence are -1 (released blocks' sentinel), so a
 * kernel that reads one fails. */
static int attn_window = 0;

/* An fp8 cache's scales ([2 layer + v]; the cases use layer 1) when cdt is DT_F8E4M3. */
static float kv_scales[4] = {1, 1, 1, 1};

/* One batch: sequences `specs` (decodes first), pad_rows padding rows after the last one.
 * The cache holds random values in every position (the step's own K/V included, as after
 * kv_write); the block tables are a random permutation of the pool. The CPU attention over an
 * F32 copy of the cache is the reference for each requested mode. */
static int attention_case(int D, int nkv, int G, int bs, DType act, DType cdt, const SeqSpec *specs,
                          int ns, int pad_rows, int modes) {
    const KernelOps *cpu = test_cpu_ops();
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
    if (max_blocks < min_table_blocks)
        max_blocks = min_table_blocks;
    int rows = T + pad_rows, nblocks = used + 3;
    KvLayout l = {
        .num_layers = L, .num_kv_heads = nkv, .head_dim = D, .block_size = bs, .dtype = DT_F32};
    size_t block = (size_t)L * 2 * bs * nkv * D, cache_n = block * nblocks;

    int *perm = rnd_perm(nblocks);
    int32_t *tables = xmalloc(sizeof(int32_t) * ns * max_blocks);
    int32_t *qs = xmalloc(sizeof(int32_t) * (ns + 1));
    int32_t *pos = xmalloc(sizeof(int32_t) * rows);
    int next = 0, row = 0;
    for (int s = 0; s < ns; s++) {
        int nb = (specs[s].prefix + specs[s].qlen + bs - 1) / bs;
        int gone = attn_window > 0 && specs[s].prefix >= attn_window /* blocks before every row's */
                       ? (specs[s].prefix - attn_window + 1) / bs
                       : 0;
        for (int i = 0; i < max_blocks; i++)
            tables[s * max_blocks + i] = i < nb ? perm[next++] : -1;
        for (int i = 0; i < gone; i++)
            tables[s * max_blocks + i] = -1;
        qs[s] = row;
        for (int i = 0; i < specs[s].qlen; i++)
            pos[row++] = specs[s].prefix + i;
    }
    qs[ns] = row;
    for (; row < rows; row++)
        pos[row] = 0;

    float *cache = rand_vec(cache_n, -1, 1, cdt == DT_F8E4M3 ? DT_F32 : cdt);
    uint8_t *cache8 = NULL; /* fp8: codes of values in [-1, 1] / s (saturating where s < 1/448) */
    if (cdt == DT_F8E4M3) {
        size_t half = block / (2 * L);
        cache8 = xmalloc(cache_n);
        for (size_t i = 0; i < cache_n; i++) {
            size_t in = i % block;
            int ly = (int)(in / (2 * half)), v = (int)(in / half) & 1;
            cache8[i] = pl_f32_to_f8e4m3(cache[i] * (1.0f / kv_scales[2 * ly + v]));
        }
        l.dtype = DT_F8E4M3; /* the reference is the CPU op on the same bytes */
        l.kv_scale = kv_scales;
    }
    size_t nq = (size_t)rows * nh * D;
    float *q = rand_vec(nq, -q_range, q_range, act);
    float *ref = xmalloc(nq * sizeof(float)), *got = xmalloc(nq * sizeof(float));
    float scale = 1.0f / sqrtf((float)D);
    AttnBatch hb = {.num_tokens = T,
                    .positions = pos,
                    .slot_mapping = NULL,
                    .num_seqs = ns,
                    .query_start = qs,
                    .block_tables = tables,
                    .max_blocks_per_seq = max_blocks};
    cpu->attention(cpu, ref, q, cache8 ? (void *)cache8 : (void *)cache, &l, layer, &hb, nh, scale,
                   0.0f, attn_window);
    for (size_t i = 0; i < nq; i++)
        ref[i] = round_to(ref[i], act);

    KvLayout dl = l;
    dl.dtype = cdt;
    void *dcache = cache8 ? upload(cache8, cache_n) : upload_as(cache, cache_n, cdt);
    void *dq = upload_as(q, nq, act);
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
            k_cuda_attention_decode(dout, dq, act, dcache, &dl, layer, &db, nh, scale, attn_window,
                                    ws, ws_bytes, NULL);
        } else if (mode == MODE_PREFILL) {
            k_cuda_attention_prefill(dout, dq, act, dcache, &dl, layer, &db, nh, scale, attn_window,
                                     NULL);
        } else {
            AttnBatch dv = db, pv = db;
            dv.num_tokens = nd;
            dv.num_seqs = nd;
            pv.num_tokens = T - nd;
            pv.num_seqs = ns - nd;
            pv.query_start = dqs + nd;
            pv.block_tables = dtab + (size_t)nd * max_blocks;
            if (nd > 0)
                k_cuda_attention_decode(dout, dq, act, dcache, &dl, layer, &dv, nh, scale,
                                        attn_window, ws, ws_bytes, NULL);
            if (ns > nd)
                k_cuda_attention_prefill(dout, dq, act, dcache, &dl, layer, &pv, nh, scale,
                                         attn_window, NULL);
        }
        download_as(got, dout, nq, act);
        if (mode == MODE_DECODE) { /* deterministic: a second launch gives the same bits */
            void *again = k_cuda_malloc(nq * pl_dtype_size(act));
            void *h1 = xmalloc(nq * pl_dtype_size(act)), *h2 = xmalloc(nq * pl_dtype_size(act));
            k_cuda_memset(again, 0xFF, nq * pl_dtype_size(act));
            k_cuda_attention_decode(again, dq, act, dcache, &dl, layer, &db, nh, scale, attn_window,
                                    ws, ws_bytes, NULL);
            k_cuda_memcpy(h1, dout, nq * pl_dtype_size(act));
            k_cuda_memcpy(h2, again, nq * pl_dtype_size(act));
            if (memcmp(h1, h2, nq * pl_dtype_size(act)) != 0) {
                print_error("attention decode D %d G %d bs %d: two launches differ\n", D, G, bs);
                bad++;
            }
            k_cuda_free(again);
            free(h1);
            free(h2);
        }
        char what[160];
        snprintf(what, sizeof what, "attention %s act %s cache %s D %d nkv %d G %d bs %d",
                 mode == MODE_DECODE    ? "decode"
                 : mode == MODE_PREFILL ? "prefill"
                                        : "split",
                 dn(act), dn(cdt), D, nkv, G, bs);
        size_t real = (size_t)T * nh * D;
        double tol = atol_of(act != DT_F32 || cdt != DT_F32 ? DT_BF16 : DT_F32);
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
    free(cache8);
    free(q);
    free(ref);
    free(got);
    return bad;
}

/* The sweeps' mixed batch: three decodes (up to three 256-position partitions), a chunk
 * continuing a cached prefix, a fresh prompt. */
static void mixed_batch(SeqSpec specs[5]) {
    specs[0] = (SeqSpec){rnd_int(700), 1};
    specs[1] = (SeqSpec){rnd_int(300), 1};
    specs[2] = (SeqSpec){0, 1};
    specs[3].prefix = 100 + rnd_int(100);
    specs[3].qlen = 37 + rnd_int(30);
    specs[4] = (SeqSpec){0, 20 + rnd_int(60)};
}

/* The modes a dtype pair is tested in: all of them, for every pair. */
static int modes_of(DType act, DType cdt) {
    (void)act, (void)cdt;
    return MODE_DECODE | MODE_PREFILL | MODE_SPLIT;
}

/* Head dims x GQA ratios x block sizes x dtypes (f32, bf16, f16), each on a mixed batch: three
 * decodes (up to three 256-position partitions), a chunk continuing a cached prefix, a fresh
 * prompt, and two padding rows; every kernel mode (decode, prefill, decode+prefill views). */
static void test_attention_sweep(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(10);
    const int dims[] = {8, 40, 64, 80, 96, 128, 256};
    const int gqa[] = {1, 4, 8};
    const int bss[] = {8, 16, 32, 64, 128};
    const DType pairs[][2] = {{DT_F32, DT_F32}, {DT_BF16, DT_BF16}, {DT_F16, DT_F16}};
    int bad = 0, cases = 0;
    for (int di = 0; di < 7; di++)
        for (int gi = 0; gi < 3; gi++)
            for (int bi = 0; bi < 5; bi++)
                for (int pi = 0; pi < 3; pi++) {
                    if (quick() && ((di != 0 && di != 5) || bi != 1))
                        continue;
                    SeqSpec specs[5];
                    mixed_batch(specs);
                    bad += attention_case(dims[di], 2, gqa[gi], bss[bi], pairs[pi][0], pairs[pi][1],
                                          specs, 5, 2, modes_of(pairs[pi][0], pairs[pi][1]));
                    cases++;
                }
    print_message("attention sweep: %d batches x 3 modes, %d mismatching comparisons\n", cases,
                  bad);
    assert_int_equal(bad, 0);
}

/* Mixed dtypes, non-power-of-two groups (Qwen2-7B: 28 / 4 = 7), 16 heads per KV head, one
 * sequence alone, odd head dims on both prefill paths, large head dims, non-power-of-two block
 * sizes, a prompt longer than many tiles, and a chunk starting mid-block. */
static void test_attention_shapes(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(13);
    int bad = 0;
    SeqSpec mix[3] = {{500, 1}, {64, 65}, {0, 33}};
    bad += attention_case(128, 2, 4, 16, DT_F32, DT_BF16, mix, 3, 0, 7);
    bad += attention_case(128, 2, 4, 16, DT_BF16, DT_F32, mix, 3, 0, 7);
    bad += attention_case(128, 4, 7, 16, DT_BF16, DT_BF16, mix, 3, 1, 7);
    bad += attention_case(64, 1, 16, 8, DT_F32, DT_F32, mix, 3, 0, 7);
    bad += attention_case(64, 1, 16, 8, DT_BF16, DT_BF16, mix, 3, 0, 7);
    bad += attention_case(128, 2, 2, 24, DT_BF16, DT_BF16, mix, 3, 0, 7);
    bad += attention_case(128, 2, 4, 16, DT_F32, DT_F16, mix, 3, 0, 7);
    bad += attention_case(128, 2, 4, 16, DT_F16, DT_F32, mix, 3, 0, 7);
    bad += attention_case(128, 4, 7, 16, DT_F16, DT_F16, mix, 3, 1, 7);
    bad += attention_case(64, 1, 16, 8, DT_F16, DT_F16, mix, 3, 0, 7);
    bad += attention_case(128, 1, 32, 16, DT_BF16, DT_BF16, mix, 3, 0, 7);
    bad += attention_case(96, 1, 24, 16, DT_F16, DT_F16, mix, 3, 0, 7);
    SeqSpec one[1] = {{0, 200}};
    bad += attention_case(128, 8, 4, 32, DT_BF16, DT_BF16, one, 1, 0, 7);
    SeqSpec odd[3] = {{37, 1}, {250, 77}, {3, 130}};
    const int dims[] = {24, 48, 176};
    for (int di = 0; di < 3; di++)
        for (int pi = 0; pi < 2; pi++) {
            DType dt = pi ? DT_BF16 : DT_F32;
            bad += attention_case(dims[di], 2, 4, 16, dt, dt, odd, 3, 1, 7);
        }
    if (!quick()) {
        SeqSpec big[2] = {{300, 1}, {40, 9}};
        bad += attention_case(512, 1, 2, 16, DT_F32, DT_F32, big, 2, 0, 7);
        bad += attention_case(512, 1, 4, 16, DT_BF16, DT_BF16, big, 2, 0, 7);
        bad += attention_case(1024, 1, 2, 8, DT_F32, DT_F32, big, 2, 0, 7);
        SeqSpec prompt[2] = {{0, 700}, {129, 300}};
        bad += attention_case(128, 2, 4, 16, DT_BF16, DT_BF16, prompt, 2, 0, MODE_PREFILL);
        bad += attention_case(256, 2, 1, 64, DT_BF16, DT_BF16, prompt, 2, 0, MODE_PREFILL);
        bad += attention_case(80, 2, 8, 128, DT_BF16, DT_BF16, prompt, 2, 0, MODE_PREFILL);
        bad += attention_case(128, 2, 4, 16, DT_F16, DT_F16, prompt, 2, 0, MODE_PREFILL);
        bad += attention_case(80, 2, 8, 128, DT_F16, DT_F16, prompt, 2, 0, MODE_PREFILL);
    }
    assert_int_equal(bad, 0);
}

/* An fp8 (e4m3) cache under f32, bf16 and f16 queries, against the CPU op on the same bytes:
 * every path (decode on tensor cores at D 128 with 16-bit queries, else on CUDA cores; prefill
 * on tensor cores for 16-bit queries, else CUDA cores; and the split views), scales of 1, scales
 * that are not (0.0125 for K, 3 for V) and scales under which K and V saturated when stored; a
 * long decode row (many partitions) and a long prompt. Tolerance: that of a 16-bit cache. */
static void test_attention_fp8(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(17);
    const float sets[3][2] = {{1.0f, 1.0f}, {0.0125f, 3.0f}, {1.0f / 600, 1.0f / 1000}};
    const int dims[] = {128, 64, 256, 40, 8};
    const int gqa[] = {1, 4, 8};
    const int bss[] = {8, 16, 32};
    const DType acts[] = {DT_BF16, DT_F16, DT_F32};
    int bad = 0, cases = 0;
    for (int di = 0; di < 5; di++)
        for (int gi = 0; gi < 3; gi++)
            for (int ai = 0; ai < 3; ai++) {
                const int si = (di + gi + ai) % 3, bs = bss[(di + ai) % 3];
                if (quick() && (di > 1 || gi == 1))
                    continue;
                kv_scales[2] = sets[si][0];
                kv_scales[3] = sets[si][1];
                SeqSpec specs[5];
                mixed_batch(specs);
                bad += attention_case(dims[di], 2, gqa[gi], bs, acts[ai], DT_F8E4M3, specs, 5, 2,
                                      MODE_DECODE | MODE_PREFILL | MODE_SPLIT);
                cases++;
            }
    kv_scales[2] = 0.02f;
    kv_scales[3] = 0.5f;
    if (!quick()) {
        SeqSpec longs[2] = {{5000, 1}, {4000, 300}};
        for (int ai = 0; ai < 2; ai++) {
            bad += attention_case(128, 8, 4, 16, acts[ai], DT_F8E4M3, longs, 2, 0, 7);
            cases++;
        }
    }
    kv_scales[2] = kv_scales[3] = 1.0f;
    print_message("attention fp8: %d batches, %d mismatching comparisons\n", cases, bad);
    assert_int_equal(bad, 0);
}

/* Sliding windows (Mistral, Qwen2, Gemma): windows of 1 to 5000 positions over batches that
 * cross them (decodes past and before the window, a chunk continuing a prefix longer than the
 * window, a prompt longer than it, a long decode row split into partitions), on every path:
 * tensor cores and CUDA cores, decode and prefill, block sizes 8 to 128, f32, bf16, f16 and an
 * fp8 cache. The blocks wholly before every row's window are -1 in the block tables. */
static void test_attention_window(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(23);
    const int windows[] = {1, 5, 16, 100, 1000};
    const int dims[] = {128, 64, 8, 80};
    const int bss[] = {8, 16, 32, 128};
    const DType pairs[][2] = {
        {DT_F32, DT_F32}, {DT_BF16, DT_BF16}, {DT_F16, DT_F16}, {DT_BF16, DT_F8E4M3}};
    int bad = 0, cases = 0;
    for (int wi = 0; wi < 5; wi++)
        for (int di = 0; di < 4; di++)
            for (int bi = 0; bi < 4; bi++)
                for (int pi = 0; pi < 4; pi++) {
                    if ((wi + di + bi + pi) % 2 || (quick() && (di > 1 || bi > 1)))
                        continue;
                    attn_window = windows[wi];
                    SeqSpec specs[6] = {{rnd_int(3000), 1},
                                        {windows[wi] - 1, 1},
                                        {rnd_int(40), 1},
                                        {2 * windows[wi] + rnd_int(90), 1},
                                        {150 + rnd_int(100), 37 + rnd_int(90)},
                                        {0, 20 + rnd_int(300)}};
                    bad += attention_case(dims[di], 2, 1 + (wi + bi) % 4 * 2, bss[bi], pairs[pi][0],
                                          pairs[pi][1], specs, 6, 1, 7);
                    cases++;
                }
    if (!quick()) { /* Mistral-7B's 4096 window under 8k-32k contexts (split decode rows) */
        attn_window = 4096;
        SeqSpec longs[4] = {{32000, 1}, {9000, 1}, {4095, 1}, {6000, 300}};
        bad += attention_case(128, 2, 4, 16, DT_BF16, DT_BF16, longs, 4, 0, 7);
        bad += attention_case(128, 2, 4, 16, DT_F32, DT_F32, longs, 4, 0, 7);
        bad += attention_case(128, 2, 4, 16, DT_BF16, DT_F8E4M3, longs, 4, 0, 7);
        cases += 3;
    }
    attn_window = 0;
    print_message("attention window: %d batches x 3 modes, %d mismatching comparisons\n", cases,
                  bad);
    assert_int_equal(bad, 0);
}

/* Long contexts: many partitions of the split over the sequence (4k and 32k decode rows, a
 * chunk continuing a 4000-token prefix, a chunk continuing a 32k prefix) for f32 and bf16,
 * block sizes 16 and 32, 256 decode rows of 32 query heads (decode's long partitions) and 64
 * rows beyond one partition, and block tables far wider than every context. */
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
    bad += attention_case(128, 2, 4, 16, DT_F16, DT_F16, specs, 6, 1, 7);
    SeqSpec specs2[3] = {{4096, 1}, {2047, 1}, {3000, 100}};
    bad += attention_case(64, 2, 8, 32, DT_BF16, DT_BF16, specs2, 3, 0, 7);
    bad += attention_case(256, 1, 1, 32, DT_F32, DT_F32, specs2, 3, 0, 7);
    bad += attention_case(8, 2, 4, 8, DT_F32, DT_F32, specs2, 3, 0, 7);
    SeqSpec chunk32k[2] = {{32000, 1}, {32768 - 160, 160}};
    bad += attention_case(128, 2, 4, 16, DT_BF16, DT_BF16, chunk32k, 2, 0, 7);
    bad += attention_case(128, 1, 4, 32, DT_F32, DT_F32, chunk32k, 2, 0, MODE_PREFILL);
    SeqSpec wide[256];
    for (int s = 0; s < 256; s++)
        wide[s] = (SeqSpec){rnd_int(1500), 1};
    bad += attention_case(128, 8, 4, 16, DT_BF16, DT_BF16, wide, 256, 3, MODE_DECODE);
    bad += attention_case(128, 8, 4, 16, DT_F32, DT_F32, wide, 256, 0, MODE_DECODE);
    bad += attention_case(128, 8, 4, 16, DT_F16, DT_F16, wide, 256, 0, MODE_DECODE);
    bad += attention_case(256, 4, 2, 16, DT_BF16, DT_BF16, wide, 256, 0, MODE_DECODE);
    /* 64 rows of 2000-4000 positions: tensor-core partitions of 2048, then combined */
    SeqSpec deep[64];
    for (int s = 0; s < 64; s++)
        deep[s] = (SeqSpec){2000 + rnd_int(2000), 1};
    bad += attention_case(128, 8, 4, 16, DT_BF16, DT_BF16, deep, 64, 0, MODE_DECODE);
    bad += attention_case(128, 8, 4, 16, DT_F16, DT_F16, deep, 64, 0, MODE_DECODE);
    /* block tables of 131072 positions (64 partitions of 2048) far past every context: 255 short
     * rows and one of 20000 positions, whose partitions fall to a run of blocks among the short
     * rows' (each block takes its share of the launch's items); tensor cores and CUDA cores */
    min_table_blocks = 131072 / 16;
    SeqSpec sparse[256];
    for (int s = 0; s < 256; s++)
        sparse[s] = (SeqSpec){rnd_int(300), 1};
    sparse[100].prefix = 20000;
    bad += attention_case(128, 4, 4, 16, DT_BF16, DT_BF16, sparse, 256, 2, MODE_DECODE);
    bad += attention_case(128, 4, 4, 16, DT_F32, DT_F32, sparse, 256, 0, MODE_DECODE);
    SeqSpec lone[1] = {{5000, 1}}; /* one row: its 3 partitions among 64 blocks per head */
    bad += attention_case(128, 4, 4, 16, DT_BF16, DT_BF16, lone, 1, 1, MODE_DECODE);
    min_table_blocks = 0;
    assert_int_equal(bad, 0);
}

/* A sharp softmax: queries 24x larger, so that a row's scores spread over ~50 (log2 units) and
 * the decode kernels' running max rises well past its first value within a partition (the
 * tensor-core kernel rescales its sums then), on every path and several block sizes. */
static void test_attention_sharp(void **state) {
    (void)state;
    REQUIRE_GPU();
    rng_seed(17);
    q_range = 96.0f;
    SeqSpec specs[5] = {{3000, 1}, {1500, 1}, {700, 1}, {40, 1}, {200, 30}};
    const int bss[] = {8, 16, 24, 32};
    const DType dts[] = {DT_BF16, DT_F16, DT_F32};
    int bad = 0;
    for (int bi = 0; bi < 4; bi++)
        for (int di = 0; di < 3; di++)
            bad += attention_case(128, 2, 4, bss[bi], dts[di], dts[di], specs, 5, 1, 7);
    bad += attention_case(128, 1, 8, 16, DT_BF16, DT_BF16, specs, 5, 0, 7);
    bad += attention_case(128, 2, 1, 16, DT_F16, DT_F16, specs, 5, 0, 7);
    q_range = 4.0f;
    assert_int_equal(bad, 0);
}

/* ---------------- timings ---------------- */

/* The median of t[n] (sorts t). */
static float median(float *t, int n) {
    for (int i = 1; i < n; i++) /* insertion sort: n is small */
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            float x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    return t[n / 2];
}

/* Median of `iters` CUDA-event timings of run(i) (after 3 warm-ups), in ms. */
typedef void (*TimedFn)(void *ctx, int i);
static double time_median(TimedFn run, void *ctx, int iters) {
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    float t[64];
    for (int i = 0; i < 3; i++)
        run(ctx, i);
    for (int i = 0; i < iters; i++) {
        CUDA_CHECK(cudaEventRecord(e0, NULL));
        run(ctx, i);
        CUDA_CHECK(cudaEventRecord(e1, NULL));
        CUDA_CHECK(cudaEventSynchronize(e1));
        CUDA_CHECK(cudaEventElapsedTime(&t[i], e0, e1));
    }
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    return median(t, iters);
}

typedef struct {
    void *out, *q, *cache, *ws;
    size_t ws_bytes;
    KvLayout l;
    AttnBatch b[64]; /* one per set of blocks: rotating defeats the 60 MB L2 */
    int nsets, prefill, nh;
    int window; /* sliding window (0: none) */
    DType dt;   /* q and cache */
    float scale;
    void *stream; /* NULL: the legacy stream */
} TimedAttn;

static void run_attn(void *ctx, int i) {
    TimedAttn *a = ctx;
    const AttnBatch *b = &a->b[i % a->nsets];
    if (a->prefill)
        k_cuda_attention_prefill(a->out, a->q, a->dt, a->cache, &a->l, 0, b, a->nh, a->scale,
                                 a->window, a->stream);
    else
        k_cuda_attention_decode(a->out, a->q, a->dt, a->cache, &a->l, 0, b, a->nh, a->scale,
                                a->window, a->ws, a->ws_bytes, a->stream);
}

/* Wall-clock seconds (CLOCK_REALTIME, to line up with nvidia-smi's timestamps). */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ms per run() once `seconds` of back-to-back calls have passed: the median of the batches of
 * 20 calls in the last half second. */
static double time_sustained(TimedFn run, void *ctx, double seconds) {
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    float t[256];
    double end[256];
    int n = 0, i = 0;
    const double t0 = now_s();
    do {
        CUDA_CHECK(cudaEventRecord(e0, NULL));
        for (int k = 0; k < 20; k++)
            run(ctx, i++);
        CUDA_CHECK(cudaEventRecord(e1, NULL));
        CUDA_CHECK(cudaEventSynchronize(e1));
        CUDA_CHECK(cudaEventElapsedTime(&t[n % 256], e0, e1));
        end[n % 256] = now_s();
        n++;
    } while (end[(n - 1) % 256] - t0 < seconds);
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    float last[256];
    int m = 0;
    for (int k = n > 256 ? n - 256 : 0; k < n; k++)
        if (end[k % 256] > end[(n - 1) % 256] - 0.5)
            last[m++] = t[k % 256] / 20;
    return median(last, m);
}

/* Device time per launch without the host's launch overhead, as the engine's CUDA graphs run
 * it: one graph of a launch per set, the median of 5 replays divided by the sets, in ms. */
static double time_graph(TimedAttn *a) {
    a->stream = k_cuda_stream_create();
    cudaStream_t st = (cudaStream_t)a->stream;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < a->nsets; i++)
        run_attn(a, i);
    CUDA_CHECK(cudaStreamEndCapture(st, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    float t[5];
    CUDA_CHECK(cudaGraphLaunch(exec, st)); /* warm-up */
    for (int i = 0; i < 5; i++) {
        CUDA_CHECK(cudaEventRecord(e0, st));
        CUDA_CHECK(cudaGraphLaunch(exec, st));
        CUDA_CHECK(cudaEventRecord(e1, st));
        CUDA_CHECK(cudaEventSynchronize(e1));
        CUDA_CHECK(cudaEventElapsedTime(&t[i], e0, e1));
    }
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
    k_cuda_stream_destroy(a->stream);
    a->stream = NULL;
    return median(t, 5) / a->nsets;
}

/* Not a check: timings at Llama-3-8B head shapes (32 query heads, 8 KV heads, head_dim 128,
 * bf16 q and cache, block size 16, one layer's cache; block tables a random permutation).
 * Decode: `batch` rows at context `ctx`, floor = K/V bytes at 4.23 TB/s (several sets of blocks
 * in rotation when one set would fit in L2). Prefill: prompts of `lens` tokens after `prefix`
 * cached ones, floor = causal FLOPs (4 nh D per (row, position) pair) at 763 TFLOP/s. */
static void test_attention_timing(void **state) {
    (void)state;
    REQUIRE_GPU();
    if (quick())
        return;
    rng_seed(12);
    const int D = 128, nkv = 8, nh = 32, bs = 16;
    const double bw = 4.23e12, tflops = 763e12;
    const size_t pool_tokens = 256 * 2048 + 64 * 1024;
    const int nblocks = (int)(pool_tokens / bs);
    TimedAttn a;
    memset(&a, 0, sizeof a);
    a.l = (KvLayout){
        .num_layers = 1, .num_kv_heads = nkv, .head_dim = D, .block_size = bs, .dtype = DT_BF16};
    a.nh = nh;
    a.dt = DT_BF16;
    a.scale = 1.0f / sqrtf((float)D);
    size_t block_bytes = (size_t)2 * bs * nkv * D * 2;
    a.cache = k_cuda_malloc(block_bytes * nblocks);
    {
        size_t n = block_bytes * nblocks / 2, chunk = (size_t)1 << 24;
        float *v = rand_vec(chunk, -1, 1, DT_BF16);
        void *h = to_dtype(v, chunk, DT_BF16);
        for (size_t off = 0; off < n; off += chunk) {
            size_t m = n - off < chunk ? n - off : chunk;
            k_cuda_memcpy((char *)a.cache + off * 2, h, m * 2);
        }
        free(v);
        free(h);
    }
    int *perm = rnd_perm(nblocks);
    const int max_rows = 2048;
    float *q = rand_vec((size_t)max_rows * nh * D, -2, 2, DT_BF16);
    a.q = upload_as(q, (size_t)max_rows * nh * D, DT_BF16);
    a.out = k_cuda_malloc((size_t)max_rows * nh * D * 2);
    free(q);

    /* {batch, contexts from, to (spread evenly over the rows), the block tables' bound (in a
     * decode graph the engine's max-model-len, which sets the partitions), 1: f16 q and cache
     * (the cache's bf16 bits read as f16, finite)} */
    const int dec[][5] = {
        {1, 128, 128, 128},      {1, 1024, 1024, 1024},     {1, 4096, 4096, 4096},
        {1, 8192, 8192, 8192},   {1, 32768, 32768, 32768},  {8, 1024, 1024, 1024},
        {64, 1024, 1024, 1024},  {256, 128, 128, 128},      {256, 512, 512, 512},
        {256, 1024, 1024, 1024}, {256, 2048, 2048, 2048},   {256, 1024, 1120, 2048},
        {384, 1000, 2000, 4096}, {1, 1024, 1024, 1024, 1},  {256, 1024, 1024, 1024, 1},
        {256, 128, 192, 131072}, {256, 1024, 1120, 131072}, {1, 1024, 1024, 131072}};
    /* PAGELLM_ATTN_TIMING=BATCHxCTX or BATCHxFROMxTOxBOUND: that bf16 decode case alone, listed
     * above or not (for a profiler or a sweep), no prefill; with PAGELLM_ATTN_WINDOW=W under a
     * sliding window of W positions (its floor: the window's K/V bytes); =prefill: the prefill
     * cases alone */
    const char *only = getenv("PAGELLM_ATTN_TIMING");
    const int prefill_only = only && strcmp(only, "prefill") == 0;
    if (prefill_only)
        only = NULL;
    a.window = only && getenv("PAGELLM_ATTN_WINDOW") ? atoi(getenv("PAGELLM_ATTN_WINDOW")) : 0;
    int only_case[1][5] = {{0, 0, 0, 0, 0}};
    if (only) {
        int *oc = only_case[0];
        int got = sscanf(only, "%dx%dx%dx%d", &oc[0], &oc[1], &oc[2], &oc[3]);
        if (got == 2)
            oc[2] = oc[3] = oc[1];
        if ((got != 2 && got != 4) || oc[0] < 1 || oc[0] > max_rows || oc[1] < 1 || oc[2] < oc[1] ||
            oc[3] < oc[2] || oc[3] % bs ||
            (size_t)oc[0] * ((oc[2] + bs - 1) / bs) > (size_t)nblocks)
            fail_msg("PAGELLM_ATTN_TIMING=%s: expected BATCHxCTX or BATCHxFROMxTOxBOUND (e.g. "
                     "256x1024 or 256x1024x1120x2048), batch 1-%d, FROM <= TO <= BOUND, BOUND a "
                     "multiple of %d, at most %d cache blocks in all",
                     only, max_rows, bs, nblocks);
    }
    const int(*cases)[5] = only ? only_case : dec;
    const int ncases = prefill_only ? 0 : only ? 1 : (int)(sizeof dec / sizeof dec[0]);
    for (int ci = 0; ci < ncases; ci++) {
        const int batch = cases[ci][0], lo = cases[ci][1], hi = cases[ci][2];
        const int mb = cases[ci][3] / bs;
        a.dt = cases[ci][4] ? DT_F16 : DT_BF16;
        a.l.dtype = a.dt;
        int32_t *qs = xmalloc(sizeof(int32_t) * (batch + 1)),
                *pos = xmalloc(sizeof(int32_t) * batch);
        int used = 0; /* cache blocks the rows read, in one set */
        double positions = 0;
        for (int s = 0; s <= batch; s++)
            qs[s] = s;
        for (int s = 0; s < batch; s++) {
            pos[s] = lo - 1 + (int)((long)(hi - lo) * s / (batch > 1 ? batch - 1 : 1));
            used += pos[s] / bs + 1;
            positions += a.window > 0 && pos[s] + 1 > a.window ? a.window : pos[s] + 1;
        }
        const int per_set = batch * mb;
        const double set_bytes = (double)used * block_bytes;
        a.nsets = 1 + (int)(240e6 / set_bytes); /* 240 MB in rotation: 4x the L2 */
        if (a.nsets > nblocks / used)
            a.nsets = nblocks / used;
        if (a.nsets > 64)
            a.nsets = 64;
        if (a.nsets < 1)
            a.nsets = 1;
        a.prefill = 0;
        /* each row's blocks from the permutation, the rest of its table (past its context,
         * never read) block 0 */
        int32_t *tab = xmalloc(sizeof(int32_t) * per_set * a.nsets);
        for (int k = 0, next = 0; k < a.nsets; k++)
            for (int s = 0; s < batch; s++)
                for (int i = 0; i < mb; i++)
                    tab[(size_t)k * per_set + (size_t)s * mb + i] =
                        i <= pos[s] / bs ? perm[next++] : 0;
        int32_t *dtab = upload(tab, sizeof(int32_t) * per_set * a.nsets);
        int32_t *dqs = upload(qs, sizeof(int32_t) * (batch + 1));
        int32_t *dpos = upload(pos, sizeof(int32_t) * batch);
        for (int k = 0; k < a.nsets; k++)
            a.b[k] = (AttnBatch){.num_tokens = batch,
                                 .positions = dpos,
                                 .num_seqs = batch,
                                 .query_start = dqs,
                                 .block_tables = dtab + (size_t)k * per_set,
                                 .max_blocks_per_seq = mb};
        a.ws_bytes = k_cuda_attention_workspace_bytes(&a.l, batch, nh, mb);
        a.ws = a.ws_bytes ? k_cuda_malloc(a.ws_bytes) : NULL;
        double ms = time_median(run_attn, &a, 20);
        k_cuda_synchronize(); /* the graph's stream does not wait for the legacy one */
        double graph_ms = time_graph(&a);
        const char *sustain = only ? getenv("PAGELLM_ATTN_SUSTAIN") : NULL;
        if (sustain) {
            double t0 = now_s(), settled = time_sustained(run_attn, &a, atof(sustain));
            print_message("timing: sustained %.3f - %.3f s (CLOCK_REALTIME): %.1f us per launch\n",
                          t0, now_s(), settled * 1e3);
        }
        double floor_ms = positions * nkv * D * 2 * 2 / bw * 1e3;
        char ctx[64];
        if (lo == hi && hi == mb * bs)
            snprintf(ctx, sizeof ctx, "ctx %5d", lo);
        else
            snprintf(ctx, sizeof ctx, "ctx %d-%d (bound %d)", lo, hi, mb * bs);
        if (a.window > 0)
            snprintf(ctx + strlen(ctx), sizeof ctx - strlen(ctx), " window %d", a.window);
        print_message("timing: decode %s batch %3d %s: %8.1f us (graph %7.1f us), floor "
                      "%7.1f us (%.2fx), %.2f TB/s; x32 layers %.2f ms\n",
                      dn(a.dt), batch, ctx, ms * 1e3, graph_ms * 1e3, floor_ms * 1e3, ms / floor_ms,
                      positions * nkv * D * 4 / (ms * 1e-3) / 1e12, ms * 32);
        k_cuda_free(a.ws);
        k_cuda_free(dtab);
        k_cuda_free(dqs);
        k_cuda_free(dpos);
        free(tab);
        free(qs);
        free(pos);
    }

    /* prefill: {sequences, tokens each, cached prefix, 1: an fp8 cache (the bf16 data's bytes
     * read as e4m3)} */
    a.dt = DT_BF16;
    const int pre[][4] = {{1, 2048, 0}, {1, 512, 0}, {4, 512, 0}, {1, 512, 1536}, {1, 2048, 0, 1}};
    for (int ci = 0; ci < (only ? 0 : 5); ci++) {
        const int ns = pre[ci][0], len = pre[ci][1], prefix = pre[ci][2];
        a.l.dtype = pre[ci][3] ? DT_F8E4M3 : DT_BF16;
        const int mb = (prefix + len + bs - 1) / bs, rows = ns * len;
        int32_t *tab = xmalloc(sizeof(int32_t) * ns * mb);
        for (int i = 0; i < ns * mb; i++)
            tab[i] = perm[i];
        int32_t *qs = xmalloc(sizeof(int32_t) * (ns + 1)), *pos = xmalloc(sizeof(int32_t) * rows);
        double pairs = 0;
        for (int s = 0; s <= ns; s++)
            qs[s] = s * len;
        for (int r = 0; r < rows; r++) {
            pos[r] = prefix + r % len;
            pairs += pos[r] + 1;
        }
        int32_t *dtab = upload(tab, sizeof(int32_t) * ns * mb);
        int32_t *dqs = upload(qs, sizeof(int32_t) * (ns + 1));
        int32_t *dpos = upload(pos, sizeof(int32_t) * rows);
        a.nsets = 1;
        a.prefill = 1;
        a.b[0] = (AttnBatch){.num_tokens = rows,
                             .positions = dpos,
                             .num_seqs = ns,
                             .query_start = dqs,
                             .block_tables = dtab,
                             .max_blocks_per_seq = mb};
        double ms = time_median(run_attn, &a, 20);
        double flops = 4.0 * nh * D * pairs;
        double floor_ms = flops / tflops * 1e3;
        print_message(
            "timing: prefill %d x %4d tokens after %4d cached%s: %7.1f us, floor %6.1f us "
            "(%.2fx), %.0f TFLOP/s; x32 layers %.2f ms\n",
            ns, len, prefix, pre[ci][3] ? " (fp8 cache)" : "", ms * 1e3, floor_ms * 1e3,
            ms / floor_ms, flops / (ms * 1e-3) / 1e12, ms * 32);
        k_cuda_free(dtab);
        k_cuda_free(dqs);
        k_cuda_free(dpos);
        free(tab);
        free(qs);
        free(pos);
    }
    k_cuda_free(a.cache);
    k_cuda_free(a.q);
    k_cuda_free(a.out);
    free(perm);
}

#endif /* PAGELLM_HAVE_CUDA */

int main(void) {
    const struct CMUnitTest tests[] = {ATTN_TESTS(UNIT)};
    RUN_CUDA_TESTS(tests);
}
