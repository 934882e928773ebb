/* test_cli.c - the pagellm binary as a user runs it: golden output on stdout, one-line
 * errors with non-zero exit codes for bad flags and bad model folders, help texts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "port_test_util.h"

#define PAGELLM "build/pagellm"

typedef struct {
    int status; /* exit code */
    char *out;
    char *err;
} RunResult;

static char tmpdir[] = "/tmp/pagellm-cli-XXXXXX";

static int setup(void **state) {
    (void)state;
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Run `args` (shell syntax) through the binary, capturing stdout, stderr and exit code. */
static RunResult run(const char *args) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s %s >%s/out 2>%s/err", PAGELLM, args, tmpdir, tmpdir);
    int st = system(cmd);
    RunResult r = {.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128};
    char path[512];
    snprintf(path, sizeof path, "%s/out", tmpdir);
    assert_int_equal(pl_read_file(path, &r.out, NULL), PL_OK);
    snprintf(path, sizeof path, "%s/err", tmpdir);
    assert_int_equal(pl_read_file(path, &r.err, NULL), PL_OK);
    return r;
}

static void run_free(RunResult *r) {
    free(r->out);
    free(r->err);
}

static void test_generate_prints_golden_text(void **state) {
    (void)state;
    RunResult r = run("generate --prompt 'Once upon a time' --max-tokens 32 --temperature 0");
    assert_int_equal(r.status, 0);
    assert_string_equal(r.out, ", there was a little girl named Lily. She loved to play outside "
                               "in the park. One day, she saw\n");
    assert_non_null(strstr(r.err, "32 generated (finish: length)"));
    run_free(&r);
}

/* quantization fp8 on the bundled model: weights quantized at load, the golden case's first 16
 * tokens kept (test_fp8_models measures the rest), the format in the start-up log. */
static void test_generate_quantization_fp8(void **state) {
    (void)state;
    RunResult r = run("generate --device cpu --quantization fp8 --prompt 'Once upon a time' "
                      "--max-tokens 16 --temperature 0");
    assert_int_equal(r.status, 0);
    assert_string_equal(r.out, ", there was a little girl named Lily. She loved to play\n");
    assert_non_null(strstr(r.err, "weights: fp8 e4m3, per-channel scales"));
    run_free(&r);
    r = run("generate --device cpu --quantization int8");
    assert_int_equal(r.status, 2);
    assert_non_null(strstr(r.err, "--quantization"));
    run_free(&r);
}

/* serve --quantization fp8 answers a completion over HTTP (curl; skipped without it). */
static void test_serve_quantization_fp8(void **state) {
    (void)state;
    if (system("command -v curl >/dev/null 2>&1") != 0)
        skip();
    char cmd[4096];
    int port = test_free_port();
    assert_true(port > 0);
    snprintf(cmd, sizeof cmd,
             "%s serve --device cpu --quantization fp8 --port %d 2>%s/serve.err & pid=$!; "
             "ok=1; for i in $(seq 300); do curl -sf http://127.0.0.1:%d/health >/dev/null && "
             "ok=0 && break; kill -0 $pid 2>/dev/null || break; sleep 0.1; done; "
             "[ $ok = 0 ] && curl -sf http://127.0.0.1:%d/v1/completions -H "
             "'Content-Type: application/json' -d '{\"prompt\": \"Once upon a time\", "
             "\"max_tokens\": 16, \"temperature\": 0}' >%s/completion.json; ok=$?; "
             "kill $pid; wait $pid; [ $ok = 0 ] || cat %s/serve.err >&2; exit $ok",
             PAGELLM, port, tmpdir, port, port, tmpdir, tmpdir);
    assert_int_equal(system(cmd), 0);
    char path[512], *body;
    snprintf(path, sizeof path, "%s/completion.json", tmpdir);
    assert_int_equal(pl_read_file(path, &body, NULL), PL_OK);
    if (!strstr(body, ", there was a little girl named Lily. She loved to play"))
        fail_msg("completion: %s", body);
    free(body);
}

static void test_prompt_file_keeps_input_order(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/prompts.txt", tmpdir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("Lily and Tom\n\n{\"prompt\": \"Once upon a time\", \"max_tokens\": 16}\n"
          "The cat sat on the\n",
          f);
    fclose(f);
    char args[1024];
    snprintf(args, sizeof args, "generate --prompt-file %s --max-tokens 16 --temperature 0", path);
    RunResult r = run(args);
    assert_int_equal(r.status, 0);
    assert_string_equal(r.out, " were playing in the park. They liked to play with\n"
                               ", there was a little girl named Lily. She loved to play\n"
                               " ground. She liked to see a big bo\n");
    run_free(&r);
}

static void test_bad_prompt_file_line_is_named(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/bad.jsonl", tmpdir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"prompt\": \"ok\"}\n{\"prompt\": 5}\n", f);
    fclose(f);
    char args[1024];
    snprintf(args, sizeof args, "generate --prompt-file %s", path);
    RunResult r = run(args);
    assert_int_equal(r.status, 2);
    assert_non_null(strstr(r.err, "bad.jsonl:2"));
    assert_string_equal(r.out, "");
    run_free(&r);
}

static void test_bad_flags_fail_with_a_message(void **state) {
    (void)state;
    static const struct {
        const char *args;
        int status;
        const char *needle;
    } cases[] = {
        {"generate --bogus", 2, "--bogus"},
        {"generate --max-tokens abc", 2, "--max-tokens"},
        {"generate --temperature -1", 2, "--temperature"},
        {"generate --top-p 0", 2, "--top-p"},
        {"generate --max-tokens", 2, "needs a value"},
        {"generate --block-size 7", 2, "--block-size: 7 is not one of"},
        {"generate --device tpu", 2, "tpu"},
        {"generate --blok-size 8", 2, "did you mean '--block-size'"},
        {"generate --max-num-seqs 0", 2, "--max-num-seqs"},
        {"generate --model /nonexistent/model", 1, "/nonexistent/model"},
        {"frobnicate", 2, "frobnicate"},
        {"logits --prompt hi", 2, "--output"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        RunResult r = run(cases[i].args);
        if (r.status != cases[i].status || !strstr(r.err, cases[i].needle))
            print_error("'%s': exit %d, stderr: %s\n", cases[i].args, r.status, r.err);
        assert_int_equal(r.status, cases[i].status);
        assert_non_null(strstr(r.err, cases[i].needle));
        assert_non_null(strstr(r.err, "pagellm"));
        run_free(&r);
    }
}

static void test_config_file_and_flag_override(void **state) {
    (void)state;
    char path[512], args[1024];
    snprintf(path, sizeof path, "%s/config.yaml", tmpdir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("block-size: 8\nnum-gpu-blocks-override: 6\nswap-space: 0\n", f);
    fclose(f);
    /* 6 blocks of 8 tokens = 48 tokens: the budget line shows the file's values */
    snprintf(args, sizeof args,
             "generate --config %s --prompt 'Once upon a time' --max-tokens 16 --temperature 0",
             path);
    RunResult r = run(args);
    assert_int_equal(r.status, 0);
    assert_string_equal(r.out, ", there was a little girl named Lily. She loved to play\n");
    assert_non_null(strstr(r.err, "6 blocks of 8 tokens"));
    run_free(&r);
    snprintf(args, sizeof args, "generate --config %s --block-size 16 --max-tokens 2", path);
    r = run(args);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.err, "6 blocks of 16 tokens"));
    run_free(&r);
    f = fopen(path, "w");
    fputs("block-size: 8\nblok-size: 8\n", f);
    fclose(f);
    snprintf(args, sizeof args, "generate --config %s", path);
    r = run(args);
    assert_int_equal(r.status, 1);
    assert_non_null(strstr(r.err, "config.yaml:2"));
    assert_non_null(strstr(r.err, "blok-size"));
    run_free(&r);
}

static void test_help_describes_every_flag(void **state) {
    (void)state;
    RunResult r = run("--help");
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "generate"));
    run_free(&r);
    r = run("generate --help");
    assert_int_equal(r.status, 0);
    static const char *flags[] = {"--model",      "--prompt",      "--prompt-file",
                                  "--max-tokens", "--temperature", "--top-p",
                                  "--top-k",      "--min-p",       "--seed",
                                  "--device",     "--block-size",  "--repetition-penalty",
                                  "--ignore-eos", "--load-format", "--max-model-len"};
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++)
        assert_non_null(strstr(r.out, flags[i]));
    run_free(&r);
}

static void test_logits_file_has_every_position(void **state) {
    (void)state;
    char args[1024];
    snprintf(args, sizeof args, "logits --token-ids 1,403,407,261,378 --output %s/logits.bin",
             tmpdir);
    RunResult r = run(args);
    assert_int_equal(r.status, 0);
    run_free(&r);
    char path[512], *data;
    size_t len;
    snprintf(path, sizeof path, "%s/logits.bin", tmpdir);
    assert_int_equal(pl_read_file(path, &data, &len), PL_OK);
    assert_int_equal(len, 5 * 512 * sizeof(float));
    /* golden.json: the last position's top logit is token 432 at 17.7994 */
    const float *last = (const float *)data + 4 * 512;
    int best = 0;
    for (int i = 1; i < 512; i++)
        if (last[i] > last[best])
            best = i;
    assert_int_equal(best, 432);
    assert_float_equal(last[432], 17.7994, 1e-3);
    free(data);
}

int main(void) {
    if (access(PAGELLM, X_OK) != 0) {
        fprintf(stderr, "%s is not built\n", PAGELLM);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generate_prints_golden_text),
        cmocka_unit_test(test_generate_quantization_fp8),
        cmocka_unit_test(test_serve_quantization_fp8),
        cmocka_unit_test(test_prompt_file_keeps_input_order),
        cmocka_unit_test(test_bad_prompt_file_line_is_named),
        cmocka_unit_test(test_bad_flags_fail_with_a_message),
        cmocka_unit_test(test_config_file_and_flag_override),
        cmocka_unit_test(test_help_describes_every_flag),
        cmocka_unit_test(test_logits_file_has_every_position),
    };
    return cmocka_run_group_tests_name("cli", tests, setup, teardown);
}
