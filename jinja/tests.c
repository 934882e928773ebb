/* tests.c - jinja2's tests (`x is defined`, `is string`, `is divisibleby 3`, `is equalto`,
 * ...), used by `is` expressions and by select / reject / selectattr / rejectattr. */
#include "jinja_int.h"

#include <string.h>

static int mod_is(JRender *r, int line, JValue v, JValue by, int64_t want) {
    JValue m = jinja_binop(r, line, OP_MOD, v, by);
    return jinja_equal(m, jinja_int(want));
}

int jinja_has_test(const char *name) {
    static const char *const T[] = {
        "boolean", "callable", "defined",  "divisibleby", "eq",       "equalto", "escaped",
        "even",    "false",    "filter",   "float",       "ge",       "gt",      "greaterthan",
        "in",      "integer",  "iterable", "le",          "lessthan", "lower",   "lt",
        "mapping", "ne",       "none",     "number",      "odd",      "sameas",  "sequence",
        "string",  "test",     "true",     "undefined",   "upper",    "==",      "!=",
        "<",       "<=",       ">",        ">=",          NULL,
    };
    for (int i = 0; T[i]; i++)
        if (!strcmp(T[i], name))
            return 1;
    return 0;
}

int jinja_test(JRender *r, int line, const char *t, JValue v, JArgs *a) {
    JValue a0 = jinja_arg(a, 0, NULL, jinja_ng());
    if (!strcmp(t, "defined"))
        return v.type != JV_UNDEF;
    if (!strcmp(t, "undefined"))
        return v.type == JV_UNDEF;
    if (!strcmp(t, "none"))
        return v.type == JV_NONE;
    if (!strcmp(t, "string"))
        return v.type == JV_STR;
    if (!strcmp(t, "mapping"))
        return v.type == JV_DICT;
    if (!strcmp(t, "number"))
        return v.type == JV_INT || v.type == JV_FLOAT || v.type == JV_BOOL;
    if (!strcmp(t, "integer"))
        return v.type == JV_INT;
    if (!strcmp(t, "float"))
        return v.type == JV_FLOAT;
    if (!strcmp(t, "boolean"))
        return v.type == JV_BOOL;
    if (!strcmp(t, "true"))
        return v.type == JV_BOOL && v.u.b;
    if (!strcmp(t, "false"))
        return v.type == JV_BOOL && !v.u.b;
    if (!strcmp(t, "iterable"))
        return v.type == JV_STR || v.type == JV_LIST || v.type == JV_DICT || v.type == JV_UNDEF ||
               v.type == JV_LOOP;
    if (!strcmp(t, "sequence"))
        return v.type == JV_STR || v.type == JV_LIST || v.type == JV_DICT || v.type == JV_UNDEF;
    if (!strcmp(t, "callable"))
        return v.type == JV_MACRO || v.type == JV_FUNC || v.type == JV_UNDEF;
    if (!strcmp(t, "escaped"))
        return v.type == JV_STR && (v.flags & JF_MARKUP);
    if (!strcmp(t, "odd"))
        return mod_is(r, line, v, jinja_int(2), 1);
    if (!strcmp(t, "even"))
        return mod_is(r, line, v, jinja_int(2), 0);
    if (!strcmp(t, "divisibleby")) {
        if (!jinja_given(a0))
            jinja_fail(r->cx, line, "divisibleby() missing 1 required positional argument");
        return mod_is(r, line, v, a0, 0);
    }
    if (!strcmp(t, "lower") || !strcmp(t, "upper")) {
        JFunc fn = {.name = t[0] == 'l' ? "islower" : "isupper",
                    .self = jinja_to_str(r->cx, v),
                    .kind = JFN_METHOD};
        JArgs none = {0};
        return jinja_truthy(jinja_method(r, line, &fn, &none));
    }
    if (!strcmp(t, "filter"))
        return v.type == JV_STR && jinja_has_filter(v.u.s->s);
    if (!strcmp(t, "test"))
        return v.type == JV_STR && jinja_has_test(v.u.s->s);
    if (!strcmp(t, "sameas")) {
        if (!jinja_given(a0))
            jinja_fail(r->cx, line, "sameas() missing 1 required positional argument");
        if (v.type != a0.type)
            return 0;
        switch (v.type) {
            case JV_NONE:
            case JV_UNDEF:
                return 1;
            case JV_BOOL:
                return v.u.b == a0.u.b;
            case JV_INT: /* CPython caches small ints */
                return v.u.i == a0.u.i && v.u.i >= -5 && v.u.i <= 256;
            case JV_STR:
                return v.u.s == a0.u.s;
            default:
                return jinja_equal(v, a0) && v.u.l == a0.u.l;
        }
    }
    if (!jinja_given(a0))
        jinja_fail(r->cx, line, "test '%s' needs an argument", t);
    if (!strcmp(t, "eq") || !strcmp(t, "equalto") || !strcmp(t, "=="))
        return jinja_equal(v, a0);
    if (!strcmp(t, "ne") || !strcmp(t, "!="))
        return !jinja_equal(v, a0);
    if (!strcmp(t, "in")) {
        if (a0.type == JV_STR) {
            if (v.type != JV_STR)
                jinja_fail(r->cx, line, "'in <string>' requires string as left operand, not %s",
                           jinja_type_name(v));
            return !v.u.s->len || memmem(a0.u.s->s, a0.u.s->len, v.u.s->s, v.u.s->len);
        }
        if (a0.type == JV_DICT) {
            JValue x;
            return jinja_dict_get(a0.u.d, v, &x);
        }
        JList *l = jinja_iter(r->cx, line, a0);
        for (size_t i = 0; i < l->len; i++)
            if (jinja_equal(l->v[i], v))
                return 1;
        return 0;
    }
    int c = jinja_compare(r->cx, line, v, a0);
    if (!strcmp(t, "lt") || !strcmp(t, "lessthan") || !strcmp(t, "<"))
        return c < 0;
    if (!strcmp(t, "le") || !strcmp(t, "<="))
        return c <= 0;
    if (!strcmp(t, "gt") || !strcmp(t, "greaterthan") || !strcmp(t, ">"))
        return c > 0;
    if (!strcmp(t, "ge") || !strcmp(t, ">="))
        return c >= 0;
    jinja_fail(r->cx, line, "No test named '%s'.", t);
}
