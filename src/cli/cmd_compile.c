/* edgeserve compile: ONNX in, compiled model file (.esm) out.
 *
 * Loads the model (parse, fold, fuse), plans it for the given shapes so the
 * kernels reorder their weights into the layouts oneDNN chose, and writes
 * the lot to one file that every process then maps read-only and shares. */
#include "cli/cli.h"
#include "cli/inputs.h"
#include "edgeserve/engine.h"
#include "edgeserve/memory.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void compile_usage(FILE *f) {
  fprintf(f, "usage: edgeserve compile MODEL.onnx -o MODEL.esm [--shape NAME=DxDxD]...\n"
             "                        [--precision auto|fp32|bf16|int8]\n\n"
             "Writes a compiled model file: the prepared graph, its weights and the weights\n"
             "already reordered for this CPU, 64-byte aligned. Loading it maps it read-only\n"
             "and shared, so processes serving the same model share one physical copy.\n"
             "--shape plans that input shape before writing (inputs the model leaves open\n"
             "default to 1 for the first dimension and 64 for the others). --precision bf16\n"
             "stores the convolutions' and matrix products' prepared weights in bf16.\n");
}

int cli_cmd_compile(int argc, char **argv) {
  const char *src = NULL, *dst = NULL;
  cli_inputs ci;
  memset(&ci, 0, sizeof ci);
  for (int i = 1; i < argc; i++) {
    int r;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      compile_usage(stdout);
      return 0;
    } else if ((!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output")) && i + 1 < argc) {
      dst = argv[++i];
    } else if ((r = cli_inputs_arg(&ci, "compile", argc, argv, &i)) != 0) {
      if (r == 2)
        return 2;
    } else if (argv[i][0] == '-') {
      fprintf(stderr, "edgeserve compile: unknown or incomplete option '%s'\n", argv[i]);
      return 2;
    } else if (!src) {
      src = argv[i];
    } else {
      fprintf(stderr, "edgeserve compile: one model at a time\n");
      return 2;
    }
  }
  if (!src || !dst) {
    compile_usage(stderr);
    return 2;
  }
  es_model *m;
  es_model_options mo = {.precision = (es_precision)ci.precision};
  if (es_model_load(src, &mo, &m) < 0) {
    fprintf(stderr, "edgeserve compile: %s\n", es_last_error_detail());
    return 1;
  }
  /* Shapes: given ones, else the model's, open dims defaulted. */
  int n = es_model_input_count(m);
  es_tensor_info shapes[CLI_MAX_INPUTS];
  int ok = n <= CLI_MAX_INPUTS;
  for (int i = 0; ok && i < n; i++)
    es_model_input_info(m, i, &shapes[i]);
  for (int k = 0; ok && k < ci.n_shapes; k++)
    if (cli_shape_find(&ci.shapes[k], shapes, n) < 0) {
      fprintf(stderr, "edgeserve compile: --shape: the model has no input named '%.*s'\n",
              (int)ci.shapes[k].name_len, ci.shapes[k].name);
      es_model_release(m);
      return 2;
    }
  for (int i = 0; ok && i < n; i++) {
    for (int d = 0; d < shapes[i].rank; d++)
      if (shapes[i].dims[d] < 0)
        shapes[i].dims[d] = d == 0 ? 1 : 64;
    for (int k = 0; k < ci.n_shapes; k++)
      if (cli_shape_is(&ci.shapes[k], shapes[i].name))
        cli_shape_apply(&ci.shapes[k], &shapes[i]);
  }
  es_plan *p = NULL;
  if (ok && es_model_plan(m, shapes, n, &p) < 0)
    fprintf(stderr, "edgeserve compile: note: planning the default shape failed (%s); the file "
                    "has no prepared weights\n", es_last_error_detail());
  int rc = es_model_compile(m, src, dst);
  es_plan_release(p);
  if (rc < 0) {
    fprintf(stderr, "edgeserve compile: %s\n", es_last_error_detail());
    es_model_release(m);
    return 1;
  }
  es_model_stats st;
  es_model_stats_get(m, &st);
  struct stat fs;
  stat(dst, &fs);
  printf("compiled %s -> %s: %lld bytes (weights %zu B, prepared weights %zu B, %zu nodes)\n",
         src, dst, (long long)fs.st_size, st.weight_bytes, st.prepared_bytes, st.nodes);
  es_model_release(m);
  return 0;
}
