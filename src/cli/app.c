/* Options and timing shared by the pipeline commands (see app.h). */
#include "cli/app.h"
#include "cli/cli.h"
#include "cli/measure.h"
#include "edgeserve/error.h"
#include "edgeserve/memory.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_app_arg(cli_app_opts *o, const char *cmd, int argc, char **argv, int *i) {
  const char *a = argv[*i];
  if (!strcmp(a, "--json"))
    return 1; /* the only output format */
  int got = cli_precision_arg(cmd, argc, argv, i, &o->precision);
  if (got)
    return got;
  if (!strcmp(a, "--repeat") && *i + 1 < argc) {
    const char *v = argv[++*i];
    if (cli_parse_count(v, 1, 100000, &o->repeat) < 0) {
      fprintf(stderr, "edgeserve %s: --repeat wants 1..100000, got '%s'\n", cmd, v);
      return 2;
    }
    return 1;
  }
  if (a[0] == '-' && a[1])
    return 0;
  if (o->image) {
    fprintf(stderr, "edgeserve %s: one image at a time ('%s' and '%s')\n", cmd, o->image, a);
    return 2;
  }
  o->image = a;
  return 1;
}

const char *cli_model_dir(void) {
  const char *dir = getenv("ES_MODEL_DIR");
  return dir && *dir ? dir : ".cache/models";
}

int cli_app_time(const char *cmd, long n, int (*once)(void *ctx), void *ctx, double *median_ms,
                 double *first_ms) {
  double *times = es_mem_calloc(ES_MEM_CLI, (size_t)n, sizeof *times);
  if (!times) {
    fprintf(stderr, "edgeserve %s: out of memory\n", cmd);
    return ES_ENOMEM;
  }
  for (long r = 0; r < n; r++) {
    double t0 = cli_now_ms();
    int err = once(ctx);
    times[r] = cli_now_ms() - t0;
    if (err < 0) {
      fprintf(stderr, "edgeserve %s: %s\n", cmd, es_last_error_detail());
      es_mem_free(times);
      return err;
    }
  }
  *first_ms = times[0];
  cli_sort(times, (size_t)n);
  *median_ms = cli_median(times, (size_t)n);
  es_mem_free(times);
  return 0;
}
