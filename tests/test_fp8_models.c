/* test_fp8_models.c - fp8 weights at the models layer on the CPU backend: the checkpoint
 * formats (tests/data/fp8/, written by make_fp8_checkpoints.py from stories260K), online
 * quantization (quantization: fp8) of the bundled model, fp8 dummy weights, and the errors for
 * schemes pagellm does not run.
 *
 * For each checkpoint: every projection as bound (fused, scales converted) stands for exactly
 * the values of the file's parts (dec(q) times the part's scale, in double), except fused
 * layers whose parts are off the block grid, which are requantized per channel and must stay
 * within half an e4m3 step of them; and the matmul of every bound projection equals a
 * test-side reference of the documented semantics (x quantized per token, or per token and
 * block, with the layer's dynamic or static scale, times the file's dequantized weights, in
 * double) within fp32 rounding. Then the model's greedy text on the golden prompts (leading
 * tokens equal to the float model's, as measured: 89 of 112 golden tokens with online fp8), and
 * the model's sequencing of the norm / SiLU + fp8 projection ops a backend may fuse. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "model.h"
#include "model_run_util.h"
#include "safetensors.h"
#include "weights.h"

#define DATA    "tests/data/fp8"
#define STORIES "models/stories260K"

static KernelOps *cpu;

static int setup(void **state) {
    (void)state;
    KernelOpenOptions o = {.backend = "cpu", .act = DT_F32};
    return k_open(&o, &cpu) == PL_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    k_close(&cpu, 1);
    return 0;
}

/* ---- the file's values ---- */

static double load_scalar(const StTensor *t, size_t i) {
    if (t->dtype == DT_F32) {
        float f;
        memcpy(&f, (const char *)t->data + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, (const char *)t->data + 2 * i, 2);
    return t->dtype == DT_BF16 ? pl_bf16_to_f32(h) : pl_f16_to_f32(h);
}

/* Element (r, c) of module m's weight as the file says: a float, or dec(q) * its scale. */
static double file_value(const StCheckpoint *ck, const ModelQuant *q, const char *m, int64_t r,
                         int64_t c) {
    char n[160];
    snprintf(n, sizeof n, "%s.weight", m);
    const StTensor *w = st_find(ck, n);
    assert_non_null(w);
    int64_t K = w->shape[1];
    if (w->dtype != DT_F8E4M3)
        return load_scalar(w, (size_t)(r * K + c));
    double v = pl_f8e4m3_to_f32(((const uint8_t *)w->data)[r * K + c]);
    snprintf(n, sizeof n, "%s.%s", m, q->method == QUANT_FP8 ? "weight_scale_inv" : "weight_scale");
    const StTensor *s = st_find(ck, n);
    assert_non_null(s);
    if (q->weight_scales == FP8_SCALE_BLOCK) {
        int64_t B = q->block, kb = (K + B - 1) / B;
        return v * load_scalar(s, (size_t)((r / B) * kb + c / B));
    }
    return v * load_scalar(s, q->weight_scales == FP8_SCALE_CHANNEL ? (size_t)r : 0);
}

/* The value a bound tensor stands for at (r, c). */
static double bound_value(const Tensor *t, int64_t r, int64_t c) {
    int64_t K = t->shape[1];
    if (t->dtype == DT_F32)
        return ((const float *)t->data)[r * K + c];
    assert_int_equal(t->dtype, DT_F8E4M3);
    double v = pl_f8e4m3_to_f32(((const uint8_t *)t->data)[r * K + c]);
    const Fp8Scales *s = &t->fp8;
    if (s->kind == FP8_SCALE_TENSOR)
        return v * s->w_scale[0];
    if (s->kind == FP8_SCALE_CHANNEL)
        return v * s->w_scale[r];
    int64_t B = s->block, kb = (K + B - 1) / B;
    return v * s->w_scale[(r / B) * kb + c / B];
}

/* A projection as pagellm binds it: the modules whose rows it concatenates. */
typedef struct {
    const Tensor *t;
    const char *parts[3];
} Proj;

/* The static input scale the file gives a projection (the largest of its parts'), 0 if none. */
static float file_input_scale(const StCheckpoint *ck, const char *const *parts, int layer) {
    float s = 0;
    for (int p = 0; p < 3 && parts[p]; p++) {
        char n[160];
        snprintf(n, sizeof n, "model.layers.%d.%s.input_scale", layer, parts[p]);
        const StTensor *t = st_find(ck, n);
        if (t)
            s = fmaxf(s, (float)load_scalar(t, 0));
    }
    return s;
}

/* The reference of matmul (include/kernels.h) for out[n, N] = x[n, K] w^T: x quantized per
 * group as documented, the file's weights in double. */
static int check_matmul(const StCheckpoint *ck, const ModelQuant *q, const Proj *p, int layer) {
    const Tensor *t = p->t;
    int N = (int)t->shape[0], K = (int)t->shape[1], n = 3, bad = 0;
    float *x = malloc(sizeof(float) * n * K), *out = malloc(sizeof(float) * n * N);
    for (int i = 0; i < n * K; i++)
        x[i] = (float)sin(i * 0.37 + layer) * (i % 11 == 0 ? 6.0f : 1.0f);
    cpu->matmul(cpu, out, x, t, NULL, n);
    int group = t->dtype == DT_F8E4M3 && t->fp8.kind == FP8_SCALE_BLOCK ? t->fp8.block : K;
    float in_scale = t->dtype == DT_F8E4M3 ? file_input_scale(ck, p->parts, layer) : 0;
    if (t->dtype == DT_F8E4M3)
        assert_true(t->fp8.input_scale == in_scale);
    for (int i = 0; i < n; i++) {
        const float *row = x + (size_t)i * K;
        for (int j = 0; j < N; j++) {
            /* row j of the fused tensor: part pi, row jr */
            int pi = 0, jr = j;
            char m[160];
            for (;;) {
                snprintf(m, sizeof m, "model.layers.%d.%s.weight", layer, p->parts[pi]);
                int rows = (int)st_find(ck, m)->shape[0];
                if (jr < rows)
                    break;
                jr -= rows;
                pi++;
            }
            snprintf(m, sizeof m, "model.layers.%d.%s", layer, p->parts[pi]);
            double want = 0, mag = 0;
            for (int k0 = 0; k0 < K; k0 += group) {
                int len = k0 + group <= K ? group : K - k0;
                float s = in_scale;
                if (t->dtype == DT_F8E4M3 && s == 0) {
                    float amax = 0;
                    for (int k = k0; k < k0 + len; k++)
                        amax = fmaxf(amax, fabsf(row[k]));
                    s = fmaxf(amax / 448.0f, PL_F8E4M3_MIN_SCALE);
                }
                for (int k = k0; k < k0 + len; k++) {
                    double xv =
                        t->dtype == DT_F8E4M3
                            ? pl_f8e4m3_to_f32(pl_f32_to_f8e4m3(row[k] * (1.0f / s))) * (double)s
                            : row[k];
                    double wv = file_value(ck, q, m, jr, k);
                    want += xv * wv;
                    mag += fabs(xv * wv);
                }
            }
            double got = out[(size_t)i * N + j];
            if (fabs(got - want) > 2e-6 * mag + 1e-30 && bad++ < 3)
                print_error("layer %d %s: out[%d, %d] = %.9g, want %.9g\n", layer, p->parts[0], i,
                            j, got, want);
        }
    }
    free(x);
    free(out);
    return bad;
}

/* Every projection of the checkpoint in dir: dtype and scale kind as expected (the kinds of
 * wqkv and gate_up given, "F" for a float layer), values as the file's, matmul as the
 * reference. requant_* say which fused layers were requantized (compared loosely). */
static void check_checkpoint(const char *name, Fp8ScaleKind qkv_kind, Fp8ScaleKind gu_kind,
                             const char *float_module) {
    char dir[160];
    snprintf(dir, sizeof dir, DATA "/%s", name);
    ModelConfig cfg;
    if (model_config_load(dir, &cfg) != PL_OK)
        fail_msg("%s: %s", dir, pl_error());
    StCheckpoint *ck;
    assert_int_equal(st_open(dir, &ck), PL_OK);
    ModelWeights w;
    if (weights_bind(&cfg, ck, NULL, &w) != PL_OK)
        fail_msg("%s: %s", dir, pl_error());
    int bad = 0, requant = 0;
    for (int l = 0; l < cfg.num_layers; l++) {
        LayerWeights *lw = &w.layers[l];
        Proj ps[4] = {{&lw->wqkv, {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"}},
                      {&lw->wo, {"self_attn.o_proj"}},
                      {&lw->w_gate_up, {"mlp.gate_proj", "mlp.up_proj"}},
                      {&lw->w_down, {"mlp.down_proj"}}};
        for (int pi = 0; pi < 4; pi++) {
            const Proj *p = &ps[pi];
            char m[160];
            snprintf(m, sizeof m, "model.layers.%d.%s", l, p->parts[0]);
            int is_float = float_module && !strcmp(m, float_module);
            assert_int_equal(p->t->dtype, is_float ? DT_F32 : DT_F8E4M3);
            Fp8ScaleKind want_kind = pi == 0   ? qkv_kind
                                     : pi == 2 ? gu_kind
                                               : cfg.quant.weight_scales;
            if (!is_float)
                assert_int_equal(p->t->fp8.kind, want_kind);
            /* requantized: block parts that are now per channel */
            int rq = !is_float && cfg.quant.weight_scales == FP8_SCALE_BLOCK &&
                     p->t->fp8.kind == FP8_SCALE_CHANNEL;
            requant += rq;
            int64_t row0 = 0;
            for (int k = 0; k < 3 && p->parts[k]; k++) {
                snprintf(m, sizeof m, "model.layers.%d.%s", l, p->parts[k]);
                char wn[170];
                snprintf(wn, sizeof wn, "%s.weight", m);
                const StTensor *st = st_find(ck, wn);
                for (int64_t r = 0; r < st->shape[0]; r++) {
                    double amax = 0;
                    for (int64_t c = 0; c < st->shape[1]; c++)
                        amax = fmax(amax, fabs(file_value(ck, &cfg.quant, m, r, c)));
                    for (int64_t c = 0; c < st->shape[1]; c++) {
                        double want = file_value(ck, &cfg.quant, m, r, c);
                        double got = bound_value(p->t, row0 + r, c);
                        /* half an e4m3 step (2^-4 relative), or of the subnormal step */
                        double tol = rq ? fmax(fabs(want) / 16, amax / 448 * 0x1p-10) * 1.0001 : 0;
                        if (fabs(got - want) > tol && bad++ < 3)
                            print_error("%s %s[%lld, %lld] = %.9g, file %.9g\n", name, m,
                                        (long long)r, (long long)c, got, want);
                    }
                }
                row0 += st->shape[0];
            }
            if (!rq)
                bad += check_matmul(ck, &cfg.quant, p, l);
        }
    }
    print_message("%s: %d fused layers requantized per channel\n", name, requant);
    assert_int_equal(requant, w.requantized);
    weights_free(&w);
    st_close(ck);
    assert_int_equal(bad, 0);
}

static void test_fp8_block128(void **state) {
    (void)state;
    /* q/k/v (64/32/32 rows) and gate/up (172) are off the 128-row grid: requantized */
    check_checkpoint("fp8-block128", FP8_SCALE_CHANNEL, FP8_SCALE_CHANNEL,
                     "model.layers.1.mlp.down_proj");
}

static void test_fp8_block32(void **state) {
    (void)state;
    /* q/k/v on the 32-row grid keep block scales; gate (172 rows) does not */
    check_checkpoint("fp8-block32", FP8_SCALE_BLOCK, FP8_SCALE_CHANNEL, NULL);
}

static void test_compressed_channel(void **state) {
    (void)state;
    check_checkpoint("ct-channel", FP8_SCALE_CHANNEL, FP8_SCALE_CHANNEL,
                     "model.layers.1.self_attn.o_proj");
}

static void test_compressed_tensor_static(void **state) {
    (void)state;
    /* per-tensor parts fused into per-channel scales, exactly */
    check_checkpoint("ct-tensor", FP8_SCALE_CHANNEL, FP8_SCALE_CHANNEL, NULL);
}

/* ---- the model: greedy text ---- */

/* ids[n] at positions first.., the logits of the last row into logits[vocab]. */
static void forward_last(Run *r, const int32_t *ids, int n, int first, float *logits) {
    int32_t last = n - 1;
    run_forward(r, ids, n, first, &last, 1, logits);
}

/* Greedy continuation of `prompt` (g tokens) into out; returns how many of them equal want. */
static int greedy_agreement(Run *r, json_t *prompt, json_t *want, int g) {
    int32_t ids[RUN_MAX_TOKENS];
    int n = (int)json_array_size(prompt);
    for (int i = 0; i < n; i++)
        ids[i] = (int32_t)json_integer_value(json_array_get(prompt, i));
    float *logits = malloc(sizeof(float) * r->vocab);
    forward_last(r, ids, n, 0, logits);
    int same = 0, diverged = 0;
    for (int t = 0; t < g; t++) {
        int best = 0;
        for (int v = 1; v < r->vocab; v++)
            if (logits[v] > logits[best])
                best = v;
        for (int v = 0; v < r->vocab; v++)
            assert_true(isfinite(logits[v]));
        diverged |= best != (int)json_integer_value(json_array_get(want, t));
        same += !diverged;
        int32_t next = best;
        if (t + 1 < g)
            forward_last(r, &next, 1, n + t, logits);
    }
    free(logits);
    return same;
}

/* Greedy tokens of fp8 models against golden.json (the float64 reference of the float model):
 * how many leading tokens of each of its 6 cases agree, at least min[case] (what was measured,
 * see the callers). */
static void check_greedy(const char *dir, const char *quantization, const int *min) {
    json_error_t err;
    json_t *doc = json_load_file(STORIES "/golden.json", 0, &err);
    assert_non_null(doc);
    json_t *cases = json_object_get(doc, "cases");
    Run r;
    run_open(&r, cpu, dir, 0, quantization);
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        json_t *want = json_object_get(c, "completion_ids");
        int g = (int)json_array_size(want);
        memset(r.cache, 0, k_kv_block_elems(&r.layout) * RUN_BLOCKS * sizeof(float));
        int same = greedy_agreement(&r, json_object_get(c, "prompt_ids"), want, g);
        print_message("%s%s: golden case %zu: %d of %d greedy tokens equal\n", dir,
                      quantization ? " (quantization fp8)" : "", i, same, g);
        if (same < min[i])
            fail_msg("%s case %zu: only the first %d of %d greedy tokens equal the golden ones",
                     dir, i, same, g);
    }
    run_close(&r);
    json_decref(doc);
}

/* Measured: the leading greedy tokens equal to the float model's on the 6 golden cases. Case
 * 1 (32 tokens) diverges at token 17, where golden.json's top-2 margin is 0.13; case 4's first
 * step has a margin of 0.033 (its 9 equal tokens are luck as much as accuracy). */
static void test_online_fp8_greedy(void **state) {
    (void)state;
    static const int min[6] = {16, 16, 16, 16, 9, 16};
    check_greedy(STORIES, "fp8", min);
}

/* Measured likewise: the 128 x 128 block checkpoint flips case 4's first token (margin 0.033)
 * and keeps the 32 tokens of case 1; per-channel compressed-tensors is as online fp8 but for
 * case 4, all 16 equal. */
static void test_checkpoints_greedy(void **state) {
    (void)state;
    static const int block128[6] = {16, 32, 16, 16, 0, 16}, channel[6] = {16, 16, 16, 16, 16, 16};
    check_greedy(DATA "/fp8-block128", NULL, block128);
    check_greedy(DATA "/ct-channel", NULL, channel);
}

/* quantization: fp8 binds every projection as per-channel fp8, embeddings and norms as they
 * were, and counts fp8 bytes plus scales. */
static void test_online_fp8_layout(void **state) {
    (void)state;
    Run f, q;
    run_open(&f, cpu, STORIES, 0, NULL);
    run_open(&q, cpu, STORIES, 0, "fp8");
    const ModelConfig *c = model_config(q.m);
    assert_int_equal(c->quant.method, QUANT_ONLINE_FP8);
    size_t H = (size_t)c->hidden_size, I = (size_t)c->intermediate_size;
    size_t QKV = (size_t)(c->num_heads + 2 * c->num_kv_heads) * (size_t)c->head_dim;
    size_t lin = QKV * H + H * H + 2 * I * H + H * I, rows = QKV + H + 2 * I + H;
    size_t L = (size_t)c->num_layers;
    assert_int_equal(model_weight_bytes(f.m) - model_weight_bytes(q.m), L * (lin * 3 - rows * 4));
    char buf[256];
    model_weight_format(q.m, buf, sizeof buf);
    assert_non_null(strstr(buf, "fp8 e4m3, per-channel scales"));
    model_weight_format(f.m, buf, sizeof buf);
    assert_string_equal(buf, "F32");
    run_close(&f);
    run_close(&q);
}

/* load-format dummy with quantization fp8: fp8 weights from the start, finite logits, the
 * same whether the host fills them once or twice. */
static void test_dummy_fp8(void **state) {
    (void)state;
    Run a, b;
    run_open(&a, cpu, STORIES, 1, "fp8");
    run_open(&b, cpu, STORIES, 1, "fp8");
    int32_t ids[4] = {1, 403, 407, 261};
    float *la = malloc(sizeof(float) * a.vocab), *lb = malloc(sizeof(float) * b.vocab);
    forward_last(&a, ids, 4, 0, la);
    forward_last(&b, ids, 4, 0, lb);
    for (int v = 0; v < a.vocab; v++)
        assert_true(isfinite(la[v]) && la[v] == lb[v]);
    char buf[256];
    model_weight_format(a.m, buf, sizeof buf);
    assert_non_null(strstr(buf, "fp8 e4m3"));
    free(la), free(lb);
    run_close(&a);
    run_close(&b);
}

/* ---- errors: one line naming the key and the value ---- */

static void expect_config_error(const char *qc, const char *want1, const char *want2) {
    char json[2048];
    snprintf(json, sizeof json,
             "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, "
             "\"intermediate_size\": 172, \"num_hidden_layers\": 1, \"num_attention_heads\": 8, "
             "\"vocab_size\": 512, \"quantization_config\": %s}",
             qc);
    ModelConfig cfg;
    Status s = model_config_parse(json, "config.json", &cfg);
    if (s == PL_OK)
        fail_msg("accepted: %s", qc);
    if (!strstr(pl_error(), want1) || !strstr(pl_error(), want2))
        fail_msg("error '%s' lacks '%s' / '%s'", pl_error(), want1, want2);
}

#define CT(weights, act)                                                                           \
    "{\"quant_method\": \"compressed-tensors\", \"format\": \"float-quantized\", "                 \
    "\"config_groups\": {\"group_0\": {\"targets\": [\"Linear\"], \"weights\": " weights           \
    ", \"input_activations\": " act "}}}"
#define W_CH  "{\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"channel\"}"
#define A_TOK "{\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"token\", \"dynamic\": true}"

/* ---- the model's fused norm / SiLU + fp8 projection ops ---- */

/* A CPU backend that has add_rmsnorm_matmul and silu_mul_matmul, made of the two calls each,
 * counting them: the model's sequencing when a backend quantizes in the norm (the CUDA one). */
static KernelOps fusing;
static int calls_norm_matmul, calls_silu_matmul;

static void two_call_add_rmsnorm_matmul(const KernelOps *ops, void *out, void *residual,
                                        const void *delta, void *normed, const Tensor *norm_w,
                                        const Tensor *w, const Tensor *bias, int n, float eps) {
    (void)ops;
    calls_norm_matmul++;
    cpu->add_rmsnorm(cpu, residual, delta, normed, norm_w, n, (int)w->shape[1], eps);
    cpu->matmul(cpu, out, normed, w, bias, n);
}

static void two_call_silu_mul_matmul(const KernelOps *ops, void *out, void *act,
                                     const void *gate_up, const Tensor *w, int n) {
    (void)ops;
    calls_silu_matmul++;
    cpu->silu_mul(cpu, act, gate_up, n, (int)w->shape[1]);
    cpu->matmul(cpu, out, act, w, NULL, n);
}

/* stories260K quantized online, a prompt and then one decode token: the same logits bit for bit
 * through the fused ops as through the plain ones (the same ops in the same order), the norm
 * before every projection but the first layer's qkv fused (2 L - 1 a forward) and the SiLU
 * before every down projection (L). */
static void test_fused_norm_silu_ops(void **state) {
    (void)state;
    fusing = *cpu;
    fusing.add_rmsnorm_matmul = two_call_add_rmsnorm_matmul;
    fusing.silu_mul_matmul = two_call_silu_mul_matmul;
    Run plain, fused;
    run_open(&plain, cpu, STORIES, 0, "fp8");
    run_open(&fused, &fusing, STORIES, 0, "fp8");
    const int L = model_config(plain.m)->num_layers, V = plain.vocab;
    const int32_t ids[] = {1, 403, 407, 261, 378, 5};
    const int32_t rows[] = {0, 3, 5}, last = 0;
    float *a = malloc(sizeof(float) * 3 * V), *b = malloc(sizeof(float) * 3 * V);
    run_forward(&plain, ids, 6, 0, rows, 3, a);
    calls_norm_matmul = calls_silu_matmul = 0;
    run_forward(&fused, ids, 6, 0, rows, 3, b);
    assert_int_equal(calls_norm_matmul, 2 * L - 1);
    assert_int_equal(calls_silu_matmul, L);
    assert_memory_equal(a, b, sizeof(float) * 3 * V);
    const int32_t next = 42;
    run_forward(&plain, &next, 1, 6, &last, 1, a);
    run_forward(&fused, &next, 1, 6, &last, 1, b);
    assert_int_equal(calls_norm_matmul, 2 * (2 * L - 1));
    assert_memory_equal(a, b, sizeof(float) * V);
    free(a);
    free(b);
    run_close(&plain);
    run_close(&fused);
}

static void test_unsupported_configs(void **state) {
    (void)state;
    expect_config_error("{\"quant_method\": \"awq\"}", "quantization_config.quant_method", "awq");
    expect_config_error("{\"quant_method\": \"fp8\", \"fmt\": \"e5m2\"}", "quantization_config.fmt",
                        "e5m2");
    expect_config_error("{\"quant_method\": \"fp8\", \"scale_fmt\": \"ue8m0\"}",
                        "quantization_config.scale_fmt", "ue8m0");
    expect_config_error("{\"quant_method\": \"fp8\", \"weight_block_size\": [128, 64]}",
                        "weight_block_size", "[128, 64]");
    expect_config_error("{\"quant_method\": \"fp8\", \"activation_scheme\": \"static\", "
                        "\"weight_block_size\": [128, 128]}",
                        "activation_scheme", "static");
    expect_config_error(
        CT("{\"num_bits\": 4, \"type\": \"float\", \"strategy\": \"channel\"}", A_TOK),
        "config_groups.group_0.weights.num_bits", "supported: 8");
    expect_config_error(
        CT("{\"num_bits\": 8, \"type\": \"int\", \"strategy\": \"channel\"}", A_TOK),
        "config_groups.group_0.weights.type", "'int'");
    expect_config_error(CT("{\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"group\", "
                           "\"group_size\": 128}",
                           A_TOK),
                        "config_groups.group_0.weights.strategy", "'group'");
    expect_config_error(CT(W_CH, "null"), "input_activations", "weight-only");
    expect_config_error(CT(W_CH, "{\"num_bits\": 8, \"type\": \"float\", \"strategy\": "
                                 "\"token\", \"dynamic\": false}"),
                        "input_activations", "strategy token with dynamic false");
    expect_config_error("{\"quant_method\": \"compressed-tensors\", \"format\": "
                        "\"pack-quantized\", \"config_groups\": {}}",
                        "quantization_config.format", "pack-quantized");
    /* a model option that is not fp8 */
    Model *m;
    ModelLoadOptions opt = {
        .dir = STORIES, .max_num_tokens = 8, .ops = cpu, .quantization = "int8"};
    assert_int_equal(model_load(&opt, &m), PL_ERR_UNSUPPORTED);
    assert_non_null(strstr(pl_error(), "quantization 'int8'"));
}

/* An fp8 tensor without a quantization_config, and one its ignore list names. */
static void test_fp8_tensor_without_config(void **state) {
    (void)state;
    ModelConfig cfg;
    assert_int_equal(model_config_load(DATA "/ct-channel", &cfg), PL_OK);
    StCheckpoint *ck;
    assert_int_equal(st_open(DATA "/ct-channel", &ck), PL_OK);
    ModelWeights w;
    ModelQuant keep = cfg.quant;
    cfg.quant.method = QUANT_NONE;
    assert_int_equal(weights_bind(&cfg, ck, NULL, &w), PL_ERR_FORMAT);
    assert_non_null(strstr(pl_error(), "no quantization_config"));
    cfg.quant = keep;
    strcpy(cfg.quant.ignore + strlen(cfg.quant.ignore) + 1 +
               strlen(cfg.quant.ignore + strlen(cfg.quant.ignore) + 1) + 1,
           "model.layers.0.mlp.up_proj");
    cfg.quant.num_ignore++;
    assert_int_equal(weights_bind(&cfg, ck, NULL, &w), PL_ERR_FORMAT);
    assert_non_null(strstr(pl_error(), "ignore entry 'model.layers.0.mlp.up_proj'"));
    st_close(ck);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp8_block128),
        cmocka_unit_test(test_fp8_block32),
        cmocka_unit_test(test_compressed_channel),
        cmocka_unit_test(test_compressed_tensor_static),
        cmocka_unit_test(test_online_fp8_layout),
        cmocka_unit_test(test_online_fp8_greedy),
        cmocka_unit_test(test_checkpoints_greedy),
        cmocka_unit_test(test_fused_norm_silu_ops),
        cmocka_unit_test(test_dummy_fp8),
        cmocka_unit_test(test_unsupported_configs),
        cmocka_unit_test(test_fp8_tensor_without_config),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
