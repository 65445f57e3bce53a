/* The stride walk (an odometer) shared by the kernels that move through a
 * tensor one row at a time: broadcasting binary ops, fused elementwise
 * chains, ReduceMean, the strided copy behind Transpose and Slice, and Pad.
 *
 * The caller handles the innermost run itself (a vector loop, a memcpy, a
 * tile); the walk advances a multi-dimensional index over the dims outside
 * it, last dim fastest, and moves one element offset per operand by that
 * operand's stride along the dim that changed. Keeping a running offset,
 * rather than recomputing sum(idx[d] * stride[d]) for every row, costs two
 * additions per operand per row in the common case.
 *
 * Static inline so each loop gets its own copy: with a constant operand
 * count (2 for a binary op) the compiler unrolls the offset updates. */
#ifndef ES_KERNELS_WALK_H
#define ES_KERNELS_WALK_H

#include <stddef.h>
#include <stdint.h>

/* Moves idx (over dims[0..rank)) to the next position and each of the n
 * offsets off[j] with it; st holds the strides by dim, then operand:
 * st[d * n + j] is operand j's stride along dim d (0 where it broadcasts).
 * A dim of extent 1 is stepped over, so a caller can hide a dim it covers
 * itself by walking it as 1. Returns the dim that advanced, or -1 after the
 * last position, with idx and the offsets back at zero. */
static inline int es__walk_step(int rank, const int64_t *restrict dims, int64_t *restrict idx,
                                int n, int64_t *restrict off, const int64_t *restrict st) {
  for (int d = rank - 1; d >= 0; d--) {
    for (int j = 0; j < n; j++)
      off[j] += st[(size_t)d * (size_t)n + (size_t)j];
    if (++idx[d] < dims[d])
      return d;
    for (int j = 0; j < n; j++)
      off[j] -= st[(size_t)d * (size_t)n + (size_t)j] * dims[d];
    idx[d] = 0;
  }
  return -1;
}

#endif
