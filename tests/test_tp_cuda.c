/* test_tp_cuda.c - tensor parallelism over two GPUs on the bundled model (stories260K: 8
 * heads, 4 KV heads, MLP 172, fp32): every position's logits with tensor-parallel-size 2
 * equal those of one GPU within fp32 all-reduce rounding (bf16 activations: within bf16
 * rounding), also with the vocabulary cut to 509 tokens so that the vocabulary-parallel LM
 * head's last slice ends in padding; greedy generations are identical; 48 concurrent
 * requests on a tiny KV pool (swapping, preempting) give the same tokens as on one GPU, with
 * swaps counted and every block free afterwards; the collectives themselves (one-shot and
 * NCCL all-reduce, exact on small integers; the fused all-reduce + add + RMSNorm against
 * the host; replays of a captured all-reduce) give the same results on both ranks; asking for
 * more GPUs than are visible is a one-line error. With four GPUs also TP=4, with eight TP=8
 * (KV heads replicated), against one GPU. Skips, saying so, without two GPUs (CI) or
 * without NCCL (and the wider cases without four or eight). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <pthread.h>
#include <unistd.h>

#include "engine.h"
#include "kernels.h"
#include "backend_test_util.h"
#include "tp_test_util.h"
#ifdef PAGELLM_HAVE_CUDA
#include "kernels_cuda.h"
#endif

#define MODEL_DIR "models/stories260K"
#define MAX_OUT   96

static int gpus_at_least(int n) {
#if defined(PAGELLM_HAVE_CUDA) && defined(PAGELLM_HAVE_NCCL)
    if (k_cuda_device_count() >= n)
        return 1;
    print_message("fewer than %d GPUs: tensor-parallel test skipped\n", n);
#else
    print_message("no CUDA backend with NCCL in this build: tensor-parallel tests skipped\n");
#endif
    return 0;
}

static int two_gpus(void) {
    return gpus_at_least(2);
}

static Engine *make_engine_of(const char *dir, const char *dtype, int tp, int gpu_blocks,
                              double swap_gib) {
    EngineConfig c = eng_config_default();
    c.model_dir = dir;
    c.dtype = dtype;
    c.device = "cuda";
    c.quiet = 1;
    c.tensor_parallel_size = tp;
    c.num_gpu_blocks_override = gpu_blocks;
    c.swap_space_gib = swap_gib;
    if (gpu_blocks)
        c.schedule_conservativeness = 0; /* admit freely: blocks run out, sequences swap */
    Engine *e = NULL;
    if (eng_create(&c, &e) != PL_OK)
        fail_msg("eng_create (tp %d): %s", tp, pl_error());
    return e;
}

static Engine *make_engine(int tp, int gpu_blocks, double swap_gib) {
    return make_engine_of(MODEL_DIR, "float32", tp, gpu_blocks, swap_gib);
}

/* Every position's logits of one prompt with tensor-parallel-size tp vs 1. */
static void check_tp_logits_match(const char *dir, const char *dtype, int vocab, int tp,
                                  double tol) {
    int32_t ids[40];
    for (int i = 0; i < 40; i++)
        ids[i] = 1 + (i * 37) % (vocab - 1);
    ids[39] = vocab - 1; /* the last slice's last id */
    float *one = malloc(sizeof(float) * 40 * vocab), *two = malloc(sizeof(float) * 40 * vocab);
    Engine *e1 = make_engine_of(dir, dtype, 1, 0, 1), *e2 = make_engine_of(dir, dtype, tp, 0, 1);
    assert_int_equal(eng_prompt_logits(e1, ids, 40, one), PL_OK);
    assert_int_equal(eng_prompt_logits(e2, ids, 40, two), PL_OK);
    double worst = 0;
    for (int t = 0; t < 40; t++) {
        double scale = 1e-30, err = 0;
        for (int v = 0; v < vocab; v++) {
            scale = fmax(scale, fabs(one[t * vocab + v]));
            err = fmax(err, fabs(one[t * vocab + v] - two[t * vocab + v]));
        }
        worst = fmax(worst, err / scale);
    }
    print_message("%s %s, vocab %d: tp=%d vs tp=1 logits: worst row max|diff| / max|logit| = "
                  "%.3g\n",
                  dir, dtype, vocab, tp, worst);
    assert_true(worst < tol);
    eng_destroy(e1);
    eng_destroy(e2);
    free(one);
    free(two);
}

static void test_logits_match_one_gpu(void **state) {
    (void)state;
    if (!two_gpus())
        skip();
    check_tp_logits_match(MODEL_DIR, "float32", 512, 2, 1e-5);
    check_tp_logits_match(MODEL_DIR, "bfloat16", 512, 2, 5e-2);
}

/* The same, fp32 and bf16, on stories260K cut to `vocab` tokens and `intermediate` MLP
 * columns (tp_test_util.h), written to a temporary folder. */
static void check_cut_model_matches(int vocab, int intermediate, int tp) {
    char dir[] = "/tmp/pagellm-tp-cuda-XXXXXX";
    assert_non_null(mkdtemp(dir));
    assert_int_equal(write_cut_model(dir, vocab, intermediate), 0);
    check_tp_logits_match(dir, "float32", vocab, tp, 1e-5);
    check_tp_logits_match(dir, "bfloat16", vocab, tp, 5e-2);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_uneven_vocabulary_matches_one_gpu(void **state) {
    (void)state;
    if (!two_gpus())
        skip();
    check_cut_model_matches(509, 172, 2);
}

/* Four GPUs: stories260K at TP=4 (2 query heads and one KV head per rank). Eight: cut to 168
 * MLP columns, TP=8 (one query head per rank, each KV head replicated on two ranks). */
static void test_wider_tp_matches_one_gpu(void **state) {
    (void)state;
    if (!gpus_at_least(4))
        skip();
    check_tp_logits_match(MODEL_DIR, "float32", 512, 4, 1e-5);
    check_tp_logits_match(MODEL_DIR, "bfloat16", 512, 4, 5e-2);
    if (gpus_at_least(8))
        check_cut_model_matches(512, 168, 8);
}

typedef struct {
    int32_t prompt[64];
    int num_prompt;
    int32_t out[MAX_OUT];
    int num_out;
} Job;

static void run_jobs(Engine *e, Job *jobs, int n) {
    for (int i = 0; i < n; i++) {
        EngRequest r = {.prompt = jobs[i].prompt, .num_prompt = jobs[i].num_prompt};
        r.user = &jobs[i];
        r.params.max_tokens = 40 + i % 40;
        r.params.ignore_eos = 1;
        r.params.sampling = sampling_params_default();
        jobs[i].num_out = 0;
        assert_int_equal(eng_add_request(e, &r, NULL), PL_OK);
    }
    while (eng_has_work(e)) {
        const EngEvent *ev;
        int count = eng_step(e, &ev);
        for (int k = 0; k < count; k++) {
            Job *j = ev[k].user;
            if (ev[k].token >= 0 && j->num_out < MAX_OUT)
                j->out[j->num_out++] = ev[k].token;
        }
    }
}

static void make_jobs(Job *jobs, int n) {
    for (int i = 0; i < n; i++) {
        jobs[i].num_prompt = 8 + i % 24;
        jobs[i].prompt[0] = 1;
        for (int t = 1; t < jobs[i].num_prompt; t++)
            jobs[i].prompt[t] = 2 + (i * 131 + t * 17) % 500;
    }
}

static void test_greedy_and_swap_match_one_gpu(void **state) {
    (void)state;
    if (!two_gpus())
        skip();
    enum { N = 48 };
    static Job one[N], two[N];
    make_jobs(one, N);
    make_jobs(two, N);
    Engine *e1 = make_engine(1, 0, 1);
    run_jobs(e1, one, N);
    eng_destroy(e1);
    /* 48 requests of up to 110 tokens need ~200 blocks of 16 at once: 40 force preemption */
    Engine *e2 = make_engine(2, 40, 0.05);
    run_jobs(e2, two, N);
    EngineStats s = eng_stats(e2);
    print_message("tp=2 under pressure: %lld swap-outs, %lld recomputes\n",
                  (long long)s.sched.preempt_swap, (long long)s.sched.preempt_recompute);
    assert_true(s.sched.preempt_swap > 0);
    assert_int_equal(s.free_gpu_blocks, s.num_gpu_blocks);
    assert_int_equal(s.free_cpu_blocks, s.num_cpu_blocks);
    for (int i = 0; i < N; i++) {
        assert_int_equal(two[i].num_out, one[i].num_out);
        if (memcmp(two[i].out, one[i].out, (size_t)one[i].num_out * sizeof(int32_t)))
            fail_msg("request %d: tp=2 tokens differ from tp=1", i);
    }
    eng_destroy(e2);
}

#if defined(PAGELLM_HAVE_CUDA) && defined(PAGELLM_HAVE_NCCL)
/* ---- the collectives, driven directly: one thread per rank ---------------------------- */

enum { NORM_DIM = 4096 };

typedef struct {
    int rank;
    const KernelOps *ops;
    int errors;
    char first_error[200];
    float *normed; /* [rows, NORM_DIM]: the fused op's output, compared across ranks */
    int rows;
} CollJob;

static void coll_error(CollJob *j, const char *fmt, ...) {
    if (j->errors++ == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(j->first_error, sizeof j->first_error, fmt, ap);
        va_end(ap);
    }
}

/* Host fp32 <-> the ops' act dtype. */
static void to_act(void *dst, const float *src, size_t n, DType act) {
    for (size_t i = 0; i < n; i++) {
        if (act == DT_F32)
            ((float *)dst)[i] = src[i];
        else
            ((uint16_t *)dst)[i] = pl_f32_to_bf16(src[i]);
    }
}

static float act_at(const void *p, size_t i, DType act) {
    return act == DT_F32 ? ((const float *)p)[i] : pl_bf16_to_f32(((const uint16_t *)p)[i]);
}

static float small_value(int rank, size_t i) { /* sums of these are exact in bf16 */
    return 0.25f * (float)((rank + 1) * (int)(i % 7 + 1));
}

/* Sums of several sizes (one-shot pushed and pulled, the scalar tail, NCCL beyond the
 * staging), repeated so that both staging halves are used many times; then replays of a
 * captured all-reduce. */
static void sums(CollJob *j, DType act, size_t es) {
    const KernelOps *ops = j->ops;
    const size_t sizes[] = {8, 4096 * 3 + 5, (size_t)5 << 20, 1, 300000};
    size_t max = (size_t)5 << 20;
    void *dev = ops->alloc(ops, max * es), *host = malloc(max * es);
    float *in = malloc(max * sizeof(float));
    for (int it = 0; it < 40 && !j->errors; it++) {
        size_t n = sizes[it % 5];
        for (size_t i = 0; i < n; i++)
            in[i] = small_value(j->rank, i + (size_t)it);
        to_act(host, in, n, act);
        ops->to_device(ops, dev, host, n * es);
        ops->all_reduce(ops, dev, n);
        ops->to_host(ops, host, dev, n * es);
        for (size_t i = 0; i < n; i++) {
            float want = small_value(0, i + (size_t)it) + small_value(1, i + (size_t)it);
            if (act_at(host, i, act) != want) {
                coll_error(j, "all_reduce of %zu (iteration %d): element %zu is %g, want %g", n, it,
                           i, act_at(host, i, act), want);
                break;
            }
        }
    }
    size_t n = 4096;
    for (size_t i = 0; i < n; i++)
        in[i] = small_value(j->rank, i);
    to_act(host, in, n, act);
    ops->to_device(ops, dev, host, n * es);
    ops->synchronize(ops);
    ops->graph_begin(ops);
    ops->all_reduce(ops, dev, n);
    void *graph = ops->graph_end(ops);
    for (int k = 0; k < 10; k++) /* x0 + x1, then doubled by each replay after the first */
        ops->graph_launch(ops, graph);
    ops->to_host(ops, host, dev, n * es);
    ops->graph_destroy(ops, graph);
    for (size_t i = 0; i < n && !j->errors; i++) {
        float want = 512.0f * (small_value(0, i) + small_value(1, i));
        if (act_at(host, i, act) != want)
            coll_error(j, "replayed all_reduce: element %zu is %g, want %g", i,
                       act_at(host, i, act), want);
    }
    ops->free(ops, dev);
    free(host);
    free(in);
}

/* The fused all-reduce + residual add + RMSNorm against the host, rows of NORM_DIM. */
static void fused_norm(CollJob *j, DType act, size_t es) {
    const KernelOps *ops = j->ops;
    size_t n = (size_t)j->rows * NORM_DIM;
    float *res = malloc(n * sizeof(float)), *delta = malloc(n * sizeof(float));
    float *w = malloc(NORM_DIM * sizeof(float));
    void *host = malloc(n * es);
    for (size_t i = 0; i < n; i++)
        res[i] = (float)((int)(i % 13) - 6) * 0.125f;
    for (int d = 0; d < NORM_DIM; d++)
        w[d] = 0.5f + (float)(d % 5) * 0.25f;
    void *d_res = ops->alloc(ops, n * es), *d_delta = ops->alloc(ops, n * es),
         *d_out = ops->alloc(ops, n * es);
    void *d_w = ops->alloc(ops, NORM_DIM * sizeof(float));
    ops->to_device(ops, d_w, w, NORM_DIM * sizeof(float));
    to_act(host, res, n, act);
    ops->to_device(ops, d_res, host, n * es);
    for (size_t i = 0; i < n; i++)
        delta[i] = small_value(j->rank, i);
    to_act(host, delta, n, act);
    ops->to_device(ops, d_delta, host, n * es);
    Tensor wt = {.data = d_w, .dtype = DT_F32, .ndim = 1, .shape = {NORM_DIM}};
    ops->all_reduce_add_rmsnorm(ops, d_res, d_delta, d_out, &wt, j->rows, NORM_DIM, 1e-5f);
    ops->to_host(ops, host, d_out, n * es);
    for (size_t i = 0; i < n; i++)
        j->normed[i] = act_at(host, i, act);
    double tol = act == DT_F32 ? 1e-5 : 1e-2;
    for (int r = 0; r < j->rows && !j->errors; r++) {
        float row[NORM_DIM];
        double ss = 0;
        for (int d = 0; d < NORM_DIM; d++) {
            size_t i = (size_t)r * NORM_DIM + d;
            float sum = res[i] + small_value(0, i) + small_value(1, i);
            row[d] = act == DT_F32 ? sum : pl_bf16_to_f32(pl_f32_to_bf16(sum));
            ss += (double)row[d] * row[d];
        }
        double inv = 1.0 / sqrt(ss / NORM_DIM + 1e-5);
        for (int d = 0; d < NORM_DIM; d++) {
            double want = w[d] * row[d] * inv, got = j->normed[(size_t)r * NORM_DIM + d];
            if (fabs(got - want) > tol * (1 + fabs(want))) {
                coll_error(j, "all_reduce_add_rmsnorm, %d rows: row %d dim %d is %g, want %g",
                           j->rows, r, d, got, want);
                break;
            }
        }
    }
    ops->free(ops, d_res);
    ops->free(ops, d_delta);
    ops->free(ops, d_out);
    ops->free(ops, d_w);
    free(res);
    free(delta);
    free(w);
    free(host);
}

static void *collectives_rank(void *arg) {
    CollJob *j = arg;
    j->ops->bind(j->ops);
    size_t es = pl_dtype_size(j->ops->act);
    sums(j, j->ops->act, es);
    if (!j->errors)
        fused_norm(j, j->ops->act, es);
    return NULL;
}

static void check_collectives(DType act, int rows) {
    CollJob jobs[2];
    pthread_t threads[2];
    KernelOps *group[2];
    KernelOpenOptions o = {.backend = "cuda", .act = act, .size = 2, .custom_all_reduce = 1};
    assert_int_equal(k_open(&o, group), PL_OK);
    for (int r = 0; r < 2; r++) {
        jobs[r] = (CollJob){.rank = r, .ops = group[r], .rows = rows};
        jobs[r].normed = malloc((size_t)rows * NORM_DIM * sizeof(float));
        assert_int_equal(pthread_create(&threads[r], NULL, collectives_rank, &jobs[r]), 0);
    }
    for (int r = 0; r < 2; r++)
        pthread_join(threads[r], NULL);
    for (int r = 0; r < 2; r++)
        if (jobs[r].errors)
            fail_msg("%s, rank %d: %s", pl_dtype_name(act), r, jobs[r].first_error);
    assert_memory_equal(jobs[0].normed, jobs[1].normed, (size_t)rows * NORM_DIM * sizeof(float));
    print_message("collectives %s, fused rows %d: both ranks agree\n", pl_dtype_name(act), rows);
    for (int r = 0; r < 2; r++)
        free(jobs[r].normed);
    k_close(group, 2);
}

static void test_collectives(void **state) {
    (void)state;
    if (!two_gpus())
        skip();
    check_collectives(DT_F32, 3);
    check_collectives(DT_BF16, 3);
    check_collectives(DT_BF16, 700); /* 5.5 MB: the one-shot kernel's many rows per block */
    check_collectives(DT_F32, 700);  /* 11 MB: NCCL, then the add + norm */
}
#endif

static void test_too_many_gpus_is_an_error(void **state) {
    (void)state;
#ifdef PAGELLM_HAVE_CUDA
    int have = k_cuda_device_count();
    if (have == 0) {
        print_message("no CUDA device: skipped\n");
        skip();
    }
    EngineConfig c = eng_config_default();
    c.model_dir = MODEL_DIR;
    c.device = "cuda";
    c.quiet = 1;
    c.tensor_parallel_size = have + 1;
    Engine *e = NULL;
    assert_int_not_equal(eng_create(&c, &e), PL_OK);
    assert_null(e);
    char want[64];
    snprintf(want, sizeof want, "needs %d GPUs; %d visible", have + 1, have);
    if (!strstr(pl_error(), want) && !strstr(pl_error(), "NCCL"))
        fail_msg("unexpected error: %s", pl_error());
#else
    print_message("CUDA backend not built: skipped\n");
    skip();
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_logits_match_one_gpu),
        cmocka_unit_test(test_uneven_vocabulary_matches_one_gpu),
        cmocka_unit_test(test_wider_tp_matches_one_gpu),
#if defined(PAGELLM_HAVE_CUDA) && defined(PAGELLM_HAVE_NCCL)
        cmocka_unit_test(test_collectives),
#endif
        cmocka_unit_test(test_greedy_and_swap_match_one_gpu),
        cmocka_unit_test(test_too_many_gpus_is_an_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
