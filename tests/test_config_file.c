/* test_config_file.c - the config module (server/config.c, server/config_keys.c): YAML config
 * files, --flags, validation, help, and configs/example.yaml.
 *
 * Each error case checks the status and that the message names the file:line and the key.
 * Config files are written to a mkdtemp folder. Run from the repository root;
 * PL_TEST_VERBOSE=1 prints the messages. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"

#define EXAMPLE "configs/example.yaml"

static char tmpdir[] = "/tmp/pagellm-config-XXXXXX";
static char path[256]; /* tmpdir/config.yaml, written by write_config */

static int setup(void **state) {
    if (!mkdtemp(tmpdir))
        return -1;
    snprintf(path, sizeof path, "%s/config.yaml", tmpdir);
    return 0;
}

static int teardown(void **state) {
    unlink(path);
    rmdir(tmpdir);
    return 0;
}

/* Write `text` to tmpdir/config.yaml; returns its path. */
static const char *write_config(const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

/* Assert that `s` is `want` and that the message holds every needle (NULL-terminated). */
static void expect_error(Status s, Status want, ...) {
    const char *msg = pl_error();
    if (getenv("PL_TEST_VERBOSE"))
        fprintf(stderr, "  error: %s\n", msg);
    if (s != want)
        fail_msg("status %s (want %s), message '%s'", pl_status_str(s), pl_status_str(want), msg);
    va_list ap;
    va_start(ap, want);
    for (const char *needle; (needle = va_arg(ap, const char *));)
        if (!strstr(msg, needle))
            fail_msg("message '%s' lacks '%s'", msg, needle);
    va_end(ap);
}

/* Load `text` as a config file into a fresh Config and expect an error naming all needles
 * (the needles may use "@" for "<path>:" - e.g. "@3:" - which is expanded here). */
static void expect_file_error(const char *text, Status want, const char *at_line,
                              const char *needle) {
    Config c;
    cfg_init(&c);
    Status s = cfg_load_file(&c, write_config(text));
    char where[300];
    snprintf(where, sizeof where, "%s:%s:", path, at_line);
    expect_error(s, want, where, needle, NULL);
    cfg_free(&c);
}

static Status load_text(Config *c, const char *text) {
    return cfg_load_file(c, write_config(text));
}

/* ---- example.yaml and defaults -------------------------------------------------------- */

static void test_defaults(void **state) {
    Config c;
    cfg_init(&c);
    EngineConfig e = eng_config_default();
    assert_int_equal(c.engine.block_size, e.block_size);
    assert_int_equal(c.engine.max_num_seqs, e.max_num_seqs);
    assert_int_equal(c.engine.max_num_batched_tokens, e.max_num_batched_tokens);
    assert_int_equal(c.engine.enable_chunked_prefill, 1);
    assert_int_equal(c.engine.enable_prefix_caching, 1);
    assert_int_equal(c.engine.preemption_mode, PREEMPT_SWAP);
    assert_int_equal(c.engine.max_model_len, 0);
    assert_string_equal(c.engine.device, "auto");
    assert_null(c.engine.model_dir);
    assert_null(c.model);
    assert_null(c.served_model_name);
    assert_null(c.api_key);
    assert_null(c.chat_template);
    assert_null(c.allowed_origins);
    assert_string_equal(c.allowed_methods[0], "*");
    assert_null(c.allowed_methods[1]);
    assert_string_equal(c.allowed_headers[0], "*");
    assert_int_equal(c.allow_credentials, 0);
    assert_string_equal(c.host, "127.0.0.1");
    assert_int_equal(c.port, 8000);
    assert_string_equal(c.engine.dtype, "auto");
    assert_null(c.engine.quantization);
    assert_string_equal(c.log_level, "info");
    assert_int_equal(c.engine.tensor_parallel_size, 1);
    assert_int_equal(c.engine.enforce_eager, 0);
    assert_int_equal(c.max_queue_len, 1024);
    assert_int_equal(c.max_seqs_per_request, 256);
    assert_int_equal(c.max_connections_per_ip, 1024);
    assert_int_equal(c.max_request_bytes, 1 << 20);
    assert_true(c.request_timeout == 60);
    assert_int_equal(cfg_validate(&c), PL_OK);
    cfg_free(&c);
    cfg_free(&c); /* twice is fine */
}

/* Every key of the table appears in example.yaml as "key:" or "# key:". */
static void test_example_mentions_every_key(void **state) {
    char *text;
    assert_int_equal(pl_read_file(EXAMPLE, &text, NULL), PL_OK);
    int n;
    const CfgKey *keys = cfg_keys(&n);
    assert_true(n >= 27);
    for (int i = 0; i < n; i++) {
        char set[80], commented[80];
        snprintf(set, sizeof set, "\n%s: ", keys[i].name);
        snprintf(commented, sizeof commented, "\n# %s: ", keys[i].name);
        if (!strstr(text, set) && !strstr(text, commented))
            fail_msg("%s does not mention key '%s'", EXAMPLE, keys[i].name);
    }
    free(text);
}

/* example.yaml loads, and every value in it is the default. */
static void test_example_loads_with_defaults(void **state) {
    Config c, def;
    cfg_init(&c);
    cfg_init(&def);
    Status s = cfg_load_file(&c, EXAMPLE);
    if (s != PL_OK)
        fail_msg("%s", pl_error());
    assert_int_equal(cfg_validate(&c), PL_OK);
    int n;
    const CfgKey *keys = cfg_keys(&n);
    for (int i = 0; i < n; i++) {
        char a[256], b[256];
        const char *got = cfg_format_value(&c, &keys[i], a, sizeof a);
        const char *want = cfg_format_value(&def, &keys[i], b, sizeof b);
        if (strcmp(got, want))
            fail_msg("example.yaml sets %s: %s, default is %s", keys[i].name, got, want);
    }
    cfg_free(&c);
    cfg_free(&def);
}

static void test_table_is_sane(void **state) {
    int n;
    const CfgKey *keys = cfg_keys(&n);
    for (int i = 0; i < n; i++) {
        assert_non_null(keys[i].help);
        assert_non_null(keys[i].metavar);
        assert_ptr_equal(cfg_find_key(keys[i].name), &keys[i]);
        for (int j = 0; j < i; j++)
            assert_string_not_equal(keys[i].name, keys[j].name);
        assert_null(strchr(keys[i].name, '_'));
    }
    assert_null(cfg_find_key("config"));
    assert_ptr_equal(cfg_find_key("max_num_batched_tokens"),
                     cfg_find_key("max-num-batched-tokens"));
}

/* ---- a full config -------------------------------------------------------------------- */

static const char *full_yaml = "# every key, none at its default\n"
                               "model: /models/llama\n"
                               "served-model-name: llama-8b\n"
                               "host: 0.0.0.0\n"
                               "port: 9000\n"
                               "api-key: \"s3cret: key\"\n"
                               "device: cpu\n"
                               "dtype: bfloat16\n"
                               "load-format: dummy\n"
                               "quantization: fp8\n"
                               "block-size: 32\n"
                               "kv-cache-dtype: fp8_e4m3\n"
                               "swap-space: 1.5\n"
                               "gpu-memory-utilization: 0.5\n"
                               "kv-cache-memory: 2.25\n"
                               "num-gpu-blocks-override: 100\n"
                               "max-num-seqs: 8\n"
                               "max-num-batched-tokens: 512\n"
                               "max-model-len: 256\n"
                               "enable-chunked-prefill: off\n"
                               "enable-prefix-caching: no\n"
                               "preemption-mode: recompute\n"
                               "schedule-conservativeness: 0.25\n"
                               "tensor-parallel-size: 1\n"
                               "disable-custom-all-reduce: true\n"
                               "cpu-threads: 3\n"
                               "enforce-eager: yes\n"
                               "async-scheduling: no\n"
                               "seed: 18446744073709551615\n"
                               "max-queue-len: 7\n"
                               "max-seqs-per-request: 64\n"
                               "max-connections-per-ip: 0\n"
                               "max-request-bytes: 4096\n"
                               "request-timeout: 2.5\n"
                               "log-level: debug\n"
                               "chat-template: llama3\n"
                               "tool-call-parser: mistral\n"
                               "enable-auto-tool-choice: true\n"
                               "reasoning-parser: deepseek_r1\n"
                               "allowed-origins: [https://a.example, \"*\"]\n"
                               "allowed-methods: [GET, POST]\n"
                               "allowed-headers: Authorization, X-Trace\n"
                               "allow-credentials: true\n";

static void check_full(const Config *c) {
    assert_string_equal(c->model, "/models/llama");
    assert_ptr_equal(c->engine.model_dir, c->model);
    assert_string_equal(c->served_model_name, "llama-8b");
    assert_string_equal(c->host, "0.0.0.0");
    assert_int_equal(c->port, 9000);
    assert_string_equal(c->api_key, "s3cret: key");
    assert_string_equal(c->engine.device, "cpu");
    assert_string_equal(c->engine.dtype, "bfloat16");
    assert_int_equal(c->engine.load_dummy, 1);
    assert_string_equal(c->engine.quantization, "fp8");
    assert_int_equal(c->engine.block_size, 32);
    assert_int_equal(c->engine.kv_cache_fp8, 1);
    assert_true(c->engine.swap_space_gib == 1.5);
    assert_true(c->engine.gpu_memory_utilization == 0.5);
    assert_true(c->engine.kv_cache_memory_gib == 2.25);
    assert_int_equal(c->engine.num_gpu_blocks_override, 100);
    assert_int_equal(c->engine.max_num_seqs, 8);
    assert_int_equal(c->engine.max_num_batched_tokens, 512);
    assert_int_equal(c->engine.max_model_len, 256);
    assert_int_equal(c->engine.enable_chunked_prefill, 0);
    assert_int_equal(c->engine.enable_prefix_caching, 0);
    assert_int_equal(c->engine.preemption_mode, PREEMPT_RECOMPUTE);
    assert_true(c->engine.schedule_conservativeness == 0.25);
    assert_int_equal(c->engine.tensor_parallel_size, 1);
    assert_int_equal(c->engine.disable_custom_all_reduce, 1);
    assert_int_equal(c->engine.cpu_threads, 3);
    assert_int_equal(c->engine.enforce_eager, 1);
    assert_int_equal(c->engine.async_scheduling, 0);
    assert_true(c->engine.seed == UINT64_MAX);
    assert_int_equal(c->max_queue_len, 7);
    assert_int_equal(c->max_seqs_per_request, 64);
    assert_int_equal(c->max_connections_per_ip, 0);
    assert_int_equal(c->max_request_bytes, 4096);
    assert_true(c->request_timeout == 2.5);
    assert_string_equal(c->log_level, "debug");
    assert_string_equal(c->chat_template, "llama3");
    assert_string_equal(c->tool_call_parser, "mistral");
    assert_int_equal(c->enable_auto_tool_choice, 1);
    assert_string_equal(c->reasoning_parser, "deepseek_r1");
    assert_string_equal(c->allowed_origins[0], "https://a.example");
    assert_string_equal(c->allowed_origins[1], "*");
    assert_null(c->allowed_origins[2]);
    assert_string_equal(c->allowed_methods[0], "GET");
    assert_string_equal(c->allowed_methods[1], "POST");
    assert_null(c->allowed_methods[2]);
    assert_string_equal(c->allowed_headers[0], "Authorization");
    assert_string_equal(c->allowed_headers[1], "X-Trace");
    assert_null(c->allowed_headers[2]);
    assert_int_equal(c->allow_credentials, 1);
}

static void test_full_config(void **state) {
    Config c;
    cfg_init(&c);
    Status s = load_text(&c, full_yaml);
    if (s != PL_OK)
        fail_msg("%s", pl_error());
    check_full(&c);
    assert_int_equal(cfg_validate(&c), PL_OK);
    /* the full text sets every key of the table */
    int n;
    const CfgKey *keys = cfg_keys(&n);
    for (int i = 0; i < n; i++) {
        char line[80];
        snprintf(line, sizeof line, "\n%s: ", keys[i].name);
        if (!strstr(full_yaml, line))
            fail_msg("the full config lacks '%s'", keys[i].name);
    }
    cfg_free(&c);
}

/* cfg_write_yaml writes a file that loads back to the same values. */
static void test_write_yaml_round_trip(void **state) {
    Config c, back;
    cfg_init(&c);
    assert_int_equal(load_text(&c, full_yaml), PL_OK);
    free(c.served_model_name);
    /* quotes, backslashes, C0 and C1 controls (U+0085, U+0080), U+FFFF and YAML 1.1's line
     * breaks U+2028 / U+2029 before a space must all read back (regression:
     * tests/fuzz/crashes/config_yaml/) */
    c.served_model_name = strdup("quote\" back\\slash\ttab\xc2\x85"
                                 "nel\xc2\x80"
                                 "c1\xef\xbf\xbf"
                                 "nc\xe2\x80\xa8 ls\xe2\x80\xa9 ps");
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    cfg_write_yaml(f, &c);
    fclose(f);
    cfg_init(&back);
    Status s = cfg_load_file(&back, path);
    if (s != PL_OK)
        fail_msg("%s", pl_error());
    int n;
    const CfgKey *keys = cfg_keys(&n);
    for (int i = 0; i < n; i++) {
        char a[256], b[256];
        assert_string_equal(cfg_format_value(&back, &keys[i], a, sizeof a),
                            cfg_format_value(&c, &keys[i], b, sizeof b));
    }
    /* and the defaults, with their unset keys written as comments */
    cfg_free(&c);
    cfg_free(&back);
    cfg_init(&c);
    f = fopen(path, "w");
    cfg_write_yaml(f, &c);
    fclose(f);
    cfg_init(&back);
    assert_int_equal(cfg_load_file(&back, path), PL_OK);
    assert_null(back.model);
    assert_int_equal(back.engine.max_model_len, 0);
    cfg_free(&c);
    cfg_free(&back);
}

static void test_underscore_aliases(void **state) {
    Config c;
    cfg_init(&c);
    Status s = load_text(&c, "block_size: 64\nmax_num_seqs: 3\nenable_prefix_caching: false\n"
                             "gpu_memory_utilization: 0.25\nserved_model_name: x\n");
    if (s != PL_OK)
        fail_msg("%s", pl_error());
    assert_int_equal(c.engine.block_size, 64);
    assert_int_equal(c.engine.max_num_seqs, 3);
    assert_int_equal(c.engine.enable_prefix_caching, 0);
    assert_true(c.engine.gpu_memory_utilization == 0.25);
    assert_string_equal(c.served_model_name, "x");
    assert_int_equal(cfg_set(&c, "max_model_len", "100", NULL), PL_OK);
    assert_int_equal(c.engine.max_model_len, 100);
    cfg_free(&c);
}

static void test_empty_files(void **state) {
    const char *empties[] = {"", "# only a comment\n\n", "---\n", "---\n...\n", "~\n"};
    for (size_t i = 0; i < sizeof empties / sizeof empties[0]; i++) {
        Config c;
        cfg_init(&c);
        Status s = load_text(&c, empties[i]);
        if (s != PL_OK)
            fail_msg("'%s': %s", empties[i], pl_error());
        assert_int_equal(c.port, 8000);
        cfg_free(&c);
    }
}

static void test_value_forms(void **state) {
    Config c;
    cfg_init(&c);
    /* bool words in any case, quoted numbers, enum names in any case, document markers */
    Status s = load_text(&c, "---\nenable-chunked-prefill: 0\nenable-prefix-caching: ON\n"
                             "enforce-eager: True\nport: \"8080\"\nlog-level: WARNING\n"
                             "device: 'cuda'\nload-format: safetensors\n...\n");
    if (s != PL_OK)
        fail_msg("%s", pl_error());
    assert_int_equal(c.engine.enable_chunked_prefill, 0);
    assert_int_equal(c.engine.enable_prefix_caching, 1);
    assert_int_equal(c.engine.enforce_eager, 1);
    assert_int_equal(c.port, 8080);
    assert_string_equal(c.log_level, "warning");
    assert_string_equal(c.engine.device, "cuda");
    assert_int_equal(c.engine.load_dummy, 0);
    /* later files apply on top */
    assert_int_equal(load_text(&c, "port: 1\n"), PL_OK);
    assert_int_equal(c.port, 1);
    assert_string_equal(c.log_level, "warning");
    cfg_free(&c);
}

/* ---- file errors ---------------------------------------------------------------------- */

static void test_unknown_key(void **state) {
    expect_file_error("port: 8000\n\nblok-size: 16\n", PL_ERR_INVALID, "3",
                      "unknown key 'blok-size'");
    expect_error(PL_ERR_INVALID, PL_ERR_INVALID, "did you mean 'block-size'?", NULL);
    /* a transposition and an underscore spelling are close too */
    expect_file_error("max_nmu_seqs: 4\n", PL_ERR_INVALID, "1", "did you mean 'max-num-seqs'?");
    /* far from everything: no suggestion */
    expect_file_error("frobnicate: 1\n", PL_ERR_INVALID, "1", "unknown key 'frobnicate'");
    assert_null(strstr(pl_error(), "did you mean"));
    expect_file_error("config: other.yaml\n", PL_ERR_INVALID, "1", "unknown key 'config'");
}

static void test_type_errors(void **state) {
    expect_file_error("host: x\nport: abc\n", PL_ERR_INVALID, "2",
                      "key 'port' must be an integer, got 'abc'");
    expect_file_error("block-size: 16.5\n", PL_ERR_INVALID, "1", "key 'block-size' must be an");
    expect_file_error("swap-space: lots\n", PL_ERR_INVALID, "1",
                      "key 'swap-space' must be a number, got 'lots'");
    expect_file_error("swap-space: .nan\n", PL_ERR_INVALID, "1", "key 'swap-space' must be a");
    expect_file_error("enforce-eager: maybe\n", PL_ERR_INVALID, "1",
                      "key 'enforce-eager' must be true or false, got 'maybe'");
    expect_file_error("seed: -1\n", PL_ERR_INVALID, "1",
                      "key 'seed' must be a non-negative integer");
    expect_file_error("seed: 18446744073709551616\n", PL_ERR_INVALID, "1",
                      "key 'seed' = 18446744073709551616 is out of range");
    expect_file_error("model: ''\n", PL_ERR_INVALID, "1", "key 'model' must not be empty");
}

static void test_range_errors(void **state) {
    expect_file_error("\n\n\n\nport: 70000\n", PL_ERR_INVALID, "5",
                      "key 'port' = 70000 is out of range [1, 65535]");
    expect_file_error("port: 0\n", PL_ERR_INVALID, "1", "key 'port' = 0 is out of range");
    expect_file_error("port: 99999999999999999999\n", PL_ERR_INVALID, "1",
                      "key 'port' = 99999999999999999999 is out of range");
    expect_file_error("gpu-memory-utilization: 0\n", PL_ERR_INVALID, "1",
                      "key 'gpu-memory-utilization' = 0 is out of range (0, 1]");
    expect_file_error("gpu-memory-utilization: 1.01\n", PL_ERR_INVALID, "1", "(0, 1]");
    expect_file_error("swap-space: -1\n", PL_ERR_INVALID, "1",
                      "key 'swap-space' = -1 is out of range (must be >= 0)");
    expect_file_error("max-num-seqs: 0\n", PL_ERR_INVALID, "1",
                      "key 'max-num-seqs' = 0 is out of range (must be >= 1)");
    expect_file_error("max-model-len: 0\n", PL_ERR_INVALID, "1", "key 'max-model-len' = 0");
    expect_file_error("num-gpu-blocks-override: -2\n", PL_ERR_INVALID, "1",
                      "key 'num-gpu-blocks-override' = -2");
    expect_file_error("block-size: 7\n", PL_ERR_INVALID, "1",
                      "key 'block-size' = 7 is not one of 8, 16, 32, 64, 128");
    expect_file_error("block-size: 256\n", PL_ERR_INVALID, "1", "is not one of 8, 16");
    /* issue 34's keys */
    expect_file_error("max-seqs-per-request: 0\n", PL_ERR_INVALID, "1",
                      "key 'max-seqs-per-request' = 0 is out of range (must be >= 1)");
    expect_file_error("max-connections-per-ip: -1\n", PL_ERR_INVALID, "1",
                      "key 'max-connections-per-ip' = -1 is out of range (must be >= 0)");
    expect_file_error("max-connections-per-ip: many\n", PL_ERR_INVALID, "1",
                      "key 'max-connections-per-ip' must be an integer, got 'many'");
}

static void test_enum_errors(void **state) {
    expect_file_error("preemption-mode: kill\n", PL_ERR_INVALID, "1",
                      "key 'preemption-mode' must be one of swap, recompute, got 'kill'");
    /* vLLM's other fp8 format is not built: the key and the values there are */
    expect_file_error("kv-cache-dtype: fp8_e5m2\n", PL_ERR_INVALID, "1",
                      "key 'kv-cache-dtype' must be one of auto, fp8, fp8_e4m3, got 'fp8_e5m2'");
    expect_file_error("device: gpu\n", PL_ERR_INVALID, "1",
                      "key 'device' must be one of auto, cpu, cuda");
    expect_file_error("dtype: int8\n", PL_ERR_INVALID, "1",
                      "must be one of auto, float32, float16, bfloat16");
    expect_file_error("load-format: pt\n", PL_ERR_INVALID, "1", "key 'load-format' must be one");
    expect_file_error("log-level: loud\n", PL_ERR_INVALID, "1", "key 'log-level' must be one");
    expect_file_error("tool-call-parser: pythonic\n", PL_ERR_INVALID, "1",
                      "key 'tool-call-parser' must be one of hermes, llama3_json, mistral, got "
                      "'pythonic'");
    expect_file_error("reasoning-parser: r1\n", PL_ERR_INVALID, "1",
                      "key 'reasoning-parser' must be one of deepseek_r1, qwen3, got 'r1'");
}

/* List keys: a YAML list of scalars, a flow list, or comma-separated text; never an empty
 * item or a nested value. */
static void test_list_errors(void **state) {
    Config c;
    cfg_init(&c);
    if (load_text(&c, "allowed-origins:\n  - https://a.example\n  - '*'\n") != PL_OK)
        fail_msg("%s", pl_error());
    assert_string_equal(c.allowed_origins[1], "*");
    assert_null(c.allowed_origins[2]);
    cfg_free(&c);
    expect_file_error("allowed-origins:\n  - a\n  - [b]\n", PL_ERR_INVALID, "2",
                      "key 'allowed-origins' must be a list of strings");
    expect_file_error("allowed-origins:\n  - a\n  - ''\n", PL_ERR_INVALID, "2",
                      "key 'allowed-origins' must be a list of non-empty strings");
    expect_file_error("allowed-methods: a,,b\n", PL_ERR_INVALID, "1",
                      "must be a list of non-empty strings");
    expect_file_error("allowed-headers: '[1, 2]'\n", PL_ERR_INVALID, "1",
                      "must be a list of non-empty strings");
    expect_file_error("allowed-headers: '[x'\n", PL_ERR_INVALID, "1", "must be a list");
    expect_file_error("allowed-origins: {a: b}\n", PL_ERR_INVALID, "1",
                      "must be a single value, got a mapping");
}

static void test_duplicate_key(void **state) {
    expect_file_error("port: 1\nhost: h\nport: 2\n", PL_ERR_INVALID, "3",
                      "key 'port' is given twice (first on line 1)");
    /* the two spellings are one key */
    expect_file_error("block-size: 8\nblock_size: 8\n", PL_ERR_INVALID, "2",
                      "key 'block-size' is given twice");
}

static void test_yaml_syntax_error(void **state) {
    expect_file_error("port: 1\nblock-size: 16: 32\n", PL_ERR_INVALID, "2", "YAML error: ");
    expect_file_error("port: 1\nhost: 'a' b\n", PL_ERR_INVALID, "2", "YAML error: ");
    expect_file_error("port: 1\n- x\n", PL_ERR_INVALID, "2", "YAML error: ");
    expect_file_error("port: 1\nhost: \"open\n", PL_ERR_INVALID, "3", "YAML error: ");
    expect_file_error("port: 1\n\tblock-size: 8\n", PL_ERR_INVALID, "2", "YAML error: ");
}

static void test_missing_file(void **state) {
    Config c;
    cfg_init(&c);
    char missing[300];
    snprintf(missing, sizeof missing, "%s/nope.yaml", tmpdir);
    expect_error(cfg_load_file(&c, missing), PL_ERR_IO, missing, NULL);
    cfg_free(&c);
}

static void test_null_value(void **state) {
    expect_file_error("port: 1\nblock-size:\n", PL_ERR_INVALID, "2",
                      "key 'block-size' needs a value");
    expect_file_error("host: ~\n", PL_ERR_INVALID, "1", "key 'host' needs a value");
    expect_file_error("api-key: null\n", PL_ERR_INVALID, "1", "key 'api-key' needs a value");
}

static void test_non_scalar_values(void **state) {
    expect_file_error("port: 1\nblock-size: [16, 32]\n", PL_ERR_INVALID, "2",
                      "key 'block-size' must be a single value, got a list");
    expect_file_error("host:\n  - a\n  - b\n", PL_ERR_INVALID, "2",
                      "key 'host' must be a single value, got a list");
    expect_file_error("device: {kind: cuda}\n", PL_ERR_INVALID, "1",
                      "key 'device' must be a single value, got a mapping");
    expect_file_error("port: &p 1\nmax-num-seqs: *p\n", PL_ERR_INVALID, "2",
                      "key 'max-num-seqs' must be a single value");
}

static void test_bad_shapes(void **state) {
    expect_file_error("- port: 1\n", PL_ERR_INVALID, "1", "must be a mapping of keys");
    expect_file_error("just text\n", PL_ERR_INVALID, "1", "must be a mapping of keys");
    expect_file_error("port: 1\n---\nport: 2\n", PL_ERR_INVALID, "2", "only one YAML document");
    expect_file_error("[a, b]: 1\n", PL_ERR_INVALID, "1", "keys must be plain names");
}

/* ---- cfg_set and validation ----------------------------------------------------------- */

static void test_cfg_set(void **state) {
    Config c;
    cfg_init(&c);
    assert_int_equal(cfg_set(&c, "model", "models/stories260K", NULL), PL_OK);
    assert_string_equal(c.engine.model_dir, "models/stories260K");
    assert_int_equal(cfg_set(&c, "model", "other", NULL), PL_OK); /* replaces, no leak */
    assert_ptr_equal(c.engine.model_dir, c.model);
    expect_error(cfg_set(&c, "block-size", "7", "--block-size"), PL_ERR_INVALID,
                 "--block-size: 7 is not one of 8, 16, 32, 64, 128", NULL);
    expect_error(cfg_set(&c, "port", "abc", NULL), PL_ERR_INVALID,
                 "key 'port' must be an integer, got 'abc'", NULL);
    expect_error(cfg_set(&c, "port", "0", "env.yaml:4"), PL_ERR_INVALID,
                 "env.yaml:4: key 'port' = 0 is out of range [1, 65535]", NULL);
    expect_error(cfg_set(&c, "prot", "1", NULL), PL_ERR_INVALID,
                 "unknown key 'prot' (did you mean 'port'?)", NULL);
    assert_int_equal(c.port, 8000); /* failures leave the value */
    assert_string_equal(cfg_suggest_key("max-num-batched-token"), "max-num-batched-tokens");
    assert_string_equal(cfg_suggest_key("Block-Size"), "block-size");
    assert_null(cfg_suggest_key("tokenizer"));
    cfg_free(&c);
}

static void test_validate(void **state) {
    Config c;
    cfg_init(&c);
    /* chunked prefill off: a max-model-len prompt must fit one step (an automatic
     * max-num-batched-tokens is raised to it by the engine) */
    assert_int_equal(cfg_set(&c, "enable-chunked-prefill", "false", NULL), PL_OK);
    assert_int_equal(cfg_set(&c, "max-model-len", "4096", NULL), PL_OK);
    assert_int_equal(cfg_validate(&c), PL_OK);
    assert_int_equal(cfg_set(&c, "max-num-batched-tokens", "2048", NULL), PL_OK);
    expect_error(cfg_validate(&c), PL_ERR_INVALID, "max-model-len", "max-num-batched-tokens",
                 "enable-chunked-prefill", NULL);
    assert_int_equal(cfg_set(&c, "max-num-batched-tokens", "4096", NULL), PL_OK);
    assert_int_equal(cfg_validate(&c), PL_OK);
    assert_int_equal(cfg_set(&c, "enable-chunked-prefill", "true", NULL), PL_OK);
    assert_int_equal(cfg_set(&c, "max-num-batched-tokens", "16", NULL), PL_OK);
    assert_int_equal(cfg_validate(&c), PL_OK); /* batched < seqs is fine too */

    /* values filled by hand go through the same checks */
    c.api_key = strdup("");
    expect_error(cfg_validate(&c), PL_ERR_INVALID, "key 'api-key' must not be empty", NULL);
    free(c.api_key);
    c.api_key = NULL;
    c.port = 70000;
    expect_error(cfg_validate(&c), PL_ERR_INVALID, "key 'port' = 70000 is out of range", NULL);
    c.port = 8000;
    c.engine.block_size = 12;
    expect_error(cfg_validate(&c), PL_ERR_INVALID, "key 'block-size' = 12 is not one of", NULL);
    c.engine.block_size = 16;
    c.engine.device = "tpu";
    expect_error(cfg_validate(&c), PL_ERR_INVALID, "key 'device' must be one of", NULL);
    c.engine.device = NULL;
    expect_error(cfg_validate(&c), PL_ERR_INVALID, "key 'device' needs a value", NULL);
    c.engine.device = "cpu";
    c.engine.preemption_mode = (PreemptionMode)7;
    expect_error(cfg_validate(&c), PL_ERR_INVALID, "key 'preemption-mode'", NULL);
    c.engine.preemption_mode = PREEMPT_RECOMPUTE;
    c.enable_auto_tool_choice = 1; /* needs a parser */
    expect_error(cfg_validate(&c), PL_ERR_INVALID, "enable-auto-tool-choice needs tool-call-parser",
                 NULL);
    c.tool_call_parser = "hermes";
    assert_int_equal(cfg_validate(&c), PL_OK);
    free(c.host);
    c.host = NULL;
    expect_error(cfg_validate(&c), PL_ERR_INVALID, "key 'host' needs a value", NULL);
    c.host = strdup("::1");
    assert_int_equal(cfg_validate(&c), PL_OK);
    c.engine.tensor_parallel_size = 2;
    expect_error(cfg_validate(&c), PL_ERR_INVALID, "tensor-parallel-size", "cpu", NULL);
    cfg_free(&c);
}

/* ---- flags ---------------------------------------------------------------------------- */

/* Run cfg_parse_flag over argv[1..] the way a command does; unknown words are collected
 * into `rest` (space-separated). Returns -1 at the first bad flag, else 0. */
static int parse_flags(Config *c, int argc, char **argv, char *rest, size_t size) {
    rest[0] = '\0';
    for (int i = 1; i < argc; i++) {
        int r = cfg_parse_flag(c, argc, argv, &i);
        if (r < 0)
            return -1;
        if (r == 0) {
            strncat(rest, argv[i], size - strlen(rest) - 2);
            strcat(rest, " ");
        }
    }
    return 0;
}

#define ARGV(...)                                                                                  \
    (char *[]) {                                                                                   \
        "pagellm", __VA_ARGS__, NULL                                                               \
    }
#define ARGC(...)           ((int)(sizeof((char *[]){"pagellm", __VA_ARGS__}) / sizeof(char *)))
#define PARSE(c, rest, ...) parse_flags(c, ARGC(__VA_ARGS__), ARGV(__VA_ARGS__), rest, sizeof rest)

static void test_flags(void **state) {
    Config c;
    cfg_init(&c);
    char rest[256];
    assert_int_equal(PARSE(&c, rest, "--block-size", "32", "--port=9001", "--host", "0.0.0.0",
                           "--model=/m", "--gpu-memory-utilization", "0.5", "--preemption-mode",
                           "recompute", "--seed", "42", "--max_num_seqs", "5",
                           "--served_model_name=name"),
                     0);
    assert_string_equal(rest, "");
    assert_int_equal(c.engine.block_size, 32);
    assert_int_equal(c.port, 9001);
    assert_string_equal(c.host, "0.0.0.0");
    assert_string_equal(c.engine.model_dir, "/m");
    assert_true(c.engine.gpu_memory_utilization == 0.5);
    assert_int_equal(c.engine.preemption_mode, PREEMPT_RECOMPUTE);
    assert_true(c.engine.seed == 42);
    assert_int_equal(c.engine.max_num_seqs, 5);
    assert_string_equal(c.served_model_name, "name");
    /* issue 34's keys as flags, both spellings */
    assert_int_equal(PARSE(&c, rest, "--max-seqs-per-request", "9", "--max_connections_per_ip=3"),
                     0);
    assert_int_equal(c.max_seqs_per_request, 9);
    assert_int_equal(c.max_connections_per_ip, 3);
    /* CORS lists: a JSON list or comma-separated text */
    assert_int_equal(PARSE(&c, rest, "--allowed-origins", "[\"*\"]", "--allowed-methods",
                           " GET , POST", "--allow-credentials"),
                     0);
    assert_string_equal(c.allowed_origins[0], "*");
    assert_null(c.allowed_origins[1]);
    assert_string_equal(c.allowed_methods[1], "POST");
    assert_null(c.allowed_methods[2]);
    assert_int_equal(c.allow_credentials, 1);
    /* a value may look like a flag only after '=' */
    assert_int_equal(PARSE(&c, rest, "--api-key=--weird"), 0);
    assert_string_equal(c.api_key, "--weird");
    cfg_free(&c);
}

static void test_bool_flags(void **state) {
    Config c;
    cfg_init(&c);
    char rest[256];
    assert_int_equal(PARSE(&c, rest, "--no-enable-prefix-caching", "--enforce-eager"), 0);
    assert_int_equal(c.engine.enable_prefix_caching, 0);
    assert_int_equal(c.engine.enforce_eager, 1);
    assert_int_equal(PARSE(&c, rest, "--enable-prefix-caching", "--enforce-eager", "false",
                           "--enable-chunked-prefill=off"),
                     0);
    assert_int_equal(c.engine.enable_prefix_caching, 1);
    assert_int_equal(c.engine.enforce_eager, 0);
    assert_int_equal(c.engine.enable_chunked_prefill, 0);
    /* a following word that is not a bool stays for the caller */
    assert_int_equal(
        PARSE(&c, rest, "--enable-chunked-prefill", "prompt.txt", "--no_enforce_eager"), 0);
    assert_int_equal(c.engine.enable_chunked_prefill, 1);
    assert_string_equal(rest, "prompt.txt ");
    assert_int_equal(c.engine.enforce_eager, 0);
    assert_int_equal(PARSE(&c, rest, "--enforce-eager", "1"), 0);
    assert_int_equal(c.engine.enforce_eager, 1);
    assert_string_equal(rest, "");
    cfg_free(&c);
}

static void test_flags_not_ours(void **state) {
    Config c;
    cfg_init(&c);
    char rest[256];
    assert_int_equal(PARSE(&c, rest, "--prompt", "hi", "--no-port", "-h", "--", "--max-tokens=3",
                           "--blok-size", "16"),
                     0);
    assert_string_equal(rest, "--prompt hi --no-port -h -- --max-tokens=3 --blok-size 16 ");
    assert_int_equal(c.engine.block_size, 16);
    /* cfg_parse_flag leaves *i alone when it returns 0 */
    char **argv = ARGV("--prompt", "x");
    int i = 1;
    assert_int_equal(cfg_parse_flag(&c, 3, argv, &i), 0);
    assert_int_equal(i, 1);
    cfg_free(&c);
}

/* A bad flag returns -1 with "--key: ..." as the error (also printed to stderr). */
static void expect_flag_error(int argc, char **argv, const char *needle) {
    Config c;
    cfg_init(&c);
    char rest[256];
    assert_int_equal(parse_flags(&c, argc, argv, rest, sizeof rest), -1);
    expect_error(PL_ERR_INVALID, PL_ERR_INVALID, needle, NULL);
    cfg_free(&c);
}

#define FLAG_ERROR(needle, ...) expect_flag_error(ARGC(__VA_ARGS__), ARGV(__VA_ARGS__), needle)

static void test_bad_flags(void **state) {
    FLAG_ERROR("--block-size: 7 is not one of 8, 16, 32, 64, 128", "--block-size", "7");
    FLAG_ERROR("--kv-cache-dtype: must be one of auto, fp8, fp8_e4m3, got 'fp8_e5m2'",
               "--kv-cache-dtype", "fp8_e5m2");
    FLAG_ERROR("--port: must be an integer, got 'x'", "--port=x");
    FLAG_ERROR("--port: 70000 is out of range [1, 65535]", "--port", "70000");
    FLAG_ERROR("--port: needs a value", "--port");
    FLAG_ERROR("--model: needs a value", "--model", "--port", "1");
    FLAG_ERROR("--preemption-mode: must be one of swap, recompute", "--preemption-mode", "x");
    FLAG_ERROR("--enforce-eager: must be true or false, got 'maybe'", "--enforce-eager=maybe");
    FLAG_ERROR("--no-enforce-eager: takes no value", "--no-enforce-eager=1");
    FLAG_ERROR("--max_num_seqs: 0 is out of range", "--max_num_seqs", "0");
    FLAG_ERROR("--config: needs a file", "--config");
    FLAG_ERROR("--max-seqs-per-request: 0 is out of range (must be >= 1)", "--max-seqs-per-request",
               "0");
    FLAG_ERROR("--max-connections-per-ip: needs a value", "--max-connections-per-ip");
}

static void test_config_then_flags(void **state) {
    write_config("port: 9000\nblock-size: 64\nmax-num-seqs: 4\n");
    char **argv = ARGV("--block-size", "8", "--config", path, "--max-num-seqs=2", "--prompt", "p");
    int argc = ARGC("--block-size", "8", "--config", path, "--max-num-seqs=2", "--prompt", "p");
    const char *file = cfg_find_config_flag(argc, argv);
    assert_non_null(file);
    assert_string_equal(file, path);
    Config c;
    cfg_init(&c);
    assert_int_equal(cfg_load_file(&c, file), PL_OK);
    char rest[256];
    assert_int_equal(parse_flags(&c, argc, argv, rest, sizeof rest), 0);
    assert_string_equal(rest, "--prompt p "); /* --config FILE was consumed */
    assert_int_equal(c.port, 9000);           /* from the file */
    assert_int_equal(c.engine.block_size, 8); /* flags win, wherever they stand */
    assert_int_equal(c.engine.max_num_seqs, 2);
    cfg_free(&c);

    assert_string_equal(cfg_find_config_flag(ARGC("--port", "1", "--config=a.yaml"),
                                             ARGV("--port", "1", "--config=a.yaml")),
                        "a.yaml");
    assert_null(cfg_find_config_flag(ARGC("--port", "1"), ARGV("--port", "1")));
    assert_null(cfg_find_config_flag(ARGC("--config"), ARGV("--config")));
}

/* ---- help ----------------------------------------------------------------------------- */

static void test_help(void **state) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cfg_print_help(f);
    fclose(f);
    if (getenv("PL_TEST_VERBOSE"))
        fputs(buf, stderr);
    int n;
    const CfgKey *keys = cfg_keys(&n);
    for (int i = 0; i < n; i++) {
        char flag[80];
        snprintf(flag, sizeof flag, "%s%s ", keys[i].type == CFG_BOOL ? "--[no-]" : "--",
                 keys[i].name);
        if (!strstr(buf, flag))
            fail_msg("help lacks %s", flag);
    }
    assert_non_null(strstr(buf, "--config FILE"));
    assert_non_null(strstr(buf, "(default 16)\n"));
    assert_non_null(strstr(buf, "(default 127.0.0.1)\n"));
    assert_non_null(strstr(buf, "(default the model's maximum)\n"));
    /* aligned: every help text starts in the same column */
    int col = -1, lines = 0;
    for (char *line = buf; *line; lines++) {
        char *nl = strchr(line, '\n');
        char *gap = strstr(line + 2, "  ");
        assert_true(gap && gap < nl);
        int c = (int)(gap - line);
        while (line[c] == ' ')
            c++;
        if (col < 0)
            col = c;
        assert_int_equal(c, col);
        line = nl + 1;
    }
    assert_int_equal(lines, n + 1);
    free(buf);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_example_mentions_every_key),
        cmocka_unit_test(test_example_loads_with_defaults),
        cmocka_unit_test(test_table_is_sane),
        cmocka_unit_test(test_full_config),
        cmocka_unit_test(test_write_yaml_round_trip),
        cmocka_unit_test(test_underscore_aliases),
        cmocka_unit_test(test_empty_files),
        cmocka_unit_test(test_value_forms),
        cmocka_unit_test(test_unknown_key),
        cmocka_unit_test(test_type_errors),
        cmocka_unit_test(test_range_errors),
        cmocka_unit_test(test_enum_errors),
        cmocka_unit_test(test_list_errors),
        cmocka_unit_test(test_duplicate_key),
        cmocka_unit_test(test_yaml_syntax_error),
        cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_null_value),
        cmocka_unit_test(test_non_scalar_values),
        cmocka_unit_test(test_bad_shapes),
        cmocka_unit_test(test_cfg_set),
        cmocka_unit_test(test_validate),
        cmocka_unit_test(test_flags),
        cmocka_unit_test(test_bool_flags),
        cmocka_unit_test(test_flags_not_ours),
        cmocka_unit_test(test_bad_flags),
        cmocka_unit_test(test_config_then_flags),
        cmocka_unit_test(test_help),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
