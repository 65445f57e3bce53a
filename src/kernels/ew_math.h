/* Float helpers shared by the kernels: exp, log and the activations built
 * on them, and the sum and max of a row, each in one place so every kernel
 * that uses one gives the same bits (a Sigmoid or Tanh node and a fused
 * chain's SIGMOID or TANH, ReduceMean and GlobalAveragePool's sums).
 *
 * libm's expf is a call per element and keeps every loop around it scalar
 * (about 4 ns an element here). es__ew_exp_neg is branch-free float and
 * 32-bit integer arithmetic that GCC vectorises inside the kernels' chunked
 * loops: Cephes' expf reduction and polynomial (within 2 ulp of expf),
 * with the scale 2^n applied as two powers of two so results down to the
 * subnormal range stay right. es__ew_exp extends it to the whole range,
 * es__ew_log is Cephes' logf the same way, and tanh, erf, GELU, softplus,
 * mish and the exponential linear units are written on top of them,
 * branch-free, each choosing the formula that does not cancel (expm1 by
 * its series near 0, log1p by Goldberg's correction, GELU's tail by erfc).
 * Rarely used functions (trigonometry) stay with libm.
 *
 * Selects, not branches: GCC does not if-convert float operations that may
 * trap (-ftrapping-math), and a branch keeps a loop scalar. Every function
 * keeps NaN a NaN unless it says otherwise.
 *
 * Sums and maxima keep eight partial results: a single running one is a
 * dependency chain the vectoriser may not reorder (no reassociation flags),
 * and eight partial sums are also more accurate. */
#ifndef ES_KERNELS_EW_MATH_H
#define ES_KERNELS_EW_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t es__ew_f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static inline float es__ew_u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* c ? a : b without a branch. GCC does not if-convert float operations
 * that may trap (-ftrapping-math), and a branch keeps a loop scalar. */
static inline float es__ew_select(int c, float a, float b) {
  uint32_t m = 0u - (uint32_t)(c != 0);
  return es__ew_u2f((es__ew_f2u(a) & m) | (es__ew_f2u(b) & ~m));
}

/* e^x = p * 2^n for x in [-104, 0]: Cephes' reduction and polynomial. n =
 * round(x / ln 2) sits in t's low mantissa bits (adding 1.5 * 2^23 puts it
 * there): n = bits(t) - bits(ES_EW_MAGIC). */
#define ES_EW_MAGIC 12582912.0f
typedef struct es_ew_exp2n {
  float p, t;
} es_ew_exp2n;

/* Cephes' polynomial: e^r for r in [-ln2 / 2, ln2 / 2]. */
static inline float es__ew_exp_poly(float r) {
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * (r * r) + r + 1.0f;
}

static inline es_ew_exp2n es__ew_exp_reduce(float x) {
  float t = x * 1.44269504088896341f + ES_EW_MAGIC;
  float n = t - ES_EW_MAGIC;
  float r = x - n * 0.693359375f; /* ln 2 in two parts: exact n * hi */
  r = r - n * -2.12194440e-4f;
  return (es_ew_exp2n){es__ew_exp_poly(r), t};
}

/* The same for e^(a + b) with a + b given as two floats (a the large part,
 * b the small), so the argument's own rounding does not become relative
 * error of the result: a - n hi is exact or within an ulp of a number below
 * 2, and b joins only then. */
static inline es_ew_exp2n es__ew_exp_reduce2(float a, float b) {
  float t = (a + b) * 1.44269504088896341f + ES_EW_MAGIC;
  float n = t - ES_EW_MAGIC;
  float r = (a - n * 0.693359375f) + b;
  r = r - n * -2.12194440e-4f;
  return (es_ew_exp2n){es__ew_exp_poly(r), t};
}

/* p 2^n for n in [-150, 128] (t from a reduction), as two normal powers of
 * two: results down to the subnormal range keep their precision. Unsigned
 * arithmetic: for NaN the bits are garbage but defined, and p is NaN. */
static inline float es__ew_exp_scale(es_ew_exp2n e) {
  uint32_t m = es__ew_f2u(e.t) - es__ew_f2u(ES_EW_MAGIC) + 152u; /* n + 152, in [2, 280] */
  uint32_t e1 = (m >> 1) + 51u, e2 = m - (m >> 1) + 51u;
  return e.p * es__ew_u2f(e1 << 23) * es__ew_u2f(e2 << 23);
}

/* e^x for x <= 0; NaN stays NaN. */
static inline float es__ew_exp_neg(float x) {
  /* e^-104 is below half the smallest subnormal: the result is 0 from here
   * on, and the clamp keeps n >= -150 for the scale. */
  return es__ew_exp_scale(es__ew_exp_reduce(es__ew_select(x < -104.0f, -104.0f, x)));
}

/* e^x for x <= 0 with Softmax's floor: NaN and x below -87.34 give
 * e^-87.34, about 2^-126, the smallest normal result. Then n >= -126 and
 * 2^n is one normal float: one scale instead of two. */
static inline float es__ew_exp_neg_floor(float x) {
  es_ew_exp2n e = es__ew_exp_reduce(es__ew_select(x >= -87.33654f, x, -87.33654f));
  uint32_t b = es__ew_f2u(e.t) - es__ew_f2u(ES_EW_MAGIC) + 127u; /* n + 127, in [1, 127] */
  return e.p * es__ew_u2f(b << 23);
}

/* e^x over the whole range: 0 below -104 (as es__ew_exp_neg, whose bits
 * it gives for x <= 0), +inf from 88.73 (x is clamped at 89, where p * 2^128
 * overflows), NaN stays NaN. n is at most 128, so the two-step scale's
 * factors stay normal. */
static inline float es__ew_exp(float x) {
  float c = es__ew_select(x > 89.0f, 89.0f, x);
  return es__ew_exp_scale(es__ew_exp_reduce(es__ew_select(c < -104.0f, -104.0f, c)));
}

/* e^x - 1 for x <= 0 (callers clamp): near 0 the difference cancels, so
 * above -0.5 the series to degree 8 (error below 2e-8 relative). */
static inline float es__ew_expm1_neg(float x) {
  float p = 1.0f / 40320.0f;
  p = p * x + 1.0f / 5040.0f;
  p = p * x + 1.0f / 720.0f;
  p = p * x + 1.0f / 120.0f;
  p = p * x + 1.0f / 24.0f;
  p = p * x + 1.0f / 6.0f;
  p = p * x + 0.5f;
  p = (p * x) * x + x;
  return es__ew_select(x > -0.5f, p, es__ew_exp_neg(x) - 1.0f);
}

/* log x: Cephes' logf. x = m 2^e with m in [sqrt(1/2), sqrt(2)), then a
 * polynomial in f = m - 1 (exact). Subnormals are scaled by 2^23 first;
 * 0 -> -inf, negative and NaN -> NaN, +inf -> +inf. */
static inline float es__ew_log(float x) {
  int sub = x < 1.17549435e-38f;
  uint32_t u = es__ew_f2u(es__ew_select(sub, x * 8388608.0f, x));
  int32_t e = (int32_t)((u >> 23) & 0xffu) - 127 - 23 * sub;
  float m = es__ew_u2f((u & 0x007fffffu) | 0x3f800000u); /* [1, 2) */
  int big = m > 1.41421356f;
  m = es__ew_select(big, 0.5f * m, m);
  e += big;
  float f = m - 1.0f, z = f * f, fe = (float)e;
  float y = 7.0376836292e-2f;
  y = y * f - 1.1514610310e-1f;
  y = y * f + 1.1676998740e-1f;
  y = y * f - 1.2420140846e-1f;
  y = y * f + 1.4249322787e-1f;
  y = y * f - 1.6668057665e-1f;
  y = y * f + 2.0000714765e-1f;
  y = y * f - 2.4999993993e-1f;
  y = y * f + 3.3333331174e-1f;
  y = y * f * z;
  y = y + fe * -2.12194440e-4f;
  y = y - 0.5f * z;
  float r = f + y + fe * 0.693359375f;
  r = es__ew_select(x == INFINITY, x, r);
  r = es__ew_select(x == 0.0f, -INFINITY, r);
  return es__ew_select((x < 0.0f) | (x != x), NAN, r); /* |, not ||: no branch */
}

/* log(1 + e) for e in [0, 1]: Goldberg's correction log(w) e / (w - 1)
 * with w = 1 + e rounded, exact to a few ulp however small e is. */
static inline float es__ew_log1p_unit(float e) {
  float w = 1.0f + e;
  float d = es__ew_select(w == 1.0f, 1.0f, w - 1.0f); /* no 0 / 0 in the lane not taken */
  return es__ew_select(w == 1.0f, e, es__ew_log(w) * (e / d));
}

/* x with the sign bit of s. */
static inline float es__ew_copysign(float x, float s) {
  return es__ew_u2f((es__ew_f2u(x) & 0x7fffffffu) | (es__ew_f2u(s) & 0x80000000u));
}

/* 1 / (1 + e^-x) from e^-|x|, which never overflows; for x < 0, e / (1 + e)
 * avoids 1 - r cancellation. */
static inline float es__ew_sigmoid(float x) {
  float e = es__ew_exp_neg(-fabsf(x));
  float r = 1.0f / (1.0f + e);
  return es__ew_select(x >= 0, r, e * r);
}

/* tanh: Cephes' tanhf. Below 0.625 in magnitude its odd polynomial; above,
 * (1 - e) / (1 + e) with e = e^-2|x| (no cancellation: e < 0.29). */
static inline float es__ew_tanh(float x) {
  float z = x * x;
  float s = -5.70498872745e-3f;
  s = s * z + 2.06390887954e-2f;
  s = s * z - 5.37397155531e-2f;
  s = s * z + 1.33314422036e-1f;
  s = s * z - 3.33332819422e-1f;
  s = s * z * x + x;
  float a = fabsf(x), e = es__ew_exp_neg(-2.0f * a);
  float l = es__ew_copysign((1.0f - e) / (1.0f + e), x);
  return es__ew_select(a < 0.625f, s, l);
}

/* erf: x P(x^2) / Q(x^2) on x clamped to [-4, 4] (erf(4) rounds to 1), the
 * rational fit Eigen and XLA use for float. */
static inline float es__ew_erf(float x) {
  float c = es__ew_select(x > 4.0f, 4.0f, x);
  c = es__ew_select(c < -4.0f, -4.0f, c);
  float z = c * c;
  float p = -2.72614225801306e-10f;
  p = p * z + 2.77068142495902e-08f;
  p = p * z - 2.10102402082508e-06f;
  p = p * z - 5.69250639462346e-05f;
  p = p * z - 7.34990630326855e-04f;
  p = p * z - 2.95459980854025e-03f;
  p = p * z - 1.60960333262415e-02f;
  float q = -1.45660718464996e-05f;
  q = q * z - 2.13374055278905e-04f;
  q = q * z - 1.68282697438203e-03f;
  q = q * z - 7.37332916720468e-03f;
  q = q * z - 1.42647390514189e-02f;
  return c * (p / q); /* not (c p) / q, which underflows for subnormal x */
}

/* GELU, x Phi(x) with Phi(x) = erfc(-x / sqrt 2) / 2. 1 + erf(x / sqrt 2)
 * loses all its digits in the negative tail, so h = erfc(|x| / sqrt 2) / 2
 * is computed directly, by the Chebyshev fit of Numerical Recipes' erfcc,
 * erfc(z) = t exp(P(t) - z^2) with t = 1 / (1 + z / 2) (relative error
 * below 1.2e-7 for every z), and Phi is h for x < 0 and 1 - h (>= 0.5, no
 * cancellation) otherwise. The exponent's rounding would become relative
 * error of h (2.4e-7 per ulp at -z^2 = -4.5, x = -3), so z^2 = x^2 / 2 is
 * kept exact as two floats: x = hi + lo with hi's 12 leading bits, hi^2
 * exact, and the sum goes to the reduction in two parts. Within 5e-7
 * relative error everywhere (measured against double precision), tail
 * included. From x = 6 on, 1 - h rounds to 1 and the result is x (which
 * keeps +inf out of hi - lo's inf - inf); -inf gives NaN, as x (1 + erf)
 * does. */
static inline float es__ew_gelu(float x) {
  float ax = fabsf(x);
  float t = 1.0f / (1.0f + 0.353553390593273762f * ax);
  float p = 0.17087277f;
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  float hi = es__ew_u2f(es__ew_f2u(ax) & 0xfffff000u), lo = ax - hi;
  float a = -0.5f * (hi * hi);                /* exact */
  float b = p - (hi * lo + 0.5f * (lo * lo)); /* -(x^2 / 2 - hi^2 / 2) + P */
  /* Below -104 the result is 0; the clamp keeps n in the scale's range. */
  int under = a + b < -104.0f;
  es_ew_exp2n e = es__ew_exp_reduce2(es__ew_select(under, -104.0f, a), es__ew_select(under, 0, b));
  float h = 0.5f * t * es__ew_exp_scale(e);
  return es__ew_select(x > 6.0f, x, x * es__ew_select(x < 0.0f, h, 1.0f - h));
}

/* GELU's tanh form: (1 + tanh(u)) / 2 = sigmoid(2u), which never cancels;
 * u = sqrt(2 / pi) (x + 0.044715 x^3). */
static inline float es__ew_gelu_tanh(float x) {
  float u2 = 1.59576912160573071f * (x + 0.044715f * (x * x * x));
  return x * es__ew_sigmoid(u2);
}

/* log(1 + e^x) = max(x, 0) + log1p(e^-|x|): never overflows. */
static inline float es__ew_softplus(float x) {
  float l = es__ew_log1p_unit(es__ew_exp_neg(-fabsf(x)));
  return es__ew_select(x > 0.0f, x, 0.0f) + l;
}

/* x tanh(softplus(x)) = x n / (n + 2) with n = e^x (e^x + 2), exact
 * algebra without a log; from x = 20 on the ratio is 1 in float, so e^x is
 * capped there and never overflows. */
static inline float es__ew_mish(float x) {
  float e = es__ew_exp(es__ew_select(x > 20.0f, 20.0f, x));
  float n = e * (e + 2.0f);
  return x * (n / (n + 2.0f));
}

/* Round half to even (the default rounding mode's rint): adding and
 * removing 2^23 leaves an integer for |x| < 2^23; larger magnitudes, inf
 * and NaN already are what they are. The sign is put back so -0.3 -> -0. */
static inline float es__ew_round(float x) {
  float a = fabsf(x);
  float r = es__ew_copysign((a + 8388608.0f) - 8388608.0f, x);
  return es__ew_select(a < 8388608.0f, r, x);
}

static inline float es__ew_floor(float x) {
  float r = es__ew_round(x);
  return es__ew_select(r > x, r - 1.0f, r);
}

/* -0.7 rounds to -1, and -1 + 1 is +0: the sign is x's again. */
static inline float es__ew_ceil(float x) {
  float r = es__ew_round(x);
  return es__ew_copysign(es__ew_select(r < x, r + 1.0f, r), x);
}

/* 1, -1, 0 (for both zeros), NaN for NaN. */
static inline float es__ew_sign(float x) {
  float r = es__ew_select(x != x, x, 0.0f);
  r = es__ew_select(x < 0.0f, -1.0f, r);
  return es__ew_select(x > 0.0f, 1.0f, r);
}

/* ---- activations with parameters (ONNX's definitions) ---- */

static inline float es__ew_leakyrelu(float x, float alpha) {
  return es__ew_select(x < 0.0f, alpha * x, x);
}

/* alpha (e^x - 1) for x < 0, else x. */
static inline float es__ew_elu(float x, float alpha) {
  float m = es__ew_expm1_neg(es__ew_select(x < 0.0f, x, 0.0f));
  return es__ew_select(x < 0.0f, alpha * m, x);
}

/* gamma (alpha e^x - alpha) for x <= 0, gamma x otherwise. */
static inline float es__ew_selu(float x, float alpha, float gamma) {
  float m = es__ew_expm1_neg(es__ew_select(x < 0.0f, x, 0.0f));
  return es__ew_select(x < 0.0f, gamma * (alpha * m), gamma * x);
}

/* max(0, x) + min(0, alpha (e^(x / alpha) - 1)); alpha > 0 keeps x / alpha
 * on x's side of 0. */
static inline float es__ew_celu(float x, float alpha) {
  float m = es__ew_expm1_neg(es__ew_select(x < 0.0f, x, 0.0f) / alpha);
  return es__ew_select(x < 0.0f, alpha * m, x);
}

/* x / (1 + |x|). */
static inline float es__ew_softsign(float x) { return x / (1.0f + fabsf(x)); }

/* x clamp(x / 6 + 1 / 2, 0, 1), HardSigmoid's clamp with alpha 1/6, beta
 * 1/2; comparisons (not fminf) so NaN propagates. */
static inline float es__ew_hardswish(float x) {
  float v = x * (1.0f / 6.0f) + 0.5f;
  v = es__ew_select(v < 0.0f, 0.0f, v);
  v = es__ew_select(v > 1.0f, 1.0f, v);
  return x * v;
}

/* x above alpha, else 0 (NaN -> 0, as where(x > alpha, x, 0)). */
static inline float es__ew_thresholdedrelu(float x, float alpha) {
  return es__ew_select(x > alpha, x, 0.0f);
}

/* x + bias below -lambd, x - bias above lambd, 0 between (and for NaN). */
static inline float es__ew_shrink(float x, float bias, float lambd) {
  float r = es__ew_select(x > lambd, x - bias, 0.0f);
  return es__ew_select(x < -lambd, x + bias, r);
}

/* max and min that propagate NaN from either side (numpy's maximum). */
static inline float es__ew_max(float x, float y) {
  float m = es__ew_select(x < y, y, x);
  return es__ew_select(y != y, y, m);
}

static inline float es__ew_min(float x, float y) {
  float m = es__ew_select(y < x, y, x);
  return es__ew_select(y != y, y, m);
}

/* PRelu: x, or slope x below 0. */
static inline float es__ew_prelu(float x, float slope) {
  return es__ew_select(x < 0.0f, slope * x, x);
}

/* The eight partial results of a row, added in the one order every sum
 * here uses. */
static inline float es__ew_hsum8(const float acc[8]) {
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* Sum of x[0..n): eight partial sums, then the tail in order. */
static inline float es__ew_sum_f32(const float *restrict x, int64_t n) {
  float acc[8] = {0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int t = 0; t < 8; t++)
      acc[t] += x[i + t];
  float s = es__ew_hsum8(acc);
  for (; i < n; i++)
    s += x[i];
  return s;
}

/* Max of x[0..n) (-inf when n is 0); NaN elements are skipped. */
static inline float es__ew_max_f32(const float *restrict x, int64_t n) {
  float acc[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,
                  -INFINITY, -INFINITY, -INFINITY, -INFINITY};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int t = 0; t < 8; t++)
      acc[t] = x[i + t] > acc[t] ? x[i + t] : acc[t];
  float m = acc[0];
  for (int t = 1; t < 8; t++)
    m = acc[t] > m ? acc[t] : m;
  for (; i < n; i++)
    m = x[i] > m ? x[i] : m;
  return m;
}

#endif
