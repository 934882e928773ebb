/* grammar.c - the compile entry points: each front end fills a GrBuilder with rules, and
 * gr_finish turns them into the automaton of a GrCompiled. Choices are built here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "gr_internal.h"

GrCompiled *gr_finish(GrBuilder *b, int root, char *err, size_t errlen) {
    GrCompiled *c = NULL;
    if (!b->err[0] && root >= 0) {
        c = pl_xcalloc(1, sizeof *c);
        if (gr_nfa_build(b, root, &c->nfa) || gr_dfa_init(c, b->err, sizeof b->err)) {
            gr_nfa_free(&c->nfa);
            gr_dfa_free(&c->dfa);
            free(c);
            c = NULL;
        } else {
            pthread_mutex_init(&c->mu, NULL);
        }
    }
    if (!c)
        snprintf(err, errlen, "%s", b->err[0] ? b->err : "invalid constraint");
    gr_builder_free(b);
    return c;
}

/* A builder whose rule "root" is body (NULL: an error already recorded). */
static GrCompiled *finish_root(GrBuilder *b, GrNode *body, char *err, size_t errlen) {
    int root = gr_rule(b, "root", 4);
    b->bodies[root] = body;
    if (!body && !b->err[0])
        gr_fail(b, "invalid constraint");
    return gr_finish(b, root, err, errlen);
}

GrCompiled *gr_compile_json_schema(json_t *schema, char *err, size_t errlen) {
    GrBuilder b;
    gr_builder_init(&b);
    GrNode *x = gr_schema_node(&b, schema);
    return finish_root(&b, x, err, errlen);
}

GrCompiled *gr_compile_json_object(char *err, size_t errlen) {
    GrBuilder b;
    gr_builder_init(&b);
    GrNode *x = gr_json_object_node(&b);
    return finish_root(&b, x, err, errlen);
}

GrCompiled *gr_compile_regex(const char *pattern, size_t len, char *err, size_t errlen) {
    GrBuilder b;
    gr_builder_init(&b);
    GrNode *x = gr_regex_node(&b, pattern, len, 0);
    return finish_root(&b, x, err, errlen);
}

GrCompiled *gr_compile_choice(const char *const *choices, const size_t *lens, int n, char *err,
                              size_t errlen) {
    GrBuilder b;
    gr_builder_init(&b);
    if (n < 1) {
        gr_fail(&b, "a choice needs at least one string");
        return finish_root(&b, NULL, err, errlen);
    }
    GrNode **alts = gr_alloc(&b, n * sizeof *alts);
    for (int i = 0; i < n; i++)
        alts[i] = gr_bytes(&b, choices[i], lens[i]);
    return finish_root(&b, gr_list(&b, GN_ALT, alts, n), err, errlen);
}

void gr_compiled_free(GrCompiled *c) {
    if (!c)
        return;
    gr_nfa_free(&c->nfa);
    gr_dfa_free(&c->dfa);
    pthread_mutex_destroy(&c->mu);
    free(c);
}
