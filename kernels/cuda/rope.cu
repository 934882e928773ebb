/* rope.cu - rotary position embedding (Hugging Face rotate-half) fused with the store of the
 * step's K and V into the paged, block-major KV cache; one block per token.
 *
 * As the CPU ops: angle = (float)pos * inv_freq[i] (cos/sin computed once per token into
 * shared memory, accurate sincosf), x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin, q and k
 * rotated in place in the activation dtype; the cache then receives that rounded k (and v)
 * converted to its own dtype, at
 *   (slot / bs) * block_elems + layer * 2 * half + (V ? half : 0) + (slot % bs) * Hkv * D
 * with slot -1 (padding) skipped. The same kernel serves rope alone (no cache), kv_write
 * alone (no rotation) and both on the fused QKV projection's rows (q rotated into its own
 * buffer, as attention reads it). */
#include "cuda_internal.cuh"

enum { ROPE_THREADS = 128, ROPE_MAX_HALF = 512 };

/* q rows (stride q_stride) are rotated into q_out (contiguous [n, nh, D]; may equal q);
 * k rows (stride k_stride) are rotated in place; v rows (stride v_stride) are only read. */
template <typename T, typename TC>
__global__ __launch_bounds__(ROPE_THREADS) void rope_kv_kernel(
    const T *q, T *q_out, size_t q_stride, T *k, size_t k_stride, const T *v, size_t v_stride,
    const int32_t *positions, const float *inv_freq, int nh, int nkv, int D, TC *cache,
    const int64_t *slot_mapping, int bs, size_t block_elems, size_t layer_off, size_t half) {
    __shared__ float cs[ROPE_MAX_HALF], sn[ROPE_MAX_HALF];
    const int t = blockIdx.x, hd = D / 2;
    const bool rotate = inv_freq != NULL;
    if (rotate) {
        float pos = (float)positions[t];
        for (int i = threadIdx.x; i < hd; i += ROPE_THREADS)
            sincosf(pos * inv_freq[i], &sn[i], &cs[i]);
        __syncthreads();
    }
    TC *kdst = NULL;
    if (cache) {
        int64_t slot = slot_mapping[t];
        if (slot >= 0)
            kdst = cache + (size_t)(slot / bs) * block_elems + layer_off +
                   (size_t)(slot % bs) * nkv * D;
    }
    if (q && rotate) {
        const T *qt = q + (size_t)t * q_stride;
        T *ot = q_out + (size_t)t * nh * D;
        for (int e = threadIdx.x; e < nh * hd; e += ROPE_THREADS) {
            int h = e / hd, i = e - h * hd;
            size_t at = (size_t)h * D + i;
            float x1 = to_f32(qt[at]), x2 = to_f32(qt[at + hd]);
            ot[at] = from_f32<T>(x1 * cs[i] - x2 * sn[i]);
            ot[at + hd] = from_f32<T>(x2 * cs[i] + x1 * sn[i]);
        }
    }
    if (k && (rotate || kdst)) {
        T *kt = k + (size_t)t * k_stride;
        for (int e = threadIdx.x; e < nkv * hd; e += ROPE_THREADS) {
            int h = e / hd, i = e - h * hd;
            T *x = kt + (size_t)h * D + i;
            T y1 = x[0], y2 = x[hd];
            if (rotate) {
                float x1 = to_f32(y1), x2 = to_f32(y2);
                y1 = from_f32<T>(x1 * cs[i] - x2 * sn[i]);
                y2 = from_f32<T>(x2 * cs[i] + x1 * sn[i]);
                x[0] = y1;
                x[hd] = y2;
            }
            if (kdst) {
                kdst[h * D + i] = from_f32<TC>(to_f32(y1));
                kdst[h * D + i + hd] = from_f32<TC>(to_f32(y2));
            }
        }
    }
    if (v && kdst) {
        const T *vt = v + (size_t)t * v_stride;
        for (int e = threadIdx.x; e < nkv * D; e += ROPE_THREADS)
            kdst[half + e] = from_f32<TC>(to_f32(vt[e]));
    }
}

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

/* One entry for the three launchers: rope (l == NULL), kv_write (rope == NULL), both. */
static void launch_rope_kv(const RopeRows *r, DType act, const int32_t *positions,
                           const int64_t *slot_mapping, int n, int nh, int nkv, const Rope *rope,
                           void *kv_cache, const KvLayout *l, int layer, void *stream,
                           const char *what) {
    int D = rope ? rope->head_dim : l->head_dim;
    KC_REQUIRE(D > 0 && D % 2 == 0 && D / 2 <= ROPE_MAX_HALF, "%s: head_dim %d unsupported", what,
               D);
    size_t half = 0, block = 0, layer_off = 0;
    int bs = 1;
    DType cdt = DT_F32;
    if (l) {
        KC_REQUIRE(l->head_dim == D && l->num_kv_heads == nkv,
                   "%s: cache layout (%d kv heads of %d) does not match (%d of %d)", what,
                   l->num_kv_heads, l->head_dim, nkv, D);
        KC_REQUIRE(layer >= 0 && layer < l->num_layers, "%s: layer %d of %d", what, layer,
                   l->num_layers);
        half = (size_t)l->block_size * l->num_kv_heads * l->head_dim;
        block = (size_t)l->num_layers * 2 * half;
        layer_off = (size_t)layer * 2 * half;
        bs = l->block_size;
        cdt = l->dtype;
    }
    if (n <= 0)
        return;
    const float *inv = rope ? rope->inv_freq : NULL;
    KC_DISPATCH_ACT(
        act, what, T,
        KC_DISPATCH_ACT(cdt, what, TC,
                        rope_kv_kernel<T, TC><<<n, ROPE_THREADS, 0, kc_stream(stream)>>>(
                            (const T *)r->q, (T *)r->q_out, r->q_stride, (T *)r->k, r->k_stride,
                            (const T *)r->v, r->v_stride, positions, inv, nh, nkv, D,
                            (TC *)kv_cache, slot_mapping, bs, block, layer_off, half)));
    CUDA_CHECK_LAUNCH();
}

void k_cuda_rope(void *q, void *k, DType act, const int32_t *positions, int n, int nh, int nkv,
                 const Rope *rope, void *stream) {
    int D = rope->head_dim;
    RopeRows r = {q, q, (size_t)nh * D, k, (size_t)nkv * D, NULL, 0};
    launch_rope_kv(&r, act, positions, NULL, n, nh, nkv, rope, NULL, NULL, 0, stream,
                   "k_cuda_rope");
}

void k_cuda_kv_write(void *kv_cache, const KvLayout *l, int layer, const void *k, const void *v,
                     DType act, const int64_t *slot_mapping, int n, void *stream) {
    size_t kvd = (size_t)l->num_kv_heads * l->head_dim;
    RopeRows r = {NULL, NULL, 0, (void *)k, kvd, v, kvd};
    launch_rope_kv(&r, act, NULL, slot_mapping, n, 0, l->num_kv_heads, NULL, kv_cache, l, layer,
                   stream, "k_cuda_kv_write");
}

void k_cuda_qkv_rope_cache(void *q_out, void *qkv, DType act, const int32_t *positions,
                           const int64_t *slot_mapping, int n, int nh, const Rope *rope,
                           void *kv_cache, const KvLayout *l, int layer, void *stream) {
    size_t D = (size_t)l->head_dim, qd = nh * D, kvd = l->num_kv_heads * D, row = qd + 2 * kvd;
    size_t es = pl_dtype_size(act);
    char *base = (char *)qkv;
    RopeRows r = {qkv, q_out, row, base + qd * es, row, base + (qd + kvd) * es, row};
    launch_rope_kv(&r, act, positions, slot_mapping, n, nh, l->num_kv_heads, rope, kv_cache, l,
                   layer, stream, "k_cuda_qkv_rope_cache");
}
