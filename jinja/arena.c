/* arena.c - the arena every parse and render allocates from, growable byte buffers in it,
 * and jinja_fail, which records an error and unwinds to the caller's setjmp: nothing is freed
 * piecemeal, so an error anywhere leaks nothing. */
#include "jinja_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- arena ---- */

struct JChunk {
    JChunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

enum { CHUNK_SIZE = 64 * 1024 };

_Noreturn void jinja_fail(JCtx *cx, int line, const char *fmt, ...) {
    size_t off = 0;
    if (line > 0)
        off = (size_t)snprintf(cx->msg, sizeof cx->msg, "line %d: ", line);
    if (off >= sizeof cx->msg)
        off = sizeof cx->msg - 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cx->msg + off, sizeof cx->msg - off, fmt, ap);
    va_end(ap);
    longjmp(cx->jb, 1);
}

void *jinja_alloc(JCtx *cx, size_t n) {
    JArena *a = &cx->arena;
    n = (n + 15) & ~(size_t)15;
    if (a->limit && a->total + n > a->limit)
        jinja_fail(cx, 0, "the template used more than %zu bytes of memory", a->limit);
    if (!a->head || a->head->cap - a->head->used < n) {
        size_t cap = n > CHUNK_SIZE / 2 ? n : CHUNK_SIZE;
        JChunk *c = malloc(sizeof *c + cap);
        if (!c)
            jinja_fail(cx, 0, "out of memory");
        c->used = 0;
        c->cap = cap;
        if (a->head && cap != CHUNK_SIZE) { /* a big block: keep the current chunk in front */
            c->next = a->head->next;
            a->head->next = c;
        } else {
            c->next = a->head;
            a->head = c;
        }
        a->total += sizeof *c + cap;
        c->used = n;
        memset(c->data, 0, n);
        return c->data;
    }
    void *p = a->head->data + a->head->used;
    a->head->used += n;
    memset(p, 0, n);
    return p;
}

void jinja_arena_free(JArena *a) {
    JChunk *c = a->head;
    while (c) {
        JChunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->total = 0;
}

/* ---- buffers ---- */

static void buf_grow(JCtx *cx, JBuf *b, size_t need) {
    if (b->len + need + 1 <= b->cap)
        return;
    size_t cap = b->cap ? b->cap * 2 : 64;
    while (cap < b->len + need + 1)
        cap *= 2;
    char *p = jinja_alloc(cx, cap);
    if (b->len)
        memcpy(p, b->p, b->len);
    b->p = p;
    b->cap = cap;
}

void jinja_buf_put(JCtx *cx, JBuf *b, const char *s, size_t n) {
    buf_grow(cx, b, n);
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

void jinja_buf_putc(JCtx *cx, JBuf *b, char c) {
    buf_grow(cx, b, 1);
    b->p[b->len++] = c;
    b->p[b->len] = 0;
}

void jinja_buf_printf(JCtx *cx, JBuf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof tmp) {
        jinja_buf_put(cx, b, tmp, (size_t)n);
        return;
    }
    buf_grow(cx, b, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}
