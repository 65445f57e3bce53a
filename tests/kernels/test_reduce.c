/* Kernels of the reduce family beyond ReduceMean's own tests (test_pool.c):
 * every Reduce*, ArgMax and ArgMin, CumSum, and Softmax, LogSoftmax and
 * Hardmax.
 *
 * Each op runs on random shapes, axes and attributes against a naive
 * reference written here (in double for floats, in the element type for
 * integers, element by element with no grouping), in both the attribute
 * (old opsets) and the input (new opsets) forms of axes; then the edge cases
 * named by the spec (empty axes, noop_with_empty_axes, empty reductions,
 * ties with select_last_index, NaN), the softmax family at axis 0 and in the
 * opset-11 2-D coercion, in place and not, and invalid nodes, which must
 * fail with the right code. */
#include "es_test.h"

#include <math.h>
#include <string.h>

#include "kernels/kernel.h"
#include "support/kernel_harness.h"

/* ==========================================================================
 * Helpers
 * ======================================================================== */

static int64_t rnd(uint64_t *s, int64_t lo, int64_t hi) {
  return lo + (int64_t)(es_test_rand(s) % (uint64_t)(hi - lo + 1));
}

/* One node; dyn: bit i hides input i from planning; inplace: out[0] shares
 * in[0]. Outputs are the caller's (es_mem_free). */
static int eval_ex(es_op op, int64_t opset, const es_attr *attrs, int n_attr, int n_in,
                   const es_tdesc *const *in, const void *const *data, unsigned dyn, int inplace,
                   es_tdesc *out, void **outd) {
  es_knode node = kh_knode(op, attrs, n_attr);
  if (!dyn && !inplace)
    return es__kernel_eval(&node, opset, n_in, in, data, 1, out, outd);
  kh_opts o = {.opset = opset, .dyn = dyn, .inplace = inplace};
  return kh_eval_with(&node, &o, n_in, in, data, 1, out, outd);
}

static int eval(es_op op, int64_t opset, const es_attr *attrs, int n_attr, int n_in,
                const es_tdesc *const *in, const void *const *data, es_tdesc *out, void **outd) {
  return eval_ex(op, opset, attrs, n_attr, n_in, in, data, 0, 0, out, outd);
}

/* Expects rc for a one-input node over a zeroed x. */
static void expect_rc1(es_op op, int64_t opset, const es_attr *attrs, int n_attr, es_tdesc x,
                       int want) {
  void *buf = calloc(x.count ? x.count : 1, 8);
  const es_tdesc *in[] = {&x};
  const void *data[] = {buf};
  es_tdesc out;
  void *od = NULL;
  ES_EXPECT_RC(eval(op, opset, attrs, n_attr, 1, in, data, &out, &od), want);
  es_mem_free(od);
  free(buf);
}

static void expect_close(const float *got, const double *want, size_t n, double tol,
                         const char *what) {
  for (size_t i = 0; i < n; i++) {
    if (isnan(want[i]) && isnan(got[i]))
      continue;
    if ((double)got[i] == want[i])
      continue;
    if (!(fabs((double)got[i] - want[i]) <= tol * (1 + fabs(want[i]))))
      fail_msg("%s: [%zu] = %.9g, expected %.9g", what, i, (double)got[i], want[i]);
  }
}

/* The output index of input element i when the axes in red[] are reduced
 * (keepdims or not: the same order). */
static size_t out_index(const es_tdesc *x, size_t i, const int *red) {
  size_t o = 0, ostride = 1;
  for (int a = x->rank - 1; a >= 0; a--) {
    size_t c = i % (size_t)x->dims[a];
    i /= (size_t)x->dims[a];
    if (!red[a]) {
      o += c * ostride;
      ostride *= (size_t)x->dims[a];
    }
  }
  return o;
}

/* ==========================================================================
 * Reduce*
 * ======================================================================== */

static const es_op reduce_ops[] = {
    ES_OP_ReduceSum, ES_OP_ReduceMean,      ES_OP_ReduceSumSquare, ES_OP_ReduceL1,
    ES_OP_ReduceL2,  ES_OP_ReduceProd,      ES_OP_ReduceMax,       ES_OP_ReduceMin,
    ES_OP_ReduceLogSum, ES_OP_ReduceLogSumExp,
};

/* The reference of op over float input xd, in double. */
static void reduce_ref_f32(es_op op, const es_tdesc *x, const float *xd, const int *red,
                           double *y, size_t ycount) {
  double *cnt = calloc(ycount + 1, sizeof *cnt), *mx = calloc(ycount + 1, sizeof *mx);
  double init = op == ES_OP_ReduceProd ? 1 : op == ES_OP_ReduceMax ? -INFINITY
                                           : op == ES_OP_ReduceMin ? INFINITY
                                                                   : 0;
  for (size_t i = 0; i < ycount; i++) {
    y[i] = init;
    mx[i] = -INFINITY;
  }
  for (size_t i = 0; i < x->count; i++) {
    size_t o = out_index(x, i, red);
    mx[o] = xd[i] > mx[o] ? xd[i] : mx[o];
  }
  for (size_t i = 0; i < x->count; i++) {
    size_t o = out_index(x, i, red);
    double v = xd[i];
    cnt[o]++;
    switch (op) {
    case ES_OP_ReduceSumSquare:
    case ES_OP_ReduceL2: y[o] += v * v; break;
    case ES_OP_ReduceL1: y[o] += fabs(v); break;
    case ES_OP_ReduceProd: y[o] *= v; break;
    case ES_OP_ReduceMax: y[o] = v > y[o] ? v : y[o]; break;
    case ES_OP_ReduceMin: y[o] = v < y[o] ? v : y[o]; break;
    case ES_OP_ReduceLogSumExp: y[o] += exp(v - mx[o]); break;
    default: y[o] += v; break;
    }
  }
  for (size_t i = 0; i < ycount; i++) {
    if (op == ES_OP_ReduceMean)
      y[i] /= cnt[i];
    else if (op == ES_OP_ReduceL2)
      y[i] = sqrt(y[i]);
    else if (op == ES_OP_ReduceLogSum)
      y[i] = log(y[i]);
    else if (op == ES_OP_ReduceLogSumExp)
      y[i] = cnt[i] ? mx[i] + log(y[i]) : -INFINITY;
  }
  free(cnt);
  free(mx);
}

/* Random shapes and axes; every float op, in both forms of axes. */
static void test_reduce_random_f32(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  for (int iter = 0; iter < 600; iter++) {
    es_op op = reduce_ops[iter % (int)(sizeof reduce_ops / sizeof reduce_ops[0])];
    int rank = (int)rnd(&seed, 1, 5);
    int64_t dims[5];
    for (int i = 0; i < rank; i++)
      dims[i] = rnd(&seed, 1, op == ES_OP_ReduceProd ? 3 : 6);
    int red[5] = {0};
    int64_t axes[5];
    size_t na = 0;
    for (int i = 0; i < rank; i++)
      if (rnd(&seed, 0, 2) == 0) {
        red[i] = 1;
        axes[na++] = rnd(&seed, 0, 1) ? i : i - rank;
      }
    if (na == 0)
      for (int i = 0; i < rank; i++)
        red[i] = 1;
    int keep = (int)rnd(&seed, 0, 1);
    /* the input form: ReduceSum from opset 13, the others from 18 */
    int as_input = (int)rnd(&seed, 0, 1);
    int64_t opset = as_input ? 18 : op == ES_OP_ReduceSum ? 11 : 13;
    es_tdesc x = kh_td(ES_DTYPE_FLOAT, rank, dims);
    float *xd = malloc(x.count * sizeof *xd);
    /* positive for the logs; near 1 for the products */
    kh_rand_f32(&seed, xd, x.count, op == ES_OP_ReduceLogSum || op == ES_OP_ReduceProd ? 0.5f
                                                                                       : -4.0f,
                op == ES_OP_ReduceProd ? 1.5f : 4.0f);
    es_tdesc ad = kh_td(ES_DTYPE_INT64, 1, (int64_t[]){(int64_t)na});
    es_attr attrs[2] = {KH_INT("keepdims", keep),
                        {.name = "axes", .type = ES_ATTR_INTS, .n = na, .ints = axes}};
    const es_tdesc *in[] = {&x, &ad};
    const void *data[] = {xd, axes};
    int n_in = as_input && na ? 2 : 1, n_attr = !as_input && na ? 2 : 1;
    es_tdesc out;
    void *od;
    ES_CHECK_RC(eval(op, opset, attrs, n_attr, n_in, in, data, &out, &od));
    int orank = 0;
    for (int i = 0; i < rank; i++)
      if (!red[i] || keep)
        assert_int_equal(out.dims[orank++], red[i] ? 1 : dims[i]);
    assert_int_equal(out.rank, orank);
    assert_int_equal(out.dtype, ES_DTYPE_FLOAT);
    double *want = malloc((out.count + 1) * sizeof *want);
    reduce_ref_f32(op, &x, xd, red, want, out.count);
    char what[80];
    snprintf(what, sizeof what, "%s iteration %d", es__op_name(op), iter);
    expect_close(od, want, out.count, 1e-5, what);
    free(want);
    free(xd);
    es_mem_free(od);
  }
}

/* Integers: exact against a reference in the element type. */
static void test_reduce_random_int(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  static const es_op ops[] = {ES_OP_ReduceSum,  ES_OP_ReduceMean, ES_OP_ReduceSumSquare,
                              ES_OP_ReduceL1,   ES_OP_ReduceL2,   ES_OP_ReduceProd,
                              ES_OP_ReduceMax,  ES_OP_ReduceMin};
  for (int iter = 0; iter < 400; iter++) {
    es_op op = ops[iter % 8];
    int is64 = (int)rnd(&seed, 0, 1);
    int rank = (int)rnd(&seed, 1, 4);
    int64_t dims[4];
    for (int i = 0; i < rank; i++)
      dims[i] = rnd(&seed, 1, 5);
    int red[4] = {0};
    int64_t axes[4];
    size_t na = 0;
    for (int i = 0; i < rank; i++)
      if (rnd(&seed, 0, 1)) {
        red[i] = 1;
        axes[na++] = i;
      }
    if (na == 0)
      for (int i = 0; i < rank; i++)
        red[i] = 1;
    es_tdesc x = kh_td(is64 ? ES_DTYPE_INT64 : ES_DTYPE_INT32, rank, dims);
    int64_t *v = malloc(x.count * sizeof *v);
    void *xd = malloc(x.count * 8);
    for (size_t i = 0; i < x.count; i++) {
      v[i] = rnd(&seed, -9, 9);
      if (is64)
        ((int64_t *)xd)[i] = v[i];
      else
        ((int32_t *)xd)[i] = (int32_t)v[i];
    }
    es_attr attrs[2] = {KH_INT("keepdims", 0),
                        {.name = "axes", .type = ES_ATTR_INTS, .n = na, .ints = axes}};
    const es_tdesc *in[] = {&x};
    const void *data[] = {xd};
    es_tdesc out;
    void *od;
    ES_CHECK_RC(eval(op, 12, attrs, na ? 2 : 1, 1, in, data, &out, &od));
    assert_int_equal(out.dtype, x.dtype);
    size_t n = out.count;
    int64_t *y = calloc(n + 1, sizeof *y), *cnt = calloc(n + 1, sizeof *cnt);
    for (size_t i = 0; i < n; i++)
      y[i] = op == ES_OP_ReduceProd ? 1 : op == ES_OP_ReduceMax ? INT64_MIN
                                      : op == ES_OP_ReduceMin   ? INT64_MAX
                                                                : 0;
    for (size_t i = 0; i < x.count; i++) {
      size_t o = out_index(&x, i, red);
      int64_t e = v[i];
      cnt[o]++;
      switch (op) {
      case ES_OP_ReduceSumSquare:
      case ES_OP_ReduceL2: y[o] += e * e; break;
      case ES_OP_ReduceL1: y[o] += e < 0 ? -e : e; break;
      case ES_OP_ReduceProd: y[o] = (int64_t)((uint64_t)y[o] * (uint64_t)e); break; /* wraps */
      case ES_OP_ReduceMax: y[o] = e > y[o] ? e : y[o]; break;
      case ES_OP_ReduceMin: y[o] = e < y[o] ? e : y[o]; break;
      default: y[o] += e; break;
      }
    }
    for (size_t i = 0; i < n; i++) {
      if (op == ES_OP_ReduceMean)
        y[i] /= cnt[i];
      else if (op == ES_OP_ReduceL2)
        y[i] = (int64_t)sqrt((double)y[i]);
      int64_t g = is64 ? ((int64_t *)od)[i] : ((int32_t *)od)[i];
      if (!is64)
        y[i] = (int32_t)y[i]; /* products wrap at 32 bits */
      if (g != y[i])
        fail_msg("%s %s iteration %d: [%zu] = %lld, expected %lld", es__op_name(op),
                 es_dtype_name(x.dtype), iter, i, (long long)g, (long long)y[i]);
    }
    free(y);
    free(cnt);
    free(v);
    free(xd);
    es_mem_free(od);
  }
}

/* Empty axes (reduce everything), noop_with_empty_axes (reduce nothing:
 * each element mapped alone), an empty axes input, and reductions over no
 * element (the fold's identity, mapped). */
static void test_reduce_empty_axes(void **state) {
  (void)state;
  float x[6] = {1, -2, 3, -4, 5, 0.5f};
  es_tdesc xd = KH_TD(ES_DTYPE_FLOAT, 2, 3);
  es_tdesc empty = KH_TD(ES_DTYPE_INT64, 0);
  int64_t none[1] = {0};
  const es_tdesc *in[] = {&xd, &empty};
  const void *data[] = {x, none};
  es_tdesc out;
  void *od;
  es_attr noop[] = {KH_INT("noop_with_empty_axes", 1)};
  es_attr k0[] = {KH_INT("keepdims", 0)};
  /* no axes at all: everything, in both opset forms and with an empty input */
  for (int form = 0; form < 3; form++) {
    int64_t opset = form == 0 ? 11 : 13;
    ES_CHECK_RC(eval(ES_OP_ReduceSum, opset, k0, 1, form == 2 ? 2 : 1, in, data, &out, &od));
    assert_int_equal(out.rank, 0);
    assert_true(fabsf(*(float *)od - 3.5f) < 1e-6f);
    es_mem_free(od);
  }
  ES_CHECK_RC(eval(ES_OP_ReduceMax, 18, NULL, 0, 2, in, data, &out, &od));
  assert_int_equal(out.rank, 2); /* keepdims: [1, 1] */
  assert_int_equal(out.dims[0] * out.dims[1], 1);
  assert_true(*(float *)od == 5.0f);
  es_mem_free(od);
  /* noop: the element map only */
  struct {
    es_op op;
    double (*f)(double);
  } maps[] = {{ES_OP_ReduceSum, NULL},      {ES_OP_ReduceMax, NULL},
              {ES_OP_ReduceMean, NULL},     {ES_OP_ReduceL1, fabs},
              {ES_OP_ReduceL2, fabs},       {ES_OP_ReduceLogSumExp, NULL},
              {ES_OP_ReduceSumSquare, NULL}};
  for (size_t m = 0; m < sizeof maps / sizeof maps[0]; m++)
    for (int with_input = 0; with_input < 2; with_input++) {
      ES_CHECK_RC(eval(maps[m].op, 18, noop, 1, 1 + with_input, in, data, &out, &od));
      assert_true(es__tdesc_same_shape(&out, &xd));
      for (int i = 0; i < 6; i++) {
        double want = maps[m].op == ES_OP_ReduceSumSquare ? (double)x[i] * x[i]
                      : maps[m].f                         ? maps[m].f(x[i])
                                                          : x[i];
        float g = ((float *)od)[i];
        if (!(fabs(g - want) <= 1e-6 * (1 + fabs(want))))
          fail_msg("%s with noop_with_empty_axes: [%d] = %g, expected %g",
                   es__op_name(maps[m].op), i, (double)g, want);
      }
      es_mem_free(od);
    }
  /* ReduceSum at opset 13 has noop_with_empty_axes too; at 11 it is ignored */
  ES_CHECK_RC(eval(ES_OP_ReduceSum, 13, noop, 1, 1, in, data, &out, &od));
  assert_memory_equal(od, x, sizeof x);
  es_mem_free(od);

  /* a reduced axis of size 0: identities */
  es_tdesc z = KH_TD(ES_DTYPE_FLOAT, 2, 0);
  const es_tdesc *zin[] = {&z};
  const void *zdata[] = {x};
  es_attr ax1[] = {KH_INTS("axes", 1), KH_INT("keepdims", 0)};
  struct {
    es_op op;
    float want; /* NaN: NaN */
  } ids[] = {{ES_OP_ReduceSum, 0},          {ES_OP_ReduceProd, 1},
             {ES_OP_ReduceMax, -INFINITY},  {ES_OP_ReduceMin, INFINITY},
             {ES_OP_ReduceMean, NAN},       {ES_OP_ReduceLogSum, -INFINITY},
             {ES_OP_ReduceLogSumExp, -INFINITY}, {ES_OP_ReduceL2, 0}};
  for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
    ES_CHECK_RC(eval(ids[i].op, 12, ax1, 2, 1, zin, zdata, &out, &od));
    assert_int_equal(out.rank, 1);
    assert_int_equal(out.dims[0], 2);
    for (int j = 0; j < 2; j++) {
      float g = ((float *)od)[j];
      if (isnan(ids[i].want) ? !isnan(g) : g != ids[i].want)
        fail_msg("%s of nothing = %g, expected %g", es__op_name(ids[i].op), (double)g,
                 (double)ids[i].want);
    }
    es_mem_free(od);
  }
  /* int8 and uint8 max and min; their identities */
  int8_t i8[6] = {-3, 7, -128, 127, 0, 1};
  es_tdesc i8d = KH_TD(ES_DTYPE_INT8, 2, 3);
  const es_tdesc *i8in[] = {&i8d};
  const void *i8data[] = {i8};
  ES_CHECK_RC(eval(ES_OP_ReduceMax, 13, ax1, 2, 1, i8in, i8data, &out, &od));
  assert_int_equal(((int8_t *)od)[0], 7);
  assert_int_equal(((int8_t *)od)[1], 127);
  es_mem_free(od);
  ES_CHECK_RC(eval(ES_OP_ReduceMin, 13, ax1, 2, 1, i8in, i8data, &out, &od));
  assert_int_equal(((int8_t *)od)[0], -128);
  assert_int_equal(((int8_t *)od)[1], 0);
  es_mem_free(od);
  es_tdesc u8z = KH_TD(ES_DTYPE_UINT8, 1, 0);
  const es_tdesc *u8in[] = {&u8z};
  ES_CHECK_RC(eval(ES_OP_ReduceMin, 13, ax1, 2, 1, u8in, i8data, &out, &od));
  assert_int_equal(((uint8_t *)od)[0], 255);
  es_mem_free(od);
}

/* NaN propagates through max and min (numpy); large inputs through
 * LogSumExp do not overflow. */
static void test_reduce_nan_and_range(void **state) {
  (void)state;
  float x[10] = {1, 2, NAN, 4, 5, 6, 7, 8, 9, 10};
  es_tdesc xd = KH_TD(ES_DTYPE_FLOAT, 10);
  const es_tdesc *in[] = {&xd};
  const void *data[] = {x};
  es_tdesc out;
  void *od;
  ES_CHECK_RC(eval(ES_OP_ReduceMax, 13, NULL, 0, 1, in, data, &out, &od));
  assert_true(isnan(*(float *)od));
  es_mem_free(od);
  ES_CHECK_RC(eval(ES_OP_ReduceMin, 13, NULL, 0, 1, in, data, &out, &od));
  assert_true(isnan(*(float *)od));
  es_mem_free(od);
  float big[3] = {1000, 1000, -INFINITY};
  es_tdesc bd = KH_TD(ES_DTYPE_FLOAT, 3);
  const es_tdesc *bin[] = {&bd};
  const void *bdata[] = {big};
  ES_CHECK_RC(eval(ES_OP_ReduceLogSumExp, 13, NULL, 0, 1, bin, bdata, &out, &od));
  assert_true(fabsf(*(float *)od - (1000.0f + logf(2.0f))) < 1e-3f);
  es_mem_free(od);
  float infs[2] = {INFINITY, 1};
  const void *idata[] = {infs};
  es_tdesc id2 = KH_TD(ES_DTYPE_FLOAT, 2);
  const es_tdesc *iin[] = {&id2};
  ES_CHECK_RC(eval(ES_OP_ReduceLogSumExp, 13, NULL, 0, 1, iin, idata, &out, &od));
  assert_true(isinf(*(float *)od) && *(float *)od > 0);
  es_mem_free(od);
}

static void test_reduce_errors(void **state) {
  (void)state;
  es_tdesc x = KH_TD(ES_DTYPE_FLOAT, 2, 3, 4);
  es_attr dup[] = {KH_INTS("axes", 1, -2)};
  expect_rc1(ES_OP_ReduceSum, 11, dup, KH_LEN(dup), x, ES_EMODEL);
  es_attr range[] = {KH_INTS("axes", 3)};
  expect_rc1(ES_OP_ReduceMax, 13, range, KH_LEN(range), x, ES_EMODEL);
  es_attr keep[] = {KH_INT("keepdims", 2)};
  expect_rc1(ES_OP_ReduceProd, 13, keep, KH_LEN(keep), x, ES_EMODEL);
  /* axes as an attribute where the opset wants an input */
  es_attr ax[] = {KH_INTS("axes", 1)};
  expect_rc1(ES_OP_ReduceSum, 13, ax, KH_LEN(ax), x, ES_EMODEL);
  expect_rc1(ES_OP_ReduceL2, 18, ax, KH_LEN(ax), x, ES_EMODEL);
  /* types outside the spec, and ones it allows that are not implemented */
  expect_rc1(ES_OP_ReduceSum, 13, NULL, 0, KH_TD(ES_DTYPE_UINT8, 3), ES_EMODEL);
  expect_rc1(ES_OP_ReduceMax, 13, NULL, 0, KH_TD(ES_DTYPE_BOOL, 3), ES_EMODEL);
  expect_rc1(ES_OP_ReduceLogSum, 13, NULL, 0, KH_TD(ES_DTYPE_INT32, 3), ES_ENOTSUP);
  /* an axes input that is not known while planning, or is not int64 */
  int64_t axes[1] = {1};
  float buf[24] = {0};
  es_tdesc ad = KH_TD(ES_DTYPE_INT64, 1), ad32 = KH_TD(ES_DTYPE_INT32, 1);
  const es_tdesc *in[] = {&x, &ad}, *in32[] = {&x, &ad32};
  const void *data[] = {buf, axes};
  es_tdesc out;
  void *od = NULL;
  ES_EXPECT_RC(eval_ex(ES_OP_ReduceSum, 13, NULL, 0, 2, in, data, 2, 0, &out, &od), ES_ENOTSUP);
  ES_EXPECT_RC(eval(ES_OP_ReduceSum, 13, NULL, 0, 2, in32, data, &out, &od), ES_EMODEL);
  /* an axes input before its opset */
  ES_EXPECT_RC(eval(ES_OP_ReduceMin, 13, NULL, 0, 2, in, data, &out, &od), ES_EMODEL);
}

/* ==========================================================================
 * ArgMax, ArgMin
 * ======================================================================== */

static void test_argmax_ties(void **state) {
  (void)state;
  /* rows with ties: first and last of the max and of the min */
  float x[8] = {3, 1, 3, 1, /**/ 2, 2, 2, 2};
  es_tdesc xd = KH_TD(ES_DTYPE_FLOAT, 2, 4);
  const es_tdesc *in[] = {&xd};
  const void *data[] = {x};
  struct {
    es_op op;
    int last;
    int64_t want[2];
  } cases[] = {{ES_OP_ArgMax, 0, {0, 0}}, {ES_OP_ArgMax, 1, {2, 3}},
               {ES_OP_ArgMin, 0, {1, 0}}, {ES_OP_ArgMin, 1, {3, 3}}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    es_attr a[] = {KH_INT("axis", 1), KH_INT("keepdims", 0),
                   KH_INT("select_last_index", cases[c].last)};
    es_tdesc out;
    void *od;
    ES_CHECK_RC(eval(cases[c].op, 12, a, 3, 1, in, data, &out, &od));
    assert_int_equal(out.dtype, ES_DTYPE_INT64);
    assert_int_equal(out.rank, 1);
    assert_int_equal(out.dims[0], 2);
    for (int i = 0; i < 2; i++)
      if (((int64_t *)od)[i] != cases[c].want[i])
        fail_msg("%s select_last_index %d: row %d -> %lld, expected %lld",
                 es__op_name(cases[c].op), cases[c].last, i, (long long)((int64_t *)od)[i],
                 (long long)cases[c].want[i]);
    es_mem_free(od);
  }
  /* along axis 0 (columns, the scratch path), keepdims: [1, 4] */
  es_attr a0[] = {KH_INT("select_last_index", 1)};
  es_tdesc out;
  void *od;
  ES_CHECK_RC(eval(ES_OP_ArgMax, 12, a0, 1, 1, in, data, &out, &od));
  assert_int_equal(out.rank, 2);
  assert_int_equal(out.dims[0], 1);
  int64_t want0[4] = {0, 1, 0, 1};
  assert_memory_equal(od, want0, sizeof want0);
  es_mem_free(od);
  /* NaN wins, the first one (numpy) */
  float xn[4] = {1, NAN, 5, NAN};
  es_tdesc nd = KH_TD(ES_DTYPE_FLOAT, 4);
  const es_tdesc *nin[] = {&nd};
  const void *ndata[] = {xn};
  for (int op = 0; op < 2; op++) {
    ES_CHECK_RC(eval(op ? ES_OP_ArgMin : ES_OP_ArgMax, 12, NULL, 0, 1, nin, ndata, &out, &od));
    assert_int_equal(*(int64_t *)od, 1);
    es_mem_free(od);
  }
}

/* Random shapes, axes and types against a scan of each line. */
static void test_argmax_random(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  static const es_dtype types[] = {ES_DTYPE_FLOAT, ES_DTYPE_INT32, ES_DTYPE_INT64,
                                   ES_DTYPE_UINT8, ES_DTYPE_INT8};
  for (int iter = 0; iter < 300; iter++) {
    es_dtype dt = types[iter % 5];
    int rank = (int)rnd(&seed, 1, 4);
    int64_t dims[4];
    for (int i = 0; i < rank; i++)
      dims[i] = rnd(&seed, 1, 5);
    int ax = (int)rnd(&seed, 0, rank - 1), is_max = (int)rnd(&seed, 0, 1);
    int last = (int)rnd(&seed, 0, 1), keep = (int)rnd(&seed, 0, 1);
    es_tdesc x = kh_td(dt, rank, dims);
    size_t esz = es_dtype_size(dt);
    double *v = malloc(x.count * sizeof *v);
    unsigned char *xd = malloc(x.count * esz);
    for (size_t i = 0; i < x.count; i++) {
      int64_t r = rnd(&seed, 0, 6); /* few values: many ties */
      v[i] = (double)r;
      switch (dt) {
      case ES_DTYPE_FLOAT: ((float *)xd)[i] = (float)r; break;
      case ES_DTYPE_INT32: ((int32_t *)xd)[i] = (int32_t)r; break;
      case ES_DTYPE_INT64: ((int64_t *)xd)[i] = r; break;
      case ES_DTYPE_UINT8: ((uint8_t *)xd)[i] = (uint8_t)r; break;
      default: ((int8_t *)xd)[i] = (int8_t)(r - 3), v[i] = (double)(r - 3); break;
      }
    }
    es_attr a[] = {KH_INT("axis", rnd(&seed, 0, 1) ? ax : ax - rank), KH_INT("keepdims", keep),
                   KH_INT("select_last_index", last)};
    const es_tdesc *in[] = {&x};
    const void *data[] = {xd};
    es_tdesc out;
    void *od;
    ES_CHECK_RC(eval(is_max ? ES_OP_ArgMax : ES_OP_ArgMin, 13, a, 3, 1, in, data, &out, &od));
    assert_int_equal(out.rank, keep ? rank : rank - 1);
    int64_t outer = 1, inner = 1, n = dims[ax];
    for (int i = 0; i < rank; i++)
      if (i < ax)
        outer *= dims[i];
      else if (i > ax)
        inner *= dims[i];
    for (int64_t o = 0; o < outer; o++)
      for (int64_t i = 0; i < inner; i++) {
        int64_t best = 0;
        for (int64_t j = 1; j < n; j++) {
          double c = v[(o * n + j) * inner + i], b = v[(o * n + best) * inner + i];
          if (is_max ? (last ? c >= b : c > b) : (last ? c <= b : c < b))
            best = j;
        }
        int64_t g = ((int64_t *)od)[o * inner + i];
        if (g != best)
          fail_msg("%s %s iteration %d: [%lld] = %lld, expected %lld",
                   is_max ? "ArgMax" : "ArgMin", es_dtype_name(dt), iter,
                   (long long)(o * inner + i), (long long)g, (long long)best);
      }
    free(v);
    free(xd);
    es_mem_free(od);
  }
}

static void test_argmax_errors(void **state) {
  (void)state;
  es_attr a2[] = {KH_INT("axis", 2)};
  expect_rc1(ES_OP_ArgMax, 13, a2, 1, KH_TD(ES_DTYPE_FLOAT, 2, 3), ES_EMODEL);
  es_attr s2[] = {KH_INT("select_last_index", 2)};
  expect_rc1(ES_OP_ArgMin, 13, s2, 1, KH_TD(ES_DTYPE_FLOAT, 2, 3), ES_EMODEL);
  expect_rc1(ES_OP_ArgMax, 13, NULL, 0, KH_TD(ES_DTYPE_FLOAT, 0, 3), ES_EMODEL);
  expect_rc1(ES_OP_ArgMax, 13, NULL, 0, KH_TD(ES_DTYPE_BOOL, 3), ES_EMODEL);
}

/* ==========================================================================
 * CumSum
 * ======================================================================== */

static void test_cumsum(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  for (int iter = 0; iter < 200; iter++) {
    int rank = (int)rnd(&seed, 1, 4);
    int64_t dims[4];
    for (int i = 0; i < rank; i++)
      dims[i] = rnd(&seed, 1, 5);
    int ax = (int)rnd(&seed, 0, rank - 1);
    int excl = (int)rnd(&seed, 0, 1), rev = (int)rnd(&seed, 0, 1);
    int kind = iter % 3; /* float32, int32, int64 */
    es_dtype dt = kind == 0 ? ES_DTYPE_FLOAT : kind == 1 ? ES_DTYPE_INT32 : ES_DTYPE_INT64;
    es_tdesc x = kh_td(dt, rank, dims);
    int64_t *v = malloc(x.count * sizeof *v);
    void *xd = malloc(x.count * 8);
    for (size_t i = 0; i < x.count; i++) {
      v[i] = rnd(&seed, -50, 50);
      if (kind == 0)
        ((float *)xd)[i] = (float)v[i];
      else if (kind == 1)
        ((int32_t *)xd)[i] = (int32_t)v[i];
      else
        ((int64_t *)xd)[i] = v[i];
    }
    int a32 = (int)rnd(&seed, 0, 1);
    int64_t axis64 = rnd(&seed, 0, 1) ? ax : ax - rank;
    int32_t axis32 = (int32_t)axis64;
    es_tdesc axd = a32 ? kh_td(ES_DTYPE_INT32, 0, NULL) : KH_TD(ES_DTYPE_INT64, 1);
    es_attr a[] = {KH_INT("exclusive", excl), KH_INT("reverse", rev)};
    const es_tdesc *in[] = {&x, &axd};
    const void *data[] = {xd, a32 ? (const void *)&axis32 : (const void *)&axis64};
    es_tdesc out;
    void *od;
    /* the axis known while planning, or only at run time */
    ES_CHECK_RC(eval_ex(ES_OP_CumSum, 14, a, 2, 2, in, data, iter & 1 ? 2 : 0, 0, &out, &od));
    int64_t outer = 1, inner = 1, n = dims[ax];
    for (int i = 0; i < rank; i++)
      if (i < ax)
        outer *= dims[i];
      else if (i > ax)
        inner *= dims[i];
    for (int64_t o = 0; o < outer; o++)
      for (int64_t i = 0; i < inner; i++)
        for (int64_t j = 0; j < n; j++) {
          int64_t s = 0;
          for (int64_t t = 0; t < n; t++) {
            int in_sum = rev ? (excl ? t > j : t >= j) : (excl ? t < j : t <= j);
            if (in_sum)
              s += v[(o * n + t) * inner + i];
          }
          size_t e = (size_t)((o * n + j) * inner + i);
          int64_t g = kind == 0   ? (int64_t)((float *)od)[e]
                      : kind == 1 ? ((int32_t *)od)[e]
                                  : ((int64_t *)od)[e];
          if (g != s)
            fail_msg("CumSum iteration %d (exclusive %d, reverse %d): [%zu] = %lld, expected "
                     "%lld", iter, excl, rev, e, (long long)g, (long long)s);
        }
    free(v);
    free(xd);
    es_mem_free(od);
  }
  /* an axis out of range: at plan time when known, at run time otherwise */
  float xs[4] = {0};
  int64_t bad = 2;
  es_tdesc xd = KH_TD(ES_DTYPE_FLOAT, 2, 2), axd = KH_TD(ES_DTYPE_INT64, 1);
  const es_tdesc *in[] = {&xd, &axd};
  const void *data[] = {xs, &bad};
  es_tdesc out;
  void *od = NULL;
  ES_EXPECT_RC(eval(ES_OP_CumSum, 14, NULL, 0, 2, in, data, &out, &od), ES_EMODEL);
  ES_EXPECT_RC(eval_ex(ES_OP_CumSum, 14, NULL, 0, 2, in, data, 2, 0, &out, &od), ES_EMODEL);
  es_tdesc ax2 = KH_TD(ES_DTYPE_INT64, 2);
  const es_tdesc *in2[] = {&xd, &ax2};
  int64_t two[2] = {0, 1};
  const void *data2[] = {xs, two};
  ES_EXPECT_RC(eval(ES_OP_CumSum, 14, NULL, 0, 2, in2, data2, &out, &od), ES_EMODEL);
}

/* ==========================================================================
 * Softmax, LogSoftmax, Hardmax
 * ======================================================================== */

/* The three over [outer, n, inner], in double. */
static void smx_reference(es_op op, const float *x, double *y, int64_t outer, int64_t n,
                          int64_t inner) {
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      const float *b = x + o * n * inner + i;
      double *yb = y + o * n * inner + i;
      double m = -INFINITY, s = 0;
      int64_t bi = 0;
      for (int64_t j = 0; j < n; j++)
        if (b[j * inner] > m) {
          m = b[j * inner];
          bi = j;
        }
      for (int64_t j = 0; j < n; j++)
        s += exp(b[j * inner] - m);
      for (int64_t j = 0; j < n; j++)
        yb[j * inner] = op == ES_OP_Softmax      ? exp(b[j * inner] - m) / s
                        : op == ES_OP_LogSoftmax ? b[j * inner] - m - log(s)
                                                 : (double)(j == bi);
    }
}

/* Axis 0 (columns through scratch), the last axis (rows), a middle one, and
 * the opset-11 coercion to 2-D at axis (default 1), each in place and not. */
static void test_softmax_family(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  int64_t dims[3] = {2, 3, 5};
  es_tdesc xd = kh_td(ES_DTYPE_FLOAT, 3, dims);
  float *x = malloc(30 * sizeof *x);
  kh_rand_f32(&seed, x, 30, -4.0f, 4.0f);
  for (size_t i = 0; i < 5; i++)
    x[i] = 1000.0f + (float)i; /* large values: the max must come off first */
  x[7] = x[8];                 /* a tie for Hardmax: the first one wins */
  const es_tdesc *in[] = {&xd};
  const void *data[] = {x};
  double want[30];
  struct {
    int64_t opset, axis;
    int has_axis;
    int64_t outer, n, inner;
  } cases[] = {
      {13, 0, 1, 1, 2, 15},  /* axis 0 */
      {13, -3, 1, 1, 2, 15}, /* axis 0, negative */
      {13, 0, 0, 6, 5, 1},   /* default: the last axis */
      {13, 1, 1, 2, 3, 5},   /* a middle axis */
      {11, 0, 0, 2, 15, 1},  /* opset 11, default axis 1: [2, 15] */
      {11, 0, 1, 1, 30, 1},  /* opset 11, axis 0: one row of everything */
      {11, 2, 1, 6, 5, 1},   /* opset 11, axis 2: [6, 5] */
      {11, -2, 1, 2, 15, 1}, /* opset 11, axis -2 = 1 */
      {1, 1, 1, 2, 15, 1},   /* opset 1 is the same */
  };
  static const es_op ops[] = {ES_OP_Softmax, ES_OP_LogSoftmax, ES_OP_Hardmax};
  for (int o = 0; o < 3; o++)
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
      es_attr a[] = {KH_INT("axis", cases[c].axis)};
      smx_reference(ops[o], x, want, cases[c].outer, cases[c].n, cases[c].inner);
      for (int inplace = 0; inplace < 2; inplace++) {
        es_tdesc out;
        void *od;
        ES_CHECK_RC(eval_ex(ops[o], cases[c].opset, a, cases[c].has_axis, 1, in, data, 0,
                            inplace, &out, &od));
        assert_true(es__tdesc_same_shape(&out, &xd));
        char what[80];
        snprintf(what, sizeof what, "%s case %zu%s", es__op_name(ops[o]), c,
                 inplace ? " in place" : "");
        expect_close(od, want, 30, 1e-5, what);
        es_mem_free(od);
      }
    }
  free(x);

  /* LogSoftmax keeps precision far below softmax's underflow */
  float lx[2] = {0, -200};
  es_tdesc ld = KH_TD(ES_DTYPE_FLOAT, 2);
  const es_tdesc *lin[] = {&ld};
  const void *ldata[] = {lx};
  es_tdesc out;
  void *od;
  ES_CHECK_RC(eval(ES_OP_LogSoftmax, 13, NULL, 0, 1, lin, ldata, &out, &od));
  assert_true(fabsf(((float *)od)[0]) < 1e-6f);
  assert_true(fabsf(((float *)od)[1] + 200.0f) < 1e-3f);
  es_mem_free(od);
}

static void test_softmax_family_errors(void **state) {
  (void)state;
  static const es_op ops[] = {ES_OP_Softmax, ES_OP_LogSoftmax, ES_OP_Hardmax};
  for (int o = 0; o < 3; o++) {
    es_tdesc x = KH_TD(ES_DTYPE_FLOAT, 2, 3);
    es_attr a2[] = {KH_INT("axis", 2)};
    expect_rc1(ops[o], 13, a2, 1, x, ES_EMODEL);
    expect_rc1(ops[o], 11, a2, 1, x, ES_EMODEL);
    expect_rc1(ops[o], 13, NULL, 0, KH_TD(ES_DTYPE_INT32, 2, 3), ES_EMODEL);
    expect_rc1(ops[o], 13, NULL, 0, kh_td(ES_DTYPE_FLOAT, 0, NULL), ES_EMODEL);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reduce_random_f32),   cmocka_unit_test(test_reduce_random_int),
      cmocka_unit_test(test_reduce_empty_axes),   cmocka_unit_test(test_reduce_nan_and_range),
      cmocka_unit_test(test_reduce_errors),       cmocka_unit_test(test_argmax_ties),
      cmocka_unit_test(test_argmax_random),       cmocka_unit_test(test_argmax_errors),
      cmocka_unit_test(test_cumsum),              cmocka_unit_test(test_softmax_family),
      cmocka_unit_test(test_softmax_family_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
