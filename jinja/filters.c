/* filters.c - jinja2's builtin filters that chat templates use, with jinja2's
 * argument names and its handling of undefined values (length 0, trim "", default's
 * replacement; tojson fails), plus transformers' tojson (json.dumps(x, ensure_ascii=False,
 * indent=None, separators=None, sort_keys=False)).
 *
 * Attribute paths ("function.name", "0") in selectattr / map / join / unique / sort follow
 * jinja2's make_attrgetter: item access part by part, so a missing key is undefined. Filters
 * that return generators in jinja2 (map, select, reverse, items) return lists here: templates
 * only iterate them or apply |list. */
#include "jinja_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Noreturn static void fail_undef(JRender *r, int line, JValue u) {
    jinja_fail(r->cx, line, "%s", u.u.undef ? u.u.undef : "undefined value");
}

/* soft_str: str() of the value, keeping the markup flag of strings */
static JValue soft_str(JRender *r, JValue v) {
    return v.type == JV_STR ? v : jinja_to_str(r->cx, v);
}

static int64_t to_int(JRender *r, int line, JValue v, const char *what) {
    if (v.type == JV_INT)
        return v.u.i;
    if (v.type == JV_BOOL)
        return v.u.b;
    if (v.type == JV_UNDEF)
        fail_undef(r, line, v);
    jinja_fail(r->cx, line, "%s: '%s' object cannot be interpreted as an integer", what,
               jinja_type_name(v));
}

/* ---- attribute getters ---- */

typedef struct {
    int nparts;
    JValue parts[16];
    JValue def; /* default for undefined results (map's default=) or not given */
    int lower;  /* postprocess: lower-case strings (case-insensitive comparisons) */
} Getter;

static void getter_init(JRender *r, int line, Getter *g, JValue attribute, JValue def, int lower) {
    g->nparts = 0;
    g->def = def;
    g->lower = lower;
    if (!jinja_given(attribute) || attribute.type == JV_NONE)
        return;
    if (attribute.type != JV_STR) {
        g->parts[g->nparts++] = attribute;
        return;
    }
    const char *s = attribute.u.s->s;
    size_t n = attribute.u.s->len, start = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && s[i] != '.')
            continue;
        if (g->nparts == 16)
            jinja_fail(r->cx, line, "attribute path too long");
        int digits = i > start;
        for (size_t k = start; k < i; k++)
            if (s[k] < '0' || s[k] > '9')
                digits = 0;
        g->parts[g->nparts++] = digits ? jinja_int(strtoll(s + start, NULL, 10))
                                       : jinja_str(r->cx, s + start, i - start);
        start = i + 1;
    }
}

static JValue getter_apply(JRender *r, int line, const Getter *g, JValue item) {
    for (int i = 0; i < g->nparts; i++) {
        item = jinja_getitem(r, line, item, g->parts[i]);
        if (jinja_given(g->def) && g->def.type != JV_NONE && item.type == JV_UNDEF)
            item = g->def;
    }
    if (g->lower && item.type == JV_STR)
        return jinja_str_case(r->cx, item, JCASE_LOWER);
    return item;
}

/* A stable merge sort of vals by keys (Python's sorted(..., key=, reverse=)). */
static void stable_sort(JRender *r, int line, JValue *keys, JValue *vals, size_t n, int reverse) {
    if (n < 2)
        return;
    JValue *tk = jinja_alloc(r->cx, n * sizeof *tk), *tv = jinja_alloc(r->cx, n * sizeof *tv);
    for (size_t width = 1; width < n; width *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * width) {
            size_t mid = lo + width < n ? lo + width : n,
                   hi = lo + 2 * width < n ? lo + 2 * width : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                int c = jinja_compare(r->cx, line, keys[j], keys[i]);
                int take_right = reverse ? c > 0 : c < 0;
                if (take_right) {
                    tk[k] = keys[j];
                    tv[k++] = vals[j++];
                } else {
                    tk[k] = keys[i];
                    tv[k++] = vals[i++];
                }
            }
            while (i < mid) {
                tk[k] = keys[i];
                tv[k++] = vals[i++];
            }
            while (j < hi) {
                tk[k] = keys[j];
                tv[k++] = vals[j++];
            }
        }
        memcpy(keys, tk, n * sizeof *keys);
        memcpy(vals, tv, n * sizeof *vals);
    }
}

/* ---- filters ---- */

static const char *const FILTERS[] = {
    "abs",        "attr",   "batch",      "capitalize",  "center",  "count",  "d",      "default",
    "dictsort",   "e",      "escape",     "first",       "float",   "format", "indent", "int",
    "items",      "join",   "last",       "length",      "list",    "lower",  "map",    "max",
    "min",        "reject", "rejectattr", "replace",     "reverse", "round",  "safe",   "select",
    "selectattr", "sort",   "string",     "sum",         "title",   "tojson", "trim",   "truncate",
    "unique",     "upper",  "wordcount",  "forceescape", NULL,
};

int jinja_has_filter(const char *name) {
    for (int i = 0; FILTERS[i]; i++)
        if (!strcmp(FILTERS[i], name))
            return 1;
    /* jinja2 builtins this engine does not implement are still filters to `is filter` */
    static const char *const OTHER[] = {"filesizeformat", "groupby",   "pprint",    "random",
                                        "slice",          "striptags", "urlencode", "urlize",
                                        "wordwrap",       "xmlattr",   NULL};
    for (int i = 0; OTHER[i]; i++)
        if (!strcmp(OTHER[i], name))
            return 1;
    return 0;
}

static JValue escape(JRender *r, JValue v) {
    if (v.type == JV_STR && (v.flags & JF_MARKUP))
        return v;
    JBuf b = {0};
    jinja_buf_put(r->cx, &b, "", 0);
    jinja_escape_html(r->cx, &b, v);
    JValue out = jinja_strbuf(r->cx, &b);
    out.flags = JF_MARKUP;
    return out;
}

static JValue f_tojson(JRender *r, int line, JValue v, JArgs *a) {
    static const char *const kw[] = {"ensure_ascii", "indent", "separators", "sort_keys", NULL};
    jinja_check_args(r, line, a, 4, kw, "tojson");
    JValue ea = jinja_arg(a, 0, "ensure_ascii", jinja_bool(0));
    JValue ind = jinja_arg(a, 1, "indent", jinja_none());
    JValue seps = jinja_arg(a, 2, "separators", jinja_none());
    JValue sk = jinja_arg(a, 3, "sort_keys", jinja_bool(0));
    const char *indent = NULL;
    if (ind.type == JV_STR) {
        indent = ind.u.s->s;
    } else if (ind.type != JV_NONE) {
        int64_t n = to_int(r, line, ind, "indent");
        char *sp = jinja_alloc(r->cx, (size_t)(n > 0 ? n : 0) + 1);
        for (int64_t i = 0; i < n; i++)
            sp[i] = ' ';
        indent = sp;
    }
    const char *item_sep = indent ? "," : ", ", *key_sep = ": ";
    if (seps.type != JV_NONE) {
        JList *l = jinja_iter(r->cx, line, seps);
        if (l->len != 2 || l->v[0].type != JV_STR || l->v[1].type != JV_STR)
            jinja_fail(r->cx, line, "separators must be a pair of strings");
        item_sep = l->v[0].u.s->s;
        key_sep = l->v[1].u.s->s;
    }
    JBuf b = {0};
    jinja_buf_put(r->cx, &b, "", 0);
    jinja_put_json(r->cx, line, &b, v, jinja_truthy(ea), indent, item_sep, key_sep,
                   jinja_truthy(sk), 0);
    return jinja_strbuf(r->cx, &b);
}

static JValue f_indent(JRender *r, int line, JValue s, JArgs *a) {
    JCtx *cx = r->cx;
    static const char *const kw[] = {"width", "first", "blank", NULL};
    jinja_check_args(r, line, a, 3, kw, "indent");
    JValue w = jinja_arg(a, 0, "width", jinja_int(4));
    int first = jinja_truthy(jinja_arg(a, 1, "first", jinja_bool(0)));
    int blank = jinja_truthy(jinja_arg(a, 2, "blank", jinja_bool(0)));
    if (s.type == JV_UNDEF)
        fail_undef(r, line, s);
    if (s.type != JV_STR)
        jinja_fail(cx, line, "unsupported operand type(s) for +=: '%s' and 'str'",
                   jinja_type_name(s));
    JBuf ind = {0};
    jinja_buf_put(cx, &ind, "", 0);
    if (w.type == JV_STR)
        jinja_buf_put(cx, &ind, w.u.s->s, w.u.s->len);
    else
        for (int64_t i = to_int(r, line, w, "width"); i > 0; i--)
            jinja_buf_putc(cx, &ind, ' ');
    /* s += "\n"; lines = s.splitlines() */
    JBuf tmp = {0};
    jinja_buf_put(cx, &tmp, s.u.s->s, s.u.s->len);
    jinja_buf_putc(cx, &tmp, '\n');
    JValue full = jinja_strbuf(cx, &tmp);
    JFunc fn = {.name = "splitlines", .self = full, .kind = JFN_METHOD};
    JArgs none = {0};
    JList *lines = jinja_method(r, line, &fn, &none).u.l;
    JBuf b = {0};
    jinja_buf_put(cx, &b, "", 0);
    if (first)
        jinja_buf_put(cx, &b, ind.p, ind.len);
    for (size_t i = 0; i < lines->len; i++) {
        JStr *ln = lines->v[i].u.s;
        if (i) {
            jinja_buf_putc(cx, &b, '\n');
            if (blank || ln->len)
                jinja_buf_put(cx, &b, ind.p, ind.len);
        }
        jinja_buf_put(cx, &b, ln->s, ln->len);
    }
    return jinja_strbuf(cx, &b);
}

/* select / reject / selectattr / rejectattr */
static JValue f_select(JRender *r, int line, JValue seq, JArgs *a, int keep, int attr) {
    JCtx *cx = r->cx;
    JValue out = jinja_list_new(cx, 4);
    if (!jinja_truthy(seq))
        return out;
    Getter g = {0};
    int off = 0;
    if (attr) {
        if (a->n < 1)
            jinja_fail(cx, line, "Missing parameter for attribute name");
        getter_init(r, line, &g, a->v[0], jinja_ng(), 0);
        off = 1;
    }
    const char *test = NULL;
    JArgs targs = {0};
    if (a->n > off) {
        if (a->v[off].type != JV_STR)
            jinja_fail(cx, line, "the test name must be a string");
        test = a->v[off].u.s->s;
        if (!jinja_has_test(test))
            jinja_fail(cx, line, "No test named '%s'.", test);
        targs.n = a->n - off - 1;
        targs.v = a->v + off + 1;
        targs.nkw = a->nkw;
        targs.kwnames = a->kwnames;
        targs.kw = a->kw;
    }
    JList *items = jinja_iter(cx, line, seq);
    for (size_t i = 0; i < items->len; i++) {
        JValue x = attr ? getter_apply(r, line, &g, items->v[i]) : items->v[i];
        int ok = test ? jinja_test(r, line, test, x, &targs) : jinja_truthy(x);
        if (ok == keep)
            jinja_list_push(cx, out.u.l, items->v[i]);
    }
    return out;
}

static JValue f_map(JRender *r, int line, JValue seq, JArgs *a) {
    JCtx *cx = r->cx;
    JValue out = jinja_list_new(cx, 4);
    if (!jinja_truthy(seq))
        return out;
    JList *items = jinja_iter(cx, line, seq);
    if (a->n == 0) {
        JValue attribute = jinja_arg(a, -1, "attribute", jinja_ng());
        if (!jinja_given(attribute))
            jinja_fail(cx, line, "map requires a filter argument");
        for (int k = 0; k < a->nkw; k++)
            if (strcmp(a->kwnames[k], "attribute") && strcmp(a->kwnames[k], "default"))
                jinja_fail(cx, line, "Unexpected keyword argument '%s'", a->kwnames[k]);
        Getter g;
        getter_init(r, line, &g, attribute, jinja_arg(a, -1, "default", jinja_ng()), 0);
        for (size_t i = 0; i < items->len; i++)
            jinja_list_push(cx, out.u.l, getter_apply(r, line, &g, items->v[i]));
        return out;
    }
    if (a->v[0].type != JV_STR)
        jinja_fail(cx, line, "the filter name must be a string");
    const char *name = a->v[0].u.s->s;
    if (!jinja_has_filter(name))
        jinja_fail(cx, line, "No filter named '%s'.", name);
    JArgs fargs = {a->n - 1, a->v + 1, a->nkw, a->kwnames, a->kw};
    for (size_t i = 0; i < items->len; i++)
        jinja_list_push(cx, out.u.l, jinja_filter(r, line, name, items->v[i], &fargs));
    return out;
}

static JValue f_int(JRender *r, int line, JValue v, JArgs *a) {
    JValue def = jinja_arg(a, 0, "default", jinja_int(0));
    JValue basev = jinja_arg(a, 1, "base", jinja_int(10));
    int base = (int)to_int(r, line, basev, "base");
    switch (v.type) {
        case JV_INT:
            return v;
        case JV_BOOL:
            return jinja_int(v.u.b);
        case JV_FLOAT:
            if (isnan(v.u.f) || isinf(v.u.f))
                return def;
            return jinja_int((int64_t)v.u.f);
        case JV_UNDEF:
            fail_undef(r, line, v);
        case JV_STR: {
            /* int(s, base): whitespace around, one sign, single underscores between digits */
            char tmp[128];
            size_t k = 0;
            const char *s = v.u.s->s;
            size_t n = v.u.s->len, b = jinja_ws_prefix(s, n), e = n - jinja_ws_suffix(s, n);
            int ok = e > b && e - b < sizeof tmp;
            for (size_t i = b; ok && i < e; i++) {
                if (s[i] == '_') {
                    ok = i > b && i + 1 < e && s[i - 1] != '_' && s[i + 1] != '_' &&
                         s[i - 1] != '-' && s[i - 1] != '+';
                    continue;
                }
                tmp[k++] = s[i];
            }
            tmp[k] = 0;
            if (ok) {
                char *end;
                long long x = strtoll(tmp, &end, base);
                if (!*end && tmp[0] != ' ')
                    return jinja_int(x);
                double f = strtod(tmp, &end);
                if (!*end && !isnan(f) && !isinf(f))
                    return jinja_int((int64_t)f);
            }
            return def;
        }
        default:
            return def;
    }
}

static JValue f_float(JRender *r, int line, JValue v, JArgs *a) {
    JValue def = jinja_arg(a, 0, "default", jinja_float(0.0));
    switch (v.type) {
        case JV_FLOAT:
            return v;
        case JV_INT:
            return jinja_float((double)v.u.i);
        case JV_BOOL:
            return jinja_float(v.u.b);
        case JV_UNDEF:
            fail_undef(r, line, v);
        case JV_STR: {
            const char *s = v.u.s->s;
            size_t n = v.u.s->len, b = jinja_ws_prefix(s, n), e = n - jinja_ws_suffix(s, n);
            char tmp[128];
            if (e > b && e - b < sizeof tmp) {
                memcpy(tmp, s + b, e - b);
                tmp[e - b] = 0;
                char *end;
                double f = strtod(tmp, &end);
                if (!*end && !strchr(tmp, 'x') && !strchr(tmp, 'X'))
                    return jinja_float(f);
            }
            return def;
        }
        default:
            return def;
    }
}

static JValue f_round(JRender *r, int line, JValue v, JArgs *a) {
    int64_t prec = to_int(r, line, jinja_arg(a, 0, "precision", jinja_int(0)), "precision");
    JValue method = jinja_arg(a, 1, "method", jinja_ng());
    const char *m = jinja_given(method) && method.type == JV_STR ? method.u.s->s : "common";
    if (strcmp(m, "common") && strcmp(m, "ceil") && strcmp(m, "floor"))
        jinja_fail(r->cx, line, "method must be common, ceil or floor");
    if (v.type == JV_UNDEF)
        fail_undef(r, line, v);
    if (v.type != JV_INT && v.type != JV_FLOAT && v.type != JV_BOOL)
        jinja_fail(r->cx, line, "type %s doesn't define __round__ method", jinja_type_name(v));
    double f = v.type == JV_FLOAT ? v.u.f : v.type == JV_INT ? (double)v.u.i : v.u.b;
    if (!strcmp(m, "common")) {
        if (v.type != JV_FLOAT) { /* round(int, n): an int, halves to even */
            int64_t i = v.type == JV_INT ? v.u.i : v.u.b, p = 1;
            for (int64_t k = prec; k < 0 && p <= INT64_MAX / 10; k++)
                p *= 10;
            if (prec >= 0 || p == 1)
                return jinja_int(i);
            int64_t q = i / p, rem = i % p;
            if (rem < 0) {
                rem += p;
                q--;
            }
            if (rem * 2 > p || (rem * 2 == p && (q & 1)))
                q++;
            return jinja_int(q * p);
        }
        char tmp[400];
        snprintf(tmp, sizeof tmp, "%.*f", (int)(prec < 0 ? 0 : prec > 300 ? 300 : prec), f);
        return jinja_float(strtod(tmp, NULL));
    }
    double scale = pow(10.0, (double)prec);
    return jinja_float((m[0] == 'c' ? ceil(f * scale) : floor(f * scale)) / scale);
}

static JValue f_dictsort(JRender *r, int line, JValue v, JArgs *a) {
    static const char *const kw[] = {"case_sensitive", "by", "reverse", NULL};
    jinja_check_args(r, line, a, 3, kw, "dictsort");
    int cs = jinja_truthy(jinja_arg(a, 0, "case_sensitive", jinja_bool(0)));
    JValue by = jinja_arg(a, 1, "by", jinja_cstr(r->cx, "key"));
    int rev = jinja_truthy(jinja_arg(a, 2, "reverse", jinja_bool(0)));
    int pos = by.type == JV_STR && !strcmp(by.u.s->s, "value") ? 1 : 0;
    if (by.type != JV_STR || (strcmp(by.u.s->s, "key") && strcmp(by.u.s->s, "value")))
        jinja_fail(r->cx, line, "You can only sort by either \"key\" or \"value\"");
    if (v.type == JV_UNDEF)
        fail_undef(r, line, v);
    if (v.type != JV_DICT)
        jinja_fail(r->cx, line, "'%s' object has no attribute 'items'", jinja_type_name(v));
    size_t n = v.u.d->len;
    JValue *keys = jinja_alloc(r->cx, (n + 1) * sizeof *keys);
    JValue *vals = jinja_alloc(r->cx, (n + 1) * sizeof *vals);
    Getter g = {.lower = !cs};
    for (size_t i = 0; i < n; i++) {
        JValue pair = jinja_list_new(r->cx, 2);
        pair.flags = JF_TUPLE;
        jinja_list_push(r->cx, pair.u.l, v.u.d->k[i]);
        jinja_list_push(r->cx, pair.u.l, v.u.d->v[i]);
        vals[i] = pair;
        keys[i] = getter_apply(r, line, &g, pos ? v.u.d->v[i] : v.u.d->k[i]);
    }
    stable_sort(r, line, keys, vals, n, rev);
    JValue out = jinja_list_new(r->cx, n);
    for (size_t i = 0; i < n; i++)
        jinja_list_push(r->cx, out.u.l, vals[i]);
    return out;
}

static JValue f_sort_min_max(JRender *r, int line, const char *f, JValue v, JArgs *a) {
    JCtx *cx = r->cx;
    int is_sort = !strcmp(f, "sort");
    JValue rev = is_sort ? jinja_arg(a, 0, "reverse", jinja_bool(0)) : jinja_bool(0);
    int cs = jinja_truthy(jinja_arg(a, is_sort ? 1 : 0, "case_sensitive", jinja_bool(0)));
    JValue attribute = jinja_arg(a, is_sort ? 2 : 1, "attribute", jinja_ng());
    Getter g;
    getter_init(r, line, &g, attribute, jinja_ng(), !cs);
    JList *items = jinja_iter(cx, line, v);
    size_t n = items->len;
    if (!is_sort && !n)
        return jinja_undef("No aggregated item, sequence was empty.");
    JValue *keys = jinja_alloc(cx, (n + 1) * sizeof *keys);
    JValue *vals = jinja_alloc(cx, (n + 1) * sizeof *vals);
    for (size_t i = 0; i < n; i++) {
        vals[i] = items->v[i];
        keys[i] = getter_apply(r, line, &g, items->v[i]);
    }
    if (!is_sort) {
        size_t best = 0;
        for (size_t i = 1; i < n; i++) {
            int c = jinja_compare(cx, line, keys[i], keys[best]);
            if (f[1] == 'i' ? c < 0 : c > 0)
                best = i;
        }
        return vals[best];
    }
    stable_sort(r, line, keys, vals, n, jinja_truthy(rev));
    JValue out = jinja_list_new(cx, n);
    for (size_t i = 0; i < n; i++)
        jinja_list_push(cx, out.u.l, vals[i]);
    return out;
}

static JValue f_unique(JRender *r, int line, JValue v, JArgs *a) {
    JCtx *cx = r->cx;
    int cs = jinja_truthy(jinja_arg(a, 0, "case_sensitive", jinja_bool(0)));
    Getter g;
    getter_init(r, line, &g, jinja_arg(a, 1, "attribute", jinja_ng()), jinja_ng(), !cs);
    JList *items = jinja_iter(cx, line, v);
    JValue seen = jinja_list_new(cx, items->len), out = jinja_list_new(cx, items->len);
    for (size_t i = 0; i < items->len; i++) {
        JValue key = getter_apply(r, line, &g, items->v[i]);
        if (key.type == JV_LIST && !(key.flags & JF_TUPLE))
            jinja_fail(cx, line, "unhashable type: 'list'");
        if (key.type == JV_DICT)
            jinja_fail(cx, line, "unhashable type: 'dict'");
        int dup = 0;
        for (size_t k = 0; k < seen.u.l->len && !dup; k++)
            dup = jinja_equal(seen.u.l->v[k], key);
        if (!dup) {
            jinja_list_push(cx, seen.u.l, key);
            jinja_list_push(cx, out.u.l, items->v[i]);
        }
    }
    return out;
}

static JValue f_reverse(JRender *r, int line, JValue v) {
    JCtx *cx = r->cx;
    if (v.type == JV_STR) {
        JBuf b = {0};
        jinja_buf_put(cx, &b, "", 0);
        size_t n = v.u.s->len;
        size_t count = jinja_utf8_count(v.u.s->s, n);
        size_t *o = jinja_alloc(cx, (count + 1) * sizeof *o), off = 0;
        for (size_t k = 0; k < count; k++) {
            o[k] = off;
            off = jinja_utf8_next(v.u.s->s, n, off, NULL);
        }
        o[count] = n;
        for (size_t k = count; k-- > 0;)
            jinja_buf_put(cx, &b, v.u.s->s + o[k], o[k + 1] - o[k]);
        return jinja_strbuf(cx, &b);
    }
    JList *items = jinja_iter(cx, line, v);
    JValue out = jinja_list_new(cx, items->len);
    for (size_t k = items->len; k-- > 0;)
        jinja_list_push(cx, out.u.l, items->v[k]);
    return out;
}

static JValue f_truncate(JRender *r, int line, JValue v, JArgs *a) {
    JCtx *cx = r->cx;
    JValue s = soft_str(r, v);
    int64_t length = to_int(r, line, jinja_arg(a, 0, "length", jinja_int(255)), "length");
    int killwords = jinja_truthy(jinja_arg(a, 1, "killwords", jinja_bool(0)));
    JValue end = jinja_arg(a, 2, "end", jinja_cstr(cx, "..."));
    int64_t leeway = to_int(r, line, jinja_arg(a, 3, "leeway", jinja_int(5)), "leeway");
    if (end.type != JV_STR)
        end = jinja_to_str(cx, end);
    int64_t endlen = (int64_t)jinja_utf8_count(end.u.s->s, end.u.s->len);
    int64_t len = (int64_t)jinja_utf8_count(s.u.s->s, s.u.s->len);
    if (length < endlen || leeway < 0)
        jinja_fail(cx, line, "expected length >= %lld and leeway >= 0", (long long)endlen);
    if (len <= length + leeway)
        return s;
    size_t off = 0;
    for (int64_t k = 0; k < length - endlen; k++)
        off = jinja_utf8_next(s.u.s->s, s.u.s->len, off, NULL);
    size_t keep = off;
    if (!killwords) /* rsplit(" ", 1)[0] */
        for (size_t k = off; k-- > 0;)
            if (s.u.s->s[k] == ' ') {
                keep = k;
                break;
            }
    JBuf b = {0};
    jinja_buf_put(cx, &b, s.u.s->s, keep);
    jinja_buf_put(cx, &b, end.u.s->s, end.u.s->len);
    return jinja_strbuf(cx, &b);
}

static int is_word_char(uint32_t cp) {
    return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9') ||
           cp == '_' || (cp >= 0x80 && !jinja_py_isspace(cp));
}

JValue jinja_filter(JRender *r, int line, const char *f, JValue v, JArgs *a) {
    JCtx *cx = r->cx;
    JValue a0 = jinja_arg(a, 0, NULL, jinja_ng());
    if (!strcmp(f, "tojson"))
        return f_tojson(r, line, v, a);
    if (!strcmp(f, "trim")) {
        JValue chars = jinja_arg(a, 0, "chars", jinja_ng());
        return jinja_str_strip(cx, soft_str(r, v), chars, 1, 1);
    }
    if (!strcmp(f, "length") || !strcmp(f, "count"))
        return jinja_int(jinja_len(cx, line, v));
    if (!strcmp(f, "upper") || !strcmp(f, "lower") || !strcmp(f, "capitalize") ||
        !strcmp(f, "title")) {
        int mode = f[0] == 'u'   ? JCASE_UPPER
                   : f[0] == 'l' ? JCASE_LOWER
                   : f[0] == 'c' ? JCASE_CAPITALIZE
                                 : JCASE_JINJA_TITLE;
        return jinja_str_case(cx, soft_str(r, v), mode);
    }
    if (!strcmp(f, "replace")) {
        JValue s = jinja_to_str(cx, v);
        JFunc fn = {.name = "replace", .self = s, .kind = JFN_METHOD};
        JValue args[3] = {jinja_to_str(cx, a0),
                          jinja_to_str(cx, jinja_arg(a, 1, "new", jinja_ng())),
                          jinja_arg(a, 2, "count", jinja_none())};
        if (!jinja_given(a0) || !jinja_given(jinja_arg(a, 1, "new", jinja_ng())))
            jinja_fail(cx, line, "replace() needs the old and the new string");
        JArgs ra = {args[2].type == JV_NONE ? 2 : 3, args, 0, NULL, NULL};
        return jinja_method(r, line, &fn, &ra);
    }
    if (!strcmp(f, "join")) {
        JValue d = jinja_arg(a, 0, "d", jinja_cstr(cx, ""));
        JValue attribute = jinja_arg(a, 1, "attribute", jinja_ng());
        Getter g;
        getter_init(r, line, &g, attribute, jinja_ng(), 0);
        JList *items = jinja_iter(cx, line, v);
        JValue sep = jinja_to_str(cx, d);
        JBuf b = {0};
        jinja_buf_put(cx, &b, "", 0);
        for (size_t i = 0; i < items->len; i++) {
            if (i)
                jinja_buf_put(cx, &b, sep.u.s->s, sep.u.s->len);
            jinja_put_str(cx, &b, getter_apply(r, line, &g, items->v[i]));
        }
        return jinja_strbuf(cx, &b);
    }
    if (!strcmp(f, "first") || !strcmp(f, "last")) {
        if (v.type == JV_DICT && f[0] == 'l' && v.u.d->len)
            return v.u.d->k[v.u.d->len - 1];
        JList *items = jinja_iter(cx, line, v);
        if (!items->len)
            return jinja_undef(f[0] == 'f' ? "No first item, sequence was empty."
                                           : "No last item, sequence was empty.");
        return items->v[f[0] == 'f' ? 0 : items->len - 1];
    }
    if (!strcmp(f, "default") || !strcmp(f, "d")) {
        JValue def = jinja_arg(a, 0, "default_value", jinja_cstr(cx, ""));
        int boolean = jinja_truthy(jinja_arg(a, 1, "boolean", jinja_bool(0)));
        if (v.type == JV_UNDEF || (boolean && !jinja_truthy(v)))
            return def;
        return v;
    }
    if (!strcmp(f, "items")) {
        JValue out = jinja_list_new(cx, 4);
        if (v.type == JV_UNDEF)
            return out;
        if (v.type != JV_DICT)
            jinja_fail(cx, line, "Can only get item pairs from a mapping.");
        for (size_t i = 0; i < v.u.d->len; i++) {
            JValue pair = jinja_list_new(cx, 2);
            pair.flags = JF_TUPLE;
            jinja_list_push(cx, pair.u.l, v.u.d->k[i]);
            jinja_list_push(cx, pair.u.l, v.u.d->v[i]);
            jinja_list_push(cx, out.u.l, pair);
        }
        return out;
    }
    if (!strcmp(f, "selectattr") || !strcmp(f, "rejectattr"))
        return f_select(r, line, v, a, f[0] == 's', 1);
    if (!strcmp(f, "select") || !strcmp(f, "reject"))
        return f_select(r, line, v, a, f[0] == 's', 0);
    if (!strcmp(f, "map"))
        return f_map(r, line, v, a);
    if (!strcmp(f, "string"))
        return soft_str(r, v);
    if (!strcmp(f, "safe")) {
        JValue s = jinja_to_str(cx, v);
        s.flags = JF_MARKUP;
        return s;
    }
    if (!strcmp(f, "e") || !strcmp(f, "escape") || !strcmp(f, "forceescape"))
        return escape(r, f[0] == 'f' ? jinja_to_str(cx, v) : v);
    if (!strcmp(f, "int"))
        return f_int(r, line, v, a);
    if (!strcmp(f, "float"))
        return f_float(r, line, v, a);
    if (!strcmp(f, "list")) {
        JList *items = jinja_iter(cx, line, v);
        JValue out = jinja_list_new(cx, items->len);
        for (size_t i = 0; i < items->len; i++)
            jinja_list_push(cx, out.u.l, items->v[i]);
        return out;
    }
    if (!strcmp(f, "unique"))
        return f_unique(r, line, v, a);
    if (!strcmp(f, "reverse"))
        return f_reverse(r, line, v);
    if (!strcmp(f, "indent"))
        return f_indent(r, line, v, a);
    if (!strcmp(f, "dictsort"))
        return f_dictsort(r, line, v, a);
    if (!strcmp(f, "sort") || !strcmp(f, "min") || !strcmp(f, "max"))
        return f_sort_min_max(r, line, f, v, a);
    if (!strcmp(f, "abs")) {
        if (v.type == JV_UNDEF)
            fail_undef(r, line, v);
        if (v.type == JV_FLOAT)
            return jinja_float(fabs(v.u.f));
        int64_t i = to_int(r, line, v, "abs");
        if (i == INT64_MIN)
            jinja_fail(cx, line, "integer overflow");
        return jinja_int(i < 0 ? -i : i);
    }
    if (!strcmp(f, "round"))
        return f_round(r, line, v, a);
    if (!strcmp(f, "sum")) {
        Getter g;
        getter_init(r, line, &g, jinja_arg(a, 0, "attribute", jinja_ng()), jinja_ng(), 0);
        JValue total = jinja_arg(a, 1, "start", jinja_int(0));
        JList *items = jinja_iter(cx, line, v);
        for (size_t i = 0; i < items->len; i++)
            total = jinja_binop(r, line, OP_ADD, total, getter_apply(r, line, &g, items->v[i]));
        return total;
    }
    if (!strcmp(f, "attr")) {
        if (!jinja_given(a0) || a0.type != JV_STR)
            jinja_fail(cx, line, "attr() needs an attribute name");
        return jinja_getattr(r, line, v, a0.u.s->s);
    }
    if (!strcmp(f, "batch")) {
        int64_t count = to_int(r, line, a0, "linecount");
        JValue fill = jinja_arg(a, 1, "fill_with", jinja_none());
        if (count <= 0)
            jinja_fail(cx, line, "batch size must be positive");
        JList *items = jinja_iter(cx, line, v);
        JValue out = jinja_list_new(cx, 4), cur = jinja_list_new(cx, (size_t)count);
        for (size_t i = 0; i < items->len; i++) {
            if ((int64_t)cur.u.l->len == count) {
                jinja_list_push(cx, out.u.l, cur);
                cur = jinja_list_new(cx, (size_t)count);
            }
            jinja_list_push(cx, cur.u.l, items->v[i]);
        }
        if (cur.u.l->len) {
            if (fill.type != JV_NONE)
                while ((int64_t)cur.u.l->len < count)
                    jinja_list_push(cx, cur.u.l, fill);
            jinja_list_push(cx, out.u.l, cur);
        }
        return out;
    }
    if (!strcmp(f, "center")) {
        JFunc fn = {.name = "center", .self = soft_str(r, v), .kind = JFN_METHOD};
        JValue w = jinja_arg(a, 0, "width", jinja_int(80));
        JArgs ca = {1, &w, 0, NULL, NULL};
        return jinja_method(r, line, &fn, &ca);
    }
    if (!strcmp(f, "format")) {
        if (a->n && a->nkw)
            jinja_fail(cx, line, "can't handle positional and keyword arguments at the same time");
        JValue args;
        if (a->nkw) {
            args = jinja_dict_new(cx, (size_t)a->nkw);
            for (int k = 0; k < a->nkw; k++)
                jinja_dict_set(cx, args.u.d, jinja_cstr(cx, a->kwnames[k]), a->kw[k]);
        } else {
            args = jinja_list_new(cx, (size_t)a->n);
            args.flags = JF_TUPLE;
            for (int i = 0; i < a->n; i++)
                jinja_list_push(cx, args.u.l, a->v[i]);
        }
        return jinja_binop(r, line, OP_MOD, soft_str(r, v), args);
    }
    if (!strcmp(f, "truncate"))
        return f_truncate(r, line, v, a);
    if (!strcmp(f, "wordcount")) {
        JValue s = soft_str(r, v);
        int64_t words = 0;
        int in = 0;
        for (size_t i = 0; i < s.u.s->len;) {
            uint32_t cp;
            i = jinja_utf8_next(s.u.s->s, s.u.s->len, i, &cp);
            int w = is_word_char(cp);
            words += w && !in;
            in = w;
        }
        return jinja_int(words);
    }
    if (!jinja_has_filter(f))
        jinja_fail(cx, line, "No filter named '%s' found.", f);
    jinja_fail(cx, line, "the filter '%s' is not supported", f);
}
