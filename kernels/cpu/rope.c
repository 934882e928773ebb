/* rope.c - rotary position embedding, Hugging Face "rotate half" form, in place.
 *
 * For each head and i < R/2 (R = rot_dim, the rotated part; D without partial rotation):
 * x1 = x[i], x2 = x[i + R/2], angle = (float)pos * inv_freq[i] (a float product, as torch
 * computes it), c = cos(angle) f, s = sin(angle) f (f the attention factor of YaRN / LongRoPE,
 * as transformers scales cos and sin), out[i] = x1 c - x2 s, out[i + R/2] = x2 c + x1 s;
 * elements R.. D pass unchanged. cos/sin are computed once per token for all heads, from the
 * long frequencies at positions >= long_from when the Rope has them (LongRoPE).
 * qkv_rope_cache is the same rotation on the fused QKV projection's rows, with q copied out
 * and the rotated k and v stored in the paged cache (kv_write, attention.c), after an optional
 * per-head RMSNorm of q and k (Qwen3). */
#include <math.h>
#include <string.h>

#include "cpu_internal.h"

enum { ROPE_MAX_HALF = 512 };

static void rotate(float *x, int heads, int D, int half, const float *c, const float *s) {
    for (int h = 0; h < heads; h++) {
        float *v = x + (size_t)h * D;
        for (int i = 0; i < half; i++) {
            float x1 = v[i], x2 = v[i + half];
            v[i] = x1 * c[i] - x2 * s[i];
            v[i + half] = x2 * c[i] + x1 * s[i];
        }
    }
}

/* cos and sin of every frequency at `pos` (as torch: a float product, then cosf/sinf), times
 * the attention factor. */
static void angles(float *c, float *s, int half, int32_t pos, const Rope *rope) {
    const float *inv =
        rope->long_inv_freq && pos >= rope->long_from ? rope->long_inv_freq : rope->inv_freq;
    const float f = rope->attn_factor > 0 ? rope->attn_factor : 1.0f;
    for (int i = 0; i < half; i++) {
        float angle = (float)pos * inv[i];
        c[i] = cosf(angle);
        s[i] = sinf(angle);
        if (f != 1.0f) {
            c[i] *= f;
            s[i] *= f;
        }
    }
}

/* Half the rotated part of each head. */
static int rope_half(const Rope *rope) {
    int rot = rope->rot_dim > 0 ? rope->rot_dim : rope->head_dim;
    PL_CHECK(rot > 0 && rot % 2 == 0 && rot <= rope->head_dim && rot / 2 <= ROPE_MAX_HALF);
    return rot / 2;
}

void cpu_rope(const KernelOps *ops, void *q_, void *k_, const int32_t *positions, int n, int nh,
              int nkv, const Rope *rope) {
    float *q = q_, *k = k_;
    int D = rope->head_dim;
    int half = rope_half(rope);
    float c[ROPE_MAX_HALF], s[ROPE_MAX_HALF];
    for (int t = 0; t < n; t++) {
        angles(c, s, half, positions[t], rope);
        if (q)
            rotate(q + (size_t)t * nh * D, nh, D, half, c, s);
        if (k)
            rotate(k + (size_t)t * nkv * D, nkv, D, half, c, s);
    }
}

void cpu_qkv_rope_cache(const KernelOps *ops, void *q_out, void *qkv, const int32_t *positions,
                        const int64_t *slot_mapping, int n, int nh, const Rope *rope,
                        const QkNorm *qk_norm, void *kv_cache, const KvLayout *l, int layer) {
    int D = rope->head_dim, nkv = l->num_kv_heads, half = rope_half(rope);
    PL_CHECK(D == l->head_dim);
    size_t qd = (size_t)nh * D, kvd = (size_t)nkv * D, row = qd + 2 * kvd;
    float c[ROPE_MAX_HALF], s[ROPE_MAX_HALF];
    for (int t = 0; t < n; t++) {
        float *x = (float *)qkv + (size_t)t * row, *q = (float *)q_out + (size_t)t * qd;
        memcpy(q, x, qd * sizeof(float));
        if (qk_norm) { /* each head a row of D: Qwen3's q_norm and k_norm, before RoPE */
            cpu_rmsnorm(ops, q, q, &qk_norm->q, nh, D, qk_norm->eps);
            cpu_rmsnorm(ops, x + qd, x + qd, &qk_norm->k, nkv, D, qk_norm->eps);
        }
        angles(c, s, half, positions[t], rope);
        rotate(q, nh, D, half, c, s);
        rotate(x + qd, nkv, D, half, c, s);
        cpu_kv_write(ops, kv_cache, l, layer, x + qd, x + qd + kvd, slot_mapping + t, 1);
    }
}
