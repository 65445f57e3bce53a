/* What a model needs that the engine cannot run, listed at once: several
 * unsupported operators with their counts and nodes, element types, other
 * domains, operators inside subgraphs (walked though the engine runs none),
 * refusals of the kernels at plan time, and a bounded error detail. Also
 * what is not listed because the engine removes it first: Identity and
 * inference Dropout (rewired at load, no node in the plan) and constant
 * subgraphs, which fold even when they feed an operator the engine lacks.
 * And the opsets the loader claims (7 to 21 of the default domain).
 *
 * Unknown operators here are names no ONNX version defines (Wobble, Squish,
 * Twist), so kernels added later do not change what the tests expect. */
#include "es_test.h"

#include <string.h>

#include "common/op.h"
#include "edgeserve/engine.h"
#include "engine/engine_internal.h"
#include "model/graph.h"
#include "support/onnx_builder.h"

#define TIMES "\xc3\x97" /* the multiplication sign the lists use */

/* ---- collecting es_model_check's items ------------------------------------ */

typedef struct seen_item {
  char what[200];
  int count, nodes, n_where;
  char where[ES_ISSUE_WHERE][160];
} seen_item;

typedef struct seen {
  seen_item items[32];
  int n;
} seen;

static void collect(void *user, const es_model_issue *it) {
  seen *s = user;
  assert_true(s->n < 32);
  seen_item *x = &s->items[s->n++];
  snprintf(x->what, sizeof x->what, "%s", it->what);
  x->count = it->count;
  x->nodes = it->nodes;
  x->n_where = it->n_where;
  for (int w = 0; w < it->n_where && w < ES_ISSUE_WHERE; w++)
    snprintf(x->where[w], sizeof x->where[w], "%s", it->where[w]);
}

static const seen_item *find(const seen *s, const char *what) {
  for (int i = 0; i < s->n; i++)
    if (!strcmp(s->items[i].what, what))
      return &s->items[i];
  return NULL;
}

/* Checks b; returns es_model_check_buffer's code, items in s. */
static int check(const ob *b, seen *s, es_model_check_info *info) {
  size_t size;
  uint8_t *buf = ob_pack(b, &size);
  memset(s, 0, sizeof *s);
  int rc = es_model_check_buffer(buf, size, NULL, 0, collect, s, info);
  free(buf);
  return rc;
}

static int load(const ob *b, es_model **m) {
  size_t size;
  uint8_t *buf = ob_pack(b, &size);
  *m = NULL;
  int rc = es_model_load_buffer(buf, size, NULL, m);
  free(buf);
  return rc;
}

static void expect_item(const seen *s, const char *what, int count, const char *where0) {
  const seen_item *it = find(s, what);
  if (!it)
    fail_msg("no item '%s' among %d", what, s->n);
  assert_int_equal(it->count, count);
  if (where0)
    assert_string_equal(it->where[0], where0);
}

static const int64_t d14[2] = {1, 4};

/* ---- tests ------------------------------------------------------------------ */

/* Three operators the engine lacks (one of them twice), an element type and
 * a foreign domain: one load names them all, with counts and nodes. */
static void test_three_unsupported_ops_at_once(void **state) {
  (void)state;
  size_t before = es_mem_total();
  ob b;
  ob_init(&b, 13);
  ob_input(&b, "x", 2, d14);
  ob_input(&b, "h", 2, d14);
  b.in_tt[1].elem_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16;
  ob_node_named(&b, "Wobble", "w0", "a", 1, "x");
  ob_node_named(&b, "Wobble", "w1", "b", 1, "a");
  ob_node_named(&b, "Squish", "s0", "c", 1, "b");
  ob_node_named(&b, "Relu", "r0", "d", 1, "c");
  ob_node_named(&b, "Twist", "t0", "e", 2, "d", "h");
  ob_node_named(&b, "Twist", "t1", "f", 1, "e");
  int n = ob_node_named(&b, "Relu", "ms", "y", 1, "f");
  b.nodes[n].domain = "com.example";
  ob_output(&b, "y");

  es_model *m;
  ES_EXPECT_RC(load(&b, &m), ES_ENOTSUP);
  const char *d = es_last_error_detail();
  printf("# %s\n", d);
  assert_non_null(strstr(d, "5 kinds, 7 places"));
  assert_non_null(strstr(d, "Wobble " TIMES "2 (nodes 'w0', 'w1')"));
  assert_non_null(strstr(d, "Squish (node 's0')"));
  assert_non_null(strstr(d, "Twist " TIMES "2 (nodes 't0', 't1')"));
  assert_non_null(strstr(d, "element type float16 (input 'h')"));
  assert_non_null(strstr(d, "Relu (domain 'com.example') (node 'ms')"));

  seen s;
  es_model_check_info info;
  ES_EXPECT_RC(check(&b, &s, &info), ES_ENOTSUP);
  assert_int_equal(s.n, 5);
  assert_int_equal(info.issues, 5);
  assert_int_equal(info.places, 7);
  assert_int_equal(info.opset, 13);
  expect_item(&s, "Wobble", 2, "'w0'");
  assert_string_equal(find(&s, "Wobble")->where[1], "'w1'");
  assert_true(find(&s, "Wobble")->nodes);
  expect_item(&s, "Squish", 1, "'s0'");
  expect_item(&s, "Twist", 2, "'t0'");
  expect_item(&s, "element type float16", 1, "input 'h'");
  assert_false(find(&s, "element type float16")->nodes);
  expect_item(&s, "Relu (domain 'com.example')", 1, "'ms'");
  /* an input the engine cannot hold leaves its readers unplanned, and the
   * planner never sees the nodes the loader marked */
  assert_int_equal(info.planned, 1);
  assert_int_equal(es_mem_total(), before);
}

/* A single place keeps the one-line message it always had. */
static void test_one_place_keeps_its_message(void **state) {
  (void)state;
  ob b;
  ob_init(&b, 13);
  ob_input(&b, "x", 2, d14);
  ob_node_named(&b, "Wobble", "w0", "y", 1, "x");
  ob_output(&b, "y");
  es_model *m;
  ES_EXPECT_RC(load(&b, &m), ES_ENOTSUP);
  assert_string_equal(es_last_error_detail(),
                      "node 'w0' (#0 Wobble): operator 'Wobble' is not supported");
}

/* Twenty kinds: the detail names the first ones and how many more, within
 * one error detail; the check gives all twenty. */
static void test_detail_is_bounded(void **state) {
  (void)state;
  static char names[20][16], outs[20][16];
  ob b;
  ob_init(&b, 13);
  ob_input(&b, "x", 2, d14);
  for (int i = 0; i < 20; i++) {
    snprintf(names[i], sizeof names[i], "Frob%02d", i);
    snprintf(outs[i], sizeof outs[i], "v%d", i);
    ob_node_named(&b, names[i], outs[i], outs[i], 1, i ? outs[i - 1] : "x");
  }
  ob_output(&b, "v19");
  es_model *m;
  ES_EXPECT_RC(load(&b, &m), ES_ENOTSUP);
  const char *d = es_last_error_detail();
  printf("# %s\n", d);
  assert_true(strlen(d) < 511);
  assert_non_null(strstr(d, "20 kinds, 20 places"));
  assert_non_null(strstr(d, "Frob00 (node 'v0')"));
  assert_non_null(strstr(d, " more"));
  assert_null(strstr(d, "Frob19"));
  seen s;
  ES_EXPECT_RC(check(&b, &s, NULL), ES_ENOTSUP);
  assert_int_equal(s.n, 20);
  expect_item(&s, "Frob19", 1, "'v19'");
}

/* A Loop body is read as a graph of its own: an operator the engine lacks
 * inside it, and inside an If within it (one without its else-branch,
 * which stays an If), is listed with where it is; a dead node's subgraph
 * is not, nor is an Identity (removed at load). */
static void test_subgraph_ops_found(void **state) {
  (void)state;
  size_t before = es_mem_total();
  /* deepest: If 'if1'.then_branch = { Squish 'deep' } */
  Onnx__GraphProto then_g;
  onnx__graph_proto__init(&then_g);
  Onnx__NodeProto deep;
  onnx__node_proto__init(&deep);
  char *deep_in[] = {"z"}, *deep_out[] = {"q"};
  deep.op_type = "Squish";
  deep.name = "deep";
  deep.n_input = 1, deep.input = deep_in;
  deep.n_output = 1, deep.output = deep_out;
  Onnx__NodeProto *then_nodes[] = {&deep};
  then_g.n_node = 1, then_g.node = then_nodes;
  /* body = { Wobble 'inner', Relu 'fine', If 'if1', Identity 'copy' } */
  Onnx__GraphProto body;
  onnx__graph_proto__init(&body);
  Onnx__NodeProto inner, fine, if1, copy;
  onnx__node_proto__init(&copy);
  onnx__node_proto__init(&inner);
  onnx__node_proto__init(&fine);
  onnx__node_proto__init(&if1);
  char *x_in[] = {"x"}, *z_out[] = {"z"}, *r_out[] = {"r"}, *i_out[] = {"i"}, *c_out[] = {"c"};
  copy.op_type = "Identity", copy.name = "copy";
  copy.n_input = 1, copy.input = i_out, copy.n_output = 1, copy.output = c_out;
  inner.op_type = "Wobble", inner.name = "inner";
  inner.n_input = 1, inner.input = x_in, inner.n_output = 1, inner.output = z_out;
  fine.op_type = "Relu", fine.name = "fine";
  fine.n_input = 1, fine.input = z_out, fine.n_output = 1, fine.output = r_out;
  if1.op_type = "If", if1.name = "if1";
  if1.n_input = 1, if1.input = r_out, if1.n_output = 1, if1.output = i_out;
  Onnx__AttributeProto then_attr, *if_attrs[] = {&then_attr};
  onnx__attribute_proto__init(&then_attr);
  then_attr.name = "then_branch";
  then_attr.has_type = 1;
  then_attr.type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH;
  then_attr.g = &then_g;
  if1.n_attribute = 1, if1.attribute = if_attrs;
  Onnx__NodeProto *body_nodes[] = {&inner, &fine, &if1, &copy};
  body.n_node = 4, body.node = body_nodes;
  /* the body's inputs (iteration, condition) and outputs (condition, a
   * scan output): the condition passes through */
  Onnx__ValueInfoProto iter_vi, cond_vi, c_vi;
  onnx__value_info_proto__init(&iter_vi);
  onnx__value_info_proto__init(&cond_vi);
  onnx__value_info_proto__init(&c_vi);
  iter_vi.name = "iter", cond_vi.name = "cond", c_vi.name = "c";
  Onnx__ValueInfoProto *body_in[] = {&iter_vi, &cond_vi}, *body_out[] = {&cond_vi, &c_vi};
  body.n_input = 2, body.input = body_in;
  body.n_output = 2, body.output = body_out;
  /* a dead Scan whose body holds Twist */
  Onnx__GraphProto dead_body;
  onnx__graph_proto__init(&dead_body);
  Onnx__NodeProto twist;
  onnx__node_proto__init(&twist);
  twist.op_type = "Twist", twist.name = "twist";
  twist.n_input = 1, twist.input = x_in, twist.n_output = 1, twist.output = z_out;
  Onnx__NodeProto *dead_nodes[] = {&twist};
  dead_body.n_node = 1, dead_body.node = dead_nodes;

  ob b;
  ob_init(&b, 13);
  ob_input(&b, "x", 2, d14);
  int loop = ob_node_named(&b, "Loop", "loop0", "y", 2, "", "");
  ob_attr_graph(&b, loop, "body", &body);
  int scan = ob_node_named(&b, "Scan", "dead", "unused", 1, "x");
  ob_attr_graph(&b, scan, "body", &dead_body);
  ob_output(&b, "y");

  seen s;
  es_model_check_info info;
  ES_EXPECT_RC(check(&b, &s, &info), ES_ENOTSUP);
  for (int i = 0; i < s.n; i++)
    printf("# %s x%d: %s\n", s.items[i].what, s.items[i].count, s.items[i].where[0]);
  assert_int_equal(s.n, 3);
  expect_item(&s, "Wobble", 1, "'inner' in 'loop0'.body");
  expect_item(&s, "If with a subgraph (control flow)", 1, "'if1' in 'loop0'.body");
  expect_item(&s, "Squish", 1, "'deep' in 'if1'.then_branch in 'loop0'.body");
  assert_null(find(&s, "Loop"));
  assert_null(find(&s, "Twist"));
  assert_null(find(&s, "Scan"));
  assert_null(find(&s, "Relu"));
  assert_null(find(&s, "Identity")); /* removed wherever the engine runs a graph */
  es_model *m;
  ES_EXPECT_RC(load(&b, &m), ES_ENOTSUP);
  assert_non_null(strstr(es_last_error_detail(), "Wobble (node 'inner' in 'loop0'.body)"));
  assert_int_equal(es_mem_total(), before);
}

/* Identity and inference Dropout go at load: the plan runs Relu alone, and
 * the graph output keeps its name (Relu writes it). */
static void test_identity_dropout_removed(void **state) {
  (void)state;
  size_t before = es_mem_total();
  static const float half = 0.5f;
  static const int32_t no = 0;
  ob b;
  ob_init(&b, 13);
  ob_input(&b, "x", 2, d14);
  ob_init_f32(&b, "ratio", 0, NULL, &half);
  Onnx__TensorProto *tm = ob_init_i64(&b, "train", 0, NULL, NULL);
  tm->data_type = ONNX__TENSOR_PROTO__DATA_TYPE__BOOL;
  tm->n_int64_data = 0;
  tm->n_int32_data = 1;
  tm->int32_data = (int32_t *)&no;
  ob_node_named(&b, "Identity", "id0", "a", 1, "x");
  ob_node_named(&b, "Relu", "r0", "b", 1, "a");
  ob_node_named(&b, "Dropout", "d0", "c", 1, "b");
  int d1 = ob_node_named(&b, "Dropout", "d1", "d", 3, "c", "ratio", "train");
  ob_node_out(&b, d1, "mask"); /* read by nothing */
  ob_node_named(&b, "Identity", "id1", "y", 1, "d");
  ob_output(&b, "y");
  es_model *m = ob_load(&b);
  es_model_stats st;
  ES_CHECK_RC(es_model_stats_get(m, &st));
  assert_int_equal(st.nodes, 1);
  assert_int_equal(st.elided, 4);
  es_tensor_info out;
  ES_CHECK_RC(es_model_output_info(m, 0, &out));
  assert_string_equal(out.name, "y");
  es_tensor_info shape = {.name = "x", .dtype = ES_DTYPE_FLOAT, .rank = 2, .dims = {1, 4}};
  es_plan *p;
  ES_CHECK_RC(es_model_plan(m, &shape, 1, &p));
  assert_int_equal(es_plan_node_count(p), 1);
  es_plan_release(p);
  const float x[4] = {-1, 2, -3, 4};
  es_tensor in = ob_tensor_f32("x", 2, d14, x);
  float *y;
  size_t count;
  ob_run(m, 1, &in, 1, &y, &count);
  assert_int_equal(count, 4);
  assert_true(y[0] == 0 && y[1] == 2 && y[2] == 0 && y[3] == 4);
  free(y);
  es_model_release(m);

  /* Opset 7 form (no training_mode input), its mask unused: removed too. */
  ob_init(&b, 7);
  ob_input(&b, "x", 2, d14);
  ob_node_named(&b, "Relu", "r0", "a", 1, "x");
  int d = ob_node_named(&b, "Dropout", "d0", "y", 1, "a");
  ob_node_out(&b, d, "mask");
  ob_attr_float(&b, d, "ratio", 0.25f);
  ob_output(&b, "y");
  m = ob_load(&b);
  ES_CHECK_RC(es_model_stats_get(m, &st));
  assert_int_equal(st.nodes, 1);
  assert_int_equal(st.elided, 1);
  es_model_release(m);
  assert_int_equal(es_mem_total(), before);
}

/* A Dropout whose mask is read, or in training mode, stays: listed with the
 * reason while the operator table has no Dropout, left to its kernel once
 * it has one. */
static void test_dropout_that_stays(void **state) {
  (void)state;
  int known = es__op_from_name("Dropout") != ES_OP_UNKNOWN;
  static const int32_t yes = 1;
  ob b;
  ob_init(&b, 13);
  ob_input(&b, "x", 2, d14);
  int d = ob_node_named(&b, "Dropout", "d0", "y", 1, "x");
  ob_node_out(&b, d, "mask");
  ob_output(&b, "y");
  ob_output(&b, "mask");
  seen s;
  int rc = check(&b, &s, NULL);
  if (!known) {
    ES_EXPECT_RC(rc, ES_ENOTSUP);
    expect_item(&s, "Dropout with its mask output used", 1, "'d0'");
  } else {
    assert_null(find(&s, "Dropout with its mask output used"));
  }

  ob_init(&b, 13);
  ob_input(&b, "x", 2, d14);
  Onnx__TensorProto *tm = ob_init_i64(&b, "train", 0, NULL, NULL);
  tm->data_type = ONNX__TENSOR_PROTO__DATA_TYPE__BOOL;
  tm->n_int64_data = 0;
  tm->n_int32_data = 1;
  tm->int32_data = (int32_t *)&yes;
  ob_node_named(&b, "Dropout", "d1", "y", 3, "x", "", "train");
  ob_output(&b, "y");
  rc = check(&b, &s, NULL);
  ES_EXPECT_RC(rc, ES_ENOTSUP); /* training: never an identity */
  if (!known)
    expect_item(&s, "Dropout with training_mode=1 (training only)", 1, "'d1'");
}

/* Constants fold before the check: a chain of Transpose and Add on an
 * initializer, and the Shape and Size of an input whose shape the model
 * fixes, fold
 * although they feed an operator without a kernel; only that operator is
 * listed. An unknown operator on constants cannot fold and is listed. */
static void test_constant_chain_folds_before_check(void **state) {
  (void)state;
  size_t before = es_mem_total();
  static const int64_t d22[2] = {2, 2};
  static const float w[4] = {1, 2, 3, 4};
  ob b;
  ob_init(&b, 13);
  ob_input(&b, "x", 2, d22);
  ob_init_f32(&b, "w", 2, d22, w);
  ob_node_named(&b, "Transpose", "t0", "t", 1, "w");
  ob_node_named(&b, "Add", "c0", "c", 2, "t", "w");
  ob_node_named(&b, "Shape", "sh", "s", 1, "x");
  ob_node_named(&b, "Size", "sz", "n", 1, "x");
  ob_node_named(&b, "Wobble", "wb", "y", 4, "x", "c", "s", "n");
  ob_node_named(&b, "Squish", "sq", "z", 1, "w");
  ob_output(&b, "y");
  ob_output(&b, "z");
  size_t size;
  uint8_t *buf = ob_pack(&b, &size);

  es_graph g;
  memset(&g, 0, sizeof g);
  ES_CHECK_RC(es__onnx_load_keep(buf, size, &g));
  ES_CHECK_RC(es__graph_fold(&g));
  assert_int_equal(g.folded_nodes, 4); /* Transpose, Add, Shape, Size */
  assert_int_equal(g.n_nodes, 2);      /* Wobble, Squish */
  es_issues l = {0};
  ES_CHECK_RC(es__graph_check(&g, &l));
  assert_int_equal(l.n, 2);
  for (int i = 0; i < 2; i++)
    assert_true(!strcmp(l.items[i].what, "Wobble") || !strcmp(l.items[i].what, "Squish"));
  for (int i = 0; i < g.n_nodes; i++)
    if (!strcmp(g.nodes[i].name, "wb"))
      for (int k = 1; k < 4; k++)
        assert_int_equal(g.values[g.nodes[i].in[k]].kind, ES_VALUE_CONST);
  es__issues_fini(&l);
  es__graph_fini(&g);

  seen s;
  es_model_check_info info;
  memset(&s, 0, sizeof s);
  ES_EXPECT_RC(es_model_check_buffer(buf, size, NULL, 0, collect, &s, &info), ES_ENOTSUP);
  assert_int_equal(s.n, 2);
  assert_null(find(&s, "Transpose"));
  assert_null(find(&s, "Shape"));
  assert_null(find(&s, "Size"));
  free(buf);
  assert_int_equal(es_mem_total(), before);
}

/* The kernels judge attributes when a plan is made: every node they refuse
 * is listed (the same refusal once, with a count), the nodes after one are
 * counted as not reached, and es_model_plan's detail has the list. */
static void test_plan_lists_every_refusal(void **state) {
  (void)state;
  size_t before = es_mem_total();
  static const int64_t xd[4] = {1, 2, 2, 2}, pd[1] = {2};
  static const float one[2] = {1, 1}, zero[2] = {0, 0};
  ob b;
  ob_init(&b, 13);
  ob_input(&b, "x", 4, xd);
  ob_init_f32(&b, "s", 1, pd, one);
  ob_init_f32(&b, "z", 1, pd, zero);
  int n0 = ob_node_named(&b, "BatchNormalization", "bn0", "a", 5, "x", "s", "z", "z", "s");
  ob_attr_int(&b, n0, "training_mode", 1);
  int n1 = ob_node_named(&b, "BatchNormalization", "bn1", "b", 5, "x", "s", "z", "z", "s");
  ob_attr_int(&b, n1, "training_mode", 1);
  int n2 = ob_node_named(&b, "BatchNormalization", "bn2", "c", 5, "x", "s", "z", "z", "s");
  ob_attr_int(&b, n2, "spatial", 0);
  ob_node_named(&b, "Relu", "r0", "d", 1, "a");
  ob_output(&b, "d");
  ob_output(&b, "b");
  ob_output(&b, "c");
  es_model *m = ob_load(&b); /* the loader has nothing against them */
  es_tensor_info shape = {.name = "x", .dtype = ES_DTYPE_FLOAT, .rank = 4, .dims = {1, 2, 2, 2}};
  es_plan *p;
  ES_EXPECT_RC(es_model_plan(m, &shape, 1, &p), ES_ENOTSUP);
  const char *d = es_last_error_detail();
  printf("# %s\n", d);
  assert_non_null(strstr(d, "BatchNormalization: training_mode 1 not implemented (inference only) " TIMES
                            "2 (nodes 'bn0', 'bn1')"));
  assert_non_null(strstr(d, "spatial = 0"));
  es_model_release(m);

  seen s;
  es_model_check_info info;
  ES_EXPECT_RC(check(&b, &s, &info), ES_ENOTSUP);
  assert_int_equal(info.planned, 1);
  assert_int_equal(info.issues, 2);
  assert_int_equal(info.places, 3);
  assert_int_equal(info.unreached, 1); /* Relu after bn0 */
  expect_item(&s, "BatchNormalization: training_mode 1 not implemented (inference only)", 2,
              "'bn0'");

  /* With an open dimension nothing is planned unless a shape is given. */
  ob_init(&b, 13);
  static const int64_t open[4] = {-1, 2, 2, 2};
  ob_input(&b, "x", 4, open);
  ob_init_f32(&b, "s", 1, pd, one);
  ob_init_f32(&b, "z", 1, pd, zero);
  n0 = ob_node_named(&b, "BatchNormalization", "bn0", "y", 5, "x", "s", "z", "z", "s");
  ob_attr_int(&b, n0, "training_mode", 1);
  ob_output(&b, "y");
  ES_CHECK_RC(check(&b, &s, &info));
  assert_int_equal(info.planned, 0);
  size_t size;
  uint8_t *buf = ob_pack(&b, &size);
  memset(&s, 0, sizeof s);
  ES_EXPECT_RC(es_model_check_buffer(buf, size, &shape, 1, collect, &s, &info), ES_ENOTSUP);
  assert_int_equal(info.planned, 1);
  assert_int_equal(s.n, 1);
  es_tensor_info bad = {.name = "nope", .rank = 1, .dims = {1}};
  ES_EXPECT_RC(es_model_check_buffer(buf, size, &bad, 1, collect, &s, &info), ES_EINVAL);
  free(buf);
  assert_int_equal(es_mem_total(), before);
}

/* Opsets 7 to 21 of the default domain, named "" or "ai.onnx"; older and
 * newer ones are refused by number; other domains' imports are fine until
 * a node uses them. */
static void test_opsets(void **state) {
  (void)state;
  ob b;
  es_model *m;
  for (int64_t v = 7; v <= 21; v += 14) {
    ob_init(&b, v);
    ob_input(&b, "x", 2, d14);
    ob_node_named(&b, "Relu", "r0", "y", 1, "x");
    ob_output(&b, "y");
    m = ob_load(&b);
    es_model_stats st;
    ES_CHECK_RC(es_model_stats_get(m, &st));
    assert_int_equal(st.opset, v);
    es_model_release(m);
  }
  b.opset.domain = "ai.onnx";
  m = ob_load(&b);
  es_model_release(m);

  b.opset.version = 6;
  ES_EXPECT_RC(load(&b, &m), ES_ENOTSUP);
  assert_non_null(strstr(es_last_error_detail(), "opset 6 is older than the supported 7"));
  b.opset.version = 22;
  ES_EXPECT_RC(load(&b, &m), ES_ENOTSUP);
  assert_non_null(strstr(es_last_error_detail(), "opset 22 is newer than the supported 21"));
  b.model.has_ir_version = 1;
  b.model.ir_version = 2; /* before opset imports: opset 1 */
  b.model.n_opset_import = 0;
  ES_EXPECT_RC(load(&b, &m), ES_ENOTSUP);
  assert_non_null(strstr(es_last_error_detail(), "opset 1 is older than the supported 7"));

  /* another domain imported beside the default one, unused: loads */
  Onnx__OperatorSetIdProto ml, dup;
  onnx__operator_set_id_proto__init(&ml);
  ml.domain = "ai.onnx.ml", ml.has_version = 1, ml.version = 3;
  Onnx__OperatorSetIdProto *two[2] = {&b.opset, &ml};
  ob_init(&b, 13);
  ob_input(&b, "x", 2, d14);
  ob_node_named(&b, "Relu", "r0", "y", 1, "x");
  ob_output(&b, "y");
  b.model.n_opset_import = 2;
  b.model.opset_import = two;
  m = ob_load(&b);
  es_model_release(m);
  /* the default domain twice with two versions: a broken model */
  onnx__operator_set_id_proto__init(&dup);
  dup.domain = "ai.onnx", dup.has_version = 1, dup.version = 11;
  two[1] = &dup;
  ES_EXPECT_RC(load(&b, &m), ES_EMODEL);
  assert_non_null(strstr(es_last_error_detail(), "opsets 13 and 11"));
  /* a node of the training domain: listed, named by its domain */
  two[1] = &ml;
  b.nodes[0].domain = "ai.onnx.preview.training";
  ES_EXPECT_RC(load(&b, &m), ES_ENOTSUP);
  assert_non_null(strstr(es_last_error_detail(), "domain 'ai.onnx.preview.training'"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_three_unsupported_ops_at_once),
      cmocka_unit_test(test_one_place_keeps_its_message),
      cmocka_unit_test(test_detail_is_bounded),
      cmocka_unit_test(test_subgraph_ops_found),
      cmocka_unit_test(test_identity_dropout_removed),
      cmocka_unit_test(test_dropout_that_stays),
      cmocka_unit_test(test_constant_chain_folds_before_check),
      cmocka_unit_test(test_plan_lists_every_refusal),
      cmocka_unit_test(test_opsets),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
