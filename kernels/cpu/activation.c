/* activation.c - the gated MLP activations on the fused gate-up projection's rows [n, 2 dim]:
 * out = silu(gate) * up, silu(g) = g / (1 + e^-g) (torch's formula), or gelu_tanh(gate) * up
 * (Gemma's GeGLU, torch's tanh approximation); and the element-wise scale and soft-capping
 * (Gemma's embedding scale and final logit soft-capping). */
#include <math.h>

#include "cpu_internal.h"

void cpu_silu_mul(const KernelOps *ops, void *out_, const void *gate_up, int n, int dim) {
    float *out = out_;
    for (int r = 0; r < n; r++) {
        const float *gate = (const float *)gate_up + (size_t)r * 2 * dim, *up = gate + dim;
        float *o = out + (size_t)r * dim;
        for (int i = 0; i < dim; i++) {
            float g = gate[i];
            o[i] = g / (1.0f + expf(-g)) * up[i];
        }
    }
}

/* torch's gelu(approximate="tanh") in float: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
static inline float gelu_tanh(float x) {
    const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
    float inner = k * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(inner));
}

void cpu_gelu_tanh_mul(const KernelOps *ops, void *out_, const void *gate_up, int n, int dim) {
    float *out = out_;
    for (int r = 0; r < n; r++) {
        const float *gate = (const float *)gate_up + (size_t)r * 2 * dim, *up = gate + dim;
        float *o = out + (size_t)r * dim;
        for (int i = 0; i < dim; i++)
            o[i] = gelu_tanh(gate[i]) * up[i];
    }
}

void cpu_scale(const KernelOps *ops, void *x_, size_t n, float s) {
    float *x = x_;
    for (size_t i = 0; i < n; i++)
        x[i] *= s;
}

void cpu_logits_softcap(const KernelOps *ops, float *logits, size_t n, float cap) {
    for (size_t i = 0; i < n; i++)
        logits[i] = tanhf(logits[i] / cap) * cap;
}
