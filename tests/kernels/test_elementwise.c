/* Elementwise kernels: Add, Sub, Mul, Div, Pow, Equal, Relu, Sigmoid,
 * HardSigmoid, Clip, Sqrt, Cast.
 *
 * Nodes are built by hand and evaluated with es_kernel_eval; broadcasting is
 * checked against a naive N-d reference on random shapes (every fast path
 * and the general walk), in-place runs and run-time Clip bounds go through a
 * hand-made es_kinst, and invalid nodes must fail with the right code. */
#include "es_test.h"

#include <math.h>
#include <string.h>

#include "kernels/kernel.h"

/* ==========================================================================
 * Helpers
 * ======================================================================== */

static int dummy_io_[8];

static es_node node_make(es_op op, int n_in, es_attr *attrs, int n_attr) {
  es_node n = {.name = "t",
               .op = op,
               .n_in = n_in,
               .n_out = 1,
               .in = dummy_io_,
               .out = dummy_io_,
               .n_attr = n_attr,
               .attrs = attrs};
  return n;
}

static es_tdesc desc_make(es_dtype t, int rank, const int64_t *dims) {
  es_tdesc d;
  memset(&d, 0, sizeof d);
  int rc = es_tdesc_set(&d, t, rank, dims);
  assert_int_equal(rc, 0);
  return d;
}

/* Evaluate op with inputs (desc, data); one output. */
static int eval_op(es_op op, int64_t opset, es_attr *attrs, int n_attr, int n_in,
                   const es_tdesc *const *d, const void *const *data, es_tdesc *od, void **out) {
  es_node n = node_make(op, n_in, attrs, n_attr);
  return es_kernel_eval(&n, opset, n_in, d, data, 1, od, out);
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

/* Run a kernel by hand: infer into a private context, then run with caller
 * buffers (so out may alias an input) and in_static as given. */
typedef struct hand_run {
  es_ctx ctx;
  es_kinst k;
  es_tdesc out;
  es_tdesc *outp[1];
  es_node node;
  const es_kernel *kern;
} hand_run;

static int hand_infer(hand_run *h, es_op op, int64_t opset, es_attr *attrs, int n_attr, int n_in,
                      const es_tdesc *const *d, const void *const *in_static) {
  memset(h, 0, sizeof *h);
  h->node = node_make(op, n_in, attrs, n_attr);
  h->kern = es_kernel_for(op);
  assert_non_null(h->kern);
  h->outp[0] = &h->out;
  h->k = (es_kinst){.node = &h->node,
                    .opset = opset,
                    .n_in = n_in,
                    .n_out = 1,
                    .in = d,
                    .out = h->outp,
                    .in_static = in_static,
                    .inplace = -1,
                    .ctx = &h->ctx};
  es_node_label(&h->node, h->k.label, sizeof h->k.label);
  return h->kern->infer(&h->k);
}

static void hand_done(hand_run *h) { es_ctx_free_all(&h->ctx); }

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
  es_tdesc a = desc_make(ES_DTYPE_FLOAT, ra, da), b = desc_make(ES_DTYPE_FLOAT, rb, db);
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
  es_tdesc a = desc_make(ES_DTYPE_FLOAT, 2, (int64_t[]){2, 3});
  es_tdesc b = desc_make(ES_DTYPE_FLOAT, 1, (int64_t[]){2});
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
  es_tdesc a = desc_make(ES_DTYPE_FLOAT, 4, (int64_t[]){2, 3, 2, 9});
  es_tdesc b = desc_make(ES_DTYPE_FLOAT, 3, (int64_t[]){3, 1, 1});
  float av[108], want[108], bv[3] = {2, -1, 0.5f};
  for (int i = 0; i < 108; i++)
    av[i] = (float)i;
  for (int i = 0; i < 108; i++)
    want[i] = av[i] * bv[(i / 18) % 3];
  const es_tdesc *d[2] = {&a, &b};
  hand_run h;
  ES_CHECK_RC(hand_infer(&h, ES_OP_Mul, 13, NULL, 0, 2, d, (const void *[]){NULL, NULL}));
  assert_int_equal(h.k.inplace, 0);
  ES_CHECK_RC(h.kern->run(&h.k, (const void *[]){av, bv}, (void *[]){av}, NULL));
  assert_floats_near(av, want, 108, 0);
  hand_done(&h);

  /* out aliases b: [4] - [3,4] -> in place on input 1 */
  es_tdesc a2 = desc_make(ES_DTYPE_FLOAT, 1, (int64_t[]){4});
  es_tdesc b2 = desc_make(ES_DTYPE_FLOAT, 2, (int64_t[]){3, 4});
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
  hand_done(&h);

  /* x * x with out == both inputs */
  float xv[40], w3[40];
  for (int i = 0; i < 40; i++) {
    xv[i] = (float)i - 20;
    w3[i] = xv[i] * xv[i];
  }
  es_tdesc x = desc_make(ES_DTYPE_FLOAT, 1, (int64_t[]){40});
  const es_tdesc *d3[2] = {&x, &x};
  ES_CHECK_RC(hand_infer(&h, ES_OP_Mul, 13, NULL, 0, 2, d3, (const void *[]){NULL, NULL}));
  assert_int_equal(h.k.inplace, 0);
  ES_CHECK_RC(h.kern->run(&h.k, (const void *[]){xv, xv}, (void *[]){xv}, NULL));
  assert_floats_near(xv, w3, 40, 0);
  hand_done(&h);

  /* Equal: bool output never aliases float inputs; unary in place */
  const es_tdesc *d4[2] = {&x, &x};
  ES_CHECK_RC(hand_infer(&h, ES_OP_Equal, 13, NULL, 0, 2, d4, (const void *[]){NULL, NULL}));
  assert_int_equal(h.k.inplace, -1);
  hand_done(&h);
  const es_tdesc *d5[1] = {&x};
  ES_CHECK_RC(hand_infer(&h, ES_OP_Relu, 13, NULL, 0, 1, d5, (const void *[]){NULL}));
  assert_int_equal(h.k.inplace, 0);
  ES_CHECK_RC(h.kern->run(&h.k, (const void *[]){xv}, (void *[]){xv}, NULL));
  assert_true(xv[0] == 400 && xv[20] == 0);
  hand_done(&h);
}

/* ==========================================================================
 * Arithmetic types
 * ======================================================================== */

static void test_int_arith(void **state) {
  (void)state;
  es_tdesc t = desc_make(ES_DTYPE_INT32, 1, (int64_t[]){5});
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

  es_tdesc t64 = desc_make(ES_DTYPE_INT64, 1, (int64_t[]){3});
  es_tdesc s64 = desc_make(ES_DTYPE_INT64, 0, NULL);
  int64_t a64[3] = {3, -4, INT64_MAX}, k64 = 2;
  ES_CHECK_RC(eval2(ES_OP_Mul, &t64, a64, &s64, &k64, &o, &out));
  int64_t wm[3] = {6, -8, -2};
  assert_memory_equal(out, wm, sizeof wm);
  es_mem_free(out);

  es_tdesc u8 = desc_make(ES_DTYPE_UINT8, 1, (int64_t[]){3});
  uint8_t ua[3] = {250, 3, 9}, ub[3] = {10, 5, 0};
  ES_CHECK_RC(eval2(ES_OP_Sub, &u8, ua, &u8, ub, &o, &out));
  uint8_t ws[3] = {240, 254, 9};
  assert_memory_equal(out, ws, 3);
  es_mem_free(out);
  ES_CHECK_RC(eval2(ES_OP_Div, &u8, ua, &u8, ub, &o, &out));
  uint8_t wdv[3] = {25, 0, 0};
  assert_memory_equal(out, wdv, 3);
  es_mem_free(out);

  es_tdesc i8 = desc_make(ES_DTYPE_INT8, 1, (int64_t[]){2});
  int8_t ia[2] = {-128, 100}, ib[2] = {-1, 100};
  ES_CHECK_RC(eval2(ES_OP_Div, &i8, ia, &i8, ib, &o, &out));
  int8_t wi[2] = {-128, 1};
  assert_memory_equal(out, wi, 2);
  es_mem_free(out);
}

static void test_binary_types_invalid(void **state) {
  (void)state;
  es_tdesc f = desc_make(ES_DTYPE_FLOAT, 1, (int64_t[]){2});
  es_tdesc i = desc_make(ES_DTYPE_INT64, 1, (int64_t[]){2});
  es_tdesc bl = desc_make(ES_DTYPE_BOOL, 1, (int64_t[]){2});
  es_tdesc u8 = desc_make(ES_DTYPE_UINT8, 1, (int64_t[]){2});
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
  es_tdesc x = desc_make(ES_DTYPE_FLOAT, 2, (int64_t[]){3, 7});
  float xv[21], w[21];
  for (int i = 0; i < 21; i++)
    xv[i] = (float)i * 0.5f;
  es_tdesc o;
  void *out;
  /* static scalar 2 (fast path), [1,1] shaped: output keeps the broadcast rank */
  es_tdesc e = desc_make(ES_DTYPE_FLOAT, 3, (int64_t[]){1, 1, 1});
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
  es_tdesc ei = desc_make(ES_DTYPE_INT64, 0, NULL);
  int64_t two64 = 2;
  ES_CHECK_RC(eval2(ES_OP_Pow, &x, xv, &ei, &two64, &o, &out));
  for (int i = 0; i < 21; i++)
    w[i] = xv[i] * xv[i];
  assert_floats_near(out, w, 21, 0);
  es_mem_free(out);

  /* integer bases */
  es_tdesc b32 = desc_make(ES_DTYPE_INT32, 1, (int64_t[]){5});
  int32_t base[5] = {2, -3, 1, -1, 5}, ex[5] = {10, 3, -4, -3, -1};
  ES_CHECK_RC(eval2(ES_OP_Pow, &b32, base, &b32, ex, &o, &out));
  int32_t wi[5] = {1024, -27, 1, -1, 0};
  assert_int_equal(o.dtype, ES_DTYPE_INT32);
  assert_memory_equal(out, wi, sizeof wi);
  es_mem_free(out);
  es_tdesc ef = desc_make(ES_DTYPE_FLOAT, 1, (int64_t[]){5});
  float exf[5] = {2, 2, 0.5f, 2, 1e30f};
  ES_CHECK_RC(eval2(ES_OP_Pow, &b32, base, &ef, exf, &o, &out));
  int32_t wf[5] = {4, 9, 1, 1, INT32_MAX};
  assert_memory_equal(out, wf, sizeof wf);
  es_mem_free(out);
}

static void test_equal(void **state) {
  (void)state;
  es_tdesc a = desc_make(ES_DTYPE_FLOAT, 2, (int64_t[]){2, 3});
  es_tdesc b = desc_make(ES_DTYPE_FLOAT, 1, (int64_t[]){3});
  float av[6] = {1, 2, 3, 4, NAN, 3}, bv[3] = {1, NAN, 3};
  es_tdesc o;
  void *out;
  ES_CHECK_RC(eval2(ES_OP_Equal, &a, av, &b, bv, &o, &out));
  assert_shape(&o, ES_DTYPE_BOOL, 2, (int64_t[]){2, 3});
  uint8_t w[6] = {1, 0, 1, 0, 0, 1};
  assert_memory_equal(out, w, 6);
  es_mem_free(out);
  es_tdesc bl = desc_make(ES_DTYPE_BOOL, 1, (int64_t[]){4});
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
  es_tdesc t = desc_make(ES_DTYPE_FLOAT, 1, (int64_t[]){N});
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
  es_tdesc t5 = desc_make(ES_DTYPE_FLOAT, 1, (int64_t[]){5});
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
  es_tdesc t4 = desc_make(ES_DTYPE_FLOAT, 2, (int64_t[]){2, 2});
  ES_CHECK_RC(eval1(ES_OP_Sqrt, 13, NULL, 0, &t4, sq, &o, &out));
  float ws[4] = {0, 1, 2, sqrtf(2)};
  assert_shape(&o, ES_DTYPE_FLOAT, 2, (int64_t[]){2, 2});
  assert_floats_near(out, ws, 4, 0);
  es_mem_free(out);

  es_tdesc ti = desc_make(ES_DTYPE_INT64, 1, (int64_t[]){3});
  int64_t iv[3] = {-5, 0, 7}, wi[3] = {0, 0, 7};
  ES_CHECK_RC(eval1(ES_OP_Relu, 14, NULL, 0, &ti, iv, &o, &out));
  assert_memory_equal(out, wi, sizeof wi);
  es_mem_free(out);
}

static void test_activations_invalid(void **state) {
  (void)state;
  es_tdesc ti = desc_make(ES_DTYPE_INT32, 1, (int64_t[]){2});
  es_tdesc tu = desc_make(ES_DTYPE_UINT8, 1, (int64_t[]){2});
  es_tdesc tf = desc_make(ES_DTYPE_FLOAT, 1, (int64_t[]){2});
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
  es_tdesc t = desc_make(ES_DTYPE_FLOAT, 1, (int64_t[]){20});
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
  es_tdesc s = desc_make(ES_DTYPE_FLOAT, 0, NULL);
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
  hand_run h;
  ES_CHECK_RC(hand_infer(&h, ES_OP_Clip, 12, NULL, 0, 3, d2, (const void *[]){NULL, NULL, NULL}));
  float res[20];
  ES_CHECK_RC(h.kern->run(&h.k, (const void *[]){x, &lo, &hi}, (void *[]){res}, NULL));
  for (int i = 0; i < 20; i++)
    w[i] = x[i] < -2 ? -2 : x[i] > 3 ? 3 : x[i];
  assert_floats_near(res, w, 20, 0);
  hand_done(&h);

  /* int8 with a [1]-shaped min */
  es_tdesc t8 = desc_make(ES_DTYPE_INT8, 1, (int64_t[]){4});
  es_tdesc s8 = desc_make(ES_DTYPE_INT8, 1, (int64_t[]){1});
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
  es_tdesc t = desc_make(ES_DTYPE_FLOAT, 1, (int64_t[]){4});
  es_tdesc v2 = desc_make(ES_DTYPE_FLOAT, 1, (int64_t[]){2});
  es_tdesc si = desc_make(ES_DTYPE_INT64, 0, NULL);
  es_tdesc tb = desc_make(ES_DTYPE_BOOL, 1, (int64_t[]){4});
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
  es_tdesc ti = desc_make(ES_DTYPE_INT32, 1, (int64_t[]){4});
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
  es_tdesc tf = desc_make(ES_DTYPE_FLOAT, 2, (int64_t[]){2, 3});
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
  es_tdesc ti = desc_make(ES_DTYPE_INT64, 1, (int64_t[]){3});
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
  es_tdesc tb = desc_make(ES_DTYPE_BOOL, 1, (int64_t[]){3});
  ES_CHECK_RC(cast_to(ES_DTYPE_INT64, &tb, bv, &o, &out));
  int64_t wbi[3] = {0, 1, 1};
  assert_memory_equal(out, wbi, sizeof wbi);
  es_mem_free(out);

  /* same type: a copy, offered in place */
  ES_CHECK_RC(cast_to(ES_DTYPE_INT64, &ti, iv, &o, &out));
  assert_memory_equal(out, iv, sizeof iv);
  es_mem_free(out);
  hand_run h;
  es_attr a = {.name = "to", .type = ES_ATTR_INT, .i = ES_DTYPE_INT64};
  const es_tdesc *d[1] = {&ti};
  ES_CHECK_RC(hand_infer(&h, ES_OP_Cast, 13, &a, 1, 1, d, (const void *[]){NULL}));
  assert_int_equal(h.k.inplace, 0);
  ES_CHECK_RC(h.kern->run(&h.k, (const void *[]){iv}, (void *[]){iv}, NULL));
  assert_int_equal(iv[2], 300);
  hand_done(&h);
  a.i = ES_DTYPE_FLOAT;
  ES_CHECK_RC(hand_infer(&h, ES_OP_Cast, 13, &a, 1, 1, d, (const void *[]){NULL}));
  assert_int_equal(h.k.inplace, -1);
  hand_done(&h);
}

static void test_cast_invalid(void **state) {
  (void)state;
  es_tdesc tf = desc_make(ES_DTYPE_FLOAT, 1, (int64_t[]){2});
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bcast_fast_paths),
      cmocka_unit_test(test_bcast_random),
      cmocka_unit_test(test_bcast_mismatch),
      cmocka_unit_test(test_inplace),
      cmocka_unit_test(test_int_arith),
      cmocka_unit_test(test_binary_types_invalid),
      cmocka_unit_test(test_pow),
      cmocka_unit_test(test_equal),
      cmocka_unit_test(test_activations),
      cmocka_unit_test(test_activations_invalid),
      cmocka_unit_test(test_clip),
      cmocka_unit_test(test_clip_invalid),
      cmocka_unit_test(test_cast),
      cmocka_unit_test(test_cast_invalid),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
