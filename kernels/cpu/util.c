/* util.c - small helpers shared by the CPU ops: dtype conversion of weight slices and the
 * per-thread scratch buffers that keep allocation out of the step loop. */
#include <stdlib.h>

#include "cpu_internal.h"

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

void *cpu_scratch(int slot, size_t bytes) {
    PL_CHECK(slot >= 0 && slot < CPU_SCRATCH_SLOTS);
    ScratchBuf *s = &scratch[slot];
    if (bytes > s->cap) {
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
