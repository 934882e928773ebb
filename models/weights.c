/* weights.c - bind a Llama-family decoder's tensors from a checkpoint, or make random ones.
 *
 * weights_bind looks every tensor up by its Hugging Face name and checks presence, dtype
 * (F32, F16 or BF16; tensors may mix them) and exact shape; the Tensors point into the
 * checkpoint's read-only mapping, except the fused q/k/v and gate/up projections, whose rows
 * are concatenated into owned buffers. weights_dummy fills one allocation with deterministic
 * uniform noise of the config's shapes (load-format dummy), scaled so that activations stay
 * O(1) through the layers and logits come out roughly unit-variance. */
#include "weights.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- binding -------------------------------------------------------------------------- */

/* What errors name as the checkpoint: its file if every tensor is in one file, else the
 * folder holding its shards. */
static void checkpoint_label(const StCheckpoint *ck, char *buf, size_t cap) {
    int n = st_count(ck);
    if (n == 0) {
        snprintf(buf, cap, "checkpoint (no tensors)");
        return;
    }
    const char *first = st_tensor(ck, 0)->file;
    for (int i = 1; i < n; i++) {
        if (strcmp(st_tensor(ck, i)->file, first) != 0) {
            const char *slash = strrchr(first, '/');
            if (slash)
                snprintf(buf, cap, "%.*s", (int)(slash - first), first);
            else
                snprintf(buf, cap, ".");
            return;
        }
    }
    snprintf(buf, cap, "%s", first);
}

static void format_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (n < cap)
        snprintf(buf + n, cap - n, "]");
}

typedef struct {
    const StCheckpoint *ck;
    char label[512];
} Binder;

/* Bind `name` of shape [d0] (d1 == 0) or [d0, d1] into t. */
static Status bind(Binder *b, const char *name, int64_t d0, int64_t d1, Tensor *t) {
    const StTensor *st = st_find(b->ck, name);
    if (!st)
        return pl_error_set(PL_ERR_FORMAT, "%s: missing tensor '%s'", b->label, name);
    if (st->dtype != DT_F32 && st->dtype != DT_F16 && st->dtype != DT_BF16)
        return pl_error_set(PL_ERR_UNSUPPORTED,
                            "%s: tensor '%s' has dtype %s, expected F32, F16 or BF16", st->file,
                            name, st->dtype_name);
    int ndim = d1 ? 2 : 1;
    int64_t want[2] = {d0, d1};
    if (st->ndim != ndim || st->shape[0] != d0 || (ndim == 2 && st->shape[1] != d1)) {
        char have_s[160], want_s[64];
        format_shape(have_s, sizeof have_s, st->ndim, st->shape);
        format_shape(want_s, sizeof want_s, ndim, want);
        return pl_error_set(PL_ERR_FORMAT, "%s: tensor '%s' has shape %s, expected %s", st->file,
                            name, have_s, want_s);
    }
    /* Kernels read elements through typed pointers. The safetensors library pads the header
     * so that every tensor is aligned; a file that is not would fault or be slow later. */
    if ((uintptr_t)st->data % pl_dtype_size(st->dtype) != 0)
        return pl_error_set(PL_ERR_UNSUPPORTED,
                            "%s: tensor '%s' data is not aligned to its %zu-byte elements; "
                            "re-save the checkpoint with the safetensors library",
                            st->file, name, pl_dtype_size(st->dtype));
    memset(t, 0, sizeof *t);
    t->data = (void *)st->data; /* read-only mapping: never written */
    t->dtype = st->dtype;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    return PL_OK;
}

static float element_f32(const void *p, DType dt, size_t i) {
    if (dt == DT_F32)
        return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return dt == DT_BF16 ? pl_bf16_to_f32(h) : pl_f16_to_f32(h);
}

uint16_t *weights_to_16bit(const Tensor *t, DType dt) {
    size_t ne = 1;
    for (int d = 0; d < t->ndim; d++)
        ne *= (size_t)t->shape[d];
    uint16_t (*conv)(float) = dt == DT_BF16 ? pl_f32_to_bf16 : pl_f32_to_f16;
    uint16_t *b = pl_xmalloc(ne * sizeof *b);
    for (size_t i = 0; i < ne; i++)
        b[i] = conv(element_f32(t->data, t->dtype, i));
    return b;
}

/* Rows [r0, r0 + rows) of a row-major tensor: a view into the same data. */
static Tensor row_view(const Tensor *t, int64_t r0, int64_t rows) {
    Tensor v = *t;
    size_t row_bytes = (t->ndim == 2 ? (size_t)t->shape[1] : 1) * pl_dtype_size(t->dtype);
    v.data = (char *)t->data + (size_t)r0 * row_bytes;
    v.shape[0] = rows;
    return v;
}

/* q, k, v (weights or biases) cut to the shard's heads. */
static void shard_qkv(Tensor qkv[3], const ModelShard *sh, int64_t D) {
    qkv[0] = row_view(&qkv[0], sh->first_head * D, sh->num_heads * D);
    for (int k = 1; k < 3; k++)
        qkv[k] = row_view(&qkv[k], sh->first_kv_head * D, sh->num_kv_heads * D);
}

/* w frees buf with the other host copies (weights_free_host). */
static void own(ModelWeights *w, void *buf) {
    w->fused = pl_xrealloc(w->fused, (size_t)(w->num_fused + 1) * sizeof *w->fused);
    w->fused[w->num_fused++] = buf;
}

/* The common dtype of parts[0..n) (F32 when they differ) and their rows in all. */
static DType parts_dtype(const Tensor *parts, int n, int64_t *rows) {
    DType dt = parts[0].dtype;
    *rows = 0;
    for (int i = 0; i < n; i++) {
        *rows += parts[i].shape[0];
        if (parts[i].dtype != dt)
            dt = DT_F32;
    }
    return dt;
}

/* out = the rows of parts[0..n) concatenated, in their common dtype (F32 when they differ),
 * in a buffer owned by w. */
static void fuse_rows(ModelWeights *w, Tensor *out, const Tensor *parts, int n) {
    int64_t rows;
    DType dt = parts_dtype(parts, n, &rows);
    int64_t cols = parts[0].ndim == 2 ? parts[0].shape[1] : 1;
    size_t es = pl_dtype_size(dt);
    char *buf = pl_xmalloc((size_t)rows * (size_t)cols * es);
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        size_t ne = (size_t)parts[i].shape[0] * (size_t)cols;
        if (parts[i].dtype == dt) {
            memcpy(buf + at * es, parts[i].data, ne * es);
        } else {
            float *f = (float *)(void *)(buf + at * es);
            for (size_t j = 0; j < ne; j++)
                f[j] = element_f32(parts[i].data, parts[i].dtype, j);
        }
        at += ne;
    }
    own(w, buf);
    *out = parts[0];
    out->data = buf;
    out->dtype = dt;
    out->shape[0] = rows;
}

/* Columns [c0, c0 + cols) of a 2-D tensor into a buffer owned by w (t itself when whole). */
static void take_cols(ModelWeights *w, Tensor *t, int64_t c0, int64_t cols) {
    if (c0 == 0 && cols == t->shape[1])
        return;
    size_t es = pl_dtype_size(t->dtype), rows = (size_t)t->shape[0];
    char *buf = pl_xmalloc(rows * (size_t)cols * es);
    for (size_t r = 0; r < rows; r++)
        memcpy(buf + r * (size_t)cols * es,
               (const char *)t->data + (r * (size_t)t->shape[1] + (size_t)c0) * es,
               (size_t)cols * es);
    own(w, buf);
    t->data = buf;
    t->shape[1] = cols;
}

/* out = columns [c0, c0 + cols) of the 2-D parts[0..n) stacked row-wise, in their common dtype
 * (F32 when they differ), in a buffer owned by w: one copy, where take_cols then fuse_rows
 * would make two. */
static void fuse_cols(ModelWeights *w, Tensor *out, const Tensor *parts, int n, int64_t c0,
                      int64_t cols) {
    int64_t rows;
    DType dt = parts_dtype(parts, n, &rows);
    size_t es = pl_dtype_size(dt);
    char *buf = pl_xmalloc((size_t)rows * (size_t)cols * es);
    char *at = buf;
    for (int i = 0; i < n; i++) {
        const Tensor *p = &parts[i];
        size_t pes = pl_dtype_size(p->dtype), width = (size_t)p->shape[1];
        for (int64_t r = 0; r < p->shape[0]; r++, at += (size_t)cols * es) {
            size_t first = (size_t)r * width + (size_t)c0;
            if (p->dtype == dt)
                memcpy(at, (const char *)p->data + first * pes, (size_t)cols * es);
            else
                for (int64_t c = 0; c < cols; c++)
                    ((float *)(void *)at)[c] = element_f32(p->data, p->dtype, first + (size_t)c);
        }
    }
    own(w, buf);
    *out = parts[0];
    out->data = buf;
    out->dtype = dt;
    out->shape[0] = rows;
    out->shape[1] = cols;
}

/* The shard's vocabulary rows [first_vocab, first_vocab + num_vocab) of a [V, H] tensor: a
 * view, or (rows past V: the last slice's padding) a zero-padded copy owned by w. */
static void take_vocab_rows(ModelWeights *w, Tensor *t, const ModelShard *sh) {
    int64_t have = t->shape[0] - sh->first_vocab;
    have = have < 0 ? 0 : have > sh->num_vocab ? sh->num_vocab : have;
    if (have == sh->num_vocab) {
        *t = row_view(t, sh->first_vocab, sh->num_vocab);
        return;
    }
    size_t row_bytes = (size_t)t->shape[1] * pl_dtype_size(t->dtype);
    char *buf = pl_xcalloc((size_t)sh->num_vocab, row_bytes);
    if (have > 0)
        memcpy(buf, (const char *)t->data + (size_t)sh->first_vocab * row_bytes,
               (size_t)have * row_bytes);
    own(w, buf);
    t->data = buf;
    t->shape[0] = sh->num_vocab;
}

/* t (a norm weight w) becomes an owned F32 copy of 1 + w: Gemma's RMSNorm scale, in fp32 as
 * transformers computes it. */
static void plus_one(ModelWeights *w, Tensor *t) {
    size_t n = (size_t)t->shape[0];
    float *buf = pl_xmalloc(n * sizeof *buf);
    for (size_t i = 0; i < n; i++)
        buf[i] = 1.0f + element_f32(t->data, t->dtype, i);
    own(w, buf);
    t->data = buf;
    t->dtype = DT_F32;
}

/* Layer `layer`'s router and experts (Hub names: Mixtral's block_sparse_moe.experts.E.w1/w3/w2,
 * Qwen3-MoE's mlp.experts.E.gate_proj/up_proj/down_proj), each expert cut to the shard's
 * intermediate columns and fused: gate_up [E, 2 Im, H], down [E, H, Im]. */
static Status bind_experts(ModelWeights *w, Binder *b, const ModelConfig *cfg, const ModelShard *sh,
                           int layer, LayerWeights *l) {
    const int mixtral = strcmp(cfg->architecture, "MixtralForCausalLM") == 0;
    const char *block = mixtral ? "block_sparse_moe" : "mlp";
    const char *proj[3] = {mixtral ? "w1" : "gate_proj", mixtral ? "w3" : "up_proj",
                           mixtral ? "w2" : "down_proj"};
    const int64_t E = cfg->num_experts, H = cfg->hidden_size, I = cfg->moe_intermediate_size;
    char n[192];
    snprintf(n, sizeof n, "model.layers.%d.%s.gate.weight", layer, block);
    Status s = bind(b, n, E, H, &l->router);
    if (s != PL_OK)
        return s;
    Tensor *gu = pl_xcalloc((size_t)(2 * E), sizeof *gu), *dn = pl_xcalloc((size_t)E, sizeof *dn);
    for (int64_t e = 0; e < E && s == PL_OK; e++) {
        for (int k = 0; k < 3 && s == PL_OK; k++) {
            snprintf(n, sizeof n, "model.layers.%d.%s.experts.%lld.%s.weight", layer, block,
                     (long long)e, proj[k]);
            s = k < 2 ? bind(b, n, I, H, &gu[2 * e + k]) : bind(b, n, H, I, &dn[e]);
        }
        if (s != PL_OK)
            break;
        for (int k = 0; k < 2; k++)
            gu[2 * e + k] = row_view(&gu[2 * e + k], sh->first_moe_inter, sh->moe_intermediate);
    }
    if (s == PL_OK) {
        fuse_rows(w, &l->experts_gate_up, gu, (int)(2 * E));
        fuse_cols(w, &l->experts_down, dn, (int)E, sh->first_moe_inter, sh->moe_intermediate);
        int64_t gu_shape[3] = {E, 2 * (int64_t)sh->moe_intermediate, H};
        int64_t dn_shape[3] = {E, H, sh->moe_intermediate};
        l->experts_gate_up.ndim = l->experts_down.ndim = 3;
        memcpy(l->experts_gate_up.shape, gu_shape, sizeof gu_shape);
        memcpy(l->experts_down.shape, dn_shape, sizeof dn_shape);
        l->moe = 1;
    }
    free(gu);
    free(dn);
    return s;
}

Status weights_bind(const ModelConfig *cfg, const StCheckpoint *ck, const ModelShard *shard,
                    ModelWeights *w) {
    memset(w, 0, sizeof *w);
    ModelShard sh;
    Status s = model_shard(cfg, shard ? shard->rank : 0, shard ? shard->size : 1, &sh);
    if (s != PL_OK)
        return s;
    const int64_t D = cfg->head_dim;
    Binder b = {.ck = ck};
    checkpoint_label(ck, b.label, sizeof b.label);
    const int64_t H = cfg->hidden_size, I = cfg->intermediate_size, V = cfg->vocab_size;
    const int64_t QD = (int64_t)cfg->num_heads * cfg->head_dim;
    const int64_t KD = (int64_t)cfg->num_kv_heads * cfg->head_dim;
    const int phi3 = strcmp(cfg->architecture, "Phi3ForCausalLM") == 0;
    if ((s = bind(&b, "model.embed_tokens.weight", V, H, &w->embed)) ||
        (s = bind(&b, "model.norm.weight", H, 0, &w->final_norm)))
        goto fail;
    if (cfg->gemma)
        plus_one(w, &w->final_norm);
    if (cfg->tie_word_embeddings) {
        /* As in transformers, tied means the embedding, even if a copy of lm_head is saved. */
        w->lm_head = w->embed;
    } else if ((s = bind(&b, "lm_head.weight", V, H, &w->lm_head))) {
        goto fail;
    }
    if (sh.size > 1) {
        take_vocab_rows(w, &w->embed, &sh);
        if (cfg->tie_word_embeddings)
            w->lm_head = w->embed;
        else
            take_vocab_rows(w, &w->lm_head, &sh);
    }

    w->layers = pl_xcalloc((size_t)cfg->num_layers, sizeof *w->layers);
    for (int i = 0; i < cfg->num_layers; i++) {
        LayerWeights *l = &w->layers[i];
        char n[128];
#define BIND(suffix, d0, d1, dst)                                                                  \
    do {                                                                                           \
        snprintf(n, sizeof n, "model.layers.%d.%s", i, suffix);                                    \
        if ((s = bind(&b, n, d0, d1, dst)))                                                        \
            goto fail;                                                                             \
    } while (0)
        Tensor qkv[3], gate_up[2];
        BIND("input_layernorm.weight", H, 0, &l->attn_norm);
        if (phi3) { /* one [q; k; v] tensor in the file */
            Tensor whole;
            BIND("self_attn.qkv_proj.weight", QD + 2 * KD, H, &whole);
            qkv[0] = row_view(&whole, 0, QD);
            qkv[1] = row_view(&whole, QD, KD);
            qkv[2] = row_view(&whole, QD + KD, KD);
        } else {
            BIND("self_attn.q_proj.weight", QD, H, &qkv[0]);
            BIND("self_attn.k_proj.weight", KD, H, &qkv[1]);
            BIND("self_attn.v_proj.weight", KD, H, &qkv[2]);
        }
        shard_qkv(qkv, &sh, D);
        fuse_rows(w, &l->wqkv, qkv, 3);
        if (cfg->qkv_bias) {
            BIND("self_attn.q_proj.bias", QD, 0, &qkv[0]);
            BIND("self_attn.k_proj.bias", KD, 0, &qkv[1]);
            BIND("self_attn.v_proj.bias", KD, 0, &qkv[2]);
            shard_qkv(qkv, &sh, D);
            fuse_rows(w, &l->bqkv, qkv, 3);
        }
        BIND("self_attn.o_proj.weight", H, QD, &l->wo);
        take_cols(w, &l->wo, (int64_t)sh.first_head * D, (int64_t)sh.num_heads * D);
        if (cfg->qk_norm) {
            BIND("self_attn.q_norm.weight", D, 0, &l->q_norm);
            BIND("self_attn.k_norm.weight", D, 0, &l->k_norm);
        }
        if (cfg->gemma) {
            BIND("post_attention_layernorm.weight", H, 0, &l->post_attn_norm);
            BIND("pre_feedforward_layernorm.weight", H, 0, &l->mlp_norm);
            BIND("post_feedforward_layernorm.weight", H, 0, &l->post_mlp_norm);
            Tensor *norms[] = {&l->attn_norm,     &l->post_attn_norm, &l->mlp_norm,
                               &l->post_mlp_norm, &l->q_norm,         &l->k_norm};
            for (size_t k = 0; k < sizeof norms / sizeof *norms; k++)
                if (norms[k]->data)
                    plus_one(w, norms[k]);
        } else {
            BIND("post_attention_layernorm.weight", H, 0, &l->mlp_norm);
        }
        if (model_layer_is_moe(cfg, i)) {
            if ((s = bind_experts(w, &b, cfg, &sh, i, l)))
                goto fail;
            continue;
        }
        if (phi3) { /* one [gate; up] tensor in the file */
            Tensor whole;
            BIND("mlp.gate_up_proj.weight", 2 * I, H, &whole);
            gate_up[0] = row_view(&whole, 0, I);
            gate_up[1] = row_view(&whole, I, I);
        } else {
            BIND("mlp.gate_proj.weight", I, H, &gate_up[0]);
            BIND("mlp.up_proj.weight", I, H, &gate_up[1]);
        }
        for (int k = 0; k < 2; k++)
            gate_up[k] = row_view(&gate_up[k], sh.first_inter, sh.intermediate);
        fuse_rows(w, &l->w_gate_up, gate_up, 2);
        BIND("mlp.down_proj.weight", H, I, &l->w_down);
        take_cols(w, &l->w_down, sh.first_inter, sh.intermediate);
#undef BIND
    }
    return PL_OK;
fail:
    weights_free(w);
    return s;
}

/* ---- dummy weights -------------------------------------------------------------------- */

typedef enum { FILL_UNIFORM, FILL_ONES } FillKind;

typedef struct {
    Tensor *t;
    FillKind kind;
    float scale;  /* uniform in [-scale, scale) */
    size_t count; /* elements filled; the rest (vocabulary padding) stay zero */
    size_t first; /* element 0 is element `first` (even) of the stream */
    int whole;    /* drawn from the whole model's stream (a vocabulary slice), not the rank's */
    uint64_t key; /* the stream's key, set once every tensor is listed */
} DummySpec;

static inline uint64_t mix64(uint64_t z) { /* splitmix64's finaliser */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Elements 2j and 2j+1 of a stream: two 24-bit uniforms in [-scale, scale) from one draw.
 * Element i depends only on (key, i), so any split of a tensor over threads gives the same
 * values. */
#define UNIFORM_PAIR(key, j, k, scale, a, b)                                                       \
    do {                                                                                           \
        uint64_t r_ = mix64((key) + (uint64_t)(j)*0x9e3779b97f4a7c15ull);                          \
        (a) = (float)(uint32_t)(r_ >> 40) * (k) - (scale);                                         \
        (b) = (float)(uint32_t)((r_ >> 8) & 0xffffffu) * (k) - (scale);                            \
    } while (0)

/* Fill elements [begin, end) of a tensor (begin even). One tight loop per dtype. */
static void fill_uniform(void *dst, DType dt, size_t begin, size_t end, uint64_t key, float scale) {
    const float k = 2.0f * scale / 16777216.0f;
    float a, b;
    size_t i = begin;
    if (dt == DT_F32) {
        float *o = dst;
        for (; i + 1 < end; i += 2) {
            UNIFORM_PAIR(key, i >> 1, k, scale, a, b);
            o[i] = a;
            o[i + 1] = b;
        }
        if (i < end) {
            UNIFORM_PAIR(key, i >> 1, k, scale, a, b);
            o[i] = a;
        }
        return;
    }
    uint16_t (*conv)(float) = dt == DT_BF16 ? pl_f32_to_bf16 : pl_f32_to_f16;
    uint16_t *o = dst;
    for (; i + 1 < end; i += 2) {
        UNIFORM_PAIR(key, i >> 1, k, scale, a, b);
        o[i] = conv(a);
        o[i + 1] = conv(b);
    }
    if (i < end) {
        UNIFORM_PAIR(key, i >> 1, k, scale, a, b);
        o[i] = conv(a);
    }
}

static void fill_value(void *dst, DType dt, size_t begin, size_t end, float x) {
    if (dt == DT_F32) {
        float *f = dst;
        for (size_t i = begin; i < end; i++)
            f[i] = x;
        return;
    }
    uint16_t h = dt == DT_BF16 ? pl_f32_to_bf16(x) : pl_f32_to_f16(x);
    uint16_t *u = dst;
    for (size_t i = begin; i < end; i++)
        u[i] = h;
}

static size_t tensor_elems(const Tensor *t) {
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= (size_t)t->shape[i];
    return n;
}

/* Thread `part` of `parts` fills its slice of every tensor. */
typedef struct {
    const DummySpec *spec;
    size_t num_spec;
    DType dt;
    int part, parts;
    int inline_run;
} FillJob;

static void *fill_worker(void *arg) {
    const FillJob *j = arg;
    for (size_t i = 0; i < j->num_spec; i++) {
        const DummySpec *sp = &j->spec[i];
        size_t ne = sp->count;
        size_t lo = ne * (size_t)j->part / (size_t)j->parts & ~(size_t)1;
        size_t hi = j->part == j->parts - 1
                        ? ne
                        : ne * (size_t)(j->part + 1) / (size_t)j->parts & ~(size_t)1;
        if (sp->kind == FILL_ONES)
            fill_value(sp->t->data, j->dt, lo, hi, 1.0f);
        else
            fill_uniform(sp->t->data, j->dt, lo, hi, sp->key, sp->scale);
    }
    return NULL;
}

/* Element i of a stream drawn from `key` is element i - first of the stream drawn from
 * key + first / 2 golden-ratio steps (elements come in pairs, one draw each). */
static uint64_t stream_key(uint64_t seed, size_t index, size_t first) {
    return mix64(seed ^ mix64((uint64_t)index + 1)) + (uint64_t)(first / 2) * 0x9e3779b97f4a7c15ull;
}

/* A [V, H] tensor listed as the rows [first_row, first_row + rows) of the whole model's: its
 * stream, and zeros past them (padding). */
static void vocab_slice(DummySpec *sp, int64_t rows, int64_t first_row, int64_t H) {
    sp->count = (size_t)(rows * H);
    sp->first = (size_t)(first_row * H);
    sp->whole = 1;
}

/* Fill every tensor in backend memory, each from its own stream as fill_worker does. */
static void fill_on_device(const KernelOps *ops, const DummySpec *spec, size_t n, DType dt) {
    for (size_t i = 0; i < n; i++) {
        const DummySpec *sp = &spec[i];
        float scale = sp->kind == FILL_ONES ? 0.0f : sp->scale;
        ops->fill_dummy(ops, sp->t->data, dt, sp->count, sp->key, scale);
    }
}

Status weights_dummy(const ModelConfig *cfg, uint64_t seed, const KernelOps *device,
                     const ModelShard *shard, ModelWeights *w) {
    memset(w, 0, sizeof *w);
    ModelShard sh;
    Status st = model_shard(cfg, shard ? shard->rank : 0, shard ? shard->size : 1, &sh);
    if (st != PL_OK)
        return st;
    /* Sharded layers get a stream of their own per rank; vocabulary slices are slices of the
     * whole model's embedding and LM head. */
    const uint64_t rank_seed = sh.rank > 0 ? mix64(seed + (uint64_t)sh.rank) : seed;
    DType dt = cfg->torch_dtype;
    if (dt != DT_F32 && dt != DT_F16 && dt != DT_BF16)
        return pl_error_set(PL_ERR_UNSUPPORTED, "dummy weights: dtype %s is not supported",
                            pl_dtype_name(dt));
    if (device && device->act != DT_F32)
        dt = device->act;
    /* fan-in scales are the whole model's; the shapes are the shard's */
    const int64_t H = cfg->hidden_size, I = sh.intermediate, V = sh.num_vocab;
    const int64_t QD = (int64_t)sh.num_heads * cfg->head_dim;
    const int64_t KD = (int64_t)sh.num_kv_heads * cfg->head_dim;
    const int L = cfg->num_layers;
    const float inv_qd = 1.0f / sqrtf((float)cfg->num_heads * cfg->head_dim);
    const float inv_i = 1.0f / sqrtf((float)cfg->intermediate_size);
    const float inv_mi =
        1.0f / sqrtf((float)(cfg->moe_intermediate_size > 0 ? cfg->moe_intermediate_size : 1));
    const int64_t E = cfg->num_experts, MI = sh.moe_intermediate, D = cfg->head_dim;
    w->layers = pl_xcalloc((size_t)L, sizeof *w->layers);

    /* Scales: a projection with U(-1/sqrt(fan_in), +) keeps unit-RMS input at output RMS
     * 1/sqrt(3). Embedding rows get RMS 1/sqrt(H), so tied logits (normed x . row) come out
     * with standard deviation ~1; biases are small. */
    const float inv_h = 1.0f / sqrtf((float)H);
    const float emb = sqrtf(3.0f) * inv_h;
    size_t cap = 3 + (size_t)L * LAYER_MAX_TENSORS, n = 0;
    DummySpec *spec = pl_xmalloc(cap * sizeof *spec);
#define ADD(tensor, kind_, scale_, d0, d1)                                                         \
    do {                                                                                           \
        Tensor *t_ = (tensor);                                                                     \
        t_->dtype = dt;                                                                            \
        t_->ndim = (d1) ? 2 : 1;                                                                   \
        t_->shape[0] = (d0);                                                                       \
        t_->shape[1] = (d1);                                                                       \
        spec[n++] = (DummySpec){t_, kind_, scale_, tensor_elems(t_), 0, 0, 0};                     \
    } while (0)
#define ADD3(tensor, scale_, d0, d1, d2)                                                           \
    do {                                                                                           \
        ADD(tensor, FILL_UNIFORM, scale_, (d0) * (d1), d2);                                        \
        Tensor *t3_ = (tensor);                                                                    \
        t3_->ndim = 3;                                                                             \
        t3_->shape[0] = (d0);                                                                      \
        t3_->shape[1] = (d1);                                                                      \
        t3_->shape[2] = (d2);                                                                      \
    } while (0)
    /* the shard's vocabulary rows that exist (the last slice may end in padding) */
    int64_t vocab_rows = cfg->vocab_size - sh.first_vocab;
    vocab_rows = vocab_rows < 0 ? 0 : vocab_rows > V ? V : vocab_rows;
    ADD(&w->embed, FILL_UNIFORM, emb, V, H);
    vocab_slice(&spec[n - 1], vocab_rows, sh.first_vocab, H);
    ADD(&w->final_norm, FILL_ONES, 0, H, 0);
    if (!cfg->tie_word_embeddings) {
        ADD(&w->lm_head, FILL_UNIFORM, inv_h, V, H);
        vocab_slice(&spec[n - 1], vocab_rows, sh.first_vocab, H);
    }
    for (int i = 0; i < L; i++) {
        LayerWeights *l = &w->layers[i];
        ADD(&l->attn_norm, FILL_ONES, 0, H, 0);
        ADD(&l->wqkv, FILL_UNIFORM, inv_h, QD + 2 * KD, H);
        if (cfg->qkv_bias)
            ADD(&l->bqkv, FILL_UNIFORM, 0.01f, QD + 2 * KD, 0);
        ADD(&l->wo, FILL_UNIFORM, inv_qd, H, QD);
        ADD(&l->mlp_norm, FILL_ONES, 0, H, 0);
        if (cfg->gemma) {
            ADD(&l->post_attn_norm, FILL_ONES, 0, H, 0);
            ADD(&l->post_mlp_norm, FILL_ONES, 0, H, 0);
        }
        if (cfg->qk_norm) {
            ADD(&l->q_norm, FILL_ONES, 0, D, 0);
            ADD(&l->k_norm, FILL_ONES, 0, D, 0);
        }
        if (model_layer_is_moe(cfg, i)) {
            l->moe = 1;
            ADD(&l->router, FILL_UNIFORM, inv_h, E, H);
            ADD3(&l->experts_gate_up, inv_h, E, 2 * MI, H);
            ADD3(&l->experts_down, inv_mi, E, H, MI);
            continue;
        }
        ADD(&l->w_gate_up, FILL_UNIFORM, inv_h, 2 * I, H);
        ADD(&l->w_down, FILL_UNIFORM, inv_i, H, I);
    }
#undef ADD
#undef ADD3
    PL_CHECK(n <= cap);
    for (size_t i = 0; i < n; i++)
        spec[i].key = stream_key(spec[i].whole ? seed : rank_seed, i, spec[i].first);

    /* One buffer, each tensor starting on a 64-byte boundary. */
    const size_t esize = pl_dtype_size(dt), align = 64;
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += (tensor_elems(spec[i].t) * esize + align - 1) / align * align;
    void *buf = NULL;
    if (device ? !(buf = device->alloc(device, total ? total : align))
               : posix_memalign(&buf, align, total ? total : align) != 0) {
        free(spec);
        weights_free(w);
        return pl_error_set(PL_ERR_NOMEM, "dummy weights: cannot allocate %.2f GiB of %s memory",
                            (double)total / PL_GIB, device ? device->name : "host");
    }
    w->dummy_storage = buf;
    w->device = device;
    size_t off = 0, elements = 0;
    for (size_t i = 0; i < n; i++) {
        Tensor *t = spec[i].t;
        size_t ne = tensor_elems(t);
        t->data = (char *)buf + off;
        off += (ne * esize + align - 1) / align * align;
        elements += ne;
        if (!device && spec[i].count < ne) /* backend memory comes zeroed, host memory not */
            memset((char *)t->data + spec[i].count * esize, 0, (ne - spec[i].count) * esize);
    }

    if (device) {
        fill_on_device(device, spec, n, dt);
        if (cfg->tie_word_embeddings)
            w->lm_head = w->embed;
        free(spec);
        return PL_OK;
    }
    /* Fill on several threads for large models (an 8B model is 8e9 elements); the values
     * do not depend on the number of threads. */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = elements < (1u << 22) || cores < 2 ? 1 : cores > 32 ? 32 : (int)cores;
    FillJob *jobs = pl_xcalloc((size_t)nt, sizeof *jobs);
    pthread_t *tids = pl_xcalloc((size_t)nt, sizeof *tids);
    for (int t = 0; t < nt; t++) {
        jobs[t] = (FillJob){.spec = spec, .num_spec = n, .dt = dt, .part = t, .parts = nt};
        if (t == 0 || pthread_create(&tids[t], NULL, fill_worker, &jobs[t]) != 0)
            jobs[t].inline_run = 1; /* the caller does it (thread 0, or no thread) */
    }
    for (int t = 0; t < nt; t++)
        if (jobs[t].inline_run)
            fill_worker(&jobs[t]);
    for (int t = 1; t < nt; t++)
        if (!jobs[t].inline_run)
            pthread_join(tids[t], NULL);
    free(jobs);
    free(tids);
    if (cfg->tie_word_embeddings)
        w->lm_head = w->embed;
    free(spec);
    return PL_OK;
}

void weights_free_host(ModelWeights *w) {
    if (!w->device) {
        free(w->dummy_storage);
        w->dummy_storage = NULL;
    }
    for (int i = 0; i < w->num_fused; i++)
        free(w->fused[i]);
    free(w->fused);
    w->fused = NULL;
    w->num_fused = 0;
}

void weights_free(ModelWeights *w) {
    if (!w)
        return;
    weights_free_host(w);
    if (w->device && w->dummy_storage)
        w->device->free(w->device, w->dummy_storage);
    free(w->layers);
    memset(w, 0, sizeof *w);
}
