/* matmul.c - out[n, N] = x[n, K] w[N, K]^T (+ bias), fp32 activations, F32/F16/BF16 weights.
 *
 * Loop order: a tile of x rows (sized to stay in L2) outermost, then groups of 4 weight rows,
 * then groups of 3 x rows innermost, so for a decode batch every weight row is streamed from
 * memory exactly once per call. Weights are converted to fp32 in registers as they are
 * loaded. The N range is split across the worker pool.
 *
 * Every output element is one dot product with the same operation order whatever n, the
 * row's position or the thread split: 8 lanes, lane j summing k = j mod 8 in k order, the
 * lanes reduced as ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), then the k tail (K % 8) in order,
 * then the bias. Two paths implement it: AVX2+FMA (x86-64 CPUs that have it, chosen at run
 * time, so no -march flag is needed) and portable C that compilers can vectorise. */
#include "cpu_internal.h"

#if CPU_X86_SIMD
#include <immintrin.h>
#endif

typedef struct {
    float *out;
    const float *x;
    const void *w;
    DType wdt;
    const void *bias; /* NULL = none */
    DType bdt;
    int n, N, K;
    int tile; /* x rows per cache tile */
    int simd; /* 1: AVX2 path */
} MatmulJob;

/* The k tail, shared by every variant so they all round the same way. */
static __attribute__((noinline)) float tail_dot(const float *x, const void *w, DType dt,
                                                size_t woff, int k0, int K) {
    float s = 0.0f;
    for (int k = k0; k < K; k++)
        s += x[k] * cpu_load_f32(w, dt, woff + (size_t)k);
    return s;
}

static inline float finish(const MatmulJob *jb, float dot, int i, int j) {
    int K8 = jb->K & ~7;
    if (K8 < jb->K)
        dot += tail_dot(jb->x + (size_t)i * jb->K, jb->w, jb->wdt, (size_t)j * jb->K, K8, jb->K);
    if (jb->bias)
        dot += cpu_load_f32(jb->bias, jb->bdt, (size_t)j);
    return dot;
}

/* ---------------- portable path ---------------- */

static inline float hsum8(const float *l) {
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

/* R x rows against one weight row already converted to fp32. Plain float lanes in fixed
 * blocks of 8 (gcc's SLP vectoriser keeps them in SSE/NEON registers at -O2; 32-byte vector
 * types, by contrast, are lowered through the stack where the hardware lacks them). */
#define GENERIC_ROWS(R)                                                                            \
    static void generic_rows_##R(const MatmulJob *jb, const float *wrow, int i, int j) {           \
        int K = jb->K, K8 = K & ~7;                                                                \
        float acc[R][8];                                                                           \
        memset(acc, 0, sizeof acc);                                                                \
        const float *x = jb->x + (size_t)i * K;                                                    \
        for (int k = 0; k < K8; k += 8)                                                            \
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)                                    \
                _Pragma("GCC unroll 8") for (int l = 0; l < 8; l++) acc[r][l] +=                   \
                x[(size_t)r * K + k + l] * wrow[k + l];                                            \
        for (int r = 0; r < R; r++)                                                                \
            jb->out[(size_t)(i + r) * jb->N + j] = finish(jb, hsum8(acc[r]), i + r, j);            \
    }
GENERIC_ROWS(4)
GENERIC_ROWS(1)

static void generic_range(const MatmulJob *jb, int j0, int j1) {
    float *wrow = cpu_scratch(0, (size_t)jb->K * sizeof(float));
    for (int i0 = 0; i0 < jb->n; i0 += jb->tile) {
        int i1 = i0 + jb->tile < jb->n ? i0 + jb->tile : jb->n;
        for (int j = j0; j < j1; j++) {
            const float *wr;
            if (jb->wdt == DT_F32) {
                wr = (const float *)jb->w + (size_t)j * jb->K;
            } else {
                cpu_to_f32(wrow, jb->w, jb->wdt, (size_t)j * jb->K, (size_t)jb->K);
                wr = wrow;
            }
            int i = i0;
            for (; i + 4 <= i1; i += 4)
                generic_rows_4(jb, wr, i, j);
            for (; i < i1; i++)
                generic_rows_1(jb, wr, i, j);
        }
    }
}

/* ---------------- AVX2 + FMA path ---------------- */

#if CPU_X86_SIMD
#define AVX2_FN     __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

AVX2_INLINE __m256 load_w8(const void *w, size_t idx, DType dt) {
    if (dt == DT_F32) {
        __m256 v = _mm256_loadu_ps((const float *)w + idx);
        /* keep it in a register: folded into every FMA it would be loaded once per x row */
        __asm__("" : "+x"(v));
        return v;
    }
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + idx));
    if (dt == DT_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

AVX2_INLINE float hsum256(__m256 a) {
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

/* R x rows (from i) against C weight rows (from j) of dtype DT. One small function per
 * (shape, dtype), with arrays of exactly that size, so the compiler keeps every accumulator
 * in a register (inlined into one large function they were spilled). */
#define AVX2_BLOCK(R, C, NAME, DT)                                                                 \
    static AVX2_FN                                                                                 \
        __attribute__((noinline)) void blk_##R##x##C##_##NAME(const MatmulJob *jb, int i, int j) { \
        int K = jb->K, K8 = K & ~7;                                                                \
        const float *x = jb->x + (size_t)i * K;                                                    \
        size_t wbase = (size_t)j * K;                                                              \
        __m256 acc[R][C];                                                                          \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)                                        \
            _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();   \
        for (int k = 0; k < K8; k += 8) {                                                          \
            __m256 xv[R];                                                                          \
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) xv[r] =                            \
                _mm256_loadu_ps(x + (size_t)r * K + k);                                            \
            _Pragma("GCC unroll 4") for (int c = 0; c < C; c++) {                                  \
                __m256 wv = load_w8(jb->w, wbase + (size_t)c * K + k, DT);                         \
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r][c] =                    \
                    _mm256_fmadd_ps(xv[r], wv, acc[r][c]);                                         \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)                                        \
            _Pragma("GCC unroll 4") for (int c = 0; c < C; c++)                                    \
                jb->out[(size_t)(i + r) * jb->N + j + c] =                                         \
            finish(jb, hsum256(acc[r][c]), i + r, j + c);                                          \
    }

/* The loops over a thread's weight rows [j0, j1) for dtype DT. */
#define AVX2_RANGE(NAME, DT)                                                                       \
    AVX2_BLOCK(3, 4, NAME, DT)                                                                     \
    AVX2_BLOCK(2, 4, NAME, DT)                                                                     \
    AVX2_BLOCK(1, 4, NAME, DT)                                                                     \
    AVX2_BLOCK(3, 1, NAME, DT)                                                                     \
    AVX2_BLOCK(1, 1, NAME, DT)                                                                     \
    static void range_##NAME(const MatmulJob *jb, int j0, int j1) {                                \
        for (int i0 = 0; i0 < jb->n; i0 += jb->tile) {                                             \
            int i1 = i0 + jb->tile < jb->n ? i0 + jb->tile : jb->n;                                \
            int j = j0;                                                                            \
            for (; j + 4 <= j1; j += 4) {                                                          \
                int i = i0;                                                                        \
                for (; i + 3 <= i1; i += 3)                                                        \
                    blk_3x4_##NAME(jb, i, j);                                                      \
                if (i1 - i == 2)                                                                   \
                    blk_2x4_##NAME(jb, i, j);                                                      \
                else if (i1 - i == 1)                                                              \
                    blk_1x4_##NAME(jb, i, j);                                                      \
            }                                                                                      \
            for (; j < j1; j++) {                                                                  \
                int i = i0;                                                                        \
                for (; i + 3 <= i1; i += 3)                                                        \
                    blk_3x1_##NAME(jb, i, j);                                                      \
                for (; i < i1; i++)                                                                \
                    blk_1x1_##NAME(jb, i, j);                                                      \
            }                                                                                      \
        }                                                                                          \
    }

AVX2_RANGE(f32, DT_F32)
AVX2_RANGE(f16, DT_F16)
AVX2_RANGE(bf16, DT_BF16)

static void avx2_range(const MatmulJob *jb, int j0, int j1) {
    switch (jb->wdt) {
        case DT_F32:
            range_f32(jb, j0, j1);
            break;
        case DT_F16:
            range_f16(jb, j0, j1);
            break;
        case DT_BF16:
            range_bf16(jb, j0, j1);
            break;
        default:
            PL_CHECK(!"unsupported weight dtype");
    }
}

#else
static void avx2_range(const MatmulJob *jb, int j0, int j1) {
    (void)jb, (void)j0, (void)j1;
    PL_CHECK(!"no AVX2 path in this build");
}
#endif

static void matmul_task(void *ctx, int tid, int nt) {
    const MatmulJob *jb = ctx;
    /* split N in multiples of 4 so every thread runs whole 4-row groups */
    int groups = (jb->N + 3) / 4;
    int j0 = (int)((int64_t)groups * tid / nt) * 4;
    int j1 = (int)((int64_t)groups * (tid + 1) / nt) * 4;
    if (j1 > jb->N)
        j1 = jb->N;
    if (j0 >= j1)
        return;
    if (jb->simd)
        avx2_range(jb, j0, j1);
    else
        generic_range(jb, j0, j1);
}

void cpu_matmul(const KernelOps *ops, void *out, const void *x, const Tensor *w, const Tensor *bias,
                int n) {
    PL_CHECK(w->ndim == 2);
    int N = (int)w->shape[0], K = (int)w->shape[1];
    if (bias && bias->data)
        PL_CHECK(bias->ndim == 1 && bias->shape[0] == N);
    if (w->dtype == DT_F8E4M3) {
        cpu_matmul_fp8(ops, out, x, w, bias && bias->data ? bias : NULL, n);
        return;
    }
    PL_CHECK(w->dtype == DT_F32 || w->dtype == DT_F16 || w->dtype == DT_BF16);
    if (n <= 0 || N <= 0)
        return;
    MatmulJob jb = {
        .out = out,
        .x = x,
        .w = w->data,
        .wdt = w->dtype,
        .bias = bias ? bias->data : NULL,
        .bdt = bias ? bias->dtype : DT_F32,
        .n = n,
        .N = N,
        .K = K,
        .simd = cpu_simd_level() > 0,
    };
    /* x rows per tile: about 256 KiB of x, so the tile stays in L2 while the weight rows
     * stream past it; a multiple of 3, the rows of the AVX2 kernel */
    int tile = (int)((256 * 1024) / ((size_t)(K > 0 ? K : 1) * sizeof(float)));
    tile = tile < 3 ? 3 : tile - tile % 3;
    jb.tile = tile;
    double macs = (double)n * N * K;
    int want = macs < 256.0 * 1024 ? 1 : (N + 3) / 4;
    cpu_parallel(cpu_pool(ops), matmul_task, &jb, want);
}
