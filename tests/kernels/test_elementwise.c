/* Elementwise kernels: Add, Sub, Mul, Div, Pow, Equal, Relu, Sigmoid,
 * HardSigmoid, Clip, Sqrt, Cast.
 *
 * Nodes are built by hand and evaluated with es__kernel_eval; broadcasting is
 * checked against a naive N-d reference on random shapes (every fast path
 * and the general walk), in-place runs and run-time Clip bounds go through a
 * hand-made es_kinst, and invalid nodes must fail with the right code.
 * NHWC inputs (which es__kernel_eval never makes) also go through a hand-made
 * es_kinst: results must be the plain results in NHWC order, and inputs that
 * cannot be read in NHWC order must be asked for in another layout.
 *
 * FusedElementwise programs (hard-swish, LayerNorm tails, random broadcasts
 * with every opcode) must give the bits of the same chain run step by step
 * with the single-op kernels. */
#include "es_test.h"

#include <math.h>
#include <string.h>

#include "kernels/fused.h"
#include "kernels/kernel.h"
#include "support/kernel_harness.h"

/* ==========================================================================
 * Helpers
 * ======================================================================== */

/* Evaluate op with inputs (desc, data); one output. */
static int eval_op(es_op op, int64_t opset, es_attr *attrs, int n_attr, int n_in,
                   const es_tdesc *const *d, const void *const *data, es_tdesc *od, void **out) {
  es_knode n = kh_knode(op, attrs, n_attr);
  return kh_eval(&n, opset, n_in, d, data, od, out);
}

static int eval2(es_op op, const es_tdesc *a, const void *ad, const es_tdesc *b, const void *bd,
                 es_tdesc *od, void **out) {
  const es_tdesc *d[2] = {a, b};
  const void *p[2] = {ad, bd};
  return eval_op(op, 13, NULL, 0, 2, d, p, od, out);
}

static int eval1(es_op op, int64_t opset, es_attr *attrs, int n_attr, const es_tdesc *x,
                 const void *xd, es_tdesc *od, void **out) {
  const es_tdesc *d[1] = {x};
  const void *p[1] = {xd};
  return eval_op(op, opset, attrs, n_attr, 1, d, p, od, out);
}

static void assert_shape(const es_tdesc *t, es_dtype dt, int rank, const int64_t *dims) {
  assert_int_equal(t->dtype, dt);
  assert_int_equal(t->rank, rank);
  for (int i = 0; i < rank; i++)
    assert_int_equal(t->dims[i], dims[i]);
}

static void assert_floats_near(const float *got, const float *want, size_t n, float rtol) {
  for (size_t i = 0; i < n; i++) {
    if (isnan(want[i])) {
      assert_true(isnan(got[i]));
      continue;
    }
    if (!(fabsf(got[i] - want[i]) <= rtol * fabsf(want[i]) + 1e-30f))
      fail_msg("[%zu] = %.9g, want %.9g", i, (double)got[i], (double)want[i]);
  }
}

/* Infers a kernel by hand (kh_run) with in_static as given, so a test can
 * then run it on its own buffers (out aliasing an input). */
static int hand_infer(kh_run *h, es_op op, int64_t opset, es_attr *attrs, int n_attr, int n_in,
                      const es_tdesc *const *d, const void *const *in_static) {
  es_knode nd = kh_knode(op, attrs, n_attr);
  kh_begin(h, &nd, opset, n_in, d, in_static, 0, 1, NULL);
  return kh_infer(h);
}

/* ==========================================================================
 * Broadcasting against a naive reference
 * ======================================================================== */

/* Reference Sub (not commutative, so a swapped a/b shows). */
static void ref_sub(const es_tdesc *a, const float *ad, const es_tdesc *b, const float *bd,
                    const es_tdesc *o, float *od) {
  int r = o->rank;
  for (size_t i = 0; i < o->count; i++) {
    size_t rem = i, ia = 0, ib = 0, sa = 1, sb = 1;
    for (int d = r - 1; d >= 0; d--) {
      size_t c = rem % (size_t)o->dims[d];
      rem /= (size_t)o->dims[d];
      int da = d - (r - a->rank), db = d - (r - b->rank);
      if (da >= 0) {
        ia += (a->dims[da] == 1 ? 0 : c) * sa;
        sa *= (size_t)a->dims[da];
      }
      if (db >= 0) {
        ib += (b->dims[db] == 1 ? 0 : c) * sb;
        sb *= (size_t)b->dims[db];
      }
    }
    od[i] = ad[ia] - bd[ib];
  }
}

static void check_sub_bcast(int ra, const int64_t *da, int rb, const int64_t *db) {
  es_tdesc a = kh_td(ES_DTYPE_FLOAT, ra, da), b = kh_td(ES_DTYPE_FLOAT, rb, db);
  float *av = malloc(a.count * sizeof *av + 4), *bv = malloc(b.count * sizeof *bv + 4);
  for (size_t i = 0; i < a.count; i++)
    av[i] = (float)(i * 7 % 23) - 5.5f;
  for (size_t i = 0; i < b.count; i++)
    bv[i] = (float)(i * 3 % 17) * 0.25f;
  es_tdesc o;
  void *out;
  ES_CHECK_RC(eval2(ES_OP_Sub, &a, av, &b, bv, &o, &out));
  float *want = malloc(o.count * sizeof *want + 4);
  ref_sub(&a, av, &b, bv, &o, want);
  assert_floats_near(out, want, o.count, 0);
  es_mem_free(out);
  free(av);
  free(bv);
  free(want);
}

static void test_bcast_fast_paths(void **state) {
  (void)state;
  /* same shape, long enough for full chunks and a tail */
  check_sub_bcast(2, (int64_t[]){5, 7}, 2, (int64_t[]){5, 7});
  /* scalar b, scalar a, rank 0 */
  check_sub_bcast(3, (int64_t[]){2, 3, 11}, 0, NULL);
  check_sub_bcast(1, (int64_t[]){1}, 3, (int64_t[]){2, 3, 11});
  check_sub_bcast(0, NULL, 0, NULL);
  /* rows: [R, K] - [K] and [K] - [R, K] */
  check_sub_bcast(3, (int64_t[]){2, 3, 20}, 1, (int64_t[]){20});
  check_sub_bcast(2, (int64_t[]){1, 20}, 3, (int64_t[]){2, 3, 20});
  /* per channel: [N,C,H,W] - [C,1,1], [1,C,1,1] - [N,C,H,W], N = 1 */
  check_sub_bcast(4, (int64_t[]){2, 3, 4, 5}, 3, (int64_t[]){3, 1, 1});
  check_sub_bcast(4, (int64_t[]){1, 3, 1, 1}, 4, (int64_t[]){2, 3, 4, 5});
  check_sub_bcast(4, (int64_t[]){1, 3, 4, 5}, 4, (int64_t[]){1, 3, 1, 1});
  /* general: both broadcast, inner scalar runs, 5-D and 8-D */
  check_sub_bcast(3, (int64_t[]){2, 1, 3}, 2, (int64_t[]){4, 1});
  check_sub_bcast(3, (int64_t[]){3, 4, 1}, 3, (int64_t[]){3, 1, 5});
  check_sub_bcast(5, (int64_t[]){2, 1, 3, 1, 4}, 4, (int64_t[]){5, 3, 2, 1});
  check_sub_bcast(8, (int64_t[]){2, 1, 2, 1, 2, 1, 2, 3}, 8, (int64_t[]){1, 2, 1, 2, 1, 2, 2, 1});
  /* empty output */
  check_sub_bcast(2, (int64_t[]){0, 3}, 1, (int64_t[]){3});
}

static void test_bcast_random(void **state) {
  (void)state;
  uint64_t s = es_test_seed();
  for (int iter = 0; iter < 300; iter++) {
    int r = 1 + (int)(es_test_rand(&s) % 5);
    int64_t o[ES_MAX_RANK], da[ES_MAX_RANK], db[ES_MAX_RANK];
    for (int i = 0; i < r; i++)
      o[i] = 1 + (int64_t)(es_test_rand(&s) % 4);
    int ra = r - (int)(es_test_rand(&s) % 2), rb = r - (int)(es_test_rand(&s) % (size_t)(r + 1));
    for (int i = 0; i < ra; i++)
      da[i] = es_test_rand(&s) % 3 == 0 ? 1 : o[i + r - ra];
    for (int i = 0; i < rb; i++)
      db[i] = es_test_rand(&s) % 3 == 0 ? 1 : o[i + r - rb];
    check_sub_bcast(ra, da, rb, db);
  }
}

static void test_bcast_mismatch(void **state) {
  (void)state;
  es_tdesc a = kh_td(ES_DTYPE_FLOAT, 2, (int64_t[]){2, 3});
  es_tdesc b = kh_td(ES_DTYPE_FLOAT, 1, (int64_t[]){2});
  float x[6] = {0};
  es_tdesc o;
  void *out;
  ES_EXPECT_RC(eval2(ES_OP_Add, &a, x, &b, x, &o, &out), ES_EMODEL);
}

/* ==========================================================================
 * In place
 * ======================================================================== */

static void test_inplace(void **state) {
  (void)state;
  /* out aliases a: per-channel Mul, [2,3,2,9] * [3,1,1] */
  es_tdesc a = kh_td(ES_DTYPE_FLOAT, 4, (int64_t[]){2, 3, 2, 9});
  es_tdesc b = kh_td(ES_DTYPE_FLOAT, 3, (int64_t[]){3, 1, 1});
  float av[108], want[108], bv[3] = {2, -1, 0.5f};
  for (int i = 0; i < 108; i++)
    av[i] = (float)i;
  for (int i = 0; i < 108; i++)
    want[i] = av[i] * bv[(i / 18) % 3];
  const es_tdesc *d[2] = {&a, &b};
  kh_run h;
  ES_CHECK_RC(hand_infer(&h, ES_OP_Mul, 13, NULL, 0, 2, d, (const void *[]){NULL, NULL}));
  assert_int_equal(h.k.inplace, 0);
  ES_CHECK_RC(h.kern->run(&h.k, (const void *[]){av, bv}, (void *[]){av}, NULL));
  assert_floats_near(av, want, 108, 0);
  kh_end(&h);

  /* out aliases b: [4] - [3,4] -> in place on input 1 */
  es_tdesc a2 = kh_td(ES_DTYPE_FLOAT, 1, (int64_t[]){4});
  es_tdesc b2 = kh_td(ES_DTYPE_FLOAT, 2, (int64_t[]){3, 4});
  float a2v[4] = {10, 20, 30, 40}, b2v[12], w2[12];
  for (int i = 0; i < 12; i++) {
    b2v[i] = (float)i;
    w2[i] = a2v[i % 4] - (float)i;
  }
  const es_tdesc *d2[2] = {&a2, &b2};
  ES_CHECK_RC(hand_infer(&h, ES_OP_Sub, 13, NULL, 0, 2, d2, (const void *[]){NULL, NULL}));
  assert_int_equal(h.k.inplace, 1);
  ES_CHECK_RC(h.kern->run(&h.k, (const void *[]){a2v, b2v}, (void *[]){b2v}, NULL));
  assert_floats_near(b2v, w2, 12, 0);
  kh_end(&h);

  /* x * x with out == both inputs */
  float xv[40], w3[40];
  for (int i = 0; i < 40; i++) {
    xv[i] = (float)i - 20;
    w3[i] = xv[i] * xv[i];
  }
  es_tdesc x = kh_td(ES_DTYPE_FLOAT, 1, (int64_t[]){40});
  const es_tdesc *d3[2] = {&x, &x};
  ES_CHECK_RC(hand_infer(&h, ES_OP_Mul, 13, NULL, 0, 2, d3, (const void *[]){NULL, NULL}));
  assert_int_equal(h.k.inplace, 0);
  ES_CHECK_RC(h.kern->run(&h.k, (const void *[]){xv, xv}, (void *[]){xv}, NULL));
  assert_floats_near(xv, w3, 40, 0);
  kh_end(&h);

  /* Equal: bool output never aliases float inputs; unary in place */
  const es_tdesc *d4[2] = {&x, &x};
  ES_CHECK_RC(hand_infer(&h, ES_OP_Equal, 13, NULL, 0, 2, d4, (const void *[]){NULL, NULL}));
  assert_int_equal(h.k.inplace, -1);
  kh_end(&h);
  const es_tdesc *d5[1] = {&x};
  ES_CHECK_RC(hand_infer(&h, ES_OP_Relu, 13, NULL, 0, 1, d5, (const void *[]){NULL}));
  assert_int_equal(h.k.inplace, 0);
  ES_CHECK_RC(h.kern->run(&h.k, (const void *[]){xv}, (void *[]){xv}, NULL));
  assert_true(xv[0] == 400 && xv[20] == 0);
  kh_end(&h);
}

/* ==========================================================================
 * NHWC layouts
 * ======================================================================== */

/* op(a, b) with a and/or b given in NHWC (the others plain) must be the
 * plain result in NHWC order, computed without asking for conversions. */
static void check_nhwc_binary(es_op op, int ra, const int64_t *da, int a_nhwc, int rb,
                              const int64_t *db, int b_nhwc) {
  es_tdesc a = kh_td(ES_DTYPE_FLOAT, ra, da), b = kh_td(ES_DTYPE_FLOAT, rb, db);
  float *av = malloc(a.count * sizeof *av + 4), *bv = malloc(b.count * sizeof *bv + 4);
  float *an = malloc(a.count * sizeof *an + 4), *bn = malloc(b.count * sizeof *bn + 4);
  for (size_t i = 0; i < a.count; i++)
    av[i] = (float)(i * 7 % 23) - 5.5f;
  for (size_t i = 0; i < b.count; i++)
    bv[i] = (float)(i * 3 % 17) * 0.25f + 0.5f;
  es_tdesc o;
  void *plain;
  ES_CHECK_RC(eval2(op, &a, av, &b, bv, &o, &plain));
  float *want = malloc(o.count * sizeof *want + 4), *got = malloc(o.count * sizeof *got + 4);
  kh_reorder4_into(want, plain, &o, 1);
  es_mem_free(plain);

  es_tdesc la = a, lb = b;
  const float *ad = av, *bd = bv;
  if (a_nhwc) {
    la.layout = ES_LAYOUT_NHWC;
    kh_reorder4_into(an, av, &a, 1);
    ad = an;
  }
  if (b_nhwc) {
    lb.layout = ES_LAYOUT_NHWC;
    kh_reorder4_into(bn, bv, &b, 1);
    bd = bn;
  }
  const es_tdesc *d[2] = {&la, &lb};
  kh_run h;
  ES_CHECK_RC(hand_infer(&h, op, 13, NULL, 0, 2, d, (const void *[]){NULL, NULL}));
  assert_int_equal(h.out[0].layout, ES_LAYOUT_NHWC);
  assert_shape(&h.out[0], ES_DTYPE_FLOAT, o.rank, o.dims);
  ES_CHECK_RC(h.kern->run(&h.k, (const void *[]){ad, bd}, (void *[]){got}, NULL));
  assert_floats_near(got, want, o.count, 1e-6f);
  kh_end(&h);
  free(av);
  free(bv);
  free(an);
  free(bn);
  free(want);
  free(got);
}

static void test_nhwc_binary(void **state) {
  (void)state;
  const int64_t x[4] = {2, 3, 4, 5}, x1[4] = {1, 6, 3, 7};
  /* both NHWC, same shape */
  check_nhwc_binary(ES_OP_Sub, 4, x, 1, 4, x, 1);
  /* scalars on either side */
  check_nhwc_binary(ES_OP_Sub, 4, x, 1, 0, NULL, 0);
  check_nhwc_binary(ES_OP_Div, 1, (int64_t[]){1}, 0, 4, x, 1);
  /* per channel: [C,1,1], [1,C,1,1], [N,C,1,1] (the SE gate), both sides */
  check_nhwc_binary(ES_OP_Sub, 4, x, 1, 3, (int64_t[]){3, 1, 1}, 0);
  check_nhwc_binary(ES_OP_Sub, 4, (int64_t[]){1, 3, 1, 1}, 0, 4, x, 1);
  check_nhwc_binary(ES_OP_Mul, 4, x1, 1, 4, (int64_t[]){1, 6, 1, 1}, 0);
  check_nhwc_binary(ES_OP_Mul, 4, (int64_t[]){2, 3, 1, 1}, 0, 4, x, 1);
  /* one channel: [N,1,H,W], [H,W], [1,W] */
  check_nhwc_binary(ES_OP_Sub, 4, x, 1, 4, (int64_t[]){2, 1, 4, 5}, 0);
  check_nhwc_binary(ES_OP_Sub, 2, (int64_t[]){4, 5}, 0, 4, x, 1);
  check_nhwc_binary(ES_OP_Add, 4, x, 1, 2, (int64_t[]){1, 5}, 0);
  /* NHWC operands that broadcast themselves: [1,C,H,W] and [N,C,1,1] */
  check_nhwc_binary(ES_OP_Sub, 4, (int64_t[]){1, 3, 4, 5}, 1, 4, x, 1);
  check_nhwc_binary(ES_OP_Sub, 4, x, 1, 4, (int64_t[]){2, 3, 1, 1}, 1);
  check_nhwc_binary(ES_OP_Sub, 4, (int64_t[]){2, 1, 4, 1}, 1, 4, (int64_t[]){1, 3, 1, 5}, 1);
  /* Pow with the square fast path and in general */
  check_nhwc_binary(ES_OP_Pow, 4, x, 1, 0, NULL, 0);
  /* long rows: full 16-element chunks and tails */
  check_nhwc_binary(ES_OP_Mul, 4, (int64_t[]){1, 37, 5, 3}, 1, 4, (int64_t[]){1, 37, 1, 1}, 0);

  /* rank 5 (NDHWC): the same forms with a depth axis */
  const int64_t v[5] = {2, 3, 2, 4, 5};
  check_nhwc_binary(ES_OP_Add, 5, v, 1, 5, v, 1);
  check_nhwc_binary(ES_OP_Sub, 5, v, 1, 0, NULL, 0);
  check_nhwc_binary(ES_OP_Mul, 5, v, 1, 4, (int64_t[]){3, 1, 1, 1}, 0);
  check_nhwc_binary(ES_OP_Div, 5, (int64_t[]){2, 3, 1, 1, 1}, 0, 5, v, 1);
  check_nhwc_binary(ES_OP_Sub, 5, v, 1, 5, (int64_t[]){2, 1, 2, 4, 5}, 0);
  check_nhwc_binary(ES_OP_Sub, 3, (int64_t[]){2, 4, 5}, 0, 5, v, 1);
  check_nhwc_binary(ES_OP_Sub, 5, (int64_t[]){1, 3, 2, 4, 5}, 1, 5, v, 1);
  check_nhwc_binary(ES_OP_Mul, 5, (int64_t[]){1, 37, 2, 3, 3}, 1, 5, (int64_t[]){1, 37, 1, 1, 1},
                    0);
}

/* Static-exponent Pow, Equal's bool output and in-place aliasing in NHWC. */
static void test_nhwc_binary_misc(void **state) {
  (void)state;
  es_tdesc x = kh_td(ES_DTYPE_FLOAT, 4, (int64_t[]){1, 3, 2, 2});
  x.layout = ES_LAYOUT_NHWC;
  es_tdesc e = kh_td(ES_DTYPE_FLOAT, 0, NULL);
  float xv[12], w[12], two = 2;
  for (int i = 0; i < 12; i++) {
    xv[i] = (float)i - 4;
    w[i] = xv[i] * xv[i];
  }
  kh_run h;
  const es_tdesc *d[2] = {&x, &e};
  ES_CHECK_RC(hand_infer(&h, ES_OP_Pow, 13, NULL, 0, 2, d, (const void *[]){NULL, &two}));
  assert_int_equal(h.out[0].layout, ES_LAYOUT_NHWC);
  assert_int_equal(h.k.inplace, 0);
  ES_CHECK_RC(h.kern->run(&h.k, (const void *[]){xv, &two}, (void *[]){xv}, NULL));
  assert_floats_near(xv, w, 12, 0);
  kh_end(&h);

  /* per-channel compare: Equal(x, [C,1,1]) */
  es_tdesc c = kh_td(ES_DTYPE_FLOAT, 3, (int64_t[]){3, 1, 1});
  float cv[3] = {0, 4, 25};
  const es_tdesc *d2[2] = {&x, &c};
  ES_CHECK_RC(hand_infer(&h, ES_OP_Equal, 13, NULL, 0, 2, d2, (const void *[]){NULL, NULL}));
  assert_int_equal(h.out[0].layout, ES_LAYOUT_NHWC);
  assert_int_equal(h.out[0].dtype, ES_DTYPE_BOOL);
  uint8_t eq[12];
  ES_CHECK_RC(h.kern->run(&h.k, (const void *[]){xv, cv}, (void *[]){eq}, NULL));
  for (int i = 0; i < 12; i++)
    assert_int_equal(eq[i], xv[i] == cv[i % 3]);
  kh_end(&h);
}

/* Binary op on a and b must ask for other layouts (ES_KRELAYOUT) with
 * these want_plain / want_nhwc bits. */
static void expect_relayout(es_op op, const es_tdesc *a, const es_tdesc *b, uint32_t plain,
                            uint32_t nhwc) {
  kh_run h;
  ES_EXPECT_RC(hand_infer(&h, op, 13, NULL, 0, 2, (const es_tdesc *[]){a, b},
                          (const void *[]){NULL, NULL}),
               ES_KRELAYOUT);
  assert_int_equal(h.k.want_plain, plain);
  assert_int_equal(h.k.want_nhwc, nhwc);
  kh_end(&h);
}

/* Inputs that cannot be read in NHWC order are asked for in another
 * layout, once; with the conversions made, infer succeeds. */
static void test_nhwc_relayout(void **state) {
  (void)state;
  es_tdesc xn = kh_td(ES_DTYPE_FLOAT, 4, (int64_t[]){2, 3, 4, 5});
  xn.layout = ES_LAYOUT_NHWC;
  kh_run h;
  /* a full plain rank-4 tensor: converted to NHWC */
  es_tdesc full = kh_td(ES_DTYPE_FLOAT, 4, (int64_t[]){2, 3, 4, 5});
  expect_relayout(ES_OP_Add, &xn, &full, 0, 2);
  /* [1,C,H,1] rank 4 on the left: converted too */
  es_tdesc part = kh_td(ES_DTYPE_FLOAT, 4, (int64_t[]){1, 3, 4, 1});
  expect_relayout(ES_OP_Mul, &part, &xn, 0, 1);
  /* rank 3 [C,H,W] cannot become NHWC: the NHWC input goes plain */
  es_tdesc chw = kh_td(ES_DTYPE_FLOAT, 3, (int64_t[]){3, 4, 5});
  expect_relayout(ES_OP_Sub, &xn, &chw, 1, 0);
  /* a rank-5 output cannot be NHWC */
  es_tdesc r5 = kh_td(ES_DTYPE_FLOAT, 5, (int64_t[]){1, 1, 1, 1, 1});
  expect_relayout(ES_OP_Sub, &r5, &xn, 2, 0);
  /* NDHWC: a full plain rank-5 tensor is converted to NDHWC; a rank-4
   * [D,H,W,C]-sized one cannot be, so the NDHWC input goes plain */
  es_tdesc vn = kh_as_nhwc(kh_td(ES_DTYPE_FLOAT, 5, (int64_t[]){2, 3, 2, 4, 5}));
  es_tdesc full5 = kh_td(ES_DTYPE_FLOAT, 5, (int64_t[]){2, 3, 2, 4, 5});
  expect_relayout(ES_OP_Add, &full5, &vn, 0, 1);
  es_tdesc chw4 = kh_td(ES_DTYPE_FLOAT, 4, (int64_t[]){3, 2, 4, 5});
  expect_relayout(ES_OP_Add, &vn, &chw4, 1, 0);
  /* plain inputs only: plain output, whatever their shapes */
  ES_CHECK_RC(hand_infer(&h, ES_OP_Sub, 13, NULL, 0, 2, (const es_tdesc *[]){&full, &chw},
                         (const void *[]){NULL, NULL}));
  assert_int_equal(h.out[0].layout, ES_LAYOUT_PLAIN);
  kh_end(&h);
  /* type errors come before layout requests */
  es_tdesc fi = kh_td(ES_DTYPE_INT32, 4, (int64_t[]){2, 3, 4, 5});
  ES_EXPECT_RC(hand_infer(&h, ES_OP_Add, 13, NULL, 0, 2, (const es_tdesc *[]){&xn, &fi},
                          (const void *[]){NULL, NULL}),
               ES_EMODEL);
  kh_end(&h);
}

/* Unary ops keep the input's layout (same bytes order). */
static void test_nhwc_unary(void **state) {
  (void)state;
  es_tdesc x = kh_td(ES_DTYPE_FLOAT, 4, (int64_t[]){1, 2, 3, 3});
  x.layout = ES_LAYOUT_NHWC;
  float xv[18], got[18];
  for (int i = 0; i < 18; i++)
    xv[i] = (float)i - 9;
  kh_run h;
  const es_tdesc *d[1] = {&x};
  ES_CHECK_RC(hand_infer(&h, ES_OP_Relu, 13, NULL, 0, 1, d, (const void *[]){NULL}));
  assert_int_equal(h.out[0].layout, ES_LAYOUT_NHWC);
  ES_CHECK_RC(h.kern->run(&h.k, (const void *[]){xv}, (void *[]){got}, NULL));
  for (int i = 0; i < 18; i++)
    assert_true(got[i] == (xv[i] < 0 ? 0 : xv[i]));
  kh_end(&h);
  es_attr at[2] = {{.name = "min", .type = ES_ATTR_FLOAT, .f = -1},
                   {.name = "max", .type = ES_ATTR_FLOAT, .f = 2}};
  ES_CHECK_RC(hand_infer(&h, ES_OP_Clip, 6, at, 2, 1, d, (const void *[]){NULL}));
  assert_int_equal(h.out[0].layout, ES_LAYOUT_NHWC);
  kh_end(&h);
  es_attr to = {.name = "to", .type = ES_ATTR_INT, .i = ES_DTYPE_INT32};
  ES_CHECK_RC(hand_infer(&h, ES_OP_Cast, 13, &to, 1, 1, d, (const void *[]){NULL}));
  assert_int_equal(h.out[0].layout, ES_LAYOUT_NHWC);
  assert_int_equal(h.out[0].dtype, ES_DTYPE_INT32);
  kh_end(&h);
  es_tdesc p = kh_td(ES_DTYPE_FLOAT, 4, (int64_t[]){1, 2, 3, 3});
  const es_tdesc *dp[1] = {&p};
  ES_CHECK_RC(hand_infer(&h, ES_OP_Sigmoid, 13, NULL, 0, 1, dp, (const void *[]){NULL}));
  assert_int_equal(h.out[0].layout, ES_LAYOUT_PLAIN);
  kh_end(&h);
}

/* ==========================================================================
 * Arithmetic types
 * ======================================================================== */

static void test_int_arith(void **state) {
  (void)state;
  es_tdesc t = kh_td(ES_DTYPE_INT32, 1, (int64_t[]){5});
  int32_t a[5] = {7, -7, INT32_MIN, 5, INT32_MAX}, b[5] = {2, 2, -1, 0, 1};
  es_tdesc o;
  void *out;
  ES_CHECK_RC(eval2(ES_OP_Div, &t, a, &t, b, &o, &out));
  int32_t wd[5] = {3, -3, INT32_MIN, 0, INT32_MAX};
  assert_memory_equal(out, wd, sizeof wd);
  es_mem_free(out);
  ES_CHECK_RC(eval2(ES_OP_Add, &t, a, &t, b, &o, &out));
  int32_t wa[5] = {9, -5, INT32_MAX, 5, INT32_MIN};
  assert_memory_equal(out, wa, sizeof wa);
  es_mem_free(out);

  es_tdesc t64 = kh_td(ES_DTYPE_INT64, 1, (int64_t[]){3});
  es_tdesc s64 = kh_td(ES_DTYPE_INT64, 0, NULL);
  int64_t a64[3] = {3, -4, INT64_MAX}, k64 = 2;
  ES_CHECK_RC(eval2(ES_OP_Mul, &t64, a64, &s64, &k64, &o, &out));
  int64_t wm[3] = {6, -8, -2};
  assert_memory_equal(out, wm, sizeof wm);
  es_mem_free(out);

  es_tdesc u8 = kh_td(ES_DTYPE_UINT8, 1, (int64_t[]){3});
  uint8_t ua[3] = {250, 3, 9}, ub[3] = {10, 5, 0};
  ES_CHECK_RC(eval2(ES_OP_Sub, &u8, ua, &u8, ub, &o, &out));
  uint8_t ws[3] = {240, 254, 9};
  assert_memory_equal(out, ws, 3);
  es_mem_free(out);
  ES_CHECK_RC(eval2(ES_OP_Div, &u8, ua, &u8, ub, &o, &out));
  uint8_t wdv[3] = {25, 0, 0};
  assert_memory_equal(out, wdv, 3);
  es_mem_free(out);

  es_tdesc i8 = kh_td(ES_DTYPE_INT8, 1, (int64_t[]){2});
  int8_t ia[2] = {-128, 100}, ib[2] = {-1, 100};
  ES_CHECK_RC(eval2(ES_OP_Div, &i8, ia, &i8, ib, &o, &out));
  int8_t wi[2] = {-128, 1};
  assert_memory_equal(out, wi, 2);
  es_mem_free(out);
}

static void test_binary_types_invalid(void **state) {
  (void)state;
  es_tdesc f = kh_td(ES_DTYPE_FLOAT, 1, (int64_t[]){2});
  es_tdesc i = kh_td(ES_DTYPE_INT64, 1, (int64_t[]){2});
  es_tdesc bl = kh_td(ES_DTYPE_BOOL, 1, (int64_t[]){2});
  es_tdesc u8 = kh_td(ES_DTYPE_UINT8, 1, (int64_t[]){2});
  int64_t buf[2] = {0};
  es_tdesc o;
  void *out;
  ES_EXPECT_RC(eval2(ES_OP_Add, &f, buf, &i, buf, &o, &out), ES_EMODEL);
  ES_EXPECT_RC(eval2(ES_OP_Mul, &bl, buf, &bl, buf, &o, &out), ES_EMODEL);
  ES_EXPECT_RC(eval2(ES_OP_Equal, &f, buf, &i, buf, &o, &out), ES_EMODEL);
  ES_EXPECT_RC(eval2(ES_OP_Pow, &u8, buf, &u8, buf, &o, &out), ES_EMODEL);
  ES_EXPECT_RC(eval2(ES_OP_Pow, &f, buf, &bl, buf, &o, &out), ES_EMODEL);
  ES_EXPECT_RC(eval2(ES_OP_Pow, &f, buf, &u8, buf, &o, &out), ES_ENOTSUP);
  /* wrong input counts */
  const es_tdesc *d[3] = {&f, &f, &f};
  const void *p[3] = {buf, buf, buf};
  ES_EXPECT_RC(eval_op(ES_OP_Add, 13, NULL, 0, 1, d, p, &o, &out), ES_EMODEL);
  ES_EXPECT_RC(eval_op(ES_OP_Add, 13, NULL, 0, 3, d, p, &o, &out), ES_EMODEL);
  const es_tdesc *dn[2] = {&f, NULL};
  ES_EXPECT_RC(eval_op(ES_OP_Sub, 13, NULL, 0, 2, dn, p, &o, &out), ES_EMODEL);
}

/* ==========================================================================
 * Pow and Equal
 * ======================================================================== */

static void test_pow(void **state) {
  (void)state;
  es_tdesc x = kh_td(ES_DTYPE_FLOAT, 2, (int64_t[]){3, 7});
  float xv[21], w[21];
  for (int i = 0; i < 21; i++)
    xv[i] = (float)i * 0.5f;
  es_tdesc o;
  void *out;
  /* static scalar 2 (fast path), [1,1] shaped: output keeps the broadcast rank */
  es_tdesc e = kh_td(ES_DTYPE_FLOAT, 3, (int64_t[]){1, 1, 1});
  float two = 2, half = 0.5f, three = 3;
  ES_CHECK_RC(eval2(ES_OP_Pow, &x, xv, &e, &two, &o, &out));
  assert_shape(&o, ES_DTYPE_FLOAT, 3, (int64_t[]){1, 3, 7});
  for (int i = 0; i < 21; i++)
    w[i] = xv[i] * xv[i];
  assert_floats_near(out, w, 21, 0);
  es_mem_free(out);
  ES_CHECK_RC(eval2(ES_OP_Pow, &x, xv, &e, &half, &o, &out));
  for (int i = 0; i < 21; i++)
    w[i] = sqrtf(xv[i]);
  assert_floats_near(out, w, 21, 1e-6f);
  es_mem_free(out);
  ES_CHECK_RC(eval2(ES_OP_Pow, &x, xv, &e, &three, &o, &out));
  for (int i = 0; i < 21; i++)
    w[i] = powf(xv[i], 3);
  assert_floats_near(out, w, 21, 1e-6f);
  es_mem_free(out);
  /* int64 static exponent 2 with float base also takes the fast path */
  es_tdesc ei = kh_td(ES_DTYPE_INT64, 0, NULL);
  int64_t two64 = 2;
  ES_CHECK_RC(eval2(ES_OP_Pow, &x, xv, &ei, &two64, &o, &out));
  for (int i = 0; i < 21; i++)
    w[i] = xv[i] * xv[i];
  assert_floats_near(out, w, 21, 0);
  es_mem_free(out);

  /* integer bases */
  es_tdesc b32 = kh_td(ES_DTYPE_INT32, 1, (int64_t[]){5});
  int32_t base[5] = {2, -3, 1, -1, 5}, ex[5] = {10, 3, -4, -3, -1};
  ES_CHECK_RC(eval2(ES_OP_Pow, &b32, base, &b32, ex, &o, &out));
  int32_t wi[5] = {1024, -27, 1, -1, 0};
  assert_int_equal(o.dtype, ES_DTYPE_INT32);
  assert_memory_equal(out, wi, sizeof wi);
  es_mem_free(out);
  es_tdesc ef = kh_td(ES_DTYPE_FLOAT, 1, (int64_t[]){5});
  float exf[5] = {2, 2, 0.5f, 2, 1e30f};
  ES_CHECK_RC(eval2(ES_OP_Pow, &b32, base, &ef, exf, &o, &out));
  int32_t wf[5] = {4, 9, 1, 1, INT32_MAX};
  assert_memory_equal(out, wf, sizeof wf);
  es_mem_free(out);
}

static void test_equal(void **state) {
  (void)state;
  es_tdesc a = kh_td(ES_DTYPE_FLOAT, 2, (int64_t[]){2, 3});
  es_tdesc b = kh_td(ES_DTYPE_FLOAT, 1, (int64_t[]){3});
  float av[6] = {1, 2, 3, 4, NAN, 3}, bv[3] = {1, NAN, 3};
  es_tdesc o;
  void *out;
  ES_CHECK_RC(eval2(ES_OP_Equal, &a, av, &b, bv, &o, &out));
  assert_shape(&o, ES_DTYPE_BOOL, 2, (int64_t[]){2, 3});
  uint8_t w[6] = {1, 0, 1, 0, 0, 1};
  assert_memory_equal(out, w, 6);
  es_mem_free(out);
  es_tdesc bl = kh_td(ES_DTYPE_BOOL, 1, (int64_t[]){4});
  uint8_t x[4] = {0, 1, 1, 0}, y[4] = {0, 1, 0, 1};
  ES_CHECK_RC(eval2(ES_OP_Equal, &bl, x, &bl, y, &o, &out));
  uint8_t wb[4] = {1, 1, 0, 0};
  assert_memory_equal(out, wb, 4);
  es_mem_free(out);
}

/* ==========================================================================
 * Activations and Sqrt
 * ======================================================================== */

static void test_activations(void **state) {
  (void)state;
  enum { N = 37 };
  float x[N], w[N];
  for (int i = 0; i < N; i++)
    x[i] = (float)(i - 18) * 6.0f; /* -108 .. 108 */
  x[0] = NAN;
  es_tdesc t = kh_td(ES_DTYPE_FLOAT, 1, (int64_t[]){N});
  es_tdesc o;
  void *out;

  ES_CHECK_RC(eval1(ES_OP_Relu, 13, NULL, 0, &t, x, &o, &out));
  for (int i = 0; i < N; i++)
    w[i] = x[i] < 0 ? 0 : x[i];
  assert_floats_near(out, w, N, 0);
  es_mem_free(out);

  ES_CHECK_RC(eval1(ES_OP_Sigmoid, 13, NULL, 0, &t, x, &o, &out));
  for (int i = 0; i < N; i++)
    w[i] = (float)(1.0 / (1.0 + exp(-(double)x[i])));
  /* sigmoid(-108) is subnormal: compare those with an absolute bound */
  const float *got = out;
  for (int i = 0; i < N; i++) {
    if (isnan(w[i]))
      assert_true(isnan(got[i]));
    else if (fabsf(w[i]) < 1e-30f)
      assert_true(fabsf(got[i] - w[i]) < 1e-40f);
    else
      assert_floats_near(&got[i], &w[i], 1, 1e-6f);
  }
  es_mem_free(out);

  float small[5] = {-3, -1, 0, 1, 3};
  es_tdesc t5 = kh_td(ES_DTYPE_FLOAT, 1, (int64_t[]){5});
  ES_CHECK_RC(eval1(ES_OP_HardSigmoid, 13, NULL, 0, &t5, small, &o, &out));
  float wh[5] = {0, 0.3f, 0.5f, 0.7f, 1};
  assert_floats_near(out, wh, 5, 1e-6f);
  es_mem_free(out);
  es_attr hs[2] = {{.name = "alpha", .type = ES_ATTR_FLOAT, .f = 0.5f},
                   {.name = "beta", .type = ES_ATTR_FLOAT, .f = 0.25f}};
  ES_CHECK_RC(eval1(ES_OP_HardSigmoid, 6, hs, 2, &t5, small, &o, &out));
  float wh2[5] = {0, 0, 0.25f, 0.75f, 1};
  assert_floats_near(out, wh2, 5, 1e-6f);
  es_mem_free(out);

  float sq[4] = {0, 1, 4, 2};
  es_tdesc t4 = kh_td(ES_DTYPE_FLOAT, 2, (int64_t[]){2, 2});
  ES_CHECK_RC(eval1(ES_OP_Sqrt, 13, NULL, 0, &t4, sq, &o, &out));
  float ws[4] = {0, 1, 2, sqrtf(2)};
  assert_shape(&o, ES_DTYPE_FLOAT, 2, (int64_t[]){2, 2});
  assert_floats_near(out, ws, 4, 0);
  es_mem_free(out);

  es_tdesc ti = kh_td(ES_DTYPE_INT64, 1, (int64_t[]){3});
  int64_t iv[3] = {-5, 0, 7}, wi[3] = {0, 0, 7};
  ES_CHECK_RC(eval1(ES_OP_Relu, 14, NULL, 0, &ti, iv, &o, &out));
  assert_memory_equal(out, wi, sizeof wi);
  es_mem_free(out);
}

/* Sigmoid's exp is computed inline (vectorised), not by libm: dense sweep
 * against double precision, subnormal results included. */
static void test_sigmoid_accuracy(void **state) {
  (void)state;
  enum { N = 40001 };
  float *x = malloc(N * sizeof *x);
  for (int i = 0; i < N; i++)
    x[i] = -110.0f + 220.0f * (float)i / (N - 1);
  es_tdesc t = kh_td(ES_DTYPE_FLOAT, 1, (int64_t[]){N});
  es_tdesc o;
  void *out;
  ES_CHECK_RC(eval1(ES_OP_Sigmoid, 13, NULL, 0, &t, x, &o, &out));
  const float *got = out;
  for (int i = 0; i < N; i++) {
    double w = 1.0 / (1.0 + exp(-(double)x[i]));
    double err = fabs((double)got[i] - w);
    if (w >= 1.17549435e-38 ? err > 3e-7 * w : err > 1.5e-45)
      fail_msg("sigmoid(%.9g) = %.9g, want %.9g", (double)x[i], (double)got[i], w);
  }
  es_mem_free(out);
  free(x);
}

static void test_activations_invalid(void **state) {
  (void)state;
  es_tdesc ti = kh_td(ES_DTYPE_INT32, 1, (int64_t[]){2});
  es_tdesc tu = kh_td(ES_DTYPE_UINT8, 1, (int64_t[]){2});
  es_tdesc tf = kh_td(ES_DTYPE_FLOAT, 1, (int64_t[]){2});
  int32_t v[2] = {0};
  es_tdesc o;
  void *out;
  ES_EXPECT_RC(eval1(ES_OP_Sigmoid, 13, NULL, 0, &ti, v, &o, &out), ES_EMODEL);
  ES_EXPECT_RC(eval1(ES_OP_Sqrt, 13, NULL, 0, &ti, v, &o, &out), ES_EMODEL);
  ES_EXPECT_RC(eval1(ES_OP_HardSigmoid, 13, NULL, 0, &ti, v, &o, &out), ES_EMODEL);
  ES_EXPECT_RC(eval1(ES_OP_Relu, 13, NULL, 0, &tu, v, &o, &out), ES_EMODEL);
  es_attr bad = {.name = "alpha", .type = ES_ATTR_INT, .i = 1};
  ES_EXPECT_RC(eval1(ES_OP_HardSigmoid, 13, &bad, 1, &tf, v, &o, &out), ES_EMODEL);
  const es_tdesc *d[2] = {&tf, &tf};
  const void *p[2] = {v, v};
  ES_EXPECT_RC(eval_op(ES_OP_Relu, 13, NULL, 0, 2, d, p, &o, &out), ES_EMODEL);
  ES_EXPECT_RC(eval_op(ES_OP_Sigmoid, 13, NULL, 0, 0, d, p, &o, &out), ES_EMODEL);
}

/* ==========================================================================
 * Clip
 * ======================================================================== */

static void test_clip(void **state) {
  (void)state;
  float x[20], w[20];
  for (int i = 0; i < 20; i++)
    x[i] = (float)i - 10;
  es_tdesc t = kh_td(ES_DTYPE_FLOAT, 1, (int64_t[]){20});
  es_tdesc o;
  void *out;

  /* opset 6: attributes (ReLU6) */
  es_attr at[2] = {{.name = "min", .type = ES_ATTR_FLOAT, .f = 0},
                   {.name = "max", .type = ES_ATTR_FLOAT, .f = 6}};
  ES_CHECK_RC(eval1(ES_OP_Clip, 9, at, 2, &t, x, &o, &out));
  for (int i = 0; i < 20; i++)
    w[i] = x[i] < 0 ? 0 : x[i] > 6 ? 6 : x[i];
  assert_floats_near(out, w, 20, 0);
  es_mem_free(out);
  /* opset 6 defaults: no clipping */
  ES_CHECK_RC(eval1(ES_OP_Clip, 6, NULL, 0, &t, x, &o, &out));
  assert_floats_near(out, x, 20, 0);
  es_mem_free(out);

  /* opset 11: static inputs, max only (min omitted) */
  es_tdesc s = kh_td(ES_DTYPE_FLOAT, 0, NULL);
  float lo = -2, hi = 3;
  const es_tdesc *d[3] = {&t, NULL, &s};
  const void *p[3] = {x, NULL, &hi};
  ES_CHECK_RC(eval_op(ES_OP_Clip, 11, NULL, 0, 3, d, p, &o, &out));
  for (int i = 0; i < 20; i++)
    w[i] = x[i] > 3 ? 3 : x[i];
  assert_floats_near(out, w, 20, 0);
  es_mem_free(out);

  /* opset 12: bounds known only at run time */
  const es_tdesc *d2[3] = {&t, &s, &s};
  kh_run h;
  ES_CHECK_RC(hand_infer(&h, ES_OP_Clip, 12, NULL, 0, 3, d2, (const void *[]){NULL, NULL, NULL}));
  float res[20];
  ES_CHECK_RC(h.kern->run(&h.k, (const void *[]){x, &lo, &hi}, (void *[]){res}, NULL));
  for (int i = 0; i < 20; i++)
    w[i] = x[i] < -2 ? -2 : x[i] > 3 ? 3 : x[i];
  assert_floats_near(res, w, 20, 0);
  kh_end(&h);

  /* int8 with a [1]-shaped min */
  es_tdesc t8 = kh_td(ES_DTYPE_INT8, 1, (int64_t[]){4});
  es_tdesc s8 = kh_td(ES_DTYPE_INT8, 1, (int64_t[]){1});
  int8_t x8[4] = {-128, -5, 5, 127}, lo8 = -6;
  const es_tdesc *d3[2] = {&t8, &s8};
  const void *p3[2] = {x8, &lo8};
  ES_CHECK_RC(eval_op(ES_OP_Clip, 13, NULL, 0, 2, d3, p3, &o, &out));
  int8_t w8[4] = {-6, -5, 5, 127};
  assert_memory_equal(out, w8, 4);
  es_mem_free(out);
}

static void test_clip_invalid(void **state) {
  (void)state;
  es_tdesc t = kh_td(ES_DTYPE_FLOAT, 1, (int64_t[]){4});
  es_tdesc v2 = kh_td(ES_DTYPE_FLOAT, 1, (int64_t[]){2});
  es_tdesc si = kh_td(ES_DTYPE_INT64, 0, NULL);
  es_tdesc tb = kh_td(ES_DTYPE_BOOL, 1, (int64_t[]){4});
  float x[4] = {0};
  es_tdesc o;
  void *out;
  const void *p[3] = {x, x, x};
  const es_tdesc *d1[2] = {&t, &v2};
  ES_EXPECT_RC(eval_op(ES_OP_Clip, 13, NULL, 0, 2, d1, p, &o, &out), ES_EMODEL);
  const es_tdesc *d2[2] = {&t, &si};
  ES_EXPECT_RC(eval_op(ES_OP_Clip, 13, NULL, 0, 2, d2, p, &o, &out), ES_EMODEL);
  const es_tdesc *d3[3] = {&t, &t, &t};
  ES_EXPECT_RC(eval_op(ES_OP_Clip, 6, NULL, 0, 3, d3, p, &o, &out), ES_EMODEL);
  ES_EXPECT_RC(eval_op(ES_OP_Clip, 13, NULL, 0, 4, (const es_tdesc *[]){&t, &t, &t, &t},
                       (const void *[]){x, x, x, x}, &o, &out),
               ES_EMODEL);
  ES_EXPECT_RC(eval1(ES_OP_Clip, 13, NULL, 0, &tb, x, &o, &out), ES_EMODEL);
  es_tdesc ti = kh_td(ES_DTYPE_INT32, 1, (int64_t[]){4});
  ES_EXPECT_RC(eval1(ES_OP_Clip, 6, NULL, 0, &ti, x, &o, &out), ES_EMODEL);
  es_attr bad = {.name = "min", .type = ES_ATTR_STRING, .s = "0"};
  ES_EXPECT_RC(eval1(ES_OP_Clip, 6, &bad, 1, &t, x, &o, &out), ES_EMODEL);
}

/* ==========================================================================
 * Cast
 * ======================================================================== */

static int cast_to(es_dtype to, const es_tdesc *x, const void *xd, es_tdesc *o, void **out) {
  es_attr a = {.name = "to", .type = ES_ATTR_INT, .i = to};
  return eval1(ES_OP_Cast, 13, &a, 1, x, xd, o, out);
}

static void test_cast(void **state) {
  (void)state;
  float f[6] = {-1.7f, 2.9f, 0, NAN, 3e10f, -0.0f};
  es_tdesc tf = kh_td(ES_DTYPE_FLOAT, 2, (int64_t[]){2, 3});
  es_tdesc o;
  void *out;
  ES_CHECK_RC(cast_to(ES_DTYPE_INT32, &tf, f, &o, &out));
  assert_shape(&o, ES_DTYPE_INT32, 2, (int64_t[]){2, 3});
  int32_t w32[6] = {-1, 2, 0, 0, INT32_MAX, 0};
  assert_memory_equal(out, w32, sizeof w32);
  es_mem_free(out);
  ES_CHECK_RC(cast_to(ES_DTYPE_INT64, &tf, f, &o, &out));
  int64_t w64[6] = {-1, 2, 0, 0, 30000001024LL, 0};
  assert_memory_equal(out, w64, sizeof w64);
  es_mem_free(out);
  ES_CHECK_RC(cast_to(ES_DTYPE_BOOL, &tf, f, &o, &out));
  uint8_t wb[6] = {1, 1, 0, 1, 1, 0};
  assert_memory_equal(out, wb, 6);
  es_mem_free(out);

  int64_t iv[3] = {-3, 1LL << 40, 300};
  es_tdesc ti = kh_td(ES_DTYPE_INT64, 1, (int64_t[]){3});
  ES_CHECK_RC(cast_to(ES_DTYPE_FLOAT, &ti, iv, &o, &out));
  float wf[3] = {-3, 1099511627776.0f, 300};
  assert_memory_equal(out, wf, sizeof wf);
  es_mem_free(out);
  ES_CHECK_RC(cast_to(ES_DTYPE_INT32, &ti, iv, &o, &out));
  int32_t wn[3] = {-3, 0, 300};
  assert_memory_equal(out, wn, sizeof wn);
  es_mem_free(out);
  ES_CHECK_RC(cast_to(ES_DTYPE_UINT8, &ti, iv, &o, &out));
  uint8_t wu[3] = {253, 0, 44};
  assert_memory_equal(out, wu, 3);
  es_mem_free(out);

  uint8_t bv[3] = {0, 1, 1};
  es_tdesc tb = kh_td(ES_DTYPE_BOOL, 1, (int64_t[]){3});
  ES_CHECK_RC(cast_to(ES_DTYPE_INT64, &tb, bv, &o, &out));
  int64_t wbi[3] = {0, 1, 1};
  assert_memory_equal(out, wbi, sizeof wbi);
  es_mem_free(out);

  /* same type: a copy, offered in place */
  ES_CHECK_RC(cast_to(ES_DTYPE_INT64, &ti, iv, &o, &out));
  assert_memory_equal(out, iv, sizeof iv);
  es_mem_free(out);
  kh_run h;
  es_attr a = {.name = "to", .type = ES_ATTR_INT, .i = ES_DTYPE_INT64};
  const es_tdesc *d[1] = {&ti};
  ES_CHECK_RC(hand_infer(&h, ES_OP_Cast, 13, &a, 1, 1, d, (const void *[]){NULL}));
  assert_int_equal(h.k.inplace, 0);
  ES_CHECK_RC(h.kern->run(&h.k, (const void *[]){iv}, (void *[]){iv}, NULL));
  assert_int_equal(iv[2], 300);
  kh_end(&h);
  a.i = ES_DTYPE_FLOAT;
  ES_CHECK_RC(hand_infer(&h, ES_OP_Cast, 13, &a, 1, 1, d, (const void *[]){NULL}));
  assert_int_equal(h.k.inplace, -1);
  kh_end(&h);
}

static void test_cast_invalid(void **state) {
  (void)state;
  es_tdesc tf = kh_td(ES_DTYPE_FLOAT, 1, (int64_t[]){2});
  float f[2] = {0};
  es_tdesc o;
  void *out;
  ES_EXPECT_RC(eval1(ES_OP_Cast, 13, NULL, 0, &tf, f, &o, &out), ES_EMODEL);
  ES_EXPECT_RC(cast_to((es_dtype)11, &tf, f, &o, &out), ES_ENOTSUP); /* DOUBLE */
  ES_EXPECT_RC(cast_to((es_dtype)99, &tf, f, &o, &out), ES_EMODEL);
  ES_EXPECT_RC(cast_to((es_dtype)0, &tf, f, &o, &out), ES_EMODEL);
  es_attr bad = {.name = "to", .type = ES_ATTR_FLOAT, .f = 1};
  ES_EXPECT_RC(eval1(ES_OP_Cast, 13, &bad, 1, &tf, f, &o, &out), ES_EMODEL);
}

/* ==========================================================================
 * FusedElementwise
 * ======================================================================== */

/* Shorthands for programs. */
enum {
  ADD = ES_FE_ADD,
  SUB = ES_FE_SUB,
  MUL = ES_FE_MUL,
  DIV = ES_FE_DIV,
  POW = ES_FE_POW,
  RELU = ES_FE_RELU,
  SIGM = ES_FE_SIGMOID,
  HSIG = ES_FE_HARDSIGMOID,
  CLIP = ES_FE_CLIP,
  SQRT = ES_FE_SQRT,
  MOV = ES_FE_MOV,
};
#define IMM(i) ES_FE_IMM(i)

typedef struct fe_prog {
  const int64_t *w;
  size_t nw;
  const float *f;
  size_t nf;
} fe_prog;

#define FE_PROG(W, F) ((fe_prog){(W), sizeof(W) / sizeof(int64_t), (F), sizeof(F) / sizeof(float)})

static int fe_attrs(const fe_prog *pg, es_attr *at) {
  at[0] = (es_attr){.name = "_prog", .type = ES_ATTR_INTS, .n = pg->nw, .ints = pg->w};
  at[1] = (es_attr){.name = "_prog_f", .type = ES_ATTR_FLOATS, .n = pg->nf, .floats = pg->f};
  return pg->nf ? 2 : 1;
}

static int fe_eval(const fe_prog *pg, int n_in, const es_tdesc *const *d, const void *const *v,
                   es_tdesc *od, void **out) {
  es_attr at[2];
  int na = fe_attrs(pg, at);
  return eval_op(ES_OP_FusedElementwise, 13, at, na, n_in, d, v, od, out);
}

/* The program run instruction by instruction with the single-op kernels;
 * registers are whole tensors. Returns the output (es_mem), shape in *od. */
static float *fe_reference(const fe_prog *pg, int n_in, const es_tdesc *const *d,
                           const void *const *v, es_tdesc *od) {
  es_tdesc rd[ES_FE_MAX_REGS];
  void *rv[ES_FE_MAX_REGS] = {0};
  static const es_op bin[] = {[ADD] = ES_OP_Add, [SUB] = ES_OP_Sub, [MUL] = ES_OP_Mul,
                              [DIV] = ES_OP_Div, [POW] = ES_OP_Pow};
  es_tdesc scal = kh_td(ES_DTYPE_FLOAT, 0, NULL);
  int dst = 0;
  for (size_t i = 0; i < pg->nw; i += ES_FE_WORDS) {
    int64_t op = pg->w[i], a = pg->w[i + 1], b = pg->w[i + 2];
    dst = (int)pg->w[i + 3];
    const es_tdesc *ta = a < 0 ? &scal : a < n_in ? d[a] : &rd[a];
    const void *va = a < 0 ? (const void *)&pg->f[ES_FE_IMM_INDEX(a)] : a < n_in ? v[a] : rv[a];
    const es_tdesc *tb = b < 0 ? &scal : b < n_in ? d[b] : &rd[b];
    const void *vb = b < 0 ? (const void *)&pg->f[ES_FE_IMM_INDEX(b)] : b < n_in ? v[b] : rv[b];
    es_tdesc o;
    void *out = NULL;
    if (op <= POW) {
      ES_CHECK_RC(eval2(bin[op], ta, va, tb, vb, &o, &out));
    } else if (op == HSIG || op == CLIP) {
      const float *pq = vb;
      if (op == HSIG) {
        es_attr at[2] = {{.name = "alpha", .type = ES_ATTR_FLOAT, .f = pq[0]},
                         {.name = "beta", .type = ES_ATTR_FLOAT, .f = pq[1]}};
        ES_CHECK_RC(eval1(ES_OP_HardSigmoid, 13, at, 2, ta, va, &o, &out));
      } else {
        const es_tdesc *cd[3] = {ta, &scal, &scal};
        const void *cv[3] = {va, &pq[0], &pq[1]};
        ES_CHECK_RC(eval_op(ES_OP_Clip, 13, NULL, 0, 3, cd, cv, &o, &out));
      }
    } else if (op == MOV) {
      o = *ta;
      out = es_mem_aligned_alloc(ES_MEM_ENGINE, 64, ta->nbytes + 4);
      memcpy(out, va, ta->nbytes);
    } else {
      es_op u = op == RELU ? ES_OP_Relu : op == SIGM ? ES_OP_Sigmoid : ES_OP_Sqrt;
      ES_CHECK_RC(eval1(u, 13, NULL, 0, ta, va, &o, &out));
    }
    es_mem_free(rv[dst]);
    rd[dst] = o;
    rv[dst] = out;
  }
  *od = rd[dst];
  for (int r = 0; r < ES_FE_MAX_REGS; r++)
    if (r != dst)
      es_mem_free(rv[r]);
  return rv[dst];
}

/* Fused result == step-by-step result, bit for bit, same shape. */
static void check_fused(const fe_prog *pg, int n_in, const es_tdesc *const *d,
                        const void *const *v) {
  es_tdesc ro, fo;
  float *want = fe_reference(pg, n_in, d, v, &ro);
  void *got;
  ES_CHECK_RC(fe_eval(pg, n_in, d, v, &fo, &got));
  assert_shape(&fo, ES_DTYPE_FLOAT, ro.rank, ro.dims);
  assert_int_equal(fo.layout, ES_LAYOUT_PLAIN);
  assert_floats_near(got, want, ro.count, 0);
  es_mem_free(got);
  es_mem_free(want);
}

static float *fe_data(size_t n, uint64_t *s, float lo, float hi) {
  float *x = malloc(n * sizeof *x + 4);
  for (size_t i = 0; i < n; i++)
    x[i] = lo + (hi - lo) * (float)(es_test_rand(s) % 10000) / 10000.0f;
  return x;
}

static const int64_t hswish_w[] = {ADD, 0, IMM(0), 1, CLIP, 1, IMM(1), 1,
                                   MUL, 0, 1,      1, DIV,  1, IMM(3), 1};
static const float hswish_f[] = {3, 0, 6, 6};

static void test_fused_hardswish(void **state) {
  (void)state;
  uint64_t s = 1;
  fe_prog pg = FE_PROG(hswish_w, hswish_f);
  /* 210 elements: chunks and a tail; 3000: several blocks and a tail */
  int64_t shapes[2][4] = {{2, 3, 5, 7}, {1, 3, 1000, 1}};
  for (int t = 0; t < 2; t++) {
    es_tdesc x = kh_td(ES_DTYPE_FLOAT, 4, shapes[t]);
    float *xv = fe_data(x.count, &s, -8, 8);
    xv[0] = -3;
    xv[1] = 3;
    xv[2] = NAN;
    check_fused(&pg, 1, (const es_tdesc *[]){&x}, (const void *[]){xv});
    free(xv);
  }
}

/* LayerNorm's tail: (x - mean) / sqrt(var + eps) * gamma + beta, with the
 * per-row statistics [N,T,1] and per-column affine [D]. */
static void test_fused_layernorm(void **state) {
  (void)state;
  uint64_t s = 2;
  es_tdesc x = kh_td(ES_DTYPE_FLOAT, 3, (int64_t[]){2, 5, 37});
  es_tdesc st = kh_td(ES_DTYPE_FLOAT, 3, (int64_t[]){2, 5, 1});
  es_tdesc aff = kh_td(ES_DTYPE_FLOAT, 1, (int64_t[]){37});
  float *xv = fe_data(x.count, &s, -2, 2), *mean = fe_data(st.count, &s, -1, 1);
  float *var = fe_data(st.count, &s, 0, 3), *g = fe_data(37, &s, 0.5f, 1.5f);
  float *b = fe_data(37, &s, -1, 1);
  /* inputs: x, mean, var, gamma, beta */
  static const int64_t w[] = {SUB, 0, 1, 5,      ADD, 2, IMM(0), 6, SQRT, 6, 0, 6,
                              DIV, 5, 6, 5,      MUL, 5, 3,      5, ADD,  5, 4, 7};
  static const float f[] = {1e-5f};
  fe_prog pg = FE_PROG(w, f);
  const es_tdesc *d[5] = {&x, &st, &st, &aff, &aff};
  const void *v[5] = {xv, mean, var, g, b};
  check_fused(&pg, 5, d, v);
  /* the variance part: Pow by 2 and by 0.5 (the fast exponents) and a
   * general one */
  static const int64_t w2[] = {SUB, 0, 1, 2, POW, 2, IMM(0), 2, POW, 2, IMM(1), 3,
                               POW, 3, IMM(2), 3, ADD, 3, 2, 3};
  static const float f2[] = {2, 0.5f, 1.7f};
  fe_prog pg2 = FE_PROG(w2, f2);
  check_fused(&pg2, 2, d, v);
  free(xv);
  free(mean);
  free(var);
  free(g);
  free(b);
}

/* Every opcode over three randomly broadcast inputs. */
static void test_fused_broadcast(void **state) {
  (void)state;
  static const int64_t w[] = {
      SUB,  0, 1,      3,  /* t3 = a - b */
      SIGM, 2, 0,      4,  /* t4 = sigmoid(c) */
      MUL,  3, 4,      3,  /* t3 *= t4 */
      CLIP, 3, IMM(0), 5,  /* t5 = clip(t3, -0.5, 0.7) */
      ADD,  5, IMM(2), 5,  /* t5 += 1.5 */
      DIV,  1, 5,      6,  /* t6 = b / t5 */
      RELU, 6, 0,      6,
      HSIG, 6, IMM(3), 7,  /* alpha 0.3, beta 0.4 */
      MOV,  IMM(5), 0, 8,  /* load 2 */
      POW,  7, 8,      7,  /* exponent from a register */
      SQRT, 7, 0,      7,
      POW,  4, IMM(2), 9,  /* 1.5 */
      MUL,  9, 2,      9,
      ADD,  7, 9,      10,
      ADD,  10, 0,     10,
  };
  static const float f[] = {-0.5f, 0.7f, 1.5f, 0.3f, 0.4f, 2};
  fe_prog pg = FE_PROG(w, f);
  uint64_t s = es_test_seed();
  for (int iter = 0; iter < 200; iter++) {
    int r = 1 + (int)(es_test_rand(&s) % 5);
    int64_t o[ES_MAX_RANK], dd[3][ES_MAX_RANK];
    int rk[3];
    for (int i = 0; i < r; i++)
      o[i] = 1 + (int64_t)(es_test_rand(&s) % 5);
    if (iter % 10 == 0)
      o[r - 1] = 300 + iter; /* rows longer than a block */
    es_tdesc t[3];
    float *tv[3];
    for (int k = 0; k < 3; k++) {
      rk[k] = r - (int)(es_test_rand(&s) % (size_t)(r + 1));
      for (int i = 0; i < rk[k]; i++)
        dd[k][i] = es_test_rand(&s) % 3 == 0 ? 1 : o[i + r - rk[k]];
      t[k] = kh_td(ES_DTYPE_FLOAT, rk[k], dd[k]);
      tv[k] = fe_data(t[k].count, &s, -3, 3);
    }
    check_fused(&pg, 3, (const es_tdesc *[]){&t[0], &t[1], &t[2]},
                (const void *[]){tv[0], tv[1], tv[2]});
    for (int k = 0; k < 3; k++)
      free(tv[k]);
  }
}

/* Scalars only, one element, empty output, and a long SSA program whose
 * temporaries share a few scratch slots. */
static void test_fused_shapes(void **state) {
  (void)state;
  es_tdesc sc = kh_td(ES_DTYPE_FLOAT, 0, NULL);
  es_tdesc one = kh_td(ES_DTYPE_FLOAT, 2, (int64_t[]){1, 1});
  float a = 2.5f, b = -1;
  static const int64_t w[] = {MUL, 0, 1, 2, ADD, 2, IMM(0), 2, RELU, 2, 0, 3};
  static const float f[] = {4};
  fe_prog pg = FE_PROG(w, f);
  check_fused(&pg, 2, (const es_tdesc *[]){&sc, &one}, (const void *[]){&a, &b});
  es_tdesc empty = kh_td(ES_DTYPE_FLOAT, 2, (int64_t[]){0, 3});
  es_tdesc o;
  void *out;
  ES_CHECK_RC(fe_eval(&pg, 2, (const es_tdesc *[]){&empty, &sc}, (const void *[]){&a, &b}, &o,
                      &out));
  assert_shape(&o, ES_DTYPE_FLOAT, 2, (int64_t[]){0, 3});
  es_mem_free(out);

  /* short rows in multi-row blocks: a tile that changes with the outer
   * dim ([2,5,3] - [2,1,3]), a tile and a value per block ([4,6] / [6]
   * + [1]) */
  static const int64_t w2[] = {SUB, 0, 1, 2, MUL, 2, 2, 2};
  fe_prog pg2 = {w2, 8, NULL, 0};
  es_tdesc t1 = kh_td(ES_DTYPE_FLOAT, 3, (int64_t[]){2, 5, 3});
  es_tdesc t2 = kh_td(ES_DTYPE_FLOAT, 3, (int64_t[]){2, 1, 3});
  float v1[30], v2[6];
  for (int i = 0; i < 30; i++)
    v1[i] = (float)i * 0.5f;
  for (int i = 0; i < 6; i++)
    v2[i] = (float)i;
  check_fused(&pg2, 2, (const es_tdesc *[]){&t1, &t2}, (const void *[]){v1, v2});
  static const int64_t w3[] = {DIV, 0, 1, 3, ADD, 3, 2, 3};
  es_tdesc t3 = kh_td(ES_DTYPE_FLOAT, 2, (int64_t[]){4, 6});
  es_tdesc t4 = kh_td(ES_DTYPE_FLOAT, 1, (int64_t[]){6});
  es_tdesc t5 = kh_td(ES_DTYPE_FLOAT, 1, (int64_t[]){1});
  fe_prog pg3 = {w3, 8, NULL, 0};
  float v4[6] = {1, -2, 3, 0.5f, 7, -0.25f};
  check_fused(&pg3, 3, (const es_tdesc *[]){&t3, &t4, &t5}, (const void *[]){v1, v4, &a});

  /* t(i+1) = t(i) * x + i, 30 instructions, SSA: 2 slots suffice */
  enum { N = 30 };
  int64_t lw[N * 4];
  float lf[N];
  for (int i = 0; i < N; i++) {
    lf[i] = (float)i * 0.01f;
    int64_t src = i == 0 ? 0 : i;
    int64_t tmp[4] = {i % 2 ? MUL : ADD, src, i % 2 ? 0 : IMM(i), i + 1};
    memcpy(&lw[i * 4], tmp, sizeof tmp);
  }
  lw[(N - 1) * 4 + 3] = N; /* registers 1..30 */
  fe_prog lp = {lw, N * 4, lf, N};
  es_tdesc x = kh_td(ES_DTYPE_FLOAT, 1, (int64_t[]){700});
  uint64_t s = 3;
  float *xv = fe_data(700, &s, -1, 1);
  check_fused(&lp, 1, (const es_tdesc *[]){&x}, (const void *[]){xv});
  kh_run h;
  es_attr at[2];
  int na = fe_attrs(&lp, at);
  ES_CHECK_RC(hand_infer(&h, ES_OP_FusedElementwise, 13, at, na, 1, (const es_tdesc *[]){&x},
                         (const void *[]){NULL}));
  assert_true(h.k.scratch_bytes <= 2 * 256 * sizeof(float));
  assert_int_equal(h.k.inplace, 0);
  kh_end(&h);
  free(xv);
}

/* NHWC inputs with a plain per-channel gate (the SE block: HardSigmoid of a
 * [N,C,1,1] tensor times the map), in place; conversion requests. */
static void test_fused_nhwc(void **state) {
  (void)state;
  uint64_t s = 4;
  es_tdesc x = kh_td(ES_DTYPE_FLOAT, 4, (int64_t[]){1, 6, 5, 7});
  es_tdesc g = kh_td(ES_DTYPE_FLOAT, 4, (int64_t[]){1, 6, 1, 1});
  float *xv = fe_data(x.count, &s, -4, 4), *gv = fe_data(6, &s, -4, 4);
  static const int64_t w[] = {HSIG, 1, IMM(0), 2, MUL, 0, 2, 2};
  static const float f[] = {0.2f, 0.5f};
  fe_prog pg = FE_PROG(w, f);
  es_tdesc po;
  float *plain = fe_reference(&pg, 2, (const es_tdesc *[]){&x, &g}, (const void *[]){xv, gv},
                              &po);
  float *want = malloc(x.count * sizeof *want), *xn = malloc(x.count * sizeof *xn);
  kh_reorder4_into(want, plain, &x, 1);
  kh_reorder4_into(xn, xv, &x, 1);
  es_tdesc xl = x;
  xl.layout = ES_LAYOUT_NHWC;
  kh_run h;
  es_attr at[2];
  int na = fe_attrs(&pg, at);
  const es_tdesc *d[2] = {&xl, &g};
  ES_CHECK_RC(hand_infer(&h, ES_OP_FusedElementwise, 13, at, na, 2, d,
                         (const void *[]){NULL, NULL}));
  assert_int_equal(h.out[0].layout, ES_LAYOUT_NHWC);
  assert_int_equal(h.k.inplace, 0);
  void *scratch = es_mem_aligned_alloc(ES_MEM_ENGINE, 64, h.k.scratch_bytes + 1);
  ES_CHECK_RC(h.kern->run(&h.k, (const void *[]){xn, gv}, (void *[]){xn}, scratch));
  assert_floats_near(xn, want, x.count, 0);
  es_mem_free(scratch);
  kh_end(&h);

  /* a full plain map next to an NHWC one is asked for in NHWC; a rank-3
   * [C,H,W] one cannot be, so the NHWC input goes plain */
  static const int64_t w2[] = {ADD, 0, 1, 2};
  fe_prog pg2 = {w2, 4, NULL, 0};
  na = fe_attrs(&pg2, at);
  ES_EXPECT_RC(hand_infer(&h, ES_OP_FusedElementwise, 13, at, na, 2,
                          (const es_tdesc *[]){&x, &xl}, (const void *[]){NULL, NULL}),
               ES_KRELAYOUT);
  assert_int_equal(h.k.want_nhwc, 1);
  kh_end(&h);
  es_tdesc chw = kh_td(ES_DTYPE_FLOAT, 3, (int64_t[]){6, 5, 7});
  ES_EXPECT_RC(hand_infer(&h, ES_OP_FusedElementwise, 13, at, na, 2,
                          (const es_tdesc *[]){&xl, &chw}, (const void *[]){NULL, NULL}),
               ES_KRELAYOUT);
  assert_int_equal(h.k.want_plain, 1);
  kh_end(&h);
  free(xv);
  free(gv);
  free(want);
  free(xn);
  es_mem_free(plain);

  /* NDHWC: r3d_18's unfused residual tail, Relu(a + b) of two NDHWC maps,
   * in place; and the SE-style gate of a [N,C,1,1,1] plain tensor */
  es_tdesc a5 = kh_td(ES_DTYPE_FLOAT, 5, (int64_t[]){1, 19, 3, 5, 4});
  es_tdesc g5 = kh_td(ES_DTYPE_FLOAT, 5, (int64_t[]){1, 19, 1, 1, 1});
  static const int64_t w3[] = {ADD, 0, 1, 2, RELU, 2, 0, 2};
  static const int64_t w4[] = {HSIG, 1, IMM(0), 2, MUL, 0, 2, 2};
  fe_prog progs[2] = {{w3, 8, NULL, 0}, FE_PROG(w4, f)};
  const es_tdesc *second[2] = {&a5, &g5};
  for (int t = 0; t < 2; t++) {
    float *av = fe_data(a5.count, &s, -4, 4), *bv = fe_data(second[t]->count, &s, -4, 4);
    plain = fe_reference(&progs[t], 2, (const es_tdesc *[]){&a5, second[t]},
                         (const void *[]){av, bv}, &po);
    want = malloc(a5.count * sizeof *want);
    float *an = malloc(a5.count * sizeof *an), *bn = malloc(a5.count * sizeof *bn);
    kh_reorder4_into(want, plain, &a5, 1);
    kh_reorder4_into(an, av, &a5, 1);
    kh_reorder4_into(bn, bv, second[t], 1);
    es_tdesc al = kh_as_nhwc(a5), bl = t == 0 ? kh_as_nhwc(a5) : g5;
    na = fe_attrs(&progs[t], at);
    ES_CHECK_RC(hand_infer(&h, ES_OP_FusedElementwise, 13, at, na, 2,
                           (const es_tdesc *[]){&al, &bl}, (const void *[]){NULL, NULL}));
    assert_int_equal(h.out[0].layout, ES_LAYOUT_NHWC);
    assert_int_equal(h.k.inplace, 0);
    scratch = es_mem_aligned_alloc(ES_MEM_ENGINE, 64, h.k.scratch_bytes + 1);
    ES_CHECK_RC(h.kern->run(&h.k, (const void *[]){an, bn}, (void *[]){an}, scratch));
    assert_floats_near(an, want, a5.count, 0);
    es_mem_free(scratch);
    kh_end(&h);
    free(av);
    free(bv);
    free(an);
    free(bn);
    free(want);
    es_mem_free(plain);
  }
}

static void test_fused_invalid(void **state) {
  (void)state;
  es_tdesc x = kh_td(ES_DTYPE_FLOAT, 1, (int64_t[]){4});
  es_tdesc xi = kh_td(ES_DTYPE_INT32, 1, (int64_t[]){4});
  float xv[4] = {0};
  const es_tdesc *d[2] = {&x, &x};
  const void *v[2] = {xv, xv};
  es_tdesc o;
  void *out;
  static const float f[] = {1, 2};
  struct {
    int64_t w[8];
    size_t nw;
  } bad[] = {
      {{ADD, 0, 1}, 3},                  /* not a whole instruction */
      {{0, 0, 1, 2}, 4},                 /* opcode 0 */
      {{ES_FE_NOPCODES, 0, 1, 2}, 4},    /* opcode past the last */
      {{ADD, 0, 3, 2}, 4},               /* temporary read before written */
      {{ADD, 0, 32, 2}, 4},              /* register past the file */
      {{ADD, 0, 1, 1}, 4},               /* writes an input */
      {{ADD, 0, 1, 32}, 4},              /* writes past the file */
      {{ADD, 0, IMM(2), 2}, 4},          /* immediate past _prog_f */
      {{CLIP, 0, 1, 2}, 4},              /* Clip bounds from a register */
      {{HSIG, 0, IMM(1), 2}, 4},         /* second parameter past _prog_f */
      {{RELU, 2, 0, 2}, 4},              /* reads its own unwritten dst */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    fe_prog pg = {bad[i].w, bad[i].nw, f, 2};
    ES_EXPECT_RC(fe_eval(&pg, 2, d, v, &o, &out), ES_EMODEL);
  }
  static const int64_t ok[] = {ADD, 0, 1, 2};
  fe_prog pg = {ok, 4, NULL, 0};
  ES_CHECK_RC(fe_eval(&pg, 2, d, v, &o, &out));
  es_mem_free(out);
  /* no program, wrong input types and counts, mismatched shapes */
  ES_EXPECT_RC(eval_op(ES_OP_FusedElementwise, 13, NULL, 0, 2, d, v, &o, &out), ES_EMODEL);
  ES_EXPECT_RC(fe_eval(&pg, 2, (const es_tdesc *[]){&x, &xi}, v, &o, &out), ES_EMODEL);
  ES_EXPECT_RC(fe_eval(&pg, 0, d, v, &o, &out), ES_EMODEL);
  ES_EXPECT_RC(fe_eval(&pg, 2, (const es_tdesc *[]){&x, NULL}, v, &o, &out), ES_EMODEL);
  es_tdesc x3 = kh_td(ES_DTYPE_FLOAT, 1, (int64_t[]){3});
  ES_EXPECT_RC(fe_eval(&pg, 2, (const es_tdesc *[]){&x, &x3}, v, &o, &out), ES_EMODEL);
  es_attr wrong = {.name = "_prog", .type = ES_ATTR_FLOATS, .n = 2, .floats = f};
  ES_EXPECT_RC(eval_op(ES_OP_FusedElementwise, 13, &wrong, 1, 2, d, v, &o, &out), ES_EMODEL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bcast_fast_paths),
      cmocka_unit_test(test_bcast_random),
      cmocka_unit_test(test_bcast_mismatch),
      cmocka_unit_test(test_inplace),
      cmocka_unit_test(test_nhwc_binary),
      cmocka_unit_test(test_nhwc_binary_misc),
      cmocka_unit_test(test_nhwc_relayout),
      cmocka_unit_test(test_nhwc_unary),
      cmocka_unit_test(test_int_arith),
      cmocka_unit_test(test_binary_types_invalid),
      cmocka_unit_test(test_pow),
      cmocka_unit_test(test_equal),
      cmocka_unit_test(test_activations),
      cmocka_unit_test(test_sigmoid_accuracy),
      cmocka_unit_test(test_activations_invalid),
      cmocka_unit_test(test_clip),
      cmocka_unit_test(test_clip_invalid),
      cmocka_unit_test(test_cast),
      cmocka_unit_test(test_cast_invalid),
      cmocka_unit_test(test_fused_hardswish),
      cmocka_unit_test(test_fused_layernorm),
      cmocka_unit_test(test_fused_broadcast),
      cmocka_unit_test(test_fused_shapes),
      cmocka_unit_test(test_fused_nhwc),
      cmocka_unit_test(test_fused_invalid),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
