/* grammar_bench.c - how long the grammar library takes per decode step: fill_mask and accept
 * over real vocabularies (tests/data/tokenizers) and a synthetic 128k one (every distinct token
 * of those four, topped up with random word pieces to Llama 3's 128256), for a JSON schema,
 * any JSON object and a regex. Built by ninja as build/tools/grammar_bench (not a test):
 *
 *   build/tools/grammar_bench [SEQUENCES [STEPS]]      (default 64 sequences of 200 steps)
 *
 * For each (vocabulary, constraint) it compiles the constraint, then runs SEQUENCES matchers
 * in lockstep, as the engine would at that batch size: each step fills every matcher's mask
 * and accepts a random allowed token (EOS once allowed, a token closing a string or container
 * a quarter of the time, else any). Round 1 starts with nothing cached (cold: every new
 * automaton state is determinized and its mask computed by a trie walk); round 2 repeats it
 * with the same seeds on the warm GrCompiled (a server's later requests with that schema).
 * Printed: microseconds per fill_mask (mean, p50, p99, max) and per accept, and per step of the
 * whole batch (mean and max of the sum over its sequences: one thread doing them all). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grammar.h"
#include "support/hf_vocab.h"

enum { SYNTH_N = 128256 };

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static uint64_t rng(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* ---- the synthetic vocabulary ---------------------------------------------------------- */

static int cmp_bytes(const void *a, const void *b, const HfVocab *v) {
    int i = *(const int *)a, j = *(const int *)b;
    size_t n = v->lens[i] < v->lens[j] ? v->lens[i] : v->lens[j];
    int c = memcmp(v->bytes[i], v->bytes[j], n);
    return c ? c : (v->lens[i] > v->lens[j]) - (v->lens[i] < v->lens[j]);
}

static const HfVocab *sort_vocab;
static int cmp_ids(const void *a, const void *b) {
    return cmp_bytes(a, b, sort_vocab);
}

/* Every distinct token of the real vocabularies, then random word pieces, to SYNTH_N; id 0
 * is EOS. */
static void synthetic(const HfVocab *real, int nreal, HfVocab *out) {
    HfVocab all = {0};
    for (int r = 0; r < nreal; r++)
        all.n += real[r].n;
    all.bytes = calloc(all.n, sizeof *all.bytes);
    all.lens = calloc(all.n, sizeof *all.lens);
    int *ids = malloc(all.n * sizeof *ids), k = 0;
    for (int r = 0, base = 0; r < nreal; base += real[r++].n)
        for (int t = 0; t < real[r].n; t++)
            if (real[r].bytes[t]) {
                all.bytes[base + t] = real[r].bytes[t];
                all.lens[base + t] = real[r].lens[t];
                ids[k++] = base + t;
            }
    sort_vocab = &all;
    qsort(ids, k, sizeof *ids, cmp_ids);
    out->n = SYNTH_N;
    out->bytes = calloc(SYNTH_N, sizeof *out->bytes);
    out->lens = calloc(SYNTH_N, sizeof *out->lens);
    out->eos = 0;
    int n = 1;
    for (int i = 0; i < k && n < SYNTH_N; i++)
        if (!i || cmp_bytes(&ids[i - 1], &ids[i], &all)) {
            out->bytes[n] = malloc(all.lens[ids[i]]);
            memcpy(out->bytes[n], all.bytes[ids[i]], all.lens[ids[i]]);
            out->lens[n++] = all.lens[ids[i]];
        }
    uint64_t seed = 7;
    for (; n < SYNTH_N; n++) {
        size_t len = 2 + rng(&seed) % 8;
        out->bytes[n] = malloc(len);
        out->bytes[n][0] = rng(&seed) % 2 ? ' ' : 'a' + (char)(rng(&seed) % 26);
        for (size_t i = 1; i < len; i++)
            out->bytes[n][i] = 'a' + (char)(rng(&seed) % 26);
        out->lens[n] = len;
    }
    free(ids);
    free(all.bytes);
    free(all.lens);
}

/* ---- one run --------------------------------------------------------------------------- */

typedef struct {
    const char *name;
    char kind; /* 's' schema, 'o' json_object, 'r' regex */
    const char *text;
} Constraint;

static const Constraint CONSTRAINTS[] = {
    {"schema", 's',
     "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":"
     "\"integer\",\"minimum\":0,\"maximum\":150},\"email\":{\"type\":\"string\",\"format\":"
     "\"uuid\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":5},"
     "\"address\":{\"type\":\"object\",\"properties\":{\"street\":{\"type\":\"string\"},"
     "\"city\":{\"type\":\"string\"},\"zip\":{\"type\":\"string\",\"pattern\":\"[0-9]{5}\"}},"
     "\"required\":[\"street\",\"city\"]},\"score\":{\"type\":\"number\"},\"kind\":{\"enum\":"
     "[\"a\",\"b\",\"c\"]}},\"required\":[\"name\",\"age\",\"address\",\"tags\"]}"},
    {"json_object", 'o', NULL},
    {"regex", 'r', "[A-Z][a-z]{0,12}( [A-Z][a-z]{0,12}){0,4}: \\d{1,4}(\\.\\d\\d)?"},
};

static GrCompiled *compile(const Constraint *k) {
    char err[256];
    GrCompiled *c = NULL;
    if (k->kind == 's') {
        json_t *s = json_loads(k->text, 0, NULL);
        c = gr_compile_json_schema(s, err, sizeof err);
        json_decref(s);
    } else if (k->kind == 'o') {
        c = gr_compile_json_object(err, sizeof err);
    } else {
        c = gr_compile_regex(k->text, strlen(k->text), err, sizeof err);
    }
    if (!c) {
        fprintf(stderr, "grammar_bench: %s: %s\n", k->name, err);
        exit(1);
    }
    return c;
}

typedef struct {
    double *fill; /* per fill_mask, us */
    int nfill;
    double accept_us, step_us_sum, step_us_max;
    int naccept, nsteps;
} Times;

/* nseq matchers in lockstep for up to steps steps (each ends at EOS). */
static void run(GrCompiled *c, const GrVocab *gv, const HfVocab *hv, const uint8_t *closing,
                int nseq, int steps, Times *t) {
    size_t words = gr_vocab_mask_words(gv);
    uint32_t *mask = malloc(words * sizeof *mask);
    int *ids = malloc(2 * hv->n * sizeof *ids), *close = ids + hv->n;
    GrMatcher **m = malloc(nseq * sizeof *m);
    uint64_t *seed = malloc(nseq * sizeof *seed);
    uint8_t *done = calloc(nseq, 1);
    for (int i = 0; i < nseq; i++) {
        m[i] = gr_matcher_new(c, gv);
        seed[i] = 1000 + i;
    }
    memset(t, 0, sizeof *t);
    t->fill = malloc((size_t)nseq * steps * sizeof *t->fill);
    for (int step = 0; step < steps; step++) {
        double step_us = 0;
        int live = 0;
        for (int i = 0; i < nseq; i++) {
            if (done[i])
                continue;
            double t0 = now_us();
            if (gr_matcher_fill_mask(m[i], mask)) {
                fprintf(stderr, "grammar_bench: %s\n", gr_matcher_error(m[i]));
                exit(1);
            }
            double t1 = now_us();
            int k = 0, nc = 0;
            for (size_t w = 0; w < words; w++)
                for (uint32_t bits = mask[w]; bits; bits &= bits - 1) {
                    int tok = (int)(32 * w) + __builtin_ctz(bits);
                    ids[k++] = tok;
                    if (closing[tok])
                        close[nc++] = tok;
                }
            live++;
            int pick = ids[rng(&seed[i]) % k];
            if (nc && rng(&seed[i]) % 4 == 0)
                pick = close[rng(&seed[i]) % nc];
            if (mask[hv->eos / 32] >> (hv->eos % 32) & 1)
                pick = hv->eos;
            double t2 = now_us();
            if (gr_matcher_accept(m[i], pick)) {
                fprintf(stderr, "grammar_bench: refused: %s\n", gr_matcher_error(m[i]));
                exit(1);
            }
            double t3 = now_us();
            done[i] = pick == hv->eos;
            t->fill[t->nfill++] = t1 - t0;
            t->accept_us += t3 - t2;
            t->naccept++;
            step_us += (t1 - t0) + (t3 - t2);
        }
        if (!live)
            break;
        t->step_us_sum += step_us;
        t->step_us_max = step_us > t->step_us_max ? step_us : t->step_us_max;
        t->nsteps++;
    }
    for (int i = 0; i < nseq; i++)
        gr_matcher_free(m[i]);
    free(m);
    free(seed);
    free(done);
    free(ids);
    free(mask);
}

static void report(const char *vocab, const char *constraint, const char *round, Times *t) {
    qsort(t->fill, t->nfill, sizeof *t->fill, cmp_double);
    double sum = 0;
    for (int i = 0; i < t->nfill; i++)
        sum += t->fill[i];
    printf("%-12s %-12s %-5s %7d %9.1f %8.1f %8.1f %9.1f %8.2f %6d %9.1f %9.1f\n", vocab,
           constraint, round, t->nfill, sum / t->nfill, t->fill[t->nfill / 2],
           t->fill[(int)(t->nfill * 0.99)], t->fill[t->nfill - 1], t->accept_us / t->naccept,
           t->nsteps, t->step_us_sum / t->nsteps, t->step_us_max);
    free(t->fill);
}

int main(int argc, char **argv) {
    int nseq = argc > 1 ? atoi(argv[1]) : 64, steps = argc > 2 ? atoi(argv[2]) : 200;
    static const char *const names[] = {"gpt2", "smollm-135m", "falcon-7b",
                                        "tinyllama-1.1b-chat-v1.0"};
    HfVocab v[5];
    for (int i = 0; i < 4; i++) {
        char path[256];
        snprintf(path, sizeof path, "tests/data/tokenizers/%s/tokenizer.json", names[i]);
        if (hf_vocab_load(path, &v[i]))
            return 1;
    }
    synthetic(v, 4, &v[4]);
    printf("fill_mask and accept in microseconds, %d sequences in lockstep, up to %d steps\n", nseq,
           steps);
    printf("%-12s %-12s %-5s %7s %9s %8s %8s %9s %8s %6s %9s %9s\n", "vocab", "constraint", "round",
           "masks", "mean", "p50", "p99", "max", "accept", "steps", "batch", "step max");
    for (int i = 4; i >= 0; i--) {
        char err[256];
        GrVocab *gv = gr_vocab_new((const char *const *)v[i].bytes, v[i].lens, v[i].n, &v[i].eos, 1,
                                   err, sizeof err);
        uint8_t *closing = calloc(v[i].n, 1);
        for (int t = 0; t < v[i].n; t++)
            for (size_t b = 0; b < v[i].lens[t]; b++)
                closing[t] |= v[i].bytes[t][b] && strchr("\"]}", v[i].bytes[t][b]);
        const char *vname = i == 4 ? "synth-128k" : names[i];
        for (size_t k = 0; k < sizeof CONSTRAINTS / sizeof *CONSTRAINTS; k++) {
            double t0 = now_us();
            GrCompiled *c = compile(&CONSTRAINTS[k]);
            double compile_us = now_us() - t0;
            Times t;
            run(c, gv, &v[i], closing, nseq, steps, &t);
            report(vname, CONSTRAINTS[k].name, "cold", &t);
            run(c, gv, &v[i], closing, nseq, steps, &t);
            report(vname, CONSTRAINTS[k].name, "warm", &t);
            printf("%-12s %-12s compile %.0f us\n", vname, CONSTRAINTS[k].name, compile_us);
            gr_compiled_free(c);
        }
        free(closing);
        gr_vocab_free(gv);
        hf_vocab_free(&v[i]);
    }
    return 0;
}
