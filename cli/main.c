/* main.c - the pagellm command: dispatches to a subcommand. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

#define PAGELLM_VERSION "0.1.0"

static const char usage[] =
    "usage: pagellm <command> [flags]\n"
    "\n"
    "An LLM inference server for Llama-family models (Llama 2/3, Mistral, Qwen2, Qwen3,\n"
    "Mixtral, Qwen3-MoE).\n"
    "\n"
    "commands:\n"
    "  serve      run the OpenAI-compatible HTTP server\n"
    "  generate   complete a prompt (or a file of prompts) and print the text\n"
    "  logits     write the logits of every position of a prompt to a file (verification)\n"
    "  bench      benchmark a server (serve) or the engine in-process (throughput, latency)\n"
    "\n"
    "  pagellm <command> --help   flags of one command\n"
    "  pagellm --version          print the version\n";

int main(int argc, char **argv) {
    if (argc < 2) {
        fputs(usage, stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        fputs(usage, stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version")) {
        printf("pagellm %s\n", PAGELLM_VERSION);
        return 0;
    }
    if (!strcmp(cmd, "generate"))
        return cli_mpi_end(cmd_generate(argc - 1, argv + 1));
    if (!strcmp(cmd, "serve"))
        return cli_mpi_end(cmd_serve(argc - 1, argv + 1));
    if (!strcmp(cmd, "logits"))
        return cli_mpi_end(cmd_logits(argc - 1, argv + 1));
    if (!strcmp(cmd, "bench"))
        return cli_mpi_end(cmd_bench(argc - 1, argv + 1));
    fprintf(stderr, "pagellm: unknown command '%s'\n\n%s", cmd, usage);
    return 2;
}
