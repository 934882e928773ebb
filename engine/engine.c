/* engine.c - model + tokenizer + paged KV cache, and the generate loop of one request.
 *
 * The prompt is prefilled in chunks of max_num_batched_tokens (each chunk attends to the
 * earlier ones through the cache), then tokens are decoded one step at a time. The cache
 * is block-major and addressed through a block table exactly as the batched scheduler will
 * address it; here one sequence owns blocks 0..n in order. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "kernels.h"

struct Engine {
    EngineConfig cfg;
    const KernelOps *ops;
    Model *model;
    Tokenizer *tok;
    int max_model_len;
    KvLayout kv_layout;
    int num_blocks;
    float *kv_cache;      /* [num_blocks, block_elems] */
    int32_t *block_table; /* [num_blocks]: identity for the single sequence */
    /* per-step metadata, sized for one chunk */
    int32_t *positions;
    int64_t *slots;
    int32_t *row_ids; /* [max_num_batched_tokens]: 0, 1, 2, ... */
    int32_t *history; /* [max_model_len] output tokens of the running request */
    float *logits;    /* [vocab] */
};

EngineConfig eng_config_default(void) {
    return (EngineConfig){.model_dir = NULL,
                          .device = "auto",
                          .load_dummy = 0,
                          .seed = 0,
                          .block_size = 16,
                          .max_model_len = 0,
                          .max_num_batched_tokens = 2048};
}

static Status pick_backend(const char *device, const KernelOps **ops) {
    if (!device || !strcmp(device, "auto") || !strcmp(device, "cpu")) {
        *ops = k_cpu_ops();
        return PL_OK;
    }
    if (!strcmp(device, "cuda"))
        return pl_error_set(PL_ERR_UNSUPPORTED,
                            "device 'cuda': this build has no CUDA backend yet (use cpu)");
    return pl_error_set(PL_ERR_INVALID, "device '%s' is not one of auto, cpu, cuda", device);
}

static Status check_config(const EngineConfig *c) {
    int bs = c->block_size;
    if (bs != 8 && bs != 16 && bs != 32 && bs != 64 && bs != 128)
        return pl_error_set(PL_ERR_INVALID, "block-size %d is not one of 8, 16, 32, 64, 128", bs);
    if (c->max_model_len < 0)
        return pl_error_set(PL_ERR_INVALID, "max-model-len %d must be positive", c->max_model_len);
    if (c->max_num_batched_tokens <= 0)
        return pl_error_set(PL_ERR_INVALID, "max-num-batched-tokens %d must be positive",
                            c->max_num_batched_tokens);
    return PL_OK;
}

Status eng_create(const EngineConfig *cfg, Engine **out) {
    *out = NULL;
    Status st = check_config(cfg);
    if (st != PL_OK)
        return st;
    Engine *e = pl_xcalloc(1, sizeof *e);
    e->cfg = *cfg;
    st = pick_backend(cfg->device, &e->ops);
    if (st != PL_OK)
        goto fail;
    ModelLoadOptions mo = {.dir = cfg->model_dir,
                           .load_dummy = cfg->load_dummy,
                           .seed = cfg->seed,
                           .max_num_tokens = cfg->max_num_batched_tokens,
                           .ops = e->ops};
    st = model_load(&mo, &e->model);
    if (st != PL_OK)
        goto fail;
    /* A folder without tokenizer.json still serves token ids (as vLLM's
     * skip_tokenizer_init); text in or out then needs a tokenizer and is refused. */
    char tok_path[4096];
    snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", cfg->model_dir);
    if (access(tok_path, F_OK) == 0) {
        st = tok_load(cfg->model_dir, &e->tok);
        if (st != PL_OK)
            goto fail;
    }
    const ModelConfig *mc = model_config(e->model);
    e->max_model_len = cfg->max_model_len ? cfg->max_model_len : mc->max_position_embeddings;
    if (e->max_model_len > mc->max_position_embeddings) {
        st = pl_error_set(PL_ERR_INVALID, "max-model-len %d exceeds the model's %d positions",
                          e->max_model_len, mc->max_position_embeddings);
        goto fail;
    }
    e->kv_layout = model_kv_layout(e->model, cfg->block_size);
    e->num_blocks = (e->max_model_len + cfg->block_size - 1) / cfg->block_size;
    e->kv_cache = pl_xcalloc((size_t)e->num_blocks * k_kv_block_elems(&e->kv_layout), 4);
    e->block_table = pl_xmalloc((size_t)e->num_blocks * sizeof(int32_t));
    for (int b = 0; b < e->num_blocks; b++)
        e->block_table[b] = b;
    e->positions = pl_xmalloc((size_t)cfg->max_num_batched_tokens * sizeof(int32_t));
    e->slots = pl_xmalloc((size_t)cfg->max_num_batched_tokens * sizeof(int64_t));
    e->row_ids = pl_xmalloc((size_t)cfg->max_num_batched_tokens * sizeof(int32_t));
    for (int i = 0; i < cfg->max_num_batched_tokens; i++)
        e->row_ids[i] = i;
    e->history = pl_xmalloc((size_t)e->max_model_len * sizeof(int32_t));
    e->logits = pl_xmalloc((size_t)mc->vocab_size * sizeof(float));
    *out = e;
    return PL_OK;
fail:
    eng_destroy(e);
    return st;
}

void eng_destroy(Engine *e) {
    if (!e)
        return;
    model_destroy(e->model);
    tok_destroy(e->tok);
    free(e->kv_cache);
    free(e->block_table);
    free(e->positions);
    free(e->slots);
    free(e->row_ids);
    free(e->history);
    free(e->logits);
    free(e);
}

const Tokenizer *eng_tokenizer(const Engine *e) {
    return e->tok;
}

const ModelConfig *eng_model_config(const Engine *e) {
    return model_config(e->model);
}

int eng_max_model_len(const Engine *e) {
    return e->max_model_len;
}

const char *eng_device_name(const Engine *e) {
    return e->ops->name;
}

const char *eng_finish_reason_str(FinishReason r) {
    switch (r) {
        case FINISH_LENGTH:
            return "length";
        case FINISH_STOP:
            return "stop";
        case FINISH_ABORT:
            return "abort";
        case FINISH_NONE:
            break;
    }
    return "none";
}

/* Run tokens ids[0..n) at positions start..start+n-1 of the single sequence. When
 * `all_logits` is set, logits of every row go to `logits`, else only the last row's. */
static void forward_span(Engine *e, const int32_t *ids, int start, int n, int all_logits,
                         float *logits) {
    for (int i = 0; i < n; i++) {
        e->positions[i] = start + i;
        e->slots[i] = start + i; /* identity block table: slot == position */
    }
    int32_t query_start[2] = {0, n};
    AttnBatch b = {.num_tokens = n,
                   .positions = e->positions,
                   .slot_mapping = e->slots,
                   .num_seqs = 1,
                   .query_start = query_start,
                   .block_tables = e->block_table,
                   .max_blocks_per_seq = e->num_blocks};
    const int32_t *rows = all_logits ? e->row_ids : e->row_ids + n - 1;
    model_forward(e->model, ids, &b, e->kv_cache, &e->kv_layout, rows, all_logits ? n : 1, logits);
}

static Status check_prompt(const Engine *e, const int32_t *ids, int n) {
    if (n <= 0)
        return pl_error_set(PL_ERR_INVALID, "the prompt is empty (no tokens)");
    if (n >= e->max_model_len)
        return pl_error_set(PL_ERR_INVALID,
                            "the prompt has %d tokens; max-model-len is %d, which leaves no "
                            "room to generate",
                            n, e->max_model_len);
    int vocab = model_config(e->model)->vocab_size;
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            return pl_error_set(PL_ERR_INVALID,
                                "token id %d at prompt position %d is outside "
                                "the vocabulary [0, %d)",
                                ids[i], i, vocab);
    return PL_OK;
}

static void prefill(Engine *e, const int32_t *ids, int n) {
    int chunk = e->cfg.max_num_batched_tokens;
    for (int s = 0; s < n; s += chunk) {
        int len = n - s < chunk ? n - s : chunk;
        forward_span(e, ids + s, s, len, 0, e->logits);
    }
}

static int is_eos(const ModelConfig *mc, const Tokenizer *tok, int32_t t) {
    for (int i = 0; i < mc->num_eos; i++)
        if (mc->eos_token_ids[i] == t)
            return 1;
    return t == tok_eos_id(tok);
}

Status eng_generate(Engine *e, const int32_t *prompt, int n, const GenerateParams *p,
                    EngTokenFn on_token, void *ctx, GenerateResult *res) {
    memset(res, 0, sizeof *res);
    Status st = check_prompt(e, prompt, n);
    if (st != PL_OK)
        return st;
    if (p->max_tokens <= 0)
        return pl_error_set(PL_ERR_INVALID, "max_tokens must be at least 1");
    if (!e->tok)
        return pl_error_set(PL_ERR_INVALID, "%s has no tokenizer.json: generation needs one",
                            e->cfg.model_dir);
    const ModelConfig *mc = model_config(e->model);
    int budget = p->max_tokens < e->max_model_len - n ? p->max_tokens : e->max_model_len - n;
    res->num_prompt_tokens = n;
    TokStream *ts = tok_stream_create(e->tok, prompt, n);
    double t0 = pl_now();
    prefill(e, prompt, n);
    int generated = 0;
    FinishReason why = FINISH_LENGTH;
    while (generated < budget) {
        SampleRequest req = {.params = &p->sampling,
                             .prompt = prompt,
                             .num_prompt = n,
                             .output = e->history,
                             .num_output = generated};
        int32_t tok;
        e->ops->sample(&tok, e->logits, 1, mc->vocab_size, &req);
        if (generated == 0)
            res->prefill_seconds = pl_now() - t0;
        if (!p->ignore_eos && is_eos(mc, e->tok, tok)) {
            why = FINISH_STOP;
            break;
        }
        e->history[generated++] = tok;
        if (on_token && on_token(ctx, tok, tok_stream_push(ts, tok))) {
            why = FINISH_ABORT;
            break;
        }
        if (generated < budget)
            forward_span(e, &tok, n + generated - 1, 1, 0, e->logits);
    }
    const char *rest = tok_stream_finish(ts);
    if (on_token && rest[0])
        on_token(ctx, -1, rest);
    tok_stream_destroy(ts);
    res->finish_reason = why;
    res->num_generated_tokens = generated;
    res->decode_seconds = pl_now() - t0 - res->prefill_seconds;
    return PL_OK;
}

Status eng_prompt_logits(Engine *e, const int32_t *ids, int n, float *logits) {
    Status st = check_prompt(e, ids, n);
    if (st != PL_OK)
        return st;
    if (n > e->cfg.max_num_batched_tokens)
        return pl_error_set(PL_ERR_INVALID, "%d tokens exceed max-num-batched-tokens %d", n,
                            e->cfg.max_num_batched_tokens);
    forward_span(e, ids, 0, n, 1, logits);
    return PL_OK;
}
