/* The shape family: operators that move bytes without arithmetic.
 *
 * Shape, Size, Reshape, Flatten, Squeeze, Unsqueeze, Concat, Slice, Split,
 * Transpose, Expand, Tile, Pad, DepthToSpace, SpaceToDepth, Trilu,
 * ReverseSequence, Compress, and the generators ConstantOfShape, Range,
 * EyeLike and OneHot. Apart from Range and OneHot's indices none of them
 * looks at element values, so every kernel works on raw elements of 1, 4
 * or 8 bytes and serves every dtype.
 *
 * Everything that depends on shapes or on plan-time values (Reshape's
 * target, Slice's starts, Pad's pads...) is resolved in infer() into plain
 * integers in plan memory; run() only walks those. Ops whose output shape
 * depends on values (Range's bounds, OneHot's depth) need those values
 * while planning and refuse with ES_ENOTSUP otherwise: a plan sizes every
 * buffer before it runs. Compress is the exception: every index kept
 * bounds its output, and run sets the actual shape (kernel.h,
 * "Data-dependent shapes"). Values that only steer the
 * copy (Trilu's k, ReverseSequence's lengths) are read in run(), and
 * checked there. Ops whose output is a view of the input bytes (Reshape,
 * Flatten, Squeeze, Unsqueeze, and a Transpose, Slice or Expand that turns
 * out to keep the leading bytes in order) copy with one memcpy and allow
 * the planner to alias the output with the input, making them free.
 *
 * The data movers:
 *  - Concat and Split are block copies: for each index of the dimensions
 *    before the axis, one contiguous block per input (output).
 *  - Slice, Transpose, Expand, DepthToSpace and SpaceToDepth are one
 *    strided gather (copy_plan): the output is walked in order while the
 *    source index advances by per-dimension strides (negative for reversed
 *    slices, 0 for broadcast dims; the space/depth moves walk six dims).
 *    Planning drops unit dims and merges dims that are contiguous in both
 *    source and destination, so a transpose that keeps the last dim
 *    becomes row memcpys, and NHWC<->NCHW becomes a 2-D transpose done in
 *    cache-sized tiles.
 *  - Pad writes each output row once: fill, copy of the interior, fill (or
 *    for edge/reflect/wrap, elements mapped back into the input).
 *  - Tile writes the input once where the first tile goes, then, from the
 *    last dim out, copies each filled block after itself (memcpys).
 *
 * Layouts. Concat, Split and Transpose are layout-aware, so activations in
 * NHWC between convolutions never need converting around them:
 *  - Concat and Split work on physical dims (es__layout_axis): a channel
 *    concat of NHWC tensors interleaves one run of channels per input for
 *    every pixel. Split outputs keep the input's layout. Concat's output is
 *    NHWC when any input is; a plain input that would have to move is
 *    requested in NHWC (ES_KRELAYOUT), while a rank-4 plain tensor with one
 *    channel or one pixel is already the same bytes and joins as it is.
 *  - Transpose gathers on physical dims and picks the output layout that
 *    makes it an identity when one does. Models exported from NHWC
 *    frameworks start with Transpose(0,3,1,2) of a plain NHWC input, which
 *    becomes an NHWC output with the input's bytes, and end with
 *    Transpose(0,2,3,1) of convolution outputs, which read as a plain
 *    output with the same bytes: both cost nothing (the planner aliases).
 */
#include "kernels/kernel.h"
#include "kernels/walk.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* ==========================================================================
 * Input checks and static values
 * ======================================================================== */

/* A 1-D int32/int64 input whose values are needed while planning. */
static int static_vec(es_kinst *k, int i, const char *what, const void **data, size_t *n) {
  const es_tdesc *t = k->in[i];
  if (!k->in_static || !k->in_static[i]) {
    k->data_needed = 1;
    return ES_KFAIL(k, ES_ENOTSUP, "%s (input %d) must be known when planning", what, i);
  }
  if (t->dtype != ES_DTYPE_INT64 && t->dtype != ES_DTYPE_INT32)
    return ES_KFAIL(k, ES_EMODEL, "%s (input %d) is %s, expected int64", what, i,
                    es_dtype_name(t->dtype));
  if (t->rank > 1)
    return ES_KFAIL(k, ES_EMODEL, "%s (input %d) has rank %d, expected 1", what, i, t->rank);
  *data = k->in_static[i];
  *n = t->count;
  return 0;
}

/* static_vec into a bounded buffer; too_long is the error for more than max
 * values (ES_ENOTSUP when the count is a rank beyond ES_MAX_RANK). */
static int static_ints(es_kinst *k, int i, const char *what, size_t max, int too_long,
                       int64_t *v, size_t *n) {
  const void *data;
  int rc = static_vec(k, i, what, &data, n);
  if (rc < 0)
    return rc;
  if (*n > max)
    return ES_KFAIL(k, too_long, "%s (input %d) has %zu values, at most %zu are supported", what,
                    i, *n, max);
  for (size_t j = 0; j < *n; j++)
    v[j] = es__static_i64(k->in[i], data, j);
  return 0;
}

/* An attribute list of ints into a bounded buffer; *present = 0 if absent. */
static int attr_ints_copy(es_kinst *k, const char *name, size_t max, int64_t *v, size_t *n,
                          bool *present) {
  const int64_t *a;
  int rc = es__attr_ints(k, name, &a, n);
  if (rc < 0)
    return rc;
  *present = es__kattr(k, name) != NULL;
  if (*n > max)
    return ES_KFAIL(k, ES_EMODEL, "attribute '%s' has %zu values, expected at most %zu", name, *n,
                    max);
  for (size_t j = 0; j < *n; j++)
    v[j] = a[j];
  return 0;
}

/* Sets an output's shape, naming the node when the shape is invalid. */
static int out_set(es_kinst *k, int o, es_dtype dt, int rank, const int64_t *dims) {
  int rc = es__tdesc_set(k->out[o], dt, rank, dims);
  if (rc < 0)
    return ES_KFAIL(k, rc, "output %d: %s", o, es_last_error_detail());
  return 0;
}

/* Normalised, duplicate-free axes; 'seen' marks them. */
static int axes_norm(es_kinst *k, const int64_t *axes, size_t n, int rank, const char *what,
                     int *out, bool *seen) {
  for (int i = 0; i < ES_MAX_RANK; i++)
    seen[i] = false;
  for (size_t j = 0; j < n; j++) {
    if (axes[j] < -(int64_t)rank || axes[j] >= rank)
      return ES_KFAIL(k, ES_EMODEL, "%s[%zu] = %lld is outside [-%d, %d)", what, j,
                      (long long)axes[j], rank, rank);
    int a = (int)(axes[j] < 0 ? axes[j] + rank : axes[j]);
    if (seen[a])
      return ES_KFAIL(k, ES_EMODEL, "%s repeats axis %d", what, a);
    seen[a] = true;
    out[j] = a;
  }
  return 0;
}

/* ==========================================================================
 * Element moves
 * ======================================================================== */

/* n elements of esz bytes from src (stride ss elements) to dst (stride ds).
 * Inputs are only 4-byte aligned, so 8-byte elements go through memcpy,
 * which compiles to plain moves. */
static inline void elems_copy(char *restrict dst, const char *restrict src, int64_t n, int64_t ss,
                              int64_t ds, size_t esz) {
  if (ss == 1 && ds == 1) {
    memcpy(dst, src, (size_t)n * esz);
    return;
  }
  switch (esz) {
  case 4: {
    uint32_t *restrict d = (uint32_t *)(void *)dst;
    const uint32_t *restrict s = (const uint32_t *)(const void *)src;
    if (ds == 1)
      for (int64_t j = 0; j < n; j++)
        d[j] = s[j * ss];
    else
      for (int64_t j = 0; j < n; j++)
        d[j * ds] = s[j * ss];
    break;
  }
  case 1: {
    uint8_t *restrict d = (uint8_t *)dst;
    const uint8_t *restrict s = (const uint8_t *)src;
    for (int64_t j = 0; j < n; j++)
      d[j * ds] = s[j * ss];
    break;
  }
  case 8:
    for (int64_t j = 0; j < n; j++)
      memcpy(dst + j * ds * 8, src + j * ss * 8, 8);
    break;
  default:
    for (int64_t j = 0; j < n; j++)
      memcpy(dst + j * ds * (int64_t)esz, src + j * ss * (int64_t)esz, esz);
    break;
  }
}

/* n copies of the element at val into dst (64-byte aligned outputs, so typed
 * stores are aligned for every element size). */
static void elems_fill(char *restrict dst, const unsigned char *val, int64_t n, size_t esz) {
  switch (esz) {
  case 1:
    memset(dst, val[0], (size_t)n);
    break;
  case 4: {
    uint32_t v, *restrict d = (uint32_t *)(void *)dst;
    memcpy(&v, val, 4);
    if (v == 0) {
      memset(dst, 0, (size_t)n * 4);
      break;
    }
    for (int64_t j = 0; j < n; j++)
      d[j] = v;
    break;
  }
  case 8: {
    uint64_t v, *restrict d = (uint64_t *)(void *)dst;
    memcpy(&v, val, 8);
    if (v == 0) {
      memset(dst, 0, (size_t)n * 8);
      break;
    }
    for (int64_t j = 0; j < n; j++)
      d[j] = v;
    break;
  }
  default:
    for (int64_t j = 0; j < n; j++)
      memcpy(dst + j * (int64_t)esz, val, esz);
    break;
  }
}

/* One element of dtype dt holding x (Pad's float 'value' attribute). */
static void value_from_float(es_dtype dt, float x, unsigned char *val) {
  memset(val, 0, 8);
  switch (dt) {
  case ES_DTYPE_FLOAT:
    memcpy(val, &x, 4);
    break;
  case ES_DTYPE_INT64: {
    int64_t v = (int64_t)x;
    memcpy(val, &v, 8);
    break;
  }
  case ES_DTYPE_INT32: {
    int32_t v = (int32_t)x;
    memcpy(val, &v, 4);
    break;
  }
  case ES_DTYPE_INT8:
    val[0] = (unsigned char)(int8_t)x;
    break;
  case ES_DTYPE_BOOL:
    val[0] = x != 0.0f;
    break;
  default:
    val[0] = (unsigned char)x;
    break;
  }
}

/* One run of 16 * q16 + 4 * q4 bytes (q16 <= 16, q4 <= 3) as straight-line
 * fixed-size copies, which compile to vector moves: written as a loop, GCC
 * and clang turn it back into a memmove call, which for the few channels
 * per pixel of an NHWC concat costs more than the copy. */
#define RUN_C16(i) memcpy(d + 16 * (i), s + 16 * (i), 16)
static inline void run_copy(char *restrict d, const char *restrict s, size_t q16, size_t q4) {
  switch (q16) {
  case 16: RUN_C16(15); __attribute__((fallthrough));
  case 15: RUN_C16(14); __attribute__((fallthrough));
  case 14: RUN_C16(13); __attribute__((fallthrough));
  case 13: RUN_C16(12); __attribute__((fallthrough));
  case 12: RUN_C16(11); __attribute__((fallthrough));
  case 11: RUN_C16(10); __attribute__((fallthrough));
  case 10: RUN_C16(9); __attribute__((fallthrough));
  case 9: RUN_C16(8); __attribute__((fallthrough));
  case 8: RUN_C16(7); __attribute__((fallthrough));
  case 7: RUN_C16(6); __attribute__((fallthrough));
  case 6: RUN_C16(5); __attribute__((fallthrough));
  case 5: RUN_C16(4); __attribute__((fallthrough));
  case 4: RUN_C16(3); __attribute__((fallthrough));
  case 3: RUN_C16(2); __attribute__((fallthrough));
  case 2: RUN_C16(1); __attribute__((fallthrough));
  case 1: RUN_C16(0); __attribute__((fallthrough));
  default: break;
  }
  d += 16 * q16;
  s += 16 * q16;
  switch (q4) {
  case 3: memcpy(d + 8, s + 8, 4); __attribute__((fallthrough));
  case 2: memcpy(d + 4, s + 4, 4); __attribute__((fallthrough));
  case 1: memcpy(d, s, 4); __attribute__((fallthrough));
  default: break;
  }
}
#undef RUN_C16

/* rows copies of n bytes, from src every ss bytes to dst every ds: the
 * block moves of Concat and Split (short runs in NHWC, one per pixel). */
static void rows_copy(char *restrict dst, size_t ds, const char *restrict src, size_t ss,
                      size_t rows, size_t n) {
  if (n > 256 || n % 4) {
    for (size_t r = 0; r < rows; r++)
      memcpy(dst + r * ds, src + r * ss, n);
    return;
  }
  size_t q16 = n / 16, q4 = n % 16 / 4;
  for (size_t r = 0; r < rows; r++, dst += ds, src += ss)
    run_copy(dst, src, q16, q4);
}

/* ==========================================================================
 * Strided gather (Slice, Transpose)
 * ======================================================================== */

/* Tile edge for the 2-D transpose path: a 32x32 tile of 4-byte elements
 * reads 4 KB and writes 4 KB, well inside L1 (32 measured best among 8-64
 * on NCHW<->NHWC of 64 channels at 80x80). */
#define COPY_TILE 32

typedef struct copy_plan {
  int rank;                /* merged dims; -1 when there is nothing to copy */
  int tile;                /* dim with unit source stride transposed against the last in
                              tiles, or -1 */
  bool identity;           /* the output is the source's leading bytes in order, so it
                              may share the source's buffer */
  size_t esz;
  int64_t n[ES_MAX_RANK];
  int64_t ss[ES_MAX_RANK]; /* source strides, elements; negative for reversed slices */
  int64_t ds[ES_MAX_RANK]; /* destination strides, elements */
  int64_t soff;            /* source element of the first element written */
  int64_t wn[ES_MAX_RANK]; /* the walk outside a row or tile: n with the tile dim as 1 */
  int64_t wst[2 * ES_MAX_RANK]; /* its strides: source 2d, destination 2d + 1 */
} copy_plan;

/* Plans out[i0..] = src[soff + sum i_d * ss[d]] over dims n, written to a
 * contiguous destination. */
static void copy_plan_init(copy_plan *p, size_t esz, int rank, const int64_t *n,
                           const int64_t *ss, int64_t soff) {
  int64_t ds[ES_MAX_RANK], kn[ES_MAX_RANK], kss[ES_MAX_RANK], kds[ES_MAX_RANK];
  p->esz = esz;
  p->soff = soff;
  p->tile = -1;
  p->identity = false;
  es__strides_of(rank, n, ds);
  for (int i = 0; i < rank; i++)
    if (n[i] == 0) {
      p->rank = -1;
      return;
    }
  /* Walk from the innermost dim out: unit dims vanish, and a dim whose
   * strides continue the kept inner one on both sides joins it. */
  int m = 0;
  for (int i = rank - 1; i >= 0; i--) {
    if (n[i] == 1)
      continue;
    if (m > 0 && ss[i] == kss[m - 1] * kn[m - 1] && ds[i] == kds[m - 1] * kn[m - 1]) {
      kn[m - 1] *= n[i];
      continue;
    }
    kn[m] = n[i], kss[m] = ss[i], kds[m] = ds[i];
    m++;
  }
  if (m == 0)
    kn[0] = 1, kss[0] = 1, kds[0] = 1, m = 1;
  p->rank = m;
  for (int i = 0; i < m; i++)
    p->n[i] = kn[m - 1 - i], p->ss[i] = kss[m - 1 - i], p->ds[i] = kds[m - 1 - i];
  int last = m - 1;
  p->identity = m == 1 && p->ss[0] == 1 && soff == 0;
  if (p->ss[last] != 1 && p->n[last] >= 4)
    for (int i = 0; i < last; i++)
      if (p->ss[i] == 1 && p->n[i] >= 2)
        p->tile = i;
  for (int i = 0; i < last; i++) {
    p->wn[i] = i == p->tile ? 1 : p->n[i];
    p->wst[2 * i] = p->ss[i];
    p->wst[2 * i + 1] = p->ds[i];
  }
}

/* 4-byte 2-D transpose d[i*dt + j] = s[i + j*sl], i < ni, j < nj: the
 * layout change around most convolutions (NCHW <-> NHWC). Blocks of 4x4
 * move through registers (SSE2 where present) so both sides are read and
 * written four elements at a time; tiles keep the lines in L1. */
static void transpose4(uint32_t *restrict d, const uint32_t *restrict s, int64_t ni, int64_t nj,
                       int64_t dt, int64_t sl) {
  for (int64_t i0 = 0; i0 < ni; i0 += COPY_TILE) {
    int64_t ie = i0 + COPY_TILE < ni ? i0 + COPY_TILE : ni;
    for (int64_t j0 = 0; j0 < nj; j0 += COPY_TILE) {
      int64_t je = j0 + COPY_TILE < nj ? j0 + COPY_TILE : nj;
      int64_t i = i0;
#if defined(__SSE2__)
      for (; i + 4 <= ie; i += 4) {
        int64_t j = j0;
        for (; j + 4 <= je; j += 4) {
          const uint32_t *sp = s + i + j * sl;
          __m128i a = _mm_loadu_si128((const __m128i *)(const void *)sp);
          __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(sp + sl));
          __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(sp + 2 * sl));
          __m128i e = _mm_loadu_si128((const __m128i *)(const void *)(sp + 3 * sl));
          __m128i t0 = _mm_unpacklo_epi32(a, b), t1 = _mm_unpacklo_epi32(c, e);
          __m128i t2 = _mm_unpackhi_epi32(a, b), t3 = _mm_unpackhi_epi32(c, e);
          uint32_t *dp = d + i * dt + j;
          _mm_storeu_si128((__m128i *)(void *)dp, _mm_unpacklo_epi64(t0, t1));
          _mm_storeu_si128((__m128i *)(void *)(dp + dt), _mm_unpackhi_epi64(t0, t1));
          _mm_storeu_si128((__m128i *)(void *)(dp + 2 * dt), _mm_unpacklo_epi64(t2, t3));
          _mm_storeu_si128((__m128i *)(void *)(dp + 3 * dt), _mm_unpackhi_epi64(t2, t3));
        }
        for (; j < je; j++)
          for (int64_t r = 0; r < 4; r++)
            d[(i + r) * dt + j] = s[i + r + j * sl];
      }
#endif
      for (; i < ie; i++)
        for (int64_t j = j0; j < je; j++)
          d[i * dt + j] = s[i + j * sl];
    }
  }
}

/* Both tile dims (t and the last) for one position of the other dims. */
static void copy_tiles(const copy_plan *p, char *dst, const char *src) {
  int t = p->tile, l = p->rank - 1;
  int64_t nt = p->n[t], nl = p->n[l];
  int64_t esz = (int64_t)p->esz;
  if (esz == 4 && p->ds[l] == 1) {
    transpose4((uint32_t *)(void *)dst, (const uint32_t *)(const void *)src, nt, nl, p->ds[t],
               p->ss[l]);
    return;
  }
  for (int64_t i0 = 0; i0 < nt; i0 += COPY_TILE) {
    int64_t ie = i0 + COPY_TILE < nt ? i0 + COPY_TILE : nt;
    for (int64_t j0 = 0; j0 < nl; j0 += COPY_TILE) {
      int64_t je = j0 + COPY_TILE < nl ? j0 + COPY_TILE : nl;
      for (int64_t i = i0; i < ie; i++)
        elems_copy(dst + (i * p->ds[t] + j0 * p->ds[l]) * esz,
                   src + (i * p->ss[t] + j0 * p->ss[l]) * esz, je - j0, p->ss[l], p->ds[l],
                   p->esz);
    }
  }
}

static void copy_run(const copy_plan *p, void *dst, const void *src) {
  if (p->rank < 0)
    return;
  int64_t esz = (int64_t)p->esz;
  const char *s = (const char *)src + p->soff * esz;
  char *d = dst;
  int last = p->rank - 1, tile = p->tile;
  int64_t idx[ES_MAX_RANK] = {0};
  int64_t off[2] = {0, 0}; /* source, destination */
  do {
    if (tile >= 0)
      copy_tiles(p, d + off[1] * esz, s + off[0] * esz);
    else
      elems_copy(d + off[1] * esz, s + off[0] * esz, p->n[last], p->ss[last], p->ds[last],
                 p->esz);
  } while (es__walk_step(last, p->wn, idx, 2, off, p->wst) >= 0);
}

static int gather_run(const es_kinst *k, const void *const *in, void *const *out,
                      void *scratch) {
  (void)scratch;
  const copy_plan *p = k->params;
  if (p->identity && out[0] == in[0])
    return 0;
  copy_run(p, out[0], in[0]);
  return 0;
}

/* ==========================================================================
 * Shape
 * ======================================================================== */

typedef struct shape_params {
  int n;
  int64_t dims[ES_MAX_RANK];
} shape_params;

static int shape_infer(es_kinst *k) {
  int rc = es__kio_check(k, 1, 1, 1, 1);
  if (rc < 0)
    return rc;
  int rank = k->in[0]->rank;
  int64_t start, end;
  if ((rc = es__attr_int(k, "start", 0, &start)) < 0 ||
      (rc = es__attr_int(k, "end", rank, &end)) < 0)
    return rc;
  /* Opset 15: negative bounds count from the end, then both clamp. */
  if (start < 0)
    start += rank;
  if (end < 0)
    end += rank;
  start = start < 0 ? 0 : start > rank ? rank : start;
  end = end < 0 ? 0 : end > rank ? rank : end;
  shape_params *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  p->n = end > start ? (int)(end - start) : 0;
  for (int i = 0; i < p->n; i++)
    p->dims[i] = k->in[0]->dims[start + i];
  k->params = p;
  int64_t od = p->n;
  return out_set(k, 0, ES_DTYPE_INT64, 1, &od);
}

static int shape_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  (void)in, (void)scratch;
  const shape_params *p = k->params;
  memcpy(out[0], p->dims, (size_t)p->n * sizeof(int64_t));
  return 0;
}

/* ==========================================================================
 * Reshape, Squeeze: same bytes, new shape
 * ======================================================================== */

typedef struct view_params {
  size_t nbytes;
} view_params;

static int view_finish(es_kinst *k, int rank, const int64_t *dims) {
  int rc = out_set(k, 0, k->in[0]->dtype, rank, dims);
  if (rc < 0)
    return rc;
  if (k->out[0]->count != k->in[0]->count)
    return ES_KFAIL(k, ES_EMODEL, "output has %zu elements, the input %zu", k->out[0]->count,
                    k->in[0]->count);
  view_params *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  p->nbytes = k->in[0]->nbytes;
  k->params = p;
  k->inplace = 0; /* a view: the planner may give the output the input's buffer */
  return 0;
}

static int view_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  (void)scratch;
  const view_params *p = k->params;
  if (out[0] != in[0])
    memcpy(out[0], in[0], p->nbytes);
  return 0;
}

static int reshape_infer(es_kinst *k) {
  int rc = es__kio_check(k, 2, 2, 1, 1);
  if (rc < 0)
    return rc;
  const es_tdesc *x = k->in[0];
  int64_t shape[ES_MAX_RANK], allowzero;
  size_t n;
  if ((rc = static_ints(k, 1, "shape", ES_MAX_RANK, ES_ENOTSUP, shape, &n)) < 0 ||
      (rc = es__attr_int(k, "allowzero", 0, &allowzero)) < 0)
    return rc;
  if (allowzero != 0 && allowzero != 1)
    return ES_KFAIL(k, ES_EMODEL, "allowzero is %lld, expected 0 or 1", (long long)allowzero);
  int infer_at = -1;
  bool has_zero = false;
  uint64_t known = 1;
  for (size_t i = 0; i < n; i++) {
    if (shape[i] == -1) {
      if (infer_at >= 0)
        return ES_KFAIL(k, ES_EMODEL, "shape has -1 at both %d and %zu, expected at most one",
                        infer_at, i);
      infer_at = (int)i;
      continue;
    }
    if (shape[i] < -1)
      return ES_KFAIL(k, ES_EMODEL, "shape[%zu] = %lld, expected >= -1", i, (long long)shape[i]);
    if (shape[i] == 0) {
      has_zero = true;
      if (!allowzero) {
        if ((int)i >= x->rank)
          return ES_KFAIL(k, ES_EMODEL, "shape[%zu] = 0 copies input dim %zu, but the input has "
                          "rank %d", i, i, x->rank);
        shape[i] = x->dims[i];
      }
    }
    if (__builtin_mul_overflow(known, (uint64_t)shape[i], &known) || known > ((uint64_t)1 << 40))
      return ES_KFAIL(k, ES_EMODEL, "shape has more than 2^40 elements");
  }
  if (infer_at >= 0) {
    if (allowzero && has_zero)
      return ES_KFAIL(k, ES_EMODEL, "shape has both -1 and 0 with allowzero=1");
    if (known == 0 || x->count % known)
      return ES_KFAIL(k, ES_EMODEL, "cannot infer the -1 dim: %zu elements do not divide into "
                      "%llu", x->count, (unsigned long long)known);
    shape[infer_at] = (int64_t)(x->count / known);
  }
  return view_finish(k, (int)n, shape);
}

static int squeeze_infer(es_kinst *k) {
  bool attr_form = k->opset < 13;
  int rc = es__kio_check(k, 1, attr_form ? 1 : 2, 1, 1);
  if (rc < 0)
    return rc;
  const es_tdesc *x = k->in[0];
  int64_t axes[ES_MAX_RANK];
  size_t n = 0;
  bool present = false;
  if (attr_form)
    rc = attr_ints_copy(k, "axes", ES_MAX_RANK, axes, &n, &present);
  else if (k->n_in > 1 && k->in[1])
    rc = static_ints(k, 1, "axes", ES_MAX_RANK, ES_EMODEL, axes, &n);
  if (rc < 0)
    return rc;
  int ax[ES_MAX_RANK];
  bool drop[ES_MAX_RANK];
  if ((rc = axes_norm(k, axes, n, x->rank, "axes", ax, drop)) < 0)
    return rc;
  for (int i = 0; i < x->rank; i++) {
    if (n == 0)
      drop[i] = x->dims[i] == 1;
    else if (drop[i] && x->dims[i] != 1)
      return ES_KFAIL(k, ES_EMODEL, "cannot squeeze axis %d of size %lld, expected 1", i,
                      (long long)x->dims[i]);
  }
  int64_t dims[ES_MAX_RANK];
  int r = 0;
  for (int i = 0; i < x->rank; i++)
    if (!drop[i])
      dims[r++] = x->dims[i];
  return view_finish(k, r, dims);
}

/* ==========================================================================
 * Concat
 * ======================================================================== */

typedef struct concat_params {
  int n;
  size_t outer;   /* product of the physical dims before the physical axis */
  size_t *block;  /* [n] bytes each input contributes per outer index */
  bool short_runs; /* every block fits run_copy: whole 4-byte words, <= 256 bytes */
} concat_params;

/* A rank-4 plain tensor whose bytes read the same in NHWC order (one
 * channel, or one pixel): it joins NHWC inputs without a conversion. */
static bool nhwc_same_bytes(const es_tdesc *t) {
  return t->layout == ES_LAYOUT_NHWC ||
         (t->rank == 4 && (t->dims[1] == 1 || (t->dims[2] == 1 && t->dims[3] == 1)));
}

/* Layout of a Concat's output: NHWC when any input is (so channel concats
 * between convolutions stay NHWC), else plain. Plain inputs that would have
 * to move become ES_KRELAYOUT requests. */
static int concat_layout(es_kinst *k, es_layout *lay) {
  *lay = ES_LAYOUT_PLAIN;
  for (int i = 0; i < k->n_in; i++)
    if (k->in[i]->layout == ES_LAYOUT_NHWC)
      *lay = ES_LAYOUT_NHWC;
  if (*lay == ES_LAYOUT_PLAIN)
    return 0;
  uint32_t want = 0;
  for (int i = 0; i < k->n_in; i++) {
    if (nhwc_same_bytes(k->in[i]))
      continue;
    if (i >= 32)
      return ES_KFAIL(k, ES_ENOTSUP,
                      "input %d is plain among NHWC inputs; at most 32 inputs can be converted",
                      i);
    want |= 1u << i;
  }
  if (want) {
    k->want_nhwc = want;
    return ES_KRELAYOUT;
  }
  return 0;
}

static int concat_infer(es_kinst *k) {
  if (k->n_in < 1)
    return ES_KFAIL(k, ES_EMODEL, "has no inputs, expected at least 1");
  int rc = es__kio_check(k, k->n_in, k->n_in, 1, 1);
  if (rc < 0)
    return rc;
  if (!es__kattr(k, "axis"))
    return ES_KFAIL(k, ES_EMODEL, "attribute 'axis' is required");
  const es_tdesc *x0 = k->in[0];
  int64_t axis_attr;
  int axis;
  if ((rc = es__attr_int(k, "axis", 0, &axis_attr)) < 0)
    return rc;
  if (x0->rank == 0)
    return ES_KFAIL(k, ES_EMODEL, "input 0 is a scalar, expected rank >= 1");
  if ((rc = es__axis_norm(k, axis_attr, x0->rank, &axis)) < 0)
    return rc;
  int64_t dims[ES_MAX_RANK];
  memcpy(dims, x0->dims, sizeof dims);
  dims[axis] = 0;
  for (int i = 0; i < k->n_in; i++) {
    const es_tdesc *t = k->in[i];
    if (t->dtype != x0->dtype)
      return ES_KFAIL(k, ES_EMODEL, "input %d is %s, input 0 %s", i, es_dtype_name(t->dtype),
                      es_dtype_name(x0->dtype));
    if (t->rank != x0->rank)
      return ES_KFAIL(k, ES_EMODEL, "input %d has rank %d, input 0 %d", i, t->rank, x0->rank);
    for (int d = 0; d < x0->rank; d++)
      if (d != axis && t->dims[d] != x0->dims[d])
        return ES_KFAIL(k, ES_EMODEL, "input %d has dim %d = %lld, input 0 %lld", i, d,
                        (long long)t->dims[d], (long long)x0->dims[d]);
    dims[axis] += t->dims[axis];
  }
  /* All inputs have x0's rank: with an NHWC one, all are rank 4. */
  es_layout lay;
  if ((rc = concat_layout(k, &lay)) != 0)
    return rc;
  if ((rc = out_set(k, 0, x0->dtype, x0->rank, dims)) < 0)
    return rc;
  es_tdesc *y = k->out[0];
  y->layout = lay;
  concat_params *p = es__kinst_params(k, sizeof *p);
  if (!p || !(p->block = es__kinst_params(k, (size_t)k->n_in * sizeof *p->block)))
    return ES_ENOMEM;
  /* Blocks along the physical axis: in NHWC a channel concat interleaves
   * one run of C_i channels per input for every pixel. */
  int64_t pd[ES_MAX_RANK];
  es__tdesc_phys_dims(y, pd);
  int pa = es__layout_axis(y, axis);
  p->n = k->n_in;
  p->outer = 1;
  for (int d = 0; d < pa; d++)
    p->outer *= (size_t)pd[d];
  size_t inner = es_dtype_size(x0->dtype);
  for (int d = pa + 1; d < y->rank; d++)
    inner *= (size_t)pd[d];
  p->short_runs = true;
  for (int i = 0; i < k->n_in; i++) {
    p->block[i] = inner * (size_t)k->in[i]->dims[axis];
    p->short_runs = p->short_runs && p->block[i] <= 256 && p->block[i] % 4 == 0;
  }
  k->params = p;
  return 0;
}

static int concat_run(const es_kinst *k, const void *const *in, void *const *out,
                      void *scratch) {
  (void)scratch;
  const concat_params *p = k->params;
  char *d = out[0];
  if (!p->short_runs) {
    for (size_t o = 0; o < p->outer; o++)
      for (int i = 0; i < p->n; i++) {
        memcpy(d, (const char *)in[i] + o * p->block[i], p->block[i]);
        d += p->block[i];
      }
    return 0;
  }
  /* Tiles of output rows (64 KB) that stay in cache while every input
   * writes its runs into them, one input at a time so each copy loop has a
   * fixed run size. */
  size_t row = 0;
  for (int i = 0; i < p->n; i++)
    row += p->block[i];
  size_t tile = row ? 65536 / row : 1;
  tile = tile ? tile : 1;
  for (size_t o0 = 0; o0 < p->outer; o0 += tile) {
    size_t rows = p->outer - o0 < tile ? p->outer - o0 : tile, off = 0;
    for (int i = 0; i < p->n; i++) {
      size_t b = p->block[i];
      rows_copy(d + o0 * row + off, row, (const char *)in[i] + o0 * b, b, rows, b);
      off += b;
    }
  }
  return 0;
}

/* ==========================================================================
 * Slice
 * ======================================================================== */

/* Resolves one axis per the ONNX rules: negative indices count from the
 * end, starts clamp to [0, d] (to [0, d-1] for negative steps) and ends to
 * [0, d] (to [-1, d-1]), so INT64_MAX and INT64_MIN mean "to the end". */
static int64_t slice_axis(int64_t d, int64_t start, int64_t end, int64_t step, int64_t *first) {
  *first = 0;
  if (d == 0) /* nothing to take, whatever the clamping would say */
    return 0;
  if (start < 0)
    start += d;
  if (end < 0)
    end += d;
  if (step > 0) {
    start = start < 0 ? 0 : start > d ? d : start;
    end = end < 0 ? 0 : end > d ? d : end;
    *first = start;
    return end > start ? (end - start - 1) / step + 1 : 0;
  }
  start = start < 0 ? 0 : start > d - 1 ? d - 1 : start;
  end = end < -1 ? -1 : end > d - 1 ? d - 1 : end;
  *first = start;
  /* -step overflows for INT64_MIN: divide by its magnitude as unsigned. */
  return start > end ? (int64_t)((uint64_t)(start - end - 1) / (0 - (uint64_t)step)) + 1 : 0;
}

static int slice_infer(es_kinst *k) {
  bool attr_form = k->opset < 10;
  int rc = es__kio_check(k, attr_form ? 1 : 3, attr_form ? 1 : 5, 1, 1);
  if (rc < 0)
    return rc;
  const es_tdesc *x = k->in[0];
  int64_t starts[ES_MAX_RANK], ends[ES_MAX_RANK], axes[ES_MAX_RANK], steps[ES_MAX_RANK];
  size_t ns, ne, na = 0, nst = 0;
  bool has_axes = false, has_steps = false, present;
  if (attr_form) {
    if ((rc = attr_ints_copy(k, "starts", ES_MAX_RANK, starts, &ns, &present)) < 0)
      return rc;
    if (!present)
      return ES_KFAIL(k, ES_EMODEL, "attribute 'starts' is required");
    if ((rc = attr_ints_copy(k, "ends", ES_MAX_RANK, ends, &ne, &present)) < 0)
      return rc;
    if (!present)
      return ES_KFAIL(k, ES_EMODEL, "attribute 'ends' is required");
    if ((rc = attr_ints_copy(k, "axes", ES_MAX_RANK, axes, &na, &has_axes)) < 0)
      return rc;
  } else {
    if ((rc = static_ints(k, 1, "starts", ES_MAX_RANK, ES_EMODEL, starts, &ns)) < 0 ||
        (rc = static_ints(k, 2, "ends", ES_MAX_RANK, ES_EMODEL, ends, &ne)) < 0)
      return rc;
    if ((has_axes = k->n_in > 3 && k->in[3]) &&
        (rc = static_ints(k, 3, "axes", ES_MAX_RANK, ES_EMODEL, axes, &na)) < 0)
      return rc;
    if ((has_steps = k->n_in > 4 && k->in[4]) &&
        (rc = static_ints(k, 4, "steps", ES_MAX_RANK, ES_EMODEL, steps, &nst)) < 0)
      return rc;
  }
  if (ne != ns)
    return ES_KFAIL(k, ES_EMODEL, "ends has %zu values, starts %zu", ne, ns);
  if (has_axes && na != ns)
    return ES_KFAIL(k, ES_EMODEL, "axes has %zu values, starts %zu", na, ns);
  if (has_steps && nst != ns)
    return ES_KFAIL(k, ES_EMODEL, "steps has %zu values, starts %zu", nst, ns);
  if (ns > (size_t)x->rank)
    return ES_KFAIL(k, ES_EMODEL, "starts has %zu values, more than the input rank %d", ns,
                    x->rank);
  if (!has_axes)
    for (size_t j = 0; j < ns; j++)
      axes[j] = (int64_t)j;
  int ax[ES_MAX_RANK];
  bool seen[ES_MAX_RANK];
  if ((rc = axes_norm(k, axes, ns, x->rank, "axes", ax, seen)) < 0)
    return rc;
  int64_t first[ES_MAX_RANK], step[ES_MAX_RANK], dims[ES_MAX_RANK];
  for (int d = 0; d < x->rank; d++)
    first[d] = 0, step[d] = 1, dims[d] = x->dims[d];
  for (size_t j = 0; j < ns; j++) {
    int64_t st = has_steps ? steps[j] : 1;
    if (st == 0)
      return ES_KFAIL(k, ES_EMODEL, "steps[%zu] is 0", j);
    dims[ax[j]] = slice_axis(x->dims[ax[j]], starts[j], ends[j], st, &first[ax[j]]);
    /* With one element or none the step never moves: 1 keeps the stride
     * product below from overflowing for huge steps. */
    step[ax[j]] = dims[ax[j]] > 1 ? st : 1;
  }
  if ((rc = out_set(k, 0, x->dtype, x->rank, dims)) < 0)
    return rc;
  int64_t ist[ES_MAX_RANK], ss[ES_MAX_RANK], soff = 0;
  es__strides_of(x->rank, x->dims, ist);
  for (int d = 0; d < x->rank; d++) {
    ss[d] = step[d] * ist[d];
    if (dims[d] > 0)
      soff += first[d] * ist[d];
  }
  copy_plan *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  copy_plan_init(p, es_dtype_size(x->dtype), x->rank, dims, ss, soff);
  if (p->identity)
    k->inplace = 0;
  k->params = p;
  return 0;
}

/* ==========================================================================
 * Split
 * ======================================================================== */

typedef struct split_params {
  int n;
  size_t outer;    /* product of the dims before the axis */
  size_t in_block; /* input bytes per outer index */
  size_t *block;   /* [n] output bytes per outer index */
  size_t *off;     /* [n] byte offset of each output inside an input block */
} split_params;

static int split_infer(es_kinst *k) {
  bool attr_form = k->opset < 13;
  if (k->n_out < 1)
    return ES_KFAIL(k, ES_EMODEL, "has no outputs, expected at least 1");
  int rc = es__kio_check(k, 1, attr_form ? 1 : 2, 1, k->n_out);
  if (rc < 0)
    return rc;
  const es_tdesc *x = k->in[0];
  int64_t axis_attr;
  int axis;
  if ((rc = es__attr_int(k, "axis", 0, &axis_attr)) < 0)
    return rc;
  if (x->rank == 0)
    return ES_KFAIL(k, ES_EMODEL, "input is a scalar, expected rank >= 1");
  if ((rc = es__axis_norm(k, axis_attr, x->rank, &axis)) < 0)
    return rc;
  int n = k->n_out;
  int64_t dim = x->dims[axis];
  int64_t *sizes = es__kinst_params(k, (size_t)n * sizeof *sizes);
  if (!sizes)
    return ES_ENOMEM;
  size_t ns = 0;
  if (attr_form) {
    const int64_t *a;
    if ((rc = es__attr_ints(k, "split", &a, &ns)) < 0)
      return rc;
    if (ns && ns != (size_t)n)
      return ES_KFAIL(k, ES_EMODEL, "split has %zu values, expected one per output (%d)", ns, n);
    for (size_t i = 0; i < ns; i++)
      sizes[i] = a[i];
  } else if (k->n_in > 1 && k->in[1]) {
    const void *data;
    if ((rc = static_vec(k, 1, "split", &data, &ns)) < 0)
      return rc;
    if (ns != (size_t)n)
      return ES_KFAIL(k, ES_EMODEL, "split has %zu values, expected one per output (%d)", ns, n);
    for (size_t i = 0; i < ns; i++)
      sizes[i] = es__static_i64(k->in[1], data, i);
  }
  if (ns == 0) {
    /* Equal parts; from opset 18 (num_outputs) the last may be smaller. */
    int64_t chunk = dim / n;
    if (dim % n) {
      if (k->opset < 18)
        return ES_KFAIL(k, ES_EMODEL, "axis %d of size %lld does not split into %d equal parts",
                        axis, (long long)dim, n);
      chunk = (dim + n - 1) / n;
      if (chunk * (n - 1) > dim)
        return ES_KFAIL(k, ES_EMODEL, "axis %d of size %lld cannot split into %d parts of %lld",
                        axis, (long long)dim, n, (long long)chunk);
    }
    for (int i = 0; i < n; i++)
      sizes[i] = i < n - 1 ? chunk : dim - chunk * (n - 1);
  }
  int64_t sum = 0;
  for (int i = 0; i < n; i++) {
    if (sizes[i] < 0 || sizes[i] > dim)
      return ES_KFAIL(k, ES_EMODEL, "split[%d] = %lld is outside [0, %lld]", i,
                      (long long)sizes[i], (long long)dim);
    sum += sizes[i];
  }
  if (sum != dim)
    return ES_KFAIL(k, ES_EMODEL, "split sums to %lld, expected axis %d's size %lld",
                    (long long)sum, axis, (long long)dim);
  split_params *p = es__kinst_params(k, sizeof *p);
  if (!p || !(p->block = es__kinst_params(k, (size_t)n * sizeof *p->block)) ||
      !(p->off = es__kinst_params(k, (size_t)n * sizeof *p->off)))
    return ES_ENOMEM;
  /* Blocks along the physical axis; every output keeps X's layout (in
   * NHWC a channel split takes one run of channels per pixel). */
  int64_t pd[ES_MAX_RANK];
  es__tdesc_phys_dims(x, pd);
  int pa = es__layout_axis(x, axis);
  p->n = n;
  p->outer = 1;
  for (int d = 0; d < pa; d++)
    p->outer *= (size_t)pd[d];
  size_t inner = es_dtype_size(x->dtype);
  for (int d = pa + 1; d < x->rank; d++)
    inner *= (size_t)pd[d];
  p->in_block = inner * (size_t)dim;
  size_t off = 0;
  for (int i = 0; i < n; i++) {
    p->block[i] = inner * (size_t)sizes[i];
    p->off[i] = off;
    off += p->block[i];
    if (!k->out[i])
      continue;
    int64_t dims[ES_MAX_RANK];
    memcpy(dims, x->dims, sizeof dims);
    dims[axis] = sizes[i];
    if ((rc = out_set(k, i, x->dtype, x->rank, dims)) < 0)
      return rc;
    k->out[i]->layout = x->layout;
  }
  k->params = p;
  return 0;
}

static int split_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  (void)scratch;
  const split_params *p = k->params;
  const char *s = in[0];
  for (int i = 0; i < p->n; i++) {
    if (!out[i])
      continue;
    rows_copy(out[i], p->block[i], s + p->off[i], p->in_block, p->outer, p->block[i]);
  }
  return 0;
}

/* ==========================================================================
 * Transpose
 * ======================================================================== */

/* Plans Y (its dims set) in layout lay: walking Y's memory in order,
 * physical position j holds Y's logical axis a, read from X's axis perm[a]
 * whose stride in X's memory is lst[perm[a]]. Returns 1 if the move is an
 * identity. */
static bool transpose_plan(copy_plan *p, es_tdesc *y, es_layout lay, size_t esz,
                           const int64_t *perm, const int64_t *lst) {
  int64_t n[ES_MAX_RANK], ss[ES_MAX_RANK];
  y->layout = lay;
  for (int a = 0; a < y->rank; a++) {
    int j = es__layout_axis(y, a);
    n[j] = y->dims[a];
    ss[j] = lst[perm[a]];
  }
  copy_plan_init(p, esz, y->rank, n, ss, 0);
  return p->identity;
}

static int transpose_infer(es_kinst *k) {
  int rc = es__kio_check(k, 1, 1, 1, 1);
  if (rc < 0)
    return rc;
  const es_tdesc *x = k->in[0];
  int64_t perm[ES_MAX_RANK];
  size_t n;
  bool present, seen[ES_MAX_RANK] = {false};
  if ((rc = attr_ints_copy(k, "perm", ES_MAX_RANK, perm, &n, &present)) < 0)
    return rc;
  if (!present) {
    n = (size_t)x->rank;
    for (int i = 0; i < x->rank; i++)
      perm[i] = x->rank - 1 - i;
  }
  if (n != (size_t)x->rank)
    return ES_KFAIL(k, ES_EMODEL, "perm has %zu values, expected the input rank %d", n, x->rank);
  for (size_t i = 0; i < n; i++) {
    if (perm[i] < 0 || perm[i] >= x->rank || seen[perm[i]])
      return ES_KFAIL(k, ES_EMODEL, "perm[%zu] = %lld, expected a permutation of 0..%d", i,
                      (long long)perm[i], x->rank - 1);
    seen[perm[i]] = true;
  }
  int r = x->rank;
  int64_t dims[ES_MAX_RANK], pd[ES_MAX_RANK], pst[ES_MAX_RANK], lst[ES_MAX_RANK];
  for (int i = 0; i < r; i++)
    dims[i] = x->dims[perm[i]];
  if ((rc = out_set(k, 0, x->dtype, r, dims)) < 0)
    return rc;
  /* Element stride in X's memory of each logical axis of X. */
  es__tdesc_phys_dims(x, pd);
  es__strides_of(r, pd, pst);
  for (int a = 0; a < r; a++)
    lst[a] = pst[es__layout_axis(x, a)];
  copy_plan *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  /* The output layout that makes the move an identity if one does (plain
   * first), else plain. NHWC is an option only inside a plan (k->prep set,
   * as for Conv): es__kernel_eval folds constants at load into plain graph
   * values, so from a plain input it must give a plain output. */
  es_tdesc *y = k->out[0];
  size_t esz = es_dtype_size(x->dtype);
  bool may_nhwc = r == 4 && (k->prep || x->layout == ES_LAYOUT_NHWC);
  if (!transpose_plan(p, y, ES_LAYOUT_PLAIN, esz, perm, lst) &&
      !(may_nhwc && transpose_plan(p, y, ES_LAYOUT_NHWC, esz, perm, lst)))
    transpose_plan(p, y, ES_LAYOUT_PLAIN, esz, perm, lst);
  if (p->identity)
    k->inplace = 0;
  k->params = p;
  return 0;
}

/* ==========================================================================
 * Pad
 * ======================================================================== */

typedef enum pad_mode { PAD_CONSTANT, PAD_REFLECT, PAD_EDGE, PAD_WRAP } pad_mode;

typedef struct pad_params {
  pad_mode mode;
  int rank;
  size_t esz;
  int64_t in_dims[ES_MAX_RANK], out_dims[ES_MAX_RANK];
  int64_t in_st[ES_MAX_RANK]; /* input element strides */
  int64_t begin[ES_MAX_RANK]; /* pads before each dim (negative: cropped) */
  int64_t win0[ES_MAX_RANK], win1[ES_MAX_RANK]; /* the input left after cropping */
  unsigned char value[8];     /* the constant, one element */
} pad_params;

/* Input index for output index o of a dim, or -1 for constant padding.
 * Negative pads crop first and the other modes then pad what is left (as
 * ONNX's reference does): edge, reflect and wrap read inside the window
 * [win0, win1), so a dim cropped at one end and wrapped at the other
 * repeats the kept elements only. */
static int64_t pad_src(const pad_params *p, int d, int64_t o) {
  int64_t w0 = p->win0[d], w1 = p->win1[d], i = o - p->begin[d];
  if (i >= w0 && i < w1)
    return i;
  if (p->mode == PAD_CONSTANT)
    return -1;
  int64_t n = w1 - w0, t = i - w0;
  if (p->mode == PAD_EDGE)
    return t < 0 ? w0 : w1 - 1;
  if (p->mode == PAD_WRAP) {
    t %= n;
    return w0 + (t < 0 ? t + n : t);
  }
  if (n == 1)
    return w0;
  /* Reflection without repeating the border is periodic in 2(n-1). */
  int64_t period = 2 * (n - 1);
  t %= period;
  if (t < 0)
    t += period;
  return w0 + (t < n ? t : period - t);
}

static int pad_infer(es_kinst *k) {
  bool attr_form = k->opset < 11;
  int rc = es__kio_check(k, attr_form ? 1 : 2, attr_form ? 1 : 4, 1, 1);
  if (rc < 0)
    return rc;
  const es_tdesc *x = k->in[0];
  int r = x->rank;
  const char *mode;
  if ((rc = es__attr_string(k, "mode", "constant", &mode)) < 0)
    return rc;
  pad_params *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  if (!strcmp(mode, "constant"))
    p->mode = PAD_CONSTANT;
  else if (!strcmp(mode, "reflect"))
    p->mode = PAD_REFLECT;
  else if (!strcmp(mode, "edge"))
    p->mode = PAD_EDGE;
  else if (!strcmp(mode, "wrap") && k->opset >= 19)
    p->mode = PAD_WRAP;
  else
    return ES_KFAIL(k, ES_EMODEL, "mode '%s', expected constant, reflect, edge%s", mode,
                    k->opset >= 19 ? " or wrap" : " (wrap from opset 19)");
  p->rank = r;
  p->esz = es_dtype_size(x->dtype);
  int64_t pads[2 * ES_MAX_RANK], axes_v[ES_MAX_RANK];
  size_t np, na;
  bool present;
  int ax[ES_MAX_RANK];
  bool seen[ES_MAX_RANK];
  if (attr_form) {
    float value;
    if ((rc = attr_ints_copy(k, "pads", 2 * ES_MAX_RANK, pads, &np, &present)) < 0 ||
        (rc = es__attr_float(k, "value", 0.0f, &value)) < 0)
      return rc;
    if (!present)
      return ES_KFAIL(k, ES_EMODEL, "attribute 'pads' is required");
    value_from_float(x->dtype, value, p->value);
  } else {
    if ((rc = static_ints(k, 1, "pads", 2 * ES_MAX_RANK, ES_EMODEL, pads, &np)) < 0)
      return rc;
    if (k->n_in > 2 && k->in[2]) {
      const es_tdesc *c = k->in[2];
      if (!k->in_static[2])
        return ES_KFAIL(k, ES_ENOTSUP, "constant_value (input 2) must be known when planning");
      if (c->dtype != x->dtype)
        return ES_KFAIL(k, ES_EMODEL, "constant_value is %s, the data %s",
                        es_dtype_name(c->dtype), es_dtype_name(x->dtype));
      if (c->count != 1)
        return ES_KFAIL(k, ES_EMODEL, "constant_value has %zu elements, expected 1", c->count);
      memcpy(p->value, k->in_static[2], p->esz);
    }
  }
  na = (size_t)r;
  for (int d = 0; d < r; d++)
    ax[d] = d;
  if (!attr_form && k->n_in > 3 && k->in[3]) {
    /* Opset 18: pads apply to these axes only. */
    if ((rc = static_ints(k, 3, "axes", ES_MAX_RANK, ES_EMODEL, axes_v, &na)) < 0 ||
        (rc = axes_norm(k, axes_v, na, r, "axes", ax, seen)) < 0)
      return rc;
  }
  if (np != 2 * na)
    return ES_KFAIL(k, ES_EMODEL, "pads has %zu values, expected %zu", np, 2 * na);
  /* Pads per logical axis, then everything per physical axis: an NHWC x
   * (a channel padding between convolutions) is padded as it lies, its
   * output NHWC too. */
  int64_t lbegin[ES_MAX_RANK] = {0}, lend[ES_MAX_RANK] = {0}, odims[ES_MAX_RANK];
  for (size_t j = 0; j < na; j++) {
    lbegin[ax[j]] = pads[j];
    lend[ax[j]] = pads[j + na];
  }
  int64_t end[ES_MAX_RANK] = {0}, pdims[ES_MAX_RANK];
  es__tdesc_phys_dims(x, pdims);
  for (int d = 0; d < r; d++) {
    int j = es__layout_axis(x, d);
    p->begin[j] = lbegin[d];
    end[j] = lend[d];
    odims[d] = x->dims[d] + lbegin[d] + lend[d];
  }
  for (int d = 0; d < r; d++) {
    int64_t n = pdims[d], b = p->begin[d], e = end[d];
    /* Bound the pads so the sums below cannot overflow. */
    if (b > ((int64_t)1 << 40) || e > ((int64_t)1 << 40) || b < -n || e < -n || n + b + e < 0)
      return ES_KFAIL(k, ES_EMODEL, "pads %lld, %lld on dim %d of size %lld leave a negative or "
                      "huge size", (long long)b, (long long)e, d, (long long)n);
    p->in_dims[d] = n;
    p->out_dims[d] = n + b + e;
    p->win0[d] = b < 0 ? -b : 0;
    p->win1[d] = e < 0 ? n + e : n;
    if (p->mode != PAD_CONSTANT && p->win1[d] <= p->win0[d] && p->out_dims[d] > 0)
      return ES_KFAIL(k, ES_EMODEL, "mode '%s' cannot pad dim %d: no element of it is left", mode,
                      d);
  }
  es__strides_of(r, p->in_dims, p->in_st);
  k->params = p;
  if ((rc = out_set(k, 0, x->dtype, r, odims)) < 0)
    return rc;
  k->out[0]->layout = x->layout;
  return 0;
}

/* One output row: the run of the last dim. src is the input row, or NULL
 * when the row lies in constant padding. */
static void pad_row(const pad_params *p, char *dst, const char *src) {
  int l = p->rank - 1;
  size_t esz = p->esz;
  int64_t on = p->out_dims[l], b = p->begin[l], n = p->in_dims[l];
  if (!src) {
    elems_fill(dst, p->value, on, esz);
    return;
  }
  int64_t lo = b < 0 ? 0 : b > on ? on : b;
  int64_t hi = b + n < 0 ? 0 : b + n > on ? on : b + n;
  if (hi < lo)
    hi = lo;
  if (p->mode == PAD_CONSTANT) {
    elems_fill(dst, p->value, lo, esz);
    elems_fill(dst + hi * (int64_t)esz, p->value, on - hi, esz);
  } else {
    for (int64_t o = 0; o < lo; o++)
      memcpy(dst + o * (int64_t)esz, src + pad_src(p, l, o) * (int64_t)esz, esz);
    for (int64_t o = hi; o < on; o++)
      memcpy(dst + o * (int64_t)esz, src + pad_src(p, l, o) * (int64_t)esz, esz);
  }
  memcpy(dst + lo * (int64_t)esz, src + (lo - b) * (int64_t)esz, (size_t)(hi - lo) * esz);
}

static int pad_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  (void)scratch;
  const pad_params *p = k->params;
  char *d = out[0];
  const char *s = in[0];
  size_t esz = p->esz;
  if (p->rank == 0) {
    memcpy(d, s, esz);
    return 0;
  }
  for (int i = 0; i < p->rank; i++)
    if (p->out_dims[i] == 0)
      return 0;
  int l = p->rank - 1;
  int64_t idx[ES_MAX_RANK] = {0};
  size_t row = (size_t)p->out_dims[l] * esz;
  for (;;) {
    int64_t off = 0;
    bool inside = true;
    for (int i = 0; i < l && inside; i++) {
      int64_t si = pad_src(p, i, idx[i]);
      inside = si >= 0;
      off += si * p->in_st[i];
    }
    pad_row(p, d, inside ? s + off * (int64_t)esz : NULL);
    d += row;
    if (es__walk_step(l, p->out_dims, idx, 0, NULL, NULL) < 0)
      return 0;
  }
}

/* ==========================================================================
 * ConstantOfShape
 * ======================================================================== */

typedef struct fill_params {
  size_t count, esz;
  unsigned char value[8];
} fill_params;

static int constant_of_shape_infer(es_kinst *k) {
  int rc = es__kio_check(k, 1, 1, 1, 1);
  if (rc < 0)
    return rc;
  int64_t dims[ES_MAX_RANK];
  size_t n;
  if ((rc = static_ints(k, 0, "shape", ES_MAX_RANK, ES_ENOTSUP, dims, &n)) < 0)
    return rc;
  for (size_t i = 0; i < n; i++)
    if (dims[i] < 0)
      return ES_KFAIL(k, ES_EMODEL, "shape[%zu] = %lld, expected >= 0", i, (long long)dims[i]);
  fill_params *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  es_dtype dt = ES_DTYPE_FLOAT; /* without 'value': float32 zeros */
  const es_attr *a = es__kattr(k, "value");
  if (a) {
    if (a->type != ES_ATTR_TENSOR)
      return ES_KFAIL(k, ES_EMODEL, "attribute 'value' has type %d, expected a tensor (%d)",
                      (int)a->type, (int)ES_ATTR_TENSOR);
    const es_attr_tensor *v = a->t;
    if (!v)
      return ES_KFAIL(k, ES_EMODEL, "attribute 'value' refers to no constant");
    size_t esz = es_dtype_size(v->dtype);
    if (esz == 0)
      return ES_KFAIL(k, ES_ENOTSUP, "attribute 'value' is %s, which is not supported",
                      es_dtype_name(v->dtype));
    if (v->nbytes != esz || !v->data)
      return ES_KFAIL(k, ES_EMODEL, "attribute 'value' has %zu bytes, expected one %s element",
                      v->nbytes, es_dtype_name(v->dtype));
    dt = v->dtype;
    memcpy(p->value, v->data, esz);
  }
  if ((rc = out_set(k, 0, dt, (int)n, dims)) < 0)
    return rc;
  p->count = k->out[0]->count;
  p->esz = es_dtype_size(dt);
  k->params = p;
  return 0;
}

static int constant_of_shape_run(const es_kinst *k, const void *const *in, void *const *out,
                                 void *scratch) {
  (void)in, (void)scratch;
  const fill_params *p = k->params;
  elems_fill(out[0], p->value, (int64_t)p->count, p->esz);
  return 0;
}

/* ==========================================================================
 * Flatten, Unsqueeze: same bytes, new shape
 * ======================================================================== */

/* Product of dims[a..b), saturated (a zero dim next to huge ones must not
 * overflow; out_set then refuses a real product above 2^40). */
static int64_t dims_prod(const int64_t *dims, int a, int b) {
  int64_t n = 1;
  for (int i = a; i < b; i++)
    if (__builtin_mul_overflow(n, dims[i], &n))
      return INT64_MAX;
  return n;
}

static int flatten_infer(es_kinst *k) {
  int rc = es__kio_check(k, 1, 1, 1, 1);
  if (rc < 0)
    return rc;
  const es_tdesc *x = k->in[0];
  int r = x->rank;
  int64_t axis;
  if ((rc = es__attr_int(k, "axis", 1, &axis)) < 0)
    return rc;
  /* Opset 11 added negative axes; the end of the range is r inclusive. */
  if (axis < (k->opset < 11 ? 0 : -(int64_t)r) || axis > r)
    return ES_KFAIL(k, ES_EMODEL, "axis %lld is outside [%d, %d]", (long long)axis,
                    k->opset < 11 ? 0 : -r, r);
  int a = (int)(axis < 0 ? axis + r : axis);
  int64_t dims[2] = {dims_prod(x->dims, 0, a), dims_prod(x->dims, a, r)};
  return view_finish(k, 2, dims);
}

static int unsqueeze_infer(es_kinst *k) {
  bool attr_form = k->opset < 13;
  int rc = es__kio_check(k, attr_form ? 1 : 2, attr_form ? 1 : 2, 1, 1);
  if (rc < 0)
    return rc;
  const es_tdesc *x = k->in[0];
  int64_t axes[ES_MAX_RANK];
  size_t n;
  bool present = true;
  if (attr_form)
    rc = attr_ints_copy(k, "axes", ES_MAX_RANK, axes, &n, &present);
  else
    rc = static_ints(k, 1, "axes", ES_MAX_RANK, ES_ENOTSUP, axes, &n);
  if (rc < 0)
    return rc;
  if (!present)
    return ES_KFAIL(k, ES_EMODEL, "attribute 'axes' is required");
  if (n == 0)
    return ES_KFAIL(k, ES_EMODEL, "axes is empty, expected at least one axis");
  if ((size_t)x->rank + n > ES_MAX_RANK)
    return ES_KFAIL(k, ES_ENOTSUP, "output rank %zu exceeds the maximum %d", (size_t)x->rank + n,
                    ES_MAX_RANK);
  int r = x->rank + (int)n, ax[ES_MAX_RANK];
  bool ins[ES_MAX_RANK];
  /* Axes index the output, so they normalise against its rank. */
  if ((rc = axes_norm(k, axes, n, r, "axes", ax, ins)) < 0)
    return rc;
  int64_t dims[ES_MAX_RANK];
  for (int i = 0, j = 0; i < r; i++)
    dims[i] = ins[i] ? 1 : x->dims[j++];
  return view_finish(k, r, dims);
}

/* ==========================================================================
 * Expand
 * ======================================================================== */

/* A strided gather where every broadcast dim has source stride 0. */
static int expand_infer(es_kinst *k) {
  int rc = es__kio_check(k, 2, 2, 1, 1);
  if (rc < 0)
    return rc;
  const es_tdesc *x = k->in[0];
  int64_t shape[ES_MAX_RANK];
  size_t n;
  if ((rc = static_ints(k, 1, "shape", ES_MAX_RANK, ES_ENOTSUP, shape, &n)) < 0)
    return rc;
  int r = x->rank > (int)n ? x->rank : (int)n;
  int64_t dims[ES_MAX_RANK], ist[ES_MAX_RANK], ss[ES_MAX_RANK];
  es__strides_of(x->rank, x->dims, ist);
  for (int i = 0; i < r; i++) {
    int xi = i - (r - x->rank), si = i - (r - (int)n);
    int64_t a = xi >= 0 ? x->dims[xi] : 1, b = si >= 0 ? shape[si] : 1;
    if (b < 0)
      return ES_KFAIL(k, ES_EMODEL, "shape[%d] = %lld, expected >= 0", si, (long long)b);
    if (a != b && a != 1 && b != 1)
      return ES_KFAIL(k, ES_EMODEL, "input dim %d (%lld) does not broadcast to %lld", xi,
                      (long long)a, (long long)b);
    dims[i] = a == 1 ? b : a;
    ss[i] = a == dims[i] && xi >= 0 ? ist[xi] : 0;
  }
  if ((rc = out_set(k, 0, x->dtype, r, dims)) < 0)
    return rc;
  copy_plan *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  copy_plan_init(p, es_dtype_size(x->dtype), r, dims, ss, 0);
  if (p->identity)
    k->inplace = 0;
  k->params = p;
  return 0;
}

/* ==========================================================================
 * Tile
 * ======================================================================== */

typedef struct tile_params {
  int rank;
  size_t esz;
  int64_t in_dims[ES_MAX_RANK], reps[ES_MAX_RANK];
  int64_t out_st[ES_MAX_RANK]; /* output element strides */
  bool empty;
} tile_params;

static int tile_infer(es_kinst *k) {
  int rc = es__kio_check(k, 2, 2, 1, 1);
  if (rc < 0)
    return rc;
  const es_tdesc *x = k->in[0];
  int64_t reps[ES_MAX_RANK], dims[ES_MAX_RANK];
  size_t n;
  if ((rc = static_ints(k, 1, "repeats", ES_MAX_RANK, ES_EMODEL, reps, &n)) < 0)
    return rc;
  if (n != (size_t)x->rank)
    return ES_KFAIL(k, ES_EMODEL, "repeats has %zu values, expected the input rank %d", n,
                    x->rank);
  tile_params *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  for (int i = 0; i < x->rank; i++) {
    if (reps[i] < 0)
      return ES_KFAIL(k, ES_EMODEL, "repeats[%d] = %lld, expected >= 0", i, (long long)reps[i]);
    if (__builtin_mul_overflow(x->dims[i], reps[i], &dims[i]))
      return ES_KFAIL(k, ES_EMODEL, "repeats[%d] = %lld makes dim %d too large", i,
                      (long long)reps[i], i);
    p->in_dims[i] = x->dims[i];
    p->reps[i] = reps[i];
  }
  if ((rc = out_set(k, 0, x->dtype, x->rank, dims)) < 0)
    return rc;
  p->rank = x->rank;
  p->esz = es_dtype_size(x->dtype);
  p->empty = k->out[0]->count == 0;
  es__strides_of(x->rank, dims, p->out_st);
  k->params = p;
  return 0;
}

/* The input goes once to the first tile; then, from the last dim out, the
 * filled block of each dim (its first d elements, every inner dim already
 * complete) is copied r - 1 times after itself. Every output byte is
 * written once, mostly by large memcpys. */
static int tile_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  (void)scratch;
  const tile_params *p = k->params;
  if (p->empty)
    return 0;
  char *d = out[0];
  const char *s = in[0];
  size_t esz = p->esz;
  int r = p->rank;
  if (r == 0) {
    memcpy(d, s, esz);
    return 0;
  }
  int64_t idx[ES_MAX_RANK] = {0}, off = 0;
  size_t row = (size_t)p->in_dims[r - 1] * esz;
  do {
    memcpy(d + off * (int64_t)esz, s, row);
    s += row;
  } while (es__walk_step(r - 1, p->in_dims, idx, 1, &off, p->out_st) >= 0);
  for (int a = r - 1; a >= 0; a--) {
    if (p->reps[a] == 1)
      continue;
    size_t block = (size_t)p->in_dims[a] * (size_t)p->out_st[a] * esz;
    off = 0;
    do {
      char *b = d + off * (int64_t)esz;
      for (int64_t t = 1; t < p->reps[a]; t++)
        memcpy(b + (size_t)t * block, b, block);
    } while (es__walk_step(a, p->in_dims, idx, 1, &off, p->out_st) >= 0);
  }
  return 0;
}

/* ==========================================================================
 * Range
 * ======================================================================== */

typedef struct range_params {
  es_dtype dtype;
  int64_t n;
} range_params;

static int range_infer(es_kinst *k) {
  int rc = es__kio_check(k, 3, 3, 1, 1);
  if (rc < 0)
    return rc;
  static const char *const names[3] = {"start", "limit", "delta"};
  es_dtype dt = k->in[0]->dtype;
  if (dt != ES_DTYPE_FLOAT && dt != ES_DTYPE_INT32 && dt != ES_DTYPE_INT64)
    return ES_KFAIL(k, ES_EMODEL, "start is %s, expected float32, int32 or int64",
                    es_dtype_name(dt));
  for (int i = 0; i < 3; i++) {
    if (k->in[i]->dtype != dt)
      return ES_KFAIL(k, ES_EMODEL, "%s is %s, start %s", names[i],
                      es_dtype_name(k->in[i]->dtype), es_dtype_name(dt));
    if (k->in[i]->count != 1 || k->in[i]->rank > 1)
      return ES_KFAIL(k, ES_EMODEL, "%s has %zu elements, expected a scalar", names[i],
                      k->in[i]->count);
  }
  /* The output's length is the inputs' values: without them no plan can
   * size it. */
  for (int i = 0; i < 3; i++)
    if (!k->in_static || !k->in_static[i]) {
      k->data_needed = 1;
      return ES_KFAIL(k, ES_ENOTSUP, "%s (input %d) is not known when planning; Range's output "
                      "length depends on it", names[i], i);
    }
  const void *const *v = k->in_static;
  int64_t n;
  if (dt == ES_DTYPE_FLOAT) {
    double s = *(const float *)v[0], l = *(const float *)v[1], d = *(const float *)v[2];
    double c = ceil((l - s) / d);
    if (d == 0 || !(c == c) || c > (double)((int64_t)1 << 40))
      return ES_KFAIL(k, ES_EMODEL, "start %g, limit %g, delta %g give no finite length", s, l,
                      d);
    n = c > 0 ? (int64_t)c : 0;
  } else {
    __int128 s = es__static_i64(k->in[0], v[0], 0), l = es__static_i64(k->in[1], v[1], 0),
             d = es__static_i64(k->in[2], v[2], 0);
    if (d == 0)
      return ES_KFAIL(k, ES_EMODEL, "delta is 0");
    __int128 span = l - s;
    __int128 c = d > 0 ? (span + d - 1) / d : (span + d + 1) / d;
    if (c > ((__int128)1 << 40))
      return ES_KFAIL(k, ES_EMODEL, "start %lld, limit %lld, delta %lld give more than 2^40 "
                      "values", (long long)s, (long long)l, (long long)d);
    n = c > 0 ? (int64_t)c : 0;
  }
  range_params *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  p->dtype = dt;
  p->n = n;
  k->params = p;
  return out_set(k, 0, dt, 1, &n);
}

/* start + i * delta for each i, as numpy's arange (no accumulated error). */
static int range_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  (void)scratch;
  const range_params *p = k->params;
  if (p->dtype == ES_DTYPE_FLOAT) {
    double s = *(const float *)in[0], d = *(const float *)in[2];
    float *o = out[0];
    for (int64_t i = 0; i < p->n; i++)
      o[i] = (float)(s + (double)i * d);
    return 0;
  }
  /* Integers wrap like the type's own arithmetic (unsigned: no UB). */
  uint64_t s = (uint64_t)es__static_i64(k->in[0], in[0], 0);
  uint64_t d = (uint64_t)es__static_i64(k->in[2], in[2], 0);
  if (p->dtype == ES_DTYPE_INT64) {
    int64_t *o = out[0];
    for (int64_t i = 0; i < p->n; i++)
      o[i] = (int64_t)(s + (uint64_t)i * d);
  } else {
    int32_t *o = out[0];
    for (int64_t i = 0; i < p->n; i++)
      o[i] = (int32_t)(uint32_t)(s + (uint64_t)i * d);
  }
  return 0;
}

/* ==========================================================================
 * DepthToSpace, SpaceToDepth
 * ======================================================================== */

/* Both are a reshape to rank 6, a transpose and a reshape back: one strided
 * gather that walks the output in order over the six dims. */
static int d2s_infer(es_kinst *k) {
  int rc = es__kio_check(k, 1, 1, 1, 1);
  if (rc < 0)
    return rc;
  const es_tdesc *x = k->in[0];
  bool to_space = k->node.op == ES_OP_DepthToSpace;
  int64_t b;
  const char *mode = "DCR";
  if (!es__kattr(k, "blocksize"))
    return ES_KFAIL(k, ES_EMODEL, "attribute 'blocksize' is required");
  if ((rc = es__attr_int(k, "blocksize", 0, &b)) < 0 ||
      (to_space && (rc = es__attr_string(k, "mode", "DCR", &mode)) < 0))
    return rc;
  if (x->rank != 4)
    return ES_KFAIL(k, ES_EMODEL, "input has rank %d, expected 4", x->rank);
  int64_t bb;
  if (b < 1 || __builtin_mul_overflow(b, b, &bb))
    return ES_KFAIL(k, ES_EMODEL, "blocksize %lld, expected a positive size", (long long)b);
  bool crd = !strcmp(mode, "CRD");
  if (!crd && strcmp(mode, "DCR"))
    return ES_KFAIL(k, ES_EMODEL, "mode '%s', expected DCR or CRD", mode);
  int64_t N = x->dims[0], C = x->dims[1], H = x->dims[2], W = x->dims[3];
  /* Strides matter only when there are elements, and then nothing below
   * overflows (the count is at most 2^40). */
  int64_t HW = x->count ? H * W : 0;
  int64_t dims[4], n[6], ss[6];
  if (to_space) {
    if (C % bb)
      return ES_KFAIL(k, ES_EMODEL, "%lld channels do not divide by blocksize^2 = %lld",
                      (long long)C, (long long)bb);
    int64_t c2 = C / bb;
    dims[0] = N, dims[1] = c2;
    if (__builtin_mul_overflow(H, b, &dims[2]) || __builtin_mul_overflow(W, b, &dims[3]))
      return ES_KFAIL(k, ES_EMODEL, "blocksize %lld makes the output too large", (long long)b);
    /* Output walk (n, c', h, i, w, j); source channel (i*b + j)*C' + c'
     * (DCR) or c'*b*b + i*b + j (CRD). */
    int64_t wn[6] = {N, c2, H, b, W, b};
    int64_t ws[6] = {C * HW, crd ? bb * HW : HW, W, crd ? b * HW : b * c2 * HW, 1,
                     crd ? HW : c2 * HW};
    memcpy(n, wn, sizeof n);
    memcpy(ss, ws, sizeof ss);
  } else {
    if (H % b || W % b)
      return ES_KFAIL(k, ES_EMODEL, "spatial size %lldx%lld does not divide by blocksize %lld",
                      (long long)H, (long long)W, (long long)b);
    int64_t h2 = H / b, w2 = W / b;
    if (__builtin_mul_overflow(C, bb, &dims[1]))
      return ES_KFAIL(k, ES_EMODEL, "blocksize %lld makes too many channels", (long long)b);
    dims[0] = N, dims[2] = h2, dims[3] = w2;
    /* Output walk (n, i, j, c, h', w'): source (n, c, h'*b + i, w'*b + j). */
    int64_t wn[6] = {N, b, b, C, h2, w2};
    int64_t ws[6] = {C * HW, x->count ? W : 0, 1, HW, x->count ? b * W : 0, b};
    memcpy(n, wn, sizeof n);
    memcpy(ss, ws, sizeof ss);
  }
  if ((rc = out_set(k, 0, x->dtype, 4, dims)) < 0)
    return rc;
  copy_plan *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  copy_plan_init(p, es_dtype_size(x->dtype), 6, n, ss, 0);
  if (p->identity)
    k->inplace = 0;
  k->params = p;
  return 0;
}

/* ==========================================================================
 * Trilu
 * ======================================================================== */

typedef struct trilu_params {
  bool upper, has_k;
  int64_t mats, rows, cols;
  size_t esz;
} trilu_params;

static int trilu_infer(es_kinst *k) {
  int rc = es__kio_check(k, 1, 2, 1, 1);
  if (rc < 0)
    return rc;
  const es_tdesc *x = k->in[0];
  int64_t upper;
  if ((rc = es__attr_int(k, "upper", 1, &upper)) < 0)
    return rc;
  if (x->rank < 2)
    return ES_KFAIL(k, ES_EMODEL, "input has rank %d, expected at least 2", x->rank);
  trilu_params *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  if (k->n_in > 1 && k->in[1]) {
    const es_tdesc *kt = k->in[1];
    if (kt->dtype != ES_DTYPE_INT64 || kt->count != 1 || kt->rank > 1)
      return ES_KFAIL(k, ES_EMODEL, "k is %s with %zu elements, expected an int64 scalar",
                      es_dtype_name(kt->dtype), kt->count);
    p->has_k = true;
  }
  p->upper = upper != 0;
  p->rows = x->dims[x->rank - 2];
  p->cols = x->dims[x->rank - 1];
  p->mats = p->rows && p->cols ? (int64_t)(x->count / (size_t)(p->rows * p->cols)) : 0;
  p->esz = es_dtype_size(x->dtype);
  k->params = p;
  k->inplace = 0; /* each row is read before it is written */
  return out_set(k, 0, x->dtype, x->rank, x->dims);
}

/* k is read here, so it may change from one request to the next. */
static int trilu_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  (void)scratch;
  const trilu_params *p = k->params;
  int64_t kk = 0;
  if (p->has_k)
    memcpy(&kk, in[1], sizeof kk);
  int64_t lim = p->rows + p->cols; /* beyond it every k means the same */
  kk = kk < -lim ? -lim : kk > lim ? lim : kk;
  const char *s = in[0];
  char *d = out[0];
  size_t esz = p->esz, row = (size_t)p->cols * esz;
  for (int64_t m = 0; m < p->mats; m++)
    for (int64_t i = 0; i < p->rows; i++, s += row, d += row) {
      /* Keep columns [lo, hi): j >= i + k (upper) or j <= i + k (lower). */
      int64_t lo = p->upper ? i + kk : 0, hi = p->upper ? p->cols : i + kk + 1;
      lo = lo < 0 ? 0 : lo > p->cols ? p->cols : lo;
      hi = hi < lo ? lo : hi > p->cols ? p->cols : hi;
      if (d != s)
        memcpy(d + lo * (int64_t)esz, s + lo * (int64_t)esz, (size_t)(hi - lo) * esz);
      memset(d, 0, (size_t)lo * esz);
      memset(d + hi * (int64_t)esz, 0, (size_t)(p->cols - hi) * esz);
    }
  return 0;
}

/* ==========================================================================
 * OneHot
 * ======================================================================== */

/* Element i of a numeric tensor as an integer (floats truncated; NaN and
 * values beyond int64 give INT64_MIN, which no range holds). */
static int64_t elem_i64(es_dtype dt, const void *data, size_t i) {
  switch (dt) {
  case ES_DTYPE_FLOAT: {
    float f = ((const float *)data)[i];
    return f > -9.2e18f && f < 9.2e18f ? (int64_t)f : INT64_MIN;
  }
  case ES_DTYPE_INT64:
    return ((const int64_t *)data)[i];
  case ES_DTYPE_INT32:
    return ((const int32_t *)data)[i];
  case ES_DTYPE_INT8:
    return ((const int8_t *)data)[i];
  default:
    return ((const uint8_t *)data)[i];
  }
}

typedef struct onehot_params {
  es_dtype idx_dtype;
  int64_t outer, depth, inner; /* output [outer, depth, inner] */
  size_t esz, count;
} onehot_params;

static int onehot_infer(es_kinst *k) {
  int rc = es__kio_check(k, 3, 3, 1, 1);
  if (rc < 0)
    return rc;
  const es_tdesc *ind = k->in[0], *dep = k->in[1], *val = k->in[2];
  for (int i = 0; i < 2; i++)
    if (k->in[i]->dtype == ES_DTYPE_BOOL)
      return ES_KFAIL(k, ES_EMODEL, "%s is bool, expected a numeric type",
                      i ? "depth" : "indices");
  if (dep->count != 1 || dep->rank > 1)
    return ES_KFAIL(k, ES_EMODEL, "depth has %zu elements, expected one", dep->count);
  if (val->rank != 1 || val->count != 2)
    return ES_KFAIL(k, ES_EMODEL, "values has %zu elements in rank %d, expected [off, on]",
                    val->count, val->rank);
  if (!k->in_static || !k->in_static[1])
    return ES_KFAIL(k, ES_ENOTSUP, "depth (input 1) must be known when planning");
  int64_t depth = elem_i64(dep->dtype, k->in_static[1], 0), axis;
  if (depth < 0)
    return ES_KFAIL(k, ES_EMODEL, "depth is %lld, expected >= 0", (long long)depth);
  if ((rc = es__attr_int(k, "axis", -1, &axis)) < 0)
    return rc;
  int r = ind->rank + 1, a;
  if (r > ES_MAX_RANK)
    return ES_KFAIL(k, ES_ENOTSUP, "output rank %d exceeds the maximum %d", r, ES_MAX_RANK);
  if ((rc = es__axis_norm(k, axis, r, &a)) < 0)
    return rc;
  int64_t dims[ES_MAX_RANK];
  for (int i = 0, j = 0; i < r; i++)
    dims[i] = i == a ? depth : ind->dims[j++];
  if ((rc = out_set(k, 0, val->dtype, r, dims)) < 0)
    return rc;
  onehot_params *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  p->idx_dtype = ind->dtype;
  p->outer = dims_prod(ind->dims, 0, a);
  p->inner = dims_prod(ind->dims, a, ind->rank);
  p->depth = depth;
  p->esz = es_dtype_size(val->dtype);
  p->count = k->out[0]->count;
  k->params = p;
  return 0;
}

/* Every element off, then on where an index in [-depth, depth) points;
 * other indices leave their column off, as ONNX defines. */
static int onehot_run(const es_kinst *k, const void *const *in, void *const *out,
                      void *scratch) {
  (void)scratch;
  const onehot_params *p = k->params;
  const unsigned char *val = in[2];
  size_t esz = p->esz;
  char *d = out[0];
  elems_fill(d, val, (int64_t)p->count, esz);
  for (int64_t o = 0; o < p->outer; o++)
    for (int64_t i = 0; i < p->inner; i++) {
      int64_t v = elem_i64(p->idx_dtype, in[0], (size_t)(o * p->inner + i));
      if (v < 0 && v >= -p->depth)
        v += p->depth;
      if (v < 0 || v >= p->depth)
        continue;
      memcpy(d + ((o * p->depth + v) * p->inner + i) * (int64_t)esz, val + esz, esz);
    }
  return 0;
}

/* ==========================================================================
 * Size, EyeLike
 * ======================================================================== */

static int size_infer(es_kinst *k) {
  int rc = es__kio_check(k, 1, 1, 1, 1);
  if (rc < 0)
    return rc;
  int64_t *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  *p = (int64_t)k->in[0]->count;
  k->params = p;
  return out_set(k, 0, ES_DTYPE_INT64, 0, NULL);
}

static int size_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  (void)in, (void)scratch;
  memcpy(out[0], k->params, sizeof(int64_t));
  return 0;
}

/* ONNX's name of an element type the engine does not hold, for errors. */
static const char *onnx_dtype_name(int64_t t) {
  static const char *const names[] = {"undefined", "float32", "uint8", "int8", "uint16",
                                      "int16", "int32", "int64", "string", "bool", "float16",
                                      "double", "uint32", "uint64", "complex64", "complex128",
                                      "bfloat16"};
  return t >= 0 && t < (int64_t)(sizeof names / sizeof names[0]) ? names[t] : "unknown";
}

typedef struct eye_params {
  int64_t rows, cols, k;
  size_t esz;
  unsigned char one[8];
} eye_params;

static int eyelike_infer(es_kinst *k) {
  int rc = es__kio_check(k, 1, 1, 1, 1);
  if (rc < 0)
    return rc;
  const es_tdesc *x = k->in[0];
  int64_t dt, kk;
  if ((rc = es__attr_int(k, "dtype", x->dtype, &dt)) < 0 ||
      (rc = es__attr_int(k, "k", 0, &kk)) < 0)
    return rc;
  if (x->rank != 2)
    return ES_KFAIL(k, ES_EMODEL, "input has rank %d, expected 2", x->rank);
  if (dt < 0 || dt > INT32_MAX || es_dtype_size((es_dtype)dt) == 0)
    return ES_KFAIL(k, ES_ENOTSUP, "dtype %lld (%s) is not supported", (long long)dt,
                    onnx_dtype_name(dt));
  eye_params *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  p->rows = x->dims[0];
  p->cols = x->dims[1];
  p->k = kk;
  p->esz = es_dtype_size((es_dtype)dt);
  value_from_float((es_dtype)dt, 1.0f, p->one);
  k->params = p;
  return out_set(k, 0, (es_dtype)dt, 2, x->dims);
}

static int eyelike_run(const es_kinst *k, const void *const *in, void *const *out,
                       void *scratch) {
  (void)in, (void)scratch;
  const eye_params *p = k->params;
  char *d = out[0];
  memset(d, 0, (size_t)(p->rows * p->cols) * p->esz);
  /* Row i has its one at column i + k: rows [max(0, -k), cols - k). */
  if (p->k <= -p->rows || p->k >= p->cols)
    return 0;
  int64_t lo = p->k < 0 ? -p->k : 0, hi = p->cols - p->k;
  hi = hi > p->rows ? p->rows : hi;
  for (int64_t i = lo; i < hi; i++)
    memcpy(d + (i * p->cols + i + p->k) * (int64_t)p->esz, p->one, p->esz);
  return 0;
}

/* ==========================================================================
 * ReverseSequence
 * ======================================================================== */

typedef struct revseq_params {
  int64_t steps, batch;
  int64_t st_t, st_b; /* element strides of the time and batch axes */
  size_t inner;       /* bytes of one (time, batch) slab */
  size_t esz;
  bool lens64;
} revseq_params;

static int revseq_infer(es_kinst *k) {
  int rc = es__kio_check(k, 2, 2, 1, 1);
  if (rc < 0)
    return rc;
  const es_tdesc *x = k->in[0], *lens = k->in[1];
  int64_t ta, ba;
  if ((rc = es__attr_int(k, "time_axis", 0, &ta)) < 0 ||
      (rc = es__attr_int(k, "batch_axis", 1, &ba)) < 0)
    return rc;
  if (x->rank < 2)
    return ES_KFAIL(k, ES_EMODEL, "input has rank %d, expected at least 2", x->rank);
  if ((ta != 0 && ta != 1) || (ba != 0 && ba != 1) || ta == ba)
    return ES_KFAIL(k, ES_EMODEL, "time_axis %lld and batch_axis %lld, expected 0 and 1 in "
                    "either order", (long long)ta, (long long)ba);
  if ((lens->dtype != ES_DTYPE_INT64 && lens->dtype != ES_DTYPE_INT32) || lens->rank != 1 ||
      lens->dims[0] != x->dims[ba])
    return ES_KFAIL(k, ES_EMODEL, "sequence_lens is %s of %zu values, expected %lld int64",
                    es_dtype_name(lens->dtype), lens->count, (long long)x->dims[ba]);
  revseq_params *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  int64_t st[ES_MAX_RANK];
  es__strides_of(x->rank, x->dims, st);
  p->steps = x->dims[ta];
  p->batch = x->dims[ba];
  p->st_t = st[ta];
  p->st_b = st[ba];
  p->esz = es_dtype_size(x->dtype);
  p->inner = (size_t)st[1] * p->esz;
  p->lens64 = lens->dtype == ES_DTYPE_INT64;
  k->params = p;
  return out_set(k, 0, x->dtype, x->rank, x->dims);
}

/* Lengths are read per request and checked before anything moves. */
static int revseq_run(const es_kinst *k, const void *const *in, void *const *out,
                      void *scratch) {
  (void)scratch;
  const revseq_params *p = k->params;
  for (int64_t b = 0; b < p->batch; b++) {
    int64_t len = p->lens64 ? ((const int64_t *)in[1])[b] : ((const int32_t *)in[1])[b];
    if (len < 0 || len > p->steps)
      return ES_KFAIL(k, ES_EINVAL, "sequence_lens[%lld] = %lld is outside [0, %lld]",
                      (long long)b, (long long)len, (long long)p->steps);
  }
  int64_t esz = (int64_t)p->esz;
  const char *s = in[0];
  char *d = out[0];
  for (int64_t b = 0; b < p->batch; b++) {
    int64_t len = p->lens64 ? ((const int64_t *)in[1])[b] : ((const int32_t *)in[1])[b];
    for (int64_t t = 0; t < p->steps; t++) {
      int64_t from = t < len ? len - 1 - t : t;
      memcpy(d + (t * p->st_t + b * p->st_b) * esz, s + (from * p->st_t + b * p->st_b) * esz,
             p->inner);
    }
  }
  return 0;
}

/* ==========================================================================
 * Compress
 * ======================================================================== */

typedef struct compress_params {
  int64_t outer, dim, n_cond;
  size_t inner; /* bytes per index along the axis */
  int rank, axis;
  int64_t dims[ES_MAX_RANK]; /* the output's, the kept count at the axis set by run */
} compress_params;

/* The output's shape depends on the condition's values: every index kept
 * (as many as the condition and the axis both have) bounds it (kernel.h,
 * "Data-dependent shapes"), and run counts. A condition that selects past
 * the axis is the request's error. */
static int compress_infer(es_kinst *k) {
  int rc = es__kio_check(k, 2, 2, 1, 1);
  if (rc < 0)
    return rc;
  const es_tdesc *x = k->in[0], *c = k->in[1];
  if (c->dtype != ES_DTYPE_BOOL || c->rank != 1)
    return ES_KFAIL(k, ES_EMODEL, "condition is %s of rank %d, expected 1-D bool",
                    es_dtype_name(c->dtype), c->rank);
  compress_params *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  int a = -1;
  if (es__kattr(k, "axis")) {
    int64_t axis;
    if ((rc = es__attr_int(k, "axis", 0, &axis)) < 0)
      return rc;
    if (x->rank == 0)
      return ES_KFAIL(k, ES_EMODEL, "input is a scalar, expected rank >= 1 with an axis");
    if ((rc = es__axis_norm(k, axis, x->rank, &a)) < 0)
      return rc;
    p->rank = x->rank;
    memcpy(p->dims, x->dims, sizeof p->dims);
    p->outer = dims_prod(x->dims, 0, a);
    p->dim = x->dims[a];
    p->inner = (size_t)dims_prod(x->dims, a + 1, p->rank) * es_dtype_size(x->dtype);
  } else { /* the input flattened */
    p->rank = 1;
    p->outer = 1;
    p->dim = (int64_t)x->count;
    p->inner = es_dtype_size(x->dtype);
  }
  p->axis = a < 0 ? 0 : a;
  p->n_cond = (int64_t)c->count;
  int64_t most = p->n_cond < p->dim ? p->n_cond : p->dim;
  p->dims[p->axis] = most;
  k->params = p;
  k->out_bound = 1;
  k->bound_dims = 1u << p->axis;
  snprintf(k->bound_why, sizeof k->bound_why, "every one of %lld indices kept", (long long)most);
  return out_set(k, 0, x->dtype, p->rank, p->dims);
}

static int compress_run(const es_kinst *k, const void *const *in, void *const *out,
                        void *scratch) {
  (void)scratch;
  const compress_params *p = k->params;
  const uint8_t *cond = in[1];
  int64_t n = 0;
  for (int64_t i = 0; i < p->n_cond; i++) {
    if (!cond[i])
      continue;
    if (i >= p->dim)
      return ES_KFAIL(k, ES_EINVAL, "condition selects index %lld of an axis of %lld",
                      (long long)i, (long long)p->dim);
    n++;
  }
  int64_t dims[ES_MAX_RANK];
  memcpy(dims, p->dims, sizeof dims);
  dims[p->axis] = n;
  int rc = es__tdesc_set(k->out[0], k->out[0]->dtype, p->rank, dims);
  if (rc < 0)
    return rc;
  const char *s = in[0];
  char *d = out[0];
  for (int64_t o = 0; o < p->outer; o++, s += (size_t)p->dim * p->inner)
    for (int64_t i = 0; i < p->n_cond; i++)
      if (cond[i]) {
        memcpy(d, s + (size_t)i * p->inner, p->inner);
        d += p->inner;
      }
  return 0;
}

/* ==========================================================================
 * Family
 * ======================================================================== */

static const es_kernel k_shape = {shape_infer, shape_run, NULL, 1}; /* reads only dims */
static const es_kernel k_reshape = {reshape_infer, view_run, NULL, 0};
static const es_kernel k_squeeze = {squeeze_infer, view_run, NULL, 0};
static const es_kernel k_concat = {concat_infer, concat_run, NULL, 1};
static const es_kernel k_slice = {slice_infer, gather_run, NULL, 0};
static const es_kernel k_split = {split_infer, split_run, NULL, 1};
static const es_kernel k_transpose = {transpose_infer, gather_run, NULL, 1};
static const es_kernel k_pad = {pad_infer, pad_run, NULL, 1};
static const es_kernel k_constant_of_shape = {constant_of_shape_infer, constant_of_shape_run,
                                              NULL, 0};
static const es_kernel k_flatten = {flatten_infer, view_run, NULL, 0};
static const es_kernel k_unsqueeze = {unsqueeze_infer, view_run, NULL, 0};
static const es_kernel k_expand = {expand_infer, gather_run, NULL, 0};
static const es_kernel k_tile = {tile_infer, tile_run, NULL, 0};
static const es_kernel k_range = {range_infer, range_run, NULL, 0};
static const es_kernel k_d2s = {d2s_infer, gather_run, NULL, 0};
static const es_kernel k_trilu = {trilu_infer, trilu_run, NULL, 0};
static const es_kernel k_onehot = {onehot_infer, onehot_run, NULL, 0};
static const es_kernel k_size = {size_infer, size_run, NULL, 1}; /* reads only the count */
static const es_kernel k_eyelike = {eyelike_infer, eyelike_run, NULL, 0};
static const es_kernel k_revseq = {revseq_infer, revseq_run, NULL, 0};
static const es_kernel k_compress = {compress_infer, compress_run, NULL, 0};

const es_kernel *es__kernels_shape(es_op op) {
  switch (op) {
  case ES_OP_Shape:
    return &k_shape;
  case ES_OP_Reshape:
    return &k_reshape;
  case ES_OP_Squeeze:
    return &k_squeeze;
  case ES_OP_Concat:
    return &k_concat;
  case ES_OP_Slice:
    return &k_slice;
  case ES_OP_Split:
    return &k_split;
  case ES_OP_Transpose:
    return &k_transpose;
  case ES_OP_Pad:
    return &k_pad;
  case ES_OP_ConstantOfShape:
    return &k_constant_of_shape;
  case ES_OP_Flatten:
    return &k_flatten;
  case ES_OP_Unsqueeze:
    return &k_unsqueeze;
  case ES_OP_Expand:
    return &k_expand;
  case ES_OP_Tile:
    return &k_tile;
  case ES_OP_Range:
    return &k_range;
  case ES_OP_DepthToSpace:
  case ES_OP_SpaceToDepth:
    return &k_d2s;
  case ES_OP_Trilu:
    return &k_trilu;
  case ES_OP_OneHot:
    return &k_onehot;
  case ES_OP_Size:
    return &k_size;
  case ES_OP_EyeLike:
    return &k_eyelike;
  case ES_OP_ReverseSequence:
    return &k_revseq;
  case ES_OP_Compress:
    return &k_compress;
  default:
    return NULL;
  }
}
