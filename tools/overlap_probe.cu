/* overlap_probe.cu - whether the H200 can hide a decode step's attention behind the Llama-3-8B
 * decode GEMMs, and whether cuBLASLt's algorithm choice for those GEMMs leaves time on the table.
 * Not part of the build; on a GPU host:
 *
 *   nvcc -O3 -arch=sm_90 -std=c++17 -o /tmp/overlap_probe tools/overlap_probe.cu -lcublasLt -lcuda
 *   /tmp/overlap_probe [gemm|cold|overlap|pipe|power]  (no argument: all five, in this order)
 *
 * GEMMs: cuBLASLt bf16 D [N, rows] = W [N, K] x X [K, rows] (W transposed, fp32 compute, 64 MiB
 * workspace) at qkv (N 6144, K 4096), o (4096, 4096), gate-up (28672, 4096), down (4096, 14336)
 * and lm-head (128256, 4096). In every mode W and X are random bf16 bits (random sign and 7-bit
 * mantissa, exponent field 0x7a minus 0..3: magnitudes 2^-8 to 2^-4), not a constant fill, as
 * tensor-core power, and so clocks, depend on the bits. GEMM timings follow 3 warm-up calls.
 *
 * gemm     Do split-K variants help at 256 and 400 rows? Per shape, up to 8 heuristic offers (30
 *          calls each), then, for each of the first 6 offers that can split K, split-K 2..4 with
 *          each reduction scheme it allows (if cublasLtMatmulAlgoCheck accepts the variant
 *          within the workspace). Prints every configuration and the best time.
 * cold     Would tuning on L2-warm weights pick differently? Each offer (up to 8), all shapes but
 *          lm-head, 256, 400 and 64 rows: 24 calls on one weight copy (warm) and rotating through
 *          copies past 300 MiB (at most 12), more than the 50-60 MB L2 holds (cold).
 * overlap  Do a memory-bound attention-like kernel and the qkv + o GEMMs (256 rows, first offer)
 *          overlap? The kernel streams one layer's K/V at batch 256, context 1072 (1.124 GB) in
 *          2048 blocks (8 KV heads x 256 rows) of 128 threads, each block a contiguous chunk, 4
 *          evict-first 16-byte loads in flight per thread. Each alone, serial on one stream, on
 *          two streams (GEMMs launched second, then first); then green contexts giving the GEMMs
 *          16, 24, 32 or 48 SMs and the kernel the rest: each alone, concurrent, and whether the
 *          pair captures into a CUDA graph. Two rounds, 10 repetitions per timing.
 * pipe     Does pipelining by KV-head group help? One layer's qkv -> attention-like -> o, serial
 *          vs in G = 1, 2, 4, 8 head groups on two streams: group g's qkv slice (N 6144/G), its
 *          attention (2048/G blocks) on the other stream after an event, then its share of o as
 *          split-K (K 4096/G, beta 1 after the first) back on the GEMM stream. Priorities equal,
 *          GEMM stream high, attention stream high. Two rounds, 20 layers per timing.
 * power    Which work meets the board's power limit? Each for 4 s, then 2 s idle: the
 *          attention-like kernel alone (random K/V), the layer's four GEMMs at 256 rows (qkv, o,
 *          gate-up, down; weights alternating between two copies, 0.87 GB), and both as a layer
 *          (attention, then the GEMMs). Prints each phase's wall-clock span (CLOCK_REALTIME) and
 *          its time per call at the start and in its last second; run `nvidia-smi
 *          --query-gpu=timestamp,power.draw,clocks.sm --format=csv -lms 50` beside it to read the
 *          power and clock of each span. */
#include <cublasLt.h>
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <unistd.h>
#include <vector>

/* why a call failed, or null: runtime, cuBLASLt and driver results, or a helper's own text */
static const char *why(cudaError_t e) {
    return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}
static const char *why(cublasStatus_t s) {
    return s == CUBLAS_STATUS_SUCCESS ? nullptr : cublasLtGetStatusString(s);
}
static const char *why(CUresult r) {
    const char *m;
    return r == CUDA_SUCCESS ? nullptr : cuGetErrorString(r, &m) ? "driver error" : m;
}
static const char *why(const char *e) {
    return e;
}
#define CK(x)                                                                                      \
    do {                                                                                           \
        if (const char *why_ = why(x)) {                                                           \
            printf("%s at line %d: %s\n", #x, __LINE__, why_);                                     \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

constexpr size_t WS_BYTES = 64u << 20;
constexpr int HIDDEN = 4096, QKV_N = 6144, BATCH = 256, OFFERS = 8, REPS = 10;
constexpr size_t KV_BYTES = (size_t)BATCH * 1072 * 4096; /* one layer's K/V, context 1072 */
constexpr int ATT_BLOCKS = 8 * BATCH, ATT_THREADS = 128;
constexpr size_t ATT_CHUNK = KV_BYTES / 16 / ATT_BLOCKS; /* uint4 per block */

static const struct Shape {
    const char *name;
    int n, k;
} SHAPES[] = {{"qkv", QKV_N, HIDDEN},
              {"o", HIDDEN, HIDDEN},
              {"gate-up", 28672, HIDDEN},
              {"down", HIDDEN, 14336},
              {"lm-head", 128256, HIDDEN}};

static cublasLtHandle_t lt;
static void *ws;
static cudaEvent_t ev[5];
static cudaEvent_t qkv_done[8], att_done[8], layer_done; /* pipe's joins, per head group */

/* bf16 bits: random sign and mantissa, exponent field 0x7a minus 0..3 (2^-8 <= |v| < 2^-4) */
__global__ void fill_rand(uint16_t *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        const uint32_t exponent = 0x7a - ((h >> 8) & 3);
        p[i] = (uint16_t)(((h >> 31) << 15) | (exponent << 7) | (h & 0x7f));
    }
}

/* block b streams chunk b (one (row, KV head) pair's K and V); the sum keeps the loads live */
__global__ __launch_bounds__(ATT_THREADS) void attention_like(const uint4 *kv, size_t chunk,
                                                              float *sink) {
    const uint4 *q = kv + blockIdx.x * chunk;
    float acc = 0;
    for (size_t i = threadIdx.x; i < chunk; i += 4 * ATT_THREADS) {
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; u++)
            v[u] = i + u * ATT_THREADS < chunk ? __ldcs(q + i + u * ATT_THREADS) : uint4{};
#pragma unroll
        for (int u = 0; u < 4; u++)
            acc += __uint_as_float(v[u].x) + __uint_as_float(v[u].w);
    }
    if (acc == 123.456f)
        *sink = acc;
}

static void *dev_alloc(size_t bytes) {
    void *p;
    CK(cudaMalloc(&p, bytes));
    return p;
}

static void *dev_rand(size_t elems, uint32_t seed) {
    void *p = dev_alloc(elems * 2);
    fill_rand<<<4096, 256>>>((uint16_t *)p, elems, seed);
    CK(cudaGetLastError());
    return p;
}

static float elapsed_us(cudaEvent_t a, cudaEvent_t b, int reps) {
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    return ms * 1000 / reps;
}

/* us per call of body(), called reps times on s between two events */
template <class F> static float span_us(cudaStream_t s, int reps, F body) {
    CK(cudaEventRecord(ev[0], s));
    for (int i = 0; i < reps; i++)
        body();
    CK(cudaEventRecord(ev[1], s));
    CK(cudaEventSynchronize(ev[1]));
    return elapsed_us(ev[0], ev[1], reps);
}

/* D [n, rows] = W [n, k] (transposed; row stride lda, default k) x X [k, rows] (column stride
 * ldb); algo: the first offer */
struct Gemm {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;

    Gemm(int n, int k, int rows, int ldb, int lda = 0) {
        const int32_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        CK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
        CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
        CK(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, k, n, lda ? lda : k));
        CK(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, k, rows, ldb));
        CK(cublasLtMatrixLayoutCreate(&c, CUDA_R_16BF, n, rows, n));
        cublasLtMatmulHeuristicResult_t first;
        CK(offers(&first, 1) ? nullptr : "no cuBLASLt algorithm");
        algo = first.algo;
    }
    Gemm(const Gemm &) = delete;
    ~Gemm() {
        CK(cublasLtMatrixLayoutDestroy(a));
        CK(cublasLtMatrixLayoutDestroy(b));
        CK(cublasLtMatrixLayoutDestroy(c));
        CK(cublasLtMatmulDescDestroy(op));
    }

    /* cuBLASLt's heuristic offers within the workspace, best first */
    int offers(cublasLtMatmulHeuristicResult_t *r, int max) const {
        cublasLtMatmulPreference_t pref;
        const uint64_t limit = WS_BYTES;
        CK(cublasLtMatmulPreferenceCreate(&pref));
        CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &limit, sizeof limit));
        int found = 0, n = 0;
        CK(cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, c, c, pref, max, r, &found));
        CK(cublasLtMatmulPreferenceDestroy(pref));
        for (int i = 0; i < found; i++)
            if (r[i].state == CUBLAS_STATUS_SUCCESS)
                r[n++] = r[i];
        return n;
    }

    cublasStatus_t run(const void *w, const void *x, void *d, cudaStream_t s, float beta = 0,
                       const cublasLtMatmulAlgo_t *with = nullptr) const {
        const float alpha = 1;
        return cublasLtMatmul(lt, op, &alpha, w, a, x, b, &beta, d, c, d, c, with ? with : &algo,
                              ws, WS_BYTES, s);
    }
};

template <class T>
static T config(const cublasLtMatmulAlgo_t *a, cublasLtMatmulAlgoConfigAttributes_t attr) {
    T v{};
    size_t n;
    CK(cublasLtMatmulAlgoConfigGetAttribute(a, attr, &v, sizeof v, &n));
    return v;
}

/* ends a line with the algorithm's configuration */
static void print_config(const cublasLtMatmulAlgo_t *a) {
    printf("id %d tile %u stages %u splitk %d red %u swz %u cluster %u\n",
           config<int32_t>(a, CUBLASLT_ALGO_CONFIG_ID),
           config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_TILE_ID),
           config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_STAGES_ID),
           config<int32_t>(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
           config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
           config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
           (unsigned)config<uint16_t>(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID));
}

/* us per call over reps calls on the legacy stream after 3 warm-ups, the weights rotating through
 * w[0..copies); -1 when the algorithm does not run */
static float time_algo(const Gemm &g, const cublasLtMatmulAlgo_t *algo, void *const *w, int copies,
                       const void *x, void *d, int reps) {
    for (int i = 0; i < 3; i++)
        if (g.run(w[0], x, d, 0, 0, algo) != CUBLAS_STATUS_SUCCESS)
            return -1;
    int i = 0;
    return span_us(0, reps, [&] { CK(g.run(w[i++ % copies], x, d, 0, 0, algo)); });
}

/* the offer with split-K 2..4 and each reduction scheme it supports, where cuBLASLt accepts the
 * result within the workspace; none if the offer cannot split K */
static std::vector<cublasLtMatmulAlgo_t> split_variants(const Gemm &g,
                                                        const cublasLtMatmulAlgo_t &offer) {
    int32_t splits;
    uint32_t schemes;
    size_t size;
    CK(cublasLtMatmulAlgoCapGetAttribute(&offer, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &splits,
                                         sizeof splits, &size));
    CK(cublasLtMatmulAlgoCapGetAttribute(&offer, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &schemes,
                                         sizeof schemes, &size));
    std::vector<cublasLtMatmulAlgo_t> out;
    if (!splits)
        return out;
    for (int32_t split = 2; split <= 4; split++)
        for (uint32_t scheme = 1; scheme <= 4; scheme <<= 1) {
            if (!(schemes & scheme))
                continue;
            cublasLtMatmulAlgo_t a = offer;
            CK(cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split,
                                                    sizeof split));
            CK(cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                                                    &scheme, sizeof scheme));
            cublasLtMatmulHeuristicResult_t check; /* a refusal only drops the variant */
            if (cublasLtMatmulAlgoCheck(lt, g.op, g.a, g.b, g.c, g.c, &a, &check) ==
                    CUBLAS_STATUS_SUCCESS &&
                check.workspaceSize <= WS_BYTES)
                out.push_back(a);
        }
    return out;
}

static void gemm_shape(const Shape &s, int rows, void *w, const void *x, void *d) {
    const Gemm g(s.n, s.k, rows, s.k);
    cublasLtMatmulHeuristicResult_t r[OFFERS];
    const int n = g.offers(r, OFFERS);
    const double flop = 2.0 * s.n * s.k * rows;
    printf("== %s N %d K %d rows %d: floor %.1f us at 763 TFLOP/s, %d offers\n", s.name, s.n, s.k,
           rows, flop / 763e12 * 1e6, n);
    float best = -1;
    auto measure = [&](const cublasLtMatmulAlgo_t *a, const char *kind, int i) {
        const float us = time_algo(g, a, &w, 1, x, d, 30);
        printf("  %-8s %d %8.1f us %6.1f TF/s  ", kind, i, us, us > 0 ? flop / us / 1e6 : 0);
        print_config(a);
        if (us > 0 && (best < 0 || us < best))
            best = us;
    };
    for (int i = 0; i < n; i++)
        measure(&r[i].algo, "offer", i);
    for (int i = 0; i < std::min(n, 6); i++)
        for (const cublasLtMatmulAlgo_t &a : split_variants(g, r[i].algo))
            measure(&a, "split of", i);
    printf("  BEST %s rows %d: %.1f us\n", s.name, rows, best);
}

static void gemm_mode() {
    void *w = dev_rand((size_t)128256 * HIDDEN, 77), *x = dev_rand((size_t)400 * 14336, 5);
    void *d = dev_alloc((size_t)400 * 128256 * 2);
    for (int rows : {256, 400})
        for (const Shape &s : SHAPES)
            gemm_shape(s, rows, w, x, d);
    for (void *p : {w, x, d})
        CK(cudaFree(p));
}

static void cold_shape(const Shape &s, int rows, const void *x, void *d) {
    const Gemm g(s.n, s.k, rows, s.k);
    cublasLtMatmulHeuristicResult_t r[OFFERS];
    const int n = g.offers(r, OFFERS);
    const size_t bytes = (size_t)s.n * s.k * 2;
    const int copies = std::min(12, (int)((300u << 20) / bytes) + 1);
    std::vector<void *> w(copies);
    for (int c = 0; c < copies; c++)
        w[c] = dev_rand(bytes / 2, 77 + c);
    printf("== cold %s N %d K %d rows %d: %d copies of %.1f MB\n", s.name, s.n, s.k, rows, copies,
           bytes / 1e6);
    for (int i = 0; i < n; i++) {
        const float warm = time_algo(g, &r[i].algo, w.data(), 1, x, d, 24);
        const float cold = time_algo(g, &r[i].algo, w.data(), copies, x, d, 24);
        printf("  offer %d warm %7.1f us cold %7.1f us (%5.1f TF/s)  ", i, warm, cold,
               cold > 0 ? 2.0 * s.n * s.k * rows / cold / 1e6 : 0);
        print_config(&r[i].algo);
    }
    for (void *p : w)
        CK(cudaFree(p));
}

static void cold_mode() {
    void *x = dev_rand((size_t)400 * 14336, 5), *d = dev_alloc((size_t)400 * 28672 * 2);
    for (int rows : {256, 400, 64})
        for (const Shape &s : SHAPES)
            if (strcmp(s.name, "lm-head"))
                cold_shape(s, rows, x, d);
    CK(cudaFree(x));
    CK(cudaFree(d));
}

/* one layer at batch 256: the qkv and o GEMMs and the K/V that the attention-like kernel streams */
struct Layer {
    const Gemm qkv{QKV_N, HIDDEN, BATCH, HIDDEN}, o{HIDDEN, HIDDEN, BATCH, HIDDEN};
    void *const w_qkv = dev_rand((size_t)QKV_N * HIDDEN, 77);
    void *const w_o = dev_rand((size_t)HIDDEN * HIDDEN, 78);
    void *const x = dev_rand((size_t)BATCH * HIDDEN, 5);
    char *const d = (char *)dev_alloc((size_t)BATCH * (QKV_N + HIDDEN) * 2);
    char *const o_out = d + (size_t)BATCH * QKV_N * 2;
    uint4 *const kv = (uint4 *)dev_alloc(KV_BYTES);
    float *const sink = (float *)dev_alloc(sizeof(float));

    Layer() {
        CK(cudaMemset(kv, 1, KV_BYTES));
    }
    ~Layer() {
        for (void *p : {w_qkv, w_o, x, (void *)d, (void *)kv, (void *)sink})
            CK(cudaFree(p));
    }

    const char *gemms(cudaStream_t s) const {
        const char *e = why(qkv.run(w_qkv, x, d, s));
        return e ? e : why(o.run(w_o, x, o_out, s));
    }
    /* head group g of G: blocks [g * 2048 / G, (g + 1) * 2048 / G) */
    const char *attention(cudaStream_t s, int g = 0, int G = 1) const {
        const int blocks = ATT_BLOCKS / G;
        attention_like<<<blocks, ATT_THREADS, 0, s>>>(kv + (size_t)g * blocks * ATT_CHUNK,
                                                      ATT_CHUNK, sink);
        return why(cudaGetLastError());
    }
};

/* us per concurrent pair: attention on sa, GEMMs on sg, each pair starting together */
static float pair_us(const Layer &l, cudaStream_t sa, cudaStream_t sg, bool gemms_first) {
    CK(cudaEventRecord(ev[0], sa));
    CK(cudaStreamWaitEvent(sg, ev[0]));
    for (int i = 0; i < REPS; i++) {
        if (gemms_first)
            CK(l.gemms(sg));
        CK(l.attention(sa));
        if (!gemms_first)
            CK(l.gemms(sg));
        CK(cudaEventRecord(ev[2], sg));
        CK(cudaStreamWaitEvent(sa, ev[2]));
        CK(cudaEventRecord(ev[3], sa));
        CK(cudaStreamWaitEvent(sg, ev[3]));
    }
    CK(cudaEventRecord(ev[1], sa));
    CK(cudaEventSynchronize(ev[1]));
    return elapsed_us(ev[0], ev[1], REPS);
}

/* alone, serial and concurrent; s1 stays busy from one timing into the next */
static void plain_round(const Layer &l, int round, cudaStream_t s1, cudaStream_t s2) {
    CK(l.attention(s1));
    CK(cudaEventRecord(ev[0], s1));
    for (int i = 0; i < REPS; i++)
        CK(l.attention(s1));
    CK(cudaEventRecord(ev[1], s1));
    CK(l.gemms(s1));
    CK(cudaEventRecord(ev[2], s1));
    for (int i = 0; i < REPS; i++)
        CK(l.gemms(s1));
    CK(cudaEventRecord(ev[3], s1));
    for (int i = 0; i < REPS; i++) {
        CK(l.attention(s1));
        CK(l.gemms(s1));
    }
    CK(cudaEventRecord(ev[4], s1));
    CK(cudaEventSynchronize(ev[4]));
    const float att = elapsed_us(ev[0], ev[1], REPS);
    printf("round %d: attention-like alone %.1f us (%.2f TB/s), qkv+o alone %.1f us, serial "
           "%.1f us\n",
           round, att, KV_BYTES / att / 1e6, elapsed_us(ev[2], ev[3], REPS),
           elapsed_us(ev[3], ev[4], REPS));
    const float second = pair_us(l, s1, s2, false), first = pair_us(l, s1, s2, true);
    printf("round %d: two streams %.1f us per pair (GEMMs launched second), %.1f us (first)\n",
           round, second, first);
}

/* whether one concurrent pair on the green streams captures into a graph; if so, its time when
 * launched on a plain stream */
static void graph_probe(const Layer &l, cudaStream_t sa, cudaStream_t sg, cudaStream_t plain) {
    cudaGraph_t graph = nullptr;
    const char *e = why(cudaStreamBeginCapture(sa, cudaStreamCaptureModeGlobal));
    if (!e) {
        auto step = [&](const char *s) { e = e ? e : s; }; /* keeps the first error */
        step(why(cudaEventRecord(ev[2], sa)));
        step(why(cudaStreamWaitEvent(sg, ev[2])));
        step(l.attention(sa));
        step(l.gemms(sg));
        step(why(cudaEventRecord(ev[3], sg)));
        step(why(cudaStreamWaitEvent(sa, ev[3])));
        step(why(cudaStreamEndCapture(sa, &graph)));
    }
    if (e) {
        printf("  green graph capture failed: %s\n", e);
        (void)cudaGetLastError(); /* clears the capture's error */
    } else {
        cudaGraphExec_t exec;
        CK(cudaGraphInstantiate(&exec, graph, 0));
        CK(cudaGraphLaunch(exec, plain));
        const float us = span_us(plain, REPS, [&] { CK(cudaGraphLaunch(exec, plain)); });
        printf("  green graph, launched on a plain stream: %.1f us per pair\n", us);
        CK(cudaGraphExecDestroy(exec));
    }
    if (graph)
        CK(cudaGraphDestroy(graph));
}

/* the GEMMs in a green context of gemm_sms SMs, the attention-like kernel in one of the rest */
static void green_split(const Layer &l, CUdevice dev, const CUdevResource &all, unsigned gemm_sms,
                        cudaStream_t plain) {
    CUdevResource part[2];
    unsigned groups = 1;
    const char *e =
        why(cuDevSmResourceSplitByCount(&part[0], &groups, &all, &part[1], 0, gemm_sms));
    if (e || groups < 1) {
        printf("split of %u SMs failed: %s\n", gemm_sms, e ? e : "no group");
        return;
    }
    CUgreenCtx ctx[2];
    CUstream cs[2];
    for (int i = 0; i < 2; i++) {
        CUdevResourceDesc desc;
        CK(cuDevResourceGenerateDesc(&desc, &part[i], 1));
        CK(cuGreenCtxCreate(&ctx[i], desc, dev, CU_GREEN_CTX_DEFAULT_STREAM));
        CK(cuGreenCtxStreamCreate(&cs[i], ctx[i], CU_STREAM_NON_BLOCKING, 0));
    }
    const cudaStream_t sg = (cudaStream_t)cs[0], sa = (cudaStream_t)cs[1];
    for (int round = 0; round < 2; round++) {
        CK(cudaDeviceSynchronize());
        CK(l.attention(sa));
        CK(l.gemms(sg));
        CK(cudaDeviceSynchronize());
        const float att = span_us(sa, REPS, [&] { CK(l.attention(sa)); });
        const float gemms = span_us(sg, REPS, [&] { CK(l.gemms(sg)); });
        const float pair = pair_us(l, sa, sg, false);
        printf("green %u GEMM SMs / %u attention SMs, round %d: attention-like alone %.1f us "
               "(%.2f TB/s), qkv+o alone %.1f us, concurrent %.1f us per pair\n",
               part[0].sm.smCount, part[1].sm.smCount, round, att, KV_BYTES / att / 1e6, gemms,
               pair);
    }
    graph_probe(l, sa, sg, plain);
    for (int i = 0; i < 2; i++) {
        CK(cuStreamSynchronize(cs[i]));
        CK(cuStreamDestroy(cs[i]));
        CK(cuGreenCtxDestroy(ctx[i]));
    }
}

static void overlap_mode() {
    const Layer l;
    cudaStream_t s1, s2;
    CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    for (int round = 0; round < 2; round++)
        plain_round(l, round, s1, s2);
    CUdevice dev;
    CUdevResource all;
    CK(cuDeviceGet(&dev, 0));
    CK(cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM));
    printf("green contexts: %u SMs to split\n", all.sm.smCount);
    for (unsigned gemm_sms : {16u, 24u, 32u, 48u})
        green_split(l, dev, all, gemm_sms, s1);
    CK(cudaStreamDestroy(s1));
    CK(cudaStreamDestroy(s2));
}

/* one layer in G head groups: group g's qkv slice on sg; its attention on sa once that is done;
 * then, back on sg, its share of o as split-K: X columns [g * 4096 / G, (g + 1) * 4096 / G)
 * (ldb 4096) times the o weights' same columns (lda 4096), added to the output after group 0 */
static void pipe_layer(const Layer &l, int G, const Gemm &qkv, const Gemm &o, cudaStream_t sg,
                       cudaStream_t sa) {
    auto o_part = [&](int g) {
        CK(cudaStreamWaitEvent(sg, att_done[g]));
        const size_t k0 = (size_t)g * HIDDEN / G;
        CK(o.run((char *)l.w_o + k0 * 2, (char *)l.x + k0 * 2, l.o_out, sg, g > 0 ? 1.f : 0.f));
    };
    const size_t n = QKV_N / G;
    for (int g = 0; g < G; g++) {
        CK(qkv.run((char *)l.w_qkv + g * n * HIDDEN * 2, l.x, l.d + g * n * BATCH * 2, sg));
        CK(cudaEventRecord(qkv_done[g], sg));
        CK(cudaStreamWaitEvent(sa, qkv_done[g]));
        CK(l.attention(sa, g, G));
        CK(cudaEventRecord(att_done[g], sa));
        if (g > 0)
            o_part(g - 1);
    }
    o_part(G - 1);
    CK(cudaEventRecord(layer_done, sg));
    CK(cudaStreamWaitEvent(sa, layer_done));
}

static void serial_layer(const Layer &l, cudaStream_t s) {
    CK(l.qkv.run(l.w_qkv, l.x, l.d, s));
    CK(l.attention(s));
    CK(l.o.run(l.w_o, l.x, l.o_out, s));
}

static void pipe_rounds(const Layer &l, int G, cudaStream_t sg, cudaStream_t sa, const char *prio) {
    const Gemm qkv(QKV_N / G, HIDDEN, BATCH, HIDDEN), o(HIDDEN, HIDDEN / G, BATCH, HIDDEN, HIDDEN);
    const int layers = 20;
    for (int round = 0; round < 2; round++) {
        CK(cudaDeviceSynchronize());
        serial_layer(l, sg);
        const float serial = span_us(sg, layers, [&] { serial_layer(l, sg); });
        const float att = span_us(sa, 1, [&] { CK(l.attention(sa)); });
        pipe_layer(l, G, qkv, o, sg, sa);
        CK(cudaDeviceSynchronize());
        CK(cudaEventRecord(ev[0], sa));
        CK(cudaStreamWaitEvent(sg, ev[0]));
        for (int i = 0; i < layers; i++)
            pipe_layer(l, G, qkv, o, sg, sa);
        CK(cudaEventRecord(ev[1], sa));
        CK(cudaEventSynchronize(ev[1]));
        printf("pipe G %d, %s, round %d: serial layer %.1f us (attention-like alone %.1f us, "
               "%.2f TB/s), pipelined %.1f us\n",
               G, prio, round, serial, att, KV_BYTES / att / 1e6, elapsed_us(ev[0], ev[1], layers));
    }
}

static void pipe_mode() {
    const Layer l;
    int least, greatest;
    CK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    const char *prios[3] = {"priorities equal", "GEMM stream high", "attention stream high"};
    for (int G = 1; G <= 8; G *= 2)
        for (int prio = 0; prio < 3; prio++) {
            cudaStream_t sg, sa;
            CK(cudaStreamCreateWithPriority(&sg, cudaStreamNonBlocking,
                                            prio == 1 ? greatest : least));
            CK(cudaStreamCreateWithPriority(&sa, cudaStreamNonBlocking,
                                            prio == 2 ? greatest : least));
            pipe_rounds(l, G, sg, sa, prios[prio]);
            CK(cudaStreamDestroy(sg));
            CK(cudaStreamDestroy(sa));
        }
}

static double wall_s() {
    timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* body() in timed batches of 20 calls for 4 s, then 2 s idle */
template <class F> static void sustained(const char *name, F body) {
    constexpr int BATCH_CALLS = 20;
    std::vector<double> end;
    std::vector<float> us;
    const double t0 = wall_s();
    while (end.empty() || end.back() - t0 < 4.0) {
        us.push_back(span_us(0, BATCH_CALLS, body));
        end.push_back(wall_s());
    }
    std::vector<float> last;
    for (size_t i = 0; i < us.size(); i++)
        if (end[i] > end.back() - 1.0)
            last.push_back(us[i]);
    std::sort(last.begin(), last.end());
    printf("power %-10s %.3f - %.3f: %zu batches of %d, first %.1f us per call, last second "
           "median %.1f us\n",
           name, t0, end.back(), us.size(), BATCH_CALLS, us[0], last[last.size() / 2]);
    fflush(stdout);
    sleep(2);
}

static void power_mode() {
    static const Shape *const layer[] = {&SHAPES[0], &SHAPES[1], &SHAPES[2], &SHAPES[3]};
    void *x = dev_rand((size_t)BATCH * 14336, 5), *d = dev_alloc((size_t)BATCH * 28672 * 2);
    std::vector<const Gemm *> g;
    std::vector<void *> w;
    for (const Shape *s : layer) {
        g.push_back(new Gemm(s->n, s->k, BATCH, s->k));
        for (int c = 0; c < 2; c++)
            w.push_back(dev_rand((size_t)s->n * s->k, 90 + (int)w.size()));
    }
    uint4 *kv = (uint4 *)dev_rand(KV_BYTES / 2, 11);
    float *sink = (float *)dev_alloc(sizeof(float));
    int call = 0;
    auto attention = [&] {
        attention_like<<<ATT_BLOCKS, ATT_THREADS>>>(kv, ATT_CHUNK, sink);
        CK(cudaGetLastError());
    };
    auto gemms = [&] {
        const int c = call++ & 1;
        for (size_t i = 0; i < g.size(); i++)
            CK(g[i]->run(w[2 * i + c], x, d, 0));
    };
    sleep(2);
    sustained("attention", attention);
    sustained("gemms", gemms);
    sustained("layer", [&] {
        attention();
        gemms();
    });
    printf("attention-like %.2f GB per call; GEMMs %.1f GFLOP per call\n", KV_BYTES / 1e9,
           2.0 * BATCH * (QKV_N + HIDDEN + 28672 + 14336) * (double)HIDDEN / 1e9);
    for (const Gemm *p : g)
        delete p;
    for (void *p : w)
        CK(cudaFree(p));
    for (void *p : {x, d, (void *)kv, (void *)sink})
        CK(cudaFree(p));
}

int main(int argc, char **argv) {
    static const struct {
        const char *name;
        void (*run)();
    } modes[] = {{"gemm", gemm_mode},
                 {"cold", cold_mode},
                 {"overlap", overlap_mode},
                 {"pipe", pipe_mode},
                 {"power", power_mode}};
    const char *only = argc > 1 ? argv[1] : nullptr;
    int chosen = 0;
    for (const auto &m : modes)
        chosen += !only || !strcmp(m.name, only);
    if (argc > 2 || !chosen) {
        printf("usage: %s [gemm|cold|overlap|pipe|power]\n", argv[0]);
        return 2;
    }
    CK(cuInit(0));
    CK(cublasLtCreate(&lt));
    ws = dev_alloc(WS_BYTES);
    for (cudaEvent_t &e : ev)
        CK(cudaEventCreate(&e));
    for (cudaEvent_t *e : {qkv_done, att_done})
        for (int g = 0; g < 8; g++)
            CK(cudaEventCreateWithFlags(&e[g], cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&layer_done, cudaEventDisableTiming));
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    printf("SMs %d\n", sms);
    for (const auto &m : modes)
        if (!only || !strcmp(m.name, only))
            m.run();
    for (cudaEvent_t e : ev)
        CK(cudaEventDestroy(e));
    for (cudaEvent_t *e : {qkv_done, att_done})
        for (int g = 0; g < 8; g++)
            CK(cudaEventDestroy(e[g]));
    CK(cudaEventDestroy(layer_done));
    CK(cudaFree(ws));
    CK(cublasLtDestroy(lt));
    return 0;
}
