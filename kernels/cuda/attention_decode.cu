/* attention_decode.cu - paged attention for decode: one query row per sequence, any number of
 * rows handled correctly.
 *
 * Grid (row, KV head x head group, partition of DEC_PART positions). A block takes HB query
 * heads of one KV head (all G of them unless G * D is large), so every K and V row is loaded
 * from the cache once for the whole group: K and V come through shared memory in tiles of CH
 * positions (16-byte loads, converted to fp32), the block computes the partition's scores
 * into shared memory, its softmax, then P.V. A partition writes its un-normalised output with
 * its max and sum to the workspace, and decode_reduce_kernel combines them (split-K, for long
 * contexts); when a row's context fits one partition the block writes the output directly. */
#include <math.h>
#include <stdio.h>

#include "attention.cuh"

enum { DEC_THREADS = 256, DEC_PART = 256, DEC_MAX_HB = 16 };

template <typename TQ, typename TC>
__global__ __launch_bounds__(DEC_THREADS) void decode_kernel(
    TQ *out, const TQ *q, const TC *cache, KvGeom kg, const int32_t *positions,
    const int32_t *query_start, int num_seqs, const int32_t *block_tables, int nh, int G, int HB,
    int CH, int TPD, float scale, int max_parts, float *ws_acc, float *ws_ml) {
    extern __shared__ float4 smem4[];
    float *smem = (float *)smem4;
    const int tid = threadIdx.x, D = kg.D, D8 = D >> 3, DP = D + 4;
    const int qs0 = query_start[0];
    const int row = qs0 + blockIdx.x;
    if (row >= query_start[num_seqs])
        return;
    const int groups = G / HB;
    const int g = blockIdx.y / groups;
    const int h0 = g * G + (blockIdx.y - g * groups) * HB;
    const int part = blockIdx.z;
    const int ctx = positions[row] + 1;
    const int nparts = (ctx + DEC_PART - 1) / DEC_PART;
    if (nparts > max_parts) { /* a context longer than max_blocks_per_seq allows */
        if (part == 0 && tid == 0)
            printf("k_cuda_attention_decode: row %d at position %d is beyond the %d partitions "
                   "of max_blocks_per_seq\n",
                   row, ctx - 1, max_parts);
        __trap();
    }
    const int start = part * DEC_PART;
    if (start >= ctx)
        return;
    const int end = min(ctx, start + DEC_PART), n = end - start;
    const int s = seq_of_row(query_start, num_seqs, row);
    const int32_t *table = block_tables + (size_t)s * kg.max_blocks;
    const TC *base = cache + kg.layer_off + (size_t)g * D;

    float *qs = smem;                    /* [HB][DP] scaled queries */
    float *tile = qs + HB * DP;          /* [CH][DP] K, then V */
    float *logits = tile + CH * DP;      /* [HB][DEC_PART] scores, then probabilities */
    float *red = logits + HB * DEC_PART; /* [DEC_THREADS * 8] partial P.V sums */
    float *ml = red + DEC_THREADS * 8;   /* [2][HB] max, sum */

    for (int e = tid; e < HB * D; e += DEC_THREADS) {
        int hh = e / D, d = e - hh * D;
        qs[hh * DP + d] = to_f32(q[((size_t)row * nh + h0 + hh) * D + d]) * scale;
    }

    /* scores: HB x cnt dot products per tile, TPD threads per dot (uniform per warp) */
    const int ndot = HB * CH, per_pass = DEC_THREADS / TPD, sub = tid % TPD;
    for (int c0 = start; c0 < end; c0 += CH) {
        const int cnt = min(CH, end - c0);
        __syncthreads(); /* the previous tile is consumed; q is in place */
        for (int e = tid; e < cnt * D8; e += DEC_THREADS) {
            int j = e / D8, c = e - j * D8, p = c0 + j;
            const TC *src = base + (size_t)table[p / kg.bs] * kg.block_elems +
                            (size_t)(p % kg.bs) * kg.row + c * 8;
            stage8(tile + j * DP + c * 8, src);
        }
        __syncthreads();
        for (int pass = 0; pass < ndot; pass += per_pass) {
            int di = pass + tid / TPD;
            int hh = di / CH, j = di - hh * CH;
            float acc = 0.0f;
            if (di < ndot && j < cnt) {
                const float4 *qa = (const float4 *)(qs + hh * DP);
                const float4 *ka = (const float4 *)(tile + j * DP);
                for (int d4 = sub; d4 < D / 4; d4 += TPD) {
                    float4 a = qa[d4], k4 = ka[d4];
                    acc = fmaf(a.x, k4.x, acc);
                    acc = fmaf(a.y, k4.y, acc);
                    acc = fmaf(a.z, k4.z, acc);
                    acc = fmaf(a.w, k4.w, acc);
                }
            }
            for (int o = TPD / 2; o > 0; o >>= 1)
                acc += __shfl_xor_sync(0xffffffffu, acc, o);
            if (sub == 0 && di < ndot && j < cnt)
                logits[hh * DEC_PART + (c0 - start) + j] = acc;
        }
    }
    __syncthreads();

    /* softmax over the partition, one warp per head */
    const int lane = tid & 31;
    for (int hh = tid >> 5; hh < HB; hh += DEC_THREADS / 32) {
        float *lg = logits + hh * DEC_PART;
        float mx = -INFINITY;
        for (int j = lane; j < n; j += 32)
            mx = fmaxf(mx, lg[j]);
        mx = warp_max(mx);
        float sum = 0.0f;
        for (int j = lane; j < n; j += 32) {
            float e = expf(lg[j] - mx);
            lg[j] = e;
            sum += e;
        }
        sum = warp_sum(sum);
        if (lane == 0) {
            ml[hh] = mx;
            ml[HB + hh] = sum;
        }
    }

    /* P.V: thread (pair = head x 8 dims, r) sums positions j = r mod R of each tile */
    const int npairs = HB * D8, R = DEC_THREADS / npairs;
    const int pair = tid % npairs, r = tid / npairs;
    const int ph = pair / D8, pc = pair - ph * D8;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int c0 = start; c0 < end; c0 += CH) {
        const int cnt = min(CH, end - c0);
        __syncthreads(); /* softmax done / the previous tile is consumed */
        for (int e = tid; e < cnt * D8; e += DEC_THREADS) {
            int j = e / D8, c = e - j * D8, p = c0 + j;
            const TC *src = base + (size_t)table[p / kg.bs] * kg.block_elems + kg.half +
                            (size_t)(p % kg.bs) * kg.row + c * 8;
            stage8(tile + j * DP + c * 8, src);
        }
        __syncthreads();
        if (r < R) {
            const float *lg = logits + ph * DEC_PART + (c0 - start);
            for (int j = r; j < cnt; j += R) {
                float pj = lg[j];
                const float4 *vv = (const float4 *)(tile + j * DP + pc * 8);
                float4 a = vv[0], b4 = vv[1];
                acc[0] = fmaf(pj, a.x, acc[0]);
                acc[1] = fmaf(pj, a.y, acc[1]);
                acc[2] = fmaf(pj, a.z, acc[2]);
                acc[3] = fmaf(pj, a.w, acc[3]);
                acc[4] = fmaf(pj, b4.x, acc[4]);
                acc[5] = fmaf(pj, b4.y, acc[5]);
                acc[6] = fmaf(pj, b4.z, acc[6]);
                acc[7] = fmaf(pj, b4.w, acc[7]);
            }
        }
    }
    if (r < R) {
#pragma unroll
        for (int i = 0; i < 8; i++)
            red[(r * npairs + pair) * 8 + i] = acc[i];
    }
    __syncthreads();
    const size_t tok = (size_t)(row - qs0);
    for (int e = tid; e < npairs * 8; e += DEC_THREADS) {
        float v = 0.0f;
        for (int rr = 0; rr < R; rr++)
            v += red[rr * npairs * 8 + e];
        int hh = e / D, d = e - hh * D; /* e = pair * 8 + i = hh * D + d */
        int h = h0 + hh;
        if (nparts == 1)
            out[((size_t)row * nh + h) * D + d] = from_f32<TQ>(v / ml[HB + hh]);
        else
            ws_acc[((tok * nh + h) * max_parts + part) * D + d] = v;
    }
    if (nparts > 1 && tid < HB) {
        size_t i = (tok * nh + h0 + tid) * max_parts + part;
        ws_ml[2 * i] = ml[tid];
        ws_ml[2 * i + 1] = ml[HB + tid];
    }
}

/* Combine the partitions of (row, head): out = sum_p w_p acc_p / sum_p w_p l_p,
 * w_p = exp(m_p - max_p m_p). Rows whose context fit one partition were written already. */
template <typename TQ>
__global__ void decode_reduce_kernel(TQ *out, const float *ws_acc, const float *ws_ml,
                                     const int32_t *positions, const int32_t *query_start,
                                     int num_seqs, int nh, int D, int max_parts) {
    extern __shared__ float w[]; /* [max_parts rounded up to 4] */
    __shared__ float scratch[32];
    const int qs0 = query_start[0], row = qs0 + blockIdx.x, h = blockIdx.y;
    if (row >= query_start[num_seqs])
        return;
    const int nparts = (positions[row] + DEC_PART) / DEC_PART;
    if (nparts <= 1)
        return;
    const size_t base = ((size_t)(row - qs0) * nh + h) * max_parts;
    float mx = -INFINITY;
    for (int p = 0; p < nparts; p++)
        mx = fmaxf(mx, ws_ml[2 * (base + p)]);
    float den = 0.0f;
    for (int p = threadIdx.x; p < nparts; p += blockDim.x) {
        float wp = expf(ws_ml[2 * (base + p)] - mx);
        w[p] = wp;
        den += wp * ws_ml[2 * (base + p) + 1];
    }
    den = block_sum(den, scratch); /* its barriers also publish w[] */
    const float inv = 1.0f / den;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float v = 0.0f;
        for (int p = 0; p < nparts; p++)
            v = fmaf(w[p], ws_acc[(base + p) * D + d], v);
        out[((size_t)row * nh + h) * D + d] = from_f32<TQ>(v * inv);
    }
}

static int max_parts_of(const KvLayout *l, int max_blocks_per_seq) {
    size_t ctx = (size_t)max_blocks_per_seq * (size_t)l->block_size;
    return (int)((ctx + DEC_PART - 1) / DEC_PART);
}

size_t k_cuda_attention_workspace_bytes(const KvLayout *l, int num_tokens, int nh,
                                        int max_blocks_per_seq) {
    int parts = max_parts_of(l, max_blocks_per_seq);
    if (parts <= 1 || num_tokens <= 0)
        return 0;
    return (size_t)num_tokens * nh * parts * ((size_t)l->head_dim + 2) * sizeof(float);
}

void k_cuda_attention_decode(void *out, const void *q, DType act, const void *kv_cache,
                             const KvLayout *l, int layer, const AttnBatch *b, int nh, float scale,
                             void *workspace, size_t workspace_bytes, void *stream) {
    const char *what = "k_cuda_attention_decode";
    KvGeom kg = kc_attn_check(l, layer, b, nh, what);
    if (b->num_tokens <= 0 || b->num_seqs <= 0)
        return;
    const int D = kg.D, G = nh / kg.nkv;
    const int max_parts = max_parts_of(l, b->max_blocks_per_seq);
    KC_REQUIRE(max_parts <= 12288, "%s: %d partitions of %d positions: context too long", what,
               max_parts, (int)DEC_PART);
    size_t need = k_cuda_attention_workspace_bytes(l, b->num_tokens, nh, b->max_blocks_per_seq);
    KC_REQUIRE(workspace_bytes >= need && (need == 0 || workspace),
               "%s: workspace of %zu bytes, %zu needed", what, workspace_bytes, need);
    float *ws_acc = (float *)workspace;
    float *ws_ml = ws_acc ? ws_acc + (size_t)b->num_tokens * nh * max_parts * D : NULL;

    /* heads per block: the largest divisor of G with HB <= 16 and HB * D <= 2048, so one
     * thread owns at most one (head, 8 dims) pair in P.V and the scores fit in 16K floats */
    int HB = 1;
    for (int c = 1; c <= G && c <= DEC_MAX_HB; c++)
        if (G % c == 0 && c * D <= DEC_THREADS * 8)
            HB = c;
    int CH = 4096 / D; /* K/V tile: at most 16 KB of fp32 */
    CH = CH < 1 ? 1 : CH > 64 ? 64 : CH;
    int TPD = 1; /* threads per dot product: fill the block, at most a warp, >= 4 dims each */
    while (TPD < 32 && 2 * TPD * HB * CH <= DEC_THREADS && 2 * TPD * 4 <= D)
        TPD *= 2;
    size_t smem = ((size_t)(HB + CH) * (D + 4) + (size_t)HB * DEC_PART + DEC_THREADS * 8 + 2 * HB) *
                  sizeof(float);
    dim3 grid((unsigned)b->num_tokens, (unsigned)(kg.nkv * (G / HB)), (unsigned)max_parts);
    KC_DISPATCH_ATTN(act, l->dtype, what, {
        auto kern = decode_kernel<TQ, TC>;
        kc_set_smem(kern, smem);
        kern<<<grid, DEC_THREADS, smem, kc_stream(stream)>>>(
            (TQ *)out, (const TQ *)q, (const TC *)kv_cache, kg, b->positions, b->query_start,
            b->num_seqs, b->block_tables, nh, G, HB, CH, TPD, scale, max_parts, ws_acc, ws_ml);
        CUDA_CHECK_LAUNCH();
        if (max_parts > 1) {
            dim3 rgrid((unsigned)b->num_tokens, (unsigned)nh);
            /* w[] padded to 16 bytes: ptxas merges the loop's tail loads of w into one wide
             * (speculative) load, which compute-sanitizer flags past an unpadded end */
            size_t rsmem = (size_t)((max_parts + 3) & ~3) * sizeof(float);
            decode_reduce_kernel<TQ><<<rgrid, 128, rsmem, kc_stream(stream)>>>(
                (TQ *)out, ws_acc, ws_ml, b->positions, b->query_start, b->num_seqs, nh, D,
                max_parts);
            CUDA_CHECK_LAUNCH();
        }
    });
}
