/* api.c - the OpenAI request layer: JSON bodies of /v1/completions, /v1/chat/completions,
 * /tokenize and /detokenize (jansson) checked field by field into an ApiRequest or an
 * ApiTokenizeRequest, the prompt-length check made after tokenizing, and OpenAI-shaped error
 * objects. Chat messages and their template are in chat.c.
 *
 * Every refusal is a 400 invalid_request_error whose param is the offending field and whose
 * message names it. Types are strict: booleans are not numbers, strings are not numbers;
 * an integer field takes a JSON integer or a real with an integral value (16.0). null means
 * "absent" for every optional field. Unknown fields are ignored. Text (prompts, message
 * contents, stop strings) may hold NUL characters (JSON's \u0000), so it travels with its
 * length; names (model, roles) may not. */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "api.h"
#include "jinja.h"

/* ---- errors ----------------------------------------------------------------------------- */

static const char *default_type(int status) {
    switch (status) {
        case 401:
            return "authentication_error";
        case 403:
            return "permission_error";
        case 404:
            return "not_found_error";
        case 429:
            return "rate_limit_error";
        default:
            return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

/* Length of the valid UTF-8 sequence at s (at most `avail` bytes), 0 when invalid. */
static size_t utf8_valid(const unsigned char *s, size_t avail) {
    size_t n = s[0] < 0x80                    ? 1
               : s[0] >= 0xc2 && s[0] <= 0xdf ? 2
               : (s[0] & 0xf0) == 0xe0        ? 3
               : s[0] >= 0xf0 && s[0] <= 0xf4 ? 4
                                              : 0;
    if (n == 0 || n > avail)
        return 0;
    for (size_t i = 1; i < n; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    if ((n == 3 && s[0] == 0xe0 && s[1] < 0xa0) || (n == 3 && s[0] == 0xed && s[1] >= 0xa0) ||
        (n == 4 && s[0] == 0xf0 && s[1] < 0x90) || (n == 4 && s[0] == 0xf4 && s[1] >= 0x90))
        return 0; /* overlong, surrogate, above U+10FFFF */
    return n;
}

/* Copy `in` to `out` (same size), each byte of an invalid UTF-8 sequence becoming '?'. */
static void utf8_clean(const char *in, char *out) {
    const unsigned char *s = (const unsigned char *)in;
    size_t len = strlen(in), i = 0;
    while (i < len) {
        size_t n = utf8_valid(s + i, len - i);
        if (n == 0)
            out[i++] = '?';
        for (; n > 0; n--, i++)
            out[i] = in[i];
    }
    out[len] = 0;
}

void api_error_set(ApiError *err, int status, const char *type, const char *param, const char *fmt,
                   ...) {
    memset(err, 0, sizeof *err);
    err->status = status;
    err->type = type ? type : default_type(status);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof err->message) { /* cut: drop a character left incomplete */
        size_t k = strlen(err->message);
        size_t lead = k;
        while (lead > 0 && ((unsigned char)err->message[lead - 1] & 0xc0) == 0x80)
            lead--;
        if (lead > 0 && (unsigned char)err->message[lead - 1] >= 0xc0 &&
            !utf8_valid((unsigned char *)err->message + lead - 1, k - lead + 1))
            err->message[lead - 1] = 0;
    }
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
}

char *api_error_json(const ApiError *err) {
    char msg[sizeof err->message], param[sizeof err->param];
    utf8_clean(err->message, msg);
    utf8_clean(err->param, param);
    json_t *e = json_object();
    json_object_set_new(e, "message", json_string(msg));
    json_object_set_new(e, "type", json_string(err->type ? err->type : default_type(err->status)));
    json_object_set_new(e, "param", param[0] ? json_string(param) : json_null());
    json_object_set_new(e, "code", err->code ? json_string(err->code) : json_null());
    json_t *root = json_object();
    json_object_set_new(root, "error", e);
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    PL_CHECK(s != NULL);
    return s;
}

int api_refuse(ApiError *err, const char *param, const char *fmt, ...) {
    char msg[sizeof err->message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    api_error_set(err, 400, "invalid_request_error", param, "%s", msg);
    return -1;
}

/* ---- typed getters: 1 present, 0 absent or null, -1 wrong type (error set) -------------- */

/* A JSON integer, or a real with an integral value that a double holds exactly. */
static int as_int(const json_t *v, long long *out) {
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return 1;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d == floor(d) && fabs(d) <= 9007199254740992.0) {
            *out = (long long)d;
            return 1;
        }
    }
    return 0;
}

static json_t *field(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_null(v) ? NULL : v;
}

static int opt_int(json_t *o, const char *key, long long *out, ApiError *err) {
    json_t *v = field(o, key);
    if (!v)
        return 0;
    return as_int(v, out) ? 1 : api_refuse(err, key, "'%s' must be an integer", key);
}

static int opt_bool(json_t *o, const char *key, const char *param, int *out, ApiError *err) {
    json_t *v = field(o, key);
    if (!v)
        return 0;
    if (!json_is_boolean(v)) {
        int nested = strcmp(param, key) != 0;
        return api_refuse(err, param, "'%s%s%s' must be a boolean", nested ? param : "",
                          nested ? "." : "", key);
    }
    *out = json_is_true(v);
    return 1;
}

/* A copy of JSON string v, NUL characters included; its length in *len. */
static char *text_dup(const json_t *v, size_t *len) {
    *len = json_string_length(v);
    char *s = pl_xmalloc(*len + 1);
    memcpy(s, json_string_value(v), *len + 1);
    return s;
}

/* 1 when JSON string v holds a NUL character. */
static int has_nul(const json_t *v) {
    return strlen(json_string_value(v)) != json_string_length(v);
}

static int opt_str(json_t *o, const char *key, char **out, ApiError *err) {
    json_t *v = field(o, key);
    if (!v)
        return 0;
    if (!json_is_string(v))
        return api_refuse(err, key, "'%s' must be a string", key);
    if (has_nul(v) && !strcmp(key, "model")) /* a name: a cut copy could match another */
        return api_refuse(err, key, "'%s' must not contain the character \\u0000", key);
    *out = pl_xstrdup(json_string_value(v)); /* user: kept, never read */
    return 1;
}

/* A number in [lo, hi], or (lo, hi] when lo_open. */
static int opt_float(json_t *o, const char *key, double lo, int lo_open, double hi, float *out,
                     ApiError *err) {
    json_t *v = field(o, key);
    if (!v)
        return 0;
    if (!json_is_number(v))
        return api_refuse(err, key, "'%s' must be a number", key);
    double d = json_number_value(v);
    if (d < lo || (lo_open && d == lo) || d > hi)
        return api_refuse(err, key, "'%s' must be in %c%g, %g], got %g", key, lo_open ? '(' : '[',
                          lo, hi, d);
    *out = (float)d;
    return 1;
}

/* An integer in [lo, hi]. */
static int opt_int_in(json_t *o, const char *key, long long lo, long long hi, int *out,
                      ApiError *err) {
    long long v;
    int k = opt_int(o, key, &v, err);
    if (k <= 0)
        return k;
    if (v < lo || v > hi)
        return api_refuse(err, key, "'%s' must be between %lld and %lld, got %lld", key, lo, hi, v);
    *out = (int)v;
    return 1;
}

static long long limit_or(int lim, long long dflt) {
    return lim > 0 ? lim : dflt;
}

/* ---- fields ------------------------------------------------------------------------------ */

/* max_tokens-like field `key`: >= 1 and, alone, below max-model-len. */
static int parse_max_tokens(json_t *o, const char *key, const ApiLimits *lim, int *out,
                            ApiError *err) {
    long long v;
    int k = opt_int(o, key, &v, err);
    if (k <= 0)
        return k;
    if (v < 1)
        return api_refuse(err, key, "'%s' must be at least 1, got %lld", key, v);
    if (lim->max_model_len > 0 && v >= lim->max_model_len)
        return api_refuse(err, key, "%s (%lld) plus the prompt must not exceed max-model-len (%d)",
                          key, v, lim->max_model_len);
    if (v > INT_MAX)
        return api_refuse(err, key, "'%s' is too large: %lld", key, v);
    *out = (int)v;
    return 1;
}

/* A token id in [0, vocab_size). */
static int token_id(const json_t *v, const ApiLimits *lim, const char *param, int32_t *out,
                    ApiError *err) {
    long long id;
    if (!as_int(v, &id))
        return api_refuse(err, param, "'%s' must hold integer token ids", param);
    if (id < 0 || id >= limit_or(lim->vocab_size, INT32_MAX))
        return api_refuse(err, param, "token id %lld in '%s' is out of vocabulary (vocab size %d)",
                          id, param, lim->vocab_size);
    *out = (int32_t)id;
    return 0;
}

static const char PROMPT_FORMS[] = "'prompt' must be a string, a list of strings, a list of token "
                                   "ids or a list of token-id lists";

static int prompt_ids(const json_t *arr, const ApiLimits *lim, ApiPrompt *p, ApiError *err) {
    size_t n = json_array_size(arr);
    if (n == 0)
        return api_refuse(err, "prompt", "prompt must not be empty (an empty token-id list)");
    if (n > INT_MAX)
        return api_refuse(err, "prompt", "'prompt' is too long");
    p->ids = pl_xmalloc(n * sizeof *p->ids);
    p->num_ids = (int)n;
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(arr, i);
        if (!json_is_number(v))
            return api_refuse(err, "prompt", "%s (mixed types)", PROMPT_FORMS);
        if (token_id(v, lim, "prompt", &p->ids[i], err))
            return -1;
    }
    return 0;
}

static int parse_prompt(json_t *o, const ApiLimits *lim, ApiRequest *r, ApiError *err) {
    json_t *p = field(o, "prompt");
    if (!p)
        return api_refuse(err, "prompt", "'prompt' is required");
    if (json_is_string(p)) {
        r->prompts = pl_xcalloc(1, sizeof *r->prompts);
        r->num_prompts = 1;
        r->prompts[0].text = text_dup(p, &r->prompts[0].text_len);
        return 0;
    }
    if (!json_is_array(p))
        return api_refuse(err, "prompt", "%s", PROMPT_FORMS);
    size_t n = json_array_size(p);
    if (n == 0)
        return api_refuse(err, "prompt", "prompt must not be empty");
    json_t *first = json_array_get(p, 0);
    if (json_is_number(first)) { /* one prompt of token ids */
        r->prompts = pl_xcalloc(1, sizeof *r->prompts);
        r->num_prompts = 1;
        return prompt_ids(p, lim, &r->prompts[0], err);
    }
    if (!json_is_string(first) && !json_is_array(first))
        return api_refuse(err, "prompt", "%s", PROMPT_FORMS);
    if (n > INT_MAX)
        return api_refuse(err, "prompt", "'prompt' has too many entries");
    r->prompts = pl_xcalloc(n, sizeof *r->prompts);
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(p, i);
        r->num_prompts++;
        if (json_is_string(first) && json_is_string(e))
            r->prompts[i].text = text_dup(e, &r->prompts[i].text_len);
        else if (json_is_array(first) && json_is_array(e)) {
            if (prompt_ids(e, lim, &r->prompts[i], err))
                return -1;
        } else
            return api_refuse(err, "prompt", "%s (mixed types)", PROMPT_FORMS);
    }
    return 0;
}

static int parse_stop(json_t *o, ApiRequest *r, ApiError *err) {
    json_t *v = field(o, "stop");
    if (!v)
        return 0;
    if (json_is_string(v)) {
        if (json_string_length(v) > 0) {
            r->stop[r->num_stop] = text_dup(v, &r->stop_len[r->num_stop]);
            r->num_stop++;
        }
        return 0;
    }
    if (!json_is_array(v))
        return api_refuse(err, "stop", "'stop' must be a string or a list of strings");
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
        if (!json_is_string(e))
            return api_refuse(err, "stop", "'stop' must be a string or a list of strings");
        if (json_string_length(e) == 0) /* would match everywhere: ignored */
            continue;
        if (r->num_stop == API_MAX_STOP)
            return api_refuse(err, "stop", "'stop' must have at most %d entries", API_MAX_STOP);
        r->stop[r->num_stop] = text_dup(e, &r->stop_len[r->num_stop]);
        r->num_stop++;
    }
    return 0;
}

/* A list of token ids (stop_token_ids, allowed_token_ids) into *ids, *n; `need_one`: an empty
 * list is an error. */
static int parse_token_ids(json_t *o, const ApiLimits *lim, const char *key, int need_one,
                           int32_t **ids, int *n, ApiError *err) {
    json_t *v = field(o, key);
    if (!v)
        return 0;
    if (!json_is_array(v) || (need_one && json_array_size(v) == 0))
        return api_refuse(err, key, "'%s' must be a %slist of integers", key,
                          need_one ? "non-empty " : "");
    size_t len = json_array_size(v), most = lim->vocab_size > 4096 ? (size_t)lim->vocab_size : 4096;
    if (len > most)
        return api_refuse(err, key, "'%s' has %zu entries; at most %zu", key, len, most);
    *ids = pl_xmalloc((len ? len : 1) * sizeof(int32_t));
    for (size_t i = 0; i < len; i++) {
        if (token_id(json_array_get(v, i), lim, key, &(*ids)[i], err))
            return -1;
        (*n)++;
    }
    return 0;
}

/* bad_words: a list of non-empty strings (vLLM's; tokenized by the server). */
static int parse_bad_words(json_t *o, ApiRequest *r, ApiError *err) {
    json_t *v = field(o, "bad_words");
    if (!v)
        return 0;
    const char *msg = "'bad_words' must be a list of non-empty strings";
    if (!json_is_array(v))
        return api_refuse(err, "bad_words", "%s", msg);
    size_t len = json_array_size(v);
    if (len > API_MAX_BAD_WORDS)
        return api_refuse(err, "bad_words", "'bad_words' has more than %d entries",
                          API_MAX_BAD_WORDS);
    r->bad_words = pl_xcalloc(len ? len : 1, sizeof *r->bad_words);
    for (size_t i = 0; i < len; i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_string(e) || json_string_length(e) == 0)
            return api_refuse(err, "bad_words", "%s", msg);
        r->bad_words[r->num_bad_words++] = pl_xstrdup(json_string_value(e));
    }
    return 0;
}

/* logit_bias: {"<token id>": bias in [-100, 100], ...}, as OpenAI and vLLM. */
static int parse_logit_bias(json_t *o, const ApiLimits *lim, ApiRequest *r, ApiError *err) {
    json_t *v = field(o, "logit_bias");
    if (!v)
        return 0;
    if (!json_is_object(v))
        return api_refuse(err, "logit_bias", "'logit_bias' must be an object of token id -> bias");
    size_t n = json_object_size(v);
    if (n > (size_t)limit_or(lim->vocab_size, 1 << 20))
        return api_refuse(err, "logit_bias", "'logit_bias' has more entries than the vocabulary");
    r->logit_bias_ids = pl_xmalloc((n ? n : 1) * sizeof(int32_t));
    r->logit_bias_values = pl_xmalloc((n ? n : 1) * sizeof(float));
    const char *key;
    json_t *bias;
    json_object_foreach(v, key, bias) {
        char *end;
        long long id = strtoll(key, &end, 10);
        if (!key[0] || *end || key[0] == '+' || key[0] == ' ')
            return api_refuse(err, "logit_bias", "'logit_bias' keys must be token ids, got '%.40s'",
                              key);
        if (id < 0 || id >= limit_or(lim->vocab_size, INT32_MAX))
            return api_refuse(err, "logit_bias",
                              "token id %lld in 'logit_bias' is out of vocabulary (vocab size %d)",
                              id, lim->vocab_size);
        if (!json_is_number(bias))
            return api_refuse(err, "logit_bias", "'logit_bias' values must be numbers");
        double b = json_number_value(bias);
        if (!(b >= -100 && b <= 100))
            return api_refuse(
                err, "logit_bias",
                "'logit_bias' values must be between -100 and 100, got %g for token %lld", b, id);
        r->logit_bias_ids[r->num_logit_bias] = (int32_t)id;
        r->logit_bias_values[r->num_logit_bias++] = (float)b;
    }
    return 0;
}

/* Fields that OpenAI or vLLM define and pagellm does not implement: present and not null
 * (nor the value that means "off"), they are a 400 naming the field rather than being
 * silently ignored. */
static int refuse_unsupported(json_t *o, const char *const *names, ApiError *err) {
    for (; *names; names++) {
        json_t *v = field(o, *names);
        if (!v)
            continue;
        const char *s = json_string_value(v);
        if ((!strcmp(*names, "tool_choice") && s && !strcmp(s, "none")) ||
            (!strcmp(*names, "suffix") && s && !s[0]))
            continue;
        return api_refuse(err, *names, "'%s' is not supported by this server", *names);
    }
    return 0;
}

/* vLLM's truncate_prompt_tokens: null, -1 (to max-model-len) or 1 to max-model-len. */
static int parse_truncate(json_t *o, const ApiLimits *lim, ApiRequest *r, ApiError *err) {
    long long k;
    const char *key = "truncate_prompt_tokens";
    switch (opt_int(o, key, &k, err)) {
        case -1:
            return -1;
        case 0:
            return 0;
    }
    if (k < -1 || k == 0 || k > INT_MAX)
        return api_refuse(err, key, "'%s' must be -1 (max-model-len) or at least 1, got %lld", key,
                          k);
    if (lim->max_model_len > 0 && k > lim->max_model_len)
        return api_refuse(err, key, "'%s' (%lld) is more than max-model-len (%d)", key, k,
                          lim->max_model_len);
    r->truncate_prompt_tokens = (int)k;
    return 0;
}

static const char *const UNSUPPORTED_COMMON[] = {"prompt_logprobs", NULL};
static const char *const UNSUPPORTED_COMPLETION[] = {"suffix", NULL};
static const char *const UNSUPPORTED_CHAT[] = {"functions", "function_call", "audio", "prediction",
                                               NULL};

/* Fields both endpoints share. */
static int parse_common(json_t *o, const ApiLimits *lim, ApiRequest *r, ApiError *err) {
    long long seed, top_k = -1;
    json_t *so;
    if (opt_str(o, "model", &r->model, err) < 0 ||
        opt_int_in(o, "n", 1, limit_or(lim->max_n, INT_MAX), &r->n, err) < 0 ||
        opt_float(o, "temperature", 0, 0, 100, &r->temperature, err) < 0 ||
        opt_float(o, "top_p", 0, 1, 1, &r->top_p, err) < 0 ||
        opt_int(o, "top_k", &top_k, err) < 0 ||
        opt_float(o, "min_p", 0, 0, 1, &r->min_p, err) < 0 ||
        opt_float(o, "presence_penalty", -2, 0, 2, &r->presence_penalty, err) < 0 ||
        opt_float(o, "frequency_penalty", -2, 0, 2, &r->frequency_penalty, err) < 0 ||
        opt_float(o, "repetition_penalty", 0, 1, 100, &r->repetition_penalty, err) < 0)
        return -1;
    if (top_k < -1 || top_k > INT_MAX)
        return api_refuse(err, "top_k", "'top_k' must be -1 or 0 (off) or at least 1, got %lld",
                          top_k);
    r->top_k = top_k == 0 ? -1 : (int)top_k; /* 0 and -1 both mean off */
    switch (opt_int(o, "seed", &seed, err)) {
        case -1:
            return -1;
        case 1:
            r->has_seed = 1;
            r->seed = (uint64_t)seed;
    }
    if (parse_stop(o, r, err) ||
        parse_token_ids(o, lim, "stop_token_ids", 0, &r->stop_token_ids, &r->num_stop_token_ids,
                        err) ||
        parse_token_ids(o, lim, "allowed_token_ids", 1, &r->allowed_token_ids,
                        &r->num_allowed_token_ids, err) ||
        parse_bad_words(o, r, err) || parse_logit_bias(o, lim, r, err) ||
        opt_int_in(o, "min_tokens", 0, INT_MAX, &r->min_tokens, err) < 0 ||
        refuse_unsupported(o, UNSUPPORTED_COMMON, err) ||
        api_parse_constraint(o, &r->constraint, err) < 0 ||
        opt_bool(o, "stream", "stream", &r->stream, err) < 0)
        return -1;
    if (r->max_tokens >= 0 && r->min_tokens > r->max_tokens)
        return api_refuse(err, "min_tokens", "'min_tokens' (%d) must not exceed 'max_tokens' (%d)",
                          r->min_tokens, r->max_tokens);
    if (parse_truncate(o, lim, r, err))
        return -1;
    if ((so = field(o, "stream_options"))) {
        if (!r->stream)
            return api_refuse(err, "stream_options",
                              "'stream_options' can only be defined when 'stream' is true");
        if (!json_is_object(so))
            return api_refuse(err, "stream_options", "'stream_options' must be an object");
        if (opt_bool(so, "include_usage", "stream_options", &r->include_usage, err) < 0)
            return -1;
    }
    if (opt_bool(o, "ignore_eos", "ignore_eos", &r->ignore_eos, err) < 0 ||
        opt_bool(o, "include_stop_str_in_output", "include_stop_str_in_output",
                 &r->include_stop_str_in_output, err) < 0 ||
        opt_bool(o, "skip_special_tokens", "skip_special_tokens", &r->skip_special_tokens, err) <
            0 ||
        opt_str(o, "user", &r->user, err) < 0)
        return -1;
    return 0;
}

static void defaults(ApiRequest *r, int max_tokens) {
    memset(r, 0, sizeof *r);
    r->max_tokens = max_tokens;
    r->n = 1;
    r->temperature = 1;
    r->top_p = 1;
    r->top_k = -1;
    r->skip_special_tokens = 1;
    r->repetition_penalty = 1;
    r->logprobs = -1;
}

static json_t *load(const char *body, size_t len, ApiError *err) {
    json_error_t je;
    json_t *o = json_loadb(body ? body : "", body ? len : 0, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!o) {
        api_refuse(err, NULL, "invalid JSON in the request body: %s (line %d, column %d, byte %d)",
                   je.text, je.line, je.column, je.position);
        return NULL;
    }
    if (!json_is_object(o)) {
        json_decref(o);
        api_refuse(err, NULL, "the request body must be a JSON object");
        return NULL;
    }
    return o;
}

/* ---- completions ------------------------------------------------------------------------- */

Status api_parse_completion(const char *body, size_t len, const ApiLimits *lim, ApiRequest *req,
                            ApiError *err) {
    defaults(req, 16);
    json_t *o = load(body, len, err);
    if (!o) {
        api_request_free(req);
        return PL_ERR_INVALID;
    }
    long long best_of = 0;
    int got_best_of = 0;
    if (parse_prompt(o, lim, req, err) ||
        parse_max_tokens(o, "max_tokens", lim, &req->max_tokens, err) < 0 ||
        refuse_unsupported(o, UNSUPPORTED_COMPLETION, err) || parse_common(o, lim, req, err) ||
        (got_best_of = opt_int(o, "best_of", &best_of, err)) < 0)
        goto fail;
    req->best_of = req->n;
    if (got_best_of) {
        if (best_of < req->n || best_of > limit_or(lim->max_n, INT_MAX)) {
            api_refuse(err, "best_of", "'best_of' must be between n (%d) and %lld, got %lld",
                       req->n, limit_or(lim->max_n, INT_MAX), best_of);
            goto fail;
        }
        req->best_of = (int)best_of;
        if (req->stream && req->best_of > req->n) {
            api_refuse(err, "best_of", "'best_of' greater than 'n' cannot be used with stream");
            goto fail;
        }
    }
    if (opt_int_in(o, "logprobs", 0, limit_or(lim->max_logprobs, INT_MAX), &req->logprobs, err) <
            0 ||
        opt_bool(o, "echo", "echo", &req->echo, err) < 0)
        goto fail;
    json_decref(o);
    return PL_OK;
fail:
    json_decref(o);
    api_request_free(req);
    return PL_ERR_INVALID;
}

/* ---- chat -------------------------------------------------------------------------------- */

/* Chat's logprobs (bool) and top_logprobs (0-20) as req->logprobs. */
static int parse_chat_logprobs(json_t *o, const ApiLimits *lim, ApiRequest *r, ApiError *err) {
    int want = 0, top = 0,
        hi = lim->max_logprobs > 0 && lim->max_logprobs < 20 ? lim->max_logprobs : 20;
    if (opt_bool(o, "logprobs", "logprobs", &want, err) < 0 ||
        opt_int_in(o, "top_logprobs", 0, hi, &top, err) < 0)
        return -1;
    if (top > 0 && !want)
        return api_refuse(err, "top_logprobs",
                          "when using 'top_logprobs', 'logprobs' must be true");
    r->logprobs = want ? top : -1;
    return 0;
}

/* Whether a rendered prompt closed its last think block (a template's enable_thinking false
 * writes an empty one): the reasoning has ended before the output starts, which is then all
 * content, constrained from its first token. As vLLM's think-token parsers decide it: the
 * last of <think> and </think> in the prompt is </think>. */
static int reasoning_ended(const char *text, size_t len) {
    for (size_t i = len; i-- > 0;) {
        if (len - i >= 8 && !memcmp(text + i, "</think>", 8))
            return 1;
        if (len - i >= 7 && !memcmp(text + i, "<think>", 7))
            return 0;
    }
    return 0;
}

Status api_parse_chat(const char *body, size_t len, const ApiLimits *lim,
                      const ApiChatTemplate *tmpl, ApiRequest *req, ApiError *err) {
    defaults(req, -1);
    json_t *o = load(body, len, err);
    if (!o) {
        api_request_free(req);
        return PL_ERR_INVALID;
    }
    char *text = NULL;
    size_t text_len = 0;
    if (refuse_unsupported(o, UNSUPPORTED_CHAT, err) ||
        parse_max_tokens(o, "max_tokens", lim, &req->max_tokens, err) < 0 ||
        parse_max_tokens(o, "max_completion_tokens", lim, &req->max_tokens, err) < 0 ||
        parse_common(o, lim, req, err) || parse_chat_logprobs(o, lim, req, err) ||
        api_parse_tools(o, lim, req, err) ||
        api_chat_prompt(tmpl, o, &text, &text_len, err) != PL_OK) {
        free(text);
        json_decref(o);
        api_request_free(req);
        return PL_ERR_INVALID;
    }
    req->best_of = req->n;
    req->prompts = pl_xcalloc(1, sizeof *req->prompts);
    req->prompts[0].text = text;
    req->prompts[0].text_len = text_len;
    req->num_prompts = 1;
    req->is_chat = 1;
    req->reasoning = api_reasoning_parser(lim->reasoning_parser);
    size_t end = text_len - jinja_ws_suffix(text, text_len);
    int ended = reasoning_ended(text, text_len);
    req->in_reasoning = !ended && (req->reasoning == API_REASONING_DEEPSEEK_R1 ||
                                   (end >= 7 && !memcmp(text + end - 7, "<think>", 7)));
    if (req->reasoning && req->constraint && !ended) {
        req->constraint_after = "</think>";
        /* qwen3 with no think block open: the output may open one (or start with content) */
        req->constraint_opener = req->in_reasoning ? NULL : "<think>";
    }
    json_decref(o);
    return PL_OK;
}

/* ---- tokenize and detokenize ----------------------------------------------------------- */

/* The fields of a /tokenize body (beside model). */
static int tokenize_fields(json_t *o, const ApiLimits *lim, const ApiChatTemplate *tmpl,
                           ApiTokenizeRequest *req, ApiError *err) {
    (void)lim;
    int chat = field(o, "messages") != NULL;
    json_t *prompt = field(o, "prompt");
    req->add_special_tokens = !chat;
    if (opt_bool(o, "add_special_tokens", "add_special_tokens", &req->add_special_tokens, err) <
            0 ||
        opt_bool(o, "return_token_strs", "return_token_strs", &req->return_token_strs, err) < 0)
        return -1;
    if (chat)
        return api_chat_prompt(tmpl, o, &req->text, &req->text_len, err) == PL_OK ? 0 : -1;
    if (!json_is_string(prompt))
        return api_refuse(err, "prompt", "'prompt' (a string) or 'messages' is required");
    req->text = text_dup(prompt, &req->text_len);
    return 0;
}

/* The fields of a /detokenize body (beside model). */
static int detokenize_fields(json_t *o, const ApiLimits *lim, const ApiChatTemplate *tmpl,
                             ApiTokenizeRequest *req, ApiError *err) {
    (void)tmpl;
    json_t *tokens = field(o, "tokens");
    if (!json_is_array(tokens))
        return api_refuse(err, "tokens", "'tokens' (a list of token ids) is required");
    size_t n = json_array_size(tokens);
    if (n > INT_MAX)
        return api_refuse(err, "tokens", "'tokens' is too long");
    req->ids = pl_xmalloc((n ? n : 1) * sizeof *req->ids);
    for (size_t i = 0; i < n; i++, req->num_ids++)
        if (token_id(json_array_get(tokens, i), lim, "tokens", &req->ids[i], err))
            return -1;
    return 0;
}

typedef int (*TokenizerFields)(json_t *o, const ApiLimits *lim, const ApiChatTemplate *tmpl,
                               ApiTokenizeRequest *req, ApiError *err);

static Status parse_tokenizer_body(const char *body, size_t len, TokenizerFields fields,
                                   const ApiLimits *lim, const ApiChatTemplate *tmpl,
                                   ApiTokenizeRequest *req, ApiError *err) {
    memset(req, 0, sizeof *req);
    json_t *o = load(body, len, err);
    if (!o)
        return PL_ERR_INVALID;
    int refused = opt_str(o, "model", &req->model, err) < 0 || fields(o, lim, tmpl, req, err) < 0;
    json_decref(o);
    if (!refused)
        return PL_OK;
    api_tokenize_free(req);
    return PL_ERR_INVALID;
}

Status api_parse_tokenize(const char *body, size_t len, const ApiChatTemplate *tmpl,
                          ApiTokenizeRequest *req, ApiError *err) {
    return parse_tokenizer_body(body, len, tokenize_fields, NULL, tmpl, req, err);
}

Status api_parse_detokenize(const char *body, size_t len, const ApiLimits *lim,
                            ApiTokenizeRequest *req, ApiError *err) {
    return parse_tokenizer_body(body, len, detokenize_fields, lim, NULL, req, err);
}

void api_tokenize_free(ApiTokenizeRequest *req) {
    free(req->model);
    free(req->text);
    free(req->ids);
    memset(req, 0, sizeof *req);
}

/* ---- after tokenizing -------------------------------------------------------------------- */

int api_check_length(const ApiLimits *lim, const ApiRequest *req, int prompt_tokens,
                     ApiError *err) {
    int L = lim->max_model_len;
    const char *what = req->is_chat ? "messages" : "prompt";
    if (L <= 0)
        return req->max_tokens < 0 ? 16 : req->max_tokens;
    if (prompt_tokens >= L) {
        api_refuse(err, what,
                   "This model's maximum context length is %d tokens, but the %s has %d tokens, "
                   "which leaves no room for the completion. Please reduce the length of the %s.",
                   L, what, prompt_tokens, what);
        err->code = "context_length_exceeded";
        return -1;
    }
    int max_tokens = req->max_tokens < 0 ? L - prompt_tokens : req->max_tokens;
    if (req->min_tokens > max_tokens) {
        api_refuse(
            err, "min_tokens",
            "'min_tokens' (%d) is more than the %d tokens the completion may have (max-model-len "
            "%d, %d in the %s)",
            req->min_tokens, max_tokens, L, prompt_tokens, what);
        return -1;
    }
    if (req->max_tokens < 0)
        return max_tokens;
    if ((long long)prompt_tokens + req->max_tokens > L) {
        api_refuse(err, "max_tokens",
                   "This model's maximum context length is %d tokens. However, you requested %lld "
                   "tokens (%d in the %s, %d in max_tokens). Please reduce the length of the %s or "
                   "max_tokens.",
                   L, (long long)prompt_tokens + req->max_tokens, prompt_tokens, what,
                   req->max_tokens, what);
        err->code = "context_length_exceeded";
        return -1;
    }
    return req->max_tokens;
}

void api_sampling_params(const ApiRequest *req, SamplingParams *sp) {
    sp->temperature = req->temperature;
    sp->top_p = req->top_p;
    sp->top_k = req->top_k;
    sp->min_p = req->min_p;
    sp->presence_penalty = req->presence_penalty;
    sp->frequency_penalty = req->frequency_penalty;
    sp->repetition_penalty = req->repetition_penalty;
    if (req->has_seed)
        sp->seed = req->seed;
}

void api_request_free(ApiRequest *req) {
    if (!req)
        return;
    free(req->model);
    for (int i = 0; i < req->num_prompts; i++) {
        free(req->prompts[i].text);
        free(req->prompts[i].ids);
    }
    free(req->prompts);
    for (int i = 0; i < req->num_stop; i++)
        free(req->stop[i]);
    free(req->stop_token_ids);
    free(req->allowed_token_ids);
    for (int i = 0; i < req->num_bad_words; i++)
        free(req->bad_words[i]);
    free(req->bad_words);
    free(req->logit_bias_ids);
    free(req->logit_bias_values);
    free(req->user);
    gr_compiled_free(req->constraint);
    memset(req, 0, sizeof *req);
}
