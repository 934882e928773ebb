/* logits.c - `pagellm logits`: the logits of every position of a prompt, written as raw
 * little-endian float32 [tokens, vocab] for comparison against a reference implementation
 * (tools/compare_logits.py runs it against Hugging Face transformers). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char help[] =
    "usage: pagellm logits (--token-ids ID,ID,... | --prompt TEXT) --output FILE [flags]\n"
    "\n"
    "Runs one forward pass over the prompt and writes the logits of every position as\n"
    "raw little-endian float32, shape [tokens, vocab], to FILE.\n"
    "\n"
    "  --token-ids LIST             comma-separated token ids (no BOS is added)\n"
    "  --prompt TEXT                text, tokenized with the model's tokenizer (BOS added)\n"
    "  --output FILE                where to write the logits\n"
    "\n"
    "Configuration (a --config YAML file, then these flags):\n";

static int parse_ids(const char *s, int32_t **ids, int *n) {
    int cap = 16, len = 0;
    int32_t *v = pl_xmalloc((size_t)cap * sizeof *v);
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX || (*end && *end != ',')) {
            fprintf(stderr, "pagellm: --token-ids: '%s' is not a list of token ids\n", s);
            free(v);
            return 0;
        }
        if (len == cap)
            v = pl_xrealloc(v, (size_t)(cap *= 2) * sizeof *v);
        v[len++] = (int32_t)x;
        p = *end ? end + 1 : end;
    }
    *ids = v;
    *n = len;
    return 1;
}

/* Load the engine, run the forward pass, write the file. */
static int logits_run(const Config *cfg, const char *ids_arg, const char *prompt,
                      const char *output) {
    int32_t *ids = NULL;
    int n = 0;
    if (ids_arg && !parse_ids(ids_arg, &ids, &n))
        return 2;
    Engine *e = cli_engine_create(&cfg->engine);
    if (!e) {
        free(ids);
        return 1;
    }
    int rc = 1;
    float *logits = NULL;
    if (prompt && !eng_tokenizer(e)) {
        fprintf(stderr, "pagellm: %s has no tokenizer.json: use --token-ids\n",
                cfg->engine.model_dir);
        goto done;
    }
    if (prompt && tok_encode(eng_tokenizer(e), prompt, strlen(prompt), 1, &ids, &n) != PL_OK) {
        fprintf(stderr, "pagellm: %s\n", pl_error());
        goto done;
    }
    int vocab = eng_model_config(e)->vocab_size;
    logits = pl_xmalloc((size_t)n * vocab * sizeof(float));
    if (eng_prompt_logits(e, ids, n, logits) != PL_OK) {
        fprintf(stderr, "pagellm: %s\n", pl_error());
        goto done;
    }
    FILE *f = fopen(output, "wb");
    if (!f || fwrite(logits, sizeof(float), (size_t)n * vocab, f) != (size_t)n * vocab) {
        fprintf(stderr, "pagellm: %s: %s\n", output, strerror(errno));
        if (f)
            fclose(f);
        goto done;
    }
    if (fclose(f) != 0) {
        fprintf(stderr, "pagellm: %s: %s\n", output, strerror(errno));
        goto done;
    }
    fprintf(stderr, "wrote %d x %d logits to %s\n", n, vocab, output);
    rc = 0;
done:
    free(logits);
    free(ids);
    eng_destroy(e);
    return rc;
}

typedef struct {
    const char *ids, *prompt, *output;
} LogitsArgs;

static int logits_flag(void *ctx, int argc, char **argv, int *i) {
    LogitsArgs *a = ctx;
    const char **dst = !strcmp(argv[*i], "--token-ids") ? &a->ids
                       : !strcmp(argv[*i], "--prompt")  ? &a->prompt
                       : !strcmp(argv[*i], "--output")  ? &a->output
                                                        : NULL;
    if (!dst)
        return 0;
    return (*dst = cli_flag_value(argc, argv, i)) ? 1 : -1;
}

int cmd_logits(int argc, char **argv) {
    Config cfg;
    LogitsArgs a = {0};
    int rc = cli_parse_command("logits", help, argc, argv, &cfg, logits_flag, &a);
    if (rc < 0 && (!a.output || !!a.ids == !!a.prompt)) {
        fprintf(stderr, "pagellm logits: give --output and one of --token-ids, --prompt\n");
        rc = 2;
    }
    if (rc < 0)
        rc = logits_run(&cfg, a.ids, a.prompt, a.output);
    cfg_free(&cfg);
    return rc;
}
