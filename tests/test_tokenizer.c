/* test_tokenizer.c - tokenizer tests (cmocka): ids and decodes against Hugging Face `tokenizers`
 * (tests/data/tokenizers/expected/, made by tools/tokenizer_reference.mjs) and the transformers
 * golden files, invalid UTF-8, streaming detokenization, errors, threads and long inputs.
 * Run from the repository root. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* mkstemp */
#endif
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>
#include <pthread.h>

#include "tokenizer.h"

#define TD "tests/data/tokenizers/"

static json_t *load_json(const char *path) {
    json_error_t err;
    json_t *j = json_load_file(path, JSON_DECODE_INT_AS_REAL, &err);
    if (!j)
        fail_msg("%s: %s", path, err.text);
    return j;
}

static Tokenizer *load_dir(const char *dir) {
    Tokenizer *t = NULL;
    Status st = tok_load(dir, &t);
    if (st)
        fail_msg("tok_load(%s): %s", dir, pl_error());
    return t;
}

static Tokenizer *load_file(const char *path) {
    Tokenizer *t = NULL;
    Status st = tok_load_files(path, NULL, &t);
    if (st)
        fail_msg("tok_load_files(%s): %s", path, pl_error());
    return t;
}

/* ids of a JSON array of numbers */
static int32_t *json_ids(const json_t *a, int *n) {
    *n = (int)json_array_size(a);
    int32_t *ids = malloc(((size_t)*n + 1) * sizeof *ids);
    for (int i = 0; i < *n; i++)
        ids[i] = (int32_t)json_number_value(json_array_get(a, (size_t)i));
    return ids;
}

static void print_ids(const char *what, const int32_t *ids, int n) {
    fprintf(stderr, "    %s [", what);
    for (int i = 0; i < n && i < 40; i++)
        fprintf(stderr, "%s%d", i ? ", " : "", ids[i]);
    fprintf(stderr, "%s] (%d)\n", n > 40 ? ", ..." : "", n);
}

/* Encode text and compare with expected ids; returns 1 on match, prints the difference. */
static int check_ids(const Tokenizer *t, const char *name, const char *text, size_t len,
                     int add_special, const int32_t *want, int nwant) {
    int32_t *ids;
    int n;
    Status st = tok_encode(t, text, len, add_special, &ids, &n);
    assert_int_equal(st, PL_OK);
    int ok = n == nwant && (n == 0 || !memcmp(ids, want, (size_t)n * sizeof *ids));
    if (!ok) {
        fprintf(stderr, "  %s: ids differ (add_special %d) for \"%.*s\"\n", name, add_special,
                (int)(len > 80 ? 80 : len), text);
        print_ids("want", want, nwant);
        print_ids("got ", ids, n);
    }
    free(ids);
    return ok;
}

static int check_decode(const Tokenizer *t, const char *name, const int32_t *ids, int n, int skip,
                        const char *want) {
    char *got = tok_decode(t, ids, n, skip, NULL);
    int ok = !strcmp(got, want);
    if (!ok)
        fprintf(stderr, "  %s: decode(skip %d) differs:\n    want \"%s\"\n    got  \"%s\"\n", name,
                skip, want, got);
    free(got);
    return ok;
}

/* ---- Hugging Face tokenizers reference (tests/data/tokenizers/expected/) ---------------- */
typedef struct {
    const char *expected; /* file under TD "expected/" */
    const char *dir;      /* tok_load dir, or NULL to load `file` alone */
    const char *file;
} RefCase;

static void run_reference(const RefCase *rc) {
    char path[512];
    snprintf(path, sizeof path, TD "expected/%s", rc->expected);
    json_t *exp = load_json(path);
    Tokenizer *t = rc->dir ? load_dir(rc->dir) : load_file(rc->file);
    json_t *cases = json_object_get(exp, "cases");
    int bad = 0, total = 0;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *c = json_array_get(cases, i);
        json_t *text = json_object_get(c, "text");
        const char *s = json_string_value(text);
        size_t len = json_string_length(text);
        int n, ns;
        int32_t *ids = json_ids(json_object_get(c, "ids"), &n);
        int32_t *ids_sp = json_ids(json_object_get(c, "ids_special"), &ns);
        int ok = check_ids(t, rc->expected, s, len, 0, ids, n);
        ok &= check_ids(t, rc->expected, s, len, 1, ids_sp, ns);
        ok &= check_decode(t, rc->expected, ids_sp, ns, 0,
                           json_string_value(json_object_get(c, "decoded")));
        ok &= check_decode(t, rc->expected, ids_sp, ns, 1,
                           json_string_value(json_object_get(c, "decoded_skip")));
        bad += !ok;
        total++;
        free(ids);
        free(ids_sp);
    }
    fprintf(stderr, "[ reference ] %-32s %d/%d texts match HF tokenizers\n", rc->expected,
            total - bad, total);
    tok_destroy(t);
    json_decref(exp);
    assert_int_equal(bad, 0);
}

#define REF_TEST(fn, exp, dir, file)                                                               \
    static void fn(void **state) {                                                                 \
        (void)state;                                                                               \
        RefCase rc = {exp, dir, file};                                                             \
        run_reference(&rc);                                                                        \
    }
REF_TEST(test_ref_stories, "stories260K.json", "models/stories260K", NULL)
REF_TEST(test_ref_gpt2, "gpt2.json", TD "gpt2", NULL)
REF_TEST(test_ref_falcon, "falcon-7b.json", TD "falcon-7b", NULL)
REF_TEST(test_ref_smollm, "smollm-135m.json", TD "smollm-135m", NULL)
REF_TEST(test_ref_tinyllama, "tinyllama-1.1b-chat-v1.0.json", TD "tinyllama-1.1b-chat-v1.0", NULL)
REF_TEST(test_ref_bl_llama3, "bl-llama3.json", NULL, TD "variants/bl-llama3.json")
REF_TEST(test_ref_bl_splits, "bl-splits.json", NULL, TD "variants/bl-splits.json")
REF_TEST(test_ref_bl_invert, "bl-invert.json", NULL, TD "variants/bl-invert.json")
REF_TEST(test_ref_bl_ws, "bl-ws.json", NULL, TD "variants/bl-ws.json")
REF_TEST(test_ref_bl_whitespace, "bl-whitespace.json", NULL, TD "variants/bl-whitespace.json")
REF_TEST(test_ref_bl_added, "bl-added.json", NULL, TD "variants/bl-added.json")
REF_TEST(test_ref_bl_qwen2, "bl-qwen2.json", NULL, TD "variants/bl-qwen2.json")
REF_TEST(test_ref_sp_meta_first, "sp-metaspace-first.json", NULL,
         TD "variants/sp-metaspace-first.json")
REF_TEST(test_ref_sp_meta_always, "sp-metaspace-always.json", NULL,
         TD "variants/sp-metaspace-always.json")

/* ---- transformers golden files (tests/data/tokenizers/golden/) ----------------------------- */
static void run_multilingual(const char *golden, const char *dir) {
    json_t *in = load_json(TD "golden/multilingual_inputs.json");
    json_t *g = load_json(golden);
    Tokenizer *t = load_dir(dir);
    json_t *entries = json_object_get(g, "entries");
    int bad = 0, total = 0;
    for (size_t i = 0; i < json_array_size(entries); i++) {
        json_t *e = json_array_get(entries, i);
        const char *id = json_string_value(json_object_get(e, "id"));
        json_t *text = NULL;
        for (size_t k = 0; k < json_array_size(in); k++)
            if (!strcmp(json_string_value(json_object_get(json_array_get(in, k), "id")), id))
                text = json_object_get(json_array_get(in, k), "text");
        assert_non_null(text);
        int n;
        int32_t *ids = json_ids(json_object_get(e, "input_ids"), &n);
        int ok = check_ids(t, id, json_string_value(text), json_string_length(text), 1, ids, n);
        ok &= check_decode(t, id, ids, n, 0,
                           json_string_value(json_object_get(e, "decoded_with_special")));
        ok &= check_decode(t, id, ids, n, 1,
                           json_string_value(json_object_get(e, "decoded_skip_special")));
        /* the token strings too */
        json_t *toks = json_object_get(e, "tokens");
        for (int k = 0; ok && k < n; k++)
            if (strcmp(tok_id_to_token(t, ids[k]),
                       json_string_value(json_array_get(toks, (size_t)k)))) {
                fprintf(stderr, "  %s: token %d is \"%s\"\n", id, ids[k],
                        tok_id_to_token(t, ids[k]));
                ok = 0;
            }
        bad += !ok;
        total++;
        free(ids);
    }
    fprintf(stderr, "[ golden    ] %-32s %d/%d inputs match transformers\n", golden + strlen(TD),
            total - bad, total);
    tok_destroy(t);
    json_decref(g);
    json_decref(in);
    assert_int_equal(bad, 0);
}

static void test_golden_gpt2_multilingual(void **state) {
    (void)state;
    run_multilingual(TD "golden/gpt2_multilingual.json", TD "gpt2");
}

static void test_golden_tinyllama_multilingual(void **state) {
    (void)state;
    run_multilingual(TD "golden/tinyllama_multilingual.json", TD "tinyllama-1.1b-chat-v1.0");
}

/* {text, bpe_tokens, token_ids, decoded_text}; token_ids include BOS when the model adds one */
static void run_encoded(const char *golden, const char *dir) {
    json_t *g = load_json(golden);
    Tokenizer *t = load_dir(dir);
    json_t *text = json_object_get(g, "text");
    int n;
    int32_t *ids = json_ids(json_object_get(g, "token_ids"), &n);
    assert_true(check_ids(t, golden, json_string_value(text), json_string_length(text), 1, ids, n));
    assert_true(
        check_decode(t, golden, ids, n, 0, json_string_value(json_object_get(g, "decoded_text"))));
    json_t *bpe = json_object_get(g, "bpe_tokens");
    int off = n - (int)json_array_size(bpe); /* llama's bpe_tokens leave out <s> */
    for (int k = 0; k < (int)json_array_size(bpe); k++)
        assert_string_equal(tok_id_to_token(t, ids[k + off]),
                            json_string_value(json_array_get(bpe, (size_t)k)));
    fprintf(stderr, "[ golden    ] %-32s %d ids match\n", golden + strlen(TD), n);
    free(ids);
    tok_destroy(t);
    json_decref(g);
}

static void test_golden_encoded(void **state) {
    (void)state;
    run_encoded(TD "golden/llama_encoded.json", TD "tinyllama-1.1b-chat-v1.0");
    run_encoded(TD "golden/gpt2_encoded_tokens.json", TD "gpt2");
    run_encoded(TD "golden/falcon_encoded.json", TD "falcon-7b");
}

/* models/stories260K/golden.json: prompt ids, and streamed completion text */
static void test_stories_golden(void **state) {
    (void)state;
    json_t *g = load_json("models/stories260K/golden.json");
    Tokenizer *t = load_dir("models/stories260K");
    assert_int_equal(tok_vocab_size(t), 512);
    assert_int_equal(tok_bos_id(t), 1);
    assert_int_equal(tok_eos_id(t), 2);
    json_t *cases = json_object_get(g, "cases");
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *c = json_array_get(cases, i);
        json_t *prompt = json_object_get(c, "prompt");
        int np, nc;
        int32_t *pids = json_ids(json_object_get(c, "prompt_ids"), &np);
        int32_t *cids = json_ids(json_object_get(c, "completion_ids"), &nc);
        assert_true(check_ids(t, "stories260K", json_string_value(prompt),
                              json_string_length(prompt), 1, pids, np));
        TokStream *s = tok_stream_create(t, pids, np, 1);
        char text[4096] = "";
        for (int k = 0; k < nc; k++) {
            const char *piece = tok_stream_push(s, cids[k], NULL);
            /* in context the first piece keeps its space: "\u2581we" -> " we" (then "re") */
            if (k == 0 && !strcmp(json_string_value(prompt), "Lily and Tom"))
                assert_string_equal(piece, " we");
            if (k == 0 && np == 1)
                assert_string_equal(piece, "Once");
            strcat(text, piece);
        }
        strcat(text, tok_stream_finish(s, NULL));
        assert_string_equal(text, json_string_value(json_object_get(c, "text")));
        tok_stream_destroy(s);
        free(pids);
        free(cids);
    }
    tok_destroy(t);
    json_decref(g);
}

/* A stream keeps special tokens' text when asked (skip_special 0) and drops it otherwise; from
 * an empty prompt its pieces add up to tok_decode of the ids with the same skip_special. */
static void test_stream_keeps_special_tokens(void **state) {
    (void)state;
    Tokenizer *t = load_dir("models/stories260K");
    assert_true(tok_is_special(t, 2));
    int32_t ids[64], *a, *b;
    int na, nb, n = 0;
    assert_int_equal(tok_encode(t, "Once upon a time", 16, 0, &a, &na), PL_OK);
    assert_int_equal(tok_encode(t, " there was", 10, 0, &b, &nb), PL_OK);
    assert_true(na > 0 && nb > 0 && na + nb < 63);
    memcpy(ids, a, sizeof *a * (size_t)na);
    n = na;
    ids[n++] = 2; /* </s> in the middle */
    memcpy(ids + n, b, sizeof *b * (size_t)nb);
    n += nb;
    free(a);
    free(b);
    for (int skip = 0; skip < 2; skip++) {
        TokStream *s = tok_stream_create(t, NULL, 0, skip);
        char text[512] = "";
        for (int k = 0; k < n; k++)
            strcat(text, tok_stream_push(s, ids[k], NULL));
        strcat(text, tok_stream_finish(s, NULL));
        size_t len;
        char *want = tok_decode(t, ids, n, skip, &len);
        assert_string_equal(text, want);
        assert_true(skip ? !strstr(text, "</s>") : strstr(text, "</s>") != NULL);
        free(want);
        tok_stream_destroy(s);
    }
    tok_destroy(t);
}

/* ---- invalid UTF-8 ------------------------------------------------------------------------ */
static int valid_utf8(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        size_t k = c < 0x80                   ? 1
                   : (c >= 0xc2 && c <= 0xdf) ? 2
                   : (c >= 0xe0 && c <= 0xef) ? 3
                   : (c >= 0xf0 && c <= 0xf4) ? 4
                                              : 0;
        if (!k || i + k > n)
            return 0;
        for (size_t j = 1; j < k; j++)
            if ((u[i + j] & 0xc0) != 0x80)
                return 0;
        if ((c == 0xe0 && u[i + 1] < 0xa0) || (c == 0xed && u[i + 1] > 0x9f) ||
            (c == 0xf0 && u[i + 1] < 0x90) || (c == 0xf4 && u[i + 1] > 0x8f))
            return 0;
        i += k;
    }
    return 1;
}

typedef struct {
    const char *in;
    size_t len;
    const char *byte_level; /* decode for byte-level tokenizers (Rust from_utf8_lossy) */
    const char *sp;         /* decode(skip_special) for TinyLlama / stories260K, or NULL */
} BadCase;

#define B(s) s, sizeof(s) - 1
static const BadCase bad_cases[] = {
    {B("\x80"), "\xef\xbf\xbd", "\xef\xbf\xbd"},
    {B("abc\x80"
       "def"),
     "abc\xef\xbf\xbd"
     "def",
     "abc\xef\xbf\xbd"
     "def"},
    {B("\xff"), "\xef\xbf\xbd", "\xef\xbf\xbd"},
    {B("\xfe\xff"), "\xef\xbf\xbd\xef\xbf\xbd", "\xef\xbf\xbd\xef\xbf\xbd"},
    {B("a\xc3"), "a\xef\xbf\xbd", "a\xef\xbf\xbd"},
    /* truncated 3- and 4-byte sequences: one U+FFFD from from_utf8_lossy, one per byte from
     * HF's ByteFallback decoder */
    {B("\xe4\xbd"), "\xef\xbf\xbd", "\xef\xbf\xbd\xef\xbf\xbd"},
    {B("\xf0\x9f\x98 x"), "\xef\xbf\xbd x", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd x"},
    {B("end \xf0\x9f\x98"), "end \xef\xbf\xbd", NULL},
    {B("\xed\xa0\x80"), "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", NULL}, /* a surrogate */
    {B("\xc0\xaf"), "\xef\xbf\xbd\xef\xbf\xbd", NULL},                 /* overlong '/' */
    {B("hi \xf4\x90\x80\x80"), "hi \xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", NULL},
    {B("ok \xe4\xbd\xa0 \xbd\xa0 orphan"), "ok \xe4\xbd\xa0 \xef\xbf\xbd\xef\xbf\xbd orphan", NULL},
    {B("  \x80\x80  12\xff"
       "3 <|endoftext|>\xfe"),
     NULL, NULL},
    {B("nul \0 inside"), NULL, NULL},
};

/* Is every byte of s in the vocab as its GPT-2 byte-level char? (Falcon has no token for the
 * bytes F5..FF, which never occur in UTF-8: like HF, it drops them.) */
static int bytes_in_vocab(const Tokenizer *t, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned b = (unsigned char)s[i], cp = b;
        if (b <= 0x20)
            cp = 0x100 + b;
        else if (b >= 0x7f && b <= 0xa0)
            cp = 0x121 + (b - 0x7f);
        else if (b == 0xad)
            cp = 0x143;
        char u[3] = {(char)(0xc0 | (cp >> 6)), (char)(0x80 | (cp & 0x3f)), 0};
        char a[2] = {(char)cp, 0};
        if (tok_token_to_id(t, cp < 0x80 ? a : u) < 0)
            return 0;
    }
    return 1;
}

static void run_bad_utf8(Tokenizer *t, const char *name, int byte_level) {
    for (size_t i = 0; i < sizeof bad_cases / sizeof *bad_cases; i++) {
        const BadCase *bc = &bad_cases[i];
        if (byte_level > 0 && !bytes_in_vocab(t, bc->in, bc->len) && bc->byte_level) {
            int32_t *ids;
            int n;
            assert_int_equal(tok_encode(t, bc->in, bc->len, 1, &ids, &n), PL_OK);
            free(ids);
            continue;
        }
        int32_t *ids;
        int n;
        assert_int_equal(tok_encode(t, bc->in, bc->len, 1, &ids, &n), PL_OK);
        for (int k = 0; k < n; k++) {
            assert_true(ids[k] >= 0 && ids[k] < tok_vocab_size(t));
            assert_non_null(tok_id_to_token(t, ids[k]));
        }
        char *d = tok_decode(t, ids, n, 1, NULL);
        assert_true(valid_utf8(d, strlen(d)));
        const char *want = byte_level > 0 ? bc->byte_level : byte_level == 0 ? bc->sp : NULL;
        if (want && strcmp(d, want)) {
            fprintf(stderr, "  %s: invalid-UTF-8 case %zu decodes to \"%s\", want \"%s\"\n", name,
                    i, d, want);
            fail();
        }
        free(d);
        free(ids);
    }
}

static void test_invalid_utf8(void **state) {
    (void)state;
    static const struct {
        const char *dir, *file;
        int byte_level;
    } toks[] = {
        {TD "gpt2", NULL, 1},
        {TD "falcon-7b", NULL, 1},
        {TD "smollm-135m", NULL, 1},
        {NULL, TD "variants/bl-llama3.json", 1},
        {NULL, TD "variants/bl-splits.json", 1},
        {TD "tinyllama-1.1b-chat-v1.0", NULL, 0},
        {"models/stories260K", NULL, 0},
        {NULL, TD "variants/sp-metaspace-first.json", -1}, /* no ByteFallback decoder */
    };
    for (size_t i = 0; i < sizeof toks / sizeof *toks; i++) {
        Tokenizer *t = toks[i].dir ? load_dir(toks[i].dir) : load_file(toks[i].file);
        run_bad_utf8(t, toks[i].dir ? toks[i].dir : toks[i].file, toks[i].byte_level);
        tok_destroy(t);
    }
}

/* ---- streaming ------------------------------------------------------------------------------ */
typedef struct {
    char *p;
    size_t n, cap;
} Str;

static void str_add(Str *s, const char *t) {
    size_t k = strlen(t);
    if (s->n + k + 1 > s->cap) {
        s->cap = (s->n + k + 1) * 2;
        s->p = realloc(s->p, s->cap);
    }
    memcpy(s->p + s->n, t, k + 1);
    s->n += k;
}

/* Stream ids[k..n) after the prompt ids[0..k): every piece is valid UTF-8 and their
 * concatenation is decode(all)[len(decode(prompt)):]. Returns the number of pieces. */
static int check_stream(const Tokenizer *t, const int32_t *ids, int n, int k, const char *what) {
    char *full = tok_decode(t, ids, n, 1, NULL), *pre = tok_decode(t, ids, k, 1, NULL);
    TokStream *s = tok_stream_create(t, ids, k, 1);
    Str acc = {0};
    str_add(&acc, "");
    int pieces = 0;
    for (int i = k; i < n; i++) {
        const char *p = tok_stream_push(s, ids[i], NULL);
        if (!valid_utf8(p, strlen(p)))
            fail_msg("%s: piece %d is not valid UTF-8", what, i);
        pieces += *p != 0;
        str_add(&acc, p);
    }
    str_add(&acc, tok_stream_finish(s, NULL));
    size_t lp = strlen(pre);
    /* when the prompt ends inside a character, its decode is not a prefix of the whole one */
    if (!strncmp(full, pre, lp) && strcmp(acc.p, full + lp))
        fail_msg("%s (prompt %d of %d ids):\n  stream \"%s\"\n  want   \"%s\"", what, k, n, acc.p,
                 full + lp);
    tok_stream_destroy(s);
    free(acc.p);
    free(full);
    free(pre);
    return pieces;
}

static const char *stream_texts[] = {
    "Hello 你好 👋🏽 world ⚡ é\n done",
    "👨‍👩‍👧‍👦 family: 日本語, 한국어 and emoji 🤖🚀 end",
    "  leading spaces and\ttabs\n\nnew lines   ",
    "Once upon a time, there was a little girl named Lily.",
    "<s>special</s> inside <|endoftext|> text",
    "¿Qué? Ünïcödé — «quotes» 1,234.5",
};

static void stream_all_prefixes(const Tokenizer *t, const char *name) {
    for (size_t i = 0; i < sizeof stream_texts / sizeof *stream_texts; i++) {
        int32_t *ids;
        int n;
        assert_int_equal(tok_encode(t, stream_texts[i], strlen(stream_texts[i]), 1, &ids, &n),
                         PL_OK);
        for (int k = 0; k <= n; k++)
            check_stream(t, ids, n, k, name);
        free(ids);
    }
}

static void test_stream_tokenizers(void **state) {
    (void)state;
    const char *dirs[] = {TD "tinyllama-1.1b-chat-v1.0", TD "gpt2", TD "falcon-7b",
                          TD "smollm-135m", "models/stories260K"};
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++) {
        Tokenizer *t = load_dir(dirs[i]);
        stream_all_prefixes(t, dirs[i]);
        tok_destroy(t);
    }
    const char *files[] = {TD "variants/sp-metaspace-first.json",
                           TD "variants/sp-metaspace-always.json", TD "variants/bl-llama3.json"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        Tokenizer *t = load_file(files[i]);
        stream_all_prefixes(t, files[i]);
        tok_destroy(t);
    }
}

/* A character split across byte-fallback tokens is held until complete. */
static void test_stream_byte_fallback(void **state) {
    (void)state;
    Tokenizer *t = load_dir(TD "tinyllama-1.1b-chat-v1.0");
    int32_t b0 = tok_token_to_id(t, "<0x00>");
    assert_int_equal(b0, 3);
    /* "▁Hi" then U+1F44B as four byte tokens, then "▁there", EOS */
    int32_t ids[] = {
        1,         tok_token_to_id(t, "\xe2\x96\x81Hi"),    b0 + 0xF0, b0 + 0x9F, b0 + 0x91,
        b0 + 0x8B, tok_token_to_id(t, "\xe2\x96\x81there"), 2};
    assert_true(ids[1] > 0 && ids[6] > 0);
    TokStream *s = tok_stream_create(t, ids, 1, 1);
    assert_string_equal(tok_stream_push(s, ids[1], NULL), "Hi");
    assert_string_equal(tok_stream_push(s, ids[2], NULL), "");
    assert_string_equal(tok_stream_push(s, ids[3], NULL), "");
    assert_string_equal(tok_stream_push(s, ids[4], NULL), "");
    assert_string_equal(tok_stream_push(s, ids[5], NULL), "\xf0\x9f\x91\x8b");
    assert_string_equal(tok_stream_push(s, ids[6], NULL), " there");
    assert_string_equal(tok_stream_push(s, ids[7], NULL), ""); /* EOS is special: skipped */
    assert_string_equal(tok_stream_finish(s, NULL), "");
    tok_stream_destroy(s);
    for (int k = 0; k <= 8; k++)
        check_stream(t, ids, 8, k, "tinyllama bytes");

    /* unfinished at the end: finish() flushes U+FFFD */
    s = tok_stream_create(t, ids, 2, 1);
    assert_string_equal(tok_stream_push(s, ids[2], NULL), "");
    assert_string_equal(tok_stream_push(s, ids[3], NULL), "");
    assert_string_equal(tok_stream_finish(s, NULL), "\xef\xbf\xbd");
    tok_stream_destroy(s);

    /* a prompt that ends inside a character: the character completes in the stream */
    s = tok_stream_create(t, ids, 4, 1);
    assert_string_equal(tok_stream_push(s, ids[4], NULL), "");
    assert_string_equal(tok_stream_push(s, ids[5], NULL), "\xf0\x9f\x91\x8b");
    tok_stream_destroy(s);

    /* an ill-formed run never yields invalid UTF-8 */
    int32_t bad[] = {b0 + 0xE4, b0 + 0xBD, ids[6], b0 + 0xFF, b0 + 0x80};
    s = tok_stream_create(t, NULL, 0, 1);
    Str acc = {0};
    str_add(&acc, "");
    for (int k = 0; k < 5; k++) {
        const char *p = tok_stream_push(s, bad[k], NULL);
        assert_true(valid_utf8(p, strlen(p)));
        str_add(&acc, p);
    }
    str_add(&acc, tok_stream_finish(s, NULL));
    assert_non_null(strstr(acc.p, "\xef\xbf\xbd"));
    assert_non_null(strstr(acc.p, " there"));
    free(acc.p);
    tok_stream_destroy(s);
    tok_destroy(t);
}

/* tok_token_bytes: the output text after a prompt is the concatenation of its tokens' bytes
 * (where that is valid UTF-8; elsewhere the stream shows U+FFFD), for every decoder family;
 * and a few tokens by hand. */
static void check_token_bytes(Tokenizer *t, const char *what) {
    uint64_t seed = 88172645463325252ull;
    int V = tok_vocab_size(t), checked = 0;
    for (int round = 0; round < 2000 && checked < 200; round++) {
        int32_t ids[9];
        for (int k = 0; k < 9; k++) {
            do {
                seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
                ids[k] = (int32_t)(seed % (uint64_t)V);
            } while (tok_is_special(t, ids[k]) || !tok_id_to_token(t, ids[k]));
        }
        size_t n0 = 0; /* a prompt that ends inside a character would start the text */
        char *b0 = tok_token_bytes(t, ids[0], &n0);
        int whole = valid_utf8(b0, n0);
        free(b0);
        if (!whole)
            continue;
        Str want = {0}, got = {0};
        str_add(&want, "");
        str_add(&got, "");
        TokStream *st = tok_stream_create(t, ids, 1, 1);
        for (int k = 1; k < 9; k++) {
            size_t n = 0;
            char *b = tok_token_bytes(t, ids[k], &n);
            assert_non_null(b);
            char *z = strndup(b, n);
            str_add(&want, z);
            free(z);
            free(b);
            str_add(&got, tok_stream_push(st, ids[k], NULL));
        }
        str_add(&got, tok_stream_finish(st, NULL));
        tok_stream_destroy(st);
        if (valid_utf8(want.p, strlen(want.p)) && !memchr(want.p, 0, strlen(want.p))) {
            if (strcmp(got.p, want.p))
                fail_msg("%s round %d: stream '%s', token bytes '%s'", what, round, got.p, want.p);
            checked++;
        }
        free(want.p);
        free(got.p);
    }
    print_message("%s: %d sequences\n", what, checked);
    assert_true(checked >= 50);
}

static void test_token_bytes(void **state) {
    (void)state;
    const char *dirs[] = {TD "tinyllama-1.1b-chat-v1.0", TD "gpt2", TD "falcon-7b",
                          TD "smollm-135m", "models/stories260K"};
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++) {
        Tokenizer *t = load_dir(dirs[i]);
        check_token_bytes(t, dirs[i]);
        tok_destroy(t);
    }
    Tokenizer *t = load_dir(TD "tinyllama-1.1b-chat-v1.0");
    size_t n = 0;
    char *b = tok_token_bytes(t, tok_token_to_id(t, "<0x0A>"), &n);
    assert_int_equal(n, 1);
    assert_int_equal(b[0], '\n');
    free(b);
    b = tok_token_bytes(t, tok_token_to_id(t, "\xe2\x96\x81Hi"), &n);
    assert_int_equal(n, 3);
    assert_memory_equal(b, " Hi", 3); /* inside a text the space stays */
    free(b);
    b = tok_token_bytes(t, tok_token_to_id(t, "<0xF0>"), &n); /* part of a character */
    assert_int_equal(n, 1);
    assert_int_equal((unsigned char)b[0], 0xF0);
    free(b);
    assert_null(tok_token_bytes(t, 2, &n)); /* </s>: special */
    tok_destroy(t);
    t = load_dir(TD "gpt2");
    b = tok_token_bytes(t, tok_token_to_id(t, "\xc4\xa0the"), &n);
    assert_int_equal(n, 4);
    assert_memory_equal(b, " the", 4);
    free(b);
    tok_destroy(t);
}

/* GPT-2 byte-level tokens that split an emoji */
static void test_stream_byte_level(void **state) {
    (void)state;
    Tokenizer *t = load_dir(TD "gpt2");
    const char *text = " \xf0\x9f\x91\x8b\xf0\x9f\x8f\xbd hi";
    int32_t *ids;
    int n;
    assert_int_equal(tok_encode(t, text, strlen(text), 0, &ids, &n), PL_OK);
    assert_true(n >= 4); /* the emoji spans several tokens */
    TokStream *s = tok_stream_create(t, NULL, 0, 1);
    Str acc = {0};
    str_add(&acc, "");
    int empty = 0;
    for (int k = 0; k < n; k++) {
        const char *p = tok_stream_push(s, ids[k], NULL);
        assert_true(valid_utf8(p, strlen(p)));
        empty += *p == 0;
        str_add(&acc, p);
    }
    str_add(&acc, tok_stream_finish(s, NULL));
    assert_string_equal(acc.p, text);
    assert_true(empty > 0); /* some tokens ended inside a character */
    free(acc.p);
    free(ids);
    tok_stream_destroy(s);
    tok_destroy(t);
}

/* ---- errors -----------------------------------------------------------------------------------
 */
static char tmp_path[64];

static const char *write_tmp(const char *content) {
    strcpy(tmp_path, "/tmp/pagellm_tok_XXXXXX");
    int fd = mkstemp(tmp_path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, content, strlen(content)), (ssize_t)strlen(content));
    close(fd);
    return tmp_path;
}

static void expect_error(const char *json, Status want, const char *needle) {
    const char *path = write_tmp(json);
    Tokenizer *t = (Tokenizer *)0x1;
    Status st = tok_load_files(path, NULL, &t);
    if (st != want || !strstr(pl_error(), needle) || !strstr(pl_error(), path))
        fail_msg("want status %d naming \"%s\" and the file, got %d: %s", want, needle, st,
                 pl_error());
    assert_null(t);
    unlink(path);
}

#define MODEL "\"model\": {\"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]}"

static void test_errors(void **state) {
    (void)state;
    Tokenizer *t = (Tokenizer *)0x1;
    assert_int_equal(tok_load("tests/data/tokenizers/no-such-dir", &t), PL_ERR_IO);
    assert_null(t);
    assert_non_null(strstr(pl_error(), "no-such-dir/tokenizer.json"));
    assert_int_equal(tok_load_files(TD "gpt2/tokenizer.json", TD "gpt2/missing_config.json", &t),
                     PL_ERR_IO);
    assert_non_null(strstr(pl_error(), "missing_config.json"));

    expect_error("{" MODEL, PL_ERR_FORMAT, "invalid JSON");
    expect_error("{\"model\": {\"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [", PL_ERR_FORMAT,
                 "invalid JSON");
    expect_error("[1, 2]", PL_ERR_FORMAT, "not a JSON object");
    expect_error("{\"normalizer\": {\"type\": \"NFKC\"}, " MODEL "}", PL_ERR_UNSUPPORTED, "NFKC");
    expect_error(
        "{\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFD\"}]}, " MODEL
        "}",
        PL_ERR_UNSUPPORTED, "NFD");
    expect_error("{\"pre_tokenizer\": {\"type\": \"UnicodeScripts\"}, " MODEL "}",
                 PL_ERR_UNSUPPORTED, "UnicodeScripts");
    expect_error("{\"decoder\": {\"type\": \"CTC\"}, " MODEL "}", PL_ERR_UNSUPPORTED, "CTC");
    expect_error("{\"post_processor\": {\"type\": \"Magic\"}, " MODEL "}", PL_ERR_UNSUPPORTED,
                 "Magic");
    expect_error("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}",
                 PL_ERR_UNSUPPORTED, "WordPiece");
    expect_error("{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [\"a b c\"]}}", PL_ERR_FORMAT,
                 "merge 0");
    expect_error("{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [\"a z\"]}}", PL_ERR_FORMAT,
                 "not in the vocab");
    expect_error("{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [[\"a\", 5]]}}", PL_ERR_FORMAT,
                 "merge");
    expect_error("{\"model\": {\"vocab\": [\"a\"], \"merges\": []}}", PL_ERR_FORMAT, "model.vocab");
    expect_error("{\"model\": {\"vocab\": {\"a\": -1}, \"merges\": []}}", PL_ERR_FORMAT,
                 "model.vocab");
    expect_error("{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, "
                 "\"behavior\": \"Isolated\"}, " MODEL "}",
                 PL_ERR_FORMAT, "regex");
    expect_error("{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, "
                 "\"behavior\": \"Sideways\"}, " MODEL "}",
                 PL_ERR_UNSUPPORTED, "Sideways");
    expect_error("{\"added_tokens\": [{\"content\": \"x\"}], " MODEL "}", PL_ERR_FORMAT,
                 "added_tokens");

    /* JSON the fast vocab/merges scanner gives up on (nesting deeper than it follows) still
     * loads, through jansson's tree */
    {
        char deep[4096] = "{\"deep\": ";
        for (int i = 0; i < 600; i++)
            strcat(deep, "[");
        for (int i = 0; i < 600; i++)
            strcat(deep, "]");
        strcat(deep, ", \"model\": {\"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, "
                     "\"merges\": [[\"a\", \"b\"]]}}");
        const char *path = write_tmp(deep);
        assert_int_equal(tok_load_files(path, NULL, &t), PL_OK);
        int32_t *ids;
        int n;
        assert_int_equal(tok_encode(t, "aba", 3, 0, &ids, &n), PL_OK);
        assert_int_equal(n, 2);
        assert_int_equal(ids[0], 2);
        assert_int_equal(ids[1], 0);
        free(ids);
        tok_destroy(t);
        unlink(path);
    }

    /* a config naming a token that does not exist */
    char json[256];
    snprintf(json, sizeof json, "{%s}", MODEL);
    char jp[64], cp[64];
    strcpy(jp, write_tmp(json));
    strcpy(cp, write_tmp("{\"bos_token\": {\"content\": \"<nope>\"}}"));
    assert_int_equal(tok_load_files(jp, cp, &t), PL_ERR_FORMAT);
    assert_non_null(strstr(pl_error(), "<nope>"));
    /* and one that does: bos as {content: ...}, add_bos_token */
    unlink(cp);
    strcpy(cp, write_tmp("{\"bos_token\": {\"content\": \"ab\"}, \"add_bos_token\": true, "
                         "\"model_max_length\": 1000000000000000019884624838656}"));
    assert_int_equal(tok_load_files(jp, cp, &t), PL_OK);
    assert_int_equal(tok_bos_id(t), 2);
    int32_t *ids;
    int n;
    assert_int_equal(tok_encode(t, "abab", 4, 1, &ids, &n), PL_OK);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 2);
    free(ids);
    tok_destroy(t);
    unlink(jp);
    unlink(cp);
    tok_destroy(NULL);
    tok_stream_destroy(NULL);
}

/* ---- lookups ------------------------------------------------------------------------------------
 */
static void test_api(void **state) {
    (void)state;
    Tokenizer *t = load_dir(TD "tinyllama-1.1b-chat-v1.0");
    assert_int_equal(tok_vocab_size(t), 32000);
    assert_int_equal(tok_bos_id(t), 1);
    assert_int_equal(tok_eos_id(t), 2);
    assert_int_equal(tok_token_to_id(t, "\xe2\x96\x81the"), 278);
    assert_int_equal(tok_token_to_id(t, "<0x0A>"), 13);
    assert_int_equal(tok_token_to_id(t, "\xe2\x80\xa8"), 31353);
    assert_int_equal(tok_token_to_id(t, "\xc2\xa0\xc2\xa0"), 8655); /* U+00A0 kept */
    assert_int_equal(tok_token_to_id(t, "no-such-token"), -1);
    assert_string_equal(tok_id_to_token(t, 15043), "\xe2\x96\x81Hello");
    assert_null(tok_id_to_token(t, -1));
    assert_null(tok_id_to_token(t, 32000));
    assert_true(tok_is_special(t, 1));
    assert_false(tok_is_special(t, 15043));
    assert_false(tok_is_special(t, 99999));
    int32_t odd[] = {-5, 15043, 99999, 3186};
    char *d = tok_decode(t, odd, 4, 0, NULL);
    assert_string_equal(d, "Hello world");
    free(d);
    d = tok_decode(t, NULL, 0, 1, NULL);
    assert_string_equal(d, "");
    free(d);
    tok_destroy(t);

    t = load_dir(TD "gpt2");
    assert_int_equal(tok_vocab_size(t), 50257);
    assert_int_equal(tok_token_to_id(t, "hello"), 31373);
    assert_int_equal(tok_token_to_id(t, "\xc4\xa0world"), 995);
    assert_int_equal(tok_token_to_id(t, "\xc4\xa0the"), 262);
    assert_int_equal(tok_token_to_id(t, "\xc4\xa0"
                                        "Claude"),
                     40559);
    assert_true(tok_is_special(t, 50256));
    assert_int_equal(tok_bos_id(t), -1); /* its tokenizer_config.json names none */
    tok_destroy(t);

    t = load_dir(TD "smollm-135m");
    assert_int_equal(tok_vocab_size(t), 49153); /* [PAD] = 49152 */
    assert_int_equal(tok_bos_id(t), 0);
    assert_int_equal(tok_eos_id(t), 0);
    tok_destroy(t);

    t = load_dir(TD "falcon-7b");
    assert_int_equal(tok_vocab_size(t), 65024);
    assert_int_equal(tok_eos_id(t), 11);
    tok_destroy(t);

    t = load_file(TD "variants/bl-llama3.json"); /* no config: BOS from the template */
    assert_int_equal(tok_bos_id(t), 3256);
    tok_destroy(t);
}

/* ---- threads: one Tokenizer used by several threads at once ---------------------------------- */
typedef struct {
    const Tokenizer *t;
    json_t *corpus;
    int mismatches;
    int32_t **want;
    int *nwant;
} ThreadArg;

static void *thread_main(void *p) {
    ThreadArg *a = p;
    for (int rep = 0; rep < 5; rep++)
        for (size_t i = 0; i < json_array_size(a->corpus); i++) {
            json_t *s = json_array_get(a->corpus, i);
            int32_t *ids;
            int n;
            tok_encode(a->t, json_string_value(s), json_string_length(s), 1, &ids, &n);
            if (n != a->nwant[i] || memcmp(ids, a->want[i], (size_t)n * sizeof *ids))
                a->mismatches++;
            char *d = tok_decode(a->t, ids, n, 1, NULL);
            free(d);
            free(ids);
        }
    return NULL;
}

static void test_threads(void **state) {
    (void)state;
    json_t *corpus = load_json(TD "corpus.json");
    const char *dirs[] = {TD "gpt2", TD "tinyllama-1.1b-chat-v1.0"};
    for (size_t d = 0; d < 2; d++) {
        Tokenizer *t = load_dir(dirs[d]);
        size_t nc = json_array_size(corpus);
        int32_t **want = calloc(nc, sizeof *want);
        int *nwant = calloc(nc, sizeof *nwant);
        for (size_t i = 0; i < nc; i++) {
            json_t *s = json_array_get(corpus, i);
            tok_encode(t, json_string_value(s), json_string_length(s), 1, &want[i], &nwant[i]);
        }
        pthread_t th[4];
        ThreadArg args[4];
        for (int k = 0; k < 4; k++) {
            args[k] = (ThreadArg){t, corpus, 0, want, nwant};
            pthread_create(&th[k], NULL, thread_main, &args[k]);
        }
        for (int k = 0; k < 4; k++) {
            pthread_join(th[k], NULL);
            assert_int_equal(args[k].mismatches, 0);
        }
        for (size_t i = 0; i < nc; i++)
            free(want[i]);
        free(want);
        free(nwant);
        tok_destroy(t);
    }
    json_decref(corpus);
}

/* ---- long inputs: the merge loop must not be quadratic ----------------------------------------
 */
static void round_trip_long(const char *dir, const char *unit, size_t reps, int sp) {
    Tokenizer *t = load_dir(dir);
    size_t ul = strlen(unit), len = ul * reps;
    char *text = malloc(len + 1);
    for (size_t i = 0; i < reps; i++)
        memcpy(text + i * ul, unit, ul);
    text[len] = 0;
    double t0 = pl_now();
    int32_t *ids;
    int n;
    assert_int_equal(tok_encode(t, text, len, 0, &ids, &n), PL_OK);
    double t1 = pl_now();
    char *d = tok_decode(t, ids, n, 1, NULL);
    double t2 = pl_now();
    /* SentencePiece-style: the dummy prefix space is stripped again by the decoder */
    assert_true(strlen(d) == len && !memcmp(d, text, len));
    fprintf(stderr, "[ long      ] %-40.40s %zu bytes -> %d ids: encode %.1f ms, decode %.1f ms\n",
            dir, len, n, (t1 - t0) * 1e3, (t2 - t1) * 1e3);
    assert_true(t1 - t0 < 20.0); /* generous for sanitizer builds; quadratic would be minutes */
    (void)sp;
    free(d);
    free(ids);
    free(text);
    tok_destroy(t);
}

static void test_long_inputs(void **state) {
    (void)state;
    round_trip_long(TD "gpt2", "The quick brown fox jumps over the lazy dog. ", 20000, 0);
    round_trip_long(TD "gpt2", "a", 200000, 0); /* one 200k-byte pre-token */
    round_trip_long(TD "tinyllama-1.1b-chat-v1.0", "The quick brown fox, 你好. ", 20000, 1);
    round_trip_long(TD "tinyllama-1.1b-chat-v1.0", "ab", 100000, 1);
    round_trip_long(TD "falcon-7b", "x = 1234567; y += x*2\n", 20000, 0);
}

/* Decoding no ids (or only skipped special ids) gives "" (regression: the fuzzer's
 * tests/fuzz/crashes/tokenizer/ubsan-null-plus-zero-empty-decode, NULL + 0 in Strip). */
static void test_decode_nothing(void **state) {
    (void)state;
    Tokenizer *t = load_dir("models/stories260K");
    int32_t bos = 1;
    char *a = tok_decode(t, &bos, 0, 1, NULL), *b = tok_decode(t, &bos, 1, 1, NULL);
    assert_string_equal(a, "");
    assert_string_equal(b, "");
    free(a);
    free(b);
    tok_destroy(t);
}

/* NUL is a character like any other (JSON's \u0000): encoded through byte fallback (stories260K,
 * <0x00> = 3) or as byte-level U+0100 (GPT-2), decoded and streamed back with its length. */
static void test_nul_character(void **state) {
    (void)state;
    const char *dirs[] = {"models/stories260K", TD "gpt2"};
    for (int d = 0; d < 2; d++) {
        Tokenizer *t = load_dir(dirs[d]);
        static const char text[] = "a\0b\0";
        int32_t *ids;
        int n;
        assert_int_equal(tok_encode(t, text, 4, 0, &ids, &n), PL_OK);
        assert_true(n >= 3);
        if (d == 0)
            assert_int_equal(ids[1], 3); /* "<0x00>" */
        size_t len;
        char *back = tok_decode(t, ids, n, 1, &len);
        assert_int_equal(len, 4);
        assert_memory_equal(back, text, 5);
        free(back);
        TokStream *s = tok_stream_create(t, NULL, 0, 1);
        char acc[16];
        size_t at = 0;
        for (int i = 0; i < n; i++) {
            const char *p = tok_stream_push(s, ids[i], &len);
            assert_true(at + len < sizeof acc);
            memcpy(acc + at, p, len);
            at += len;
        }
        tok_stream_finish(s, &len);
        assert_int_equal(len, 0);
        assert_int_equal(at, 4);
        assert_memory_equal(acc, text, 4);
        tok_stream_destroy(s);
        free(ids);
        tok_destroy(t);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories_golden),
        cmocka_unit_test(test_stream_keeps_special_tokens),
        cmocka_unit_test(test_nul_character),
        cmocka_unit_test(test_ref_stories),
        cmocka_unit_test(test_ref_gpt2),
        cmocka_unit_test(test_ref_falcon),
        cmocka_unit_test(test_ref_smollm),
        cmocka_unit_test(test_ref_tinyllama),
        cmocka_unit_test(test_ref_bl_llama3),
        cmocka_unit_test(test_ref_bl_splits),
        cmocka_unit_test(test_ref_bl_invert),
        cmocka_unit_test(test_ref_bl_ws),
        cmocka_unit_test(test_ref_bl_whitespace),
        cmocka_unit_test(test_ref_bl_added),
        cmocka_unit_test(test_ref_bl_qwen2),
        cmocka_unit_test(test_ref_sp_meta_first),
        cmocka_unit_test(test_ref_sp_meta_always),
        cmocka_unit_test(test_golden_gpt2_multilingual),
        cmocka_unit_test(test_golden_tinyllama_multilingual),
        cmocka_unit_test(test_golden_encoded),
        cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_stream_tokenizers),
        cmocka_unit_test(test_stream_byte_fallback),
        cmocka_unit_test(test_stream_byte_level),
        cmocka_unit_test(test_token_bytes),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_api),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_long_inputs),
        cmocka_unit_test(test_decode_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
