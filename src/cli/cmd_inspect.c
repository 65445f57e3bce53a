/* edgeserve inspect: what a model file holds, as the engine sees it.
 *
 * A model the engine cannot run (es_model_load or a plan answers
 * ES_ENOTSUP) is checked again with es_model_check, which lists every
 * operator, attribute value and element type it cannot run with counts and
 * places, subgraphs included, and the command exits 1. */
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

static void print_issue(void *user, const es_model_issue *it) {
  (void)user;
  printf("  %s", it->what);
  if (it->count > 1)
    printf(" \xc3\x97%d", it->count);
  for (int w = 0; w < it->n_where; w++)
    printf("%s%s%s", w ? ", " : ": ", w == 0 && it->nodes ? (it->count > 1 ? "nodes " : "node ") : "",
           it->where[w]);
  if (it->count > it->n_where && it->n_where)
    printf(", ... (%d more)", it->count - it->n_where);
  printf("\n");
}

/* Lists what the model at path needs that the engine cannot run (the
 * shapes given plan it too) and returns 1; header: print the model's line
 * first (the load failed, nothing was printed yet). */
static int report_unsupported(const char *path, const cli_shape *specs, int n_specs, int header) {
  es_tensor_info given[MAX_SHAPES];
  char names[MAX_SHAPES][256];
  for (int k = 0; k < n_specs; k++) {
    snprintf(names[k], sizeof names[k], "%.*s", (int)specs[k].name_len, specs[k].name);
    memset(&given[k], 0, sizeof given[k]);
    given[k].name = names[k];
    cli_shape_apply(&specs[k], &given[k]);
  }
  char detail[512];
  snprintf(detail, sizeof detail, "%s", es_last_error_detail());
  if (header)
    printf("model: %s\n", path);
  printf("cannot run:\n");
  fflush(stdout);
  es_model_check_info info;
  int rc = es_model_check(path, given, n_specs, print_issue, NULL, &info);
  if (rc == 0 || info.issues == 0) {
    /* refused as a whole (an opset...), or only when planned as asked */
    printf("  %s\n", rc < 0 ? es_last_error_detail() : detail);
    return 1;
  }
  printf("%d kind%s in %d place%s (opset %lld, ir version %lld)\n", info.issues,
         info.issues == 1 ? "" : "s", info.places, info.places == 1 ? "" : "s",
         (long long)info.opset, (long long)info.ir_version);
  if (info.unreached)
    printf("not checked: %d node%s after those that cannot run\n", info.unreached,
           info.unreached == 1 ? "" : "s");
  if (!info.planned)
    printf("attribute and type checks of the kernels need concrete input shapes: --shape "
           "NAME=DxD...\n");
  return 1;
}

/* The values the plan holds at a bound (their shapes depend on the data):
 * each one an operator bounds, with what bounds it, then how many follow
 * from those. */
static void print_bounds(const es_plan *p) {
  int n = es_plan_bound_count(p), inherited = 0;
  if (n == 0)
    return;
  printf("  data-dependent shapes: %d values planned at a bound (a run carries the actual "
         "shapes)\n", n);
  for (int i = 0; i < n; i++) {
    es_bound_info b;
    if (es_plan_bound_info(p, i, &b) < 0)
      continue;
    if (!b.why[0]) {
      inherited++;
      continue;
    }
    printf("    %s ", b.value);
    cli_print_bound_shape(&b);
    printf(" from %s, bounded by %s\n", b.node, b.why);
  }
  if (inherited) {
    printf("    %d more follow from those:", inherited);
    int shown = 0;
    for (int i = 0; i < n && shown < 12; i++) {
      es_bound_info b;
      if (es_plan_bound_info(p, i, &b) == 0 && !b.why[0])
        printf("%s %s", shown++ ? "," : "", b.value);
    }
    printf("%s\n", inherited > shown ? ", ..." : "");
  }
}

/* Plans for the given shapes (inputs without one keep the model's dims) and
 * prints the arena bytes. 0 when nothing to do or done, 1 or 2 on error, 3
 * when some node cannot run (ES_ENOTSUP). */
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
  int rc = es_plan_cache_create(m, 8, &cache);
  if (rc == 0 && (rc = es_plan_cache_get(cache, shapes, n, &p)) < 0)
    es_plan_cache_destroy(cache);
  if (rc == ES_ENOTSUP)
    return 3;
  if (rc < 0) {
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
    int unb = es_plan_output_unbounded(p, o);
    for (int d = 0; d < t.rank; d++)
      if (unb)
        printf(d ? ",?" : "?");
      else
        printf(d ? ",%lld" : "%lld", (long long)t.dims[d]);
    int bounded = 0;
    for (int i = 0; i < es_plan_bound_count(p) && !bounded; i++) {
      es_bound_info b;
      bounded = es_plan_bound_info(p, i, &b) == 0 && !strcmp(b.value, t.name);
    }
    printf("]%s\n", bounded ? " at most: its shape depends on the data"
                    : unb ? " made without a plan: its shape is known after a run"
                          : "");
  }
  print_bounds(p);
  if (es_plan_unbounded_count(p)) {
    const char *node, *why;
    es_plan_unbounded_info(p, &node, &why);
    printf("  run without a plan: %d nodes, from %s (%s); their memory comes from the run heap "
           "(the server's buddy pool, charged to the request's admission)\n",
           es_plan_unbounded_count(p), node, why);
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
  int prec = ES_PRECISION_AUTO, r;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      printf("usage: edgeserve inspect MODEL.onnx [--shape NAME=1x3x640x640]...\n"
             "                        [--precision auto|fp32|bf16|int8]\n\n"
             "Prints the model's inputs and outputs, its operators and their counts,\n"
             "and the bytes of its read-only weights. With --shape (one per input whose\n"
             "dimensions the model leaves open), also plans the model for that shape and\n"
             "prints the exact request-arena bytes a run needs.\n\n"
             "A model the engine cannot run gets the list of every operator, attribute\n"
             "value and element type it cannot run, with counts and nodes (subgraphs of\n"
             "If, Loop and Scan included), and exit status 1. Attribute values and\n"
             "types are the kernels' to judge: they are checked when every input's\n"
             "shape is concrete (the model's own or --shape).\n");
      return 0;
    } else if ((r = cli_precision_arg("inspect", argc, argv, &i, &prec)) != 0) {
      if (r == 2)
        return 2;
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
  es_model_options mo = {.precision = (es_precision)prec};
  int rc = es_model_load(path, &mo, &m);
  if (rc == ES_ENOTSUP)
    return report_unsupported(path, specs, n_specs, 1);
  if (rc < 0) {
    fprintf(stderr, "edgeserve inspect: %s\n", es_last_error_detail());
    return 1;
  }
  es_model_stats st;
  es_model_stats_get(m, &st);
  printf("model: %s\n", path);
  printf("ir version %lld, opset %lld, %zu nodes, %zu constants\n", (long long)st.ir_version,
         (long long)st.opset, st.nodes, st.constants);
  printf("folded: %zu constant nodes, %zu BatchNormalization into Conv; removed: %zu Identity and "
         "Dropout\n",
         st.folded_nodes, st.folded_bn, st.elided);
  printf("precision: %zu convolutions and matrix products in int8, %zu in bf16, %zu in float32",
         st.int8_nodes, st.bf16_nodes, st.float_nodes);
  if (st.w8_nodes)
    printf(" (%zu of them from int8 weights)", st.w8_nodes);
  printf("\n");
  printf("weights: %zu bytes (read-only, shared)", st.weight_bytes);
  if (st.weight_file_bytes)
    printf(", %zu of them read in place from the file", st.weight_file_bytes);
  printf("\ncontext: %zu bytes\n", st.context_bytes);
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
  if (status == 3)
    status = report_unsupported(path, specs, n_specs, 0);
  return status;
}
