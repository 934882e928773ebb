/* offline_args.c - the flags of `pagellm bench throughput` and `pagellm bench latency`
 * (vLLM's names and defaults); the engine's config keys are parsed by the caller with
 * cfg_parse_flag, so --model, --seed, --load-format dummy, --max-num-seqs ... apply too. */
#include <stdlib.h>
#include <string.h>

#include "bench_internal.h"

static const char throughput_help[] =
    "usage: pagellm bench throughput [--input-len N --output-len N --num-prompts N] [flags]\n"
    "\n"
    "Offline throughput, in-process (no HTTP): every prompt enters the engine at once and\n"
    "the engine steps until all are done (ignore_eos, temperature 1). Prints vLLM's\n"
    "\"Throughput: X requests/s, Y total tokens/s, Z output tokens/s\" and the token totals.\n"
    "\n"
    "  --input-len N             prompt tokens, BOS included (default 1024)\n"
    "  --output-len N            tokens generated per prompt (default 128)\n"
    "  --num-prompts N           prompts (default 1000)\n"
    "  --random-range-ratio R    lengths uniform in [len*(1-R), len*(1+R)] (default 0)\n"
    "  --random-prefix-len N     a random prefix shared by every prompt (default 0)\n"
    "  --dataset-name NAME       random (default), sharegpt or jsonl (prompt, max_tokens)\n"
    "  --dataset-path F          the dataset file\n"
    "  --output-json F           also write the results as JSON\n"
    "  --disable-tqdm            no progress bar\n"
    "  (prompts are drawn with the --seed key below)\n"
    "\n"
    "Configuration (a --config YAML file, then these flags; keys as vLLM's):\n";

static const char latency_help[] =
    "usage: pagellm bench latency [--batch-size B --input-len I --output-len O] [flags]\n"
    "\n"
    "Offline latency, in-process (no HTTP): a batch of B random prompts of I tokens runs to\n"
    "completion, O tokens each (ignore_eos), for warm-up and then measured iterations.\n"
    "Prints vLLM's \"Avg latency\" and percentile lines, plus the median time of one decode\n"
    "step of the batch and of its prefill.\n"
    "\n"
    "  --batch-size B            prompts per batch (default 8)\n"
    "  --input-len I             prompt tokens (default 32)\n"
    "  --output-len O            tokens generated per prompt (default 128)\n"
    "  --num-iters-warmup N      iterations before measuring (default 10)\n"
    "  --num-iters N             measured iterations (default 30)\n"
    "  --swap-blocks N           then time swapping N KV blocks out to the swap space and\n"
    "                            back in (default 0: not measured)\n"
    "  --json-schema F           every request follows the JSON schema in file F (structured\n"
    "                            output: the cost of the constraint); it ends when complete\n"
    "  --output-json F           also write the results as JSON\n"
    "  --disable-tqdm            no progress bar\n"
    "\n"
    "Configuration (a --config YAML file, then these flags; keys as vLLM's):\n";

void bench_offline_print_help(FILE *f, int latency) {
    fputs(latency ? latency_help : throughput_help, f);
}

void bench_offline_options_init(BenchOfflineOptions *o, int latency) {
    memset(o, 0, sizeof *o);
    o->data = bench_dataset_options_default();
    if (latency) {
        o->data.input_len = 32;
        o->data.output_len = 128;
    }
    o->batch_size = 8;
    o->num_iters_warmup = 10;
    o->num_iters = 30;
}

void bench_offline_options_free(BenchOfflineOptions *o) {
    free(o->dataset_path);
    free(o->output_json);
    free(o->json_schema);
    memset(o, 0, sizeof *o);
}

int bench_offline_flag(BenchOfflineOptions *o, int latency, int argc, char **argv, int *i) {
    const char *cmd = latency ? "latency" : "throughput", *v;
    int r;
    if (!strcmp(argv[*i], "--disable-tqdm")) {
        o->disable_progress = 1;
        return 1;
    }
    if ((r = bflag_value(cmd, "--output-json", argc, argv, i, &v)) != 0) {
        if (r < 0)
            return -1;
        bflag_set_str(&o->output_json, v);
        return 1;
    }
    if (!latency)
        return bflag_dataset(cmd, &o->data, &o->dataset_path, 0, argc, argv, i);
    if ((r = bflag_value(cmd, "--json-schema", argc, argv, i, &v)) != 0) {
        if (r < 0)
            return -1;
        bflag_set_str(&o->json_schema, v);
        return 1;
    }
    static const char *const names[] = {"--input-len",        "--output-len", "--batch-size",
                                        "--num-iters-warmup", "--num-iters",  "--swap-blocks"};
    static const long lows[] = {1, 1, 1, 0, 1, 0};
    int *fields[] = {&o->data.input_len,   &o->data.output_len, &o->batch_size,
                     &o->num_iters_warmup, &o->num_iters,       &o->swap_blocks};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        if ((r = bflag_value(cmd, names[k], argc, argv, i, &v)) == 0)
            continue;
        return r < 0 || !bflag_int(cmd, names[k], v, lows[k], 1 << 24, fields[k]) ? -1 : 1;
    }
    return 0;
}
