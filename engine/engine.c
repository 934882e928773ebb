/* engine.c - engine creation (backend, model, tokenizer, KV pools sized from memory, block
 * manager, scheduler; the runner, sampler and output it owns), the thread-safe inbox (add,
 * abort, wait) and statistics. The step loop is in step.c; engine_internal.h lists the
 * parts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine_internal.h"

#define WATERMARK 0.01f

EngineConfig eng_config_default(void) {
    return (EngineConfig){.model_dir = NULL,
                          .device = "auto",
                          .dtype = "auto",
                          .tensor_parallel_size = 1,
                          .block_size = 16,
                          .max_num_batched_tokens = 0,
                          .max_num_seqs = 0,
                          .enable_chunked_prefill = 1,
                          .enable_prefix_caching = 1,
                          .preemption_mode = PREEMPT_SWAP,
                          .schedule_conservativeness = 1.0,
                          .gpu_memory_utilization = 0.9,
                          .swap_space_gib = 4,
                          .async_scheduling = 1};
}

/* The activation dtype: dtype "auto" is bfloat16 on CUDA for a bfloat16 checkpoint and
 * float16 for a float16 one (weights are converted to the act dtype at upload), else
 * float32. bfloat16 and float16 need the CUDA backend. */
static Status pick_act(const char *dtype, int cuda, const char *model_dir, DType *act) {
    const char *d = dtype ? dtype : "auto";
    if (!strcmp(d, "float32")) {
        *act = DT_F32;
    } else if (!strcmp(d, "bfloat16") || !strcmp(d, "float16")) {
        if (!cuda)
            return pl_error_set(PL_ERR_UNSUPPORTED,
                                "dtype %s: the cpu backend computes in float32 (use dtype "
                                "auto or float32)",
                                d);
        *act = d[0] == 'b' ? DT_BF16 : DT_F16;
    } else if (!strcmp(d, "auto")) {
        ModelConfig mc;
        Status st = cuda ? model_config_load(model_dir, &mc) : PL_OK;
        if (st != PL_OK)
            return st;
        *act = !cuda                       ? DT_F32
               : mc.torch_dtype == DT_BF16 ? DT_BF16
               : mc.torch_dtype == DT_F16  ? DT_F16
                                           : DT_F32;
    } else {
        return pl_error_set(PL_ERR_INVALID,
                            "dtype '%s' is not one of auto, float32, bfloat16, float16", d);
    }
    return PL_OK;
}

/* The backend by name and its activations: device auto takes the GPU when this build has
 * CUDA and the machine has a GPU. */
static Status pick_backend(const EngineConfig *c, KernelOpenOptions *o) {
    const char *device = c->device ? c->device : "auto";
    int want_cuda = !strcmp(device, "cuda");
    if (strcmp(device, "auto") && strcmp(device, "cpu") && !want_cuda)
        return pl_error_set(PL_ERR_INVALID, "device '%s' is not one of auto, cpu, cuda", device);
    int tp = c->tensor_parallel_size > 1 ? c->tensor_parallel_size : 1;
    *o = (KernelOpenOptions){.backend = "cpu",
                             .act = DT_F32,
                             .size = tp,
                             .cpu_threads = c->cpu_threads,
                             .custom_all_reduce = !c->disable_custom_all_reduce};
    if (!strcmp(device, "cpu") || (!want_cuda && k_device_count("cuda") == 0))
        return pick_act(c->dtype, 0, c->model_dir, &o->act);
    o->backend = "cuda";
    if (k_device_count("cuda") == 0) /* k_open says why: no GPU, or a build without CUDA */
        return PL_OK;
    return pick_act(c->dtype, 1, c->model_dir, &o->act);
}

/* Open the backend's ranks (tensor-parallel-size of them), and the CPU backend the sampler uses
 * on the host beside a GPU. */
static Status open_backends(Engine *e) {
    KernelOpenOptions o;
    Status st = pick_backend(&e->cfg, &o);
    if (st != PL_OK)
        return st;
    o.mpi = o.size > 1 && k_mpi_active(); /* one rank per process: this one's */
    e->run.backends = pl_xcalloc((size_t)o.size, sizeof *e->run.backends);
    if ((st = k_open(&o, e->run.backends)) != PL_OK)
        return st;
    e->run.tp = o.size;
    e->run.mpi = o.mpi;
    e->ops = e->run.backends[0];
    e->smp.host = e->ops;
    if (e->ops->host_memory)
        return PL_OK;
    KernelOpenOptions cpu = {.backend = "cpu", .act = DT_F32, .cpu_threads = e->cfg.cpu_threads};
    if ((st = k_open(&cpu, &e->smp.host_owned)) != PL_OK)
        return st;
    e->smp.host = e->smp.host_owned;
    return PL_OK;
}

static Status check_config(const EngineConfig *c) {
    int bs = c->block_size;
    if (bs != 8 && bs != 16 && bs != 32 && bs != 64 && bs != 128)
        return pl_error_set(PL_ERR_INVALID, "block-size %d is not one of 8, 16, 32, 64, 128", bs);
    if (c->max_model_len < 0)
        return pl_error_set(PL_ERR_INVALID, "max-model-len %d must be positive", c->max_model_len);
    if (c->max_num_batched_tokens < 0)
        return pl_error_set(PL_ERR_INVALID, "max-num-batched-tokens %d must be positive",
                            c->max_num_batched_tokens);
    if (c->max_num_seqs < 0)
        return pl_error_set(PL_ERR_INVALID, "max-num-seqs %d must be positive", c->max_num_seqs);
    if (c->num_gpu_blocks_override < 0)
        return pl_error_set(PL_ERR_INVALID, "num-gpu-blocks-override %d must not be negative",
                            c->num_gpu_blocks_override);
    if (!(c->gpu_memory_utilization > 0 && c->gpu_memory_utilization <= 1))
        return pl_error_set(PL_ERR_INVALID, "gpu-memory-utilization %g is not in (0, 1]",
                            c->gpu_memory_utilization);
    if (!(c->schedule_conservativeness >= 0))
        return pl_error_set(PL_ERR_INVALID, "schedule-conservativeness %g must not be negative",
                            c->schedule_conservativeness);
    if (!(c->swap_space_gib >= 0) || !(c->kv_cache_memory_gib >= 0))
        return pl_error_set(PL_ERR_INVALID, "swap-space and kv-cache-memory must not be negative");
    return PL_OK;
}

/* The block manager's configuration, from the engine's and the model's (pools sized). */
static BlockManagerConfig block_config(const Engine *e) {
    const EngineConfig *c = &e->cfg;
    return (BlockManagerConfig){.num_gpu_blocks = e->num_gpu_blocks,
                                .num_cpu_blocks = e->num_cpu_blocks,
                                .block_size = c->block_size,
                                .watermark = WATERMARK,
                                .enable_prefix_caching = c->enable_prefix_caching,
                                .sliding_window = model_kv_window(model_config(e->model)),
                                .max_step_tokens = c->max_num_batched_tokens};
}

/* Size both pools. More blocks than max_num_seqs full-length sequences could use are never
 * allocated (the pools are lazily touched memory, but an absurd size helps nobody). */
static Status size_pools(Engine *e) {
    const EngineConfig *c = &e->cfg;
    double useful = (double)c->max_num_seqs * e->run.max_blocks_per_seq + 1;
    int gpu;
    if (c->num_gpu_blocks_override > 0) {
        gpu = c->num_gpu_blocks_override;
    } else {
        /* the weights and activations are loaded already: a share of what is left */
        double bytes = c->kv_cache_memory_gib > 0
                           ? c->kv_cache_memory_gib * PL_GIB
                           : c->gpu_memory_utilization * (double)e->ops->free_memory(e->ops);
        double blocks = bytes / (double)e->block_bytes;
        gpu = (int)(blocks < useful ? blocks : useful);
    }
    double cpu_blocks = c->swap_space_gib * PL_GIB / (double)e->block_bytes;
    int cpu = (int)(cpu_blocks < useful ? cpu_blocks : useful);
    if (gpu < 1)
        return pl_error_set(PL_ERR_NOMEM,
                            "no %s memory left for one KV-cache block of %zu bytes after the "
                            "weights (lower max-num-batched-tokens, or use a larger device)",
                            e->ops->name, e->block_bytes);
    e->num_gpu_blocks = gpu;
    e->num_cpu_blocks = cpu;
    /* One sequence must always fit the pool (minus the admission watermark), or it could
     * be preempted forever: cap max-model-len to what the pool holds (behind a sliding window
     * on every layer, a sequence holds only the window's blocks and a chunk's). */
    int usable = (gpu - (int)(WATERMARK * gpu)) * c->block_size;
    const BlockManagerConfig bc = block_config(e);
    if (blk_peak_blocks(&bc, e->max_model_len) * c->block_size > usable) {
        if (!c->quiet)
            fprintf(stderr,
                    "pagellm: max-model-len lowered from %d to %d, the tokens the KV "
                    "cache holds\n",
                    e->max_model_len, usable);
        e->max_model_len = usable;
    }
    return PL_OK;
}

/* The host step buffers and per-step host arrays (each rank's device copies: runner.c). */
static void alloc_host_buffers(Engine *e) {
    size_t sizes[BATCH_FIELDS];
    void **h[BATCH_FIELDS];
    eng_batch_sizes(e, sizes);
    eng_batch_fields(&e->run.h, h);
    size_t s = (size_t)e->cfg.max_num_seqs;
    e->smp.fork_logits = pl_xmalloc((size_t)model_config(e->model)->vocab_size * sizeof(float));
    e->smp.host_rows = pl_xmalloc(s * sizeof(SampleRow));
    e->smp.sampled = pl_xmalloc(s * sizeof(int32_t));
    e->smp.mask = pl_xmalloc(eng_mask_words(e) * sizeof(uint32_t));
    for (int i = 0; i < BATCH_FIELDS; i++)
        *h[i] = pl_xcalloc(1, sizes[i]);
}

static void free_host_buffers(Engine *e) {
    void **h[BATCH_FIELDS];
    eng_batch_fields(&e->run.h, h);
    for (int i = 0; i < BATCH_FIELDS; i++)
        free(*h[i]);
    free(e->smp.fork_logits);
    free(e->smp.fork_tokens);
    free(e->smp.host_rows);
    free(e->smp.host_history);
    free(e->smp.sampled);
    free(e->smp.mask);
}

static Status create_scheduling(Engine *e) {
    const EngineConfig *c = &e->cfg;
    const BlockManagerConfig bc = block_config(e);
    if (!(e->bm = blk_create(&bc)))
        return PL_ERR_INVALID;
    SchedulerConfig sc = {.max_num_seqs = c->max_num_seqs,
                          .max_num_batched_tokens = c->max_num_batched_tokens,
                          .max_model_len = e->max_model_len,
                          .enable_chunked_prefill = c->enable_chunked_prefill,
                          .preemption_mode = c->preemption_mode,
                          .conservativeness = c->schedule_conservativeness};
    if (!(e->sched = sched_create(&sc, e->bm)))
        return PL_ERR_INVALID;
    return PL_OK;
}

static void print_budget(const Engine *e, double free_before_kv) {
    double mib = 1024.0 * 1024.0;
    char format[320];
    model_weight_format(e->model, format, sizeof format);
    double all = (double)model_weight_bytes(e->model) * e->run.tp; /* every rank's */
    fprintf(stderr, "pagellm: weights: %s, %.2f %s\n", format, all >= 1e9 ? all / 1e9 : all / 1e6,
            all >= 1e9 ? "GB" : "MB");
    fprintf(stderr,
            "pagellm: device %s, %s activations; weights %.1f MiB, activations %.1f MiB, "
            "%.1f MiB free before the KV cache\n",
            e->ops->name, pl_dtype_name(e->ops->act), model_weight_bytes(e->model) / mib,
            model_activation_bytes(e->model) / mib, free_before_kv / mib);
    /* size_pools caps swap-space (and kv-cache-memory) to the blocks max-num-seqs
     * full-length sequences can use: say so rather than show a smaller pool unexplained */
    double swap_asked = e->cfg.swap_space_gib * PL_GIB / (double)e->block_bytes;
    char capped[160] = "";
    if (swap_asked >= e->num_cpu_blocks + 1.0)
        snprintf(capped, sizeof capped,
                 "; swap-space %g GiB capped to what max-num-seqs (%d) sequences of full length "
                 "can use",
                 e->cfg.swap_space_gib, e->cfg.max_num_seqs);
    fprintf(stderr,
            "pagellm: KV cache: %s, %d blocks of %d tokens (%.1f MiB, %d tokens), "
            "swap: %d blocks (%.1f MiB%s); max-model-len %d\n",
            pl_dtype_name(e->kv_layout.dtype), e->num_gpu_blocks, e->cfg.block_size,
            e->num_gpu_blocks * (double)e->block_bytes / mib, e->num_gpu_blocks * e->cfg.block_size,
            e->num_cpu_blocks, e->num_cpu_blocks * (double)e->block_bytes / mib, capped,
            e->max_model_len);
    if (e->run.num_graphs)
        fprintf(stderr, "pagellm: %d decode graphs (batch 1 to %d) captured in %.2f s\n",
                e->run.num_graphs, e->run.graph_size[e->run.num_graphs - 1], e->run.graph_seconds);
}

/* max-num-seqs and max-num-batched-tokens left at 0: on a GPU with 70 GiB or more free, 1024
 * sequences and 8192 tokens per step (an 8B model's GEMMs reach more of their FLOP rate at 1024
 * rows than at 256; the H200's 128/128 offline throughput goes from 14.6k to 16.1k tokens/s),
 * else 256 and 2048, as vLLM chooses by device memory; without chunked prefill, tokens enough
 * for a max-model-len prompt. */
static Status pick_batch_limits(Engine *e) {
    EngineConfig *c = &e->cfg;
    const int big = !e->ops->host_memory && (double)e->ops->free_memory(e->ops) >= 70.0 * PL_GIB;
    if (c->max_num_seqs == 0)
        c->max_num_seqs = big ? 1024 : 256;
    if (c->max_num_batched_tokens == 0) {
        c->max_num_batched_tokens = big ? 8192 : 2048;
        int len = c->max_model_len;
        ModelConfig mc;
        if (!c->enable_chunked_prefill && !len) {
            Status st = model_config_load(c->model_dir, &mc);
            if (st != PL_OK)
                return st;
            len = mc.max_position_embeddings;
        }
        if (!c->enable_chunked_prefill && len > c->max_num_batched_tokens)
            c->max_num_batched_tokens = len;
    }
    return PL_OK;
}

Status eng_create(const EngineConfig *cfg, Engine **out) {
    *out = NULL;
    Status st = check_config(cfg);
    if (st != PL_OK)
        return st;
    Engine *e = pl_xcalloc(1, sizeof *e);
    e->cfg = *cfg;
    pthread_mutex_init(&e->mu, NULL);
    pthread_mutex_init(&e->gr_mu, NULL);
    pthread_cond_init(&e->work, NULL);
    if ((st = open_backends(e)) != PL_OK || (st = pick_batch_limits(e)) != PL_OK ||
        (st = eng_ranks_start(e)) != PL_OK)
        goto fail;
    RankJob job = {.kind = JOB_LOAD};
    if ((st = eng_ranks_run(e, &job)) != PL_OK)
        goto fail;
    e->model = e->run.ranks[0].model;
    /* A folder without tokenizer.json still serves token ids (as vLLM's
     * skip_tokenizer_init); text in or out then needs a tokenizer and is refused. */
    char tok_path[4096];
    snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", cfg->model_dir);
    if (access(tok_path, F_OK) == 0 && (st = tok_load(cfg->model_dir, &e->tok)) != PL_OK)
        goto fail;
    const ModelConfig *mc = model_config(e->model);
    e->max_model_len = cfg->max_model_len ? cfg->max_model_len : mc->max_position_embeddings;
    if (e->max_model_len > mc->max_position_embeddings) {
        st = pl_error_set(PL_ERR_INVALID, "max-model-len %d exceeds the model's %d positions",
                          e->max_model_len, mc->max_position_embeddings);
        goto fail;
    }
    e->kv_layout = model_kv_layout(e->model, cfg->block_size);
    e->block_bytes = k_kv_block_elems(&e->kv_layout) * pl_dtype_size(e->kv_layout.dtype);
    e->run.max_blocks_per_seq = (e->max_model_len + cfg->block_size - 1) / cfg->block_size;
    alloc_host_buffers(e);
    job.kind = JOB_BUFFERS;
    if ((st = eng_ranks_run(e, &job)) != PL_OK || (st = eng_warm_up(e)) != PL_OK)
        goto fail;
    double free_before_kv =
        (double)e->ops->free_memory(e->ops); /* rank 0's device, as every rank */
    if ((st = size_pools(e)) != PL_OK)
        goto fail;
    job.kind = JOB_POOLS;
    if ((st = eng_ranks_run(e, &job)) != PL_OK || (st = create_scheduling(e)) != PL_OK ||
        (st = eng_device_sampler_init(e)) != PL_OK || (st = eng_overlap_start(e)) != PL_OK ||
        (st = eng_capture_graphs(e)) != PL_OK)
        goto fail;
    if (!cfg->quiet)
        print_budget(e, free_before_kv);
    *out = e;
    return PL_OK;
fail:
    eng_destroy(e);
    return st;
}

int eng_follow(const EngineConfig *cfg) {
    Engine *e = pl_xcalloc(1, sizeof *e);
    e->cfg = *cfg;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->work, NULL);
    Status st = check_config(cfg);
    if (st == PL_OK && (st = open_backends(e)) == PL_OK && !e->run.mpi)
        st = pl_error_set(PL_ERR_INVALID, "not a rank of an MPI job (tensor-parallel-size %d)",
                          cfg->tensor_parallel_size);
    if (st == PL_OK)
        st = eng_ranks_start(e);
    int rc = eng_ranks_follow(e, st); /* answers every job with st when that failed */
    eng_destroy(e);
    return rc;
}

void eng_destroy(Engine *e) {
    if (!e)
        return;
    for (int i = 0; i < e->active_n; i++)
        eng_request_free(e, e->active[i]);
    for (int i = 0; i < e->inbox_n; i++)
        eng_request_free(e, e->inbox[i]);
    free(e->active);
    free(e->inbox);
    free(e->aborts);
    eng_overlap_stop(e);
    eng_device_sampler_free(e);
    eng_ranks_stop(e);
    sched_destroy(e->sched);
    blk_destroy(e->bm);
    tok_destroy(e->tok);
    free_host_buffers(e);
    if (e->run.backends)
        k_close(e->run.backends, e->run.tp);
    free(e->run.backends);
    k_close(&e->smp.host_owned, 1);
    free(e->run.graph_size);
    free(e->out.events);
    free(e->out.text);
    free(e->smp.top_ids);
    free(e->smp.top_vals);
    free(e->smp.raw_rows);
    free(e->smp.edits);
    gr_vocab_free(e->gr_vocab);
    pthread_mutex_destroy(&e->gr_mu);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->work);
    free(e);
}

const Tokenizer *eng_tokenizer(const Engine *e) {
    return e->tok;
}

const ModelConfig *eng_model_config(const Engine *e) {
    return model_config(e->model);
}

int eng_max_num_seqs(const Engine *e) {
    return e->cfg.max_num_seqs;
}

int eng_max_model_len(const Engine *e) {
    return e->max_model_len;
}

const char *eng_device_name(const Engine *e) {
    return e->ops->name;
}

const char *eng_finish_reason_str(FinishReason r) {
    switch (r) {
        case FINISH_LENGTH:
            return "length";
        case FINISH_STOP:
            return "stop";
        case FINISH_ABORT:
            return "abort";
        case FINISH_NONE:
            break;
    }
    return "none";
}

/* PL_ERR_INVALID naming `what` ("stop token id") when one of ids[n] is outside the vocabulary. */
static Status ids_in_vocab(const int32_t *ids, int n, int vocab, const char *what) {
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            return pl_error_set(PL_ERR_INVALID, "%s %d is outside the vocabulary [0, %d)", what,
                                ids[i], vocab);
    return PL_OK;
}

/* Checks that need no engine-thread state, so they run on the caller's thread. */
static Status validate_request(const Engine *e, const EngRequest *r) {
    if (r->num_prompt <= 0)
        return pl_error_set(PL_ERR_INVALID, "the prompt is empty (no tokens)");
    if (r->num_prompt >= e->max_model_len)
        return pl_error_set(PL_ERR_INVALID,
                            "the prompt has %d tokens; max-model-len is %d, which leaves no "
                            "room to generate",
                            r->num_prompt, e->max_model_len);
    int vocab = model_config(e->model)->vocab_size;
    for (int i = 0; i < r->num_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= vocab)
            return pl_error_set(PL_ERR_INVALID,
                                "token id %d at prompt position %d is outside the vocabulary "
                                "[0, %d)",
                                r->prompt[i], i, vocab);
    if (r->params.max_tokens <= 0)
        return pl_error_set(PL_ERR_INVALID, "max_tokens must be at least 1");
    if (r->params.top_logprobs < 0 || r->params.top_logprobs > 64)
        return pl_error_set(PL_ERR_INVALID, "top_logprobs = %d is not in [0, 64]",
                            r->params.top_logprobs);
    if (r->params.min_tokens < 0 || r->params.min_tokens > r->params.max_tokens)
        return pl_error_set(PL_ERR_INVALID, "min_tokens = %d is not in [0, max_tokens = %d]",
                            r->params.min_tokens, r->params.max_tokens);
    if (r->params.num_logit_bias < 0 || r->params.num_logit_bias > vocab ||
        (r->params.num_logit_bias > 0 && !r->params.logit_bias))
        return pl_error_set(PL_ERR_INVALID,
                            "logit_bias has %d entries; at most %d (the vocabulary)",
                            r->params.num_logit_bias, vocab);
    for (int i = 0; i < r->params.num_logit_bias; i++) {
        const LogitBias *b = &r->params.logit_bias[i];
        if (b->token < 0 || b->token >= vocab || !(b->bias >= -100.0f && b->bias <= 100.0f))
            return pl_error_set(PL_ERR_INVALID,
                                "logit_bias entry %d (token %d, bias %g) is not a token of the "
                                "vocabulary [0, %d) with a bias in [-100, 100]",
                                i, b->token, (double)b->bias, vocab);
    }
    const GenerateParams *p = &r->params;
    if (p->num_allowed_token_ids < 0 || (p->num_allowed_token_ids > 0 && !p->allowed_token_ids))
        return pl_error_set(PL_ERR_INVALID, "allowed_token_ids: %d entries and no list",
                            p->num_allowed_token_ids);
    Status st =
        ids_in_vocab(p->allowed_token_ids, p->num_allowed_token_ids, vocab, "allowed token id");
    if (st != PL_OK)
        return st;
    if (p->num_bad_words < 0 || (p->num_bad_words > 0 && (!p->bad_words || !p->bad_word_lens)))
        return pl_error_set(PL_ERR_INVALID, "bad_words: %d entries and no list", p->num_bad_words);
    for (int i = 0, at = 0; i < p->num_bad_words; at += p->bad_word_lens[i++]) {
        if (p->bad_word_lens[i] < 1 || p->bad_word_lens[i] > e->max_model_len)
            return pl_error_set(PL_ERR_INVALID, "bad word %d has %d tokens", i,
                                p->bad_word_lens[i]);
        if ((st = ids_in_vocab(p->bad_words + at, p->bad_word_lens[i], vocab,
                               "bad word token id")) != PL_OK)
            return st;
    }
    if ((st = ids_in_vocab(p->stop_token_ids, p->num_stop_token_ids, vocab, "stop token id")) !=
        PL_OK)
        return st;
    if (r->params.n < 0 || r->params.n > e->cfg.max_num_seqs)
        return pl_error_set(PL_ERR_INVALID, "n = %d is not in [1, max-num-seqs = %d]", r->params.n,
                            e->cfg.max_num_seqs);
    if (!e->cfg.enable_chunked_prefill && r->num_prompt > e->cfg.max_num_batched_tokens)
        return pl_error_set(PL_ERR_INVALID,
                            "the prompt has %d tokens, more than max-num-batched-tokens %d "
                            "(and chunked prefill is off)",
                            r->num_prompt, e->cfg.max_num_batched_tokens);
    return PL_OK;
}

/* A copy of n ids (NULL for none). */
static int32_t *int32_copy(const int32_t *ids, int n) {
    return n > 0 ? memcpy(pl_xmalloc((size_t)n * sizeof(int32_t)), ids, (size_t)n * sizeof(int32_t))
                 : NULL;
}

Status eng_add_request(Engine *e, const EngRequest *r, uint64_t *id) {
    Status st = validate_request(e, r);
    if (st == PL_OK && r->params.constraint)
        st = eng_constraint_vocab(e);
    if (st != PL_OK)
        return st;
    Request *q = pl_xcalloc(1, sizeof *q);
    q->user = r->user;
    q->params = r->params;
    q->t_added = pl_now();
    q->n = r->params.n > 1 ? r->params.n : 1;
    q->prompt = int32_copy(r->prompt, r->num_prompt);
    q->num_prompt = r->num_prompt;
    q->stop_ids = int32_copy(r->params.stop_token_ids, r->params.num_stop_token_ids);
    q->params.stop_token_ids = q->stop_ids;
    if (r->params.num_logit_bias > 0) {
        size_t bytes = (size_t)r->params.num_logit_bias * sizeof(LogitBias);
        q->bias = memcpy(pl_xmalloc(bytes), r->params.logit_bias, bytes);
    }
    q->params.logit_bias = q->bias;
    if (r->params.num_allowed_token_ids > 0) {
        q->allowed_mask = pl_xcalloc(eng_mask_words(e), sizeof(uint32_t));
        for (int i = 0; i < r->params.num_allowed_token_ids; i++) {
            int32_t t = r->params.allowed_token_ids[i];
            q->allowed_mask[t / 32] |= 1u << (t % 32);
        }
    }
    q->params.allowed_token_ids = NULL; /* kept as the mask */
    q->params.num_allowed_token_ids = 0;
    int bad_tokens = 0;
    for (int i = 0; i < r->params.num_bad_words; i++)
        bad_tokens += r->params.bad_word_lens[i];
    q->bad_words = int32_copy(r->params.bad_words, bad_tokens);
    q->bad_word_lens = int32_copy(r->params.bad_word_lens, r->params.num_bad_words);
    q->params.bad_words = q->bad_words;
    q->params.bad_word_lens = q->bad_word_lens;
    const char *after = r->params.constraint_after, *opener = r->params.constraint_opener;
    q->opener_token = opener ? tok_token_to_id(e->tok, opener) : -1;
    q->after_token = -1;
    /* a vocabulary without the opener's token never opens the section: constrained throughout */
    if (r->params.constraint && after && *after && (!opener || q->opener_token >= 0)) {
        q->constraint_after = pl_xstrdup(after);
        q->after_token = tok_token_to_id(e->tok, after);
    }
    q->params.constraint_after = q->constraint_after;
    q->params.constraint_opener = NULL; /* only its token is kept */
    q->seqs = pl_xcalloc((size_t)q->n, sizeof *q->seqs);
    q->data = pl_xcalloc((size_t)q->n, sizeof *q->data);
    pthread_mutex_lock(&e->mu);
    uint64_t new_id = q->id = ++e->next_request_id; /* q may be freed once the lock is gone */
    if (e->inbox_n == e->inbox_cap) {
        e->inbox_cap = e->inbox_cap ? 2 * e->inbox_cap : 16;
        e->inbox = pl_xrealloc(e->inbox, (size_t)e->inbox_cap * sizeof *e->inbox);
    }
    e->inbox[e->inbox_n++] = q;
    pthread_cond_signal(&e->work);
    pthread_mutex_unlock(&e->mu);
    if (id)
        *id = new_id;
    return PL_OK;
}

void eng_abort(Engine *e, uint64_t id) {
    pthread_mutex_lock(&e->mu);
    if (e->aborts_n == e->aborts_cap) {
        e->aborts_cap = e->aborts_cap ? 2 * e->aborts_cap : 16;
        e->aborts = pl_xrealloc(e->aborts, (size_t)e->aborts_cap * sizeof *e->aborts);
    }
    e->aborts[e->aborts_n++] = id;
    pthread_cond_signal(&e->work);
    pthread_mutex_unlock(&e->mu);
}

void eng_abort_all(Engine *e) {
    eng_abort(e, ENG_ABORT_ALL);
}

int eng_has_work(Engine *e) {
    pthread_mutex_lock(&e->mu);
    int work = e->inbox_n > 0 || e->aborts_n > 0 || e->busy > 0;
    pthread_mutex_unlock(&e->mu);
    return work;
}

void eng_wait_for_work(Engine *e, int timeout_ms) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&e->mu);
    while (e->inbox_n == 0 && e->aborts_n == 0 && e->busy == 0)
        if (pthread_cond_timedwait(&e->work, &e->mu, &until) != 0)
            break;
    pthread_mutex_unlock(&e->mu);
}

/* The swap-in of eng_measure_swap again, beside decode compute: the largest decode graph
 * (padding rows, which read block 0 and write nothing) replayed for about the swap's time
 * while the blocks come in (their own contents again) on the swap stream. */
static void measure_beside_compute(Engine *e, const int32_t *pairs, int blocks, EngSwapTiming *t) {
    if (e->run.num_graphs == 0 || e->run.tp > 1)
        return;
    Rank *r = &e->run.ranks[0];
    const KernelOps *ops = e->ops;
    int g = e->run.num_graphs - 1, rows = e->run.graph_size[g];
    eng_pad_decode_rows(e, 0, rows);
    eng_upload_batch(e, r, rows, rows, rows, 1);
    ops->synchronize(ops);
    double t0 = pl_now();
    ops->graph_launch(ops, r->graphs[g]);
    ops->synchronize(ops);
    double one = pl_now() - t0;
    int reps = (int)(t->seconds_in / one) + 1;
    t0 = pl_now();
    for (int i = 0; i < reps; i++)
        ops->graph_launch(ops, r->graphs[g]);
    ops->synchronize(ops);
    t->seconds_compute = pl_now() - t0;
    t0 = pl_now();
    for (int i = 0; i < reps; i++)
        ops->graph_launch(ops, r->graphs[g]);
    ops->swap_blocks(ops, r->kv_gpu, r->kv_cpu, pairs, blocks, e->block_bytes, 0);
    ops->synchronize(ops); /* the compute stream waits for the swap */
    t->seconds_both = pl_now() - t0;
}

Status eng_measure_swap(Engine *e, int blocks, EngSwapTiming *t) {
    if (blocks <= 0 || blocks > e->num_gpu_blocks || blocks > e->num_cpu_blocks)
        return pl_error_set(PL_ERR_INVALID,
                            "cannot swap %d blocks: the pools hold %d (KV) and %d (swap space)",
                            blocks, e->num_gpu_blocks, e->num_cpu_blocks);
    int32_t *pairs = pl_xmalloc((size_t)blocks * 2 * sizeof(int32_t));
    for (int i = 0; i < blocks; i++)
        pairs[2 * i] = pairs[2 * i + 1] = i;
    const Rank *r = &e->run.ranks[0]; /* every rank swaps the same way, on its own link */
    void (*sync)(const KernelOps *) = e->ops->synchronize;
    if (sync)
        sync(e->ops);
    double t0 = pl_now();
    e->ops->swap_blocks(e->ops, r->kv_cpu, r->kv_gpu, pairs, blocks, e->block_bytes, 1);
    if (sync)
        sync(e->ops);
    double t1 = pl_now();
    e->ops->swap_blocks(e->ops, r->kv_gpu, r->kv_cpu, pairs, blocks, e->block_bytes, 1);
    if (sync)
        sync(e->ops);
    double t2 = pl_now();
    *t = (EngSwapTiming){.blocks = blocks,
                         .bytes = (double)blocks * (double)e->block_bytes,
                         .seconds_out = t1 - t0,
                         .seconds_in = t2 - t1};
    measure_beside_compute(e, pairs, blocks, t);
    free(pairs);
    return PL_OK;
}

EngineStats eng_stats(Engine *e) {
    EngineStats s = {.sched = sched_counters(e->sched),
                     .blocks = blk_stats(e->bm),
                     .num_gpu_blocks = e->num_gpu_blocks,
                     .num_cpu_blocks = e->num_cpu_blocks,
                     .free_gpu_blocks = blk_num_free_gpu(e->bm),
                     .free_cpu_blocks = blk_num_free_cpu(e->bm)};
    s.generated_tokens = e->generated_tokens;
    s.overlapped_steps = e->overlapped_steps;
    s.decode_steps = e->decode_steps;
    s.decode_seconds_schedule = e->decode_seconds[0];
    s.decode_seconds_prepare = e->decode_seconds[1];
    s.decode_seconds_forward = e->decode_seconds[2];
    s.decode_seconds_sample = e->decode_seconds[3];
    s.decode_seconds_emit = e->decode_seconds[4];
    s.decode_rows = e->decode_rows;
    s.other_steps = e->other_steps;
    s.other_tokens = e->other_tokens;
    for (int i = 0; i < e->active_n; i++) {
        Request *r = e->active[i];
        int running = 0, swapped = 0;
        for (int j = 0; j < r->num_started; j++) {
            const Sequence *q = r->seqs[j];
            running |= q->state == SEQ_RUNNING;
            swapped |= q->state == SEQ_SWAPPED;
            if (q->state != SEQ_RUNNING)
                continue;
            const int released = q->table.num_released * e->cfg.block_size;
            s.kv_slots_allocated += (int64_t)q->table.num_blocks * e->cfg.block_size - released;
            s.kv_slots_used += q->table.num_tokens - released;
        }
        if (running)
            s.num_requests_running++;
        else if (swapped)
            s.num_requests_swapped++;
        else if (r->num_finished < r->n)
            s.num_requests_waiting++;
    }
    pthread_mutex_lock(&e->mu);
    s.num_requests_waiting += e->inbox_n;
    pthread_mutex_unlock(&e->mu);
    return s;
}
