/* json.c - the JSON grammar the schema converter builds on: bounded whitespace, strings,
 * numbers with bounded digit runs (a model cannot loop forever on digits or spaces), any
 * value, any object, and integer ranges as digit patterns. Each piece is one rule, made on
 * first use. */
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "gr_internal.h"

/* The rule `name`, defining it with make() on first use. */
static GrNode *once(GrBuilder *b, const char *name, GrNode *(*make)(GrBuilder *)) {
    int r = gr_rule(b, name, strlen(name));
    if (!b->bodies[r]) {
        b->bodies[r] = gr_empty(b); /* a placeholder while make() refers back */
        b->bodies[r] = make(b);
    }
    return gr_ref(b, r);
}

static GrNode *digits(GrBuilder *b, int min, int max) {
    return gr_rep(b, gr_range(b, '0', '9'), min, max);
}

static GrNode *make_ws(GrBuilder *b) {
    uint32_t blank[] = {' ', ' ', '\t', '\t'};
    GrNode *indent = gr_seq(b, 2, gr_str(b, "\n"), gr_rep(b, gr_class(b, blank, 2, 0, 0), 0, 20));
    return gr_rep(b, gr_alt(b, 2, gr_str(b, " "), indent), 0, 1);
}

GrNode *gr_json_ws(GrBuilder *b) {
    return once(b, "ws", make_ws);
}

static GrNode *make_char(GrBuilder *b) {
    uint32_t plain[] = {0, 0x10FFFF};
    uint32_t esc[] = {'"', '"', '\\', '\\', '/', '/', 'b', 'b',
                      'f', 'f', 'n',  'n',  'r', 'r', 't', 't'};
    /* \u escapes of surrogates are left out: a lone one is invalid JSON to most parsers */
    uint32_t hex[] = {'0', '9', 'a', 'f', 'A', 'F'},
             first[] = {'0', '9', 'a', 'c', 'A', 'C', 'e', 'f', 'E', 'F'};
    uint32_t d[] = {'d', 'd', 'D', 'D'};
    GrNode *hex3 = gr_rep(b, gr_class(b, hex, 3, 0, 0), 3, 3);
    GrNode *u = gr_seq(b, 2, gr_str(b, "u"),
                       gr_alt(b, 2, gr_seq(b, 2, gr_class(b, first, 5, 0, 0), hex3),
                              gr_seq(b, 3, gr_class(b, d, 2, 0, 0), gr_range(b, '0', '7'),
                                     gr_rep(b, gr_class(b, hex, 3, 0, 0), 2, 2))));
    return gr_alt(b, 2, gr_class(b, plain, 1, 0, 1),
                  gr_seq(b, 2, gr_str(b, "\\"), gr_alt(b, 2, gr_class(b, esc, 8, 0, 0), u)));
}

GrNode *gr_json_char(GrBuilder *b) {
    return once(b, "char", make_char);
}

static GrNode *make_string(GrBuilder *b) {
    return gr_seq(b, 3, gr_str(b, "\""), gr_rep(b, gr_json_char(b), 0, -1), gr_str(b, "\""));
}

static GrNode *make_integer(GrBuilder *b) {
    GrNode *mag =
        gr_alt(b, 2, gr_str(b, "0"), gr_seq(b, 2, gr_range(b, '1', '9'), digits(b, 0, 15)));
    return gr_seq(b, 2, gr_rep(b, gr_str(b, "-"), 0, 1), mag);
}

static GrNode *make_number(GrBuilder *b) {
    GrNode *frac = gr_rep(b, gr_seq(b, 2, gr_str(b, "."), digits(b, 1, 16)), 0, 1);
    uint32_t e[] = {'e', 'e', 'E', 'E'}, sign[] = {'+', '+', '-', '-'};
    GrNode *exp = gr_rep(b,
                         gr_seq(b, 3, gr_class(b, e, 2, 0, 0),
                                gr_rep(b, gr_class(b, sign, 2, 0, 0), 0, 1), digits(b, 1, 2)),
                         0, 1);
    return gr_seq(b, 3, once(b, "integer", make_integer), frac, exp);
}

GrNode *gr_json_string(GrBuilder *b) {
    return once(b, "string", make_string);
}
GrNode *gr_json_integer(GrBuilder *b) {
    return once(b, "integer", make_integer);
}
GrNode *gr_json_number(GrBuilder *b) {
    return once(b, "number", make_number);
}

/* "{" ws ( member ( "," ws member )* )? "}" with member = string ws ":" ws value ws. */
static GrNode *make_object(GrBuilder *b) {
    GrNode *member = gr_seq(b, 5, gr_json_string(b), gr_json_ws(b), gr_str(b, ":"),
                            gr_seq(b, 2, gr_json_ws(b), gr_json_value_node(b)), gr_json_ws(b));
    GrNode *more = gr_rep(b, gr_seq(b, 3, gr_str(b, ","), gr_json_ws(b), member), 0, -1);
    return gr_seq(b, 4, gr_str(b, "{"), gr_json_ws(b), gr_rep(b, gr_seq(b, 2, member, more), 0, 1),
                  gr_str(b, "}"));
}

static GrNode *make_array(GrBuilder *b) {
    GrNode *item = gr_seq(b, 2, gr_json_value_node(b), gr_json_ws(b));
    GrNode *more = gr_rep(b, gr_seq(b, 3, gr_str(b, ","), gr_json_ws(b), item), 0, -1);
    return gr_seq(b, 4, gr_str(b, "["), gr_json_ws(b), gr_rep(b, gr_seq(b, 2, item, more), 0, 1),
                  gr_str(b, "]"));
}

static GrNode *make_value(GrBuilder *b) {
    GrNode *alts[] = {once(b, "object", make_object),
                      once(b, "array", make_array),
                      gr_json_string(b),
                      gr_json_number(b),
                      gr_str(b, "true"),
                      gr_str(b, "false"),
                      gr_str(b, "null")};
    return gr_list(b, GN_ALT, alts, 7);
}

GrNode *gr_json_value_node(GrBuilder *b) {
    return once(b, "value", make_value);
}

GrNode *gr_json_object_node(GrBuilder *b) {
    return once(b, "object", make_object);
}

/* ---- integer ranges -------------------------------------------------------------------- */

/* Numbers of n digits between lo and hi (decimal strings of equal length n, lo <= hi). */
static GrNode *same_length(GrBuilder *b, const char *lo, const char *hi, int n) {
    if (!n)
        return gr_empty(b);
    if (lo[0] == hi[0])
        return gr_seq(b, 2, gr_range(b, (uint8_t)lo[0], (uint8_t)lo[0]),
                      same_length(b, lo + 1, hi + 1, n - 1));
    int lo_zeros = 1, hi_nines = 1;
    for (int i = 1; i < n; i++) {
        lo_zeros &= lo[i] == '0';
        hi_nines &= hi[i] == '9';
    }
    if (lo_zeros && hi_nines)
        return gr_seq(b, 2, gr_range(b, (uint8_t)lo[0], (uint8_t)hi[0]), digits(b, n - 1, n - 1));
    char nines[24], zeros[24];
    memset(nines, '9', sizeof nines);
    memset(zeros, '0', sizeof zeros);
    GrNode *alts[3];
    int k = 0;
    alts[k++] = gr_seq(b, 2, gr_range(b, (uint8_t)lo[0], (uint8_t)lo[0]),
                       same_length(b, lo + 1, nines, n - 1));
    if (lo[0] + 1 <= hi[0] - 1)
        alts[k++] = gr_seq(b, 2, gr_range(b, (uint8_t)(lo[0] + 1), (uint8_t)(hi[0] - 1)),
                           digits(b, n - 1, n - 1));
    alts[k++] = gr_seq(b, 2, gr_range(b, (uint8_t)hi[0], (uint8_t)hi[0]),
                       same_length(b, zeros, hi + 1, n - 1));
    return gr_list(b, GN_ALT, alts, k);
}

/* Non-negative integers in [lo, hi] (hi < 0: up to 16 digits) without leading zeros. */
static GrNode *magnitudes(GrBuilder *b, int64_t lo, int64_t hi) {
    GrNode *alts[17];
    int k = 0;
    int64_t p = 1; /* 10^(d-1) */
    for (int d = 1; d <= 16; d++, p *= 10) {
        int64_t a = d == 1 ? 0 : p, z = 10 * p - 1;
        a = a > lo ? a : lo;
        z = hi >= 0 && hi < z ? hi : z;
        if (a <= z) {
            char sa[24], sz[24];
            snprintf(sa, sizeof sa, "%lld", (long long)a);
            snprintf(sz, sizeof sz, "%lld", (long long)z);
            alts[k++] = same_length(b, sa, sz, d);
        }
    }
    return k ? gr_list(b, GN_ALT, alts, k) : NULL;
}

GrNode *gr_json_int_range(GrBuilder *b, int has_lo, int64_t lo, int has_hi, int64_t hi) {
    const int64_t big = 9999999999999999ll; /* 16 digits */
    if ((has_lo && (lo > big || lo < -big)) || (has_hi && (hi > big || hi < -big)))
        return gr_fail(b, "integer bounds beyond 16 digits are not supported");
    if (has_lo && has_hi && lo > hi)
        return gr_fail(b, "minimum %lld is above maximum %lld", (long long)lo, (long long)hi);
    GrNode *alts[2];
    int k = 0;
    if (!has_lo || lo < 0) { /* "-" m for m in [max(1, -hi), -lo] */
        int64_t mlo = has_hi && hi < 0 ? -hi : 1;
        GrNode *m = magnitudes(b, mlo, has_lo ? -lo : -1);
        if (m)
            alts[k++] = gr_seq(b, 2, gr_str(b, "-"), m);
    }
    if (!has_hi || hi >= 0) {
        GrNode *m = magnitudes(b, has_lo && lo > 0 ? lo : 0, has_hi ? hi : -1);
        if (m)
            alts[k++] = m;
    }
    return gr_list(b, GN_ALT, alts, k);
}
