/* copy.c - memory and data movement ops of the CPU backend: its "device" memory is host
 * memory; gathering the hidden-state rows whose logits are wanted; reordering the logits of a
 * vocabulary-parallel LM head (gathered slices) into rows; whole-block copies
 * between KV pools (swap out, swap in, copy-on-write): one memcpy per block thanks to the
 * block-major layout; a step's input ids taken from its predecessor's sampled tokens. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"

void cpu_gather_rows(const KernelOps *ops, void *out, const void *in, const int32_t *rows, int n,
                     int dim) {
    size_t row = (size_t)dim * sizeof(float);
    for (int i = 0; i < n; i++)
        memcpy((char *)out + (size_t)i * row, (const char *)in + (size_t)rows[i] * row, row);
}

void cpu_to_f32_op(const KernelOps *ops, float *out, const void *in, size_t n) {
    memcpy(out, in, n * sizeof(float)); /* CPU activations are fp32 already */
}

void cpu_vocab_logits_f32(const KernelOps *ops, float *out, const void *parts, int n, int vocab,
                          int shard, int size) {
    const float *p = parts;
    for (int r = 0; r < size; r++) {
        int64_t first = (int64_t)r * shard, cols = vocab - first < shard ? vocab - first : shard;
        for (int i = 0; cols > 0 && i < n; i++)
            memcpy(out + (size_t)i * vocab + first, p + ((size_t)r * n + i) * shard,
                   (size_t)cols * sizeof(float));
    }
}

void cpu_copy_blocks(const KernelOps *ops, void *dst_pool, const void *src_pool,
                     const int32_t *src_dst, int n, size_t block_bytes) {
    for (int i = 0; i < n; i++)
        memcpy((char *)dst_pool + (size_t)src_dst[2 * i + 1] * block_bytes,
               (const char *)src_pool + (size_t)src_dst[2 * i] * block_bytes, block_bytes);
}

void cpu_swap_blocks(const KernelOps *ops, void *dst_pool, const void *src_pool,
                     const int32_t *src_dst, int n, size_t block_bytes, int after_compute) {
    (void)after_compute; /* every op is synchronous: the compute is always done */
    cpu_copy_blocks(ops, dst_pool, src_pool, src_dst, n, block_bytes);
}

void cpu_scatter_tokens(const KernelOps *ops, int32_t *tokens, const int32_t *sampled,
                        const int32_t *pairs, int n) {
    for (int i = 0; i < n; i++)
        tokens[pairs[2 * i]] = sampled[pairs[2 * i + 1]];
}

void *cpu_alloc(const KernelOps *ops, size_t bytes) {
    return calloc(1, bytes ? bytes : 1);
}

void cpu_free(const KernelOps *ops, void *p) {
    free(p);
}

void cpu_copy(const KernelOps *ops, void *dst, const void *src, size_t bytes) {
    memcpy(dst, src, bytes);
}

void cpu_copy_rows(const KernelOps *ops, void *dst, const void *src, size_t pitch, size_t row_bytes,
                   int rows) {
    for (int i = 0; i < rows; i++)
        memcpy((char *)dst + (size_t)i * pitch, (const char *)src + (size_t)i * pitch, row_bytes);
}

/* MemAvailable from /proc/meminfo (0 when unknown). */
size_t cpu_free_memory(const KernelOps *ops) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return (size_t)kb * 1024;
}
