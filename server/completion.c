/* completion.c - one /v1/completions or /v1/chat/completions request from admission to
 * the last byte: validation and tokenization on the HTTP thread, one engine request per
 * prompt (n or best_of samples each), events applied on the engine thread (text, stop
 * strings, logprobs), and the answer as one JSON body or as SSE chunks, one per token.
 *
 * A CompletionReq is shared by the HTTP side (the connection), the engine side (until the
 * last engine event of every prompt) and a streaming response; it is freed when all three
 * let go. Its mutex guards everything below `mu`. */
#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server_internal.h"

/* Bytes of SSE a streaming request may have waiting for a client that does not read. */
#define STREAM_BUFFER_LIMIT (4u << 20)

static void choice_append(Choice *ch, const char *text, size_t n) {
    if (ch->len + n + 1 > ch->cap) {
        ch->cap = (ch->len + n + 1) * 2;
        ch->text = pl_xrealloc(ch->text, ch->cap);
    }
    memcpy(ch->text + ch->len, text, n);
    ch->len += n;
    ch->text[ch->len] = '\0';
}

/* Append to the streaming buffer in amortised O(n): what was sent is dropped only once it is
 * at least half of the buffer, and the allocation at least doubles when it grows (a client
 * that reads slowly or not at all leaves megabytes pending). */
static void out_append(CompletionReq *cr, const char *data, size_t n) {
    if (cr->out_sent > 0 && cr->out_sent >= cr->out_len / 2) {
        size_t pending = cr->out_len - cr->out_sent;
        memmove(cr->out, cr->out + cr->out_sent, pending);
        cr->out_len = pending;
        cr->out_sent = 0;
    }
    if (cr->out_len + n + 1 > cr->out_cap) {
        size_t cap = cr->out_cap ? 2 * cr->out_cap : 4096;
        cr->out_cap = cap > cr->out_len + n + 1 ? cap : cr->out_len + n + 1;
        cr->out = pl_xrealloc(cr->out, cr->out_cap);
    }
    memcpy(cr->out + cr->out_len, data, n);
    cr->out_len += n;
    cr->out[cr->out_len] = '\0';
}

static void unref(CompletionReq *cr) {
    pthread_mutex_lock(&cr->mu);
    int left = --cr->refs;
    pthread_mutex_unlock(&cr->mu);
    if (left > 0)
        return;
    for (int i = 0; i < cr->num_choices; i++) {
        Choice *ch = &cr->choices[i];
        free(ch->text);
        for (int t = 0; t < ch->num_tokens && ch->tok_text; t++) {
            free(ch->tok_text[t]);
            free(ch->top_json[t]);
        }
        free(ch->tok_text);
        free(ch->tok_len);
        free(ch->tok_logprob);
        free(ch->top_json);
        free(ch->tok_offset);
        api_output_parser_free(ch->parser);
    }
    for (int i = 0; i < cr->req.num_prompts; i++)
        free(cr->prompt_text ? cr->prompt_text[i] : NULL);
    free(cr->prompt_text);
    free(cr->prompt_len);
    free(cr->choices);
    free(cr->runs);
    free(cr->out);
    api_request_free(&cr->req);
    pthread_mutex_destroy(&cr->mu);
    free(cr);
}

static const char *finish_str(FinishReason r) {
    return r == FINISH_NONE ? NULL : eng_finish_reason_str(r);
}

/* ---- JSON pieces ---------------------------------------------------------------- */

static json_t *bytes_of(const char *s, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_integer((unsigned char)s[i]));
    return a;
}

/* Logprobs of choice tokens [from, to) in the completions or chat shape. */
static json_t *logprobs_json(const CompletionReq *cr, const Choice *ch, int from, int to) {
    if (cr->req.logprobs < 0)
        return json_null();
    if (cr->req.is_chat) {
        json_t *content = json_array();
        for (int t = from; t < to; t++) {
            json_t *top = json_array(), *obj = json_loads(ch->top_json[t], JSON_ALLOW_NUL, NULL);
            const char *k;
            size_t klen;
            json_t *v;
            json_object_keylen_foreach(obj, k, klen, v) {
                json_array_append_new(top, json_pack("{s:s#, s:O, s:o}", "token", k, klen,
                                                     "logprob", v, "bytes", bytes_of(k, klen)));
            }
            json_decref(obj);
            json_array_append_new(
                content, json_pack("{s:s#, s:f, s:o, s:o}", "token", ch->tok_text[t],
                                   ch->tok_len[t], "logprob", (double)ch->tok_logprob[t], "bytes",
                                   bytes_of(ch->tok_text[t], ch->tok_len[t]), "top_logprobs", top));
        }
        return json_pack("{s:o}", "content", content);
    }
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    for (int t = from; t < to; t++) {
        json_array_append_new(tokens, json_stringn(ch->tok_text[t], ch->tok_len[t]));
        json_array_append_new(lps, json_real(ch->tok_logprob[t]));
        json_array_append_new(tops, json_loads(ch->top_json[t], JSON_ALLOW_NUL, NULL));
        json_array_append_new(offs, json_integer((json_int_t)ch->tok_offset[t]));
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps,
                     "top_logprobs", tops, "text_offset", offs);
}

/* Prompt tokens over every prompt and generated tokens over every choice. */
static void count_tokens(const CompletionReq *cr, int *prompt, int *completion) {
    *prompt = *completion = 0;
    for (int i = 0; i < cr->req.num_prompts; i++)
        *prompt += cr->runs[i].num_prompt_tokens;
    for (int i = 0; i < cr->num_choices; i++)
        *completion += cr->choices[i].num_tokens;
}

static json_t *usage_json(const CompletionReq *cr) {
    int prompt, completion;
    count_tokens(cr, &prompt, &completion);
    return json_pack("{s:i, s:i, s:i}", "prompt_tokens", prompt, "completion_tokens", completion,
                     "total_tokens", prompt + completion);
}

static json_t *envelope(const CompletionReq *cr, const char *object) {
    return json_pack("{s:s, s:s, s:I, s:s}", "id", cr->id, "object", object, "created",
                     (json_int_t)cr->created, "model", cr->srv->model_name);
}

/* OpenAI's tool_calls entry of one call; arguments NULL for a streamed start ("") or a
 * fragment only (no id, type, name). */
static json_t *tool_call_json(int index, const char *id, const char *name, const char *args,
                              size_t args_len) {
    json_t *fn = json_object(), *tc = json_object();
    if (index >= 0)
        json_object_set_new(tc, "index", json_integer(index));
    if (id) {
        json_object_set_new(tc, "id", json_string(id));
        json_object_set_new(tc, "type", json_string("function"));
        json_object_set_new(fn, "name", json_string(name));
    }
    json_object_set_new(fn, "arguments", json_stringn(args ? args : "", args ? args_len : 0));
    json_object_set_new(tc, "function", fn);
    return tc;
}

/* A chat choice whose text is split into reasoning, tool calls and content. */
static json_t *parsed_choice(const CompletionReq *cr, const Choice *ch, int index,
                             const char *fin) {
    const ApiRequest *q = &cr->req;
    ApiChatOutput out;
    api_parse_chat_output(q->tool_format, q->reasoning, q->in_reasoning, ch->text ? ch->text : "",
                          ch->len, &out);
    json_t *msg = json_object();
    json_object_set_new(msg, "role", json_string("assistant"));
    json_object_set_new(msg, "content",
                        out.content ? json_stringn(out.content, out.content_len) : json_null());
    if (q->reasoning) { /* vLLM sets both names */
        json_t *r = out.reasoning ? json_stringn(out.reasoning, out.reasoning_len) : json_null();
        json_object_set(msg, "reasoning_content", r);
        json_object_set_new(msg, "reasoning", r);
    }
    if (out.num_calls > 0) {
        json_t *calls = json_array();
        for (int i = 0; i < out.num_calls; i++)
            json_array_append_new(calls, tool_call_json(-1, out.calls[i].id, out.calls[i].name,
                                                        out.calls[i].arguments,
                                                        strlen(out.calls[i].arguments)));
        json_object_set_new(msg, "tool_calls", calls);
        fin = "tool_calls";
    }
    api_chat_output_free(&out);
    return json_pack("{s:i, s:o, s:o, s:s?}", "index", index, "message", msg, "logprobs",
                     logprobs_json(cr, ch, 0, ch->num_tokens), "finish_reason", fin);
}

/* The final body: per prompt, the n best of best_of choices by cumulative logprob. */
static char *final_json(CompletionReq *cr) {
    const ApiRequest *q = &cr->req;
    json_t *root = envelope(cr, q->is_chat ? "chat.completion" : "text_completion");
    json_t *choices = json_array();
    for (int p = 0; p < q->num_prompts; p++) {
        Choice *base = &cr->choices[p * q->best_of];
        int order[q->best_of];
        for (int i = 0; i < q->best_of; i++)
            order[i] = i;
        if (q->best_of > q->n) /* stable selection of the most likely samples */
            for (int i = 1; i < q->best_of; i++)
                for (int j = i;
                     j > 0 && base[order[j]].cum_logprob > base[order[j - 1]].cum_logprob; j--) {
                    int t = order[j];
                    order[j] = order[j - 1];
                    order[j - 1] = t;
                }
        for (int r = 0; r < q->n; r++) {
            Choice *ch = &base[order[r]];
            const char *fin = finish_str(ch->finish);
            json_t *c;
            if (q->is_chat && (q->tool_format || q->reasoning)) {
                c = parsed_choice(cr, ch, p * q->n + r, fin);
            } else if (q->is_chat) {
                c = json_pack("{s:i, s:{s:s, s:s#}, s:o, s:s?}", "index", p * q->n + r, "message",
                              "role", "assistant", "content", ch->text ? ch->text : "", ch->len,
                              "logprobs", logprobs_json(cr, ch, 0, ch->num_tokens), "finish_reason",
                              fin);
            } else {
                size_t echo = q->echo ? cr->prompt_len[p] : 0, len = echo + ch->len;
                char *text = pl_xmalloc(len + 1);
                memcpy(text, cr->prompt_text[p], echo);
                memcpy(text + echo, ch->text ? ch->text : "", ch->len);
                c = json_pack("{s:i, s:s#, s:o, s:s?}", "index", p * q->n + r, "text", text, len,
                              "logprobs", logprobs_json(cr, ch, 0, ch->num_tokens), "finish_reason",
                              fin);
                free(text);
            }
            json_array_append_new(choices, c);
        }
    }
    json_object_set_new(root, "choices", choices);
    json_object_set_new(root, "usage", usage_json(cr));
    char *body = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return body;
}

static void sse(CompletionReq *cr, json_t *chunk) {
    char *s = json_dumps(chunk, JSON_COMPACT);
    json_decref(chunk);
    out_append(cr, "data: ", 6);
    out_append(cr, s, strlen(s));
    out_append(cr, "\n\n", 2);
    free(s);
}

/* A growing byte buffer for hand-written SSE chunks. */
typedef struct {
    char *p;
    size_t len, cap;
} Buf;

static void buf_put(Buf *b, const char *s, size_t n) {
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2 + 256;
        b->p = pl_xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

static void buf_str(Buf *b, const char *s) {
    buf_put(b, s, strlen(s));
}

/* s[0..n) as a JSON string, quotes included: '"', '\\' and control characters escaped,
 * everything else (UTF-8 included) as is, as jansson writes it. */
static void buf_json_string(Buf *b, const char *s, size_t n) {
    buf_put(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        buf_put(b, s + run, i - run);
        char esc[8];
        const char *named = c == '"'    ? "\\\""
                            : c == '\\' ? "\\\\"
                            : c == '\n' ? "\\n"
                            : c == '\r' ? "\\r"
                            : c == '\t' ? "\\t"
                            : c == '\b' ? "\\b"
                            : c == '\f' ? "\\f"
                                        : NULL;
        if (!named) {
            snprintf(esc, sizeof esc, "\\u%04X", c);
            named = esc;
        }
        buf_str(b, named);
        run = i + 1;
    }
    buf_put(b, s + run, n - run);
    buf_put(b, "\"", 1);
}

/* The common streaming chunk (no logprobs), written directly: the engine thread formats one
 * per token, and building it through jansson objects cost several times more. The bytes are
 * those json_dumps(JSON_COMPACT) gives for stream_chunk's objects. */
static void stream_chunk_plain(CompletionReq *cr, int index, Choice *ch, size_t from, size_t to,
                               const char *finish) {
    const ApiRequest *q = &cr->req;
    Buf b = {0};
    char num[64];
    buf_str(&b, "data: {\"id\":");
    buf_json_string(&b, cr->id, strlen(cr->id));
    buf_str(&b, q->is_chat ? ",\"object\":\"chat.completion.chunk\",\"created\":"
                           : ",\"object\":\"text_completion\",\"created\":");
    snprintf(num, sizeof num, "%ld", cr->created);
    buf_str(&b, num);
    buf_str(&b, ",\"model\":");
    buf_json_string(&b, cr->srv->model_name, strlen(cr->srv->model_name));
    snprintf(num, sizeof num, ",\"choices\":[{\"index\":%d,", index);
    buf_str(&b, num);
    const char *text = ch->text ? ch->text + from : "";
    if (q->is_chat) {
        buf_str(&b, "\"delta\":{");
        if (!ch->sent_role) {
            buf_str(&b, "\"role\":\"assistant\"");
            ch->sent_role = 1;
            if (to > from || !finish)
                buf_str(&b, ",");
        }
        if (to > from || !finish) {
            buf_str(&b, "\"content\":");
            buf_json_string(&b, text, to - from);
        }
        buf_str(&b, "},");
    } else {
        buf_str(&b, "\"text\":");
        buf_json_string(&b, text, to - from);
        buf_str(&b, ",");
    }
    buf_str(&b, "\"logprobs\":null,\"finish_reason\":");
    if (finish)
        buf_json_string(&b, finish, strlen(finish));
    else
        buf_str(&b, "null");
    buf_str(&b, "}]}\n\n");
    out_append(cr, b.p, b.len);
    free(b.p);
}

/* One streaming chunk for choice `index` carrying text [from, to) and tokens [t0, t1). */
static void stream_chunk(CompletionReq *cr, int index, Choice *ch, size_t from, size_t to, int t0,
                         int t1, const char *finish) {
    const ApiRequest *q = &cr->req;
    if (q->logprobs < 0) {
        stream_chunk_plain(cr, index, ch, from, to, finish);
        return;
    }
    json_t *root = envelope(cr, q->is_chat ? "chat.completion.chunk" : "text_completion");
    json_t *c;
    if (q->is_chat) {
        json_t *delta = json_object();
        if (!ch->sent_role) {
            json_object_set_new(delta, "role", json_string("assistant"));
            ch->sent_role = 1;
        }
        if (to > from || !finish)
            json_object_set_new(delta, "content", json_stringn(ch->text + from, to - from));
        c = json_pack("{s:i, s:o, s:o, s:s?}", "index", index, "delta", delta, "logprobs",
                      logprobs_json(cr, ch, t0, t1), "finish_reason", finish);
    } else {
        c = json_pack("{s:i, s:s#, s:o, s:s?}", "index", index, "text",
                      ch->text ? ch->text + from : "", to - from, "logprobs",
                      logprobs_json(cr, ch, t0, t1), "finish_reason", finish);
    }
    json_object_set_new(root, "choices", json_pack("[o]", c));
    sse(cr, root);
}

/* Chat streaming through an ApiOutputParser: one chunk per delta it decides. */
typedef struct {
    CompletionReq *cr;
    Choice *ch;
    int index, t0, sent; /* sent: a chunk of this event went out (it carried the logprobs) */
} DeltaOut;

static void parsed_chunk(DeltaOut *o, json_t *delta, const char *finish) {
    if (!o->ch->sent_role) {
        json_object_set_new(delta, "role", json_string("assistant"));
        o->ch->sent_role = 1;
    }
    json_t *root = envelope(o->cr, "chat.completion.chunk");
    json_t *lp = o->sent ? json_null() : logprobs_json(o->cr, o->ch, o->t0, o->ch->num_tokens);
    json_t *c = json_pack("{s:i, s:o, s:o, s:s?}", "index", o->index, "delta", delta, "logprobs",
                          lp, "finish_reason", finish);
    json_object_set_new(root, "choices", json_pack("[o]", c));
    sse(o->cr, root);
    o->sent = 1;
}

static void on_delta(void *ctx, const ApiDelta *d) {
    DeltaOut *o = ctx;
    json_t *delta = json_object(), *text = json_stringn(d->text ? d->text : "", d->len);
    if (d->kind == API_DELTA_REASONING) { /* vLLM sends both names */
        json_object_set(delta, "reasoning_content", text);
        json_object_set(delta, "reasoning", text);
    } else if (d->kind == API_DELTA_CONTENT) {
        json_object_set(delta, "content", text);
    } else {
        json_t *tc = d->kind == API_DELTA_CALL
                         ? tool_call_json(d->index, d->id, d->name, "", 0)
                         : tool_call_json(d->index, NULL, NULL, d->text, d->len);
        json_object_set_new(delta, "tool_calls", json_pack("[o]", tc));
    }
    json_decref(text);
    parsed_chunk(o, delta, NULL);
}

/* Text [from, to) of the choice through its parser; the last chunk says "tool_calls" when the
 * answer called tools. */
static void stream_parsed(CompletionReq *cr, int index, Choice *ch, size_t from, size_t to, int t0,
                          const char *fin) {
    DeltaOut o = {cr, ch, index, t0, 0};
    api_output_parser_feed(ch->parser, ch->text ? ch->text + from : "", to - from, fin != NULL,
                           on_delta, &o);
    if (fin)
        parsed_chunk(&o, json_object(),
                     api_output_parser_calls(ch->parser) > 0 ? "tool_calls" : fin);
    else if (!o.sent && cr->req.logprobs >= 0 && ch->num_tokens > t0)
        parsed_chunk(&o, json_object(), NULL);
}

/* ---- engine side ------------------------------------------------------------------ */

/* Text of the choice that may be streamed now: everything once finished, else all but the
 * last (longest stop string - 1) bytes, cut back to a UTF-8 character boundary. */
static size_t streamable(const CompletionReq *cr, const Choice *ch) {
    if (ch->finish != FINISH_NONE || cr->req.num_stop == 0)
        return ch->len;
    size_t hold = 0;
    for (int i = 0; i < cr->req.num_stop; i++)
        if (cr->req.stop_len[i] > hold + 1)
            hold = cr->req.stop_len[i] - 1;
    if (ch->len <= hold)
        return ch->sent;
    size_t end = ch->len - hold;
    while (end > ch->sent && ((unsigned char)ch->text[end] & 0xC0) == 0x80)
        end--;
    return end > ch->sent ? end : ch->sent;
}

/* Look for a stop string in the text added since `old_len`; cut the text there (after it with
 * include_stop_str_in_output). */
static int apply_stop_strings(const CompletionReq *cr, Choice *ch, size_t old_len) {
    size_t best = (size_t)-1, best_len = 0;
    for (int i = 0; i < cr->req.num_stop; i++) {
        size_t n = cr->req.stop_len[i];
        size_t from = old_len >= n ? old_len - n + 1 : 0;
        char *hit =
            ch->len >= from ? memmem(ch->text + from, ch->len - from, cr->req.stop[i], n) : NULL;
        if (hit && (size_t)(hit - ch->text) < best) {
            best = (size_t)(hit - ch->text);
            best_len = n;
        }
    }
    if (best == (size_t)-1)
        return 0;
    if (cr->req.include_stop_str_in_output)
        best += best_len;
    ch->len = best;
    ch->text[best] = '\0';
    return 1;
}

/* The text of token `id` right after token `prev`, as it reads in the sequence (a
 * SentencePiece word start keeps its space, which decoding it alone would strip); its length
 * in *len. */
static char *token_text_after(const Tokenizer *tok, int32_t prev, int32_t id, size_t *len) {
    if (prev < 0)
        return tok_decode(tok, &id, 1, 0, len);
    int32_t pair[2] = {prev, id};
    size_t nb, nh;
    char *both = tok_decode(tok, pair, 2, 0, &nb), *head = tok_decode(tok, &prev, 1, 0, &nh);
    size_t skip = nh <= nb && memcmp(both, head, nh) == 0 ? nh : 0;
    *len = nb - skip;
    char *out = pl_xmalloc(*len + 1);
    memcpy(out, both + skip, *len + 1);
    free(both);
    free(head);
    return out;
}

static void record_logprobs(CompletionReq *cr, Choice *ch, const EngEvent *ev, size_t offset) {
    int t = ch->num_tokens - 1;
    if (t >= ch->lp_cap) {
        ch->lp_cap = ch->lp_cap ? 2 * ch->lp_cap : 16;
        ch->tok_text = pl_xrealloc(ch->tok_text, (size_t)ch->lp_cap * sizeof(char *));
        ch->tok_len = pl_xrealloc(ch->tok_len, (size_t)ch->lp_cap * sizeof(size_t));
        ch->tok_logprob = pl_xrealloc(ch->tok_logprob, (size_t)ch->lp_cap * sizeof(float));
        ch->top_json = pl_xrealloc(ch->top_json, (size_t)ch->lp_cap * sizeof(char *));
        ch->tok_offset = pl_xrealloc(ch->tok_offset, (size_t)ch->lp_cap * sizeof(size_t));
    }
    ch->tok_text[t] = pl_xmalloc(ev->text_len + 1);
    memcpy(ch->tok_text[t], ev->text, ev->text_len + 1);
    ch->tok_len[t] = ev->text_len;
    ch->tok_logprob[t] = ev->logprob;
    ch->tok_offset[t] = offset;
    const Tokenizer *tok = eng_tokenizer(cr->srv->engine);
    json_t *top = json_object();
    int k = cr->req.logprobs > 0 ? cr->req.logprobs : 0;
    for (int i = 0; i < ev->num_top && i < k; i++) {
        size_t n;
        char *s = token_text_after(tok, ch->prev_token, ev->top_ids[i], &n);
        json_object_setn_new(top, s, n, json_real(ev->top_logprobs[i]));
        free(s);
    }
    ch->top_json[t] = json_dumps(top, JSON_COMPACT);
    json_decref(top);
}

static void finish_request(Server *s, CompletionReq *cr) {
    cr->done = 1;
    if (cr->req.stream) {
        if (cr->req.include_usage) {
            json_t *root =
                envelope(cr, cr->req.is_chat ? "chat.completion.chunk" : "text_completion");
            json_object_set_new(root, "choices", json_array());
            json_object_set_new(root, "usage", usage_json(cr));
            sse(cr, root);
        }
        out_append(cr, "data: [DONE]\n\n", 14);
    } else {
        free(cr->out);
        cr->out = final_json(cr);
        cr->out_len = strlen(cr->out);
        cr->out_cap = cr->out_len + 1;
        cr->out_sent = 0;
    }
    int prompt, generated;
    count_tokens(cr, &prompt, &generated);
    double now = pl_now();
    MetRequestTimes t = {.queue_seconds = cr->queue_seconds,
                         .ttft_seconds =
                             cr->t_first_token > 0 ? cr->t_first_token - cr->t_arrival : -1,
                         .e2e_seconds = now - cr->t_arrival,
                         .prompt_tokens = prompt,
                         .generation_tokens = generated,
                         .finish_reason = finish_str(cr->choices[0].finish)};
    met_request_done(s->metrics, &t);
}

void completion_on_event(Server *s, const EngEvent *ev) {
    PromptRun *run = ev->user;
    CompletionReq *cr = run->cr;
    pthread_mutex_lock(&cr->mu);
    const ApiRequest *q = &cr->req;
    Choice *ch = &cr->choices[run->prompt_index * q->best_of + ev->index];
    int was_open = ch->finish == FINISH_NONE;
    if (ev->queue_seconds >= 0 && (cr->queue_seconds < 0 || ev->queue_seconds > cr->queue_seconds))
        cr->queue_seconds = ev->queue_seconds; /* the longest wait of its prompts */
    if (was_open) {
        size_t old_len = ch->len, sent_before = ch->sent;
        int t0 = ch->num_tokens;
        if (ev->token >= 0) {
            double now = pl_now();
            if (cr->t_first_token == 0)
                cr->t_first_token = now;
            else if (cr->t_last_token > 0)
                met_observe_itl(s->metrics, now - cr->t_last_token);
            cr->t_last_token = now;
            ch->num_tokens++;
            ch->cum_logprob += ev->logprob;
            if (q->logprobs >= 0)
                record_logprobs(cr, ch, ev, old_len);
            ch->prev_token = ev->token;
        }
        choice_append(ch, ev->text, ev->text_len);
        /* stop strings, like stop tokens, act once min_tokens are generated (vLLM) */
        if (ch->num_tokens >= q->min_tokens && apply_stop_strings(cr, ch, old_len)) {
            ch->finish = FINISH_STOP;
            ch->stopped_by_string = 1;
        } else if (ev->finish != FINISH_NONE) {
            ch->finish = ev->finish;
        }
        if (q->stream) {
            int index = run->prompt_index * q->n + ev->index;
            if (q->echo && !ch->echoed) { /* the prompt first, in a chunk of its own */
                int p = run->prompt_index;
                Choice prompt = {.text = cr->prompt_text[p], .len = cr->prompt_len[p]};
                stream_chunk_plain(cr, index, &prompt, 0, prompt.len, NULL);
                ch->echoed = 1;
            }
            size_t end = streamable(cr, ch);
            const char *fin = finish_str(ch->finish);
            if (ch->parser)
                stream_parsed(cr, index, ch, sent_before, end, t0, fin);
            else if (end > sent_before || fin || (q->logprobs >= 0 && ch->num_tokens > t0))
                stream_chunk(cr, index, ch, sent_before, end, t0, ch->num_tokens, fin);
            ch->sent = end;
            if (cr->out_len - cr->out_sent > STREAM_BUFFER_LIMIT && !cr->client_gone) {
                /* the client does not read: stop generating for it rather than buffer
                 * without bound (its connection closes at the request timeout) */
                cr->client_gone = 1;
                for (int i = 0; i < q->num_prompts; i++)
                    eng_abort(s->engine, cr->runs[i].engine_id);
            }
        }
        if (ch->finish != FINISH_NONE)
            cr->num_done++;
    }
    int engine_done = 0;
    if (ev->finish != FINISH_NONE && ++run->num_finished == q->best_of)
        engine_done = 1;
    else if (!run->aborted && ch->stopped_by_string) { /* all samples stopped by strings? */
        int open = 0;
        for (int i = 0; i < q->best_of; i++)
            open += cr->choices[run->prompt_index * q->best_of + i].finish == FINISH_NONE;
        if (!open) {
            run->aborted = 1;
            eng_abort(s->engine, run->engine_id);
        }
    }
    int all_engine_done = 0;
    if (engine_done) {
        all_engine_done = 1;
        for (int i = 0; i < q->num_prompts; i++)
            all_engine_done &= cr->runs[i].num_finished == q->best_of;
    }
    if (all_engine_done) /* free the seats before the client can see its answer end, so a
                          * next request sent on that answer finds them free */
        atomic_fetch_sub(&s->in_flight_seqs, cr->num_choices);
    if (cr->num_done == cr->num_choices && !cr->done)
        finish_request(s, cr);
    if (cr->suspended && (cr->done || q->stream)) {
        cr->suspended = 0;
        MHD_resume_connection(cr->conn);
    }
    pthread_mutex_unlock(&cr->mu);
    if (all_engine_done) {
        atomic_fetch_sub(&s->in_flight, 1);
        unref(cr); /* the engine side lets go */
    }
}

/* ---- HTTP side -------------------------------------------------------------------- */

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    CompletionReq *cr = cls;
    pthread_mutex_lock(&cr->mu);
    ssize_t n;
    if (cr->out_sent < cr->out_len) {
        size_t left = cr->out_len - cr->out_sent;
        n = (ssize_t)(left < max ? left : max);
        memcpy(buf, cr->out + cr->out_sent, (size_t)n);
        cr->out_sent += (size_t)n;
    } else if (cr->done) {
        n = MHD_CONTENT_READER_END_OF_STREAM;
    } else { /* nothing yet: park the connection until the engine has a token */
        cr->suspended = 1;
        MHD_suspend_connection(cr->conn);
        n = 0;
    }
    pthread_mutex_unlock(&cr->mu);
    return n;
}

static void stream_free(void *cls) {
    unref(cls);
}

enum MHD_Result completion_resume(CompletionReq *cr, struct MHD_Connection *conn) {
    pthread_mutex_lock(&cr->mu);
    char *body = cr->out ? pl_xstrdup(cr->out) : pl_xstrdup("{}");
    pthread_mutex_unlock(&cr->mu);
    return srv_send_json(cr->srv, conn, 200, body);
}

void completion_abandon(CompletionReq *cr) {
    pthread_mutex_lock(&cr->mu);
    int abort_runs = !cr->done;
    if (abort_runs)
        cr->client_gone = 1;
    pthread_mutex_unlock(&cr->mu);
    if (abort_runs) /* the client left: free its KV blocks at the next step */
        for (int i = 0; i < cr->req.num_prompts; i++)
            eng_abort(cr->srv->engine, cr->runs[i].engine_id);
}

void completion_release_http(CompletionReq *cr, int completed_ok) {
    if (!completed_ok)
        completion_abandon(cr);
    unref(cr);
}

/* Tokenize prompt p (text or ids) and check it against max-model-len; fills ids/n
 * (malloc'd) and the prompt's resolved max_tokens. */
static int tokenize_prompt(Server *s, const ApiRequest *q, int p, int32_t **ids, int *n,
                           int *max_tokens, int *truncated, ApiError *err) {
    const ApiPrompt *ap = &q->prompts[p];
    const Tokenizer *tok = eng_tokenizer(s->engine);
    if (ap->text) {
        if (!tok) {
            api_error_set(err, 400, "invalid_request_error", "prompt",
                          "the model has no tokenizer: send token ids");
            return 0;
        }
        if (tok_encode(tok, ap->text, ap->text_len, !q->is_chat, ids, n) != PL_OK) {
            api_error_set(err, 400, "invalid_request_error", "prompt", "%s", pl_error());
            return 0;
        }
    } else {
        *n = ap->num_ids;
        *ids = pl_xmalloc((size_t)(*n ? *n : 1) * sizeof(int32_t));
        memcpy(*ids, ap->ids, (size_t)*n * sizeof(int32_t));
    }
    ApiLimits lim = {.max_model_len = eng_max_model_len(s->engine)};
    const int keep = q->truncate_prompt_tokens < 0 ? lim.max_model_len : q->truncate_prompt_tokens;
    *truncated = keep > 0 && *n > keep; /* vLLM's truncate_prompt_tokens: the last `keep` */
    if (*truncated) {
        memmove(*ids, *ids + (*n - keep), (size_t)keep * sizeof **ids);
        *n = keep;
    }
    if (*n == 0) {
        api_error_set(err, 400, "invalid_request_error", "prompt", "the prompt is empty");
    } else if ((*max_tokens = api_check_length(&lim, q, *n, err)) > 0) {
        return 1;
    }
    free(*ids);
    *ids = NULL;
    return 0;
}

/* q's bad words as token sequences, one after another in bw->ids, their lengths in bw->lens, as
 * vLLM makes them: each word without its leading whitespace, and that text after one space
 * when it gives as many tokens and another first token (the word inside a text); a text the
 * tokenizer gives no tokens is left out. */
typedef struct {
    int32_t *ids, *lens;
    int n;
} BadWordIds;

/* text's tokens (none when it has none or fails to encode) into *ids, their count returned. */
static int encode_plain(const Tokenizer *tok, const char *text, int32_t **ids) {
    int n = 0;
    *ids = NULL;
    if (tok_encode(tok, text, strlen(text), 0, ids, &n) != PL_OK)
        n = 0;
    return n;
}

static void bad_word_add(BadWordIds *bw, size_t *total, const int32_t *ids, int n) {
    bw->ids = pl_xrealloc(bw->ids, (*total + (size_t)n) * sizeof *bw->ids);
    memcpy(bw->ids + *total, ids, (size_t)n * sizeof *ids);
    *total += (size_t)n;
    bw->lens[bw->n++] = n;
}

static void bad_word_ids(const Tokenizer *tok, const ApiRequest *q, BadWordIds *bw) {
    size_t total = 0;
    bw->n = 0;
    bw->ids = NULL;
    bw->lens = pl_xmalloc((size_t)(2 * q->num_bad_words + 1) * sizeof(int32_t));
    for (int i = 0; i < q->num_bad_words; i++) {
        const char *word = q->bad_words[i];
        while (isspace((unsigned char)*word))
            word++;
        char *spaced = pl_xmalloc(strlen(word) + 2);
        spaced[0] = ' ';
        strcpy(spaced + 1, word);
        int32_t *plain, *inside;
        int np = encode_plain(tok, word, &plain), ni = encode_plain(tok, spaced, &inside);
        if (np > 0)
            bad_word_add(bw, &total, plain, np);
        if (ni > 0 && ni == np && inside[0] != plain[0])
            bad_word_add(bw, &total, inside, ni);
        free(plain);
        free(inside);
        free(spaced);
    }
}

/* The engine's parameters of one prompt of q; `bias` holds q's logit_bias and `bw` its bad
 * words (the engine copies both). */
static GenerateParams engine_params(const ApiRequest *q, int max_tokens, const LogitBias *bias,
                                    const BadWordIds *bw) {
    GenerateParams gp = {.max_tokens = max_tokens,
                         .min_tokens = q->min_tokens,
                         .logit_bias = bias,
                         .num_logit_bias = q->num_logit_bias,
                         .ignore_eos = q->ignore_eos,
                         .keep_special_tokens = !q->skip_special_tokens,
                         .n = q->best_of,
                         .logprobs = q->logprobs >= 0 || q->best_of > q->n,
                         .top_logprobs = q->logprobs > 0 ? q->logprobs : 0,
                         .stop_token_ids = q->stop_token_ids,
                         .num_stop_token_ids = q->num_stop_token_ids,
                         .allowed_token_ids = q->allowed_token_ids,
                         .num_allowed_token_ids = q->num_allowed_token_ids,
                         .bad_words = bw->ids,
                         .bad_word_lens = bw->lens,
                         .num_bad_words = bw->n,
                         .sampling = sampling_params_default(),
                         .constraint = q->constraint,
                         .constraint_after = q->constraint_after,
                         .constraint_opener = q->constraint_opener};
    SamplingParams *sp = &gp.sampling;
    api_sampling_params(q, sp);
    if (!q->has_seed) { /* an unseeded request still needs its own random stream */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        sp->seed = ((uint64_t)ts.tv_sec * 1000000007ULL) ^ (uint64_t)ts.tv_nsec ^
                   ((uint64_t)(uintptr_t)q << 17);
    }
    return gp;
}

static CompletionReq *new_request(Server *s, struct MHD_Connection *conn, ApiRequest *q) {
    CompletionReq *cr = pl_xcalloc(1, sizeof *cr);
    cr->srv = s;
    cr->conn = conn;
    cr->req = *q;
    memset(q, 0, sizeof *q);
    pthread_mutex_init(&cr->mu, NULL);
    uint64_t x = atomic_fetch_add(&s->next_id, 1) + 0x9e3779b97f4a7c15ULL * (uint64_t)time(NULL);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL; /* splitmix64: ids that do not look serial */
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    snprintf(cr->id, sizeof cr->id, "%s-%016llx", cr->req.is_chat ? "chatcmpl" : "cmpl",
             (unsigned long long)(x ^ (x >> 31)));
    cr->created = (long)time(NULL);
    cr->t_arrival = pl_now();
    cr->queue_seconds = -1;
    cr->runs = pl_xcalloc((size_t)cr->req.num_prompts, sizeof *cr->runs);
    cr->prompt_text = pl_xcalloc((size_t)cr->req.num_prompts, sizeof(char *));
    cr->prompt_len = pl_xcalloc((size_t)cr->req.num_prompts, sizeof(size_t));
    cr->num_choices = cr->req.num_prompts * cr->req.best_of;
    cr->choices = pl_xcalloc((size_t)cr->num_choices, sizeof *cr->choices);
    if (cr->req.stream && (cr->req.tool_format || cr->req.reasoning))
        for (int i = 0; i < cr->num_choices; i++)
            cr->choices[i].parser =
                api_output_parser_new(cr->req.tool_format, cr->req.reasoning, cr->req.in_reasoning);
    cr->refs = 1; /* HTTP side */
    return cr;
}

/* Admission by sequences (issue 34): a request runs prompts x best_of of them. One above
 * max-seqs-per-request, or above max-queue-len (it could never be admitted), is refused with
 * 400 naming the field that makes it large; one that does not fit beside the sequences in
 * flight gets 503. The sequences are reserved here; the engine side releases them when its
 * last run ends (completion_on_event), or completion_start when nothing reached the engine. */
static int check_sequences(Server *s, const ApiRequest *q, ApiError *err) {
    long long seqs = (long long)q->num_prompts * q->best_of;
    int per_request = s->cfg->max_seqs_per_request, queue = s->cfg->max_queue_len;
    int cap = per_request < queue ? per_request : queue;
    if (seqs > cap) {
        const char *field = q->best_of > q->n ? "best_of" : q->n > 1 ? "n" : "prompt";
        api_error_set(err, 400, "invalid_request_error", field,
                      "the request runs %lld sequences (%d prompts x best_of %d), more than "
                      "%s (%d)",
                      seqs, q->num_prompts, q->best_of,
                      cap == per_request ? "max-seqs-per-request" : "max-queue-len", cap);
        return 0;
    }
    int cur = atomic_load(&s->in_flight_seqs);
    do {
        if (cur + seqs > queue) {
            api_error_set(err, 503, "server_error", NULL,
                          "the server is at capacity (max-queue-len %d sequences); retry later",
                          queue);
            return 0;
        }
    } while (!atomic_compare_exchange_weak(&s->in_flight_seqs, &cur, cur + (int)seqs));
    return 1;
}

static int check_request(Server *s, const ApiRequest *q, ApiError *err) {
    if (!srv_model_known(s, q->model, err))
        return 0;
    if (q->stream && q->best_of > q->n) {
        api_error_set(err, 400, "invalid_request_error", "best_of",
                      "best_of must equal n when streaming");
        return 0;
    }
    if (q->echo && q->logprobs >= 0) {
        api_error_set(err, 400, "invalid_request_error", "echo",
                      "echo together with logprobs is not supported");
        return 0;
    }
    if (q->num_bad_words > 0 && !eng_tokenizer(s->engine)) {
        api_error_set(err, 400, "invalid_request_error", "bad_words",
                      "'bad_words' needs the model's tokenizer (tokenizer.json)");
        return 0;
    }
    return check_sequences(s, q, err);
}

enum MHD_Result completion_start(Server *s, struct MHD_Connection *conn, int is_chat,
                                 const char *body, size_t len, CompletionReq **ctx) {
    *ctx = NULL;
    const ModelConfig *mc = eng_model_config(s->engine);
    ApiLimits lim = {.max_model_len = eng_max_model_len(s->engine),
                     .max_n = eng_max_num_seqs(s->engine) < 128 ? eng_max_num_seqs(s->engine) : 128,
                     .vocab_size = mc->vocab_size,
                     .max_logprobs = 20,
                     .tool_call_parser = s->cfg->tool_call_parser,
                     .enable_auto_tool_choice = s->cfg->enable_auto_tool_choice,
                     .reasoning_parser = s->cfg->reasoning_parser};
    ApiRequest q;
    ApiError err;
    Status st = is_chat ? api_parse_chat(body, len, &lim, s->chat_template, &q, &err)
                        : api_parse_completion(body, len, &lim, &q, &err);
    if (st != PL_OK)
        return srv_send_error(s, conn, &err);
    if (!check_request(s, &q, &err)) {
        api_request_free(&q);
        return srv_send_error(s, conn, &err);
    }
    /* tokenize everything before anything reaches the engine */
    int np = q.num_prompts;
    int32_t **ids = pl_xcalloc((size_t)np, sizeof *ids);
    int *lens = pl_xcalloc((size_t)np, sizeof *lens);
    int *max_tokens = pl_xcalloc((size_t)np, sizeof *max_tokens);
    int *truncated = pl_xcalloc((size_t)np, sizeof *truncated);
    int ok = 1;
    for (int p = 0; p < np && ok; p++)
        ok = tokenize_prompt(s, &q, p, &ids[p], &lens[p], &max_tokens[p], &truncated[p], &err);
    CompletionReq *cr = NULL;
    if (ok) {
        cr = new_request(s, conn, &q);
        const Tokenizer *tok = eng_tokenizer(s->engine);
        for (int p = 0; p < np; p++) {
            const ApiPrompt *ap = &cr->req.prompts[p];
            if (ap->text && !truncated[p]) {
                cr->prompt_len[p] = ap->text_len;
                cr->prompt_text[p] =
                    memcpy(pl_xmalloc(ap->text_len + 1), ap->text, ap->text_len + 1);
            } else {
                /* token ids, or a truncated prompt: what the model reads */
                cr->prompt_text[p] =
                    tok ? tok_decode(tok, ids[p], lens[p], 1, &cr->prompt_len[p]) : pl_xstrdup("");
            }
        }
        cr->refs++; /* the engine side */
        atomic_fetch_add(&s->in_flight, 1);
        LogitBias *bias = pl_xmalloc((size_t)(cr->req.num_logit_bias + 1) * sizeof *bias);
        for (int i = 0; i < cr->req.num_logit_bias; i++)
            bias[i] = (LogitBias){cr->req.logit_bias_ids[i], cr->req.logit_bias_values[i]};
        BadWordIds bw;
        bad_word_ids(tok, &cr->req, &bw);
        for (int p = 0; p < np && ok; p++) {
            PromptRun *run = &cr->runs[p];
            run->cr = cr;
            run->prompt_index = p;
            run->num_prompt_tokens = lens[p];
            for (int c = 0; c < cr->req.best_of; c++) /* logprob keys read after this */
                cr->choices[p * cr->req.best_of + c].prev_token = ids[p][lens[p] - 1];
            EngRequest er = {.prompt = ids[p],
                             .num_prompt = lens[p],
                             .params = engine_params(&cr->req, max_tokens[p], bias, &bw),
                             .user = run};
            if (eng_add_request(s->engine, &er, &run->engine_id) != PL_OK) {
                api_error_set(&err, 400, "invalid_request_error", "prompt", "%s", pl_error());
                ok = 0;
                /* the prompts already queued are aborted; their events release the engine
                 * side as usual, and the ones never queued count as finished */
                for (int r = p; r < np; r++)
                    cr->runs[r].num_finished = cr->req.best_of;
                for (int r = 0; r < p; r++)
                    eng_abort(s->engine, cr->runs[r].engine_id);
                if (p == 0) {
                    atomic_fetch_sub(&s->in_flight_seqs, cr->num_choices);
                    atomic_fetch_sub(&s->in_flight, 1);
                    cr->refs--;
                }
            }
        }
        free(bias);
        free(bw.ids);
        free(bw.lens);
    }
    for (int p = 0; p < np; p++)
        free(ids[p]);
    free(ids);
    free(lens);
    free(max_tokens);
    free(truncated);
    if (!ok) {
        if (!cr) /* nothing reached the engine: its sequences are not in flight */
            atomic_fetch_sub(&s->in_flight_seqs, q.num_prompts * q.best_of);
        api_request_free(&q);
        if (cr) {
            cr->done = 1;
            cr->client_gone = 1;
            unref(cr);
        }
        return srv_send_error(s, conn, &err);
    }
    *ctx = cr;
    if (cr->req.stream) {
        pthread_mutex_lock(&cr->mu);
        cr->refs++; /* the streaming response */
        pthread_mutex_unlock(&cr->mu);
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384,
                                                                   stream_reader, cr, stream_free);
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        cors_add_headers(s, conn, r);
        enum MHD_Result ret = MHD_queue_response(conn, 200, r);
        MHD_destroy_response(r);
        met_http_request(s->metrics, 200);
        return ret;
    }
    pthread_mutex_lock(&cr->mu);
    int done = cr->done;
    if (!done) { /* the engine thread resumes the connection when the answer is ready */
        cr->suspended = 1;
        MHD_suspend_connection(conn);
    }
    pthread_mutex_unlock(&cr->mu);
    return done ? completion_resume(cr, conn) : MHD_YES;
}
