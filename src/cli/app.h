/* What the pipeline commands (face, ocr) share: one image argument,
 * --repeat N and --json, the model folder, and the timing of N runs (the
 * median and the first). One place, so that both parse and time alike. */
#ifndef ES_CLI_APP_H
#define ES_CLI_APP_H

typedef struct cli_app_opts {
  const char *image; /* the positional argument */
  long repeat;       /* --repeat N, 1 by default */
  int precision;     /* --precision (es_precision) of every model the command loads */
} cli_app_opts;

/* Consumes argv[*i] (and its value) if it is an option every pipeline
 * command takes (--json, --repeat N, --precision P) or the image. Returns 1 when consumed,
 * 0 when not ours (another option: the caller's, or unknown), 2 on a usage
 * error (printed). */
int cli_app_arg(cli_app_opts *o, const char *cmd, int argc, char **argv, int *i);

/* $ES_MODEL_DIR, or .cache/models when unset or empty. */
const char *cli_model_dir(void);

/* Runs once(ctx) n times, timing each call. 0 with the median and the
 * first time in ms; else once's negative code (after printing its detail)
 * or ES_ENOMEM. */
int cli_app_time(const char *cmd, long n, int (*once)(void *ctx), void *ctx, double *median_ms,
                 double *first_ms);

#endif
