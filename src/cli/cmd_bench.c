/* edgeserve bench: latency of one model in-process, for comparison with
 * ONNX Runtime (scripts/bench_vs_ort.sh runs both, interleaved).
 *
 * One plan, one arena of exactly the planned size, warm-up runs, then timed
 * runs on the same inputs. Reports median and p99 latency, GFLOP/s of the
 * compute-heavy nodes, peak RSS and the planned arena bytes. */
#include "cli/cli.h"
#include "cli/inputs.h"
#include "edgeserve/engine.h"
#include "edgeserve/memory.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void bench_usage(FILE *f) {
  fprintf(f,
          "usage: edgeserve bench MODEL.onnx [--input NAME=FILE.npy]... [FILE.npy]...\n"
          "                      [--shape NAME=DxDxD]... [--threads N] [--iters N]\n"
          "                      [--warmup N] [--json] [--profile]\n\n"
          "Times one model in-process: median and p99 latency over N runs (default 50,\n"
          "after 5 warm-up runs), GFLOP/s of Conv/ConvTranspose/MatMul, peak RSS and\n"
          "the planned arena bytes. --threads sets the intra-op threads of a request\n"
          "(default 1). Inputs as for 'edgeserve run'; --shape gives random data.\n"
          "--profile also times every node and prints the time per operator type.\n");
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

static void print_profile(void *user, const char *op, int nodes, double ms) {
  (void)user;
  printf("  %-20s %4d nodes %9.3f ms\n", op, nodes, ms);
}

static int parse_count(const char *s, long lo, long hi, long *out) {
  char *end;
  long v = strtol(s, &end, 10);
  if (end == s || *end || v < lo || v > hi)
    return -1;
  *out = v;
  return 0;
}

int es_cmd_bench(int argc, char **argv) {
  const char *model_path = NULL;
  es_cli_inputs ci;
  memset(&ci, 0, sizeof ci);
  long threads = 1, iters = 50, warmup = 5;
  int json = 0, profile = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int r;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      bench_usage(stdout);
      return 0;
    } else if ((r = es_cli_inputs_arg(&ci, "bench", argc, argv, &i)) != 0) {
      if (r == 2)
        return 2;
    } else if (!strcmp(a, "--json")) {
      json = 1;
    } else if (!strcmp(a, "--profile")) {
      profile = 1;
    } else if ((!strcmp(a, "--threads") || !strcmp(a, "--iters") || !strcmp(a, "--warmup")) &&
               i + 1 < argc) {
      long *dst = !strcmp(a, "--threads") ? &threads : !strcmp(a, "--iters") ? &iters : &warmup;
      long lo = dst == &warmup ? 0 : 1, hi = dst == &threads ? 1024 : 1000000;
      if (parse_count(argv[++i], lo, hi, dst) < 0) {
        fprintf(stderr, "edgeserve bench: %s wants %ld..%ld, got '%s'\n", a, lo, hi, argv[i]);
        return 2;
      }
    } else if (es_cli_inputs_positional(&ci, "bench", a, &model_path) != 0) {
      bench_usage(stderr);
      return 2;
    }
  }
  if (!model_path) {
    bench_usage(stderr);
    return 2;
  }

  es_engine_threads_set((int)threads);
  es_model *m = NULL;
  es_plan *plan = NULL;
  es_arena *arena = NULL;
  es_tensor in[ES_CLI_MAX_INPUTS], out[64];
  es_tensor_info shapes[ES_CLI_MAX_INPUTS];
  memset(in, 0, sizeof in);
  double *lat = NULL;
  int status = 1;
  double t_load = now_ms();
  if (es_model_load(model_path, NULL, &m) < 0) {
    fprintf(stderr, "edgeserve bench: %s\n", es_last_error_detail());
    return 1;
  }
  t_load = now_ms() - t_load;
  int nin = es_model_input_count(m);
  if ((status = es_cli_inputs_load(m, &ci, "bench", in, shapes)) != 0)
    goto out;
  status = 1;
  double t_plan = now_ms();
  if (es_model_plan(m, shapes, nin, &plan) < 0 ||
      es_arena_create(es_plan_arena_bytes(plan) ? es_plan_arena_bytes(plan) : 64, 64, &arena) <
          0) {
    fprintf(stderr, "edgeserve bench: %s\n", es_last_error_detail());
    goto out;
  }
  t_plan = now_ms() - t_plan;
  int nout = es_plan_output_count(plan);
  if (nout > 64)
    nout = 64;
  lat = es_mem_calloc(ES_MEM_CLI, (size_t)iters, sizeof *lat);
  if (!lat)
    goto out;
  double first = 0;
  for (long r = -warmup; r < iters; r++) {
    if (r == 0 && profile)
      es_engine_profile_set(1);
    es_arena_reset(arena);
    double t0 = now_ms();
    if (es_plan_run(plan, in, nin, arena, out, nout) < 0) {
      fprintf(stderr, "edgeserve bench: %s\n", es_last_error_detail());
      goto out;
    }
    double dt = now_ms() - t0;
    if (r == -warmup)
      first = dt;
    if (r >= 0)
      lat[r] = dt;
  }
  qsort(lat, (size_t)iters, sizeof *lat, cmp_double);
  double med = lat[iters / 2];
  double p99 = lat[(size_t)ceil(0.99 * (double)iters) - 1];
  double gflop = (double)es_plan_flops(plan) / 1e9;
  size_t peak = 0;
  es_sys_peak_rss(&peak);
  es_model_stats ms;
  es_model_stats_get(m, &ms);
  if (json) {
    printf("{\"model\": \"%s\", \"threads\": %ld, \"iters\": %ld, \"median_ms\": %.4f, "
           "\"p99_ms\": %.4f, \"first_ms\": %.4f, \"load_ms\": %.3f, \"plan_ms\": %.3f, "
           "\"gflop\": %.4f, \"gflops\": %.2f, \"peak_rss_bytes\": %zu, "
           "\"arena_bytes\": %zu, \"weight_bytes\": %zu}\n",
           model_path, threads, iters, med, p99, first, t_load, t_plan, gflop,
           med > 0 ? gflop / (med / 1e3) : 0.0, peak, es_plan_arena_bytes(plan), ms.weight_bytes);
  } else {
    printf("model: %s (%ld thread%s, %ld runs after %ld warm-up)\n", model_path, threads,
           threads > 1 ? "s" : "", iters, warmup);
    printf("latency ms: median %.3f  p99 %.3f  first run %.3f\n", med, p99, first);
    printf("load ms: %.1f  plan ms: %.1f\n", t_load, t_plan);
    printf("compute: %.3f GFLOP per run, %.1f GFLOP/s\n", gflop,
           med > 0 ? gflop / (med / 1e3) : 0.0);
    printf("memory: planned arena %zu B, weights %zu B, peak RSS %zu B\n",
           es_plan_arena_bytes(plan), ms.weight_bytes, peak);
  }
  if (profile && !json) {
    printf("profile (ms per run, by operator; timing adds a little to each node):\n");
    es_plan_profile(plan, print_profile, NULL);
  }
  status = 0;
out:
  es_mem_free(lat);
  es_cli_inputs_free(in, ES_CLI_MAX_INPUTS);
  es_arena_destroy(arena);
  es_plan_release(plan);
  es_model_release(m);
  return status;
}
