/* args.c - flag parsing shared by the subcommands: numbers with range checks, the engine
 * flags every model-loading subcommand accepts, and the bundled model's location. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

const char cli_engine_flags_help[] =
    "  --model DIR                  Hugging Face model folder (default: the bundled\n"
    "                               models/stories260K)\n"
    "  --device auto|cpu|cuda       backend (default auto)\n"
    "  --load-format auto|dummy     dummy = random weights of the config's shape\n"
    "  --block-size N               tokens per KV-cache block: 8, 16, 32, 64, 128 (16)\n"
    "  --max-model-len N            longest prompt + completion (model's maximum)\n"
    "  --max-num-batched-tokens N   tokens per forward step, the prefill chunk (2048)\n";

const char *cli_default_model_dir(void) {
    static char path[4096];
    char exe[2048];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            snprintf(path, sizeof path, "%s/../models/stories260K", exe);
            if (access(path, R_OK) == 0)
                return path;
        }
    }
    return "models/stories260K";
}

int cli_parse_int(const char *flag, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end) {
        fprintf(stderr, "pagellm: %s: '%s' is not an integer\n", flag, s);
        return 0;
    }
    if (v < lo || v > hi) {
        fprintf(stderr, "pagellm: %s: %ld is out of range [%ld, %ld]\n", flag, v, lo, hi);
        return 0;
    }
    *out = v;
    return 1;
}

int cli_parse_float(const char *flag, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || v != v) {
        fprintf(stderr, "pagellm: %s: '%s' is not a number\n", flag, s);
        return 0;
    }
    if (v < lo || v > hi) {
        fprintf(stderr, "pagellm: %s: %g is out of range [%g, %g]\n", flag, v, lo, hi);
        return 0;
    }
    *out = v;
    return 1;
}

int cli_parse_u64(const char *flag, const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-') {
        fprintf(stderr, "pagellm: %s: '%s' is not a non-negative integer\n", flag, s);
        return 0;
    }
    *out = v;
    return 1;
}

const char *cli_flag_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "pagellm: %s needs a value\n", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

int cli_engine_flag(int argc, char **argv, int *i, EngineConfig *cfg) {
    const char *flag = argv[*i];
    long n;
    const char *v;
    if (!strcmp(flag, "--model")) {
        if (!(v = cli_flag_value(argc, argv, i)))
            return -1;
        cfg->model_dir = v;
    } else if (!strcmp(flag, "--device")) {
        if (!(v = cli_flag_value(argc, argv, i)))
            return -1;
        cfg->device = v;
    } else if (!strcmp(flag, "--load-format")) {
        if (!(v = cli_flag_value(argc, argv, i)))
            return -1;
        if (strcmp(v, "auto") && strcmp(v, "safetensors") && strcmp(v, "dummy")) {
            fprintf(stderr,
                    "pagellm: --load-format: '%s' is not one of auto, safetensors, "
                    "dummy\n",
                    v);
            return -1;
        }
        cfg->load_dummy = !strcmp(v, "dummy");
    } else if (!strcmp(flag, "--block-size")) {
        if (!(v = cli_flag_value(argc, argv, i)) || !cli_parse_int(flag, v, 1, 1 << 20, &n))
            return -1;
        cfg->block_size = (int)n;
    } else if (!strcmp(flag, "--max-model-len")) {
        if (!(v = cli_flag_value(argc, argv, i)) || !cli_parse_int(flag, v, 1, INT_MAX, &n))
            return -1;
        cfg->max_model_len = (int)n;
    } else if (!strcmp(flag, "--max-num-batched-tokens")) {
        if (!(v = cli_flag_value(argc, argv, i)) || !cli_parse_int(flag, v, 1, 1 << 24, &n))
            return -1;
        cfg->max_num_batched_tokens = (int)n;
    } else {
        return 0;
    }
    return 1;
}

Engine *cli_engine_create(const EngineConfig *cfg) {
    Engine *e;
    if (eng_create(cfg, &e) != PL_OK) {
        fprintf(stderr, "pagellm: %s\n", pl_error());
        return NULL;
    }
    return e;
}
