/* runner.c - the model runner (ModelRunner): the tensor-parallel ranks, one per GPU, each
 * with its model shard, KV pools, step buffers and graphs (Rank), and the start-up jobs over
 * them (warm-up, graph capture). Rank 0 runs on whichever thread drives the engine; ranks
 * 1..tp-1 on worker threads bound to their devices. Every job (load, buffers, warm-up, pools,
 * capture, step, exit) is done by all ranks at once, as the collective operations inside the
 * forward pass require: eng_ranks_run posts it, rank 0 does it on the caller's thread, and
 * the call returns when every rank has issued its work (a worker's device work may still be
 * running; the next collective or copy orders it). With one rank there are no threads. What
 * a rank does for each job is rank_jobs.c; ranks as MPI processes, runner_mpi.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"

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
        eng_rank_do(e, r, &j);
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
Status eng_ranks_run(Engine *e, const RankJob *job) {
    if (e->run.mpi)
        return eng_mpi_run(e, job);
    if (e->run.tp > 1) {
        pthread_mutex_lock(&e->run.job_mu);
        e->run.job = *job;
        e->run.jobs_done = 0;
        e->run.job_seq++;
        pthread_cond_broadcast(&e->run.job_cv);
        pthread_mutex_unlock(&e->run.job_mu);
    }
    eng_rank_do(e, &e->run.ranks[0], job);
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
    if (!e->run.mpi || (e->run.ranks[0].index == 0 && !eng_mpi_exit_sent()))
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
                  .num_decode = rows,
                  .table_width = 1}; /* padding rows: block 0 */
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
    j = (RankJob){.kind = JOB_WARM_UP,
                  .num_tokens = t,
                  .num_seqs = 1,
                  .num_rows = 1,
                  .table_width = e->run.max_blocks_per_seq};
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
