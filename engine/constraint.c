/* constraint.c - constrained decoding (structured output): the model's vocabulary as the
 * grammar library matches it (each token's exact bytes inside a text, built once, on the first
 * constrained request), a matcher per constrained sample, the allowed-token masks of a step's
 * rows before they are sampled, and each matcher's advance on the token drawn. A request may
 * start its constraint after a text (constraint_after: a reasoning section's end, as vLLM's
 * reasoning-aware structured output does): until that text has appeared its rows are not
 * masked and the tokens drawn only advance the search for it. */
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"

Status eng_constraint_vocab(Engine *e) {
    pthread_mutex_lock(&e->gr_mu);
    Status st = PL_OK;
    if (e->gr_vocab)
        goto done;
    if (!e->tok) {
        st = pl_error_set(PL_ERR_UNSUPPORTED,
                          "structured output needs the model's tokenizer (tokenizer.json)");
        goto done;
    }
    int n = model_config(e->model)->vocab_size, tokens = tok_vocab_size(e->tok), n_eos = 0;
    char **bytes = pl_xcalloc((size_t)n, sizeof *bytes);
    size_t *lens = pl_xcalloc((size_t)n, sizeof *lens);
    for (int i = 0; i < n && i < tokens; i++) /* past the tokenizer: padding, never allowed */
        bytes[i] = tok_token_bytes(e->tok, i, &lens[i]);
    int eos[64];
    const ModelConfig *mc = model_config(e->model);
    for (int i = 0; i < mc->num_eos && n_eos < 64; i++)
        eos[n_eos++] = mc->eos_token_ids[i];
    if (tok_eos_id(e->tok) >= 0 && n_eos < 64)
        eos[n_eos++] = tok_eos_id(e->tok);
    char err[256];
    e->gr_vocab = gr_vocab_new((const char *const *)bytes, lens, n, eos, n_eos, err, sizeof err);
    for (int i = 0; i < n; i++)
        free(bytes[i]);
    free(bytes);
    free(lens);
    if (!e->gr_vocab) {
        st = pl_error_set(PL_ERR_INVALID, "structured output: the vocabulary: %s", err);
        goto done;
    }
done:
    pthread_mutex_unlock(&e->gr_mu);
    return st;
}

void eng_constraint_start(Engine *e, SeqData *d) {
    GrCompiled *c = d->req->params.constraint;
    const char *after = d->req->constraint_after;
    d->matcher = c ? gr_matcher_new(c, e->gr_vocab) : NULL;
    d->after_matched = !d->matcher || !after ? -1 : d->req->opener_token >= 0 ? AFTER_UNOPENED : 0;
}

size_t eng_mask_words(const Engine *e) {
    return ((size_t)model_config(e->model)->vocab_size + 31) / 32;
}

int eng_constraint_masks(Engine *e, const SeqData *const *rows, int n, uint32_t *masks,
                         int32_t *mask_rows) {
    int k = 0;
    size_t words = eng_mask_words(e);
    for (int i = 0; i < n; i++) {
        const SeqData *d = rows[i];
        const uint32_t *allowed = d->req->allowed_mask;
        /* a constraint masks from constraint_after on; a sample that ended on the overlapped
         * step before (its row is dropped) gets no mask */
        const int constrained = d->matcher && d->after_matched < 0;
        if (d->finish != FINISH_NONE || (!constrained && !allowed))
            continue;
        uint32_t *mask = masks + (size_t)k * words;
        if (!constrained) {
            memcpy(mask, allowed, words * sizeof *mask);
        } else {
            /* past the automaton's limits nothing is allowed: the draw fails, the sample ends */
            if (gr_matcher_fill_mask(d->matcher, mask) != 0)
                memset(mask, 0, words * sizeof *mask);
            if (d->after_matched == AFTER_UNOPENED) { /* or the first token opens the section */
                int32_t t = d->req->opener_token;
                mask[t / 32] |= 1u << (t % 32);
            }
            for (size_t w = 0; allowed && w < words; w++)
                mask[w] &= allowed[w];
        }
        mask_rows[k++] = i;
    }
    return k;
}

/* The longest prefix of `text` that ends the output after byte b, when the longest one before
 * it was k bytes long (text[0..k) ended the output): the search is Knuth-Morris-Pratt's, its
 * fallbacks found by comparison (the texts are a few bytes). */
static int text_search_step(const char *text, int k, char b) {
    for (;;) {
        if (text[k] == b)
            return k + 1;
        if (k == 0)
            return 0;
        int j = k - 1; /* the longest proper prefix of text[0..k) that is also its suffix */
        while (j > 0 && memcmp(text, text + k - j, (size_t)j))
            j--;
        k = j;
    }
}

/* Before the constraint: look for constraint_after in the token's bytes. Once it is complete the
 * matcher starts; bytes of the same token after it are offered to the matcher (a tokenizer may
 * merge "</think>" with the whitespace after it), which keeps its start if they do not fit. */
static void search_constraint_start(Engine *e, SeqData *d, int32_t token) {
    const char *after = d->req->constraint_after;
    int len = (int)strlen(after);
    if (token == d->req->after_token) {
        d->after_matched = -1;
        return;
    }
    size_t n;
    const char *bytes = gr_vocab_token(e->gr_vocab, token, &n);
    if (!bytes) { /* a special token breaks the text */
        d->after_matched = 0;
        return;
    }
    for (size_t i = 0; i < n; i++) {
        d->after_matched = text_search_step(after, d->after_matched, bytes[i]);
        if (d->after_matched == len) {
            d->after_matched = -1;
            if (i + 1 < n)
                (void)gr_matcher_accept_bytes(d->matcher, bytes + i + 1, n - i - 1);
            return;
        }
    }
}

int eng_constraint_accept(Engine *e, SeqData *d, int32_t token) {
    if (!d->matcher)
        return 0;
    if (d->after_matched == AFTER_UNOPENED) /* the first token: the section opens, or never */
        d->after_matched = token == d->req->opener_token ? 0 : -1;
    if (d->after_matched >= 0) {
        search_constraint_start(e, d, token);
        return 0;
    }
    if (gr_matcher_accept(d->matcher, token) != 0)
        return -1;
    return gr_matcher_is_finished(d->matcher);
}
