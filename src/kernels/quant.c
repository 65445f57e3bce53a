/* Quantisation operators: QuantizeLinear, DequantizeLinear,
 * DynamicQuantizeLinear, and the integer products MatMulInteger,
 * ConvInteger, QLinearMatMul, QLinearConv and the internal
 * QLinearConvTranspose (a QDQ ConvTranspose lowered at load; W as
 * ConvTranspose's, [C, M/group, k...]) (8-bit, uint8 or int8); then
 * QLookup and the com.microsoft QLinear operators. What QDQ layers lower
 * to adds three internal extensions: QLinearMatMul's "_transB" (B [N, K],
 * a Gemm's), bias (input 8) and "activation"; and both products'
 * "_float_out" (y's scale and zero point absent, the output float32: the
 * layer a model ends with).
 *
 * The arithmetic is ONNX's, in the order ONNX Runtime evaluates it, so
 * results agree to the bit:
 *   - quantize: q = saturate(rint(x / scale) + zero_point), the division in
 *     float32 and rint rounding half to even (the default rounding mode);
 *     saturate clamps to the output type's range. NaN has no integer: it
 *     gives the zero point (the real value 0), so no float is ever converted
 *     to an integer outside its range (undefined in C).
 *   - dequantize: x = (q - zero_point) * scale, the difference exact in
 *     int64 (an int32 q minus an int32 zero point can leave int32).
 *   - integer products accumulate exactly in 32 bits: each term
 *     (a - za) * (b - zb) fits in int32, and the sum wraps modulo 2^32 as
 *     ONNX Runtime's does, computed in uint32 so a long sum that leaves the
 *     int32 range is defined behaviour.
 *   - the QLinear ops requantize the int32 sum (plus QLinearConv's int32
 *     bias) with one float32 multiplier per output channel or column,
 *     a_scale * b_scale / y_scale, then round and saturate as quantize does.
 *
 * Scales and zero points are ordinary inputs, read at run time. Their shapes
 * pick the granularity while planning: one element is per tensor; a 1-D
 * tensor along `axis` (opset 13) is per axis; a tensor of x's rank whose
 * `axis` extent is ceil(x's / block_size) (opset 21) is per block. The
 * integer products take per-row zero points for A, per-column ones for B
 * (MatMulInteger also their N-D forms, [..., M, 1] and [..., 1, N]) and
 * per-output-channel ones for the convolutions' weights.
 *
 * Float8, 4-bit and 16-bit integer types (saturate, output_dtype of opsets
 * 19 and 21) are legal ONNX the engine has no element type for: ES_ENOTSUP
 * naming them.
 *
 * These are the plain C kernels: clear loops, correct for every attribute
 * combination. The convolutions accumulate one output row per kernel tap
 * over the valid range of the row (the reference Conv's order); the
 * products accumulate rows of B scaled by A's elements and subtract B's
 * zero points once per output element (sum (a - za)(b - zb) =
 * sum (a - za) b - zb sum (a - za)), keeping the inner loop a plain
 * multiply-add. */
#include "kernels/dnnl_glue.h"
#include "kernels/kernel.h"
#include "kernels/walk.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
/* A loop the compiler should vectorise 512 bits wide (GCC's clones pick
 * 256): GCC says so in the target string, clang by min_vector_width. */
#if defined(__clang__)
#define Q_AVX512                                                                                  \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"), min_vector_width(512)))
#else
#define Q_AVX512                                                                                  \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,prefer-vector-width=512")))
#endif
#endif

/* ==========================================================================
 * Shared helpers
 * ======================================================================== */

#if defined(__x86_64__)
/* The CPU's features these kernels pick paths by, asked once (runs on any
 * thread: kept atomically): Q_CPU_512 AVX-512 BW, VL and DQ (the 512-bit
 * loops), Q_CPU_VBMI AVX-512 VBMI and BW (byte tables). */
enum { Q_CPU_512 = 1, Q_CPU_VBMI = 2, Q_CPU_ASKED = 4 };
static int q_cpu(int feature) {
  static _Atomic int flags;
  int f = atomic_load_explicit(&flags, memory_order_relaxed);
  if (!f) {
    int bw = __builtin_cpu_supports("avx512bw");
    f = Q_CPU_ASKED |
        (bw && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")
             ? Q_CPU_512
             : 0) |
        (bw && __builtin_cpu_supports("avx512vbmi") ? Q_CPU_VBMI : 0);
    atomic_store_explicit(&flags, f, memory_order_relaxed);
  }
  return (f & feature) != 0;
}
#endif

/* Bounds that keep size arithmetic far from int64 overflow (as conv.c). */
#define Q_DIM_MAX ((int64_t)1 << 40)
#define Q_ATTR_MAX ((int64_t)1 << 20)

static int q_is_8bit(es_dtype t) { return t == ES_DTYPE_UINT8 || t == ES_DTYPE_INT8; }

static void q_range(es_dtype t, int32_t *lo, int32_t *hi) {
  *lo = t == ES_DTYPE_INT8 ? -128 : 0;
  *hi = t == ES_DTYPE_INT8 ? 127 : 255;
}

/* Element i of an 8-bit tensor, widened. */
static inline int32_t q_at8(const void *p, int is_signed, int64_t i) {
  return is_signed ? ((const int8_t *)p)[i] : ((const uint8_t *)p)[i];
}

/* Element i of an 8-bit or int32 tensor, widened; q_at8 where the type is
 * known to be 8-bit. */
static inline int64_t q_at(const void *p, es_dtype t, int64_t i) {
  switch (t) {
  case ES_DTYPE_INT8:
    return ((const int8_t *)p)[i];
  case ES_DTYPE_UINT8:
    return ((const uint8_t *)p)[i];
  default:
    return ((const int32_t *)p)[i];
  }
}

/* rint(v) + zp, saturated to [lo, hi]; NaN gives zp. */
static inline int32_t q_round_sat(float v, int32_t zp, int32_t lo, int32_t hi) {
  float r = rintf(v);
  if (r != r)
    r = 0.0f;
  r += (float)zp;
  if (r <= (float)lo)
    return lo;
  if (r >= (float)hi)
    return hi;
  return (int32_t)r;
}

static inline void q_store8(void *p, int is_signed, int64_t i, int32_t v) {
  if (is_signed)
    ((int8_t *)p)[i] = (int8_t)v;
  else
    ((uint8_t *)p)[i] = (uint8_t)v;
}

/* acc[j] += a * b[j] over n, wrapping (see the note). Per signedness of b
 * so the inner loop has no branch. */
static void q_axpy_u8(uint32_t *restrict acc, const uint8_t *restrict b, int32_t a, int64_t n) {
  for (int64_t j = 0; j < n; j++)
    acc[j] += (uint32_t)(a * (int32_t)b[j]);
}

static void q_axpy_i8(uint32_t *restrict acc, const int8_t *restrict b, int32_t a, int64_t n) {
  for (int64_t j = 0; j < n; j++)
    acc[j] += (uint32_t)(a * (int32_t)b[j]);
}

/* Input i is present (or the node is malformed). */
static int q_need(es_kinst *k, int i, const char *name) {
  if (i >= k->n_in || !k->in[i])
    return ES_KFAIL(k, ES_EMODEL, "input %d (%s) is missing", i, name);
  return 0;
}

static int q_io(es_kinst *k, int min_in, int max_in) {
  if (k->n_in < min_in || k->n_in > max_in)
    return ES_KFAIL(k, ES_EMODEL, "has %d inputs, expected %d to %d", k->n_in, min_in, max_in);
  if (k->n_out != 1 || !k->out[0])
    return ES_KFAIL(k, ES_EMODEL, "has %d outputs, expected 1", k->n_out);
  return 0;
}

static int q_dtype_8bit(es_kinst *k, const es_tdesc *t, const char *name) {
  if (!q_is_8bit(t->dtype))
    return ES_KFAIL(k, ES_EMODEL, "%s is %s, expected uint8 or int8", name,
                    es_dtype_name(t->dtype));
  return 0;
}

static int q_dtype_float(es_kinst *k, const es_tdesc *t, const char *name) {
  if (t->dtype != ES_DTYPE_FLOAT)
    return ES_KFAIL(k, ES_EMODEL, "%s is %s, expected float32", name, es_dtype_name(t->dtype));
  return 0;
}

/* One element: a scalar or a 1-D tensor of one (both are "per tensor"). */
static int q_is_single(const es_tdesc *t) { return t->rank <= 1 && t->count == 1; }

static int q_single(es_kinst *k, const es_tdesc *t, const char *name) {
  if (!q_is_single(t))
    return ES_KFAIL(k, ES_EMODEL, "%s must be a scalar (has rank %d, %zu elements)", name,
                    t->rank, t->count);
  return 0;
}

/* A vector along one dimension of extent n: a single element (broadcast,
 * *per = 0) or 1-D [n] (*per = 1). */
static int q_vec(es_kinst *k, const es_tdesc *t, int64_t n, const char *name, const char *of,
                 int *per) {
  *per = 0;
  if (q_is_single(t))
    return 0;
  if (t->rank != 1 || t->dims[0] != n)
    return ES_KFAIL(k, ES_EMODEL, "%s must be a scalar or 1-D with %lld elements (%s), has rank "
                    "%d and %zu elements", name, (long long)n, of, t->rank, t->count);
  *per = 1;
  return 0;
}

static int q_out_set(es_kinst *k, int i, es_dtype dt, int rank, const int64_t *dims) {
  int rc = es__tdesc_set(k->out[i], dt, rank, dims);
  if (rc < 0)
    return ES_KFAIL(k, rc, "output %d: %s", i, es_last_error_detail());
  return 0;
}

/* Product of dims[a..b): 0 when one is 0, else saturated at INT64_MAX (a
 * zero-sized tensor's other dims are unbounded, so their product may not
 * fit; callers use it only where a nonzero product is known to be small). */
static int64_t q_prod(const int64_t *dims, int a, int b) {
  int64_t n = 1;
  for (int i = a; i < b; i++)
    if (dims[i] == 0)
      return 0;
  for (int i = a; i < b; i++)
    if (__builtin_mul_overflow(n, dims[i], &n))
      return INT64_MAX;
  return n;
}

/* ==========================================================================
 * QuantizeLinear and DequantizeLinear
 * ======================================================================== */

/* How x's elements find their scale and zero point: x viewed as
 * [outer, d, inner] around the quantisation axis; the parameter of element
 * (o, a, i) is at o * so + (a / block) * sa + i * si. Per tensor all
 * strides are 0; per axis sa = 1; per block so = ceil(d / block) * inner,
 * sa = inner, si = 1. */
typedef struct q_map {
  int64_t outer, d, inner, block;
  int64_t so, sa, si;
} q_map;

static int q_per_tensor(const q_map *m) { return m->outer <= 1 && m->inner == 1 && m->sa == 0; }

typedef struct qlin_params {
  q_map map;
  es_dtype xt, yt; /* element types of the input and the output */
  int has_zp;
  int32_t lo, hi;  /* QuantizeLinear: the output type's range */
} qlin_params;

/* The granularity of scale (input 1) and zero point (input 2, may be
 * absent) over x (input 0), from their shapes and the attributes axis
 * (opset 13) and block_size (opset 21). */
static int q_map_parse(es_kinst *k, q_map *m) {
  const es_tdesc *x = k->in[0], *s = k->in[1], *z = k->n_in > 2 ? k->in[2] : NULL;
  const char *sn = k->node.op == ES_OP_QuantizeLinear ? "y_scale" : "x_scale";
  const char *zn = k->node.op == ES_OP_QuantizeLinear ? "y_zero_point" : "x_zero_point";
  int64_t axis = 1, block = 0;
  int rc;
  if (k->opset >= 13 && (rc = es__attr_int(k, "axis", 1, &axis)) < 0)
    return rc;
  if (k->opset >= 21 && (rc = es__attr_int(k, "block_size", 0, &block)) < 0)
    return rc;
  if (block < 0)
    return ES_KFAIL(k, ES_EMODEL, "block_size is %lld, expected 0 (none) or more",
                    (long long)block);
  if (z && (z->rank != s->rank || !es__tdesc_same_shape(z, s)) &&
      !(q_is_single(z) && q_is_single(s)))
    return ES_KFAIL(k, ES_EMODEL, "%s and %s have different shapes (ranks %d and %d, %zu and "
                    "%zu elements)", zn, sn, z->rank, s->rank, z->count, s->count);
  memset(m, 0, sizeof *m);
  m->outer = 1;
  m->d = (int64_t)x->count;
  m->inner = 1;
  m->block = 1;
  if (q_is_single(s) && (block == 0 || s->rank == 0))
    return 0; /* per tensor */
  if (k->opset < 13)
    return ES_KFAIL(k, ES_EMODEL, "%s must be a scalar before opset 13 (has rank %d, %zu "
                    "elements; model opset %lld)", sn, s->rank, s->count, (long long)k->opset);
  int ax;
  if ((rc = es__axis_norm(k, axis, x->rank, &ax)) < 0)
    return rc;
  m->d = x->dims[ax];
  /* an empty x walks nothing (outer 0); otherwise every product is below
   * x's element count */
  m->outer = x->count ? q_prod(x->dims, 0, ax) : 0;
  m->inner = q_prod(x->dims, ax + 1, x->rank);
  if (block == 0) {
    if (s->rank != 1 || s->dims[0] != m->d)
      return ES_KFAIL(k, ES_EMODEL, "%s must be a scalar or 1-D with %lld elements (axis %d of "
                      "x), has rank %d and %zu elements", sn, (long long)m->d, ax, s->rank,
                      s->count);
    m->sa = 1;
    return 0;
  }
  if (block > Q_DIM_MAX)
    return ES_KFAIL(k, ES_EMODEL, "block_size %lld is more than 2^40", (long long)block);
  int64_t nb = (m->d + block - 1) / block;
  int ok = s->rank == x->rank;
  for (int i = 0; ok && i < x->rank; i++)
    ok = s->dims[i] == (i == ax ? nb : x->dims[i]);
  if (!ok)
    return ES_KFAIL(k, ES_EMODEL, "with block_size %lld along axis %d, %s must have x's shape "
                    "with %lld (ceil(%lld / %lld)) on that axis", (long long)block, ax, sn,
                    (long long)nb, (long long)m->d, (long long)block);
  m->block = block;
  m->so = x->count ? nb * m->inner : 0;
  m->sa = m->inner;
  m->si = 1;
  return 0;
}

/* QuantizeLinear's output type: the zero point's, else output_dtype
 * (opset 21), else uint8. */
static int quant_out_type(es_kinst *k, const es_tdesc *z, es_dtype *out) {
  int64_t odt = 0, sat = 1;
  int rc;
  if (k->opset >= 21 && (rc = es__attr_int(k, "output_dtype", 0, &odt)) < 0)
    return rc;
  if (k->opset >= 19 && (rc = es__attr_int(k, "saturate", 1, &sat)) < 0)
    return rc;
  if (sat != 0 && sat != 1)
    return ES_KFAIL(k, ES_EMODEL, "saturate is %lld, expected 0 or 1", (long long)sat);
  if (odt >= 17 && odt <= 20)
    return ES_KFAIL(k, ES_ENOTSUP, "output_dtype %lld is a float8 type: float8 quantisation "
                    "(and its saturate attribute) is not supported", (long long)odt);
  if (odt == 4 || odt == 5 || odt == 21 || odt == 22)
    return ES_KFAIL(k, ES_ENOTSUP, "output_dtype %lld (%s) is not supported: uint8 and int8 only",
                    (long long)odt, odt == 4 ? "uint16" : odt == 5 ? "int16" : odt == 21 ? "uint4"
                                                                                         : "int4");
  if (odt != 0 && odt != ES_DTYPE_UINT8 && odt != ES_DTYPE_INT8)
    return ES_KFAIL(k, ES_EMODEL, "output_dtype %lld is not a quantised integer type",
                    (long long)odt);
  if (z) {
    if ((rc = q_dtype_8bit(k, z, "y_zero_point")) < 0)
      return rc;
    if (odt && odt != (int64_t)z->dtype)
      return ES_KFAIL(k, ES_EMODEL, "output_dtype %lld differs from y_zero_point's type %s",
                      (long long)odt, es_dtype_name(z->dtype));
    *out = z->dtype;
  } else {
    *out = odt ? (es_dtype)odt : ES_DTYPE_UINT8;
  }
  return 0;
}

static int qlin_infer(es_kinst *k) {
  qlin_params *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  k->params = p;
  int quant = k->node.op == ES_OP_QuantizeLinear;
  int rc;
  if ((rc = q_io(k, 2, 3)) < 0 || (rc = q_need(k, 0, "x")) < 0 ||
      (rc = q_need(k, 1, quant ? "y_scale" : "x_scale")) < 0)
    return rc;
  const es_tdesc *x = k->in[0], *s = k->in[1], *z = k->n_in > 2 ? k->in[2] : NULL;
  if ((rc = q_dtype_float(k, s, quant ? "y_scale" : "x_scale")) < 0)
    return rc;
  p->xt = x->dtype;
  p->has_zp = z != NULL;
  if (quant) {
    if (x->dtype != ES_DTYPE_FLOAT && x->dtype != ES_DTYPE_INT32)
      return ES_KFAIL(k, ES_EMODEL, "x is %s, expected float32 or int32", es_dtype_name(x->dtype));
    if ((rc = quant_out_type(k, z, &p->yt)) < 0)
      return rc;
    q_range(p->yt, &p->lo, &p->hi);
  } else {
    if (!q_is_8bit(x->dtype) && x->dtype != ES_DTYPE_INT32)
      return ES_KFAIL(k, ES_EMODEL, "x is %s, expected uint8, int8 or int32",
                      es_dtype_name(x->dtype));
    if (z && z->dtype != x->dtype)
      return ES_KFAIL(k, ES_EMODEL, "x_zero_point is %s, x %s: they must be the same type",
                      es_dtype_name(z->dtype), es_dtype_name(x->dtype));
    p->yt = ES_DTYPE_FLOAT;
  }
  if ((rc = q_map_parse(k, &p->map)) < 0)
    return rc;
  k->inplace = -1;
  /* Per tensor, the element order does not matter: a channels-last x
   * (an int8 convolution's output) gives a channels-last y, with no
   * conversion between. Per axis or block, the walk is plain. */
  int per_tensor = q_per_tensor(&p->map);
  k->want_plain = 0;
  if (x->layout != ES_LAYOUT_PLAIN && !per_tensor) {
    k->want_plain = 1u;
    return ES_KRELAYOUT;
  }
  if ((rc = q_out_set(k, 0, p->yt, x->rank, x->dims)) < 0)
    return rc;
  k->out[0]->layout = x->layout;
  return 0;
}

/* Per tensor, float to 8 bits, in loops the compiler vectorises: clamping
 * to the range before rounding gives what rounding first does (the bounds
 * are integers), and once |v| <= 2^8, (v + 1.5 * 2^23) - 1.5 * 2^23 is
 * rint(v) (round half to even, the default mode the reference uses); NaN
 * becomes 0 first, so the zero point, as in q_round_sat. */
#define Q_MAGIC 12582912.0f
static inline void quant_u8_loop(const float *restrict x, float s, int32_t zp,
                                 uint8_t *restrict y, int64_t n) {
  const float lo = (float)(0 - zp), hi = (float)(255 - zp);
  for (int64_t i = 0; i < n; i++) {
    float v = x[i] / s;
    v = v == v ? v : 0.0f;
    v = v < lo ? lo : v;
    v = v > hi ? hi : v;
    y[i] = (uint8_t)((int32_t)((v + Q_MAGIC) - Q_MAGIC) + zp);
  }
}

ES_KCLONES static void quant_u8(const float *restrict x, float s, int32_t zp, uint8_t *restrict y, int64_t n) {
  quant_u8_loop(x, s, zp, y, n);
}

ES_KCLONES static void quant_s8(const float *restrict x, float s, int32_t zp, int8_t *restrict y, int64_t n) {
  const float lo = (float)(-128 - zp), hi = (float)(127 - zp);
  for (int64_t i = 0; i < n; i++) {
    float v = x[i] / s;
    v = v == v ? v : 0.0f;
    v = v < lo ? lo : v;
    v = v > hi ? hi : v;
    y[i] = (int8_t)((int32_t)((v + Q_MAGIC) - Q_MAGIC) + zp);
  }
}

#if defined(__x86_64__)
/* The input's quantization (det's 640x640 picture) 512 bits wide. */
Q_AVX512 static void quant_u8_512(const float *restrict x, float s, int32_t zp,
                                  uint8_t *restrict y, int64_t n) {
  quant_u8_loop(x, s, zp, y, n);
}
#endif

ES_KCLONES static void dequant_u8(const uint8_t *restrict x, float s, int32_t zp, float *restrict y, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    y[i] = (float)((int32_t)x[i] - zp) * s;
}

ES_KCLONES static void dequant_s8(const int8_t *restrict x, float s, int32_t zp, float *restrict y, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    y[i] = (float)((int32_t)x[i] - zp) * s;
}

static int quant_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  (void)scratch;
  const qlin_params *p = k->params;
  const q_map *m = &p->map;
  const float *s = in[1];
  const void *z = p->has_zp ? in[2] : NULL;
  int ysg = p->yt == ES_DTYPE_INT8;
  if (q_per_tensor(m) && p->xt == ES_DTYPE_FLOAT) {
    int32_t zp = z ? q_at8(z, ysg, 0) : 0;
    if (ysg)
      quant_s8(in[0], s[0], zp, out[0], m->d);
#if defined(__x86_64__)
    else if (q_cpu(Q_CPU_512))
      quant_u8_512(in[0], s[0], zp, out[0], m->d);
#endif
    else
      quant_u8(in[0], s[0], zp, out[0], m->d);
    return 0;
  }
  int64_t e = 0;
  for (int64_t o = 0; o < m->outer; o++)
    for (int64_t a = 0; a < m->d; a++) {
      int64_t base = o * m->so + (a / m->block) * m->sa;
      for (int64_t i = 0; i < m->inner; i++, e++) {
        int64_t q = base + i * m->si;
        float xv = p->xt == ES_DTYPE_FLOAT ? ((const float *)in[0])[e]
                                           : (float)((const int32_t *)in[0])[e];
        int32_t zp = z ? q_at8(z, ysg, q) : 0;
        q_store8(out[0], ysg, e, q_round_sat(xv / s[q], zp, p->lo, p->hi));
      }
    }
  return 0;
}

static int dequant_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  (void)scratch;
  const qlin_params *p = k->params;
  const q_map *m = &p->map;
  const float *s = in[1];
  const void *z = p->has_zp ? in[2] : NULL;
  float *y = out[0];
  if (q_per_tensor(m) && q_is_8bit(p->xt)) {
    int32_t zp = z ? (int32_t)q_at(z, p->xt, 0) : 0;
    if (p->xt == ES_DTYPE_INT8)
      dequant_s8(in[0], s[0], zp, y, m->d);
    else
      dequant_u8(in[0], s[0], zp, y, m->d);
    return 0;
  }
  int64_t e = 0;
  for (int64_t o = 0; o < m->outer; o++)
    for (int64_t a = 0; a < m->d; a++) {
      int64_t base = o * m->so + (a / m->block) * m->sa;
      for (int64_t i = 0; i < m->inner; i++, e++) {
        int64_t q = base + i * m->si;
        int64_t zp = z ? q_at(z, p->xt, q) : 0;
        y[e] = (float)(q_at(in[0], p->xt, e) - zp) * s[q];
      }
    }
  return 0;
}

/* ==========================================================================
 * DynamicQuantizeLinear
 * ======================================================================== */

typedef struct dql_params {
  int64_t count;
  int has[3]; /* outputs y, y_scale, y_zero_point present */
} dql_params;

static int dql_infer(es_kinst *k) {
  dql_params *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  k->params = p;
  int rc;
  if (k->n_in != 1 || !k->in[0])
    return ES_KFAIL(k, ES_EMODEL, "has %d inputs, expected 1 (x)", k->n_in);
  if (k->n_out < 1 || k->n_out > 3)
    return ES_KFAIL(k, ES_EMODEL, "has %d outputs, expected 1 to 3", k->n_out);
  const es_tdesc *x = k->in[0];
  if ((rc = q_dtype_float(k, x, "x")) < 0)
    return rc;
  p->count = (int64_t)x->count;
  for (int i = 0; i < k->n_out; i++)
    p->has[i] = k->out[i] != NULL;
  if (p->has[0] && (rc = q_out_set(k, 0, ES_DTYPE_UINT8, x->rank, x->dims)) < 0)
    return rc;
  if (p->has[1] && (rc = q_out_set(k, 1, ES_DTYPE_FLOAT, 0, NULL)) < 0)
    return rc;
  if (p->has[2] && (rc = q_out_set(k, 2, ES_DTYPE_UINT8, 0, NULL)) < 0)
    return rc;
  k->inplace = -1;
  return 0;
}

/* The range [min(x, 0), max(x, 0)] mapped onto [0, 255] (NaNs ignored);
 * an empty range (all zeros) gets scale 1, as ONNX Runtime gives it,
 * instead of the 0 that would divide by zero. */
static int dql_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  (void)scratch;
  const dql_params *p = k->params;
  const float *x = in[0];
  float mn = 0.0f, mx = 0.0f;
  for (int64_t i = 0; i < p->count; i++) {
    mn = x[i] < mn ? x[i] : mn;
    mx = x[i] > mx ? x[i] : mx;
  }
  float scale = mx == mn ? 1.0f : (mx - mn) / 255.0f;
  float zf = 0.0f - mn / scale;
  if (zf != zf)
    zf = 0.0f; /* an infinite range */
  zf = zf < 0.0f ? 0.0f : zf > 255.0f ? 255.0f : zf;
  int32_t zp = (int32_t)rintf(zf);
  if (p->has[0])
    for (int64_t i = 0; i < p->count; i++)
      ((uint8_t *)out[0])[i] = (uint8_t)q_round_sat(x[i] / scale, zp, 0, 255);
  if (p->has[1])
    *(float *)out[1] = scale;
  if (p->has[2])
    *(uint8_t *)out[2] = (uint8_t)zp;
  return 0;
}

/* ==========================================================================
 * MatMulInteger and QLinearMatMul
 * ======================================================================== */

/* The operands of the product: A, B, and A's and B's zero points. */
enum { MM_A, MM_B, MM_ZA, MM_ZB, MM_OPS };

typedef struct qmm_params {
  int qlinear;
  int64_t m, k, n;
  int nb;                              /* output batch rank */
  int64_t bdims[ES_MAX_RANK];          /* output batch dims */
  int64_t st[ES_MAX_RANK * MM_OPS];    /* per batch dim and operand: element stride */
  int64_t batch;
  int empty;                           /* the output has no element: run does nothing */
  int as, bs;                          /* A, B signed */
  int has_za, has_zb;
  int za_rows, zb_cols;                /* zero point per row of A, per column of B */
  /* QLinearMatMul */
  int sa_rows, sb_cols;                /* scale per row of A, per column of B */
  int ys;                              /* Y signed */
  /* ... and the extensions a QDQ linear layer lowers to (engine/fuse_qdq.c) */
  int transb;                          /* "_transB": B is [N, K] */
  int has_bias;                        /* input 8: int32 [N], added before the scale */
  int relu;                            /* "activation" 1: Relu before the rounding */
  int fout;                            /* "_float_out": Y is float32 = sum * a_scale * b_scale */
  int32_t lo, hi;
  int use_dnnl;                        /* oneDNN's int8 matmul (qmm_dnnl_fits) */
  es_dnnl_prim dnnl;
  float *scales;                       /* its requantization: a_scale * b_scale[j] / y_scale */
} qmm_params;

/* QLinearConv's and QLinearMatMul's float output (attribute "_float_out",
 * which the lowering of a QDQ layer with a float output sets, y's scale
 * and zero point absent): 0 or 1, or an error. */
static int q_float_out(es_kinst *k, int *fout) {
  int64_t v;
  int rc = es__attr_int(k, "_float_out", 0, &v);
  if (rc < 0)
    return rc;
  *fout = v != 0;
  if (*fout && ((k->n_in > 6 && k->in[6]) || (k->n_in > 7 && k->in[7])))
    return ES_KFAIL(k, ES_EMODEL, "_float_out: y_scale and y_zero_point must be absent");
  return 0;
}

/* Y's type for QLinearConv and QLinearMatMul: float32 with "_float_out",
 * else y_zero_point's, with its signedness and range set. */
static es_dtype q_y_type(int fout, const es_tdesc *zy, int *ys, int32_t *lo, int32_t *hi) {
  if (fout)
    return ES_DTYPE_FLOAT;
  *ys = zy->dtype == ES_DTYPE_INT8;
  q_range(zy->dtype, lo, hi);
  return zy->dtype;
}

static int q_activation(es_kinst *k, int *relu) {
  int64_t act;
  int rc = es__attr_int(k, "activation", 0, &act);
  if (rc < 0)
    return rc;
  if (act != 0 && act != 1)
    return ES_KFAIL(k, ES_EMODEL, "activation %lld is not 0 (none) or 1 (Relu)", (long long)act);
  *relu = act == 1;
  return 0;
}

/* Input indices per op: A, B, za, zb (MatMulInteger: 0 1 2 3; QLinearMatMul:
 * 0 3 2 5, scales 1 4, Y's 6 7). */
static const int mmi_idx[MM_OPS] = {0, 1, 2, 3}, qlmm_idx[MM_OPS] = {0, 3, 2, 5};

static void qmm_batch_of(const es_tdesc *t, int nb, int64_t *dims) {
  int tb = t->rank > 2 ? t->rank - 2 : 0;
  for (int i = 0; i < nb; i++) {
    int j = i - (nb - tb);
    dims[i] = j >= 0 ? t->dims[j] : 1;
  }
}

/* A zero point of A (is_a) or B: one element, a vector along M (of A's
 * rows) or N (of B's columns), or (MatMulInteger) the operand's shape with
 * K replaced by 1. Sets *per (per row / column) and *nd (batched). */
static int qmm_zero_point(es_kinst *k, const qmm_params *p, const es_tdesc *z, const es_tdesc *x,
                          int is_a, const char *name, int *per, int *nd) {
  *per = *nd = 0;
  if (q_is_single(z))
    return 0;
  int64_t n = is_a ? p->m : p->n;
  if (z->rank == 1 && z->dims[0] == n && x->rank >= 2) {
    *per = 1;
    return 0;
  }
  int ok = !p->qlinear && x->rank > 2 && z->rank == x->rank;
  for (int i = 0; ok && i < x->rank; i++)
    ok = z->dims[i] == (i == x->rank - (is_a ? 1 : 2) ? 1 : x->dims[i]);
  if (!ok)
    return ES_KFAIL(k, ES_EMODEL, "%s must be a scalar, 1-D with %lld elements (one per %s)%s; "
                    "has rank %d and %zu elements", name, (long long)n,
                    is_a ? "row of A" : "column of B",
                    p->qlinear ? "" : is_a ? " or A's shape with K = 1" : " or B's shape with K = 1",
                    z->rank, z->count);
  *per = *nd = 1;
  return 0;
}

/* oneDNN's int8 matmul (brgemm, VNNI) for a QLinearMatMul by static int8
 * weights B [K, N] (A's batch folds into M: B has none), with zero points 0
 * for B (symmetric, as quantizers write them), per-tensor scale and zero
 * point for A and every scale and zero point known while planning: a
 * linear layer of a QDQ model, lowered at load (engine/fuse_qdq.c). The
 * requantization (a_scale * b_scale[j] / y_scale, then y's zero point,
 * rounded half to even and saturated) is the primitive's output scales and
 * zero points, computed as the loops compute it. Anything else keeps the
 * exact loops. */
static int qmm_dnnl_fits(const es_kinst *k, const qmm_params *p) {
  if (!p->qlinear || p->empty || !p->bs || p->sa_rows || p->za_rows ||
      k->in[3]->rank != 2 || !k->in_static[3])
    return 0;
  for (int i = 1; i < k->n_in; i++)
    if (i != 3 && k->in[i] && !k->in_static[i])
      return 0;
  const int8_t *zb = k->in_static[5];
  for (size_t i = 0; i < k->in[5]->count; i++)
    if (zb[i] != 0)
      return 0;
  return 1;
}

static int qmm_dnnl_setup(es_kinst *k, qmm_params *p) {
  dnnl_dims_t ad = {p->batch * p->m, p->k}, bd = {p->k, p->n}, cd = {p->batch * p->m, p->n},
              biasd = {1, p->n};
  dnnl_memory_desc_t amd, bmd, bany, cmd, biasmd;
  dnnl_status_t st = dnnl_memory_desc_init_by_tag(&amd, 2, ad, p->as ? dnnl_s8 : dnnl_u8, dnnl_ab);
  if (st == dnnl_success) /* B [N, K] is B [K, N] with its strides swapped */
    st = dnnl_memory_desc_init_by_tag(&bmd, 2, bd, dnnl_s8, p->transb ? dnnl_ba : dnnl_ab);
  if (st == dnnl_success)
    st = dnnl_memory_desc_init_by_tag(&bany, 2, bd, dnnl_s8, dnnl_format_tag_any);
  if (st == dnnl_success)
    st = dnnl_memory_desc_init_by_tag(&cmd, 2, cd,
                                      p->fout ? dnnl_f32 : p->ys ? dnnl_s8 : dnnl_u8, dnnl_ab);
  if (st == dnnl_success)
    st = dnnl_memory_desc_init_by_tag(&biasmd, 2, biasd, dnnl_s32, dnnl_ab);
  if (st != dnnl_success)
    return es__dnnl_fail(k, st, "describing the int8 tensors");
  const float *sa = k->in_static[1], *sb = k->in_static[4];
  float sy = p->fout ? 1.0f : *(const float *)k->in_static[6];
  int64_t ns = p->sb_cols ? p->n : 1;
  if (!(p->scales = es__kinst_alloc(k, (size_t)ns * sizeof *p->scales)))
    return ES_KFAIL(k, ES_ENOMEM, "out of memory for the scales");
  for (int64_t j = 0; j < ns; j++)
    p->scales[j] = p->fout ? sa[0] * sb[j] : sa[0] * sb[j] / sy; /* as the loops compute it */
  es_dnnl_quant q = {p->scales, ns, p->has_za ? q_at8(k->in_static[2], p->as, 0) : 0,
                     p->fout ? 0 : q_at8(k->in_static[7], p->ys, 0), 0};
  dnnl_post_ops_t po = NULL;
  if (p->relu) {
    st = dnnl_post_ops_create(&po);
    if (st == dnnl_success)
      st = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, 0.0f, 0.0f);
    if (st != dnnl_success) {
      if (po)
        dnnl_post_ops_destroy(po);
      return es__dnnl_fail(k, st, "describing the fused Relu");
    }
  }
  dnnl_matmul_desc_t d;
  st = dnnl_matmul_desc_init(&d, &amd, &bany, p->has_bias ? &biasmd : NULL, &cmd);
  int rc = st != dnnl_success ? es__dnnl_fail(k, st, "describing the int8 matmul")
                              : es__dnnl_prim_create_q(k, &d, po, &q, &p->dnnl);
  if (po)
    dnnl_post_ops_destroy(po);
  if (rc == 0)
    rc = es__dnnl_weights_prepare(k, &p->dnnl, &bmd, k->in_static[3]);
  return rc;
}

static int qmm_infer(es_kinst *k) {
  qmm_params *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  k->params = p;
  p->qlinear = k->node.op == ES_OP_QLinearMatMul;
  const int *ix = p->qlinear ? qlmm_idx : mmi_idx;
  int rc;
  if (p->qlinear) {
    static const char *names[8] = {"a", "a_scale", "a_zero_point", "b",
                                   "b_scale", "b_zero_point", "y_scale", "y_zero_point"};
    int64_t tb;
    if ((rc = q_io(k, 8, 9)) < 0 || (rc = q_float_out(k, &p->fout)) < 0 ||
        (rc = q_activation(k, &p->relu)) < 0 || (rc = es__attr_int(k, "_transB", 0, &tb)) < 0)
      return rc;
    p->transb = tb != 0;
    for (int i = 0; i < (p->fout ? 6 : 8); i++)
      if ((rc = q_need(k, i, names[i])) < 0)
        return rc;
  } else if ((rc = q_io(k, 2, 4)) < 0 || (rc = q_need(k, 0, "A")) < 0 ||
             (rc = q_need(k, 1, "B")) < 0) {
    return rc;
  }
  const es_tdesc *a = k->in[ix[MM_A]], *b = k->in[ix[MM_B]];
  const es_tdesc *za = k->n_in > ix[MM_ZA] ? k->in[ix[MM_ZA]] : NULL;
  const es_tdesc *zb = k->n_in > ix[MM_ZB] ? k->in[ix[MM_ZB]] : NULL;
  if ((rc = q_dtype_8bit(k, a, "A")) < 0 || (rc = q_dtype_8bit(k, b, "B")) < 0)
    return rc;
  if (za && za->dtype != a->dtype)
    return ES_KFAIL(k, ES_EMODEL, "A's zero point is %s, A %s: they must be the same type",
                    es_dtype_name(za->dtype), es_dtype_name(a->dtype));
  if (zb && zb->dtype != b->dtype)
    return ES_KFAIL(k, ES_EMODEL, "B's zero point is %s, B %s: they must be the same type",
                    es_dtype_name(zb->dtype), es_dtype_name(b->dtype));
  p->as = a->dtype == ES_DTYPE_INT8;
  p->bs = b->dtype == ES_DTYPE_INT8;
  if (a->rank < 1 || b->rank < 1)
    return ES_KFAIL(k, ES_EMODEL, "A and B must have rank 1 or more (A %d, B %d)", a->rank,
                    b->rank);
  for (int t = 0; t < 2; t++) {
    const es_tdesc *x = t ? b : a;
    for (int i = 0; i < x->rank; i++)
      if (x->dims[i] > Q_DIM_MAX)
        return ES_KFAIL(k, ES_EMODEL, "dimension %d of %c is %lld, more than 2^40", i,
                        t ? 'B' : 'A', (long long)x->dims[i]);
  }
  if (p->transb && b->rank != 2)
    return ES_KFAIL(k, ES_EMODEL, "_transB: B must have rank 2, not %d", b->rank);
  /* numpy's MatMul: A [K] is [1, K] and B [K] is [K, 1], the 1 dropped */
  p->m = a->rank == 1 ? 1 : a->dims[a->rank - 2];
  p->k = a->dims[a->rank - 1];
  int64_t kb = b->rank == 1 ? b->dims[0] : b->dims[b->rank - (p->transb ? 1 : 2)];
  p->n = b->rank == 1 ? 1 : b->dims[p->transb ? 0 : b->rank - 1];
  if (kb != p->k)
    return ES_KFAIL(k, ES_EMODEL, "inner dimensions differ: A has K = %lld, B has K = %lld",
                    (long long)p->k, (long long)kb);
  int za_nd = 0, zb_nd = 0;
  if (za && (rc = qmm_zero_point(k, p, za, a, 1, "A's zero point", &p->za_rows, &za_nd)) < 0)
    return rc;
  if (zb && (rc = qmm_zero_point(k, p, zb, b, 0, "B's zero point", &p->zb_cols, &zb_nd)) < 0)
    return rc;
  p->has_za = za != NULL;
  p->has_zb = zb != NULL;
  int ab = a->rank > 2 ? a->rank - 2 : 0, bb = b->rank > 2 ? b->rank - 2 : 0;
  p->nb = ab > bb ? ab : bb;
  int64_t ad[ES_MAX_RANK], bd[ES_MAX_RANK], od[ES_MAX_RANK + 2];
  qmm_batch_of(a, p->nb, ad);
  qmm_batch_of(b, p->nb, bd);
  int r = 0;
  for (int i = 0; i < p->nb; i++) {
    if (ad[i] != bd[i] && ad[i] != 1 && bd[i] != 1)
      return ES_KFAIL(k, ES_EMODEL,
                      "batch dimensions do not broadcast: %lld vs %lld (output batch axis %d)",
                      (long long)ad[i], (long long)bd[i], i);
    p->bdims[i] = od[r++] = ad[i] == 1 ? bd[i] : ad[i];
  }
  if (a->rank > 1)
    od[r++] = p->m;
  if (b->rank > 1)
    od[r++] = p->n;
  if (r > ES_MAX_RANK)
    return ES_KFAIL(k, ES_ENOTSUP, "the output has rank %d, more than %d", r, ES_MAX_RANK);
  es_dtype yt = ES_DTYPE_INT32;
  if (p->qlinear) {
    const es_tdesc *sa = k->in[1], *sb = k->in[4], *sy = k->in[6], *zy = k->in[7];
    const es_tdesc *bias = k->n_in > 8 ? k->in[8] : NULL;
    if ((rc = q_dtype_float(k, sa, "a_scale")) < 0 || (rc = q_dtype_float(k, sb, "b_scale")) < 0 ||
        (rc = q_vec(k, sa, p->m, "a_scale", "one per row of a", &p->sa_rows)) < 0 ||
        (rc = q_vec(k, sb, p->n, "b_scale", "one per column of b", &p->sb_cols)) < 0)
      return rc;
    if (!p->fout && ((rc = q_dtype_float(k, sy, "y_scale")) < 0 ||
                     (rc = q_dtype_8bit(k, zy, "y_zero_point")) < 0 ||
                     (rc = q_single(k, sy, "y_scale")) < 0 ||
                     (rc = q_single(k, zy, "y_zero_point")) < 0))
      return rc;
    if (p->sa_rows && a->rank < 2)
      return ES_KFAIL(k, ES_EMODEL, "a_scale has one value per row, but a is 1-D");
    if (p->sb_cols && b->rank < 2)
      return ES_KFAIL(k, ES_EMODEL, "b_scale has one value per column, but b is 1-D");
    if (bias && (bias->dtype != ES_DTYPE_INT32 || bias->rank != 1 || bias->dims[0] != p->n))
      return ES_KFAIL(k, ES_EMODEL, "the bias (input 8) must be int32 and 1-D with %lld values "
                      "(the columns); it is %s with rank %d", (long long)p->n,
                      es_dtype_name(bias->dtype), bias->rank);
    p->has_bias = bias != NULL;
    yt = q_y_type(p->fout, zy, &p->ys, &p->lo, &p->hi);
  }
  if ((rc = q_out_set(k, 0, yt, r, od)) < 0)
    return rc;
  k->inplace = -1;
  p->empty = k->out[0]->count == 0;
  if (p->empty)
    return 0;
  /* Element strides per output batch dim (0 where an operand broadcasts).
   * With a nonzero output every operand's dims are at least 1 except K, so
   * each product stays below its operand's element count (or is 0). */
  int64_t sz[MM_OPS] = {p->m * p->k, p->k * p->n, za_nd ? p->m : 0, zb_nd ? p->n : 0};
  p->batch = 1;
  for (int i = p->nb - 1; i >= 0; i--) {
    int64_t *st = p->st + (size_t)i * MM_OPS;
    st[MM_A] = ad[i] == 1 ? 0 : sz[MM_A];
    st[MM_B] = bd[i] == 1 ? 0 : sz[MM_B];
    st[MM_ZA] = ad[i] == 1 ? 0 : sz[MM_ZA];
    st[MM_ZB] = bd[i] == 1 ? 0 : sz[MM_ZB];
    sz[MM_A] *= ad[i];
    sz[MM_B] *= bd[i];
    sz[MM_ZA] *= ad[i];
    sz[MM_ZB] *= bd[i];
    p->batch *= p->bdims[i];
  }
  k->flops = 2 * (uint64_t)k->out[0]->count * (uint64_t)p->k;
  p->use_dnnl = !es__kernels_reference() && qmm_dnnl_fits(k, p);
  if (p->use_dnnl &&
      (rc = es__dnnl_setup_done(k, &p->dnnl, qmm_dnnl_setup(k, p), &p->use_dnnl)) < 0)
    return rc;
  if (!p->use_dnnl)
    k->scratch_bytes = p->qlinear ? (size_t)p->n * sizeof(uint32_t) : 0;
  return 0;
}

static void qmm_release(es_kinst *k) {
  qmm_params *p = k->params;
  if (p)
    es__dnnl_prim_destroy(&p->dnnl);
}

static int qmm_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  const qmm_params *p = k->params;
  const int *ix = p->qlinear ? qlmm_idx : mmi_idx;
  const void *a = in[ix[MM_A]], *b = in[ix[MM_B]];
  const void *za = p->has_za ? in[ix[MM_ZA]] : NULL, *zb = p->has_zb ? in[ix[MM_ZB]] : NULL;
  int64_t m = p->m, kk = p->k, n = p->n;
  if (p->empty)
    return 0;
  if (p->use_dnnl)
    return es__dnnl_prim_run(k, &p->dnnl, a, p->dnnl.weights ? p->dnnl.weights : b,
                             p->has_bias ? in[8] : NULL, out[0], NULL, scratch);
  int64_t idx[ES_MAX_RANK] = {0}, off[MM_OPS] = {0};
  for (int64_t bt = 0; bt < p->batch; bt++) {
    uint32_t *yi = p->qlinear ? NULL : (uint32_t *)out[0] + bt * m * n;
    for (int64_t i = 0; i < m; i++) {
      uint32_t *acc = p->qlinear ? scratch : yi + i * n;
      memset(acc, 0, (size_t)n * sizeof *acc);
      int32_t zai = za ? q_at8(za, p->as, off[MM_ZA] + (p->za_rows ? i : 0)) : 0;
      const int64_t arow = off[MM_A] + i * kk;
      uint32_t asum = 0; /* sum of (a - za) over the row, for B's zero points */
      for (int64_t t = 0; t < kk; t++) {
        int32_t av = q_at8(a, p->as, arow + t) - zai;
        asum += (uint32_t)av;
        if (av == 0 || p->transb)
          continue;
        if (p->bs)
          q_axpy_i8(acc, (const int8_t *)b + off[MM_B] + t * n, av, n);
        else
          q_axpy_u8(acc, (const uint8_t *)b + off[MM_B] + t * n, av, n);
      }
      for (int64_t j = 0; p->transb && j < n; j++) /* B [N, K]: a row of B per column */
        for (int64_t t = 0; t < kk; t++)
          acc[j] += (uint32_t)(q_at8(a, p->as, arow + t) - zai) *
                    (uint32_t)q_at8(b, p->bs, j * kk + t);
      if (zb)
        for (int64_t j = 0; j < n; j++)
          acc[j] -= asum * (uint32_t)q_at8(zb, p->bs, off[MM_ZB] + (p->zb_cols ? j : 0));
      if (!p->qlinear)
        continue;
      /* requantize the row (or scale it, for a float output) */
      const float *sa = in[1], *sb = in[4];
      float sy = p->fout ? 1.0f : *(const float *)in[6];
      int32_t zy = p->fout ? 0 : q_at8(in[7], p->ys, 0);
      const int32_t *bias = p->has_bias ? in[8] : NULL;
      float sai = sa[p->sa_rows ? i : 0];
      for (int64_t j = 0; j < n; j++) {
        float sbj = sb[p->sb_cols ? j : 0];
        float mult = p->fout ? sai * sbj : sai * sbj / sy;
        float v = (float)(int32_t)(acc[j] + (bias ? (uint32_t)bias[j] : 0u)) * mult;
        if (p->relu && v < 0)
          v = 0;
        if (p->fout)
          ((float *)out[0])[(bt * m + i) * n + j] = v;
        else
          q_store8(out[0], p->ys, (bt * m + i) * n + j, q_round_sat(v, zy, p->lo, p->hi));
      }
    }
    es__walk_step(p->nb, p->bdims, idx, MM_OPS, off, p->st);
  }
  return 0;
}

/* ==========================================================================
 * ConvInteger and QLinearConv
 * ======================================================================== */

typedef struct qconv_params {
  int qlinear;
  int nsp;                 /* spatial rank: 1..3 */
  int64_t n, c, m, g;      /* batch, input channels, output channels, groups */
  /* spatial geometry right-aligned in 3 slots (leading ones: size 1) */
  int64_t in[3], out[3], ker[3], str[3], dil[3], pb[3], pe[3];
  int xs, ws, ys;          /* X, W, Y signed */
  int has_zx, has_zw;
  int zw_per;              /* W's zero point per output channel */
  int sw_per;              /* QLinearConv: W's scale per output channel */
  int has_bias;
  int32_t lo, hi;
  int64_t ivol, ovol, kvol; /* spatial volumes of x, y and the kernel */
  int empty;                /* the output has no element: run does nothing */
  int relu;                 /* QLinearConv: "activation" 1 (set when a Relu was fused) */
  int fout;                 /* "_float_out": Y is float32 = (sum + bias) * x_scale * w_scale */
  int transpose;            /* QLinearConvTranspose (internal): W is [C, M/g, k...] */
  int64_t outpad[3];        /* its output_padding, right-aligned as the geometry */
  int use_dnnl, nhwc;       /* oneDNN's int8 convolution, channels-last */
  int kxs;                  /* QLinearConvTranspose as one int8 matmul (qconvt_kxs_setup) */
  size_t kxs_bias_at;       /* ... its bias per column at this byte offset of the weights */
  es_dnnl_prim dnnl;
  float *scales;            /* its requantization: x_scale * w_scale[c] / y_scale */
} qconv_params;

/* Input indices: X, W, x's zero point, w's zero point (ConvInteger 0 1 2 3;
 * QLinearConv 0 3 2 5, scales 1 4, Y's 6 7, bias 8). */
enum { QC_X, QC_W, QC_ZX, QC_ZW };
static const int ci_idx[4] = {0, 1, 2, 3}, qlc_idx[4] = {0, 3, 2, 5};

/* An ints attribute of exactly len values in [min, 2^20] (def when absent). */
static int qconv_ints(es_kinst *k, const char *name, int len, int64_t min, int64_t def,
                      int64_t *out) {
  const int64_t *v;
  size_t n;
  int rc = es__attr_ints(k, name, &v, &n);
  if (rc < 0)
    return rc;
  for (int i = 0; i < len; i++) {
    if (v && n != (size_t)len)
      return ES_KFAIL(k, ES_EMODEL, "attribute %s has %zu values, expected %d", name, n, len);
    out[i] = v ? v[i] : def;
    if (out[i] < min || out[i] > Q_ATTR_MAX)
      return ES_KFAIL(k, ES_EMODEL, "%s[%d] is %lld, expected %lld to 2^20", name, i,
                      (long long)out[i], (long long)min);
  }
  return 0;
}

/* What Conv and ConvTranspose ask of X and W alike: ranks 3 to 5, equal,
 * dims below 2^40; sets the spatial rank and the group. */
static int qconv_ranks(es_kinst *k, qconv_params *p, const es_tdesc *x, const es_tdesc *w) {
  if (x->rank < 3)
    return ES_KFAIL(k, ES_EMODEL, "x has rank %d, expected N x C x D1 ... (rank 3 or more)",
                    x->rank);
  if (x->rank > 5)
    return ES_KFAIL(k, ES_ENOTSUP, "x has rank %d: only 1-D to 3-D convolutions are supported",
                    x->rank);
  if (w->rank != x->rank)
    return ES_KFAIL(k, ES_EMODEL, "w has rank %d, expected %d (as x)", w->rank, x->rank);
  for (int t = 0; t < 2; t++) {
    const es_tdesc *d = t ? w : x;
    for (int i = 0; i < d->rank; i++)
      if (d->dims[i] > Q_DIM_MAX)
        return ES_KFAIL(k, ES_EMODEL, "dimension %d of %s is %lld, more than 2^40", i,
                        t ? "w" : "x", (long long)d->dims[i]);
  }
  p->nsp = x->rank - 2;
  int rc = es__attr_int(k, "group", 1, &p->g);
  if (rc < 0)
    return rc;
  if (p->g < 1 || p->g > Q_DIM_MAX)
    return ES_KFAIL(k, ES_EMODEL, "group is %lld, expected at least 1", (long long)p->g);
  return 0;
}

/* Conv's geometry (the ONNX Conv attributes) for X and W. */
static int qconv_geometry(es_kinst *k, qconv_params *p, const es_tdesc *x, const es_tdesc *w) {
  int rc = qconv_ranks(k, p, x, w), nsp = x->rank - 2;
  if (rc < 0)
    return rc;
  p->n = x->dims[0];
  p->c = x->dims[1];
  p->m = w->dims[0];
  if (p->c % p->g || p->m % p->g)
    return ES_KFAIL(k, ES_EMODEL, "x's %lld channels and w's %lld output channels must be "
                    "multiples of group %lld", (long long)p->c, (long long)p->m, (long long)p->g);
  if (w->dims[1] * p->g != p->c)
    return ES_KFAIL(k, ES_EMODEL, "w has %lld input channels per group, expected %lld (x's %lld "
                    "/ group %lld)", (long long)w->dims[1], (long long)(p->c / p->g),
                    (long long)p->c, (long long)p->g);
  int64_t st[3], dl[3], pads[6];
  const int64_t *kv;
  size_t kn;
  if ((rc = es__attr_ints(k, "kernel_shape", &kv, &kn)) < 0)
    return rc;
  if (kv && kn != (size_t)nsp)
    return ES_KFAIL(k, ES_EMODEL, "kernel_shape has %zu values, expected %d", kn, nsp);
  for (int i = 0; i < nsp; i++) {
    if (w->dims[2 + i] < 1)
      return ES_KFAIL(k, ES_EMODEL, "w's kernel dimension %d is %lld, expected at least 1", i,
                      (long long)w->dims[2 + i]);
    if (kv && kv[i] != w->dims[2 + i])
      return ES_KFAIL(k, ES_EMODEL, "kernel_shape[%d] is %lld but w's kernel is %lld", i,
                      (long long)kv[i], (long long)w->dims[2 + i]);
  }
  if ((rc = qconv_ints(k, "strides", nsp, 1, 1, st)) < 0 ||
      (rc = qconv_ints(k, "dilations", nsp, 1, 1, dl)) < 0 ||
      (rc = qconv_ints(k, "pads", 2 * nsp, 0, 0, pads)) < 0)
    return rc;
  const char *ap;
  if ((rc = es__attr_string(k, "auto_pad", "NOTSET", &ap)) < 0)
    return rc;
  int same = !strcmp(ap, "SAME_UPPER") ? 1 : !strcmp(ap, "SAME_LOWER") ? 2 : 0;
  if (!same && strcmp(ap, "NOTSET") && strcmp(ap, "VALID"))
    return ES_KFAIL(k, ES_EMODEL, "auto_pad '%s' is not one of NOTSET, SAME_UPPER, SAME_LOWER, "
                    "VALID", ap);
  int valid = !strcmp(ap, "VALID");
  for (int s = 0; s < 3; s++) {
    int i = s - (3 - nsp);
    if (i < 0) {
      p->in[s] = p->out[s] = p->ker[s] = p->str[s] = p->dil[s] = 1;
      p->pb[s] = p->pe[s] = 0;
      continue;
    }
    p->in[s] = x->dims[2 + i];
    p->ker[s] = w->dims[2 + i];
    p->str[s] = st[i];
    p->dil[s] = dl[i];
    int64_t dk = (p->ker[s] - 1) * p->dil[s] + 1, pe;
    if (same) {
      int64_t o = (p->in[s] + st[i] - 1) / st[i];
      int64_t total = (o - 1) * st[i] + dk - p->in[s];
      total = total > 0 ? total : 0;
      p->pb[s] = same == 1 ? total / 2 : total - total / 2;
      pe = total - p->pb[s];
    } else if (valid) {
      p->pb[s] = pe = 0;
    } else {
      p->pb[s] = pads[i];
      pe = pads[nsp + i];
    }
    int64_t span = p->in[s] + p->pb[s] + pe;
    if (span < dk)
      return ES_KFAIL(k, ES_EMODEL, "kernel extent %lld (kernel %lld, dilation %lld) is larger "
                      "than the padded input %lld on spatial axis %d", (long long)dk,
                      (long long)p->ker[s], (long long)p->dil[s], (long long)span, i);
    p->out[s] = (span - dk) / p->str[s] + 1;
    p->pe[s] = pe;
  }
  return 0;
}

/* ConvTranspose's geometry (ONNX's attributes; auto_pad NOTSET or VALID,
 * no output_shape: the loader lowers only those) for X and W [C, M/g, k...]. */
static int qconvt_geometry(es_kinst *k, qconv_params *p, const es_tdesc *x, const es_tdesc *w) {
  int rc = qconv_ranks(k, p, x, w), nsp = x->rank - 2;
  if (rc < 0)
    return rc;
  p->n = x->dims[0];
  p->c = x->dims[1];
  p->m = w->dims[1] * p->g;
  if (w->dims[0] != p->c || p->c % p->g)
    return ES_KFAIL(k, ES_EMODEL, "w has %lld input channels, x %lld (a multiple of group %lld)",
                    (long long)w->dims[0], (long long)p->c, (long long)p->g);
  if (es__kattr(k, "output_shape"))
    return ES_KFAIL(k, ES_ENOTSUP, "output_shape is not supported here (pads instead)");
  const char *ap;
  if ((rc = es__attr_string(k, "auto_pad", "NOTSET", &ap)) < 0)
    return rc;
  if (strcmp(ap, "NOTSET") && strcmp(ap, "VALID"))
    return ES_KFAIL(k, ES_ENOTSUP, "auto_pad '%s' is not supported here (NOTSET, VALID)", ap);
  int64_t st[3], dl[3], pads[6] = {0}, op[3];
  if ((rc = qconv_ints(k, "strides", nsp, 1, 1, st)) < 0 ||
      (rc = qconv_ints(k, "dilations", nsp, 1, 1, dl)) < 0 ||
      (rc = qconv_ints(k, "output_padding", nsp, 0, 0, op)) < 0 ||
      (strcmp(ap, "VALID") && (rc = qconv_ints(k, "pads", 2 * nsp, 0, 0, pads)) < 0))
    return rc;
  for (int s = 0; s < 3; s++) {
    int i = s - (3 - nsp);
    if (i < 0) {
      p->in[s] = p->out[s] = p->ker[s] = p->str[s] = p->dil[s] = 1;
      p->pb[s] = p->pe[s] = p->outpad[s] = 0;
      continue;
    }
    p->in[s] = x->dims[2 + i];
    p->ker[s] = w->dims[2 + i];
    if (p->ker[s] < 1)
      return ES_KFAIL(k, ES_EMODEL, "w's kernel dimension %d is %lld, expected at least 1", i,
                      (long long)p->ker[s]);
    p->str[s] = st[i];
    p->dil[s] = dl[i];
    p->pb[s] = pads[i];
    p->pe[s] = pads[nsp + i];
    p->outpad[s] = op[i];
    if (op[i] >= st[i] && op[i] >= dl[i])
      return ES_KFAIL(k, ES_EMODEL, "output_padding[%d] is %lld, expected less than the stride "
                      "or the dilation", i, (long long)op[i]);
    int64_t o = st[i] * (p->in[s] - 1) + (p->ker[s] - 1) * dl[i] + 1 + op[i] - p->pb[s] - p->pe[s];
    if (p->in[s] < 1 || o < 1)
      return ES_KFAIL(k, ES_EMODEL, "spatial axis %d: input %lld gives an output of %lld", i,
                      (long long)p->in[s], (long long)o);
    p->out[s] = o;
  }
  return 0;
}

/* oneDNN's int8 convolution (VNNI where the CPU has it) runs a
 * QLinearConv whose parameters are the model's constants: a 2-D
 * convolution, weights int8 with zero points 0 (symmetric, as quantizers
 * write them), scales and zero points known while planning. Anything else
 * keeps the exact loops below. */
static int qconv_dnnl_fits(const es_kinst *k, const qconv_params *p) {
  if (!p->qlinear || p->nsp != 2 || p->ws != 1 || p->empty)
    return 0;
  /* output_padding as a smaller end pad: oneDNN's int8 deconvolution
   * leaves an end pad below 0 unwritten (rows only the padding reaches,
   * which should hold the bias), and rows between taps when the stride
   * is longer than the kernel: those take the loops */
  for (int s = 1; s < 3 && p->transpose; s++)
    if (p->pe[s] - p->outpad[s] < 0 || p->str[s] > (p->ker[s] - 1) * p->dil[s] + 1)
      return 0;
  for (int i = 1; i < k->n_in; i++)
    if (i != 3 && k->in[i] && !k->in_static[i])
      return 0;
  if (!k->in_static[3])
    return 0;
  if (p->has_zw) {
    const int8_t *zw = k->in_static[5];
    for (size_t i = 0; i < k->in[5]->count; i++)
      if (zw[i] != 0)
        return 0;
  }
  return 1;
}

/* A transposed convolution whose kernel equals its stride (no pads,
 * dilation, output padding or groups), channels-last, with a constant
 * bias: each input pixel writes its own kh x kw block of the output, so it
 * is one int8 matmul [N*H, 1, W, C] x [1, kh, C, kw*M] -> [N*H, kh, W,
 * kw*M] whose source and destination are the NHWC tensors themselves (as
 * conv.c's float one). oneDNN's deconvolution is slow with few output
 * channels (det's last upsampling to its 1-channel map: 0.69 ms). */
static int qconvt_kxs_fits(const es_kinst *k, const qconv_params *p) {
  if (!p->transpose || p->nsp != 2 || !p->nhwc || p->g != 1 || (p->has_bias && !k->in_static[8]))
    return 0;
  for (int s = 1; s < 3; s++)
    if (p->ker[s] != p->str[s] || p->dil[s] != 1 || p->pb[s] || p->pe[s] || p->outpad[s])
      return 0;
  return 1;
}

typedef struct qconvt_kxs_job {
  const qconv_params *p;
  const int8_t *w;
  const int32_t *b;
} qconvt_kxs_job;

/* es_prep_fill_fn: the matmul's weights [kh][C][kw*M] from W [C][M][kh][kw],
 * then at kxs_bias_at the bias repeated kw times. */
static int qconvt_kxs_fill(void *user, void *dst, size_t bytes) {
  const qconvt_kxs_job *j = user;
  const qconv_params *p = j->p;
  int64_t kw = p->ker[2], m = p->m;
  (void)bytes;
  es__kxs_weights(dst, j->w, 1, p->c, m, p->ker[1], kw);
  if (j->b) {
    int32_t *bd = (int32_t *)(void *)((char *)dst + p->kxs_bias_at);
    for (int64_t b = 0; b < kw; b++)
      for (int64_t o = 0; o < m; o++)
        bd[b * m + o] = j->b[o];
  }
  return 0;
}

static int qconvt_kxs_setup(es_kinst *k, qconv_params *p, const es_dnnl_quant *q0,
                            const_dnnl_post_ops_t po) {
  int64_t kh = p->ker[1], kw = p->ker[2], nh = p->n * p->in[1], n = kw * p->m;
  dnnl_dims_t sd = {nh, 1, p->in[2], p->c}, wd = {1, kh, p->c, n}, dd = {nh, kh, p->in[2], n},
              bd = {1, 1, 1, n};
  dnnl_memory_desc_t smd, wmd, dmd, bmd;
  dnnl_status_t st = dnnl_memory_desc_init_by_tag(&smd, 4, sd, p->xs ? dnnl_s8 : dnnl_u8,
                                                  dnnl_abcd);
  if (st == dnnl_success)
    st = dnnl_memory_desc_init_by_tag(&wmd, 4, wd, dnnl_s8, dnnl_abcd);
  if (st == dnnl_success)
    st = dnnl_memory_desc_init_by_tag(&dmd, 4, dd,
                                      p->fout ? dnnl_f32 : p->ys ? dnnl_s8 : dnnl_u8, dnnl_abcd);
  if (st == dnnl_success)
    st = dnnl_memory_desc_init_by_tag(&bmd, 4, bd, dnnl_s32, dnnl_abcd);
  if (st != dnnl_success)
    return es__dnnl_fail(k, st, "describing the int8 matmul");
  /* the scales per column: channel o at every b * M + o */
  float *sc = q0->n_scales > 1 ? es__kinst_alloc(k, (size_t)n * sizeof *sc) : NULL;
  if (q0->n_scales > 1 && !sc)
    return ES_KFAIL(k, ES_ENOMEM, "out of memory for the scales");
  for (int64_t b = 0; sc && b < kw; b++)
    memcpy(sc + b * p->m, q0->scales, (size_t)p->m * sizeof *sc);
  es_dnnl_quant q = {sc ? sc : q0->scales, sc ? n : 1, q0->zp_src, q0->zp_dst, sc ? 8 : 0};
  dnnl_matmul_desc_t d;
  st = dnnl_matmul_desc_init(&d, &smd, &wmd, p->has_bias ? &bmd : NULL, &dmd);
  int rc = st != dnnl_success ? es__dnnl_fail(k, st, "describing the int8 matmul")
                              : es__dnnl_prim_create_q(k, &d, po, &q, &p->dnnl);
  if (rc < 0)
    return rc;
  char key[160];
  snprintf(key, sizeof key, "%s#%d:w:qkxs-matmul-abcd:%lldx%lldx%lldx%lld%s",
           es__op_name(k->node.op), k->node.id, (long long)kh, (long long)p->c, (long long)kw,
           (long long)p->m, p->has_bias ? "+b" : "");
  qconvt_kxs_job job = {p, k->in_static[3], p->has_bias ? k->in_static[8] : NULL};
  size_t wn = (size_t)(kh * p->c * n);
  p->kxs_bias_at = (wn + 63) / 64 * 64;
  p->kxs = 1;
  return es__kinst_prepared(k, key, p->kxs_bias_at + (p->has_bias ? (size_t)n * 4 : 0),
                            qconvt_kxs_fill, &job, sizeof job, &p->dnnl.weights);
}

static int qconv_dnnl_setup(es_kinst *k, qconv_params *p) {
  p->kxs = 0;
  int64_t g = p->g;
  dnnl_dims_t xd = {p->n, p->c, p->in[1], p->in[2]}, yd = {p->n, p->m, p->out[1], p->out[2]};
  dnnl_dims_t bd = {p->m}, wg = {g, p->m / g, p->c / g, p->ker[1], p->ker[2]};
  dnnl_dims_t w1 = {p->m, p->c, p->ker[1], p->ker[2]};
  dnnl_dims_t st = {p->str[1], p->str[2]}, dl = {p->dil[1] - 1, p->dil[2] - 1};
  dnnl_dims_t pl = {p->pb[1], p->pb[2]},
              pr = {p->pe[1] - p->outpad[1], p->pe[2] - p->outpad[2]};
  dnnl_data_type_t xt = p->xs ? dnnl_s8 : dnnl_u8,
                    yt = p->fout ? dnnl_f32 : p->ys ? dnnl_s8 : dnnl_u8;
  dnnl_format_tag_t act = p->nhwc ? dnnl_nhwc : dnnl_nchw;
  dnnl_memory_desc_t xmd, ymd, bmd, wany, wuser;
  const int64_t *wdims = g > 1 ? wg : w1;
  int wnd = g > 1 ? 5 : 4;
  dnnl_status_t stt = dnnl_memory_desc_init_by_tag(&xmd, 4, xd, xt, act);
  if (stt == dnnl_success)
    stt = dnnl_memory_desc_init_by_tag(&ymd, 4, yd, yt, act);
  if (stt == dnnl_success)
    stt = dnnl_memory_desc_init_by_tag(&bmd, 1, bd, dnnl_s32, dnnl_x);
  if (stt == dnnl_success)
    stt = dnnl_memory_desc_init_by_tag(&wuser, wnd, wdims, dnnl_s8,
                                       p->transpose ? (g > 1 ? dnnl_giohw : dnnl_iohw)
                                                    : (g > 1 ? dnnl_goihw : dnnl_oihw));
  if (stt == dnnl_success)
    stt = dnnl_memory_desc_init_by_tag(&wany, wnd, wdims, dnnl_s8, dnnl_format_tag_any);
  if (stt != dnnl_success)
    return es__dnnl_fail(k, stt, "describing the int8 tensors");
  const float *sx = k->in_static[1], *sw = k->in_static[4];
  float sy = p->fout ? 1.0f : *(const float *)k->in_static[6];
  int64_t ns = p->sw_per ? p->m : 1;
  if (!(p->scales = es__kinst_alloc(k, (size_t)ns * sizeof *p->scales)))
    return ES_KFAIL(k, ES_ENOMEM, "out of memory for the scales");
  for (int64_t c = 0; c < ns; c++)
    p->scales[c] = p->fout ? sx[0] * sw[c] : sx[0] * sw[c] / sy; /* as the loops compute it */
  es_dnnl_quant q = {p->scales, ns, p->has_zx ? q_at8(k->in_static[2], p->xs, 0) : 0,
                     p->fout ? 0 : q_at8(k->in_static[7], p->ys, 0), 0};
  dnnl_post_ops_t po = NULL;
  if (p->relu) {
    stt = dnnl_post_ops_create(&po);
    if (stt == dnnl_success)
      stt = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, 0.0f, 0.0f);
    if (stt != dnnl_success) {
      if (po)
        dnnl_post_ops_destroy(po);
      return es__dnnl_fail(k, stt, "describing the fused Relu");
    }
  }
  if (qconvt_kxs_fits(k, p)) {
    int rc = qconvt_kxs_setup(k, p, &q, po);
    if (po)
      dnnl_post_ops_destroy(po);
    return rc;
  }
  dnnl_convolution_desc_t d;
  dnnl_deconvolution_desc_t dd;
  if (p->transpose)
    stt = dnnl_dilated_deconvolution_forward_desc_init(
        &dd, dnnl_forward_inference, dnnl_deconvolution_direct, &xmd, &wany,
        p->has_bias ? &bmd : NULL, &ymd, st, dl, pl, pr);
  else
    stt = dnnl_dilated_convolution_forward_desc_init(&d, dnnl_forward_inference,
                                                     dnnl_convolution_direct, &xmd, &wany,
                                                     p->has_bias ? &bmd : NULL, &ymd, st, dl, pl,
                                                     pr);
  int rc = stt != dnnl_success
               ? es__dnnl_fail(k, stt, "describing the int8 convolution")
               : es__dnnl_prim_create_q(k, p->transpose ? (const_dnnl_op_desc_t)&dd
                                                        : (const_dnnl_op_desc_t)&d,
                                        po, &q, &p->dnnl);
  if (po)
    dnnl_post_ops_destroy(po);
  if (rc == 0)
    rc = es__dnnl_weights_prepare(k, &p->dnnl, &wuser, k->in_static[3]);
  return rc;
}

static int qconv_infer(es_kinst *k) {
  qconv_params *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  k->params = p;
  p->transpose = k->node.op == ES_OP_QLinearConvTranspose;
  p->qlinear = k->node.op == ES_OP_QLinearConv || p->transpose;
  const int *ix = p->qlinear ? qlc_idx : ci_idx;
  int rc;
  if (p->qlinear) {
    static const char *names[8] = {"x", "x_scale", "x_zero_point", "w",
                                   "w_scale", "w_zero_point", "y_scale", "y_zero_point"};
    if ((rc = q_io(k, 8, 9)) < 0 || (rc = q_float_out(k, &p->fout)) < 0)
      return rc;
    for (int i = 0; i < (p->fout ? 6 : 8); i++)
      if ((rc = q_need(k, i, names[i])) < 0)
        return rc;
  } else if ((rc = q_io(k, 2, 4)) < 0 || (rc = q_need(k, 0, "x")) < 0 ||
             (rc = q_need(k, 1, "w")) < 0) {
    return rc;
  }
  const es_tdesc *x = k->in[ix[QC_X]], *w = k->in[ix[QC_W]];
  const es_tdesc *zx = k->n_in > ix[QC_ZX] ? k->in[ix[QC_ZX]] : NULL;
  const es_tdesc *zw = k->n_in > ix[QC_ZW] ? k->in[ix[QC_ZW]] : NULL;
  if ((rc = q_dtype_8bit(k, x, "x")) < 0 || (rc = q_dtype_8bit(k, w, "w")) < 0)
    return rc;
  if (zx && zx->dtype != x->dtype)
    return ES_KFAIL(k, ES_EMODEL, "x_zero_point is %s, x %s: they must be the same type",
                    es_dtype_name(zx->dtype), es_dtype_name(x->dtype));
  if (zw && zw->dtype != w->dtype)
    return ES_KFAIL(k, ES_EMODEL, "w_zero_point is %s, w %s: they must be the same type",
                    es_dtype_name(zw->dtype), es_dtype_name(w->dtype));
  p->xs = x->dtype == ES_DTYPE_INT8;
  p->ws = w->dtype == ES_DTYPE_INT8;
  if ((rc = p->transpose ? qconvt_geometry(k, p, x, w) : qconv_geometry(k, p, x, w)) < 0)
    return rc;
  if (zx && (rc = q_single(k, zx, "x_zero_point")) < 0)
    return rc;
  if (zw && (rc = q_vec(k, zw, p->m, "w_zero_point", "one per output channel", &p->zw_per)) < 0)
    return rc;
  p->has_zx = zx != NULL;
  p->has_zw = zw != NULL;
  es_dtype yt = ES_DTYPE_INT32;
  if (p->qlinear) {
    const es_tdesc *sx = k->in[1], *sw = k->in[4], *sy = k->in[6], *zy = k->in[7];
    const es_tdesc *bias = k->n_in > 8 ? k->in[8] : NULL;
    if ((rc = q_dtype_float(k, sx, "x_scale")) < 0 || (rc = q_dtype_float(k, sw, "w_scale")) < 0 ||
        (rc = q_single(k, sx, "x_scale")) < 0 ||
        (rc = q_vec(k, sw, p->m, "w_scale", "one per output channel", &p->sw_per)) < 0)
      return rc;
    if (!p->fout && ((rc = q_dtype_float(k, sy, "y_scale")) < 0 ||
                     (rc = q_dtype_8bit(k, zy, "y_zero_point")) < 0 ||
                     (rc = q_single(k, sy, "y_scale")) < 0 ||
                     (rc = q_single(k, zy, "y_zero_point")) < 0))
      return rc;
    if (bias && (bias->dtype != ES_DTYPE_INT32 || bias->rank != 1 || bias->dims[0] != p->m))
      return ES_KFAIL(k, ES_EMODEL, "B must be int32 and 1-D with %lld values (the output "
                      "channels); it is %s with rank %d", (long long)p->m,
                      es_dtype_name(bias->dtype), bias->rank);
    p->has_bias = bias != NULL;
    yt = q_y_type(p->fout, zy, &p->ys, &p->lo, &p->hi);
  }
  int64_t od[5] = {p->n, p->m};
  for (int i = 0; i < p->nsp; i++)
    od[2 + i] = p->out[3 - p->nsp + i];
  if ((rc = q_out_set(k, 0, yt, 2 + p->nsp, od)) < 0)
    return rc;
  /* With a nonzero output, n, m and the output's spatial dims are at least
   * 1, so ovol is below the output's count; x's volume is 0 or below its
   * count once it has a channel, the kernel's below w's count. */
  p->empty = k->out[0]->count == 0;
  p->ovol = q_prod(p->out, 0, 3);
  p->ivol = q_prod(p->in, 0, 3);
  p->kvol = q_prod(p->ker, 0, 3);
  k->inplace = -1;
  if (p->empty)
    return 0;
  k->flops = p->transpose
                 ? 2 * (uint64_t)k->in[0]->count * (uint64_t)(p->m / p->g) * (uint64_t)p->kvol
                 : 2 * (uint64_t)k->out[0]->count * (uint64_t)(p->c / p->g) * (uint64_t)p->kvol;
  if (p->qlinear && (rc = q_activation(k, &p->relu)) < 0)
    return rc;
  /* oneDNN runs channels-last inside a model's plan (the planner converts
   * a plain x for it), or when x already is; the loops read plain tensors */
  p->use_dnnl = !es__kernels_reference() && qconv_dnnl_fits(k, p);
  p->nhwc = p->use_dnnl && (k->in[0]->layout == ES_LAYOUT_NHWC || k->prep);
  if (p->use_dnnl &&
      (rc = es__dnnl_setup_done(k, &p->dnnl, qconv_dnnl_setup(k, p), &p->use_dnnl)) < 0)
    return rc;
  if (!p->use_dnnl) {
    p->nhwc = 0;
    k->scratch_bytes = p->qlinear ? (size_t)p->ovol * sizeof(uint32_t) : 0;
  }
  k->want_plain = k->want_nhwc = 0;
  if ((k->in[0]->layout == ES_LAYOUT_NHWC) != p->nhwc) {
    *(p->nhwc ? &k->want_nhwc : &k->want_plain) |= 1u;
    es__dnnl_prim_destroy(&p->dnnl);
    return ES_KRELAYOUT;
  }
  if (p->nhwc)
    k->out[0]->layout = ES_LAYOUT_NHWC;
  return 0;
}

static void qconv_release(es_kinst *k) {
  qconv_params *p = k->params;
  if (p)
    es__dnnl_prim_destroy(&p->dnnl);
}

/* The output positions o in [0, out) whose input o * st - pb + tap lies in
 * [0, in): [*lo, *hi). */
static void qconv_range(int64_t out, int64_t in, int64_t st, int64_t pb, int64_t tap, int64_t *lo,
                        int64_t *hi) {
  int64_t first = pb - tap; /* o * st >= first */
  int64_t l = first <= 0 ? 0 : (first + st - 1) / st;
  int64_t last = in - 1 + pb - tap; /* o * st <= last */
  int64_t h = last < 0 ? 0 : last / st + 1;
  *lo = l < out ? l : out;
  *hi = h < out ? h : out;
  if (*hi < *lo)
    *hi = *lo;
}

/* One output channel's plane of int32 sums: for each input channel of the
 * group and kernel tap, the rows it reaches. */
static void qconv_plane(const qconv_params *p, const void *x, const void *w, int32_t zx,
                        int32_t zw, int64_t nb, int64_t oc, uint32_t *acc) {
  int64_t cg = p->c / p->g, mg = p->m / p->g, grp = oc / mg;
  int64_t ivol = p->ivol, ovol = p->ovol, kvol = p->kvol;
  memset(acc, 0, (size_t)ovol * sizeof *acc);
  for (int64_t ic = 0; ic < cg; ic++) {
    int64_t xbase = (nb * p->c + grp * cg + ic) * ivol;
    int64_t wbase = (oc * cg + ic) * kvol;
    for (int64_t kd = 0; kd < p->ker[0]; kd++)
      for (int64_t kh = 0; kh < p->ker[1]; kh++)
        for (int64_t kw = 0; kw < p->ker[2]; kw++) {
          int32_t wv = q_at8(w, p->ws, wbase + (kd * p->ker[1] + kh) * p->ker[2] + kw) - zw;
          if (wv == 0)
            continue;
          int64_t d0, d1, h0, h1, w0, w1;
          qconv_range(p->out[0], p->in[0], p->str[0], p->pb[0], kd * p->dil[0], &d0, &d1);
          qconv_range(p->out[1], p->in[1], p->str[1], p->pb[1], kh * p->dil[1], &h0, &h1);
          qconv_range(p->out[2], p->in[2], p->str[2], p->pb[2], kw * p->dil[2], &w0, &w1);
          for (int64_t od = d0; od < d1; od++) {
            int64_t id = od * p->str[0] - p->pb[0] + kd * p->dil[0];
            for (int64_t oh = h0; oh < h1; oh++) {
              int64_t ih = oh * p->str[1] - p->pb[1] + kh * p->dil[1];
              uint32_t *row = acc + (od * p->out[1] + oh) * p->out[2];
              int64_t xrow = xbase + (id * p->in[1] + ih) * p->in[2] - p->pb[2] + kw * p->dil[2];
              for (int64_t ow = w0; ow < w1; ow++)
                row[ow] += (uint32_t)(wv * (q_at8(x, p->xs, xrow + ow * p->str[2]) - zx));
            }
          }
        }
  }
}

/* The transposed convolution's plane: every input element of the group's
 * channels scatters into the outputs its kernel taps reach (o = i * st -
 * pb + tap * dil). */
static void qconvt_plane(const qconv_params *p, const void *x, const void *w, int32_t zx,
                         int32_t zw, int64_t nb, int64_t oc, uint32_t *acc) {
  int64_t cg = p->c / p->g, mg = p->m / p->g, grp = oc / mg, ocg = oc % mg;
  memset(acc, 0, (size_t)p->ovol * sizeof *acc);
  for (int64_t ic = 0; ic < cg; ic++) {
    int64_t xbase = (nb * p->c + grp * cg + ic) * p->ivol;
    int64_t wbase = ((grp * cg + ic) * mg + ocg) * p->kvol;
    for (int64_t kd = 0; kd < p->ker[0]; kd++)
      for (int64_t kh = 0; kh < p->ker[1]; kh++)
        for (int64_t kw = 0; kw < p->ker[2]; kw++) {
          int32_t wv = q_at8(w, p->ws, wbase + (kd * p->ker[1] + kh) * p->ker[2] + kw) - zw;
          if (wv == 0)
            continue;
          for (int64_t id = 0; id < p->in[0]; id++) {
            int64_t od = id * p->str[0] - p->pb[0] + kd * p->dil[0];
            if (od < 0 || od >= p->out[0])
              continue;
            for (int64_t ih = 0; ih < p->in[1]; ih++) {
              int64_t oh = ih * p->str[1] - p->pb[1] + kh * p->dil[1];
              if (oh < 0 || oh >= p->out[1])
                continue;
              uint32_t *row = acc + (od * p->out[1] + oh) * p->out[2];
              int64_t xrow = xbase + (id * p->in[1] + ih) * p->in[2];
              for (int64_t iw = 0; iw < p->in[2]; iw++) {
                int64_t ow = iw * p->str[2] - p->pb[2] + kw * p->dil[2];
                if (ow >= 0 && ow < p->out[2])
                  row[ow] += (uint32_t)(wv * (q_at8(x, p->xs, xrow + iw) - zx));
              }
            }
          }
        }
  }
}

static int qconv_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  const qconv_params *p = k->params;
  const int *ix = p->qlinear ? qlc_idx : ci_idx;
  const void *x = in[ix[QC_X]], *w = in[ix[QC_W]];
  if (p->empty)
    return 0;
  if (p->use_dnnl && p->kxs)
    return es__dnnl_prim_run(k, &p->dnnl, x, p->dnnl.weights,
                             p->has_bias ? (const char *)p->dnnl.weights + p->kxs_bias_at : NULL,
                             out[0], NULL, scratch);
  if (p->use_dnnl)
    return es__dnnl_prim_run(k, &p->dnnl, x, p->dnnl.weights ? p->dnnl.weights : w,
                             p->has_bias ? in[8] : NULL, out[0], NULL, scratch);
  int32_t zx = p->has_zx ? q_at8(in[ix[QC_ZX]], p->xs, 0) : 0;
  int64_t ovol = p->ovol;
  for (int64_t nb = 0; nb < p->n; nb++)
    for (int64_t oc = 0; oc < p->m; oc++) {
      int32_t zw = p->has_zw ? q_at8(in[ix[QC_ZW]], p->ws, p->zw_per ? oc : 0) : 0;
      int64_t obase = (nb * p->m + oc) * ovol;
      if (!p->qlinear) {
        qconv_plane(p, x, w, zx, zw, nb, oc, (uint32_t *)out[0] + obase);
        continue;
      }
      uint32_t *acc = scratch;
      if (p->transpose)
        qconvt_plane(p, x, w, zx, zw, nb, oc, acc);
      else
        qconv_plane(p, x, w, zx, zw, nb, oc, acc);
      const float *sx = in[1], *sw = in[4];
      uint32_t bias = p->has_bias ? (uint32_t)((const int32_t *)in[8])[oc] : 0;
      if (p->fout) { /* the sum scaled back to float */
        float mult = sx[0] * sw[p->sw_per ? oc : 0], *y = (float *)out[0] + obase;
        for (int64_t e = 0; e < ovol; e++) {
          float v = (float)(int32_t)(acc[e] + bias) * mult;
          y[e] = p->relu && v < 0 ? 0 : v;
        }
        continue;
      }
      float sy = *(const float *)in[6];
      int32_t zy = q_at8(in[7], p->ys, 0);
      float mult = sx[0] * sw[p->sw_per ? oc : 0] / sy;
      for (int64_t e = 0; e < ovol; e++) {
        float v = (float)(int32_t)(acc[e] + bias) * mult;
        q_store8(out[0], p->ys, obase + e, q_round_sat(p->relu && v < 0 ? 0 : v, zy, p->lo, p->hi));
      }
    }
  return 0;
}

/* ==========================================================================
 * QLookup (internal): y = table[x] for 8-bit x and y
 * ======================================================================== */

/* What a QDQ model's DequantizeLinear -> elementwise float ops ->
 * QuantizeLinear becomes at load (engine/fuse_qdq.c): 256 possible inputs,
 * so the float chain is evaluated once per value and the run is one table
 * read per element. Input 1 is the 256-entry table (constant), indexed by
 * x's byte (an int8 value v at (uint8_t)v). Any layout: y keeps x's. */
typedef struct qlookup_params {
  size_t count;
} qlookup_params;

static int qlookup_infer(es_kinst *k) {
  qlookup_params *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  k->params = p;
  int rc;
  if ((rc = q_io(k, 2, 2)) < 0 || (rc = q_need(k, 0, "x")) < 0 || (rc = q_need(k, 1, "table")) < 0)
    return rc;
  const es_tdesc *x = k->in[0], *t = k->in[1];
  if ((rc = q_dtype_8bit(k, x, "x")) < 0 || (rc = q_dtype_8bit(k, t, "table")) < 0)
    return rc;
  if (t->count != 256)
    return ES_KFAIL(k, ES_EMODEL, "the table has %zu entries, expected 256", t->count);
  if ((rc = q_out_set(k, 0, t->dtype, x->rank, x->dims)) < 0)
    return rc;
  k->out[0]->layout = x->layout;
  p->count = x->count;
  k->inplace = 0;
  return 0;
}

static void qlookup_bytes(const uint8_t *x, const uint8_t *t, uint8_t *y, size_t n) {
  for (size_t i = 0; i < n; i++)
    y[i] = t[x[i]];
}

#if defined(__x86_64__)
/* rows runs of w bytes, x's a stride xs apart, y's ys apart, each looked
 * up in t. With AVX-512 VBMI a byte permute reads a 128-byte half of the
 * table per instruction: two of them and a blend on the index's top bit
 * look up 64 bytes at once (a compiler cannot vectorise a gather of
 * bytes); the table is loaded once, and short runs (a channels-last
 * join's channels per pixel) go by masked loads and stores. */
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) static void
qlookup_rows_vbmi(const uint8_t *x, size_t xs, const uint8_t *t, uint8_t *y, size_t ys, size_t w,
                  size_t rows) {
  const __m512i t0 = _mm512_loadu_si512(t), t1 = _mm512_loadu_si512(t + 64);
  const __m512i t2 = _mm512_loadu_si512(t + 128), t3 = _mm512_loadu_si512(t + 192);
  for (size_t r = 0; r < rows; r++, x += xs, y += ys) {
    size_t i = 0;
    for (; i + 64 <= w; i += 64) {
      __m512i v = _mm512_loadu_si512(x + i);
      __m512i lo = _mm512_permutex2var_epi8(t0, v, t1), hi = _mm512_permutex2var_epi8(t2, v, t3);
      _mm512_storeu_si512(y + i, _mm512_mask_blend_epi8(_mm512_movepi8_mask(v), lo, hi));
    }
    if (i < w) {
      __mmask64 m = ((__mmask64)1 << (w - i)) - 1;
      __m512i v = _mm512_maskz_loadu_epi8(m, x + i);
      __m512i lo = _mm512_permutex2var_epi8(t0, v, t1), hi = _mm512_permutex2var_epi8(t2, v, t3);
      _mm512_mask_storeu_epi8(y + i, m, _mm512_mask_blend_epi8(_mm512_movepi8_mask(v), lo, hi));
    }
  }
}
#endif

/* y = t[x] on rows runs of w bytes, x's xs apart, y's ys apart: VBMI
 * where the CPU has it. */
static void q_lut8_rows(const uint8_t *x, size_t xs, const uint8_t *t, uint8_t *y, size_t ys,
                        size_t w, size_t rows) {
#if defined(__x86_64__)
  if (q_cpu(Q_CPU_VBMI)) {
    qlookup_rows_vbmi(x, xs, t, y, ys, w, rows);
    return;
  }
#endif
  for (size_t r = 0; r < rows; r++)
    qlookup_bytes(x + r * xs, t, y + r * ys, w);
}

static int qlookup_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  (void)scratch;
  const qlookup_params *p = k->params;
  q_lut8_rows(in[0], p->count, in[1], out[0], p->count, p->count, 1);
  return 0;
}

/* ==========================================================================
 * com.microsoft QLinear operators (ONNX Runtime's QOperator format)
 * ======================================================================== */

/* ONNX Runtime's quantizer writes, in its QOperator format, the float
 * operator between a dequantization and a quantization as one node of the
 * com.microsoft domain. Scales and zero points are per tensor (zero points
 * may be omitted: 0), every 8-bit tensor of a node has one type, and the
 * arithmetic is done in float32 as ONNX Runtime's CPU kernels do it, then
 * rounded half to even and saturated as quantize does:
 *   QLinearAdd  c = rint((a - za) (sa / sc) + (b - zb) (sb / sc)) + zc
 *   QLinearMul  c = rint((a - za) (b - zb) (sa sb / sc)) + zc
 *     (numpy broadcasting)
 *   QLinearSigmoid  y = quantize(sigmoid(dequantize(x))), as a table of
 *     the 256 possible bytes made per run
 *   QLinearGlobalAveragePool  y = rint((sum x - n zx) (sx / (sy n))) + zy
 *     over the n spatial positions of each channel (channels_last 0:
 *     [N, C, ...] -> [N, C, 1, ...]; 1: [N, ..., C] -> [N, 1, ..., C])
 *   QLinearConcat  each input copied when its scale and zero point are
 *     Y's, else y = quantize(dequantize(x)), along axis
 * Where a float product rounds the other way, ONNX Runtime may differ by
 * one 8-bit step (the tests allow that, nothing more). */

/* Input i, a per-tensor scale (float32) or zero point (typed like want),
 * present or optional. */
static int ms_param(es_kinst *k, int i, int is_zp, es_dtype want, const char *name) {
  const es_tdesc *t = k->n_in > i ? k->in[i] : NULL;
  if (!t)
    return is_zp ? 0 : ES_KFAIL(k, ES_EMODEL, "%s is missing", name);
  int rc = is_zp ? 0 : q_dtype_float(k, t, name);
  if (rc == 0 && is_zp && t->dtype != want)
    return ES_KFAIL(k, ES_EMODEL, "%s is %s, expected %s", name, es_dtype_name(t->dtype),
                    es_dtype_name(want));
  return rc < 0 ? rc : q_single(k, t, name);
}

/* A unary operator's inputs: an 8-bit X, its scale and zero point, then
 * Y's (per tensor, zero points optional), named as the operator names
 * them. */
static int ms_unary_inputs(es_kinst *k, const char *const names[5]) {
  int rc = q_io(k, 4, 5);
  if (rc == 0)
    rc = q_need(k, 0, names[0]);
  if (rc == 0)
    rc = q_dtype_8bit(k, k->in[0], names[0]);
  for (int i = 1; rc == 0 && i < 5; i++)
    rc = ms_param(k, i, i == 2 || i == 4, k->in[0]->dtype, names[i]);
  return rc;
}

static float ms_scale(const void *const *in, int i) { return *(const float *)in[i]; }
static int32_t ms_zp(const void *const *in, int i, int is_signed) {
  return in[i] ? q_at8(in[i], is_signed, 0) : 0;
}

/* QLinearAdd, QLinearMul: a, sa, za, b, sb, zb, sc, zc. */
typedef struct msbin_params {
  int mul, is_signed;
  int flat;                    /* A and B of one shape and layout: one run over the bytes */
  int chan;                    /* 1 (2): A (B) an NHWC map, the other one value per channel
                                  ([1, C, 1, 1]: a squeeze-excitation's scale) */
  int64_t pixels, c;           /* chan: the map's pixels and channels */
  int64_t rep;                 /* chan: pixels the vector is repeated over in scratch */
  int32_t lo, hi;
  int rank;
  int64_t dims[ES_MAX_RANK];
  int64_t st[ES_MAX_RANK * 2]; /* per dim: a's and b's element strides (0: broadcast) */
  size_t count;
} msbin_params;

static int msbin_infer(es_kinst *k) {
  msbin_params *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  k->params = p;
  p->mul = k->node.op == ES_OP_QLinearMul;
  int rc = q_io(k, 7, 8);
  if (rc == 0)
    rc = q_need(k, 0, "A");
  if (rc == 0)
    rc = q_need(k, 3, "B");
  if (rc < 0)
    return rc;
  const es_tdesc *a = k->in[0], *b = k->in[3];
  if ((rc = q_dtype_8bit(k, a, "A")) < 0)
    return rc;
  if (b->dtype != a->dtype)
    return ES_KFAIL(k, ES_EMODEL, "A is %s, B %s: they must be the same type",
                    es_dtype_name(a->dtype), es_dtype_name(b->dtype));
  if ((rc = ms_param(k, 1, 0, a->dtype, "A_scale")) < 0 ||
      (rc = ms_param(k, 2, 1, a->dtype, "A_zero_point")) < 0 ||
      (rc = ms_param(k, 4, 0, a->dtype, "B_scale")) < 0 ||
      (rc = ms_param(k, 5, 1, a->dtype, "B_zero_point")) < 0 ||
      (rc = ms_param(k, 6, 0, a->dtype, "C_scale")) < 0 ||
      (rc = ms_param(k, 7, 1, a->dtype, "C_zero_point")) < 0)
    return rc;
  p->is_signed = a->dtype == ES_DTYPE_INT8;
  q_range(a->dtype, &p->lo, &p->hi);
  if ((rc = es__broadcast_shape(k, a, b, &p->rank, p->dims)) < 0 ||
      (rc = q_out_set(k, 0, a->dtype, p->rank, p->dims)) < 0)
    return rc;
  p->count = k->out[0]->count;
  k->inplace = -1;
  /* Elementwise on equal shapes reads the bytes in any layout, as they
   * are (a QDQ model's residual between channels-last convolutions);
   * broadcasting walks plain tensors. */
  p->flat = a->layout == b->layout && es__tdesc_same_shape(a, b);
  k->want_plain = 0;
  for (int t = 0; t < 2 && !p->flat && !p->chan; t++) {
    const es_tdesc *m = t ? b : a, *v = t ? a : b;
    if (m->layout != ES_LAYOUT_NHWC || m->rank != 4 || v->rank < 3 || v->rank > 4 ||
        v->count != (size_t)m->dims[1] || m->dims[0] != 1 || v->dims[v->rank - 3] != m->dims[1])
      continue;
    p->chan = 1 + t; /* v: [1, C, 1, 1] or [C, 1, 1], its bytes C in a row in any layout */
    p->c = m->dims[1];
    p->pixels = m->dims[2] * m->dims[3];
    p->rep = p->c >= 4096 ? 1 : 4096 / p->c;
    k->scratch_bytes = (size_t)(p->rep * p->c);
    k->out[0]->layout = ES_LAYOUT_NHWC;
    return 0;
  }
  if (!p->flat) {
    k->want_plain = (a->layout != ES_LAYOUT_PLAIN ? 1u : 0u) | (b->layout != ES_LAYOUT_PLAIN ? 8u : 0u);
    if (k->want_plain)
      return ES_KRELAYOUT;
  }
  k->out[0]->layout = p->flat ? a->layout : ES_LAYOUT_PLAIN;
  if (p->flat)
    return 0;
  for (int t = 0; t < 2; t++) {
    const es_tdesc *x = t ? b : a;
    int64_t s = 1;
    for (int d = p->rank - 1; d >= 0; d--) {
      int xd = d - (p->rank - x->rank);
      int64_t e = xd >= 0 ? x->dims[xd] : 1;
      p->st[d * 2 + t] = e == 1 ? 0 : s;
      s *= e;
    }
  }
  return 0;
}

/* One element's requantized value (av, bv: a - za, b - zb). */
static inline int32_t msbin_one(const msbin_params *p, int32_t av, int32_t bv, float ra, float rb,
                                float rab, int32_t zc) {
  float v = p->mul ? (float)(av * bv) * rab : (float)av * ra + (float)bv * rb;
  return q_round_sat(v, zc, p->lo, p->hi);
}

/* The flat case: both operands and the output element by element. */
ES_KCLONES static void msbin_flat(const msbin_params *p, const uint8_t *restrict a,
                                  const uint8_t *restrict b, uint8_t *restrict c, float ra,
                                  float rb, float rab, int32_t za, int32_t zb, int32_t zc) {
  int sg = p->is_signed;
  for (size_t i = 0; i < p->count; i++)
    q_store8(c, sg, (int64_t)i,
             msbin_one(p, q_at8(a, sg, (int64_t)i) - za, q_at8(b, sg, (int64_t)i) - zb, ra, rb,
                       rab, zc));
}

/* The flat case again, written so the compiler vectorises it: rintf as
 * adding and taking away 1.5 * 2^23 (the same even rounding for |v| <
 * 2^22, which the callers' bounds on the ratios give for 8-bit inputs),
 * then the clamp. The numbers are msbin_one's; mul and sg are constants
 * at each call, so each of the four loops is specialised. */
static inline void msbin_flat_vec(int mul, int sg, size_t n, const uint8_t *restrict a,
                                  const uint8_t *restrict b, uint8_t *restrict c, float ra,
                                  float rb, float rab, int32_t za, int32_t zb, int32_t zc,
                                  int32_t lo, int32_t hi) {
  const float flo = (float)lo, fhi = (float)hi, fz = (float)zc;
  for (size_t i = 0; i < n; i++) {
    int32_t av = (sg ? (int32_t)(int8_t)a[i] : (int32_t)a[i]) - za;
    int32_t bv = (sg ? (int32_t)(int8_t)b[i] : (int32_t)b[i]) - zb;
    float v = mul ? (float)(av * bv) * rab : (float)av * ra + (float)bv * rb;
    float r = ((v + Q_MAGIC) - Q_MAGIC) + fz;
    r = r < flo ? flo : r;
    r = r > fhi ? fhi : r;
    c[i] = (uint8_t)(int32_t)r;
  }
}

/* n elements, the four specialisations */
static inline void msbin_run_vec(const msbin_params *p, size_t n, const uint8_t *restrict a,
                                 const uint8_t *restrict b, uint8_t *restrict c, float ra,
                                 float rb, float rab, int32_t za, int32_t zb, int32_t zc) {
  if (p->mul && p->is_signed)
    msbin_flat_vec(1, 1, n, a, b, c, ra, rb, rab, za, zb, zc, p->lo, p->hi);
  else if (p->mul)
    msbin_flat_vec(1, 0, n, a, b, c, ra, rb, rab, za, zb, zc, p->lo, p->hi);
  else if (p->is_signed)
    msbin_flat_vec(0, 1, n, a, b, c, ra, rb, rab, za, zb, zc, p->lo, p->hi);
  else
    msbin_flat_vec(0, 0, n, a, b, c, ra, rb, rab, za, zb, zc, p->lo, p->hi);
}

/* The flat and channel cases over a whole tensor (chan: per pixel, the
 * map's C bytes with the vector's; the roles kept, a is A and b is B). */
static inline void msbin_all(const msbin_params *p, const uint8_t *restrict a,
                             const uint8_t *restrict b, uint8_t *restrict c, float ra, float rb,
                             float rab, int32_t za, int32_t zb, int32_t zc, uint8_t *row) {
  if (!p->chan) {
    msbin_run_vec(p, p->count, a, b, c, ra, rb, rab, za, zb, zc);
    return;
  }
  /* the vector repeated over rep pixels (scratch), then runs of rep pixels */
  int amap = p->chan == 1;
  const uint8_t *v = amap ? b : a;
  for (int64_t r = 0; r < p->rep; r++)
    memcpy(row + r * p->c, v, (size_t)p->c);
  for (int64_t px = 0; px < p->pixels; px += p->rep) {
    int64_t np = p->pixels - px < p->rep ? p->pixels - px : p->rep, off = px * p->c;
    msbin_run_vec(p, (size_t)(np * p->c), amap ? a + off : row, amap ? row : b + off, c + off, ra,
                  rb, rab, za, zb, zc);
  }
}

ES_KCLONES static void msbin_fast(const msbin_params *p, const uint8_t *restrict a,
                                  const uint8_t *restrict b, uint8_t *restrict c, float ra,
                                  float rb, float rab, int32_t za, int32_t zb, int32_t zc,
                                  uint8_t *row) {
  msbin_all(p, a, b, c, ra, rb, rab, za, zb, zc, row);
}

#if defined(__x86_64__)
/* GCC vectorises the clones above 256 bits wide; 512 bits does these
 * byte-to-float loops in about half the time (det's pyramid sums). */
Q_AVX512 static void msbin_fast512(const msbin_params *p, const uint8_t *restrict a,
                                   const uint8_t *restrict b, uint8_t *restrict c, float ra,
                                   float rb, float rab, int32_t za, int32_t zb, int32_t zc,
                                   uint8_t *row) {
  msbin_all(p, a, b, c, ra, rb, rab, za, zb, zc, row);
}
#endif

/* The channel case element by element (ratios outside the fast bounds). */
static void msbin_chan(const msbin_params *p, const uint8_t *a, const uint8_t *b, uint8_t *c,
                       float ra, float rb, float rab, int32_t za, int32_t zb, int32_t zc) {
  int sg = p->is_signed, amap = p->chan == 1;
  for (int64_t px = 0; px < p->pixels; px++)
    for (int64_t ch = 0; ch < p->c; ch++) {
      int64_t e = px * p->c + ch, ia = amap ? e : ch, ib = amap ? ch : e;
      q_store8(c, sg, e, msbin_one(p, q_at8(a, sg, ia) - za, q_at8(b, sg, ib) - zb, ra, rb, rab, zc));
    }
}

static int msbin_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  const msbin_params *p = k->params;
  if (p->count == 0)
    return 0;
  int sg = p->is_signed;
  float sa = ms_scale(in, 1), sb = ms_scale(in, 4), sc = ms_scale(in, 6);
  int32_t za = ms_zp(in, 2, sg), zb = ms_zp(in, 5, sg), zc = ms_zp(in, 7, sg);
  float ra = sa / sc, rb = sb / sc, rab = sa * sb / sc;
  /* |v| < 2^22 for every input byte: the fast rounding is exact */
  int fast = p->mul ? fabsf(rab) < 64.0f : fabsf(ra) + fabsf(rb) < 16384.0f;
  if ((p->chan || p->flat) && fast) {
#if defined(__x86_64__)
    if (q_cpu(Q_CPU_512)) {
      msbin_fast512(p, in[0], in[3], out[0], ra, rb, rab, za, zb, zc, scratch);
      return 0;
    }
#endif
    msbin_fast(p, in[0], in[3], out[0], ra, rb, rab, za, zb, zc, scratch);
    return 0;
  }
  if (p->chan) {
    msbin_chan(p, in[0], in[3], out[0], ra, rb, rab, za, zb, zc);
    return 0;
  }
  if (p->flat) {
    msbin_flat(p, in[0], in[3], out[0], ra, rb, rab, za, zb, zc);
    return 0;
  }
  /* the last dim by hand, the others walked */
  int last = p->rank - 1;
  int64_t n = p->rank ? p->dims[last] : 1;
  int64_t sa1 = p->rank ? p->st[last * 2] : 0, sb1 = p->rank ? p->st[last * 2 + 1] : 0;
  int64_t wd[ES_MAX_RANK], idx[ES_MAX_RANK] = {0}, off[2] = {0, 0};
  for (int d = 0; d < p->rank; d++)
    wd[d] = d == last ? 1 : p->dims[d];
  size_t o = 0;
  do {
    for (int64_t i = 0; i < n; i++, o++) {
      int32_t av = q_at8(in[0], sg, off[0] + i * sa1) - za;
      int32_t bv = q_at8(in[3], sg, off[1] + i * sb1) - zb;
      q_store8(out[0], sg, (int64_t)o, msbin_one(p, av, bv, ra, rb, rab, zc));
    }
  } while (es__walk_step(p->rank, wd, idx, 2, off, p->st) >= 0);
  return 0;
}

/* QLinearSigmoid: x, sx, zx, sy, zy. */
typedef struct mssig_params {
  int is_signed;
  int32_t lo, hi;
  size_t count;
} mssig_params;

static int mssig_infer(es_kinst *k) {
  mssig_params *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  k->params = p;
  static const char *const names[5] = {"X", "X_scale", "X_zero_point", "Y_scale",
                                      "Y_zero_point"};
  int rc = ms_unary_inputs(k, names);
  if (rc < 0)
    return rc;
  const es_tdesc *x = k->in[0];
  if ((rc = q_out_set(k, 0, x->dtype, x->rank, x->dims)) < 0)
    return rc;
  p->is_signed = x->dtype == ES_DTYPE_INT8;
  q_range(x->dtype, &p->lo, &p->hi);
  p->count = x->count;
  k->scratch_bytes = 256;
  k->inplace = 0;
  return 0;
}

static int mssig_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  const mssig_params *p = k->params;
  int sg = p->is_signed;
  float sx = ms_scale(in, 1), sy = ms_scale(in, 3);
  int32_t zx = ms_zp(in, 2, sg), zy = ms_zp(in, 4, sg);
  uint8_t *table = scratch;
  for (int b = 0; b < 256; b++) {
    int32_t v = sg ? (int8_t)(uint8_t)b : b;
    float f = (float)(v - zx) * sx;
    float s = 1.0f / (1.0f + expf(-f));
    int32_t q = q_round_sat(s / sy, zy, p->lo, p->hi);
    table[b] = (uint8_t)(sg ? (uint8_t)(int8_t)q : (uint8_t)q);
  }
  const uint8_t *x = in[0];
  uint8_t *y = out[0];
  for (size_t i = 0; i < p->count; i++)
    y[i] = table[x[i]];
  return 0;
}

/* QLinearGlobalAveragePool: x, sx, zx, sy, zy; attribute channels_last. */
typedef struct msgap_params {
  int is_signed, last;
  int32_t lo, hi;
  int64_t n, c, size; /* batch, channels, spatial positions */
  int64_t rep;        /* channels-last: pixels summed per run (msgap_sums) */
} msgap_params;

static int msgap_infer(es_kinst *k) {
  msgap_params *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  k->params = p;
  static const char *const names[5] = {"X", "x_scale", "x_zero_point", "y_scale",
                                      "y_zero_point"};
  int64_t last;
  int rc = ms_unary_inputs(k, names);
  if (rc < 0 || (rc = es__attr_int(k, "channels_last", 0, &last)) < 0)
    return rc;
  const es_tdesc *x = k->in[0];
  if (x->rank < 3)
    return ES_KFAIL(k, ES_EMODEL, "X must have rank 3 or more (N, C and spatial dims), has %d",
                    x->rank);
  if (last != 0 && last != 1)
    return ES_KFAIL(k, ES_EMODEL, "channels_last %lld is not 0 or 1", (long long)last);
  /* X in NHWC (a QDQ model's pooled feature map, between channels-last
   * convolutions): its bytes are channels-last whatever the attribute */
  if (x->layout == ES_LAYOUT_NHWC && last == 0)
    last = 2;
  p->last = (int)last;
  p->is_signed = x->dtype == ES_DTYPE_INT8;
  q_range(x->dtype, &p->lo, &p->hi);
  int64_t dims[ES_MAX_RANK];
  int cax = p->last == 1 ? x->rank - 1 : 1;
  p->n = x->dims[0];
  p->c = x->dims[cax];
  for (int d = 0; d < x->rank; d++)
    dims[d] = d != 0 && d != cax ? 1 : x->dims[d];
  /* the output's count is checked by its descriptor, X's nonzero dims by
   * its own (at most 2^40 together); the product is checked all the same */
  if ((rc = q_out_set(k, 0, x->dtype, x->rank, dims)) < 0)
    return rc;
  p->size = 1;
  for (int d = 0; d < x->rank; d++)
    if (d != 0 && d != cax && __builtin_mul_overflow(p->size, x->dims[d], &p->size))
      return ES_KFAIL(k, ES_EMODEL, "X's spatial dimensions overflow");
  if (p->size > Q_DIM_MAX)
    return ES_KFAIL(k, ES_EMODEL, "X has %lld positions per channel, more than 2^40",
                    (long long)p->size);
  k->inplace = -1;
  /* channels-last sums every pixel's channels in a row, into C int64s */
  p->rep = p->c >= 1024 ? 1 : 1024 / p->c;
  k->scratch_bytes = p->last ? (size_t)p->c * (sizeof(int64_t) + (size_t)p->rep * sizeof(int32_t))
                             : 0;
  return 0;
}

/* Channels-last sums: sum[c] over size pixels of nc bytes. Runs of rep
 * pixels (rep * nc bytes, about 1 KiB) add into rep * nc int32s, which a
 * long loop vectorises whatever nc is; blocks of 2^16 runs (at most 2^16
 * * 255 per int32) then fold into the int64 sums. */
static inline void msgap_sums(const uint8_t *restrict x, int sg, int64_t size, int64_t nc,
                              int64_t rep, int64_t *restrict sum, int32_t *restrict acc) {
  int64_t len = rep * nc, block = rep * 65536;
  memset(sum, 0, (size_t)nc * sizeof *sum);
  for (int64_t i0 = 0; i0 < size; i0 += block) {
    int64_t i1 = size - i0 < block ? size : i0 + block;
    int64_t full = i0 + (i1 - i0) / rep * rep, i = i0;
    memset(acc, 0, (size_t)len * sizeof *acc);
    for (; i < full; i += rep) {
      const uint8_t *px = x + i * nc;
      if (sg)
        for (int64_t j = 0; j < len; j++)
          acc[j] += (int8_t)px[j];
      else
        for (int64_t j = 0; j < len; j++)
          acc[j] += px[j];
    }
    for (; i < i1; i++)
      for (int64_t c = 0; c < nc; c++)
        acc[c] += sg ? (int8_t)x[i * nc + c] : x[i * nc + c];
    for (int64_t j = 0; j < len; j++)
      sum[j % nc] += acc[j];
  }
}

ES_KCLONES static void msgap_sums_any(const uint8_t *restrict x, int sg, int64_t size,
                                      int64_t nc, int64_t rep, int64_t *restrict sum,
                                      int32_t *restrict acc) {
  msgap_sums(x, sg, size, nc, rep, sum, acc);
}

#if defined(__x86_64__)
Q_AVX512 static void msgap_sums512(const uint8_t *restrict x, int sg, int64_t size, int64_t nc,
                                   int64_t rep, int64_t *restrict sum, int32_t *restrict acc) {
  msgap_sums(x, sg, size, nc, rep, sum, acc);
}
#endif

static int msgap_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  (void)scratch;
  const msgap_params *p = k->params;
  int sg = p->is_signed;
  float sx = ms_scale(in, 1), sy = ms_scale(in, 3);
  int32_t zx = ms_zp(in, 2, sg), zy = ms_zp(in, 4, sg);
  float mult = sx / (sy * (float)p->size);
  for (int64_t b = 0; b < p->n; b++) {
    if (p->last) {
      int64_t *sum = scratch;
      int32_t *acc = (int32_t *)(sum + p->c);
      const uint8_t *x = (const uint8_t *)in[0] + b * p->size * p->c;
#if defined(__x86_64__)
      if (q_cpu(Q_CPU_512))
        msgap_sums512(x, sg, p->size, p->c, p->rep, sum, acc);
      else
#endif
        msgap_sums_any(x, sg, p->size, p->c, p->rep, sum, acc);
      for (int64_t c = 0; c < p->c; c++)
        q_store8(out[0], sg, b * p->c + c,
                 q_round_sat((float)(sum[c] - (int64_t)zx * p->size) * mult, zy, p->lo, p->hi));
      continue;
    }
    for (int64_t c = 0; c < p->c; c++) {
      int64_t sum = 0;
      for (int64_t i = 0; i < p->size; i++)
        sum += q_at8(in[0], sg, (b * p->c + c) * p->size + i);
      sum -= (int64_t)zx * p->size;
      q_store8(out[0], sg, b * p->c + c, q_round_sat((float)sum * mult, zy, p->lo, p->hi));
    }
  }
  return 0;
}

/* QLinearConcat: sy, zy, then (x, sx, zx) per input; attribute axis.
 * Inputs all in NHWC (a QDQ pyramid's join between channels-last
 * convolutions) concatenate in NHWC: the axis is found among the bytes'
 * own dimensions, so a channel join copies one run per input and pixel.
 * Mixed layouts are asked plain. An input whose scale or zero point is not
 * Y's goes through a 256-byte table of quantize(dequantize(b)) for its
 * bytes b, made once per run: the same numbers as element by element. */
#define MSCAT_MAX 64
typedef struct mscat_params {
  int is_signed, n, empty;
  int32_t lo, hi;
  int64_t outer, total;          /* rows before the axis; elements per row of Y */
  int64_t inner[MSCAT_MAX];      /* elements per row of input j */
} mscat_params;

static int mscat_infer(es_kinst *k) {
  mscat_params *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  k->params = p;
  if (k->n_in < 5 || (k->n_in - 2) % 3 != 0 || (k->n_in - 2) / 3 > MSCAT_MAX)
    return ES_KFAIL(k, ES_EMODEL, "QLinearConcat takes Y's scale and zero point, then 1 to %d "
                    "triples (X, its scale, its zero point); has %d inputs", MSCAT_MAX, k->n_in);
  if (k->n_out != 1 || !k->out[0])
    return ES_KFAIL(k, ES_EMODEL, "QLinearConcat has exactly one output");
  int rc = q_need(k, 2, "X 0");
  if (rc < 0)
    return rc;
  const es_tdesc *x0 = k->in[2];
  if ((rc = q_dtype_8bit(k, x0, "X 0")) < 0 || (rc = ms_param(k, 0, 0, x0->dtype, "Y_scale")) < 0 ||
      (rc = ms_param(k, 1, 1, x0->dtype, "Y_zero_point")) < 0)
    return rc;
  int64_t axis;
  int ax;
  if ((rc = es__attr_int(k, "axis", INT64_MIN, &axis)) < 0)
    return rc;
  if (axis == INT64_MIN)
    return ES_KFAIL(k, ES_EMODEL, "QLinearConcat needs the attribute axis");
  if ((rc = es__axis_norm(k, axis, x0->rank, &ax)) < 0)
    return rc;
  p->n = (k->n_in - 2) / 3;
  int64_t dims[ES_MAX_RANK];
  memcpy(dims, x0->dims, sizeof(int64_t) * (size_t)x0->rank);
  dims[ax] = 0;
  char name[3][48];
  int nhwc = 0;
  uint32_t plain = 0;
  for (int j = 0; j < p->n; j++) {
    snprintf(name[0], sizeof name[0], "X %d", j);
    snprintf(name[1], sizeof name[1], "X %d's scale", j);
    snprintf(name[2], sizeof name[2], "X %d's zero point", j);
    if ((rc = q_need(k, 2 + 3 * j, name[0])) < 0 ||
        (rc = ms_param(k, 3 + 3 * j, 0, x0->dtype, name[1])) < 0 ||
        (rc = ms_param(k, 4 + 3 * j, 1, x0->dtype, name[2])) < 0)
      return rc;
    const es_tdesc *x = k->in[2 + 3 * j];
    if (x->dtype != x0->dtype || x->rank != x0->rank)
      return ES_KFAIL(k, ES_EMODEL, "X %d is %s of rank %d, X 0 %s of rank %d: they must match",
                      j, es_dtype_name(x->dtype), x->rank, es_dtype_name(x0->dtype), x0->rank);
    for (int d = 0; d < x->rank; d++)
      if (d != ax && x->dims[d] != x0->dims[d])
        return ES_KFAIL(k, ES_EMODEL, "X %d's dimension %d is %lld, X 0's %lld", j, d,
                        (long long)x->dims[d], (long long)x0->dims[d]);
    if (x->dims[ax] > Q_DIM_MAX || dims[ax] > Q_DIM_MAX)
      return ES_KFAIL(k, ES_EMODEL, "the concatenated axis is too long");
    dims[ax] += x->dims[ax];
    if (x->layout == ES_LAYOUT_NHWC) {
      nhwc++;
      if (2 + 3 * j < 32)
        plain |= 1u << (2 + 3 * j);
    }
  }
  if (nhwc && nhwc < p->n) { /* mixed: all plain */
    if (nhwc != __builtin_popcount(plain))
      return ES_KFAIL(k, ES_ENOTSUP, "a channels-last input after the tenth among plain ones");
    k->want_plain = plain;
    return ES_KRELAYOUT;
  }
  p->is_signed = x0->dtype == ES_DTYPE_INT8;
  q_range(x0->dtype, &p->lo, &p->hi);
  k->inplace = -1;
  if ((rc = q_out_set(k, 0, x0->dtype, x0->rank, dims)) < 0)
    return rc;
  k->out[0]->layout = nhwc ? ES_LAYOUT_NHWC : ES_LAYOUT_PLAIN;
  p->empty = k->out[0]->count == 0; /* then outer and total are not both meaningful */
  /* the axis among the bytes' own dims (NHWC: N, H, W, C) */
  int64_t pd[ES_MAX_RANK];
  int pa = es__layout_axis(k->out[0], ax);
  es__tdesc_phys_dims(k->out[0], pd);
  p->outer = q_prod(pd, 0, pa);
  p->total = q_prod(pd, pa, x0->rank);
  for (int j = 0; j < p->n; j++) {
    es__tdesc_phys_dims(k->in[2 + 3 * j], pd);
    p->inner[j] = q_prod(pd, pa, x0->rank);
  }
  return 0;
}

static int mscat_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  (void)scratch;
  const mscat_params *p = k->params;
  if (p->empty)
    return 0;
  int sg = p->is_signed;
  float sy = ms_scale(in, 0);
  int32_t zy = ms_zp(in, 1, sg);
  int64_t at = 0;
  uint8_t table[256];
  for (int j = 0; j < p->n; j++) {
    const uint8_t *x = in[2 + 3 * j];
    float sx = ms_scale(in, 3 + 3 * j);
    int32_t zx = ms_zp(in, 4 + 3 * j, sg);
    int64_t w = p->inner[j];
    int same = sx == sy && zx == zy;
    if (!same)
      for (int b = 0; b < 256; b++) {
        float v = (float)(q_at8(&(uint8_t){(uint8_t)b}, sg, 0) - zx) * sx;
        q_store8(table, sg, b, q_round_sat(v / sy, zy, p->lo, p->hi));
      }
    uint8_t *y = (uint8_t *)out[0] + at;
    if (!same)
      q_lut8_rows(x, (size_t)w, table, y, (size_t)p->total, (size_t)w, (size_t)p->outer);
    else
      for (int64_t o = 0; o < p->outer; o++)
        memcpy(y + o * p->total, x + o * w, (size_t)w);
    at += w;
  }
  return 0;
}

/* ==========================================================================
 * Family
 * ======================================================================== */

static const es_kernel quant_kernel = {qlin_infer, quant_run, NULL, 1};
static const es_kernel dequant_kernel = {qlin_infer, dequant_run, NULL, 1};
static const es_kernel dql_kernel = {dql_infer, dql_run, NULL, 0};
static const es_kernel qmm_kernel = {qmm_infer, qmm_run, qmm_release, 0};
static const es_kernel qconv_kernel = {qconv_infer, qconv_run, qconv_release, 1};
static const es_kernel qlookup_kernel = {qlookup_infer, qlookup_run, NULL, 1};
static const es_kernel msbin_kernel = {msbin_infer, msbin_run, NULL, 1};
static const es_kernel mssig_kernel = {mssig_infer, mssig_run, NULL, 0};
static const es_kernel msgap_kernel = {msgap_infer, msgap_run, NULL, 1};
static const es_kernel mscat_kernel = {mscat_infer, mscat_run, NULL, 1};

const es_kernel *es__kernels_quant(es_op op) {
  switch (op) {
  case ES_OP_QuantizeLinear:
    return &quant_kernel;
  case ES_OP_DequantizeLinear:
    return &dequant_kernel;
  case ES_OP_DynamicQuantizeLinear:
    return &dql_kernel;
  case ES_OP_MatMulInteger:
  case ES_OP_QLinearMatMul:
    return &qmm_kernel;
  case ES_OP_QLinearAdd:
  case ES_OP_QLinearMul:
    return &msbin_kernel;
  case ES_OP_QLinearSigmoid:
    return &mssig_kernel;
  case ES_OP_QLinearGlobalAveragePool:
    return &msgap_kernel;
  case ES_OP_QLinearConcat:
    return &mscat_kernel;
  case ES_OP_ConvInteger:
  case ES_OP_QLinearConv:
  case ES_OP_QLinearConvTranspose:
    return &qconv_kernel;
  case ES_OP_QLookup:
    return &qlookup_kernel;
  default:
    return NULL;
  }
}
