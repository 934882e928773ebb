/* eval.c - renders the syntax tree: expressions to values, statements to output.
 *
 * Scopes follow jinja2's frames: each for-loop iteration, macro call, call-block caller, block
 * set, filter block, with block and {% generation %} body gets a scope of its own whose parent
 * is the scope it appears in, so {% set %} inside a loop is lost at the next iteration and
 * invisible after the loop (hence namespace()), while {% if %} bodies share their scope.
 * Names resolve through the scopes, then the render's context, then the globals. Attribute and
 * item access follow jinja2's sandbox: `d.items` is the method before the key, `d['x']` the key
 * before the method; a missing key or index is undefined, but any use of an undefined value
 * other than printing, testing, iterating or `default` fails with jinja2's message. */
#include "jinja_int.h"

#include <string.h>

static JValue eval(JRender *r, Scope *sc, const JNode *n);

static Scope *scope_new(JRender *r, Scope *parent) {
    Scope *s = jinja_alloc(r->cx, sizeof *s);
    s->parent = parent;
    return s;
}

static void scope_set(JRender *r, Scope *sc, const char *name, JValue v) {
    jinja_dict_set(r->cx, &sc->vars, jinja_cstr(r->cx, name), v);
}

static JValue lookup(JRender *r, Scope *sc, const char *name) {
    JValue v;
    for (Scope *s = sc; s; s = s->parent)
        if (jinja_dict_getc(&s->vars, name, &v))
            return v;
    if (r->context && jinja_dict_getc(r->context, name, &v))
        return v;
    v = jinja_lookup_global(r->cx, name);
    if (v.type != JV_UNDEF)
        return v;
    JBuf b = {0};
    jinja_buf_printf(r->cx, &b, "'%s' is undefined", name);
    return jinja_undef(b.p);
}

_Noreturn static void fail_undef(JRender *r, int line, JValue u) {
    jinja_fail(r->cx, line, "%s", u.u.undef ? u.u.undef : "undefined value");
}

static void out_put(JRender *r, const char *s, size_t n) {
    if (r->out->len + n > r->max_output)
        jinja_fail(r->cx, 0, "the output is larger than %zu bytes", r->max_output);
    jinja_buf_put(r->cx, r->out, s, n);
}

static void out_value(JRender *r, JValue v) {
    if (v.type == JV_STR) {
        out_put(r, v.u.s->s, v.u.s->len);
        return;
    }
    JBuf b = {0};
    jinja_put_str(r->cx, &b, v);
    out_put(r, b.p ? b.p : "", b.len);
}

/* ---- attribute and item access ---- */

static JValue missing_attr(JRender *r, JValue obj, const char *name) {
    JBuf b = {0};
    jinja_buf_printf(r->cx, &b, "'%s' has no attribute '%s'", jinja_object_repr(r->cx, obj), name);
    return jinja_undef(b.p);
}

static JValue method_or_missing(JRender *r, JValue obj, const char *name) {
    int unsafe = 0;
    if (jinja_is_method(obj, name, &unsafe)) {
        if (unsafe) {
            JBuf b = {0};
            jinja_buf_printf(r->cx, &b, "access to attribute '%s' of '%s' object is unsafe.", name,
                             jinja_type_name(obj));
            return jinja_undef(b.p);
        }
        return jinja_func(r->cx, name, obj, JFN_METHOD);
    }
    return missing_attr(r, obj, name);
}

static JValue loop_attr(JRender *r, JLoop *L, const char *name, int *found) {
    size_t n = L->items->len, i = L->index0;
    *found = 1;
    if (!strcmp(name, "index"))
        return jinja_int((int64_t)i + 1);
    if (!strcmp(name, "index0"))
        return jinja_int((int64_t)i);
    if (!strcmp(name, "revindex"))
        return jinja_int((int64_t)(n - i));
    if (!strcmp(name, "revindex0"))
        return jinja_int((int64_t)(n - i - 1));
    if (!strcmp(name, "first"))
        return jinja_bool(i == 0);
    if (!strcmp(name, "last"))
        return jinja_bool(i + 1 == n);
    if (!strcmp(name, "length"))
        return jinja_int((int64_t)n);
    if (!strcmp(name, "depth"))
        return jinja_int(L->depth);
    if (!strcmp(name, "depth0"))
        return jinja_int(L->depth - 1);
    if (!strcmp(name, "previtem"))
        return i > 0 ? L->items->v[i - 1] : jinja_undef("there is no previous item");
    if (!strcmp(name, "nextitem"))
        return i + 1 < n ? L->items->v[i + 1] : jinja_undef("there is no next item");
    JValue self = {.type = JV_LOOP};
    self.u.loop = L;
    if (!strcmp(name, "cycle") || !strcmp(name, "changed"))
        return jinja_func(r->cx, name[1] == 'y' ? "cycle" : "changed", self, JFN_LOOP_CYCLE);
    *found = 0;
    return jinja_none();
}

JValue jinja_getattr(JRender *r, int line, JValue obj, const char *name) {
    JValue v;
    switch (obj.type) {
        case JV_UNDEF:
            fail_undef(r, line, obj);
        case JV_DICT: {
            int unsafe;
            if (jinja_is_method(obj, name, &unsafe))
                return method_or_missing(r, obj, name);
            if (jinja_dict_getc(obj.u.d, name, &v))
                return v;
            return missing_attr(r, obj, name);
        }
        case JV_NS:
            if (jinja_dict_getc(obj.u.d, name, &v))
                return v;
            return missing_attr(r, obj, name);
        case JV_LOOP: {
            int found;
            v = loop_attr(r, obj.u.loop, name, &found);
            return found ? v : missing_attr(r, obj, name);
        }
        default:
            return method_or_missing(r, obj, name);
    }
}

static JValue index_list(JRender *r, JValue obj, JValue key, int *ok) {
    int64_t len = obj.type == JV_STR ? (int64_t)jinja_utf8_count(obj.u.s->s, obj.u.s->len)
                                     : (int64_t)obj.u.l->len;
    int64_t i = key.type == JV_BOOL ? key.u.b : key.u.i;
    if (i < 0)
        i += len;
    *ok = i >= 0 && i < len;
    if (!*ok)
        return jinja_none();
    if (obj.type == JV_LIST)
        return obj.u.l->v[i];
    const char *s = obj.u.s->s;
    size_t n = obj.u.s->len, off = 0;
    for (int64_t k = 0; k < i; k++)
        off = jinja_utf8_next(s, n, off, NULL);
    return jinja_str(r->cx, s + off, jinja_utf8_next(s, n, off, NULL) - off);
}

JValue jinja_getitem(JRender *r, int line, JValue obj, JValue key) {
    JValue v;
    if (obj.type == JV_UNDEF)
        fail_undef(r, line, obj);
    if (obj.type == JV_DICT && jinja_dict_get(obj.u.d, key, &v))
        return v;
    if ((obj.type == JV_LIST || obj.type == JV_STR) &&
        (key.type == JV_INT || key.type == JV_BOOL)) {
        int ok;
        v = index_list(r, obj, key, &ok);
        if (ok)
            return v;
    }
    if (key.type == JV_STR) { /* then the attribute of that name */
        if (obj.type == JV_NS || obj.type == JV_LOOP)
            return jinja_getattr(r, line, obj, key.u.s->s);
        int unsafe;
        if (jinja_is_method(obj, key.u.s->s, &unsafe))
            return method_or_missing(r, obj, key.u.s->s);
        return missing_attr(r, obj, key.u.s->s);
    }
    JBuf b = {0};
    jinja_buf_printf(r->cx, &b, "'%s' has no element ", jinja_object_repr(r->cx, obj));
    jinja_put_repr(r->cx, &b, key);
    return jinja_undef(b.p);
}

static int64_t slice_index(JRender *r, int line, JValue v) {
    if (v.type == JV_INT)
        return v.u.i;
    if (v.type == JV_BOOL)
        return v.u.b;
    jinja_fail(r->cx, line, "slice indices must be integers or None or have an __index__ method");
}

static JValue eval_slice(JRender *r, Scope *sc, JValue obj, const JNode *sl) {
    int line = sl->line;
    if (obj.type == JV_UNDEF)
        fail_undef(r, line, obj);
    JValue parts[3];
    for (int k = 0; k < 3; k++) {
        const JNode *e = k == 0 ? sl->a : k == 1 ? sl->b : sl->c;
        parts[k] = e ? eval(r, sc, e) : jinja_none();
    }
    if (obj.type != JV_LIST && obj.type != JV_STR)
        return jinja_undef("unsupported slice");
    int64_t step = parts[2].type == JV_NONE ? 1 : slice_index(r, line, parts[2]);
    if (!step)
        jinja_fail(r->cx, line, "slice step cannot be zero");
    /* code points of a string, items of a list */
    const char *s = obj.type == JV_STR ? obj.u.s->s : NULL;
    size_t sn = obj.type == JV_STR ? obj.u.s->len : 0;
    size_t *offs = NULL;
    int64_t len;
    if (s) {
        len = (int64_t)jinja_utf8_count(s, sn);
        offs = jinja_alloc(r->cx, ((size_t)len + 1) * sizeof *offs);
        size_t off = 0;
        for (int64_t k = 0; k <= len; k++) {
            offs[k] = off;
            if (off < sn)
                off = jinja_utf8_next(s, sn, off, NULL);
        }
    } else {
        len = (int64_t)obj.u.l->len;
    }
    int64_t start, stop;
    if (step > 0) {
        start = parts[0].type == JV_NONE ? 0 : slice_index(r, line, parts[0]);
        stop = parts[1].type == JV_NONE ? len : slice_index(r, line, parts[1]);
        if (start < 0 && (start += len) < 0)
            start = 0;
        if (start > len)
            start = len;
        if (stop < 0 && (stop += len) < 0)
            stop = 0;
        if (stop > len)
            stop = len;
    } else {
        start = parts[0].type == JV_NONE ? len - 1 : slice_index(r, line, parts[0]);
        stop = parts[1].type == JV_NONE ? -1 : slice_index(r, line, parts[1]);
        if (parts[0].type != JV_NONE) {
            if (start < 0 && (start += len) < 0)
                start = -1;
            if (start >= len)
                start = len - 1;
        }
        if (parts[1].type != JV_NONE) {
            if (stop < 0 && (stop += len) < 0)
                stop = -1;
            if (stop >= len)
                stop = len - 1;
        }
    }
    if (s) {
        JBuf b = {0};
        jinja_buf_put(r->cx, &b, "", 0);
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
            jinja_buf_put(r->cx, &b, s + offs[i], offs[i + 1] - offs[i]);
        return jinja_strbuf(r->cx, &b);
    }
    JValue out = jinja_list_new(r->cx, 0);
    out.flags = obj.flags & JF_TUPLE;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
        jinja_list_push(r->cx, out.u.l, obj.u.l->v[i]);
    return out;
}

/* ---- calls ---- */

static void eval_args(JRender *r, Scope *sc, const JNode *n, JArgs *a, int extra_kw) {
    JCtx *cx = r->cx;
    JList *pos = jinja_list_new(cx, (size_t)n->nargs + 1).u.l;
    for (int i = 0; i < n->nargs; i++)
        jinja_list_push(cx, pos, eval(r, sc, n->args[i]));
    if (n->c) {
        JValue star = eval(r, sc, n->c);
        JList *it = jinja_iter(cx, n->line, star);
        for (size_t i = 0; i < it->len; i++)
            jinja_list_push(cx, pos, it->v[i]);
    }
    int nkw = n->nkw;
    JValue dstar = {.type = JV_NONE};
    if (n->d) {
        dstar = eval(r, sc, n->d);
        if (dstar.type != JV_DICT)
            jinja_fail(cx, n->line, "argument after ** must be a mapping, not %s",
                       jinja_type_name(dstar));
        nkw += (int)dstar.u.d->len;
    }
    a->n = (int)pos->len;
    a->v = pos->v;
    a->kwnames = jinja_alloc(cx, (size_t)(nkw + extra_kw + 1) * sizeof *a->kwnames);
    a->kw = jinja_alloc(cx, (size_t)(nkw + extra_kw + 1) * sizeof *a->kw);
    a->nkw = 0;
    for (int i = 0; i < n->nkw; i++) {
        a->kwnames[a->nkw] = n->kwnames[i];
        a->kw[a->nkw++] = eval(r, sc, n->kw[i]);
    }
    if (dstar.type == JV_DICT)
        for (size_t i = 0; i < dstar.u.d->len; i++) {
            JValue k = dstar.u.d->k[i];
            if (k.type != JV_STR)
                jinja_fail(cx, n->line, "keywords must be strings");
            a->kwnames[a->nkw] = k.u.s->s;
            a->kw[a->nkw++] = dstar.u.d->v[i];
        }
}

static JValue call_macro(JRender *r, int line, JMacro *m, JArgs *a) {
    JCtx *cx = r->cx;
    const JNode *def = m->def;
    int flags = def->op, np = def->nparams;
    if (r->depth >= 200)
        jinja_fail(cx, line, "maximum recursion depth exceeded");
    Scope *sc = scope_new(r, m->closure);
    int *given = jinja_alloc(cx, (size_t)(np + 1) * sizeof *given);
    for (int i = 0; i < np && i < a->n; i++) {
        scope_set(r, sc, def->params[i], a->v[i]);
        given[i] = 1;
    }
    int caller_given = 0;
    JValue extra = jinja_dict_new(cx, 0);
    for (int k = 0; k < a->nkw; k++) {
        int found = 0;
        for (int i = 0; i < np; i++)
            if (!strcmp(def->params[i], a->kwnames[k])) {
                if (i < a->n)
                    jinja_fail(cx, line, "macro '%s' got multiple values for argument '%s'",
                               m->name, a->kwnames[k]);
                scope_set(r, sc, def->params[i], a->kw[k]);
                given[i] = found = 1;
                if (!strcmp(a->kwnames[k], "caller"))
                    caller_given = 1;
            }
        if (found)
            continue;
        if (!strcmp(a->kwnames[k], "caller") && (flags & 4)) {
            scope_set(r, sc, "caller", a->kw[k]);
            caller_given = 1;
            continue;
        }
        if (!(flags & 2)) {
            if (!strcmp(a->kwnames[k], "caller"))
                jinja_fail(cx, line,
                           "macro '%s' was invoked with two values for the special caller "
                           "argument. This is most likely a bug.",
                           m->name);
            jinja_fail(cx, line, "macro '%s' takes no keyword argument '%s'", m->name,
                       a->kwnames[k]);
        }
        jinja_dict_set(cx, extra.u.d, jinja_cstr(cx, a->kwnames[k]), a->kw[k]);
    }
    if ((flags & 4) && !caller_given)
        scope_set(r, sc, "caller", jinja_undef("No caller defined"));
    if (flags & 2)
        scope_set(r, sc, "kwargs", extra);
    if (flags & 1) {
        JValue rest = jinja_list_new(cx, 0);
        rest.flags = JF_TUPLE;
        for (int i = np; i < a->n; i++)
            jinja_list_push(cx, rest.u.l, a->v[i]);
        scope_set(r, sc, "varargs", rest);
    } else if (a->n > np) {
        jinja_fail(cx, line, "macro '%s' takes not more than %d argument(s)", m->name, np);
    }
    int first_default = np - def->ndefaults;
    for (int i = 0; i < np; i++) {
        if (given[i])
            continue;
        if (i >= first_default) {
            scope_set(r, sc, def->params[i], eval(r, sc, def->defaults[i - first_default]));
        } else {
            JBuf b = {0};
            jinja_buf_printf(cx, &b, "parameter '%s' was not provided", def->params[i]);
            scope_set(r, sc, def->params[i], jinja_undef(b.p));
        }
    }
    JBuf buf = {0}, *saved = r->out;
    jinja_buf_put(cx, &buf, "", 0);
    r->out = &buf;
    r->depth++;
    jinja_exec(r, sc, def->body, def->nbody);
    r->depth--;
    r->out = saved;
    return jinja_strbuf(cx, &buf);
}

JValue jinja_call(JRender *r, int line, JValue fn, JArgs *a) {
    switch (fn.type) {
        case JV_MACRO:
            return call_macro(r, line, fn.u.m, a);
        case JV_FUNC:
            if (fn.u.fn->kind == JFN_GLOBAL)
                return jinja_global_call(r, line, fn.u.fn, a);
            return jinja_method(r, line, fn.u.fn, a);
        case JV_UNDEF:
            fail_undef(r, line, fn);
        default:
            jinja_fail(r->cx, line, "'%s' object is not callable", jinja_type_name(fn));
    }
}

/* A filter chain from parse_filter(NULL): the innermost filter applies to `input`. */
static JValue eval_filter_chain(JRender *r, Scope *sc, const JNode *f, JValue input) {
    if (!f)
        return input;
    JValue v = eval_filter_chain(r, sc, f->a, input);
    JArgs a;
    eval_args(r, sc, f, &a, 0);
    return jinja_filter(r, f->line, f->s, v, &a);
}

/* ---- operators ---- */

static int contains(JRender *r, int line, JValue container, JValue item) {
    switch (container.type) {
        case JV_STR:
            if (item.type != JV_STR)
                jinja_fail(r->cx, line, "'in <string>' requires string as left operand, not %s",
                           jinja_type_name(item));
            if (!item.u.s->len)
                return 1;
            return memmem(container.u.s->s, container.u.s->len, item.u.s->s, item.u.s->len) != NULL;
        case JV_LIST:
            for (size_t i = 0; i < container.u.l->len; i++)
                if (jinja_equal(container.u.l->v[i], item))
                    return 1;
            return 0;
        case JV_DICT: {
            JValue v;
            return jinja_dict_get(container.u.d, item, &v);
        }
        case JV_UNDEF:
            return 0;
        default:
            jinja_fail(r->cx, line, "argument of type '%s' is not iterable",
                       jinja_type_name(container));
    }
}

static int compare_op(JRender *r, int line, int op, JValue a, JValue b) {
    switch (op) {
        case OP_EQ:
            return jinja_equal(a, b);
        case OP_NE:
            return !jinja_equal(a, b);
        case OP_IN:
            return contains(r, line, b, a);
        case OP_NOTIN:
            return !contains(r, line, b, a);
        default: {
            int c = jinja_compare(r->cx, line, a, b);
            return op == OP_LT ? c < 0 : op == OP_LTEQ ? c <= 0 : op == OP_GT ? c > 0 : c >= 0;
        }
    }
}

static JValue eval_unary(JRender *r, int line, int neg, JValue v) {
    switch (v.type) {
        case JV_UNDEF:
            fail_undef(r, line, v);
        case JV_BOOL:
            return jinja_int(neg ? -(int64_t)v.u.b : v.u.b);
        case JV_INT:
            if (neg && v.u.i == INT64_MIN)
                jinja_fail(r->cx, line, "integer overflow");
            return jinja_int(neg ? -v.u.i : v.u.i);
        case JV_FLOAT:
            return jinja_float(neg ? -v.u.f : v.u.f);
        default:
            jinja_fail(r->cx, line, "bad operand type for unary %c: '%s'", neg ? '-' : '+',
                       jinja_type_name(v));
    }
}

static int hashable(JValue v) {
    if (v.type == JV_LIST && (v.flags & JF_TUPLE)) {
        for (size_t i = 0; i < v.u.l->len; i++)
            if (!hashable(v.u.l->v[i]))
                return 0;
        return 1;
    }
    return v.type != JV_LIST && v.type != JV_DICT && v.type != JV_NS;
}

static JValue eval(JRender *r, Scope *sc, const JNode *n) {
    JCtx *cx = r->cx;
    switch (n->kind) {
        case N_CONST:
            return n->val;
        case N_NAME:
            return lookup(r, sc, n->s);
        case N_GETATTR:
            return jinja_getattr(r, n->line, eval(r, sc, n->a), n->s);
        case N_GETITEM: {
            JValue obj = eval(r, sc, n->a);
            if (n->b->kind == N_SLICE)
                return eval_slice(r, sc, obj, n->b);
            JValue key = eval(r, sc, n->b);
            return jinja_getitem(r, n->line, obj, key);
        }
        case N_CALL: {
            JValue fn = eval(r, sc, n->a);
            JArgs a;
            eval_args(r, sc, n, &a, 0);
            return jinja_call(r, n->line, fn, &a);
        }
        case N_FILTER: {
            JValue v = n->a ? eval(r, sc, n->a) : jinja_undef(NULL);
            JArgs a;
            eval_args(r, sc, n, &a, 0);
            return jinja_filter(r, n->line, n->s, v, &a);
        }
        case N_TEST: {
            JValue v = eval(r, sc, n->a);
            JArgs a;
            eval_args(r, sc, n, &a, 0);
            return jinja_bool(jinja_test(r, n->line, n->s, v, &a));
        }
        case N_NOT:
            return jinja_bool(!jinja_truthy(eval(r, sc, n->a)));
        case N_NEG:
        case N_POS:
            return eval_unary(r, n->line, n->kind == N_NEG, eval(r, sc, n->a));
        case N_BINOP: {
            JValue a = eval(r, sc, n->a);
            JValue b = eval(r, sc, n->b);
            return jinja_binop(r, n->line, n->op, a, b);
        }
        case N_CONCAT: {
            JBuf b = {0};
            jinja_buf_put(cx, &b, "", 0);
            for (int i = 0; i < n->nargs; i++) {
                jinja_put_str(cx, &b, eval(r, sc, n->args[i]));
                if (b.len > r->max_output)
                    jinja_fail(cx, n->line, "a string is larger than %zu bytes", r->max_output);
            }
            return jinja_strbuf(cx, &b);
        }
        case N_COMPARE: {
            JValue left = eval(r, sc, n->a);
            for (int i = 0; i < n->nargs; i++) {
                JValue right = eval(r, sc, n->args[i]);
                if (!compare_op(r, n->line, n->ops[i], left, right))
                    return jinja_bool(0);
                left = right;
            }
            return jinja_bool(1);
        }
        case N_AND: {
            JValue a = eval(r, sc, n->a);
            return jinja_truthy(a) ? eval(r, sc, n->b) : a;
        }
        case N_OR: {
            JValue a = eval(r, sc, n->a);
            return jinja_truthy(a) ? a : eval(r, sc, n->b);
        }
        case N_COND:
            if (jinja_truthy(eval(r, sc, n->a)))
                return eval(r, sc, n->b);
            if (n->c)
                return eval(r, sc, n->c);
            {
                JBuf b = {0};
                jinja_buf_printf(cx, &b,
                                 "the inline if-expression on line %d evaluated to false and no "
                                 "else section was defined.",
                                 n->line);
                return jinja_undef(b.p);
            }
        case N_LIST:
        case N_TUPLE: {
            JValue l = jinja_list_new(cx, (size_t)n->nargs);
            for (int i = 0; i < n->nargs; i++)
                jinja_list_push(cx, l.u.l, eval(r, sc, n->args[i]));
            if (n->kind == N_TUPLE)
                l.flags = JF_TUPLE;
            return l;
        }
        case N_DICT: {
            JValue d = jinja_dict_new(cx, (size_t)n->nargs);
            for (int i = 0; i < n->nargs; i++) {
                JValue k = eval(r, sc, n->args[i]);
                if (!hashable(k))
                    jinja_fail(cx, n->line, "unhashable type: '%s'", jinja_type_name(k));
                jinja_dict_set(cx, d.u.d, k, eval(r, sc, n->kw[i]));
            }
            return d;
        }
        default:
            jinja_fail(cx, n->line, "cannot evaluate this expression");
    }
}

/* ---- statements ---- */

static void assign(JRender *r, Scope *sc, const JNode *target, JValue v, int line) {
    JCtx *cx = r->cx;
    if (target->kind == N_NAME) {
        scope_set(r, sc, target->s, v);
    } else if (target->kind == N_NSREF) {
        JValue ns = lookup(r, sc, target->s);
        if (ns.type != JV_NS)
            jinja_fail(cx, line, "cannot assign attribute on non-namespace object");
        jinja_dict_set(cx, ns.u.d, jinja_cstr(cx, target->s2), v);
    } else { /* N_TUPLE */
        JList *items = jinja_iter(cx, line, v);
        if ((int)items->len != target->nargs) {
            if ((int)items->len > target->nargs)
                jinja_fail(cx, line, "too many values to unpack (expected %d)", target->nargs);
            jinja_fail(cx, line, "not enough values to unpack (expected %d, got %zu)",
                       target->nargs, items->len);
        }
        for (int i = 0; i < target->nargs; i++)
            assign(r, sc, target->args[i], items->v[i], line);
    }
}

/* Render body into a new buffer (in a child scope) and return it as a string. */
static JValue capture(JRender *r, Scope *sc, JNode **body, int n) {
    JBuf buf = {0}, *saved = r->out;
    jinja_buf_put(r->cx, &buf, "", 0);
    r->out = &buf;
    jinja_exec(r, scope_new(r, sc), body, n);
    r->out = saved;
    return jinja_strbuf(r->cx, &buf);
}

static int exec_for(JRender *r, Scope *sc, const JNode *n) {
    JCtx *cx = r->cx;
    JValue seq = eval(r, sc, n->b);
    JList *items = jinja_iter(cx, n->line, seq);
    if (n->c) { /* for x in xs if test: filter first, loop.length counts what is kept */
        JList *kept = jinja_list_new(cx, items->len).u.l;
        for (size_t i = 0; i < items->len; i++) {
            Scope *tmp = scope_new(r, sc);
            assign(r, tmp, n->a, items->v[i], n->line);
            if (jinja_truthy(eval(r, tmp, n->c)))
                jinja_list_push(cx, kept, items->v[i]);
        }
        items = kept;
    }
    JLoop *L = jinja_alloc(cx, sizeof *L);
    L->items = items;
    L->depth = 1;
    JValue loopv = {.type = JV_LOOP};
    loopv.u.loop = L;
    for (size_t i = 0; i < items->len; i++) {
        L->index0 = i;
        Scope *it = scope_new(r, sc);
        assign(r, it, n->a, items->v[i], n->line);
        scope_set(r, it, "loop", loopv);
        if (jinja_exec(r, it, n->body, n->nbody) == JFLOW_BREAK)
            break;
    }
    if (!items->len && n->norelse)
        return jinja_exec(r, scope_new(r, sc), n->orelse, n->norelse);
    return JFLOW_NORMAL;
}

static JValue make_macro(JRender *r, Scope *sc, const JNode *def, const char *name) {
    JMacro *m = jinja_alloc(r->cx, sizeof *m);
    m->def = def;
    m->closure = sc;
    m->name = name;
    JValue v = {.type = JV_MACRO};
    v.u.m = m;
    return v;
}

int jinja_exec(JRender *r, Scope *sc, JNode **body, int nbody) {
    JCtx *cx = r->cx;
    for (int k = 0; k < nbody; k++) {
        const JNode *n = body[k];
        int flow = JFLOW_NORMAL;
        switch (n->kind) {
            case N_DATA:
                out_put(r, n->s, n->slen);
                break;
            case N_OUTPUT:
                for (int i = 0; i < n->nargs; i++)
                    out_value(r, eval(r, sc, n->args[i]));
                break;
            case N_IF:
                if (jinja_truthy(eval(r, sc, n->a)))
                    flow = jinja_exec(r, sc, n->body, n->nbody);
                else
                    flow = jinja_exec(r, sc, n->orelse, n->norelse);
                break;
            case N_FOR:
                flow = exec_for(r, sc, n);
                break;
            case N_SET:
                assign(r, sc, n->a, eval(r, sc, n->b), n->line);
                break;
            case N_SETBLOCK: {
                JValue v = capture(r, sc, n->body, n->nbody);
                assign(r, sc, n->a, eval_filter_chain(r, sc, n->c, v), n->line);
                break;
            }
            case N_MACRO:
                scope_set(r, sc, n->s, make_macro(r, sc, n, n->s));
                break;
            case N_CALLBLOCK: {
                const JNode *call = n->a;
                JValue fn = eval(r, sc, call->a);
                JArgs a;
                eval_args(r, sc, call, &a, 1);
                a.kwnames[a.nkw] = "caller";
                a.kw[a.nkw++] = make_macro(r, sc, n, "caller");
                out_value(r, jinja_call(r, n->line, fn, &a));
                break;
            }
            case N_FILTERBLOCK: {
                JValue v = capture(r, sc, n->body, n->nbody);
                out_value(r, eval_filter_chain(r, sc, n->c, v));
                break;
            }
            case N_WITH: {
                Scope *inner = scope_new(r, sc);
                for (int i = 0; i < n->nparams; i++)
                    scope_set(r, inner, n->params[i], eval(r, sc, n->defaults[i]));
                flow = jinja_exec(r, inner, n->body, n->nbody);
                break;
            }
            case N_GENERATION:
                out_value(r, capture(r, sc, n->body, n->nbody));
                break;
            case N_BREAK:
                return JFLOW_BREAK;
            case N_CONTINUE:
                return JFLOW_CONTINUE;
            default:
                jinja_fail(cx, n->line, "cannot execute this statement");
        }
        if (flow != JFLOW_NORMAL)
            return flow;
    }
    return JFLOW_NORMAL;
}
