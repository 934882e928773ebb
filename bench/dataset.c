/* dataset.c - the benchmark workloads' common part: defaults, the JSONL dataset (one
 * {"prompt": ..., "max_tokens": ...} object per line), the dispatcher over the kinds and
 * token counting with the project's tokenizer. */
#include <stdlib.h>
#include <string.h>

#include "bench_internal.h"

BenchDatasetOptions bench_dataset_options_default(void) {
    return (BenchDatasetOptions){.kind = BENCH_DS_RANDOM,
                                 .num_prompts = 1000,
                                 .input_len = 1024,
                                 .output_len = 128,
                                 .range_ratio = 0.0,
                                 .prefix_len = 0,
                                 .seed = 0};
}

int ds_count_tokens(const Tokenizer *t, const char *text, int add_special, int32_t **ids_out) {
    int32_t *ids;
    int n;
    if (tok_encode(t, text, strlen(text), add_special, &ids, &n) != PL_OK)
        return -1;
    if (ids_out)
        *ids_out = ids;
    else
        free(ids);
    return n;
}

void ds_add(BenchDataset *d, int *cap, char *prompt, int prompt_len, int output_len, int32_t *ids) {
    if (d->n == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        d->items = pl_xrealloc(d->items, (size_t)*cap * sizeof *d->items);
    }
    d->items[d->n++] = (BenchPrompt){
        .prompt = prompt, .prompt_len = prompt_len, .output_len = output_len, .ids = ids};
}

/* Copy of item k (for oversampling: the same prompt sent again). */
void ds_add_copy(BenchDataset *d, int *cap, int k) {
    BenchPrompt p = d->items[k];
    int32_t *ids = NULL;
    if (p.ids) {
        ids = pl_xmalloc((size_t)p.prompt_len * sizeof *ids);
        memcpy(ids, p.ids, (size_t)p.prompt_len * sizeof *ids);
    }
    ds_add(d, cap, pl_xstrdup(p.prompt), p.prompt_len, p.output_len, ids);
}

/* One JSONL line: {"prompt": "...", "max_tokens": N}; max_tokens defaults to output_len. */
static Status jsonl_line(const BenchDatasetOptions *o, const Tokenizer *t, int keep_ids, int lineno,
                         const char *line, BenchDataset *d, int *cap) {
    json_error_t err;
    json_t *obj = json_loads(line, 0, &err);
    json_t *prompt = json_is_object(obj) ? json_object_get(obj, "prompt") : NULL;
    json_t *max_tokens = json_is_object(obj) ? json_object_get(obj, "max_tokens") : NULL;
    Status st = PL_ERR_FORMAT;
    if (!obj)
        pl_error_set(st, "%s:%d: %s", o->path, lineno, err.text);
    else if (!json_is_string(prompt))
        pl_error_set(st, "%s:%d: \"prompt\" must be a string", o->path, lineno);
    else if (max_tokens && (!json_is_integer(max_tokens) || json_integer_value(max_tokens) < 1 ||
                            json_integer_value(max_tokens) > (1 << 24)))
        pl_error_set(st, "%s:%d: \"max_tokens\" must be a positive integer", o->path, lineno);
    else {
        int32_t *ids = NULL;
        int n = ds_count_tokens(t, json_string_value(prompt), 1, keep_ids ? &ids : NULL);
        if (n < 0)
            pl_error_set(st, "%s:%d: %s", o->path, lineno, pl_error());
        else {
            int out = max_tokens ? (int)json_integer_value(max_tokens) : o->output_len;
            ds_add(d, cap, pl_xstrdup(json_string_value(prompt)), n, out, ids);
            st = PL_OK;
        }
    }
    json_decref(obj);
    return st;
}

static Status load_jsonl(const BenchDatasetOptions *o, const Tokenizer *t, int keep_ids,
                         BenchDataset *d) {
    char *data;
    if (pl_read_file(o->path, &data, NULL) != PL_OK)
        return PL_ERR_IO;
    int cap = 0, lineno = 0;
    Status st = PL_OK;
    for (char *line = data, *next; st == PL_OK && line && *line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        lineno++;
        if (strspn(line, " \t\r") == strlen(line))
            continue;
        if (o->num_prompts_set && d->n >= o->num_prompts)
            break;
        st = jsonl_line(o, t, keep_ids, lineno, line, d, &cap);
    }
    free(data);
    if (st != PL_OK)
        return st;
    if (d->n == 0)
        return pl_error_set(PL_ERR_FORMAT, "%s holds no prompt", o->path);
    for (int k = 0; o->num_prompts_set && d->n < o->num_prompts; k++) /* cycle to N */
        ds_add_copy(d, &cap, k);
    return PL_OK;
}

Status bench_dataset_load(const BenchDatasetOptions *o, const Tokenizer *t, int keep_ids,
                          BenchDataset *out) {
    memset(out, 0, sizeof *out);
    Status st;
    if (o->kind != BENCH_DS_RANDOM && !o->path)
        return pl_error_set(PL_ERR_INVALID, "--dataset-name %s needs --dataset-path",
                            o->kind == BENCH_DS_SHAREGPT ? "sharegpt" : "jsonl");
    if (o->kind == BENCH_DS_RANDOM && o->path)
        return pl_error_set(PL_ERR_INVALID,
                            "--dataset-path is for --dataset-name sharegpt or jsonl, not random");
    switch (o->kind) {
        case BENCH_DS_RANDOM:
            st = ds_load_random(o, t, keep_ids, out);
            break;
        case BENCH_DS_SHAREGPT:
            st = ds_load_sharegpt(o, t, keep_ids, out);
            break;
        default:
            st = load_jsonl(o, t, keep_ids, out);
            break;
    }
    if (st != PL_OK)
        bench_dataset_free(out);
    return st;
}

void bench_dataset_free(BenchDataset *d) {
    for (int i = 0; d && i < d->n; i++) {
        free(d->items[i].prompt);
        free(d->items[i].ids);
    }
    if (d) {
        free(d->items);
        memset(d, 0, sizeof *d);
    }
}
