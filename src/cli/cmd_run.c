/* edgeserve run: one model, inputs from .npy files, outputs to .npy files.
 *
 * The request path in miniature: load, plan for the inputs' shapes, take an
 * arena of exactly the planned size, run (optionally several times, resetting
 * the arena between runs as a request would), write the outputs. */
#include "cli/cli.h"
#include "cli/npy.h"
#include "edgeserve/engine.h"
#include "edgeserve/memory.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define MAX_INPUTS 32

static void run_usage(FILE *f) {
  fprintf(f, "usage: edgeserve run MODEL.onnx [--input NAME=FILE.npy]... [FILE.npy]...\n"
             "                    [--output-dir DIR] [--repeat N]\n\n"
             "Runs the model on inputs read from NumPy .npy files (by name, or positionally\n"
             "in the model's input order), writes every output to DIR/NAME.npy (NAME with\n"
             "characters outside [A-Za-z0-9._-] replaced by '_'), and prints each output's\n"
             "shape, the planned arena bytes and the median latency over N runs.\n");
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
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

static void sanitize(const char *in, char *out, size_t size) {
  size_t i = 0;
  for (; in[i] && i + 1 < size; i++) {
    char c = in[i];
    int ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
             c == '.' || c == '_' || c == '-';
    out[i] = ok ? c : '_';
  }
  out[i] = '\0';
}

int es_cmd_run(int argc, char **argv) {
  const char *model_path = NULL, *out_dir = NULL;
  const char *named[MAX_INPUTS], *named_file[MAX_INPUTS], *positional[MAX_INPUTS];
  int n_named = 0, n_pos = 0;
  long repeat = 1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      run_usage(stdout);
      return 0;
    } else if (!strcmp(a, "--input") && i + 1 < argc) {
      const char *eq = strchr(argv[++i], '=');
      if (!eq || eq == argv[i] || n_named == MAX_INPUTS) {
        fprintf(stderr, "edgeserve run: --input wants NAME=FILE.npy, got '%s'\n", argv[i]);
        return 2;
      }
      named[n_named] = argv[i];
      named_file[n_named++] = eq + 1;
    } else if (!strcmp(a, "--output-dir") && i + 1 < argc) {
      out_dir = argv[++i];
    } else if (!strcmp(a, "--repeat") && i + 1 < argc) {
      char *end;
      repeat = strtol(argv[++i], &end, 10);
      if (*end || repeat < 1 || repeat > 1000000) {
        fprintf(stderr, "edgeserve run: --repeat wants 1..1000000, got '%s'\n", argv[i]);
        return 2;
      }
    } else if (a[0] == '-') {
      fprintf(stderr, "edgeserve run: unknown or incomplete option '%s'\n", a);
      run_usage(stderr);
      return 2;
    } else if (!model_path) {
      model_path = a;
    } else if (n_pos < MAX_INPUTS) {
      positional[n_pos++] = a;
    } else {
      fprintf(stderr, "edgeserve run: too many inputs\n");
      return 2;
    }
  }
  if (!model_path) {
    run_usage(stderr);
    return 2;
  }

  es_model *m = NULL;
  es_plan *plan = NULL;
  es_arena *arena = NULL;
  es_tensor in[MAX_INPUTS];
  es_tensor_info shapes[MAX_INPUTS];
  memset(in, 0, sizeof in);
  double *lat = NULL;
  int status = 1, rc;
  if ((rc = es_model_load(model_path, NULL, &m)) < 0) {
    fprintf(stderr, "edgeserve run: %s\n", es_last_error_detail());
    return 1;
  }
  int nin = es_model_input_count(m);
  if (nin > MAX_INPUTS) {
    fprintf(stderr, "edgeserve run: the model has more than %d inputs\n", MAX_INPUTS);
    goto out;
  }
  if (n_pos > nin) {
    fprintf(stderr, "edgeserve run: %d inputs given, the model has %d\n", n_pos, nin);
    status = 2;
    goto out;
  }
  for (int i = 0; i < nin; i++) {
    es_tensor_info info;
    es_model_input_info(m, i, &info);
    const char *file = i < n_pos ? positional[i] : NULL;
    for (int k = 0; k < n_named; k++) {
      size_t len = (size_t)(named_file[k] - 1 - named[k]);
      if (strlen(info.name) == len && !strncmp(named[k], info.name, len))
        file = named_file[k];
    }
    if (!file) {
      fprintf(stderr, "edgeserve run: no file for input '%s' (--input %s=FILE.npy)\n", info.name,
              info.name);
      status = 2;
      goto out;
    }
    if ((rc = es_npy_read(file, &in[i])) < 0) {
      fprintf(stderr, "edgeserve run: %s\n", es_last_error_detail());
      goto out;
    }
    shapes[i].name = info.name;
    shapes[i].dtype = in[i].dtype;
    shapes[i].rank = in[i].rank;
    memcpy(shapes[i].dims, in[i].dims, sizeof shapes[i].dims);
  }
  for (int k = 0; k < n_named; k++) {
    int found = 0;
    for (int i = 0; i < nin; i++) {
      es_tensor_info info;
      es_model_input_info(m, i, &info);
      size_t len = (size_t)(named_file[k] - 1 - named[k]);
      found |= strlen(info.name) == len && !strncmp(named[k], info.name, len);
    }
    if (!found) {
      fprintf(stderr, "edgeserve run: the model has no input named '%.*s'\n",
              (int)(named_file[k] - 1 - named[k]), named[k]);
      status = 2;
      goto out;
    }
  }
  if ((rc = es_model_plan(m, shapes, nin, &plan)) < 0) {
    fprintf(stderr, "edgeserve run: %s\n", es_last_error_detail());
    goto out;
  }
  size_t arena_bytes = es_plan_arena_bytes(plan);
  if ((rc = es_arena_create(arena_bytes ? arena_bytes : 64, 64, &arena)) < 0) {
    fprintf(stderr, "edgeserve run: %s\n", es_last_error_detail());
    goto out;
  }
  int nout = es_plan_output_count(plan);
  es_tensor *outs = es_mem_calloc(ES_MEM_CLI, (size_t)nout + 1, sizeof *outs);
  lat = es_mem_calloc(ES_MEM_CLI, (size_t)repeat, sizeof *lat);
  if (!outs || !lat) {
    es_mem_free(outs);
    fprintf(stderr, "edgeserve run: out of memory\n");
    goto out;
  }
  for (long r = 0; r < repeat; r++) {
    es_arena_reset(arena);
    double t0 = now_ms();
    rc = es_plan_run(plan, in, nin, arena, outs, nout);
    lat[r] = now_ms() - t0;
    if (rc < 0) {
      fprintf(stderr, "edgeserve run: %s\n", es_last_error_detail());
      es_mem_free(outs);
      goto out;
    }
  }
  qsort(lat, (size_t)repeat, sizeof *lat, cmp_double);
  if (out_dir && make_dirs(out_dir) < 0) {
    fprintf(stderr, "edgeserve run: cannot create the output folder '%s'\n", out_dir);
    es_mem_free(outs);
    goto out;
  }
  for (int o = 0; o < nout; o++) {
    printf("output %-24s %-8s [", outs[o].name, es_dtype_name(outs[o].dtype));
    for (int d = 0; d < outs[o].rank; d++)
      printf(d ? ",%lld" : "%lld", (long long)outs[o].dims[d]);
    printf("]\n");
    if (out_dir) {
      char name[256], path[1024];
      sanitize(outs[o].name, name, sizeof name);
      snprintf(path, sizeof path, "%s/%s.npy", out_dir, name);
      if (es_npy_write(path, &outs[o]) < 0) {
        fprintf(stderr, "edgeserve run: %s\n", es_last_error_detail());
        es_mem_free(outs);
        goto out;
      }
    }
  }
  printf("planned arena bytes: %zu\n", arena_bytes);
  printf("arena peak bytes: %zu\n", es_arena_peak(arena));
  printf("latency ms: median %.3f over %ld run%s\n", lat[repeat / 2], repeat,
         repeat > 1 ? "s" : "");
  es_mem_free(outs);
  status = 0;
out:
  es_mem_free(lat);
  for (int i = 0; i < MAX_INPUTS; i++)
    es_mem_free(in[i].data);
  es_arena_destroy(arena);
  es_plan_release(plan);
  es_model_release(m);
  return status;
}
