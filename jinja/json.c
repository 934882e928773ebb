/* json.c - json.dumps as transformers' tojson filter calls it: ensure_ascii (default off),
 * indent (None, a number of spaces or a string), separators and sort_keys, with Python's
 * escapes, float repr and NaN / Infinity, and its TypeError for values JSON cannot hold. */
#include "jinja_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- json.dumps ---- */

static void put_json_str(JCtx *cx, JBuf *b, const char *s, size_t n, int ensure_ascii) {
    jinja_buf_putc(cx, b, '"');
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t j = jinja_utf8_next(s, n, i, &cp);
        switch (cp) {
            case '"':
                jinja_buf_put(cx, b, "\\\"", 2);
                break;
            case '\\':
                jinja_buf_put(cx, b, "\\\\", 2);
                break;
            case '\n':
                jinja_buf_put(cx, b, "\\n", 2);
                break;
            case '\r':
                jinja_buf_put(cx, b, "\\r", 2);
                break;
            case '\t':
                jinja_buf_put(cx, b, "\\t", 2);
                break;
            case '\b':
                jinja_buf_put(cx, b, "\\b", 2);
                break;
            case '\f':
                jinja_buf_put(cx, b, "\\f", 2);
                break;
            default:
                if (cp < 0x20) {
                    jinja_buf_printf(cx, b, "\\u%04x", cp);
                } else if (ensure_ascii && cp >= 0x7f) {
                    if (cp >= 0x10000)
                        jinja_buf_printf(cx, b, "\\u%04x\\u%04x", 0xd800 + ((cp - 0x10000) >> 10),
                                         0xdc00 + ((cp - 0x10000) & 0x3ff));
                    else
                        jinja_buf_printf(cx, b, "\\u%04x", cp);
                } else {
                    jinja_buf_put(cx, b, s + i, j - i);
                }
        }
        i = j;
    }
    jinja_buf_putc(cx, b, '"');
}

static void put_json_float(JCtx *cx, JBuf *b, double f) {
    if (isnan(f))
        jinja_buf_put(cx, b, "NaN", 3);
    else if (isinf(f))
        jinja_buf_put(cx, b, f < 0 ? "-Infinity" : "Infinity", f < 0 ? 9 : 8);
    else
        jinja_put_float(b, cx, f);
}

static void json_newline(JCtx *cx, JBuf *b, const char *indent, int level) {
    jinja_buf_putc(cx, b, '\n');
    for (int i = 0; i < level; i++)
        jinja_buf_put(cx, b, indent, strlen(indent));
}

/* A dict key as json.dumps writes it (keys must be str, int, float, bool or None). */
static JValue json_key(JCtx *cx, int line, JValue k) {
    switch (k.type) {
        case JV_STR:
            return k;
        case JV_BOOL:
            return jinja_cstr(cx, k.u.b ? "true" : "false");
        case JV_NONE:
            return jinja_cstr(cx, "null");
        case JV_INT:
            return jinja_to_str(cx, k);
        case JV_FLOAT: {
            JBuf b = {0};
            put_json_float(cx, &b, k.u.f);
            return jinja_strbuf(cx, &b);
        }
        default:
            jinja_fail(cx, line, "keys must be str, int, float, bool or None, not %s",
                       jinja_type_name(k));
    }
}

static int cmp_keys(const void *x, const void *y) {
    const JValue *a = x, *b = y;
    size_t n = a->u.s->len < b->u.s->len ? a->u.s->len : b->u.s->len;
    int c = memcmp(a->u.s->s, b->u.s->s, n);
    return c ? c : (a->u.s->len > b->u.s->len) - (a->u.s->len < b->u.s->len);
}

void jinja_put_json(JCtx *cx, int line, JBuf *b, JValue v, int ensure_ascii, const char *indent,
                    const char *item_sep, const char *key_sep, int sort_keys, int level) {
    switch (v.type) {
        case JV_NONE:
            jinja_buf_put(cx, b, "null", 4);
            return;
        case JV_BOOL:
            jinja_buf_put(cx, b, v.u.b ? "true" : "false", v.u.b ? 4 : 5);
            return;
        case JV_INT:
            jinja_buf_printf(cx, b, "%lld", (long long)v.u.i);
            return;
        case JV_FLOAT:
            put_json_float(cx, b, v.u.f);
            return;
        case JV_STR:
            put_json_str(cx, b, v.u.s->s, v.u.s->len, ensure_ascii);
            return;
        case JV_LIST: {
            if (!v.u.l->len) {
                jinja_buf_put(cx, b, "[]", 2);
                return;
            }
            jinja_buf_putc(cx, b, '[');
            for (size_t i = 0; i < v.u.l->len; i++) {
                if (i)
                    jinja_buf_put(cx, b, item_sep, strlen(item_sep));
                if (indent)
                    json_newline(cx, b, indent, level + 1);
                jinja_put_json(cx, line, b, v.u.l->v[i], ensure_ascii, indent, item_sep, key_sep,
                               sort_keys, level + 1);
            }
            if (indent)
                json_newline(cx, b, indent, level);
            jinja_buf_putc(cx, b, ']');
            return;
        }
        case JV_DICT: {
            if (!v.u.d->len) {
                jinja_buf_put(cx, b, "{}", 2);
                return;
            }
            size_t n = v.u.d->len;
            JValue *keys = jinja_alloc(cx, 2 * n * sizeof *keys), *vals = keys + n;
            for (size_t i = 0; i < n; i++) {
                keys[i] = json_key(cx, line, v.u.d->k[i]);
                vals[i] = v.u.d->v[i];
            }
            size_t *order = jinja_alloc(cx, n * sizeof *order);
            for (size_t i = 0; i < n; i++)
                order[i] = i;
            if (sort_keys) { /* sort (key, index) pairs by key; stable enough for unique keys */
                JValue *sorted = jinja_alloc(cx, n * sizeof *sorted);
                memcpy(sorted, keys, n * sizeof *sorted);
                qsort(sorted, n, sizeof *sorted, cmp_keys);
                for (size_t i = 0; i < n; i++)
                    for (size_t j = 0; j < n; j++)
                        if (keys[j].u.s == sorted[i].u.s) {
                            order[i] = j;
                            break;
                        }
            }
            jinja_buf_putc(cx, b, '{');
            for (size_t i = 0; i < n; i++) {
                size_t k = order[i];
                if (i)
                    jinja_buf_put(cx, b, item_sep, strlen(item_sep));
                if (indent)
                    json_newline(cx, b, indent, level + 1);
                put_json_str(cx, b, keys[k].u.s->s, keys[k].u.s->len, ensure_ascii);
                jinja_buf_put(cx, b, key_sep, strlen(key_sep));
                jinja_put_json(cx, line, b, vals[k], ensure_ascii, indent, item_sep, key_sep,
                               sort_keys, level + 1);
            }
            if (indent)
                json_newline(cx, b, indent, level);
            jinja_buf_putc(cx, b, '}');
            return;
        }
        default:
            jinja_fail(cx, line, "Object of type %s is not JSON serializable", jinja_type_name(v));
    }
}
