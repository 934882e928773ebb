/* common.c - status names, per-thread error messages, checked allocation, file reading,
 * clock and half-precision conversions. */
#include "common.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static _Thread_local char error_message[1024];

const char *pl_status_str(Status s) {
    switch (s) {
        case PL_OK:
            return "ok";
        case PL_ERR_INVALID:
            return "invalid argument";
        case PL_ERR_FORMAT:
            return "malformed file";
        case PL_ERR_IO:
            return "I/O error";
        case PL_ERR_UNSUPPORTED:
            return "unsupported";
        case PL_ERR_NOMEM:
            return "out of memory";
        case PL_ERR_QUEUE_FULL:
            return "queue full";
        case PL_ERR_NOT_FOUND:
            return "not found";
    }
    return "unknown status";
}

Status pl_error_set(Status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_message, sizeof error_message, fmt, ap);
    va_end(ap);
    return s;
}

const char *pl_error(void) {
    return error_message;
}

_Noreturn void pl_fatal(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "pagellm: fatal: %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}

void *pl_xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p)
        pl_fatal(__FILE__, __LINE__, "out of memory allocating %zu bytes", n);
    return p;
}

void *pl_xcalloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p)
        pl_fatal(__FILE__, __LINE__, "out of memory allocating %zu x %zu bytes", count, size);
    return p;
}

void *pl_xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q)
        pl_fatal(__FILE__, __LINE__, "out of memory reallocating %zu bytes", n);
    return q;
}

char *pl_xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    return memcpy(pl_xmalloc(n), s, n);
}

Status pl_read_file(const char *path, char **data, size_t *len) {
    *data = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return pl_error_set(PL_ERR_IO, "%s: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = pl_xmalloc(cap);
    for (;;) {
        if (n + 1 >= cap)
            buf = pl_xrealloc(buf, cap *= 2);
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0)
            break;
    }
    int failed = ferror(f);
    fclose(f);
    if (failed) {
        free(buf);
        return pl_error_set(PL_ERR_IO, "%s: read error", path);
    }
    buf[n] = '\0';
    *data = buf;
    if (len)
        *len = n;
    return PL_OK;
}

Status pl_parse_long(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end)
        return pl_error_set(PL_ERR_INVALID, "'%s' is not an integer", s);
    if (v < lo || v > hi)
        return pl_error_set(PL_ERR_INVALID, "%ld is out of range [%ld, %ld]", v, lo, hi);
    *out = v;
    return PL_OK;
}

Status pl_parse_double(const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || v != v)
        return pl_error_set(PL_ERR_INVALID, "'%s' is not a number", s);
    if (v < lo || v > hi)
        return pl_error_set(PL_ERR_INVALID, "%g is out of range [%g, %g]", v, lo, hi);
    *out = v;
    return PL_OK;
}

double pl_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

size_t pl_dtype_size(DType t) {
    switch (t) {
        case DT_F32:
            return 4;
        case DT_F16:
        case DT_BF16:
            return 2;
        case DT_F8E4M3:
            return 1;
        case DT_OTHER:
            return 0;
    }
    return 0;
}

const char *pl_dtype_name(DType t) {
    switch (t) {
        case DT_F32:
            return "F32";
        case DT_F16:
            return "F16";
        case DT_BF16:
            return "BF16";
        case DT_F8E4M3:
            return "F8_E4M3";
        case DT_OTHER:
            return "other";
    }
    return "other";
}

float pl_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t pl_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a quiet NaN */
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

float pl_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400u)) {
                man <<= 1;
                exp--;
            }
            u = sign | (exp << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t pl_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    int32_t exp = (int32_t)((u >> 23) & 0xff) - 127 + 15;
    uint32_t man = u & 0x7fffffu;
    if (((u >> 23) & 0xff) == 0xff) /* inf / NaN */
        return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
    if (exp >= 31)
        return (uint16_t)(sign | 0x7c00u);
    if (exp <= 0) {
        if (exp < -10)
            return (uint16_t)sign;
        man |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1)))
            half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)exp << 10) | (man >> 13);
    uint32_t rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1)))
        half++;
    return (uint16_t)half;
}

float pl_f8e4m3_to_f32(uint8_t q) {
    int exp = (q >> 3) & 15, man = q & 7;
    float v;
    if (exp == 15 && man == 7)
        v = NAN;
    else if (exp == 0)
        v = ldexpf((float)man, -9); /* subnormal: man / 8 * 2^-6 */
    else
        v = ldexpf((float)(8 + man), exp - 10); /* (1 + man / 8) * 2^(exp - 7) */
    return (q & 0x80) ? -v : v;
}

uint8_t pl_f32_to_f8e4m3(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN */
        return sign | 0x7f;
    if (a >= 0x43e00000u) /* >= 448 = 1.75 * 2^8, infinity included: saturate */
        return sign | 0x7e;
    if (a < 0x3c800000u) { /* below 2^-6, the smallest normal: a multiple of 2^-9 */
        float mag;
        memcpy(&mag, &a, 4);
        return sign | (uint8_t)rintf(mag * 512.0f); /* 8 (= 2^-6) when it rounds up */
    }
    uint32_t q = ((((a >> 23) & 0xffu) - 127u + 7u) << 3) | ((a >> 20) & 7u);
    uint32_t rem = a & 0xfffffu;
    if (rem > 0x80000u || (rem == 0x80000u && (q & 1u)))
        q++; /* never past 0x7e: a < 448 here */
    return sign | (uint8_t)q;
}
