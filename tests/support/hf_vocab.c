/* hf_vocab.c - token bytes from a tokenizer.json (see hf_vocab.h). */
#include "support/hf_vocab.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

/* GPT-2's bytes_to_unicode, inverted: code point -> byte, -1 for none. */
static void byte_table(int *from_cp) {
    for (int i = 0; i < 512; i++)
        from_cp[i] = -1;
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        from_cp[printable ? b : 256 + extra++] = b;
    }
}

/* The next code point of s (UTF-8, assumed valid); advances *s. */
static uint32_t next_cp(const unsigned char **s) {
    const unsigned char *p = *s;
    int n = *p < 0x80 ? 1 : *p >= 0xF0 ? 4 : *p >= 0xE0 ? 3 : 2;
    uint32_t cp = n == 1 ? *p : (uint32_t)(*p & (0x7F >> n));
    for (int i = 1; i < n && p[i]; i++)
        cp = cp << 6 | (p[i] & 0x3F);
    *s += n;
    return cp;
}

/* Token text -> bytes (out holds at least strlen(text) bytes); length, or -1. */
static long decode(const char *text, int byte_level, const int *from_cp, char *out) {
    const unsigned char *s = (const unsigned char *)text;
    unsigned hex;
    if (!byte_level && strlen(text) == 6 && sscanf(text, "<0x%2X>", &hex) == 1) {
        out[0] = (char)hex;
        return 1;
    }
    long n = 0;
    while (*s) {
        const unsigned char *start = s;
        uint32_t cp = next_cp(&s);
        if (byte_level) {
            if (cp >= 512 || from_cp[cp] < 0)
                return -1;
            out[n++] = (char)from_cp[cp];
        } else if (cp == 0x2581) {
            out[n++] = ' ';
        } else {
            memcpy(out + n, start, (size_t)(s - start));
            n += s - start;
        }
    }
    return n;
}

static void set_token(HfVocab *v, int id, const char *bytes, long len) {
    free(v->bytes[id]);
    v->bytes[id] = NULL;
    v->lens[id] = 0;
    if (len > 0) {
        v->bytes[id] = malloc((size_t)len);
        memcpy(v->bytes[id], bytes, (size_t)len);
        v->lens[id] = (size_t)len;
    }
}

int hf_vocab_load(const char *path, HfVocab *v) {
    memset(v, 0, sizeof *v);
    v->eos = -1;
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    json_t *vocab = json_object_get(json_object_get(root, "model"), "vocab");
    json_t *added = json_object_get(root, "added_tokens");
    if (!json_is_object(vocab)) {
        fprintf(stderr, "%s: no model.vocab (%s)\n", path, root ? "" : je.text);
        json_decref(root);
        return -1;
    }
    char *dec = json_dumps(json_object_get(root, "decoder"), JSON_ENCODE_ANY);
    int byte_level = dec && strstr(dec, "ByteLevel");
    free(dec);
    int from_cp[512];
    byte_table(from_cp);
    const char *key;
    json_t *val;
    size_t i;
    json_object_foreach(vocab, key, val) if (json_integer_value(val) >= v->n) v->n =
        (int)json_integer_value(val) + 1;
    json_array_foreach(added, i, val) {
        int id = (int)json_integer_value(json_object_get(val, "id"));
        v->n = id >= v->n ? id + 1 : v->n;
    }
    v->bytes = calloc((size_t)v->n, sizeof *v->bytes);
    v->lens = calloc((size_t)v->n, sizeof *v->lens);
    char *buf = malloc(65536);
    json_object_foreach(vocab, key, val) {
        long len = strlen(key) < 16384 ? decode(key, byte_level, from_cp, buf) : -1;
        set_token(v, (int)json_integer_value(val), buf, len);
    }
    static const char *const eos_names[] = {"</s>", "<|endoftext|>", "<|im_end|>"};
    for (int e = 2; e >= 0; e--)
        json_array_foreach(added, i, val) {
            const char *content = json_string_value(json_object_get(val, "content"));
            int id = (int)json_integer_value(json_object_get(val, "id"));
            if (content && !strcmp(content, eos_names[e]))
                v->eos = id;
        }
    json_array_foreach(added, i, val) {
        const char *content = json_string_value(json_object_get(val, "content"));
        int id = (int)json_integer_value(json_object_get(val, "id"));
        int special = json_is_true(json_object_get(val, "special"));
        set_token(v, id, content, special || !content ? 0 : (long)strlen(content));
    }
    free(buf);
    json_decref(root);
    return 0;
}

void hf_vocab_free(HfVocab *v) {
    for (int i = 0; i < v->n; i++)
        free(v->bytes[i]);
    free(v->bytes);
    free(v->lens);
    memset(v, 0, sizeof *v);
}
