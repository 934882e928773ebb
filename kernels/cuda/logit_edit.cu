/* logit_edit.cu - additions to single logits before sampling (logit_bias, and -inf masks
 * such as EOS before min_tokens): one thread per edit, atomic so that two edits of the same
 * logit both count. */
#include "cuda_internal.cuh"

__global__ void logits_add_kernel(float *logits, int vocab, const LogitEdit *edits, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    LogitEdit e = edits[i];
    atomicAdd(&logits[(size_t)e.row * vocab + e.token], e.add);
}

void k_cuda_logits_add(float *logits, int vocab, const LogitEdit *edits, int n, void *stream) {
    if (n <= 0)
        return;
    logits_add_kernel<<<(n + 255) / 256, 256, 0, kc_stream(stream)>>>(logits, vocab, edits, n);
    CUDA_CHECK_LAUNCH();
}
