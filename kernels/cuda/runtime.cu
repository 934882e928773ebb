/* runtime.cu - the CUDA backend's runtime helpers: the CUDA_CHECK failure path, device
 * discovery that never aborts (so a binary built with CUDA still runs, and its GPU tests
 * skip, on a machine without a GPU), and thin wrappers over allocation, copies and streams
 * for C callers that include no CUDA header, and whether kernels use programmatic dependent
 * launch. */
#include <atomic>
#include <stdio.h>

#include "cuda_internal.cuh"

void k_cuda_check_fail(int err, const char *expr, const char *file, int line) {
    cudaError_t e = (cudaError_t)err;
    pl_fatal(file, line, "CUDA error %s (%s) in %s", cudaGetErrorName(e), cudaGetErrorString(e),
             expr);
}

int k_cuda_device_count(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* no driver / no device: not sticky, clear it anyway */
        return 0;
    }
    return n;
}

void *k_cuda_malloc(size_t bytes) {
    void *p = NULL;
    CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 1));
    return p;
}

void k_cuda_free(void *p) {
    if (p)
        CUDA_CHECK(cudaFree(p));
}

void k_cuda_memcpy(void *dst, const void *src, size_t bytes) {
    if (bytes)
        CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
}

void k_cuda_memset(void *dst, int byte, size_t bytes) {
    if (bytes)
        CUDA_CHECK(cudaMemset(dst, byte, bytes));
}

void k_cuda_synchronize(void) {
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaGetLastError());
}

void *k_cuda_stream_create(void) {
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return (void *)s;
}

void k_cuda_stream_destroy(void *stream) {
    if (stream)
        CUDA_CHECK(cudaStreamDestroy(kc_stream(stream)));
}

void k_cuda_stream_synchronize(void *stream) {
    CUDA_CHECK(cudaStreamSynchronize(kc_stream(stream)));
}

int kc_pdl_enabled(void) {
    static std::atomic<int> enabled{-1}; /* worked out once: a host's GPUs are of one kind */
    int e = enabled.load();
    if (e < 0) {
        int device = 0, major = 0;
        CUDA_CHECK(cudaGetDevice(&device));
        CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
        e = major >= 9;
        enabled.store(e);
    }
    return e;
}

int kc_sm_count(void) {
    enum { MAX_CACHED = 64 };
    static std::atomic<int> sms[MAX_CACHED]; /* 0: not looked up yet */
    int device = 0, n = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    if (device < MAX_CACHED && (n = sms[device].load()) > 0)
        return n;
    CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    if (device < MAX_CACHED)
        sms[device].store(n);
    return n;
}
