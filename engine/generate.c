/* generate.c - single-request conveniences over the engine: eng_generate (run one prompt to
 * the end through the step loop) and eng_prompt_logits (every position's logits, for
 * verification against a reference implementation, on every tensor-parallel rank at once). */
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"

Status eng_generate(Engine *e, const int32_t *prompt, int n, const GenerateParams *p,
                    EngTokenFn on_token, void *ctx, GenerateResult *res) {
    memset(res, 0, sizeof *res);
    if (!e->tok)
        return pl_error_set(PL_ERR_INVALID, "%s has no tokenizer.json: generation needs one",
                            e->cfg.model_dir);
    EngRequest req = {.prompt = prompt, .num_prompt = n, .params = *p};
    req.params.n = 1;
    uint64_t id;
    Status st = eng_add_request(e, &req, &id);
    if (st != PL_OK)
        return st;
    res->num_prompt_tokens = n;
    double t0 = pl_now();
    int aborting = 0;
    while (res->finish_reason == FINISH_NONE) {
        const EngEvent *ev;
        int count = eng_step(e, &ev);
        for (int i = 0; i < count; i++) {
            if (ev[i].request_id != id)
                continue;
            if (ev[i].token >= 0 && res->num_generated_tokens++ == 0)
                res->prefill_seconds = pl_now() - t0;
            int stop = 0;
            if (on_token && (ev[i].token >= 0 || ev[i].text_len))
                stop = on_token(ctx, ev[i].token, ev[i].text, ev[i].text_len);
            if (stop && !aborting) {
                eng_abort(e, id);
                aborting = 1;
            }
            res->finish_reason = ev[i].finish;
        }
    }
    res->decode_seconds = pl_now() - t0 - res->prefill_seconds;
    return PL_OK;
}

Status eng_prompt_logits(Engine *e, const int32_t *ids, int n, float *logits) {
    if (n <= 0 || n > e->cfg.max_num_batched_tokens || n > e->max_model_len)
        return pl_error_set(PL_ERR_INVALID,
                            "%d tokens: need 1 to min(max-num-batched-tokens %d, max-model-len "
                            "%d)",
                            n, e->cfg.max_num_batched_tokens, e->max_model_len);
    int vocab = model_config(e->model)->vocab_size;
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            return pl_error_set(PL_ERR_INVALID, "token id %d is outside the vocabulary [0, %d)",
                                ids[i], vocab);
    RankJob j = {.kind = JOB_LOGITS, .ids = ids, .num_tokens = n, .logits_out = logits};
    return eng_ranks_run(e, &j);
}
