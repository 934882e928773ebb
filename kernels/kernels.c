/* kernels.c - the kernel API's entry and its backend-independent helpers: opening a backend
 * by name, KV block geometry, RoPE frequencies (with llama3 scaling), the per-request random
 * stream and the default sampling parameters. Everything here runs on the host. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_internal.h"
#include "kernels.h"
#include "sampling.h"
#ifdef PAGELLM_HAVE_CUDA
#include "kernels_cuda.h"
#endif

SampleRow k_sample_row(const SamplingParams *p, int num_prompt, int num_output,
                       int history_offset) {
    return (SampleRow){.temperature = p->temperature,
                       .top_p = p->top_p,
                       .min_p = p->min_p,
                       .repetition_penalty = p->repetition_penalty,
                       .presence_penalty = p->presence_penalty,
                       .frequency_penalty = p->frequency_penalty,
                       .top_k = p->top_k,
                       .num_output = num_output,
                       .seed = p->seed,
                       .history_offset = history_offset,
                       .num_prompt = num_prompt};
}

int k_device_count(const char *backend) {
    if (!strcmp(backend, "cpu"))
        return 1;
#ifdef PAGELLM_HAVE_CUDA
    if (!strcmp(backend, "cuda"))
        return k_cuda_device_count();
#endif
    return 0;
}

#ifdef PAGELLM_HAVE_CUDA
/* Every rank's answer to "can you open your GPU?", and rank 0's word to all after it. */
typedef struct {
    int32_t ok;
    char error[512];
} RankCheck;

typedef struct {
    RankCheck check;
    unsigned char group_id[K_CUDA_GROUP_ID_BYTES];
} GroupStart;

/* Rank 0: every rank's check (late ones named) and, when all can go, the group id. */
static GroupStart gather_checks(const RankCheck *mine, int size) {
    GroupStart start = {0};
    RankCheck *all = pl_xcalloc((size_t)size, sizeof *all);
    int *late = pl_xcalloc((size_t)size, sizeof *late);
    k_mpi_gather(mine, all, sizeof *mine, 120.0, late);
    int r = 0;
    while (r < size && !late[r] && all[r].ok)
        r++;
    if (r < size && late[r])
        snprintf(start.check.error, sizeof start.check.error,
                 "rank %d did not answer within 120 s while opening the cuda backend", r);
    else if (r < size)
        start.check = all[r];
    else if (k_cuda_group_id(start.group_id) != PL_OK)
        snprintf(start.check.error, sizeof start.check.error, "%s", pl_error());
    start.check.ok = !start.check.error[0];
    free(late);
    free(all);
    return start;
}

/* The cuda backend as one rank per MPI process: each rank checks it has its GPU (the host's
 * k_mpi_local_rank()-th), rank 0 gathers the checks and broadcasts the NCCL group id or the
 * first failure, so that no rank waits in the NCCL setup for one that cannot come. */
static Status open_cuda_mpi(const KernelOpenOptions *o, KernelOps **ranks) {
    int rank = 0, size = 0;
    Status st = k_mpi_init(&rank, &size); /* already started: this process's rank */
    if (st != PL_OK)
        return st;
    int device = k_mpi_local_rank(), have = k_cuda_device_count();
    RankCheck mine = {.ok = device < have};
    if (!mine.ok)
        snprintf(mine.error, sizeof mine.error,
                 "rank %d is process %d on its host, which needs GPU %d; the host shows %d "
                 "(run one process per GPU: mpirun -np N with at most as many per host as it "
                 "has GPUs)",
                 rank, device, device, have);
    GroupStart start = {0};
    if (rank == 0)
        start = gather_checks(&mine, size);
    else
        k_mpi_gather(&mine, NULL, sizeof mine, 0, NULL);
    k_mpi_bcast(&start, sizeof start);
    if (!start.check.ok)
        return pl_error_set(PL_ERR_UNSUPPORTED, "%s", start.check.error);
    return k_cuda_open_rank(o, rank, device, start.group_id, ranks);
}
#endif

Status k_open(const KernelOpenOptions *o, KernelOps **ranks) {
    KernelOpenOptions opt = *o;
    opt.size = o->size > 1 ? o->size : 1;
    if (!strcmp(o->backend, "cpu"))
        return cpu_open(&opt, ranks);
    opt.mpi = o->mpi && opt.size > 1;
#ifdef PAGELLM_HAVE_CUDA
    if (!strcmp(o->backend, "cuda") && opt.mpi)
        return open_cuda_mpi(&opt, ranks);
    if (!strcmp(o->backend, "cuda"))
        return k_cuda_open(&opt, ranks);
#else
    if (!strcmp(o->backend, "cuda"))
        return pl_error_set(PL_ERR_UNSUPPORTED,
                            "the cuda backend is not in this build (configure found no "
                            "nvcc/cuBLAS, or --cpu-only)");
#endif
    return pl_error_set(PL_ERR_INVALID, "no backend named '%s' (cpu, cuda)", o->backend);
}

void k_close(KernelOps **ranks, int size) {
    if (!ranks || size < 1 || !ranks[0])
        return;
    if (!strcmp(ranks[0]->name, "cpu")) {
        for (int i = 0; i < size; i++)
            if (ranks[i])
                cpu_close(ranks[i]);
        return;
    }
#ifdef PAGELLM_HAVE_CUDA
    k_cuda_close(ranks, size);
#endif
}

size_t k_kv_half_elems(const KvLayout *l) {
    return (size_t)l->block_size * (size_t)l->num_kv_heads * (size_t)l->head_dim;
}

size_t k_kv_block_elems(const KvLayout *l) {
    return (size_t)l->num_layers * 2 * k_kv_half_elems(l);
}

/* theta^(-2i / dim) for i < dim / 2, as transformers' default frequencies (the power taken in
 * double and rounded once). */
static void default_inv_freq(float *inv_freq, int dim, float theta) {
    for (int i = 0; i < dim / 2; i++) {
        float e = (float)(2 * i) / (float)dim;
        float p = (float)pow((double)theta, (double)e);
        inv_freq[i] = 1.0f / p;
    }
}

/* Llama 3.1's bands, mirroring _compute_llama3_parameters step by step in float32 (torch
 * evaluates it on float32 tensors), so that which band each frequency falls into matches. */
static void llama3_scale(float *inv_freq, int half, const RopeScaling *s) {
    PL_CHECK(s->high_freq_factor != s->low_freq_factor && s->original_max_position > 0);
    float factor = s->factor, low_freq_factor = s->low_freq_factor;
    float old_ctx = (float)s->original_max_position;
    float low_freq_wavelen = (float)((double)s->original_max_position / (double)low_freq_factor);
    float high_freq_wavelen =
        (float)((double)s->original_max_position / (double)s->high_freq_factor);
    float band = (float)((double)s->high_freq_factor - (double)low_freq_factor);
    for (int i = 0; i < half; i++) {
        float inv = inv_freq[i];
        /* torch evaluates `2 * math.pi / t` as reciprocal(t) * (2 * pi) */
        float wavelen = (1.0f / inv) * (float)(2.0 * M_PI);
        float v = wavelen > low_freq_wavelen ? inv / factor : inv;
        int medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
        if (medium) {
            float smooth = ((1.0f / wavelen) * old_ctx - low_freq_factor) / band;
            v = (1.0f - smooth) * v / factor + smooth * v;
        }
        inv_freq[i] = v;
    }
}

static double yarn_mscale(double scale, double m) {
    return scale <= 1 ? 1.0 : 0.1 * m * log(scale) + 1.0;
}

/* _compute_yarn_parameters: the ramp between extrapolated and interpolated frequencies. */
static float yarn_scale(float *inv_freq, int dim, float theta, const RopeScaling *s) {
    PL_CHECK(s->original_max_position > 0);
    double factor = s->factor > 0 ? s->factor : (double)s->max_position / s->original_max_position;
    double att = s->attention_factor;
    if (!(att > 0))
        att = s->mscale > 0 && s->mscale_all_dim > 0
                  ? yarn_mscale(factor, s->mscale) / yarn_mscale(factor, s->mscale_all_dim)
                  : yarn_mscale(factor, 1.0);
    double beta_fast = s->beta_fast > 0 ? s->beta_fast : 32,
           beta_slow = s->beta_slow > 0 ? s->beta_slow : 1;
    double lo = (dim * log(s->original_max_position / (beta_fast * 2 * M_PI))) / (2 * log(theta));
    double hi = (dim * log(s->original_max_position / (beta_slow * 2 * M_PI))) / (2 * log(theta));
    if (s->truncate) {
        lo = floor(lo);
        hi = ceil(hi);
    }
    lo = lo > 0 ? lo : 0;
    hi = hi < dim - 1 ? hi : dim - 1;
    if (lo == hi)
        hi += 0.001; /* as transformers: no singular ramp */
    for (int i = 0; i < dim / 2; i++) {
        float extra = inv_freq[i]; /* 1 / pos_freq */
        float pos_freq = 1.0f / extra;
        float inter = 1.0f / ((float)factor * pos_freq);
        float ramp = (float)(((double)i - lo) / (hi - lo));
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        float ext_factor = 1.0f - ramp;
        inv_freq[i] = inter * (1.0f - ext_factor) + extra * ext_factor;
    }
    return (float)att;
}

/* _compute_longrope_parameters: the default frequencies divided by the short (or long)
 * factors. */
static float longrope_scale(float *inv_freq, float *long_inv_freq, int dim, const RopeScaling *s) {
    PL_CHECK(s->original_max_position > 0 && s->num_factors == dim / 2);
    double factor = s->factor > 0 ? s->factor : (double)s->max_position / s->original_max_position;
    double att = s->attention_factor > 0 ? s->attention_factor
                 : factor <= 1.0         ? 1.0
                                 : sqrt(1 + log(factor) / log((double)s->original_max_position));
    for (int i = 0; i < dim / 2; i++) {
        float base_pow = 1.0f / inv_freq[i];
        if (long_inv_freq)
            long_inv_freq[i] = 1.0f / (s->long_factor[i] * base_pow);
        inv_freq[i] = 1.0f / (s->short_factor[i] * base_pow);
    }
    return (float)att;
}

float k_rope_freqs(float *inv_freq, float *long_inv_freq, int rot_dim, float theta,
                   const RopeScaling *s) {
    PL_CHECK(rot_dim > 0 && rot_dim % 2 == 0);
    const int half = rot_dim / 2;
    default_inv_freq(inv_freq, rot_dim, theta);
    float att = 1.0f;
    switch (s ? s->type : ROPE_DEFAULT) {
        case ROPE_DEFAULT:
        case ROPE_DYNAMIC: /* = default up to max_position_embeddings (kernels.h) */
            break;
        case ROPE_LINEAR:
            for (int i = 0; i < half; i++)
                inv_freq[i] /= s->factor;
            break;
        case ROPE_LLAMA3:
            llama3_scale(inv_freq, half, s);
            break;
        case ROPE_YARN:
            att = yarn_scale(inv_freq, rot_dim, theta, s);
            break;
        case ROPE_LONGROPE:
            return longrope_scale(inv_freq, long_inv_freq, rot_dim, s);
    }
    if (long_inv_freq)
        memcpy(long_inv_freq, inv_freq, (size_t)half * sizeof *inv_freq);
    return att;
}

void k_rope_inv_freq(float *inv_freq, int head_dim, float theta, float llama3_factor,
                     float low_freq_factor, float high_freq_factor, int original_max_pos) {
    RopeScaling s = {.type = llama3_factor > 0 ? ROPE_LLAMA3 : ROPE_DEFAULT,
                     .factor = llama3_factor,
                     .low_freq_factor = low_freq_factor,
                     .high_freq_factor = high_freq_factor,
                     .original_max_position = original_max_pos};
    k_rope_freqs(inv_freq, NULL, head_dim, theta, &s);
}

/* splitmix64's finaliser: a bijective 64-bit mixer with full avalanche. */
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Counter-based: the value for (seed, index) needs no state, so a request's draws do not
 * depend on what else ran in its batch or whether it was preempted and resumed. */
uint64_t k_random_bits(uint64_t seed, uint64_t index) {
    uint64_t z = mix64(seed + 0x9e3779b97f4a7c15ull);
    return mix64(z ^ (index * 0xd1b54a32d192ed03ull + 0x8cb92ba72f3d8dd7ull));
}

float k_random_uniform(uint64_t seed, uint64_t index) {
    return (float)(k_random_bits(seed, index) >> 40) * (1.0f / 16777216.0f);
}

/* E = -log(1 - v) for v = m 2^-53: below 2^-5 the series v + v^2 / 2 + v^3 / 3 (v rounded to a
 * float keeps its relative precision; the terms left out add under 2^-16 of v), else the
 * logarithm of 1 - v = (2^53 - m) 2^-53 formed from the integer (never 0, and exact near 1,
 * where a float v would round up to 1 and E to +inf). */
float k_random_exponential_of(uint64_t m) {
    if (m < (1ull << 48)) {
        float v = (float)m * 0x1p-53f;
        return v + v * v * 0.5f + v * v * v * (1.0f / 3.0f);
    }
    return -logf((float)((1ull << 53) - m) * 0x1p-53f);
}

float k_random_exponential(uint64_t bits, uint32_t token) {
    uint64_t h = mix64(bits ^ ((uint64_t)token * 0x9fb21c651e98df25ull + 0x2545f4914f6cdd1dull));
    return k_random_exponential_of(h >> 11);
}

SamplingParams sampling_params_default(void) {
    SamplingParams p = {
        .temperature = 0.0f,
        .top_p = 1.0f,
        .top_k = 0,
        .min_p = 0.0f,
        .repetition_penalty = 1.0f,
        .presence_penalty = 0.0f,
        .frequency_penalty = 0.0f,
        .seed = 0,
    };
    return p;
}

int sampling_greedy(const SamplingParams *p) {
    return !(p->temperature >= 1e-5f);
}

int sampling_temperature_only(const SamplingParams *p, int vocab) {
    return !sampling_greedy(p) && (p->top_k <= 0 || p->top_k >= vocab) && !(p->top_p < 1.0f) &&
           !(p->min_p > 0.0f);
}
