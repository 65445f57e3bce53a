/* edgeserve inspect: what a model file holds, as the engine sees it. */
#include "cli/cli.h"
#include "cli/spec.h"
#include "edgeserve/engine.h"
#include "edgeserve/memory.h"

#include <stdio.h>
#include <stdlib.h>
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

#define MAX_SHAPES 16

/* Plans for the given shapes (inputs without one keep the model's dims) and
 * prints the arena bytes. 0 when nothing to do or done, 1 or 2 on error. */
static int plan_shapes(es_model *m, const cli_shape *specs, int n_specs) {
  int n = es_model_input_count(m);
  if (n > MAX_SHAPES) {
    fprintf(stderr, "edgeserve inspect: more than %d inputs\n", MAX_SHAPES);
    return 1;
  }
  es_tensor_info shapes[MAX_SHAPES];
  for (int i = 0; i < n; i++)
    es_model_input_info(m, i, &shapes[i]);
  for (int k = 0; k < n_specs; k++) {
    int found = cli_shape_find(&specs[k], shapes, n);
    if (found < 0) {
      fprintf(stderr, "edgeserve inspect: the model has no input named '%.*s'\n",
              (int)specs[k].name_len, specs[k].name);
      return 2;
    }
    cli_shape_apply(&specs[k], &shapes[found]);
  }
  for (int i = 0; i < n; i++) {
    if (cli_shape_open(&shapes[i])) {
      if (n_specs == 0)
        return 0; /* nothing asked, and the model's shape is not concrete */
      fprintf(stderr, "edgeserve inspect: input '%s' needs --shape %s=...\n", shapes[i].name,
              shapes[i].name);
      return 2;
    }
  }
  /* Planned through a plan cache, as a server plans: its state is printed. */
  es_plan_cache *cache;
  es_plan *p;
  if (es_plan_cache_create(m, 8, &cache) < 0 || es_plan_cache_get(cache, shapes, n, &p) < 0) {
    fprintf(stderr, "edgeserve inspect: %s\n", es_last_error_detail());
    return 1;
  }
  printf("plan:");
  for (int i = 0; i < n; i++) {
    printf(" %s=", shapes[i].name);
    for (int d = 0; d < shapes[i].rank; d++)
      printf(d ? "x%lld" : "%lld", (long long)shapes[i].dims[d]);
  }
  printf("\n  nodes run per request: %d (layout conversions among them: %d)\n",
         es_plan_node_count(p), es_plan_relayout_count(p));
  printf("  planned arena bytes: %zu\n", es_plan_arena_bytes(p));
  printf("  plan context bytes: %zu\n", es_plan_context_bytes(p));
  for (int o = 0; o < es_plan_output_count(p); o++) {
    es_tensor_info t;
    es_plan_output_info(p, o, &t);
    printf("  output %s [", t.name);
    for (int d = 0; d < t.rank; d++)
      printf(d ? ",%lld" : "%lld", (long long)t.dims[d]);
    printf("]\n");
  }
  es_plan_cache_stats cs;
  es_plan_cache_stats_get(cache, &cs);
  printf("plan cache: %zu of %zu entries, %zu B of plan memory, largest arena %zu B\n",
         cs.entries, cs.capacity, cs.context_bytes, cs.max_arena_bytes);
  es_plan_release(p);
  es_plan_cache_destroy(cache);
  return 0;
}

int cli_cmd_inspect(int argc, char **argv) {
  const char *path = NULL;
  cli_shape specs[MAX_SHAPES];
  int n_specs = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      printf("usage: edgeserve inspect MODEL.onnx [--shape NAME=1x3x640x640]...\n\n"
             "Prints the model's inputs and outputs, its operators and their counts,\n"
             "and the bytes of its read-only weights. With --shape (one per input whose\n"
             "dimensions the model leaves open), also plans the model for that shape and\n"
             "prints the exact request-arena bytes a run needs.\n");
      return 0;
    } else if (!strcmp(argv[i], "--shape") && i + 1 < argc) {
      if (n_specs == MAX_SHAPES) {
        fprintf(stderr, "edgeserve inspect: at most %d --shape options\n", MAX_SHAPES);
        return 2;
      }
      const char *v = argv[++i];
      char why[CLI_WHY_MAX];
      if (cli_shape_parse(v, strlen(v), &specs[n_specs], why) < 0) {
        fprintf(stderr, "edgeserve inspect: --shape: %s\n", why);
        return 2;
      }
      n_specs++;
    } else if (argv[i][0] == '-') {
      fprintf(stderr, "edgeserve inspect: unknown or incomplete option '%s'\n", argv[i]);
      return 2;
    } else if (!path) {
      path = argv[i];
    } else {
      fprintf(stderr, "edgeserve inspect: one model at a time\n");
      return 2;
    }
  }
  if (!path) {
    fprintf(stderr, "usage: edgeserve inspect MODEL.onnx [--shape NAME=1x3x640x640]...\n");
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
  printf("folded: %zu constant nodes, %zu BatchNormalization into Conv\n", st.folded_nodes,
         st.folded_bn);
  printf("weights: %zu bytes (read-only, shared)\ncontext: %zu bytes\n", st.weight_bytes,
         st.context_bytes);
  if (st.compiled)
    printf("compiled file: mapped read-only and shared; %d prepared weights from the file\n",
           st.compiled_prepared);
  else if (st.stale_compiled)
    printf("compiled file: stale (its source changed); loaded the source model instead\n");
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
  int status = plan_shapes(m, specs, n_specs);
  es_model_release(m);
  return status;
}
