/* lexer.c - template source to tokens, as jinja2's Lexer does it with trim_blocks=True and
 * lstrip_blocks=True (transformers' settings).
 *
 * Newlines are normalized to \n and one trailing newline is dropped (keep_trailing_newline is
 * off). Between tags the text is a data token; "{%-" / "{{-" / "{#-" strip the whitespace
 * before the tag, "-%}" / "-}}" / "-#}" the whitespace after it. trim_blocks removes the first
 * newline after a block or comment tag (not after "+%}"); lstrip_blocks removes spaces and
 * tabs from the start of a line up to a block or comment tag (not for "{%+" or "{{"). Inside a
 * tag: names, numbers, strings (with Python's escapes) and operators; a closing "%}" or "}}"
 * counts only outside brackets. {% raw %} ... {% endraw %} becomes one data token. */
#include "jinja_int.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    JCtx *cx;
    const char *src;
    size_t n, pos;
    int line;
    size_t line_start; /* offset of the current line's first byte */
    JToken *toks;
    int ntok, cap;
    int line_starting; /* the last match ended with a newline (jinja2's line_starting) */
} Lexer;

static void advance(Lexer *L, size_t to) {
    for (size_t i = L->pos; i < to; i++)
        if (L->src[i] == '\n') {
            L->line++;
            L->line_start = i + 1;
        }
    L->pos = to;
}

static int col_of(const Lexer *L, size_t pos) {
    return (int)(pos - L->line_start) + 1;
}

_Noreturn static void lex_fail(Lexer *L, size_t pos, const char *msg, const char *arg) {
    /* the line of pos (pos >= L->line_start on the current line, or later) */
    int line = L->line;
    size_t ls = L->line_start;
    for (size_t i = L->pos; i < pos && i < L->n; i++)
        if (L->src[i] == '\n') {
            line++;
            ls = i + 1;
        }
    jinja_fail(L->cx, 0, "line %d column %d: %s%s", line, (int)(pos - ls) + 1, msg, arg ? arg : "");
}

static JToken *push(Lexer *L, int type, size_t at) {
    if (L->ntok == L->cap) {
        int cap = L->cap ? L->cap * 2 : 256;
        JToken *t = jinja_alloc(L->cx, (size_t)cap * sizeof *t);
        if (L->ntok)
            memcpy(t, L->toks, (size_t)L->ntok * sizeof *t);
        L->toks = t;
        L->cap = cap;
    }
    JToken *t = &L->toks[L->ntok++];
    memset(t, 0, sizeof *t);
    t->type = type;
    t->line = L->line;
    t->col = col_of(L, at);
    return t;
}

static void push_data(Lexer *L, size_t start, size_t len) {
    if (!len)
        return;
    JToken *t = push(L, JT_DATA, start);
    t->s = L->src + start;
    t->len = len;
}

static int at(const Lexer *L, size_t pos, const char *s) {
    size_t k = strlen(s);
    return pos + k <= L->n && !memcmp(L->src + pos, s, k);
}

static size_t skip_ws(const Lexer *L, size_t pos) {
    return pos + jinja_ws_prefix(L->src + pos, L->n - pos);
}

/* Whitespace control for the text [start, end) before a tag whose sign is '-', '+' or 0;
 * lstrip applies to block and comment tags. Returns the kept length. */
static size_t strip_text(Lexer *L, size_t start, size_t end, int sign, int lstrip) {
    size_t len = end - start;
    const char *text = L->src + start;
    if (sign == '-')
        return len - jinja_ws_suffix(text, len);
    if (sign != '+' && lstrip) {
        size_t l_pos = 0;
        for (size_t i = len; i > 0; i--)
            if (text[i - 1] == '\n') {
                l_pos = i;
                break;
            }
        if ((l_pos > 0 || L->line_starting) && jinja_str_isspace(text + l_pos, len - l_pos))
            return l_pos;
    }
    return len;
}

/* ---- string literals ---- */

static int hexval(char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* Decode the body of a string literal as jinja2 does: Python's unicode-escape codec applied
 * after non-ASCII characters were written as backslash escapes. */
static void decode_string(Lexer *L, size_t qpos, const char *s, size_t n, JToken *t) {
    JCtx *cx = L->cx;
    JBuf b = {0};
    jinja_buf_put(cx, &b, "", 0);
    for (size_t i = 0; i < n;) {
        if (s[i] != '\\') {
            size_t j = i + 1;
            while (j < n && s[j] != '\\')
                j++;
            jinja_buf_put(cx, &b, s + i, j - i);
            i = j;
            continue;
        }
        unsigned char d = (unsigned char)s[i + 1];
        i += 2;
        if (d >= 0x80) { /* "\é": the backslash escapes the backslash of "\xe9" */
            uint32_t cp;
            i = jinja_utf8_next(s, n, i - 1, &cp);
            if (cp <= 0xff)
                jinja_buf_printf(cx, &b, "\\x%02x", cp);
            else if (cp <= 0xffff)
                jinja_buf_printf(cx, &b, "\\u%04x", cp);
            else
                jinja_buf_printf(cx, &b, "\\U%08x", cp);
            continue;
        }
        switch (d) {
            case '\n':
                break;
            case '\\':
            case '\'':
            case '"':
                jinja_buf_putc(cx, &b, (char)d);
                break;
            case 'a':
                jinja_buf_putc(cx, &b, '\a');
                break;
            case 'b':
                jinja_buf_putc(cx, &b, '\b');
                break;
            case 'f':
                jinja_buf_putc(cx, &b, '\f');
                break;
            case 'n':
                jinja_buf_putc(cx, &b, '\n');
                break;
            case 'r':
                jinja_buf_putc(cx, &b, '\r');
                break;
            case 't':
                jinja_buf_putc(cx, &b, '\t');
                break;
            case 'v':
                jinja_buf_putc(cx, &b, '\v');
                break;
            case 'x':
            case 'u':
            case 'U': {
                int digits = d == 'x' ? 2 : d == 'u' ? 4 : 8;
                uint32_t cp = 0;
                for (int k = 0; k < digits; k++) {
                    int h = i + (size_t)k < n ? hexval(s[i + (size_t)k]) : -1;
                    if (h < 0)
                        lex_fail(L, qpos, "truncated escape in string literal", NULL);
                    cp = cp << 4 | (uint32_t)h;
                }
                if (cp > 0x10ffff)
                    lex_fail(L, qpos, "illegal Unicode character in string literal", NULL);
                i += (size_t)digits;
                jinja_utf8_put(cx, &b, cp);
                break;
            }
            case 'N':
                lex_fail(L, qpos, "\\N{...} escapes are not supported", NULL);
            default:
                if (d >= '0' && d <= '7') {
                    uint32_t cp = d - '0';
                    for (int k = 0; k < 2 && i < n && s[i] >= '0' && s[i] <= '7'; k++)
                        cp = cp * 8 + (uint32_t)(s[i++] - '0');
                    jinja_utf8_put(cx, &b, cp);
                } else {
                    jinja_buf_putc(cx, &b, '\\');
                    jinja_buf_putc(cx, &b, (char)d);
                }
        }
    }
    t->s = b.p;
    t->len = b.len;
}

/* ---- numbers ---- */

static int isdig(char c) {
    return c >= '0' && c <= '9';
}

/* (\d+_)*\d+ at pos: returns the end, or pos when none. */
static size_t digits_(const Lexer *L, size_t pos) {
    size_t i = pos;
    if (i >= L->n || !isdig(L->src[i]))
        return pos;
    for (;;) {
        while (i < L->n && isdig(L->src[i]))
            i++;
        if (i + 1 < L->n && L->src[i] == '_' && isdig(L->src[i + 1]))
            i++;
        else
            return i;
    }
}

/* jinja2's float_re: (?<!\.)(\d+_)*\d+((\.(\d+_)*\d+)?e[+\-]?(\d+_)*\d+|\.(\d+_)*\d+) */
static size_t match_float(const Lexer *L, size_t pos) {
    if (pos > 0 && L->src[pos - 1] == '.')
        return pos;
    size_t i = digits_(L, pos);
    if (i == pos)
        return pos;
    size_t frac = i;
    if (i < L->n && L->src[i] == '.') {
        size_t j = digits_(L, i + 1);
        if (j > i + 1)
            frac = j;
    }
    if (frac < L->n && (L->src[frac] == 'e' || L->src[frac] == 'E')) {
        size_t j = frac + 1;
        if (j < L->n && (L->src[j] == '+' || L->src[j] == '-'))
            j++;
        size_t k = digits_(L, j);
        if (k > j)
            return k;
    }
    return frac > i ? frac : pos;
}

static int is_digit_base(char c, int base) {
    int h = hexval(c);
    return h >= 0 && h < base;
}

/* jinja2's integer_re: 0b(_?[01])+ | 0o(_?[0-7])+ | 0x(_?[\da-f])+ | [1-9](_?\d)* | 0(_?0)* */
static size_t match_int(const Lexer *L, size_t pos, int *base) {
    const char *s = L->src;
    size_t n = L->n;
    *base = 10;
    if (pos + 1 < n && s[pos] == '0' && strchr("bBoOxX", s[pos + 1]) && s[pos + 1]) {
        char k = s[pos + 1] | 0x20;
        int b = k == 'b' ? 2 : k == 'o' ? 8 : 16;
        size_t i = pos + 2;
        for (;;) {
            size_t j = i;
            if (j < n && s[j] == '_')
                j++;
            if (j < n && is_digit_base(s[j], b))
                i = j + 1;
            else
                break;
        }
        if (i > pos + 2) {
            *base = b;
            return i;
        }
    }
    if (pos < n && s[pos] >= '1' && s[pos] <= '9') {
        size_t i = pos + 1;
        for (;;) {
            size_t j = i;
            if (j < n && s[j] == '_')
                j++;
            if (j < n && isdig(s[j]))
                i = j + 1;
            else
                return i;
        }
    }
    if (pos < n && s[pos] == '0') {
        size_t i = pos + 1;
        for (;;) {
            size_t j = i;
            if (j < n && s[j] == '_')
                j++;
            if (j < n && s[j] == '0')
                i = j + 1;
            else
                return i;
        }
    }
    return pos;
}

/* ---- operators ---- */

static const struct {
    const char *s;
    int op;
} OPS[] = {
    {"//", OP_FLOORDIV}, {"**", OP_POW},   {"==", OP_EQ},      {"!=", OP_NE},      {">=", OP_GTEQ},
    {"<=", OP_LTEQ},     {"+", OP_ADD},    {"-", OP_SUB},      {"/", OP_DIV},      {"*", OP_MUL},
    {"%", OP_MOD},       {"~", OP_TILDE},  {"[", OP_LBRACKET}, {"]", OP_RBRACKET}, {"(", OP_LPAREN},
    {")", OP_RPAREN},    {"{", OP_LBRACE}, {"}", OP_RBRACE},   {">", OP_GT},       {"<", OP_LT},
    {"=", OP_ASSIGN},    {".", OP_DOT},    {":", OP_COLON},    {"|", OP_PIPE},     {",", OP_COMMA},
    {";", OP_SEMICOLON},
};

static int is_name_start(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static int is_name_char(unsigned char c) {
    return is_name_start(c) || isdig((char)c);
}

/* Tokens inside {{ }} (var = 1) or {% %} until the closing delimiter. */
static void lex_tag(Lexer *L, int var) {
    char stack[256];
    int depth = 0;
    const char *src = L->src;
    for (;;) {
        size_t p = L->pos;
        if (p >= L->n)
            lex_fail(L, p,
                     var ? "unexpected end of template, expected '}}'"
                         : "unexpected end of template, expected '%}'",
                     NULL);
        if (!depth) { /* the end rules come first */
            size_t end = 0;
            if (var) {
                if (at(L, p, "-}}"))
                    end = skip_ws(L, p + 3);
                else if (at(L, p, "}}"))
                    end = p + 2;
            } else {
                if (at(L, p, "+%}"))
                    end = p + 3;
                else if (at(L, p, "-%}"))
                    end = skip_ws(L, p + 3);
                else if (at(L, p, "%}"))
                    end = p + 2 + (p + 2 < L->n && src[p + 2] == '\n');
            }
            if (end) {
                push(L, var ? JT_VAR_END : JT_BLOCK_END, p);
                L->line_starting = src[end - 1] == '\n';
                advance(L, end);
                return;
            }
        }
        size_t ws = jinja_ws_prefix(src + p, L->n - p);
        if (ws) {
            advance(L, p + ws);
            continue;
        }
        size_t e = match_float(L, p);
        if (e > p) {
            JToken *t = push(L, JT_FLOAT, p);
            char tmp[128];
            size_t k = 0;
            for (size_t i = p; i < e && k + 1 < sizeof tmp; i++)
                if (src[i] != '_')
                    tmp[k++] = src[i];
            tmp[k] = 0;
            t->f = strtod(tmp, NULL);
            advance(L, e);
            continue;
        }
        int base;
        e = match_int(L, p, &base);
        if (e > p) {
            JToken *t = push(L, JT_INT, p);
            char tmp[128];
            size_t k = 0;
            for (size_t i = p + (base != 10 ? 2 : 0); i < e && k + 1 < sizeof tmp; i++)
                if (src[i] != '_')
                    tmp[k++] = src[i];
            tmp[k] = 0;
            char *endp;
            unsigned long long u = strtoull(tmp, &endp, base);
            if (k >= 19 && (u > INT64_MAX || k > 20))
                lex_fail(L, p, "integer literal too large", NULL);
            t->i = (int64_t)u;
            advance(L, e);
            continue;
        }
        if (is_name_start((unsigned char)src[p])) {
            size_t i = p + 1;
            while (i < L->n && is_name_char((unsigned char)src[i]))
                i++;
            JToken *t = push(L, JT_NAME, p);
            char *name = jinja_alloc(L->cx, i - p + 1);
            memcpy(name, src + p, i - p);
            t->s = name;
            t->len = i - p;
            advance(L, i);
            continue;
        }
        if (src[p] == '\'' || src[p] == '"') {
            char q = src[p];
            size_t i = p + 1;
            while (i < L->n && src[i] != q) {
                if (src[i] == '\\' && i + 1 < L->n)
                    i++;
                i++;
            }
            if (i >= L->n)
                lex_fail(L, p, "unexpected end of string literal", NULL);
            JToken *t = push(L, JT_STRING, p);
            decode_string(L, p, src + p + 1, i - p - 1, t);
            advance(L, i + 1);
            continue;
        }
        int op = 0;
        size_t oplen = 0;
        for (size_t k = 0; k < sizeof OPS / sizeof OPS[0]; k++)
            if (at(L, p, OPS[k].s)) {
                op = OPS[k].op;
                oplen = strlen(OPS[k].s);
                break;
            }
        if (!op) {
            char c[8] = {src[p], 0};
            lex_fail(L, p, "unexpected character ", c);
        }
        if (op == OP_LBRACE || op == OP_LPAREN || op == OP_LBRACKET) {
            if (depth == (int)sizeof stack)
                lex_fail(L, p, "brackets nested too deeply", NULL);
            stack[depth++] = op == OP_LBRACE ? '}' : op == OP_LPAREN ? ')' : ']';
        } else if (op == OP_RBRACE || op == OP_RPAREN || op == OP_RBRACKET) {
            char c[2] = {src[p], 0};
            if (!depth)
                lex_fail(L, p, "unexpected ", c);
            if (stack[--depth] != src[p]) {
                char m[64];
                snprintf(m, sizeof m, "unexpected '%c', expected '%c'", src[p], stack[depth]);
                lex_fail(L, p, m, NULL);
            }
        }
        JToken *t = push(L, JT_OP, p);
        t->op = op;
        advance(L, p + oplen);
    }
}

/* "{%" sign? \s* "raw" \s* ("-%}" \s* | "%}") at pos: returns the end, or 0. */
static size_t match_raw_begin(const Lexer *L, size_t pos, const char *word) {
    size_t i = pos + 2;
    if (i < L->n && (L->src[i] == '-' || L->src[i] == '+'))
        i++;
    i = skip_ws(L, i);
    if (!at(L, i, word))
        return 0;
    return skip_ws(L, i + strlen(word)); /* the caller checks for "%}" or "-%}" here */
}

static void lex_raw(Lexer *L, size_t tag) {
    size_t i = match_raw_begin(L, tag, "raw");
    size_t end;
    if (at(L, i, "-%}"))
        end = skip_ws(L, i + 3);
    else
        end = i + 2; /* "%}": no trim_blocks newline after a raw tag */
    L->line_starting = L->src[end - 1] == '\n';
    advance(L, end);
    /* find {%(-|+|)\s*endraw\s*(+%}|-%}\s*|%}\n?) */
    for (size_t p = L->pos; p + 1 < L->n; p++) {
        if (L->src[p] != '{' || L->src[p + 1] != '%')
            continue;
        size_t q = match_raw_begin(L, p, "endraw");
        if (!q)
            continue;
        size_t stop;
        if (at(L, q, "+%}"))
            stop = q + 3;
        else if (at(L, q, "-%}"))
            stop = skip_ws(L, q + 3);
        else if (at(L, q, "%}"))
            stop = q + 2 + (q + 2 < L->n && L->src[q + 2] == '\n');
        else
            continue;
        int esign = L->src[p + 2] == '-' || L->src[p + 2] == '+' ? L->src[p + 2] : 0;
        push_data(L, L->pos, strip_text(L, L->pos, p, esign, 1));
        L->line_starting = L->src[stop - 1] == '\n';
        advance(L, stop);
        return;
    }
    lex_fail(L, tag, "Missing end of raw directive", NULL);
}

static void lex_comment(Lexer *L, size_t tag) {
    const char *src = L->src;
    size_t q = L->pos;
    while (q + 1 < L->n && !(src[q] == '#' && src[q + 1] == '}'))
        q++;
    if (q + 1 >= L->n)
        lex_fail(L, tag, "Missing end of comment tag", NULL);
    size_t end;
    if (q > L->pos && src[q - 1] == '+')
        end = q + 2;
    else if (q > L->pos && src[q - 1] == '-')
        end = skip_ws(L, q + 2);
    else
        end = q + 2 + (q + 2 < L->n && src[q + 2] == '\n');
    L->line_starting = src[end - 1] == '\n';
    advance(L, end);
}

JToken *jinja_lex(JCtx *cx, const char *in, size_t inlen, int *ntok) {
    /* normalize \r\n and \r to \n; drop one trailing newline */
    char *src = jinja_alloc(cx, inlen + 1);
    size_t n = 0;
    for (size_t i = 0; i < inlen; i++) {
        if (in[i] == '\r') {
            src[n++] = '\n';
            if (i + 1 < inlen && in[i + 1] == '\n')
                i++;
        } else {
            src[n++] = in[i];
        }
    }
    if (n && src[n - 1] == '\n')
        n--;
    src[n] = 0;

    Lexer L = {.cx = cx, .src = src, .n = n, .line = 1, .line_starting = 1};
    while (L.pos < n) {
        size_t tag = L.pos;
        while (tag + 1 < n && !(src[tag] == '{' && strchr("%{#", src[tag + 1]) && src[tag + 1]))
            tag++;
        if (tag + 1 >= n) {
            push_data(&L, L.pos, n - L.pos);
            advance(&L, n);
            break;
        }
        char kind = src[tag + 1];
        int sign = tag + 2 < n && (src[tag + 2] == '-' || src[tag + 2] == '+') ? src[tag + 2] : 0;
        size_t rb = kind == '%' ? match_raw_begin(&L, tag, "raw") : 0;
        int raw = rb && (at(&L, rb, "-%}") || at(&L, rb, "%}"));
        push_data(&L, L.pos, strip_text(&L, L.pos, tag, sign, kind != '{'));
        advance(&L, tag);
        L.line_starting = 0;
        if (raw) {
            lex_raw(&L, tag);
            continue;
        }
        size_t body = tag + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            advance(&L, body);
            lex_comment(&L, tag);
            continue;
        }
        push(&L, kind == '{' ? JT_VAR_BEGIN : JT_BLOCK_BEGIN, tag);
        advance(&L, body);
        lex_tag(&L, kind == '{');
    }
    push(&L, JT_EOF, L.pos);
    *ntok = L.ntok;
    return L.toks;
}
