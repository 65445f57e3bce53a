/* Nesting depth: protobuf-c unpacks sub-messages by recursing, so the loader
 * walks the bytes first (onnx.c) and refuses a file whose messages nest
 * deeper than 64 levels with ES_EINVAL, before protobuf-c sees it. A file of
 * a hundred thousand nested subgraphs is refused without a crash (under
 * ASan too); one at the limit passes the walk and gets the loader's usual
 * answer; tensor bytes that happen to encode nested messages
 * are not walked into; and the walk refuses no corrupted file that
 * protobuf-c would accept. */
#include "es_test.h"

#include <string.h>

#include "edgeserve/engine.h"
#include "support/onnx_builder.h"

/* The loader's limit (ES_ONNX_MAX_DEPTH in src/model/onnx.c). */
#define MAX_DEPTH 64

/* Subgraph levels whose deepest GraphProto sits at depth 1 + 3 * levels. */
#define LEVELS_AT_LIMIT ((MAX_DEPTH - 1) / 3) /* 21: depth 64 */

static int load(const uint8_t *buf, size_t size) {
  es_model *m = NULL;
  int rc = es_model_load_buffer(buf, size, NULL, &m);
  es_model_release(m);
  return rc;
}

static void test_deep_subgraphs_refused(void **state) {
  (void)state;
  size_t before = es_mem_total();
  size_t size;
  uint8_t *buf = ob_nested_graphs_pack(100000, &size);
  printf("# 100000 nested subgraphs: %zu bytes\n", size);
  ES_EXPECT_RC(load(buf, size), ES_EINVAL);
  const char *detail = es_last_error_detail();
  printf("# %s\n", detail);
  assert_non_null(strstr(detail, "nested deeper than 64 levels"));
  free(buf);
  assert_int_equal(es_mem_total(), before);
}

static void test_limit_boundary(void **state) {
  (void)state;
  size_t size;
  /* At the limit the walk passes and the loader reads the graph: its If
   * node reads a value defined nowhere (the loader lists unsupported
   * operators and goes on, so the model error is what stops it). */
  uint8_t *buf = ob_nested_graphs_pack(LEVELS_AT_LIMIT, &size);
  ES_EXPECT_RC(load(buf, size), ES_EMODEL);
  assert_non_null(strstr(es_last_error_detail(), "node #0 (If): input 0 'c'"));
  free(buf);
  /* One level more nests three messages past it. */
  buf = ob_nested_graphs_pack(LEVELS_AT_LIMIT + 1, &size);
  ES_EXPECT_RC(load(buf, size), ES_EINVAL);
  free(buf);
  /* No subgraph at all: an empty graph, which has no outputs. */
  buf = ob_nested_graphs_pack(0, &size);
  ES_EXPECT_RC(load(buf, size), ES_EMODEL);
  free(buf);
}

/* An initializer whose raw_data bytes are themselves a deeply nested model:
 * bytes fields are skipped, never read as messages. */
static void test_tensor_bytes_not_walked(void **state) {
  (void)state;
  size_t nested_size;
  uint8_t *nested = ob_nested_graphs_pack(5000, &nested_size);
  size_t n = nested_size / 4 * 4;
  ob *b = ob_new(13);
  static const int64_t d2[2] = {1, 4};
  ob_input(b, "x", 2, d2);
  int64_t wd[1] = {(int64_t)(n / 4)};
  Onnx__TensorProto *w = ob_init_f32(b, "w", 1, wd, NULL);
  w->n_float_data = 0;
  w->has_raw_data = 1;
  w->raw_data.data = nested;
  w->raw_data.len = n;
  ob_node(b, "Relu", "y", 1, "x");
  ob_output(b, "y");
  ob_output(b, "w"); /* an initializer as an output: sealed with the weights */
  size_t size;
  uint8_t *buf = ob_pack(b, &size);
  es_model *m;
  ES_CHECK_RC(es_model_load_buffer(buf, size, NULL, &m));
  es_model_stats st;
  ES_CHECK_RC(es_model_stats_get(m, &st));
  assert_true(st.weight_bytes >= n);
  es_model_release(m);
  free(buf);
  free(b);
  free(nested);
}

/* The walk must refuse nothing protobuf-c accepts: where it calls a file
 * corrupted, protobuf-c's own unpack must fail too. Random byte flips in
 * a model with a few nested subgraphs (so the flips land in sub-messages,
 * length prefixes and tags at several depths). */
static void test_walk_no_stricter_than_protobuf_c(void **state) {
  (void)state;
  size_t size;
  uint8_t *buf = ob_nested_graphs_pack(6, &size);
  uint64_t seed = es_test_seed();
  int walk_refused = 0, both = 0;
  for (int it = 0; it < 50000; it++) {
    uint8_t *copy = malloc(size);
    memcpy(copy, buf, size);
    int flips = 1 + (int)(es_test_rand(&seed) % 3);
    for (int f = 0; f < flips; f++)
      copy[es_test_rand(&seed) % size] = (uint8_t)es_test_rand(&seed);
    size_t len = es_test_rand(&seed) % 8 ? size : es_test_rand(&seed) % (size + 1);
    int rc = load(copy, len);
    /* The walk's refusals say where; protobuf-c's say only the size. */
    if (rc == ES_EMODEL && strstr(es_last_error_detail(), " at byte ")) {
      walk_refused++;
      Onnx__ModelProto *mp = onnx__model_proto__unpack(NULL, len, copy);
      if (mp) {
        onnx__model_proto__free_unpacked(mp, NULL);
        fail_msg("iteration %d: the walk refused what protobuf-c unpacks: %s", it,
                 es_last_error_detail());
      }
      both++;
    }
    free(copy);
  }
  printf("# %d corrupted files refused by the walk, protobuf-c refused each\n", walk_refused);
  assert_true(walk_refused > 100); /* the property was exercised */
  assert_int_equal(both, walk_refused);
  free(buf);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_deep_subgraphs_refused),
      cmocka_unit_test(test_limit_boundary),
      cmocka_unit_test(test_tensor_bytes_not_walked),
      cmocka_unit_test(test_walk_no_stricter_than_protobuf_c),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
