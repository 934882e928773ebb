/* allreduce.cu - one-shot all-reduce for small messages between the GPUs of one process.
 *
 * The tensor-parallel ranks are threads of one process, so each GPU can map the others'
 * memory (peer access over NVLink). One kernel per all-reduce, on every rank at once, in
 * one of two ways.
 *
 * Messages of up to AR_PUSH_BYTES (every decode step's at batch <= 32 of hidden 4096) are
 * pushed: each block writes its part straight into its slot of every peer's inbox, as 16-byte
 * stores whose two 8-byte halves each carry 4 bytes of data and the call's epoch (NCCL's
 * "LL" protocol); the peer's block spins on its own inbox until both halves of every store
 * it needs show the epoch, then sums (ranks in order, so every rank computes bit-identical
 * sums) and writes the result or, fused, adds it to the residual and writes the RMSNorm of
 * the rows it owns. The data crosses NVLink once and is its own flag: no fence, no handshake.
 *
 * Larger messages are pulled:
 *   1. each block copies its part of the input into this call's half of its own staging;
 *   2. block b tells block b of every peer that its part is there (a release store of the
 *      call's epoch into the peer's flags) and waits for the same from each peer (acquire
 *      loads of its own flags);
 *   3. each block reads its part from every rank's staging and sums it as above.
 *
 * Epochs are per block, in device memory, advanced by the kernel itself: no host work per
 * call, so the kernels can be captured in CUDA graphs and replayed. The grid is fixed and
 * every block advances its epoch on every call, so all blocks agree on it. Inboxes and
 * staging have two halves, used by alternate calls: a rank writes a half again two calls
 * later, after a call in between in which it has received data from every peer (pull: the
 * handshake; push: the rows of at least one block), so every peer has started that call
 * and, in stream order, finished the one that read the half. The kernels are launched as
 * programmatic dependents (cuda_internal.cuh): they wait for the kernel before them, then let
 * the next one (a GEMV, which starts streaming its weights) become resident.
 *
 * The kernels spin on the peers: every rank must make the same sequence of calls (the model's
 * forward does), and all AR_BLOCKS blocks must be resident at once (a handful per GPU). NCCL
 * stays for messages larger than the staging half. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.cuh"
#include "tensor_parallel.cuh"

enum { AR_BLOCKS = 128, AR_THREADS = 512, AR_MAX_RANKS = 8 };
static const size_t AR_HALF_BYTES = (size_t)8 << 20;   /* largest one-shot message */
static const size_t AR_PUSH_BYTES = (size_t)256 << 10; /* largest pushed message */
static const size_t AR_SLOT_BYTES = 2 * AR_PUSH_BYTES; /* one rank's LL-encoded message */
/* A peer that has not arrived after this long never will (the ranks' calls diverged): the
 * kernel traps, which fails loudly instead of hanging. */
static const uint64_t AR_WAIT_LIMIT_NS = 20ull * 1000 * 1000 * 1000;

/* One rank's view of the group: a kernel argument, fixed for the life of the group. */
typedef struct {
    char *staging[AR_MAX_RANKS];   /* every rank's staging: two halves of AR_HALF_BYTES */
    char *inbox[AR_MAX_RANKS];     /* every rank's inbox [2][AR_MAX_RANKS][AR_SLOT_BYTES] */
    uint32_t *flags[AR_MAX_RANKS]; /* every rank's flags [AR_BLOCKS][AR_MAX_RANKS]: from whom */
    uint32_t *epochs;              /* this rank's [AR_BLOCKS]: the last call's epoch per block */
    int rank, size;
} ArView;

/* The group: every rank's view. */
struct KCudaArGroup {
    int size;
    ArView views[AR_MAX_RANKS];
};

/* ---- device side ---------------------------------------------------------------------- */

__device__ __forceinline__ void store_release(uint32_t *p, uint32_t v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint64_t global_ns(void) {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ uint32_t load_acquire(const uint32_t *p) {
    uint32_t v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* In a wait for rank r that began at `start`: trap, saying so, past AR_WAIT_LIMIT_NS. */
__device__ __forceinline__ void check_wait(uint64_t start, const ArView &v, int r, uint32_t epoch) {
    if (global_ns() - start > AR_WAIT_LIMIT_NS) {
        printf("one-shot all-reduce: rank %d (block %d) waited 20 s for rank %d at epoch %u\n",
               v.rank, blockIdx.x, r, epoch);
        __trap();
    }
}

/* This call's epoch for the block (stored once every thread has read it). Never 0, which
 * an unwritten (or consumed) inbox store holds; odd and even alternate across the wrap. */
__device__ __forceinline__ uint32_t call_epoch(const ArView &v) {
    const uint32_t e = v.epochs[blockIdx.x] + 1;
    return e ? e : 2;
}

/* This call's half of rank r's staging. */
__device__ __forceinline__ char *staging_half(const ArView &v, int r, uint32_t epoch) {
    return v.staging[r] + (epoch & 1) * AR_HALF_BYTES;
}

/* Slot `from` of rank `to`'s inbox, this call's half, as 16-byte LL stores. */
__device__ __forceinline__ uint4 *inbox_slot(const ArView &v, int to, int from, uint32_t epoch) {
    return (uint4 *)(v.inbox[to] + ((epoch & 1) * AR_MAX_RANKS + from) * AR_SLOT_BYTES);
}

/* Push 16 bytes of this rank's part (vector i) to every peer: two LL stores each. */
__device__ __forceinline__ void push_vec(const ArView &v, uint32_t epoch, size_t i, uint4 x) {
    for (int r = 0; r < v.size; r++) {
        if (r == v.rank)
            continue;
        uint4 *p = inbox_slot(v, r, v.rank, epoch) + 2 * i;
        asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(x.x),
                     "r"(epoch), "r"(x.y), "r"(epoch)
                     : "memory");
        asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p + 1), "r"(x.z),
                     "r"(epoch), "r"(x.w), "r"(epoch)
                     : "memory");
    }
}

/* The 8 data bytes of the LL store at p once both its halves show the epoch. */
__device__ __forceinline__ uint2 ll_wait(const uint4 *p, uint32_t epoch, const ArView &v, int r) {
    const uint64_t start = global_ns();
    for (;;) {
        uint4 u;
        asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
                     : "l"(p)
                     : "memory");
        if (u.y == epoch && u.w == epoch)
            return make_uint2(u.x, u.z);
        check_wait(start, v, r, epoch);
    }
}

/* Vector i of rank r's part: pushed into this rank's inbox, or in r's staging (pull). */
__device__ __forceinline__ uint4 part_vec(const ArView &v, int r, uint32_t epoch, bool push,
                                          size_t i) {
    if (!push) /* L2 of the owner, not a stale L1 line */
        return __ldcg((const uint4 *)staging_half(v, r, epoch) + i);
    uint4 *p = inbox_slot(v, v.rank, r, epoch) + 2 * i;
    const uint2 a = ll_wait(p, epoch, v, r), b = ll_wait(p + 1, epoch, v, r);
    /* consumed: cleared, so that no store of an old call can match an epoch again (they
     * wrap after 2^32 calls) */
    p[0] = p[1] = make_uint4(0, 0, 0, 0);
    return make_uint4(a.x, a.y, b.x, b.y);
}

/* Step 1 for vector i of this rank's part x. */
__device__ __forceinline__ void stage(const ArView &v, uint32_t epoch, bool push, size_t i,
                                      uint4 x) {
    if (push)
        push_vec(v, epoch, i, x);
    else
        ((uint4 *)staging_half(v, v.rank, epoch))[i] = x;
}

/* A pushed call's end of the block: every thread has read the epoch, so it may advance. */
__device__ __forceinline__ void advance_epoch(const ArView &v, uint32_t epoch) {
    __syncthreads();
    if (threadIdx.x == 0)
        v.epochs[blockIdx.x] = epoch;
}

/* Step 2: after it every peer's block has staged its part of this call. */
__device__ __forceinline__ void handshake(const ArView &v, uint32_t epoch) {
    __syncthreads(); /* the block's staging writes come before the release below */
    int peer = threadIdx.x;
    if (peer < v.size && peer != v.rank) {
        store_release(v.flags[peer] + blockIdx.x * AR_MAX_RANKS + v.rank, epoch);
        const uint32_t *mine = v.flags[v.rank] + blockIdx.x * AR_MAX_RANKS + peer;
        const uint64_t start = global_ns();
        while ((int32_t)(load_acquire(mine) - epoch) < 0) /* a peer may be one call ahead */
            check_wait(start, v, peer, epoch);
    }
    if (threadIdx.x == 0)
        v.epochs[blockIdx.x] = epoch;
    __syncthreads();
}

/* 16 bytes of T: VEC elements. */
template <typename T> struct Vec { static constexpr int N = 16 / sizeof(T); };

template <typename T> __device__ __forceinline__ void accumulate(float *acc, uint4 u) {
    const T *e = (const T *)&u;
#pragma unroll
    for (int i = 0; i < Vec<T>::N; i++)
        acc[i] += to_f32(e[i]);
}

/* The sum over the ranks (in rank order) of element vector i of this call's parts; `own` is
 * this rank's. */
template <typename T>
__device__ __forceinline__ void sum_ranks(float *acc, const ArView &v, uint32_t epoch, bool push,
                                          size_t i, uint4 own) {
#pragma unroll
    for (int k = 0; k < Vec<T>::N; k++)
        acc[k] = 0.0f;
    for (int r = 0; r < v.size; r++)
        accumulate<T>(acc, r == v.rank ? own : part_vec(v, r, epoch, push, i));
}

template <typename T> __device__ __forceinline__ uint4 pack(const float *a) {
    uint4 u;
    T *e = (T *)&u;
#pragma unroll
    for (int i = 0; i < Vec<T>::N; i++)
        e[i] = from_f32<T>(a[i]);
    return u;
}

/* Vectors [0, nvec) grid-strided; the partial last one (count % VEC elements, zero-padded)
 * goes to block 0's thread 0. */
template <typename T>
__global__ __launch_bounds__(AR_THREADS) void sum_kernel(T *buf, size_t count, ArView v) {
    constexpr int N = Vec<T>::N;
    kc_pdl_wait();
    kc_pdl_trigger();
    const uint32_t epoch = call_epoch(v);
    const bool push = count * sizeof(T) <= AR_PUSH_BYTES;
    const size_t nvec = count / N, rem = count % N, stride = (size_t)gridDim.x * blockDim.x;
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    uint4 *buf4 = (uint4 *)buf;
    const bool tail = rem && blockIdx.x == 0 && threadIdx.x == 0;
    uint4 tv = make_uint4(0, 0, 0, 0);
    if (tail)
        for (size_t k = 0; k < rem; k++)
            ((T *)&tv)[k] = buf[nvec * N + k];
    for (size_t i = first; i < nvec; i += stride)
        stage(v, epoch, push, i, buf4[i]);
    if (tail)
        stage(v, epoch, push, nvec, tv);
    if (!push)
        handshake(v, epoch);
    float acc[N];
    for (size_t i = first; i < nvec; i += stride) {
        sum_ranks<T>(acc, v, epoch, push, i, buf4[i]);
        buf4[i] = pack<T>(acc);
    }
    if (tail) {
        sum_ranks<T>(acc, v, epoch, push, nvec, tv);
        const uint4 r = pack<T>(acc);
        for (size_t k = 0; k < rem; k++)
            buf[nvec * N + k] = ((const T *)&r)[k];
    }
    if (push)
        advance_epoch(v, epoch);
}

/* Weights c * N .. c * N + N - 1 in fp32. With `early` (16-bit weights, 16-byte aligned) they
 * come as a vector: w0 when c is the thread's first vector (loaded before the block's sum). */
template <int N, typename TW>
__device__ __forceinline__ void norm_weights(float *wf, const TW *w, int c, bool early, uint4 w0) {
    if constexpr (N == 8 && sizeof(TW) == 2)
        if (early) {
            unpack8(wf, c == (int)threadIdx.x ? w0 : ((const uint4 *)w)[c], w);
            return;
        }
#pragma unroll
    for (int k = 0; k < N; k++)
        wf[k] = to_f32(w[c * N + k]);
}

/* Rows grid-strided over the blocks (the block that stages a row reduces it); dim % VEC == 0.
 * The new residual is rounded to T and that stored value is normalised, as norm.cu does. */
template <typename T, typename TW>
__global__ __launch_bounds__(AR_THREADS) void add_rmsnorm_kernel(T *residual, const T *delta,
                                                                 T *out, const TW *w, int n,
                                                                 int dim, float eps, bool w_vec,
                                                                 ArView v) {
    constexpr int N = Vec<T>::N;
    __shared__ float scratch[32];
    kc_pdl_wait();
    kc_pdl_trigger();
    const uint32_t epoch = call_epoch(v);
    const bool push = (size_t)n * dim * sizeof(T) <= AR_PUSH_BYTES;
    const int row_vecs = dim / N;
    for (int row = blockIdx.x; row < n; row += gridDim.x)
        for (int c = threadIdx.x; c < row_vecs; c += blockDim.x) {
            const size_t i = (size_t)row * row_vecs + c;
            stage(v, epoch, push, i, ((const uint4 *)delta)[i]);
        }
    if (!push)
        handshake(v, epoch);
    /* 16-bit activations and weights (16-byte aligned: w_vec): a thread's first weight vector
     * is loaded once, before any row's sum (the row's latency chain is one load shorter;
     * norm.cu does the same) */
    const bool early_w = N == 8 && sizeof(TW) == 2 && w_vec;
    uint4 w0 = make_uint4(0, 0, 0, 0);
    if (early_w && (int)threadIdx.x < row_vecs)
        w0 = ((const uint4 *)w)[threadIdx.x];
    for (int row = blockIdx.x; row < n; row += gridDim.x) {
        uint4 *res = (uint4 *)residual + (size_t)row * row_vecs;
        float ss = 0.0f;
        for (int c = threadIdx.x; c < row_vecs; c += blockDim.x) {
            float acc[N];
            const size_t i = (size_t)row * row_vecs + c;
            sum_ranks<T>(acc, v, epoch, push, i, ((const uint4 *)delta)[i]);
            accumulate<T>(acc, res[c]);
            uint4 r = pack<T>(acc);
            res[c] = r;
            const T *e = (const T *)&r;
#pragma unroll
            for (int k = 0; k < N; k++)
                ss += to_f32(e[k]) * to_f32(e[k]);
        }
        ss = block_sum(ss, scratch);
        const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
        uint4 *o = (uint4 *)out + (size_t)row * row_vecs;
        for (int c = threadIdx.x; c < row_vecs; c += blockDim.x) { /* this thread's own stores */
            uint4 r = res[c];
            const T *e = (const T *)&r;
            float y[N], wf[N];
            norm_weights<N>(wf, w, c, early_w, w0);
#pragma unroll
            for (int k = 0; k < N; k++)
                y[k] = wf[k] * (to_f32(e[k]) * inv);
            o[c] = pack<T>(y);
        }
    }
    if (push)
        advance_epoch(v, epoch);
}

/* ---- host side ------------------------------------------------------------------------ */

KCudaArGroup *k_cuda_ar_create(int n) {
    if (n < 2 || n > AR_MAX_RANKS)
        return NULL;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            int ok = 1;
            if (i != j)
                CUDA_CHECK(cudaDeviceCanAccessPeer(&ok, i, j));
            if (!ok)
                return NULL;
        }
    int prev = 0;
    CUDA_CHECK(cudaGetDevice(&prev));
    KCudaArGroup *g = (KCudaArGroup *)pl_xcalloc(1, sizeof *g);
    ArView shared = {};
    for (int i = 0; i < n; i++) {
        CUDA_CHECK(cudaSetDevice(i));
        for (int j = 0; j < n; j++) {
            if (j == i)
                continue;
            cudaError_t e = cudaDeviceEnablePeerAccess(j, 0);
            if (e == cudaErrorPeerAccessAlreadyEnabled)
                (void)cudaGetLastError(); /* from an earlier group: fine, and not sticky */
            else
                CUDA_CHECK(e);
        }
        size_t flag_bytes = (size_t)AR_BLOCKS * AR_MAX_RANKS * sizeof(uint32_t);
        shared.staging[i] = (char *)k_cuda_malloc(2 * AR_HALF_BYTES);
        shared.inbox[i] = (char *)k_cuda_malloc(2 * AR_MAX_RANKS * AR_SLOT_BYTES);
        k_cuda_memset(shared.inbox[i], 0, 2 * AR_MAX_RANKS * AR_SLOT_BYTES);
        shared.flags[i] = (uint32_t *)k_cuda_malloc(flag_bytes);
        g->views[i].epochs = (uint32_t *)k_cuda_malloc(AR_BLOCKS * sizeof(uint32_t));
        k_cuda_memset(shared.flags[i], 0, flag_bytes);
        k_cuda_memset(g->views[i].epochs, 0, AR_BLOCKS * sizeof(uint32_t));
        CUDA_CHECK(cudaDeviceSynchronize());
    }
    for (int i = 0; i < n; i++) {
        uint32_t *epochs = g->views[i].epochs;
        g->views[i] = shared;
        g->views[i].epochs = epochs;
        g->views[i].rank = i;
        g->views[i].size = n;
    }
    g->size = n;
    CUDA_CHECK(cudaSetDevice(prev));
    return g;
}

void k_cuda_ar_destroy(KCudaArGroup *g) {
    if (!g)
        return;
    int prev = 0;
    CUDA_CHECK(cudaGetDevice(&prev));
    for (int i = 0; i < g->size; i++) {
        CUDA_CHECK(cudaSetDevice(i));
        CUDA_CHECK(cudaDeviceSynchronize());
        k_cuda_free(g->views[i].staging[i]);
        k_cuda_free(g->views[i].inbox[i]);
        k_cuda_free(g->views[i].flags[i]);
        k_cuda_free(g->views[i].epochs);
    }
    free(g);
    CUDA_CHECK(cudaSetDevice(prev));
}

int k_cuda_ar_fits(const KCudaArGroup *g, const void *buf, size_t bytes, int dim, DType act) {
    return g && bytes <= AR_HALF_BYTES && (uintptr_t)buf % 16 == 0 &&
           (size_t)dim * pl_dtype_size(act) % 16 == 0;
}

void k_cuda_ar_sum(const KCudaArGroup *g, int rank, void *buf, DType act, size_t count,
                   cudaStream_t stream) {
    KC_REQUIRE(g && rank >= 0 && rank < g->size, "k_cuda_ar_sum: rank %d not in the group", rank);
    const ArView *v = &g->views[rank];
    KC_DISPATCH_ACT(act, "k_cuda_ar_sum", T,
                    kc_launch_pdl(sum_kernel<T>, dim3(AR_BLOCKS), dim3(AR_THREADS), 0, stream,
                                  (T *)buf, count, *v));
}

void k_cuda_ar_add_rmsnorm(const KCudaArGroup *g, int rank, void *residual, const void *delta,
                           void *out, DType act, const Tensor *w, int n, int dim, float eps,
                           cudaStream_t stream) {
    KC_REQUIRE(g && rank >= 0 && rank < g->size, "k_cuda_ar_add_rmsnorm: rank %d not in the group",
               rank);
    const ArView *v = &g->views[rank];
    KC_REQUIRE(w->ndim == 1 && w->shape[0] == dim,
               "k_cuda_ar_add_rmsnorm: weight shape does not match dim %d", dim);
    KC_DISPATCH_ACT(
        act, "k_cuda_ar_add_rmsnorm", T,
        KC_DISPATCH_WEIGHT(w->dtype, "k_cuda_ar_add_rmsnorm", TW,
                           kc_launch_pdl(add_rmsnorm_kernel<T, TW>, dim3(AR_BLOCKS),
                                         dim3(AR_THREADS), 0, stream, (T *)residual,
                                         (const T *)delta, (T *)out, (const TW *)w->data, n, dim,
                                         eps, kc_aligned16(w->data), *v)));
}
