/* Signal processing operators: the windows (HannWindow, HammingWindow,
 * BlackmanWindow), DFT, STFT and MelWeightMatrix.
 *
 * Every output shape here is a value: the window's size, DFT's dft_length
 * and axis, STFT's frame_step and frame_length, MelWeightMatrix's bin
 * counts. Those inputs must be known while planning (weights, or folded
 * from constants), as for Range; one that is not is refused (ES_ENOTSUP)
 * with its name. Inputs that only feed values (the signal, STFT's window,
 * MelWeightMatrix's sample rate and edges) may arrive with each request.
 *
 * Complex tensors are ONNX's convention: a trailing dimension of 2 (real,
 * imaginary); a trailing 1 is a real signal. The transforms are direct
 * sums, not an FFT: out[k] = sum_t x[t] e^(-+2 pi i k t / n), with the
 * twiddle factors cos and sin of 2 pi j / n tabulated once per plan in
 * double (n of them: k t is taken modulo n) and the sums accumulated in
 * double, so a bin near zero stays within the float tolerance of its
 * exact value. That is O(n^2) per transform, which is what the models seen
 * need (short frames of audio features); transforms are limited to 2^16
 * points (ES_ENOTSUP beyond), where an FFT would be wanted.
 *
 * Windows and MelWeightMatrix follow ONNX's reference definitions: Hamming
 * uses a0 = 25/46, the mel scale is 2595 log10(1 + f / 700), and mel bins
 * are spaced by (high - low) / (num_mel_bins + 2) as the reference spaces
 * them. Their output_datatype may be float32, int32, int64, int8 or uint8
 * (values converted as numpy's astype). */
#include "kernels/kernel.h"

#include <math.h>

/* ==========================================================================
 * Shared checks
 * ======================================================================== */

static int out_set(es_kinst *k, int o, es_dtype dt, int rank, const int64_t *dims) {
  int rc = es__tdesc_set(k->out[o], dt, rank, dims);
  if (rc < 0)
    return ES_KFAIL(k, rc, "output %d: %s", o, es_last_error_detail());
  return 0;
}

/* Input i is present (not omitted). */
static int has_in(const es_kinst *k, int i) { return i < k->n_in && k->in[i]; }

/* A one-element int32/int64 input (a scalar or [1]). */
static int scalar_int_check(es_kinst *k, int i, const char *what) {
  const es_tdesc *t = k->in[i];
  if (t->dtype != ES_DTYPE_INT64 && t->dtype != ES_DTYPE_INT32)
    return ES_KFAIL(k, ES_EMODEL, "%s (input %d) is %s, expected int32 or int64", what, i,
                    es_dtype_name(t->dtype));
  if (t->count != 1 || t->rank > 1)
    return ES_KFAIL(k, ES_EMODEL, "%s (input %d) has %zu elements, expected a scalar", what, i,
                    t->count);
  return 0;
}

/* The same, whose value is needed while planning: in *v. */
static int static_int(es_kinst *k, int i, const char *what, int64_t *v) {
  int rc = scalar_int_check(k, i, what);
  if (rc < 0)
    return rc;
  if (!k->in_static || !k->in_static[i])
    return ES_KFAIL(k, ES_ENOTSUP, "%s (input %d) is not known when planning; the output's "
                    "shape depends on it (data-dependent shapes are not supported)", what, i);
  *v = es__static_i64(k->in[i], k->in_static[i], 0);
  return 0;
}

/* output_datatype (an ONNX element type number) among those written here. */
static int out_dtype(es_kinst *k, es_dtype *dt) {
  int64_t v;
  int rc = es__attr_int(k, "output_datatype", ES_DTYPE_FLOAT, &v);
  if (rc < 0)
    return rc;
  switch (v) {
  case ES_DTYPE_FLOAT:
  case ES_DTYPE_INT32:
  case ES_DTYPE_INT64:
  case ES_DTYPE_INT8:
  case ES_DTYPE_UINT8:
    *dt = (es_dtype)v;
    return 0;
  default:
    return ES_KFAIL(k, ES_ENOTSUP, "output_datatype %lld is not supported (float32, int32, "
                    "int64, int8, uint8)", (long long)v);
  }
}

/* Element i of out, of type dt, set to v converted as numpy's astype would
 * (toward zero); out of the type's range saturates instead of being
 * undefined. */
static void store_as(void *out, es_dtype dt, int64_t i, double v) {
  if (dt == ES_DTYPE_FLOAT) {
    ((float *)out)[i] = (float)v;
    return;
  }
  double lo = dt == ES_DTYPE_INT8 ? -128.0 : dt == ES_DTYPE_UINT8 ? 0.0
              : dt == ES_DTYPE_INT32 ? -2147483648.0 : -9223372036854775808.0;
  double hi = dt == ES_DTYPE_INT8 ? 127.0 : dt == ES_DTYPE_UINT8 ? 255.0
              : dt == ES_DTYPE_INT32 ? 2147483647.0 : 9223372036854774784.0;
  v = v != v ? 0 : v < lo ? lo : v > hi ? hi : trunc(v);
  switch (dt) {
  case ES_DTYPE_INT8:
    ((int8_t *)out)[i] = (int8_t)v;
    break;
  case ES_DTYPE_UINT8:
    ((uint8_t *)out)[i] = (uint8_t)v;
    break;
  case ES_DTYPE_INT32:
    ((int32_t *)out)[i] = (int32_t)v;
    break;
  default:
    ((int64_t *)out)[i] = (int64_t)v;
    break;
  }
}

/* ==========================================================================
 * Windows
 * ======================================================================== */

typedef struct window_params {
  int64_t size;
  double n;           /* the period: size when periodic, else size - 1 */
  double a0, a1, a2;  /* a0 - a1 cos(2 pi t / n) + a2 cos(4 pi t / n) */
  es_dtype dt;
} window_params;

static int window_infer(es_kinst *k) {
  int rc = es__kio_check(k, 1, 1, 1, 1);
  int64_t size, periodic;
  es_dtype dt = ES_DTYPE_FLOAT;
  if (rc < 0 || (rc = static_int(k, 0, "size", &size)) < 0 ||
      (rc = es__attr_int(k, "periodic", 1, &periodic)) < 0 || (rc = out_dtype(k, &dt)) < 0)
    return rc;
  if (size < 0)
    return ES_KFAIL(k, ES_EMODEL, "size is %lld, expected >= 0", (long long)size);
  if (periodic != 0 && periodic != 1)
    return ES_KFAIL(k, ES_EMODEL, "periodic is %lld, expected 0 or 1", (long long)periodic);
  window_params *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  p->size = size;
  p->n = (double)(periodic ? size : size - 1);
  p->dt = dt;
  switch (k->node.op) {
  case ES_OP_HannWindow:
    p->a0 = 0.5, p->a1 = 0.5;
    break;
  case ES_OP_HammingWindow:
    p->a0 = 25.0 / 46.0, p->a1 = 1.0 - 25.0 / 46.0;
    break;
  default: /* BlackmanWindow */
    p->a0 = 0.42, p->a1 = 0.5, p->a2 = 0.08;
    break;
  }
  k->params = p;
  return out_set(k, 0, dt, 1, &size);
}

static int window_run(const es_kinst *k, const void *const *in, void *const *out,
                      void *scratch) {
  (void)in, (void)scratch;
  const window_params *p = k->params;
  /* A symmetric window of one sample has period 0: its one value is the
   * window's peak, 1 (the limit; the formula would divide by zero). */
  if (p->n == 0) {
    for (int64_t t = 0; t < p->size; t++)
      store_as(out[0], p->dt, t, 1.0);
    return 0;
  }
  for (int64_t t = 0; t < p->size; t++) {
    double x = 2.0 * M_PI * (double)t / p->n;
    store_as(out[0], p->dt, t, p->a0 - p->a1 * cos(x) + p->a2 * cos(2.0 * x));
  }
  return 0;
}

/* ==========================================================================
 * Direct transforms (DFT and STFT share them)
 * ======================================================================== */

/* The longest transform: a direct sum of 2^16 points is already ~2^32
 * multiply-adds per transform (and a 1 MiB table); longer ones want an FFT. */
#define MAX_DFT ((int64_t)1 << 16)

/* cos and sin of 2 pi j / n for j in [0, n), in plan memory. */
static int twiddles_make(es_kinst *k, int64_t n, const double **cs, const double **sn) {
  if (n > MAX_DFT)
    return ES_KFAIL(k, ES_ENOTSUP, "a transform of %lld points is longer than the %lld "
                    "supported (the transform is a direct sum, not an FFT)", (long long)n,
                    (long long)MAX_DFT);
  double *c = es__kinst_alloc(k, (size_t)n * 2 * sizeof *c);
  if (!c)
    return ES_KFAIL(k, ES_ENOMEM, "out of memory for %lld twiddle factors", (long long)n);
  for (int64_t j = 0; j < n; j++) {
    double a = 2.0 * M_PI * (double)j / (double)n;
    c[j] = cos(a);
    c[n + j] = sin(a);
  }
  *cs = c;
  *sn = c + n;
  return 0;
}

/* One transform: x has m samples (m <= n; the rest are the zeros of
 * padding) at stride xs floats, complex when cplx (re, im pairs), each
 * multiplied by w[t] when w is given; writes bins [0, nb) of the n-point
 * transform to y at stride ys floats (re, im). sign -1 forward, +1 inverse;
 * scale multiplies every bin. */
static void dft_1d(const float *x, int64_t xs, int cplx, int64_t m, const float *w, int64_t n,
                   const double *cs, const double *sn, double sign, double scale, int64_t nb,
                   float *y, int64_t ys) {
  for (int64_t kb = 0; kb < nb; kb++) {
    double re = 0, im = 0;
    int64_t j = 0; /* kb * t mod n */
    int64_t step = kb % n;
    for (int64_t t = 0; t < m; t++) {
      double wt = w ? (double)w[t] : 1.0;
      double xr = (double)x[t * xs] * wt, xi = cplx ? (double)x[t * xs + 1] * wt : 0.0;
      double c = cs[j], s = sign * sn[j];
      re += xr * c - xi * s;
      im += xr * s + xi * c;
      j += step;
      if (j >= n)
        j -= n;
    }
    y[kb * ys] = (float)(re * scale);
    y[kb * ys + 1] = (float)(im * scale);
  }
}

/* ==========================================================================
 * DFT
 * ======================================================================== */

typedef struct dft_params {
  int64_t outer, inner; /* dims before the axis; dims after it but before the last */
  int64_t m;            /* samples read along the axis: min(input length, n) */
  int64_t len;          /* the input's length along the axis */
  int64_t n, nb;        /* the transform's length; bins written */
  int cplx;             /* the input is complex (last dim 2) */
  int inverse;
  int empty;            /* the output has no element: nothing to transform */
  const double *cs, *sn;
} dft_params;

static int dft_infer(es_kinst *k) {
  int v20 = k->opset >= 20;
  int rc = es__kio_check(k, 1, v20 ? 3 : 2, 1, 1);
  if (rc < 0)
    return rc;
  const es_tdesc *x = k->in[0];
  if (x->dtype != ES_DTYPE_FLOAT)
    return ES_KFAIL(k, ES_ENOTSUP, "input is %s, only float32 is supported",
                    es_dtype_name(x->dtype));
  if (x->rank < 2)
    return ES_KFAIL(k, ES_EMODEL, "input has rank %d, expected at least 2 ([..., signal, 1 or "
                    "2])", x->rank);
  int64_t last = x->dims[x->rank - 1];
  if (last != 1 && last != 2)
    return ES_KFAIL(k, ES_EMODEL, "input's last dimension is %lld, expected 1 (real) or 2 "
                    "(complex)", (long long)last);
  int64_t axis, inverse, onesided;
  if (v20) {
    axis = -2;
    if (has_in(k, 2) && (rc = static_int(k, 2, "axis", &axis)) < 0)
      return rc;
  } else if ((rc = es__attr_int(k, "axis", 1, &axis)) < 0) {
    return rc;
  }
  if ((rc = es__attr_int(k, "inverse", 0, &inverse)) < 0 ||
      (rc = es__attr_int(k, "onesided", 0, &onesided)) < 0)
    return rc;
  int r = x->rank;
  if (axis < -r || axis > r - 2 || axis == -1)
    return ES_KFAIL(k, ES_EMODEL, "axis %lld is outside [-%d, -2] and [0, %d] (input rank %d)",
                    (long long)axis, r, r - 2, r);
  if (axis < 0)
    axis += r;
  if ((inverse != 0 && inverse != 1) || (onesided != 0 && onesided != 1))
    return ES_KFAIL(k, ES_EMODEL, "inverse (%lld) and onesided (%lld) must be 0 or 1",
                    (long long)inverse, (long long)onesided);
  if (onesided && last == 2)
    return ES_KFAIL(k, ES_EMODEL, "onesided is 1 with a complex input (a one-sided spectrum "
                    "is the transform of a real signal)");
  int64_t len = x->dims[axis], n = len;
  if (has_in(k, 1) && (rc = static_int(k, 1, "dft_length", &n)) < 0)
    return rc;
  if (n < 1)
    return ES_KFAIL(k, ES_EMODEL, "the transform's length (dft_length, else the input's length "
                    "along axis %lld) is %lld, expected >= 1", (long long)axis, (long long)n);
  int64_t dims[ES_MAX_RANK];
  for (int i = 0; i < r; i++)
    dims[i] = x->dims[i];
  int64_t nb = onesided ? n / 2 + 1 : n;
  dims[axis] = nb;
  dims[r - 1] = 2;
  if ((rc = out_set(k, 0, ES_DTYPE_FLOAT, r, dims)) < 0)
    return rc;
  dft_params *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  p->outer = 1;
  for (int i = 0; i < axis; i++)
    p->outer *= x->dims[i];
  p->inner = 1;
  for (int i = (int)axis + 1; i < r - 1; i++)
    p->inner *= x->dims[i];
  p->len = len;
  p->m = len < n ? len : n;
  p->n = n;
  p->nb = nb;
  p->cplx = last == 2;
  p->inverse = (int)inverse;
  p->empty = k->out[0]->count == 0;
  k->params = p;
  if (p->empty)
    return 0; /* no transform runs: no table */
  k->flops = (uint64_t)p->outer * (uint64_t)p->inner * (uint64_t)nb * (uint64_t)p->m * 8;
  return twiddles_make(k, n, &p->cs, &p->sn);
}

static int dft_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  (void)scratch;
  const dft_params *p = k->params;
  if (p->empty)
    return 0;
  const float *x = in[0];
  float *y = out[0];
  int c = p->cplx ? 2 : 1;
  double sign = p->inverse ? 1.0 : -1.0, scale = p->inverse ? 1.0 / (double)p->n : 1.0;
  for (int64_t o = 0; o < p->outer; o++)
    for (int64_t i = 0; i < p->inner; i++)
      dft_1d(x + (o * p->len * p->inner + i) * c, p->inner * c, p->cplx, p->m, NULL, p->n, p->cs,
             p->sn, sign, scale, p->nb, y + (o * p->nb * p->inner + i) * 2, p->inner * 2);
  return 0;
}

/* ==========================================================================
 * STFT
 * ======================================================================== */

typedef struct stft_params {
  int64_t batch, len;     /* signal [batch, len, 1 or 2] */
  int cplx;
  int64_t step, frame;    /* frame_step, frame_length */
  int64_t frames, nb;     /* output [batch, frames, nb, 2] */
  int window;             /* input 2 is given */
  int empty;              /* the output has no element */
  const double *cs, *sn;
} stft_params;

static int stft_infer(es_kinst *k) {
  int rc = es__kio_check(k, 2, 4, 1, 1);
  if (rc < 0)
    return rc;
  const es_tdesc *x = k->in[0];
  if (x->dtype != ES_DTYPE_FLOAT)
    return ES_KFAIL(k, ES_ENOTSUP, "signal is %s, only float32 is supported",
                    es_dtype_name(x->dtype));
  if (x->rank != 3 || (x->dims[2] != 1 && x->dims[2] != 2))
    return ES_KFAIL(k, ES_EMODEL, "signal has rank %d, expected [batch, length, 1 or 2]",
                    x->rank);
  int64_t step, frame = -1, onesided;
  if ((rc = static_int(k, 1, "frame_step", &step)) < 0 ||
      (rc = es__attr_int(k, "onesided", 1, &onesided)) < 0)
    return rc;
  if (step < 1)
    return ES_KFAIL(k, ES_EMODEL, "frame_step is %lld, expected >= 1", (long long)step);
  if (onesided != 0 && onesided != 1)
    return ES_KFAIL(k, ES_EMODEL, "onesided is %lld, expected 0 or 1", (long long)onesided);
  if (onesided && x->dims[2] == 2)
    return ES_KFAIL(k, ES_EMODEL, "onesided is 1 with a complex signal (a one-sided spectrum "
                    "is the transform of a real signal)");
  int window = has_in(k, 2);
  if (window) {
    const es_tdesc *w = k->in[2];
    if (w->dtype != ES_DTYPE_FLOAT || w->rank != 1)
      return ES_KFAIL(k, ES_EMODEL, "window is %s of rank %d, expected 1-D float32",
                      es_dtype_name(w->dtype), w->rank);
    frame = w->dims[0];
  }
  if (has_in(k, 3)) {
    int64_t f;
    if ((rc = static_int(k, 3, "frame_length", &f)) < 0)
      return rc;
    if (window && f != frame)
      return ES_KFAIL(k, ES_EMODEL, "frame_length is %lld but the window has %lld samples",
                      (long long)f, (long long)frame);
    frame = f;
  }
  if (frame < 0)
    return ES_KFAIL(k, ES_EMODEL, "neither a window nor frame_length gives the frame length");
  if (frame < 1 || frame > x->dims[1])
    return ES_KFAIL(k, ES_EMODEL, "frame length %lld is outside [1, %lld] (the signal's "
                    "length)", (long long)frame, (long long)x->dims[1]);
  stft_params *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  p->batch = x->dims[0];
  p->len = x->dims[1];
  p->cplx = x->dims[2] == 2;
  p->step = step;
  p->frame = frame;
  p->frames = (p->len - frame) / step + 1;
  p->nb = onesided ? frame / 2 + 1 : frame;
  p->window = window;
  k->params = p;
  int64_t dims[4] = {p->batch, p->frames, p->nb, 2};
  if ((rc = out_set(k, 0, ES_DTYPE_FLOAT, 4, dims)) < 0)
    return rc;
  if ((p->empty = k->out[0]->count == 0))
    return 0;
  k->flops = (uint64_t)p->batch * (uint64_t)p->frames * (uint64_t)p->nb * (uint64_t)frame * 8;
  return twiddles_make(k, frame, &p->cs, &p->sn);
}

static int stft_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  (void)scratch;
  const stft_params *p = k->params;
  if (p->empty)
    return 0;
  int c = p->cplx ? 2 : 1;
  const float *w = p->window ? in[2] : NULL;
  float *y = out[0];
  for (int64_t b = 0; b < p->batch; b++)
    for (int64_t f = 0; f < p->frames; f++) {
      const float *x = (const float *)in[0] + (b * p->len + f * p->step) * c;
      dft_1d(x, c, p->cplx, p->frame, w, p->frame, p->cs, p->sn, -1.0, 1.0, p->nb,
             y + ((b * p->frames + f) * p->nb) * 2, 2);
    }
  return 0;
}

/* ==========================================================================
 * MelWeightMatrix
 * ======================================================================== */

typedef struct mel_params {
  int64_t mels, dft, bins; /* num_mel_bins, dft_length, dft_length / 2 + 1 */
  es_dtype dt;
  es_tdesc rate;           /* sample_rate's type (int32 or int64) */
} mel_params;

static int mel_infer(es_kinst *k) {
  int rc = es__kio_check(k, 5, 5, 1, 1);
  int64_t mels, dft;
  es_dtype dt = ES_DTYPE_FLOAT;
  if (rc < 0 || (rc = static_int(k, 0, "num_mel_bins", &mels)) < 0 ||
      (rc = static_int(k, 1, "dft_length", &dft)) < 0 ||
      (rc = scalar_int_check(k, 2, "sample_rate")) < 0 || (rc = out_dtype(k, &dt)) < 0)
    return rc;
  static const char *const edge[2] = {"lower_edge_hertz", "upper_edge_hertz"};
  for (int i = 3; i < 5; i++)
    if (k->in[i]->dtype != ES_DTYPE_FLOAT || k->in[i]->count != 1 || k->in[i]->rank > 1)
      return ES_KFAIL(k, ES_EMODEL, "%s (input %d) is %s with %zu elements, expected a float32 "
                      "scalar", edge[i - 3], i, es_dtype_name(k->in[i]->dtype),
                      k->in[i]->count);
  if (mels < 1 || dft < 1)
    return ES_KFAIL(k, ES_EMODEL, "num_mel_bins (%lld) and dft_length (%lld) must be >= 1",
                    (long long)mels, (long long)dft);
  mel_params *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  p->mels = mels;
  p->dft = dft;
  p->bins = dft / 2 + 1;
  p->dt = dt;
  p->rate = *k->in[2];
  k->params = p;
  int64_t dims[2] = {p->bins, mels};
  if ((rc = out_set(k, 0, dt, 2, dims)) < 0)
    return rc;
  k->scratch_bytes = (size_t)(mels + 2) * sizeof(int64_t);
  return 0;
}

/* Triangles on the mel scale: bin i rises from edge i to edge i + 1 and
 * falls to edge i + 2, edges spaced evenly in mels and mapped to spectrum
 * bins as floor((dft_length + 1) f / sample_rate). A later triangle's
 * rising side overwrites an earlier one's falling side where they share a
 * bin, as the reference writes them. */
static int mel_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  const mel_params *p = k->params;
  int64_t rate = es__static_i64(&p->rate, in[2], 0);
  double lo = *(const float *)in[3], hi = *(const float *)in[4];
  if (rate <= 0)
    return ES_KFAIL(k, ES_EINVAL, "sample_rate is %lld, expected > 0", (long long)rate);
  if (!(lo >= 0 && lo <= hi && isfinite(hi)))
    return ES_KFAIL(k, ES_EINVAL, "edges %g Hz and %g Hz are not 0 <= lower <= upper", lo, hi);
  int64_t *edges = scratch;
  double mlo = 2595.0 * log10(1.0 + lo / 700.0), mhi = 2595.0 * log10(1.0 + hi / 700.0);
  double mstep = (mhi - mlo) / (double)(p->mels + 2);
  for (int64_t i = 0; i < p->mels + 2; i++) {
    double f = 700.0 * (pow(10.0, ((double)i * mstep + mlo) / 2595.0) - 1.0);
    double b = floor((double)(p->dft + 1) * f / (double)rate);
    if (!(b >= 0 && b < (double)p->bins))
      return ES_KFAIL(k, ES_EINVAL, "mel edge %lld (%g Hz) falls in spectrum bin %g, outside "
                      "[0, %lld) (upper_edge_hertz above half of sample_rate?)", (long long)i,
                      f, b, (long long)p->bins);
    edges[i] = (int64_t)b;
  }
  void *w = out[0];
  for (int64_t j = 0; j < p->bins * p->mels; j++)
    store_as(w, p->dt, j, 0.0);
  for (int64_t i = 0; i < p->mels; i++) {
    int64_t l = edges[i], c = edges[i + 1], h = edges[i + 2];
    if (c == l)
      store_as(w, p->dt, c * p->mels + i, 1.0);
    else
      for (int64_t j = l; j <= c; j++)
        store_as(w, p->dt, j * p->mels + i, (double)(j - l) / (double)(c - l));
    for (int64_t j = c; j < h; j++)
      store_as(w, p->dt, j * p->mels + i, (double)(h - j) / (double)(h - c));
  }
  return 0;
}

/* ==========================================================================
 * Family
 * ======================================================================== */

static const es_kernel window_kernel = {window_infer, window_run, NULL, 0};
static const es_kernel dft_kernel = {dft_infer, dft_run, NULL, 0};
static const es_kernel stft_kernel = {stft_infer, stft_run, NULL, 0};
static const es_kernel mel_kernel = {mel_infer, mel_run, NULL, 0};

const es_kernel *es__kernels_signal(es_op op) {
  switch (op) {
  case ES_OP_HannWindow:
  case ES_OP_HammingWindow:
  case ES_OP_BlackmanWindow:
    return &window_kernel;
  case ES_OP_DFT:
    return &dft_kernel;
  case ES_OP_STFT:
    return &stft_kernel;
  case ES_OP_MelWeightMatrix:
    return &mel_kernel;
  default:
    return NULL;
  }
}
