/* serve.c - `pagellm serve`: the OpenAI-compatible HTTP server on the configured model. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "server.h"

static const char help[] =
    "usage: pagellm serve [--config FILE] [--model DIR] [--host H] [--port P] [--key VALUE ...]\n"
    "\n"
    "Serves POST /v1/completions, POST /v1/chat/completions, POST /tokenize and\n"
    "/detokenize, GET /v1/models, /health, /version and /metrics (Prometheus). Chat renders\n"
    "the model's chat template (or --chat-template). SIGINT or SIGTERM drains in-flight requests\n"
    "(up to request-timeout seconds) and exits 0; a second signal exits at once.\n"
    "\n"
    "Configuration (a --config YAML file, then these flags; keys as vLLM's):\n";

int cmd_serve(int argc, char **argv) {
    Config cfg;
    int rc = cli_parse_command("serve", help, argc, argv, &cfg, NULL, NULL);
    if (rc >= 0) {
        cfg_free(&cfg);
        return rc;
    }
    cli_mpi_begin(&cfg.engine); /* ranks > 0 of an MPI job follow here, no HTTP server */
    Server *s;
    rc = 1;
    if (srv_start(&cfg, &s) == PL_OK) {
        srv_wait_and_drain(s, cfg.request_timeout > 0 ? cfg.request_timeout : 30);
        srv_destroy(s);
        fprintf(stderr, "pagellm: stopped\n");
        rc = 0;
    } else {
        fprintf(stderr, "pagellm: %s\n", pl_error());
    }
    cfg_free(&cfg);
    return rc;
}
