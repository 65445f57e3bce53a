/* Float helpers shared by the kernels: exp, sigmoid, and the sum and max of
 * a row, each in one place so every kernel that uses one gives the same
 * bits (the Sigmoid node and a fused chain's SIGMOID, ReduceMean and
 * GlobalAveragePool's sums).
 *
 * libm's expf is a call per element and keeps every loop around it scalar
 * (about 4 ns an element here). es__ew_exp_neg is branch-free float and
 * 32-bit integer arithmetic that GCC vectorises inside the kernels' chunked
 * loops: Cephes' expf reduction and polynomial (within 2 ulp of expf),
 * with the scale 2^n applied as two powers of two so results down to the
 * subnormal range stay right.
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

static inline es_ew_exp2n es__ew_exp_reduce(float x) {
  float t = x * 1.44269504088896341f + ES_EW_MAGIC;
  float n = t - ES_EW_MAGIC;
  float r = x - n * 0.693359375f; /* ln 2 in two parts: exact n * hi */
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  return (es_ew_exp2n){p, t};
}

/* e^x for x <= 0; NaN stays NaN. */
static inline float es__ew_exp_neg(float x) {
  /* e^-104 is below half the smallest subnormal: the result is 0 from here
   * on, and the clamp keeps n within the two-step scale's range. */
  es_ew_exp2n e = es__ew_exp_reduce(es__ew_select(x < -104.0f, -104.0f, x));
  /* 2^n = 2^n1 * 2^n2 with n1, n2 >= -76, both normal. Unsigned
   * arithmetic: for NaN the bits are garbage but defined, and p is NaN. */
  uint32_t m = es__ew_f2u(e.t) - es__ew_f2u(ES_EW_MAGIC) + 152u; /* n + 152, in [2, 152] */
  uint32_t e1 = (m >> 1) + 51u, e2 = m - (m >> 1) + 51u;
  return e.p * es__ew_u2f(e1 << 23) * es__ew_u2f(e2 << 23);
}

/* e^x for x <= 0 with Softmax's floor: NaN and x below -87.34 give
 * e^-87.34, about 2^-126, the smallest normal result. Then n >= -126 and
 * 2^n is one normal float: one scale instead of two. */
static inline float es__ew_exp_neg_floor(float x) {
  es_ew_exp2n e = es__ew_exp_reduce(es__ew_select(x >= -87.33654f, x, -87.33654f));
  uint32_t b = es__ew_f2u(e.t) - es__ew_f2u(ES_EW_MAGIC) + 127u; /* n + 127, in [1, 127] */
  return e.p * es__ew_u2f(b << 23);
}

/* 1 / (1 + e^-x) from e^-|x|, which never overflows; for x < 0, e / (1 + e)
 * avoids 1 - r cancellation. */
static inline float es__ew_sigmoid(float x) {
  float e = es__ew_exp_neg(-fabsf(x));
  float r = 1.0f / (1.0f + e);
  return es__ew_select(x >= 0, r, e * r);
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
