/* attention.cuh - (internal to kernels/cuda/) what the two paged-attention kernels share: the
 * argument checks and the KV-cache geometry of one layer, in elements. */
#ifndef PAGELLM_KERNELS_CUDA_ATTENTION_CUH
#define PAGELLM_KERNELS_CUDA_ATTENTION_CUH

#include "cuda_internal.cuh"

enum { ATTN_MAX_HEAD_DIM = 1024 };

/* Cache geometry handed to the kernels: element offsets of one layer's K half within a block
 * (V is `half` further), the block stride, and the row stride of one token. */
typedef struct {
    size_t block_elems, half, layer_off, row;
    int bs, nkv, D, max_blocks;
} KvGeom;

static inline KvGeom kc_attn_check(const KvLayout *l, int layer, const AttnBatch *b, int nh,
                                   const char *what) {
    KC_REQUIRE(l->num_kv_heads > 0 && nh > 0 && nh % l->num_kv_heads == 0,
               "%s: %d query heads are not a multiple of %d kv heads", what, nh, l->num_kv_heads);
    KC_REQUIRE(l->head_dim > 0 && l->head_dim % 8 == 0 && l->head_dim <= ATTN_MAX_HEAD_DIM,
               "%s: head_dim %d unsupported (a multiple of 8, at most %d)", what, l->head_dim,
               ATTN_MAX_HEAD_DIM);
    KC_REQUIRE(layer >= 0 && layer < l->num_layers, "%s: layer %d of %d", what, layer,
               l->num_layers);
    KC_REQUIRE(l->block_size > 0 && b->max_blocks_per_seq > 0, "%s: empty block tables", what);
    KvGeom g;
    g.half = (size_t)l->block_size * l->num_kv_heads * l->head_dim;
    g.block_elems = (size_t)l->num_layers * 2 * g.half;
    g.layer_off = (size_t)layer * 2 * g.half;
    g.row = (size_t)l->num_kv_heads * l->head_dim;
    g.bs = l->block_size;
    g.nkv = l->num_kv_heads;
    g.D = l->head_dim;
    g.max_blocks = b->max_blocks_per_seq;
    return g;
}

/* Both dtypes at once: body runs with TQ (activations) and TC (cache) bound. */
#define KC_DISPATCH_ATTN(act, kvdt, what, ...)                                                     \
    KC_DISPATCH_ACT(act, what, TQ, KC_DISPATCH_ACT(kvdt, what, TC, __VA_ARGS__))

/* Copy 8 cache elements at `src` into shared memory `dst` (16-byte aligned) as fp32. */
template <typename TC> __device__ __forceinline__ void stage8(float *dst, const TC *src) {
    float v[8];
    load8(v, src);
    *(float4 *)dst = make_float4(v[0], v[1], v[2], v[3]);
    *(float4 *)(dst + 4) = make_float4(v[4], v[5], v[6], v[7]);
}

#endif
