/* edgeserve: the command-line front end.
 *
 * A thin dispatcher: each subcommand lives in its own cmd_*.c file and gets
 * argv from its own name on. Exit status: 0 success, 1 failure, 2 usage. */
#include "cli/cli.h"
#include "edgeserve/engine.h"
#include "edgeserve/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const cli_cmd cli_commands_[] = {
    {"version", "print the version and the build's configuration", cli_cmd_version},
    {"bench-mem", "allocator benchmark: buddy pool and arena vs malloc, jemalloc, mimalloc",
     cli_cmd_bench_mem},
    {"run", "run a model on .npy inputs, write .npy outputs", cli_cmd_run},
    {"bench", "time one model in-process (latency, GFLOP/s, memory)", cli_cmd_bench},
    {"bench-lane", "several models on one lane: shared scratchpad vs private arenas, per-frame latency, switch time", cli_cmd_bench_lane},
    {"compile", "write a compiled model file (.esm): mapped read-only, shared by processes",
     cli_cmd_compile},
    {"inspect", "describe a model: inputs, outputs, operators, weight bytes", cli_cmd_inspect},
    {"serve", "serve models over KServe v2 HTTP with Prometheus metrics", cli_cmd_serve},
    {"face", "detect faces in a JPEG/PNG image, print JSON", cli_cmd_face},
    {"ocr", "read text in a JPEG/PNG image (det -> cls -> rec), print JSON", cli_cmd_ocr},
    {"plan", "capacity planner: weights, per-request bytes and safe concurrency per model",
     cli_cmd_plan},
    {"quantize", "write an int8 QDQ ONNX model, calibrated on sample inputs or images",
     cli_cmd_quantize},
};

static void usage(FILE *f) {
  fprintf(f, "usage: edgeserve <command> [options]\n\ncommands:\n");
  for (size_t i = 0; i < sizeof cli_commands_ / sizeof cli_commands_[0]; i++)
    fprintf(f, "  %-12s %s\n", cli_commands_[i].name, cli_commands_[i].summary);
  fprintf(f, "\nedgeserve <command> --help prints the command's options.\n");
}

/* The library reads no environment; the CLI maps its debugging switches. */
static void apply_environment(void) {
  const char *k = getenv("ES_KERNELS"), *f = getenv("ES_FUSE");
  if (k && !strcmp(k, "ref"))
    es_engine_reference_kernels_set(1);
  if (f && !strcmp(f, "0"))
    es_engine_fusion_set(0);
  /* Every command that loads a model (run, bench, serve, ocr, face, plan)
   * keeps prepared weights in this directory (es_engine_cache_dir_set). */
  const char *c = getenv("EDGESERVE_CACHE_DIR");
  if (c && *c && es_engine_cache_dir_set(c) < 0)
    fprintf(stderr, "edgeserve: EDGESERVE_CACHE_DIR ignored: %s\n", es_last_error_detail());
}

int main(int argc, char **argv) {
  apply_environment();
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
    usage(stdout);
    return 0;
  }
  if (!strcmp(argv[1], "--version"))
    return cli_cmd_version(argc - 1, argv + 1);
  for (size_t i = 0; i < sizeof cli_commands_ / sizeof cli_commands_[0]; i++)
    if (!strcmp(argv[1], cli_commands_[i].name))
      return cli_commands_[i].run(argc - 1, argv + 1);
  fprintf(stderr, "edgeserve: unknown command '%s'\n\n", argv[1]);
  usage(stderr);
  return 2;
}
