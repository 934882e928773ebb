/* flags.c - flag helpers shared by the bench subcommands: `--name VALUE` and `--name=VALUE`,
 * numbers with range checks, and the dataset flags (vLLM's names) common to `bench serve`
 * and `bench throughput`. Every error is one line naming the flag. */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "bench_internal.h"

int bflag_value(const char *cmd, const char *name, int argc, char **argv, int *i,
                const char **value) {
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n))
        return 0;
    if (a[n] == '=') {
        *value = a + n + 1;
        return 1;
    }
    if (a[n])
        return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "pagellm bench %s: %s needs a value\n", cmd, name);
        return -1;
    }
    *value = argv[++*i];
    return 1;
}

int bflag_int(const char *cmd, const char *flag, const char *s, long lo, long hi, int *out) {
    long v;
    if (pl_parse_long(s, lo, hi, &v) != PL_OK) {
        fprintf(stderr, "pagellm bench %s: %s: %s\n", cmd, flag, pl_error());
        return 0;
    }
    *out = (int)v;
    return 1;
}

int bflag_double(const char *cmd, const char *flag, const char *s, double lo, double hi,
                 double *out) {
    if (pl_parse_double(s, lo, hi, out) == PL_OK)
        return 1;
    fprintf(stderr, "pagellm bench %s: %s: %s\n", cmd, flag, pl_error());
    return 0;
}

void bflag_set_str(char **dst, const char *s) {
    free(*dst);
    *dst = s ? pl_xstrdup(s) : NULL;
}

/* Which integer field of the dataset options a flag sets, with its range. */
typedef struct {
    const char *name;
    size_t offset;
    long lo, hi;
} IntFlag;

static const IntFlag int_flags[] = {
    {"--random-input-len", offsetof(BenchDatasetOptions, input_len), 1, 1 << 24},
    {"--input-len", offsetof(BenchDatasetOptions, input_len), 1, 1 << 24},
    {"--random-output-len", offsetof(BenchDatasetOptions, output_len), 1, 1 << 24},
    {"--output-len", offsetof(BenchDatasetOptions, output_len), 1, 1 << 24},
    {"--random-prefix-len", offsetof(BenchDatasetOptions, prefix_len), 0, 1 << 24},
    {"--sharegpt-output-len", offsetof(BenchDatasetOptions, sharegpt_output_len), 1, 1 << 24},
};

int bflag_dataset(const char *cmd, BenchDatasetOptions *d, char **path_owned, int with_seed,
                  int argc, char **argv, int *i) {
    const char *v;
    int r;
    if ((r = bflag_value(cmd, "--dataset-name", argc, argv, i, &v)) != 0) {
        if (r < 0)
            return -1;
        if (!strcmp(v, "random"))
            d->kind = BENCH_DS_RANDOM;
        else if (!strcmp(v, "sharegpt"))
            d->kind = BENCH_DS_SHAREGPT;
        else if (!strcmp(v, "jsonl") || !strcmp(v, "custom"))
            d->kind = BENCH_DS_JSONL;
        else {
            fprintf(stderr,
                    "pagellm bench %s: --dataset-name: '%s' is not one of random, sharegpt, "
                    "jsonl\n",
                    cmd, v);
            return -1;
        }
        return 1;
    }
    if ((r = bflag_value(cmd, "--dataset-path", argc, argv, i, &v)) != 0) {
        if (r < 0)
            return -1;
        bflag_set_str(path_owned, v);
        d->path = *path_owned;
        return 1;
    }
    if ((r = bflag_value(cmd, "--num-prompts", argc, argv, i, &v)) != 0) {
        if (r < 0 || !bflag_int(cmd, "--num-prompts", v, 1, 10000000, &d->num_prompts))
            return -1;
        d->num_prompts_set = 1;
        return 1;
    }
    for (size_t k = 0; k < sizeof int_flags / sizeof int_flags[0]; k++) {
        const IntFlag *f = &int_flags[k];
        if ((r = bflag_value(cmd, f->name, argc, argv, i, &v)) != 0)
            return r < 0 ||
                           !bflag_int(cmd, f->name, v, f->lo, f->hi, (int *)((char *)d + f->offset))
                       ? -1
                       : 1;
    }
    if ((r = bflag_value(cmd, "--random-range-ratio", argc, argv, i, &v)) != 0)
        return r < 0 || !bflag_double(cmd, "--random-range-ratio", v, 0, 0.999999, &d->range_ratio)
                   ? -1
                   : 1;
    if (with_seed && (r = bflag_value(cmd, "--seed", argc, argv, i, &v)) != 0) {
        if (r < 0)
            return -1;
        char *end;
        errno = 0;
        unsigned long long x = strtoull(v, &end, 10);
        if (errno || end == v || *end || v[0] == '-') {
            fprintf(stderr, "pagellm bench %s: --seed: '%s' is not a non-negative integer\n", cmd,
                    v);
            return -1;
        }
        d->seed = (uint64_t)x;
        return 1;
    }
    return 0;
}
