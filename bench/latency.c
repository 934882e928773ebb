/* latency.c - `pagellm bench latency`: vLLM's offline latency benchmark on the engine API.
 * One batch of --batch-size random prompts (--input-len token ids each, as vLLM's dummy
 * prompts) runs to completion per iteration, --output-len tokens per prompt (ignore_eos,
 * temperature 1), each following a JSON schema with --json-schema. Besides vLLM's average and
 * percentile latencies it times every engine step once the whole batch has its first token:
 * those steps are pure decode steps of the batch, the number the decode performance work
 * targets. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "bench_internal.h"
#include "grammar.h"

typedef struct {
    double *v;
    int n, cap;
} Times;

static void add(Times *t, double x) {
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 256;
        t->v = pl_xrealloc(t->v, (size_t)t->cap * sizeof *t->v);
    }
    t->v[t->n++] = x;
}

/* One iteration: seconds to completion, or -1 on failure. Decode step and prefill times go
 * to the lists when they are given (measured iterations). A decode step counts only when
 * every request of the batch got a token from it (after all first tokens, before any has
 * finished), so its time is that of a step of the whole batch. */
static double run_batch(Engine *e, const BenchOfflineOptions *o, int32_t *const *prompts,
                        GrCompiled *schema, uint64_t seed, Times *decode, Times *prefill,
                        long *tokens) {
    int b = o->batch_size, started = 0, done = 0;
    double t0 = pl_now();
    for (int i = 0; i < b; i++) {
        EngRequest r = {.prompt = prompts[i], .num_prompt = o->data.input_len};
        r.params.max_tokens = o->data.output_len;
        r.params.ignore_eos = 1;
        r.params.sampling = sampling_params_default();
        r.params.sampling.temperature = 1.0f;
        r.params.sampling.seed = seed + (uint64_t)i;
        r.params.constraint = schema;
        if (eng_add_request(e, &r, NULL) != PL_OK) {
            fprintf(stderr, "pagellm bench latency: %s\n", pl_error());
            eng_abort_all(e);
            while (eng_has_work(e)) {
                const EngEvent *ev;
                eng_step(e, &ev);
            }
            return -1;
        }
    }
    while (done < b && eng_has_work(e)) {
        int decoding = started == b; /* every prompt already has its first token */
        const EngEvent *ev;
        double ts = pl_now();
        int n = eng_step(e, &ev), step_tokens = 0;
        double te = pl_now();
        for (int k = 0; k < n; k++) {
            if (ev[k].token >= 0) {
                (*tokens)++;
                step_tokens++;
                started += ev[k].num_generated == 1;
            }
            done += ev[k].finish != FINISH_NONE;
        }
        if (decoding && step_tokens == b && decode)
            add(decode, te - ts);
        if (!decoding && started == b && prefill)
            add(prefill, te - t0);
    }
    return pl_now() - t0;
}

static void print_results(const Times *lat, const Times *dec, const Times *pre,
                          const BenchOfflineOptions *o) {
    static const int pcts[] = {10, 25, 50, 75, 90, 99};
    char buf[64];
    printf("Avg latency: %s seconds\n", bench_pyfloat(bst_mean(lat->v, lat->n), buf, sizeof buf));
    for (int i = 0; i < 6; i++)
        printf("%d%% percentile latency: %s seconds\n", pcts[i],
               bench_pyfloat(bst_percentile(lat->v, lat->n, pcts[i]), buf, sizeof buf));
    printf("Decode step (batch %d): median %.3f ms, mean %.3f ms, P10 %.3f ms, P90 %.3f ms over "
           "%d steps\n",
           o->batch_size, bst_median(dec->v, dec->n) * 1e3, bst_mean(dec->v, dec->n) * 1e3,
           bst_percentile(dec->v, dec->n, 10) * 1e3, bst_percentile(dec->v, dec->n, 90) * 1e3,
           dec->n);
    printf("Prefill (batch %d x %d tokens, to every first token): median %.3f ms\n", o->batch_size,
           o->data.input_len, bst_median(pre->v, pre->n) * 1e3);
    fflush(stdout);
}

static json_t *results_json(const Times *lat, const Times *dec, const Times *pre,
                            const BenchOfflineOptions *o, long tokens) {
    static const int pcts[] = {10, 25, 50, 75, 90, 99};
    json_t *l = json_array(), *p = json_object(), *d = json_array();
    for (int i = 0; i < lat->n; i++)
        json_array_append_new(l, json_real(lat->v[i]));
    for (int i = 0; i < dec->n; i++)
        json_array_append_new(d, json_real(dec->v[i] * 1e3));
    for (int i = 0; i < 6; i++) {
        char k[8];
        snprintf(k, sizeof k, "%d", pcts[i]);
        json_object_set_new(p, k, json_real(bst_percentile(lat->v, lat->n, pcts[i])));
    }
    return json_pack(
        "{s:f, s:o, s:o, s:i, s:i, s:i, s:I, s:{s:f, s:f, s:f, s:f, s:i}, s:o, "
        "s:{s:f}}",
        "avg_latency", bst_mean(lat->v, lat->n), "latencies", l, "percentiles", p, "batch_size",
        o->batch_size, "input_len", o->data.input_len, "output_len", o->data.output_len,
        "total_output_tokens", (json_int_t)tokens, "decode_step_ms", "median",
        bst_median(dec->v, dec->n) * 1e3, "mean", bst_mean(dec->v, dec->n) * 1e3, "p10",
        bst_percentile(dec->v, dec->n, 10) * 1e3, "p90", bst_percentile(dec->v, dec->n, 90) * 1e3,
        "count", dec->n, "decode_step_times_ms", d, "prefill_ms", "median",
        bst_median(pre->v, pre->n) * 1e3);
}

/* The --json-schema file compiled, or NULL (none, or an error, printed: *rc = 1). */
static GrCompiled *load_schema(const char *path, int *rc) {
    if (!path)
        return NULL;
    json_error_t je;
    json_t *schema = json_load_file(path, 0, &je);
    char err[512] = "";
    GrCompiled *c = schema ? gr_compile_json_schema(schema, err, sizeof err) : NULL;
    json_decref(schema);
    if (!c) {
        fprintf(stderr, "pagellm bench latency: --json-schema %s: %s\n", path,
                schema ? err : je.text);
        *rc = 1;
    }
    return c;
}

int bench_latency_run(Engine *e, const BenchOfflineOptions *o, uint64_t seed) {
    int rc = 0;
    GrCompiled *schema = load_schema(o->json_schema, &rc);
    if (rc)
        return rc;
    BenchRng rng;
    brng_seed(&rng, seed);
    int32_t **prompts = pl_xcalloc((size_t)o->batch_size, sizeof *prompts);
    for (int i = 0; i < o->batch_size; i++)
        prompts[i] = bench_random_ids(&rng, o->data.input_len, e);
    Times lat = {0}, dec = {0}, pre = {0};
    long tokens = 0, warm_tokens = 0;
    BenchProgress bar;
    printf("Warming up...\n");
    fflush(stdout);
    bench_progress_start(&bar, o->num_iters_warmup, "warm-up iterations", o->disable_progress);
    for (int it = 0; it < o->num_iters_warmup && rc == 0; it++) {
        rc = run_batch(e, o, prompts, schema, seed, NULL, NULL, &warm_tokens) < 0;
        bench_progress_step(&bar, rc == 0);
    }
    bench_progress_end(&bar);
    bench_progress_start(&bar, o->num_iters, "iterations", o->disable_progress || rc);
    EngineStats before = eng_stats(e);
    for (int it = 0; it < o->num_iters && rc == 0; it++) {
        double s = run_batch(e, o, prompts, schema, seed, &dec, &pre, &tokens);
        rc = s < 0;
        if (!rc)
            add(&lat, s);
        bench_progress_step(&bar, rc == 0);
    }
    bench_progress_end(&bar);
    long expected = (long)o->num_iters * o->batch_size * o->data.output_len;
    if (rc == 0) {
        if (tokens != expected && !schema) /* a constrained sample ends when complete */
            fprintf(stderr, "WARNING: %ld tokens generated, %ld expected\n", tokens, expected);
        print_results(&lat, &dec, &pre, o);
        EngineStats after = eng_stats(e);
        bench_print_decode_phases(&before, &after);
        EngSwapTiming sw;
        if (o->swap_blocks > 0 && eng_measure_swap(e, o->swap_blocks, &sw) != PL_OK) {
            fprintf(stderr, "pagellm bench latency: %s\n", pl_error());
            rc = 1;
        } else if (o->swap_blocks > 0) {
            printf("Swap of %d blocks (%.1f MiB each way): out %.2f GB/s, in %.2f GB/s, round "
                   "trip %.2f GB/s\n",
                   sw.blocks, sw.bytes / (1 << 20), sw.bytes / sw.seconds_out / 1e9,
                   sw.bytes / sw.seconds_in / 1e9,
                   2 * sw.bytes / (sw.seconds_out + sw.seconds_in) / 1e9);
            if (sw.seconds_both > 0) {
                double hidden = sw.seconds_compute + sw.seconds_in - sw.seconds_both;
                double shorter =
                    sw.seconds_compute < sw.seconds_in ? sw.seconds_compute : sw.seconds_in;
                printf("Swap-in beside decode compute: compute alone %.2f ms, swap-in alone "
                       "%.2f ms, both %.2f ms: %.0f %% of the shorter overlapped\n",
                       sw.seconds_compute * 1e3, sw.seconds_in * 1e3, sw.seconds_both * 1e3,
                       100 * hidden / shorter);
            }
        }
        if (o->output_json &&
            !bench_write_offline_json(results_json(&lat, &dec, &pre, o, tokens), o->output_json))
            rc = 1;
    }
    for (int i = 0; i < o->batch_size; i++)
        free(prompts[i]);
    free(prompts);
    free(lat.v);
    free(dec.v);
    free(pre.v);
    gr_compiled_free(schema);
    return rc;
}
