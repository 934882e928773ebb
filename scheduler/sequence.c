/* sequence.c - a sequence's token storage: the prompt followed by generated tokens. */
#include <stdlib.h>
#include <string.h>

#include "scheduler.h"

Sequence *seq_create(int64_t id, const int32_t *prompt, int n, int max_new) {
    Sequence *s = pl_xcalloc(1, sizeof *s);
    s->id = id;
    s->capacity = n + (max_new > 0 ? max_new : 16);
    s->tokens = pl_xmalloc((size_t)s->capacity * sizeof(int32_t));
    memcpy(s->tokens, prompt, (size_t)n * sizeof(int32_t));
    s->num_tokens = n;
    s->num_prompt = n;
    s->max_new = max_new > 0 ? max_new : 0;
    s->state = SEQ_WAITING;
    return s;
}

void seq_append(Sequence *s, int32_t token) {
    if (s->num_tokens == s->capacity) {
        s->capacity *= 2;
        s->tokens = pl_xrealloc(s->tokens, (size_t)s->capacity * sizeof(int32_t));
    }
    s->tokens[s->num_tokens++] = token;
}

void seq_destroy(Sequence *s) {
    if (!s)
        return;
    free(s->tokens);
    free(s);
}
