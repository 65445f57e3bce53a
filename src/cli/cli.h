/* The CLI's subcommands: one file each, registered in main.c's table. */
#ifndef ES_CLI_H
#define ES_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct cli_cmd {
  const char *name;
  const char *summary;
  int (*run)(int argc, char **argv); /* argv[0] is the subcommand name */
} cli_cmd;

int cli_cmd_version(int argc, char **argv);
int cli_cmd_bench_mem(int argc, char **argv);
int cli_cmd_inspect(int argc, char **argv);
int cli_cmd_run(int argc, char **argv);
int cli_cmd_bench(int argc, char **argv);
int cli_cmd_bench_lane(int argc, char **argv);
int cli_cmd_compile(int argc, char **argv);
int cli_cmd_plan(int argc, char **argv);
int cli_cmd_serve(int argc, char **argv);
int cli_cmd_face(int argc, char **argv);
int cli_cmd_ocr(int argc, char **argv);
int cli_cmd_quantize(int argc, char **argv);

/* Helpers shared by the subcommands (util.c). Cross-file helpers of the
 * CLI are named cli_*; cli_cmd and cli_parse_bytes keep their old
 * names while main.c and cmd_serve.c use them. */
uint64_t cli_now_ns(void); /* CLOCK_MONOTONIC */
double cli_now_ms(void);
/* A decimal integer in [lo, hi] and nothing else; -1 otherwise. */
int cli_parse_count(const char *s, long lo, long hi, long *out);
/* "2G", "512M", "1.5G", "1048576", "64KiB" -> bytes (powers of 1024);
 * -1 when malformed. */
int cli_parse_bytes(const char *s, size_t *out);
/* A JSON string: quotes, backslashes and control characters escaped, other
 * bytes (UTF-8) as they are. */
void cli_json_string(FILE *f, const char *s);
/* A JSON number with that many decimals; null for NAN or infinity (a value
 * not measured). */
void cli_json_real(FILE *f, double v, int decimals);
/* A bounded value's shape as inspect and run print it, "[<=27000,3]": the
 * dims the data decides after "<=". */
struct es_bound_info;
void cli_print_bound_shape(const struct es_bound_info *b);
/* --precision auto|fp32|bf16|int8 at argv[*i] (es_model_options): 1 when
 * consumed (into *prec, an es_precision), 0 when not ours, 2 on a usage
 * error (printed). */
int cli_precision_arg(const char *cmd, int argc, char **argv, int *i, int *prec);

#endif
