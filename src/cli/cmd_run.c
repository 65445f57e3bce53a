/* edgeserve run: one model, inputs from .npy files, outputs to .npy files.
 *
 * The request path in miniature: load, plan for the inputs' shapes, take an
 * arena of exactly the planned size, run (optionally several times, resetting
 * the arena between runs as a request would), write the outputs. */
#include "cli/cli.h"
#include "cli/measure.h"
#include "cli/inputs.h"
#include "cli/npy.h"
#include "edgeserve/engine.h"
#include "edgeserve/memory.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static void run_usage(FILE *f) {
  fprintf(f, "usage: edgeserve run MODEL.onnx [--input NAME=FILE.npy]... [FILE.npy]...\n"
             "                    [--shape NAME=DxDxD]... [--output-dir DIR] [--repeat N]\n"
             "                    [--bounds] [--precision auto|fp32|bf16|int8]\n\n"
             "Runs the model on inputs read from NumPy .npy files (by name, or positionally\n"
             "in the model's input order; --shape gives an input random values of that\n"
             "shape instead), writes every output to DIR/NAME.npy (NAME with\n"
             "characters outside [A-Za-z0-9._-] replaced by '_'), and prints each output's\n"
             "shape, the planned arena bytes and the median latency over N runs. With\n"
             "--bounds, also each value whose shape depends on the data: its planned bound\n"
             "and the most the runs used of it (the runs are profiled to see it).\n"
             "--precision: what convolutions and matrix products compute in (auto: as the\n"
             "file says; bf16 needs avx512_bf16; int8 needs a quantized model).\n");
}

/* mkdir -p */
static int make_dirs(const char *dir) {
  char buf[1024];
  size_t n = strlen(dir);
  if (n == 0 || n >= sizeof buf)
    return -1;
  memcpy(buf, dir, n + 1);
  for (size_t i = 1; i <= n; i++)
    if (buf[i] == '/' || buf[i] == '\0') {
      char c = buf[i];
      buf[i] = '\0';
      if (mkdir(buf, 0777) < 0 && errno != EEXIST)
        return -1;
      buf[i] = c;
    }
  return 0;
}

/* The options. -1 to go on, else the exit status (0 after --help). */
static int parse_args(int argc, char **argv, cli_inputs *ci, const char **model_path,
                      const char **out_dir, long *repeat, int *bounds) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int r;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      run_usage(stdout);
      return 0;
    } else if ((r = cli_inputs_arg(ci, "run", argc, argv, &i)) != 0) {
      if (r == 2)
        return 2;
    } else if (!strcmp(a, "--bounds")) {
      *bounds = 1;
    } else if (!strcmp(a, "--output-dir") && i + 1 < argc) {
      *out_dir = argv[++i];
    } else if (!strcmp(a, "--repeat") && i + 1 < argc) {
      if (cli_parse_count(argv[++i], 1, 1000000, repeat) < 0) {
        fprintf(stderr, "edgeserve run: --repeat wants 1..1000000, got '%s'\n", argv[i]);
        return 2;
      }
    } else if (cli_inputs_positional(ci, "run", a, model_path) != 0) {
      run_usage(stderr);
      return 2;
    }
  }
  if (!*model_path) {
    run_usage(stderr);
    return 2;
  }
  return -1;
}

/* Prints each output's shape and writes it to out_dir/NAME.npy (when
 * out_dir). 0, or -1 (printed). */
static int write_outputs(const es_tensor *outs, int nout, const char *out_dir) {
  if (out_dir && make_dirs(out_dir) < 0) {
    fprintf(stderr, "edgeserve run: cannot create the output folder '%s'\n", out_dir);
    return -1;
  }
  for (int o = 0; o < nout; o++) {
    printf("output %-24s %-8s [", outs[o].name, es_dtype_name(outs[o].dtype));
    for (int d = 0; d < outs[o].rank; d++)
      printf(d ? ",%lld" : "%lld", (long long)outs[o].dims[d]);
    printf("]\n");
    if (out_dir) {
      char name[256], path[1024];
      cli_npy_file_name(outs[o].name, name, sizeof name);
      snprintf(path, sizeof path, "%s/%s.npy", out_dir, name);
      if (cli_npy_write(path, &outs[o]) < 0) {
        fprintf(stderr, "edgeserve run: %s\n", es_last_error_detail());
        return -1;
      }
    }
  }
  return 0;
}

/* Each value an operator bounds: its bound and the most the runs used;
 * then the totals over every bounded value. */
static void print_bounds_used(const es_plan *p) {
  int n = es_plan_bound_count(p);
  if (n == 0) {
    printf("data-dependent shapes: none\n");
    return;
  }
  size_t bound = 0, seen = 0;
  printf("data-dependent shapes: %d values planned at a bound; used at most:\n", n);
  for (int i = 0; i < n; i++) {
    es_bound_info b;
    if (es_plan_bound_info(p, i, &b) < 0)
      continue;
    bound += b.bound_bytes;
    seen += b.seen_bytes;
    if (!b.why[0])
      continue;
    printf("  %s ", b.value);
    cli_print_bound_shape(&b);
    printf(" (%s): %zu of %zu bytes (%.1f%%)\n", b.why, b.seen_bytes, b.bound_bytes,
           b.bound_bytes ? 100.0 * (double)b.seen_bytes / (double)b.bound_bytes : 0.0);
  }
  printf("  all %d: %zu of %zu bytes (%.1f%%)\n", n, seen, bound,
         bound ? 100.0 * (double)seen / (double)bound : 0.0);
}

int cli_cmd_run(int argc, char **argv) {
  const char *model_path = NULL, *out_dir = NULL;
  cli_inputs ci;
  memset(&ci, 0, sizeof ci);
  long repeat = 1;
  int bounds = 0;
  int status = parse_args(argc, argv, &ci, &model_path, &out_dir, &repeat, &bounds);
  if (status >= 0)
    return status;
  cli_session s;
  es_tensor *outs = NULL;
  double *lat = NULL;
  status = cli_session_open(&s, model_path, &ci, "run");
  if (status)
    goto out;
  status = 1;
  int nout = es_plan_output_count(s.plan);
  outs = es_mem_calloc(ES_MEM_CLI, (size_t)nout + 1, sizeof *outs);
  lat = es_mem_calloc(ES_MEM_CLI, (size_t)repeat, sizeof *lat);
  if (!outs || !lat) {
    fprintf(stderr, "edgeserve run: out of memory\n");
    goto out;
  }
  if (bounds)
    es_engine_profile_set(1);
  es_mem_heap rh = {0}; /* counts, for the peak printed */
  es_run_heap heap = es_mem_heap_make(&rh);
  for (long r = 0; r < repeat; r++) {
    es_arena_reset(s.arena);
    if (r > 0)
      es_plan_outputs_free(s.plan, &heap, outs, nout);
    double t0 = cli_now_ms();
    int rc = es_plan_run_heap(s.plan, s.in, s.nin, s.arena, &heap, outs, nout);
    lat[r] = cli_now_ms() - t0;
    if (rc < 0) {
      fprintf(stderr, "edgeserve run: %s\n", es_last_error_detail());
      goto out;
    }
  }
  cli_sort(lat, (size_t)repeat);
  if (write_outputs(outs, nout, out_dir) < 0)
    goto out;
  printf("planned arena bytes: %zu\n", es_plan_arena_bytes(s.plan));
  printf("arena peak bytes: %zu\n", es_arena_peak(s.arena));
  if (es_plan_unbounded_count(s.plan)) {
    const char *node, *why;
    es_plan_unbounded_info(s.plan, &node, &why);
    printf("nodes run without a plan: %d, from %s (%s)\n", es_plan_unbounded_count(s.plan), node,
           why);
    printf("run heap peak bytes: %zu\n", rh.peak);
  }
  es_plan_outputs_free(s.plan, &heap, outs, nout);
  printf("latency ms: median %.3f over %ld run%s\n", cli_median(lat, (size_t)repeat), repeat,
         repeat > 1 ? "s" : "");
  if (bounds)
    print_bounds_used(s.plan);
  status = 0;
out:
  es_mem_free(outs);
  es_mem_free(lat);
  cli_session_close(&s);
  return status;
}
