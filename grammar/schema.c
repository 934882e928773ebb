/* schema.c - a JSON schema to rules, as xgrammar and llama.cpp's json-schema-to-grammar do:
 * object properties in the schema's order (optional ones may be skipped), arrays with
 * prefixItems / items and counts, strings with lengths, enum, const, pattern and a few
 * formats, integer ranges, anyOf / oneOf, $ref into $defs (recursion through rules). An
 * object's additionalProperties left out means none when properties are given (xgrammar's
 * strict default: a model should not invent keys). Every keyword this cannot honour is
 * collected and named in one error. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "gr_internal.h"

typedef struct {
    GrBuilder *b;
    json_t *root;
    char unsupported[400]; /* ", "-separated keyword names */
    int nrules;            /* counter for the names of helper rules */
    int ns;                /* this schema's prefix in rule names (several schemas may share
                            * one builder: gr_compile_gbnf_schemas) */
    int depth;             /* schemas being converted, one inside the other */
} Ctx;

/* Add a keyword to the list, once (an empty key is named ""). */
static void unsupported(Ctx *x, const char *what) {
    char *u = x->unsupported;
    size_t n = strlen(what = *what ? what : "\"\"");
    for (const char *p = u; *p;) { /* the names so far, ", "-separated */
        size_t k = strcspn(p, ",");
        if (k == n && !memcmp(p, what, n))
            return;
        p += k + (p[k] == ','); /* a name may hold ", " itself: then it is named twice */
        p += *p == ' ';
    }
    size_t len = strlen(u);
    snprintf(u + len, sizeof x->unsupported - len, "%s%s", len ? ", " : "", what);
}

static const char *const KNOWN[] = {"type",
                                    "properties",
                                    "required",
                                    "additionalProperties",
                                    "items",
                                    "prefixItems",
                                    "minItems",
                                    "maxItems",
                                    "enum",
                                    "const",
                                    "minLength",
                                    "maxLength",
                                    "pattern",
                                    "format",
                                    "anyOf",
                                    "oneOf",
                                    "allOf",
                                    "$ref",
                                    "$defs",
                                    "definitions",
                                    "minimum",
                                    "maximum",
                                    "exclusiveMinimum",
                                    "exclusiveMaximum",
                                    "title",
                                    "description",
                                    "default",
                                    "examples",
                                    "$schema",
                                    "$id",
                                    "$comment",
                                    "deprecated",
                                    "readOnly",
                                    "writeOnly",
                                    NULL};

static GrNode *conv(Ctx *x, json_t *s);

/* A new helper rule with this body; a reference to it. */
static GrNode *helper(Ctx *x, GrNode *body) {
    char name[32];
    snprintf(name, sizeof name, "%d s%d", x->ns, x->nrules++);
    int r = gr_rule(x->b, name, strlen(name));
    x->b->bodies[r] = body;
    return body ? gr_ref(x->b, r) : NULL;
}

static GrNode *literal_json(Ctx *x, json_t *v) {
    char *text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    GrNode *n = gr_str(x->b, text);
    free(text);
    return n;
}

static GrNode *ref(Ctx *x, const char *path) {
    char name[300];
    snprintf(name, sizeof name, "%d ref %.280s", x->ns, path);
    int before = x->b->nrules, r = gr_rule(x->b, name, strlen(name));
    if (r < before)
        return gr_ref(x->b, r); /* made already, or being made (recursion) */
    json_t *target = NULL;
    if (!strcmp(path, "#"))
        target = x->root;
    else if (!strncmp(path, "#/$defs/", 8))
        target = json_object_get(json_object_get(x->root, "$defs"), path + 8);
    else if (!strncmp(path, "#/definitions/", 14))
        target = json_object_get(json_object_get(x->root, "definitions"), path + 14);
    if (!target)
        return gr_fail(x->b, "$ref '%s' does not name a schema in $defs or definitions", path);
    GrNode *body = conv(x, target);
    x->b->bodies[r] = body;
    return body ? gr_ref(x->b, r) : NULL;
}

static int get_count(Ctx *x, json_t *s, const char *key, int dflt) {
    json_t *v = json_object_get(s, key);
    if (!v)
        return dflt;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 100000) {
        gr_fail(x->b, "%s must be an integer from 0 to 100000", key);
        return dflt;
    }
    return (int)json_integer_value(v);
}

static GrNode *string_node(Ctx *x, json_t *s) {
    GrBuilder *b = x->b;
    json_t *pattern = json_object_get(s, "pattern"), *format = json_object_get(s, "format");
    int min = get_count(x, s, "minLength", 0), max = get_count(x, s, "maxLength", -1);
    const char *re = NULL;
    if (format) {
        static const char *const formats[][2] = {
            {"date", "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"},
            {"time", "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?"
                     "(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"},
            {"date-time", "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T"
                          "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?"
                          "(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"},
            {"uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
                     "[0-9a-fA-F]{12}"}};
        const char *f = json_string_value(format);
        for (size_t i = 0; f && i < sizeof formats / sizeof *formats; i++)
            if (!strcmp(f, formats[i][0]))
                re = formats[i][1];
        if (!re) {
            char what[80];
            snprintf(what, sizeof what, "format=%.60s", f ? f : "?");
            unsupported(x, what);
            return gr_empty(b);
        }
    }
    if (pattern) {
        if (!json_is_string(pattern))
            return gr_fail(b, "pattern must be a string");
        if (re)
            unsupported(x, "pattern with format");
        re = json_string_value(pattern);
    }
    GrNode *body;
    if (re) {
        if (min || max >= 0)
            unsupported(x, pattern ? "minLength/maxLength with pattern"
                                   : "minLength/maxLength with format");
        body = gr_regex_node(b, re, strlen(re), 1);
    } else {
        if (max >= 0 && max < min)
            return gr_fail(b, "maxLength %d is below minLength %d", max, min);
        if (!min && max < 0)
            return gr_json_string(b);
        body = gr_rep(b, gr_json_char(b), min, max);
    }
    return gr_seq(b, 3, gr_str(b, "\""), body, gr_str(b, "\""));
}

/* An integer bound: *v from a number (rounded inwards); 0 when absent. */
static int bound(Ctx *x, json_t *s, const char *key, int up, int64_t *v) {
    json_t *j = json_object_get(s, key);
    if (!j)
        return 0;
    if (!json_is_number(j)) {
        unsupported(x, key); /* draft 4's boolean exclusiveMinimum */
        return 0;
    }
    double d = json_number_value(j);
    if (fabs(d) > 1e16) {
        gr_fail(x->b, "%s %g is beyond 16 digits", key, d);
        return 0;
    }
    *v = (int64_t)(up ? ceil(d) : floor(d));
    return 1;
}

static GrNode *integer_node(Ctx *x, json_t *s) {
    int64_t lo = 0, hi = 0, e;
    int has_lo = bound(x, s, "minimum", 1, &lo), has_hi = bound(x, s, "maximum", 0, &hi);
    if (bound(x, s, "exclusiveMinimum", 0, &e) && (!has_lo || e + 1 > lo))
        lo = e + 1, has_lo = 1;
    if (bound(x, s, "exclusiveMaximum", 1, &e) && (!has_hi || e - 1 < hi))
        hi = e - 1, has_hi = 1;
    return has_lo || has_hi ? gr_json_int_range(x->b, has_lo, lo, has_hi, hi)
                            : gr_json_integer(x->b);
}

/* Members from property i on; comma: whether one was written before. A rule per (i, comma),
 * made on first use (tails[2 * i + comma]). */
typedef struct {
    int n;
    GrNode **member; /* [n] "\"key\"" ws ":" ws value ws */
    int *req;        /* [n] */
    GrNode *extra;   /* additional member, or NULL */
    GrNode **tails;  /* [2 * (n + 1)], see tails() */
} Props;

/* The member lists as rules, tails[2 * i + comma]: the members from property i on, comma
 * saying whether one was written before. Made from the last property back (a loop: objects
 * may have many properties), and only those the first one leads to. */
static GrNode *tails(Ctx *x, Props *p) {
    GrBuilder *b = x->b;
    uint8_t *need = gr_alloc(b, 2 * (p->n + 1));
    need[0] = 1;
    for (int i = 0; i < p->n; i++)
        for (int c = 0; c < 2; c++)
            if (need[2 * i + c]) {
                need[2 * (i + 1) + 1] = 1;
                need[2 * (i + 1) + c] |= !p->req[i];
            }
    for (int i = p->n; i >= 0; i--)
        for (int c = 0; c < 2; c++) {
            if (!need[2 * i + c])
                continue;
            GrNode *sep = c ? gr_seq(b, 2, gr_str(b, ","), gr_json_ws(b)) : gr_empty(b), *body;
            if (i == p->n && !p->extra) {
                p->tails[2 * i + c] = gr_empty(b);
                continue;
            }
            if (i == p->n) {
                GrNode *more =
                    gr_rep(b, gr_seq(b, 3, gr_str(b, ","), gr_json_ws(b), p->extra), 0, -1);
                body = gr_rep(b, gr_seq(b, 3, sep, p->extra, more), 0, 1);
            } else {
                GrNode *take = gr_seq(b, 3, sep, p->member[i], p->tails[2 * (i + 1) + 1]);
                body = p->req[i] ? take : gr_alt(b, 2, take, p->tails[2 * (i + 1) + c]);
            }
            p->tails[2 * i + c] = helper(x, body);
        }
    return p->tails[0];
}

static GrNode *object_node(Ctx *x, json_t *s) {
    GrBuilder *b = x->b;
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *addl = json_object_get(s, "additionalProperties");
    if ((props && !json_is_object(props)) || (req && !json_is_array(req)))
        return gr_fail(b, "properties must be an object and required an array");
    if (!props && (!addl || json_is_true(addl)) && !json_array_size(req))
        return gr_json_object_node(b);
    Props p = {.n = (int)json_object_size(props)};
    p.member = gr_alloc(b, (p.n + 1) * sizeof *p.member);
    p.req = gr_alloc(b, (p.n + 1) * sizeof *p.req);
    p.tails = gr_alloc(b, 2 * (p.n + 1) * sizeof *p.tails);
    const char *key;
    json_t *value, *index = json_object(); /* property name -> its position */
    int i = 0;
    json_object_foreach(props, key, value) {
        json_t *name = json_string(key);
        GrNode *k = literal_json(x, name);
        json_decref(name);
        p.member[i] = helper(x, gr_seq(b, 5, k, gr_json_ws(b), gr_str(b, ":"),
                                       gr_seq(b, 2, gr_json_ws(b), conv(x, value)), gr_json_ws(b)));
        json_object_set_new(index, key, json_integer(i++));
    }
    size_t j;
    json_t *r;
    json_array_foreach(req, j, r) {
        json_t *at = json_is_string(r) ? json_object_get(index, json_string_value(r)) : NULL;
        if (!at) {
            gr_fail(b, "required property %s is not in properties",
                    json_is_string(r) ? json_string_value(r) : "(not a string)");
            break;
        }
        p.req[json_integer_value(at)] = 1;
    }
    json_decref(index);
    if (b->err[0])
        return NULL;
    if (addl && !json_is_false(addl)) {
        GrNode *v = json_is_true(addl) ? gr_json_value_node(b) : conv(x, addl);
        p.extra = helper(x, gr_seq(b, 5, gr_json_string(b), gr_json_ws(b), gr_str(b, ":"),
                                   gr_seq(b, 2, gr_json_ws(b), v), gr_json_ws(b)));
    }
    return gr_seq(b, 4, gr_str(b, "{"), gr_json_ws(b), tails(x, &p), gr_str(b, "}"));
}

static GrNode *array_node(Ctx *x, json_t *s) {
    GrBuilder *b = x->b;
    json_t *prefix = json_object_get(s, "prefixItems"), *items = json_object_get(s, "items");
    if (json_is_array(items)) /* draft 4 tuples */
        prefix = items, items = json_object_get(s, "additionalItems");
    int m = (int)json_array_size(prefix);
    int min = get_count(x, s, "minItems", 0), max = get_count(x, s, "maxItems", -1);
    int more_ok = !(json_is_false(items) || (prefix && !items));
    int emin = min > m ? min - m : 0, emax = !more_ok ? 0 : max < 0 ? -1 : max - m;
    if ((emax >= 0 && emax < emin) || (max >= 0 && max < m))
        return gr_fail(b,
                       "the array's item counts cannot be met (minItems %d, maxItems %d, "
                       "%d prefixItems)",
                       min, max, m);
    GrNode *sep = gr_seq(b, 2, gr_str(b, ","), gr_json_ws(b));
    GrNode **seq = gr_alloc(b, (m + 4) * sizeof *seq);
    int k = 0;
    seq[k++] = gr_str(b, "[");
    seq[k++] = gr_json_ws(b);
    for (int i = 0; i < m; i++) {
        GrNode *v = gr_seq(b, 2, conv(x, json_array_get(prefix, i)), gr_json_ws(b));
        seq[k - 1] = gr_seq(b, 2, seq[k - 1], i ? gr_seq(b, 2, sep, v) : v);
    }
    if (emax != 0) {
        GrNode *item = helper(
            x, gr_seq(b, 2, items && !json_is_true(items) ? conv(x, items) : gr_json_value_node(b),
                      gr_json_ws(b)));
        GrNode *next = gr_seq(b, 2, sep, item);
        if (m)
            seq[k++] = gr_rep(b, next, emin, emax);
        else if (emin)
            seq[k++] = gr_seq(b, 2, item, gr_rep(b, next, emin - 1, emax < 0 ? -1 : emax - 1));
        else
            seq[k++] =
                gr_rep(b, gr_seq(b, 2, item, gr_rep(b, next, 0, emax < 0 ? -1 : emax - 1)), 0, 1);
    }
    seq[k++] = gr_str(b, "]");
    return gr_list(b, GN_SEQ, seq, k);
}

static GrNode *typed(Ctx *x, json_t *s, const char *type) {
    GrBuilder *b = x->b;
    if (!strcmp(type, "object"))
        return object_node(x, s);
    if (!strcmp(type, "array"))
        return array_node(x, s);
    if (!strcmp(type, "string"))
        return string_node(x, s);
    if (!strcmp(type, "integer"))
        return integer_node(x, s);
    if (!strcmp(type, "number")) {
        static const char *const bounds[] = {"minimum", "maximum", "exclusiveMinimum",
                                             "exclusiveMaximum"};
        for (int i = 0; i < 4; i++)
            if (json_object_get(s, bounds[i]))
                unsupported(x, bounds[i]);
        return gr_json_number(b);
    }
    if (!strcmp(type, "boolean"))
        return gr_alt(b, 2, gr_str(b, "true"), gr_str(b, "false"));
    if (!strcmp(type, "null"))
        return gr_str(b, "null");
    return gr_fail(b, "unknown type '%s'", type);
}

/* The schema's alternatives (anyOf, oneOf, enum, type arrays) as one node. */
static GrNode *alternatives(Ctx *x, json_t *arr, json_t *s, int kind) {
    int n = (int)json_array_size(arr);
    if (!n)
        return gr_fail(x->b, "an empty anyOf, oneOf, enum or type list matches nothing");
    GrNode **alts = gr_alloc(x->b, n * sizeof *alts);
    for (int i = 0; i < n; i++) {
        json_t *v = json_array_get(arr, i);
        alts[i] = kind == 'e'   ? literal_json(x, v)
                  : kind == 't' ? (json_is_string(v) ? typed(x, s, json_string_value(v))
                                                     : gr_fail(x->b, "type must be a string"))
                                : conv(x, v);
        if (!alts[i])
            return NULL;
    }
    return gr_list(x->b, GN_ALT, alts, n);
}

static GrNode *conv_schema(Ctx *x, json_t *s);

/* The converter recurses on each subschema: bounded, as the parsers are. */
static GrNode *conv(Ctx *x, json_t *s) {
    if (x->depth >= 100)
        return gr_fail(x->b, "the schema nests deeper than 100 levels");
    x->depth++;
    GrNode *n = conv_schema(x, s);
    x->depth--;
    return n;
}

static GrNode *conv_schema(Ctx *x, json_t *s) {
    GrBuilder *b = x->b;
    if (json_is_true(s))
        return gr_json_value_node(b);
    if (!json_is_object(s))
        return gr_fail(b, "a schema must be an object or true");
    const char *key;
    json_t *v;
    json_object_foreach(s, key, v) {
        int known = 0;
        for (int i = 0; KNOWN[i] && !known; i++)
            known = !strcmp(key, KNOWN[i]);
        if (!known)
            unsupported(x, key);
    }
    json_t *t = json_object_get(s, "type");
    if ((v = json_object_get(s, "$ref")))
        return json_is_string(v) ? ref(x, json_string_value(v))
                                 : gr_fail(b, "$ref must be a string");
    if ((v = json_object_get(s, "const")))
        return literal_json(x, v);
    if ((v = json_object_get(s, "enum")))
        return json_is_array(v) ? alternatives(x, v, s, 'e') : gr_fail(b, "enum must be an array");
    if ((v = json_object_get(s, "anyOf")) || (v = json_object_get(s, "oneOf")))
        return json_is_array(v) ? alternatives(x, v, s, 'a')
                                : gr_fail(b, "anyOf and oneOf must be arrays");
    if ((v = json_object_get(s, "allOf"))) {
        if (json_array_size(v) == 1)
            return conv(x, json_array_get(v, 0));
        unsupported(x, "allOf");
        return gr_empty(b);
    }
    if (json_is_array(t))
        return alternatives(x, t, s, 't');
    if (json_is_string(t))
        return typed(x, s, json_string_value(t));
    if (t)
        return gr_fail(b, "type must be a string or an array of strings");
    static const char *const hints[][2] = {
        {"properties", "object"}, {"additionalProperties", "object"},
        {"required", "object"},   {"items", "array"},
        {"prefixItems", "array"}, {"minItems", "array"},
        {"maxItems", "array"},    {"minLength", "string"},
        {"maxLength", "string"},  {"pattern", "string"},
        {"format", "string"},     {"minimum", "integer"},
        {"maximum", "integer"}};
    for (size_t i = 0; i < sizeof hints / sizeof *hints; i++)
        if (json_object_get(s, hints[i][0]))
            return typed(x, s, hints[i][1]);
    return gr_json_value_node(b);
}

GrNode *gr_schema_node(GrBuilder *b, json_t *schema) {
    Ctx x = {b, schema, "", 0, b->nrules, 0};
    if (!schema)
        return gr_fail(b, "no schema");
    GrNode *n = conv(&x, schema);
    if (x.unsupported[0]) {
        b->err[0] = 0; /* the keywords explain any other failure */
        return gr_fail(b, "unsupported JSON schema keyword(s): %s", x.unsupported);
    }
    return n;
}
