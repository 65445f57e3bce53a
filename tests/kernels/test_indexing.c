/* Indexing kernels (Gather, GatherElements, GatherND, ScatterND,
 * ScatterElements, Scatter, NonZero, Unique) one node at a time, and a shape chain of a
 * detection export (Shape -> Gather -> Unsqueeze -> Concat -> Reshape)
 * through a whole model, where it must fold while planning.
 *
 * Indices are request data: the error cases leave them unknown while
 * planning, as a model input is, so infer succeeds and run must refuse an
 * index out of range with ES_EINVAL naming the node, touching nothing
 * outside the tensors (the ASan build checks that part). Hand-checked
 * cases come from the operators' definitions; Gather is also compared
 * with a naive reference over random shapes, axes and element sizes. */
#include "es_test.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernel.h"
#include "support/kernel_harness.h"
#include "support/onnx_builder.h"

/* ==========================================================================
 * Helpers
 * ======================================================================== */

static void check_dims(const es_tdesc *t, int rank, const int64_t *dims) {
  assert_int_equal(t->rank, rank);
  for (int i = 0; i < rank; i++)
    assert_int_equal(t->dims[i], dims[i]);
}

/* Evaluates nd with the indices (input 1) unknown while planning, as a
 * model input would be; out[0] is the output. */
static int eval_dyn(const kh_node *t, int64_t opset, int n_in, const es_tdesc *const *in,
                    const void *const *data, es_tdesc *od, void **o) {
  return kh_eval_with(&t->node, &(kh_opts){.opset = opset, .dyn = 2}, n_in, in, data, 1, od, o);
}

/* The last error names the node the harness builds ("t", #7) and says
 * which index was wrong. */
static void check_index_error(const char *what) {
  const char *d = es_last_error_detail();
  if (!strstr(d, "'t'") || !strstr(d, what))
    fail_msg("error detail '%s' should name node 't' and '%s'", d, what);
}

/* ==========================================================================
 * Gather
 * ======================================================================== */

static void test_gather(void **state) {
  (void)state;
  float v[6] = {0, 1, 2, 3, 4, 5};
  es_tdesc x = KH_TD(ES_DTYPE_FLOAT, 3, 2), od;
  void *o;
  kh_node t;
  kh_node_init(&t, ES_OP_Gather);
  /* Axis 0, 2-D int64 indices with a negative one. */
  int64_t idx[4] = {0, -1, 2, 1};
  es_tdesc it = KH_TD(ES_DTYPE_INT64, 2, 2);
  const es_tdesc *in[2] = {&x, &it};
  const void *data[2] = {v, idx};
  ES_CHECK_RC(eval_dyn(&t, 13, 2, in, data, &od, &o));
  check_dims(&od, 3, (int64_t[]){2, 2, 2});
  assert_memory_equal(o, ((float[]){0, 1, 4, 5, 4, 5, 2, 3}), 32);
  es_mem_free(o);
  /* Axis -1 with a scalar int32 index: the axis goes away. */
  kh_attr_int(&t, "axis", -1);
  int32_t last = -1;
  es_tdesc st = kh_td(ES_DTYPE_INT32, 0, NULL);
  in[1] = &st;
  data[1] = &last;
  ES_CHECK_RC(eval_dyn(&t, 13, 2, in, data, &od, &o));
  check_dims(&od, 1, (int64_t[]){3});
  assert_memory_equal(o, ((float[]){1, 3, 5}), 12);
  es_mem_free(o);

  /* Out of range either way: an error of the request, found running. */
  int32_t bad[2] = {2, -3};
  for (int i = 0; i < 2; i++) {
    data[1] = &bad[i];
    ES_EXPECT_RC(eval_dyn(&t, 13, 2, in, data, &od, &o), ES_EINVAL);
    assert_null(o);
    check_index_error(i ? "index -3" : "index 2");
  }
  t.attrs[0].i = 0;
  int64_t bad2[4] = {0, 1, 3, 0};
  in[1] = &it;
  data[1] = bad2;
  ES_EXPECT_RC(eval_dyn(&t, 13, 2, in, data, &od, &o), ES_EINVAL);
  check_index_error("indices element 2");
  /* The same at load time (every input constant). */
  ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 2, in, data, 1, &od, &o), ES_EINVAL);
  /* Errors when planning: float indices, a bad axis, a scalar data. */
  es_tdesc fi = KH_TD(ES_DTYPE_FLOAT, 1);
  in[1] = &fi;
  data[1] = v;
  ES_EXPECT_RC(eval_dyn(&t, 13, 2, in, data, &od, &o), ES_EMODEL);
  in[1] = &it;
  data[1] = idx;
  t.attrs[0].i = 2;
  ES_EXPECT_RC(eval_dyn(&t, 13, 2, in, data, &od, &o), ES_EMODEL);
  t.attrs[0].i = 0;
  es_tdesc sc = kh_td(ES_DTYPE_FLOAT, 0, NULL);
  in[0] = &sc;
  ES_EXPECT_RC(eval_dyn(&t, 13, 2, in, data, &od, &o), ES_EMODEL);
}

/* Random shapes, axes, index types and element sizes against a naive
 * reference. */
static void test_gather_random(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  for (int iter = 0; iter < 300; iter++) {
    int r = 1 + (int)(es_test_rand(&seed) % 4), q = (int)(es_test_rand(&seed) % 3);
    int64_t dims[ES_MAX_RANK], idims[ES_MAX_RANK];
    for (int d = 0; d < r; d++)
      dims[d] = 1 + (int64_t)(es_test_rand(&seed) % 4);
    for (int d = 0; d < q; d++)
      idims[d] = 1 + (int64_t)(es_test_rand(&seed) % 3);
    int axis = (int)(es_test_rand(&seed) % (uint64_t)r);
    size_t esz = (size_t[]){1, 4, 8}[es_test_rand(&seed) % 3];
    bool i64 = es_test_rand(&seed) % 2;
    es_tdesc x = kh_td(esz == 1 ? ES_DTYPE_INT8 : esz == 4 ? ES_DTYPE_INT32 : ES_DTYPE_INT64, r,
                       dims);
    es_tdesc it = kh_td(i64 ? ES_DTYPE_INT64 : ES_DTYPE_INT32, q, idims), od;
    unsigned char *xd = es_mem_alloc(ES_MEM_OTHER, x.nbytes);
    for (size_t i = 0; i < x.nbytes; i++)
      xd[i] = (unsigned char)es_test_rand(&seed);
    int64_t *iv = es_mem_alloc(ES_MEM_OTHER, it.count * 8 + 8);
    int32_t *iv32 = (int32_t *)iv;
    int64_t n = dims[axis];
    for (size_t i = 0; i < it.count; i++) {
      int64_t v = (int64_t)(es_test_rand(&seed) % (uint64_t)(2 * n)) - n;
      if (i64)
        iv[i] = v;
      else
        iv32[i] = (int32_t)v;
    }
    kh_node t;
    kh_node_init(&t, ES_OP_Gather);
    kh_attr_int(&t, "axis", axis - (int)(es_test_rand(&seed) % 2) * r);
    const es_tdesc *in[2] = {&x, &it};
    const void *data[2] = {xd, iv};
    void *o;
    ES_CHECK_RC(eval_dyn(&t, 13, 2, in, data, &od, &o));
    assert_int_equal(od.rank, q + r - 1);
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis; d++)
      outer *= dims[d];
    for (int d = axis + 1; d < r; d++)
      inner *= dims[d];
    const unsigned char *y = o;
    for (int64_t a = 0, k = 0; a < outer; a++)
      for (size_t j = 0; j < it.count; j++) {
        int64_t v = i64 ? iv[j] : iv32[j];
        v += v < 0 ? n : 0;
        for (int64_t b = 0; b < inner; b++, k++)
          if (memcmp(y + (size_t)k * esz, xd + (size_t)((a * n + v) * inner + b) * esz, esz))
            fail_msg("gather iter %d: element %lld differs", iter, (long long)k);
      }
    es_mem_free(o);
    es_mem_free(iv);
    es_mem_free(xd);
  }
}

/* ==========================================================================
 * GatherElements, ScatterElements, Scatter
 * ======================================================================== */

static void test_gather_elements(void **state) {
  (void)state;
  int32_t v[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  es_tdesc x = KH_TD(ES_DTYPE_INT32, 3, 3), od;
  void *o;
  kh_node t;
  kh_node_init(&t, ES_OP_GatherElements);
  /* Axis 0, indices smaller than data in the other dim, a negative one. */
  int64_t idx[4] = {1, 2, -1, 0};
  es_tdesc it = KH_TD(ES_DTYPE_INT64, 2, 2);
  const es_tdesc *in[2] = {&x, &it};
  const void *data[2] = {v, idx};
  ES_CHECK_RC(eval_dyn(&t, 13, 2, in, data, &od, &o));
  check_dims(&od, 2, (int64_t[]){2, 2});
  assert_memory_equal(o, ((int32_t[]){4, 8, 7, 2}), 16);
  es_mem_free(o);
  /* Axis 1 (the spec's example). */
  kh_attr_int(&t, "axis", 1);
  int64_t idx1[4] = {0, 0, 1, 0};
  data[1] = idx1;
  ES_CHECK_RC(eval_dyn(&t, 13, 2, in, data, &od, &o));
  assert_memory_equal(o, ((int32_t[]){1, 1, 5, 4}), 16);
  es_mem_free(o);
  /* Out of range: found running. */
  int64_t bad[4] = {0, 0, 3, 0};
  data[1] = bad;
  ES_EXPECT_RC(eval_dyn(&t, 13, 2, in, data, &od, &o), ES_EINVAL);
  check_index_error("index 3");
  /* Errors when planning: another rank, indices larger than data. */
  es_tdesc i1 = KH_TD(ES_DTYPE_INT64, 4), i4 = KH_TD(ES_DTYPE_INT64, 4, 1);
  in[1] = &i1;
  ES_EXPECT_RC(eval_dyn(&t, 13, 2, in, data, &od, &o), ES_EMODEL);
  in[1] = &i4;
  ES_EXPECT_RC(eval_dyn(&t, 13, 2, in, data, &od, &o), ES_EMODEL);
}

static int scatter_el(es_op op, int64_t opset, const char *red, int64_t axis, const es_tdesc *x,
                      const void *xd, const es_tdesc *it, const void *id, const void *ud,
                      es_tdesc *od, void **o) {
  kh_node t;
  kh_node_init(&t, op);
  kh_attr_int(&t, "axis", axis);
  if (red)
    kh_attr_str(&t, "reduction", red);
  es_tdesc ut = *it;
  ut.dtype = x->dtype;
  ut.nbytes = ut.count * es_dtype_size(x->dtype);
  const es_tdesc *in[3] = {x, it, &ut};
  const void *data[3] = {xd, id, ud};
  return kh_eval_with(&t.node, &(kh_opts){.opset = opset, .dyn = 6}, 3, in, data, 1, od, o);
}

static void test_scatter_elements(void **state) {
  (void)state;
  float z[9] = {0};
  es_tdesc x = KH_TD(ES_DTYPE_FLOAT, 3, 3), it = KH_TD(ES_DTYPE_INT64, 2, 3), od;
  int64_t idx[6] = {1, 0, 2, 0, 2, 1};
  float upd[6] = {1.0f, 1.1f, 1.2f, 2.0f, 2.1f, 2.2f};
  void *o;
  /* The spec's example, as ScatterElements and as opset 9's Scatter. */
  float want[9] = {2.0f, 1.1f, 0, 1.0f, 0, 2.2f, 0, 2.1f, 1.2f};
  ES_CHECK_RC(scatter_el(ES_OP_ScatterElements, 13, NULL, 0, &x, z, &it, idx, upd, &od, &o));
  assert_memory_equal(o, want, sizeof want);
  es_mem_free(o);
  ES_CHECK_RC(scatter_el(ES_OP_Scatter, 9, NULL, 0, &x, z, &it, idx, upd, &od, &o));
  assert_memory_equal(o, want, sizeof want);
  es_mem_free(o);
  /* Duplicates along axis 1 with a negative index: add sums them (opset
   * 16), max keeps the largest (18). */
  float d[5] = {1, 2, 3, 4, 5};
  es_tdesc x15 = KH_TD(ES_DTYPE_FLOAT, 1, 5), i12 = KH_TD(ES_DTYPE_INT64, 1, 3);
  int64_t dup[3] = {1, -4, 3};
  float u3[3] = {1.5f, 0.5f, 9.0f};
  ES_CHECK_RC(scatter_el(ES_OP_ScatterElements, 16, "add", 1, &x15, d, &i12, dup, u3, &od, &o));
  assert_memory_equal(o, ((float[]){1, 4, 3, 13, 5}), 20);
  es_mem_free(o);
  ES_CHECK_RC(scatter_el(ES_OP_ScatterElements, 18, "max", -1, &x15, d, &i12, dup, u3, &od, &o));
  assert_memory_equal(o, ((float[]){1, 2, 3, 9, 5}), 20);
  es_mem_free(o);
  /* Errors: max before opset 18, an unknown reduction, an index out of
   * range (running), updates of another shape. */
  ES_EXPECT_RC(scatter_el(ES_OP_ScatterElements, 16, "max", 1, &x15, d, &i12, dup, u3, &od, &o),
               ES_EMODEL);
  ES_EXPECT_RC(scatter_el(ES_OP_ScatterElements, 18, "sum", 1, &x15, d, &i12, dup, u3, &od, &o),
               ES_EMODEL);
  int64_t far[3] = {0, 5, 0};
  ES_EXPECT_RC(scatter_el(ES_OP_ScatterElements, 18, NULL, 1, &x15, d, &i12, far, u3, &od, &o),
               ES_EINVAL);
  check_index_error("index 5");
  kh_node t;
  kh_node_init(&t, ES_OP_ScatterElements);
  es_tdesc u2 = KH_TD(ES_DTYPE_FLOAT, 1, 2);
  const es_tdesc *in[3] = {&x15, &i12, &u2};
  const void *data[3] = {d, dup, u3};
  ES_EXPECT_RC(es__kernel_eval(&t.node, 13, 3, in, data, 1, &od, &o), ES_EMODEL);
}

/* ==========================================================================
 * GatherND, ScatterND
 * ======================================================================== */

static int gather_nd(int64_t batch_dims, const es_tdesc *x, const void *xd, const es_tdesc *it,
                     const void *id, es_tdesc *od, void **o) {
  kh_node t;
  kh_node_init(&t, ES_OP_GatherND);
  if (batch_dims >= 0)
    kh_attr_int(&t, "batch_dims", batch_dims);
  const es_tdesc *in[2] = {x, it};
  const void *data[2] = {xd, id};
  return eval_dyn(&t, 13, 2, in, data, od, o);
}

static void test_gather_nd(void **state) {
  (void)state;
  es_tdesc od;
  void *o;
  /* The spec's examples: whole elements, then slices. */
  int32_t a[4] = {0, 1, 2, 3};
  es_tdesc x2 = KH_TD(ES_DTYPE_INT32, 2, 2), i22 = KH_TD(ES_DTYPE_INT64, 2, 2),
           i21 = KH_TD(ES_DTYPE_INT64, 2, 1);
  int64_t e[4] = {0, 0, 1, 1}, s[2] = {1, 0};
  ES_CHECK_RC(gather_nd(-1, &x2, a, &i22, e, &od, &o));
  check_dims(&od, 1, (int64_t[]){2});
  assert_memory_equal(o, ((int32_t[]){0, 3}), 8);
  es_mem_free(o);
  ES_CHECK_RC(gather_nd(0, &x2, a, &i21, s, &od, &o));
  check_dims(&od, 2, (int64_t[]){2, 2});
  assert_memory_equal(o, ((int32_t[]){2, 3, 0, 1}), 16);
  es_mem_free(o);
  /* batch_dims 1: each batch indexes its own [2, 2]. */
  float b[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  es_tdesc x3 = KH_TD(ES_DTYPE_FLOAT, 2, 2, 2);
  ES_CHECK_RC(gather_nd(1, &x3, b, &i21, s, &od, &o));
  check_dims(&od, 2, (int64_t[]){2, 2});
  assert_memory_equal(o, ((float[]){2, 3, 4, 5}), 16);
  es_mem_free(o);
  /* batch_dims 1 with whole tuples and a negative index: [2, 1, 2]. */
  int64_t tup[4] = {0, 1, -1, 0};
  es_tdesc i212 = KH_TD(ES_DTYPE_INT64, 2, 1, 2);
  ES_CHECK_RC(gather_nd(1, &x3, b, &i212, tup, &od, &o));
  check_dims(&od, 2, (int64_t[]){2, 1});
  assert_memory_equal(o, ((float[]){1, 6}), 8);
  es_mem_free(o);
  /* Out of range (running); batch dims that differ, a tuple too long, a
   * batch_dims past the indices (planning). */
  int64_t bad[2] = {1, -3};
  ES_EXPECT_RC(gather_nd(1, &x3, b, &i21, bad, &od, &o), ES_EINVAL);
  check_index_error("index -3");
  es_tdesc i31 = KH_TD(ES_DTYPE_INT64, 3, 1), i13 = KH_TD(ES_DTYPE_INT64, 1, 3);
  ES_EXPECT_RC(gather_nd(1, &x3, b, &i31, bad, &od, &o), ES_EMODEL);
  ES_EXPECT_RC(gather_nd(0, &x2, a, &i13, bad, &od, &o), ES_EMODEL);
  ES_EXPECT_RC(gather_nd(2, &x3, b, &i21, bad, &od, &o), ES_EMODEL);
}

static int scatter_nd(int64_t opset, const char *red, const es_tdesc *x, const void *xd,
                      const es_tdesc *it, const void *id, const es_tdesc *ut, const void *ud,
                      es_tdesc *od, void **o) {
  kh_node t;
  kh_node_init(&t, ES_OP_ScatterND);
  if (red)
    kh_attr_str(&t, "reduction", red);
  const es_tdesc *in[3] = {x, it, ut};
  const void *data[3] = {xd, id, ud};
  return kh_eval_with(&t.node, &(kh_opts){.opset = opset, .dyn = 6}, 3, in, data, 1, od, o);
}

static void test_scatter_nd(void **state) {
  (void)state;
  es_tdesc od;
  void *o;
  /* Duplicate indices (4 twice) reduce in order. */
  float d[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  int64_t idx[5] = {4, 3, 1, 7, -4};
  float u[5] = {9, 10, 11, 12, 13};
  es_tdesc x = KH_TD(ES_DTYPE_FLOAT, 8), it = KH_TD(ES_DTYPE_INT64, 5, 1),
           ut = KH_TD(ES_DTYPE_FLOAT, 5);
  static const struct {
    const char *red;
    float want[8];
  } cases[] = {{NULL, {1, 11, 3, 10, 13, 6, 7, 12}},
               {"add", {1, 13, 3, 14, 27, 6, 7, 20}},
               {"mul", {1, 22, 3, 40, 585, 6, 7, 96}},
               {"max", {1, 11, 3, 10, 13, 6, 7, 12}},
               {"min", {1, 2, 3, 4, 5, 6, 7, 8}}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ES_CHECK_RC(scatter_nd(18, cases[i].red, &x, d, &it, idx, &ut, u, &od, &o));
    if (memcmp(o, cases[i].want, sizeof cases[i].want))
      fail_msg("reduction %s differs", cases[i].red ? cases[i].red : "none");
    es_mem_free(o);
  }
  /* Rows of int64 addressed by one index each, with add. */
  int64_t dl[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  int64_t sidx[2] = {1, 1};
  es_tdesc xl = KH_TD(ES_DTYPE_INT64, 2, 4), il = KH_TD(ES_DTYPE_INT64, 2, 1),
           ull = KH_TD(ES_DTYPE_INT64, 2, 4);
  int64_t u2[8] = {10, 20, 30, 40, 1, 1, 1, 1};
  ES_CHECK_RC(scatter_nd(16, "add", &xl, dl, &il, sidx, &ull, u2, &od, &o));
  assert_memory_equal(o, ((int64_t[]){1, 2, 3, 4, 16, 27, 38, 49}), 64);
  es_mem_free(o);
  /* bool: add is or, mul is and. */
  uint8_t bd[4] = {0, 1, 0, 1}, bu[2] = {1, 0};
  int64_t bi[2] = {0, 1};
  es_tdesc xb = KH_TD(ES_DTYPE_BOOL, 4), ib = KH_TD(ES_DTYPE_INT64, 2, 1),
           ub = KH_TD(ES_DTYPE_BOOL, 2);
  ES_CHECK_RC(scatter_nd(16, "add", &xb, bd, &ib, bi, &ub, bu, &od, &o));
  assert_memory_equal(o, ((uint8_t[]){1, 1, 0, 1}), 4);
  es_mem_free(o);
  ES_CHECK_RC(scatter_nd(16, "mul", &xb, bd, &ib, bi, &ub, bu, &od, &o));
  assert_memory_equal(o, ((uint8_t[]){0, 0, 0, 1}), 4);
  es_mem_free(o);
  /* Errors: an index out of range (running, after earlier writes went to
   * the output only), add before opset 16, updates of another shape. */
  int64_t far[5] = {4, 3, 8, 7, 4};
  ES_EXPECT_RC(scatter_nd(18, "add", &x, d, &it, far, &ut, u, &od, &o), ES_EINVAL);
  check_index_error("index 8");
  assert_memory_equal(d, ((float[]){1, 2, 3, 4, 5, 6, 7, 8}), 32);
  ES_EXPECT_RC(scatter_nd(13, "add", &x, d, &it, idx, &ut, u, &od, &o), ES_EMODEL);
  es_tdesc u4 = KH_TD(ES_DTYPE_FLOAT, 4);
  ES_EXPECT_RC(scatter_nd(13, NULL, &x, d, &it, idx, &u4, u, &od, &o), ES_EMODEL);
  /* In place: the planner may give the output data's buffer. */
  kh_node t;
  kh_node_init(&t, ES_OP_ScatterND);
  const es_tdesc *in[3] = {&x, &it, &ut};
  const void *data[3] = {d, idx, u};
  es_kinst k;
  void *outd[1];
  ES_CHECK_RC(kh_eval_with(&t.node, &(kh_opts){.opset = 13, .dyn = 7, .inplace = 1, .k_out = &k},
                           3, in, data, 1, &od, outd));
  assert_int_equal(k.inplace, 0);
  assert_memory_equal(outd[0], cases[0].want, 32);
  es_mem_free(outd[0]);
}

/* ==========================================================================
 * A shape chain folds while planning
 * ======================================================================== */

/* y = Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [-1])): what a
 * torchvision export writes for x.flatten(1). Only Reshape runs; the chain
 * must fold at plan time (Reshape refuses a shape it cannot see). */
static void test_shape_chain(void **state) {
  (void)state;
  for (int opset = 11; opset <= 13; opset += 2) {
    ob *b = ob_new(opset);
    ob_input(b, "x", 4, (int64_t[]){-1, 3, -1, -1});
    int64_t zero = 0, minus1 = -1, axes0 = 0;
    ob_init_i64(b, "i0", 0, NULL, &zero);
    ob_init_i64(b, "m1", 1, (int64_t[]){1}, &minus1);
    ob_node(b, "Shape", "s", 1, "x");
    ob_node(b, "Gather", "n", 2, "s", "i0");
    int u;
    if (opset < 13) {
      u = ob_node(b, "Unsqueeze", "n1", 1, "n");
      ob_attr_ints(b, u, "axes", 1, &axes0);
    } else {
      ob_init_i64(b, "ax", 1, (int64_t[]){1}, &axes0);
      u = ob_node(b, "Unsqueeze", "n1", 2, "n", "ax");
    }
    int c = ob_node(b, "Concat", "shp", 2, "n1", "m1");
    ob_attr_int(b, c, "axis", 0);
    ob_node(b, "Reshape", "y", 2, "x", "shp");
    ob_output(b, "y");
    es_model *m = ob_load(b);
    free(b);
    float xv[2 * 3 * 2 * 2];
    for (int i = 0; i < 24; i++)
      xv[i] = (float)i;
    es_tensor x = ob_tensor_f32("x", 4, (int64_t[]){2, 3, 2, 2}, xv);
    float *out;
    size_t count;
    ob_run(m, 1, &x, 1, &out, &count);
    assert_int_equal(count, 24);
    assert_memory_equal(out, xv, sizeof xv);
    free(out);
    es_model_release(m);
  }
}

/* ==========================================================================
 * NonZero
 * ======================================================================== */

/* Coordinates in row-major order, one row per dim; NaN counts as non-zero
 * and -0 as zero; a scalar is one element of a 1-D tensor; an input not
 * known while planning gives a bounded output whose actual shape run sets. */
static void test_nonzero(void **state) {
  (void)state;
  float v[6] = {0, NAN, -0.0f, 2, 0, -1};
  es_tdesc x = KH_TD(ES_DTYPE_FLOAT, 2, 3), od;
  void *o;
  kh_node t;
  kh_node_init(&t, ES_OP_NonZero);
  const es_tdesc *in[1] = {&x};
  const void *data[1] = {v};
  ES_CHECK_RC(es__kernel_eval(&t.node, 13, 1, in, data, 1, &od, &o));
  check_dims(&od, 2, (int64_t[]){2, 3});
  assert_memory_equal(o, ((int64_t[]){0, 1, 1, 1, 0, 2}), 6 * sizeof(int64_t));
  es_mem_free(o);
  int32_t s = 7;
  es_tdesc sc = KH_TD(ES_DTYPE_INT32);
  in[0] = &sc;
  data[0] = &s;
  ES_CHECK_RC(es__kernel_eval(&t.node, 13, 1, in, data, 1, &od, &o));
  check_dims(&od, 2, (int64_t[]){1, 1});
  assert_int_equal(*(int64_t *)o, 0);
  es_mem_free(o);
  uint8_t none[4] = {0};
  es_tdesc b = KH_TD(ES_DTYPE_BOOL, 2, 2);
  in[0] = &b;
  data[0] = none;
  ES_CHECK_RC(es__kernel_eval(&t.node, 13, 1, in, data, 1, &od, &o));
  check_dims(&od, 2, (int64_t[]){2, 0});
  es_mem_free(o);
  /* X unknown while planning: the bound is every element non-zero, and
   * run sets the actual shape, its coordinates packed at the start. */
  in[0] = &x;
  data[0] = v;
  es_kinst k;
  ES_CHECK_RC(kh_eval_with(&t.node, &(kh_opts){.opset = 13, .dyn = 1, .k_out = &k}, 1, in, data,
                           1, &od, &o));
  assert_int_equal(k.out_bound, 1);
  assert_non_null(strstr(k.bound_why, "X's 6 elements"));
  check_dims(&od, 2, (int64_t[]){2, 3});
  assert_memory_equal(o, ((int64_t[]){0, 1, 1, 1, 0, 2}), 6 * sizeof(int64_t));
  es_mem_free(o);
  /* A sparse bool mask, skipped eight bytes at a time: ones at word edges
   * and the last element, coordinates of a [10, 100] tensor. */
  static uint8_t mask[1000];
  const int64_t at[] = {0, 7, 8, 9, 63, 64, 500, 991, 999};
  for (size_t i = 0; i < sizeof at / sizeof *at; i++)
    mask[at[i]] = 1;
  es_tdesc mb = KH_TD(ES_DTYPE_BOOL, 10, 100);
  in[0] = &mb;
  data[0] = mask;
  ES_CHECK_RC(kh_eval_with(&t.node, &(kh_opts){.opset = 13, .dyn = 1}, 1, in, data, 1, &od, &o));
  check_dims(&od, 2, (int64_t[]){2, 9});
  for (int j = 0; j < 9; j++) {
    assert_int_equal(((int64_t *)o)[j], at[j] / 100);
    assert_int_equal(((int64_t *)o)[9 + j], at[j] % 100);
  }
  es_mem_free(o);
}

/* ==========================================================================
 * Unique
 * ======================================================================== */

/* Sorted and in order of first occurrence, all four outputs; NaNs are one
 * value after every number; slices along an axis compare row-major; an
 * input not known while planning gives bounded outputs. */
static void test_unique(void **state) {
  (void)state;
  float v[7] = {3, NAN, 1, 3, NAN, -1, 1};
  es_tdesc x = KH_TD(ES_DTYPE_FLOAT, 7), od[4];
  void *o[4];
  kh_node t;
  kh_node_init(&t, ES_OP_Unique);
  kh_attr_int(&t, "sorted", 1);
  const es_tdesc *in[1] = {&x};
  const void *data[1] = {v};
  ES_CHECK_RC(es__kernel_eval(&t.node, 11, 1, in, data, 4, od, o));
  check_dims(&od[0], 1, (int64_t[]){4});
  const float *y = o[0];
  assert_true(y[0] == -1 && y[1] == 1 && y[2] == 3 && isnan(y[3]));
  assert_memory_equal(o[1], ((int64_t[]){5, 2, 0, 1}), 4 * sizeof(int64_t));
  assert_memory_equal(o[2], ((int64_t[]){2, 3, 1, 2, 3, 0, 1}), 7 * sizeof(int64_t));
  assert_memory_equal(o[3], ((int64_t[]){1, 2, 2, 2}), 4 * sizeof(int64_t));
  for (int i = 0; i < 4; i++)
    es_mem_free(o[i]);
  t.attrs[0].i = 0;
  ES_CHECK_RC(es__kernel_eval(&t.node, 11, 1, in, data, 4, od, o));
  y = o[0];
  assert_true(y[0] == 3 && isnan(y[1]) && y[2] == 1 && y[3] == -1);
  assert_memory_equal(o[1], ((int64_t[]){0, 1, 2, 5}), 4 * sizeof(int64_t));
  assert_memory_equal(o[2], ((int64_t[]){0, 1, 2, 0, 1, 3, 2}), 7 * sizeof(int64_t));
  assert_memory_equal(o[3], ((int64_t[]){2, 2, 2, 1}), 4 * sizeof(int64_t));
  for (int i = 0; i < 4; i++)
    es_mem_free(o[i]);
  /* int64 [2, 3] along axis 1: columns (1,4) (0,5) (1,4) -> (0,5) (1,4) */
  int64_t m[6] = {1, 0, 1, 4, 5, 4};
  es_tdesc xm = KH_TD(ES_DTYPE_INT64, 2, 3);
  kh_attr_int(&t, "axis", -1);
  t.attrs[0].i = 1;
  in[0] = &xm;
  data[0] = m;
  ES_CHECK_RC(es__kernel_eval(&t.node, 11, 1, in, data, 3, od, o));
  check_dims(&od[0], 2, (int64_t[]){2, 2});
  assert_memory_equal(o[0], ((int64_t[]){0, 1, 5, 4}), 4 * sizeof(int64_t));
  assert_memory_equal(o[1], ((int64_t[]){1, 0}), 2 * sizeof(int64_t));
  assert_memory_equal(o[2], ((int64_t[]){1, 0, 1}), 3 * sizeof(int64_t));
  for (int i = 0; i < 3; i++)
    es_mem_free(o[i]);
  /* errors: an axis out of range, sorted not 0 or 1, values unknown */
  t.attrs[1].i = 2;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 11, 1, in, data, 1, od, o), ES_EMODEL);
  t.attrs[1].i = 0;
  t.attrs[0].i = 2;
  ES_EXPECT_RC(es__kernel_eval(&t.node, 11, 1, in, data, 1, od, o), ES_EMODEL);
  t.attrs[0].i = 1;
  t.attrs[1].i = 1;
  /* X unknown while planning: bounded by every item distinct (3 columns),
   * run sets the actual shapes */
  es_kinst k;
  ES_CHECK_RC(kh_eval_with(&t.node, &(kh_opts){.opset = 11, .dyn = 1, .k_out = &k}, 1, in, data,
                           3, od, o));
  assert_int_equal(k.out_bound, 3); /* Y and indices; inverse_indices is [3] whatever */
  assert_int_equal(k.bound_dims, 2);
  assert_non_null(strstr(k.bound_why, "3 items, all distinct"));
  check_dims(&od[0], 2, (int64_t[]){2, 2});
  assert_memory_equal(o[0], ((int64_t[]){0, 1, 5, 4}), 4 * sizeof(int64_t));
  assert_memory_equal(o[1], ((int64_t[]){1, 0}), 2 * sizeof(int64_t));
  for (int i = 0; i < 3; i++)
    es_mem_free(o[i]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gather),
      cmocka_unit_test(test_gather_random),
      cmocka_unit_test(test_gather_elements),
      cmocka_unit_test(test_scatter_elements),
      cmocka_unit_test(test_gather_nd),
      cmocka_unit_test(test_scatter_nd),
      cmocka_unit_test(test_shape_chain),
      cmocka_unit_test(test_nonzero),
      cmocka_unit_test(test_unique),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
