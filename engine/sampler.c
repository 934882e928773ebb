/* sampler.c - the sampler (Sampler): a step's sampled rows to tokens, with logprobs from the
 * raw logits and logit edits applied before sampling, through the backends' one sampling
 * interface (logprobs, logits_add, sample_rows). Where the logits are: on a GPU backend the
 * rows are described to it (parameters, and the token history of rows with penalties), its
 * logprobs op runs first when a row wants logprobs, and only the picked tokens (and the
 * wanted logprobs) come back: a few bytes per row instead of a vocabulary of fp32 logits. The
 * host path runs the same ops of the CPU backend on logits in host memory: it serves the CPU
 * backend and the steps the device path does not take: a request forking its n > 1 samples
 * (each extra sample draws from a copy of the parent's row; the engine loop then starts the
 * samples), or more top logprobs than the device op returns. */
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"

/* Packed history capacity: every running sequence at full length, within reason. */
#define HISTORY_CAP_MAX ((size_t)16 << 20)

/* Logit edits (logit_bias, min_tokens masks) one step may send to the device; a step with
 * more samples on the host. */
#define DEVICE_EDITS_CAP ((size_t)1 << 16)

Status eng_device_sampler_init(Engine *e) {
    const KernelOps *ops = e->ops;
    DeviceSampler *ds = &e->smp.dev;
    if (ops->host_memory)
        return PL_OK;
    size_t s = (size_t)e->cfg.max_num_seqs, top = s * (size_t)ops->max_top_logprobs;
    size_t hist = s * (size_t)e->max_model_len;
    ds->history_cap = hist < HISTORY_CAP_MAX ? hist : HISTORY_CAP_MAX;
    int vocab = model_config(e->model)->vocab_size;
    ds->workspace_bytes =
        ops->sample_workspace_bytes(ops, e->cfg.max_num_seqs, vocab, (int)ds->history_cap);
    struct {
        void **p;
        size_t bytes;
    } d[] = {{(void **)&ds->d_rows, s * sizeof(SampleRow)},
             {(void **)&ds->d_history, ds->history_cap * sizeof(int32_t)},
             {(void **)&ds->d_tokens, s * sizeof(int32_t)},
             {(void **)&ds->d_token_logits, s * sizeof(float)},
             {(void **)&ds->d_lse, s * sizeof(float)},
             {(void **)&ds->d_top_ids, top * sizeof(int32_t)},
             {(void **)&ds->d_top_vals, top * sizeof(float)},
             {(void **)&ds->d_edits, DEVICE_EDITS_CAP * sizeof(LogitEdit)},
             {(void **)&ds->d_masks, s * (((size_t)vocab + 31) / 32) * sizeof(uint32_t)},
             {(void **)&ds->d_mask_rows, s * sizeof(int32_t)},
             {&ds->workspace, ds->workspace_bytes}};
    for (size_t i = 0; i < sizeof d / sizeof *d; i++)
        if (!(*d[i].p = ops->alloc(ops, d[i].bytes)))
            return pl_error_set(PL_ERR_NOMEM, "out of %s memory for the sampler's buffers",
                                ops->name);
    if (!(ds->h_masks = ops->alloc_host(ops, s * (((size_t)vocab + 31) / 32) * sizeof(uint32_t))) ||
        !(ds->h_mask_rows = ops->alloc_host(ops, s * sizeof(int32_t))))
        return pl_error_set(PL_ERR_NOMEM, "out of pinned host memory for the sampler's masks");
    ds->h_rows = pl_xmalloc(s * sizeof(SampleRow));
    ds->h_history = pl_xmalloc(ds->history_cap * sizeof(int32_t));
    ds->h_token_logits = pl_xmalloc(s * sizeof(float));
    ds->h_lse = pl_xmalloc(s * sizeof(float));
    ds->h_top_ids = pl_xmalloc(top * sizeof(int32_t));
    ds->h_top_vals = pl_xmalloc(top * sizeof(float));
    return PL_OK;
}

void eng_device_sampler_free(Engine *e) {
    DeviceSampler *ds = &e->smp.dev;
    void *d[] = {ds->d_rows,  ds->d_history,   ds->d_tokens,   ds->d_token_logits,
                 ds->d_lse,   ds->d_top_ids,   ds->d_top_vals, ds->d_edits,
                 ds->d_masks, ds->d_mask_rows, ds->workspace};
    for (size_t i = 0; i < sizeof d / sizeof *d; i++)
        if (d[i])
            e->ops->free(e->ops, d[i]);
    void *pinned[] = {ds->h_masks, ds->h_mask_rows};
    for (size_t i = 0; i < sizeof pinned / sizeof *pinned; i++)
        if (pinned[i])
            e->ops->free_host(e->ops, pinned[i]);
    free(ds->h_rows);
    free(ds->h_history);
    free(ds->h_token_logits);
    free(ds->h_lse);
    free(ds->h_top_ids);
    free(ds->h_top_vals);
    memset(ds, 0, sizeof *ds);
}

int eng_has_penalty(const SamplingParams *p) {
    return p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f ||
           p->frequency_penalty != 0.0f;
}

int eng_device_sample_ok(const Engine *e, const SchedulerOutput *o) {
    if (!e->smp.dev.d_rows)
        return 0;
    size_t history = 0, edits = 0;
    for (int i = 0; i < o->num_seqs; i++) {
        if (!o->seqs[i].sample)
            continue;
        const Sequence *seq = o->seqs[i].seq;
        const SeqData *d = seq->owner;
        const Request *r = d->req;
        if (r->n > r->num_started ||
            (r->params.logprobs && r->params.top_logprobs > e->ops->max_top_logprobs))
            return 0;
        if (eng_has_penalty(&d->sampling))
            history += (size_t)seq->num_tokens;
        edits += (size_t)eng_count_edits(e, &d, 1);
    }
    return history <= e->smp.dev.history_cap && edits <= DEVICE_EDITS_CAP;
}

size_t eng_top_reserve(Engine *e, size_t k) {
    /* also at k = 0 on the first call: the callers offset the buffers by the result */
    if (!e->smp.top_ids || e->smp.top_len + k > e->smp.top_cap) {
        e->smp.top_cap = (e->smp.top_len + k) * 2 + 64;
        e->smp.top_ids = pl_xrealloc(e->smp.top_ids, e->smp.top_cap * sizeof(int32_t));
        e->smp.top_vals = pl_xrealloc(e->smp.top_vals, e->smp.top_cap * sizeof(float));
    }
    size_t at = e->smp.top_len;
    e->smp.top_len += k;
    return at;
}

/* Describe the sequence's next draw in *row; with a penalty its tokens go to history[*hist..)
 * (room checked by the caller). Returns 1 when it has a penalty. */
static int describe_row(const Sequence *seq, const SamplingParams *p, SampleRow *row,
                        int32_t *history, size_t *hist) {
    *row = k_sample_row(p, seq->num_prompt, seq->num_tokens - seq->num_prompt, (int)*hist);
    if (!eng_has_penalty(p))
        return 0;
    memcpy(history + *hist, seq->tokens, (size_t)seq->num_tokens * sizeof(int32_t));
    *hist += (size_t)seq->num_tokens;
    return 1;
}

/* Describe the sampled rows to the backend and launch their logprobs and sampling (tokens in
 * ds->d_tokens); returns the row count, *kmax the top logprobs to copy (want_lp: any). */
static int launch_sampling(Engine *e, const SchedulerOutput *o, RowLogprobs *lps, int *kmax_out,
                           int *want_lp_out) {
    const KernelOps *ops = e->ops;
    DeviceSampler *ds = &e->smp.dev;
    int vocab = model_config(e->model)->vocab_size;
    int n = 0, argmax_only = 1, penalties = 0, kmax = 0, want_lp = 0;
    size_t hist = 0;
    const SeqData *datas[o->num_seqs > 0 ? o->num_seqs : 1];
    for (int i = 0; i < o->num_seqs; i++) {
        if (!o->seqs[i].sample)
            continue;
        const Sequence *seq = o->seqs[i].seq;
        const SeqData *d = seq->owner;
        const SamplingParams *p = &d->sampling;
        datas[n] = d;
        penalties |= describe_row(seq, p, &ds->h_rows[n], ds->h_history, &hist);
        argmax_only &= sampling_greedy(p) || sampling_temperature_only(p, vocab);
        const GenerateParams *gp = &d->req->params;
        lps[n] = (RowLogprobs){.wanted = gp->logprobs};
        if (gp->logprobs) {
            want_lp = 1;
            kmax = gp->top_logprobs > kmax ? gp->top_logprobs : kmax;
        }
        n++;
    }
    *kmax_out = kmax = kmax < vocab ? kmax : vocab;
    *want_lp_out = want_lp;
    if (n == 0)
        return 0;
    ops->to_device(ops, ds->d_rows, ds->h_rows, (size_t)n * sizeof(SampleRow));
    if (hist)
        ops->to_device(ops, ds->d_history, ds->h_history, hist * sizeof(int32_t));
    if (want_lp)
        ops->logprobs(ops, ds->d_lse, ds->d_top_ids, ds->d_top_vals, e->run.ranks[0].d.logits, n,
                      vocab, kmax);
    int edits = eng_collect_edits(e, datas, n); /* after the raw logprobs */
    if (edits) {
        PL_CHECK((size_t)edits <= DEVICE_EDITS_CAP); /* eng_device_sample_ok */
        ops->to_device(ops, ds->d_edits, e->smp.edits, (size_t)edits * sizeof(LogitEdit));
        ops->logits_add(ops, e->run.ranks[0].d.logits, vocab, ds->d_edits, edits);
    }
    int masked = eng_constraint_masks(e, datas, n, ds->h_masks, ds->h_mask_rows);
    if (masked) {
        size_t words = ((size_t)vocab + 31) / 32;
        ops->to_device(ops, ds->d_masks, ds->h_masks, (size_t)masked * words * sizeof(uint32_t));
        ops->to_device(ops, ds->d_mask_rows, ds->h_mask_rows, (size_t)masked * sizeof(int32_t));
        ops->logits_mask(ops, e->run.ranks[0].d.logits, vocab, ds->d_masks, ds->d_mask_rows,
                         masked);
    }
    int flags = (penalties ? 0 : SAMPLE_NO_PENALTIES) | (argmax_only ? SAMPLE_ARGMAX_ONLY : 0);
    ops->sample_rows(ops, ds->d_tokens, want_lp ? ds->d_token_logits : NULL,
                     e->run.ranks[0].d.logits, n, vocab, ds->d_rows,
                     penalties ? ds->d_history : NULL, flags, ds->workspace, ds->workspace_bytes);
    return n;
}

int eng_device_sample_async(Engine *e, const SchedulerOutput *o, int32_t *tokens) {
    RowLogprobs lps[o->num_seqs > 0 ? o->num_seqs : 1];
    int kmax, want_lp;
    int n = launch_sampling(e, o, lps, &kmax, &want_lp);
    PL_CHECK(!want_lp); /* such requests are not overlapped */
    if (n > 0)
        e->ops->to_host_async(e->ops, tokens, e->smp.dev.d_tokens, (size_t)n * sizeof(int32_t));
    return n;
}

void eng_device_sample(Engine *e, const SchedulerOutput *o, int32_t *tokens, RowLogprobs *lps) {
    const KernelOps *ops = e->ops;
    DeviceSampler *ds = &e->smp.dev;
    int kmax, want_lp;
    int n = launch_sampling(e, o, lps, &kmax, &want_lp);
    if (n == 0)
        return;
    ops->to_host(ops, tokens, ds->d_tokens, (size_t)n * sizeof(int32_t));
    if (!want_lp)
        return;
    ops->to_host(ops, ds->h_lse, ds->d_lse, (size_t)n * sizeof(float));
    ops->to_host(ops, ds->h_token_logits, ds->d_token_logits, (size_t)n * sizeof(float));
    if (kmax) {
        ops->to_host(ops, ds->h_top_ids, ds->d_top_ids, (size_t)n * kmax * sizeof(int32_t));
        ops->to_host(ops, ds->h_top_vals, ds->d_top_vals, (size_t)n * kmax * sizeof(float));
    }
    int k = 0;
    for (int i = 0; i < o->num_seqs; i++) {
        if (!o->seqs[i].sample)
            continue;
        RowLogprobs *lp = &lps[k];
        if (lp->wanted) {
            const GenerateParams *gp = &((SeqData *)o->seqs[i].seq->owner)->req->params;
            int want = gp->top_logprobs < kmax ? gp->top_logprobs : kmax;
            lp->token_logit = ds->h_token_logits[k];
            lp->lse = ds->h_lse[k];
            lp->top_at = eng_top_reserve(e, (size_t)want);
            lp->num_top = want;
            memcpy(e->smp.top_ids + lp->top_at, ds->h_top_ids + (size_t)k * kmax,
                   (size_t)want * sizeof(int32_t));
            memcpy(e->smp.top_vals + lp->top_at, ds->h_top_vals + (size_t)k * kmax,
                   (size_t)want * sizeof(float));
        }
        k++;
    }
}

/* Before sampling changes the row: keep its raw logits, its log-sum-exp and its k most
 * likely tokens (best first; none for k = 0, the chosen token's logprob alone) for the
 * events. */
static void row_logprobs(Engine *e, const float *row, int vocab, int slot, int k, RowLogprobs *lp) {
    PL_CHECK((size_t)(slot + 1) * vocab <= e->smp.raw_cap); /* sized by sample_and_emit */
    PL_CHECK(k >= 0);
    float *raw = e->smp.raw_rows + (size_t)slot * vocab;
    memcpy(raw, row, (size_t)vocab * sizeof(float));
    int n = k < vocab ? k : vocab;
    size_t at = eng_top_reserve(e, (size_t)n);
    e->smp.host->logprobs(e->smp.host, &lp->lse, e->smp.top_ids + at, e->smp.top_vals + at, raw, 1,
                          vocab, n);
    lp->wanted = 1;
    lp->raw = raw;
    lp->top_at = at;
    lp->num_top = n;
}

/* The host sampler's packed history, room for n tokens. */
static int32_t *host_history(Engine *e, size_t n) {
    if (n > e->smp.host_history_cap) {
        e->smp.host_history_cap = n * 2;
        free(e->smp.host_history);
        e->smp.host_history = pl_xmalloc(e->smp.host_history_cap * sizeof(int32_t));
    }
    return e->smp.host_history;
}

/* The first tokens of the samples a prompt forks (n > 1): sample i draws from a copy of the
 * parent's row (edited, unsampled) with sample i's seed, as its own sequence would; appended
 * to e->smp.fork_tokens. */
static void sample_forks(Engine *e, const Sequence *parent, const float *row, int vocab) {
    const Request *r = ((const SeqData *)parent->owner)->req;
    if (e->smp.num_fork_tokens + r->n > e->smp.fork_cap) {
        e->smp.fork_cap = 2 * (e->smp.num_fork_tokens + r->n);
        e->smp.fork_tokens =
            pl_xrealloc(e->smp.fork_tokens, (size_t)e->smp.fork_cap * sizeof(int32_t));
    }
    const KernelOps *host = e->smp.host;
    for (int i = 1; i < r->n; i++) {
        SamplingParams p = r->params.sampling;
        p.seed += (uint64_t)i;
        SampleRow fork;
        size_t hist = 0;
        int pen = describe_row(parent, &p, &fork, host_history(e, parent->num_tokens), &hist);
        memcpy(e->smp.fork_logits, row, (size_t)vocab * sizeof(float));
        host->sample_rows(host, &e->smp.fork_tokens[e->smp.num_fork_tokens++], NULL,
                          e->smp.fork_logits, 1, vocab, &fork, e->smp.host_history,
                          pen ? 0 : SAMPLE_NO_PENALTIES, NULL, 0);
    }
}

/* The logits are on the host: logprobs, forks and sampling there (the CPU backend). */
void eng_sample_on_host(Engine *e, const SchedulerOutput *o, int32_t *tokens, RowLogprobs *lps) {
    const KernelOps *host = e->smp.host;
    int vocab = model_config(e->model)->vocab_size, k = 0, wanted = 0;
    size_t history = 0;
    const float *dev_logits = e->run.ranks[0].d.logits;
    if (dev_logits != e->run.h.logits) {
        int rows = 0;
        for (int i = 0; i < o->num_seqs; i++)
            rows += o->seqs[i].sample;
        e->ops->to_host(e->ops, e->run.h.logits, dev_logits, (size_t)rows * vocab * sizeof(float));
    }
    /* room for the raw rows first: their events point into it until the step ends */
    for (int i = 0; i < o->num_seqs; i++)
        wanted += o->seqs[i].sample && ((SeqData *)o->seqs[i].seq->owner)->req->params.logprobs;
    if ((size_t)wanted * vocab > e->smp.raw_cap) {
        e->smp.raw_cap = (size_t)wanted * vocab * 2;
        free(e->smp.raw_rows);
        e->smp.raw_rows = pl_xmalloc(e->smp.raw_cap * sizeof(float));
    }
    int num_raw = 0;
    for (int i = 0; i < o->num_seqs; i++) {
        if (!o->seqs[i].sample)
            continue;
        Sequence *seq = o->seqs[i].seq;
        Request *r = ((SeqData *)seq->owner)->req;
        float *row = e->run.h.logits + (size_t)k * vocab;
        lps[k] = (RowLogprobs){0};
        if (r->params.logprobs)
            row_logprobs(e, row, vocab, num_raw++, r->params.top_logprobs, &lps[k]);
        const SeqData *d = seq->owner;
        int edits = eng_collect_edits(e, &d, 1);
        if (edits) /* after the raw logprobs, before forks copy the row */
            host->logits_add(host, row, vocab, e->smp.edits, edits);
        int32_t mask_row;
        if (eng_constraint_masks(e, &d, 1, e->smp.mask, &mask_row)) /* row 0 of one: this one */
            host->logits_mask(host, row, vocab, e->smp.mask, &mask_row, 1);
        if (r->n > r->num_started) /* before sampling modifies the row in place */
            sample_forks(e, seq, row, vocab);
        if (eng_has_penalty(&d->sampling))
            history += (size_t)seq->num_tokens;
        k++;
    }
    /* the rows, once the forks are done with the history buffer */
    int32_t *hist_buf = host_history(e, history);
    size_t hist = 0;
    int penalties = 0;
    k = 0;
    for (int i = 0; i < o->num_seqs; i++) {
        if (!o->seqs[i].sample)
            continue;
        const Sequence *seq = o->seqs[i].seq;
        const SeqData *d = seq->owner;
        penalties |= describe_row(seq, &d->sampling, &e->smp.host_rows[k++], hist_buf, &hist);
    }
    host->sample_rows(host, tokens, NULL, e->run.h.logits, k, vocab, e->smp.host_rows,
                      penalties ? hist_buf : NULL, penalties ? 0 : SAMPLE_NO_PENALTIES, NULL, 0);
}
