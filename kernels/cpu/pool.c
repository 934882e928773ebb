/* pool.c - a small persistent pool of worker threads for the CPU ops.
 *
 * Started on first use with one thread per CPU this process may run on (the caller counts
 * as one); k_cpu_set_threads (config key cpu-threads) lets fewer take part. A parallel region
 * publishes (fn, ctx, nt) under a mutex, bumps a generation counter and wakes the workers; worker
 * tid < nt runs its share and the caller waits until all nt - 1 workers have reported back, so no
 * region can start before the previous one has finished. One region runs at a time: a second thread
 * that finds the pool busy runs its region alone, which gives the same results (see
 * cpu_internal.h). */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

#include "cpu_internal.h"

enum { POOL_MAX_THREADS = 256 };

static struct {
    pthread_once_t once;
    pthread_mutex_t busy; /* held by the thread running a region */
    pthread_mutex_t mu;   /* guards everything below */
    pthread_cond_t work_cv, done_cv;
    int nthreads; /* caller included */
    int limit;    /* k_cpu_set_threads: at most this many take part (0: all) */
    uint64_t gen;
    CpuTaskFn fn;
    void *ctx;
    int active;  /* threads taking part in the current region */
    int pending; /* workers of the current region still running */
} pool = {
    .once = PTHREAD_ONCE_INIT,
    .busy = PTHREAD_MUTEX_INITIALIZER,
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .work_cv = PTHREAD_COND_INITIALIZER,
    .done_cv = PTHREAD_COND_INITIALIZER,
};

static void *worker_main(void *arg) {
    int tid = (int)(intptr_t)arg;
    uint64_t seen = 0; /* regions are numbered from 1: one published before we ran is seen */
    pthread_mutex_lock(&pool.mu);
    for (;;) {
        while (pool.gen == seen)
            pthread_cond_wait(&pool.work_cv, &pool.mu);
        seen = pool.gen;
        if (tid >= pool.active)
            continue;
        CpuTaskFn fn = pool.fn;
        void *ctx = pool.ctx;
        int nt = pool.active;
        pthread_mutex_unlock(&pool.mu);
        fn(ctx, tid, nt);
        pthread_mutex_lock(&pool.mu);
        if (--pool.pending == 0)
            pthread_cond_signal(&pool.done_cv);
    }
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

static void pool_init(void) {
    int want = detect_threads();
    pthread_mutex_lock(&pool.mu);
    pool.nthreads = 1;
    pthread_mutex_unlock(&pool.mu);
    for (int tid = 1; tid < want; tid++) {
        pthread_t th;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&th, &attr, worker_main, (void *)(intptr_t)tid);
        pthread_attr_destroy(&attr);
        if (rc != 0)
            break; /* run with the workers we got */
        pthread_mutex_lock(&pool.mu);
        pool.nthreads = tid + 1;
        pthread_mutex_unlock(&pool.mu);
    }
}

int cpu_num_threads(void) {
    pthread_once(&pool.once, pool_init);
    pthread_mutex_lock(&pool.mu);
    int n = pool.limit > 0 && pool.limit < pool.nthreads ? pool.limit : pool.nthreads;
    pthread_mutex_unlock(&pool.mu);
    return n;
}

void k_cpu_set_threads(int n) {
    pthread_mutex_lock(&pool.mu);
    pool.limit = n > 0 ? n : 0;
    pthread_mutex_unlock(&pool.mu);
}

void cpu_parallel(CpuTaskFn fn, void *ctx, int want) {
    int nt = want > 1 ? cpu_num_threads() : 1;
    if (nt > want)
        nt = want;
    if (nt <= 1 || pthread_mutex_trylock(&pool.busy) != 0) {
        fn(ctx, 0, 1);
        return;
    }
    pthread_mutex_lock(&pool.mu);
    pool.fn = fn;
    pool.ctx = ctx;
    pool.active = nt;
    pool.pending = nt - 1;
    pool.gen++;
    pthread_cond_broadcast(&pool.work_cv);
    pthread_mutex_unlock(&pool.mu);

    fn(ctx, 0, nt);

    pthread_mutex_lock(&pool.mu);
    while (pool.pending > 0)
        pthread_cond_wait(&pool.done_cv, &pool.mu);
    pthread_mutex_unlock(&pool.mu);
    pthread_mutex_unlock(&pool.busy);
}
