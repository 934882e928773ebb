/* value.c - the value model: constructors, JSON context to values, and Python's str(),
 * repr(), ==, <, truthiness, len() and iteration over the values a template sees.
 *
 * Floats print as Python's repr (the shortest string that reads back the same, exponent form
 * outside 1e-4 <= |x| < 1e16), so "{{ 1/3 }}" and tool schemas with numbers match jinja2. */
#include "jinja_int.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- constructors ---- */

JValue jinja_undef(const char *msg) {
    JValue v = {.type = JV_UNDEF};
    v.u.undef = msg;
    return v;
}

JValue jinja_none(void) {
    return (JValue){.type = JV_NONE};
}

JValue jinja_bool(int b) {
    JValue v = {.type = JV_BOOL};
    v.u.b = b != 0;
    return v;
}

JValue jinja_int(int64_t i) {
    JValue v = {.type = JV_INT};
    v.u.i = i;
    return v;
}

JValue jinja_float(double f) {
    JValue v = {.type = JV_FLOAT};
    v.u.f = f;
    return v;
}

JValue jinja_str(JCtx *cx, const char *s, size_t n) {
    JStr *js = jinja_alloc(cx, sizeof *js + n + 1);
    js->len = n;
    if (n)
        memcpy(js->s, s, n);
    js->s[n] = 0;
    JValue v = {.type = JV_STR};
    v.u.s = js;
    return v;
}

JValue jinja_cstr(JCtx *cx, const char *s) {
    return jinja_str(cx, s, strlen(s));
}

JValue jinja_strbuf(JCtx *cx, const JBuf *b) {
    return jinja_str(cx, b->p ? b->p : "", b->len);
}

JValue jinja_list_new(JCtx *cx, size_t cap) {
    JList *l = jinja_alloc(cx, sizeof *l);
    l->cap = cap ? cap : 4;
    l->v = jinja_alloc(cx, l->cap * sizeof *l->v);
    JValue v = {.type = JV_LIST};
    v.u.l = l;
    return v;
}

JValue jinja_dict_new(JCtx *cx, size_t cap) {
    JDict *d = jinja_alloc(cx, sizeof *d);
    d->cap = cap ? cap : 4;
    d->k = jinja_alloc(cx, d->cap * sizeof *d->k);
    d->v = jinja_alloc(cx, d->cap * sizeof *d->v);
    JValue v = {.type = JV_DICT};
    v.u.d = d;
    return v;
}

void jinja_list_push(JCtx *cx, JList *l, JValue v) {
    if (l->len == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        JValue *nv = jinja_alloc(cx, cap * sizeof *nv);
        if (l->len)
            memcpy(nv, l->v, l->len * sizeof *nv);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->len++] = v;
}

static int dict_find(const JDict *d, JValue k) {
    for (size_t i = 0; i < d->len; i++)
        if (jinja_equal(d->k[i], k))
            return (int)i;
    return -1;
}

void jinja_dict_set(JCtx *cx, JDict *d, JValue k, JValue v) {
    int i = dict_find(d, k);
    if (i >= 0) {
        d->v[i] = v;
        return;
    }
    if (d->len == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        JValue *nk = jinja_alloc(cx, cap * sizeof *nk), *nv = jinja_alloc(cx, cap * sizeof *nv);
        if (d->len) {
            memcpy(nk, d->k, d->len * sizeof *nk);
            memcpy(nv, d->v, d->len * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->len] = k;
    d->v[d->len++] = v;
}

int jinja_dict_get(const JDict *d, JValue k, JValue *out) {
    int i = dict_find(d, k);
    if (i < 0)
        return 0;
    *out = d->v[i];
    return 1;
}

int jinja_dict_getc(const JDict *d, const char *key, JValue *out) {
    size_t n = strlen(key);
    for (size_t i = 0; i < d->len; i++) {
        JValue k = d->k[i];
        if (k.type == JV_STR && k.u.s->len == n && !memcmp(k.u.s->s, key, n)) {
            *out = d->v[i];
            return 1;
        }
    }
    return 0;
}

JValue jinja_func(JCtx *cx, const char *name, JValue self, int kind) {
    JFunc *fn = jinja_alloc(cx, sizeof *fn);
    fn->name = name;
    fn->self = self;
    fn->kind = kind;
    JValue v = {.type = JV_FUNC};
    v.u.fn = fn;
    return v;
}

JValue jinja_from_json(JCtx *cx, json_t *j) {
    switch (json_typeof(j)) {
        case JSON_OBJECT: {
            JValue d = jinja_dict_new(cx, json_object_size(j));
            const char *key;
            json_t *val;
            json_object_foreach(j, key, val) {
                jinja_dict_set(cx, d.u.d, jinja_cstr(cx, key), jinja_from_json(cx, val));
            }
            return d;
        }
        case JSON_ARRAY: {
            JValue l = jinja_list_new(cx, json_array_size(j));
            size_t i;
            json_t *val;
            json_array_foreach(j, i, val) {
                jinja_list_push(cx, l.u.l, jinja_from_json(cx, val));
            }
            return l;
        }
        case JSON_STRING:
            return jinja_str(cx, json_string_value(j), json_string_length(j));
        case JSON_INTEGER:
            return jinja_int((int64_t)json_integer_value(j));
        case JSON_REAL:
            return jinja_float(json_real_value(j));
        case JSON_TRUE:
            return jinja_bool(1);
        case JSON_FALSE:
            return jinja_bool(0);
        default:
            return jinja_none();
    }
}

/* ---- truthiness, equality, ordering ---- */

int jinja_truthy(JValue v) {
    switch (v.type) {
        case JV_UNDEF:
        case JV_NONE:
            return 0;
        case JV_BOOL:
            return v.u.b;
        case JV_INT:
            return v.u.i != 0;
        case JV_FLOAT:
            return v.u.f != 0.0;
        case JV_STR:
            return v.u.s->len != 0;
        case JV_LIST:
            return v.u.l->len != 0;
        case JV_DICT:
            return v.u.d->len != 0;
        default:
            return 1;
    }
}

static int is_number(JValue v) {
    return v.type == JV_BOOL || v.type == JV_INT || v.type == JV_FLOAT;
}

static double num(JValue v) {
    return v.type == JV_FLOAT ? v.u.f : v.type == JV_INT ? (double)v.u.i : (double)v.u.b;
}

int jinja_equal(JValue a, JValue b) {
    if (is_number(a) && is_number(b)) {
        if (a.type != JV_FLOAT && b.type != JV_FLOAT) {
            int64_t x = a.type == JV_INT ? a.u.i : a.u.b, y = b.type == JV_INT ? b.u.i : b.u.b;
            return x == y;
        }
        return num(a) == num(b);
    }
    if (a.type != b.type)
        return 0;
    switch (a.type) {
        case JV_UNDEF:
        case JV_NONE:
            return 1;
        case JV_STR:
            return a.u.s->len == b.u.s->len && !memcmp(a.u.s->s, b.u.s->s, a.u.s->len);
        case JV_LIST:
            if ((a.flags & JF_TUPLE) != (b.flags & JF_TUPLE) || a.u.l->len != b.u.l->len)
                return 0;
            for (size_t i = 0; i < a.u.l->len; i++)
                if (!jinja_equal(a.u.l->v[i], b.u.l->v[i]))
                    return 0;
            return 1;
        case JV_DICT:
            if (a.u.d->len != b.u.d->len)
                return 0;
            for (size_t i = 0; i < a.u.d->len; i++) {
                JValue other;
                if (!jinja_dict_get(b.u.d, a.u.d->k[i], &other) || !jinja_equal(a.u.d->v[i], other))
                    return 0;
            }
            return 1;
        case JV_NS:
            return a.u.d == b.u.d;
        case JV_MACRO:
            return a.u.m == b.u.m;
        case JV_FUNC:
            return a.u.fn == b.u.fn;
        case JV_LOOP:
            return a.u.loop == b.u.loop;
        default:
            return 0;
    }
}

int jinja_compare(JCtx *cx, int line, JValue a, JValue b) {
    if (a.type == JV_UNDEF || b.type == JV_UNDEF) {
        JValue u = a.type == JV_UNDEF ? a : b;
        jinja_fail(cx, line, "%s", u.u.undef ? u.u.undef : "undefined value");
    }
    if (is_number(a) && is_number(b)) {
        if (a.type != JV_FLOAT && b.type != JV_FLOAT) {
            int64_t x = a.type == JV_INT ? a.u.i : a.u.b, y = b.type == JV_INT ? b.u.i : b.u.b;
            return x < y ? -1 : x > y;
        }
        double x = num(a), y = num(b);
        return x < y ? -1 : x > y;
    }
    if (a.type == JV_STR && b.type == JV_STR) {
        size_t n = a.u.s->len < b.u.s->len ? a.u.s->len : b.u.s->len;
        int c = memcmp(a.u.s->s, b.u.s->s, n);
        if (c)
            return c < 0 ? -1 : 1;
        return a.u.s->len < b.u.s->len ? -1 : a.u.s->len > b.u.s->len;
    }
    if (a.type == JV_LIST && b.type == JV_LIST && (a.flags & JF_TUPLE) == (b.flags & JF_TUPLE)) {
        size_t n = a.u.l->len < b.u.l->len ? a.u.l->len : b.u.l->len;
        for (size_t i = 0; i < n; i++)
            if (!jinja_equal(a.u.l->v[i], b.u.l->v[i]))
                return jinja_compare(cx, line, a.u.l->v[i], b.u.l->v[i]);
        return a.u.l->len < b.u.l->len ? -1 : a.u.l->len > b.u.l->len;
    }
    jinja_fail(cx, line, "'<' not supported between instances of '%s' and '%s'", jinja_type_name(a),
               jinja_type_name(b));
}

const char *jinja_type_name(JValue v) {
    switch (v.type) {
        case JV_UNDEF:
            return "Undefined";
        case JV_NONE:
            return "NoneType";
        case JV_BOOL:
            return "bool";
        case JV_INT:
            return "int";
        case JV_FLOAT:
            return "float";
        case JV_STR:
            return v.flags & JF_MARKUP ? "Markup" : "str";
        case JV_LIST:
            return v.flags & JF_TUPLE ? "tuple" : "list";
        case JV_DICT:
            return "dict";
        case JV_NS:
            return "Namespace";
        case JV_MACRO:
            return "Macro";
        case JV_FUNC:
            return "builtin_function_or_method";
        default:
            return "LoopContext";
    }
}

/* jinja2's object_type_repr: "None", "True", or "<type> object". */
const char *jinja_object_repr(JCtx *cx, JValue v) {
    if (v.type == JV_NONE)
        return "None";
    if (v.type == JV_BOOL)
        return v.u.b ? "True" : "False";
    JBuf b = {0};
    jinja_buf_printf(cx, &b, "%s object", jinja_type_name(v));
    return b.p;
}

/* ---- iteration and length ---- */

JList *jinja_iter(JCtx *cx, int line, JValue v) {
    switch (v.type) {
        case JV_LIST:
            return v.u.l;
        case JV_UNDEF:
            return jinja_list_new(cx, 1).u.l;
        case JV_DICT: {
            JList *l = jinja_list_new(cx, v.u.d->len).u.l;
            for (size_t i = 0; i < v.u.d->len; i++)
                jinja_list_push(cx, l, v.u.d->k[i]);
            return l;
        }
        case JV_STR: {
            JList *l = jinja_list_new(cx, v.u.s->len).u.l;
            const char *s = v.u.s->s;
            size_t n = v.u.s->len;
            for (size_t i = 0; i < n;) {
                size_t j = jinja_utf8_next(s, n, i, NULL);
                jinja_list_push(cx, l, jinja_str(cx, s + i, j - i));
                i = j;
            }
            return l;
        }
        default:
            jinja_fail(cx, line, "'%s' object is not iterable", jinja_type_name(v));
    }
}

int64_t jinja_len(JCtx *cx, int line, JValue v) {
    switch (v.type) {
        case JV_UNDEF:
            return 0;
        case JV_STR:
            return (int64_t)jinja_utf8_count(v.u.s->s, v.u.s->len);
        case JV_LIST:
            return (int64_t)v.u.l->len;
        case JV_DICT:
            return (int64_t)v.u.d->len;
        case JV_LOOP:
            return (int64_t)v.u.loop->items->len;
        default:
            jinja_fail(cx, line, "object of type '%s' has no len()", jinja_type_name(v));
    }
}

/* ---- str() and repr() ---- */

void jinja_put_float(JBuf *b, JCtx *cx, double f) {
    if (isnan(f)) {
        jinja_buf_put(cx, b, "nan", 3);
        return;
    }
    if (isinf(f)) {
        jinja_buf_put(cx, b, f < 0 ? "-inf" : "inf", f < 0 ? 4 : 3);
        return;
    }
    char tmp[40];
    for (int p = 0; p <= 17; p++) { /* the shortest %.*e that reads back as f */
        snprintf(tmp, sizeof tmp, "%.*e", p, f);
        if (strtod(tmp, NULL) == f)
            break;
    }
    /* tmp = [-]d[.ddd]e[+-]xx */
    const char *p = tmp;
    int neg = 0;
    if (*p == '-') {
        neg = 1;
        p++;
    }
    char digits[24];
    int nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9' && nd < 23)
            digits[nd++] = *p;
    int exp10 = *p == 'e' ? atoi(p + 1) : 0;
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    int decpt = exp10 + 1;
    if (f == 0.0) {
        nd = 1;
        digits[0] = '0';
        decpt = 1;
    }
    if (neg)
        jinja_buf_putc(cx, b, '-');
    if (decpt > 16 || decpt < -3) {
        jinja_buf_putc(cx, b, digits[0]);
        if (nd > 1) {
            jinja_buf_putc(cx, b, '.');
            jinja_buf_put(cx, b, digits + 1, (size_t)nd - 1);
        }
        jinja_buf_printf(cx, b, "e%c%02d", decpt - 1 < 0 ? '-' : '+', abs(decpt - 1));
    } else if (decpt <= 0) {
        jinja_buf_put(cx, b, "0.", 2);
        for (int i = 0; i < -decpt; i++)
            jinja_buf_putc(cx, b, '0');
        jinja_buf_put(cx, b, digits, (size_t)nd);
    } else if (decpt >= nd) {
        jinja_buf_put(cx, b, digits, (size_t)nd);
        for (int i = nd; i < decpt; i++)
            jinja_buf_putc(cx, b, '0');
        jinja_buf_put(cx, b, ".0", 2);
    } else {
        jinja_buf_put(cx, b, digits, (size_t)decpt);
        jinja_buf_putc(cx, b, '.');
        jinja_buf_put(cx, b, digits + decpt, (size_t)(nd - decpt));
    }
}

/* Code points Python's str.isprintable() rejects, so repr() escapes them: controls, format
 * characters, separators other than the space, surrogates and private use. */
static int py_unprintable(uint32_t cp) {
    if (cp < 0x20 || (cp >= 0x7f && cp <= 0xa0) || cp == 0xad)
        return 1;
    if (cp < 0x600)
        return 0;
    return (cp >= 0x600 && cp <= 0x605) || cp == 0x61c || cp == 0x6dd || cp == 0x70f ||
           cp == 0x180e || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200f) ||
           (cp >= 0x2028 && cp <= 0x202f) || (cp >= 0x205f && cp <= 0x2064) ||
           (cp >= 0x2066 && cp <= 0x206f) || cp == 0x3000 || (cp >= 0xd800 && cp <= 0xf8ff) ||
           cp == 0xfeff || (cp >= 0xfff9 && cp <= 0xfffb) || cp >= 0xf0000;
}

static void put_str_repr(JCtx *cx, JBuf *b, const char *s, size_t n) {
    int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    jinja_buf_putc(cx, b, q);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t j = jinja_utf8_next(s, n, i, &cp);
        if (cp == (uint32_t)q || cp == '\\') {
            jinja_buf_putc(cx, b, '\\');
            jinja_buf_putc(cx, b, (char)cp);
        } else if (cp == '\t') {
            jinja_buf_put(cx, b, "\\t", 2);
        } else if (cp == '\n') {
            jinja_buf_put(cx, b, "\\n", 2);
        } else if (cp == '\r') {
            jinja_buf_put(cx, b, "\\r", 2);
        } else if (py_unprintable(cp)) {
            if (cp <= 0xff)
                jinja_buf_printf(cx, b, "\\x%02x", cp);
            else if (cp <= 0xffff)
                jinja_buf_printf(cx, b, "\\u%04x", cp);
            else
                jinja_buf_printf(cx, b, "\\U%08x", cp);
        } else {
            jinja_buf_put(cx, b, s + i, j - i);
        }
        i = j;
    }
    jinja_buf_putc(cx, b, q);
}

void jinja_put_repr(JCtx *cx, JBuf *b, JValue v) {
    switch (v.type) {
        case JV_UNDEF:
            jinja_buf_put(cx, b, "Undefined", 9);
            return;
        case JV_STR:
            if (v.flags & JF_MARKUP) {
                jinja_buf_put(cx, b, "Markup(", 7);
                put_str_repr(cx, b, v.u.s->s, v.u.s->len);
                jinja_buf_putc(cx, b, ')');
            } else {
                put_str_repr(cx, b, v.u.s->s, v.u.s->len);
            }
            return;
        case JV_LIST: {
            int tuple = v.flags & JF_TUPLE;
            jinja_buf_putc(cx, b, tuple ? '(' : '[');
            for (size_t i = 0; i < v.u.l->len; i++) {
                if (i)
                    jinja_buf_put(cx, b, ", ", 2);
                jinja_put_repr(cx, b, v.u.l->v[i]);
            }
            if (tuple && v.u.l->len == 1)
                jinja_buf_putc(cx, b, ',');
            jinja_buf_putc(cx, b, tuple ? ')' : ']');
            return;
        }
        case JV_DICT:
        case JV_NS:
            if (v.type == JV_NS)
                jinja_buf_put(cx, b, "<Namespace ", 11);
            jinja_buf_putc(cx, b, '{');
            for (size_t i = 0; i < v.u.d->len; i++) {
                if (i)
                    jinja_buf_put(cx, b, ", ", 2);
                jinja_put_repr(cx, b, v.u.d->k[i]);
                jinja_buf_put(cx, b, ": ", 2);
                jinja_put_repr(cx, b, v.u.d->v[i]);
            }
            jinja_buf_putc(cx, b, '}');
            if (v.type == JV_NS)
                jinja_buf_putc(cx, b, '>');
            return;
        default:
            jinja_put_str(cx, b, v);
    }
}

void jinja_put_str(JCtx *cx, JBuf *b, JValue v) {
    switch (v.type) {
        case JV_UNDEF:
            return;
        case JV_NONE:
            jinja_buf_put(cx, b, "None", 4);
            return;
        case JV_BOOL:
            jinja_buf_put(cx, b, v.u.b ? "True" : "False", v.u.b ? 4 : 5);
            return;
        case JV_INT:
            jinja_buf_printf(cx, b, "%lld", (long long)v.u.i);
            return;
        case JV_FLOAT:
            jinja_put_float(b, cx, v.u.f);
            return;
        case JV_STR:
            jinja_buf_put(cx, b, v.u.s->s, v.u.s->len);
            return;
        case JV_LIST:
        case JV_DICT:
        case JV_NS:
            jinja_put_repr(cx, b, v);
            return;
        case JV_MACRO:
            jinja_buf_printf(cx, b, "<Macro '%s'>", v.u.m->name);
            return;
        case JV_FUNC:
            jinja_buf_printf(cx, b, "<built-in method %s>", v.u.fn->name);
            return;
        default:
            jinja_buf_printf(cx, b, "<LoopContext %zu/%zu>", v.u.loop->index0 + 1,
                             v.u.loop->items->len);
    }
}

JValue jinja_to_str(JCtx *cx, JValue v) {
    if (v.type == JV_STR)
        return v;
    JBuf b = {0};
    jinja_put_str(cx, &b, v);
    return jinja_strbuf(cx, &b);
}
