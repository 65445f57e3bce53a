/* Conv, ConvTranspose and MatMul kernels evaluated one node at a time.
 *
 * Hand-checked small cases pin the reference loops down; then a grid of the
 * configurations the target models use (1x1, 3x3, 5x5, 1x3, depthwise,
 * dilations 2 and 5, strides 2 and (2, 1), asymmetric pads, with and
 * without bias, ConvTranspose 2x2 stride 2, batched MatMul) runs on random
 * inputs through both the oneDNN path and the reference path, which must
 * agree within 1e-4 of the output's range. Error cases must fail with the
 * right code; prepared weights must be shared between two plans of one
 * node; one planned node must serve two threads at once.
 *
 * Layouts go through hand-built instances that act as the planner does
 * (converting the inputs a kernel asks for, once): 2-D and 3-D convs on
 * oneDNN run channels-last (NHWC, NDHWC; asking for X so inside a plan),
 * the reference path, 1-D and refused geometries run plain; outputs are
 * compared in plain order. Fused post-ops ("_post" / "_post_f") are checked
 * code by code and in combinations, on both paths and with channels-last
 * residuals, against the ops applied naively after the unfused conv; a
 * residual Add that comes first (oneDNN's sum) also with Y in the
 * residual's own buffer. */
#include "es_test.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

#include "kernels/kernel.h"
#include "model/graph.h"
#include "support/kernel_harness.h"

static uint64_t seed_;

/* ==========================================================================
 * Node building
 * ======================================================================== */

static float *rand_floats(size_t n) {
  float *v = es_mem_alloc(ES_MEM_OTHER, n ? n * sizeof *v : 1);
  assert_non_null(v);
  kh_rand_f32(&seed_, v, n, -1.0f, 1.0f);
  return v;
}

static int eval(kh_node *t, int n_in, const es_tdesc *const *in, const void *const *data,
                es_tdesc *od, void **o) {
  return kh_eval(&t->node, 13, n_in, in, data, od, o);
}

/* Evaluates through oneDNN and through the reference loops; both must
 * succeed and agree within 1e-4 of the reference output's range. */
static void eval_both(const char *what, kh_node *t, int n_in, const es_tdesc *const *in,
                      const void *const *data, es_tdesc *want_shape) {
  es_tdesc od[2];
  void *o[2];
  for (int ref = 0; ref < 2; ref++) {
    es__kernels_use_reference(ref);
    int rc = eval(t, n_in, in, data, &od[ref], &o[ref]);
    if (rc != 0)
      fail_msg("%s (%s): %s %s", what, ref ? "reference" : "oneDNN", es_err_name(rc),
               es_last_error_detail());
  }
  es__kernels_use_reference(0);
  assert_true(es__tdesc_same_shape(&od[0], &od[1]));
  if (want_shape)
    assert_true(es__tdesc_same_shape(&od[0], want_shape));
  const float *a = o[0], *b = o[1];
  float lo = INFINITY, hi = -INFINITY, err = 0;
  for (size_t i = 0; i < od[0].count; i++) {
    lo = fminf(lo, b[i]);
    hi = fmaxf(hi, b[i]);
    err = fmaxf(err, fabsf(a[i] - b[i]));
  }
  float range = od[0].count ? hi - lo : 0;
  if (!(err <= 1e-4f * (range > 1e-3f ? range : 1e-3f)))
    fail_msg("%s: oneDNN and reference differ by %g (output range %g)", what, (double)err,
             (double)range);
  es_mem_free(o[0]);
  es_mem_free(o[1]);
}

/* ==========================================================================
 * Hand-checked cases
 * ======================================================================== */

static void test_conv_known(void **state) {
  (void)state;
  /* ONNX's basic example: 5x5 ramp, 3x3 ones, pad 1. */
  static const float want[25] = {12,  21,  27,  33,  24,  33,  54,  63,  72,  51,  63, 99, 108,
                                 117, 81,  93,  144, 153, 162, 111, 72,  111, 117, 123, 84};
  int64_t xd[4] = {1, 1, 5, 5}, wd[4] = {1, 1, 3, 3}, pads[4] = {1, 1, 1, 1};
  float x[25], w[9];
  for (int i = 0; i < 25; i++)
    x[i] = (float)i;
  for (int i = 0; i < 9; i++)
    w[i] = 1;
  es_tdesc xt = kh_td(ES_DTYPE_FLOAT, 4, xd), wt = kh_td(ES_DTYPE_FLOAT, 4, wd), od;
  const es_tdesc *in[2] = {&xt, &wt};
  const void *data[2] = {x, w};
  kh_node t;
  kh_node_init(&t, ES_OP_Conv);
  kh_attr_ints(&t, "pads", pads, 4);
  for (int ref = 0; ref < 2; ref++) {
    es__kernels_use_reference(ref);
    void *o;
    ES_CHECK_RC(eval(&t, 2, in, data, &od, &o));
    assert_int_equal(od.count, 25);
    for (int i = 0; i < 25; i++)
      assert_float_equal(((float *)o)[i], want[i], 1e-4);
    es_mem_free(o);
  }
  es__kernels_use_reference(0);
}

static void test_convtranspose_known(void **state) {
  (void)state;
  /* 2x2 stride 2 with a ramp kernel: each input pixel writes its own 2x2
   * block scaled by the kernel; plus bias 0.5. */
  int64_t xd[4] = {1, 1, 2, 2}, wd[4] = {1, 1, 2, 2}, bd[1] = {1}, sd[2] = {2, 2};
  float x[4] = {1, 2, 3, 4}, w[4] = {1, 2, 3, 4}, b[1] = {0.5f};
  es_tdesc xt = kh_td(ES_DTYPE_FLOAT, 4, xd), wt = kh_td(ES_DTYPE_FLOAT, 4, wd),
           bt = kh_td(ES_DTYPE_FLOAT, 1, bd), od;
  const es_tdesc *in[3] = {&xt, &wt, &bt};
  const void *data[3] = {x, w, b};
  kh_node t;
  kh_node_init(&t, ES_OP_ConvTranspose);
  kh_attr_ints(&t, "strides", sd, 2);
  for (int ref = 0; ref < 2; ref++) {
    es__kernels_use_reference(ref);
    void *o;
    ES_CHECK_RC(eval(&t, 3, in, data, &od, &o));
    assert_int_equal(od.dims[2], 4);
    assert_int_equal(od.dims[3], 4);
    for (int oh = 0; oh < 4; oh++)
      for (int ow = 0; ow < 4; ow++) {
        float v = x[(oh / 2) * 2 + ow / 2] * w[(oh % 2) * 2 + ow % 2] + 0.5f;
        assert_float_equal(((float *)o)[oh * 4 + ow], v, 1e-5);
      }
    es_mem_free(o);
  }
  es__kernels_use_reference(0);
}

static void test_matmul_known(void **state) {
  (void)state;
  int64_t d2[2] = {2, 2}, d1[1] = {2};
  float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, v[2] = {1, -1};
  es_tdesc at = kh_td(ES_DTYPE_FLOAT, 2, d2), vt = kh_td(ES_DTYPE_FLOAT, 1, d1), od;
  kh_node t;
  kh_node_init(&t, ES_OP_MatMul);
  for (int ref = 0; ref < 2; ref++) {
    es__kernels_use_reference(ref);
    void *o;
    const es_tdesc *in[2] = {&at, &at};
    const void *data[2] = {a, b};
    ES_CHECK_RC(eval(&t, 2, in, data, &od, &o));
    static const float want[4] = {19, 22, 43, 50};
    assert_int_equal(od.rank, 2);
    for (int i = 0; i < 4; i++)
      assert_float_equal(((float *)o)[i], want[i], 1e-5);
    es_mem_free(o);
    /* 1-D on the left: [2] x [2, 2] -> [2]. */
    in[0] = &vt, data[0] = v;
    ES_CHECK_RC(eval(&t, 2, in, data, &od, &o));
    assert_int_equal(od.rank, 1);
    assert_float_equal(((float *)o)[0], -2, 1e-5);
    assert_float_equal(((float *)o)[1], -2, 1e-5);
    es_mem_free(o);
    /* 1-D on both sides: a scalar. */
    in[1] = &vt, data[1] = v;
    ES_CHECK_RC(eval(&t, 2, in, data, &od, &o));
    assert_int_equal(od.rank, 0);
    assert_float_equal(((float *)o)[0], 2, 1e-5);
    es_mem_free(o);
  }
  es__kernels_use_reference(0);
}

/* ==========================================================================
 * oneDNN versus reference on the target models' configurations
 * ======================================================================== */

typedef struct cconf {
  const char *name;
  int transpose, nsp;
  int64_t n, c, m, group;
  int64_t sp[3], k[3], st[3], dl[3], pads[6], outpad[3], outshape[3];
  int bias, kernel_shape;
  const char *auto_pad;
} cconf;

/* X's and W's dims for a configuration (rank 2 + nsp). */
static void conf_dims(const cconf *cf, int64_t *xd, int64_t *wd) {
  xd[0] = cf->n, xd[1] = cf->c;
  if (!cf->transpose)
    wd[0] = cf->m, wd[1] = cf->c / cf->group;
  else
    wd[0] = cf->c, wd[1] = cf->m / cf->group;
  for (int i = 0; i < cf->nsp; i++) {
    xd[2 + i] = cf->sp[i];
    wd[2 + i] = cf->k[i];
  }
}

static void run_conf(const cconf *cf) {
  int nsp = cf->nsp;
  int64_t xd[5], wd[5], bd[1] = {cf->m};
  conf_dims(cf, xd, wd);
  es_tdesc xt = kh_td(ES_DTYPE_FLOAT, 2 + nsp, xd), wt = kh_td(ES_DTYPE_FLOAT, 2 + nsp, wd),
           bt = kh_td(ES_DTYPE_FLOAT, 1, bd);
  float *x = rand_floats(xt.count), *w = rand_floats(wt.count), *b = rand_floats(bt.count);
  const es_tdesc *in[3] = {&xt, &wt, &bt};
  const void *data[3] = {x, w, b};
  kh_node t;
  kh_node_init(&t, cf->transpose ? ES_OP_ConvTranspose : ES_OP_Conv);
  int64_t ones[3] = {1, 1, 1};
  kh_attr_ints(&t, "strides", cf->st[0] ? cf->st : ones, (size_t)nsp);
  kh_attr_ints(&t, "dilations", cf->dl[0] ? cf->dl : ones, (size_t)nsp);
  if (cf->auto_pad)
    kh_attr_str(&t, "auto_pad", cf->auto_pad);
  else
    kh_attr_ints(&t, "pads", cf->pads, 2 * (size_t)nsp);
  if (cf->group != 1)
    kh_attr_int(&t, "group", cf->group);
  if (cf->kernel_shape)
    kh_attr_ints(&t, "kernel_shape", cf->k, (size_t)nsp);
  if (cf->outpad[0] || cf->outpad[1] || cf->outpad[2])
    kh_attr_ints(&t, "output_padding", cf->outpad, (size_t)nsp);
  if (cf->outshape[0])
    kh_attr_ints(&t, "output_shape", cf->outshape, (size_t)nsp);
  eval_both(cf->name, &t, cf->bias ? 3 : 2, in, data, NULL);
  es_mem_free(x);
  es_mem_free(w);
  es_mem_free(b);
}

static void test_conv_grid(void **state) {
  (void)state;
  static const cconf confs[] = {
      {"1x1", 0, 2, 1, 16, 24, 1, {9, 11}, {1, 1}, .bias = 1},
      {"3x3 pad 1", 0, 2, 1, 8, 16, 1, {10, 12}, {3, 3}, .pads = {1, 1, 1, 1}, .bias = 1},
      {"3x3 no bias, batch 2", 0, 2, 2, 8, 8, 1, {7, 9}, {3, 3}, .pads = {1, 1, 1, 1}},
      {"5x5 pad 2", 0, 2, 1, 8, 8, 1, {12, 12}, {5, 5}, .pads = {2, 2, 2, 2}, .bias = 1,
       .kernel_shape = 1},
      {"1x3", 0, 2, 1, 8, 12, 1, {9, 10}, {1, 3}, .pads = {0, 1, 0, 1}, .bias = 1},
      {"depthwise 3x3", 0, 2, 1, 16, 16, 16, {10, 10}, {3, 3}, .pads = {1, 1, 1, 1}, .bias = 1},
      {"depthwise 5x5 stride 2", 0, 2, 1, 16, 16, 16, {15, 14}, {5, 5}, {2, 2},
       .pads = {2, 2, 2, 2}, .bias = 1},
      {"depthwise x2 multiplier", 0, 2, 1, 8, 16, 8, {9, 9}, {3, 3}, .pads = {1, 1, 1, 1}},
      {"group 2", 0, 2, 1, 8, 12, 2, {9, 9}, {3, 3}, .pads = {1, 1, 1, 1}, .bias = 1},
      {"dilation 2", 0, 2, 1, 8, 8, 1, {16, 16}, {3, 3}, .dl = {2, 2}, .pads = {2, 2, 2, 2},
       .bias = 1},
      {"dilation 5", 0, 2, 1, 8, 8, 1, {20, 22}, {3, 3}, .dl = {5, 5}, .pads = {5, 5, 5, 5},
       .bias = 1},
      {"stride 2", 0, 2, 1, 8, 16, 1, {17, 16}, {3, 3}, {2, 2}, .pads = {1, 1, 1, 1}, .bias = 1},
      {"stride (2,1)", 0, 2, 1, 8, 16, 1, {16, 20}, {3, 3}, {2, 1}, .pads = {1, 1, 1, 1},
       .bias = 1},
      {"asymmetric pads", 0, 2, 1, 8, 8, 1, {11, 13}, {3, 3}, .pads = {0, 1, 2, 0}, .bias = 1},
      {"first layer 3->16 stride 2", 0, 2, 1, 3, 16, 1, {32, 30}, {3, 3}, {2, 2},
       .pads = {1, 1, 1, 1}, .bias = 1},
      {"SAME_UPPER stride 2", 0, 2, 1, 4, 8, 1, {9, 10}, {3, 3}, {2, 2}, .bias = 1,
       .auto_pad = "SAME_UPPER"},
      {"SAME_LOWER", 0, 2, 1, 4, 8, 1, {8, 7}, {4, 4}, .auto_pad = "SAME_LOWER"},
      {"VALID", 0, 2, 1, 4, 8, 1, {8, 7}, {3, 2}, .auto_pad = "VALID"},
      {"1-D", 0, 1, 2, 4, 6, 1, {20}, {3}, {2}, .pads = {1, 0}, .bias = 1},
      {"3-D", 0, 3, 1, 2, 4, 1, {5, 6, 7}, {3, 3, 3}, .pads = {1, 0, 1, 1, 1, 0}, .bias = 1},
      {"convT 2x2 stride 2", 1, 2, 1, 16, 8, 1, {10, 12}, {2, 2}, {2, 2}, .bias = 1},
      {"convT 3x3 stride 2 pad 1 outpad 1", 1, 2, 1, 8, 4, 1, {7, 6}, {3, 3}, {2, 2},
       .pads = {1, 1, 1, 1}, .outpad = {1, 1}, .bias = 1},
      {"convT group 2 dilation 2", 1, 2, 1, 8, 6, 2, {5, 6}, {3, 3}, {1, 1}, {2, 2},
       .pads = {1, 0, 0, 1}},
      {"convT output_shape", 1, 2, 1, 4, 4, 1, {5, 5}, {3, 3}, {2, 2}, .outshape = {12, 11},
       .bias = 1},
      {"convT SAME_UPPER", 1, 2, 1, 4, 4, 1, {5, 4}, {3, 3}, {2, 2}, .auto_pad = "SAME_UPPER"},
      {"convT 1-D", 1, 1, 2, 4, 3, 1, {9}, {4}, {3}, .pads = {1, 2}, .bias = 1},
      /* Geometries oneDNN refuses (a negative begin pad; an end pad of
       * -stride): both paths take the reference loops. */
      {"convT output_shape +2", 1, 2, 1, 4, 4, 1, {5, 5}, {3, 3}, {2, 2}, .outshape = {13, 11}},
      {"convT output_padding = stride", 1, 2, 1, 4, 4, 1, {5, 5}, {3, 3}, {2, 2},
       .outpad = {2, 0}, .bias = 1},
  };
  for (size_t i = 0; i < sizeof confs / sizeof confs[0]; i++)
    run_conf(&confs[i]);
}

static void matmul_case(const char *what, int ra, const int64_t *da, int rb, const int64_t *db,
                        int rw, const int64_t *dw) {
  es_tdesc at = kh_td(ES_DTYPE_FLOAT, ra, da), bt = kh_td(ES_DTYPE_FLOAT, rb, db),
           want = kh_td(ES_DTYPE_FLOAT, rw, dw);
  float *a = rand_floats(at.count), *b = rand_floats(bt.count);
  const es_tdesc *in[2] = {&at, &bt};
  const void *data[2] = {a, b};
  kh_node t;
  kh_node_init(&t, ES_OP_MatMul);
  eval_both(what, &t, 2, in, data, &want);
  es_mem_free(a);
  es_mem_free(b);
}

static void test_matmul_grid(void **state) {
  (void)state;
  {
    int64_t a[4] = {1, 8, 25, 32}, b[4] = {1, 8, 32, 25}, w[4] = {1, 8, 25, 25};
    matmul_case("attention 4-D", 4, a, 4, b, 4, w);
  }
  {
    int64_t a[3] = {2, 25, 64}, b[2] = {64, 48}, w[3] = {2, 25, 48};
    matmul_case("projection 3-D x 2-D", 3, a, 2, b, 3, w);
  }
  {
    int64_t a[2] = {33, 17}, b[2] = {17, 70}, w[2] = {33, 70};
    matmul_case("2-D", 2, a, 2, b, 2, w);
  }
  {
    int64_t a[4] = {3, 1, 5, 6}, b[3] = {4, 6, 7}, w[4] = {3, 4, 5, 7};
    matmul_case("broadcast both", 4, a, 3, b, 4, w);
  }
  {
    int64_t a[2] = {5, 6}, b[3] = {3, 6, 7}, w[3] = {3, 5, 7};
    matmul_case("broadcast A", 2, a, 3, b, 3, w);
  }
  {
    int64_t a[1] = {6}, b[3] = {2, 6, 7}, w[2] = {2, 7};
    matmul_case("1-D x 3-D", 1, a, 3, b, 2, w);
  }
  {
    int64_t a[3] = {2, 5, 6}, b[1] = {6}, w[2] = {2, 5};
    matmul_case("3-D x 1-D", 3, a, 1, b, 2, w);
  }
  {
    int64_t a[3] = {2, 0, 6}, b[2] = {6, 3}, w[3] = {2, 0, 3};
    matmul_case("empty M", 3, a, 2, b, 3, w);
  }
  {
    int64_t a[2] = {4, 0}, b[2] = {0, 3}, w[2] = {4, 3};
    matmul_case("K = 0", 2, a, 2, b, 2, w);
  }
}

/* ==========================================================================
 * Errors
 * ======================================================================== */

/* Conv with X [n, c, 8, 8] (or as given), W [m, wc, 3, 3]; expects rc. */
static void conv_expect(kh_node *t, int xrank, const int64_t *xd, int wrank, const int64_t *wd,
                        int with_w_data, es_dtype xdt, int want) {
  es_tdesc xt = kh_td(xdt, xrank, xd), wt = kh_td(ES_DTYPE_FLOAT, wrank, wd), od;
  float *x = rand_floats(xt.count * 2), *w = rand_floats(wt.count);
  const es_tdesc *in[2] = {&xt, &wt};
  const void *data[2] = {x, with_w_data ? w : NULL};
  void *o;
  for (int ref = 0; ref < 2; ref++) {
    es__kernels_use_reference(ref);
    ES_EXPECT_RC(eval(t, 2, in, data, &od, &o), want);
    if (want == 0)
      es_mem_free(o);
  }
  es__kernels_use_reference(0);
  es_mem_free(x);
  es_mem_free(w);
}

static void test_conv_errors(void **state) {
  (void)state;
  int64_t x4[4] = {1, 8, 8, 8}, w4[4] = {16, 8, 3, 3};
  kh_node t;
  kh_node_init(&t, ES_OP_Conv);
  conv_expect(&t, 4, x4, 4, w4, 1, ES_DTYPE_FLOAT, 0);
  /* Channel mismatch: W expects 4 input channels, X has 8. */
  int64_t w_c4[4] = {16, 4, 3, 3};
  conv_expect(&t, 4, x4, 4, w_c4, 1, ES_DTYPE_FLOAT, ES_EMODEL);
  /* Group not dividing C. */
  int64_t x6[4] = {1, 6, 8, 8}, w6[4] = {4, 1, 3, 3};
  kh_attr_int(&t, "group", 4);
  conv_expect(&t, 4, x6, 4, w6, 1, ES_DTYPE_FLOAT, ES_EMODEL);
  /* Group dividing C but not M. */
  kh_node_init(&t, ES_OP_Conv);
  kh_attr_int(&t, "group", 2);
  int64_t w_m3[4] = {3, 4, 3, 3};
  conv_expect(&t, 4, x4, 4, w_m3, 1, ES_DTYPE_FLOAT, ES_EMODEL);
  /* Group 0. */
  t.attrs[0].i = 0;
  conv_expect(&t, 4, x4, 4, w4, 1, ES_DTYPE_FLOAT, ES_EMODEL);
  /* Kernel larger than the padded input. */
  kh_node_init(&t, ES_OP_Conv);
  int64_t x_small[4] = {1, 8, 3, 3}, w5[4] = {8, 8, 5, 5};
  conv_expect(&t, 4, x_small, 4, w5, 1, ES_DTYPE_FLOAT, ES_EMODEL);
  int64_t pads1[4] = {1, 1, 1, 1};
  kh_attr_ints(&t, "pads", pads1, 4);
  conv_expect(&t, 4, x_small, 4, w5, 1, ES_DTYPE_FLOAT, 0);
  /* Dilated kernel larger than the padded input. */
  int64_t dil[2] = {3, 3};
  kh_attr_ints(&t, "dilations", dil, 2);
  conv_expect(&t, 4, x_small, 4, w5, 1, ES_DTYPE_FLOAT, ES_EMODEL);
  /* Wrong ranks. */
  kh_node_init(&t, ES_OP_Conv);
  int64_t x2[2] = {1, 8};
  conv_expect(&t, 2, x2, 4, w4, 1, ES_DTYPE_FLOAT, ES_EMODEL);
  int64_t w3[3] = {16, 8, 3};
  conv_expect(&t, 4, x4, 3, w3, 1, ES_DTYPE_FLOAT, ES_EMODEL);
  int64_t x6d[6] = {1, 8, 3, 3, 3, 3}, w6d[6] = {2, 8, 1, 1, 1, 1};
  conv_expect(&t, 6, x6d, 6, w6d, 1, ES_DTYPE_FLOAT, ES_ENOTSUP);
  /* Weights not known when planning. */
  conv_expect(&t, 4, x4, 4, w4, 0, ES_DTYPE_FLOAT, ES_ENOTSUP);
  /* Integer input. */
  conv_expect(&t, 4, x4, 4, w4, 1, ES_DTYPE_INT32, ES_EMODEL);
  /* Bad attributes, one per node. */
  static const int64_t zero2[2] = {0, 1}, neg4[4] = {0, -1, 0, 0}, k5[2] = {5, 5},
                       three[3] = {1, 1, 1};
  const es_attr bad[] = {
      {.name = "strides", .type = ES_ATTR_INTS, .ints = zero2, .n = 2},
      {.name = "dilations", .type = ES_ATTR_INTS, .ints = zero2, .n = 2},
      {.name = "pads", .type = ES_ATTR_INTS, .ints = neg4, .n = 4},
      {.name = "pads", .type = ES_ATTR_INTS, .ints = three, .n = 3},
      {.name = "strides", .type = ES_ATTR_INTS, .ints = three, .n = 3},
      {.name = "kernel_shape", .type = ES_ATTR_INTS, .ints = k5, .n = 2},
      KH_STR("auto_pad", "SAME"),
      KH_STR("group", "2"), /* wrong attribute type */
  };
  for (int i = 0; i < KH_LEN(bad); i++) {
    kh_node_init(&t, ES_OP_Conv);
    *kh_attr_add(&t, bad[i].name, bad[i].type) = bad[i];
    conv_expect(&t, 4, x4, 4, w4, 1, ES_DTYPE_FLOAT, ES_EMODEL);
  }

  /* Bias of the wrong size. */
  {
    int64_t bd[1] = {15};
    es_tdesc xt = kh_td(ES_DTYPE_FLOAT, 4, x4), wt = kh_td(ES_DTYPE_FLOAT, 4, w4),
             bt = kh_td(ES_DTYPE_FLOAT, 1, bd), od;
    float *x = rand_floats(xt.count), *w = rand_floats(wt.count), *b = rand_floats(16);
    const es_tdesc *in[3] = {&xt, &wt, &bt};
    const void *data[3] = {x, w, b};
    void *o;
    kh_node_init(&t, ES_OP_Conv);
    ES_EXPECT_RC(eval(&t, 3, in, data, &od, &o), ES_EMODEL);
    /* Missing W. */
    in[1] = NULL;
    ES_EXPECT_RC(eval(&t, 3, in, data, &od, &o), ES_EMODEL);
    es_mem_free(x);
    es_mem_free(w);
    es_mem_free(b);
  }

  /* ConvTranspose: W's first dimension must be X's channels. */
  kh_node_init(&t, ES_OP_ConvTranspose);
  int64_t wt_bad[4] = {4, 8, 2, 2}, wt_ok[4] = {8, 4, 2, 2};
  conv_expect(&t, 4, x4, 4, wt_bad, 1, ES_DTYPE_FLOAT, ES_EMODEL);
  conv_expect(&t, 4, x4, 4, wt_ok, 1, ES_DTYPE_FLOAT, 0);
  int64_t os_bad[3] = {5, 5, 5}, os_neg[2] = {0, 9}, outpad_neg[2] = {-1, 0};
  kh_attr_ints(&t, "output_shape", os_bad, 3);
  conv_expect(&t, 4, x4, 4, wt_ok, 1, ES_DTYPE_FLOAT, ES_EMODEL);
  t.attrs[0].ints = os_neg;
  t.attrs[0].n = 2;
  conv_expect(&t, 4, x4, 4, wt_ok, 1, ES_DTYPE_FLOAT, ES_EMODEL);
  kh_node_init(&t, ES_OP_ConvTranspose);
  kh_attr_ints(&t, "output_padding", outpad_neg, 2);
  conv_expect(&t, 4, x4, 4, wt_ok, 1, ES_DTYPE_FLOAT, ES_EMODEL);
  /* Pads that leave no output. */
  kh_node_init(&t, ES_OP_ConvTranspose);
  int64_t big_pads[4] = {8, 0, 9, 0};
  kh_attr_ints(&t, "pads", big_pads, 4);
  conv_expect(&t, 4, x4, 4, wt_ok, 1, ES_DTYPE_FLOAT, ES_EMODEL);
}

static void test_matmul_errors(void **state) {
  (void)state;
  kh_node t;
  kh_node_init(&t, ES_OP_MatMul);
  struct {
    int ra, rb;
    int64_t da[4], db[4];
    es_dtype dt;
    int want;
  } cases[] = {
      {2, 2, {3, 4}, {5, 6}, ES_DTYPE_FLOAT, ES_EMODEL},            /* K differs */
      {3, 3, {2, 3, 4}, {3, 4, 5}, ES_DTYPE_FLOAT, ES_EMODEL},      /* batch 2 vs 3 */
      {2, 2, {3, 4}, {4, 5}, ES_DTYPE_INT64, ES_ENOTSUP},           /* integer MatMul */
      {2, 2, {3, 4}, {4, 5}, ES_DTYPE_BOOL, ES_EMODEL},             /* not a number type */
      {0, 2, {0}, {4, 5}, ES_DTYPE_FLOAT, ES_EMODEL},               /* scalar operand */
      {1, 1, {3}, {4}, ES_DTYPE_FLOAT, ES_EMODEL},                  /* 1-D lengths differ */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    es_tdesc at = kh_td(cases[i].dt, cases[i].ra, cases[i].da),
             bt = kh_td(cases[i].dt, cases[i].rb, cases[i].db), od;
    void *a = rand_floats(at.count * 2), *b = rand_floats(bt.count * 2), *o;
    const es_tdesc *in[2] = {&at, &bt};
    const void *data[2] = {a, b};
    ES_EXPECT_RC(eval(&t, 2, in, data, &od, &o), cases[i].want);
    es_mem_free(a);
    es_mem_free(b);
  }
  /* One input only. */
  int64_t d[2] = {2, 2};
  es_tdesc at = kh_td(ES_DTYPE_FLOAT, 2, d), od;
  float a[4] = {0};
  const es_tdesc *in[1] = {&at};
  const void *data[1] = {a};
  void *o;
  kh_node_init(&t, ES_OP_MatMul);
  ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 1, in, data, 1, &od, &o), ES_EMODEL);
}

/* ==========================================================================
 * Hand-built instances, as the planner makes them
 * ======================================================================== */

/* An instance as the planner makes one (kh_infer_relayout): X and the
 * residual (inputs 0 and 3) are runtime values, W and B static. */
static void hinst_infer(kh_run *h, const es_knode *nd, int n_in, const es_tdesc *const *in,
                        const void *const *data, es_prep_store *store) {
  kh_begin(h, nd, 13, n_in, in, data, 1u << 0 | 1u << 3, 1, store);
  ES_CHECK_RC(kh_infer_relayout(h));
}

/* Runs h and checks it against the reference path's es__kernel_eval. */
static void hinst_check(kh_run *h, kh_node *t, int n_in, const es_tdesc *const *in,
                        const void *const *data) {
  float *y = kh_exec_plain(h, data);
  es_tdesc od, plain[4];
  const es_tdesc *pin[4] = {0};
  for (int i = 0; i < n_in; i++)
    if (in[i]) {
      plain[i] = *in[i];
      plain[i].layout = ES_LAYOUT_PLAIN;
      pin[i] = &plain[i];
    }
  void *o;
  es__kernels_use_reference(1);
  ES_CHECK_RC(eval(t, n_in, pin, data, &od, &o));
  es__kernels_use_reference(0);
  assert_true(es__tdesc_same_shape(&od, &h->out[0]));
  for (size_t i = 0; i < od.count; i++)
    assert_float_equal(y[i], ((float *)o)[i], 1e-3);
  es_mem_free(o);
  es_mem_free(y);
}

/* Infers node t for two input shapes against one store; the second plan
 * must reuse the first one's prepared weights. */
static size_t prep_twice(kh_node *t, int n_in, es_tdesc *x, const int64_t *d1, const int64_t *d2,
                         const es_tdesc *const *in, const void **data) {
  es_prep_store *store;
  ES_CHECK_RC(es__prep_store_create(&store));
  kh_run h1, h2;
  *x = kh_td(ES_DTYPE_FLOAT, x->rank, d1);
  float *x1 = rand_floats(x->count);
  data[0] = x1;
  hinst_infer(&h1, &t->node, n_in, in, data, store);
  hinst_check(&h1, t, n_in, in, data);
  size_t bytes = es__prep_store_bytes(store);

  *x = kh_td(ES_DTYPE_FLOAT, x->rank, d2);
  float *x2 = rand_floats(x->count);
  data[0] = x2;
  hinst_infer(&h2, &t->node, n_in, in, data, store);
  hinst_check(&h2, t, n_in, in, data);
  assert_int_equal(es__prep_store_bytes(store), bytes);
  /* The first plan still runs on the shared copy after the second made
   * its own primitive. */
  *x = kh_td(ES_DTYPE_FLOAT, x->rank, d1);
  data[0] = x1;
  hinst_check(&h1, t, n_in, in, data);
  kh_end(&h1);
  kh_end(&h2);
  es_mem_free(x1);
  es_mem_free(x2);
  es__prep_store_destroy(store);
  return bytes;
}

static void test_prepared_shared(void **state) {
  (void)state;
  es__kernels_use_reference(0);
  /* MatMul with static 2-D weights: oneDNN picks a blocked layout. */
  {
    int64_t a1[3] = {1, 25, 64}, a2[3] = {1, 40, 64}, bd[2] = {64, 48};
    es_tdesc at = {.rank = 3}, bt = kh_td(ES_DTYPE_FLOAT, 2, bd);
    float *b = rand_floats(bt.count);
    const es_tdesc *in[2] = {&at, &bt};
    const void *data[2] = {NULL, b};
    kh_node t;
    kh_node_init(&t, ES_OP_MatMul);
    size_t bytes = prep_twice(&t, 2, &at, a1, a2, in, data);
#if defined(__x86_64__)
    assert_true(bytes >= 64 * 48 * sizeof(float));
#else
    /* oneDNN's portable GEMM matmul (CPUs without its JIT kernels, e.g.
     * Armv8.2 without SVE) reads the weights as they are: nothing is
     * prepared, and the second plan must still add nothing. */
    (void)bytes;
#endif
    es_mem_free(b);
  }
  /* Conv: in a model's plan the conv runs channels-last (it asks for X in
   * NHWC) and oneDNN picks blocked weights; a second plan adds nothing. */
  {
    int64_t x1[4] = {1, 16, 20, 20}, x2[4] = {1, 16, 28, 24}, wd[4] = {32, 16, 3, 3},
            bd[1] = {32}, pads[4] = {1, 1, 1, 1};
    es_tdesc xt = {.rank = 4}, wt = kh_td(ES_DTYPE_FLOAT, 4, wd), bt = kh_td(ES_DTYPE_FLOAT, 1, bd);
    float *w = rand_floats(wt.count), *b = rand_floats(bt.count);
    const es_tdesc *in[3] = {&xt, &wt, &bt};
    const void *data[3] = {NULL, w, b};
    kh_node t;
    kh_node_init(&t, ES_OP_Conv);
    kh_attr_ints(&t, "pads", pads, 4);
    size_t bytes = prep_twice(&t, 3, &xt, x1, x2, in, data);
    assert_true(bytes >= 32 * 16 * 9 * sizeof(float));
    es_mem_free(w);
    es_mem_free(b);
  }
}

typedef struct thread_job {
  kh_run *h;
  const void *const *data;
  const float *want;
  int ok;
} thread_job;

static void *thread_run(void *arg) {
  thread_job *j = arg;
  void *scratch = j->h->k.scratch_bytes
                      ? es_mem_aligned_alloc(ES_MEM_OTHER, 64, j->h->k.scratch_bytes)
                      : NULL;
  float *y = es_mem_aligned_alloc(ES_MEM_OTHER, 64, j->h->out[0].nbytes);
  void *outs[1] = {y};
  j->ok = 1;
  for (int it = 0; it < 20 && j->ok; it++) {
    if (j->h->kern->run(&j->h->k, j->data, outs, scratch) != 0)
      j->ok = 0;
    for (size_t i = 0; i < j->h->out[0].count && j->ok; i++)
      j->ok = fabsf(y[i] - j->want[i]) <= 1e-4f * (1 + fabsf(j->want[i]));
  }
  es_mem_free(y);
  es_mem_free(scratch);
  return NULL;
}

static void test_threads_share_plan(void **state) {
  (void)state;
  es__kernels_use_reference(0);
  int64_t xd[4] = {1, 16, 24, 24}, wd[4] = {16, 16, 3, 3}, pads[4] = {1, 1, 1, 1};
  es_tdesc xt = kh_td(ES_DTYPE_FLOAT, 4, xd), wt = kh_td(ES_DTYPE_FLOAT, 4, wd);
  float *x = rand_floats(xt.count), *w = rand_floats(wt.count);
  const es_tdesc *in[2] = {&xt, &wt};
  const void *data[2] = {x, w};
  kh_node t;
  kh_node_init(&t, ES_OP_Conv);
  kh_attr_ints(&t, "pads", pads, 4);
  kh_run h;
  hinst_infer(&h, &t.node, 2, in, data, NULL);
  /* The single-threaded result is the expectation; a race on shared state
   * would show as garbage, not rounding (thread teams may split sums
   * differently, hence the tolerance). */
  void *scratch = h.k.scratch_bytes ? es_mem_aligned_alloc(ES_MEM_OTHER, 64, h.k.scratch_bytes)
                                    : NULL;
  float *want = es_mem_aligned_alloc(ES_MEM_OTHER, 64, h.out[0].nbytes);
  void *outs[1] = {want};
  ES_CHECK_RC(h.kern->run(&h.k, data, outs, scratch));
  pthread_t th[3];
  thread_job jobs[3];
  for (int i = 0; i < 3; i++) {
    jobs[i] = (thread_job){.h = &h, .data = data, .want = want};
    assert_int_equal(pthread_create(&th[i], NULL, thread_run, &jobs[i]), 0);
  }
  for (int i = 0; i < 3; i++) {
    pthread_join(th[i], NULL);
    assert_true(jobs[i].ok);
  }
  kh_end(&h);
  es_mem_free(want);
  es_mem_free(scratch);
  es_mem_free(x);
  es_mem_free(w);
}

/* ==========================================================================
 * Layouts: channels-last on oneDNN's 2-D path, plain elsewhere
 * ======================================================================== */

/* One conv node with random X, W, B of configuration cf (bias always). */
typedef struct cnode {
  kh_node t;
  es_tdesc xt, wt, bt, rt;
  float *x, *w, *b, *r;
  const es_tdesc *in[4];
  const void *data[4];
} cnode;

static void cnode_init(cnode *c, const cconf *cf) {
  memset(c, 0, sizeof *c);
  int nsp = cf->nsp;
  int64_t xd[5], wd[5], bd[1] = {cf->m};
  conf_dims(cf, xd, wd);
  c->xt = kh_td(ES_DTYPE_FLOAT, 2 + nsp, xd);
  c->wt = kh_td(ES_DTYPE_FLOAT, 2 + nsp, wd);
  c->bt = kh_td(ES_DTYPE_FLOAT, 1, bd);
  c->x = rand_floats(c->xt.count);
  c->w = rand_floats(c->wt.count);
  c->b = rand_floats(c->bt.count);
  c->in[0] = &c->xt, c->in[1] = &c->wt, c->in[2] = &c->bt;
  c->data[0] = c->x, c->data[1] = c->w, c->data[2] = c->b;
  kh_node_init(&c->t, cf->transpose ? ES_OP_ConvTranspose : ES_OP_Conv);
  if (cf->st[0])
    kh_attr_ints(&c->t, "strides", cf->st, (size_t)nsp);
  kh_attr_ints(&c->t, "pads", cf->pads, 2 * (size_t)nsp);
  if (cf->group != 1)
    kh_attr_int(&c->t, "group", cf->group);
  if (cf->outpad[0] || cf->outpad[1])
    kh_attr_ints(&c->t, "output_padding", cf->outpad, (size_t)nsp);
}

/* Adds input 3, a random residual of the output's shape. */
static void cnode_residual(cnode *c, const es_tdesc *out) {
  c->rt = kh_td(ES_DTYPE_FLOAT, out->rank, out->dims);
  c->r = rand_floats(c->rt.count);
  c->in[3] = &c->rt;
  c->data[3] = c->r;
}

static void cnode_fini(cnode *c) {
  es_mem_free(c->x);
  es_mem_free(c->w);
  es_mem_free(c->b);
  es_mem_free(c->r);
}

static const cconf layout_confs[] = {
    {"3x3 pad 1", 0, 2, 1, 8, 16, 1, {10, 12}, {3, 3}, .pads = {1, 1, 1, 1}},
    {"1x1", 0, 2, 2, 16, 24, 1, {9, 11}, {1, 1}, .bias = 1},
    {"depthwise 3x3 stride 2", 0, 2, 1, 16, 16, 16, {15, 14}, {3, 3}, {2, 2},
     .pads = {1, 1, 1, 1}},
    {"first layer 3->16 stride 2", 0, 2, 1, 3, 16, 1, {32, 30}, {3, 3}, {2, 2},
     .pads = {1, 1, 1, 1}},
    {"convT 2x2 stride 2", 1, 2, 1, 16, 8, 1, {10, 12}, {2, 2}, {2, 2}, .bias = 1},
    {"convT 2x2 stride 2 to one channel", 1, 2, 1, 8, 1, 1, {9, 7}, {2, 2}, {2, 2}, .bias = 1},
    /* r3d_18's kinds of 3-D conv: 3x3x3, the 3x7x7 stem on 3 channels, a
     * strided 1x1x1 downsampling; then asymmetric pads and a transpose */
    {"3-D 3x3x3 pad 1", 0, 3, 1, 8, 16, 1, {5, 6, 7}, {3, 3, 3}, .pads = {1, 1, 1, 1, 1, 1}},
    {"3-D stem 3->16 3x7x7 stride (1,2,2)", 0, 3, 1, 3, 16, 1, {4, 13, 12}, {3, 7, 7},
     {1, 2, 2}, .pads = {1, 3, 3, 1, 3, 3}},
    {"3-D 1x1x1 stride 2, batch 2", 0, 3, 2, 16, 24, 1, {5, 7, 6}, {1, 1, 1}, {2, 2, 2},
     .bias = 1},
    {"3-D asymmetric pads, group 2", 0, 3, 1, 4, 6, 2, {5, 6, 7}, {3, 3, 3},
     .pads = {1, 0, 1, 1, 1, 0}},
    {"convT 3-D 2x2x2 stride 2", 1, 3, 1, 8, 4, 1, {3, 4, 5}, {2, 2, 2}, {2, 2, 2}, .bias = 1},
};

static void test_conv_layouts(void **state) {
  (void)state;
  es_prep_store *store;
  ES_CHECK_RC(es__prep_store_create(&store));
  for (size_t ci = 0; ci < sizeof layout_confs / sizeof layout_confs[0]; ci++) {
    cnode c;
    cnode_init(&c, &layout_confs[ci]);
    kh_run h;
    /* NHWC X (no store): runs channels-last, output NHWC, nothing asked. */
    es__kernels_use_reference(0);
    c.xt.layout = ES_LAYOUT_NHWC;
    hinst_infer(&h, &c.t.node, 3, c.in, c.data, NULL);
    assert_int_equal(h.relayouts, 0);
    assert_int_equal(h.out[0].layout, ES_LAYOUT_NHWC);
    hinst_check(&h, &c.t, 3, c.in, c.data);
    kh_end(&h);
    /* The reference loops ask for X plain and write plain. */
    es__kernels_use_reference(1);
    hinst_infer(&h, &c.t.node, 3, c.in, c.data, NULL);
    assert_int_equal(h.relayouts, 1);
    assert_int_equal(h.desc[0].layout, ES_LAYOUT_PLAIN);
    assert_int_equal(h.out[0].layout, ES_LAYOUT_PLAIN);
    hinst_check(&h, &c.t, 3, c.in, c.data);
    kh_end(&h);
    /* In a model's plan (a store), plain X is asked for in NHWC. */
    es__kernels_use_reference(0);
    c.xt.layout = ES_LAYOUT_PLAIN;
    hinst_infer(&h, &c.t.node, 3, c.in, c.data, store);
    assert_int_equal(h.relayouts, 1);
    assert_int_equal(h.desc[0].layout, ES_LAYOUT_NHWC);
    assert_int_equal(h.out[0].layout, ES_LAYOUT_NHWC);
    hinst_check(&h, &c.t, 3, c.in, c.data);
    kh_end(&h);
    /* Without a store (es__kernel_eval's case) plain stays plain. */
    hinst_infer(&h, &c.t.node, 3, c.in, c.data, NULL);
    assert_int_equal(h.relayouts, 0);
    assert_int_equal(h.out[0].layout, ES_LAYOUT_PLAIN);
    hinst_check(&h, &c.t, 3, c.in, c.data);
    kh_end(&h);
    cnode_fini(&c);
  }
  /* 1-D convs stay plain, even in a plan; so do 2-D and 3-D geometries
   * oneDNN refuses (the reference loops take them), asking for X plain. */
  static const cconf plain_confs[] = {
      {"1-D", 0, 1, 2, 4, 6, 1, {20}, {3}, {2}, .pads = {1, 0}},
      {"convT output_padding = stride", 1, 2, 1, 4, 4, 1, {5, 5}, {3, 3}, {2, 2},
       .outpad = {2, 0}},
      {"convT 3-D output_padding = stride", 1, 3, 1, 4, 4, 1, {3, 4, 5}, {3, 3, 3}, {2, 2, 2},
       .outpad = {2, 0, 0}},
  };
  for (size_t ci = 0; ci < sizeof plain_confs / sizeof plain_confs[0]; ci++) {
    cnode c;
    cnode_init(&c, &plain_confs[ci]);
    c.xt.layout = c.xt.rank >= 4 ? ES_LAYOUT_NHWC : ES_LAYOUT_PLAIN;
    kh_run h;
    hinst_infer(&h, &c.t.node, 3, c.in, c.data, store);
    assert_int_equal(h.relayouts, c.xt.rank >= 4 ? 1 : 0);
    assert_int_equal(h.desc[0].layout, ES_LAYOUT_PLAIN);
    assert_int_equal(h.out[0].layout, ES_LAYOUT_PLAIN);
    hinst_check(&h, &c.t, 3, c.in, c.data);
    kh_end(&h);
    cnode_fini(&c);
  }
  es__prep_store_destroy(store);
}

/* ==========================================================================
 * Fused post-ops
 * ======================================================================== */

typedef struct post_case {
  const char *name;
  int n;
  int64_t codes[4];
  float f[8];
} post_case;

static const post_case post_cases[] = {
    {"Relu", 1, {1}, {0}},
    {"Clip", 1, {2}, {-0.3f, 0.4f}},
    {"Clip min > max", 1, {2}, {0.5f, 0.2f}},
    {"HardSigmoid", 1, {3}, {0.2f, 0.5f}},
    {"HardSwish", 1, {4}, {0}},
    {"Sigmoid", 1, {5}, {0}},
    {"Swish", 1, {6}, {0}},
    {"Add", 1, {7}, {0}},
    {"HardSwish then Add", 2, {4, 7}, {0}},
    {"Add then Relu", 2, {7, 1}, {0}},
    {"Clip, Add, Sigmoid", 3, {2, 7, 5}, {-0.5f, 0.5f, 0, 0, 0, 0}},
    {"Relu, HardSigmoid, Swish, Clip", 4, {1, 3, 6, 2}, {0, 0, 1.5f, -0.25f, 0, 0, 0, 0.3f}},
    {"GELU", 1, {8}, {0}},
    {"GELU tanh then Add", 2, {9, 7}, {0}},
};

static int post_case_adds(const post_case *pc) {
  for (int i = 0; i < pc->n; i++)
    if (pc->codes[i] == 7)
      return 1;
  return 0;
}

/* The ops as the unfused graph computes them (HardSwish as PP-OCR's
 * Add(3) -> Clip(0, 6) -> Mul(x) -> Div(6) chain). */
static void post_naive(const post_case *pc, float *y, const float *r, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float v = y[i];
    for (int j = 0; j < pc->n; j++) {
      float a = pc->f[2 * j], b = pc->f[2 * j + 1];
      switch (pc->codes[j]) {
      case 1:
        v = v < 0 ? 0 : v;
        break;
      case 2: /* ONNX Clip: min(max(x, lo), hi) */
        v = v < a ? a : v;
        v = v > b ? b : v;
        break;
      case 3:
        v = a * v + b;
        v = v < 0 ? 0 : v > 1 ? 1 : v;
        break;
      case 4: {
        float t = v + 3;
        t = t < 0 ? 0 : t > 6 ? 6 : t;
        v = t * v / 6;
        break;
      }
      case 5:
        v = (float)(1.0 / (1.0 + exp(-(double)v)));
        break;
      case 6:
        v = (float)((double)v / (1.0 + exp(-(double)v)));
        break;
      case 7:
        v += r[i];
        break;
      case 8:
        v = (float)(0.5 * v * (1.0 + erf((double)v / sqrt(2.0))));
        break;
      case 9: {
        double u = 0.7978845608028654 * ((double)v + 0.044715 * (double)v * v * v);
        v = (float)(0.5 * v * (1.0 + tanh(u)));
        break;
      }
      }
    }
    y[i] = v;
  }
}

static void post_attrs(kh_node *t, const post_case *pc) {
  kh_attr_ints(t, "_post", pc->codes, (size_t)pc->n);
  es_attr *a = kh_attr_add(t, "_post_f", ES_ATTR_FLOATS);
  a->floats = pc->f;
  a->n = 2 * (size_t)pc->n;
}

static void expect_close(const char *what, const float *got, const float *want, size_t n) {
  float lo = INFINITY, hi = -INFINITY, err = 0;
  for (size_t i = 0; i < n; i++) {
    lo = fminf(lo, want[i]);
    hi = fmaxf(hi, want[i]);
    err = fmaxf(err, fabsf(got[i] - want[i]));
  }
  float range = n ? hi - lo : 0;
  if (!(err <= 2e-4f * (range > 1 ? range : 1)))
    fail_msg("%s: off by %g (range %g)", what, (double)err, (double)range);
}

static const cconf post_confs[] = {
    {"3x3 pad 1", 0, 2, 1, 8, 16, 1, {10, 12}, {3, 3}, .pads = {1, 1, 1, 1}},
    {"1x1", 0, 2, 1, 16, 24, 1, {9, 11}, {1, 1}, .bias = 1},
    {"depthwise 5x5 stride 2", 0, 2, 1, 16, 16, 16, {15, 14}, {5, 5}, {2, 2},
     .pads = {2, 2, 2, 2}},
    {"convT 2x2 stride 2", 1, 2, 1, 16, 8, 1, {10, 12}, {2, 2}, {2, 2}, .bias = 1},
    {"1-D", 0, 1, 2, 4, 6, 1, {20}, {3}, {2}, .pads = {1, 0}},
    {"3-D 3x3x3 pad 1", 0, 3, 1, 8, 16, 1, {4, 6, 5}, {3, 3, 3}, .pads = {1, 1, 1, 1, 1, 1}},
};

/* Every post-op alone and in combinations, through es__kernel_eval on both
 * paths, against the ops applied naively after the unfused conv. */
static void test_conv_post_ops(void **state) {
  (void)state;
  char what[160];
  for (size_t ci = 0; ci < sizeof post_confs / sizeof post_confs[0]; ci++)
    for (size_t pi = 0; pi < sizeof post_cases / sizeof post_cases[0]; pi++) {
      const post_case *pc = &post_cases[pi];
      cnode c;
      cnode_init(&c, &post_confs[ci]);
      /* The unfused conv (reference path) and the naive expectation. */
      es_tdesc od;
      void *base;
      es__kernels_use_reference(1);
      ES_CHECK_RC(eval(&c.t, 3, c.in, c.data, &od, &base));
      int adds = post_case_adds(pc);
      if (adds)
        cnode_residual(&c, &od);
      post_naive(pc, base, c.r, od.count);
      post_attrs(&c.t, pc);
      int n_in = adds ? 4 : 3;
      for (int ref = 0; ref < 2; ref++) {
        es__kernels_use_reference(ref);
        es_tdesc fd;
        void *o;
        snprintf(what, sizeof what, "%s, %s (%s)", post_confs[ci].name, pc->name,
                 ref ? "reference" : "oneDNN");
        int rc = eval(&c.t, n_in, c.in, c.data, &fd, &o);
        if (rc != 0)
          fail_msg("%s: %s %s", what, es_err_name(rc), es_last_error_detail());
        assert_true(es__tdesc_same_shape(&fd, &od));
        assert_int_equal(fd.layout, ES_LAYOUT_PLAIN);
        expect_close(what, o, base, od.count);
        es_mem_free(o);
      }
      es__kernels_use_reference(0);
      es_mem_free(base);
      cnode_fini(&c);
    }
}

/* Fused post-ops on channels-last tensors: the residual is read in the
 * output's layout, and asked for in it when it comes in the other. */
static void test_conv_post_nhwc(void **state) {
  (void)state;
  es__kernels_use_reference(0);
  static const int pick[] = {0, 8, 9, 10}; /* Relu, HardSwish+Add, Add+Relu, Clip+Add+Sigmoid */
  static const int confs[] = {0, 1, 2, 3, 5}; /* the 2-D and 3-D ones */
  for (size_t cj = 0; cj < sizeof confs / sizeof confs[0]; cj++)
    for (size_t pi = 0; pi < sizeof pick / sizeof pick[0]; pi++) {
      const post_case *pc = &post_cases[pick[pi]];
      cnode c;
      cnode_init(&c, &post_confs[confs[cj]]);
      es_tdesc od;
      void *base;
      ES_CHECK_RC(eval(&c.t, 3, c.in, c.data, &od, &base));
      int adds = post_case_adds(pc), n_in = adds ? 4 : 3;
      if (adds)
        cnode_residual(&c, &od);
      post_attrs(&c.t, pc);
      for (int res_nhwc = 0; res_nhwc < 1 + adds; res_nhwc++) {
        c.xt.layout = ES_LAYOUT_NHWC;
        c.rt.layout = res_nhwc ? ES_LAYOUT_NHWC : ES_LAYOUT_PLAIN;
        kh_run h;
        hinst_infer(&h, &c.t.node, n_in, c.in, c.data, NULL);
        assert_int_equal(h.out[0].layout, ES_LAYOUT_NHWC);
        assert_int_equal(h.relayouts, adds && !res_nhwc ? 1u << 3 : 0u);
        hinst_check(&h, &c.t, n_in, c.in, c.data);
        kh_end(&h);
      }
      es_mem_free(base);
      cnode_fini(&c);
    }
  /* The reference path asks for an NHWC residual plain. */
  {
    cnode c;
    cnode_init(&c, &post_confs[0]);
    es_tdesc od;
    void *base;
    ES_CHECK_RC(eval(&c.t, 3, c.in, c.data, &od, &base));
    cnode_residual(&c, &od);
    post_attrs(&c.t, &post_cases[7]);
    c.rt.layout = ES_LAYOUT_NHWC;
    es__kernels_use_reference(1);
    kh_run h;
    hinst_infer(&h, &c.t.node, 4, c.in, c.data, NULL);
    assert_int_equal(h.relayouts, 1u << 3);
    assert_int_equal(h.desc[3].layout, ES_LAYOUT_PLAIN);
    hinst_check(&h, &c.t, 4, c.in, c.data);
    kh_end(&h);
    es__kernels_use_reference(0);
    es_mem_free(base);
    cnode_fini(&c);
  }
}

/* A residual Add that comes first is oneDNN's sum into Y: infer offers Y
 * the residual's buffer (inplace 3), and the result is right both in that
 * buffer and in a separate Y (into which run copies the residual). An Add
 * after another post-op, and the reference path, offer nothing. */
static void test_conv_residual_sum(void **state) {
  (void)state;
  static const int pick[] = {7, 9, 8}; /* Add, Add+Relu (sums); HardSwish+Add (binary) */
  static const int confs[] = {0, 1, 5}; /* 3x3, 1x1, 3-D */
  for (size_t cj = 0; cj < sizeof confs / sizeof confs[0]; cj++)
    for (size_t pi = 0; pi < sizeof pick / sizeof pick[0]; pi++) {
      const post_case *pc = &post_cases[pick[pi]];
      int sum = pc->codes[0] == 7;
      cnode c;
      cnode_init(&c, &post_confs[confs[cj]]);
      es_tdesc od;
      void *base;
      es__kernels_use_reference(1);
      ES_CHECK_RC(eval(&c.t, 3, c.in, c.data, &od, &base));
      cnode_residual(&c, &od);
      post_naive(pc, base, c.r, od.count);
      post_attrs(&c.t, pc);
      c.xt.layout = c.rt.layout = ES_LAYOUT_NHWC;
      kh_run h;
      hinst_infer(&h, &c.t.node, 4, c.in, c.data, NULL);
      assert_int_equal(h.k.inplace, -1); /* reference path */
      kh_end(&h);
      es__kernels_use_reference(0);
      hinst_infer(&h, &c.t.node, 4, c.in, c.data, NULL);
      assert_int_equal(h.k.inplace, sum ? 3 : -1);
      /* channels-last copies of X and the residual; the plain expectation */
      float *x = kh_reorder4(c.x, &c.xt, 1), *r = kh_reorder4(c.r, &c.rt, 1);
      float *want = kh_reorder4(base, &h.out[0], 1);
      void *y = NULL;
      const void *in[4] = {x, c.w, c.b, r};
      ES_CHECK_RC(kh_exec(&h, in, 0, &y));
      expect_close(pc->name, y, want, od.count);
      es_mem_free(y);
      if (sum) { /* Y is the residual's buffer */
        void *scratch = es_mem_aligned_alloc(ES_MEM_OTHER, 64, h.k.scratch_bytes + 1);
        assert_non_null(scratch);
        ES_CHECK_RC(h.kern->run(&h.k, in, (void *[]){r}, scratch));
        expect_close(pc->name, r, want, od.count);
        es_mem_free(scratch);
      }
      kh_end(&h);
      es_mem_free(x);
      es_mem_free(r);
      es_mem_free(want);
      es_mem_free(base);
      cnode_fini(&c);
    }
}

static void post_expect(cnode *c, int n_in, const int64_t *codes, size_t n, const float *f,
                        size_t nf, int want) {
  kh_node_init(&c->t, ES_OP_Conv);
  int64_t pads[4] = {1, 1, 1, 1};
  kh_attr_ints(&c->t, "pads", pads, 4);
  if (codes)
    kh_attr_ints(&c->t, "_post", codes, n);
  if (f) {
    es_attr *a = kh_attr_add(&c->t, "_post_f", ES_ATTR_FLOATS);
    a->floats = f;
    a->n = nf;
  }
  for (int ref = 0; ref < 2; ref++) {
    es__kernels_use_reference(ref);
    es_tdesc od;
    void *o;
    ES_EXPECT_RC(eval(&c->t, n_in, c->in, c->data, &od, &o), want);
    if (want == 0)
      es_mem_free(o);
  }
  es__kernels_use_reference(0);
}

static void test_conv_post_errors(void **state) {
  (void)state;
  cnode c;
  cnode_init(&c, &post_confs[0]);
  es_tdesc od;
  void *base;
  ES_CHECK_RC(eval(&c.t, 3, c.in, c.data, &od, &base));
  es_mem_free(base);
  cnode_residual(&c, &od);
  static const float f0[18] = {0};
  const float nan2[2] = {NAN, 0};
  const int64_t relu[1] = {1}, add[1] = {7}, zero[1] = {0}, ten[1] = {10}, add2[2] = {7, 7},
                gelus[2] = {8, 9},
                nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1}, clip[1] = {2};
  post_expect(&c, 3, relu, 1, f0, 2, 0);
  post_expect(&c, 4, add, 1, f0, 2, 0);
  post_expect(&c, 3, zero, 1, f0, 2, ES_EMODEL);   /* unknown codes */
  post_expect(&c, 3, ten, 1, f0, 2, ES_EMODEL);
  post_expect(&c, 3, gelus, 2, f0, 4, 0);          /* GELU, erf and tanh forms */
  post_expect(&c, 3, relu, 1, f0, 1, ES_EMODEL);   /* wrong _post_f lengths */
  post_expect(&c, 3, relu, 1, f0, 3, ES_EMODEL);
  post_expect(&c, 3, relu, 1, NULL, 0, ES_EMODEL);
  post_expect(&c, 3, NULL, 0, f0, 2, ES_EMODEL);
  post_expect(&c, 3, clip, 1, nan2, 2, ES_EMODEL); /* NaN bound */
  post_expect(&c, 3, add, 1, f0, 2, ES_EMODEL);    /* Add without input 3 */
  post_expect(&c, 4, relu, 1, f0, 2, ES_EMODEL);   /* input 3 without an Add */
  post_expect(&c, 4, add2, 2, f0, 4, ES_EMODEL);   /* two Adds */
  post_expect(&c, 3, nine, 9, f0, 18, ES_ENOTSUP); /* too many */
  /* A residual of another shape or type. */
  int64_t bad_d[4] = {1, 16, 10, 11};
  es_tdesc rt = c.rt;
  c.rt = kh_td(ES_DTYPE_FLOAT, 4, bad_d);
  post_expect(&c, 4, add, 1, f0, 2, ES_EMODEL);
  c.rt = rt;
  c.rt.dtype = ES_DTYPE_INT32;
  post_expect(&c, 4, add, 1, f0, 2, ES_EMODEL);
  c.rt = rt;
  /* Without bias (input 2 omitted) the residual still works. */
  c.in[2] = NULL;
  post_expect(&c, 4, add, 1, f0, 2, 0);
  cnode_fini(&c);
}

/* Many planned primitives run on one thread: the per-thread cache of
 * oneDNN memory objects (a fixed number of slots) must hand each its own
 * arguments, also after its slot went to another primitive. */
static void test_many_primitives_one_thread(void **state) {
  (void)state;
  es__kernels_use_reference(0);
  enum { N = 300 };
  static const cconf cf = {"1x1", 0, 2, 1, 4, 4, 1, {3, 3}, {1, 1}, .bias = 1};
  cnode c;
  cnode_init(&c, &cf);
  kh_run *h = es_mem_calloc(ES_MEM_OTHER, N, sizeof *h);
  assert_non_null(h);
  for (int i = 0; i < N; i++)
    hinst_infer(&h[i], &c.t.node, 3, c.in, c.data, NULL);
  for (int round = 0; round < 2; round++)
    for (int i = 0; i < N; i += round ? 7 : 1) {
      /* Different X per call, so a stale handle would show. */
      for (size_t j = 0; j < c.xt.count; j++)
        c.x[j] = (float)(i + round) * 0.01f + (float)j;
      hinst_check(&h[i], &c.t, 3, c.in, c.data);
    }
  for (int i = 0; i < N; i++)
    kh_end(&h[i]);
  es_mem_free(h);
  cnode_fini(&c);
}

int main(void) {
  seed_ = es_test_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_conv_known),       cmocka_unit_test(test_convtranspose_known),
      cmocka_unit_test(test_matmul_known),     cmocka_unit_test(test_conv_grid),
      cmocka_unit_test(test_matmul_grid),      cmocka_unit_test(test_conv_errors),
      cmocka_unit_test(test_matmul_errors),    cmocka_unit_test(test_prepared_shared),
      cmocka_unit_test(test_threads_share_plan),
      cmocka_unit_test(test_conv_layouts),     cmocka_unit_test(test_conv_post_ops),
      cmocka_unit_test(test_conv_post_nhwc),   cmocka_unit_test(test_conv_residual_sum),
      cmocka_unit_test(test_conv_post_errors),
      cmocka_unit_test(test_many_primitives_one_thread),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
