/* logit_edits.c - what a request changes in its logits before each sample, as vLLM's logits
 * processors do: its logit_bias, -inf on the last token of each bad word whose other tokens
 * end the output so far, and -inf on the tokens that would end it (stop_token_ids, and EOS
 * unless ignore_eos) while it has fewer than min_tokens new tokens. The host and the backend
 * sampling paths apply the same list, after the raw logprobs are taken. */
#include <math.h>
#include <string.h>

#include "engine_internal.h"

/* The edits of one sample's next token, for logits row `row`, into out (NULL: count only);
 * returns how many. */
static int row_edits(const Engine *e, const SeqData *d, int row, LogitEdit *out) {
    const Request *r = d->req;
    int vocab = model_config(e->model)->vocab_size, n = 0;
    for (int i = 0; i < r->params.num_logit_bias; i++, n++)
        if (out)
            out[n] = (LogitEdit){row, r->bias[i].token, r->bias[i].bias};
    const Sequence *seq = r->seqs[d->index];
    const int32_t *output = seq->tokens + seq->num_prompt;
    const int generated = seq->num_tokens - seq->num_prompt;
    for (int i = 0, at = 0; i < r->params.num_bad_words; at += r->bad_word_lens[i++]) {
        const int before = r->bad_word_lens[i] - 1; /* tokens that must end the output */
        if (before > generated ||
            memcmp(output + generated - before, r->bad_words + at, before * sizeof(int32_t)))
            continue;
        if (out)
            out[n] = (LogitEdit){row, r->bad_words[at + before], -INFINITY};
        n++;
    }
    if (d->num_generated >= r->params.min_tokens)
        return n;
    int32_t t;
    for (int i = 0; (t = eng_stop_token(e, r, i)) >= 0; i++) {
        if (t >= vocab)
            continue;
        if (out)
            out[n] = (LogitEdit){row, t, -INFINITY};
        n++;
    }
    return n;
}

int eng_count_edits(const Engine *e, const SeqData *const *rows, int n) {
    int total = 0;
    for (int i = 0; i < n; i++)
        total += row_edits(e, rows[i], i, NULL);
    return total;
}

int eng_collect_edits(Engine *e, const SeqData *const *rows, int n) {
    size_t total = (size_t)eng_count_edits(e, rows, n);
    if (total == 0)
        return 0;
    if (total > e->smp.edits_cap) {
        e->smp.edits_cap = total * 2;
        e->smp.edits = pl_xrealloc(e->smp.edits, e->smp.edits_cap * sizeof *e->smp.edits);
    }
    int at = 0;
    for (int i = 0; i < n; i++)
        at += row_edits(e, rows[i], i, e->smp.edits + at);
    return at;
}
