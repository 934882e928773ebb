/* tp_test_util.h - (test-only) cut-down copies of the bundled stories260K for tensor-parallel
 * tests: its first `vocab` token rows (tied embeddings, so one tensor changes; a vocabulary
 * that does not split evenly over the ranks) and its first `intermediate` MLP columns (gate
 * and up rows, down columns; 168 of 172 splits over 8 ranks), written as a checkpoint folder
 * without a tokenizer (token ids only). Used by test_tensor_parallel and test_tp_cuda. */
#ifndef PAGELLM_TESTS_TP_TEST_UTIL_H
#define PAGELLM_TESTS_TP_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

#define STORIES_DIR "models/stories260K"

static int write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    int ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* Replace `"key": old` by `"key": new` in the config text; 0 on success. */
static int replace_config_int(char *text, size_t cap, const char *key, int old, int value) {
    char from[96], to[96];
    snprintf(from, sizeof from, "\"%s\": %d", key, old);
    snprintf(to, sizeof to, "\"%s\": %d", key, value);
    char *at = strstr(text, from);
    if (!at || strlen(text) - strlen(from) + strlen(to) >= cap)
        return -1;
    memmove(at + strlen(to), at + strlen(from), strlen(at + strlen(from)) + 1);
    memcpy(at, to, strlen(to));
    return 0;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* dir (existing) gets config.json and model.safetensors; 0 on success. */
static int write_cut_model(const char *dir, int vocab, int intermediate) {
    StCheckpoint *ck = NULL;
    if (st_open(STORIES_DIR, &ck) != PL_OK)
        return -1;
    int n = st_count(ck);
    size_t cap = 65536, len = 0, off = 0;
    char *header = malloc(cap);
    size_t *bytes = calloc((size_t)n, sizeof *bytes);
    int64_t(*kept)[2] = calloc((size_t)n, sizeof *kept); /* rows and columns kept (2-D) */
    len += (size_t)snprintf(header + len, cap - len, "{");
    for (int i = 0; i < n; i++) {
        const StTensor *t = st_tensor(ck, i);
        const char *name = t->name;
        kept[i][0] = t->ndim ? t->shape[0] : 1;
        kept[i][1] = t->ndim > 1 ? t->shape[1] : 1;
        const size_t elem = t->nbytes / (size_t)(kept[i][0] * kept[i][1]); /* before the cut */
        if (!strcmp(name, "model.embed_tokens.weight") || !strcmp(name, "lm_head.weight"))
            kept[i][0] = vocab;
        else if (ends_with(name, "mlp.gate_proj.weight") || ends_with(name, "mlp.up_proj.weight"))
            kept[i][0] = intermediate;
        else if (ends_with(name, "mlp.down_proj.weight"))
            kept[i][1] = intermediate;
        bytes[i] = t->ndim <= 2 ? (size_t)(kept[i][0] * kept[i][1]) * elem : t->nbytes;
        len +=
            (size_t)snprintf(header + len, cap - len, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld",
                             i ? "," : "", name, t->dtype_name, (long long)kept[i][0]);
        if (t->ndim == 2)
            len += (size_t)snprintf(header + len, cap - len, ",%lld", (long long)kept[i][1]);
        for (int d = 2; d < t->ndim; d++)
            len += (size_t)snprintf(header + len, cap - len, ",%lld", (long long)t->shape[d]);
        len += (size_t)snprintf(header + len, cap - len, "],\"data_offsets\":[%zu,%zu]}", off,
                                off + bytes[i]);
        off += bytes[i];
    }
    len += (size_t)snprintf(header + len, cap - len, "}");
    while ((8 + len) % 8) /* data 8-byte aligned, as the safetensors library writes it */
        header[len++] = ' ';
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    int ok = f != NULL && len < cap;
    uint64_t hl = len;
    unsigned char le[8];
    for (int b = 0; b < 8; b++)
        le[b] = (unsigned char)(hl >> (8 * b));
    ok = ok && fwrite(le, 1, 8, f) == 8 && fwrite(header, 1, len, f) == len;
    for (int i = 0; ok && i < n; i++) {
        const StTensor *t = st_tensor(ck, i);
        const size_t row_bytes = bytes[i] / (size_t)kept[i][0];
        const size_t stride = t->ndim == 2 ? t->nbytes / (size_t)t->shape[0] : row_bytes;
        for (int64_t r = 0; ok && r < kept[i][0]; r++) /* the kept columns of the kept rows */
            ok = fwrite((const char *)t->data + (size_t)r * stride, 1, row_bytes, f) == row_bytes;
    }
    if (f && fclose(f) != 0)
        ok = 0;
    free(header);
    free(bytes);
    free(kept);
    st_close(ck);
    if (!ok)
        return -1;

    char text[4096];
    snprintf(path, sizeof path, "%s/config.json", STORIES_DIR);
    f = fopen(path, "r");
    size_t got = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f)
        fclose(f);
    text[got] = '\0';
    if (replace_config_int(text, sizeof text, "vocab_size", 512, vocab) ||
        replace_config_int(text, sizeof text, "intermediate_size", 172, intermediate))
        return -1;
    snprintf(path, sizeof path, "%s/config.json", dir);
    return write_text(path, text);
}

#endif
