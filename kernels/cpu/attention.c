/* attention.c - the paged KV cache: kv_write stores a step's K/V into cache slots, and
 * attention runs causal GQA attention of each query token over its sequence's blocks.
 *
 * Cache layout (kernels.h): element (slot, layer, K|V, kv_head, d) lives at
 *   (slot / bs) * block_elems + layer * 2 * half + (V ? half : 0)
 *   + (slot % bs) * Hkv * D + kv_head * D + d,   half = bs * Hkv * D.
 * The CPU backend's activations are F32; its cache holds F32, or fp8 e4m3 (DT_F8E4M3), where
 * x is stored as e4m3(x * (1 / s)) (round to nearest even, saturating at +-448) and read back
 * as dec(q) * s in fp32, s the layer's K or V scale (k_kv_scale). Attention dequantizes each
 * chunk of an fp8 cache's K and V rows (a 256-entry table per scale) into scratch and runs the
 * fp32 path on it, so fp8 results are exactly those of an fp32 cache holding dec(q) * s.
 *
 * Attention works on (token, kv head) items, spread over the worker pool: the item's
 * G = nh / nkv query heads share the group's K and V rows, which stay in L1 across the group.
 * Scores may be soft-capped (Gemma 2) and limited to a sliding window of the last positions.
 * Softmax is online at chunk granularity (at most one block, at most 64 positions): scores of
 * a chunk (4 positions per pass), then one rescale of the running sum when the maximum grows,
 * then the chunk's V rows summed in, so no scratch grows with the context length. The same
 * source is built twice, portable and for AVX2, chosen at run time; both give the same bits. */
#include <math.h>

#include "cpu_internal.h"

enum { ATTN_CHUNK = 64 };

void cpu_kv_write(const KernelOps *ops, void *kv_cache, const KvLayout *l, int layer,
                  const void *k_, const void *v_, const int64_t *slot_mapping, int n) {
    const float *k = k_, *v = v_;
    PL_CHECK(l->dtype == DT_F32 || l->dtype == DT_F8E4M3);
    PL_CHECK(layer >= 0 && layer < l->num_layers);
    size_t half = k_kv_half_elems(l), block = k_kv_block_elems(l);
    size_t row = (size_t)l->num_kv_heads * l->head_dim;
    const float k_inv = 1.0f / k_kv_scale(l, layer, 0), v_inv = 1.0f / k_kv_scale(l, layer, 1);
    for (int t = 0; t < n; t++) {
        int64_t slot = slot_mapping[t];
        if (slot < 0)
            continue;
        size_t off = (size_t)(slot / l->block_size) * block + (size_t)layer * 2 * half +
                     (size_t)(slot % l->block_size) * row;
        const float *ks = k + (size_t)t * row, *vs = v + (size_t)t * row;
        if (l->dtype == DT_F8E4M3) {
            uint8_t *dst = (uint8_t *)kv_cache + off;
            for (size_t i = 0; i < row; i++) {
                dst[i] = pl_f32_to_f8e4m3(ks[i] * k_inv);
                dst[half + i] = pl_f32_to_f8e4m3(vs[i] * v_inv);
            }
        } else {
            float *dst = (float *)kv_cache + off;
            memcpy(dst, ks, row * sizeof(float));
            memcpy(dst + half, vs, row * sizeof(float));
        }
    }
}

typedef struct {
    float *out;
    const float *q;
    const void *cache;
    const float *k_lut, *v_lut; /* fp8 cache: dec(q) * s for each byte q, K and V; else NULL */
    const KvLayout *l;
    const AttnBatch *b;
    int layer, nh;
    float scale;
    float softcap; /* > 0: s = softcap tanh(s / softcap) */
    int window;    /* > 0: the last `window` positions only */
    int first_row; /* query_start[0] */
    int num_items; /* rows * nkv */
    int simd;      /* run the AVX2 build */
} AttnJob;

/* 8-float vectors (GCC/Clang vector extensions): portable, two SSE registers each on a
 * baseline x86-64 build, one AVX register in the AVX2 build of attend_item below. Each lane
 * does the same IEEE operations either way, so both builds give bit-identical results. */
typedef float v8f __attribute__((vector_size(32)));
typedef float v8f_u __attribute__((vector_size(32), aligned(4), may_alias));
#define LOAD8(p)     (*(const v8f_u *)(const void *)(p))
#define STORE8(p, v) (*(v8f_u *)(void *)(p) = (v))
#define HOT          static inline __attribute__((always_inline))

/* by pointer: a 32-byte vector passed by value draws a -Wpsabi note from gcc */
HOT float hsum8(const v8f *v) {
    v8f l = *v;
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

/* Dot products of q with 1 or 4 rows at once. Every score is the same 8-lane sum (lane j
 * adds the products k = j mod 8 in order, lanes reduced as in hsum8, then the tail), so
 * grouping never changes a result; four rows give four independent chains. */
HOT float dot1(const float *q, const float *k, int D) {
    v8f acc = {0};
    int d = 0;
    for (; d + 8 <= D; d += 8)
        acc += LOAD8(q + d) * LOAD8(k + d);
    float s = hsum8(&acc);
    for (; d < D; d++)
        s += q[d] * k[d];
    return s;
}

HOT void dot4(float *out, const float *q, const float *k, size_t stride, int D) {
    v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    const float *k0 = k, *k1 = k + stride, *k2 = k + 2 * stride, *k3 = k + 3 * stride;
    int d = 0;
    for (; d + 8 <= D; d += 8) {
        v8f qv = LOAD8(q + d);
        a0 += qv * LOAD8(k0 + d);
        a1 += qv * LOAD8(k1 + d);
        a2 += qv * LOAD8(k2 + d);
        a3 += qv * LOAD8(k3 + d);
    }
    out[0] = hsum8(&a0);
    out[1] = hsum8(&a1);
    out[2] = hsum8(&a2);
    out[3] = hsum8(&a3);
    for (int c = 0; c < 4; c++)
        for (int t = d; t < D; t++)
            out[c] += q[t] * k[c * stride + t];
}

/* a[d] += sum over p of e[p] * v_p[d], p in order (per element the same order as one axpy
 * per position), 32 then 8 elements at a time kept in registers across the positions. */
HOT void accum_v(float *a, const float *e, const float *v, size_t stride, int cnt, int D) {
    int d = 0;
    for (; d + 32 <= D; d += 32) {
        v8f r0 = LOAD8(a + d), r1 = LOAD8(a + d + 8), r2 = LOAD8(a + d + 16),
            r3 = LOAD8(a + d + 24);
        for (int p = 0; p < cnt; p++) {
            const float *vp = v + (size_t)p * stride + d;
            float ep = e[p];
            r0 += ep * LOAD8(vp);
            r1 += ep * LOAD8(vp + 8);
            r2 += ep * LOAD8(vp + 16);
            r3 += ep * LOAD8(vp + 24);
        }
        STORE8(a + d, r0);
        STORE8(a + d + 8, r1);
        STORE8(a + d + 16, r2);
        STORE8(a + d + 24, r3);
    }
    for (; d + 8 <= D; d += 8) {
        v8f r = LOAD8(a + d);
        for (int p = 0; p < cnt; p++)
            r += e[p] * LOAD8(v + (size_t)p * stride + d);
        STORE8(a + d, r);
    }
    for (; d < D; d++)
        for (int p = 0; p < cnt; p++)
            a[d] += e[p] * v[(size_t)p * stride + d];
}

HOT void scale_vec(float *a, float s, int D) {
    int d = 0;
    for (; d + 8 <= D; d += 8)
        STORE8(a + d, LOAD8(a + d) * s);
    for (; d < D; d++)
        a[d] *= s;
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

HOT void attend_item(const AttnJob *jb, int t, int g, float *scratch) {
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
    float *kdq = sum + G;                    /* fp8: [ATTN_CHUNK, D] dequantized K, then V */
    float *vdq = kdq + (size_t)ATTN_CHUNK * D;
    const int fp8 = jb->k_lut != NULL;
    const size_t stride = fp8 ? (size_t)D : row; /* between the positions' rows of kb, vb */
    const float *q = jb->q + ((size_t)t * jb->nh + (size_t)g * G) * D;
    for (int h = 0; h < G; h++) {
        mx[h] = -INFINITY;
        sum[h] = 0.0f;
    }
    memset(acc, 0, (size_t)G * D * sizeof(float));

    for (int p0 = jb->window > 0 && pos >= jb->window ? pos - jb->window + 1 : 0; p0 <= pos;) {
        int blk = table[p0 / bs];
        PL_CHECK(blk >= 0);
        int off = p0 % bs;
        int cnt = bs - off;
        if (cnt > ATTN_CHUNK)
            cnt = ATTN_CHUNK;
        if (cnt > pos + 1 - p0)
            cnt = pos + 1 - p0;
        const size_t at =
            (size_t)blk * block + (size_t)jb->layer * 2 * half + (size_t)off * row + (size_t)g * D;
        const float *kb, *vb;
        if (fp8) {
            const uint8_t *k8 = (const uint8_t *)jb->cache + at, *v8 = k8 + half;
            for (int p = 0; p < cnt; p++)
                for (int d = 0; d < D; d++) {
                    kdq[(size_t)p * D + d] = jb->k_lut[k8[(size_t)p * row + d]];
                    vdq[(size_t)p * D + d] = jb->v_lut[v8[(size_t)p * row + d]];
                }
            kb = kdq;
            vb = vdq;
        } else {
            kb = (const float *)jb->cache + at;
            vb = kb + half;
        }

        for (int h = 0; h < G; h++) {
            float *sh = sc + h * ATTN_CHUNK;
            const float *qh = q + (size_t)h * D;
            int p = 0;
            for (; p + 4 <= cnt; p += 4)
                dot4(sh + p, qh, kb + (size_t)p * stride, stride, D);
            for (; p < cnt; p++)
                sh[p] = dot1(qh, kb + (size_t)p * stride, D);
            for (p = 0; p < cnt; p++)
                sh[p] *= jb->scale;
            if (jb->softcap > 0) /* as transformers: divide, tanh, multiply */
                for (p = 0; p < cnt; p++)
                    sh[p] = tanhf(sh[p] / jb->softcap) * jb->softcap;
        }
        for (int h = 0; h < G; h++) {
            float *sh = sc + h * ATTN_CHUNK;
            float m = sh[0];
            for (int p = 1; p < cnt; p++)
                m = sh[p] > m ? sh[p] : m;
            if (m > mx[h]) {
                float alpha = expf(mx[h] - m); /* 0 on the first chunk */
                scale_vec(acc + (size_t)h * D, alpha, D);
                sum[h] *= alpha;
                mx[h] = m;
            }
            for (int p = 0; p < cnt; p++) {
                sh[p] = expf(sh[p] - mx[h]);
                sum[h] += sh[p];
            }
        }
        for (int h = 0; h < G; h++)
            accum_v(acc + (size_t)h * D, sc + h * ATTN_CHUNK, vb, stride, cnt, D);
        p0 += cnt;
    }

    float *o = jb->out + ((size_t)t * jb->nh + (size_t)g * G) * D;
    for (int h = 0; h < G; h++) {
        memcpy(o + (size_t)h * D, acc + (size_t)h * D, (size_t)D * sizeof(float));
        scale_vec(o + (size_t)h * D, 1.0f / sum[h], D);
    }
}

HOT void attn_items(const AttnJob *jb, int tid, int nt) {
    int nkv = jb->l->num_kv_heads, G = jb->nh / nkv, D = jb->l->head_dim;
    size_t dq = jb->k_lut ? (size_t)2 * ATTN_CHUNK * D : 0; /* fp8: the chunk dequantized */
    float *scratch = cpu_scratch(0, ((size_t)G * (D + ATTN_CHUNK + 2) + dq) * sizeof(float));
    /* interleaved items: neighbours have similar context lengths, so threads stay balanced */
    for (int it = tid; it < jb->num_items; it += nt)
        attend_item(jb, jb->first_row + it / nkv, it % nkv, scratch);
}

static void attn_items_base(const AttnJob *jb, int tid, int nt) {
    attn_items(jb, tid, nt);
}

#if CPU_X86_SIMD
static __attribute__((target("avx2"))) void attn_items_avx2(const AttnJob *jb, int tid, int nt) {
    attn_items(jb, tid, nt);
}
#endif

static void attn_task(void *ctx, int tid, int nt) {
    const AttnJob *jb = ctx;
#if CPU_X86_SIMD
    if (jb->simd) {
        attn_items_avx2(jb, tid, nt);
        return;
    }
#endif
    attn_items_base(jb, tid, nt);
}

void cpu_attention(const KernelOps *ops, void *out, const void *q, const void *kv_cache,
                   const KvLayout *l, int layer, const AttnBatch *b, int nh, float scale,
                   float softcap, int window) {
    PL_CHECK(l->dtype == DT_F32 || l->dtype == DT_F8E4M3);
    PL_CHECK(layer >= 0 && layer < l->num_layers);
    PL_CHECK(l->num_kv_heads > 0 && nh % l->num_kv_heads == 0);
    float lut[2][256];
    if (l->dtype == DT_F8E4M3)
        for (int v = 0; v < 2; v++) {
            const float s = k_kv_scale(l, layer, v);
            for (int i = 0; i < 256; i++)
                lut[v][i] = pl_f8e4m3_to_f32((uint8_t)i) * s;
        }
    if (b->num_seqs <= 0)
        return;
    int first = b->query_start[0], last = b->query_start[b->num_seqs];
    if (last <= first)
        return;
    AttnJob jb = {
        .out = out,
        .q = q,
        .cache = kv_cache,
        .k_lut = l->dtype == DT_F8E4M3 ? lut[0] : NULL,
        .v_lut = l->dtype == DT_F8E4M3 ? lut[1] : NULL,
        .l = l,
        .b = b,
        .layer = layer,
        .nh = nh,
        .scale = scale,
        .softcap = softcap,
        .window = window,
        .first_row = first,
        .num_items = (last - first) * l->num_kv_heads,
        .simd = cpu_simd_level() > 0,
    };
    double work = 0;
    for (int t = first; t < last; t++)
        work += (double)(b->positions[t] + 1);
    work *= (double)nh * l->head_dim * 2;
    cpu_parallel(cpu_pool(ops), attn_task, &jb, work < 64.0 * 1024 ? 1 : jb.num_items);
}
