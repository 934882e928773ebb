/* test_api.c - the OpenAI request layer (server/api.c, server/chat.c).
 *
 * Completions: every accepted form of prompt, defaults, every field read back, and one case
 * per bad input this layer can see (status 400, the right param, a message naming the
 * field, *req left zeroed). Chat: rendering with each built-in template (Jinja sources in
 * server/chat.c) against strings written out by hand from the Hugging Face templates
 * (Llama-2's from the published llama-tokenizer test target): the output of the C renderers
 * they replaced. Role errors, content parts, chat-only fields. Error JSON shape and escaping.
 * Models' own templates: tests/test_chat.c. Run from the repository root. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "api.h"

static const ApiLimits LIM = {
    .max_model_len = 2048, .max_n = 8, .vocab_size = 32000, .max_logprobs = 20};

static Status comp(const char *json, ApiRequest *r, ApiError *e) {
    return api_parse_completion(json, strlen(json), &LIM, r, e);
}

/* The built-in templates by name; NULL: no template. */
#define CHAT_CHATML "chatml"
#define CHAT_LLAMA3 "llama3"
#define CHAT_LLAMA2 "llama2"
#define CHAT_ZEPHYR "zephyr"
#define CHAT_NONE   NULL

/* Template `setting` (a built-in name or a file; NULL: none) with the tokenizer's BOS / EOS
 * texts; the fixed strftime_now clock of tests/data/chat_templates/conversations.json. */
static ApiChatTemplate *template_of(const char *setting, const char *bos, const char *eos) {
    if (!setting)
        return NULL;
    ApiChatTemplateSpec spec = {
        .setting = setting, .bos_token = bos, .eos_token = eos, .now = 1722004205};
    ApiChatTemplate *t = NULL;
    if (api_chat_template_load(&spec, &t) != PL_OK || !t)
        fail_msg("%s: %s", setting, pl_error());
    return t;
}

static Status chat_with(const char *setting, const char *bos, const char *eos, const char *json,
                        ApiRequest *r, ApiError *e) {
    ApiChatTemplate *t = template_of(setting, bos, eos);
    Status s = api_parse_chat(json, strlen(json), &LIM, t, r, e);
    api_chat_template_free(t);
    return s;
}

static Status chat(const char *setting, const char *json, ApiRequest *r, ApiError *e) {
    return chat_with(setting, NULL, NULL, json, r, e);
}

static void assert_zeroed(const ApiRequest *r) {
    static const ApiRequest zero;
    assert_memory_equal(r, &zero, sizeof zero);
}

static void check_error(Status s, const ApiRequest *r, const ApiError *e, const char *json,
                        const char *param, const char *needle) {
    if (getenv("PL_TEST_VERBOSE"))
        fprintf(stderr, "  %-60.60s -> [%s] %s\n", json, e->param, e->message);
    if (s != PL_ERR_INVALID || e->status != 400 || strcmp(e->param, param) != 0 ||
        !strstr(e->message, needle))
        fail_msg("%s: status %d/%d param '%s' (want '%s') message '%s' (want '%s')", json, s,
                 e->status, e->param, param, e->message, needle);
    assert_string_equal(e->type, "invalid_request_error");
    assert_zeroed(r);
}

/* A completions body that must be refused with `param` and a message holding `needle`. */
static void bad(const char *json, const char *param, const char *needle) {
    ApiRequest r;
    ApiError e;
    check_error(comp(json, &r, &e), &r, &e, json, param, needle);
}

static void bad_chat(const char *t, const char *json, const char *param, const char *needle) {
    ApiRequest r;
    ApiError e;
    check_error(chat(t, json, &r, &e), &r, &e, json, param, needle);
}

/* ---- completions: prompt forms ----------------------------------------------------------- */

static void test_prompt_string_and_defaults(void **state) {
    ApiRequest r;
    ApiError e;
    assert_int_equal(comp("{\"prompt\": \"Hello\"}", &r, &e), PL_OK);
    assert_int_equal(r.num_prompts, 1);
    assert_string_equal(r.prompts[0].text, "Hello");
    assert_null(r.prompts[0].ids);
    assert_null(r.model);
    assert_int_equal(r.max_tokens, 16);
    assert_int_equal(r.n, 1);
    assert_int_equal(r.best_of, 1);
    assert_true(r.temperature == 1.0f && r.top_p == 1.0f && r.min_p == 0.0f);
    assert_int_equal(r.top_k, -1);
    assert_true(r.presence_penalty == 0 && r.frequency_penalty == 0);
    assert_true(r.repetition_penalty == 1.0f);
    assert_int_equal(r.has_seed, 0);
    assert_int_equal(r.num_stop, 0);
    assert_int_equal(r.num_stop_token_ids, 0);
    assert_int_equal(r.stream, 0);
    assert_int_equal(r.include_usage, 0);
    assert_int_equal(r.logprobs, -1);
    assert_int_equal(r.echo, 0);
    assert_int_equal(r.ignore_eos, 0);
    assert_int_equal(r.skip_special_tokens, 1);
    assert_null(r.user);
    assert_int_equal(r.is_chat, 0);
    api_request_free(&r);
    assert_zeroed(&r);
    api_request_free(&r); /* twice is fine */
    assert_zeroed(&r);
    api_request_free(NULL);
}

static void test_prompt_forms(void **state) {
    ApiRequest r;
    ApiError e;
    /* empty string: allowed (BOS only once tokenized); UTF-8 and escapes kept */
    assert_int_equal(comp("{\"prompt\": \"\"}", &r, &e), PL_OK);
    assert_int_equal(r.num_prompts, 1);
    assert_string_equal(r.prompts[0].text, "");
    api_request_free(&r);
    assert_int_equal(comp("{\"prompt\": \"h\\u00e9 \xe6\x97\xa5\\n\\\"\"}", &r, &e), PL_OK);
    assert_string_equal(r.prompts[0].text, "h\xc3\xa9 \xe6\x97\xa5\n\"");
    api_request_free(&r);
    /* list of strings, one of them empty */
    assert_int_equal(comp("{\"prompt\": [\"a\", \"\", \"c d\"]}", &r, &e), PL_OK);
    assert_int_equal(r.num_prompts, 3);
    assert_string_equal(r.prompts[0].text, "a");
    assert_string_equal(r.prompts[1].text, "");
    assert_string_equal(r.prompts[2].text, "c d");
    api_request_free(&r);
    /* token ids */
    assert_int_equal(comp("{\"prompt\": [1, 15043, 0, 31999]}", &r, &e), PL_OK);
    assert_int_equal(r.num_prompts, 1);
    assert_null(r.prompts[0].text);
    assert_int_equal(r.prompts[0].num_ids, 4);
    int32_t want[] = {1, 15043, 0, 31999};
    assert_memory_equal(r.prompts[0].ids, want, sizeof want);
    api_request_free(&r);
    /* list of token-id lists */
    assert_int_equal(comp("{\"prompt\": [[1, 2], [3], [4, 5, 6]]}", &r, &e), PL_OK);
    assert_int_equal(r.num_prompts, 3);
    assert_int_equal(r.prompts[0].num_ids, 2);
    assert_int_equal(r.prompts[1].num_ids, 1);
    assert_int_equal(r.prompts[2].num_ids, 3);
    assert_int_equal(r.prompts[1].ids[0], 3);
    assert_int_equal(r.prompts[2].ids[2], 6);
    api_request_free(&r);
    /* a single string in a list */
    assert_int_equal(comp("{\"prompt\": [\"only\"]}", &r, &e), PL_OK);
    assert_int_equal(r.num_prompts, 1);
    assert_string_equal(r.prompts[0].text, "only");
    api_request_free(&r);
}

static void test_all_fields(void **state) {
    ApiRequest r;
    ApiError e;
    const char *json =
        "{\"model\": \"m\", \"prompt\": \"p\", \"max_tokens\": 100, \"n\": 2, \"best_of\": 3,"
        " \"temperature\": 0.5, \"top_p\": 0.9, \"top_k\": 40, \"min_p\": 0.05,"
        " \"presence_penalty\": 0.5, \"frequency_penalty\": -0.5, \"repetition_penalty\": 1.1,"
        " \"seed\": 42, \"stop\": [\"\\n\", \"END\"], \"stop_token_ids\": [2, 7],"
        " \"stream\": true, \"stream_options\": {\"include_usage\": true}, \"logprobs\": 5,"
        " \"echo\": true, \"ignore_eos\": true, \"user\": \"u1\", \"suffix\": null,"
        " \"unknown_field\": {\"x\": [1]}}";
    assert_int_equal(comp(json, &r, &e), PL_ERR_INVALID); /* best_of > n with stream */
    assert_string_equal(e.param, "best_of");
    /* the same without best_of */
    const char *json2 =
        "{\"model\": \"m\", \"prompt\": \"p\", \"max_tokens\": 100, \"n\": 2,"
        " \"temperature\": 0.5, \"top_p\": 0.9, \"top_k\": 40, \"min_p\": 0.05,"
        " \"presence_penalty\": 0.5, \"frequency_penalty\": -0.5, \"repetition_penalty\": 1.1,"
        " \"seed\": 42, \"stop\": [\"\\n\", \"END\"], \"stop_token_ids\": [2, 7],"
        " \"stream\": true, \"stream_options\": {\"include_usage\": true}, \"logprobs\": 5,"
        " \"echo\": true, \"ignore_eos\": true, \"user\": \"u1\", \"suffix\": null,"
        " \"skip_special_tokens\": false, \"unknown_field\": {\"x\": [1]}}";
    assert_int_equal(comp(json2, &r, &e), PL_OK);
    assert_string_equal(r.model, "m");
    assert_int_equal(r.max_tokens, 100);
    assert_int_equal(r.n, 2);
    assert_int_equal(r.best_of, 2);
    assert_float_equal(r.temperature, 0.5, 1e-6);
    assert_float_equal(r.top_p, 0.9, 1e-6);
    assert_int_equal(r.top_k, 40);
    assert_float_equal(r.min_p, 0.05, 1e-6);
    assert_float_equal(r.presence_penalty, 0.5, 1e-6);
    assert_float_equal(r.frequency_penalty, -0.5, 1e-6);
    assert_float_equal(r.repetition_penalty, 1.1, 1e-6);
    assert_int_equal(r.has_seed, 1);
    assert_int_equal(r.seed, 42);
    assert_int_equal(r.num_stop, 2);
    assert_string_equal(r.stop[0], "\n");
    assert_string_equal(r.stop[1], "END");
    assert_int_equal(r.num_stop_token_ids, 2);
    assert_int_equal(r.stop_token_ids[1], 7);
    assert_int_equal(r.stream, 1);
    assert_int_equal(r.include_usage, 1);
    assert_int_equal(r.logprobs, 5);
    assert_int_equal(r.echo, 1);
    assert_int_equal(r.ignore_eos, 1);
    assert_int_equal(r.skip_special_tokens, 0);
    assert_string_equal(r.user, "u1");
    api_request_free(&r);
    /* best_of without stream */
    assert_int_equal(comp("{\"prompt\": \"p\", \"n\": 2, \"best_of\": 5}", &r, &e), PL_OK);
    assert_int_equal(r.n, 2);
    assert_int_equal(r.best_of, 5);
    api_request_free(&r);
}

static void test_nulls_and_edge_values(void **state) {
    ApiRequest r;
    ApiError e;
    /* null means absent */
    assert_int_equal(comp("{\"prompt\": \"p\", \"model\": null, \"max_tokens\": null,"
                          " \"temperature\": null, \"top_p\": null, \"n\": null, \"stop\": null,"
                          " \"seed\": null, \"stream\": null, \"stream_options\": null,"
                          " \"logprobs\": null, \"best_of\": null, \"user\": null}",
                          &r, &e),
                     PL_OK);
    assert_int_equal(r.max_tokens, 16);
    assert_int_equal(r.n, 1);
    assert_int_equal(r.best_of, 1);
    assert_int_equal(r.has_seed, 0);
    assert_int_equal(r.logprobs, -1);
    assert_null(r.model);
    api_request_free(&r);
    /* top_k 0 is off; negative seed wraps; an integral real is an integer; temperature 0 is
     * greedy; top_p 1 and logprobs 0 are allowed; boundaries of the ranges */
    assert_int_equal(comp("{\"prompt\": \"p\", \"top_k\": 0, \"seed\": -1,"
                          " \"temperature\": 0, \"top_p\": 1, \"logprobs\": 0, \"min_p\": 1,"
                          " \"presence_penalty\": -2, \"frequency_penalty\": 2,"
                          " \"max_tokens\": 2047, \"n\": 8, \"best_of\": 8, \"stream\": false}",
                          &r, &e),
                     PL_OK);
    assert_int_equal(r.top_k, -1);
    assert_int_equal(r.has_seed, 1);
    assert_true(r.seed == UINT64_MAX);
    assert_int_equal(r.max_tokens, 2047);
    assert_true(r.temperature == 0.0f);
    assert_int_equal(r.logprobs, 0);
    assert_int_equal(r.n, 8);
    api_request_free(&r);
    assert_int_equal(comp("{\"prompt\": \"p\", \"max_tokens\": 32.0, \"top_k\": -1}", &r, &e),
                     PL_OK);
    assert_int_equal(r.max_tokens, 32);
    assert_int_equal(r.top_k, -1);
    api_request_free(&r);
    /* stream_options with stream; include_usage false */
    assert_int_equal(comp("{\"prompt\": \"p\", \"stream\": true, \"stream_options\": {}}", &r, &e),
                     PL_OK);
    assert_int_equal(r.include_usage, 0);
    api_request_free(&r);
}

static void test_stop(void **state) {
    ApiRequest r;
    ApiError e;
    assert_int_equal(comp("{\"prompt\": \"p\", \"stop\": \"###\"}", &r, &e), PL_OK);
    assert_int_equal(r.num_stop, 1);
    assert_string_equal(r.stop[0], "###");
    api_request_free(&r);
    assert_int_equal(comp("{\"prompt\": \"p\", \"stop\": \"\"}", &r, &e), PL_OK);
    assert_int_equal(r.num_stop, 0);
    api_request_free(&r);
    assert_int_equal(comp("{\"prompt\": \"p\", \"stop\": [\"\", \"x\", \"\"]}", &r, &e), PL_OK);
    assert_int_equal(r.num_stop, 1);
    assert_string_equal(r.stop[0], "x");
    api_request_free(&r);
    /* 16 stops fit (and empty ones do not count); 17 do not */
    char json[512] = "{\"prompt\": \"p\", \"stop\": [\"\"";
    for (int i = 0; i < 16; i++)
        sprintf(json + strlen(json), ", \"s%d\"", i);
    strcat(json, "]}");
    assert_int_equal(comp(json, &r, &e), PL_OK);
    assert_int_equal(r.num_stop, 16);
    assert_string_equal(r.stop[15], "s15");
    api_request_free(&r);
    json[strlen(json) - 2] = 0;
    strcat(json, ", \"s16\"]}");
    bad(json, "stop", "'stop'");
    bad(json, "stop", "16");
}

/* ---- completions: bad input -------------------------------------------------------------- */

static void test_bad_json(void **state) {
    bad("{\"prompt\": \"a\",}", "", "invalid JSON");
    bad("{\"prompt\": \"a\"", "", "line 1");
    bad("{\"prompt\": 'a'}", "", "invalid JSON");
    bad("", "", "invalid JSON");
    bad("{\"prompt\": \"a\"} x", "", "invalid JSON");
    bad("[{\"prompt\": \"a\"}]", "", "must be a JSON object");
    bad("\"prompt\"", "", "must be a JSON object");
    bad("3", "", "must be a JSON object");
    bad("null", "", "must be a JSON object");
    /* invalid UTF-8 (a lone continuation byte, an overlong '/') and an escaped NUL */
    bad("{\"prompt\": \"a\x80\"}", "", "invalid JSON");
    bad("{\"prompt\": \"\xc0\xaf\"}", "", "invalid JSON");
    /* NULL body */
    ApiRequest r;
    ApiError e;
    assert_int_equal(api_parse_completion(NULL, 0, &LIM, &r, &e), PL_ERR_INVALID);
    assert_int_equal(e.status, 400);
}

static void test_bad_prompt(void **state) {
    bad("{}", "prompt", "'prompt' is required");
    bad("{\"prompt\": null}", "prompt", "'prompt' is required");
    bad("{\"prompt\": 5}", "prompt", "'prompt' must be");
    bad("{\"prompt\": true}", "prompt", "'prompt' must be");
    bad("{\"prompt\": {\"text\": \"a\"}}", "prompt", "'prompt' must be");
    bad("{\"prompt\": []}", "prompt", "prompt must not be empty");
    bad("{\"prompt\": [[]]}", "prompt", "prompt must not be empty");
    bad("{\"prompt\": [[1], []]}", "prompt", "prompt must not be empty");
    bad("{\"prompt\": [\"a\", 1]}", "prompt", "mixed");
    bad("{\"prompt\": [1, \"a\"]}", "prompt", "mixed");
    bad("{\"prompt\": [[1], 2]}", "prompt", "mixed");
    bad("{\"prompt\": [[1], [\"a\"]]}", "prompt", "mixed");
    bad("{\"prompt\": [\"a\", [1]]}", "prompt", "mixed");
    bad("{\"prompt\": [null]}", "prompt", "'prompt' must be");
    bad("{\"prompt\": [true, 1]}", "prompt", "'prompt' must be");
    bad("{\"prompt\": [1.5]}", "prompt", "integer token ids");
    bad("{\"prompt\": [32000]}", "prompt", "out of vocabulary");
    bad("{\"prompt\": [1, -1]}", "prompt", "token id -1");
    bad("{\"prompt\": [[1], [2, 99999]]}", "prompt", "token id 99999");
    bad("{\"prompt\": [99999999999999]}", "prompt", "out of vocabulary");
}

static void test_bad_numbers(void **state) {
    bad("{\"prompt\": \"p\", \"max_tokens\": -1}", "max_tokens", "'max_tokens' must be at least 1");
    bad("{\"prompt\": \"p\", \"max_tokens\": 0}", "max_tokens", "'max_tokens' must be at least 1");
    bad("{\"prompt\": \"p\", \"max_tokens\": 2048}", "max_tokens",
        "max_tokens (2048) plus the prompt must not exceed max-model-len (2048)");
    bad("{\"prompt\": \"p\", \"max_tokens\": 1000000000000}", "max_tokens", "max_tokens");
    bad("{\"prompt\": \"p\", \"max_tokens\": \"16\"}", "max_tokens",
        "'max_tokens' must be an integer");
    bad("{\"prompt\": \"p\", \"max_tokens\": true}", "max_tokens",
        "'max_tokens' must be an integer");
    bad("{\"prompt\": \"p\", \"max_tokens\": 1.5}", "max_tokens",
        "'max_tokens' must be an integer");
    bad("{\"prompt\": \"p\", \"temperature\": -0.1}", "temperature",
        "'temperature' must be in [0,");
    bad("{\"prompt\": \"p\", \"temperature\": 101}", "temperature", "'temperature'");
    bad("{\"prompt\": \"p\", \"temperature\": \"1\"}", "temperature",
        "'temperature' must be a number");
    bad("{\"prompt\": \"p\", \"temperature\": true}", "temperature",
        "'temperature' must be a number");
    bad("{\"prompt\": \"p\", \"top_p\": 0}", "top_p", "'top_p' must be in (0, 1]");
    bad("{\"prompt\": \"p\", \"top_p\": 1.01}", "top_p", "'top_p' must be in (0, 1]");
    bad("{\"prompt\": \"p\", \"top_p\": -1}", "top_p", "'top_p'");
    bad("{\"prompt\": \"p\", \"top_k\": -2}", "top_k", "'top_k' must be -1");
    bad("{\"prompt\": \"p\", \"top_k\": 1.5}", "top_k", "'top_k' must be an integer");
    bad("{\"prompt\": \"p\", \"min_p\": 1.5}", "min_p", "'min_p'");
    bad("{\"prompt\": \"p\", \"min_p\": -0.1}", "min_p", "'min_p'");
    bad("{\"prompt\": \"p\", \"n\": 0}", "n", "'n' must be between 1 and 8");
    bad("{\"prompt\": \"p\", \"n\": 9}", "n", "'n' must be between 1 and 8, got 9");
    bad("{\"prompt\": \"p\", \"n\": \"2\"}", "n", "'n' must be an integer");
    bad("{\"prompt\": \"p\", \"n\": 2, \"best_of\": 1}", "best_of", "'best_of' must be");
    bad("{\"prompt\": \"p\", \"best_of\": 9}", "best_of", "'best_of'");
    bad("{\"prompt\": \"p\", \"best_of\": 0}", "best_of", "'best_of'");
    bad("{\"prompt\": \"p\", \"best_of\": 2, \"stream\": true}", "best_of", "stream");
    bad("{\"prompt\": \"p\", \"presence_penalty\": 2.5}", "presence_penalty", "'presence_penalty'");
    bad("{\"prompt\": \"p\", \"frequency_penalty\": -3}", "frequency_penalty",
        "'frequency_penalty'");
    bad("{\"prompt\": \"p\", \"repetition_penalty\": 0}", "repetition_penalty",
        "'repetition_penalty' must be in (0,");
    bad("{\"prompt\": \"p\", \"repetition_penalty\": -1}", "repetition_penalty",
        "'repetition_penalty'");
    bad("{\"prompt\": \"p\", \"seed\": \"x\"}", "seed", "'seed' must be an integer");
    bad("{\"prompt\": \"p\", \"seed\": 1.5}", "seed", "'seed' must be an integer");
    bad("{\"prompt\": \"p\", \"logprobs\": 21}", "logprobs", "'logprobs' must be between 0 and 20");
    bad("{\"prompt\": \"p\", \"logprobs\": -1}", "logprobs", "'logprobs'");
    bad("{\"prompt\": \"p\", \"logprobs\": true}", "logprobs", "'logprobs' must be an integer");
}

static void test_bad_other_types(void **state) {
    bad("{\"prompt\": \"p\", \"model\": 5}", "model", "'model' must be a string");
    bad("{\"prompt\": \"p\", \"user\": [\"u\"]}", "user", "'user' must be a string");
    bad("{\"prompt\": \"p\", \"stop\": 5}", "stop", "'stop' must be a string or a list");
    bad("{\"prompt\": \"p\", \"stop\": [\"a\", 1]}", "stop", "'stop' must be");
    bad("{\"prompt\": \"p\", \"stop\": {}}", "stop", "'stop' must be");
    bad("{\"prompt\": \"p\", \"stop_token_ids\": \"2\"}", "stop_token_ids",
        "'stop_token_ids' must be a list");
    bad("{\"prompt\": \"p\", \"stop_token_ids\": [\"a\"]}", "stop_token_ids", "'stop_token_ids'");
    bad("{\"prompt\": \"p\", \"stop_token_ids\": [32000]}", "stop_token_ids", "out of vocabulary");
    bad("{\"prompt\": \"p\", \"stop_token_ids\": [2, -1]}", "stop_token_ids", "token id -1");
    bad("{\"prompt\": \"p\", \"stream\": \"yes\"}", "stream", "'stream' must be a boolean");
    bad("{\"prompt\": \"p\", \"stream\": 1}", "stream", "'stream' must be a boolean");
    bad("{\"prompt\": \"p\", \"stream_options\": {\"include_usage\": true}}", "stream_options",
        "'stream_options' can only be defined when 'stream' is true");
    bad("{\"prompt\": \"p\", \"stream\": false, \"stream_options\": {}}", "stream_options",
        "'stream_options'");
    bad("{\"prompt\": \"p\", \"stream\": true, \"stream_options\": true}", "stream_options",
        "'stream_options' must be an object");
    bad("{\"prompt\": \"p\", \"stream\": true, \"stream_options\": {\"include_usage\": 1}}",
        "stream_options", "'stream_options.include_usage' must be a boolean");
    bad("{\"prompt\": \"p\", \"echo\": \"x\"}", "echo", "'echo' must be a boolean");
    bad("{\"prompt\": \"p\", \"ignore_eos\": 1}", "ignore_eos", "'ignore_eos' must be a boolean");
    bad("{\"prompt\": \"p\", \"skip_special_tokens\": \"no\"}", "skip_special_tokens",
        "'skip_special_tokens' must be a boolean");
}

/* logit_bias and min_tokens are parsed and range-checked; fields that are defined by OpenAI
 * or vLLM but not implemented are refused by name, unless absent, null or "off". */
static void test_logit_bias_min_tokens_and_unsupported(void **state) {
    (void)state;
    ApiRequest r;
    ApiError e;
    assert_int_equal(
        comp(
            "{\"prompt\": \"x\", \"logit_bias\": {\"7\": -100, \"31999\": 2.5}, \"min_tokens\": 3}",
            &r, &e),
        PL_OK);
    assert_int_equal(r.num_logit_bias, 2);
    assert_int_equal(r.logit_bias_ids[0], 7);
    assert_float_equal(r.logit_bias_values[0], -100, 0);
    assert_int_equal(r.logit_bias_ids[1], 31999);
    assert_float_equal(r.logit_bias_values[1], 2.5, 0);
    assert_int_equal(r.min_tokens, 3);
    api_request_free(&r);
    assert_int_equal(comp("{\"prompt\": \"x\", \"logit_bias\": {}, \"suffix\": null, "
                          "\"response_format\": {\"type\": \"text\"}}",
                          &r, &e),
                     PL_OK);
    assert_int_equal(r.num_logit_bias, 0);
    api_request_free(&r);
    bad("{\"prompt\": \"x\", \"logit_bias\": [1]}", "logit_bias", "must be an object");
    bad("{\"prompt\": \"x\", \"logit_bias\": {\"a\": 1}}", "logit_bias", "token ids");
    bad("{\"prompt\": \"x\", \"logit_bias\": {\"\": 1}}", "logit_bias", "token ids");
    bad("{\"prompt\": \"x\", \"logit_bias\": {\"-1\": 1}}", "logit_bias", "out of vocabulary");
    bad("{\"prompt\": \"x\", \"logit_bias\": {\"32000\": 1}}", "logit_bias", "out of vocabulary");
    bad("{\"prompt\": \"x\", \"logit_bias\": {\"5\": 100.5}}", "logit_bias", "between -100");
    bad("{\"prompt\": \"x\", \"logit_bias\": {\"5\": \"1\"}}", "logit_bias", "numbers");
    bad("{\"prompt\": \"x\", \"min_tokens\": -1}", "min_tokens", "between 0");
    bad("{\"prompt\": \"x\", \"min_tokens\": 1.5}", "min_tokens", "integer");
    bad("{\"prompt\": \"x\", \"max_tokens\": 4, \"min_tokens\": 5}", "min_tokens",
        "must not exceed");
    bad("{\"prompt\": \"x\", \"suffix\": \"end\"}", "suffix", "not supported");
    bad("{\"prompt\": \"x\", \"prompt_logprobs\": 1}", "prompt_logprobs", "not supported");
    /* vLLM's truncate_prompt_tokens: -1 (max-model-len) or 1 to max-model-len, null for none */
    assert_int_equal(comp("{\"prompt\": \"x\", \"truncate_prompt_tokens\": 8}", &r, &e), PL_OK);
    assert_int_equal(r.truncate_prompt_tokens, 8);
    api_request_free(&r);
    assert_int_equal(comp("{\"prompt\": \"x\", \"truncate_prompt_tokens\": -1}", &r, &e), PL_OK);
    assert_int_equal(r.truncate_prompt_tokens, -1);
    api_request_free(&r);
    assert_int_equal(comp("{\"prompt\": \"x\", \"truncate_prompt_tokens\": null}", &r, &e), PL_OK);
    assert_int_equal(r.truncate_prompt_tokens, 0);
    api_request_free(&r);
    bad("{\"prompt\": \"x\", \"truncate_prompt_tokens\": 0}", "truncate_prompt_tokens",
        "at least 1");
    bad("{\"prompt\": \"x\", \"truncate_prompt_tokens\": -2}", "truncate_prompt_tokens",
        "at least 1");
    bad("{\"prompt\": \"x\", \"truncate_prompt_tokens\": 2049}", "truncate_prompt_tokens",
        "more than max-model-len (2048)");
    bad("{\"prompt\": \"x\", \"truncate_prompt_tokens\": 1.5}", "truncate_prompt_tokens",
        "integer");
    assert_int_equal(comp("{\"prompt\": \"x\", \"include_stop_str_in_output\": true}", &r, &e),
                     PL_OK);
    assert_int_equal(r.include_stop_str_in_output, 1);
    api_request_free(&r);
    bad("{\"prompt\": \"x\", \"include_stop_str_in_output\": 1}", "include_stop_str_in_output",
        "must be a boolean");
    /* vLLM's allowed_token_ids and bad_words */
    assert_int_equal(comp("{\"prompt\": \"x\", \"allowed_token_ids\": [5, 31999], "
                          "\"bad_words\": [\"the end\", \" a\"]}",
                          &r, &e),
                     PL_OK);
    assert_int_equal(r.num_allowed_token_ids, 2);
    assert_int_equal(r.allowed_token_ids[1], 31999);
    assert_int_equal(r.num_bad_words, 2);
    assert_string_equal(r.bad_words[0], "the end");
    assert_string_equal(r.bad_words[1], " a");
    api_request_free(&r);
    assert_int_equal(comp("{\"prompt\": \"x\", \"allowed_token_ids\": null, "
                          "\"bad_words\": []}",
                          &r, &e),
                     PL_OK);
    assert_int_equal(r.num_allowed_token_ids, 0);
    assert_int_equal(r.num_bad_words, 0);
    api_request_free(&r);
    bad("{\"prompt\": \"x\", \"allowed_token_ids\": []}", "allowed_token_ids", "non-empty");
    bad("{\"prompt\": \"x\", \"allowed_token_ids\": [32000]}", "allowed_token_ids",
        "out of vocabulary");
    bad("{\"prompt\": \"x\", \"allowed_token_ids\": 5}", "allowed_token_ids", "list");
    bad("{\"prompt\": \"x\", \"bad_words\": \"the\"}", "bad_words", "list of non-empty");
    bad("{\"prompt\": \"x\", \"bad_words\": [\"a\", \"\"]}", "bad_words", "non-empty");
    bad("{\"prompt\": \"x\", \"bad_words\": [1]}", "bad_words", "strings");
    /* structured output: compiled into the request's constraint, or a 400 naming the field */
    assert_int_equal(
        comp("{\"prompt\": \"x\", \"response_format\": {\"type\": \"json_object\"}}", &r, &e),
        PL_OK);
    assert_non_null(r.constraint);
    assert_true(gr_compiled_accepts(r.constraint, "{}", 2));
    assert_false(gr_compiled_accepts(r.constraint, "[]", 2));
    api_request_free(&r);
    assert_int_equal(comp("{\"prompt\": \"x\", \"guided_regex\": \"a+\"}", &r, &e), PL_OK);
    assert_true(gr_compiled_accepts(r.constraint, "aaa", 3));
    assert_false(gr_compiled_accepts(r.constraint, "ab", 2));
    api_request_free(&r);
    bad("{\"prompt\": \"x\", \"guided_json\": {\"type\": \"array\", \"uniqueItems\": true}}",
        "guided_json", "uniqueItems");
    bad("{\"prompt\": \"x\", \"guided_choice\": [\"a\"], \"guided_regex\": \"a\"}", "guided_choice",
        "only one");
    const char *chat_ok = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
                          "\"tool_choice\": \"none\", \"tools\": null, \"logit_bias\": {\"1\": 1}}";
    assert_int_equal(chat(CHAT_CHATML, chat_ok, &r, &e), PL_OK);
    assert_int_equal(r.num_logit_bias, 1);
    api_request_free(&r);
    bad_chat(CHAT_CHATML,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"functions\": "
             "[{\"name\": \"f\"}]}",
             "functions", "not supported");
    bad_chat(CHAT_CHATML,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
             "\"response_format\": {\"type\": \"json_schema\"}}",
             "response_format", "json_schema.schema");
    /* chat's max_tokens defaults to what is left of the context: min_tokens is checked then */
    assert_int_equal(chat(CHAT_CHATML,
                          "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
                          "\"min_tokens\": 100}",
                          &r, &e),
                     PL_OK);
    ApiLimits small = {.max_model_len = 64};
    assert_int_equal(api_check_length(&small, &r, 10, &e), -1);
    assert_string_equal(e.param, "min_tokens");
    small.max_model_len = 200;
    assert_int_equal(api_check_length(&small, &r, 10, &e), 190);
    api_request_free(&r);
}

static void test_unchecked_limits(void **state) {
    ApiLimits none = {0};
    ApiRequest r;
    ApiError e;
    const char *json =
        "{\"prompt\": [100000], \"max_tokens\": 100000, \"n\": 50, \"logprobs\": 99}";
    assert_int_equal(api_parse_completion(json, strlen(json), &none, &r, &e), PL_OK);
    assert_int_equal(r.prompts[0].ids[0], 100000);
    assert_int_equal(r.max_tokens, 100000);
    assert_int_equal(r.n, 50);
    api_request_free(&r);
}

/* ---- length check after tokenizing ------------------------------------------------------- */

static void test_check_length(void **state) {
    ApiRequest r = {.max_tokens = 100};
    ApiError e;
    assert_int_equal(api_check_length(&LIM, &r, 1948, &e), 100); /* exactly fits */
    assert_int_equal(api_check_length(&LIM, &r, 1949, &e), -1);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, "max_tokens");
    assert_string_equal(e.code, "context_length_exceeded");
    assert_non_null(strstr(e.message, "maximum context length is 2048 tokens"));
    assert_non_null(strstr(e.message, "2049 tokens (1949 in the prompt, 100 in max_tokens)"));
    assert_int_equal(api_check_length(&LIM, &r, 2048, &e), -1);
    assert_string_equal(e.param, "prompt");
    assert_non_null(strstr(e.message, "the prompt has 2048 tokens"));
    r.max_tokens = -1; /* chat default: what is left */
    r.is_chat = 1;
    assert_int_equal(api_check_length(&LIM, &r, 48, &e), 2000);
    assert_int_equal(api_check_length(&LIM, &r, 2047, &e), 1);
    assert_int_equal(api_check_length(&LIM, &r, 3000, &e), -1);
    assert_string_equal(e.param, "messages");
    ApiLimits none = {0};
    assert_int_equal(api_check_length(&none, &r, 3000, &e), 16);
}

/* ---- error objects ----------------------------------------------------------------------- */

static json_t *error_object(const ApiError *e) {
    char *s = api_error_json(e);
    json_error_t je;
    json_t *root = json_loads(s, 0, &je);
    if (!root)
        fail_msg("api_error_json gave invalid JSON: %s (%s)", s, je.text);
    free(s);
    assert_int_equal(json_object_size(root), 1);
    json_t *err = json_object_get(root, "error");
    assert_true(json_is_object(err));
    assert_int_equal(json_object_size(err), 4);
    json_incref(err);
    json_decref(root);
    return err;
}

static void test_error_json(void **state) {
    ApiError e;
    api_error_set(&e, 400, NULL, "temperature", "'%s' must be %s", "temperature",
                  "a \"number\"\\\n\t\x01 \xc3\xa9");
    json_t *o = error_object(&e);
    assert_string_equal(json_string_value(json_object_get(o, "message")),
                        "'temperature' must be a \"number\"\\\n\t\x01 \xc3\xa9");
    assert_string_equal(json_string_value(json_object_get(o, "type")), "invalid_request_error");
    assert_string_equal(json_string_value(json_object_get(o, "param")), "temperature");
    assert_true(json_is_null(json_object_get(o, "code")));
    json_decref(o);
    /* the exact text: compact, fixed key order, escapes */
    api_error_set(&e, 404, NULL, NULL, "model \"x\" not found");
    e.code = "model_not_found";
    char *s = api_error_json(&e);
    assert_string_equal(s, "{\"error\":{\"message\":\"model \\\"x\\\" not found\",\"type\":"
                           "\"not_found_error\",\"param\":null,\"code\":\"model_not_found\"}}");
    free(s);
    /* default types */
    api_error_set(&e, 401, NULL, "", "no key");
    assert_string_equal(e.type, "authentication_error");
    api_error_set(&e, 503, NULL, NULL, "loading");
    assert_string_equal(e.type, "server_error");
    api_error_set(&e, 405, "custom_error", NULL, "x");
    assert_string_equal(e.type, "custom_error");
    o = error_object(&e);
    assert_true(json_is_null(json_object_get(o, "param")));
    json_decref(o);
    /* invalid UTF-8 in a message (say, an echoed URL) becomes '?' */
    api_error_set(&e, 404, NULL, NULL, "no route /a\xff\xc3 b");
    o = error_object(&e);
    assert_string_equal(json_string_value(json_object_get(o, "message")), "no route /a?? b");
    json_decref(o);
    /* a long message is cut at a character boundary and stays valid */
    char longmsg[1200] = "";
    for (int i = 0; i < 500; i++)
        strcat(longmsg, "\xc3\xa9");
    api_error_set(&e, 400, NULL, NULL, "%s", longmsg);
    assert_true(strlen(e.message) == sizeof e.message - 2); /* 255 whole 2-byte characters */
    o = error_object(&e);
    assert_int_equal(json_string_length(json_object_get(o, "message")), strlen(e.message));
    json_decref(o);
    /* a parse error serialised */
    ApiRequest r;
    assert_int_equal(comp("{\"prompt\": \"p\", \"n\": 99}", &r, &e), PL_ERR_INVALID);
    o = error_object(&e);
    assert_string_equal(json_string_value(json_object_get(o, "param")), "n");
    assert_non_null(strstr(json_string_value(json_object_get(o, "message")), "'n'"));
    json_decref(o);
}

/* ---- chat rendering ---------------------------------------------------------------------- */

/* The conversation the Hugging Face chat-template tests use. */
#define SYS_MSG                                                                                    \
    "{\"role\": \"system\", \"content\": \"You are a friendly chatbot who always responds in the " \
    "style of a pirate\"}, "
#define CONV                                                                                       \
    "{\"role\": \"user\", \"content\": \"Hello, how are you?\"}, "                                 \
    "{\"role\": \"assistant\", \"content\": \"I'm doing great. How can I help you today?\"}, "     \
    "{\"role\": \"user\", \"content\": \"I'd like to show off how chat templating works!\"}"

static void expect_render(const char *t, const char *messages, const char *bos, const char *eos,
                          const char *want) {
    char json[4096];
    snprintf(json, sizeof json, "{\"messages\": [%s]}", messages);
    ApiRequest r;
    ApiError e;
    Status s = chat_with(t, bos, eos, json, &r, &e);
    if (s != PL_OK)
        fail_msg("%s: %s", json, e.message);
    assert_int_equal(r.is_chat, 1);
    assert_int_equal(r.num_prompts, 1);
    assert_null(r.prompts[0].ids);
    assert_string_equal(r.prompts[0].text, want);
    api_request_free(&r);
}

static void test_render_chatml(void **state) {
    expect_render(CHAT_CHATML, SYS_MSG CONV, NULL, NULL,
                  "<|im_start|>system\nYou are a friendly chatbot who always responds in the "
                  "style of a pirate<|im_end|>\n"
                  "<|im_start|>user\nHello, how are you?<|im_end|>\n"
                  "<|im_start|>assistant\nI'm doing great. How can I help you today?<|im_end|>\n"
                  "<|im_start|>user\nI'd like to show off how chat templating works!<|im_end|>\n"
                  "<|im_start|>assistant\n");
    /* content kept verbatim (no trimming), any role order */
    expect_render(CHAT_CHATML,
                  "{\"role\": \"user\", \"content\": \" a \\n\"}, {\"role\": \"user\", "
                  "\"content\": \"\"}",
                  "<s>", NULL,
                  "<|im_start|>user\n a \n<|im_end|>\n<|im_start|>user\n<|im_end|>\n"
                  "<|im_start|>assistant\n");
}

static void test_render_llama3(void **state) {
    expect_render(CHAT_LLAMA3, SYS_MSG CONV, "<|begin_of_text|>", NULL,
                  "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a "
                  "friendly chatbot who always responds in the style of a pirate<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nHello, how are you?<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\nI'm doing great. How can I "
                  "help you today?<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nI'd like to show off how chat "
                  "templating works!<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n");
    /* content | trim: Python whitespace (incl. U+00A0, U+3000) at both ends, not inside;
     * bos defaults to <|begin_of_text|> */
    expect_render(CHAT_LLAMA3,
                  "{\"role\": \"user\", \"content\": \" \\t\\n\\u00a0Hi \\n there\\u3000\\r\\n\"}",
                  NULL, NULL,
                  "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi \n "
                  "there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
    expect_render(CHAT_LLAMA3, "{\"role\": \"user\", \"content\": \"   \"}", "<BOS>", NULL,
                  "<BOS><|start_header_id|>user<|end_header_id|>\n\n<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

static void test_render_llama2(void **state) {
    /* the target of Hugging Face's hf-internal-testing/llama-tokenizer chat template test */
    expect_render(CHAT_LLAMA2, SYS_MSG CONV, "<s>", "</s>",
                  "<s>[INST] <<SYS>>\nYou are a friendly chatbot who always responds in the style "
                  "of a pirate\n<</SYS>>\n\nHello, how are you? [/INST] I'm doing great. How can I "
                  "help you today? </s><s>[INST] I'd like to show off how chat templating works! "
                  "[/INST]");
    expect_render(CHAT_LLAMA2, CONV, NULL, NULL,
                  "<s>[INST] Hello, how are you? [/INST] I'm doing great. How can I help you "
                  "today? </s><s>[INST] I'd like to show off how chat templating works! [/INST]");
    /* strip() of each turn (of the folded system+user text as a whole), eos at the end of
     * an assistant turn, a final assistant turn rendered as is */
    expect_render(CHAT_LLAMA2,
                  "{\"role\": \"system\", \"content\": \"  S  \"}, "
                  "{\"role\": \"user\", \"content\": \" U \"}, "
                  "{\"role\": \"assistant\", \"content\": \"\\n A \\n\"}",
                  "<s>", "</s>", "<s>[INST] <<SYS>>\n  S  \n<</SYS>>\n\n U [/INST] A </s>");
    expect_render(CHAT_LLAMA2,
                  "{\"role\": \"system\", \"content\": \"\"}, {\"role\": \"user\", \"content\": "
                  "\"q\"}",
                  "<s>", "</s>", "<s>[INST] <<SYS>>\n\n<</SYS>>\n\nq [/INST]");
}

static void test_render_zephyr(void **state) {
    /* TinyLlama-1.1B-Chat's model card prompt */
    expect_render(CHAT_ZEPHYR,
                  "{\"role\": \"system\", \"content\": \"You are a friendly chatbot who always "
                  "responds in the style of a pirate\"}, {\"role\": \"user\", \"content\": \"How "
                  "many helicopters can a human eat in one sitting?\"}",
                  "<s>", "</s>",
                  "<|system|>\nYou are a friendly chatbot who always responds in the style of a "
                  "pirate</s>\n<|user|>\nHow many helicopters can a human eat in one "
                  "sitting?</s>\n<|assistant|>\n");
    expect_render(CHAT_ZEPHYR, CONV, NULL, NULL,
                  "<|user|>\nHello, how are you?</s>\n<|assistant|>\nI'm doing great. How can I "
                  "help you today?</s>\n<|user|>\nI'd like to show off how chat templating "
                  "works!</s>\n<|assistant|>\n");
}

static void test_role_errors(void **state) {
    const char *alt = "Conversation roles must alternate user/assistant/user/assistant/...";
    bad_chat(CHAT_LLAMA2,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"user\", "
             "\"content\": \"b\"}]}",
             "messages", alt);
    bad_chat(CHAT_LLAMA2, "{\"messages\": [{\"role\": \"assistant\", \"content\": \"a\"}]}",
             "messages", alt);
    bad_chat(CHAT_LLAMA2,
             "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": "
             "\"assistant\", \"content\": \"a\"}]}",
             "messages", alt);
    bad_chat(CHAT_LLAMA2,
             "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", "
             "\"content\": \"u\"}, {\"role\": \"system\", \"content\": \"s2\"}]}",
             "messages", alt);
    bad_chat(CHAT_LLAMA2, "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}]}",
             "messages", "user message");
    /* unknown roles, in every family */
    const char *all[] = {CHAT_CHATML, CHAT_LLAMA3, CHAT_LLAMA2, CHAT_ZEPHYR};
    for (int i = 0; i < 4; i++) {
        bad_chat(all[i],
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"tool\", "
                 "\"content\": \"b\"}]}",
                 "messages", "unknown role 'tool' in messages[1]");
        bad_chat(all[i], "{\"messages\": [{\"role\": \"User\", \"content\": \"a\"}]}", "messages",
                 "'User'");
    }
    /* other families do not require alternation */
    expect_render(CHAT_CHATML,
                  "{\"role\": \"assistant\", \"content\": \"a\"}, {\"role\": \"system\", "
                  "\"content\": \"s\"}",
                  NULL, NULL,
                  "<|im_start|>assistant\na<|im_end|>\n<|im_start|>system\ns<|im_end|>\n"
                  "<|im_start|>assistant\n");
}

static void test_messages_errors(void **state) {
    const char *t = CHAT_CHATML;
    bad_chat(t, "{\"prompt\": \"a\"}", "messages", "'messages' is required");
    bad_chat(t, "{\"messages\": null}", "messages", "'messages' is required");
    bad_chat(t, "{\"messages\": \"hi\"}", "messages", "'messages' must be a list");
    bad_chat(t, "{\"messages\": {\"role\": \"user\"}}", "messages", "'messages' must be a list");
    bad_chat(t, "{\"messages\": []}", "messages", "'messages' must not be empty");
    bad_chat(t, "{\"messages\": [\"hi\"]}", "messages", "'messages[0]' must be an object");
    bad_chat(t, "{\"messages\": [{\"content\": \"hi\"}]}", "messages",
             "'messages[0].role' must be a string");
    bad_chat(t, "{\"messages\": [{\"role\": 1, \"content\": \"hi\"}]}", "messages",
             "'messages[0].role'");
    bad_chat(t, "{\"messages\": [{\"role\": \"user\"}]}", "messages",
             "'messages[0].content' must be a string or a list of text parts");
    bad_chat(t, "{\"messages\": [{\"role\": \"user\", \"content\": null}]}", "messages",
             "'messages[0].content'");
    bad_chat(t, "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", "messages",
             "'messages[0].content'");
    bad_chat(t,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"user\", "
             "\"content\": [{\"type\": \"image_url\", \"image_url\": {\"url\": \"x\"}}]}]}",
             "messages", "'messages[1].content[0]': only parts of type 'text'");
    bad_chat(t, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"text\": \"a\"}]}]}",
             "messages", "no type");
    bad_chat(t, "{\"messages\": [{\"role\": \"user\", \"content\": [\"a\"]}]}", "messages",
             "only parts of type 'text'");
    bad_chat(t,
             "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": "
             "3}]}]}",
             "messages", "'messages[0].content[0].text' must be a string");
    bad_chat(t, "[]", "", "must be a JSON object");
    bad_chat(t, "{\"messages\": [", "", "invalid JSON");
    /* no template */
    bad_chat(CHAT_NONE, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}", "",
             "no chat template");
}

static void test_content_parts(void **state) {
    /* parts joined with "\n" (vLLM); an empty list is empty text; name and extra keys
     * ignored; an assistant message without content is empty */
    expect_render(CHAT_CHATML,
                  "{\"role\": \"user\", \"name\": \"bob\", \"content\": [{\"type\": \"text\", "
                  "\"text\": \"one\"}, {\"type\": \"text\", \"text\": \"two\", \"x\": 1}]}, "
                  "{\"role\": \"assistant\"}, {\"role\": \"assistant\", \"content\": null}, "
                  "{\"role\": \"user\", \"content\": []}",
                  NULL, NULL,
                  "<|im_start|>user\none\ntwo<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n"
                  "<|im_start|>assistant\n<|im_end|>\n<|im_start|>user\n<|im_end|>\n"
                  "<|im_start|>assistant\n");
}

static void test_chat_fields(void **state) {
    ApiRequest r;
    ApiError e;
#define MSG "\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]"
    assert_int_equal(chat(CHAT_CHATML, "{" MSG "}", &r, &e), PL_OK);
    assert_int_equal(r.max_tokens, -1);
    assert_int_equal(r.logprobs, -1);
    assert_int_equal(r.n, 1);
    assert_int_equal(r.best_of, 1);
    assert_int_equal(r.is_chat, 1);
    api_request_free(&r);
    assert_int_equal(chat(CHAT_CHATML,
                          "{" MSG ", \"max_tokens\": 10, \"max_completion_tokens\": 20,"
                          " \"logprobs\": true, \"top_logprobs\": 3, \"n\": 3, \"seed\": 7,"
                          " \"temperature\": 0, \"stop\": \"x\", \"stream\": true,"
                          " \"stream_options\": {\"include_usage\": true}, \"model\": \"m\","
                          " \"best_of\": 99, \"echo\": 5}",
                          &r, &e),
                     PL_OK);
    assert_int_equal(r.max_tokens, 20); /* max_completion_tokens wins */
    assert_int_equal(r.logprobs, 3);
    assert_int_equal(r.n, 3);
    assert_int_equal(r.best_of, 3); /* not a chat field: ignored */
    assert_int_equal(r.seed, 7);
    assert_int_equal(r.num_stop, 1);
    assert_int_equal(r.include_usage, 1);
    assert_string_equal(r.model, "m");
    api_request_free(&r);
    assert_int_equal(chat(CHAT_CHATML, "{" MSG ", \"max_tokens\": 10, \"logprobs\": true}", &r, &e),
                     PL_OK);
    assert_int_equal(r.max_tokens, 10);
    assert_int_equal(r.logprobs, 0);
    api_request_free(&r);
    assert_int_equal(
        chat(CHAT_CHATML, "{" MSG ", \"logprobs\": false, \"top_logprobs\": 0}", &r, &e), PL_OK);
    assert_int_equal(r.logprobs, -1);
    api_request_free(&r);
    const char *t = CHAT_CHATML;
    bad_chat(t, "{" MSG ", \"max_tokens\": 0}", "max_tokens", "'max_tokens' must be at least 1");
    bad_chat(t, "{" MSG ", \"max_completion_tokens\": -5}", "max_completion_tokens",
             "'max_completion_tokens'");
    bad_chat(t, "{" MSG ", \"max_completion_tokens\": 4096}", "max_completion_tokens",
             "max-model-len (2048)");
    bad_chat(t, "{" MSG ", \"top_logprobs\": 2}", "top_logprobs", "'logprobs' must be true");
    bad_chat(t, "{" MSG ", \"logprobs\": true, \"top_logprobs\": 21}", "top_logprobs",
             "'top_logprobs' must be between 0 and 20");
    bad_chat(t, "{" MSG ", \"logprobs\": 1}", "logprobs", "'logprobs' must be a boolean");
    bad_chat(t, "{" MSG ", \"stream_options\": {\"include_usage\": true}}", "stream_options",
             "'stream_options'");
    bad_chat(t, "{" MSG ", \"temperature\": -1}", "temperature", "'temperature'");
    bad_chat(t, "{" MSG ", \"n\": 9}", "n", "'n'");
    bad_chat(t, "{" MSG ", \"top_p\": 0}", "top_p", "'top_p'");
    bad_chat(t, "{" MSG ", \"stop_token_ids\": [40000]}", "stop_token_ids", "out of vocabulary");
#undef MSG
}

/* NUL characters (JSON's \u0000) are text like any other: prompts, message contents and stop
 * strings keep them and carry their length; names refuse them. */
static void test_nul_characters(void **state) {
    (void)state;
    ApiRequest r;
    ApiError e;
    const char *body = "{\"prompt\": [\"a\\u0000b\", \"\\u0000\"], \"stop\": \"x\\u0000\", "
                       "\"user\": \"u\\u0000v\"}";
    assert_int_equal(comp(body, &r, &e), PL_OK);
    assert_int_equal(r.prompts[0].text_len, 3);
    assert_memory_equal(r.prompts[0].text, "a\0b", 4);
    assert_int_equal(r.prompts[1].text_len, 1);
    assert_int_equal(r.prompts[1].text[0], 0);
    assert_int_equal(r.stop_len[0], 2);
    assert_memory_equal(r.stop[0], "x\0", 3);
    api_request_free(&r);
    body = "{\"messages\": [{\"role\": \"user\", \"content\": \"a\\u0000b\"}, {\"role\": "
           "\"user\", \"content\": [{\"type\": \"text\", \"text\": \"\\u0000\"}]}]}";
    assert_int_equal(chat(CHAT_CHATML, body, &r, &e), PL_OK);
    static const char want[] = "<|im_start|>user\na\0b<|im_end|>\n<|im_start|>user\n\0<|im_end|>\n"
                               "<|im_start|>assistant\n";
    assert_int_equal(r.prompts[0].text_len, sizeof want - 1);
    assert_memory_equal(r.prompts[0].text, want, sizeof want);
    api_request_free(&r);
    assert_int_equal(chat(CHAT_LLAMA3,
                          "{\"messages\": [{\"role\": \"user\", \"content\": \" a\\u0000 \"}]}", &r,
                          &e),
                     PL_OK);
    static const char llama3[] = "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\na\0"
                                 "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";
    assert_int_equal(r.prompts[0].text_len, sizeof llama3 - 1);
    assert_memory_equal(r.prompts[0].text, llama3, sizeof llama3);
    api_request_free(&r);
    bad("{\"prompt\": \"a\", \"model\": \"m\\u0000\"}", "model", "u0000");
    bad_chat(CHAT_CHATML, "{\"messages\": [{\"role\": \"user\\u0000x\", \"content\": \"a\"}]}",
             "messages", "role");
}

/* ---- tools, tool_choice, chat_template ------------------------------------------------- */

#define MSGS  "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
#define TOOL1 "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
#define TOOLS                                                                                      \
    "\"tools\": [" TOOL1 "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": "      \
    "{\"type\": \"string\"}}, \"required\": [\"city\"], \"additionalProperties\": false}}}, "      \
    "{\"type\": \"function\", \"function\": {\"name\": \"now\"}}]"

static Status chat_lim(const ApiLimits *lim, const char *json, ApiRequest *r, ApiError *e) {
    ApiChatTemplate *t = template_of(CHAT_CHATML, NULL, NULL);
    Status s = api_parse_chat(json, strlen(json), lim, t, r, e);
    api_chat_template_free(t);
    return s;
}

static void test_tool_fields(void **state) {
    static const struct {
        const char *json, *param, *needle;
    } refused[] = {
        {MSGS "\"tools\": {}}", "tools", "'tools' must be a list"},
        {MSGS "\"tools\": [7]}", "tools", "'tools[0]' must be an object"},
        {MSGS "\"tools\": [{\"type\": \"fn\", \"function\": {\"name\": \"f\"}}]}", "tools",
         "'tools[0].type' must be \"function\""},
        {MSGS "\"tools\": [{\"type\": \"function\"}]}", "tools", "'tools[0].function' must be"},
        {MSGS "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a b\"}}]}", "tools",
         "'tools[0].function.name' must be"},
        {MSGS "\"tools\": [" TOOL1 "\"parameters\": [1]}}], \"tool_choice\": \"none\"}", "tools",
         "'tools[0].function.parameters' must be a JSON schema"},
        {MSGS "\"tools\": [" TOOL1 "\"description\": 3}}], \"tool_choice\": \"none\"}", "tools",
         "'tools[0].function.description' must be a string"},
        {MSGS TOOLS "}", "tool_choice", "--enable-auto-tool-choice"},
        {MSGS TOOLS ", \"tool_choice\": \"auto\"}", "tool_choice", "--tool-call-parser"},
        {MSGS TOOLS ", \"tool_choice\": \"any\"}", "tool_choice", "must be \"none\", \"auto\""},
        {MSGS TOOLS ", \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": "
                    "\"get_time\"}}}",
         "tool_choice", "'get_time', which is not in 'tools'"},
        {MSGS TOOLS ", \"tool_choice\": {\"function\": \"now\"}}", "tool_choice",
         "as an object must be"},
        {MSGS "\"tool_choice\": \"required\"}", "tool_choice", "needs 'tools'"},
        {MSGS TOOLS ", \"tool_choice\": \"required\", \"parallel_tool_calls\": 1}",
         "parallel_tool_calls", "must be a boolean"},
        {MSGS TOOLS ", \"tool_choice\": \"required\", \"response_format\": {\"type\": "
                    "\"json_object\"}}",
         "tool_choice", "cannot be combined with response_format"},
        {MSGS "\"tools\": [" TOOL1 "\"parameters\": {\"type\": \"object\", \"properties\": "
              "{\"n\": {\"type\": \"number\", \"multipleOf\": 3}}}}}], \"tool_choice\": "
              "\"required\"}",
         "tools", "'tools[0].function.parameters': unsupported JSON schema keyword(s): multipleOf"},
        {MSGS "\"chat_template\": 5}", "chat_template", "must be a string"},
        {MSGS "\"chat_template\": \"hi\\n{% if %}\"}", "chat_template", "chat_template: line 2"},
    };
    ApiRequest r;
    ApiError e;
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        Status s = chat(CHAT_CHATML, refused[i].json, &r, &e);
        check_error(s, &r, &e, refused[i].json, refused[i].param, refused[i].needle);
    }
}

/* What each tool_choice makes of the request: how the output is read, and the constraint. */
static void test_tool_choice(void **state) {
    ApiRequest r;
    ApiError e;
    assert_int_equal(chat(CHAT_CHATML, MSGS TOOLS ", \"tool_choice\": \"none\"}", &r, &e), PL_OK);
    assert_int_equal(r.tool_format, API_TOOLS_OFF);
    assert_null(r.constraint);
    api_request_free(&r);
    ApiLimits lim = LIM;
    lim.tool_call_parser = "hermes";
    lim.enable_auto_tool_choice = 1;
    assert_int_equal(chat_lim(&lim, MSGS TOOLS "}", &r, &e), PL_OK); /* auto by default */
    assert_int_equal(r.tool_format, API_TOOLS_HERMES);
    assert_null(r.constraint);
    api_request_free(&r);

    /* required without a parser: a JSON list of calls whose arguments follow the schemas */
    assert_int_equal(chat(CHAT_CHATML, MSGS TOOLS ", \"tool_choice\": \"required\"}", &r, &e),
                     PL_OK);
    assert_int_equal(r.tool_format, API_TOOLS_JSON_LIST);
    assert_non_null(r.constraint);
    static const char *const ok[] = {
        "[{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}]",
        "[{\"name\": \"now\", \"parameters\": {}}, {\"name\": \"get_weather\", "
        "\"parameters\": {\"city\": \"x\"}}]"};
    static const char *const no[] = {
        "[]", "[{\"name\": \"get_weather\", \"parameters\": {}}]", /* city is required */
        "[{\"name\": \"other\", \"parameters\": {}}]", "{\"name\": \"now\", \"parameters\": {}}"};
    for (size_t i = 0; i < 2; i++)
        assert_true(gr_compiled_accepts(r.constraint, ok[i], strlen(ok[i])));
    for (size_t i = 0; i < 4; i++)
        assert_false(gr_compiled_accepts(r.constraint, no[i], strlen(no[i])));
    api_request_free(&r);

    /* named, in hermes' format: that function only, one call */
    assert_int_equal(chat_lim(&lim,
                              MSGS TOOLS ", \"tool_choice\": {\"type\": \"function\", "
                                         "\"function\": {\"name\": \"get_weather\"}}}",
                              &r, &e),
                     PL_OK);
    const char *call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                       "\"Paris\"}}\n</tool_call>";
    assert_true(gr_compiled_accepts(r.constraint, call, strlen(call)));
    const char *two = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                      "\"a\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", "
                      "\"arguments\": {\"city\": \"b\"}}\n</tool_call>";
    assert_false(gr_compiled_accepts(r.constraint, two, strlen(two)));
    api_request_free(&r);

    /* required with llama3_json and mistral: their formats */
    lim.tool_call_parser = "llama3_json";
    assert_int_equal(chat_lim(&lim, MSGS TOOLS ", \"tool_choice\": \"required\"}", &r, &e), PL_OK);
    const char *ll = "{\"name\": \"now\", \"parameters\": {}}; {\"name\": \"now\", "
                     "\"parameters\": {}}";
    assert_true(gr_compiled_accepts(r.constraint, ll, strlen(ll)));
    api_request_free(&r);
    lim.tool_call_parser = "mistral";
    assert_int_equal(chat_lim(&lim,
                              MSGS TOOLS ", \"tool_choice\": \"required\", "
                                         "\"parallel_tool_calls\": false}",
                              &r, &e),
                     PL_OK);
    const char *mi = "[TOOL_CALLS][{\"name\": \"now\", \"arguments\": {}}]";
    assert_true(gr_compiled_accepts(r.constraint, mi, strlen(mi)));
    assert_int_equal(r.skip_special_tokens, 0); /* [TOOL_CALLS] may be a special token */
    const char *mi2 = "[TOOL_CALLS][{\"name\": \"now\", \"arguments\": {}}, {\"name\": "
                      "\"now\", \"arguments\": {}}]";
    assert_false(gr_compiled_accepts(r.constraint, mi2, strlen(mi2))); /* not parallel */
    api_request_free(&r);
}

/* A request's own chat_template, and the reasoning fields. */
static void test_request_template_and_reasoning(void **state) {
    ApiRequest r;
    ApiError e;
    const char *body = MSGS "\"chat_template\": \"{% for m in messages %}<{{ m.role }}>{{ "
                            "m.content }}{% endfor %}<think>\\n\"}";
    ApiLimits lim = LIM;
    lim.reasoning_parser = "qwen3";
    assert_int_equal(api_parse_chat(body, strlen(body), &lim, NULL, &r, &e), PL_OK);
    assert_string_equal(r.prompts[0].text, "<user>hi<think>"); /* jinja2 drops a final newline */
    assert_int_equal(r.reasoning, API_REASONING_QWEN3);
    assert_int_equal(r.in_reasoning, 1); /* the prompt opened the think block */
    api_request_free(&r);
    lim.reasoning_parser = "deepseek_r1";
    assert_int_equal(chat_lim(&lim, MSGS "\"seed\": 1}", &r, &e), PL_OK);
    assert_int_equal(r.in_reasoning, 1);
    api_request_free(&r);
    assert_null(r.constraint_after);
    api_request_free(&r);
    /* constrained: the pattern applies after the reasoning (vLLM's reasoning-aware structured
     * output), which the output starts in */
    assert_int_equal(chat_lim(&lim, MSGS "\"guided_regex\": \"a+\"}", &r, &e), PL_OK);
    assert_int_equal(r.in_reasoning, 1);
    assert_string_equal(r.constraint_after, "</think>");
    assert_null(r.constraint_opener);
    api_request_free(&r);
    lim.reasoning_parser = "qwen3"; /* no think block open: the output may open one */
    assert_int_equal(chat_lim(&lim, MSGS "\"guided_regex\": \"a+\"}", &r, &e), PL_OK);
    assert_int_equal(r.in_reasoning, 0);
    assert_string_equal(r.constraint_after, "</think>");
    assert_string_equal(r.constraint_opener, "<think>");
    api_request_free(&r);
    /* a prompt that closed its think block (enable_thinking false): content, constrained at once */
    const char *closed = MSGS "\"guided_regex\": \"a+\", \"chat_template\": \"<think>x</think>"
                              "{% for m in messages %}<{{ m.role }}>{% endfor %}<think>\\n\\n"
                              "</think>\\n\\n\"}";
    assert_int_equal(chat_lim(&lim, closed, &r, &e), PL_OK);
    assert_int_equal(r.in_reasoning, 0);
    assert_null(r.constraint_after);
    api_request_free(&r);
    lim.reasoning_parser = NULL; /* no reasoning parser: constrained from the first token */
    assert_int_equal(chat_lim(&lim, MSGS "\"guided_regex\": \"a+\"}", &r, &e), PL_OK);
    assert_null(r.constraint_after);
    api_request_free(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prompt_string_and_defaults),
        cmocka_unit_test(test_prompt_forms),
        cmocka_unit_test(test_all_fields),
        cmocka_unit_test(test_nulls_and_edge_values),
        cmocka_unit_test(test_stop),
        cmocka_unit_test(test_bad_json),
        cmocka_unit_test(test_bad_prompt),
        cmocka_unit_test(test_bad_numbers),
        cmocka_unit_test(test_bad_other_types),
        cmocka_unit_test(test_logit_bias_min_tokens_and_unsupported),
        cmocka_unit_test(test_unchecked_limits),
        cmocka_unit_test(test_check_length),
        cmocka_unit_test(test_error_json),
        cmocka_unit_test(test_render_chatml),
        cmocka_unit_test(test_render_llama3),
        cmocka_unit_test(test_render_llama2),
        cmocka_unit_test(test_render_zephyr),
        cmocka_unit_test(test_role_errors),
        cmocka_unit_test(test_messages_errors),
        cmocka_unit_test(test_content_parts),
        cmocka_unit_test(test_chat_fields),
        cmocka_unit_test(test_tool_fields),
        cmocka_unit_test(test_tool_choice),
        cmocka_unit_test(test_request_template_and_reasoning),
        cmocka_unit_test(test_nul_characters),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
