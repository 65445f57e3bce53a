/* Reduction axes as groups: shared by the reductions (reduce.c) and the
 * normalisations that reduce over an axes set and broadcast back
 * (MeanVarianceNormalization in norm.c). Internal to src/kernels.
 *
 * Size-1 axes are dropped and runs of adjacent axes that are all reduced or
 * all kept are merged, so any axes set becomes at most ES_MAX_RANK
 * alternating groups (NCHW over H, W is [kept N*C, reduced H*W]). A kernel
 * then reads the input once, in order, one contiguous run of the last group
 * at a time: a reduced last group folds its run into one output element, a
 * kept one combines its run with consecutive output elements. es__walk_step
 * over the other groups, with each kept group's output stride (0 for a
 * reduced one), keeps the offset of the output the run belongs to:
 *
 *   es_rgroups g;
 *   es__rgroups_make(x, reduced, &g);
 *   int64_t idx[ES_MAX_RANK] = {0}, off = 0, run = g.ext[g.ng - 1];
 *   for (int64_t st = 0; st < es__rgroups_runs(&g); st++, x += run) {
 *     ... run elements of x against output offset off (and off + j) ...
 *     es__walk_step(g.ng - 1, g.ext, idx, 1, &off, g.ostr);
 *   }
 */
#ifndef ES_KERNELS_REDUCE_H
#define ES_KERNELS_REDUCE_H

#include "kernels/kernel.h"
#include "kernels/walk.h"

typedef struct es_rgroups {
  int ng;                    /* groups of merged axes (>= 1) */
  int64_t ext[ES_MAX_RANK];  /* extent of each group */
  int red[ES_MAX_RANK];      /* 1 if the group is reduced */
  int64_t ostr[ES_MAX_RANK]; /* output stride of a kept group, 0 if reduced */
  int64_t in_count;          /* elements of the input */
  int64_t out_count;         /* elements of the output (the kept extents' product) */
  int64_t rcount;            /* elements folded into each output (0 for an empty set) */
} es_rgroups;

/* reduced[i] is 1 for each reduced axis of x (logical dims, plain). */
static inline void es__rgroups_make(const es_tdesc *x, const int *reduced, es_rgroups *g) {
  g->ng = 0;
  g->rcount = 1;
  g->out_count = 1;
  for (int i = 0; i < x->rank; i++) {
    if (reduced[i])
      g->rcount *= x->dims[i];
    else
      g->out_count *= x->dims[i];
    if (x->dims[i] == 1)
      continue; /* a size-1 axis is both kept and reduced: skip it */
    if (g->ng > 0 && g->red[g->ng - 1] == reduced[i]) {
      g->ext[g->ng - 1] *= x->dims[i];
    } else {
      g->ext[g->ng] = x->dims[i];
      g->red[g->ng] = reduced[i];
      g->ng++;
    }
  }
  if (g->ng == 0) { /* every axis has size 1: one element */
    g->ext[0] = 1;
    g->red[0] = 0;
    g->ng = 1;
  }
  int64_t s = 1;
  for (int i = g->ng - 1; i >= 0; i--) {
    g->ostr[i] = g->red[i] ? 0 : s;
    if (!g->red[i])
      s *= g->ext[i];
  }
  g->in_count = (int64_t)x->count;
}

/* Runs of the last group in the input (0 for an empty input). */
static inline int64_t es__rgroups_runs(const es_rgroups *g) {
  int64_t run = g->ext[g->ng - 1];
  return run > 0 ? g->in_count / run : 0;
}

#endif
