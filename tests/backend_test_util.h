/* backend_test_util.h - (test-only) opened backends for tests that call ops directly: the CPU
 * backend, opened on first use and kept for the test binary (the reference every GPU test
 * compares with), and in a CUDA build one CUDA backend per activation dtype on device 0.
 * Included after cmocka.h and kernels.h. */
#ifndef PAGELLM_TESTS_BACKEND_TEST_UTIL_H
#define PAGELLM_TESTS_BACKEND_TEST_UTIL_H

static inline KernelOps *open_backend_or_fail(const char *name, DType act) {
    KernelOpenOptions o = {.backend = name, .act = act};
    KernelOps *k = NULL;
    if (k_open(&o, &k) != PL_OK)
        fail_msg("k_open(%s, %s): %s", name, pl_dtype_name(act), pl_error());
    return k;
}

static inline const KernelOps *test_cpu_ops(void) {
    static KernelOps *cpu;
    if (!cpu)
        cpu = open_backend_or_fail("cpu", DT_F32);
    return cpu;
}

/* One row's draw as the tests describe it: parameters and token history (host memory). */
typedef struct {
    const SamplingParams *params;
    const int32_t *prompt;
    int num_prompt;
    const int32_t *output;
    int num_output;
} TestDraw;

/* sample_rows of a host-memory backend over rows described by draws[n]: their SampleRows and
 * packed history made here. */
static inline void test_sample(const KernelOps *k, int32_t *tokens, float *logits, int n, int vocab,
                               const TestDraw *draws) {
    SampleRow *rows = calloc((size_t)n + 1, sizeof *rows);
    size_t len = 0, at = 0;
    for (int i = 0; i < n; i++)
        len += (size_t)draws[i].num_prompt + (size_t)draws[i].num_output;
    int32_t *history = malloc((len + 1) * sizeof *history);
    for (int i = 0; i < n; i++) {
        const TestDraw *d = &draws[i];
        rows[i] = k_sample_row(d->params, d->num_prompt, d->num_output, (int)at);
        if (d->num_prompt)
            memcpy(history + at, d->prompt, (size_t)d->num_prompt * sizeof *history);
        at += (size_t)d->num_prompt;
        if (d->num_output)
            memcpy(history + at, d->output, (size_t)d->num_output * sizeof *history);
        at += (size_t)d->num_output;
    }
    k->sample_rows(k, tokens, NULL, logits, n, vocab, rows, history, 0, NULL, 0);
    free(history);
    free(rows);
}

#ifdef PAGELLM_HAVE_CUDA
static inline const KernelOps *test_cuda_ops(DType act) {
    static KernelOps *cuda[3]; /* F32, BF16, F16 */
    int i = act == DT_BF16 ? 1 : act == DT_F16 ? 2 : 0;
    if (!cuda[i])
        cuda[i] = open_backend_or_fail("cuda", act);
    cuda[i]->bind(cuda[i]);
    return cuda[i];
}
#endif

#endif
