/* Layouts through the planner, on a small 3-D network built in memory: a
 * conv stem, a residual block, 3-D max and average pools, a Concat (a
 * layout-aware kernel written for rank 4 only), a global pool, Flatten,
 * and a rank-5 graph output.
 *
 * On oneDNN the convs, pools and elementwise ops keep NDHWC between them:
 * the plan converts the input once, the Concat's two inputs back to plain
 * (the kernel does not take rank-5 channels-last tensors, so the planner
 * converts them before it asks), and the rank-5 output leaves plain
 * through the copy the Concat already reads; the reference kernels run
 * everything plain with no conversion. Both plans must give the same
 * outputs (within float rounding of different summation orders), and each
 * run must use exactly the arena bytes its plan promised. With fusion off
 * the Add and Relu run as their own nodes, still in NDHWC. */
#include "es_test.h"

#include <math.h>
#include <string.h>

#include "edgeserve/engine.h"
#include "edgeserve/memory.h"
#include "support/onnx_builder.h"

static float w1_[8 * 5 * 27], b1_[8], w2_[8 * 8 * 27], b2_[8];

static void fill(float *v, size_t n, uint64_t *s, float scale) {
  for (size_t i = 0; i < n; i++)
    v[i] = ((float)(es_test_rand(s) % 2001) / 1000.0f - 1.0f) * scale;
}

/* x [1,5,6,7,8] -> Conv 3x3x3 (8) -> Relu -> Conv 3x3x3 -> Add r1 -> Relu
 * -> MaxPool 2x2x2 stride 2 ("mp") -> AveragePool 3x3x3 pad 1 ("ap");
 * Concat(mp, ap) -> GlobalAveragePool -> Flatten ("f"). Outputs f, ap. */
static es_model *build(void) {
  uint64_t s = 7;
  fill(w1_, sizeof w1_ / sizeof *w1_, &s, 0.3f);
  fill(b1_, 8, &s, 0.1f);
  fill(w2_, sizeof w2_ / sizeof *w2_, &s, 0.2f);
  fill(b2_, 8, &s, 0.1f);
  static const int64_t xd[5] = {1, 5, 6, 7, 8}, w1d[5] = {8, 5, 3, 3, 3},
                       w2d[5] = {8, 8, 3, 3, 3}, bd[1] = {8}, pads1[6] = {1, 1, 1, 1, 1, 1},
                       k2[3] = {2, 2, 2}, k3[3] = {3, 3, 3};
  ob *b = ob_new(13);
  ob_input(b, "x", 5, xd);
  ob_init_f32(b, "W1", 5, w1d, w1_);
  ob_init_f32(b, "B1", 1, bd, b1_);
  ob_init_f32(b, "W2", 5, w2d, w2_);
  ob_init_f32(b, "B2", 1, bd, b2_);
  int n = ob_node(b, "Conv", "c1", 3, "x", "W1", "B1");
  ob_attr_ints(b, n, "pads", 6, pads1);
  ob_node(b, "Relu", "r1", 1, "c1");
  n = ob_node(b, "Conv", "c2", 3, "r1", "W2", "B2");
  ob_attr_ints(b, n, "pads", 6, pads1);
  ob_node(b, "Add", "a", 2, "c2", "r1");
  ob_node(b, "Relu", "r2", 1, "a");
  n = ob_node(b, "MaxPool", "mp", 1, "r2");
  ob_attr_ints(b, n, "kernel_shape", 3, k2);
  ob_attr_ints(b, n, "strides", 3, k2);
  n = ob_node(b, "AveragePool", "ap", 1, "mp");
  ob_attr_ints(b, n, "kernel_shape", 3, k3);
  ob_attr_ints(b, n, "pads", 6, pads1);
  n = ob_node(b, "Concat", "cat", 2, "mp", "ap");
  ob_attr_int(b, n, "axis", 1);
  ob_node(b, "GlobalAveragePool", "g", 1, "cat");
  ob_node(b, "Flatten", "f", 1, "g");
  ob_output(b, "f");
  ob_output(b, "ap");
  es_model *m = ob_load(b);
  free(b);
  return m;
}

typedef struct result {
  float *out[2];
  size_t count[2];
  int relayouts;
} result;

/* Plans and runs m on x in an arena of exactly the planned size, which the
 * run must use to the byte. */
static void run(es_model *m, const float *x, result *r) {
  static const int64_t xd[5] = {1, 5, 6, 7, 8};
  es_tensor in = ob_tensor_f32("x", 5, xd, x);
  es_tensor_info shape = {.name = "x", .dtype = ES_DTYPE_FLOAT, .rank = 5};
  memcpy(shape.dims, xd, sizeof xd);
  es_plan *p;
  ES_CHECK_RC(es_model_plan(m, &shape, 1, &p));
  size_t bytes = es_plan_arena_bytes(p);
  es_arena *a;
  ES_CHECK_RC(es_arena_create(bytes, 64, &a));
  es_tensor outs[2];
  ES_CHECK_RC(es_plan_run(p, &in, 1, a, outs, 2));
  assert_int_equal(es_arena_used(a), bytes);
  r->relayouts = es_plan_relayout_count(p);
  for (int i = 0; i < 2; i++) {
    r->count[i] = outs[i].nbytes / sizeof(float);
    r->out[i] = malloc(outs[i].nbytes + 4);
    assert_non_null(r->out[i]);
    memcpy(r->out[i], outs[i].data, outs[i].nbytes);
  }
  assert_int_equal(outs[0].rank, 2);
  assert_int_equal(outs[1].rank, 5);
  es_arena_destroy(a);
  es_plan_release(p);
}

static void expect_same(const result *a, const result *b) {
  for (int i = 0; i < 2; i++) {
    assert_int_equal(a->count[i], b->count[i]);
    for (size_t j = 0; j < a->count[i]; j++)
      if (!(fabsf(a->out[i][j] - b->out[i][j]) <= 1e-4f * (1 + fabsf(b->out[i][j]))))
        fail_msg("output %d [%zu]: %.9g, reference %.9g", i, j, (double)a->out[i][j],
                 (double)b->out[i][j]);
  }
}

static void result_free(result *r) {
  free(r->out[0]);
  free(r->out[1]);
}

static void test_ndhwc_plan(void **state) {
  (void)state;
  float x[1 * 5 * 6 * 7 * 8];
  uint64_t s = 11;
  fill(x, sizeof x / sizeof *x, &s, 1.0f);
  for (int fuse = 1; fuse >= 0; fuse--) {
    es_engine_fusion_set(fuse);
    es_model *m = build();
    result ref, dnnl;
    es_engine_reference_kernels_set(1);
    run(m, x, &ref);
    es_engine_reference_kernels_set(0);
    run(m, x, &dnnl);
    es_model_release(m);
    /* x to NDHWC; mp and ap to plain for the Concat (ap's plain copy is
     * also the graph output). */
    assert_int_equal(ref.relayouts, 0);
    assert_int_equal(dnnl.relayouts, 3);
    expect_same(&dnnl, &ref);
    result_free(&ref);
    result_free(&dnnl);
  }
  es_engine_fusion_set(1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ndhwc_plan),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
