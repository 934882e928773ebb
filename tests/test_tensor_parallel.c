/* test_tensor_parallel.c - the tensor-parallel forward pass without GPUs: the ranks are
 * threads running the CPU backend, with all-reduce and all-gather done through shared memory,
 * so the sharding at load (heads, MLP columns, vocabulary slices of the embedding and LM head)
 * and the forward's collectives are checked on any machine. Every position's logits with 2
 * and 4 ranks equal one rank's, for stories260K (vocabulary 512) and for it cut to 509 tokens
 * (the last slice ends in padding); with 8 ranks (one query head each, the 4 KV heads
 * replicated over pairs of ranks) for it cut to 168 MLP columns; the vocabulary slices'
 * arithmetic; dummy weights' vocabulary slices equal the rows of the whole model's; and 2 ranks
 * of the tiny Qwen3, Qwen3-MoE and Mixtral checkpoints of tests/data/families equal one. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "kernels.h"
#include "backend_test_util.h"
#include "model.h"
#include "tp_test_util.h"
#include "weights.h"

enum { MAX_RANKS = 8, NUM_TOKENS = 24 };

/* ---- collectives between rank threads (fp32, the CPU backend's activations) ---------- */

static pthread_barrier_t barrier;
static const void *slot[MAX_RANKS];
static __thread int my_rank;

static void group_wait(void) {
    pthread_barrier_wait(&barrier);
}

static int group_size;

static void shm_all_reduce(const KernelOps *ops, void *buf, size_t count) {
    float *sum = calloc(count, sizeof *sum);
    slot[my_rank] = buf;
    group_wait();
    for (int r = 0; r < group_size; r++) /* rank order: every rank gets the same sums */
        for (size_t i = 0; i < count; i++)
            sum[i] += ((const float *)slot[r])[i];
    group_wait(); /* every rank has read every buffer */
    memcpy(buf, sum, count * sizeof *sum);
    free(sum);
}

static void shm_all_reduce_add_rmsnorm(const KernelOps *ops, void *residual, void *delta, void *out,
                                       const Tensor *w, int n, int dim, float eps) {
    shm_all_reduce(ops, delta, (size_t)n * dim);
    test_cpu_ops()->add_rmsnorm(test_cpu_ops(), residual, delta, out, w, n, dim, eps);
}

static void shm_all_gather(const KernelOps *ops, void *out, const void *in, size_t count) {
    slot[my_rank] = in;
    group_wait();
    for (int r = 0; r < group_size; r++)
        if ((const float *)out + (size_t)r * count != slot[r])
            memcpy((float *)out + (size_t)r * count, slot[r], count * sizeof(float));
    group_wait();
}

static KernelOps tp_ops(void) {
    KernelOps o = *test_cpu_ops();
    o.all_reduce = shm_all_reduce;
    o.all_reduce_add_rmsnorm = shm_all_reduce_add_rmsnorm;
    o.all_gather = shm_all_gather;
    return o;
}

/* ---- one prompt through every rank ----------------------------------------------------- */

typedef struct {
    const char *dir;
    int rank, size, vocab;
    const KernelOps *ops;
    float *logits; /* [NUM_TOKENS, vocab] */
    Status status;
    char error[256];
} RankRun;

/* Every position's logits of one prompt (one sequence, one chunk). */
static void *run_rank(void *arg) {
    RankRun *r = arg;
    my_rank = r->rank;
    ModelLoadOptions o = {.dir = r->dir,
                          .max_num_tokens = NUM_TOKENS,
                          .ops = r->ops,
                          .tp_rank = r->rank,
                          .tp_size = r->size};
    Model *m = NULL;
    if ((r->status = model_load(&o, &m)) != PL_OK) {
        snprintf(r->error, sizeof r->error, "%s", pl_error());
        return NULL;
    }
    enum { BLOCK = 16, BLOCKS = (NUM_TOKENS + BLOCK - 1) / BLOCK };
    KvLayout kl = model_kv_layout(m, BLOCK);
    float *kv = calloc(k_kv_block_elems(&kl) * BLOCKS, sizeof *kv);
    int32_t ids[NUM_TOKENS], pos[NUM_TOKENS], rows[NUM_TOKENS], qs[2] = {0, NUM_TOKENS};
    int32_t tables[BLOCKS];
    int64_t slots[NUM_TOKENS];
    for (int i = 0; i < NUM_TOKENS; i++) {
        ids[i] = (i * 97 + 5) % r->vocab; /* ids in every rank's slice, the last ones too */
        pos[i] = rows[i] = i;
        slots[i] = i;
    }
    ids[NUM_TOKENS - 1] = r->vocab - 1;
    for (int b = 0; b < BLOCKS; b++)
        tables[b] = b;
    AttnBatch batch = {.num_tokens = NUM_TOKENS,
                       .positions = pos,
                       .slot_mapping = slots,
                       .num_seqs = 1,
                       .query_start = qs,
                       .block_tables = tables,
                       .max_blocks_per_seq = BLOCKS};
    model_forward(m, ids, &batch, kv, &kl, rows, NUM_TOKENS, r->logits);
    free(kv);
    model_destroy(m);
    return NULL;
}

/* Worst row of max|a - b| / max|a|. */
static double worst_row_diff(const float *a, const float *b, int rows, int vocab) {
    double worst = 0;
    for (int t = 0; t < rows; t++) {
        double scale = 1e-30, err = 0;
        for (int v = 0; v < vocab; v++) {
            scale = fmax(scale, fabs(a[(size_t)t * vocab + v]));
            err = fmax(err, fabs(a[(size_t)t * vocab + v] - b[(size_t)t * vocab + v]));
        }
        worst = fmax(worst, err / scale);
    }
    return worst;
}

/* Logits with `size` rank threads equal one rank's. */
static void check_ranks_match_one(const char *dir, int vocab, int size) {
    size_t n = (size_t)NUM_TOKENS * vocab;
    float *one = malloc(n * sizeof *one);
    RankRun single = {
        .dir = dir, .rank = 0, .size = 1, .vocab = vocab, .ops = test_cpu_ops(), .logits = one};
    run_rank(&single);
    if (single.status != PL_OK)
        fail_msg("one rank: %s", single.error);

    KernelOps ops = tp_ops();
    RankRun runs[MAX_RANKS];
    pthread_t threads[MAX_RANKS];
    group_size = size;
    pthread_barrier_init(&barrier, NULL, (unsigned)size);
    for (int r = 0; r < size; r++) {
        runs[r] = (RankRun){.dir = dir, .rank = r, .size = size, .vocab = vocab, .ops = &ops};
        runs[r].logits = malloc(n * sizeof(float));
        assert_int_equal(pthread_create(&threads[r], NULL, run_rank, &runs[r]), 0);
    }
    for (int r = 0; r < size; r++)
        pthread_join(threads[r], NULL);
    pthread_barrier_destroy(&barrier);
    for (int r = 0; r < size; r++)
        if (runs[r].status != PL_OK)
            fail_msg("rank %d of %d: %s", r, size, runs[r].error);
    for (int r = 0; r < size; r++) {
        double worst = worst_row_diff(one, runs[r].logits, NUM_TOKENS, vocab);
        print_message("%s, %d ranks, rank %d: worst row max|diff| / max|logit| = %.3g\n", dir, size,
                      r, worst);
        assert_true(worst < 1e-5);
    }
    for (int r = 0; r < size; r++)
        free(runs[r].logits);
    free(one);
}

static void test_logits_match_one_rank(void **state) {
    (void)state;
    check_ranks_match_one(STORIES_DIR, 512, 2);
    check_ranks_match_one(STORIES_DIR, 512, 4);
}

static char cut_dir[] = "/tmp/pagellm-tp-XXXXXX", mlp_dir[] = "/tmp/pagellm-tp8-XXXXXX";

static void test_uneven_vocabulary_matches_one_rank(void **state) {
    (void)state;
    check_ranks_match_one(cut_dir, 509, 2);
    check_ranks_match_one(cut_dir, 509, 4);
}

static void test_eight_ranks_replicate_kv_heads(void **state) {
    (void)state;
    check_ranks_match_one(mlp_dir, 512, 8);
}

/* Qwen3 (q/k norms), Qwen3-MoE and Mixtral (every expert's intermediate columns split, the
 * router whole) from tests/data/families/ (written by transformers; skipped without it). */
static void test_families_match_one_rank(void **state) {
    (void)state;
    static const char *names[] = {"qwen3", "qwen3-moe", "mixtral"};
    int ran = 0;
    for (int i = 0; i < 3; i++) {
        char dir[128], cfg[160];
        snprintf(dir, sizeof dir, "tests/data/families/%s", names[i]);
        snprintf(cfg, sizeof cfg, "%s/model.safetensors", dir);
        if (access(cfg, R_OK) != 0)
            continue;
        ModelConfig c;
        assert_int_equal(model_config_load(dir, &c), PL_OK);
        check_ranks_match_one(dir, c.vocab_size, 2);
        ran++;
    }
    if (!ran) {
        print_message("tests/data/families: no checkpoints, skipped\n");
        skip();
    }
}

/* ---- shard arithmetic and dummy weights ------------------------------------------------ */

static void test_vocab_slices(void **state) {
    (void)state;
    ModelConfig c;
    assert_int_equal(model_config_load(cut_dir, &c), PL_OK);
    assert_int_equal(c.vocab_size, 509);
    ModelShard s;
    assert_int_equal(model_shard(&c, 0, 1, &s), PL_OK);
    assert_int_equal(s.num_vocab, 509);
    assert_int_equal(s.first_vocab, 0);
    /* ceil(509 / 2) = 255, rounded up to a multiple of 8 */
    assert_int_equal(model_shard(&c, 1, 2, &s), PL_OK);
    assert_int_equal(s.num_vocab, 256);
    assert_int_equal(s.first_vocab, 256);
    assert_int_equal(model_shard(&c, 3, 4, &s), PL_OK);
    assert_int_equal(s.num_vocab, 128);
    assert_int_equal(s.first_vocab, 384);
}

/* Each rank's embedding and LM-head rows are the whole dummy model's rows (padding zero). */
static void test_dummy_vocab_slices_are_whole_rows(void **state) {
    (void)state;
    ModelConfig c;
    assert_int_equal(model_config_load(cut_dir, &c), PL_OK);
    c.tie_word_embeddings = 0; /* an LM head of its own too */
    ModelWeights whole;
    assert_int_equal(weights_dummy(&c, 7, NULL, NULL, &whole), PL_OK);
    const size_t H = (size_t)c.hidden_size;
    for (int size = 2; size <= 4; size += 2) {
        for (int rank = 0; rank < size; rank++) {
            ModelShard s;
            ModelWeights part;
            assert_int_equal(model_shard(&c, rank, size, &s), PL_OK);
            assert_int_equal(weights_dummy(&c, 7, NULL, &s, &part), PL_OK);
            const Tensor *mine[2] = {&part.embed, &part.lm_head};
            const Tensor *all[2] = {&whole.embed, &whole.lm_head};
            for (int k = 0; k < 2; k++) {
                assert_int_equal(mine[k]->shape[0], s.num_vocab);
                int valid = c.vocab_size - s.first_vocab;
                valid = valid > s.num_vocab ? s.num_vocab : valid;
                const float *p = mine[k]->data, *w = all[k]->data;
                assert_memory_equal(p, w + (size_t)s.first_vocab * H,
                                    (size_t)valid * H * sizeof(float));
                for (size_t i = (size_t)valid * H; i < (size_t)s.num_vocab * H; i++)
                    assert_true(p[i] == 0.0f);
            }
            weights_free(&part);
        }
    }
    weights_free(&whole);
}

static int setup(void **state) {
    (void)state;
    return mkdtemp(cut_dir) && write_cut_model(cut_dir, 509, 172) == 0 && mkdtemp(mlp_dir) &&
                   write_cut_model(mlp_dir, 512, 168) == 0
               ? 0
               : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s %s", cut_dir, mlp_dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vocab_slices),
        cmocka_unit_test(test_dummy_vocab_slices_are_whole_rows),
        cmocka_unit_test(test_logits_match_one_rank),
        cmocka_unit_test(test_uneven_vocabulary_matches_one_rank),
        cmocka_unit_test(test_eight_ranks_replicate_kv_heads),
        cmocka_unit_test(test_families_match_one_rank),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
