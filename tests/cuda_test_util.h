/* cuda_test_util.h - (test-only) helpers shared by the CUDA tests: GPU discovery that
 * skips cleanly, a seeded random stream, dtype rounding and conversion, host<->device
 * copies, poisoned scratch (whether a path wrote a buffer), tolerance checks printing the first
 * mismatches, and weights with a device twin.
 * Included by tests/test_*_cuda.c after cmocka.h and kernels.h; in a build without the CUDA
 * backend it only defines SKIP_TEST, UNIT and RUN_CUDA_TESTS. */
#ifndef PAGELLM_TESTS_CUDA_TEST_UTIL_H
#define PAGELLM_TESTS_CUDA_TEST_UTIL_H

/* A test that says it cannot run here (a build without the CUDA backend). */
#define SKIP_TEST(name)                                                                            \
    static void name(void **state) {                                                               \
        (void)state;                                                                               \
        print_message("CUDA backend not built: skipped\n");                                        \
        skip();                                                                                    \
    }

/* One cmocka test of a file's TESTS(X) list: {TESTS(UNIT)}. */
#define UNIT(name) cmocka_unit_test(name),

/* main's body: run the tests[] array, only those PAGELLM_CUDA_TEST_FILTER matches when set
 * (cmocka's pattern). */
#define RUN_CUDA_TESTS(tests)                                                                      \
    do {                                                                                           \
        const char *filter_ = getenv("PAGELLM_CUDA_TEST_FILTER");                                  \
        if (filter_ && *filter_)                                                                   \
            cmocka_set_test_filter(filter_);                                                       \
        return cmocka_run_group_tests(tests, NULL, NULL);                                          \
    } while (0)

#ifdef PAGELLM_HAVE_CUDA

static inline int gpu_available(void) {
    static int count = -1;
    if (count < 0)
        count = k_cuda_device_count();
    return count > 0;
}

#define REQUIRE_GPU()                                                                              \
    do {                                                                                           \
        if (!gpu_available()) {                                                                    \
            print_message("no CUDA device: skipped\n");                                            \
            skip();                                                                                \
        }                                                                                          \
    } while (0)

static uint64_t rng_state;

/* PAGELLM_CUDA_TEST_QUICK set: fewer cases (sanitizer runs). */
static inline int quick(void) {
    const char *q = getenv("PAGELLM_CUDA_TEST_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

static inline void rng_seed(uint64_t s) {
    rng_state = s;
}

static inline uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline float rnd(float lo, float hi) {
    return lo + (hi - lo) * (float)((rng_next() >> 40) * (1.0 / 16777216.0));
}

static inline void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}

/* v as stored in dt and read back. */
static inline float round_to(float v, DType dt) {
    switch (dt) {
        case DT_BF16:
            return pl_bf16_to_f32(pl_f32_to_bf16(v));
        case DT_F16:
            return pl_f16_to_f32(pl_f32_to_f16(v));
        default:
            return v;
    }
}

/* x[n] random in [lo, hi), rounded to dt (what the GPU will see). */
static inline float *rand_vec(size_t n, float lo, float hi, DType dt) {
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = round_to(rnd(lo, hi), dt);
    return x;
}

/* x[n] (fp32) converted to dt on the host. */
static inline void *to_dtype(const float *x, size_t n, DType dt) {
    size_t es = pl_dtype_size(dt);
    void *h = xmalloc(n * es);
    for (size_t i = 0; i < n; i++) {
        if (dt == DT_F32)
            ((float *)h)[i] = x[i];
        else if (dt == DT_BF16)
            ((uint16_t *)h)[i] = pl_f32_to_bf16(x[i]);
        else
            ((uint16_t *)h)[i] = pl_f32_to_f16(x[i]);
    }
    return h;
}

/* The byte a test fills a scratch buffer with, to see afterwards whether a path wrote it. */
enum { POISON = 0x7D };

/* Whether every byte of device buffer d is still POISON. */
static inline int still_poisoned(const void *d, size_t bytes) {
    unsigned char *h = xmalloc(bytes);
    k_cuda_memcpy(h, d, bytes);
    size_t i = 0;
    while (i < bytes && h[i] == POISON)
        i++;
    free(h);
    return i == bytes;
}

static inline void *upload(const void *host, size_t bytes) {
    void *d = k_cuda_malloc(bytes);
    k_cuda_memcpy(d, host, bytes);
    return d;
}

/* dst[n] = device array src of dt, as fp32. */
static inline void download_as(float *dst, const void *src, size_t n, DType dt) {
    size_t es = pl_dtype_size(dt);
    void *h = xmalloc(n * es);
    k_cuda_memcpy(h, src, n * es);
    for (size_t i = 0; i < n; i++) {
        if (dt == DT_F32)
            dst[i] = ((float *)h)[i];
        else if (dt == DT_BF16)
            dst[i] = pl_bf16_to_f32(((uint16_t *)h)[i]);
        else
            dst[i] = pl_f16_to_f32(((uint16_t *)h)[i]);
    }
    free(h);
}

/* Count elements outside |got - want| <= atol + rtol |want| (NaN fails); print the first few. */
static inline int check_close(const char *what, const float *got, const float *want, size_t n,
                              double tol) {
    int bad = 0;
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - (double)want[i]);
        if (err > worst || isnan(err))
            worst = isnan(err) ? INFINITY : err;
        if (!(err <= tol + tol * fabs((double)want[i]))) {
            if (bad < 5)
                print_error("%s: mismatch at %zu: got %.9g want %.9g (err %.3g)\n", what, i,
                            (double)got[i], (double)want[i], err);
            bad++;
        }
    }
    if (bad)
        print_error("%s: %d of %zu elements differ (worst %.3g, tol %.1g)\n", what, bad, n, worst,
                    tol);
    return bad;
}

static inline const char *dn(DType dt) {
    return pl_dtype_name(dt);
}

/* A weight tensor on the host (for the CPU op) and its device twin. */
typedef struct {
    Tensor host, dev;
} Weight;

static inline Weight make_weight(DType dt, int ndim, int64_t d0, int64_t d1, float lo, float hi) {
    size_t n = (size_t)d0 * (size_t)(ndim == 2 ? d1 : 1);
    float *v = rand_vec(n, lo, hi, dt);
    Weight w;
    memset(&w, 0, sizeof w);
    w.host.dtype = dt;
    w.host.ndim = ndim;
    w.host.shape[0] = d0;
    w.host.shape[1] = ndim == 2 ? d1 : 0;
    w.host.data = to_dtype(v, n, dt);
    w.dev = w.host;
    w.dev.data = upload(w.host.data, n * pl_dtype_size(dt));
    free(v);
    return w;
}

static inline void free_weight(Weight *w) {
    free(w->host.data);
    k_cuda_free(w->dev.data);
}

static inline int rnd_int(int n) {
    return (int)(rng_next() % (uint64_t)n);
}

/* A random permutation of 0..n-1 (malloc'd), e.g. physical block ids for a block table. */
static inline int *rnd_perm(int n) {
    int *perm = xmalloc(sizeof(int) * (size_t)n);
    for (int i = 0; i < n; i++)
        perm[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = rnd_int(i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    return perm;
}

/* Device copy of x[n] in dt (x already holds dt-representable values). */
static inline void *upload_as(const float *x, size_t n, DType dt) {
    void *h = to_dtype(x, n, dt);
    void *d = upload(h, n * pl_dtype_size(dt));
    free(h);
    return d;
}

#endif /* PAGELLM_HAVE_CUDA */
#endif
