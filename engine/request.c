/* request.c - a request's samples as the engine keeps them: starting a sample (its
 * sequence data and detokenizer), the tokens that end it, and freeing a finished request. */
#include <stdlib.h>

#include "engine_internal.h"

void eng_start_sequence(Engine *e, Request *r, int index, Sequence *seq) {
    SeqData *d = &r->data[index];
    d->req = r;
    d->index = index;
    d->sampling = r->params.sampling;
    d->sampling.seed += (uint64_t)index;
    d->stream =
        e->tok ? tok_stream_create(e->tok, r->prompt, r->num_prompt, !r->params.keep_special_tokens)
               : NULL;
    d->pending_row = -1;
    eng_constraint_start(e, d);
    seq->owner = d;
    r->seqs[index] = seq;
    r->num_started++;
}

void eng_request_free(Engine *e, Request *r) {
    for (int i = 0; i < r->num_started; i++) {
        if (r->seqs[i]->state != SEQ_FINISHED)
            sched_remove(e->sched, r->seqs[i]);
        seq_destroy(r->seqs[i]);
        tok_stream_destroy(r->data[i].stream);
        gr_matcher_free(r->data[i].matcher);
    }
    free(r->seqs);
    free(r->data);
    free(r->prompt);
    free(r->stop_ids);
    free(r->bias);
    free(r->allowed_mask);
    free(r->bad_words);
    free(r->bad_word_lens);
    free(r->constraint_after);
    free(r);
}

int32_t eng_stop_token(const Engine *e, const Request *r, int i) {
    if (i < r->params.num_stop_token_ids)
        return r->stop_ids[i];
    if (r->params.ignore_eos)
        return -1;
    i -= r->params.num_stop_token_ids;
    const ModelConfig *mc = model_config(e->model);
    if (i < mc->num_eos)
        return mc->eos_token_ids[i];
    return i == mc->num_eos && e->tok ? tok_eos_id(e->tok) : -1;
}
