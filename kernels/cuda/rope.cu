/* rope.cu - rotary position embedding (Hugging Face rotate-half) fused with the store of the
 * step's K and V into the paged, block-major KV cache; one block per token and head.
 *
 * As the CPU ops: angle = (float)pos * inv_freq[i] (accurate sincosf, per pair), x1' = x1 cos - x2
 * sin, x2' = x2 cos + x1 sin, q and k rotated in place in the activation dtype; the cache then
 * receives that rounded k (and v) converted to its own dtype (fp8: e4m3(x * (1 / s)),
 * saturating, kv_fp8.cuh), at (slot / bs) * block_elems + layer * 2 * half + (V ? half : 0)
 * + (slot % bs) * Hkv * D with slot -1 (padding) skipped. The same
 * kernel serves rope alone (no cache), kv_write alone (no rotation) and both on the fused QKV
 * projection's rows (q rotated into its own buffer, as attention reads it), there with an
 * optional per-head RMSNorm of q and k first (Qwen3: one warp per head, which reduces the
 * head's sum of squares before rotating its pairs). */
#include "rope.cuh"

/* ROPE_MANY_BLOCKS: (token, head) pairs from which a block takes several heads, up to
 * ROPE_BLOCK_THREADS threads */
enum {
    ROPE_MAX_THREADS = 128,
    ROPE_MANY_BLOCKS = 2048,
    ROPE_BLOCK_THREADS = 512,
    ROPE_VEC_THREADS = 128
};

/* 1 / rms of a head's D = 2 hd elements x (the thread's pairs i, i + hd; one warp per head, so
 * blockDim.x == 32), as norm.cu computes it. */
template <typename T> __device__ __forceinline__ float head_inv_rms(const T *x, int hd, float eps) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float x1 = to_f32(x[i]), x2 = to_f32(x[i + hd]);
        ss += x1 * x1 + x2 * x2;
    }
    ss = warp_sum(ss);
    return 1.0f / sqrtf(ss / (float)(2 * hd) + eps);
}

/* The pair (x[a], x[b]) normalized: w * (x * inv), rounded to T as rmsnorm's output. */
template <typename T>
__device__ __forceinline__ void norm_pair(float &x1, float &x2, const void *w, int dt, int a, int b,
                                          float inv) {
    x1 = to_f32(from_f32<T>(load_any(w, dt, a) * (x1 * inv)));
    x2 = to_f32(from_f32<T>(load_any(w, dt, b) * (x2 * inv)));
}

/* Pair i < hd of a head: rotated pairs (i, i + rh) for i < rh, then the unrotated rest two
 * elements at a time (partial rotation: rh < hd). */
__device__ __forceinline__ void pair_of(int i, int hd, int rh, int *a, int *b) {
    if (i < rh) {
        *a = i;
        *b = i + rh;
    } else {
        *a = 2 * rh + 2 * (i - rh);
        *b = *a + 1;
    }
}

/* Thread row threadIdx.y of block (t, b) handles token t's head y = b * blockDim.y +
 * threadIdx.y of the nh q heads, then the nkv k heads, then the nkv v heads, one thread per
 * rotated pair: one head per block when the tokens are few, so a decode-sized step spreads
 * over as many SMs as it has heads; several when they are many (fewer, larger blocks). q rows
 * (stride q_stride) are rotated into q_out (contiguous [n, nh, D]; may equal q); k rows (stride
 * k_stride) are rotated in place; v rows (stride v_stride) are only read. A block whose part is
 * absent (no q, no cache) returns. */
template <typename T, typename TC>
__global__ __launch_bounds__(ROPE_BLOCK_THREADS) void rope_kv_kernel(RopeKv a) {
    kc_pdl_wait();
    kc_pdl_trigger();
    const int t = blockIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y, D = a.D, hd = D / 2;
    const int nh = a.nh, nkv = a.nkv;
    const float *inv_freq = a.inv_freq;
    const bool rotate = inv_freq != NULL;
    const T *q = (const T *)a.r.q, *v = (const T *)a.r.v;
    T *k = (T *)a.r.k;
    TC *kdst = cache_row<TC>(a, t);
    if (y >= nh + 2 * nkv)
        return;
    const int rh = a.rh;
    if (y < nh) { /* a q head */
        if (!q || !rotate)
            return;
        const T *x = q + (size_t)t * a.r.q_stride + (size_t)y * D;
        T *o = (T *)a.r.q_out + ((size_t)t * nh + y) * D;
        float pos = (float)a.positions[t];
        const float *freqs = rope_freqs(a, a.positions[t]);
        const float inv = a.q_norm ? head_inv_rms<T>(x, hd, a.norm_eps) : 0.0f;
        for (int i = threadIdx.x; i < hd; i += blockDim.x) {
            int ia, ib;
            pair_of(i, hd, rh, &ia, &ib);
            float x1 = to_f32(x[ia]), x2 = to_f32(x[ib]);
            if (a.q_norm)
                norm_pair<T>(x1, x2, a.q_norm, a.norm_dt, ia, ib, inv);
            if (i < rh)
                rope_rotate<T>(x1, x2, pos, freqs[i], a.attn_factor);
            o[ia] = from_f32<T>(x1);
            o[ib] = from_f32<T>(x2);
        }
    } else if (y < nh + nkv) { /* a k head: rotated in place, then cached */
        int h = y - nh;
        if (!k || !(rotate || kdst))
            return;
        T *x = k + (size_t)t * a.r.k_stride + (size_t)h * D;
        const float inv = a.k_norm ? head_inv_rms<T>(x, hd, a.norm_eps) : 0.0f;
        const float *freqs = rotate ? rope_freqs(a, a.positions[t]) : NULL;
        for (int i = threadIdx.x; i < hd; i += blockDim.x) {
            int ia, ib;
            pair_of(i, hd, rh, &ia, &ib);
            float x1 = to_f32(x[ia]), x2 = to_f32(x[ib]);
            if (a.k_norm)
                norm_pair<T>(x1, x2, a.k_norm, a.norm_dt, ia, ib, inv);
            if (rotate || a.k_norm) {
                if (rotate && i < rh)
                    rope_rotate<T>(x1, x2, (float)a.positions[t], freqs[i], a.attn_factor);
                x[ia] = from_f32<T>(x1);
                x[ib] = from_f32<T>(x2);
            }
            if (kdst) {
                kdst[h * D + ia] = kv_enc<TC>(to_f32(from_f32<T>(x1)), a.k_inv);
                kdst[h * D + ib] = kv_enc<TC>(to_f32(from_f32<T>(x2)), a.k_inv);
            }
        }
    } else { /* a v head: only cached */
        int h = y - nh - nkv;
        if (!v || !kdst)
            return;
        const T *x = v + (size_t)t * a.r.v_stride + (size_t)h * D;
        for (int e = threadIdx.x; e < D; e += blockDim.x)
            kdst[a.half + (size_t)h * D + e] = kv_enc<TC>(to_f32(x[e]), a.v_inv);
    }
}

/* The vector form (half % 8 == 0, 16-byte aligned rows, strides and cache offsets): unit u of
 * token t (blockIdx.x), u = blockIdx.y * ROPE_VEC_THREADS + threadIdx.x, takes 8 rotated pairs
 * (elements [i, i + 8) and [i + half, i + half + 8)) of a q head, then of a k head, or 8
 * elements of a v head, with 16-byte loads and stores; the same arithmetic as the kernel
 * above. A decode-sized batch is one wave of small blocks (the kernel above, one thread per
 * pair in blocks of 512, took 10.2 us at 256 rows of 32 + 2 x 8 heads in ncu on the H200:
 * three waves of a load, sincos, store chain, for 6.8 MB). */
template <typename T, typename TC>
__global__ __launch_bounds__(ROPE_VEC_THREADS) void rope_kv_vec_kernel(RopeKv a) {
    kc_pdl_wait();
    kc_pdl_trigger();
    const int t = blockIdx.x, D = a.D, hd = D / 2, hv = hd / 8, nh = a.nh, nkv = a.nkv;
    const int nrot = (nh + nkv) * hv, u = blockIdx.y * ROPE_VEC_THREADS + threadIdx.x;
    if (u >= nrot + nkv * (D / 8))
        return;
    const float *inv_freq = a.inv_freq;
    const bool rotate = inv_freq != NULL;
    const T *q = (const T *)a.r.q, *v = (const T *)a.r.v;
    T *k = (T *)a.r.k;
    TC *kdst = cache_row<TC>(a, t);
    float lo[8], hi[8]; /* elements [i, i + 8) and [i + hd, i + hd + 8) */
    if (u >= nrot) {    /* 8 elements of the v heads: only cached */
        const size_t e = (size_t)(u - nrot) * 8;
        if (!v || !kdst)
            return;
        load8(lo, v + (size_t)t * a.r.v_stride + e);
        kv_store8(kdst + a.half + e, lo, a.v_inv);
        return;
    }
    const bool is_q = u < nh * hv;
    const int h = u / hv - (is_q ? 0 : nh), i = (u % hv) * 8;
    if (is_q ? !q || !rotate : !k || !(rotate || kdst))
        return;
    const T *x = is_q ? q + (size_t)t * a.r.q_stride + (size_t)h * D
                      : k + (size_t)t * a.r.k_stride + (size_t)h * D;
    load8(lo, x + i);
    load8(hi, x + i + hd);
    if (rotate) {
        const float pos = (float)a.positions[t];
        const float *freqs = rope_freqs(a, a.positions[t]);
#pragma unroll
        for (int j = 0; j < 8; j++) /* rounded to T: the cache takes the rounded k */
            rope_rotate<T>(lo[j], hi[j], pos, freqs[i + j], a.attn_factor);
    }
    if (is_q) {
        T *o = (T *)a.r.q_out + ((size_t)t * nh + h) * D;
        store8(o + i, lo);
        store8(o + i + hd, hi);
        return;
    }
    if (rotate) {
        T *xk = k + (size_t)t * a.r.k_stride + (size_t)h * D;
        store8(xk + i, lo);
        store8(xk + i + hd, hi);
    }
    if (kdst) {
        kv_store8(kdst + (size_t)h * D + i, lo, a.k_inv);
        kv_store8(kdst + (size_t)h * D + i + hd, hi, a.k_inv);
    }
}

/* One entry for the three launchers: rope (l == NULL), kv_write (rope == NULL), both; qk_norm
 * (NULL: none) only with both. */
static void launch_rope_kv(const RopeRows *r, DType act, const int32_t *positions,
                           const int64_t *slot_mapping, int n, int nh, int nkv, const Rope *rope,
                           const QkNorm *qk_norm, void *kv_cache, const KvLayout *l, int layer,
                           void *stream, const char *what) {
    int D = rope ? rope->head_dim : l->head_dim;
    KC_REQUIRE(D > 0 && D % 2 == 0 && D / 2 <= ROPE_MAX_HALF, "%s: head_dim %d unsupported", what,
               D);
    RopeKv a = {*r, positions, rope ? rope->inv_freq : NULL, nh, nkv, D, kv_cache, slot_mapping, 1};
    a.rh = rope && rope->rot_dim > 0 ? rope->rot_dim / 2 : D / 2;
    KC_REQUIRE(a.rh > 0 && a.rh <= D / 2, "%s: rot_dim %d of head_dim %d", what, 2 * a.rh, D);
    a.attn_factor = rope && rope->attn_factor > 0 ? rope->attn_factor : 1.0f;
    a.long_inv_freq = rope ? rope->long_inv_freq : NULL;
    a.long_from = rope ? rope->long_from : 0;
    if (qk_norm) {
        const Tensor *qn = &qk_norm->q, *kn = &qk_norm->k;
        KC_REQUIRE(qn->ndim == 1 && qn->shape[0] == D && kn->ndim == 1 && kn->shape[0] == D &&
                       qn->dtype == kn->dtype && qn->data && kn->data,
                   "%s: q and k norm weights must be [%d] of one dtype", what, D);
        a.q_norm = qn->data;
        a.k_norm = kn->data;
        a.norm_dt = (int)qn->dtype;
        a.norm_eps = qk_norm->eps;
    }
    DType cdt = DT_F32;
    if (l) {
        KC_REQUIRE(l->head_dim == D && l->num_kv_heads == nkv,
                   "%s: cache layout (%d kv heads of %d) does not match (%d of %d)", what,
                   l->num_kv_heads, l->head_dim, nkv, D);
        KC_REQUIRE(layer >= 0 && layer < l->num_layers, "%s: layer %d of %d", what, layer,
                   l->num_layers);
        rope_cache_geometry(&a, l, layer);
        cdt = l->dtype;
    }
    if (n <= 0)
        return;
    const size_t es = pl_dtype_size(act), ces = pl_dtype_size(cdt);
    /* the vector form has no per-head reduction: with a qk norm, the warp-per-head form */
    const bool vec = !qk_norm && 2 * a.rh == D && D % 16 == 0 && kc_aligned16(r->q) &&
                     kc_aligned16(r->q_out) && kc_aligned16(r->k) && kc_aligned16(r->v) &&
                     kc_aligned16(kv_cache) && (r->q_stride * es) % 16 == 0 &&
                     (r->k_stride * es) % 16 == 0 && (r->v_stride * es) % 16 == 0 &&
                     (size_t)D * nkv * ces % 16 == 0;
    if (vec) {
        const int units = (nh + nkv) * (D / 16) + nkv * (D / 8);
        dim3 grid((unsigned)n, (unsigned)((units + ROPE_VEC_THREADS - 1) / ROPE_VEC_THREADS));
        KC_DISPATCH_ACT(
            act, what, T,
            KC_DISPATCH_KV(cdt, what, TC,
                           kc_launch_pdl(rope_kv_vec_kernel<T, TC>, grid, dim3(ROPE_VEC_THREADS), 0,
                                         kc_stream(stream), a)));
        return;
    }
    int threads = ((D / 2 + 31) / 32) * 32;
    threads = threads > ROPE_MAX_THREADS ? ROPE_MAX_THREADS : threads;
    if (qk_norm)
        threads = 32; /* one warp per head: head_inv_rms reduces over the warp */
    const int heads = nh + 2 * nkv;
    const int per_block = (size_t)n * heads >= ROPE_MANY_BLOCKS ? ROPE_BLOCK_THREADS / threads : 1;
    dim3 grid((unsigned)n, (unsigned)((heads + per_block - 1) / per_block));
    KC_DISPATCH_ACT(
        act, what, T,
        KC_DISPATCH_KV(cdt, what, TC,
                       kc_launch_pdl(rope_kv_kernel<T, TC>, grid, dim3(threads, per_block), 0,
                                     kc_stream(stream), a)));
}

void k_cuda_rope(void *q, void *k, DType act, const int32_t *positions, int n, int nh, int nkv,
                 const Rope *rope, void *stream) {
    int D = rope->head_dim;
    RopeRows r = {q, q, (size_t)nh * D, k, (size_t)nkv * D, NULL, 0};
    launch_rope_kv(&r, act, positions, NULL, n, nh, nkv, rope, NULL, NULL, NULL, 0, stream,
                   "k_cuda_rope");
}

void k_cuda_kv_write(void *kv_cache, const KvLayout *l, int layer, const void *k, const void *v,
                     DType act, const int64_t *slot_mapping, int n, void *stream) {
    size_t kvd = (size_t)l->num_kv_heads * l->head_dim;
    RopeRows r = {NULL, NULL, 0, (void *)k, kvd, v, kvd};
    launch_rope_kv(&r, act, NULL, slot_mapping, n, 0, l->num_kv_heads, NULL, NULL, kv_cache, l,
                   layer, stream, "k_cuda_kv_write");
}

void k_cuda_qkv_rope_cache(void *q_out, void *qkv, DType act, const int32_t *positions,
                           const int64_t *slot_mapping, int n, int nh, const Rope *rope,
                           const QkNorm *qk_norm, void *kv_cache, const KvLayout *l, int layer,
                           void *stream) {
    size_t D = (size_t)l->head_dim, qd = nh * D, kvd = l->num_kv_heads * D, row = qd + 2 * kvd;
    size_t es = pl_dtype_size(act);
    char *base = (char *)qkv;
    RopeRows r = {qkv, q_out, row, base + qd * es, row, base + (qd + kvd) * es, row};
    launch_rope_kv(&r, act, positions, slot_mapping, n, nh, l->num_kv_heads, rope, qk_norm,
                   kv_cache, l, layer, stream, "k_cuda_qkv_rope_cache");
}
