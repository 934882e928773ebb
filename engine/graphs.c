/* graphs.c - a rank's forward pass over the uploaded step batch, decode steps replayed from
 * graphs, and the start-up warm-up.
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

void eng_upload_batch(Engine *e, Rank *r, int num_tokens, int num_seqs, int num_rows) {
    if (e->h.tokens == r->d.tokens)
        return;
    const KernelOps *ops = e->ops;
    const BatchBuffers *h = &e->h, *d = &r->d;
    ops->to_device(d->tokens, h->tokens, (size_t)num_tokens * sizeof(int32_t));
    ops->to_device(d->positions, h->positions, (size_t)num_tokens * sizeof(int32_t));
    ops->to_device(d->slots, h->slots, (size_t)num_tokens * sizeof(int64_t));
    ops->to_device(d->query_start, h->query_start, (size_t)(num_seqs + 1) * sizeof(int32_t));
    ops->to_device(d->block_tables, h->block_tables,
                   (size_t)num_seqs * e->max_blocks_per_seq * sizeof(int32_t));
    ops->to_device(d->logit_rows, h->logit_rows, (size_t)num_rows * sizeof(int32_t));
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
                   .max_blocks_per_seq = e->max_blocks_per_seq,
                   .num_decode_seqs = num_decode};
    /* every rank: the LM head is vocabulary-parallel (rank 0 samples the gathered logits) */
    model_forward(r->model, d->tokens, &b, kv_pool, &e->kv_layout, d->logit_rows, num_rows,
                  d->logits);
}

void eng_rank_forward(Engine *e, Rank *r, int num_tokens, int num_seqs, int num_rows,
                      int num_decode, int graph) {
    if (graph >= 0)
        e->ops->graph_launch(r->graphs[graph]);
    else
        forward(e, r, r->kv_gpu, num_tokens, num_seqs, num_rows, num_decode);
}

static int largest_decode(const Engine *e) {
    return e->cfg.max_num_seqs < e->cfg.max_num_batched_tokens ? e->cfg.max_num_seqs
                                                               : e->cfg.max_num_batched_tokens;
}

void eng_rank_warm_up(Engine *e, Rank *r, const RankJob *j) {
    eng_upload_batch(e, r, j->num_tokens, j->num_seqs, j->num_rows);
    forward(e, r, r->kv_gpu, j->num_tokens, j->num_seqs, j->num_rows, j->num_decode);
    e->ops->synchronize(); /* the engine rewrites the host batch next */
}

Status eng_warm_up(Engine *e) {
    if (!e->ops->graph_begin) /* a backend without graphs has no lazy device state either */
        return PL_OK;
    RankJob j = {.kind = JOB_WARM_BLOCK};
    Status st = eng_ranks_run(e, &j);
    if (st != PL_OK)
        return st;
    int rows = largest_decode(e);
    eng_pad_decode_rows(e, 0, rows);
    j = (RankJob){.kind = JOB_WARM_UP,
                  .num_tokens = rows,
                  .num_seqs = rows,
                  .num_rows = rows,
                  .num_decode = rows};
    st = eng_ranks_run(e, &j);
    if (st != PL_OK)
        return st;
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
    j = (RankJob){.kind = JOB_WARM_UP, .num_tokens = t, .num_seqs = 1, .num_rows = 1};
    return eng_ranks_run(e, &j);
}

void eng_rank_capture(Engine *e, Rank *r, int g) {
    const KernelOps *ops = e->ops;
    int rows = e->graph_size[g];
    if (!r->graphs)
        r->graphs = pl_xcalloc((size_t)e->num_graphs, sizeof(void *));
    eng_upload_batch(e, r, rows, rows, rows);
    forward(e, r, r->kv_gpu, rows, rows, rows, rows); /* eager once, then recorded */
    ops->synchronize();
    ops->graph_begin();
    forward(e, r, r->kv_gpu, rows, rows, rows, rows);
    r->graphs[g] = ops->graph_end();
}

Status eng_capture_graphs(Engine *e) {
    if (!e->ops->graph_begin || e->cfg.enforce_eager)
        return PL_OK;
    double t0 = pl_now();
    int limit = largest_decode(e), n = 0;
    e->graph_size = pl_xmalloc((size_t)(limit + 8) * sizeof(int));
    for (int s = 1; s < 16 && s < limit; s *= 2)
        e->graph_size[n++] = s;
    for (int s = 16; s < limit; s += 16)
        e->graph_size[n++] = s;
    e->graph_size[n++] = limit;
    e->num_graphs = n;
    for (int g = n - 1; g >= 0; g--) { /* largest first: nothing grows later */
        eng_pad_decode_rows(e, 0, e->graph_size[g]);
        RankJob j = {.kind = JOB_CAPTURE, .graph = g};
        Status st = eng_ranks_run(e, &j);
        if (st != PL_OK)
            return st;
    }
    e->graph_seconds = pl_now() - t0;
    return PL_OK;
}

void eng_destroy_graphs(Engine *e, Rank *r) {
    for (int g = 0; r->graphs && g < e->num_graphs; g++)
        if (r->graphs[g])
            e->ops->graph_destroy(r->graphs[g]);
    free(r->graphs);
    r->graphs = NULL;
}
