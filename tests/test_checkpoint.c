/* test_checkpoint.c - safetensors reading (models/safetensors.c) and weight binding / dummy
 * weights (models/weights.c).
 *
 * Opens the bundled stories260K checkpoint and checks known values, then writes malformed
 * and sharded checkpoints into a temporary folder at test time: every error must come back
 * as a non-OK status whose message names the file and, where one is involved, the tensor.
 * Run from the repository root. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <ftw.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model.h"
#include "safetensors.h"
#include "weights.h"

#define STORIES "models/stories260K"

static char tmp_root[256];

/* ---- helpers -------------------------------------------------------------------------- */

static void expect_error(Status s, const char *n1, const char *n2, const char *n3) {
    const char *msg = pl_error();
    if (getenv("PL_TEST_VERBOSE")) /* to read the messages */
        fprintf(stderr, "  error: %s\n", msg);
    if (s == PL_OK || !strstr(msg, n1) || (n2 && !strstr(msg, n2)) || (n3 && !strstr(msg, n3)))
        fail_msg("status %s, message '%s' (want '%s'%s%s%s%s)", pl_status_str(s), msg, n1,
                 n2 ? ", " : "", n2 ? n2 : "", n3 ? ", " : "", n3 ? n3 : "");
}

/* A fresh folder under the test's temporary root (static buffer). */
static const char *make_dir(const char *name) {
    static char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", tmp_root, name);
    assert_int_equal(mkdir(dir, 0755), 0);
    return dir;
}

static char *path_in(const char *dir, const char *name) {
    static char p[2][600];
    static int k;
    k ^= 1;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

/* A safetensors file from a header string and data bytes; `claimed_len` (if not ~0) is
 * written as the header length instead of the real one. */
static void write_st_raw(const char *path, uint64_t claimed_len, const char *header,
                         const void *data, size_t data_len) {
    size_t hl = strlen(header);
    uint64_t n = claimed_len == ~0ull ? hl : claimed_len;
    unsigned char *buf = malloc(8 + hl + data_len + 1);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)(n >> (8 * i));
    memcpy(buf + 8, header, hl);
    if (data_len)
        memcpy(buf + 8 + hl, data, data_len);
    write_bytes(path, buf, 8 + hl + data_len);
    free(buf);
}

static void write_st(const char *path, const char *header, size_t data_len) {
    void *zeros = calloc(1, data_len + 1);
    write_st_raw(path, ~0ull, header, zeros, data_len);
    free(zeros);
}

/* ---- a tiny model checkpoint built at test time --------------------------------------- */

typedef struct {
    char name[96];
    const char *dtype;
    int ndim;
    int64_t shape[2];
    int shard; /* 0 or 1 */
} Entry;

#define MAX_ENTRIES 64

static const char *tiny_json(int tied, int bias) {
    static char buf[512];
    snprintf(buf, sizeof buf,
             "{\"architectures\": [\"%s\"], \"hidden_size\": 8, \"intermediate_size\": 16,"
             " \"num_hidden_layers\": 2, \"num_attention_heads\": 2,"
             " \"num_key_value_heads\": 1, \"head_dim\": 4, \"vocab_size\": 16,"
             " \"tie_word_embeddings\": %s}",
             bias ? "Qwen2ForCausalLM" : "LlamaForCausalLM", tied ? "true" : "false");
    return buf;
}

static ModelConfig tiny_config(int tied, int bias) {
    ModelConfig c;
    assert_int_equal(model_config_parse(tiny_json(tied, bias), "tiny/config.json", &c), PL_OK);
    return c;
}

static void add(Entry *e, int *n, const char *name, int64_t d0, int64_t d1) {
    Entry *x = &e[(*n)++];
    snprintf(x->name, sizeof x->name, "%s", name);
    x->dtype = "F32";
    x->ndim = d1 ? 2 : 1;
    x->shape[0] = d0;
    x->shape[1] = d1;
    x->shard = 0;
}

/* Every tensor a config needs, in F32. */
static int model_entries(const ModelConfig *c, Entry *e) {
    int n = 0;
    const int64_t H = c->hidden_size, I = c->intermediate_size, V = c->vocab_size;
    const int64_t QD = c->num_heads * c->head_dim, KD = c->num_kv_heads * c->head_dim;
    add(e, &n, "model.embed_tokens.weight", V, H);
    for (int i = 0; i < c->num_layers; i++) {
        char p[96];
#define L(suffix, d0, d1)                                                                          \
    snprintf(p, sizeof p, "model.layers.%d.%s", i, suffix);                                        \
    add(e, &n, p, d0, d1)
        L("input_layernorm.weight", H, 0);
        L("self_attn.q_proj.weight", QD, H);
        L("self_attn.k_proj.weight", KD, H);
        L("self_attn.v_proj.weight", KD, H);
        if (c->qkv_bias) {
            L("self_attn.q_proj.bias", QD, 0);
            L("self_attn.k_proj.bias", KD, 0);
            L("self_attn.v_proj.bias", KD, 0);
        }
        L("self_attn.o_proj.weight", H, QD);
        L("post_attention_layernorm.weight", H, 0);
        L("mlp.gate_proj.weight", I, H);
        L("mlp.up_proj.weight", I, H);
        L("mlp.down_proj.weight", H, I);
#undef L
    }
    add(e, &n, "model.norm.weight", H, 0);
    if (!c->tie_word_embeddings)
        add(e, &n, "lm_head.weight", V, H);
    PL_CHECK(n <= MAX_ENTRIES);
    return n;
}

static Entry *find_entry(Entry *e, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(e[i].name, name) == 0)
            return &e[i];
    fail_msg("no entry %s", name);
    return NULL;
}

static void remove_entry(Entry *e, int *n, const char *name) {
    Entry *x = find_entry(e, *n, name);
    memmove(x, x + 1, (size_t)(e + *n - (x + 1)) * sizeof *x);
    (*n)--;
}

static size_t dtype_bytes(const char *dt) {
    if (!strcmp(dt, "F32") || !strcmp(dt, "I32"))
        return 4;
    if (!strcmp(dt, "F16") || !strcmp(dt, "BF16"))
        return 2;
    if (!strcmp(dt, "I64") || !strcmp(dt, "F64"))
        return 8;
    return 1;
}

/* Write the entries of `shard` (-1: all) as one safetensors file. Element k of the i-th
 * entry holds 0.5 + k (in F32), so data can be checked after reading. */
static void write_entries(const char *path, const Entry *e, int n, int shard) {
    json_t *h = json_object();
    json_object_set_new(h, "__metadata__", json_pack("{s:s}", "format", "pt"));
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        if (shard >= 0 && e[i].shard != shard)
            continue;
        size_t ne = (size_t)e[i].shape[0] * (size_t)(e[i].ndim == 2 ? e[i].shape[1] : 1);
        size_t nb = ne * dtype_bytes(e[i].dtype);
        json_t *shape = json_array();
        for (int d = 0; d < e[i].ndim; d++)
            json_array_append_new(shape, json_integer(e[i].shape[d]));
        json_object_set_new(h, e[i].name,
                            json_pack("{s:s,s:o,s:[I,I]}", "dtype", e[i].dtype, "shape", shape,
                                      "data_offsets", (json_int_t)off, (json_int_t)(off + nb)));
        off += nb;
    }
    char *header = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(h);
    /* Pad with spaces so the data starts 8-byte aligned, as the safetensors library does. */
    size_t hl = strlen(header), padded = (8 + hl + 7) / 8 * 8 - 8;
    header = realloc(header, padded + 1);
    memset(header + hl, ' ', padded - hl);
    header[padded] = '\0';
    unsigned char *data = calloc(1, off + 1);
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        if (shard >= 0 && e[i].shard != shard)
            continue;
        size_t ne = (size_t)e[i].shape[0] * (size_t)(e[i].ndim == 2 ? e[i].shape[1] : 1);
        for (size_t k = 0; k < ne; k++) {
            float v = 0.5f + (float)k;
            if (!strcmp(e[i].dtype, "F32"))
                memcpy(data + at + 4 * k, &v, 4);
            else if (!strcmp(e[i].dtype, "BF16")) {
                uint16_t b = pl_f32_to_bf16(v);
                memcpy(data + at + 2 * k, &b, 2);
            } else if (!strcmp(e[i].dtype, "F16")) {
                uint16_t b = pl_f32_to_f16(v);
                memcpy(data + at + 2 * k, &b, 2);
            }
        }
        at += ne * dtype_bytes(e[i].dtype);
    }
    write_st_raw(path, ~0ull, header, data, off);
    free(data);
    free(header);
}

/* An index.json mapping each entry to model-0000{shard+1}-of-00002.safetensors. */
static void write_index(const char *dir, const Entry *e, int n) {
    json_t *map = json_object();
    for (int i = 0; i < n; i++)
        json_object_set_new(map, e[i].name,
                            json_string(e[i].shard ? "model-00002-of-00002.safetensors"
                                                   : "model-00001-of-00002.safetensors"));
    json_t *root = json_pack("{s:{s:i},s:o}", "metadata", "total_size", 0, "weight_map", map);
    json_dump_file(root, path_in(dir, "model.safetensors.index.json"), JSON_INDENT(2));
    json_decref(root);
}

/* Write a two-shard checkpoint: layer 1 and the final tensors in shard 2. */
static void write_sharded(const char *dir, Entry *e, int n) {
    for (int i = 0; i < n; i++)
        e[i].shard = strstr(e[i].name, "layers.1.") || !strcmp(e[i].name, "model.norm.weight") ||
                     !strcmp(e[i].name, "lm_head.weight");
    write_entries(path_in(dir, "model-00001-of-00002.safetensors"), e, n, 0);
    write_entries(path_in(dir, "model-00002-of-00002.safetensors"), e, n, 1);
}

/* Open `dir` and bind `cfg` from it; returns the status of whichever failed first. */
static Status open_and_bind(const char *dir, const ModelConfig *cfg) {
    StCheckpoint *ck = NULL;
    Status s = st_open(dir, &ck);
    if (s != PL_OK)
        return s;
    ModelWeights w;
    s = weights_bind(cfg, ck, NULL, &w);
    if (s == PL_OK)
        weights_free(&w);
    st_close(ck);
    return s;
}

/* ---- stories260K ---------------------------------------------------------------------- */

static uint32_t f32_bits(const void *p) {
    uint32_t u;
    memcpy(&u, p, 4);
    return u;
}

static void test_stories_open(void **state) {
    StCheckpoint *ck = NULL;
    assert_int_equal(st_open(STORIES, &ck), PL_OK);
    assert_int_equal(st_count(ck), 47);
    assert_string_equal(st_tensor(ck, 0)->name, "model.embed_tokens.weight");
    assert_string_equal(st_tensor(ck, 46)->name, "model.norm.weight");
    assert_string_equal(st_tensor(ck, 0)->file, STORIES "/model.safetensors");

    const StTensor *norm = st_find(ck, "model.norm.weight");
    assert_non_null(norm);
    assert_int_equal(norm->dtype, DT_F32);
    assert_string_equal(norm->dtype_name, "F32");
    assert_int_equal(norm->ndim, 1);
    assert_int_equal(norm->shape[0], 64);
    assert_int_equal(norm->nbytes, 256);
    /* First value 2.4583089351654053 (read from the file with a stand-alone parser). */
    assert_int_equal(f32_bits(norm->data), 0x401d54efu);

    const StTensor *emb = st_find(ck, "model.embed_tokens.weight");
    assert_int_equal(emb->ndim, 2);
    assert_int_equal(emb->shape[0], 512);
    assert_int_equal(emb->shape[1], 64);
    assert_int_equal(f32_bits(emb->data), 0xbe96e950u); /* -0.29474878 */
    /* data_offsets: embed [0, 131072], norm [1039872, 1040128]. */
    assert_int_equal((const char *)norm->data - (const char *)emb->data, 1039872);

    const StTensor *q = st_find(ck, "model.layers.3.self_attn.k_proj.weight");
    assert_non_null(q);
    assert_int_equal(q->shape[0], 32);
    assert_int_equal(q->shape[1], 64);
    assert_null(st_find(ck, "lm_head.weight"));
    assert_null(st_find(ck, "model.norm"));
    assert_null(st_find(ck, ""));
    st_close(ck);

    /* The same file opened directly. */
    assert_int_equal(st_open_file(STORIES "/model.safetensors", &ck), PL_OK);
    assert_int_equal(st_count(ck), 47);
    st_close(ck);
    st_close(NULL);
}

/* Tensor-parallel shards: head and MLP ranges, replicated KV heads, and the bound shard of
 * stories260K (8 heads, 4 KV heads of 8, intermediate 172) equal to slices of the whole. */
static void test_shard_bind(void **state) {
    (void)state;
    ModelConfig cfg;
    assert_int_equal(model_config_load(STORIES, &cfg), PL_OK);
    ModelShard s;
    assert_int_equal(model_shard(&cfg, 1, 2, &s), PL_OK);
    assert_int_equal(s.num_heads, 4);
    assert_int_equal(s.first_head, 4);
    assert_int_equal(s.num_kv_heads, 2);
    assert_int_equal(s.first_kv_head, 2);
    assert_int_equal(s.intermediate, 86);
    assert_int_equal(s.first_inter, 86);
    ModelConfig two_kv = cfg;
    two_kv.num_kv_heads = 2;
    assert_int_equal(model_shard(&two_kv, 3, 4, &s), PL_OK); /* KV heads replicated */
    assert_int_equal(s.num_kv_heads, 1);
    assert_int_equal(s.first_kv_head, 1); /* query heads 6, 7 read KV head 1 */
    assert_int_equal(model_shard(&cfg, 0, 3, &s), PL_ERR_INVALID);
    assert_non_null(strstr(pl_error(), "tensor-parallel-size 3"));

    StCheckpoint *ck = NULL;
    assert_int_equal(st_open(STORIES, &ck), PL_OK);
    ModelWeights whole, part;
    ModelShard r1;
    assert_int_equal(model_shard(&cfg, 1, 2, &r1), PL_OK);
    assert_int_equal(weights_bind(&cfg, ck, NULL, &whole), PL_OK);
    assert_int_equal(weights_bind(&cfg, ck, &r1, &part), PL_OK);
    const LayerWeights *w = &whole.layers[2], *p = &part.layers[2];
    const float *wq = w->wqkv.data, *pq = p->wqkv.data;
    assert_int_equal(p->wqkv.shape[0], 32 + 16 + 16);
    assert_memory_equal(pq, wq + 32 * 64, 32 * 64 * 4);                  /* q heads 4..7 */
    assert_memory_equal(pq + 32 * 64, wq + (64 + 16) * 64, 16 * 64 * 4); /* k heads 2, 3 */
    assert_memory_equal(pq + 48 * 64, wq + (96 + 16) * 64, 16 * 64 * 4); /* v heads 2, 3 */
    assert_int_equal(p->wo.shape[0], 64);
    assert_int_equal(p->wo.shape[1], 32);
    for (int r = 0; r < 64; r++)
        assert_memory_equal((const float *)p->wo.data + r * 32,
                            (const float *)w->wo.data + r * 64 + 32, 32 * 4);
    const float *wg = w->w_gate_up.data, *pg = p->w_gate_up.data;
    assert_int_equal(p->w_gate_up.shape[0], 2 * 86);
    assert_memory_equal(pg, wg + 86 * 64, 86 * 64 * 4);                   /* gate rows 86.. */
    assert_memory_equal(pg + 86 * 64, wg + (172 + 86) * 64, 86 * 64 * 4); /* up rows 86.. */
    assert_int_equal(p->w_down.shape[1], 86);
    for (int r = 0; r < 64; r++)
        assert_memory_equal((const float *)p->w_down.data + r * 86,
                            (const float *)w->w_down.data + r * 172 + 86, 86 * 4);
    /* vocabulary rows 256..511 (a view); the tied LM head is the same slice */
    assert_int_equal(part.embed.shape[0], 256);
    assert_ptr_equal(part.embed.data, (const float *)whole.embed.data + 256 * 64);
    assert_ptr_equal(part.lm_head.data, part.embed.data);
    weights_free(&whole);
    weights_free(&part);
    st_close(ck);
}

static void test_stories_bind(void **state) {
    ModelConfig cfg;
    assert_int_equal(model_config_load(STORIES, &cfg), PL_OK);
    StCheckpoint *ck = NULL;
    assert_int_equal(st_open(STORIES, &ck), PL_OK);
    ModelWeights w;
    assert_int_equal(weights_bind(&cfg, ck, NULL, &w), PL_OK);
    assert_ptr_equal(w.lm_head.data, w.embed.data); /* tied */
    assert_int_equal(w.embed.shape[0], 512);
    assert_int_equal(w.embed.shape[1], 64);
    assert_int_equal(f32_bits(w.final_norm.data), 0x401d54efu);
    assert_int_equal(w.final_norm.ndim, 1);
    const LayerWeights *l4 = &w.layers[4];
    /* q (64 rows), k (32), v (32) fused: v_proj's first element follows 96 rows of 64 */
    assert_int_equal(l4->wqkv.shape[0], 128);
    assert_int_equal(l4->wqkv.shape[1], 64);
    assert_int_equal(f32_bits((const float *)l4->wqkv.data + 96 * 64), 0x3d6784c9u);
    assert_int_equal(l4->wo.shape[1], 64);
    assert_int_equal(l4->w_gate_up.shape[0], 2 * 172);
    assert_int_equal(l4->w_down.shape[1], 172);
    assert_int_equal(l4->w_down.dtype, DT_F32);
    assert_null(l4->bqkv.data);
    weights_free(&w);
    assert_null(w.layers);

    /* Untied, it needs lm_head.weight, which stories260K does not have. */
    cfg.tie_word_embeddings = 0;
    expect_error(weights_bind(&cfg, ck, NULL, &w), STORIES "/model.safetensors",
                 "missing tensor 'lm_head.weight'", NULL);
    st_close(ck);
}

/* ---- malformed files ------------------------------------------------------------------ */

static void test_truncated(void **state) {
    char *data;
    size_t len;
    assert_int_equal(pl_read_file(STORIES "/model.safetensors", &data, &len), PL_OK);
    const char *dir = make_dir("truncated");
    const char *p = path_in(dir, "model.safetensors");
    StCheckpoint *ck = NULL;

    /* Cut in the data: the first tensor reaching past the end is named. */
    write_bytes(p, data, 600000);
    expect_error(st_open(dir, &ck), p, "model.layers.2.mlp.up_proj.weight", "truncated");
    assert_null(ck);
    /* Cut in the header. */
    write_bytes(p, data, 100);
    expect_error(st_open(dir, &ck), p, "header length 4856", "truncated");
    /* Too short for the length field, and empty. */
    write_bytes(p, data, 5);
    expect_error(st_open(dir, &ck), p, "too short", NULL);
    write_bytes(p, data, 0);
    expect_error(st_open(dir, &ck), p, "too short", NULL);
    /* Missing only the last byte. */
    write_bytes(p, data, len - 1);
    expect_error(st_open(dir, &ck), p, "model.norm.weight", "truncated");
    free(data);
}

static void test_header_length(void **state) {
    const char *dir = make_dir("hdrlen");
    const char *p = path_in(dir, "model.safetensors");
    StCheckpoint *ck = NULL;
    const char *h = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    write_st_raw(p, 1000, h, "12345678", 8);
    expect_error(st_open(dir, &ck), p, "header length 1000", "larger than the file");
    write_st_raw(p, 1ull << 40, h, "12345678", 8);
    expect_error(st_open(dir, &ck), p, "absurd", NULL);
    write_st_raw(p, 0, "", NULL, 0);
    expect_error(st_open(dir, &ck), p, "not valid JSON", NULL);
}

static void test_offsets_beyond_data(void **state) {
    const char *dir = make_dir("beyond");
    const char *p = path_in(dir, "model.safetensors");
    StCheckpoint *ck = NULL;
    write_st(p,
             "{\"ok\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
             "\"w.big\":{\"dtype\":\"F32\",\"shape\":[100],\"data_offsets\":[16,416]}}",
             16);
    expect_error(st_open(dir, &ck), p, "'w.big'", "truncated");
}

static void test_overlap(void **state) {
    const char *dir = make_dir("overlap");
    const char *p = path_in(dir, "model.safetensors");
    StCheckpoint *ck = NULL;
    write_st(p,
             "{\"first\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]},"
             "\"second\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
             12);
    expect_error(st_open(dir, &ck), p, "'first'", "'second'");
    assert_non_null(strstr(pl_error(), "overlap"));
    /* Empty tensors and adjacent spans are fine. */
    write_st(p,
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"e\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[4,4]},"
             "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[8,12]}}",
             12);
    assert_int_equal(st_open(dir, &ck), PL_OK);
    assert_int_equal(st_count(ck), 3);
    assert_int_equal(st_find(ck, "e")->nbytes, 0);
    assert_int_equal(st_find(ck, "b")->dtype, DT_BF16);
    st_close(ck);
}

static void test_byte_count_mismatch(void **state) {
    const char *dir = make_dir("mismatch");
    const char *p = path_in(dir, "model.safetensors");
    StCheckpoint *ck = NULL;
    write_st(p, "{\"w.x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8);
    expect_error(st_open(dir, &ck), p, "'w.x'", "needs 12");
    write_st(p, "{\"w.y\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 16);
    expect_error(st_open(dir, &ck), p, "'w.y'", "needs 8");
    /* Shapes whose byte count overflows 64 bits. */
    write_st(p,
             "{\"w.z\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
             "\"data_offsets\":[0,8]}}",
             8);
    expect_error(st_open(dir, &ck), p, "'w.z'", "too large");
}

static void test_dtypes(void **state) {
    const char *dir = make_dir("dtypes");
    const char *p = path_in(dir, "model.safetensors");
    StCheckpoint *ck = NULL;
    write_st(p, "{\"w.q\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8);
    expect_error(st_open(dir, &ck), p, "'w.q'", "unknown dtype 'F33'");
    write_st(p, "{\"w.q\":{\"dtype\":7,\"shape\":[2],\"data_offsets\":[0,8]}}", 8);
    expect_error(st_open(dir, &ck), p, "'w.q'", "dtype");
    /* Dtypes pagellm does not compute with still open, as DT_OTHER. */
    write_st(p,
             "{\"__metadata__\":{\"format\":\"pt\"},"
             "\"pos\":{\"dtype\":\"I64\",\"shape\":[3],\"data_offsets\":[0,24]},"
             "\"mask\":{\"dtype\":\"BOOL\",\"shape\":[2,2],\"data_offsets\":[24,28]},"
             "\"f8\":{\"dtype\":\"F8_E4M3\",\"shape\":[4],\"data_offsets\":[28,32]},"
             "\"h\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[32,36]}}",
             36);
    assert_int_equal(st_open(dir, &ck), PL_OK);
    assert_int_equal(st_count(ck), 4);
    assert_int_equal(st_find(ck, "pos")->dtype, DT_OTHER);
    assert_string_equal(st_find(ck, "pos")->dtype_name, "I64");
    assert_string_equal(st_find(ck, "mask")->dtype_name, "BOOL");
    assert_int_equal(st_find(ck, "h")->dtype, DT_F16);
    assert_null(st_find(ck, "__metadata__"));
    st_close(ck);
}

static void test_bad_json_and_entries(void **state) {
    const char *dir = make_dir("badjson");
    const char *p = path_in(dir, "model.safetensors");
    StCheckpoint *ck = NULL;
    static const struct {
        const char *header, *n1, *n2;
    } cases[] = {
        {"{\"a\":{\"dtype\":\"F32\",", "not valid JSON", NULL},
        {"[1,2,3]", "not a JSON object", NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
         "not valid JSON", "duplicate"},
        {"{\"w.a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", "'w.a'", "missing 'dtype'"},
        {"{\"w.a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", "'w.a'", "missing 'shape'"},
        {"{\"w.a\":{\"dtype\":\"F32\",\"shape\":[1]}}", "'w.a'", "missing 'data_offsets'"},
        {"{\"w.a\":[1]}", "'w.a'", "not an object"},
        {"{\"w.a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", "'w.a'",
         "end before begin"},
        {"{\"w.a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", "'w.a'",
         "[begin, end]"},
        {"{\"w.a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[\"0\",4]}}", "'w.a'",
         "[begin, end]"},
        {"{\"w.a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,4]}}", "'w.a'",
         "[begin, end]"},
        {"{\"w.a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
         "'w.a'", "9 dimensions"},
        {"{\"w.a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", "'w.a'",
         "non-negative"},
        {"{\"w.a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", "'w.a'",
         "non-negative"},
        {"{\"w.a\":{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,4]}}", "'w.a'",
         "not an array"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_st(p, cases[i].header, 8);
        expect_error(st_open(dir, &ck), p, cases[i].n1, cases[i].n2);
        assert_null(ck);
    }
    /* An eight-dimensional tensor is fine. */
    write_st(p, "{\"w.a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,2],\"data_offsets\":[0,8]}}",
             8);
    assert_int_equal(st_open(dir, &ck), PL_OK);
    assert_int_equal(st_find(ck, "w.a")->ndim, 8);
    st_close(ck);
}

static void test_no_checkpoint(void **state) {
    const char *dir = make_dir("nothing");
    StCheckpoint *ck = NULL;
    expect_error(st_open(dir, &ck), "no model.safetensors or model.safetensors.index.json in", dir,
                 NULL);
    expect_error(st_open_file(path_in(dir, "x.safetensors"), &ck), path_in(dir, "x.safetensors"),
                 NULL, NULL);
}

/* ---- binding errors ------------------------------------------------------------------- */

static void test_bind_tiny(void **state) {
    const char *dir = make_dir("tiny_ok");
    ModelConfig cfg = tiny_config(0, 0);
    Entry e[MAX_ENTRIES];
    int n = model_entries(&cfg, e);
    /* Mixed dtypes are allowed. */
    find_entry(e, n, "model.embed_tokens.weight")->dtype = "BF16";
    find_entry(e, n, "model.layers.1.self_attn.q_proj.weight")->dtype = "F16";
    write_entries(path_in(dir, "model.safetensors"), e, n, -1);
    StCheckpoint *ck = NULL;
    assert_int_equal(st_open(dir, &ck), PL_OK);
    assert_int_equal(st_count(ck), n);
    ModelWeights w;
    assert_int_equal(weights_bind(&cfg, ck, NULL, &w), PL_OK);
    assert_int_equal(w.embed.dtype, DT_BF16);
    /* q in F16 with k, v in F32: the fused tensor is F32; layer 0 keeps the common F32 */
    assert_int_equal(w.layers[1].wqkv.dtype, DT_F32);
    assert_int_equal(w.layers[0].wqkv.dtype, DT_F32);
    assert_ptr_not_equal(w.lm_head.data, w.embed.data);
    assert_int_equal(w.lm_head.shape[0], 16);
    assert_int_equal(w.layers[0].wqkv.shape[0], 8 + 4 + 4);
    assert_int_equal(w.layers[0].wqkv.shape[1], 8);
    assert_float_equal(pl_bf16_to_f32(((const uint16_t *)w.embed.data)[3]), 3.5f, 0);
    assert_float_equal(((const float *)w.layers[1].wqkv.data)[2], 2.5f, 0);
    assert_float_equal(((const float *)w.layers[1].w_down.data)[5], 5.5f, 0);
    weights_free(&w);
    st_close(ck);
}

static void test_bind_wrong_dtype(void **state) {
    const char *dir = make_dir("tiny_dtype");
    ModelConfig cfg = tiny_config(0, 0);
    Entry e[MAX_ENTRIES];
    int n = model_entries(&cfg, e);
    find_entry(e, n, "model.layers.1.mlp.up_proj.weight")->dtype = "I64";
    const char *p = path_in(dir, "model.safetensors");
    write_entries(p, e, n, -1);
    expect_error(open_and_bind(dir, &cfg), p,
                 "tensor 'model.layers.1.mlp.up_proj.weight' has dtype I64, expected F32, F16 "
                 "or BF16",
                 NULL);
}

static void test_bind_wrong_shape(void **state) {
    const char *dir = make_dir("tiny_shape");
    ModelConfig cfg = tiny_config(0, 0);
    Entry e[MAX_ENTRIES];
    int n = model_entries(&cfg, e);
    find_entry(e, n, "model.layers.0.self_attn.k_proj.weight")->shape[0] = 8;
    Entry *norm = find_entry(e, n, "model.norm.weight");
    const char *p = path_in(dir, "model.safetensors");
    write_entries(p, e, n, -1);
    expect_error(open_and_bind(dir, &cfg), p,
                 "tensor 'model.layers.0.self_attn.k_proj.weight' has shape [8, 8], expected "
                 "[4, 8]",
                 NULL);
    /* A norm stored as [8, 1] is not [8]. */
    find_entry(e, n, "model.layers.0.self_attn.k_proj.weight")->shape[0] = 4;
    norm->ndim = 2;
    norm->shape[1] = 1;
    write_entries(p, e, n, -1);
    expect_error(open_and_bind(dir, &cfg), p,
                 "tensor 'model.norm.weight' has shape [8, 1], expected [8]", NULL);
}

/* Tensors whose data is not aligned to their element size are refused by weights_bind. */
static void test_bind_misaligned(void **state) {
    const char *dir = make_dir("tiny_misaligned");
    ModelConfig cfg = tiny_config(0, 0);
    Entry e[MAX_ENTRIES + 1];
    int n = 0;
    add(e, &n, "odd.scale", 1, 0); /* 2 bytes first: every later F32 tensor is misaligned */
    e[0].dtype = "BF16";
    n += model_entries(&cfg, e + 1);
    const char *p = path_in(dir, "model.safetensors");
    write_entries(p, e, n, -1);
    StCheckpoint *ck = NULL;
    assert_int_equal(st_open(dir, &ck), PL_OK); /* a valid file */
    st_close(ck);
    expect_error(open_and_bind(dir, &cfg), p, "'model.embed_tokens.weight'", "not aligned");
}

static void test_bind_missing(void **state) {
    const char *dir = make_dir("tiny_missing");
    ModelConfig cfg = tiny_config(0, 0);
    Entry e[MAX_ENTRIES];
    int n = model_entries(&cfg, e);
    remove_entry(e, &n, "model.layers.1.post_attention_layernorm.weight");
    const char *p = path_in(dir, "model.safetensors");
    write_entries(p, e, n, -1);
    expect_error(open_and_bind(dir, &cfg), p,
                 "missing tensor 'model.layers.1.post_attention_layernorm.weight'", NULL);

    /* lm_head: required untied, taken from the embedding when tied. */
    n = model_entries(&cfg, e);
    remove_entry(e, &n, "lm_head.weight");
    write_entries(p, e, n, -1);
    expect_error(open_and_bind(dir, &cfg), p, "missing tensor 'lm_head.weight'", NULL);
    ModelConfig tied = tiny_config(1, 0);
    assert_int_equal(open_and_bind(dir, &tied), PL_OK);

    /* Q/K/V biases: required when the config says so. */
    ModelConfig qwen = tiny_config(1, 1);
    expect_error(open_and_bind(dir, &qwen), p,
                 "missing tensor 'model.layers.0.self_attn.q_proj.bias'", NULL);
    n = model_entries(&qwen, e);
    find_entry(e, n, "model.layers.1.self_attn.v_proj.bias")->shape[0] = 8;
    write_entries(p, e, n, -1);
    expect_error(open_and_bind(dir, &qwen), p,
                 "tensor 'model.layers.1.self_attn.v_proj.bias' has shape [8], expected [4]", NULL);
    find_entry(e, n, "model.layers.1.self_attn.v_proj.bias")->shape[0] = 4;
    write_entries(p, e, n, -1);
    StCheckpoint *ck = NULL;
    assert_int_equal(st_open(dir, &ck), PL_OK);
    ModelWeights w;
    assert_int_equal(weights_bind(&qwen, ck, NULL, &w), PL_OK);
    assert_non_null(w.layers[1].bqkv.data);
    assert_int_equal(w.layers[1].bqkv.shape[0], 8 + 4 + 4);
    assert_int_equal(w.layers[1].bqkv.ndim, 1);
    assert_ptr_equal(w.lm_head.data, w.embed.data);
    weights_free(&w);
    st_close(ck);
}

/* ---- sharded checkpoints -------------------------------------------------------------- */

static void test_sharded_ok(void **state) {
    const char *dir = make_dir("sharded");
    ModelConfig cfg = tiny_config(0, 0);
    Entry e[MAX_ENTRIES];
    int n = model_entries(&cfg, e);
    write_sharded(dir, e, n);
    write_index(dir, e, n);
    StCheckpoint *ck = NULL;
    assert_int_equal(st_open(dir, &ck), PL_OK);
    assert_int_equal(st_count(ck), n);
    /* File order, then header order. */
    assert_string_equal(st_tensor(ck, 0)->name, "model.embed_tokens.weight");
    assert_non_null(strstr(st_tensor(ck, 0)->file, "model-00001-of-00002.safetensors"));
    assert_non_null(strstr(st_tensor(ck, n - 1)->file, "model-00002-of-00002.safetensors"));
    const StTensor *t = st_find(ck, "model.layers.1.mlp.down_proj.weight");
    assert_non_null(t);
    assert_string_equal(t->file, path_in(dir, "model-00002-of-00002.safetensors"));
    assert_float_equal(((const float *)t->data)[7], 7.5f, 0);
    ModelWeights w;
    assert_int_equal(weights_bind(&cfg, ck, NULL, &w), PL_OK);
    assert_float_equal(((const float *)w.lm_head.data)[1], 1.5f, 0);
    weights_free(&w);
    st_close(ck);

    /* A tensor missing from the whole sharded checkpoint: the folder is named. */
    const char *dir2 = make_dir("sharded_missing");
    remove_entry(e, &n, "model.layers.1.mlp.gate_proj.weight");
    write_sharded(dir2, e, n);
    write_index(dir2, e, n);
    char want[600];
    snprintf(want, sizeof want, "%s: missing tensor 'model.layers.1.mlp.gate_proj.weight'", dir2);
    expect_error(open_and_bind(dir2, &cfg), want, NULL, NULL);
}

static void test_sharded_errors(void **state) {
    ModelConfig cfg = tiny_config(0, 0);
    Entry e[MAX_ENTRIES];
    int n = model_entries(&cfg, e);
    StCheckpoint *ck = NULL;

    /* The index names a shard that is not there. */
    const char *dir = make_dir("shard_gone");
    write_sharded(dir, e, n);
    write_index(dir, e, n);
    assert_int_equal(unlink(path_in(dir, "model-00002-of-00002.safetensors")), 0);
    expect_error(st_open(dir, &ck), path_in(dir, "model-00002-of-00002.safetensors"),
                 "model.safetensors.index.json", NULL);

    /* The index puts a tensor in a shard that does not hold it. */
    dir = make_dir("shard_wrong");
    write_sharded(dir, e, n);
    find_entry(e, n, "model.layers.1.mlp.down_proj.weight")->shard = 0;
    write_index(dir, e, n);
    expect_error(st_open(dir, &ck), path_in(dir, "model-00001-of-00002.safetensors"),
                 "'model.layers.1.mlp.down_proj.weight'", "missing");

    /* The index lists a tensor that no shard has. */
    dir = make_dir("shard_absent");
    write_sharded(dir, e, n);
    add(e, &n, "model.extra.weight", 4, 0);
    e[n - 1].shard = 1;
    write_index(dir, e, n);
    n--;
    expect_error(st_open(dir, &ck), path_in(dir, "model-00002-of-00002.safetensors"),
                 "'model.extra.weight'", "missing");

    /* The same tensor in two shards. */
    dir = make_dir("shard_dup");
    write_sharded(dir, e, n);
    Entry dup[MAX_ENTRIES];
    memcpy(dup, e, sizeof(Entry) * (size_t)n);
    find_entry(dup, n, "model.embed_tokens.weight")->shard = 1;
    write_entries(path_in(dir, "model-00002-of-00002.safetensors"), dup, n, 1);
    write_index(dir, e, n);
    expect_error(st_open(dir, &ck), "'model.embed_tokens.weight'", "model-00001-of-00002",
                 "model-00002-of-00002");

    /* A broken index. */
    dir = make_dir("shard_badindex");
    write_sharded(dir, e, n);
    FILE *f = fopen(path_in(dir, "model.safetensors.index.json"), "w");
    fputs("{\"weight_map\": {", f);
    fclose(f);
    expect_error(st_open(dir, &ck), "model.safetensors.index.json", "invalid JSON", NULL);
    f = fopen(path_in(dir, "model.safetensors.index.json"), "w");
    fputs("{\"metadata\": {}}", f);
    fclose(f);
    expect_error(st_open(dir, &ck), "model.safetensors.index.json", "weight_map", NULL);
    f = fopen(path_in(dir, "model.safetensors.index.json"), "w");
    fputs("{\"weight_map\": {\"a\": \"../model-00001-of-00002.safetensors\"}}", f);
    fclose(f);
    expect_error(st_open(dir, &ck), "model.safetensors.index.json", "'a'", NULL);
    assert_null(ck);
}

/* ---- dummy weights -------------------------------------------------------------------- */

static size_t elems(const Tensor *t) {
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= (size_t)t->shape[i];
    return n;
}

static float get(const Tensor *t, size_t i) {
    switch (t->dtype) {
        case DT_F32:
            return ((const float *)t->data)[i];
        case DT_BF16:
            return pl_bf16_to_f32(((const uint16_t *)t->data)[i]);
        case DT_F16:
            return pl_f16_to_f32(((const uint16_t *)t->data)[i]);
        default:
            fail_msg("bad dtype");
    }
    return 0;
}

/* Every element within [-bound, bound], not all the same, mean near 0. */
static void check_uniform(const Tensor *t, float bound) {
    size_t n = elems(t);
    double sum = 0, sq = 0;
    float lo = INFINITY, hi = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        float v = get(t, i);
        assert_true(fabsf(v) <= bound * 1.004f);
        sum += v;
        sq += (double)v * v;
        lo = fminf(lo, v);
        hi = fmaxf(hi, v);
    }
    assert_true(hi - lo > bound); /* spread out */
    double mean = sum / (double)n, rms = sqrt(sq / (double)n);
    assert_true(fabs(mean) < 0.1 * bound);
    assert_true(fabs(rms - bound / sqrt(3.0)) < 0.1 * bound); /* U(-a, a) has RMS a/sqrt(3) */
}

static void test_dummy(void **state) {
    ModelConfig cfg;
    assert_int_equal(model_config_load(STORIES, &cfg), PL_OK);
    ModelWeights a, b, c, h;
    assert_int_equal(weights_dummy(&cfg, 42, NULL, NULL, &a), PL_OK);
    assert_int_equal(weights_dummy(&cfg, 42, NULL, NULL, &b), PL_OK);
    assert_int_equal(weights_dummy(&cfg, 43, NULL, NULL, &c), PL_OK);
    assert_non_null(a.dummy_storage);
    assert_ptr_equal(a.lm_head.data, a.embed.data);
    assert_int_equal(a.embed.dtype, DT_F32);
    assert_int_equal(a.embed.shape[0], 512);
    assert_int_equal(a.layers[2].wqkv.shape[0], 64 + 32 + 32);
    assert_int_equal(a.layers[2].w_down.shape[1], 172);
    assert_null(a.layers[0].bqkv.data);
    check_uniform(&a.embed, sqrtf(3.0f / 64));
    check_uniform(&a.layers[0].wqkv, 1.0f / 8);
    check_uniform(&a.layers[4].w_down, 1.0f / sqrtf(172));
    for (size_t i = 0; i < 64; i++) {
        assert_float_equal(get(&a.final_norm, i), 1.0f, 0);
        assert_float_equal(get(&a.layers[3].mlp_norm, i), 1.0f, 0);
    }
    /* Deterministic in the seed; layers differ from each other. */
    assert_memory_equal(a.layers[3].w_gate_up.data, b.layers[3].w_gate_up.data, 2 * 172 * 64 * 4);
    assert_memory_equal(a.embed.data, b.embed.data, 512 * 64 * 4);
    assert_memory_not_equal(a.embed.data, c.embed.data, 512 * 64 * 4);
    assert_memory_not_equal(a.layers[0].wqkv.data, a.layers[1].wqkv.data, 128 * 64 * 4);

    /* BF16 holds the F32 values rounded; F16 likewise. */
    cfg.torch_dtype = DT_BF16;
    assert_int_equal(weights_dummy(&cfg, 42, NULL, NULL, &h), PL_OK);
    assert_int_equal(h.layers[1].wqkv.dtype, DT_BF16);
    assert_ptr_equal(h.lm_head.data, h.embed.data);
    for (size_t i = 0; i < elems(&a.layers[1].wqkv); i++)
        assert_int_equal(((const uint16_t *)h.layers[1].wqkv.data)[i],
                         pl_f32_to_bf16(get(&a.layers[1].wqkv, i)));
    assert_int_equal(((const uint16_t *)h.final_norm.data)[0], 0x3f80);
    check_uniform(&h.embed, sqrtf(3.0f / 64));
    weights_free(&h);
    cfg.torch_dtype = DT_F16;
    assert_int_equal(weights_dummy(&cfg, 42, NULL, NULL, &h), PL_OK);
    for (size_t i = 0; i < elems(&a.embed); i++)
        assert_int_equal(((const uint16_t *)h.embed.data)[i], pl_f32_to_f16(get(&a.embed, i)));
    weights_free(&h);

    weights_free(&a);
    weights_free(&b);
    weights_free(&c);
    assert_null(a.dummy_storage);
    weights_free(NULL);
}

static void test_dummy_untied_bias(void **state) {
    ModelConfig cfg = tiny_config(0, 1);
    ModelWeights w;
    assert_int_equal(weights_dummy(&cfg, 7, NULL, NULL, &w), PL_OK);
    assert_ptr_not_equal(w.lm_head.data, w.embed.data);
    assert_int_equal(w.lm_head.shape[0], 16);
    assert_int_equal(w.layers[1].bqkv.shape[0], 8 + 4 + 4);
    assert_int_equal(w.layers[0].wo.shape[1], 8);
    for (size_t i = 0; i < 16; i++)
        assert_true(fabsf(get(&w.layers[1].bqkv, i)) <= 0.01f);
    /* Tensors are 64-byte aligned and do not overlap. */
    const Tensor *ts[] = {&w.embed,           &w.final_norm,     &w.lm_head,
                          &w.layers[0].wqkv,  &w.layers[0].bqkv, &w.layers[0].w_gate_up,
                          &w.layers[1].w_down};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        assert_int_equal((uintptr_t)ts[i]->data % 64, 0);
        for (size_t j = 0; j < i; j++) {
            const char *a = ts[i]->data, *b = ts[j]->data;
            assert_true(a + elems(ts[i]) * 4 <= b || b + elems(ts[j]) * 4 <= a);
        }
    }
    weights_free(&w);
}

/* Large models are filled on several threads; the values must not depend on that. The
 * embedding (first stream) of a model big enough to be split is compared with the same
 * embedding of a small model, which is filled on one thread. */
static void test_dummy_threads(void **state) {
    const char *fmt = "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64,"
                      " \"intermediate_size\": %d, \"num_hidden_layers\": %d,"
                      " \"num_attention_heads\": 4, \"vocab_size\": 513,"
                      " \"torch_dtype\": \"bfloat16\"}";
    char json[512];
    ModelConfig big, small;
    snprintf(json, sizeof json, fmt, 4096, 6); /* ~4.8M elements */
    assert_int_equal(model_config_parse(json, "big", &big), PL_OK);
    snprintf(json, sizeof json, fmt, 8, 1);
    assert_int_equal(model_config_parse(json, "small", &small), PL_OK);
    ModelWeights a, b;
    assert_int_equal(weights_dummy(&big, 99, NULL, NULL, &a), PL_OK);
    assert_int_equal(weights_dummy(&small, 99, NULL, NULL, &b), PL_OK);
    assert_memory_equal(a.embed.data, b.embed.data, 513 * 64 * 2);
    check_uniform(&a.embed, sqrtf(3.0f / 64));
    check_uniform(&a.layers[5].w_down, 1.0f / 64);
    for (size_t i = 0; i < elems(&a.layers[5].mlp_norm); i++)
        assert_float_equal(get(&a.layers[5].mlp_norm, i), 1.0f, 0);
    weights_free(&a);
    weights_free(&b);
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    return remove(p);
}

static int setup_tmp(void **state) {
    snprintf(tmp_root, sizeof tmp_root, "/tmp/pagellm_test_checkpoint_XXXXXX");
    return mkdtemp(tmp_root) ? 0 : -1;
}

static int teardown_tmp(void **state) {
    return nftw(tmp_root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories_open),
        cmocka_unit_test(test_stories_bind),
        cmocka_unit_test(test_shard_bind),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_header_length),
        cmocka_unit_test(test_offsets_beyond_data),
        cmocka_unit_test(test_overlap),
        cmocka_unit_test(test_byte_count_mismatch),
        cmocka_unit_test(test_dtypes),
        cmocka_unit_test(test_bad_json_and_entries),
        cmocka_unit_test(test_no_checkpoint),
        cmocka_unit_test(test_bind_tiny),
        cmocka_unit_test(test_bind_wrong_dtype),
        cmocka_unit_test(test_bind_wrong_shape),
        cmocka_unit_test(test_bind_missing),
        cmocka_unit_test(test_bind_misaligned),
        cmocka_unit_test(test_sharded_ok),
        cmocka_unit_test(test_sharded_errors),
        cmocka_unit_test(test_dummy),
        cmocka_unit_test(test_dummy_untied_bias),
        cmocka_unit_test(test_dummy_threads),
    };
    return cmocka_run_group_tests_name("checkpoint", tests, setup_tmp, teardown_tmp);
}
