/* Kernels of the linear algebra family: Gemm and Einsum.
 *
 * Gemm runs on every form of C (none, a scalar, [1], [N], [1, N], [M, 1],
 * [M, N], [1, 1]), both transposes, several alpha and beta, with B and C
 * known while planning or only at run time, on the oneDNN path and on the
 * reference loops, against a plain triple loop in double; the dot products
 * over B as stored (at most 4 rows of A, transB) at lengths that cover
 * their 16-lane blocks, 4-row groups and tails; then inside a loaded model
 * (a classifier's last layer followed by Softmax: batch 1 and 3 on the dot
 * products, 8 on static weights prepared through the model's store). Einsum runs the common
 * equations (matrix products, transposes, inner and outer products,
 * diagonals, traces, ellipsis broadcast, implicit output) against a
 * reference that enumerates every assignment of the labels. Invalid nodes
 * must fail with the right code. */
#include "es_test.h"

#include <math.h>
#include <string.h>

#include "kernels/kernel.h"
#include "support/kernel_harness.h"
#include "support/onnx_builder.h"

static int64_t rnd(uint64_t *s, int64_t lo, int64_t hi) {
  return lo + (int64_t)(es_test_rand(s) % (uint64_t)(hi - lo + 1));
}

static void expect_close(const float *got, const double *want, size_t n, double tol,
                         const char *what) {
  for (size_t i = 0; i < n; i++)
    if (!(fabs((double)got[i] - want[i]) <= tol * (1 + fabs(want[i]))))
      fail_msg("%s: [%zu] = %.9g, expected %.9g", what, i, (double)got[i], want[i]);
}

/* ==========================================================================
 * Gemm
 * ======================================================================== */

/* C's shapes: rank and dims, with M and N marked as -1 and -2. */
static const struct {
  int rank;
  int64_t d[2];
  const char *name;
} c_forms[] = {
    {-1, {0, 0}, "none"},   {0, {0, 0}, "scalar"}, {1, {1, 0}, "[1]"},
    {1, {-2, 0}, "[N]"},    {2, {1, -2}, "[1,N]"}, {2, {-1, 1}, "[M,1]"},
    {2, {-1, -2}, "[M,N]"}, {2, {1, 1}, "[1,1]"},
};

static void gemm_ref(int64_t m, int64_t n, int64_t k, int ta, int tb, double alpha, double beta,
                     const float *a, const float *b, const float *c, int64_t cm, int64_t cn,
                     double *y) {
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double s = 0;
      for (int64_t t = 0; t < k; t++)
        s += (double)(ta ? a[t * m + i] : a[i * k + t]) * (tb ? b[j * k + t] : b[t * n + j]);
      s *= alpha;
      if (c)
        s += beta * c[(cm == 1 ? 0 : i) * cn + (cn == 1 ? 0 : j)];
      y[i * n + j] = s;
    }
}

/* One Gemm node evaluated (B and C static or not per dyn) and checked
 * against gemm_ref; path names the kernel path for the failure message. */
static void gemm_case(uint64_t *seed, const char *path, int64_t m, int64_t n, int64_t k, int ta,
                      int tb, size_t cf, float alpha, float beta, unsigned dyn) {
  es_tdesc ad = ta ? KH_TD(ES_DTYPE_FLOAT, k, m) : KH_TD(ES_DTYPE_FLOAT, m, k);
  es_tdesc bd = tb ? KH_TD(ES_DTYPE_FLOAT, n, k) : KH_TD(ES_DTYPE_FLOAT, k, n);
  int64_t cdims[2], cm = 1, cn = 1;
  int crank = c_forms[cf].rank;
  for (int i = 0; i < (crank > 0 ? crank : 0); i++)
    cdims[i] = c_forms[cf].d[i] == -1 ? m : c_forms[cf].d[i] == -2 ? n : c_forms[cf].d[i];
  if (crank == 2)
    cm = cdims[0];
  if (crank >= 1)
    cn = cdims[crank - 1];
  es_tdesc cd = crank >= 0 ? kh_td(ES_DTYPE_FLOAT, crank, cdims) : ad;
  float *a = malloc((size_t)(m * k + 1) * sizeof *a);
  float *b = malloc((size_t)(k * n + 1) * sizeof *b);
  float *c = malloc((size_t)(cm * cn) * sizeof *c);
  kh_rand_f32(seed, a, (size_t)(m * k), -1, 1);
  kh_rand_f32(seed, b, (size_t)(k * n), -1, 1);
  kh_rand_f32(seed, c, (size_t)(cm * cn), -1, 1);
  es_attr attrs[] = {KH_INT("transA", ta), KH_INT("transB", tb), KH_FLOAT("alpha", alpha),
                     KH_FLOAT("beta", beta)};
  const es_tdesc *in[] = {&ad, &bd, &cd};
  const void *data[] = {a, b, c};
  es_knode node = kh_knode(ES_OP_Gemm, attrs, 4);
  kh_opts o = {.opset = 13, .dyn = dyn};
  es_tdesc out;
  void *od;
  ES_CHECK_RC(kh_eval_with(&node, &o, crank >= 0 ? 3 : 2, in, data, 1, &out, &od));
  assert_int_equal(out.rank, 2);
  assert_int_equal(out.dims[0], m);
  assert_int_equal(out.dims[1], n);
  double *want = malloc((size_t)(m * n) * sizeof *want);
  gemm_ref(m, n, k, ta, tb, alpha, beta, a, b, crank >= 0 ? c : NULL, cm, cn, want);
  char what[160];
  snprintf(what, sizeof what,
           "Gemm %s, C %s, transA %d transB %d, alpha %g beta %g, M %lld N %lld K %lld, dyn %u",
           path, c_forms[cf].name, ta, tb, (double)alpha, (double)beta, (long long)m,
           (long long)n, (long long)k, dyn);
  expect_close(od, want, (size_t)(m * n), 1e-5, what);
  free(want);
  free(a);
  free(b);
  free(c);
  es_mem_free(od);
}

static void test_gemm(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  static const float alphas[] = {1.0f, 0.5f, -2.0f}, betas[] = {1.0f, 2.0f, 0.0f};
  int cases = 0;
  for (int ref = 0; ref < 2; ref++) {
    es__kernels_use_reference(ref);
    for (size_t cf = 0; cf < sizeof c_forms / sizeof c_forms[0]; cf++)
      for (int tr = 0; tr < 4; tr++)
        for (int ab = 0; ab < 3; ab++) {
          int ta = tr & 1, tb = tr >> 1;
          int64_t m = rnd(&seed, 1, 9), n = rnd(&seed, 1, 33), k = rnd(&seed, 1, 17);
          if (ab == 2 && cf == 6)
            k = 0; /* an empty product: Y is beta * C */
          float alpha = alphas[ab], beta = betas[(ab + cf) % 3];
          unsigned dyn = (unsigned)rnd(&seed, 0, 7) & 6; /* B and C static or not */
          gemm_case(&seed, ref ? "reference" : "optimised", m, n, k, ta, tb, cf, alpha, beta,
                    dyn);
          cases++;
        }
  }
  es__kernels_use_reference(0);
  assert_int_equal(cases, 2 * 8 * 4 * 3);
}

/* M <= 4 with transB: the dot products over B's rows, each length class
 * (under one 16-lane block, whole blocks, blocks and a tail; rows in groups
 * of 4 and a tail), with every C mode that matters to them. */
static void test_gemm_gemv(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  static const int64_t ks[] = {1, 15, 16, 100, 1000}, ns[] = {1, 3, 4, 37};
  int cases = 0;
  for (int64_t m = 1; m <= 4; m++)
    for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
      for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
        int64_t k = ks[ki], n = ns[ni];
        int ta = m == 1 && (ki & 1), cf = (int)((ki + ni + (size_t)m) % 8);
        float alpha = (ni & 1) ? 0.5f : 1.0f, beta = (ki & 1) ? 2.0f : 1.0f;
        unsigned dyn = (unsigned)rnd(&seed, 0, 7) & 6;
        gemm_case(&seed, "dot products", m, n, k, ta, 1, (size_t)cf, alpha, beta, dyn);
        cases++;
      }
  assert_int_equal(cases, 4 * 5 * 4);
}

static void test_gemm_errors(void **state) {
  (void)state;
  float buf[64] = {0};
  es_tdesc a = KH_TD(ES_DTYPE_FLOAT, 2, 3), b = KH_TD(ES_DTYPE_FLOAT, 3, 4),
           bad_b = KH_TD(ES_DTYPE_FLOAT, 2, 4), c3 = KH_TD(ES_DTYPE_FLOAT, 3),
           c24 = KH_TD(ES_DTYPE_FLOAT, 2, 4), c3d = KH_TD(ES_DTYPE_FLOAT, 1, 2, 4),
           a1 = KH_TD(ES_DTYPE_FLOAT, 6), ai = KH_TD(ES_DTYPE_INT32, 2, 3),
           ab = KH_TD(ES_DTYPE_BOOL, 2, 3);
  const void *data[] = {buf, buf, buf};
  es_tdesc out;
  void *od = NULL;
  es_knode node = kh_knode(ES_OP_Gemm, NULL, 0);
  const es_tdesc *ok[] = {&a, &b, &c24};
  ES_CHECK_RC(es__kernel_eval(&node, 13, 3, ok, data, 1, &out, &od));
  es_mem_free(od);
  struct {
    const es_tdesc *in[3];
    int n;
    int want;
  } cases[] = {
      {{&a, &bad_b}, 2, ES_EMODEL}, /* K differs */
      {{&a, &b, &c3}, 3, ES_EMODEL}, /* C [3] against N = 4 */
      {{&a, &b, &c3d}, 3, ES_EMODEL}, /* C of rank 3 */
      {{&a1, &b}, 2, ES_EMODEL},     /* A of rank 1 */
      {{&ai, &b}, 2, ES_ENOTSUP},    /* int32: legal, not implemented */
      {{&ab, &b}, 2, ES_EMODEL},     /* bool */
      {{&a}, 1, ES_EMODEL},          /* B missing */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    ES_EXPECT_RC(es__kernel_eval(&node, 13, cases[i].n, cases[i].in, data, 1, &out, &od),
                 cases[i].want);
  es_attr t2[] = {KH_INT("transA", 2)};
  es_knode nt = kh_knode(ES_OP_Gemm, t2, 1);
  ES_EXPECT_RC(es__kernel_eval(&nt, 13, 2, ok, data, 1, &out, &od), ES_EMODEL);
}

/* A classifier's head in a real model: x [batch, K] -> Gemm (static
 * weights [N, K], transB = 1, bias [N]) -> Softmax, planned and run by the
 * engine, at two batch sizes. */
static void test_gemm_in_model(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  enum { K = 64, N = 40 };
  static float w[N * K], bias[N];
  kh_rand_f32(&seed, w, N * K, -0.2f, 0.2f);
  kh_rand_f32(&seed, bias, N, -1, 1);
  ob *b = ob_new(13);
  ob_input(b, "x", 2, (int64_t[]){-1, K});
  ob_init_f32(b, "W", 2, (int64_t[]){N, K}, w);
  ob_init_f32(b, "B", 1, (int64_t[]){N}, bias);
  int g = ob_node(b, "Gemm", "logits", 3, "x", "W", "B");
  ob_attr_int(b, g, "transB", 1);
  ob_node(b, "Softmax", "prob", 1, "logits");
  ob_output(b, "prob");
  es_model *m = ob_load(b);
  free(b);
  static const int64_t batches[] = {1, 3, 8};
  for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++) {
    int64_t batch = batches[bi];
    float *x = malloc((size_t)(batch * K) * sizeof *x);
    kh_rand_f32(&seed, x, (size_t)(batch * K), -1, 1);
    es_tensor in = ob_tensor_f32("x", 2, (int64_t[]){batch, K}, x);
    float *y;
    size_t count;
    ob_run(m, 1, &in, 1, &y, &count);
    assert_int_equal(count, (size_t)(batch * N));
    double *want = malloc((size_t)(batch * N) * sizeof *want);
    gemm_ref(batch, N, K, 0, 1, 1, 1, x, w, bias, 1, N, want);
    for (int64_t r = 0; r < batch; r++) {
      double mx = -INFINITY, s = 0;
      for (int j = 0; j < N; j++)
        mx = want[r * N + j] > mx ? want[r * N + j] : mx;
      for (int j = 0; j < N; j++)
        s += exp(want[r * N + j] - mx);
      for (int j = 0; j < N; j++)
        want[r * N + j] = exp(want[r * N + j] - mx) / s;
    }
    expect_close(y, want, count, 1e-5, "Gemm + Softmax model");
    free(want);
    free(y);
    free(x);
  }
  es_model_release(m);
}

/* ==========================================================================
 * Einsum
 * ======================================================================== */

/* Reference: every assignment of the labels (letters only, explicit output),
 * an operand's dim of 1 read at index 0 (broadcast). */
static void ein_ref(const char *eq, int n_ops, const es_tdesc *const *x, const float *const *xd,
                    double *y, size_t ycount) {
  char terms[8][16], outt[16];
  int nt = 0;
  const char *p = eq;
  while (1) {
    size_t l = strcspn(p, ",-");
    memcpy(terms[nt], p, l);
    terms[nt++][l] = 0;
    p += l;
    if (*p == ',') {
      p++;
      continue;
    }
    break;
  }
  assert_int_equal(nt, n_ops);
  assert_true(p[0] == '-' && p[1] == '>');
  snprintf(outt, sizeof outt, "%s", p + 2);
  int64_t ext[128] = {0};
  for (int o = 0; o < n_ops; o++)
    for (int a = 0; terms[o][a]; a++) {
      int64_t d = x[o]->dims[a];
      unsigned char ch = (unsigned char)terms[o][a];
      ext[ch] = d > ext[ch] ? d : ext[ch];
    }
  char labels[64];
  int nl = 0;
  for (int ch = 0; ch < 128; ch++)
    if (ext[ch] > 0)
      labels[nl++] = (char)ch;
  for (size_t i = 0; i < ycount; i++)
    y[i] = 0;
  int64_t val[128] = {0};
  for (;;) {
    double prod = 1;
    for (int o = 0; o < n_ops; o++) {
      int64_t idx = 0;
      for (int a = 0; terms[o][a]; a++) {
        int64_t d = x[o]->dims[a];
        idx = idx * d + (d == 1 ? 0 : val[(unsigned char)terms[o][a]]);
      }
      prod *= xd[o][idx];
    }
    int64_t oi = 0;
    for (int a = 0; outt[a]; a++)
      oi = oi * ext[(unsigned char)outt[a]] + val[(unsigned char)outt[a]];
    y[oi] += prod;
    int l = nl - 1;
    for (; l >= 0; l--) {
      unsigned char ch = (unsigned char)labels[l];
      if (++val[ch] < ext[ch])
        break;
      val[ch] = 0;
    }
    if (l < 0)
      break;
  }
}

static void test_einsum(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  struct {
    const char *eq, *ref; /* the kernel's equation and the reference's */
    int n;
    int rank[3];
    int64_t dims[3][4];
    int orank;
    int64_t odims[4];
  } cases[] = {
      {"ij,jk->ik", "ij,jk->ik", 2, {2, 2}, {{3, 4}, {4, 5}}, 2, {3, 5}},
      {"bij,bjk->bik", "bij,bjk->bik", 2, {3, 3}, {{2, 3, 4}, {2, 4, 5}}, 3, {2, 3, 5}},
      {"ij->ji", "ij->ji", 1, {2}, {{3, 4}}, 2, {4, 3}},
      {"i,i->", "i,i->", 2, {1, 1}, {{7}, {7}}, 0, {0}},
      {"i,j->ij", "i,j->ij", 2, {1, 1}, {{3}, {4}}, 2, {3, 4}},
      {"ii->i", "ii->i", 1, {2}, {{4, 4}}, 1, {4}},
      {"ii", "ii->", 1, {2}, {{4, 4}}, 0, {0}},
      {"bii->bi", "bii->bi", 1, {3}, {{2, 3, 3}}, 2, {2, 3}},
      {"ij,jk", "ij,jk->ik", 2, {2, 2}, {{3, 4}, {4, 2}}, 2, {3, 2}},
      {"ba,ca", "ba,ca->bc", 2, {2, 2}, {{3, 4}, {2, 4}}, 2, {3, 2}},
      {"ij->", "ij->", 1, {2}, {{3, 4}}, 0, {0}},
      {"ij,jk,kl->il", "ij,jk,kl->il", 3, {2, 2, 2}, {{2, 3}, {3, 4}, {4, 2}}, 2, {2, 2}},
      {"...ij,...jk->...ik", "xyij,yjk->xyik", 2, {4, 3}, {{2, 1, 3, 4}, {5, 4, 2}}, 4,
       {2, 5, 3, 2}},
      {"...ii->...i", "xii->xi", 1, {3}, {{2, 3, 3}}, 2, {2, 3}},
      {"bhqd, bhkd -> bhqk", "bhqd,bhkd->bhqk", 2, {4, 4}, {{1, 2, 3, 4}, {1, 2, 5, 4}}, 4,
       {1, 2, 3, 5}},
      {"Ab,bA->A", "Ab,bA->A", 2, {2, 2}, {{3, 2}, {2, 3}}, 1, {3}},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
    for (int dt = 0; dt < 3; dt++) {
      es_dtype type = dt == 0 ? ES_DTYPE_FLOAT : dt == 1 ? ES_DTYPE_INT32 : ES_DTYPE_INT64;
      es_tdesc xd[3];
      float *xf[3];
      void *xs[3];
      const es_tdesc *in[3];
      const void *data[3];
      for (int o = 0; o < cases[c].n; o++) {
        xd[o] = kh_td(type, cases[c].rank[o], cases[c].dims[o]);
        xf[o] = malloc((xd[o].count + 1) * sizeof(float));
        xs[o] = malloc((xd[o].count + 1) * 8);
        for (size_t i = 0; i < xd[o].count; i++) {
          int64_t v = rnd(&seed, -5, 5);
          xf[o][i] = (float)v;
          if (type == ES_DTYPE_FLOAT)
            ((float *)xs[o])[i] = (float)v;
          else if (type == ES_DTYPE_INT32)
            ((int32_t *)xs[o])[i] = (int32_t)v;
          else
            ((int64_t *)xs[o])[i] = v;
        }
        in[o] = &xd[o];
        data[o] = xs[o];
      }
      es_attr a[] = {KH_STR("equation", cases[c].eq)};
      es_knode node = kh_knode(ES_OP_Einsum, a, 1);
      es_tdesc out;
      void *od;
      ES_CHECK_RC(es__kernel_eval(&node, 12, cases[c].n, in, data, 1, &out, &od));
      assert_int_equal(out.dtype, type);
      assert_int_equal(out.rank, cases[c].orank);
      for (int i = 0; i < out.rank; i++)
        assert_int_equal(out.dims[i], cases[c].odims[i]);
      double *want = malloc((out.count + 1) * sizeof *want);
      ein_ref(cases[c].ref, cases[c].n, in, (const float *const *)xf, want, out.count);
      for (size_t i = 0; i < out.count; i++) {
        double g = type == ES_DTYPE_FLOAT   ? ((float *)od)[i]
                   : type == ES_DTYPE_INT32 ? ((int32_t *)od)[i]
                                            : (double)((int64_t *)od)[i];
        if (g != want[i]) /* small integers: exact in every type */
          fail_msg("Einsum '%s' (%s): [%zu] = %g, expected %g", cases[c].eq,
                   es_dtype_name(type), i, g, want[i]);
      }
      free(want);
      es_mem_free(od);
      for (int o = 0; o < cases[c].n; o++) {
        free(xf[o]);
        free(xs[o]);
      }
    }
  /* a trace by hand */
  float m[4] = {1, 2, 3, 4};
  es_tdesc md = KH_TD(ES_DTYPE_FLOAT, 2, 2);
  const es_tdesc *in[] = {&md};
  const void *data[] = {m};
  es_attr a[] = {KH_STR("equation", "ii->")};
  es_knode node = kh_knode(ES_OP_Einsum, a, 1);
  es_tdesc out;
  void *od;
  ES_CHECK_RC(es__kernel_eval(&node, 12, 1, in, data, 1, &out, &od));
  assert_true(*(float *)od == 5.0f);
  es_mem_free(od);
}

static void test_einsum_errors(void **state) {
  (void)state;
  float buf[64] = {0};
  es_tdesc a = KH_TD(ES_DTYPE_FLOAT, 2, 3), b = KH_TD(ES_DTYPE_FLOAT, 4, 5),
           bi = KH_TD(ES_DTYPE_INT32, 3, 5), bb = KH_TD(ES_DTYPE_BOOL, 2, 3),
           e3 = KH_TD(ES_DTYPE_FLOAT, 2, 3, 4);
  const void *data[] = {buf, buf};
  struct {
    const char *eq;
    const es_tdesc *in[2];
    int n;
    int want;
  } cases[] = {
      {"ij,jk->ik", {&a, &b}, 2, ES_EMODEL},   /* j is 3 and 4 */
      {"ij,jk->ik", {&a, &bi}, 2, ES_EMODEL},  /* float32 and int32 */
      {"ij->ij", {&bb}, 1, ES_EMODEL},         /* bool */
      {"i1->i", {&a}, 1, ES_EMODEL},           /* not a letter */
      {"ij,jk->ik", {&a}, 1, ES_EMODEL},       /* a term without operand */
      {"ij->ik", {&a}, 1, ES_EMODEL},          /* k in no input */
      {"ij->ii", {&a}, 1, ES_EMODEL},          /* an output label twice */
      {"ijk->i", {&a}, 1, ES_EMODEL},          /* more labels than axes */
      {"i..j->ij", {&a}, 1, ES_EMODEL},        /* a broken ellipsis */
      {"...i->i", {&e3}, 1, ES_ENOTSUP},       /* summing over the ellipsis */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    es_attr at[] = {KH_STR("equation", cases[i].eq)};
    es_knode node = kh_knode(ES_OP_Einsum, at, 1);
    es_tdesc out;
    void *od = NULL;
    ES_EXPECT_RC(es__kernel_eval(&node, 12, cases[i].n, cases[i].in, data, 1, &out, &od),
                 cases[i].want);
  }
  es_knode none = kh_knode(ES_OP_Einsum, NULL, 0);
  const es_tdesc *one[] = {&a};
  es_tdesc out;
  void *od = NULL;
  ES_EXPECT_RC(es__kernel_eval(&none, 12, 1, one, data, 1, &out, &od), ES_EMODEL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gemm),   cmocka_unit_test(test_gemm_gemv),
      cmocka_unit_test(test_gemm_errors),
      cmocka_unit_test(test_gemm_in_model),
      cmocka_unit_test(test_einsum), cmocka_unit_test(test_einsum_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
