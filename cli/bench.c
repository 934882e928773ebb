/* bench.c - `pagellm bench serve | throughput | latency`: parses the flags (the bench's own
 * through bench.h, the engine's config keys through cfg_parse_flag) and runs bench/. */
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "cli.h"

static const char usage[] =
    "usage: pagellm bench <serve | throughput | latency> [flags]\n"
    "\n"
    "  serve        load-test a running OpenAI-compatible server (pagellm serve, vLLM, ...)\n"
    "               over HTTP: TTFT, TPOT, ITL, E2E latency, throughput, goodput\n"
    "  throughput   offline throughput of the engine, in-process\n"
    "  latency      offline latency of one batch run to completion, in-process\n"
    "\n"
    "  pagellm bench <mode> --help   flags of one mode\n";

static int bench_serve(int argc, char **argv) {
    BenchServeOptions o;
    bench_serve_options_init(&o);
    int rc = 2;
    for (int i = 1; i < argc; i++) {
        int r = bench_serve_flag(&o, argc, argv, &i);
        if (r < 0)
            goto done;
        if (r > 0)
            continue;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            bench_serve_print_help(stdout);
            rc = 0;
        } else {
            fprintf(stderr, "pagellm bench serve: unknown flag '%s' (see --help)\n", argv[i]);
        }
        goto done;
    }
    if (!o.tokenizer)
        o.tokenizer = pl_xstrdup(cli_default_model_dir());
    rc = bench_serve_run(&o);
done:
    bench_serve_options_free(&o);
    return rc;
}

static int bench_offline(int argc, char **argv, int latency) {
    const char *name = latency ? "bench latency" : "bench throughput";
    Config cfg;
    BenchOfflineOptions o;
    bench_offline_options_init(&o, latency);
    if (!cli_config_begin(&cfg, argc, argv)) {
        cfg_free(&cfg);
        bench_offline_options_free(&o);
        return 1;
    }
    int rc = 2;
    for (int i = 1; i < argc; i++) {
        int r = cfg_parse_flag(&cfg, argc, argv, &i);
        if (r == 0)
            r = bench_offline_flag(&o, latency, argc, argv, &i);
        if (r < 0)
            goto done;
        if (r > 0)
            continue;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            bench_offline_print_help(stdout, latency);
            cfg_print_help(stdout);
            rc = 0;
        } else {
            rc = cli_unknown_flag(name, argv[i]);
        }
        goto done;
    }
    rc = 1;
    if (!cli_config_end(&cfg))
        goto done;
    Engine *e = cli_engine_create(&cfg.engine);
    if (e)
        rc = latency ? bench_latency_run(e, &o, cfg.engine.seed)
                     : bench_throughput_run(e, &o, cfg.engine.seed);
    eng_destroy(e);
done:
    cfg_free(&cfg);
    bench_offline_options_free(&o);
    return rc;
}

int cmd_bench(int argc, char **argv) {
    if (argc < 2) {
        fputs(usage, stderr);
        return 2;
    }
    const char *mode = argv[1];
    if (!strcmp(mode, "--help") || !strcmp(mode, "-h") || !strcmp(mode, "help")) {
        fputs(usage, stdout);
        return 0;
    }
    if (!strcmp(mode, "serve"))
        return bench_serve(argc - 1, argv + 1);
    if (!strcmp(mode, "throughput"))
        return bench_offline(argc - 1, argv + 1, 0);
    if (!strcmp(mode, "latency"))
        return bench_offline(argc - 1, argv + 1, 1);
    fprintf(stderr, "pagellm bench: unknown mode '%s' (serve, throughput or latency)\n", mode);
    return 2;
}
