/* attention.c - the paged KV cache: kv_write stores a step's K/V into cache slots, and
 * attention runs causal GQA attention of each query token over its sequence's blocks.
 *
 * Cache layout (kernels.h): element (slot, layer, K|V, kv_head, d) lives at
 *   (slot / bs) * block_elems + layer * 2 * half + (V ? half : 0)
 *   + (slot % bs) * Hkv * D + kv_head * D + d,   half = bs * Hkv * D.
 * The CPU backend stores F32 only.
 *
 * Attention works on (token, kv head) items, spread over the worker pool: the item's
 * G = nh / nkv query heads are processed together so each K and V row is loaded once for
 * the whole group. Softmax is online at chunk granularity (at most one block, at most 64
 * positions): scores of a chunk, then one rescale of the running sum when the maximum grows,
 * so the result needs no scratch proportional to the context length. */
#include <math.h>

#include "cpu_internal.h"

enum { ATTN_CHUNK = 64 };

void cpu_kv_write(void *kv_cache, const KvLayout *l, int layer, const float *k, const float *v,
                  const int64_t *slot_mapping, int n) {
    PL_CHECK(l->dtype == DT_F32);
    PL_CHECK(layer >= 0 && layer < l->num_layers);
    size_t half = k_kv_half_elems(l), block = k_kv_block_elems(l);
    size_t row = (size_t)l->num_kv_heads * l->head_dim;
    float *cache = kv_cache;
    for (int t = 0; t < n; t++) {
        int64_t slot = slot_mapping[t];
        if (slot < 0)
            continue;
        float *dst = cache + (size_t)(slot / l->block_size) * block + (size_t)layer * 2 * half +
                     (size_t)(slot % l->block_size) * row;
        memcpy(dst, k + (size_t)t * row, row * sizeof(float));
        memcpy(dst + half, v + (size_t)t * row, row * sizeof(float));
    }
}

typedef struct {
    float *out;
    const float *q;
    const float *cache;
    const KvLayout *l;
    const AttnBatch *b;
    int layer, nh;
    float scale;
    int first_row; /* query_start[0] */
    int num_items; /* rows * nkv */
} AttnJob;

/* Dot product in 8 fixed lanes (vectorisable, order independent of the caller). */
static inline float dot(const float *a, const float *b, int D) {
    float lane[8] = {0};
    int i = 0;
    for (; i + 8 <= D; i += 8)
        for (int j = 0; j < 8; j++)
            lane[j] += a[i + j] * b[i + j];
    float s =
        ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
    for (; i < D; i++)
        s += a[i] * b[i];
    return s;
}

static int seq_of_row(const AttnBatch *b, int t) {
    int lo = 0, hi = b->num_seqs - 1; /* last s with query_start[s] <= t */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (b->query_start[mid] <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

static void attend_item(const AttnJob *jb, int t, int g, float *scratch) {
    const KvLayout *l = jb->l;
    const AttnBatch *b = jb->b;
    int D = l->head_dim, nkv = l->num_kv_heads, bs = l->block_size;
    int G = jb->nh / nkv;
    size_t half = k_kv_half_elems(l), block = k_kv_block_elems(l);
    size_t row = (size_t)nkv * D;

    int s = seq_of_row(b, t);
    int pos = b->positions[t];
    const int32_t *table = b->block_tables + (size_t)s * b->max_blocks_per_seq;
    PL_CHECK(pos >= 0 && pos / bs < b->max_blocks_per_seq);

    float *acc = scratch;                    /* [G, D] */
    float *sc = acc + (size_t)G * D;         /* [G, ATTN_CHUNK] */
    float *mx = sc + (size_t)G * ATTN_CHUNK; /* [G] running max */
    float *sum = mx + G;                     /* [G] running denominator */
    const float *q = jb->q + ((size_t)t * jb->nh + (size_t)g * G) * D;
    for (int h = 0; h < G; h++) {
        mx[h] = -INFINITY;
        sum[h] = 0.0f;
    }
    memset(acc, 0, (size_t)G * D * sizeof(float));

    for (int p0 = 0; p0 <= pos;) {
        int blk = table[p0 / bs];
        PL_CHECK(blk >= 0);
        int off = p0 % bs;
        int cnt = bs - off;
        if (cnt > ATTN_CHUNK)
            cnt = ATTN_CHUNK;
        if (cnt > pos + 1 - p0)
            cnt = pos + 1 - p0;
        const float *kb = jb->cache + (size_t)blk * block + (size_t)jb->layer * 2 * half +
                          (size_t)off * row + (size_t)g * D;
        const float *vb = kb + half;

        for (int p = 0; p < cnt; p++) {
            const float *kr = kb + (size_t)p * row;
            for (int h = 0; h < G; h++)
                sc[h * ATTN_CHUNK + p] = dot(q + (size_t)h * D, kr, D) * jb->scale;
        }
        for (int h = 0; h < G; h++) {
            float *sh = sc + h * ATTN_CHUNK;
            float m = sh[0];
            for (int p = 1; p < cnt; p++)
                m = sh[p] > m ? sh[p] : m;
            if (m > mx[h]) {
                float alpha = expf(mx[h] - m); /* 0 on the first chunk */
                float *a = acc + (size_t)h * D;
                for (int d = 0; d < D; d++)
                    a[d] *= alpha;
                sum[h] *= alpha;
                mx[h] = m;
            }
            for (int p = 0; p < cnt; p++) {
                sh[p] = expf(sh[p] - mx[h]);
                sum[h] += sh[p];
            }
        }
        for (int p = 0; p < cnt; p++) {
            const float *vr = vb + (size_t)p * row;
            for (int h = 0; h < G; h++) {
                float e = sc[h * ATTN_CHUNK + p];
                float *a = acc + (size_t)h * D;
                for (int d = 0; d < D; d++)
                    a[d] += e * vr[d];
            }
        }
        p0 += cnt;
    }

    float *o = jb->out + ((size_t)t * jb->nh + (size_t)g * G) * D;
    for (int h = 0; h < G; h++) {
        float inv = 1.0f / sum[h];
        for (int d = 0; d < D; d++)
            o[(size_t)h * D + d] = acc[(size_t)h * D + d] * inv;
    }
}

static void attn_task(void *ctx, int tid, int nt) {
    const AttnJob *jb = ctx;
    int nkv = jb->l->num_kv_heads, G = jb->nh / nkv, D = jb->l->head_dim;
    float *scratch = cpu_scratch(0, ((size_t)G * (D + ATTN_CHUNK + 2)) * sizeof(float));
    /* interleaved items: neighbours have similar context lengths, so threads stay balanced */
    for (int it = tid; it < jb->num_items; it += nt)
        attend_item(jb, jb->first_row + it / nkv, it % nkv, scratch);
}

void cpu_attention(float *out, const float *q, const void *kv_cache, const KvLayout *l, int layer,
                   const AttnBatch *b, int nh, float scale) {
    PL_CHECK(l->dtype == DT_F32);
    PL_CHECK(layer >= 0 && layer < l->num_layers);
    PL_CHECK(l->num_kv_heads > 0 && nh % l->num_kv_heads == 0);
    if (b->num_seqs <= 0)
        return;
    int first = b->query_start[0], last = b->query_start[b->num_seqs];
    if (last <= first)
        return;
    AttnJob jb = {
        .out = out,
        .q = q,
        .cache = kv_cache,
        .l = l,
        .b = b,
        .layer = layer,
        .nh = nh,
        .scale = scale,
        .first_row = first,
        .num_items = (last - first) * l->num_kv_heads,
    };
    double work = 0;
    for (int t = first; t < last; t++)
        work += (double)(b->positions[t] + 1);
    work *= (double)nh * l->head_dim * 2;
    cpu_parallel(attn_task, &jb, work < 64.0 * 1024 ? 1 : jb.num_items);
}
