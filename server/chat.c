/* chat.c - chat prompts as the model defines them: its Jinja chat template, parsed once at
 * start-up (jinja/) and rendered per request with the context that transformers'
 * apply_chat_template and vLLM give it.
 *
 * The template is the chat-template key's (a file, or one of the built-in templates below),
 * else the model folder's chat_template.jinja, else tokenizer_config.json's chat_template (a
 * string, or a list of {name, template}: "default", and "tool_use" for requests with tools).
 * The context: messages as sent (content parts joined with "\n", as vLLM does; other keys such
 * as name, tool_calls and tool_call_id kept), add_generation_prompt, tools and documents (null
 * when absent), bos_token / eos_token (tokenizer_config.json's, else the tokenizer's token
 * texts), and chat_template_kwargs merged in (the request's own fields win).
 * continue_final_message cuts the rendered text after the final message's content, with
 * transformers' rule for whitespace the template trimmed. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "api.h"
#include "jinja.h"

struct ApiChatTemplate {
    JinjaTemplate *dflt;     /* the template */
    JinjaTemplate *tool_use; /* tokenizer_config.json's "tool_use" template, or NULL */
    char *bos_token;         /* NULL: undefined in the template */
    char *eos_token;
    int64_t now; /* strftime_now's clock (0 = the current time) */
};

/* ---- the built-in templates --------------------------------------------------------------
 *
 * Written for pagellm, for models whose folder has no template: each renders what the Hugging
 * Face template of its family renders (Llama-2's also refuses roles out of turn and a system
 * message alone; every one refuses roles other than system, user and assistant).
 *
 *   chatml  <|im_start|>{role}\n{content}<|im_end|>\n ... <|im_start|>assistant\n
 *   llama3  {bos}<|start_header_id|>{role}<|end_header_id|>\n\n{content|trim}<|eot_id|>
 *           ... <|start_header_id|>assistant<|end_header_id|>\n\n
 *   llama2  {bos}[INST] {(<<SYS>>\n{system}\n<</SYS>>\n\n + user).strip()} [/INST]
 *            {assistant.strip()} {eos}{bos}[INST] ... [/INST]
 *   zephyr  <|{role}|>\n{content}{eos}\n ... <|assistant|>\n   (TinyLlama-Chat) */
#define KNOWN_ROLES                                                                                \
    "{% for message in messages %}{% if message['role'] not in ['system', 'user', 'assistant'] "   \
    "%}{{ raise_exception(\"unknown role '\" ~ message['role'] ~ \"' in messages[\" ~ "            \
    "loop.index0 ~ \"]: expected system, user or assistant\") }}{% endif %}{% endfor %}"

static const struct {
    const char *name, *source;
} BUILTINS[] = {
    {"chatml", KNOWN_ROLES "{% for message in messages %}{{ '<|im_start|>' + message['role'] + "
                           "'\\n' + message['content'] + '<|im_end|>\\n' }}{% endfor %}{% if "
                           "add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"},
    {"llama3",
     KNOWN_ROLES "{{ bos_token if bos_token is defined else '<|begin_of_text|>' }}{% for "
                 "message in messages %}{{ '<|start_header_id|>' + message['role'] + "
                 "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor "
                 "%}{% if add_generation_prompt %}{{ "
                 "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"},
    {"llama2",
     KNOWN_ROLES "{% set bos = bos_token if bos_token is defined else '<s>' %}{% set eos = "
                 "eos_token if eos_token is defined else '</s>' %}{% set has_system = "
                 "messages[0]['role'] == 'system' %}{% set turns = messages[1:] if has_system "
                 "else messages %}{% if not turns %}{{ raise_exception('messages must hold a user "
                 "message') }}{% endif %}{% for message in turns %}{% if message['role'] == "
                 "'system' or (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ "
                 "raise_exception('Conversation roles must alternate "
                 "user/assistant/user/assistant/...') }}{% endif %}{% set content = "
                 "message['content'] %}{% if loop.first and has_system %}{% set content = "
                 "'<<SYS>>\\n' + messages[0]['content'] + '\\n<</SYS>>\\n\\n' + content %}{% "
                 "endif %}{% if message['role'] == 'user' %}{{ bos + '[INST] ' + content.strip() "
                 "+ ' [/INST]' }}{% else %}{{ ' ' + content.strip() + ' ' + eos }}{% endif %}{% "
                 "endfor %}"},
    {"zephyr", KNOWN_ROLES
     "{% set eos = eos_token if eos_token is defined else '</s>' %}{% for "
     "message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] + "
     "eos + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% "
     "endif %}"},
};

#define NUM_BUILTINS ((int)(sizeof BUILTINS / sizeof BUILTINS[0]))

/* ---- loading ----------------------------------------------------------------------------- */

static Status parse_into(JinjaTemplate **out, const char *src, size_t len, const char *where) {
    char err[512];
    *out = jinja_parse(src, len, err, sizeof err);
    return *out ? PL_OK : pl_error_set(PL_ERR_INVALID, "%s: %s", where, err);
}

/* tokenizer_config.json's bos_token / eos_token (a string, or an object with "content"), else
 * the fallback (the tokenizer's token text); NULL when neither. */
static char *special_token(json_t *cfg, const char *key, const char *fallback) {
    json_t *v = json_object_get(cfg, key);
    if (json_is_object(v))
        v = json_object_get(v, "content");
    if (json_is_string(v))
        return pl_xstrdup(json_string_value(v));
    return fallback ? pl_xstrdup(fallback) : NULL;
}

/* The chat-template key: a built-in name, else a file. */
static Status load_setting(ApiChatTemplate *t, const char *setting) {
    for (int i = 0; i < NUM_BUILTINS; i++)
        if (!strcmp(setting, BUILTINS[i].name))
            return parse_into(&t->dflt, BUILTINS[i].source, strlen(BUILTINS[i].source),
                              BUILTINS[i].name);
    char *src;
    size_t len;
    if (pl_read_file(setting, &src, &len) != PL_OK)
        return pl_error_set(PL_ERR_INVALID,
                            "key 'chat-template' = '%s' is neither a built-in template (chatml, "
                            "llama3, llama2, zephyr) nor a readable file (%s)",
                            setting, pl_error());
    Status st = parse_into(&t->dflt, src, len, setting);
    free(src);
    return st;
}

/* tokenizer_config.json's chat_template: a string, or a list of {name, template}. */
static Status load_config_template(ApiChatTemplate *t, json_t *ct, const char *path) {
    char where[4200];
    snprintf(where, sizeof where, "%s: chat_template", path);
    if (json_is_string(ct))
        return parse_into(&t->dflt, json_string_value(ct), json_string_length(ct), where);
    size_t i;
    json_t *e;
    json_array_foreach(ct, i, e) {
        const char *name = json_string_value(json_object_get(e, "name"));
        json_t *src = json_object_get(e, "template");
        if (!name || !json_is_string(src))
            return pl_error_set(PL_ERR_INVALID, "%s[%zu] must be an object {name, template}", where,
                                i);
        JinjaTemplate **slot = !strcmp(name, "default")    ? &t->dflt
                               : !strcmp(name, "tool_use") ? &t->tool_use
                                                           : NULL;
        if (!slot || *slot)
            continue;
        snprintf(where, sizeof where, "%s: chat_template '%s'", path, name);
        if (parse_into(slot, json_string_value(src), json_string_length(src), where) != PL_OK)
            return PL_ERR_INVALID;
    }
    if (json_is_array(ct) && !t->dflt)
        return pl_error_set(PL_ERR_INVALID, "%s: chat_template lists no 'default' template", path);
    return PL_OK;
}

/* The model folder's chat_template.jinja, else tokenizer_config.json's chat_template. */
static Status load_model_template(ApiChatTemplate *t, const char *dir, json_t *cfg,
                                  const char *cfg_path) {
    char path[4096];
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    if (access(path, F_OK) != 0)
        return load_config_template(t, json_object_get(cfg, "chat_template"), cfg_path);
    char *src;
    size_t len;
    if (pl_read_file(path, &src, &len) != PL_OK)
        return PL_ERR_IO;
    Status st = parse_into(&t->dflt, src, len, path);
    free(src);
    return st;
}

Status api_chat_template_load(const ApiChatTemplateSpec *spec, ApiChatTemplate **out) {
    *out = NULL;
    ApiChatTemplate *t = pl_xcalloc(1, sizeof *t);
    t->now = spec->now;
    char cfg_path[4096] = "";
    json_t *cfg = NULL;
    if (spec->model_dir) {
        snprintf(cfg_path, sizeof cfg_path, "%s/tokenizer_config.json", spec->model_dir);
        cfg = json_load_file(cfg_path, JSON_DECODE_INT_AS_REAL, NULL); /* tok_load checked it */
    }
    t->bos_token = special_token(cfg, "bos_token", spec->bos_token);
    t->eos_token = special_token(cfg, "eos_token", spec->eos_token);
    Status st = PL_OK;
    if (spec->setting)
        st = load_setting(t, spec->setting);
    else if (spec->model_dir)
        st = load_model_template(t, spec->model_dir, cfg, cfg_path);
    json_decref(cfg);
    if (st != PL_OK || !t->dflt) {
        api_chat_template_free(t);
        return st;
    }
    *out = t;
    return PL_OK;
}

void api_chat_template_free(ApiChatTemplate *t) {
    if (!t)
        return;
    jinja_free(t->dflt);
    jinja_free(t->tool_use);
    free(t->bos_token);
    free(t->eos_token);
    free(t);
}

/* ---- the request's context ----------------------------------------------------------------- */

static json_t *field(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_null(v) ? NULL : v;
}

/* messages[i].content as one string: text parts joined with "\n" (as vLLM); none is "" for an
 * assistant message (OpenAI allows it: tool calls). NULL with *err filled when refused. */
static json_t *message_text(json_t *m, size_t i, const char *role, ApiError *err) {
    json_t *c = field(m, "content");
    if (!c && !strcmp(role, "assistant"))
        return json_string("");
    if (json_is_string(c))
        return json_incref(c);
    if (!json_is_array(c)) {
        api_error_set(err, 400, NULL, "messages",
                      "'messages[%zu].content' must be a string or a list of text parts", i);
        return NULL;
    }
    size_t len = 0, k;
    json_t *part;
    json_array_foreach(c, k, part) {
        const char *type = json_string_value(json_object_get(part, "type"));
        json_t *text = json_object_get(part, "text");
        if (!type || strcmp(type, "text") != 0) {
            api_error_set(
                err, 400, NULL, "messages",
                "'messages[%zu].content[%zu]': only parts of type 'text' are supported (got "
                "%s%s%s)",
                i, k, type ? "'" : "", type ? type : "no type", type ? "'" : "");
            return NULL;
        }
        if (!json_is_string(text)) {
            api_error_set(err, 400, NULL, "messages",
                          "'messages[%zu].content[%zu].text' must be a string", i, k);
            return NULL;
        }
        len += json_string_length(text) + 1;
    }
    char *s = pl_xmalloc(len + 1), *p = s;
    json_array_foreach(c, k, part) {
        json_t *text = json_object_get(part, "text");
        if (k)
            *p++ = '\n';
        memcpy(p, json_string_value(text), json_string_length(text));
        p += json_string_length(text);
    }
    json_t *out = json_stringn(s, (size_t)(p - s));
    free(s);
    return out;
}

/* An assistant message's tool_calls[].function.arguments as objects: OpenAI sends them as JSON
 * text, templates expect mappings (vLLM and transformers convert them the same way). Text that
 * is no JSON is left as it is. */
static void tool_call_arguments(json_t *m) {
    size_t i;
    json_t *tc;
    json_array_foreach(json_object_get(m, "tool_calls"), i, tc) {
        json_t *fn = json_object_get(tc, "function");
        json_t *args = json_object_get(fn, "arguments");
        json_t *parsed = json_is_string(args) ? json_loads(json_string_value(args), 0, NULL) : NULL;
        if (parsed)
            json_object_set_new(fn, "arguments", parsed);
    }
}

/* body.messages as the template sees them: each message copied with its content as a string. */
static json_t *chat_messages(json_t *body, ApiError *err) {
    json_t *arr = field(body, "messages");
    const char *why = !arr                    ? "'messages' is required"
                      : !json_is_array(arr)   ? "'messages' must be a list of messages"
                      : !json_array_size(arr) ? "'messages' must not be empty"
                                              : NULL;
    if (why) {
        api_error_set(err, 400, NULL, "messages", "%s", why);
        return NULL;
    }
    json_t *out = json_array();
    size_t i;
    json_t *m;
    json_array_foreach(arr, i, m) {
        json_t *role = json_object_get(m, "role"), *text;
        if (!json_is_object(m)) {
            api_error_set(err, 400, NULL, "messages", "'messages[%zu]' must be an object", i);
        } else if (!json_is_string(role) ||
                   strlen(json_string_value(role)) != json_string_length(role)) {
            api_error_set(err, 400, NULL, "messages",
                          "'messages[%zu].role' must be a string without \\u0000", i);
        } else if ((text = message_text(m, i, json_string_value(role), err))) {
            json_t *copy = json_deep_copy(m);
            json_object_set_new(copy, "content", text);
            tool_call_arguments(copy);
            json_array_append_new(out, copy);
            continue;
        }
        json_decref(out);
        return NULL;
    }
    return out;
}

/* body[key]: absent or null gives dflt; a boolean its value; else -1 (refused). */
static int flag(json_t *body, const char *key, int dflt, ApiError *err) {
    json_t *v = field(body, key);
    if (!v)
        return dflt;
    if (!json_is_boolean(v)) {
        api_error_set(err, 400, NULL, key, "'%s' must be a boolean", key);
        return -1;
    }
    return json_is_true(v);
}

/* body[key] when it is absent, null or of the JSON type `want` (*out: the value or NULL). */
static int typed(json_t *body, const char *key, json_type want, const char *what, json_t **out,
                 ApiError *err) {
    *out = field(body, key);
    if (!*out || json_typeof(*out) == want)
        return 0;
    api_error_set(err, 400, NULL, key, "'%s' must be %s", key, what);
    return -1;
}

/* transformers' continue_final_message: cut `text` after the final message's content (the
 * stripped content's last occurrence; its trailing whitespace kept only where the template
 * kept it). Returns the new length, or -1 when the content is not in the text. */
static long cut_after_final(const char *text, size_t len, json_t *final) {
    const char *c = json_string_value(final);
    size_t n = json_string_length(final), lead = jinja_ws_prefix(c, n);
    size_t core = n - lead - (lead < n ? jinja_ws_suffix(c, n) : 0); /* strip() */
    for (size_t at = core <= len ? len - core + 1 : 0; at-- > 0;) {
        if (memcmp(text + at, c + lead, core) != 0)
            continue;
        size_t keep = n - lead; /* len(content.lstrip()) */
        if (at + keep <= len && lead == 0 && memcmp(text + at, c, n) == 0)
            return (long)(at + keep);
        return (long)(at + core);
    }
    return -1;
}

/* The request's own chat_template (a Jinja string, as vLLM accepts), parsed into *own; else
 * the server's must exist. -1 with a 400 when neither, or for a template that does not parse
 * (the message names line and column). */
static int request_template(const ApiChatTemplate *t, json_t *body, JinjaTemplate **own,
                            ApiError *err) {
    json_t *src;
    char msg[sizeof err->message - 32];
    if (typed(body, "chat_template", JSON_STRING, "a string (a Jinja template)", &src, err) < 0)
        return -1;
    if (src) {
        *own = jinja_parse(json_string_value(src), json_string_length(src), msg, sizeof msg);
        if (!*own)
            api_error_set(err, 400, NULL, "chat_template", "chat_template: %s", msg);
        return *own ? 0 : -1;
    }
    if (t)
        return 0;
    api_error_set(err, 400, NULL, NULL,
                  "the model has no chat template, so /v1/chat/completions cannot be used "
                  "(set the chat-template config key to a template file or to chatml, llama3, "
                  "llama2 or zephyr, or send a chat_template)");
    return -1;
}

Status api_chat_prompt(const ApiChatTemplate *t, struct json_t *body, char **text, size_t *len,
                       ApiError *err) {
    *text = NULL;
    json_t *messages = chat_messages(body, err), *kwargs, *tools, *documents;
    JinjaTemplate *own = NULL; /* the request's chat_template */
    if (!messages)
        return PL_ERR_INVALID;
    json_t *ctx = json_object();
    int agp = flag(body, "add_generation_prompt", 1, err);
    int cfm = agp < 0 ? -1 : flag(body, "continue_final_message", 0, err);
    if (cfm < 0 ||
        typed(body, "chat_template_kwargs", JSON_OBJECT, "an object", &kwargs, err) < 0 ||
        typed(body, "documents", JSON_ARRAY, "a list of objects", &documents, err) < 0 ||
        typed(body, "tools", JSON_ARRAY, "a list of tools", &tools, err) < 0)
        goto fail;
    if (agp && cfm) {
        api_error_set(err, 400, NULL, "continue_final_message",
                      "'continue_final_message' and 'add_generation_prompt' cannot both be true");
        goto fail;
    }
    if (request_template(t, body, &own, err) < 0)
        goto fail;
    if (t && t->bos_token)
        json_object_set_new(ctx, "bos_token", json_string(t->bos_token));
    if (t && t->eos_token)
        json_object_set_new(ctx, "eos_token", json_string(t->eos_token));
    if (kwargs)
        json_object_update(ctx, kwargs);
    json_object_set(ctx, "messages", messages);
    json_object_set_new(ctx, "add_generation_prompt", json_boolean(agp));
    json_object_set_new(ctx, "tools", tools ? json_incref(tools) : json_null());
    json_object_set_new(ctx, "documents", documents ? json_incref(documents) : json_null());
    JinjaRenderOptions opts = {.now = t ? t->now : 0};
    char msg[sizeof err->message];
    int raised = 0;
    const JinjaTemplate *use = own ? own : tools && t->tool_use ? t->tool_use : t->dflt;
    *text = jinja_render_opts(use, ctx, &opts, len, &raised, msg, sizeof msg);
    if (!*text) {
        api_error_set(err, 400, NULL, "messages", "%s%s",
                      raised ? "" : "chat template error: ", msg);
        goto fail;
    }
    if (cfm) {
        json_t *final =
            json_object_get(json_array_get(messages, json_array_size(messages) - 1), "content");
        long cut = cut_after_final(*text, *len, final);
        if (cut < 0) {
            api_error_set(
                err, 400, NULL, "continue_final_message",
                "continue_final_message is set but the final message does not appear in the "
                "chat after applying the chat template");
            goto fail;
        }
        (*text)[cut] = 0;
        *len = (size_t)cut;
    }
    jinja_free(own);
    json_decref(ctx);
    json_decref(messages);
    return PL_OK;
fail:
    free(*text);
    *text = NULL;
    jinja_free(own);
    json_decref(ctx);
    json_decref(messages);
    return PL_ERR_INVALID;
}
