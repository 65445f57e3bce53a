/* BatchNormalization, inference form (float32).
 *
 * y = (x - mean) / sqrt(var + epsilon) * scale + B per channel folds into
 * y = x * a[c] + b[c] with a = scale / sqrt(var + epsilon) and
 * b = B - mean * a. When the four parameter tensors are known at plan time
 * (the usual case: they are weights) infer computes a and b once, in double,
 * into plan memory; otherwise run computes them into scratch first. Either
 * way the hot loop is one multiply-add over each contiguous N x C plane, and
 * Y may reuse X's buffer.
 *
 * Training (training_mode = 1, or the running/saved statistics outputs
 * requested) is ENOTSUP, as is spatial = 0 (opsets 7 and 8: per-element
 * parameters).
 *
 * Layouts: a BatchNormalization that was not folded into a convolution
 * usually sits between two of them, so an NHWC X gives an NHWC Y: per
 * pixel, one multiply-add over the C contiguous channels with a and b read
 * along the last dim. */
#include "kernels/kernel.h"

#include <math.h>

/* ==========================================================================
 * Plan
 * ======================================================================== */

typedef struct bn_params {
  int64_t n, c, plane; /* X viewed as [n, c, plane], or [n, plane, c] when nhwc */
  int nhwc;
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
  int64_t training = 0, spatial = 1;
  float eps;
  int rc;
  if ((rc = es__attr_float(k, "epsilon", 1e-5f, &eps)) < 0 ||
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

/* ==========================================================================
 * Run
 * ======================================================================== */

static int bn_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  const bn_params *p = k->params;
  const float *a = p->a, *b = p->b;
  if (!a) {
    float *ab = scratch;
    bn_fold(in[1], in[2], in[3], in[4], p->eps, p->c, ab, ab + p->c);
    a = ab;
    b = ab + p->c;
  }
  /* x and y may be the same buffer: each element is read, then written */
  const float *x = in[0];
  float *y = out[0];
  if (p->nhwc) {
    int64_t pixels = p->n * p->plane, nc = p->c;
    for (int64_t i = 0; i < pixels; i++, x += nc, y += nc)
      for (int64_t c = 0; c < nc; c++)
        y[c] = x[c] * a[c] + b[c];
    return 0;
  }
  for (int64_t n = 0; n < p->n; n++)
    for (int64_t c = 0; c < p->c; c++, x += p->plane, y += p->plane) {
      float ac = a[c], bc = b[c];
      for (int64_t i = 0; i < p->plane; i++)
        y[i] = x[i] * ac + bc;
    }
  return 0;
}

/* ==========================================================================
 * Family
 * ======================================================================== */

static const es_kernel bn_kernel = {bn_infer, bn_run, NULL, 1};

const es_kernel *es__kernels_norm(es_op op) {
  return op == ES_OP_BatchNormalization ? &bn_kernel : NULL;
}
