/* test_constraint_async.c - structured output under asynchronous scheduling, on the bundled
 * model (which knows nothing of JSON): constrained requests take the overlapped steps (their
 * masks for step N + 1 built once step N's tokens are read, while step N + 1's forward runs),
 * and give exactly the tokens of the same seeded requests run with every step waiting for its
 * tokens, among unconstrained ones, under KV-memory pressure (swap, then recompute), with
 * aborts, n > 1 samples and grammars completing mid-run; every finished output is one the
 * constraint accepts, and no block leaks. A constraint that starts after a text (a reasoning
 * section's end; here "." as one token, or "y." in bytes across tokens): the output up to it
 * is the unconstrained output of the same seed, the rest is accepted by the constraint; with an
 * opener (the section optional) an output that does not open it is constrained throughout. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "grammar.h"

#define MODEL_DIR "models/stories260K"
#define MAX_OUT   160
#define MAX_JOBS  48
#define MAX_N     3

static const char *SCHEMA =
    "{\"type\": \"object\", \"properties\": {"
    "\"name\": {\"type\": \"string\", \"minLength\": 1, \"maxLength\": 8},"
    "\"age\": {\"type\": \"integer\", \"minimum\": 0, \"maximum\": 120},"
    "\"score\": {\"type\": \"number\"},"
    "\"mood\": {\"enum\": [\"happy\", \"sad\", \"calm\"]},"
    "\"pet\": {\"type\": \"object\", \"properties\": {\"kind\": {\"enum\": [\"cat\", \"dog\"]},"
    "  \"legs\": {\"type\": \"integer\"}}, \"required\": [\"kind\"], "
    "  \"additionalProperties\": false},"
    "\"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\", \"maxLength\": 5},"
    "  \"minItems\": 1, \"maxItems\": 3}},"
    "\"required\": [\"name\", \"age\", \"mood\", \"pet\", \"tags\"],"
    "\"additionalProperties\": false}";

static const char *sentences[] = {"Once upon a time", "Lily and Tom", "The cat sat on the",
                                  "One day, a little bird"};

/* One sample's output. */
typedef struct {
    int32_t out[MAX_OUT];
    int num_out;
    char text[4 * MAX_OUT + 1];
    size_t text_len;
    FinishReason finish;
} Sample;

typedef struct {
    int32_t prompt[32];
    int num_prompt;
    GenerateParams gp;
    int at;       /* step it is added at */
    int abort_at; /* step it is aborted at (-1: never) */
    uint64_t id;
    Sample s[MAX_N];
} Job;

typedef struct {
    GrCompiled *c[3]; /* schema, regex, choice */
} Constraints;

static Constraints compile_all(void) {
    Constraints k;
    char err[256];
    json_error_t je;
    json_t *schema = json_loads(SCHEMA, 0, &je);
    assert_non_null(schema);
    k.c[0] = gr_compile_json_schema(schema, err, sizeof err);
    json_decref(schema);
    const char *re = "[A-Z][a-z]{1,6} (is|was) [0-9]{1,3}(\\.[0-9])?";
    k.c[1] = gr_compile_regex(re, strlen(re), err, sizeof err);
    const char *choices[] = {"yes", "no", "maybe not"};
    size_t lens[] = {3, 2, 9};
    k.c[2] = gr_compile_choice(choices, lens, 3, err, sizeof err);
    for (int i = 0; i < 3; i++)
        assert_non_null(k.c[i]);
    return k;
}

static void free_all(Constraints *k) {
    for (int i = 0; i < 3; i++)
        gr_compiled_free(k->c[i]);
}

static Engine *make_engine(int async, int gpu_blocks, int swap_blocks) {
    EngineConfig c = eng_config_default();
    c.model_dir = MODEL_DIR;
    c.quiet = 1;
    c.async_scheduling = async;
    c.enable_prefix_caching = 0;
    if (gpu_blocks) {
        c.num_gpu_blocks_override = gpu_blocks;
        c.schedule_conservativeness = 0; /* admit freely: blocks run out, sequences preempted */
        c.max_num_batched_tokens = 64;
    }
    /* one block: 5 layers, K and V, 16 tokens of 8 fp32 KV dims per layer */
    c.swap_space_gib = swap_blocks * 5.0 * 2 * 16 * 8 * 4 / (1024.0 * 1024.0 * 1024.0);
    Engine *e = NULL;
    if (eng_create(&c, &e) != PL_OK)
        fail_msg("eng_create: %s", pl_error());
    return e;
}

/* n jobs: constraint i % 4 (the fourth unconstrained), seeded sampling, some with n = 3, stop
 * tokens, aborts or late arrivals as `mix` asks. */
static void make_jobs(Engine *e, const Constraints *k, Job *jobs, int n, int mix) {
    memset(jobs, 0, (size_t)n * sizeof *jobs);
    for (int i = 0; i < n; i++) {
        Job *j = &jobs[i];
        int32_t *ids;
        const char *text = sentences[i % 4];
        assert_int_equal(tok_encode(eng_tokenizer(e), text, strlen(text), 1, &ids, &j->num_prompt),
                         PL_OK);
        memcpy(j->prompt, ids, (size_t)j->num_prompt * sizeof(int32_t));
        free(ids);
        j->prompt[j->num_prompt++] = 300 + i; /* no two prompts alike */
        j->gp = (GenerateParams){.sampling = sampling_params_default(), .max_tokens = MAX_OUT};
        j->gp.sampling.temperature = 1.0f;
        j->gp.sampling.seed = 1000 + (uint64_t)i;
        j->gp.constraint = i % 4 < 3 ? k->c[i % 4] : NULL;
        if (!j->gp.constraint)
            j->gp.max_tokens = 20 + i;
        j->abort_at = -1;
        if (mix) {
            j->at = i % 3 == 0 ? i : 0;
            if (i % 5 == 1)
                j->gp.n = 3;
            if (i % 7 == 3)
                j->abort_at = j->at + 4 + i % 5;
        }
    }
}

/* Run the jobs to the end; returns the number of steps. */
static int run(Engine *e, Job *jobs, int n) {
    int steps = 0, added = 0;
    while (added < n || eng_has_work(e)) {
        for (int i = 0; i < n; i++) {
            Job *j = &jobs[i];
            if (j->at == steps) {
                EngRequest r = {
                    .prompt = j->prompt, .num_prompt = j->num_prompt, .params = j->gp, .user = j};
                assert_int_equal(eng_add_request(e, &r, &j->id), PL_OK);
                added++;
            }
            if (j->abort_at == steps)
                eng_abort(e, j->id);
        }
        const EngEvent *ev;
        int count = eng_step(e, &ev);
        for (int q = 0; q < count; q++) {
            Sample *s = &((Job *)ev[q].user)->s[ev[q].index];
            if (ev[q].token >= 0) {
                assert_true(s->num_out < MAX_OUT);
                s->out[s->num_out++] = ev[q].token;
            }
            assert_true(s->text_len + ev[q].text_len < sizeof s->text);
            memcpy(s->text + s->text_len, ev[q].text, ev[q].text_len);
            s->text_len += ev[q].text_len;
            if (ev[q].finish != FINISH_NONE)
                s->finish = ev[q].finish;
        }
        assert_true(++steps < 100000);
    }
    EngineStats st = eng_stats(e);
    assert_int_equal(st.free_gpu_blocks, st.num_gpu_blocks);
    assert_int_equal(st.free_cpu_blocks, st.num_cpu_blocks);
    return steps;
}

/* Same tokens, text and finish per sample (an aborted request: the tokens of the run that got
 * further start with the other's, since the abort lands a step later or sooner); a constrained
 * sample that stopped is accepted by its constraint. Returns how many constrained samples
 * completed. */
static int compare(const Job *a, const Job *b, int n) {
    int completed = 0;
    for (int i = 0; i < n; i++) {
        for (int x = 0; x < (a[i].gp.n > 1 ? a[i].gp.n : 1); x++) {
            const Sample *p = &a[i].s[x], *q = &b[i].s[x];
            if (a[i].abort_at >= 0 && (p->finish == FINISH_ABORT || q->finish == FINISH_ABORT)) {
                int common = p->num_out < q->num_out ? p->num_out : q->num_out;
                assert_memory_equal(p->out, q->out, (size_t)common * 4);
                continue;
            }
            if (p->num_out != q->num_out || memcmp(p->out, q->out, (size_t)p->num_out * 4))
                fail_msg("job %d sample %d: %d tokens vs %d, or different ones:\n%.*s\n%.*s", i, x,
                         p->num_out, q->num_out, (int)p->text_len, p->text, (int)q->text_len,
                         q->text);
            assert_int_equal(p->finish, q->finish);
            assert_true(p->text_len == q->text_len && !memcmp(p->text, q->text, p->text_len));
            assert_int_not_equal(p->finish, FINISH_NONE);
            if (a[i].gp.constraint && !a[i].gp.constraint_after && p->finish == FINISH_STOP) {
                if (!gr_compiled_accepts(a[i].gp.constraint, p->text, p->text_len))
                    fail_msg("job %d sample %d: not accepted: %.*s", i, x, (int)p->text_len,
                             p->text);
                completed++;
            }
        }
    }
    return completed;
}

/* The jobs with asynchronous scheduling (on a pool of gpu_blocks, 0 = roomy, and swap_blocks
 * of swap space) against the same jobs with every step waiting. */
static void async_against_sync(int mix, int gpu_blocks, int swap_blocks, int expect_preempt) {
    Constraints k = compile_all();
    static Job async_jobs[MAX_JOBS], sync_jobs[MAX_JOBS];
    Engine *e = make_engine(1, gpu_blocks, swap_blocks);
    make_jobs(e, &k, async_jobs, MAX_JOBS, mix);
    memcpy(sync_jobs, async_jobs, sizeof async_jobs);
    int steps = run(e, async_jobs, MAX_JOBS);
    EngineStats st = eng_stats(e);
    eng_destroy(e);
    Engine *s = make_engine(0, gpu_blocks, swap_blocks);
    run(s, sync_jobs, MAX_JOBS);
    eng_destroy(s);
    int completed = compare(async_jobs, sync_jobs, MAX_JOBS);
    print_message("%lld of %d steps overlapped; preempted: %lld swap, %lld recompute; "
                  "%d constrained samples complete\n",
                  (long long)st.overlapped_steps, steps, (long long)st.sched.preempt_swap,
                  (long long)st.sched.preempt_recompute, completed);
    /* constrained steps overlap (n > 1 requests make steps wait until they forked) */
    assert_true(mix ? st.overlapped_steps > 0 : st.overlapped_steps > steps * 9 / 10);
    assert_true(completed > MAX_JOBS / 2);
    if (expect_preempt)
        assert_true(st.sched.preempt_swap + st.sched.preempt_recompute > 0);
    free_all(&k);
}

/* The first end of `after` in text[0..len), or 0 if it does not appear. */
static size_t end_of(const char *text, size_t len, const char *after) {
    size_t m = strlen(after);
    for (size_t i = 0; i + m <= len; i++)
        if (!memcmp(text + i, after, m))
            return i + m;
    return 0;
}

/* n jobs following constraint i % 3 after `after` (a section `opener` may open; NULL: the
 * output starts inside it), greedy with an opener, else seeded; and the same jobs
 * unconstrained in free_jobs, run to the end on e. */
static void sectioned_jobs(Engine *e, const Constraints *k, Job *jobs, Job *free_jobs, int n,
                           const char *after, const char *opener) {
    make_jobs(e, k, jobs, n, 0);
    for (int i = 0; i < n; i++) {
        if (opener)
            jobs[i].gp.sampling = sampling_params_default();
        jobs[i].gp.constraint = k->c[i % 3];
        jobs[i].gp.constraint_after = after;
        jobs[i].gp.constraint_opener = opener;
        jobs[i].gp.max_tokens = MAX_OUT;
    }
    memcpy(free_jobs, jobs, (size_t)n * sizeof *jobs);
    for (int i = 0; i < n; i++)
        free_jobs[i].gp.constraint = NULL;
    run(e, free_jobs, n);
}

/* Constraint i % 3 after `after`, 24 seeded jobs, async and sync; against the same jobs
 * unconstrained. */
static void constraint_after(const char *after) {
    enum { N = 24 };
    Constraints k = compile_all();
    static Job free_jobs[N], async_jobs[N], sync_jobs[N];
    Engine *e = make_engine(1, 0, 0);
    sectioned_jobs(e, &k, async_jobs, free_jobs, N, after, NULL);
    memcpy(sync_jobs, async_jobs, sizeof async_jobs);
    run(e, async_jobs, N);
    eng_destroy(e);
    Engine *s = make_engine(0, 0, 0);
    run(s, sync_jobs, N);
    eng_destroy(s);
    compare(async_jobs, sync_jobs, N);
    int started = 0, completed = 0;
    for (int i = 0; i < N; i++) {
        const Sample *c = &async_jobs[i].s[0], *f = &free_jobs[i].s[0];
        size_t at = end_of(c->text, c->text_len, after);
        if (!at) { /* never there: all of it free */
            assert_int_equal(c->finish, FINISH_LENGTH);
            assert_memory_equal(c->out, f->out, (size_t)c->num_out * 4);
            continue;
        }
        started++;
        /* free up to the text, token for token: the same as without a constraint */
        assert_true(f->text_len >= at && !memcmp(c->text, f->text, at));
        if (c->finish != FINISH_STOP)
            continue;
        if (!gr_compiled_accepts(async_jobs[i].gp.constraint, c->text + at, c->text_len - at))
            fail_msg("job %d: not accepted after %zu bytes: %.*s", i, at, (int)c->text_len,
                     c->text);
        completed++;
    }
    print_message("after \"%s\": %d of %d samples reached it, %d completed the constraint\n", after,
                  started, N, completed);
    assert_true(started > N / 2 && completed > N / 3);
    free_all(&k);
}

static void test_constraint_after_a_token(void **state) {
    (void)state;
    constraint_after(".");
}

static void test_constraint_after_bytes_across_tokens(void **state) {
    (void)state;
    constraint_after("y.");
}

/* An optional section: greedy jobs whose first token may be "," (the section's opener, allowed
 * beside the constraint's tokens), which the bundled model writes first after "Once upon a
 * time". A job that opens with it unconstrained does so constrained too, and is free up to "."
 * as without a constraint; one that does not open it is accepted by the constraint whole. */
static void test_constraint_after_an_optional_opener(void **state) {
    (void)state;
    enum { N = 16 };
    Constraints k = compile_all();
    static Job jobs[N], free_jobs[N];
    Engine *e = make_engine(1, 0, 0);
    sectioned_jobs(e, &k, jobs, free_jobs, N, ".", ",");
    run(e, jobs, N);
    eng_destroy(e);
    int opened = 0, whole = 0;
    for (int i = 0; i < N; i++) {
        const Sample *c = &jobs[i].s[0], *f = &free_jobs[i].s[0];
        size_t at = 0;
        if (f->text_len && f->text[0] == ',') { /* "," wins without the constraint: with it too */
            opened++;
            at = end_of(c->text, c->text_len, ".");
            assert_true(at > 0 && f->text_len >= at && !memcmp(c->text, f->text, at));
        } else if (c->text_len && c->text[0] == ',') { /* "," beat the constraint's tokens */
            at = end_of(c->text, c->text_len, ".");
        } else {
            whole++;
        }
        if (c->finish == FINISH_STOP &&
            !gr_compiled_accepts(jobs[i].gp.constraint, c->text + at, c->text_len - at))
            fail_msg("job %d: not accepted after %zu bytes: %.*s", i, at, (int)c->text_len,
                     c->text);
    }
    print_message("%d opened the section as unconstrained, %d were constrained throughout\n",
                  opened, whole);
    assert_true(opened > 0 && whole > 0);
    free_all(&k);
}

static void test_async_equals_sync(void **state) {
    (void)state;
    async_against_sync(0, 0, 0, 0);
}

/* n = 3 samples forked, aborts, late arrivals. */
static void test_async_equals_sync_with_forks_and_aborts(void **state) {
    (void)state;
    async_against_sync(1, 0, 0, 0);
}

static void test_async_equals_sync_under_swap(void **state) {
    (void)state;
    async_against_sync(1, 24, 400, 1);
}

static void test_async_equals_sync_under_recompute(void **state) {
    (void)state;
    async_against_sync(1, 24, 0, 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_async_equals_sync),
        cmocka_unit_test(test_async_equals_sync_with_forks_and_aborts),
        cmocka_unit_test(test_async_equals_sync_under_swap),
        cmocka_unit_test(test_async_equals_sync_under_recompute),
        cmocka_unit_test(test_constraint_after_a_token),
        cmocka_unit_test(test_constraint_after_bytes_across_tokens),
        cmocka_unit_test(test_constraint_after_an_optional_opener),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
