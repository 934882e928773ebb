/* test_chat.c - chat as the model defines it (server/chat.c through server/api.c): real
 * templates of tests/data/chat_templates/ rendered through the server's chat path, byte for
 * byte against Python's jinja2 (tests/jinja_reference.py --render; skipped, saying why,
 * without python3-jinja2); chat_template_kwargs reaching the template (SmolLM3's
 * enable_thinking); add_generation_prompt and continue_final_message; raise_exception and
 * template errors as 400s; where a template comes from (chat_template.jinja, tokenizer_config's
 * string or {name, template} list with tool_use, the chat-template key) and the start-up
 * errors; /tokenize and /detokenize bodies. Run from the repository root. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "api.h"

#define TD  "tests/data/chat_templates/"
#define NOW 1722004205 /* conversations.json's strftime_now clock */

static const ApiLimits LIM = {.max_model_len = 4096, .max_n = 8, .vocab_size = 32000};

#define CONV                                                                                       \
    "[{\"role\": \"system\", \"content\": \"You are a pirate.\"}, "                                \
    "{\"role\": \"user\", \"content\": \"Hello, how are you?\"}, "                                 \
    "{\"role\": \"assistant\", \"content\": \"Arr, fine.\"}, "                                     \
    "{\"role\": \"user\", \"content\": \"Tell me a story.\"}]"
#define USER_ONLY                                                                                  \
    "[{\"role\": \"user\", \"content\": \"Hello, how are you?\"}, "                                \
    "{\"role\": \"assistant\", \"content\": \"Fine.\"}, "                                          \
    "{\"role\": \"user\", \"content\": \"Tell me a story.\"}]"

static ApiChatTemplate *load(const char *setting, const char *dir, const char *bos,
                             const char *eos) {
    ApiChatTemplateSpec spec = {
        .setting = setting, .model_dir = dir, .bos_token = bos, .eos_token = eos, .now = NOW};
    ApiChatTemplate *t = NULL;
    if (api_chat_template_load(&spec, &t) != PL_OK)
        fail_msg("%s: %s", setting ? setting : dir, pl_error());
    return t;
}

/* The chat prompt of `body` (a JSON object's text), or NULL with *e filled. */
static char *render(const ApiChatTemplate *t, const char *body, ApiError *e) {
    ApiRequest r;
    if (api_parse_chat(body, strlen(body), &LIM, t, &r, e) != PL_OK)
        return NULL;
    char *text = r.prompts[0].text;
    r.prompts[0].text = NULL;
    api_request_free(&r);
    return text;
}

static char *render_ok(const ApiChatTemplate *t, const char *body) {
    ApiError e;
    char *s = render(t, body, &e);
    if (!s)
        fail_msg("%s: %s", body, e.message);
    return s;
}

static void expect_400(const ApiChatTemplate *t, const char *body, const char *param,
                       const char *message) {
    ApiError e;
    char *s = render(t, body, &e);
    if (s || e.status != 400 || strcmp(e.param, param) || !strstr(e.message, message))
        fail_msg("%s: status %d param '%s' message '%s' (want '%s', '%s')", body, e.status, e.param,
                 e.message, param, message);
}

/* ---- real templates against Python's jinja2 ---------------------------------------------- */

/* jinja2's rendering of `file` with `context`, as apply_chat_template; NULL when Python's
 * jinja2 is missing (the test is then skipped). Aborts the test on another failure. */
static char *reference(const char *file, json_t *context) {
    char ctx_path[] = "/tmp/pagellm-chat-ctx.XXXXXX";
    int fd = mkstemp(ctx_path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(json_dump_file(context, ctx_path, 0), 0);
    static const char *const pythons[] = {"python3", "/usr/bin/python3"};
    char *out = NULL;
    int code = 127;
    for (size_t p = 0; p < 2 && (code == 77 || code == 127); p++) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd,
                 "%s tests/jinja_reference.py --now %d --render '%s' '%s' 2>/dev/null", pythons[p],
                 NOW, file, ctx_path);
        FILE *f = popen(cmd, "r");
        assert_non_null(f);
        size_t len = 0, cap = 1 << 16;
        out = realloc(out, cap);
        for (size_t n; (n = fread(out + len, 1, cap - len - 1, f)) > 0;)
            if ((len += n) + 1 == cap)
                out = realloc(out, cap *= 2);
        out[len] = 0;
        int st = pclose(f);
        code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    }
    unlink(ctx_path);
    if (code == 77 || code == 127) {
        free(out);
        return NULL;
    }
    if (code != 0)
        fail_msg("jinja_reference.py --render %s failed: %s", file, out);
    return out;
}

/* Render `name` through the chat path and with jinja2, with the same context; compare. */
static int same_as_jinja2(const char *name, const char *bos, const char *eos, const char *messages,
                          const char *kwargs, int agp) {
    char file[256], body[4096];
    snprintf(file, sizeof file, TD "%s.jinja", name);
    snprintf(body, sizeof body,
             "{\"messages\": %s, \"chat_template_kwargs\": %s, \"add_generation_prompt\": %s}",
             messages, kwargs, agp ? "true" : "false");
    json_t *ctx = json_loads(kwargs, 0, NULL);
    if (bos)
        json_object_set_new(ctx, "bos_token", json_string(bos));
    if (eos)
        json_object_set_new(ctx, "eos_token", json_string(eos));
    json_object_set_new(ctx, "messages", json_loads(messages, 0, NULL));
    json_object_set_new(ctx, "add_generation_prompt", json_boolean(agp));
    json_object_set_new(ctx, "tools", json_null());
    json_object_set_new(ctx, "documents", json_null());
    char *want = reference(file, ctx);
    json_decref(ctx);
    if (!want)
        return 0;
    ApiChatTemplate *t = load(file, NULL, bos, eos);
    char *got = render_ok(t, body);
    if (strcmp(got, want) != 0)
        fail_msg("%s: the chat path rendered\n%s\n---- jinja2 rendered\n%s", name, got, want);
    free(got);
    free(want);
    api_chat_template_free(t);
    return 1;
}

static void test_real_templates_as_jinja2(void **state) {
    (void)state;
    if (!same_as_jinja2("llama-3.2-3b-instruct", "<|begin_of_text|>", "<|eot_id|>", CONV, "{}",
                        1)) {
        printf("test_real_templates_as_jinja2: SKIPPED: Python's jinja2 is not installed\n");
        skip();
    }
    assert_true(same_as_jinja2("qwen2.5-instruct-chujiezheng", NULL, "<|im_end|>", CONV, "{}", 1));
    assert_true(
        same_as_jinja2("qwen2.5-instruct-chujiezheng", NULL, "<|im_end|>", USER_ONLY, "{}", 0));
    assert_true(same_as_jinja2("mistral-7b-instruct-v0.1", "<s>", "</s>", USER_ONLY, "{}", 1));
    assert_true(same_as_jinja2("gemma-3-it", "<bos>", "<eos>", USER_ONLY, "{}", 1));
    assert_true(same_as_jinja2("gemma-2-2b-it", "<bos>", "<eos>", USER_ONLY, "{}", 1));
    assert_true(same_as_jinja2("llama-3.1-8b-instruct", "<|begin_of_text|>", "<|eot_id|>", CONV,
                               "{\"builtin_tools\": [\"brave_search\", \"code_interpreter\"]}", 1));
}

/* chat_template_kwargs reach the template: SmolLM3's enable_thinking switches its reasoning
 * mode (both renderings as jinja2's, and different from each other). */
static void test_kwargs_reach_the_template(void **state) {
    (void)state;
    if (!same_as_jinja2("smollm3", NULL, "<|im_end|>", CONV, "{\"enable_thinking\": true}", 1))
        skip();
    assert_true(
        same_as_jinja2("smollm3", NULL, "<|im_end|>", CONV, "{\"enable_thinking\": false}", 1));
    ApiChatTemplate *t = load(TD "smollm3.jinja", NULL, NULL, "<|im_end|>");
    char *on = render_ok(t, "{\"messages\": " CONV
                            ", \"chat_template_kwargs\": {\"enable_thinking\": true}}");
    char *off = render_ok(t, "{\"messages\": " CONV
                             ", \"chat_template_kwargs\": {\"enable_thinking\": false}}");
    assert_non_null(strstr(on, "/think"));
    assert_non_null(strstr(off, "/no_think"));
    assert_null(strstr(on, "/no_think"));
    free(on);
    free(off);
    api_chat_template_free(t);
}

/* ---- the request's fields --------------------------------------------------------------- */

#define LONG_TEXT                                                                                  \
    "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"

static void test_generation_prompt_and_continue(void **state) {
    (void)state;
    ApiChatTemplate *chatml = load("chatml", NULL, NULL, NULL);
    char *s = render_ok(chatml, "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], "
                                "\"add_generation_prompt\": false}");
    assert_string_equal(s, "<|im_start|>user\nHi<|im_end|>\n");
    free(s);
    /* the text ends after the final message's content: the model goes on writing it */
    s = render_ok(chatml, "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": "
                          "\"assistant\", \"content\": \"Once upon\"}], \"add_generation_prompt\": "
                          "false, \"continue_final_message\": true}");
    assert_string_equal(s, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nOnce upon");
    free(s);
    /* a final message longer than the whole text (the template dropped it) */
    char path[] = "/tmp/pagellm-chat-tmpl.XXXXXX";
    int fd = mkstemp(path);
    assert_int_equal(write(fd, "{{ messages[0].content }}", 25), 25);
    close(fd);
    ApiChatTemplate *drops = load(path, NULL, NULL, NULL);
    expect_400(drops,
               "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": "
               "\"assistant\", \"content\": \"" LONG_TEXT "\"}], \"add_generation_prompt\": false, "
               "\"continue_final_message\": true}",
               "continue_final_message", "does not appear");
    api_chat_template_free(drops);
    unlink(path);
    expect_400(chatml,
               "{\"messages\": [{\"role\": \"assistant\", \"content\": \"a\"}], "
               "\"continue_final_message\": true}",
               "continue_final_message", "cannot both be true");
    expect_400(chatml,
               "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], "
               "\"add_generation_prompt\": 1}",
               "add_generation_prompt", "must be a boolean");
    expect_400(chatml,
               "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], "
               "\"chat_template_kwargs\": [1]}",
               "chat_template_kwargs", "must be an object");
    expect_400(chatml,
               "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], "
               "\"documents\": \"d\"}",
               "documents", "must be a list");
    api_chat_template_free(chatml);
    /* Llama 3 trims the content: the cut keeps what the template kept (transformers' rule) */
    ApiChatTemplate *llama3 = load("llama3", NULL, "<s>", NULL);
    s = render_ok(llama3,
                  "{\"messages\": [{\"role\": \"assistant\", \"content\": \" Hi there \\n\"}],"
                  " \"add_generation_prompt\": false, \"continue_final_message\": true}");
    assert_string_equal(s, "<s><|start_header_id|>assistant<|end_header_id|>\n\nHi there");
    free(s);
    api_chat_template_free(llama3);
}

/* Other message keys and documents reach the template. */
/* A conversation with tools, an assistant's tool call (arguments as OpenAI sends them: JSON
 * text) and the tool's result renders with real tool-use templates, the arguments as a
 * mapping (not a quoted string). */
static void test_tool_history(void **state) {
    static const char *const files[] = {
        TD "hermes-3-llama-3.1-tool-use.jinja", TD "llama-3.2-3b-instruct.jinja",
        TD "mistral-7b-instruct-v0.3.jinja", TD "mistral-nemo-instruct-2407.jinja",
        TD "qwen3-coder-30b-a3b-instruct.jinja"};
    const char *body =
        "{\"tool_choice\": \"none\", \"tools\": [{\"type\": \"function\", \"function\": "
        "{\"name\": \"get_weather\", \"description\": \"Weather now\", \"parameters\": "
        "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}], "
        "\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"}, "
        "{\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": "
        "\"call9abcd\", \"type\": \"function\", \"function\": {\"name\": "
        "\"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}}]}, "
        "{\"role\": \"tool\", \"tool_call_id\": \"call9abcd\", \"content\": \"22C sunny\"}]}";
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        ApiChatTemplate *t = load(files[i], NULL, "<s>", "</s>");
        char *s = render_ok(t, body);
        if (!strstr(s, "get_weather") || !strstr(s, "22C sunny") || !strstr(s, "Paris") ||
            strstr(s, "\\\"city"))
            fail_msg("%s rendered the tool history as:\n%s", files[i], s);
        free(s);
        api_chat_template_free(t);
    }
}

static void test_context_keys(void **state) {
    (void)state;
    char path[] = "/tmp/pagellm-chat-tmpl.XXXXXX";
    int fd = mkstemp(path);
    static const char src[] = "{% for m in messages %}{{ m.role }}:{{ m.name }}:{{ m.tool_call_id "
                              "}}:{{ m.content }};{% endfor %}{{ documents | length }}"
                              "{{ bos_token }}{{ eos_token }}{{ tools }}";
    assert_int_equal(write(fd, src, sizeof src - 1), (ssize_t)(sizeof src - 1));
    close(fd);
    ApiChatTemplate *t = load(path, NULL, "<B>", "<E>");
    char *s = render_ok(t, "{\"messages\": [{\"role\": \"user\", \"name\": \"bob\", \"content\": "
                           "[{\"type\": \"text\", \"text\": \"a\"}, {\"type\": \"text\", \"text\": "
                           "\"b\"}]}, {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": "
                           "\"42\"}], \"documents\": [{\"title\": \"t\", \"text\": \"x\"}]}");
    assert_string_equal(s, "user:bob::a\nb;tool::c1:42;1<B><E>None");
    free(s);
    api_chat_template_free(t);
    unlink(path);
}

/* raise_exception's message is the 400's message; other template errors say where. */
static void test_render_errors(void **state) {
    (void)state;
    ApiChatTemplate *t = load(TD "mistral-7b-instruct-v0.1.jinja", NULL, "<s>", "</s>");
    expect_400(t, "{\"messages\": [{\"role\": \"assistant\", \"content\": \"a\"}]}", "messages",
               "Conversation roles must alternate user/assistant/user/assistant/...");
    ApiError e;
    assert_null(render(t,
                       "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": "
                       "\"user\", \"content\": \"b\"}]}",
                       &e));
    assert_string_equal(e.message,
                        "Conversation roles must alternate user/assistant/user/assistant/...");
    assert_string_equal(e.type, "invalid_request_error");
    api_chat_template_free(t);
    char path[] = "/tmp/pagellm-chat-tmpl.XXXXXX";
    int fd = mkstemp(path);
    assert_int_equal(write(fd, "x\n{{ nothing.here }}", 20), 20);
    close(fd);
    t = load(path, NULL, NULL, NULL);
    expect_400(t, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}", "messages",
               "chat template error: line 2: 'nothing' is undefined");
    api_chat_template_free(t);
    unlink(path);
    expect_400(NULL, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}", "",
               "the model has no chat template");
}

/* ---- where the template comes from ------------------------------------------------------- */

static char dir[64];

static void put(const char *name, const char *text) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void clear(void) {
    char path[128];
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    unlink(path);
}

static Status try_load(const char *setting, ApiChatTemplate **t) {
    ApiChatTemplateSpec spec = {.setting = setting, .model_dir = dir, .bos_token = "<tok-bos>"};
    return api_chat_template_load(&spec, t);
}

#define HI "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}"

static void expect_model_renders(const char *want) {
    ApiChatTemplate *t = load(NULL, dir, "<tok-bos>", NULL);
    assert_non_null(t);
    char *s = render_ok(t, HI);
    assert_string_equal(s, want);
    free(s);
    api_chat_template_free(t);
}

static void expect_load_error(const char *setting, const char *needle) {
    ApiChatTemplate *t = NULL;
    if (try_load(setting, &t) == PL_OK || t || !strstr(pl_error(), needle))
        fail_msg("want an error with '%s', got '%s'", needle, pl_error());
}

static void test_template_sources(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/pagellm-chat-model.XXXXXX");
    assert_non_null(mkdtemp(dir));
    ApiChatTemplate *t = (ApiChatTemplate *)1;
    /* none: no template (the chat endpoint then answers 400) */
    assert_int_equal(try_load(NULL, &t), PL_OK);
    assert_null(t);
    put("tokenizer_config.json", "{\"eos_token\": \"</s>\"}");
    assert_int_equal(try_load(NULL, &t), PL_OK);
    assert_null(t);
    /* tokenizer_config.json's string; bos_token as an object; the tokenizer's when absent */
    put("tokenizer_config.json", "{\"chat_template\": \"{{ bos_token }}|{{ eos_token }}|{{ "
                                 "messages[0].content }}\", \"bos_token\": {\"content\": "
                                 "\"<cfg-bos>\"}, \"eos_token\": \"</s>\"}");
    expect_model_renders("<cfg-bos>|</s>|Hi");
    put("tokenizer_config.json", "{\"chat_template\": \"{{ bos_token }}|{{ messages[0].content "
                                 "}}\", \"bos_token\": null}");
    expect_model_renders("<tok-bos>|Hi");
    /* chat_template.jinja wins */
    put("chat_template.jinja", "file:{{ messages[0].content }}");
    expect_model_renders("file:Hi");
    /* a list: default, and tool_use for requests with tools (through /tokenize) */
    clear();
    put("tokenizer_config.json",
        "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"tools:{{ tools | length "
        "}}\"}, {\"name\": \"default\", \"template\": \"default:{{ tools }}\"}, {\"name\": "
        "\"rag\", \"template\": \"{% bad\"}]}");
    expect_model_renders("default:None");
    t = load(NULL, dir, NULL, NULL);
    ApiTokenizeRequest q;
    ApiError e;
    const char *with_tools = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], "
                             "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": "
                             "\"f\"}}]}";
    assert_int_equal(api_parse_tokenize(with_tools, strlen(with_tools), t, &q, &e), PL_OK);
    assert_string_equal(q.text, "tools:1");
    api_tokenize_free(&q);
    api_chat_template_free(t);
    /* start-up errors name the file and line, or the key and value */
    put("tokenizer_config.json", "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": "
                                 "\"x\"}]}");
    expect_load_error(NULL, "tokenizer_config.json: chat_template lists no 'default' template");
    put("tokenizer_config.json", "{\"chat_template\": \"ok\\n{% if %}\"}");
    expect_load_error(NULL, "tokenizer_config.json: chat_template: line 2 column");
    put("chat_template.jinja", "{{ 1 +\n\n }");
    expect_load_error(NULL, "chat_template.jinja: line 3 column");
    expect_load_error("vicuna", "key 'chat-template' = 'vicuna' is neither a built-in template "
                                "(chatml, llama3, llama2, zephyr) nor a readable file");
    /* the key wins over the model's own */
    assert_int_equal(try_load("zephyr", &t), PL_OK);
    char *s = render_ok(t, HI);
    assert_string_equal(s, "<|user|>\nHi</s>\n<|assistant|>\n"); /* tokenizer_config's eos */
    free(s);
    api_chat_template_free(t);
    clear();
    rmdir(dir);
}

/* ---- /tokenize and /detokenize bodies ----------------------------------------------------- */

static void bad_tokenize(const ApiChatTemplate *t, const char *body, const char *param,
                         const char *needle) {
    ApiTokenizeRequest q;
    ApiError e;
    if (api_parse_tokenize(body, strlen(body), t, &q, &e) == PL_OK || e.status != 400 ||
        strcmp(e.param, param) || !strstr(e.message, needle))
        fail_msg("%s: param '%s' message '%s'", body, e.param, e.message);
}

static void test_tokenize_bodies(void **state) {
    (void)state;
    ApiChatTemplate *t = load("chatml", NULL, NULL, NULL);
    ApiTokenizeRequest q;
    ApiError e;
    const char *body = "{\"prompt\": \"a\\u0000b\", \"model\": \"m\"}";
    assert_int_equal(api_parse_tokenize(body, strlen(body), t, &q, &e), PL_OK);
    assert_int_equal(q.text_len, 3);
    assert_int_equal(q.add_special_tokens, 1);
    assert_int_equal(q.return_token_strs, 0);
    assert_string_equal(q.model, "m");
    api_tokenize_free(&q);
    body = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"return_token_strs\": "
           "true, \"add_generation_prompt\": false}";
    assert_int_equal(api_parse_tokenize(body, strlen(body), t, &q, &e), PL_OK);
    assert_string_equal(q.text, "<|im_start|>user\nHi<|im_end|>\n");
    assert_int_equal(q.add_special_tokens, 0);
    assert_int_equal(q.return_token_strs, 1);
    api_tokenize_free(&q);
    body = "{\"prompt\": \"x\", \"add_special_tokens\": false}";
    assert_int_equal(api_parse_tokenize(body, strlen(body), t, &q, &e), PL_OK);
    assert_int_equal(q.add_special_tokens, 0);
    api_tokenize_free(&q);
    bad_tokenize(t, "{}", "prompt", "'prompt' (a string) or 'messages' is required");
    bad_tokenize(t, "{\"prompt\": [1, 2]}", "prompt", "'prompt' (a string)");
    bad_tokenize(t, "{\"prompt\": \"x\", \"add_special_tokens\": 1}", "add_special_tokens",
                 "must be a boolean");
    bad_tokenize(t, "{\"messages\": []}", "messages", "must not be empty");
    bad_tokenize(t, "{\"messages\": [{\"role\": \"tool\", \"content\": \"x\"}]}", "messages",
                 "unknown role 'tool'");
    bad_tokenize(NULL, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", "",
                 "no chat template");
    bad_tokenize(t, "[1]", "", "must be a JSON object");
    api_chat_template_free(t);

    ApiLimits lim = {.vocab_size = 512};
    body = "{\"tokens\": [1, 511, 2.0]}";
    assert_int_equal(api_parse_detokenize(body, strlen(body), &lim, &q, &e), PL_OK);
    assert_int_equal(q.num_ids, 3);
    assert_int_equal(q.ids[1], 511);
    api_tokenize_free(&q);
    body = "{\"tokens\": []}";
    assert_int_equal(api_parse_detokenize(body, strlen(body), &lim, &q, &e), PL_OK);
    assert_int_equal(q.num_ids, 0);
    api_tokenize_free(&q);
    static const char *const bad_bodies[][2] = {
        {"{}", "'tokens' (a list of token ids) is required"},
        {"{\"tokens\": \"1 2\"}", "'tokens' (a list of token ids)"},
        {"{\"tokens\": [512]}", "out of vocabulary (vocab size 512)"},
        {"{\"tokens\": [-1]}", "out of vocabulary"},
        {"{\"tokens\": [1.5]}", "integer token ids"},
        {"{\"tokens\": [\"1\"]}", "integer token ids"}};
    for (size_t i = 0; i < sizeof bad_bodies / sizeof *bad_bodies; i++) {
        const char *b = bad_bodies[i][0];
        if (api_parse_detokenize(b, strlen(b), &lim, &q, &e) == PL_OK ||
            strcmp(e.param, "tokens") || !strstr(e.message, bad_bodies[i][1]))
            fail_msg("%s: param '%s' message '%s'", b, e.param, e.message);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_real_templates_as_jinja2),
        cmocka_unit_test(test_kwargs_reach_the_template),
        cmocka_unit_test(test_generation_prompt_and_continue),
        cmocka_unit_test(test_context_keys),
        cmocka_unit_test(test_tool_history),
        cmocka_unit_test(test_render_errors),
        cmocka_unit_test(test_template_sources),
        cmocka_unit_test(test_tokenize_bodies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
