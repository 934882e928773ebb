/* gr_internal.h - the grammar library's private types: the rule tree every front end builds
 * (GrBuilder, GrNode), the byte-level pushdown automaton it compiles to (GrNfa), the lazily
 * determinized automaton with its per-vocabulary mask cache (GrDfa), and the vocabulary trie.
 *
 * Front ends (gbnf.c, regex.c, schema.c, grammar.c for choices) build rules of GrNodes over
 * bytes; nfa.c turns every rule into a Thompson automaton whose edges are byte ranges, epsilons
 * and calls of other rules; dfa.c determinizes it on demand, a state being a set of (stack,
 * automaton position) pairs; matcher.c walks the vocabulary trie through it. */
#ifndef PAGELLM_GR_INTERNAL_H
#define PAGELLM_GR_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "grammar.h"

/* ---- interned keys (arrays of uint32) -------------------------------------------------- */

typedef struct {
    uint32_t *pool; /* keys back to back */
    size_t npool, cap_pool;
    size_t *off; /* [n + 1]: key i is pool[off[i] .. off[i + 1]) */
    int n, cap;
    int *slots; /* open addressing, -1 empty; nslots a power of two */
    size_t nslots;
} GrIntern;

/* Index of the key (added when new); *added says which. */
int gr_intern(GrIntern *t, const uint32_t *key, size_t len, int *added);
void gr_intern_free(GrIntern *t);

/* ---- rule trees ---------------------------------------------------------------------- */

typedef enum { GN_BYTES, GN_RANGE, GN_SEQ, GN_ALT, GN_REP, GN_REF } GrNodeKind;

typedef struct GrNode GrNode;
struct GrNode {
    GrNodeKind kind;
    int n;          /* GN_SEQ / GN_ALT: children; GN_BYTES: bytes */
    GrNode **kids;  /* GN_SEQ, GN_ALT: [n]; GN_REP: [1] */
    uint8_t *bytes; /* GN_BYTES */
    uint8_t lo, hi; /* GN_RANGE: one byte in [lo, hi] */
    int min, max;   /* GN_REP: max -1 = unbounded */
    int rule;       /* GN_REF */
};

/* Rules under construction; every node lives in the builder's arena. */
typedef struct {
    void *arena;     /* chain of blocks */
    char **names;    /* [nrules] */
    GrNode **bodies; /* [nrules]; NULL while undefined */
    int *used_at;    /* [nrules]: source offset of the first reference, -1 if none */
    GrIntern index;  /* the names, interned in rule order: a name's id is its rule's */
    int nrules, cap;
    char err[512]; /* first error; "" while none */
} GrBuilder;

void gr_builder_init(GrBuilder *b);
void gr_builder_free(GrBuilder *b);
void *gr_alloc(GrBuilder *b, size_t n);
/* Record the first error (printf format); returns NULL for `return gr_fail(...)`. */
void *gr_fail(GrBuilder *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int gr_rule(GrBuilder *b, const char *name, size_t len); /* find or add; index */

GrNode *gr_bytes(GrBuilder *b, const void *s, size_t n);
GrNode *gr_str(GrBuilder *b, const char *s);
GrNode *gr_range(GrBuilder *b, uint8_t lo, uint8_t hi);
GrNode *gr_ref(GrBuilder *b, int rule);
GrNode *gr_rep(GrBuilder *b, GrNode *x, int min, int max);
GrNode *gr_list(GrBuilder *b, GrNodeKind kind, GrNode **kids, int n); /* SEQ or ALT */
GrNode *gr_seq(GrBuilder *b, int n, ...);
GrNode *gr_alt(GrBuilder *b, int n, ...);
GrNode *gr_empty(GrBuilder *b);

/* Code point ranges [lo, hi] pairs (n pairs, any order, overlaps allowed), optionally
 * complemented over all Unicode scalar values, as UTF-8 byte sequences; json_safe leaves out
 * what a JSON string must escape (", \ and U+0000..U+001F). NULL if empty. */
GrNode *gr_class(GrBuilder *b, const uint32_t *ranges, int n, int negate, int json_safe);
int gr_utf8_encode(uint32_t cp, uint8_t out[4]);
/* The code point UTF-8 encodes at p (before end) into *cp: bytes used, 0 if invalid. */
int gr_utf8_decode(const char *p, const char *end, uint32_t *cp);
int gr_hex(char c); /* a hex digit's value, -1 for another character */

/* A growing list of nodes, made into one SEQ or ALT node (an empty SEQ for none) and freed
 * by gr_nodes_finish; a NULL item (a failure) makes the result NULL. */
typedef struct {
    GrNode **v;
    int n, cap, failed;
} GrNodes;
void gr_nodes_push(GrNodes *l, GrNode *x);
GrNode *gr_nodes_finish(GrBuilder *b, GrNodes *l, GrNodeKind kind);

/* Front ends: the regex as one node (json_string: characters that a JSON string must escape
 * are left out of classes and `.`, and refused in literals). The JSON grammars add their
 * rules to b and return the root node. */
GrNode *gr_regex_node(GrBuilder *b, const char *pattern, size_t len, int json_string);
GrNode *gr_json_value_node(GrBuilder *b);  /* any JSON value */
GrNode *gr_json_object_node(GrBuilder *b); /* any JSON object */
GrNode *gr_schema_node(GrBuilder *b, json_t *schema);

/* Pieces of JSON (json.c), each a reference to a rule made on first use: bounded whitespace,
 * one character of a string's contents, a string, an integer, a number. */
GrNode *gr_json_ws(GrBuilder *b);
GrNode *gr_json_char(GrBuilder *b);
GrNode *gr_json_string(GrBuilder *b);
GrNode *gr_json_integer(GrBuilder *b);
GrNode *gr_json_number(GrBuilder *b);
/* Integers in [lo, hi], each bound optional (at most 16 digits). */
GrNode *gr_json_int_range(GrBuilder *b, int has_lo, int64_t lo, int has_hi, int64_t hi);

/* The compiled constraint of b's rules from rule `root` (b is freed either way); NULL with
 * the builder's error (or "invalid constraint") in err. */
GrCompiled *gr_finish(GrBuilder *b, int root, char *err, size_t errlen);

/* ---- the pushdown automaton ------------------------------------------------------------ */

typedef struct {
    uint8_t lo, hi;
    int to;
} GrEdge;

typedef struct {
    GrEdge *edges; /* byte edges */
    int *eps;      /* epsilon targets */
    int nedges, neps, cap_edges, cap_eps;
    int call, ret; /* call: rule index, -1 none; then continue at ret */
    int final_of;  /* rule whose final state this is, -1 */
} GrState;

typedef struct {
    GrState *st;
    int nst, cap;
    int *start, *final; /* [nrules] */
    int nrules, root;
    int escape; /* a position without edges: "left the frames a local state knows" */
} GrNfa;

/* Compile the builder's rules (root = rule index) into nfa; 0, or -1 with b->err set. */
int gr_nfa_build(GrBuilder *b, int root, GrNfa *nfa);
void gr_nfa_free(GrNfa *nfa);

/* ---- the lazily determinized automaton ------------------------------------------------- */

enum { GR_DEAD = 0, GR_UNKNOWN = -1, GR_ERROR = -2 };

/* Stack ids: 0 is the empty stack (the root rule's frame); GR_BOTTOM stands for "some stack
 * not known here". A local state (gr_dfa_local) has GR_BOTTOM in place of the stack all its
 * configurations sit on (the context it was called from), so the tokens it accepts without
 * returning below that hold in every context; a return below it becomes the configuration
 * (GR_BOTTOM, nfa.escape), and the state's `escapes` flag. */
enum { GR_BOTTOM = 1 };

typedef struct {
    uint64_t vocab_id;
    uint32_t **masks; /* [cap]: per DFA state, NULL until computed */
    int32_t **esc;    /* [cap]: for a local state, the trie nodes where it escapes */
    int *nesc;        /* [cap] */
    int cap;
    size_t bytes; /* held by masks and esc */
} GrMaskCache;

typedef struct {
    GrIntern stacks; /* key (parent stack, return state); stack 0 is the empty one */
    int *depth;      /* [stacks.n] */
    int cap_stacks;
    GrIntern states;  /* key: sorted (stack, position) pairs; state 0 is the dead one */
    int32_t **trans;  /* [states.n][256], GR_UNKNOWN until computed; NULL until needed */
    uint8_t *accepts; /* [states.n] */
    uint8_t *escapes; /* [states.n] holds (GR_BOTTOM, nfa.escape) */
    int cap;
    int initial;
    GrMaskCache *caches;
    int ncaches;
    char err[256];
} GrDfa;

struct GrCompiled {
    GrNfa nfa;
    GrDfa dfa;
    pthread_mutex_t mu; /* guards dfa */
};

/* Build the DFA's first states; 0 or -1 (message in err). Under c->mu from here on: */
int gr_dfa_init(GrCompiled *c, char *err, size_t errlen);
void gr_dfa_free(GrDfa *d);
/* The state after byte `byte` from `s` (GR_DEAD, or GR_ERROR past the state limit). */
int gr_dfa_step(GrCompiled *c, int s, uint8_t byte);
/* Whether any byte leads out of s. */
int gr_dfa_has_exit(GrCompiled *c, int s);
/* s with GR_BOTTOM for the deepest stack all its configurations sit on (s itself when that
 * is the empty stack); GR_ERROR past the state limit. */
int gr_dfa_local(GrCompiled *c, int s);

/* ---- the vocabulary trie --------------------------------------------------------------- */

/* One trie node, in depth-first preorder (the root left out): 16 bytes, read in order. */
typedef struct {
    int32_t skip;   /* index just past the node's subtree */
    int32_t parent; /* -1 for the root's children */
    int32_t token;  /* a token ending here, -1 none */
    uint16_t depth; /* 1 for the root's children */
    uint8_t byte;   /* the edge's byte into the node */
} GrTrieNode;

struct GrVocab {
    int n;       /* tokens */
    uint64_t id; /* unique per vocabulary made, keys mask caches */
    int nnodes;
    GrTrieNode *node; /* [nnodes] */
    int32_t *same;    /* [n] the next token with the same bytes, -1 */
    uint8_t **bytes;  /* [n] token bytes (NULL: never allowed) */
    uint32_t *lens;   /* [n] */
    uint8_t *is_eos;  /* [n] */
    int *eos;
    int neos;
    int max_depth;
};

#endif
