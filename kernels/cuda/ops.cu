/* ops.cu - the CUDA backend's KernelOps tables: the model's op sequence on one GPU, one table
 * per activation dtype (F32: exact, outputs match the CPU reference within fp32 tolerance;
 * BF16: the fast configuration, bf16 activations and KV cache with fp32 math inside).
 *
 * Streams: every op runs on one compute stream (a blocking stream, so the synchronous
 * start-up copies on the legacy default stream order themselves with it); the step's small
 * host-to-device copies are asynchronous on it and the logits copy back synchronizes it.
 * Swaps run on their own stream: when asked to, it first waits for the compute issued so far
 * (an event; blocks a running step still uses), else the copies overlap that compute; the
 * compute stream waits for the swaps before its next op (another event), so the host never
 * blocks on a swap. Decode steps can be captured from the compute stream into CUDA
 * graphs (graph_begin / graph_end) and replayed.
 *
 * State shared by the ops (streams, the cuBLASLt handle and decode-attention workspace of
 * each table, the device copy of copy-on-write pairs, the NCCL communicator) is kept per
 * device, created on first use on that device and kept for the process: the ops act on the
 * calling thread's current device, so each tensor-parallel rank's thread drives its own GPU
 * through the same tables. Lazily grown state (gemm heuristics, the attention workspace, the fused
 * projection + norm's partials) must reach its working size before a capture, which the engine's
 * warm-up does.
 *
 * Tensor parallelism: all-reduces of up to a few MB (every decode step's) take the one-shot
 * kernel over peer memory (allreduce.cu), fused with the residual add + RMSNorm after it where
 * the model asks for that; larger ones, the logits' all-gather, and GPUs that cannot reach
 * each other's memory use NCCL. */
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.cuh"
#include "tensor_parallel.cuh"
#ifdef PAGELLM_HAVE_NCCL
#include <nccl.h>
#endif

/* Largest n * K of an fp32-activation matmul on 16-bit weights done in one piece (larger
 * batches are split into row chunks by k_cuda_matmul). */
#define GEMM_SCRATCH_ELEMS ((size_t)2048 * 16384)

/* Per-table state (index 0: F32, 1: BF16). */
typedef struct {
    KCudaGemm *gemm;
    KCudaProjNorm *proj_norm;
    void *attn_workspace;
    size_t attn_workspace_bytes;
} ActState;

/* Everything the ops keep for one device. */
typedef struct {
    int ready;
    cudaStream_t compute_stream, swap_stream;
    cudaEvent_t compute_done, swaps_done;
    int32_t *cow_pairs; /* device copy of copy-on-write pairs */
    int cow_pairs_cap;
    ActState act[3]; /* by activation dtype: F32, BF16, F16 */
    void *comm;      /* ncclComm_t of this device's tensor-parallel rank, NULL alone */
} DevState;

enum { MAX_DEVICES = 64 };
static DevState devices[MAX_DEVICES];

static DevState *dev(void) {
    int d = 0;
    CUDA_CHECK(cudaGetDevice(&d));
    KC_REQUIRE(d >= 0 && d < MAX_DEVICES, "device %d: at most %d devices", d, MAX_DEVICES);
    DevState *s = &devices[d];
    if (!s->ready) {
        CUDA_CHECK(cudaStreamCreate(&s->compute_stream));
        CUDA_CHECK(cudaStreamCreate(&s->swap_stream));
        CUDA_CHECK(cudaEventCreateWithFlags(&s->compute_done, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&s->swaps_done, cudaEventDisableTiming));
        s->ready = 1;
    }
    return s;
}

static cudaStream_t stream(void) {
    return dev()->compute_stream;
}

template <DType A> static ActState *state(void) {
    ActState *s = &dev()->act[A == DT_F32 ? 0 : A == DT_BF16 ? 1 : 2];
    if (!s->gemm)
        s->gemm = k_cuda_gemm_create(A == DT_F32 ? GEMM_SCRATCH_ELEMS : 0);
    if (!s->proj_norm)
        s->proj_norm = k_cuda_proj_norm_create();
    return s;
}

static void *ops_alloc(size_t bytes) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError(); /* not sticky: clear it and let the caller report */
        return NULL;
    }
    CUDA_CHECK(e);
    k_cuda_memset(p, 0, bytes);
    return p;
}

static size_t ops_free_memory(void) {
    size_t free_bytes = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    return free_bytes;
}

/* Host source (pageable or pinned): the call returns once the source may be reused. */
static void ops_to_device(void *dst, const void *src, size_t bytes) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream()));
}

static void ops_to_host(void *dst, const void *src, size_t bytes) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream()));
    CUDA_CHECK(cudaStreamSynchronize(stream()));
}

static void *ops_alloc_host(size_t bytes) {
    void *p = NULL;
    cudaError_t e = cudaMallocHost(&p, bytes ? bytes : 1);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        return NULL;
    }
    CUDA_CHECK(e);
    memset(p, 0, bytes);
    return p;
}

static void ops_free_host(void *p) {
    if (p)
        CUDA_CHECK(cudaFreeHost(p));
}

static void ops_swap_blocks(void *dst_pool, const void *src_pool, const int32_t *src_dst, int n,
                            size_t block_bytes, int after_compute) {
    if (n <= 0)
        return;
    DevState *s = dev();
    if (after_compute) {
        CUDA_CHECK(cudaEventRecord(s->compute_done, s->compute_stream));
        CUDA_CHECK(cudaStreamWaitEvent(s->swap_stream, s->compute_done, 0));
    }
    for (int i = 0; i < n; i++) /* block-major: one contiguous copy per block */
        CUDA_CHECK(cudaMemcpyAsync((char *)dst_pool + (size_t)src_dst[2 * i + 1] * block_bytes,
                                   (const char *)src_pool + (size_t)src_dst[2 * i] * block_bytes,
                                   block_bytes, cudaMemcpyDefault, s->swap_stream));
    CUDA_CHECK(cudaEventRecord(s->swaps_done, s->swap_stream));
    CUDA_CHECK(cudaStreamWaitEvent(s->compute_stream, s->swaps_done, 0));
}

static void ops_to_host_async(void *dst, const void *src, size_t bytes) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream()));
}

static void *ops_event_create(void) {
    cudaEvent_t ev;
    CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    return (void *)ev;
}

static void ops_event_record(void *ev) {
    CUDA_CHECK(cudaEventRecord((cudaEvent_t)ev, stream()));
}

static void ops_event_wait(void *ev) {
    CUDA_CHECK(cudaEventSynchronize((cudaEvent_t)ev));
}

static void ops_event_destroy(void *ev) {
    if (ev)
        CUDA_CHECK(cudaEventDestroy((cudaEvent_t)ev));
}

static void ops_copy_peer(void *dst, int dst_device, const void *src, size_t bytes) {
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device, src, device, bytes, stream()));
}

static void ops_stream_wait(void *ev) {
    CUDA_CHECK(cudaStreamWaitEvent(stream(), (cudaEvent_t)ev, 0));
}

static void ops_scatter_tokens(int32_t *tokens, const int32_t *sampled, const int32_t *pairs,
                               int n) {
    k_cuda_scatter_tokens(tokens, sampled, pairs, n, stream());
}

static void ops_copy_blocks(void *dst_pool, const void *src_pool, const int32_t *src_dst, int n,
                            size_t block_bytes) {
    DevState *s = dev();
    if (n > s->cow_pairs_cap) {
        CUDA_CHECK(cudaStreamSynchronize(s->compute_stream)); /* the old pairs may be in use */
        k_cuda_free(s->cow_pairs);
        s->cow_pairs_cap = n * 2;
        s->cow_pairs = (int32_t *)k_cuda_malloc((size_t)s->cow_pairs_cap * 2 * sizeof(int32_t));
    }
    ops_to_device(s->cow_pairs, src_dst, (size_t)n * 2 * sizeof(int32_t));
    k_cuda_copy_blocks(dst_pool, src_pool, s->cow_pairs, n, block_bytes, s->compute_stream);
}

template <DType A>
static void ops_embedding(void *out, const int32_t *ids, int n, const Tensor *t) {
    k_cuda_embedding(out, A, ids, n, t, stream());
}

template <DType A>
static void ops_rmsnorm(void *out, const void *x, const Tensor *w, int n, int dim, float eps) {
    k_cuda_rmsnorm(out, x, A, w, n, dim, eps, stream());
}

template <DType A>
static void ops_add_rmsnorm(void *residual, const void *delta, void *out, const Tensor *w, int n,
                            int dim, float eps) {
    k_cuda_add_rmsnorm(residual, delta, out, A, w, n, dim, eps, stream());
}

template <DType A>
static void ops_matmul(void *out, const void *x, const Tensor *w, const Tensor *bias, int n) {
    k_cuda_matmul(state<A>()->gemm, out, x, A, w, bias, n, stream());
}

template <DType A>
static void ops_matmul_add_rmsnorm(void *residual, void *normed, void *proj, const void *x,
                                   const Tensor *w, const Tensor *norm_w, int n, float eps) {
    ActState *s = state<A>();
    k_cuda_matmul_add_rmsnorm(s->proj_norm, s->gemm, residual, normed, proj, x, A, w, norm_w, n,
                              eps, stream());
}

template <DType A>
static void ops_rope(void *q, void *k, const int32_t *positions, int n, int nh, int nkv,
                     const Rope *rope) {
    k_cuda_rope(q, k, A, positions, n, nh, nkv, rope, stream());
}

template <DType A>
static void ops_kv_write(void *kv_cache, const KvLayout *l, int layer, const void *k, const void *v,
                         const int64_t *slot_mapping, int n) {
    k_cuda_kv_write(kv_cache, l, layer, k, v, A, slot_mapping, n, stream());
}

template <DType A>
static void ops_qkv_rope_cache(void *q_out, void *qkv, const int32_t *positions,
                               const int64_t *slot_mapping, int n, int nh, const Rope *rope,
                               void *kv_cache, const KvLayout *l, int layer) {
    k_cuda_qkv_rope_cache(q_out, qkv, A, positions, slot_mapping, n, nh, rope, kv_cache, l, layer,
                          stream());
}

template <DType A>
static void ops_matmul_qkv_rope_cache(void *q_out, void *qkv, const void *x, const Tensor *w,
                                      const Tensor *bias, const int32_t *positions,
                                      const int64_t *slot_mapping, int n, int nh, const Rope *rope,
                                      void *kv_cache, const KvLayout *l, int layer) {
    k_cuda_matmul_qkv_rope_cache(state<A>()->gemm, q_out, qkv, x, A, w, bias, positions,
                                 slot_mapping, n, nh, rope, kv_cache, l, layer, stream());
}

template <DType A>
static void ops_matmul_silu_mul(void *out, void *gate_up, const void *x, const Tensor *w, int n) {
    k_cuda_matmul_silu_mul(state<A>()->gemm, out, gate_up, x, A, w, n, stream());
}

template <DType A>
static void attention_decode(void *out, const void *q, const void *kv_cache, const KvLayout *l,
                             int layer, const AttnBatch *b, int nh, float scale) {
    ActState *s = state<A>();
    size_t need = k_cuda_attention_workspace_bytes(l, b->num_tokens, nh, b->max_blocks_per_seq);
    if (need > s->attn_workspace_bytes) {
        CUDA_CHECK(cudaStreamSynchronize(stream())); /* the old one may be in use */
        k_cuda_free(s->attn_workspace);
        s->attn_workspace_bytes = need;
        s->attn_workspace = k_cuda_malloc(need);
    }
    k_cuda_attention_decode(out, q, A, kv_cache, l, layer, b, nh, scale, s->attn_workspace,
                            s->attn_workspace_bytes, stream());
}

/* Single-row sequences take the decode kernel, prompt chunks the prefill kernel: a batch
 * whose first num_decode_seqs sequences are decodes is split into those two views (both
 * kernels are exact for any batch; each is fast for its own kind). */
template <DType A>
static void ops_attention(void *out, const void *q, const void *kv_cache, const KvLayout *l,
                          int layer, const AttnBatch *b, int nh, float scale) {
    int nd = b->num_tokens == b->num_seqs ? b->num_seqs : b->num_decode_seqs;
    if (nd > 0) {
        AttnBatch d = *b;
        d.num_tokens = d.num_seqs = nd;
        attention_decode<A>(out, q, kv_cache, l, layer, &d, nh, scale);
    }
    if (nd < b->num_seqs) {
        AttnBatch p = *b;
        p.num_tokens = b->num_tokens - nd;
        p.num_seqs = b->num_seqs - nd;
        p.query_start += nd;
        p.block_tables += (size_t)nd * b->max_blocks_per_seq;
        k_cuda_attention_prefill(out, q, A, kv_cache, l, layer, &p, nh, scale, stream());
    }
}

template <DType A> static void ops_silu_mul(void *out, const void *gate_up, int n, int dim) {
    k_cuda_silu_mul(out, gate_up, A, n, dim, stream());
}

template <DType A>
static void ops_gather_rows(void *out, const void *in, const int32_t *rows, int n, int dim) {
    k_cuda_gather_rows(out, in, rows, A, n, dim, stream());
}

template <DType A> static void ops_to_f32(float *out, const void *in, size_t n) {
    k_cuda_to_f32(out, in, A, n, stream());
}

template <DType A>
static void ops_embedding_slice(void *out, const int32_t *ids, int n, const Tensor *table,
                                int first) {
    k_cuda_embedding_slice(out, A, ids, n, table, first, stream());
}

template <DType A>
static void ops_vocab_logits_f32(float *out, const void *parts, int n, int vocab, int shard,
                                 int size) {
    k_cuda_vocab_logits_f32(out, parts, A, n, vocab, shard, size, stream());
}

static void ops_sample_rows(int32_t *tokens, float *token_logits, float *logits, int n, int vocab,
                            const DeviceSampleRow *rows, const int32_t *history, int flags,
                            void *workspace, size_t workspace_bytes) {
    k_cuda_sample(tokens, token_logits, logits, n, vocab, rows, history, flags, workspace,
                  workspace_bytes, stream());
}

static void ops_logprobs(float *lse, int32_t *top_ids, float *top_logprobs, const float *logits,
                         int n, int vocab, int k) {
    k_cuda_logprobs(lse, top_ids, top_logprobs, logits, n, vocab, k, stream());
}

static void ops_logits_add(float *logits, int vocab, const LogitEdit *edits, int n) {
    k_cuda_logits_add(logits, vocab, edits, n, stream());
}

static void ops_fill_dummy(void *dst, DType dt, size_t n, uint64_t key, float scale) {
    k_cuda_fill_dummy(dst, dt, n, key, scale, stream());
}

#ifdef PAGELLM_HAVE_NCCL
#define NCCL_CHECK(expr)                                                                           \
    do {                                                                                           \
        ncclResult_t r_ = (expr);                                                                  \
        KC_REQUIRE(r_ == ncclSuccess, "NCCL error in %s: %s", #expr, ncclGetErrorString(r_));      \
    } while (0)

int k_cuda_tp_init(int n, int custom_all_reduce) {
    int have = k_cuda_device_count();
    if (n < 1 || n > have || n > MAX_DEVICES)
        return -1;
    ncclComm_t comms[MAX_DEVICES];
    int ids[MAX_DEVICES];
    for (int i = 0; i < n; i++)
        ids[i] = i;
    NCCL_CHECK(ncclCommInitAll(comms, n, ids));
    for (int i = 0; i < n; i++)
        devices[i].comm = comms[i];
    if (custom_all_reduce) /* the one-shot path, when the GPUs reach each other's memory */
        k_cuda_ar_init(n);
    return 0;
}

void k_cuda_tp_destroy(int n) {
    k_cuda_ar_destroy(n);
    for (int i = 0; i < n && i < MAX_DEVICES; i++) {
        if (devices[i].comm)
            NCCL_CHECK(ncclCommDestroy((ncclComm_t)devices[i].comm));
        devices[i].comm = NULL;
    }
}

template <DType A> static ncclDataType_t nccl_type(void) {
    return A == DT_BF16 ? ncclBfloat16 : A == DT_F16 ? ncclFloat16 : ncclFloat32;
}

static ncclComm_t comm(void) {
    DevState *s = dev();
    KC_REQUIRE(s->comm, "tensor parallelism: this device has no communicator");
    return (ncclComm_t)s->comm;
}

template <DType A> static void ops_all_reduce(void *buf, size_t count) {
    if (k_cuda_ar_fits(buf, count * pl_dtype_size(A), 0, A)) {
        k_cuda_ar_sum(buf, A, count, stream());
        return;
    }
    NCCL_CHECK(ncclAllReduce(buf, buf, count, nccl_type<A>(), ncclSum, comm(), stream()));
}

template <DType A>
static void ops_all_reduce_add_rmsnorm(void *residual, void *delta, void *out, const Tensor *w,
                                       int n, int dim, float eps) {
    if (k_cuda_ar_fits(delta, (size_t)n * dim * pl_dtype_size(A), dim, A)) {
        k_cuda_ar_add_rmsnorm(residual, delta, out, A, w, n, dim, eps, stream());
        return;
    }
    ops_all_reduce<A>(delta, (size_t)n * dim);
    k_cuda_add_rmsnorm(residual, delta, out, A, w, n, dim, eps, stream());
}

template <DType A> static void ops_all_gather(void *out, const void *in, size_t count) {
    NCCL_CHECK(ncclAllGather(in, out, count, nccl_type<A>(), comm(), stream()));
}
#else
int k_cuda_tp_init(int n, int custom_all_reduce) {
    (void)custom_all_reduce;
    return n == 1 ? 0 : -1;
}
void k_cuda_tp_destroy(int n) {
    (void)n;
}
#endif

static void ops_graph_begin(void) {
    CUDA_CHECK(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal));
}

static void *ops_graph_end(void) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamEndCapture(stream(), &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_CHECK(cudaGraphDestroy(graph));
    return exec;
}

static void ops_graph_launch(void *graph) {
    CUDA_CHECK(cudaGraphLaunch((cudaGraphExec_t)graph, stream()));
}

static void ops_graph_destroy(void *graph) {
    if (graph)
        CUDA_CHECK(cudaGraphExecDestroy((cudaGraphExec_t)graph));
}

static void ops_set_device(int device) {
    CUDA_CHECK(cudaSetDevice(device));
}

static void ops_synchronize(void) {
    CUDA_CHECK(cudaStreamSynchronize(stream()));
}

template <DType A> static KernelOps make_ops(void) {
    KernelOps o;
    memset(&o, 0, sizeof o);
    o.name = "cuda";
    o.act = A;
    o.host_memory = 0;
    o.alloc = ops_alloc;
    o.free = k_cuda_free;
    o.to_device = ops_to_device;
    o.to_host = ops_to_host;
    o.free_memory = ops_free_memory;
    o.alloc_host = ops_alloc_host;
    o.free_host = ops_free_host;
    o.swap_blocks = ops_swap_blocks;
    o.to_host_async = ops_to_host_async;
    o.event_create = ops_event_create;
    o.event_record = ops_event_record;
    o.event_wait = ops_event_wait;
    o.event_destroy = ops_event_destroy;
    o.scatter_tokens = ops_scatter_tokens;
    o.copy_peer = ops_copy_peer;
    o.stream_wait = ops_stream_wait;
    o.embedding = ops_embedding<A>;
    o.rmsnorm = ops_rmsnorm<A>;
    o.add_rmsnorm = ops_add_rmsnorm<A>;
    o.matmul = ops_matmul<A>;
    o.rope = ops_rope<A>;
    o.kv_write = ops_kv_write<A>;
    o.qkv_rope_cache = ops_qkv_rope_cache<A>;
    o.attention = ops_attention<A>;
    o.silu_mul = ops_silu_mul<A>;
    o.matmul_qkv_rope_cache = ops_matmul_qkv_rope_cache<A>;
    o.matmul_silu_mul = ops_matmul_silu_mul<A>;
    o.matmul_add_rmsnorm = ops_matmul_add_rmsnorm<A>;
    o.gather_rows = ops_gather_rows<A>;
    o.to_f32 = ops_to_f32<A>;
    o.embedding_slice = ops_embedding_slice<A>;
    o.vocab_logits_f32 = ops_vocab_logits_f32<A>;
    o.copy_blocks = ops_copy_blocks;
    o.sample = NULL; /* sampling runs on the GPU: */
    o.sample_workspace_bytes = k_cuda_sample_workspace_bytes;
    o.sample_rows = ops_sample_rows;
    o.logprobs = ops_logprobs;
    o.logits_add = ops_logits_add;
    o.fill_dummy = ops_fill_dummy;
#ifdef PAGELLM_HAVE_NCCL
    o.all_reduce = ops_all_reduce<A>;
    o.all_reduce_add_rmsnorm = ops_all_reduce_add_rmsnorm<A>;
    o.all_gather = ops_all_gather<A>;
#endif
    o.set_device = ops_set_device;
    o.graph_begin = ops_graph_begin;
    o.graph_end = ops_graph_end;
    o.graph_launch = ops_graph_launch;
    o.graph_destroy = ops_graph_destroy;
    o.synchronize = ops_synchronize;
    return o;
}

static const KernelOps cuda_ops_f32 = make_ops<DT_F32>();
static const KernelOps cuda_ops_bf16 = make_ops<DT_BF16>();
static const KernelOps cuda_ops_f16 = make_ops<DT_F16>();

const KernelOps *k_cuda_ops(DType act) {
    KC_REQUIRE(act == DT_F32 || act == DT_BF16 || act == DT_F16,
               "k_cuda_ops: activations in %s are not supported", pl_dtype_name(act));
    return act == DT_BF16 ? &cuda_ops_bf16 : act == DT_F16 ? &cuda_ops_f16 : &cuda_ops_f32;
}
