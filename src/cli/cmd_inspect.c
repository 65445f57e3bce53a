/* edgeserve inspect: what a model file holds, as the engine sees it. */
#include "cli/cli.h"
#include "edgeserve/engine.h"
#include "edgeserve/memory.h"

#include <stdio.h>
#include <string.h>

static void print_info(const es_tensor_info *t) {
  printf("  %-24s %-8s [", t->name, es_dtype_name(t->dtype));
  if (t->rank < 0)
    printf("?");
  for (int d = 0; d < t->rank; d++) {
    if (d)
      printf(",");
    if (t->dims[d] >= 0)
      printf("%lld", (long long)t->dims[d]);
    else
      printf("?");
  }
  printf("]\n");
}

static void print_op(void *user, const char *op, int count) {
  (void)user;
  printf("  %-20s %d\n", op, count);
}

int es_cmd_inspect(int argc, char **argv) {
  const char *path = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      printf("usage: edgeserve inspect MODEL.onnx\n\n"
             "Prints the model's inputs and outputs, its operators and their counts,\n"
             "and the bytes of its read-only weights.\n");
      return 0;
    } else if (argv[i][0] == '-') {
      fprintf(stderr, "edgeserve inspect: unknown option '%s'\n", argv[i]);
      return 2;
    } else if (!path) {
      path = argv[i];
    } else {
      fprintf(stderr, "edgeserve inspect: one model at a time\n");
      return 2;
    }
  }
  if (!path) {
    fprintf(stderr, "usage: edgeserve inspect MODEL.onnx\n");
    return 2;
  }
  es_model *m;
  int rc = es_model_load(path, NULL, &m);
  if (rc < 0) {
    fprintf(stderr, "edgeserve inspect: %s\n", es_last_error_detail());
    return 1;
  }
  es_model_stats st;
  es_model_stats_get(m, &st);
  printf("model: %s\n", path);
  printf("ir version %lld, opset %lld, %zu nodes, %zu constants\n", (long long)st.ir_version,
         (long long)st.opset, st.nodes, st.constants);
  printf("weights: %zu bytes (read-only, shared)\ncontext: %zu bytes\n", st.weight_bytes,
         st.context_bytes);
  printf("inputs:\n");
  for (int i = 0; i < es_model_input_count(m); i++) {
    es_tensor_info t;
    es_model_input_info(m, i, &t);
    print_info(&t);
  }
  printf("outputs:\n");
  for (int i = 0; i < es_model_output_count(m); i++) {
    es_tensor_info t;
    es_model_output_info(m, i, &t);
    print_info(&t);
  }
  printf("operators:\n");
  es_model_op_counts(m, print_op, NULL);
  es_model_release(m);
  return 0;
}
