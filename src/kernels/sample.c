/* Sampling, placing and selecting: GridSample, RoiAlign, MaxUnpool, TopK,
 * and the determinant Det.
 *
 * GridSample reads X (float32 [N, C, D1..Dr]) at the points of a grid
 * ([N, O1..Or, r], normalised to [-1, 1], the last axis giving the
 * coordinates innermost first: x (the last dim), y, z). Opset 16 defines 2-D
 * only, with modes bilinear / nearest / bicubic; opset 20 any number of
 * spatial dims, with linear / nearest / cubic. It follows ONNX's reference
 * step by step: denormalise (align_corners picks which points -1 and 1
 * are); nearest rounds half to even; a coordinate outside the borders
 * (-0.5 and L - 0.5, or 0 and L - 1 with align_corners) is clamped
 * (border) or reflected (reflection); then every tap's index is padded
 * again by the same rule (zeros reads 0 outside). Interpolation is
 * separable, so each output point makes one list of taps (offset and
 * weight, at most 64: 2^r for linear, 4^r for cubic) used for every
 * channel. Coordinates that are NaN or huge become far-outside indices,
 * never an undefined float-to-integer conversion.
 *
 * RoiAlign pools each region of interest (rois [R, 4]: x1, y1, x2, y2 in
 * input coordinates times spatial_scale, on the image batch_indices names)
 * into an output_height x output_width grid of bins. Each bin averages (avg)
 * or takes the largest (max) of a grid of bilinear samples, sampling_ratio
 * per side or, when 0, ceil(bin size) per side. It follows ONNX's reference
 * (ONNX Runtime's kernel) exactly: half_pixel shifts coordinates by -0.5
 * (opset 16's default; opset 10 has only output_half_pixel, which instead
 * makes every roi at least 1 x 1); a sample more than one pixel outside the
 * image reads 0; max mode takes each sample's largest weighted corner (not
 * the interpolated value). Rois and batch indices are request data: run
 * checks each (a batch index out of range, a coordinate that is not finite
 * or an adaptive grid past RA_MAX_GRID samples per side is an error naming
 * the roi).
 *
 * MaxUnpool writes X into a zero output at MaxPool's indices, flat over
 * the whole unpooled tensor (N, C, then each spatial dim (in - 1) * stride
 * + kernel - pads), as MaxPool made them. A given output_shape (known
 * while planning) holds that tensor at its origin, the rest zeros: ONNX's
 * reference and its conformance test place it so (ONNX Runtime reads the
 * indices as flat over output_shape instead). Every
 * index is checked at run time: one outside is an error naming it.
 *
 * TopK keeps the k largest (or smallest) of each slice along the axis in
 * a heap of k indices (O(n log k), no allocation), then writes them best
 * first; equal values keep the lower index first, as ONNX requires, and
 * NaN counts as larger than any number (so the order is total). The
 * output is always sorted (sorted = 0 leaves the order to the engine). K
 * is an attribute before opset 10 and an input after. An input the plan
 * does not know makes the outputs' shape data-dependent: the axis' length
 * bounds it and run reads k (kernel.h, "Data-dependent shapes").
 *
 * NonMaxSuppression selects, per batch and class, the boxes scoring above
 * score_threshold, best first (ties: the lower box index), each kept when
 * its IoU with every box kept before it in its class is at most
 * iou_threshold, until max_output_boxes_per_class are kept; as ONNX
 * Runtime does, a box of zero area suppresses nothing. The output
 * [selected, 3] (batch, class, box) is data-dependent: bounded by batch x
 * classes x min(max_output_boxes_per_class, boxes) when that input is
 * known while planning, else by batch x classes x boxes. The candidates'
 * order is a sort of scratch indices (no allocation).
 *
 * Det factors each matrix by Gaussian elimination with partial pivoting,
 * in double. */
#include "kernels/kernel.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ==========================================================================
 * Shared checks
 * ======================================================================== */

static int out_set(es_kinst *k, int o, es_dtype dt, int rank, const int64_t *dims) {
  int rc = es__tdesc_set(k->out[o], dt, rank, dims);
  if (rc < 0)
    return ES_KFAIL(k, rc, "output %d: %s", o, es_last_error_detail());
  return 0;
}

static int64_t dims_prod(const int64_t *dims, int a, int b) {
  int64_t n = 1;
  for (int i = a; i < b; i++)
    n *= dims[i];
  return n;
}

/* ==========================================================================
 * GridSample
 * ======================================================================== */

enum { GS_NEAREST, GS_LINEAR, GS_CUBIC };
enum { GS_ZEROS, GS_BORDER, GS_REFLECTION };
#define GS_MAX_TAPS 64

typedef struct gs_params {
  int r;                      /* spatial dims */
  int mode, pad, align;
  int64_t n, c;               /* batch, channels */
  int64_t len[ES_MAX_RANK];   /* X's spatial dims */
  int64_t st[ES_MAX_RANK];    /* their strides within one channel */
  int64_t plane;              /* elements of one channel of X */
  int64_t points;             /* output points per channel */
  bool x_empty;               /* X has no element: every point reads padding */
} gs_params;

static int gs_infer(es_kinst *k) {
  int rc = es__kio_check(k, 2, 2, 1, 1);
  if (rc < 0)
    return rc;
  const es_tdesc *x = k->in[0], *g = k->in[1];
  int v20 = k->opset >= 20;
  if (x->dtype != ES_DTYPE_FLOAT || g->dtype != ES_DTYPE_FLOAT)
    return ES_KFAIL(k, ES_ENOTSUP, "X is %s and grid %s, only float32 is supported",
                    es_dtype_name(x->dtype), es_dtype_name(g->dtype));
  if (v20 ? x->rank < 3 : x->rank != 4)
    return ES_KFAIL(k, ES_EMODEL, "X has rank %d, expected %s", x->rank,
                    v20 ? "at least 3 ([N, C, D1...])" : "4 ([N, C, H, W]) before opset 20");
  int r = x->rank - 2;
  if (g->rank != x->rank || g->dims[0] != x->dims[0] || g->dims[g->rank - 1] != r)
    return ES_KFAIL(k, ES_EMODEL, "grid's shape does not match X: expected [%lld, ..., %d] of "
                    "rank %d", (long long)x->dims[0], r, x->rank);
  const char *mode, *pad;
  int64_t align;
  if ((rc = es__attr_string(k, "mode", v20 ? "linear" : "bilinear", &mode)) < 0 ||
      (rc = es__attr_string(k, "padding_mode", "zeros", &pad)) < 0 ||
      (rc = es__attr_int(k, "align_corners", 0, &align)) < 0)
    return rc;
  gs_params *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  if (!strcmp(mode, "nearest"))
    p->mode = GS_NEAREST;
  else if (!strcmp(mode, v20 ? "linear" : "bilinear"))
    p->mode = GS_LINEAR;
  else if (!strcmp(mode, v20 ? "cubic" : "bicubic"))
    p->mode = GS_CUBIC;
  else
    return ES_KFAIL(k, ES_EMODEL, "mode '%s' is not one of %s at opset %lld", mode,
                    v20 ? "linear, nearest, cubic" : "bilinear, nearest, bicubic",
                    (long long)k->opset);
  if (!strcmp(pad, "zeros"))
    p->pad = GS_ZEROS;
  else if (!strcmp(pad, "border"))
    p->pad = GS_BORDER;
  else if (!strcmp(pad, "reflection"))
    p->pad = GS_REFLECTION;
  else
    return ES_KFAIL(k, ES_EMODEL, "padding_mode '%s' is not zeros, border or reflection", pad);
  if (align != 0 && align != 1)
    return ES_KFAIL(k, ES_EMODEL, "align_corners is %lld, expected 0 or 1", (long long)align);
  int taps = p->mode == GS_NEAREST ? 1 : 1 << ((p->mode == GS_CUBIC ? 2 : 1) * r);
  if (r > 6 || taps > GS_MAX_TAPS)
    return ES_KFAIL(k, ES_ENOTSUP, "%s sampling in %d spatial dimensions is not supported "
                    "(at most %d taps per point)", mode, r, GS_MAX_TAPS);
  p->r = r;
  p->align = (int)align;
  p->n = x->dims[0];
  p->c = x->dims[1];
  for (int d = 0; d < r; d++)
    p->len[d] = x->dims[2 + d];
  es__strides_of(r, p->len, p->st);
  p->plane = dims_prod(x->dims, 2, x->rank);
  p->points = dims_prod(g->dims, 1, g->rank - 1);
  p->x_empty = x->count == 0;
  k->params = p;
  int64_t dims[ES_MAX_RANK];
  dims[0] = p->n;
  dims[1] = p->c;
  for (int d = 0; d < r; d++)
    dims[2 + d] = g->dims[1 + d];
  return out_set(k, 0, ES_DTYPE_FLOAT, x->rank, dims);
}

/* v reflected into [lo, hi] by the nearer border, as often as needed. */
static double gs_reflect(double v, double lo, double hi) {
  double rng = hi - lo;
  if (rng <= 0)
    return lo;
  if (v < lo) {
    double dx = lo - v, n = floor(dx / rng), rem = dx - n * rng;
    return fmod(n, 2.0) == 0 ? lo + rem : hi - rem;
  }
  if (v > hi) {
    double dx = v - hi, n = floor(dx / rng), rem = dx - n * rng;
    return fmod(n, 2.0) == 0 ? hi - rem : lo + rem;
  }
  return v;
}

/* An index from a double known to be integral or about to be floored:
 * NaN and magnitudes past 2^50 become far-outside indices. */
static int64_t gs_index(double v) {
  const double big = (double)((int64_t)1 << 50);
  if (!(v > -big))
    return -((int64_t)1 << 50);
  if (v > big)
    return (int64_t)1 << 50;
  return (int64_t)v;
}

/* Index i of a spatial dim of length len padded by the mode's rule, or -1
 * (reads zero). */
static int64_t gs_pad_index(const gs_params *p, int64_t i, int64_t len, double lo, double hi) {
  if (i >= 0 && i < len)
    return i;
  if (p->pad == GS_ZEROS)
    return -1;
  if (p->pad == GS_BORDER)
    return i < 0 ? 0 : len - 1;
  int64_t j = gs_index(gs_reflect((double)i, lo, hi));
  return j < 0 ? 0 : j >= len ? len - 1 : j;
}

/* Keys' cubic convolution coefficients (alpha -0.75) for fraction t. */
static void gs_cubic_coeffs(double t, double *c) {
  const double a = -0.75;
  double x = t + 1;
  c[0] = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
  c[1] = ((a + 2) * t - (a + 3)) * t * t + 1;
  x = 1 - t;
  c[2] = ((a + 2) * x - (a + 3)) * x * x + 1;
  x = 2 - t;
  c[3] = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
}

/* The taps of one point: offsets within a channel (-1: zero) and weights;
 * returns how many. */
static int gs_taps(const gs_params *p, const float *g, int64_t *off, double *w) {
  int64_t di[ES_MAX_RANK][4];
  double dw[ES_MAX_RANK][4];
  int nt = p->mode == GS_NEAREST ? 1 : p->mode == GS_LINEAR ? 2 : 4;
  for (int d = 0; d < p->r; d++) {
    double len = (double)p->len[d];
    double nx = g[p->r - 1 - d];
    double x = p->align ? (nx + 1) / 2 * (len - 1) : ((nx + 1) * len - 1) / 2;
    double lo = p->align ? 0 : -0.5, hi = p->align ? len - 1 : len - 0.5;
    if (p->mode == GS_NEAREST)
      x = nearbyint(x);
    if (x < lo || x > hi) {
      if (p->pad == GS_BORDER)
        x = x < 0 ? 0 : x > len - 1 ? len - 1 : x;
      else if (p->pad == GS_REFLECTION)
        x = gs_reflect(x, lo, hi);
    }
    if (p->mode == GS_NEAREST) {
      di[d][0] = gs_pad_index(p, gs_index(x), p->len[d], lo, hi);
      dw[d][0] = 1;
      continue;
    }
    double f = floor(x);
    int64_t i0 = gs_index(f);
    double t = x - f;
    if (p->mode == GS_LINEAR) {
      dw[d][0] = 1 - t;
      dw[d][1] = t;
    } else {
      gs_cubic_coeffs(t, dw[d]);
      i0 -= 1;
    }
    for (int j = 0; j < nt; j++)
      di[d][j] = gs_pad_index(p, i0 + j, p->len[d], lo, hi);
  }
  /* every combination of one tap per dim, the last dim fastest */
  int total = 1;
  for (int d = 0; d < p->r; d++)
    total *= nt;
  for (int c = 0; c < total; c++) {
    int64_t o = 0;
    double wt = 1;
    for (int d = p->r - 1, rest = c; d >= 0; d--, rest /= nt) {
      int j = rest % nt;
      if (di[d][j] < 0)
        o = -1;
      else if (o >= 0)
        o += di[d][j] * p->st[d];
      wt *= dw[d][j];
    }
    off[c] = o;
    w[c] = wt;
  }
  return total;
}

static int gs_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  (void)scratch;
  const gs_params *p = k->params;
  const float *x = in[0], *grid = in[1];
  float *y = out[0];
  int64_t off[GS_MAX_TAPS];
  double w[GS_MAX_TAPS];
  for (int64_t n = 0; n < p->n; n++)
    for (int64_t q = 0; q < p->points; q++) {
      float *yq = y + n * p->c * p->points + q;
      if (p->x_empty) {
        for (int64_t c = 0; c < p->c; c++)
          yq[c * p->points] = 0;
        continue;
      }
      int nt = gs_taps(p, grid + (n * p->points + q) * p->r, off, w);
      const float *xn = x + n * p->c * p->plane;
      for (int64_t c = 0; c < p->c; c++) {
        const float *xc = xn + c * p->plane;
        double s = 0;
        for (int t = 0; t < nt; t++)
          if (off[t] >= 0)
            s += w[t] * (double)xc[off[t]];
        yq[c * p->points] = (float)s;
      }
    }
  return 0;
}

/* ==========================================================================
 * RoiAlign
 * ======================================================================== */

/* Adaptive sampling makes ceil(bin size) samples per side; a roi whose bins
 * would need more than this is refused rather than computed for minutes. */
#define RA_MAX_GRID 1024

typedef struct ra_params {
  int64_t n, c, h, w;   /* X */
  int64_t rois;         /* R */
  int64_t oh, ow;       /* output_height, output_width */
  int64_t ratio;        /* sampling_ratio; 0: adaptive */
  float scale;          /* spatial_scale */
  int half_pixel;
  int max_mode;
} ra_params;

static int ra_infer(es_kinst *k) {
  int rc = es__kio_check(k, 3, 3, 1, 1);
  if (rc < 0)
    return rc;
  const es_tdesc *x = k->in[0], *r = k->in[1], *bi = k->in[2];
  if (x->dtype != ES_DTYPE_FLOAT || r->dtype != ES_DTYPE_FLOAT)
    return ES_KFAIL(k, ES_ENOTSUP, "X is %s and rois %s, only float32 is supported",
                    es_dtype_name(x->dtype), es_dtype_name(r->dtype));
  if (bi->dtype != ES_DTYPE_INT64)
    return ES_KFAIL(k, ES_EMODEL, "batch_indices is %s, expected int64",
                    es_dtype_name(bi->dtype));
  if (x->rank != 4)
    return ES_KFAIL(k, ES_EMODEL, "X has rank %d, expected 4 ([N, C, H, W])", x->rank);
  if (r->rank != 2 || r->dims[1] != 4)
    return ES_KFAIL(k, ES_EMODEL, "rois must have shape [num_rois, 4]");
  if (bi->rank != 1 || bi->dims[0] != r->dims[0])
    return ES_KFAIL(k, ES_EMODEL, "batch_indices must have shape [%lld] (one per roi)",
                    (long long)r->dims[0]);
  const char *mode, *ctm = "output_half_pixel";
  int64_t oh, ow, ratio;
  float scale;
  if ((rc = es__attr_string(k, "mode", "avg", &mode)) < 0 ||
      (rc = es__attr_int(k, "output_height", 1, &oh)) < 0 ||
      (rc = es__attr_int(k, "output_width", 1, &ow)) < 0 ||
      (rc = es__attr_int(k, "sampling_ratio", 0, &ratio)) < 0 ||
      (rc = es__attr_float(k, "spatial_scale", 1.0f, &scale)) < 0)
    return rc;
  if (k->opset >= 16 &&
      (rc = es__attr_string(k, "coordinate_transformation_mode", "half_pixel", &ctm)) < 0)
    return rc;
  ra_params *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  if (!strcmp(mode, "avg"))
    p->max_mode = 0;
  else if (!strcmp(mode, "max"))
    p->max_mode = 1;
  else
    return ES_KFAIL(k, ES_EMODEL, "mode '%s' is not avg or max", mode);
  if (!strcmp(ctm, "half_pixel"))
    p->half_pixel = 1;
  else if (!strcmp(ctm, "output_half_pixel"))
    p->half_pixel = 0;
  else
    return ES_KFAIL(k, ES_EMODEL, "coordinate_transformation_mode '%s' is not half_pixel or "
                    "output_half_pixel", ctm);
  if (oh < 1 || ow < 1 || oh > (1 << 20) || ow > (1 << 20))
    return ES_KFAIL(k, ES_EMODEL, "output_height %lld and output_width %lld must be 1 to 2^20",
                    (long long)oh, (long long)ow);
  if (ratio < 0 || ratio > RA_MAX_GRID)
    return ES_KFAIL(k, ES_EMODEL, "sampling_ratio is %lld, expected 0 (adaptive) to %d",
                    (long long)ratio, RA_MAX_GRID);
  if (!isfinite(scale))
    return ES_KFAIL(k, ES_EMODEL, "spatial_scale is not finite");
  p->n = x->dims[0];
  p->c = x->dims[1];
  p->h = x->dims[2];
  p->w = x->dims[3];
  p->rois = r->dims[0];
  p->oh = oh;
  p->ow = ow;
  p->ratio = ratio;
  p->scale = scale;
  k->params = p;
  int64_t dims[4] = {p->rois, p->c, oh, ow};
  return out_set(k, 0, ES_DTYPE_FLOAT, 4, dims);
}

/* One bilinear sample: the four corners' offsets within a channel and
 * their weights (all zero for a sample more than a pixel outside). */
typedef struct ra_sample {
  int64_t o[4];
  float w[4];
} ra_sample;

static void ra_sample_at(const ra_params *p, double y, double x, ra_sample *s) {
  if (y < -1.0 || y > (double)p->h || x < -1.0 || x > (double)p->w) {
    memset(s, 0, sizeof *s);
    return;
  }
  if (y <= 0)
    y = 0;
  if (x <= 0)
    x = 0;
  int64_t y0 = (int64_t)y, x0 = (int64_t)x, y1, x1;
  if (y0 >= p->h - 1) {
    y0 = y1 = p->h - 1;
    y = (double)y0;
  } else {
    y1 = y0 + 1;
  }
  if (x0 >= p->w - 1) {
    x0 = x1 = p->w - 1;
    x = (double)x0;
  } else {
    x1 = x0 + 1;
  }
  double ly = y - (double)y0, lx = x - (double)x0, hy = 1 - ly, hx = 1 - lx;
  s->o[0] = y0 * p->w + x0;
  s->o[1] = y0 * p->w + x1;
  s->o[2] = y1 * p->w + x0;
  s->o[3] = y1 * p->w + x1;
  s->w[0] = (float)(hy * hx);
  s->w[1] = (float)(hy * lx);
  s->w[2] = (float)(ly * hx);
  s->w[3] = (float)(ly * lx);
}

/* Samples per side of a bin of the given size: sampling_ratio, or
 * ceil(size) when adaptive (0 or negative sizes give none). -1 when too
 * many. */
static int64_t ra_grid(const ra_params *p, double size) {
  if (p->ratio > 0)
    return p->ratio;
  double g = ceil(size);
  if (!(g <= RA_MAX_GRID))
    return -1;
  return g > 0 ? (int64_t)g : 0;
}

static int ra_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  (void)scratch;
  const ra_params *p = k->params;
  const float *x = in[0], *rois = in[1];
  const int64_t *bidx = in[2];
  float *y = out[0];
  int64_t plane = p->h * p->w, bins = p->oh * p->ow;
  double off = p->half_pixel ? 0.5 : 0;
  for (int64_t r = 0; r < p->rois; r++) {
    const float *roi = rois + r * 4;
    int64_t b = bidx[r];
    if (b < 0 || b >= p->n)
      return ES_KFAIL(k, ES_EINVAL, "roi %lld: batch index %lld is outside X's batch of %lld",
                      (long long)r, (long long)b, (long long)p->n);
    for (int i = 0; i < 4; i++)
      if (!isfinite(roi[i]))
        return ES_KFAIL(k, ES_EINVAL, "roi %lld: coordinate %d is not finite", (long long)r, i);
    double x1 = roi[0] * (double)p->scale - off, y1 = roi[1] * (double)p->scale - off;
    double rw = roi[2] * (double)p->scale - off - x1, rh = roi[3] * (double)p->scale - off - y1;
    if (!p->half_pixel) { /* output_half_pixel: rois are at least 1 x 1 */
      rw = rw > 1 ? rw : 1;
      rh = rh > 1 ? rh : 1;
    }
    double bh = rh / (double)p->oh, bw = rw / (double)p->ow;
    int64_t gh = ra_grid(p, bh), gw = ra_grid(p, bw);
    if (gh < 0 || gw < 0)
      return ES_KFAIL(k, ES_EINVAL, "roi %lld: adaptive sampling would take more than %d "
                      "samples per side of a bin", (long long)r, RA_MAX_GRID);
    double count = gh * gw > 0 ? (double)(gh * gw) : 1;
    const float *xb = x + b * p->c * plane;
    float *yr = y + r * p->c * bins;
    if (plane == 0 || gh * gw == 0) { /* nothing to sample: zeros, as the reference gives */
      for (int64_t i = 0; i < p->c * bins; i++)
        yr[i] = 0;
      continue;
    }
    for (int64_t ph = 0; ph < p->oh; ph++)
      for (int64_t pw = 0; pw < p->ow; pw++) {
        float *yo = yr + ph * p->ow + pw;
        for (int64_t iy = 0; iy < gh; iy++) {
          double sy = y1 + (double)ph * bh + ((double)iy + 0.5) * bh / (double)gh;
          for (int64_t ix = 0; ix < gw; ix++) {
            double sx = x1 + (double)pw * bw + ((double)ix + 0.5) * bw / (double)gw;
            ra_sample s;
            ra_sample_at(p, sy, sx, &s);
            int first = iy == 0 && ix == 0;
            for (int64_t c = 0; c < p->c; c++) {
              const float *xc = xb + c * plane;
              float *o = yo + c * bins;
              if (p->max_mode) {
                float v = s.w[0] * xc[s.o[0]];
                for (int j = 1; j < 4; j++) {
                  float t = s.w[j] * xc[s.o[j]];
                  v = t > v ? t : v;
                }
                *o = first || v > *o ? v : *o;
              } else {
                float v = s.w[0] * xc[s.o[0]] + s.w[1] * xc[s.o[1]] + s.w[2] * xc[s.o[2]] +
                          s.w[3] * xc[s.o[3]];
                *o = first ? v : *o + v;
              }
            }
          }
        }
        if (!p->max_mode)
          for (int64_t c = 0; c < p->c; c++)
            yo[c * bins] = (float)(yo[c * bins] / count);
      }
  }
  return 0;
}

/* ==========================================================================
 * MaxUnpool
 * ======================================================================== */

typedef struct unpool_params {
  int64_t count;                /* X's elements */
  int64_t itotal;               /* elements of the unpooled shape (the indices' space) */
  int rank;
  int64_t idims[ES_MAX_RANK];   /* the unpooled shape */
  int64_t odims[ES_MAX_RANK];   /* the output's shape */
  int64_t ost[ES_MAX_RANK];     /* the output's strides */
  int64_t ototal;
  bool same;                    /* the output is the unpooled shape */
  size_t esz;
  bool i64;
} unpool_params;

static int unpool_infer(es_kinst *k) {
  int rc = es__kio_check(k, 2, 3, 1, 1);
  if (rc < 0)
    return rc;
  const es_tdesc *x = k->in[0], *ind = k->in[1];
  if (x->rank < 3)
    return ES_KFAIL(k, ES_EMODEL, "X has rank %d, expected at least 3 ([N, C, D1...])",
                    x->rank);
  if (ind->dtype != ES_DTYPE_INT64 && ind->dtype != ES_DTYPE_INT32)
    return ES_KFAIL(k, ES_EMODEL, "I is %s, expected int64", es_dtype_name(ind->dtype));
  if (!es__tdesc_same_shape(x, ind))
    return ES_KFAIL(k, ES_EMODEL, "I's shape differs from X's");
  int r = x->rank - 2;
  const int64_t *ks, *strides, *pads;
  size_t nk, ns, np;
  if ((rc = es__attr_ints(k, "kernel_shape", &ks, &nk)) < 0 ||
      (rc = es__attr_ints(k, "strides", &strides, &ns)) < 0 ||
      (rc = es__attr_ints(k, "pads", &pads, &np)) < 0)
    return rc;
  if (nk != (size_t)r)
    return ES_KFAIL(k, ES_EMODEL, "kernel_shape has %zu values, expected %d (one per spatial "
                    "dim)", nk, r);
  if ((ns && ns != (size_t)r) || (np && np != 2 * (size_t)r))
    return ES_KFAIL(k, ES_EMODEL, "strides has %zu values and pads %zu, expected %d and %d", ns,
                    np, r, 2 * r);
  unpool_params *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  p->rank = x->rank;
  p->idims[0] = x->dims[0];
  p->idims[1] = x->dims[1];
  for (int d = 0; d < r; d++) {
    int64_t s = ns ? strides[d] : 1, pb = np ? pads[d] : 0, pe = np ? pads[r + d] : 0;
    const int64_t lim = (int64_t)1 << 32;
    if (ks[d] < 1 || s < 1 || pb < 0 || pe < 0 || ks[d] > lim || s > lim || pb > lim || pe > lim)
      return ES_KFAIL(k, ES_EMODEL, "spatial dim %d: kernel %lld, stride %lld, pads %lld and "
                      "%lld (kernel and stride >= 1, pads >= 0, each below 2^32)", d,
                      (long long)ks[d], (long long)s, (long long)pb, (long long)pe);
    int64_t v = x->dims[2 + d] ? (x->dims[2 + d] - 1) * s + ks[d] - pb - pe : 0;
    if (v < 0)
      return ES_KFAIL(k, ES_EMODEL, "spatial dim %d of the unpooled shape would be %lld", d,
                      (long long)v);
    p->idims[2 + d] = v;
  }
  es_tdesc ishape;
  if ((rc = es__tdesc_set(&ishape, x->dtype, x->rank, p->idims)) < 0)
    return ES_KFAIL(k, rc, "the unpooled shape: %s", es_last_error_detail());
  p->itotal = (int64_t)ishape.count;
  memcpy(p->odims, p->idims, sizeof p->odims);
  if (k->n_in > 2 && k->in[2]) {
    const es_tdesc *os = k->in[2];
    if (os->dtype != ES_DTYPE_INT64 && os->dtype != ES_DTYPE_INT32)
      return ES_KFAIL(k, ES_EMODEL, "output_shape is %s, expected int64",
                      es_dtype_name(os->dtype));
    if (os->rank != 1 || os->count != (size_t)x->rank)
      return ES_KFAIL(k, ES_EMODEL, "output_shape has %zu values, expected %d (X's rank)",
                      os->count, x->rank);
    if (!k->in_static || !k->in_static[2])
      return ES_KFAIL(k, ES_ENOTSUP, "output_shape (input 2) is not known when planning; the "
                      "output's shape depends on it (data-dependent shapes are not supported)");
    for (int i = 0; i < x->rank; i++)
      p->odims[i] = es__static_i64(os, k->in_static[2], (size_t)i);
  }
  if ((rc = out_set(k, 0, x->dtype, x->rank, p->odims)) < 0)
    return rc;
  es__strides_of(p->rank, p->odims, p->ost);
  p->ototal = (int64_t)k->out[0]->count;
  p->same = es__tdesc_same_shape(&ishape, k->out[0]);
  p->count = (int64_t)x->count;
  p->esz = es_dtype_size(x->dtype);
  p->i64 = ind->dtype == ES_DTYPE_INT64;
  k->params = p;
  return 0;
}

/* Indices are flat over the unpooled shape (MaxPool's input); a given
 * output_shape holds that shape at its origin, the rest zeros, as ONNX's
 * reference places it. An element whose position lies outside a smaller
 * output_shape is an error, not silently dropped. */
static int unpool_run(const es_kinst *k, const void *const *in, void *const *out,
                      void *scratch) {
  (void)scratch;
  const unpool_params *p = k->params;
  const char *x = in[0];
  char *y = out[0];
  memset(y, 0, (size_t)p->ototal * p->esz);
  for (int64_t i = 0; i < p->count; i++) {
    int64_t v = p->i64 ? ((const int64_t *)in[1])[i] : ((const int32_t *)in[1])[i];
    if (v < 0 || v >= p->itotal)
      return ES_KFAIL(k, ES_EINVAL, "index %lld (I element %lld) is outside the unpooled "
                      "shape's %lld elements", (long long)v, (long long)i,
                      (long long)p->itotal);
    int64_t at = v;
    if (!p->same) {
      at = 0;
      for (int d = p->rank - 1; d >= 0; d--) {
        int64_t c = v % p->idims[d];
        v /= p->idims[d];
        if (c >= p->odims[d])
          return ES_KFAIL(k, ES_EINVAL, "index (I element %lld) lands at %lld along dim %d, "
                          "outside output_shape's %lld", (long long)i, (long long)c, d,
                          (long long)p->odims[d]);
        at += c * p->ost[d];
      }
    }
    memcpy(y + (size_t)at * p->esz, x + (size_t)i * p->esz, p->esz);
  }
  return 0;
}

/* ==========================================================================
 * TopK
 * ======================================================================== */

typedef struct topk_params {
  int64_t outer, n, inner, kk; /* kk < 0: k from the data */
  int axis;
  es_dtype dt;
  int largest;
  bool vals, idx; /* which outputs are wanted */
} topk_params;

static int topk_infer(es_kinst *k) {
  int old = k->opset < 10;
  int rc = es__kio_check(k, old ? 1 : 2, old ? 1 : 2, 1, 2);
  if (rc < 0)
    return rc;
  const es_tdesc *x = k->in[0];
  es_dtype dt = x->dtype;
  if (dt != ES_DTYPE_FLOAT && dt != ES_DTYPE_INT32 && dt != ES_DTYPE_INT64 &&
      dt != ES_DTYPE_INT8 && dt != ES_DTYPE_UINT8)
    return ES_KFAIL(k, ES_ENOTSUP, "X is %s (float32, int32, int64, int8, uint8 supported)",
                    es_dtype_name(dt));
  if (x->rank < 1)
    return ES_KFAIL(k, ES_EMODEL, "X is a scalar, expected rank >= 1");
  int64_t axis_attr, largest = 1, sorted = 1, kk;
  int axis;
  if ((rc = es__attr_int(k, "axis", -1, &axis_attr)) < 0 ||
      (rc = es__axis_norm(k, axis_attr, x->rank, &axis)) < 0)
    return rc;
  if (k->opset >= 11 && ((rc = es__attr_int(k, "largest", 1, &largest)) < 0 ||
                         (rc = es__attr_int(k, "sorted", 1, &sorted)) < 0))
    return rc;
  if ((largest != 0 && largest != 1) || (sorted != 0 && sorted != 1))
    return ES_KFAIL(k, ES_EMODEL, "largest (%lld) and sorted (%lld) must be 0 or 1",
                    (long long)largest, (long long)sorted);
  if (old) {
    if (!es__kattr(k, "k"))
      return ES_KFAIL(k, ES_EMODEL, "attribute k is missing");
    if ((rc = es__attr_int(k, "k", 0, &kk)) < 0)
      return rc;
  } else {
    const es_tdesc *kt = k->in[1];
    if (kt->dtype != ES_DTYPE_INT64 || kt->count != 1 || kt->rank > 1)
      return ES_KFAIL(k, ES_EMODEL, "K is %s with %zu elements, expected one int64",
                      es_dtype_name(kt->dtype), kt->count);
    if (!k->in_static || !k->in_static[1])
      kk = -1; /* read by run: the axis' length bounds it */
    else
      kk = *(const int64_t *)k->in_static[1];
  }
  int from_data = kk < 0 && !old && !(k->in_static && k->in_static[1]);
  if (from_data)
    kk = x->dims[axis];
  if (kk < 0 || kk > x->dims[axis])
    return ES_KFAIL(k, ES_EMODEL, "k is %lld, expected 0 to %lld (the axis' length)",
                    (long long)kk, (long long)x->dims[axis]);
  int64_t dims[ES_MAX_RANK];
  memcpy(dims, x->dims, sizeof dims);
  dims[axis] = kk;
  if (k->out[0] && (rc = out_set(k, 0, dt, x->rank, dims)) < 0)
    return rc;
  if (k->n_out > 1 && k->out[1] && (rc = out_set(k, 1, ES_DTYPE_INT64, x->rank, dims)) < 0)
    return rc;
  topk_params *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  p->outer = dims_prod(x->dims, 0, axis);
  p->n = x->dims[axis];
  p->inner = dims_prod(x->dims, axis + 1, x->rank);
  p->kk = from_data ? -1 : kk;
  p->axis = axis;
  p->dt = dt;
  p->largest = (int)largest;
  p->vals = k->out[0] != NULL;
  p->idx = k->n_out > 1 && k->out[1];
  k->params = p;
  if (from_data) {
    k->out_bound = (p->vals ? 1u : 0u) | (p->idx ? 2u : 0u);
    k->bound_dims = 1u << axis;
    snprintf(k->bound_why, sizeof k->bound_why, "the axis' length %lld, k's largest",
             (long long)kk);
  }
  k->scratch_bytes = (size_t)kk * sizeof(int64_t);
  return 0;
}

/* Per element type: BEFORE(a, b) is 1 when index a ranks before index b
 * (values v[a * inner], ties by the lower index); the heap keeps the k
 * best with the worst at its root. */
#define TOPK_DEF(name, T, GREATER)                                                          \
  static inline int name##_before(const T *v, int64_t in, int largest, int64_t a,           \
                                  int64_t b) {                                              \
    T x = v[a * in], y = v[b * in];                                                         \
    if (GREATER(x, y))                                                                      \
      return largest;                                                                       \
    if (GREATER(y, x))                                                                      \
      return !largest;                                                                      \
    return a < b;                                                                           \
  }                                                                                         \
  static void name##_sift(const T *v, int64_t in, int largest, int64_t *h, int64_t m,       \
                          int64_t i) {                                                      \
    for (;;) {                                                                              \
      int64_t l = 2 * i + 1, w = i;                                                         \
      if (l < m && name##_before(v, in, largest, h[w], h[l]))                               \
        w = l;                                                                              \
      if (l + 1 < m && name##_before(v, in, largest, h[w], h[l + 1]))                       \
        w = l + 1;                                                                          \
      if (w == i)                                                                           \
        return;                                                                             \
      int64_t t = h[i];                                                                     \
      h[i] = h[w];                                                                          \
      h[w] = t;                                                                             \
      i = w;                                                                                \
    }                                                                                       \
  }                                                                                         \
  static void name##_run(const topk_params *p, const T *x, T *yv, int64_t *yi, int64_t *h) { \
    int64_t in = p->inner, kk = p->kk;                                                      \
    for (int64_t o = 0; o < p->outer; o++)                                                  \
      for (int64_t j = 0; j < in; j++) {                                                    \
        const T *v = x + o * p->n * in + j;                                                 \
        int64_t m = 0;                                                                      \
        for (int64_t i = 0; i < p->n && kk > 0; i++) {                                      \
          if (m < kk) {                                                                     \
            h[m] = i;                                                                       \
            for (int64_t c = m++; c > 0;) { /* sift up */                                   \
              int64_t par = (c - 1) / 2;                                                    \
              if (!name##_before(v, in, p->largest, h[par], h[c]))                          \
                break;                                                                      \
              int64_t t = h[c];                                                             \
              h[c] = h[par];                                                                \
              h[par] = t;                                                                   \
              c = par;                                                                      \
            }                                                                               \
          } else if (name##_before(v, in, p->largest, i, h[0])) {                           \
            h[0] = i;                                                                       \
            name##_sift(v, in, p->largest, h, m, 0);                                        \
          }                                                                                 \
        }                                                                                   \
        /* pop the worst into the last place, down to the best */                           \
        for (int64_t r = m - 1; r >= 0; r--) {                                              \
          int64_t i = h[0];                                                                 \
          h[0] = h[r];                                                                      \
          name##_sift(v, in, p->largest, h, r, 0);                                          \
          int64_t at = (o * kk + r) * in + j;                                               \
          if (yv)                                                                           \
            yv[at] = v[i * in];                                                             \
          if (yi)                                                                           \
            yi[at] = i;                                                                     \
        }                                                                                   \
      }                                                                                     \
  }

/* NaN above every number and equal to itself: a total order. */
#define GT_FLOAT(a, b) ((a) > (b) || ((a) != (a) && (b) == (b)))
#define GT_PLAIN(a, b) ((a) > (b))
TOPK_DEF(topk_f32, float, GT_FLOAT)
TOPK_DEF(topk_i32, int32_t, GT_PLAIN)
TOPK_DEF(topk_i64, int64_t, GT_PLAIN)
TOPK_DEF(topk_i8, int8_t, GT_PLAIN)
TOPK_DEF(topk_u8, uint8_t, GT_PLAIN)

static int topk_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  topk_params own;
  const topk_params *p = k->params;
  if (p->kk < 0) { /* k from the data: the outputs' shape too */
    own = *p;
    own.kk = *(const int64_t *)in[1];
    if (own.kk < 0 || own.kk > p->n)
      return ES_KFAIL(k, ES_EINVAL, "k is %lld, expected 0 to %lld (the axis' length)",
                      (long long)own.kk, (long long)p->n);
    for (int o = 0; o < 2; o++) {
      if (!(k->out_bound >> o & 1))
        continue;
      es_tdesc *t = k->out[o];
      int64_t dims[ES_MAX_RANK];
      memcpy(dims, t->dims, sizeof dims);
      dims[p->axis] = own.kk;
      int rc = es__tdesc_set(t, t->dtype, t->rank, dims);
      if (rc < 0)
        return rc;
    }
    p = &own;
  }
  void *yv = p->vals ? out[0] : NULL;
  int64_t *yi = p->idx ? out[1] : NULL;
  switch (p->dt) {
  case ES_DTYPE_FLOAT:
    topk_f32_run(p, in[0], yv, yi, scratch);
    break;
  case ES_DTYPE_INT32:
    topk_i32_run(p, in[0], yv, yi, scratch);
    break;
  case ES_DTYPE_INT64:
    topk_i64_run(p, in[0], yv, yi, scratch);
    break;
  case ES_DTYPE_INT8:
    topk_i8_run(p, in[0], yv, yi, scratch);
    break;
  default:
    topk_u8_run(p, in[0], yv, yi, scratch);
    break;
  }
  return 0;
}

/* ==========================================================================
 * NonMaxSuppression
 * ======================================================================== */

typedef struct nms_params {
  int64_t batch, classes, boxes;
  int64_t max_out; /* per class; -1: read from input 2 at run time */
  int center;      /* center_point_box: [xc, yc, w, h] rather than corners */
} nms_params;

/* One float input of one element (iou_threshold, score_threshold). */
static int nms_scalar_check(es_kinst *k, int i, es_dtype dt, const char *what) {
  const es_tdesc *t = i < k->n_in ? k->in[i] : NULL;
  if (t && (t->dtype != dt || t->count != 1 || t->rank > 1))
    return ES_KFAIL(k, ES_EMODEL, "%s (input %d) is %s with %zu elements, expected one %s", what,
                    i, es_dtype_name(t->dtype), t->count, es_dtype_name(dt));
  return 0;
}

static int nms_infer(es_kinst *k) {
  int rc = es__kio_check(k, 2, 5, 1, 1);
  if (rc < 0)
    return rc;
  const es_tdesc *b = k->in[0], *sc = k->in[1];
  if (b->dtype != ES_DTYPE_FLOAT || sc->dtype != ES_DTYPE_FLOAT)
    return ES_KFAIL(k, ES_ENOTSUP, "boxes and scores are %s and %s, only float32 is supported",
                    es_dtype_name(b->dtype), es_dtype_name(sc->dtype));
  if (b->rank != 3 || b->dims[2] != 4 || sc->rank != 3 || sc->dims[0] != b->dims[0] ||
      sc->dims[2] != b->dims[1])
    return ES_KFAIL(k, ES_EMODEL, "boxes must be [batch, boxes, 4] and scores [batch, classes, "
                    "boxes] of the same batch and boxes");
  int64_t center;
  if ((rc = es__attr_int(k, "center_point_box", 0, &center)) < 0)
    return rc;
  if (center != 0 && center != 1)
    return ES_KFAIL(k, ES_EMODEL, "center_point_box is %lld, expected 0 or 1", (long long)center);
  if ((rc = nms_scalar_check(k, 2, ES_DTYPE_INT64, "max_output_boxes_per_class")) < 0 ||
      (rc = nms_scalar_check(k, 3, ES_DTYPE_FLOAT, "iou_threshold")) < 0 ||
      (rc = nms_scalar_check(k, 4, ES_DTYPE_FLOAT, "score_threshold")) < 0)
    return rc;
  nms_params *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  p->batch = b->dims[0];
  p->boxes = b->dims[1];
  p->classes = sc->dims[1];
  p->center = (int)center;
  p->max_out = 0; /* absent: ONNX's default, nothing selected */
  int64_t per = p->boxes;
  if (k->n_in > 2 && k->in[2]) {
    const void *m = k->in_static ? k->in_static[2] : NULL;
    p->max_out = m ? *(const int64_t *)m : -1;
    if (m)
      per = p->max_out < 0 ? 0 : p->max_out < per ? p->max_out : per;
  } else {
    per = 0;
  }
  int64_t dims[2] = {p->batch * p->classes * per, 3};
  if ((rc = out_set(k, 0, ES_DTYPE_INT64, 2, dims)) < 0)
    return rc;
  k->out_bound = 1;
  k->bound_dims = 1; /* [selected, 3] */
  snprintf(k->bound_why, sizeof k->bound_why, "%lld batch x %lld class%s x %lld per class%s",
           (long long)p->batch, (long long)p->classes, p->classes == 1 ? "" : "es", (long long)per,
           p->max_out < 0 ? " (every box)" : per < p->boxes ? " (max_output_boxes_per_class)"
                                                            : " (every box)");
  /* per batch: corners [boxes][4]; candidates and kept, [boxes] each */
  k->scratch_bytes = (size_t)p->boxes * (4 * sizeof(float) + 2 * sizeof(int64_t));
  k->params = p;
  return 0;
}

typedef struct nms_sort {
  const float *score; /* this class's, indexed by box */
} nms_sort;

/* Best score first; equal scores by the lower box index. */
static int nms_cmp(const void *a, const void *b, void *ctx) {
  const nms_sort *s = ctx;
  int64_t i = *(const int64_t *)a, j = *(const int64_t *)b;
  float x = s->score[i], y = s->score[j];
  if (x != y)
    return x > y ? -1 : 1;
  return (i > j) - (i < j);
}

/* 1 when box a (corners) suppresses box b: IoU above thr, and both areas,
 * the intersection and the union positive. */
static bool nms_suppresses(const float *a, const float *b, float thr) {
  float ix0 = fmaxf(a[0], b[0]), ix1 = fminf(a[2], b[2]);
  float iy0 = fmaxf(a[1], b[1]), iy1 = fminf(a[3], b[3]);
  if (ix1 <= ix0 || iy1 <= iy0)
    return false;
  float inter = (ix1 - ix0) * (iy1 - iy0);
  float aa = (a[2] - a[0]) * (a[3] - a[1]), ab = (b[2] - b[0]) * (b[3] - b[1]);
  float uni = aa + ab - inter;
  if (inter <= 0 || aa <= 0 || ab <= 0 || uni <= 0)
    return false;
  return inter / uni > thr;
}

static int nms_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  const nms_params *p = k->params;
  int64_t max_out = p->max_out;
  if (max_out < 0)
    max_out = *(const int64_t *)in[2];
  if (max_out < 0)
    max_out = 0;
  float iou = k->n_in > 3 && in[3] ? *(const float *)in[3] : 0.0f;
  int has_thr = k->n_in > 4 && in[4] != NULL;
  float thr = has_thr ? *(const float *)in[4] : 0.0f;
  int64_t n = p->boxes;
  float *corner = scratch;
  int64_t *cand = (int64_t *)(void *)(corner + 4 * n), *kept = cand + n;
  int64_t *y = out[0], total = 0;
  for (int64_t bt = 0; bt < p->batch && max_out > 0; bt++) {
    const float *bx = (const float *)in[0] + bt * n * 4;
    for (int64_t i = 0; i < n; i++) {
      const float *q = bx + 4 * i;
      float a0, a1, b0, b1; /* two corners, in either order */
      if (p->center) {
        a0 = q[0] - q[2] / 2;
        b0 = q[0] + q[2] / 2;
        a1 = q[1] - q[3] / 2;
        b1 = q[1] + q[3] / 2;
      } else {
        a0 = q[0];
        b0 = q[2];
        a1 = q[1];
        b1 = q[3];
      }
      float *c = corner + 4 * i;
      c[0] = fminf(a0, b0);
      c[2] = fmaxf(a0, b0);
      c[1] = fminf(a1, b1);
      c[3] = fmaxf(a1, b1);
    }
    for (int64_t cl = 0; cl < p->classes; cl++) {
      const float *score = (const float *)in[1] + (bt * p->classes + cl) * n;
      int64_t nc = 0;
      for (int64_t i = 0; i < n; i++)
        if (!has_thr || score[i] > thr)
          cand[nc++] = i;
      nms_sort ctx = {score};
      qsort_r(cand, (size_t)nc, sizeof *cand, nms_cmp, &ctx);
      int64_t nk = 0;
      for (int64_t c = 0; c < nc && nk < max_out; c++) {
        const float *cb = corner + 4 * cand[c];
        bool keep = true;
        for (int64_t j = 0; j < nk && keep; j++)
          keep = !nms_suppresses(corner + 4 * kept[j], cb, iou);
        if (!keep)
          continue;
        kept[nk++] = cand[c];
        y[3 * total] = bt;
        y[3 * total + 1] = cl;
        y[3 * total + 2] = cand[c];
        total++;
      }
    }
  }
  int64_t dims[2] = {total, 3};
  return es__tdesc_set(k->out[0], ES_DTYPE_INT64, 2, dims);
}

/* ==========================================================================
 * Det
 * ======================================================================== */

typedef struct det_params {
  int64_t batch, m;
} det_params;

static int det_infer(es_kinst *k) {
  int rc = es__kio_check(k, 1, 1, 1, 1);
  if (rc < 0)
    return rc;
  const es_tdesc *x = k->in[0];
  if (x->dtype != ES_DTYPE_FLOAT)
    return ES_KFAIL(k, ES_ENOTSUP, "X is %s, only float32 is supported",
                    es_dtype_name(x->dtype));
  if (x->rank < 2 || x->dims[x->rank - 1] != x->dims[x->rank - 2])
    return ES_KFAIL(k, ES_EMODEL, "X is not a stack of square matrices ([..., M, M])");
  int64_t m = x->dims[x->rank - 1];
  if (m > 4096)
    return ES_KFAIL(k, ES_ENOTSUP, "matrices of %lld x %lld are larger than 4096 x 4096",
                    (long long)m, (long long)m);
  if ((rc = out_set(k, 0, ES_DTYPE_FLOAT, x->rank - 2, x->dims)) < 0)
    return rc;
  det_params *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  p->batch = dims_prod(x->dims, 0, x->rank - 2);
  p->m = m;
  k->params = p;
  k->scratch_bytes = (size_t)(m * m) * sizeof(double);
  return 0;
}

static int det_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  const det_params *p = k->params;
  int64_t m = p->m;
  double *a = scratch;
  for (int64_t b = 0; b < p->batch; b++) {
    const float *x = (const float *)in[0] + b * m * m;
    for (int64_t i = 0; i < m * m; i++)
      a[i] = x[i];
    double det = 1; /* an empty matrix's determinant is 1 */
    for (int64_t c = 0; c < m && det != 0; c++) {
      int64_t piv = c;
      for (int64_t r = c + 1; r < m; r++)
        if (fabs(a[r * m + c]) > fabs(a[piv * m + c]))
          piv = r;
      if (a[piv * m + c] == 0) {
        det = 0;
        break;
      }
      if (piv != c) {
        for (int64_t j = c; j < m; j++) {
          double t = a[c * m + j];
          a[c * m + j] = a[piv * m + j];
          a[piv * m + j] = t;
        }
        det = -det;
      }
      double d = a[c * m + c];
      det *= d;
      for (int64_t r = c + 1; r < m; r++) {
        double f = a[r * m + c] / d;
        for (int64_t j = c + 1; j < m; j++)
          a[r * m + j] -= f * a[c * m + j];
      }
    }
    ((float *)out[0])[b] = (float)det;
  }
  return 0;
}

/* ==========================================================================
 * Family
 * ======================================================================== */

static const es_kernel gs_kernel = {gs_infer, gs_run, NULL, 0};
static const es_kernel ra_kernel = {ra_infer, ra_run, NULL, 0};
static const es_kernel unpool_kernel = {unpool_infer, unpool_run, NULL, 0};
static const es_kernel topk_kernel = {topk_infer, topk_run, NULL, 0};
static const es_kernel det_kernel = {det_infer, det_run, NULL, 0};
static const es_kernel nms_kernel = {nms_infer, nms_run, NULL, 0};

const es_kernel *es__kernels_sample(es_op op) {
  switch (op) {
  case ES_OP_GridSample:
    return &gs_kernel;
  case ES_OP_RoiAlign:
    return &ra_kernel;
  case ES_OP_MaxUnpool:
    return &unpool_kernel;
  case ES_OP_TopK:
    return &topk_kernel;
  case ES_OP_Det:
    return &det_kernel;
  case ES_OP_NonMaxSuppression:
    return &nms_kernel;
  default:
    return NULL;
  }
}
