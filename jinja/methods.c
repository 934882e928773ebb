/* methods.c - call arguments, the arithmetic operators with Python's semantics (floor division
 * and modulo round toward minus infinity, / always gives a float, "%" formats strings), the
 * methods of dict and list as the sandbox allows them (str's are in strings.c), and the global
 * functions of transformers' environment: range, namespace, dict, raise_exception and
 * strftime_now.
 *
 * Methods that change a list or dict (append, pop, update, ...) are "unsafe" in jinja2's
 * ImmutableSandboxedEnvironment: reading them gives an undefined value, calling them fails. */
#include "jinja_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char jinja_not_given[] = "<not given>";

JValue jinja_arg(JArgs *a, int i, const char *name, JValue def) {
    if (i >= 0 && i < a->n)
        return a->v[i];
    if (name)
        for (int k = 0; k < a->nkw; k++)
            if (!strcmp(a->kwnames[k], name))
                return a->kw[k];
    return def;
}

void jinja_check_args(JRender *r, int line, JArgs *a, int maxpos, const char *const *kwnames,
                      const char *what) {
    if (a->n > maxpos)
        jinja_fail(r->cx, line, "%s() takes at most %d positional argument(s) (%d given)", what,
                   maxpos, a->n);
    for (int k = 0; k < a->nkw; k++) {
        int ok = 0;
        for (int i = 0; kwnames && kwnames[i]; i++)
            if (!strcmp(kwnames[i], a->kwnames[k]))
                ok = 1;
        if (!ok)
            jinja_fail(r->cx, line, "%s() got an unexpected keyword argument '%s'", what,
                       a->kwnames[k]);
    }
}

JStr *jinja_want_str(JRender *r, int line, JValue v, const char *what) {
    if (v.type != JV_STR)
        jinja_fail(r->cx, line, "%s must be str, not %s", what, jinja_type_name(v));
    return v.u.s;
}

int64_t jinja_want_int(JRender *r, int line, JValue v, const char *what) {
    if (v.type == JV_INT)
        return v.u.i;
    if (v.type == JV_BOOL)
        return v.u.b;
    if (v.type == JV_UNDEF && jinja_given(v))
        jinja_fail(r->cx, line, "%s", v.u.undef ? v.u.undef : "undefined value");
    jinja_fail(r->cx, line, "%s must be an integer, not %s", what, jinja_type_name(v));
}

/* ---- arithmetic ---- */

static int is_num(JValue v) {
    return v.type == JV_INT || v.type == JV_FLOAT || v.type == JV_BOOL;
}

static int64_t ival(JValue v) {
    return v.type == JV_INT ? v.u.i : v.u.b;
}

static double fval(JValue v) {
    return v.type == JV_FLOAT ? v.u.f : (double)ival(v);
}

static const char *op_sym(int op) {
    switch (op) {
        case OP_ADD:
            return "+";
        case OP_SUB:
            return "-";
        case OP_MUL:
            return "*";
        case OP_DIV:
            return "/";
        case OP_FLOORDIV:
            return "//";
        case OP_MOD:
            return "%";
        default:
            return "** or pow()";
    }
}

void jinja_escape_html(JCtx *cx, JBuf *b, JValue v) {
    if (v.type == JV_STR && (v.flags & JF_MARKUP)) {
        jinja_buf_put(cx, b, v.u.s->s, v.u.s->len);
        return;
    }
    JValue s = jinja_to_str(cx, v);
    for (size_t i = 0; i < s.u.s->len; i++) {
        char c = s.u.s->s[i];
        const char *e = c == '&'    ? "&amp;"
                        : c == '<'  ? "&lt;"
                        : c == '>'  ? "&gt;"
                        : c == '"'  ? "&#34;"
                        : c == '\'' ? "&#39;"
                                    : NULL;
        if (e)
            jinja_buf_put(cx, b, e, strlen(e));
        else
            jinja_buf_putc(cx, b, c);
    }
}

static JValue repeat(JRender *r, int line, JValue seq, int64_t times) {
    JCtx *cx = r->cx;
    if (times < 0)
        times = 0;
    if (seq.type == JV_STR) {
        if (seq.u.s->len && (uint64_t)times > r->max_output / seq.u.s->len)
            jinja_fail(cx, line, "a string is larger than %zu bytes", r->max_output);
        JBuf b = {0};
        jinja_buf_put(cx, &b, "", 0);
        for (int64_t i = 0; i < times; i++)
            jinja_buf_put(cx, &b, seq.u.s->s, seq.u.s->len);
        return jinja_strbuf(cx, &b);
    }
    if (seq.u.l->len && (uint64_t)times > 1000000 / seq.u.l->len)
        jinja_fail(cx, line, "a list is too long");
    JValue out = jinja_list_new(cx, seq.u.l->len * (size_t)times);
    out.flags = seq.flags & JF_TUPLE;
    for (int64_t i = 0; i < times; i++)
        for (size_t k = 0; k < seq.u.l->len; k++)
            jinja_list_push(cx, out.u.l, seq.u.l->v[k]);
    return out;
}

JValue jinja_binop(JRender *r, int line, int op, JValue a, JValue b) {
    JCtx *cx = r->cx;
    if (a.type == JV_UNDEF || b.type == JV_UNDEF) {
        JValue u = a.type == JV_UNDEF ? a : b;
        jinja_fail(cx, line, "%s", u.u.undef ? u.u.undef : "undefined value");
    }
    if (is_num(a) && is_num(b)) {
        int ints = a.type != JV_FLOAT && b.type != JV_FLOAT;
        int64_t x = ints ? ival(a) : 0, y = ints ? ival(b) : 0, z;
        double fx = fval(a), fy = fval(b);
        switch (op) {
            case OP_ADD:
                if (!ints)
                    return jinja_float(fx + fy);
                if (__builtin_add_overflow(x, y, &z))
                    jinja_fail(cx, line, "integer overflow");
                return jinja_int(z);
            case OP_SUB:
                if (!ints)
                    return jinja_float(fx - fy);
                if (__builtin_sub_overflow(x, y, &z))
                    jinja_fail(cx, line, "integer overflow");
                return jinja_int(z);
            case OP_MUL:
                if (!ints)
                    return jinja_float(fx * fy);
                if (__builtin_mul_overflow(x, y, &z))
                    jinja_fail(cx, line, "integer overflow");
                return jinja_int(z);
            case OP_DIV:
                if (fy == 0.0)
                    jinja_fail(cx, line, "division by zero");
                return jinja_float(fx / fy);
            case OP_FLOORDIV:
            case OP_MOD:
                if (ints) {
                    if (!y)
                        jinja_fail(cx, line, "integer division or modulo by zero");
                    if (x == INT64_MIN && y == -1)
                        jinja_fail(cx, line, "integer overflow");
                    int64_t q = x / y, m = x % y;
                    if (m && ((m < 0) != (y < 0))) {
                        m += y;
                        q--;
                    }
                    return jinja_int(op == OP_MOD ? m : q);
                }
                if (fy == 0.0)
                    jinja_fail(cx, line, "float division by zero");
                {
                    double mod = fmod(fx, fy), div = (fx - mod) / fy, fd;
                    if (mod) {
                        if ((fy < 0) != (mod < 0)) {
                            mod += fy;
                            div -= 1.0;
                        }
                    } else {
                        mod = copysign(0.0, fy);
                    }
                    if (div) {
                        fd = floor(div);
                        if (div - fd > 0.5)
                            fd += 1.0;
                    } else {
                        fd = copysign(0.0, fx / fy);
                    }
                    return jinja_float(op == OP_MOD ? mod : fd);
                }
            default: /* OP_POW */
                if (ints && y >= 0) {
                    int64_t result = 1, base = x;
                    for (int64_t e = y; e > 0; e >>= 1) {
                        if ((e & 1) && __builtin_mul_overflow(result, base, &result))
                            jinja_fail(cx, line, "integer overflow");
                        if (e > 1 && __builtin_mul_overflow(base, base, &base))
                            jinja_fail(cx, line, "integer overflow");
                    }
                    return jinja_int(result);
                }
                if (fx == 0.0 && fy < 0)
                    jinja_fail(cx, line, "0.0 cannot be raised to a negative power");
                return jinja_float(pow(fx, fy));
        }
    }
    if (op == OP_ADD && a.type == JV_STR && b.type == JV_STR) {
        JBuf buf = {0};
        jinja_buf_put(cx, &buf, "", 0);
        int markup = (a.flags | b.flags) & JF_MARKUP;
        if (markup) { /* Markup + str escapes the plain side */
            jinja_escape_html(cx, &buf, a);
            jinja_escape_html(cx, &buf, b);
        } else {
            if (a.u.s->len + b.u.s->len > r->max_output)
                jinja_fail(cx, line, "a string is larger than %zu bytes", r->max_output);
            jinja_buf_put(cx, &buf, a.u.s->s, a.u.s->len);
            jinja_buf_put(cx, &buf, b.u.s->s, b.u.s->len);
        }
        JValue v = jinja_strbuf(cx, &buf);
        v.flags = (uint8_t)markup;
        return v;
    }
    if (op == OP_ADD && a.type == JV_LIST && b.type == JV_LIST &&
        (a.flags & JF_TUPLE) == (b.flags & JF_TUPLE)) {
        JValue out = jinja_list_new(cx, a.u.l->len + b.u.l->len);
        out.flags = a.flags & JF_TUPLE;
        for (size_t i = 0; i < a.u.l->len; i++)
            jinja_list_push(cx, out.u.l, a.u.l->v[i]);
        for (size_t i = 0; i < b.u.l->len; i++)
            jinja_list_push(cx, out.u.l, b.u.l->v[i]);
        return out;
    }
    if (op == OP_MUL && (a.type == JV_STR || a.type == JV_LIST) &&
        (b.type == JV_INT || b.type == JV_BOOL))
        return repeat(r, line, a, ival(b));
    if (op == OP_MUL && (b.type == JV_STR || b.type == JV_LIST) &&
        (a.type == JV_INT || a.type == JV_BOOL))
        return repeat(r, line, b, ival(a));
    if (op == OP_MOD && a.type == JV_STR)
        return jinja_str_percent(r, line, a.u.s, b);
    if (op == OP_ADD && a.type == JV_STR)
        jinja_fail(cx, line, "can only concatenate str (not \"%s\") to str", jinja_type_name(b));
    if (op == OP_ADD && a.type == JV_LIST)
        jinja_fail(cx, line, "can only concatenate %s (not \"%s\") to %s", jinja_type_name(a),
                   jinja_type_name(b), jinja_type_name(a));
    jinja_fail(cx, line, "unsupported operand type(s) for %s: '%s' and '%s'", op_sym(op),
               jinja_type_name(a), jinja_type_name(b));
}

/* ---- method tables ---- */

static const char *const STR_METHODS[] = {
    "capitalize",   "center",       "count",    "endswith", "find",       "format",
    "index",        "isalnum",      "isalpha",  "isdigit",  "islower",    "isspace",
    "isupper",      "join",         "ljust",    "lower",    "lstrip",     "partition",
    "removeprefix", "removesuffix", "replace",  "rfind",    "rindex",     "rjust",
    "rpartition",   "rsplit",       "rstrip",   "split",    "splitlines", "startswith",
    "strip",        "title",        "upper",    "zfill",    "isdecimal",  "isnumeric",
    "istitle",      "swapcase",     "casefold", NULL,
};
static const char *const DICT_METHODS[] = {"items", "keys", "values", "get", "copy", NULL};
static const char *const DICT_UNSAFE[] = {"clear", "pop", "popitem", "setdefault", "update", NULL};
static const char *const LIST_METHODS[] = {"index", "count", "copy", NULL};
static const char *const LIST_UNSAFE[] = {"append", "clear",  "pop",    "reverse", "insert",
                                          "sort",   "extend", "remove", NULL};

static int listed(const char *const *list, const char *name) {
    for (int i = 0; list[i]; i++)
        if (!strcmp(list[i], name))
            return 1;
    return 0;
}

int jinja_is_method(JValue self, const char *name, int *unsafe) {
    *unsafe = 0;
    switch (self.type) {
        case JV_STR:
            return listed(STR_METHODS, name);
        case JV_DICT:
            if (listed(DICT_UNSAFE, name))
                return *unsafe = 1;
            return listed(DICT_METHODS, name);
        case JV_LIST:
            if (!(self.flags & JF_TUPLE) && listed(LIST_UNSAFE, name))
                return *unsafe = 1;
            return listed(LIST_METHODS, name) && (strcmp(name, "copy") || !(self.flags & JF_TUPLE));
        default:
            return 0;
    }
}

JValue jinja_method(JRender *r, int line, JFunc *fn, JArgs *a) {
    JCtx *cx = r->cx;
    JValue self = fn->self;
    const char *m = fn->name;
    if (fn->kind == JFN_LOOP_CYCLE) {
        JLoop *L = self.u.loop;
        if (!strcmp(m, "cycle")) {
            if (!a->n)
                jinja_fail(cx, line, "no items for cycling given");
            return a->v[L->index0 % (size_t)a->n];
        }
        JValue now = jinja_list_new(cx, (size_t)a->n);
        now.flags = JF_TUPLE;
        for (int i = 0; i < a->n; i++)
            jinja_list_push(cx, now.u.l, a->v[i]);
        if (L->changed_set && jinja_equal(L->lastchanged, now))
            return jinja_bool(0);
        L->lastchanged = now;
        L->changed_set = 1;
        return jinja_bool(1);
    }
    if (self.type == JV_STR)
        return jinja_str_method(r, line, m, self.u.s, self, a);
    if (self.type == JV_DICT) {
        JDict *d = self.u.d;
        if (!strcmp(m, "get")) {
            JValue v;
            if (a->n < 1)
                jinja_fail(cx, line, "get expected at least 1 argument, got 0");
            if (jinja_dict_get(d, a->v[0], &v))
                return v;
            return jinja_arg(a, 1, NULL, jinja_none());
        }
        if (!strcmp(m, "copy")) {
            JValue out = jinja_dict_new(cx, d->len);
            for (size_t i = 0; i < d->len; i++)
                jinja_dict_set(cx, out.u.d, d->k[i], d->v[i]);
            return out;
        }
        JValue out = jinja_list_new(cx, d->len);
        for (size_t i = 0; i < d->len; i++) {
            if (!strcmp(m, "keys")) {
                jinja_list_push(cx, out.u.l, d->k[i]);
            } else if (!strcmp(m, "values")) {
                jinja_list_push(cx, out.u.l, d->v[i]);
            } else {
                JValue pair = jinja_list_new(cx, 2);
                pair.flags = JF_TUPLE;
                jinja_list_push(cx, pair.u.l, d->k[i]);
                jinja_list_push(cx, pair.u.l, d->v[i]);
                jinja_list_push(cx, out.u.l, pair);
            }
        }
        return out;
    }
    if (self.type == JV_LIST) {
        JList *l = self.u.l;
        if (!strcmp(m, "copy"))
            return self;
        if (a->n < 1)
            jinja_fail(cx, line, "%s() takes exactly one argument (0 given)", m);
        int64_t count = 0;
        for (size_t i = 0; i < l->len; i++)
            if (jinja_equal(l->v[i], a->v[0])) {
                if (!strcmp(m, "index"))
                    return jinja_int((int64_t)i);
                count++;
            }
        if (!strcmp(m, "index"))
            jinja_fail(cx, line, "list.index(x): x not in list");
        return jinja_int(count);
    }
    jinja_fail(cx, line, "'%s' object has no method '%s'", jinja_type_name(self), m);
}

/* ---- globals ---- */

static const char *const GLOBALS[] = {"range",           "namespace",    "dict",
                                      "raise_exception", "strftime_now", "cycler",
                                      "joiner",          "lipsum",       NULL};

JValue jinja_lookup_global(JCtx *cx, const char *name) {
    for (int i = 0; GLOBALS[i]; i++)
        if (!strcmp(GLOBALS[i], name))
            return jinja_func(cx, GLOBALS[i], jinja_undef(NULL), JFN_GLOBAL);
    return jinja_undef(NULL);
}

/* dict(*args, **kwargs) into d: a mapping or an iterable of pairs, then the keywords. */
static void fill_dict(JRender *r, int line, JDict *d, JArgs *a) {
    JCtx *cx = r->cx;
    if (a->n > 1)
        jinja_fail(cx, line, "dict expected at most 1 argument, got %d", a->n);
    if (a->n == 1) {
        JValue src = a->v[0];
        if (src.type == JV_DICT || src.type == JV_NS) {
            for (size_t i = 0; i < src.u.d->len; i++)
                jinja_dict_set(cx, d, src.u.d->k[i], src.u.d->v[i]);
        } else {
            JList *items = jinja_iter(cx, line, src);
            for (size_t i = 0; i < items->len; i++) {
                JList *pair = jinja_iter(cx, line, items->v[i]);
                if (pair->len != 2)
                    jinja_fail(cx, line,
                               "dictionary update sequence element #%zu has length %zu; 2 is "
                               "required",
                               i, pair->len);
                jinja_dict_set(cx, d, pair->v[0], pair->v[1]);
            }
        }
    }
    for (int k = 0; k < a->nkw; k++)
        jinja_dict_set(cx, d, jinja_cstr(cx, a->kwnames[k]), a->kw[k]);
}

JValue jinja_global_call(JRender *r, int line, JFunc *fn, JArgs *a) {
    JCtx *cx = r->cx;
    const char *g = fn->name;
    if (!strcmp(g, "raise_exception")) {
        JBuf b = {0};
        jinja_buf_put(cx, &b, "", 0);
        if (a->n)
            jinja_put_str(cx, &b, a->v[0]);
        cx->raised = 1;
        snprintf(cx->msg, sizeof cx->msg, "%s", b.p);
        longjmp(cx->jb, 1);
    }
    if (!strcmp(g, "range")) {
        if (a->nkw)
            jinja_fail(cx, line, "range() takes no keyword arguments");
        if (a->n < 1 || a->n > 3)
            jinja_fail(cx, line, "range expected 1 to 3 arguments, got %d", a->n);
        int64_t start = 0, stop, step = 1;
        if (a->n == 1) {
            stop = jinja_want_int(r, line, a->v[0], "range() argument");
        } else {
            start = jinja_want_int(r, line, a->v[0], "range() argument");
            stop = jinja_want_int(r, line, a->v[1], "range() argument");
            if (a->n == 3)
                step = jinja_want_int(r, line, a->v[2], "range() argument");
        }
        if (!step)
            jinja_fail(cx, line, "range() arg 3 must not be zero");
        int64_t n = step > 0 ? (stop > start ? (stop - start + step - 1) / step : 0)
                             : (start > stop ? (start - stop - step - 1) / -step : 0);
        if (n > 100000)
            jinja_fail(cx, line,
                       "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        JValue out = jinja_list_new(cx, (size_t)n);
        for (int64_t i = 0; i < n; i++)
            jinja_list_push(cx, out.u.l, jinja_int(start + i * step));
        return out;
    }
    if (!strcmp(g, "namespace") || !strcmp(g, "dict")) {
        JValue d = jinja_dict_new(cx, (size_t)a->nkw);
        fill_dict(r, line, d.u.d, a);
        if (g[0] == 'n')
            d.type = JV_NS;
        return d;
    }
    if (!strcmp(g, "strftime_now")) {
        if (a->n != 1 || a->v[0].type != JV_STR)
            jinja_fail(cx, line, "strftime_now() takes one format string");
        struct tm tm;
        time_t t = r->now ? (time_t)r->now : time(NULL);
        if (r->now)
            gmtime_r(&t, &tm);
        else
            localtime_r(&t, &tm);
        const char *fmt = a->v[0].u.s->s;
        if (!*fmt)
            return jinja_str(cx, "", 0);
        for (size_t cap = 256; cap <= 65536; cap *= 4) {
            char *buf = jinja_alloc(cx, cap);
            size_t n = strftime(buf, cap, fmt, &tm);
            if (n)
                return jinja_str(cx, buf, n);
        }
        return jinja_str(cx, "", 0);
    }
    jinja_fail(cx, line, "the global function %s() is not supported", g);
}
