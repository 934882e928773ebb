/* serve.c - `pagellm serve`: the OpenAI-compatible HTTP server on the configured model. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "server.h"

static const char help[] =
    "usage: pagellm serve [--config FILE] [--model DIR] [--host H] [--port P] [--key VALUE ...]\n"
    "\n"
    "Serves POST /v1/completions, POST /v1/chat/completions, GET /v1/models, /health,\n"
    "/version and /metrics (Prometheus). SIGINT or SIGTERM drains in-flight requests\n"
    "(up to request-timeout seconds) and exits 0; a second signal exits at once.\n"
    "\n"
    "Configuration (a --config YAML file, then these flags; keys as vLLM's):\n";

int cmd_serve(int argc, char **argv) {
    Config cfg;
    if (!cli_config_begin(&cfg, argc, argv)) {
        cfg_free(&cfg);
        return 1;
    }
    int rc = 2;
    for (int i = 1; i < argc; i++) {
        int r = cfg_parse_flag(&cfg, argc, argv, &i);
        if (r < 0)
            goto done;
        if (r > 0)
            continue;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(help, stdout);
            cfg_print_help(stdout);
            rc = 0;
            goto done;
        }
        rc = cli_unknown_flag("serve", argv[i]);
        goto done;
    }
    rc = 1;
    if (!cli_config_end(&cfg))
        goto done;
    Server *s;
    if (srv_start(&cfg, &s) != PL_OK) {
        fprintf(stderr, "pagellm: %s\n", pl_error());
        goto done;
    }
    srv_wait_and_drain(s, cfg.request_timeout > 0 ? cfg.request_timeout : 30);
    srv_destroy(s);
    fprintf(stderr, "pagellm: stopped\n");
    rc = 0;
done:
    cfg_free(&cfg);
    return rc;
}
