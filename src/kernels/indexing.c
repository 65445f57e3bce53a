/* Indexing operators: gathers and scatters (Gather, GatherElements,
 * GatherND, ScatterND, ScatterElements and its deprecated name Scatter).
 *
 * Indices are data: they arrive with each request, so infer can only check
 * shapes and types, and every index is checked in run. Indices are read as
 * int64 whatever their stored type (int32 or int64), negative ones counted
 * from the end of their axis; one out of range is an error of the request
 * (ES_EINVAL naming the node and the index), never a read or write outside
 * a tensor. Gathers validate all indices before the first byte moves;
 * scatters check each one before its write.
 *
 * None of these ops looks at element values except the scatter reductions
 * (add, mul, max, min), so the copies go by element size and serve every
 * dtype; the reductions are written per type (bool: add and max are or,
 * mul and min are and, as numpy computes them on booleans).
 *
 * The scatters copy data to the output first and then write updates into
 * it; infer lets the output share data's buffer (k->inplace), which makes
 * the copy free when data has no other use (a cache updated in place).
 * Duplicate indices apply in order: with reduction 'none' the last write
 * wins, otherwise every update is reduced in.
 *
 * NonZero's and Unique's output shapes depend on their input's values:
 * infer gives the bound (every element non-zero; every item distinct) and
 * run the actual shape (kernel.h, "Data-dependent shapes"). Unique orders items
 * (elements, or slices along axis compared element by element in row-major
 * order, as numpy does) by a stable merge sort: NaN sorts after every
 * number and equals itself, so all NaNs count as one value. */
#include "kernels/kernel.h"
#include "kernels/walk.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* ==========================================================================
 * Shared checks
 * ======================================================================== */

static int indices_check(es_kinst *k, int i) {
  es_dtype dt = k->in[i]->dtype;
  if (dt != ES_DTYPE_INT64 && dt != ES_DTYPE_INT32)
    return ES_KFAIL(k, ES_EMODEL, "indices (input %d) are %s, expected int32 or int64", i,
                    es_dtype_name(dt));
  return 0;
}

static int out_set(es_kinst *k, es_dtype dt, int rank, const int64_t *dims) {
  int rc = es__tdesc_set(k->out[0], dt, rank, dims);
  if (rc < 0)
    return ES_KFAIL(k, rc, "output: %s", es_last_error_detail());
  return 0;
}

/* Product of dims[a..b); the caller's tensors hold at most 2^40 elements,
 * but a zero dim lets the others be anything, so saturate. */
static int64_t dims_prod(const int64_t *dims, int a, int b) {
  int64_t n = 1;
  for (int i = a; i < b; i++)
    if (__builtin_mul_overflow(n, dims[i], &n))
      return INT64_MAX;
  return n;
}

/* ==========================================================================
 * Reading indices
 * ======================================================================== */

static inline int64_t idx_at(const void *p, bool i64, int64_t i) {
  return i64 ? ((const int64_t *)p)[i] : ((const int32_t *)p)[i];
}

/* The index at position pos normalised into [0, n), or an error naming it. */
static inline int idx_norm(const es_kinst *k, int64_t v, int64_t n, int64_t pos, int axis,
                           int64_t *out) {
  if (v < -n || v >= n)
    return ES_KFAIL(k, ES_EINVAL, "index %lld (indices element %lld) is outside [-%lld, %lld) "
                    "for axis %d", (long long)v, (long long)pos, (long long)n, (long long)n,
                    axis);
  *out = v < 0 ? v + n : v;
  return 0;
}

/* One element of esz bytes. */
static inline void elem_copy(char *d, const char *s, size_t esz) {
  switch (esz) {
  case 1:
    *d = *s;
    break;
  case 4:
    memcpy(d, s, 4);
    break;
  default:
    memcpy(d, s, 8);
    break;
  }
}

/* ==========================================================================
 * Gather
 * ======================================================================== */

typedef struct gather_params {
  int64_t outer, n, count; /* data [outer, n, inner]; count indices */
  size_t inner;            /* bytes per index */
  bool i64;
  int axis;
} gather_params;

static int gather_infer(es_kinst *k) {
  int rc = es__kio_check(k, 2, 2, 1, 1);
  if (rc < 0 || (rc = indices_check(k, 1)) < 0)
    return rc;
  const es_tdesc *x = k->in[0], *ind = k->in[1];
  int64_t axis_attr;
  int axis;
  if ((rc = es__attr_int(k, "axis", 0, &axis_attr)) < 0)
    return rc;
  if (x->rank == 0)
    return ES_KFAIL(k, ES_EMODEL, "data is a scalar, expected rank >= 1");
  if ((rc = es__axis_norm(k, axis_attr, x->rank, &axis)) < 0)
    return rc;
  int r = ind->rank + x->rank - 1;
  if (r > ES_MAX_RANK)
    return ES_KFAIL(k, ES_ENOTSUP, "output rank %d exceeds the maximum %d", r, ES_MAX_RANK);
  int64_t dims[ES_MAX_RANK];
  int j = 0;
  for (int i = 0; i < axis; i++)
    dims[j++] = x->dims[i];
  for (int i = 0; i < ind->rank; i++)
    dims[j++] = ind->dims[i];
  for (int i = axis + 1; i < x->rank; i++)
    dims[j++] = x->dims[i];
  if ((rc = out_set(k, x->dtype, r, dims)) < 0)
    return rc;
  gather_params *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  p->outer = dims_prod(x->dims, 0, axis);
  p->n = x->dims[axis];
  p->inner = (size_t)dims_prod(x->dims, axis + 1, x->rank) * es_dtype_size(x->dtype);
  p->count = (int64_t)ind->count;
  p->i64 = ind->dtype == ES_DTYPE_INT64;
  p->axis = axis;
  k->params = p;
  return 0;
}

static int gather_run(const es_kinst *k, const void *const *in, void *const *out,
                      void *scratch) {
  (void)scratch;
  const gather_params *p = k->params;
  if (p->outer == 0 || p->count == 0)
    return 0;
  int64_t v;
  for (int64_t j = 0; j < p->count; j++) {
    int rc = idx_norm(k, idx_at(in[1], p->i64, j), p->n, j, p->axis, &v);
    if (rc < 0)
      return rc;
  }
  const char *s = in[0];
  char *d = out[0];
  size_t inner = p->inner;
  for (int64_t o = 0; o < p->outer; o++, s += (size_t)p->n * inner)
    for (int64_t j = 0; j < p->count; j++, d += inner) {
      v = idx_at(in[1], p->i64, j);
      v += v < 0 ? p->n : 0;
      if (inner == 4)
        memcpy(d, s + v * 4, 4);
      else if (inner == 8)
        memcpy(d, s + v * 8, 8);
      else
        memcpy(d, s + (size_t)v * inner, inner);
    }
  return 0;
}

/* ==========================================================================
 * GatherElements, ScatterElements, Scatter: one index per element
 * ======================================================================== */

typedef enum red_op { RED_NONE, RED_ADD, RED_MUL, RED_MAX, RED_MIN } red_op;

typedef struct elems_params {
  int rank, axis;
  es_dtype dtype;
  size_t esz;
  int64_t count;                 /* indices (and updates) elements */
  int64_t idims[ES_MAX_RANK];    /* the indices' dims */
  int64_t dst[ES_MAX_RANK];      /* data strides, 0 along the axis (added per index) */
  int64_t axis_n, axis_st;       /* data's axis length and stride */
  size_t data_bytes;
  bool i64;
  red_op red;
} elems_params;

/* The reduction attribute of the scatters, checked against the opset that
 * introduced each value (add and mul 16, max and min 18). */
static int reduction_attr(es_kinst *k, red_op *out) {
  const char *r;
  int rc = es__attr_string(k, "reduction", "none", &r);
  if (rc < 0)
    return rc;
  static const struct {
    const char *name;
    red_op op;
    int opset;
  } vals[] = {{"none", RED_NONE, 0}, {"add", RED_ADD, 16}, {"mul", RED_MUL, 16},
              {"max", RED_MAX, 18},  {"min", RED_MIN, 18}};
  for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++)
    if (!strcmp(r, vals[i].name)) {
      if (k->opset < vals[i].opset)
        return ES_KFAIL(k, ES_EMODEL, "reduction '%s' needs opset %d (the model has %lld)", r,
                        vals[i].opset, (long long)k->opset);
      *out = vals[i].op;
      return 0;
    }
  return ES_KFAIL(k, ES_EMODEL, "reduction '%s', expected none, add, mul, max or min", r);
}

/* GatherElements (n_in 2) and the element scatters (n_in 3: data,
 * indices, updates of the indices' shape). */
static int elems_infer(es_kinst *k, int n_in) {
  int rc = es__kio_check(k, n_in, n_in, 1, 1);
  if (rc < 0 || (rc = indices_check(k, 1)) < 0)
    return rc;
  const es_tdesc *x = k->in[0], *ind = k->in[1];
  int64_t axis_attr;
  int axis;
  if ((rc = es__attr_int(k, "axis", 0, &axis_attr)) < 0)
    return rc;
  if (x->rank == 0)
    return ES_KFAIL(k, ES_EMODEL, "data is a scalar, expected rank >= 1");
  if (ind->rank != x->rank)
    return ES_KFAIL(k, ES_EMODEL, "indices have rank %d, data %d: expected the same", ind->rank,
                    x->rank);
  if ((rc = es__axis_norm(k, axis_attr, x->rank, &axis)) < 0)
    return rc;
  for (int d = 0; d < x->rank; d++)
    if (d != axis && ind->dims[d] > x->dims[d])
      return ES_KFAIL(k, ES_EMODEL, "indices dim %d is %lld, more than data's %lld", d,
                      (long long)ind->dims[d], (long long)x->dims[d]);
  elems_params *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  if (n_in == 3) {
    const es_tdesc *u = k->in[2];
    if (u->dtype != x->dtype || !es__tdesc_same_shape(u, ind))
      return ES_KFAIL(k, ES_EMODEL, "updates must be %s with the indices' shape",
                      es_dtype_name(x->dtype));
    if (k->node.op == ES_OP_ScatterElements && (rc = reduction_attr(k, &p->red)) < 0)
      return rc;
  }
  p->rank = x->rank;
  p->axis = axis;
  p->dtype = x->dtype;
  p->esz = es_dtype_size(x->dtype);
  p->count = (int64_t)ind->count;
  memcpy(p->idims, ind->dims, sizeof p->idims);
  es__strides_of(x->rank, x->dims, p->dst);
  p->axis_n = x->dims[axis];
  p->axis_st = p->dst[axis];
  p->dst[axis] = 0;
  p->data_bytes = x->nbytes;
  p->i64 = ind->dtype == ES_DTYPE_INT64;
  k->params = p;
  if (n_in == 3)
    k->inplace = 0;
  return n_in == 2 ? out_set(k, x->dtype, ind->rank, ind->dims)
                   : out_set(k, x->dtype, x->rank, x->dims);
}

static int gather_elements_infer(es_kinst *k) { return elems_infer(k, 2); }
static int scatter_elements_infer(es_kinst *k) { return elems_infer(k, 3); }

static int gather_elements_run(const es_kinst *k, const void *const *in, void *const *out,
                               void *scratch) {
  (void)scratch;
  const elems_params *p = k->params;
  if (p->count == 0)
    return 0;
  int64_t v;
  for (int64_t j = 0; j < p->count; j++) {
    int rc = idx_norm(k, idx_at(in[1], p->i64, j), p->axis_n, j, p->axis, &v);
    if (rc < 0)
      return rc;
  }
  const char *s = in[0];
  char *d = out[0];
  size_t esz = p->esz;
  int64_t idx[ES_MAX_RANK] = {0}, off = 0, j = 0;
  /* The walk keeps the data offset of every dim but the axis; each index
   * adds its own. */
  do {
    for (int64_t t = 0; t < p->idims[p->rank - 1]; t++, j++) {
      v = idx_at(in[1], p->i64, j);
      v += v < 0 ? p->axis_n : 0;
      elem_copy(d + j * (int64_t)esz,
                s + (off + t * p->dst[p->rank - 1] + v * p->axis_st) * (int64_t)esz, esz);
    }
  } while (es__walk_step(p->rank - 1, p->idims, idx, 1, &off, p->dst) >= 0);
  return 0;
}

/* ---- reductions ------------------------------------------------------------ */

#define RED_LOOP(T, EXPR)                                                        \
  do {                                                                           \
    T *restrict dd = (T *)(void *)d;                                             \
    const T *restrict ss = (const T *)(const void *)s;                           \
    for (int64_t i = 0; i < n; i++) {                                            \
      T a, b;                                                                    \
      memcpy(&a, dd + i, sizeof a);                                              \
      memcpy(&b, ss + i, sizeof b);                                              \
      a = (EXPR);                                                                \
      memcpy(dd + i, &a, sizeof a);                                              \
    }                                                                            \
  } while (0)

/* Integer add and mul wrap (computed unsigned, as the type's own
 * arithmetic on the hardware, without undefined behaviour). */
#define RED_INT(T, U)                                                            \
  switch (red) {                                                                 \
  case RED_ADD: RED_LOOP(T, (T)(U)((U)a + (U)b)); break;                         \
  case RED_MUL: RED_LOOP(T, (T)(U)((U)a * (U)b)); break;                         \
  case RED_MAX: RED_LOOP(T, a > b ? a : b); break;                               \
  default: RED_LOOP(T, a < b ? a : b); break;                                    \
  }

/* d[i] = d[i] red s[i] for n elements of dtype dt (red != RED_NONE). */
static void reduce_into(es_dtype dt, red_op red, char *d, const char *s, int64_t n) {
  switch (dt) {
  case ES_DTYPE_FLOAT:
    switch (red) {
    case RED_ADD: RED_LOOP(float, a + b); break;
    case RED_MUL: RED_LOOP(float, a * b); break;
    /* NaN wins either way, as numpy's maximum and minimum. */
    case RED_MAX: RED_LOOP(float, isnan(a) || a >= b ? a : b); break;
    default: RED_LOOP(float, isnan(a) || a <= b ? a : b); break;
    }
    break;
  case ES_DTYPE_INT64:
    RED_INT(int64_t, uint64_t)
    break;
  case ES_DTYPE_INT32:
    RED_INT(int32_t, uint32_t)
    break;
  case ES_DTYPE_INT8:
    RED_INT(int8_t, uint8_t)
    break;
  case ES_DTYPE_BOOL:
    if (red == RED_ADD || red == RED_MAX)
      RED_LOOP(uint8_t, (uint8_t)(a | b));
    else
      RED_LOOP(uint8_t, (uint8_t)(a & b));
    break;
  default: /* uint8 */
    RED_INT(uint8_t, uint8_t)
    break;
  }
}

#undef RED_INT
#undef RED_LOOP

static int scatter_elements_run(const es_kinst *k, const void *const *in, void *const *out,
                                void *scratch) {
  (void)scratch;
  const elems_params *p = k->params;
  char *d = out[0];
  if (out[0] != in[0])
    memcpy(d, in[0], p->data_bytes);
  if (p->count == 0)
    return 0;
  const char *u = in[2];
  int64_t esz = (int64_t)p->esz;
  int64_t idx[ES_MAX_RANK] = {0}, off = 0, j = 0;
  do {
    for (int64_t t = 0; t < p->idims[p->rank - 1]; t++, j++) {
      int64_t v = 0;
      int rc = idx_norm(k, idx_at(in[1], p->i64, j), p->axis_n, j, p->axis, &v);
      if (rc < 0)
        return rc;
      char *dp = d + (off + t * p->dst[p->rank - 1] + v * p->axis_st) * esz;
      if (p->red == RED_NONE)
        elem_copy(dp, u + j * esz, p->esz);
      else
        reduce_into(p->dtype, p->red, dp, u + j * esz, 1);
    }
  } while (es__walk_step(p->rank - 1, p->idims, idx, 1, &off, p->dst) >= 0);
  return 0;
}

/* ==========================================================================
 * GatherND, ScatterND: index tuples addressing slices
 * ======================================================================== */

typedef struct nd_params {
  es_dtype dtype;
  int m;                        /* indices per tuple */
  int64_t batches, tuples;      /* tuples per batch */
  int64_t dims[ES_MAX_RANK];    /* the m data dims the tuples address */
  int64_t st[ES_MAX_RANK];      /* their strides, elements */
  int64_t batch_elems;          /* data elements per batch */
  int64_t slice;                /* elements per tuple */
  size_t esz, data_bytes;
  bool i64;
  red_op red;
} nd_params;

/* Data offset (elements, within its batch) of tuple t, or an error. */
static int nd_offset(const es_kinst *k, const nd_params *p, const void *ind, int64_t t,
                     int64_t *off) {
  int64_t o = 0, v = 0;
  for (int j = 0; j < p->m; j++) {
    int64_t pos = t * p->m + j;
    int rc = idx_norm(k, idx_at(ind, p->i64, pos), p->dims[j], pos, j, &v);
    if (rc < 0)
      return rc;
    o += v * p->st[j];
  }
  *off = o;
  return 0;
}

/* Shared by both: data rank r, indices rank q, last indices dim m, batch
 * dims b (GatherND only). */
static int nd_common(es_kinst *k, nd_params *p, int b) {
  const es_tdesc *x = k->in[0], *ind = k->in[1];
  int r = x->rank, q = ind->rank;
  if (r < 1 || q < 1)
    return ES_KFAIL(k, ES_EMODEL, "data has rank %d and indices %d, expected both >= 1", r, q);
  if (b < 0 || b >= (q < r ? q : r))
    return ES_KFAIL(k, ES_EMODEL, "batch_dims %d, expected [0, %d)", b, q < r ? q : r);
  int64_t m = ind->dims[q - 1];
  if (m < 1 || m > r - b)
    return ES_KFAIL(k, ES_EMODEL, "indices' last dim is %lld, expected 1 to %d", (long long)m,
                    r - b);
  for (int i = 0; i < b; i++)
    if (ind->dims[i] != x->dims[i])
      return ES_KFAIL(k, ES_EMODEL, "batch dim %d is %lld in indices and %lld in data", i,
                      (long long)ind->dims[i], (long long)x->dims[i]);
  int64_t st[ES_MAX_RANK];
  es__strides_of(r, x->dims, st);
  p->dtype = x->dtype;
  p->m = (int)m;
  p->batches = dims_prod(x->dims, 0, b);
  p->tuples = dims_prod(ind->dims, b, q - 1);
  for (int j = 0; j < p->m; j++) {
    p->dims[j] = x->dims[b + j];
    p->st[j] = st[b + j];
  }
  p->batch_elems = dims_prod(x->dims, b, r);
  p->slice = dims_prod(x->dims, b + p->m, r);
  p->esz = es_dtype_size(x->dtype);
  p->data_bytes = x->nbytes;
  p->i64 = ind->dtype == ES_DTYPE_INT64;
  return 0;
}

static int gather_nd_infer(es_kinst *k) {
  int rc = es__kio_check(k, 2, 2, 1, 1);
  if (rc < 0 || (rc = indices_check(k, 1)) < 0)
    return rc;
  int64_t b;
  if ((rc = es__attr_int(k, "batch_dims", 0, &b)) < 0)
    return rc;
  nd_params *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  const es_tdesc *x = k->in[0], *ind = k->in[1];
  if (b < 0 || b > ES_MAX_RANK)
    return ES_KFAIL(k, ES_EMODEL, "batch_dims %lld is outside [0, %d]", (long long)b,
                    ES_MAX_RANK);
  if ((rc = nd_common(k, p, (int)b)) < 0)
    return rc;
  /* indices.shape[:-1] + data.shape[b + m:] */
  int64_t dims[2 * ES_MAX_RANK];
  int r = 0;
  for (int i = 0; i < ind->rank - 1; i++)
    dims[r++] = ind->dims[i];
  for (int i = (int)b + p->m; i < x->rank; i++)
    dims[r++] = x->dims[i];
  if (r > ES_MAX_RANK)
    return ES_KFAIL(k, ES_ENOTSUP, "output rank %d exceeds the maximum %d", r, ES_MAX_RANK);
  k->params = p;
  return out_set(k, x->dtype, r, dims);
}

static int gather_nd_run(const es_kinst *k, const void *const *in, void *const *out,
                         void *scratch) {
  (void)scratch;
  const nd_params *p = k->params;
  int64_t n = p->batches * p->tuples, off;
  for (int64_t t = 0; t < n; t++) {
    int rc = nd_offset(k, p, in[1], t, &off);
    if (rc < 0)
      return rc;
  }
  if (p->slice == 0)
    return 0;
  size_t bytes = (size_t)p->slice * p->esz;
  const char *s = in[0];
  char *d = out[0];
  for (int64_t b = 0, t = 0; b < p->batches; b++, s += (size_t)p->batch_elems * p->esz)
    for (int64_t i = 0; i < p->tuples; i++, t++, d += bytes) {
      nd_offset(k, p, in[1], t, &off);
      memcpy(d, s + (size_t)off * p->esz, bytes);
    }
  return 0;
}

static int scatter_nd_infer(es_kinst *k) {
  int rc = es__kio_check(k, 3, 3, 1, 1);
  if (rc < 0 || (rc = indices_check(k, 1)) < 0)
    return rc;
  nd_params *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  if ((rc = reduction_attr(k, &p->red)) < 0 || (rc = nd_common(k, p, 0)) < 0)
    return rc;
  const es_tdesc *x = k->in[0], *ind = k->in[1], *u = k->in[2];
  /* updates: indices.shape[:-1] + data.shape[m:] */
  bool ok = u->dtype == x->dtype && u->rank == ind->rank - 1 + x->rank - p->m;
  for (int i = 0; ok && i < u->rank; i++)
    ok = u->dims[i] == (i < ind->rank - 1 ? ind->dims[i] : x->dims[i - (ind->rank - 1) + p->m]);
  if (!ok)
    return ES_KFAIL(k, ES_EMODEL, "updates are %s of rank %d, expected %s of indices.shape[:-1] "
                    "+ data.shape[%d:]", es_dtype_name(u->dtype), u->rank,
                    es_dtype_name(x->dtype), p->m);
  k->params = p;
  k->inplace = 0;
  return out_set(k, x->dtype, x->rank, x->dims);
}

static int scatter_nd_run(const es_kinst *k, const void *const *in, void *const *out,
                          void *scratch) {
  (void)scratch;
  const nd_params *p = k->params;
  char *d = out[0];
  if (out[0] != in[0])
    memcpy(d, in[0], p->data_bytes);
  size_t bytes = (size_t)p->slice * p->esz;
  const char *u = in[2];
  for (int64_t t = 0; t < p->tuples; t++, u += bytes) {
    int64_t off;
    int rc = nd_offset(k, p, in[1], t, &off);
    if (rc < 0)
      return rc;
    char *dp = d + (size_t)off * p->esz;
    if (p->red == RED_NONE)
      memcpy(dp, u, bytes);
    else
      reduce_into(p->dtype, p->red, dp, u, p->slice);
  }
  return 0;
}

/* ==========================================================================
 * Values as numbers (NonZero, Unique)
 * ======================================================================== */

static int value_dtype_check(es_kinst *k, es_dtype dt) {
  if (dt != ES_DTYPE_FLOAT && dt != ES_DTYPE_UINT8 && dt != ES_DTYPE_INT8 &&
      dt != ES_DTYPE_INT32 && dt != ES_DTYPE_INT64 && dt != ES_DTYPE_BOOL)
    return ES_KFAIL(k, ES_ENOTSUP, "input is %s (float32, uint8, int8, int32, int64, bool "
                    "supported)", es_dtype_name(dt));
  return 0;
}

/* Element i compared with element j of the same tensor: -1, 0 or 1 (NaN
 * after every number, equal to itself). */
static int value_cmp(es_dtype dt, const void *d, int64_t i, int64_t j) {
  switch (dt) {
  case ES_DTYPE_FLOAT: {
    float a = ((const float *)d)[i], b = ((const float *)d)[j];
    if (a != a || b != b)
      return (a != a) - (b != b);
    return (a > b) - (a < b);
  }
  case ES_DTYPE_INT32: {
    int32_t a = ((const int32_t *)d)[i], b = ((const int32_t *)d)[j];
    return (a > b) - (a < b);
  }
  case ES_DTYPE_INT64: {
    int64_t a = ((const int64_t *)d)[i], b = ((const int64_t *)d)[j];
    return (a > b) - (a < b);
  }
  case ES_DTYPE_INT8: {
    int8_t a = ((const int8_t *)d)[i], b = ((const int8_t *)d)[j];
    return (a > b) - (a < b);
  }
  default: { /* uint8, bool */
    uint8_t a = ((const uint8_t *)d)[i], b = ((const uint8_t *)d)[j];
    return (a > b) - (a < b);
  }
  }
}

static bool value_nonzero(es_dtype dt, const void *d, int64_t i) {
  switch (dt) {
  case ES_DTYPE_FLOAT:
    return ((const float *)d)[i] != 0; /* NaN counts, -0 does not */
  case ES_DTYPE_INT32:
    return ((const int32_t *)d)[i] != 0;
  case ES_DTYPE_INT64:
    return ((const int64_t *)d)[i] != 0;
  default:
    return ((const uint8_t *)d)[i] != 0;
  }
}

/* ==========================================================================
 * NonZero
 * ======================================================================== */

typedef struct nonzero_params {
  es_dtype dtype;
  int rank;                    /* of the output's first dim: X's rank, 1 for a scalar */
  int64_t count;
  int64_t dims[ES_MAX_RANK];   /* X's (a scalar's: {1}) */
} nonzero_params;

/* The output's shape depends on X's values: [rank, count] bounds it (every
 * element non-zero), and run sets the actual [rank, nz]. With X known while
 * planning the planner runs it then, so its shape is exact. */
static int nonzero_infer(es_kinst *k) {
  int rc = es__kio_check(k, 1, 1, 1, 1);
  if (rc < 0)
    return rc;
  const es_tdesc *x = k->in[0];
  if ((rc = value_dtype_check(k, x->dtype)) < 0)
    return rc;
  nonzero_params *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  p->dtype = x->dtype;
  p->rank = x->rank ? x->rank : 1;
  p->count = (int64_t)x->count;
  p->dims[0] = 1;
  for (int a = 0; a < x->rank; a++)
    p->dims[a] = x->dims[a];
  int64_t dims[2] = {p->rank, p->count};
  if ((rc = out_set(k, ES_DTYPE_INT64, 2, dims)) < 0)
    return rc;
  k->out_bound = 1;
  k->bound_dims = 2; /* [rank, count]: the count */
  snprintf(k->bound_why, sizeof k->bound_why, "X's %lld elements, all non-zero",
           (long long)p->count);
  k->params = p;
  return 0;
}

/* The index of the first non-zero element at or after i, or n. A mask of
 * one-byte elements (a comparison's bool output, the usual input) is
 * skipped eight zero bytes at a time: a detector's scores above a
 * threshold are a few hundred among millions. */
static int64_t nonzero_next(es_dtype dt, const void *d, int64_t i, int64_t n) {
  if (es_dtype_size(dt) == 1) {
    const uint8_t *b = d;
    for (; i < n && (i & 7); i++)
      if (b[i])
        return i;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      memcpy(&w, b + i, 8);
      if (w)
        break;
    }
    for (; i < n; i++)
      if (b[i])
        return i;
    return n;
  }
  for (; i < n; i++)
    if (value_nonzero(dt, d, i))
      return i;
  return n;
}

static int nonzero_run(const es_kinst *k, const void *const *in, void *const *out,
                       void *scratch) {
  (void)scratch;
  const nonzero_params *p = k->params;
  int64_t nz = 0;
  for (int64_t i = nonzero_next(p->dtype, in[0], 0, p->count); i < p->count;
       i = nonzero_next(p->dtype, in[0], i + 1, p->count))
    nz++;
  int64_t dims[2] = {p->rank, nz};
  int rc = es__tdesc_set(k->out[0], ES_DTYPE_INT64, 2, dims);
  if (rc < 0)
    return rc;
  int64_t *c = out[0];
  int64_t st[ES_MAX_RANK];
  es__strides_of(p->rank, p->dims, st);
  int64_t j = 0;
  for (int64_t i = nonzero_next(p->dtype, in[0], 0, p->count); i < p->count;
       i = nonzero_next(p->dtype, in[0], i + 1, p->count), j++)
    for (int a = 0; a < p->rank; a++)
      c[a * nz + j] = (i / st[a]) % p->dims[a];
  return 0;
}

/* ==========================================================================
 * Unique
 * ======================================================================== */

typedef struct unique_params {
  es_dtype dt;
  int axis;             /* -1: over every element */
  int sorted;
  int rank;             /* of Y */
  int64_t dims[ES_MAX_RANK]; /* Y's, the unique count at the axis set by run */
  int64_t outer, n, inner; /* X as [outer, n, inner] items along the axis (inner in elements) */
  size_t esize;
  bool want[4];
} unique_params;

typedef struct unique_sort {
  es_dtype dt;
  const void *d;
  int64_t outer, n, inner; /* inner in elements */
} unique_sort;

/* Item a compared with item b, element by element in row-major order. */
static int unique_cmp(const unique_sort *s, int64_t a, int64_t b) {
  for (int64_t o = 0; o < s->outer; o++)
    for (int64_t j = 0; j < s->inner; j++) {
      int64_t base = o * s->n * s->inner + j;
      int c = value_cmp(s->dt, s->d, base + a * s->inner, base + b * s->inner);
      if (c)
        return c;
    }
  return 0;
}

/* Stable bottom-up merge sort of v[0..n) by unique_cmp (tmp: n more). */
static void unique_msort(const unique_sort *s, int64_t *v, int64_t *tmp, int64_t n) {
  for (int64_t w = 1; w < n; w *= 2) {
    for (int64_t lo = 0; lo < n; lo += 2 * w) {
      int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
      int64_t i = lo, j = mid, t = lo;
      while (i < mid && j < hi)
        tmp[t++] = unique_cmp(s, v[j], v[i]) < 0 ? v[j++] : v[i++];
      while (i < mid)
        tmp[t++] = v[i++];
      while (j < hi)
        tmp[t++] = v[j++];
    }
    memcpy(v, tmp, (size_t)n * sizeof *v);
  }
}

/* The unique items of s: first[g] (the item of group g, in output order),
 * inv[i] (item i's group) and cnt[g]; returns the count. ord: 2 n scratch,
 * grp: n. */
static int64_t unique_compute(const unique_sort *s, int sorted, int64_t *ord, int64_t *grp,
                              int64_t *first, int64_t *inv, int64_t *cnt) {
  int64_t n = s->n;
  for (int64_t i = 0; i < n; i++)
    ord[i] = i;
  /* groups in sorted order; ties keep index order, so a group's first item
   * is its first occurrence */
  unique_msort(s, ord, ord + n, n);
  int64_t u = 0;
  for (int64_t i = 0; i < n; i++) {
    if (i == 0 || unique_cmp(s, ord[i - 1], ord[i]) != 0) {
      first[u] = ord[i];
      cnt[u] = 0;
      u++;
    }
    grp[ord[i]] = u - 1;
    cnt[u - 1]++;
  }
  if (!sorted) { /* renumber groups by first occurrence */
    int64_t *ren = ord; /* reused: sorted order is no longer needed */
    for (int64_t g = 0; g < u; g++)
      ren[g] = -1;
    int64_t next = 0;
    for (int64_t i = 0; i < n; i++)
      if (ren[grp[i]] < 0)
        ren[grp[i]] = next++;
    int64_t *f2 = ord + n, *c2 = grp; /* grp is rewritten below from ren */
    for (int64_t g = 0; g < u; g++)
      f2[ren[g]] = first[g];
    for (int64_t i = 0; i < n; i++)
      inv[i] = ren[grp[i]];
    for (int64_t g = 0; g < u; g++)
      c2[ren[g]] = cnt[g];
    memcpy(first, f2, (size_t)u * sizeof *first);
    memcpy(cnt, c2, (size_t)u * sizeof *cnt);
  } else {
    memcpy(inv, grp, (size_t)n * sizeof *inv);
  }
  return u;
}

/* The outputs' shapes depend on X's values: every item distinct bounds
 * them (kernel.h, "Data-dependent shapes"); run finds the actual count.
 * With X known while planning the planner runs it then. */
static int unique_infer(es_kinst *k) {
  if (k->n_in != 1 || !k->in[0])
    return ES_KFAIL(k, ES_EMODEL, "has %d inputs, expected 1", k->n_in);
  if (k->n_out < 1 || k->n_out > 4 || !k->out[0])
    return ES_KFAIL(k, ES_EMODEL, "has %d outputs, expected 1 to 4 with Y present", k->n_out);
  const es_tdesc *x = k->in[0];
  int rc = value_dtype_check(k, x->dtype);
  if (rc < 0)
    return rc;
  int64_t sorted;
  if ((rc = es__attr_int(k, "sorted", 1, &sorted)) < 0)
    return rc;
  if (sorted != 0 && sorted != 1)
    return ES_KFAIL(k, ES_EMODEL, "sorted is %lld, expected 0 or 1", (long long)sorted);
  int axis = -1;
  if (es__kattr(k, "axis")) {
    int64_t a;
    if ((rc = es__attr_int(k, "axis", 0, &a)) < 0)
      return rc;
    if (x->rank == 0)
      return ES_KFAIL(k, ES_EMODEL, "input is a scalar, expected rank >= 1 with an axis");
    if ((rc = es__axis_norm(k, a, x->rank, &axis)) < 0)
      return rc;
  }
  unique_params *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  p->dt = x->dtype;
  p->axis = axis;
  p->sorted = (int)sorted;
  p->esize = es_dtype_size(x->dtype);
  p->outer = 1;
  p->n = (int64_t)x->count;
  p->inner = 1;
  p->rank = 1;
  p->dims[0] = p->n;
  if (axis >= 0) {
    p->outer = dims_prod(x->dims, 0, axis);
    p->n = x->dims[axis];
    p->inner = dims_prod(x->dims, axis + 1, x->rank);
    p->rank = x->rank;
    memcpy(p->dims, x->dims, sizeof p->dims);
  }
  int64_t dn = p->n;
  if ((rc = es__tdesc_set(k->out[0], x->dtype, p->rank, p->dims)) < 0)
    return ES_KFAIL(k, rc, "output Y: %s", es_last_error_detail());
  for (int o = 1; o < k->n_out; o++)
    if (k->out[o] && (rc = es__tdesc_set(k->out[o], ES_DTYPE_INT64, 1, &dn)) < 0)
      return ES_KFAIL(k, rc, "output %d: %s", o, es_last_error_detail());
  for (int o = 0; o < k->n_out; o++)
    p->want[o] = k->out[o] != NULL;
  k->out_bound = 1u | (p->want[1] ? 2u : 0u) | (p->want[3] ? 8u : 0u);
  k->bound_dims = 1u << (axis >= 0 ? axis : 0);
  snprintf(k->bound_why, sizeof k->bound_why, "%lld items, all distinct", (long long)p->n);
  /* ord (2 n), grp, first, inv, cnt */
  k->scratch_bytes = 6 * (size_t)p->n * sizeof(int64_t);
  k->params = p;
  return 0;
}

static int unique_run(const es_kinst *k, const void *const *in, void *const *out,
                      void *scratch) {
  const unique_params *p = k->params;
  int64_t n = p->n;
  int64_t *ord = scratch, *grp = ord + 2 * n, *first = grp + n, *inv = first + n, *cnt = inv + n;
  unique_sort s = {p->dt, in[0], p->outer, n, p->inner};
  int64_t u = unique_compute(&s, p->sorted, ord, grp, first, inv, cnt);
  int64_t dims[ES_MAX_RANK];
  memcpy(dims, p->dims, sizeof dims);
  dims[p->axis >= 0 ? p->axis : 0] = u;
  int rc = es__tdesc_set(k->out[0], p->dt, p->rank, dims);
  for (int o = 1; rc == 0 && o < 4; o += 2)
    if (o < k->n_out && p->want[o])
      rc = es__tdesc_set(k->out[o], ES_DTYPE_INT64, 1, &u);
  if (rc < 0)
    return rc;
  const char *x = in[0];
  char *y = out[0];
  size_t item = (size_t)p->inner * p->esize;
  for (int64_t o = 0; o < p->outer; o++)
    for (int64_t g = 0; g < u; g++)
      memcpy(y + (size_t)(o * u + g) * item, x + (size_t)(o * n + first[g]) * item, item);
  if (p->want[1])
    memcpy(out[1], first, (size_t)u * sizeof(int64_t));
  if (k->n_out > 2 && p->want[2])
    memcpy(out[2], inv, (size_t)n * sizeof(int64_t));
  if (k->n_out > 3 && p->want[3])
    memcpy(out[3], cnt, (size_t)u * sizeof(int64_t));
  return 0;
}

/* ==========================================================================
 * Family
 * ======================================================================== */

static const es_kernel k_gather = {gather_infer, gather_run, NULL, 0};
static const es_kernel k_gather_elements = {gather_elements_infer, gather_elements_run, NULL, 0};
static const es_kernel k_gather_nd = {gather_nd_infer, gather_nd_run, NULL, 0};
static const es_kernel k_scatter_elements = {scatter_elements_infer, scatter_elements_run, NULL,
                                             0};
static const es_kernel k_scatter_nd = {scatter_nd_infer, scatter_nd_run, NULL, 0};
static const es_kernel k_nonzero = {nonzero_infer, nonzero_run, NULL, 0};
static const es_kernel k_unique = {unique_infer, unique_run, NULL, 0};

const es_kernel *es__kernels_indexing(es_op op) {
  switch (op) {
  case ES_OP_Gather:
    return &k_gather;
  case ES_OP_GatherElements:
    return &k_gather_elements;
  case ES_OP_GatherND:
    return &k_gather_nd;
  case ES_OP_Scatter: /* opset 9-10's name for ScatterElements, without reduction */
  case ES_OP_ScatterElements:
    return &k_scatter_elements;
  case ES_OP_NonZero:
    return &k_nonzero;
  case ES_OP_Unique:
    return &k_unique;
  case ES_OP_ScatterND:
    return &k_scatter_nd;
  default:
    return NULL;
  }
}
