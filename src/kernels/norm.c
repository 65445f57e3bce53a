/* Normalisations (float32): BatchNormalization (inference form),
 * InstanceNormalization, GroupNormalization, MeanVarianceNormalization, LRN
 * and LpNormalization. LayerNormalization shares the internal LayerNorm's
 * row loop in layernorm.c.
 *
 * BatchNormalization. y = (x - mean) / sqrt(var + epsilon) * scale + B per
 * channel folds into y = x * a[c] + b[c] with a = scale / sqrt(var +
 * epsilon) and b = B - mean * a. When the four parameter tensors are known
 * at plan time (the usual case: they are weights) infer computes a and b
 * once, in double, into plan memory; otherwise run computes them into
 * scratch first. Either way the hot loop is one multiply-add over each
 * contiguous N x C plane, and Y may reuse X's buffer. Training
 * (training_mode = 1, or the running/saved statistics outputs requested)
 * is ENOTSUP, as is spatial = 0 (opsets 7 and 8: per-element parameters).
 * A BatchNormalization that was not folded into a convolution usually sits
 * between two of them, so an NHWC X gives an NHWC Y: per pixel, one
 * multiply-add over the C contiguous channels with a and b read along the
 * last dim. A Relu after it that nothing else reads is applied in the same
 * pass (attribute "_relu", written by the fusion pass).
 *
 * InstanceNormalization and GroupNormalization are one kernel: per image,
 * the channels split into G groups of C/G channels (G = C for an instance
 * norm), each group a contiguous block of C/G planes. Per block: the mean,
 * the variance as the mean of squared deviations (two passes over a block
 * that is usually in cache; no cancellation when the mean is large), then
 * y = (x - mean) * inv * scale + bias with one multiply-add per element,
 * scale and bias per channel (InstanceNormalization, GroupNormalization
 * from opset 21) or per group (GroupNormalization 18).
 *
 * MeanVarianceNormalization reduces over an axes set (default N, H, W) and
 * broadcasts back: the axes become groups (reduce.h) and three passes walk
 * the input in order, the sums and then the squared deviations into
 * per-output scratch, then y = (x - mean) / (sqrt(var) + 1e-9) as ONNX's
 * function body defines it (epsilon on the deviation, not the variance).
 *
 * LRN sums squares across `size` neighbouring channels of each pixel, per
 * image a plane at a time into scratch, then y = x * (bias + alpha / size *
 * sum)^-beta; beta = 0.75 (every model that uses LRN) is two square roots
 * instead of a pow.
 *
 * LpNormalization divides by the L1 or L2 norm along one axis ([outer, n,
 * inner] around it; the norms of a row of columns in scratch when inner >
 * 1). A zero vector gives 0/0 = NaN, as ONNX's reference. */
#include "kernels/kernel.h"

#include <math.h>
#include <string.h>

#include "kernels/ew_math.h"
#include "kernels/reduce.h"

/* ==========================================================================
 * BatchNormalization
 * ======================================================================== */

typedef struct bn_params {
  int64_t n, c, plane; /* X viewed as [n, c, plane], or [n, plane, c] when nhwc */
  int nhwc;
  int relu;            /* "_relu" (fuse_conv.c): clamp at 0 in the same pass */
  float eps;
  const float *a, *b;  /* [c] when the parameters are static, else NULL */
} bn_params;

static void bn_fold(const float *scale, const float *bias, const float *mean, const float *var,
                    float eps, int64_t c, float *a, float *b) {
  for (int64_t i = 0; i < c; i++) {
    double ai = (double)scale[i] / sqrt((double)var[i] + (double)eps);
    a[i] = (float)ai;
    b[i] = (float)((double)bias[i] - (double)mean[i] * ai);
  }
}

static int bn_infer(es_kinst *k) {
  static const char *const names[] = {"X", "scale", "B", "mean", "var"};
  if (k->n_in != 5)
    return ES_KFAIL(k, ES_EMODEL, "%d inputs, expected 5 (X, scale, B, mean, var)", k->n_in);
  for (int i = 0; i < 5; i++)
    if (!k->in[i])
      return ES_KFAIL(k, ES_EMODEL, "input %s is missing", names[i]);
  if (k->n_out < 1 || !k->out[0])
    return ES_KFAIL(k, ES_EMODEL, "output Y is missing");
  int64_t training = 0, spatial = 1, relu = 0;
  float eps;
  int rc;
  if ((rc = es__attr_float(k, "epsilon", 1e-5f, &eps)) < 0 ||
      (rc = es__attr_int(k, "_relu", 0, &relu)) < 0 ||
      (rc = es__attr_int(k, "training_mode", 0, &training)) < 0 ||
      (rc = es__attr_int(k, "spatial", 1, &spatial)) < 0)
    return rc;
  if (training != 0 && training != 1)
    return ES_KFAIL(k, ES_EMODEL, "training_mode is %lld, expected 0 or 1", (long long)training);
  if (training)
    return ES_KFAIL(k, ES_ENOTSUP, "training_mode 1 not implemented (inference only)");
  for (int i = 1; i < k->n_out; i++)
    if (k->out[i])
      return ES_KFAIL(k, ES_ENOTSUP,
                      "output %d (training statistics) not implemented (inference only)", i);
  if (spatial != 1)
    return ES_KFAIL(k, ES_ENOTSUP, "spatial = %lld not implemented (only 1)", (long long)spatial);
  if (!(eps >= 0) || isinf(eps))
    return ES_KFAIL(k, ES_EMODEL, "epsilon is %g, expected a finite value >= 0", (double)eps);

  const es_tdesc *x = k->in[0];
  if (x->dtype != ES_DTYPE_FLOAT)
    return ES_KFAIL(k, ES_EMODEL, "X is %s, expected float32", es_dtype_name(x->dtype));
  if (x->rank < 2)
    return ES_KFAIL(k, ES_EMODEL, "X has rank %d, expected at least 2 (N, C, ...)", x->rank);
  int64_t c = x->dims[1];
  for (int i = 1; i < 5; i++) {
    const es_tdesc *t = k->in[i];
    if (t->dtype != ES_DTYPE_FLOAT || t->rank != 1 || t->dims[0] != c)
      return ES_KFAIL(k, ES_EMODEL, "%s is %s of %zu elements (rank %d), expected float32 [%lld]",
                      names[i], es_dtype_name(t->dtype), t->count, t->rank, (long long)c);
  }

  bn_params *p = es__kinst_alloc(k, sizeof *p);
  if (!p)
    return ES_KFAIL(k, ES_ENOMEM, "out of memory for BatchNormalization parameters");
  p->n = x->dims[0];
  p->c = c;
  p->plane = 1;
  for (int i = 2; i < x->rank; i++)
    p->plane *= x->dims[i];
  p->eps = eps;
  p->relu = relu != 0;
  p->nhwc = x->layout == ES_LAYOUT_NHWC;
  const void *const *s = k->in_static;
  if (s[1] && s[2] && s[3] && s[4]) {
    float *ab = es__kinst_alloc(k, 2 * (size_t)c * sizeof *ab + 1);
    if (!ab)
      return ES_KFAIL(k, ES_ENOMEM, "out of memory for folded BatchNormalization parameters");
    bn_fold(s[1], s[2], s[3], s[4], eps, c, ab, ab + c);
    p->a = ab;
    p->b = ab + c;
  } else {
    k->scratch_bytes = 2 * (size_t)c * sizeof(float);
  }
  k->params = p;
  k->inplace = 0;
  if ((rc = es__tdesc_set(k->out[0], ES_DTYPE_FLOAT, x->rank, x->dims)) < 0)
    return rc;
  k->out[0]->layout = x->layout;
  return 0;
}

/* y = x a + b over rows of n elements with per-element a and b (rows of
 * channels-last pixels) or one a and b (stride 0: a channel's plane),
 * clamped at 0 (NaN kept, as Relu) with relu. Y may be X (infer allows it
 * in place): that case gets a loop over y alone, since with two pointers
 * that may overlap the vectoriser checks at run time and takes its scalar
 * loop when they do. Built per vector width: the default build's SSE2
 * loop was a third of DenseNet's non-conv time. */
#define BN_LOOP(get)                                                                      \
  for (int64_t r = 0; r < rows; r++, y += n) {                                            \
    if (relu)                                                                             \
      for (int64_t i = 0; i < n; i++) {                                                   \
        float v = (get) * a[i * as] + b[i * as];                                          \
        y[i] = v < 0.0f ? 0.0f : v;                                                       \
      }                                                                                   \
    else                                                                                  \
      for (int64_t i = 0; i < n; i++)                                                     \
        y[i] = (get) * a[i * as] + b[i * as];                                             \
  }

ES_KCLONES static void bn_rows(const float *restrict x, float *restrict y, int64_t rows,
                               int64_t n, const float *restrict a, const float *restrict b,
                               int64_t as, int relu) {
  BN_LOOP(x[r * n + i])
}

ES_KCLONES static void bn_rows_inplace(float *y, int64_t rows, int64_t n,
                                       const float *restrict a, const float *restrict b,
                                       int64_t as, int relu) {
  BN_LOOP(y[i])
}

static void bn_apply(const float *x, float *y, int64_t rows, int64_t n, const float *a,
                     const float *b, int64_t as, int relu) {
  if (x == y)
    bn_rows_inplace(y, rows, n, a, b, as, relu);
  else
    bn_rows(x, y, rows, n, a, b, as, relu);
}

static int bn_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  const bn_params *p = k->params;
  const float *a = p->a, *b = p->b;
  if (!a) {
    float *ab = scratch;
    bn_fold(in[1], in[2], in[3], in[4], p->eps, p->c, ab, ab + p->c);
    a = ab;
    b = ab + p->c;
  }
  const float *x = in[0];
  float *y = out[0];
  if (p->nhwc) {
    bn_apply(x, y, p->n * p->plane, p->c, a, b, 1, p->relu);
    return 0;
  }
  for (int64_t n = 0; n < p->n; n++)
    for (int64_t c = 0; c < p->c; c++, x += p->plane, y += p->plane)
      bn_apply(x, y, 1, p->plane, a + c, b + c, 0, p->relu);
  return 0;
}

/* ==========================================================================
 * Shared: the statistics of a contiguous block
 * ======================================================================== */

/* Sum of (v[i] - m)^2 with eight partial sums. */
static float norm_sqdev(const float *restrict v, int64_t n, float m) {
  float acc[8] = {0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; l++) {
      float t = v[i + l] - m;
      acc[l] += t * t;
    }
  float s = es__ew_hsum8(acc);
  for (; i < n; i++) {
    float t = v[i] - m;
    s += t * t;
  }
  return s;
}

/* The input called name must be float32 of rank 1 with len elements. */
static int norm_vec(es_kinst *k, int i, const char *name, int64_t len, const char *what) {
  const es_tdesc *t = i < k->n_in ? k->in[i] : NULL;
  if (!t)
    return ES_KFAIL(k, ES_EMODEL, "input %s is missing", name);
  if (t->dtype != ES_DTYPE_FLOAT || t->rank != 1 || t->dims[0] != len)
    return ES_KFAIL(k, ES_EMODEL, "%s is %s of %zu elements (rank %d), expected float32 [%lld] "
                    "(%s)", name, es_dtype_name(t->dtype), t->count, t->rank, (long long)len,
                    what);
  return 0;
}

/* X must be float32 of rank >= min_rank. */
static int norm_x(es_kinst *k, int min_rank) {
  if (k->n_in < 1 || !k->in[0])
    return ES_KFAIL(k, ES_EMODEL, "input X is missing");
  if (k->n_out < 1 || !k->out[0])
    return ES_KFAIL(k, ES_EMODEL, "output Y is missing");
  for (int i = 1; i < k->n_out; i++)
    if (k->out[i])
      return ES_KFAIL(k, ES_EMODEL, "%d outputs, expected 1", k->n_out);
  const es_tdesc *x = k->in[0];
  if (x->dtype != ES_DTYPE_FLOAT)
    return ES_KFAIL(k, ES_EMODEL, "X is %s, expected float32", es_dtype_name(x->dtype));
  if (x->rank < min_rank)
    return ES_KFAIL(k, ES_EMODEL, "X has rank %d, expected at least %d", x->rank, min_rank);
  return 0;
}

/* ==========================================================================
 * InstanceNormalization, GroupNormalization
 * ======================================================================== */

typedef struct gn_params {
  int64_t n, c, plane, groups; /* X as [n, groups, c / groups, plane] */
  int per_group;               /* scale and bias have one value per group */
  float eps;
} gn_params;

static int gn_infer(es_kinst *k) {
  int rc = norm_x(k, 2);
  if (rc < 0)
    return rc;
  if (k->n_in != 3)
    return ES_KFAIL(k, ES_EMODEL, "%d inputs, expected 3 (X, scale, B)", k->n_in);
  const es_tdesc *x = k->in[0];
  int64_t c = x->dims[1], groups = c, stash = 1;
  float eps;
  int group_op = k->node.op == ES_OP_GroupNormalization;
  int per_group = group_op && k->opset < 21;
  if ((rc = es__attr_float(k, "epsilon", 1e-5f, &eps)) < 0)
    return rc;
  if (!(eps >= 0) || isinf(eps))
    return ES_KFAIL(k, ES_EMODEL, "epsilon is %g, expected a finite value >= 0", (double)eps);
  if (group_op) {
    if (!es__kattr(k, "num_groups"))
      return ES_KFAIL(k, ES_EMODEL, "attribute num_groups is missing");
    if ((rc = es__attr_int(k, "num_groups", 0, &groups)) < 0 ||
        (rc = es__attr_int(k, "stash_type", 1, &stash)) < 0)
      return rc;
    if (groups < 1 || c % groups)
      return ES_KFAIL(k, ES_EMODEL, "num_groups is %lld: must be >= 1 and divide the %lld "
                      "channels", (long long)groups, (long long)c);
    if (stash != 1)
      return ES_KFAIL(k, ES_ENOTSUP, "stash_type %lld is not implemented (only 1, float32)",
                      (long long)stash);
  }
  const char *what = per_group ? "one per group before opset 21" : "one per channel";
  if ((rc = norm_vec(k, 1, "scale", per_group ? groups : c, what)) < 0 ||
      (rc = norm_vec(k, 2, "B", per_group ? groups : c, what)) < 0)
    return rc;
  gn_params *p = es__kinst_alloc(k, sizeof *p);
  if (!p)
    return ES_KFAIL(k, ES_ENOMEM, "out of memory for parameters");
  p->n = x->dims[0];
  p->c = c;
  p->groups = groups;
  p->plane = 1;
  for (int i = 2; i < x->rank; i++)
    p->plane *= x->dims[i];
  p->per_group = per_group;
  p->eps = eps;
  k->params = p;
  k->inplace = 0;
  return es__tdesc_set(k->out[0], ES_DTYPE_FLOAT, x->rank, x->dims);
}

static int gn_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  (void)scratch;
  const gn_params *p = k->params;
  const float *scale = in[1], *bias = in[2];
  int64_t cg = p->c / p->groups, len = cg * p->plane;
  /* x and y may be the same buffer: a block's statistics are taken before
   * any of it is written, and each element is read before it is written */
  const float *x = in[0];
  float *y = out[0];
  for (int64_t b = 0; b < p->n; b++)
    for (int64_t g = 0; g < p->groups; g++, x += len, y += len) {
      float mean = es__ew_sum_f32(x, len) / (float)len;
      float var = norm_sqdev(x, len, mean) / (float)len;
      float inv = 1.0f / sqrtf(var + p->eps);
      for (int64_t c = 0; c < cg; c++) {
        int64_t i = p->per_group ? g : g * cg + c;
        float a = inv * scale[i], t = bias[i];
        const float *xc = x + c * p->plane;
        float *yc = y + c * p->plane;
        for (int64_t j = 0; j < p->plane; j++)
          yc[j] = (xc[j] - mean) * a + t;
      }
    }
  return 0;
}

/* ==========================================================================
 * MeanVarianceNormalization
 * ======================================================================== */

typedef struct mvn_params {
  es_rgroups g;
} mvn_params;

static int mvn_infer(es_kinst *k) {
  int rc = norm_x(k, 0);
  if (rc < 0)
    return rc;
  if (k->n_in != 1)
    return ES_KFAIL(k, ES_EMODEL, "%d inputs, expected 1", k->n_in);
  const es_tdesc *x = k->in[0];
  const int64_t *axes;
  size_t n;
  static const int64_t def_axes[3] = {0, 2, 3};
  if ((rc = es__attr_ints(k, "axes", &axes, &n)) < 0)
    return rc;
  if (!axes) {
    axes = def_axes;
    n = 3;
  }
  int reduced[ES_MAX_RANK] = {0};
  for (size_t i = 0; i < n; i++) {
    int ax;
    if ((rc = es__axis_norm(k, axes[i], x->rank, &ax)) < 0)
      return rc;
    if (reduced[ax])
      return ES_KFAIL(k, ES_EMODEL, "axis %d is listed twice", ax);
    reduced[ax] = 1;
  }
  mvn_params *p = es__kinst_alloc(k, sizeof *p);
  if (!p)
    return ES_KFAIL(k, ES_ENOMEM, "out of memory for parameters");
  es__rgroups_make(x, reduced, &p->g);
  k->params = p;
  k->scratch_bytes = 2 * (size_t)p->g.out_count * sizeof(float);
  k->inplace = 0;
  return es__tdesc_set(k->out[0], ES_DTYPE_FLOAT, x->rank, x->dims);
}

enum { MVN_SUM, MVN_SQDEV, MVN_OUT };

/* One pass over x: sums into mean, squared deviations into var, or the
 * output from mean and d (1 / (std + eps), in var's place). */
static void mvn_pass(const es_rgroups *g, int what, const float *x, float *y, float *mean,
                     float *var) {
  int last = g->ng - 1;
  int64_t run = g->ext[last], idx[ES_MAX_RANK] = {0}, off = 0;
  int64_t runs = es__rgroups_runs(g);
  /* y is NULL on the first two passes: index from the run's start rather
   * than advancing the pointers (NULL + n is undefined). */
  for (int64_t st = 0, at = 0; st < runs; st++, at += run) {
    const float *xr = x + at;
    float *yr = what == MVN_OUT ? y + at : NULL;
    if (g->red[last]) {
      float m = mean[off];
      if (what == MVN_SUM)
        mean[off] += es__ew_sum_f32(xr, run);
      else if (what == MVN_SQDEV)
        var[off] += norm_sqdev(xr, run, m);
      else
        for (int64_t j = 0; j < run; j++)
          yr[j] = (xr[j] - m) * var[off];
    } else {
      float *restrict mo = mean + off, *restrict vo = var + off;
      if (what == MVN_SUM)
        for (int64_t j = 0; j < run; j++)
          mo[j] += xr[j];
      else if (what == MVN_SQDEV)
        for (int64_t j = 0; j < run; j++)
          vo[j] += (xr[j] - mo[j]) * (xr[j] - mo[j]);
      else
        for (int64_t j = 0; j < run; j++)
          yr[j] = (xr[j] - mo[j]) * vo[j];
    }
    es__walk_step(last, g->ext, idx, 1, &off, g->ostr);
  }
}

static int mvn_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  const mvn_params *p = k->params;
  int64_t n = p->g.out_count;
  float *mean = scratch, *var = mean + n;
  float inv = p->g.rcount > 0 ? 1.0f / (float)p->g.rcount : NAN;
  for (int64_t i = 0; i < n; i++)
    mean[i] = var[i] = 0.0f;
  mvn_pass(&p->g, MVN_SUM, in[0], NULL, mean, var);
  for (int64_t i = 0; i < n; i++)
    mean[i] *= inv;
  mvn_pass(&p->g, MVN_SQDEV, in[0], NULL, mean, var);
  for (int64_t i = 0; i < n; i++)
    var[i] = 1.0f / (sqrtf(var[i] * inv) + 1e-9f);
  mvn_pass(&p->g, MVN_OUT, in[0], out[0], mean, var);
  return 0;
}

/* ==========================================================================
 * LRN
 * ======================================================================== */

typedef struct lrn_params {
  int64_t n, c, plane;
  int64_t before, after; /* channels summed before and after each one */
  float alpha_n, beta, bias;
} lrn_params;

static int lrn_infer(es_kinst *k) {
  int rc = norm_x(k, 3);
  if (rc < 0)
    return rc;
  if (k->n_in != 1)
    return ES_KFAIL(k, ES_EMODEL, "%d inputs, expected 1", k->n_in);
  const es_tdesc *x = k->in[0];
  int64_t size;
  float alpha, beta, bias;
  if (!es__kattr(k, "size"))
    return ES_KFAIL(k, ES_EMODEL, "attribute size is missing");
  if ((rc = es__attr_int(k, "size", 1, &size)) < 0 ||
      (rc = es__attr_float(k, "alpha", 1e-4f, &alpha)) < 0 ||
      (rc = es__attr_float(k, "beta", 0.75f, &beta)) < 0 ||
      (rc = es__attr_float(k, "bias", 1.0f, &bias)) < 0)
    return rc;
  if (size < 1 || size > ((int64_t)1 << 20))
    return ES_KFAIL(k, ES_EMODEL, "size is %lld, expected 1 to 2^20", (long long)size);
  lrn_params *p = es__kinst_alloc(k, sizeof *p);
  if (!p)
    return ES_KFAIL(k, ES_ENOMEM, "out of memory for parameters");
  p->n = x->dims[0];
  p->c = x->dims[1];
  p->plane = 1;
  for (int i = 2; i < x->rank; i++)
    p->plane *= x->dims[i];
  p->before = (size - 1) / 2;
  p->after = size - 1 - p->before;
  p->alpha_n = alpha / (float)size;
  p->beta = beta;
  p->bias = bias;
  k->params = p;
  k->scratch_bytes = (size_t)p->plane * sizeof(float);
  return es__tdesc_set(k->out[0], ES_DTYPE_FLOAT, x->rank, x->dims);
}

static int lrn_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  const lrn_params *p = k->params;
  const int64_t plane = p->plane;
  float *restrict sq = scratch;
  for (int64_t b = 0; b < p->n; b++) {
    const float *x = (const float *)in[0] + b * p->c * plane;
    float *restrict y = (float *)out[0] + b * p->c * plane;
    for (int64_t c = 0; c < p->c; c++, y += plane) {
      int64_t c0 = c - p->before < 0 ? 0 : c - p->before;
      int64_t c1 = c + p->after >= p->c ? p->c - 1 : c + p->after;
      for (int64_t j = 0; j < plane; j++)
        sq[j] = 0.0f;
      for (int64_t cc = c0; cc <= c1; cc++) {
        const float *restrict xc = x + cc * plane;
        for (int64_t j = 0; j < plane; j++)
          sq[j] += xc[j] * xc[j];
      }
      const float *restrict xc = x + c * plane;
      if (p->beta == 0.75f) {
        for (int64_t j = 0; j < plane; j++) {
          float s = sqrtf(p->bias + p->alpha_n * sq[j]); /* base^0.5 */
          y[j] = xc[j] / (s * sqrtf(s));
        }
      } else {
        for (int64_t j = 0; j < plane; j++)
          y[j] = xc[j] * powf(p->bias + p->alpha_n * sq[j], -p->beta);
      }
    }
  }
  return 0;
}

/* ==========================================================================
 * LpNormalization
 * ======================================================================== */

typedef struct lpn_params {
  int64_t outer, n, inner;
  int p;
} lpn_params;

static int lpn_infer(es_kinst *k) {
  int rc = norm_x(k, 1);
  if (rc < 0)
    return rc;
  if (k->n_in != 1)
    return ES_KFAIL(k, ES_EMODEL, "%d inputs, expected 1", k->n_in);
  const es_tdesc *x = k->in[0];
  int64_t axis, pn;
  int ax;
  if ((rc = es__attr_int(k, "axis", -1, &axis)) < 0 || (rc = es__attr_int(k, "p", 2, &pn)) < 0 ||
      (rc = es__axis_norm(k, axis, x->rank, &ax)) < 0)
    return rc;
  if (pn != 1 && pn != 2)
    return ES_KFAIL(k, ES_EMODEL, "p is %lld, expected 1 or 2", (long long)pn);
  lpn_params *p = es__kinst_alloc(k, sizeof *p);
  if (!p)
    return ES_KFAIL(k, ES_ENOMEM, "out of memory for parameters");
  p->outer = p->inner = 1;
  p->n = x->dims[ax];
  for (int i = 0; i < x->rank; i++)
    if (i < ax)
      p->outer *= x->dims[i];
    else if (i > ax)
      p->inner *= x->dims[i];
  p->p = (int)pn;
  k->params = p;
  k->inplace = 0;
  if (p->inner > 1)
    k->scratch_bytes = (size_t)p->inner * sizeof(float);
  return es__tdesc_set(k->out[0], ES_DTYPE_FLOAT, x->rank, x->dims);
}

static int lpn_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  const lpn_params *p = k->params;
  int64_t n = p->n, inner = p->inner;
  const float *x = in[0];
  float *y = out[0];
  for (int64_t o = 0; o < p->outer; o++, x += n * inner, y += n * inner) {
    if (inner == 1) {
      float s = 0.0f;
      for (int64_t j = 0; j < n; j++)
        s += p->p == 1 ? fabsf(x[j]) : x[j] * x[j];
      float inv = 1.0f / (p->p == 1 ? s : sqrtf(s));
      for (int64_t j = 0; j < n; j++)
        y[j] = x[j] * inv;
      continue;
    }
    float *restrict s = scratch;
    for (int64_t i = 0; i < inner; i++)
      s[i] = 0.0f;
    for (int64_t j = 0; j < n; j++) {
      const float *restrict xr = x + j * inner;
      if (p->p == 1)
        for (int64_t i = 0; i < inner; i++)
          s[i] += fabsf(xr[i]);
      else
        for (int64_t i = 0; i < inner; i++)
          s[i] += xr[i] * xr[i];
    }
    for (int64_t i = 0; i < inner; i++)
      s[i] = 1.0f / (p->p == 1 ? s[i] : sqrtf(s[i]));
    for (int64_t j = 0; j < n; j++) {
      const float *xr = x + j * inner;
      float *yr = y + j * inner;
      for (int64_t i = 0; i < inner; i++)
        yr[i] = xr[i] * s[i];
    }
  }
  return 0;
}

/* ==========================================================================
 * Family
 * ======================================================================== */

static const es_kernel bn_kernel = {bn_infer, bn_run, NULL, 1};
static const es_kernel gn_kernel = {gn_infer, gn_run, NULL, 0};
static const es_kernel mvn_kernel = {mvn_infer, mvn_run, NULL, 0};
static const es_kernel lrn_kernel = {lrn_infer, lrn_run, NULL, 0};
static const es_kernel lpn_kernel = {lpn_infer, lpn_run, NULL, 0};

const es_kernel *es__kernels_norm(es_op op) {
  switch (op) {
  case ES_OP_BatchNormalization:
    return &bn_kernel;
  case ES_OP_InstanceNormalization:
  case ES_OP_GroupNormalization:
    return &gn_kernel;
  case ES_OP_MeanVarianceNormalization:
    return &mvn_kernel;
  case ES_OP_LRN:
    return &lrn_kernel;
  case ES_OP_LpNormalization:
    return &lpn_kernel;
  default:
    return NULL;
  }
}
