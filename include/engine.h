/* engine.h - the inference engine: a loaded model, its tokenizer, its KV cache and the loop
 * that turns a prompt into tokens.
 *
 * This is the foundation's engine: one request runs at a time, prefilled in chunks of
 * max_num_batched_tokens and decoded token by token over a paged KV cache. The
 * continuous-batching scheduler (many requests per step, swap, preemption) replaces the
 * inside of eng_generate without changing its contract. */
#ifndef PAGELLM_ENGINE_H
#define PAGELLM_ENGINE_H

#include <stdint.h>

#include "common.h"
#include "model.h"
#include "sampling.h"
#include "tokenizer.h"

typedef struct {
    const char *model_dir;      /* Hugging Face folder */
    const char *device;         /* "auto", "cpu" or "cuda" */
    int load_dummy;             /* load-format dummy */
    uint64_t seed;              /* dummy weights; default request seed */
    int block_size;             /* tokens per KV block: 8, 16, 32, 64, 128 */
    int max_model_len;          /* 0 = the model's max_position_embeddings */
    int max_num_batched_tokens; /* tokens per forward step (prefill chunk size) */
} EngineConfig;

/* Defaults: bundled model folder given by the caller, device auto, block 16, len 0, 2048. */
EngineConfig eng_config_default(void);

typedef struct Engine Engine;

/* Load model and tokenizer and size the KV cache. Errors name the file or key. */
Status eng_create(const EngineConfig *cfg, Engine **out);
void eng_destroy(Engine *e);

/* The model's tokenizer, or NULL when its folder has no tokenizer.json (then only token-id
 * interfaces such as eng_prompt_logits work). */
const Tokenizer *eng_tokenizer(const Engine *e);
const ModelConfig *eng_model_config(const Engine *e);
int eng_max_model_len(const Engine *e);
const char *eng_device_name(const Engine *e); /* backend actually used: "cpu", "cuda" */

typedef enum { FINISH_NONE = 0, FINISH_LENGTH, FINISH_STOP, FINISH_ABORT } FinishReason;
const char *eng_finish_reason_str(FinishReason r); /* "length", "stop", "abort" */

typedef struct {
    int max_tokens; /* new tokens to generate at most */
    int ignore_eos; /* keep going past end-of-sequence tokens */
    SamplingParams sampling;
} GenerateParams;

typedef struct {
    FinishReason finish_reason;
    int num_prompt_tokens;
    int num_generated_tokens;
    double prefill_seconds; /* time to the first token */
    double decode_seconds;  /* time for the remaining tokens */
} GenerateResult;

/* Called for each generated token with its text in context (may be "" while a UTF-8
 * character is incomplete). Return non-zero to stop (finish reason abort). */
typedef int (*EngTokenFn)(void *ctx, int32_t token, const char *text);

/* Generate from prompt token ids. The final held-back text (if any) is delivered through a
 * last on_token call with token -1. Errors: empty prompt, prompt longer than max_model_len. */
Status eng_generate(Engine *e, const int32_t *prompt, int n, const GenerateParams *p,
                    EngTokenFn on_token, void *ctx, GenerateResult *res);

/* Logits of every position of `ids` (a verification aid): logits[n, vocab]. */
Status eng_prompt_logits(Engine *e, const int32_t *ids, int n, float *logits);

#endif
