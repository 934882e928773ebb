/* engine_internal.h - (internal to engine/) the engine's parts and their state. Calls go one
 * way, top to bottom, never back up (tools/check_layers.py checks the order of configure.py's
 * ENGINE_PARTS):
 *
 *   generate.c            conveniences over the public API
 *   engine.c              creation, the thread-safe inbox, statistics
 *   step.c                the step loop: inbox, schedule, batch, launch, sample, fork, retire
 *   overlap.c             asynchronous scheduling: the pending step
 *   output.c              accepted tokens to events (stop checks, text), finishes, aborts
 *   sampler.c             sampled rows to tokens and logprobs, on the backend or the host
 *   logit_edits.c         logit_bias and min_tokens as edits of the logits
 *   request.c             a request's samples: start, stop tokens, free
 *   runner.c              the model runner: ranks, their jobs, start-up warm-up and capture
 *   runner_forward.c      one rank's batch upload, forward, graphs, prompt logits */
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
    int32_t *scatter;      /* [max_num_batched_tokens, 2]: (token index, previous step's row) */
} BatchBuffers;

/* The BatchBuffers fields, for the loops that allocate, upload and free them. */
#define BATCH_FIELDS 8

/* SeqData.after_matched of a sample whose first token may open the section that
 * constraint_after ends (Request.opener_token). */
#define AFTER_UNOPENED (-2)

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
    int pending_row;    /* its row in the pending step (asynchronous scheduling), -1 if none */
    GrMatcher *matcher; /* structured output: where its text is in the constraint, or NULL */
    int after_matched;  /* constraint_after: its bytes matched at the end of the text so far;
                         * -1 once it has appeared (or without one): the matcher follows;
                         * AFTER_UNOPENED before the first token of a constraint_opener */
} SeqData;

struct Request {
    uint64_t id;
    void *user;
    GenerateParams params;
    int32_t *prompt;
    int num_prompt;
    int32_t *stop_ids;      /* copy of params.stop_token_ids */
    LogitBias *bias;        /* copy of params.logit_bias */
    uint32_t *allowed_mask; /* params.allowed_token_ids as a mask over the vocabulary, or NULL */
    int32_t *bad_words, *bad_word_lens; /* copies of params.bad_words, .bad_word_lens */
    char *constraint_after;             /* copy of params.constraint_after */
    int32_t after_token;  /* the token that is constraint_after's whole text, -1 if none */
    int32_t opener_token; /* the token of params.constraint_opener, -1 if none */
    int n;                /* samples wanted */
    int num_started;      /* sequences created so far (1 until the prompt's first sample) */
    int num_finished;
    int aborted;
    int sync_sampling;  /* penalties, logprobs, logit edits: its steps are not overlapped */
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

/* Asynchronous scheduling (overlap.c): one sampled row of the step launched last, whose
 * tokens the host reads only after launching the next step. */
typedef struct {
    Sequence *seq;   /* NULL: the token is dropped (the sequence finished meanwhile) */
    int placeholder; /* seq->tokens ends with a -1 standing in for this row's token */
} PendingRow;

typedef struct {
    int active;
    int num_rows;
    PendingRow *rows; /* [max_num_seqs], in sampling order */
    int parity;       /* Engine.step_tokens / step_event holding its tokens */
    int64_t id;       /* its step number (the block stamps) */
} PendingStep;

/* The swaps of a step in issue order: swap-outs and swap-ins that may overlap the pending
 * step, then those that touch its blocks and so wait for it. */
enum { SWAP_OUT_NOW, SWAP_IN_NOW, SWAP_OUT_AFTER, SWAP_IN_AFTER, SWAP_KINDS };
typedef struct {
    BlockCopy *pairs[SWAP_KINDS];
    int n[SWAP_KINDS];
    int cap;
} SwapPlan;

/* ---- sampler.c: sampling on the backend ---- */

/* Device buffers for sampling on the backend (all NULL when it has no sample_rows op). */
typedef struct {
    SampleRow *h_rows, *d_rows;     /* [max_num_seqs] */
    int32_t *h_history, *d_history; /* [history_cap] */
    size_t history_cap;
    int32_t *d_tokens;                      /* [max_num_seqs] */
    float *d_token_logits, *h_token_logits; /* [max_num_seqs] */
    float *d_lse, *h_lse;                   /* [max_num_seqs] */
    int32_t *d_top_ids, *h_top_ids;         /* [max_num_seqs, max_top_logprobs] */
    float *d_top_vals, *h_top_vals;
    LogitEdit *d_edits;   /* [DEVICE_EDITS_CAP] */
    uint32_t *d_masks;    /* [max_num_seqs, mask words]: structured output's allowed tokens */
    int32_t *d_mask_rows; /* [max_num_seqs] */
    uint32_t *h_masks;    /* pinned: their host side, built while the forward runs and
                           * copied without waiting for it (rewritten only once the tokens
                           * sampled after that copy are read) */
    int32_t *h_mask_rows;
    void *workspace;
    size_t workspace_bytes;
} DeviceSampler;

/* One tensor-parallel rank (runner.c): its model shard, its KV pools (its KV heads; every rank
 * has the same blocks, so one block table serves all), its device step buffers and decode
 * graphs. Rank i drives device i; rank 0 runs on the engine's thread, the others on worker
 * threads executing the same jobs at the same time. */
typedef struct Rank {
    struct Engine *engine;
    int index;
    const KernelOps *ops; /* its backend (ModelRunner.backends[index]) */
    Model *model;
    void *kv_gpu;              /* the device pool (host memory on the CPU backend) */
    void *kv_cpu;              /* the swap pool */
    BatchBuffers d;            /* the step buffers in backend memory (= the host ones on the CPU) */
    int32_t *d_pending_tokens; /* rank > 0, asynchronous scheduling: the pending step's
                                * sampled tokens, copied from rank 0 [max_num_seqs] */
    void **graphs;             /* [Engine.num_graphs] */
    Status status;             /* of its last job, with its message (errors are per thread) */
    char error[1024];
    pthread_t thread;
} Rank;

/* What every rank does at once (eng_ranks_run). */
typedef enum {
    JOB_LOAD,       /* load this rank's model shard */
    JOB_BUFFERS,    /* device step buffers */
    JOB_WARM_BLOCK, /* a one-block KV pool for the warm-up */
    JOB_WARM_UP,    /* a forward of the host batch over that pool (eng_warm_up) */
    JOB_POOLS,      /* the KV pools, num_gpu_blocks and num_cpu_blocks (the block freed) */
    JOB_CAPTURE,    /* capture decode graph `graph` of the padded host batch */
    JOB_STEP,       /* one step: block copies, batch upload, forward */
    JOB_LOGITS,     /* eng_prompt_logits: every position's logits of ids[num_tokens] */
    JOB_EXIT,       /* free the rank's resources; workers end */
} JobKind;

typedef struct {
    JobKind kind;
    const SchedulerOutput *o;                  /* JOB_STEP: its block copies */
    int num_tokens, num_seqs, num_rows, graph; /* JOB_STEP: the batch (graph -1: eager) */
    int num_decode;                            /* JOB_STEP: leading single-token seqs */
    int table_width;                           /* STEP, WARM_UP: block-table entries a row reads */
    const SwapPlan *swaps;                     /* JOB_STEP: the swaps (NULL: none) */
    int num_scatter;                           /* JOB_STEP: ids from the pending step */
    const int32_t *scatter_src;                /* JOB_STEP: its sampled tokens (backend) */
    const int32_t *ids;                        /* JOB_LOGITS: the prompt (num_tokens) */
    float *logits_out;                         /* JOB_LOGITS: host [num_tokens, vocab] */
} RankJob;

/* The model runner (runner.c, runner_forward.c): the tensor-parallel ranks, the jobs they
 * run together, the step batch they upload and the decode graphs they replay. */
typedef struct {
    int tp;               /* tensor-parallel ranks */
    int mpi;              /* the ranks are MPI processes: this one runs ranks[0] only (rank 0
                           * broadcasts every job, the others follow: eng_ranks_follow) */
    int local;            /* ranks of this process: tp, or 1 under MPI */
    int failed;           /* a job of some rank failed (MPI: followers exit 1) */
    KernelOps **backends; /* [tp] opened backends, rank r's drives device r (MPI: [0] only) */
    Rank *ranks;          /* [local] */
    char *wire;           /* MPI: a job's data as broadcast */
    size_t wire_cap;
    pthread_mutex_t job_mu;
    pthread_cond_t job_cv, job_done_cv;
    RankJob job; /* the current job, for the workers */
    uint64_t job_seq;
    int jobs_done;
    /* per-step batch, sized at creation: built in host memory (h), read by each rank's model
     * from its own copy (Rank.d) */
    int max_blocks_per_seq;
    BatchBuffers h;
    /* decode graphs: each rank's graphs[g] replays a decode step of graph_size[g] rows */
    int num_graphs;
    int *graph_size;      /* ascending */
    double graph_seconds; /* spent capturing them */
} ModelRunner;

/* The sampler (sampler.c, logit_edits.c): the step's sampled rows to tokens, with their
 * logprobs taken from the raw logits and their logit edits applied, on the backend or here. */
typedef struct {
    DeviceSampler dev;     /* sampling on the backend */
    const KernelOps *host; /* sampling on the host: the CPU backend (the engine's own when
                            * it computes on the CPU, else host_owned) */
    KernelOps *host_owned;
    float *fork_logits;   /* [vocab]: a row copied for each extra sample */
    int32_t *fork_tokens; /* [fork_cap]: the forked samples' first tokens, in row order */
    int num_fork_tokens, fork_cap;
    SampleRow *host_rows;  /* [max_num_seqs] */
    int32_t *host_history; /* [host_history_cap] packed history of rows with penalties */
    size_t host_history_cap;
    int32_t *sampled; /* [max_num_seqs] */
    int32_t *top_ids; /* [top_cap] the step's top logprobs (events point here) */
    float *top_vals;  /* [top_cap] */
    size_t top_len, top_cap;
    float *raw_rows; /* [raw_cap] raw logits of rows whose logprobs are wanted */
    size_t raw_cap;
    LogitEdit *edits; /* [edits_cap] the logit edits of the rows being sampled */
    size_t edits_cap;
    uint32_t *mask; /* [mask words] the allowed tokens of the row sampled on the host */
} Sampler;

/* The output (output.c): the events of the last step and the text they point into. */
typedef struct {
    EngEvent *events;
    int events_n, events_cap;
    char *text;
    size_t text_len, text_cap;
} Output;

/* The engine (engine.c, step.c, overlap.c): configuration, model and tokenizer, KV geometry,
 * block manager and scheduler, the inbox, the active requests and the step loop's state; it
 * owns the runner, the sampler and the output, and calls down into them. */
struct Engine {
    EngineConfig cfg;
    const KernelOps *ops; /* rank 0's backend */
    Model *model;         /* rank 0's (its config is the whole model's) */
    Tokenizer *tok;
    int max_model_len;
    KvLayout kv_layout; /* one rank's */
    size_t block_bytes;
    int num_gpu_blocks, num_cpu_blocks;
    BlockManager *bm;
    Scheduler *sched;
    int64_t next_seq_id;
    GrVocab *gr_vocab; /* structured output's view of the vocabulary, made on first use */
    pthread_mutex_t gr_mu;
    ModelRunner run;
    Sampler smp;
    Output out;

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

    /* asynchronous scheduling (overlap.c): step N + 1 is scheduled and launched before the
     * tokens of step N are read */
    int overlap;              /* cfg.async_scheduling, one rank, a backend that can */
    int num_sync_requests;    /* active requests whose steps cannot overlap */
    PendingStep pending;      /* the step launched last, tokens unread */
    int32_t *step_tokens[2];  /* [max_num_seqs] sampled tokens (pinned host), by parity */
    void *step_event[2];      /* recorded after their copy (NULL: synchronous backend) */
    void *tokens_copied;      /* tensor parallelism: recorded on rank 0 after the sampled
                               * tokens were copied to the other ranks */
    int64_t step_id;          /* steps launched */
    int64_t overlapped_steps; /* EngineStats */
    int64_t *block_read_step; /* [num_gpu_blocks] last step reading / writing each block */
    int64_t *block_written_step;
    SwapPlan swap_plan;

    /* time of pure-decode steps by phase (EngineStats) */
    int64_t decode_steps;
    double decode_seconds[5];          /* schedule, prepare, forward, sample, emit */
    int64_t decode_rows;               /* sequences over the pure-decode steps */
    int64_t other_steps, other_tokens; /* steps with prompt tokens, and their tokens */
};

/* ---- request.c: a request's samples ---- */

/* Start sample `index` of r on `seq` (its sequence data, detokenizer, owner link). */
void eng_start_sequence(Engine *e, Request *r, int index, Sequence *seq);

/* The i-th token that ends a sample of r (its stop_token_ids, then unless ignore_eos the
 * model's EOS ids and the tokenizer's), -1 past the last. */
int32_t eng_stop_token(const Engine *e, const Request *r, int i);

/* Free a finished request and its sequences (engine thread). */
void eng_request_free(Engine *e, Request *r);

/* ---- output.c: tokens to events ---- */

/* Record a sampled token on its sequence (replacing its placeholder when `placeholder`):
 * stop on EOS or a stop token, check lengths, emit. */
void eng_accept_token(Engine *e, Sequence *seq, int32_t token, const RowLogprobs *lp,
                      int placeholder);

/* Finish every unfinished sample of r with "abort" (once). */
void eng_abort_request(Engine *e, Request *r);

/* A step's events: begin empties them; end turns their arena offsets into pointers (text
 * here, top logprobs in the sampler's top_ids / top_vals). */
void eng_output_begin_step(Engine *e);
void eng_output_end_step(Engine *e, const int32_t *top_ids, const float *top_vals);

/* ---- sampler.c ---- */

/* Allocate the device sampler's buffers when the backend samples (no-op otherwise). */
Status eng_device_sampler_init(Engine *e);
void eng_device_sampler_free(Engine *e);

/* 1 when this step's sampling can run on the backend: it has the ops, no request forks its
 * samples now and none wants more top logprobs than the backend returns. */
int eng_device_sample_ok(const Engine *e, const SchedulerOutput *o);

/* Sample the step's rows on the backend: tokens[k] and lps[k] for the k-th sampled sequence
 * (lps' top arrays in the step's arena). */
void eng_device_sample(Engine *e, const SchedulerOutput *o, int32_t *tokens, RowLogprobs *lps);

/* The same without waiting (no logprobs): the tokens are copied to pinned `tokens` after the
 * sampling; the caller records an event to know when they are there. Returns the rows. */
int eng_device_sample_async(Engine *e, const SchedulerOutput *o, int32_t *tokens);

/* 1 when sampling with these parameters reads the sequence's tokens (penalties). */
int eng_has_penalty(const SamplingParams *p);

/* Room for k more top logprobs in the step's arrays; returns the offset of the first. */
size_t eng_top_reserve(Engine *e, size_t k);

/* ---- constraint.c: structured output ---- */

/* Make e->gr_vocab (and the host mask buffers) once; any thread. Fails without a tokenizer. */
Status eng_constraint_vocab(Engine *e);

/* A new sample's matcher (NULL without a constraint). */
void eng_constraint_start(Engine *e, SeqData *d);

/* 32-bit words of a mask over the model's vocabulary. */
size_t eng_mask_words(const Engine *e);

/* The allowed-token masks of the masked rows among rows[n] (logits row i is rows[i]'s: a
 * constraint's and the request's allowed_token_ids, both when both) into masks (one row of
 * eng_mask_words each), their row numbers into mask_rows; returns how many. Finished samples
 * (the overlapped step's dropped rows) get none. */
int eng_constraint_masks(Engine *e, const SeqData *const *rows, int n, uint32_t *masks,
                         int32_t *mask_rows);

/* Advance d's matcher on the token drawn: 0, 1 when the text is now complete (nothing but
 * EOS may follow), -1 when the token is not allowed (the constraint failed). Before the
 * request's constraint_after has appeared the token only advances the search for it. */
int eng_constraint_accept(Engine *e, SeqData *d, int32_t token);

/* ---- logit_edits.c: logit_bias and min_tokens ---- */

/* Logit edits of the next token of each sample rows[i] (logits row i): how many, and the
 * same written to e->edits (grown as needed). */
int eng_count_edits(const Engine *e, const SeqData *const *rows, int n);
int eng_collect_edits(Engine *e, const SeqData *const *rows, int n);

/* Sample the step's rows with the CPU sampler into tokens (logprobs), and the first tokens of
 * the samples that forking rows start (Sampler.fork_tokens). */
void eng_sample_on_host(Engine *e, const SchedulerOutput *o, int32_t *tokens, RowLogprobs *lps);

/* ---- overlap.c: asynchronous scheduling ---- */

/* Its buffers when the configuration and backend allow it (Engine.overlap), and their end. */
Status eng_overlap_start(Engine *e);
void eng_overlap_stop(Engine *e);

/* Record which blocks step `id` reads and writes. */
void eng_stamp_blocks(Engine *e, const SchedulerOutput *o, int64_t id);

/* The step's swaps in issue order, those that may overlap the pending step first; NULL when
 * it has none. */
const SwapPlan *eng_plan_swaps(Engine *e, const SchedulerOutput *o);

/* Launch the sampling of an overlapped step into step_tokens[parity] (and, with several
 * ranks, to the other ranks' devices). */
void eng_sample_async(Engine *e, const SchedulerOutput *o, int parity);

/* The launched step becomes the pending one (placeholders for sequences that go on). */
void eng_make_pending(Engine *e, const SchedulerOutput *o, int parity);

/* Wait for the pending step's tokens and accept them; no-op when none is pending. */
void eng_finish_pending(Engine *e);

/* Drop the pending step's rows of finished sequences (before their requests are freed). */
void eng_forget_finished_rows(Engine *e);

/* ---- runner.c: the model runner ---- */

/* Start the ranks (workers for ranks 1..tp-1); eng_ranks_stop frees every rank's resources. */
Status eng_ranks_start(Engine *e);
void eng_ranks_stop(Engine *e);

/* Every rank does `job` at once (rank 0 on the calling thread); the first error of a rank is
 * returned (and set as this thread's error). Under MPI rank 0 broadcasts the job and the data
 * it reads (the host batch, block copies, swaps, prompt ids) and gathers every rank's result;
 * "rank r: <message>" for a failure of rank r > 0. */
Status eng_ranks_run(Engine *e, const RankJob *job);

/* ---- runner_mpi.c: ranks as MPI processes ---- */

/* MPI rank 0's eng_ranks_run: broadcast the job and its data, run it, gather the results. */
Status eng_mpi_run(Engine *e, const RankJob *job);

/* MPI rank > 0: run the jobs rank 0 broadcasts until JOB_EXIT; returns the exit code. With
 * setup != PL_OK (this rank could not open its backend; the message is this thread's error)
 * the ranks were not started and every job answers that error. */
int eng_ranks_follow(Engine *e, Status setup);

/* Rank 0: whether the followers were sent their JOB_EXIT already (one engine per process). */
int eng_mpi_exit_sent(void);

/* ---- rank_jobs.c: one rank's part of each job ---- */

/* Rank r does job j (its status and error message in r->status, r->error). */
void eng_rank_do(Engine *e, Rank *r, const RankJob *j);

/* A rank's part of eng_prompt_logits (runner_forward.c): a private KV pool, the whole prompt as
 * one chunk, rank 0's logits of every position to the host. */
Status eng_rank_prompt_logits(Engine *e, Rank *r, const int32_t *ids, int n, float *logits);

/* The sizes of the step buffers (BatchBuffers fields in order). */
void eng_batch_sizes(const Engine *e, size_t sizes[BATCH_FIELDS]);
void eng_batch_fields(BatchBuffers *b, void **f[BATCH_FIELDS]);

/* ---- runner_forward.c: one rank's work ---- */

/* Copy the first rows of the host step buffers to the rank's (no-op on host memory); of the
 * block tables only each row's first table_width entries (the rest are never read). */
void eng_upload_batch(Engine *e, Rank *r, int num_tokens, int num_seqs, int num_rows,
                      int table_width);

/* The rank's forward over its uploaded batch: graph `graph` (>= 0) or eagerly; logits (rank
 * 0 only) for num_rows rows. */
void eng_rank_forward(Engine *e, Rank *r, int num_tokens, int num_seqs, int num_rows,
                      int num_decode, int graph);

/* Rows [from, to) of the host step buffers become padding decode rows (token 0 at position
 * 0 through block 0, no cache write, own logits row); query_start[to] closes the batch. */
void eng_pad_decode_rows(Engine *e, int from, int to);

/* Index of the smallest graph of at least num_seqs rows, -1 when none. */
int eng_graph_for(const Engine *e, int num_seqs);

/* Run the largest decode batch and prompt chunk once on every rank over its one-block KV
 * pool, so lazily sized backend state reaches its working size (engine thread; the ranks
 * do eng_rank_warm_up). */
Status eng_warm_up(Engine *e);
void eng_rank_warm_up(Engine *e, Rank *r, const RankJob *j);

/* Choose the captured batch sizes (ModelRunner.graph_size) and have every rank capture its decode
 * graphs over its KV pool (nothing when the backend has no graphs or enforce-eager is set). */
Status eng_capture_graphs(Engine *e);
void eng_rank_capture(Engine *e, Rank *r, int g);
void eng_destroy_graphs(Engine *e, Rank *r);

#endif
