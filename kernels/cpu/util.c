/* util.c - small helpers shared by the CPU ops: dtype conversion of weight slices, the
 * per-thread scratch buffers that keep allocation out of the step loop, and the choice
 * between the portable and the AVX2 code paths. */
#include <pthread.h>
#include <stdlib.h>

#include "cpu_internal.h"

#if CPU_X86_SIMD
#include <cpuid.h>
#endif

void cpu_to_f32(float *dst, const void *src, DType dt, size_t first, size_t n) {
    switch (dt) {
        case DT_F32:
            memcpy(dst, (const float *)src + first, n * sizeof(float));
            return;
        case DT_F16: {
            const uint16_t *s = (const uint16_t *)src + first;
            for (size_t i = 0; i < n; i++)
                dst[i] = pl_f16_to_f32(s[i]);
            return;
        }
        case DT_BF16: {
            const uint16_t *s = (const uint16_t *)src + first;
            uint32_t *d = (uint32_t *)(void *)dst; /* same bits: bf16 is the top half of f32 */
            for (size_t i = 0; i < n; i++)
                d[i] = (uint32_t)s[i] << 16;
            return;
        }
        default:
            pl_fatal(__FILE__, __LINE__, "unsupported dtype %s", pl_dtype_name(dt));
    }
}

typedef struct {
    void *p;
    size_t cap;
} ScratchBuf;

static _Thread_local ScratchBuf scratch[CPU_SCRATCH_SLOTS];

/* A thread's scratch is freed when the thread ends (engine and pool threads come and go
 * with engines and servers): a thread-specific key whose destructor frees it. */
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_free(void *arg) {
    ScratchBuf *bufs = arg;
    for (int i = 0; i < CPU_SCRATCH_SLOTS; i++) {
        free(bufs[i].p);
        bufs[i] = (ScratchBuf){0};
    }
}

static void scratch_key_create(void) {
    PL_CHECK(pthread_key_create(&scratch_key, scratch_free) == 0);
}

void *cpu_scratch(int slot, size_t bytes) {
    PL_CHECK(slot >= 0 && slot < CPU_SCRATCH_SLOTS);
    ScratchBuf *s = &scratch[slot];
    if (bytes > s->cap) {
        pthread_once(&scratch_once, scratch_key_create);
        if (!pthread_getspecific(scratch_key))
            pthread_setspecific(scratch_key, scratch);
        size_t cap = s->cap ? s->cap : 4096;
        while (cap < bytes)
            cap *= 2;
        free(s->p);
        s->p = NULL;
        if (posix_memalign(&s->p, 64, cap) != 0)
            pl_fatal(__FILE__, __LINE__, "out of memory (%zu bytes of scratch)", cap);
        s->cap = cap;
    }
    return s->p;
}

/* AVX2, FMA and F16C, with the OS saving YMM state (cpuid + xgetbv, which gcc and clang both
 * support; clang's __builtin_cpu_supports does not know "f16c"). */
static int cpu_has_avx2(void) {
#if CPU_X86_SIMD
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    int fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, f16c = (c >> 29) & 1;
    if (!(fma && osxsave && avx && f16c))
        return 0;
    unsigned xcr0_lo, xcr0_hi;
    __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    if ((xcr0_lo & 6) != 6)
        return 0;
    if (__get_cpuid_max(0, NULL) < 7)
        return 0;
    __cpuid_count(7, 0, a, b, c, d);
    return (b >> 5) & 1;
#else
    return 0;
#endif
}

/* -1 = not probed yet; atomics because any thread may run the first op. */
static int simd_level = -1;
static int simd_allowed = 1;

int cpu_simd_level(void) {
    int level = __atomic_load_n(&simd_level, __ATOMIC_ACQUIRE);
    if (level < 0) {
        level = __atomic_load_n(&simd_allowed, __ATOMIC_ACQUIRE) && cpu_has_avx2();
        __atomic_store_n(&simd_level, level, __ATOMIC_RELEASE);
    }
    return level;
}

int cpu_set_simd(int enable) {
    int prev = __atomic_exchange_n(&simd_allowed, enable, __ATOMIC_SEQ_CST);
    __atomic_store_n(&simd_level, -1, __ATOMIC_SEQ_CST);
    return prev;
}
