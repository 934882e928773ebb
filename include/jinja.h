/* jinja.h - a Jinja template engine in C for the subset Hugging Face chat templates use.
 *
 * Renders a model's chat_template (tokenizer_config.json or chat_template.jinja) the way
 * transformers' apply_chat_template does: jinja2's ImmutableSandboxedEnvironment with
 * trim_blocks and lstrip_blocks, the loopcontrols extension ({% break %}, {% continue %}), a
 * `tojson` filter that is json.dumps(ensure_ascii=False), and the globals raise_exception(msg)
 * and strftime_now(format). The context (messages, tools, add_generation_prompt, bos_token,
 * kwargs) is a JSON object; its values behave as Python's dicts, lists, strings and numbers do
 * in jinja2, and the output is byte-equal to jinja2's. docs/ARCHITECTURE.md lists the subset;
 * tests/test_jinja.c checks each feature and compares real templates with Python's jinja2.
 *
 * A JinjaTemplate is immutable once parsed: any number of threads may render it at once. */
#ifndef PAGELLM_JINJA_H
#define PAGELLM_JINJA_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

typedef struct JinjaTemplate JinjaTemplate;

/* Options of one render; a zeroed struct (or NULL) gives the defaults. */
typedef struct {
    int64_t now;       /* strftime_now's clock: seconds since the epoch, formatted as UTC;
                          0 = the current time in the local time zone (Python's datetime.now()) */
    size_t max_output; /* bytes of output (and of any string built) before the render fails;
                          0 = 64 MiB. A render's memory is bounded as well: 4 x max_output,
                          at least 256 MiB. */
} JinjaRenderOptions;

/* Parse `len` bytes of template source. Returns NULL on a syntax error, with a message in
 * err (errlen bytes, always NUL-terminated when errlen > 0) that names the line and column:
 * "line 3 column 12: unexpected '}'". The caller frees the template with jinja_free. */
JinjaTemplate *jinja_parse(const char *src, size_t len, char *err, size_t errlen);

/* Render with `context` (a JSON object whose keys are the template's variables, or NULL for
 * none); the context is only read. Returns a malloc'd NUL-terminated string (the caller frees
 * it) and its length in *out_len (when out_len is not NULL: the text may hold NUL bytes).
 * Returns NULL on a render error with the message in err: raise_exception("msg") gives exactly
 * "msg"; other errors (an attribute of an undefined value, a type error, a call of a list's
 * append in the sandbox) name the line, with jinja2's text: "line 7: 'tools' is undefined". */
char *jinja_render(const JinjaTemplate *t, json_t *context, size_t *out_len, char *err,
                   size_t errlen);

/* jinja_render with options (opts may be NULL). *raised (when raised is not NULL) is set to 1
 * when the error came from raise_exception in the template, else 0. */
char *jinja_render_opts(const JinjaTemplate *t, json_t *context, const JinjaRenderOptions *opts,
                        size_t *out_len, int *raised, char *err, size_t errlen);

/* Bytes of Python whitespace (str.isspace) that s[0..n) starts / ends with: s.strip() is
 * s[prefix .. n - suffix). For callers that cut rendered text as transformers does. */
size_t jinja_ws_prefix(const char *s, size_t n);
size_t jinja_ws_suffix(const char *s, size_t n);

/* Free a template; jinja_free(NULL) is a no-op. */
void jinja_free(JinjaTemplate *t);

#endif
