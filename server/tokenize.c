/* tokenize.c - POST /tokenize and POST /detokenize, in vLLM's shapes: text (a prompt, or chat
 * messages rendered with the model's chat template) to token ids, and ids back to text. They
 * run on the HTTP thread with the engine's tokenizer (immutable, shared by every thread); the
 * engine itself is not involved.
 *
 *   /tokenize   {"count": N, "max_model_len": M, "tokens": [...], "token_strs": [...]?}
 *   /detokenize {"prompt": "..."}                 (decoded with special tokens kept, as
 *                                                  vLLM's tokenizer.decode) */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "server_internal.h"

static json_t *tokenize(const Server *s, const Tokenizer *tok, const ApiTokenizeRequest *q,
                        ApiError *err) {
    int32_t *ids;
    int n;
    if (tok_encode(tok, q->text, q->text_len, q->add_special_tokens, &ids, &n) != PL_OK) {
        api_error_set(err, 400, NULL, "prompt", "%s", pl_error());
        return NULL;
    }
    json_t *tokens = json_array(), *strs = json_array();
    for (int i = 0; i < n; i++) {
        json_array_append_new(tokens, json_integer(ids[i]));
        const char *str = tok_id_to_token(tok, ids[i]);
        json_array_append_new(strs, str ? json_string(str) : json_null());
    }
    free(ids);
    json_t *out = json_pack("{s:i, s:i, s:o}", "count", n, "max_model_len",
                            eng_max_model_len(s->engine), "tokens", tokens);
    if (q->return_token_strs)
        json_object_set(out, "token_strs", strs);
    json_decref(strs);
    return out;
}

/* The answer's JSON, or NULL with *err filled. */
static json_t *answer(const Server *s, int detokenize, const ApiTokenizeRequest *q, ApiError *err) {
    const Tokenizer *tok = eng_tokenizer(s->engine);
    if (!srv_model_known(s, q->model, err))
        return NULL;
    if (!tok) {
        api_error_set(err, 400, NULL, NULL, "the model has no tokenizer");
        return NULL;
    }
    if (!detokenize)
        return tokenize(s, tok, q, err);
    size_t n;
    char *text = tok_decode(tok, q->ids, q->num_ids, 0, &n);
    json_t *out = json_pack("{s:s%}", "prompt", text, n);
    free(text);
    return out;
}

enum MHD_Result tokenize_answer(Server *s, struct MHD_Connection *conn, int detokenize,
                                const char *body, size_t len) {
    ApiLimits lim = {.vocab_size = eng_model_config(s->engine)->vocab_size};
    ApiTokenizeRequest q;
    ApiError err;
    Status st = detokenize ? api_parse_detokenize(body, len, &lim, &q, &err)
                           : api_parse_tokenize(body, len, s->chat_template, &q, &err);
    if (st != PL_OK)
        return srv_send_error(s, conn, &err);
    json_t *out = answer(s, detokenize, &q, &err);
    api_tokenize_free(&q);
    if (!out)
        return srv_send_error(s, conn, &err);
    char *text = json_dumps(out, JSON_COMPACT);
    json_decref(out);
    return srv_send_json(s, conn, 200, text);
}
