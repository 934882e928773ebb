/* ops.cu - the CUDA backend: its op tables (the model's op sequence on one GPU, one table
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
 * Each opened backend (k_cuda_open: one per tensor-parallel rank, rank r on device r) owns
 * its state (KernelOps.state): its streams, its cuBLASLt gemm and fused projection + norm, its
 * decode-attention workspace, the device copy of copy-on-write pairs, its NCCL communicator and
 * the group's one-shot all-reduce. Its ops run on its streams, so the thread that issues them
 * has its device current (bind). Lazily grown state (gemm heuristics, the attention workspace,
 * the fused projection + norm's partials) must reach its working size before a capture, which
 * the engine's warm-up does.
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

/* Most ranks of one tensor-parallel group. */
enum { MAX_RANKS = 64 };

/* Everything one opened backend (one rank) keeps: KernelOps.state. */
typedef struct {
    cudaStream_t compute_stream, swap_stream;
    cudaEvent_t compute_done, swaps_done;
    int32_t *cow_pairs; /* device copy of copy-on-write pairs */
    int cow_pairs_cap;
    KCudaGemm *gemm;          /* created on first use */
    KCudaProjNorm *proj_norm; /* created on first use */
    void *attn_workspace;     /* decode attention's split, grown on demand */
    size_t attn_workspace_bytes;
    void *comm;       /* ncclComm_t of this rank, NULL alone */
    KCudaArGroup *ar; /* the group's one-shot all-reduce, shared by its ranks; NULL: NCCL */
} CudaState;

static CudaState *st(const KernelOps *ops) {
    return (CudaState *)ops->state;
}

static cudaStream_t stream(const KernelOps *ops) {
    return st(ops)->compute_stream;
}

static KCudaGemm *gemm(const KernelOps *ops) {
    CudaState *s = st(ops);
    if (!s->gemm)
        s->gemm = k_cuda_gemm_create(ops->act == DT_F32 ? GEMM_SCRATCH_ELEMS : 0);
    return s->gemm;
}

static KCudaProjNorm *proj_norm(const KernelOps *ops) {
    CudaState *s = st(ops);
    if (!s->proj_norm)
        s->proj_norm = k_cuda_proj_norm_create();
    return s->proj_norm;
}

static void *ops_alloc(const KernelOps *ops, size_t bytes) {
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

static size_t ops_free_memory(const KernelOps *ops) {
    size_t free_bytes = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    return free_bytes;
}

/* Host source (pageable or pinned): the call returns once the source may be reused. */
static void ops_to_device(const KernelOps *ops, void *dst, const void *src, size_t bytes) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream(ops)));
}

static void ops_to_device_rows(const KernelOps *ops, void *dst, const void *src, size_t pitch,
                               size_t row_bytes, int rows) {
    CUDA_CHECK(cudaMemcpy2DAsync(dst, pitch, src, pitch, row_bytes, (size_t)rows,
                                 cudaMemcpyHostToDevice, stream(ops)));
}

static void ops_to_host(const KernelOps *ops, void *dst, const void *src, size_t bytes) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream(ops)));
    CUDA_CHECK(cudaStreamSynchronize(stream(ops)));
}

static void *ops_alloc_host(const KernelOps *ops, size_t bytes) {
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

static void ops_free_host(const KernelOps *ops, void *p) {
    if (p)
        CUDA_CHECK(cudaFreeHost(p));
}

static void ops_swap_blocks(const KernelOps *ops, void *dst_pool, const void *src_pool,
                            const int32_t *src_dst, int n, size_t block_bytes, int after_compute) {
    if (n <= 0)
        return;
    CudaState *s = st(ops);
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

static void ops_to_host_async(const KernelOps *ops, void *dst, const void *src, size_t bytes) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream(ops)));
}

static void *ops_event_create(const KernelOps *ops) {
    cudaEvent_t ev;
    CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    return (void *)ev;
}

static void ops_event_record(const KernelOps *ops, void *ev) {
    CUDA_CHECK(cudaEventRecord((cudaEvent_t)ev, stream(ops)));
}

static void ops_event_wait(const KernelOps *ops, void *ev) {
    CUDA_CHECK(cudaEventSynchronize((cudaEvent_t)ev));
}

static void ops_event_destroy(const KernelOps *ops, void *ev) {
    if (ev)
        CUDA_CHECK(cudaEventDestroy((cudaEvent_t)ev));
}

static void ops_copy_peer(const KernelOps *ops, void *dst, int dst_device, const void *src,
                          size_t bytes) {
    CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device, src, ops->device, bytes, stream(ops)));
}

static void ops_stream_wait(const KernelOps *ops, void *ev) {
    CUDA_CHECK(cudaStreamWaitEvent(stream(ops), (cudaEvent_t)ev, 0));
}

static void ops_scatter_tokens(const KernelOps *ops, int32_t *tokens, const int32_t *sampled,
                               const int32_t *pairs, int n) {
    k_cuda_scatter_tokens(tokens, sampled, pairs, n, stream(ops));
}

static void ops_copy_blocks(const KernelOps *ops, void *dst_pool, const void *src_pool,
                            const int32_t *src_dst, int n, size_t block_bytes) {
    CudaState *s = st(ops);
    if (n > s->cow_pairs_cap) {
        CUDA_CHECK(cudaStreamSynchronize(s->compute_stream)); /* the old pairs may be in use */
        k_cuda_free(s->cow_pairs);
        s->cow_pairs_cap = n * 2;
        s->cow_pairs = (int32_t *)k_cuda_malloc((size_t)s->cow_pairs_cap * 2 * sizeof(int32_t));
    }
    ops_to_device(ops, s->cow_pairs, src_dst, (size_t)n * 2 * sizeof(int32_t));
    k_cuda_copy_blocks(dst_pool, src_pool, s->cow_pairs, n, block_bytes, s->compute_stream);
}

template <DType A>
static void ops_embedding(const KernelOps *ops, void *out, const int32_t *ids, int n,
                          const Tensor *t) {
    k_cuda_embedding(out, A, ids, n, t, stream(ops));
}

template <DType A>
static void ops_rmsnorm(const KernelOps *ops, void *out, const void *x, const Tensor *w, int n,
                        int dim, float eps) {
    k_cuda_rmsnorm(out, x, A, w, n, dim, eps, stream(ops));
}

template <DType A>
static void ops_add_rmsnorm(const KernelOps *ops, void *residual, const void *delta, void *out,
                            const Tensor *w, int n, int dim, float eps) {
    k_cuda_add_rmsnorm(residual, delta, out, A, w, n, dim, eps, stream(ops));
}

template <DType A>
static void ops_matmul(const KernelOps *ops, void *out, const void *x, const Tensor *w,
                       const Tensor *bias, int n) {
    k_cuda_matmul(gemm(ops), out, x, A, w, bias, n, stream(ops));
}

template <DType A>
static void ops_matmul_add_rmsnorm(const KernelOps *ops, void *residual, void *normed, void *proj,
                                   const void *x, const Tensor *w, const Tensor *norm_w, int n,
                                   float eps) {
    k_cuda_matmul_add_rmsnorm(proj_norm(ops), gemm(ops), residual, normed, proj, x, A, w, norm_w, n,
                              eps, stream(ops));
}

template <DType A>
static void ops_add_rmsnorm_matmul(const KernelOps *ops, void *out, void *residual,
                                   const void *delta, void *normed, const Tensor *norm_w,
                                   const Tensor *w, const Tensor *bias, int n, float eps) {
    k_cuda_add_rmsnorm_matmul(gemm(ops), out, residual, delta, normed, A, norm_w, w, bias, n, eps,
                              stream(ops));
}

template <DType A>
static void ops_silu_mul_matmul(const KernelOps *ops, void *out, void *act, const void *gate_up,
                                const Tensor *w, int n) {
    k_cuda_silu_mul_matmul(gemm(ops), out, act, gate_up, A, w, n, stream(ops));
}

template <DType A>
static void ops_rope(const KernelOps *ops, void *q, void *k, const int32_t *positions, int n,
                     int nh, int nkv, const Rope *rope) {
    k_cuda_rope(q, k, A, positions, n, nh, nkv, rope, stream(ops));
}

template <DType A>
static void ops_kv_write(const KernelOps *ops, void *kv_cache, const KvLayout *l, int layer,
                         const void *k, const void *v, const int64_t *slot_mapping, int n) {
    k_cuda_kv_write(kv_cache, l, layer, k, v, A, slot_mapping, n, stream(ops));
}

template <DType A>
static void ops_qkv_rope_cache(const KernelOps *ops, void *q_out, void *qkv,
                               const int32_t *positions, const int64_t *slot_mapping, int n, int nh,
                               const Rope *rope, const QkNorm *qk_norm, void *kv_cache,
                               const KvLayout *l, int layer) {
    k_cuda_qkv_rope_cache(q_out, qkv, A, positions, slot_mapping, n, nh, rope, qk_norm, kv_cache, l,
                          layer, stream(ops));
}

template <DType A>
static void ops_matmul_qkv_rope_cache(const KernelOps *ops, void *q_out, void *qkv, void *x,
                                      const AddNormIn *pre, const Tensor *w, const Tensor *bias,
                                      const int32_t *positions, const int64_t *slot_mapping, int n,
                                      int nh, const Rope *rope, const QkNorm *qk_norm,
                                      void *kv_cache, const KvLayout *l, int layer) {
    k_cuda_matmul_qkv_rope_cache(gemm(ops), q_out, qkv, x, pre, A, w, bias, positions, slot_mapping,
                                 n, nh, rope, qk_norm, kv_cache, l, layer, stream(ops));
}

template <DType A>
static size_t ops_moe_workspace_bytes(const KernelOps *ops, int max_rows, int num_experts,
                                      int hidden, int inter, int top_k) {
    return k_cuda_moe_workspace_bytes(A, max_rows, num_experts, hidden, inter, top_k);
}

template <DType A>
static void ops_moe_mlp(const KernelOps *ops, void *out, const void *x, const Tensor *router,
                        const Tensor *gate_up, const Tensor *down, int n, int top_k,
                        int renormalize, void *workspace, size_t workspace_bytes) {
    k_cuda_moe_mlp(out, x, A, router, gate_up, down, n, top_k, renormalize, workspace,
                   workspace_bytes, stream(ops));
}

template <DType A>
static void ops_matmul_silu_mul(const KernelOps *ops, void *out, void *gate_up, const void *x,
                                const Tensor *w, int n) {
    k_cuda_matmul_silu_mul(gemm(ops), out, gate_up, x, A, w, n, stream(ops));
}

template <DType A>
static void attention_decode(const KernelOps *ops, void *out, const void *q, const void *kv_cache,
                             const KvLayout *l, int layer, const AttnBatch *b, int nh, float scale,
                             int window) {
    CudaState *s = st(ops);
    size_t need = k_cuda_attention_workspace_bytes(l, b->num_tokens, nh, b->max_blocks_per_seq);
    if (need > s->attn_workspace_bytes) {
        CUDA_CHECK(cudaStreamSynchronize(stream(ops))); /* the old one may be in use */
        k_cuda_free(s->attn_workspace);
        s->attn_workspace_bytes = need;
        s->attn_workspace = k_cuda_malloc(need);
    }
    k_cuda_attention_decode(out, q, A, kv_cache, l, layer, b, nh, scale, window, s->attn_workspace,
                            s->attn_workspace_bytes, stream(ops));
}

/* Single-row sequences take the decode kernel, prompt chunks the prefill kernel: a batch
 * whose first num_decode_seqs sequences are decodes is split into those two views (both
 * kernels are exact for any batch; each is fast for its own kind). */
template <DType A>
static void ops_attention(const KernelOps *ops, void *out, const void *q, const void *kv_cache,
                          const KvLayout *l, int layer, const AttnBatch *b, int nh, float scale,
                          float softcap, int window) {
    if (softcap > 0) { /* the tuned kernels do not soft-cap (gemma.cu) */
        k_cuda_attention_capped(out, q, A, kv_cache, l, layer, b, nh, scale, softcap, window,
                                stream(ops));
        return;
    }
    int nd = b->num_tokens == b->num_seqs ? b->num_seqs : b->num_decode_seqs;
    if (nd > 0) {
        AttnBatch d = *b;
        d.num_tokens = d.num_seqs = nd;
        attention_decode<A>(ops, out, q, kv_cache, l, layer, &d, nh, scale, window);
    }
    if (nd < b->num_seqs) {
        AttnBatch p = *b;
        p.num_tokens = b->num_tokens - nd;
        p.num_seqs = b->num_seqs - nd;
        p.query_start += nd;
        p.block_tables += (size_t)nd * b->max_blocks_per_seq;
        k_cuda_attention_prefill(out, q, A, kv_cache, l, layer, &p, nh, scale, window, stream(ops));
    }
}

template <DType A>
static void ops_silu_mul(const KernelOps *ops, void *out, const void *gate_up, int n, int dim) {
    k_cuda_silu_mul(out, gate_up, A, n, dim, stream(ops));
}

template <DType A>
static void ops_gelu_tanh_mul(const KernelOps *ops, void *out, const void *gate_up, int n,
                              int dim) {
    k_cuda_gelu_tanh_mul(out, gate_up, A, n, dim, stream(ops));
}

template <DType A> static void ops_scale(const KernelOps *ops, void *x, size_t n, float s) {
    k_cuda_scale(x, A, n, s, stream(ops));
}

static void ops_logits_softcap(const KernelOps *ops, float *logits, size_t n, float cap) {
    k_cuda_logits_softcap(logits, n, cap, stream(ops));
}

template <DType A>
static void ops_gather_rows(const KernelOps *ops, void *out, const void *in, const int32_t *rows,
                            int n, int dim) {
    k_cuda_gather_rows(out, in, rows, A, n, dim, stream(ops));
}

template <DType A>
static void ops_to_f32(const KernelOps *ops, float *out, const void *in, size_t n) {
    k_cuda_to_f32(out, in, A, n, stream(ops));
}

template <DType A>
static void ops_embedding_slice(const KernelOps *ops, void *out, const int32_t *ids, int n,
                                const Tensor *table, int first) {
    k_cuda_embedding_slice(out, A, ids, n, table, first, stream(ops));
}

template <DType A>
static void ops_vocab_logits_f32(const KernelOps *ops, float *out, const void *parts, int n,
                                 int vocab, int shard, int size) {
    k_cuda_vocab_logits_f32(out, parts, A, n, vocab, shard, size, stream(ops));
}

static size_t ops_sample_workspace_bytes(const KernelOps *ops, int max_rows, int vocab,
                                         int max_history) {
    return k_cuda_sample_workspace_bytes(max_rows, vocab, max_history);
}

static void ops_sample_rows(const KernelOps *ops, int32_t *tokens, float *token_logits,
                            float *logits, int n, int vocab, const SampleRow *rows,
                            const int32_t *history, int flags, void *workspace,
                            size_t workspace_bytes) {
    k_cuda_sample(tokens, token_logits, logits, n, vocab, rows, history, flags, workspace,
                  workspace_bytes, stream(ops));
}

static void ops_logprobs(const KernelOps *ops, float *lse, int32_t *top_ids, float *top_logprobs,
                         const float *logits, int n, int vocab, int k) {
    k_cuda_logprobs(lse, top_ids, top_logprobs, logits, n, vocab, k, stream(ops));
}

static void ops_logits_add(const KernelOps *ops, float *logits, int vocab, const LogitEdit *edits,
                           int n) {
    k_cuda_logits_add(logits, vocab, edits, n, stream(ops));
}

static void ops_logits_mask(const KernelOps *ops, float *logits, int vocab, const uint32_t *masks,
                            const int32_t *rows, int n) {
    k_cuda_logits_mask(logits, vocab, masks, rows, n, stream(ops));
}

static void ops_fill_dummy(const KernelOps *ops, void *dst, DType dt, size_t n, uint64_t key,
                           float scale) {
    k_cuda_fill_dummy(dst, dt, n, key, scale, stream(ops));
}

#ifdef PAGELLM_HAVE_NCCL
#define NCCL_CHECK(expr)                                                                           \
    do {                                                                                           \
        ncclResult_t r_ = (expr);                                                                  \
        KC_REQUIRE(r_ == ncclSuccess, "NCCL error in %s: %s", #expr, ncclGetErrorString(r_));      \
    } while (0)

template <DType A> static ncclDataType_t nccl_type(void) {
    return A == DT_BF16 ? ncclBfloat16 : A == DT_F16 ? ncclFloat16 : ncclFloat32;
}

static ncclComm_t comm(const KernelOps *ops) {
    KC_REQUIRE(st(ops)->comm, "tensor parallelism: this backend has no communicator");
    return (ncclComm_t)st(ops)->comm;
}

template <DType A> static void ops_all_reduce(const KernelOps *ops, void *buf, size_t count) {
    if (k_cuda_ar_fits(st(ops)->ar, buf, count * pl_dtype_size(A), 0, A)) {
        k_cuda_ar_sum(st(ops)->ar, ops->rank, buf, A, count, stream(ops));
        return;
    }
    NCCL_CHECK(ncclAllReduce(buf, buf, count, nccl_type<A>(), ncclSum, comm(ops), stream(ops)));
}

template <DType A>
static void ops_all_reduce_add_rmsnorm(const KernelOps *ops, void *residual, void *delta, void *out,
                                       const Tensor *w, int n, int dim, float eps) {
    if (k_cuda_ar_fits(st(ops)->ar, delta, (size_t)n * dim * pl_dtype_size(A), dim, A)) {
        k_cuda_ar_add_rmsnorm(st(ops)->ar, ops->rank, residual, delta, out, A, w, n, dim, eps,
                              stream(ops));
        return;
    }
    ops_all_reduce<A>(ops, delta, (size_t)n * dim);
    k_cuda_add_rmsnorm(residual, delta, out, A, w, n, dim, eps, stream(ops));
}

template <DType A>
static void ops_all_gather(const KernelOps *ops, void *out, const void *in, size_t count) {
    NCCL_CHECK(ncclAllGather(in, out, count, nccl_type<A>(), comm(ops), stream(ops)));
}
#endif

static void ops_graph_begin(const KernelOps *ops) {
    CUDA_CHECK(cudaStreamBeginCapture(stream(ops), cudaStreamCaptureModeThreadLocal));
}

static void *ops_graph_end(const KernelOps *ops) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamEndCapture(stream(ops), &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_CHECK(cudaGraphDestroy(graph));
    return exec;
}

static void ops_graph_launch(const KernelOps *ops, void *graph) {
    CUDA_CHECK(cudaGraphLaunch((cudaGraphExec_t)graph, stream(ops)));
}

static void ops_graph_destroy(const KernelOps *ops, void *graph) {
    if (graph)
        CUDA_CHECK(cudaGraphExecDestroy((cudaGraphExec_t)graph));
}

static void ops_bind(const KernelOps *ops) {
    CUDA_CHECK(cudaSetDevice(ops->device));
}

static void ops_free(const KernelOps *ops, void *p) {
    k_cuda_free(p);
}

static void ops_synchronize(const KernelOps *ops) {
    CUDA_CHECK(cudaStreamSynchronize(stream(ops)));
}

template <DType A> static KernelOps make_ops(void) {
    KernelOps o;
    memset(&o, 0, sizeof o);
    o.name = "cuda";
    o.act = A;
    o.size = 1;
    o.max_top_logprobs = KC_MAX_TOP_LOGPROBS;
    o.host_memory = 0;
    o.alloc = ops_alloc;
    o.free = ops_free;
    o.to_device = ops_to_device;
    o.to_device_rows = ops_to_device_rows;
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
    o.gelu_tanh_mul = ops_gelu_tanh_mul<A>;
    o.scale = ops_scale<A>;
    o.logits_softcap = ops_logits_softcap;
    o.matmul_qkv_rope_cache = ops_matmul_qkv_rope_cache<A>;
    o.fused_fp8_max_rows = 1; /* gemv_fp8.cuh's one-row GEMV */
    o.matmul_silu_mul = ops_matmul_silu_mul<A>;
    o.matmul_add_rmsnorm = ops_matmul_add_rmsnorm<A>;
    o.add_rmsnorm_matmul = ops_add_rmsnorm_matmul<A>;
    o.silu_mul_matmul = ops_silu_mul_matmul<A>;
    o.moe_workspace_bytes = ops_moe_workspace_bytes<A>;
    o.moe_mlp = ops_moe_mlp<A>;
    o.gather_rows = ops_gather_rows<A>;
    o.to_f32 = ops_to_f32<A>;
    o.embedding_slice = ops_embedding_slice<A>;
    o.vocab_logits_f32 = ops_vocab_logits_f32<A>;
    o.copy_blocks = ops_copy_blocks;
    o.sample_workspace_bytes = ops_sample_workspace_bytes;
    o.sample_rows = ops_sample_rows;
    o.logprobs = ops_logprobs;
    o.logits_add = ops_logits_add;
    o.logits_mask = ops_logits_mask;
    o.fill_dummy = ops_fill_dummy;
#ifdef PAGELLM_HAVE_NCCL
    o.all_reduce = ops_all_reduce<A>;
    o.all_reduce_add_rmsnorm = ops_all_reduce_add_rmsnorm<A>;
    o.all_gather = ops_all_gather<A>;
#endif
    o.bind = ops_bind;
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

/* One rank's state on device `device` (made current). */
static CudaState *state_create(int device) {
    CUDA_CHECK(cudaSetDevice(device));
    CudaState *s = (CudaState *)pl_xcalloc(1, sizeof *s);
    CUDA_CHECK(cudaStreamCreate(&s->compute_stream));
    CUDA_CHECK(cudaStreamCreate(&s->swap_stream));
    CUDA_CHECK(cudaEventCreateWithFlags(&s->compute_done, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&s->swaps_done, cudaEventDisableTiming));
    return s;
}

static void state_destroy(KernelOps *ops) {
    CudaState *s = st(ops);
    CUDA_CHECK(cudaSetDevice(ops->device));
    CUDA_CHECK(cudaDeviceSynchronize());
    k_cuda_gemm_destroy(s->gemm);
    k_cuda_proj_norm_destroy(s->proj_norm);
    k_cuda_free(s->attn_workspace);
    k_cuda_free(s->cow_pairs);
#ifdef PAGELLM_HAVE_NCCL
    if (s->comm)
        NCCL_CHECK(ncclCommDestroy((ncclComm_t)s->comm));
#endif
    CUDA_CHECK(cudaEventDestroy(s->compute_done));
    CUDA_CHECK(cudaEventDestroy(s->swaps_done));
    CUDA_CHECK(cudaStreamDestroy(s->compute_stream));
    CUDA_CHECK(cudaStreamDestroy(s->swap_stream));
    free(s);
    free(ops);
}

/* The group's communicators (NCCL, one per device) and one-shot all-reduce. */
static Status open_group(const KernelOpenOptions *o, KernelOps **ranks) {
#ifdef PAGELLM_HAVE_NCCL
    ncclComm_t comms[MAX_RANKS];
    int ids[MAX_RANKS];
    for (int i = 0; i < o->size; i++)
        ids[i] = i;
    ncclResult_t r = ncclCommInitAll(comms, o->size, ids);
    if (r != ncclSuccess)
        return pl_error_set(PL_ERR_UNSUPPORTED, "tensor-parallel-size %d: NCCL setup failed: %s",
                            o->size, ncclGetErrorString(r));
    KCudaArGroup *ar = o->custom_all_reduce ? k_cuda_ar_create(o->size) : NULL;
    for (int i = 0; i < o->size; i++) {
        st(ranks[i])->comm = comms[i];
        st(ranks[i])->ar = ar;
    }
    return PL_OK;
#else
    return pl_error_set(PL_ERR_UNSUPPORTED,
                        "tensor-parallel-size %d needs NCCL, which this build has not (configure "
                        "found no nccl.h / libnccl)",
                        o->size);
#endif
}

/* The op table of the options' activation dtype, or NULL (with the error set) for one the cuda
 * backend has not. */
static const KernelOps *ops_table(const KernelOpenOptions *o) {
    if (o->act == DT_BF16)
        return &cuda_ops_bf16;
    if (o->act == DT_F16)
        return &cuda_ops_f16;
    if (o->act == DT_F32)
        return &cuda_ops_f32;
    pl_error_set(PL_ERR_UNSUPPORTED, "the cuda backend has no %s activations",
                 pl_dtype_name(o->act));
    return NULL;
}

static KernelOps *rank_create(const KernelOps *table, int rank, int size, int device) {
    KernelOps *k = (KernelOps *)pl_xmalloc(sizeof *k);
    *k = *table;
    k->rank = rank;
    k->device = device;
    k->size = size;
    k->state = state_create(device);
    return k;
}

Status k_cuda_open(const KernelOpenOptions *o, KernelOps **ranks) {
    const KernelOps *table = ops_table(o);
    if (!table)
        return PL_ERR_UNSUPPORTED;
    int have = k_cuda_device_count();
    if (have < 1)
        return pl_error_set(PL_ERR_UNSUPPORTED, "the cuda backend: no CUDA GPU is visible");
    if (o->size > have || o->size > MAX_RANKS)
        return pl_error_set(PL_ERR_INVALID, "tensor-parallel-size %d needs %d GPUs; %d visible",
                            o->size, o->size, have);
    for (int i = 0; i < o->size; i++)
        ranks[i] = rank_create(table, i, o->size, i);
    Status rc = o->size > 1 ? open_group(o, ranks) : PL_OK;
    if (rc != PL_OK) {
        for (int i = 0; i < o->size; i++)
            state_destroy(ranks[i]);
        memset(ranks, 0, (size_t)o->size * sizeof *ranks);
    }
    CUDA_CHECK(cudaSetDevice(0)); /* the caller drives rank 0 */
    return rc;
}

#ifdef PAGELLM_HAVE_NCCL
static_assert(sizeof(ncclUniqueId) == K_CUDA_GROUP_ID_BYTES, "NCCL's unique id size changed");

Status k_cuda_group_id(void *id) {
    ncclResult_t r = ncclGetUniqueId((ncclUniqueId *)id);
    if (r != ncclSuccess)
        return pl_error_set(PL_ERR_IO, "NCCL could not make a group id: %s", ncclGetErrorString(r));
    return PL_OK;
}

Status k_cuda_open_rank(const KernelOpenOptions *o, int rank, int device, const void *group_id,
                        KernelOps **out) {
    const KernelOps *table = ops_table(o);
    if (!table)
        return PL_ERR_UNSUPPORTED;
    KernelOps *k = rank_create(table, rank, o->size, device);
    ncclUniqueId id;
    memcpy(&id, group_id, sizeof id);
    ncclComm_t c = NULL;
    ncclResult_t r = ncclCommInitRank(&c, o->size, id, rank);
    if (r != ncclSuccess) {
        state_destroy(k);
        return pl_error_set(PL_ERR_UNSUPPORTED,
                            "rank %d (GPU %d): joining the NCCL group of %d ranks failed: %s", rank,
                            device, o->size, ncclGetErrorString(r));
    }
    st(k)->comm = c; /* no one-shot all-reduce: its peer memory is one process's */
    *out = k;
    return PL_OK;
}
#else
static Status no_nccl(void) {
    return pl_error_set(PL_ERR_UNSUPPORTED, "the cuda backend under MPI needs NCCL, which this "
                                            "build has not (configure found no nccl.h / libnccl)");
}

Status k_cuda_group_id(void *id) {
    return no_nccl();
}

Status k_cuda_open_rank(const KernelOpenOptions *o, int rank, int device, const void *group_id,
                        KernelOps **out) {
    return no_nccl();
}
#endif

void k_cuda_close(KernelOps **ranks, int size) {
    KCudaArGroup *ar = size > 0 && ranks[0] ? st(ranks[0])->ar : NULL;
    for (int i = 0; i < size; i++)
        if (ranks[i])
            state_destroy(ranks[i]);
    k_cuda_ar_destroy(ar);
}
