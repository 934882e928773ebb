/* tp_test_util.h - (test-only) a model whose vocabulary does not split evenly over the
 * tensor-parallel ranks: the bundled stories260K cut to its first `vocab` token rows (tied
 * embeddings, so one tensor changes), written as a checkpoint folder without a tokenizer
 * (token ids only). Used by test_tensor_parallel and test_tp_cuda. */
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

/* dir (existing) gets config.json and model.safetensors; 0 on success. */
static int write_cut_vocab_model(const char *dir, int vocab) {
    StCheckpoint *ck = NULL;
    if (st_open(STORIES_DIR, &ck) != PL_OK)
        return -1;
    int n = st_count(ck);
    size_t cap = 65536, len = 0, off = 0;
    char *header = malloc(cap);
    size_t *bytes = calloc((size_t)n, sizeof *bytes);
    len += (size_t)snprintf(header + len, cap - len, "{");
    for (int i = 0; i < n; i++) {
        const StTensor *t = st_tensor(ck, i);
        int64_t rows = t->shape[0];
        bytes[i] = t->nbytes;
        if (!strcmp(t->name, "model.embed_tokens.weight") || !strcmp(t->name, "lm_head.weight")) {
            bytes[i] = t->nbytes / (size_t)rows * (size_t)vocab;
            rows = vocab;
        }
        len +=
            (size_t)snprintf(header + len, cap - len, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld",
                             i ? "," : "", t->name, t->dtype_name, (long long)rows);
        for (int d = 1; d < t->ndim; d++)
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
    for (int i = 0; ok && i < n; i++)
        ok = fwrite(st_tensor(ck, i)->data, 1, bytes[i], f) == bytes[i];
    if (f && fclose(f) != 0)
        ok = 0;
    free(header);
    free(bytes);
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
    char *at = strstr(text, "\"vocab_size\": 512");
    if (!at)
        return -1;
    char out[4200];
    snprintf(out, sizeof out, "%.*s\"vocab_size\": %d%s", (int)(at - text), text, vocab,
             at + strlen("\"vocab_size\": 512"));
    snprintf(path, sizeof path, "%s/config.json", dir);
    return write_text(path, out);
}

#endif
