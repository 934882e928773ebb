/* gemv_fused.cu - a decode-sized projection and the element-wise op after it in one kernel:
 * the qkv projection with RoPE and the KV-cache store, the gate-up projection with SiLU times
 * up. Each warp's two weight rows are the two operands of the op (a rotated pair (i, i + D/2)
 * of a q or k head; gate row j and up row j), so the epilogue of gemv.cuh's kernel finishes
 * the job with no second launch and without writing the projection out.
 *
 * Results are bit-identical to k_cuda_matmul followed by k_cuda_qkv_rope_cache /
 * k_cuda_silu_mul: the dot products are the GEMV's (gemv.cuh, or for fp8 qkv weights at one
 * row gemv_fp8.cuh's), rounded to the activation dtype as the projection's output would be,
 * then the same rope_rotate / silu_times, and an fp8 cache's elements encoded as rope.cu
 * encodes them. Where k_cuda_matmul would not take the GEMV (more rows, other dtypes, unaligned
 * operands, a forced path), the two ops run as before, except that the gate-up projection first
 * asks gemm_sm90a.cu's wgmma GEMM, which takes the call where it is the measured or forced
 * path. The qkv op may also be handed the block boundary before it (AddNormIn): the residual add
 * and RMSNorm run first, and for fp8 weights at one row the norm writes x quantized for
 * gemv_fp8.cuh's GEMV (kc_fp8_row_dst) instead of in 16 bits. */
#include <type_traits>

#include "gemv.cuh"
#include "gemv_fp8.cuh"
#include "rope.cuh"

/* Rows of x a fused launch takes (the GEMV's range for 16-bit activations), and chunks in
 * flight per lane and row. A task's two rows are mostly D/2 (qkv) or N/2 (gate-up) rows apart,
 * and at 2 chunks per row, as the plain GEMV takes two adjacent rows, they streamed slower.
 * Measured on the H200, batch-1 decode step (bench latency, 128 in, 256 out, two runs each) of the
 * Llama-3-8B shape / of one TP=2 rank's shapes alone (16 heads, 4 KV heads, intermediate 7168,
 * vocabulary 64128), ms: two calls 4.072 / 2.351; fused at 2 chunks 4.104 / 2.319; qkv at 4,
 * gate-up at 2 4.100 / 2.292; both at 4 4.064 / 2.259; qkv at 8, gate-up at 4 4.088 / 2.268;
 * gate-up alone fused, at 2, 4.134 / 2.331. */
enum { GEMV_FUSED_MAX_N = 2, GEMV_FUSED_U = 4 };

/* Task t < pairs reads rows (h D + i, h D + i + D/2) of q or k head h (i = t % (D/2); k heads
 * follow the q heads), rotates them and writes q_out or the cache (elements TC: the activation
 * dtype, or kv8 for an fp8 cache, encoded as rope.cu encodes them); task pairs + v reads the
 * adjacent rows 2v and 2v + 1 of the v part and caches them. Lane i handles row i of x. */
template <typename XT, typename TC> struct GemvQkvRope {
    RopeKv a;
    const void *bias;
    int bias_dt, pairs;
    template <int R> __device__ int row(int t, int r) const {
        const int hd = a.D / 2;
        return t < pairs ? (t / hd) * a.D + t % hd + r * hd
                         : (a.nh + a.nkv) * a.D + 2 * (t - pairs) + r;
    }
    template <int NX, int R>
    __device__ void store(const float (&acc)[R][NX], int t, int lane) const {
        static_assert(R == 2, "a pair of rows per task");
        const int hd = a.D / 2;
#pragma unroll
        for (int i = 0; i < NX; i++) {
            if (lane != i)
                continue;
            float x1 = acc[0][i], x2 = acc[1][i];
            if (bias) {
                x1 += load_any(bias, bias_dt, row<R>(t, 0));
                x2 += load_any(bias, bias_dt, row<R>(t, 1));
            }
            x1 = to_f32(from_f32<XT>(x1)); /* what the projection would have stored */
            x2 = to_f32(from_f32<XT>(x2));
            TC *kdst = cache_row<TC>(a, i);
            if (t >= pairs) {
                if (kdst) {
                    TC *v = kdst + a.half + 2 * (size_t)(t - pairs);
                    v[0] = kv_enc<TC>(x1, a.v_inv);
                    v[1] = kv_enc<TC>(x2, a.v_inv);
                }
                continue;
            }
            const int h = t / hd, d = t % hd;
            if (a.inv_freq)
                rope_rotate<XT>(x1, x2, (float)a.positions[i], a.inv_freq[d]);
            if (h < a.nh) {
                XT *q = (XT *)a.r.q_out + ((size_t)i * a.nh + h) * a.D;
                q[d] = from_f32<XT>(x1);
                q[d + hd] = from_f32<XT>(x2);
            } else if (kdst) {
                TC *k = kdst + (size_t)(h - a.nh) * a.D;
                k[d] = kv_enc<TC>(x1, a.k_inv);
                k[d + hd] = kv_enc<TC>(x2, a.k_inv);
            }
        }
    }
};

/* Task j reads gate row j and up row dim + j; lane i writes out[i, j] = silu(g) * u. */
template <typename XT> struct GemvSiluMul {
    XT *out;
    int dim;
    template <int R> __device__ int row(int t, int r) const {
        return t + r * dim;
    }
    template <int NX, int R>
    __device__ void store(const float (&acc)[R][NX], int t, int lane) const {
        static_assert(R == 2, "a gate row and an up row per task");
#pragma unroll
        for (int i = 0; i < NX; i++)
            if (lane == i) {
                const float g = to_f32(from_f32<XT>(acc[0][i])),
                            u = to_f32(from_f32<XT>(acc[1][i]));
                out[(size_t)i * dim + t] = from_f32<XT>(silu_times(g, u));
            }
    }
};

/* Whether the fused kernel takes this call: k_cuda_matmul's GEMV would, for a dtype pair of
 * the GEMV (act = weight dtype, or fp32 activations on 16-bit weights). Not for fp8 weights
 * (kc_fp8_row_gemv_takes). */
static bool fused_takes(KCudaGemm *g, DType act, const Tensor *w, const void *x, int n) {
    return n >= 1 && n <= GEMV_FUSED_MAX_N && w->dtype != DT_F8E4M3 &&
           (act == w->dtype || act == DT_F32) && kc_gemv_takes(g, act, w, x, n);
}

void k_cuda_matmul_qkv_rope_cache(KCudaGemm *g, void *q_out, void *qkv, void *x,
                                  const AddNormIn *pre, DType act, const Tensor *w,
                                  const Tensor *bias, const int32_t *positions,
                                  const int64_t *slot_mapping, int n, int nh, const Rope *rope,
                                  const QkNorm *qk_norm, void *kv_cache, const KvLayout *l,
                                  int layer, void *stream) {
    const Tensor *b = bias && bias->data ? bias : NULL;
    const int D = l->head_dim, nkv = l->num_kv_heads;
    /* anything the two calls would reject goes to them, for their error message; a per-head
     * norm needs the whole head's sum of squares, which a task's pair of rows does not have:
     * the projection, then the norm in the rotation's launch (also partial rotation, LongRoPE's
     * two tables and a cos / sin factor, which the rotation's launch takes) */
    const bool fits =
        !qk_norm && g && w && w->ndim == 2 && w->shape[1] > 0 && nh > 0 && nkv > 0 && D > 0 &&
        D % 2 == 0 && D / 2 <= ROPE_MAX_HALF && w->shape[0] == (int64_t)(nh + 2 * nkv) * D &&
        rope && rope->inv_freq && rope->head_dim == D &&
        (rope->rot_dim == 0 || rope->rot_dim == D) && !rope->long_inv_freq &&
        (rope->attn_factor == 0 || rope->attn_factor == 1) &&
        (l->dtype == act || l->dtype == DT_F8E4M3) && layer >= 0 && layer < l->num_layers &&
        (!b || (b->ndim == 1 && b->shape[0] == w->shape[0] && gemv_bias_dtype_ok(b->dtype)));
    /* fp8 weights fuse where k_cuda_matmul runs them on gemv_fp8.cuh's GEMV: the epilogue then
     * gets the same scaled sums GemvStore rounds */
    const bool fp8 = fits && kc_fp8_row_gemv_takes(g, act, w, x, n);
    const cudaStream_t s = kc_stream(stream);
    /* the block boundary first; for the fp8 GEMV its norm quantizes the row straight for it */
    const int K = w && w->ndim == 2 ? (int)w->shape[1] : 0;
    KcF8Dst d;
    const bool quant = pre && fp8 &&
                       kc_add_rmsnorm_f8_ok(pre->residual, pre->delta, x, act, pre->norm, K) &&
                       kc_fp8_row_dst(g, w, &d, s);
    if (quant)
        kc_add_rmsnorm_f8(pre->residual, pre->delta, x, act, pre->norm, n, K, pre->eps, &d, s);
    else if (pre)
        k_cuda_add_rmsnorm(pre->residual, pre->delta, x, act, pre->norm, n, K, pre->eps, stream);
    if (!fits || !(fp8 || fused_takes(g, act, w, x, n))) {
        k_cuda_matmul(g, qkv, x, act, w, bias, n, stream);
        k_cuda_qkv_rope_cache(q_out, qkv, act, positions, slot_mapping, n, nh, rope, qk_norm,
                              kv_cache, l, layer, stream);
        return;
    }
    RopeKv a = {};
    a.r.q_out = q_out;
    a.positions = positions;
    a.inv_freq = rope->inv_freq;
    a.nh = nh;
    a.nkv = nkv;
    a.D = D;
    a.cache = kv_cache;
    a.slot_mapping = slot_mapping;
    rope_cache_geometry(&a, l, layer);
    const int pairs = (nh + nkv) * (D / 2), tasks = pairs + nkv * (D / 2);
    /* run(epi) with the epilogue of activations XT into the cache (XT, or kv8 for fp8) */
    auto with_epi = [&](auto *xt, auto run) {
        using XT = std::remove_pointer_t<decltype(xt)>;
        auto make = [&](auto *tc) {
            run(GemvQkvRope<XT, std::remove_pointer_t<decltype(tc)>>{a, b ? b->data : NULL,
                                                                     b ? (int)b->dtype : 0, pairs});
        };
        if (l->dtype == DT_F8E4M3)
            make((kv8 *)NULL);
        else
            make((XT *)NULL);
    };
    if (fp8) {
        KC_DISPATCH_ACT(act, "k_cuda_matmul_qkv_rope_cache", XT,
                        with_epi((XT *)NULL, [&](const auto &epi) {
                            if (quant)
                                gemv_fp8_run(tasks, epi, (const uint8_t *)d.q, w, s, d.xs);
                            else
                                gemv_fp8_run(tasks, epi, (const XT *)x, w, s);
                        }));
        return;
    }
    gemv_dtypes(act, w->dtype, [&](auto *xt, auto *wt) {
        with_epi(xt, [&](const auto &epi) {
            gemv_run<2, GEMV_FUSED_U, GEMV_FUSED_MAX_N>(n, tasks, epi, (decltype(xt))x,
                                                        (decltype(wt))w->data, K, s);
        });
    });
}

void k_cuda_matmul_silu_mul(KCudaGemm *g, void *out, void *gate_up, const void *x, DType act,
                            const Tensor *w, int n, void *stream) {
    const int dim = w && w->ndim == 2 ? (int)(w->shape[0] / 2) : 0;
    if (!g || dim <= 0 || w->shape[0] % 2 != 0 || w->shape[1] <= 0 ||
        !fused_takes(g, act, w, x, n)) {
        if (g && dim > 0 && kc_wgmma_silu_mul_try(g, out, gate_up, x, act, w, n, kc_stream(stream)))
            return;
        k_cuda_matmul(g, gate_up, x, act, w, NULL, n, stream);
        k_cuda_silu_mul(out, gate_up, act, n, dim, stream);
        return;
    }
    gemv_dtypes(act, w->dtype, [&](auto *xt, auto *wt) {
        const GemvSiluMul<std::remove_pointer_t<decltype(xt)>> epi = {(decltype(xt))out, dim};
        gemv_run<2, GEMV_FUSED_U, GEMV_FUSED_MAX_N>(n, dim, epi, (decltype(xt))x,
                                                    (decltype(wt))w->data, (int)w->shape[1],
                                                    kc_stream(stream));
    });
}
