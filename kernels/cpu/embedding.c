/* embedding.c - token embedding lookup: rows of a F32/F16/BF16 table copied out as fp32
 * (whole, or one tensor-parallel rank's vocabulary slice). */
#include "cpu_internal.h"

void cpu_embedding(const KernelOps *ops, void *out_, const int32_t *ids, int n,
                   const Tensor *table) {
    float *out = out_;
    PL_CHECK(table->ndim == 2);
    int64_t vocab = table->shape[0];
    size_t hidden = (size_t)table->shape[1];
    for (int i = 0; i < n; i++) {
        PL_CHECK(ids[i] >= 0 && ids[i] < vocab);
        cpu_to_f32(out + (size_t)i * hidden, table->data, table->dtype, (size_t)ids[i] * hidden,
                   hidden);
    }
}

void cpu_embedding_slice(const KernelOps *ops, void *out_, const int32_t *ids, int n,
                         const Tensor *table, int first) {
    float *out = out_;
    PL_CHECK(table->ndim == 2);
    int64_t rows = table->shape[0];
    size_t hidden = (size_t)table->shape[1];
    for (int i = 0; i < n; i++) {
        int64_t row = (int64_t)ids[i] - first;
        if (row >= 0 && row < rows)
            cpu_to_f32(out + (size_t)i * hidden, table->data, table->dtype, (size_t)row * hidden,
                       hidden);
        else
            memset(out + (size_t)i * hidden, 0, hidden * sizeof(float));
    }
}
