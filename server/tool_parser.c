/* tool_parser.c - a chat answer's text split as vLLM's reasoning and tool-call parsers split
 * it: reasoning (before </think>), tool calls in one of the formats of api.h's ApiToolFormat,
 * and content (the rest). One incremental parser does both the whole-text answer and the
 * streamed one, so the two cannot disagree: it keeps the content text seen so far, and each
 * feed resolves as much of it as is decided (a call object is re-scanned from its start, which
 * is cheap for the few hundred bytes a call takes). Text that may be the start of a marker is
 * held back until the next bytes decide it. JSON is checked with jansson once a call's object
 * is complete. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include <jansson.h>

#include "api.h"

#define THINK_OPEN  "<think>"
#define THINK_CLOSE "</think>"

typedef struct {
    char *p;
    size_t len, cap;
} Text;

static void text_put(Text *t, const char *s, size_t n) {
    if (t->len + n + 1 > t->cap) {
        t->cap = (t->len + n + 1) * 2;
        t->p = pl_xrealloc(t->p, t->cap);
    }
    memcpy(t->p + t->len, s, n);
    t->len += n;
    t->p[t->len] = 0;
}

/* Where the tool parser stands in the content text. */
typedef enum {
    T_START,     /* before anything: llama3_json and the JSON list decide here */
    T_TEXT,      /* plain text, looking for the next call marker */
    T_OBJ_WAIT,  /* a call object is due next (after whitespace) */
    T_OBJ,       /* inside a call object */
    T_CLOSE,     /* hermes: after the object, expecting </tool_call> */
    T_SEP,       /* llama3_json: after an object, expecting ';' or the end */
    T_LIST_SEP,  /* a list of calls: after an object, expecting ',' or ']' */
    T_MISTRAL,   /* after [TOOL_CALLS]: a list, or name[ARGS] */
    T_NAME,      /* mistral: the name before [ARGS] */
    T_ARGS_ONLY, /* mistral: the arguments value after [ARGS] */
    T_PLAIN,     /* no (more) calls: everything is content */
} ToolState;

typedef enum { R_OFF, R_START, R_INSIDE, R_DONE } ReasonState;

struct ApiOutputParser {
    ApiToolFormat fmt;
    ReasonState rs;
    int in_reasoning; /* R_START: the output is inside the think block already */
    Text pending;     /* reasoning stage: bytes not yet decided */
    Text text;        /* content text (after the reasoning) */
    size_t pos;       /* text[0, pos) is resolved */
    ToolState ts;
    int list;         /* the current calls sit in a [...] list */
    int seg_nonws;    /* the text segment after a call has shown non-whitespace */
    int calls;        /* calls started (the current one included) */
    int started;      /* the current call's CALL delta went out */
    int args_seen;    /* ... and some of its arguments */
    size_t obj_at;    /* T_OBJ: the object's first byte; T_ARGS_ONLY: the value's */
    size_t args_sent; /* bytes of the current call's arguments sent */
    char id[32];
    int named;         /* CALL deltas sent */
    size_t section_at; /* where the current marker (or list) of calls began */
    int section_named; /* CALL deltas sent since */
    int failed;        /* the output broke the format */
    int reasoned;      /* a think block was entered */
    ApiDeltaFn emit;
    void *ctx;
};

/* ---- names and ids ----------------------------------------------------------------------- */

ApiToolFormat api_tool_format(const char *name) {
    if (!name)
        return API_TOOLS_OFF;
    return !strcmp(name, "hermes")        ? API_TOOLS_HERMES
           : !strcmp(name, "llama3_json") ? API_TOOLS_LLAMA3_JSON
           : !strcmp(name, "mistral")     ? API_TOOLS_MISTRAL
                                          : API_TOOLS_OFF;
}

ApiReasoning api_reasoning_parser(const char *name) {
    if (!name)
        return API_REASONING_OFF;
    return !strcmp(name, "deepseek_r1") ? API_REASONING_DEEPSEEK_R1
           : !strcmp(name, "qwen3")     ? API_REASONING_QWEN3
                                        : API_REASONING_OFF;
}

/* "call_" and 24 random letters and digits, as OpenAI's ids look; for mistral 9 letters and
 * digits, as vLLM makes them (Mistral's templates refuse other ids in the history). */
static void new_call_id(char id[32], int mistral) {
    static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    unsigned char r[24];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r)
        for (size_t i = 0; i < sizeof r; i++)
            r[i] = (unsigned char)rand();
    int at = mistral ? 0 : 5, n = mistral ? 9 : 24;
    memcpy(id, "call_", (size_t)at);
    for (int i = 0; i < n; i++)
        id[at + i] = A[r[i] % (sizeof A - 1)];
    id[at + n] = 0;
}

/* ---- JSON scanning over a prefix --------------------------------------------------------- */

static int is_ws(char c) {
    return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

static size_t skip_ws(const char *s, size_t n, size_t i) {
    while (i < n && is_ws(s[i]))
        i++;
    return i;
}

/* Past the closing quote of the string at s[i], or -1 when the text ends first. */
static long string_end(const char *s, size_t n, size_t i) {
    for (size_t j = i + 1; j < n; j++) {
        if (s[j] == '\\')
            j++;
        else if (s[j] == '"')
            return (long)j + 1;
    }
    return -1;
}

/* Past the object or array at s[i] (strings skipped), or -1 when the text ends first. */
static long nested_end(const char *s, size_t n, size_t i) {
    int depth = 0;
    for (size_t j = i; j < n; j++) {
        char c = s[j];
        if (c == '"') {
            long e = string_end(s, n, j);
            if (e < 0)
                return -1;
            j = (size_t)e - 1;
        } else if (c == '{' || c == '[') {
            depth++;
        } else if ((c == '}' || c == ']') && --depth == 0) {
            return (long)j + 1;
        }
    }
    return -1;
}

/* Past the JSON value at s[i]: -1 when the text ends first (a number at the very end is
 * complete only when final), -2 when no JSON value starts there. */
static long value_end(const char *s, size_t n, size_t i, int final) {
    if (i >= n)
        return -1;
    char c = s[i];
    if (c == '"')
        return string_end(s, n, i);
    if (c == '{' || c == '[')
        return nested_end(s, n, i);
    if (!c || !strchr("-0123456789tfn", c))
        return -2;
    size_t j = i;
    while (j < n && s[j] && strchr("+-.0123456789eEtruefalsn", s[j]))
        j++;
    return j < n || final ? (long)j : -1;
}

/* What is known of a call object {"name": .., "arguments" | "parameters": ..} so far:
 * offsets from its '{', -1 while unknown. */
typedef struct {
    long name_at, name_end, args_at, args_end, end; /* end: the closing '}' */
    int bad;
} ObjScan;

static int key_is(const char *k, size_t n, const char *want) {
    return n == strlen(want) && !memcmp(k, want, n);
}

/* One "key": value member at s[*i]; 1 when complete (*i past it), 0 when the text ends. */
static int scan_member(const char *s, size_t n, size_t *i, int final, ObjScan *r) {
    long ke = string_end(s, n, *i);
    if (ke < 0)
        return 0;
    const char *k = s + *i + 1;
    size_t kn = (size_t)ke - *i - 2, v = skip_ws(s, n, (size_t)ke);
    if (v < n && s[v] != ':')
        r->bad = 1;
    if (v >= n || r->bad)
        return 0;
    v = skip_ws(s, n, v + 1);
    long ve = v < n ? value_end(s, n, v, final) : -1;
    r->bad = ve == -2;
    if (key_is(k, kn, "name")) {
        r->name_at = (long)v;
        r->name_end = ve;
    } else if ((key_is(k, kn, "arguments") || key_is(k, kn, "parameters")) && r->args_at < 0) {
        r->args_at = (long)v;
        r->args_end = ve;
    }
    if (ve < 0)
        return 0;
    *i = (size_t)ve;
    return 1;
}

static ObjScan scan_object(const char *s, size_t n, int final) {
    ObjScan r = {-1, -1, -1, -1, -1, 0};
    for (size_t i = 1;;) {
        i = skip_ws(s, n, i);
        if (i >= n)
            return r;
        if (s[i] == '}') {
            r.end = (long)i;
            return r;
        }
        if (s[i] != '"') {
            r.bad = 1;
            return r;
        }
        if (!scan_member(s, n, &i, final, &r))
            return r;
        i = skip_ws(s, n, i);
        if (i < n && s[i] == ',')
            i++;
        else if (i < n && s[i] != '}')
            r.bad = 1;
        if (r.bad)
            return r;
    }
}

/* ---- deltas ------------------------------------------------------------------------------ */

static void emit(ApiOutputParser *p, ApiDeltaKind kind, const char *s, size_t n) {
    if (n == 0 && kind != API_DELTA_CALL)
        return;
    ApiDelta d = {.kind = kind, .index = p->calls - 1, .text = s, .len = n};
    if (kind == API_DELTA_CALL) {
        d.id = p->id;
        d.name = s;
        d.text = NULL;
        d.len = 0;
    }
    p->emit(p->ctx, &d);
}

/* Content text[pos, upto): after a call, a segment of whitespace alone is dropped. */
static void content_upto(ApiOutputParser *p, size_t upto) {
    if (upto <= p->pos)
        return;
    if (p->calls > 0 && !p->seg_nonws) {
        size_t i = skip_ws(p->text.p, upto, p->pos);
        if (i == upto)
            return; /* held: pos stays */
        p->seg_nonws = 1;
    }
    emit(p, API_DELTA_CONTENT, p->text.p + p->pos, upto - p->pos);
    p->pos = upto;
}

/* The format is broken at pos: no more calls, the rest is content (from the marker on when
 * no call of it went out). */
static void fail(ApiOutputParser *p) {
    p->failed = 1;
    if (!p->section_named)
        p->pos = p->section_at;
    p->ts = T_PLAIN;
    p->seg_nonws = 1;
}

/* Longest suffix of s[0, n) that is a proper prefix of marker m. */
static size_t partial_marker(const char *s, size_t n, const char *m) {
    size_t mlen = strlen(m);
    for (size_t k = mlen - 1 < n ? mlen - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, m, k))
            return k;
    return 0;
}

/* 1 when text[pos..] starts with marker m (pos moved past it); 0 when it does not; -1 when
 * it is a proper prefix of m (undecided until more text, or final: it does not). */
static int starts_marker(ApiOutputParser *p, const char *m, int final) {
    size_t n = p->text.len - p->pos, mlen = strlen(m);
    if (n >= mlen && !memcmp(p->text.p + p->pos, m, mlen)) {
        p->pos += mlen;
        return 1;
    }
    return n < mlen && !memcmp(p->text.p + p->pos, m, n) && !final ? -1 : 0;
}

/* ---- calls ------------------------------------------------------------------------------- */

static void call_begin(ApiOutputParser *p) {
    p->calls++;
    p->started = p->args_seen = 0;
    p->args_sent = 0;
    new_call_id(p->id, p->fmt == API_TOOLS_MISTRAL);
}

/* The CALL delta of the current call, its name given as the JSON string at s[0, n) or as the
 * raw name (json 0); -1 when the name is no string. */
static int call_named(ApiOutputParser *p, const char *s, size_t n, int json) {
    json_t *v = json ? json_loadb(s, n, JSON_DECODE_ANY, NULL) : json_stringn(s, n);
    int ok = json_is_string(v) && json_string_length(v) > 0 &&
             strlen(json_string_value(v)) == json_string_length(v);
    if (ok) {
        p->started = 1;
        p->named++;
        p->section_named++;
        emit(p, API_DELTA_CALL, json_string_value(v), 0);
    }
    json_decref(v);
    return ok ? 0 : -1;
}

/* Arguments bytes at text[at, avail) not sent yet. */
static void call_args(ApiOutputParser *p, size_t at, size_t avail) {
    p->args_seen = 1;
    if (avail > at + p->args_sent) {
        emit(p, API_DELTA_ARGS, p->text.p + at + p->args_sent, avail - at - p->args_sent);
        p->args_sent = avail - at;
    }
}

/* The current call is complete. */
static void call_end(ApiOutputParser *p) {
    if (!p->args_seen)
        emit(p, API_DELTA_ARGS, "{}", 2);
    p->seg_nonws = 0;
}

static ToolState after_object(const ApiOutputParser *p) {
    return p->list                           ? T_LIST_SEP
           : p->fmt == API_TOOLS_HERMES      ? T_CLOSE
           : p->fmt == API_TOOLS_LLAMA3_JSON ? T_SEP
                                             : T_TEXT;
}

/* T_OBJ: the call object at obj_at, re-scanned. Returns 1 when it moved on. */
static int step_object(ApiOutputParser *p, int final) {
    const char *s = p->text.p + p->obj_at;
    size_t n = p->text.len - p->obj_at;
    ObjScan r = scan_object(s, n, final);
    if (!p->started && r.name_end >= 0 &&
        call_named(p, s + r.name_at, (size_t)(r.name_end - r.name_at), 1) < 0)
        r.bad = 1;
    if (p->started && r.args_at >= 0 && !r.bad)
        call_args(p, p->obj_at + (size_t)r.args_at,
                  p->obj_at + (size_t)(r.args_end >= 0 ? r.args_end : (long)n));
    json_t *whole = r.end >= 0 ? json_loadb(s, (size_t)r.end + 1, 0, NULL) : NULL;
    if (r.bad || (r.end >= 0 && (!whole || !p->started)) || (final && r.end < 0)) {
        json_decref(whole);
        fail(p);
        return 1;
    }
    json_decref(whole);
    if (r.end < 0)
        return 0;
    call_end(p);
    p->pos = p->obj_at + (size_t)r.end + 1;
    p->ts = after_object(p);
    return 1;
}

/* T_OBJ_WAIT: whitespace, then '{'. */
static int step_obj_wait(ApiOutputParser *p, int final) {
    p->pos = skip_ws(p->text.p, p->text.len, p->pos);
    if (p->pos >= p->text.len) {
        if (final)
            fail(p);
        return final;
    }
    if (p->text.p[p->pos] != '{') {
        fail(p);
        return 1;
    }
    call_begin(p);
    p->obj_at = p->pos;
    p->ts = T_OBJ;
    return 1;
}

/* After whitespace, one of the characters of `seps` (its index), -1 while the text ends
 * first, -2 for another character. */
static int next_char(ApiOutputParser *p, const char *seps) {
    p->pos = skip_ws(p->text.p, p->text.len, p->pos);
    if (p->pos >= p->text.len)
        return -1;
    const char *c = strchr(seps, p->text.p[p->pos]);
    return c && *c ? (int)(c - seps) : -2;
}

/* T_SEP (llama3_json: ';' or the end) and T_LIST_SEP (',' or ']'). */
static int step_sep(ApiOutputParser *p, int final) {
    int list = p->ts == T_LIST_SEP, k = next_char(p, list ? ",]" : ";");
    if (k == -1) {
        if (final && list)
            fail(p);
        return final && list;
    }
    if (k == -2) {
        fail(p);
        return 1;
    }
    p->pos++;
    if (list && k == 1) { /* ']': the list is over */
        p->list = 0;
        p->ts = p->fmt == API_TOOLS_MISTRAL ? T_TEXT : T_PLAIN;
    } else {
        p->ts = T_OBJ_WAIT;
    }
    return 1;
}

/* T_CLOSE: hermes' </tool_call> (a call left open at the end is accepted, as vLLM does). */
static int step_close(ApiOutputParser *p, int final) {
    p->pos = skip_ws(p->text.p, p->text.len, p->pos);
    int m = starts_marker(p, "</tool_call>", final);
    if (m < 0 || (m == 0 && p->pos >= p->text.len))
        return 0;
    if (m == 0)
        fail(p);
    else
        p->ts = T_TEXT;
    return 1;
}

/* T_TEXT: content up to the next call marker (none for the JSON list: all content). */
static int step_text(ApiOutputParser *p, int final) {
    const char *m = p->fmt == API_TOOLS_HERMES    ? "<tool_call>"
                    : p->fmt == API_TOOLS_MISTRAL ? "[TOOL_CALLS]"
                                                  : NULL;
    const char *s = p->text.p + p->pos;
    size_t n = p->text.len - p->pos;
    const char *hit = m ? memmem(s, n, m, strlen(m)) : NULL;
    if (!hit) {
        content_upto(p, p->text.len - (final || !m ? 0 : partial_marker(s, n, m)));
        return 0;
    }
    content_upto(p, (size_t)(hit - p->text.p));
    p->section_at = (size_t)(hit - p->text.p);
    p->section_named = 0;
    p->pos = p->section_at + strlen(m);
    p->ts = p->fmt == API_TOOLS_HERMES ? T_OBJ_WAIT : T_MISTRAL;
    return 1;
}

/* T_START: llama3_json calls when the output opens with <|python_tag|> or '{'; the JSON list
 * when it opens with '['; else it is all content. */
static int step_start(ApiOutputParser *p, int final) {
    static const char tag[] = "<|python_tag|>";
    size_t i = skip_ws(p->text.p, p->text.len, p->pos), tl = sizeof tag - 1;
    if (i >= p->text.len) {
        if (final)
            p->ts = T_PLAIN;
        return final;
    }
    const char *s = p->text.p + i;
    size_t n = p->text.len - i;
    ToolState next = T_PLAIN;
    if (p->fmt == API_TOOLS_LLAMA3_JSON) {
        if (n < tl && !memcmp(s, tag, n) && !final)
            return 0; /* may still become the tag */
        int tagged = n >= tl && !memcmp(s, tag, tl);
        i += tagged ? tl : 0;
        if (tagged || s[0] == '{')
            next = T_OBJ_WAIT;
    } else if (s[0] == '[') {
        i++;
        p->list = 1;
        next = T_OBJ_WAIT;
    }
    if (next == T_OBJ_WAIT) {
        p->section_at = p->pos;
        p->pos = i;
    }
    p->ts = next;
    return 1;
}

/* T_MISTRAL: after [TOOL_CALLS], a JSON list of calls or name[ARGS]. */
static int step_mistral(ApiOutputParser *p, int final) {
    size_t i = skip_ws(p->text.p, p->text.len, p->pos);
    if (i >= p->text.len) {
        if (final)
            fail(p);
        return final;
    }
    p->pos = i;
    if (p->text.p[i] == '[') {
        p->pos++;
        p->list = 1;
        p->ts = T_OBJ_WAIT;
    } else {
        p->ts = T_NAME;
    }
    return 1;
}

static int is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == '.';
}

/* T_NAME: mistral's function name up to [ARGS]. */
static int step_name(ApiOutputParser *p, int final) {
    const char *s = p->text.p + p->pos;
    size_t n = p->text.len - p->pos, k = 0;
    while (k < n && is_name_char(s[k]))
        k++;
    size_t rest = n - k;
    if (rest < 6 && !memcmp(s + k, "[ARGS]", rest) && !final)
        return 0; /* undecided */
    if (k == 0 || rest < 6 || memcmp(s + k, "[ARGS]", 6)) {
        fail(p);
        return 1;
    }
    call_begin(p);
    call_named(p, s, k, 0);
    p->pos += k + 6;
    p->obj_at = p->pos;
    p->ts = T_ARGS_ONLY;
    return 1;
}

/* T_ARGS_ONLY: mistral's arguments value after [ARGS]. */
static int step_args_only(ApiOutputParser *p, int final) {
    p->obj_at = skip_ws(p->text.p, p->text.len, p->obj_at);
    long e = value_end(p->text.p, p->text.len, p->obj_at, final);
    if (e == -2 || (e == -1 && final)) {
        fail(p);
        return 1;
    }
    call_args(p, p->obj_at, e >= 0 ? (size_t)e : p->text.len);
    if (e < 0)
        return 0;
    json_t *v = json_loadb(p->text.p + p->obj_at, (size_t)e - p->obj_at, JSON_DECODE_ANY, NULL);
    json_decref(v);
    if (!v) {
        fail(p);
        return 1;
    }
    call_end(p);
    p->pos = (size_t)e;
    p->ts = T_TEXT;
    return 1;
}

/* Resolve as much of the content text as is decided. */
static void tools_run(ApiOutputParser *p, int final) {
    for (int moved = 1; moved;) {
        switch (p->ts) {
            case T_START:
                moved = step_start(p, final);
                break;
            case T_TEXT:
                moved = step_text(p, final);
                break;
            case T_OBJ_WAIT:
                moved = step_obj_wait(p, final);
                break;
            case T_OBJ:
                moved = step_object(p, final);
                break;
            case T_CLOSE:
                moved = step_close(p, final);
                break;
            case T_SEP:
            case T_LIST_SEP:
                moved = step_sep(p, final);
                break;
            case T_MISTRAL:
                moved = step_mistral(p, final);
                break;
            case T_NAME:
                moved = step_name(p, final);
                break;
            case T_ARGS_ONLY:
                moved = step_args_only(p, final);
                break;
            case T_PLAIN:
                content_upto(p, p->text.len);
                moved = 0;
        }
    }
    if (final)
        p->pos = p->text.len; /* whitespace held after the last call is dropped */
}

static void content_feed(ApiOutputParser *p, const char *s, size_t n, int final) {
    text_put(&p->text, s, n);
    tools_run(p, final);
}

/* ---- reasoning --------------------------------------------------------------------------- */

/* R_START: a leading <think> is stripped; without one, qwen3's output is all content. */
static void reason_start(ApiOutputParser *p, int final) {
    Text *t = &p->pending;
    size_t m = strlen(THINK_OPEN);
    if (t->len < m && !memcmp(t->p, THINK_OPEN, t->len) && !final)
        return; /* may still become <think> */
    int opened = t->len >= m && !memcmp(t->p, THINK_OPEN, m);
    if (opened) {
        memmove(t->p, t->p + m, t->len - m + 1);
        t->len -= m;
    }
    p->rs = opened || p->in_reasoning ? R_INSIDE : R_DONE;
    p->reasoned = p->rs == R_INSIDE;
}

/* R_INSIDE: reasoning up to </think>; what follows is content. */
static void reason_inside(ApiOutputParser *p, int final) {
    Text *t = &p->pending;
    char *end = memmem(t->p, t->len, THINK_CLOSE, strlen(THINK_CLOSE));
    size_t upto = end ? (size_t)(end - t->p)
                      : t->len - (final ? 0 : partial_marker(t->p, t->len, THINK_CLOSE));
    emit(p, API_DELTA_REASONING, t->p, upto);
    size_t skip = end ? upto + strlen(THINK_CLOSE) : upto;
    memmove(t->p, t->p + skip, t->len - skip + 1);
    t->len -= skip;
    if (end)
        p->rs = R_DONE;
}

void api_output_parser_feed(ApiOutputParser *p, const char *text, size_t len, int final,
                            ApiDeltaFn emit_fn, void *ctx) {
    p->emit = emit_fn;
    p->ctx = ctx;
    if (p->rs == R_OFF || p->rs == R_DONE) {
        content_feed(p, text, len, final);
        return;
    }
    text_put(&p->pending, text, len);
    if (p->rs == R_START)
        reason_start(p, final);
    if (p->rs == R_INSIDE)
        reason_inside(p, final);
    if (p->rs == R_DONE || final) {
        content_feed(p, p->pending.p ? p->pending.p : "", p->pending.len, final);
        p->pending.len = 0;
    }
}

ApiOutputParser *api_output_parser_new(ApiToolFormat tools, ApiReasoning reasoning,
                                       int in_reasoning) {
    ApiOutputParser *p = pl_xcalloc(1, sizeof *p);
    p->fmt = tools;
    p->rs = reasoning == API_REASONING_OFF ? R_OFF : R_START;
    p->in_reasoning = in_reasoning;
    p->ts = tools == API_TOOLS_OFF           ? T_PLAIN
            : tools == API_TOOLS_LLAMA3_JSON ? T_START
            : tools == API_TOOLS_JSON_LIST   ? T_START
                                             : T_TEXT;
    return p;
}

void api_output_parser_free(ApiOutputParser *p) {
    if (!p)
        return;
    free(p->pending.p);
    free(p->text.p);
    free(p);
}

int api_output_parser_calls(const ApiOutputParser *p) {
    return p->named;
}

/* ---- the whole text at once -------------------------------------------------------------- */

typedef struct {
    ApiChatOutput *out;
    Text reasoning, content, args;
    int saw_reasoning;
} Collect;

static void collect(void *ctx, const ApiDelta *d) {
    Collect *c = ctx;
    ApiChatOutput *o = c->out;
    if (d->kind == API_DELTA_REASONING) {
        text_put(&c->reasoning, d->text, d->len);
    } else if (d->kind == API_DELTA_CONTENT) {
        text_put(&c->content, d->text, d->len);
    } else if (d->kind == API_DELTA_CALL) {
        o->calls = pl_xrealloc(o->calls, (size_t)(o->num_calls + 1) * sizeof *o->calls);
        ApiToolCall *t = &o->calls[o->num_calls++];
        snprintf(t->id, sizeof t->id, "%s", d->id);
        t->name = pl_xstrdup(d->name);
        t->arguments = pl_xstrdup("");
    } else {
        ApiToolCall *t = &o->calls[d->index];
        size_t n = strlen(t->arguments);
        t->arguments = pl_xrealloc(t->arguments, n + d->len + 1);
        memcpy(t->arguments + n, d->text, d->len);
        t->arguments[n + d->len] = 0;
    }
}

static void drop_calls(ApiChatOutput *o) {
    for (int i = 0; i < o->num_calls; i++) {
        free(o->calls[i].name);
        free(o->calls[i].arguments);
    }
    free(o->calls);
    o->calls = NULL;
    o->num_calls = 0;
}

void api_parse_chat_output(ApiToolFormat tools, ApiReasoning reasoning, int in_reasoning,
                           const char *text, size_t len, ApiChatOutput *out) {
    memset(out, 0, sizeof *out);
    ApiOutputParser *p = api_output_parser_new(tools, reasoning, in_reasoning);
    Collect c = {.out = out};
    api_output_parser_feed(p, text, len, 1, collect, &c);
    if (p->failed) { /* malformed calls: the text after the reasoning is all content */
        drop_calls(out);
        c.content.len = 0;
        text_put(&c.content, p->text.p ? p->text.p : "", p->text.len);
    }
    if (p->reasoned) {
        out->reasoning = c.reasoning.p ? c.reasoning.p : pl_xstrdup("");
        out->reasoning_len = c.reasoning.len;
    } else {
        free(c.reasoning.p);
    }
    if (c.content.len > 0 &&
        (out->num_calls == 0 || skip_ws(c.content.p, c.content.len, 0) < c.content.len)) {
        out->content = c.content.p;
        out->content_len = c.content.len;
    } else {
        free(c.content.p);
    }
    api_output_parser_free(p);
}

void api_chat_output_free(ApiChatOutput *o) {
    free(o->reasoning);
    free(o->content);
    drop_calls(o);
    memset(o, 0, sizeof *o);
}
