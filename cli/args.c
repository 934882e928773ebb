/* args.c - flag handling shared by the subcommands: numbers with range checks, the
 * configuration (file, then --key flags, then validation) and the bundled model's location. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "kernels.h"

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
    if (pl_parse_long(s, lo, hi, out) == PL_OK)
        return 1;
    fprintf(stderr, "pagellm: %s: %s\n", flag, pl_error());
    return 0;
}

int cli_parse_float(const char *flag, const char *s, double lo, double hi, double *out) {
    if (pl_parse_double(s, lo, hi, out) == PL_OK)
        return 1;
    fprintf(stderr, "pagellm: %s: %s\n", flag, pl_error());
    return 0;
}

const char *cli_flag_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "pagellm: %s needs a value\n", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

int cli_config_begin(Config *cfg, int argc, char **argv) {
    cfg_init(cfg);
    const char *file = cfg_find_config_flag(argc, argv);
    if (file && cfg_load_file(cfg, file) != PL_OK) {
        fprintf(stderr, "pagellm: %s\n", pl_error());
        return 0;
    }
    return 1;
}

int cli_config_end(Config *cfg) {
    if (!cfg->model) { /* the bundled model, served under its own name */
        if (cfg_set(cfg, "model", cli_default_model_dir(), NULL) != PL_OK ||
            (!cfg->served_model_name &&
             cfg_set(cfg, "served-model-name", "stories260K", NULL) != PL_OK)) {
            fprintf(stderr, "pagellm: %s\n", pl_error());
            return 0;
        }
    }
    if (cfg_validate(cfg) != PL_OK) {
        fprintf(stderr, "pagellm: %s\n", pl_error());
        return 0;
    }
    return 1;
}

int cli_unknown_flag(const char *command, const char *arg) {
    const char *name = arg;
    while (*name == '-')
        name++;
    const char *close = cfg_suggest_key(name);
    if (close)
        fprintf(stderr, "pagellm %s: unknown flag '%s' (did you mean '--%s'?)\n", command, arg,
                close);
    else
        fprintf(stderr, "pagellm %s: unknown flag '%s' (see --help)\n", command, arg);
    return 2;
}

int cli_parse_command(const char *command, const char *help, int argc, char **argv, Config *cfg,
                      CliFlagFn own, void *ctx) {
    if (!cli_config_begin(cfg, argc, argv))
        return 1;
    for (int i = 1; i < argc; i++) {
        int r = cfg_parse_flag(cfg, argc, argv, &i);
        if (r == 0 && own)
            r = own(ctx, argc, argv, &i);
        if (r < 0)
            return 2;
        if (r > 0)
            continue;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(help, stdout);
            cfg_print_help(stdout);
            return 0;
        }
        return cli_unknown_flag(command, argv[i]);
    }
    return cli_config_end(cfg) ? -1 : 1;
}

/* The launcher's rank of this process before MPI is up (to print an error once). */
static int launched_rank(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        if (getenv(vars[i]))
            return atoi(getenv(vars[i]));
    return 0;
}

void cli_mpi_begin(const EngineConfig *cfg) {
    int launched = k_mpi_launched_size(), tp = cfg->tensor_parallel_size;
    if (k_mpi_active() || (launched <= 1 && tp <= 1))
        return;
    if (launched <= 1) /* in-process ranks (CUDA), or k_open says why not */
        return;
    int rank = launched_rank(), size = 0;
    if (k_mpi_init(&rank, &size) != PL_OK) {
        if (rank == 0)
            fprintf(stderr, "pagellm: %s\n", pl_error());
        exit(1);
    }
    if (size != tp) {
        if (rank == 0)
            fprintf(stderr,
                    "pagellm: mpirun started %d processes but tensor-parallel-size is %d: run "
                    "one process per rank (mpirun -np N pagellm ... --tensor-parallel-size N)\n",
                    size, tp);
        k_mpi_finalize();
        exit(1);
    }
    if (rank == 0)
        return;
    /* mpirun passes SIGINT and SIGTERM to every rank: rank 0 drains and then ends the others
     * (a follower in the middle of a job would leave rank 0 waiting for it) */
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    int rc = eng_follow(cfg);
    k_mpi_finalize();
    exit(rc);
}

int cli_mpi_end(int rc) {
    if (k_mpi_active()) {
        eng_mpi_release(rc != 0);
        k_mpi_finalize();
    }
    return rc;
}

Engine *cli_engine_create(const EngineConfig *cfg) {
    cli_mpi_begin(cfg);
    Engine *e;
    if (eng_create(cfg, &e) != PL_OK) {
        fprintf(stderr, "pagellm: %s\n", pl_error());
        return NULL;
    }
    return e;
}
