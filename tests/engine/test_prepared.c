/* Prepared weights in a plan (es__prep_batch_*, src/kernels/registry.c):
 * a plan fills every copy it asks for into one region (one mapping, not
 * one per node), a second plan of the same shapes adds nothing, a conv
 * folded while planning finds its weights filled before it runs, and two
 * threads planning one model at once prepare each copy once. Results are
 * checked against the reference kernels, which prepare nothing. Models
 * are built in memory (tests/support/onnx_builder.h). */
#include "es_test.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

#include "edgeserve/engine.h"
#include "support/onnx_builder.h"

enum { C = 16, HW = 12 };

static float w1_[32 * C * 9], w2_[32 * 32 * 9], w3_[C * 32 * 9], b3_[C];
static float fill_one_ = 1.0f;

static void weights_init(void) {
  uint64_t s = 7;
  es_test_fill_small(w1_, sizeof w1_ / 4, &s);
  es_test_fill_small(w2_, sizeof w2_ / 4, &s);
  es_test_fill_small(w3_, sizeof w3_ / 4, &s);
  es_test_fill_small(b3_, sizeof b3_ / 4, &s);
}

/* x [1, 16, H, W] -> three 3x3 convs (16 -> 32 -> 32 -> 16) -> y. */
static void chain_model(ob *b) { ob_conv_chain(b, C, w1_, w2_, w3_, b3_); }

/* y = Conv(ConstantOfShape(Shape(x)), W3) + x[:, :16]: the conv's input
 * is known only once the plan knows x's shape (H and W are free), so the
 * plan folds the conv, which needs its prepared weights right then. */
static void folded_model(ob *b) {
  static const int64_t xd[4] = {1, 32, -1, -1}, d3[4] = {C, 32, 3, 3}, db[1] = {C},
                       one_d[1] = {1}, starts[1] = {0}, ends[1] = {C}, axes[1] = {1};
  static Onnx__TensorProto one;
  onnx__tensor_proto__init(&one);
  one.has_data_type = 1;
  one.data_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
  one.n_dims = 1;
  one.dims = (int64_t *)one_d;
  one.n_float_data = 1;
  one.float_data = &fill_one_;
  ob_init(b, 13);
  ob_input(b, "x", 4, xd);
  ob_init_f32(b, "W3", 4, d3, w3_);
  ob_init_f32(b, "B3", 1, db, b3_);
  ob_init_i64(b, "st", 1, one_d, starts);
  ob_init_i64(b, "en", 1, one_d, ends);
  ob_init_i64(b, "ax", 1, one_d, axes);
  ob_node(b, "Shape", "s", 1, "x");
  ob_attr_tensor(b, ob_node(b, "ConstantOfShape", "ones", 1, "s"), "value", &one);
  ob_conv3x3(b, "k", "ones", "W3", "B3");
  ob_node(b, "Slice", "xs", 4, "x", "st", "en", "ax");
  ob_node(b, "Add", "y", 2, "k", "xs");
  ob_output(b, "y");
}

static uint64_t weights_allocs(void) {
  es_mem_stats st;
  es_mem_stats_get(ES_MEM_WEIGHTS, &st);
  return st.allocs;
}

static size_t prepared_bytes(es_model *m) {
  es_model_stats st;
  ES_CHECK_RC(es_model_stats_get(m, &st));
  return st.prepared_bytes;
}

static float *input_of(int c, int h, int w, size_t *n) {
  *n = (size_t)c * h * w;
  float *x = malloc(*n * sizeof *x);
  assert_non_null(x);
  uint64_t s = 11;
  for (size_t i = 0; i < *n; i++)
    x[i] = (float)(es_test_rand(&s) % 2001) / 1000.0f - 1.0f;
  return x;
}

/* The model's output for x by the reference kernels (nothing prepared). */
static float *reference_out(const ob *b, const es_tensor *x, size_t *count) {
  es_engine_reference_kernels_set(1);
  es_model *m = ob_load(b);
  float *out;
  ob_run(m, 1, x, 1, &out, count);
  es_model_release(m);
  es_engine_reference_kernels_set(0);
  return out;
}

static void assert_close(const float *a, const float *b, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (fabsf(a[i] - b[i]) > 1e-4f)
      fail_msg("element %zu: %g, want %g", i, (double)a[i], (double)b[i]);
}

/* What every test runs: a model built by build, loaded, and an input of
 * 1 x c x h x w named "x". */
typedef struct case_ {
  ob *b;
  es_model *m;
  float *x;
  es_tensor in;
  float *want;      /* the reference kernels' output, made once when asked */
  size_t want_count;
} case_;

static void case_open(case_ *t, void (*build)(ob *), int c, int h, int w) {
  t->b = malloc(sizeof *t->b);
  assert_non_null(t->b);
  build(t->b);
  t->m = ob_load(t->b);
  size_t n;
  t->x = input_of(c, h, w, &n);
  t->in = ob_tensor_f32("x", 4, (int64_t[]){1, c, h, w}, t->x);
  t->want = NULL;
}

static void case_close(case_ *t) {
  free(t->want);
  free(t->x);
  es_model_release(t->m);
  free(t->b);
}

/* out (count values) is what the reference kernels give for the case's
 * input; out is freed. */
static void expect_reference(case_ *t, float *out, size_t count) {
  if (!t->want)
    t->want = reference_out(t->b, &t->in, &t->want_count);
  assert_int_equal(count, t->want_count);
  assert_close(out, t->want, count);
  free(out);
}

static void test_one_region_per_plan(void **state) {
  (void)state;
  case_ t;
  case_open(&t, chain_model, C, HW, HW);
  es_model *m = t.m;
  assert_int_equal(prepared_bytes(m), 0);

  /* Three convs ask for blocked weights: one region (its handle and its
   * mapping) holds all three, where each used to get its own. */
  uint64_t a0 = weights_allocs();
  float *out;
  size_t count, again_count;
  ob_run(m, 1, &t.in, 1, &out, &count);
  assert_int_equal(weights_allocs() - a0, 2);
  size_t bytes = prepared_bytes(m);
  size_t plain = sizeof w1_ + sizeof w2_ + sizeof w3_;
  assert_true(bytes >= plain);
  assert_true(bytes < plain + 3 * 4096); /* packed, not a page-rounded region each */

  /* The same shapes again: everything is in the store already. */
  float *again;
  ob_run(m, 1, &t.in, 1, &again, &again_count);
  assert_int_equal(weights_allocs() - a0, 2);
  assert_int_equal(prepared_bytes(m), bytes);

  expect_reference(&t, out, count);
  expect_reference(&t, again, again_count);
  case_close(&t);
}

static void test_folded_conv_gets_its_weights(void **state) {
  (void)state;
  case_ t;
  case_open(&t, folded_model, 32, 5, 7);
  float *out;
  size_t count;
  ob_run(t.m, 1, &t.in, 1, &out, &count);
  assert_true(prepared_bytes(t.m) >= sizeof w3_);
  assert_int_equal(count, (size_t)C * 5 * 7);
  expect_reference(&t, out, count);
  case_close(&t);
}

typedef struct plan_job {
  es_model *m;
  const es_tensor *in;
  float *out;
  size_t count;
} plan_job;

static void *plan_thread(void *arg) {
  plan_job *j = arg;
  ob_run(j->m, 1, j->in, 1, &j->out, &j->count);
  return NULL;
}

/* Both plans ask for the same three copies; whichever commits second finds
 * them stored and fills nothing. */
static void test_two_plans_at_once(void **state) {
  (void)state;
  case_ t;
  case_open(&t, chain_model, C, HW, HW);
  uint64_t a0 = weights_allocs();
  plan_job j[2] = {{t.m, &t.in, NULL, 0}, {t.m, &t.in, NULL, 0}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++)
    assert_int_equal(pthread_create(&th[i], NULL, plan_thread, &j[i]), 0);
  for (int i = 0; i < 2; i++)
    pthread_join(th[i], NULL);
  assert_int_equal(weights_allocs() - a0, 2);
  for (int i = 0; i < 2; i++)
    expect_reference(&t, j[i].out, j[i].count);
  case_close(&t);
}

int main(void) {
  weights_init();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_one_region_per_plan),
      cmocka_unit_test(test_folded_conv_gets_its_weights),
      cmocka_unit_test(test_two_plans_at_once),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
