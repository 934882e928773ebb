/* strings.c - Python's str methods that templates call (strip, split, startswith, replace,
 * find, join, format, title, ...) and printf-style "%" formatting, on UTF-8 text indexed by code
 * point as Python indexes str. */
#include "jinja_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- string helpers (code point based) ---- */

static size_t *cp_offsets(JCtx *cx, const char *s, size_t n, size_t *count) {
    size_t c = jinja_utf8_count(s, n);
    size_t *o = jinja_alloc(cx, (c + 1) * sizeof *o);
    size_t off = 0;
    for (size_t k = 0; k < c; k++) {
        o[k] = off;
        off = jinja_utf8_next(s, n, off, NULL);
    }
    o[c] = n;
    *count = c;
    return o;
}

/* Python's slice clamping of optional start / end code point indices to byte offsets. */
static void sub_range(JRender *r, int line, JStr *s, JValue start, JValue end, size_t *b0,
                      size_t *b1) {
    size_t count;
    size_t *o = cp_offsets(r->cx, s->s, s->len, &count);
    int64_t len = (int64_t)count;
    int64_t st =
        jinja_given(start) && start.type != JV_NONE ? jinja_want_int(r, line, start, "start") : 0;
    int64_t en =
        jinja_given(end) && end.type != JV_NONE ? jinja_want_int(r, line, end, "end") : len;
    if (st < 0 && (st += len) < 0)
        st = 0;
    if (en < 0 && (en += len) < 0)
        en = 0;
    if (st > len)
        st = len;
    if (en > len)
        en = len;
    if (en < st)
        en = st;
    *b0 = o[st];
    *b1 = o[en];
}

static int in_chars(const char *chars, size_t n, uint32_t cp) {
    for (size_t i = 0; i < n;) {
        uint32_t c;
        i = jinja_utf8_next(chars, n, i, &c);
        if (c == cp)
            return 1;
    }
    return 0;
}

JValue jinja_str_strip(JCtx *cx, JValue sv, JValue chars, int left, int right) {
    const char *s = sv.u.s->s;
    size_t n = sv.u.s->len;
    int ws = !jinja_given(chars) || chars.type != JV_STR;
    const char *cs = ws ? NULL : chars.u.s->s;
    size_t cn = ws ? 0 : chars.u.s->len;
    size_t b = 0, e = n;
    if (left)
        while (b < e) {
            uint32_t cp;
            size_t j = jinja_utf8_next(s, n, b, &cp);
            if (ws ? !jinja_py_isspace(cp) : !in_chars(cs, cn, cp))
                break;
            b = j;
        }
    if (right) {
        size_t keep = b; /* scan forward, remember the end of the last kept character */
        for (size_t i = b; i < e;) {
            uint32_t cp;
            size_t j = jinja_utf8_next(s, n, i, &cp);
            if (ws ? !jinja_py_isspace(cp) : !in_chars(cs, cn, cp))
                keep = j;
            i = j;
        }
        e = keep;
    }
    return jinja_str(cx, s + b, e - b);
}

static JValue str_replace(JRender *r, int line, JStr *s, JValue oldv, JValue newv, int64_t count) {
    JCtx *cx = r->cx;
    JStr *old = jinja_want_str(r, line, oldv, "replace() argument 1");
    JStr *rep = jinja_want_str(r, line, newv, "replace() argument 2");
    JBuf b = {0};
    jinja_buf_put(cx, &b, "", 0);
    if (!old->len) { /* inserts rep before every character and at the end */
        size_t i = 0;
        int64_t done = 0;
        while (i <= s->len) {
            if (count >= 0 && done >= count) {
                jinja_buf_put(cx, &b, s->s + i, s->len - i);
                break;
            }
            jinja_buf_put(cx, &b, rep->s, rep->len);
            done++;
            if (i == s->len)
                break;
            size_t j = jinja_utf8_next(s->s, s->len, i, NULL);
            jinja_buf_put(cx, &b, s->s + i, j - i);
            i = j;
        }
        return jinja_strbuf(cx, &b);
    }
    size_t i = 0;
    int64_t done = 0;
    while (i < s->len) {
        const char *hit =
            count >= 0 && done >= count ? NULL : memmem(s->s + i, s->len - i, old->s, old->len);
        if (!hit) {
            jinja_buf_put(cx, &b, s->s + i, s->len - i);
            break;
        }
        size_t at = (size_t)(hit - s->s);
        jinja_buf_put(cx, &b, s->s + i, at - i);
        jinja_buf_put(cx, &b, rep->s, rep->len);
        i = at + old->len;
        done++;
    }
    return jinja_strbuf(cx, &b);
}

static JValue str_split(JRender *r, int line, JStr *s, JValue sepv, int64_t maxsplit, int rev) {
    JCtx *cx = r->cx;
    JValue out = jinja_list_new(cx, 4);
    if (jinja_given(sepv) && sepv.type != JV_NONE) {
        JStr *sep = jinja_want_str(r, line, sepv, "separator");
        if (!sep->len)
            jinja_fail(cx, line, "empty separator");
        if (!rev) {
            size_t i = 0;
            int64_t done = 0;
            for (;;) {
                const char *hit = maxsplit >= 0 && done >= maxsplit
                                      ? NULL
                                      : memmem(s->s + i, s->len - i, sep->s, sep->len);
                if (!hit) {
                    jinja_list_push(cx, out.u.l, jinja_str(cx, s->s + i, s->len - i));
                    return out;
                }
                size_t at = (size_t)(hit - s->s);
                jinja_list_push(cx, out.u.l, jinja_str(cx, s->s + i, at - i));
                i = at + sep->len;
                done++;
            }
        }
        /* rsplit: collect from the right, then reverse */
        JValue tmp = jinja_list_new(cx, 4);
        size_t end = s->len;
        int64_t done = 0;
        for (;;) {
            size_t at = (size_t)-1;
            if (!(maxsplit >= 0 && done >= maxsplit) && end >= sep->len)
                for (size_t k = end - sep->len + 1; k-- > 0;)
                    if (!memcmp(s->s + k, sep->s, sep->len)) {
                        at = k;
                        break;
                    }
            if (at == (size_t)-1) {
                jinja_list_push(cx, tmp.u.l, jinja_str(cx, s->s, end));
                break;
            }
            jinja_list_push(cx, tmp.u.l, jinja_str(cx, s->s + at + sep->len, end - at - sep->len));
            end = at;
            done++;
        }
        for (size_t k = tmp.u.l->len; k-- > 0;)
            jinja_list_push(cx, out.u.l, tmp.u.l->v[k]);
        return out;
    }
    /* whitespace runs */
    size_t count;
    size_t *o = cp_offsets(cx, s->s, s->len, &count);
    int *sp = jinja_alloc(cx, (count + 1) * sizeof *sp);
    for (size_t k = 0; k < count; k++) {
        uint32_t cp;
        jinja_utf8_next(s->s, s->len, o[k], &cp);
        sp[k] = jinja_py_isspace(cp);
    }
    if (!rev) {
        size_t k = 0;
        int64_t done = 0;
        for (;;) {
            while (k < count && sp[k])
                k++;
            if (k >= count)
                break;
            if (maxsplit >= 0 && done >= maxsplit) {
                jinja_list_push(cx, out.u.l, jinja_str(cx, s->s + o[k], s->len - o[k]));
                break;
            }
            size_t j = k;
            while (j < count && !sp[j])
                j++;
            jinja_list_push(cx, out.u.l, jinja_str(cx, s->s + o[k], o[j] - o[k]));
            done++;
            k = j;
        }
        return out;
    }
    JValue tmp = jinja_list_new(cx, 4);
    size_t k = count;
    int64_t done = 0;
    for (;;) {
        while (k > 0 && sp[k - 1])
            k--;
        if (!k)
            break;
        if (maxsplit >= 0 && done >= maxsplit) {
            jinja_list_push(cx, tmp.u.l, jinja_str(cx, s->s, o[k]));
            break;
        }
        size_t j = k;
        while (j > 0 && !sp[j - 1])
            j--;
        jinja_list_push(cx, tmp.u.l, jinja_str(cx, s->s + o[j], o[k] - o[j]));
        done++;
        k = j;
    }
    for (size_t i = tmp.u.l->len; i-- > 0;)
        jinja_list_push(cx, out.u.l, tmp.u.l->v[i]);
    return out;
}

static int is_line_break(uint32_t cp) {
    return cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c || cp == 0x1c || cp == 0x1d ||
           cp == 0x1e || cp == 0x85 || cp == 0x2028 || cp == 0x2029;
}

static JValue str_splitlines(JCtx *cx, JStr *s, int keepends) {
    JValue out = jinja_list_new(cx, 4);
    size_t start = 0, i = 0;
    while (i < s->len) {
        uint32_t cp;
        size_t j = jinja_utf8_next(s->s, s->len, i, &cp);
        if (is_line_break(cp)) {
            size_t eol = j;
            if (cp == '\r' && j < s->len && s->s[j] == '\n')
                eol = j + 1;
            jinja_list_push(cx, out.u.l, jinja_str(cx, s->s + start, (keepends ? eol : i) - start));
            start = i = eol;
            continue;
        }
        i = j;
    }
    if (start < s->len)
        jinja_list_push(cx, out.u.l, jinja_str(cx, s->s + start, s->len - start));
    return out;
}

static int starts_or_ends(JRender *r, int line, JStr *s, JValue arg, JValue start, JValue end,
                          int ends) {
    size_t b0, b1;
    sub_range(r, line, s, start, end, &b0, &b1);
    JList one = {1, 1, &arg};
    JList *cands = arg.type == JV_LIST && (arg.flags & JF_TUPLE) ? arg.u.l : &one;
    for (size_t i = 0; i < cands->len; i++) {
        JStr *p = jinja_want_str(r, line, cands->v[i], ends ? "endswith arg" : "startswith arg");
        if (p->len <= b1 - b0 && !memcmp(s->s + (ends ? b1 - p->len : b0), p->s, p->len))
            return 1;
    }
    return 0;
}

/* find / rfind / index / rindex / count of sub in s[start:end], in code points */
static int64_t str_find(JRender *r, int line, JStr *s, JValue subv, JValue start, JValue end,
                        int rev, int64_t *count) {
    JStr *sub = jinja_want_str(r, line, subv, "substring");
    size_t b0, b1;
    sub_range(r, line, s, start, end, &b0, &b1);
    int64_t found = -1, n = 0;
    if (count && !sub->len) {
        *count = (int64_t)jinja_utf8_count(s->s + b0, b1 - b0) + 1;
        return 0;
    }
    for (size_t i = b0; i + sub->len <= b1;) {
        if (!memcmp(s->s + i, sub->s, sub->len)) {
            found = (int64_t)jinja_utf8_count(s->s, i);
            n++;
            if (!rev && !count)
                break;
            if (count) {
                i += sub->len ? sub->len : 1;
                continue;
            }
        }
        if (i >= b1)
            break;
        i = jinja_utf8_next(s->s, b1, i, NULL);
    }
    if (count)
        *count = n;
    return found;
}

/* ---- str.format ---- */

static void pad(JCtx *cx, JBuf *b, const char *s, size_t n, char align, uint32_t fill,
                int64_t width) {
    int64_t len = (int64_t)jinja_utf8_count(s, n), padn = width > len ? width - len : 0;
    int64_t left = align == '>' ? padn : align == '^' ? padn / 2 : 0;
    for (int64_t i = 0; i < left; i++)
        jinja_utf8_put(cx, b, fill);
    jinja_buf_put(cx, b, s, n);
    for (int64_t i = 0; i < padn - left; i++)
        jinja_utf8_put(cx, b, fill);
}

/* format(value, spec) for the common specs: [[fill]align][0][width][.precision][type] */
static void format_spec(JRender *r, int line, JBuf *b, JValue v, const char *spec, size_t n) {
    JCtx *cx = r->cx;
    if (!n) {
        jinja_put_str(cx, b, v);
        return;
    }
    size_t i = 0;
    uint32_t fill = ' ';
    char align = 0;
    if (n >= 2 && strchr("<>^", spec[1]) && spec[1]) {
        fill = (unsigned char)spec[0];
        align = spec[1];
        i = 2;
    } else if (strchr("<>^", spec[0]) && spec[0]) {
        align = spec[0];
        i = 1;
    }
    if (i < n && spec[i] == '0' && !align) {
        fill = '0';
        align = '=';
        i++;
    }
    int64_t width = 0, prec = -1;
    while (i < n && spec[i] >= '0' && spec[i] <= '9')
        width = width * 10 + (spec[i++] - '0');
    if (i < n && spec[i] == '.') {
        prec = 0;
        i++;
        while (i < n && spec[i] >= '0' && spec[i] <= '9')
            prec = prec * 10 + (spec[i++] - '0');
    }
    char type = i < n ? spec[i++] : 0;
    if (i != n)
        jinja_fail(cx, line, "unsupported format spec '%.*s'", (int)n, spec);
    JBuf t = {0};
    jinja_buf_put(cx, &t, "", 0);
    int numeric = v.type == JV_INT || v.type == JV_FLOAT || v.type == JV_BOOL;
    if (type == 'f' || type == 'F' || type == 'e' || type == 'g' || type == '%') {
        if (!numeric)
            jinja_fail(cx, line, "Unknown format code '%c' for object of type '%s'", type,
                       jinja_type_name(v));
        double f = v.type == JV_FLOAT ? v.u.f : v.type == JV_INT ? (double)v.u.i : v.u.b;
        char fmt[8] = {'%', '.', '*', type == '%' ? 'f' : type, 0};
        jinja_buf_printf(cx, &t, fmt, (int)(prec < 0 ? 6 : prec), type == '%' ? f * 100 : f);
        if (type == '%')
            jinja_buf_putc(cx, &t, '%');
    } else if (type == 'd') {
        if (v.type != JV_INT && v.type != JV_BOOL)
            jinja_fail(cx, line, "Unknown format code 'd' for object of type '%s'",
                       jinja_type_name(v));
        jinja_buf_printf(cx, &t, "%lld", (long long)(v.type == JV_INT ? v.u.i : v.u.b));
    } else if (type == 's' || type == 0) {
        if (type == 's' && v.type != JV_STR)
            jinja_fail(cx, line, "Unknown format code 's' for object of type '%s'",
                       jinja_type_name(v));
        jinja_put_str(cx, &t, v);
        if (prec >= 0 && v.type == JV_STR) {
            size_t count;
            size_t *o = cp_offsets(cx, t.p, t.len, &count);
            if ((size_t)prec < count)
                t.len = o[prec];
        }
    } else {
        jinja_fail(cx, line, "unsupported format code '%c'", type);
    }
    if (!align)
        align = numeric ? '>' : '<';
    if (align == '=') { /* zero padding after the sign */
        size_t sign = t.len && (t.p[0] == '-' || t.p[0] == '+');
        jinja_buf_put(cx, b, t.p, sign);
        pad(cx, b, t.p + sign, t.len - sign, '>', fill, width - (int64_t)sign);
        return;
    }
    pad(cx, b, t.p, t.len, align, fill, width);
}

static JValue str_format(JRender *r, int line, JStr *s, JArgs *a) {
    JCtx *cx = r->cx;
    JBuf b = {0};
    jinja_buf_put(cx, &b, "", 0);
    int auto_idx = 0;
    for (size_t i = 0; i < s->len; i++) {
        char c = s->s[i];
        if (c == '}') {
            if (i + 1 < s->len && s->s[i + 1] == '}')
                i++;
            else
                jinja_fail(cx, line, "Single '}' encountered in format string");
            jinja_buf_putc(cx, &b, '}');
            continue;
        }
        if (c != '{') {
            jinja_buf_putc(cx, &b, c);
            continue;
        }
        if (i + 1 < s->len && s->s[i + 1] == '{') {
            jinja_buf_putc(cx, &b, '{');
            i++;
            continue;
        }
        size_t j = i + 1;
        while (j < s->len && s->s[j] != '}')
            j++;
        if (j >= s->len)
            jinja_fail(cx, line, "expected '}' before end of string");
        const char *f = s->s + i + 1;
        size_t fn = j - i - 1, name_end = 0;
        while (name_end < fn && f[name_end] != '!' && f[name_end] != ':' && f[name_end] != '.' &&
               f[name_end] != '[')
            name_end++;
        JValue v;
        if (!name_end) {
            if (auto_idx >= a->n)
                jinja_fail(cx, line, "Replacement index %d out of range for positional args tuple",
                           auto_idx);
            v = a->v[auto_idx++];
        } else if (f[0] >= '0' && f[0] <= '9') {
            int idx = atoi(f);
            if (idx >= a->n)
                jinja_fail(cx, line, "Replacement index %d out of range for positional args tuple",
                           idx);
            v = a->v[idx];
        } else {
            char key[128];
            snprintf(key, sizeof key, "%.*s", (int)name_end, f);
            v = jinja_arg(a, -1, key, jinja_ng());
            if (!jinja_given(v))
                jinja_fail(cx, line, "'%s'", key);
        }
        size_t k = name_end;
        while (k < fn && (f[k] == '.' || f[k] == '[')) {
            size_t e = k + 1;
            while (e < fn && f[e] != '.' && f[e] != '[' && f[e] != ']' && f[e] != '!' &&
                   f[e] != ':')
                e++;
            char part[128];
            snprintf(part, sizeof part, "%.*s", (int)(e - k - 1), f + k + 1);
            if (f[k] == '.') {
                v = jinja_getattr(r, line, v, part);
            } else {
                char *endp;
                long idx = strtol(part, &endp, 10);
                v = jinja_getitem(r, line, v,
                                  *endp || !*part ? jinja_cstr(cx, part) : jinja_int(idx));
                if (e < fn && f[e] == ']')
                    e++;
            }
            k = e;
        }
        char conv = 0;
        if (k < fn && f[k] == '!') {
            conv = k + 1 < fn ? f[k + 1] : 0;
            k += 2;
        }
        if (conv == 'r' || conv == 'a') {
            JBuf t = {0};
            jinja_put_repr(cx, &t, v);
            v = jinja_strbuf(cx, &t);
        } else if (conv == 's') {
            v = jinja_to_str(cx, v);
        }
        if (k < fn && f[k] == ':')
            format_spec(r, line, &b, v, f + k + 1, fn - k - 1);
        else
            jinja_put_str(cx, &b, v);
        i = j;
    }
    return jinja_strbuf(cx, &b);
}

/* ---- printf-style "%" ---- */

JValue jinja_str_percent(JRender *r, int line, JStr *s, JValue args) {
    JCtx *cx = r->cx;
    JList one = {1, 1, &args};
    JList *list = args.type == JV_LIST && (args.flags & JF_TUPLE) ? args.u.l : &one;
    size_t used = 0;
    JBuf b = {0};
    jinja_buf_put(cx, &b, "", 0);
    for (size_t i = 0; i < s->len; i++) {
        if (s->s[i] != '%') {
            jinja_buf_putc(cx, &b, s->s[i]);
            continue;
        }
        i++;
        JValue v;
        int have = 0;
        if (i < s->len && s->s[i] == '(') { /* %(name)s */
            size_t e = i + 1;
            while (e < s->len && s->s[e] != ')')
                e++;
            if (args.type != JV_DICT)
                jinja_fail(cx, line, "format requires a mapping");
            JValue key = jinja_str(cx, s->s + i + 1, e - i - 1);
            if (!jinja_dict_get(args.u.d, key, &v))
                jinja_fail(cx, line, "'%s'", key.u.s->s);
            have = 1;
            i = e + 1;
        }
        char flags[8] = {0};
        int nf = 0;
        while (i < s->len && strchr("-+ 0#", s->s[i]) && s->s[i] && nf < 6)
            flags[nf++] = s->s[i++];
        int width = 0, prec = -1;
        while (i < s->len && s->s[i] >= '0' && s->s[i] <= '9')
            width = width * 10 + (s->s[i++] - '0');
        if (i < s->len && s->s[i] == '.') {
            prec = 0;
            i++;
            while (i < s->len && s->s[i] >= '0' && s->s[i] <= '9')
                prec = prec * 10 + (s->s[i++] - '0');
        }
        if (i >= s->len)
            jinja_fail(cx, line, "incomplete format");
        char conv = s->s[i];
        if (conv == '%') {
            jinja_buf_putc(cx, &b, '%');
            continue;
        }
        if (!have) {
            if (used >= list->len)
                jinja_fail(cx, line, "not enough arguments for format string");
            v = list->v[used++];
        }
        char fmt[32];
        int left = strchr(flags, '-') != NULL;
        JBuf t = {0};
        jinja_buf_put(cx, &t, "", 0);
        if (conv == 's' || conv == 'r') {
            if (conv == 's')
                jinja_put_str(cx, &t, v);
            else
                jinja_put_repr(cx, &t, v);
            if (prec >= 0 && (size_t)prec < t.len)
                t.len = (size_t)prec;
            pad(cx, &b, t.p, t.len, left ? '<' : '>', ' ', width);
            continue;
        }
        double f;
        if (v.type == JV_INT || v.type == JV_BOOL)
            f = (double)(v.type == JV_INT ? v.u.i : v.u.b);
        else if (v.type == JV_FLOAT)
            f = v.u.f;
        else
            jinja_fail(cx, line, "%%%c format: a real number is required, not %s", conv,
                       jinja_type_name(v));
        if (conv == 'd' || conv == 'i' || conv == 'x' || conv == 'X' || conv == 'o') {
            long long iv = v.type == JV_INT ? v.u.i : v.type == JV_BOOL ? v.u.b : (long long)f;
            snprintf(fmt, sizeof fmt, "%%%s%d%s", flags, width,
                     conv == 'x'   ? "llx"
                     : conv == 'X' ? "llX"
                     : conv == 'o' ? "llo"
                                   : "lld");
            jinja_buf_printf(cx, &b, fmt, iv);
        } else if (strchr("eEfFgG", conv)) {
            snprintf(fmt, sizeof fmt, "%%%s%d.%d%c", flags, width, prec < 0 ? 6 : prec, conv);
            jinja_buf_printf(cx, &b, fmt, f);
        } else {
            jinja_fail(cx, line, "unsupported format character '%c'", conv);
        }
    }
    if (used < list->len && args.type != JV_DICT)
        jinja_fail(cx, line, "not all arguments converted during string formatting");
    return jinja_strbuf(cx, &b);
}

static JValue str_is(JStr *s, const char *what) {
    if (!s->len)
        return jinja_bool(0);
    int any_cased = 0, lower = !strcmp(what, "islower"), upper = !strcmp(what, "isupper");
    for (size_t i = 0; i < s->len;) {
        uint32_t c;
        i = jinja_utf8_next(s->s, s->len, i, &c);
        int digit = c >= '0' && c <= '9';
        int alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= 0x80 && !jinja_py_isspace(c) && !(c >= 0x2000 && c <= 0x206f));
        if (!strcmp(what, "isdigit") || !strcmp(what, "isdecimal") || !strcmp(what, "isnumeric")) {
            if (!digit)
                return jinja_bool(0);
        } else if (!strcmp(what, "isalpha")) {
            if (!alpha)
                return jinja_bool(0);
        } else if (!strcmp(what, "isalnum")) {
            if (!alpha && !digit)
                return jinja_bool(0);
        } else if (!strcmp(what, "isspace")) {
            if (!jinja_py_isspace(c))
                return jinja_bool(0);
        } else if (lower || upper) {
            int is_upper = jinja_cp_lower(c) != c, is_lower = jinja_cp_upper(c) != c || c == 0xdf;
            if (lower ? is_upper : is_lower)
                return jinja_bool(0);
            any_cased |= is_upper || is_lower;
        }
    }
    if (lower || upper)
        return jinja_bool(any_cased);
    return jinja_bool(1);
}

JValue jinja_str_method(JRender *r, int line, const char *m, JStr *s, JValue self, JArgs *a) {
    JCtx *cx = r->cx;
    JValue a0 = jinja_arg(a, 0, NULL, jinja_ng()), a1 = jinja_arg(a, 1, NULL, jinja_ng()),
           a2 = jinja_arg(a, 2, NULL, jinja_ng());
    if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
        if (jinja_given(a0) && a0.type != JV_NONE)
            jinja_want_str(r, line, a0, "strip arg");
        return jinja_str_strip(cx, self, a0, m[0] != 'r', m[0] != 'l');
    }
    if (!strcmp(m, "upper") || !strcmp(m, "lower") || !strcmp(m, "casefold"))
        return jinja_str_case(cx, self, m[0] == 'u' ? JCASE_UPPER : JCASE_LOWER);
    if (!strcmp(m, "swapcase"))
        return jinja_str_case(cx, self, JCASE_SWAP);
    if (!strcmp(m, "title"))
        return jinja_str_case(cx, self, JCASE_TITLE);
    if (!strcmp(m, "capitalize"))
        return jinja_str_case(cx, self, JCASE_CAPITALIZE);
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith"))
        return jinja_bool(starts_or_ends(r, line, s, a0, a1, a2, m[0] == 'e'));
    if (!strcmp(m, "split") || !strcmp(m, "rsplit")) {
        JValue sep = jinja_arg(a, 0, "sep", jinja_ng());
        JValue maxv = jinja_arg(a, 1, "maxsplit", jinja_ng());
        return str_split(r, line, s, sep,
                         jinja_given(maxv) ? jinja_want_int(r, line, maxv, "maxsplit") : -1,
                         m[0] == 'r');
    }
    if (!strcmp(m, "splitlines")) {
        JValue keep = jinja_arg(a, 0, "keepends", jinja_ng());
        return str_splitlines(cx, s, jinja_given(keep) && jinja_truthy(keep));
    }
    if (!strcmp(m, "replace"))
        return str_replace(r, line, s, a0, a1,
                           jinja_given(a2) ? jinja_want_int(r, line, a2, "count") : -1);
    if (!strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "index") || !strcmp(m, "rindex")) {
        int64_t at = str_find(r, line, s, a0, a1, a2, m[0] == 'r', NULL);
        if (at < 0 && strstr(m, "index"))
            jinja_fail(cx, line, "substring not found");
        return jinja_int(at);
    }
    if (!strcmp(m, "count")) {
        int64_t n;
        str_find(r, line, s, a0, a1, a2, 0, &n);
        return jinja_int(n);
    }
    if (!strcmp(m, "join")) {
        JList *items = jinja_iter(cx, line, a0);
        JBuf b = {0};
        jinja_buf_put(cx, &b, "", 0);
        for (size_t i = 0; i < items->len; i++) {
            if (i)
                jinja_buf_put(cx, &b, s->s, s->len);
            JStr *it = jinja_want_str(r, line, items->v[i], "sequence item");
            jinja_buf_put(cx, &b, it->s, it->len);
        }
        return jinja_strbuf(cx, &b);
    }
    if (!strcmp(m, "format"))
        return str_format(r, line, s, a);
    if (!strcmp(m, "removeprefix") || !strcmp(m, "removesuffix")) {
        JStr *p = jinja_want_str(r, line, a0, m);
        int suffix = m[6] == 's';
        if (p->len <= s->len && !memcmp(s->s + (suffix ? s->len - p->len : 0), p->s, p->len))
            return jinja_str(cx, s->s + (suffix ? 0 : p->len), s->len - p->len);
        return self;
    }
    if (!strcmp(m, "partition") || !strcmp(m, "rpartition")) {
        JStr *sep = jinja_want_str(r, line, a0, "separator");
        if (!sep->len)
            jinja_fail(cx, line, "empty separator");
        const char *hit = NULL;
        if (m[0] == 'r') {
            for (size_t k = s->len >= sep->len ? s->len - sep->len + 1 : 0; k-- > 0;)
                if (!memcmp(s->s + k, sep->s, sep->len)) {
                    hit = s->s + k;
                    break;
                }
        } else {
            hit = memmem(s->s, s->len, sep->s, sep->len);
        }
        JValue t = jinja_list_new(cx, 3);
        t.flags = JF_TUPLE;
        JValue empty = jinja_str(cx, "", 0);
        if (!hit) {
            jinja_list_push(cx, t.u.l, m[0] == 'r' ? empty : self);
            jinja_list_push(cx, t.u.l, empty);
            jinja_list_push(cx, t.u.l, m[0] == 'r' ? self : empty);
            return t;
        }
        size_t at = (size_t)(hit - s->s);
        jinja_list_push(cx, t.u.l, jinja_str(cx, s->s, at));
        jinja_list_push(cx, t.u.l, a0);
        jinja_list_push(cx, t.u.l, jinja_str(cx, s->s + at + sep->len, s->len - at - sep->len));
        return t;
    }
    if (!strcmp(m, "center") || !strcmp(m, "ljust") || !strcmp(m, "rjust") || !strcmp(m, "zfill")) {
        int64_t width = jinja_want_int(r, line, a0, "width");
        JBuf b = {0};
        jinja_buf_put(cx, &b, "", 0);
        if (m[0] == 'z') {
            size_t sign = s->len && (s->s[0] == '-' || s->s[0] == '+');
            jinja_buf_put(cx, &b, s->s, sign);
            pad(cx, &b, s->s + sign, s->len - sign, '>', '0', width - (int64_t)sign);
            return jinja_strbuf(cx, &b);
        }
        uint32_t fill = ' ';
        if (jinja_given(a1)) {
            JStr *f = jinja_want_str(r, line, a1, "fill character");
            jinja_utf8_next(f->s, f->len, 0, &fill);
        }
        if (m[0] == 'c') { /* Python centers with the extra space on the right for odd n */
            int64_t len = (int64_t)jinja_utf8_count(s->s, s->len), padn = width - len;
            int64_t left = padn > 0 ? padn / 2 + (padn & width & 1) : 0;
            for (int64_t i = 0; i < left; i++)
                jinja_utf8_put(cx, &b, fill);
            pad(cx, &b, s->s, s->len, '<', fill, width - left);
            return jinja_strbuf(cx, &b);
        }
        pad(cx, &b, s->s, s->len, m[0] == 'l' ? '<' : '>', fill, width);
        return jinja_strbuf(cx, &b);
    }
    if (!strncmp(m, "is", 2))
        return str_is(s, m);
    jinja_fail(cx, line, "str.%s() is not supported", m);
}
