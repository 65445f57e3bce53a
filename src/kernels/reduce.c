/* Reductions: ReduceMean and Softmax (float32).
 *
 * ReduceMean. infer drops size-1 axes and merges runs of adjacent axes that
 * are all reduced or all kept, so any axes set becomes at most ES_MAX_RANK
 * alternating groups (e.g. NCHW over H,W is [kept N*C, reduced H*W]). run
 * then reads the input once, in order: the last group is either reduced (sum
 * a contiguous run into one output) or kept (add a contiguous run into
 * consecutive outputs), while an odometer over the other groups tracks the
 * output offset. Reducing only the last axis (LayerNorm's mean) is the fast
 * path: one contiguous sum per output row, no zeroing pass. Axes come from
 * the attribute before opset 18, from input 1 from opset 18 on.
 *
 * Softmax. Before opset 13 the input is flattened to 2-D at axis and each
 * row is normalised; from 13 on only the axis is: the tensor is viewed as
 * [outer, n, inner]. inner = 1 (the usual last axis) runs row by row over
 * contiguous memory; inner > 1 runs across rows, keeping the running max and
 * sum for `inner` columns in scratch so every pass is contiguous. Both
 * subtract the max first so exp never overflows, and use ew_math.h's
 * branch-free exp (Cephes' polynomial, about 1 ulp), which vectorises. Out
 * may alias in: every element is read before its output is written. */
#include "kernels/kernel.h"

#include <math.h>
#include <string.h>

#include "kernels/ew_math.h"
#include "kernels/walk.h"

/* ==========================================================================
 * Shared
 * ======================================================================== */

static int reduce_input_f32(es_kinst *k) {
  if (k->n_in < 1 || !k->in[0])
    return ES_KFAIL(k, ES_EMODEL, "input is missing");
  if (k->n_out != 1 || !k->out[0])
    return ES_KFAIL(k, ES_EMODEL, "%d outputs, expected 1", k->n_out);
  if (k->in[0]->dtype != ES_DTYPE_FLOAT)
    return ES_KFAIL(k, ES_EMODEL, "input is %s, expected float32",
                    es_dtype_name(k->in[0]->dtype));
  return 0;
}

/* ==========================================================================
 * ReduceMean
 * ======================================================================== */

typedef struct rmean_params {
  int ng;                     /* groups of merged axes (>= 1) */
  int64_t ext[ES_MAX_RANK];   /* extent of each group */
  int red[ES_MAX_RANK];       /* 1 if the group is reduced */
  int64_t ostr[ES_MAX_RANK];  /* output stride of a kept group, 0 if reduced */
  int64_t in_count, out_count;
  float inv;                  /* 1 / reduced elements (NaN when none) */
} rmean_params;

static int rmean_infer(es_kinst *k) {
  int rc = reduce_input_f32(k);
  if (rc < 0)
    return rc;
  const es_tdesc *x = k->in[0];
  int64_t keepdims, noop = 0;
  if ((rc = es__attr_int(k, "keepdims", 1, &keepdims)) < 0)
    return rc;
  if (keepdims != 0 && keepdims != 1)
    return ES_KFAIL(k, ES_EMODEL, "keepdims is %lld, expected 0 or 1", (long long)keepdims);

  int64_t axes[ES_MAX_RANK];
  size_t n_axes = 0;
  if (k->opset < 18) {
    const int64_t *v;
    size_t n;
    if ((rc = es__attr_ints(k, "axes", &v, &n)) < 0)
      return rc;
    if (n > (size_t)x->rank)
      return ES_KFAIL(k, ES_EMODEL, "%zu axes for rank %d", n, x->rank);
    for (size_t i = 0; i < n; i++)
      axes[n_axes++] = v[i];
  } else {
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

  int reduced[ES_MAX_RANK] = {0};
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

  int64_t odims[ES_MAX_RANK];
  int orank = 0;
  for (int i = 0; i < x->rank; i++)
    if (!reduced[i])
      odims[orank++] = x->dims[i];
    else if (keepdims)
      odims[orank++] = 1;
  if ((rc = es__tdesc_set(k->out[0], ES_DTYPE_FLOAT, orank, odims)) < 0)
    return rc;

  rmean_params *p = es__kinst_alloc(k, sizeof *p);
  if (!p)
    return ES_KFAIL(k, ES_ENOMEM, "out of memory for ReduceMean parameters");
  int64_t rcount = 1;
  for (int i = 0; i < x->rank; i++) {
    if (reduced[i])
      rcount *= x->dims[i];
    if (x->dims[i] == 1)
      continue; /* a size-1 axis is both kept and reduced: skip it */
    if (p->ng > 0 && p->red[p->ng - 1] == reduced[i]) {
      p->ext[p->ng - 1] *= x->dims[i];
    } else {
      p->ext[p->ng] = x->dims[i];
      p->red[p->ng] = reduced[i];
      p->ng++;
    }
  }
  if (p->ng == 0) { /* every axis has size 1: a copy */
    p->ext[0] = 1;
    p->ng = 1;
  }
  int64_t s = 1;
  for (int g = p->ng - 1; g >= 0; g--) {
    p->ostr[g] = p->red[g] ? 0 : s;
    if (!p->red[g])
      s *= p->ext[g];
  }
  p->in_count = (int64_t)x->count;
  p->out_count = (int64_t)k->out[0]->count;
  p->inv = rcount > 0 ? 1.0f / (float)rcount : NAN;
  k->params = p;
  return 0;
}

static int rmean_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  (void)scratch;
  const rmean_params *p = k->params;
  const float *restrict x = in[0];
  float *restrict y = out[0];
  int last = p->ng - 1;
  int64_t run = p->ext[last];
  float inv = p->inv;

  /* fast path: only trailing axes reduced, one contiguous sum per output */
  if (p->red[last] && (p->ng == 1 || (p->ng == 2 && !p->red[0]))) {
    for (int64_t r = 0; r < p->out_count; r++)
      y[r] = es__ew_sum_f32(x + r * run, run) * inv;
    return 0;
  }

  for (int64_t i = 0; i < p->out_count; i++)
    y[i] = 0.0f;
  int64_t idx[ES_MAX_RANK] = {0};
  int64_t off = 0; /* output offset of the current run */
  int64_t steps = run > 0 ? p->in_count / run : 0;
  for (int64_t st = 0; st < steps; st++, x += run) {
    if (p->red[last]) {
      y[off] += es__ew_sum_f32(x, run);
    } else {
      float *restrict o = y + off;
      for (int64_t j = 0; j < run; j++)
        o[j] += x[j];
    }
    es__walk_step(last, p->ext, idx, 1, &off, p->ostr);
  }
  for (int64_t i = 0; i < p->out_count; i++)
    y[i] *= inv;
  return 0;
}

/* ==========================================================================
 * Softmax
 * ======================================================================== */

typedef struct softmax_params {
  int64_t outer, n, inner; /* normalise over n, elements `inner` apart */
} softmax_params;

static int softmax_infer(es_kinst *k) {
  int rc = reduce_input_f32(k);
  if (rc < 0)
    return rc;
  const es_tdesc *x = k->in[0];
  int64_t axis_attr;
  int legacy = k->opset < 13; /* flatten-to-2-D semantics */
  if ((rc = es__attr_int(k, "axis", legacy ? 1 : -1, &axis_attr)) < 0)
    return rc;
  int axis;
  if ((rc = es__axis_norm(k, axis_attr, x->rank, &axis)) < 0)
    return rc;
  softmax_params *p = es__kinst_alloc(k, sizeof *p);
  if (!p)
    return ES_KFAIL(k, ES_ENOMEM, "out of memory for Softmax parameters");
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
  k->scratch_bytes = p->inner > 1 ? 2 * (size_t)p->inner * sizeof(float) : 0;
  k->inplace = 0;
  k->params = p;
  return 0;
}

/* Exp, sum and scale are separate loops: a running sum inside the exp loop
 * would be a float reduction, which the vectoriser may not reorder. */
static void softmax_rows(const float *x, float *y, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; r++, x += n, y += n) {
    float m = es__ew_max_f32(x, n);
    for (int64_t j = 0; j < n; j++)
      y[j] = es__ew_exp_neg_floor(x[j] - m);
    float inv = 1.0f / es__ew_sum_f32(y, n);
    for (int64_t j = 0; j < n; j++)
      y[j] *= inv;
  }
}

static void softmax_cols(const float *x, float *y, int64_t outer, int64_t n, int64_t inner,
                         float *restrict m, float *restrict s) {
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
  if (p->inner == 1)
    softmax_rows(in[0], out[0], p->outer, p->n);
  else
    softmax_cols(in[0], out[0], p->outer, p->n, p->inner, scratch, (float *)scratch + p->inner);
  return 0;
}

/* ==========================================================================
 * Family
 * ======================================================================== */

static const es_kernel rmean_kernel = {rmean_infer, rmean_run, NULL, 0};
static const es_kernel softmax_kernel = {softmax_infer, softmax_run, NULL, 0};

const es_kernel *es__kernels_reduce(es_op op) {
  switch (op) {
  case ES_OP_ReduceMean:
    return &rmean_kernel;
  case ES_OP_Softmax:
    return &softmax_kernel;
  default:
    return NULL;
  }
}
