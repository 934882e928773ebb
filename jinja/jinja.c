/* jinja.c - the public API (include/jinja.h): parse a template into a tree kept in its own
 * arena, render it with a JSON context into a fresh arena, and turn the longjmp of any error
 * into a NULL return with the message copied out. */
#include "jinja_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct JinjaTemplate {
    JArena arena;
    JNode **body;
    int nbody;
};

static void set_err(char *err, size_t errlen, const char *msg) {
    if (err && errlen)
        snprintf(err, errlen, "%s", msg);
}

/* Everything that may longjmp runs here, below the setjmp of the caller. */
static JinjaTemplate *parse(JCtx *cx, const char *src, size_t len) {
    int ntok, nbody;
    JToken *toks = jinja_lex(cx, src, len, &ntok);
    JNode **body = jinja_parse_tokens(cx, toks, ntok, &nbody);
    JinjaTemplate *t = malloc(sizeof *t);
    if (!t)
        jinja_fail(cx, 0, "out of memory");
    t->arena = cx->arena;
    t->body = body;
    t->nbody = nbody;
    return t;
}

JinjaTemplate *jinja_parse(const char *src, size_t len, char *err, size_t errlen) {
    JCtx *cx = calloc(1, sizeof *cx);
    if (!cx) {
        set_err(err, errlen, "out of memory");
        return NULL;
    }
    cx->arena.limit = (size_t)1 << 30;
    if (setjmp(cx->jb)) {
        set_err(err, errlen, cx->msg);
        jinja_arena_free(&cx->arena);
        free(cx);
        return NULL;
    }
    JinjaTemplate *t = parse(cx, src ? src : "", src ? len : 0);
    free(cx);
    set_err(err, errlen, "");
    return t;
}

char *jinja_render_opts(const JinjaTemplate *t, json_t *context, const JinjaRenderOptions *opts,
                        size_t *out_len, int *raised, char *err, size_t errlen) {
    if (raised)
        *raised = 0;
    if (!t) {
        set_err(err, errlen, "no template");
        return NULL;
    }
    JCtx *cx = calloc(1, sizeof *cx);
    if (!cx) {
        set_err(err, errlen, "out of memory");
        return NULL;
    }
    size_t max_output = opts && opts->max_output ? opts->max_output : (size_t)64 << 20;
    cx->arena.limit = max_output * 4 > ((size_t)256 << 20) ? max_output * 4 : (size_t)256 << 20;
    if (setjmp(cx->jb)) {
        set_err(err, errlen, cx->msg);
        if (raised)
            *raised = cx->raised;
        jinja_arena_free(&cx->arena);
        free(cx);
        return NULL;
    }
    JRender r = {.cx = cx, .now = opts ? opts->now : 0, .max_output = max_output};
    if (context && !json_is_object(context))
        jinja_fail(cx, 0, "the context must be a JSON object");
    r.context = context ? jinja_from_json(cx, context).u.d : NULL;
    JBuf out = {0};
    jinja_buf_put(cx, &out, "", 0);
    r.out = &out;
    Scope *root = jinja_alloc(cx, sizeof *root);
    jinja_exec(&r, root, t->body, t->nbody);
    char *result = malloc(out.len + 1);
    if (!result)
        jinja_fail(cx, 0, "out of memory");
    memcpy(result, out.p, out.len + 1);
    if (out_len)
        *out_len = out.len;
    jinja_arena_free(&cx->arena);
    free(cx);
    set_err(err, errlen, "");
    return result;
}

char *jinja_render(const JinjaTemplate *t, json_t *context, size_t *out_len, char *err,
                   size_t errlen) {
    return jinja_render_opts(t, context, NULL, out_len, NULL, err, errlen);
}

void jinja_free(JinjaTemplate *t) {
    if (!t)
        return;
    jinja_arena_free(&t->arena);
    free(t);
}
