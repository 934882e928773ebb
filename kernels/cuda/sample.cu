/* sample.cu - next-token selection on the GPU with the CPU sampler's semantics
 * (kernels/cpu/sample.c): penalties, temperature, top-k, top-p, min-p and one seeded draw
 * walked down the ranking (logit descending, id ascending), the exponential race for rows with
 * temperature alone, or the argmax for greedy rows.
 *
 * Penalties: one kernel, a few blocks looping over the rows, each with its own occurrence
 * counts over the vocabulary in the workspace: it counts the output tokens, applies the
 * penalties once per distinct history token in place (saving the raw logits beside the
 * history for the token logits), and clears the counts through the history.
 *
 * Temperature-only rows (no top-k, top-p or min-p) take the exponential race of the CPU op
 * (kernels/cpu/sample.c): in pass 1 each block keeps the maximum of x / T and the argmax of
 * x / T - log(E_i) over its slice, E_i = k_random_exponential bit for bit except __logf for logf
 * (computed in about 45 instructions a token: see the race's section), and the row stops there
 * like a greedy one. A batch of greedy and temperature-only rows (KC_SAMPLE_ARGMAX_ONLY)
 * runs a kernel without the shared-memory histograms, so more blocks fit on an SM.
 *
 * Sampling: one thread block cluster per row, each block a slice of the vocabulary; the
 * cluster has up to SAMPLE_CLUSTER_MAX blocks, halved while the rows would put more than
 * SAMPLE_FILL blocks on each SM (8 for a few rows, 1 at 256 rows on the H200). The blocks
 * merge their histograms through distributed shared memory into the leader's (rank 0) and
 * each takes a copy back, so every block finds the same bins itself; the leader takes the
 * remaining sequential decisions (the sort and scan of a bin) and hands out the hit. (One
 * block per row took 193-330 us for one row at temperature 1 on the H200: a single SM reads
 * the whole row several times.) A top-k or top-p cut within the first SAMPLE_CAP / 2 tokens
 * gathers and sorts that prefix once, and the later selections scan it. Pass 1 is the
 * argmax (greedy and race rows stop there). Pass 2 bins the
 * tokens by d = max - logit (linear bins of 1/32, monotone in the ranking) with the count and
 * the weight exp(-d) of each bin; weights are fixed-point integers (w * 2^S, S chosen so that
 * a whole row cannot overflow 64 bits), so sums are exact, order-free and reproducible. Tokens
 * whose weight rounds to 0 are left out of the bins: they rank after every binned token and
 * can never be drawn. Top-k, the top-p cut and the draw are each a selection "first token in
 * rank order where the cumulative count or weight reaches T": the bin holding it comes from a
 * scan of the histogram, then its tokens are gathered into shared memory, sorted by (key, id)
 * and scanned. A bin too large for shared memory is narrowed first by histograms over its
 * float keys (11 bits at a time), down to a single logit value whose tokens are taken in id
 * order. Min-p needs no selection: its tokens are a prefix of the ranking, so the kept mass is
 * the smaller of the top-p mass and the mass of tokens with w >= min_p. Sums differ from the
 * CPU's double sums only by rounding (and expf by an ulp), so a draw or cut picks a different
 * token than the CPU only at a near-tie of cumulative mass. */
#include <cooperative_groups.h>

#include "sample.cuh"

namespace cg = cooperative_groups;

enum {
    SAMPLE_NB = 2048,   /* coarse bins: d * SAMPLE_BPU < 48 * 32 = 1536 of them are used */
    SAMPLE_CAP = 8192,  /* tokens a selection sorts in shared memory */
    SAMPLE_DIGITS = 11, /* bits of the float key per refinement pass (2048 bins) */
    PEN_THREADS = 512,
    PEN_SLABS = 32,         /* blocks of the penalty kernel, each with its own counts */
    SAMPLE_CLUSTER_MAX = 8, /* blocks per row (a thread block cluster) at most */
    SAMPLE_FILL = 2,        /* the rows' clusters aim at about this many blocks per SM */
};
#define SAMPLE_BPU  32.0f /* coarse bins per unit of d */
#define SAMPLE_TAIL 48.0f /* d beyond which the weight is 0 at any scale (e^-48 < 2^-63) */

static const unsigned PEN_DONE = 1u << 31, PEN_COUNT = (1u << 31) - 1;

/* ---- the row's parameters, as the CPU sampler reads them ---- */

__device__ __forceinline__ bool row_greedy(const KCudaSampleRow &p) {
    return !(p.temperature >= 1e-5f);
}
__device__ __forceinline__ bool row_rep(const KCudaSampleRow &p) {
    return p.repetition_penalty != 1.0f && p.repetition_penalty > 0.0f;
}
__device__ __forceinline__ bool row_freq(const KCudaSampleRow &p) {
    return p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
}
/* A sampling row with temperature alone (sampling_temperature_only). */
__device__ __forceinline__ bool row_race(const KCudaSampleRow &p, int V) {
    return (p.top_k <= 0 || p.top_k >= V) && !(p.top_p < 1.0f) && !(p.min_p > 0.0f);
}

/* k_random_bits and k_random_uniform (kernels/kernels.c), bit for bit; k_random_exponential is
 * in the race below. */
__device__ __forceinline__ u64 mix64(u64 z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
__device__ __forceinline__ u64 random_bits(u64 seed, u64 index) {
    u64 z = mix64(seed + 0x9e3779b97f4a7c15ull);
    return mix64(z ^ (index * 0xd1b54a32d192ed03ull + 0x8cb92ba72f3d8dd7ull));
}
__device__ __forceinline__ float random_uniform(u64 seed, u64 index) {
    return (float)(random_bits(seed, index) >> 40) * (1.0f / 16777216.0f);
}

/* ---- penalties ---- */

/* The CPU's float operations in its order (no contraction into fused multiply-adds). */
__device__ __forceinline__ float penalised(float x, unsigned count, bool rep, bool freq,
                                           const KCudaSampleRow &p) {
    x = sample_canon(x);
    if (rep)
        x = x > 0.0f ? __fdiv_rn(x, p.repetition_penalty) : __fmul_rn(x, p.repetition_penalty);
    if (freq && count > 0) {
        x = __fsub_rn(x, __fmul_rn(p.frequency_penalty, (float)count));
        x = __fsub_rn(x, p.presence_penalty);
    }
    return x;
}

/* Block b handles rows b, b + gridDim.x, ... with counts slabs[b * V ...], zeroed on its first
 * penalised row and cleared through the history after each. A history token outside the
 * vocabulary, or a history range outside [0, hist_cap), traps the kernel. */
__global__ __launch_bounds__(PEN_THREADS) void penalty_kernel(float *logits, int V, int n,
                                                              const KCudaSampleRow *rows,
                                                              const int32_t *history,
                                                              float *hist_raw, long long hist_cap,
                                                              unsigned *slabs) {
    unsigned *cnt = slabs + (size_t)blockIdx.x * V;
    bool zeroed = false;
    for (int r = blockIdx.x; r < n; r += gridDim.x) {
        const KCudaSampleRow p = rows[r];
        bool rep = row_rep(p), freq = row_freq(p);
        if (!rep && !freq)
            continue;
        if (!zeroed) {
            for (int i = threadIdx.x; i < V; i += PEN_THREADS)
                cnt[i] = 0;
            zeroed = true;
            __syncthreads();
        }
        long long off = p.history_offset, len = (long long)p.num_prompt + p.num_output;
        if (off < 0 || p.num_prompt < 0 || p.num_output < 0 || off + len > hist_cap)
            __trap();
        const int32_t *h = history + off;
        float *row = logits + (size_t)r * V;
        for (int j = threadIdx.x; j < len; j += PEN_THREADS) {
            int32_t t = h[j];
            if (t < 0 || t >= V)
                __trap();
            hist_raw[off + j] = row[t];
            if (j >= p.num_prompt)
                atomicAdd(&cnt[t], 1u);
        }
        __syncthreads();
        for (int j = threadIdx.x; j < len; j += PEN_THREADS) { /* the first to mark t owns it */
            int32_t t = h[j];
            unsigned old = atomicOr(&cnt[t], PEN_DONE);
            if (!(old & PEN_DONE))
                row[t] = penalised(row[t], old & PEN_COUNT, rep, freq, p);
        }
        __syncthreads();
        for (int j = threadIdx.x; j < len; j += PEN_THREADS)
            cnt[h[j]] = 0;
        __syncthreads();
    }
}

/* ---- selection machinery (one cluster of SAMPLE_CLUSTER blocks per row) ---- */

/* The selected token, and the weight of the ranking through it. */
struct Hit {
    int id;
    u64 mass;
};

/* One step of a selection: coarse bins [b_lo, b], the float keys [klo, khi] still in play,
 * how many tokens they hold, and the count and weight of the ranking before them. */
struct Plan {
    int b_lo, b;
    unsigned klo, khi;
    u64 n_in, before_cnt, before_mass;
};

/* What the blocks of a row's cluster exchange through distributed shared memory. The leader's
 * (rank 0) part / sums / taken collect the others' contributions; every block's hit receives
 * the leader's selections. */
struct ClusterShared {
    ArgMax part[SAMPLE_CLUSTER_MAX];   /* each block's argmax of its slice */
    ArgMax race[SAMPLE_CLUSTER_MAX];   /* and of its race scores (temperature-only rows) */
    u64 minp_mass[SAMPLE_CLUSTER_MAX]; /* each block's weight of tokens with w >= min_p */
    unsigned taken;                    /* tokens gathered into the leader's keys */
    unsigned cached;                   /* leader: tokens of the sorted prefix kept in its keys */
    Hit hit[2]; /* by the parity of the selection (a block may read one while the next is set) */
};

struct SampleCtx {
    const float *row;
    int V, lo, hi;            /* this block's slice of the row: [lo, hi) */
    unsigned rank, nblocks;   /* in the cluster (0 is the leader), and the cluster's size */
    float temp, lmax, qscale; /* qscale = 2^S */
    u64 *keys;                /* [SAMPLE_CAP] gathered tokens; the refinement histograms */
    u64 *hmass;               /* [SAMPLE_NB] coarse histogram: weight per bin */
    unsigned *hcnt;           /* [SAMPLE_NB] and tokens per bin (the row's, once merged) */
    u64 *scratch;             /* [SAMPLE_WARPS + 1] for the block scans */
    ClusterShared *sh;        /* this block's */
    ClusterShared *lead;      /* the leader's, and its arrays below (distributed shared memory) */
    u64 *lead_keys, *lead_hmass;
    unsigned *lead_hcnt;
    int selects;  /* selections made so far */
    int cached_b; /* the leader's keys hold bins [0, cached_b] sorted (-1: nothing) */
};

/* x / temperature as the CPU computes it (a division by 1 is skipped: it is exact). */
__device__ __forceinline__ float scaled(float x, float temp) {
    x = sample_canon(x);
    return temp == 1.0f ? x : x / temp;
}
__device__ __forceinline__ float value_of(const SampleCtx &c, float x) {
    return scaled(x, c.temp);
}

/* The CPU's weight expf(v - max) = e^-d for 0 <= d < SAMPLE_TAIL, evaluated in double and
 * rounded once: the correctly rounded expf (which glibc's nearly is) except where e^-d lies
 * within about 2^-36 (relative) of a rounding midpoint: e^-d = 2^-k e^-r with k = rint(d / ln 2)
 * (Cody and Waite's two-part ln 2, exact for these k) and |r| <= ln 2 / 2, e^-r by its Taylor
 * series to r^10 (truncation < 7e-12 relative). Fewer instructions than CUDA's exp(), which guards
 * the whole double range (H200, 256 rows at temperature 1: 247.6 -> 236.8 us from this alone). */
__device__ __forceinline__ float weight_of(float d) {
    const double LN2_HI = 6.93147180369123816490e-01, LN2_LO = 1.90821492927058770002e-10;
    double x = (double)d, k = rint(x * 1.4426950408889634);
    double r = fma(-k, LN2_LO, fma(-k, LN2_HI, x)), p = 1.0 / 3628800.0;
    const double inv_fact[10] = {
        1.0 / 362880.0, 1.0 / 40320.0, 1.0 / 5040.0, 1.0 / 720.0, 1.0 / 120.0,
        1.0 / 24.0,     1.0 / 6.0,     0.5,          1.0,         1.0};
#pragma unroll
    for (int i = 0; i < 10; i++)
        p = fma(p, -r, inv_fact[i]);
    return (float)(p * __hiloint2double((1023 - (int)k) << 20, 0));
}
__device__ __forceinline__ u64 fixed_of(const SampleCtx &c, float w) {
    return __float2ull_rn(w * c.qscale);
}

/* The leader's thread 0 hands every block of the cluster the same hit. */
__device__ void broadcast_hit(const SampleCtx &c, const Hit &h) {
    if (threadIdx.x == 0)
        for (unsigned r = 0; r < c.nblocks; r++)
            cg::this_cluster().map_shared_rank(c.sh, r)->hit[c.selects & 1] = h;
}

/* *p += q for a histogram in this block's shared memory. */
__device__ __forceinline__ void add_mass(u64 *p, u64 q) {
    unsigned *w = (unsigned *)p, lo = (unsigned)q, hi = (unsigned)(q >> 32);
    unsigned old = atomicAdd(w, lo);
    hi += old + lo < old; /* the carry out of the low word */
    if (hi)
        atomicAdd(w + 1, hi);
}

/* A block other than the leader adds its (complete) histogram into the leader's. */
__device__ void flush_hist(const SampleCtx &c, const unsigned *cnt, const u64 *mass,
                           unsigned *lead_cnt, u64 *lead_mass) {
    if (c.rank == 0)
        return;
    for (int i = threadIdx.x; i < SAMPLE_NB; i += SAMPLE_THREADS)
        if (cnt[i]) {
            atomicAdd(lead_cnt + i, cnt[i]);
            atomicAdd(lead_mass + i, mass[i]);
        }
}

/* A block other than the leader takes a copy of the leader's merged histogram, so that every
 * block finds the same bins by itself. */
__device__ void copy_hist(const SampleCtx &c, unsigned *cnt, u64 *mass, const unsigned *lead_cnt,
                          const u64 *lead_mass) {
    if (c.rank == 0)
        return;
    for (int i = threadIdx.x; i < SAMPLE_NB; i += SAMPLE_THREADS) {
        cnt[i] = lead_cnt[i];
        mass[i] = lead_mass[i];
    }
}

/* The crossing bin of a histogram, with the count and weight of the bins before it. */
struct BinHit {
    int b; /* -1: not reached (an internal inconsistency) */
    unsigned cnt;
    u64 before_cnt, before_mass;
};

/* First bin b in order at which before + cumulative (count or weight) reaches T, given that
 * it is not reached before bin 0. */
__device__ BinHit find_bin(const SampleCtx &c, const unsigned *cnt, const u64 *mass, bool by_count,
                           u64 T, u64 before_cnt, u64 before_mass) {
    __shared__ BinHit hit;
    const int per = SAMPLE_NB / SAMPLE_THREADS, b0 = threadIdx.x * per;
    if (threadIdx.x == 0)
        hit.b = -1;
    u64 lc = 0, lm = 0, tot;
    for (int j = 0; j < per; j++) {
        lc += cnt[b0 + j];
        lm += mass[b0 + j];
    }
    u64 nc = before_cnt + block_scan<SAMPLE_WARPS>(lc, &tot, c.scratch);
    u64 nm = before_mass + block_scan<SAMPLE_WARPS>(lm, &tot, c.scratch);
    for (int j = 0; j < per; j++) {
        u64 ac = nc + cnt[b0 + j], am = nm + mass[b0 + j];
        if ((by_count ? nc : nm) < T && (by_count ? ac : am) >= T)
            hit = BinHit{b0 + j, cnt[b0 + j], nc, nm};
        nc = ac;
        nm = am;
    }
    __syncthreads();
    BinHit r = hit;
    __syncthreads();
    return r;
}

/* Raw logits that can lie in coarse bin b: temp * (lmax - [b, b + 1) / SAMPLE_BPU), widened
 * far beyond the rounding of the division and subtraction, so that only tokens near the bin
 * pay for the exact test. */
struct RawRange {
    float lo, hi;
};
__device__ RawRange raw_range(const SampleCtx &c, int b_lo, int b) {
    double t = c.temp, m = c.lmax;
    double lo = t * (m - (b + 1) / (double)SAMPLE_BPU), hi = t * (m - b_lo / (double)SAMPLE_BPU);
    double slack = 1e-6 * (fabs(lo) + fabs(hi) + fabs(t * m)) + 1e-30;
    return RawRange{(float)(lo - slack), (float)(hi + slack)};
}

/* Fixed-point weight of the token of raw logit x if it lies in coarse bins [b_lo, b] (raw range r)
 * with a key in [klo, khi] and a nonzero weight, its value in *v; else 0. */
__device__ __forceinline__ u64 in_range(const SampleCtx &c, float x, RawRange r, int b_lo, int b,
                                        unsigned klo, unsigned khi, float *v) {
    if (!(x >= r.lo && x <= r.hi))
        return 0;
    *v = value_of(c, x);
    float d = c.lmax - *v;
    if (!(d < SAMPLE_TAIL) || (int)(d * SAMPLE_BPU) < b_lo || (int)(d * SAMPLE_BPU) > b)
        return 0;
    unsigned k = desc_key(*v);
    if (k < klo || k > khi)
        return 0;
    return fixed_of(c, weight_of(d));
}

/* Gather the (at most SAMPLE_CAP) tokens of the plan's bins and keys into the leader's keys
 * (the others stage theirs in their own keys, then copy them over in one range), and the
 * leader sorts them by rank and scans them for the crossing; with `keep` (a prefix of at most
 * SAMPLE_CAP / 2 tokens), it keeps the sorted prefix and its cumulative weights. */
__device__ Hit gather_select(const SampleCtx &c, const Plan &pl, bool by_count, u64 T, bool keep) {
    cg::cluster_group cluster = cg::this_cluster();
    __shared__ unsigned staged, base;
    __shared__ Hit hit;
    if (threadIdx.x == 0) {
        staged = 0;
        hit.id = -1;
    }
    __syncthreads();
    unsigned *counter = c.rank == 0 ? &c.lead->taken : &staged;
    RawRange xr = raw_range(c, pl.b_lo, pl.b);
    slice_for_each(c.row, c.lo, c.hi, [&](int i, float x) {
        float v;
        if (in_range(c, x, xr, pl.b_lo, pl.b, pl.klo, pl.khi, &v)) {
            unsigned at = atomicAdd(counter, 1u);
            if (at < SAMPLE_CAP)
                c.keys[at] = (u64)desc_key(v) << 32 | (unsigned)i;
        }
    });
    __syncthreads();
    if (c.rank != 0) {
        if (threadIdx.x == 0)
            base = atomicAdd(&c.lead->taken, staged);
        __syncthreads();
        unsigned m = staged < SAMPLE_CAP ? staged : SAMPLE_CAP;
        for (unsigned i = threadIdx.x; i < m && base + i < SAMPLE_CAP; i += SAMPLE_THREADS)
            c.lead_keys[base + i] = c.keys[i];
    }
    cluster.sync();
    if (c.rank == 0) {
        unsigned taken = c.sh->taken;
        __syncthreads();
        if (threadIdx.x == 0)
            c.sh->taken = 0; /* for the next selection: no block adds to it before the barrier */
        int m = taken < SAMPLE_CAP ? (int)taken : SAMPLE_CAP, P = 1;
        while (P < m)
            P <<= 1;
        for (int i = m + threadIdx.x; i < P; i += SAMPLE_THREADS)
            c.keys[i] = ~0ull;
        __syncthreads();
        for (int k = 2; k <= P; k <<= 1) /* bitonic sort, ascending */
            for (int j = k >> 1; j > 0; j >>= 1) {
                /* compare-exchange t: the pair (i, i + j), i = t with a 0 inserted at bit j */
                for (int t = threadIdx.x; t < P / 2; t += SAMPLE_THREADS) {
                    int i = ((t & ~(j - 1)) << 1) | (t & (j - 1)), o = i | j;
                    u64 a = c.keys[i], z = c.keys[o];
                    if ((a > z) == ((i & k) == 0)) {
                        c.keys[i] = z;
                        c.keys[o] = a;
                    }
                }
                __syncthreads();
            }
        const int per = (m + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
        int lo = threadIdx.x * per, hi = min(lo + per, m);
        u64 local = 0, tot;
        for (int e = lo; e < hi; e++)
            local += fixed_of(c, weight_of(c.lmax - desc_key_value((unsigned)(c.keys[e] >> 32))));
        u64 mass = pl.before_mass + block_scan<SAMPLE_WARPS>(local, &tot, c.scratch);
        u64 *cum = c.keys + SAMPLE_CAP / 2;
        if (keep && threadIdx.x == 0)
            c.sh->cached = (unsigned)m;
        for (int e = lo; e < hi; e++) {
            u64 key = c.keys[e], prev = mass;
            mass += fixed_of(c, weight_of(c.lmax - desc_key_value((unsigned)(key >> 32))));
            if (keep)
                cum[e] = mass;
            u64 count = pl.before_cnt + e + 1;
            if (by_count ? count == T : (prev < T && mass >= T))
                hit = Hit{(int)(unsigned)key, mass};
        }
        __syncthreads();
        broadcast_hit(c, hit);
    }
    cluster.sync();
    return c.sh->hit[c.selects & 1];
}

/* The crossing within the leader's sorted prefix (bins [0, c.cached_b], cumulative weights
 * beside it): no pass over the row. */
__device__ Hit cached_select(const SampleCtx &c, bool by_count, u64 T) {
    __shared__ Hit hit;
    if (c.rank == 0) {
        if (threadIdx.x == 0)
            hit.id = -1;
        __syncthreads();
        const u64 *cum = c.keys + SAMPLE_CAP / 2;
        for (unsigned e = threadIdx.x; e < c.sh->cached; e += SAMPLE_THREADS) {
            u64 prev = e ? cum[e - 1] : 0;
            if (by_count ? e + 1 == T : (prev < T && cum[e] >= T))
                hit = Hit{(int)(unsigned)c.keys[e], cum[e]};
        }
        __syncthreads();
        broadcast_hit(c, hit);
    }
    cg::this_cluster().sync();
    return c.sh->hit[c.selects & 1];
}

/* Index of the j-th token (1-based, in id order) whose key is `key`: the leader alone, over
 * the whole row (more than SAMPLE_CAP equal logits: a rare row). */
__device__ int nth_with_key(const SampleCtx &c, unsigned key, u64 j) {
    __shared__ int found;
    if (threadIdx.x == 0)
        found = -1; /* ordered before any write by the scan's barriers */
    u64 seen = 0, tot;
    for (int start = 0; start < c.V; start += SAMPLE_THREADS * 8) {
        int i0 = start + threadIdx.x * 8;
        unsigned mine = 0;
        for (int u = 0; u < 8; u++)
            mine += i0 + u < c.V && desc_key(value_of(c, c.row[i0 + u])) == key;
        u64 ex = seen + block_scan<SAMPLE_WARPS>((u64)mine, &tot, c.scratch);
        if (ex < j && j <= ex + mine) {
            u64 need = j - ex;
            for (int u = 0; u < 8; u++)
                if (i0 + u < c.V && desc_key(value_of(c, c.row[i0 + u])) == key && --need == 0)
                    found = i0 + u;
        }
        seen += tot;
        if (seen >= j)
            break;
    }
    __syncthreads();
    int r = found;
    __syncthreads();
    return r;
}

/* Narrow a bin of more than SAMPLE_CAP tokens by histograms over the next bits of its float
 * keys (each block's slice into its own, merged in the leader's, copied back to every block),
 * until it holds at most SAMPLE_CAP tokens or a single key. 0: an internal inconsistency. */
__device__ bool refine(const SampleCtx &c, bool by_count, u64 T, Plan &pl) {
    cg::cluster_group cluster = cg::this_cluster();
    unsigned *dcnt = (unsigned *)(c.keys + SAMPLE_NB);
    unsigned *lead_dcnt = (unsigned *)(c.lead_keys + SAMPLE_NB);
    RawRange xr = raw_range(c, pl.b, pl.b);
    while (pl.n_in > SAMPLE_CAP && pl.klo < pl.khi) {
        int bits = 32 - __clz(pl.khi - pl.klo);
        int shift = bits > SAMPLE_DIGITS ? bits - SAMPLE_DIGITS : 0;
        for (int i = threadIdx.x; i < SAMPLE_NB; i += SAMPLE_THREADS) {
            c.keys[i] = 0;
            dcnt[i] = 0;
        }
        cluster.sync(); /* every block's histograms clear (and read) before any adds */
        slice_for_each(c.row, c.lo, c.hi, [&](int, float x) {
            float v;
            u64 q = in_range(c, x, xr, pl.b, pl.b, pl.klo, pl.khi, &v);
            if (q) {
                unsigned g = (desc_key(v) - pl.klo) >> shift;
                atomicAdd(&dcnt[g], 1u);
                add_mass(&c.keys[g], q);
            }
        });
        __syncthreads();
        flush_hist(c, dcnt, c.keys, lead_dcnt, c.lead_keys);
        cluster.sync();
        copy_hist(c, dcnt, c.keys, lead_dcnt, c.lead_keys);
        cluster.sync(); /* every copy taken before the leader's keys change */
        BinHit g = find_bin(c, dcnt, c.keys, by_count, T, pl.before_cnt, pl.before_mass);
        if (g.b < 0)
            return false;
        u64 nlo = (u64)pl.klo + ((u64)g.b << shift), nhi = nlo + (1ull << shift) - 1;
        pl.klo = (unsigned)nlo;
        pl.khi = nhi < pl.khi ? (unsigned)nhi : pl.khi;
        pl.n_in = g.cnt;
        pl.before_cnt = g.before_cnt;
        pl.before_mass = g.before_mass;
    }
    return true;
}

/* First token in rank order where the cumulative count (by_count) or weight reaches T, for
 * 1 <= T <= the binned total. Every block of the cluster calls it (with its copy of the
 * merged histogram, so all find the same bin); all get the same hit. With `keep` (another
 * selection follows, at or before this one in rank order), a crossing within the first
 * SAMPLE_CAP / 2 tokens gathers and sorts all of them, and the next selections scan that. */
__device__ Hit select_once(SampleCtx &c, bool by_count, u64 T, bool keep) {
    BinHit bh = find_bin(c, c.hcnt, c.hmass, by_count, T, 0, 0);
    if (bh.b < 0)
        return Hit{-1, 0};
    if (bh.b <= c.cached_b)
        return cached_select(c, by_count, T);
    c.cached_b = -1;
    if (keep && bh.before_cnt + bh.cnt <= SAMPLE_CAP / 2) {
        Plan pre = {0, bh.b, 0, 0xffffffffu, bh.before_cnt + bh.cnt, 0, 0};
        c.cached_b = bh.b;
        return gather_select(c, pre, by_count, T, true);
    }
    Plan pl = {bh.b, bh.b, 0, 0xffffffffu, bh.cnt, bh.before_cnt, bh.before_mass};
    if (!refine(c, by_count, T, pl))
        return Hit{-1, 0};
    if (pl.n_in <= SAMPLE_CAP)
        return gather_select(c, pl, by_count, T, false);
    /* more than SAMPLE_CAP tokens of one value: equal weights, taken in id order */
    if (c.rank == 0) {
        u64 q = fixed_of(c, weight_of(c.lmax - desc_key_value(pl.klo)));
        u64 w = by_count ? 1 : q, before = by_count ? pl.before_cnt : pl.before_mass;
        u64 j = (T - before + w - 1) / w;
        int id = nth_with_key(c, pl.klo, j);
        broadcast_hit(c, Hit{id, pl.before_mass + j * q});
    }
    cg::this_cluster().sync();
    return c.sh->hit[c.selects & 1];
}

__device__ Hit sample_select(SampleCtx &c, bool by_count, u64 T, bool keep) {
    Hit h = select_once(c, by_count, T, keep);
    c.selects++;
    return h;
}

/* The token of a sampling row whose largest value lmax is finite (every block of the cluster;
 * the coarse histograms were cleared before the argmax's cluster barrier). The blocks' coarse
 * histograms are merged in the leader's and copied back to every block. */
__device__ int sample_row(SampleCtx &c, const KCudaSampleRow &p) {
    bool minp = p.min_p > 0.0f;
    float thr = p.min_p < 1.0f ? p.min_p : 1.0f;
    u64 minp_mass = 0;
    slice_for_each(c.row, c.lo, c.hi, [&](int, float x) {
        float d = c.lmax - value_of(c, x);
        if (d < SAMPLE_TAIL) {
            float w = weight_of(d);
            u64 q = fixed_of(c, w);
            if (q) {
                int b = (int)(d * SAMPLE_BPU);
                atomicAdd(&c.hcnt[b], 1u);
                add_mass(&c.hmass[b], q);
                if (minp && w >= thr)
                    minp_mass += q;
            }
        }
    });
    minp_mass = block_sum_u64(minp_mass, c.scratch);
    if (threadIdx.x == 0)
        c.lead->minp_mass[c.rank] = minp_mass;
    __syncthreads(); /* every shared atomic of this block done */
    flush_hist(c, c.hcnt, c.hmass, c.lead_hcnt, c.lead_hmass);
    cg::this_cluster().sync();
    copy_hist(c, c.hcnt, c.hmass, c.lead_hcnt, c.lead_hmass);
    __syncthreads();
    /* the binned tokens and their weight, from the merged histogram */
    u64 binned = 0, total = 0;
    for (int i = threadIdx.x; i < SAMPLE_NB; i += SAMPLE_THREADS) {
        binned += c.hcnt[i];
        total += c.hmass[i];
    }
    binned = block_sum_u64(binned, c.scratch);
    total = block_sum_u64(total, c.scratch);
    minp_mass = 0;
    for (unsigned r = 0; r < c.nblocks; r++)
        minp_mass += c.lead->minp_mass[r];

    /* the candidates' weight: the top k, or every token of nonzero weight */
    if (p.top_k > 0 && p.top_k < c.V && (u64)p.top_k <= binned)
        total = sample_select(c, true, (u64)p.top_k, true).mass;
    /* top-p keeps the ranking up to the token where the weight reaches top_p * total */
    u64 kept = total;
    if (p.top_p < 1.0f) {
        double t = (double)p.top_p * (double)total;
        u64 T = t > 1.0 ? (u64)ceil(t) : 1;
        kept = sample_select(c, false, T < total ? T : total, true).mass;
    }
    /* min-p keeps the prefix of tokens with w >= min_p: the kept weight is the smaller one */
    if (minp && minp_mass < kept)
        kept = minp_mass;
    /* the draw: the first token where the cumulative weight exceeds u * kept */
    double u = (double)random_uniform(p.seed, (u64)(long long)p.num_output);
    u64 T = (u64)(u * (double)kept) + 1;
    return sample_select(c, false, T < kept ? T : kept, false).id;
}

/* ---- the exponential race (temperature-only rows) ---- */

/* Token i's score is v_i - log(E_i): v_i = x_i / T (x_i at T = 1), E_i = k_random_exponential(bits,
 * i) with log(y) = lg2(y) * LN2 (CUDA's __logf: lg2 the hardware's lg2.approx, LN2 its constant)
 * and the subtraction fused, fma(lg2(E_i), -LN2, v_i) (what nvcc made of v - __logf(E) in the
 * first version of this pass). The pass computes exactly these scores, and the same tokens, in 44
 * instructions a token at T = 1 (50 otherwise) instead of 64-72 (74-82) when it was written
 * plainly (sm_90 SASS of the unrolled loop; the race is bound by instruction issue, not by
 * reading the row):
 * - the hash input i * RACE_MUL + RACE_ADD (mod 2^64) of four consecutive tokens is one multiply
 *   and three 64-bit additions;
 * - no branch between the series (m < 2^48: one token in 32, so most warps ran both sides) and
 *   the logarithm: one conversion of n = m, or n = m - 2^53 (the high word alone changes), gives
 *   RN(m), or -RN(2^53 - m) (round to nearest is symmetric), and |RN(n)| 2^-53 is exact;
 * - v + (v * v) * 0.5 is one fma: (v * v) * 0.5 is exact (v * v is 0 or at least 2^-106);
 * - lg2.approx.ftz for __logf's lg2.approx, which differs only by rescaling a subnormal argument:
 *   w = RN(2^53 - m) 2^-53 >= 2^-53, and E is 0, at least v >= 2^-53 (series) or about
 *   -ln 2 lg2(31/32) = 0.03 or more (logarithm);
 * - x / T is the product (double)x * RT, RT = 1 / (double)T, rounded to float: it is within
 *   2^-52 (relative) of x / T, and x / T is never within 2^-49 of a rounding boundary of the normal
 *   floats or infinity (a midpoint M = K 2^e, K odd, 2^24 < K < 2^25; with x = X 2^a and T =
 *   Y 2^b, X and Y odd below 2^24, x - T M is a nonzero multiple of 2^min(a, b + e), so |x / T -
 *   M| is at least M / (Y K) or x / X), so the two round alike whenever the product rounds to a
 *   normal float or an infinity; a product rounding to 0 or a subnormal for x != 0 takes the
 *   division (x / T may then be a midpoint exactly: T = 98, x = 0x1.26p-142), and x = 0 gives 0
 *   of the same sign either way;
 * - the values' argmax keeps only their maximum (one fmaxf: a race row only asks whether it is
 *   finite); the rare row that falls back to the argmax finds the index without another pass
 *   (race_argmax);
 * - each thread keeps the first of its largest scores by a strict comparison (it visits its
 *   tokens in increasing order): a score of -inf is never kept, which changes nothing, as the race
 *   takes its token only when the winning score is above -inf;
 * - a NaN logit is not mapped to -inf: its NaN value and NaN score are skipped by fmaxf and by the
 *   comparisons, as the value and score -inf were (they could not raise the maximum or win). */
#define RACE_MUL 0x9fb21c651e98df25ull
#define RACE_ADD 0x2545f4914f6cdd1dull
#define RACE_LN2 0x1.62e430p-1f /* CUDART_LN2_F, __logf's factor */

__device__ __forceinline__ float lg2_approx(float x) {
    float r;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}

/* v - log(E) for the token whose hash input is `key` (see above). */
__device__ __forceinline__ float race_score(float v, u64 bits, u64 key) {
    u64 h = mix64(bits ^ key), m = h >> 11;
    bool series = (unsigned)(h >> 32) < (1u << 27); /* m < 2^48 */
    long long n = series ? (long long)m : (long long)m - (1ll << 53);
    float u = __fmul_rn(fabsf(__ll2float_rn(n)), 0x1p-53f), s = __fmul_rn(u, u);
    float e_series = __fadd_rn(__fmaf_rn(s, 0.5f, u), __fmul_rn(__fmul_rn(s, u), 1.0f / 3.0f));
    float e_log = __fmul_rn(lg2_approx(u), -RACE_LN2);
    return __fmaf_rn(lg2_approx(series ? e_series : e_log), -RACE_LN2, v);
}

/* x / temp correctly rounded (see above), rt = 1 / (double)temp, unless it comes out 0 or
 * subnormal for x != 0: race_fix divides then. */
__device__ __forceinline__ float race_value(float x, double rt) {
    return __double2float_rn(__dmul_rn((double)x, rt));
}
__device__ __forceinline__ void race_fix(float &v, float x, float temp) {
    if (fabsf(v) < 0x1p-126f && x != 0.0f)
        v = __fdiv_rn(x, temp);
}

/* Pass 1 of a race row over this block's slice: am->v gets each thread's largest value, *rc its
 * first largest score and its token (a strict comparison in increasing token order: a score of
 * -inf or NaN is never kept). SCALE: temperature != 1. */
template <bool SCALE>
__device__ __forceinline__ void race_pass(const float *row, int lo, int hi, float temp, u64 bits,
                                          ArgMax *am, ArgMax *rc) {
    const double rt = 1.0 / (double)temp;
    /* the steps between the hash inputs of a quad's tokens, hidden from the compiler, which would
     * otherwise fold them into one multiply per token */
    u64 step1 = RACE_MUL, step2 = 2 * RACE_MUL, step3 = 3 * RACE_MUL;
    asm("" : "+l"(step1), "+l"(step2), "+l"(step3));
    float top = -INFINITY;
    ArgMax best = {-INFINITY, INT_MAX};
    auto take = [&](int i, float v, u64 key) {
        top = fmaxf(top, v);
        float score = race_score(v, bits, key);
        if (score > best.v) {
            best.v = score;
            best.i = i;
        }
    };
    slice_for_each_quad(
        row, lo, hi,
        [&](int i, float x) {
            float v = x;
            if (SCALE) {
                v = race_value(x, rt);
                race_fix(v, x, temp);
            }
            take(i, v, (u64)(unsigned)i * RACE_MUL + RACE_ADD);
        },
        [&](int i, float4 q) {
            float4 v = q;
            if (SCALE) {
                v = make_float4(race_value(q.x, rt), race_value(q.y, rt), race_value(q.z, rt),
                                race_value(q.w, rt));
                /* one test for the four (a NaN value passes, as it should) */
                if (fminf(fminf(fabsf(v.x), fabsf(v.y)), fminf(fabsf(v.z), fabsf(v.w))) <
                    0x1p-126f) {
                    race_fix(v.x, q.x, temp);
                    race_fix(v.y, q.y, temp);
                    race_fix(v.z, q.z, temp);
                    race_fix(v.w, q.w, temp);
                }
            }
            u64 key = (u64)(unsigned)i * RACE_MUL + RACE_ADD;
            take(i, v.x, key);
            take(i + 1, v.y, key + step1);
            take(i + 2, v.z, key + step2);
            take(i + 3, v.w, key + step3);
        });
    am->v = top;
    *rc = best;
}

/* ---- the sampling kernel ---- */

/* tokens[r]; token_logits[r] = the chosen token's logit before penalties. */
__device__ void finish_row(int32_t *tokens, float *token_logits, int r, int token, const float *row,
                           const KCudaSampleRow &p, bool penalised_row, const int32_t *history,
                           const float *hist_raw) {
    __shared__ float raw;
    if (threadIdx.x == 0) {
        tokens[r] = token;
        raw = token >= 0 ? row[token] : NAN;
    }
    if (!token_logits)
        return;
    if (penalised_row && token >= 0) {
        __syncthreads();
        long long len = (long long)p.num_prompt + p.num_output;
        for (long long j = threadIdx.x; j < len; j += SAMPLE_THREADS)
            if (history[p.history_offset + j] == token)
                raw = hist_raw[p.history_offset + j]; /* every occurrence saved the same value */
        __syncthreads();
    }
    if (threadIdx.x == 0)
        token_logits[r] = raw;
}

/* The cluster's argmax of the blocks' parts (every block gets it). */
__device__ ArgMax cluster_argmax(const ArgMax *parts, unsigned nblocks, ArgMax *scratch) {
    if (threadIdx.x < 32) {
        ArgMax m = {-INFINITY, INT_MAX};
        if (threadIdx.x < nblocks)
            m = parts[threadIdx.x];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            argmax_take(m, __shfl_xor_sync(0xffffffffu, m.v, o),
                        __shfl_xor_sync(0xffffffffu, m.i, o));
        if (threadIdx.x == 0)
            scratch[0] = m;
    }
    __syncthreads();
    ArgMax m = scratch[0];
    __syncthreads(); /* scratch is reused */
    return m;
}

/* The argmax of a race row's values x / temperature (the first token of the largest) for a race
 * that gives no token, from their maximum vmax and the race's winner rc (race_pass keeps no index
 * of the maximum): 0 when no value is above -inf (at a finite temperature every value is then
 * -inf, and argmax_take keeps the first); at vmax = +inf, the first token of value +inf, which is
 * rc (every such token scores +inf, and the race keeps the first token of its best score) unless
 * a token before it scored +inf with E = 0 (one token in 2^53), and then the scan goes on from
 * there; a finite vmax (never: a finite value scores above -inf) scans from 0. Every thread
 * computes it, reading the same values. */
__device__ int race_argmax(const float *row, int V, float temp, float vmax, ArgMax rc) {
    if (!(vmax > -INFINITY))
        return 0;
    int i = rc.v == vmax && rc.i < V ? rc.i : 0;
    while (i < V - 1 && scaled(row[i], temp) != vmax)
        i++;
    return i;
}

/* Row blockIdx.x / (cluster size), its slice `rank` of the vocabulary per block. ARGMAX_ONLY:
 * every row is greedy or temperature-only (no shared-memory histograms). */
template <bool ARGMAX_ONLY>
__global__ __launch_bounds__(SAMPLE_THREADS, 2) void sample_kernel(
    int32_t *tokens, float *token_logits, const float *logits, int V, const KCudaSampleRow *rows,
    const int32_t *history, const float *hist_raw, int penalties, float qscale) {
    extern __shared__ u64 smem[];
    __shared__ ArgMax am_scratch[SAMPLE_WARPS];
    __shared__ u64 scan_scratch[SAMPLE_WARPS + 1];
    __shared__ ClusterShared sh;
    cg::cluster_group cluster = cg::this_cluster();
    const unsigned rank = cluster.block_rank(), nblocks = cluster.num_blocks();
    const int r = blockIdx.x / nblocks;
    const int chunk = ((V + nblocks - 1) / nblocks + 3) & ~3;
    const int lo = min(V, (int)rank * chunk), hi = min(V, lo + chunk);
    const KCudaSampleRow p = rows[r];
    const float *row = logits + (size_t)r * V;
    const bool greedy = row_greedy(p), race = !greedy && row_race(p, V);
    float temp = greedy ? 1.0f : p.temperature;
    ClusterShared *lead = cluster.map_shared_rank(&sh, 0);
    u64 *hmass = smem + SAMPLE_CAP;
    unsigned *hcnt = (unsigned *)(smem + SAMPLE_CAP + SAMPLE_NB);
    if (!ARGMAX_ONLY && !greedy && !race) {
        for (int i = threadIdx.x; i < SAMPLE_NB; i += SAMPLE_THREADS) {
            hcnt[i] = 0;
            hmass[i] = 0;
        }
        if (threadIdx.x == 0)
            sh.taken = 0;
    }

    /* pass 1: the argmax of the values (logit / temperature for sampling rows), or for
     * temperature-only rows their maximum and the argmax of the race scores, per slice, then
     * merged from the leader's copies by every block */
    ArgMax am = {-INFINITY, INT_MAX}, rc = {-INFINITY, INT_MAX};
    if (greedy) {
        slice_for_each(row, lo, hi, [&](int i, float x) { argmax_take(am, sample_canon(x), i); });
    } else if (race) {
        const u64 bits = random_bits(p.seed, (u64)p.num_output);
        if (temp == 1.0f)
            race_pass<false>(row, lo, hi, temp, bits, &am, &rc);
        else
            race_pass<true>(row, lo, hi, temp, bits, &am, &rc);
    } else {
        slice_for_each(row, lo, hi, [&](int i, float x) { argmax_take(am, scaled(x, temp), i); });
    }
    am = block_argmax(am, am_scratch);
    if (race)
        rc = block_argmax(rc, am_scratch);
    if (threadIdx.x == 0) {
        lead->part[rank] = am;
        lead->race[rank] = rc;
    }
    cluster.sync();
    am = cluster_argmax(lead->part, nblocks, am_scratch);
    if (race)
        rc = cluster_argmax(lead->race, nblocks, am_scratch);
    int token = am.i;
    const bool finite = am.v > -INFINITY && am.v < INFINITY;
    if (race && finite && rc.v > -INFINITY) /* as the CPU op: a race no token won is an argmax */
        token = rc.i;
    else if (race)
        token = race_argmax(row, V, temp, am.v, rc);
    if (!ARGMAX_ONLY && !greedy && !race && finite) {
        SampleCtx c = {row,
                       V,
                       lo,
                       hi,
                       rank,
                       nblocks,
                       temp,
                       am.v,
                       qscale,
                       smem,
                       hmass,
                       hcnt,
                       scan_scratch,
                       &sh,
                       lead,
                       cluster.map_shared_rank(smem, 0),
                       cluster.map_shared_rank(hmass, 0),
                       cluster.map_shared_rank(hcnt, 0),
                       0,
                       -1};
        token = sample_row(c, p);
    }
    if (rank == 0) {
        bool penalised_row = penalties && (row_rep(p) || row_freq(p));
        finish_row(tokens, token_logits, r, token, row, p, penalised_row, history, hist_raw);
    }
    cluster.sync(); /* no block leaves while another may still read its shared memory */
}

/* ---- launchers ---- */

static size_t slab_bytes(int rows, int vocab) {
    int slabs = rows < PEN_SLABS ? rows : PEN_SLABS;
    return ((size_t)slabs * (size_t)vocab * sizeof(unsigned) + 255) & ~(size_t)255;
}

size_t k_cuda_sample_workspace_bytes(int max_rows, int vocab, int max_history) {
    KC_REQUIRE(max_rows >= 0 && vocab > 0 && max_history >= 0,
               "k_cuda_sample_workspace_bytes: bad sizes (rows %d, vocab %d, history %d)", max_rows,
               vocab, max_history);
    return slab_bytes(max_rows, vocab) + (size_t)max_history * sizeof(float);
}

void k_cuda_sample(int32_t *tokens, float *token_logits, float *logits, int n, int vocab,
                   const KCudaSampleRow *rows, const int32_t *history, int flags, void *workspace,
                   size_t workspace_bytes, void *stream) {
    KC_REQUIRE(n >= 0 && vocab > 0, "k_cuda_sample: bad shape (n %d, vocab %d)", n, vocab);
    if (n == 0)
        return;
    cudaStream_t s = kc_stream(stream);
    int penalties = !(flags & KC_SAMPLE_NO_PENALTIES);
    size_t slabs = slab_bytes(n, vocab);
    float *hist_raw = penalties ? (float *)((char *)workspace + slabs) : NULL;
    if (penalties) {
        KC_REQUIRE(workspace && workspace_bytes >= slabs,
                   "k_cuda_sample: workspace of %zu bytes, %zu needed for %d rows of vocab %d",
                   workspace_bytes, slabs, n, vocab);
        int blocks = n < PEN_SLABS ? n : PEN_SLABS;
        penalty_kernel<<<blocks, PEN_THREADS, 0, s>>>(
            logits, vocab, n, rows, history, hist_raw,
            (long long)((workspace_bytes - slabs) / sizeof(float)), (unsigned *)workspace);
        CUDA_CHECK_LAUNCH();
    }
    /* S: the largest scale at which vocab weights of at most 1 sum below 2^63 */
    int log2v = 0;
    while ((2ll << log2v) <= vocab)
        log2v++;
    float qscale = ldexpf(1.0f, 62 - log2v);
    /* blocks per row: about SAMPLE_FILL blocks per SM in all, at most SAMPLE_CLUSTER_MAX */
    int per_row = SAMPLE_CLUSTER_MAX;
    while (per_row > 1 && (long long)n * per_row > (long long)SAMPLE_FILL * kc_sm_count())
        per_row >>= 1;
    bool argmax_only = flags & KC_SAMPLE_ARGMAX_ONLY;
    size_t smem =
        argmax_only ? 0 : (SAMPLE_CAP + SAMPLE_NB) * sizeof(u64) + SAMPLE_NB * sizeof(unsigned);
    void (*kernel)(int32_t *, float *, const float *, int, const KCudaSampleRow *, const int32_t *,
                   const float *, int, float) =
        argmax_only ? sample_kernel<true> : sample_kernel<false>;
    kc_set_smem(kernel, smem);
    cudaLaunchAttribute cluster;
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = (unsigned)per_row;
    cluster.val.clusterDim.y = 1;
    cluster.val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)(n * per_row));
    cfg.blockDim = dim3(SAMPLE_THREADS);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cfg.attrs = &cluster;
    cfg.numAttrs = 1;
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, tokens, token_logits, (const float *)logits, vocab,
                                  rows, history, (const float *)hist_raw, penalties, qscale));
}
