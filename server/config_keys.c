/* config_keys.c - the table of config keys (vLLM's flag names), the defaults, and lookups
 * over the table: by name, closest name for "did you mean", and a key's value as text.
 *
 * Adding a key: a field in Config (include/config.h), a row here, a default in cfg_init if
 * it is not engine's, and a commented line in configs/example.yaml (a test checks that). */
#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "config.h"

/* Enum fields are written through an int pointer. */
_Static_assert(sizeof(PreemptionMode) == sizeof(int), "PreemptionMode must be int-sized");

#define OFF(field) offsetof(Config, field)
#define NO_MAX     ((double)INT_MAX)

static const int block_sizes[] = {8, 16, 32, 64, 128, 0};

static const CfgEnumValue devices[] = {{"auto", 0}, {"cpu", 0}, {"cuda", 0}, {NULL, 0}};
static const CfgEnumValue dtypes[] = {
    {"auto", 0}, {"float32", 0}, {"float16", 0}, {"bfloat16", 0}, {NULL, 0}};
/* auto and safetensors both read the checkpoint (safetensors is the only format). */
static const CfgEnumValue load_formats[] = {
    {"auto", 0}, {"safetensors", 0}, {"dummy", 1}, {NULL, 0}};
/* quantization: like vLLM's flag; a checkpoint's own quantization_config needs no key */
static const CfgEnumValue quantizations[] = {{"fp8", 0}, {NULL, 0}};
/* vLLM's kv-cache-dtype values that pagellm has: fp8 is e4m3 (fp8_e5m2 is not built). */
static const CfgEnumValue kv_cache_dtypes[] = {{"auto", 0}, {"fp8", 1}, {"fp8_e4m3", 1}, {NULL, 0}};
static const CfgEnumValue preemption_modes[] = {
    {"swap", PREEMPT_SWAP}, {"recompute", PREEMPT_RECOMPUTE}, {NULL, 0}};
/* vLLM's names of its tool-call and reasoning parsers (server/tool_parser.c, reasoning.c). */
static const CfgEnumValue tool_call_parsers[] = {
    {"hermes", 0}, {"llama3_json", 0}, {"mistral", 0}, {NULL, 0}};
static const CfgEnumValue reasoning_parsers[] = {{"deepseek_r1", 0}, {"qwen3", 0}, {NULL, 0}};
static const CfgEnumValue log_levels[] = {
    {"debug", 0}, {"info", 0}, {"warning", 0}, {"error", 0}, {NULL, 0}};

/* Row helpers: name, field, range / values, metavar, help, text shown when unset. */
#define KEY_INT(n, f, lo, hi, mv, h, u)                                                            \
    {                                                                                              \
        .name = n, .type = CFG_INT, .offset = OFF(f), .min = lo, .max = hi, .metavar = mv,         \
        .help = h, .unset = u                                                                      \
    }
#define KEY_DOUBLE(n, f, lo, open, hi, mv, h)                                                      \
    {                                                                                              \
        .name = n, .type = CFG_DOUBLE, .offset = OFF(f), .min = lo, .min_open = open, .max = hi,   \
        .metavar = mv, .help = h                                                                   \
    }
#define KEY_BOOL(n, f, h)                                                                          \
    { .name = n, .type = CFG_BOOL, .offset = OFF(f), .metavar = "BOOL", .help = h }
#define KEY_STRING(n, f, mv, h, u)                                                                 \
    { .name = n, .type = CFG_STRING, .offset = OFF(f), .metavar = mv, .help = h, .unset = u }
#define KEY_LIST(n, f, h, u)                                                                       \
    { .name = n, .type = CFG_LIST, .offset = OFF(f), .metavar = "LIST", .help = h, .unset = u }
#define KEY_ENUM(n, f, vals, as_str, mv, h, u)                                                     \
    {                                                                                              \
        .name = n, .type = CFG_ENUM, .offset = OFF(f), .values = vals, .enum_as_string = as_str,   \
        .metavar = mv, .help = h, .unset = u                                                       \
    }

static const CfgKey keys[] = {
    /* what to serve, and where */
    KEY_STRING("model", model, "DIR", "Hugging Face model folder", "the bundled model"),
    KEY_STRING("served-model-name", served_model_name, "NAME",
               "model name in requests and /v1/models", "the model folder"),
    KEY_STRING("host", host, "HOST", "address to listen on", NULL),
    KEY_INT("port", port, 1, 65535, "PORT", "port to listen on", NULL),
    KEY_STRING("api-key", api_key, "KEY", "require 'Authorization: Bearer KEY'", "none"),
    /* model loading */
    KEY_ENUM("device", engine.device, devices, 1, "DEVICE", "auto (cuda when present), cpu or cuda",
             NULL),
    KEY_ENUM("dtype", engine.dtype, dtypes, 1, "DTYPE",
             "auto (the checkpoint's 16-bit dtype on cuda), float32, bfloat16 or float16", NULL),
    KEY_ENUM("load-format", engine.load_dummy, load_formats, 0, "FORMAT",
             "auto, safetensors or dummy (random weights)", NULL),
    KEY_ENUM("quantization", engine.quantization, quantizations, 1, "METHOD",
             "fp8: linear layers quantized to fp8 e4m3 at load (fp8 checkpoints need none)",
             "none"),
    /* KV cache */
    {.name = "block-size",
     .type = CFG_INT,
     .offset = OFF(engine.block_size),
     .min = 8,
     .max = 128,
     .choices = block_sizes,
     .metavar = "N",
     .help = "tokens per KV-cache block: 8, 16, 32, 64 or 128"},
    KEY_ENUM("kv-cache-dtype", engine.kv_cache_fp8, kv_cache_dtypes, 0, "DTYPE",
             "auto (the activations' dtype) or fp8 / fp8_e4m3 (e4m3 with the checkpoint's "
             "per-layer k_scale / v_scale, else 1): half the bytes of a 16-bit cache",
             NULL),
    KEY_DOUBLE("swap-space", engine.swap_space_gib, 0, 0, HUGE_VAL, "GIB",
               "CPU memory for swapped-out KV blocks, GiB"),
    KEY_DOUBLE("gpu-memory-utilization", engine.gpu_memory_utilization, 0, 1, 1, "F",
               "fraction of GPU memory (RAM on cpu) to use, (0, 1]"),
    KEY_DOUBLE("kv-cache-memory", engine.kv_cache_memory_gib, 0, 0, HUGE_VAL, "GIB",
               "cpu backend: KV cache GiB; 0 = from utilization"),
    KEY_INT("num-gpu-blocks-override", engine.num_gpu_blocks_override, 0, NO_MAX, "N",
            "number of KV blocks; 0 = size from memory", NULL),
    /* scheduling */
    KEY_INT("max-num-seqs", engine.max_num_seqs, 1, NO_MAX, "N", "sequences per step at most",
            "1024 on a GPU with 70 GiB free, else 256"),
    KEY_INT("max-num-batched-tokens", engine.max_num_batched_tokens, 1, NO_MAX, "N",
            "tokens per step at most (prefill chunk budget)",
            "8192 on a GPU with 70 GiB free, else 2048"),
    KEY_INT("max-model-len", engine.max_model_len, 1, NO_MAX, "N",
            "longest prompt + completion, tokens", "the model's maximum"),
    KEY_BOOL("enable-chunked-prefill", engine.enable_chunked_prefill,
             "split long prompts across steps"),
    KEY_BOOL("enable-prefix-caching", engine.enable_prefix_caching,
             "reuse KV blocks of identical prompt prefixes"),
    KEY_ENUM("preemption-mode", engine.preemption_mode, preemption_modes, 0, "MODE",
             "swap (else recompute) or recompute, when blocks run out", NULL),
    KEY_DOUBLE("schedule-conservativeness", engine.schedule_conservativeness, 0, 0, HUGE_VAL, "F",
               "admit a request only if free KV blocks cover what running ones are expected to "
               "still generate, times F; 0 = admit whenever its prompt fits"),
    /* execution */
    KEY_INT("tensor-parallel-size", engine.tensor_parallel_size, 1, NO_MAX, "N",
            "GPUs that split the model", NULL),
    KEY_BOOL("disable-custom-all-reduce", engine.disable_custom_all_reduce,
             "tensor parallelism: NCCL for every all-reduce, no one-shot NVLink all-reduce"),
    KEY_INT("cpu-threads", engine.cpu_threads, 0, NO_MAX, "N",
            "threads of the CPU backend (the caller included); 0 = every CPU it may use", NULL),
    KEY_BOOL("enforce-eager", engine.enforce_eager, "run decode without CUDA graphs"),
    KEY_BOOL("async-scheduling", engine.async_scheduling,
             "schedule the next step while the device runs this one"),
    {.name = "seed",
     .type = CFG_UINT64,
     .offset = OFF(engine.seed),
     .metavar = "N",
     .help = "random seed (dummy weights)"},
    /* HTTP server */
    KEY_INT("max-queue-len", max_queue_len, 1, NO_MAX, "N",
            "sequences (prompts x best_of of each request) in the engine at most; more get 503",
            NULL),
    KEY_INT("max-seqs-per-request", max_seqs_per_request, 1, NO_MAX, "N",
            "prompts x best_of of one request at most; more get 400", NULL),
    KEY_INT("max-connections-per-ip", max_connections_per_ip, 0, NO_MAX, "N",
            "open connections from one client address at most; 0 = no limit", NULL),
    KEY_INT("max-request-bytes", max_request_bytes, 1, NO_MAX, "N",
            "largest request body, bytes; larger get 413", NULL),
    KEY_DOUBLE(
        "request-timeout", request_timeout, 0, 0, HUGE_VAL, "SECONDS",
        "seconds a client has to send a whole request and a connection may stay idle, and the "
        "shutdown grace; 0 = none"),
    KEY_ENUM("log-level", log_level, log_levels, 1, "LEVEL", "debug, info, warning or error", NULL),
    KEY_STRING("chat-template", chat_template, "FILE|NAME",
               "chat template: a Jinja file, or chatml, llama3, llama2 or zephyr",
               "the model's chat_template.jinja or tokenizer_config.json"),
    KEY_ENUM("tool-call-parser", tool_call_parser, tool_call_parsers, 1, "NAME",
             "chat tool calls in the model's output: hermes, llama3_json or mistral",
             "none: tool_calls only for tool_choice required or a named function"),
    KEY_BOOL("enable-auto-tool-choice", enable_auto_tool_choice,
             "chat: accept tool_choice auto (needs tool-call-parser)"),
    KEY_ENUM("reasoning-parser", reasoning_parser, reasoning_parsers, 1, "NAME",
             "chat: split reasoning_content from content: deepseek_r1 or qwen3", "none"),
    KEY_LIST("allowed-origins", allowed_origins,
             "CORS: origins answered with Access-Control-Allow-Origin (\"*\" = any)", "none"),
    KEY_LIST("allowed-methods", allowed_methods, "CORS: methods a preflight may ask for", NULL),
    KEY_LIST("allowed-headers", allowed_headers, "CORS: headers a preflight may ask for", NULL),
    KEY_BOOL("allow-credentials", allow_credentials, "CORS: Access-Control-Allow-Credentials"),
};

#define NUM_KEYS ((int)(sizeof keys / sizeof keys[0]))

const CfgKey *cfg_keys(int *n) {
    *n = NUM_KEYS;
    return keys;
}

/* name with '_' read as '-' equals key? */
static int same_name(const char *name, const char *key) {
    for (; *name && *key; name++, key++)
        if ((*name == '_' ? '-' : *name) != *key)
            return 0;
    return *name == *key;
}

const CfgKey *cfg_find_key(const char *name) {
    for (int i = 0; i < NUM_KEYS; i++)
        if (same_name(name, keys[i].name))
            return &keys[i];
    return NULL;
}

/* Optimal-string-alignment distance (a swap of neighbours costs 1), on names read in lower
 * case with '_' as '-'; names longer than 63 characters are never close. */
static int distance(const char *a, const char *b) {
    enum { M = 64 };
    int la = (int)strlen(a), lb = (int)strlen(b);
    if (la >= M || lb >= M)
        return INT_MAX;
    char x[M], y[M];
    for (int i = 0; i < la; i++)
        x[i] = a[i] == '_' ? '-' : (char)tolower((unsigned char)a[i]);
    for (int j = 0; j < lb; j++)
        y[j] = b[j] == '_' ? '-' : (char)tolower((unsigned char)b[j]);
    int d[M][M];
    for (int i = 0; i <= la; i++)
        d[i][0] = i;
    for (int j = 0; j <= lb; j++)
        d[0][j] = j;
    for (int i = 1; i <= la; i++) {
        for (int j = 1; j <= lb; j++) {
            int best = d[i - 1][j - 1] + (x[i - 1] != y[j - 1]);
            if (d[i - 1][j] + 1 < best)
                best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best)
                best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && x[i - 1] == y[j - 2] && x[i - 2] == y[j - 1] &&
                d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    }
    return d[la][lb];
}

const char *cfg_suggest_key(const char *name) {
    const char *best = NULL;
    int best_d = 3; /* suggest within distance 2 */
    for (int i = 0; i < NUM_KEYS; i++) {
        int d = distance(name, keys[i].name);
        if (d < best_d) {
            best_d = d;
            best = keys[i].name;
        }
    }
    return best;
}

/* Shortest %g form that reads back as the same double (0.9, not 0.90000000000000002). */
static void format_double(double v, char *buf, size_t size) {
    for (int prec = 6; prec <= 17; prec++) { /* 6+: 60, not 6e+01 */
        snprintf(buf, size, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            return;
    }
}

const char *cfg_format_value(const Config *c, const CfgKey *k, char *buf, size_t size) {
    const char *field = (const char *)c + k->offset;
    const char *unset = k->unset ? k->unset : "";
    switch (k->type) {
        case CFG_INT: {
            int v = *(const int *)field;
            if (v == 0 && k->min > 0)
                return unset;
            snprintf(buf, size, "%d", v);
            break;
        }
        case CFG_UINT64:
            snprintf(buf, size, "%llu", (unsigned long long)*(const uint64_t *)field);
            break;
        case CFG_DOUBLE:
            format_double(*(const double *)field, buf, size);
            break;
        case CFG_BOOL:
            snprintf(buf, size, "%s", *(const int *)field ? "true" : "false");
            break;
        case CFG_LIST: {
            char *const *list = *(char *const *const *)field;
            if (!list)
                return unset;
            json_t *arr = json_array();
            for (; *list; list++)
                json_array_append_new(arr, json_string(*list));
            char *text = json_dumps(arr, JSON_COMPACT);
            json_decref(arr);
            snprintf(buf, size, "%s", text);
            free(text);
            break;
        }
        case CFG_STRING:
        case CFG_ENUM: {
            const char *s = NULL;
            if (k->type == CFG_STRING || k->enum_as_string) {
                s = *(const char *const *)field;
            } else {
                int code = *(const int *)field;
                for (const CfgEnumValue *v = k->values; v->name && !s; v++)
                    if (v->code == code)
                        s = v->name;
                if (!s) { /* not a valid code: show the number, for messages */
                    snprintf(buf, size, "%d", code);
                    return buf;
                }
            }
            if (!s)
                return unset;
            snprintf(buf, size, "%s", s);
            break;
        }
    }
    return buf;
}

void cfg_init(Config *c) {
    memset(c, 0, sizeof *c);
    c->engine = eng_config_default();
    c->engine.model_dir = NULL;
    if (!c->engine.device)
        c->engine.device = "auto";
    c->host = pl_xstrdup("127.0.0.1");
    c->port = 8000;
    c->max_queue_len = 1024;
    c->max_seqs_per_request = 256;
    c->max_connections_per_ip = 1024;
    c->max_request_bytes = 1 << 20;
    c->request_timeout = 60;
    c->log_level = "info";
    cfg_set(c, "allowed-methods", "*", NULL);
    cfg_set(c, "allowed-headers", "*", NULL);
}

void cfg_list_free(char ***list) {
    for (char **p = *list; p && *p; p++)
        free(*p);
    free(*list);
    *list = NULL;
}

void cfg_free(Config *c) {
    for (int i = 0; i < NUM_KEYS; i++) {
        if (keys[i].type == CFG_STRING) {
            char **p = (char **)((char *)c + keys[i].offset);
            free(*p);
            *p = NULL;
        } else if (keys[i].type == CFG_LIST) {
            cfg_list_free((char ***)((char *)c + keys[i].offset));
        }
    }
    memset(c, 0, sizeof *c);
}
