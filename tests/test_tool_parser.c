/* test_tool_parser.c - server/tool_parser.c: a chat answer split into reasoning, tool calls
 * and content, for each of vLLM's formats (hermes, llama3_json, mistral in both forms, the
 * JSON list of tool_choice required) and reasoning parsers (deepseek_r1, qwen3): the whole
 * text at once, and the same text fed one byte at a time as a stream, which must give the
 * same calls (argument fragments concatenated), reasoning and content, never show a marker,
 * and send a call's name before its arguments end. Malformed calls fall back to content. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"

/* What a stream of deltas added up to. */
typedef struct {
    ApiChatOutput out;
    char *reasoning, *content; /* concatenated, "" when none */
    int num_args_deltas;
    int fed;             /* bytes fed so far */
    int first_args_at;   /* bytes fed when the first ARGS delta came, -1 none */
    int call_before_end; /* every CALL came before the output ended */
} Streamed;

static void cat(char **s, const char *t, size_t n) {
    size_t k = *s ? strlen(*s) : 0;
    *s = realloc(*s, k + n + 1);
    memcpy(*s + k, t, n);
    (*s)[k + n] = 0;
}

static void on_delta(void *ctx, const ApiDelta *d) {
    Streamed *st = ctx;
    ApiChatOutput *o = &st->out;
    switch (d->kind) {
        case API_DELTA_REASONING:
            cat(&st->reasoning, d->text, d->len);
            break;
        case API_DELTA_CONTENT:
            cat(&st->content, d->text, d->len);
            break;
        case API_DELTA_CALL:
            assert_int_equal(d->index, o->num_calls); /* in order, from 0 */
            if (strlen(d->id) != 9)                   /* mistral's ids: 9 letters and digits */
                assert_int_equal(strncmp(d->id, "call_", 5), 0);
            assert_int_equal(strlen(d->id), strlen(d->id) == 9 ? 9 : 29);
            o->calls = realloc(o->calls, (size_t)(o->num_calls + 1) * sizeof *o->calls);
            o->calls[o->num_calls].name = strdup(d->name);
            o->calls[o->num_calls].arguments = strdup("");
            o->num_calls++;
            break;
        case API_DELTA_ARGS: {
            assert_int_equal(d->index, o->num_calls - 1); /* the call started already */
            char *a = o->calls[d->index].arguments;
            cat(&a, d->text, d->len);
            o->calls[d->index].arguments = a;
            st->num_args_deltas++;
            if (st->first_args_at < 0)
                st->first_args_at = st->fed;
        }
    }
}

/* Feed `text` one byte at a time (then the final flush). */
static Streamed stream(ApiToolFormat f, ApiReasoning r, int in_r, const char *text) {
    Streamed st = {.first_args_at = -1};
    st.reasoning = strdup("");
    st.content = strdup("");
    ApiOutputParser *p = api_output_parser_new(f, r, in_r);
    size_t n = strlen(text);
    for (size_t i = 0; i < n; i++) {
        st.fed = (int)i + 1;
        api_output_parser_feed(p, text + i, 1, 0, on_delta, &st);
    }
    api_output_parser_feed(p, "", 0, 1, on_delta, &st);
    assert_int_equal(api_output_parser_calls(p), st.out.num_calls);
    api_output_parser_free(p);
    return st;
}

static void streamed_free(Streamed *st) {
    free(st->reasoning);
    free(st->content);
    api_chat_output_free(&st->out);
}

static const char *or_empty(const char *s) {
    return s ? s : "";
}

/* The whole parse of `text`, checked against the byte-by-byte stream of it. */
static ApiChatOutput parse(ApiToolFormat f, ApiReasoning r, int in_r, const char *text) {
    ApiChatOutput o;
    api_parse_chat_output(f, r, in_r, text, strlen(text), &o);
    Streamed st = stream(f, r, in_r, text);
    assert_null(strstr(st.reasoning, "think>"));
    assert_string_equal(st.reasoning, or_empty(o.reasoning));
    if (o.num_calls == 0 && st.out.num_calls > 0) { /* malformed: the stream had begun a call */
        assert_non_null(o.content);
        streamed_free(&st);
        return o;
    }
    if (o.content) /* else only whitespace went out around the calls */
        assert_string_equal(st.content, o.content);
    else
        assert_int_equal(strspn(st.content, " \n"), strlen(st.content));
    if (o.num_calls > 0)
        assert_null(strstr(st.content, "tool_call"));
    assert_int_equal(st.out.num_calls, o.num_calls);
    for (int i = 0; i < o.num_calls; i++) {
        assert_string_equal(st.out.calls[i].name, o.calls[i].name);
        assert_string_equal(st.out.calls[i].arguments, o.calls[i].arguments);
        json_t *v = json_loads(o.calls[i].arguments, JSON_DECODE_ANY, NULL);
        assert_non_null(v); /* arguments are JSON */
        json_decref(v);
        assert_int_equal(strlen(o.calls[i].id), f == API_TOOLS_MISTRAL ? 9 : 29);
    }
    streamed_free(&st);
    return o;
}

static void expect_call(const ApiChatOutput *o, int i, const char *name, const char *args) {
    assert_true(i < o->num_calls);
    assert_string_equal(o->calls[i].name, name);
    assert_string_equal(o->calls[i].arguments, args);
}

static void test_hermes(void **state) {
    (void)state;
    ApiChatOutput o = parse(API_TOOLS_HERMES, 0, 0,
                            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                            "\"Paris\", \"unit\": \"c\"}}\n</tool_call>");
    assert_int_equal(o.num_calls, 1);
    expect_call(&o, 0, "get_weather", "{\"city\": \"Paris\", \"unit\": \"c\"}");
    assert_null(o.content);
    api_chat_output_free(&o);

    /* text before, two calls, arguments before the name, a brace inside a string */
    o = parse(API_TOOLS_HERMES, 0, 0,
              "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n"
              "</tool_call>\n<tool_call>\n{\"arguments\": {\"y\": [1, {\"z\": \"}\\\"\"}]}, "
              "\"name\": \"b\"}\n</tool_call>\n");
    assert_int_equal(o.num_calls, 2);
    expect_call(&o, 0, "a", "{\"x\": 1}");
    expect_call(&o, 1, "b", "{\"y\": [1, {\"z\": \"}\\\"\"}]}");
    assert_string_equal(o.content, "Let me check.\n");
    api_chat_output_free(&o);

    /* left open at the end (vLLM accepts it); text after the calls is content */
    o = parse(API_TOOLS_HERMES, 0, 0,
              "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call> and done");
    assert_int_equal(o.num_calls, 1);
    assert_string_equal(o.content, " and done");
    api_chat_output_free(&o);
    o = parse(API_TOOLS_HERMES, 0, 0, "<tool_call>{\"name\":\"a\",\"arguments\":{\"k\":true}}");
    expect_call(&o, 0, "a", "{\"k\":true}");
    api_chat_output_free(&o);

    /* no arguments: {} */
    o = parse(API_TOOLS_HERMES, 0, 0, "<tool_call>{\"name\": \"now\"}</tool_call>");
    expect_call(&o, 0, "now", "{}");
    api_chat_output_free(&o);

    /* plain text, a partial marker at the end included */
    o = parse(API_TOOLS_HERMES, 0, 0, "Hello <b>world</b> <tool_c");
    assert_int_equal(o.num_calls, 0);
    assert_string_equal(o.content, "Hello <b>world</b> <tool_c");
    api_chat_output_free(&o);
}

static void test_hermes_malformed(void **state) {
    (void)state;
    static const char *const bad[] = {
        "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": }}\n</tool_call>",
        "<tool_call>\n{\"arguments\": {}}\n</tool_call>",              /* no name */
        "<tool_call>\n{\"name\": 7, \"arguments\": {}}\n</tool_call>", /* not a string */
        "<tool_call>\nget_weather(city=Paris)\n</tool_call>",
        "<tool_call>{\"name\": \"a\", \"arguments\": {\"x\": 1}", /* cut off */
        "ok <tool_call>{\"name\": \"a\"} junk </tool_call>",
        "<tool_call>{\"name\": \"a\", \"arguments\": {}} {\"name\": \"b\"}</tool_call>",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ApiChatOutput o = parse(API_TOOLS_HERMES, 0, 0, bad[i]);
        assert_int_equal(o.num_calls, 0);
        assert_non_null(o.content);
        assert_string_equal(o.content, bad[i]); /* the whole text, as vLLM falls back */
        api_chat_output_free(&o);
    }
}

static void test_llama3_json(void **state) {
    (void)state;
    ApiChatOutput o = parse(API_TOOLS_LLAMA3_JSON, 0, 0,
                            "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"a\": 1}}; "
                            "{\"name\": \"g\", \"parameters\": {\"b\": [\"x;y\"]}}");
    assert_int_equal(o.num_calls, 2);
    expect_call(&o, 0, "f", "{\"a\": 1}");
    expect_call(&o, 1, "g", "{\"b\": [\"x;y\"]}");
    assert_null(o.content);
    api_chat_output_free(&o);

    o = parse(API_TOOLS_LLAMA3_JSON, 0, 0,
              "  {\"name\": \"search\", \"parameters\": {\"query\": \"llamas\"}}");
    expect_call(&o, 0, "search", "{\"query\": \"llamas\"}");
    api_chat_output_free(&o);

    static const char *const plain[] = {"Sure, here it is.", "<b>bold</b>", "<|python", ""};
    for (size_t i = 0; i < sizeof plain / sizeof *plain; i++) {
        o = parse(API_TOOLS_LLAMA3_JSON, 0, 0, plain[i]);
        assert_int_equal(o.num_calls, 0);
        if (plain[i][0])
            assert_string_equal(o.content, plain[i]);
        else
            assert_null(o.content);
        api_chat_output_free(&o);
    }
    o = parse(API_TOOLS_LLAMA3_JSON, 0, 0, "{\"name\": \"f\", \"parameters\": {}} and more");
    assert_int_equal(o.num_calls, 0); /* not ';' after the object: not calls */
    api_chat_output_free(&o);
}

static void test_mistral(void **state) {
    (void)state;
    ApiChatOutput o = parse(API_TOOLS_MISTRAL, 0, 0,
                            "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": \"b\"}}, "
                            "{\"name\": \"g\", \"arguments\": {}}]");
    assert_int_equal(o.num_calls, 2);
    expect_call(&o, 0, "f", "{\"a\": \"b\"}");
    expect_call(&o, 1, "g", "{}");
    assert_null(o.content);
    api_chat_output_free(&o);

    o = parse(API_TOOLS_MISTRAL, 0, 0,
              "Checking. [TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]"
              "get_time[ARGS]{}");
    assert_int_equal(o.num_calls, 2);
    expect_call(&o, 0, "get_weather", "{\"city\": \"Paris\"}");
    expect_call(&o, 1, "get_time", "{}");
    assert_string_equal(o.content, "Checking. ");
    api_chat_output_free(&o);

    static const char *const bad[] = {"[TOOL_CALLS]bad name[ARGS]{}", "[TOOL_CALLS]f[ARGS]{\"a\":",
                                      "[TOOL_CALLS][{\"name\": \"f\"} {\"name\": \"g\"}]",
                                      "[TOOL_CALLS]"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        o = parse(API_TOOLS_MISTRAL, 0, 0, bad[i]);
        assert_int_equal(o.num_calls, 0);
        assert_string_equal(o.content, bad[i]);
        api_chat_output_free(&o);
    }
}

static void test_json_list(void **state) {
    (void)state;
    ApiChatOutput o =
        parse(API_TOOLS_JSON_LIST, 0, 0,
              "[{\"name\": \"f\", \"parameters\": {\"q\": \"x\"}},\n {\"name\": \"g\", "
              "\"parameters\": {\"n\": -1.5e3}}]");
    assert_int_equal(o.num_calls, 2);
    expect_call(&o, 0, "f", "{\"q\": \"x\"}");
    expect_call(&o, 1, "g", "{\"n\": -1.5e3}");
    assert_null(o.content);
    api_chat_output_free(&o);
}

static void test_reasoning(void **state) {
    (void)state;
    ApiChatOutput o =
        parse(0, API_REASONING_DEEPSEEK_R1, 1, "Let me think.\n</think>\n\nThe answer is 4.");
    assert_string_equal(o.reasoning, "Let me think.\n");
    assert_string_equal(o.content, "\n\nThe answer is 4.");
    api_chat_output_free(&o);
    o = parse(0, API_REASONING_DEEPSEEK_R1, 1, "<think>Hmm.</think>Four.");
    assert_string_equal(o.reasoning, "Hmm.");
    assert_string_equal(o.content, "Four.");
    api_chat_output_free(&o);
    o = parse(0, API_REASONING_DEEPSEEK_R1, 1, "Still thinking </thi"); /* cut off: all reasoning */
    assert_string_equal(o.reasoning, "Still thinking </thi");
    assert_null(o.content);
    api_chat_output_free(&o);

    o = parse(0, API_REASONING_DEEPSEEK_R1, 0, "{\"a\": 1}"); /* constrained: starts outside */
    assert_null(o.reasoning);
    assert_string_equal(o.content, "{\"a\": 1}");
    api_chat_output_free(&o);

    o = parse(0, API_REASONING_QWEN3, 0, "<think>\nhmm < 3\n</think>\n\nHi");
    assert_string_equal(o.reasoning, "\nhmm < 3\n");
    assert_string_equal(o.content, "\n\nHi");
    api_chat_output_free(&o);
    o = parse(0, API_REASONING_QWEN3, 0, "Hi there </think>"); /* enable_thinking false */
    assert_null(o.reasoning);
    assert_string_equal(o.content, "Hi there </think>");
    api_chat_output_free(&o);
    o = parse(0, API_REASONING_QWEN3, 1, "hmm</think>ok"); /* the prompt opened <think> */
    assert_string_equal(o.reasoning, "hmm");
    assert_string_equal(o.content, "ok");
    api_chat_output_free(&o);
    o = parse(0, API_REASONING_QWEN3, 0, "<thin");
    assert_null(o.reasoning);
    assert_string_equal(o.content, "<thin");
    api_chat_output_free(&o);
}

static void test_reasoning_then_tools(void **state) {
    (void)state;
    ApiChatOutput o =
        parse(API_TOOLS_HERMES, API_REASONING_QWEN3, 0,
              "<think>I should call f. <tool_call> is how.</think>\n\n<tool_call>\n{\"name\": "
              "\"f\", \"arguments\": {\"a\": 1}}\n</tool_call>");
    assert_string_equal(o.reasoning, "I should call f. <tool_call> is how.");
    assert_int_equal(o.num_calls, 1);
    expect_call(&o, 0, "f", "{\"a\": 1}");
    assert_null(o.content); /* only whitespace around the calls */
    api_chat_output_free(&o);
}

/* Streaming hands the name out as soon as it is known and the arguments in pieces. */
static void test_stream_increments(void **state) {
    (void)state;
    const char *text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                       "\"Paris\", \"days\": 3}}\n</tool_call>";
    Streamed st = stream(API_TOOLS_HERMES, 0, 0, text);
    assert_int_equal(st.out.num_calls, 1);
    assert_true(st.num_args_deltas > 10);
    assert_true(st.first_args_at < (int)(strstr(text, "Paris") - text)); /* before its end */
    assert_string_equal(st.content, "");
    streamed_free(&st);
    /* the content before a call streams before the call is complete */
    st = stream(API_TOOLS_MISTRAL, 0, 0, "Sure.[TOOL_CALLS]f[ARGS]{\"a\": [1, 2, 3]}");
    assert_string_equal(st.content, "Sure.");
    assert_string_equal(st.out.calls[0].arguments, "{\"a\": [1, 2, 3]}");
    assert_true(st.num_args_deltas > 5);
    streamed_free(&st);
}

static void test_names(void **state) {
    (void)state;
    assert_int_equal(api_tool_format("hermes"), API_TOOLS_HERMES);
    assert_int_equal(api_tool_format("llama3_json"), API_TOOLS_LLAMA3_JSON);
    assert_int_equal(api_tool_format("mistral"), API_TOOLS_MISTRAL);
    assert_int_equal(api_tool_format(NULL), API_TOOLS_OFF);
    assert_int_equal(api_reasoning_parser("deepseek_r1"), API_REASONING_DEEPSEEK_R1);
    assert_int_equal(api_reasoning_parser("qwen3"), API_REASONING_QWEN3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hermes),
        cmocka_unit_test(test_hermes_malformed),
        cmocka_unit_test(test_llama3_json),
        cmocka_unit_test(test_mistral),
        cmocka_unit_test(test_json_list),
        cmocka_unit_test(test_reasoning),
        cmocka_unit_test(test_reasoning_then_tools),
        cmocka_unit_test(test_stream_increments),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
