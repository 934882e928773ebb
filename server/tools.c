/* tools.c - the request side of chat tool calling: `tools` (OpenAI's [{type: "function",
 * function: {name, description, parameters}}]) and `tool_choice` checked field by field, how
 * the answer is read (the server's tool-call-parser, or none), and for tool_choice "required"
 * or a named function the constraint that makes the model call: a grammar of the parser's
 * own call format whose arguments follow each function's parameters schema
 * (gr_compile_gbnf_schemas). As vLLM: "auto" needs enable-auto-tool-choice, "none" renders
 * the tools but reads no calls, and without a parser "required" is a JSON list of
 * {"name", "parameters"} objects. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "api.h"

/* At most this many calls in one answer under tool_choice required (parallel_tool_calls):
 * a bound, so that a model that never stops calling still ends. */
#define MAX_FORCED_CALLS 4

static json_t *field(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_null(v) ? NULL : v;
}

/* OpenAI's rule for function names: a-z, A-Z, 0-9, '_' and '-', 1 to 64 of them. */
static int valid_name(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 64)
        return 0;
    for (; *s; s++)
        if (!(*s == '_' || *s == '-' || (*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'z') ||
              (*s >= 'A' && *s <= 'Z')))
            return 0;
    return 1;
}

/* tools[i]: {type: "function", function: {name, description?, parameters?, strict?}}. */
static int check_tool(json_t *t, size_t i, ApiError *err) {
    json_t *fn = field(t, "function"), *type = field(t, "type");
    json_t *name = field(fn, "name"), *params = field(fn, "parameters");
    json_t *desc = field(fn, "description");
    if (!json_is_object(t))
        return api_refuse(err, "tools", "'tools[%zu]' must be an object", i);
    if (!json_is_string(type) || strcmp(json_string_value(type), "function"))
        return api_refuse(err, "tools", "'tools[%zu].type' must be \"function\"", i);
    if (!json_is_object(fn))
        return api_refuse(err, "tools", "'tools[%zu].function' must be an object", i);
    if (!json_is_string(name) || !valid_name(json_string_value(name)))
        return api_refuse(
            err, "tools",
            "'tools[%zu].function.name' must be a string of 1 to 64 characters a-z, A-Z, "
            "0-9, '_' or '-'",
            i);
    if (desc && !json_is_string(desc))
        return api_refuse(err, "tools", "'tools[%zu].function.description' must be a string", i);
    if (params && !json_is_object(params))
        return api_refuse(err, "tools",
                          "'tools[%zu].function.parameters' must be a JSON schema object", i);
    return 0;
}

/* The tools list; 0 when absent or empty (*n = 0). */
static int check_tools(json_t *o, json_t **tools, ApiError *err) {
    *tools = field(o, "tools");
    if (!*tools)
        return 0;
    if (!json_is_array(*tools))
        return api_refuse(err, "tools", "'tools' must be a list of tools");
    size_t i;
    json_t *t;
    json_array_foreach(*tools, i, t) {
        if (check_tool(t, i, err))
            return -1;
    }
    return 0;
}

static const char *tool_name(json_t *tools, size_t i) {
    return json_string_value(
        json_object_get(json_object_get(json_array_get(tools, i), "function"), "name"));
}

typedef enum { CHOICE_NONE, CHOICE_AUTO, CHOICE_REQUIRED, CHOICE_NAMED } Choice;

/* tool_choice: "none" | "auto" | "required" | {type: "function", function: {name}}; the
 * default is auto with tools, none without. *named: the function's index in tools. */
static int check_choice(json_t *o, json_t *tools, Choice *c, size_t *named, ApiError *err) {
    json_t *v = field(o, "tool_choice");
    size_t n = json_array_size(tools);
    *c = n ? CHOICE_AUTO : CHOICE_NONE;
    if (!v)
        return 0;
    const char *s = json_string_value(v);
    if (s) {
        *c = !strcmp(s, "none")       ? CHOICE_NONE
             : !strcmp(s, "auto")     ? CHOICE_AUTO
             : !strcmp(s, "required") ? CHOICE_REQUIRED
                                      : (Choice)-1;
        if ((int)*c < 0)
            return api_refuse(err, "tool_choice",
                              "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                              "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    } else {
        const char *type = json_string_value(field(v, "type"));
        const char *name = json_string_value(field(field(v, "function"), "name"));
        if (!json_is_object(v) || !type || strcmp(type, "function") || !name)
            return api_refuse(err, "tool_choice",
                              "'tool_choice' as an object must be {\"type\": \"function\", "
                              "\"function\": {\"name\": ...}}");
        for (*named = 0; *named < n && strcmp(tool_name(tools, *named), name); (*named)++)
            ;
        if (*named == n)
            return api_refuse(err, "tool_choice",
                              "'tool_choice' names the function '%.100s', which is not in 'tools'",
                              name);
        *c = CHOICE_NAMED;
    }
    if (*c != CHOICE_NONE && n == 0)
        return api_refuse(err, "tool_choice", "'tool_choice' %s needs 'tools'",
                          s ? s : "(a function)");
    return 0;
}

/* ---- the constraint of required and named choices ----------------------------------------- */

/* `s` as a GBNF string literal. */
static void lit(char *out, size_t cap, const char *s) {
    size_t k = 0;
    out[k++] = '"';
    for (; *s && k + 3 < cap; s++) {
        if (*s == '\n') {
            out[k++] = '\\';
            out[k++] = 'n';
            continue;
        }
        if (*s == '"' || *s == '\\')
            out[k++] = '\\';
        out[k++] = *s;
    }
    out[k++] = '"';
    out[k] = 0;
}

/* How each call, the separator between calls and the whole list are written. */
typedef struct {
    const char *call_open;  /* before the name */
    const char *args_key;   /* between the name and the arguments */
    const char *call_close; /* after the arguments */
    const char *list_open, *sep, *list_close;
} CallFormat;

static CallFormat call_format(ApiToolFormat f) {
    switch (f) {
        case API_TOOLS_HERMES:
            return (CallFormat){"<tool_call>\n{\"name\": \"",
                                "\", \"arguments\": ",
                                "}\n</tool_call>",
                                "",
                                "\n",
                                ""};
        case API_TOOLS_LLAMA3_JSON:
            return (CallFormat){"{\"name\": \"", "\", \"parameters\": ", "}", "", "; ", ""};
        case API_TOOLS_MISTRAL:
            return (CallFormat){
                "{\"name\": \"", "\", \"arguments\": ", "}", "[TOOL_CALLS][", ", ", "]"};
        default:
            return (CallFormat){"{\"name\": \"", "\", \"parameters\": ", "}", "[", ", ", "]"};
    }
}

typedef struct {
    char *p;
    size_t len, cap;
} Src;

static void put(Src *s, const char *t) {
    size_t n = strlen(t);
    if (s->len + n + 1 > s->cap) {
        s->cap = (s->len + n + 1) * 2;
        s->p = pl_xrealloc(s->p, s->cap);
    }
    memcpy(s->p + s->len, t, n + 1);
    s->len += n;
}

/* The GBNF of the answer: root over calls of the functions [from, to) of tools. */
static char *forced_gbnf(ApiToolFormat f, json_t *tools, size_t from, size_t to, int parallel) {
    CallFormat cf = call_format(f);
    Src s = {0};
    char q[300], line[1024];
    put(&s, "root ::= ");
    if (cf.list_open[0]) {
        lit(q, sizeof q, cf.list_open);
        put(&s, q);
    }
    put(&s, " call ");
    if (parallel) {
        lit(q, sizeof q, cf.sep);
        snprintf(line, sizeof line, "(%s call){0,%d} ", q, MAX_FORCED_CALLS - 1);
        put(&s, line);
    }
    if (cf.list_close[0]) {
        lit(q, sizeof q, cf.list_close);
        put(&s, q);
    }
    put(&s, "\ncall ::= ");
    for (size_t i = from; i < to; i++) {
        char open[300], close[64];
        snprintf(open, sizeof open, "%s%s%s", cf.call_open, tool_name(tools, i), cf.args_key);
        lit(q, sizeof q, open);
        lit(close, sizeof close, cf.call_close);
        snprintf(line, sizeof line, "%s%s args%zu %s", i > from ? " | " : "", q, i, close);
        put(&s, line);
    }
    put(&s, "\n");
    return s.p;
}

/* Compile the constraint; a schema the grammar library refuses is a 400 naming the tool. */
static GrCompiled *forced_constraint(ApiToolFormat f, json_t *tools, size_t from, size_t to,
                                     int parallel, ApiError *err) {
    size_t n = json_array_size(tools);
    char **names = pl_xcalloc(n, sizeof *names);
    json_t **schemas = pl_xcalloc(n, sizeof *schemas);
    int k = 0;
    for (size_t i = from; i < to; i++, k++) {
        json_t *params = field(json_object_get(json_array_get(tools, i), "function"), "parameters");
        char name[32];
        snprintf(name, sizeof name, "args%zu", i);
        names[k] = pl_xstrdup(name);
        schemas[k] = params ? json_incref(params) : json_pack("{s:s}", "type", "object");
    }
    char *src = forced_gbnf(f, tools, from, to, parallel), msg[512];
    GrCompiled *c = gr_compile_gbnf_schemas(src, strlen(src), (const char *const *)names, schemas,
                                            k, msg, sizeof msg);
    for (size_t i = from; !c && i < to; i++) { /* which tool: compile its schema alone */
        GrCompiled *one = gr_compile_json_schema(schemas[i - from], msg, sizeof msg);
        if (!one) {
            api_refuse(err, "tools", "'tools[%zu].function.parameters': %s", i, msg);
            break;
        }
        gr_compiled_free(one);
    }
    if (!c && !err->message[0])
        api_refuse(err, "tools", "'tools': %s", msg);
    for (int i = 0; i < k; i++) {
        free(names[i]);
        json_decref(schemas[i]);
    }
    free(names);
    free(schemas);
    free(src);
    return c;
}

int api_parse_tools(json_t *o, const ApiLimits *lim, ApiRequest *r, ApiError *err) {
    json_t *tools;
    Choice choice;
    size_t named = 0;
    int parallel = 1;
    err->message[0] = 0;
    if (check_tools(o, &tools, err) || check_choice(o, tools, &choice, &named, err))
        return -1;
    json_t *pv = field(o, "parallel_tool_calls");
    if (pv && !json_is_boolean(pv))
        return api_refuse(err, "parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    parallel = !pv || json_is_true(pv);
    ApiToolFormat parser = api_tool_format(lim->tool_call_parser);
    if (choice == CHOICE_NONE)
        return 0;
    /* Mistral's [TOOL_CALLS] is a special token in its newer tokenizers: its text is kept so
     * that the parser sees it (vLLM's mistral parser does the same) */
    if (parser == API_TOOLS_MISTRAL)
        r->skip_special_tokens = 0;
    if (choice == CHOICE_AUTO) {
        if (!lim->enable_auto_tool_choice || parser == API_TOOLS_OFF)
            return api_refuse(
                err, "tool_choice",
                "\"auto\" tool choice requires --enable-auto-tool-choice and "
                "--tool-call-parser to be set (or use tool_choice \"required\", a named "
                "function or \"none\")");
        r->tool_format = parser;
        return 0;
    }
    if (r->constraint)
        return api_refuse(err, "tool_choice",
                          "tool_choice \"required\" or a named function cannot be combined with "
                          "response_format or guided decoding");
    r->tool_format = parser != API_TOOLS_OFF ? parser : API_TOOLS_JSON_LIST;
    size_t from = choice == CHOICE_NAMED ? named : 0;
    size_t to = choice == CHOICE_NAMED ? named + 1 : json_array_size(tools);
    r->constraint = forced_constraint(r->tool_format, tools, from, to,
                                      parallel && choice == CHOICE_REQUIRED, err);
    return r->constraint ? 0 : -1;
}
