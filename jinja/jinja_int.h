/* jinja_int.h - private types of the jinja library: the arena, values, tokens and the syntax
 * tree, shared by the lexer, parser, evaluator and the filter / method tables.
 *
 * Memory: everything a parse or a render allocates lives in one arena (JArena) that is freed
 * at once, so errors unwind with longjmp (jinja_fail) without leaking. Values are small
 * structs passed by value; strings, lists and dicts are never changed after they are built
 * (the sandbox is immutable), except namespaces, which templates change on purpose. */
#ifndef PAGELLM_JINJA_INT_H
#define PAGELLM_JINJA_INT_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "jinja.h"

/* ---- arena and error context ---- */

typedef struct JChunk JChunk;

typedef struct {
    JChunk *head;
    size_t total; /* bytes allocated so far */
    size_t limit; /* fail past this many bytes (0 = no limit) */
} JArena;

typedef struct {
    jmp_buf jb;
    JArena arena;
    char msg[512];
    int raised; /* the error came from raise_exception() */
} JCtx;

/* Abort the parse or render: format the message into cx->msg and longjmp to cx->jb. line > 0
 * prefixes "line N: ". */
_Noreturn void jinja_fail(JCtx *cx, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

void *jinja_alloc(JCtx *cx, size_t n); /* zeroed, 16-byte aligned */
void jinja_arena_free(JArena *a);

/* A growable byte buffer in the arena. */
typedef struct {
    char *p;
    size_t len, cap;
} JBuf;

void jinja_buf_put(JCtx *cx, JBuf *b, const char *s, size_t n);
void jinja_buf_putc(JCtx *cx, JBuf *b, char c);
void jinja_buf_printf(JCtx *cx, JBuf *b, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- values ---- */

enum {
    JV_UNDEF, /* jinja2's Undefined: prints as "", falsy, iterates as empty */
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST, /* also tuples (JF_TUPLE) */
    JV_DICT,
    JV_NS,    /* namespace(): a dict whose entries templates may set */
    JV_MACRO, /* a macro, or the caller of a call block */
    JV_FUNC,  /* a global function or a bound method */
    JV_LOOP,  /* the loop variable of a for loop */
};

#define JF_TUPLE  1
#define JF_MARKUP 2 /* a string marked safe (|safe): + escapes the other operand */

typedef struct JStr {
    size_t len;
    char s[]; /* NUL-terminated */
} JStr;

typedef struct JValue JValue;
typedef struct JList JList;
typedef struct JDict JDict;

struct JValue {
    uint8_t type, flags;
    union {
        int b;
        int64_t i;
        double f;
        JStr *s;
        JList *l;
        JDict *d;
        struct JMacro *m;
        struct JFunc *fn;
        struct JLoop *loop;
        const char *undef; /* JV_UNDEF: the message when it is used ("'x' is undefined") */
    } u;
};

struct JList {
    size_t len, cap;
    JValue *v;
};

/* Insertion-ordered; keys are compared with Python's == (linear scan: dicts are small). */
struct JDict {
    size_t len, cap;
    JValue *k, *v;
};

/* A global function or a method bound to `self`. */
typedef struct JFunc {
    const char *name;
    JValue self; /* JV_UNDEF for globals */
    int kind;    /* JFN_* */
} JFunc;

enum { JFN_GLOBAL, JFN_METHOD, JFN_LOOP_CYCLE };

JValue jinja_undef(const char *msg);
JValue jinja_none(void);
JValue jinja_bool(int b);
JValue jinja_int(int64_t i);
JValue jinja_float(double f);
JValue jinja_str(JCtx *cx, const char *s, size_t n);
JValue jinja_cstr(JCtx *cx, const char *s);
JValue jinja_strbuf(JCtx *cx, const JBuf *b);
JValue jinja_list_new(JCtx *cx, size_t cap);
JValue jinja_dict_new(JCtx *cx, size_t cap);
void jinja_list_push(JCtx *cx, JList *l, JValue v);
void jinja_dict_set(JCtx *cx, JDict *d, JValue k, JValue v);
/* Returns 1 and *out when the key is there. */
int jinja_dict_get(const JDict *d, JValue k, JValue *out);
int jinja_dict_getc(const JDict *d, const char *key, JValue *out);
JValue jinja_func(JCtx *cx, const char *name, JValue self, int kind);

/* JSON <-> values: jinja_from_json copies a jansson tree into the arena. */
JValue jinja_from_json(JCtx *cx, json_t *j);

int jinja_truthy(JValue v);
int jinja_equal(JValue a, JValue b);
/* Python's a < b (and so on): -1, 0, 1, or fails with a TypeError message. */
int jinja_compare(JCtx *cx, int line, JValue a, JValue b);
const char *jinja_type_name(JValue v); /* Python's type name: "str", "dict", "NoneType" */
const char *jinja_object_repr(JCtx *cx, JValue v); /* "dict object", "None", ... */

/* str(v) and repr(v) appended to a buffer; jinja_to_str returns a string value. */
void jinja_put_str(JCtx *cx, JBuf *b, JValue v);
void jinja_put_repr(JCtx *cx, JBuf *b, JValue v);
JValue jinja_to_str(JCtx *cx, JValue v);
void jinja_put_float(JBuf *b, JCtx *cx, double f); /* Python repr of a float */

/* json.dumps(v, ensure_ascii, indent, separators, sort_keys); indent NULL = None. */
void jinja_put_json(JCtx *cx, int line, JBuf *b, JValue v, int ensure_ascii, const char *indent,
                    const char *item_sep, const char *key_sep, int sort_keys, int level);

/* Iterate a value as Python's iter() would: a list of items (dict -> keys, str -> chars,
 * undefined -> empty); fails for None and numbers. */
JList *jinja_iter(JCtx *cx, int line, JValue v);
/* len(); fails where Python would. */
int64_t jinja_len(JCtx *cx, int line, JValue v);

/* UTF-8 helpers; strings are handled as Python str, one element per code point. */
size_t jinja_utf8_count(const char *s, size_t n);
size_t jinja_utf8_next(const char *s, size_t n, size_t i, uint32_t *cp); /* next offset */
void jinja_utf8_put(JCtx *cx, JBuf *b, uint32_t cp);
int jinja_py_isspace(uint32_t cp);
/* Python's str.isspace() on a whole string (1 if non-empty and all whitespace). */
int jinja_str_isspace(const char *s, size_t n);
/* jinja_ws_prefix / jinja_ws_suffix: include/jinja.h */

/* Case mapping (simple mappings of Latin-1, Latin Extended-A, Greek, Cyrillic; others kept). */
uint32_t jinja_cp_upper(uint32_t cp);
uint32_t jinja_cp_lower(uint32_t cp);
int jinja_cp_cased(uint32_t cp);
enum { JCASE_UPPER, JCASE_LOWER, JCASE_SWAP, JCASE_CAPITALIZE, JCASE_TITLE, JCASE_JINJA_TITLE };
/* str.upper() / lower() / swapcase() / capitalize() / title(), or jinja2's |title. */
JValue jinja_str_case(JCtx *cx, JValue s, int mode);

/* ---- tokens ---- */

enum {
    JT_EOF,
    JT_DATA,
    JT_VAR_BEGIN,
    JT_VAR_END,
    JT_BLOCK_BEGIN,
    JT_BLOCK_END,
    JT_NAME,
    JT_STRING,
    JT_INT,
    JT_FLOAT,
    JT_OP,
};

/* operator codes (JT_OP tokens, binary operators and comparisons) */
enum {
    OP_ADD = 1,
    OP_SUB,
    OP_MUL,
    OP_DIV,
    OP_FLOORDIV,
    OP_MOD,
    OP_POW,
    OP_TILDE,
    OP_LBRACKET,
    OP_RBRACKET,
    OP_LPAREN,
    OP_RPAREN,
    OP_LBRACE,
    OP_RBRACE,
    OP_EQ,
    OP_NE,
    OP_GT,
    OP_GTEQ,
    OP_LT,
    OP_LTEQ,
    OP_ASSIGN,
    OP_DOT,
    OP_COLON,
    OP_PIPE,
    OP_COMMA,
    OP_SEMICOLON,
    OP_IN,    /* comparisons only */
    OP_NOTIN, /* comparisons only */
};

typedef struct {
    int type;
    int op;        /* JT_OP */
    int line, col; /* 1-based */
    const char *s; /* JT_NAME: the name; JT_DATA / JT_STRING: the decoded text (arena) */
    size_t len;
    int64_t i;
    double f;
} JToken;

/* Tokenize a template (newlines normalized, one trailing newline dropped, trim_blocks and
 * lstrip_blocks applied) into cx's arena; fails with "line L column C: ..." */
JToken *jinja_lex(JCtx *cx, const char *src, size_t len, int *ntok);

/* ---- syntax tree ---- */

enum {
    /* expressions */
    N_CONST,
    N_NAME,
    N_GETATTR,
    N_GETITEM,
    N_SLICE,
    N_CALL,
    N_FILTER,
    N_TEST,
    N_NOT,
    N_NEG,
    N_POS,
    N_BINOP,
    N_CONCAT,
    N_COMPARE,
    N_AND,
    N_OR,
    N_COND,
    N_LIST,
    N_TUPLE,
    N_DICT,
    N_NSREF,
    /* statements */
    N_DATA,
    N_OUTPUT,
    N_IF,
    N_FOR,
    N_SET,
    N_SETBLOCK,
    N_MACRO,
    N_CALLBLOCK,
    N_FILTERBLOCK,
    N_BREAK,
    N_CONTINUE,
    N_WITH,
    N_GENERATION, /* {% generation %}: its body, rendered in a scope of its own */
};

typedef struct JNode JNode;

/* One struct for every node; which fields a kind uses:
 *   N_CONST val | N_NAME s | N_GETATTR a.s | N_GETITEM a[b] | N_SLICE a:b:c (each may be NULL)
 *   N_CALL a(args, kw) with c = *args, d = **kwargs | N_FILTER a|s(args, kw) (a NULL in filter
 *   blocks) | N_TEST a is s(args, kw) | N_NOT/N_NEG/N_POS a | N_BINOP a op b | N_AND/N_OR a b
 *   N_CONCAT args | N_COMPARE a then (ops[i], args[i]) | N_COND b if a else c (c may be NULL)
 *   N_LIST/N_TUPLE args | N_DICT args (keys) kw (values) | N_NSREF s.s2
 *   N_DATA s | N_OUTPUT args | N_IF a: body else: orelse | N_FOR a in b if c: body else: orelse
 *   N_SET a = b | N_SETBLOCK a (filter chain c): body | N_MACRO s(params = defaults): body
 *   N_CALLBLOCK a (an N_CALL) with caller(params = defaults): body | N_FILTERBLOCK c: body
 *   N_WITH params = defaults: body | N_GENERATION body */
struct JNode {
    int kind;
    int op; /* N_BINOP: the operator; N_MACRO, N_CALLBLOCK: flags; N_FILTER, N_TEST: 1 when
               jinja2 has no filter / test of that name (an error once it runs) */
    int line, col;
    const char *s, *s2;
    size_t slen;
    JValue val;
    JNode *a, *b, *c, *d;
    JNode **args;
    int nargs;
    JNode **kw; /* keyword argument values */
    const char **kwnames;
    int nkw;
    int *ops; /* N_COMPARE */
    JNode **body, **orelse;
    int nbody, norelse;
    const char **params; /* N_MACRO, N_CALLBLOCK, N_WITH */
    int nparams;
    JNode **defaults; /* the last ndefaults params' defaults (N_WITH: one per param) */
    int ndefaults;
};

/* Parse tokens into the list of top-level statements. */
JNode **jinja_parse_tokens(JCtx *cx, JToken *toks, int ntok, int *nbody);

/* ---- rendering ---- */

typedef struct Scope Scope;

struct Scope {
    Scope *parent;
    JDict vars;
};

typedef struct JMacro {
    const JNode *def; /* N_MACRO, or N_CALLBLOCK for a caller */
    Scope *closure;
    const char *name;
    struct JMacro *caller; /* the caller passed by a call block, or NULL */
} JMacro;

typedef struct JLoop {
    JList *items;
    size_t index0;
    int depth;
    JValue lastchanged; /* loop.changed() */
    int changed_set;
} JLoop;

typedef struct {
    JCtx *cx;
    JDict *context; /* the render's variables */
    JBuf *out;
    int64_t now;
    size_t max_output;
    int depth; /* macro calls in progress */
} JRender;

/* Evaluated call arguments. */
typedef struct {
    int n;
    JValue *v;
    int nkw;
    const char **kwnames;
    JValue *kw;
} JArgs;

/* Render a body into r->out. Returns 0, or JFLOW_BREAK / JFLOW_CONTINUE. */
enum { JFLOW_NORMAL, JFLOW_BREAK, JFLOW_CONTINUE };
int jinja_exec(JRender *r, Scope *sc, JNode **body, int n);

/* Python/jinja2 attribute and item access in the sandbox. */
JValue jinja_getattr(JRender *r, int line, JValue obj, const char *name);
JValue jinja_getitem(JRender *r, int line, JValue obj, JValue key);
/* Call a callable value (macro, function, method). */
JValue jinja_call(JRender *r, int line, JValue fn, JArgs *a);

/* filters.c, tests.c */
JValue jinja_filter(JRender *r, int line, const char *name, JValue v, JArgs *a);
int jinja_test(JRender *r, int line, const char *name, JValue v, JArgs *a);
int jinja_has_filter(const char *name);
int jinja_has_test(const char *name);

/* Append v as text with & < > " ' escaped as HTML (a string marked safe as it is). */
void jinja_escape_html(JCtx *cx, JBuf *b, JValue v);

/* An argument that was not passed (distinct from one that is undefined). */
extern const char jinja_not_given[];

static inline JValue jinja_ng(void) {
    JValue v = {.type = JV_UNDEF};
    v.u.undef = jinja_not_given;
    return v;
}

static inline int jinja_given(JValue v) {
    return !(v.type == JV_UNDEF && v.u.undef == jinja_not_given);
}

/* methods.c: dict / list methods, global functions, operators; strings.c: str methods */
JValue jinja_method(JRender *r, int line, JFunc *fn, JArgs *a);
JValue jinja_global_call(JRender *r, int line, JFunc *fn, JArgs *a);
JValue jinja_lookup_global(JCtx *cx, const char *name); /* JV_UNDEF if none */
int jinja_is_method(JValue self, const char *name, int *unsafe);
JValue jinja_binop(JRender *r, int line, int op, JValue a, JValue b);
JValue jinja_str_method(JRender *r, int line, const char *m, JStr *s, JValue self, JArgs *a);
JValue jinja_str_percent(JRender *r, int line, JStr *s, JValue args);
/* str.strip / lstrip / rstrip (chars: a str, or None / not given for whitespace) */
JValue jinja_str_strip(JCtx *cx, JValue s, JValue chars, int left, int right);
/* The value as a str / an int, or fail naming `what`. */
JStr *jinja_want_str(JRender *r, int line, JValue v, const char *what);
int64_t jinja_want_int(JRender *r, int line, JValue v, const char *what);

/* Argument helpers: the i-th positional or the keyword `name`, or `def`. */
JValue jinja_arg(JArgs *a, int i, const char *name, JValue def);
void jinja_check_args(JRender *r, int line, JArgs *a, int maxpos, const char *const *kwnames,
                      const char *what);

#endif
