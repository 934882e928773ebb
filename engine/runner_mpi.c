/* runner_mpi.c - tensor-parallel ranks as MPI processes: rank 0 broadcasts each job with
 * the data the other ranks read from its memory (eng_mpi_run), the others follow
 * (eng_ranks_follow), and rank 0 gathers every rank's status. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"

/* Rank 0 broadcasts each job as a WireJob (the job's numbers and the engine geometry the
 * other ranks read: pool sizes, batch limits) followed by its data packed in one buffer; each
 * rank runs it and rank 0 gathers their results. One engine per process lifetime. */

typedef struct {
    int32_t kind, num_tokens, num_seqs, num_rows, graph, num_decode, num_scatter, num_copies;
    int32_t swaps[SWAP_KINDS], has_swaps, failed;
    int32_t max_num_seqs, max_num_batched_tokens, max_model_len, max_blocks_per_seq;
    int32_t num_gpu_blocks, num_cpu_blocks, num_graphs, table_width;
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

Status eng_mpi_run(Engine *e, const RankJob *job) {
    const SchedulerOutput *o = job->o;
    WireJob w = {.kind = job->kind,
                 .num_tokens = job->num_tokens,
                 .num_seqs = job->num_seqs,
                 .num_rows = job->num_rows,
                 .graph = job->graph,
                 .num_decode = job->num_decode,
                 .table_width = job->table_width,
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
    eng_rank_do(e, &e->run.ranks[0], job);
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
                     .table_width = w.table_width,
                     .swaps = w.has_swaps ? &plan : NULL,
                     .num_scatter = w.num_scatter,
                     .ids = ids};
        if (setup == PL_OK)
            eng_rank_do(e, r, &j);
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

int eng_mpi_exit_sent(void) {
    return followers_released;
}
