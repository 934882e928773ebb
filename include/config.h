/* config.h - pagellm's settings: a YAML file whose keys are vLLM's flag names, and the same
 * keys as command-line flags (`--block-size 32`, `--block-size=32`).
 *
 * One table (cfg_keys) describes every key: its name, type, the Config field it sets, its
 * range or allowed values and a line of help. File parsing, flag parsing, --help text and
 * the test that configs/example.yaml mentions every key are all driven by it. Underscore
 * spellings (block_size, --block_size) are aliases of the dash names.
 *
 * Typical use (pagellm serve / generate):
 *
 *     Config c;
 *     cfg_init(&c);
 *     const char *file = cfg_find_config_flag(argc, argv);
 *     if (file && cfg_load_file(&c, file) != PL_OK) { print pl_error(); fail; }
 *     for (int i = 1; i < argc; i++) {
 *         int r = cfg_parse_flag(&c, argc, argv, &i);   // flags override the file
 *         if (r < 0) fail;                              // message already on stderr
 *         if (r == 0) handle the command's own flags (argv[i]);
 *     }
 *     if (!c.model) cfg_set(&c, "model", default_dir, NULL);
 *     if (cfg_validate(&c) != PL_OK) { print pl_error(); fail; }
 *     ... eng_create(&c.engine, &engine) ...
 *     cfg_free(&c);
 *
 * Every failure is PL_ERR_INVALID (PL_ERR_IO for an unreadable file) with a message that
 * names the key, and for a file its path and line:
 *     config.yaml:3: unknown key 'blok-size' (did you mean 'block-size'?)
 *     config.yaml:5: key 'port' = 70000 is out of range [1, 65535]
 *     --block-size: 7 is not one of 8, 16, 32, 64, 128 */
#ifndef PAGELLM_CONFIG_H
#define PAGELLM_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common.h"
#include "engine.h"

/* Every setting of the server and the engine. Strings marked "owned" are heap copies freed
 * by cfg_free; "static" strings point at the key table's value names (never freed). A
 * Config must not be copied by value and then freed twice. */
typedef struct {
    /* Engine keys land here directly. engine.model_dir points at `model` (owned below);
     * engine.device is static ("auto", "cpu", "cuda"). */
    EngineConfig engine;

    char *model;                /* owned; the model folder; NULL = the caller's default */
    char *served_model_name;    /* owned; name in the API; NULL = the model folder */
    char *host;                 /* owned; listen address, default "127.0.0.1" */
    int port;                   /* listen port, default 8000 */
    char *api_key;              /* owned; NULL = no authentication */
    int max_queue_len;          /* sequences (prompts x best_of of each request) admitted and
                                 * not finished at most; more get 503; default 1024 */
    int max_seqs_per_request;   /* prompts x best_of of one request at most; more get 400; 256 */
    int max_connections_per_ip; /* open connections from one client address; 0 = no limit;
                                 * default 1024 */
    int max_request_bytes;      /* largest HTTP request body; default 1 MiB */
    double request_timeout;     /* seconds a request may take end to end; 0 = no limit; 60 */
    const char *log_level;      /* static; "debug", "info", "warning", "error"; default "info" */
    char *chat_template;        /* owned; a template file or a built-in name (chatml, llama3,
                                 * llama2, zephyr); NULL = the model's own */
    /* chat tool calls and reasoning (vLLM's flags and parser names) */
    const char *tool_call_parser; /* static; "hermes", "llama3_json", "mistral"; NULL = none */
    int enable_auto_tool_choice;  /* tool_choice "auto" accepted (needs tool_call_parser) */
    const char *reasoning_parser; /* static; "deepseek_r1", "qwen3"; NULL = none */
    /* CORS (as vLLM's, through Starlette's CORSMiddleware): lists are owned, NULL-terminated */
    char **allowed_origins; /* Origins answered with CORS headers ("*": any); NULL = no CORS */
    char **allowed_methods; /* methods a preflight may ask for ("*": any); default {"*"} */
    char **allowed_headers; /* headers a preflight may ask for ("*": any); default {"*"} */
    int allow_credentials;  /* Access-Control-Allow-Credentials: true; default false */
} Config;

/* ---- the key table -------------------------------------------------------------------- */

typedef enum {
    CFG_INT,    /* int field; min/max inclusive; optional `choices` (0-terminated list) */
    CFG_UINT64, /* uint64_t field; any value */
    CFG_DOUBLE, /* double field; min (exclusive when min_open) and max inclusive */
    CFG_BOOL,   /* int field, 0 or 1; true/false/yes/no/on/off/1/0 */
    CFG_STRING, /* owned char * field; never empty */
    CFG_LIST,   /* owned NULL-terminated char ** field of non-empty strings: a JSON list
                 * ('["a", "b"]'), a comma-separated text ("a,b"), or in a file a YAML list */
    CFG_ENUM,   /* one of `values`: an int field set to the value's code, or when
                 * enum_as_string a const char * field set to the (static) value name */
} CfgType;

typedef struct {
    const char *name;
    int code; /* stored for int enums */
} CfgEnumValue;

typedef struct {
    const char *name; /* dash spelling, as vLLM's flag without "--" */
    CfgType type;
    size_t offset;              /* offsetof(Config, field) */
    double min, max;            /* CFG_INT, CFG_DOUBLE: the allowed range */
    int min_open;               /* CFG_DOUBLE: min itself is excluded, as in (0, 1] */
    const int *choices;         /* CFG_INT: allowed values, 0-terminated; NULL = any in range */
    const CfgEnumValue *values; /* CFG_ENUM: allowed values, {NULL} terminated */
    int enum_as_string;         /* CFG_ENUM: the field is a const char * */
    const char *metavar;        /* what follows the flag in --help: "N", "GIB", "DIR" */
    const char *help;           /* one line */
    const char *unset;          /* default shown when the field holds no value (NULL string,
                                 * or 0 for an int whose range starts above 0) */
} CfgKey;

/* The table: *n gets the number of keys. */
const CfgKey *cfg_keys(int *n);

/* The key called `name` (dash or underscore spelling), or NULL. */
const CfgKey *cfg_find_key(const char *name);

/* The known key closest to `name` within edit distance 2 (underscores read as dashes), or
 * NULL: for "did you mean" messages, e.g. for an unknown --flag. */
const char *cfg_suggest_key(const char *name);

/* Write key k's value in c as text into buf ("16", "true", "swap", "0.9", the string) and
 * return buf; a field holding no value gives k->unset (or "" if that is NULL). Output
 * parses back to the same value with cfg_set. */
const char *cfg_format_value(const Config *c, const CfgKey *k, char *buf, size_t size);

/* ---- building a Config ---------------------------------------------------------------- */

/* Defaults: eng_config_default() plus the server defaults listed in Config. */
void cfg_init(Config *c);

/* Free the owned strings and reset *c to zeros (safe to call twice). */
void cfg_free(Config *c);

/* Free a CFG_LIST value (its strings and the array) and set *list to NULL. */
void cfg_list_free(char ***list);

/* Set key `key` (either spelling) from text. `origin` only shapes the error message:
 *   NULL          -> "key 'port' must be an integer, got 'abc'"
 *   "--port"      -> "--port: must be an integer, got 'abc'"        (starts with '-')
 *   "f.yaml:3"    -> "f.yaml:3: key 'port' must be an integer, got 'abc'"
 * Unknown key: PL_ERR_INVALID "unknown key 'x'", with a suggestion when one is close. */
Status cfg_set(Config *c, const char *key, const char *value, const char *origin);

/* Load a YAML file holding one mapping of keys to scalar values (an empty file sets
 * nothing). Keys are applied on top of what c holds. Errors name path:line and the key:
 * unknown keys (with a suggestion), wrong types, out-of-range or unlisted values, a key
 * given twice (in either spelling), a null value ("key 'x' needs a value"), a list or
 * mapping as value, and YAML syntax errors ("f.yaml:7: YAML error: ..."); an unreadable
 * file is PL_ERR_IO naming it. On error c may hold the keys before the bad one. */
Status cfg_load_file(Config *c, const char *path);

/* The value of `--config FILE` or `--config=FILE` in argv[1..argc-1], or NULL when absent
 * (also when --config is the last word, without its value: cfg_parse_flag reports that). */
const char *cfg_find_config_flag(int argc, char **argv);

/* Try to take argv[*i] as a config flag. Forms: `--KEY VALUE`, `--KEY=VALUE`; for bools
 * also `--KEY` alone (true), `--no-KEY` (false) and `--KEY true|false|yes|no|on|off|1|0`.
 * `--config FILE` is consumed too (and ignored: cfg_find_config_flag loaded it).
 * Returns 1 when consumed (*i is left on the last word used, so a `for (..; i++)` loop
 * continues after it), 0 when argv[*i] is not a config flag (nothing changes), -1 on a
 * bad or missing value: "pagellm: --KEY: ..." is printed to stderr and set as pl_error. */
int cfg_parse_flag(Config *c, int argc, char **argv, int *i);

/* Rules across keys, checked after the file and flags are applied: an empty api-key,
 * served-model-name, host or model; max-model-len above max-num-batched-tokens while
 * chunked prefill is off (a prompt could never be scheduled); tensor-parallel-size > 1 on
 * device cpu; and every value in its key's range (for Configs filled by hand). */
Status cfg_validate(const Config *c);

/* Every key as one aligned line: "  --block-size N    tokens per KV-cache block (default 16)". */
void cfg_print_help(FILE *f);

/* The effective settings as YAML ("key: value" per line, unset keys as comments): a file
 * that cfg_load_file reads back to the same Config. */
void cfg_write_yaml(FILE *f, const Config *c);

#endif
