/* kernel_trace.c - every kernel a CUDA process runs, with its GPU start and end times, as it runs
 * unprofiled: a CUPTI activity tracer loaded by the CUDA driver (CUDA_INJECTION64_PATH), for the
 * GPU host, which has no Nsight Systems. ncu serializes and replays kernels, so under it the
 * engine's GEMM tuning (timed with events) picks other algorithms and clocks differ from a
 * normal run; concurrent-kernel activity records change neither (kernels inside CUDA graphs
 * included). Not part of the build; on a GPU host:
 *
 *   gcc -O2 -shared -fPIC -o /tmp/libkernel_trace.so tools/kernel_trace.c \
 *       -I/usr/local/cuda/include -L/usr/local/cuda/lib64 -lcupti
 *   CUDA_INJECTION64_PATH=/tmp/libkernel_trace.so PAGELLM_KERNEL_TRACE=/tmp/k.csv build/pagellm ...
 *   python3 tools/kernel_trace_steps.py /tmp/k.csv --rows 256
 *
 * Output: one CSV line per kernel, "start_ns,end_ns,grid,block,name" (grid and block as XxYxZ,
 * the mangled name quoted), written as CUPTI hands buffers back and at exit. */
#include <cupti.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

enum { TRACE_BUFFER_BYTES = 8 << 20 };

static FILE *trace_out;
static pthread_mutex_t trace_lock = PTHREAD_MUTEX_INITIALIZER;

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = aligned_alloc(8, TRACE_BUFFER_BYTES);
    *size = *buffer ? TRACE_BUFFER_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size,
                                      size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *rec = NULL;
    pthread_mutex_lock(&trace_lock);
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)
            continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
        fprintf(trace_out, "%llu,%llu,%dx%dx%d,%dx%dx%d,\"%s\"\n", (unsigned long long)k->start,
                (unsigned long long)k->end, k->gridX, k->gridY, k->gridZ, k->blockX, k->blockY,
                k->blockZ, k->name ? k->name : "?");
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(NULL, 0, &dropped) == CUPTI_SUCCESS && dropped)
        fprintf(stderr, "kernel_trace: %zu records dropped\n", dropped);
    pthread_mutex_unlock(&trace_lock);
    free(buffer);
}

static void flush_at_exit(void) {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    pthread_mutex_lock(&trace_lock);
    fclose(trace_out);
    trace_out = NULL;
    pthread_mutex_unlock(&trace_lock);
}

/* Called by the CUDA driver when it loads this library; 1 on success. */
int InitializeInjection(void) {
    const char *path = getenv("PAGELLM_KERNEL_TRACE");
    if (!path || !*path) {
        fprintf(stderr, "kernel_trace: set PAGELLM_KERNEL_TRACE to the output CSV's path\n");
        return 0;
    }
    trace_out = fopen(path, "w");
    if (!trace_out) {
        perror(path);
        return 0;
    }
    const char *err = NULL;
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS)
        err = "cuptiActivityRegisterCallbacks";
    else if (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS)
        err = "cuptiActivityEnable(CONCURRENT_KERNEL)";
    if (err) {
        fprintf(stderr, "kernel_trace: %s failed\n", err);
        fclose(trace_out);
        return 0;
    }
    atexit(flush_at_exit);
    return 1;
}
