/* fuzz_request_json.c - libFuzzer target: the body of POST /v1/completions and
 * /v1/chat/completions through api_parse_completion / api_parse_chat (every chat template
 * family), then api_check_length, api_error_json and api_request_free.
 *
 * The whole input is the body. Each input is parsed as a completions request and as a chat
 * request with two of the built-in templates or none (picked from the input's length, so all
 * five see every input over a run; a body's own chat_template renders with any), with the
 * server's usual limits.
 * Invariants: a success holds only values inside the limits; a failure is a 400 with a
 * zeroed request and an error that serialises to valid JSON; api_request_free frees all
 * (the leak checker runs at exit of every input). */
#include <jansson.h>
#include <math.h>

#include "api.h"
#include "fuzz_common.h"

static const ApiLimits LIMITS = {
    .max_model_len = 2048,
    .max_n = 16,
    .vocab_size = 32000,
    .max_logprobs = 20,
};

static int is_zero(const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i])
            return 0;
    return 1;
}

static void check_error(const ApiError *err, const ApiRequest *req, const char *what) {
    FUZZ_CHECK(is_zero(req, sizeof *req), "%s: request not zeroed after a failure", what);
    FUZZ_CHECK(err->status == 400, "%s: status %d", what, err->status);
    FUZZ_CHECK(err->type != NULL, "%s: no error type", what);
    FUZZ_CHECK(memchr(err->message, 0, sizeof err->message) != NULL, "%s: message unterminated",
               what);
    FUZZ_CHECK(err->message[0], "%s: empty message", what);
    FUZZ_CHECK(memchr(err->param, 0, sizeof err->param) != NULL, "%s: param unterminated", what);
    char *js = api_error_json(err);
    FUZZ_CHECK(js != NULL, "%s: api_error_json returned NULL", what);
    json_error_t je;
    json_t *j = json_loads(js, 0, &je);
    FUZZ_CHECK(j != NULL, "%s: error JSON does not parse back: %s\n  %s", what, je.text, js);
    json_t *e = json_object_get(j, "error");
    FUZZ_CHECK(json_is_string(json_object_get(e, "message")), "%s: error.message missing: %s", what,
               js);
    json_decref(j);
    free(js);
}

static void check_request(const ApiRequest *r, int chat, const char *what) {
    FUZZ_CHECK(r->num_prompts >= 1 && r->prompts, "%s: %d prompts", what, r->num_prompts);
    if (chat)
        FUZZ_CHECK(r->num_prompts == 1 && r->prompts[0].text && r->is_chat, "%s: chat prompt",
                   what);
    for (int i = 0; i < r->num_prompts; i++) {
        const ApiPrompt *p = &r->prompts[i];
        FUZZ_CHECK((p->text != NULL) != (p->ids != NULL), "%s: prompt %d has text and ids", what,
                   i);
        if (p->text) {
            size_t n = strlen(p->text);
            FUZZ_CHECK(fz_utf8_valid(p->text, n), "%s: prompt %d text is not valid UTF-8", what, i);
        } else {
            FUZZ_CHECK(p->num_ids >= 1, "%s: prompt %d has %d ids", what, i, p->num_ids);
            for (int k = 0; k < p->num_ids; k++)
                FUZZ_CHECK(p->ids[k] >= 0 && p->ids[k] < LIMITS.vocab_size,
                           "%s: prompt %d id %d = %d", what, i, k, p->ids[k]);
        }
    }
    if (chat)
        FUZZ_CHECK(r->max_tokens == -1 || (r->max_tokens >= 1 && r->max_tokens < 2048),
                   "%s: max_tokens %d", what, r->max_tokens);
    else
        FUZZ_CHECK(r->max_tokens >= 1 && r->max_tokens < 2048, "%s: max_tokens %d", what,
                   r->max_tokens);
    FUZZ_CHECK(r->n >= 1 && r->n <= LIMITS.max_n, "%s: n %d", what, r->n);
    FUZZ_CHECK(r->best_of >= r->n && r->best_of <= LIMITS.max_n, "%s: best_of %d n %d", what,
               r->best_of, r->n);
    FUZZ_CHECK(!(r->stream && r->best_of > r->n), "%s: stream with best_of > n", what);
    FUZZ_CHECK(isfinite(r->temperature) && r->temperature >= 0 && r->temperature <= 100,
               "%s: temperature %g", what, r->temperature);
    FUZZ_CHECK(r->top_p > 0 && r->top_p <= 1, "%s: top_p %g", what, r->top_p);
    FUZZ_CHECK(r->top_k == -1 || r->top_k >= 1, "%s: top_k %d", what, r->top_k);
    FUZZ_CHECK(r->min_p >= 0 && r->min_p <= 1, "%s: min_p %g", what, r->min_p);
    FUZZ_CHECK(fabsf(r->presence_penalty) <= 2 && fabsf(r->frequency_penalty) <= 2,
               "%s: penalties %g %g", what, r->presence_penalty, r->frequency_penalty);
    FUZZ_CHECK(r->repetition_penalty > 0 && r->repetition_penalty <= 100,
               "%s: repetition_penalty %g", what, r->repetition_penalty);
    FUZZ_CHECK(r->num_stop >= 0 && r->num_stop <= API_MAX_STOP, "%s: num_stop %d", what,
               r->num_stop);
    for (int i = 0; i < r->num_stop; i++)
        FUZZ_CHECK(r->stop[i] && r->stop_len[i] > 0, "%s: stop %d empty", what, i);
    FUZZ_CHECK(r->num_stop_token_ids >= 0 && r->num_stop_token_ids <= 4096, "%s: stop ids %d", what,
               r->num_stop_token_ids);
    for (int i = 0; i < r->num_stop_token_ids; i++)
        FUZZ_CHECK(r->stop_token_ids[i] >= 0 && r->stop_token_ids[i] < LIMITS.vocab_size,
                   "%s: stop id %d", what, r->stop_token_ids[i]);
    FUZZ_CHECK(r->logprobs >= -1 && r->logprobs <= LIMITS.max_logprobs, "%s: logprobs %d", what,
               r->logprobs);
    FUZZ_CHECK(!r->include_usage || r->stream, "%s: include_usage without stream", what);

    /* The length check after tokenizing, at its edges. */
    const int lens[] = {0, 1, 7, 2047, 2048, 1 << 30};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        ApiError err;
        memset(&err, 0, sizeof err);
        int mt = api_check_length(&LIMITS, r, lens[i], &err);
        if (mt < 0) {
            FUZZ_CHECK(err.status == 400 && err.message[0], "%s: check_length error", what);
            char *js = api_error_json(&err);
            FUZZ_CHECK(js != NULL, "%s: api_error_json", what);
            free(js);
        } else {
            FUZZ_CHECK(mt >= 1 && (long long)lens[i] + mt <= LIMITS.max_model_len,
                       "%s: check_length(%d) = %d", what, lens[i], mt);
        }
    }
}

/* The built-in template `fam` (chatml, llama3, llama2, zephyr; 4: none), with or without BOS
 * and EOS token texts, parsed on first use and kept for the process. */
static const ApiChatTemplate *chat_template(int fam, int with_tokens) {
    static const char *names[4] = {"chatml", "llama3", "llama2", "zephyr"};
    static ApiChatTemplate *loaded[4][2];
    if (fam >= 4)
        return NULL;
    if (!loaded[fam][with_tokens]) {
        const ApiChatTemplateSpec spec = {.setting = names[fam],
                                          .bos_token = with_tokens ? "<s>" : NULL,
                                          .eos_token = with_tokens ? "</s>" : NULL};
        FUZZ_CHECK(api_chat_template_load(&spec, &loaded[fam][with_tokens]) == PL_OK &&
                       loaded[fam][with_tokens],
                   "built-in template %s does not load", names[fam]);
    }
    return loaded[fam][with_tokens];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *body = (const char *)data;
    ApiRequest req;
    ApiError err;

    memset(&err, 0, sizeof err);
    if (api_parse_completion(body, size, &LIMITS, &req, &err) == PL_OK) {
        check_request(&req, 0, "completion");
        api_request_free(&req);
        FUZZ_CHECK(is_zero(&req, sizeof req), "completion: request not zeroed by free");
        api_request_free(&req); /* documented safe twice */
    } else {
        check_error(&err, &req, "completion");
    }

    /* Chat: two templates per input (all five over a corpus), with and without BOS/EOS; with
     * none, only a body that brings its own chat_template renders. */
    for (int k = 0; k < 2; k++) {
        const int fam = (int)((size + (size_t)k * 2) % 5), with_tokens = (int)(size & 1);
        const ApiChatTemplate *t = chat_template(fam, with_tokens);
        memset(&err, 0, sizeof err);
        if (api_parse_chat(body, size, &LIMITS, t, &req, &err) == PL_OK) {
            check_request(&req, 1, "chat");
            api_request_free(&req);
        } else {
            check_error(&err, &req, "chat");
        }
    }
    return 0;
}
