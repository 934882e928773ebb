/* attention_prefill.cu - causal attention of prompt chunks over the paged cache (varlen: each
 * sequence's rows are query_start[s]..query_start[s+1], at any positions, so a chunk attends
 * to its sequence's earlier chunks already in the cache as well as to itself).
 *
 * k_cuda_attention_prefill takes the tensor-core kernels for bf16 (f16) queries on a cache of
 * the same type or fp8 (prefill_tc.cuh): on Hopper with the sm_90a kernels built, wgmma's at
 * head_dim 128 (attention_prefill_sm90a.cu); mma.sync's for head_dim a multiple of 16 up to 256
 * (attention_prefill_tc.cu). Otherwise it takes the
 * fp32 CUDA-core kernel here, which handles every supported shape and dtype pair exactly (an fp8
 * cache staged as dec(q) * s, the CPU reference's values).
 *
 * Grid (query tile, KV head x head group). A tile is M query vectors: TQ = M / HB rows of one
 * sequence times the HB query heads of one KV head, so each K/V tile staged in shared memory
 * (fp32) serves every row and head of the tile. Flash-attention loop over the positions
 * 0..max position of the tile (with a sliding window: from the first position any row's window
 * holds, positions before it never loaded): S = Q K^T (register-tiled, RQ x RK per thread),
 * causal (and window) mask by each row's own position, online softmax, O = O * alpha + P V
 * with O in registers. All fp32 on CUDA cores. */
#include <math.h>

#include "prefill_tc.cuh"

enum { PF_THREADS = 256, PF_MAXP = 8 };

template <typename TQ, typename TC, int M, int TK, int RQ, int RK>
__global__ __launch_bounds__(PF_THREADS) void prefill_kernel(TQ *out, const TQ *q, const TC *cache,
                                                             KvGeom kg, const int32_t *positions,
                                                             const int32_t *query_start,
                                                             int num_seqs,
                                                             const int32_t *block_tables, int nh,
                                                             int G, int HB, float scale) {
    constexpr int TX = TK / RK, TY = M / RQ, TPR = PF_THREADS / M, CPT = TK / TPR;
    static_assert(TX * TY == PF_THREADS, "score tiling must cover the block");
    static_assert(TPR * CPT == TK && TPR <= 32, "softmax mapping");
    extern __shared__ float4 smem4[];
    float *smem = (float *)smem4;
    __shared__ int s_seq, s_t0, s_minpos, s_maxpos;
    const int tid = threadIdx.x, lane = tid & 31, D = kg.D, D8 = D >> 3, DP = D + 4;
    const int TQr = M / HB;

    if (tid < 32) {
        int s, t0;
        find_tile(query_start, num_seqs, TQr, blockIdx.x, &s, &t0);
        if (lane == 0) {
            s_seq = s;
            s_t0 = t0;
        }
    }
    __syncthreads();
    const int s = s_seq, t0 = s_t0;
    if (s < 0)
        return;
    const int t_end = query_start[s + 1];
    const int groups = G / HB;
    const int g = blockIdx.y / groups;
    const int h0 = g * G + (blockIdx.y - g * groups) * HB;

    float *Qs = smem;                  /* [M][DP] scaled queries, vector v = row * HB + head */
    float *Ks = Qs + M * DP;           /* [TK][DP] */
    float *Vs = Ks + TK * DP;          /* [TK][DP] */
    float *S = Vs + TK * DP;           /* [M][TK + 1] scores, then probabilities */
    float *row_m = S + M * (TK + 1);   /* [M] running max */
    float *row_l = row_m + M;          /* [M] running sum */
    float *row_a = row_l + M;          /* [M] rescale factor of this tile */
    int *row_pos = (int *)(row_a + M); /* [M] position, -1 for rows past the sequence */

    for (int v = tid; v < M; v += PF_THREADS) {
        int t = t0 + v / HB;
        row_pos[v] = t < t_end ? positions[t] : -1;
        row_m[v] = -INFINITY;
        row_l[v] = 0.0f;
    }
    for (int e = tid; e < M * D; e += PF_THREADS) {
        int v = e / D, d = e - v * D, r = v / HB, t = t0 + r;
        Qs[v * DP + d] =
            t < t_end ? to_f32(q[((size_t)t * nh + h0 + (v - r * HB)) * D + d]) * scale : 0.0f;
    }
    __syncthreads();
    if (tid < 32) {
        int mp = -1, mn = 0x7fffffff;
        for (int v = lane; v < M; v += 32) {
            mp = max(mp, row_pos[v]);
            if (row_pos[v] >= 0)
                mn = min(mn, row_pos[v]);
        }
        warp_min_max(mn, mp);
        if (lane == 0) {
            s_maxpos = mp;
            s_minpos = mn;
        }
    }
    __syncthreads();
    const int maxpos = s_maxpos, lo = s_maxpos >= 0 ? kv_window_lo(kg, s_minpos) : 0;
    const int32_t *table = block_tables + (size_t)s * kg.max_blocks;
    const TC *base = cache + kg.layer_off + (size_t)g * D;

    const int npairs = M * D8; /* P.V: thread owns pairs tid + i * PF_THREADS: (vector, 8 dims) */
    float acc[PF_MAXP][8];
#pragma unroll
    for (int i = 0; i < PF_MAXP; i++)
#pragma unroll
        for (int c = 0; c < 8; c++)
            acc[i][c] = 0.0f;
    const int tx = tid % TX, ty = tid / TX;

    for (int k0 = lo - lo % TK; k0 <= maxpos; k0 += TK) {
        for (int e = tid; e < TK * D8; e += PF_THREADS) {
            int j = e / D8, c = e - j * D8, p = k0 + j;
            float *kd = Ks + j * DP + c * 8, *vd = Vs + j * DP + c * 8;
            if (p >= lo && p <= maxpos) {
                const TC *src = base + (size_t)table[p / kg.bs] * kg.block_elems +
                                (size_t)(p % kg.bs) * kg.row + c * 8;
                stage8(kd, src, kg.ks);
                stage8(vd, src + kg.half, kg.vs);
            } else { /* zeros, not garbage: a masked position still meets P = 0 in P.V */
                float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                *(float4 *)kd = z;
                *(float4 *)(kd + 4) = z;
                *(float4 *)vd = z;
                *(float4 *)(vd + 4) = z;
            }
        }
        __syncthreads();

        /* S[v][j] for v = ty * RQ + i, j = tx + k * TX (neighbouring threads, neighbouring K rows)
         */
        float sc[RQ][RK];
#pragma unroll
        for (int i = 0; i < RQ; i++)
#pragma unroll
            for (int k = 0; k < RK; k++)
                sc[i][k] = 0.0f;
        for (int d = 0; d < D; d += 4) {
            float4 qv[RQ], kv[RK];
#pragma unroll
            for (int i = 0; i < RQ; i++)
                qv[i] = *(const float4 *)(Qs + (ty * RQ + i) * DP + d);
#pragma unroll
            for (int k = 0; k < RK; k++)
                kv[k] = *(const float4 *)(Ks + (tx + k * TX) * DP + d);
#pragma unroll
            for (int i = 0; i < RQ; i++)
#pragma unroll
                for (int k = 0; k < RK; k++) {
                    sc[i][k] = fmaf(qv[i].x, kv[k].x, sc[i][k]);
                    sc[i][k] = fmaf(qv[i].y, kv[k].y, sc[i][k]);
                    sc[i][k] = fmaf(qv[i].z, kv[k].z, sc[i][k]);
                    sc[i][k] = fmaf(qv[i].w, kv[k].w, sc[i][k]);
                }
        }
#pragma unroll
        for (int i = 0; i < RQ; i++)
#pragma unroll
            for (int k = 0; k < RK; k++) {
                const int v = ty * RQ + i, j = tx + k * TX;
                S[v * (TK + 1) + j] = kv_sees(kg, row_pos[v], k0 + j) ? sc[i][k] : -INFINITY;
            }
        __syncthreads();

        /* online softmax: TPR neighbouring lanes per query vector */
        {
            const int v = tid / TPR, sub = tid % TPR;
            float *sv = S + v * (TK + 1);
            float mx = -INFINITY;
#pragma unroll
            for (int c = 0; c < CPT; c++)
                mx = fmaxf(mx, sv[sub + c * TPR]);
#pragma unroll
            for (int o = TPR / 2; o > 0; o >>= 1)
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            const float mold = row_m[v], mnew = fmaxf(mold, mx);
            float sum = 0.0f;
#pragma unroll
            for (int c = 0; c < CPT; c++) {
                float x = sv[sub + c * TPR];
                float p = mnew == -INFINITY ? 0.0f : expf(x - mnew);
                sv[sub + c * TPR] = p;
                sum += p;
            }
#pragma unroll
            for (int o = TPR / 2; o > 0; o >>= 1)
                sum += __shfl_xor_sync(0xffffffffu, sum, o);
            __syncwarp(); /* every lane has read row_m[v] before lane `sub 0` rewrites it */
            if (sub == 0) {
                float a = mnew == -INFINITY ? 1.0f : expf(mold - mnew);
                row_a[v] = a;
                row_l[v] = row_l[v] * a + sum;
                row_m[v] = mnew;
            }
        }
        __syncthreads();

#pragma unroll
        for (int pi = 0; pi < PF_MAXP; pi++) {
            int pair = tid + pi * PF_THREADS;
            if (pair < npairs) {
                int v = pair / D8, c = pair - v * D8;
                float a = row_a[v];
#pragma unroll
                for (int i = 0; i < 8; i++)
                    acc[pi][i] *= a;
                const float *sv = S + v * (TK + 1);
                const float *vp = Vs + c * 8;
#pragma unroll 4
                for (int j = 0; j < TK; j++) {
                    float p = sv[j];
                    float4 x = *(const float4 *)(vp + j * DP),
                           y = *(const float4 *)(vp + j * DP + 4);
                    acc[pi][0] = fmaf(p, x.x, acc[pi][0]);
                    acc[pi][1] = fmaf(p, x.y, acc[pi][1]);
                    acc[pi][2] = fmaf(p, x.z, acc[pi][2]);
                    acc[pi][3] = fmaf(p, x.w, acc[pi][3]);
                    acc[pi][4] = fmaf(p, y.x, acc[pi][4]);
                    acc[pi][5] = fmaf(p, y.y, acc[pi][5]);
                    acc[pi][6] = fmaf(p, y.z, acc[pi][6]);
                    acc[pi][7] = fmaf(p, y.w, acc[pi][7]);
                }
            }
        }
        __syncthreads(); /* Ks, Vs and S are rewritten by the next tile */
    }

#pragma unroll
    for (int pi = 0; pi < PF_MAXP; pi++) {
        int pair = tid + pi * PF_THREADS;
        if (pair < npairs) {
            int v = pair / D8, c = pair - v * D8, r = v / HB, t = t0 + r;
            if (t < t_end) {
                float inv = 1.0f / row_l[v];
                TQ *o = out + ((size_t)t * nh + h0 + (v - r * HB)) * D + c * 8;
#pragma unroll
                for (int i = 0; i < 8; i++)
                    o[i] = from_f32<TQ>(acc[pi][i] * inv);
            }
        }
    }
}

template <typename TQ, typename TC, int M, int TK, int RQ, int RK>
static void launch_prefill(void *out, const void *q, const void *kv_cache, const KvGeom &kg,
                           const AttnBatch *b, int nh, int G, float scale, cudaStream_t stream) {
    /* heads per block: the largest power of two dividing G, at most 16 (rows per tile M / HB) */
    int HB = 1;
    while (HB * 2 <= 16 && HB * 2 <= M && G % (HB * 2) == 0)
        HB *= 2;
    KC_REQUIRE((size_t)M * (kg.D / 8) <= (size_t)PF_THREADS * PF_MAXP,
               "k_cuda_attention_prefill: head_dim %d too large for this tile", kg.D);
    const int TQr = M / HB;
    size_t smem =
        ((size_t)(M + 2 * TK) * (kg.D + 4) + (size_t)M * (TK + 1) + 4 * M) * sizeof(float);
    dim3 grid((unsigned)((b->num_tokens + TQr - 1) / TQr + b->num_seqs),
              (unsigned)(kg.nkv * (G / HB)));
    auto kern = prefill_kernel<TQ, TC, M, TK, RQ, RK>;
    kc_set_smem(kern, smem);
    kern<<<grid, PF_THREADS, smem, stream>>>((TQ *)out, (const TQ *)q, (const TC *)kv_cache, kg,
                                             b->positions, b->query_start, b->num_seqs,
                                             b->block_tables, nh, G, HB, scale);
    CUDA_CHECK_LAUNCH();
}

void k_cuda_attention_prefill(void *out, const void *q, DType act, const void *kv_cache,
                              const KvLayout *l, int layer, const AttnBatch *b, int nh, float scale,
                              int window, void *stream) {
    const char *what = "k_cuda_attention_prefill";
    KvGeom kg = kc_attn_check(l, layer, b, nh, window, what);
    if (b->num_tokens <= 0 || b->num_seqs <= 0)
        return;
    const int G = nh / kg.nkv;
    cudaStream_t st = kc_stream(stream);
    if (kc_prefill_wgmma_ok(act, l)) {
        kc_prefill_wgmma(out, q, act, l->dtype, kv_cache, kg, b, nh, scale, st);
        return;
    }
    if (kc_prefill_tc_ok(act, l)) {
        kc_prefill_tc(out, q, act, l->dtype, kv_cache, kg, b, nh, scale, st);
        return;
    }
    KC_DISPATCH_ATTN(act, l->dtype, what, {
        if (kg.D <= 128) /* 64 vectors x 32 positions, 2 x 4 scores per thread */
            launch_prefill<TQ, TC, 64, 32, 2, 4>(out, q, kv_cache, kg, b, nh, G, scale, st);
        else if (kg.D <= 256) /* 64 x 16, 1 x 4 */
            launch_prefill<TQ, TC, 64, 16, 1, 4>(out, q, kv_cache, kg, b, nh, G, scale, st);
        else /* 16 x 16, 1 x 1: keeps shared memory under 200 KB up to D = 1024 */
            launch_prefill<TQ, TC, 16, 16, 1, 1>(out, q, kv_cache, kg, b, nh, G, scale, st);
    });
}
