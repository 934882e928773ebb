/* generate.c - `pagellm generate`: complete a prompt (streamed to stdout) or a file of
 * prompts (one completion per line, in input order), with statistics on stderr. */
#include <float.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char help[] =
    "usage: pagellm generate [--prompt TEXT | --prompt-file F] [flags]\n"
    "\n"
    "Prints the completion (text only, prompt excluded) to stdout as tokens arrive, and\n"
    "timing statistics to stderr. With --prompt-file, every non-blank line is a prompt (or a\n"
    "JSON object {\"prompt\": ..., \"max_tokens\": ...}); the completions are printed in input\n"
    "order, one per line, with newlines escaped as \\n and backslashes as \\\\.\n"
    "\n"
    "  --prompt TEXT                the prompt (default: empty, i.e. BOS only)\n"
    "  --prompt-file F              prompts, one per line (or JSONL)\n"
    "  --max-tokens N               tokens to generate at most (default 64)\n"
    "  --temperature T              0 = greedy (default 1.0)\n"
    "  --top-p P                    nucleus sampling mass, (0, 1] (default 1)\n"
    "  --top-k K                    keep the K most likely tokens, 0 = off (default 0)\n"
    "  --min-p P                    drop tokens below P x the top probability (default 0)\n"
    "  --repetition-penalty R       > 1 discourages repeats of prompt/output tokens (1)\n"
    "  --presence-penalty X         subtracted from tokens already generated (0)\n"
    "  --frequency-penalty X        subtracted per earlier occurrence (0)\n"
    "  --ignore-eos                 keep generating past end-of-sequence tokens\n"
    "  (the sampler's seed is the --seed key below)\n"
    "\n"
    "Configuration (a --config YAML file, then these flags; keys as vLLM's):\n";

typedef struct {
    char *text;
    int max_tokens; /* 0 = the command's --max-tokens */
} Prompt;

/* Parse one flag of the sampling group; 1 consumed, 0 not ours, -1 bad value. */
static int sampling_flag(int argc, char **argv, int *i, GenerateParams *gp) {
    const char *f = argv[*i], *v;
    SamplingParams *s = &gp->sampling;
    double x;
    long n;
    if (!strcmp(f, "--ignore-eos")) {
        gp->ignore_eos = 1;
        return 1;
    }
    if (strcmp(f, "--max-tokens") && strcmp(f, "--temperature") && strcmp(f, "--top-p") &&
        strcmp(f, "--top-k") && strcmp(f, "--min-p") && strcmp(f, "--repetition-penalty") &&
        strcmp(f, "--presence-penalty") && strcmp(f, "--frequency-penalty") && strcmp(f, "--seed"))
        return 0;
    if (!(v = cli_flag_value(argc, argv, i)))
        return -1;
    if (!strcmp(f, "--max-tokens")) {
        if (!cli_parse_int(f, v, 1, 1 << 24, &n))
            return -1;
        gp->max_tokens = (int)n;
    } else if (!strcmp(f, "--top-k")) {
        if (!cli_parse_int(f, v, -1, 1 << 24, &n))
            return -1;
        s->top_k = (int)n;
    } else if (!strcmp(f, "--temperature")) {
        if (!cli_parse_float(f, v, 0, 100, &x))
            return -1;
        s->temperature = (float)x;
    } else if (!strcmp(f, "--top-p")) {
        if (!cli_parse_float(f, v, DBL_MIN, 1, &x))
            return -1;
        s->top_p = (float)x;
    } else if (!strcmp(f, "--min-p")) {
        if (!cli_parse_float(f, v, 0, 1, &x))
            return -1;
        s->min_p = (float)x;
    } else if (!strcmp(f, "--repetition-penalty")) {
        if (!cli_parse_float(f, v, DBL_MIN, 100, &x))
            return -1;
        s->repetition_penalty = (float)x;
    } else if (!strcmp(f, "--presence-penalty")) {
        if (!cli_parse_float(f, v, -2, 2, &x))
            return -1;
        s->presence_penalty = (float)x;
    } else {
        if (!cli_parse_float(f, v, -2, 2, &x))
            return -1;
        s->frequency_penalty = (float)x;
    }
    return 1;
}

/* One line of a prompt file: plain text, or a JSON object with "prompt" and "max_tokens". */
static int parse_prompt_line(const char *path, int lineno, char *line, Prompt *p) {
    p->max_tokens = 0;
    if (line[0] != '{') {
        p->text = pl_xstrdup(line);
        return 1;
    }
    json_error_t err;
    json_t *obj = json_loads(line, 0, &err);
    json_t *prompt = obj ? json_object_get(obj, "prompt") : NULL;
    json_t *max_tokens = obj ? json_object_get(obj, "max_tokens") : NULL;
    const char *problem = NULL;
    if (!obj)
        problem = err.text;
    else if (!json_is_string(prompt))
        problem = "\"prompt\" must be a string";
    else if (max_tokens && (!json_is_integer(max_tokens) || json_integer_value(max_tokens) < 1))
        problem = "\"max_tokens\" must be a positive integer";
    if (problem) {
        fprintf(stderr, "pagellm: %s:%d: %s\n", path, lineno, problem);
        json_decref(obj);
        return 0;
    }
    p->text = pl_xstrdup(json_string_value(prompt));
    if (max_tokens)
        p->max_tokens = (int)json_integer_value(max_tokens);
    json_decref(obj);
    return 1;
}

static Prompt *read_prompt_file(const char *path, int *count) {
    char *data;
    if (pl_read_file(path, &data, NULL) != PL_OK) {
        fprintf(stderr, "pagellm: --prompt-file: %s\n", pl_error());
        return NULL;
    }
    Prompt *list = NULL;
    int n = 0, cap = 0, lineno = 0, ok = 1;
    for (char *line = data, *next; ok && line && *line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        lineno++;
        size_t len = strlen(line);
        if (len && line[len - 1] == '\r')
            line[len - 1] = '\0';
        if (strspn(line, " \t") == strlen(line))
            continue; /* blank line */
        if (n == cap)
            list = pl_xrealloc(list, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *list);
        ok = parse_prompt_line(path, lineno, line, &list[n]);
        n += ok;
    }
    free(data);
    if (ok && n == 0) {
        fprintf(stderr, "pagellm: --prompt-file: %s holds no prompt\n", path);
        ok = 0;
    }
    if (!ok) {
        for (int i = 0; i < n; i++)
            free(list[i].text);
        free(list);
        return NULL;
    }
    *count = n;
    return list;
}

/* Streaming sink: print each piece as it arrives. */
static int print_piece(void *ctx, int32_t token, const char *text, size_t len) {
    (void)ctx;
    (void)token;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;
}

static void print_escaped_line(const char *s) {
    for (; *s; s++) {
        if (*s == '\n')
            fputs("\\n", stdout);
        else if (*s == '\\')
            fputs("\\\\", stdout);
        else
            putchar(*s);
    }
    putchar('\n');
}

static void print_stats(const Engine *e, const GenerateResult *r) {
    double decode_rate =
        r->num_generated_tokens > 1 ? (r->num_generated_tokens - 1) / r->decode_seconds : 0;
    fprintf(stderr,
            "pagellm: %d prompt tokens, %d generated (finish: %s); time to first token "
            "%.1f ms, decode %.1f tokens/s; device %s\n",
            r->num_prompt_tokens, r->num_generated_tokens, eng_finish_reason_str(r->finish_reason),
            r->prefill_seconds * 1e3, decode_rate, eng_device_name(e));
}

static void print_counters(Engine *e) {
    EngineStats s = eng_stats(e);
    fprintf(
        stderr,
        "pagellm: scheduler: %lld prompt tokens computed (%lld from the prefix cache, "
        "%lld of %lld blocks hit), %lld decode tokens computed; preemptions: %lld by swap, %lld by "
        "recompute; blocks swapped out %lld, in %lld\n",
        (long long)s.sched.prompt_tokens, (long long)s.sched.cached_prompt_tokens,
        (long long)s.blocks.prefix_hits, (long long)s.blocks.prefix_queries,
        (long long)s.sched.generation_tokens, (long long)s.sched.preempt_swap,
        (long long)s.sched.preempt_recompute, (long long)s.blocks.swapped_out,
        (long long)s.blocks.swapped_in);
}

/* Tokenize a prompt; prints the error and returns NULL on failure. */
static int32_t *encode(Engine *e, const char *text, int *n) {
    int32_t *ids;
    if (!eng_tokenizer(e)) {
        fprintf(stderr, "pagellm: the model folder has no tokenizer.json: generate needs one\n");
        return NULL;
    }
    if (tok_encode(eng_tokenizer(e), text, strlen(text), 1, &ids, n) != PL_OK) {
        fprintf(stderr, "pagellm: %s\n", pl_error());
        return NULL;
    }
    return ids;
}

static int run_single(Engine *e, const char *text, const GenerateParams *gp) {
    int n;
    int32_t *ids = encode(e, text, &n);
    if (!ids)
        return 1;
    GenerateResult res;
    Status st = eng_generate(e, ids, n, gp, print_piece, NULL, &res);
    free(ids);
    if (st != PL_OK) {
        fprintf(stderr, "pagellm: %s\n", pl_error());
        return 1;
    }
    putchar('\n');
    fflush(stdout);
    print_stats(e, &res);
    return 0;
}

/* Batch mode: every prompt enters the engine at once; completions print in input order. */
typedef struct {
    char *buf;
    size_t len, cap;
    int done;
} Completion;

static void completion_add(Completion *c, const char *text) {
    size_t n = strlen(text);
    if (c->len + n + 1 > c->cap) {
        c->cap = (c->len + n + 1) * 2;
        c->buf = pl_xrealloc(c->buf, c->cap);
    }
    memcpy(c->buf + c->len, text, n + 1);
    c->len += n;
}

static int run_batch(Engine *e, const Prompt *prompts, int count, const GenerateParams *gp) {
    Completion *out = pl_xcalloc((size_t)count, sizeof *out);
    int rc = 0;
    double t0 = pl_now();
    long generated = 0;
    for (int i = 0; i < count && rc == 0; i++) {
        int n;
        int32_t *ids = encode(e, prompts[i].text, &n);
        if (!ids) {
            rc = 1;
            break;
        }
        EngRequest r = {.prompt = ids, .num_prompt = n, .params = *gp, .user = &out[i]};
        r.params.n = 1;
        if (prompts[i].max_tokens)
            r.params.max_tokens = prompts[i].max_tokens;
        if (eng_add_request(e, &r, NULL) != PL_OK) {
            fprintf(stderr, "pagellm: prompt %d: %s\n", i + 1, pl_error());
            rc = 1;
        }
        free(ids);
    }
    for (int next = 0; rc == 0 && next < count;) {
        const EngEvent *ev;
        int n = eng_step(e, &ev);
        for (int k = 0; k < n; k++) {
            Completion *c = ev[k].user;
            completion_add(c, ev[k].text);
            generated += ev[k].token >= 0;
            c->done |= ev[k].finish != FINISH_NONE;
        }
        for (; next < count && out[next].done; next++) /* print in order as they finish */
            print_escaped_line(out[next].buf ? out[next].buf : "");
        fflush(stdout);
    }
    double secs = pl_now() - t0;
    if (rc == 0)
        fprintf(stderr, "pagellm: %d prompts, %ld tokens generated in %.2f s (%.1f tokens/s)\n",
                count, generated, secs, generated / (secs > 0 ? secs : 1));
    for (int i = 0; i < count; i++)
        free(out[i].buf);
    free(out);
    return rc;
}

typedef struct {
    GenerateParams gp;
    const char *prompt, *prompt_file;
} GenerateArgs;

static int generate_flag(void *ctx, int argc, char **argv, int *i) {
    GenerateArgs *a = ctx;
    int r = sampling_flag(argc, argv, i, &a->gp);
    if (r != 0)
        return r;
    const char **dst = !strcmp(argv[*i], "--prompt")        ? &a->prompt
                       : !strcmp(argv[*i], "--prompt-file") ? &a->prompt_file
                                                            : NULL;
    if (!dst)
        return 0;
    return (*dst = cli_flag_value(argc, argv, i)) ? 1 : -1;
}

int cmd_generate(int argc, char **argv) {
    Config cfg;
    GenerateArgs a = {.gp = {.max_tokens = 64, .sampling = sampling_params_default()}};
    a.gp.sampling.temperature = 1.0f;
    int rc = cli_parse_command("generate", help, argc, argv, &cfg, generate_flag, &a);
    if (rc < 0 && a.prompt && a.prompt_file) {
        fprintf(stderr, "pagellm generate: give --prompt or --prompt-file, not both\n");
        rc = 2;
    }
    if (rc >= 0) {
        cfg_free(&cfg);
        return rc;
    }
    GenerateParams gp = a.gp;
    const char *prompt = a.prompt, *prompt_file = a.prompt_file;
    rc = 1;
    gp.sampling.seed = cfg.engine.seed;
    int count = 1;
    Prompt *prompts = prompt_file ? read_prompt_file(prompt_file, &count) : NULL;
    if (prompt_file && !prompts) {
        rc = 2;
        goto done;
    }
    Engine *e = cli_engine_create(&cfg.engine);
    if (e) {
        rc = prompt_file ? run_batch(e, prompts, count, &gp)
                         : run_single(e, prompt ? prompt : "", &gp);
        print_counters(e);
    }
    eng_destroy(e);
    if (prompt_file) {
        for (int i = 0; i < count; i++)
            free(prompts[i].text);
        free(prompts);
    }
done:
    cfg_free(&cfg);
    return rc;
}
