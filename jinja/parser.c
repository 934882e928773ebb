/* parser.c - tokens to a syntax tree, a recursive-descent copy of jinja2's Parser.
 *
 * Expression precedence, lowest first: `a if b else c`, or, and, not, comparisons (== != < <=
 * > >= in, not in; chained as in Python), + -, ~, * / // %, **, unary - +, then postfix
 * (.attr, [item], [a:b:c], call) and filters / tests (|f(args), is t), which bind tighter
 * than any binary operator. Statements: if/elif/else, for (with `if` filter, else, unpacking),
 * set (incl. namespace attributes and block set), macro, call, filter, with, break, continue,
 * print and transformers' {% generation %}. A filter or test jinja2 does not know fails here,
 * as jinja2 fails when it compiles the template, unless it sits in an if statement or a
 * conditional expression: there it fails only if it runs, as in jinja2 (check_names). */

#include "jinja_int.h"

#include <stdio.h>
#include <string.h>

typedef struct {
    JCtx *cx;
    JToken *t;
    int n, i;
    const char *blocks[64]; /* tags whose end is awaited, innermost last */
    int nblocks;
    int loops; /* for-loops around the current position (break/continue allowed) */
    int depth; /* nested unary operators / `not`s / sub-expressions being parsed */
} Parser;

typedef struct {
    JNode **v;
    int n, cap;
} NodeVec;

static void vec_push(Parser *P, NodeVec *v, JNode *node) {
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 8;
        JNode **nv = jinja_alloc(P->cx, (size_t)cap * sizeof *nv);
        if (v->n)
            memcpy(nv, v->v, (size_t)v->n * sizeof *nv);
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = node;
}

static JToken *cur(Parser *P) {
    return &P->t[P->i];
}

static JToken *look(Parser *P) {
    return &P->t[P->i + 1 < P->n ? P->i + 1 : P->i];
}

static JToken *next(Parser *P) {
    JToken *t = cur(P);
    if (P->i + 1 < P->n)
        P->i++;
    return t;
}

static const char *describe(JToken *t) {
    switch (t->type) {
        case JT_EOF:
            return "end of template";
        case JT_DATA:
            return "template data";
        case JT_VAR_BEGIN:
            return "begin of print statement";
        case JT_VAR_END:
            return "end of print statement";
        case JT_BLOCK_BEGIN:
            return "begin of statement block";
        case JT_BLOCK_END:
            return "end of statement block";
        case JT_NAME:
            return t->s;
        case JT_STRING:
            return "string";
        case JT_INT:
            return "integer";
        case JT_FLOAT:
            return "float";
        default:
            return "operator";
    }
}

_Noreturn static void fail_at(Parser *P, JToken *t, const char *fmt, const char *arg) {
    char m[300];
    snprintf(m, sizeof m, fmt, arg);
    jinja_fail(P->cx, 0, "line %d column %d: %s", t->line, t->col, m);
}

static int is_name(JToken *t, const char *name) {
    return t->type == JT_NAME && !strcmp(t->s, name);
}

static int is_op(JToken *t, int op) {
    return t->type == JT_OP && t->op == op;
}

static const char *op_text(int op) {
    static const char *const names[] = {
        [OP_ADD] = "+",       [OP_SUB] = "-",       [OP_MUL] = "*",    [OP_DIV] = "/",
        [OP_FLOORDIV] = "//", [OP_MOD] = "%",       [OP_POW] = "**",   [OP_TILDE] = "~",
        [OP_LBRACKET] = "[",  [OP_RBRACKET] = "]",  [OP_LPAREN] = "(", [OP_RPAREN] = ")",
        [OP_LBRACE] = "{",    [OP_RBRACE] = "}",    [OP_EQ] = "==",    [OP_NE] = "!=",
        [OP_GT] = ">",        [OP_GTEQ] = ">=",     [OP_LT] = "<",     [OP_LTEQ] = "<=",
        [OP_ASSIGN] = "=",    [OP_DOT] = ".",       [OP_COLON] = ":",  [OP_PIPE] = "|",
        [OP_COMMA] = ",",     [OP_SEMICOLON] = ";",
    };
    return op > 0 && op < (int)(sizeof names / sizeof names[0]) && names[op] ? names[op] : "?";
}

static void expect_op(Parser *P, int op) {
    JToken *t = cur(P);
    if (!is_op(t, op)) {
        char m[128];
        snprintf(m, sizeof m, "expected token '%s', got '%s'", op_text(op),
                 t->type == JT_OP ? op_text(t->op) : describe(t));
        fail_at(P, t, "%s", m);
    }
    next(P);
}

static JToken *expect_type(Parser *P, int type, const char *what) {
    JToken *t = cur(P);
    if (t->type != type) {
        char m[128];
        snprintf(m, sizeof m, "expected %s, got '%s'", what,
                 t->type == JT_OP ? op_text(t->op) : describe(t));
        fail_at(P, t, "%s", m);
    }
    return next(P);
}

static void expect_name(Parser *P, const char *name) {
    JToken *t = cur(P);
    if (!is_name(t, name)) {
        char m[128];
        snprintf(m, sizeof m, "expected token '%s', got '%s'", name,
                 t->type == JT_OP ? op_text(t->op) : describe(t));
        fail_at(P, t, "%s", m);
    }
    next(P);
}

static JNode *node(Parser *P, int kind, int line) {
    JNode *n = jinja_alloc(P->cx, sizeof *n);
    n->kind = kind;
    n->line = line;
    return n;
}

/* Bound the recursion of the expression parser (brackets are bounded by the lexer). */

static void enter(Parser *P) {
    if (++P->depth > 500)
        fail_at(P, cur(P), "%s", "expression nested too deeply");
}

/* ---- known filters and tests (jinja2's builtins plus transformers' tojson) ---- */

static const char *const FILTERS[] = {
    "abs",    "attr",       "batch",       "capitalize", "center",   "count",
    "d",      "default",    "dictsort",    "e",          "escape",   "filesizeformat",
    "first",  "float",      "forceescape", "format",     "groupby",  "indent",
    "int",    "items",      "join",        "last",       "length",   "list",
    "lower",  "map",        "max",         "min",        "pprint",   "random",
    "reject", "rejectattr", "replace",     "reverse",    "round",    "safe",
    "select", "selectattr", "slice",       "sort",       "string",   "striptags",
    "sum",    "title",      "tojson",      "trim",       "truncate", "unique",
    "upper",  "urlencode",  "urlize",      "wordcount",  "wordwrap", "xmlattr",
    NULL,
};

static int in_list(const char *const *list, const char *name) {
    for (int i = 0; list[i]; i++)
        if (!strcmp(list[i], name))
            return 1;
    return 0;
}

/* ---- expressions ---- */

static JNode *parse_expression(Parser *P, int with_condexpr);
static JNode *parse_tuple(Parser *P, int simplified, int with_condexpr, const char *extra_end,
                          int explicit_parens, int with_namespace);
static JNode *parse_unary(Parser *P, int with_filter);
static JNode *parse_postfix(Parser *P, JNode *n);
static JNode *parse_filter(Parser *P, JNode *n, int start_inline);
static void parse_call_args(Parser *P, JNode *call) {
    JToken *open = cur(P);
    expect_op(P, OP_LPAREN);
    NodeVec args = {0}, kw = {0};
    const char **names = NULL;
    int require_comma = 0;
    while (!is_op(cur(P), OP_RPAREN)) {
        if (require_comma) {
            expect_op(P, OP_COMMA);
            if (is_op(cur(P), OP_RPAREN))
                break;
        }
        if (is_op(cur(P), OP_MUL)) {
            if (call->c || call->d)
                fail_at(P, open, "%s", "invalid syntax for function call expression");
            next(P);
            call->c = parse_expression(P, 1);
        } else if (is_op(cur(P), OP_POW)) {
            if (call->d)
                fail_at(P, open, "%s", "invalid syntax for function call expression");
            next(P);
            call->d = parse_expression(P, 1);
        } else if (cur(P)->type == JT_NAME && is_op(look(P), OP_ASSIGN)) {
            if (call->d)
                fail_at(P, open, "%s", "invalid syntax for function call expression");
            const char *key = cur(P)->s;
            next(P);
            next(P);
            vec_push(P, &kw, parse_expression(P, 1));
            const char **nn = jinja_alloc(P->cx, (size_t)kw.n * sizeof *nn);
            if (kw.n > 1)
                memcpy(nn, names, (size_t)(kw.n - 1) * sizeof *nn);
            nn[kw.n - 1] = key;
            names = nn;
        } else {
            if (call->c || call->d || kw.n)
                fail_at(P, open, "%s", "invalid syntax for function call expression");
            vec_push(P, &args, parse_expression(P, 1));
        }
        require_comma = 1;
    }
    expect_op(P, OP_RPAREN);
    call->args = args.v;
    call->nargs = args.n;
    call->kw = kw.v;
    call->kwnames = names;
    call->nkw = kw.n;
}

static JNode *parse_primary(Parser *P, int with_namespace) {
    JToken *t = cur(P);
    JNode *n;
    if (t->type == JT_NAME) {
        next(P);
        if (!strcmp(t->s, "true") || !strcmp(t->s, "True") || !strcmp(t->s, "false") ||
            !strcmp(t->s, "False")) {
            n = node(P, N_CONST, t->line);
            n->val = jinja_bool(t->s[0] == 't' || t->s[0] == 'T');
        } else if (!strcmp(t->s, "none") || !strcmp(t->s, "None")) {
            n = node(P, N_CONST, t->line);
            n->val = jinja_none();
        } else if (with_namespace && is_op(cur(P), OP_DOT)) {
            next(P);
            JToken *attr = expect_type(P, JT_NAME, "name");
            n = node(P, N_NSREF, t->line);
            n->s = t->s;
            n->s2 = attr->s;
        } else {
            n = node(P, N_NAME, t->line);
            n->s = t->s;
        }
    } else if (t->type == JT_STRING) {
        next(P);
        JBuf b = {0};
        jinja_buf_put(P->cx, &b, t->s, t->len);
        while (cur(P)->type == JT_STRING) { /* adjacent literals concatenate */
            jinja_buf_put(P->cx, &b, cur(P)->s, cur(P)->len);
            next(P);
        }
        n = node(P, N_CONST, t->line);
        n->val = jinja_strbuf(P->cx, &b);
    } else if (t->type == JT_INT || t->type == JT_FLOAT) {
        next(P);
        n = node(P, N_CONST, t->line);
        n->val = t->type == JT_INT ? jinja_int(t->i) : jinja_float(t->f);
    } else if (is_op(t, OP_LPAREN)) {
        next(P);
        n = parse_tuple(P, 0, 1, NULL, 1, 0);
        expect_op(P, OP_RPAREN);
    } else if (is_op(t, OP_LBRACKET)) {
        next(P);
        NodeVec items = {0};
        while (!is_op(cur(P), OP_RBRACKET)) {
            if (items.n)
                expect_op(P, OP_COMMA);
            if (is_op(cur(P), OP_RBRACKET))
                break;
            vec_push(P, &items, parse_expression(P, 1));
        }
        expect_op(P, OP_RBRACKET);
        n = node(P, N_LIST, t->line);
        n->args = items.v;
        n->nargs = items.n;
    } else if (is_op(t, OP_LBRACE)) {
        next(P);
        NodeVec keys = {0}, vals = {0};
        while (!is_op(cur(P), OP_RBRACE)) {
            if (keys.n)
                expect_op(P, OP_COMMA);
            if (is_op(cur(P), OP_RBRACE))
                break;
            vec_push(P, &keys, parse_expression(P, 1));
            expect_op(P, OP_COLON);
            vec_push(P, &vals, parse_expression(P, 1));
        }
        expect_op(P, OP_RBRACE);
        n = node(P, N_DICT, t->line);
        n->args = keys.v;
        n->nargs = keys.n;
        n->kw = vals.v;
        n->nkw = vals.n;
    } else {
        fail_at(P, t, "unexpected '%s'", t->type == JT_OP ? op_text(t->op) : describe(t));
    }
    return n;
}

static int is_tuple_end(Parser *P, const char *extra_end) {
    JToken *t = cur(P);
    if (t->type == JT_VAR_END || t->type == JT_BLOCK_END || is_op(t, OP_RPAREN))
        return 1;
    return extra_end && is_name(t, extra_end);
}

static JNode *parse_tuple(Parser *P, int simplified, int with_condexpr, const char *extra_end,
                          int explicit_parens, int with_namespace) {
    int line = cur(P)->line;
    NodeVec args = {0};
    int is_tuple = 0;
    for (;;) {
        if (args.n)
            expect_op(P, OP_COMMA);
        if (is_tuple_end(P, extra_end))
            break;
        vec_push(P, &args,
                 simplified ? parse_primary(P, with_namespace)
                            : parse_expression(P, with_condexpr));
        if (is_op(cur(P), OP_COMMA))
            is_tuple = 1;
        else
            break;
    }
    if (!is_tuple) {
        if (args.n)
            return args.v[0];
        if (!explicit_parens)
            fail_at(P, cur(P), "Expected an expression, got '%s'",
                    cur(P)->type == JT_OP ? op_text(cur(P)->op) : describe(cur(P)));
    }
    JNode *n = node(P, N_TUPLE, line);
    n->args = args.v;
    n->nargs = args.n;
    return n;
}

static JNode *parse_subscribed(Parser *P) {
    int line = cur(P)->line;
    JNode *parts[3] = {NULL, NULL, NULL};
    if (is_op(cur(P), OP_COLON)) {
        next(P);
    } else {
        JNode *e = parse_expression(P, 1);
        if (!is_op(cur(P), OP_COLON))
            return e;
        next(P);
        parts[0] = e;
    }
    if (!is_op(cur(P), OP_COLON) && !is_op(cur(P), OP_RBRACKET) && !is_op(cur(P), OP_COMMA))
        parts[1] = parse_expression(P, 1);
    if (is_op(cur(P), OP_COLON)) {
        next(P);
        if (!is_op(cur(P), OP_RBRACKET) && !is_op(cur(P), OP_COMMA))
            parts[2] = parse_expression(P, 1);
    }
    JNode *n = node(P, N_SLICE, line);
    n->a = parts[0];
    n->b = parts[1];
    n->c = parts[2];
    return n;
}

static JNode *parse_postfix(Parser *P, JNode *n) {
    for (;;) {
        JToken *t = cur(P);
        if (is_op(t, OP_DOT)) {
            next(P);
            JToken *attr = cur(P);
            next(P);
            if (attr->type == JT_NAME) {
                JNode *g = node(P, N_GETATTR, t->line);
                g->a = n;
                g->s = attr->s;
                n = g;
            } else if (attr->type == JT_INT) {
                JNode *k = node(P, N_CONST, attr->line);
                k->val = jinja_int(attr->i);
                JNode *g = node(P, N_GETITEM, t->line);
                g->a = n;
                g->b = k;
                n = g;
            } else {
                fail_at(P, attr, "%s", "expected name or number");
            }
        } else if (is_op(t, OP_LBRACKET)) {
            next(P);
            NodeVec args = {0};
            while (!is_op(cur(P), OP_RBRACKET)) {
                if (args.n)
                    expect_op(P, OP_COMMA);
                vec_push(P, &args, parse_subscribed(P));
            }
            expect_op(P, OP_RBRACKET);
            JNode *g = node(P, N_GETITEM, t->line);
            g->a = n;
            if (args.n == 1) {
                g->b = args.v[0];
            } else {
                JNode *tup = node(P, N_TUPLE, t->line);
                tup->args = args.v;
                tup->nargs = args.n;
                g->b = tup;
            }
            n = g;
        } else if (is_op(t, OP_LPAREN)) {
            JNode *c = node(P, N_CALL, t->line);
            c->a = n;
            parse_call_args(P, c);
            n = c;
        } else {
            return n;
        }
    }
}

static const char *dotted_name(Parser *P) {
    JToken *t = expect_type(P, JT_NAME, "name");
    if (!is_op(cur(P), OP_DOT))
        return t->s;
    JBuf b = {0};
    jinja_buf_put(P->cx, &b, t->s, t->len);
    while (is_op(cur(P), OP_DOT)) {
        next(P);
        JToken *part = expect_type(P, JT_NAME, "name");
        jinja_buf_putc(P->cx, &b, '.');
        jinja_buf_put(P->cx, &b, part->s, part->len);
    }
    return b.p;
}

static JNode *parse_filter(Parser *P, JNode *n, int start_inline) {
    while (is_op(cur(P), OP_PIPE) || start_inline) {
        if (!start_inline)
            next(P);
        JToken *t = cur(P);
        const char *name = dotted_name(P);
        JNode *f = node(P, N_FILTER, t->line);
        f->col = t->col;
        f->op = !in_list(FILTERS, name); /* checked by check_names() */
        f->a = n;
        f->s = name;
        if (is_op(cur(P), OP_LPAREN))
            parse_call_args(P, f);
        n = f;
        start_inline = 0;
    }
    return n;
}

static JNode *parse_test(Parser *P, JNode *n) {
    JToken *is = next(P);
    int negated = 0;
    if (is_name(cur(P), "not")) {
        next(P);
        negated = 1;
    }
    JToken *t = cur(P);
    const char *name = dotted_name(P);
    JNode *test = node(P, N_TEST, is->line);
    test->col = t->col;
    test->op = !jinja_has_test(name); /* checked by check_names() */
    test->a = n;
    test->s = name;
    JToken *c = cur(P);
    if (is_op(c, OP_LPAREN)) {
        parse_call_args(P, test);
    } else if ((c->type == JT_NAME || c->type == JT_STRING || c->type == JT_INT ||
                c->type == JT_FLOAT || is_op(c, OP_LBRACKET) || is_op(c, OP_LBRACE)) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        if (is_name(c, "is"))
            fail_at(P, c, "%s", "You cannot chain multiple tests with is");
        JNode *arg = parse_postfix(P, parse_primary(P, 0));
        test->args = jinja_alloc(P->cx, sizeof *test->args);
        test->args[0] = arg;
        test->nargs = 1;
    }
    if (negated) {
        JNode *no = node(P, N_NOT, is->line);
        no->a = test;
        return no;
    }
    return test;
}

static JNode *parse_filter_expr(Parser *P, JNode *n) {
    for (;;) {
        JToken *t = cur(P);
        if (is_op(t, OP_PIPE)) {
            n = parse_filter(P, n, 0);
        } else if (is_name(t, "is")) {
            n = parse_test(P, n);
        } else if (is_op(t, OP_LPAREN)) {
            JNode *c = node(P, N_CALL, t->line);
            c->a = n;
            parse_call_args(P, c);
            n = c;
        } else {
            return n;
        }
    }
}

static JNode *parse_unary(Parser *P, int with_filter) {
    JToken *t = cur(P);
    JNode *n;
    enter(P);
    if (is_op(t, OP_SUB) || is_op(t, OP_ADD)) {
        next(P);
        n = node(P, t->op == OP_SUB ? N_NEG : N_POS, t->line);
        n->a = parse_unary(P, 0);
    } else {
        n = parse_primary(P, 0);
    }
    n = parse_postfix(P, n);
    if (with_filter)
        n = parse_filter_expr(P, n);
    P->depth--;
    return n;
}

static JNode *binop(Parser *P, int op, JNode *a, JNode *b, int line) {
    JNode *n = node(P, N_BINOP, line);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static JNode *parse_pow(Parser *P) {
    JNode *left = parse_unary(P, 1);
    while (is_op(cur(P), OP_POW)) {
        int line = next(P)->line;
        left = binop(P, OP_POW, left, parse_unary(P, 1), line);
    }
    return left;
}

static JNode *parse_math2(Parser *P) {
    JNode *left = parse_pow(P);
    for (;;) {
        JToken *t = cur(P);
        if (!(is_op(t, OP_MUL) || is_op(t, OP_DIV) || is_op(t, OP_FLOORDIV) || is_op(t, OP_MOD)))
            return left;
        next(P);
        left = binop(P, t->op, left, parse_pow(P), t->line);
    }
}

static JNode *parse_concat(Parser *P) {
    int line = cur(P)->line;
    JNode *first = parse_math2(P);
    if (!is_op(cur(P), OP_TILDE))
        return first;
    NodeVec args = {0};
    vec_push(P, &args, first);
    while (is_op(cur(P), OP_TILDE)) {
        next(P);
        vec_push(P, &args, parse_math2(P));
    }
    JNode *n = node(P, N_CONCAT, line);
    n->args = args.v;
    n->nargs = args.n;
    return n;
}

static JNode *parse_math1(Parser *P) {
    JNode *left = parse_concat(P);
    for (;;) {
        JToken *t = cur(P);
        if (!(is_op(t, OP_ADD) || is_op(t, OP_SUB)))
            return left;
        next(P);
        left = binop(P, t->op, left, parse_concat(P), t->line);
    }
}

static JNode *parse_compare(Parser *P) {
    int line = cur(P)->line;
    JNode *expr = parse_math1(P);
    NodeVec operands = {0};
    int *ops = NULL, nops = 0, capops = 0;
    for (;;) {
        JToken *t = cur(P);
        int op = 0;
        if (t->type == JT_OP && (t->op == OP_EQ || t->op == OP_NE || t->op == OP_LT ||
                                 t->op == OP_LTEQ || t->op == OP_GT || t->op == OP_GTEQ)) {
            next(P);
            op = t->op;
        } else if (is_name(t, "in")) {
            next(P);
            op = OP_IN;
        } else if (is_name(t, "not") && is_name(look(P), "in")) {
            next(P);
            next(P);
            op = OP_NOTIN;
        } else {
            break;
        }
        if (nops == capops) {
            capops = capops ? capops * 2 : 4;
            int *n2 = jinja_alloc(P->cx, (size_t)capops * sizeof *n2);
            if (nops)
                memcpy(n2, ops, (size_t)nops * sizeof *n2);
            ops = n2;
        }
        ops[nops++] = op;
        vec_push(P, &operands, parse_math1(P));
    }
    if (!nops)
        return expr;
    JNode *n = node(P, N_COMPARE, line);
    n->a = expr;
    n->args = operands.v;
    n->nargs = operands.n;
    n->ops = ops;
    return n;
}

static JNode *parse_not(Parser *P) {
    if (is_name(cur(P), "not")) {
        enter(P);
        int line = next(P)->line;
        JNode *n = node(P, N_NOT, line);
        n->a = parse_not(P);
        P->depth--;
        return n;
    }
    return parse_compare(P);
}

/* operand (word operand)*, left-associative: `and` over `not`, `or` over `and`. */
static JNode *parse_word_chain(Parser *P, const char *word, int kind, JNode *(*operand)(Parser *)) {
    JNode *left = operand(P);
    while (is_name(cur(P), word)) {
        int line = next(P)->line;
        JNode *n = node(P, kind, line);
        n->a = left;
        n->b = operand(P);
        left = n;
    }
    return left;
}

static JNode *parse_and(Parser *P) {
    return parse_word_chain(P, "and", N_AND, parse_not);
}

static JNode *parse_or(Parser *P) {
    return parse_word_chain(P, "or", N_OR, parse_and);
}

static JNode *parse_expression(Parser *P, int with_condexpr) {
    if (!with_condexpr)
        return parse_or(P);
    int line = cur(P)->line;
    JNode *expr1 = parse_or(P);
    while (is_name(cur(P), "if")) {
        next(P);
        JNode *c = node(P, N_COND, line);
        c->a = parse_or(P);
        c->b = expr1;
        if (is_name(cur(P), "else")) {
            next(P);
            enter(P);
            c->c = parse_expression(P, 1);
            P->depth--;
        }
        expr1 = c;
        line = cur(P)->line;
    }
    return expr1;
}

/* ---- statements ---- */

static JNode **subparse(Parser *P, const char *const *end_tokens, int *n);
static int can_assign(JNode *n) {
    if (n->kind == N_NAME || n->kind == N_NSREF)
        return 1;
    if (n->kind == N_TUPLE) {
        for (int i = 0; i < n->nargs; i++)
            if (!can_assign(n->args[i]))
                return 0;
        return 1;
    }
    return 0;
}

static JNode *parse_assign_target(Parser *P, int with_tuple, int name_only, const char *extra_end,
                                  int with_namespace) {
    JToken *t = cur(P);
    JNode *target;
    if (name_only) {
        JToken *name = expect_type(P, JT_NAME, "name");
        target = node(P, N_NAME, name->line);
        target->s = name->s;
    } else if (with_tuple) {
        target = parse_tuple(P, 1, 1, extra_end, 0, with_namespace);
    } else {
        target = parse_primary(P, with_namespace);
    }
    if (!can_assign(target))
        fail_at(P, t, "can't assign to '%s'",
                target->kind == N_CONST   ? "const"
                : target->kind == N_TUPLE ? "tuple"
                                          : "expr");
    return target;
}

static JNode **parse_statements(Parser *P, const char *const *end_tokens, int drop_needle, int *n) {
    if (is_op(cur(P), OP_COLON))
        next(P);
    expect_type(P, JT_BLOCK_END, "end of statement block");
    JNode **body = subparse(P, end_tokens, n);
    if (cur(P)->type == JT_EOF) {
        char m[200] = "";
        size_t off = 0;
        for (int i = 0; end_tokens[i]; i++)
            off += (size_t)snprintf(m + off, sizeof m - off, "%s'%s'",
                                    i ? (end_tokens[i + 1] ? ", " : " or ") : "", end_tokens[i]);
        jinja_fail(P->cx, 0,
                   "line %d column %d: Unexpected end of template. Jinja was looking for the "
                   "following tags: %s. The innermost block that needs to be closed is '%s'.",
                   cur(P)->line, cur(P)->col, m, P->nblocks ? P->blocks[P->nblocks - 1] : "?");
    }
    if (drop_needle)
        next(P);
    return body;
}

static void parse_signature(Parser *P, JNode *n) {
    expect_op(P, OP_LPAREN);
    NodeVec defaults = {0};
    const char **params = NULL;
    int np = 0;
    while (!is_op(cur(P), OP_RPAREN)) {
        if (np)
            expect_op(P, OP_COMMA);
        JToken *t = cur(P);
        JNode *arg = parse_assign_target(P, 0, 1, NULL, 0);
        if (is_op(cur(P), OP_ASSIGN)) {
            next(P);
            vec_push(P, &defaults, parse_expression(P, 1));
        } else if (defaults.n) {
            fail_at(P, t, "%s", "non-default argument follows default argument");
        }
        const char **pp = jinja_alloc(P->cx, (size_t)(np + 1) * sizeof *pp);
        if (np)
            memcpy(pp, params, (size_t)np * sizeof *pp);
        pp[np++] = arg->s;
        params = pp;
    }
    expect_op(P, OP_RPAREN);
    n->params = params;
    n->nparams = np;
    n->defaults = defaults.v;
    n->ndefaults = defaults.n;
}

static JNode *parse_if(Parser *P) {
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    static const char *const endif[] = {"endif", NULL};
    JNode *result = node(P, N_IF, next(P)->line), *n = result;
    for (;;) {
        n->a = parse_tuple(P, 0, 0, NULL, 0, 0);
        n->body = parse_statements(P, ends, 0, &n->nbody);
        JToken *t = next(P);
        if (is_name(t, "elif")) {
            JNode *e = node(P, N_IF, cur(P)->line);
            n->orelse = jinja_alloc(P->cx, sizeof *n->orelse);
            n->orelse[0] = e;
            n->norelse = 1;
            n = e;
            continue;
        }
        if (is_name(t, "else"))
            n->orelse = parse_statements(P, endif, 1, &n->norelse);
        return result;
    }
}

static JNode *parse_for(Parser *P) {
    static const char *const ends[] = {"endfor", "else", NULL};
    static const char *const endfor[] = {"endfor", NULL};
    JNode *n = node(P, N_FOR, next(P)->line);
    n->a = parse_assign_target(P, 1, 0, "in", 0);
    expect_name(P, "in");
    n->b = parse_tuple(P, 0, 0, "recursive", 0, 0);
    if (is_name(cur(P), "if")) {
        next(P);
        n->c = parse_expression(P, 1);
    }
    if (is_name(cur(P), "recursive"))
        fail_at(P, cur(P), "%s", "recursive for loops are not supported");
    P->loops++;
    n->body = parse_statements(P, ends, 0, &n->nbody);
    P->loops--;
    if (!is_name(next(P), "endfor"))
        n->orelse = parse_statements(P, endfor, 1, &n->norelse);
    return n;
}

static JNode *parse_set(Parser *P) {
    static const char *const ends[] = {"endset", NULL};
    int line = next(P)->line;
    JNode *target = parse_assign_target(P, 1, 0, NULL, 1);
    if (is_op(cur(P), OP_ASSIGN)) {
        next(P);
        JNode *n = node(P, N_SET, line);
        n->a = target;
        n->b = parse_tuple(P, 0, 1, NULL, 0, 0);
        return n;
    }
    JNode *n = node(P, N_SETBLOCK, line);
    n->a = target;
    n->c = parse_filter(P, NULL, 0);
    n->body = parse_statements(P, ends, 1, &n->nbody);
    return n;
}

/* Does the tree use the variable `name` (as jinja2's find_undeclared: macros that read

   * varargs, kwargs or caller accept extra arguments)? */
static int uses_name(JNode *n, const char *name);
static int uses_name_list(JNode **v, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (uses_name(v[i], name))
            return 1;
    return 0;
}

static int uses_name(JNode *n, const char *name) {
    if (!n)
        return 0;
    if (n->kind == N_NAME && !strcmp(n->s, name))
        return 1;
    return uses_name(n->a, name) || uses_name(n->b, name) || uses_name(n->c, name) ||
           uses_name(n->d, name) || uses_name_list(n->args, n->nargs, name) ||
           uses_name_list(n->kw, n->nkw, name) || uses_name_list(n->body, n->nbody, name) ||
           uses_name_list(n->orelse, n->norelse, name) ||
           uses_name_list(n->defaults, n->ndefaults, name);
}

/* N_MACRO / N_CALLBLOCK op bits: the body reads varargs (1), kwargs (2), caller (4). */

static int macro_flags(JNode *n) {
    return (uses_name_list(n->body, n->nbody, "varargs") ? 1 : 0) |
           (uses_name_list(n->body, n->nbody, "kwargs") ? 2 : 0) |
           (uses_name_list(n->body, n->nbody, "caller") ? 4 : 0);
}

static JNode *parse_macro(Parser *P) {
    static const char *const ends[] = {"endmacro", NULL};
    JNode *n = node(P, N_MACRO, next(P)->line);
    n->s = parse_assign_target(P, 0, 1, NULL, 0)->s;
    parse_signature(P, n);
    int loops = P->loops;
    P->loops = 0;
    n->body = parse_statements(P, ends, 1, &n->nbody);
    P->loops = loops;
    n->op = macro_flags(n);
    return n;
}

static JNode *parse_call_block(Parser *P) {
    static const char *const ends[] = {"endcall", NULL};
    JNode *n = node(P, N_CALLBLOCK, next(P)->line);
    if (is_op(cur(P), OP_LPAREN))
        parse_signature(P, n);
    JToken *t = cur(P);
    n->a = parse_expression(P, 1);
    if (n->a->kind != N_CALL)
        fail_at(P, t, "%s", "expected call");
    int loops = P->loops;
    P->loops = 0;
    n->body = parse_statements(P, ends, 1, &n->nbody);
    P->loops = loops;
    n->op = macro_flags(n);
    return n;
}

static JNode *parse_statement(Parser *P) {
    JToken *t = cur(P);
    if (t->type != JT_NAME)
        fail_at(P, t, "%s", "tag name expected");
    const char *w = t->s;
    if (P->nblocks == (int)(sizeof P->blocks / sizeof P->blocks[0]))
        fail_at(P, t, "%s", "blocks nested too deeply");
    P->blocks[P->nblocks++] = w;
    JNode *n = NULL;
    if (!strcmp(w, "if")) {
        n = parse_if(P);
    } else if (!strcmp(w, "for")) {
        n = parse_for(P);
    } else if (!strcmp(w, "set")) {
        n = parse_set(P);
    } else if (!strcmp(w, "macro")) {
        n = parse_macro(P);
    } else if (!strcmp(w, "call")) {
        n = parse_call_block(P);
    } else if (!strcmp(w, "filter")) {
        static const char *const ends[] = {"endfilter", NULL};
        n = node(P, N_FILTERBLOCK, next(P)->line);
        n->c = parse_filter(P, NULL, 1);
        n->body = parse_statements(P, ends, 1, &n->nbody);
    } else if (!strcmp(w, "with")) {
        static const char *const ends[] = {"endwith", NULL};
        n = node(P, N_WITH, next(P)->line);
        NodeVec vals = {0};
        const char **names = NULL;
        while (cur(P)->type != JT_BLOCK_END) {
            if (vals.n)
                expect_op(P, OP_COMMA);
            JNode *target = parse_assign_target(P, 0, 1, NULL, 0);
            expect_op(P, OP_ASSIGN);
            vec_push(P, &vals, parse_expression(P, 1));
            const char **nn = jinja_alloc(P->cx, (size_t)vals.n * sizeof *nn);
            if (vals.n > 1)
                memcpy(nn, names, (size_t)(vals.n - 1) * sizeof *nn);
            nn[vals.n - 1] = target->s;
            names = nn;
        }
        n->params = names;
        n->nparams = vals.n;
        n->defaults = vals.v;
        n->ndefaults = vals.n;
        n->body = parse_statements(P, ends, 1, &n->nbody);
    } else if (!strcmp(w, "generation")) {
        static const char *const ends[] = {"endgeneration", NULL};
        n = node(P, N_GENERATION, next(P)->line);
        n->body = parse_statements(P, ends, 1, &n->nbody);
    } else if (!strcmp(w, "break") || !strcmp(w, "continue")) {
        if (!P->loops)
            fail_at(P, t, "'%s' outside of a loop", w);
        n = node(P, w[0] == 'b' ? N_BREAK : N_CONTINUE, next(P)->line);
    } else if (!strcmp(w, "print")) {
        n = node(P, N_OUTPUT, next(P)->line);
        NodeVec items = {0};
        while (cur(P)->type != JT_BLOCK_END) {
            if (items.n)
                expect_op(P, OP_COMMA);
            vec_push(P, &items, parse_expression(P, 1));
        }
        n->args = items.v;
        n->nargs = items.n;
    } else {
        P->nblocks--;
        if (P->nblocks)
            jinja_fail(P->cx, 0,
                       "line %d column %d: Encountered unknown tag '%s'. The innermost block "
                       "that needs to be closed is '%s'.",
                       t->line, t->col, w, P->blocks[P->nblocks - 1]);
        fail_at(P, t, "Encountered unknown tag '%s'.", w);
    }
    P->nblocks--;
    return n;
}

static int is_end(Parser *P, const char *const *end_tokens) {
    if (!end_tokens || cur(P)->type != JT_NAME)
        return 0;
    for (int i = 0; end_tokens[i]; i++)
        if (!strcmp(cur(P)->s, end_tokens[i]))
            return 1;
    return 0;
}

static JNode **subparse(Parser *P, const char *const *end_tokens, int *n) {
    NodeVec body = {0};
    for (;;) {
        JToken *t = cur(P);
        if (t->type == JT_EOF)
            break;
        if (t->type == JT_DATA) {
            JNode *d = node(P, N_DATA, t->line);
            d->s = t->s;
            d->slen = t->len;
            vec_push(P, &body, d);
            next(P);
        } else if (t->type == JT_VAR_BEGIN) {
            next(P);
            JNode *o = node(P, N_OUTPUT, t->line);
            o->args = jinja_alloc(P->cx, sizeof *o->args);
            o->args[0] = parse_tuple(P, 0, 1, NULL, 0, 0);
            o->nargs = 1;
            expect_type(P, JT_VAR_END, "end of print statement");
            vec_push(P, &body, o);
        } else if (t->type == JT_BLOCK_BEGIN) {
            next(P);
            if (is_end(P, end_tokens))
                break;
            vec_push(P, &body, parse_statement(P));
            expect_type(P, JT_BLOCK_END, "end of statement block");
        } else {
            fail_at(P, t, "unexpected '%s'", describe(t));
        }
    }
    *n = body.n;
    return body.v;
}

/* jinja2 fails at compile time on a filter or test it does not know, except in "soft" frames:

   * the test and bodies of an if statement and all of a conditional expression, where the error
   * waits until the filter runs. Frames of their own (loop, macro and block bodies) are not soft
   * again. */
static void check_names(Parser *P, JNode *n, int soft);
static void check_list(Parser *P, JNode **v, int n, int soft) {
    for (int i = 0; i < n; i++)
        check_names(P, v[i], soft);
}

static void check_names(Parser *P, JNode *n, int soft) {
    if (!n)
        return;
    switch (n->kind) {
        case N_FILTER:
        case N_TEST:
            if (n->op && !soft)
                jinja_fail(P->cx, 0, "line %d column %d: No %s named '%s'.", n->line, n->col,
                           n->kind == N_FILTER ? "filter" : "test", n->s);
            break;
        case N_COND:
            soft = 1;
            break;
        case N_IF:
            soft = 1;
            break;
        case N_FOR: /* the iterable belongs to the outer frame, the rest to the loop's */
            check_names(P, n->b, soft);
            check_names(P, n->a, 0);
            check_names(P, n->c, 0);
            check_list(P, n->body, n->nbody, 0);
            check_list(P, n->orelse, n->norelse, 0);
            return;
        case N_MACRO:
        case N_SETBLOCK:
        case N_FILTERBLOCK:
        case N_GENERATION:
            check_names(P, n->a, soft);
            check_names(P, n->c, 0);
            check_list(P, n->defaults, n->ndefaults, 0);
            check_list(P, n->body, n->nbody, 0);
            return;
        case N_CALLBLOCK:
        case N_WITH:
            check_names(P, n->a, soft);
            check_list(P, n->defaults, n->ndefaults, n->kind == N_WITH ? soft : 0);
            check_list(P, n->body, n->nbody, 0);
            return;
        default:
            break;
    }
    check_names(P, n->a, soft);
    check_names(P, n->b, soft);
    check_names(P, n->c, soft);
    check_names(P, n->d, soft);
    check_list(P, n->args, n->nargs, soft);
    check_list(P, n->kw, n->nkw, soft);
    check_list(P, n->body, n->nbody, soft);
    check_list(P, n->orelse, n->norelse, soft);
    check_list(P, n->defaults, n->ndefaults, soft);
}

JNode **jinja_parse_tokens(JCtx *cx, JToken *toks, int ntok, int *nbody) {
    Parser P = {.cx = cx, .t = toks, .n = ntok};
    JNode **body = subparse(&P, NULL, nbody);
    if (cur(&P)->type != JT_EOF)
        fail_at(&P, cur(&P), "unexpected '%s'", describe(cur(&P)));
    check_list(&P, body, *nbody, 0);
    return body;
}
