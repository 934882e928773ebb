/* logit_edit.cu - changes to logits before sampling: additions to single logits (logit_bias,
 * and -inf for tokens such as EOS before min_tokens), one thread per edit, atomic so that two
 * edits of the same logit both count; and bitmasks of allowed tokens (constrained decoding),
 * one thread per 32 tokens of a row, each reading its mask word once. */
#include "cuda_internal.cuh"

__global__ void logits_add_kernel(float *logits, int vocab, const LogitEdit *edits, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    LogitEdit e = edits[i];
    atomicAdd(&logits[(size_t)e.row * vocab + e.token], e.add);
}

__global__ void logits_mask_kernel(float *logits, int vocab, const uint32_t *masks,
                                   const int32_t *rows, int words) {
    int w = blockIdx.x * blockDim.x + threadIdx.x;
    if (w >= words)
        return;
    uint32_t m = masks[(size_t)blockIdx.y * words + w];
    if (m == 0xffffffffu)
        return;
    float *row = logits + (size_t)rows[blockIdx.y] * vocab;
    int end = min(32, vocab - w * 32);
    for (int b = 0; b < end; b++)
        if (!(m >> b & 1u))
            row[w * 32 + b] = -INFINITY;
}

void k_cuda_logits_mask(float *logits, int vocab, const uint32_t *masks, const int32_t *rows, int n,
                        void *stream) {
    if (n <= 0)
        return;
    int words = (vocab + 31) / 32;
    dim3 grid((words + 255) / 256, n);
    logits_mask_kernel<<<grid, 256, 0, kc_stream(stream)>>>(logits, vocab, masks, rows, words);
    CUDA_CHECK_LAUNCH();
}

void k_cuda_logits_add(float *logits, int vocab, const LogitEdit *edits, int n, void *stream) {
    if (n <= 0)
        return;
    logits_add_kernel<<<(n + 255) / 256, 256, 0, kc_stream(stream)>>>(logits, vocab, edits, n);
    CUDA_CHECK_LAUNCH();
}
