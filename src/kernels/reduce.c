/* Reductions and the softmax family: every Reduce* operator, ArgMax and
 * ArgMin, CumSum, Softmax, LogSoftmax and Hardmax.
 *
 * Reduce*. The axes set becomes alternating groups of merged axes
 * (reduce.h), and run reads the input once, in order, one contiguous run of
 * the last group at a time: a reduced last group folds its run into one
 * output element, a kept one combines it with consecutive outputs, while an
 * odometer over the other groups keeps the output offset. Every operator is
 * a fold (sum, product, max or min) of a map of the elements (x, x^2, |x|),
 * started from the fold's identity, then a final map: ReduceMean scales by
 * 1/count, ReduceL2 takes the square root, ReduceLogSum the log. So an
 * empty reduction gives the identity (0, 1, -inf or +inf) mapped, as the
 * spec defines it, and reducing over no axis (noop_with_empty_axes) maps
 * each element alone, as ONNX's reference does. The folds of float runs
 * keep eight partial results so the vectoriser can keep them in registers
 * (ReduceMean's sum is es__ew_sum_f32, which GlobalAveragePool shares);
 * ReduceMax and ReduceMin propagate NaN, as numpy does. ReduceLogSumExp
 * runs twice: the max of each output's set first (into scratch), then the
 * sum of e^(x - max), so no exp overflows, and max + log(sum) last.
 * Integer sums and products wrap (computed unsigned: no undefined
 * overflow). Axes come from the attribute before opset 13 (ReduceSum) or 18
 * (the others), from input 1 after, which must then be known when planning.
 *
 * ArgMax, ArgMin. The input is viewed as [outer, n, inner] around the axis.
 * inner = 1 scans each row; otherwise the best values of a whole row of
 * `inner` columns are kept in scratch and every later row is compared
 * against them, so all reads are contiguous. NaN wins, the first one (or
 * the last with select_last_index), as numpy's argmax and argmin.
 *
 * CumSum. [outer, n, inner] again: each output row is the previous output
 * row plus one input row (the same row for the inclusive sum, the previous
 * one for the exclusive), walked backwards for reverse. The axis (input 1)
 * may be known only at run time: run reads it.
 *
 * Softmax, LogSoftmax, Hardmax. Before opset 13 the input is flattened to
 * 2-D at axis (default 1) and each row is normalised; from 13 on only the
 * axis is (default -1): the tensor is viewed as [outer, n, inner]. inner = 1
 * (the usual last axis) runs row by row over contiguous memory; inner > 1
 * runs across rows, keeping the running max and sum (or the best index) for
 * `inner` columns in scratch so every pass is contiguous. Softmax and
 * LogSoftmax subtract the max first so exp never overflows, and use
 * ew_math.h's branch-free exp (Cephes' polynomial, about 1 ulp), which
 * vectorises; LogSoftmax is (x - max) - log(sum). Hardmax puts 1 at the
 * first maximum. Out may alias in: every element of a row (or block) is read
 * before any of its outputs is written. */
#include "kernels/reduce.h"

#include <math.h>
#include <string.h>

#include "kernels/ew_math.h"

/* ==========================================================================
 * Shared: the reduction's axes
 * ======================================================================== */

/* The first opset whose Reduce* takes axes as input 1. */
static int64_t reduce_axes_input_opset(es_op op) { return op == ES_OP_ReduceSum ? 13 : 18; }

/* Parses keepdims, the axes (attribute or input, by opset) and
 * noop_with_empty_axes into reduced[] and the output shape. */
static int reduce_axes(es_kinst *k, const es_tdesc *x, int *reduced, int *orank, int64_t *odims) {
  int64_t keepdims, noop = 0;
  int rc;
  if ((rc = es__attr_int(k, "keepdims", 1, &keepdims)) < 0)
    return rc;
  if (keepdims != 0 && keepdims != 1)
    return ES_KFAIL(k, ES_EMODEL, "keepdims is %lld, expected 0 or 1", (long long)keepdims);

  int64_t axes[ES_MAX_RANK];
  size_t n_axes = 0;
  int64_t from = reduce_axes_input_opset(k->node.op);
  const int64_t *v;
  size_t n;
  if ((rc = es__attr_ints(k, "axes", &v, &n)) < 0)
    return rc;
  if (k->opset < from) {
    if (k->n_in > 1 && k->in[1])
      return ES_KFAIL(k, ES_EMODEL, "axes is an input only from opset %lld (model opset %lld)",
                      (long long)from, (long long)k->opset);
    if (n > (size_t)x->rank)
      return ES_KFAIL(k, ES_EMODEL, "%zu axes for rank %d", n, x->rank);
    for (size_t i = 0; i < n; i++)
      axes[n_axes++] = v[i];
  } else {
    if (v)
      return ES_KFAIL(k, ES_EMODEL,
                      "axes is an attribute only before opset %lld (model opset %lld): "
                      "give it as input 1",
                      (long long)from, (long long)k->opset);
    if ((rc = es__attr_int(k, "noop_with_empty_axes", 0, &noop)) < 0)
      return rc;
    if (k->n_in > 1 && k->in[1]) {
      const es_tdesc *a = k->in[1];
      if (a->dtype != ES_DTYPE_INT64 || a->rank != 1)
        return ES_KFAIL(k, ES_EMODEL, "axes is %s of rank %d, expected a 1-D int64 tensor",
                        es_dtype_name(a->dtype), a->rank);
      if (!k->in_static[1])
        return ES_KFAIL(k, ES_ENOTSUP, "axes must be known when planning");
      if (a->count > (size_t)x->rank)
        return ES_KFAIL(k, ES_EMODEL, "%zu axes for rank %d", a->count, x->rank);
      for (size_t i = 0; i < a->count; i++)
        axes[n_axes++] = es__static_i64(a, k->in_static[1], i);
    }
  }
  for (int i = 0; i < x->rank; i++)
    reduced[i] = 0;
  for (size_t i = 0; i < n_axes; i++) {
    int ax;
    if ((rc = es__axis_norm(k, axes[i], x->rank, &ax)) < 0)
      return rc;
    if (reduced[ax])
      return ES_KFAIL(k, ES_EMODEL, "axis %d is listed twice", ax);
    reduced[ax] = 1;
  }
  if (n_axes == 0 && !noop)
    for (int i = 0; i < x->rank; i++)
      reduced[i] = 1;
  *orank = 0;
  for (int i = 0; i < x->rank; i++)
    if (!reduced[i])
      odims[(*orank)++] = x->dims[i];
    else if (keepdims)
      odims[(*orank)++] = 1;
  return 0;
}

/* ==========================================================================
 * Reduce*: folds per element type
 * ======================================================================== */

typedef enum rkind { RK_SUM, RK_SUMSQ, RK_ABS, RK_PROD, RK_MAX, RK_MIN, RK_EXPSUM, RK_N } rkind;
typedef enum rpost { RP_NONE, RP_MEAN, RP_SQRT, RP_LOG, RP_LSE } rpost;

/* fold: *y = y (+) f(x[0]) (+) ... (+) f(x[n-1]), one output.
 * comb: y[j] = y[j] (+) f(x[j]) for j < n, n outputs.
 * m: ReduceLogSumExp's max for the output(s) at y, else NULL. */
typedef struct red_ops {
  void (*init)(void *y, int64_t n);
  void (*fold)(const void *x, int64_t n, void *y, const float *m);
  void (*comb)(const void *x, int64_t n, void *y, const float *m);
} red_ops;

/* NaN-propagating max and min without a branch (a NaN a stays: b > NaN is
 * false). */
#define RF_MAX(a, b) es__ew_select((b) > (a) || (b) != (b), (b), (a))
#define RF_MIN(a, b) es__ew_select((b) < (a) || (b) != (b), (b), (a))
#define RF_ADD(a, b) ((a) + (b))
#define RF_MUL(a, b) ((a) * (b))
#define RF_ID(v) (v)
#define RF_SQ(v) ((v) * (v))
#define RF_ABS(v) fabsf(v)

#define RED_F32(NAME, INIT, F, COMB)                                                      \
  static void NAME##_init(void *y, int64_t n) {                                           \
    float *yy = y;                                                                        \
    for (int64_t i = 0; i < n; i++)                                                       \
      yy[i] = (INIT);                                                                     \
  }                                                                                       \
  static void NAME##_fold(const void *xv, int64_t n, void *yv, const float *m) {          \
    (void)m;                                                                              \
    const float *restrict x = xv;                                                         \
    float acc[8];                                                                         \
    for (int t = 0; t < 8; t++)                                                           \
      acc[t] = (INIT);                                                                    \
    int64_t i = 0;                                                                        \
    for (; i + 8 <= n; i += 8)                                                            \
      for (int t = 0; t < 8; t++)                                                         \
        acc[t] = COMB(acc[t], F(x[i + t]));                                               \
    float s = *(float *)yv;                                                               \
    for (int t = 0; t < 8; t++)                                                           \
      s = COMB(s, acc[t]);                                                                \
    for (; i < n; i++)                                                                    \
      s = COMB(s, F(x[i]));                                                               \
    *(float *)yv = s;                                                                     \
  }                                                                                       \
  static void NAME##_comb(const void *xv, int64_t n, void *yv, const float *m) {          \
    (void)m;                                                                              \
    const float *restrict x = xv;                                                         \
    float *restrict y = yv;                                                               \
    for (int64_t j = 0; j < n; j++)                                                       \
      y[j] = COMB(y[j], F(x[j]));                                                         \
  }

RED_F32(f32_sumsq, 0.0f, RF_SQ, RF_ADD)
RED_F32(f32_abs, 0.0f, RF_ABS, RF_ADD)
RED_F32(f32_prod, 1.0f, RF_ID, RF_MUL)
RED_F32(f32_max, -INFINITY, RF_ID, RF_MAX)
RED_F32(f32_min, INFINITY, RF_ID, RF_MIN)

/* The sum is es__ew_sum_f32 (eight partial sums in the shared order), so
 * ReduceMean gives the bits it always gave. */
static void f32_sum_fold(const void *x, int64_t n, void *y, const float *m) {
  (void)m;
  *(float *)y += es__ew_sum_f32(x, n);
}

static void f32_sum_comb(const void *xv, int64_t n, void *yv, const float *m) {
  (void)m;
  const float *restrict x = xv;
  float *restrict y = yv;
  for (int64_t j = 0; j < n; j++)
    y[j] += x[j];
}

static void f32_expsum_fold(const void *xv, int64_t n, void *yv, const float *m) {
  const float *restrict x = xv;
  float mo = *m, acc[8] = {0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int t = 0; t < 8; t++)
      acc[t] += es__ew_exp_neg(x[i + t] - mo);
  float s = *(float *)yv + es__ew_hsum8(acc);
  for (; i < n; i++)
    s += es__ew_exp_neg(x[i] - mo);
  *(float *)yv = s;
}

static void f32_expsum_comb(const void *xv, int64_t n, void *yv, const float *m) {
  const float *restrict x = xv;
  float *restrict y = yv;
  for (int64_t j = 0; j < n; j++)
    y[j] += es__ew_exp_neg(x[j] - m[j]);
}

static const red_ops f32_ops[RK_N] = {
    [RK_SUM] = {f32_sumsq_init, f32_sum_fold, f32_sum_comb},
    [RK_SUMSQ] = {f32_sumsq_init, f32_sumsq_fold, f32_sumsq_comb},
    [RK_ABS] = {f32_abs_init, f32_abs_fold, f32_abs_comb},
    [RK_PROD] = {f32_prod_init, f32_prod_fold, f32_prod_comb},
    [RK_MAX] = {f32_max_init, f32_max_fold, f32_max_comb},
    [RK_MIN] = {f32_min_init, f32_min_fold, f32_min_comb},
    [RK_EXPSUM] = {f32_sumsq_init, f32_expsum_fold, f32_expsum_comb},
};

/* Integers: sums and products in the unsigned type U (wrapping, defined);
 * |x| as 0 - x unsigned, so |INT_MIN| is INT_MIN as in two's complement. */
#define RI_ADD(T, U, a, b) ((T)((U)(a) + (U)(b)))
#define RI_MUL(T, U, a, b) ((T)((U)(a) * (U)(b)))
#define RI_MAX(T, U, a, b) ((b) > (a) ? (b) : (a))
#define RI_MIN(T, U, a, b) ((b) < (a) ? (b) : (a))
#define RI_ID(T, U, v) (v)
#define RI_SQ(T, U, v) ((T)((U)(v) * (U)(v)))
#define RI_ABS(T, U, v) ((v) < 0 ? (T)(0u - (U)(v)) : (v))

#define RED_INT(NAME, T, U, INIT, F, COMB)                                                \
  static void NAME##_init(void *y, int64_t n) {                                           \
    T *yy = y;                                                                            \
    for (int64_t i = 0; i < n; i++)                                                       \
      yy[i] = (INIT);                                                                     \
  }                                                                                       \
  static void NAME##_fold(const void *xv, int64_t n, void *yv, const float *m) {          \
    (void)m;                                                                              \
    const T *restrict x = xv;                                                             \
    T s = *(T *)yv;                                                                       \
    for (int64_t i = 0; i < n; i++)                                                       \
      s = COMB(T, U, s, F(T, U, x[i]));                                                   \
    *(T *)yv = s;                                                                         \
  }                                                                                       \
  static void NAME##_comb(const void *xv, int64_t n, void *yv, const float *m) {          \
    (void)m;                                                                              \
    const T *restrict x = xv;                                                             \
    T *restrict y = yv;                                                                   \
    for (int64_t j = 0; j < n; j++)                                                       \
      y[j] = COMB(T, U, y[j], F(T, U, x[j]));                                             \
  }

#define RED_INT_ALL(P, T, U, TMIN, TMAX)                                                  \
  RED_INT(P##_sum, T, U, 0, RI_ID, RI_ADD)                                                \
  RED_INT(P##_sumsq, T, U, 0, RI_SQ, RI_ADD)                                              \
  RED_INT(P##_abs, T, U, 0, RI_ABS, RI_ADD)                                               \
  RED_INT(P##_prod, T, U, 1, RI_ID, RI_MUL)                                               \
  RED_INT(P##_max, T, U, TMIN, RI_ID, RI_MAX)                                             \
  RED_INT(P##_min, T, U, TMAX, RI_ID, RI_MIN)                                             \
  static const red_ops P##_ops[RK_N] = {                                                  \
      [RK_SUM] = {P##_sum_init, P##_sum_fold, P##_sum_comb},                              \
      [RK_SUMSQ] = {P##_sumsq_init, P##_sumsq_fold, P##_sumsq_comb},                      \
      [RK_ABS] = {P##_abs_init, P##_abs_fold, P##_abs_comb},                              \
      [RK_PROD] = {P##_prod_init, P##_prod_fold, P##_prod_comb},                          \
      [RK_MAX] = {P##_max_init, P##_max_fold, P##_max_comb},                              \
      [RK_MIN] = {P##_min_init, P##_min_fold, P##_min_comb},                              \
  };

RED_INT_ALL(i32, int32_t, uint32_t, INT32_MIN, INT32_MAX)
RED_INT_ALL(i64, int64_t, uint64_t, INT64_MIN, INT64_MAX)

RED_INT(u8_max, uint8_t, unsigned, 0, RI_ID, RI_MAX)
RED_INT(u8_min, uint8_t, unsigned, UINT8_MAX, RI_ID, RI_MIN)
RED_INT(i8_max, int8_t, unsigned, INT8_MIN, RI_ID, RI_MAX)
RED_INT(i8_min, int8_t, unsigned, INT8_MAX, RI_ID, RI_MIN)

static const red_ops u8_ops[RK_N] = {
    [RK_MAX] = {u8_max_init, u8_max_fold, u8_max_comb},
    [RK_MIN] = {u8_min_init, u8_min_fold, u8_min_comb},
};
static const red_ops i8_ops[RK_N] = {
    [RK_MAX] = {i8_max_init, i8_max_fold, i8_max_comb},
    [RK_MIN] = {i8_min_init, i8_min_fold, i8_min_comb},
};

/* ==========================================================================
 * Reduce*: plan and run
 * ======================================================================== */

typedef struct reduce_params {
  es_rgroups g;
  es_dtype dt;
  size_t esz;
  const red_ops *ops; /* the fold of the operator for the element type */
  rpost post;
  float inv;          /* ReduceMean: 1 / elements per output (NaN when none) */
} reduce_params;

static int reduce_infer(es_kinst *k) {
  if (k->n_in < 1 || !k->in[0])
    return ES_KFAIL(k, ES_EMODEL, "input data is missing");
  if (k->n_out != 1 || !k->out[0])
    return ES_KFAIL(k, ES_EMODEL, "%d outputs, expected 1", k->n_out);
  const es_tdesc *x = k->in[0];
  rkind kind = RK_SUM;
  rpost post = RP_NONE;
  switch (k->node.op) {
  case ES_OP_ReduceSum: break;
  case ES_OP_ReduceMean: post = RP_MEAN; break;
  case ES_OP_ReduceSumSquare: kind = RK_SUMSQ; break;
  case ES_OP_ReduceL1: kind = RK_ABS; break;
  case ES_OP_ReduceL2: kind = RK_SUMSQ, post = RP_SQRT; break;
  case ES_OP_ReduceProd: kind = RK_PROD; break;
  case ES_OP_ReduceMax: kind = RK_MAX; break;
  case ES_OP_ReduceMin: kind = RK_MIN; break;
  case ES_OP_ReduceLogSum: post = RP_LOG; break;
  case ES_OP_ReduceLogSumExp: kind = RK_EXPSUM, post = RP_LSE; break;
  default: return ES_KFAIL(k, ES_EINVAL, "not a reduction");
  }
  const red_ops *table = NULL;
  switch (x->dtype) {
  case ES_DTYPE_FLOAT: table = f32_ops; break;
  case ES_DTYPE_INT32: table = i32_ops; break;
  case ES_DTYPE_INT64: table = i64_ops; break;
  case ES_DTYPE_UINT8: table = u8_ops; break;
  case ES_DTYPE_INT8: table = i8_ops; break;
  default: break;
  }
  int is_int = x->dtype == ES_DTYPE_INT32 || x->dtype == ES_DTYPE_INT64;
  if (!table || !table[kind].fold) {
    int minmax = kind == RK_MAX || kind == RK_MIN;
    return ES_KFAIL(k, ES_EMODEL, "input is %s, expected float32, int32 or int64%s",
                    es_dtype_name(x->dtype), minmax ? ", uint8 or int8" : "");
  }
  if (is_int && (post == RP_LOG || post == RP_LSE))
    return ES_KFAIL(k, ES_ENOTSUP, "%s of %s is not implemented (float32 only)",
                    es__op_name(k->node.op), es_dtype_name(x->dtype));

  int reduced[ES_MAX_RANK], orank = 0;
  int64_t odims[ES_MAX_RANK];
  int rc = reduce_axes(k, x, reduced, &orank, odims);
  if (rc < 0)
    return rc;
  if ((rc = es__tdesc_set(k->out[0], x->dtype, orank, odims)) < 0)
    return rc;
  reduce_params *p = es__kinst_alloc(k, sizeof *p);
  if (!p)
    return ES_KFAIL(k, ES_ENOMEM, "out of memory for reduction parameters");
  es__rgroups_make(x, reduced, &p->g);
  p->dt = x->dtype;
  p->esz = es_dtype_size(x->dtype);
  p->ops = &table[kind];
  p->post = post;
  p->inv = p->g.rcount > 0 ? 1.0f / (float)p->g.rcount : NAN;
  if (post == RP_LSE)
    k->scratch_bytes = (size_t)p->g.out_count * sizeof(float);
  k->params = p;
  return 0;
}

/* One pass over x folding into y (initialised here) with ops. */
static void reduce_walk(const es_rgroups *g, size_t esz, const red_ops *ops, const void *x,
                        void *y, const float *m) {
  ops->init(y, g->out_count);
  int last = g->ng - 1;
  int64_t run = g->ext[last], idx[ES_MAX_RANK] = {0}, off = 0;
  int64_t runs = es__rgroups_runs(g);
  const char *xb = x;
  char *yb = y;
  for (int64_t st = 0; st < runs; st++, xb += (size_t)run * esz) {
    if (g->red[last])
      ops->fold(xb, run, yb + (size_t)off * esz, m ? m + off : NULL);
    else
      ops->comb(xb, run, yb + (size_t)off * esz, m ? m + off : NULL);
    es__walk_step(last, g->ext, idx, 1, &off, g->ostr);
  }
}

/* The final map of integer outputs: ReduceMean truncates the quotient (0
 * for an empty set), ReduceL2 the root. */
#define RED_POST_INT(T, p, y)                                                             \
  do {                                                                                    \
    T *yy = (y);                                                                          \
    int64_t cnt = (p)->g.rcount;                                                          \
    for (int64_t i = 0; i < (p)->g.out_count; i++) {                                      \
      if ((p)->post == RP_MEAN)                                                           \
        yy[i] = cnt > 0 ? (T)(yy[i] / cnt) : 0;                                           \
      else if ((p)->post == RP_SQRT)                                                      \
        yy[i] = yy[i] > 0 ? (T)sqrt((double)yy[i]) : 0;                                   \
    }                                                                                     \
  } while (0)

static int reduce_run(const es_kinst *k, const void *const *in, void *const *out,
                      void *scratch) {
  const reduce_params *p = k->params;
  const float *m = NULL;
  if (p->post == RP_LSE) {
    reduce_walk(&p->g, p->esz, &f32_ops[RK_MAX], in[0], scratch, NULL);
    m = scratch;
  }
  reduce_walk(&p->g, p->esz, p->ops, in[0], out[0], m);
  if (p->post == RP_NONE)
    return 0;
  int64_t n = p->g.out_count;
  if (p->dt == ES_DTYPE_INT32) {
    RED_POST_INT(int32_t, p, out[0]);
    return 0;
  }
  if (p->dt == ES_DTYPE_INT64) {
    RED_POST_INT(int64_t, p, out[0]);
    return 0;
  }
  float *y = out[0];
  switch (p->post) {
  case RP_MEAN:
    for (int64_t i = 0; i < n; i++)
      y[i] *= p->inv;
    break;
  case RP_SQRT:
    for (int64_t i = 0; i < n; i++)
      y[i] = sqrtf(y[i]);
    break;
  case RP_LOG:
    for (int64_t i = 0; i < n; i++)
      y[i] = logf(y[i]);
    break;
  case RP_LSE: /* an infinite max is the answer itself (inf - inf would be NaN) */
    for (int64_t i = 0; i < n; i++)
      y[i] = isinf(m[i]) ? m[i] : m[i] + logf(y[i]);
    break;
  default:
    break;
  }
  return 0;
}

/* ==========================================================================
 * ArgMax, ArgMin
 * ======================================================================== */

typedef struct arg_params {
  int64_t outer, n, inner;
  es_dtype dt;
  int is_max, last;
} arg_params;

static int arg_infer(es_kinst *k) {
  if (k->n_in != 1 || !k->in[0])
    return ES_KFAIL(k, ES_EMODEL, "expected one input (data)");
  if (k->n_out != 1 || !k->out[0])
    return ES_KFAIL(k, ES_EMODEL, "%d outputs, expected 1", k->n_out);
  const es_tdesc *x = k->in[0];
  es_dtype dt = x->dtype;
  if (dt != ES_DTYPE_FLOAT && dt != ES_DTYPE_INT32 && dt != ES_DTYPE_INT64 &&
      dt != ES_DTYPE_UINT8 && dt != ES_DTYPE_INT8)
    return ES_KFAIL(k, ES_EMODEL, "input is %s, expected float32, int32, int64, uint8 or int8",
                    es_dtype_name(dt));
  int64_t axis, keepdims, last;
  int rc, ax;
  if ((rc = es__attr_int(k, "axis", 0, &axis)) < 0 ||
      (rc = es__attr_int(k, "keepdims", 1, &keepdims)) < 0 ||
      (rc = es__attr_int(k, "select_last_index", 0, &last)) < 0)
    return rc;
  if (keepdims != 0 && keepdims != 1)
    return ES_KFAIL(k, ES_EMODEL, "keepdims is %lld, expected 0 or 1", (long long)keepdims);
  if (last != 0 && last != 1)
    return ES_KFAIL(k, ES_EMODEL, "select_last_index is %lld, expected 0 or 1", (long long)last);
  if ((rc = es__axis_norm(k, axis, x->rank, &ax)) < 0)
    return rc;
  if (x->dims[ax] == 0)
    return ES_KFAIL(k, ES_EMODEL, "axis %d has size 0: no element to pick", ax);
  arg_params *p = es__kinst_alloc(k, sizeof *p);
  if (!p)
    return ES_KFAIL(k, ES_ENOMEM, "out of memory for parameters");
  p->outer = p->inner = 1;
  p->n = x->dims[ax];
  int64_t odims[ES_MAX_RANK];
  int orank = 0;
  for (int i = 0; i < x->rank; i++) {
    if (i < ax)
      p->outer *= x->dims[i];
    else if (i > ax)
      p->inner *= x->dims[i];
    if (i != ax)
      odims[orank++] = x->dims[i];
    else if (keepdims)
      odims[orank++] = 1;
  }
  p->dt = dt;
  p->is_max = k->node.op == ES_OP_ArgMax;
  p->last = (int)last;
  k->params = p;
  if (p->inner > 1)
    k->scratch_bytes = (size_t)p->inner * es_dtype_size(dt);
  return es__tdesc_set(k->out[0], ES_DTYPE_INT64, orank, odims);
}

/* v replaces best: greater (ArgMax) or smaller, or equal with
 * select_last_index; a NaN replaces anything but an earlier NaN (any NaN
 * with select_last_index). v != v is false for integers. */
#define ARG_BETTER(v, b, is_max, last)                                                    \
  ((is_max) ? ((last) ? ((v) >= (b) || (v) != (v)) : ((v) > (b) || ((v) != (v) && (b) == (b)))) \
            : ((last) ? ((v) <= (b) || (v) != (v)) : ((v) < (b) || ((v) != (v) && (b) == (b)))))

#define ARG_FN(NAME, T)                                                                   \
  static void NAME(const arg_params *p, const T *x, int64_t *y, T *best) {               \
    int is_max = p->is_max, last = p->last;                                               \
    int64_t n = p->n, inner = p->inner;                                                   \
    for (int64_t o = 0; o < p->outer; o++, x += n * inner, y += inner) {                  \
      if (inner == 1) {                                                                   \
        T b = x[0];                                                                       \
        int64_t bi = 0;                                                                   \
        for (int64_t j = 1; j < n; j++)                                                   \
          if (ARG_BETTER(x[j], b, is_max, last)) {                                        \
            b = x[j];                                                                     \
            bi = j;                                                                       \
          }                                                                               \
        y[0] = bi;                                                                        \
        continue;                                                                         \
      }                                                                                   \
      for (int64_t i = 0; i < inner; i++) {                                               \
        best[i] = x[i];                                                                   \
        y[i] = 0;                                                                         \
      }                                                                                   \
      for (int64_t j = 1; j < n; j++) {                                                   \
        const T *xr = x + j * inner;                                                      \
        for (int64_t i = 0; i < inner; i++)                                               \
          if (ARG_BETTER(xr[i], best[i], is_max, last)) {                                 \
            best[i] = xr[i];                                                              \
            y[i] = j;                                                                     \
          }                                                                               \
      }                                                                                   \
    }                                                                                     \
  }

ARG_FN(arg_f32, float)
ARG_FN(arg_i32, int32_t)
ARG_FN(arg_i64, int64_t)
ARG_FN(arg_u8, uint8_t)
ARG_FN(arg_i8, int8_t)

static int arg_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  const arg_params *p = k->params;
  switch (p->dt) {
  case ES_DTYPE_FLOAT: arg_f32(p, in[0], out[0], scratch); break;
  case ES_DTYPE_INT32: arg_i32(p, in[0], out[0], scratch); break;
  case ES_DTYPE_INT64: arg_i64(p, in[0], out[0], scratch); break;
  case ES_DTYPE_UINT8: arg_u8(p, in[0], out[0], scratch); break;
  default: arg_i8(p, in[0], out[0], scratch); break;
  }
  return 0;
}

/* ==========================================================================
 * CumSum
 * ======================================================================== */

typedef struct cumsum_params {
  int rank;
  int64_t dims[ES_MAX_RANK];
  es_dtype dt;
  es_tdesc axis; /* input 1's description, to read it at run time */
  int exclusive, reverse;
} cumsum_params;

/* The axis from input 1 (a scalar or one-element 1-D int32/int64). */
static int cumsum_axis(const es_kinst *k, const es_tdesc *a, const void *data, int rank,
                       int *ax) {
  return es__axis_norm(k, es__static_i64(a, data, 0), rank, ax);
}

static int cumsum_infer(es_kinst *k) {
  if (k->n_in != 2 || !k->in[0] || !k->in[1])
    return ES_KFAIL(k, ES_EMODEL, "expected two inputs (x, axis)");
  if (k->n_out != 1 || !k->out[0])
    return ES_KFAIL(k, ES_EMODEL, "%d outputs, expected 1", k->n_out);
  const es_tdesc *x = k->in[0], *a = k->in[1];
  if (x->dtype != ES_DTYPE_FLOAT && x->dtype != ES_DTYPE_INT32 && x->dtype != ES_DTYPE_INT64)
    return ES_KFAIL(k, ES_EMODEL, "x is %s, expected float32, int32 or int64",
                    es_dtype_name(x->dtype));
  if ((a->dtype != ES_DTYPE_INT32 && a->dtype != ES_DTYPE_INT64) || a->rank > 1 || a->count != 1)
    return ES_KFAIL(k, ES_EMODEL, "axis is %s of %zu elements (rank %d), expected one int32 or "
                    "int64", es_dtype_name(a->dtype), a->count, a->rank);
  if (x->rank < 1)
    return ES_KFAIL(k, ES_EMODEL, "x is a scalar: no axis to sum along");
  int64_t excl, rev;
  int rc;
  if ((rc = es__attr_int(k, "exclusive", 0, &excl)) < 0 ||
      (rc = es__attr_int(k, "reverse", 0, &rev)) < 0)
    return rc;
  if ((excl != 0 && excl != 1) || (rev != 0 && rev != 1))
    return ES_KFAIL(k, ES_EMODEL, "exclusive is %lld and reverse %lld, each expected 0 or 1",
                    (long long)excl, (long long)rev);
  int ax;
  if (k->in_static[1] && (rc = cumsum_axis(k, a, k->in_static[1], x->rank, &ax)) < 0)
    return rc;
  cumsum_params *p = es__kinst_alloc(k, sizeof *p);
  if (!p)
    return ES_KFAIL(k, ES_ENOMEM, "out of memory for parameters");
  p->rank = x->rank;
  memcpy(p->dims, x->dims, sizeof p->dims);
  p->dt = x->dtype;
  p->axis = *a;
  p->exclusive = (int)excl;
  p->reverse = (int)rev;
  k->params = p;
  return es__tdesc_set(k->out[0], x->dtype, x->rank, x->dims);
}

/* Row j of y (inner elements) from row j - d of y and row j (inclusive) or
 * j - d (exclusive) of x, d = 1 or -1 (reverse); the first row is x's or
 * zeros. */
#define CUMSUM_FN(NAME, T, U)                                                             \
  static void NAME(const cumsum_params *p, int64_t outer, int64_t n, int64_t inner,        \
                   const T *x, T *y) {                                                    \
    for (int64_t o = 0; o < outer; o++, x += n * inner, y += n * inner)                   \
      for (int64_t s = 0; s < n; s++) {                                                   \
        int64_t j = p->reverse ? n - 1 - s : s, d = p->reverse ? -1 : 1;                  \
        T *restrict yr = y + j * inner;                                                   \
        if (s == 0) {                                                                     \
          for (int64_t i = 0; i < inner; i++)                                             \
            yr[i] = p->exclusive ? 0 : x[j * inner + i];                                  \
          continue;                                                                       \
        }                                                                                 \
        const T *restrict yp = y + (j - d) * inner;                                       \
        const T *restrict xr = x + (p->exclusive ? j - d : j) * inner;                    \
        for (int64_t i = 0; i < inner; i++)                                               \
          yr[i] = (T)((U)yp[i] + (U)xr[i]);                                               \
      }                                                                                   \
  }

CUMSUM_FN(cumsum_f32, float, float)
CUMSUM_FN(cumsum_i32, int32_t, uint32_t)
CUMSUM_FN(cumsum_i64, int64_t, uint64_t)

static int cumsum_run(const es_kinst *k, const void *const *in, void *const *out,
                      void *scratch) {
  (void)scratch;
  const cumsum_params *p = k->params;
  int ax;
  int rc = cumsum_axis(k, &p->axis, in[1], p->rank, &ax);
  if (rc < 0)
    return rc;
  int64_t outer = 1, inner = 1, n = p->dims[ax];
  for (int i = 0; i < p->rank; i++)
    if (i < ax)
      outer *= p->dims[i];
    else if (i > ax)
      inner *= p->dims[i];
  if (p->dt == ES_DTYPE_FLOAT)
    cumsum_f32(p, outer, n, inner, in[0], out[0]);
  else if (p->dt == ES_DTYPE_INT32)
    cumsum_i32(p, outer, n, inner, in[0], out[0]);
  else
    cumsum_i64(p, outer, n, inner, in[0], out[0]);
  return 0;
}

/* ==========================================================================
 * Softmax, LogSoftmax, Hardmax
 * ======================================================================== */

enum { SM_SOFT, SM_LOG, SM_HARD };

typedef struct softmax_params {
  int64_t outer, n, inner; /* normalise over n, elements `inner` apart */
  int mode;
} softmax_params;

static int softmax_infer(es_kinst *k) {
  if (k->n_in != 1 || !k->in[0])
    return ES_KFAIL(k, ES_EMODEL, "expected one input");
  if (k->n_out != 1 || !k->out[0])
    return ES_KFAIL(k, ES_EMODEL, "%d outputs, expected 1", k->n_out);
  const es_tdesc *x = k->in[0];
  if (x->dtype != ES_DTYPE_FLOAT)
    return ES_KFAIL(k, ES_EMODEL, "input is %s, expected float32", es_dtype_name(x->dtype));
  int64_t axis_attr;
  int legacy = k->opset < 13; /* flatten-to-2-D semantics */
  int rc = es__attr_int(k, "axis", legacy ? 1 : -1, &axis_attr);
  if (rc < 0)
    return rc;
  int axis;
  if ((rc = es__axis_norm(k, axis_attr, x->rank, &axis)) < 0)
    return rc;
  softmax_params *p = es__kinst_alloc(k, sizeof *p);
  if (!p)
    return ES_KFAIL(k, ES_ENOMEM, "out of memory for parameters");
  p->mode = k->node.op == ES_OP_LogSoftmax ? SM_LOG : k->node.op == ES_OP_Hardmax ? SM_HARD
                                                                                  : SM_SOFT;
  p->outer = p->n = p->inner = 1;
  for (int i = 0; i < x->rank; i++) {
    if (i < axis)
      p->outer *= x->dims[i];
    else if (i == axis || legacy)
      p->n *= x->dims[i];
    else
      p->inner *= x->dims[i];
  }
  if ((rc = es__tdesc_set(k->out[0], ES_DTYPE_FLOAT, x->rank, x->dims)) < 0)
    return rc;
  /* columns: the max and the sum (Softmax, LogSoftmax) or the max and its
   * row (Hardmax, int64 after the floats, 8-aligned) per column */
  size_t in_b = (size_t)p->inner;
  if (p->inner > 1)
    k->scratch_bytes = p->mode == SM_HARD ? ((in_b * sizeof(float) + 7) & ~(size_t)7) +
                                                in_b * sizeof(int64_t)
                                          : 2 * in_b * sizeof(float);
  k->inplace = 0;
  k->params = p;
  return 0;
}

#define SM_CHUNK 16

/* sum of e^(x[j] - m): eight partial sums, stored nowhere (LogSoftmax still
 * reads x after, and y may be x). */
ES_KCLONES static float sm_sumexp(const float *restrict x, int64_t n, float m) {
  float acc[8] = {0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int t = 0; t < 8; t++)
      acc[t] += es__ew_exp_neg_floor(x[i + t] - m);
  float s = es__ew_hsum8(acc);
  for (; i < n; i++)
    s += es__ew_exp_neg_floor(x[i] - m);
  return s;
}

/* Exp, sum and scale are separate loops: a running sum inside the exp loop
 * would be a float reduction, which the vectoriser may not reorder. */
ES_KCLONES static void softmax_rows(int mode, const float *x, float *y, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; r++, x += n, y += n) {
    if (mode == SM_HARD) {
      float b = n > 0 ? x[0] : 0.0f;
      int64_t bi = 0;
      for (int64_t j = 1; j < n; j++)
        if (ARG_BETTER(x[j], b, 1, 0)) {
          b = x[j];
          bi = j;
        }
      for (int64_t j = 0; j < n; j++)
        y[j] = 0.0f;
      if (n > 0)
        y[bi] = 1.0f;
      continue;
    }
    float m = es__ew_max_f32(x, n);
    if (mode == SM_LOG) { /* (x - m) - log(s): x - (m + log(s)) rounds m + log(s) */
      float ls = logf(sm_sumexp(x, n, m));
      for (int64_t j = 0; j < n; j++)
        y[j] = (x[j] - m) - ls;
      continue;
    }
    /* In chunks through a local array: y is often x (the planner runs
     * Softmax in place), and on a possible overlap the vectoriser falls
     * back to its scalar loop. */
    int64_t j = 0;
    for (; j + SM_CHUNK <= n; j += SM_CHUNK) {
      float t[SM_CHUNK];
      for (int l = 0; l < SM_CHUNK; l++)
        t[l] = es__ew_exp_neg_floor(x[j + l] - m);
      memcpy(y + j, t, sizeof t);
    }
    for (; j < n; j++)
      y[j] = es__ew_exp_neg_floor(x[j] - m);
    float inv = 1.0f / es__ew_sum_f32(y, n);
    for (j = 0; j < n; j++)
      y[j] *= inv;
  }
}

static void hardmax_cols(const float *x, float *y, int64_t outer, int64_t n, int64_t inner,
                         float *restrict m, int64_t *restrict bi) {
  for (int64_t o = 0; o < outer; o++, x += n * inner, y += n * inner) {
    for (int64_t i = 0; i < inner; i++) {
      m[i] = x[i];
      bi[i] = 0;
    }
    for (int64_t j = 1; j < n; j++) {
      const float *xr = x + j * inner;
      for (int64_t i = 0; i < inner; i++)
        if (ARG_BETTER(xr[i], m[i], 1, 0)) {
          m[i] = xr[i];
          bi[i] = j;
        }
    }
    for (int64_t j = 0; j < n * inner; j++)
      y[j] = 0.0f;
    if (n > 0)
      for (int64_t i = 0; i < inner; i++)
        y[bi[i] * inner + i] = 1.0f;
  }
}

ES_KCLONES static void softmax_cols(int mode, const float *x, float *y, int64_t outer, int64_t n,
                         int64_t inner, float *restrict m, float *restrict s) {
  for (int64_t o = 0; o < outer; o++, x += n * inner, y += n * inner) {
    for (int64_t i = 0; i < inner; i++) {
      m[i] = -INFINITY;
      s[i] = 0.0f;
    }
    for (int64_t j = 0; j < n; j++) {
      const float *xr = x + j * inner;
      for (int64_t i = 0; i < inner; i++)
        m[i] = xr[i] > m[i] ? xr[i] : m[i];
    }
    if (mode == SM_LOG) {
      for (int64_t j = 0; j < n; j++) {
        const float *xr = x + j * inner;
        for (int64_t i = 0; i < inner; i++)
          s[i] += es__ew_exp_neg_floor(xr[i] - m[i]);
      }
      for (int64_t i = 0; i < inner; i++)
        s[i] = logf(s[i]);
      for (int64_t j = 0; j < n; j++) {
        const float *xr = x + j * inner;
        float *yr = y + j * inner;
        for (int64_t i = 0; i < inner; i++)
          yr[i] = (xr[i] - m[i]) - s[i];
      }
      continue;
    }
    for (int64_t j = 0; j < n; j++) {
      const float *xr = x + j * inner;
      float *yr = y + j * inner;
      for (int64_t i = 0; i < inner; i++) {
        float e = es__ew_exp_neg_floor(xr[i] - m[i]);
        yr[i] = e;
        s[i] += e;
      }
    }
    for (int64_t i = 0; i < inner; i++)
      s[i] = 1.0f / s[i];
    for (int64_t j = 0; j < n; j++) {
      float *yr = y + j * inner;
      for (int64_t i = 0; i < inner; i++)
        yr[i] *= s[i];
    }
  }
}

static int softmax_run(const es_kinst *k, const void *const *in, void *const *out,
                       void *scratch) {
  const softmax_params *p = k->params;
  if (p->outer == 0 || p->n == 0 || p->inner == 0)
    return 0; /* an empty output: the column passes would read a first row */
  if (p->inner == 1)
    softmax_rows(p->mode, in[0], out[0], p->outer, p->n);
  else if (p->mode == SM_HARD)
    hardmax_cols(in[0], out[0], p->outer, p->n, p->inner, scratch,
                 (int64_t *)((char *)scratch +
                             (((size_t)p->inner * sizeof(float) + 7) & ~(size_t)7)));
  else
    softmax_cols(p->mode, in[0], out[0], p->outer, p->n, p->inner, scratch,
                 (float *)scratch + p->inner);
  return 0;
}

/* ==========================================================================
 * Family
 * ======================================================================== */

static const es_kernel reduce_kernel = {reduce_infer, reduce_run, NULL, 0};
static const es_kernel arg_kernel = {arg_infer, arg_run, NULL, 0};
static const es_kernel cumsum_kernel = {cumsum_infer, cumsum_run, NULL, 0};
static const es_kernel softmax_kernel = {softmax_infer, softmax_run, NULL, 0};

const es_kernel *es__kernels_reduce(es_op op) {
  switch (op) {
  case ES_OP_ReduceMean:
  case ES_OP_ReduceSum:
  case ES_OP_ReduceSumSquare:
  case ES_OP_ReduceL1:
  case ES_OP_ReduceL2:
  case ES_OP_ReduceProd:
  case ES_OP_ReduceMax:
  case ES_OP_ReduceMin:
  case ES_OP_ReduceLogSum:
  case ES_OP_ReduceLogSumExp:
    return &reduce_kernel;
  case ES_OP_ArgMax:
  case ES_OP_ArgMin:
    return &arg_kernel;
  case ES_OP_CumSum:
    return &cumsum_kernel;
  case ES_OP_Softmax:
  case ES_OP_LogSoftmax:
  case ES_OP_Hardmax:
    return &softmax_kernel;
  default:
    return NULL;
  }
}
