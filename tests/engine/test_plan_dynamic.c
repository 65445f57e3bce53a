/* Data-dependent shapes in bounded plans: models whose tensors' shapes
 * depend on input values (NonZero, NonMaxSuppression, TopK with k from a
 * shape computation over them) plan at a bound, report each bound and what
 * sets it, and run in an arena of exactly the planned size, each tensor
 * carrying its actual shape: the same plan serves inputs that select
 * nothing, some, or everything. A shape computation that shrinks as its
 * input grows outgrows its bound at run time: the run fails with ES_EBOUND
 * and the process goes on. Models are built in memory (onnx_builder). */
#include "es_test.h"

#include <math.h>
#include <string.h>

#include "edgeserve/engine.h"
#include "edgeserve/memory.h"
#include "onnx.pb-c.h"
#include "support/onnx_builder.h"

#define I64 ONNX__TENSOR_PROTO__DATA_TYPE__INT64

typedef struct run_ctx {
  es_plan *p;
  es_arena *a;
  es_tensor out[4];
} run_ctx;

/* Plans m for the inputs' shapes and runs it in an arena of exactly
 * es_plan_arena_bytes (plus the base's alignment): returns the run's code. */
static int plan_run(es_model *m, int n_in, const es_tensor *in, int n_out, run_ctx *r) {
  es_tensor_info shapes[4];
  for (int i = 0; i < n_in; i++) {
    shapes[i] = (es_tensor_info){.name = in[i].name, .dtype = in[i].dtype, .rank = in[i].rank};
    memcpy(shapes[i].dims, in[i].dims, sizeof shapes[i].dims);
  }
  ES_CHECK_RC(es_model_plan(m, shapes, n_in, &r->p));
  ES_CHECK_RC(es_arena_create(es_plan_arena_bytes(r->p), 64, &r->a));
  return es_plan_run(r->p, in, n_in, r->a, r->out, n_out);
}

static void run_done(run_ctx *r) {
  es_arena_destroy(r->a);
  es_plan_release(r->p);
}

/* x [8] -> the positive elements, their squares and their count:
 *   nz = NonZero(x > 0) [1, n]; idx = Reshape(nz, [-1]); sel = Gather(x, idx)
 *   sq = sel * sel; n = Shape(sel) */
static es_model *select_model(void) {
  ob *b = ob_new(13);
  ob_input(b, "x", 1, (int64_t[]){8});
  ob_init_f32(b, "zero", 0, NULL, (float[]){0});
  ob_init_i64(b, "flat", 1, (int64_t[]){1}, (int64_t[]){-1});
  ob_node(b, "Greater", "pos", 2, "x", "zero");
  ob_node(b, "NonZero", "nz", 1, "pos");
  ob_node(b, "Reshape", "idx", 2, "nz", "flat");
  ob_node(b, "Gather", "sel", 2, "x", "idx");
  ob_node(b, "Mul", "sq", 2, "sel", "sel");
  ob_node(b, "Shape", "n", 1, "sel");
  ob_output(b, "sel");
  ob_output(b, "sq");
  ob_output_typed(b, "n", I64);
  es_model *m = ob_load(b);
  free(b);
  return m;
}

static void check_select(es_model *m, const float *x) {
  float want[8];
  int n = 0;
  for (int i = 0; i < 8; i++)
    if (x[i] > 0)
      want[n++] = x[i];
  es_tensor in = ob_tensor_f32("x", 1, (int64_t[]){8}, x);
  run_ctx r;
  ES_CHECK_RC(plan_run(m, 1, &in, 3, &r));
  assert_int_equal(r.out[0].rank, 1);
  assert_int_equal(r.out[0].dims[0], n);
  assert_int_equal(r.out[0].nbytes, (size_t)n * sizeof(float));
  assert_int_equal(r.out[1].dims[0], n);
  for (int i = 0; i < n; i++) {
    assert_true(((float *)r.out[0].data)[i] == want[i]);
    assert_true(((float *)r.out[1].data)[i] == want[i] * want[i]);
  }
  assert_int_equal(r.out[2].dims[0], 1);
  assert_int_equal(*(int64_t *)r.out[2].data, n);
  run_done(&r);
}

/* Nothing, some and every element selected by one model; the plan's
 * outputs report their bounds and the bounded values say what sets them. */
static void test_nonzero_select(void **state) {
  (void)state;
  es_model *m = select_model();
  check_select(m, (float[]){-1, 2, -3, 4, 0, 6, -7, 0.5f});
  check_select(m, (float[]){-1, -2, -3, -4, 0, -6, -7, 0});
  check_select(m, (float[]){1, 2, 3, 4, 5, 6, 7, 8});

  es_plan *p;
  es_tensor_info s = {.name = "x", .dtype = ES_DTYPE_FLOAT, .rank = 1, .dims = {8}};
  ES_CHECK_RC(es_model_plan(m, &s, 1, &p));
  es_tensor_info oi;
  ES_CHECK_RC(es_plan_output_info(p, 0, &oi));
  assert_int_equal(oi.dims[0], 8); /* the bound */
  int nb = es_plan_bound_count(p), found = 0;
  assert_true(nb >= 5); /* nz, idx, sel, sq, n */
  for (int i = 0; i < nb; i++) {
    es_bound_info bi;
    ES_CHECK_RC(es_plan_bound_info(p, i, &bi));
    if (!strcmp(bi.value, "nz")) {
      found = 1;
      assert_non_null(strstr(bi.node, "NonZero"));
      assert_non_null(strstr(bi.why, "X's 8 elements, all non-zero"));
      assert_int_equal(bi.bound.rank, 2);
      assert_int_equal(bi.bound.dims[1], 8);
    } else {
      assert_string_equal(bi.why, ""); /* inherited */
    }
  }
  assert_true(found);
  es_bound_info bi;
  ES_EXPECT_RC(es_plan_bound_info(p, nb, &bi), ES_EINVAL);
  es_plan_release(p);
  es_model_release(m);
}

/* A detector's tail (ob_nms_tail): NonMaxSuppression keeps some boxes
 * (ONNX's suppress_by_IOU example), their boxes are gathered, and TopK
 * takes the best min(kept, 2) scores, k computed from the kept count's
 * shape. */
static es_model *nms_model(void) {
  ob *b = ob_new(13);
  ob_nms_tail(b);
  es_model *m = ob_load(b);
  free(b);
  return m;
}

static void test_nms_topk(void **state) {
  (void)state;
  es_model *m = nms_model();
  float boxes[24] = {0, 0,  1, 1,  0, 0.1f, 1, 1.1f,  0, -0.1f, 1, 0.9f,
                     0, 10, 1, 11, 0, 10.1f, 1, 11.1f, 0, 100,   1, 101};
  float scores[6] = {0.9f, 0.75f, 0.6f, 0.95f, 0.5f, 0.3f};
  es_tensor in[2] = {ob_tensor_f32("boxes", 3, (int64_t[]){1, 6, 4}, boxes),
                     ob_tensor_f32("scores", 3, (int64_t[]){1, 1, 6}, scores)};
  run_ctx r;
  ES_CHECK_RC(plan_run(m, 2, in, 2, &r));
  /* kept: boxes 3, 0, 5 (the others overlap a better one by IoU > 0.5) */
  assert_int_equal(r.out[0].rank, 3);
  assert_int_equal(r.out[0].dims[1], 3);
  const float *kb = r.out[0].data;
  assert_true(kb[1] == 10 && kb[5] == 0 && kb[9] == 100);
  assert_int_equal(r.out[1].dims[2], 2);
  assert_true(((float *)r.out[1].data)[0] == 0.95f && ((float *)r.out[1].data)[1] == 0.9f);
  /* the bound: 1 batch x 1 class x max 4 boxes */
  int nb = es_plan_bound_count(r.p), found = 0;
  for (int i = 0; i < nb; i++) {
    es_bound_info bi;
    ES_CHECK_RC(es_plan_bound_info(r.p, i, &bi));
    if (!strcmp(bi.value, "sel")) {
      found = 1;
      assert_int_equal(bi.bound.dims[0], 4);
      assert_non_null(strstr(bi.why, "max_output_boxes_per_class"));
    }
  }
  assert_true(found);
  run_done(&r);

  /* nothing above the threshold: empty outputs, k = 0 */
  memset(scores, 0, sizeof scores);
  ES_CHECK_RC(plan_run(m, 2, in, 2, &r));
  assert_int_equal(r.out[0].dims[1], 0);
  assert_int_equal(r.out[1].dims[2], 0);
  assert_int_equal(r.out[1].nbytes, 0);
  run_done(&r);
  es_model_release(m);
}

/* zeros [10 - n] for n positive elements of x [8]: planned at n = 8 (2
 * zeros), so an input with fewer positives needs more than the bound. */
static void test_bound_outgrown(void **state) {
  (void)state;
  ob *b = ob_new(13);
  ob_input(b, "x", 1, (int64_t[]){8});
  ob_init_f32(b, "zero", 0, NULL, (float[]){0});
  ob_init_i64(b, "ten", 1, (int64_t[]){1}, (int64_t[]){10});
  ob_init_i64(b, "one", 1, (int64_t[]){1}, (int64_t[]){1});
  ob_node(b, "Greater", "pos", 2, "x", "zero");
  ob_node(b, "NonZero", "nz", 1, "pos");
  ob_node(b, "Shape", "nzs", 1, "nz");
  ob_node(b, "Gather", "n", 2, "nzs", "one");
  ob_node(b, "Sub", "len", 2, "ten", "n");
  ob_node(b, "ConstantOfShape", "z", 1, "len");
  ob_output(b, "z");
  es_model *m = ob_load(b);
  free(b);
  float all[8] = {1, 1, 1, 1, 1, 1, 1, 1}, some[8] = {1, 1, 1, 0, 0, 0, 0, 0};
  es_tensor in = ob_tensor_f32("x", 1, (int64_t[]){8}, all);
  run_ctx r;
  ES_CHECK_RC(plan_run(m, 1, &in, 1, &r));
  assert_int_equal(r.out[0].dims[0], 2);
  run_done(&r);
  in.data = some;
  ES_EXPECT_RC(plan_run(m, 1, &in, 1, &r), ES_EBOUND);
  assert_non_null(strstr(es_last_error_detail(), "ConstantOfShape"));
  run_done(&r);
  /* the model still serves inputs within the bound */
  in.data = all;
  ES_CHECK_RC(plan_run(m, 1, &in, 1, &r));
  run_done(&r);
  es_model_release(m);
}

/* A plan without data-dependent shapes has no bounds and no extra bytes. */
static void test_static_plan_unchanged(void **state) {
  (void)state;
  ob *b = ob_new(13);
  ob_input(b, "x", 1, (int64_t[]){8});
  ob_node(b, "Relu", "y", 1, "x");
  ob_output(b, "y");
  es_model *m = ob_load(b);
  free(b);
  es_plan *p;
  es_tensor_info s = {.name = "x", .dtype = ES_DTYPE_FLOAT, .rank = 1, .dims = {8}};
  ES_CHECK_RC(es_model_plan(m, &s, 1, &p));
  assert_int_equal(es_plan_bound_count(p), 0);
  assert_int_equal(es_plan_arena_bytes(p), 64); /* y alone */
  es_plan_release(p);
  es_model_release(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_nonzero_select),
      cmocka_unit_test(test_nms_topk),
      cmocka_unit_test(test_bound_outgrown),
      cmocka_unit_test(test_static_plan_unchanged),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
