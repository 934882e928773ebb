/* cublas_util.cuh - (internal to kernels/cuda/) what the cuBLASLt callers (matmul.cu,
 * matmul_fp8.cu) share: the status check and the alignment cuBLASLt may assume of an operand. */
#ifndef PAGELLM_KERNELS_CUDA_CUBLAS_UTIL_CUH
#define PAGELLM_KERNELS_CUDA_CUBLAS_UTIL_CUH

#include <cublasLt.h>
#include <stdint.h>

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

#endif
