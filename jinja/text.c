/* text.c - strings as Python sees them: UTF-8 code points, str.isspace(), and the case
 * mappings behind upper(), lower(), title(), capitalize() and jinja2's |title (simple mappings
 * of Latin-1, Latin Extended-A, Greek and Cyrillic; other scripts are kept as they are). */
#include "jinja_int.h"

#include <string.h>

/* ---- UTF-8 ---- */

size_t jinja_utf8_next(const char *s, size_t n, size_t i, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)s;
    unsigned c = u[i];
    size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (i + k > n)
        k = 1;
    uint32_t v = k == 1 ? c : k == 2 ? c & 0x1f : k == 3 ? c & 0x0f : c & 0x07;
    for (size_t j = 1; j < k; j++) {
        if ((u[i + j] & 0xc0) != 0x80) { /* invalid: one byte */
            k = 1;
            v = c;
            break;
        }
        v = v << 6 | (u[i + j] & 0x3f);
    }
    if (cp)
        *cp = v;
    return i + k;
}

size_t jinja_utf8_count(const char *s, size_t n) {
    size_t count = 0;
    for (size_t i = 0; i < n; i = jinja_utf8_next(s, n, i, NULL))
        count++;
    return count;
}

void jinja_utf8_put(JCtx *cx, JBuf *b, uint32_t cp) {
    char t[4];
    size_t n;
    if (cp < 0x80) {
        t[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        t[0] = (char)(0xc0 | cp >> 6);
        t[1] = (char)(0x80 | (cp & 0x3f));
        n = 2;
    } else if (cp < 0x10000) {
        t[0] = (char)(0xe0 | cp >> 12);
        t[1] = (char)(0x80 | (cp >> 6 & 0x3f));
        t[2] = (char)(0x80 | (cp & 0x3f));
        n = 3;
    } else {
        t[0] = (char)(0xf0 | cp >> 18);
        t[1] = (char)(0x80 | (cp >> 12 & 0x3f));
        t[2] = (char)(0x80 | (cp >> 6 & 0x3f));
        t[3] = (char)(0x80 | (cp & 0x3f));
        n = 4;
    }
    jinja_buf_put(cx, b, t, n);
}

/* Python's str.isspace() for one code point (also what \s matches in re). */
int jinja_py_isspace(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

int jinja_str_isspace(const char *s, size_t n) {
    if (!n)
        return 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i = jinja_utf8_next(s, n, i, &cp);
        if (!jinja_py_isspace(cp))
            return 0;
    }
    return 1;
}

size_t jinja_ws_prefix(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t j = jinja_utf8_next(s, n, i, &cp);
        if (!jinja_py_isspace(cp))
            break;
        i = j;
    }
    return i;
}

size_t jinja_ws_suffix(const char *s, size_t n) {
    size_t run = 0; /* start of the trailing whitespace run */
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t j = jinja_utf8_next(s, n, i, &cp);
        if (!jinja_py_isspace(cp))
            run = j;
        i = j;
    }
    return n - run;
}

/* ---- case mapping ---- */

/* Simple (one to one) case mappings of Python's str for Latin-1, Latin Extended-A, Greek and
 * Cyrillic; other scripts have no case or are left as they are. */
uint32_t jinja_cp_upper(uint32_t c) {
    if (c < 0x80)
        return c >= 'a' && c <= 'z' ? c - 32 : c;
    if (c == 0xb5)
        return 0x39c;
    if (c == 0xff)
        return 0x178;
    if (c >= 0xe0 && c <= 0xfe && c != 0xf7)
        return c - 32;
    if ((c >= 0x100 && c <= 0x137) || (c >= 0x14a && c <= 0x177))
        return c & ~1u;
    if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e))
        return c & 1 ? c : c - 1;
    if (c == 0x131)
        return 'I';
    if (c == 0x17f)
        return 'S';
    if (c >= 0x3b1 && c <= 0x3c9 && c != 0x3c2)
        return c - 32;
    if (c == 0x3c2)
        return 0x3a3;
    if (c == 0x3ac)
        return 0x386;
    if (c >= 0x3ad && c <= 0x3af)
        return c - 37;
    if (c == 0x3cc)
        return 0x38c;
    if (c == 0x3cd || c == 0x3ce)
        return c - 63;
    if (c >= 0x430 && c <= 0x44f)
        return c - 32;
    if (c >= 0x450 && c <= 0x45f)
        return c - 80;
    if ((c >= 0x460 && c <= 0x481) || (c >= 0x48a && c <= 0x4bf))
        return c & ~1u;
    return c;
}

uint32_t jinja_cp_lower(uint32_t c) {
    if (c < 0x80)
        return c >= 'A' && c <= 'Z' ? c + 32 : c;
    if (c >= 0xc0 && c <= 0xde && c != 0xd7)
        return c + 32;
    if (c == 0x178)
        return 0xff;
    if ((c >= 0x100 && c <= 0x137) || (c >= 0x14a && c <= 0x177))
        return c | 1;
    if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e))
        return c & 1 ? c + 1 : c;
    if (c >= 0x391 && c <= 0x3a9 && c != 0x3a2)
        return c + 32;
    if (c == 0x386)
        return 0x3ac;
    if (c >= 0x388 && c <= 0x38a)
        return c + 37;
    if (c == 0x38c)
        return 0x3cc;
    if (c == 0x38e || c == 0x38f)
        return c + 63;
    if (c >= 0x410 && c <= 0x42f)
        return c + 32;
    if (c >= 0x400 && c <= 0x40f)
        return c + 80;
    if ((c >= 0x460 && c <= 0x481) || (c >= 0x48a && c <= 0x4bf))
        return c | 1;
    return c;
}

int jinja_cp_cased(uint32_t c) {
    return jinja_cp_upper(c) != c || jinja_cp_lower(c) != c || c == 0xdf || c == 0x138 ||
           c == 0x149;
}

JValue jinja_str_case(JCtx *cx, JValue sv, int mode) {
    const char *s = sv.u.s->s;
    size_t n = sv.u.s->len;
    JBuf b = {0};
    jinja_buf_put(cx, &b, "", 0);
    int prev_cased = 0, start = 1, first = 1;
    for (size_t i = 0; i < n;) {
        uint32_t c;
        i = jinja_utf8_next(s, n, i, &c);
        /* what happens to c: 'U'pper, 'L'ower, 'T'itle case */
        char act;
        switch (mode) {
            case JCASE_UPPER:
                act = 'U';
                break;
            case JCASE_LOWER:
                act = 'L';
                break;
            case JCASE_SWAP:
                act = jinja_cp_lower(c) != c ? 'L' : 'U';
                break;
            case JCASE_CAPITALIZE:
                act = first ? 'T' : 'L';
                break;
            case JCASE_TITLE: /* str.title() */
                act = prev_cased ? 'L' : 'T';
                break;
            default: { /* jinja2's |title: words split at -, whitespace, (, {, [ and < */
                int sep =
                    c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || jinja_py_isspace(c);
                act = sep ? 'L' : start ? 'U' : 'L';
                start = sep;
            }
        }
        first = 0;
        if (c == 0xdf && act != 'L') { /* sharp s has no one-letter upper case */
            jinja_buf_put(cx, &b, act == 'U' ? "SS" : "Ss", 2);
            prev_cased = 1;
            continue;
        }
        uint32_t m = act == 'L' ? jinja_cp_lower(c) : jinja_cp_upper(c);
        prev_cased = jinja_cp_cased(m);
        jinja_utf8_put(cx, &b, m);
    }
    return jinja_strbuf(cx, &b);
}
