/* graphs.c - decode steps replayed from graphs, and the start-up warm-up.
 *
 * A pure-decode step (every scheduled sequence brings one token and samples) is padded to
 * the next captured batch size: 1, 2, 4, 8, then multiples of 16 up to max-num-seqs. Padding
 * rows read token 0 at position 0 through block 0 and write no KV slot (slot -1), so they
 * cost compute but change nothing; their logits are ignored. Every graph records one
 * model_forward over the engine's fixed step buffers and KV pool, so replaying it after the
 * step's metadata has been copied into those buffers is that step's forward pass.
 *
 * The warm-up runs the largest decode batch and the largest prefill chunk eagerly before the
 * KV pool is sized, so lazily grown backend state (GEMM plans, attention workspace) has its
 * working size when the free memory is measured and before anything is captured. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"

/* The captured batch sizes for max_num_seqs, ascending; returns how many. */
static int graph_sizes(int max_num_seqs, int *sizes) {
    int n = 0;
    for (int s = 1; s < 16 && s < max_num_seqs; s *= 2)
        sizes[n++] = s;
    for (int s = 16; s < max_num_seqs; s += 16)
        sizes[n++] = s;
    sizes[n++] = max_num_seqs;
    return n;
}

int eng_graph_for(const Engine *e, int num_seqs) {
    for (int g = 0; g < e->num_graphs; g++)
        if (e->graph_size[g] >= num_seqs)
            return g;
    return -1;
}

void eng_pad_decode_rows(Engine *e, int from, int to) {
    BatchBuffers *h = &e->h;
    for (int i = from; i < to; i++) {
        h->tokens[i] = 0;
        h->positions[i] = 0;
        h->slots[i] = -1;
        h->query_start[i] = i;
        h->block_tables[(size_t)i * e->max_blocks_per_seq] = 0;
        h->logit_rows[i] = i;
    }
    h->query_start[to] = to;
}

void eng_upload_batch(Engine *e, int num_tokens, int num_seqs, int num_rows) {
    if (e->h.tokens == e->d.tokens)
        return;
    const KernelOps *ops = e->ops;
    ops->to_device(e->d.tokens, e->h.tokens, (size_t)num_tokens * sizeof(int32_t));
    ops->to_device(e->d.positions, e->h.positions, (size_t)num_tokens * sizeof(int32_t));
    ops->to_device(e->d.slots, e->h.slots, (size_t)num_tokens * sizeof(int64_t));
    ops->to_device(e->d.query_start, e->h.query_start, (size_t)(num_seqs + 1) * sizeof(int32_t));
    ops->to_device(e->d.block_tables, e->h.block_tables,
                   (size_t)num_seqs * e->max_blocks_per_seq * sizeof(int32_t));
    ops->to_device(e->d.logit_rows, e->h.logit_rows, (size_t)num_rows * sizeof(int32_t));
}

static AttnBatch device_batch(const Engine *e, int num_tokens, int num_seqs) {
    return (AttnBatch){.num_tokens = num_tokens,
                       .positions = e->d.positions,
                       .slot_mapping = e->d.slots,
                       .num_seqs = num_seqs,
                       .query_start = e->d.query_start,
                       .block_tables = e->d.block_tables,
                       .max_blocks_per_seq = e->max_blocks_per_seq};
}

/* An all-padding decode batch of `rows` rows through the model (eagerly, or recorded). */
static void forward_padding(Engine *e, void *kv_pool, int rows) {
    eng_pad_decode_rows(e, 0, rows);
    eng_upload_batch(e, rows, rows, rows);
    AttnBatch b = device_batch(e, rows, rows);
    model_forward(e->model, e->d.tokens, &b, kv_pool, &e->kv_layout, e->d.logit_rows, rows,
                  e->d.logits);
}

void eng_warm_up(Engine *e, void *kv_block) {
    if (!e->ops->graph_begin) /* a backend without graphs has no lazy device state either */
        return;
    int rows = e->cfg.max_num_seqs < e->cfg.max_num_batched_tokens ? e->cfg.max_num_seqs
                                                                   : e->cfg.max_num_batched_tokens;
    forward_padding(e, kv_block, rows);
    /* one prompt chunk of the largest size, every position reading block 0, writing nothing */
    int t = e->cfg.max_num_batched_tokens < e->max_model_len ? e->cfg.max_num_batched_tokens
                                                             : e->max_model_len;
    BatchBuffers *h = &e->h;
    for (int i = 0; i < t; i++) {
        h->tokens[i] = 0;
        h->positions[i] = i;
        h->slots[i] = -1;
    }
    memset(h->block_tables, 0, (size_t)e->max_blocks_per_seq * sizeof(int32_t));
    h->query_start[0] = 0;
    h->query_start[1] = t;
    h->logit_rows[0] = t - 1;
    eng_upload_batch(e, t, 1, 1);
    AttnBatch b = device_batch(e, t, 1);
    model_forward(e->model, e->d.tokens, &b, kv_block, &e->kv_layout, e->d.logit_rows, 1,
                  e->d.logits);
    e->ops->synchronize();
}

void eng_capture_graphs(Engine *e) {
    const KernelOps *ops = e->ops;
    if (!ops->graph_begin || e->cfg.enforce_eager)
        return;
    double t0 = pl_now();
    int limit = e->cfg.max_num_seqs < e->cfg.max_num_batched_tokens ? e->cfg.max_num_seqs
                                                                    : e->cfg.max_num_batched_tokens;
    e->graph_size = pl_xmalloc((size_t)(limit + 8) * sizeof(int));
    int n = graph_sizes(limit, e->graph_size);
    e->graphs = pl_xcalloc((size_t)n, sizeof(void *));
    for (int g = n - 1; g >= 0; g--) { /* largest first: no state grows afterwards */
        int rows = e->graph_size[g];
        forward_padding(e, e->kv_gpu, rows); /* eager once (its batch stays), then recorded */
        ops->synchronize();
        AttnBatch b = device_batch(e, rows, rows);
        ops->graph_begin();
        model_forward(e->model, e->d.tokens, &b, e->kv_gpu, &e->kv_layout, e->d.logit_rows, rows,
                      e->d.logits);
        e->graphs[g] = ops->graph_end();
    }
    e->num_graphs = n;
    e->graph_seconds = pl_now() - t0;
}

void eng_destroy_graphs(Engine *e) {
    for (int g = 0; g < e->num_graphs; g++)
        e->ops->graph_destroy(e->graphs[g]);
    free(e->graphs);
    free(e->graph_size);
    e->graphs = NULL;
    e->graph_size = NULL;
    e->num_graphs = 0;
}
