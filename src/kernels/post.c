/* Fused post-ops (post.h): the parser and the reference loops every kernel
 * that takes "_post" shares. oneDNN's form of the same list is built by
 * es__dnnl_posts (dnnl_glue.c). GELU uses ew_math.h's functions, so a
 * fused GELU gives the bits a Gelu node or a FusedElementwise GELU gives. */
#include "kernels/post.h"

#include "kernels/ew_math.h"

#include <math.h>

int es__posts_parse(es_kinst *k, es_posts *ps) {
  const int64_t *c;
  const float *f;
  size_t n, nf;
  ps->n = ps->has_res = 0;
  int rc = es__attr_ints(k, "_post", &c, &n);
  if (rc == 0)
    rc = es__attr_floats(k, "_post_f", &f, &nf);
  if (rc < 0)
    return rc;
  if (nf != 2 * n)
    return ES_KFAIL(k, ES_EMODEL, "_post_f has %zu values, expected %zu (two per _post code)",
                    nf, 2 * n);
  if (n > ES_POST_MAX)
    return ES_KFAIL(k, ES_ENOTSUP, "%zu fused post-ops, at most %d are supported", n,
                    ES_POST_MAX);
  for (size_t i = 0; i < n; i++) {
    es_post *q = &ps->op[i];
    if (c[i] < ES_POST_RELU || c[i] > ES_POST_LAST)
      return ES_KFAIL(k, ES_EMODEL, "_post[%zu] is %lld, not a post-op code (1..%d)", i,
                      (long long)c[i], ES_POST_LAST);
    q->code = (int)c[i];
    q->a = f[2 * i];
    q->b = f[2 * i + 1];
    if (q->a != q->a || q->b != q->b)
      return ES_KFAIL(k, ES_EMODEL, "_post_f for _post[%zu] is NaN", i);
    if (q->code == ES_POST_CLIP && q->a > q->b)
      q->a = q->b; /* min(max(x, lo), hi) is hi everywhere */
    if (q->code == ES_POST_ADD && ps->has_res)
      return ES_KFAIL(k, ES_EMODEL, "_post adds the residual twice");
    ps->has_res |= q->code == ES_POST_ADD;
  }
  ps->n = (int)n;
  return 0;
}

/* One op at a time over the whole output: each pass is contiguous, and the
 * output is small next to the work of the op before it. Not built per
 * vector width (ES_KCLONES): clang names an exported function's clone
 * dispatcher apart from the function, so other files could not link it. */
void es__posts_ref(const es_posts *ps, float *y, const float *res, size_t count) {
  for (int j = 0; j < ps->n; j++) {
    const es_post *q = &ps->op[j];
    float a = q->a, b = q->b;
    switch (q->code) {
    case ES_POST_RELU:
      for (size_t i = 0; i < count; i++)
        y[i] = y[i] > 0.0f ? y[i] : 0.0f;
      break;
    case ES_POST_CLIP:
      for (size_t i = 0; i < count; i++)
        y[i] = fminf(fmaxf(y[i], a), b);
      break;
    case ES_POST_HARDSIGMOID:
      for (size_t i = 0; i < count; i++)
        y[i] = fmaxf(0.0f, fminf(1.0f, a * y[i] + b));
      break;
    case ES_POST_HARDSWISH:
      for (size_t i = 0; i < count; i++)
        y[i] = y[i] * fmaxf(0.0f, fminf(1.0f, y[i] / 6.0f + 0.5f));
      break;
    case ES_POST_SIGMOID:
      for (size_t i = 0; i < count; i++)
        y[i] = 1.0f / (1.0f + expf(-y[i]));
      break;
    case ES_POST_SWISH:
      for (size_t i = 0; i < count; i++)
        y[i] = y[i] / (1.0f + expf(-y[i]));
      break;
    case ES_POST_ADD:
      for (size_t i = 0; i < count; i++)
        y[i] += res[i];
      break;
    case ES_POST_GELU:
      for (size_t i = 0; i < count; i++)
        y[i] = es__ew_gelu(y[i]);
      break;
    case ES_POST_GELU_TANH:
      for (size_t i = 0; i < count; i++)
        y[i] = es__ew_gelu_tanh(y[i]);
      break;
    }
  }
}
