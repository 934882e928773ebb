/* activation.c - the gated MLP activation: out = silu(gate) * up, silu(g) = g / (1 + e^-g)
 * (torch's formula). */
#include <math.h>

#include "cpu_internal.h"

void cpu_silu_mul(float *out, const float *gate, const float *up, int n, int dim) {
    size_t total = (size_t)n * (size_t)dim;
    for (size_t i = 0; i < total; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}
