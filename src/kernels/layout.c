/* Relayout: the planner's conversion between plain and channels-last
 * (NCHW <-> NHWC at rank 4, NCDHW <-> NDHWC at rank 5).
 *
 * Inserted where a tensor produced in one layout is read by a kernel that
 * wants the other (src/engine/plan.c). Per image it is a transpose of a
 * [C, pixels] matrix (pixels = H*W, or D*H*W), done in 16x16 tiles so both
 * the reads and the writes stay within a few cache lines at a time. Any
 * element size. */
#include "kernels/kernel.h"

#include <string.h>

typedef struct relayout_params {
  int64_t n, c, hw;
  size_t esz;
  int to_nhwc;
} relayout_params;

static int relayout_infer(es_kinst *k) {
  if (k->n_in != 1 || k->n_out != 1 || !k->in[0] || !k->out[0])
    return ES_KFAIL(k, ES_EMODEL, "needs one input and one output");
  int64_t to;
  int rc = es__attr_int(k, "to", ES_LAYOUT_PLAIN, &to);
  if (rc < 0)
    return rc;
  const es_tdesc *x = k->in[0];
  if (to != ES_LAYOUT_PLAIN && to != ES_LAYOUT_NHWC)
    return ES_KFAIL(k, ES_EMODEL, "'to' is %lld, not a layout", (long long)to);
  if (x->rank != 4 && x->rank != 5)
    return ES_KFAIL(k, ES_EMODEL, "only rank-4 and rank-5 tensors change layout, got rank %d",
                    x->rank);
  relayout_params *p = es__kinst_alloc(k, sizeof *p);
  if (!p)
    return ES_KFAIL(k, ES_ENOMEM, "out of memory for parameters");
  k->params = p;
  if ((rc = es__tdesc_set(k->out[0], x->dtype, x->rank, x->dims)) < 0)
    return rc;
  k->out[0]->layout = (es_layout)to;
  p->n = x->dims[0];
  p->c = x->dims[1];
  p->hw = 1;
  for (int i = 2; i < x->rank; i++)
    p->hw *= x->dims[i];
  p->esz = es_dtype_size(x->dtype);
  p->to_nhwc = to == ES_LAYOUT_NHWC && x->layout != ES_LAYOUT_NHWC;
  /* Same layout, or a tensor with one channel or one pixel: same bytes. */
  if (x->layout == (es_layout)to || p->c == 1 || p->hw == 1)
    k->inplace = 0;
  return 0;
}

/* dst[j][i] = src[i][j] for an r x c matrix of esz-byte elements. */
static void transpose2d(const unsigned char *restrict src, unsigned char *restrict dst,
                        int64_t r, int64_t c, size_t esz) {
  enum { T = 16 };
  if (esz == 1) {
    for (int64_t i0 = 0; i0 < r; i0 += T)
      for (int64_t j0 = 0; j0 < c; j0 += T) {
        int64_t i1 = i0 + T < r ? i0 + T : r, j1 = j0 + T < c ? j0 + T : c;
        for (int64_t j = j0; j < j1; j++)
          for (int64_t i = i0; i < i1; i++)
            dst[j * r + i] = src[i * c + j];
      }
    return;
  }
  if (esz == 4) {
    const float *s = (const float *)src;
    float *d = (float *)dst;
    for (int64_t i0 = 0; i0 < r; i0 += T)
      for (int64_t j0 = 0; j0 < c; j0 += T) {
        int64_t i1 = i0 + T < r ? i0 + T : r, j1 = j0 + T < c ? j0 + T : c;
        for (int64_t j = j0; j < j1; j++)
          for (int64_t i = i0; i < i1; i++)
            d[j * r + i] = s[i * c + j];
      }
    return;
  }
  for (int64_t i0 = 0; i0 < r; i0 += T)
    for (int64_t j0 = 0; j0 < c; j0 += T) {
      int64_t i1 = i0 + T < r ? i0 + T : r, j1 = j0 + T < c ? j0 + T : c;
      for (int64_t j = j0; j < j1; j++)
        for (int64_t i = i0; i < i1; i++)
          memcpy(dst + (size_t)(j * r + i) * esz, src + (size_t)(i * c + j) * esz, esz);
    }
}

/* Three-channel images (a model's RGB input): one pass over the pixels,
 * reading three planes and writing interleaved triples (or back). */
static void few_channels3(const float *restrict src, float *restrict dst, int64_t hw,
                          int to_nhwc) {
  if (to_nhwc) {
    const float *r = src, *g = src + hw, *bl = src + 2 * hw;
    for (int64_t i = 0; i < hw; i++) {
      dst[3 * i] = r[i];
      dst[3 * i + 1] = g[i];
      dst[3 * i + 2] = bl[i];
    }
  } else {
    float *r = dst, *g = dst + hw, *bl = dst + 2 * hw;
    for (int64_t i = 0; i < hw; i++) {
      r[i] = src[3 * i];
      g[i] = src[3 * i + 1];
      bl[i] = src[3 * i + 2];
    }
  }
}

/* The same for 8-bit images (a quantized model's input). */
static void few_channels3_u8(const uint8_t *restrict src, uint8_t *restrict dst, int64_t hw,
                             int to_nhwc) {
  if (to_nhwc) {
    const uint8_t *r = src, *g = src + hw, *bl = src + 2 * hw;
    for (int64_t i = 0; i < hw; i++) {
      dst[3 * i] = r[i];
      dst[3 * i + 1] = g[i];
      dst[3 * i + 2] = bl[i];
    }
  } else {
    uint8_t *r = dst, *g = dst + hw, *bl = dst + 2 * hw;
    for (int64_t i = 0; i < hw; i++) {
      r[i] = src[3 * i];
      g[i] = src[3 * i + 1];
      bl[i] = src[3 * i + 2];
    }
  }
}

static int relayout_run(const es_kinst *k, const void *const *in, void *const *out,
                        void *scratch) {
  (void)scratch;
  const relayout_params *p = k->params;
  size_t img = (size_t)(p->c * p->hw) * p->esz;
  if (k->inplace == 0) {
    if (out[0] != in[0])
      memmove(out[0], in[0], img * (size_t)p->n);
    return 0;
  }
  for (int64_t b = 0; b < p->n; b++) {
    const unsigned char *src = (const unsigned char *)in[0] + (size_t)b * img;
    unsigned char *dst = (unsigned char *)out[0] + (size_t)b * img;
    if (p->esz == 4 && p->c == 3) /* images: tiles would be 3 wide */
      few_channels3((const float *)src, (float *)dst, p->hw, p->to_nhwc);
    else if (p->esz == 1 && p->c == 3)
      few_channels3_u8(src, dst, p->hw, p->to_nhwc);
    else if (p->to_nhwc) /* [C, HW] -> [HW, C] */
      transpose2d(src, dst, p->c, p->hw, p->esz);
    else /* [HW, C] -> [C, HW] */
      transpose2d(src, dst, p->hw, p->c, p->esz);
  }
  return 0;
}

static const es_kernel relayout_kernel = {relayout_infer, relayout_run, NULL, ES_KLAYOUT_5D};

const es_kernel *es__kernels_layout(es_op op) {
  return op == ES_OP_Relayout ? &relayout_kernel : NULL;
}
