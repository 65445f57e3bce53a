/* Pooling: MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool,
 * GlobalLpPool (float32; MaxPool also uint8 and int8), and com.microsoft's
 * QLinearAveragePool (8-bit: what a QDQ AveragePool lowers to).
 *
 * Every windowed pool is planned in one canonical form: N*C independent
 * planes of D x H x W, a 1-D or 2-D pool getting leading spatial axes of size
 * 1 (kernel 1, stride 1, no padding). infer resolves auto_pad, ceil_mode and
 * the asymmetric pads into per-axis tables so run never tests a bound:
 *
 *   - for each output index along D, H and W, the range of kernel taps that
 *     land inside the input (padding never contributes: it is -inf for max
 *     and excluded or counted-but-zero for average);
 *   - for each kernel column, the range of output columns whose tap is
 *     inside the input row;
 *   - for average, per-axis reciprocal tap counts: the divisor is a product
 *     of per-axis counts, because a window is a box clipped per axis, both
 *     with count_include_pad = 0 (taps inside the input) and 1 (taps inside
 *     the padded input; with ceil_mode a window may run past even that).
 *
 * run then walks, for each output row, the valid (kd, kh) input rows and for
 * each kernel column does one pass over the output columns: out[ow] =
 * max(out[ow], row[ow*sw + off]). With stride 1 that inner loop is a
 * contiguous vectorisable max/add; it is also the 2-D NCHW fast path, since
 * a 2-D pool only has one depth slice.
 *
 * MaxPool's optional Indices output (flat indices into X; storage_order 1
 * orders the spatial axes column-major) takes a scalar path.
 *
 * Layouts. The kernels are layout-aware so that activations stay
 * channels-last between convolutions. A 2-D or 3-D pool of a channels-last
 * input (NHWC, NDHWC) writes channels-last: the same tap tables, walked per
 * output pixel, with the channel loop innermost (a contiguous max/add over
 * C that vectorises whatever the stride). Plain inputs (every 1-D pool)
 * take the plane path above; MaxPool with Indices asks for a plain input,
 * as its indices are defined on the NCHW order. The global pools of a
 * channels-last input fold pixel rows of C channels (sum, max, or sum of
 * |x|^p then the p-th root); their [N, C, 1, 1(, 1)] output has the same
 * bytes in both layouts and is marked channels-last, the layout of the
 * squeeze-and-excitation convolution that usually reads it (a plain one
 * would cost a Relayout step there, if a free one); elementwise ops take
 * it against channels-last tensors as they are. */
#include "kernels/kernel.h"

#include <math.h>
#include <string.h>

#include "kernels/ew_math.h"

/* ==========================================================================
 * Plan
 * ======================================================================== */

enum { POOL_MAX = 0, POOL_AVG = 1 };

/* Attribute values above this are rejected so int64 shape arithmetic cannot
 * overflow (inputs have at most 2^40 elements). */
#define POOL_ATTR_MAX ((int64_t)1 << 31)

typedef struct pool_axis {
  int64_t in, out;    /* input and output extent */
  int64_t k, s, d;    /* kernel, stride, dilation */
  int64_t pb;         /* padding before */
  int64_t *tap_lo;    /* [out]: first kernel tap inside the input */
  int64_t *tap_hi;    /* [out]: one past the last */
  float *inv;         /* [out]: average: 1 / taps counted (0 when none) */
} pool_axis;

typedef struct pool_params {
  int kind;           /* POOL_MAX / POOL_AVG */
  es_dtype dtype;
  int64_t planes;     /* N * C */
  pool_axis ax[3];    /* D, H, W */
  int64_t *col_lo;    /* [ax[2].k]: first output column whose tap kw is inside */
  int64_t *col_hi;    /* [ax[2].k]: one past the last */
  int indices;        /* MaxPool: write output 1 */
  int col_major;      /* storage_order 1: Indices count the spatial axes column-major */
  int nhwc;           /* X and Y channels-last (NHWC, NDHWC): pixel-major walk */
  int64_t n, c;       /* N and C, for the NHWC walk */
  int q;              /* QLinearAveragePool: X and Y 8-bit, scales and zero points inputs 1-4 */
  int xs, ys;         /* ... X, Y signed */
} pool_params;

static int64_t ceil_div(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }
static int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
static int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Reads an ints attribute of exactly n values each in [lo, POOL_ATTR_MAX],
 * or fills def when absent. */
static int pool_attr_ints(const es_kinst *k, const char *name, size_t n, int64_t lo, int64_t def,
                          int64_t *out) {
  const int64_t *v;
  size_t len;
  int rc = es__attr_ints(k, name, &v, &len);
  if (rc < 0)
    return rc;
  if (!v) {
    for (size_t i = 0; i < n; i++)
      out[i] = def;
    return 0;
  }
  if (len != n)
    return ES_KFAIL(k, ES_EMODEL, "attribute '%s' has %zu values, expected %zu", name, len, n);
  for (size_t i = 0; i < n; i++) {
    if (v[i] < lo || v[i] > POOL_ATTR_MAX)
      return ES_KFAIL(k, ES_EMODEL, "attribute '%s'[%zu] = %lld, expected %lld..%lld", name, i,
                      (long long)v[i], (long long)lo, (long long)POOL_ATTR_MAX);
    out[i] = v[i];
  }
  return 0;
}

/* Fills one axis' tables; pe is the padding after (for count_include_pad). */
static int pool_axis_tables(es_kinst *k, pool_axis *a, int64_t pe, int kind, int include_pad) {
  int64_t n = a->out;
  a->tap_lo = es__kinst_alloc(k, (size_t)n * sizeof *a->tap_lo + 1);
  a->tap_hi = es__kinst_alloc(k, (size_t)n * sizeof *a->tap_hi + 1);
  if (kind == POOL_AVG)
    a->inv = es__kinst_alloc(k, (size_t)n * sizeof *a->inv + 1);
  if (!a->tap_lo || !a->tap_hi || (kind == POOL_AVG && !a->inv))
    return ES_KFAIL(k, ES_ENOMEM, "out of memory for pooling tables");
  for (int64_t o = 0; o < n; o++) {
    int64_t start = o * a->s - a->pb; /* input position of tap 0 */
    int64_t lo = start >= 0 ? 0 : ceil_div(-start, a->d);
    int64_t hi = a->in - 1 - start < 0 ? 0 : floor_div(a->in - 1 - start, a->d) + 1;
    lo = clamp64(lo, 0, a->k);
    hi = clamp64(hi, lo, a->k);
    a->tap_lo[o] = lo;
    a->tap_hi[o] = hi;
    if (kind == POOL_AVG) {
      int64_t cnt = hi - lo;
      if (include_pad) {
        /* taps inside [-pb, in + pe): tap 0 always is (start >= -pb) */
        int64_t last = a->in + pe - 1 - start;
        cnt = last < 0 ? 0 : clamp64(floor_div(last, a->d) + 1, 0, a->k);
      }
      a->inv[o] = cnt > 0 ? 1.0f / (float)cnt : 0.0f;
    }
  }
  return 0;
}

/* Output extent and padding of one spatial axis from auto_pad and pads. */
static int pool_axis_shape(es_kinst *k, int axis, const char *auto_pad, int ceil_mode, int64_t pb,
                           int64_t pe, pool_axis *a, int64_t *pe_out) {
  int64_t ext = (a->k - 1) * a->d + 1;
  if (!strcmp(auto_pad, "SAME_UPPER") || !strcmp(auto_pad, "SAME_LOWER")) {
    a->out = ceil_div(a->in, a->s);
    int64_t total = (a->out - 1) * a->s + ext - a->in;
    if (total < 0)
      total = 0;
    pb = auto_pad[5] == 'U' ? total / 2 : total - total / 2;
    pe = total - pb;
  } else {
    if (!strcmp(auto_pad, "VALID"))
      pb = pe = 0;
    int64_t span = a->in + pb + pe - ext;
    if (span < 0)
      return ES_KFAIL(k, ES_EMODEL,
                      "spatial axis %d: kernel extent %lld exceeds the padded input %lld", axis,
                      (long long)ext, (long long)(a->in + pb + pe));
    if (ceil_mode && strcmp(auto_pad, "VALID")) {
      a->out = ceil_div(span, a->s) + 1;
      /* a last window starting inside the end padding is dropped (as
       * PyTorch and ONNX Runtime do) */
      if ((a->out - 1) * a->s >= a->in + pb)
        a->out--;
    } else {
      a->out = span / a->s + 1;
    }
  }
  a->pb = pb;
  *pe_out = pe;
  return 0;
}

static int pool_infer_common(es_kinst *k, int kind) {
  if (k->n_in < 1 || !k->in[0])
    return ES_KFAIL(k, ES_EMODEL, "input X is missing");
  if (k->n_out < 1 || !k->out[0])
    return ES_KFAIL(k, ES_EMODEL, "output Y is missing");
  const es_tdesc *x = k->in[0];
  int q = k->node.op == ES_OP_QLinearAveragePool, is8 = x->dtype == ES_DTYPE_UINT8 ||
                                                         x->dtype == ES_DTYPE_INT8;
  int ok_type = q ? is8 : x->dtype == ES_DTYPE_FLOAT || (kind == POOL_MAX && is8);
  if (!ok_type)
    return ES_KFAIL(k, ES_EMODEL, "X is %s, expected %s", es_dtype_name(x->dtype),
                    q ? "uint8 or int8" : kind == POOL_MAX ? "float32, uint8 or int8" : "float32");
  es_dtype yt = x->dtype;
  if (q) { /* x_scale, x_zero_point, y_scale, y_zero_point: scalars */
    static const char *const names[4] = {"x_scale", "x_zero_point", "y_scale", "y_zero_point"};
    if (k->n_in != 5)
      return ES_KFAIL(k, ES_EMODEL, "%d inputs, expected 5 (X and its and Y's scale and zero "
                      "point)", k->n_in);
    for (int i = 1; i < 5; i++) {
      const es_tdesc *t = k->in[i];
      if (!t || t->count != 1 || t->rank > 1)
        return ES_KFAIL(k, ES_EMODEL, "%s must be one value", names[i - 1]);
      if ((i == 1 || i == 3) ? t->dtype != ES_DTYPE_FLOAT
                             : (t->dtype != ES_DTYPE_UINT8 && t->dtype != ES_DTYPE_INT8))
        return ES_KFAIL(k, ES_EMODEL, "%s is %s", names[i - 1], es_dtype_name(t->dtype));
    }
    if (k->in[2]->dtype != x->dtype)
      return ES_KFAIL(k, ES_EMODEL, "x_zero_point is %s, X %s", es_dtype_name(k->in[2]->dtype),
                      es_dtype_name(x->dtype));
    yt = k->in[4]->dtype;
    int64_t last;
    int rc0 = es__attr_int(k, "channels_last", 0, &last);
    if (rc0 < 0)
      return rc0;
    if (last)
      return ES_KFAIL(k, ES_ENOTSUP, "channels_last 1 (X stored [N, spatial..., C]) is not "
                      "supported; the QDQ lowering writes channels_last 0");
  }
  if (x->rank < 3 || x->rank > 5)
    return ES_KFAIL(k, x->rank < 3 ? ES_EMODEL : ES_ENOTSUP,
                    "X has rank %d, expected 3 to 5 (N, C and 1 to 3 spatial axes)", x->rank);
  int ns = x->rank - 2;

  int64_t kern[3], str[3], dil[3], pads[6];
  const int64_t *kv;
  size_t kn;
  int rc = es__attr_ints(k, "kernel_shape", &kv, &kn);
  if (rc < 0)
    return rc;
  if (!kv)
    return ES_KFAIL(k, ES_EMODEL, "attribute 'kernel_shape' is required");
  if ((rc = pool_attr_ints(k, "kernel_shape", (size_t)ns, 1, 1, kern)) < 0 ||
      (rc = pool_attr_ints(k, "strides", (size_t)ns, 1, 1, str)) < 0 ||
      (rc = pool_attr_ints(k, "dilations", (size_t)ns, 1, 1, dil)) < 0 ||
      (rc = pool_attr_ints(k, "pads", (size_t)ns * 2, 0, 0, pads)) < 0)
    return rc;
  const char *auto_pad;
  int64_t ceil_mode, storage_order, include_pad = 0;
  if ((rc = es__attr_string(k, "auto_pad", "NOTSET", &auto_pad)) < 0 ||
      (rc = es__attr_int(k, "ceil_mode", 0, &ceil_mode)) < 0 ||
      (rc = es__attr_int(k, "storage_order", 0, &storage_order)) < 0)
    return rc;
  if (kind == POOL_AVG && (rc = es__attr_int(k, "count_include_pad", 0, &include_pad)) < 0)
    return rc;
  if (strcmp(auto_pad, "NOTSET") && strcmp(auto_pad, "SAME_UPPER") &&
      strcmp(auto_pad, "SAME_LOWER") && strcmp(auto_pad, "VALID"))
    return ES_KFAIL(k, ES_EMODEL,
                    "auto_pad is '%s', expected NOTSET, SAME_UPPER, SAME_LOWER or VALID", auto_pad);
  if (ceil_mode != 0 && ceil_mode != 1)
    return ES_KFAIL(k, ES_EMODEL, "ceil_mode is %lld, expected 0 or 1", (long long)ceil_mode);
  if (storage_order != 0 && storage_order != 1)
    return ES_KFAIL(k, ES_EMODEL, "storage_order is %lld, expected 0 or 1",
                    (long long)storage_order);
  if (include_pad != 0 && include_pad != 1)
    return ES_KFAIL(k, ES_EMODEL, "count_include_pad is %lld, expected 0 or 1",
                    (long long)include_pad);

  int indices = kind == POOL_MAX && k->n_out > 1 && k->out[1];
  if (k->n_out > (kind == POOL_MAX ? 2 : 1))
    return ES_KFAIL(k, ES_EMODEL, "%d outputs, expected at most %d", k->n_out,
                    kind == POOL_MAX ? 2 : 1);
  if (indices && x->dtype != ES_DTYPE_FLOAT)
    return ES_KFAIL(k, ES_ENOTSUP, "Indices for %s input not implemented",
                    es_dtype_name(x->dtype));
  /* Indices number the elements of NCHW order: computed on a plain X. */
  int nhwc = x->layout == ES_LAYOUT_NHWC;
  if (nhwc && indices) {
    k->want_plain = 1;
    return ES_KRELAYOUT;
  }

  pool_params *p = es__kinst_alloc(k, sizeof *p);
  if (!p)
    return ES_KFAIL(k, ES_ENOMEM, "out of memory for pooling parameters");
  p->kind = kind;
  p->dtype = x->dtype;
  p->q = q;
  p->xs = x->dtype == ES_DTYPE_INT8;
  p->ys = yt == ES_DTYPE_INT8;
  p->planes = x->dims[0] * x->dims[1];
  p->indices = indices;
  p->col_major = (int)storage_order;
  p->nhwc = nhwc;
  p->n = x->dims[0];
  p->c = x->dims[1];
  int64_t pe[3] = {0, 0, 0};
  int64_t odims[ES_MAX_RANK] = {x->dims[0], x->dims[1]};
  for (int a = 0; a < 3; a++) {
    int i = a - (3 - ns); /* spatial attribute index; < 0 for a padded axis */
    pool_axis *ax = &p->ax[a];
    ax->k = ax->s = ax->d = 1;
    ax->in = ax->out = 1;
    if (i < 0)
      continue;
    ax->in = x->dims[2 + i];
    ax->k = kern[i];
    ax->s = str[i];
    ax->d = dil[i];
    if ((rc = pool_axis_shape(k, i, auto_pad, (int)ceil_mode, pads[i], pads[i + ns], ax,
                              &pe[a])) < 0)
      return rc;
    odims[2 + i] = ax->out;
  }
  if ((rc = es__tdesc_set(k->out[0], yt, x->rank, odims)) < 0)
    return rc;
  k->out[0]->layout = x->layout;
  if (q && !nhwc) /* the plane path's sums of one output row */
    k->scratch_bytes = (size_t)p->ax[2].out * sizeof(int64_t);
  if (indices && (rc = es__tdesc_set(k->out[1], ES_DTYPE_INT64, x->rank, odims)) < 0)
    return rc;
  for (int a = 0; a < 3; a++)
    if ((rc = pool_axis_tables(k, &p->ax[a], pe[a], kind, (int)include_pad)) < 0)
      return rc;

  /* output column ow reads input column ow*s + kw*d - pb */
  const pool_axis *w = &p->ax[2];
  p->col_lo = es__kinst_alloc(k, (size_t)w->k * sizeof *p->col_lo);
  p->col_hi = es__kinst_alloc(k, (size_t)w->k * sizeof *p->col_hi);
  if (!p->col_lo || !p->col_hi)
    return ES_KFAIL(k, ES_ENOMEM, "out of memory for pooling tables");
  for (int64_t kw = 0; kw < w->k; kw++) {
    int64_t off = kw * w->d - w->pb;
    int64_t lo = off >= 0 ? 0 : ceil_div(-off, w->s);
    int64_t hi = w->in - 1 - off < 0 ? 0 : floor_div(w->in - 1 - off, w->s) + 1;
    lo = clamp64(lo, 0, w->out);
    p->col_lo[kw] = lo;
    p->col_hi[kw] = clamp64(hi, lo, w->out);
  }
  k->params = p;
  return 0;
}

static int maxpool_infer(es_kinst *k) { return pool_infer_common(k, POOL_MAX); }
static int avgpool_infer(es_kinst *k) { return pool_infer_common(k, POOL_AVG); }

/* ==========================================================================
 * Run: windowed pools
 * ======================================================================== */

/* One plane of max pooling for element type T; empty windows give lowest. */
#define POOL_MAX_PLANE(name, T, lowest)                                                   \
  ES_KCLONES                                                                              \
  static void name(const pool_params *p, const T *restrict src, T *restrict dst) {        \
    const pool_axis *ad = &p->ax[0], *ah = &p->ax[1], *aw = &p->ax[2];                    \
    int64_t ow_n = aw->out, sw = aw->s;                                                   \
    for (int64_t od = 0; od < ad->out; od++)                                              \
      for (int64_t oh = 0; oh < ah->out; oh++) {                                          \
        T *restrict o = dst + (od * ah->out + oh) * ow_n;                                 \
        for (int64_t i = 0; i < ow_n; i++)                                                \
          o[i] = (lowest);                                                                \
        for (int64_t kd = ad->tap_lo[od]; kd < ad->tap_hi[od]; kd++) {                    \
          int64_t id = od * ad->s - ad->pb + kd * ad->d;                                  \
          for (int64_t kh = ah->tap_lo[oh]; kh < ah->tap_hi[oh]; kh++) {                  \
            int64_t ih = oh * ah->s - ah->pb + kh * ah->d;                                \
            const T *restrict row = src + (id * ah->in + ih) * aw->in;                    \
            for (int64_t kw = 0; kw < aw->k; kw++) {                                      \
              int64_t off = kw * aw->d - aw->pb, lo = p->col_lo[kw], hi = p->col_hi[kw];  \
              if (sw == 1) {                                                              \
                for (int64_t i = lo; i < hi; i++) {                                       \
                  T v = row[i + off];                                                     \
                  o[i] = v > o[i] ? v : o[i];                                             \
                }                                                                         \
              } else {                                                                    \
                for (int64_t i = lo; i < hi; i++) {                                       \
                  T v = row[i * sw + off];                                                \
                  o[i] = v > o[i] ? v : o[i];                                             \
                }                                                                         \
              }                                                                           \
            }                                                                             \
          }                                                                               \
        }                                                                                 \
      }                                                                                   \
  }

POOL_MAX_PLANE(pool_max_plane_f32, float, -INFINITY)
POOL_MAX_PLANE(pool_max_plane_u8, uint8_t, 0)
POOL_MAX_PLANE(pool_max_plane_i8, int8_t, INT8_MIN)

ES_KCLONES static void pool_avg_plane_f32(const pool_params *p, const float *restrict src,
                                          float *restrict dst) {
  const pool_axis *ad = &p->ax[0], *ah = &p->ax[1], *aw = &p->ax[2];
  int64_t ow_n = aw->out, sw = aw->s;
  for (int64_t od = 0; od < ad->out; od++)
    for (int64_t oh = 0; oh < ah->out; oh++) {
      float *restrict o = dst + (od * ah->out + oh) * ow_n;
      for (int64_t i = 0; i < ow_n; i++)
        o[i] = 0.0f;
      for (int64_t kd = ad->tap_lo[od]; kd < ad->tap_hi[od]; kd++) {
        int64_t id = od * ad->s - ad->pb + kd * ad->d;
        for (int64_t kh = ah->tap_lo[oh]; kh < ah->tap_hi[oh]; kh++) {
          int64_t ih = oh * ah->s - ah->pb + kh * ah->d;
          const float *restrict row = src + (id * ah->in + ih) * aw->in;
          for (int64_t kw = 0; kw < aw->k; kw++) {
            int64_t off = kw * aw->d - aw->pb, lo = p->col_lo[kw], hi = p->col_hi[kw];
            if (sw == 1)
              for (int64_t i = lo; i < hi; i++)
                o[i] += row[i + off];
            else
              for (int64_t i = lo; i < hi; i++)
                o[i] += row[i * sw + off];
          }
        }
      }
      float f = ad->inv[od] * ah->inv[oh];
      const float *restrict inv_w = aw->inv;
      for (int64_t i = 0; i < ow_n; i++)
        o[i] *= f * inv_w[i];
    }
}

/* Channels-last: each output pixel is a max over its window's input
 * pixels, C channels at a time; empty windows give lowest. A 2-D pool has
 * depth 1 (one tap). */
#define POOL_MAX_NHWC(name, T, lowest)                                                    \
  ES_KCLONES                                                                              \
  static void name(const pool_params *p, const T *restrict src, T *restrict dst) {        \
    const pool_axis *ad = &p->ax[0], *ah = &p->ax[1], *aw = &p->ax[2];                    \
    int64_t nc = p->c;                                                                    \
    for (int64_t b = 0; b < p->n; b++, src += ad->in * ah->in * aw->in * nc)              \
      for (int64_t od = 0; od < ad->out; od++)                                            \
        for (int64_t oh = 0; oh < ah->out; oh++)                                          \
          for (int64_t ow = 0; ow < aw->out; ow++, dst += nc) {                           \
            for (int64_t c = 0; c < nc; c++)                                              \
              dst[c] = (lowest);                                                          \
            for (int64_t kd = ad->tap_lo[od]; kd < ad->tap_hi[od]; kd++) {                \
              int64_t id = od * ad->s - ad->pb + kd * ad->d;                              \
              for (int64_t kh = ah->tap_lo[oh]; kh < ah->tap_hi[oh]; kh++) {              \
                int64_t ih = oh * ah->s - ah->pb + kh * ah->d;                            \
                for (int64_t kw = aw->tap_lo[ow]; kw < aw->tap_hi[ow]; kw++) {            \
                  int64_t iw = ow * aw->s - aw->pb + kw * aw->d;                          \
                  const T *restrict px = src + ((id * ah->in + ih) * aw->in + iw) * nc;   \
                  for (int64_t c = 0; c < nc; c++)                                        \
                    dst[c] = px[c] > dst[c] ? px[c] : dst[c];                             \
                }                                                                         \
              }                                                                           \
            }                                                                             \
          }                                                                               \
  }

POOL_MAX_NHWC(pool_max_nhwc_f32, float, -INFINITY)
POOL_MAX_NHWC(pool_max_nhwc_u8, uint8_t, 0)
POOL_MAX_NHWC(pool_max_nhwc_i8, int8_t, INT8_MIN)

/* Channels-last average: the same sums in the same order as the plane
 * path (kd, kh, kw), scaled by the same product, so both layouts give
 * identical results. The channels go in blocks of AVG_CB held in a local
 * accumulator the compiler keeps in vector registers, so each tap costs
 * loads and adds, not a load and store of the output as well (inception_v3's
 * 35x35x288 3x3 pools took about 3x longer that way). */
#define AVG_CB 64

ES_KCLONES static void pool_avg_nhwc_f32(const pool_params *p, const float *restrict src,
                                         float *restrict dst) {
  const pool_axis *ad = &p->ax[0], *ah = &p->ax[1], *aw = &p->ax[2];
  int64_t nc = p->c;
  for (int64_t b = 0; b < p->n; b++, src += ad->in * ah->in * aw->in * nc)
    for (int64_t od = 0; od < ad->out; od++)
      for (int64_t oh = 0; oh < ah->out; oh++)
        for (int64_t ow = 0; ow < aw->out; ow++, dst += nc) {
          float f = ad->inv[od] * ah->inv[oh] * aw->inv[ow];
          for (int64_t c0 = 0; c0 < nc; c0 += AVG_CB) {
            int64_t cn = nc - c0 < AVG_CB ? nc - c0 : AVG_CB;
            float acc[AVG_CB] = {0};
            for (int64_t kd = ad->tap_lo[od]; kd < ad->tap_hi[od]; kd++) {
              int64_t id = od * ad->s - ad->pb + kd * ad->d;
              for (int64_t kh = ah->tap_lo[oh]; kh < ah->tap_hi[oh]; kh++) {
                int64_t ih = oh * ah->s - ah->pb + kh * ah->d;
                for (int64_t kw = aw->tap_lo[ow]; kw < aw->tap_hi[ow]; kw++) {
                  int64_t iw = ow * aw->s - aw->pb + kw * aw->d;
                  const float *restrict px =
                      src + ((id * ah->in + ih) * aw->in + iw) * nc + c0;
                  if (cn == AVG_CB)
                    for (int c = 0; c < AVG_CB; c++)
                      acc[c] += px[c];
                  else
                    for (int64_t c = 0; c < cn; c++)
                      acc[c] += px[c];
                }
              }
            }
            for (int64_t c = 0; c < cn; c++)
              dst[c0 + c] = acc[c] * f;
          }
        }
}

/* Max with flat indices into X, counting N and C, the spatial axes row-major
 * (storage_order 0) or column-major (1). Scalar: the Indices output is for
 * training-style graphs, not the hot path. */
static void pool_max_indices_f32(const pool_params *p, const float *src, float *dst,
                                 int64_t *idx) {
  const pool_axis *ad = &p->ax[0], *ah = &p->ax[1], *aw = &p->ax[2];
  int64_t plane_in = ad->in * ah->in * aw->in;
  for (int64_t c = 0; c < p->planes; c++) {
    const float *s = src + c * plane_in;
    for (int64_t od = 0; od < ad->out; od++)
      for (int64_t oh = 0; oh < ah->out; oh++)
        for (int64_t ow = 0; ow < aw->out; ow++) {
          float best = -INFINITY;
          int64_t at = -1;
          for (int64_t kd = ad->tap_lo[od]; kd < ad->tap_hi[od]; kd++)
            for (int64_t kh = ah->tap_lo[oh]; kh < ah->tap_hi[oh]; kh++)
              for (int64_t kw = aw->tap_lo[ow]; kw < aw->tap_hi[ow]; kw++) {
                int64_t id = od * ad->s - ad->pb + kd * ad->d;
                int64_t ih = oh * ah->s - ah->pb + kh * ah->d;
                int64_t iw = ow * aw->s - aw->pb + kw * aw->d;
                int64_t off = (id * ah->in + ih) * aw->in + iw;
                if (at < 0 || s[off] > best) {
                  best = s[off];
                  at = c * plane_in +
                       (p->col_major ? id + (ih + iw * ah->in) * ad->in : off);
                }
              }
          *dst++ = best;
          *idx++ = at < 0 ? 0 : at;
        }
  }
}

/* QLinearAveragePool: the window's integer sum of (x - zx) (padding adds
 * nothing: its dequantized value is 0; 64 bits, as a window may hold more
 * than 2^23 taps), times the same per-axis inverse counts as the float
 * path, times x_scale / y_scale, rounded half to even, plus zy, saturated
 * (NaN, from a NaN or infinite scale, gives the zero point, as
 * QuantizeLinear's rule). One step from ONNX Runtime's float average where
 * a product rounds apart. */
static inline int32_t qavg_at(const void *x, int s, int64_t i) {
  return s ? ((const int8_t *)x)[i] : ((const uint8_t *)x)[i];
}

static inline void qavg_store(void *y, int s, int64_t i, float v, int32_t zy) {
  float r = v == v ? nearbyintf(v) + (float)zy : (float)zy;
  float lo = s ? -128.0f : 0.0f, hi = s ? 127.0f : 255.0f;
  r = r < lo ? lo : r > hi ? hi : r;
  if (s)
    ((int8_t *)y)[i] = (int8_t)r;
  else
    ((uint8_t *)y)[i] = (uint8_t)r;
}

static void qavg_run(const pool_params *p, const void *const *in, void *y, int64_t *acc) {
  const pool_axis *ad = &p->ax[0], *ah = &p->ax[1], *aw = &p->ax[2];
  const void *x = in[0];
  float m = *(const float *)in[1] / *(const float *)in[3];
  int32_t zx = qavg_at(in[2], p->xs, 0), zy = qavg_at(in[4], p->ys, 0);
  int64_t plane_in = ad->in * ah->in * aw->in, plane_out = ad->out * ah->out * aw->out;
  if (p->nhwc) { /* pixel by pixel, the channels innermost */
    int64_t nc = p->c, yo = 0;
    for (int64_t b = 0; b < p->n; b++)
      for (int64_t od = 0; od < ad->out; od++)
        for (int64_t oh = 0; oh < ah->out; oh++)
          for (int64_t ow = 0; ow < aw->out; ow++, yo += nc) {
            float f = ad->inv[od] * ah->inv[oh] * aw->inv[ow] * m;
            for (int64_t c0 = 0; c0 < nc; c0 += AVG_CB) {
              int64_t cn = nc - c0 < AVG_CB ? nc - c0 : AVG_CB;
              int64_t a[AVG_CB] = {0};
              for (int64_t kd = ad->tap_lo[od]; kd < ad->tap_hi[od]; kd++) {
                int64_t id = od * ad->s - ad->pb + kd * ad->d;
                for (int64_t kh = ah->tap_lo[oh]; kh < ah->tap_hi[oh]; kh++) {
                  int64_t ih = oh * ah->s - ah->pb + kh * ah->d;
                  for (int64_t kw = aw->tap_lo[ow]; kw < aw->tap_hi[ow]; kw++) {
                    int64_t iw = ow * aw->s - aw->pb + kw * aw->d;
                    int64_t px = b * plane_in * nc + ((id * ah->in + ih) * aw->in + iw) * nc + c0;
                    for (int64_t c = 0; c < cn; c++)
                      a[c] += qavg_at(x, p->xs, px + c) - zx;
                  }
                }
              }
              for (int64_t c = 0; c < cn; c++)
                qavg_store(y, p->ys, yo + c0 + c, (float)a[c] * f, zy);
            }
          }
    return;
  }
  for (int64_t pl = 0; pl < p->planes; pl++) {
    int64_t xi0 = pl * plane_in, yi0 = pl * plane_out;
    for (int64_t od = 0; od < ad->out; od++)
      for (int64_t oh = 0; oh < ah->out; oh++) {
        memset(acc, 0, (size_t)aw->out * sizeof *acc);
        for (int64_t kd = ad->tap_lo[od]; kd < ad->tap_hi[od]; kd++) {
          int64_t id = od * ad->s - ad->pb + kd * ad->d;
          for (int64_t kh = ah->tap_lo[oh]; kh < ah->tap_hi[oh]; kh++) {
            int64_t ih = oh * ah->s - ah->pb + kh * ah->d, row = xi0 + (id * ah->in + ih) * aw->in;
            for (int64_t kw = 0; kw < aw->k; kw++) {
              int64_t off = kw * aw->d - aw->pb;
              for (int64_t i = p->col_lo[kw]; i < p->col_hi[kw]; i++)
                acc[i] += qavg_at(x, p->xs, row + i * aw->s + off) - zx;
            }
          }
        }
        float f = ad->inv[od] * ah->inv[oh] * m;
        int64_t yo = yi0 + (od * ah->out + oh) * aw->out;
        for (int64_t i = 0; i < aw->out; i++)
          qavg_store(y, p->ys, yo + i, (float)acc[i] * (f * aw->inv[i]), zy);
      }
  }
}

static int pool_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  const pool_params *p = k->params;
  int64_t plane_in = p->ax[0].in * p->ax[1].in * p->ax[2].in;
  int64_t plane_out = p->ax[0].out * p->ax[1].out * p->ax[2].out;
  if (p->q) {
    qavg_run(p, in, out[0], scratch);
    return 0;
  }
  if (p->indices) {
    pool_max_indices_f32(p, in[0], out[0], out[1]);
    return 0;
  }
  if (p->nhwc) {
    if (p->kind == POOL_AVG)
      pool_avg_nhwc_f32(p, in[0], out[0]);
    else if (p->dtype == ES_DTYPE_FLOAT)
      pool_max_nhwc_f32(p, in[0], out[0]);
    else if (p->dtype == ES_DTYPE_UINT8)
      pool_max_nhwc_u8(p, in[0], out[0]);
    else
      pool_max_nhwc_i8(p, in[0], out[0]);
    return 0;
  }
  for (int64_t c = 0; c < p->planes; c++) {
    if (p->kind == POOL_AVG)
      pool_avg_plane_f32(p, (const float *)in[0] + c * plane_in, (float *)out[0] + c * plane_out);
    else if (p->dtype == ES_DTYPE_FLOAT)
      pool_max_plane_f32(p, (const float *)in[0] + c * plane_in, (float *)out[0] + c * plane_out);
    else if (p->dtype == ES_DTYPE_UINT8)
      pool_max_plane_u8(p, (const uint8_t *)in[0] + c * plane_in,
                        (uint8_t *)out[0] + c * plane_out);
    else
      pool_max_plane_i8(p, (const int8_t *)in[0] + c * plane_in, (int8_t *)out[0] + c * plane_out);
  }
  return 0;
}

/* ==========================================================================
 * GlobalAveragePool, GlobalMaxPool, GlobalLpPool
 * ======================================================================== */

enum { GP_AVG, GP_MAX, GP_LP };

typedef struct gap_params {
  int64_t planes, size; /* N * C planes of `size` elements */
  int nhwc;             /* X channels-last: N images of `size` pixels of c channels */
  int64_t n, c;
  int kind;             /* GP_* */
  int64_t p;            /* GlobalLpPool's p */
} gap_params;

/* NHWC sums add pixel rows into a block partial first (scratch), then the
 * partial into the total, keeping the error close to the plane path's. */
#define GAP_BLOCK 64

static int gap_infer(es_kinst *k) {
  if (k->n_in < 1 || !k->in[0])
    return ES_KFAIL(k, ES_EMODEL, "input X is missing");
  if (k->n_out != 1 || !k->out[0])
    return ES_KFAIL(k, ES_EMODEL, "%d outputs, expected 1", k->n_out);
  const es_tdesc *x = k->in[0];
  if (x->dtype != ES_DTYPE_FLOAT)
    return ES_KFAIL(k, ES_EMODEL, "X is %s, expected float32", es_dtype_name(x->dtype));
  if (x->rank < 3)
    return ES_KFAIL(k, ES_EMODEL, "X has rank %d, expected at least 3 (N, C, spatial...)",
                    x->rank);
  gap_params *p = es__kinst_alloc(k, sizeof *p);
  if (!p)
    return ES_KFAIL(k, ES_ENOMEM, "out of memory for pooling parameters");
  p->kind = k->node.op == ES_OP_GlobalMaxPool ? GP_MAX
            : k->node.op == ES_OP_GlobalLpPool ? GP_LP
                                               : GP_AVG;
  if (p->kind == GP_LP) {
    int rc = es__attr_int(k, "p", 2, &p->p);
    if (rc < 0)
      return rc;
    if (p->p < 1 || p->p > 1024)
      return ES_KFAIL(k, ES_EMODEL, "p is %lld, expected 1 to 1024", (long long)p->p);
  }
  int64_t odims[ES_MAX_RANK];
  p->planes = x->dims[0] * x->dims[1];
  p->size = 1;
  for (int i = 0; i < x->rank; i++) {
    odims[i] = i < 2 ? x->dims[i] : 1;
    if (i >= 2)
      p->size *= x->dims[i];
  }
  p->nhwc = x->layout == ES_LAYOUT_NHWC;
  p->n = x->dims[0];
  p->c = x->dims[1];
  if (p->nhwc)
    k->scratch_bytes = (size_t)p->c * sizeof(float);
  k->params = p;
  int rc = es__tdesc_set(k->out[0], ES_DTYPE_FLOAT, x->rank, odims);
  if (rc == 0)
    k->out[0]->layout = x->layout;
  return rc;
}

/* GlobalLpPool's sum of |v|^p over one plane. */
static float gap_lp_sum(const float *restrict x, int64_t n, int64_t pw) {
  float acc[8] = {0};
  int64_t i = 0;
  if (pw == 1 || pw == 2) {
    for (; i + 8 <= n; i += 8)
      for (int t = 0; t < 8; t++)
        acc[t] += pw == 1 ? fabsf(x[i + t]) : x[i + t] * x[i + t];
  }
  float s = es__ew_hsum8(acc);
  for (; i < n; i++)
    s += pw == 1 ? fabsf(x[i]) : pw == 2 ? x[i] * x[i] : powf(fabsf(x[i]), (float)pw);
  return s;
}

/* The p-th root of an Lp sum. */
static float gap_lp_root(float s, int64_t pw) {
  return pw == 1 ? s : pw == 2 ? sqrtf(s) : powf(s, 1.0f / (float)pw);
}

/* NHWC: one image's channels (nc contiguous per pixel) folded over its
 * pixels into y, by blocks of pixels into part. */
ES_KCLONES static void gap_nhwc_image(const gap_params *p, const float *x, float *y,
                                      float *restrict part) {
  int64_t nc = p->c;
  for (int64_t c = 0; c < nc; c++)
    y[c] = p->kind == GP_MAX ? -INFINITY : 0.0f;
  for (int64_t i0 = 0; i0 < p->size; i0 += GAP_BLOCK) {
    int64_t i1 = i0 + GAP_BLOCK < p->size ? i0 + GAP_BLOCK : p->size;
    const float *restrict px = x + i0 * nc;
    int64_t i = i0 + 1;
    if (p->kind == GP_MAX) {
      for (int64_t c = 0; c < nc; c++)
        part[c] = px[c];
      for (; i < i1; i++) {
        const float *restrict q = x + i * nc;
        for (int64_t c = 0; c < nc; c++)
          part[c] = q[c] > part[c] ? q[c] : part[c];
      }
      for (int64_t c = 0; c < nc; c++)
        y[c] = part[c] > y[c] ? part[c] : y[c];
      continue;
    }
    if (p->kind == GP_LP) {
      for (int64_t c = 0; c < nc; c++)
        part[c] = 0.0f;
      for (i = i0; i < i1; i++) {
        const float *restrict q = x + i * nc;
        if (p->p == 1)
          for (int64_t c = 0; c < nc; c++)
            part[c] += fabsf(q[c]);
        else if (p->p == 2)
          for (int64_t c = 0; c < nc; c++)
            part[c] += q[c] * q[c];
        else
          for (int64_t c = 0; c < nc; c++)
            part[c] += powf(fabsf(q[c]), (float)p->p);
      }
      for (int64_t c = 0; c < nc; c++)
        y[c] += part[c];
      continue;
    }
    for (int64_t c = 0; c < nc; c++)
      part[c] = px[c];
    /* four pixels per pass: a quarter of the partials' loads and stores */
    for (; i + 4 <= i1; i += 4) {
      const float *restrict q = x + i * nc;
      for (int64_t c = 0; c < nc; c++)
        part[c] += (q[c] + q[c + nc]) + (q[c + 2 * nc] + q[c + 3 * nc]);
    }
    for (; i < i1; i++) {
      const float *restrict q = x + i * nc;
      for (int64_t c = 0; c < nc; c++)
        part[c] += q[c];
    }
    for (int64_t c = 0; c < nc; c++)
      y[c] += part[c];
  }
}

static int gap_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  const gap_params *p = k->params;
  const float *x = in[0];
  float *y = out[0];
  /* an empty plane averages to NaN, as 0/0 */
  float inv = p->size > 0 ? 1.0f / (float)p->size : NAN;
  if (p->nhwc) {
    int64_t nc = p->c;
    for (int64_t b = 0; b < p->n; b++, x += p->size * nc, y += nc) {
      gap_nhwc_image(p, x, y, scratch);
      if (p->kind == GP_AVG)
        for (int64_t c = 0; c < nc; c++)
          y[c] *= inv;
      else if (p->kind == GP_LP)
        for (int64_t c = 0; c < nc; c++)
          y[c] = gap_lp_root(y[c], p->p);
    }
    return 0;
  }
  for (int64_t c = 0; c < p->planes; c++) {
    const float *xc = x + c * p->size;
    if (p->kind == GP_AVG)
      y[c] = es__ew_sum_f32(xc, p->size) * inv;
    else if (p->kind == GP_MAX)
      y[c] = es__ew_max_f32(xc, p->size);
    else
      y[c] = gap_lp_root(gap_lp_sum(xc, p->size, p->p), p->p);
  }
  return 0;
}

/* ==========================================================================
 * Family
 * ======================================================================== */

static const es_kernel maxpool_kernel = {maxpool_infer, pool_run, NULL, ES_KLAYOUT_5D};
static const es_kernel avgpool_kernel = {avgpool_infer, pool_run, NULL, ES_KLAYOUT_5D};
static const es_kernel gap_kernel = {gap_infer, gap_run, NULL, ES_KLAYOUT_5D};

const es_kernel *es__kernels_pool(es_op op) {
  switch (op) {
  case ES_OP_MaxPool:
    return &maxpool_kernel;
  case ES_OP_AveragePool:
  case ES_OP_QLinearAveragePool:
    return &avgpool_kernel;
  case ES_OP_GlobalAveragePool:
  case ES_OP_GlobalMaxPool:
  case ES_OP_GlobalLpPool:
    return &gap_kernel;
  default:
    return NULL;
  }
}
