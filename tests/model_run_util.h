/* model_run_util.h - (test-only) one sequence through model_forward on a host-memory backend:
 * a model loaded from a folder (or dummy weights), its KV cache in blocks 0..RUN_BLOCKS-1 taken
 * in reverse order (so cache slots are not positions), and a forward of tokens at given
 * positions returning the logits of chosen rows. Included after cmocka.h, kernels.h and
 * model.h. */
#ifndef PAGELLM_TESTS_MODEL_RUN_UTIL_H
#define PAGELLM_TESTS_MODEL_RUN_UTIL_H

enum { RUN_BLOCK = 16, RUN_BLOCKS = 8, RUN_MAX_TOKENS = 64 };

typedef struct {
    Model *m;
    KvLayout layout;
    float *cache;
    int32_t table[RUN_BLOCKS];
    int vocab;
} Run;

/* quantization: NULL or "fp8" (ModelLoadOptions.quantization). */
static inline void run_open(Run *r, const KernelOps *ops, const char *dir, int dummy,
                            const char *quantization) {
    ModelLoadOptions opt = {.dir = dir,
                            .load_dummy = dummy,
                            .seed = 5,
                            .max_num_tokens = RUN_MAX_TOKENS,
                            .ops = ops,
                            .quantization = quantization};
    if (model_load(&opt, &r->m) != PL_OK)
        fail_msg("model_load(%s): %s", dir, pl_error());
    r->layout = model_kv_layout(r->m, RUN_BLOCK);
    r->cache = calloc(k_kv_block_elems(&r->layout) * RUN_BLOCKS, sizeof(float));
    for (int b = 0; b < RUN_BLOCKS; b++)
        r->table[b] = RUN_BLOCKS - 1 - b;
    r->vocab = model_config(r->m)->vocab_size;
}

static inline void run_close(Run *r) {
    model_destroy(r->m);
    free(r->cache);
}

/* Tokens ids[n] at positions first..first+n-1; the logits of rows[0..nrows) (indices into
 * the n tokens) into logits[nrows, vocab]. */
static inline void run_forward(Run *r, const int32_t *ids, int n, int first, const int32_t *rows,
                               int nrows, float *logits) {
    int32_t pos[RUN_MAX_TOKENS], qs[2] = {0, n};
    int64_t slots[RUN_MAX_TOKENS];
    assert_true(n <= RUN_MAX_TOKENS && first + n <= RUN_BLOCKS * RUN_BLOCK);
    for (int i = 0; i < n; i++) {
        int p = first + i;
        pos[i] = p;
        slots[i] = (int64_t)r->table[p / RUN_BLOCK] * RUN_BLOCK + p % RUN_BLOCK;
    }
    AttnBatch b = {.num_tokens = n,
                   .positions = pos,
                   .slot_mapping = slots,
                   .num_seqs = 1,
                   .query_start = qs,
                   .block_tables = r->table,
                   .max_blocks_per_seq = RUN_BLOCKS,
                   .num_decode_seqs = n == 1 && first > 0};
    model_forward(r->m, ids, &b, r->cache, &r->layout, rows, nrows, logits);
}

#endif
