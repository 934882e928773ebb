/* api.h - the OpenAI-compatible request layer: parse and validate the JSON bodies of
 * POST /v1/completions, /v1/chat/completions, /tokenize and /detokenize into plain structs,
 * render chat messages with the model's Jinja chat template, and write OpenAI-shaped error
 * objects.
 *
 * Functions over text (jansson inside; the chat template's files are read once, at start-up):
 * no sockets, no engine, so every rule is unit tested. Unknown fields are ignored, as OpenAI's
 * and vLLM's servers do. */
#ifndef PAGELLM_API_H
#define PAGELLM_API_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "grammar.h"
#include "sampling.h"

#define API_MAX_STOP 16

/* An error to send back: HTTP status and the fields of {"error": {...}}. */
typedef struct {
    int status; /* 400, 401, 404, 405, 413, 503 ... */
    char message[512];
    const char *type; /* "invalid_request_error", "authentication_error", "not_found_error",
                       * "server_error" ... (static) */
    char param[64];   /* offending field, "" when none (serialised as null) */
    const char *code; /* machine code or NULL (serialised as null) */
} ApiError;

/* Limits the server checks requests against; a field <= 0 is not checked. */
typedef struct {
    int max_model_len; /* prompt + max_tokens must fit */
    int max_n;         /* upper bound of n and best_of */
    int vocab_size;    /* token ids must be below */
    int max_logprobs;  /* upper bound of logprobs (top-k) */
} ApiLimits;

/* One prompt: text, or token ids (exactly one of the two set). */
typedef struct {
    char *text; /* owned, NUL-terminated; NULL for token ids. It may hold NUL
                 * characters itself (JSON's \u0000): text_len is its length */
    size_t text_len;
    int32_t *ids; /* owned; NULL for text */
    int num_ids;
} ApiPrompt;

typedef struct {
    char *model;        /* NULL when absent */
    ApiPrompt *prompts; /* [num_prompts] >= 1 */
    int num_prompts;
    int max_tokens;    /* default 16; chat: default = what is left of max-model-len (-1) */
    int n;             /* default 1 */
    int best_of;       /* default n; >= n */
    float temperature; /* default 1 */
    float top_p;       /* default 1 */
    int top_k;         /* default -1 (off) */
    float min_p;       /* default 0 */
    float presence_penalty, frequency_penalty; /* default 0, in [-2, 2] */
    float repetition_penalty;                  /* default 1, > 0 */
    int has_seed;
    uint64_t seed;
    char *stop[API_MAX_STOP]; /* owned; may hold NUL characters: */
    size_t stop_len[API_MAX_STOP];
    int num_stop;
    int32_t *stop_token_ids; /* owned */
    int num_stop_token_ids;
    int min_tokens;           /* default 0: stop tokens and EOS masked until this many */
    int32_t *logit_bias_ids;  /* owned [num_logit_bias]: logit_bias keys */
    float *logit_bias_values; /* owned [num_logit_bias]: in [-100, 100] */
    int num_logit_bias;
    int stream;
    int include_usage; /* stream_options.include_usage */
    int logprobs;      /* -1 = none; else top-k alternatives per token (0 = chosen only) */
    int echo;          /* completions: prepend the prompt to the text */
    int ignore_eos;
    char *user;
    GrCompiled *constraint; /* owned: structured output (response_format, guided_*), or NULL */
    int is_chat;            /* parsed from /v1/chat/completions: prompts[0].text is the rendered
                             * template, which already holds any BOS text, so the server
                             * tokenizes it with add_special = 0 (as vLLM does for chat) */
} ApiRequest;

/* Parse a completions body into *req (overwritten, not freed first). max_tokens alone must
 * be below max-model-len; the server checks it with the prompt (api_check_length) after
 * tokenizing. On failure returns PL_ERR_INVALID with *err filled (status 400, param naming
 * the field, message naming it too) and *req left zeroed. */
Status api_parse_completion(const char *body, size_t len, const ApiLimits *lim, ApiRequest *req,
                            ApiError *err);

/* Check one tokenized prompt of `req` against lim->max_model_len and resolve max_tokens:
 * returns req->max_tokens, or for -1 (chat default) what is left of max-model-len; on
 * failure returns -1 with *err filled (400; param "prompt" when the prompt alone leaves no
 * room, else "max_tokens" with code "context_length_exceeded"). max_model_len <= 0 means
 * unchecked (a -1 then gives 16). */
int api_check_length(const ApiLimits *lim, const ApiRequest *req, int prompt_tokens, ApiError *err);

/* A model's chat template, parsed once (jinja/) and immutable: any number of threads render
 * it at once. */
typedef struct ApiChatTemplate ApiChatTemplate;

/* Where a chat template comes from. */
typedef struct {
    const char *setting;   /* the chat-template key: a built-in name (chatml, llama3, llama2,
                            * zephyr) or a template file; NULL = the model's own */
    const char *model_dir; /* the model folder: chat_template.jinja, else tokenizer_config.json's
                            * chat_template; and its bos_token / eos_token. NULL = none */
    const char *bos_token; /* the tokenizer's BOS / EOS token texts, used where
                            * tokenizer_config.json names none; NULL = undefined */
    const char *eos_token;
    int64_t now; /* strftime_now's clock, seconds since the epoch (tests); 0 = the time now */
} ApiChatTemplateSpec;

/* Load and parse the template `spec` names into *out; *out = NULL (PL_OK) when there is none
 * (no key, and the model has no template). Errors name the file and line of a parse error
 * ("dir/chat_template.jinja: line 3 column 12: ..."), or the key and value of an unknown
 * name that is no readable file. Free with api_chat_template_free (NULL is fine). */
Status api_chat_template_load(const ApiChatTemplateSpec *spec, ApiChatTemplate **out);
void api_chat_template_free(ApiChatTemplate *t);

struct json_t;

/* Render the chat prompt of a request body (a JSON object): messages [{role, content: a
 * string or a list of {type: text, text} parts (joined with "\n", as vLLM does), any other
 * keys}], add_generation_prompt (default true), continue_final_message (default false; the
 * text then ends after the final message's content), chat_template_kwargs (merged into the
 * context), documents, tools (the "tool_use" template when the model has one). *text is
 * malloc'd (NUL-terminated, *len bytes, which may hold NUL characters). Failures are 400s
 * with *err filled: bad fields, t NULL ("the model has no chat template"), and render errors
 * (param "messages"; a template's raise_exception gives its message as is). */
Status api_chat_prompt(const ApiChatTemplate *t, struct json_t *body, char **text, size_t *len,
                       ApiError *err);

/* Parse a chat body: the prompt rendered by api_chat_prompt into prompts[0].text (the
 * template writes any BOS, so the server tokenizes it without special tokens). Sampling
 * fields as for completions (no best_of, echo); `max_tokens` or `max_completion_tokens` (the
 * latter wins; default -1: see api_check_length); `logprobs` is a bool with `top_logprobs`
 * (0-20). `tools` and the other fields of tool calling are refused. */
Status api_parse_chat(const char *body, size_t len, const ApiLimits *lim,
                      const ApiChatTemplate *tmpl, ApiRequest *req, ApiError *err);

/* POST /tokenize and /detokenize (vLLM's shapes). */
typedef struct {
    char *model; /* NULL when absent */
    char *text;  /* tokenize: the prompt, or the rendered messages; may hold NUL characters */
    size_t text_len;
    int add_special_tokens; /* default true for a prompt, false for messages */
    int return_token_strs;  /* add the tokens' vocabulary strings */
    int32_t *ids;           /* detokenize: the tokens, each below lim->vocab_size */
    int num_ids;
} ApiTokenizeRequest;

/* {model?, prompt, add_special_tokens?, return_token_strs?} or {model?, messages, ... the
 * fields of api_chat_prompt, add_special_tokens?, return_token_strs?}. */
Status api_parse_tokenize(const char *body, size_t len, const ApiChatTemplate *tmpl,
                          ApiTokenizeRequest *req, ApiError *err);

/* {model?, tokens: [ids]}. */
Status api_parse_detokenize(const char *body, size_t len, const ApiLimits *lim,
                            ApiTokenizeRequest *req, ApiError *err);

/* Free what `req` owns and zero it. */
void api_tokenize_free(ApiTokenizeRequest *req);

/* The sampling fields of `req` into *sp (temperature, top_p, top_k, min_p, the penalties, and
 * the seed when the request has one; sp->seed is left as it is otherwise). */
void api_sampling_params(const ApiRequest *req, SamplingParams *sp);

/* Free what `req` owns and zero it (safe to call twice). */
void api_request_free(ApiRequest *req);

/* The structured-output constraint of a request body (response_format, guided_json,
 * guided_regex, guided_choice, guided_grammar or structured_outputs; at most one) compiled into
 * *out (NULL: none). Returns 0, or -1 with a 400 naming the field in err. (structured.c) */
int api_parse_constraint(struct json_t *o, GrCompiled **out, ApiError *err);

/* Fill an error (printf-style message, cut to fit at a UTF-8 boundary). type NULL picks one
 * from the status (400 invalid_request_error, 401 authentication_error, 404
 * not_found_error, 5xx server_error ...); param NULL or "" serialises as null. */
void api_error_set(ApiError *err, int status, const char *type, const char *param, const char *fmt,
                   ...) __attribute__((format(printf, 5, 6)));

/* {"error": {"message", "type", "param", "code"}} as a malloc'd string. */
char *api_error_json(const ApiError *err);

#endif
