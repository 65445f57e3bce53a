/* Loader tests: real models load and describe themselves; malformed,
 * truncated and hostile files fail with a precise error and never crash;
 * the load-time passes (fold.c) fold what they may, leave what they may not,
 * and the folded model computes what the original did.
 *
 * Hostile models are built here with protobuf-c's own structs and packed, so
 * each test changes exactly one thing in an otherwise valid model. */
#include "es_test.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "edgeserve/engine.h"
#include "engine/engine_internal.h"
#include "kernels/kernel.h"
#include "model/graph.h"
#include "support/onnx_builder.h"

#ifndef ES_SOURCE_DIR
#define ES_SOURCE_DIR "."
#endif

/* ---- building models ---------------------------------------------------- */

static float w_data[4] = {0, 1, 2, 3};

/* A valid model: y = Relu(x + w), x: float[2,2], w an initializer. */
static void valid_model(ob *b) {
  static const int64_t d22[2] = {2, 2};
  ob_init(b, 13);
  ob_input(b, "x", 2, d22);
  ob_init_f32(b, "w", 2, d22, w_data);
  ob_node_named(b, "Add", "add0", "s", 2, "x", "w");
  ob_node_named(b, "Relu", "relu0", "y", 1, "s");
  ob_output_typed(b, "y", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT);
}

/* Loads b; returns the code and checks the detail contains want. */
static int load_expect(const ob *b, int code, const char *want) {
  size_t size;
  uint8_t *buf = ob_pack(b, &size);
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
  ob b;
  valid_model(&b);
  size_t size;
  uint8_t *buf = ob_pack(&b, &size);
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
  ob b;
  valid_model(&b);
  size_t size;
  uint8_t *buf = ob_pack(&b, &size);
  es_graph g;
  memset(&g, 0, sizeof g);
  ES_CHECK_RC(es__graph_load_lowered(buf, size, &g));
  free(buf);
  assert_true(es_weights_is_sealed(g.weights));
  for (int v = 0; v < g.n_values; v++)
    if (g.values[v].kind == ES_VALUE_CONST) {
      assert_int_equal((uintptr_t)g.values[v].data % 64, 0);
      assert_memory_equal(g.values[v].data, w_data, sizeof w_data);
    }
  es__graph_fini(&g);
}

static void test_every_truncation_fails_cleanly(void **state) {
  (void)state;
  ob b;
  valid_model(&b);
  size_t size;
  uint8_t *buf = ob_pack(&b, &size);
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
  ob b;
  valid_model(&b);
  size_t size;
  uint8_t *buf = ob_pack(&b, &size);
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
  ob b;
  valid_model(&b);
  b.model.graph = NULL;
  load_expect(&b, ES_EMODEL, "no graph");
}

static void test_unsupported_op_names_node(void **state) {
  (void)state;
  ob b;
  valid_model(&b);
  b.nodes[1].op_type = "StringNormalizer";
  load_expect(&b, ES_ENOTSUP,
              "node 'relu0' (#1 StringNormalizer): operator 'StringNormalizer' is not supported");
}

static void test_unsupported_domain(void **state) {
  (void)state;
  ob b;
  valid_model(&b);
  b.nodes[0].domain = "com.microsoft";
  load_expect(&b, ES_ENOTSUP, "domain 'com.microsoft'");
}

static void test_opset_too_new(void **state) {
  (void)state;
  ob b;
  valid_model(&b);
  b.opset.version = 99;
  load_expect(&b, ES_ENOTSUP, "opset 99");
}

static void test_missing_input(void **state) {
  (void)state;
  ob b;
  valid_model(&b);
  b.node_in[1][0] = "nowhere";
  load_expect(&b, ES_EMODEL, "input 0 'nowhere'");
}

static void test_duplicate_definition(void **state) {
  (void)state;
  ob b;
  valid_model(&b);
  b.node_out[1][0] = "s"; /* Relu redefines Add's output */
  b.out_vi[0].name = "s";
  load_expect(&b, ES_EMODEL, "defined twice");
}

static void test_cycle(void **state) {
  (void)state;
  ob b;
  valid_model(&b);
  b.node_in[0][0] = "y"; /* Add reads Relu's output, Relu reads Add's */
  load_expect(&b, ES_EMODEL, "cycle");
}

static void test_output_not_produced(void **state) {
  (void)state;
  ob b;
  valid_model(&b);
  b.out_vi[0].name = "ghost";
  load_expect(&b, ES_EMODEL, "graph output 'ghost'");
}

static void test_bad_tensors(void **state) {
  (void)state;
  ob b;
  valid_model(&b);
  b.inits[0].n_float_data = 3; /* shape says 4 */
  load_expect(&b, ES_EMODEL, "initializer #0 'w': holds 3 float32 elements");

  valid_model(&b);
  b.inits[0].has_raw_data = 1;
  b.inits[0].raw_data.len = 15;
  b.inits[0].raw_data.data = (uint8_t *)w_data;
  load_expect(&b, ES_EMODEL, "raw_data holds 15 bytes");

  valid_model(&b);
  b.init_dims[0][0] = -1;
  load_expect(&b, ES_EMODEL, "negative");

  valid_model(&b);
  b.init_dims[0][0] = INT64_MAX / 2;
  b.init_dims[0][1] = 4;
  load_expect(&b, ES_EMODEL, "overflows");

  valid_model(&b);
  b.inits[0].data_type = ONNX__TENSOR_PROTO__DATA_TYPE__COMPLEX64;
  load_expect(&b, ES_ENOTSUP, "complex64");

  valid_model(&b);
  b.inits[0].has_data_location = 1;
  b.inits[0].data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
  load_expect(&b, ES_ENOTSUP, "external");
}

/* The loader leaves raw_data payloads of 1 KiB and more out of the protobuf
 * parse and reads them from the original bytes: weights of every size
 * around the cut, one in a Constant node's attribute, one in a subgraph
 * (whose enclosing messages all change length), must come out intact. */
static void test_large_weights_read_from_file(void **state) {
  (void)state;
  enum { N = 700 }; /* 2800 bytes: left out of the parse */
  static float big[N], mid[256], small[4] = {4, 3, 2, 1}, cst[N];
  for (int i = 0; i < N; i++) {
    big[i] = (float)i * 0.5f;
    cst[i] = (float)(N - i);
  }
  for (int i = 0; i < 256; i++)
    mid[i] = (float)i - 100.0f; /* exactly 1024 bytes: the cut itself */
  const int64_t dn[1] = {N}, dm[1] = {256}, ds[1] = {4};
  ob *b = ob_new(13);
  ob_input(b, "x", 1, dn);
  Onnx__TensorProto *w = ob_init_f32(b, "w", 1, dn, big);
  Onnx__TensorProto *m = ob_init_f32(b, "m", 1, dm, mid);
  Onnx__TensorProto *sm = ob_init_f32(b, "s", 1, ds, small);
  const struct {
    Onnx__TensorProto *t;
    const float *v;
    size_t n;
  } raw[3] = {{w, big, N}, {m, mid, 256}, {sm, small, 4}};
  for (int i = 0; i < 3; i++) {
    raw[i].t->n_float_data = 0;
    raw[i].t->has_raw_data = 1;
    raw[i].t->raw_data.len = raw[i].n * sizeof(float);
    raw[i].t->raw_data.data = (uint8_t *)raw[i].v;
  }
  int c = ob_node(b, "Constant", "c", 0);
  Onnx__TensorProto ct;
  onnx__tensor_proto__init(&ct);
  int64_t ctd[1] = {N};
  ct.has_data_type = 1;
  ct.data_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
  ct.n_dims = 1;
  ct.dims = ctd;
  ct.has_raw_data = 1;
  ct.raw_data.len = sizeof cst;
  ct.raw_data.data = (uint8_t *)cst;
  ob_attr_tensor(b, c, "value", &ct);
  int add = ob_node(b, "Add", "a", 2, "x", "w");
  ob_node(b, "Add", "y", 2, "a", "c");
  ob_node(b, "ReduceSum", "rm", 1, "m");
  ob_node(b, "ReduceSum", "rs", 1, "s");
  ob_output_typed(b, "y", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT);
  ob_output_typed(b, "rm", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT);
  ob_output_typed(b, "rs", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT);
  size_t size;
  uint8_t *buf = ob_pack(b, &size);
  es_model *mo;
  ES_CHECK_RC(es_model_load_buffer(buf, size, NULL, &mo));
  free(buf);
  es_tensor_info shape = {.name = "x", .dtype = ES_DTYPE_FLOAT, .rank = 1, .dims = {N}};
  es_plan *p;
  ES_CHECK_RC(es_model_plan(mo, &shape, 1, &p));
  static float x[N];
  for (int i = 0; i < N; i++)
    x[i] = 1.0f;
  es_arena *ar;
  ES_CHECK_RC(es_arena_create(es_plan_arena_bytes(p) + 64, 64, &ar));
  es_tensor in = {.name = "x", .dtype = ES_DTYPE_FLOAT, .rank = 1, .dims = {N}, .data = x,
                  .nbytes = sizeof x};
  es_tensor out[3];
  memset(out, 0, sizeof out);
  ES_CHECK_RC(es_plan_run(p, &in, 1, ar, out, 3));
  const float *y = out[0].data, *rm = out[1].data, *rs = out[2].data;
  for (int i = 0; i < N; i++)
    assert_float_equal(y[i], 1.0f + big[i] + cst[i], 0.0f);
  float em = 0;
  for (int i = 0; i < 256; i++)
    em += mid[i];
  assert_float_equal(rm[0], em, 1e-3f);
  assert_float_equal(rs[0], 10.0f, 0.0f);
  es_arena_destroy(ar);
  es_plan_release(p);
  es_model_release(mo);

  /* The same weight inside a subgraph: every message above it shrinks; the
   * subgraph is listed (not run), the file read to its end. */
  Onnx__GraphProto sub;
  onnx__graph_proto__init(&sub);
  Onnx__TensorProto *subinit[1] = {w};
  sub.n_initializer = 1;
  sub.initializer = subinit;
  ob_attr_graph(b, add, "body", &sub);
  buf = ob_pack(b, &size);
  es_model *m2 = NULL;
  int rc = es_model_load_buffer(buf, size, NULL, &m2);
  free(buf);
  if (rc != ES_ENOTSUP)
    fail_msg("subgraph: %s (%s), want ES_ENOTSUP", es_err_name(rc), es_last_error_detail());
  es_model_release(m2);
  free(b);
}

static uint64_t weights_allocs(uint64_t *frees) {
  es_mem_stats st;
  es_mem_stats_get(ES_MEM_WEIGHTS, &st);
  *frees = st.frees;
  return st.allocs;
}

/* y = x + f(W) + (s1 + s2), W a weight of 1.2 MB (staged in the slab), the
 * small sum folded at load. fold_w: f(W) = W * 2, folded at load too, so
 * the slab's only weight dies; else f(W) = W. */
static void slab_model(ob *b, const float *w, int fold_w) {
  enum { N = 300000 };
  static const int64_t dn[1] = {N}, d1[1] = {1};
  static const float s1 = 0.25f, s2 = 0.5f, two = 2.0f;
  ob_init(b, 13);
  ob_input(b, "x", 1, dn);
  Onnx__TensorProto *t = ob_init_f32(b, "W", 1, dn, w);
  t->n_float_data = 0; /* raw bytes: left out of the parse and staged */
  t->has_raw_data = 1;
  t->raw_data.len = N * sizeof(float);
  t->raw_data.data = (uint8_t *)w;
  ob_init_f32(b, "s1", 1, d1, &s1);
  ob_init_f32(b, "s2", 1, d1, &s2);
  ob_init_f32(b, "two", 1, d1, &two);
  ob_node(b, "Add", "c", 2, "s1", "s2");
  if (fold_w)
    ob_node(b, "Mul", "fw", 2, "W", "two");
  ob_node(b, "Add", "a", 2, "x", fold_w ? "fw" : "W");
  ob_node(b, "Add", "y", 2, "a", "c");
  ob_output(b, "y");
}

/* The weights staged from the file become the sealed region where they
 * are (one mapping for the load, the folded constant copied into its room)
 * when the passes kept them; when a pass replaced them, a new region is
 * filled and the slab given back. Both compute the same. */
static void test_weights_sealed_in_place(void **state) {
  (void)state;
  enum { N = 300000 };
  float *w = malloc(N * sizeof *w), *x = malloc(N * sizeof *x);
  assert_true(w && x);
  for (int i = 0; i < N; i++) {
    w[i] = (float)(i % 1000) * 0.25f;
    x[i] = (float)(i % 7);
  }
  for (int fold_w = 0; fold_w < 2; fold_w++) {
    ob b;
    slab_model(&b, w, fold_w);
    size_t before = es_mem_total();
    uint64_t f0, f1, a0 = weights_allocs(&f0);
    es_model *m = ob_load(&b);
    uint64_t a1 = weights_allocs(&f1);
    /* a region is a handle and a mapping: one kept, or two made and one
     * given back */
    assert_int_equal(a1 - a0, fold_w ? 4 : 2);
    assert_int_equal(f1 - f0, fold_w ? 2 : 0);
    es_model_stats st;
    ES_CHECK_RC(es_model_stats_get(m, &st));
    assert_int_equal(st.constants, 2);
    /* W (or W * 2) and c, their data bytes; where they sit is what the
     * region counts above tell */
    size_t wb = N * sizeof(float);
    assert_int_equal(st.weight_bytes, wb + sizeof(float));
    float *y;
    size_t n;
    es_tensor in = ob_tensor_f32("x", 1, (int64_t[]){N}, x);
    ob_run(m, 1, &in, 1, &y, &n);
    assert_int_equal(n, N);
    for (int i = 0; i < N; i++)
      if (y[i] != x[i] + w[i] * (fold_w ? 2.0f : 1.0f) + 0.75f)
        fail_msg("fold_w %d: y[%d] = %g", fold_w, i, (double)y[i]);
    free(y);
    es_model_release(m);
    assert_int_equal(es_mem_total(), before);
  }
  free(w);
  free(x);
}

/* es_model_load of a file reads a large constant in place, in the file's
 * shared mapping, when the file stores it as it is and aligned to its
 * element (4 bytes for float); else it is copied as from a buffer. The
 * node's name shifts the weight's offset in the file through 0..3 mod 4,
 * so both ways are taken. The model keeps working once the file is
 * unlinked (its mapping holds the inode), and everything goes with it. */
/* W's tensor stores data as raw bytes (the form exporters write). */
static void raw_of_floats(Onnx__TensorProto *t, float *data, size_t bytes) {
  t->n_float_data = 0;
  t->has_raw_data = 1;
  t->raw_data.len = bytes;
  t->raw_data.data = (uint8_t *)data;
}

/* Packs b into a new temporary file (path, cap bytes); returns 1 when the
 * bytes of data (the raw weights) sit at an offset aligned to a float in
 * it, 0 when not. */
static int pack_to_file(const ob *b, const void *data, size_t bytes, char *path, size_t cap) {
  size_t size;
  uint8_t *buf = ob_pack(b, &size);
  const uint8_t *at = memmem(buf, size, data, bytes);
  assert_non_null(at);
  int aligned = (at - buf) % 4 == 0;
  free(buf);
  ob_save_temp(b, "es-inplace", path, cap);
  return aligned;
}

static void test_weights_read_in_place_from_file(void **state) {
  (void)state;
  enum { N = 2048 };
  static float w[N], x[N];
  for (int i = 0; i < N; i++) {
    w[i] = (float)(i % 97) * 0.5f;
    x[i] = (float)(i % 5);
  }
  int seen[2] = {0, 0};
  for (int shift = 0; shift < 4; shift++) {
    ob b;
    ob_init(&b, 13);
    static const int64_t dn[1] = {N};
    ob_input(&b, "x", 1, dn);
    raw_of_floats(ob_init_f32(&b, "W", 1, dn, w), w, sizeof w);
    static const char *names[4] = {"a", "ab", "abc", "abcd"};
    ob_node_named(&b, "Add", names[shift], "y", 2, "x", "W");
    ob_output(&b, "y");
    char path[512];
    int aligned = pack_to_file(&b, w, sizeof w, path, sizeof path);
    seen[aligned] = 1;
    size_t before = es_mem_total();
    es_model *m;
    ES_CHECK_RC(es_model_load(path, NULL, &m));
    assert_int_equal(unlink(path), 0);
    es_model_stats st;
    ES_CHECK_RC(es_model_stats_get(m, &st));
    assert_int_equal(st.weight_bytes, sizeof w);
    if (st.weight_file_bytes != (aligned ? sizeof w : 0))
      fail_msg("shift %d: W %saligned, %zu bytes read in place", shift, aligned ? "" : "not ",
               st.weight_file_bytes);
    float *y;
    size_t n;
    es_tensor in = ob_tensor_f32("x", 1, dn, x);
    ob_run(m, 1, &in, 1, &y, &n);
    assert_int_equal(n, N);
    for (int i = 0; i < N; i++)
      if (y[i] != x[i] + w[i])
        fail_msg("shift %d: y[%d] = %g, expected %g", shift, i, (double)y[i],
                 (double)(x[i] + w[i]));
    free(y);
    es_model_release(m);
    assert_int_equal(es_mem_total(), before);
  }
  assert_true(seen[0] && seen[1]);
}

/* A linear layer's weights that only a MatMul reads are read in place from
 * the file at any offset, aligned or not (the kernel reorders them, or reads
 * an aligned copy on the reference path); shared with an Add, misaligned
 * ones are staged as before. Every shift runs on both kernel paths and
 * gives x W exactly as a float loop does, and all memory comes back. */
static void test_matmul_weights_in_place_misaligned(void **state) {
  (void)state;
  enum { M = 3, K = 32, N = 64 };
  static float w[K * N], x[M * K];
  for (int i = 0; i < K * N; i++)
    w[i] = (float)(i % 13) * 0.25f - 1.0f;
  for (int i = 0; i < M * K; i++)
    x[i] = (float)(i % 7) - 3.0f;
  int seen[2][2] = {{0, 0}, {0, 0}};
  for (int shared = 0; shared < 2; shared++)
    for (int shift = 0; shift < 4; shift++) {
      ob b;
      ob_init(&b, 13);
      static const int64_t xd[2] = {M, K}, wd[2] = {K, N}, yd[2] = {K, N};
      ob_input(&b, "x", 2, xd);
      raw_of_floats(ob_init_f32(&b, "W", 2, wd, w), w, sizeof w);
      static const char *names[4] = {"a", "ab", "abc", "abcd"};
      ob_node_named(&b, "MatMul", names[shift], "y", 2, "x", "W");
      ob_output(&b, "y");
      if (shared) { /* W also read by an Add */
        ob_input(&b, "z", 2, yd);
        ob_node(&b, "Add", "zw", 2, "z", "W");
        ob_output(&b, "zw");
      }
      char path[512];
      int aligned = pack_to_file(&b, w, sizeof w, path, sizeof path);
      seen[shared][aligned] = 1;
      size_t before = es_mem_total();
      for (int ref = 0; ref < 2; ref++) {
        es__kernels_use_reference(ref);
        es_model *m;
        ES_CHECK_RC(es_model_load(path, NULL, &m));
        es_model_stats st;
        ES_CHECK_RC(es_model_stats_get(m, &st));
        size_t want = !shared || aligned ? sizeof w : 0;
        if (st.weight_file_bytes != want)
          fail_msg("shared %d shift %d: W %saligned, %zu bytes read in place, want %zu",
                   shared, shift, aligned ? "" : "not ", st.weight_file_bytes, want);
        float *y[2];
        size_t n[2];
        es_tensor in[2] = {ob_tensor_f32("x", 2, xd, x), ob_tensor_f32("z", 2, yd, w)};
        ob_run(m, 1 + shared, in, 1 + shared, y, n);
        assert_int_equal(n[0], M * N);
        for (int i = 0; i < M; i++)
          for (int j = 0; j < N; j++) {
            float want_y = 0;
            for (int k = 0; k < K; k++)
              want_y += x[i * K + k] * w[k * N + j];
            if (fabsf(y[0][i * N + j] - want_y) > 1e-4f * (1 + fabsf(want_y)))
              fail_msg("shared %d shift %d ref %d: y[%d][%d] = %g, expected %g", shared, shift,
                       ref, i, j, (double)y[0][i * N + j], (double)want_y);
          }
        for (int i = 0; shared && i < K * N; i++)
          assert_true(y[1][i] == 2 * w[i]);
        for (int o = 0; o < 1 + shared; o++)
          free(y[o]);
        es_model_release(m);
      }
      es__kernels_use_reference(0);
      assert_int_equal(unlink(path), 0);
      assert_int_equal(es_mem_total(), before);
    }
  assert_true(seen[0][0] && seen[0][1] && seen[1][0] && seen[1][1]);
}

/* The same for a Gemm's B: read in place at any offset, on every path the
 * kernel takes (dot products over B as stored for transB at 1 to 4 rows,
 * oneDNN on a prepared copy above, the reference loops on an aligned copy),
 * with Y = A B' as a float loop gives it. */
static void test_gemm_weights_in_place_misaligned(void **state) {
  (void)state;
  enum { K = 40, N = 24 };
  static float w[K * N], x[6 * K];
  for (int i = 0; i < K * N; i++)
    w[i] = (float)(i % 11) * 0.25f - 1.0f;
  for (int i = 0; i < 6 * K; i++)
    x[i] = (float)(i % 7) - 3.0f;
  int seen[2] = {0, 0};
  for (int tb = 0; tb < 2; tb++)
    for (int shift = 0; shift < 4; shift++) {
      ob b;
      ob_init(&b, 13);
      const int64_t xd[2] = {-1, K}, wd[2] = {tb ? N : K, tb ? K : N};
      ob_input(&b, "x", 2, xd);
      raw_of_floats(ob_init_f32(&b, "W", 2, wd, w), w, sizeof w);
      static const char *names[4] = {"a", "ab", "abc", "abcd"};
      int n = ob_node_named(&b, "Gemm", names[shift], "y", 2, "x", "W");
      ob_attr_int(&b, n, "transB", tb);
      ob_output(&b, "y");
      char path[512];
      int aligned = pack_to_file(&b, w, sizeof w, path, sizeof path);
      seen[aligned] = 1;
      size_t before = es_mem_total();
      for (int ref = 0; ref < 2; ref++)
        for (int m_rows = 1; m_rows <= 6; m_rows += 5) {
          es__kernels_use_reference(ref);
          es_model *m;
          ES_CHECK_RC(es_model_load(path, NULL, &m));
          es_model_stats st;
          ES_CHECK_RC(es_model_stats_get(m, &st));
          assert_int_equal(st.weight_file_bytes, sizeof w);
          float *y;
          size_t cnt;
          es_tensor in = ob_tensor_f32("x", 2, (int64_t[2]){m_rows, K}, x);
          ob_run(m, 1, &in, 1, &y, &cnt);
          assert_int_equal(cnt, (size_t)m_rows * N);
          for (int i = 0; i < m_rows; i++)
            for (int j = 0; j < N; j++) {
              float want = 0;
              for (int k = 0; k < K; k++)
                want += x[i * K + k] * (tb ? w[j * K + k] : w[k * N + j]);
              if (fabsf(y[i * N + j] - want) > 1e-4f * (1 + fabsf(want)))
                fail_msg("transB %d shift %d ref %d rows %d: y[%d][%d] = %g, expected %g", tb,
                         shift, ref, m_rows, i, j, (double)y[i * N + j], (double)want);
            }
          free(y);
          es_model_release(m);
        }
      es__kernels_use_reference(0);
      assert_int_equal(unlink(path), 0);
      assert_int_equal(es_mem_total(), before);
    }
  assert_true(seen[0] && seen[1]);
}

static void test_subgraph_attribute(void **state) {
  (void)state;
  ob b;
  valid_model(&b);
  Onnx__GraphProto sub;
  onnx__graph_proto__init(&sub);
  ob_attr_graph(&b, 1, "body", &sub);
  load_expect(&b, ES_ENOTSUP, "is a subgraph, which the engine runs only");
}

static void test_dead_nodes_removed(void **state) {
  (void)state;
  ob b;
  valid_model(&b);
  /* a third node whose output nobody reads */
  ob_node_named(&b, "Relu", NULL, "unused", 1, "x");
  size_t size;
  uint8_t *buf = ob_pack(&b, &size);
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
  ob b;
  valid_model(&b);
  /* Relu listed before the Add it reads: legal after sorting */
  b.node_ptrs[0] = &b.nodes[1];
  b.node_ptrs[1] = &b.nodes[0];
  size_t size;
  uint8_t *buf = ob_pack(&b, &size);
  es_model *m;
  ES_CHECK_RC(es_model_load_buffer(buf, size, NULL, &m));
  free(buf);
  es_model_release(m);
}

/* ---- load-time folding ------------------------------------------------------ */

/* A graph with one float input "x" of the given shape, opset 13. */
static void graph_init(ob *b, int rank, const int64_t *dims) {
  ob_init(b, 13);
  ob_input(b, "x", rank, dims);
}

/* Plans m for x of the given shape, runs it, and copies output i (float
 * elements) into out[i]. */
static void model_run(es_model *m, const float *x, int rank, const int64_t *dims, int n_out,
                      float **out, size_t *count) {
  es_tensor in = ob_tensor_f32("x", rank, dims, x);
  ob_run(m, 1, &in, n_out, out, count);
}

static void fill_random(float *v, size_t n, float lo, float hi, uint64_t *seed) {
  for (size_t i = 0; i < n; i++)
    v[i] = lo + (hi - lo) * (float)(es_test_rand(seed) >> 11) / (float)(1ull << 53);
}

/* Conv (2-D, stride 1, square kernel, symmetric pads, groups) then inference
 * BatchNormalization, naively in double: the reference for the folded model. */
typedef struct conv_bn {
  int c, h, w, m, k, group, pad;
  float x[4 * 5 * 5], W[6 * 2 * 3 * 3], B[6];
  float scale[6], bias[6], mean[6], var[6];
  float eps;
} conv_bn;

static void conv_bn_data(conv_bn *t, uint64_t seed) {
  *t = (conv_bn){.c = 4, .h = 5, .w = 5, .m = 6, .k = 3, .group = 2, .pad = 1, .eps = 1e-3f};
  fill_random(t->x, sizeof t->x / sizeof t->x[0], -1, 1, &seed);
  fill_random(t->W, sizeof t->W / sizeof t->W[0], -1, 1, &seed);
  fill_random(t->B, 6, -1, 1, &seed);
  fill_random(t->scale, 6, 0.5f, 2, &seed);
  fill_random(t->bias, 6, -1, 1, &seed);
  fill_random(t->mean, 6, -0.5f, 0.5f, &seed);
  fill_random(t->var, 6, 0.1f, 2, &seed);
}

static void conv_bn_reference(const conv_bn *t, int with_bias, int relu, float *y) {
  int cg = t->c / t->group, mg = t->m / t->group;
  for (int oc = 0; oc < t->m; oc++)
    for (int oy = 0; oy < t->h; oy++)
      for (int ox = 0; ox < t->w; ox++) {
        double s = with_bias ? t->B[oc] : 0.0;
        int g = oc / mg;
        for (int icg = 0; icg < cg; icg++)
          for (int ky = 0; ky < t->k; ky++)
            for (int kx = 0; kx < t->k; kx++) {
              int iy = oy + ky - t->pad, ix = ox + kx - t->pad;
              if (iy < 0 || iy >= t->h || ix < 0 || ix >= t->w)
                continue;
              int ic = g * cg + icg;
              s += (double)t->x[(ic * t->h + iy) * t->w + ix] *
                   t->W[((oc * cg + icg) * t->k + ky) * t->k + kx];
            }
        double v = (s - t->mean[oc]) / sqrt((double)t->var[oc] + t->eps) * t->scale[oc] +
                   t->bias[oc];
        y[(oc * t->h + oy) * t->w + ox] = (float)(relu && v < 0 ? 0 : v);
      }
}

/* x -> Conv -> BatchNormalization [-> Relu] -> y; with shared set, the
 * Conv's output also feeds a Relu whose output z is a second graph output. */
static void conv_bn_model(ob *b, const conv_bn *t, int with_bias, int relu, int shared) {
  static const int64_t xd[4] = {1, 4, 5, 5}, wd[4] = {6, 2, 3, 3}, pd[1] = {6};
  static const int64_t pads[4] = {1, 1, 1, 1}, ks[2] = {3, 3};
  graph_init(b, 4, xd);
  ob_init_f32(b, "W", 4, wd, t->W);
  if (with_bias)
    ob_init_f32(b, "B", 1, pd, t->B);
  ob_init_f32(b, "scale", 1, pd, t->scale);
  ob_init_f32(b, "bias", 1, pd, t->bias);
  ob_init_f32(b, "mean", 1, pd, t->mean);
  ob_init_f32(b, "var", 1, pd, t->var);
  int conv = with_bias ? ob_node_named(b, "Conv", "conv0", "c", 3, "x", "W", "B")
                       : ob_node_named(b, "Conv", "conv0", "c", 2, "x", "W");
  ob_attr_int(b, conv, "group", 2);
  ob_attr_ints(b, conv, "pads", 4, pads);
  ob_attr_ints(b, conv, "kernel_shape", 2, ks);
  int bn = ob_node_named(b, "BatchNormalization", "bn0", relu ? "n" : "y", 5, "c", "scale", "bias",
                   "mean", "var");
  ob_attr_float(b, bn, "epsilon", t->eps);
  if (relu)
    ob_node_named(b, "Relu", "relu0", "y", 1, "n");
  ob_output(b, "y");
  if (shared) {
    ob_node_named(b, "Relu", "relu1", "z", 1, "c");
    ob_output(b, "z");
  }
}

static void expect_close(const float *got, const float *want, size_t n, float tol) {
  for (size_t i = 0; i < n; i++)
    if (!(fabsf(got[i] - want[i]) <= tol))
      fail_msg("element %zu: got %.7g, want %.7g", i, (double)got[i], (double)want[i]);
}

/* (a) Conv + BatchNormalization fold into one Conv and compute the same. */
static void test_fold_conv_bn(void **state) {
  (void)state;
  static const int64_t xd[4] = {1, 4, 5, 5};
  for (int variant = 0; variant < 2; variant++) {
    /* 0: Conv with bias, then Relu; 1: no bias, BN's output is the graph's */
    int with_bias = variant == 0, relu = variant == 0;
    conv_bn t;
    conv_bn_data(&t, 0x1234 + (uint64_t)variant);
    ob b;
    conv_bn_model(&b, &t, with_bias, relu, 0);
    size_t before = es_mem_total();
    es_model *m = ob_load(&b);
    es_model_stats st;
    ES_CHECK_RC(es_model_stats_get(m, &st));
    assert_int_equal(st.folded_bn, 1);
    assert_int_equal(st.folded_nodes, 0);
    assert_int_equal(st.nodes, relu ? 2 : 1);
    /* W' and B' only: the BN parameters (and the old W, B) are gone */
    assert_int_equal(st.constants, 2);
    assert_int_equal(st.weight_bytes, 6 * 2 * 3 * 3 * 4 + 6 * 4);
    float *y;
    size_t n;
    model_run(m, t.x, 4, xd, 1, &y, &n);
    assert_int_equal(n, 6 * 5 * 5);
    float want[6 * 5 * 5];
    conv_bn_reference(&t, with_bias, relu, want);
    expect_close(y, want, n, 1e-4f);
    free(y);
    es_model_release(m);
    assert_int_equal(es_mem_total(), before);
  }
}

/* (b) A Conv whose output is read elsewhere too keeps its BatchNormalization,
 * whether the other reader is a node or the graph's outputs. */
static void test_bn_not_folded_when_conv_output_shared(void **state) {
  (void)state;
  static const int64_t xd[4] = {1, 4, 5, 5};
  conv_bn t;
  conv_bn_data(&t, 0x77);
  ob b;
  conv_bn_model(&b, &t, 1, 0, 1);
  es_model *m = ob_load(&b);
  es_model_stats st;
  ES_CHECK_RC(es_model_stats_get(m, &st));
  assert_int_equal(st.folded_bn, 0);
  assert_int_equal(st.nodes, 3);
  float *out[2];
  size_t n[2];
  model_run(m, t.x, 4, xd, 2, out, n);
  float want[6 * 5 * 5];
  conv_bn_reference(&t, 1, 0, want);
  expect_close(out[0], want, n[0], 1e-4f);
  free(out[0]);
  free(out[1]);
  es_model_release(m);

  /* the Conv's output is itself a graph output */
  conv_bn_model(&b, &t, 1, 0, 0);
  ob_output(&b, "c");
  m = ob_load(&b);
  ES_CHECK_RC(es_model_stats_get(m, &st));
  assert_int_equal(st.folded_bn, 0);
  assert_int_equal(st.nodes, 2);
  es_model_release(m);

  /* training mode is not the affine map the fold assumes */
  conv_bn_model(&b, &t, 1, 0, 0);
  ob_attr_int(&b, 1, "training_mode", 1);
  m = ob_load(&b);
  ES_CHECK_RC(es_model_stats_get(m, &st));
  assert_int_equal(st.folded_bn, 0);
  es_model_release(m);
}

/* ConvTranspose's W is [C, M/group, k...]: the fold scales along dim 1. The
 * reference is the same model with the fold prevented (the ConvTranspose's
 * output also a graph output), computed by the kernels. */
static void test_fold_convtranspose_bn(void **state) {
  (void)state;
  static const int64_t xd[4] = {1, 4, 3, 3}, wd[4] = {4, 3, 2, 2}, pd[1] = {6};
  static const int64_t strides[2] = {2, 2};
  uint64_t seed = 0xc0ffee;
  float x[4 * 3 * 3], W[4 * 3 * 2 * 2], scale[6], bias[6], mean[6], var[6];
  fill_random(x, 36, -1, 1, &seed);
  fill_random(W, 48, -1, 1, &seed);
  fill_random(scale, 6, 0.5f, 2, &seed);
  fill_random(bias, 6, -1, 1, &seed);
  fill_random(mean, 6, -0.5f, 0.5f, &seed);
  fill_random(var, 6, 0.1f, 2, &seed);
  float *y[2][2];
  size_t n[2][2];
  for (int shared = 0; shared < 2; shared++) {
    ob b;
    graph_init(&b, 4, xd);
    ob_init_f32(&b, "W", 4, wd, W);
    ob_init_f32(&b, "scale", 1, pd, scale);
    ob_init_f32(&b, "bias", 1, pd, bias);
    ob_init_f32(&b, "mean", 1, pd, mean);
    ob_init_f32(&b, "var", 1, pd, var);
    int ct = ob_node_named(&b, "ConvTranspose", "up0", "c", 2, "x", "W");
    ob_attr_int(&b, ct, "group", 2);
    ob_attr_ints(&b, ct, "strides", 2, strides);
    ob_node_named(&b, "BatchNormalization", "bn0", "y", 5, "c", "scale", "bias", "mean", "var");
    ob_output(&b, "y");
    if (shared)
      ob_output(&b, "c");
    es_model *m = ob_load(&b);
    es_model_stats st;
    ES_CHECK_RC(es_model_stats_get(m, &st));
    assert_int_equal(st.folded_bn, shared ? 0 : 1);
    model_run(m, x, 4, xd, 1 + shared, y[shared], n[shared]);
    es_model_release(m);
  }
  assert_int_equal(n[0][0], 6 * 6 * 6);
  assert_int_equal(n[1][0], n[0][0]);
  expect_close(y[0][0], y[1][0], n[0][0], 1e-4f);
  free(y[0][0]);
  free(y[1][0]);
  free(y[1][1]);
}

/* (c) Constant-only chains evaluate at load; only their result is kept. */
static void test_fold_constant_chain(void **state) {
  (void)state;
  static const int64_t d22[2] = {2, 2};
  static const float w[4] = {1, 2, 3, 4};
  static const float x[4] = {-20, 0.5f, -1, 3};
  ob b;
  graph_init(&b, 2, d22);
  ob_init_f32(&b, "w", 2, d22, w);
  ob_node_named(&b, "Transpose", "t0", "t", 1, "w");
  ob_node_named(&b, "Add", "c0", "c", 2, "t", "w");
  ob_node_named(&b, "Add", "add0", "s", 2, "x", "c");
  ob_node_named(&b, "Relu", "relu0", "y", 1, "s");
  ob_output(&b, "y");
  size_t before = es_mem_total();
  es_model *m = ob_load(&b);
  es_model_stats st;
  ES_CHECK_RC(es_model_stats_get(m, &st));
  assert_int_equal(st.folded_nodes, 2);
  assert_int_equal(st.nodes, 2);
  assert_int_equal(st.constants, 1); /* w + w^T; w itself is dropped */
  assert_int_equal(st.weight_bytes, 16);
  float *y;
  size_t n;
  model_run(m, x, 2, d22, 1, &y, &n);
  const float want[4] = {0, 5.5f, 4, 11}; /* relu(x + w^T + w) */
  assert_int_equal(n, 4);
  expect_close(y, want, 4, 0);
  free(y);
  es_model_release(m);
  assert_int_equal(es_mem_total(), before);

  /* a graph made only of constants folds away entirely */
  graph_init(&b, 2, d22);
  ob_init_f32(&b, "w", 2, d22, w);
  ob_node_named(&b, "Transpose", "t0", "y", 1, "w");
  ob_output(&b, "y");
  m = ob_load(&b);
  ES_CHECK_RC(es_model_stats_get(m, &st));
  assert_int_equal(st.nodes, 0);
  assert_int_equal(st.folded_nodes, 1);
  model_run(m, x, 2, d22, 1, &y, &n);
  const float wt[4] = {1, 3, 2, 4};
  expect_close(y, wt, 4, 0);
  free(y);
  es_model_release(m);
}

/* A kernel that cannot evaluate a constant node (ES_ENOTSUP) leaves it for
 * the planner; the load still succeeds. */
static void test_fold_enotsup_keeps_node(void **state) {
  (void)state;
  static const int64_t xd[4] = {1, 2, 1, 1}, pd[1] = {2};
  static const float v[2] = {1, 2}, one[2] = {1, 1};
  ob b;
  graph_init(&b, 4, xd);
  ob_init_f32(&b, "k", 4, xd, v);
  ob_init_f32(&b, "one", 1, pd, one);
  int bn = ob_node_named(&b, "BatchNormalization", "bn0", "c", 5, "k", "one", "one", "one", "one");
  ob_attr_int(&b, bn, "training_mode", 1);
  ob_node_named(&b, "Add", "add0", "y", 2, "x", "c");
  ob_output(&b, "y");
  size_t before = es_mem_total();
  es_model *m = ob_load(&b);
  es_model_stats st;
  ES_CHECK_RC(es_model_stats_get(m, &st));
  assert_int_equal(st.nodes, 2);
  assert_int_equal(st.folded_nodes, 0);
  es_model_release(m);
  assert_int_equal(es_mem_total(), before);
}

/* (d) Every failure after the constants are staged frees them: a fold that
 * fails (named), a cycle, and every truncation of a model that folds. */
static void test_fold_failures_leak_nothing(void **state) {
  (void)state;
  static const int64_t d22[2] = {2, 2}, d3[1] = {3};
  static const float w[4] = {1, 2, 3, 4}, k3[3] = {1, 2, 3};
  size_t before = es_mem_total();
  ob b;
  graph_init(&b, 2, d22);
  ob_init_f32(&b, "w", 2, d22, w);
  ob_init_f32(&b, "k3", 1, d3, k3);
  ob_node_named(&b, "Transpose", "t0", "t", 1, "w");
  ob_node_named(&b, "Add", "bad", "c", 2, "t", "k3"); /* [2,2] + [3] */
  ob_node_named(&b, "Add", "add0", "y", 2, "x", "c");
  ob_output(&b, "y");
  size_t size;
  uint8_t *buf = ob_pack(&b, &size);
  es_model *m = NULL;
  ES_EXPECT_RC(es_model_load_buffer(buf, size, NULL, &m), ES_EMODEL);
  if (!strstr(es_last_error_detail(), "node 'bad' (#1 Add): shapes do not broadcast"))
    fail_msg("detail: %s", es_last_error_detail());
  free(buf);
  assert_int_equal(es_mem_total(), before);

  ob cb;
  valid_model(&cb);
  cb.node_in[0][0] = "y"; /* a cycle: found after the constants are staged */
  load_expect(&cb, ES_EMODEL, "cycle");
  assert_int_equal(es_mem_total(), before);

  conv_bn t;
  conv_bn_data(&t, 5);
  conv_bn_model(&b, &t, 1, 1, 0);
  buf = ob_pack(&b, &size);
  int loaded = 0;
  for (size_t n = 0; n <= size; n++) {
    uint8_t *copy = malloc(n ? n : 1);
    memcpy(copy, buf, n);
    m = NULL;
    if (es_model_load_buffer(copy, n, NULL, &m) == 0) {
      loaded++;
      es_model_release(m);
    }
    free(copy);
  }
  free(buf);
  assert_true(loaded > 0); /* at least the whole model */
  assert_int_equal(es_mem_total(), before);
}

/* The five target models, when fetched (scripts/setup/fetch-models.sh). */
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
    skip(); /* models not fetched: scripts/setup/fetch-models.sh */
}

int main(void) {
  /* These tests check the loader, folding and pruning node by node; the
   * fusion passes (tests/engine/test_fuse.c) would merge the small graphs
   * they build, so they run without them. */
  es_engine_fusion_set(0);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_valid_model),
      cmocka_unit_test(test_weights_are_read_only),
      cmocka_unit_test(test_every_truncation_fails_cleanly),
      cmocka_unit_test(test_random_corruption_never_crashes),
      cmocka_unit_test(test_not_protobuf),
      cmocka_unit_test(test_large_weights_read_from_file),
      cmocka_unit_test(test_weights_sealed_in_place),
      cmocka_unit_test(test_weights_read_in_place_from_file),
      cmocka_unit_test(test_matmul_weights_in_place_misaligned),
      cmocka_unit_test(test_gemm_weights_in_place_misaligned),
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
      cmocka_unit_test(test_fold_conv_bn),
      cmocka_unit_test(test_bn_not_folded_when_conv_output_shared),
      cmocka_unit_test(test_fold_convtranspose_bn),
      cmocka_unit_test(test_fold_constant_chain),
      cmocka_unit_test(test_fold_enotsup_keeps_node),
      cmocka_unit_test(test_fold_failures_leak_nothing),
      cmocka_unit_test(test_real_models),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
