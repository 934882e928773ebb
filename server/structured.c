/* structured.c - a request's structured-output constraint: OpenAI's response_format
 * (json_object, json_schema), vLLM's guided_json / guided_regex / guided_choice /
 * guided_grammar and its newer structured_outputs object ({json, regex, choice, grammar,
 * json_object}), compiled by the grammar library into one GrCompiled the engine follows. At
 * most one constraint per request; each error is a 400 naming the field, with the grammar
 * library's message (an unsupported JSON schema keyword is named there). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "grammar.h"

/* One constraint of kind `kind` ("json", "json_object", "regex", "choice", "grammar") from
 * value v; `param` names the field in errors. */
static GrCompiled *compile(const char *kind, json_t *v, const char *param, ApiError *err) {
    char msg[512] = "";
    GrCompiled *c = NULL;
    if (!strcmp(kind, "json_object")) {
        c = gr_compile_json_object(msg, sizeof msg);
    } else if (!strcmp(kind, "json")) {
        json_t *schema =
            json_is_string(v) ? json_loads(json_string_value(v), 0, NULL) : json_incref(v);
        if (!json_is_object(schema) && !json_is_boolean(schema)) {
            json_decref(schema);
            api_error_set(err, 400, "invalid_request_error", param,
                          "'%s' must be a JSON schema (an object, or a string holding one)", param);
            return NULL;
        }
        c = gr_compile_json_schema(schema, msg, sizeof msg);
        json_decref(schema);
    } else if (!strcmp(kind, "regex") || !strcmp(kind, "grammar")) {
        if (!json_is_string(v)) {
            api_error_set(err, 400, "invalid_request_error", param, "'%s' must be a string", param);
            return NULL;
        }
        const char *s = json_string_value(v);
        size_t n = json_string_length(v);
        c = kind[0] == 'r' ? gr_compile_regex(s, n, msg, sizeof msg)
                           : gr_compile_gbnf(s, n, msg, sizeof msg);
    } else { /* choice */
        size_t n = json_is_array(v) ? json_array_size(v) : 0;
        const char **choices = pl_xcalloc(n + 1, sizeof *choices);
        size_t *lens = pl_xcalloc(n + 1, sizeof *lens);
        int ok = n > 0;
        for (size_t i = 0; ok && i < n; i++) {
            json_t *s = json_array_get(v, i);
            ok = json_is_string(s);
            choices[i] = ok ? json_string_value(s) : NULL;
            lens[i] = ok ? json_string_length(s) : 0;
        }
        if (ok)
            c = gr_compile_choice(choices, lens, (int)n, msg, sizeof msg);
        free(choices);
        free(lens);
        if (!ok) {
            api_error_set(err, 400, "invalid_request_error", param,
                          "'%s' must be a non-empty list of strings", param);
            return NULL;
        }
    }
    if (!c)
        api_error_set(err, 400, "invalid_request_error", param, "'%s': %s", param, msg);
    return c;
}

/* response_format: text (no constraint), json_object, or json_schema {json_schema: {schema}}. */
static GrCompiled *response_format(json_t *rf, ApiError *err, int *none) {
    const char *type = json_string_value(json_object_get(rf, "type"));
    if (!json_is_object(rf) || !type) {
        api_error_set(err, 400, "invalid_request_error", "response_format",
                      "'response_format' must be an object with a 'type'");
        return NULL;
    }
    if (!strcmp(type, "text")) {
        *none = 1;
        return NULL;
    }
    if (!strcmp(type, "json_object"))
        return compile("json_object", NULL, "response_format", err);
    if (!strcmp(type, "json_schema")) {
        json_t *schema = json_object_get(json_object_get(rf, "json_schema"), "schema");
        if (!schema) {
            api_error_set(err, 400, "invalid_request_error", "response_format",
                          "'response_format' of type json_schema needs json_schema.schema");
            return NULL;
        }
        return compile("json", schema, "response_format.json_schema.schema", err);
    }
    api_error_set(err, 400, "invalid_request_error", "response_format",
                  "'response_format' type '%s' is not one of text, json_object, json_schema", type);
    return NULL;
}

int api_parse_constraint(json_t *o, GrCompiled **out, ApiError *err) {
    static const char *const guided[][2] = {{"guided_json", "json"},
                                            {"guided_regex", "regex"},
                                            {"guided_choice", "choice"},
                                            {"guided_grammar", "grammar"}};
    static const char *const structured[] = {"json", "json_object", "regex", "choice", "grammar"};
    *out = NULL;
    const char *given = NULL;
    json_t *so = json_object_get(o, "structured_outputs");
    for (const char *const *k =
             (const char *const[]){"response_format", "guided_json", "guided_regex",
                                   "guided_choice", "guided_grammar", "structured_outputs", NULL};
         *k; k++) {
        json_t *v = json_object_get(o, *k);
        if (!v || json_is_null(v))
            continue;
        if (given) {
            api_error_set(err, 400, "invalid_request_error", *k,
                          "only one structured-output constraint per request ('%s' and '%s')",
                          given, *k);
            return -1;
        }
        given = *k;
    }
    if (!given)
        return 0;
    int none = 0;
    if (!strcmp(given, "response_format")) {
        *out = response_format(json_object_get(o, given), err, &none);
    } else if (!strcmp(given, "structured_outputs")) {
        const char *kind = NULL;
        json_t *v = NULL;
        for (size_t i = 0; json_is_object(so) && i < sizeof structured / sizeof *structured; i++)
            if ((v = json_object_get(so, structured[i])) && !json_is_null(v)) {
                kind = structured[i];
                break;
            }
        if (!kind) {
            api_error_set(err, 400, "invalid_request_error", "structured_outputs",
                          "'structured_outputs' must hold one of json, json_object, regex, "
                          "choice, grammar");
            return -1;
        }
        *out = compile(kind, v, "structured_outputs", err);
    } else {
        for (size_t i = 0; i < sizeof guided / sizeof *guided; i++)
            if (!strcmp(given, guided[i][0]))
                *out = compile(guided[i][1], json_object_get(o, given), given, err);
    }
    return *out || none ? 0 : -1;
}
