/* The elementwise family's math, logic and activation operators (beyond
 * the arithmetic of test_elementwise.c): unary math against double
 * precision (dense sweeps for the vectorised exp, log, tanh, erf, GELU,
 * softplus, mish and the exponential units; bit for bit against libm for
 * Round, Floor and Ceil), integer and bool types, comparisons with NaN,
 * Mod's two semantics and division by zero, BitShift, PRelu's
 * one-directional broadcast, variadic Max, Min, Sum and Mean (NaN
 * propagating, any number of inputs) and Where against a naive N-d
 * broadcast on random shapes, Identity and Dropout, layouts, in-place runs,
 * the fused opcodes (bit for bit against the single-op kernels) and
 * chains of these operators fused in a loaded model. */
#include "es_test.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "edgeserve/engine.h"
#include "engine/engine_internal.h"
#include "kernels/fused.h"
#include "kernels/kernel.h"
#include "model/graph.h"
#include "support/kernel_harness.h"
#include "support/onnx_builder.h"

/* ==========================================================================
 * Helpers
 * ======================================================================== */

static int eval_n(es_op op, int64_t opset, const es_attr *attrs, int n_attr, int n_in,
                  const es_tdesc *const *d, const void *const *v, es_tdesc *od, void **out) {
  es_knode nd = kh_knode(op, attrs, n_attr);
  return kh_eval(&nd, opset, n_in, d, v, od, out);
}

static int eval1(es_op op, const es_attr *attrs, int n_attr, const es_tdesc *x, const void *xd,
                 es_tdesc *od, void **out) {
  return eval_n(op, 21, attrs, n_attr, 1, (const es_tdesc *[]){x}, (const void *[]){xd}, od,
                out);
}

static int eval2(es_op op, const es_attr *attrs, int n_attr, const es_tdesc *a, const void *ad,
                 const es_tdesc *b, const void *bd, es_tdesc *od, void **out) {
  return eval_n(op, 21, attrs, n_attr, 2, (const es_tdesc *[]){a, b}, (const void *[]){ad, bd},
                od, out);
}

static void assert_shape(const es_tdesc *t, es_dtype dt, int rank, const int64_t *dims) {
  assert_int_equal(t->dtype, dt);
  assert_int_equal(t->rank, rank);
  for (int i = 0; i < rank; i++)
    assert_int_equal(t->dims[i], dims[i]);
}

/* The flat index into t (right-aligned, size-1 dims broadcast) of output
 * element i of shape o. */
static size_t bcast_index(const es_tdesc *o, const es_tdesc *t, size_t i) {
  size_t idx = 0, stride = 1;
  for (int d = o->rank - 1; d >= 0; d--) {
    size_t c = i % (size_t)o->dims[d];
    i /= (size_t)o->dims[d];
    int dt = d - (o->rank - t->rank);
    if (dt < 0)
      continue;
    idx += (t->dims[dt] == 1 ? 0 : c) * stride;
    stride *= (size_t)t->dims[dt];
  }
  return idx;
}

/* ==========================================================================
 * Unary math against double precision
 * ======================================================================== */

typedef double (*ref_fn)(double x);

static double r_softplus(double x) { return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x)); }
static double r_mish(double x) { return x * tanh(r_softplus(x)); }
static double r_gelu(double x) { return 0.5 * x * erfc(-x / sqrt(2.0)); }
static double r_gelu_tanh(double x) {
  return x / (1 + exp(-2 * sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}
static double r_elu(double x) { return x < 0 ? expm1(x) : x; }
static double r_selu(double x) {
  double a = 1.67326319217681884765625, g = 1.05070102214813232421875;
  return x < 0 ? g * a * expm1(x) : g * x;
}
static double r_celu(double x) { return x < 0 ? 0.7 * expm1(x / 0.7) : x; }
static double r_softsign(double x) { return x / (1 + fabs(x)); }
static double r_reciprocal(double x) { return 1 / x; }
static double r_neg(double x) { return -x; }

/* op over 200001 points spread over [lo, hi] (zeros, infinities and NaN
 * are test_unary_specials'): error within rel |want| + abs_floor (the
 * floor for results near 0 and subnormal ones). */
static void sweep(es_op op, const es_attr *attrs, int n_attr, ref_fn ref, double lo, double hi,
                  double rel, double abs_floor) {
  enum { N = 200001 };
  float *x = malloc(N * sizeof *x);
  assert_non_null(x);
  for (int i = 0; i < N; i++)
    x[i] = (float)(lo + (hi - lo) * i / (N - 1));
  es_tdesc t = kh_td(ES_DTYPE_FLOAT, 1, (int64_t[]){N}), o;
  void *out;
  ES_CHECK_RC(eval1(op, attrs, n_attr, &t, x, &o, &out));
  const float *got = out;
  for (int i = 0; i < N; i++) {
    double w = ref(x[i]);
    double lim = rel * fabs(w) + abs_floor;
    if (!(fabs(got[i] - w) <= lim))
      fail_msg("%s(%.9g) = %.9g, want %.9g (relative error %.3g)", es__op_name(op),
               (double)x[i], (double)got[i], w, fabs(got[i] - w) / fabs(w));
  }
  es_mem_free(out);
  free(x);
}

static void test_unary_accuracy(void **state) {
  (void)state;
  /* the vectorised formulas (ew_math.h), bounds a little above what was
   * measured on dense sweeps */
  sweep(ES_OP_Exp, NULL, 0, exp, -87, 88.5, 1.5e-7, 0);
  sweep(ES_OP_Exp, NULL, 0, exp, -103, -87, 1.5e-7, 0.71e-45); /* subnormal: half an ulp */
  sweep(ES_OP_Log, NULL, 0, log, 1e-3, 1e4, 1.5e-7, 0);
  sweep(ES_OP_Log, NULL, 0, log, 1e-44, 1e-36, 1.5e-7, 0);  /* subnormal inputs */
  sweep(ES_OP_Tanh, NULL, 0, tanh, -12, 12, 2.5e-7, 0);
  sweep(ES_OP_Tanh, NULL, 0, tanh, -1e-3, 1e-3, 1e-7, 0);
  sweep(ES_OP_Erf, NULL, 0, erf, -6, 6, 6e-7, 0);
  sweep(ES_OP_Erf, NULL, 0, erf, -1e-3, 1e-3, 6e-7, 0);
  sweep(ES_OP_Softplus, NULL, 0, r_softplus, -80, 80, 3e-7, 0);
  sweep(ES_OP_Mish, NULL, 0, r_mish, -80, 80, 4e-7, 1e-44);
  sweep(ES_OP_Gelu, NULL, 0, r_gelu, -13, 13, 6e-7, 1e-44);
  sweep(ES_OP_Gelu, NULL, 0, r_gelu, -1e-3, 1e-3, 6e-7, 0);
  es_attr tanh_mode = KH_STR("approximate", "tanh");
  /* the tanh form's cubic, rounded in float, is an absolute error of u
   * that the tail turns relative: 2e-6 at x = -4.5, 1.4e-5 at -9 */
  sweep(ES_OP_Gelu, &tanh_mode, 1, r_gelu_tanh, -4.5, 20, 2e-6, 0);
  /* near 0, e^x - 1 cancels: the series keeps these relative */
  sweep(ES_OP_Elu, NULL, 0, r_elu, -80, 10, 2e-7, 0);
  sweep(ES_OP_Elu, NULL, 0, r_elu, -1e-4, 1e-4, 2e-7, 0);
  sweep(ES_OP_Selu, NULL, 0, r_selu, -80, 10, 3e-7, 0);
  es_attr celu_a = KH_FLOAT("alpha", 0.7f);
  sweep(ES_OP_Celu, &celu_a, 1, r_celu, -60, 10, 3e-7, 0);
  sweep(ES_OP_Softsign, NULL, 0, r_softsign, -100, 100, 2e-7, 0);
  sweep(ES_OP_Reciprocal, NULL, 0, r_reciprocal, 0.001, 1000, 1e-7, 0);
  sweep(ES_OP_Neg, NULL, 0, r_neg, -5, 5, 0, 0);
  /* libm */
  sweep(ES_OP_Sin, NULL, 0, sin, -10, 10, 2e-7, 1e-30);
  sweep(ES_OP_Cos, NULL, 0, cos, -10, 10, 2e-7, 1e-30);
  sweep(ES_OP_Tan, NULL, 0, tan, -1.5, 1.5, 2e-7, 1e-30);
  sweep(ES_OP_Asin, NULL, 0, asin, -1, 1, 2e-7, 0);
  sweep(ES_OP_Acos, NULL, 0, acos, -1, 1, 2e-7, 1e-30);
  sweep(ES_OP_Atan, NULL, 0, atan, -50, 50, 2e-7, 0);
  sweep(ES_OP_Sinh, NULL, 0, sinh, -20, 20, 2e-7, 0);
  sweep(ES_OP_Cosh, NULL, 0, cosh, -20, 20, 2e-7, 0);
  sweep(ES_OP_Asinh, NULL, 0, asinh, -50, 50, 2e-7, 0);
  sweep(ES_OP_Acosh, NULL, 0, acosh, 1, 50, 2e-7, 1e-30);
  sweep(ES_OP_Atanh, NULL, 0, atanh, -0.999, 0.999, 2e-7, 0);
}

/* Zeros, infinities, NaN and the ends of the ranges. */
static void test_unary_specials(void **state) {
  (void)state;
  static const float x[8] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 100.0f, -100.0f, 1e-40f};
  static const struct {
    es_op op;
    float want[8];
  } cases[] = {
      {ES_OP_Exp, {1, 1, INFINITY, 0, NAN, INFINITY, 3.72007598e-44f, 1}},
      {ES_OP_Log, {-INFINITY, -INFINITY, INFINITY, NAN, NAN, 4.60517019f, NAN, -92.1034037f}},
      {ES_OP_Tanh, {0, -0.0f, 1, -1, NAN, 1, -1, 1e-40f}},
      {ES_OP_Erf, {0, -0.0f, 1, -1, NAN, 1, -1, 1.12837917e-40f}},
      {ES_OP_Gelu, {0, -0.0f, INFINITY, NAN, NAN, 100, -0.0f, 5e-41f}},
      {ES_OP_Softplus, {0.693147181f, 0.693147181f, INFINITY, 0, NAN, 100, 3.72007598e-44f,
                        0.693147181f}},
      {ES_OP_Mish, {0, -0.0f, INFINITY, NAN, NAN, 100, -3.72e-42f, 6e-41f}},
      {ES_OP_Elu, {0, -0.0f, INFINITY, -1, NAN, 100, -1, 1e-40f}},
      {ES_OP_Sign, {0, 0, 1, -1, NAN, 1, -1, 1}},
      {ES_OP_Abs, {0, 0, INFINITY, INFINITY, NAN, 100, 100, 1e-40f}},
      {ES_OP_Reciprocal, {INFINITY, -INFINITY, 0, -0.0f, NAN, 0.01f, -0.01f, INFINITY}},
      {ES_OP_Round, {0, -0.0f, INFINITY, -INFINITY, NAN, 100, -100, 0}},
      {ES_OP_HardSwish, {0, -0.0f, INFINITY, NAN, NAN, 100, -0.0f, 5e-41f}},
      {ES_OP_Softsign, {0, -0.0f, NAN, NAN, NAN, 0.990099f, -0.990099f, 1e-40f}},
  };
  es_tdesc t = kh_td(ES_DTYPE_FLOAT, 1, (int64_t[]){8}), o;
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    void *out;
    ES_CHECK_RC(eval1(cases[c].op, NULL, 0, &t, x, &o, &out));
    const float *g = out;
    for (int i = 0; i < 8; i++) {
      float w = cases[c].want[i];
      int ok = isnan(w) ? isnan(g[i])
               : isinf(w) ? g[i] == w
                          : fabsf(g[i] - w) <= 1e-6f * fabsf(w) + 2e-42f;
      if (!ok)
        fail_msg("%s(%g) = %g, want %g", es__op_name(cases[c].op), (double)x[i], (double)g[i],
                 (double)w);
    }
    es_mem_free(out);
  }
}

/* Round (half to even), Floor and Ceil bit for bit against libm, the sign
 * of zero included, on a million bit patterns spread over all floats. */
static void test_rounding(void **state) {
  (void)state;
  enum { N = 1 << 20 };
  float *x = malloc(N * sizeof *x);
  assert_non_null(x);
  for (uint32_t i = 0; i < N; i++) {
    uint32_t u = i * 4099u + (i & 7u);
    memcpy(&x[i], &u, sizeof u);
  }
  x[0] = 0.5f, x[1] = -0.5f, x[2] = 1.5f, x[3] = 2.5f, x[4] = -2.5f, x[5] = -0.3f;
  x[6] = 8388607.5f, x[7] = -8388607.5f;
  es_tdesc t = kh_td(ES_DTYPE_FLOAT, 1, (int64_t[]){N}), o;
  static const es_op ops[3] = {ES_OP_Round, ES_OP_Floor, ES_OP_Ceil};
  for (int k = 0; k < 3; k++) {
    void *out;
    ES_CHECK_RC(eval1(ops[k], NULL, 0, &t, x, &o, &out));
    const float *g = out;
    for (int i = 0; i < N; i++) {
      float w = k == 0 ? rintf(x[i]) : k == 1 ? floorf(x[i]) : ceilf(x[i]);
      if (isnan(w) ? !isnan(g[i]) : memcmp(&w, &g[i], sizeof w))
        fail_msg("%s(%.9g) = %.9g, want %.9g", es__op_name(ops[k]), (double)x[i],
                 (double)g[i], (double)w);
    }
    es_mem_free(out);
  }
  free(x);
}

/* ==========================================================================
 * Activations with parameters; IsNaN, IsInf
 * ======================================================================== */

static void check_act(es_op op, const es_attr *attrs, int n_attr, const float *x,
                      const float *want, int n) {
  es_tdesc t = kh_td(ES_DTYPE_FLOAT, 1, (int64_t[]){n}), o;
  void *out;
  ES_CHECK_RC(eval1(op, attrs, n_attr, &t, x, &o, &out));
  assert_shape(&o, ES_DTYPE_FLOAT, 1, (int64_t[]){n});
  const float *g = out;
  for (int i = 0; i < n; i++)
    if (isnan(want[i]) ? !isnan(g[i]) : !(fabsf(g[i] - want[i]) <= 1e-6f * fabsf(want[i])))
      fail_msg("%s(%g) = %.9g, want %.9g", es__op_name(op), (double)x[i], (double)g[i],
               (double)want[i]);
  es_mem_free(out);
}

static void test_activations(void **state) {
  (void)state;
  static const float x[6] = {-3, -0.5f, 0, 0.5f, 3, NAN};
  check_act(ES_OP_LeakyRelu, NULL, 0, x, (float[]){-0.03f, -0.005f, 0, 0.5f, 3, NAN}, 6);
  es_attr a2 = KH_FLOAT("alpha", 2);
  check_act(ES_OP_LeakyRelu, &a2, 1, x, (float[]){-6, -1, 0, 0.5f, 3, NAN}, 6);
  check_act(ES_OP_ThresholdedRelu, NULL, 0, x, (float[]){0, 0, 0, 0, 3, 0}, 6);
  es_attr th = KH_FLOAT("alpha", 0.25f);
  check_act(ES_OP_ThresholdedRelu, &th, 1, x, (float[]){0, 0, 0, 0.5f, 3, 0}, 6);
  check_act(ES_OP_Shrink, NULL, 0, x, (float[]){-3, 0, 0, 0, 3, 0}, 6);
  es_attr sh[2] = {KH_FLOAT("bias", 1), KH_FLOAT("lambd", 0.4f)};
  check_act(ES_OP_Shrink, sh, 2, x, (float[]){-2, 0.5f, 0, -0.5f, 2, 0}, 6);
  check_act(ES_OP_HardSwish, NULL, 0, x, (float[]){0, -0.5f * 2.5f / 6, 0, 0.5f * 3.5f / 6, 3, NAN},
            6);
  es_attr ea = KH_FLOAT("alpha", 0.5f);
  check_act(ES_OP_Elu, &ea, 1, x,
            (float[]){(float)(0.5 * expm1(-3.0)), (float)(0.5 * expm1(-0.5)), 0, 0.5f, 3, NAN}, 6);
  es_attr se[2] = {KH_FLOAT("alpha", 2), KH_FLOAT("gamma", 3)};
  check_act(ES_OP_Selu, se, 2, x,
            (float[]){(float)(6 * expm1(-3.0)), (float)(6 * expm1(-0.5)), 0, 1.5f, 9, NAN}, 6);
  check_act(ES_OP_Celu, NULL, 0, x,
            (float[]){(float)expm1(-3.0), (float)expm1(-0.5), 0, 0.5f, 3, NAN}, 6);

  es_tdesc t = kh_td(ES_DTYPE_FLOAT, 1, (int64_t[]){6}), o;
  static const float y[6] = {INFINITY, -INFINITY, NAN, 0, -1, FLT_MAX};
  void *out;
  ES_CHECK_RC(eval1(ES_OP_IsNaN, NULL, 0, &t, y, &o, &out));
  assert_int_equal(o.dtype, ES_DTYPE_BOOL);
  assert_memory_equal(out, ((uint8_t[]){0, 0, 1, 0, 0, 0}), 6);
  es_mem_free(out);
  ES_CHECK_RC(eval1(ES_OP_IsInf, NULL, 0, &t, y, &o, &out));
  assert_memory_equal(out, ((uint8_t[]){1, 1, 0, 0, 0, 0}), 6);
  es_mem_free(out);
  es_attr pos[1] = {KH_INT("detect_negative", 0)};
  ES_CHECK_RC(eval1(ES_OP_IsInf, pos, 1, &t, y, &o, &out));
  assert_memory_equal(out, ((uint8_t[]){1, 0, 0, 0, 0, 0}), 6);
  es_mem_free(out);
  es_attr neg[1] = {KH_INT("detect_positive", 0)};
  ES_CHECK_RC(eval1(ES_OP_IsInf, neg, 1, &t, y, &o, &out));
  assert_memory_equal(out, ((uint8_t[]){0, 1, 0, 0, 0, 0}), 6);
  es_mem_free(out);
}

static void test_unary_invalid(void **state) {
  (void)state;
  es_tdesc tf = kh_td(ES_DTYPE_FLOAT, 1, (int64_t[]){2});
  es_tdesc ti = kh_td(ES_DTYPE_INT32, 1, (int64_t[]){2});
  es_tdesc tu = kh_td(ES_DTYPE_UINT8, 1, (int64_t[]){2});
  es_tdesc tb = kh_td(ES_DTYPE_BOOL, 1, (int64_t[]){2});
  int32_t v[2] = {0};
  es_tdesc o;
  void *out;
  /* types the operator does not take; Erf and Shrink take integers in
   * ONNX, not implemented here */
  ES_EXPECT_RC(eval1(ES_OP_Exp, NULL, 0, &ti, v, &o, &out), ES_EMODEL);
  ES_EXPECT_RC(eval1(ES_OP_Neg, NULL, 0, &tu, v, &o, &out), ES_EMODEL);
  ES_EXPECT_RC(eval1(ES_OP_Not, NULL, 0, &tf, v, &o, &out), ES_EMODEL);
  ES_EXPECT_RC(eval1(ES_OP_IsNaN, NULL, 0, &ti, v, &o, &out), ES_EMODEL);
  ES_EXPECT_RC(eval1(ES_OP_Abs, NULL, 0, &tb, v, &o, &out), ES_EMODEL);
  ES_EXPECT_RC(eval1(ES_OP_Erf, NULL, 0, &ti, v, &o, &out), ES_ENOTSUP);
  ES_EXPECT_RC(eval1(ES_OP_Shrink, NULL, 0, &tu, v, &o, &out), ES_ENOTSUP);
  /* attributes */
  es_attr bad_gelu = KH_STR("approximate", "erf");
  ES_EXPECT_RC(eval1(ES_OP_Gelu, &bad_gelu, 1, &tf, v, &o, &out), ES_EMODEL);
  es_attr celu0 = KH_FLOAT("alpha", 0);
  ES_EXPECT_RC(eval1(ES_OP_Celu, &celu0, 1, &tf, v, &o, &out), ES_EMODEL);
  es_attr int_alpha = KH_INT("alpha", 1);
  ES_EXPECT_RC(eval1(ES_OP_LeakyRelu, &int_alpha, 1, &tf, v, &o, &out), ES_EMODEL);
  /* input counts */
  ES_EXPECT_RC(eval2(ES_OP_Tanh, NULL, 0, &tf, v, &tf, v, &o, &out), ES_EMODEL);
  ES_EXPECT_RC(eval_n(ES_OP_Tanh, 13, NULL, 0, 1, (const es_tdesc *[]){NULL},
                      (const void *[]){NULL}, &o, &out),
               ES_EMODEL);
}

/* ==========================================================================
 * Integer and bool types
 * ======================================================================== */

static void test_int_unary(void **state) {
  (void)state;
  es_tdesc t32 = kh_td(ES_DTYPE_INT32, 1, (int64_t[]){4}), o;
  int32_t a[4] = {-5, 0, 7, INT32_MIN};
  void *out;
  ES_CHECK_RC(eval1(ES_OP_Abs, NULL, 0, &t32, a, &o, &out));
  assert_memory_equal(out, ((int32_t[]){5, 0, 7, INT32_MIN}), 16); /* wraps, as numpy */
  es_mem_free(out);
  ES_CHECK_RC(eval1(ES_OP_Neg, NULL, 0, &t32, a, &o, &out));
  assert_memory_equal(out, ((int32_t[]){5, 0, -7, INT32_MIN}), 16);
  es_mem_free(out);
  ES_CHECK_RC(eval1(ES_OP_Sign, NULL, 0, &t32, a, &o, &out));
  assert_memory_equal(out, ((int32_t[]){-1, 0, 1, -1}), 16);
  es_mem_free(out);
  es_tdesc t64 = kh_td(ES_DTYPE_INT64, 1, (int64_t[]){3});
  int64_t b[3] = {INT64_MIN, -1, 9};
  ES_CHECK_RC(eval1(ES_OP_Neg, NULL, 0, &t64, b, &o, &out));
  assert_memory_equal(out, ((int64_t[]){INT64_MIN, 1, -9}), 24);
  es_mem_free(out);
  es_tdesc t8 = kh_td(ES_DTYPE_INT8, 1, (int64_t[]){3});
  int8_t c[3] = {-128, -3, 4};
  ES_CHECK_RC(eval1(ES_OP_Abs, NULL, 0, &t8, c, &o, &out));
  assert_memory_equal(out, ((int8_t[]){-128, 3, 4}), 3);
  es_mem_free(out);
  es_tdesc tu = kh_td(ES_DTYPE_UINT8, 1, (int64_t[]){3});
  uint8_t d[3] = {0, 1, 255};
  ES_CHECK_RC(eval1(ES_OP_Abs, NULL, 0, &tu, d, &o, &out));
  assert_memory_equal(out, d, 3);
  es_mem_free(out);
  ES_CHECK_RC(eval1(ES_OP_Sign, NULL, 0, &tu, d, &o, &out));
  assert_memory_equal(out, ((uint8_t[]){0, 1, 1}), 3);
  es_mem_free(out);
}

/* And, Or, Xor with broadcasting; any nonzero byte is true, results are
 * 0 or 1; Not. */
static void test_bool_ops(void **state) {
  (void)state;
  es_tdesc a = kh_td(ES_DTYPE_BOOL, 2, (int64_t[]){2, 3});
  es_tdesc b = kh_td(ES_DTYPE_BOOL, 1, (int64_t[]){3});
  es_tdesc s = kh_td(ES_DTYPE_BOOL, 0, NULL), o;
  uint8_t av[6] = {0, 1, 2, 0, 255, 1}, bv[3] = {0, 7, 1}, sv = 1;
  void *out;
  ES_CHECK_RC(eval2(ES_OP_And, NULL, 0, &a, av, &b, bv, &o, &out));
  assert_shape(&o, ES_DTYPE_BOOL, 2, (int64_t[]){2, 3});
  assert_memory_equal(out, ((uint8_t[]){0, 1, 1, 0, 1, 1}), 6);
  es_mem_free(out);
  ES_CHECK_RC(eval2(ES_OP_Or, NULL, 0, &b, bv, &a, av, &o, &out));
  assert_memory_equal(out, ((uint8_t[]){0, 1, 1, 0, 1, 1}), 6);
  es_mem_free(out);
  ES_CHECK_RC(eval2(ES_OP_Xor, NULL, 0, &a, av, &b, bv, &o, &out));
  assert_memory_equal(out, ((uint8_t[]){0, 0, 0, 0, 0, 0}), 6);
  es_mem_free(out);
  ES_CHECK_RC(eval2(ES_OP_Xor, NULL, 0, &a, av, &s, &sv, &o, &out));
  assert_memory_equal(out, ((uint8_t[]){1, 0, 0, 1, 0, 0}), 6);
  es_mem_free(out);
  ES_CHECK_RC(eval1(ES_OP_Not, NULL, 0, &a, av, &o, &out));
  assert_memory_equal(out, ((uint8_t[]){1, 0, 0, 1, 0, 0}), 6);
  es_mem_free(out);
  es_tdesc f = kh_td(ES_DTYPE_FLOAT, 1, (int64_t[]){3});
  float fv[3] = {0};
  ES_EXPECT_RC(eval2(ES_OP_And, NULL, 0, &f, fv, &f, fv, &o, &out), ES_EMODEL);
  ES_EXPECT_RC(eval2(ES_OP_Or, NULL, 0, &b, bv, &f, fv, &o, &out), ES_EMODEL);
}

/* Less, Greater, LessOrEqual, GreaterOrEqual: NaN compares false. */
static void test_comparisons(void **state) {
  (void)state;
  es_tdesc a = kh_td(ES_DTYPE_FLOAT, 2, (int64_t[]){2, 3});
  es_tdesc b = kh_td(ES_DTYPE_FLOAT, 2, (int64_t[]){2, 1}), o;
  float av[6] = {1, 2, NAN, -INFINITY, 5, 6}, bv[2] = {2, NAN};
  static const struct {
    es_op op;
    uint8_t want[6];
  } cases[] = {{ES_OP_Less, {1, 0, 0, 0, 0, 0}},
               {ES_OP_Greater, {0, 0, 0, 0, 0, 0}},
               {ES_OP_LessOrEqual, {1, 1, 0, 0, 0, 0}},
               {ES_OP_GreaterOrEqual, {0, 1, 0, 0, 0, 0}},
               {ES_OP_Equal, {0, 1, 0, 0, 0, 0}}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    void *out;
    ES_CHECK_RC(eval2(cases[c].op, NULL, 0, &a, av, &b, bv, &o, &out));
    assert_shape(&o, ES_DTYPE_BOOL, 2, (int64_t[]){2, 3});
    assert_memory_equal(out, cases[c].want, 6);
    es_mem_free(out);
  }
  es_tdesc i8 = kh_td(ES_DTYPE_INT8, 1, (int64_t[]){3}), s8 = kh_td(ES_DTYPE_INT8, 0, NULL);
  int8_t x8[3] = {-128, 0, 127}, k8 = 0;
  void *out;
  ES_CHECK_RC(eval2(ES_OP_Greater, NULL, 0, &i8, x8, &s8, &k8, &o, &out));
  assert_memory_equal(out, ((uint8_t[]){0, 0, 1}), 3);
  es_mem_free(out);
  es_tdesc u8 = kh_td(ES_DTYPE_UINT8, 1, (int64_t[]){3});
  uint8_t xu[3] = {0, 200, 255}, yu[3] = {1, 200, 0};
  ES_CHECK_RC(eval2(ES_OP_LessOrEqual, NULL, 0, &u8, xu, &u8, yu, &o, &out));
  assert_memory_equal(out, ((uint8_t[]){1, 1, 0}), 3);
  es_mem_free(out);
  es_tdesc i64 = kh_td(ES_DTYPE_INT64, 1, (int64_t[]){2});
  int64_t x64[2] = {INT64_MIN, INT64_MAX}, y64[2] = {INT64_MAX, INT64_MAX};
  ES_CHECK_RC(eval2(ES_OP_GreaterOrEqual, NULL, 0, &i64, x64, &i64, y64, &o, &out));
  assert_memory_equal(out, ((uint8_t[]){0, 1}), 2);
  es_mem_free(out);
  es_tdesc bl = kh_td(ES_DTYPE_BOOL, 1, (int64_t[]){2});
  ES_EXPECT_RC(eval2(ES_OP_Less, NULL, 0, &bl, xu, &bl, yu, &o, &out), ES_EMODEL);
  ES_EXPECT_RC(eval2(ES_OP_Less, NULL, 0, &i8, x8, &u8, xu, &o, &out), ES_EMODEL);
}

/* ==========================================================================
 * Mod, BitShift, PRelu
 * ======================================================================== */

static void test_mod(void **state) {
  (void)state;
  es_tdesc t = kh_td(ES_DTYPE_INT32, 1, (int64_t[]){8}), o;
  int32_t x[8] = {7, -7, 7, -7, 5, INT32_MIN, INT32_MIN, 0};
  int32_t y[8] = {3, 3, -3, -3, 0, -1, 3, 0};
  void *out;
  /* fmod = 0: the sign of the divisor; x mod 0 = 0; MIN mod -1 = 0 */
  ES_CHECK_RC(eval2(ES_OP_Mod, NULL, 0, &t, x, &t, y, &o, &out));
  assert_memory_equal(out, ((int32_t[]){1, 2, -2, -1, 0, 0, 1, 0}), 32);
  es_mem_free(out);
  es_attr fm = KH_INT("fmod", 1);
  ES_CHECK_RC(eval2(ES_OP_Mod, &fm, 1, &t, x, &t, y, &o, &out));
  assert_memory_equal(out, ((int32_t[]){1, -1, 1, -1, 0, 0, -2, 0}), 32);
  es_mem_free(out);
  es_tdesc t8 = kh_td(ES_DTYPE_INT8, 1, (int64_t[]){4});
  int8_t x8[4] = {-128, -128, 100, -5}, y8[4] = {-1, 0, -7, 2};
  ES_CHECK_RC(eval2(ES_OP_Mod, NULL, 0, &t8, x8, &t8, y8, &o, &out));
  assert_memory_equal(out, ((int8_t[]){0, 0, -5, 1}), 4);
  es_mem_free(out);
  es_tdesc t64 = kh_td(ES_DTYPE_INT64, 1, (int64_t[]){3});
  es_tdesc s64 = kh_td(ES_DTYPE_INT64, 0, NULL);
  int64_t x64[3] = {INT64_MIN, -10, 10}, k = 0, km = -1;
  ES_CHECK_RC(eval2(ES_OP_Mod, NULL, 0, &t64, x64, &s64, &k, &o, &out));
  assert_memory_equal(out, ((int64_t[]){0, 0, 0}), 24);
  es_mem_free(out);
  ES_CHECK_RC(eval2(ES_OP_Mod, &fm, 1, &t64, x64, &s64, &km, &o, &out));
  assert_memory_equal(out, ((int64_t[]){0, 0, 0}), 24);
  es_mem_free(out);
  es_tdesc tu = kh_td(ES_DTYPE_UINT8, 1, (int64_t[]){3});
  uint8_t xu[3] = {250, 7, 9}, yu[3] = {7, 0, 255};
  ES_CHECK_RC(eval2(ES_OP_Mod, NULL, 0, &tu, xu, &tu, yu, &o, &out));
  assert_memory_equal(out, ((uint8_t[]){5, 0, 9}), 3);
  es_mem_free(out);
  /* float: fmod = 1 only, C's fmodf */
  es_tdesc tf = kh_td(ES_DTYPE_FLOAT, 1, (int64_t[]){5});
  float xf[5] = {5.5f, -5.5f, 1, INFINITY, 3}, yf[5] = {2, 2, 0, 2, INFINITY};
  ES_CHECK_RC(eval2(ES_OP_Mod, &fm, 1, &tf, xf, &tf, yf, &o, &out));
  const float *g = out;
  assert_true(g[0] == 1.5f && g[1] == -1.5f && isnan(g[2]) && isnan(g[3]) && g[4] == 3);
  es_mem_free(out);
  ES_EXPECT_RC(eval2(ES_OP_Mod, NULL, 0, &tf, xf, &tf, yf, &o, &out), ES_EMODEL);
  es_attr fm2 = KH_INT("fmod", 2);
  ES_EXPECT_RC(eval2(ES_OP_Mod, &fm2, 1, &t, x, &t, y, &o, &out), ES_EMODEL);
  es_tdesc tb = kh_td(ES_DTYPE_BOOL, 1, (int64_t[]){3});
  ES_EXPECT_RC(eval2(ES_OP_Mod, NULL, 0, &tb, xu, &tb, yu, &o, &out), ES_EMODEL);
}

static void test_bitshift(void **state) {
  (void)state;
  es_tdesc t = kh_td(ES_DTYPE_UINT8, 1, (int64_t[]){5}), s = kh_td(ES_DTYPE_UINT8, 0, NULL), o;
  uint8_t x[5] = {1, 0x81, 255, 16, 3}, y[5] = {1, 1, 7, 8, 200}, two = 2;
  es_attr left = KH_STR("direction", "LEFT"), right = KH_STR("direction", "RIGHT");
  void *out;
  ES_CHECK_RC(eval2(ES_OP_BitShift, &left, 1, &t, x, &t, y, &o, &out));
  assert_memory_equal(out, ((uint8_t[]){2, 2, 128, 0, 0}), 5);
  es_mem_free(out);
  ES_CHECK_RC(eval2(ES_OP_BitShift, &right, 1, &t, x, &t, y, &o, &out));
  assert_memory_equal(out, ((uint8_t[]){0, 0x40, 1, 0, 0}), 5);
  es_mem_free(out);
  ES_CHECK_RC(eval2(ES_OP_BitShift, &right, 1, &t, x, &s, &two, &o, &out));
  assert_memory_equal(out, ((uint8_t[]){0, 0x20, 63, 4, 0}), 5);
  es_mem_free(out);
  ES_EXPECT_RC(eval2(ES_OP_BitShift, NULL, 0, &t, x, &t, y, &o, &out), ES_EMODEL);
  es_attr up = KH_STR("direction", "UP");
  ES_EXPECT_RC(eval2(ES_OP_BitShift, &up, 1, &t, x, &t, y, &o, &out), ES_EMODEL);
  es_tdesc ti = kh_td(ES_DTYPE_INT32, 1, (int64_t[]){1});
  int32_t v = 1;
  ES_EXPECT_RC(eval2(ES_OP_BitShift, &left, 1, &ti, &v, &ti, &v, &o, &out), ES_EMODEL);
}

static void test_prelu(void **state) {
  (void)state;
  es_tdesc x = kh_td(ES_DTYPE_FLOAT, 4, (int64_t[]){2, 3, 2, 2});
  es_tdesc sl = kh_td(ES_DTYPE_FLOAT, 3, (int64_t[]){3, 1, 1}), o;
  float xv[24], sv[3] = {0.1f, -2, 0.5f};
  for (int i = 0; i < 24; i++)
    xv[i] = (float)i - 12;
  xv[5] = NAN;
  void *out;
  ES_CHECK_RC(eval2(ES_OP_PRelu, NULL, 0, &x, xv, &sl, sv, &o, &out));
  assert_shape(&o, ES_DTYPE_FLOAT, 4, x.dims);
  const float *g = out;
  for (int i = 0; i < 24; i++) {
    float w = xv[i] < 0 ? sv[(i / 4) % 3] * xv[i] : xv[i];
    assert_true(isnan(w) ? isnan(g[i]) : g[i] == w);
  }
  es_mem_free(out);
  /* the slope may not widen X */
  es_tdesc big = kh_td(ES_DTYPE_FLOAT, 5, (int64_t[]){2, 2, 3, 2, 2});
  float bv[48] = {0};
  ES_EXPECT_RC(eval2(ES_OP_PRelu, NULL, 0, &x, xv, &big, bv, &o, &out), ES_EMODEL);
  es_tdesc wide = kh_td(ES_DTYPE_FLOAT, 1, (int64_t[]){3});
  es_tdesc x1 = kh_td(ES_DTYPE_FLOAT, 2, (int64_t[]){3, 1});
  ES_EXPECT_RC(eval2(ES_OP_PRelu, NULL, 0, &x1, xv, &wide, sv, &o, &out), ES_EMODEL);
  /* int32 */
  es_tdesc ti = kh_td(ES_DTYPE_INT32, 1, (int64_t[]){3}), si = kh_td(ES_DTYPE_INT32, 0, NULL);
  int32_t iv[3] = {-4, 0, 5}, k = 3;
  ES_CHECK_RC(eval2(ES_OP_PRelu, NULL, 0, &ti, iv, &si, &k, &o, &out));
  assert_memory_equal(out, ((int32_t[]){-12, 0, 5}), 12);
  es_mem_free(out);
}

/* ==========================================================================
 * Max, Min, Sum, Mean, Where
 * ======================================================================== */

/* Max and Min propagate NaN from any input, in any position. */
static void test_max_min_nan(void **state) {
  (void)state;
  es_tdesc t = kh_td(ES_DTYPE_FLOAT, 1, (int64_t[]){4}), o;
  float a[4] = {NAN, 1, 1, 1}, b[4] = {0, NAN, 2, -INFINITY}, c[4] = {5, 5, NAN, 0};
  const es_tdesc *d[3] = {&t, &t, &t};
  const void *v[3] = {a, b, c};
  void *out;
  ES_CHECK_RC(eval_n(ES_OP_Max, 13, NULL, 0, 3, d, v, &o, &out));
  const float *g = out;
  assert_true(isnan(g[0]) && isnan(g[1]) && isnan(g[2]) && g[3] == 1);
  es_mem_free(out);
  ES_CHECK_RC(eval_n(ES_OP_Min, 13, NULL, 0, 3, d, v, &o, &out));
  g = out;
  assert_true(isnan(g[0]) && isnan(g[1]) && isnan(g[2]) && g[3] == -INFINITY);
  es_mem_free(out);
  /* ... the same over two inputs, both orders, and broadcast scalars */
  es_tdesc s = kh_td(ES_DTYPE_FLOAT, 0, NULL);
  float nan = NAN;
  ES_CHECK_RC(eval_n(ES_OP_Max, 13, NULL, 0, 2, (const es_tdesc *[]){&s, &t},
                     (const void *[]){&nan, c}, &o, &out));
  g = out;
  for (int i = 0; i < 4; i++)
    assert_true(isnan(g[i]));
  es_mem_free(out);
  ES_CHECK_RC(eval_n(ES_OP_Min, 13, NULL, 0, 2, (const es_tdesc *[]){&t, &s},
                     (const void *[]){c, &nan}, &o, &out));
  g = out;
  for (int i = 0; i < 4; i++)
    assert_true(isnan(g[i]));
  es_mem_free(out);
  /* integers */
  es_tdesc ti = kh_td(ES_DTYPE_INT64, 1, (int64_t[]){3});
  int64_t x[3] = {INT64_MIN, 5, 7}, y[3] = {0, INT64_MAX, 7};
  ES_CHECK_RC(eval_n(ES_OP_Max, 13, NULL, 0, 2, (const es_tdesc *[]){&ti, &ti},
                     (const void *[]){x, y}, &o, &out));
  assert_memory_equal(out, ((int64_t[]){0, INT64_MAX, 7}), 24);
  es_mem_free(out);
  es_tdesc tu = kh_td(ES_DTYPE_UINT8, 1, (int64_t[]){3});
  uint8_t p[3] = {0, 200, 255}, q[3] = {1, 100, 254};
  ES_CHECK_RC(eval_n(ES_OP_Min, 13, NULL, 0, 2, (const es_tdesc *[]){&tu, &tu},
                     (const void *[]){p, q}, &o, &out));
  assert_memory_equal(out, ((uint8_t[]){0, 100, 254}), 3);
  es_mem_free(out);
}

/* Reference for Max/Min/Sum/Mean over n broadcast float inputs. */
static float ref_nary(es_op op, int n, const es_tdesc *const *d, float *const *v,
                      const es_tdesc *o, size_t i) {
  float acc = v[0][bcast_index(o, d[0], i)];
  for (int k = 1; k < n; k++) {
    float x = v[k][bcast_index(o, d[k], i)];
    acc = op == ES_OP_Max ? (x > acc ? x : acc) : op == ES_OP_Min ? (x < acc ? x : acc) : acc + x;
  }
  return op == ES_OP_Mean ? acc / (float)n : acc;
}

/* Random shapes for 1 to 6 inputs of the four variadic ops and for Where's
 * three: every broadcast pattern against a naive N-d reference. */
static void test_nary_broadcast_random(void **state) {
  (void)state;
  uint64_t s = es_test_seed();
  static const es_op ops[4] = {ES_OP_Max, ES_OP_Min, ES_OP_Sum, ES_OP_Mean};
  for (int iter = 0; iter < 400; iter++) {
    int r = (int)(es_test_rand(&s) % 6), n = 1 + (int)(es_test_rand(&s) % 6);
    int where = iter % 5 == 4;
    if (where)
      n = 3;
    int64_t od[ES_MAX_RANK], dd[6][ES_MAX_RANK];
    for (int i = 0; i < r; i++)
      od[i] = 1 + (int64_t)(es_test_rand(&s) % 4);
    if (r && iter % 7 == 0)
      od[r - 1] = 37; /* chunks and a tail */
    es_tdesc t[6];
    float *v[6];
    const es_tdesc *d[6];
    const void *cv[6];
    for (int k = 0; k < n; k++) {
      int rk = r - (int)(es_test_rand(&s) % (size_t)(r + 1));
      for (int i = 0; i < rk; i++)
        dd[k][i] = es_test_rand(&s) % 3 == 0 ? 1 : od[i + r - rk];
      t[k] = kh_td(where && k == 0 ? ES_DTYPE_BOOL : ES_DTYPE_FLOAT, rk, dd[k]);
      v[k] = malloc(t[k].count * sizeof(float) + 4);
      assert_non_null(v[k]);
      for (size_t i = 0; i < t[k].count; i++) {
        float x = (float)(es_test_rand(&s) % 2001) / 100.0f - 10.0f;
        if (where && k == 0)
          ((uint8_t *)v[k])[i] = (uint8_t)(es_test_rand(&s) % 2);
        else
          v[k][i] = x;
      }
      d[k] = &t[k];
      cv[k] = v[k];
    }
    es_op op = where ? ES_OP_Where : ops[iter % 4];
    es_tdesc o;
    void *out;
    ES_CHECK_RC(eval_n(op, 13, NULL, 0, n, d, cv, &o, &out));
    /* the output shape is the broadcast of all inputs */
    es_tdesc want_shape = t[0];
    for (int k = 1; k < n; k++) {
      int rr = want_shape.rank > t[k].rank ? want_shape.rank : t[k].rank;
      int64_t dims[ES_MAX_RANK];
      for (int i = 0; i < rr; i++) {
        int ia = i - (rr - want_shape.rank), ib = i - (rr - t[k].rank);
        int64_t da = ia >= 0 ? want_shape.dims[ia] : 1, db = ib >= 0 ? t[k].dims[ib] : 1;
        dims[i] = da == 1 ? db : da;
      }
      want_shape = kh_td(ES_DTYPE_FLOAT, rr, dims);
    }
    assert_shape(&o, ES_DTYPE_FLOAT, want_shape.rank, want_shape.dims);
    const float *g = out;
    for (size_t i = 0; i < o.count; i++) {
      float w;
      if (where)
        w = ((const uint8_t *)v[0])[bcast_index(&o, &t[0], i)] ? v[1][bcast_index(&o, &t[1], i)]
                                                              : v[2][bcast_index(&o, &t[2], i)];
      else
        w = ref_nary(op, n, d, v, &o, i);
      if (g[i] != w)
        fail_msg("iteration %d, %s of %d inputs: [%zu] = %g, want %g", iter, es__op_name(op), n,
                 i, (double)g[i], (double)w);
    }
    es_mem_free(out);
    for (int k = 0; k < n; k++)
      free(v[k]);
  }
}

static void test_sum_mean(void **state) {
  (void)state;
  es_tdesc a = kh_td(ES_DTYPE_FLOAT, 2, (int64_t[]){2, 2}), b = kh_td(ES_DTYPE_FLOAT, 1, (int64_t[]){2});
  float av[4] = {1, 2, 3, 4}, bv[2] = {10, 20};
  es_tdesc o;
  void *out;
  ES_CHECK_RC(eval_n(ES_OP_Mean, 13, NULL, 0, 3, (const es_tdesc *[]){&a, &b, &b},
                     (const void *[]){av, bv, bv}, &o, &out));
  assert_memory_equal(out, ((float[]){7, 14, 23.0f / 3, 44.0f / 3}), 16);
  es_mem_free(out);
  ES_CHECK_RC(eval_n(ES_OP_Sum, 13, NULL, 0, 1, (const es_tdesc *[]){&a}, (const void *[]){av},
                     &o, &out));
  assert_memory_equal(out, av, 16);
  es_mem_free(out);
  es_tdesc ti = kh_td(ES_DTYPE_INT32, 1, (int64_t[]){2});
  int32_t x[2] = {INT32_MAX, 5};
  ES_CHECK_RC(eval_n(ES_OP_Sum, 13, NULL, 0, 2, (const es_tdesc *[]){&ti, &ti},
                     (const void *[]){x, x}, &o, &out));
  assert_memory_equal(out, ((int32_t[]){-2, 10}), 8); /* wraps */
  es_mem_free(out);
  /* Mean over integers, bool inputs, mixed types, no input */
  ES_EXPECT_RC(eval_n(ES_OP_Mean, 13, NULL, 0, 2, (const es_tdesc *[]){&ti, &ti},
                      (const void *[]){x, x}, &o, &out),
               ES_EMODEL);
  es_tdesc tb = kh_td(ES_DTYPE_BOOL, 1, (int64_t[]){2});
  ES_EXPECT_RC(eval_n(ES_OP_Max, 13, NULL, 0, 2, (const es_tdesc *[]){&tb, &tb},
                      (const void *[]){x, x}, &o, &out),
               ES_EMODEL);
  ES_EXPECT_RC(eval_n(ES_OP_Sum, 13, NULL, 0, 2, (const es_tdesc *[]){&a, &ti},
                      (const void *[]){av, x}, &o, &out),
               ES_EMODEL);
  ES_EXPECT_RC(eval_n(ES_OP_Max, 13, NULL, 0, 0, NULL, NULL, &o, &out), ES_EMODEL);
  es_tdesc b3 = kh_td(ES_DTYPE_FLOAT, 1, (int64_t[]){3});
  ES_EXPECT_RC(eval_n(ES_OP_Min, 13, NULL, 0, 2, (const es_tdesc *[]){&a, &b3},
                      (const void *[]){av, av}, &o, &out),
               ES_EMODEL);
}

/* Where over every type, bool included; a broadcast condition. */
static void test_where(void **state) {
  (void)state;
  es_tdesc c = kh_td(ES_DTYPE_BOOL, 2, (int64_t[]){2, 1});
  uint8_t cv[2] = {1, 0};
  es_tdesc o;
  void *out;
  es_tdesc x64 = kh_td(ES_DTYPE_INT64, 1, (int64_t[]){3}), s64 = kh_td(ES_DTYPE_INT64, 0, NULL);
  int64_t xv[3] = {1, 2, 3}, yv = -1;
  ES_CHECK_RC(eval_n(ES_OP_Where, 13, NULL, 0, 3, (const es_tdesc *[]){&c, &x64, &s64},
                     (const void *[]){cv, xv, &yv}, &o, &out));
  assert_shape(&o, ES_DTYPE_INT64, 2, (int64_t[]){2, 3});
  assert_memory_equal(out, ((int64_t[]){1, 2, 3, -1, -1, -1}), 48);
  es_mem_free(out);
  es_tdesc xb = kh_td(ES_DTYPE_BOOL, 1, (int64_t[]){3});
  uint8_t bx[3] = {1, 1, 0}, by[3] = {0, 0, 1};
  ES_CHECK_RC(eval_n(ES_OP_Where, 13, NULL, 0, 3, (const es_tdesc *[]){&c, &xb, &xb},
                     (const void *[]){cv, bx, by}, &o, &out));
  assert_shape(&o, ES_DTYPE_BOOL, 2, (int64_t[]){2, 3});
  assert_memory_equal(out, ((uint8_t[]){1, 1, 0, 0, 0, 1}), 6);
  es_mem_free(out);
  es_tdesc x8 = kh_td(ES_DTYPE_INT8, 0, NULL);
  int8_t a8 = -5, b8 = 9;
  ES_CHECK_RC(eval_n(ES_OP_Where, 13, NULL, 0, 3, (const es_tdesc *[]){&c, &x8, &x8},
                     (const void *[]){cv, &a8, &b8}, &o, &out));
  assert_shape(&o, ES_DTYPE_INT8, 2, (int64_t[]){2, 1});
  assert_memory_equal(out, ((int8_t[]){-5, 9}), 2);
  es_mem_free(out);
  /* the condition must be bool, x and y of one type, three inputs */
  ES_EXPECT_RC(eval_n(ES_OP_Where, 13, NULL, 0, 3, (const es_tdesc *[]){&x64, &x64, &x64},
                      (const void *[]){xv, xv, xv}, &o, &out),
               ES_EMODEL);
  ES_EXPECT_RC(eval_n(ES_OP_Where, 13, NULL, 0, 3, (const es_tdesc *[]){&c, &x64, &xb},
                      (const void *[]){cv, xv, bx}, &o, &out),
               ES_EMODEL);
  ES_EXPECT_RC(eval_n(ES_OP_Where, 13, NULL, 0, 2, (const es_tdesc *[]){&c, &x64},
                      (const void *[]){cv, xv}, &o, &out),
               ES_EMODEL);
}

/* ==========================================================================
 * In place and layouts
 * ======================================================================== */

static void test_nary_inplace(void **state) {
  (void)state;
  es_tdesc a = kh_td(ES_DTYPE_FLOAT, 2, (int64_t[]){3, 20}), b = kh_td(ES_DTYPE_FLOAT, 1, (int64_t[]){20});
  float av[60], bv[20], cv[60], want[60];
  for (int i = 0; i < 60; i++) {
    av[i] = (float)(i % 7) - 3;
    cv[i] = (float)(i % 5) - 2;
  }
  for (int i = 0; i < 20; i++)
    bv[i] = (float)(i % 3) - 1;
  for (int i = 0; i < 60; i++) {
    float m = bv[i % 20] > av[i] ? bv[i % 20] : av[i];
    want[i] = cv[i] > m ? cv[i] : m;
  }
  kh_run h;
  /* Max(b, a, c): the output may take a (input 1) but not c (read after
   * the row is written) */
  es_knode nd = kh_knode(ES_OP_Max, NULL, 0);
  kh_begin(&h, &nd, 13, 3, (const es_tdesc *[]){&b, &a, &a}, NULL, 0, 1, NULL);
  ES_CHECK_RC(kh_infer(&h));
  assert_int_equal(h.k.inplace, 1);
  void *scratch = es_mem_aligned_alloc(ES_MEM_OTHER, 64, h.k.scratch_bytes + 1);
  ES_CHECK_RC(h.kern->run(&h.k, (const void *[]){bv, av, cv}, (void *[]){av}, scratch));
  assert_memory_equal(av, want, sizeof want);
  es_mem_free(scratch);
  kh_end(&h);
  /* Where(c, x, y): in place on x */
  es_tdesc cd = kh_td(ES_DTYPE_BOOL, 1, (int64_t[]){20});
  uint8_t cond[20];
  for (int i = 0; i < 20; i++)
    cond[i] = (uint8_t)(i % 2);
  nd = kh_knode(ES_OP_Where, NULL, 0);
  kh_begin(&h, &nd, 13, 3, (const es_tdesc *[]){&cd, &a, &b}, NULL, 0, 1, NULL);
  ES_CHECK_RC(kh_infer(&h));
  assert_int_equal(h.k.inplace, 1);
  memcpy(want, cv, sizeof cv);
  for (int i = 0; i < 60; i++)
    want[i] = cond[i % 20] ? cv[i] : bv[i % 20];
  scratch = es_mem_aligned_alloc(ES_MEM_OTHER, 64, h.k.scratch_bytes + 1);
  ES_CHECK_RC(h.kern->run(&h.k, (const void *[]){cond, cv, bv}, (void *[]){cv}, scratch));
  assert_memory_equal(cv, want, sizeof want);
  es_mem_free(scratch);
  kh_end(&h);
  /* a new unary op, Less (bool out of float: never in place) */
  es_tdesc x = kh_td(ES_DTYPE_FLOAT, 1, (int64_t[]){20});
  nd = kh_knode(ES_OP_Tanh, NULL, 0);
  kh_begin(&h, &nd, 13, 1, (const es_tdesc *[]){&x}, NULL, 0, 1, NULL);
  ES_CHECK_RC(kh_infer(&h));
  assert_int_equal(h.k.inplace, 0);
  kh_end(&h);
  nd = kh_knode(ES_OP_Less, NULL, 0);
  kh_begin(&h, &nd, 13, 2, (const es_tdesc *[]){&x, &x}, NULL, 0, 1, NULL);
  ES_CHECK_RC(kh_infer(&h));
  assert_int_equal(h.k.inplace, -1);
  kh_end(&h);
}

/* Where and Max with NHWC inputs give the plain results in NHWC order; an
 * input that cannot be read that way sends the NHWC ones back to plain. */
static void test_nary_nhwc(void **state) {
  (void)state;
  es_tdesc x = kh_td(ES_DTYPE_FLOAT, 4, (int64_t[]){2, 3, 4, 5});
  es_tdesc g = kh_td(ES_DTYPE_FLOAT, 4, (int64_t[]){1, 3, 1, 1});
  es_tdesc c = kh_td(ES_DTYPE_BOOL, 3, (int64_t[]){3, 1, 1});
  uint64_t s = 7;
  float xv[120], yv[120], gv[3] = {-1, 0.5f, 2};
  uint8_t cv[3] = {1, 0, 1};
  kh_rand_f32(&s, xv, 120, -3, 3);
  kh_rand_f32(&s, yv, 120, -3, 3);
  static const es_op ops[2] = {ES_OP_Max, ES_OP_Where};
  for (int k = 0; k < 2; k++) {
    int where = ops[k] == ES_OP_Where;
    es_tdesc d3[3] = {where ? c : x, where ? x : g, x};
    const void *v3[3] = {where ? (const void *)cv : xv, where ? (const void *)xv : gv, yv};
    int n = 3;
    es_tdesc o;
    void *plain;
    ES_CHECK_RC(eval_n(ops[k], 13, NULL, 0, n, (const es_tdesc *[]){&d3[0], &d3[1], &d3[2]}, v3,
                       &o, &plain));
    /* the full inputs in NHWC */
    es_tdesc n3[3] = {d3[0], d3[1], d3[2]};
    for (int i = 0; i < 3; i++)
      if (n3[i].rank == 4 && n3[i].dims[2] > 1)
        n3[i].layout = ES_LAYOUT_NHWC;
    kh_run h;
    es_knode nd = kh_knode(ops[k], NULL, 0);
    kh_begin(&h, &nd, 13, n, (const es_tdesc *[]){&n3[0], &n3[1], &n3[2]}, NULL, 0, 1, NULL);
    ES_CHECK_RC(kh_infer(&h));
    assert_int_equal(h.out[0].layout, ES_LAYOUT_NHWC);
    void *got = kh_exec_plain(&h, v3);
    assert_memory_equal(got, plain, o.nbytes);
    es_mem_free(got);
    kh_end(&h);
    es_mem_free(plain);
  }
  /* a rank-3 full input next to an NHWC one: the NHWC one goes plain */
  es_tdesc xn = kh_as_nhwc(x), chw = kh_td(ES_DTYPE_FLOAT, 3, (int64_t[]){3, 4, 5});
  kh_run h;
  es_knode nd = kh_knode(ES_OP_Min, NULL, 0);
  kh_begin(&h, &nd, 13, 2, (const es_tdesc *[]){&xn, &chw}, NULL, 0, 1, NULL);
  ES_EXPECT_RC(kh_infer(&h), ES_KRELAYOUT);
  assert_int_equal(h.k.want_plain, 1);
  kh_end(&h);
  /* unary ops keep the layout */
  nd = kh_knode(ES_OP_Gelu, NULL, 0);
  kh_begin(&h, &nd, 20, 1, (const es_tdesc *[]){&xn}, NULL, 0, 1, NULL);
  ES_CHECK_RC(kh_infer(&h));
  assert_int_equal(h.out[0].layout, ES_LAYOUT_NHWC);
  kh_end(&h);
}

/* ==========================================================================
 * Identity and Dropout
 * ======================================================================== */

static void test_identity_dropout(void **state) {
  (void)state;
  es_tdesc t = kh_td(ES_DTYPE_FLOAT, 2, (int64_t[]){2, 3});
  float x[6] = {1, -2, 3, NAN, 5, 6};
  es_tdesc o[2];
  void *out[2];
  ES_CHECK_RC(eval1(ES_OP_Identity, NULL, 0, &t, x, &o[0], &out[0]));
  assert_shape(&o[0], ES_DTYPE_FLOAT, 2, t.dims);
  assert_memory_equal(out[0], x, sizeof x);
  es_mem_free(out[0]);
  es_tdesc tb = kh_td(ES_DTYPE_BOOL, 1, (int64_t[]){3});
  uint8_t b[3] = {1, 0, 1};
  ES_CHECK_RC(eval1(ES_OP_Identity, NULL, 0, &tb, b, &o[0], &out[0]));
  assert_memory_equal(out[0], b, 3);
  es_mem_free(out[0]);
  kh_node nd;
  kh_node_init(&nd, ES_OP_Dropout);
  /* opset 13 with ratio and training_mode false: output and a bool mask of
   * ones */
  es_tdesc r = kh_td(ES_DTYPE_FLOAT, 0, NULL), tm = kh_td(ES_DTYPE_BOOL, 0, NULL);
  float ratio = 0.3f;
  uint8_t off = 0, on = 1;
  ES_CHECK_RC(es__kernel_eval(&nd.node, 13, 3, (const es_tdesc *[]){&t, &r, &tm},
                              (const void *[]){x, &ratio, &off}, 2, o, out));
  assert_memory_equal(out[0], x, sizeof x);
  assert_shape(&o[1], ES_DTYPE_BOOL, 2, t.dims);
  assert_memory_equal(out[1], ((uint8_t[]){1, 1, 1, 1, 1, 1}), 6);
  es_mem_free(out[0]);
  es_mem_free(out[1]);
  /* opset 7: the mask has the data's type */
  ES_CHECK_RC(es__kernel_eval(&nd.node, 7, 1, (const es_tdesc *[]){&t}, (const void *[]){x}, 2,
                              o, out));
  assert_shape(&o[1], ES_DTYPE_FLOAT, 2, t.dims);
  assert_memory_equal(out[1], ((float[]){1, 1, 1, 1, 1, 1}), 24);
  es_mem_free(out[0]);
  es_mem_free(out[1]);
  /* training (ratio absent: 0.5): refused while planning when known, when
   * run otherwise */
  ES_EXPECT_RC(es__kernel_eval(&nd.node, 13, 3, (const es_tdesc *[]){&t, NULL, &tm},
                               (const void *[]){x, NULL, &on}, 1, o, out),
               ES_ENOTSUP);
  kh_run h;
  kh_begin(&h, &nd.node, 13, 3, (const es_tdesc *[]){&t, NULL, &tm}, NULL, 0, 1, NULL);
  ES_CHECK_RC(kh_infer(&h));
  assert_int_equal(h.k.inplace, 0);
  ES_CHECK_RC(kh_exec(&h, (const void *[]){x, NULL, &off}, 0, out));
  assert_memory_equal(out[0], x, sizeof x);
  es_mem_free(out[0]);
  ES_EXPECT_RC(kh_exec(&h, (const void *[]){x, NULL, &on}, 0, out), ES_ENOTSUP);
  ES_CHECK_RC(kh_exec(&h, (const void *[]){x, NULL, &off}, 1, out)); /* in place */
  assert_memory_equal(out[0], x, sizeof x);
  es_mem_free(out[0]);
  kh_end(&h);
  /* training with ratio 0 is a copy; a ratio known only when run decides
   * then */
  float zero = 0;
  ES_CHECK_RC(es__kernel_eval(&nd.node, 13, 3, (const es_tdesc *[]){&t, &r, &tm},
                              (const void *[]){x, &zero, &on}, 2, o, out));
  assert_memory_equal(out[0], x, sizeof x);
  assert_memory_equal(out[1], ((uint8_t[]){1, 1, 1, 1, 1, 1}), 6);
  es_mem_free(out[0]);
  es_mem_free(out[1]);
  ES_EXPECT_RC(es__kernel_eval(&nd.node, 13, 3, (const es_tdesc *[]){&t, &r, &tm},
                               (const void *[]){x, &ratio, &on}, 1, o, out),
               ES_ENOTSUP);
  kh_begin(&h, &nd.node, 13, 3, (const es_tdesc *[]){&t, &r, &tm}, NULL, 0, 1, NULL);
  ES_CHECK_RC(kh_infer(&h));
  ES_CHECK_RC(kh_exec(&h, (const void *[]){x, &zero, &on}, 0, out));
  assert_memory_equal(out[0], x, sizeof x);
  es_mem_free(out[0]);
  ES_EXPECT_RC(kh_exec(&h, (const void *[]){x, &ratio, &on}, 0, out), ES_ENOTSUP);
  ES_CHECK_RC(kh_exec(&h, (const void *[]){x, &ratio, &off}, 0, out));
  es_mem_free(out[0]);
  kh_end(&h);
  /* bad inputs */
  es_tdesc ti = kh_td(ES_DTYPE_INT32, 1, (int64_t[]){2});
  ES_EXPECT_RC(es__kernel_eval(&nd.node, 13, 1, (const es_tdesc *[]){&ti}, (const void *[]){x},
                               1, o, out),
               ES_EMODEL);
  ES_EXPECT_RC(es__kernel_eval(&nd.node, 13, 3, (const es_tdesc *[]){&t, &r, &r},
                               (const void *[]){x, &ratio, &ratio}, 1, o, out),
               ES_EMODEL);
  ES_EXPECT_RC(es__kernel_eval(&nd.node, 11, 2, (const es_tdesc *[]){&t, &r},
                               (const void *[]){x, &ratio}, 1, o, out),
               ES_EMODEL);
  kh_attr_int(&nd, "ratio", 1);
  ES_EXPECT_RC(es__kernel_eval(&nd.node, 11, 1, (const es_tdesc *[]){&t}, (const void *[]){x}, 1,
                               o, out),
               ES_EMODEL);
  ES_EXPECT_RC(eval2(ES_OP_Identity, NULL, 0, &t, x, &t, x, &o[0], &out[0]), ES_EMODEL);
}

/* ==========================================================================
 * Fused opcodes: the single-op kernels' bits
 * ======================================================================== */

/* One program per opcode, applied to x (and y for binary ones), against
 * the operator's kernel on the same inputs. */
static void test_fused_opcodes(void **state) {
  (void)state;
  const struct {
    int code;
    es_op op;
    int n_attr;
    es_attr attrs[2];
    float p, q;
  } cases[] = {
      {ES_FE_MAX, ES_OP_Max, 0, {{0}}, 0, 0},
      {ES_FE_MIN, ES_OP_Min, 0, {{0}}, 0, 0},
      {ES_FE_PRELU, ES_OP_PRelu, 0, {{0}}, 0, 0},
      {ES_FE_ABS, ES_OP_Abs, 0, {{0}}, 0, 0},
      {ES_FE_NEG, ES_OP_Neg, 0, {{0}}, 0, 0},
      {ES_FE_EXP, ES_OP_Exp, 0, {{0}}, 0, 0},
      {ES_FE_LOG, ES_OP_Log, 0, {{0}}, 0, 0},
      {ES_FE_TANH, ES_OP_Tanh, 0, {{0}}, 0, 0},
      {ES_FE_ERF, ES_OP_Erf, 0, {{0}}, 0, 0},
      {ES_FE_RECIPROCAL, ES_OP_Reciprocal, 0, {{0}}, 0, 0},
      {ES_FE_FLOOR, ES_OP_Floor, 0, {{0}}, 0, 0},
      {ES_FE_CEIL, ES_OP_Ceil, 0, {{0}}, 0, 0},
      {ES_FE_ROUND, ES_OP_Round, 0, {{0}}, 0, 0},
      {ES_FE_SIGN, ES_OP_Sign, 0, {{0}}, 0, 0},
      {ES_FE_SOFTPLUS, ES_OP_Softplus, 0, {{0}}, 0, 0},
      {ES_FE_SOFTSIGN, ES_OP_Softsign, 0, {{0}}, 0, 0},
      {ES_FE_MISH, ES_OP_Mish, 0, {{0}}, 0, 0},
      {ES_FE_HARDSWISH, ES_OP_HardSwish, 0, {{0}}, 0, 0},
      {ES_FE_GELU, ES_OP_Gelu, 0, {{0}}, 0, 0},
      {ES_FE_GELU_TANH, ES_OP_Gelu, 1, {KH_STR("approximate", "tanh")}, 0, 0},
      {ES_FE_LEAKYRELU, ES_OP_LeakyRelu, 1, {KH_FLOAT("alpha", 0.2f)}, 0.2f, 0},
      {ES_FE_ELU, ES_OP_Elu, 1, {KH_FLOAT("alpha", 1.5f)}, 1.5f, 0},
      {ES_FE_SELU, ES_OP_Selu, 2, {KH_FLOAT("alpha", 1.2f), KH_FLOAT("gamma", 0.9f)}, 1.2f, 0.9f},
      {ES_FE_CELU, ES_OP_Celu, 1, {KH_FLOAT("alpha", 0.6f)}, 0.6f, 0},
      {ES_FE_THRESHOLDEDRELU, ES_OP_ThresholdedRelu, 1, {KH_FLOAT("alpha", 0.3f)}, 0.3f, 0},
      {ES_FE_SHRINK, ES_OP_Shrink, 2, {KH_FLOAT("bias", 0.25f), KH_FLOAT("lambd", 0.6f)}, 0.25f,
       0.6f},
  };
  enum { N = 1000 };
  es_tdesc x = kh_td(ES_DTYPE_FLOAT, 2, (int64_t[]){10, 100});
  es_tdesc y = kh_td(ES_DTYPE_FLOAT, 1, (int64_t[]){100});
  float *xv = malloc(N * sizeof *xv), yv[100];
  assert_non_null(xv);
  uint64_t s = 11;
  kh_rand_f32(&s, xv, N, -12, 12);
  kh_rand_f32(&s, yv, 100, -2, 2);
  xv[0] = NAN, xv[1] = INFINITY, xv[2] = -INFINITY, xv[3] = 0, xv[4] = -0.0f;
  yv[5] = NAN;
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    int bin = es__fe_binary(cases[c].code), par = es__fe_params(cases[c].code);
    int64_t prog[4] = {cases[c].code, 0, bin ? 1 : par ? ES_FE_IMM(0) : 0, bin ? 2 : 1};
    float imm[2] = {cases[c].p, cases[c].q};
    es_attr at[2] = {
        {.name = "_prog", .type = ES_ATTR_INTS, .n = 4, .ints = prog, .tensor = -1},
        {.name = "_prog_f", .type = ES_ATTR_FLOATS, .n = 2, .floats = imm, .tensor = -1}};
    es_tdesc fo, ko;
    void *fused, *kern;
    int n_in = bin ? 2 : 1;
    const es_tdesc *d[2] = {&x, &y};
    const void *v[2] = {xv, yv};
    ES_CHECK_RC(eval_n(ES_OP_FusedElementwise, 13, at, par ? 2 : 1, n_in, d, v, &fo, &fused));
    ES_CHECK_RC(eval_n(cases[c].op, 21, cases[c].attrs, cases[c].n_attr, n_in, d, v, &ko, &kern));
    assert_shape(&fo, ES_DTYPE_FLOAT, ko.rank, ko.dims);
    const float *f = fused, *k = kern;
    for (size_t i = 0; i < ko.count; i++)
      if (memcmp(&f[i], &k[i], sizeof(float)) && !(isnan(f[i]) && isnan(k[i])))
        fail_msg("opcode %d (%s) at %zu: fused %.9g, kernel %.9g", cases[c].code,
                 es__op_name(cases[c].op), i, (double)f[i], (double)k[i]);
    es_mem_free(fused);
    es_mem_free(kern);
  }
  /* parameters must come as two immediates */
  int64_t bad[4] = {ES_FE_ELU, 0, 0, 1};
  es_attr at = {.name = "_prog", .type = ES_ATTR_INTS, .n = 4, .ints = bad, .tensor = -1};
  es_tdesc o;
  void *out;
  ES_EXPECT_RC(eval_n(ES_OP_FusedElementwise, 13, &at, 1, 1, (const es_tdesc *[]){&x},
                      (const void *[]){xv}, &o, &out),
               ES_EMODEL);
  free(xv);
}

/* ==========================================================================
 * Chains of these operators in a loaded model
 * ======================================================================== */

static int graph_count(const es_graph *g, es_op op) {
  int n = 0;
  for (int i = 0; i < g->n_nodes; i++)
    n += g->nodes[i].op == op;
  return n;
}

/* Loads b fused, expects `nodes` nodes of which `fused` FusedElementwise,
 * and compares its output with the unfused model's on x (within tol,
 * relative to 1 + |want|). */
static void check_chain(const ob *b, int nodes, int fused, const int64_t *xd, int rank,
                        float tol) {
  size_t size;
  uint8_t *buf = ob_pack(b, &size);
  es_graph g;
  memset(&g, 0, sizeof g);
  ES_CHECK_RC(es__graph_load_lowered(buf, size, &g));
  free(buf);
  if (g.n_nodes != nodes || graph_count(&g, ES_OP_FusedElementwise) != fused)
    fail_msg("fused graph has %d nodes (%d FusedElementwise), want %d (%d)", g.n_nodes,
             graph_count(&g, ES_OP_FusedElementwise), nodes, fused);
  es__graph_fini(&g);
  size_t n = 1;
  for (int i = 0; i < rank; i++)
    n *= (size_t)xd[i];
  float *x = malloc(n * sizeof *x);
  assert_non_null(x);
  uint64_t s = 5;
  kh_rand_f32(&s, x, n, -6, 6);
  es_tensor in = ob_tensor_f32("x", rank, xd, x);
  float *want, *got;
  size_t nw, ng;
  es_engine_fusion_set(0);
  es_model *plain = ob_load(b);
  es_engine_fusion_set(1);
  es_model *fusedm = ob_load(b);
  ob_run(plain, 1, &in, 1, &want, &nw);
  ob_run(fusedm, 1, &in, 1, &got, &ng);
  assert_int_equal(nw, ng);
  for (size_t i = 0; i < nw; i++)
    if (!(fabsf(got[i] - want[i]) <= tol * (1 + fabsf(want[i]))))
      fail_msg("element %zu: fused %.9g, unfused %.9g", i, (double)got[i], (double)want[i]);
  es_model_release(plain);
  es_model_release(fusedm);
  free(want);
  free(got);
  free(x);
}

static float c_sqrt2_ = 1.41421356f, c_one_ = 1, c_half_ = 0.5f, c_six_ = 6;
static float slope_[4] = {0.1f, 0.2f, 0.3f, 0.4f}, slope_wide_[2] = {0.5f, 0.25f};

static void test_fused_chains(void **state) {
  (void)state;
  static const int64_t xd[4] = {1, 4, 3, 5}, sd[3] = {4, 1, 1}, wd[1] = {2};
  /* GELU as exported from PyTorch: x * 0.5 * (1 + erf(x / sqrt 2)), one
   * node; the bits of the unfused chain */
  ob *b = ob_new(13);
  ob_input(b, "x", 4, xd);
  ob_init_f32(b, "sqrt2", 0, NULL, &c_sqrt2_);
  ob_init_f32(b, "one", 0, NULL, &c_one_);
  ob_init_f32(b, "half", 0, NULL, &c_half_);
  ob_node(b, "Div", "d", 2, "x", "sqrt2");
  ob_node(b, "Erf", "e", 1, "d");
  ob_node(b, "Add", "a", 2, "e", "one");
  ob_node(b, "Mul", "m", 2, "x", "a");
  ob_node(b, "Mul", "y", 2, "m", "half");
  ob_output(b, "y");
  check_chain(b, 1, 1, xd, 4, 0);
  free(b);
  /* activations with parameters and a per-channel PRelu slope, Max with a
   * constant, Tanh, Exp, Log, Softplus, Softsign, HardSwish: one node
   * (Mish, opset 18, is past what the loader reads) */
  b = ob_new(17);
  ob_input(b, "x", 4, xd);
  ob_init_f32(b, "slope", 3, sd, slope_);
  ob_init_f32(b, "six", 0, NULL, &c_six_);
  int n = ob_node(b, "LeakyRelu", "l", 1, "x");
  ob_attr_float(b, n, "alpha", 0.3f);
  ob_node(b, "PRelu", "p", 2, "l", "slope");
  n = ob_node(b, "Selu", "s", 1, "p");
  ob_attr_float(b, n, "gamma", 1.5f);
  ob_node(b, "Max", "mx", 2, "s", "six");
  ob_node(b, "Tanh", "t", 1, "mx");
  ob_node(b, "Exp", "ex", 1, "t");
  ob_node(b, "Log", "lg", 1, "ex");
  ob_node(b, "Softplus", "sp", 1, "lg");
  ob_node(b, "Softsign", "mi", 1, "sp");
  ob_node(b, "HardSwish", "y", 1, "mi");
  ob_output(b, "y");
  check_chain(b, 1, 1, xd, 4, 0);
  free(b);
  /* what must not fuse: a slope that would widen X (the PRelu kernel
   * refuses it: it must stay a node and say so), Max of three inputs,
   * a bool in the middle */
  b = ob_new(13);
  ob_input(b, "x", 4, xd);
  ob_init_f32(b, "six", 0, NULL, &c_six_);
  ob_node(b, "Abs", "a", 1, "x");
  ob_node(b, "Max", "m3", 3, "a", "x", "six");
  ob_node(b, "Neg", "ng", 1, "m3");
  ob_node(b, "Less", "lt", 2, "ng", "six");
  ob_node(b, "Where", "y", 3, "lt", "ng", "x");
  ob_output(b, "y");
  check_chain(b, 5, 0, xd, 4, 0);
  free(b);
  b = ob_new(13);
  ob_input(b, "x", 4, xd);
  ob_init_f32(b, "wide", 1, wd, slope_wide_);
  ob_node(b, "Abs", "a", 1, "x");
  ob_node(b, "PRelu", "y", 2, "a", "wide");
  ob_output(b, "y");
  size_t size;
  uint8_t *buf = ob_pack(b, &size);
  es_graph g;
  memset(&g, 0, sizeof g);
  ES_CHECK_RC(es__graph_load_lowered(buf, size, &g));
  assert_int_equal(graph_count(&g, ES_OP_FusedElementwise), 0);
  assert_int_equal(graph_count(&g, ES_OP_PRelu), 1);
  es__graph_fini(&g);
  free(buf);
  es_model *m = ob_load(b);
  es_plan *p;
  es_tensor_info shape = {.name = "x", .dtype = ES_DTYPE_FLOAT, .rank = 4, .dims = {1, 4, 3, 5}};
  ES_EXPECT_RC(es_model_plan(m, &shape, 1, &p), ES_EMODEL);
  es_model_release(m);
  free(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_unary_accuracy),
      cmocka_unit_test(test_unary_specials),
      cmocka_unit_test(test_rounding),
      cmocka_unit_test(test_activations),
      cmocka_unit_test(test_unary_invalid),
      cmocka_unit_test(test_int_unary),
      cmocka_unit_test(test_bool_ops),
      cmocka_unit_test(test_comparisons),
      cmocka_unit_test(test_mod),
      cmocka_unit_test(test_bitshift),
      cmocka_unit_test(test_prelu),
      cmocka_unit_test(test_max_min_nan),
      cmocka_unit_test(test_nary_broadcast_random),
      cmocka_unit_test(test_sum_mean),
      cmocka_unit_test(test_where),
      cmocka_unit_test(test_nary_inplace),
      cmocka_unit_test(test_nary_nhwc),
      cmocka_unit_test(test_identity_dropout),
      cmocka_unit_test(test_fused_opcodes),
      cmocka_unit_test(test_fused_chains),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
