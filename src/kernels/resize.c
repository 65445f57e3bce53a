/* Resize (float32): opset 10 (X, scales) and opset 11+ (X, roi, scales,
 * sizes), modes nearest, linear and cubic; and Upsample (opsets 7-10), its
 * predecessor, planned by the same code. Nearest runs on any element type
 * (an int8 pyramid's upsampling, moved before its DequantizeLinear at
 * load), in NHWC too.
 *
 * Interpolation is separable: the value at an output point is a weighted
 * sum, along each axis in turn, of a few input points of that axis (1 tap
 * for nearest, 2 for linear, 4 for cubic). infer therefore turns every axis
 * into a table giving, for each output index, its taps' input indices
 * (already clamped to the edge) and weights, computed in double from
 * ONNX's coordinate_transformation_mode formulas exactly as the reference
 * implementation does (including its use of scale x input as the "output
 * length" of align_corners when scales are given). Axes whose table is the
 * identity (N and C, usually) drop out. run is then one of:
 *
 *   - nearest, only the last two axes active: a row gather per output row,
 *     copying the previous output row when two rows map to the same input
 *     row (integer upscaling copies most rows);
 *   - linear, only the last two axes active: bilinear; input rows are
 *     interpolated along W once into two cached scratch rows (consecutive
 *     output rows share input rows), then blended per output row;
 *   - anything else (N-linear, cubic, nearest on other axes,
 *     tf_crop_and_resize): one 1-D pass per active axis, last axis first (as
 *     the reference's recursion, which matters for extrapolation), through
 *     two scratch buffers.
 *
 * Opset 10's nearest follows ONNX Runtime: x / scale truncated, or ceiled
 * when downscaling (matching ONNX's original opset-10 test data).
 *
 * Layouts. Resize is layout-aware so the upsampling in detection necks
 * keeps activations in NHWC. When the input is NHWC and the path is one of
 * the three above that touch only H and W (copy, nearest, linear) the
 * output is NHWC too and the same tables drive a pixel-major walk: an
 * output pixel is a copy (nearest) or a blend (linear) of whole input
 * pixels, C contiguous channels at a time, and output rows that repeat the
 * previous one are copied whole. Any other NHWC case (N or C resized,
 * cubic, tf_crop_and_resize extrapolation) asks for a plain input. */
#include "kernels/kernel.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

/* ==========================================================================
 * Plan
 * ======================================================================== */

enum { RS_NEAREST, RS_LINEAR, RS_CUBIC };
enum { CT_HALF_PIXEL, CT_ASYMMETRIC, CT_PYTORCH_HALF_PIXEL, CT_ALIGN_CORNERS,
       CT_TF_HALF_PIXEL_FOR_NN, CT_TF_CROP_AND_RESIZE };
enum { NM_ROUND_PREFER_FLOOR, NM_ROUND_PREFER_CEIL, NM_FLOOR, NM_CEIL, NM_SIMPLE };
enum { PATH_COPY, PATH_NEAREST_2D, PATH_LINEAR_2D, PATH_SEPARABLE, PATH_NEAREST_BYTES };

typedef struct resize_dim {
  int64_t in, out;
  int taps;          /* taps per output index */
  int64_t *idx;      /* [out * taps]: input indices, inside [0, in) */
  float *w;          /* [out * taps]: weights */
  uint8_t *outside;  /* [out] or NULL: 1 where tf_crop_and_resize extrapolates */
  int identity;      /* output index j is input index j */
} resize_dim;

typedef struct resize_params {
  int rank, path;
  resize_dim dim[ES_MAX_RANK];
  float extrapolation;
  int64_t planes;        /* 2-D paths: product of all but the last two axes */
  int nhwc;              /* X and Y in NHWC (rank 4, 2-D paths) */
  int64_t n, c;          /* NHWC: images and channels */
  size_t buf_elems;      /* separable: elements of each scratch buffer */
  int64_t count;         /* copy: elements */
  size_t esz;            /* element size (4 but for Upsample's nearest on bytes) */
} resize_params;

typedef struct resize_cfg {
  int mode, ctm, nearest;
  float cubic_a;
  int exclude_outside;
} resize_cfg;

static int resize_pick(const es_kinst *k, const char *attr, const char *val,
                       const char *const *names, int n, int *out) {
  for (int i = 0; i < n; i++)
    if (!strcmp(val, names[i])) {
      *out = i;
      return 0;
    }
  return ES_KFAIL(k, ES_EMODEL, "%s is '%s', not a value ONNX defines", attr, val);
}

static int resize_attrs(es_kinst *k, resize_cfg *c, float *extrap) {
  static const char *const modes[] = {"nearest", "linear", "cubic"};
  static const char *const ctms[] = {"half_pixel", "asymmetric", "pytorch_half_pixel",
                                     "align_corners", "tf_half_pixel_for_nn",
                                     "tf_crop_and_resize"};
  static const char *const nms[] = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"};
  const char *mode, *ctm, *nm;
  int64_t excl;
  int rc;
  if ((rc = es__attr_string(k, "mode", "nearest", &mode)) < 0 ||
      (rc = es__attr_string(k, "coordinate_transformation_mode", "half_pixel", &ctm)) < 0 ||
      (rc = es__attr_string(k, "nearest_mode", "round_prefer_floor", &nm)) < 0 ||
      (rc = es__attr_float(k, "cubic_coeff_a", -0.75f, &c->cubic_a)) < 0 ||
      (rc = es__attr_int(k, "exclude_outside", 0, &excl)) < 0 ||
      (rc = es__attr_float(k, "extrapolation_value", 0.0f, extrap)) < 0)
    return rc;
  if ((rc = resize_pick(k, "mode", mode, modes, k->opset < 11 ? 2 : 3, &c->mode)) < 0 ||
      (rc = resize_pick(k, "coordinate_transformation_mode", ctm, ctms, 6, &c->ctm)) < 0 ||
      (rc = resize_pick(k, "nearest_mode", nm, nms, 4, &c->nearest)) < 0)
    return rc;
  if (excl != 0 && excl != 1)
    return ES_KFAIL(k, ES_EMODEL, "exclude_outside is %lld, expected 0 or 1", (long long)excl);
  c->exclude_outside = (int)excl;
  if (k->opset < 11) { /* opset 10 had neither attribute: asymmetric coordinates */
    c->ctm = CT_ASYMMETRIC;
    c->nearest = NM_SIMPLE;
  }
  static const char *const later[] = {"antialias", "axes", "keep_aspect_ratio_policy"};
  for (size_t i = 0; i < sizeof later / sizeof later[0]; i++)
    if (es__kattr(k, later[i]))
      return ES_KFAIL(k, ES_ENOTSUP, "attribute '%s' (opset 18) not implemented", later[i]);
  return 0;
}

/* Input coordinate of output index x along one axis; *outside for
 * tf_crop_and_resize points outside the input. */
static double resize_coord(const resize_cfg *c, double x, double scale, double in, double len,
                           double r0, double r1, int *outside) {
  *outside = 0;
  switch (c->ctm) {
  case CT_ASYMMETRIC:
    return x / scale;
  case CT_PYTORCH_HALF_PIXEL:
    return len > 1 ? (x + 0.5) / scale - 0.5 : 0.0;
  case CT_ALIGN_CORNERS:
    return len == 1 ? 0.0 : x * (in - 1) / (len - 1);
  case CT_TF_HALF_PIXEL_FOR_NN:
    return (x + 0.5) / scale;
  case CT_TF_CROP_AND_RESIZE: {
    double v = len > 1 ? r0 * (in - 1) + x * (r1 - r0) * (in - 1) / (len - 1)
                       : 0.5 * (r0 + r1) * (in - 1);
    *outside = !(v >= 0 && v <= in - 1);
    return v;
  }
  default: /* CT_HALF_PIXEL */
    return (x + 0.5) / scale - 0.5;
  }
}

static void resize_cubic_coeffs(double r, double a, double *c) {
  double s = 1 - r;
  c[0] = ((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a;
  c[1] = ((a + 2) * r - (a + 3)) * r * r + 1;
  c[2] = ((a + 2) * s - (a + 3)) * s * s + 1;
  c[3] = ((a * (s + 1) - 5 * a) * (s + 1) + 8 * a) * (s + 1) - 4 * a;
}

static int64_t clamp_idx(int64_t v, int64_t n) { return v < 0 ? 0 : v >= n ? n - 1 : v; }

/* Builds one axis' tap table. len is the reference's output length (see the
 * note at the top); r0, r1 the roi of this axis. */
static int resize_dim_build(es_kinst *k, const resize_cfg *c, resize_dim *d, double scale,
                            double len, double r0, double r1) {
  int K = c->mode == RS_NEAREST ? 1 : c->mode == RS_LINEAR ? 2 : 4;
  size_t n = (size_t)d->out;
  d->taps = K;
  d->idx = es__kinst_alloc(k, n * (size_t)K * sizeof *d->idx + 1);
  d->w = es__kinst_alloc(k, n * (size_t)K * sizeof *d->w + 1);
  if (!d->idx || !d->w)
    return ES_KFAIL(k, ES_ENOMEM, "out of memory for Resize tables");
  int identity = d->out == d->in;
  for (int64_t j = 0; j < d->out; j++) {
    int outside;
    double x = resize_coord(c, (double)j, scale, (double)d->in, len, r0, r1, &outside);
    if (outside) {
      if (!d->outside && !(d->outside = es__kinst_alloc(k, n)))
        return ES_KFAIL(k, ES_ENOMEM, "out of memory for Resize tables");
      d->outside[j] = 1;
      identity = 0;
    }
    /* far outside the input every tap is the edge: bound x so it converts */
    double lim = (double)d->in + 4;
    if (!(x >= -4))
      x = -4;
    if (!(x <= lim))
      x = lim;
    double fl = floor(x), r = x - fl;
    int64_t f = (int64_t)fl;
    int64_t *ix = d->idx + j * K;
    float *w = d->w + j * K;
    if (c->mode == RS_NEAREST) {
      int64_t i = f;
      switch (c->nearest) {
      case NM_SIMPLE:
        i = scale < 1 ? (int64_t)ceil(x) : f;
        break;
      case NM_ROUND_PREFER_FLOOR:
        i = r > 0.5 ? f + 1 : f;
        break;
      case NM_ROUND_PREFER_CEIL:
        i = r >= 0.5 ? f + 1 : f;
        break;
      case NM_CEIL:
        i = r > 0 ? f + 1 : f;
        break;
      default: /* NM_FLOOR */
        break;
      }
      ix[0] = clamp_idx(i, d->in);
      w[0] = 1.0f;
    } else if (c->mode == RS_LINEAR) {
      ix[0] = clamp_idx(f, d->in);
      ix[1] = clamp_idx(f + 1, d->in);
      w[0] = (float)(1 - r);
      w[1] = (float)r;
    } else {
      double cf[4], sum = 0;
      resize_cubic_coeffs(r, c->cubic_a, cf);
      for (int t = 0; t < 4; t++) {
        int64_t i = f - 1 + t;
        if (c->exclude_outside && (i < 0 || i >= d->in))
          cf[t] = 0;
        sum += cf[t];
      }
      for (int t = 0; t < 4; t++) {
        ix[t] = clamp_idx(f - 1 + t, d->in);
        w[t] = (float)(c->exclude_outside && sum != 0 ? cf[t] / sum : cf[t]);
      }
    }
    if (identity) { /* index j alone, with total weight exactly 1 */
      float on = 0.0f;
      for (int t = 0; t < K; t++)
        if (ix[t] == j)
          on += w[t];
        else if (w[t] != 0.0f)
          identity = 0;
      identity = identity && on == 1.0f;
    }
  }
  d->identity = identity;
  return 0;
}

/* Reads scales or sizes into the output shape and per-axis scale and
 * reference output length. */
static int resize_target(es_kinst *k, const es_tdesc *x, int64_t *odims, double *scale,
                         double *len) {
  int r = x->rank;
  const es_tdesc *sc = NULL, *sz = NULL;
  const void *scd = NULL, *szd = NULL;
  int si = k->opset < 11 ? 1 : 2;
  if (k->n_in > si && k->in[si] && k->in[si]->count > 0) {
    sc = k->in[si];
    scd = k->in_static[si];
  }
  if (k->opset >= 11 && k->n_in > 3 && k->in[3] && k->in[3]->count > 0) {
    sz = k->in[3];
    szd = k->in_static[3];
  }
  if (k->opset < 11 && !sc)
    return ES_KFAIL(k, ES_EMODEL, "input scales is missing or empty");
  if (!!sc == !!sz)
    return ES_KFAIL(k, ES_EMODEL, "exactly one of scales and sizes must be given (got %s)",
                    sc ? "both" : "neither");
  if (sc) {
    if (sc->dtype != ES_DTYPE_FLOAT || sc->rank != 1 || sc->count != (size_t)r)
      return ES_KFAIL(k, ES_EMODEL, "scales is %s with %zu values, expected %d float32",
                      es_dtype_name(sc->dtype), sc->count, r);
    if (!scd) {
      k->data_needed = 1;
      return ES_KFAIL(k, ES_ENOTSUP, "scales must be known when planning");
    }
    for (int i = 0; i < r; i++) {
      double s = ((const float *)scd)[i];
      if (!(s > 0) || isinf(s))
        return ES_KFAIL(k, ES_EMODEL, "scales[%d] = %g, expected a positive finite value", i, s);
      double o = floor((double)x->dims[i] * s);
      if (o > (double)((int64_t)1 << 40))
        return ES_KFAIL(k, ES_EMODEL, "scales[%d] = %g makes axis %d too large", i, s, i);
      odims[i] = (int64_t)o;
      scale[i] = s;
      len[i] = (double)x->dims[i] * s;
    }
    return 0;
  }
  if (sz->dtype != ES_DTYPE_INT64 || sz->rank != 1 || sz->count != (size_t)r)
    return ES_KFAIL(k, ES_EMODEL, "sizes is %s with %zu values, expected %d int64",
                    es_dtype_name(sz->dtype), sz->count, r);
  if (!szd) {
    k->data_needed = 1;
    return ES_KFAIL(k, ES_ENOTSUP, "sizes must be known when planning");
  }
  for (int i = 0; i < r; i++) {
    int64_t o = es__static_i64(sz, szd, (size_t)i);
    if (o < 0 || (o > 0 && x->dims[i] == 0))
      return ES_KFAIL(k, ES_EMODEL, "sizes[%d] = %lld for an input axis of %lld", i,
                      (long long)o, (long long)x->dims[i]);
    odims[i] = o;
    scale[i] = x->dims[i] > 0 ? (double)o / (double)x->dims[i] : 1.0;
    len[i] = (double)o;
  }
  return 0;
}

/* What Resize and Upsample share once the output size is known: the
 * tables, the path, the layout and the scratch. */
static int resize_plan(es_kinst *k, resize_params *p, const resize_cfg *c, const int64_t *odims,
                       const double *scale, const double *len);

static int resize_infer(es_kinst *k) {
  if (k->n_in < 2 || !k->in[0])
    return ES_KFAIL(k, ES_EMODEL, "%d inputs, expected X and %s", k->n_in,
                    k->opset < 11 ? "scales" : "roi, scales or sizes");
  if (k->n_in > (k->opset < 11 ? 2 : 4))
    return ES_KFAIL(k, ES_EMODEL, "%d inputs, expected at most %d", k->n_in,
                    k->opset < 11 ? 2 : 4);
  if (k->n_out != 1 || !k->out[0])
    return ES_KFAIL(k, ES_EMODEL, "%d outputs, expected 1", k->n_out);
  const es_tdesc *x = k->in[0];
  if (x->rank < 1)
    return ES_KFAIL(k, ES_EMODEL, "X is a scalar, expected rank >= 1");
  resize_params *p = es__kinst_alloc(k, sizeof *p);
  if (!p)
    return ES_KFAIL(k, ES_ENOMEM, "out of memory for Resize parameters");
  resize_cfg c;
  int rc = resize_attrs(k, &c, &p->extrapolation);
  if (rc < 0)
    return rc;
  /* Nearest copies elements of any type (an int8 pyramid's upsampling,
   * moved before its DequantizeLinear by the loader); the interpolating
   * modes and tf_crop_and_resize's float extrapolation need float32. */
  if (x->dtype != ES_DTYPE_FLOAT && (c.mode != RS_NEAREST || c.ctm == CT_TF_CROP_AND_RESIZE))
    return ES_KFAIL(k, ES_ENOTSUP, "X is %s; Resize is implemented for float32 only, or for "
                    "any type in mode nearest (without tf_crop_and_resize)",
                    es_dtype_name(x->dtype));
  int64_t odims[ES_MAX_RANK];
  double scale[ES_MAX_RANK], len[ES_MAX_RANK];
  if ((rc = resize_target(k, x, odims, scale, len)) < 0)
    return rc;
  return resize_plan(k, p, &c, odims, scale, len);
}

/* Upsample (opsets 7-9, deprecated in 10): Resize before Resize existed.
 * Scales are an attribute (7, 8) or an input (9, 10), each >= 1; the
 * output is floor(input x scale); coordinates are asymmetric (x / scale)
 * and nearest picks as opset-10 Resize does, which is how ONNX Runtime
 * reads both ops. Nearest moves elements of any type, linear is float32. */
static int upsample_infer(es_kinst *k) {
  bool attr_form = k->opset < 9;
  int n_in = attr_form ? 1 : 2;
  if (k->n_in != n_in || !k->in[0] || (n_in == 2 && !k->in[1]))
    return ES_KFAIL(k, ES_EMODEL, "%d inputs, expected %s", k->n_in,
                    attr_form ? "X (scales is an attribute before opset 9)" : "X and scales");
  if (k->n_out != 1 || !k->out[0])
    return ES_KFAIL(k, ES_EMODEL, "%d outputs, expected 1", k->n_out);
  const es_tdesc *x = k->in[0];
  if (x->rank < 1)
    return ES_KFAIL(k, ES_EMODEL, "X is a scalar, expected rank >= 1");
  const char *mode;
  int rc = es__attr_string(k, "mode", "nearest", &mode);
  if (rc < 0)
    return rc;
  resize_cfg c = {.ctm = CT_ASYMMETRIC, .nearest = NM_SIMPLE};
  if (!strcmp(mode, "nearest"))
    c.mode = RS_NEAREST;
  else if (!strcmp(mode, "linear"))
    c.mode = RS_LINEAR;
  else
    return ES_KFAIL(k, ES_EMODEL, "mode '%s', expected nearest or linear", mode);
  if (c.mode == RS_LINEAR && x->dtype != ES_DTYPE_FLOAT)
    return ES_KFAIL(k, ES_ENOTSUP, "X is %s; linear Upsample is implemented for float32 only",
                    es_dtype_name(x->dtype));
  const float *sv;
  size_t ns;
  if (attr_form) {
    if ((rc = es__attr_floats(k, "scales", &sv, &ns)) < 0)
      return rc;
    if (!es__kattr(k, "scales"))
      return ES_KFAIL(k, ES_EMODEL, "attribute 'scales' is required");
  } else {
    const es_tdesc *st = k->in[1];
    if (st->dtype != ES_DTYPE_FLOAT || st->rank != 1)
      return ES_KFAIL(k, ES_EMODEL, "scales is %s of rank %d, expected 1-D float32",
                      es_dtype_name(st->dtype), st->rank);
    if (!(sv = k->in_static[1])) {
      k->data_needed = 1;
      return ES_KFAIL(k, ES_ENOTSUP, "scales must be known when planning");
    }
    ns = st->count;
  }
  if (ns != (size_t)x->rank)
    return ES_KFAIL(k, ES_EMODEL, "scales has %zu values, expected the rank of X (%d)", ns,
                    x->rank);
  int64_t odims[ES_MAX_RANK];
  double scale[ES_MAX_RANK], len[ES_MAX_RANK];
  for (int i = 0; i < x->rank; i++) {
    double s = sv[i];
    if (!(s >= 1) || isinf(s))
      return ES_KFAIL(k, ES_EMODEL, "scales[%d] = %g, expected a finite value >= 1", i, s);
    double o = floor((double)x->dims[i] * s);
    if (o > (double)((int64_t)1 << 40))
      return ES_KFAIL(k, ES_EMODEL, "scales[%d] = %g makes axis %d too large", i, s, i);
    odims[i] = (int64_t)o;
    scale[i] = s;
    len[i] = (double)x->dims[i] * s;
  }
  resize_params *p = es__kinst_alloc(k, sizeof *p);
  if (!p)
    return ES_KFAIL(k, ES_ENOMEM, "out of memory for Upsample parameters");
  return resize_plan(k, p, &c, odims, scale, len);
}

static int resize_plan(es_kinst *k, resize_params *p, const resize_cfg *cfg, const int64_t *odims,
                       const double *scale, const double *len) {
  const es_tdesc *x = k->in[0];
  resize_cfg c = *cfg;
  int r = x->rank, rc;
  if ((rc = es__tdesc_set(k->out[0], x->dtype, r, odims)) < 0)
    return rc;
  p->esz = es_dtype_size(x->dtype);

  const float *roi = NULL;
  if (c.ctm == CT_TF_CROP_AND_RESIZE) {
    const es_tdesc *rt = k->in[1];
    if (!rt || rt->dtype != ES_DTYPE_FLOAT || rt->count != 2 * (size_t)r)
      return ES_KFAIL(k, ES_EMODEL, "tf_crop_and_resize needs roi: %d float32 values", 2 * r);
    if (!(roi = k->in_static[1])) {
      k->data_needed = 1;
      return ES_KFAIL(k, ES_ENOTSUP, "roi must be known when planning");
    }
  }

  p->rank = r;
  int active_lo = r, has_outside = 0;
  for (int i = 0; i < r; i++) {
    resize_dim *d = &p->dim[i];
    d->in = x->dims[i];
    d->out = odims[i];
    if ((rc = resize_dim_build(k, &c, d, scale[i], len[i], roi ? roi[i] : 0,
                               roi ? roi[r + i] : 1)) < 0)
      return rc;
    if (!d->identity && active_lo == r)
      active_lo = i;
    has_outside |= d->outside != NULL;
  }

  /* separable scratch: every intermediate (all passes but the final one) */
  int64_t cur[ES_MAX_RANK];
  memcpy(cur, x->dims, sizeof cur);
  int passes = 0;
  size_t biggest = 0;
  for (int i = r - 1; i >= 0; i--) {
    if (p->dim[i].identity)
      continue;
    if (passes++ > 0) {
      size_t n = 1;
      for (int j = 0; j < r; j++)
        n *= (size_t)cur[j];
      biggest = n > biggest ? n : biggest;
    }
    cur[i] = odims[i];
  }

  p->planes = 1;
  for (int i = 0; i < r - 2; i++)
    p->planes *= x->dims[i];
  p->count = (int64_t)x->count;
  if (active_lo == r)
    p->path = PATH_COPY;
  else if (x->dtype != ES_DTYPE_FLOAT) /* nearest on other types */
    p->path = x->layout == ES_LAYOUT_NHWC && r == 4 && active_lo >= 2 && !has_outside
                  ? PATH_NEAREST_2D
                  : PATH_NEAREST_BYTES;
  else if (r >= 2 && active_lo >= r - 2 && !has_outside && c.mode == RS_NEAREST)
    p->path = PATH_NEAREST_2D;
  else if (r >= 2 && active_lo >= r - 2 && !has_outside && c.mode == RS_LINEAR)
    p->path = PATH_LINEAR_2D;
  else
    p->path = PATH_SEPARABLE;
  if (x->layout == ES_LAYOUT_NHWC) {
    /* The NHWC walks keep whole pixels: only H and W may change. */
    if (p->path == PATH_SEPARABLE || p->path == PATH_NEAREST_BYTES || !p->dim[0].identity ||
        !p->dim[1].identity) {
      k->want_plain = 1;
      return ES_KRELAYOUT;
    }
    p->nhwc = 1;
    p->n = x->dims[0];
    p->c = x->dims[1];
    k->out[0]->layout = ES_LAYOUT_NHWC;
  }
  if (p->path == PATH_LINEAR_2D)
    k->scratch_bytes = 2 * (size_t)odims[r - 1] * (size_t)(p->nhwc ? p->c : 1) * sizeof(float);
  if (p->path == PATH_SEPARABLE && passes > 1) {
    p->buf_elems = biggest;
    /* the second buffer is needed only from the third pass on */
    size_t nbuf = passes > 2 ? 2 : 1;
    if (biggest > SIZE_MAX / sizeof(float) / nbuf)
      return ES_KFAIL(k, ES_EMODEL, "Resize intermediate too large");
    k->scratch_bytes = biggest * nbuf * sizeof(float);
  }
  k->params = p;
  return 0;
}

/* ==========================================================================
 * Run
 * ======================================================================== */

static void resize_nearest_2d(const resize_params *p, const float *restrict src,
                              float *restrict dst) {
  const resize_dim *h = &p->dim[p->rank - 2], *w = &p->dim[p->rank - 1];
  int64_t iw_n = w->in, ow_n = w->out;
  const int64_t *restrict ix = w->idx;
  for (int64_t c = 0; c < p->planes; c++, src += h->in * iw_n) {
    for (int64_t oh = 0; oh < h->out; oh++, dst += ow_n) {
      if (oh > 0 && h->idx[oh] == h->idx[oh - 1]) {
        memcpy(dst, dst - ow_n, (size_t)ow_n * sizeof *dst);
        continue;
      }
      const float *restrict row = src + h->idx[oh] * iw_n;
      for (int64_t j = 0; j < ow_n; j++)
        dst[j] = row[ix[j]];
    }
  }
}

/* Interpolates input row `row` along W into h. */
static void resize_hrow(const resize_dim *w, const float *restrict row, float *restrict h) {
  const int64_t *restrict ix = w->idx;
  const float *restrict wx = w->w;
  for (int64_t j = 0; j < w->out; j++)
    h[j] = row[ix[2 * j]] * wx[2 * j] + row[ix[2 * j + 1]] * wx[2 * j + 1];
}

/* Bilinear: rows interpolated along W are kept in two scratch slots, since
 * consecutive output rows mostly share their input rows; each output row
 * is then a contiguous blend of two slots. */
static void resize_linear_2d(const resize_params *p, const float *restrict src,
                             float *restrict dst, float *restrict scratch) {
  const resize_dim *h = &p->dim[p->rank - 2], *w = &p->dim[p->rank - 1];
  int64_t iw_n = w->in, ow_n = w->out;
  if (ow_n == 0)
    return;
  float *slot[2] = {scratch, scratch + ow_n};
  for (int64_t c = 0; c < p->planes; c++, src += h->in * iw_n) {
    int64_t held[2] = {-1, -1}; /* input row in each slot */
    for (int64_t oh = 0; oh < h->out; oh++, dst += ow_n) {
      int64_t y0 = h->idx[2 * oh], y1 = h->idx[2 * oh + 1];
      int s0 = held[1] == y0, s1;
      if (held[s0] != y0) { /* fill the slot not holding y1 */
        s0 = held[0] == y1;
        resize_hrow(w, src + y0 * iw_n, slot[s0]);
        held[s0] = y0;
      }
      s1 = held[0] == y1 ? 0 : held[1] == y1 ? 1 : !s0;
      if (held[s1] != y1) {
        resize_hrow(w, src + y1 * iw_n, slot[s1]);
        held[s1] = y1;
      }
      const float *restrict a = slot[s0], *restrict b = slot[s1];
      float wy0 = h->w[2 * oh], wy1 = h->w[2 * oh + 1];
      for (int64_t j = 0; j < ow_n; j++)
        dst[j] = wy0 * a[j] + wy1 * b[j];
    }
  }
}

/* NHWC nearest: output pixel (oh, ow) is input pixel (idx_h, idx_w), all
 * C channels; an output row equal to the previous one is copied whole. */
static void resize_nearest_nhwc(const resize_params *p, const char *restrict src,
                                char *restrict dst) {
  const resize_dim *h = &p->dim[2], *w = &p->dim[3];
  int64_t nc = p->c * (int64_t)p->esz, row_in = w->in * nc, row_out = w->out * nc;
  size_t pix = (size_t)nc;
  for (int64_t b = 0; b < p->n; b++, src += h->in * row_in) {
    for (int64_t oh = 0; oh < h->out; oh++, dst += row_out) {
      if (oh > 0 && h->idx[oh] == h->idx[oh - 1]) {
        memcpy(dst, dst - row_out, (size_t)row_out);
        continue;
      }
      const char *restrict row = src + h->idx[oh] * row_in;
      for (int64_t j = 0; j < w->out; j++)
        memcpy(dst + j * nc, row + w->idx[j] * nc, pix);
    }
  }
}

/* NHWC: interpolates input row `row` along W into h, whole pixels. */
static void resize_hrow_nhwc(const resize_dim *w, int64_t nc, const float *restrict row,
                             float *restrict h) {
  for (int64_t j = 0; j < w->out; j++, h += nc) {
    const float *restrict a = row + w->idx[2 * j] * nc, *restrict b = row + w->idx[2 * j + 1] * nc;
    float wa = w->w[2 * j], wb = w->w[2 * j + 1];
    for (int64_t c = 0; c < nc; c++)
      h[c] = a[c] * wa + b[c] * wb;
  }
}

/* NHWC bilinear: resize_linear_2d with rows of W x C values. */
static void resize_linear_nhwc(const resize_params *p, const float *restrict src,
                               float *restrict dst, float *restrict scratch) {
  const resize_dim *h = &p->dim[2], *w = &p->dim[3];
  int64_t nc = p->c, row_in = w->in * nc, row_out = w->out * nc;
  if (row_out == 0)
    return;
  float *slot[2] = {scratch, scratch + row_out};
  for (int64_t b = 0; b < p->n; b++, src += h->in * row_in) {
    int64_t held[2] = {-1, -1};
    for (int64_t oh = 0; oh < h->out; oh++, dst += row_out) {
      int64_t y0 = h->idx[2 * oh], y1 = h->idx[2 * oh + 1];
      int s0 = held[1] == y0, s1;
      if (held[s0] != y0) {
        s0 = held[0] == y1;
        resize_hrow_nhwc(w, nc, src + y0 * row_in, slot[s0]);
        held[s0] = y0;
      }
      s1 = held[0] == y1 ? 0 : held[1] == y1 ? 1 : !s0;
      if (held[s1] != y1) {
        resize_hrow_nhwc(w, nc, src + y1 * row_in, slot[s1]);
        held[s1] = y1;
      }
      const float *restrict a = slot[s0], *restrict bb = slot[s1];
      float wy0 = h->w[2 * oh], wy1 = h->w[2 * oh + 1];
      for (int64_t j = 0; j < row_out; j++)
        dst[j] = wy0 * a[j] + wy1 * bb[j];
    }
  }
}

/* One axis: [outer, d->in, inner] -> [outer, d->out, inner]. */
static void resize_pass(const resize_dim *d, float extrap, const float *restrict src,
                        float *restrict dst, int64_t outer, int64_t inner) {
  int K = d->taps;
  for (int64_t o = 0; o < outer; o++, src += d->in * inner) {
    for (int64_t j = 0; j < d->out; j++, dst += inner) {
      const int64_t *ix = d->idx + j * K;
      const float *w = d->w + j * K;
      if (d->outside && d->outside[j]) {
        for (int64_t i = 0; i < inner; i++)
          dst[i] = extrap;
      } else if (inner == 1) {
        float acc = w[0] * src[ix[0]];
        for (int t = 1; t < K; t++)
          acc += w[t] * src[ix[t]];
        dst[0] = acc;
      } else {
        const float *restrict s0 = src + ix[0] * inner;
        float w0 = w[0];
        for (int64_t i = 0; i < inner; i++)
          dst[i] = w0 * s0[i];
        for (int t = 1; t < K; t++) {
          const float *restrict st = src + ix[t] * inner;
          float wt = w[t];
          for (int64_t i = 0; i < inner; i++)
            dst[i] += wt * st[i];
        }
      }
    }
  }
}

static void resize_separable(const resize_params *p, const float *src, float *dst,
                             float *scratch) {
  /* passes run from the last active axis down to the first, whose pass
   * writes the output; the ones before it alternate between two buffers */
  int r = p->rank, first = 0, last = r - 1;
  while (p->dim[first].identity)
    first++;
  while (p->dim[last].identity)
    last--;
  int64_t cur[ES_MAX_RANK];
  for (int i = 0; i < r; i++)
    cur[i] = p->dim[i].in;
  const float *from = src;
  int which = 0;
  for (int i = last; i >= first; i--) {
    const resize_dim *d = &p->dim[i];
    if (d->identity)
      continue;
    int64_t outer = 1, inner = 1;
    for (int j = 0; j < i; j++)
      outer *= cur[j];
    for (int j = i + 1; j < r; j++)
      inner *= cur[j];
    float *to = i == first ? dst : scratch + (size_t)which * p->buf_elems;
    resize_pass(d, p->extrapolation, from, to, outer, inner);
    cur[i] = d->out;
    from = to;
    which ^= 1;
  }
}

/* Nearest on elements of any size: each output row reads its input row
 * through the tables of the outer axes, then picks columns. */
static void resize_nearest_bytes(const resize_params *p, const char *src, char *dst) {
  int r = p->rank, l = r - 1;
  size_t esz = p->esz;
  int64_t st[ES_MAX_RANK], odims[ES_MAX_RANK], idx[ES_MAX_RANK] = {0};
  int64_t s = 1;
  for (int i = r - 1; i >= 0; i--) {
    st[i] = s;
    s *= p->dim[i].in;
    odims[i] = p->dim[i].out;
    if (odims[i] == 0)
      return;
  }
  const resize_dim *w = &p->dim[l];
  for (;;) {
    int64_t off = 0;
    for (int i = 0; i < l; i++)
      off += p->dim[i].idx[idx[i]] * st[i];
    const char *row = src + off * (int64_t)esz;
    for (int64_t j = 0; j < w->out; j++, dst += esz)
      memcpy(dst, row + w->idx[j] * (int64_t)esz, esz);
    int d = l - 1;
    while (d >= 0 && ++idx[d] == odims[d])
      idx[d--] = 0;
    if (d < 0)
      return;
  }
}

static int resize_run(const es_kinst *k, const void *const *in, void *const *out,
                      void *scratch) {
  const resize_params *p = k->params;
  switch (p->path) {
  case PATH_COPY:
    memcpy(out[0], in[0], (size_t)p->count * p->esz);
    break;
  case PATH_NEAREST_BYTES:
    resize_nearest_bytes(p, in[0], out[0]);
    break;
  case PATH_NEAREST_2D:
    if (p->nhwc)
      resize_nearest_nhwc(p, in[0], out[0]);
    else
      resize_nearest_2d(p, in[0], out[0]);
    break;
  case PATH_LINEAR_2D:
    if (p->nhwc)
      resize_linear_nhwc(p, in[0], out[0], scratch);
    else
      resize_linear_2d(p, in[0], out[0], scratch);
    break;
  default:
    resize_separable(p, in[0], out[0], scratch);
    break;
  }
  return 0;
}

/* ==========================================================================
 * Family
 * ======================================================================== */

static const es_kernel resize_kernel = {resize_infer, resize_run, NULL, 1};
static const es_kernel upsample_kernel = {upsample_infer, resize_run, NULL, 1};

const es_kernel *es__kernels_resize(es_op op) {
  return op == ES_OP_Resize ? &resize_kernel : op == ES_OP_Upsample ? &upsample_kernel : NULL;
}
