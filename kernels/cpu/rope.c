/* rope.c - rotary position embedding, Hugging Face "rotate half" form, in place.
 *
 * For each head and i < D/2: x1 = x[i], x2 = x[i + D/2], angle = (float)pos * inv_freq[i]
 * (a float product, as torch computes it), out[i] = x1 cos - x2 sin,
 * out[i + D/2] = x2 cos + x1 sin. cos/sin are computed once per token for all heads. */
#include <math.h>

#include "cpu_internal.h"

enum { ROPE_MAX_HALF = 512 };

static void rotate(float *x, int heads, int D, const float *c, const float *s) {
    int half = D / 2;
    for (int h = 0; h < heads; h++) {
        float *v = x + (size_t)h * D;
        for (int i = 0; i < half; i++) {
            float x1 = v[i], x2 = v[i + half];
            v[i] = x1 * c[i] - x2 * s[i];
            v[i + half] = x2 * c[i] + x1 * s[i];
        }
    }
}

void cpu_rope(float *q, float *k, const int32_t *positions, int n, int nh, int nkv,
              const Rope *rope) {
    int D = rope->head_dim;
    int half = D / 2;
    PL_CHECK(D > 0 && D % 2 == 0 && half <= ROPE_MAX_HALF);
    float c[ROPE_MAX_HALF], s[ROPE_MAX_HALF];
    for (int t = 0; t < n; t++) {
        float pos = (float)positions[t];
        for (int i = 0; i < half; i++) {
            float angle = pos * rope->inv_freq[i];
            c[i] = cosf(angle);
            s[i] = sinf(angle);
        }
        if (q)
            rotate(q + (size_t)t * nh * D, nh, D, c, s);
        if (k)
            rotate(k + (size_t)t * nkv * D, nkv, D, c, s);
    }
}
