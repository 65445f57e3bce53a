/* Elementwise operators.
 *
 *   binary, numpy broadcasting: Add, Sub, Mul, Div, Pow, Mod, BitShift,
 *     Equal, Less, Greater, LessOrEqual, GreaterOrEqual, And, Or, Xor,
 *     PRelu (the slope broadcast to X only)
 *   variadic, any number of broadcast inputs: Max, Min, Sum, Mean; Where
 *   unary: Relu, Sigmoid, HardSigmoid, Clip, Sqrt, Cast, and one table of
 *     math, logic and activations (Abs ... Gelu, ew_unary_defs)
 *   Identity and Dropout (inference): the input as it is
 *
 * The float formulas (exp, log, tanh, erf, GELU...) live in ew_math.h,
 * shared with the fused chains (fused.c) so both give the same bits.
 *
 * Every op reduces to a few contiguous "run" functions generated per
 * (operator, element type) by the macros below: for binary ops vv (both
 * operands advance), vs (b is one scalar), sv (a is one scalar); for unary
 * ops a single x -> o function. Planning picks the run functions and works
 * out how to walk the operands; run() only loops over contiguous runs.
 *
 * Broadcasting (planned once in infer): the output shape is collapsed by
 * dropping size-1 output dims and merging neighbours in which each operand
 * is either present ("full") in both or broadcast in both, so [N,C,H,W] op
 * [C,1,1] becomes [N, C, H*W] with b = (bcast, full, bcast). The collapsed
 * form then names a fast path: same shape (one flat run), scalar operand,
 * repeated rows ([R,K] op [K]), per-channel ([N,C,I] op [C], one scalar per
 * contiguous block of I), else a general N-d walk over element strides
 * whose innermost collapsed dim is one contiguous run.
 *
 * Layouts. Unary ops keep their input's layout: the output has the same
 * bytes order (rank-5 NDHWC included). Binary ops are plain when no input
 * is channels-last (NHWC, or NDHWC at rank 5). When one is, the output is
 * channels-last and every other input must be readable in that order:
 * channels-last itself, or plain but es__tdesc_cl_compatible (a scalar, a
 * per-channel vector, a one-channel map), whose bytes need no move. Any
 * other plain input of the output's rank is asked for channels-last
 * (ES_KRELAYOUT); one of another rank cannot be, so the channels-last
 * inputs are asked for in plain instead. The broadcast above then runs on
 * physical shapes: each operand right-aligned to the output's rank and
 * permuted to (N, spatial..., C), which for a compatible plain operand only
 * moves dims of size 1. So the SE block's [1,C,1,1] gate times an NHWC
 * [1,C,H,W] map is [H*W, C] op [C]: the repeated-rows fast path. The
 * variadic ops keep channels-last at rank 4 only.
 *
 * In place: infer offers output 0 to the input whose shape and type equal
 * the output's. Run functions process 16-element chunks that load every
 * input element of the chunk before storing any output, so out == in is
 * exact-alias safe without restrict, and the fully unrolled chunk is what
 * GCC's SLP vectoriser turns into plain vector loads/ops/stores at -O2.
 *
 * Variadic ops and Where collapse the broadcast the same way over n
 * operands and fold the inputs pairwise along each row (ew_nary_*).
 *
 * Integer arithmetic wraps (computed in the unsigned type; MIN / -1 is
 * MIN), integer division and Mod by zero give 0 instead of trapping (and
 * MIN mod -1 is 0), shifts past the type's width give 0; float -> integer
 * conversions saturate (NaN -> 0) so no input value is undefined behaviour.
 * Max and Min propagate NaN from either side, as numpy's maximum.
 *
 * Types: float32 everywhere; int32, int64, uint8, int8 and bool where ONNX
 * allows them for the operator. A type the operator does not take is
 * ES_EMODEL; one ONNX allows but the engine does not implement (Erf and
 * Shrink on integers) is ES_ENOTSUP. Other element types (float16,
 * double, ...) never reach a kernel: the loader refuses them by name.
 */
#include "kernels/kernel.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kernels/ew_math.h"
#include "kernels/walk.h"

/* ==========================================================================
 * Run functions
 * ======================================================================== */

/* Scalar parameters of unary ops: HardSigmoid alpha/beta in f, Clip bounds
 * in f (float input) or i (integer input). */
typedef struct ew_scal {
  float f[2];
  int64_t i[2];
} ew_scal;

typedef void (*ew_bin_fn)(const void *a, const void *b, void *o, size_t n);
typedef void (*ew_un_fn)(const void *x, void *o, size_t n, const ew_scal *s);

typedef struct ew_bin_fns {
  ew_bin_fn vv, vs, sv;
} ew_bin_fns;

#define EW_CHUNK 16
/* Compute-bound loops (Sigmoid's exp) are built once per x86-64 vector
 * width, the loader picking the one the CPU runs. */
#define EW_CLONES ES_KCLONES
#define EW_UNROLL _Pragma("GCC unroll 16")

/* o[i] = OP(a[i], b[i]) in the three operand patterns. */
#define EW_BIN_DEFINE(NAME, TA, TB, TO, OP)                                               \
  static void NAME##_vv(const void *pa, const void *pb, void *po, size_t n) {             \
    const TA *a = pa;                                                                     \
    const TB *b = pb;                                                                     \
    TO *o = po;                                                                           \
    size_t i = 0;                                                                         \
    for (; i + EW_CHUNK <= n; i += EW_CHUNK) {                                            \
      TA x[EW_CHUNK];                                                                     \
      TB y[EW_CHUNK];                                                                     \
      EW_UNROLL for (int j = 0; j < EW_CHUNK; j++) {                                      \
        x[j] = a[i + j];                                                                  \
        y[j] = b[i + j];                                                                  \
      }                                                                                   \
      EW_UNROLL for (int j = 0; j < EW_CHUNK; j++) o[i + j] = OP(x[j], y[j]);             \
    }                                                                                     \
    for (; i < n; i++) {                                                                  \
      TA x = a[i];                                                                        \
      TB y = b[i];                                                                        \
      o[i] = OP(x, y);                                                                    \
    }                                                                                     \
  }                                                                                       \
  static void NAME##_vs(const void *pa, const void *pb, void *po, size_t n) {             \
    const TA *a = pa;                                                                     \
    const TB y = *(const TB *)pb;                                                         \
    TO *o = po;                                                                           \
    size_t i = 0;                                                                         \
    for (; i + EW_CHUNK <= n; i += EW_CHUNK) {                                            \
      TA x[EW_CHUNK];                                                                     \
      EW_UNROLL for (int j = 0; j < EW_CHUNK; j++) x[j] = a[i + j];                       \
      EW_UNROLL for (int j = 0; j < EW_CHUNK; j++) o[i + j] = OP(x[j], y);                \
    }                                                                                     \
    for (; i < n; i++) {                                                                  \
      TA x = a[i];                                                                        \
      o[i] = OP(x, y);                                                                    \
    }                                                                                     \
  }                                                                                       \
  static void NAME##_sv(const void *pa, const void *pb, void *po, size_t n) {             \
    const TA x = *(const TA *)pa;                                                         \
    const TB *b = pb;                                                                     \
    TO *o = po;                                                                           \
    size_t i = 0;                                                                         \
    for (; i + EW_CHUNK <= n; i += EW_CHUNK) {                                            \
      TB y[EW_CHUNK];                                                                     \
      EW_UNROLL for (int j = 0; j < EW_CHUNK; j++) y[j] = b[i + j];                       \
      EW_UNROLL for (int j = 0; j < EW_CHUNK; j++) o[i + j] = OP(x, y[j]);                \
    }                                                                                     \
    for (; i < n; i++) {                                                                  \
      TB y = b[i];                                                                        \
      o[i] = OP(x, y);                                                                    \
    }                                                                                     \
  }

#define EW_BIN_FNS(NAME) {NAME##_vv, NAME##_vs, NAME##_sv}

/* o[i] = OP(x[i], s) where s is a local copy of the parameters, so the
 * compiler knows stores to o cannot change them. */
#define EW_UN_DEFINE(NAME, TI, TO, OP) EW_UN_DEFINE_ATTR(NAME, TI, TO, OP, )
#define EW_UN_DEFINE_ATTR(NAME, TI, TO, OP, ATTR)                                         \
  ATTR static void NAME(const void *px, void *po, size_t n, const ew_scal *ps) {          \
    const TI *in = px;                                                                    \
    TO *o = po;                                                                           \
    const ew_scal s = ps ? *ps : (ew_scal){{0, 0}, {0, 0}};                               \
    (void)s;                                                                              \
    size_t i = 0;                                                                         \
    for (; i + EW_CHUNK <= n; i += EW_CHUNK) {                                            \
      TI x[EW_CHUNK];                                                                     \
      EW_UNROLL for (int j = 0; j < EW_CHUNK; j++) x[j] = in[i + j];                      \
      EW_UNROLL for (int j = 0; j < EW_CHUNK; j++) o[i + j] = OP(x[j], s);                \
    }                                                                                     \
    for (; i < n; i++) {                                                                  \
      TI x = in[i];                                                                       \
      o[i] = OP(x, s);                                                                    \
    }                                                                                     \
  }

/* ==========================================================================
 * Element operations
 * ======================================================================== */

/* ---- arithmetic and comparison ------------------------------------------- */

static inline float ew_op_add_f32(float x, float y) { return x + y; }
static inline float ew_op_sub_f32(float x, float y) { return x - y; }
static inline float ew_op_mul_f32(float x, float y) { return x * y; }
static inline float ew_op_div_f32(float x, float y) { return x / y; }
static inline uint8_t ew_op_equal_f32(float x, float y) { return x == y; }

/* Signed: wrap through the unsigned type; x / 0 = 0; MIN / -1 wraps. */
#define EW_SIGNED_OPS(S, T, UT)                                                           \
  static inline T ew_op_add_##S(T x, T y) { return (T)((UT)x + (UT)y); }                 \
  static inline T ew_op_sub_##S(T x, T y) { return (T)((UT)x - (UT)y); }                 \
  static inline T ew_op_mul_##S(T x, T y) { return (T)((UT)x * (UT)y); }                 \
  static inline T ew_op_div_##S(T x, T y) {                                               \
    return y == 0 ? (T)0 : y == -1 ? (T)(0u - (UT)x) : (T)(x / y);                        \
  }                                                                                       \
  static inline uint8_t ew_op_equal_##S(T x, T y) { return x == y; }

/* Unsigned (uint8 and bool): promoted to int, truncated back. */
#define EW_UNSIGNED_OPS(S, T)                                                             \
  static inline T ew_op_add_##S(T x, T y) { return (T)(x + y); }                          \
  static inline T ew_op_sub_##S(T x, T y) { return (T)(x - y); }                          \
  static inline T ew_op_mul_##S(T x, T y) { return (T)((unsigned)x * (unsigned)y); }      \
  static inline T ew_op_div_##S(T x, T y) { return y == 0 ? (T)0 : (T)(x / y); }          \
  static inline uint8_t ew_op_equal_##S(T x, T y) { return x == y; }

EW_SIGNED_OPS(i32, int32_t, uint32_t)
EW_SIGNED_OPS(i64, int64_t, uint64_t)
EW_SIGNED_OPS(i8, int8_t, uint8_t)
EW_UNSIGNED_OPS(u8, uint8_t)

#define EW_ARITH_DEFINE(S, T)                                                             \
  EW_BIN_DEFINE(ew_add_##S, T, T, T, ew_op_add_##S)                                       \
  EW_BIN_DEFINE(ew_sub_##S, T, T, T, ew_op_sub_##S)                                       \
  EW_BIN_DEFINE(ew_mul_##S, T, T, T, ew_op_mul_##S)                                       \
  EW_BIN_DEFINE(ew_div_##S, T, T, T, ew_op_div_##S)                                       \
  EW_BIN_DEFINE(ew_equal_##S, T, T, uint8_t, ew_op_equal_##S)

EW_ARITH_DEFINE(f32, float)
EW_ARITH_DEFINE(i32, int32_t)
EW_ARITH_DEFINE(i64, int64_t)
EW_ARITH_DEFINE(u8, uint8_t)
EW_ARITH_DEFINE(i8, int8_t)
/* Bool only compares; its bytes are 0 or 1 like ONNX's. */
EW_BIN_DEFINE(ew_equal_b, uint8_t, uint8_t, uint8_t, ew_op_equal_u8)

/* ---- conversions that must not be undefined ------------------------------ */

/* Truncate toward zero, saturating at the int64 range; NaN -> 0. */
static inline int64_t ew_d2i64(double v) {
  if (!(v == v))
    return 0;
  if (v >= 9223372036854775807.0)
    return INT64_MAX;
  if (v <= -9223372036854775808.0)
    return INT64_MIN;
  return (int64_t)v;
}

static inline int32_t ew_d2i32(double v) {
  if (!(v == v))
    return 0;
  if (v >= 2147483647.0)
    return INT32_MAX;
  if (v <= -2147483648.0)
    return INT32_MIN;
  return (int32_t)v;
}

/* ---- Pow ------------------------------------------------------------------ */

/* Exact integer power, wrapping like repeated multiplication would; a
 * negative exponent truncates 1/x^e toward zero (0 for |x| > 1 and x = 0). */
static inline int64_t ew_ipow(int64_t x, int64_t e) {
  if (e < 0)
    return x == 1 ? 1 : x == -1 ? ((e & 1) ? -1 : 1) : 0;
  uint64_t r = 1, b = (uint64_t)x;
  while (e) {
    if (e & 1)
      r *= b;
    b *= b;
    e >>= 1;
  }
  return (int64_t)r;
}

static inline float ew_op_pow_ff(float x, float y) { return powf(x, y); }
static inline float ew_op_pow_fi32(float x, int32_t y) { return powf(x, (float)y); }
static inline float ew_op_pow_fi64(float x, int64_t y) { return powf(x, (float)y); }
static inline int32_t ew_op_pow_i32i32(int32_t x, int32_t y) { return (int32_t)ew_ipow(x, y); }
static inline int32_t ew_op_pow_i32i64(int32_t x, int64_t y) { return (int32_t)ew_ipow(x, y); }
static inline int32_t ew_op_pow_i32f(int32_t x, float y) { return ew_d2i32(pow(x, y)); }
static inline int64_t ew_op_pow_i64i64(int64_t x, int64_t y) { return ew_ipow(x, y); }
static inline int64_t ew_op_pow_i64i32(int64_t x, int32_t y) { return ew_ipow(x, y); }
static inline int64_t ew_op_pow_i64f(int64_t x, float y) { return ew_d2i64(pow((double)x, y)); }

EW_BIN_DEFINE(ew_pow_ff, float, float, float, ew_op_pow_ff)
EW_BIN_DEFINE(ew_pow_fi32, float, int32_t, float, ew_op_pow_fi32)
EW_BIN_DEFINE(ew_pow_fi64, float, int64_t, float, ew_op_pow_fi64)
EW_BIN_DEFINE(ew_pow_i32i32, int32_t, int32_t, int32_t, ew_op_pow_i32i32)
EW_BIN_DEFINE(ew_pow_i32i64, int32_t, int64_t, int32_t, ew_op_pow_i32i64)
EW_BIN_DEFINE(ew_pow_i32f, int32_t, float, int32_t, ew_op_pow_i32f)
EW_BIN_DEFINE(ew_pow_i64i64, int64_t, int64_t, int64_t, ew_op_pow_i64i64)
EW_BIN_DEFINE(ew_pow_i64i32, int64_t, int32_t, int64_t, ew_op_pow_i64i32)
EW_BIN_DEFINE(ew_pow_i64f, int64_t, float, int64_t, ew_op_pow_i64f)

/* Static scalar exponents 2 and 0.5 (variance and norm computations). sqrtf
 * differs from powf(x, 0.5) only at -0 (-0 vs +0) and -inf (NaN vs +inf). */
#define EW_SQUARE(x, s) ((x) * (x))
#define EW_SQRT(x, s) sqrtf(x)
EW_UN_DEFINE(ew_pow_square_f32, float, float, EW_SQUARE)
EW_UN_DEFINE(ew_sqrt_f32, float, float, EW_SQRT)

/* ---- activations ---------------------------------------------------------- */

/* x < 0 ? 0 : x keeps NaN, as numpy's maximum(x, 0) does. */
#define EW_RELU(x, s) ((x) < 0 ? 0 : (x))
EW_UN_DEFINE(ew_relu_f32, float, float, EW_RELU)
EW_UN_DEFINE(ew_relu_i32, int32_t, int32_t, EW_RELU)
EW_UN_DEFINE(ew_relu_i64, int64_t, int64_t, EW_RELU)
EW_UN_DEFINE(ew_relu_i8, int8_t, int8_t, EW_RELU)

/* Vectorisable (ew_math.h), shared with FusedElementwise. */
static inline float ew_op_sigmoid(float x, ew_scal s) {
  (void)s;
  return es__ew_sigmoid(x);
}
EW_UN_DEFINE_ATTR(ew_sigmoid_f32, float, float, ew_op_sigmoid, EW_CLONES)

/* Comparisons (not fmaxf/fminf) so NaN propagates like numpy's clip. */
static inline float ew_op_hardsigmoid(float x, ew_scal s) {
  float v = s.f[0] * x + s.f[1];
  v = v < 0.0f ? 0.0f : v;
  return v > 1.0f ? 1.0f : v;
}
EW_UN_DEFINE(ew_hardsigmoid_f32, float, float, ew_op_hardsigmoid)

/* max(x, lo) then min(., hi): lo > hi gives hi everywhere, as numpy. */
static inline float ew_op_clip_f32(float x, ew_scal s) {
  float v = x < s.f[0] ? s.f[0] : x;
  return v > s.f[1] ? s.f[1] : v;
}
#define EW_CLIP_INT(T)                                                                    \
  static inline T ew_op_clip_##T(T x, ew_scal s) {                                        \
    T lo = (T)s.i[0], hi = (T)s.i[1];                                                     \
    T v = x < lo ? lo : x;                                                                \
    return v > hi ? hi : v;                                                               \
  }
EW_CLIP_INT(int32_t)
EW_CLIP_INT(int64_t)
EW_CLIP_INT(uint8_t)
EW_CLIP_INT(int8_t)
EW_UN_DEFINE(ew_clip_f32, float, float, ew_op_clip_f32)
EW_UN_DEFINE(ew_clip_i32, int32_t, int32_t, ew_op_clip_int32_t)
EW_UN_DEFINE(ew_clip_i64, int64_t, int64_t, ew_op_clip_int64_t)
EW_UN_DEFINE(ew_clip_u8, uint8_t, uint8_t, ew_op_clip_uint8_t)
EW_UN_DEFINE(ew_clip_i8, int8_t, int8_t, ew_op_clip_int8_t)

/* ---- unary math and activations ------------------------------------------ */

/* float32 x -> float32 through a formula of x and the parameters s (the
 * shared ones in ew_math.h, so fused chains give the same bits). ATTR:
 * EW_CLONES for the compute-bound ones. */
#define EW_F32_UNARY(NAME, EXPR, ATTR)                                                    \
  static inline float ew_op_##NAME(float x, ew_scal s) {                                  \
    (void)s;                                                                              \
    return EXPR;                                                                          \
  }                                                                                       \
  EW_UN_DEFINE_ATTR(ew_##NAME##_f32, float, float, ew_op_##NAME, ATTR)

EW_F32_UNARY(abs, fabsf(x), )
EW_F32_UNARY(neg, -x, )
EW_F32_UNARY(reciprocal, 1.0f / x, )
EW_F32_UNARY(sign, es__ew_sign(x), )
EW_F32_UNARY(ceil, es__ew_ceil(x), )
EW_F32_UNARY(floor, es__ew_floor(x), )
EW_F32_UNARY(round, es__ew_round(x), )
EW_F32_UNARY(exp, es__ew_exp(x), EW_CLONES)
EW_F32_UNARY(log, es__ew_log(x), EW_CLONES)
EW_F32_UNARY(tanh, es__ew_tanh(x), EW_CLONES)
EW_F32_UNARY(erf, es__ew_erf(x), EW_CLONES)
EW_F32_UNARY(gelu, es__ew_gelu(x), EW_CLONES)
EW_F32_UNARY(gelu_tanh, es__ew_gelu_tanh(x), EW_CLONES)
EW_F32_UNARY(softplus, es__ew_softplus(x), EW_CLONES)
EW_F32_UNARY(mish, es__ew_mish(x), EW_CLONES)
EW_F32_UNARY(elu, es__ew_elu(x, s.f[0]), EW_CLONES)
EW_F32_UNARY(selu, es__ew_selu(x, s.f[0], s.f[1]), EW_CLONES)
EW_F32_UNARY(celu, es__ew_celu(x, s.f[0]), EW_CLONES)
EW_F32_UNARY(softsign, es__ew_softsign(x), )
EW_F32_UNARY(hardswish, es__ew_hardswish(x), )
EW_F32_UNARY(leakyrelu, es__ew_leakyrelu(x, s.f[0]), )
EW_F32_UNARY(thresholdedrelu, es__ew_thresholdedrelu(x, s.f[0]), )
EW_F32_UNARY(shrink, es__ew_shrink(x, s.f[0], s.f[1]), )
/* Rarely in a hot loop: libm, correctly rounded or nearly. */
EW_F32_UNARY(sin, sinf(x), )
EW_F32_UNARY(cos, cosf(x), )
EW_F32_UNARY(tan, tanf(x), )
EW_F32_UNARY(asin, asinf(x), )
EW_F32_UNARY(acos, acosf(x), )
EW_F32_UNARY(atan, atanf(x), )
EW_F32_UNARY(sinh, sinhf(x), )
EW_F32_UNARY(cosh, coshf(x), )
EW_F32_UNARY(asinh, asinhf(x), )
EW_F32_UNARY(acosh, acoshf(x), )
EW_F32_UNARY(atanh, atanhf(x), )

/* IsInf's flags: detect_positive in s.i[0], detect_negative in s.i[1]. */
#define EW_ISNAN(x, s) ((uint8_t)((x) != (x)))
#define EW_ISINF(x, s)                                                                    \
  ((uint8_t)((((x) == INFINITY) & (s.i[0] != 0)) | (((x) == -INFINITY) & (s.i[1] != 0))))
#define EW_NOT(x, s) ((uint8_t)((x) == 0))
EW_UN_DEFINE(ew_isnan_f32, float, uint8_t, EW_ISNAN)
EW_UN_DEFINE(ew_isinf_f32, float, uint8_t, EW_ISINF)
EW_UN_DEFINE(ew_not_b, uint8_t, uint8_t, EW_NOT)

/* Integer Abs, Neg and Sign: through the unsigned type, so the most
 * negative value wraps to itself as in two's complement numpy. */
#define EW_INT_UNARY(S, T, UT)                                                            \
  static inline T ew_op_abs_##S(T x, ew_scal s) {                                         \
    (void)s;                                                                              \
    return (T)(x < 0 ? 0u - (UT)x : (UT)x);                                               \
  }                                                                                       \
  static inline T ew_op_neg_##S(T x, ew_scal s) {                                         \
    (void)s;                                                                              \
    return (T)(0u - (UT)x);                                                               \
  }                                                                                       \
  static inline T ew_op_sign_##S(T x, ew_scal s) {                                        \
    (void)s;                                                                              \
    return (T)((x > 0) - (x < 0));                                                        \
  }                                                                                       \
  EW_UN_DEFINE(ew_abs_##S, T, T, ew_op_abs_##S)                                           \
  EW_UN_DEFINE(ew_neg_##S, T, T, ew_op_neg_##S)                                           \
  EW_UN_DEFINE(ew_sign_##S, T, T, ew_op_sign_##S)

EW_INT_UNARY(i32, int32_t, uint32_t)
EW_INT_UNARY(i64, int64_t, uint64_t)
EW_INT_UNARY(i8, int8_t, uint8_t)
#define EW_SIGN_U8(x, s) ((uint8_t)((x) != 0))
EW_UN_DEFINE(ew_sign_u8, uint8_t, uint8_t, EW_SIGN_U8)

/* ---- comparisons, logic, shifts, Mod, PRelu, Max and Min ------------------ */

#define EW_CMP_DEFINE(S, T)                                                               \
  static inline uint8_t ew_op_less_##S(T x, T y) { return x < y; }                       \
  static inline uint8_t ew_op_greater_##S(T x, T y) { return x > y; }                    \
  static inline uint8_t ew_op_le_##S(T x, T y) { return x <= y; }                        \
  static inline uint8_t ew_op_ge_##S(T x, T y) { return x >= y; }                        \
  EW_BIN_DEFINE(ew_less_##S, T, T, uint8_t, ew_op_less_##S)                               \
  EW_BIN_DEFINE(ew_greater_##S, T, T, uint8_t, ew_op_greater_##S)                         \
  EW_BIN_DEFINE(ew_le_##S, T, T, uint8_t, ew_op_le_##S)                                   \
  EW_BIN_DEFINE(ew_ge_##S, T, T, uint8_t, ew_op_ge_##S)

EW_CMP_DEFINE(f32, float)
EW_CMP_DEFINE(i32, int32_t)
EW_CMP_DEFINE(i64, int64_t)
EW_CMP_DEFINE(u8, uint8_t)
EW_CMP_DEFINE(i8, int8_t)

/* Bool operands: any nonzero byte is true; results are 0 or 1. */
static inline uint8_t ew_op_and_b(uint8_t x, uint8_t y) { return (x != 0) & (y != 0); }
static inline uint8_t ew_op_or_b(uint8_t x, uint8_t y) { return (x | y) != 0; }
static inline uint8_t ew_op_xor_b(uint8_t x, uint8_t y) { return (x != 0) ^ (y != 0); }
EW_BIN_DEFINE(ew_and_b, uint8_t, uint8_t, uint8_t, ew_op_and_b)
EW_BIN_DEFINE(ew_or_b, uint8_t, uint8_t, uint8_t, ew_op_or_b)
EW_BIN_DEFINE(ew_xor_b, uint8_t, uint8_t, uint8_t, ew_op_xor_b)

/* A shift by the type's width or more gives 0 (C leaves it undefined). */
static inline uint8_t ew_op_shl_u8(uint8_t x, uint8_t y) {
  return y >= 8 ? 0 : (uint8_t)((unsigned)x << y);
}
static inline uint8_t ew_op_shr_u8(uint8_t x, uint8_t y) { return y >= 8 ? 0 : (uint8_t)(x >> y); }
EW_BIN_DEFINE(ew_shl_u8, uint8_t, uint8_t, uint8_t, ew_op_shl_u8)
EW_BIN_DEFINE(ew_shr_u8, uint8_t, uint8_t, uint8_t, ew_op_shr_u8)

/* Mod. fmod = 1: C's remainder, the sign of the dividend; fmod = 0 (integers
 * only): the sign of the divisor, as Python's %. x mod 0 is 0 (numpy's
 * answer, and no trap), and so is MIN mod -1, whose C quotient overflows. */
#define EW_MOD_SIGNED(S, T)                                                               \
  static inline T ew_op_fmod_##S(T x, T y) { return y == 0 || y == -1 ? (T)0 : (T)(x % y); } \
  static inline T ew_op_mod_##S(T x, T y) {                                               \
    T r = ew_op_fmod_##S(x, y);                                                           \
    return r != 0 && (r < 0) != (y < 0) ? (T)(r + y) : r;                                 \
  }                                                                                       \
  EW_BIN_DEFINE(ew_fmod_##S, T, T, T, ew_op_fmod_##S)                                     \
  EW_BIN_DEFINE(ew_mod_##S, T, T, T, ew_op_mod_##S)

EW_MOD_SIGNED(i32, int32_t)
EW_MOD_SIGNED(i64, int64_t)
EW_MOD_SIGNED(i8, int8_t)
static inline uint8_t ew_op_mod_u8(uint8_t x, uint8_t y) { return y == 0 ? 0 : (uint8_t)(x % y); }
EW_BIN_DEFINE(ew_mod_u8, uint8_t, uint8_t, uint8_t, ew_op_mod_u8)
static inline float ew_op_fmod_f32(float x, float y) { return fmodf(x, y); }
EW_BIN_DEFINE(ew_fmod_f32, float, float, float, ew_op_fmod_f32)

/* PRelu, and Max and Min (which propagate NaN, ew_math.h). */
EW_BIN_DEFINE(ew_prelu_f32, float, float, float, es__ew_prelu)
#define EW_PRELU_INT(S, T, UT)                                                            \
  static inline T ew_op_prelu_##S(T x, T a) { return x < 0 ? (T)((UT)x * (UT)a) : x; }    \
  EW_BIN_DEFINE(ew_prelu_##S, T, T, T, ew_op_prelu_##S)
EW_PRELU_INT(i32, int32_t, uint32_t)
EW_PRELU_INT(i64, int64_t, uint64_t)

EW_BIN_DEFINE(ew_max_f32, float, float, float, es__ew_max)
EW_BIN_DEFINE(ew_min_f32, float, float, float, es__ew_min)
#define EW_MINMAX_INT(S, T)                                                               \
  static inline T ew_op_max_##S(T x, T y) { return x < y ? y : x; }                       \
  static inline T ew_op_min_##S(T x, T y) { return y < x ? y : x; }                       \
  EW_BIN_DEFINE(ew_max_##S, T, T, T, ew_op_max_##S)                                       \
  EW_BIN_DEFINE(ew_min_##S, T, T, T, ew_op_min_##S)
EW_MINMAX_INT(i32, int32_t)
EW_MINMAX_INT(i64, int64_t)
EW_MINMAX_INT(u8, uint8_t)
EW_MINMAX_INT(i8, int8_t)

/* Where: o = c ? x : y over element bytes (any type), each operand either
 * advancing (stride 1) or one value for the run (stride 0). Each element is
 * read before it is written, so o may be x, y or c. */
typedef void (*ew_where_fn)(const uint8_t *c, size_t sc, const void *x, size_t sx,
                            const void *y, size_t sy, void *o, size_t n);
#define EW_WHERE_DEFINE(NAME, T)                                                          \
  static void NAME(const uint8_t *c, size_t sc, const void *px, size_t sx, const void *py, \
                   size_t sy, void *po, size_t n) {                                       \
    const T *x = px, *y = py;                                                             \
    T *o = po;                                                                            \
    if (sc && sx && sy) {                                                                 \
      for (size_t i = 0; i < n; i++) {                                                    \
        T a = x[i], b = y[i];                                                             \
        o[i] = c[i] ? a : b;                                                              \
      }                                                                                   \
      return;                                                                             \
    }                                                                                     \
    for (size_t i = 0; i < n; i++) {                                                      \
      T a = x[i * sx], b = y[i * sy];                                                     \
      o[i] = c[i * sc] ? a : b;                                                           \
    }                                                                                     \
  }
EW_WHERE_DEFINE(ew_where_1, uint8_t)
EW_WHERE_DEFINE(ew_where_4, uint32_t)
EW_WHERE_DEFINE(ew_where_8, uint64_t)

/* ---- Cast ----------------------------------------------------------------- */

/* Integer narrowing wraps (two's complement, as numpy's astype); float to
 * integer truncates toward zero and saturates (8-bit targets wrap the
 * saturated int64, matching numpy for in-range values); anything to bool is
 * "nonzero" (NaN is true). */
#define EW_CAST_PLAIN(x, s) (x)
#define EW_CAST_BOOL(x, s) ((uint8_t)((x) != 0))
#define EW_CAST_F2I32(x, s) ew_d2i32(x)
#define EW_CAST_F2I64(x, s) ew_d2i64(x)
#define EW_CAST_F2U8(x, s) ((uint8_t)(uint64_t)ew_d2i64(x))
#define EW_CAST_F2I8(x, s) ((int8_t)ew_d2i64(x))

EW_UN_DEFINE(ew_cast_f32_f32, float, float, EW_CAST_PLAIN)
EW_UN_DEFINE(ew_cast_f32_i32, float, int32_t, EW_CAST_F2I32)
EW_UN_DEFINE(ew_cast_f32_i64, float, int64_t, EW_CAST_F2I64)
EW_UN_DEFINE(ew_cast_f32_u8, float, uint8_t, EW_CAST_F2U8)
EW_UN_DEFINE(ew_cast_f32_i8, float, int8_t, EW_CAST_F2I8)
EW_UN_DEFINE(ew_cast_f32_b, float, uint8_t, EW_CAST_BOOL)

#define EW_CAST_FROM_INT(S, T)                                                            \
  EW_UN_DEFINE(ew_cast_##S##_f32, T, float, EW_CAST_PLAIN)                                \
  EW_UN_DEFINE(ew_cast_##S##_i32, T, int32_t, EW_CAST_PLAIN)                              \
  EW_UN_DEFINE(ew_cast_##S##_i64, T, int64_t, EW_CAST_PLAIN)                              \
  EW_UN_DEFINE(ew_cast_##S##_u8, T, uint8_t, EW_CAST_PLAIN)                               \
  EW_UN_DEFINE(ew_cast_##S##_i8, T, int8_t, EW_CAST_PLAIN)                                \
  EW_UN_DEFINE(ew_cast_##S##_b, T, uint8_t, EW_CAST_BOOL)

EW_CAST_FROM_INT(i32, int32_t)
EW_CAST_FROM_INT(i64, int64_t)
EW_CAST_FROM_INT(u8, uint8_t)
EW_CAST_FROM_INT(i8, int8_t)
/* Bool bytes other than 0/1 still read as true. */
EW_CAST_FROM_INT(b, uint8_t)

/* ==========================================================================
 * Type slots and function tables
 * ======================================================================== */

enum { EW_F32, EW_I32, EW_I64, EW_U8, EW_I8, EW_BOOL, EW_NSLOT };

static int ew_slot(es_dtype t) {
  switch (t) {
  case ES_DTYPE_FLOAT:
    return EW_F32;
  case ES_DTYPE_INT32:
    return EW_I32;
  case ES_DTYPE_INT64:
    return EW_I64;
  case ES_DTYPE_UINT8:
    return EW_U8;
  case ES_DTYPE_INT8:
    return EW_I8;
  case ES_DTYPE_BOOL:
    return EW_BOOL;
  default:
    return -1;
  }
}

/* Arithmetic: float32, int32, int64, uint8, int8 (not bool). */
static const ew_bin_fns ew_add_fns[EW_BOOL] = {EW_BIN_FNS(ew_add_f32), EW_BIN_FNS(ew_add_i32),
                                               EW_BIN_FNS(ew_add_i64), EW_BIN_FNS(ew_add_u8),
                                               EW_BIN_FNS(ew_add_i8)};
static const ew_bin_fns ew_sub_fns[EW_BOOL] = {EW_BIN_FNS(ew_sub_f32), EW_BIN_FNS(ew_sub_i32),
                                               EW_BIN_FNS(ew_sub_i64), EW_BIN_FNS(ew_sub_u8),
                                               EW_BIN_FNS(ew_sub_i8)};
static const ew_bin_fns ew_mul_fns[EW_BOOL] = {EW_BIN_FNS(ew_mul_f32), EW_BIN_FNS(ew_mul_i32),
                                               EW_BIN_FNS(ew_mul_i64), EW_BIN_FNS(ew_mul_u8),
                                               EW_BIN_FNS(ew_mul_i8)};
static const ew_bin_fns ew_div_fns[EW_BOOL] = {EW_BIN_FNS(ew_div_f32), EW_BIN_FNS(ew_div_i32),
                                               EW_BIN_FNS(ew_div_i64), EW_BIN_FNS(ew_div_u8),
                                               EW_BIN_FNS(ew_div_i8)};
static const ew_bin_fns ew_equal_fns[EW_NSLOT] = {
    EW_BIN_FNS(ew_equal_f32), EW_BIN_FNS(ew_equal_i32), EW_BIN_FNS(ew_equal_i64),
    EW_BIN_FNS(ew_equal_u8),  EW_BIN_FNS(ew_equal_i8),  EW_BIN_FNS(ew_equal_b)};
/* Pow, [base][exponent] over float32, int32, int64. */
static const ew_bin_fns ew_pow_fns[3][3] = {
    {EW_BIN_FNS(ew_pow_ff), EW_BIN_FNS(ew_pow_fi32), EW_BIN_FNS(ew_pow_fi64)},
    {EW_BIN_FNS(ew_pow_i32f), EW_BIN_FNS(ew_pow_i32i32), EW_BIN_FNS(ew_pow_i32i64)},
    {EW_BIN_FNS(ew_pow_i64f), EW_BIN_FNS(ew_pow_i64i32), EW_BIN_FNS(ew_pow_i64i64)}};

/* Cast, [from][to]. The diagonal is a copy; infer replaces it by memcpy (or
 * nothing, in place) but it stays in the table for completeness. */
static const ew_un_fn ew_cast_fns[EW_NSLOT][EW_NSLOT] = {
    {ew_cast_f32_f32, ew_cast_f32_i32, ew_cast_f32_i64, ew_cast_f32_u8, ew_cast_f32_i8,
     ew_cast_f32_b},
    {ew_cast_i32_f32, ew_cast_i32_i32, ew_cast_i32_i64, ew_cast_i32_u8, ew_cast_i32_i8,
     ew_cast_i32_b},
    {ew_cast_i64_f32, ew_cast_i64_i32, ew_cast_i64_i64, ew_cast_i64_u8, ew_cast_i64_i8,
     ew_cast_i64_b},
    {ew_cast_u8_f32, ew_cast_u8_i32, ew_cast_u8_i64, ew_cast_u8_u8, ew_cast_u8_i8, ew_cast_u8_b},
    {ew_cast_i8_f32, ew_cast_i8_i32, ew_cast_i8_i64, ew_cast_i8_u8, ew_cast_i8_i8, ew_cast_i8_b},
    {ew_cast_b_f32, ew_cast_b_i32, ew_cast_b_i64, ew_cast_b_u8, ew_cast_b_i8, ew_cast_b_b}};

/* Comparisons, Max, Min over float32, int32, int64, uint8, int8. */
#define EW_NUMERIC_FNS(OP)                                                                \
  {EW_BIN_FNS(ew_##OP##_f32), EW_BIN_FNS(ew_##OP##_i32), EW_BIN_FNS(ew_##OP##_i64),       \
   EW_BIN_FNS(ew_##OP##_u8), EW_BIN_FNS(ew_##OP##_i8)}
static const ew_bin_fns ew_less_fns[EW_BOOL] = EW_NUMERIC_FNS(less);
static const ew_bin_fns ew_greater_fns[EW_BOOL] = EW_NUMERIC_FNS(greater);
static const ew_bin_fns ew_le_fns[EW_BOOL] = EW_NUMERIC_FNS(le);
static const ew_bin_fns ew_ge_fns[EW_BOOL] = EW_NUMERIC_FNS(ge);
static const ew_bin_fns ew_max_fns[EW_BOOL] = EW_NUMERIC_FNS(max);
static const ew_bin_fns ew_min_fns[EW_BOOL] = EW_NUMERIC_FNS(min);
/* Mod: fmod = 1 over every numeric slot; fmod = 0 over the integers (uint8's
 * two remainders agree). */
static const ew_bin_fns ew_fmod_fns[EW_BOOL] = {
    EW_BIN_FNS(ew_fmod_f32), EW_BIN_FNS(ew_fmod_i32), EW_BIN_FNS(ew_fmod_i64),
    EW_BIN_FNS(ew_mod_u8), EW_BIN_FNS(ew_fmod_i8)};
static const ew_bin_fns ew_mod_fns[EW_BOOL] = {
    {NULL, NULL, NULL}, EW_BIN_FNS(ew_mod_i32), EW_BIN_FNS(ew_mod_i64),
    EW_BIN_FNS(ew_mod_u8), EW_BIN_FNS(ew_mod_i8)};
/* PRelu over float32, int32, int64. */
static const ew_bin_fns ew_prelu_fns[3] = {EW_BIN_FNS(ew_prelu_f32), EW_BIN_FNS(ew_prelu_i32),
                                           EW_BIN_FNS(ew_prelu_i64)};

/* Clip over float32, int32, int64, uint8, int8. */
static const ew_un_fn ew_clip_fns[EW_BOOL] = {ew_clip_f32, ew_clip_i32, ew_clip_i64, ew_clip_u8,
                                              ew_clip_i8};

/* ==========================================================================
 * Binary ops: planning
 * ======================================================================== */

typedef enum ew_mode {
  EW_SAME,      /* both operands full: one flat vv run */
  EW_SCALAR_A,  /* a is one element: one sv run */
  EW_SCALAR_B,  /* b is one element: one vs run */
  EW_ROWS_A,    /* [R, K]: a is one row of K repeated R times */
  EW_ROWS_B,    /* same for b */
  EW_CHANNEL_A, /* [N, C, I]: a has one value per C, runs of I */
  EW_CHANNEL_B, /* same for b */
  EW_GENERAL,   /* strided walk over the collapsed outer dims */
} ew_mode;

typedef struct ew_binary_plan {
  ew_bin_fns fns;
  ew_un_fn fast;               /* Pow with static scalar exponent: o = fast(a) */
  ew_mode mode;
  size_t count;                /* output elements */
  size_t esz_a, esz_b, esz_o;  /* element bytes */
  size_t outer, chans, inner;  /* ROWS: outer x inner; CHANNEL: outer x chans x inner */
  int rank;                    /* GENERAL: collapsed rank (>= 2) */
  int64_t dims[ES_MAX_RANK];   /* collapsed output dims */
  int64_t st[2 * ES_MAX_RANK]; /* element strides per collapsed dim d: a's at 2d, b's at
                                  2d + 1 (es__walk_step's order); 0 if broadcast */
} ew_binary_plan;

/* Input types -> run functions and output type. */
static int ew_binary_select(es_kinst *k, const es_tdesc *a, const es_tdesc *b, ew_bin_fns *fns,
                            es_dtype *to) {
  es_op op = k->node.op;
  int sa = ew_slot(a->dtype), sb = ew_slot(b->dtype);
  if (op == ES_OP_Pow) {
    if (sa != EW_F32 && sa != EW_I32 && sa != EW_I64)
      return ES_KFAIL(k, ES_EMODEL, "base X has type %s, expected float32, int32 or int64",
                      es_dtype_name(a->dtype));
    if (sb == EW_BOOL || sb < 0)
      return ES_KFAIL(k, ES_EMODEL, "exponent Y has type %s, expected a numeric type",
                      es_dtype_name(b->dtype));
    if (sb != EW_F32 && sb != EW_I32 && sb != EW_I64)
      return ES_KFAIL(k, ES_ENOTSUP, "exponent Y of type %s is not implemented (float32, int32, "
                      "int64 are)", es_dtype_name(b->dtype));
    *fns = ew_pow_fns[sa][sb];
    *to = a->dtype;
    return 0;
  }
  if (a->dtype != b->dtype)
    return ES_KFAIL(k, ES_EMODEL, "input types differ (%s vs %s); both must be the same",
                    es_dtype_name(a->dtype), es_dtype_name(b->dtype));
  if (op == ES_OP_Equal) {
    if (sa < 0)
      return ES_KFAIL(k, ES_ENOTSUP, "Equal on %s is not implemented", es_dtype_name(a->dtype));
    *fns = ew_equal_fns[sa];
    *to = ES_DTYPE_BOOL;
    return 0;
  }
  *to = a->dtype;
  switch (op) {
  case ES_OP_And:
  case ES_OP_Or:
  case ES_OP_Xor:
    if (sa != EW_BOOL)
      return ES_KFAIL(k, ES_EMODEL, "inputs have type %s, expected bool", es_dtype_name(a->dtype));
    *fns = op == ES_OP_And  ? (ew_bin_fns)EW_BIN_FNS(ew_and_b)
           : op == ES_OP_Or ? (ew_bin_fns)EW_BIN_FNS(ew_or_b)
                            : (ew_bin_fns)EW_BIN_FNS(ew_xor_b);
    return 0;
  case ES_OP_BitShift: {
    const char *dir = NULL;
    int rc = es__attr_string(k, "direction", NULL, &dir);
    if (rc < 0)
      return rc;
    if (!dir || (strcmp(dir, "LEFT") && strcmp(dir, "RIGHT")))
      return ES_KFAIL(k, ES_EMODEL, "attribute 'direction' must be \"LEFT\" or \"RIGHT\"%s",
                      dir ? "" : " (it is required)");
    if (sa != EW_U8)
      return ES_KFAIL(k, ES_EMODEL, "inputs have type %s, expected an unsigned integer type",
                      es_dtype_name(a->dtype));
    *fns = dir[0] == 'L' ? (ew_bin_fns)EW_BIN_FNS(ew_shl_u8) : (ew_bin_fns)EW_BIN_FNS(ew_shr_u8);
    return 0;
  }
  case ES_OP_PRelu:
    if (sa != EW_F32 && sa != EW_I32 && sa != EW_I64)
      return ES_KFAIL(k, ES_EMODEL, "inputs have type %s, expected float32, int32 or int64",
                      es_dtype_name(a->dtype));
    *fns = ew_prelu_fns[sa];
    return 0;
  default:
    break;
  }
  if (sa < 0 || sa == EW_BOOL)
    return ES_KFAIL(k, ES_EMODEL, "inputs have type %s, expected float32, int32, int64, uint8 "
                    "or int8", es_dtype_name(a->dtype));
  switch (op) {
  case ES_OP_Add:
    *fns = ew_add_fns[sa];
    break;
  case ES_OP_Sub:
    *fns = ew_sub_fns[sa];
    break;
  case ES_OP_Mul:
    *fns = ew_mul_fns[sa];
    break;
  case ES_OP_Less:
  case ES_OP_Greater:
  case ES_OP_LessOrEqual:
  case ES_OP_GreaterOrEqual:
    *fns = op == ES_OP_Less             ? ew_less_fns[sa]
           : op == ES_OP_Greater        ? ew_greater_fns[sa]
           : op == ES_OP_LessOrEqual    ? ew_le_fns[sa]
                                        : ew_ge_fns[sa];
    *to = ES_DTYPE_BOOL;
    break;
  case ES_OP_Mod: {
    int64_t fmod;
    int rc = es__attr_int(k, "fmod", 0, &fmod);
    if (rc < 0)
      return rc;
    if (fmod != 0 && fmod != 1)
      return ES_KFAIL(k, ES_EMODEL, "attribute 'fmod' is %lld, expected 0 or 1", (long long)fmod);
    if (sa == EW_F32 && !fmod)
      return ES_KFAIL(k, ES_EMODEL, "float32 inputs need fmod = 1 (fmod = 0 is for integers)");
    *fns = fmod ? ew_fmod_fns[sa] : ew_mod_fns[sa];
    break;
  }
  default:
    *fns = ew_div_fns[sa];
    break;
  }
  return 0;
}

/* Collapse the broadcast into p->dims/sa/sb (see the design note) and pick
 * the mode. o is the broadcast output (count > 0). */
static void ew_binary_layout(ew_binary_plan *p, const es_tdesc *a, const es_tdesc *b,
                             const es_tdesc *o) {
  int r = 0;
  int full_a[ES_MAX_RANK], full_b[ES_MAX_RANK];
  for (int i = 0; i < o->rank; i++) {
    int ia = i - (o->rank - a->rank), ib = i - (o->rank - b->rank);
    int64_t d = o->dims[i];
    if (d == 1)
      continue;
    int fa = ia >= 0 && a->dims[ia] == d, fb = ib >= 0 && b->dims[ib] == d;
    if (r > 0 && full_a[r - 1] == fa && full_b[r - 1] == fb) {
      p->dims[r - 1] *= d;
      continue;
    }
    full_a[r] = fa;
    full_b[r] = fb;
    p->dims[r++] = d;
  }
  int64_t acc_a = 1, acc_b = 1;
  for (int i = r - 1; i >= 0; i--) {
    p->st[2 * i] = full_a[i] ? acc_a : 0;
    p->st[2 * i + 1] = full_b[i] ? acc_b : 0;
    acc_a *= full_a[i] ? p->dims[i] : 1;
    acc_b *= full_b[i] ? p->dims[i] : 1;
  }
  p->rank = r;
  p->mode = EW_GENERAL;
  if (r <= 1) {
    /* r == 0: a single element on both sides. */
    p->mode = r == 0 || (full_a[0] && full_b[0]) ? EW_SAME : full_a[0] ? EW_SCALAR_B : EW_SCALAR_A;
  } else if (r == 2 && full_a[0] && full_a[1] && full_b[1] != full_b[0]) {
    p->mode = full_b[1] ? EW_ROWS_B : EW_CHANNEL_B;
  } else if (r == 2 && full_b[0] && full_b[1] && full_a[1] != full_a[0]) {
    p->mode = full_a[1] ? EW_ROWS_A : EW_CHANNEL_A;
  } else if (r == 3 && full_a[0] && full_a[1] && full_a[2] && !full_b[0] && full_b[1] &&
             !full_b[2]) {
    p->mode = EW_CHANNEL_B;
  } else if (r == 3 && full_b[0] && full_b[1] && full_b[2] && !full_a[0] && full_a[1] &&
             !full_a[2]) {
    p->mode = EW_CHANNEL_A;
  }
  /* ROWS: outer x inner. CHANNEL: outer x chans x inner (outer 1 at rank 2). */
  p->inner = r >= 1 ? (size_t)p->dims[r - 1] : 1;
  p->outer = r >= 2 ? (size_t)p->dims[0] : 1;
  p->chans = 1;
  if (p->mode == EW_CHANNEL_A || p->mode == EW_CHANNEL_B) {
    p->chans = (size_t)p->dims[r - 2];
    p->outer = r == 3 ? (size_t)p->dims[0] : 1;
  }
}

/* Pow x^2 and x^0.5 with the exponent a static scalar. */
static ew_un_fn ew_pow_fast(const es_kinst *k) {
  const es_tdesc *a = k->in[0], *b = k->in[1];
  const void *e = k->in_static[1];
  if (a->dtype != ES_DTYPE_FLOAT || !e || b->count != 1)
    return NULL;
  double v;
  if (b->dtype == ES_DTYPE_FLOAT) {
    float f;
    memcpy(&f, e, sizeof f);
    v = f;
  } else {
    v = (double)es__static_i64(b, e, 0);
  }
  return v == 2.0 ? ew_pow_square_f32 : v == 0.5 ? ew_sqrt_f32 : NULL;
}

/* Physical dims of t broadcast into a channels-last output of rank `rank`
 * (es__tdesc_cl_view: right-aligned, then N, spatial..., C). For a
 * compatible plain tensor the permutation only moves dims of size 1, so
 * its bytes are read as they are. */
static void ew_nhwc_view(const es_tdesc *t, int rank, es_tdesc *v) {
  *v = *t;
  v->layout = ES_LAYOUT_NHWC;
  v->rank = rank;
  es__tdesc_cl_view(t, rank, v->dims);
}


static int ew_binary_infer(es_kinst *k) {
  if (k->n_in != 2)
    return ES_KFAIL(k, ES_EMODEL, "expects 2 inputs, got %d", k->n_in);
  if (!k->in[0] || !k->in[1])
    return ES_KFAIL(k, ES_EMODEL, "input %s is omitted; both inputs are required",
                    k->in[0] ? "B" : "A");
  if (k->n_out != 1 || !k->out[0])
    return ES_KFAIL(k, ES_EMODEL, "expects 1 output, got %d", k->n_out);
  const es_tdesc *a = k->in[0], *b = k->in[1];
  ew_binary_plan *p = es__kinst_alloc(k, sizeof *p);
  if (!p)
    return ES_KFAIL(k, ES_ENOMEM, "out of memory for the plan");
  es_dtype to = ES_DTYPE_UNDEFINED;
  int rc = ew_binary_select(k, a, b, &p->fns, &to);
  if (rc < 0)
    return rc;
  int rank;
  int64_t dims[ES_MAX_RANK];
  rc = es__broadcast_shape(k, a, b, &rank, dims);
  if (rc < 0)
    return rc;
  /* PRelu's slope broadcasts to X, never X to the slope. */
  if (k->node.op == ES_OP_PRelu) {
    int same = rank == a->rank;
    for (int i = 0; same && i < rank; i++)
      same = dims[i] == a->dims[i];
    if (!same)
      return ES_KFAIL(k, ES_EMODEL, "slope (rank %d) does not broadcast to the shape of X "
                      "(rank %d) without changing it", b->rank, a->rank);
  }
  int nhwc;
  rc = es__broadcast_layout_pick(k, 2, rank, &nhwc);
  if (rc != 0)
    return rc;
  es_tdesc *o = k->out[0];
  rc = es__tdesc_set(o, to, rank, dims);
  if (rc < 0)
    return rc;
  if (nhwc)
    o->layout = ES_LAYOUT_NHWC;
  p->count = o->count;
  p->esz_a = es_dtype_size(a->dtype);
  p->esz_b = es_dtype_size(b->dtype);
  p->esz_o = es_dtype_size(to);
  /* b is one element, so a has the output's shape and, in either layout,
   * its bytes order. */
  if (k->node.op == ES_OP_Pow)
    p->fast = ew_pow_fast(k);
  if (p->count && nhwc) {
    es_tdesc va, vb, vo;
    ew_nhwc_view(a, o->rank, &va);
    ew_nhwc_view(b, o->rank, &vb);
    ew_nhwc_view(o, o->rank, &vo);
    ew_binary_layout(p, &va, &vb, &vo);
  } else if (p->count) {
    ew_binary_layout(p, a, b, o);
  }
  k->params = p;
  k->inplace = -1;
  for (int i = 0; i < 2 && k->inplace < 0; i++)
    if (k->in[i]->dtype == to && es__tdesc_same_shape(k->in[i], o))
      k->inplace = i;
  return 0;
}

/* ==========================================================================
 * Binary ops: running
 * ======================================================================== */

/* Innermost collapsed dim as one run; outer dims by the stride walk. */
static void ew_binary_general(const ew_binary_plan *p, const char *a, const char *b, char *o) {
  int r = p->rank;
  size_t inner = (size_t)p->dims[r - 1];
  const int64_t *sl = p->st + 2 * (r - 1);
  ew_bin_fn fn = sl[0] && sl[1] ? p->fns.vv : sl[0] ? p->fns.vs : p->fns.sv;
  size_t outer = p->count / inner;
  int64_t idx[ES_MAX_RANK] = {0};
  int64_t off[2] = {0, 0};
  for (size_t t = 0; t < outer; t++) {
    fn(a + (size_t)off[0] * p->esz_a, b + (size_t)off[1] * p->esz_b, o + t * inner * p->esz_o,
       inner);
    es__walk_step(r - 1, p->dims, idx, 2, off, p->st);
  }
}

static int ew_binary_run(const es_kinst *k, const void *const *in, void *const *out,
                         void *scratch) {
  (void)scratch;
  const ew_binary_plan *p = k->params;
  const char *a = in[0], *b = in[1];
  char *o = out[0];
  if (p->count == 0)
    return 0;
  if (p->fast) {
    p->fast(a, o, p->count, NULL);
    return 0;
  }
  size_t ea = p->esz_a, eb = p->esz_b, eo = p->esz_o, inner = p->inner;
  switch (p->mode) {
  case EW_SAME:
    p->fns.vv(a, b, o, p->count);
    break;
  case EW_SCALAR_A:
    p->fns.sv(a, b, o, p->count);
    break;
  case EW_SCALAR_B:
    p->fns.vs(a, b, o, p->count);
    break;
  case EW_ROWS_A:
    for (size_t r = 0; r < p->outer; r++)
      p->fns.vv(a, b + r * inner * eb, o + r * inner * eo, inner);
    break;
  case EW_ROWS_B:
    for (size_t r = 0; r < p->outer; r++)
      p->fns.vv(a + r * inner * ea, b, o + r * inner * eo, inner);
    break;
  case EW_CHANNEL_A:
    for (size_t n = 0, blk = 0; n < p->outer; n++)
      for (size_t c = 0; c < p->chans; c++, blk++)
        p->fns.sv(a + c * ea, b + blk * inner * eb, o + blk * inner * eo, inner);
    break;
  case EW_CHANNEL_B:
    for (size_t n = 0, blk = 0; n < p->outer; n++)
      for (size_t c = 0; c < p->chans; c++, blk++)
        p->fns.vs(a + blk * inner * ea, b + c * eb, o + blk * inner * eo, inner);
    break;
  case EW_GENERAL:
    ew_binary_general(p, a, b, o);
    break;
  }
  return 0;
}

/* ==========================================================================
 * Unary ops
 * ======================================================================== */

typedef struct ew_unary_plan {
  ew_un_fn fn;   /* NULL: a copy (Cast to the same type) */
  ew_scal s;
  es_dtype dtype;
  int rt_min;    /* Clip: input index of a bound known only at run time, or 0 */
  int rt_max;
  size_t count;
  size_t nbytes;
} ew_unary_plan;

/* Check one input, one output; output = input's shape with type `to`. */
static int ew_unary_begin(es_kinst *k, int max_in, ew_unary_plan **pp) {
  if (k->n_in < 1 || k->n_in > max_in)
    return ES_KFAIL(k, ES_EMODEL, "expects %s input%s, got %d",
                    max_in == 1 ? "1" : "1 to 3", max_in == 1 ? "" : "s", k->n_in);
  if (!k->in[0])
    return ES_KFAIL(k, ES_EMODEL, "input 0 is omitted; it is required");
  if (k->n_out != 1 || !k->out[0])
    return ES_KFAIL(k, ES_EMODEL, "expects 1 output, got %d", k->n_out);
  ew_unary_plan *p = es__kinst_alloc(k, sizeof *p);
  if (!p)
    return ES_KFAIL(k, ES_ENOMEM, "out of memory for the plan");
  p->dtype = k->in[0]->dtype;
  p->count = k->in[0]->count;
  k->params = p;
  *pp = p;
  return 0;
}

static int ew_unary_end(es_kinst *k, ew_unary_plan *p, es_dtype to) {
  const es_tdesc *x = k->in[0];
  int rc = es__tdesc_set(k->out[0], to, x->rank, x->dims);
  if (rc < 0)
    return rc;
  k->out[0]->layout = x->layout;
  p->nbytes = k->out[0]->nbytes;
  k->inplace = to == x->dtype ? 0 : -1;
  return 0;
}

static int ew_need_float(es_kinst *k) {
  if (k->in[0]->dtype != ES_DTYPE_FLOAT)
    return ES_KFAIL(k, ES_EMODEL, "input has type %s, expected float32",
                    es_dtype_name(k->in[0]->dtype));
  return 0;
}

static int ew_relu_infer(es_kinst *k) {
  ew_unary_plan *p = NULL;
  int rc = ew_unary_begin(k, 1, &p);
  if (rc < 0)
    return rc;
  switch (p->dtype) {
  case ES_DTYPE_FLOAT:
    p->fn = ew_relu_f32;
    break;
  case ES_DTYPE_INT32:
    p->fn = ew_relu_i32;
    break;
  case ES_DTYPE_INT64:
    p->fn = ew_relu_i64;
    break;
  case ES_DTYPE_INT8:
    p->fn = ew_relu_i8;
    break;
  default:
    return ES_KFAIL(k, ES_EMODEL, "input has type %s, expected float32, int32, int64 or int8",
                    es_dtype_name(p->dtype));
  }
  return ew_unary_end(k, p, p->dtype);
}

static int ew_float_unary_infer(es_kinst *k, ew_un_fn fn) {
  ew_unary_plan *p = NULL;
  int rc = ew_unary_begin(k, 1, &p);
  if (rc == 0)
    rc = ew_need_float(k);
  if (rc < 0)
    return rc;
  p->fn = fn;
  return ew_unary_end(k, p, ES_DTYPE_FLOAT);
}

static int ew_sigmoid_infer(es_kinst *k) { return ew_float_unary_infer(k, ew_sigmoid_f32); }
static int ew_sqrt_infer(es_kinst *k) { return ew_float_unary_infer(k, ew_sqrt_f32); }

static int ew_hardsigmoid_infer(es_kinst *k) {
  int rc = ew_float_unary_infer(k, ew_hardsigmoid_f32);
  if (rc < 0)
    return rc;
  ew_unary_plan *p = k->params;
  rc = es__attr_float(k, "alpha", 0.2f, &p->s.f[0]);
  if (rc == 0)
    rc = es__attr_float(k, "beta", 0.5f, &p->s.f[1]);
  return rc;
}

/* Clip bound `which` (0 min, 1 max) from a scalar of the input's type. */
static void ew_clip_bound_load(ew_scal *s, int which, es_dtype t, const void *data) {
  switch (t) {
  case ES_DTYPE_FLOAT:
    memcpy(&s->f[which], data, sizeof(float));
    break;
  case ES_DTYPE_INT32: {
    int32_t v;
    memcpy(&v, data, sizeof v);
    s->i[which] = v;
    break;
  }
  case ES_DTYPE_INT64:
    memcpy(&s->i[which], data, sizeof(int64_t));
    break;
  case ES_DTYPE_UINT8:
    s->i[which] = *(const uint8_t *)data;
    break;
  default:
    s->i[which] = *(const int8_t *)data;
    break;
  }
}

static int ew_clip_infer(es_kinst *k) {
  ew_unary_plan *p = NULL;
  int rc = ew_unary_begin(k, k->opset < 11 ? 1 : 3, &p);
  if (rc < 0)
    return rc;
  int slot = ew_slot(p->dtype);
  if (k->opset < 11 && slot != EW_F32)
    return ES_KFAIL(k, ES_EMODEL, "input has type %s, expected float32 before opset 11",
                    es_dtype_name(p->dtype));
  if (slot < 0 || slot == EW_BOOL)
    return ES_KFAIL(k, ES_EMODEL, "input has type %s, expected float32, int32, int64, uint8 "
                    "or int8", es_dtype_name(p->dtype));
  p->fn = ew_clip_fns[slot];
  /* No bound: the type's whole range (infinities for float). */
  p->s.f[0] = -INFINITY;
  p->s.f[1] = INFINITY;
  switch (p->dtype) {
  case ES_DTYPE_INT32:
    p->s.i[0] = INT32_MIN;
    p->s.i[1] = INT32_MAX;
    break;
  case ES_DTYPE_INT64:
    p->s.i[0] = INT64_MIN;
    p->s.i[1] = INT64_MAX;
    break;
  case ES_DTYPE_UINT8:
    p->s.i[0] = 0;
    p->s.i[1] = UINT8_MAX;
    break;
  case ES_DTYPE_INT8:
    p->s.i[0] = INT8_MIN;
    p->s.i[1] = INT8_MAX;
    break;
  default:
    break;
  }
  if (k->opset < 11) {
    rc = es__attr_float(k, "min", -INFINITY, &p->s.f[0]);
    if (rc == 0)
      rc = es__attr_float(k, "max", INFINITY, &p->s.f[1]);
    if (rc < 0)
      return rc;
    return ew_unary_end(k, p, p->dtype);
  }
  for (int i = 1; i < k->n_in; i++) {
    const es_tdesc *t = k->in[i];
    if (!t)
      continue;
    const char *name = i == 1 ? "min" : "max";
    if (t->dtype != p->dtype)
      return ES_KFAIL(k, ES_EMODEL, "input '%s' has type %s, expected %s like the data", name,
                      es_dtype_name(t->dtype), es_dtype_name(p->dtype));
    if (t->count != 1)
      return ES_KFAIL(k, ES_EMODEL, "input '%s' has %zu elements, expected a scalar", name,
                      t->count);
    if (k->in_static[i])
      ew_clip_bound_load(&p->s, i - 1, t->dtype, k->in_static[i]);
    else if (i == 1)
      p->rt_min = 1;
    else
      p->rt_max = 2;
  }
  return ew_unary_end(k, p, p->dtype);
}

static int ew_cast_infer(es_kinst *k) {
  ew_unary_plan *p = NULL;
  int rc = ew_unary_begin(k, 1, &p);
  if (rc < 0)
    return rc;
  if (!es__kattr(k, "to"))
    return ES_KFAIL(k, ES_EMODEL, "attribute 'to' is required");
  int64_t to;
  rc = es__attr_int(k, "to", 0, &to);
  if (rc < 0)
    return rc;
  /* ONNX data types are 1..23 (through FLOAT4E2M1). */
  if (to < 1 || to > 23)
    return ES_KFAIL(k, ES_EMODEL, "attribute 'to' = %lld is not an ONNX data type", (long long)to);
  int from_slot = ew_slot(p->dtype), to_slot = ew_slot((es_dtype)to);
  if (to_slot < 0)
    return ES_KFAIL(k, ES_ENOTSUP, "Cast to data type %lld is not implemented (float32, int32, "
                    "int64, uint8, int8 and bool are)", (long long)to);
  if (from_slot < 0)
    return ES_KFAIL(k, ES_ENOTSUP, "Cast from %s is not implemented", es_dtype_name(p->dtype));
  /* Same type: a plain copy, or nothing when the planner runs it in place. */
  p->fn = from_slot == to_slot ? NULL : ew_cast_fns[from_slot][to_slot];
  return ew_unary_end(k, p, (es_dtype)to);
}

static int ew_unary_run(const es_kinst *k, const void *const *in, void *const *out,
                        void *scratch) {
  (void)scratch;
  const ew_unary_plan *p = k->params;
  if (!p->fn) {
    if (out[0] != in[0] && p->nbytes)
      memcpy(out[0], in[0], p->nbytes);
    return 0;
  }
  if (p->rt_min || p->rt_max) {
    ew_scal s = p->s;
    if (p->rt_min)
      ew_clip_bound_load(&s, 0, p->dtype, in[p->rt_min]);
    if (p->rt_max)
      ew_clip_bound_load(&s, 1, p->dtype, in[p->rt_max]);
    p->fn(in[0], out[0], p->count, &s);
    return 0;
  }
  p->fn(in[0], out[0], p->count, &p->s);
  return 0;
}

/* ---- math, logic and activations: one table ------------------------------- */

/* Element types by slot, for messages. */
static const es_dtype ew_slot_dtype[EW_NSLOT] = {ES_DTYPE_FLOAT, ES_DTYPE_INT32, ES_DTYPE_INT64,
                                                 ES_DTYPE_UINT8, ES_DTYPE_INT8,  ES_DTYPE_BOOL};

typedef struct ew_unary_def {
  es_op op;
  ew_un_fn fn[EW_NSLOT]; /* by input type slot; NULL: not for that type */
  uint8_t to_bool;       /* the output is bool (IsNaN, IsInf) */
  uint8_t ints_notsup;   /* ONNX allows integer inputs that are not implemented */
} ew_unary_def;

#define EW_F32_DEF(OP, FN) {ES_OP_##OP, {[EW_F32] = FN}, 0, 0}
static const ew_unary_def ew_unary_defs[] = {
    {ES_OP_Abs, {ew_abs_f32, ew_abs_i32, ew_abs_i64, ew_cast_u8_u8, ew_abs_i8, NULL}, 0, 0},
    {ES_OP_Neg, {ew_neg_f32, ew_neg_i32, ew_neg_i64, NULL, ew_neg_i8, NULL}, 0, 0},
    {ES_OP_Sign, {ew_sign_f32, ew_sign_i32, ew_sign_i64, ew_sign_u8, ew_sign_i8, NULL}, 0, 0},
    {ES_OP_Not, {[EW_BOOL] = ew_not_b}, 0, 0},
    {ES_OP_IsNaN, {[EW_F32] = ew_isnan_f32}, 1, 0},
    {ES_OP_IsInf, {[EW_F32] = ew_isinf_f32}, 1, 0},
    {ES_OP_Erf, {[EW_F32] = ew_erf_f32}, 0, 1},
    {ES_OP_Shrink, {[EW_F32] = ew_shrink_f32}, 0, 1},
    EW_F32_DEF(Ceil, ew_ceil_f32),
    EW_F32_DEF(Floor, ew_floor_f32),
    EW_F32_DEF(Round, ew_round_f32),
    EW_F32_DEF(Exp, ew_exp_f32),
    EW_F32_DEF(Log, ew_log_f32),
    EW_F32_DEF(Reciprocal, ew_reciprocal_f32),
    EW_F32_DEF(Tanh, ew_tanh_f32),
    EW_F32_DEF(Sin, ew_sin_f32),
    EW_F32_DEF(Cos, ew_cos_f32),
    EW_F32_DEF(Tan, ew_tan_f32),
    EW_F32_DEF(Asin, ew_asin_f32),
    EW_F32_DEF(Acos, ew_acos_f32),
    EW_F32_DEF(Atan, ew_atan_f32),
    EW_F32_DEF(Sinh, ew_sinh_f32),
    EW_F32_DEF(Cosh, ew_cosh_f32),
    EW_F32_DEF(Asinh, ew_asinh_f32),
    EW_F32_DEF(Acosh, ew_acosh_f32),
    EW_F32_DEF(Atanh, ew_atanh_f32),
    EW_F32_DEF(LeakyRelu, ew_leakyrelu_f32),
    EW_F32_DEF(Elu, ew_elu_f32),
    EW_F32_DEF(Selu, ew_selu_f32),
    EW_F32_DEF(Celu, ew_celu_f32),
    EW_F32_DEF(Softplus, ew_softplus_f32),
    EW_F32_DEF(Softsign, ew_softsign_f32),
    EW_F32_DEF(Mish, ew_mish_f32),
    EW_F32_DEF(HardSwish, ew_hardswish_f32),
    EW_F32_DEF(ThresholdedRelu, ew_thresholdedrelu_f32),
    EW_F32_DEF(Gelu, ew_gelu_f32),
};

static const ew_unary_def *ew_unary_def_of(es_op op) {
  for (size_t i = 0; i < sizeof ew_unary_defs / sizeof ew_unary_defs[0]; i++)
    if (ew_unary_defs[i].op == op)
      return &ew_unary_defs[i];
  return NULL;
}

/* The operator's float attributes into p->s.f (defaults from the spec). */
static int ew_math_attrs(es_kinst *k, ew_unary_plan *p) {
  int rc = 0;
  switch (k->node.op) {
  case ES_OP_LeakyRelu:
    return es__attr_float(k, "alpha", 0.01f, &p->s.f[0]);
  case ES_OP_Elu:
  case ES_OP_ThresholdedRelu:
    return es__attr_float(k, "alpha", 1.0f, &p->s.f[0]);
  case ES_OP_Celu:
    if ((rc = es__attr_float(k, "alpha", 1.0f, &p->s.f[0])) < 0)
      return rc;
    if (p->s.f[0] == 0.0f || p->s.f[0] != p->s.f[0])
      return ES_KFAIL(k, ES_EMODEL, "attribute 'alpha' is %g; Celu divides by it",
                      (double)p->s.f[0]);
    return 0;
  case ES_OP_Selu:
    if ((rc = es__attr_float(k, "alpha", 1.67326319217681884765625f, &p->s.f[0])) == 0)
      rc = es__attr_float(k, "gamma", 1.05070102214813232421875f, &p->s.f[1]);
    return rc;
  case ES_OP_Shrink:
    if ((rc = es__attr_float(k, "bias", 0.0f, &p->s.f[0])) == 0)
      rc = es__attr_float(k, "lambd", 0.5f, &p->s.f[1]);
    return rc;
  case ES_OP_IsInf:
    if ((rc = es__attr_int(k, "detect_positive", 1, &p->s.i[0])) == 0)
      rc = es__attr_int(k, "detect_negative", 1, &p->s.i[1]);
    return rc;
  case ES_OP_Gelu: {
    const char *ap;
    if ((rc = es__attr_string(k, "approximate", "none", &ap)) < 0)
      return rc;
    if (!strcmp(ap, "tanh"))
      p->fn = ew_gelu_tanh_f32;
    else if (strcmp(ap, "none"))
      return ES_KFAIL(k, ES_EMODEL, "attribute 'approximate' is \"%.40s\", expected \"none\" or "
                      "\"tanh\"", ap);
    return 0;
  }
  default:
    return 0;
  }
}

static int ew_math_infer(es_kinst *k) {
  const ew_unary_def *d = ew_unary_def_of(k->node.op);
  ew_unary_plan *p = NULL;
  int rc = ew_unary_begin(k, 1, &p);
  if (rc < 0)
    return rc;
  int slot = ew_slot(p->dtype);
  p->fn = slot >= 0 ? d->fn[slot] : NULL;
  if (!p->fn) {
    char types[96] = "";
    for (int t = 0; t < EW_NSLOT; t++)
      if (d->fn[t])
        snprintf(types + strlen(types), sizeof types - strlen(types), "%s%s",
                 types[0] ? ", " : "", es_dtype_name(ew_slot_dtype[t]));
    int later = d->ints_notsup && slot >= EW_I32 && slot <= EW_I8;
    return ES_KFAIL(k, later ? ES_ENOTSUP : ES_EMODEL, "input has type %s, %s %s",
                    es_dtype_name(p->dtype), later ? "not implemented; implemented:" : "expected",
                    types);
  }
  if ((rc = ew_math_attrs(k, p)) < 0)
    return rc;
  return ew_unary_end(k, p, d->to_bool ? ES_DTYPE_BOOL : p->dtype);
}

/* ==========================================================================
 * Variadic Max, Min, Sum, Mean and Where: n broadcast operands
 * ======================================================================== */

/* The binary plan's collapse over n operands: output dims of size 1 are
 * dropped and neighbours merged where every operand is full in both or
 * broadcast in both. The innermost collapsed dim is a row, along which
 * each operand advances (stride 1) or is one value (stride 0); rows are
 * walked by the odometer (walk.h), with one offset per operand in scratch
 * (n is unbounded). A row of Max(a, b, c) is o = max(a, b), then o =
 * max(o, c): pairwise in input order, as numpy's reduce, with the binary
 * ops' run functions. */
typedef struct ew_nary_plan {
  int n;
  ew_bin_fns fns;       /* Max, Min, Sum, Mean: the pairwise op */
  ew_where_fn where;    /* Where (operands cond, x, y); NULL otherwise */
  float mean_n;         /* Mean: the divisor; 0 otherwise */
  size_t esz_o;         /* element bytes of the output and of every operand but a
                           condition (bool, 1 byte) */
  size_t count;         /* output elements */
  int rank;             /* collapsed, >= 1 */
  int64_t dims[ES_MAX_RANK];
  int64_t *st;          /* [rank][n] element strides, 0 where broadcast */
} ew_nary_plan;

/* NHWC when the output is rank 4 and every input is NHWC or reads in NHWC
 * order as it is (es__tdesc_nhwc_compatible); otherwise the NHWC inputs
 * are asked for in plain (simpler than the binary ops' rule, which may
 * convert a plain input to NHWC instead: these ops are rare in the
 * channels-last part of a network). */
static int ew_nary_layout(es_kinst *k, int rank, int *nhwc) {
  int any = 0, ok = rank == 4;
  for (int i = 0; i < k->n_in; i++) {
    if (k->in[i]->layout == ES_LAYOUT_NHWC)
      any = 1;
    else if (!es__tdesc_nhwc_compatible(k->in[i]))
      ok = 0;
  }
  *nhwc = any && ok;
  if (!any || ok)
    return 0;
  k->want_plain = 0;
  for (int i = 0; i < k->n_in; i++)
    if (k->in[i]->layout == ES_LAYOUT_NHWC) {
      if (i >= 32)
        return ES_KFAIL(k, ES_ENOTSUP, "input %d is channels-last; past 32 inputs a layout "
                        "conversion cannot be asked for", i);
      k->want_plain |= 1u << i;
    }
  return ES_KRELAYOUT;
}

static int ew_nary_collapse(es_kinst *k, ew_nary_plan *p, const es_tdesc *o, int nhwc) {
  int n = p->n;
  es_tdesc vo, *v = es__kinst_alloc(k, (size_t)n * sizeof *v);
  unsigned char *full = es__kinst_alloc(k, (size_t)n * ES_MAX_RANK);
  p->st = es__kinst_alloc(k, (size_t)n * ES_MAX_RANK * sizeof *p->st);
  if (!v || !full || !p->st)
    return ES_KFAIL(k, ES_ENOMEM, "out of memory for the plan");
  vo = *o;
  if (nhwc)
    ew_nhwc_view(o, o->rank, &vo);
  for (int i = 0; i < n; i++) {
    v[i] = *k->in[i];
    if (nhwc)
      ew_nhwc_view(k->in[i], o->rank, &v[i]);
  }
  int r = 0;
  for (int d = 0; d < vo.rank; d++) {
    if (vo.dims[d] == 1)
      continue;
    unsigned char *f = full + (size_t)r * (size_t)n;
    int same = r > 0;
    for (int i = 0; i < n; i++) {
      int di = d - (vo.rank - v[i].rank);
      f[i] = di >= 0 && v[i].dims[di] == vo.dims[d];
      same = same && f[i] == f[i - n];
    }
    if (same)
      p->dims[r - 1] *= vo.dims[d];
    else
      p->dims[r++] = vo.dims[d];
  }
  if (r == 0) { /* one element */
    for (int i = 0; i < n; i++)
      full[i] = 0;
    p->dims[0] = 1;
    r = 1;
  }
  p->rank = r;
  for (int i = 0; i < n; i++) {
    int64_t acc = 1;
    for (int d = r - 1; d >= 0; d--) {
      int f = full[(size_t)d * (size_t)n + (size_t)i];
      p->st[(size_t)d * (size_t)n + (size_t)i] = f ? acc : 0;
      acc *= f ? p->dims[d] : 1;
    }
  }
  return 0;
}

static int ew_nary_infer(es_kinst *k) {
  es_op op = k->node.op;
  int n = k->n_in, where = op == ES_OP_Where;
  if (where ? n != 3 : n < 1)
    return ES_KFAIL(k, ES_EMODEL, "expects %s inputs, got %d", where ? "3" : "1 or more", n);
  for (int i = 0; i < n; i++)
    if (!k->in[i])
      return ES_KFAIL(k, ES_EMODEL, "input %d is omitted; every input is required", i);
  if (k->n_out != 1 || !k->out[0])
    return ES_KFAIL(k, ES_EMODEL, "expects 1 output, got %d", k->n_out);
  ew_nary_plan *p = es__kinst_alloc(k, sizeof *p);
  if (!p)
    return ES_KFAIL(k, ES_ENOMEM, "out of memory for the plan");
  p->n = n;
  es_dtype to = k->in[where]->dtype;
  for (int i = where; i < n; i++)
    if (k->in[i]->dtype != to)
      return ES_KFAIL(k, ES_EMODEL, "input %d has type %s, input %d %s; they must be the same",
                      i, es_dtype_name(k->in[i]->dtype), where, es_dtype_name(to));
  int slot = ew_slot(to);
  if (where) {
    if (k->in[0]->dtype != ES_DTYPE_BOOL)
      return ES_KFAIL(k, ES_EMODEL, "condition has type %s, expected bool",
                      es_dtype_name(k->in[0]->dtype));
    size_t esz = es_dtype_size(to);
    p->where = esz == 1 ? ew_where_1 : esz == 4 ? ew_where_4 : ew_where_8;
  } else if (op == ES_OP_Mean ? slot != EW_F32 : slot < 0 || slot == EW_BOOL) {
    return ES_KFAIL(k, ES_EMODEL, "inputs have type %s, expected %s", es_dtype_name(to),
                    op == ES_OP_Mean ? "float32" : "float32, int32, int64, uint8 or int8");
  } else {
    p->fns = op == ES_OP_Max ? ew_max_fns[slot] : op == ES_OP_Min ? ew_min_fns[slot]
                                                                : ew_add_fns[slot];
    p->mean_n = op == ES_OP_Mean ? (float)n : 0.0f;
  }
  es_tdesc acc = *k->in[0];
  int rc;
  for (int i = 1; i < n; i++) {
    int rank;
    int64_t dims[ES_MAX_RANK];
    if ((rc = es__broadcast_shape(k, &acc, k->in[i], &rank, dims)) < 0)
      return rc;
    acc.rank = rank;
    memcpy(acc.dims, dims, sizeof dims);
  }
  int nhwc;
  if ((rc = ew_nary_layout(k, acc.rank, &nhwc)) != 0)
    return rc;
  es_tdesc *o = k->out[0];
  if ((rc = es__tdesc_set(o, to, acc.rank, acc.dims)) < 0)
    return rc;
  if (nhwc)
    o->layout = ES_LAYOUT_NHWC;
  p->esz_o = es_dtype_size(to);
  p->count = o->count;
  if ((rc = ew_nary_collapse(k, p, o, nhwc)) < 0)
    return rc;
  k->scratch_bytes = (size_t)n * sizeof(int64_t);
  k->params = p;
  /* A row reads input 0 and 1 before writing; later inputs are read after
   * the row is written, so they may not share it. Where reads each element
   * of c, x and y before writing it. */
  static const int cand_var[] = {0, 1}, cand_where[] = {1, 2, 0};
  const int *cand = where ? cand_where : cand_var;
  int nc = where ? 3 : n < 2 ? n : 2;
  k->inplace = -1;
  for (int c = 0; c < nc && k->inplace < 0; c++)
    if (k->in[cand[c]]->dtype == to && es__tdesc_same_shape(k->in[cand[c]], o))
      k->inplace = cand[c];
  return 0;
}

/* o[0..len) = the element at src, repeated. */
static void ew_fill(char *o, const char *src, size_t len, size_t esz) {
  if (o != src)
    memcpy(o, src, esz);
  for (size_t done = 1; done < len;) {
    size_t c = done < len - done ? done : len - done;
    memcpy(o + done * esz, o, c * esz);
    done += c;
  }
}

/* One row of a variadic op: operand i starts at in[i] + off[i] elements
 * and advances along the row when inner[i] (else it is one value). */
static void ew_nary_row(const ew_nary_plan *p, const void *const *in, const int64_t *off,
                        const int64_t *inner, char *o, size_t len) {
  size_t e = p->esz_o;
#define EW_AT(i) ((const char *)in[i] + (size_t)off[i] * e)
  if (p->n == 1) {
    if (!inner[0])
      ew_fill(o, EW_AT(0), len, e);
    else if (o != EW_AT(0))
      memcpy(o, EW_AT(0), len * e);
    return;
  }
  if (inner[0] && inner[1])
    p->fns.vv(EW_AT(0), EW_AT(1), o, len);
  else if (inner[0])
    p->fns.vs(EW_AT(0), EW_AT(1), o, len);
  else if (inner[1])
    p->fns.sv(EW_AT(0), EW_AT(1), o, len);
  else {
    p->fns.vv(EW_AT(0), EW_AT(1), o, 1);
    ew_fill(o, o, len, e);
  }
  for (int i = 2; i < p->n; i++)
    (inner[i] ? p->fns.vv : p->fns.vs)(o, EW_AT(i), o, len);
#undef EW_AT
  if (p->mean_n != 0.0f)
    ew_div_f32_vs(o, &p->mean_n, o, len);
}

static int ew_nary_run(const es_kinst *k, const void *const *in, void *const *out,
                       void *scratch) {
  const ew_nary_plan *p = k->params;
  if (p->count == 0)
    return 0;
  int n = p->n, r = p->rank;
  int64_t *off = scratch, idx[ES_MAX_RANK] = {0};
  memset(off, 0, (size_t)n * sizeof *off);
  size_t len = (size_t)p->dims[r - 1], rows = p->count / len;
  const int64_t *inner = p->st + (size_t)(r - 1) * (size_t)n;
  char *o = out[0];
  for (size_t t = 0; t < rows; t++, o += len * p->esz_o) {
    if (p->where) {
      const char *c = (const char *)in[0] + off[0];
      const char *x = (const char *)in[1] + (size_t)off[1] * p->esz_o;
      const char *y = (const char *)in[2] + (size_t)off[2] * p->esz_o;
      p->where((const uint8_t *)c, (size_t)inner[0], x, (size_t)inner[1], y, (size_t)inner[2], o,
               len);
    } else {
      ew_nary_row(p, in, off, inner, o, len);
    }
    es__walk_step(r - 1, p->dims, idx, n, off, p->st);
  }
  return 0;
}

/* ==========================================================================
 * Identity and Dropout (inference): the input, unchanged
 * ======================================================================== */

typedef struct ew_copy_plan {
  size_t nbytes;
  size_t mask_count;  /* Dropout's mask output: elements, 0 without one */
  int mask_float;     /* before opset 10 the mask has the data's type */
  int training;       /* Dropout: 0 inference, 1 training, 2 read input 2 at run time */
  int ratio_rt;       /* the ratio is read from input 1 at run time */
  float ratio;        /* else its value (0.5 when absent) */
} ew_copy_plan;

/* Output 0: input 0's type, shape and layout, offered in place. */
static int ew_copy_begin(es_kinst *k, ew_copy_plan **pp) {
  if (!k->in[0])
    return ES_KFAIL(k, ES_EMODEL, "input 0 is omitted; it is required");
  if (k->n_out < 1 || !k->out[0])
    return ES_KFAIL(k, ES_EMODEL, "output 0 is required");
  ew_copy_plan *p = es__kinst_alloc(k, sizeof *p);
  if (!p)
    return ES_KFAIL(k, ES_ENOMEM, "out of memory for the plan");
  const es_tdesc *x = k->in[0];
  int rc = es__tdesc_set(k->out[0], x->dtype, x->rank, x->dims);
  if (rc < 0)
    return rc;
  k->out[0]->layout = x->layout;
  p->nbytes = x->nbytes;
  k->params = p;
  k->inplace = 0;
  *pp = p;
  return 0;
}

static int ew_identity_infer(es_kinst *k) {
  if (k->n_in != 1 || k->n_out != 1)
    return ES_KFAIL(k, ES_EMODEL, "expects 1 input and 1 output, got %d and %d", k->n_in,
                    k->n_out);
  ew_copy_plan *p = NULL;
  return ew_copy_begin(k, &p);
}

/* Dropout in inference is the identity and a mask of ones. So is
 * training with ratio 0 (ONNX: "a simple copy of the input"); training
 * with another ratio drops at random and is refused, while planning when
 * training_mode and the ratio are known then, else when run. */
static int ew_dropout_infer(es_kinst *k) {
  int max_in = k->opset >= 12 ? 3 : 1;
  if (k->n_in < 1 || k->n_in > max_in || k->n_out < 1 || k->n_out > 2)
    return ES_KFAIL(k, ES_EMODEL, "expects 1 to %d inputs and 1 or 2 outputs, got %d and %d",
                    max_in, k->n_in, k->n_out);
  ew_copy_plan *p = NULL;
  int rc = ew_copy_begin(k, &p);
  if (rc < 0)
    return rc;
  if (k->in[0]->dtype != ES_DTYPE_FLOAT)
    return ES_KFAIL(k, ES_EMODEL, "data has type %s, expected float32",
                    es_dtype_name(k->in[0]->dtype));
  float ratio;
  if (k->opset < 12 && (rc = es__attr_float(k, "ratio", 0.5f, &ratio)) < 0)
    return rc;
  p->ratio = 0.5f;
  if (k->n_in > 1 && k->in[1]) {
    if (k->in[1]->dtype != ES_DTYPE_FLOAT || k->in[1]->count != 1)
      return ES_KFAIL(k, ES_EMODEL, "ratio must be one float32, got %zu %s elements",
                      k->in[1]->count, es_dtype_name(k->in[1]->dtype));
    if (k->in_static[1])
      memcpy(&p->ratio, k->in_static[1], sizeof p->ratio);
    else
      p->ratio_rt = 1;
  }
  if (k->n_in > 2 && k->in[2]) {
    if (k->in[2]->dtype != ES_DTYPE_BOOL || k->in[2]->count != 1)
      return ES_KFAIL(k, ES_EMODEL, "training_mode must be one bool, got %zu %s elements",
                      k->in[2]->count, es_dtype_name(k->in[2]->dtype));
    p->training = !k->in_static[2] ? 2 : *(const uint8_t *)k->in_static[2] != 0;
  }
  if (p->training == 1 && !p->ratio_rt && p->ratio != 0.0f)
    return ES_KFAIL(k, ES_ENOTSUP, "training_mode is true with ratio %g: dropout in training "
                    "is not implemented (inference only)", (double)p->ratio);
  if (k->n_out == 2 && k->out[1]) {
    const es_tdesc *x = k->in[0];
    p->mask_float = k->opset < 10;
    rc = es__tdesc_set(k->out[1], p->mask_float ? ES_DTYPE_FLOAT : ES_DTYPE_BOOL, x->rank,
                       x->dims);
    if (rc < 0)
      return rc;
    k->out[1]->layout = x->layout;
    p->mask_count = x->count;
  }
  return 0;
}

static int ew_copy_run(const es_kinst *k, const void *const *in, void *const *out,
                       void *scratch) {
  (void)scratch;
  const ew_copy_plan *p = k->params;
  if (p->training == 1 || (p->training == 2 && *(const uint8_t *)in[2])) {
    float ratio = p->ratio;
    if (p->ratio_rt)
      memcpy(&ratio, in[1], sizeof ratio);
    if (ratio != 0.0f)
      return ES_KFAIL(k, ES_ENOTSUP, "training_mode is true with ratio %g: dropout in "
                      "training is not implemented (inference only)", (double)ratio);
  }
  if (out[0] != in[0] && p->nbytes)
    memcpy(out[0], in[0], p->nbytes);
  if (p->mask_count && p->mask_float) {
    float *m = out[1];
    for (size_t i = 0; i < p->mask_count; i++)
      m[i] = 1.0f;
  } else if (p->mask_count) {
    memset(out[1], 1, p->mask_count);
  }
  return 0;
}

/* ==========================================================================
 * Family lookup
 * ======================================================================== */

static const es_kernel ew_binary_kernel = {ew_binary_infer, ew_binary_run, NULL, ES_KLAYOUT_5D};
static const es_kernel ew_relu_kernel = {ew_relu_infer, ew_unary_run, NULL, ES_KLAYOUT_5D};
static const es_kernel ew_sigmoid_kernel = {ew_sigmoid_infer, ew_unary_run, NULL, ES_KLAYOUT_5D};
static const es_kernel ew_hardsigmoid_kernel = {ew_hardsigmoid_infer, ew_unary_run, NULL,
                                                ES_KLAYOUT_5D};
static const es_kernel ew_clip_kernel = {ew_clip_infer, ew_unary_run, NULL, ES_KLAYOUT_5D};
static const es_kernel ew_sqrt_kernel = {ew_sqrt_infer, ew_unary_run, NULL, ES_KLAYOUT_5D};
static const es_kernel ew_cast_kernel = {ew_cast_infer, ew_unary_run, NULL, ES_KLAYOUT_5D};
static const es_kernel ew_math_kernel = {ew_math_infer, ew_unary_run, NULL, ES_KLAYOUT_5D};
static const es_kernel ew_nary_kernel = {ew_nary_infer, ew_nary_run, NULL, 1};
static const es_kernel ew_identity_kernel = {ew_identity_infer, ew_copy_run, NULL, ES_KLAYOUT_5D};
static const es_kernel ew_dropout_kernel = {ew_dropout_infer, ew_copy_run, NULL, ES_KLAYOUT_5D};

const es_kernel *es__kernels_elementwise(es_op op) {
  switch (op) {
  case ES_OP_Add:
  case ES_OP_Sub:
  case ES_OP_Mul:
  case ES_OP_Div:
  case ES_OP_Pow:
  case ES_OP_Equal:
  case ES_OP_Less:
  case ES_OP_Greater:
  case ES_OP_LessOrEqual:
  case ES_OP_GreaterOrEqual:
  case ES_OP_And:
  case ES_OP_Or:
  case ES_OP_Xor:
  case ES_OP_BitShift:
  case ES_OP_Mod:
  case ES_OP_PRelu:
    return &ew_binary_kernel;
  case ES_OP_Max:
  case ES_OP_Min:
  case ES_OP_Sum:
  case ES_OP_Mean:
  case ES_OP_Where:
    return &ew_nary_kernel;
  case ES_OP_Identity:
    return &ew_identity_kernel;
  case ES_OP_Dropout:
    return &ew_dropout_kernel;
  case ES_OP_Relu:
    return &ew_relu_kernel;
  case ES_OP_Sigmoid:
    return &ew_sigmoid_kernel;
  case ES_OP_HardSigmoid:
    return &ew_hardsigmoid_kernel;
  case ES_OP_Clip:
    return &ew_clip_kernel;
  case ES_OP_Sqrt:
    return &ew_sqrt_kernel;
  case ES_OP_Cast:
    return &ew_cast_kernel;
  default:
    return ew_unary_def_of(op) ? &ew_math_kernel : NULL;
  }
}
