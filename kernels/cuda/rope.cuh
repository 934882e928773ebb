/* rope.cuh - (internal to kernels/cuda/) what rope.cu's kernels and the fused projection of
 * gemv_fused.cu share: where a launch finds its rows and the cache, the cache row of a token,
 * and the rotation of one pair, so that both give the same bits. */
#ifndef PAGELLM_KERNELS_CUDA_ROPE_CUH
#define PAGELLM_KERNELS_CUDA_ROPE_CUH

#include "kv_fp8.cuh"

/* The largest head_dim / 2 the rotary kernels take. */
enum { ROPE_MAX_HALF = 512 };

/* Where one launch finds q, k and v: row strides in elements (see the kernel). */
typedef struct {
    const void *q;
    void *q_out;
    size_t q_stride;
    void *k;
    size_t k_stride;
    const void *v;
    size_t v_stride;
} RopeRows;

/* One launch: the rows, the rotation (inv_freq NULL: none), the cache (NULL: none; slot
 * s of a token lands at (s / bs) * block_elems + layer_off + (s % bs) * nkv * D, v `half`
 * elements after k) and the per-head RMSNorm of q and k before the rotation (q_norm NULL:
 * none; weights [D] of dtype norm_dt). */
typedef struct {
    RopeRows r;
    const int32_t *positions;
    const float *inv_freq;
    int nh, nkv, D;
    void *cache;
    const int64_t *slot_mapping;
    int bs;
    size_t block_elems, layer_off, half;
    const void *q_norm, *k_norm;
    int norm_dt;
    float norm_eps;
    int rh;                     /* rotated pairs per head (rot_dim / 2; D / 2 without partial) */
    float attn_factor;          /* cos and sin times this (1: none) */
    const float *long_inv_freq; /* used from position long_from on (NULL: none) */
    int long_from;
    float k_inv, v_inv; /* fp8 cache: 1 / the layer's k and v scales (kv_enc); else unused */
} RopeKv;

/* The frequencies of a token at pos. */
__device__ __forceinline__ const float *rope_freqs(const RopeKv &a, int pos) {
    return a.long_inv_freq && pos >= a.long_from ? a.long_inv_freq : a.inv_freq;
}

/* Token t's k row in the cache, or NULL (no cache, or a padding slot). */
template <typename TC> __device__ __forceinline__ TC *cache_row(const RopeKv &a, int t) {
    if (!a.cache)
        return NULL;
    const int64_t slot = a.slot_mapping[t];
    if (slot < 0)
        return NULL;
    return (TC *)a.cache + (size_t)(slot / a.bs) * a.block_elems + a.layer_off +
           (size_t)(slot % a.bs) * a.nkv * a.D;
}

/* a's cache geometry for `layer` of layout l: block size, elements per block, the layer's
 * offset in a block, the V half's offset from the K half, and an fp8 cache's inverse scales. */
static inline void rope_cache_geometry(RopeKv *a, const KvLayout *l, int layer) {
    a->half = (size_t)l->block_size * l->num_kv_heads * l->head_dim;
    a->block_elems = (size_t)l->num_layers * 2 * a->half;
    a->layer_off = (size_t)layer * 2 * a->half;
    a->bs = l->block_size;
    a->k_inv = 1.0f / k_kv_scale(l, layer, 0);
    a->v_inv = 1.0f / k_kv_scale(l, layer, 1);
}

/* The pair (x1, x2) = (x[i], x[i + D/2]) rotated by pos * inv_freq_i (accurate sincosf; cos
 * and sin times factor f unless it is 1), each result rounded to the activation dtype T and
 * returned as fp32. */
template <typename T>
__device__ __forceinline__ void rope_rotate(float &x1, float &x2, float pos, float inv_freq,
                                            float f = 1.0f) {
    float sn, cs;
    sincosf(pos * inv_freq, &sn, &cs);
    if (f != 1.0f) {
        sn *= f;
        cs *= f;
    }
    const float y1 = fmaf(x1, cs, -(x2 * sn)), y2 = fmaf(x2, cs, x1 * sn); /* no contraction */
    x1 = to_f32(from_f32<T>(y1));
    x2 = to_f32(from_f32<T>(y2));
}

#endif
