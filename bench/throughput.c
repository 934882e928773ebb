/* throughput.c - `pagellm bench throughput`: vLLM's offline throughput benchmark on the
 * engine API. Every prompt is added at once and eng_step runs until all are finished, so
 * the scheduler packs batches as it would under a full queue. Generation ignores EOS
 * (exactly --output-len tokens per prompt) at temperature 1, as vLLM's does. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench_internal.h"

int32_t *bench_random_ids(BenchRng *rng, int n, const Engine *e) {
    const ModelConfig *mc = eng_model_config(e);
    int32_t *ids = pl_xmalloc((size_t)(n > 0 ? n : 1) * sizeof *ids);
    for (int i = 0; i < n; i++) {
        int32_t id;
        int special;
        do { /* no BOS or EOS in the middle of a prompt */
            id = (int32_t)brng_int(rng, 0, mc->vocab_size - 1);
            special = id == mc->bos_token_id;
            for (int k = 0; k < mc->num_eos; k++)
                special |= id == mc->eos_token_ids[k];
        } while (special && mc->vocab_size > 4);
        ids[i] = id;
    }
    return ids;
}

/* Random prompts of token ids for a model folder without tokenizer.json (dummy weights):
 * lengths drawn as the random dataset draws them, no text. */
static void random_id_dataset(const BenchDatasetOptions *o, const Engine *e, BenchDataset *ds) {
    BenchRng rng;
    brng_seed(&rng, o->seed);
    double r = o->range_ratio;
    int cap = 0;
    for (int i = 0; i < o->num_prompts; i++) {
        int in = (int)brng_int(&rng, (int)floor(o->input_len * (1 - r)),
                               (int)ceil(o->input_len * (1 + r)));
        int out = (int)brng_int(&rng, (int)fmax(1, floor(o->output_len * (1 - r))),
                                (int)fmax(1, ceil(o->output_len * (1 + r))));
        in = in > 0 ? in : 1;
        int32_t *ids = bench_random_ids(&rng, in + o->prefix_len, e);
        ds_add(ds, &cap, pl_xstrdup(""), in + o->prefix_len, out, ids);
    }
}

void bench_print_decode_phases(const EngineStats *before, const EngineStats *after) {
    double n = (double)(after->decode_steps - before->decode_steps);
    if (n <= 0)
        return;
    double ms[5] = {(after->decode_seconds_schedule - before->decode_seconds_schedule) / n * 1e3,
                    (after->decode_seconds_prepare - before->decode_seconds_prepare) / n * 1e3,
                    (after->decode_seconds_forward - before->decode_seconds_forward) / n * 1e3,
                    (after->decode_seconds_sample - before->decode_seconds_sample) / n * 1e3,
                    (after->decode_seconds_emit - before->decode_seconds_emit) / n * 1e3};
    double total = ms[0] + ms[1] + ms[2] + ms[3] + ms[4], host = ms[0] + ms[1] + ms[4];
    printf("Decode step phases (mean of %.0f steps): schedule %.3f ms, prepare %.3f ms, forward "
           "%.3f ms, sample %.3f ms, emit %.3f ms; host share (schedule + prepare + emit) "
           "%.1f %%\n",
           n, ms[0], ms[1], ms[2], ms[3], ms[4], total > 0 ? host / total * 100 : 0);
    double other = (double)(after->other_steps - before->other_steps);
    printf("Decode steps: %.1f sequences each; steps with prompt tokens: %.0f, %.0f tokens each\n",
           (double)(after->decode_rows - before->decode_rows) / n, other,
           other > 0 ? (double)(after->other_tokens - before->other_tokens) / other : 0.0);
    const SchedulerCounters *a = &after->sched, *b = &before->sched;
    printf("Prompt tokens computed: %lld (%lld more from the prefix cache); preemptions: %lld by "
           "swap, %lld by recompute\n",
           (long long)(a->prompt_tokens - b->prompt_tokens),
           (long long)(a->cached_prompt_tokens - b->cached_prompt_tokens),
           (long long)(a->preempt_swap - b->preempt_swap),
           (long long)(a->preempt_recompute - b->preempt_recompute));
}

int bench_write_offline_json(json_t *j, const char *path) {
    int ok = json_dump_file(j, path, JSON_INDENT(4) | JSON_REAL_PRECISION(17)) == 0;
    if (!ok)
        fprintf(stderr, "pagellm bench: --output-json: cannot write %s\n", path);
    json_decref(j);
    return ok;
}

int bench_throughput_run(Engine *e, const BenchOfflineOptions *o, uint64_t seed) {
    const Tokenizer *t = eng_tokenizer(e);
    BenchDatasetOptions d = o->data;
    d.seed = seed;
    BenchDataset ds = {0};
    if (!t && d.kind == BENCH_DS_RANDOM) {
        random_id_dataset(&d, e, &ds);
    } else if (!t) {
        fprintf(stderr, "pagellm bench throughput: the model folder has no tokenizer.json, so "
                        "only random prompts work (no --dataset-name)\n");
        return 1;
    } else if (bench_dataset_load(&d, t, 1, &ds) != PL_OK) {
        fprintf(stderr, "pagellm bench throughput: %s\n", pl_error());
        return 1;
    }
    long prompt_tokens = 0, expected_output = 0, output_tokens = 0;
    int rc = 0, finished = 0;
    BenchProgress bar;
    printf("Running %d prompts through the engine (%s)\n", ds.n, eng_device_name(e));
    fflush(stdout);
    double t0 = pl_now();
    for (int i = 0; i < ds.n; i++) {
        EngRequest r = {.prompt = ds.items[i].ids, .num_prompt = ds.items[i].prompt_len};
        r.params.max_tokens = ds.items[i].output_len;
        r.params.ignore_eos = 1;
        r.params.sampling = sampling_params_default();
        r.params.sampling.temperature = 1.0f;
        r.params.sampling.seed = seed + (uint64_t)i;
        if (eng_add_request(e, &r, NULL) != PL_OK) {
            fprintf(stderr, "pagellm bench throughput: prompt %d (%d tokens + %d): %s\n", i + 1,
                    ds.items[i].prompt_len, ds.items[i].output_len, pl_error());
            eng_abort_all(e);
            rc = 1;
            break;
        }
        prompt_tokens += ds.items[i].prompt_len;
        expected_output += ds.items[i].output_len;
    }
    bench_progress_start(&bar, ds.n, "requests", o->disable_progress || rc);
    EngineStats before = eng_stats(e);
    while (eng_has_work(e)) {
        const EngEvent *ev;
        int n = eng_step(e, &ev);
        for (int k = 0; k < n; k++) {
            output_tokens += ev[k].token >= 0;
            if (ev[k].finish != FINISH_NONE) {
                finished++;
                bench_progress_step(&bar, ev[k].finish != FINISH_ABORT);
            }
        }
    }
    double elapsed = pl_now() - t0;
    bench_progress_end(&bar);
    if (rc == 0) {
        double d_ = elapsed > 0 ? elapsed : 1e-9;
        printf("Throughput: %.2f requests/s, %.2f total tokens/s, %.2f output tokens/s\n",
               ds.n / d_, (prompt_tokens + output_tokens) / d_, output_tokens / d_);
        printf("Total num prompt tokens:  %ld\n", prompt_tokens);
        printf("Total num output tokens:  %ld\n", output_tokens);
        EngineStats after = eng_stats(e);
        bench_print_decode_phases(&before, &after);
        if (output_tokens != expected_output)
            fprintf(stderr,
                    "WARNING: actual token counts differ from requested counts: output=%ld/%ld\n",
                    output_tokens, expected_output);
        if (o->output_json) {
            json_t *j = json_pack(
                "{s:f, s:i, s:I, s:f, s:f, s:I, s:I}", "elapsed_time", elapsed, "num_requests",
                ds.n, "total_num_tokens", (json_int_t)(prompt_tokens + output_tokens),
                "requests_per_second", ds.n / d_, "tokens_per_second",
                (prompt_tokens + output_tokens) / d_, "total_prompt_tokens",
                (json_int_t)prompt_tokens, "total_output_tokens", (json_int_t)output_tokens);
            if (!bench_write_offline_json(j, o->output_json))
                rc = 1;
        }
    }
    bench_dataset_free(&ds);
    return rc;
}
