/* nfa.c - rule trees to a byte-level pushdown automaton: each rule a Thompson automaton from
 * its start to its final state, with byte-range edges, epsilon edges and call edges (enter
 * another rule's start; on its final state, continue at the return state). Repetitions are
 * unrolled ({2,4} = x x (x x?)?). Left recursion is refused here, so that following epsilons
 * and calls from any state always ends. */
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "gr_internal.h"

enum { MAX_STATES = 1 << 20 }; /* about 60 MB */

static int new_state(GrNfa *a) {
    if (a->nst == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 1024;
        a->st = pl_xrealloc(a->st, a->cap * sizeof *a->st);
    }
    GrState *s = &a->st[a->nst];
    memset(s, 0, sizeof *s);
    s->call = -1;
    s->final_of = -1;
    return a->nst++;
}

static void add_eps(GrNfa *a, int from, int to) {
    GrState *s = &a->st[from];
    if (s->neps == s->cap_eps) {
        s->cap_eps = s->cap_eps ? 2 * s->cap_eps : 2;
        s->eps = pl_xrealloc(s->eps, s->cap_eps * sizeof *s->eps);
    }
    s->eps[s->neps++] = to;
}

static void add_edge(GrNfa *a, int from, uint8_t lo, uint8_t hi, int to) {
    GrState *s = &a->st[from];
    if (s->nedges == s->cap_edges) {
        s->cap_edges = s->cap_edges ? 2 * s->cap_edges : 1;
        s->edges = pl_xrealloc(s->edges, s->cap_edges * sizeof *s->edges);
    }
    s->edges[s->nedges++] = (GrEdge){lo, hi, to};
}

/* Emit x from state `from`; returns the state where it ends, -1 when too large. */
static int emit(GrNfa *a, const GrNode *x, int from) {
    if (a->nst > MAX_STATES)
        return -1;
    switch (x->kind) {
        case GN_BYTES:
            for (int i = 0; i < x->n; i++) {
                int to = new_state(a);
                add_edge(a, from, x->bytes[i], x->bytes[i], to);
                from = to;
            }
            return from;
        case GN_RANGE: {
            int to = new_state(a);
            add_edge(a, from, x->lo, x->hi, to);
            return to;
        }
        case GN_SEQ:
            for (int i = 0; i < x->n && from >= 0; i++)
                from = emit(a, x->kids[i], from);
            return from;
        case GN_ALT: {
            int end = new_state(a);
            for (int i = 0; i < x->n; i++) {
                int s = new_state(a);
                add_eps(a, from, s);
                int e = emit(a, x->kids[i], s);
                if (e < 0)
                    return -1;
                add_eps(a, e, end);
            }
            return end;
        }
        case GN_REF: {
            int ret = new_state(a);
            int s = new_state(a);
            add_eps(a, from, s);
            a->st[s].call = x->rule;
            a->st[s].ret = ret;
            return ret;
        }
        case GN_REP: {
            for (int i = 0; i < x->min && from >= 0; i++)
                from = emit(a, x->kids[0], from);
            if (from < 0)
                return -1;
            if (x->max < 0) { /* loop: from -x-> back to from */
                int body = new_state(a);
                add_eps(a, from, body);
                int e = emit(a, x->kids[0], body);
                if (e < 0)
                    return -1;
                add_eps(a, e, from);
                int end = new_state(a);
                add_eps(a, from, end);
                return end;
            }
            int end = new_state(a);
            for (int i = x->min; i < x->max && from >= 0; i++) {
                add_eps(a, from, end);
                from = emit(a, x->kids[0], from);
            }
            if (from < 0)
                return -1;
            add_eps(a, from, end);
            return end;
        }
    }
    return -1;
}

typedef struct {
    int *v;
    int n, cap;
} Ints;

static void ints_push(Ints *l, int x) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->v = pl_xrealloc(l->v, l->cap * sizeof *l->v);
    }
    l->v[l->n++] = x;
}

/* Whether rule can end without reading a byte, and (when calls is not NULL) the (rule,
 * callee) pairs of the calls it makes before reading one: the states reached from its start
 * through epsilons and nullable rules' calls (a queue in stack; reach, all 0 on entry, is
 * cleared on the way out). */
static int left_calls(const GrNfa *a, int rule, const uint8_t *nullable, uint8_t *reach, int *stack,
                      Ints *calls) {
    int n = 0;
    stack[n++] = a->start[rule];
    reach[a->start[rule]] = 1;
    for (int q = 0; q < n; q++) {
        const GrState *s = &a->st[stack[q]];
        for (int i = 0; i <= s->neps; i++) {
            int t = i < s->neps ? s->eps[i] : -1;
            if (i == s->neps && s->call >= 0) {
                if (calls) {
                    ints_push(calls, rule);
                    ints_push(calls, s->call);
                }
                t = nullable[s->call] ? s->ret : -1;
            }
            if (t >= 0 && !reach[t]) {
                reach[t] = 1;
                stack[n++] = t;
            }
        }
    }
    int ends = reach[a->final[rule]];
    for (int q = 0; q < n; q++)
        reach[stack[q]] = 0;
    return ends;
}

/* A rule on a cycle of the graph (pairs (from, to) in e, nr nodes), or -1: an iterative
 * depth-first search (color 0 new, 1 on the path, 2 done). */
static int find_cycle(const Ints *e, int nr) {
    int *first = pl_xcalloc(nr + 1, sizeof *first), *to = pl_xmalloc((e->n / 2 + 1) * sizeof *to);
    for (int i = 0; i < e->n; i += 2) /* edges grouped by their first rule */
        first[e->v[i] + 1]++;
    for (int r = 0; r < nr; r++)
        first[r + 1] += first[r];
    int *fill = pl_xmalloc((nr + 1) * sizeof *fill), found = -1;
    memcpy(fill, first, (nr + 1) * sizeof *fill);
    for (int i = 0; i < e->n; i += 2)
        to[fill[e->v[i]]++] = e->v[i + 1];
    int *color = pl_xcalloc(nr, sizeof *color), *path = pl_xmalloc(nr * sizeof *path);
    int *next = pl_xmalloc(nr * sizeof *next);
    for (int r0 = 0; r0 < nr && found < 0; r0++) {
        if (color[r0])
            continue;
        int depth = 0;
        path[depth++] = r0;
        color[r0] = 1;
        next[r0] = first[r0];
        while (depth && found < 0) {
            int r = path[depth - 1];
            if (next[r] == first[r + 1]) {
                color[r] = 2;
                depth--;
                continue;
            }
            int c = to[next[r]++];
            if (color[c] == 1)
                found = c;
            else if (!color[c]) {
                color[c] = 1;
                next[c] = first[c];
                path[depth++] = c;
            }
        }
    }
    free(first);
    free(to);
    free(fill);
    free(color);
    free(path);
    free(next);
    return found;
}

static int check_left_recursion(GrBuilder *b, const GrNfa *a) {
    int nr = a->nrules;
    uint8_t *nullable = pl_xcalloc(nr, 1), *reach = pl_xcalloc(a->nst, 1);
    int *stack = pl_xmalloc(a->nst * sizeof *stack);
    for (int changed = 1; changed;) { /* nullable to a fixed point */
        changed = 0;
        for (int r = 0; r < nr; r++)
            if (!nullable[r] && left_calls(a, r, nullable, reach, stack, NULL))
                nullable[r] = changed = 1;
    }
    Ints calls = {0};
    for (int r = 0; r < nr; r++)
        left_calls(a, r, nullable, reach, stack, &calls);
    int at = find_cycle(&calls, nr);
    if (at >= 0)
        gr_fail(b, "rule '%s' is left-recursive", b->names[at]);
    free(calls.v);
    free(nullable);
    free(reach);
    free(stack);
    return at >= 0 ? -1 : 0;
}

int gr_nfa_build(GrBuilder *b, int root, GrNfa *a) {
    memset(a, 0, sizeof *a);
    a->nrules = b->nrules;
    a->root = root;
    a->start = pl_xmalloc(b->nrules * sizeof *a->start);
    a->final = pl_xmalloc(b->nrules * sizeof *a->final);
    for (int r = 0; r < b->nrules; r++) {
        if (!b->bodies[r]) {
            gr_fail(b, "rule '%s' is undefined", b->names[r]);
            return -1;
        }
        a->start[r] = new_state(a);
        int end = emit(a, b->bodies[r], a->start[r]);
        if (end < 0) {
            gr_fail(b, "the grammar is too large (over %d automaton states)", MAX_STATES);
            return -1;
        }
        a->final[r] = new_state(a);
        add_eps(a, end, a->final[r]);
        a->st[a->final[r]].final_of = r;
    }
    a->escape = new_state(a);
    return check_left_recursion(b, a);
}

void gr_nfa_free(GrNfa *a) {
    for (int i = 0; i < a->nst; i++) {
        free(a->st[i].edges);
        free(a->st[i].eps);
    }
    free(a->st);
    free(a->start);
    free(a->final);
    memset(a, 0, sizeof *a);
}
