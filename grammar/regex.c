/* regex.c - a practical regular-expression subset to rules (vLLM's guided_regex, JSON
 * schema patterns): literals, escapes, classes with \d \w \s and their negations, `.`,
 * groups, alternation and counted repetition. Anchors are implicit (the whole output
 * matches); what a grammar cannot express (backreferences, lookaround, \b) is refused by
 * name. For a JSON string's pattern the characters a string must escape are written
 * escaped when literal, and left out of classes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "gr_internal.h"

typedef struct {
    GrBuilder *b;
    const char *src, *p, *end;
    int json; /* inside a JSON string */
} Re;

static void *re_fail(Re *re, const char *msg) {
    return gr_fail(re->b, "regex: %s at offset %d", msg, (int)(re->p - re->src));
}

/* Growing list of code point ranges. */
typedef struct {
    uint32_t *r;
    int n, cap;
} Ranges;

static void add(Ranges *rs, uint32_t lo, uint32_t hi) {
    if (rs->n == rs->cap) {
        rs->cap = rs->cap ? 2 * rs->cap : 16;
        rs->r = pl_xrealloc(rs->r, 2 * rs->cap * sizeof *rs->r);
    }
    rs->r[2 * rs->n] = lo;
    rs->r[2 * rs->n++ + 1] = hi;
}

/* \d \w \s and their negations into rs; 0 when c is none of them. */
static int add_shorthand(Ranges *rs, char c) {
    static const uint32_t d[] = {'0', '9'}, w[] = {'0', '9', 'A', 'Z', '_', '_', 'a', 'z'},
                          s[] = {'\t', '\r', ' ', ' '};
    const uint32_t *set = c == 'd' || c == 'D' ? d : c == 'w' || c == 'W' ? w : s;
    int n = c == 'd' || c == 'D' ? 1 : c == 'w' || c == 'W' ? 4 : 2;
    if (!strchr("dDwWsS", c) || !c)
        return 0;
    if (c >= 'a') {
        for (int i = 0; i < n; i++)
            add(rs, set[2 * i], set[2 * i + 1]);
        return 1;
    }
    uint32_t next = 0; /* the complement of a sorted set */
    for (int i = 0; i < n; i++) {
        if (set[2 * i] > next)
            add(rs, next, set[2 * i] - 1);
        next = set[2 * i + 1] + 1;
    }
    add(rs, next, 0x10FFFF);
    return 1;
}

/* One literal character (after a backslash when esc); -1 with the error set. */
static int64_t re_char(Re *re, int esc) {
    if (re->p >= re->end)
        return (re_fail(re, "the pattern ends inside an escape or a range"), -1);
    if (esc) {
        char c = *re->p++;
        int digits = c == 'x' ? 2 : c == 'u' ? 4 : 0;
        if (digits) {
            uint32_t v = 0;
            for (int i = 0; i < digits; i++) {
                int h = re->p < re->end ? gr_hex(*re->p) : -1;
                if (h < 0)
                    return (re_fail(re, "expected hex digits"), -1);
                v = v << 4 | (uint32_t)h;
                re->p++;
            }
            return v;
        }
        const char *k = strchr("ntrfv0", c);
        if (k && c)
            return (uint8_t) "\n\t\r\f\v"[k - "ntrfv0"];
        if (c == 'b' || c == 'B')
            return (re_fail(re, "\\b and \\B (word boundaries) are not supported"), -1);
        if (c >= '1' && c <= '9')
            return (re_fail(re, "backreferences are not supported"), -1);
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
            return (re_fail(re, "unknown escape"), -1);
        return (uint8_t)c;
    }
    uint32_t cp;
    int n = gr_utf8_decode(re->p, re->end, &cp);
    if (!n)
        return (re_fail(re, "invalid UTF-8"), -1);
    re->p += n;
    return cp;
}

/* A literal code point as bytes; inside a JSON string, the escape JSON needs. */
static GrNode *literal(Re *re, uint32_t cp) {
    uint8_t buf[8];
    if (re->json && (cp < 0x20 || cp == '"' || cp == '\\')) {
        char esc[8];
        int n = cp == '"' || cp == '\\' ? snprintf(esc, sizeof esc, "\\%c", (char)cp)
                                        : snprintf(esc, sizeof esc, "\\u%04x", cp);
        return gr_bytes(re->b, esc, (size_t)n);
    }
    return gr_bytes(re->b, buf, (size_t)gr_utf8_encode(cp, buf));
}

static GrNode *ranges_node(Re *re, Ranges *rs, int negate) {
    GrNode *x = gr_class(re->b, rs->r, rs->n, negate, re->json);
    free(rs->r);
    return x ? x : re_fail(re, "the character class matches nothing");
}

static GrNode *char_class(Re *re) {
    re->p++;
    int negate = re->p < re->end && *re->p == '^';
    re->p += negate;
    Ranges rs = {0};
    for (int first = 1; re->p < re->end && (*re->p != ']' || first); first = 0) {
        int64_t lo;
        if (*re->p == '\\' && re->p + 1 < re->end && add_shorthand(&rs, re->p[1])) {
            re->p += 2;
            continue;
        }
        if (*re->p == '[' && re->p + 1 < re->end && re->p[1] == ':') {
            free(rs.r);
            return re_fail(re, "POSIX classes [:name:] are not supported");
        }
        int esc = *re->p == '\\';
        re->p += esc;
        if (re->p >= re->end || (lo = re_char(re, esc)) < 0)
            break;
        int64_t hi = lo;
        if (re->p + 1 < re->end && *re->p == '-' && re->p[1] != ']') {
            re->p++;
            esc = *re->p == '\\';
            re->p += esc;
            if ((hi = re_char(re, esc)) < 0)
                break;
            if (hi < lo) {
                free(rs.r);
                return re_fail(re, "character range out of order");
            }
        }
        add(&rs, (uint32_t)lo, (uint32_t)hi);
    }
    if (re->p >= re->end || *re->p != ']' || re->b->err[0]) {
        free(rs.r);
        return re_fail(re, "unterminated character class");
    }
    re->p++;
    return ranges_node(re, &rs, negate);
}

static GrNode *alternation(Re *re, int depth);

static GrNode *atom(Re *re, int depth) {
    char c = *re->p;
    if (c == '[')
        return char_class(re);
    if (c == '.') {
        re->p++;
        Ranges rs = {0};
        add(&rs, '\n', '\n');
        return ranges_node(re, &rs, 1);
    }
    if (c == '(') {
        re->p++;
        if (re->p < re->end && *re->p == '?') {
            if (re->end - re->p >= 2 && re->p[1] == ':')
                re->p += 2;
            else if (re->end - re->p >= 3 && (re->p[1] == 'P' || re->p[1] == '<') &&
                     (re->p[1] == 'P' || (re->p[2] != '=' && re->p[2] != '!'))) {
                const char *close = memchr(re->p, '>', (size_t)(re->end - re->p));
                if (!close)
                    return re_fail(re, "unterminated group name");
                re->p = close + 1;
            } else {
                return re_fail(re, "lookaround and inline flags are not supported");
            }
        }
        if (depth >= 200) /* the parser recurses on each group */
            return re_fail(re, "groups nested too deeply");
        GrNode *x = alternation(re, depth + 1);
        if (x && (re->p >= re->end || *re->p != ')'))
            return re_fail(re, "missing ')'");
        re->p += x != NULL;
        return x;
    }
    if (c == '\\') {
        Ranges rs = {0};
        if (re->p + 1 < re->end && add_shorthand(&rs, re->p[1])) {
            re->p += 2;
            return ranges_node(re, &rs, 0);
        }
        if (++re->p >= re->end)
            return re_fail(re, "trailing backslash");
    }
    if (c == '^' || c == '$')
        return re_fail(re, "^ and $ are supported only at the ends of the pattern");
    if (c == '*' || c == '+' || c == '?')
        return re_fail(re, "nothing to repeat");
    int64_t cp = re_char(re, c == '\\');
    return cp < 0 ? NULL : literal(re, (uint32_t)cp);
}

/* {m}, {m,} or {m,n} at re->p: 1 with *min, *max; 0 when it is no quantifier (a literal). */
static int counted(Re *re, int *min, int *max) {
    const char *p = re->p + 1;
    long m = 0, n = -1;
    if (p >= re->end || *p < '0' || *p > '9')
        return 0;
    for (; p < re->end && *p >= '0' && *p <= '9' && m < 100000; p++)
        m = m * 10 + (*p - '0');
    n = m;
    if (p < re->end && *p == ',') {
        p++;
        n = -1;
        if (p < re->end && *p >= '0' && *p <= '9')
            for (n = 0; p < re->end && *p >= '0' && *p <= '9' && n < 100000; p++)
                n = n * 10 + (*p - '0');
    }
    if (p >= re->end || *p != '}' || m >= 100000 || n >= 100000)
        return 0;
    re->p = p + 1;
    *min = (int)m;
    *max = (int)n;
    return 1;
}

static GrNode *sequence(Re *re, int depth) {
    GrNodes items = {0};
    while (re->p < re->end && *re->p != '|' && *re->p != ')') {
        if (*re->p == '$' && re->p + 1 == re->end && !depth) {
            re->p++;
            break;
        }
        GrNode *x = atom(re, depth);
        for (int min, max; x && re->p < re->end;) {
            char q = *re->p;
            if (q == '*' || q == '+' || q == '?')
                re->p++, min = q == '+', max = q == '?' ? 1 : -1;
            else if (q != '{' || !counted(re, &min, &max))
                break;
            if (max >= 0 && max < min) {
                x = re_fail(re, "repetition {m,n} with n < m");
                break;
            }
            if (re->p < re->end && *re->p == '+') {
                x = re_fail(re, "possessive quantifiers are not supported");
                break;
            }
            re->p += re->p < re->end && *re->p == '?'; /* lazy: the same language */
            x = gr_rep(re->b, x, min, max);
        }
        gr_nodes_push(&items, x);
        if (!x)
            break;
    }
    return gr_nodes_finish(re->b, &items, GN_SEQ);
}

static GrNode *alternation(Re *re, int depth) {
    GrNodes alts = {0};
    for (;;) {
        gr_nodes_push(&alts, sequence(re, depth));
        if (alts.failed || re->p >= re->end || *re->p != '|')
            return gr_nodes_finish(re->b, &alts, GN_ALT);
        re->p++;
    }
}

GrNode *gr_regex_node(GrBuilder *b, const char *pattern, size_t len, int json_string) {
    Re re = {b, pattern, pattern, pattern + len, json_string};
    if (re.p < re.end && *re.p == '^')
        re.p++;
    GrNode *x = alternation(&re, 0);
    if (x && re.p < re.end)
        return re_fail(&re, "unmatched ')'");
    return x;
}
