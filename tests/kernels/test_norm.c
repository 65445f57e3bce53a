/* Kernels of the normalisations and the global pools: InstanceNormalization,
 * GroupNormalization (opsets 18 and 21), LayerNormalization (opset 17),
 * MeanVarianceNormalization, LRN, LpNormalization, GlobalMaxPool and
 * GlobalLpPool.
 *
 * Each runs on random shapes and attributes against a naive reference in
 * double written from the spec's formula, in place where the kernel allows
 * it; the global pools also on NHWC inputs, which must give the plain
 * result. Then invalid nodes must fail with the right code. */
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

static float *rand_f32(uint64_t *s, size_t n, float lo, float hi) {
  float *p = malloc((n ? n : 1) * sizeof *p);
  assert_non_null(p);
  kh_rand_f32(s, p, n, lo, hi);
  return p;
}

/* One node with n_out outputs; inplace: out[0] shares in[0]. */
static int eval_n(es_op op, int64_t opset, const es_attr *attrs, int n_attr, int n_in,
                  const es_tdesc *const *in, const void *const *data, int inplace, int n_out,
                  es_tdesc *out, void **outd) {
  es_knode node = kh_knode(op, attrs, n_attr);
  if (!inplace)
    return es__kernel_eval(&node, opset, n_in, in, data, n_out, out, outd);
  kh_opts o = {.opset = opset, .inplace = 1};
  return kh_eval_with(&node, &o, n_in, in, data, n_out, out, outd);
}

static int eval(es_op op, int64_t opset, const es_attr *attrs, int n_attr, int n_in,
                const es_tdesc *const *in, const void *const *data, es_tdesc *out, void **outd) {
  return eval_n(op, opset, attrs, n_attr, n_in, in, data, 0, 1, out, outd);
}

static void expect_close(const float *got, const double *want, size_t n, double tol,
                         const char *what) {
  for (size_t i = 0; i < n; i++) {
    if (isnan(want[i]) && isnan(got[i]))
      continue;
    if (!(fabs((double)got[i] - want[i]) <= tol * (1 + fabs(want[i]))))
      fail_msg("%s: [%zu] = %.9g, expected %.9g", what, i, (double)got[i], want[i]);
  }
}

/* Mean and variance (population) of n values `stride` apart. */
static void stats(const float *x, int64_t n, double *mean, double *var) {
  double s = 0, q = 0;
  for (int64_t i = 0; i < n; i++)
    s += x[i];
  *mean = s / (double)n;
  for (int64_t i = 0; i < n; i++)
    q += (x[i] - *mean) * (x[i] - *mean);
  *var = q / (double)n;
}

/* ==========================================================================
 * InstanceNormalization, GroupNormalization
 * ======================================================================== */

/* Reference: per image and group, (x - mean) / sqrt(var + eps), then scale
 * and bias per channel, or per group (per_group). */
static void group_ref(const float *x, const float *scale, const float *bias, int64_t n,
                      int64_t c, int64_t plane, int64_t groups, int per_group, double eps,
                      double *y) {
  int64_t cg = c / groups, len = cg * plane;
  for (int64_t b = 0; b < n; b++)
    for (int64_t g = 0; g < groups; g++) {
      const float *xb = x + (b * c + g * cg) * plane;
      double mean, var;
      stats(xb, len, &mean, &var);
      for (int64_t i = 0; i < len; i++) {
        int64_t ch = g * cg + i / plane, si = per_group ? g : ch;
        y[(b * c + g * cg) * plane + i] =
            (xb[i] - mean) / sqrt(var + eps) * scale[si] + bias[si];
      }
    }
}

static void test_instance_group_norm(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  for (int iter = 0; iter < 150; iter++) {
    int kind = iter % 3; /* InstanceNormalization, GroupNormalization 18, 21 */
    int rank = (int)rnd(&seed, 2, 5);
    int64_t dims[5];
    dims[0] = rnd(&seed, 1, 2);
    int64_t groups = rnd(&seed, 1, 3);
    dims[1] = kind ? groups * rnd(&seed, 1, 3) : rnd(&seed, 1, 5);
    for (int i = 2; i < rank; i++)
      dims[i] = rnd(&seed, 1, 6);
    if (!kind)
      groups = dims[1];
    es_tdesc x = kh_td(ES_DTYPE_FLOAT, rank, dims);
    int64_t plane = 1;
    for (int i = 2; i < rank; i++)
      plane *= dims[i];
    int per_group = kind == 1;
    int64_t np = per_group ? groups : dims[1];
    float *xd = rand_f32(&seed, x.count, -3.0f, 5.0f);
    float *sc = rand_f32(&seed, (size_t)np, 0.5f, 2.0f), *bi = rand_f32(&seed, (size_t)np, -1, 1);
    float eps = iter % 2 ? 1e-5f : 0.1f;
    es_tdesc pd = KH_TD(ES_DTYPE_FLOAT, np);
    const es_tdesc *in[] = {&x, &pd, &pd};
    const void *data[] = {xd, sc, bi};
    es_attr a[] = {KH_FLOAT("epsilon", eps), KH_INT("num_groups", groups)};
    es_op op = kind ? ES_OP_GroupNormalization : ES_OP_InstanceNormalization;
    int64_t opset = kind == 0 ? 6 : kind == 1 ? 18 : 21;
    double *want = malloc(x.count * sizeof *want);
    group_ref(xd, sc, bi, dims[0], dims[1], plane, groups, per_group, eps, want);
    for (int inplace = 0; inplace < 2; inplace++) {
      es_tdesc out;
      void *od;
      ES_CHECK_RC(eval_n(op, opset, a, kind ? 2 : 1, 3, in, data, inplace, 1, &out, &od));
      assert_true(es__tdesc_same_shape(&out, &x));
      char what[80];
      snprintf(what, sizeof what, "%s opset %lld iteration %d", es__op_name(op),
               (long long)opset, iter);
      /* a plane of one element has variance 0: eps decides the scale */
      expect_close(od, want, x.count, 2e-4, what);
      es_mem_free(od);
    }
    free(want);
    free(xd);
    free(sc);
    free(bi);
  }
}

static void test_group_norm_errors(void **state) {
  (void)state;
  float buf[64] = {0};
  es_tdesc x = KH_TD(ES_DTYPE_FLOAT, 1, 6, 2, 2), p3 = KH_TD(ES_DTYPE_FLOAT, 3),
           p6 = KH_TD(ES_DTYPE_FLOAT, 6);
  const void *data[] = {buf, buf, buf};
  es_tdesc out;
  void *od = NULL;
  es_attr g3[] = {KH_INT("num_groups", 3)}, g4[] = {KH_INT("num_groups", 4)};
  const es_tdesc *per_group[] = {&x, &p3, &p3}, *per_chan[] = {&x, &p6, &p6};
  /* scale per group at 18, per channel at 21 */
  ES_CHECK_RC(eval(ES_OP_GroupNormalization, 18, g3, 1, 3, per_group, data, &out, &od));
  es_mem_free(od);
  ES_CHECK_RC(eval(ES_OP_GroupNormalization, 21, g3, 1, 3, per_chan, data, &out, &od));
  es_mem_free(od);
  ES_EXPECT_RC(eval(ES_OP_GroupNormalization, 18, g3, 1, 3, per_chan, data, &out, &od),
               ES_EMODEL);
  ES_EXPECT_RC(eval(ES_OP_GroupNormalization, 21, g3, 1, 3, per_group, data, &out, &od),
               ES_EMODEL);
  /* groups that do not divide C, none, or missing */
  const es_tdesc *four[] = {&x, &p6, &p6};
  ES_EXPECT_RC(eval(ES_OP_GroupNormalization, 21, g4, 1, 3, four, data, &out, &od), ES_EMODEL);
  ES_EXPECT_RC(eval(ES_OP_GroupNormalization, 21, NULL, 0, 3, four, data, &out, &od),
               ES_EMODEL);
  es_attr g0[] = {KH_INT("num_groups", 0)};
  ES_EXPECT_RC(eval(ES_OP_GroupNormalization, 21, g0, 1, 3, four, data, &out, &od), ES_EMODEL);
  es_attr st[] = {KH_INT("num_groups", 3), KH_INT("stash_type", 11)};
  ES_EXPECT_RC(eval(ES_OP_GroupNormalization, 21, st, 2, 3, per_chan, data, &out, &od),
               ES_ENOTSUP);
  /* InstanceNormalization: scale per channel, float only, epsilon >= 0 */
  ES_EXPECT_RC(eval(ES_OP_InstanceNormalization, 6, NULL, 0, 3, per_group, data, &out, &od),
               ES_EMODEL);
  es_tdesc xi = KH_TD(ES_DTYPE_INT32, 1, 6, 2, 2);
  const es_tdesc *ints[] = {&xi, &p6, &p6};
  ES_EXPECT_RC(eval(ES_OP_InstanceNormalization, 6, NULL, 0, 3, ints, data, &out, &od),
               ES_EMODEL);
  es_attr neg[] = {KH_FLOAT("epsilon", -1.0f)};
  ES_EXPECT_RC(eval(ES_OP_InstanceNormalization, 6, neg, 1, 3, per_chan, data, &out, &od),
               ES_EMODEL);
  const es_tdesc *two[] = {&x, &p6};
  ES_EXPECT_RC(eval(ES_OP_InstanceNormalization, 6, NULL, 0, 2, two, data, &out, &od),
               ES_EMODEL);
}

/* ==========================================================================
 * LayerNormalization
 * ======================================================================== */

static void test_layer_normalization(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  for (int iter = 0; iter < 200; iter++) {
    int rank = (int)rnd(&seed, 1, 4);
    int64_t dims[4];
    for (int i = 0; i < rank; i++)
      dims[i] = rnd(&seed, 1, 6);
    int ax = (int)rnd(&seed, 0, rank - 1);
    es_tdesc x = kh_td(ES_DTYPE_FLOAT, rank, dims);
    int64_t rows = 1, d = 1;
    for (int i = 0; i < rank; i++)
      if (i < ax)
        rows *= dims[i];
      else
        d *= dims[i];
    /* Scale: the normalised shape, with leading 1s, or one element */
    int sform = (int)rnd(&seed, 0, 2);
    int64_t sdims[5];
    int srank = 0;
    if (sform == 2) {
      sdims[srank++] = 1;
    } else {
      if (sform == 1)
        sdims[srank++] = 1;
      for (int i = ax; i < rank; i++)
        sdims[srank++] = dims[i];
    }
    es_tdesc sd = kh_td(ES_DTYPE_FLOAT, srank, sdims);
    int with_b = (int)rnd(&seed, 0, 1);
    float *xd = rand_f32(&seed, x.count, -2.0f, 6.0f);
    float *sc = rand_f32(&seed, sd.count, 0.5f, 2.0f), *bi = rand_f32(&seed, sd.count, -1, 1);
    float eps = 1e-3f;
    es_attr a[] = {KH_INT("axis", rnd(&seed, 0, 1) ? ax : ax - rank), KH_FLOAT("epsilon", eps)};
    const es_tdesc *in[] = {&x, &sd, &sd};
    const void *data[] = {xd, sc, bi};
    int n_out = (int)rnd(&seed, 1, 3);
    es_tdesc out[3];
    void *od[3];
    ES_CHECK_RC(eval_n(ES_OP_LayerNormalization, 17, a, 2, with_b ? 3 : 2, in, data,
                       iter % 4 == 0, n_out, out, od));
    double *want = malloc(x.count * sizeof *want);
    for (int64_t r = 0; r < rows; r++) {
      double mean, var;
      stats(xd + r * d, d, &mean, &var);
      double inv = 1 / sqrt(var + eps);
      for (int64_t i = 0; i < d; i++) {
        size_t si = sd.count == 1 ? 0 : (size_t)i;
        want[r * d + i] = (xd[r * d + i] - mean) * inv * sc[si] + (with_b ? bi[si] : 0);
      }
      if (n_out > 1 && fabs(((float *)od[1])[r] - mean) > 1e-4 * (1 + fabs(mean)))
        fail_msg("LayerNormalization iteration %d: Mean[%lld] = %g, expected %g", iter,
                 (long long)r, (double)((float *)od[1])[r], mean);
      if (n_out > 2 && fabs(((float *)od[2])[r] - inv) > 1e-4 * (1 + inv))
        fail_msg("LayerNormalization iteration %d: InvStdDev[%lld] = %g, expected %g", iter,
                 (long long)r, (double)((float *)od[2])[r], inv);
    }
    char what[64];
    snprintf(what, sizeof what, "LayerNormalization iteration %d", iter);
    expect_close(od[0], want, x.count, 1e-4, what);
    for (int o = 1; o < n_out; o++) { /* X's shape, 1 from axis on */
      assert_int_equal(out[o].rank, rank);
      for (int i = 0; i < rank; i++)
        assert_int_equal(out[o].dims[i], i < ax ? dims[i] : 1);
    }
    for (int o = 0; o < n_out; o++)
      es_mem_free(od[o]);
    free(want);
    free(xd);
    free(sc);
    free(bi);
  }

  /* Mean omitted, InvStdDev wanted: the middle output is absent */
  float x[6] = {1, 2, 3, 4, 6, 8}, one[3] = {1, 1, 1};
  es_tdesc xd = KH_TD(ES_DTYPE_FLOAT, 2, 3), sd = KH_TD(ES_DTYPE_FLOAT, 3);
  const es_tdesc *in[] = {&xd, &sd};
  const void *data[] = {x, one};
  es_knode node = kh_knode(ES_OP_LayerNormalization, NULL, 0);
  kh_run h;
  kh_begin(&h, &node, 17, 2, in, data, 0, 3, NULL);
  h.outp[1] = NULL;
  ES_CHECK_RC(kh_infer(&h));
  void *od[3];
  ES_CHECK_RC(kh_exec(&h, data, 0, od));
  double v1 = 2.0 / 3.0, v2 = 8.0 / 3.0;
  assert_true(fabs(((float *)od[2])[0] - 1 / sqrt(v1 + 1e-5)) < 1e-4);
  assert_true(fabs(((float *)od[2])[1] - 1 / sqrt(v2 + 1e-5)) < 1e-4);
  for (int i = 0; i < 3; i++)
    es_mem_free(od[i]);
  kh_end(&h);
}

static void test_layer_normalization_errors(void **state) {
  (void)state;
  float buf[64] = {0};
  es_tdesc x = KH_TD(ES_DTYPE_FLOAT, 2, 3, 4);
  es_tdesc s4 = KH_TD(ES_DTYPE_FLOAT, 4), s34 = KH_TD(ES_DTYPE_FLOAT, 3, 4),
           s5 = KH_TD(ES_DTYPE_FLOAT, 5), s12 = KH_TD(ES_DTYPE_FLOAT, 12);
  const void *data[] = {buf, buf, buf};
  es_tdesc out;
  void *od = NULL;
  es_attr am2[] = {KH_INT("axis", -2)};
  /* [4] against a normalised [3, 4]: a broadcast not implemented */
  const es_tdesc *partial[] = {&x, &s4};
  ES_EXPECT_RC(eval(ES_OP_LayerNormalization, 17, am2, 1, 2, partial, data, &out, &od),
               ES_ENOTSUP);
  /* the right count in the wrong shape, and the wrong count */
  const es_tdesc *flat[] = {&x, &s12};
  ES_EXPECT_RC(eval(ES_OP_LayerNormalization, 17, am2, 1, 2, flat, data, &out, &od),
               ES_EMODEL);
  const es_tdesc *five[] = {&x, &s5};
  ES_EXPECT_RC(eval(ES_OP_LayerNormalization, 17, NULL, 0, 2, five, data, &out, &od),
               ES_EMODEL);
  const es_tdesc *ok[] = {&x, &s34, &s34};
  ES_CHECK_RC(eval(ES_OP_LayerNormalization, 17, am2, 1, 3, ok, data, &out, &od));
  es_mem_free(od);
  es_attr st[] = {KH_INT("stash_type", 11)};
  const es_tdesc *last[] = {&x, &s4};
  ES_EXPECT_RC(eval(ES_OP_LayerNormalization, 17, st, 1, 2, last, data, &out, &od), ES_ENOTSUP);
  es_attr a3[] = {KH_INT("axis", 3)};
  ES_EXPECT_RC(eval(ES_OP_LayerNormalization, 17, a3, 1, 2, last, data, &out, &od), ES_EMODEL);
  const es_tdesc *alone[] = {&x};
  ES_EXPECT_RC(eval(ES_OP_LayerNormalization, 17, NULL, 0, 1, alone, data, &out, &od),
               ES_EMODEL);
  es_tdesc xi = KH_TD(ES_DTYPE_INT64, 2, 3, 4);
  const es_tdesc *ints[] = {&xi, &s4};
  ES_EXPECT_RC(eval(ES_OP_LayerNormalization, 17, NULL, 0, 2, ints, data, &out, &od),
               ES_EMODEL);
}

/* ==========================================================================
 * MeanVarianceNormalization
 * ======================================================================== */

static void test_mvn(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  for (int iter = 0; iter < 120; iter++) {
    int rank = iter % 3 == 0 ? 4 : (int)rnd(&seed, 1, 4);
    int64_t dims[4];
    for (int i = 0; i < rank; i++)
      dims[i] = rnd(&seed, 1, 5);
    int red[4] = {0};
    int64_t axes[4];
    size_t na = 0;
    if (iter % 3 == 0) { /* the default: N, H, W */
      red[0] = red[2] = red[3] = 1;
    } else {
      for (int i = 0; i < rank; i++)
        if (rnd(&seed, 0, 1) || (i == rank - 1 && na == 0)) {
          red[i] = 1;
          axes[na++] = i;
        }
    }
    es_tdesc x = kh_td(ES_DTYPE_FLOAT, rank, dims);
    float *xd = rand_f32(&seed, x.count, -3.0f, 7.0f);
    es_attr a[] = {{.name = "axes", .type = ES_ATTR_INTS, .n = na, .ints = axes}};
    const es_tdesc *in[] = {&x};
    const void *data[] = {xd};
    es_tdesc out;
    void *od;
    ES_CHECK_RC(eval_n(ES_OP_MeanVarianceNormalization, 13, a, na ? 1 : 0, 1, in, data,
                       iter & 1, 1, &out, &od));
    /* reference: group elements by their kept coordinates */
    size_t n = x.count;
    double *sum = calloc(n, sizeof *sum), *sq = calloc(n, sizeof *sq), *cnt = calloc(n, 8);
    size_t *key = malloc(n * sizeof *key);
    for (size_t i = 0; i < n; i++) {
      size_t rem = i, k = 0, st = 1;
      for (int d = rank - 1; d >= 0; d--) {
        size_t c = rem % (size_t)dims[d];
        rem /= (size_t)dims[d];
        if (!red[d]) {
          k += c * st;
          st *= (size_t)dims[d];
        }
      }
      key[i] = k;
      sum[k] += xd[i];
      cnt[k] += 1;
    }
    for (size_t i = 0; i < n; i++) {
      double m = sum[key[i]] / cnt[key[i]];
      sq[key[i]] += (xd[i] - m) * (xd[i] - m);
    }
    double *want = malloc(n * sizeof *want);
    for (size_t i = 0; i < n; i++) {
      double m = sum[key[i]] / cnt[key[i]], sd = sqrt(sq[key[i]] / cnt[key[i]]);
      want[i] = (xd[i] - m) / (sd + 1e-9);
    }
    char what[64];
    snprintf(what, sizeof what, "MeanVarianceNormalization iteration %d", iter);
    /* one-element groups are 0 / 1e-9 = 0 */
    expect_close(od, want, n, 2e-4, what);
    free(sum);
    free(sq);
    free(cnt);
    free(key);
    free(want);
    free(xd);
    es_mem_free(od);
  }
  /* the default axes need rank 4 */
  float buf[8] = {0};
  es_tdesc x3 = KH_TD(ES_DTYPE_FLOAT, 2, 2, 2);
  const es_tdesc *in[] = {&x3};
  const void *data[] = {buf};
  es_tdesc out;
  void *od = NULL;
  ES_EXPECT_RC(eval(ES_OP_MeanVarianceNormalization, 13, NULL, 0, 1, in, data, &out, &od),
               ES_EMODEL);
  es_attr dup[] = {KH_INTS("axes", 0, -3)};
  ES_EXPECT_RC(eval(ES_OP_MeanVarianceNormalization, 13, dup, 1, 1, in, data, &out, &od),
               ES_EMODEL);
}

/* ==========================================================================
 * LRN, LpNormalization
 * ======================================================================== */

static void test_lrn(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  for (int iter = 0; iter < 80; iter++) {
    int rank = (int)rnd(&seed, 3, 5);
    int64_t dims[5];
    for (int i = 0; i < rank; i++)
      dims[i] = rnd(&seed, 1, i == 1 ? 9 : 4);
    int64_t size = rnd(&seed, 1, 6);
    float alpha = 0.1f, beta = iter % 2 ? 0.75f : 0.5f, bias = iter % 3 ? 1.0f : 2.0f;
    es_tdesc x = kh_td(ES_DTYPE_FLOAT, rank, dims);
    float *xd = rand_f32(&seed, x.count, -3.0f, 3.0f);
    es_attr a[] = {KH_INT("size", size), KH_FLOAT("alpha", alpha), KH_FLOAT("beta", beta),
                   KH_FLOAT("bias", bias)};
    const es_tdesc *in[] = {&x};
    const void *data[] = {xd};
    es_tdesc out;
    void *od;
    ES_CHECK_RC(eval(ES_OP_LRN, 13, a, 4, 1, in, data, &out, &od));
    int64_t c = dims[1], plane = (int64_t)x.count / (dims[0] * c);
    double *want = malloc(x.count * sizeof *want);
    for (int64_t b = 0; b < dims[0]; b++)
      for (int64_t ch = 0; ch < c; ch++)
        for (int64_t j = 0; j < plane; j++) {
          double s = 0;
          int64_t lo = ch - (size - 1) / 2, hi = ch + size / 2; /* ceil((size-1)/2) */
          for (int64_t cc = lo; cc <= hi; cc++)
            if (cc >= 0 && cc < c) {
              double v = xd[(b * c + cc) * plane + j];
              s += v * v;
            }
          size_t e = (size_t)((b * c + ch) * plane + j);
          want[e] = xd[e] / pow(bias + alpha / (double)size * s, beta);
        }
    char what[64];
    snprintf(what, sizeof what, "LRN iteration %d (size %lld)", iter, (long long)size);
    expect_close(od, want, x.count, 1e-5, what);
    free(want);
    free(xd);
    es_mem_free(od);
  }
  float buf[8] = {0};
  es_tdesc x = KH_TD(ES_DTYPE_FLOAT, 1, 2, 2, 2), x2 = KH_TD(ES_DTYPE_FLOAT, 2, 2);
  const es_tdesc *in[] = {&x}, *in2[] = {&x2};
  const void *data[] = {buf};
  es_tdesc out;
  void *od = NULL;
  ES_EXPECT_RC(eval(ES_OP_LRN, 13, NULL, 0, 1, in, data, &out, &od), ES_EMODEL);
  es_attr s0[] = {KH_INT("size", 0)}, s3[] = {KH_INT("size", 3)};
  ES_EXPECT_RC(eval(ES_OP_LRN, 13, s0, 1, 1, in, data, &out, &od), ES_EMODEL);
  ES_EXPECT_RC(eval(ES_OP_LRN, 13, s3, 1, 1, in2, data, &out, &od), ES_EMODEL);
}

static void test_lp_normalization(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  for (int iter = 0; iter < 100; iter++) {
    int rank = (int)rnd(&seed, 1, 4);
    int64_t dims[4];
    for (int i = 0; i < rank; i++)
      dims[i] = rnd(&seed, 1, 6);
    int ax = (int)rnd(&seed, 0, rank - 1), pn = (int)rnd(&seed, 1, 2);
    es_tdesc x = kh_td(ES_DTYPE_FLOAT, rank, dims);
    float *xd = rand_f32(&seed, x.count, 0.1f, 3.0f);
    es_attr a[] = {KH_INT("axis", ax), KH_INT("p", pn)};
    const es_tdesc *in[] = {&x};
    const void *data[] = {xd};
    es_tdesc out;
    void *od;
    ES_CHECK_RC(eval_n(ES_OP_LpNormalization, 1, a, 2, 1, in, data, iter & 1, 1, &out, &od));
    int64_t outer = 1, inner = 1, n = dims[ax];
    for (int i = 0; i < rank; i++)
      if (i < ax)
        outer *= dims[i];
      else if (i > ax)
        inner *= dims[i];
    double *want = malloc(x.count * sizeof *want);
    for (int64_t o = 0; o < outer; o++)
      for (int64_t i = 0; i < inner; i++) {
        double s = 0;
        for (int64_t j = 0; j < n; j++) {
          double v = xd[(o * n + j) * inner + i];
          s += pn == 1 ? fabs(v) : v * v;
        }
        s = pn == 1 ? s : sqrt(s);
        for (int64_t j = 0; j < n; j++)
          want[(o * n + j) * inner + i] = xd[(o * n + j) * inner + i] / s;
      }
    char what[64];
    snprintf(what, sizeof what, "LpNormalization iteration %d", iter);
    expect_close(od, want, x.count, 1e-5, what);
    free(want);
    free(xd);
    es_mem_free(od);
  }
  float buf[4] = {0};
  es_tdesc x = KH_TD(ES_DTYPE_FLOAT, 4);
  const es_tdesc *in[] = {&x};
  const void *data[] = {buf};
  es_tdesc out;
  void *od = NULL;
  es_attr p3[] = {KH_INT("p", 3)};
  ES_EXPECT_RC(eval(ES_OP_LpNormalization, 1, p3, 1, 1, in, data, &out, &od), ES_EMODEL);
}

/* ==========================================================================
 * GlobalMaxPool, GlobalLpPool
 * ======================================================================== */

/* The plain result against a reference, then the NHWC result against the
 * plain one. */
static void test_global_pools(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  int64_t shapes[][4] = {{2, 3, 4, 5}, {1, 17, 8, 8}, {1, 9, 13, 11}, {2, 5, 1, 1}};
  struct {
    es_op op;
    int64_t p;
  } kinds[] = {{ES_OP_GlobalMaxPool, 0},
               {ES_OP_GlobalLpPool, 1},
               {ES_OP_GlobalLpPool, 2},
               {ES_OP_GlobalLpPool, 3}};
  for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++)
    for (size_t kd = 0; kd < sizeof kinds / sizeof kinds[0]; kd++) {
      es_tdesc x = kh_td(ES_DTYPE_FLOAT, 4, shapes[t]), xn = kh_as_nhwc(x);
      float *xd = rand_f32(&seed, x.count, -4.0f, 4.0f);
      void *xnd = kh_reorder4(xd, &x, 1);
      es_attr a[] = {KH_INT("p", kinds[kd].p)};
      int na = kinds[kd].op == ES_OP_GlobalLpPool ? 1 : 0;
      const es_tdesc *in[] = {&x}, *inn[] = {&xn};
      const void *data[] = {xd}, *datan[] = {xnd};
      es_tdesc out, outn;
      void *od, *odn;
      ES_CHECK_RC(eval(kinds[kd].op, 2, a, na, 1, in, data, &out, &od));
      assert_int_equal(out.rank, 4);
      assert_int_equal(out.dims[2] * out.dims[3], 1);
      int64_t planes = shapes[t][0] * shapes[t][1], size = shapes[t][2] * shapes[t][3];
      double *want = malloc((size_t)planes * sizeof *want);
      for (int64_t c = 0; c < planes; c++) {
        double m = -INFINITY, s = 0;
        for (int64_t i = 0; i < size; i++) {
          double v = xd[c * size + i];
          m = v > m ? v : m;
          s += pow(fabs(v), (double)kinds[kd].p);
        }
        want[c] = kinds[kd].op == ES_OP_GlobalMaxPool ? m : pow(s, 1.0 / (double)kinds[kd].p);
      }
      char what[80];
      snprintf(what, sizeof what, "%s p %lld shape %zu", es__op_name(kinds[kd].op),
               (long long)kinds[kd].p, t);
      expect_close(od, want, (size_t)planes, 1e-5, what);
      es_knode node = kh_knode(kinds[kd].op, a, na);
      kh_opts o = {.opset = 2, .dyn = 1};
      ES_CHECK_RC(kh_eval_with(&node, &o, 1, inn, datan, 1, &outn, &odn));
      assert_int_equal(outn.layout, ES_LAYOUT_NHWC); /* same bytes as plain [N, C, 1, 1] */
      assert_true(es__tdesc_same_shape(&out, &outn));
      const float *g = odn, *w = od;
      for (int64_t i = 0; i < planes; i++)
        if (!(fabsf(g[i] - w[i]) <= 1e-5f * (1 + fabsf(w[i]))))
          fail_msg("%s NHWC: [%lld] = %.9g, plain %.9g", what, (long long)i, (double)g[i],
                   (double)w[i]);
      free(want);
      es_mem_free(od);
      es_mem_free(odn);
      es_mem_free(xnd);
      free(xd);
    }
  float buf[8] = {0};
  es_tdesc x = KH_TD(ES_DTYPE_FLOAT, 1, 2, 2, 2), x2 = KH_TD(ES_DTYPE_FLOAT, 2, 4);
  const es_tdesc *in[] = {&x}, *in2[] = {&x2};
  const void *data[] = {buf};
  es_tdesc out;
  void *od = NULL;
  es_attr p0[] = {KH_INT("p", 0)};
  ES_EXPECT_RC(eval(ES_OP_GlobalLpPool, 2, p0, 1, 1, in, data, &out, &od), ES_EMODEL);
  ES_EXPECT_RC(eval(ES_OP_GlobalMaxPool, 1, NULL, 0, 1, in2, data, &out, &od), ES_EMODEL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_instance_group_norm), cmocka_unit_test(test_group_norm_errors),
      cmocka_unit_test(test_layer_normalization), cmocka_unit_test(test_layer_normalization_errors),
      cmocka_unit_test(test_mvn),                 cmocka_unit_test(test_lrn),
      cmocka_unit_test(test_lp_normalization),    cmocka_unit_test(test_global_pools),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
