/* engine.h - the inference engine: model, tokenizer, paged KV cache (GPU pool + CPU swap
 * pool), block manager and scheduler, and the step loop that serves many requests at once.
 *
 * Threads: eng_add_request, eng_abort and eng_wait_for_work may be called from any thread;
 * eng_step from one engine thread only (it owns the scheduler and block manager, so they
 * need no locks). Each step schedules a batch (decode tokens and prefill chunks), runs the
 * model on it, samples, and returns output events: new tokens with their text, and finish
 * reasons. eng_generate is a single-request convenience over the same loop. */
#ifndef PAGELLM_ENGINE_H
#define PAGELLM_ENGINE_H

#include <stdint.h>

#include "common.h"
#include "grammar.h"
#include "model.h"
#include "sampling.h"
#include "scheduler.h"
#include "tokenizer.h"

typedef struct {
    const char *model_dir;            /* Hugging Face folder */
    const char *device;               /* "auto", "cpu" or "cuda" */
    const char *dtype;                /* activations and KV cache: "auto" (on cuda the checkpoint's
                                       * bfloat16 or float16, else float32), "float32", "bfloat16"
                                       * or "float16" (the 16-bit ones on cuda only) */
    int enforce_eager;                /* 1 = no CUDA graphs for decode */
    int async_scheduling;             /* 1 = schedule and launch step N + 1 before reading step
                                       * N's tokens (requests with penalties, logprobs or n > 1
                                       * still being forked make their steps wait) */
    int tensor_parallel_size;         /* GPUs (0..N-1) the model is split over; 0 or 1 = one */
    int disable_custom_all_reduce;    /* 1 = NCCL for every all-reduce (no one-shot NVLink path) */
    int cpu_threads;                  /* CPU backend threads, caller included; 0 = every CPU */
    int load_dummy;                   /* load-format dummy */
    const char *quantization;         /* NULL, or "fp8": quantize a 16/32-bit checkpoint's
                                       * linear layers at load (ModelLoadOptions.quantization) */
    uint64_t seed;                    /* dummy weights */
    int block_size;                   /* tokens per KV block: 8, 16, 32, 64, 128 */
    int kv_cache_fp8;                 /* kv-cache-dtype: 0 auto (the activations' dtype), 1 fp8
                                       * (e4m3, per-layer scales from the checkpoint, else 1) */
    int max_model_len;                /* 0 = the model's max_position_embeddings */
    int max_num_batched_tokens;       /* tokens per step (prefill chunk budget); 0 = 8192 on a
                                       * GPU with 70 GiB or more free, else 2048 */
    int max_num_seqs;                 /* sequences per step; 0 = 1024 there, else 256 */
    int enable_chunked_prefill;       /* split long prompts across steps */
    int enable_prefix_caching;        /* reuse computed prompt blocks across requests */
    PreemptionMode preemption_mode;   /* swap (recompute when the swap pool is full) */
    double schedule_conservativeness; /* admission reserves expected growth x this (0: none) */
    int num_gpu_blocks_override;      /* 0 = size from memory */
    double gpu_memory_utilization;    /* fraction of device memory (of RAM on CPU) for KV */
    double kv_cache_memory_gib;       /* CPU backend: KV pool size; 0 = from utilization */
    double swap_space_gib;            /* CPU swap pool for preempted sequences */
    int quiet;                        /* no memory-budget line on stderr */
} EngineConfig;

/* vLLM's defaults: device auto, block 16, batched tokens and sequences chosen by the device
 * (0: 8192 and 1024 on a GPU with 70 GiB free, else 2048 and 256), chunked prefill and
 * prefix caching on, swap preemption, utilization 0.9, swap space 4 GiB; and asynchronous
 * scheduling on, schedule conservativeness 1. */
EngineConfig eng_config_default(void);

typedef struct Engine Engine;

/* Load model and tokenizer, size the KV pools. Errors name the file, key or value. */
Status eng_create(const EngineConfig *cfg, Engine **out);
void eng_destroy(Engine *e);

/* Tensor-parallel ranks as MPI processes (mpirun -np N, k_mpi_init done, N =
 * tensor-parallel-size): rank 0 creates the engine as usual and broadcasts each rank job; every
 * other process calls eng_follow instead, which opens its rank, runs the jobs rank 0 sends
 * until the engine ends, and returns the process's exit code (1 when a job of any rank
 * failed). Rank 0 calls eng_mpi_release at its end: it ends the followers if no engine did
 * (failed: they exit 1). Both are no-ops without MPI. */
int eng_follow(const EngineConfig *cfg);
void eng_mpi_release(int failed);

/* The model's tokenizer, or NULL when its folder has no tokenizer.json (then only token-id
 * interfaces such as eng_prompt_logits work). */
const Tokenizer *eng_tokenizer(const Engine *e);
const ModelConfig *eng_model_config(const Engine *e);
int eng_max_model_len(const Engine *e);
int eng_max_num_seqs(const Engine *e);        /* the value in use (after the automatic choice) */
const char *eng_device_name(const Engine *e); /* backend actually used: "cpu", "cuda" */

typedef enum { FINISH_NONE = 0, FINISH_LENGTH, FINISH_STOP, FINISH_ABORT } FinishReason;
const char *eng_finish_reason_str(FinishReason r); /* "length", "stop", "abort" */

/* An addition to one token's logit before every sample of a request (OpenAI's logit_bias). */
typedef struct {
    int32_t token;
    float bias; /* [-100, 100] */
} LogitBias;

typedef struct {
    int max_tokens;              /* new tokens to generate at most */
    int min_tokens;              /* EOS and stop_token_ids cannot be sampled before this many
                                  * new tokens (0 .. max_tokens) */
    const LogitBias *logit_bias; /* [num_logit_bias] added to the raw logits before
                                  * penalties and sampling (copied; logprobs stay raw) */
    int num_logit_bias;
    int ignore_eos;                /* keep going past end-of-sequence tokens */
    int keep_special_tokens;       /* special tokens' text stays in the output text (OpenAI /
                                    * vLLM skip_special_tokens false); 0: dropped */
    int n;                         /* parallel samples sharing the prompt's blocks; 0 or 1 = one.
                                    * Sample i uses seed sampling.seed + i. */
    int logprobs;                  /* 1 = report each new token's log-probability */
    int top_logprobs;              /* with logprobs: also the k most likely tokens (k <= 64) */
    const int32_t *stop_token_ids; /* finish with "stop" when one is sampled (copied) */
    int num_stop_token_ids;
    /* Sample only these tokens (vLLM's allowed_token_ids; copied); none: every token. */
    const int32_t *allowed_token_ids;
    int num_allowed_token_ids;
    /* Token sequences never completed (vLLM's bad_words; copied): the last token of each is
     * never sampled right after the rest of it has been generated. One after another in
     * bad_words, bad_word_lens[i] (at least 1) tokens each. */
    const int32_t *bad_words;
    const int32_t *bad_word_lens;
    int num_bad_words;
    SamplingParams sampling;
    GrCompiled *constraint;        /* structured output (grammar.h): every sample's text follows it,
                                    * ending with "stop" once complete; NULL = none. Borrowed: it
                                    * must stay valid until the request's last event. */
    const char *constraint_after;  /* with a constraint: it applies only after this text (the
                                    * end of a reasoning section, "</think>", as a token of that
                                    * text or in bytes); what comes before, and the text
                                    * itself, are free. NULL: from the first token. Copied. */
    const char *constraint_opener; /* with constraint_after: the section it ends is optional,
                                    * opened by the token of this text ("<think>") as the first
                                    * token (allowed there beside the constraint's); an output
                                    * starting otherwise is constrained from its first token.
                                    * NULL: the output starts inside the section. Read by
                                    * eng_add_request (a vocabulary without that token: the
                                    * output is constrained from its first token). */
} GenerateParams;

typedef struct {
    const int32_t *prompt; /* copied by eng_add_request */
    int num_prompt;
    GenerateParams params;
    void *user; /* returned in every event of this request */
} EngRequest;

/* Queue a request (thread-safe). Validates it first: empty prompt, ids outside the
 * vocabulary, a prompt too long for max-model-len or for the whole KV pool are
 * PL_ERR_INVALID with a message. *id identifies it for eng_abort and in events. */
Status eng_add_request(Engine *e, const EngRequest *r, uint64_t *id);

/* Abort a request (thread-safe): its sequences finish with FINISH_ABORT at the next step
 * and their blocks are freed. Unknown or finished ids are ignored. */
void eng_abort(Engine *e, uint64_t id);

/* Abort every queued and running request (thread-safe; for shutdown). */
void eng_abort_all(Engine *e);

/* One output event: a new token of one sample of a request, or its end. */
typedef struct {
    uint64_t request_id;
    void *user;
    int index;        /* which sample (0 .. n-1) */
    int32_t token;    /* the new token, -1 when the event only finishes */
    const char *text; /* new text of that sample, in context ("" while incomplete);
                       * NUL-terminated, and text_len long (NUL characters count) */
    size_t text_len;
    FinishReason finish; /* FINISH_NONE while the sample goes on */
    int num_prompt_tokens;
    int num_generated;    /* tokens generated by this sample so far */
    double queue_seconds; /* from eng_add_request to the first step that ran it; -1 if never */
    /* With params.logprobs, for token >= 0: log-softmax of the model's raw logits. */
    float logprob;
    const int32_t *top_ids;    /* [num_top] most likely tokens, best first */
    const float *top_logprobs; /* [num_top] */
    int num_top;
} EngEvent;

/* Run one step. *events (valid until the next eng_step) gets what happened; returns the
 * number of events. With nothing to do it returns 0 at once. */
int eng_step(Engine *e, const EngEvent **events);

/* 1 if requests are queued or running. */
int eng_has_work(Engine *e);

/* Block until there is work or timeout_ms passes (thread-safe; for an engine thread). */
void eng_wait_for_work(Engine *e, int timeout_ms);

typedef struct {
    SchedulerCounters sched; /* its num_running etc. count sequences */
    BlockStats blocks;
    int num_requests_running; /* requests with a sequence in the running queue */
    int num_requests_waiting; /* queued, or preempted for recompute, none running */
    int num_requests_swapped; /* swapped out, none running */
    int64_t generated_tokens; /* tokens sampled, over all requests */
    int64_t overlapped_steps; /* launched before the previous step's tokens were read */
    int num_gpu_blocks, num_cpu_blocks;
    int free_gpu_blocks, free_cpu_blocks;
    int64_t kv_slots_allocated; /* token slots in blocks held by running sequences */
    int64_t kv_slots_used;      /* tokens those sequences hold */
    /* where the time of pure-decode steps went, summed over them (host clock): scheduling;
     * packing the batch; uploading and running the forward pass (to the device's end);
     * sampling (on the device on CUDA: its kernels and the copy of the tokens back);
     * turning tokens into events (stop checks, detokenization). An overlapped step
     * (asynchronous scheduling) counts its launch and the wait for the previous step's tokens
     * (that step's forward pass and sampling) as forward, and no sampling time. */
    int64_t decode_steps;
    double decode_seconds_schedule, decode_seconds_prepare, decode_seconds_forward,
        decode_seconds_sample, decode_seconds_emit;
    int64_t decode_rows;               /* sequences, summed over the pure-decode steps */
    int64_t other_steps, other_tokens; /* steps with prompt tokens in them, and their tokens */
} EngineStats;

/* A swap round trip for benchmarks: `blocks` KV blocks copied to the swap pool and back
 * (the same blocks, so their contents are unchanged). Call on the engine thread between
 * steps. Seconds of each direction, measured to completion; then, with decode graphs and one
 * rank, the swap-in again while decode graphs run: seconds of that compute alone and of the
 * compute and the swap-in together (0 without graphs). */
typedef struct {
    int blocks;
    double bytes; /* one direction */
    double seconds_out, seconds_in;
    double seconds_compute, seconds_both;
} EngSwapTiming;
Status eng_measure_swap(Engine *e, int blocks, EngSwapTiming *t);

/* Counters and gauges (engine thread only: it reads the scheduler's state). */
EngineStats eng_stats(Engine *e);

typedef struct {
    FinishReason finish_reason;
    int num_prompt_tokens;
    int num_generated_tokens;
    double prefill_seconds; /* time to the first token */
    double decode_seconds;  /* time for the remaining tokens */
} GenerateResult;

/* Called for each generated token with its text in context (may be "" while a UTF-8
 * character is incomplete; len bytes, NUL characters included); token -1 carries held-back
 * text at the end. Return non-zero to stop (finish reason abort). */
typedef int (*EngTokenFn)(void *ctx, int32_t token, const char *text, size_t len);

/* Run one request (n = 1) alone to completion. Must not be mixed with eng_step calls from
 * another thread. */
Status eng_generate(Engine *e, const int32_t *prompt, int n, const GenerateParams *p,
                    EngTokenFn on_token, void *ctx, GenerateResult *res);

/* Logits of every position of `ids` (a verification aid): logits[n, vocab]. Uses KV blocks
 * of its own; do not call while requests run. */
Status eng_prompt_logits(Engine *e, const int32_t *ids, int n, float *logits);

#endif
