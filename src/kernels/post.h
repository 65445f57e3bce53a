/* Fused post-ops: the activations and residual Add that the fusion pass
 * (src/engine/fuse_conv.c) moves into a Conv, ConvTranspose or MatMul node
 * as the attributes "_post" (codes, kernels/fused.h) and "_post_f" (two
 * parameters per code). One parser, one reference loop and one builder of
 * oneDNN's attribute (dnnl_glue.h) serve every kernel that takes them, so
 * a post-op means the same in each.
 *
 * Thread-safety: es__posts_parse runs at infer time on the plan's kinst;
 * es__posts_ref only reads the list. */
#ifndef ES_KERNELS_POST_H
#define ES_KERNELS_POST_H

#include "kernels/fused.h"
#include "kernels/kernel.h"

#include <stddef.h>

typedef struct es_post {
  int code;  /* ES_POST_* */
  float a, b;
} es_post;

typedef struct es_posts {
  int n;       /* post-ops, applied in order after the bias */
  int has_res; /* one of them adds a runtime tensor of the output's shape */
  es_post op[ES_POST_MAX];
} es_posts;

/* Reads k's "_post" and "_post_f" (both absent: none) into *ps. Unknown
 * codes, a wrong number of floats, NaN parameters and a second residual Add
 * are model errors (ES_EMODEL, through ES_KFAIL). */
int es__posts_parse(es_kinst *k, es_posts *ps);

/* Applies the post-ops to y[0..count) in place, one op at a time; res is
 * the residual (count floats) when ps->has_res. */
void es__posts_ref(const es_posts *ps, float *y, const float *res, size_t count);

#endif
