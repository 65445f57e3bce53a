/* Kernels of the quantisation family (quant.c), on what ONNX's node tests
 * leave out: rounding ties and saturation at both ends of uint8 and int8,
 * NaN and infinities, int32 inputs, per-axis parameters on every axis
 * (negative ones too), blocks (opset 21), DynamicQuantizeLinear on an
 * all-zero input; MatMulInteger with per-row, per-column and batched zero
 * points, broadcast batches, every mix of uint8 and int8, and a sum that
 * leaves int32 (it must wrap as ONNX Runtime's does); the convolutions in
 * 1-D to 3-D with strides, dilations, pads, groups and per-channel weight
 * parameters, against plain loops; QLinearMatMul per row and column. Each
 * is run with its parameters known while planning and only at run time.
 * Malformed nodes must fail with the right code. */
#include "es_test.h"

#include <math.h>
#include <string.h>

#include "kernels/kernel.h"
#include "support/kernel_harness.h"
#include "support/onnx_builder.h"

static int64_t rnd(uint64_t *s, int64_t lo, int64_t hi) {
  return lo + (int64_t)(es_test_rand(s) % (uint64_t)(hi - lo + 1));
}

static void rand_q(uint64_t *s, void *p, es_dtype t, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (t == ES_DTYPE_INT8)
      ((int8_t *)p)[i] = (int8_t)rnd(s, -128, 127);
    else
      ((uint8_t *)p)[i] = (uint8_t)rnd(s, 0, 255);
  }
}

static int32_t get_q(const void *p, es_dtype t, size_t i) {
  return t == ES_DTYPE_INT8 ? ((const int8_t *)p)[i] : ((const uint8_t *)p)[i];
}

/* The rule the kernels implement, written independently: rint half to
 * even, + zp, clamp; NaN is the zero point. */
static int32_t want_q(float v, int32_t zp, es_dtype t) {
  int32_t lo = t == ES_DTYPE_INT8 ? -128 : 0, hi = t == ES_DTYPE_INT8 ? 127 : 255;
  if (isnan(v))
    return zp;
  double r = nearbyint((double)v) + zp;
  return r < lo ? lo : r > hi ? hi : (int32_t)r;
}

/* got is want, or one step from it where v lies within float rounding of
 * a tie (x.5): oneDNN scales the sum in another order (its zero-point
 * compensation after the scale), and a product a few ulps apart rounds
 * the other way there. The rule: one step at most, and only where
 * rounding differs. */
static int step_ok(int32_t got, int32_t want, float v) {
  if (got == want)
    return 1;
  double frac = fabs((double)v - floor((double)v)) - 0.5;
  return abs(got - want) == 1 && fabs(frac) <= 1e-5 * fabs((double)v) + 1e-6;
}

/* ==========================================================================
 * QuantizeLinear / DequantizeLinear
 * ======================================================================== */

static void test_quantize_rounding_saturation(void **state) {
  (void)state;
  static const float x[] = {0.5f,   1.5f,    2.5f,     -0.5f, -1.5f, -2.5f, 127.5f, 128.5f,
                            300.0f, -300.0f, NAN,      INFINITY, -INFINITY, 254.5f, 3.49f, -3.51f};
  static const uint8_t want_u0[] = {0, 2, 2, 0, 0, 0, 128, 128, 255, 0, 0, 255, 0, 254, 3, 0};
  static const int8_t want_i1[] = {1,   3,    3, 1, -1,   -1, 127, 127,
                                   127, -128, 1, 127, -128, 127, 4, -3};
  enum { N = sizeof x / sizeof x[0] };
  es_tdesc xd = KH_TD(ES_DTYPE_FLOAT, N), sd = kh_td(ES_DTYPE_FLOAT, 0, NULL);
  es_tdesc zu = kh_td(ES_DTYPE_UINT8, 0, NULL), zi = KH_TD(ES_DTYPE_INT8, 1);
  float one = 1.0f;
  uint8_t z0 = 0;
  int8_t z1 = 1;
  es_knode node = kh_knode(ES_OP_QuantizeLinear, NULL, 0);
  for (unsigned dyn = 0; dyn < 8; dyn += 6) {
    kh_opts o = {.opset = 13, .dyn = dyn};
    es_tdesc out;
    void *od;
    const es_tdesc *in_u[] = {&xd, &sd, &zu};
    const void *data_u[] = {x, &one, &z0};
    ES_CHECK_RC(kh_eval_with(&node, &o, 3, in_u, data_u, 1, &out, &od));
    assert_int_equal(out.dtype, ES_DTYPE_UINT8);
    assert_memory_equal(od, want_u0, N);
    es_mem_free(od);
    /* no zero point: uint8 with zero point 0 */
    ES_CHECK_RC(kh_eval_with(&node, &o, 2, in_u, data_u, 1, &out, &od));
    assert_int_equal(out.dtype, ES_DTYPE_UINT8);
    assert_memory_equal(od, want_u0, N);
    es_mem_free(od);
    const es_tdesc *in_i[] = {&xd, &sd, &zi};
    const void *data_i[] = {x, &one, &z1};
    ES_CHECK_RC(kh_eval_with(&node, &o, 3, in_i, data_i, 1, &out, &od));
    assert_int_equal(out.dtype, ES_DTYPE_INT8);
    assert_memory_equal(od, want_i1, N);
    es_mem_free(od);
  }
  /* int32 input, scale 2: 5 / 2 = 2.5 -> 2, 7 / 2 = 3.5 -> 4 */
  static const int32_t xi[] = {5, 7, -5, -7, 1000, -1000, 2147483647};
  static const uint8_t want_xi[] = {12, 14, 8, 6, 255, 0, 255};
  es_tdesc xid = KH_TD(ES_DTYPE_INT32, 7);
  float two = 2.0f;
  uint8_t z10 = 10;
  const es_tdesc *in[] = {&xid, &sd, &zu};
  const void *data[] = {xi, &two, &z10};
  es_tdesc out;
  void *od;
  ES_CHECK_RC(kh_eval(&node, 13, 3, in, data, &out, &od));
  assert_memory_equal(od, want_xi, 7);
  es_mem_free(od);
}

/* x [2, 3, 4, 2] quantized and dequantized per axis on each axis (as given
 * and counted from the end), with random scales and zero points. */
static void test_per_axis(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  static const int64_t dims[4] = {2, 3, 4, 2};
  enum { N = 48 };
  float x[N];
  kh_rand_f32(&seed, x, N, -40, 40);
  for (int t = 0; t < 2; t++) {
    es_dtype qt = t ? ES_DTYPE_INT8 : ES_DTYPE_UINT8;
    for (int axis = -4; axis < 4; axis++) {
      int ax = axis < 0 ? axis + 4 : axis;
      int64_t d = dims[ax], inner = 1;
      for (int i = ax + 1; i < 4; i++)
        inner *= dims[i];
      float s[4];
      uint8_t z[4];
      for (int i = 0; i < d; i++)
        s[i] = 0.05f + 0.1f * (float)rnd(&seed, 0, 5);
      rand_q(&seed, z, qt, (size_t)d);
      es_tdesc xd = kh_td(ES_DTYPE_FLOAT, 4, dims), sd = KH_TD(ES_DTYPE_FLOAT, d),
               zd = KH_TD(qt, d), qd, yd;
      es_attr attrs[] = {KH_INT("axis", axis)};
      es_knode qn = kh_knode(ES_OP_QuantizeLinear, attrs, 1);
      es_knode dn = kh_knode(ES_OP_DequantizeLinear, attrs, 1);
      kh_opts o = {.opset = 13, .dyn = (unsigned)(axis & 1) * 6};
      void *q, *y;
      const es_tdesc *qin[] = {&xd, &sd, &zd};
      const void *qdata[] = {x, s, z};
      ES_CHECK_RC(kh_eval_with(&qn, &o, 3, qin, qdata, 1, &qd, &q));
      assert_int_equal(qd.dtype, qt);
      es_tdesc qdesc = kh_td(qt, 4, dims);
      const es_tdesc *din[] = {&qdesc, &sd, &zd};
      const void *ddata[] = {q, s, z};
      ES_CHECK_RC(kh_eval_with(&dn, &o, 3, din, ddata, 1, &yd, &y));
      assert_int_equal(yd.dtype, ES_DTYPE_FLOAT);
      for (int i = 0; i < N; i++) {
        int c = (int)((i / inner) % d);
        int32_t zc = get_q(z, qt, (size_t)c);
        int32_t wq = want_q(x[i] / s[c], zc, qt);
        if (get_q(q, qt, (size_t)i) != wq)
          fail_msg("%s axis %d [%d]: q %d, expected %d", es_dtype_name(qt), axis, i,
                   get_q(q, qt, (size_t)i), wq);
        float wy = (float)(wq - zc) * s[c];
        if (((float *)y)[i] != wy)
          fail_msg("%s axis %d [%d]: y %g, expected %g", es_dtype_name(qt), axis, i,
                   (double)((float *)y)[i], (double)wy);
      }
      es_mem_free(q);
      es_mem_free(y);
    }
  }
}

/* Opset 21 blocks: x [3, 5] with block_size 2 along axis 1 (3 blocks, the
 * last one short) and 2 along axis 0. */
static void test_blocks(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  float x[15];
  kh_rand_f32(&seed, x, 15, -10, 10);
  for (int axis = 0; axis < 2; axis++) {
    int64_t sdims[2] = {axis ? 3 : 2, axis ? 3 : 5};
    float s[10]; /* [3, 3] along axis 1, [2, 5] along axis 0 */
    int8_t z[10];
    for (int i = 0; i < 10; i++) {
      s[i] = 0.03f * (float)(i + 1);
      z[i] = (int8_t)rnd(&seed, -20, 20);
    }
    es_tdesc xd = KH_TD(ES_DTYPE_FLOAT, 3, 5), sd = kh_td(ES_DTYPE_FLOAT, 2, sdims),
             zd = kh_td(ES_DTYPE_INT8, 2, sdims), qd, yd;
    es_attr attrs[] = {KH_INT("axis", axis), KH_INT("block_size", 2)};
    es_knode qn = kh_knode(ES_OP_QuantizeLinear, attrs, 2);
    es_knode dn = kh_knode(ES_OP_DequantizeLinear, attrs, 2);
    void *q, *y;
    const es_tdesc *qin[] = {&xd, &sd, &zd};
    const void *qdata[] = {x, s, z};
    ES_CHECK_RC(kh_eval(&qn, 21, 3, qin, qdata, &qd, &q));
    es_tdesc qdesc = KH_TD(ES_DTYPE_INT8, 3, 5);
    const es_tdesc *din[] = {&qdesc, &sd, &zd};
    const void *ddata[] = {q, s, z};
    ES_CHECK_RC(kh_eval(&dn, 21, 3, din, ddata, &yd, &y));
    for (int r = 0; r < 3; r++)
      for (int c = 0; c < 5; c++) {
        int i = r * 5 + c;
        int si = axis ? r * 3 + c / 2 : (r / 2) * 5 + c;
        int32_t wq = want_q(x[i] / s[si], z[si], ES_DTYPE_INT8);
        assert_int_equal(((int8_t *)q)[i], wq);
        assert_true(((float *)y)[i] == (float)(wq - z[si]) * s[si]);
      }
    es_mem_free(q);
    es_mem_free(y);
  }
}

/* int32 dequantization: the difference is exact even where it leaves int32. */
static void test_dequantize_int32(void **state) {
  (void)state;
  static const int32_t x[] = {2147483647, -2147483647 - 1, 0, 123456789};
  int32_t z = -2147483647 - 1;
  float s = 0.5f;
  es_tdesc xd = KH_TD(ES_DTYPE_INT32, 4), sd = kh_td(ES_DTYPE_FLOAT, 0, NULL),
           zd = kh_td(ES_DTYPE_INT32, 0, NULL), yd;
  const es_tdesc *in[] = {&xd, &sd, &zd};
  const void *data[] = {x, &s, &z};
  es_knode node = kh_knode(ES_OP_DequantizeLinear, NULL, 0);
  void *y;
  ES_CHECK_RC(kh_eval(&node, 13, 3, in, data, &yd, &y));
  for (int i = 0; i < 4; i++)
    assert_true(((float *)y)[i] == (float)((int64_t)x[i] - z) * 0.5f);
  es_mem_free(y);
}

static void test_quantize_errors(void **state) {
  (void)state;
  float buf[64] = {0};
  const void *data[] = {buf, buf, buf};
  es_tdesc x = KH_TD(ES_DTYPE_FLOAT, 2, 3), s0 = kh_td(ES_DTYPE_FLOAT, 0, NULL),
           s3 = KH_TD(ES_DTYPE_FLOAT, 3), s2 = KH_TD(ES_DTYPE_FLOAT, 2),
           z3 = KH_TD(ES_DTYPE_UINT8, 3), z2 = KH_TD(ES_DTYPE_UINT8, 2),
           zi32 = kh_td(ES_DTYPE_INT32, 0, NULL), xb = KH_TD(ES_DTYPE_BOOL, 2, 3),
           si = kh_td(ES_DTYPE_INT32, 0, NULL), x8 = KH_TD(ES_DTYPE_UINT8, 2, 3),
           zi8 = kh_td(ES_DTYPE_INT8, 0, NULL), sb = KH_TD(ES_DTYPE_FLOAT, 2, 2);
  es_tdesc out;
  void *od = NULL;
  es_knode q = kh_knode(ES_OP_QuantizeLinear, NULL, 0);
  es_knode dq = kh_knode(ES_OP_DequantizeLinear, NULL, 0);
  struct {
    es_knode *node;
    int64_t opset;
    const es_tdesc *in[3];
    int n;
    int want;
  } cases[] = {
      {&q, 13, {&x, &s3, &z3}, 3, 0},         /* per axis 1: fine */
      {&q, 10, {&x, &s3, &z3}, 3, ES_EMODEL}, /* per axis before opset 13 */
      {&q, 13, {&x, &s2, &z2}, 3, ES_EMODEL}, /* 2 scales for axis 1 of extent 3 */
      {&q, 13, {&x, &s3, &z2}, 3, ES_EMODEL}, /* zero point's shape differs */
      {&q, 13, {&x, &s0, &zi32}, 3, ES_EMODEL}, /* int32 zero point to quantize */
      {&q, 13, {&xb, &s0}, 2, ES_EMODEL},     /* bool x */
      {&q, 13, {&x, &si}, 2, ES_EMODEL},      /* int32 scale */
      {&q, 13, {&x}, 1, ES_EMODEL},           /* no scale */
      {&q, 13, {&x, &sb}, 2, ES_EMODEL},      /* 2-D scale without block_size */
      {&dq, 13, {&x8, &s0, &zi8}, 3, ES_EMODEL}, /* zero point int8, x uint8 */
      {&dq, 13, {&x, &s0}, 2, ES_EMODEL},     /* float x to dequantize */
      {&dq, 13, {&x8, &s3}, 2, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int rc = es__kernel_eval(cases[i].node, cases[i].opset, cases[i].n, cases[i].in, data, 1,
                             &out, &od);
    if (rc != cases[i].want)
      fail_msg("case %zu: %d %s, expected %s (%s)", i, rc, es_err_name(rc),
               es_err_name(cases[i].want), es_last_error_detail());
    if (rc == 0)
      es_mem_free(od);
  }
  /* attributes */
  struct {
    es_attr a;
    int64_t opset;
    const es_tdesc *s;
    int want;
  } acases[] = {
      {KH_INT("axis", 2), 13, &s3, ES_EMODEL},         /* x has rank 2 */
      {KH_INT("axis", -3), 13, &s3, ES_EMODEL},
      {KH_INT("axis", 7), 13, &s0, 0},                 /* per tensor: axis unused */
      {KH_INT("saturate", 2), 19, &s0, ES_EMODEL},
      {KH_INT("saturate", 0), 19, &s0, 0},             /* integer outputs: ignored */
      {KH_INT("output_dtype", 17), 21, &s0, ES_ENOTSUP}, /* float8 */
      {KH_INT("output_dtype", 21), 21, &s0, ES_ENOTSUP}, /* uint4 */
      {KH_INT("output_dtype", 1), 21, &s0, ES_EMODEL},   /* float */
      {KH_INT("output_dtype", 3), 21, &s0, 0},
      {KH_INT("block_size", -1), 21, &s0, ES_EMODEL},
      {KH_INT("block_size", 2), 21, &sb, 0},           /* [2, 3] in blocks of 2 on axis 1 */
      {KH_INT("block_size", 3), 21, &sb, ES_EMODEL},   /* would be [2, 1] */
  };
  for (size_t i = 0; i < sizeof acases / sizeof acases[0]; i++) {
    es_knode n = kh_knode(ES_OP_QuantizeLinear, &acases[i].a, 1);
    const es_tdesc *in[] = {&x, acases[i].s};
    int rc = es__kernel_eval(&n, acases[i].opset, 2, in, data, 1, &out, &od);
    if (rc != acases[i].want)
      fail_msg("attribute case %zu (%s): %d %s, expected %s (%s)", i, acases[i].a.name, rc,
               es_err_name(rc), es_err_name(acases[i].want), es_last_error_detail());
    if (rc == 0) {
      if (!strcmp(acases[i].a.name, "output_dtype"))
        assert_int_equal(out.dtype, ES_DTYPE_INT8);
      es_mem_free(od);
    }
  }
  /* output_dtype against the zero point's type */
  es_attr a = KH_INT("output_dtype", 3);
  es_knode n = kh_knode(ES_OP_QuantizeLinear, &a, 1);
  es_tdesc zu = kh_td(ES_DTYPE_UINT8, 0, NULL);
  const es_tdesc *in[] = {&x, &s0, &zu};
  ES_EXPECT_RC(es__kernel_eval(&n, 21, 3, in, data, 1, &out, &od), ES_EMODEL);
}

/* ==========================================================================
 * DynamicQuantizeLinear
 * ======================================================================== */

static void dql_eval(const float *x, int64_t n, uint8_t *y, float *scale, uint8_t *zp) {
  es_tdesc xd = KH_TD(ES_DTYPE_FLOAT, n), out[3];
  const es_tdesc *in[] = {&xd};
  const void *data[] = {x};
  void *od[3];
  es_knode node = kh_knode(ES_OP_DynamicQuantizeLinear, NULL, 0);
  ES_CHECK_RC(es__kernel_eval(&node, 11, 1, in, data, 3, out, od));
  assert_int_equal(out[0].dtype, ES_DTYPE_UINT8);
  assert_int_equal(out[1].rank, 0);
  assert_int_equal(out[2].dtype, ES_DTYPE_UINT8);
  memcpy(y, od[0], (size_t)n);
  *scale = *(float *)od[1];
  *zp = *(uint8_t *)od[2];
  for (int i = 0; i < 3; i++)
    es_mem_free(od[i]);
}

static void test_dynamic_quantize(void **state) {
  (void)state;
  uint8_t y[64], zp;
  float scale;
  /* all zeros: an empty range gets scale 1 (no division by zero) */
  float zeros[4] = {0};
  dql_eval(zeros, 4, y, &scale, &zp);
  assert_true(scale == 1.0f);
  assert_int_equal(zp, 0);
  for (int i = 0; i < 4; i++)
    assert_int_equal(y[i], 0);
  /* all positive: the range starts at 0, zero point 0 */
  float pos[3] = {1.0f, 2.0f, 5.1f};
  dql_eval(pos, 3, y, &scale, &zp);
  assert_true(scale == 5.1f / 255.0f);
  assert_int_equal(zp, 0);
  assert_int_equal(y[2], 255);
  /* all negative: zero point 255 */
  float neg[3] = {-1.0f, -2.0f, -5.1f};
  dql_eval(neg, 3, y, &scale, &zp);
  assert_int_equal(zp, 255);
  assert_int_equal(y[2], 0);
  /* NaN is ignored by the range and quantizes to the zero point */
  float withnan[3] = {NAN, -1.0f, 3.0f};
  dql_eval(withnan, 3, y, &scale, &zp);
  assert_true(scale == 4.0f / 255.0f);
  assert_int_equal(zp, 64); /* rint(1 / (4 / 255)) = rint(63.75) */
  assert_int_equal(y[0], zp);
  /* random: the rule, element by element */
  uint64_t seed = es_test_seed();
  float x[64];
  kh_rand_f32(&seed, x, 64, -3, 7);
  dql_eval(x, 64, y, &scale, &zp);
  float mn = 0, mx = 0;
  for (int i = 0; i < 64; i++) {
    mn = x[i] < mn ? x[i] : mn;
    mx = x[i] > mx ? x[i] : mx;
  }
  assert_true(scale == (mx - mn) / 255.0f);
  assert_int_equal(zp, want_q(-mn / scale, 0, ES_DTYPE_UINT8));
  for (int i = 0; i < 64; i++)
    assert_int_equal(y[i], want_q(x[i] / scale, zp, ES_DTYPE_UINT8));
}

/* ==========================================================================
 * MatMulInteger and QLinearMatMul
 * ======================================================================== */

/* Zero point forms: scalar, [1], per row / column (1-D), batched N-D. */
enum { ZP_NONE, ZP_SCALAR, ZP_ONE, ZP_VEC, ZP_ND, ZP_FORMS };

static void test_matmul_integer(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  int cases = 0;
  for (int types = 0; types < 4; types++)
    for (int za_form = 0; za_form < ZP_FORMS; za_form++)
      for (int zb_form = 0; zb_form < ZP_FORMS; zb_form++) {
        es_dtype at = types & 1 ? ES_DTYPE_INT8 : ES_DTYPE_UINT8;
        es_dtype bt = types & 2 ? ES_DTYPE_INT8 : ES_DTYPE_UINT8;
        int64_t m = rnd(&seed, 1, 5), k = rnd(&seed, 1, 9), n = rnd(&seed, 1, 6);
        /* A [2, 1, m, k] x B [3, k, n] -> [2, 3, m, n]; the batched zero
         * points follow their operand's batch ([2, 1, m, 1], [3, 1, n]) */
        int64_t adims[4] = {2, 1, m, k}, bdims[3] = {3, k, n};
        int64_t zadims[4] = {2, 1, m, 1}, zbdims[3] = {3, 1, n};
        size_t na = (size_t)(2 * m * k), nb = (size_t)(3 * k * n);
        uint8_t a[2 * 5 * 9], b[3 * 9 * 6], za[2 * 5], zb[3 * 6];
        rand_q(&seed, a, at, na);
        rand_q(&seed, b, bt, nb);
        rand_q(&seed, za, at, sizeof za);
        rand_q(&seed, zb, bt, sizeof zb);
        es_tdesc ad = kh_td(at, 4, adims), bd = kh_td(bt, 3, bdims), zad, zbd;
        switch (za_form) {
        case ZP_SCALAR: zad = kh_td(at, 0, NULL); break;
        case ZP_ONE: zad = KH_TD(at, 1); break;
        case ZP_VEC: zad = KH_TD(at, m); break;
        default: zad = kh_td(at, 4, zadims); break;
        }
        switch (zb_form) {
        case ZP_SCALAR: zbd = kh_td(bt, 0, NULL); break;
        case ZP_ONE: zbd = KH_TD(bt, 1); break;
        case ZP_VEC: zbd = KH_TD(bt, n); break;
        default: zbd = kh_td(bt, 3, zbdims); break;
        }
        const es_tdesc *in[4] = {&ad, &bd, za_form ? &zad : NULL, zb_form ? &zbd : NULL};
        const void *data[4] = {a, b, za, zb};
        int n_in = zb_form ? 4 : za_form ? 3 : 2;
        es_knode node = kh_knode(ES_OP_MatMulInteger, NULL, 0);
        kh_opts o = {.opset = 10, .dyn = (unsigned)rnd(&seed, 0, 15)};
        es_tdesc out;
        void *od;
        ES_CHECK_RC(kh_eval_with(&node, &o, n_in, in, data, 1, &out, &od));
        assert_int_equal(out.dtype, ES_DTYPE_INT32);
        assert_int_equal(out.rank, 4);
        assert_int_equal(out.dims[1], 3);
        const int32_t *y = od;
        for (int64_t b0 = 0; b0 < 2; b0++)
          for (int64_t b1 = 0; b1 < 3; b1++)
            for (int64_t i = 0; i < m; i++)
              for (int64_t j = 0; j < n; j++) {
                int32_t zai = za_form == ZP_NONE ? 0
                              : za_form == ZP_VEC ? get_q(za, at, (size_t)i)
                              : za_form == ZP_ND  ? get_q(za, at, (size_t)(b0 * m + i))
                                                  : get_q(za, at, 0);
                int32_t zbj = zb_form == ZP_NONE ? 0
                              : zb_form == ZP_VEC ? get_q(zb, bt, (size_t)j)
                              : zb_form == ZP_ND  ? get_q(zb, bt, (size_t)(b1 * n + j))
                                                  : get_q(zb, bt, 0);
                int64_t s = 0;
                for (int64_t t = 0; t < k; t++)
                  s += (int64_t)(get_q(a, at, (size_t)((b0 * m + i) * k + t)) - zai) *
                       (get_q(b, bt, (size_t)((b1 * k + t) * n + j)) - zbj);
                int32_t got = y[((b0 * 3 + b1) * m + i) * n + j];
                if (got != s)
                  fail_msg("%s x %s, zero points %d/%d: [%lld,%lld,%lld,%lld] = %d, expected "
                           "%lld", es_dtype_name(at), es_dtype_name(bt), za_form, zb_form,
                           (long long)b0, (long long)b1, (long long)i, (long long)j, got,
                           (long long)s);
              }
        es_mem_free(od);
        cases++;
      }
  assert_int_equal(cases, 4 * ZP_FORMS * ZP_FORMS);
}

/* K = 40000 products of 255 * 255: 2.6e9 does not fit int32; the sum wraps
 * modulo 2^32 (as ONNX Runtime's int32 accumulator does), defined here. */
static void test_matmul_integer_wraps(void **state) {
  (void)state;
  enum { K = 40000 };
  uint8_t *a = malloc(K), *b = malloc(K);
  memset(a, 255, K);
  memset(b, 255, K);
  es_tdesc ad = KH_TD(ES_DTYPE_UINT8, 1, K), bd = KH_TD(ES_DTYPE_UINT8, K, 1), out;
  const es_tdesc *in[] = {&ad, &bd};
  const void *data[] = {a, b};
  es_knode node = kh_knode(ES_OP_MatMulInteger, NULL, 0);
  void *od;
  ES_CHECK_RC(kh_eval(&node, 10, 2, in, data, &out, &od));
  uint32_t want = (uint32_t)(65025ull * K);
  assert_int_equal(*(int32_t *)od, (int32_t)want);
  es_mem_free(od);
  free(a);
  free(b);
}

static void test_qlinear_matmul(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  for (int c = 0; c < 16; c++) {
    int per_a = c & 1, per_b = (c >> 1) & 1;
    es_dtype at = c & 4 ? ES_DTYPE_INT8 : ES_DTYPE_UINT8, yt = c & 8 ? ES_DTYPE_INT8
                                                                      : ES_DTYPE_UINT8;
    es_dtype bt = ES_DTYPE_INT8;
    int64_t m = rnd(&seed, 1, 6), k = rnd(&seed, 1, 12), n = rnd(&seed, 1, 7);
    uint8_t a[6 * 12], b[12 * 7], za[6], zb[7], zy;
    float sa[6], sb[7], sy = 0.37f;
    rand_q(&seed, a, at, (size_t)(m * k));
    rand_q(&seed, b, bt, (size_t)(k * n));
    rand_q(&seed, za, at, 6);
    rand_q(&seed, zb, bt, 7);
    rand_q(&seed, &zy, yt, 1);
    kh_rand_f32(&seed, sa, 6, 0.001f, 0.05f);
    kh_rand_f32(&seed, sb, 7, 0.001f, 0.05f);
    es_tdesc ad = KH_TD(at, m, k), bd = KH_TD(bt, k, n);
    es_tdesc sad = per_a ? KH_TD(ES_DTYPE_FLOAT, m) : kh_td(ES_DTYPE_FLOAT, 0, NULL);
    es_tdesc zad = per_a ? KH_TD(at, m) : kh_td(at, 0, NULL);
    es_tdesc sbd = per_b ? KH_TD(ES_DTYPE_FLOAT, n) : KH_TD(ES_DTYPE_FLOAT, 1);
    es_tdesc zbd = per_b ? KH_TD(bt, n) : KH_TD(bt, 1);
    es_tdesc syd = kh_td(ES_DTYPE_FLOAT, 0, NULL), zyd = kh_td(yt, 0, NULL), out;
    const es_tdesc *in[8] = {&ad, &sad, &zad, &bd, &sbd, &zbd, &syd, &zyd};
    const void *data[8] = {a, sa, za, b, sb, zb, &sy, &zy};
    es_knode node = kh_knode(ES_OP_QLinearMatMul, NULL, 0);
    kh_opts o = {.opset = 10, .dyn = c & 8 ? 0xffu : 0x36u};
    void *od;
    ES_CHECK_RC(kh_eval_with(&node, &o, 8, in, data, 1, &out, &od));
    assert_int_equal(out.dtype, yt);
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        int32_t zai = get_q(za, at, per_a ? (size_t)i : 0);
        int32_t zbj = get_q(zb, bt, per_b ? (size_t)j : 0);
        int32_t s = 0;
        for (int64_t t = 0; t < k; t++)
          s += (get_q(a, at, (size_t)(i * k + t)) - zai) * (get_q(b, bt, (size_t)(t * n + j)) - zbj);
        float mult = sa[per_a ? i : 0] * sb[per_b ? j : 0] / sy;
        int32_t want = want_q((float)s * mult, get_q(&zy, yt, 0), yt);
        int32_t got = get_q(od, yt, (size_t)(i * n + j));
        if (got != want)
          fail_msg("case %d [%lld,%lld]: %d, expected %d", c, (long long)i, (long long)j, got,
                   want);
      }
    es_mem_free(od);
  }
}

static void test_matmul_errors(void **state) {
  (void)state;
  uint8_t buf[256] = {0};
  const void *data[8] = {buf, buf, buf, buf, buf, buf, buf, buf};
  es_tdesc a = KH_TD(ES_DTYPE_UINT8, 3, 4), b = KH_TD(ES_DTYPE_INT8, 4, 2),
           bk = KH_TD(ES_DTYPE_INT8, 5, 2), af = KH_TD(ES_DTYPE_FLOAT, 3, 4),
           za2 = KH_TD(ES_DTYPE_UINT8, 2), za3 = KH_TD(ES_DTYPE_UINT8, 3),
           zai8 = KH_TD(ES_DTYPE_INT8, 3), zb3 = KH_TD(ES_DTYPE_INT8, 3),
           a3 = KH_TD(ES_DTYPE_UINT8, 2, 3, 4), b3 = KH_TD(ES_DTYPE_INT8, 3, 4, 2), out;
  void *od = NULL;
  es_knode node = kh_knode(ES_OP_MatMulInteger, NULL, 0);
  struct {
    const es_tdesc *in[4];
    int n;
    int want;
  } cases[] = {
      {{&a, &b, &za3}, 3, 0},
      {{&a, &bk}, 2, ES_EMODEL},           /* K differs */
      {{&af, &b}, 2, ES_EMODEL},           /* float A */
      {{&a, &b, &za2}, 3, ES_EMODEL},      /* 2 zero points for 3 rows */
      {{&a, &b, &zai8}, 3, ES_EMODEL},     /* zero point's type differs from A's */
      {{&a, &b, NULL, &zb3}, 4, ES_EMODEL}, /* 3 zero points for 2 columns */
      {{&a3, &b3}, 2, ES_EMODEL},          /* batches 2 and 3 */
      {{&a}, 1, ES_EMODEL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int rc = es__kernel_eval(&node, 10, cases[i].n, cases[i].in, data, 1, &out, &od);
    if (rc != cases[i].want)
      fail_msg("case %zu: %d %s, expected %s (%s)", i, rc, es_err_name(rc),
               es_err_name(cases[i].want), es_last_error_detail());
    if (rc == 0)
      es_mem_free(od);
  }
  /* QLinearMatMul: every input required; y's parameters scalar */
  es_tdesc s = kh_td(ES_DTYPE_FLOAT, 0, NULL), z = kh_td(ES_DTYPE_UINT8, 0, NULL),
           zb = kh_td(ES_DTYPE_INT8, 0, NULL), s2 = KH_TD(ES_DTYPE_FLOAT, 2),
           zy32 = kh_td(ES_DTYPE_INT32, 0, NULL);
  es_knode ql = kh_knode(ES_OP_QLinearMatMul, NULL, 0);
  const es_tdesc *ok[8] = {&a, &s, &z, &b, &s, &zb, &s, &z};
  ES_CHECK_RC(es__kernel_eval(&ql, 10, 8, ok, data, 1, &out, &od));
  es_mem_free(od);
  const es_tdesc *bad_ys[8] = {&a, &s, &z, &b, &s, &zb, &s2, &z};
  ES_EXPECT_RC(es__kernel_eval(&ql, 10, 8, bad_ys, data, 1, &out, &od), ES_EMODEL);
  const es_tdesc *bad_zy[8] = {&a, &s, &z, &b, &s, &zb, &s, &zy32};
  ES_EXPECT_RC(es__kernel_eval(&ql, 10, 8, bad_zy, data, 1, &out, &od), ES_EMODEL);
  const es_tdesc *missing[8] = {&a, &s, NULL, &b, &s, &zb, &s, &z};
  ES_EXPECT_RC(es__kernel_eval(&ql, 10, 8, missing, data, 1, &out, &od), ES_EMODEL);
  ES_EXPECT_RC(es__kernel_eval(&ql, 10, 7, ok, data, 1, &out, &od), ES_EMODEL);
  const es_tdesc *bad_sa[8] = {&a, &s2, &z, &b, &s, &zb, &s, &z}; /* 2 scales, 3 rows */
  ES_EXPECT_RC(es__kernel_eval(&ql, 10, 8, bad_sa, data, 1, &out, &od), ES_EMODEL);
}

/* ==========================================================================
 * ConvInteger and QLinearConv
 * ======================================================================== */

typedef struct conv_case {
  int nsp;
  int64_t n, c, m, g;
  int64_t in[3], ker[3], str[3], dil[3], pb[3], pe[3];
} conv_case;

/* Output extent per spatial axis. */
static int64_t conv_out(const conv_case *cc, int i) {
  return (cc->in[i] + cc->pb[i] + cc->pe[i] - (cc->ker[i] - 1) * cc->dil[i] - 1) / cc->str[i] + 1;
}

/* The int32 sums of (x - zx)(w - zw), by the definition; padding adds
 * nothing (it holds the zero point). */
static void conv_ref(const conv_case *cc, const void *x, es_dtype xt, int32_t zx, const void *w,
                     es_dtype wt, const int32_t *zw, int64_t *y) {
  int64_t in[3] = {1, 1, 1}, k[3] = {1, 1, 1}, o[3] = {1, 1, 1}, st[3] = {1, 1, 1},
          dl[3] = {1, 1, 1}, pb[3] = {0, 0, 0};
  for (int i = 0; i < cc->nsp; i++) {
    int s = 3 - cc->nsp + i;
    in[s] = cc->in[i];
    k[s] = cc->ker[i];
    o[s] = conv_out(cc, i);
    st[s] = cc->str[i];
    dl[s] = cc->dil[i];
    pb[s] = cc->pb[i];
  }
  int64_t cg = cc->c / cc->g, mg = cc->m / cc->g;
  for (int64_t nb = 0; nb < cc->n; nb++)
    for (int64_t oc = 0; oc < cc->m; oc++)
      for (int64_t od = 0; od < o[0]; od++)
        for (int64_t oh = 0; oh < o[1]; oh++)
          for (int64_t ow = 0; ow < o[2]; ow++) {
            int64_t s = 0;
            for (int64_t ic = 0; ic < cg; ic++)
              for (int64_t a = 0; a < k[0]; a++)
                for (int64_t b = 0; b < k[1]; b++)
                  for (int64_t c = 0; c < k[2]; c++) {
                    int64_t id = od * st[0] - pb[0] + a * dl[0];
                    int64_t ih = oh * st[1] - pb[1] + b * dl[1];
                    int64_t iw = ow * st[2] - pb[2] + c * dl[2];
                    if (id < 0 || id >= in[0] || ih < 0 || ih >= in[1] || iw < 0 || iw >= in[2])
                      continue;
                    int64_t xc = nb * cc->c + (oc / mg) * cg + ic;
                    int32_t xv = get_q(x, xt, (size_t)(((xc * in[0] + id) * in[1] + ih) * in[2] + iw));
                    int32_t wv = get_q(w, wt, (size_t)((((oc * cg + ic) * k[0] + a) * k[1] + b) * k[2] + c));
                    s += (int64_t)(xv - zx) * (wv - zw[oc]);
                  }
            *y++ = s;
          }
}

static void conv_attrs(const conv_case *cc, int64_t *pads, es_attr *attrs) {
  for (int i = 0; i < cc->nsp; i++) {
    pads[i] = cc->pb[i];
    pads[cc->nsp + i] = cc->pe[i];
  }
  attrs[0] = (es_attr){.name = "strides", .type = ES_ATTR_INTS, .n = (size_t)cc->nsp,
                       .ints = cc->str, .tensor = -1};
  attrs[1] = (es_attr){.name = "dilations", .type = ES_ATTR_INTS, .n = (size_t)cc->nsp,
                       .ints = cc->dil, .tensor = -1};
  attrs[2] = (es_attr){.name = "pads", .type = ES_ATTR_INTS, .n = 2 * (size_t)cc->nsp,
                       .ints = pads, .tensor = -1};
  attrs[3] = KH_INT("group", cc->g);
}

static void random_case(uint64_t *seed, int nsp, conv_case *cc) {
  memset(cc, 0, sizeof *cc);
  cc->nsp = nsp;
  cc->n = rnd(seed, 1, 2);
  cc->g = rnd(seed, 1, 2);
  cc->c = cc->g * rnd(seed, 1, 3);
  cc->m = cc->g * rnd(seed, 1, 3);
  for (int i = 0; i < nsp; i++) {
    cc->ker[i] = rnd(seed, 1, 3);
    cc->str[i] = rnd(seed, 1, 2);
    cc->dil[i] = rnd(seed, 1, 2);
    cc->pb[i] = rnd(seed, 0, 2);
    cc->pe[i] = rnd(seed, 0, 2);
    int64_t span = (cc->ker[i] - 1) * cc->dil[i] + 1;
    cc->in[i] = rnd(seed, span, span + (nsp == 3 ? 3 : 6));
  }
}

static size_t count_of(const int64_t *d, int n) {
  size_t c = 1;
  for (int i = 0; i < n; i++)
    c *= (size_t)d[i];
  return c;
}

static void test_conv_integer(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  for (int r = 0; r < 36; r++) {
    conv_case cc;
    random_case(&seed, 1 + r % 3, &cc);
    es_dtype xt = r & 4 ? ES_DTYPE_INT8 : ES_DTYPE_UINT8, wt = r & 8 ? ES_DTYPE_INT8
                                                                      : ES_DTYPE_UINT8;
    int per_ch = (r >> 4) & 1, qlinear = r >= 18;
    int64_t xd[5] = {cc.n, cc.c}, wd[5] = {cc.m, cc.c / cc.g}, yd[5] = {cc.n, cc.m};
    for (int i = 0; i < cc.nsp; i++) {
      xd[2 + i] = cc.in[i];
      wd[2 + i] = cc.ker[i];
      yd[2 + i] = conv_out(&cc, i);
    }
    size_t nx = count_of(xd, 2 + cc.nsp), nw = count_of(wd, 2 + cc.nsp),
           ny = count_of(yd, 2 + cc.nsp);
    uint8_t *x = malloc(nx), *w = malloc(nw), zx, zwv[6];
    int32_t zw[6], bias[6];
    rand_q(&seed, x, xt, nx);
    rand_q(&seed, w, wt, nw);
    rand_q(&seed, &zx, xt, 1);
    rand_q(&seed, zwv, wt, 6);
    for (int i = 0; i < 6; i++) {
      zw[i] = get_q(zwv, wt, per_ch ? (size_t)i : 0);
      bias[i] = (int32_t)rnd(&seed, -5000, 5000);
    }
    int64_t pads[6];
    es_attr attrs[4];
    conv_attrs(&cc, pads, attrs);
    es_tdesc xdesc = kh_td(xt, 2 + cc.nsp, xd), wdesc = kh_td(wt, 2 + cc.nsp, wd);
    es_tdesc zxd = kh_td(xt, 0, NULL), zwd = per_ch ? KH_TD(wt, cc.m) : KH_TD(wt, 1), out;
    int64_t *want = malloc(ny * sizeof *want);
    conv_ref(&cc, x, xt, get_q(&zx, xt, 0), w, wt, zw, want);
    void *od;
    kh_opts o = {.opset = 10, .dyn = (unsigned)rnd(&seed, 0, 511)};
    if (!qlinear) {
      es_knode node = kh_knode(ES_OP_ConvInteger, attrs, 4);
      const es_tdesc *in[4] = {&xdesc, &wdesc, &zxd, &zwd};
      const void *data[4] = {x, w, &zx, zwv};
      ES_CHECK_RC(kh_eval_with(&node, &o, 4, in, data, 1, &out, &od));
      assert_int_equal(out.dtype, ES_DTYPE_INT32);
      for (size_t i = 0; i < ny; i++)
        if (((int32_t *)od)[i] != want[i])
          fail_msg("ConvInteger case %d [%zu]: %d, expected %lld", r, i, ((int32_t *)od)[i],
                   (long long)want[i]);
    } else {
      es_dtype yt = r & 1 ? ES_DTYPE_INT8 : ES_DTYPE_UINT8;
      float sx = 0.02f, sw[6], sy = 0.7f;
      uint8_t zy;
      rand_q(&seed, &zy, yt, 1);
      kh_rand_f32(&seed, sw, 6, 0.001f, 0.1f);
      es_tdesc s0 = kh_td(ES_DTYPE_FLOAT, 0, NULL), zyd = kh_td(yt, 0, NULL),
               swd = per_ch ? KH_TD(ES_DTYPE_FLOAT, cc.m) : KH_TD(ES_DTYPE_FLOAT, 1),
               bd = KH_TD(ES_DTYPE_INT32, cc.m);
      int has_bias = r & 2;
      es_knode node = kh_knode(ES_OP_QLinearConv, attrs, 4);
      const es_tdesc *in[9] = {&xdesc, &s0, &zxd, &wdesc, &swd, &zwd, &s0, &zyd, &bd};
      const void *data[9] = {x, &sx, &zx, w, sw, zwv, &sy, &zy, bias};
      /* the two scalars share one descriptor but not one value */
      data[6] = &sy;
      ES_CHECK_RC(kh_eval_with(&node, &o, has_bias ? 9 : 8, in, data, 1, &out, &od));
      assert_int_equal(out.dtype, yt);
      int64_t ovol = (int64_t)ny / (cc.n * cc.m);
      for (size_t i = 0; i < ny; i++) {
        int64_t oc = ((int64_t)i / ovol) % cc.m;
        int32_t acc = (int32_t)want[i] + (has_bias ? bias[oc] : 0);
        float mult = sx * sw[per_ch ? oc : 0] / sy;
        int32_t wq = want_q((float)acc * mult, get_q(&zy, yt, 0), yt);
        if (get_q(od, yt, i) != wq)
          fail_msg("QLinearConv case %d [%zu]: %d, expected %d", r, i, get_q(od, yt, i), wq);
      }
    }
    es_mem_free(od);
    free(want);
    free(x);
    free(w);
  }
}

/* QLinearConv as QDQ models lower it (int8 weights with zero points 0,
 * constant scales and zero points, 2-D): oneDNN's int8 convolution, plain
 * and channels-last, with and without the fused Relu ("activation" 1),
 * gives exactly what the rule gives, as the loops do. */
static void test_qlinearconv_int8(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  for (int r = 0; r < 32; r++) {
    conv_case cc;
    random_case(&seed, 2, &cc);
    es_dtype xt = r & 1 ? ES_DTYPE_INT8 : ES_DTYPE_UINT8, yt = r & 2 ? ES_DTYPE_INT8
                                                                     : ES_DTYPE_UINT8;
    int per_ch = (r >> 2) & 1, relu = (r >> 3) & 1, nhwc = (r >> 4) & 1, has_bias = r % 3 != 0;
    int64_t xd[4] = {cc.n, cc.c, cc.in[0], cc.in[1]}, wd[4] = {cc.m, cc.c / cc.g, cc.ker[0],
                                                             cc.ker[1]};
    int64_t yd[4] = {cc.n, cc.m, conv_out(&cc, 0), conv_out(&cc, 1)};
    size_t nx = count_of(xd, 4), nw = count_of(wd, 4), ny = count_of(yd, 4);
    uint8_t *x = malloc(nx), zx, zy;
    int8_t *w = malloc(nw), zw[6] = {0};
    int32_t zw32[6] = {0}, bias[6];
    rand_q(&seed, x, xt, nx);
    rand_q(&seed, w, ES_DTYPE_INT8, nw);
    rand_q(&seed, &zx, xt, 1);
    rand_q(&seed, &zy, yt, 1);
    for (int i = 0; i < 6; i++)
      bias[i] = (int32_t)rnd(&seed, -5000, 5000);
    float sx = 0.02f, sy = 0.7f, sw[6];
    kh_rand_f32(&seed, sw, 6, 0.001f, 0.1f);
    int64_t pads[4];
    es_attr attrs[5];
    conv_attrs(&cc, pads, attrs);
    attrs[4] = KH_INT("activation", relu);
    int64_t *want = malloc(ny * sizeof *want);
    conv_ref(&cc, x, xt, get_q(&zx, xt, 0), w, ES_DTYPE_INT8, zw32, want);
    es_tdesc xdesc = kh_td(xt, 4, xd), wdesc = kh_td(ES_DTYPE_INT8, 4, wd);
    es_tdesc zxd = kh_td(xt, 0, NULL), s0 = kh_td(ES_DTYPE_FLOAT, 0, NULL),
             zyd = kh_td(yt, 0, NULL),
             swd = per_ch ? KH_TD(ES_DTYPE_FLOAT, cc.m) : KH_TD(ES_DTYPE_FLOAT, 1),
             zwd = per_ch ? KH_TD(ES_DTYPE_INT8, cc.m) : KH_TD(ES_DTYPE_INT8, 1),
             bd = KH_TD(ES_DTYPE_INT32, cc.m), out;
    es_tdesc xin = nhwc ? kh_as_nhwc(xdesc) : xdesc;
    void *xdata = nhwc ? kh_reorder4(x, &xdesc, 1) : x;
    es_knode node = kh_knode(ES_OP_QLinearConv, attrs, 5);
    const es_tdesc *in[9] = {&xin, &s0, &zxd, &wdesc, &swd, &zwd, &s0, &zyd, &bd};
    const void *data[9] = {xdata, &sx, &zx, w, sw, zw, &sy, &zy, bias};
    es_kinst k;
    kh_opts o = {.opset = 13, .dyn = 1u, .k_out = &k};
    void *od;
    ES_CHECK_RC(kh_eval_with(&node, &o, has_bias ? 9 : 8, in, data, 1, &out, &od));
    /* channels-last in gives channels-last out: oneDNN's path took it */
    assert_int_equal(out.layout, nhwc ? ES_LAYOUT_NHWC : ES_LAYOUT_PLAIN);
    void *plain = nhwc ? kh_reorder4(od, &out, 0) : od;
    int64_t ovol = (int64_t)ny / (cc.n * cc.m);
    for (size_t i = 0; i < ny; i++) {
      int64_t oc = ((int64_t)i / ovol) % cc.m;
      int32_t acc = (int32_t)want[i] + (has_bias ? bias[oc] : 0);
      float v = (float)acc * (sx * sw[per_ch ? oc : 0] / sy);
      int32_t wq = want_q(relu && v < 0 ? 0.0f : v, get_q(&zy, yt, 0), yt);
      if (get_q(plain, yt, i) != wq)
        fail_msg("int8 QLinearConv case %d [%zu]: %d, expected %d", r, i, get_q(plain, yt, i),
                 wq);
    }
    if (nhwc) {
      es_mem_free(plain);
      es_mem_free(xdata);
    }
    es_mem_free(od);
    free(want);
    free(x);
    free(w);
  }
}

/* QLinearMatMul by static int8 weights (a QDQ linear layer lowered at
 * load) runs as oneDNN's int8 matmul: against the ONNX rule to the step (one
 * step where a tie rounds apart: step_ok),
 * u8 and s8 A and Y, per-tensor and per-column B scales, A with a batch
 * (folded into M), and the same answers from the reference loops. */
static void test_qlinearmatmul_int8(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  for (int r = 0; r < 24; r++) {
    es_dtype at = r & 1 ? ES_DTYPE_INT8 : ES_DTYPE_UINT8, yt = r & 2 ? ES_DTYPE_INT8
                                                                     : ES_DTYPE_UINT8;
    int per_col = (r >> 2) & 1, batch = (r >> 3) & 1 ? 3 : 1;
    int64_t m = rnd(&seed, 1, 40), kk = rnd(&seed, 1, 130), n = rnd(&seed, 1, 70);
    int64_t ad[3] = {batch, m, kk}, bd[2] = {kk, n};
    size_t na = count_of(ad, 3), nb = count_of(bd, 2), ny = (size_t)(batch * m * n);
    uint8_t *a = malloc(na), za, zy;
    int8_t *b = malloc(nb), *zb = calloc((size_t)n, 1);
    rand_q(&seed, a, at, na);
    rand_q(&seed, b, ES_DTYPE_INT8, nb);
    rand_q(&seed, &za, at, 1);
    rand_q(&seed, &zy, yt, 1);
    float sa = 0.03f, sy = 0.9f, *sb = malloc((size_t)n * sizeof *sb);
    kh_rand_f32(&seed, sb, (size_t)n, 0.001f, 0.1f);
    es_tdesc adesc = kh_td(at, 3, ad), bdesc = kh_td(ES_DTYPE_INT8, 2, bd),
             zad = kh_td(at, 0, NULL), s0 = kh_td(ES_DTYPE_FLOAT, 0, NULL),
             zyd = kh_td(yt, 0, NULL),
             sbd = per_col ? KH_TD(ES_DTYPE_FLOAT, n) : KH_TD(ES_DTYPE_FLOAT, 1),
             zbd = per_col ? KH_TD(ES_DTYPE_INT8, n) : KH_TD(ES_DTYPE_INT8, 1), out;
    es_knode node = kh_knode(ES_OP_QLinearMatMul, NULL, 0);
    const es_tdesc *in[8] = {&adesc, &s0, &zad, &bdesc, &sbd, &zbd, &s0, &zyd};
    const void *data[8] = {a, &sa, &za, b, sb, zb, &sy, &zy};
    for (int ref = 0; ref < 2; ref++) {
      es_engine_reference_kernels_set(ref);
      kh_opts o = {.opset = 13, .dyn = 1u};
      void *od;
      ES_CHECK_RC(kh_eval_with(&node, &o, 8, in, data, 1, &out, &od));
      assert_int_equal(out.count, ny);
      for (int64_t bt = 0; bt < batch; bt++)
        for (int64_t i = 0; i < m; i++)
          for (int64_t j = 0; j < n; j++) {
            int32_t acc = 0;
            for (int64_t t = 0; t < kk; t++)
              acc += (get_q(a, at, (size_t)((bt * m + i) * kk + t)) - get_q(&za, at, 0)) *
                     b[t * n + j];
            float v = (float)acc * (sa * sb[per_col ? j : 0] / sy);
            size_t at_y = (size_t)((bt * m + i) * n + j);
            int32_t wq = want_q(v, get_q(&zy, yt, 0), yt);
            if (!step_ok(get_q(od, yt, at_y), wq, v))
              fail_msg("int8 QLinearMatMul case %d (%s) [%zu]: %d, expected %d (%.6f before "
                       "rounding)", r, ref ? "reference" : "oneDNN", at_y, get_q(od, yt, at_y),
                       wq, (double)v);
          }
      es_mem_free(od);
    }
    es_engine_reference_kernels_set(0);
    free(a);
    free(b);
    free(zb);
    free(sb);
  }
}

/* The extensions a QDQ layer lowers to (engine/fuse_qdq.c), on oneDNN and
 * on the reference loops: QLinearMatMul by B [N, K] ("_transB", a Gemm's
 * weights), with an int32 bias per column (input 8) and a Relu
 * ("activation"), writing 8 bits (against the ONNX rule, to the step) or
 * float32 ("_float_out", y's scale and zero point absent: the sum plus the
 * bias times a_scale * b_scale); QLinearConv writing float32 the same way. */
static void test_qlinear_extensions(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  for (int r = 0; r < 16; r++) {
    int transb = r & 1, has_bias = (r >> 1) & 1, relu = (r >> 2) & 1, fout = (r >> 3) & 1;
    int64_t m = rnd(&seed, 1, 9), kk = rnd(&seed, 1, 80), n = rnd(&seed, 1, 40);
    int64_t ad[2] = {m, kk}, bd[2] = {transb ? n : kk, transb ? kk : n};
    uint8_t *a = malloc((size_t)(m * kk)), za = 7, zy = 100;
    int8_t *b = malloc((size_t)(kk * n)), *zb = calloc((size_t)n, 1);
    int32_t *bias = malloc((size_t)n * sizeof *bias);
    rand_q(&seed, a, ES_DTYPE_UINT8, (size_t)(m * kk));
    rand_q(&seed, b, ES_DTYPE_INT8, (size_t)(kk * n));
    for (int64_t j = 0; j < n; j++)
      bias[j] = (int32_t)rnd(&seed, -20000, 20000);
    float sa = 0.02f, sy = 0.7f, *sb = malloc((size_t)n * sizeof *sb);
    kh_rand_f32(&seed, sb, (size_t)n, 0.001f, 0.1f);
    es_tdesc adesc = kh_td(ES_DTYPE_UINT8, 2, ad), bdesc = kh_td(ES_DTYPE_INT8, 2, bd),
             zad = kh_td(ES_DTYPE_UINT8, 0, NULL), s0 = kh_td(ES_DTYPE_FLOAT, 0, NULL),
             zyd = kh_td(ES_DTYPE_UINT8, 0, NULL), sbd = KH_TD(ES_DTYPE_FLOAT, n),
             zbd = KH_TD(ES_DTYPE_INT8, n), biasd = KH_TD(ES_DTYPE_INT32, n), out;
    es_attr attrs[3] = {{.name = "activation", .type = ES_ATTR_INT, .i = relu, .tensor = -1},
                        {.name = "_transB", .type = ES_ATTR_INT, .i = transb, .tensor = -1},
                        {.name = "_float_out", .type = ES_ATTR_INT, .i = fout, .tensor = -1}};
    es_knode node = kh_knode(ES_OP_QLinearMatMul, attrs, 3);
    const es_tdesc *in[9] = {&adesc, &s0,  &zad, &bdesc, &sbd, &zbd, fout ? NULL : &s0,
                             fout ? NULL : &zyd, has_bias ? &biasd : NULL};
    const void *data[9] = {a, &sa, &za, b, sb, zb, &sy, &zy, bias};
    for (int ref = 0; ref < 2; ref++) {
      es_engine_reference_kernels_set(ref);
      kh_opts o = {.opset = 13};
      void *od;
      ES_CHECK_RC(kh_eval_with(&node, &o, 9, in, data, 1, &out, &od));
      assert_int_equal(out.count, (size_t)(m * n));
      assert_int_equal(out.dtype, fout ? ES_DTYPE_FLOAT : ES_DTYPE_UINT8);
      for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
          int32_t acc = has_bias ? bias[j] : 0;
          for (int64_t t = 0; t < kk; t++)
            acc += (a[i * kk + t] - za) * b[transb ? j * kk + t : t * n + j];
          size_t at_y = (size_t)(i * n + j);
          if (fout) {
            float v = (float)acc * (sa * sb[j]), got = ((const float *)od)[at_y];
            v = relu && v < 0 ? 0 : v;
            if (fabsf(got - v) > 1e-5f * fabsf(v) + 1e-6f)
              fail_msg("QLinearMatMul case %d (%s) [%zu]: %g, expected %g", r,
                       ref ? "reference" : "oneDNN", at_y, (double)got, (double)v);
          } else {
            float v = (float)acc * (sa * sb[j] / sy);
            int32_t wq = want_q(relu && v < 0 ? 0 : v, zy, ES_DTYPE_UINT8);
            if (!step_ok(((const uint8_t *)od)[at_y], wq, relu && v < 0 ? 0 : v))
              fail_msg("QLinearMatMul case %d (%s) [%zu]: %d, expected %d", r,
                       ref ? "reference" : "oneDNN", at_y, ((const uint8_t *)od)[at_y], wq);
          }
        }
      es_mem_free(od);
    }
    es_engine_reference_kernels_set(0);
    free(a);
    free(b);
    free(zb);
    free(sb);
    free(bias);
  }
  /* QLinearConv 3x3, pads 1, per-channel scales, bias, Relu or not, float out */
  for (int r = 0; r < 4; r++) {
    int relu = r & 1, has_bias = r >> 1;
    int64_t c = 5, mo = 6, h = 7, w = 6;
    int64_t xd[4] = {1, c, h, w}, wd[4] = {mo, c, 3, 3}, pads[4] = {1, 1, 1, 1};
    size_t nx = (size_t)(c * h * w), nw = (size_t)(mo * c * 9);
    uint8_t *x = malloc(nx), zx = 3;
    int8_t *wt = malloc(nw), zw[6] = {0};
    int32_t bias[6];
    float sx = 0.05f, sw[6];
    rand_q(&seed, x, ES_DTYPE_UINT8, nx);
    rand_q(&seed, wt, ES_DTYPE_INT8, nw);
    kh_rand_f32(&seed, sw, 6, 0.001f, 0.05f);
    for (int oc = 0; oc < 6; oc++)
      bias[oc] = (int32_t)rnd(&seed, -5000, 5000);
    es_tdesc xdesc = kh_td(ES_DTYPE_UINT8, 4, xd), wdesc = kh_td(ES_DTYPE_INT8, 4, wd),
             zxd = kh_td(ES_DTYPE_UINT8, 0, NULL), s0 = kh_td(ES_DTYPE_FLOAT, 0, NULL),
             swd = KH_TD(ES_DTYPE_FLOAT, 6), zwd = KH_TD(ES_DTYPE_INT8, 6),
             biasd = KH_TD(ES_DTYPE_INT32, 6), out;
    es_attr attrs[3] = {{.name = "pads", .type = ES_ATTR_INTS, .n = 4, .ints = pads, .tensor = -1},
                        {.name = "activation", .type = ES_ATTR_INT, .i = relu, .tensor = -1},
                        {.name = "_float_out", .type = ES_ATTR_INT, .i = 1, .tensor = -1}};
    es_knode node = kh_knode(ES_OP_QLinearConv, attrs, 3);
    const es_tdesc *in[9] = {&xdesc, &s0, &zxd, &wdesc, &swd, &zwd, NULL, NULL,
                             has_bias ? &biasd : NULL};
    const void *data[9] = {x, &sx, &zx, wt, sw, zw, NULL, NULL, bias};
    for (int ref = 0; ref < 2; ref++) {
      es_engine_reference_kernels_set(ref);
      kh_opts ko = {.opset = 13};
      void *od;
      int rc = kh_eval_with(&node, &ko, 9, in, data, 1, &out, &od);
      if (rc == ES_KRELAYOUT) /* oneDNN asks for channels-last: the planner's job */
        continue;
      ES_CHECK_RC(rc);
      assert_int_equal(out.dtype, ES_DTYPE_FLOAT);
      for (int64_t o = 0; o < mo; o++)
        for (int64_t y = 0; y < h; y++)
          for (int64_t xx = 0; xx < w; xx++) {
            int32_t acc = has_bias ? bias[o] : 0;
            for (int64_t ci = 0; ci < c; ci++)
              for (int64_t ky = 0; ky < 3; ky++)
                for (int64_t kx = 0; kx < 3; kx++) {
                  int64_t iy = y + ky - 1, ix = xx + kx - 1;
                  if (iy < 0 || iy >= h || ix < 0 || ix >= w)
                    continue;
                  acc += (x[(ci * h + iy) * w + ix] - zx) * wt[((o * c + ci) * 3 + ky) * 3 + kx];
                }
            float v = (float)acc * (sx * sw[o]);
            v = relu && v < 0 ? 0 : v;
            float got = ((const float *)od)[(o * h + y) * w + xx];
            if (fabsf(got - v) > 1e-5f * fabsf(v) + 1e-6f)
              fail_msg("QLinearConv float out case %d (%s) [%lld,%lld,%lld]: %g, expected %g", r,
                       ref ? "reference" : "oneDNN", (long long)o, (long long)y, (long long)xx,
                       (double)got, (double)v);
          }
      es_mem_free(od);
    }
    es_engine_reference_kernels_set(0);
    free(x);
    free(wt);
  }
}

/* QLinearAveragePool (a QDQ AveragePool lowered at load): against the
 * float rule (the average of the dequantized window, quantized; one step
 * only at a tie), u8 and s8, plain and channels-last, with strides, pads
 * counted or not, ceil_mode and a 1-D pool; channels_last 1 is refused. */
#define QINTS(nm, v, len) \
  ((es_attr){.name = (nm), .type = ES_ATTR_INTS, .n = (size_t)(len), .ints = (v), .tensor = -1})

static void test_qlinear_avgpool(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  typedef struct geo {
    int rank;
    int64_t k, s, pad, ceil, incl;
  } geo;
  static const geo gs[] = {{4, 3, 1, 1, 0, 0}, {4, 3, 2, 1, 0, 1}, {4, 2, 2, 0, 0, 0},
                           {4, 3, 2, 0, 1, 0}, {4, 5, 1, 2, 0, 1}, {3, 3, 2, 1, 0, 0}};
  for (size_t gi = 0; gi < sizeof gs / sizeof gs[0]; gi++)
    for (int r = 0; r < 4; r++) {
      const geo *g = &gs[gi];
      es_dtype t = r & 1 ? ES_DTYPE_INT8 : ES_DTYPE_UINT8;
      int nhwc = (r >> 1) & 1 && g->rank == 4;
      int64_t n = 2, c = 5 + (int64_t)gi, h = g->rank == 4 ? 7 : 1, w = 9;
      int64_t xd[4] = {n, c, h, w}, xd3[3] = {n, c, w};
      es_tdesc xdesc = g->rank == 4 ? kh_td(t, 4, xd) : kh_td(t, 3, xd3);
      uint8_t *x = malloc(xdesc.count), zx, zy;
      rand_q(&seed, x, t, xdesc.count);
      rand_q(&seed, &zx, t, 1);
      rand_q(&seed, &zy, t, 1);
      float sx = 0.04f, sy = 0.03f;
      int ns = g->rank - 2;
      int64_t ks[2] = {g->k, g->k}, st[2] = {g->s, g->s}, pd[4] = {g->pad, g->pad, g->pad, g->pad};
      es_attr at[5] = {QINTS("kernel_shape", ks, ns), QINTS("strides", st, ns),
                       QINTS("pads", pd, 2 * ns), KH_INT("ceil_mode", g->ceil),
                       KH_INT("count_include_pad", g->incl)};
      es_knode node = kh_knode(ES_OP_QLinearAveragePool, at, 5);
      es_tdesc s0 = kh_td(ES_DTYPE_FLOAT, 0, NULL), z0 = kh_td(t, 0, NULL), out;
      es_tdesc xin = nhwc ? kh_as_nhwc(xdesc) : xdesc;
      void *xdata = nhwc ? kh_reorder4(x, &xdesc, 1) : x;
      const es_tdesc *in[5] = {&xin, &s0, &z0, &s0, &z0};
      const void *data[5] = {xdata, &sx, &zx, &sy, &zy};
      void *od;
      ES_CHECK_RC(kh_eval_with(&node, &(kh_opts){.opset = 13}, 5, in, data, 1, &out, &od));
      assert_int_equal(out.layout, nhwc ? ES_LAYOUT_NHWC : ES_LAYOUT_PLAIN);
      void *y = nhwc ? kh_reorder4(od, &out, 0) : od;
      int64_t oh = g->rank == 4 ? out.dims[2] : 1, ow = out.dims[g->rank - 1];
      /* the extents ONNX gives: floor or ceil of (in + 2 pad - k) / s + 1 */
      int64_t num = w + 2 * g->pad - g->k;
      assert_int_equal(ow, (g->ceil ? (num + g->s - 1) / g->s : num / g->s) + 1);
      for (int64_t b = 0; b < n; b++)
        for (int64_t ch = 0; ch < c; ch++)
          for (int64_t yy = 0; yy < oh; yy++)
            for (int64_t xx = 0; xx < ow; xx++) {
              double sum = 0;
              int cnt = 0, cnt_pad = 0;
              for (int64_t ky = 0; ky < (g->rank == 4 ? g->k : 1); ky++)
                for (int64_t kx = 0; kx < g->k; kx++) {
                  int64_t iy = g->rank == 4 ? yy * g->s - g->pad + ky : 0;
                  int64_t ix = xx * g->s - g->pad + kx;
                  int in_pad = (g->rank == 3 || (iy >= -g->pad && iy < h + g->pad)) &&
                               ix >= -g->pad && ix < w + g->pad;
                  cnt_pad += in_pad;
                  if (iy < 0 || iy >= h || ix < 0 || ix >= w)
                    continue;
                  sum += (get_q(x, t, (size_t)(((b * c + ch) * h + iy) * w + ix)) -
                          get_q(&zx, t, 0)) * (double)sx;
                  cnt++;
                }
              int den = g->incl ? cnt_pad : cnt;
              float v = den ? (float)(sum / den / sy) : 0.0f;
              int32_t want = want_q(v, get_q(&zy, t, 0), t);
              size_t at_y = (size_t)(((b * c + ch) * oh + yy) * ow + xx);
              if (!step_ok(get_q(y, t, at_y), want, v))
                fail_msg("QLinearAveragePool geometry %zu %s %s [%zu]: %d, expected %d (%.5f)", gi,
                         r & 1 ? "int8" : "uint8", nhwc ? "NHWC" : "plain", at_y,
                         get_q(y, t, at_y), want, (double)v);
            }
      if (nhwc) {
        es_mem_free(y);
        es_mem_free(xdata);
      }
      es_mem_free(od);
      free(x);
    }
  /* channels_last 1 (X stored [N, H, W, C] as a plain tensor): refused */
  int64_t xd[4] = {1, 4, 4, 3}, ks[2] = {2, 2};
  es_tdesc xdesc = kh_td(ES_DTYPE_UINT8, 4, xd), s0 = kh_td(ES_DTYPE_FLOAT, 0, NULL),
           z0 = kh_td(ES_DTYPE_UINT8, 0, NULL), out;
  es_attr at[2] = {QINTS("kernel_shape", ks, 2), KH_INT("channels_last", 1)};
  es_knode node = kh_knode(ES_OP_QLinearAveragePool, at, 2);
  uint8_t x[48] = {0}, z = 0;
  float s = 1;
  const es_tdesc *in[5] = {&xdesc, &s0, &z0, &s0, &z0};
  const void *data[5] = {x, &s, &z, &s, &z};
  void *od;
  assert_int_equal(kh_eval_with(&node, &(kh_opts){.opset = 13}, 5, in, data, 1, &out, &od),
                   ES_ENOTSUP);
}

/* The com.microsoft QLinear operators (QOperator format) against their
 * float32 rule, element by element: broadcasting, omitted zero points,
 * both 8-bit types, both pooling layouts, a concat that copies one input
 * and requantizes the other. Against ONNX Runtime on the same file:
 * tests/e2e/test_qoperator.sh. */
static void test_ms_qlinear(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  for (int r = 0; r < 4; r++) {
    es_dtype t = r & 1 ? ES_DTYPE_INT8 : ES_DTYPE_UINT8;
    int mul = r >> 1, sg = t == ES_DTYPE_INT8;
    uint8_t a[24], b[3], za, zb, zc;
    rand_q(&seed, a, t, 24);
    rand_q(&seed, b, t, 3);
    rand_q(&seed, &za, t, 1);
    rand_q(&seed, &zb, t, 1);
    rand_q(&seed, &zc, t, 1);
    float sa = 0.05f, sb = 0.11f, sc = mul ? 0.4f : 0.09f;
    es_tdesc ad = KH_TD(t, 2, 3, 4), bd = KH_TD(t, 3, 1), s0 = kh_td(ES_DTYPE_FLOAT, 0, NULL),
             z0 = kh_td(t, 0, NULL), out;
    es_knode node = kh_knode(mul ? ES_OP_QLinearMul : ES_OP_QLinearAdd, NULL, 0);
    const es_tdesc *in[8] = {&ad, &s0, &z0, &bd, &s0, &z0, &s0, &z0};
    const void *data[8] = {a, &sa, &za, b, &sb, &zb, &sc, &zc};
    int n_in = r == 3 ? 7 : 8; /* C's zero point omitted once: 0 */
    void *od;
    ES_CHECK_RC(kh_eval_with(&node, &(kh_opts){.opset = 13, .dyn = 9u}, n_in, in, data, 1, &out,
                             &od));
    assert_int_equal(out.rank, 3);
    assert_int_equal(out.count, 24);
    int32_t zcv = n_in == 8 ? get_q(&zc, t, 0) : 0;
    for (int i = 0; i < 24; i++) {
      int32_t av = get_q(a, t, (size_t)i) - get_q(&za, t, 0);
      int32_t bv = get_q(b, t, (size_t)(i / 4 % 3)) - get_q(&zb, t, 0);
      float v = mul ? (float)(av * bv) * (sa * sb / sc) : (float)av * (sa / sc) + (float)bv * (sb / sc);
      int32_t want = want_q(v, zcv, t);
      if (get_q(od, t, (size_t)i) != want)
        fail_msg("%s %s [%d]: %d, expected %d", mul ? "QLinearMul" : "QLinearAdd",
                 sg ? "int8" : "uint8", i, get_q(od, t, (size_t)i), want);
    }
    es_mem_free(od);
  }
  /* QLinearSigmoid over every byte */
  for (int sg = 0; sg < 2; sg++) {
    es_dtype t = sg ? ES_DTYPE_INT8 : ES_DTYPE_UINT8;
    uint8_t x[256], zx = sg ? 0 : 128, zy = sg ? (uint8_t)-128 : 0;
    for (int i = 0; i < 256; i++)
      x[i] = (uint8_t)i;
    float sx = 0.06f, sy = 1.0f / 256;
    es_tdesc xd = KH_TD(t, 256), s0 = kh_td(ES_DTYPE_FLOAT, 0, NULL), z0 = kh_td(t, 0, NULL), out;
    es_knode node = kh_knode(ES_OP_QLinearSigmoid, NULL, 0);
    const es_tdesc *in[5] = {&xd, &s0, &z0, &s0, &z0};
    const void *data[5] = {x, &sx, &zx, &sy, &zy};
    void *od;
    ES_CHECK_RC(kh_eval_with(&node, &(kh_opts){.opset = 13, .dyn = 1u}, 5, in, data, 1, &out, &od));
    for (int i = 0; i < 256; i++) {
      float f = (float)(get_q(x, t, (size_t)i) - get_q(&zx, t, 0)) * sx;
      int32_t want = want_q(1.0f / (1.0f + expf(-f)) / sy, get_q(&zy, t, 0), t);
      if (get_q(od, t, (size_t)i) != want)
        fail_msg("QLinearSigmoid byte %d: %d, expected %d", i, get_q(od, t, (size_t)i), want);
    }
    es_mem_free(od);
  }
  /* QLinearGlobalAveragePool, [N, C, H, W] and channels-last [N, H, W, C] */
  for (int last = 0; last < 2; last++) {
    uint8_t x[2 * 3 * 5 * 4], zx = 7, zy = 3;
    rand_q(&seed, x, ES_DTYPE_UINT8, sizeof x);
    float sx = 0.02f, sy = 0.015f;
    es_tdesc xd = last ? KH_TD(ES_DTYPE_UINT8, 2, 5, 4, 3) : KH_TD(ES_DTYPE_UINT8, 2, 3, 5, 4),
             s0 = kh_td(ES_DTYPE_FLOAT, 0, NULL), z0 = kh_td(ES_DTYPE_UINT8, 0, NULL), out;
    es_attr at[1] = {KH_INT("channels_last", last)};
    es_knode node = kh_knode(ES_OP_QLinearGlobalAveragePool, at, 1);
    const es_tdesc *in[5] = {&xd, &s0, &z0, &s0, &z0};
    const void *data[5] = {x, &sx, &zx, &sy, &zy};
    void *od;
    ES_CHECK_RC(kh_eval_with(&node, &(kh_opts){.opset = 13, .dyn = 1u}, 5, in, data, 1, &out, &od));
    assert_int_equal(out.count, 6);
    assert_int_equal(out.dims[last ? 3 : 1], 3);
    for (int n = 0; n < 2; n++)
      for (int c = 0; c < 3; c++) {
        int64_t sum = 0;
        for (int i = 0; i < 20; i++)
          sum += x[last ? (n * 20 + i) * 3 + c : (n * 3 + c) * 20 + i];
        sum -= 7 * 20;
        int32_t want = want_q((float)sum * (sx / (sy * 20.0f)), zy, ES_DTYPE_UINT8);
        assert_int_equal(((uint8_t *)od)[n * 3 + c], want);
      }
    es_mem_free(od);
  }
  /* an empty concat whose other dims are large: nothing to do, in no time */
  {
    uint8_t one = 0;
    float sc = 0.1f;
    es_tdesc e = KH_TD(ES_DTYPE_UINT8, (int64_t)1 << 30, 0), s0 = kh_td(ES_DTYPE_FLOAT, 0, NULL),
             z0 = kh_td(ES_DTYPE_UINT8, 0, NULL), out;
    es_attr at[1] = {KH_INT("axis", 1)};
    es_knode node = kh_knode(ES_OP_QLinearConcat, at, 1);
    const es_tdesc *in[8] = {&s0, &z0, &e, &s0, &z0, &e, &s0, &z0};
    const void *data[8] = {&sc, &one, &one, &sc, &one, &one, &sc, &one};
    void *od;
    ES_CHECK_RC(kh_eval_with(&node, &(kh_opts){.opset = 13, .dyn = 36u}, 8, in, data, 1, &out,
                             &od));
    assert_int_equal(out.count, 0);
    es_mem_free(od);
  }
  /* QLinearConcat along axis 1: x0 copied (Y's scale and zero point), x1
   * requantized */
  {
    uint8_t x0[2 * 2 * 3], x1[2 * 1 * 3], zy = 10, z1 = 100;
    rand_q(&seed, x0, ES_DTYPE_UINT8, sizeof x0);
    rand_q(&seed, x1, ES_DTYPE_UINT8, sizeof x1);
    float sy = 0.1f, s1 = 0.037f;
    es_tdesc d0 = KH_TD(ES_DTYPE_UINT8, 2, 2, 3), d1 = KH_TD(ES_DTYPE_UINT8, 2, 1, 3),
             s0 = kh_td(ES_DTYPE_FLOAT, 0, NULL), z0 = kh_td(ES_DTYPE_UINT8, 0, NULL), out;
    es_attr at[1] = {KH_INT("axis", -2)};
    es_knode node = kh_knode(ES_OP_QLinearConcat, at, 1);
    const es_tdesc *in[8] = {&s0, &z0, &d0, &s0, &z0, &d1, &s0, &z0};
    const void *data[8] = {&sy, &zy, x0, &sy, &zy, x1, &s1, &z1};
    void *od;
    ES_CHECK_RC(kh_eval_with(&node, &(kh_opts){.opset = 13, .dyn = 36u}, 8, in, data, 1, &out,
                             &od));
    assert_int_equal(out.dims[1], 3);
    const uint8_t *y = od;
    for (int o = 0; o < 2; o++)
      for (int i = 0; i < 9; i++) {
        int32_t want = i < 6 ? x0[o * 6 + i]
                             : want_q((float)(x1[o * 3 + i - 6] - 100) * s1 / sy, 10, ES_DTYPE_UINT8);
        assert_int_equal(y[o * 9 + i], want);
      }
    es_mem_free(od);
  }
}

static void test_conv_errors(void **state) {
  (void)state;
  uint8_t buf[512] = {0};
  const void *data[9] = {buf, buf, buf, buf, buf, buf, buf, buf, buf};
  es_tdesc x = KH_TD(ES_DTYPE_UINT8, 1, 2, 5, 5), w = KH_TD(ES_DTYPE_UINT8, 4, 2, 3, 3),
           wg = KH_TD(ES_DTYPE_UINT8, 4, 1, 3, 3), w7 = KH_TD(ES_DTYPE_UINT8, 4, 2, 7, 7),
           x2 = KH_TD(ES_DTYPE_UINT8, 1, 2), xf = KH_TD(ES_DTYPE_FLOAT, 1, 2, 5, 5),
           zx3 = KH_TD(ES_DTYPE_UINT8, 3), zw3 = KH_TD(ES_DTYPE_UINT8, 3),
           zw4 = KH_TD(ES_DTYPE_UINT8, 4), zwi = KH_TD(ES_DTYPE_INT8, 4),
           x6 = KH_TD(ES_DTYPE_UINT8, 1, 1, 1, 1, 1, 1), w6 = KH_TD(ES_DTYPE_UINT8, 1, 1, 1, 1, 1, 1),
           out;
  void *od = NULL;
  es_knode plain = kh_knode(ES_OP_ConvInteger, NULL, 0);
  struct {
    const es_tdesc *in[4];
    int n;
    int want;
  } cases[] = {
      {{&x, &w, NULL, &zw4}, 4, 0},
      {{&x, &wg}, 2, ES_EMODEL},             /* 1 input channel per group, group 1 */
      {{&x, &w7}, 2, ES_EMODEL},             /* kernel larger than the input */
      {{&x2, &w}, 2, ES_EMODEL},             /* rank 2 */
      {{&xf, &w}, 2, ES_EMODEL},             /* float x */
      {{&x, &w, &zx3}, 3, ES_EMODEL},        /* x's zero point not a scalar */
      {{&x, &w, NULL, &zw3}, 4, ES_EMODEL},  /* 3 zero points for 4 channels */
      {{&x, &w, NULL, &zwi}, 4, ES_EMODEL},  /* zero point's type differs from w's */
      {{&x6, &w6}, 2, ES_ENOTSUP},           /* 4-D convolution */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int rc = es__kernel_eval(&plain, 10, cases[i].n, cases[i].in, data, 1, &out, &od);
    if (rc != cases[i].want)
      fail_msg("case %zu: %d %s, expected %s (%s)", i, rc, es_err_name(rc),
               es_err_name(cases[i].want), es_last_error_detail());
    if (rc == 0)
      es_mem_free(od);
  }
  struct {
    es_attr a;
    int want;
  } acases[] = {
      {KH_INTS("strides", 0, 1), ES_EMODEL},
      {KH_INTS("strides", 1), ES_EMODEL},            /* one value for 2 axes */
      {KH_INTS("pads", 1, 1, 1, -1), ES_EMODEL},
      {KH_INTS("dilations", 1, 2000000), ES_EMODEL},
      {KH_INTS("kernel_shape", 3, 2), ES_EMODEL},
      {KH_STR("auto_pad", "SAME"), ES_EMODEL},
      {KH_STR("auto_pad", "SAME_LOWER"), 0},
      {KH_INT("group", 0), ES_EMODEL},
      {KH_INT("group", 3), ES_EMODEL},
  };
  const es_tdesc *ok[] = {&x, &w};
  for (size_t i = 0; i < sizeof acases / sizeof acases[0]; i++) {
    es_knode n = kh_knode(ES_OP_ConvInteger, &acases[i].a, 1);
    int rc = es__kernel_eval(&n, 10, 2, ok, data, 1, &out, &od);
    if (rc != acases[i].want)
      fail_msg("attribute case %zu (%s): %d %s, expected %s (%s)", i, acases[i].a.name, rc,
               es_err_name(rc), es_err_name(acases[i].want), es_last_error_detail());
    if (rc == 0) {
      assert_int_equal(out.dims[2], 5); /* SAME keeps 5 x 5 */
      es_mem_free(od);
    }
  }
  /* QLinearConv: a bias of the wrong type or length, a vector x_scale */
  es_tdesc s = kh_td(ES_DTYPE_FLOAT, 0, NULL), z = kh_td(ES_DTYPE_UINT8, 0, NULL),
           s4 = KH_TD(ES_DTYPE_FLOAT, 4), b4 = KH_TD(ES_DTYPE_INT32, 4),
           b3 = KH_TD(ES_DTYPE_INT32, 3), bf = KH_TD(ES_DTYPE_FLOAT, 4);
  es_knode ql = kh_knode(ES_OP_QLinearConv, NULL, 0);
  const es_tdesc *good[9] = {&x, &s, &z, &w, &s4, &zw4, &s, &z, &b4};
  ES_CHECK_RC(es__kernel_eval(&ql, 10, 9, good, data, 1, &out, &od));
  es_mem_free(od);
  const es_tdesc *bad_b3[9] = {&x, &s, &z, &w, &s4, &zw4, &s, &z, &b3};
  ES_EXPECT_RC(es__kernel_eval(&ql, 10, 9, bad_b3, data, 1, &out, &od), ES_EMODEL);
  const es_tdesc *bad_bf[9] = {&x, &s, &z, &w, &s4, &zw4, &s, &z, &bf};
  ES_EXPECT_RC(es__kernel_eval(&ql, 10, 9, bad_bf, data, 1, &out, &od), ES_EMODEL);
  const es_tdesc *bad_sx[9] = {&x, &s4, &z, &w, &s4, &zw4, &s, &z, &b4};
  ES_EXPECT_RC(es__kernel_eval(&ql, 10, 9, bad_sx, data, 1, &out, &od), ES_EMODEL);
  const es_tdesc *no_w[9] = {&x, &s, &z, NULL, &s4, &zw4, &s, &z, &b4};
  ES_EXPECT_RC(es__kernel_eval(&ql, 10, 9, no_w, data, 1, &out, &od), ES_EMODEL);
}

/* ==========================================================================
 * In a model
 * ======================================================================== */

/* A QDQ model's weights: int8 W with per-output-channel scales through
 * DequantizeLinear into a float Conv (weight-only int8). At load the Conv
 * takes the int8 weights and their scales (the DequantizeLinear goes, one
 * node left, the weights held in int8); with the lowering off
 * (es_engine_fusion_set(0)) the DequantizeLinear of constants is folded
 * into float weights instead. Both compute the convolution with the
 * dequantized weights. */
static void test_qdq_weights_fold(void **state) {
  (void)state;
  for (int lower = 1; lower >= 0; lower--) {
    enum { M = 3, C = 2, K = 3 };
    static int32_t w[M * C * K * K];
    static const float ws[M] = {0.5f, 0.25f, 0.125f};
    static const int32_t wz[M] = {0, 0, 0};
    for (int i = 0; i < M * C * K * K; i++)
      w[i] = (i * 29) % 255 - 127;
    ob *b = ob_new(13);
    ob_input(b, "x", 4, (int64_t[]){1, C, 5, 5});
    Onnx__TensorProto *t = ob_init_f32(b, "Wq", 4, (int64_t[]){M, C, K, K}, NULL);
    t->data_type = ONNX__TENSOR_PROTO__DATA_TYPE__INT8;
    t->n_float_data = 0;
    t->n_int32_data = M * C * K * K;
    t->int32_data = w;
    ob_init_f32(b, "ws", 1, (int64_t[]){M}, ws);
    t = ob_init_f32(b, "wz", 1, (int64_t[]){M}, NULL);
    t->data_type = ONNX__TENSOR_PROTO__DATA_TYPE__INT8;
    t->n_float_data = 0;
    t->n_int32_data = M;
    t->int32_data = (int32_t *)wz;
    int dq = ob_node(b, "DequantizeLinear", "W", 3, "Wq", "ws", "wz");
    ob_attr_int(b, dq, "axis", 0);
    ob_node(b, "Conv", "y", 2, "x", "W");
    ob_output(b, "y");
    es_engine_fusion_set(lower);
    es_model *m = ob_load(b);
    es_engine_fusion_set(1);
    free(b);
    es_model_stats st;
    ES_CHECK_RC(es_model_stats_get(m, &st));
    assert_int_equal(st.nodes, 1);
    assert_int_equal(st.folded_nodes, lower ? 0 : 1);
    assert_int_equal(st.w8_nodes, lower ? 1 : 0);
    assert_true(st.weight_bytes < (lower ? M * C * K * K + 64 : M * C * K * K * 4 + 64) &&
                st.weight_bytes >= (lower ? M * C * K * K : M * C * K * K * 4));
    float x[C * 25];
    for (int i = 0; i < C * 25; i++)
      x[i] = (float)((i * 7) % 11 - 5) / 4.0f;
    es_tensor in = ob_tensor_f32("x", 4, (int64_t[]){1, C, 5, 5}, x);
    float *y;
    size_t count;
    ob_run(m, 1, &in, 1, &y, &count);
    assert_int_equal(count, M * 9);
    for (int oc = 0; oc < M; oc++)
      for (int oh = 0; oh < 3; oh++)
        for (int ow = 0; ow < 3; ow++) {
          double s = 0;
          for (int c = 0; c < C; c++)
            for (int kh = 0; kh < K; kh++)
              for (int kw = 0; kw < K; kw++)
                s += (double)x[(c * 5 + oh + kh) * 5 + ow + kw] *
                     (w[((oc * C + c) * K + kh) * K + kw] * (double)ws[oc]);
          float got = y[(oc * 3 + oh) * 3 + ow];
          if (fabs(got - s) > 1e-4 * (1 + fabs(s)))
            fail_msg("y[%d,%d,%d] = %g, expected %g", oc, oh, ow, (double)got, s);
        }
    free(y);
    es_model_release(m);
  }
}

/* A weight-only Conv (DequantizeLinear of int8 W, per channel and, for
 * the second, one scale) followed by a residual Add and a Relu, which the
 * fusion pass makes its post-ops: lowered (the Conv reading int8 W, its
 * scales input 4 beside the residual's input 3) it gives what the same
 * graph gives with the weights folded to float and nothing fused, on
 * oneDNN and on the reference kernels; grouped (depthwise) too. */
static void test_weight_only_fused(void **state) {
  (void)state;
  enum { C = 8, H = 7 };
  for (int grouped = 0; grouped < 2; grouped++) {
    int cg = grouped ? 1 : C;
    static int32_t w[C * C * 9];
    static float ws[C], xb[C];
    for (int i = 0; i < C * cg * 9; i++)
      w[i] = (i * 37 + grouped * 11) % 255 - 127;
    for (int i = 0; i < C; i++) {
      ws[i] = 0.01f + 0.003f * (float)i;
      xb[i] = 0.1f * (float)(i - 3);
    }
    float one = 0.02f;
    float y[3][C * H * H];
    for (int mode = 0; mode < 3; mode++) { /* lowered, folded, reference kernels */
      ob *b = ob_new(13);
      ob_input(b, "x", 4, (int64_t[]){1, C, H, H});
      Onnx__TensorProto *t = ob_init_f32(b, "Wq", 4, (int64_t[]){C, cg, 3, 3}, NULL);
      t->data_type = ONNX__TENSOR_PROTO__DATA_TYPE__INT8;
      t->n_float_data = 0;
      t->n_int32_data = (size_t)(C * cg * 9);
      t->int32_data = w;
      if (grouped)
        ob_init_f32(b, "ws", 0, NULL, &one);
      else
        ob_init_f32(b, "ws", 1, (int64_t[]){C}, ws);
      ob_init_f32(b, "B", 1, (int64_t[]){C}, xb);
      int dq = ob_node(b, "DequantizeLinear", "W", 2, "Wq", "ws");
      if (!grouped)
        ob_attr_int(b, dq, "axis", 0);
      int cv = ob_node(b, "Conv", "c", 3, "x", "W", "B");
      ob_attr_ints(b, cv, "pads", 4, (int64_t[]){1, 1, 1, 1});
      if (grouped)
        ob_attr_int(b, cv, "group", C);
      ob_node(b, "Add", "s", 2, "c", "x");
      ob_node(b, "Relu", "y", 1, "s");
      ob_output(b, "y");
      es_engine_fusion_set(mode != 1);
      es_model *m = ob_load(b);
      es_engine_fusion_set(1);
      free(b);
      es_model_stats st;
      ES_CHECK_RC(es_model_stats_get(m, &st));
      assert_int_equal(st.w8_nodes, mode != 1);
      if (mode == 0)
        assert_int_equal(st.nodes, 1); /* the Add and the Relu are its post-ops */
      float x[C * H * H];
      for (int i = 0; i < C * H * H; i++)
        x[i] = (float)((i * 13) % 17 - 8) / 4.0f;
      es_tensor in = ob_tensor_f32("x", 4, (int64_t[]){1, C, H, H}, x);
      float *out;
      size_t count;
      es_engine_reference_kernels_set(mode == 2); /* read when planning */
      ob_run(m, 1, &in, 1, &out, &count);
      es_engine_reference_kernels_set(0);
      assert_int_equal(count, C * H * H);
      memcpy(y[mode], out, sizeof y[mode]);
      free(out);
      es_model_release(m);
    }
    for (int i = 0; i < C * H * H; i++)
      for (int mode = 0; mode < 3; mode += 2)
        if (fabsf(y[mode][i] - y[1][i]) > 1e-5f * (1 + fabsf(y[1][i])))
          fail_msg("grouped %d, [%d]: %s %g, folded %g", grouped, i,
                   mode ? "reference kernels" : "lowered", (double)y[mode][i], (double)y[1][i]);
  }
}

/* The paths a QDQ feature pyramid takes between channels-last int8
 * convolutions, against the element-by-element rule: QLinearConcat of
 * NHWC inputs (copied, or requantized through a byte table; runs shorter
 * and longer than 64 bytes), QLinearMul and QLinearAdd of an NHWC map and
 * a per-channel vector (either operand), QLinearGlobalAveragePool of an
 * NHWC map (short, long and over-1024 channel counts), and Resize nearest
 * on bytes in NHWC. Each keeps NHWC out, asking for no conversion. */
static void test_qdq_nhwc(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  static const int64_t chans[3] = {3, 70, 24};
  for (int sg = 0; sg < 2; sg++) {
    es_dtype t = sg ? ES_DTYPE_INT8 : ES_DTYPE_UINT8;
    es_tdesc s0 = kh_td(ES_DTYPE_FLOAT, 0, NULL), z0 = kh_td(t, 0, NULL), out;
    /* QLinearConcat along channels */
    {
      uint8_t *x[3], zs[3], zy;
      float ss[3] = {0.05f, 0.031f, 0.08f}, sy = 0.05f;
      es_tdesc d[3];
      void *xn[3];
      int64_t ctot = 0;
      rand_q(&seed, zs, t, 3);
      zy = zs[0]; /* input 0 is copied */
      for (int j = 0; j < 3; j++) {
        d[j] = KH_TD(t, 1, chans[j], 5, 7);
        x[j] = malloc(d[j].count);
        rand_q(&seed, x[j], t, d[j].count);
        xn[j] = kh_reorder4(x[j], &d[j], 1);
        d[j] = kh_as_nhwc(d[j]);
        ctot += chans[j];
      }
      es_attr at[1] = {KH_INT("axis", 1)};
      es_knode node = kh_knode(ES_OP_QLinearConcat, at, 1);
      const es_tdesc *in[11] = {&s0, &z0, &d[0], &s0, &z0, &d[1], &s0, &z0, &d[2], &s0, &z0};
      const void *data[11] = {&sy, &zy, xn[0], &ss[0], &zs[0], xn[1], &ss[1], &zs[1],
                              xn[2], &ss[2], &zs[2]};
      void *od;
      ES_CHECK_RC(kh_eval_with(&node, &(kh_opts){.opset = 13, .dyn = 0x124u}, 11, in, data, 1,
                               &out, &od));
      assert_int_equal(out.layout, ES_LAYOUT_NHWC);
      void *y = kh_reorder4(od, &out, 0);
      for (int64_t c = 0, base = 0; c < ctot; c++) {
        int j = c < chans[0] ? 0 : c < chans[0] + chans[1] ? 1 : 2;
        base = j == 0 ? 0 : j == 1 ? chans[0] : chans[0] + chans[1];
        for (int64_t i = 0; i < 35; i++) {
          int32_t v = get_q(x[j], t, (size_t)((c - base) * 35 + i));
          float f = (float)(v - get_q(&zs[j], t, 0)) * ss[j];
          int32_t want = j == 0 ? v : want_q(f / sy, get_q(&zy, t, 0), t);
          if (get_q(y, t, (size_t)(c * 35 + i)) != want)
            fail_msg("NHWC QLinearConcat %s channel %lld [%lld]: %d, expected %d",
                     sg ? "int8" : "uint8", (long long)c, (long long)i,
                     get_q(y, t, (size_t)(c * 35 + i)), want);
        }
      }
      es_mem_free(y);
      es_mem_free(od);
      for (int j = 0; j < 3; j++) {
        free(x[j]);
        es_mem_free(xn[j]);
      }
    }
    /* QLinearMul / QLinearAdd: an NHWC map and a per-channel vector */
    for (int r = 0; r < 12; r++) {
      int mul = r & 1, vfirst = (r >> 1) & 1;
      int64_t c = chans[r / 4];
      es_tdesc md = KH_TD(t, 1, c, 6, 5), vd = KH_TD(t, 1, c, 1, 1);
      uint8_t *m = malloc(md.count), *v = malloc(vd.count), zm, zv, zc;
      rand_q(&seed, m, t, md.count);
      rand_q(&seed, v, t, vd.count);
      rand_q(&seed, &zm, t, 1);
      rand_q(&seed, &zv, t, 1);
      rand_q(&seed, &zc, t, 1);
      float sm = 0.04f, sv = 0.013f, sc = mul ? 0.002f : 0.05f;
      void *mn = kh_reorder4(m, &md, 1);
      es_tdesc mdn = kh_as_nhwc(md);
      es_knode node = kh_knode(mul ? ES_OP_QLinearMul : ES_OP_QLinearAdd, NULL, 0);
      const es_tdesc *in[8] = {vfirst ? &vd : &mdn, &s0, &z0, vfirst ? &mdn : &vd, &s0, &z0,
                               &s0, &z0};
      const void *data[8] = {vfirst ? (void *)v : mn, vfirst ? &sv : &sm, vfirst ? &zv : &zm,
                             vfirst ? mn : (void *)v, vfirst ? &sm : &sv, vfirst ? &zm : &zv,
                             &sc, &zc};
      void *od;
      ES_CHECK_RC(kh_eval_with(&node, &(kh_opts){.opset = 13, .dyn = 9u}, 8, in, data, 1, &out,
                               &od));
      assert_int_equal(out.layout, ES_LAYOUT_NHWC);
      void *y = kh_reorder4(od, &out, 0);
      float sa = vfirst ? sv : sm, sb = vfirst ? sm : sv;
      for (int64_t ch = 0; ch < c; ch++)
        for (int64_t i = 0; i < 30; i++) {
          int32_t mv = get_q(m, t, (size_t)(ch * 30 + i)) - get_q(&zm, t, 0);
          int32_t vv = get_q(v, t, (size_t)ch) - get_q(&zv, t, 0);
          int32_t av = vfirst ? vv : mv, bv = vfirst ? mv : vv;
          float f = mul ? (float)(av * bv) * (sa * sb / sc) : (float)av * (sa / sc) + (float)bv * (sb / sc);
          int32_t want = want_q(f, get_q(&zc, t, 0), t);
          if (get_q(y, t, (size_t)(ch * 30 + i)) != want)
            fail_msg("NHWC %s by a channel vector (%s, C %lld) [%lld, %lld]: %d, expected %d",
                     mul ? "QLinearMul" : "QLinearAdd", sg ? "int8" : "uint8", (long long)c,
                     (long long)ch, (long long)i, get_q(y, t, (size_t)(ch * 30 + i)), want);
        }
      es_mem_free(y);
      es_mem_free(od);
      es_mem_free(mn);
      free(m);
      free(v);
    }
    /* QLinearGlobalAveragePool of an NHWC map */
    static const int64_t gc[3] = {3, 24, 1100};
    for (int r = 0; r < 3; r++) {
      es_tdesc xd = KH_TD(t, 1, gc[r], 9, 11);
      uint8_t *x = malloc(xd.count), zx, zy;
      rand_q(&seed, x, t, xd.count);
      rand_q(&seed, &zx, t, 1);
      rand_q(&seed, &zy, t, 1);
      float sx = 0.03f, sy = 0.01f;
      void *xn = kh_reorder4(x, &xd, 1);
      es_tdesc xdn = kh_as_nhwc(xd);
      es_attr at[1] = {KH_INT("channels_last", 0)};
      es_knode node = kh_knode(ES_OP_QLinearGlobalAveragePool, at, 1);
      const es_tdesc *in[5] = {&xdn, &s0, &z0, &s0, &z0};
      const void *data[5] = {xn, &sx, &zx, &sy, &zy};
      void *od;
      ES_CHECK_RC(kh_eval_with(&node, &(kh_opts){.opset = 13, .dyn = 1u}, 5, in, data, 1, &out,
                               &od));
      assert_int_equal(out.count, (size_t)gc[r]);
      for (int64_t c = 0; c < gc[r]; c++) {
        int64_t sum = 0;
        for (int i = 0; i < 99; i++)
          sum += get_q(x, t, (size_t)(c * 99 + i)) - get_q(&zx, t, 0);
        int32_t want = want_q((float)sum * (sx / (sy * 99.0f)), get_q(&zy, t, 0), t);
        if (get_q(od, t, (size_t)c) != want)
          fail_msg("NHWC QLinearGlobalAveragePool (C %lld) channel %lld: %d, expected %d",
                   (long long)gc[r], (long long)c, get_q(od, t, (size_t)c), want);
      }
      es_mem_free(od);
      es_mem_free(xn);
      free(x);
    }
    /* Resize nearest 2x on bytes, NHWC */
    {
      es_tdesc xd = KH_TD(t, 1, 5, 3, 4);
      uint8_t x[60];
      rand_q(&seed, x, t, 60);
      void *xn = kh_reorder4(x, &xd, 1);
      es_tdesc xdn = kh_as_nhwc(xd), rd = KH_TD(ES_DTYPE_FLOAT, 0), sd = KH_TD(ES_DTYPE_FLOAT, 4);
      static const float sc[4] = {1, 1, 2, 2};
      es_attr at[1] = {KH_STR("mode", "nearest")};
      es_knode node = kh_knode(ES_OP_Resize, at, 1);
      const es_tdesc *in[3] = {&xdn, &rd, &sd};
      const void *data[3] = {xn, NULL, sc};
      void *od;
      ES_CHECK_RC(kh_eval_with(&node, &(kh_opts){.opset = 13, .dyn = 1u}, 3, in, data, 1, &out,
                               &od));
      assert_int_equal(out.layout, ES_LAYOUT_NHWC);
      assert_int_equal(out.dtype, t);
      void *y = kh_reorder4(od, &out, 0);
      for (int c = 0; c < 5; c++)
        for (int h = 0; h < 6; h++)
          for (int w = 0; w < 8; w++)
            assert_int_equal(get_q(y, t, (size_t)((c * 6 + h) * 8 + w)),
                             get_q(x, t, (size_t)((c * 3 + h / 2) * 4 + w / 2)));
      es_mem_free(y);
      es_mem_free(od);
      es_mem_free(xn);
    }
  }
}

/* QLinearConvTranspose (internal: a QDQ ConvTranspose lowered at load)
 * against the ONNX ConvTranspose of the dequantized tensors, requantized
 * by the rule: random geometries (kernels, strides, pads, output padding,
 * two groups), u8 and s8, per-tensor and per-channel weight scales, a Relu
 * fused; oneDNN's int8 deconvolution in NHWC and plain (and, kernel equal
 * to stride in NHWC, its int8 matmul), and the reference loops, each to
 * the step. */
static void test_qlinear_convtranspose(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  for (int r = 0; r < 36; r++) {
    es_dtype xt = r & 1 ? ES_DTYPE_INT8 : ES_DTYPE_UINT8, yt = r & 2 ? ES_DTYPE_INT8
                                                                     : ES_DTYPE_UINT8;
    int g = r % 9 == 8 ? 2 : 1, per_ch = g == 1 && (r >> 2) & 1, relu = (r >> 3) & 1;
    int mode = r % 3; /* 0: oneDNN plain, 1: oneDNN NHWC, 2: the reference loops */
    int64_t c = g * rnd(&seed, 1, 9), m = g * rnd(&seed, 1, 9), k[2], st[2], pd[4], op[2];
    int64_t ih = rnd(&seed, 1, 9), iw = rnd(&seed, 1, 9), oh, ow;
    int kxs = r % 6 == 4 && g == 1; /* kernel = stride, no pads: NHWC runs it as one matmul */
    for (int i = 0; i < 2; i++) {
      k[i] = rnd(&seed, 1, 3);
      st[i] = kxs ? k[i] : rnd(&seed, 1, 3);
      pd[i] = kxs ? 0 : rnd(&seed, 0, k[i] - 1);
      pd[2 + i] = kxs ? 0 : rnd(&seed, 0, k[i] - 1);
      op[i] = kxs ? 0 : rnd(&seed, 0, st[i] - 1);
    }
    oh = st[0] * (ih - 1) + k[0] + op[0] - pd[0] - pd[2];
    ow = st[1] * (iw - 1) + k[1] + op[1] - pd[1] - pd[3];
    if (oh < 1 || ow < 1)
      continue;
    int64_t xd[4] = {1, c, ih, iw}, wd[4] = {c, m / g, k[0], k[1]};
    size_t nx = count_of(xd, 4), nw = count_of(wd, 4), ny = (size_t)(m * oh * ow);
    uint8_t *x = malloc(nx), zx, zy;
    int8_t *w = malloc(nw), zw[9] = {0};
    int32_t bias[18];
    float sw[18], sx = 0.03f, sy = 0.4f;
    rand_q(&seed, x, xt, nx);
    rand_q(&seed, w, ES_DTYPE_INT8, nw);
    rand_q(&seed, &zx, xt, 1);
    rand_q(&seed, &zy, yt, 1);
    kh_rand_f32(&seed, sw, 18, 0.001f, 0.1f);
    for (int i = 0; i < 18; i++)
      bias[i] = (int32_t)rnd(&seed, -3000, 3000);
    /* the int32 sums by the definition: every input scatters into the
     * outputs its taps reach */
    int32_t *acc = calloc(ny, sizeof *acc);
    int64_t cg = c / g, mg = m / g;
    for (int64_t ic = 0; ic < c; ic++)
      for (int64_t o = 0; o < mg; o++)
        for (int64_t y0 = 0; y0 < ih; y0++)
          for (int64_t x0 = 0; x0 < iw; x0++)
            for (int64_t a = 0; a < k[0]; a++)
              for (int64_t b = 0; b < k[1]; b++) {
                int64_t yy = y0 * st[0] - pd[0] + a, xx = x0 * st[1] - pd[1] + b;
                if (yy < 0 || yy >= oh || xx < 0 || xx >= ow)
                  continue;
                int64_t oc = ic / cg * mg + o;
                acc[(oc * oh + yy) * ow + xx] +=
                    (get_q(x, xt, (size_t)((ic * ih + y0) * iw + x0)) - get_q(&zx, xt, 0)) *
                    w[((ic * mg + o) * k[0] + a) * k[1] + b];
              }
#define INTS_OF(nm, v, len) ((es_attr){.name = (nm), .type = ES_ATTR_INTS, .n = (len), .ints = (v), .tensor = -1})
    es_attr attrs[5] = {INTS_OF("strides", st, 2), INTS_OF("pads", pd, 4),
                        INTS_OF("output_padding", op, 2), KH_INT("group", g),
                        KH_INT("activation", relu)};
#undef INTS_OF
    es_tdesc xdesc = kh_td(xt, 4, xd), wdesc = kh_td(ES_DTYPE_INT8, 4, wd),
             s0 = kh_td(ES_DTYPE_FLOAT, 0, NULL), zxd = kh_td(xt, 0, NULL),
             zyd = kh_td(yt, 0, NULL),
             swd = per_ch ? KH_TD(ES_DTYPE_FLOAT, m) : KH_TD(ES_DTYPE_FLOAT, 1),
             zwd = per_ch ? KH_TD(ES_DTYPE_INT8, m) : KH_TD(ES_DTYPE_INT8, 1),
             bd = KH_TD(ES_DTYPE_INT32, m), out;
    es_tdesc xin = mode == 1 ? kh_as_nhwc(xdesc) : xdesc;
    void *xdata = mode == 1 ? kh_reorder4(x, &xdesc, 1) : x;
    es_knode node = kh_knode(ES_OP_QLinearConvTranspose, attrs, 5);
    const es_tdesc *in[9] = {&xin, &s0, &zxd, &wdesc, &swd, &zwd, &s0, &zyd, &bd};
    const void *data[9] = {xdata, &sx, &zx, w, sw, zw, &sy, &zy, bias};
    es_engine_reference_kernels_set(mode == 2);
    void *od;
    int rc = kh_eval_with(&node, &(kh_opts){.opset = 13, .dyn = 1u}, 9, in, data, 1, &out, &od);
    if (rc == ES_KRELAYOUT && mode == 1) { /* a geometry oneDNN does not take: the loops, plain */
      in[0] = &xdesc;
      data[0] = x;
      rc = kh_eval_with(&node, &(kh_opts){.opset = 13, .dyn = 1u}, 9, in, data, 1, &out, &od);
    }
    ES_CHECK_RC(rc);
    es_engine_reference_kernels_set(0);
    assert_int_equal(out.count, ny);
    assert_int_equal(out.dims[2], oh);
    assert_int_equal(out.dims[3], ow);
    void *y = out.layout == ES_LAYOUT_NHWC ? kh_reorder4(od, &out, 0) : od;
    for (size_t i = 0; i < ny; i++) {
      int64_t oc = (int64_t)i / (oh * ow);
      float v = (float)(acc[i] + bias[oc]) * (sx * sw[per_ch ? oc : 0] / sy);
      int32_t want = want_q(relu && v < 0 ? 0.0f : v, get_q(&zy, yt, 0), yt);
      if (get_q(y, yt, i) != want)
        fail_msg("QLinearConvTranspose case %d (%s; C %lld M %lld group %d kernel %lldx%lld "
                 "stride %lldx%lld) [%zu]: %d, expected %d", r,
                 mode == 2 ? "reference" : mode ? "oneDNN NHWC" : "oneDNN", (long long)c,
                 (long long)m, g, (long long)k[0], (long long)k[1], (long long)st[0],
                 (long long)st[1], i, get_q(y, yt, i), want);
    }
    if (y != od)
      es_mem_free(y);
    if (xdata != x)
      es_mem_free(xdata);
    es_mem_free(od);
    free(acc);
    free(x);
    free(w);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_quantize_rounding_saturation),
      cmocka_unit_test(test_per_axis),
      cmocka_unit_test(test_blocks),
      cmocka_unit_test(test_dequantize_int32),
      cmocka_unit_test(test_quantize_errors),
      cmocka_unit_test(test_dynamic_quantize),
      cmocka_unit_test(test_matmul_integer),
      cmocka_unit_test(test_matmul_integer_wraps),
      cmocka_unit_test(test_qlinear_matmul),
      cmocka_unit_test(test_matmul_errors),
      cmocka_unit_test(test_conv_integer),
      cmocka_unit_test(test_conv_errors),
      cmocka_unit_test(test_qlinearconv_int8),
      cmocka_unit_test(test_qlinearmatmul_int8),
      cmocka_unit_test(test_qlinear_extensions),
      cmocka_unit_test(test_qlinear_avgpool),
      cmocka_unit_test(test_ms_qlinear),
      cmocka_unit_test(test_qdq_nhwc),
      cmocka_unit_test(test_qlinear_convtranspose),
      cmocka_unit_test(test_qdq_weights_fold),
      cmocka_unit_test(test_weight_only_fused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
