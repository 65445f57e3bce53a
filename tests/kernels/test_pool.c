/* Kernels of the pool, reduce, resize and norm families: MaxPool,
 * AveragePool, GlobalAveragePool, ReduceMean, Softmax, Resize and
 * BatchNormalization.
 *
 * Each op is checked on small hand-computed cases and, where the parameter
 * space is large (pooling, ReduceMean, Softmax, Resize), on random shapes
 * and attributes against a naive reference written here in double. Then
 * invalid nodes (bad ranks, shapes, dtypes and attribute values, inputs
 * that must be known while planning but are not) must fail with the right
 * code and never crash. eval() goes through es__kernel_eval; eval_ex() builds
 * the kernel instance itself to hide chosen inputs from planning or run an
 * op in place. Finally the layout-aware paths are fed NHWC inputs through a
 * hand-built instance (eval_nhwc) and must give the plain result in NHWC
 * order, or ask for the conversion they need. */
#include "es_test.h"

#include <math.h>
#include <string.h>

#include "kernels/kernel.h"
#include "model/graph.h"
#include "support/kernel_harness.h"

/* ==========================================================================
 * Harness
 * ======================================================================== */

/* Evaluates one node. dyn: bit i hides input i from planning (in_static
 * NULL); inplace: checks that infer allows out[0] to share in[0] and runs
 * that way. Outputs are the caller's (es_mem_free). */
static int eval_ex(es_op op, int64_t opset, const es_attr *attrs, int n_attr, int n_in,
                   const es_tdesc *const *in, const void *const *data, unsigned dyn,
                   int inplace, int n_out, es_tdesc *out, void **outd) {
  es_knode node = kh_knode(op, attrs, n_attr);
  if (!dyn && !inplace)
    return es__kernel_eval(&node, opset, n_in, in, data, n_out, out, outd);
  kh_opts o = {.opset = opset, .dyn = dyn, .inplace = inplace};
  return kh_eval_with(&node, &o, n_in, in, data, n_out, out, outd);
}

static int eval(es_op op, int64_t opset, const es_attr *attrs, int n_attr, int n_in,
                const es_tdesc *const *in, const void *const *data, es_tdesc *out, void **outd) {
  return eval_ex(op, opset, attrs, n_attr, n_in, in, data, 0, 0, 1, out, outd);
}

/* Expects rc for a one-input node (X only). */
static void expect_rc1(es_op op, int64_t opset, const es_attr *attrs, int n_attr, es_tdesc x,
                       int want) {
  float *buf = calloc(x.count ? x.count : 1, 8);
  const es_tdesc *in[] = {&x};
  const void *data[] = {buf};
  es_tdesc out;
  void *od = NULL;
  ES_EXPECT_RC(eval(op, opset, attrs, n_attr, 1, in, data, &out, &od), want);
  es_mem_free(od);
  free(buf);
}

static float *rand_f32(uint64_t *s, size_t n) {
  float *p = malloc((n ? n : 1) * sizeof *p);
  assert_non_null(p);
  kh_rand_f32(s, p, n, -4.0f, 4.0f);
  return p;
}

static int64_t rnd(uint64_t *s, int64_t lo, int64_t hi) {
  return lo + (int64_t)(es_test_rand(s) % (uint64_t)(hi - lo + 1));
}

static void expect_close(const float *got, const double *want, size_t n, double tol,
                         const char *what) {
  for (size_t i = 0; i < n; i++)
    if ((double)got[i] != want[i] && !(fabs((double)got[i] - want[i]) <= tol * (1 + fabs(want[i]))))
      fail_msg("%s: [%zu] = %.9g, expected %.9g", what, i, (double)got[i], want[i]);
}

/* ==========================================================================
 * Pooling
 * ======================================================================== */

/* A pool in the ONNX spec's terms, pads resolved. */
typedef struct pool_ref {
  int ns, avg, include_pad;
  int64_t n, c, in[3], k[3], s[3], d[3], pb[3], pe[3], out[3];
} pool_ref;

static void pool_reference(const pool_ref *r, const float *x, double *y) {
  int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1}, k[3] = {1, 1, 1}, s[3] = {1, 1, 1},
          d[3] = {1, 1, 1}, pb[3] = {0}, pe[3] = {0};
  for (int i = 0; i < r->ns; i++) {
    int a = 3 - r->ns + i;
    in[a] = r->in[i], out[a] = r->out[i], k[a] = r->k[i], s[a] = r->s[i], d[a] = r->d[i];
    pb[a] = r->pb[i], pe[a] = r->pe[i];
  }
  int64_t plane = in[0] * in[1] * in[2];
  for (int64_t p = 0; p < r->n * r->c; p++)
    for (int64_t o0 = 0; o0 < out[0]; o0++)
      for (int64_t o1 = 0; o1 < out[1]; o1++)
        for (int64_t o2 = 0; o2 < out[2]; o2++) {
          double best = -INFINITY, sum = 0;
          int64_t inside = 0, padded = 0;
          for (int64_t t0 = 0; t0 < k[0]; t0++)
            for (int64_t t1 = 0; t1 < k[1]; t1++)
              for (int64_t t2 = 0; t2 < k[2]; t2++) {
                int64_t i0 = o0 * s[0] - pb[0] + t0 * d[0];
                int64_t i1 = o1 * s[1] - pb[1] + t1 * d[1];
                int64_t i2 = o2 * s[2] - pb[2] + t2 * d[2];
                if (i0 >= -pb[0] && i0 < in[0] + pe[0] && i1 >= -pb[1] && i1 < in[1] + pe[1] &&
                    i2 >= -pb[2] && i2 < in[2] + pe[2])
                  padded++;
                if (i0 < 0 || i0 >= in[0] || i1 < 0 || i1 >= in[1] || i2 < 0 || i2 >= in[2])
                  continue;
                double v = x[p * plane + (i0 * in[1] + i1) * in[2] + i2];
                inside++;
                sum += v;
                best = v > best ? v : best;
              }
          int64_t cnt = r->include_pad ? padded : inside;
          *y++ = r->avg ? (cnt ? sum / (double)cnt : 0) : best;
        }
}

/* Random 1-D, 2-D and 3-D pools of every kind against the reference. */
static void test_pool_random(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  static const char *const autos[] = {"NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"};
  for (int iter = 0; iter < 400; iter++) {
    pool_ref r;
    memset(&r, 0, sizeof r);
    r.ns = (int)rnd(&seed, 1, 3);
    r.avg = (int)rnd(&seed, 0, 1);
    r.include_pad = r.avg ? (int)rnd(&seed, 0, 1) : 0;
    r.n = rnd(&seed, 1, 2);
    r.c = rnd(&seed, 1, 3);
    int ap = (int)rnd(&seed, 0, 5);
    ap = ap > 3 ? 0 : ap; /* NOTSET most often */
    int ceil_mode = (int)rnd(&seed, 0, 1);
    int64_t dims[5] = {r.n, r.c}, pads[6];
    int bad = 0;
    for (int i = 0; i < r.ns; i++) {
      r.in[i] = rnd(&seed, 1, r.ns == 3 ? 6 : 9);
      r.k[i] = rnd(&seed, 1, 4);
      r.s[i] = rnd(&seed, 1, 3);
      r.d[i] = rnd(&seed, 1, 2);
      int64_t ext = (r.k[i] - 1) * r.d[i] + 1;
      pads[i] = rnd(&seed, 0, ext - 1);
      pads[i + r.ns] = rnd(&seed, 0, ext - 1);
      dims[2 + i] = r.in[i];
      if (ap == 1 || ap == 2) {
        r.out[i] = (r.in[i] + r.s[i] - 1) / r.s[i];
        int64_t total = (r.out[i] - 1) * r.s[i] + ext - r.in[i];
        total = total < 0 ? 0 : total;
        r.pb[i] = ap == 1 ? total / 2 : total - total / 2;
        r.pe[i] = total - r.pb[i];
        continue;
      }
      r.pb[i] = ap == 3 ? 0 : pads[i];
      r.pe[i] = ap == 3 ? 0 : pads[i + r.ns];
      int64_t span = r.in[i] + r.pb[i] + r.pe[i] - ext;
      if (span < 0) {
        bad = 1;
        continue;
      }
      if (ceil_mode && ap == 0) {
        r.out[i] = (span + r.s[i] - 1) / r.s[i] + 1;
        if ((r.out[i] - 1) * r.s[i] >= r.in[i] + r.pb[i])
          r.out[i]--;
      } else {
        r.out[i] = span / r.s[i] + 1;
      }
    }
    es_attr attrs[8];
    int na = 0;
    es_attr ints[5] = {
        {.name = "kernel_shape", .type = ES_ATTR_INTS, .n = (size_t)r.ns, .ints = r.k},
        {.name = "strides", .type = ES_ATTR_INTS, .n = (size_t)r.ns, .ints = r.s},
        {.name = "dilations", .type = ES_ATTR_INTS, .n = (size_t)r.ns, .ints = r.d},
        {.name = "pads", .type = ES_ATTR_INTS, .n = 2 * (size_t)r.ns, .ints = pads},
    };
    for (int i = 0; i < 4; i++)
      attrs[na++] = ints[i];
    attrs[na++] = KH_STR("auto_pad", autos[ap]);
    attrs[na++] = KH_INT("ceil_mode", ceil_mode);
    if (r.avg)
      attrs[na++] = KH_INT("count_include_pad", r.include_pad);
    es_tdesc x = kh_td(ES_DTYPE_FLOAT, 2 + r.ns, dims);
    float *xd = rand_f32(&seed, x.count);
    const es_tdesc *in[] = {&x};
    const void *data[] = {xd};
    es_tdesc out;
    void *od = NULL;
    es_op op = r.avg ? ES_OP_AveragePool : ES_OP_MaxPool;
    if (bad) {
      ES_EXPECT_RC(eval(op, 12, attrs, na, 1, in, data, &out, &od), ES_EMODEL);
    } else {
      ES_CHECK_RC(eval(op, 12, attrs, na, 1, in, data, &out, &od));
      assert_int_equal(out.rank, 2 + r.ns);
      for (int i = 0; i < r.ns; i++)
        assert_int_equal(out.dims[2 + i], r.out[i]);
      double *want = malloc(out.count * sizeof *want);
      pool_reference(&r, xd, want);
      char what[64];
      snprintf(what, sizeof what, "pool iteration %d", iter);
      expect_close(od, want, out.count, 1e-5, what);
      free(want);
    }
    es_mem_free(od);
    free(xd);
  }
}

static void test_maxpool_hand(void **state) {
  (void)state;
  /* 1x1x4x4, 2x2 stride 2: the max of each quadrant */
  float x[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  es_tdesc xd = KH_TD(ES_DTYPE_FLOAT, 1, 1, 4, 4);
  const es_tdesc *in[] = {&xd};
  const void *data[] = {x};
  es_attr a[] = {KH_INTS("kernel_shape", 2, 2), KH_INTS("strides", 2, 2)};
  es_tdesc out;
  void *od;
  ES_CHECK_RC(eval(ES_OP_MaxPool, 12, a, KH_LEN(a), 1, in, data, &out, &od));
  float want[4] = {6, 8, 14, 16};
  assert_memory_equal(od, want, sizeof want);
  es_mem_free(od);

  /* ceil_mode: 3x3 stride 2 on 4x4 gives 2x2, the last window clipped */
  es_attr c[] = {KH_INTS("kernel_shape", 3, 3), KH_INTS("strides", 2, 2), KH_INT("ceil_mode", 1)};
  ES_CHECK_RC(eval(ES_OP_MaxPool, 12, c, KH_LEN(c), 1, in, data, &out, &od));
  assert_int_equal(out.dims[2], 2);
  float want_c[4] = {11, 12, 15, 16};
  assert_memory_equal(od, want_c, sizeof want_c);
  es_mem_free(od);
}

static void test_maxpool_int8(void **state) {
  (void)state;
  uint8_t x[9] = {1, 200, 3, 4, 5, 6, 255, 8, 0};
  es_tdesc xd = KH_TD(ES_DTYPE_UINT8, 1, 1, 3, 3);
  const es_tdesc *in[] = {&xd};
  const void *data[] = {x};
  es_attr a[] = {KH_INTS("kernel_shape", 2, 2), KH_INTS("pads", 1, 1, 0, 0)};
  es_tdesc out;
  void *od;
  ES_CHECK_RC(eval(ES_OP_MaxPool, 12, a, KH_LEN(a), 1, in, data, &out, &od));
  assert_int_equal(out.dtype, ES_DTYPE_UINT8);
  uint8_t want[9] = {1, 200, 200, 4, 200, 200, 255, 255, 8};
  assert_memory_equal(od, want, sizeof want);
  es_mem_free(od);

  int8_t y[4] = {-5, -128, -7, -6};
  es_tdesc yd = KH_TD(ES_DTYPE_INT8, 1, 1, 4);
  const es_tdesc *in2[] = {&yd};
  const void *data2[] = {y};
  es_attr b[] = {KH_INTS("kernel_shape", 2)};
  ES_CHECK_RC(eval(ES_OP_MaxPool, 12, b, KH_LEN(b), 1, in2, data2, &out, &od));
  int8_t want2[3] = {-5, -7, -6};
  assert_memory_equal(od, want2, sizeof want2);
  es_mem_free(od);
}

static void test_maxpool_indices(void **state) {
  (void)state;
  /* two planes (N = 2) so the plane offset shows in the indices */
  float x[32];
  for (int i = 0; i < 32; i++)
    x[i] = (float)((i * 7) % 32);
  es_tdesc xd = KH_TD(ES_DTYPE_FLOAT, 2, 1, 4, 4);
  const es_tdesc *in[] = {&xd};
  const void *data[] = {x};
  for (int order = 0; order < 2; order++) {
    es_attr a[] = {KH_INTS("kernel_shape", 2, 2), KH_INTS("strides", 2, 2),
                   KH_INT("storage_order", order)};
    es_tdesc out[2];
    void *od[2];
    ES_CHECK_RC(eval_ex(ES_OP_MaxPool, 12, a, KH_LEN(a), 1, in, data, 0, 0, 2, out, od));
    assert_int_equal(out[1].dtype, ES_DTYPE_INT64);
    const float *y = od[0];
    const int64_t *ix = od[1];
    for (int p = 0; p < 2; p++)
      for (int oh = 0; oh < 2; oh++)
        for (int ow = 0; ow < 2; ow++) {
          float best = -1;
          int64_t bi = 0;
          for (int kh = 0; kh < 2; kh++)
            for (int kw = 0; kw < 2; kw++) {
              int h = oh * 2 + kh, w = ow * 2 + kw;
              if (x[p * 16 + h * 4 + w] > best) {
                best = x[p * 16 + h * 4 + w];
                bi = p * 16 + (order ? w * 4 + h : h * 4 + w);
              }
            }
          int o = p * 4 + oh * 2 + ow;
          assert_true(y[o] == best);
          assert_int_equal(ix[o], bi);
        }
    es_mem_free(od[0]);
    es_mem_free(od[1]);
  }
}

static void test_avgpool_hand(void **state) {
  (void)state;
  float x[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  es_tdesc xd = KH_TD(ES_DTYPE_FLOAT, 1, 1, 3, 3);
  const es_tdesc *in[] = {&xd};
  const void *data[] = {x};
  es_tdesc out;
  void *od;
  /* 3x3 with pads 1: corner averages over 4 valid cells, or over 9 */
  es_attr a[] = {KH_INTS("kernel_shape", 3, 3), KH_INTS("pads", 1, 1, 1, 1)};
  ES_CHECK_RC(eval(ES_OP_AveragePool, 11, a, KH_LEN(a), 1, in, data, &out, &od));
  assert_true(fabsf(((float *)od)[0] - 3.0f) < 1e-6f);  /* (1+2+4+5)/4 */
  assert_true(fabsf(((float *)od)[4] - 5.0f) < 1e-6f);
  es_mem_free(od);
  es_attr b[] = {KH_INTS("kernel_shape", 3, 3), KH_INTS("pads", 1, 1, 1, 1),
                 KH_INT("count_include_pad", 1)};
  ES_CHECK_RC(eval(ES_OP_AveragePool, 11, b, KH_LEN(b), 1, in, data, &out, &od));
  assert_true(fabsf(((float *)od)[0] - 12.0f / 9.0f) < 1e-6f);
  es_mem_free(od);
}

static void test_global_avgpool(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  int64_t shapes[][5] = {{2, 3, 4, 5, 0}, {1, 2, 7, 0, 0}, {1, 2, 3, 2, 2}, {1, 1, 19, 1, 0}};
  for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++) {
    int rank = 0;
    while (rank < 5 && shapes[t][rank])
      rank++;
    es_tdesc xd = kh_td(ES_DTYPE_FLOAT, rank, shapes[t]);
    float *x = rand_f32(&seed, xd.count);
    const es_tdesc *in[] = {&xd};
    const void *data[] = {x};
    es_tdesc out;
    void *od;
    ES_CHECK_RC(eval(ES_OP_GlobalAveragePool, 12, NULL, 0, 1, in, data, &out, &od));
    assert_int_equal(out.rank, rank);
    int64_t planes = shapes[t][0] * shapes[t][1], size = (int64_t)xd.count / planes;
    double *want = malloc((size_t)planes * sizeof *want);
    for (int64_t p = 0; p < planes; p++) {
      double s = 0;
      for (int64_t i = 0; i < size; i++)
        s += x[p * size + i];
      want[p] = s / (double)size;
      assert_int_equal(out.dims[2], 1);
    }
    expect_close(od, want, (size_t)planes, 1e-5, "GlobalAveragePool");
    free(want);
    free(x);
    es_mem_free(od);
  }
  expect_rc1(ES_OP_GlobalAveragePool, 12, NULL, 0, KH_TD(ES_DTYPE_FLOAT, 2, 3), ES_EMODEL);
  expect_rc1(ES_OP_GlobalAveragePool, 12, NULL, 0, KH_TD(ES_DTYPE_INT64, 1, 2, 3), ES_EMODEL);
}

static void test_pool_errors(void **state) {
  (void)state;
  es_tdesc x4 = KH_TD(ES_DTYPE_FLOAT, 1, 1, 4, 4);
  es_attr ok[] = {KH_INTS("kernel_shape", 2, 2)};
  expect_rc1(ES_OP_MaxPool, 12, ok, KH_LEN(ok), KH_TD(ES_DTYPE_FLOAT, 4, 4), ES_EMODEL);
  expect_rc1(ES_OP_MaxPool, 12, NULL, 0, x4, ES_EMODEL); /* no kernel_shape */
  expect_rc1(ES_OP_MaxPool, 12, ok, KH_LEN(ok), KH_TD(ES_DTYPE_INT32, 1, 1, 4, 4), ES_EMODEL);
  expect_rc1(ES_OP_AveragePool, 12, ok, KH_LEN(ok), KH_TD(ES_DTYPE_UINT8, 1, 1, 4, 4), ES_EMODEL);
  expect_rc1(ES_OP_MaxPool, 12, ok, KH_LEN(ok), KH_TD(ES_DTYPE_FLOAT, 1, 1, 1, 1, 1, 1),
             ES_ENOTSUP);
  es_attr k1[] = {KH_INTS("kernel_shape", 2)};
  expect_rc1(ES_OP_MaxPool, 12, k1, KH_LEN(k1), x4, ES_EMODEL);
  es_attr k0[] = {KH_INTS("kernel_shape", 0, 2)};
  expect_rc1(ES_OP_MaxPool, 12, k0, KH_LEN(k0), x4, ES_EMODEL);
  es_attr kint[] = {KH_INT("kernel_shape", 2)};
  expect_rc1(ES_OP_MaxPool, 12, kint, KH_LEN(kint), x4, ES_EMODEL);
  es_attr big[] = {KH_INTS("kernel_shape", 5, 2)};
  expect_rc1(ES_OP_MaxPool, 12, big, KH_LEN(big), x4, ES_EMODEL);
  es_attr s0[] = {KH_INTS("kernel_shape", 2, 2), KH_INTS("strides", 1, 0)};
  expect_rc1(ES_OP_MaxPool, 12, s0, KH_LEN(s0), x4, ES_EMODEL);
  es_attr d0[] = {KH_INTS("kernel_shape", 2, 2), KH_INTS("dilations", 0, 1)};
  expect_rc1(ES_OP_MaxPool, 12, d0, KH_LEN(d0), x4, ES_EMODEL);
  es_attr dhuge[] = {KH_INTS("kernel_shape", 2, 2), KH_INTS("dilations", 1, INT64_MAX)};
  expect_rc1(ES_OP_MaxPool, 12, dhuge, KH_LEN(dhuge), x4, ES_EMODEL);
  es_attr pneg[] = {KH_INTS("kernel_shape", 2, 2), KH_INTS("pads", 0, -1, 0, 0)};
  expect_rc1(ES_OP_MaxPool, 12, pneg, KH_LEN(pneg), x4, ES_EMODEL);
  es_attr plen[] = {KH_INTS("kernel_shape", 2, 2), KH_INTS("pads", 1, 1)};
  expect_rc1(ES_OP_MaxPool, 12, plen, KH_LEN(plen), x4, ES_EMODEL);
  es_attr phuge[] = {KH_INTS("kernel_shape", 2, 2), KH_INTS("pads", 0, 0, INT64_MAX, 0)};
  expect_rc1(ES_OP_MaxPool, 12, phuge, KH_LEN(phuge), x4, ES_EMODEL);
  es_attr apad[] = {KH_INTS("kernel_shape", 2, 2), KH_STR("auto_pad", "SAME")};
  expect_rc1(ES_OP_MaxPool, 12, apad, KH_LEN(apad), x4, ES_EMODEL);
  es_attr cm[] = {KH_INTS("kernel_shape", 2, 2), KH_INT("ceil_mode", 2)};
  expect_rc1(ES_OP_MaxPool, 12, cm, KH_LEN(cm), x4, ES_EMODEL);
  es_attr so[] = {KH_INTS("kernel_shape", 2, 2), KH_INT("storage_order", 3)};
  expect_rc1(ES_OP_MaxPool, 12, so, KH_LEN(so), x4, ES_EMODEL);
  es_attr cip[] = {KH_INTS("kernel_shape", 2, 2), KH_INT("count_include_pad", -1)};
  expect_rc1(ES_OP_AveragePool, 12, cip, KH_LEN(cip), x4, ES_EMODEL);
  es_attr valid[] = {KH_INTS("kernel_shape", 5, 5), KH_STR("auto_pad", "VALID"),
                     KH_INTS("pads", 2, 2, 2, 2)};
  expect_rc1(ES_OP_MaxPool, 12, valid, KH_LEN(valid), x4, ES_EMODEL);
}

/* ==========================================================================
 * ReduceMean
 * ======================================================================== */

static void rmean_reference(const es_tdesc *x, const float *xd, const int *red, double *y,
                            size_t ycount) {
  double *cnt = calloc(ycount, sizeof *cnt);
  for (size_t i = 0; i < ycount; i++)
    y[i] = 0;
  for (size_t i = 0; i < x->count; i++) {
    size_t rem = i, o = 0, ostride = 1;
    for (int a = x->rank - 1; a >= 0; a--) {
      size_t c = rem % (size_t)x->dims[a];
      rem /= (size_t)x->dims[a];
      if (!red[a]) {
        o += c * ostride;
        ostride *= (size_t)x->dims[a];
      }
    }
    y[o] += xd[i];
    cnt[o] += 1;
  }
  for (size_t i = 0; i < ycount; i++)
    y[i] /= cnt[i];
  free(cnt);
}

static void test_reduce_mean_random(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  for (int iter = 0; iter < 300; iter++) {
    int rank = (int)rnd(&seed, 1, 5);
    int64_t dims[5];
    for (int i = 0; i < rank; i++)
      dims[i] = rnd(&seed, 1, 5);
    int red[5] = {0};
    int64_t axes[5];
    size_t na = 0;
    for (int i = 0; i < rank; i++)
      if (rnd(&seed, 0, 2) == 0) {
        red[i] = 1;
        axes[na++] = rnd(&seed, 0, 1) ? i : i - rank;
      }
    if (iter % 7 == 0) { /* the LayerNorm pattern: last axis only */
      memset(red, 0, sizeof red);
      red[rank - 1] = 1;
      axes[0] = -1;
      na = 1;
    }
    if (na == 0)
      for (int i = 0; i < rank; i++)
        red[i] = 1;
    int keep = (int)rnd(&seed, 0, 1);
    es_attr attrs[2] = {KH_INT("keepdims", keep),
                        {.name = "axes", .type = ES_ATTR_INTS, .n = na, .ints = axes}};
    es_tdesc x = kh_td(ES_DTYPE_FLOAT, rank, dims);
    float *xd = rand_f32(&seed, x.count);
    const es_tdesc *in[] = {&x};
    const void *data[] = {xd};
    es_tdesc out;
    void *od;
    ES_CHECK_RC(eval(ES_OP_ReduceMean, 13, attrs, na ? 2 : 1, 1, in, data, &out, &od));
    int orank = 0;
    for (int i = 0; i < rank; i++)
      if (!red[i] || keep)
        assert_int_equal(out.dims[orank++], red[i] ? 1 : dims[i]);
    assert_int_equal(out.rank, orank);
    double *want = malloc(out.count * sizeof *want);
    rmean_reference(&x, xd, red, want, out.count);
    expect_close(od, want, out.count, 1e-5, "ReduceMean");
    free(want);
    free(xd);
    es_mem_free(od);
  }
}

static void test_reduce_mean_forms(void **state) {
  (void)state;
  float x[6] = {1, 2, 3, 4, 5, 6};
  es_tdesc xd = KH_TD(ES_DTYPE_FLOAT, 2, 3);
  es_tdesc out;
  void *od;
  /* opset 18: axes as an input, and noop_with_empty_axes */
  int64_t ax[1] = {0};
  es_tdesc ad = KH_TD(ES_DTYPE_INT64, 1);
  const es_tdesc *in[] = {&xd, &ad};
  const void *data[] = {x, ax};
  es_attr k0[] = {KH_INT("keepdims", 0)};
  ES_CHECK_RC(eval(ES_OP_ReduceMean, 18, k0, KH_LEN(k0), 2, in, data, &out, &od));
  assert_int_equal(out.rank, 1);
  float want[3] = {2.5f, 3.5f, 4.5f};
  assert_memory_equal(od, want, sizeof want);
  es_mem_free(od);
  ES_EXPECT_RC(eval_ex(ES_OP_ReduceMean, 18, k0, KH_LEN(k0), 2, in, data, 2, 0, 1, &out, &od),
               ES_ENOTSUP);
  es_attr noop[] = {KH_INT("noop_with_empty_axes", 1)};
  ES_CHECK_RC(eval(ES_OP_ReduceMean, 18, noop, KH_LEN(noop), 1, in, data, &out, &od));
  assert_memory_equal(od, x, sizeof x);
  es_mem_free(od);
  /* reduce all to a scalar */
  ES_CHECK_RC(eval(ES_OP_ReduceMean, 13, k0, KH_LEN(k0), 1, in, data, &out, &od));
  assert_int_equal(out.rank, 0);
  assert_true(fabsf(*(float *)od - 3.5f) < 1e-6f);
  es_mem_free(od);
}

static void test_reduce_mean_errors(void **state) {
  (void)state;
  es_tdesc x = KH_TD(ES_DTYPE_FLOAT, 2, 3, 4);
  es_attr dup[] = {KH_INTS("axes", 1, -2)};
  expect_rc1(ES_OP_ReduceMean, 13, dup, KH_LEN(dup), x, ES_EMODEL);
  es_attr range[] = {KH_INTS("axes", 3)};
  expect_rc1(ES_OP_ReduceMean, 13, range, KH_LEN(range), x, ES_EMODEL);
  es_attr many[] = {KH_INTS("axes", 0, 1, 2, 0)};
  expect_rc1(ES_OP_ReduceMean, 13, many, KH_LEN(many), x, ES_EMODEL);
  es_attr keep[] = {KH_INT("keepdims", 2)};
  expect_rc1(ES_OP_ReduceMean, 13, keep, KH_LEN(keep), x, ES_EMODEL);
  es_attr ftype[] = {KH_FLOAT("keepdims", 1)};
  expect_rc1(ES_OP_ReduceMean, 13, ftype, KH_LEN(ftype), x, ES_EMODEL);
  expect_rc1(ES_OP_ReduceMean, 13, NULL, 0, KH_TD(ES_DTYPE_BOOL, 2, 3), ES_EMODEL);
}

/* ==========================================================================
 * Softmax
 * ======================================================================== */

static void softmax_reference(const float *x, double *y, int64_t outer, int64_t n,
                              int64_t inner) {
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      const float *b = x + o * n * inner + i;
      double m = -INFINITY, s = 0;
      for (int64_t j = 0; j < n; j++)
        m = b[j * inner] > m ? b[j * inner] : m;
      for (int64_t j = 0; j < n; j++)
        s += exp(b[j * inner] - m);
      for (int64_t j = 0; j < n; j++)
        y[o * n * inner + j * inner + i] = exp(b[j * inner] - m) / s;
    }
}

static void test_softmax(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  int64_t dims[3] = {2, 3, 5};
  es_tdesc xd = kh_td(ES_DTYPE_FLOAT, 3, dims);
  float *x = rand_f32(&seed, xd.count);
  for (size_t i = 0; i < 5; i++)
    x[i] = 1000.0f + (float)i; /* large values: must subtract the max */
  const es_tdesc *in[] = {&xd};
  const void *data[] = {x};
  double want[30];
  struct {
    int64_t opset, axis;
    int has_axis;
    int64_t outer, n, inner;
  } cases[] = {
      {13, 0, 0, 6, 5, 1},  {13, 0, 1, 1, 2, 15}, {13, 1, 1, 2, 3, 5}, {13, 2, 1, 6, 5, 1},
      {13, -2, 1, 2, 3, 5}, {11, 0, 0, 2, 15, 1}, {11, 0, 1, 1, 30, 1}, {11, -1, 1, 6, 5, 1},
      {1, 2, 1, 6, 5, 1},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    es_attr a[] = {KH_INT("axis", cases[c].axis)};
    for (int inplace = 0; inplace < 2; inplace++) {
      es_tdesc out;
      void *od;
      ES_CHECK_RC(eval_ex(ES_OP_Softmax, cases[c].opset, a, cases[c].has_axis, 1, in, data, 0,
                          inplace, 1, &out, &od));
      softmax_reference(x, want, cases[c].outer, cases[c].n, cases[c].inner);
      char what[64];
      snprintf(what, sizeof what, "softmax case %zu", c);
      expect_close(od, want, 30, 1e-5, what);
      es_mem_free(od);
    }
  }
  free(x);

  /* the exp approximation over its whole range against libm */
  es_tdesc ld = KH_TD(ES_DTYPE_FLOAT, 2000, 2);
  float *lx = malloc(4000 * sizeof *lx);
  for (int i = 0; i < 2000; i++) {
    lx[2 * i] = 0.0f;
    lx[2 * i + 1] = -100.0f + (float)i * 0.06f; /* softmax([0, v]) = [1, e^v] / (1 + e^v) */
  }
  const es_tdesc *lin[] = {&ld};
  const void *ldata[] = {lx};
  es_tdesc out;
  void *od;
  ES_CHECK_RC(eval(ES_OP_Softmax, 13, NULL, 0, 1, lin, ldata, &out, &od));
  for (int i = 0; i < 2000; i++) {
    double v = lx[2 * i + 1], m = v > 0 ? v : 0;
    double e0 = exp(0 - m), e1 = exp(v - m);
    double w1 = e1 / (e0 + e1);
    float g1 = ((float *)od)[2 * i + 1];
    if (!(fabs(g1 - w1) <= 1e-6 * w1 + 1e-37))
      fail_msg("softmax([0, %g])[1] = %.9g, expected %.9g", v, (double)g1, w1);
  }
  es_mem_free(od);
  free(lx);
}

static void test_softmax_errors(void **state) {
  (void)state;
  es_tdesc x = KH_TD(ES_DTYPE_FLOAT, 2, 3);
  es_attr a2[] = {KH_INT("axis", 2)};
  expect_rc1(ES_OP_Softmax, 13, a2, KH_LEN(a2), x, ES_EMODEL);
  expect_rc1(ES_OP_Softmax, 11, a2, KH_LEN(a2), x, ES_EMODEL);
  es_attr am[] = {KH_INT("axis", -3)};
  expect_rc1(ES_OP_Softmax, 13, am, KH_LEN(am), x, ES_EMODEL);
  expect_rc1(ES_OP_Softmax, 13, NULL, 0, KH_TD(ES_DTYPE_INT32, 2, 3), ES_EMODEL);
  expect_rc1(ES_OP_Softmax, 13, NULL, 0, kh_td(ES_DTYPE_FLOAT, 0, NULL), ES_EMODEL);
}

/* ==========================================================================
 * Resize
 * ======================================================================== */

/* Resize with opset 11+ inputs (X, roi, scales, sizes); scales or sizes NULL
 * when omitted (given as empty tensors, as exporters do). */
static int resize_eval(int64_t opset, const es_attr *a, int na, const es_tdesc *xd, const float *x,
                       const float *scales, const int64_t *sizes, unsigned dyn, es_tdesc *out,
                       void **od) {
  int r = xd->rank;
  es_tdesc roi = KH_TD(ES_DTYPE_FLOAT, 0);
  int64_t n = r;
  es_tdesc sd = scales ? kh_td(ES_DTYPE_FLOAT, 1, &n) : KH_TD(ES_DTYPE_FLOAT, 0);
  es_tdesc zd = sizes ? kh_td(ES_DTYPE_INT64, 1, &n) : KH_TD(ES_DTYPE_INT64, 0);
  static const float none = 0;
  const es_tdesc *in[] = {xd, &roi, &sd, &zd};
  const void *data[] = {x, &none, scales ? (const void *)scales : &none,
                        sizes ? (const void *)sizes : &none};
  return eval_ex(ES_OP_Resize, opset, a, na, sizes ? 4 : 3, in, data, dyn, 0, 1, out, od);
}

/* Input coordinate by the spec (for the coordinate modes tests use). */
static double ref_coord(const char *ctm, int64_t o, int64_t in, int64_t out) {
  double s = (double)out / (double)in;
  if (!strcmp(ctm, "asymmetric"))
    return o / s;
  if (!strcmp(ctm, "align_corners"))
    return out == 1 ? 0 : (double)o * (double)(in - 1) / (double)(out - 1);
  return (o + 0.5) / s - 0.5;
}

/* N-linear interpolation at output point `o` of a row-major tensor. */
static double ref_nlinear(const char *ctm, const es_tdesc *x, const float *xd, const int64_t *odims,
                          const int64_t *o) {
  int r = x->rank;
  int64_t lo[8], hi[8];
  double t[8];
  for (int a = 0; a < r; a++) {
    double c = ref_coord(ctm, o[a], x->dims[a], odims[a]);
    c = c < 0 ? 0 : c > (double)(x->dims[a] - 1) ? (double)(x->dims[a] - 1) : c;
    lo[a] = (int64_t)floor(c);
    hi[a] = lo[a] + 1 < x->dims[a] ? lo[a] + 1 : lo[a];
    t[a] = c - (double)lo[a];
  }
  double v = 0;
  for (int corner = 0; corner < (1 << r); corner++) {
    double w = 1;
    int64_t off = 0;
    for (int a = 0; a < r; a++) {
      int up = (corner >> a) & 1;
      w *= up ? t[a] : 1 - t[a];
      off = off * x->dims[a] + (up ? hi[a] : lo[a]);
    }
    v += w * xd[off];
  }
  return v;
}

static void check_nlinear(uint64_t *seed, const char *ctm, int rank, const int64_t *idims,
                          const int64_t *odims) {
  es_tdesc xd = kh_td(ES_DTYPE_FLOAT, rank, idims);
  float *x = rand_f32(seed, xd.count);
  es_attr a[] = {KH_STR("mode", "linear"), KH_STR("coordinate_transformation_mode", ctm)};
  es_tdesc out;
  void *od;
  ES_CHECK_RC(resize_eval(11, a, KH_LEN(a), &xd, x, NULL, odims, 0, &out, &od));
  double *want = malloc(out.count * sizeof *want);
  int64_t o[8] = {0};
  for (size_t i = 0; i < out.count; i++) {
    want[i] = ref_nlinear(ctm, &xd, x, odims, o);
    for (int d = rank - 1; d >= 0; d--) {
      if (++o[d] < odims[d])
        break;
      o[d] = 0;
    }
  }
  char what[96];
  snprintf(what, sizeof what, "linear %s rank %d", ctm, rank);
  expect_close(od, want, out.count, 1e-5, what);
  free(want);
  free(x);
  es_mem_free(od);
}

static void test_resize_linear(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  /* PP-OCR det: bilinear half_pixel to given sizes, up and down */
  check_nlinear(&seed, "half_pixel", 4, (int64_t[]){1, 2, 5, 7}, (int64_t[]){1, 2, 10, 13});
  check_nlinear(&seed, "half_pixel", 4, (int64_t[]){2, 1, 8, 8}, (int64_t[]){2, 1, 3, 5});
  check_nlinear(&seed, "align_corners", 4, (int64_t[]){1, 3, 4, 6}, (int64_t[]){1, 3, 7, 11});
  check_nlinear(&seed, "asymmetric", 3, (int64_t[]){2, 4, 6}, (int64_t[]){2, 4, 9});
  /* N-linear through the separable path: trilinear, and the channel axis */
  check_nlinear(&seed, "half_pixel", 5, (int64_t[]){1, 1, 3, 4, 5}, (int64_t[]){1, 1, 5, 7, 9});
  check_nlinear(&seed, "align_corners", 4, (int64_t[]){1, 3, 4, 4}, (int64_t[]){1, 5, 4, 6});
  check_nlinear(&seed, "half_pixel", 1, (int64_t[]){6}, (int64_t[]){10});
}

static void test_resize_nearest(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  /* BlazeFace: nearest, asymmetric, floor, scales 2 */
  es_tdesc xd = KH_TD(ES_DTYPE_FLOAT, 1, 2, 3, 4);
  float *x = rand_f32(&seed, xd.count);
  es_attr a[] = {KH_STR("mode", "nearest"), KH_STR("coordinate_transformation_mode", "asymmetric"),
                 KH_STR("nearest_mode", "floor")};
  float sc[4] = {1, 1, 2, 2};
  es_tdesc out;
  void *od;
  ES_CHECK_RC(resize_eval(12, a, KH_LEN(a), &xd, x, sc, NULL, 0, &out, &od));
  assert_int_equal(out.dims[2], 6);
  assert_int_equal(out.dims[3], 8);
  const float *y = od;
  for (int c = 0; c < 2; c++)
    for (int h = 0; h < 6; h++)
      for (int w = 0; w < 8; w++)
        assert_true(y[(c * 6 + h) * 8 + w] == x[(c * 3 + h / 2) * 4 + w / 2]);
  es_mem_free(od);

  /* nearest on the channel axis goes through the separable path;
   * half_pixel + round_prefer_floor maps output c to input c / 2 */
  float sc2[4] = {1, 2, 1, 1};
  es_attr d[] = {KH_STR("mode", "nearest")};
  ES_CHECK_RC(resize_eval(13, d, KH_LEN(d), &xd, x, sc2, NULL, 0, &out, &od));
  assert_int_equal(out.dims[1], 4);
  y = od;
  for (int c = 0; c < 4; c++)
    for (int i = 0; i < 12; i++)
      assert_true(y[c * 12 + i] == x[(c / 2) * 12 + i]);
  es_mem_free(od);

  /* scales 1: a copy */
  float one[4] = {1, 1, 1, 1};
  ES_CHECK_RC(resize_eval(13, d, KH_LEN(d), &xd, x, one, NULL, 0, &out, &od));
  assert_memory_equal(od, x, xd.nbytes);
  es_mem_free(od);
  free(x);

  /* opset 10: (X, scales); truncation upscaling, ceiling downscaling */
  float x10[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  es_tdesc x10d = KH_TD(ES_DTYPE_FLOAT, 1, 1, 2, 4);
  es_tdesc s10d = KH_TD(ES_DTYPE_FLOAT, 4);
  float down[4] = {1, 1, 0.6f, 0.6f}, up[4] = {1, 1, 1, 1.5f};
  const es_tdesc *in10[] = {&x10d, &s10d};
  const void *data10[] = {x10, down};
  ES_CHECK_RC(eval(ES_OP_Resize, 10, d, KH_LEN(d), 2, in10, data10, &out, &od));
  assert_int_equal(out.count, 2);
  float want_down[2] = {1, 3};
  assert_memory_equal(od, want_down, sizeof want_down);
  es_mem_free(od);
  data10[1] = up;
  ES_CHECK_RC(eval(ES_OP_Resize, 10, d, KH_LEN(d), 2, in10, data10, &out, &od));
  float want_up[12] = {1, 1, 2, 3, 3, 4, 5, 5, 6, 7, 7, 8};
  assert_int_equal(out.dims[3], 6);
  assert_memory_equal(od, want_up, sizeof want_up);
  es_mem_free(od);
}

static void test_resize_errors(void **state) {
  (void)state;
  float x[16] = {0};
  es_tdesc xd = KH_TD(ES_DTYPE_FLOAT, 1, 1, 4, 4);
  float sc[4] = {1, 1, 2, 2};
  int64_t sz[4] = {1, 1, 8, 8};
  es_tdesc out;
  void *od = NULL;
  es_attr lin[] = {KH_STR("mode", "linear")};
  ES_EXPECT_RC(resize_eval(13, lin, 1, &xd, x, sc, sz, 0, &out, &od), ES_EMODEL);
  ES_EXPECT_RC(resize_eval(13, lin, 1, &xd, x, NULL, NULL, 0, &out, &od), ES_EMODEL);
  ES_EXPECT_RC(resize_eval(13, lin, 1, &xd, x, NULL, sz, 8, &out, &od), ES_ENOTSUP);
  ES_EXPECT_RC(resize_eval(13, lin, 1, &xd, x, sc, NULL, 4, &out, &od), ES_ENOTSUP);
  float bad_sc[4] = {1, 1, 0, 2};
  ES_EXPECT_RC(resize_eval(13, lin, 1, &xd, x, bad_sc, NULL, 0, &out, &od), ES_EMODEL);
  float nan_sc[4] = {1, 1, NAN, 2};
  ES_EXPECT_RC(resize_eval(13, lin, 1, &xd, x, nan_sc, NULL, 0, &out, &od), ES_EMODEL);
  float huge_sc[4] = {1, 1, 1e30f, 1e30f};
  ES_EXPECT_RC(resize_eval(13, lin, 1, &xd, x, huge_sc, NULL, 0, &out, &od), ES_EMODEL);
  int64_t neg_sz[4] = {1, 1, -8, 8};
  ES_EXPECT_RC(resize_eval(13, lin, 1, &xd, x, NULL, neg_sz, 0, &out, &od), ES_EMODEL);
  es_tdesc roi = KH_TD(ES_DTYPE_FLOAT, 0), sc3 = KH_TD(ES_DTYPE_FLOAT, 3); /* 4 values wanted */
  const es_tdesc *short_in[] = {&xd, &roi, &sc3};
  const void *short_data[] = {x, x, sc};
  ES_EXPECT_RC(eval(ES_OP_Resize, 13, lin, 1, 3, short_in, short_data, &out, &od), ES_EMODEL);
  es_attr bad_mode[] = {KH_STR("mode", "bilinear")};
  ES_EXPECT_RC(resize_eval(13, bad_mode, 1, &xd, x, sc, NULL, 0, &out, &od), ES_EMODEL);
  es_attr bad_ctm[] = {KH_STR("coordinate_transformation_mode", "corners")};
  ES_EXPECT_RC(resize_eval(13, bad_ctm, 1, &xd, x, sc, NULL, 0, &out, &od), ES_EMODEL);
  es_attr bad_nm[] = {KH_STR("nearest_mode", "up")};
  ES_EXPECT_RC(resize_eval(13, bad_nm, 1, &xd, x, sc, NULL, 0, &out, &od), ES_EMODEL);
  es_attr excl[] = {KH_INT("exclude_outside", 5)};
  ES_EXPECT_RC(resize_eval(13, excl, 1, &xd, x, sc, NULL, 0, &out, &od), ES_EMODEL);
  es_attr crop[] = {KH_STR("coordinate_transformation_mode", "tf_crop_and_resize")};
  ES_EXPECT_RC(resize_eval(13, crop, 1, &xd, x, sc, NULL, 0, &out, &od), ES_EMODEL);
  es_attr aa[] = {KH_INT("antialias", 1)};
  ES_EXPECT_RC(resize_eval(13, aa, 1, &xd, x, sc, NULL, 0, &out, &od), ES_ENOTSUP);
  es_tdesc xi = KH_TD(ES_DTYPE_INT64, 1, 1, 4, 4);
  ES_EXPECT_RC(resize_eval(13, lin, 1, &xi, x, sc, NULL, 0, &out, &od), ES_ENOTSUP);
  /* opset 10: no cubic, and scales must be there */
  es_attr cub[] = {KH_STR("mode", "cubic")};
  es_tdesc sd = KH_TD(ES_DTYPE_FLOAT, 4);
  const es_tdesc *in10[] = {&xd, &sd};
  const void *data10[] = {x, sc};
  ES_EXPECT_RC(eval(ES_OP_Resize, 10, cub, 1, 2, in10, data10, &out, &od), ES_EMODEL);
  ES_EXPECT_RC(eval(ES_OP_Resize, 10, lin, 1, 1, in10, data10, &out, &od), ES_EMODEL);
  assert_null(od);
}

/* ==========================================================================
 * BatchNormalization
 * ======================================================================== */

static void test_batchnorm(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  int64_t shapes[][4] = {{2, 3, 4, 5}, {4, 3, 0, 0}, {1, 3, 7, 0}};
  int ranks[] = {4, 2, 3};
  for (int t = 0; t < 3; t++) {
    es_tdesc xd = kh_td(ES_DTYPE_FLOAT, ranks[t], shapes[t]);
    es_tdesc pd = KH_TD(ES_DTYPE_FLOAT, 3);
    float *x = rand_f32(&seed, xd.count);
    float sc[3] = {0.5f, -2.0f, 1.5f}, b[3] = {0.1f, 0.2f, -0.3f}, m[3] = {1, -1, 0.5f},
          v[3] = {0.25f, 4.0f, 1.0f};
    const es_tdesc *in[] = {&xd, &pd, &pd, &pd, &pd};
    const void *data[] = {x, sc, b, m, v};
    float eps = 1e-3f;
    es_attr a[] = {KH_FLOAT("epsilon", eps)};
    double *want = malloc(xd.count * sizeof *want);
    int64_t plane = (int64_t)xd.count / (shapes[t][0] * 3);
    for (size_t i = 0; i < xd.count; i++) {
      int c = (int)((int64_t)i / plane % 3);
      want[i] = (x[i] - m[c]) / sqrt((double)v[c] + eps) * sc[c] + b[c];
    }
    /* static parameters, runtime parameters, in place */
    unsigned dyns[] = {0, 0x1e, 0};
    for (int mode = 0; mode < 3; mode++) {
      es_tdesc out;
      void *od;
      ES_CHECK_RC(eval_ex(ES_OP_BatchNormalization, 15, a, 1, 5, in, data, dyns[mode], mode == 2,
                          1, &out, &od));
      assert_true(es__tdesc_same_shape(&out, &xd));
      expect_close(od, want, xd.count, 1e-5, "BatchNormalization");
      es_mem_free(od);
    }
    free(want);
    free(x);
  }
}

static void test_batchnorm_errors(void **state) {
  (void)state;
  float x[24] = {0}, p[4] = {1, 1, 1, 1};
  es_tdesc xd = KH_TD(ES_DTYPE_FLOAT, 2, 3, 4), pd = KH_TD(ES_DTYPE_FLOAT, 3);
  es_tdesc p4 = KH_TD(ES_DTYPE_FLOAT, 4), p2d = KH_TD(ES_DTYPE_FLOAT, 3, 1);
  es_tdesc xi = KH_TD(ES_DTYPE_INT32, 2, 3, 4), x1 = KH_TD(ES_DTYPE_FLOAT, 3);
  es_tdesc out[3];
  void *od[3] = {NULL};
  const es_tdesc *in[] = {&xd, &pd, &pd, &pd, &pd};
  const void *data[] = {x, p, p, p, p};
  es_attr train[] = {KH_INT("training_mode", 1)};
  ES_EXPECT_RC(eval_ex(ES_OP_BatchNormalization, 15, train, 1, 5, in, data, 0, 0, 1, out, od),
               ES_ENOTSUP);
  ES_EXPECT_RC(eval_ex(ES_OP_BatchNormalization, 15, NULL, 0, 5, in, data, 0, 0, 3, out, od),
               ES_ENOTSUP);
  es_attr spatial[] = {KH_INT("spatial", 0)};
  ES_EXPECT_RC(eval_ex(ES_OP_BatchNormalization, 7, spatial, 1, 5, in, data, 0, 0, 1, out, od),
               ES_ENOTSUP);
  es_attr neg_eps[] = {KH_FLOAT("epsilon", -1.0f)};
  ES_EXPECT_RC(eval_ex(ES_OP_BatchNormalization, 15, neg_eps, 1, 5, in, data, 0, 0, 1, out, od),
               ES_EMODEL);
  ES_EXPECT_RC(eval_ex(ES_OP_BatchNormalization, 15, NULL, 0, 4, in, data, 0, 0, 1, out, od),
               ES_EMODEL);
  const es_tdesc *wrong_c[] = {&xd, &pd, &p4, &pd, &pd};
  ES_EXPECT_RC(eval_ex(ES_OP_BatchNormalization, 15, NULL, 0, 5, wrong_c, data, 0, 0, 1, out, od),
               ES_EMODEL);
  const es_tdesc *wrong_r[] = {&xd, &pd, &pd, &pd, &p2d};
  ES_EXPECT_RC(eval_ex(ES_OP_BatchNormalization, 15, NULL, 0, 5, wrong_r, data, 0, 0, 1, out, od),
               ES_EMODEL);
  const es_tdesc *int_x[] = {&xi, &pd, &pd, &pd, &pd};
  ES_EXPECT_RC(eval_ex(ES_OP_BatchNormalization, 15, NULL, 0, 5, int_x, data, 0, 0, 1, out, od),
               ES_EMODEL);
  const es_tdesc *rank1[] = {&x1, &pd, &pd, &pd, &pd};
  ES_EXPECT_RC(eval_ex(ES_OP_BatchNormalization, 15, NULL, 0, 5, rank1, data, 0, 0, 1, out, od),
               ES_EMODEL);
  const es_tdesc *missing[] = {&xd, &pd, NULL, &pd, &pd};
  ES_EXPECT_RC(eval_ex(ES_OP_BatchNormalization, 15, NULL, 0, 5, missing, data, 0, 0, 1, out, od),
               ES_EMODEL);
}

/* ==========================================================================
 * NHWC inputs
 * ======================================================================== */

/* es__kernel_eval only ever sees plain tensors, so the NHWC paths are run
 * the way the planner runs them: a hand-built instance whose X descriptor
 * says NHWC (X dynamic, the other inputs static). The result must be the
 * plain result in NHWC order. Returns infer's or run's code; on
 * ES_KRELAYOUT, *want_plain and *want_nhwc hold the kernel's requests. */
static int eval_nhwc(es_op op, int64_t opset, const es_attr *attrs, int n_attr, int n_in,
                     const es_tdesc *const *in, const void *const *data, int inplace, int n_out,
                     es_tdesc *out, void **outd, uint32_t *want_plain, uint32_t *want_nhwc) {
  es_knode node = kh_knode(op, attrs, n_attr);
  assert_true(es__kernel_for(op)->layout_aware);
  es_kinst k;
  kh_opts o = {.opset = opset, .dyn = 1, .inplace = inplace, .k_out = &k};
  int rc = kh_eval_with(&node, &o, n_in, in, data, n_out, out, outd);
  *want_plain = k.want_plain;
  *want_nhwc = k.want_nhwc;
  return rc;
}

/* The plain result y, reordered to NHWC, must equal the NHWC result bytes
 * (tol 0) or be within tol. */
static void expect_nhwc_of(const void *nhwc, const void *plain, const es_tdesc *t, double tol,
                           const char *what) {
  void *want = kh_reorder4(plain, t, 1);
  if (tol == 0) {
    if (memcmp(nhwc, want, t->nbytes))
      fail_msg("%s: NHWC result differs from the plain result", what);
  } else {
    const float *g = nhwc, *w = want;
    for (size_t i = 0; i < t->count; i++)
      if (!(fabs((double)g[i] - (double)w[i]) <= tol * (1 + fabs((double)w[i]))))
        fail_msg("%s: [%zu] = %.9g, plain %.9g", what, i, (double)g[i], (double)w[i]);
  }
  es_mem_free(want);
}

/* Random 2-D and 3-D max and average pools of channels-last inputs (NHWC,
 * NDHWC; channel counts around the vector widths) match the plain path
 * exactly. */
static void test_pool_nhwc(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  static const char *const autos[] = {"NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"};
  static const es_dtype types[] = {ES_DTYPE_FLOAT, ES_DTYPE_UINT8, ES_DTYPE_INT8};
  int ran = 0, ran3 = 0;
  for (int iter = 0; iter < 400; iter++) {
    int avg = (int)rnd(&seed, 0, 1), nsp = (int)rnd(&seed, 2, 3);
    es_dtype dt = avg ? ES_DTYPE_FLOAT : types[rnd(&seed, 0, 2)];
    int64_t k[3], s[3], d[3], pads[6], dims[5] = {rnd(&seed, 1, 2), rnd(&seed, 1, 19)};
    for (int i = 0; i < nsp; i++) {
      dims[2 + i] = rnd(&seed, 1, nsp == 2 ? 9 : 6);
      k[i] = rnd(&seed, 1, 3);
      s[i] = rnd(&seed, 1, 3);
      d[i] = rnd(&seed, 1, 2);
      pads[i] = rnd(&seed, 0, k[i] - 1);
      pads[i + nsp] = rnd(&seed, 0, k[i] - 1);
    }
    es_attr attrs[] = {
        {.name = "kernel_shape", .type = ES_ATTR_INTS, .n = (size_t)nsp, .ints = k},
        {.name = "strides", .type = ES_ATTR_INTS, .n = (size_t)nsp, .ints = s},
        {.name = "dilations", .type = ES_ATTR_INTS, .n = (size_t)nsp, .ints = d},
        {.name = "pads", .type = ES_ATTR_INTS, .n = 2 * (size_t)nsp, .ints = pads},
        KH_STR("auto_pad", autos[rnd(&seed, 0, 5) % 4]),
        KH_INT("ceil_mode", rnd(&seed, 0, 1)),
        KH_INT("count_include_pad", rnd(&seed, 0, 1)),
    };
    int na = avg ? 7 : 6;
    es_op op = avg ? ES_OP_AveragePool : ES_OP_MaxPool;
    es_tdesc x = kh_td(dt, 2 + nsp, dims), xn = kh_as_nhwc(x);
    float *xd = rand_f32(&seed, x.count);
    if (dt != ES_DTYPE_FLOAT) /* bytes of random floats are random bytes */
      for (size_t i = 0; i < x.count; i++)
        ((uint8_t *)xd)[i] = ((const uint8_t *)xd)[4 * i + 1];
    void *xnd = kh_reorder4(xd, &x, 1);
    const es_tdesc *in[] = {&x}, *inn[] = {&xn};
    const void *data[] = {xd}, *datan[] = {xnd};
    es_tdesc out, outn;
    void *od = NULL, *odn = NULL;
    uint32_t wp, wn;
    int rc = eval(op, 12, attrs, na, 1, in, data, &out, &od);
    int rcn = eval_nhwc(op, 12, attrs, na, 1, inn, datan, 0, 1, &outn, &odn, &wp, &wn);
    assert_int_equal(rc, rcn);
    if (rc == 0) {
      ran++;
      ran3 += nsp == 3;
      assert_int_equal(outn.layout, ES_LAYOUT_NHWC);
      assert_true(es__tdesc_same_shape(&out, &outn));
      char what[64];
      snprintf(what, sizeof what, "%s pool iteration %d", nsp == 3 ? "NDHWC" : "NHWC", iter);
      expect_nhwc_of(odn, od, &out, 0, what);
    }
    es_mem_free(od);
    es_mem_free(odn);
    es_mem_free(xnd);
    free(xd);
  }
  assert_true(ran > 250 && ran3 > 100);

  /* Indices are NCHW positions: MaxPool asks for a plain X. */
  es_tdesc xn = kh_as_nhwc(KH_TD(ES_DTYPE_FLOAT, 1, 2, 4, 4));
  float buf[32] = {0};
  const es_tdesc *in[] = {&xn};
  const void *data[] = {buf};
  es_attr a[] = {KH_INTS("kernel_shape", 2, 2)};
  es_tdesc out[2];
  void *od[2];
  uint32_t wp, wn;
  assert_int_equal(eval_nhwc(ES_OP_MaxPool, 12, a, 1, 1, in, data, 0, 2, out, od, &wp, &wn),
                   ES_KRELAYOUT);
  assert_int_equal(wp, 1);
  assert_int_equal(wn, 0);
}

/* GlobalAveragePool of NHWC and NDHWC inputs (pixel counts below, at and
 * past a summing block) gives the plain path's [N, C, 1, 1(, 1)] values. */
static void test_global_avgpool_nhwc(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  int64_t shapes[][5] = {{2, 3, 4, 5},    {1, 17, 8, 8},     {1, 9, 13, 11},   {2, 5, 1, 1},
                         {1, 4, 0, 3},    {1, 6, 2, 3, 5},   {2, 17, 4, 5, 7}, {1, 3, 1, 1, 1},
                         {1, 33, 2, 7, 7}};
  for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++) {
    int rank = shapes[t][4] ? 5 : 4;
    es_tdesc x = kh_td(ES_DTYPE_FLOAT, rank, shapes[t]), xn = kh_as_nhwc(x);
    float *xd = rand_f32(&seed, x.count);
    void *xnd = kh_reorder4(xd, &x, 1);
    const es_tdesc *in[] = {&x}, *inn[] = {&xn};
    const void *data[] = {xd}, *datan[] = {xnd};
    es_tdesc out, outn;
    void *od, *odn;
    uint32_t wp, wn;
    ES_CHECK_RC(eval(ES_OP_GlobalAveragePool, 12, NULL, 0, 1, in, data, &out, &od));
    ES_CHECK_RC(eval_nhwc(ES_OP_GlobalAveragePool, 12, NULL, 0, 1, inn, datan, 0, 1, &outn, &odn,
                          &wp, &wn));
    assert_int_equal(outn.layout, ES_LAYOUT_NHWC); /* same bytes as plain [N, C, 1, 1] */
    assert_true(es__tdesc_same_shape(&out, &outn));
    const float *g = odn, *w = od;
    for (size_t i = 0; i < out.count; i++)
      if (isnan(w[i]) ? !isnan(g[i]) : !(fabsf(g[i] - w[i]) <= 1e-5f * (1 + fabsf(w[i]))))
        fail_msg("GlobalAveragePool NHWC shape %zu: [%zu] = %.9g, plain %.9g", t, i,
                 (double)g[i], (double)w[i]);
    es_mem_free(od);
    es_mem_free(odn);
    es_mem_free(xnd);
    free(xd);
  }
}

/* Resize of NHWC inputs: the H/W-only nearest and linear cases (and a
 * copy) stay NHWC and match the plain path exactly; anything else asks for
 * a plain X. */
static void test_resize_nhwc(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  es_attr nearest[] = {KH_STR("mode", "nearest"),
                       KH_STR("coordinate_transformation_mode", "asymmetric"),
                       KH_STR("nearest_mode", "floor")};
  es_attr linear[] = {KH_STR("mode", "linear"),
                      KH_STR("coordinate_transformation_mode", "half_pixel")};
  es_attr cubic[] = {KH_STR("mode", "cubic")};
  struct {
    const es_attr *a;
    int na;
    float sc[4];
    int64_t sz[4]; /* used when sc[0] is 0 */
    int plain;     /* expects a request for plain X */
  } cases[] = {
      {nearest, 3, {1, 1, 2, 2}, {0}, 0},     {nearest, 3, {1, 1, 0.5f, 1.5f}, {0}, 0},
      {linear, 2, {1, 1, 2, 2}, {0}, 0},      {linear, 2, {0}, {2, 7, 5, 9}, 0},
      {linear, 2, {1, 1, 1, 1}, {0}, 0},      {cubic, 1, {1, 1, 2, 2}, {0}, 1},
      {nearest, 3, {1, 2, 1, 1}, {0}, 1},
  };
  int64_t dims[4] = {2, 7, 6, 5};
  es_tdesc x = kh_td(ES_DTYPE_FLOAT, 4, dims), xn = kh_as_nhwc(x);
  float *xd = rand_f32(&seed, x.count);
  void *xnd = kh_reorder4(xd, &x, 1);
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    int use_sizes = cases[c].sc[0] == 0;
    es_tdesc roi = KH_TD(ES_DTYPE_FLOAT, 0), sd = KH_TD(ES_DTYPE_FLOAT, 4),
             zd = KH_TD(ES_DTYPE_INT64, 4);
    if (use_sizes)
      sd = KH_TD(ES_DTYPE_FLOAT, 0);
    static const float none = 0;
    const es_tdesc *in[] = {&x, &roi, &sd, &zd}, *inn[] = {&xn, &roi, &sd, &zd};
    const void *data[] = {xd, &none, use_sizes ? (const void *)&none : cases[c].sc, cases[c].sz};
    const void *datan[] = {xnd, data[1], data[2], data[3]};
    int n_in = use_sizes ? 4 : 3;
    es_tdesc out, outn;
    void *od, *odn;
    uint32_t wp, wn;
    int rc = eval_nhwc(ES_OP_Resize, 13, cases[c].a, cases[c].na, n_in, inn, datan, 0, 1, &outn,
                       &odn, &wp, &wn);
    if (cases[c].plain) {
      assert_int_equal(rc, ES_KRELAYOUT);
      assert_int_equal(wp, 1);
      continue;
    }
    ES_CHECK_RC(rc);
    ES_CHECK_RC(eval(ES_OP_Resize, 13, cases[c].a, cases[c].na, n_in, in, data, &out, &od));
    assert_int_equal(outn.layout, ES_LAYOUT_NHWC);
    assert_true(es__tdesc_same_shape(&out, &outn));
    char what[48];
    snprintf(what, sizeof what, "Resize NHWC case %zu", c);
    expect_nhwc_of(odn, od, &out, 0, what);
    es_mem_free(od);
    es_mem_free(odn);
  }
  es_mem_free(xnd);
  free(xd);
}

/* BatchNormalization of an NHWC input, with static and runtime
 * parameters and in place. */
static void test_batchnorm_nhwc(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  int64_t dims[4] = {2, 3, 4, 5};
  es_tdesc x = kh_td(ES_DTYPE_FLOAT, 4, dims), xn = kh_as_nhwc(x), pd = KH_TD(ES_DTYPE_FLOAT, 3);
  float *xd = rand_f32(&seed, x.count);
  void *xnd = kh_reorder4(xd, &x, 1);
  float sc[3] = {0.5f, -2.0f, 1.5f}, b[3] = {0.1f, 0.2f, -0.3f}, m[3] = {1, -1, 0.5f},
        v[3] = {0.25f, 4.0f, 1.0f};
  const es_tdesc *in[] = {&x, &pd, &pd, &pd, &pd}, *inn[] = {&xn, &pd, &pd, &pd, &pd};
  const void *data[] = {xd, sc, b, m, v}, *datan[] = {xnd, sc, b, m, v};
  es_tdesc out, outn;
  void *od, *odn;
  uint32_t wp, wn;
  ES_CHECK_RC(eval(ES_OP_BatchNormalization, 15, NULL, 0, 5, in, data, &out, &od));
  for (int inplace = 0; inplace < 2; inplace++) {
    ES_CHECK_RC(eval_nhwc(ES_OP_BatchNormalization, 15, NULL, 0, 5, inn, datan, inplace, 1, &outn,
                          &odn, &wp, &wn));
    assert_int_equal(outn.layout, ES_LAYOUT_NHWC);
    expect_nhwc_of(odn, od, &out, 0, "BatchNormalization NHWC");
    es_mem_free(odn);
  }
  es_mem_free(od);
  es_mem_free(xnd);
  free(xd);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pool_random),        cmocka_unit_test(test_maxpool_hand),
      cmocka_unit_test(test_maxpool_int8),       cmocka_unit_test(test_maxpool_indices),
      cmocka_unit_test(test_avgpool_hand),       cmocka_unit_test(test_global_avgpool),
      cmocka_unit_test(test_pool_errors),        cmocka_unit_test(test_reduce_mean_random),
      cmocka_unit_test(test_reduce_mean_forms),  cmocka_unit_test(test_reduce_mean_errors),
      cmocka_unit_test(test_softmax),            cmocka_unit_test(test_softmax_errors),
      cmocka_unit_test(test_resize_linear),      cmocka_unit_test(test_resize_nearest),
      cmocka_unit_test(test_resize_errors),      cmocka_unit_test(test_batchnorm),
      cmocka_unit_test(test_batchnorm_errors),   cmocka_unit_test(test_pool_nhwc),
      cmocka_unit_test(test_global_avgpool_nhwc), cmocka_unit_test(test_resize_nhwc),
      cmocka_unit_test(test_batchnorm_nhwc),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
