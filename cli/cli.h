/* cli.h - (internal to cli/) the subcommands of the pagellm binary and their shared
 * flag-parsing helpers. Each subcommand returns the process exit code. */
#ifndef PAGELLM_CLI_H
#define PAGELLM_CLI_H

#include <stdint.h>

#include "engine.h"

int cmd_generate(int argc, char **argv);
int cmd_logits(int argc, char **argv);

/* The bundled model folder: <dir of the executable>/../models/stories260K, else the same
 * path relative to the working directory. Static storage. */
const char *cli_default_model_dir(void);

/* Parse a flag's value; on failure print "pagellm: --flag: ..." and return 0. */
int cli_parse_int(const char *flag, const char *s, long lo, long hi, long *out);
int cli_parse_float(const char *flag, const char *s, double lo, double hi, double *out);
int cli_parse_u64(const char *flag, const char *s, uint64_t *out);

/* The value after a flag: argv[*i + 1], advancing *i; prints an error and returns NULL when
 * it is missing. */
const char *cli_flag_value(int argc, char **argv, int *i);

/* Engine flags shared by every subcommand that loads a model (--model, --device,
 * --block-size, --max-model-len, --max-num-batched-tokens, --load-format, --seed).
 * Returns 1 if argv[*i] was one of them (consumed), 0 if not, -1 on a bad value. */
int cli_engine_flag(int argc, char **argv, int *i, EngineConfig *cfg);

/* Help text for those engine flags. */
extern const char cli_engine_flags_help[];

/* Create the engine, printing "pagellm: <error>" on failure. */
Engine *cli_engine_create(const EngineConfig *cfg);

#endif
