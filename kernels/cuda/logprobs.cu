/* logprobs.cu - log-softmax statistics of raw logit rows, as the engine reports them: the
 * log-sum-exp of each row and its k best tokens (k <= 20) as (id, logit - lse), best first,
 * the lower id first on equal logits (engine/step.c, row_logprobs).
 *
 * One block per row and one pass over it. Each thread keeps an online (max, sum of exp)
 * pair; each warp keeps a sorted list of its k best in registers, one entry per lane: a
 * token is offered only when it beats the list's k-th entry (a ballot, rarely true after the
 * first few hundred tokens), and inserted by shifting the lanes behind it. The warps' lists
 * are then merged by warp 0 the same way. */
#include "sample.cuh"

enum { LP_MAX_K = 20 };

/* (av, ai) ranks before (bv, bi): larger logit, or equal logits and lower id. */
__device__ __forceinline__ bool lp_before(float av, int ai, float bv, int bi) {
    return av > bv || (av == bv && ai < bi);
}

/* A warp's best k so far: lane j < k holds the j-th; (tv, ti), the same in every lane, is the
 * k-th (a sentinel below every token until the list is full). */
struct WarpTop {
    float v, tv;
    int i, ti;
};

/* Insert (v, i) (the same in every lane) into the list; a token ranking after the k-th
 * changes nothing. */
__device__ __forceinline__ void top_insert(WarpTop &t, float v, int i, int k) {
    int lane = threadIdx.x & 31;
    int pos = __popc(__ballot_sync(0xffffffffu, lane < k && lp_before(t.v, t.i, v, i)));
    float uv = __shfl_up_sync(0xffffffffu, t.v, 1);
    int ui = __shfl_up_sync(0xffffffffu, t.i, 1);
    if (lane < k && lane >= pos) {
        t.v = lane == pos ? v : uv;
        t.i = lane == pos ? i : ui;
    }
    t.tv = __shfl_sync(0xffffffffu, t.v, k - 1);
    t.ti = __shfl_sync(0xffffffffu, t.i, k - 1);
}

/* Every lane calls this together; lane's token (x, i) is offered when `valid`. */
__device__ __forceinline__ void top_offer(WarpTop &t, float x, int i, bool valid, int k) {
    unsigned want = __ballot_sync(0xffffffffu, valid && lp_before(x, i, t.tv, t.ti));
    while (want) {
        int src = __ffs(want) - 1;
        top_insert(t, __shfl_sync(0xffffffffu, x, src), __shfl_sync(0xffffffffu, i, src), k);
        want &= want - 1;
    }
}

__global__ __launch_bounds__(SAMPLE_THREADS) void logprobs_kernel(float *lse, int32_t *top_ids,
                                                                  float *top_logprobs,
                                                                  const float *logits, int V,
                                                                  int k) {
    __shared__ float list_v[SAMPLE_WARPS * LP_MAX_K];
    __shared__ int list_i[SAMPLE_WARPS * LP_MAX_K];
    __shared__ float max_scratch[SAMPLE_WARPS];
    __shared__ double sum_scratch[SAMPLE_WARPS];
    const float *row = logits + (size_t)blockIdx.x * V;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float m = -INFINITY; /* this thread's max and sum of exp(x - m) */
    double s = 0.0;
    WarpTop t = {-INFINITY, -INFINITY, INT_MAX, INT_MAX};
    auto take = [&](float x, int i, bool valid) {
        x = sample_canon(x);
        if (valid && x > -INFINITY) {
            if (x > m) {
                s = s * (double)expf(m - x) + 1.0;
                m = x;
            } else {
                s += (double)expf(x - m);
            }
        }
        if (k > 0)
            top_offer(t, x, i, valid, k);
    };
    /* warp-uniform loops (the ballots need every lane): float4 loads when the row is aligned */
    int nvec = ((uintptr_t)row & 15) == 0 ? V / 4 : 0;
    const float4 *vec = (const float4 *)row;
    for (int base = warp * 128; base < nvec; base += SAMPLE_WARPS * 128) {
        float4 a[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int q = base + u * 32 + lane;
            a[u] = q < nvec ? __ldg(vec + q) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int q = base + u * 32 + lane, i = 4 * q;
            bool ok = q < nvec;
            take(a[u].x, i, ok);
            take(a[u].y, i + 1, ok);
            take(a[u].z, i + 2, ok);
            take(a[u].w, i + 3, ok);
        }
    }
    for (int base = 4 * nvec + warp * 32; base < V; base += SAMPLE_WARPS * 32) {
        int i = base + lane;
        take(i < V ? row[i] : 0.0f, i, i < V);
    }

    /* lse: the block's max, then each thread's sum rescaled to it */
    float bm = warp_max(m);
    if (lane == 0)
        max_scratch[warp] = bm;
    if (k > 0 && lane < k) {
        list_v[warp * k + lane] = t.v;
        list_i[warp * k + lane] = t.i;
    }
    __syncthreads();
    bm = max_scratch[0];
    for (int w = 1; w < SAMPLE_WARPS; w++)
        bm = fmaxf(bm, max_scratch[w]);
    double part = s * exp((double)m - (double)bm);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        part += __shfl_xor_sync(0xffffffffu, part, o);
    if (lane == 0)
        sum_scratch[warp] = part;
    __syncthreads();
    if (warp != 0)
        return;
    double sum = 0.0;
    for (int w = 0; w < SAMPLE_WARPS; w++)
        sum += sum_scratch[w];
    float l = bm + (float)log(sum);
    if (lane == 0)
        lse[blockIdx.x] = l;
    if (k == 0)
        return;
    /* warp 0 merges the other warps' lists into its own */
    for (int base = k; base < SAMPLE_WARPS * k; base += 32) {
        int e = base + lane;
        bool ok = e < SAMPLE_WARPS * k;
        top_offer(t, ok ? list_v[e] : 0.0f, ok ? list_i[e] : 0, ok, k);
    }
    if (lane < k) {
        top_ids[(size_t)blockIdx.x * k + lane] = t.i;
        top_logprobs[(size_t)blockIdx.x * k + lane] = t.v - l;
    }
}

void k_cuda_logprobs(float *lse, int32_t *top_ids, float *top_logprobs, const float *logits, int n,
                     int vocab, int k, void *stream) {
    KC_REQUIRE(n >= 0 && vocab > 0 && k >= 0 && k <= LP_MAX_K && k <= vocab,
               "k_cuda_logprobs: bad shape (n %d, vocab %d, k %d; k at most %d and vocab)", n,
               vocab, k, LP_MAX_K);
    if (n == 0)
        return;
    logprobs_kernel<<<n, SAMPLE_THREADS, 0, kc_stream(stream)>>>(lse, top_ids, top_logprobs, logits,
                                                                 vocab, k);
    CUDA_CHECK_LAUNCH();
}
