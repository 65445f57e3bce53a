/* Loader tests: real models load and describe themselves; malformed,
 * truncated and hostile files fail with a precise error and never crash.
 *
 * Hostile models are built here with protobuf-c's own structs and packed, so
 * each test changes exactly one thing in an otherwise valid model. */
#include "es_test.h"

#include <string.h>

#include "edgeserve/engine.h"
#include "model/graph.h"
#include "onnx.pb-c.h"

#ifndef ES_SOURCE_DIR
#define ES_SOURCE_DIR "."
#endif

/* ---- building models ---------------------------------------------------- */

typedef struct mb {
  Onnx__ModelProto model;
  Onnx__GraphProto graph;
  Onnx__OperatorSetIdProto opset;
  Onnx__OperatorSetIdProto *opsets[1];
  Onnx__NodeProto nodes[4];
  Onnx__NodeProto *node_ptrs[4];
  char *node_in[4][3];
  char *node_out[4][2];
  Onnx__TensorProto init;
  Onnx__TensorProto *inits[1];
  int64_t init_dims[2];
  float init_data[4];
  Onnx__ValueInfoProto in_vi, out_vi;
  Onnx__ValueInfoProto *ins[1], *outs[1];
  Onnx__TypeProto in_tp, out_tp;
  Onnx__TypeProto__Tensor in_tt, out_tt;
  Onnx__TensorShapeProto in_shape;
  Onnx__TensorShapeProto__Dimension dims[2];
  Onnx__TensorShapeProto__Dimension *dim_ptrs[2];
  Onnx__AttributeProto attr;
  Onnx__AttributeProto *attrs[1];
} mb;

/* A valid model: y = Relu(x + w), x: float[2,2], w an initializer. */
static void mb_init(mb *b) {
  memset(b, 0, sizeof *b);
  onnx__model_proto__init(&b->model);
  onnx__graph_proto__init(&b->graph);
  onnx__operator_set_id_proto__init(&b->opset);
  b->opset.domain = "";
  b->opset.has_version = 1;
  b->opset.version = 13;
  b->opsets[0] = &b->opset;
  b->model.has_ir_version = 1;
  b->model.ir_version = 8;
  b->model.n_opset_import = 1;
  b->model.opset_import = b->opsets;
  b->model.graph = &b->graph;

  onnx__tensor_proto__init(&b->init);
  b->init.name = "w";
  b->init.has_data_type = 1;
  b->init.data_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
  b->init_dims[0] = 2;
  b->init_dims[1] = 2;
  b->init.n_dims = 2;
  b->init.dims = b->init_dims;
  for (int i = 0; i < 4; i++)
    b->init_data[i] = (float)i;
  b->init.n_float_data = 4;
  b->init.float_data = b->init_data;
  b->inits[0] = &b->init;
  b->graph.n_initializer = 1;
  b->graph.initializer = b->inits;

  for (int i = 0; i < 2; i++) {
    onnx__tensor_shape_proto__dimension__init(&b->dims[i]);
    b->dims[i].value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
    b->dims[i].dim_value = 2;
    b->dim_ptrs[i] = &b->dims[i];
  }
  onnx__tensor_shape_proto__init(&b->in_shape);
  b->in_shape.n_dim = 2;
  b->in_shape.dim = b->dim_ptrs;
  onnx__type_proto__tensor__init(&b->in_tt);
  b->in_tt.has_elem_type = 1;
  b->in_tt.elem_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
  b->in_tt.shape = &b->in_shape;
  onnx__type_proto__init(&b->in_tp);
  b->in_tp.value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
  b->in_tp.tensor_type = &b->in_tt;
  onnx__value_info_proto__init(&b->in_vi);
  b->in_vi.name = "x";
  b->in_vi.type = &b->in_tp;
  b->ins[0] = &b->in_vi;
  b->graph.n_input = 1;
  b->graph.input = b->ins;

  onnx__type_proto__tensor__init(&b->out_tt);
  b->out_tt.has_elem_type = 1;
  b->out_tt.elem_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
  onnx__type_proto__init(&b->out_tp);
  b->out_tp.value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
  b->out_tp.tensor_type = &b->out_tt;
  onnx__value_info_proto__init(&b->out_vi);
  b->out_vi.name = "y";
  b->out_vi.type = &b->out_tp;
  b->outs[0] = &b->out_vi;
  b->graph.n_output = 1;
  b->graph.output = b->outs;

  for (int i = 0; i < 2; i++) {
    onnx__node_proto__init(&b->nodes[i]);
    b->node_ptrs[i] = &b->nodes[i];
  }
  b->node_in[0][0] = "x";
  b->node_in[0][1] = "w";
  b->node_out[0][0] = "s";
  b->nodes[0].op_type = "Add";
  b->nodes[0].name = "add0";
  b->nodes[0].n_input = 2;
  b->nodes[0].input = b->node_in[0];
  b->nodes[0].n_output = 1;
  b->nodes[0].output = b->node_out[0];
  b->node_in[1][0] = "s";
  b->node_out[1][0] = "y";
  b->nodes[1].op_type = "Relu";
  b->nodes[1].name = "relu0";
  b->nodes[1].n_input = 1;
  b->nodes[1].input = b->node_in[1];
  b->nodes[1].n_output = 1;
  b->nodes[1].output = b->node_out[1];
  b->graph.n_node = 2;
  b->graph.node = b->node_ptrs;
  onnx__attribute_proto__init(&b->attr);
  b->attrs[0] = &b->attr;
}

static uint8_t *mb_pack(const mb *b, size_t *size) {
  *size = onnx__model_proto__get_packed_size(&b->model);
  uint8_t *buf = malloc(*size ? *size : 1);
  assert_non_null(buf);
  onnx__model_proto__pack(&b->model, buf);
  return buf;
}

/* Loads b; returns the code and checks the detail contains want. */
static int load_expect(const mb *b, int code, const char *want) {
  size_t size;
  uint8_t *buf = mb_pack(b, &size);
  es_model *m = NULL;
  int rc = es_model_load_buffer(buf, size, NULL, &m);
  free(buf);
  if (rc != code)
    fail_msg("load -> %s, want %s (detail: %s)", es_err_name(rc), es_err_name(code),
             es_last_error_detail());
  if (want && !strstr(es_last_error_detail(), want))
    fail_msg("detail '%s' lacks '%s'", es_last_error_detail(), want);
  es_model_release(m);
  return rc;
}

/* ---- tests --------------------------------------------------------------------- */

static void test_valid_model(void **state) {
  (void)state;
  mb b;
  mb_init(&b);
  size_t size;
  uint8_t *buf = mb_pack(&b, &size);
  es_model *m;
  ES_CHECK_RC(es_model_load_buffer(buf, size, NULL, &m));
  free(buf);
  assert_int_equal(es_model_input_count(m), 1);
  assert_int_equal(es_model_output_count(m), 1);
  es_tensor_info t;
  ES_CHECK_RC(es_model_input_info(m, 0, &t));
  assert_string_equal(t.name, "x");
  assert_int_equal(t.dtype, ES_DTYPE_FLOAT);
  assert_int_equal(t.rank, 2);
  assert_int_equal(t.dims[0], 2);
  es_model_stats st;
  ES_CHECK_RC(es_model_stats_get(m, &st));
  assert_int_equal(st.nodes, 2);
  assert_int_equal(st.constants, 1);
  assert_int_equal(st.weight_bytes, 16);
  assert_int_equal(st.opset, 13);
  ES_EXPECT_RC(es_model_input_info(m, 1, &t), ES_EINVAL);
  ES_EXPECT_RC(es_model_output_info(m, -1, &t), ES_EINVAL);
  es_model_release(m);
}

static void test_weights_are_read_only(void **state) {
  (void)state;
  mb b;
  mb_init(&b);
  size_t size;
  uint8_t *buf = mb_pack(&b, &size);
  es_graph g;
  memset(&g, 0, sizeof g);
  ES_CHECK_RC(es_onnx_load(buf, size, &g));
  free(buf);
  assert_true(es_weights_is_sealed(g.weights));
  for (int v = 0; v < g.n_values; v++)
    if (g.values[v].kind == ES_VALUE_CONST) {
      assert_int_equal((uintptr_t)g.values[v].data % 64, 0);
      assert_memory_equal(g.values[v].data, b.init_data, sizeof b.init_data);
    }
  es_graph_fini(&g);
}

static void test_every_truncation_fails_cleanly(void **state) {
  (void)state;
  mb b;
  mb_init(&b);
  size_t size;
  uint8_t *buf = mb_pack(&b, &size);
  size_t before = es_mem_total();
  for (size_t n = 0; n < size; n++) {
    uint8_t *copy = malloc(n ? n : 1); /* exact size: ASan sees any overread */
    memcpy(copy, buf, n);
    es_model *m = NULL;
    int rc = es_model_load_buffer(copy, n, NULL, &m);
    if (rc == 0)
      es_model_release(m); /* a prefix can be a valid, smaller model */
    else
      assert_true(strlen(es_last_error_detail()) > 0);
    free(copy);
  }
  assert_int_equal(es_mem_total(), before); /* nothing leaked on any path */
  free(buf);
}

static void test_random_corruption_never_crashes(void **state) {
  (void)state;
  mb b;
  mb_init(&b);
  size_t size;
  uint8_t *buf = mb_pack(&b, &size);
  uint64_t seed = es_test_seed();
  size_t before = es_mem_total();
  for (int it = 0; it < 20000; it++) {
    uint8_t *copy = malloc(size);
    memcpy(copy, buf, size);
    int flips = 1 + (int)(es_test_rand(&seed) % 4);
    for (int f = 0; f < flips; f++)
      copy[es_test_rand(&seed) % size] = (uint8_t)es_test_rand(&seed);
    es_model *m = NULL;
    if (es_model_load_buffer(copy, size, NULL, &m) == 0)
      es_model_release(m);
    free(copy);
  }
  assert_int_equal(es_mem_total(), before);
  free(buf);
}

static void test_not_protobuf(void **state) {
  (void)state;
  const char junk[] = "this is not an onnx model at all \xff\xff\xff\xff";
  es_model *m;
  ES_EXPECT_RC(es_model_load_buffer(junk, sizeof junk, NULL, &m), ES_EMODEL);
  ES_EXPECT_RC(es_model_load_buffer(NULL, 0, NULL, &m), ES_EINVAL);
  ES_EXPECT_RC(es_model_load("/nonexistent/model.onnx", NULL, &m), ES_ENOENT);
  ES_EXPECT_RC(es_model_load("/", NULL, &m), ES_EINVAL);
}

static void test_no_graph(void **state) {
  (void)state;
  mb b;
  mb_init(&b);
  b.model.graph = NULL;
  load_expect(&b, ES_EMODEL, "no graph");
}

static void test_unsupported_op_names_node(void **state) {
  (void)state;
  mb b;
  mb_init(&b);
  b.nodes[1].op_type = "LSTM";
  load_expect(&b, ES_ENOTSUP, "node 'relu0' (#1 LSTM): operator 'LSTM' is not supported");
}

static void test_unsupported_domain(void **state) {
  (void)state;
  mb b;
  mb_init(&b);
  b.nodes[0].domain = "com.microsoft";
  load_expect(&b, ES_ENOTSUP, "domain 'com.microsoft'");
}

static void test_opset_too_new(void **state) {
  (void)state;
  mb b;
  mb_init(&b);
  b.opset.version = 99;
  load_expect(&b, ES_ENOTSUP, "opset 99");
}

static void test_missing_input(void **state) {
  (void)state;
  mb b;
  mb_init(&b);
  b.node_in[1][0] = "nowhere";
  load_expect(&b, ES_EMODEL, "input 0 'nowhere'");
}

static void test_duplicate_definition(void **state) {
  (void)state;
  mb b;
  mb_init(&b);
  b.node_out[1][0] = "s"; /* Relu redefines Add's output */
  b.out_vi.name = "s";
  load_expect(&b, ES_EMODEL, "defined twice");
}

static void test_cycle(void **state) {
  (void)state;
  mb b;
  mb_init(&b);
  b.node_in[0][0] = "y"; /* Add reads Relu's output, Relu reads Add's */
  load_expect(&b, ES_EMODEL, "cycle");
}

static void test_output_not_produced(void **state) {
  (void)state;
  mb b;
  mb_init(&b);
  b.out_vi.name = "ghost";
  load_expect(&b, ES_EMODEL, "graph output 'ghost'");
}

static void test_bad_tensors(void **state) {
  (void)state;
  mb b;
  mb_init(&b);
  b.init.n_float_data = 3; /* shape says 4 */
  load_expect(&b, ES_EMODEL, "initializer #0 'w': holds 3 float32 elements");

  mb_init(&b);
  b.init.has_raw_data = 1;
  b.init.raw_data.len = 15;
  b.init.raw_data.data = (uint8_t *)b.init_data;
  load_expect(&b, ES_EMODEL, "raw_data holds 15 bytes");

  mb_init(&b);
  b.init_dims[0] = -1;
  load_expect(&b, ES_EMODEL, "negative");

  mb_init(&b);
  b.init_dims[0] = INT64_MAX / 2;
  b.init_dims[1] = 4;
  load_expect(&b, ES_EMODEL, "overflows");

  mb_init(&b);
  b.init.data_type = ONNX__TENSOR_PROTO__DATA_TYPE__COMPLEX64;
  load_expect(&b, ES_ENOTSUP, "complex64");

  mb_init(&b);
  b.init.has_data_location = 1;
  b.init.data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
  load_expect(&b, ES_ENOTSUP, "external");
}

static void test_subgraph_attribute(void **state) {
  (void)state;
  mb b;
  mb_init(&b);
  Onnx__GraphProto sub;
  onnx__graph_proto__init(&sub);
  b.attr.name = "body";
  b.attr.has_type = 1;
  b.attr.type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH;
  b.attr.g = &sub;
  b.nodes[1].n_attribute = 1;
  b.nodes[1].attribute = b.attrs;
  load_expect(&b, ES_ENOTSUP, "control flow");
}

static void test_dead_nodes_removed(void **state) {
  (void)state;
  mb b;
  mb_init(&b);
  /* a third node whose output nobody reads */
  onnx__node_proto__init(&b.nodes[2]);
  b.node_ptrs[2] = &b.nodes[2];
  b.node_in[2][0] = "x";
  b.node_out[2][0] = "unused";
  b.nodes[2].op_type = "Relu";
  b.nodes[2].n_input = 1;
  b.nodes[2].input = b.node_in[2];
  b.nodes[2].n_output = 1;
  b.nodes[2].output = b.node_out[2];
  b.graph.n_node = 3;
  size_t size;
  uint8_t *buf = mb_pack(&b, &size);
  es_model *m;
  ES_CHECK_RC(es_model_load_buffer(buf, size, NULL, &m));
  free(buf);
  es_model_stats st;
  es_model_stats_get(m, &st);
  assert_int_equal(st.nodes, 2);
  es_model_release(m);
}

static void test_unsorted_nodes(void **state) {
  (void)state;
  mb b;
  mb_init(&b);
  /* Relu listed before the Add it reads: legal after sorting */
  b.node_ptrs[0] = &b.nodes[1];
  b.node_ptrs[1] = &b.nodes[0];
  size_t size;
  uint8_t *buf = mb_pack(&b, &size);
  es_model *m;
  ES_CHECK_RC(es_model_load_buffer(buf, size, NULL, &m));
  free(buf);
  es_model_release(m);
}

/* The five target models, when fetched (scripts/fetch-models.sh). */
static void test_real_models(void **state) {
  (void)state;
  static const struct {
    const char *file;
    int inputs, outputs;
    int64_t opset;
  } models[] = {
      {"blazeface_front_128.onnx", 1, 4, 12}, {"blazeface_back_256.onnx", 1, 4, 12},
      {"ppocr_det.onnx", 1, 1, 11},           {"ppocr_rec.onnx", 1, 1, 9},
      {"ppocr_cls.onnx", 1, 1, 9},
  };
  const char *dir = getenv("ES_MODEL_DIR");
  char path[1024];
  int found = 0;
  for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
    snprintf(path, sizeof path, "%s/%s", dir ? dir : ES_SOURCE_DIR "/.cache/models",
             models[i].file);
    es_model *m;
    int rc = es_model_load(path, NULL, &m);
    if (rc == ES_ENOENT)
      continue;
    ES_CHECK_RC(rc);
    found++;
    assert_int_equal(es_model_input_count(m), models[i].inputs);
    assert_int_equal(es_model_output_count(m), models[i].outputs);
    es_model_stats st;
    es_model_stats_get(m, &st);
    assert_int_equal(st.opset, models[i].opset);
    assert_true(st.weight_bytes > 100000);
    es_model_release(m);
  }
  if (!found)
    skip(); /* models not fetched: scripts/fetch-models.sh */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_valid_model),
      cmocka_unit_test(test_weights_are_read_only),
      cmocka_unit_test(test_every_truncation_fails_cleanly),
      cmocka_unit_test(test_random_corruption_never_crashes),
      cmocka_unit_test(test_not_protobuf),
      cmocka_unit_test(test_no_graph),
      cmocka_unit_test(test_unsupported_op_names_node),
      cmocka_unit_test(test_unsupported_domain),
      cmocka_unit_test(test_opset_too_new),
      cmocka_unit_test(test_missing_input),
      cmocka_unit_test(test_duplicate_definition),
      cmocka_unit_test(test_cycle),
      cmocka_unit_test(test_output_not_produced),
      cmocka_unit_test(test_bad_tensors),
      cmocka_unit_test(test_subgraph_attribute),
      cmocka_unit_test(test_dead_nodes_removed),
      cmocka_unit_test(test_unsorted_nodes),
      cmocka_unit_test(test_real_models),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
