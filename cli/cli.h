/* cli.h - (internal to cli/) the subcommands of the pagellm binary and their shared
 * flag handling. Each subcommand returns the process exit code: 0 success, 1 failure,
 * 2 bad usage. */
#ifndef PAGELLM_CLI_H
#define PAGELLM_CLI_H

#include <stdint.h>

#include "config.h"
#include "engine.h"

int cmd_generate(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_bench(int argc, char **argv);

/* The bundled model folder: <dir of the executable>/../models/stories260K, else the same
 * path relative to the working directory. Static storage. */
const char *cli_default_model_dir(void);

/* Parse a flag's value; on failure print "pagellm: --flag: ..." and return 0. */
int cli_parse_int(const char *flag, const char *s, long lo, long hi, long *out);
int cli_parse_float(const char *flag, const char *s, double lo, double hi, double *out);

/* The value after a flag: argv[*i + 1], advancing *i; prints an error and returns NULL when
 * it is missing. */
const char *cli_flag_value(int argc, char **argv, int *i);

/* Start a command's configuration: defaults, then the --config file if one is named.
 * Returns 0 (message printed) when the file cannot be loaded. */
int cli_config_begin(Config *cfg, int argc, char **argv);

/* Finish it after the flags: default model folder, cross-key validation. Returns 0 with
 * the message printed on failure. */
int cli_config_end(Config *cfg);

/* A subcommand's own flags: 1 consumed (advancing *i past a value), 0 not its flag, -1 a bad
 * or missing value (message printed). */
typedef int (*CliFlagFn)(void *ctx, int argc, char **argv, int *i);

/* A subcommand's whole command line: --config FILE first, then every config --key flag and
 * the command's own flags (through `own`), --help (prints `help` and the config keys), and
 * finally cli_config_end. Returns -1 when the command should go on, else the exit code to
 * return (0 after --help, 2 for bad usage, 1 for a bad config). cfg must be freed either
 * way. */
int cli_parse_command(const char *command, const char *help, int argc, char **argv, Config *cfg,
                      CliFlagFn own, void *ctx);

/* Report an argument that is neither a config key nor the command's own flag (exit 2). */
int cli_unknown_flag(const char *command, const char *arg);

/* Create the engine, printing "pagellm: <error>" on failure. Calls cli_mpi_begin first. */
Engine *cli_engine_create(const EngineConfig *cfg);

/* Under mpirun with several processes (one tensor-parallel rank each): start MPI; ranks > 0
 * follow rank 0's engine (eng_follow) and exit here with its code. Returns on rank 0 and
 * without mpirun; exits 1 with the reason when MPI cannot be used (a build without MPI, a
 * process count other than tensor-parallel-size). */
void cli_mpi_begin(const EngineConfig *cfg);

/* At the end of main: under MPI, rank 0 ends the followers (if no engine did) and every
 * rank finalizes MPI. Returns rc. */
int cli_mpi_end(int rc);

#endif
