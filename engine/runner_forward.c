/* runner_forward.c - one rank's work: the step batch uploaded, its forward pass (decode steps
 * replayed from graphs), the warm-up forward, graph capture, and its part of prompt logits.
 *
 * A pure-decode step (every scheduled sequence brings one token and samples) is padded to
 * the next captured batch size: 1, 2, 4, 8, then multiples of 16 up to max-num-seqs. Padding
 * rows read token 0 at position 0 through block 0 and write no KV slot (slot -1), so they
 * cost compute but change nothing; their logits are ignored. Every graph records one
 * model_forward over the rank's fixed step buffers and KV pool, so replaying it after the
 * step's metadata has been copied into those buffers is that step's forward pass. With
 * tensor parallelism each rank captures its own graphs, all-reduces included.
 *
 * The warm-up runs the largest decode batch and the largest prefill chunk eagerly before the
 * KV pool is sized, so lazily grown backend state (GEMM plans, attention workspace) has its
 * working size when the free memory is measured and before anything is captured. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"

int eng_graph_for(const Engine *e, int num_seqs) {
    for (int g = 0; g < e->run.num_graphs; g++)
        if (e->run.graph_size[g] >= num_seqs)
            return g;
    return -1;
}

void eng_pad_decode_rows(Engine *e, int from, int to) {
    BatchBuffers *h = &e->run.h;
    for (int i = from; i < to; i++) {
        h->tokens[i] = 0;
        h->positions[i] = 0;
        h->slots[i] = -1;
        h->query_start[i] = i;
        h->block_tables[(size_t)i * e->run.max_blocks_per_seq] = 0;
        h->logit_rows[i] = i;
    }
    h->query_start[to] = to;
}

void eng_upload_batch(Engine *e, Rank *r, int num_tokens, int num_seqs, int num_rows,
                      int table_width) {
    if (e->run.h.tokens == r->d.tokens)
        return;
    const KernelOps *ops = r->ops;
    const BatchBuffers *h = &e->run.h, *d = &r->d;
    ops->to_device(ops, d->tokens, h->tokens, (size_t)num_tokens * sizeof(int32_t));
    ops->to_device(ops, d->positions, h->positions, (size_t)num_tokens * sizeof(int32_t));
    ops->to_device(ops, d->slots, h->slots, (size_t)num_tokens * sizeof(int64_t));
    ops->to_device(ops, d->query_start, h->query_start, (size_t)(num_seqs + 1) * sizeof(int32_t));
    /* at a long max-model-len the full rows are megabytes a step (8 MB at 256 rows of 131072
     * positions in blocks of 16) where a step's contexts use kilobytes */
    ops->to_device_rows(ops, d->block_tables, h->block_tables,
                        (size_t)e->run.max_blocks_per_seq * sizeof(int32_t),
                        (size_t)table_width * sizeof(int32_t), num_seqs);
    ops->to_device(ops, d->logit_rows, h->logit_rows, (size_t)num_rows * sizeof(int32_t));
}

/* The rank's eager forward over its uploaded batch into `kv_pool` (logits on rank 0). */
static void forward(Engine *e, Rank *r, void *kv_pool, int num_tokens, int num_seqs, int num_rows,
                    int num_decode) {
    const BatchBuffers *d = &r->d;
    AttnBatch b = {.num_tokens = num_tokens,
                   .positions = d->positions,
                   .slot_mapping = d->slots,
                   .num_seqs = num_seqs,
                   .query_start = d->query_start,
                   .block_tables = d->block_tables,
                   .max_blocks_per_seq = e->run.max_blocks_per_seq,
                   .num_decode_seqs = num_decode};
    /* every rank: the LM head is vocabulary-parallel (rank 0 samples the gathered logits) */
    model_forward(r->model, d->tokens, &b, kv_pool, &e->kv_layout, d->logit_rows, num_rows,
                  d->logits);
}

void eng_rank_forward(Engine *e, Rank *r, int num_tokens, int num_seqs, int num_rows,
                      int num_decode, int graph) {
    if (graph >= 0)
        r->ops->graph_launch(r->ops, r->graphs[graph]);
    else
        forward(e, r, r->kv_gpu, num_tokens, num_seqs, num_rows, num_decode);
}

void eng_rank_warm_up(Engine *e, Rank *r, const RankJob *j) {
    eng_upload_batch(e, r, j->num_tokens, j->num_seqs, j->num_rows, j->table_width);
    forward(e, r, r->kv_gpu, j->num_tokens, j->num_seqs, j->num_rows, j->num_decode);
    r->ops->synchronize(r->ops); /* the engine rewrites the host batch next */
}

void eng_rank_capture(Engine *e, Rank *r, int g) {
    const KernelOps *ops = r->ops;
    int rows = e->run.graph_size[g];
    if (!r->graphs)
        r->graphs = pl_xcalloc((size_t)e->run.num_graphs, sizeof(void *));
    eng_upload_batch(e, r, rows, rows, rows, 1);      /* padding rows: block 0 */
    forward(e, r, r->kv_gpu, rows, rows, rows, rows); /* eager once, then recorded */
    ops->synchronize(ops);
    ops->graph_begin(ops);
    forward(e, r, r->kv_gpu, rows, rows, rows, rows);
    r->graphs[g] = ops->graph_end(ops);
}

void eng_destroy_graphs(Engine *e, Rank *r) {
    for (int g = 0; r->graphs && g < e->run.num_graphs; g++)
        if (r->graphs[g])
            r->ops->graph_destroy(r->ops, r->graphs[g]);
    free(r->graphs);
    r->graphs = NULL;
}

Status eng_rank_prompt_logits(Engine *e, Rank *r, const int32_t *ids, int n, float *logits) {
    int vocab = model_config(e->model)->vocab_size;
    /* A private cache with an identity block table: no scheduler involvement. */
    const KernelOps *ops = r->ops;
    int bs = e->cfg.block_size, nblocks = (n + bs - 1) / bs;
    int32_t *table = pl_xmalloc((size_t)nblocks * sizeof(int32_t));
    int32_t *pos = pl_xmalloc((size_t)n * sizeof(int32_t));
    int64_t *slots = pl_xmalloc((size_t)n * sizeof(int64_t));
    int32_t query_start[2] = {0, n};
    for (int b = 0; b < nblocks; b++)
        table[b] = b;
    for (int i = 0; i < n; i++) {
        pos[i] = i;
        slots[i] = i;
    }
    /* host arrays, then their backend copies (the same memory on the CPU backend) */
    const void *host[] = {ids, table, pos, slots, query_start};
    size_t bytes[] = {(size_t)n * 4, (size_t)nblocks * 4, (size_t)n * 4, (size_t)n * 8, 8};
    void *dev[5] = {0};
    void *kv = ops->alloc(ops, (size_t)nblocks * e->block_bytes);
    /* every rank computes the logits (the LM head is vocabulary-parallel); rank 0 copies them */
    float *dev_logits = ops->alloc(ops, (size_t)n * vocab * sizeof(float));
    int ok = kv && dev_logits;
    for (int i = 0; i < 5 && ok; i++)
        if ((ok = (dev[i] = ops->alloc(ops, bytes[i])) != NULL))
            ops->to_device(ops, dev[i], host[i], bytes[i]);
    if (!ok) {
        for (int i = 0; i < 5; i++)
            if (dev[i])
                ops->free(ops, dev[i]);
        if (kv)
            ops->free(ops, kv);
        if (dev_logits)
            ops->free(ops, dev_logits);
        free(table);
        free(pos);
        free(slots);
        return pl_error_set(PL_ERR_NOMEM, "out of %s memory for %d tokens", ops->name, n);
    }
    AttnBatch b = {.num_tokens = n,
                   .positions = dev[2],
                   .slot_mapping = dev[3],
                   .num_seqs = 1,
                   .query_start = dev[4],
                   .block_tables = dev[1],
                   .max_blocks_per_seq = nblocks};
    model_forward(r->model, dev[0], &b, kv, &e->kv_layout, dev[2], n, dev_logits);
    if (r->index == 0)
        ops->to_host(ops, logits, dev_logits, (size_t)n * vocab * sizeof(float));
    else if (ops->synchronize) /* the private pool is freed next */
        ops->synchronize(ops);
    for (int i = 0; i < 5; i++)
        ops->free(ops, dev[i]);
    ops->free(ops, kv);
    ops->free(ops, dev_logits);
    free(table);
    free(pos);
    free(slots);
    return PL_OK;
}
