/* activation.c - the gated MLP activation on the fused gate-up projection's rows [n, 2 dim]:
 * out = silu(gate) * up, silu(g) = g / (1 + e^-g) (torch's formula). */
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
