/* gemma.cu - the ops Gemma 2 / 3 need beyond the Llama family's: GeGLU (gelu_tanh(gate) * up),
 * an element-wise scale in the activation dtype (the embedding times sqrt(hidden)), the final
 * logits' soft-capping, and paged attention with soft-capped scores and a sliding window.
 *
 * The attention here is a plain one (one block per query row and head, the row's visible
 * positions in chunks of ATTN_CHUNK with an online softmax, as the CPU op): correct for any
 * batch, any dtype pair and head_dim up to ATTN_MAX_HEAD_DIM, not tuned. ops.cu routes an
 * attention call to it when it has a soft-cap (Gemma 2), which the tuned decode and prefill
 * kernels (and their tensor-core forms) do not take; they take the window. */
#include "attention.cuh"

enum { GELU_THREADS = 256, CAP_ATTN_THREADS = 128, CAP_ATTN_CHUNK = 128 };

/* torch's gelu(approximate="tanh") in float (accurate tanhf). */
__device__ __forceinline__ float gelu_tanh(float x) {
    const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
    const float inner = k * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(inner));
}

template <typename T>
__global__ void gelu_tanh_mul_kernel(T *out, const T *gate_up, size_t total, int dim) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / (size_t)dim, j = i - r * (size_t)dim;
        const T *gate = gate_up + r * 2 * (size_t)dim;
        /* the activation's output is rounded to T before the product, as torch's two ops */
        const float g = to_f32(from_f32<T>(gelu_tanh(to_f32(gate[j]))));
        out[i] = from_f32<T>(g * to_f32(gate[dim + j]));
    }
}

void k_cuda_gelu_tanh_mul(void *out, const void *gate_up, DType act, int n, int dim, void *stream) {
    size_t total = (size_t)(n > 0 ? n : 0) * (size_t)(dim > 0 ? dim : 0);
    if (total == 0)
        return;
    KC_DISPATCH_ACT(act, "k_cuda_gelu_tanh_mul", T, {
        gelu_tanh_mul_kernel<T>
            <<<kc_blocks(total, GELU_THREADS), GELU_THREADS, 0, kc_stream(stream)>>>(
                (T *)out, (const T *)gate_up, total, dim);
        CUDA_CHECK_LAUNCH();
    });
}

template <typename T> __global__ void scale_kernel(T *x, size_t n, float s) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = from_f32<T>(to_f32(x[i]) * s);
}

void k_cuda_scale(void *x, DType act, size_t n, float s, void *stream) {
    if (n == 0)
        return;
    KC_DISPATCH_ACT(act, "k_cuda_scale", T, {
        scale_kernel<T>
            <<<kc_blocks(n, GELU_THREADS), GELU_THREADS, 0, kc_stream(stream)>>>((T *)x, n, s);
        CUDA_CHECK_LAUNCH();
    });
}

__global__ void softcap_kernel(float *x, size_t n, float cap) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = tanhf(x[i] / cap) * cap;
}

void k_cuda_logits_softcap(float *logits, size_t n, float cap, void *stream) {
    if (n == 0)
        return;
    softcap_kernel<<<kc_blocks(n, GELU_THREADS), GELU_THREADS, 0, kc_stream(stream)>>>(logits, n,
                                                                                       cap);
    CUDA_CHECK_LAUNCH();
}

/* Block (row, head): the row's query head against its KV head's visible positions
 * [max(0, pos - window + 1), pos] (window 0: from 0). Scores scale q.k, soft-capped by cap > 0
 * (tanh(s / cap) cap), online softmax over chunks of CAP_ATTN_CHUNK positions, one position
 * per thread for the scores, then the dims strided over the threads for the weighted V sum. */
template <typename TQ, typename TC>
__global__ __launch_bounds__(CAP_ATTN_THREADS) void capped_attention_kernel(
    TQ *out, const TQ *q, const TC *cache, KvGeom kg, const int32_t *positions,
    const int32_t *query_start, int num_seqs, const int32_t *block_tables, int nh, float scale,
    float cap, int window) {
    extern __shared__ float smem[]; /* q [D], acc [D], e [CHUNK], scratch [32] */
    float *qs = smem, *acc = qs + kg.D, *e = acc + kg.D, *scratch = e + CAP_ATTN_CHUNK;
    const int row = query_start[0] + blockIdx.x, h = blockIdx.y, D = kg.D;
    if (row >= query_start[num_seqs]) /* padding rows of a captured batch */
        return;
    const int g = h / (nh / kg.nkv), s = seq_of_row(query_start, num_seqs, row);
    const int pos = positions[row];
    const int lo = window > 0 && pos >= window ? pos - window + 1 : 0;
    const int32_t *table = block_tables + (size_t)s * kg.max_blocks;
    const TQ *qrow = q + ((size_t)row * nh + h) * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        qs[d] = to_f32(qrow[d]);
        acc[d] = 0.0f;
    }
    __syncthreads();
    float mx = -INFINITY, sum = 0.0f;
    for (int p0 = lo; p0 <= pos; p0 += CAP_ATTN_CHUNK) {
        const int cnt = min(CAP_ATTN_CHUNK, pos + 1 - p0);
        float sc = -INFINITY;
        if ((int)threadIdx.x < cnt) {
            const int p = p0 + threadIdx.x;
            const TC *k = cache + (size_t)table[kv_block_of(kg, p)] * kg.block_elems +
                          kg.layer_off + (size_t)(p % kg.bs) * kg.row + (size_t)g * D;
            float dot = 0.0f;
            for (int d = 0; d < D; d++)
                dot = fmaf(qs[d], to_f32(k[d]), dot);
            sc = dot * (scale * kg.ks); /* ks, vs: an fp8 cache's scales (1 otherwise) */
            if (cap > 0.0f)
                sc = tanhf(sc / cap) * cap;
        }
        /* the chunk's maximum over the block */
        float m = warp_max(sc);
        __syncthreads();
        if ((threadIdx.x & 31) == 0)
            scratch[threadIdx.x >> 5] = m;
        __syncthreads();
        m = scratch[0];
        for (int w = 1; w < (int)(blockDim.x >> 5); w++)
            m = fmaxf(m, scratch[w]);
        const float new_mx = fmaxf(mx, m);
        const float alpha = expf(mx - new_mx); /* 0 on the first chunk */
        const float ep = (int)threadIdx.x < cnt ? expf(sc - new_mx) : 0.0f;
        e[threadIdx.x] = ep;
        sum = sum * alpha + block_sum(ep, scratch);
        mx = new_mx;
        __syncthreads(); /* e complete */
        for (int d = threadIdx.x; d < D; d += blockDim.x) {
            float a = acc[d] * alpha;
            for (int j = 0; j < cnt; j++) {
                const int p = p0 + j;
                const TC *v = cache + (size_t)table[kv_block_of(kg, p)] * kg.block_elems +
                              kg.layer_off + kg.half + (size_t)(p % kg.bs) * kg.row + (size_t)g * D;
                a = fmaf(e[j], to_f32(v[d]), a);
            }
            acc[d] = a;
        }
        __syncthreads(); /* e reused */
    }
    TQ *o = out + ((size_t)row * nh + h) * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x)
        o[d] = from_f32<TQ>(acc[d] / sum * kg.vs);
}

void k_cuda_attention_capped(void *out, const void *q, DType act, const void *kv_cache,
                             const KvLayout *l, int layer, const AttnBatch *b, int nh, float scale,
                             float softcap, int window, void *stream) {
    const char *what = "k_cuda_attention_capped";
    KvGeom kg = kc_attn_check(l, layer, b, nh, window, what);
    if (b->num_seqs <= 0)
        return;
    /* one block per row of the batch and query head */
    const int rows = b->num_tokens;
    if (rows <= 0)
        return;
    const size_t smem = (size_t)(2 * kg.D + CAP_ATTN_CHUNK + 32) * sizeof(float);
    dim3 grid((unsigned)rows, (unsigned)nh);
    KC_DISPATCH_ATTN(act, l->dtype, what, {
        capped_attention_kernel<TQ, TC><<<grid, CAP_ATTN_THREADS, smem, kc_stream(stream)>>>(
            (TQ *)out, (const TQ *)q, (const TC *)kv_cache, kg, b->positions, b->query_start,
            b->num_seqs, b->block_tables, nh, scale, softcap, window);
        CUDA_CHECK_LAUNCH();
    });
}
