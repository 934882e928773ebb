/* dataset_sharegpt.c - vLLM's ShareGPT dataset: a JSON array of {"conversations": [{"from":
 * "human", "value": ...}, {"from": "gpt", "value": ...}, ...]}; the conversations are
 * shuffled with the seed, the first human turn is the prompt and the reply after it sets
 * the output length (its token count, or --sharegpt-output-len). vLLM's filter drops pairs
 * whose prompt or reply is under 4 tokens, whose prompt is over 1024 or whose sum is over
 * 2048. Both are counted as vLLM counts them: tokenizer(text) with its special tokens. When
 * fewer pairs pass than --num-prompts, random ones are repeated (vLLM's oversampling). */
#include <stdlib.h>
#include <string.h>

#include "bench_internal.h"

static int is_from(json_t *turn, const char *a, const char *b) {
    const char *from = json_string_value(json_object_get(turn, "from"));
    if (!from)
        from = json_string_value(json_object_get(turn, "role"));
    return from && (!strcmp(from, a) || !strcmp(from, b));
}

/* The first human turn and the model's reply right after it, or 0. */
static int pick_pair(json_t *entry, const char **prompt, const char **reply) {
    json_t *conv = json_object_get(entry, "conversations");
    if (!conv)
        conv = json_object_get(entry, "conversation");
    size_t n = json_array_size(conv);
    for (size_t i = 0; i + 1 < n; i++) {
        json_t *turn = json_array_get(conv, i);
        if (!is_from(turn, "human", "user"))
            continue;
        json_t *next = json_array_get(conv, i + 1);
        *prompt = json_string_value(json_object_get(turn, "value"));
        *reply = json_string_value(json_object_get(next, "value"));
        return is_from(next, "gpt", "assistant") && *prompt && *reply;
    }
    return 0;
}

/* vLLM's is_valid_sequence. */
static int valid_pair(int prompt_len, int output_len, int check_output) {
    return prompt_len >= 4 && (!check_output || output_len >= 4) && prompt_len <= 1024 &&
           prompt_len + output_len <= 2048;
}

Status ds_load_sharegpt(const BenchDatasetOptions *o, const Tokenizer *t, int keep_ids,
                        BenchDataset *d) {
    json_error_t err;
    json_t *root = json_load_file(o->path, 0, &err);
    if (!root)
        return pl_error_set(PL_ERR_FORMAT, "%s:%d: %s", o->path, err.line, err.text);
    if (!json_is_array(root)) {
        json_decref(root);
        return pl_error_set(PL_ERR_FORMAT, "%s: a ShareGPT file is a JSON array of conversations",
                            o->path);
    }
    int total = (int)json_array_size(root), cap = 0;
    int *order = pl_xmalloc((size_t)(total > 0 ? total : 1) * sizeof *order);
    for (int i = 0; i < total; i++)
        order[i] = i;
    BenchRng rng;
    brng_seed(&rng, o->seed);
    brng_shuffle_int(&rng, order, total);
    Status st = PL_OK;
    for (int k = 0; k < total && d->n < o->num_prompts; k++) {
        const char *prompt, *reply;
        if (!pick_pair(json_array_get(root, (size_t)order[k]), &prompt, &reply))
            continue;
        int32_t *ids = NULL;
        int plen = ds_count_tokens(t, prompt, 1, keep_ids ? &ids : NULL);
        int olen =
            o->sharegpt_output_len ? o->sharegpt_output_len : ds_count_tokens(t, reply, 1, NULL);
        if (plen < 0 || olen < 0) {
            free(ids);
            st = pl_error_set(PL_ERR_INVALID, "%s: entry %d: %s", o->path, order[k], pl_error());
            break;
        }
        if (!valid_pair(plen, olen, !o->sharegpt_output_len)) {
            free(ids);
            continue;
        }
        ds_add(d, &cap, bench_utf8_copy(prompt, strlen(prompt)), plen, olen, ids);
    }
    free(order);
    json_decref(root);
    if (st != PL_OK)
        return st;
    if (d->n == 0)
        return pl_error_set(PL_ERR_FORMAT,
                            "%s: no conversation passes the ShareGPT filter (a human turn and a "
                            "reply, 4..1024 prompt tokens, 4+ reply tokens, 2048 in all)",
                            o->path);
    if (d->n < o->num_prompts) {
        int found = d->n;
        fprintf(stderr,
                "pagellm bench: %s has %d usable conversations for %d prompts: repeating random "
                "ones (as vLLM oversamples)\n",
                o->path, found, o->num_prompts);
        while (d->n < o->num_prompts)
            ds_add_copy(d, &cap, (int)brng_int(&rng, 0, found - 1));
    }
    return PL_OK;
}
