/* runner.c - the model runner (ModelRunner): the tensor-parallel ranks, one per GPU, each
 * with its model shard, KV pools, step buffers and graphs (Rank), and the start-up jobs over
 * them (warm-up, graph capture). Rank 0 runs on whichever thread drives the engine; ranks
 * 1..tp-1 on worker threads bound to their devices. Every job (load, buffers, warm-up, pools,
 * capture, step, exit) is done by all ranks at once, as the collective operations inside the
 * forward pass require: eng_ranks_run posts it, rank 0 does it on the caller's thread, and
 * the call returns when every rank has issued its work (a worker's device work may still be
 * running; the next collective or copy orders it). With one rank there are no threads. */
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
                           .tp_size = e->run.tp};
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
    eng_upload_batch(e, r, j->num_tokens, j->num_seqs, j->num_rows);
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

static void rank_do(Engine *e, Rank *r, const RankJob *j) {
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

static void *worker(void *arg) {
    Rank *r = arg;
    Engine *e = r->engine;
    r->ops->bind(r->ops);
    uint64_t seen = 0;
    pthread_mutex_lock(&e->run.job_mu);
    for (;;) {
        while (e->run.job_seq == seen)
            pthread_cond_wait(&e->run.job_cv, &e->run.job_mu);
        seen = e->run.job_seq;
        RankJob j = e->run.job;
        pthread_mutex_unlock(&e->run.job_mu);
        rank_do(e, r, &j);
        pthread_mutex_lock(&e->run.job_mu);
        e->run.jobs_done++;
        pthread_cond_signal(&e->run.job_done_cv);
        if (j.kind == JOB_EXIT)
            break;
    }
    pthread_mutex_unlock(&e->run.job_mu);
    return NULL;
}

Status eng_ranks_start(Engine *e) {
    e->run.local = e->run.mpi ? 1 : e->run.tp;
    e->run.ranks = pl_xcalloc((size_t)e->run.local, sizeof *e->run.ranks);
    pthread_mutex_init(&e->run.job_mu, NULL);
    pthread_cond_init(&e->run.job_cv, NULL);
    pthread_cond_init(&e->run.job_done_cv, NULL);
    for (int i = 0; i < e->run.local; i++) {
        e->run.ranks[i].index = e->run.mpi ? e->run.backends[0]->rank : i;
        e->run.ranks[i].engine = e;
        e->run.ranks[i].ops = e->run.backends[i];
    }
    for (int i = 1; i < e->run.local; i++) {
        if (pthread_create(&e->run.ranks[i].thread, NULL, worker, &e->run.ranks[i]) != 0) {
            e->run.tp = e->run.local = i; /* the ones started end with the engine */
            return pl_error_set(PL_ERR_NOMEM, "cannot start the worker thread of rank %d", i);
        }
    }
    return PL_OK;
}

/* ---- ranks as MPI processes ------------------------------------------------------------
 * Rank 0 broadcasts each job as a WireJob (the job's numbers and the engine geometry the
 * other ranks read: pool sizes, batch limits) followed by its data packed in one buffer; each
 * rank runs it and rank 0 gathers their results. One engine per process lifetime. */

typedef struct {
    int32_t kind, num_tokens, num_seqs, num_rows, graph, num_decode, num_scatter, num_copies;
    int32_t swaps[SWAP_KINDS], has_swaps, failed;
    int32_t max_num_seqs, max_num_batched_tokens, max_model_len, max_blocks_per_seq;
    int32_t num_gpu_blocks, num_cpu_blocks, num_graphs, pad;
    int64_t block_bytes, payload;
} WireJob;

typedef struct {
    int32_t status;
    char error[1024];
} RankResult;

static int followers_released; /* rank 0: a JOB_EXIT went out (MPI is one per process) */

/* Seconds rank 0 waits for the ranks' results of one job: PAGELLM_MPI_TIMEOUT, default 600. */
static double job_timeout(void) {
    const char *v = getenv("PAGELLM_MPI_TIMEOUT");
    return v && atof(v) > 0 ? atof(v) : 600.0;
}

static const char *job_name(int kind) {
    static const char *names[] = {"load",    "buffers", "warm-up block", "warm-up", "pools",
                                  "capture", "step",    "prompt logits", "exit"};
    return kind >= 0 && kind <= JOB_EXIT ? names[kind] : "?";
}

/* The pieces of a job's data in wire order: parts[i] (rank 0: where it is read; followers:
 * where it is written) of bytes[i]; *n their count. The batch arrays are the host batch's. */
static void job_parts(Engine *e, const WireJob *w, const BlockCopy *copies,
                      BlockCopy *const swaps[SWAP_KINDS], const int32_t *ids, void *parts[16],
                      size_t bytes[16], int *n) {
    int k = 0;
    BatchBuffers *h = &e->run.h;
    int tokens = w->num_tokens, seqs = w->num_seqs, rows = w->num_rows;
    if (w->kind == JOB_CAPTURE) /* and the batch of the graph's rows (num_tokens) */
        parts[k] = e->run.graph_size, bytes[k++] = (size_t)w->num_graphs * sizeof(int);
    if (w->kind == JOB_STEP) {
        parts[k] = (void *)copies, bytes[k++] = (size_t)w->num_copies * sizeof(BlockCopy);
        for (int i = 0; i < SWAP_KINDS; i++)
            parts[k] = swaps[i], bytes[k++] = (size_t)w->swaps[i] * sizeof(BlockCopy);
    }
    if (w->kind == JOB_LOGITS)
        parts[k] = (void *)ids, bytes[k++] = (size_t)w->num_tokens * sizeof(int32_t);
    if ((w->kind == JOB_STEP || w->kind == JOB_WARM_UP || w->kind == JOB_CAPTURE) && tokens > 0) {
        parts[k] = h->tokens, bytes[k++] = (size_t)tokens * sizeof(int32_t);
        parts[k] = h->positions, bytes[k++] = (size_t)tokens * sizeof(int32_t);
        parts[k] = h->slots, bytes[k++] = (size_t)tokens * sizeof(int64_t);
        parts[k] = h->query_start, bytes[k++] = (size_t)(seqs + 1) * sizeof(int32_t);
        parts[k] = h->block_tables,
        bytes[k++] = (size_t)seqs * e->run.max_blocks_per_seq * sizeof(int32_t);
        parts[k] = h->logit_rows, bytes[k++] = (size_t)rows * sizeof(int32_t);
        parts[k] = h->scatter, bytes[k++] = (size_t)w->num_scatter * 2 * sizeof(int32_t);
    }
    *n = k;
}

static void wire_reserve(Engine *e, size_t bytes) {
    if (e->run.wire_cap >= bytes)
        return;
    free(e->run.wire);
    e->run.wire_cap = bytes > 4096 ? bytes : 4096;
    e->run.wire = pl_xmalloc(e->run.wire_cap);
}

/* Rank 0: gather every rank's result; the first failure as this thread's error. A rank that
 * does not answer in time is dead or stuck: say which and end every process. */
static Status gather_results(Engine *e, int kind) {
    int size = e->run.tp;
    RankResult mine = {.status = e->run.ranks[0].status};
    snprintf(mine.error, sizeof mine.error, "%s", e->run.ranks[0].error);
    RankResult *all = pl_xcalloc((size_t)size, sizeof *all);
    int *late = pl_xcalloc((size_t)size, sizeof *late);
    double timeout = job_timeout();
    if (k_mpi_gather(&mine, all, sizeof mine, timeout, late) != PL_OK) {
        char who[256] = "";
        for (int r = 0, len = 0; r < size && len < (int)sizeof who - 8; r++)
            if (late[r])
                len += snprintf(who + len, sizeof who - len, "%s%d", len ? ", " : "", r);
        fprintf(stderr,
                "pagellm: rank %s did not finish the %s job within %g s (PAGELLM_MPI_TIMEOUT): "
                "dead or stuck; ending every rank\n",
                who, job_name(kind), timeout);
        k_mpi_abort(1);
    }
    Status st = PL_OK;
    for (int r = 0; r < size && st == PL_OK; r++) {
        if (all[r].status == PL_OK)
            continue;
        e->run.failed = 1;
        st = r == 0 ? pl_error_set(all[r].status, "%s", all[r].error)
                    : pl_error_set(all[r].status, "rank %d: %s", r, all[r].error);
    }
    free(all);
    free(late);
    return st;
}

static Status mpi_run(Engine *e, const RankJob *job) {
    const SchedulerOutput *o = job->o;
    WireJob w = {.kind = job->kind,
                 .num_tokens = job->num_tokens,
                 .num_seqs = job->num_seqs,
                 .num_rows = job->num_rows,
                 .graph = job->graph,
                 .num_decode = job->num_decode,
                 .num_scatter = job->num_scatter,
                 .num_copies = o ? o->num_copies : 0,
                 .has_swaps = job->swaps != NULL,
                 .failed = e->run.failed,
                 .max_num_seqs = e->cfg.max_num_seqs,
                 .max_num_batched_tokens = e->cfg.max_num_batched_tokens,
                 .max_model_len = e->max_model_len,
                 .max_blocks_per_seq = e->run.max_blocks_per_seq,
                 .num_gpu_blocks = e->num_gpu_blocks,
                 .num_cpu_blocks = e->num_cpu_blocks,
                 .num_graphs = e->run.num_graphs,
                 .block_bytes = (int64_t)e->block_bytes};
    if (job->kind == JOB_CAPTURE) /* the padded batch of the graph's rows */
        w.num_tokens = w.num_seqs = w.num_rows = e->run.graph_size[job->graph];
    BlockCopy *swaps[SWAP_KINDS] = {0};
    for (int i = 0; job->swaps && i < SWAP_KINDS; i++) {
        w.swaps[i] = job->swaps->n[i];
        swaps[i] = job->swaps->pairs[i];
    }
    void *parts[16];
    size_t bytes[16];
    int n;
    job_parts(e, &w, o ? o->copies : NULL, swaps, job->ids, parts, bytes, &n);
    for (int i = 0; i < n; i++)
        w.payload += (int64_t)bytes[i];
    wire_reserve(e, (size_t)w.payload);
    for (int i = 0, off = 0; i < n; off += (int)bytes[i], i++)
        if (bytes[i])
            memcpy(e->run.wire + off, parts[i], bytes[i]);
    if (job->kind == JOB_EXIT)
        followers_released = 1;
    k_mpi_bcast(&w, sizeof w);
    if (w.payload)
        k_mpi_bcast(e->run.wire, (size_t)w.payload);
    rank_do(e, &e->run.ranks[0], job);
    return gather_results(e, job->kind);
}

void eng_mpi_release(int failed) {
    int size = k_mpi_active();
    if (!size || followers_released)
        return;
    followers_released = 1;
    WireJob w = {.kind = JOB_EXIT, .failed = failed != 0};
    k_mpi_bcast(&w, sizeof w);
    RankResult mine = {0}, *all = pl_xcalloc((size_t)size, sizeof *all);
    int *late = pl_xcalloc((size_t)size, sizeof *late);
    k_mpi_gather(&mine, all, sizeof mine, job_timeout(), late); /* they have no work left */
    free(all);
    free(late);
}

int eng_ranks_follow(Engine *e, Status setup) {
    Rank *r = &e->run.ranks[0], failed = {.status = setup}; /* setup failed: answer each job so */
    if (setup != PL_OK) {
        snprintf(failed.error, sizeof failed.error, "%s", pl_error());
        r = &failed;
    }
    for (;;) {
        WireJob w;
        k_mpi_bcast(&w, sizeof w);
        wire_reserve(e, (size_t)w.payload);
        if (w.payload)
            k_mpi_bcast(e->run.wire, (size_t)w.payload);
        /* rank 0's geometry: what its pools, limits and batch are sized by */
        e->cfg.max_num_seqs = w.max_num_seqs;
        e->cfg.max_num_batched_tokens = w.max_num_batched_tokens;
        e->max_model_len = w.max_model_len;
        e->run.max_blocks_per_seq = w.max_blocks_per_seq;
        e->num_gpu_blocks = w.num_gpu_blocks;
        e->num_cpu_blocks = w.num_cpu_blocks;
        e->block_bytes = (size_t)w.block_bytes;
        if (setup == PL_OK && w.kind == JOB_BUFFERS &&
            !e->run.h.tokens) { /* the host batch, filled by rank 0 */
            size_t sizes[BATCH_FIELDS];
            void **h[BATCH_FIELDS];
            eng_batch_sizes(e, sizes);
            eng_batch_fields(&e->run.h, h);
            for (int i = 0; i < BATCH_FIELDS; i++)
                *h[i] = pl_xcalloc(1, sizes[i]);
        }
        if (w.kind == JOB_CAPTURE && e->run.num_graphs != w.num_graphs) {
            free(e->run.graph_size);
            e->run.graph_size = pl_xcalloc((size_t)w.num_graphs + 1, sizeof(int));
            e->run.num_graphs = w.num_graphs;
        }
        BlockCopy *copies = NULL, *swaps[SWAP_KINDS] = {0};
        int32_t *ids = NULL;
        /* the job's own arrays are read in the wire, the batch is copied to the host one */
        if (w.kind == JOB_STEP) {
            copies = (BlockCopy *)e->run.wire;
            size_t off = (size_t)w.num_copies * sizeof(BlockCopy);
            for (int i = 0; i < SWAP_KINDS; i++) {
                swaps[i] = (BlockCopy *)(e->run.wire + off);
                off += (size_t)w.swaps[i] * sizeof(BlockCopy);
            }
        } else if (w.kind == JOB_LOGITS) {
            ids = (int32_t *)e->run.wire;
        }
        void *parts[16];
        size_t bytes[16];
        int n;
        job_parts(e, &w, copies, swaps, ids, parts, bytes, &n);
        size_t at = 0;
        for (int i = 0; i < n; at += bytes[i], i++)
            if (bytes[i] && (char *)parts[i] != e->run.wire + at)
                memcpy(parts[i], e->run.wire + at, bytes[i]);
        SchedulerOutput o = {.copies = copies, .num_copies = w.num_copies};
        SwapPlan plan = {0};
        for (int i = 0; i < SWAP_KINDS; i++) {
            plan.pairs[i] = swaps[i];
            plan.n[i] = w.swaps[i];
        }
        RankJob j = {.kind = w.kind,
                     .o = &o,
                     .num_tokens = w.num_tokens,
                     .num_seqs = w.num_seqs,
                     .num_rows = w.num_rows,
                     .graph = w.graph,
                     .num_decode = w.num_decode,
                     .swaps = w.has_swaps ? &plan : NULL,
                     .num_scatter = w.num_scatter,
                     .ids = ids};
        if (setup == PL_OK)
            rank_do(e, r, &j);
        if (setup == PL_OK && w.kind == JOB_LOAD && r->status == PL_OK) {
            e->model = r->model;
            e->kv_layout = model_kv_layout(e->model, e->cfg.block_size);
        }
        RankResult mine = {.status = r->status};
        snprintf(mine.error, sizeof mine.error, "%s", r->error);
        k_mpi_gather(&mine, NULL, sizeof mine, 0, NULL);
        if (w.kind == JOB_EXIT)
            return w.failed ? 1 : 0;
    }
}

Status eng_ranks_run(Engine *e, const RankJob *job) {
    if (e->run.mpi)
        return mpi_run(e, job);
    if (e->run.tp > 1) {
        pthread_mutex_lock(&e->run.job_mu);
        e->run.job = *job;
        e->run.jobs_done = 0;
        e->run.job_seq++;
        pthread_cond_broadcast(&e->run.job_cv);
        pthread_mutex_unlock(&e->run.job_mu);
    }
    rank_do(e, &e->run.ranks[0], job);
    if (e->run.tp > 1) {
        pthread_mutex_lock(&e->run.job_mu);
        while (e->run.jobs_done < e->run.tp - 1)
            pthread_cond_wait(&e->run.job_done_cv, &e->run.job_mu);
        pthread_mutex_unlock(&e->run.job_mu);
    }
    for (int i = 0; i < e->run.tp; i++)
        if (e->run.ranks[i].status != PL_OK)
            return pl_error_set(e->run.ranks[i].status, "%s", e->run.ranks[i].error);
    return PL_OK;
}

void eng_ranks_stop(Engine *e) {
    if (!e->run.ranks)
        return;
    RankJob j = {.kind = JOB_EXIT};
    if (!e->run.mpi || (e->run.ranks[0].index == 0 && !followers_released))
        eng_ranks_run(e, &j); /* a follower ran its JOB_EXIT already */
    for (int i = 1; i < e->run.local; i++)
        pthread_join(e->run.ranks[i].thread, NULL);
    pthread_mutex_destroy(&e->run.job_mu);
    pthread_cond_destroy(&e->run.job_cv);
    pthread_cond_destroy(&e->run.job_done_cv);
    free(e->run.ranks);
    e->run.ranks = NULL;
    free(e->run.wire);
    e->run.wire = NULL;
}

static int largest_decode(const Engine *e) {
    return e->cfg.max_num_seqs < e->cfg.max_num_batched_tokens ? e->cfg.max_num_seqs
                                                               : e->cfg.max_num_batched_tokens;
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
    BatchBuffers *h = &e->run.h;
    for (int i = 0; i < t; i++) {
        h->tokens[i] = 0;
        h->positions[i] = i;
        h->slots[i] = -1;
    }
    memset(h->block_tables, 0, (size_t)e->run.max_blocks_per_seq * sizeof(int32_t));
    h->query_start[0] = 0;
    h->query_start[1] = t;
    h->logit_rows[0] = t - 1;
    j = (RankJob){.kind = JOB_WARM_UP, .num_tokens = t, .num_seqs = 1, .num_rows = 1};
    return eng_ranks_run(e, &j);
}

Status eng_capture_graphs(Engine *e) {
    if (!e->ops->graph_begin || e->cfg.enforce_eager)
        return PL_OK;
    double t0 = pl_now();
    int limit = largest_decode(e), n = 0;
    e->run.graph_size = pl_xmalloc((size_t)(limit + 8) * sizeof(int));
    for (int s = 1; s < 16 && s < limit; s *= 2)
        e->run.graph_size[n++] = s;
    for (int s = 16; s < limit; s += 16)
        e->run.graph_size[n++] = s;
    e->run.graph_size[n++] = limit;
    e->run.num_graphs = n;
    for (int g = n - 1; g >= 0; g--) { /* largest first: nothing grows later */
        eng_pad_decode_rows(e, 0, e->run.graph_size[g]);
        RankJob j = {.kind = JOB_CAPTURE, .graph = g};
        Status st = eng_ranks_run(e, &j);
        if (st != PL_OK)
            return st;
    }
    e->run.graph_seconds = pl_now() - t0;
    return PL_OK;
}
