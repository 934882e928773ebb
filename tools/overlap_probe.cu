/* overlap_probe.cu - whether the H200 can hide a decode step's attention behind the Llama-3-8B
 * decode GEMMs, and whether cuBLASLt's algorithm choice for those GEMMs leaves time on the table.
 * Not part of the build; on a GPU host:
 *
 *   nvcc -O3 -arch=sm_90 -std=c++17 -o /tmp/overlap_probe tools/overlap_probe.cu -lcublasLt -lcuda
 *   /tmp/overlap_probe [gemm|cold|overlap|pipe|power|partials|sustain|attnpower|floor]
 *   (no argument: all nine, in this order)
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
 *          power and clock of each span.
 * partials Would the o and down projections pay as split-K fp32 partials summed by the next
 *          add + RMSNorm (no reduction kernel)? Best offer (weights rotating through 4 copies)
 *          with bf16 output plus an add-norm of a bf16 delta, against strided-batched fp32
 *          partials at split 2, 4, 8 plus an add-norm summing them; and the LM head with bf16
 *          or fp32 output.
 * sustain  Would tuning the offers under sustained load pick others? Per shape at 256 rows and
 *          offer, the engine-like burst time and the time after 1.5 s of back-to-back calls.
 * attnpower Where does a decode attention kernel's energy go? One layer's K/V (as overlap's)
 *          through ld.global, evict-first loads, a cp.async ring read back with ld.shared, with
 *          ldmatrix, ldmatrix feeding 8 mma per step (4 or 16 live A rows), and ld.global
 *          feeding the mma directly; each for 4 s as in power (nvidia-smi beside it).
 * floor    The least a batch-256 decode step at context 1024 does, under the power limit: 32 x
 *          (one layer's K/V read as attention-like does, 1.07 GB, then the layer's four GEMMs)
 *          and the LM head, none of attention's math, norms, RoPE, SiLU or sampling; steps back
 *          to back for 4 s, the time per step in the last second (nvidia-smi beside it). */
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

    /* batch > 1: `batch` products over consecutive k-slices of W and X (strided batch), the
     * partial sums D_i [n, rows] one after another in ct */
    Gemm(int n, int k, int rows, int ldb, int lda = 0, cudaDataType_t ct = CUDA_R_16BF,
         int batch = 1) {
        const int32_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        CK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
        CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
        CK(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, k, n, lda ? lda : k));
        CK(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, k, rows, ldb));
        CK(cublasLtMatrixLayoutCreate(&c, ct, n, rows, n));
        if (batch > 1) {
            const int64_t ab = k, cb = (int64_t)n * rows;
            for (cublasLtMatrixLayout_t l : {a, b, c}) {
                CK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                                    sizeof batch));
                const int64_t *off = l == c ? &cb : &ab;
                CK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                    off, sizeof *off));
            }
        }
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

/* body() called back to back for `seconds`, timed in batches of `batch` calls: the wall-clock
 * span (CLOCK_REALTIME), the batches, the first batch's us per call, and the median us per call
 * of the batches ending in the last `window` seconds (once the power limit has set the clock) */
struct Settled {
    double t0, t1;
    size_t batches;
    float first_us, settled_us;
};
template <class F> static Settled settle(double seconds, double window, int batch, F body) {
    std::vector<double> end;
    std::vector<float> us;
    const double t0 = wall_s();
    while (end.empty() || end.back() - t0 < seconds) {
        us.push_back(span_us(0, batch, body));
        end.push_back(wall_s());
    }
    std::vector<float> last;
    for (size_t i = 0; i < us.size(); i++)
        if (end[i] > end.back() - window)
            last.push_back(us[i]);
    std::sort(last.begin(), last.end());
    return {t0, end.back(), us.size(), us[0], last[last.size() / 2]};
}

/* body() in timed batches of 20 calls for 4 s, then 2 s idle */
template <class F> static void sustained(const char *name, F body) {
    constexpr int BATCH_CALLS = 20;
    const Settled r = settle(4.0, 1.0, BATCH_CALLS, body);
    printf("power %-10s %.3f - %.3f: %zu batches of %d, first %.1f us per call, last second "
           "median %.1f us\n",
           name, r.t0, r.t1, r.batches, BATCH_CALLS, r.first_us, r.settled_us);
    fflush(stdout);
    sleep(2);
}

/* The layer's four GEMMs at BATCH rows (qkv, o, gate-up, down) on random bits, each weight in
 * two copies used by turns (0.87 GB in all), so that every call reads its weights from HBM */
struct LayerGemms {
    std::vector<const Gemm *> g;
    std::vector<void *> w;
    void *x, *d;
    int call = 0;

    LayerGemms() : x(dev_rand((size_t)BATCH * 14336, 5)), d(dev_alloc((size_t)BATCH * 28672 * 2)) {
        for (int i = 0; i < 4; i++) {
            const Shape &s = SHAPES[i];
            g.push_back(new Gemm(s.n, s.k, BATCH, s.k));
            for (int c = 0; c < 2; c++)
                w.push_back(dev_rand((size_t)s.n * s.k, 90 + (int)w.size()));
        }
    }
    LayerGemms(const LayerGemms &) = delete;
    ~LayerGemms() {
        for (const Gemm *p : g)
            delete p;
        for (void *p : w)
            CK(cudaFree(p));
        for (void *p : {x, d})
            CK(cudaFree(p));
    }
    void run() {
        const int c = call++ & 1;
        for (size_t i = 0; i < g.size(); i++)
            CK(g[i]->run(w[2 * i + c], x, d, 0));
    }
};

static void power_mode() {
    LayerGemms gemms;
    uint4 *kv = (uint4 *)dev_rand(KV_BYTES / 2, 11);
    float *sink = (float *)dev_alloc(sizeof(float));
    auto attention = [&] {
        attention_like<<<ATT_BLOCKS, ATT_THREADS>>>(kv, ATT_CHUNK, sink);
        CK(cudaGetLastError());
    };
    sleep(2);
    sustained("attention", attention);
    sustained("gemms", [&] { gemms.run(); });
    sustained("layer", [&] {
        attention();
        gemms.run();
    });
    printf("attention-like %.2f GB per call; GEMMs %.1f GFLOP per call\n", KV_BYTES / 1e9,
           2.0 * BATCH * (QKV_N + HIDDEN + 28672 + 14336) * (double)HIDDEN / 1e9);
    for (void *p : {(void *)kv, (void *)sink})
        CK(cudaFree(p));
}

/* ---- floor: the least work of a batch-256 decode step, under the power limit ---- */

static void floor_mode() {
    constexpr int LAYERS = 32, STEPS_PER_BATCH = 2;
    constexpr size_t kv_bytes = (size_t)BATCH * 1024 * 4096; /* one layer's K/V at context 1024 */
    constexpr size_t chunk = kv_bytes / 16 / ATT_BLOCKS;
    LayerGemms gemms;
    const Gemm lm(SHAPES[4].n, SHAPES[4].k, BATCH, SHAPES[4].k);
    void *lm_w = dev_rand((size_t)SHAPES[4].n * SHAPES[4].k, 80);
    void *logits = dev_alloc((size_t)BATCH * SHAPES[4].n * 2);
    uint4 *kv = (uint4 *)dev_rand(kv_bytes / 2, 11);
    float *sink = (float *)dev_alloc(sizeof(float));
    auto step = [&] {
        for (int l = 0; l < LAYERS; l++) {
            attention_like<<<ATT_BLOCKS, ATT_THREADS>>>(kv, chunk, sink);
            CK(cudaGetLastError());
            gemms.run();
        }
        CK(lm.run(lm_w, gemms.x, logits, 0));
    };
    sleep(2);
    const Settled r = settle(4.0, 1.0, STEPS_PER_BATCH, step);
    printf("floor step %.3f - %.3f: %zu batches of %d, first %.3f ms per step, last second "
           "median %.3f ms (%d x (K/V read %.3f GB + qkv, o, gate-up, down) + lm-head, %d rows)\n",
           r.t0, r.t1, r.batches, STEPS_PER_BATCH, r.first_us / 1e3, r.settled_us / 1e3, LAYERS,
           kv_bytes / 1e9, BATCH);
    for (void *p : {lm_w, logits, (void *)kv, (void *)sink})
        CK(cudaFree(p));
}

/* ---- attnpower: where a decode attention kernel's energy goes ---- */

enum AttnPath { PATH_LDG, PATH_LDCS, PATH_SMEM, PATH_LDSM, PATH_MMA4, PATH_MMA16, PATH_REG_MMA4 };
static const char *const PATH_NAMES[] = {"ldg",       "ldcs",       "cp.async+lds", "cp.async+ldsm",
                                         "ldsm+mma4", "ldsm+mma16", "ldg+mma4"};

__device__ __forceinline__ void probe_cp_async16(uint32_t dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void probe_ldsm_x4(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void probe_mma16(float c[4], const uint32_t a[4], uint32_t b0,
                                            uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Block b streams chunk b (one (row, KV head) pair's K and V, as attention_like) in steps of 8
 * rows of 256 bytes per warp, the steps dealt round-robin to the 4 warps. PATH_LDG / LDCS: each
 * lane loads its 4 16-byte units of a step into registers (ld.global.nc / evict-first), two steps
 * in flight. The others stage the steps through a 3-stage cp.async ring per warp laid out as the
 * engine's decode kernel does (row p's chunk c at unit 16 p + (c ^ p)), then read each stage with
 * ld.shared (SMEM), 4 ldmatrix.x4 (LDSM), and 8 mma m16n8k16 on them (MMA4: 4 of A's 16 rows
 * non-zero, as the decode kernel's 4 query heads of a KV head; MMA16: all 16). REG_MMA4: the
 * registers of LDG fed to the same 8 mma, no shared memory. */
template <int PATH>
__global__ __launch_bounds__(ATT_THREADS) void attention_path(const uint4 *kv, size_t chunk,
                                                              float *sink) {
    __shared__ uint4 ring[ATT_THREADS / 32][3][128];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g8 = lane >> 2, sub = lane & 15, r = lane >> 4, lpos = lane & 7, lmat = lane >> 3;
    const uint4 *base = kv + blockIdx.x * chunk;
    const int nsteps = (int)(chunk / 128), mine = (nsteps - warp + 3) / 4;
    /* A fragments: query-like bits, zero where the decode kernel's padding rows are */
    const uint32_t q = 0x3c003c00u ^ (lane * 0x01010101u);
    const bool live = PATH == PATH_MMA16 || g8 < 4;
    const uint32_t a[4] = {live ? q : 0u, PATH == PATH_MMA16 ? q : 0u, live ? q : 0u,
                           PATH == PATH_MMA16 ? q : 0u};
    float c[4] = {0, 0, 0, 0};
    uint32_t x = 0;
    auto step_src = [&](int j) { return base + (size_t)(warp + 4 * j) * 128; };
    if constexpr (PATH == PATH_LDG || PATH == PATH_LDCS || PATH == PATH_REG_MMA4) {
        for (int j = 0; j < mine; j++) {
            uint4 v[4];
#pragma unroll
            for (int u = 0; u < 4; u++)
                v[u] = PATH == PATH_LDCS ? __ldcs(step_src(j) + u * 32 + lane)
                                         : __ldg(step_src(j) + u * 32 + lane);
            if constexpr (PATH == PATH_REG_MMA4) {
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    probe_mma16(c, a, v[u].x, v[u].y);
                    probe_mma16(c, a, v[u].z, v[u].w);
                }
            } else {
#pragma unroll
                for (int u = 0; u < 4; u++)
                    x ^= v[u].x ^ v[u].w;
            }
        }
    } else {
        auto issue = [&](int j) {
            if (j < mine) {
                const uint32_t dst = (uint32_t)__cvta_generic_to_shared(ring[warp][j % 3]);
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    const int row = 2 * u + r;
                    probe_cp_async16(dst + 16 * (row * 16 + (sub ^ row)),
                                     step_src(j) + row * 16 + sub);
                }
            }
            asm volatile("cp.async.commit_group;\n" ::: "memory");
        };
        issue(0);
        issue(1);
        for (int j = 0; j < mine; j++) {
            __syncwarp();
            issue(j + 2);
            asm volatile("cp.async.wait_group 2;\n" ::: "memory");
            __syncwarp();
            const uint32_t sa = (uint32_t)__cvta_generic_to_shared(ring[warp][j % 3]);
            if constexpr (PATH == PATH_SMEM) {
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    const uint4 v = ring[warp][j % 3][u * 32 + lane];
                    x ^= v.x ^ v.w;
                }
            } else {
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    uint32_t b[4];
                    probe_ldsm_x4(b, sa + 16 * (lpos * 16 + ((4 * k + lmat) ^ lpos)));
                    if constexpr (PATH == PATH_LDSM) {
                        x ^= b[0] ^ b[1] ^ b[2] ^ b[3];
                    } else {
                        probe_mma16(c, a, b[0], b[1]);
                        probe_mma16(c, a, b[2], b[3]);
                    }
                }
            }
        }
    }
    if (x == 0x12345678u || c[0] + c[1] + c[2] + c[3] == 123.456f)
        *sink = (float)x + c[0];
}

/* Each path over one layer's K/V for 4 s (sustained(): run nvidia-smi beside it). */
static void attnpower_mode() {
    uint4 *kv = (uint4 *)dev_rand(KV_BYTES / 2, 11);
    float *sink = (float *)dev_alloc(sizeof(float));
    static void (*const kernels[])(const uint4 *, size_t, float *) = {
        attention_path<PATH_LDG>,     attention_path<PATH_LDCS>, attention_path<PATH_SMEM>,
        attention_path<PATH_LDSM>,    attention_path<PATH_MMA4>, attention_path<PATH_MMA16>,
        attention_path<PATH_REG_MMA4>};
    auto launch = [&](int path) {
        kernels[path]<<<ATT_BLOCKS, ATT_THREADS>>>(kv, ATT_CHUNK, sink);
        CK(cudaGetLastError());
    };
    sleep(2);
    for (int path = PATH_LDG; path <= PATH_REG_MMA4; path++)
        sustained(PATH_NAMES[path], [&] { launch(path); });
    printf("attnpower: %.3f GB per call\n", KV_BYTES / 1e9);
    for (void *p : {(void *)kv, (void *)sink})
        CK(cudaFree(p));
}

/* Would timing the offers under sustained load (the power limit binding) pick other ones than
 * the engine's burst timing? Each shape at 256 rows, each offer: 30 calls after 3 warm-ups
 * (as the engine's tuner) and the settled time after 1.5 s of calls, weights alternating
 * between two copies; 1 s idle between offers. */
static void sustain_mode() {
    void *x = dev_rand((size_t)BATCH * 14336, 5), *d = dev_alloc((size_t)BATCH * 128256 * 2);
    for (const Shape &s : SHAPES) {
        const Gemm g(s.n, s.k, BATCH, s.k);
        void *w[2] = {dev_rand((size_t)s.n * s.k, 70), dev_rand((size_t)s.n * s.k, 71)};
        cublasLtMatmulHeuristicResult_t r[OFFERS];
        const int n = g.offers(r, OFFERS);
        const double flop = 2.0 * s.n * s.k * BATCH;
        for (int i = 0; i < n; i++) {
            sleep(1);
            const float burst = time_algo(g, &r[i].algo, w, 2, x, d, 30);
            if (burst < 0)
                continue;
            int c = 0;
            const float held = settle(1.5, 0.5, 10, [&] {
                                   CK(g.run(w[c++ & 1], x, d, 0, 0, &r[i].algo));
                               }).settled_us;
            printf("sustain %-7s offer %d: burst %7.1f us (%5.1f TF/s), settled %7.1f us (%5.1f "
                   "TF/s)  ",
                   s.name, i, burst, flop / burst / 1e6, held, flop / held / 1e6);
            print_config(&r[i].algo);
            fflush(stdout);
        }
        for (void *p : w)
            CK(cudaFree(p));
    }
    for (void *p : {x, d})
        CK(cudaFree(p));
}

/* residual += sum of S fp32 partials (S 0: one bf16 delta), rounded to bf16; normed = rmsnorm
 * (no weight): the add + norm after a row-parallel projection, one block of 256 per row */
template <int S>
__global__ __launch_bounds__(256) void add_norm_partials(uint16_t *res, const void *delta,
                                                         uint16_t *normed, int rows) {
    __shared__ float part[8];
    const int r = blockIdx.x, t = threadIdx.x;
    float v[16], ss = 0;
#pragma unroll
    for (int j = 0; j < 16; j++) {
        const size_t i = (size_t)r * HIDDEN + j * 256 + t;
        float dlt = 0;
        if constexpr (S == 0)
            dlt = __uint_as_float((uint32_t)((const uint16_t *)delta)[i] << 16);
        else
#pragma unroll
            for (int p = 0; p < S; p++)
                dlt += ((const float *)delta)[(size_t)p * rows * HIDDEN + i];
        dlt = __bfloat162float(__float2bfloat16(dlt));
        const float x =
            __bfloat162float(__float2bfloat16(__uint_as_float((uint32_t)res[i] << 16) + dlt));
        res[i] = (uint16_t)(__float_as_uint(x) >> 16);
        v[j] = x;
        ss += x * x;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (t % 32 == 0)
        part[t / 32] = ss;
    __syncthreads();
    ss = 0;
    for (int w = 0; w < 8; w++)
        ss += part[w];
    const float inv = rsqrtf(ss / HIDDEN + 1e-5f);
#pragma unroll
    for (int j = 0; j < 16; j++)
        normed[(size_t)r * HIDDEN + j * 256 + t] = (uint16_t)(__float_as_uint(v[j] * inv) >> 16);
}

/* best over the offers (up to OFFERS, 30 calls each, weights rotating through `copies`) */
static float best_us(const Gemm &g, void *const *w, int copies, const void *x, void *d,
                     cublasLtMatmulAlgo_t *pick) {
    cublasLtMatmulHeuristicResult_t r[OFFERS];
    const int n = g.offers(r, OFFERS);
    float best = -1;
    for (int i = 0; i < n; i++) {
        const float us = time_algo(g, &r[i].algo, w, copies, x, d, 30);
        if (us > 0 && (best < 0 || us < best)) {
            best = us;
            *pick = r[i].algo;
        }
    }
    return best;
}

static void partials_mode() {
    constexpr int COPIES = 4;
    void *x = dev_rand((size_t)BATCH * 14336, 5), *d = dev_alloc((size_t)8 * BATCH * HIDDEN * 4);
    uint16_t *res = (uint16_t *)dev_rand((size_t)BATCH * HIDDEN, 6),
             *normed = (uint16_t *)dev_alloc((size_t)BATCH * HIDDEN * 2);
    for (const Shape *s : {&SHAPES[1], &SHAPES[3]}) {
        std::vector<void *> w;
        for (int c = 0; c < COPIES; c++)
            w.push_back(dev_rand((size_t)s->n * s->k, 40 + c));
        /* the add-norm of S partials, S 0 (one bf16 delta), 2, 4 or 8 */
        static void (*const add_norm[])(uint16_t *, const void *, uint16_t *, int) = {
            add_norm_partials<0>, add_norm_partials<2>, add_norm_partials<4>, add_norm_partials<8>};
        auto norm = [&](int S) {
            return span_us(0, 50, [&] {
                add_norm[S ? __builtin_ctz(S) : 0]<<<BATCH, 256>>>(res, d, normed, BATCH);
                CK(cudaGetLastError());
            });
        };
        cublasLtMatmulAlgo_t pick;
        const Gemm plain(s->n, s->k, BATCH, s->k);
        const float base = best_us(plain, w.data(), COPIES, x, d, &pick), base_norm = norm(0);
        printf("partials %-5s rows %d: bf16 out %.1f us (", s->name, BATCH, base);
        print_config(&pick);
        printf("  + add-norm of a bf16 delta %.1f us = %.1f us\n", base_norm, base + base_norm);
        for (int S : {2, 4, 8}) {
            const Gemm g(s->n, s->k / S, BATCH, s->k, s->k, CUDA_R_32F, S);
            const float us = best_us(g, w.data(), COPIES, x, d, &pick), nu = norm(S);
            printf("  split %d fp32 partials %.1f us (", S, us);
            print_config(&pick);
            printf("  + add-norm of %d partials %.1f us = %.1f us\n", S, nu, us + nu);
        }
        for (void *p : w)
            CK(cudaFree(p));
    }
    { /* the LM head writing bf16 logits (then widened by a kernel) or fp32 ones directly */
        const Shape &s = SHAPES[4];
        void *w = dev_rand((size_t)s.n * s.k, 60), *lg = dev_alloc((size_t)BATCH * s.n * 4);
        cublasLtMatmulAlgo_t pick;
        for (cudaDataType_t ct : {CUDA_R_16BF, CUDA_R_32F}) {
            const Gemm g(s.n, s.k, BATCH, s.k, 0, ct);
            const float us = best_us(g, &w, 1, x, lg, &pick);
            printf("partials lm-head rows %d %s out: %.1f us (", BATCH,
                   ct == CUDA_R_32F ? "fp32" : "bf16", us);
            print_config(&pick);
        }
        for (void *p : {w, lg})
            CK(cudaFree(p));
    }
    for (void *p : {x, d, (void *)res, (void *)normed})
        CK(cudaFree(p));
}

int main(int argc, char **argv) {
    static const struct {
        const char *name;
        void (*run)();
    } modes[] = {
        {"gemm", gemm_mode},       {"cold", cold_mode},           {"overlap", overlap_mode},
        {"pipe", pipe_mode},       {"power", power_mode},         {"partials", partials_mode},
        {"sustain", sustain_mode}, {"attnpower", attnpower_mode}, {"floor", floor_mode}};
    const char *only = argc > 1 ? argv[1] : nullptr;
    int chosen = 0;
    for (const auto &m : modes)
        chosen += !only || !strcmp(m.name, only);
    if (argc > 2 || !chosen) {
        printf("usage: %s [gemm|cold|overlap|pipe|power|partials|sustain|attnpower|floor]\n",
               argv[0]);
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
