/* mpi.c - tensor-parallel ranks as the processes of an MPI job: starting MPI, the broadcast and
 * gather the engine drives its other ranks with, and the CPU backend's collectives over
 * MPI_COMM_WORLD (one rank per process, world rank = tensor-parallel rank).
 *
 * All-reduce is MPI_Allgather of every rank's part and a sum in rank order on each rank, not
 * MPI_Allreduce: the order in which MPI_Allreduce adds is the implementation's, so ranks could
 * differ in the last bits; summed in rank order every rank has identical sums (as the CUDA
 * one-shot all-reduce does), and the results equal the in-process thread emulation's.
 *
 * Errors: MPI_COMM_WORLD is set to MPI_ERRORS_RETURN, and a failing call aborts the job with
 * the call and MPI's message (a rank that cannot reach its peers cannot go on). Waits that may
 * be long are polls: followers sleep between polls while rank 0 is idle, and rank 0's gather
 * of the ranks' job results has a deadline that names the ranks that did not answer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/cpu_internal.h"
#include "kernels.h"

#ifdef PAGELLM_HAVE_MPI
#include <mpi.h>
#endif

int k_mpi_launched_size(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 0)
            return atoi(v);
    }
    return 0;
}

#ifdef PAGELLM_HAVE_MPI

static int mpi_rank, mpi_size, mpi_on, mpi_local_rank = -1;

/* An MPI call that failed: print it with MPI's reason and end the whole job. */
static void mpi_fail(const char *call, int rc) {
    char why[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, why, &len);
    fprintf(stderr, "pagellm: rank %d: %s failed: %s; aborting every rank\n", mpi_rank, call, why);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

#define MPI_OK(call)                                                                               \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != MPI_SUCCESS)                                                                    \
            mpi_fail(#call, rc_);                                                                  \
    } while (0)

Status k_mpi_init(int *rank, int *size) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        int provided = 0;
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
            return pl_error_set(PL_ERR_IO, "MPI_Init_thread failed");
        if (provided < MPI_THREAD_SERIALIZED)
            return pl_error_set(PL_ERR_UNSUPPORTED,
                                "this MPI does not allow calls from several threads (one at a "
                                "time): MPI_THREAD_SERIALIZED");
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &mpi_size);
    mpi_on = mpi_size > 1;
    if (mpi_local_rank < 0) { /* once: the split is collective */
        MPI_Comm host;        /* the ranks that share this host's memory (and GPUs) */
        MPI_OK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host));
        MPI_OK(MPI_Comm_rank(host, &mpi_local_rank));
        MPI_OK(MPI_Comm_free(&host));
    }
    *rank = mpi_rank;
    *size = mpi_size;
    return PL_OK;
}

int k_mpi_active(void) {
    return mpi_on ? mpi_size : 0;
}

int k_mpi_local_rank(void) {
    return mpi_local_rank > 0 ? mpi_local_rank : 0;
}

static void nap(int *polls) {
    /* spin briefly (a step's broadcast follows the last soon), then sleep up to 1 ms */
    if (++*polls < 64)
        return;
    long ns = *polls < 1024 ? 50000 : 1000000;
    struct timespec t = {0, ns};
    nanosleep(&t, NULL);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

Status k_mpi_bcast(void *buf, size_t bytes) {
    if (!mpi_on)
        return PL_OK;
    for (size_t done = 0; done < bytes || bytes == 0;) {
        size_t n = bytes - done > (1u << 30) ? (1u << 30) : bytes - done;
        /* nonblocking on every rank (a blocking and a nonblocking collective do not match);
         * rank 0 waits at once, the others poll */
        MPI_Request req;
        MPI_OK(MPI_Ibcast((char *)buf + done, (int)n, MPI_BYTE, 0, MPI_COMM_WORLD, &req));
        if (mpi_rank == 0) {
            MPI_OK(MPI_Wait(&req, MPI_STATUS_IGNORE));
        } else {
            int flag = 0, polls = 0;
            for (;;) {
                MPI_OK(MPI_Test(&req, &flag, MPI_STATUS_IGNORE));
                if (flag)
                    break;
                nap(&polls);
            }
        }
        done += n;
        if (bytes == 0)
            break;
    }
    return PL_OK;
}

enum { GATHER_TAG = 7301 };

Status k_mpi_gather(const void *mine, void *all, size_t bytes, double timeout_s, int *late) {
    if (!mpi_on) {
        memcpy(all, mine, bytes);
        return PL_OK;
    }
    if (mpi_rank > 0) {
        MPI_OK(MPI_Send(mine, (int)bytes, MPI_BYTE, 0, GATHER_TAG, MPI_COMM_WORLD));
        return PL_OK;
    }
    memcpy(all, mine, bytes);
    MPI_Request *req = pl_xcalloc((size_t)mpi_size, sizeof *req);
    req[0] = MPI_REQUEST_NULL;
    for (int r = 1; r < mpi_size; r++)
        MPI_OK(MPI_Irecv((char *)all + (size_t)r * bytes, (int)bytes, MPI_BYTE, r, GATHER_TAG,
                         MPI_COMM_WORLD, &req[r]));
    double until = timeout_s > 0 ? now() + timeout_s : 0;
    int flag = 0, polls = 0;
    Status st = PL_OK;
    for (;;) {
        MPI_OK(MPI_Testall(mpi_size, req, &flag, MPI_STATUSES_IGNORE));
        if (flag)
            break;
        if (until && now() > until) {
            for (int r = 0; r < mpi_size; r++) {
                int done = 1;
                if (req[r] != MPI_REQUEST_NULL)
                    MPI_Test(&req[r], &done, MPI_STATUS_IGNORE);
                late[r] = !done;
            }
            st = pl_error_set(PL_ERR_IO, "ranks did not answer within %g s", timeout_s);
            break;
        }
        nap(&polls);
    }
    free(req);
    return st;
}

void k_mpi_finalize(void) {
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (inited && !finalized)
        MPI_Finalize();
}

void k_mpi_abort(int code) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (inited)
        MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}

/* ---- the CPU backend's collectives (fp32) ---------------------------------------------- */

static void cpu_mpi_all_gather(const KernelOps *ops, void *out, const void *in, size_t count) {
    PL_CHECK(count <= (size_t)1 << 30);
    const void *src = (const float *)out + (size_t)ops->rank * count == in ? MPI_IN_PLACE : in;
    MPI_OK(MPI_Allgather(src, (int)count, MPI_FLOAT, out, (int)count, MPI_FLOAT, MPI_COMM_WORLD));
}

static void cpu_mpi_all_reduce(const KernelOps *ops, void *buf, size_t count) {
    CpuState *st = ops->state;
    size_t need = count * (size_t)ops->size;
    if (st->gather_count < need) { /* grows to the largest message once, then stays */
        free(st->gather);
        st->gather = pl_xmalloc(need * sizeof(float));
        st->gather_count = need;
    }
    cpu_mpi_all_gather(ops, st->gather, buf, count);
    float *sum = buf;
    memcpy(sum, st->gather, count * sizeof(float));
    for (int r = 1; r < ops->size; r++) { /* rank order: identical sums on every rank */
        const float *part = st->gather + (size_t)r * count;
        for (size_t i = 0; i < count; i++)
            sum[i] += part[i];
    }
}

static void cpu_mpi_all_reduce_add_rmsnorm(const KernelOps *ops, void *residual, void *delta,
                                           void *out, const Tensor *w, int n, int dim, float eps) {
    cpu_mpi_all_reduce(ops, delta, (size_t)n * dim);
    cpu_add_rmsnorm(ops, residual, delta, out, w, n, dim, eps);
}

Status cpu_mpi_join(KernelOps *ops, int size) {
    if (!mpi_on)
        return pl_error_set(PL_ERR_UNSUPPORTED, "the cpu backend's tensor parallelism needs "
                                                "MPI started (k_mpi_init) with several processes");
    if (size != mpi_size)
        return pl_error_set(PL_ERR_INVALID,
                            "tensor-parallel-size is %d but mpirun started %d processes (one "
                            "per rank: mpirun -np %d)",
                            size, mpi_size, size);
    ops->rank = mpi_rank;
    ops->size = mpi_size;
    ops->all_reduce = cpu_mpi_all_reduce;
    ops->all_reduce_add_rmsnorm = cpu_mpi_all_reduce_add_rmsnorm;
    ops->all_gather = cpu_mpi_all_gather;
    return PL_OK;
}

#else /* no MPI in this build */

static Status no_mpi(void) {
    return pl_error_set(PL_ERR_UNSUPPORTED,
                        "this pagellm was built without MPI, so it cannot run as one "
                        "tensor-parallel rank per process under mpirun: install Open MPI "
                        "(apt-get install openmpi-bin libopenmpi-dev, or ./configure.py "
                        "--install-deps), re-run ./configure.py and ninja");
}

Status k_mpi_init(int *rank, int *size) {
    *rank = 0;
    *size = 1;
    return no_mpi();
}

int k_mpi_active(void) {
    return 0;
}

int k_mpi_local_rank(void) {
    return 0;
}

Status k_mpi_bcast(void *buf, size_t bytes) {
    return PL_OK;
}

Status k_mpi_gather(const void *mine, void *all, size_t bytes, double timeout_s, int *late) {
    memcpy(all, mine, bytes);
    return PL_OK;
}

void k_mpi_finalize(void) {}

void k_mpi_abort(int code) {
    exit(code);
}

Status cpu_mpi_join(KernelOps *ops, int size) {
    return no_mpi();
}

#endif
