/* fuzz_engine_request.c - libFuzzer target: a request body all the way through the engine.
 *
 * The input is the body of POST /v1/completions (api_parse_completion); a body that is not a
 * valid completions request is tried as a chat body (api_parse_chat, ChatML). What parses is
 * tokenized and checked as server/completion.c does (tok_encode with add_special for
 * completions, api_check_length), turned into engine requests with the same GenerateParams
 * (n = best_of samples, logprobs when asked for or best_of > n, stop ids, min_tokens,
 * logit_bias, sampling fields), queued with eng_add_request and stepped with eng_step until
 * the engine is idle. One engine per process: the bundled models/stories260K on the CPU
 * backend, with a small KV pool (24 blocks of 16 tokens, a small swap pool), a small step budget
 * (32 tokens, 8 sequences) and admission without reserve (schedule-conservativeness 0), so
 * that chunked prefill, preemption, swapping and recompute happen, and
 * prefix caching on as in the server (so an input can meet blocks an earlier one cached).
 *
 * Limits keep each input fast: n and best_of at most 4 (the parser refuses more), the first
 * 4 prompts only, max_tokens at most 12 (min_tokens cut to match). An unseeded request gets
 * seed 0, so a run is reproducible. When the input's length is a multiple of 7, the first
 * request is aborted after its second step.
 *
 * Invariants, besides the sanitizers: every event belongs to a queued request and a sample
 * index below its n; tokens are in the vocabulary; every event's text is valid UTF-8; a
 * sample finishes exactly once, gets no event after that, and its token count never passes
 * max_tokens; "length" means exactly max_tokens tokens; "stop" comes no earlier than
 * min_tokens; with ignore_eos, no stop ids and no abort, every sample ends by length;
 * logprobs (when asked for) are finite and <= 0, with at most top_logprobs alternatives,
 * best first, inside the vocabulary; the engine is idle within a bounded number of steps;
 * afterwards no request runs, waits or is swapped, and every KV block is free again. */
#include <math.h>

#include "api.h"
#include "engine.h"
#include "fuzz_common.h"

#define MAX_PROMPTS 4
#define MAX_SAMPLES 4
#define MAX_NEW     12
#define MAX_STEPS   4000

static Engine *g_eng;
static const Tokenizer *g_tok;
static ApiLimits g_lim;
static ApiChatTemplate *g_chatml; /* the chat body's template (ChatML) */
static char g_model_dir[1024];

static void init_engine(void) {
    snprintf(g_model_dir, sizeof g_model_dir, "%s/models/stories260K", fz_root());
    EngineConfig c = eng_config_default();
    c.model_dir = g_model_dir;
    c.device = "cpu";
    c.quiet = 1;
    c.num_gpu_blocks_override = 24;
    c.swap_space_gib = 1.0 / 1024; /* 1 MiB: a few dozen blocks */
    c.max_num_seqs = 8;
    c.max_num_batched_tokens = 32;
    c.schedule_conservativeness = 0; /* admit whatever fits now: preemption happens */
    if (eng_create(&c, &g_eng) != PL_OK) {
        fprintf(stderr, "fuzz_engine_request: eng_create(%s): %s\n", g_model_dir, pl_error());
        abort();
    }
    const ApiChatTemplateSpec chatml = {.setting = "chatml"};
    FUZZ_CHECK(api_chat_template_load(&chatml, &g_chatml) == PL_OK && g_chatml,
               "the built-in chatml template does not load");
    g_tok = eng_tokenizer(g_eng);
    FUZZ_CHECK(g_tok != NULL, "the bundled model has no tokenizer");
    g_lim = (ApiLimits){.max_model_len = eng_max_model_len(g_eng),
                        .max_n = MAX_SAMPLES,
                        .vocab_size = eng_model_config(g_eng)->vocab_size,
                        .max_logprobs = 20};
}

typedef struct {
    int queued;
    uint64_t id;
    int max_tokens, min_tokens, logprobs, top_logprobs, n, aborted;
    int finished[MAX_SAMPLES]; /* its FinishReason once finished */
    int generated[MAX_SAMPLES];
} Run;

/* As server/completion.c's engine_params, with the fuzzer's caps. */
static GenerateParams params_of(const ApiRequest *q, int max_tokens, LogitBias *bias) {
    GenerateParams gp = {.max_tokens = max_tokens,
                         .min_tokens = q->min_tokens < max_tokens ? q->min_tokens : max_tokens,
                         .ignore_eos = q->ignore_eos,
                         .n = q->best_of,
                         .logprobs = q->logprobs >= 0 || q->best_of > q->n,
                         .top_logprobs = q->logprobs > 0 ? q->logprobs : 0,
                         .stop_token_ids = q->stop_token_ids,
                         .num_stop_token_ids = q->num_stop_token_ids,
                         .sampling = sampling_params_default()};
    for (int i = 0; i < q->num_logit_bias; i++)
        bias[i] = (LogitBias){.token = q->logit_bias_ids[i], .bias = q->logit_bias_values[i]};
    gp.logit_bias = q->num_logit_bias ? bias : NULL;
    gp.num_logit_bias = q->num_logit_bias;
    api_sampling_params(q, &gp.sampling); /* an unseeded request keeps seed 0: reproducible */
    return gp;
}

static void check_event(const EngEvent *ev, Run *runs, int nruns, int vocab) {
    Run *r = ev->user;
    FUZZ_CHECK(r >= runs && r < runs + nruns && r->queued, "event for an unknown request");
    FUZZ_CHECK(ev->request_id == r->id, "event request_id %llu, queued as %llu",
               (unsigned long long)ev->request_id, (unsigned long long)r->id);
    FUZZ_CHECK(ev->index >= 0 && ev->index < r->n, "event index %d of %d samples", ev->index, r->n);
    int i = ev->index;
    FUZZ_CHECK(!r->finished[i], "event for sample %d after it finished", i);
    FUZZ_CHECK(ev->token >= -1 && ev->token < vocab, "token %d", ev->token);
    FUZZ_CHECK(ev->text != NULL, "event without text");
    FUZZ_CHECK(fz_utf8_valid(ev->text, strlen(ev->text)), "event text is not UTF-8");
    if (ev->token >= 0) {
        r->generated[i]++;
        if (r->logprobs) {
            FUZZ_CHECK(isfinite(ev->logprob) && ev->logprob <= 1e-4f, "logprob %g", ev->logprob);
            FUZZ_CHECK(ev->num_top >= 0 && ev->num_top <= r->top_logprobs, "%d top logprobs of %d",
                       ev->num_top, r->top_logprobs);
            for (int k = 0; k < ev->num_top; k++) {
                FUZZ_CHECK(ev->top_ids[k] >= 0 && ev->top_ids[k] < vocab, "top id %d",
                           ev->top_ids[k]);
                FUZZ_CHECK(isfinite(ev->top_logprobs[k]) && ev->top_logprobs[k] <= 1e-4f,
                           "top logprob %g", ev->top_logprobs[k]);
                FUZZ_CHECK(k == 0 || ev->top_logprobs[k] <= ev->top_logprobs[k - 1],
                           "top logprobs not best first");
            }
        }
    }
    FUZZ_CHECK(ev->num_generated == r->generated[i], "num_generated %d, %d token events",
               ev->num_generated, r->generated[i]);
    FUZZ_CHECK(r->generated[i] <= r->max_tokens, "%d tokens, max_tokens %d", r->generated[i],
               r->max_tokens);
    switch (ev->finish) {
        case FINISH_NONE:
            break;
        case FINISH_LENGTH:
            FUZZ_CHECK(r->generated[i] == r->max_tokens, "length after %d of %d tokens",
                       r->generated[i], r->max_tokens);
            r->finished[i] = ev->finish;
            break;
        case FINISH_STOP:
            FUZZ_CHECK(r->generated[i] >= r->min_tokens, "stop after %d tokens, min_tokens %d",
                       r->generated[i], r->min_tokens);
            r->finished[i] = ev->finish;
            break;
        case FINISH_ABORT:
            FUZZ_CHECK(r->aborted, "abort of a request nobody aborted");
            r->finished[i] = ev->finish;
            break;
        default:
            FUZZ_CHECK(0, "finish reason %d", (int)ev->finish);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_eng)
        init_engine();
    ApiRequest q;
    ApiError err;
    memset(&err, 0, sizeof err);
    if (api_parse_completion((const char *)data, size, &g_lim, &q, &err) != PL_OK) {
        FUZZ_CHECK(err.status == 400 && err.message[0], "completion: error %d", err.status);
        memset(&err, 0, sizeof err);
        if (api_parse_chat((const char *)data, size, &g_lim, g_chatml, &q, &err) != PL_OK) {
            FUZZ_CHECK(err.status == 400 && err.message[0], "chat: error %d", err.status);
            return 0;
        }
    }
    FUZZ_CHECK(q.n >= 1 && q.best_of >= q.n && q.best_of <= MAX_SAMPLES, "n %d best_of %d", q.n,
               q.best_of);
    const int vocab = g_lim.vocab_size;
    int np = q.num_prompts < MAX_PROMPTS ? q.num_prompts : MAX_PROMPTS;
    Run runs[MAX_PROMPTS];
    memset(runs, 0, sizeof runs);
    LogitBias *bias = pl_xcalloc((size_t)q.num_logit_bias + 1, sizeof *bias);
    int expect_length = q.ignore_eos && q.num_stop_token_ids == 0;
    for (int p = 0; p < np; p++) {
        const ApiPrompt *ap = &q.prompts[p];
        int32_t *ids = NULL;
        int n = 0;
        if (ap->text) {
            /* text_len counts NUL characters in the text (JSON's \u0000); a parser that does
             * not set it leaves 0 */
            size_t len = ap->text_len ? ap->text_len : strlen(ap->text);
            if (tok_encode(g_tok, ap->text, len, !q.is_chat, &ids, &n) != PL_OK)
                continue; /* the server answers 400 */
            for (int k = 0; k < n; k++)
                FUZZ_CHECK(ids[k] >= 0 && ids[k] < vocab, "tok_encode gave id %d", ids[k]);
        } else {
            n = ap->num_ids;
            ids = pl_xmalloc((size_t)n * sizeof *ids);
            memcpy(ids, ap->ids, (size_t)n * sizeof *ids);
        }
        ApiError lerr;
        int max_tokens = n > 0 ? api_check_length(&g_lim, &q, n, &lerr) : -1;
        if (max_tokens < 1) { /* the server answers 400 */
            free(ids);
            continue;
        }
        FUZZ_CHECK(n + max_tokens <= g_lim.max_model_len, "prompt %d + max_tokens %d", n,
                   max_tokens);
        if (max_tokens > MAX_NEW)
            max_tokens = MAX_NEW;
        EngRequest er = {.prompt = ids,
                         .num_prompt = n,
                         .params = params_of(&q, max_tokens, bias),
                         .user = &runs[p]};
        Run *r = &runs[p];
        r->max_tokens = max_tokens;
        r->min_tokens = er.params.min_tokens;
        r->logprobs = er.params.logprobs;
        r->top_logprobs = er.params.top_logprobs;
        r->n = q.best_of;
        /* A prompt the KV pool cannot hold is refused (a 400 in the server); no other. */
        r->queued = eng_add_request(g_eng, &er, &r->id) == PL_OK;
        free(ids);
    }
    free(bias);

    int steps = 0, abort_first = size % 7 == 0;
    while (eng_has_work(g_eng)) {
        FUZZ_CHECK(++steps <= MAX_STEPS, "the engine still has work after %d steps", MAX_STEPS);
        if (abort_first && steps == 3)
            for (int p = 0; p < np; p++)
                if (runs[p].queued) {
                    runs[p].aborted = 1;
                    eng_abort(g_eng, runs[p].id);
                    break;
                }
        const EngEvent *evs;
        int k = eng_step(g_eng, &evs);
        for (int i = 0; i < k; i++)
            check_event(&evs[i], runs, np, vocab);
    }
    for (int p = 0; p < np; p++) {
        const Run *r = &runs[p];
        if (!r->queued)
            continue;
        for (int i = 0; i < r->n; i++) {
            FUZZ_CHECK(r->finished[i], "prompt %d sample %d never finished", p, i);
            if (expect_length && !r->aborted)
                FUZZ_CHECK(r->generated[i] == r->max_tokens,
                           "ignore_eos, no stop ids: %d of %d tokens", r->generated[i],
                           r->max_tokens);
        }
    }
    EngineStats st = eng_stats(g_eng);
    if (getenv("FUZZ_VERBOSE")) { /* what an input did, for looking at a corpus */
        fprintf(stderr, "fuzz_engine_request: %s, %d prompt(s), %d step(s):",
                q.is_chat ? "chat" : "completion", q.num_prompts, steps);
        for (int p = 0; p < np; p++) {
            fprintf(stderr, " [%s", runs[p].queued ? "" : "not queued");
            for (int i = 0; runs[p].queued && i < runs[p].n; i++)
                fprintf(stderr, "%s%d/%d %s", i ? ", " : "", runs[p].generated[i],
                        runs[p].max_tokens,
                        eng_finish_reason_str((FinishReason)runs[p].finished[i]));
            fprintf(stderr, "]");
        }
        fprintf(stderr, "; preempted %lld by swap, %lld by recompute; %lld cached prompt tokens\n",
                (long long)st.sched.preempt_swap, (long long)st.sched.preempt_recompute,
                (long long)st.sched.cached_prompt_tokens);
        fprintf(stderr, "fuzz_engine_request: KV blocks %d, swap blocks %d\n", st.num_gpu_blocks,
                st.num_cpu_blocks);
    }
    FUZZ_CHECK(st.num_requests_running == 0 && st.num_requests_waiting == 0 &&
                   st.num_requests_swapped == 0,
               "idle engine with requests: %d running, %d waiting, %d swapped",
               st.num_requests_running, st.num_requests_waiting, st.num_requests_swapped);
    FUZZ_CHECK(st.free_gpu_blocks == st.num_gpu_blocks && st.free_cpu_blocks == st.num_cpu_blocks,
               "idle engine holds KV blocks: %d of %d free, swap %d of %d free", st.free_gpu_blocks,
               st.num_gpu_blocks, st.free_cpu_blocks, st.num_cpu_blocks);
    api_request_free(&q);
    return 0;
}
