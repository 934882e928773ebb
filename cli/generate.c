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
    "  --seed S                     random seed of the sampler (default 0)\n"
    "  --ignore-eos                 keep generating past end-of-sequence tokens\n";

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
    } else if (!strcmp(f, "--seed")) {
        if (!cli_parse_u64(f, v, &s->seed))
            return -1;
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
static int print_piece(void *ctx, int32_t token, const char *text) {
    (void)ctx;
    (void)token;
    fputs(text, stdout);
    fflush(stdout);
    return 0;
}

/* Batch sink: append pieces to a growing string. */
typedef struct {
    char *buf;
    size_t len, cap;
} TextBuf;

static int collect_piece(void *ctx, int32_t token, const char *text) {
    (void)token;
    TextBuf *b = ctx;
    size_t n = strlen(text);
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->buf = pl_xrealloc(b->buf, b->cap);
    }
    memcpy(b->buf + b->len, text, n + 1);
    b->len += n;
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

/* Tokenize and run one prompt; returns 0 on success. */
static int run_one(Engine *e, const char *text, const GenerateParams *gp, EngTokenFn sink,
                   void *ctx) {
    int32_t *ids;
    int n;
    if (!eng_tokenizer(e)) {
        fprintf(stderr, "pagellm: the model folder has no tokenizer.json: generate needs one\n");
        return 1;
    }
    if (tok_encode(eng_tokenizer(e), text, strlen(text), 1, &ids, &n) != PL_OK) {
        fprintf(stderr, "pagellm: %s\n", pl_error());
        return 1;
    }
    GenerateResult res;
    Status st = eng_generate(e, ids, n, gp, sink, ctx, &res);
    free(ids);
    if (st != PL_OK) {
        fprintf(stderr, "pagellm: %s\n", pl_error());
        return 1;
    }
    if (sink == print_piece) {
        putchar('\n');
        fflush(stdout);
    }
    print_stats(e, &res);
    return 0;
}

int cmd_generate(int argc, char **argv) {
    EngineConfig cfg = eng_config_default();
    cfg.model_dir = cli_default_model_dir();
    GenerateParams gp = {.max_tokens = 64, .sampling = sampling_params_default()};
    gp.sampling.temperature = 1.0f;
    const char *prompt = NULL, *prompt_file = NULL;
    for (int i = 1; i < argc; i++) {
        int r = cli_engine_flag(argc, argv, &i, &cfg);
        if (r == 0)
            r = sampling_flag(argc, argv, &i, &gp);
        if (r < 0)
            return 2;
        if (r > 0)
            continue;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("%s%s", help, cli_engine_flags_help);
            return 0;
        } else if (!strcmp(argv[i], "--prompt")) {
            if (!(prompt = cli_flag_value(argc, argv, &i)))
                return 2;
        } else if (!strcmp(argv[i], "--prompt-file")) {
            if (!(prompt_file = cli_flag_value(argc, argv, &i)))
                return 2;
        } else {
            fprintf(stderr, "pagellm generate: unknown flag '%s' (see --help)\n", argv[i]);
            return 2;
        }
    }
    if (prompt && prompt_file) {
        fprintf(stderr, "pagellm generate: give --prompt or --prompt-file, not both\n");
        return 2;
    }
    int count = 1;
    Prompt single = {.text = (char *)(prompt ? prompt : ""), .max_tokens = 0};
    Prompt *prompts = prompt_file ? read_prompt_file(prompt_file, &count) : &single;
    if (!prompts)
        return 2;
    Engine *e = cli_engine_create(&cfg);
    int rc = e ? 0 : 1;
    for (int i = 0; e && i < count && rc == 0; i++) {
        GenerateParams p = gp;
        if (prompts[i].max_tokens)
            p.max_tokens = prompts[i].max_tokens;
        if (!prompt_file) {
            rc = run_one(e, prompts[i].text, &p, print_piece, NULL);
        } else {
            TextBuf out = {.buf = pl_xstrdup(""), .len = 0, .cap = 1};
            rc = run_one(e, prompts[i].text, &p, collect_piece, &out);
            if (rc == 0)
                print_escaped_line(out.buf);
            free(out.buf);
        }
    }
    eng_destroy(e);
    if (prompt_file) {
        for (int i = 0; i < count; i++)
            free(prompts[i].text);
        free(prompts);
    }
    return rc;
}
