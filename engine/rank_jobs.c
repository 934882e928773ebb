/* rank_jobs.c - what one tensor-parallel rank does for each job (eng_rank_do): load its model
 * shard, allocate its step buffers and KV pools, warm up, capture graphs, run a step (swaps,
 * block copies, batch upload, the forward), every position's logits of a prompt, and free it
 * all at exit. The runner (runner.c) hands the same job to every rank at once, as threads of
 * this process or, under MPI, as processes (runner_mpi.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"

void eng_batch_sizes(const Engine *e, size_t sizes[BATCH_FIELDS]) {
    size_t t = (size_t)e->cfg.max_num_batched_tokens, s = (size_t)e->cfg.max_num_seqs;
    size_t vocab = (size_t)model_config(e->model)->vocab_size;
    sizes[0] = sizes[1] = t * sizeof(int32_t);
    sizes[2] = t * sizeof(int64_t);
    sizes[3] = (s + 1) * sizeof(int32_t);
    sizes[4] = s * (size_t)e->run.max_blocks_per_seq * sizeof(int32_t);
    sizes[5] = s * sizeof(int32_t);
    sizes[6] = s * vocab * sizeof(float);
    sizes[7] = t * 2 * sizeof(int32_t);
}

void eng_batch_fields(BatchBuffers *b, void **f[BATCH_FIELDS]) {
    f[0] = (void **)&b->tokens;
    f[1] = (void **)&b->positions;
    f[2] = (void **)&b->slots;
    f[3] = (void **)&b->query_start;
    f[4] = (void **)&b->block_tables;
    f[5] = (void **)&b->logit_rows;
    f[6] = (void **)&b->logits;
    f[7] = (void **)&b->scatter;
}

static Status load(Engine *e, Rank *r) {
    const EngineConfig *c = &e->cfg;
    ModelLoadOptions mo = {.dir = c->model_dir,
                           .load_dummy = c->load_dummy,
                           .seed = c->seed,
                           .max_num_tokens = c->max_num_batched_tokens,
                           .ops = r->ops,
                           .tp_rank = r->index,
                           .tp_size = e->run.tp,
                           .quantization = c->quantization,
                           .kv_cache_fp8 = c->kv_cache_fp8};
    return model_load(&mo, &r->model);
}

/* Rank > 0 of an engine that may overlap steps: where rank 0 copies the sampled tokens. */
static Status alloc_pending_tokens(Engine *e, Rank *r) {
    if (r->index == 0 || !r->ops->copy_peer)
        return PL_OK;
    if (!(r->d_pending_tokens =
              r->ops->alloc(r->ops, (size_t)e->cfg.max_num_seqs * sizeof(int32_t))))
        return pl_error_set(PL_ERR_NOMEM, "out of %s memory for the sampled tokens", r->ops->name);
    return PL_OK;
}

static Status alloc_buffers(Engine *e, Rank *r) {
    size_t sizes[BATCH_FIELDS];
    void **h[BATCH_FIELDS], **d[BATCH_FIELDS];
    eng_batch_sizes(e, sizes);
    eng_batch_fields(&e->run.h, h);
    eng_batch_fields(&r->d, d);
    for (int i = 0; i < BATCH_FIELDS; i++) {
        *d[i] = r->ops->host_memory ? *h[i] : r->ops->alloc(r->ops, sizes[i]);
        if (!*d[i])
            return pl_error_set(PL_ERR_NOMEM,
                                "out of %s memory for the step buffers (max-num-seqs %d, "
                                "max-num-batched-tokens %d)",
                                r->ops->name, e->cfg.max_num_seqs, e->cfg.max_num_batched_tokens);
    }
    return alloc_pending_tokens(e, r);
}

/* The warm-up's one-block pool, in a job of its own: a rank out of memory must fail before
 * the others enter the warm-up's collectives, or they would wait for it for ever. */
static Status alloc_warm_block(Engine *e, Rank *r) {
    if (!(r->kv_gpu = r->ops->alloc(r->ops, e->block_bytes)))
        return pl_error_set(PL_ERR_NOMEM,
                            "no %s memory left for one KV-cache block after the weights and "
                            "activations",
                            r->ops->name);
    return PL_OK;
}

static Status alloc_pools(Engine *e, Rank *r) {
    if (r->kv_gpu) /* the warm-up's block */
        r->ops->free(r->ops, r->kv_gpu);
    if (!(r->kv_gpu = r->ops->alloc(r->ops, (size_t)e->num_gpu_blocks * e->block_bytes)))
        return pl_error_set(PL_ERR_NOMEM,
                            "out of %s memory for %d KV-cache blocks (%.2f GiB): lower "
                            "gpu-memory-utilization or num-gpu-blocks-override",
                            r->ops->name, e->num_gpu_blocks,
                            (double)e->num_gpu_blocks * e->block_bytes / PL_GIB);
    size_t host = (size_t)(e->num_cpu_blocks ? e->num_cpu_blocks : 1) * e->block_bytes;
    if (!(r->kv_cpu = r->ops->alloc_host(r->ops, host)))
        return pl_error_set(PL_ERR_NOMEM,
                            "cannot allocate %.2f GiB of swap space: lower swap-space",
                            (double)e->num_cpu_blocks * e->block_bytes / PL_GIB);
    return PL_OK;
}

/* The step's swaps in plan order. With several ranks each waits for its device's compute:
 * a worker's previous step may still be running when the next one is posted. */
static void swap(Engine *e, Rank *r, const SwapPlan *p) {
    for (int k = 0; k < SWAP_KINDS; k++) {
        if (p->n[k] == 0)
            continue;
        int out = k == SWAP_OUT_NOW || k == SWAP_OUT_AFTER;
        int after = k == SWAP_OUT_AFTER || k == SWAP_IN_AFTER || e->run.tp > 1;
        r->ops->swap_blocks(r->ops, out ? r->kv_cpu : r->kv_gpu, out ? r->kv_gpu : r->kv_cpu,
                            (const int32_t *)p->pairs[k], p->n[k], e->block_bytes, after);
    }
}

static void step(Engine *e, Rank *r, const RankJob *j) {
    const KernelOps *ops = r->ops;
    const SchedulerOutput *o = j->o;
    if (j->swaps)
        swap(e, r, j->swaps);
    if (o->num_copies)
        ops->copy_blocks(ops, r->kv_gpu, r->kv_gpu, (const int32_t *)o->copies, o->num_copies,
                         e->block_bytes);
    if (j->num_tokens == 0)
        return;
    eng_upload_batch(e, r, j->num_tokens, j->num_seqs, j->num_rows, j->table_width);
    if (j->num_scatter) { /* input ids the host has not seen yet */
        const int32_t *src = j->scatter_src;
        if (r->index > 0) { /* rank 0 sampled them and copies them here */
            ops->stream_wait(ops, e->tokens_copied);
            src = r->d_pending_tokens;
        }
        if (r->d.scatter != e->run.h.scatter)
            ops->to_device(ops, r->d.scatter, e->run.h.scatter,
                           (size_t)j->num_scatter * 2 * sizeof(int32_t));
        ops->scatter_tokens(ops, r->d.tokens, src, r->d.scatter, j->num_scatter);
    }
    eng_rank_forward(e, r, j->num_tokens, j->num_seqs, j->num_rows, j->num_decode, j->graph);
}

static void free_rank(Engine *e, Rank *r) {
    const KernelOps *ops = r->ops;
    eng_destroy_graphs(e, r);
    void **h[BATCH_FIELDS], **d[BATCH_FIELDS];
    eng_batch_fields(&e->run.h, h);
    eng_batch_fields(&r->d, d);
    for (int i = 0; i < BATCH_FIELDS; i++)
        if (*d[i] && *d[i] != *h[i])
            ops->free(ops, *d[i]);
    memset(&r->d, 0, sizeof r->d);
    if (r->d_pending_tokens)
        ops->free(ops, r->d_pending_tokens);
    r->d_pending_tokens = NULL;
    if (r->kv_gpu)
        ops->free(ops, r->kv_gpu);
    if (r->kv_cpu)
        ops->free_host(ops, r->kv_cpu);
    r->kv_gpu = r->kv_cpu = NULL;
    model_destroy(r->model);
    r->model = NULL;
}

void eng_rank_do(Engine *e, Rank *r, const RankJob *j) {
    Status st = PL_OK;
    switch (j->kind) {
        case JOB_LOAD:
            st = load(e, r);
            break;
        case JOB_BUFFERS:
            st = alloc_buffers(e, r);
            break;
        case JOB_WARM_BLOCK:
            st = alloc_warm_block(e, r);
            break;
        case JOB_WARM_UP:
            eng_rank_warm_up(e, r, j);
            break;
        case JOB_POOLS:
            st = alloc_pools(e, r);
            break;
        case JOB_CAPTURE:
            eng_rank_capture(e, r, j->graph);
            break;
        case JOB_STEP:
            step(e, r, j);
            break;
        case JOB_LOGITS:
            st = eng_rank_prompt_logits(e, r, j->ids, j->num_tokens, j->logits_out);
            break;
        case JOB_EXIT:
            free_rank(e, r);
            break;
    }
    r->status = st;
    if (st != PL_OK)
        snprintf(r->error, sizeof r->error, "%s", pl_error());
}
