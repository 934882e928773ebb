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

#define API_MAX_STOP      16
#define API_MAX_BAD_WORDS 1024

/* An error to send back: HTTP status and the fields of {"error": {...}}. */
typedef struct {
    int status; /* 400, 401, 404, 405, 413, 503 ... */
    char message[512];
    const char *type; /* "invalid_request_error", "authentication_error", "not_found_error",
                       * "server_error" ... (static) */
    char param[64];   /* offending field, "" when none (serialised as null) */
    const char *code; /* machine code or NULL (serialised as null) */
} ApiError;

/* Limits the server checks requests against (a field <= 0 is not checked), and its chat
 * settings (zeros: none). */
typedef struct {
    int max_model_len;            /* prompt + max_tokens must fit */
    int max_n;                    /* upper bound of n and best_of */
    int vocab_size;               /* token ids must be below */
    int max_logprobs;             /* upper bound of logprobs (top-k) */
    const char *tool_call_parser; /* the tool-call-parser key: hermes, llama3_json, mistral */
    int enable_auto_tool_choice;  /* tool_choice "auto" accepted */
    const char *reasoning_parser; /* the reasoning-parser key: deepseek_r1, qwen3 */
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
    int32_t *allowed_token_ids; /* owned: the only tokens sampled (vLLM); NULL: every token */
    int num_allowed_token_ids;
    char **bad_words; /* owned [num_bad_words], non-empty: texts never generated (vLLM) */
    int num_bad_words;
    int min_tokens;           /* default 0: stop tokens and EOS masked until this many */
    int32_t *logit_bias_ids;  /* owned [num_logit_bias]: logit_bias keys */
    float *logit_bias_values; /* owned [num_logit_bias]: in [-100, 100] */
    int num_logit_bias;
    int stream;
    int include_usage; /* stream_options.include_usage */
    int logprobs;      /* -1 = none; else top-k alternatives per token (0 = chosen only) */
    int echo;          /* completions: prepend the prompt to the text */
    int ignore_eos;
    int include_stop_str_in_output; /* vLLM's: the stop string matched stays in the text */
    int truncate_prompt_tokens;     /* vLLM's: keep the prompt's last N tokens (0: all; -1:
                                     * max-model-len) */
    int skip_special_tokens;        /* 1 (the default): special tokens add no text to the output */
    char *user;
    GrCompiled *constraint; /* owned: structured output (response_format, guided_*), or NULL */
    int is_chat;            /* parsed from /v1/chat/completions: prompts[0].text is the rendered
                             * template, which already holds any BOS text, so the server
                             * tokenizes it with add_special = 0 (as vLLM does for chat) */
    int tool_format;        /* chat: an ApiToolFormat: how tool calls are read from the output (0:
                             * not: no tools, or tool_choice none) */
    int reasoning;          /* chat: an ApiReasoning: the reasoning parser (0: none) */
    int in_reasoning;       /* chat: the output starts inside a think block: deepseek_r1, or the
                             * rendered prompt ends with an open <think>; never when the prompt
                             * closed its last think block (enable_thinking false) */
    const char *constraint_after;  /* chat with a reasoning parser and a constraint: "</think>"
                                    * (the constraint applies after the reasoning, as in vLLM)
                                    * unless the prompt closed its last think block; else NULL */
    const char *constraint_opener; /* with it, not in_reasoning (qwen3): "<think>", which the
                                    * output may open with (GenerateParams.constraint_opener) */
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
 * keys; an assistant's tool_calls[].function.arguments given as JSON text become objects, as
 * templates expect}], chat_template (the request's own Jinja template instead of t; a parse
 * error is a 400 naming its line; with it t may be NULL), add_generation_prompt (default
 * true), continue_final_message (default false; the text then ends after the final message's
 * content), chat_template_kwargs (merged into the context), documents, tools (the "tool_use"
 * template when the model has one). *text is malloc'd (NUL-terminated, *len bytes, which may
 * hold NUL characters). Failures are 400s with *err filled: bad fields, t NULL without a
 * chat_template ("the model has no chat template"), and render errors (param "messages"; a
 * template's raise_exception gives its message as is). */
Status api_chat_prompt(const ApiChatTemplate *t, struct json_t *body, char **text, size_t *len,
                       ApiError *err);

/* Parse a chat body: the prompt rendered by api_chat_prompt into prompts[0].text (the
 * template writes any BOS, so the server tokenizes it without special tokens). Sampling
 * fields as for completions (no best_of, echo); `max_tokens` or `max_completion_tokens` (the
 * latter wins; default -1: see api_check_length); `logprobs` is a bool with `top_logprobs`
 * (0-20); tools, tool_choice and parallel_tool_calls (api_parse_tools, with lim's
 * tool-call-parser and enable-auto-tool-choice); the reasoning parser from lim. The legacy
 * `functions` and `function_call` are refused. */
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

/* ---- tool calls and reasoning in a chat answer (tool_parser.c) ---------------------------
 *
 * The model's output text is split as vLLM's reasoning and tool parsers split it: the
 * reasoning (before </think>) first, then in the rest the tool calls of one format, and what
 * is left is the content. One parser serves both answers: fed the whole text at once for a
 * JSON body, or piece by piece as tokens arrive for SSE, where it holds back text that may be
 * the start of a marker until it is decided, and hands out deltas: reasoning text, content
 * text, the start of call k (id, name), a fragment of call k's arguments. A call's arguments
 * are the exact JSON text of its arguments value in the output, so the fragments concatenate
 * to what the whole-text parse gives. */

typedef enum {
    API_TOOLS_OFF = 0,     /* no tool-call parsing */
    API_TOOLS_HERMES,      /* <tool_call>{"name": .., "arguments": {..}}</tool_call>, several */
    API_TOOLS_LLAMA3_JSON, /* [<|python_tag|>]{"name": .., "parameters": {..}}; {..} */
    API_TOOLS_MISTRAL,     /* [TOOL_CALLS][{"name": .., "arguments": {..}}, ..] or
                            * [TOOL_CALLS]name[ARGS]{..} (repeated) */
    API_TOOLS_JSON_LIST,   /* [{"name": .., "parameters": {..}}, ..]: tool_choice required or
                            * named without a parser (vLLM's format for required) */
} ApiToolFormat;

typedef enum {
    API_REASONING_OFF = 0,
    API_REASONING_DEEPSEEK_R1, /* the output starts inside <think> (the template opens it) */
    API_REASONING_QWEN3,       /* reasoning when the output opens <think> (or the prompt does) */
    /* either way a leading <think> is stripped; without one and not in_reasoning, the output
     * is all content */
} ApiReasoning;

/* A parser name (the tool-call-parser / reasoning-parser keys; NULL = off) as the enum. */
ApiToolFormat api_tool_format(const char *name);
ApiReasoning api_reasoning_parser(const char *name);

typedef enum {
    API_DELTA_REASONING,
    API_DELTA_CONTENT,
    API_DELTA_CALL,
    API_DELTA_ARGS
} ApiDeltaKind;

typedef struct {
    ApiDeltaKind kind;
    int index;        /* CALL, ARGS: the call, from 0 */
    const char *id;   /* CALL: "call_" and 24 random characters (mistral: 9 characters) */
    const char *name; /* CALL: the function (NUL-terminated) */
    const char *text; /* REASONING, CONTENT, ARGS: len bytes, valid only during the callback */
    size_t len;
} ApiDelta;

typedef void (*ApiDeltaFn)(void *ctx, const ApiDelta *d);

typedef struct ApiOutputParser ApiOutputParser;

/* A parser for one answer. in_reasoning: the output starts inside a think block (deepseek_r1,
 * or the prompt ends with an open <think>; not when the prompt closed its last think block).
 * Free with api_output_parser_free. */
ApiOutputParser *api_output_parser_new(ApiToolFormat tools, ApiReasoning reasoning,
                                       int in_reasoning);
void api_output_parser_free(ApiOutputParser *p);

/* Feed the next len bytes of output (final: the output ends here, flush what is held); each
 * delta decided goes to emit(ctx, delta), in order. Output that breaks the format stops the
 * tool parsing: the text from there on is content. */
void api_output_parser_feed(ApiOutputParser *p, const char *text, size_t len, int final,
                            ApiDeltaFn emit, void *ctx);

/* Calls started so far (the answer's finish_reason is "tool_calls" when > 0). */
int api_output_parser_calls(const ApiOutputParser *p);

typedef struct {
    char id[32];
    char *name;      /* owned */
    char *arguments; /* owned JSON text */
} ApiToolCall;

typedef struct {
    char *reasoning; /* owned, NULL when none; reasoning_len bytes */
    size_t reasoning_len;
    char *content; /* owned, NULL when none (JSON null) */
    size_t content_len;
    ApiToolCall *calls; /* owned [num_calls] */
    int num_calls;
} ApiChatOutput;

/* The whole output at once. Malformed tool calls (a call that does not parse as JSON, a
 * name missing) leave no calls: the text after the reasoning is all content. */
void api_parse_chat_output(ApiToolFormat tools, ApiReasoning reasoning, int in_reasoning,
                           const char *text, size_t len, ApiChatOutput *out);
void api_chat_output_free(ApiChatOutput *o);

/* A chat body's tools, tool_choice and parallel_tool_calls (tools.c): each malformed field a
 * 400 naming it; sets r->tool_format, and for tool_choice "required" or a named function
 * r->constraint (a grammar of the calls, arguments following each function's parameters
 * schema: a 400 names an unsupported keyword; one with response_format already set is a 400).
 * "auto" (the default with tools) needs lim->enable_auto_tool_choice. Returns 0 or -1. */
int api_parse_tools(struct json_t *o, const ApiLimits *lim, ApiRequest *r, ApiError *err);

/* Fill an error (printf-style message, cut to fit at a UTF-8 boundary). type NULL picks one
 * from the status (400 invalid_request_error, 401 authentication_error, 404
 * not_found_error, 5xx server_error ...); param NULL or "" serialises as null. */
void api_error_set(ApiError *err, int status, const char *type, const char *param, const char *fmt,
                   ...) __attribute__((format(printf, 5, 6)));

/* A 400 invalid_request_error about `param` (printf-style message); returns -1, so that
 * parsers can `return api_refuse(...)`. */
int api_refuse(ApiError *err, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* {"error": {"message", "type", "param", "code"}} as a malloc'd string. */
char *api_error_json(const ApiError *err);

#endif
