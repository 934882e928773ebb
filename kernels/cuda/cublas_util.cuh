/* cublas_util.cuh - (internal to kernels/cuda/) what the cuBLASLt callers (matmul.cu,
 * matmul_fp8.cu) share: the status check, the alignment cuBLASLt may assume of an operand, and
 * the lookup of their algorithm caches. */
#ifndef PAGELLM_KERNELS_CUDA_CUBLAS_UTIL_CUH
#define PAGELLM_KERNELS_CUDA_CUBLAS_UTIL_CUH

#include <cublasLt.h>
#include <stdint.h>
#include <string.h>

#include "common.h"

#define CUBLAS_CHECK(expr)                                                                         \
    do {                                                                                           \
        cublasStatus_t cublas_check_st_ = (expr);                                                  \
        if (cublas_check_st_ != CUBLAS_STATUS_SUCCESS)                                             \
            pl_fatal(__FILE__, __LINE__, "cuBLAS error %s in %s",                                  \
                     cublasLtGetStatusName(cublas_check_st_), #expr);                              \
    } while (0)

/* Largest power of two (<= 256) dividing both the address and the leading dimension in bytes:
 * what cuBLASLt may assume about every row. */
static inline int kc_lt_alignment(const void *p, size_t ld_bytes) {
    uintptr_t a = (uintptr_t)p | (uintptr_t)ld_bytes | (uintptr_t)256;
    return (int)(a & (~a + 1));
}

/* The entry of an open-addressing cache of `slots` entries (a power of two; each with .valid
 * and .key) holding `key`, or the empty entry where it belongs: FNV-1a over the key's ints,
 * linear probing. */
template <typename Entry, typename Key>
static inline Entry *kc_cache_slot(Entry *cache, uint32_t slots, const Key *key) {
    static_assert(sizeof(Key) % sizeof(int) == 0, "cache keys are made of ints");
    int f[sizeof(Key) / sizeof(int)];
    memcpy(f, key, sizeof f);
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        h = (h ^ (uint32_t)f[i]) * 16777619u;
    for (uint32_t i = 0;; i++) {
        Entry *e = &cache[(h + i) & (slots - 1)];
        if (!e->valid || memcmp(&e->key, key, sizeof *key) == 0)
            return e;
    }
}

#endif
