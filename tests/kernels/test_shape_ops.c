/* Shape-family kernels (Shape, Reshape, Squeeze, Concat, Slice, Split,
 * Transpose, Pad, ConstantOfShape, Flatten, Unsqueeze, Expand, Tile, Range,
 * DepthToSpace, SpaceToDepth, Trilu, OneHot, Size, EyeLike,
 * ReverseSequence, Compress) and Upsample evaluated one node at a time.
 *
 * Small hand-checked cases for each op and form (attribute vs input), error
 * cases that must fail with the right code, and randomised comparisons of
 * Transpose, Slice, Pad and Tile against naive index-by-index references
 * over ranks 0-6 and element sizes 1, 4 and 8 (the tiled and strided paths).
 * The layout-aware ops (Concat, Split, Transpose) are then fed NHWC
 * tensors through a hand-built instance, as the planner runs them, and
 * must match the plain results in the layout they report. */
#include "es_test.h"

#include <stdbool.h>
#include <string.h>

#include "kernels/kernel.h"
#include "model/graph.h"
#include "support/kernel_harness.h"

/* ==========================================================================
 * Helpers
 * ======================================================================== */

static es_tdesc td1(es_dtype dt, int64_t n) { return kh_td(dt, 1, &n); }

static void check_dims(const es_tdesc *t, int rank, const int64_t *dims) {
  assert_int_equal(t->rank, rank);
  for (int i = 0; i < rank; i++)
    assert_int_equal(t->dims[i], dims[i]);
}

static void iota_f(float *v, size_t n) {
  for (size_t i = 0; i < n; i++)
    v[i] = (float)i;
}

/* ==========================================================================
 * Shape
 * ======================================================================== */

static void test_shape(void **state) {
  (void)state;
  int64_t dims[4] = {2, 3, 4, 5};
  es_tdesc x = kh_td(ES_DTYPE_FLOAT, 4, dims), od;
  void *o;
  kh_node t;
  kh_node_init(&t, ES_OP_Shape);
  ES_CHECK_RC(kh_eval1(&t.node, 13, &x, NULL, &od, &o));
  assert_int_equal(od.dtype, ES_DTYPE_INT64);
  assert_int_equal(od.dims[0], 4);
  assert_memory_equal(o, dims, sizeof dims);
  es_mem_free(o);

  /* Opset 15 bounds: [-3, -1) -> dims 1..2. */
  kh_attr_int(&t, "start", -3);
  kh_attr_int(&t, "end", -1);
  ES_CHECK_RC(kh_eval1(&t.node, 15, &x, NULL, &od, &o));
  assert_int_equal(od.dims[0], 2);
  assert_int_equal(((int64_t *)o)[0], 3);
  assert_int_equal(((int64_t *)o)[1], 4);
  es_mem_free(o);

  /* Out-of-range bounds clamp; start past end is empty. */
  t.attrs[0].i = 10;
  t.attrs[1].i = 100;
  ES_CHECK_RC(kh_eval1(&t.node, 15, &x, NULL, &od, &o));
  assert_int_equal(od.dims[0], 0);
  es_mem_free(o);

  /* A scalar has an empty shape. */
  es_tdesc s = kh_td(ES_DTYPE_INT64, 0, NULL);
  kh_node_init(&t, ES_OP_Shape);
  int64_t sv = 7;
  ES_CHECK_RC(kh_eval1(&t.node, 13, &s, &sv, &od, &o));
  assert_int_equal(od.rank, 1);
  assert_int_equal(od.dims[0], 0);
  es_mem_free(o);

  /* Two inputs are one too many. */
  kh_node_init(&t, ES_OP_Shape);
  const es_tdesc *in[2] = {&x, &x};
  const void *data[2] = {NULL, NULL};
  ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 2, in, data, 1, &od, &o), ES_EMODEL);
}

/* ==========================================================================
 * Reshape
 * ======================================================================== */

static int reshape(const es_tdesc *x, const void *xd, const int64_t *shape, size_t n,
                   int64_t allowzero, es_tdesc *od, void **o) {
  kh_node t;
  kh_node_init(&t, ES_OP_Reshape);
  if (allowzero >= 0)
    kh_attr_int(&t, "allowzero", allowzero);
  es_tdesc s = td1(ES_DTYPE_INT64, (int64_t)n);
  const es_tdesc *in[2] = {x, &s};
  const void *data[2] = {xd, shape};
  return es__kernel_eval(&t.node, 14, 2, in, data, 1, od, o);
}

static void test_reshape(void **state) {
  (void)state;
  int64_t dims[3] = {2, 3, 4};
  float v[24];
  iota_f(v, 24);
  es_tdesc x = kh_td(ES_DTYPE_FLOAT, 3, dims), od;
  void *o;

  int64_t s1[3] = {0, -1, 2};
  ES_CHECK_RC(reshape(&x, v, s1, 3, -1, &od, &o));
  check_dims(&od, 3, (int64_t[]){2, 6, 2});
  assert_memory_equal(o, v, sizeof v);
  es_mem_free(o);

  int64_t s2[1] = {-1};
  ES_CHECK_RC(reshape(&x, v, s2, 1, -1, &od, &o));
  check_dims(&od, 1, (int64_t[]){24});
  es_mem_free(o);

  /* allowzero=1: a 0 is a zero dim, only valid for an empty input. */
  int64_t zdims[3] = {0, 3, 4};
  es_tdesc z = kh_td(ES_DTYPE_FLOAT, 3, zdims);
  int64_t s3[3] = {3, 4, 0};
  ES_CHECK_RC(reshape(&z, v, s3, 3, 1, &od, &o));
  check_dims(&od, 3, s3);
  es_mem_free(o);
  ES_EXPECT_RC(reshape(&x, v, s3, 3, 1, &od, &o), ES_EMODEL);

  int64_t bad_two[2] = {-1, -1};
  ES_EXPECT_RC(reshape(&x, v, bad_two, 2, -1, &od, &o), ES_EMODEL);
  int64_t bad_count[2] = {5, 5};
  ES_EXPECT_RC(reshape(&x, v, bad_count, 2, -1, &od, &o), ES_EMODEL);
  int64_t bad_div[2] = {5, -1};
  ES_EXPECT_RC(reshape(&x, v, bad_div, 2, -1, &od, &o), ES_EMODEL);
  int64_t bad_neg[2] = {-2, -12};
  ES_EXPECT_RC(reshape(&x, v, bad_neg, 2, -1, &od, &o), ES_EMODEL);
  int64_t bad_zero[4] = {2, 3, 4, 0}; /* copies dim 3 of a rank-3 input */
  ES_EXPECT_RC(reshape(&x, v, bad_zero, 4, -1, &od, &o), ES_EMODEL);
  int64_t both[2] = {0, -1};
  ES_EXPECT_RC(reshape(&z, v, both, 2, 1, &od, &o), ES_EMODEL);
  ES_EXPECT_RC(reshape(&x, v, s1, 3, 2, &od, &o), ES_EMODEL);
  int64_t huge[2] = {INT64_MAX, INT64_MAX};
  ES_EXPECT_RC(reshape(&x, v, huge, 2, -1, &od, &o), ES_EMODEL);
  int64_t nine[9] = {1, 1, 1, 1, 1, 2, 3, 4, 1};
  ES_EXPECT_RC(reshape(&x, v, nine, 9, -1, &od, &o), ES_ENOTSUP);

  /* A shape not known when planning. */
  ES_EXPECT_RC(reshape(&x, v, NULL, 3, -1, &od, &o), ES_ENOTSUP);
  /* A float shape. */
  kh_node t;
  kh_node_init(&t, ES_OP_Reshape);
  es_tdesc fs = td1(ES_DTYPE_FLOAT, 1);
  float fv = 24;
  const es_tdesc *in[2] = {&x, &fs};
  const void *data[2] = {v, &fv};
  ES_EXPECT_RC(es__kernel_eval(&t.node, 14, 2, in, data, 1, &od, &o), ES_EMODEL);
}

/* Plans t on one float input x (other inputs static), runs it in place on
 * v when infer allows it, and returns k.inplace. */
static int run_inplace(kh_node *t, int n_in, const es_tdesc *const *in, const void *const *st,
                       float *v) {
  kh_run h;
  kh_begin(&h, &t->node, 13, n_in, in, st, 0, 1, NULL);
  ES_CHECK_RC(kh_infer(&h));
  int inplace = h.k.inplace;
  if (inplace == 0) {
    const void *rin[KH_MAX_IO] = {v};
    for (int i = 1; i < n_in; i++)
      rin[i] = st[i];
    void *rout[1] = {v};
    ES_CHECK_RC(h.kern->run(&h.k, rin, rout, NULL));
  }
  kh_end(&h);
  return inplace;
}

/* Views let the planner alias the output with the input, and run then
 * leaves the shared buffer alone; real moves do not. */
static void test_inplace(void **state) {
  (void)state;
  int64_t dims[3] = {2, 1, 3}, shape[1] = {6};
  float v[6] = {1, 2, 3, 4, 5, 6};
  es_tdesc x = kh_td(ES_DTYPE_FLOAT, 3, dims), s = td1(ES_DTYPE_INT64, 1);
  const es_tdesc *in[4] = {&x, &s, &s, &s};
  kh_node t;
  kh_node_init(&t, ES_OP_Reshape);
  const void *st[4] = {NULL, shape};
  assert_int_equal(run_inplace(&t, 2, in, st, v), 0);
  assert_true(v[0] == 1 && v[5] == 6);

  kh_node_init(&t, ES_OP_Squeeze);
  assert_int_equal(run_inplace(&t, 1, in, st, v), 0);

  /* Moving a unit dim keeps the byte order; swapping 2 and 3 does not. */
  int64_t keep[3] = {1, 0, 2}, swap[3] = {2, 1, 0};
  kh_node_init(&t, ES_OP_Transpose);
  kh_attr_ints(&t, "perm", keep, 3);
  assert_int_equal(run_inplace(&t, 1, in, st, v), 0);
  assert_true(v[0] == 1 && v[5] == 6);
  t.attrs[0].ints = swap;
  assert_int_equal(run_inplace(&t, 1, in, st, v), -1);

  /* A slice of a leading part is a view (the bytes are already in place),
   * one starting further on is not. */
  int64_t zero[1] = {0}, all[1] = {INT64_MAX}, one[1] = {1};
  kh_node_init(&t, ES_OP_Slice);
  const void *sst[3] = {NULL, zero, all};
  assert_int_equal(run_inplace(&t, 3, in, sst, v), 0);
  sst[2] = one;
  assert_int_equal(run_inplace(&t, 3, in, sst, v), 0);
  sst[1] = one;
  sst[2] = all;
  assert_int_equal(run_inplace(&t, 3, in, sst, v), -1);
  assert_true(v[0] == 1 && v[5] == 6);
}

/* ==========================================================================
 * Squeeze
 * ======================================================================== */

static void test_squeeze(void **state) {
  (void)state;
  int64_t dims[4] = {1, 3, 1, 2};
  float v[6];
  iota_f(v, 6);
  es_tdesc x = kh_td(ES_DTYPE_FLOAT, 4, dims), od;
  void *o;
  kh_node t;

  /* No axes: every 1 goes. */
  kh_node_init(&t, ES_OP_Squeeze);
  ES_CHECK_RC(kh_eval1(&t.node, 13, &x, v, &od, &o));
  check_dims(&od, 2, (int64_t[]){3, 2});
  assert_memory_equal(o, v, sizeof v);
  es_mem_free(o);

  /* Opset 11 attribute, negative axis. */
  int64_t ax[1] = {-2};
  kh_attr_ints(&t, "axes", ax, 1);
  ES_CHECK_RC(kh_eval1(&t.node, 11, &x, v, &od, &o));
  check_dims(&od, 3, (int64_t[]){1, 3, 2});
  es_mem_free(o);

  /* Opset 13 input. */
  kh_node_init(&t, ES_OP_Squeeze);
  es_tdesc a = td1(ES_DTYPE_INT64, 1);
  int64_t ax0[1] = {0};
  const es_tdesc *in[2] = {&x, &a};
  const void *data[2] = {v, ax0};
  ES_CHECK_RC(es__kernel_eval(&t.node, 13, 2, in, data, 1, &od, &o));
  check_dims(&od, 3, (int64_t[]){3, 1, 2});
  es_mem_free(o);

  /* Errors: squeezing a dim of 3, repeated and out-of-range axes, axes not
   * known when planning. */
  int64_t ax1[1] = {1};
  data[1] = ax1;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 2, in, data, 1, &od, &o), ES_EMODEL);
  int64_t dup[2] = {0, -4};
  es_tdesc a2 = td1(ES_DTYPE_INT64, 2);
  in[1] = &a2;
  data[1] = dup;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 2, in, data, 1, &od, &o), ES_EMODEL);
  int64_t far[1] = {4};
  in[1] = &a;
  data[1] = far;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 2, in, data, 1, &od, &o), ES_EMODEL);
  data[1] = NULL;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 2, in, data, 1, &od, &o), ES_ENOTSUP);
}

/* ==========================================================================
 * Concat
 * ======================================================================== */

static void test_concat(void **state) {
  (void)state;
  int64_t da[3] = {2, 1, 2}, db[3] = {2, 3, 2};
  int64_t va[4] = {0, 1, 2, 3}, vb[12];
  for (int i = 0; i < 12; i++)
    vb[i] = 100 + i;
  es_tdesc a = kh_td(ES_DTYPE_INT64, 3, da), b = kh_td(ES_DTYPE_INT64, 3, db), od;
  void *o;
  kh_node t;
  kh_node_init(&t, ES_OP_Concat);
  kh_attr_int(&t, "axis", -2);
  const es_tdesc *in[3] = {&a, &b, &a};
  const void *data[3] = {va, vb, va};
  ES_CHECK_RC(es__kernel_eval(&t.node, 13, 3, in, data, 1, &od, &o));
  check_dims(&od, 3, (int64_t[]){2, 5, 2});
  int64_t want[20] = {0,   1,   100, 101, 102, 103, 104, 105, 0,  1,
                      2,   3,   106, 107, 108, 109, 110, 111, 2,  3};
  assert_memory_equal(o, want, sizeof want);
  es_mem_free(o);

  /* Axis 0 of bytes, with an empty input. */
  uint8_t x1[3] = {1, 2, 3}, x2[2] = {4, 5};
  es_tdesc b1 = td1(ES_DTYPE_UINT8, 3), b2 = td1(ES_DTYPE_UINT8, 2), b0 = td1(ES_DTYPE_UINT8, 0);
  t.attrs[0].i = 0;
  const es_tdesc *bin[3] = {&b1, &b0, &b2};
  const void *bdata[3] = {x1, x2, x2};
  ES_CHECK_RC(es__kernel_eval(&t.node, 13, 3, bin, bdata, 1, &od, &o));
  assert_int_equal(od.dims[0], 5);
  assert_memory_equal(o, ((uint8_t[]){1, 2, 3, 4, 5}), 5);
  es_mem_free(o);

  /* Errors: mismatched dims, dtypes, ranks, bad axis, missing axis. */
  t.attrs[0].i = 1;
  in[1] = &b1;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 3, in, data, 1, &od, &o), ES_EMODEL);
  int64_t dc[3] = {3, 1, 2};
  es_tdesc c = kh_td(ES_DTYPE_INT64, 3, dc);
  in[1] = &c;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 3, in, data, 1, &od, &o), ES_EMODEL);
  es_tdesc r2 = kh_td(ES_DTYPE_INT64, 2, db);
  in[1] = &r2;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 3, in, data, 1, &od, &o), ES_EMODEL);
  in[1] = &b;
  t.attrs[0].i = 3;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 3, in, data, 1, &od, &o), ES_EMODEL);
  t.node.n_attr = 0;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 3, in, data, 1, &od, &o), ES_EMODEL);
  kh_attr_add(&t, "axis", ES_ATTR_FLOAT);
  ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 3, in, data, 1, &od, &o), ES_EMODEL);
}

/* ==========================================================================
 * Slice
 * ======================================================================== */

/* Opset 13 Slice with n indices per input; axes/steps NULL when omitted. */
static int slice13(const es_tdesc *x, const void *xd, size_t n, const int64_t *starts,
                   const int64_t *ends, const int64_t *axes, const int64_t *steps, es_tdesc *od,
                   void **o) {
  kh_node t;
  int n_in = steps ? 5 : axes ? 4 : 3;
  kh_node_init(&t, ES_OP_Slice);
  es_tdesc v = td1(ES_DTYPE_INT64, (int64_t)n);
  const es_tdesc *in[5] = {x, &v, &v, axes ? &v : NULL, &v};
  const void *data[5] = {xd, starts, ends, axes, steps};
  return es__kernel_eval(&t.node, 13, n_in, in, data, 1, od, o);
}

static void test_slice(void **state) {
  (void)state;
  int64_t dims[2] = {3, 4};
  float v[12];
  iota_f(v, 12);
  es_tdesc x = kh_td(ES_DTYPE_FLOAT, 2, dims), od;
  void *o;

  /* Rows 1.., columns reversed from the end with step -2. */
  int64_t st[2] = {1, -1}, en[2] = {INT64_MAX, INT64_MIN}, ax[2] = {0, 1}, sp[2] = {1, -2};
  ES_CHECK_RC(slice13(&x, v, 2, st, en, ax, sp, &od, &o));
  check_dims(&od, 2, (int64_t[]){2, 2});
  float want[4] = {7, 5, 11, 9};
  assert_memory_equal(o, want, sizeof want);
  es_mem_free(o);

  /* Default axes: the first; out-of-range ends clamp. */
  int64_t st1[1] = {-2}, en1[1] = {100};
  ES_CHECK_RC(slice13(&x, v, 1, st1, en1, NULL, NULL, &od, &o));
  check_dims(&od, 2, (int64_t[]){2, 4});
  assert_memory_equal(o, v + 4, 8 * sizeof(float));
  es_mem_free(o);

  /* Empty result when start >= end. */
  int64_t st2[1] = {3}, en2[1] = {1};
  ES_CHECK_RC(slice13(&x, v, 1, st2, en2, NULL, NULL, &od, &o));
  check_dims(&od, 2, (int64_t[]){0, 4});
  es_mem_free(o);

  /* Opset 9 attributes. */
  kh_node t;
  kh_node_init(&t, ES_OP_Slice);
  int64_t as[1] = {1}, ae[1] = {3}, aa[1] = {-1};
  kh_attr_ints(&t, "starts", as, 1);
  kh_attr_ints(&t, "ends", ae, 1);
  kh_attr_ints(&t, "axes", aa, 1);
  ES_CHECK_RC(kh_eval1(&t.node, 9, &x, v, &od, &o));
  check_dims(&od, 2, (int64_t[]){3, 2});
  float want2[6] = {1, 2, 5, 6, 9, 10};
  assert_memory_equal(o, want2, sizeof want2);
  es_mem_free(o);
  t.node.n_attr = 1; /* no ends */
  ES_EXPECT_RC(kh_eval1(&t.node, 9, &x, v, &od, &o), ES_EMODEL);

  /* Errors: zero step, repeated axis, axis out of range, length mismatch,
   * too many axes, not known when planning. */
  int64_t zero[2] = {1, 0};
  ES_EXPECT_RC(slice13(&x, v, 2, st, en, ax, zero, &od, &o), ES_EMODEL);
  int64_t dup[2] = {1, -1};
  ES_EXPECT_RC(slice13(&x, v, 2, st, en, dup, sp, &od, &o), ES_EMODEL);
  int64_t far[2] = {0, 2};
  ES_EXPECT_RC(slice13(&x, v, 2, st, en, far, sp, &od, &o), ES_EMODEL);
  int64_t st3[3] = {0, 0, 0}, en3[3] = {1, 1, 1};
  ES_EXPECT_RC(slice13(&x, v, 3, st3, en3, NULL, NULL, &od, &o), ES_EMODEL);
  ES_EXPECT_RC(slice13(&x, v, 2, NULL, en, ax, sp, &od, &o), ES_ENOTSUP);
  {
    kh_node_init(&t, ES_OP_Slice);
    es_tdesc v2 = td1(ES_DTYPE_INT64, 2), v1 = td1(ES_DTYPE_INT64, 1);
    const es_tdesc *in[3] = {&x, &v2, &v1};
    const void *data[3] = {v, st, en};
    ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 3, in, data, 1, &od, &o), ES_EMODEL);
  }
}

/* ==========================================================================
 * Split
 * ======================================================================== */

static void test_split(void **state) {
  (void)state;
  int64_t dims[2] = {2, 6};
  float v[12];
  iota_f(v, 12);
  es_tdesc x = kh_td(ES_DTYPE_FLOAT, 2, dims), od[3];
  void *o[3];
  kh_node t;

  /* Equal parts along the last axis. */
  kh_node_init(&t, ES_OP_Split);
  kh_attr_int(&t, "axis", -1);
  const es_tdesc *in[2] = {&x, NULL};
  const void *data[2] = {v, NULL};
  ES_CHECK_RC(es__kernel_eval(&t.node, 13, 1, in, data, 3, od, o));
  for (int i = 0; i < 3; i++) {
    check_dims(&od[i], 2, (int64_t[]){2, 2});
    float want[4] = {(float)(2 * i), (float)(2 * i + 1), (float)(6 + 2 * i), (float)(7 + 2 * i)};
    assert_memory_equal(o[i], want, sizeof want);
    es_mem_free(o[i]);
  }

  /* Opset 13 sizes input, with an empty part. */
  kh_node_init(&t, ES_OP_Split);
  kh_attr_int(&t, "axis", 1);
  int64_t sizes[3] = {1, 0, 5};
  es_tdesc s = td1(ES_DTYPE_INT64, 3);
  in[1] = &s;
  data[1] = sizes;
  ES_CHECK_RC(es__kernel_eval(&t.node, 13, 2, in, data, 3, od, o));
  check_dims(&od[0], 2, (int64_t[]){2, 1});
  check_dims(&od[1], 2, (int64_t[]){2, 0});
  check_dims(&od[2], 2, (int64_t[]){2, 5});
  float want0[2] = {0, 6}, want2[10] = {1, 2, 3, 4, 5, 7, 8, 9, 10, 11};
  assert_memory_equal(o[0], want0, sizeof want0);
  assert_memory_equal(o[2], want2, sizeof want2);
  for (int i = 0; i < 3; i++)
    es_mem_free(o[i]);

  /* Opset 11 attribute along axis 0. */
  kh_node_init(&t, ES_OP_Split);
  int64_t asz[2] = {1, 1};
  kh_attr_ints(&t, "split", asz, 2);
  ES_CHECK_RC(es__kernel_eval(&t.node, 11, 1, in, data, 2, od, o));
  assert_memory_equal(o[1], v + 6, 6 * sizeof(float));
  es_mem_free(o[0]);
  es_mem_free(o[1]);

  /* Errors: sizes not summing to the dim, negative, wrong count, unequal
   * default split before opset 18, sizes not known when planning. */
  kh_node_init(&t, ES_OP_Split);
  kh_attr_int(&t, "axis", 1);
  int64_t bad[3] = {1, 1, 1};
  data[1] = bad;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 2, in, data, 3, od, o), ES_EMODEL);
  int64_t neg[3] = {-1, 2, 5};
  data[1] = neg;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 2, in, data, 3, od, o), ES_EMODEL);
  data[1] = sizes;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 2, in, data, 2, od, o), ES_EMODEL);
  data[1] = NULL;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 2, in, data, 3, od, o), ES_ENOTSUP);
  es_tdesc od4[4];
  void *o4[4];
  kh_node_init(&t, ES_OP_Split);
  kh_attr_int(&t, "axis", 1);
  ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 1, in, data, 4, od4, o4), ES_EMODEL);
  /* Opset 18: 6 into 4 parts -> 2, 2, 2, 0. */
  ES_CHECK_RC(es__kernel_eval(&t.node, 18, 1, in, data, 4, od4, o4));
  assert_int_equal(od4[3].dims[1], 0);
  for (int i = 0; i < 4; i++)
    es_mem_free(o4[i]);
  t.attrs[0].i = 2;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 1, in, data, 4, od4, o4), ES_EMODEL);
}

/* ==========================================================================
 * Transpose, Slice and Pad against naive references
 * ======================================================================== */

/* Element i of a test tensor, distinct for every i at each element size. */
static void elem_set(void *base, size_t esz, size_t i) {
  uint64_t v = 0x0102030405060708ull * (i + 1) + i;
  memcpy((char *)base + i * esz, &v, esz);
}

static void *tensor_fill(size_t esz, size_t count) {
  void *p = es_mem_alloc(ES_MEM_OTHER, count * esz + 1);
  for (size_t i = 0; i < count; i++)
    elem_set(p, esz, i);
  return p;
}

static es_dtype dtype_of_size(size_t esz) {
  return esz == 1 ? ES_DTYPE_UINT8 : esz == 4 ? ES_DTYPE_FLOAT : ES_DTYPE_INT64;
}

static size_t offset_of(int rank, const int64_t *dims, const int64_t *idx) {
  size_t off = 0;
  for (int d = 0; d < rank; d++)
    off = off * (size_t)dims[d] + (size_t)idx[d];
  return off;
}

/* Advances idx over dims; 0 once it wraps around. */
static int idx_next(int rank, const int64_t *dims, int64_t *idx) {
  for (int d = rank - 1; d >= 0; d--) {
    if (++idx[d] < dims[d])
      return 1;
    idx[d] = 0;
  }
  return 0;
}

static void test_transpose_random(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  for (int iter = 0; iter < 600; iter++) {
    int rank = 1 + (int)(es_test_rand(&seed) % 6);
    int64_t dims[ES_MAX_RANK], perm[ES_MAX_RANK];
    for (int d = 0; d < rank; d++) {
      dims[d] = 1 + (int64_t)(es_test_rand(&seed) % (rank <= 3 ? 40 : 7));
      perm[d] = d;
    }
    for (int d = rank - 1; d > 0; d--) {
      int j = (int)(es_test_rand(&seed) % (uint64_t)(d + 1));
      int64_t tmp = perm[d];
      perm[d] = perm[j], perm[j] = tmp;
    }
    size_t esz = (size_t[]){1, 4, 8}[es_test_rand(&seed) % 3];
    es_tdesc x = kh_td(dtype_of_size(esz), rank, dims), od;
    void *xd = tensor_fill(esz, x.count), *o;
    kh_node t;
    kh_node_init(&t, ES_OP_Transpose);
    bool dflt = iter % 10 == 0;
    if (dflt)
      for (int d = 0; d < rank; d++)
        perm[d] = rank - 1 - d;
    else
      kh_attr_ints(&t, "perm", perm, (size_t)rank);
    ES_CHECK_RC(kh_eval1(&t.node, 13, &x, xd, &od, &o));
    int64_t odims[ES_MAX_RANK], oidx[ES_MAX_RANK] = {0}, iidx[ES_MAX_RANK];
    for (int d = 0; d < rank; d++)
      odims[d] = dims[perm[d]];
    check_dims(&od, rank, odims);
    size_t n = 0;
    do {
      for (int d = 0; d < rank; d++)
        iidx[perm[d]] = oidx[d];
      size_t src = offset_of(rank, dims, iidx);
      if (memcmp((char *)o + n * esz, (char *)xd + src * esz, esz))
        fail_msg("transpose iter %d: element %zu differs (rank %d, esz %zu)", iter, n, rank, esz);
      n++;
    } while (idx_next(rank, odims, oidx));
    assert_int_equal(n, x.count);
    es_mem_free(o);
    es_mem_free(xd);
  }
}

static void test_transpose_errors(void **state) {
  (void)state;
  int64_t dims[3] = {2, 3, 4};
  es_tdesc x = kh_td(ES_DTYPE_FLOAT, 3, dims), od;
  void *o;
  kh_node t;
  kh_node_init(&t, ES_OP_Transpose);
  int64_t short_perm[2] = {1, 0}, dup[3] = {0, 0, 1}, neg[3] = {-1, 0, 1}, big[3] = {0, 1, 3};
  kh_attr_ints(&t, "perm", short_perm, 2);
  ES_EXPECT_RC(kh_eval1(&t.node, 13, &x, NULL, &od, &o), ES_EMODEL);
  t.attrs[0].ints = dup, t.attrs[0].n = 3;
  ES_EXPECT_RC(kh_eval1(&t.node, 13, &x, NULL, &od, &o), ES_EMODEL);
  t.attrs[0].ints = neg;
  ES_EXPECT_RC(kh_eval1(&t.node, 13, &x, NULL, &od, &o), ES_EMODEL);
  t.attrs[0].ints = big;
  ES_EXPECT_RC(kh_eval1(&t.node, 13, &x, NULL, &od, &o), ES_EMODEL);
  t.attrs[0].type = ES_ATTR_INT;
  ES_EXPECT_RC(kh_eval1(&t.node, 13, &x, NULL, &od, &o), ES_EMODEL);
}

/* The ONNX rule spelled out as a loop over the kept indices. */
static int64_t ref_slice_axis(int64_t d, int64_t start, int64_t end, int64_t step,
                              int64_t *list) {
  int64_t n = 0;
  if (start < 0)
    start += d;
  if (end < 0)
    end += d;
  if (step > 0) {
    int64_t s = start < 0 ? 0 : start > d ? d : start, e = end < 0 ? 0 : end > d ? d : end;
    for (int64_t i = s; i < e; i += step)
      list[n++] = i;
  } else {
    int64_t s = start < 0 ? 0 : start > d - 1 ? d - 1 : start;
    int64_t e = end < -1 ? -1 : end > d - 1 ? d - 1 : end;
    for (int64_t i = s; i > e; i += step)
      list[n++] = i;
  }
  return n;
}

static int64_t rand_index(uint64_t *seed, int64_t d) {
  uint64_t r = es_test_rand(seed) % 16;
  if (r == 0)
    return INT64_MAX;
  if (r == 1)
    return INT64_MIN;
  return (int64_t)(es_test_rand(seed) % (uint64_t)(2 * d + 7)) - d - 3;
}

static void test_slice_random(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  for (int iter = 0; iter < 600; iter++) {
    int rank = 1 + (int)(es_test_rand(&seed) % 5);
    int64_t dims[ES_MAX_RANK];
    for (int d = 0; d < rank; d++)
      dims[d] = 1 + (int64_t)(es_test_rand(&seed) % 9);
    size_t esz = (size_t[]){1, 4, 8}[es_test_rand(&seed) % 3];
    /* A random subset of axes in random order, each with a step. */
    int64_t axes[ES_MAX_RANK], starts[ES_MAX_RANK], ends[ES_MAX_RANK], steps[ES_MAX_RANK];
    int n = 0;
    for (int d = 0; d < rank; d++)
      if (es_test_rand(&seed) % 3)
        axes[n++] = es_test_rand(&seed) % 2 ? d : d - rank;
    for (int j = n - 1; j > 0; j--) {
      int i = (int)(es_test_rand(&seed) % (uint64_t)(j + 1));
      int64_t tmp = axes[j];
      axes[j] = axes[i], axes[i] = tmp;
    }
    int64_t list[ES_MAX_RANK][64], cnt[ES_MAX_RANK];
    for (int d = 0; d < rank; d++) {
      cnt[d] = dims[d];
      for (int64_t i = 0; i < dims[d]; i++)
        list[d][i] = i;
    }
    for (int j = 0; j < n; j++) {
      int d = (int)(axes[j] < 0 ? axes[j] + rank : axes[j]);
      starts[j] = rand_index(&seed, dims[d]);
      ends[j] = rand_index(&seed, dims[d]);
      do
        steps[j] = (int64_t)(es_test_rand(&seed) % 7) - 3;
      while (steps[j] == 0);
      cnt[d] = ref_slice_axis(dims[d], starts[j], ends[j], steps[j], list[d]);
    }
    es_tdesc x = kh_td(dtype_of_size(esz), rank, dims), od;
    void *xd = tensor_fill(esz, x.count), *o;
    ES_CHECK_RC(slice13(&x, xd, (size_t)n, starts, ends, axes, steps, &od, &o));
    check_dims(&od, rank, cnt);
    int64_t oidx[ES_MAX_RANK] = {0}, iidx[ES_MAX_RANK];
    size_t k = 0;
    if (od.count)
      do {
        for (int d = 0; d < rank; d++)
          iidx[d] = list[d][oidx[d]];
        size_t src = offset_of(rank, dims, iidx);
        if (memcmp((char *)o + k * esz, (char *)xd + src * esz, esz))
          fail_msg("slice iter %d: element %zu differs", iter, k);
        k++;
      } while (idx_next(rank, cnt, oidx));
    assert_int_equal(k, od.count);
    es_mem_free(o);
    es_mem_free(xd);
  }
}

/* Pad reference, as ONNX's: negative pads crop first, leaving the input
 * window [w0, w1); the modes then pad that window: reflect by repeated
 * mirroring, edge by clamping, wrap by repeated shifting. -1: constant. */
static int64_t ref_pad_index(int mode, int64_t w0, int64_t w1, int64_t i) {
  if (i >= w0 && i < w1)
    return i;
  int64_t n = w1 - w0, t = i - w0;
  if (mode == 0 || n <= 0)
    return -1;
  if (mode == 1)
    while (t < 0 || t >= n) {
      if (n == 1)
        return w0;
      if (t < 0)
        t = -t;
      if (t >= n)
        t = 2 * (n - 1) - t;
    }
  if (mode == 2)
    t = t < 0 ? 0 : n - 1;
  if (mode == 3)
    while (t < 0 || t >= n)
      t += t < 0 ? n : -n;
  return w0 + t;
}

static void test_pad_random(void **state) {
  (void)state;
  static const char *const modes[4] = {"constant", "reflect", "edge", "wrap"};
  uint64_t seed = es_test_seed();
  for (int iter = 0; iter < 800; iter++) {
    int rank = 1 + (int)(es_test_rand(&seed) % 5);
    int mode = (int)(es_test_rand(&seed) % 4);
    bool attr_form = mode != 3 && es_test_rand(&seed) % 4 == 0; /* wrap: opset 19 */
    bool nothing_left = false; /* a dim cropped away yet padded: only constant can */
    int64_t dims[ES_MAX_RANK], pads[2 * ES_MAX_RANK], odims[ES_MAX_RANK];
    for (int d = 0; d < rank; d++) {
      dims[d] = 1 + (int64_t)(es_test_rand(&seed) % 6);
      do {
        pads[d] = (int64_t)(es_test_rand(&seed) % (uint64_t)(dims[d] + 5)) - dims[d];
        pads[d + rank] = (int64_t)(es_test_rand(&seed) % (uint64_t)(dims[d] + 5)) - dims[d];
        odims[d] = dims[d] + pads[d] + pads[d + rank];
      } while (odims[d] < 0);
      int64_t w0 = pads[d] < 0 ? -pads[d] : 0;
      int64_t w1 = dims[d] + (pads[d + rank] < 0 ? pads[d + rank] : 0);
      nothing_left = nothing_left || (w1 <= w0 && odims[d] > 0 && mode != 0);
    }
    size_t esz = attr_form ? 4 : (size_t[]){1, 4, 8}[es_test_rand(&seed) % 3];
    es_tdesc x = kh_td(dtype_of_size(esz), rank, dims), od;
    void *xd = tensor_fill(esz, x.count), *o;
    unsigned char cval[8];
    memset(cval, 0x5a, sizeof cval);
    float fval = 2.5f;
    if (attr_form)
      memcpy(cval, &fval, 4);
    kh_node t;
    kh_node_init(&t, ES_OP_Pad);
    kh_attr_add(&t, "mode", ES_ATTR_STRING)->s = modes[mode];
    int rc;
    if (attr_form) {
      kh_attr_ints(&t, "pads", pads, 2 * (size_t)rank);
      kh_attr_add(&t, "value", ES_ATTR_FLOAT)->f = fval;
      rc = kh_eval1(&t.node, 2, &x, xd, &od, &o);
    } else {
      es_tdesc p = td1(ES_DTYPE_INT64, 2 * rank), c = kh_td(x.dtype, 0, NULL);
      const es_tdesc *in[3] = {&x, &p, &c};
      const void *data[3] = {xd, pads, cval};
      rc = es__kernel_eval(&t.node, mode == 3 ? 19 : 13, 3, in, data, 1, &od, &o);
    }
    if (nothing_left) {
      assert_int_equal(rc, ES_EMODEL);
      es_mem_free(xd);
      continue;
    }
    ES_CHECK_RC(rc);
    check_dims(&od, rank, odims);
    int64_t oidx[ES_MAX_RANK] = {0}, iidx[ES_MAX_RANK];
    size_t k = 0;
    if (od.count)
      do {
        bool inside = true;
        for (int d = 0; d < rank; d++) {
          int64_t w0 = pads[d] < 0 ? -pads[d] : 0;
          int64_t w1 = dims[d] + (pads[d + rank] < 0 ? pads[d + rank] : 0);
          iidx[d] = ref_pad_index(mode, w0, w1, oidx[d] - pads[d]);
          inside = inside && iidx[d] >= 0;
        }
        const void *want = inside ? (const void *)((char *)xd + offset_of(rank, dims, iidx) * esz)
                                  : (const void *)cval;
        if (memcmp((char *)o + k * esz, want, esz))
          fail_msg("pad iter %d (%s): element %zu differs", iter, modes[mode], k);
        k++;
      } while (idx_next(rank, odims, oidx));
    assert_int_equal(k, od.count);
    es_mem_free(o);
    es_mem_free(xd);
  }
}

static void test_pad_errors(void **state) {
  (void)state;
  int64_t dims[2] = {2, 3};
  float v[6] = {0};
  es_tdesc x = kh_td(ES_DTYPE_FLOAT, 2, dims), od;
  void *o;
  kh_node t;
  kh_node_init(&t, ES_OP_Pad);
  es_attr *mode = kh_attr_add(&t, "mode", ES_ATTR_STRING);
  mode->s = "constant";
  int64_t pads[4] = {0, 1, 0, 1};
  float cv = 1;
  int32_t ci = 1;
  es_tdesc p = td1(ES_DTYPE_INT64, 4), p3 = td1(ES_DTYPE_INT64, 3),
           c = kh_td(ES_DTYPE_FLOAT, 0, NULL);
  es_tdesc ci_t = kh_td(ES_DTYPE_INT32, 0, NULL), c2 = td1(ES_DTYPE_FLOAT, 2);
  const es_tdesc *in[3] = {&x, &p, &c};
  const void *data[3] = {v, pads, &cv};
  ES_CHECK_RC(es__kernel_eval(&t.node, 13, 3, in, data, 1, &od, &o));
  check_dims(&od, 2, (int64_t[]){2, 5});
  es_mem_free(o);
  /* Unknown and unsupported modes. */
  mode->s = "mirror";
  ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 3, in, data, 1, &od, &o), ES_EMODEL);
  mode->s = "wrap"; /* opset 19 */
  ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 3, in, data, 1, &od, &o), ES_EMODEL);
  mode->s = "constant";
  /* pads of the wrong length, cropping past the data, a constant of another
   * type or size, pads not known when planning. */
  in[1] = &p3;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 3, in, data, 1, &od, &o), ES_EMODEL);
  in[1] = &p;
  int64_t crop[4] = {0, -2, 0, -2};
  data[1] = crop;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 3, in, data, 1, &od, &o), ES_EMODEL);
  data[1] = pads;
  in[2] = &ci_t;
  data[2] = &ci;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 3, in, data, 1, &od, &o), ES_EMODEL);
  in[2] = &c2;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 3, in, data, 1, &od, &o), ES_EMODEL);
  in[2] = &c;
  data[2] = &cv;
  data[1] = NULL;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 3, in, data, 1, &od, &o), ES_ENOTSUP);
  /* Edge padding of an empty dim has nothing to repeat. */
  int64_t edims[2] = {0, 3};
  es_tdesc e = kh_td(ES_DTYPE_FLOAT, 2, edims);
  in[0] = &e;
  data[1] = pads;
  mode->s = "edge";
  int64_t pads0[4] = {1, 0, 0, 0};
  data[1] = pads0;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 3, in, data, 1, &od, &o), ES_EMODEL);
  /* Opset 18 axes: pad only the last dim; the constant omitted is 0. */
  in[0] = &x;
  mode->s = "constant";
  int64_t axes[1] = {-1}, pads2[2] = {2, -1};
  es_tdesc p2 = td1(ES_DTYPE_INT64, 2), a1 = td1(ES_DTYPE_INT64, 1);
  const es_tdesc *in4[4] = {&x, &p2, NULL, &a1};
  const void *data4[4] = {(float[]){1, 2, 3, 4, 5, 6}, pads2, NULL, axes};
  ES_CHECK_RC(es__kernel_eval(&t.node, 18, 4, in4, data4, 1, &od, &o));
  check_dims(&od, 2, (int64_t[]){2, 4});
  float want[8] = {0, 0, 1, 2, 0, 0, 4, 5};
  assert_memory_equal(o, want, sizeof want);
  es_mem_free(o);
  /* pads must match the axes. */
  data4[1] = pads;
  in4[1] = &p;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 18, 4, in4, data4, 1, &od, &o), ES_EMODEL);
  /* Opset 2 without pads. */
  kh_node_init(&t, ES_OP_Pad);
  ES_EXPECT_RC(kh_eval1(&t.node, 2, &x, v, &od, &o), ES_EMODEL);
}

/* ==========================================================================
 * ConstantOfShape
 * ======================================================================== */

static void test_constant_of_shape(void **state) {
  (void)state;
  int64_t shape[2] = {2, 3};
  es_tdesc s = td1(ES_DTYPE_INT64, 2), od;
  void *o;
  kh_node t;
  kh_node_init(&t, ES_OP_ConstantOfShape);
  ES_CHECK_RC(kh_eval1(&t.node, 9, &s, shape, &od, &o));
  assert_int_equal(od.dtype, ES_DTYPE_FLOAT);
  check_dims(&od, 2, shape);
  float zeros[6] = {0};
  assert_memory_equal(o, zeros, sizeof zeros);
  es_mem_free(o);

  /* An int64 value from the resolved tensor attribute. */
  int64_t seven = 7;
  es_attr_tensor val = {.dtype = ES_DTYPE_INT64, .rank = 1, .dims = {1}, .data = &seven,
                        .nbytes = 8};
  es_attr *va = kh_attr_add(&t, "value", ES_ATTR_TENSOR);
  va->tensor = 0;
  va->t = &val;
  const es_tdesc *in[1] = {&s};
  const void *data[1] = {shape};
  ES_CHECK_RC(es__kernel_eval(&t.node, 9, 1, in, data, 1, &od, &o));
  assert_int_equal(od.dtype, ES_DTYPE_INT64);
  for (int i = 0; i < 6; i++)
    assert_int_equal(((int64_t *)o)[i], 7);
  es_mem_free(o);

  /* An unresolved or multi-element value is invalid. */
  t.attrs[0].t = NULL;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 9, 1, in, data, 1, &od, &o), ES_EMODEL);
  t.attrs[0].t = &val;
  val.nbytes = 16;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 9, 1, in, data, 1, &od, &o), ES_EMODEL);

  /* A scalar output from an empty shape; negative dims; unknown shape. */
  kh_node_init(&t, ES_OP_ConstantOfShape);
  es_tdesc s0 = td1(ES_DTYPE_INT64, 0);
  ES_CHECK_RC(kh_eval1(&t.node, 9, &s0, shape, &od, &o));
  assert_int_equal(od.rank, 0);
  assert_int_equal(od.count, 1);
  es_mem_free(o);
  int64_t neg[2] = {2, -1};
  ES_EXPECT_RC(kh_eval1(&t.node, 9, &s, neg, &od, &o), ES_EMODEL);
  ES_EXPECT_RC(kh_eval1(&t.node, 9, &s, NULL, &od, &o), ES_ENOTSUP);
}

/* ==========================================================================
 * NHWC tensors (Concat, Split, Transpose)
 * ======================================================================== */

/* Runs t as the planner would, on inputs in the layouts their descriptors
 * say: inputs in dyn are unknown while planning, the others static; prep
 * gives the instance a prepared-weights store as plans have. Returns
 * infer's or run's code; *k_out receives the instance's requests and
 * inplace (ctx-owned parts are gone). */
static int eval_lay(kh_node *t, int n_in, const es_tdesc *const *in, const void *const *data,
                    unsigned dyn, bool prep, int n_out, es_tdesc *od, void **o, es_kinst *k_out) {
  assert_true(es__kernel_for(t->node.op)->layout_aware);
  es_prep_store *store = NULL;
  if (prep)
    ES_CHECK_RC(es__prep_store_create(&store));
  kh_opts opt = {.opset = 13, .dyn = dyn, .prep = store, .k_out = k_out};
  int rc = kh_eval_with(&t->node, &opt, n_in, in, data, n_out, od, o);
  es__prep_store_destroy(store);
  return rc;
}

/* Random concats of NHWC inputs along every axis equal the plain concat in
 * NHWC order; mixed layouts ask for NHWC copies of the plain inputs that
 * would move, and take one-channel plain inputs as they are. */
static void test_concat_nhwc(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  for (int iter = 0; iter < 200; iter++) {
    size_t esz = (size_t[]){1, 4, 8}[es_test_rand(&seed) % 3];
    int n = 1 + (int)(es_test_rand(&seed) % 4), axis = (int)(es_test_rand(&seed) % 4);
    int64_t dims[4];
    for (int d = 0; d < 4; d++)
      dims[d] = 1 + (int64_t)(es_test_rand(&seed) % 5);
    es_tdesc x[4], xn[4], od, odn;
    void *xd[4], *xnd[4], *o, *on;
    const es_tdesc *in[4], *inn[4];
    for (int i = 0; i < n; i++) {
      dims[axis] = (int64_t)(es_test_rand(&seed) % 6); /* may be empty */
      x[i] = kh_td(dtype_of_size(esz), 4, dims);
      xn[i] = kh_as_nhwc(x[i]);
      xd[i] = tensor_fill(esz, x[i].count);
      xnd[i] = kh_reorder4(xd[i], &x[i], true);
      in[i] = &x[i];
      inn[i] = &xn[i];
    }
    kh_node t;
    kh_node_init(&t, ES_OP_Concat);
    kh_attr_int(&t, "axis", axis - (iter % 2 ? 4 : 0));
    es_kinst k;
    ES_CHECK_RC(es__kernel_eval(&t.node, 13, n, in, (const void *const *)xd, 1, &od, &o));
    ES_CHECK_RC(eval_lay(&t, n, inn, (const void *const *)xnd, 0xf, true, 1, &odn, &on, &k));
    assert_int_equal(odn.layout, ES_LAYOUT_NHWC);
    assert_true(es__tdesc_same_shape(&od, &odn));
    void *want = kh_reorder4(o, &od, true);
    if (memcmp(on, want, od.nbytes))
      fail_msg("NHWC concat iteration %d (axis %d, %d inputs, esz %zu) differs", iter, axis, n,
               esz);
    es_mem_free(want);
    es_mem_free(o);
    es_mem_free(on);
    for (int i = 0; i < n; i++) {
      es_mem_free(xd[i]);
      es_mem_free(xnd[i]);
    }
  }

  /* A channel concat over many pixels (several cache tiles of output rows,
   * the last one partial). */
  {
    int64_t cs[3] = {3, 5, 1};
    es_tdesc x[3], xn[3], od, odn;
    void *xd[3], *xnd[3], *o, *on;
    const es_tdesc *in[3], *inn[3];
    for (int i = 0; i < 3; i++) {
      x[i] = kh_td(ES_DTYPE_FLOAT, 4, (int64_t[]){1, cs[i], 70, 61});
      xn[i] = kh_as_nhwc(x[i]);
      xd[i] = tensor_fill(4, x[i].count);
      xnd[i] = kh_reorder4(xd[i], &x[i], true);
      in[i] = &x[i];
      inn[i] = &xn[i];
    }
    kh_node t;
    kh_node_init(&t, ES_OP_Concat);
    kh_attr_int(&t, "axis", 1);
    es_kinst k;
    ES_CHECK_RC(es__kernel_eval(&t.node, 13, 3, in, (const void *const *)xd, 1, &od, &o));
    ES_CHECK_RC(eval_lay(&t, 3, inn, (const void *const *)xnd, 7, true, 1, &odn, &on, &k));
    void *want = kh_reorder4(o, &od, true);
    assert_memory_equal(on, want, od.nbytes);
    es_mem_free(want);
    es_mem_free(o);
    es_mem_free(on);
    for (int i = 0; i < 3; i++) {
      es_mem_free(xd[i]);
      es_mem_free(xnd[i]);
    }
  }

  /* Mixed: NHWC [1,3,4,5], plain [1,2,4,5] (must move), plain [1,1,4,5]
   * (same bytes in both layouts). */
  int64_t d0[4] = {1, 3, 4, 5}, d1[4] = {1, 2, 4, 5}, d2[4] = {1, 1, 4, 5};
  es_tdesc a = kh_td(ES_DTYPE_FLOAT, 4, d0), b = kh_td(ES_DTYPE_FLOAT, 4, d1),
           c = kh_td(ES_DTYPE_FLOAT, 4, d2), an = kh_as_nhwc(a), bn = kh_as_nhwc(b), od, odn;
  void *ad = tensor_fill(4, a.count), *bd = tensor_fill(4, b.count), *cd = tensor_fill(4, c.count);
  void *and_ = kh_reorder4(ad, &a, true), *bnd = kh_reorder4(bd, &b, true), *o, *on;
  kh_node t;
  kh_node_init(&t, ES_OP_Concat);
  kh_attr_int(&t, "axis", 1);
  es_kinst k;
  const es_tdesc *mixed[3] = {&an, &b, &c};
  const void *mdata[3] = {and_, bd, cd};
  ES_EXPECT_RC(eval_lay(&t, 3, mixed, mdata, 7, true, 1, &odn, &on, &k), ES_KRELAYOUT);
  assert_int_equal(k.want_nhwc, 2);
  assert_int_equal(k.want_plain, 0);
  mixed[1] = &bn;
  mdata[1] = bnd;
  ES_CHECK_RC(eval_lay(&t, 3, mixed, mdata, 7, true, 1, &odn, &on, &k));
  assert_int_equal(odn.layout, ES_LAYOUT_NHWC);
  const es_tdesc *plain[3] = {&a, &b, &c};
  const void *pdata[3] = {ad, bd, cd};
  ES_CHECK_RC(es__kernel_eval(&t.node, 13, 3, plain, pdata, 1, &od, &o));
  void *want = kh_reorder4(o, &od, true);
  assert_memory_equal(on, want, od.nbytes);
  es_mem_free(want);
  es_mem_free(o);
  es_mem_free(on);
  /* All plain: plain, as before. */
  ES_CHECK_RC(eval_lay(&t, 3, plain, pdata, 7, true, 1, &odn, &on, &k));
  assert_int_equal(odn.layout, ES_LAYOUT_PLAIN);
  es_mem_free(on);
  es_mem_free(ad);
  es_mem_free(bd);
  es_mem_free(cd);
  es_mem_free(and_);
  es_mem_free(bnd);
}

/* Random splits of NHWC inputs along every axis: NHWC outputs equal to the
 * plain split's in NHWC order. */
static void test_split_nhwc(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  for (int iter = 0; iter < 200; iter++) {
    size_t esz = (size_t[]){1, 4, 8}[es_test_rand(&seed) % 3];
    int n = 1 + (int)(es_test_rand(&seed) % 3), axis = (int)(es_test_rand(&seed) % 4);
    int64_t dims[4], sizes[3];
    for (int d = 0; d < 4; d++)
      dims[d] = 1 + (int64_t)(es_test_rand(&seed) % 5);
    dims[axis] = 0;
    for (int i = 0; i < n; i++)
      dims[axis] += sizes[i] = (int64_t)(es_test_rand(&seed) % 5);
    es_tdesc x = kh_td(dtype_of_size(esz), 4, dims), xn = kh_as_nhwc(x), s = td1(ES_DTYPE_INT64, n);
    es_tdesc od[3], odn[3];
    void *xd = tensor_fill(esz, x.count), *xnd = kh_reorder4(xd, &x, true), *o[3], *on[3];
    kh_node t;
    kh_node_init(&t, ES_OP_Split);
    kh_attr_int(&t, "axis", axis);
    const es_tdesc *in[2] = {&x, &s}, *inn[2] = {&xn, &s};
    const void *data[2] = {xd, sizes}, *datan[2] = {xnd, sizes};
    es_kinst k;
    ES_CHECK_RC(es__kernel_eval(&t.node, 13, 2, in, data, n, od, o));
    ES_CHECK_RC(eval_lay(&t, 2, inn, datan, 1, true, n, odn, on, &k));
    for (int i = 0; i < n; i++) {
      assert_int_equal(odn[i].layout, ES_LAYOUT_NHWC);
      assert_true(es__tdesc_same_shape(&od[i], &odn[i]));
      void *want = kh_reorder4(o[i], &od[i], true);
      if (memcmp(on[i], want, od[i].nbytes))
        fail_msg("NHWC split iteration %d output %d (axis %d, esz %zu) differs", iter, i, axis,
                 esz);
      es_mem_free(want);
      es_mem_free(o[i]);
      es_mem_free(on[i]);
    }
    es_mem_free(xd);
    es_mem_free(xnd);
  }
}

/* Transpose picks the output layout that makes it free: the NHWC-to-NCHW
 * transpose at the start of models exported from NHWC frameworks and the
 * NCHW-to-NHWC one at their end become aliases. Other permutations of NHWC
 * inputs gather into plain outputs. */
static void test_transpose_nhwc(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  int64_t in_dims[4] = {1, 5, 6, 3}, to_nchw[4] = {0, 3, 1, 2}, to_nhwc[4] = {0, 2, 3, 1};
  es_tdesc x = kh_td(ES_DTYPE_FLOAT, 4, in_dims), od;
  void *xd = tensor_fill(4, x.count), *o;
  const es_tdesc *in[1] = {&x};
  const void *data[1] = {xd};
  kh_node t;
  kh_node_init(&t, ES_OP_Transpose);
  kh_attr_ints(&t, "perm", to_nchw, 4);
  es_kinst k;
  /* In a plan: an NHWC output holding the input's bytes, aliasable. */
  ES_CHECK_RC(eval_lay(&t, 1, in, data, 1, true, 1, &od, &o, &k));
  check_dims(&od, 4, (int64_t[]){1, 3, 5, 6});
  assert_int_equal(od.layout, ES_LAYOUT_NHWC);
  assert_int_equal(k.inplace, 0);
  assert_memory_equal(o, xd, x.nbytes);
  es_mem_free(o);
  /* Outside a plan (es__kernel_eval, load-time folding): plain, moved. */
  ES_CHECK_RC(eval_lay(&t, 1, in, data, 1, false, 1, &od, &o, &k));
  assert_int_equal(od.layout, ES_LAYOUT_PLAIN);
  assert_int_equal(k.inplace, -1);
  void *want = kh_reorder4(xd, &od, false); /* xd read as NHWC of od's shape */
  assert_memory_equal(o, want, x.nbytes);
  es_mem_free(want);
  es_mem_free(o);

  /* NHWC [1,3,5,6] to logical NHWC [1,5,6,3]: a plain output, same bytes. */
  es_tdesc xn = kh_as_nhwc(kh_td(ES_DTYPE_FLOAT, 4, (int64_t[]){1, 3, 5, 6}));
  in[0] = &xn;
  t.attrs[0].ints = to_nhwc;
  ES_CHECK_RC(eval_lay(&t, 1, in, data, 1, true, 1, &od, &o, &k));
  check_dims(&od, 4, in_dims);
  assert_int_equal(od.layout, ES_LAYOUT_PLAIN);
  assert_int_equal(k.inplace, 0);
  assert_memory_equal(o, xd, x.nbytes);
  es_mem_free(o);
  es_mem_free(xd);

  /* Random permutations of NHWC inputs against the plain transpose. */
  for (int iter = 0; iter < 200; iter++) {
    size_t esz = (size_t[]){1, 4, 8}[es_test_rand(&seed) % 3];
    int64_t dims[4], perm[4] = {0, 1, 2, 3};
    for (int d = 0; d < 4; d++)
      dims[d] = 1 + (int64_t)(es_test_rand(&seed) % 6);
    for (int d = 3; d > 0; d--) {
      int j = (int)(es_test_rand(&seed) % (uint64_t)(d + 1));
      int64_t tmp = perm[d];
      perm[d] = perm[j], perm[j] = tmp;
    }
    es_tdesc xp = kh_td(dtype_of_size(esz), 4, dims), xq = kh_as_nhwc(xp), op, oq;
    void *xpd = tensor_fill(esz, xp.count), *xqd = kh_reorder4(xpd, &xp, true), *opd, *oqd;
    kh_node_init(&t, ES_OP_Transpose);
    kh_attr_ints(&t, "perm", perm, 4);
    ES_CHECK_RC(kh_eval1(&t.node, 13, &xp, xpd, &op, &opd));
    in[0] = &xq;
    data[0] = xqd;
    ES_CHECK_RC(eval_lay(&t, 1, in, data, 1, true, 1, &oq, &oqd, &k));
    assert_true(es__tdesc_same_shape(&op, &oq));
    void *got = oq.layout == ES_LAYOUT_NHWC ? kh_reorder4(oqd, &oq, false) : NULL;
    if (memcmp(got ? got : oqd, opd, op.nbytes))
      fail_msg("NHWC transpose iteration %d (perm %lld%lld%lld%lld, esz %zu) differs", iter,
               (long long)perm[0], (long long)perm[1], (long long)perm[2], (long long)perm[3],
               esz);
    if (k.inplace == 0)
      assert_memory_equal(oqd, xqd, xq.nbytes);
    es_mem_free(got);
    es_mem_free(opd);
    es_mem_free(oqd);
    es_mem_free(xpd);
    es_mem_free(xqd);
  }
}

/* ==========================================================================
 * Flatten, Unsqueeze
 * ======================================================================== */

static void test_flatten(void **state) {
  (void)state;
  float v[24];
  iota_f(v, 24);
  es_tdesc x = KH_TD(ES_DTYPE_FLOAT, 2, 3, 4), od;
  void *o;
  kh_node t;
  kh_node_init(&t, ES_OP_Flatten);
  /* Default axis 1, then 0, the end (3), and negative ones. */
  ES_CHECK_RC(kh_eval1(&t.node, 13, &x, v, &od, &o));
  check_dims(&od, 2, (int64_t[]){2, 12});
  assert_memory_equal(o, v, sizeof v);
  es_mem_free(o);
  static const struct {
    int64_t axis, d0, d1;
  } cases[] = {{0, 1, 24}, {3, 24, 1}, {-1, 6, 4}, {-3, 1, 24}, {-2, 2, 12}};
  kh_attr_int(&t, "axis", 0);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    t.attrs[0].i = cases[i].axis;
    ES_CHECK_RC(kh_eval1(&t.node, 13, &x, v, &od, &o));
    check_dims(&od, 2, (int64_t[]){cases[i].d0, cases[i].d1});
    assert_memory_equal(o, v, sizeof v);
    es_mem_free(o);
  }
  /* A scalar flattens to [1, 1]. */
  t.attrs[0].i = 0;
  es_tdesc s = kh_td(ES_DTYPE_INT64, 0, NULL);
  int64_t sv = 5;
  ES_CHECK_RC(kh_eval1(&t.node, 13, &s, &sv, &od, &o));
  check_dims(&od, 2, (int64_t[]){1, 1});
  es_mem_free(o);
  /* Out of range, and negative before opset 11. */
  t.attrs[0].i = 4;
  ES_EXPECT_RC(kh_eval1(&t.node, 13, &x, v, &od, &o), ES_EMODEL);
  t.attrs[0].i = -4;
  ES_EXPECT_RC(kh_eval1(&t.node, 13, &x, v, &od, &o), ES_EMODEL);
  t.attrs[0].i = -1;
  ES_EXPECT_RC(kh_eval1(&t.node, 9, &x, v, &od, &o), ES_EMODEL);
  /* A view: the planner may alias it. */
  es_kinst k;
  const es_tdesc *in[1] = {&x};
  const void *data[1] = {v};
  void *outd[1];
  ES_CHECK_RC(kh_eval_with(&t.node, &(kh_opts){.opset = 13, .k_out = &k}, 1, in, data, 1, &od,
                           outd));
  assert_int_equal(k.inplace, 0);
  es_mem_free(outd[0]);
}

static void test_unsqueeze(void **state) {
  (void)state;
  int64_t v[12];
  for (int i = 0; i < 12; i++)
    v[i] = i;
  es_tdesc x = KH_TD(ES_DTYPE_INT64, 3, 4), od;
  void *o;
  kh_node t;
  /* Opset 11 attribute with a negative axis (of the output's rank). */
  kh_node_init(&t, ES_OP_Unsqueeze);
  int64_t ax[2] = {0, -1};
  kh_attr_ints(&t, "axes", ax, 2);
  ES_CHECK_RC(kh_eval1(&t.node, 11, &x, v, &od, &o));
  check_dims(&od, 4, (int64_t[]){1, 3, 4, 1});
  assert_memory_equal(o, v, sizeof v);
  es_mem_free(o);
  /* Opset 13 input, unsorted. */
  kh_node_init(&t, ES_OP_Unsqueeze);
  int64_t ax2[2] = {3, 1};
  es_tdesc a = td1(ES_DTYPE_INT64, 2);
  const es_tdesc *in[2] = {&x, &a};
  const void *data[2] = {v, ax2};
  ES_CHECK_RC(es__kernel_eval(&t.node, 13, 2, in, data, 1, &od, &o));
  check_dims(&od, 4, (int64_t[]){3, 1, 4, 1});
  es_mem_free(o);
  /* A scalar becomes [1]. */
  es_tdesc s = kh_td(ES_DTYPE_INT64, 0, NULL), a1 = td1(ES_DTYPE_INT64, 1);
  int64_t zero[1] = {0};
  const es_tdesc *sin[2] = {&s, &a1};
  const void *sdata[2] = {v, zero};
  ES_CHECK_RC(es__kernel_eval(&t.node, 13, 2, sin, sdata, 1, &od, &o));
  check_dims(&od, 1, (int64_t[]){1});
  assert_int_equal(*(int64_t *)o, 0);
  es_mem_free(o);
  /* Errors: the same axis twice (-4 is 0 in rank 4), out of range, no
   * axes, axes not known when planning, a rank past the maximum. */
  int64_t dup[2] = {0, -4}, far[2] = {0, 4};
  data[1] = dup;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 2, in, data, 1, &od, &o), ES_EMODEL);
  data[1] = far;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 2, in, data, 1, &od, &o), ES_EMODEL);
  data[1] = NULL;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 2, in, data, 1, &od, &o), ES_ENOTSUP);
  ES_EXPECT_RC(kh_eval1(&t.node, 11, &x, v, &od, &o), ES_EMODEL);
  int64_t seven[7] = {0, 1, 2, 3, 4, 5, 6};
  es_tdesc a7 = td1(ES_DTYPE_INT64, 7);
  in[1] = &a7;
  data[1] = seven;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 2, in, data, 1, &od, &o), ES_ENOTSUP);
}

/* ==========================================================================
 * Expand, Tile
 * ======================================================================== */

static void test_expand(void **state) {
  (void)state;
  int64_t v[3] = {1, 2, 3};
  es_tdesc x = KH_TD(ES_DTYPE_INT64, 3, 1), od;
  void *o;
  kh_node t;
  kh_node_init(&t, ES_OP_Expand);
  /* [3, 1] to [2, 1, 4]: both broadcast directions at once. */
  int64_t shape[3] = {2, 1, 4};
  es_tdesc s3 = td1(ES_DTYPE_INT64, 3);
  const es_tdesc *in[2] = {&x, &s3};
  const void *data[2] = {v, shape};
  ES_CHECK_RC(es__kernel_eval(&t.node, 13, 2, in, data, 1, &od, &o));
  check_dims(&od, 3, (int64_t[]){2, 3, 4});
  for (int i = 0; i < 24; i++)
    assert_int_equal(((int64_t *)o)[i], v[i / 4 % 3]);
  es_mem_free(o);
  /* A shorter shape keeps the input's. */
  int64_t one[1] = {1};
  es_tdesc s1 = td1(ES_DTYPE_INT64, 1);
  in[1] = &s1;
  data[1] = one;
  ES_CHECK_RC(es__kernel_eval(&t.node, 13, 2, in, data, 1, &od, &o));
  check_dims(&od, 2, (int64_t[]){3, 1});
  assert_memory_equal(o, v, sizeof v);
  es_mem_free(o);
  /* Bytes from a scalar. */
  uint8_t b = 9;
  es_tdesc xs = kh_td(ES_DTYPE_BOOL, 0, NULL), s2 = td1(ES_DTYPE_INT64, 2);
  int64_t sh2[2] = {2, 3};
  const es_tdesc *bin[2] = {&xs, &s2};
  const void *bdata[2] = {&b, sh2};
  ES_CHECK_RC(es__kernel_eval(&t.node, 13, 2, bin, bdata, 1, &od, &o));
  check_dims(&od, 2, sh2);
  assert_memory_equal(o, ((uint8_t[]){9, 9, 9, 9, 9, 9}), 6);
  es_mem_free(o);
  /* Dims that do not broadcast, a negative dim, a shape not known. */
  int64_t bad[2] = {2, 4}, neg[2] = {-1, 1};
  in[1] = &s2;
  data[1] = bad;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 2, in, data, 1, &od, &o), ES_EMODEL);
  data[1] = neg;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 2, in, data, 1, &od, &o), ES_EMODEL);
  data[1] = NULL;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 2, in, data, 1, &od, &o), ES_ENOTSUP);
}

static void test_tile_random(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  for (int iter = 0; iter < 300; iter++) {
    int rank = (int)(es_test_rand(&seed) % 5);
    int64_t dims[ES_MAX_RANK], reps[ES_MAX_RANK], odims[ES_MAX_RANK];
    for (int d = 0; d < rank; d++) {
      dims[d] = 1 + (int64_t)(es_test_rand(&seed) % 4);
      reps[d] = (int64_t)(es_test_rand(&seed) % 4); /* 0 now and then: empty */
      odims[d] = dims[d] * reps[d];
    }
    size_t esz = (size_t[]){1, 4, 8}[es_test_rand(&seed) % 3];
    es_tdesc x = kh_td(dtype_of_size(esz), rank, dims), r = td1(ES_DTYPE_INT64, rank), od;
    void *xd = tensor_fill(esz, x.count), *o;
    kh_node t;
    kh_node_init(&t, ES_OP_Tile);
    const es_tdesc *in[2] = {&x, &r};
    const void *data[2] = {xd, reps};
    ES_CHECK_RC(es__kernel_eval(&t.node, 13, 2, in, data, 1, &od, &o));
    check_dims(&od, rank, odims);
    int64_t oidx[ES_MAX_RANK] = {0}, iidx[ES_MAX_RANK];
    size_t k = 0;
    if (od.count)
      do {
        for (int d = 0; d < rank; d++)
          iidx[d] = oidx[d] % dims[d];
        if (memcmp((char *)o + k * esz, (char *)xd + offset_of(rank, dims, iidx) * esz, esz))
          fail_msg("tile iter %d: element %zu differs", iter, k);
        k++;
      } while (idx_next(rank, odims, oidx));
    assert_int_equal(k, od.count);
    es_mem_free(o);
    es_mem_free(xd);
  }
  /* Errors: repeats of another length, negative repeats. */
  es_tdesc x = KH_TD(ES_DTYPE_FLOAT, 2, 2), r1 = td1(ES_DTYPE_INT64, 1), r2 = td1(ES_DTYPE_INT64, 2),
           od;
  float v[4] = {0};
  void *o;
  kh_node t;
  kh_node_init(&t, ES_OP_Tile);
  const es_tdesc *in[2] = {&x, &r1};
  const void *data[2] = {v, (int64_t[]){2}};
  ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 2, in, data, 1, &od, &o), ES_EMODEL);
  in[1] = &r2;
  data[1] = (int64_t[]){2, -1};
  ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 2, in, data, 1, &od, &o), ES_EMODEL);
}

/* ==========================================================================
 * Range
 * ======================================================================== */

static int range3(es_dtype dt, const void *s, const void *l, const void *d, unsigned dyn,
                  es_tdesc *od, void **o) {
  kh_node t;
  kh_node_init(&t, ES_OP_Range);
  es_tdesc sc = kh_td(dt, 0, NULL);
  const es_tdesc *in[3] = {&sc, &sc, &sc};
  const void *data[3] = {s, l, d};
  return kh_eval_with(&t.node, &(kh_opts){.opset = 11, .dyn = dyn}, 3, in, data, 1, od, o);
}

static void test_range(void **state) {
  (void)state;
  es_tdesc od;
  void *o;
  int32_t a = 10, b = 4, c = -3;
  ES_CHECK_RC(range3(ES_DTYPE_INT32, &a, &b, &c, 0, &od, &o));
  check_dims(&od, 1, (int64_t[]){2});
  assert_memory_equal(o, ((int32_t[]){10, 7}), 8);
  es_mem_free(o);
  int64_t s = -2, l = 3, d = 2;
  ES_CHECK_RC(range3(ES_DTYPE_INT64, &s, &l, &d, 0, &od, &o));
  assert_memory_equal(o, ((int64_t[]){-2, 0, 2}), 24);
  es_mem_free(o);
  float fs = 1, fl = 5, fd = 2;
  ES_CHECK_RC(range3(ES_DTYPE_FLOAT, &fs, &fl, &fd, 0, &od, &o));
  assert_memory_equal(o, ((float[]){1, 3}), 8);
  es_mem_free(o);
  /* 0.1 steps: start + i * delta, not an accumulated sum. */
  float gs = 0, gl = 1, gd = 0.1f;
  ES_CHECK_RC(range3(ES_DTYPE_FLOAT, &gs, &gl, &gd, 0, &od, &o));
  check_dims(&od, 1, (int64_t[]){10});
  assert_true(((float *)o)[7] == (float)(7 * (double)gd));
  es_mem_free(o);
  /* Going the wrong way is empty. */
  ES_CHECK_RC(range3(ES_DTYPE_INT64, &l, &s, &d, 0, &od, &o));
  check_dims(&od, 1, (int64_t[]){0});
  es_mem_free(o);
  /* Errors: delta 0, a huge length, bytes, values not known when planning
   * (the output's length would depend on the data). */
  int64_t zero = 0, lo = INT64_MIN, hi = INT64_MAX, one = 1;
  ES_EXPECT_RC(range3(ES_DTYPE_INT64, &s, &l, &zero, 0, &od, &o), ES_EMODEL);
  ES_EXPECT_RC(range3(ES_DTYPE_INT64, &lo, &hi, &one, 0, &od, &o), ES_EMODEL);
  float fz = 0;
  ES_EXPECT_RC(range3(ES_DTYPE_FLOAT, &fs, &fl, &fz, 0, &od, &o), ES_EMODEL);
  uint8_t u = 1;
  ES_EXPECT_RC(range3(ES_DTYPE_UINT8, &u, &u, &u, 0, &od, &o), ES_EMODEL);
  ES_EXPECT_RC(range3(ES_DTYPE_INT64, &s, &l, &d, 2, &od, &o), ES_ENOTSUP);
  assert_non_null(strstr(es_last_error_detail(), "limit"));
}

/* ==========================================================================
 * DepthToSpace, SpaceToDepth
 * ======================================================================== */

/* Reference DepthToSpace by its definition, element by element. */
static float ref_d2s(const float *x, const int64_t *d, int64_t b, bool crd, int64_t n, int64_t c,
                     int64_t h, int64_t w) {
  int64_t c2 = d[1] / (b * b), i = h % b, j = w % b;
  int64_t src_c = crd ? c * b * b + i * b + j : (i * b + j) * c2 + c;
  return x[((n * d[1] + src_c) * d[2] + h / b) * d[3] + w / b];
}

static void test_depth_to_space(void **state) {
  (void)state;
  float v[8];
  iota_f(v, 8);
  es_tdesc x = KH_TD(ES_DTYPE_FLOAT, 1, 8, 1, 1), od;
  void *o;
  kh_node t;
  /* Eight channels, block 2: DCR takes channel (i*2 + j)*2 + c, CRD
   * channel c*4 + i*2 + j. */
  kh_node_init(&t, ES_OP_DepthToSpace);
  kh_attr_int(&t, "blocksize", 2);
  ES_CHECK_RC(kh_eval1(&t.node, 13, &x, v, &od, &o));
  check_dims(&od, 4, (int64_t[]){1, 2, 2, 2});
  assert_memory_equal(o, ((float[]){0, 2, 4, 6, 1, 3, 5, 7}), 32);
  es_mem_free(o);
  es_attr *mode = kh_attr_add(&t, "mode", ES_ATTR_STRING);
  mode->s = "CRD";
  ES_CHECK_RC(kh_eval1(&t.node, 13, &x, v, &od, &o));
  assert_memory_equal(o, v, 32);
  es_mem_free(o);

  /* Larger shapes against the definition; SpaceToDepth undoes DCR. */
  int64_t dims[4] = {2, 12, 3, 5};
  float big[360];
  iota_f(big, 360);
  es_tdesc xb = kh_td(ES_DTYPE_FLOAT, 4, dims);
  for (int crd = 0; crd < 2; crd++) {
    mode->s = crd ? "CRD" : "DCR";
    ES_CHECK_RC(kh_eval1(&t.node, 13, &xb, big, &od, &o));
    check_dims(&od, 4, (int64_t[]){2, 3, 6, 10});
    const float *y = o;
    for (int64_t n = 0, k = 0; n < 2; n++)
      for (int64_t c = 0; c < 3; c++)
        for (int64_t h = 0; h < 6; h++)
          for (int64_t w = 0; w < 10; w++, k++)
            if (y[k] != ref_d2s(big, dims, 2, crd, n, c, h, w))
              fail_msg("%s: element %lld differs", mode->s, (long long)k);
    if (!crd) {
      kh_node s;
      kh_node_init(&s, ES_OP_SpaceToDepth);
      kh_attr_int(&s, "blocksize", 2);
      void *back;
      es_tdesc bd;
      ES_CHECK_RC(kh_eval1(&s.node, 13, &od, o, &bd, &back));
      check_dims(&bd, 4, dims);
      assert_memory_equal(back, big, sizeof big);
      es_mem_free(back);
    }
    es_mem_free(o);
  }
  /* Errors: channels not divisible, unknown mode, rank 3, no blocksize;
   * SpaceToDepth of a size not divisible. */
  mode->s = "DCR";
  es_tdesc x6 = KH_TD(ES_DTYPE_FLOAT, 1, 6, 1, 1), x3 = KH_TD(ES_DTYPE_FLOAT, 8, 1, 1);
  ES_EXPECT_RC(kh_eval1(&t.node, 13, &x6, v, &od, &o), ES_EMODEL);
  ES_EXPECT_RC(kh_eval1(&t.node, 13, &x3, v, &od, &o), ES_EMODEL);
  mode->s = "RDC";
  ES_EXPECT_RC(kh_eval1(&t.node, 13, &x, v, &od, &o), ES_EMODEL);
  kh_node_init(&t, ES_OP_DepthToSpace);
  ES_EXPECT_RC(kh_eval1(&t.node, 13, &x, v, &od, &o), ES_EMODEL);
  kh_node_init(&t, ES_OP_SpaceToDepth);
  kh_attr_int(&t, "blocksize", 2);
  es_tdesc odd = KH_TD(ES_DTYPE_FLOAT, 1, 1, 3, 2);
  ES_EXPECT_RC(kh_eval1(&t.node, 13, &odd, v, &od, &o), ES_EMODEL);
}

/* ==========================================================================
 * Trilu, OneHot, Size, EyeLike
 * ======================================================================== */

static int trilu(int64_t upper, const es_tdesc *x, const void *xd, const int64_t *k, es_tdesc *od,
                 void **o) {
  kh_node t;
  kh_node_init(&t, ES_OP_Trilu);
  if (upper >= 0)
    kh_attr_int(&t, "upper", upper);
  es_tdesc kt = kh_td(ES_DTYPE_INT64, 0, NULL);
  const es_tdesc *in[2] = {x, k ? &kt : NULL};
  const void *data[2] = {xd, k};
  /* k is read when running: leave it unknown while planning. */
  return kh_eval_with(&t.node, &(kh_opts){.opset = 14, .dyn = 2}, k ? 2 : 1, in, data, 1, od, o);
}

static void test_trilu(void **state) {
  (void)state;
  int32_t v[24];
  for (int i = 0; i < 24; i++)
    v[i] = i + 1;
  es_tdesc x = KH_TD(ES_DTYPE_INT32, 2, 3, 4), od;
  void *o;
  /* Upper (default), k omitted: j >= i. */
  ES_CHECK_RC(trilu(-1, &x, v, NULL, &od, &o));
  int32_t up0[12] = {1, 2, 3, 4, 0, 6, 7, 8, 0, 0, 11, 12};
  assert_memory_equal(o, up0, sizeof up0);
  assert_memory_equal((int32_t *)o + 12, ((int32_t[]){13, 14, 15, 16, 0, 18, 19, 20, 0, 0, 23,
                                                      24}),
                      sizeof up0);
  es_mem_free(o);
  /* Upper, k = 1 and k = -1; lower, k = -1; extreme k. */
  int64_t k1 = 1, km = -1, kbig = INT64_MAX, ksmall = INT64_MIN;
  ES_CHECK_RC(trilu(1, &x, v, &k1, &od, &o));
  assert_memory_equal(o, ((int32_t[]){0, 2, 3, 4, 0, 0, 7, 8, 0, 0, 0, 12}), 48);
  es_mem_free(o);
  ES_CHECK_RC(trilu(1, &x, v, &km, &od, &o));
  assert_memory_equal(o, ((int32_t[]){1, 2, 3, 4, 5, 6, 7, 8, 0, 10, 11, 12}), 48);
  es_mem_free(o);
  ES_CHECK_RC(trilu(0, &x, v, &km, &od, &o));
  assert_memory_equal(o, ((int32_t[]){0, 0, 0, 0, 5, 0, 0, 0, 9, 10, 0, 0}), 48);
  es_mem_free(o);
  ES_CHECK_RC(trilu(1, &x, v, &kbig, &od, &o));
  assert_memory_equal(o, ((int32_t[12]){0}), 48);
  es_mem_free(o);
  ES_CHECK_RC(trilu(0, &x, v, &ksmall, &od, &o));
  assert_memory_equal(o, ((int32_t[12]){0}), 48);
  es_mem_free(o);
  /* Bytes (bool); errors: rank 1, a k of another type. */
  uint8_t bv[4] = {1, 1, 1, 1};
  es_tdesc xb = KH_TD(ES_DTYPE_BOOL, 2, 2);
  ES_CHECK_RC(trilu(0, &xb, bv, NULL, &od, &o));
  assert_memory_equal(o, ((uint8_t[]){1, 0, 1, 1}), 4);
  es_mem_free(o);
  es_tdesc x1 = KH_TD(ES_DTYPE_INT32, 4);
  ES_EXPECT_RC(trilu(1, &x1, v, NULL, &od, &o), ES_EMODEL);
  kh_node t;
  kh_node_init(&t, ES_OP_Trilu);
  es_tdesc kf = kh_td(ES_DTYPE_FLOAT, 0, NULL);
  const es_tdesc *in[2] = {&x, &kf};
  const void *data[2] = {v, v};
  ES_EXPECT_RC(es__kernel_eval(&t.node, 14, 2, in, data, 1, &od, &o), ES_EMODEL);
}

static void test_onehot(void **state) {
  (void)state;
  int64_t idx[3] = {1, -1, 3}; /* 3 is out of [-3, 3): a row of off values */
  float depth = 3.0f;          /* a float depth truncates */
  int32_t vals[2] = {0, 5};
  es_tdesc it = td1(ES_DTYPE_INT64, 3), dt = kh_td(ES_DTYPE_FLOAT, 0, NULL),
           vt = td1(ES_DTYPE_INT32, 2), od;
  void *o;
  kh_node t;
  kh_node_init(&t, ES_OP_OneHot);
  const es_tdesc *in[3] = {&it, &dt, &vt};
  const void *data[3] = {idx, &depth, vals};
  ES_CHECK_RC(es__kernel_eval(&t.node, 11, 3, in, data, 1, &od, &o));
  check_dims(&od, 2, (int64_t[]){3, 3});
  assert_int_equal(od.dtype, ES_DTYPE_INT32);
  assert_memory_equal(o, ((int32_t[]){0, 5, 0, 0, 0, 5, 0, 0, 0}), 36);
  es_mem_free(o);
  /* Axis 0: depth first. Float indices truncate toward zero. */
  kh_attr_int(&t, "axis", 0);
  float fidx[3] = {1.7f, -1.2f, 0.0f};
  es_tdesc ft = td1(ES_DTYPE_FLOAT, 3);
  in[0] = &ft;
  data[0] = fidx;
  ES_CHECK_RC(es__kernel_eval(&t.node, 11, 3, in, data, 1, &od, &o));
  check_dims(&od, 2, (int64_t[]){3, 3});
  assert_memory_equal(o, ((int32_t[]){0, 0, 5, 5, 0, 0, 0, 5, 0}), 36);
  es_mem_free(o);
  /* Errors: depth not known when planning, values of one element, axis
   * out of range, bool indices. */
  data[1] = NULL;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 11, 3, in, data, 1, &od, &o), ES_ENOTSUP);
  data[1] = &depth;
  es_tdesc v1 = td1(ES_DTYPE_INT32, 1);
  in[2] = &v1;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 11, 3, in, data, 1, &od, &o), ES_EMODEL);
  in[2] = &vt;
  t.attrs[0].i = 2;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 11, 3, in, data, 1, &od, &o), ES_EMODEL);
  t.attrs[0].i = -1;
  es_tdesc bt = td1(ES_DTYPE_BOOL, 3);
  in[0] = &bt;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 11, 3, in, data, 1, &od, &o), ES_EMODEL);
}

static void test_size_eyelike(void **state) {
  (void)state;
  es_tdesc x = KH_TD(ES_DTYPE_UINT8, 2, 3, 4), od;
  void *o;
  kh_node t;
  kh_node_init(&t, ES_OP_Size);
  ES_CHECK_RC(kh_eval1(&t.node, 13, &x, NULL, &od, &o)); /* the data is never read */
  assert_int_equal(od.rank, 0);
  assert_int_equal(od.dtype, ES_DTYPE_INT64);
  assert_int_equal(*(int64_t *)o, 24);
  es_mem_free(o);

  es_tdesc m = KH_TD(ES_DTYPE_FLOAT, 3, 4);
  kh_node_init(&t, ES_OP_EyeLike);
  kh_attr_int(&t, "k", 1);
  kh_attr_int(&t, "dtype", ES_DTYPE_INT32);
  ES_CHECK_RC(kh_eval1(&t.node, 13, &m, NULL, &od, &o));
  assert_int_equal(od.dtype, ES_DTYPE_INT32);
  assert_memory_equal(o, ((int32_t[]){0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1}), 48);
  es_mem_free(o);
  t.attrs[0].i = -2;
  t.node.n_attr = 1; /* the input's type */
  ES_CHECK_RC(kh_eval1(&t.node, 13, &m, NULL, &od, &o));
  assert_memory_equal(o, ((float[]){0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0}), 48);
  es_mem_free(o);
  t.attrs[0].i = INT64_MIN; /* no diagonal at all */
  ES_CHECK_RC(kh_eval1(&t.node, 13, &m, NULL, &od, &o));
  assert_memory_equal(o, ((float[12]){0}), 48);
  es_mem_free(o);
  /* Errors: double (ONNX type 11) names the type; rank 3. */
  t.node.n_attr = 2;
  t.attrs[1].i = 11;
  ES_EXPECT_RC(kh_eval1(&t.node, 13, &m, NULL, &od, &o), ES_ENOTSUP);
  assert_non_null(strstr(es_last_error_detail(), "double"));
  t.node.n_attr = 1;
  ES_EXPECT_RC(kh_eval1(&t.node, 13, &x, NULL, &od, &o), ES_EMODEL);
}

/* ==========================================================================
 * ReverseSequence, Compress
 * ======================================================================== */

static void test_reverse_sequence(void **state) {
  (void)state;
  /* [time 4, batch 2, 2]: batch 0 reverses 3 steps, batch 1 all 4. */
  int64_t v[16];
  for (int i = 0; i < 16; i++)
    v[i] = i;
  es_tdesc x = KH_TD(ES_DTYPE_INT64, 4, 2, 2), lt = td1(ES_DTYPE_INT64, 2), od;
  int64_t lens[2] = {3, 4};
  void *o;
  kh_node t;
  kh_node_init(&t, ES_OP_ReverseSequence);
  const es_tdesc *in[2] = {&x, &lt};
  const void *data[2] = {v, lens};
  ES_CHECK_RC(kh_eval_with(&t.node, &(kh_opts){.opset = 10, .dyn = 3}, 2, in, data, 1, &od, &o));
  int64_t want[16] = {8, 9, 14, 15, 4, 5, 10, 11, 0, 1, 6, 7, 12, 13, 2, 3};
  assert_memory_equal(o, want, sizeof want);
  es_mem_free(o);
  /* batch_axis 0, time_axis 1, int32 lengths: [batch 2, time 4, 2]. */
  kh_attr_int(&t, "batch_axis", 0);
  kh_attr_int(&t, "time_axis", 1);
  es_tdesc xb = KH_TD(ES_DTYPE_INT64, 2, 4, 2), l32 = td1(ES_DTYPE_INT32, 2);
  int32_t lens32[2] = {0, 2};
  in[0] = &xb;
  in[1] = &l32;
  data[1] = lens32;
  ES_CHECK_RC(kh_eval_with(&t.node, &(kh_opts){.opset = 10, .dyn = 3}, 2, in, data, 1, &od, &o));
  int64_t want2[16] = {0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 8, 9, 12, 13, 14, 15};
  assert_memory_equal(o, want2, sizeof want2);
  es_mem_free(o);
  /* A length past the time axis is the request's error, found running. */
  int32_t bad[2] = {5, 1};
  data[1] = bad;
  ES_EXPECT_RC(kh_eval_with(&t.node, &(kh_opts){.opset = 10, .dyn = 3}, 2, in, data, 1, &od, &o),
               ES_EINVAL);
  assert_non_null(strstr(es_last_error_detail(), "sequence_lens[0] = 5"));
  /* Errors when planning: equal axes, lengths of the wrong count. */
  t.attrs[1].i = 0;
  data[1] = lens32;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 10, 2, in, data, 1, &od, &o), ES_EMODEL);
  t.attrs[1].i = 1;
  in[1] = &lt;
  es_tdesc l3 = td1(ES_DTYPE_INT64, 3);
  in[1] = &l3;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 10, 2, in, data, 1, &od, &o), ES_EMODEL);
}

static void test_compress(void **state) {
  (void)state;
  float v[6] = {1, 2, 3, 4, 5, 6};
  es_tdesc x = KH_TD(ES_DTYPE_FLOAT, 3, 2), od;
  void *o;
  kh_node t;
  kh_node_init(&t, ES_OP_Compress);
  kh_attr_int(&t, "axis", 0);
  uint8_t c3[3] = {0, 1, 1}, c2[2] = {0, 1}, c5[5] = {0, 1, 0, 0, 1}, c7[7] = {0};
  es_tdesc t3 = td1(ES_DTYPE_BOOL, 3), t2 = td1(ES_DTYPE_BOOL, 2), t5 = td1(ES_DTYPE_BOOL, 5),
           t7 = td1(ES_DTYPE_BOOL, 7);
  const es_tdesc *in[2] = {&x, &t3};
  const void *data[2] = {v, c3};
  ES_CHECK_RC(es__kernel_eval(&t.node, 11, 2, in, data, 1, &od, &o));
  check_dims(&od, 2, (int64_t[]){2, 2});
  assert_memory_equal(o, ((float[]){3, 4, 5, 6}), 16);
  es_mem_free(o);
  /* Negative axis; a condition shorter than the axis. */
  t.attrs[0].i = -1;
  in[1] = &t2;
  data[1] = c2;
  ES_CHECK_RC(es__kernel_eval(&t.node, 11, 2, in, data, 1, &od, &o));
  check_dims(&od, 2, (int64_t[]){3, 1});
  assert_memory_equal(o, ((float[]){2, 4, 6}), 12);
  es_mem_free(o);
  /* No axis: the input flattened. A longer condition is fine while its
   * extra entries are false. */
  t.node.n_attr = 0;
  in[1] = &t5;
  data[1] = c5;
  ES_CHECK_RC(es__kernel_eval(&t.node, 11, 2, in, data, 1, &od, &o));
  check_dims(&od, 1, (int64_t[]){2});
  assert_memory_equal(o, ((float[]){2, 5}), 8);
  es_mem_free(o);
  in[1] = &t7;
  data[1] = c7;
  ES_CHECK_RC(es__kernel_eval(&t.node, 11, 2, in, data, 1, &od, &o));
  check_dims(&od, 1, (int64_t[]){0});
  es_mem_free(o);
  /* A condition not known while planning: bounded by every index kept
   * (the condition's 5, of 6 elements), run sets the actual shape. */
  in[1] = &t5;
  data[1] = c5;
  es_kinst k;
  ES_CHECK_RC(kh_eval_with(&t.node, &(kh_opts){.opset = 11, .dyn = 2, .k_out = &k}, 2, in, data,
                           1, &od, &o));
  assert_int_equal(k.out_bound, 1);
  assert_non_null(strstr(k.bound_why, "5 indices kept"));
  check_dims(&od, 1, (int64_t[]){2});
  assert_memory_equal(o, ((float[]){2, 5}), 8);
  es_mem_free(o);
  /* Errors: a true past the end (the data's: at run time), a condition
   * that is not bool. */
  in[1] = &t7;
  data[1] = c7;
  c7[6] = 1;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 11, 2, in, data, 1, &od, &o), ES_EINVAL);
  assert_non_null(strstr(es_last_error_detail(), "condition selects index 6"));
  es_tdesc ti = td1(ES_DTYPE_INT64, 1);
  in[1] = &ti;
  data[1] = (int64_t[]){1};
  ES_EXPECT_RC(es__kernel_eval(&t.node, 11, 2, in, data, 1, &od, &o), ES_EMODEL);
}

/* ==========================================================================
 * Slice edges, Pad by hand, Upsample
 * ======================================================================== */

static void test_slice_edges(void **state) {
  (void)state;
  float v[5] = {0, 1, 2, 3, 4};
  es_tdesc x = td1(ES_DTYPE_FLOAT, 5), e = td1(ES_DTYPE_FLOAT, 0), od;
  void *o;
  /* An empty axis stays empty whatever the clamping, both directions. */
  int64_t st[1] = {-1}, en[1] = {INT64_MIN}, sp[1] = {-1};
  ES_CHECK_RC(slice13(&e, v, 1, st, en, NULL, sp, &od, &o));
  check_dims(&od, 1, (int64_t[]){0});
  es_mem_free(o);
  /* Steps beyond int64's negation: one element. */
  int64_t smin[1] = {INT64_MIN}, smax[1] = {INT64_MAX}, s0[1] = {0}, eend[1] = {INT64_MAX};
  ES_CHECK_RC(slice13(&x, v, 1, st, en, NULL, smin, &od, &o));
  check_dims(&od, 1, (int64_t[]){1});
  assert_true(((float *)o)[0] == 4);
  es_mem_free(o);
  ES_CHECK_RC(slice13(&x, v, 1, s0, eend, NULL, smax, &od, &o));
  check_dims(&od, 1, (int64_t[]){1});
  assert_true(((float *)o)[0] == 0);
  es_mem_free(o);
  /* Negative step from past the end clamps to the last element. */
  int64_t s9[1] = {9}, e1[1] = {1}, m2[1] = {-2};
  ES_CHECK_RC(slice13(&x, v, 1, s9, e1, NULL, m2, &od, &o));
  assert_memory_equal(o, ((float[]){4, 2}), 8);
  es_mem_free(o);
}

/* Pad of x (float) with pads at opset 19, mode m, into a fresh output. */
static int pad19(const es_tdesc *x, const float *xd, const int64_t *pads, const char *m,
                 es_tdesc *od, void **o) {
  kh_node t;
  kh_node_init(&t, ES_OP_Pad);
  kh_attr_str(&t, "mode", m);
  es_tdesc p = td1(ES_DTYPE_INT64, 2 * x->rank);
  const es_tdesc *in[2] = {x, &p};
  const void *data[2] = {xd, pads};
  return es__kernel_eval(&t.node, 19, 2, in, data, 1, od, o);
}

static void test_pad_modes(void **state) {
  (void)state;
  float v[4] = {1, 2, 3, 4};
  es_tdesc x = td1(ES_DTYPE_FLOAT, 3), od;
  void *o;
  int64_t p22[2] = {2, 2};
  ES_CHECK_RC(pad19(&x, v, p22, "reflect", &od, &o));
  assert_memory_equal(o, ((float[]){3, 2, 1, 2, 3, 2, 1}), 28);
  es_mem_free(o);
  ES_CHECK_RC(pad19(&x, v, p22, "edge", &od, &o));
  assert_memory_equal(o, ((float[]){1, 1, 1, 2, 3, 3, 3}), 28);
  es_mem_free(o);
  ES_CHECK_RC(pad19(&x, v, p22, "wrap", &od, &o));
  assert_memory_equal(o, ((float[]){2, 3, 1, 2, 3, 1, 2}), 28);
  es_mem_free(o);
  /* Wrapping more than the whole axis, and a crop at one end wrapped at
   * the other: what is left after cropping repeats ([2 3 4] -> 2 3 4 2 3). */
  int64_t p05[2] = {0, 5}, pm[2] = {-1, 2};
  ES_CHECK_RC(pad19(&x, v, p05, "wrap", &od, &o));
  assert_memory_equal(o, ((float[]){1, 2, 3, 1, 2, 3, 1, 2}), 32);
  es_mem_free(o);
  es_tdesc x4 = td1(ES_DTYPE_FLOAT, 4);
  ES_CHECK_RC(pad19(&x4, v, pm, "wrap", &od, &o));
  assert_memory_equal(o, ((float[]){2, 3, 4, 2, 3}), 20);
  es_mem_free(o);
  ES_CHECK_RC(pad19(&x4, v, pm, "reflect", &od, &o));
  assert_memory_equal(o, ((float[]){2, 3, 4, 3, 2}), 20);
  es_mem_free(o);
  /* Two dims. */
  es_tdesc m = KH_TD(ES_DTYPE_FLOAT, 2, 2);
  int64_t p4[4] = {1, 1, 1, 1};
  ES_CHECK_RC(pad19(&m, v, p4, "wrap", &od, &o));
  assert_memory_equal(o, ((float[]){4, 3, 4, 3, 2, 1, 2, 1, 4, 3, 4, 3, 2, 1, 2, 1}), 64);
  es_mem_free(o);
  int64_t p4b[4] = {1, 0, 0, 1};
  ES_CHECK_RC(pad19(&m, v, p4b, "reflect", &od, &o));
  check_dims(&od, 2, (int64_t[]){3, 3});
  assert_memory_equal(o, ((float[]){3, 4, 3, 1, 2, 1, 3, 4, 3}), 36);
  es_mem_free(o);
  ES_CHECK_RC(pad19(&m, v, p4b, "edge", &od, &o));
  assert_memory_equal(o, ((float[]){1, 2, 2, 1, 2, 2, 3, 4, 4}), 36);
  es_mem_free(o);
  /* Cropping everything leaves nothing to wrap. */
  int64_t pall[2] = {-4, 1};
  ES_EXPECT_RC(pad19(&x4, v, pall, "wrap", &od, &o), ES_EMODEL);
}

static void test_upsample(void **state) {
  (void)state;
  es_tdesc od;
  void *o;
  kh_node t;
  /* Opset 9: scales as an input; nearest on int64 (copied as bytes). */
  int64_t iv[4] = {1, 2, 3, 4};
  float sc[4] = {1, 1, 2, 1.5f};
  es_tdesc x = KH_TD(ES_DTYPE_INT64, 1, 1, 2, 2), s = td1(ES_DTYPE_FLOAT, 4);
  kh_node_init(&t, ES_OP_Upsample);
  const es_tdesc *in[2] = {&x, &s};
  const void *data[2] = {iv, sc};
  ES_CHECK_RC(es__kernel_eval(&t.node, 9, 2, in, data, 1, &od, &o));
  check_dims(&od, 4, (int64_t[]){1, 1, 4, 3});
  assert_memory_equal(o, ((int64_t[]){1, 1, 2, 1, 1, 2, 3, 3, 4, 3, 3, 4}), 96);
  es_mem_free(o);
  /* Opset 7: scales as an attribute; linear (asymmetric, clamped at the
   * end) as the operator's own example. */
  float fv[4] = {1, 2, 3, 4};
  float sc2[4] = {1, 1, 2, 4};
  es_tdesc xf = KH_TD(ES_DTYPE_FLOAT, 1, 1, 2, 2);
  kh_node_init(&t, ES_OP_Upsample);
  kh_attr_str(&t, "mode", "linear");
  kh_attr_floats(&t, "scales", sc2, 4);
  ES_CHECK_RC(kh_eval1(&t.node, 7, &xf, fv, &od, &o));
  check_dims(&od, 4, (int64_t[]){1, 1, 4, 8});
  float want[32] = {1, 1.25f, 1.5f, 1.75f, 2, 2, 2, 2, 2, 2.25f, 2.5f, 2.75f, 3, 3, 3, 3,
                    3, 3.25f, 3.5f, 3.75f, 4, 4, 4, 4, 3, 3.25f, 3.5f, 3.75f, 4, 4, 4, 4};
  assert_memory_equal(o, want, sizeof want);
  es_mem_free(o);
  /* Errors: linear on integers, a scale below 1, scales of another count,
   * an unknown mode, scales not known when planning. */
  ES_EXPECT_RC(kh_eval1(&t.node, 7, &x, iv, &od, &o), ES_ENOTSUP);
  sc2[2] = 0.5f;
  ES_EXPECT_RC(kh_eval1(&t.node, 7, &xf, fv, &od, &o), ES_EMODEL);
  sc2[2] = 2;
  t.attrs[1].n = 3;
  ES_EXPECT_RC(kh_eval1(&t.node, 7, &xf, fv, &od, &o), ES_EMODEL);
  t.attrs[1].n = 4;
  t.attrs[0].s = "cubic";
  ES_EXPECT_RC(kh_eval1(&t.node, 7, &xf, fv, &od, &o), ES_EMODEL);
  kh_node_init(&t, ES_OP_Upsample);
  data[1] = NULL;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 9, 2, in, data, 1, &od, &o), ES_ENOTSUP);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shape),
      cmocka_unit_test(test_reshape),
      cmocka_unit_test(test_inplace),
      cmocka_unit_test(test_squeeze),
      cmocka_unit_test(test_concat),
      cmocka_unit_test(test_slice),
      cmocka_unit_test(test_split),
      cmocka_unit_test(test_transpose_random),
      cmocka_unit_test(test_transpose_errors),
      cmocka_unit_test(test_slice_random),
      cmocka_unit_test(test_pad_random),
      cmocka_unit_test(test_pad_errors),
      cmocka_unit_test(test_constant_of_shape),
      cmocka_unit_test(test_concat_nhwc),
      cmocka_unit_test(test_split_nhwc),
      cmocka_unit_test(test_transpose_nhwc),
      cmocka_unit_test(test_flatten),
      cmocka_unit_test(test_unsqueeze),
      cmocka_unit_test(test_expand),
      cmocka_unit_test(test_tile_random),
      cmocka_unit_test(test_range),
      cmocka_unit_test(test_depth_to_space),
      cmocka_unit_test(test_trilu),
      cmocka_unit_test(test_onehot),
      cmocka_unit_test(test_size_eyelike),
      cmocka_unit_test(test_reverse_sequence),
      cmocka_unit_test(test_compress),
      cmocka_unit_test(test_slice_edges),
      cmocka_unit_test(test_pad_modes),
      cmocka_unit_test(test_upsample),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
