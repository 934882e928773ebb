/* gbnf.c - llama.cpp's GBNF grammar syntax to rules. A rule is `name ::= alternatives` and
 * ends at a newline outside parentheses (a newline after `|` continues it); # starts a
 * comment. Errors name the line and column of the offending byte. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "gr_internal.h"

enum { MAX_NESTING = 200 }; /* parentheses; the parser recurses on each */

typedef struct {
    GrBuilder *b;
    const char *src, *p, *end;
    int depth; /* open parentheses */
} Parser;

/* Record "line L column C: message" for the position p (first error wins); NULL. */
static void *syntax(Parser *ps, const char *p, const char *msg) {
    int line = 1, col = 1;
    for (const char *q = ps->src; q < p; q++) {
        col = *q == '\n' ? 1 : col + 1;
        line += *q == '\n';
    }
    return gr_fail(ps->b, "line %d column %d: %s", line, col, msg);
}

static int is_word(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

static void space(Parser *ps, int newlines) {
    while (ps->p < ps->end) {
        char c = *ps->p;
        if (c == '#')
            while (ps->p < ps->end && *ps->p != '\n')
                ps->p++;
        else if (c == ' ' || c == '\t' || ((c == '\n' || c == '\r') && newlines))
            ps->p++;
        else
            break;
    }
}

/* One character of a literal or class: a UTF-8 sequence or an escape; -1 on error. */
static int64_t parse_char(Parser *ps) {
    if (*ps->p == '\\') {
        if (ps->p + 1 >= ps->end) {
            syntax(ps, ps->p, "unfinished escape");
            return -1;
        }
        char e = ps->p[1];
        int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (digits) {
            uint32_t v = 0;
            for (int i = 0; i < digits; i++) {
                int h = ps->p + 2 + i < ps->end ? gr_hex(ps->p[2 + i]) : -1;
                if (h < 0) {
                    syntax(ps, ps->p, "expected hex digits after \\x, \\u or \\U");
                    return -1;
                }
                v = v << 4 | (uint32_t)h;
            }
            ps->p += 2 + digits;
            if (v > 0x10FFFF) {
                syntax(ps, ps->p - digits - 2, "code point out of range");
                return -1;
            }
            return v;
        }
        static const char from[] = "tnr\\\"[]-^", to[] = "\t\n\r\\\"[]-^";
        const char *k = e ? strchr(from, e) : NULL;
        if (!k) {
            syntax(ps, ps->p, "unknown escape");
            return -1;
        }
        ps->p += 2;
        return (uint8_t)to[k - from];
    }
    uint32_t cp;
    int n = gr_utf8_decode(ps->p, ps->end, &cp);
    if (!n) {
        syntax(ps, ps->p, "invalid UTF-8");
        return -1;
    }
    ps->p += n;
    return cp;
}

static GrNode *alternates(Parser *ps, int nested);

/* Bytes from the parser's position to the first unescaped `close` (or the end): what sizes a
 * literal's or a class's buffer (a character of source gives at most 4 bytes, or one range). */
static size_t extent(const Parser *ps, char close) {
    const char *q = ps->p;
    while (q < ps->end && *q != close)
        q += *q == '\\' && q + 1 < ps->end ? 2 : 1;
    return (size_t)(q - ps->p);
}

static GrNode *literal(Parser *ps) {
    const char *start = ps->p++;
    uint8_t *buf = gr_alloc(ps->b, 4 * extent(ps, '"') + 1);
    size_t n = 0;
    while (ps->p < ps->end && *ps->p != '"') {
        int64_t cp = parse_char(ps);
        if (cp < 0)
            return NULL;
        n += gr_utf8_encode((uint32_t)cp, buf + n);
    }
    if (ps->p >= ps->end)
        return syntax(ps, start, "unterminated string literal");
    ps->p++;
    return gr_bytes(ps->b, buf, n);
}

static GrNode *char_class(Parser *ps) {
    const char *start = ps->p++;
    int negate = ps->p < ps->end && *ps->p == '^';
    ps->p += negate;
    uint32_t *r = gr_alloc(ps->b, 2 * sizeof *r * (extent(ps, ']') + 1));
    int n = 0;
    while (ps->p < ps->end && *ps->p != ']') {
        int64_t lo = parse_char(ps), hi = lo;
        if (lo < 0)
            return NULL;
        if (ps->p + 1 < ps->end && *ps->p == '-' && ps->p[1] != ']') {
            ps->p++;
            if ((hi = parse_char(ps)) < 0)
                return NULL;
            if (hi < lo)
                return syntax(ps, ps->p - 1, "character range out of order");
        }
        r[2 * n] = (uint32_t)lo;
        r[2 * n++ + 1] = (uint32_t)hi;
    }
    if (ps->p >= ps->end)
        return syntax(ps, start, "unterminated character class");
    ps->p++;
    GrNode *x = gr_class(ps->b, r, n, negate, 0);
    return x ? x : syntax(ps, start, "the character class matches nothing");
}

static int parse_int(Parser *ps) {
    if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
        return -1;
    long v = 0;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9' && v < 100000)
        v = v * 10 + (*ps->p++ - '0');
    return v < 100000 ? (int)v : -1;
}

/* A postfix operator after x, if any. */
static GrNode *postfix(Parser *ps, GrNode *x) {
    if (ps->p >= ps->end)
        return x;
    char c = *ps->p;
    if (c == '*' || c == '+' || c == '?') {
        ps->p++;
        return gr_rep(ps->b, x, c == '+', c == '?' ? 1 : -1);
    }
    if (c != '{')
        return x;
    const char *start = ps->p++;
    space(ps, 0);
    int min = parse_int(ps), max = min;
    space(ps, 0);
    if (min >= 0 && ps->p < ps->end && *ps->p == ',') {
        ps->p++;
        space(ps, 0);
        if (ps->p < ps->end && *ps->p == '}')
            max = -1;
        else if ((max = parse_int(ps)) < 0)
            min = -1;
        space(ps, 0);
    }
    if (min < 0 || ps->p >= ps->end || *ps->p != '}' || (max >= 0 && max < min))
        return syntax(ps, start, "expected {m}, {m,} or {m,n} with m <= n < 100000");
    ps->p++;
    return gr_rep(ps->b, x, min, max);
}

static GrNode *sequence(Parser *ps, int nested) {
    GrNodes items = {0};
    for (;;) {
        space(ps, nested);
        if (ps->p >= ps->end)
            break;
        char c = *ps->p;
        GrNode *x;
        if (c == '"')
            x = literal(ps);
        else if (c == '[')
            x = char_class(ps);
        else if (c == '.') {
            ps->p++;
            uint32_t all[2] = {0, 0x10FFFF};
            x = gr_class(ps->b, all, 1, 0, 0);
        } else if (c == '(') {
            const char *open = ps->p++;
            x = ++ps->depth > MAX_NESTING ? syntax(ps, open, "parentheses nested too deeply")
                                          : alternates(ps, 1);
            ps->depth--;
            space(ps, 1);
            if (x && (ps->p >= ps->end || *ps->p != ')'))
                x = syntax(ps, open, "unclosed '('");
            ps->p += x != NULL;
        } else if (is_word(c)) {
            const char *name = ps->p;
            while (ps->p < ps->end && is_word(*ps->p))
                ps->p++;
            const char *after = ps->p;
            space(ps, 1);
            if (ps->end - ps->p >= 3 && !memcmp(ps->p, "::=", 3)) { /* the next rule */
                ps->p = name;
                break;
            }
            ps->p = after;
            int r = gr_rule(ps->b, name, (size_t)(after - name));
            if (ps->b->used_at[r] < 0)
                ps->b->used_at[r] = (int)(name - ps->src);
            x = gr_ref(ps->b, r);
        } else {
            break;
        }
        gr_nodes_push(&items, x ? postfix(ps, x) : NULL);
        if (items.failed)
            break;
    }
    return gr_nodes_finish(ps->b, &items, GN_SEQ);
}

static GrNode *alternates(Parser *ps, int nested) {
    GrNodes alts = {0};
    for (;;) {
        gr_nodes_push(&alts, sequence(ps, nested));
        space(ps, nested);
        if (alts.failed || ps->p >= ps->end || *ps->p != '|')
            return gr_nodes_finish(ps->b, &alts, GN_ALT);
        ps->p++;
        space(ps, 1);
    }
}

GrCompiled *gr_compile_gbnf(const char *src, size_t len, char *err, size_t errlen) {
    return gr_compile_gbnf_schemas(src, len, NULL, NULL, 0, err, errlen);
}

GrCompiled *gr_compile_gbnf_schemas(const char *src, size_t len, const char *const *names,
                                    json_t *const *schemas, int n, char *err, size_t errlen) {
    GrBuilder b;
    gr_builder_init(&b);
    for (int i = 0; i < n && !b.err[0]; i++) { /* defined first: the text may not redefine them */
        GrNode *body = gr_schema_node(&b, schemas[i]);
        int r = gr_rule(&b, names[i], strlen(names[i]));
        b.bodies[r] = body;
        b.used_at[r] = 0;
    }
    Parser ps = {&b, src, src, src + len, 0};
    for (space(&ps, 1); ps.p < ps.end && !b.err[0]; space(&ps, 1)) {
        const char *name = ps.p;
        while (ps.p < ps.end && is_word(*ps.p))
            ps.p++;
        if (ps.p == name) {
            syntax(&ps, ps.p, "expected a rule name");
            break;
        }
        int r = gr_rule(&b, name, (size_t)(ps.p - name));
        space(&ps, 0);
        if (ps.end - ps.p < 3 || memcmp(ps.p, "::=", 3)) {
            syntax(&ps, ps.p, "expected '::='");
            break;
        }
        if (b.bodies[r]) {
            syntax(&ps, name, "rule defined twice");
            break;
        }
        ps.p += 3;
        GrNode *body = alternates(&ps, 0);
        if (!body)
            break;
        b.bodies[r] = body;
        space(&ps, 0);
        if (ps.p < ps.end && *ps.p != '\n' && *ps.p != '\r')
            syntax(&ps, ps.p, "unexpected character");
    }
    int root = -1;
    for (int i = 0; i < b.nrules && !b.err[0]; i++) {
        if (!strcmp(b.names[i], "root"))
            root = i;
        if (!b.bodies[i]) {
            char msg[300];
            snprintf(msg, sizeof msg, "undefined rule '%.200s'", b.names[i]);
            syntax(&ps, src + b.used_at[i], msg);
        }
    }
    if (root < 0 && !b.err[0])
        gr_fail(&b, "the grammar has no 'root' rule");
    return gr_finish(&b, root, err, errlen);
}
