/* pool.c - a persistent pool of worker threads for the CPU ops, one per CPU backend.
 *
 * Started on first use with one thread per CPU this process may run on (the caller counts
 * as one), or fewer as the backend's cpu_threads asks. A parallel region publishes
 * (fn, ctx, nt) under a mutex, bumps a generation counter and wakes the workers; worker tid < nt
 * runs its share and the caller waits until all nt - 1 workers have reported back, so no region
 * can start before the previous one has finished. One region runs at a time: a second thread
 * that finds the pool busy runs its region alone, which gives the same results (see
 * cpu_internal.h). cpu_pool_destroy stops and joins the workers. */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

#include "cpu_internal.h"

enum { POOL_MAX_THREADS = 256 };

struct CpuPool {
    pthread_mutex_t busy; /* held by the thread running a region */
    pthread_mutex_t mu;   /* guards everything below */
    pthread_cond_t work_cv, done_cv;
    int limit;    /* threads wanted, caller included (0: one per CPU) */
    int started;  /* workers started (under busy) */
    int nthreads; /* started, caller included */
    pthread_t workers[POOL_MAX_THREADS];
    int stop;
    uint64_t gen;
    CpuTaskFn fn;
    void *ctx;
    int active;  /* threads taking part in the current region */
    int pending; /* workers of the current region still running */
};

typedef struct {
    CpuPool *pool;
    int tid;
} WorkerArg;

static void *worker_main(void *arg_) {
    WorkerArg arg = *(WorkerArg *)arg_;
    free(arg_);
    CpuPool *pool = arg.pool;
    uint64_t seen = 0; /* regions are numbered from 1: one published before we ran is seen */
    pthread_mutex_lock(&pool->mu);
    for (;;) {
        while (pool->gen == seen && !pool->stop)
            pthread_cond_wait(&pool->work_cv, &pool->mu);
        if (pool->stop)
            break;
        seen = pool->gen;
        if (arg.tid >= pool->active)
            continue;
        CpuTaskFn fn = pool->fn;
        void *ctx = pool->ctx;
        int nt = pool->active;
        pthread_mutex_unlock(&pool->mu);
        fn(ctx, arg.tid, nt);
        pthread_mutex_lock(&pool->mu);
        if (--pool->pending == 0)
            pthread_cond_signal(&pool->done_cv);
    }
    pthread_mutex_unlock(&pool->mu);
    return NULL;
}

static int detect_threads(void) {
    int n = 0;
#ifdef CPU_COUNT
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        n = CPU_COUNT(&set);
#endif
    if (n < 1)
        n = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1)
        n = 1;
    return n < POOL_MAX_THREADS ? n : POOL_MAX_THREADS;
}

CpuPool *cpu_pool_create(int threads) {
    CpuPool *pool = pl_xcalloc(1, sizeof *pool);
    pthread_mutex_init(&pool->busy, NULL);
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->work_cv, NULL);
    pthread_cond_init(&pool->done_cv, NULL);
    pool->limit = threads > 0 ? threads : 0;
    pool->nthreads = 1;
    return pool;
}

/* Start the workers once (under pool->busy, so that destroy never races a start). */
static void pool_start(CpuPool *pool) {
    if (pool->started)
        return;
    pool->started = 1;
    int want = detect_threads();
    if (pool->limit > 0 && pool->limit < want)
        want = pool->limit;
    for (int tid = 1; tid < want; tid++) {
        WorkerArg *arg = pl_xmalloc(sizeof *arg);
        *arg = (WorkerArg){pool, tid};
        if (pthread_create(&pool->workers[tid], NULL, worker_main, arg) != 0) {
            free(arg);
            break; /* run with the workers we got */
        }
        pthread_mutex_lock(&pool->mu);
        pool->nthreads = tid + 1;
        pthread_mutex_unlock(&pool->mu);
    }
}

void cpu_pool_destroy(CpuPool *pool) {
    if (!pool)
        return;
    pthread_mutex_lock(&pool->busy);
    pthread_mutex_lock(&pool->mu);
    pool->stop = 1;
    int n = pool->nthreads;
    pthread_cond_broadcast(&pool->work_cv);
    pthread_mutex_unlock(&pool->mu);
    for (int tid = 1; tid < n; tid++)
        pthread_join(pool->workers[tid], NULL);
    pthread_mutex_unlock(&pool->busy);
    pthread_mutex_destroy(&pool->busy);
    pthread_mutex_destroy(&pool->mu);
    pthread_cond_destroy(&pool->work_cv);
    pthread_cond_destroy(&pool->done_cv);
    free(pool);
}

int cpu_pool_threads(CpuPool *pool) {
    pthread_mutex_lock(&pool->busy);
    pool_start(pool);
    int n = pool->nthreads;
    pthread_mutex_unlock(&pool->busy);
    return n;
}

void cpu_parallel(CpuPool *pool, CpuTaskFn fn, void *ctx, int want) {
    if (want <= 1 || pthread_mutex_trylock(&pool->busy) != 0) {
        fn(ctx, 0, 1);
        return;
    }
    pool_start(pool);
    int nt = pool->nthreads < want ? pool->nthreads : want;
    if (nt <= 1) {
        pthread_mutex_unlock(&pool->busy);
        fn(ctx, 0, 1);
        return;
    }
    pthread_mutex_lock(&pool->mu);
    pool->fn = fn;
    pool->ctx = ctx;
    pool->active = nt;
    pool->pending = nt - 1;
    pool->gen++;
    pthread_cond_broadcast(&pool->work_cv);
    pthread_mutex_unlock(&pool->mu);

    fn(ctx, 0, nt);

    pthread_mutex_lock(&pool->mu);
    while (pool->pending > 0)
        pthread_cond_wait(&pool->done_cv, &pool->mu);
    pthread_mutex_unlock(&pool->mu);
    pthread_mutex_unlock(&pool->busy);
}
