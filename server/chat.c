/* chat.c - chat template families: recognise one from a tokenizer_config.json Jinja source,
 * and render messages the way that family's Hugging Face template does (no Jinja engine:
 * each family is a few lines of C that reproduce the template's output byte for byte).
 *
 *   ChatML   <|im_start|>{role}\n{content}<|im_end|>\n ... <|im_start|>assistant\n
 *   Llama-3  {bos}<|start_header_id|>{role}<|end_header_id|>\n\n{content|trim}<|eot_id|>
 *            ... <|start_header_id|>assistant<|end_header_id|>\n\n
 *   Llama-2  {bos}[INST] {(<<SYS>>\n{system}\n<</SYS>>\n\n + user).strip()} [/INST]
 *             {assistant.strip()} {eos}{bos}[INST] ... [/INST]   (roles must alternate)
 *   Zephyr   <|{role}|>\n{content}{eos}\n ... <|assistant|>\n   (TinyLlama-Chat)
 *
 * "trim" / strip() is Python's str.strip(): Unicode whitespace at both ends. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"

typedef struct {
    char *p;
    size_t len, cap;
} Buf;

static void put(Buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->p = pl_xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void puts_(Buf *b, const char *s) {
    put(b, s, strlen(s));
}

/* Python's str.isspace() for one code point. */
static int py_space(unsigned c) {
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
           c == 0x202f || c == 0x205f || c == 0x3000;
}

/* Decode the UTF-8 character at s (jansson checked it; a broken one counts as one byte, and
 * the NUL terminator is never passed); its length in *n. */
static unsigned utf8_at(const unsigned char *s, size_t *n) {
    size_t len = s[0] < 0xc0 ? 1 : s[0] < 0xe0 ? 2 : s[0] < 0xf0 ? 3 : 4;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xc0) != 0x80)
            len = 1;
    if (len == 1)
        return *n = 1, s[0];
    if ((s[0] & 0xe0) == 0xc0)
        return *n = 2, ((s[0] & 0x1fu) << 6) | (s[1] & 0x3f);
    if ((s[0] & 0xf0) == 0xe0)
        return *n = 3, ((s[0] & 0x0fu) << 12) | ((s[1] & 0x3fu) << 6) | (s[2] & 0x3f);
    return *n = 4,
           ((s[0] & 0x07u) << 18) | ((s[1] & 0x3fu) << 12) | ((s[2] & 0x3fu) << 6) | (s[3] & 0x3f);
}

/* Append s[0..len) with Python-whitespace stripped from both ends. */
static void put_stripped(Buf *b, const char *s, size_t len) {
    const unsigned char *u = (const unsigned char *)s;
    size_t a = 0, z = len, n;
    while (a < z && py_space(utf8_at(u + a, &n)))
        a += n;
    while (z > a) {
        size_t k = z - 1;
        while (k > a && (u[k] & 0xc0) == 0x80) /* back to the lead byte */
            k--;
        if (!py_space(utf8_at(u + k, &n)))
            break;
        z = k;
    }
    put(b, s + a, z - a);
}

static char *fail(Buf *b, ApiError *err, const char *msg) {
    free(b->p);
    api_error_set(err, 400, NULL, "messages", "%s", msg);
    return NULL;
}

/* Llama-2: the template's loop over non-system messages, with the system message folded
 * into the first one. A lone system message renders nothing there; we refuse it. */
static char *render_llama2(Buf *b, const ApiChatMessage *m, int n, const char *bos, const char *eos,
                           ApiError *err) {
    int first = n > 0 && strcmp(m[0].role, "system") == 0;
    if (first == n)
        return fail(b, err, "messages must hold a user message");
    for (int i = first; i < n; i++) {
        int user = strcmp(m[i].role, "user") == 0;
        if (user != ((i - first) % 2 == 0) || (!user && strcmp(m[i].role, "assistant") != 0))
            return fail(b, err,
                        "Conversation roles must alternate user/assistant/user/assistant/...");
        Buf c = {0};
        if (i == first && first) {
            puts_(&c, "<<SYS>>\n");
            put(&c, m[0].content, m[0].content_len);
            puts_(&c, "\n<</SYS>>\n\n");
        }
        put(&c, m[i].content, m[i].content_len);
        if (user) {
            puts_(b, bos);
            puts_(b, "[INST] ");
            put_stripped(b, c.p, c.len);
            puts_(b, " [/INST]");
        } else {
            puts_(b, " ");
            put_stripped(b, c.p, c.len);
            puts_(b, " ");
            puts_(b, eos);
        }
        free(c.p);
    }
    return b->p;
}

char *api_chat_render(ChatTemplate tmpl, const ApiChatMessage *msgs, int num_msgs, const char *bos,
                      const char *eos, size_t *len, ApiError *err) {
    Buf b = {0};
    put(&b, "", 0); /* an empty conversation still gives a string */
    *len = 0;
    for (int i = 0; i < num_msgs; i++)
        if (strcmp(msgs[i].role, "system") && strcmp(msgs[i].role, "user") &&
            strcmp(msgs[i].role, "assistant")) {
            free(b.p);
            api_error_set(err, 400, NULL, "messages",
                          "unknown role '%s' in messages[%d]: expected system, user or assistant",
                          msgs[i].role, i);
            return NULL;
        }
    switch (tmpl) {
        case CHAT_CHATML:
            for (int i = 0; i < num_msgs; i++) {
                puts_(&b, "<|im_start|>");
                puts_(&b, msgs[i].role);
                puts_(&b, "\n");
                put(&b, msgs[i].content, msgs[i].content_len);
                puts_(&b, "<|im_end|>\n");
            }
            puts_(&b, "<|im_start|>assistant\n");
            return *len = b.len, b.p;
        case CHAT_LLAMA3:
            puts_(&b, bos ? bos : "<|begin_of_text|>");
            for (int i = 0; i < num_msgs; i++) {
                puts_(&b, "<|start_header_id|>");
                puts_(&b, msgs[i].role);
                puts_(&b, "<|end_header_id|>\n\n");
                put_stripped(&b, msgs[i].content, msgs[i].content_len);
                puts_(&b, "<|eot_id|>");
            }
            puts_(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
            return *len = b.len, b.p;
        case CHAT_LLAMA2:
            if (!render_llama2(&b, msgs, num_msgs, bos ? bos : "<s>", eos ? eos : "</s>", err))
                return NULL;
            return *len = b.len, b.p;
        case CHAT_ZEPHYR:
            for (int i = 0; i < num_msgs; i++) {
                puts_(&b, "<|");
                puts_(&b, msgs[i].role);
                puts_(&b, "|>\n");
                put(&b, msgs[i].content, msgs[i].content_len);
                puts_(&b, eos ? eos : "</s>");
                puts_(&b, "\n");
            }
            puts_(&b, "<|assistant|>\n");
            return *len = b.len, b.p;
        case CHAT_NONE:
            break;
    }
    free(b.p);
    api_error_set(err, 400, NULL, NULL,
                  "the model has no chat template, so /v1/chat/completions cannot be used "
                  "(set the chat-template config key to chatml, llama3, llama2 or zephyr)");
    return NULL;
}

ChatTemplate api_detect_chat_template(const char *src) {
    if (!src)
        return CHAT_NONE;
    if (strstr(src, "<|im_start|>"))
        return CHAT_CHATML;
    if (strstr(src, "<|start_header_id|>"))
        return CHAT_LLAMA3;
    if (strstr(src, "[INST]"))
        return CHAT_LLAMA2;
    if (strstr(src, "<|user|>") && strstr(src, "<|assistant|>"))
        return CHAT_ZEPHYR;
    return CHAT_NONE;
}

static const struct {
    const char *name;
    ChatTemplate t;
} NAMES[] = {{"chatml", CHAT_CHATML},
             {"llama3", CHAT_LLAMA3},
             {"llama2", CHAT_LLAMA2},
             {"zephyr", CHAT_ZEPHYR},
             {"mistral", CHAT_LLAMA2}};

ChatTemplate api_chat_template_by_name(const char *name) {
    for (size_t i = 0; name && i < sizeof NAMES / sizeof NAMES[0]; i++)
        if (strcmp(name, NAMES[i].name) == 0)
            return NAMES[i].t;
    return CHAT_NONE;
}

const char *api_chat_template_name(ChatTemplate t) {
    for (size_t i = 0; i < sizeof NAMES / sizeof NAMES[0]; i++)
        if (NAMES[i].t == t)
            return NAMES[i].name;
    return "none";
}
