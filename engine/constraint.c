/* constraint.c - constrained decoding (structured output): the model's vocabulary as the
 * grammar library matches it (each token's exact bytes inside a text, built once, on the first
 * constrained request), a matcher per constrained sample, the allowed-token masks of a step's
 * rows before they are sampled, and each matcher's advance on the token drawn. */
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
    e->smp.mask = pl_xmalloc(gr_vocab_mask_words(e->gr_vocab) * sizeof(uint32_t));
done:
    pthread_mutex_unlock(&e->gr_mu);
    return st;
}

void eng_constraint_start(Engine *e, SeqData *d) {
    GrCompiled *c = d->req->params.constraint;
    d->matcher = c ? gr_matcher_new(c, e->gr_vocab) : NULL;
}

int eng_constraint_masks(Engine *e, const SeqData *const *rows, int n, uint32_t *masks,
                         int32_t *mask_rows) {
    int k = 0;
    if (!e->gr_vocab)
        return 0;
    size_t words = gr_vocab_mask_words(e->gr_vocab);
    for (int i = 0; i < n; i++) {
        /* a sample that ended on the overlapped step before: its row is dropped, unmasked */
        if (!rows[i]->matcher || rows[i]->finish != FINISH_NONE)
            continue;
        uint32_t *mask = masks + (size_t)k * words;
        /* past the automaton's limits nothing is allowed: the draw fails and the sample ends */
        if (gr_matcher_fill_mask(rows[i]->matcher, mask) != 0)
            memset(mask, 0, words * sizeof *mask);
        mask_rows[k++] = i;
    }
    return k;
}

int eng_constraint_accept(SeqData *d, int32_t token) {
    if (!d->matcher)
        return 0;
    if (gr_matcher_accept(d->matcher, token) != 0)
        return -1;
    return gr_matcher_is_finished(d->matcher);
}
