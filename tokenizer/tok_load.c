/* tok_load.c - reading tokenizer.json (+ tokenizer_config.json) into a Tokenizer: added tokens,
 * the model (tok_bpe.c), the pipeline components, the post-processor flattened to one template,
 * and BOS/EOS settings. Every error names the file and the part that is wrong. */
#include "tok_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static Status load_json(const char *path, size_t flags, json_t **out) {
    char *data;
    size_t len;
    *out = NULL;
    Status st = pl_read_file(path, &data, &len);
    if (st)
        return st;
    json_error_t err;
    json_t *root = json_loadb(data, len, JSON_ALLOW_NUL | flags, &err);
    free(data);
    if (!root)
        return pl_error_set(PL_ERR_FORMAT, "%s:%d:%d: invalid JSON: %s", path, err.line, err.column,
                            err.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return pl_error_set(PL_ERR_FORMAT, "%s: top level is not a JSON object", path);
    }
    *out = root;
    return PL_OK;
}

static Status parse_added(Tokenizer *t, const json_t *arr, const char *path) {
    if (!arr || json_is_null(arr))
        return PL_OK;
    if (!json_is_array(arr))
        return pl_error_set(PL_ERR_FORMAT, "%s: added_tokens is not an array", path);
    t->added = pl_xcalloc(json_array_size(arr) + 1, sizeof *t->added);
    for (size_t i = 0; i < json_array_size(arr); i++) {
        json_t *o = json_array_get(arr, i), *id = json_object_get(o, "id"),
               *c = json_object_get(o, "content");
        if (!json_is_integer(id) || !json_is_string(c) || json_integer_value(id) < 0 ||
            json_integer_value(id) > (1 << 30))
            return pl_error_set(PL_ERR_FORMAT, "%s: added_tokens[%zu] needs an id and a content",
                                path, i);
        AddedTok *a = &t->added[t->nadded++];
        a->len = (uint32_t)json_string_length(c);
        a->content = tok_arena_strndup(&t->arena, json_string_value(c), a->len);
        a->id = (int32_t)json_integer_value(id);
        a->special = (uint8_t)tok_jbool(o, "special", 0);
        a->single_word = (uint8_t)tok_jbool(o, "single_word", 0);
        a->lstrip = (uint8_t)tok_jbool(o, "lstrip", 0);
        a->rstrip = (uint8_t)tok_jbool(o, "rstrip", 0);
        a->normalized = (uint8_t)tok_jbool(o, "normalized", !a->special);
        if (a->id + 1 > t->vocab_size)
            t->vocab_size = a->id + 1;
    }
    return PL_OK;
}

/* Rust regex \w (Unicode word characters), for added tokens' single_word */
static const char WORD_RE[] = "[\\p{L}\\p{M}\\p{Nd}\\p{Pc}]";

static int32_t lookup_token(const Tokenizer *t, const char *s, size_t n) {
    int32_t id = tok_strmap_get(&t->added_map, s, n);
    return id >= 0 ? id : tok_strmap_get(&t->vocab, s, n);
}

/* ---- post-processor: flattened to ids with -1 for the sequence --------------------------- */
static Status parse_post(Tokenizer *t, const json_t *j, int32_t **tm, int *n, const char *path,
                         int *is_template) {
    const char *type = tok_jstr(j, "type");
    if (!type)
        return pl_error_set(PL_ERR_FORMAT, "%s: post_processor without a \"type\"", path);
    *tm = pl_xmalloc(sizeof **tm);
    (*tm)[0] = -1;
    *n = 1;
    if (!strcmp(type, "ByteLevel"))
        return PL_OK;
    if (!strcmp(type, "TemplateProcessing")) {
        *is_template = 1;
        json_t *single = json_object_get(j, "single"), *sp = json_object_get(j, "special_tokens");
        if (!json_is_array(single))
            return pl_error_set(PL_ERR_FORMAT, "%s: TemplateProcessing without \"single\"", path);
        int cap = 8;
        *tm = pl_xrealloc(*tm, (size_t)cap * sizeof **tm);
        *n = 0;
        for (size_t i = 0; i < json_array_size(single); i++) {
            json_t *it = json_array_get(single, i), *st = json_object_get(it, "SpecialToken");
            if (json_object_get(it, "Sequence")) {
                if (*n + 1 > cap)
                    *tm = pl_xrealloc(*tm, (size_t)(cap *= 2) * sizeof **tm);
                (*tm)[(*n)++] = -1;
                continue;
            }
            const char *name = tok_jstr(st, "id");
            json_t *ids = json_object_get(json_object_get(sp, name ? name : ""), "ids");
            if (!name || !json_is_array(ids))
                return pl_error_set(PL_ERR_FORMAT, "%s: TemplateProcessing token \"%s\" has no ids",
                                    path, name ? name : "?");
            for (size_t k = 0; k < json_array_size(ids); k++) {
                if (*n + 1 > cap)
                    *tm = pl_xrealloc(*tm, (size_t)(cap *= 2) * sizeof **tm);
                (*tm)[(*n)++] = (int32_t)json_integer_value(json_array_get(ids, k));
            }
        }
        return PL_OK;
    }
    if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        json_t *cls = json_object_get(j, "cls"), *sep = json_object_get(j, "sep");
        if (!json_is_array(cls) || !json_is_array(sep))
            return pl_error_set(PL_ERR_FORMAT, "%s: %s needs cls and sep", path, type);
        *tm = pl_xrealloc(*tm, 3 * sizeof **tm);
        (*tm)[0] = (int32_t)json_integer_value(json_array_get(cls, 1));
        (*tm)[1] = -1;
        (*tm)[2] = (int32_t)json_integer_value(json_array_get(sep, 1));
        *n = 3;
        return PL_OK;
    }
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(j, "processors");
        for (size_t i = 0; i < json_array_size(arr); i++) {
            int32_t *sub;
            int ns;
            Status st = parse_post(t, json_array_get(arr, i), &sub, &ns, path, is_template);
            if (st) {
                free(sub);
                return st;
            }
            /* substitute the current template for the sequence marker of sub */
            int32_t *nt = pl_xmalloc((size_t)(ns + *n) * sizeof *nt);
            int k = 0;
            for (int a = 0; a < ns; a++) {
                if (sub[a] == -1)
                    for (int b = 0; b < *n; b++)
                        nt[k++] = (*tm)[b];
                else
                    nt[k++] = sub[a];
            }
            free(sub);
            free(*tm);
            *tm = nt;
            *n = k;
        }
        return PL_OK;
    }
    return pl_error_set(PL_ERR_UNSUPPORTED, "%s: post_processor type \"%s\" is not supported", path,
                        type);
}

/* ---- tokenizer_config.json ------------------------------------------------------------------ */
static const char *token_name(const json_t *v) {
    if (json_is_string(v))
        return json_string_value(v);
    if (json_is_object(v))
        return tok_jstr(v, "content");
    return NULL;
}

static Status load_config(Tokenizer *t, const char *path) {
    json_t *root;
    Status st = load_json(path, JSON_DECODE_INT_AS_REAL, &root); /* model_max_length: 1e30 */
    if (st)
        return st;
    const char *bos = token_name(json_object_get(root, "bos_token"));
    const char *eos = token_name(json_object_get(root, "eos_token"));
    if (bos && (t->bos_id = lookup_token(t, bos, strlen(bos))) < 0)
        st =
            pl_error_set(PL_ERR_FORMAT, "%s: bos_token \"%s\" is not in the vocabulary", path, bos);
    if (!st && eos && (t->eos_id = lookup_token(t, eos, strlen(eos))) < 0)
        st =
            pl_error_set(PL_ERR_FORMAT, "%s: eos_token \"%s\" is not in the vocabulary", path, eos);
    json_t *v;
    if (json_is_boolean(v = json_object_get(root, "add_bos_token")))
        t->cfg_add_bos = json_is_true(v);
    if (json_is_boolean(v = json_object_get(root, "add_eos_token")))
        t->cfg_add_eos = json_is_true(v);
    json_decref(root);
    return st;
}

static Status build(Tokenizer *t, const TokJson *tj, const char *path) {
    Status st;
    const json_t *root = tj->root, *model = json_object_get(root, "model");
    if ((st = parse_added(t, json_object_get(root, "added_tokens"), path)))
        return st;
    if (!json_is_object(model))
        return pl_error_set(PL_ERR_FORMAT, "%s: no \"model\" object", path);
    const char *type = tok_jstr(model, "type");
    if (type && strcmp(type, "BPE")) /* no "type" (GPT-2's file) means BPE */
        return pl_error_set(PL_ERR_UNSUPPORTED, "%s: model type \"%s\" is not supported (BPE only)",
                            path, type);
    if ((st = tok_json_vocab(t, tj, path)) || (st = tok_bpe_options(t, model, path)) ||
        (st = tok_json_merges(t, tj, path)))
        return st;
    tok_reserve_ids(t, t->vocab_size);
    tok_strmap_init(&t->added_map, (size_t)t->nadded);
    for (int i = 0; i < t->nadded; i++) {
        AddedTok *a = &t->added[i];
        t->toks[a->id] = a->content;
        t->tok_len[a->id] = a->len;
        t->tok_flags[a->id] |= TOKF_ADDED | (a->special ? TOKF_SPECIAL : 0);
        tok_strmap_put(&t->added_map, a->content, a->id);
    }
    if ((st = tok_parse_normalizer(json_object_get(root, "normalizer"), &t->norm, path)) ||
        (st = tok_parse_pretok(json_object_get(root, "pre_tokenizer"), &t->pretok, path)) ||
        (st = tok_parse_decoder(json_object_get(root, "decoder"), &t->dec, path)))
        return st;
    json_t *pp = json_object_get(root, "post_processor");
    if (pp && !json_is_null(pp)) {
        t->post.present = 1;
        if ((st = parse_post(t, pp, &t->post.tmpl, &t->post.ntmpl, path, &t->post.is_template)))
            return st;
    }
    if ((st = tok_pattern_compile_regex(&t->re_space, "\\s", 2, path, "space")) ||
        (st = tok_pattern_compile_regex(&t->re_word, WORD_RE, strlen(WORD_RE), path, "word")))
        return st;

    /* added-token tries; normalized ones are matched in normalized text, so normalize them */
    tok_trie_init(&t->trie_raw);
    tok_trie_init(&t->trie_norm);
    TokCtx cx;
    tok_ctx_init(&cx);
    for (int i = 0; i < t->nadded; i++) {
        AddedTok *a = &t->added[i];
        if (!a->normalized || !t->norm) {
            tok_trie_add(a->normalized ? &t->trie_norm : &t->trie_raw, a->content, a->len, i);
            continue;
        }
        tok_normalize(t->norm, a->content, a->len, &cx.tmp, &cx);
        tok_trie_add(&t->trie_norm, cx.tmp.p, cx.tmp.n, i);
        /* HF then knows the id by its normalized content (id_to_token, decode) */
        t->toks[a->id] = tok_arena_strndup(&t->arena, cx.tmp.p, cx.tmp.n);
        t->tok_len[a->id] = (uint32_t)cx.tmp.n;
    }
    tok_ctx_free(&cx);
    return PL_OK;
}

Status tok_load_files(const char *json_path, const char *config_path, Tokenizer **out) {
    *out = NULL;
    if (!json_path)
        return pl_error_set(PL_ERR_INVALID, "tok_load_files: no tokenizer.json path");
    Tokenizer *t = pl_xcalloc(1, sizeof *t);
    t->bos_id = t->eos_id = -1;
    t->cfg_add_bos = t->cfg_add_eos = -1;
    t->unk_id = -1;
    TokJson tj;
    Status st = tok_json_open(json_path, &tj);
    if (!st)
        st = build(t, &tj, json_path);
    tok_json_close(&tj);
    if (!st && config_path)
        st = load_config(t, config_path);
    if (!st && t->bos_id < 0 && t->post.is_template && t->post.ntmpl > 0 && t->post.tmpl[0] >= 0)
        t->bos_id = t->post.tmpl[0]; /* e.g. Llama 3 without a tokenizer_config.json */
    if (st) {
        tok_destroy(t);
        return st;
    }
    *out = t;
    return PL_OK;
}

Status tok_load(const char *dir, Tokenizer **out) {
    size_t n = strlen(dir);
    char *jp = pl_xmalloc(n + 32), *cp = pl_xmalloc(n + 32);
    snprintf(jp, n + 32, "%s/tokenizer.json", dir);
    snprintf(cp, n + 32, "%s/tokenizer_config.json", dir);
    Status st = tok_load_files(jp, access(cp, F_OK) == 0 ? cp : NULL, out);
    free(jp);
    free(cp);
    return st;
}

void tok_destroy(Tokenizer *t) {
    if (!t)
        return;
    free(t->toks);
    free(t->tok_len);
    free(t->tok_flags);
    tok_strmap_free(&t->vocab);
    tok_strmap_free(&t->added_map);
    tok_u64map_free(&t->merges);
    free(t->added);
    tok_trie_free(&t->trie_raw);
    tok_trie_free(&t->trie_norm);
    tok_free_normalizer(t->norm);
    tok_free_pretok(t->pretok);
    tok_free_decoder(t->dec);
    free(t->post.tmpl);
    tok_pattern_free(&t->re_space);
    tok_pattern_free(&t->re_word);
    tok_arena_free(&t->arena);
    free(t);
}
