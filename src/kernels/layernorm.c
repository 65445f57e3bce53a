/* LayerNorm (internal) and LayerNormalization (ONNX, opset 17), float32.
 *
 * LayerNorm is what the fusion pass (src/engine/fuse_layernorm.c) makes of
 * the decomposed form ONNX exporters write before opset 17,
 *
 *   y = (x - mean(x)) / sqrt(var(x) + epsilon) * gamma + beta
 *
 * over the last axis (attribute axis, -1; the only one the pass creates).
 * Inputs x, gamma, beta; gamma and beta are [D] for a last dimension of D,
 * or [1] (broadcast), as the decomposed form accepted them.
 *
 * LayerNormalization is the same per row, where a row is every dimension
 * from axis on (any axis, default -1), flattened: inputs X, Scale and the
 * optional B, whose shapes are the normalised dimensions (leading 1s
 * allowed) or one element; optional outputs Mean and InvStdDev (X's shape
 * with the normalised dimensions 1). stash_type 1 (float32 statistics) is
 * the only one implemented.
 *
 * Per row: the mean, then the variance as the mean of squared deviations
 * (the decomposed form's own two steps, so results agree to rounding and
 * large means cancel no precision away), then the output; three passes over
 * a row that stays in cache. The sums keep eight partial accumulators so
 * the compiler can keep them in vector registers (a single running sum is a
 * dependency chain it may not reorder).
 *
 * Layout: plain only (layout_aware 0); the planner converts an NHWC input,
 * which does not happen in practice (LayerNorm follows MatMul or Reshape).
 * Y may share X's buffer: each element is read before it is written. */
#include "kernels/kernel.h"

#include <math.h>

#include "kernels/ew_math.h"

typedef struct ln_params {
  int64_t rows, d;
  int64_t gd, bd; /* gamma's and beta's lengths: d or 1 (bd 0: no beta) */
  float eps;
  int mean_out, inv_out; /* LayerNormalization's optional outputs are wanted */
} ln_params;

static int ln_vec(es_kinst *k, int i, const char *name, int64_t d, int64_t *len) {
  const es_tdesc *t = k->in[i];
  if (!t)
    return ES_KFAIL(k, ES_EMODEL, "input %s is missing", name);
  if (t->dtype != ES_DTYPE_FLOAT || t->rank != 1 || (t->dims[0] != d && t->dims[0] != 1))
    return ES_KFAIL(k, ES_EMODEL, "%s must be float32 [%lld] or [1] (the last axis)", name,
                    (long long)d);
  *len = t->dims[0];
  return 0;
}

static int ln_infer(es_kinst *k) {
  if (k->n_in != 3 || k->n_out != 1 || !k->in[0] || !k->out[0])
    return ES_KFAIL(k, ES_EMODEL, "needs inputs X, gamma, beta and one output");
  const es_tdesc *x = k->in[0];
  if (x->dtype != ES_DTYPE_FLOAT)
    return ES_KFAIL(k, ES_EMODEL, "X is %s, expected float32", es_dtype_name(x->dtype));
  if (x->rank < 1)
    return ES_KFAIL(k, ES_EMODEL, "X is a scalar: no axis to normalise");
  ln_params *p = es__kinst_alloc(k, sizeof *p);
  if (!p)
    return ES_KFAIL(k, ES_ENOMEM, "out of memory for parameters");
  k->params = p;
  int64_t axis;
  int ax, rc;
  if ((rc = es__attr_int(k, "axis", -1, &axis)) < 0 ||
      (rc = es__attr_float(k, "epsilon", 1e-5f, &p->eps)) < 0 ||
      (rc = es__axis_norm(k, axis, x->rank, &ax)) < 0)
    return rc;
  if (ax != x->rank - 1)
    return ES_KFAIL(k, ES_ENOTSUP, "only the last axis is normalised (axis is %lld)",
                    (long long)axis);
  p->d = x->dims[x->rank - 1];
  p->rows = p->d ? (int64_t)(x->count / (size_t)p->d) : 0;
  if ((rc = ln_vec(k, 1, "gamma", p->d, &p->gd)) < 0 ||
      (rc = ln_vec(k, 2, "beta", p->d, &p->bd)) < 0)
    return rc;
  if ((rc = es__tdesc_set(k->out[0], ES_DTYPE_FLOAT, x->rank, x->dims)) < 0)
    return rc;
  k->inplace = 0;
  return 0;
}

/* LayerNormalization's Scale or B (input i) must broadcast to the
 * normalised shape (dims from axis on); implemented: that shape itself
 * (leading 1s allowed) or a single element. *len is d or 1. */
static int lnorm_vec(es_kinst *k, int i, const char *name, int axis, int64_t d, int64_t *len) {
  const es_tdesc *x = k->in[0], *t = k->in[i];
  if (t->dtype != ES_DTYPE_FLOAT)
    return ES_KFAIL(k, ES_EMODEL, "%s is %s, expected float32", name, es_dtype_name(t->dtype));
  *len = (int64_t)t->count;
  int nd = x->rank - axis, bcast = 1;
  for (int j = 0; j < t->rank; j++) {
    int xa = x->rank - t->rank + j; /* right-aligned */
    int64_t want = xa >= axis ? x->dims[xa] : 1;
    bcast &= t->dims[j] == want || t->dims[j] == 1;
  }
  int same = t->count == (size_t)d; /* broadcasting, so every normalised dim is covered */
  if (!bcast)
    return ES_KFAIL(k, ES_EMODEL, "%s (%zu elements, rank %d) does not broadcast to the "
                    "normalised shape (the last %d dims of X)", name, t->count, t->rank, nd);
  if (!same && t->count != 1)
    return ES_KFAIL(k, ES_ENOTSUP, "%s broadcasts along some normalised dims only: supported "
                    "are the normalised shape (the last %d dims of X, %lld elements) or one "
                    "element", name, nd, (long long)d);
  return 0;
}

static int lnorm_infer(es_kinst *k) {
  if (k->n_in < 2 || k->n_in > 3 || !k->in[0] || !k->in[1])
    return ES_KFAIL(k, ES_EMODEL, "needs inputs X, Scale and optionally B");
  if (k->n_out < 1 || k->n_out > 3 || !k->out[0])
    return ES_KFAIL(k, ES_EMODEL, "needs output Y and optionally Mean, InvStdDev");
  const es_tdesc *x = k->in[0];
  if (x->dtype != ES_DTYPE_FLOAT)
    return ES_KFAIL(k, ES_EMODEL, "X is %s, expected float32", es_dtype_name(x->dtype));
  if (x->rank < 1)
    return ES_KFAIL(k, ES_EMODEL, "X is a scalar: no axis to normalise");
  ln_params *p = es__kinst_alloc(k, sizeof *p);
  if (!p)
    return ES_KFAIL(k, ES_ENOMEM, "out of memory for parameters");
  k->params = p;
  int64_t axis, stash;
  int ax, rc;
  if ((rc = es__attr_int(k, "axis", -1, &axis)) < 0 ||
      (rc = es__attr_float(k, "epsilon", 1e-5f, &p->eps)) < 0 ||
      (rc = es__attr_int(k, "stash_type", 1, &stash)) < 0 ||
      (rc = es__axis_norm(k, axis, x->rank, &ax)) < 0)
    return rc;
  if (stash != 1)
    return ES_KFAIL(k, ES_ENOTSUP, "stash_type %lld is not implemented (only 1, float32)",
                    (long long)stash);
  p->d = p->rows = 1;
  int64_t sdims[ES_MAX_RANK];
  for (int i = 0; i < x->rank; i++) {
    if (i >= ax)
      p->d *= x->dims[i];
    else
      p->rows *= x->dims[i];
    sdims[i] = i >= ax ? 1 : x->dims[i];
  }
  if ((rc = lnorm_vec(k, 1, "Scale", ax, p->d, &p->gd)) < 0)
    return rc;
  p->bd = 0;
  if (k->n_in > 2 && k->in[2] && (rc = lnorm_vec(k, 2, "B", ax, p->d, &p->bd)) < 0)
    return rc;
  if ((rc = es__tdesc_set(k->out[0], ES_DTYPE_FLOAT, x->rank, x->dims)) < 0)
    return rc;
  for (int i = 1; i < k->n_out; i++)
    if (k->out[i] && (rc = es__tdesc_set(k->out[i], ES_DTYPE_FLOAT, x->rank, sdims)) < 0)
      return rc;
  p->mean_out = k->n_out > 1 && k->out[1];
  p->inv_out = k->n_out > 2 && k->out[2];
  k->inplace = 0;
  return 0;
}

/* Sum of v[0..n): the tail first, then the eight partial sums; another
 * order would change LayerNorm's results in the last bit. */
static float ln_sum(const float *restrict v, int64_t n) {
  int64_t n8 = n & ~(int64_t)7;
  return es__ew_sum_f32(v + n8, n - n8) + es__ew_sum_f32(v, n8);
}

/* Sum of (v[i] - m)^2. */
static float ln_sqdev(const float *restrict v, int64_t n, float m) {
  float acc[8] = {0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; l++) {
      float t = v[i + l] - m;
      acc[l] += t * t;
    }
  float s = 0;
  for (; i < n; i++) {
    float t = v[i] - m;
    s += t * t;
  }
  return s + es__ew_hsum8(acc);
}

static int ln_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  (void)scratch;
  const ln_params *p = k->params;
  const float *gamma = in[1], *beta = p->bd ? in[2] : NULL;
  float *mean_out = p->mean_out ? out[1] : NULL, *inv_out = p->inv_out ? out[2] : NULL;
  const int64_t d = p->d;
  const float g0 = gamma[0], b0 = beta ? beta[0] : 0.0f;
  for (int64_t r = 0; r < p->rows; r++) {
    /* x and y may be the same buffer (inplace), so no restrict on them */
    const float *x = (const float *)in[0] + r * d;
    float *y = (float *)out[0] + r * d;
    float mean = ln_sum(x, d) / (float)d;
    float var = ln_sqdev(x, d, mean) / (float)d;
    float inv = 1.0f / sqrtf(var + p->eps);
    if (mean_out)
      mean_out[r] = mean;
    if (inv_out)
      inv_out[r] = inv;
    if (p->gd == d && p->bd == d)
      for (int64_t i = 0; i < d; i++)
        y[i] = (x[i] - mean) * inv * gamma[i] + beta[i];
    else
      for (int64_t i = 0; i < d; i++)
        y[i] = (x[i] - mean) * inv * (p->gd == d ? gamma[i] : g0) + (p->bd == d ? beta[i] : b0);
  }
  return 0;
}

static const es_kernel ln_kernel = {ln_infer, ln_run, NULL, 0};
static const es_kernel lnorm_kernel = {lnorm_infer, ln_run, NULL, 0};

const es_kernel *es__kernels_layernorm(es_op op) {
  return op == ES_OP_LayerNorm ? &ln_kernel : op == ES_OP_LayerNormalization ? &lnorm_kernel : NULL;
}
