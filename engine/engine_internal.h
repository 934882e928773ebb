/* engine_internal.h - (internal to engine/) the Engine's state, shared by engine.c
 * (creation, sizing, the thread-safe inbox), step.c (the step loop) and generate.c. */
#ifndef PAGELLM_ENGINE_INTERNAL_H
#define PAGELLM_ENGINE_INTERNAL_H

#include <pthread.h>

#include "block_manager.h"
#include "engine.h"
#include "kernels.h"
#include "scheduler.h"

typedef struct Request Request;

/* The arrays of one step's batch (see AttnBatch). */
typedef struct {
    int32_t *tokens;       /* [max_num_batched_tokens] */
    int32_t *positions;    /* [max_num_batched_tokens] */
    int64_t *slots;        /* [max_num_batched_tokens] */
    int32_t *query_start;  /* [max_num_seqs + 1] */
    int32_t *block_tables; /* [max_num_seqs, max_blocks_per_seq] */
    int32_t *logit_rows;   /* [max_num_seqs] */
    float *logits;         /* [max_num_seqs, vocab] */
} BatchBuffers;

/* Abort id meaning "every request" (eng_abort_all). */
#define ENG_ABORT_ALL UINT64_MAX

/* Per-sequence engine data (Sequence.owner). */
typedef struct {
    Request *req;
    int index; /* sample number within the request */
    SamplingParams sampling;
    TokStream *stream; /* NULL without a tokenizer */
    int num_generated;
    FinishReason finish;
} SeqData;

struct Request {
    uint64_t id;
    void *user;
    GenerateParams params;
    int32_t *prompt;
    int num_prompt;
    int32_t *stop_ids; /* copy of params.stop_token_ids */
    int n;             /* samples wanted */
    int num_started;   /* sequences created so far (1 until the prompt's first sample) */
    int num_finished;
    int aborted;
    double t_added;     /* eng_add_request */
    double t_scheduled; /* first step that computed any of it (0 = not yet) */
    Sequence **seqs;    /* [n] */
    SeqData *data;      /* [n] */
};

/* Log-probabilities of one sampled row, computed from its raw logits before sampling. */
typedef struct {
    int wanted;        /* 0: no logprobs for this row */
    const float *raw;  /* host path: the row's raw logits (any token's logprob) */
    float token_logit; /* device path (raw NULL): the sampled token's raw logit */
    float lse;         /* log-sum-exp of the row */
    size_t top_at;     /* offset of its top-k in the step's top arrays */
    int num_top;
} RowLogprobs;

/* ---- sample_device.c: sampling on the backend ---- */

/* Device buffers for sampling on the backend (all NULL when it has no sample_rows op). */
typedef struct {
    DeviceSampleRow *h_rows, *d_rows; /* [max_num_seqs] */
    int32_t *h_history, *d_history;   /* [history_cap] */
    size_t history_cap;
    int32_t *d_tokens;                      /* [max_num_seqs] */
    float *d_token_logits, *h_token_logits; /* [max_num_seqs] */
    float *d_lse, *h_lse;                   /* [max_num_seqs] */
    int32_t *d_top_ids, *h_top_ids;         /* [max_num_seqs, DEVICE_MAX_TOP_LOGPROBS] */
    float *d_top_vals, *h_top_vals;
    void *workspace;
    size_t workspace_bytes;
} DeviceSampler;

struct Engine {
    EngineConfig cfg;
    const KernelOps *ops;
    Model *model;
    Tokenizer *tok;
    int max_model_len;
    KvLayout kv_layout;
    size_t block_bytes;
    int num_gpu_blocks, num_cpu_blocks;
    void *kv_gpu; /* the device pool (host memory on the CPU backend) */
    void *kv_cpu; /* the swap pool */
    BlockManager *bm;
    Scheduler *sched;
    int64_t next_seq_id;

    /* inbox: written by any thread under `mu` */
    pthread_mutex_t mu;
    pthread_cond_t work;
    Request **inbox;
    int inbox_n, inbox_cap;
    uint64_t *aborts;
    int aborts_n, aborts_cap;
    uint64_t next_request_id;
    int busy;                 /* requests active on the engine thread (read under mu) */
    int64_t generated_tokens; /* tokens sampled (engine thread) */

    /* engine-thread state */
    Request **active;
    int active_n, active_cap;

    /* per-step batch, sized at creation: built in host memory (h), read by the model from
     * backend memory (d; the same buffers when the backend computes in host memory) */
    int max_blocks_per_seq;
    BatchBuffers h, d;
    float *fork_logits;         /* [vocab]: a row copied for each extra sample */
    SampleRequest *sample_reqs; /* [max_num_seqs] */
    int32_t *sampled;           /* [max_num_seqs] */
    DeviceSampler ds;           /* sampling on the backend (sample_device.c) */

    /* events of the last step and the text and logprobs they point into */
    EngEvent *events;
    int events_n, events_cap;
    char *text;
    size_t text_len, text_cap;
    int32_t *top_ids; /* [top_cap] */
    float *top_vals;  /* [top_cap] */
    size_t top_len, top_cap;
    float *raw_rows; /* [raw_cap] raw logits of rows whose logprobs are wanted */
    size_t raw_cap;

    /* time of pure-decode steps by phase (EngineStats) */
    int64_t decode_steps;
    double decode_seconds[4]; /* schedule, prepare, forward, sample */

    /* decode graphs (graphs.c): graphs[g] replays a decode step of graph_size[g] rows */
    int num_graphs;
    int *graph_size; /* ascending */
    void **graphs;
    double graph_seconds; /* spent capturing them */
};

/* Free a finished request and its sequences (engine thread). */
void eng_request_free(Engine *e, Request *r);

/* ---- sample_device.c ---- */

/* Allocate the device sampler's buffers when the backend samples (no-op otherwise). */
Status eng_device_sampler_init(Engine *e);
void eng_device_sampler_free(Engine *e);

/* 1 when this step's sampling can run on the backend: it has the ops, no request forks its
 * samples now and none wants more than DEVICE_MAX_TOP_LOGPROBS top logprobs. */
int eng_device_sample_ok(const Engine *e, const SchedulerOutput *o);

/* Sample the step's rows on the backend: tokens[k] and lps[k] for the k-th sampled sequence
 * (lps' top arrays in the step's arena). */
void eng_device_sample(Engine *e, const SchedulerOutput *o, int32_t *tokens, RowLogprobs *lps);

/* Room for k more top logprobs in the step's arrays; returns the offset of the first. */
size_t eng_top_reserve(Engine *e, size_t k);

/* ---- graphs.c ---- */

/* Copy the first rows of the host step buffers to the backend's (no-op on host memory). */
void eng_upload_batch(Engine *e, int num_tokens, int num_seqs, int num_rows);

/* Rows [from, to) of the host step buffers become padding decode rows (token 0 at position
 * 0 through block 0, no cache write, own logits row); query_start[to] closes the batch. */
void eng_pad_decode_rows(Engine *e, int from, int to);

/* Index of the smallest graph of at least num_seqs rows, -1 when none. */
int eng_graph_for(const Engine *e, int num_seqs);

/* Run the largest decode batch and prompt chunk once over a one-block KV pool (`kv_block`),
 * so lazily sized backend state reaches its working size. Needs the step buffers. */
void eng_warm_up(Engine *e, void *kv_block);

/* Capture the decode graphs over the real KV pool (nothing when the backend has no graphs
 * or enforce-eager is set). */
void eng_capture_graphs(Engine *e);
void eng_destroy_graphs(Engine *e);

#endif
