/* common.h - status codes, error messages and small helpers shared by every module.
 *
 * Recoverable failures are reported as a Status plus a one-line message kept per thread
 * (pl_error_set / pl_error). Only server/ maps a Status to an HTTP code. Programming errors
 * and allocation failure abort through PL_CHECK / pl_xmalloc: there is nothing to recover. */
#ifndef PAGELLM_COMMON_H
#define PAGELLM_COMMON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus /* CUDA sources include this header too */
#define PL_NORETURN [[noreturn]]
extern "C" {
#else
#define PL_NORETURN _Noreturn
#ifdef __cplusplus
}
#endif

#endif

typedef enum {
    PL_OK = 0,
    PL_ERR_INVALID,     /* bad input from a user: request, flag, config value */
    PL_ERR_FORMAT,      /* malformed file: checkpoint, tokenizer, config.json */
    PL_ERR_IO,          /* open/read/mmap failed */
    PL_ERR_UNSUPPORTED, /* valid but not handled (architecture, dtype, tokenizer kind) */
    PL_ERR_NOMEM,       /* a pool or budget is exhausted (not malloc failure, which aborts) */
    PL_ERR_QUEUE_FULL,  /* admission refused: too many queued requests */
    PL_ERR_NOT_FOUND,   /* a named thing does not exist */
} Status;

/* Element types of weights and activations. DT_F8E4M3 is OCP fp8 e4m3fn (1 sign, 4 exponent
 * bits of bias 7, 3 mantissa bits, no infinities, largest finite 448; safetensors "F8_E4M3"),
 * used for fp8 weights and the fp8 KV cache with fp32 scales beside it, never for activations
 * between ops. DT_OTHER marks a safetensors dtype pagellm reads past but cannot compute with
 * (I64, U8, ...). */
typedef enum { DT_F32, DT_F16, DT_BF16, DT_F8E4M3, DT_OTHER } DType;

/* Bytes per element (0 for DT_OTHER) and the safetensors / config.json name ("BF16"). */
size_t pl_dtype_size(DType t);
const char *pl_dtype_name(DType t);

/* Human name of a status ("invalid argument", ...). Never NULL. */
const char *pl_status_str(Status s);

/* Record the message for the failure being returned by this thread (printf format).
 * Returns `s` so callers can write `return pl_error_set(PL_ERR_IO, "...", ...)`. */
Status pl_error_set(Status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The message recorded last on this thread ("" if none). Valid until the next pl_error_set. */
const char *pl_error(void);

/* malloc/calloc/realloc/strdup that abort with a message on failure. */
void *pl_xmalloc(size_t n);
void *pl_xcalloc(size_t count, size_t size);
void *pl_xrealloc(void *p, size_t n);
char *pl_xstrdup(const char *s);

/* Read a whole file into a NUL-terminated buffer (caller frees). Sets the error on failure. */
Status pl_read_file(const char *path, char **data, size_t *len);

/* Abort with expression, file and line when `cond` is false (internal invariants). */
#define PL_CHECK(cond)                                                                             \
    do {                                                                                           \
        if (!(cond))                                                                               \
            pl_fatal(__FILE__, __LINE__, "check failed: %s", #cond);                               \
    } while (0)

PL_NORETURN void pl_fatal(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Parse a whole string as a decimal integer / a finite number within [lo, hi]. On failure
 * return PL_ERR_INVALID with pl_error() saying "'abc' is not an integer" or "7 is out of
 * range [8, 128]" (callers prefix the flag or key name). */
Status pl_parse_long(const char *s, long lo, long hi, long *out);
Status pl_parse_double(const char *s, double lo, double hi, double *out);

/* Bytes in a GiB (sizes in the config and in messages are in GiB). */
#define PL_GIB (1024.0 * 1024.0 * 1024.0)

/* Monotonic clock in seconds. */
double pl_now(void);

/* bf16 / fp16 <-> fp32 conversion (round to nearest even on the way down). */
float pl_bf16_to_f32(uint16_t h);
uint16_t pl_f32_to_bf16(float f);
float pl_f16_to_f32(uint16_t h);
uint16_t pl_f32_to_f16(float f);

/* fp8 e4m3fn <-> fp32. Encoding rounds to nearest even and saturates: |f| >= 448 (infinities
 * too) gives +-448, NaN gives NaN (0x7f, sign kept); as CUDA's __nv_cvt_float_to_fp8 with
 * __NV_SATFINITE. Decoding is exact. */
float pl_f8e4m3_to_f32(uint8_t q);
uint8_t pl_f32_to_f8e4m3(float f);

/* The largest finite e4m3 value, and the smallest scale a dynamic fp8 quantization uses (so an
 * all-zero row still gets a finite, non-zero scale; vLLM's 1 / (448 * 512)). */
#define PL_F8E4M3_MAX       448.0f
#define PL_F8E4M3_MIN_SCALE (1.0f / (448.0f * 512.0f))

#ifdef __cplusplus
}
#endif

#endif
