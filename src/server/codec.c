/* Open Inference Protocol (KServe v2) codec: request bodies in, tensors out;
 * outputs in, response bodies out. The interface and its contract are in
 * codec.h; this note says why the code is shaped the way it is.
 *
 * Two parsers for one request. A det request carries one 1x3x640x640 FP32
 * tensor as 10-15 MB of JSON numbers. jansson builds one heap object per
 * value: for a 14.7 MB body it took 300 ms and 50 MB in 1.2 M mallocs on the
 * development machine before a single float was copied out. So jansson only
 * sees the structure. A skim pass (one linear walk that allocates nothing)
 * finds the "data" array of each inputs[i] whenever that array holds no
 * string, and jansson parses a copy of the header in which each such array
 * is replaced by a placeholder 0. A dedicated scanner then decodes the array
 * text straight into the tensor storage and is as strict as jansson: JSON
 * number grammar, whitespace, commas, the nesting against the shape and each
 * value against the datatype. Arrays with strings in them (BYTES) stay with
 * jansson; they are small in practice, and the skim counts every value
 * jansson would see and refuses past ES_V2_JSON_VALUES_MAX, so a hostile body
 * cannot make jansson allocate per-value objects without bound. The skim
 * and jansson must agree on which array belongs to which input: the skim
 * decodes key escapes ("d\u0061ta" is "data"), leaves duplicate keys to
 * jansson (JSON_REJECT_DUPLICATES), and a placeholder that jansson does not
 * place where the skim expected is an error, never a guess.
 *
 * Memory. Nothing sized by the request is allocated before every size is
 * checked: shapes against max_elements (with overflow checks), JSON data
 * against its text (an element takes at least two bytes, "0,"), binary
 * sizes against the body. So the one tensor block is bounded by the body
 * size and a shape of [1000000,1000000,1000000] costs nothing. That block
 * comes from es_mem_aligned_alloc(ES_MEM_SERVER), as does the transient
 * compacted header and every response body. jansson's own tree (small, and
 * freed before es__v2_request_parse returns) uses malloc: its allocator hooks
 * are process-global, other code in the process may use jansson, and taking
 * them over from here would break whoever allocated first.
 *
 * Numbers. Input FP32 values are correctly rounded, as strtof would round
 * them: the decimal significand (first 19 digits) is scaled in double, which
 * is off by a few units in the last place at most, so the float it rounds to
 * is right unless the double lands within 64 ulps of a float midpoint (a
 * chance of about 1 in 4 million); those, subnormals and overflow go to
 * strtof on a canonical digits-and-exponent string (no decimal point, so the
 * process's locale cannot change the result). Integer types take integers
 * only (no fraction, no exponent), range-checked; BOOL takes true, false, 0
 * and 1. Output FP32 values are written with the fewest significant digits
 * that read back to the same float (searched over 1..9 digits, each
 * candidate checked with the same exact conversion), so 0.1f is "0.1", not
 * "0.100000001", and JSON outputs round-trip bit for bit. JSON has no NaN or
 * Infinity and KServe sets no rule: non-finite values are written as null,
 * and input null is refused (send such values as binary data).
 *
 * BYTES. The binary extension's layout (each element a 4-byte little-endian
 * length and its bytes) is the in-memory layout too, so binary BYTES are
 * validated and copied as they are. As an output, a tensor whose dtype is
 * ES_DTYPE_UNDEFINED is BYTES in that layout (es_v2_output has no is_bytes).
 * JSON strings must be UTF-8, so a BYTES output element that is not valid
 * UTF-8 cannot go into JSON data: encoding refuses it (ES_EINVAL, ask for the
 * output as binary) rather than change the bytes. Names and ids are
 * metadata: invalid UTF-8 there is replaced by U+FFFD so the body stays
 * valid JSON.
 *
 * The host must be little-endian (checked at compile time): binary tensors
 * are copied as they are.
 */
#include "server/codec.h"

#include "common/internal.h"
#include "edgeserve/memory.h"

#include <errno.h>
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "binary tensors are little-endian and copied as they are");

#define ES_V2_ALIGN 64
/* JSON values jansson may be handed per request (everything but the numeric
 * data arrays): ~64 bytes of heap each, so about 16 MB at most. */
#define ES_V2_JSON_VALUES_MAX (1u << 18)
#define ES_V2_SUPPORTED "BOOL, UINT8, INT8, INT32, INT64, FP32, BYTES"
/* Widest FP32 or INT64 value as written, with its comma. */
#define ES_V2_NUM_MAX 32

/* ==========================================================================
 * Datatypes
 * ======================================================================== */

typedef struct es_v2_type {
  const char *name;
  es_dtype dtype;
  int is_bytes;
  int supported;
} es_v2_type;

/* The protocol's datatypes; the unsupported ones are listed so the error can
 * say "not supported" rather than "unknown". */
static const es_v2_type es_v2_types_[] = {
    {"BOOL", ES_DTYPE_BOOL, 0, 1},       {"UINT8", ES_DTYPE_UINT8, 0, 1},
    {"INT8", ES_DTYPE_INT8, 0, 1},       {"INT32", ES_DTYPE_INT32, 0, 1},
    {"INT64", ES_DTYPE_INT64, 0, 1},     {"FP32", ES_DTYPE_FLOAT, 0, 1},
    {"BYTES", ES_DTYPE_UNDEFINED, 1, 1}, {"UINT16", ES_DTYPE_UNDEFINED, 0, 0},
    {"UINT32", ES_DTYPE_UNDEFINED, 0, 0}, {"UINT64", ES_DTYPE_UNDEFINED, 0, 0},
    {"INT16", ES_DTYPE_UNDEFINED, 0, 0}, {"FP16", ES_DTYPE_UNDEFINED, 0, 0},
    {"BF16", ES_DTYPE_UNDEFINED, 0, 0},  {"FP64", ES_DTYPE_UNDEFINED, 0, 0},
};

static const es_v2_type *type_find(const char *name) {
  for (size_t i = 0; i < sizeof es_v2_types_ / sizeof es_v2_types_[0]; i++)
    if (strcmp(es_v2_types_[i].name, name) == 0)
      return &es_v2_types_[i];
  return NULL;
}

/* ES_DTYPE_UNDEFINED is BYTES (the only protocol type without an engine
 * dtype); a value outside the enum gives "INVALID" so printing it is safe. */
const char *es__v2_dtype_name(es_dtype t) {
  switch (t) {
  case ES_DTYPE_BOOL:
    return "BOOL";
  case ES_DTYPE_UINT8:
    return "UINT8";
  case ES_DTYPE_INT8:
    return "INT8";
  case ES_DTYPE_INT32:
    return "INT32";
  case ES_DTYPE_INT64:
    return "INT64";
  case ES_DTYPE_FLOAT:
    return "FP32";
  case ES_DTYPE_UNDEFINED:
    return "BYTES";
  }
  return "INVALID";
}

int es__v2_dtype_parse(const char *name, es_dtype *out, int *is_bytes) {
  const es_v2_type *t = name ? type_find(name) : NULL;
  if (!t || !t->supported)
    return -1;
  if (out)
    *out = t->dtype;
  if (is_bytes)
    *is_bytes = t->is_bytes;
  return 0;
}

/* ==========================================================================
 * Errors: one message, into the caller's buffer and the thread's detail.
 * ======================================================================== */

typedef struct es_v2_err {
  char *buf;
  size_t len;
} es_v2_err;

__attribute__((format(printf, 3, 4))) static int v2_fail(es_v2_err *e, int rc, const char *fmt,
                                                         ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (n < 0)
    msg[0] = '\0';
  if (e && e->buf && e->len)
    snprintf(e->buf, e->len, "%s", msg);
  return es__fail(rc, "%s", msg);
}

static void fmt_shape(char *o, size_t n, const int64_t *dims, int rank) {
  size_t k = 0;
  k += (size_t)snprintf(o + k, n - k, "[");
  for (int d = 0; d < rank && k < n; d++)
    k += (size_t)snprintf(o + k, n - k, d ? ",%lld" : "%lld", (long long)dims[d]);
  if (k < n)
    snprintf(o + k, n - k, "]");
}

static const char *json_kind(const json_t *v) {
  switch (json_typeof(v)) {
  case JSON_OBJECT:
    return "an object";
  case JSON_ARRAY:
    return "an array";
  case JSON_STRING:
    return "a string";
  case JSON_INTEGER:
  case JSON_REAL:
    return "a number";
  case JSON_TRUE:
    return "true";
  case JSON_FALSE:
    return "false";
  case JSON_NULL:
    return "null";
  }
  return "a value";
}

/* Shows at most this much of a bad token in a message. */
static int tok_show(size_t n) { return n > 24 ? 24 : (int)n; }

/* ==========================================================================
 * Numbers: scanning, decimal -> float, float -> shortest decimal
 * ======================================================================== */

static const double es_p10_[] = {
    1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14,
    1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22, 1e23, 1e24, 1e25, 1e26, 1e27, 1e28, 1e29,
    1e30, 1e31, 1e32, 1e33, 1e34, 1e35, 1e36, 1e37, 1e38, 1e39, 1e40, 1e41, 1e42, 1e43, 1e44,
    1e45, 1e46, 1e47, 1e48, 1e49, 1e50, 1e51, 1e52, 1e53, 1e54, 1e55, 1e56, 1e57, 1e58, 1e59,
    1e60, 1e61, 1e62, 1e63, 1e64, 1e65, 1e66, 1e67, 1e68, 1e69, 1e70};
/* 10^-k correctly rounded: multiplying is several times faster than
 * dividing by 10^k, for one more rounding the error budget has room for. */
static const double es_n10_[] = {
    1e-0, 1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8, 1e-9, 1e-10, 1e-11,
    1e-12, 1e-13, 1e-14, 1e-15, 1e-16, 1e-17, 1e-18, 1e-19, 1e-20, 1e-21, 1e-22, 1e-23,
    1e-24, 1e-25, 1e-26, 1e-27, 1e-28, 1e-29, 1e-30, 1e-31, 1e-32, 1e-33, 1e-34, 1e-35,
    1e-36, 1e-37, 1e-38, 1e-39, 1e-40, 1e-41, 1e-42, 1e-43, 1e-44, 1e-45, 1e-46, 1e-47,
    1e-48, 1e-49, 1e-50, 1e-51, 1e-52, 1e-53, 1e-54, 1e-55, 1e-56, 1e-57, 1e-58, 1e-59,
    1e-60, 1e-61, 1e-62, 1e-63, 1e-64, 1e-65, 1e-66, 1e-67, 1e-68, 1e-69, 1e-70};
#define ES_P10_MAX 70

static int is_digit(char c) { return c >= '0' && c <= '9'; }
static int is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

/* A JSON number: value = m * 10^e10 (+ digits dropped past the 19th). */
typedef struct es_v2_num {
  uint64_t m;
  int64_t e10;
  int nd;       /* significant digits in m */
  int neg;
  int is_int;   /* no fraction, no exponent */
  int inexact;  /* a nonzero digit was dropped */
} es_v2_num;

/* Scans one number by the JSON grammar; the end of it, or NULL. */
static const char *scan_number(const char *p, const char *end, es_v2_num *t) {
  uint64_t m = 0;
  int64_t e10 = 0;
  int nd = 0, inexact = 0;
  t->neg = 0;
  t->is_int = 1;
  if (p < end && *p == '-') {
    t->neg = 1;
    p++;
  }
  if (p >= end)
    return NULL;
  if (*p == '0') {
    p++;
  } else if (*p >= '1' && *p <= '9') {
    do {
      unsigned dg = (unsigned)(*p - '0');
      if (nd < 19) {
        m = m * 10 + dg;
        nd++;
      } else {
        e10++;
        inexact |= dg != 0;
      }
      p++;
    } while (p < end && is_digit(*p));
  } else {
    return NULL;
  }
  if (p < end && *p == '.') {
    t->is_int = 0;
    p++;
    if (p >= end || !is_digit(*p))
      return NULL;
    do {
      unsigned dg = (unsigned)(*p - '0');
      if (nd < 19) {
        /* Leading zeros of the fraction (m still 0) only scale. */
        m = m * 10 + dg;
        nd += m != 0;
        e10--;
      } else {
        inexact |= dg != 0;
      }
      p++;
    } while (p < end && is_digit(*p));
  }
  t->m = m;
  t->e10 = e10;
  t->nd = nd;
  t->inexact = inexact;
  if (p < end && (*p == 'e' || *p == 'E')) {
    t->is_int = 0;
    p++;
    int eneg = 0;
    if (p < end && (*p == '+' || *p == '-')) {
      eneg = *p == '-';
      p++;
    }
    if (p >= end || !is_digit(*p))
      return NULL;
    int64_t ev = 0;
    do {
      if (ev < 100000000) /* far past any float's range; keeps e10 finite */
        ev = ev * 10 + (*p - '0');
      p++;
    } while (p < end && is_digit(*p));
    t->e10 += eneg ? -ev : ev;
  }
  return p;
}

/* m * 10^e10 as the nearest float. 1 and *out set; 0 when the double
 * estimate is too close to a float midpoint (or subnormal, or near FLT_MAX)
 * to be sure, so the caller asks strtof; -1 when clearly out of range. */
static int f32_fast(uint64_t m, int64_t e10, int nd, int neg, float *out) {
  if (m == 0) {
    *out = neg ? -0.0f : 0.0f;
    return 1;
  }
  int64_t mag = nd + e10; /* 10^(mag-1) <= value < 10^mag */
  if (mag > 39)
    return -1;
  if (mag < -45) { /* below 1e-46: under half the smallest subnormal */
    *out = neg ? -0.0f : 0.0f;
    return 1;
  }
  if (e10 < -ES_P10_MAX || e10 > ES_P10_MAX)
    return 0;
  /* At most three roundings (m, the power of ten, the product) and the
   * dropped digits (< 1e-18 relative): a few ulps of the double. */
  double d = (double)m;
  d *= e10 >= 0 ? es_p10_[e10] : es_n10_[-e10];
  if (!(d >= (double)FLT_MIN && d <= (double)FLT_MAX))
    return 0;
  uint64_t bits;
  memcpy(&bits, &d, sizeof bits);
  /* The low 29 bits of the double's significand are where the float
   * rounds; 2^28 there is a midpoint between two floats. */
  uint64_t low = bits & ((UINT64_C(1) << 29) - 1), half = UINT64_C(1) << 28;
  if (low + 64 > half && low < half + 64)
    return 0;
  float f = (float)d;
  *out = neg ? -f : f;
  return 1;
}

/* The exact answer from strtof, on "<digits>e<exp>" built from the token (at
 * most 800 significant digits and a sticky 1 for any nonzero digit dropped,
 * which rounds like the full string: a float midpoint has fewer digits).
 * -1 when the value overflows a float. */
static int f32_slow(const char *tok, size_t n, float *out) {
  char buf[840];
  size_t k = 0, i = 0;
  int64_t e10 = 0;
  int sticky = 0, frac = 0;
  if (n && tok[0] == '-') {
    buf[k++] = '-';
    i++;
  }
  size_t first = k;
  for (; i < n; i++) {
    char c = tok[i];
    if (c == '.') {
      frac = 1;
      continue;
    }
    if (c == 'e' || c == 'E')
      break;
    if (k == first && c == '0') {
      e10 -= frac;
      continue;
    }
    if (k - first < 800) {
      buf[k++] = c;
      e10 -= frac;
    } else {
      sticky |= c != '0';
      e10 += !frac;
    }
  }
  if (i < n) { /* exponent */
    i++;
    int eneg = 0;
    if (i < n && (tok[i] == '+' || tok[i] == '-'))
      eneg = tok[i++] == '-';
    int64_t ev = 0;
    for (; i < n; i++)
      if (ev < 100000000)
        ev = ev * 10 + (tok[i] - '0');
    e10 += eneg ? -ev : ev;
  }
  if (k == first) {
    *out = first ? -0.0f : 0.0f;
    return 0;
  }
  if (sticky) {
    buf[k++] = '1';
    e10--;
  }
  if (e10 > 100000)
    e10 = 100000;
  if (e10 < -100000)
    e10 = -100000;
  snprintf(buf + k, sizeof buf - k, "e%lld", (long long)e10);
  float f = strtof(buf, NULL);
  if (isinf(f))
    return -1;
  *out = f;
  return 0;
}

static const uint64_t es_u10_[20] = {1ull,
                                     10ull,
                                     100ull,
                                     1000ull,
                                     10000ull,
                                     100000ull,
                                     1000000ull,
                                     10000000ull,
                                     100000000ull,
                                     1000000000ull,
                                     10000000000ull,
                                     100000000000ull,
                                     1000000000000ull,
                                     10000000000000ull,
                                     100000000000000ull,
                                     1000000000000000ull,
                                     10000000000000000ull,
                                     100000000000000000ull,
                                     1000000000000000000ull,
                                     10000000000000000000ull};

/* Decimal digits of v > 0. */
static int ndigits(uint64_t v) {
  int n = 1;
  while (n < 20 && v >= es_u10_[n])
    n++;
  return n;
}

/* Does n * 10^k (n > 0) read back as the positive float want? */
static int f32_reads_as(uint64_t n, int k, float want) {
  float got;
  int r = f32_fast(n, k, ndigits(n), 0, &got);
  if (r < 0)
    return 0;
  if (r == 0) {
    char buf[48];
    snprintf(buf, sizeof buf, "%llue%d", (unsigned long long)n, k);
    got = strtof(buf, NULL);
  }
  return got == want;
}

/* d * 10^(p-1-E) rounded: a p-digit significand of d when E = floor(log10 d);
 * *k is the matching exponent. The estimate is checked by the caller. */
static uint64_t f32_cand(double d, int E, int p, int *k) {
  int s = p - 1 - E;
  double x = d * (s >= 0 ? es_p10_[s] : es_n10_[-s]);
  *k = -s;
  return (uint64_t)(x + 0.5);
}

static char *put_u64(char *o, uint64_t v) {
  char t[20];
  int n = 0;
  do {
    t[n++] = (char)('0' + v % 10);
    v /= 10;
  } while (v);
  while (n)
    *o++ = t[--n];
  return o;
}

static char *put_i64(char *o, int64_t v) {
  if (v < 0) {
    *o++ = '-';
    return put_u64(o, (uint64_t)0 - (uint64_t)v);
  }
  return put_u64(o, (uint64_t)v);
}

/* n * 10^k as a JSON number: plain for 1e-6 < x < 1e16, else d.ddde-N. */
static char *put_dec(char *o, uint64_t n, int k) {
  while (n % 10 == 0) {
    n /= 10;
    k++;
  }
  char dg[20];
  int nd = 0;
  for (uint64_t v = n; v; v /= 10)
    dg[19 - nd++] = (char)('0' + v % 10);
  const char *d = dg + 20 - nd;
  int X = k + nd - 1; /* exponent of the leading digit */
  if (X < -6 || X > 15) {
    *o++ = d[0];
    if (nd > 1) {
      *o++ = '.';
      memcpy(o, d + 1, (size_t)nd - 1);
      o += nd - 1;
    }
    *o++ = 'e';
    return put_i64(o, X);
  }
  if (k >= 0) {
    memcpy(o, d, (size_t)nd);
    o += nd;
    memset(o, '0', (size_t)k);
    return o + k;
  }
  if (X >= 0) {
    memcpy(o, d, (size_t)X + 1);
    o += X + 1;
    *o++ = '.';
    memcpy(o, d + X + 1, (size_t)(nd - X - 1));
    return o + (nd - X - 1);
  }
  *o++ = '0';
  *o++ = '.';
  memset(o, '0', (size_t)(-X - 1));
  o += -X - 1;
  memcpy(o, d, (size_t)nd);
  return o + nd;
}

/* The shortest decimal that reads back as f; null for NaN and infinities. */
static char *put_f32(char *o, float f) {
  if (isnan(f) || isinf(f)) {
    memcpy(o, "null", 4);
    return o + 4;
  }
  int neg = signbit(f) != 0;
  if (neg) {
    *o++ = '-';
    f = -f;
  }
  if (f == 0.0f) {
    if (neg) { /* "-0.0": "-0" reads as integer 0 in many clients */
      memcpy(o, "0.0", 3);
      return o + 3;
    }
    *o++ = '0';
    return o;
  }
  double d = (double)f;
  if (d < 16777216.0 && d == (double)(int32_t)d)
    return put_u64(o, (uint64_t)d);
  int be;
  frexp(d, &be); /* 2^(be-1) <= d < 2^be */
  int E = (int)floor((be - 1) * 0.30102999566398120);
  if (E + 1 >= 0 ? d >= es_p10_[E + 1] : d * es_p10_[-(E + 1)] >= 1.0)
    E++;
  /* Fewer digits never read back when more do not (the p-digit rounding
   * only gets closer as p grows), so bisect 1..9; 9 always suffice. */
  int lo = 1, hi = 9, k = 0, bk = 0;
  uint64_t bn = 0;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    uint64_t n = f32_cand(d, E, mid, &k);
    if (n && f32_reads_as(n, k, f)) {
      hi = mid;
      bn = n;
      bk = k;
    } else {
      lo = mid + 1;
    }
  }
  if (!bn) {
    /* The double estimate can miss the correctly rounded candidate by one
     * in its last digit; try the neighbours, then more digits. */
    for (int p = 9; p <= 17 && !bn; p++) {
      uint64_t n = f32_cand(d, E, p, &k);
      for (int dlt = 0; dlt < 3 && !bn; dlt++) {
        uint64_t c = dlt == 0 ? n : dlt == 1 ? n - 1 : n + 1;
        if (c && f32_reads_as(c, k, f)) {
          bn = c;
          bk = k;
        }
      }
    }
    ES_ASSERT(bn != 0);
  }
  return put_dec(o, bn, bk);
}

/* ==========================================================================
 * Growable output buffer (ES_MEM_SERVER)
 * ======================================================================== */

typedef struct es_v2_buf {
  char *p;
  size_t len, cap;
} es_v2_buf;

static int buf_grow(es_v2_buf *b, size_t extra) {
  if (extra > SIZE_MAX / 2 - b->len)
    return ES_ENOMEM;
  size_t want = b->len + extra;
  size_t cap = b->cap ? b->cap : 4096;
  while (cap < want)
    cap *= 2;
  char *p = b->p ? es_mem_realloc(b->p, cap) : es_mem_alloc(ES_MEM_SERVER, cap);
  if (!p)
    return ES_ENOMEM;
  b->p = p;
  b->cap = cap;
  return 0;
}

static inline int buf_reserve(es_v2_buf *b, size_t extra) {
  return b->cap - b->len >= extra ? 0 : buf_grow(b, extra);
}

static int buf_put(es_v2_buf *b, const char *s, size_t n) {
  if (buf_reserve(b, n))
    return ES_ENOMEM;
  memcpy(b->p + b->len, s, n);
  b->len += n;
  return 0;
}

static int buf_puts(es_v2_buf *b, const char *s) { return buf_put(b, s, strlen(s)); }

/* Length of the valid UTF-8 sequence at s (1..4), 0 if none (overlong forms,
 * surrogates and code points past U+10FFFF are invalid). */
static size_t utf8_seq(const unsigned char *s, size_t n) {
  unsigned c = s[0];
  if (c < 0x80)
    return 1;
  if (c < 0xC2 || c > 0xF4)
    return 0;
  size_t len = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  if (n < len)
    return 0;
  for (size_t i = 1; i < len; i++)
    if ((s[i] & 0xC0) != 0x80)
      return 0;
  if ((c == 0xE0 && s[1] < 0xA0) || (c == 0xED && s[1] >= 0xA0) || (c == 0xF0 && s[1] < 0x90) ||
      (c == 0xF4 && s[1] >= 0x90))
    return 0;
  return len;
}

/* A JSON string. Invalid UTF-8: replaced by U+FFFD when lossy, else the
 * string is not written and 1 is returned. */
static int buf_str(es_v2_buf *b, const char *str, size_t n, int lossy) {
  static const char hex[] = "0123456789abcdef";
  if (n > (SIZE_MAX / 2 - 2) / 6 || buf_reserve(b, 6 * n + 2))
    return ES_ENOMEM;
  const unsigned char *s = (const unsigned char *)str;
  char *o = b->p + b->len;
  *o++ = '"';
  for (size_t i = 0; i < n;) {
    unsigned char c = s[i];
    if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
      *o++ = (char)c;
      i++;
      continue;
    }
    if (c < 0x80) {
      *o++ = '\\';
      switch (c) {
      case '"':
      case '\\':
        *o++ = (char)c;
        break;
      case '\n':
        *o++ = 'n';
        break;
      case '\r':
        *o++ = 'r';
        break;
      case '\t':
        *o++ = 't';
        break;
      case '\b':
        *o++ = 'b';
        break;
      case '\f':
        *o++ = 'f';
        break;
      default:
        memcpy(o, "u00", 3);
        o[3] = hex[c >> 4];
        o[4] = hex[c & 15];
        o += 5;
      }
      i++;
      continue;
    }
    size_t k = utf8_seq(s + i, n - i);
    if (!k) {
      if (!lossy)
        return 1;
      memcpy(o, "\\ufffd", 6);
      o += 6;
      i++;
      continue;
    }
    memcpy(o, s + i, k);
    o += k;
    i += k;
  }
  *o++ = '"';
  b->len = (size_t)(o - b->p);
  return 0;
}

/* ==========================================================================
 * Nesting of "data" against the shape, shared by both data walkers.
 *
 * Accepted: flat (every value in the top array, as many as the shape's
 * element count) or nested exactly as the shape (an array at depth L has
 * dims[L-1] entries, values only at depth rank). Anything in between is
 * refused: a [3,2] layout sent for shape [2,3] has the right count but is a
 * client bug. Every check runs before the value is stored, so the store
 * index is always below the element count.
 * ======================================================================== */

typedef struct es_v2_nest {
  es_v2_err *e;
  const char *who;
  const char *shape;
  const int64_t *dims;
  int rank;
  int mode; /* 0 not known yet, 1 flat, 2 nested */
  uint64_t expected, total;
  uint64_t cnt[ES_MAX_RANK + 2];
} es_v2_nest;

static void nest_init(es_v2_nest *n, es_v2_err *e, const char *who, const char *shape,
                      const es_v2_input *in, uint64_t expected) {
  memset(n, 0, sizeof *n);
  n->e = e;
  n->who = who;
  n->shape = shape;
  n->dims = in->dims;
  n->rank = in->rank;
  n->expected = expected;
}

/* An element (a value, or an array when is_array) in the array at depth L. */
static int nest_elem(es_v2_nest *n, int L, int is_array) {
  if (L == 1 && n->mode == 0)
    n->mode = is_array ? 2 : 1;
  if (n->mode == 1) {
    if (is_array)
      return v2_fail(n->e, ES_EINVAL, "%s: data mixes values and arrays at the top level",
                     n->who);
    if (n->total >= n->expected)
      return v2_fail(n->e, ES_EINVAL, "%s: data has more than %llu elements, shape %s needs %llu",
                     n->who, (unsigned long long)n->expected, n->shape,
                     (unsigned long long)n->expected);
    n->total++;
    return 0;
  }
  if (is_array && L >= n->rank)
    return v2_fail(n->e, ES_EINVAL, "%s: data is nested deeper than shape %s", n->who, n->shape);
  if (!is_array && L != n->rank)
    return v2_fail(n->e, ES_EINVAL,
                   "%s: data nesting does not match shape %s: a value at depth %d, where the "
                   "shape needs an array",
                   n->who, n->shape, L);
  if (n->cnt[L] >= (uint64_t)n->dims[L - 1])
    return v2_fail(n->e, ES_EINVAL,
                   "%s: data nesting does not match shape %s: an array at depth %d has more "
                   "than %lld elements",
                   n->who, n->shape, L, (long long)n->dims[L - 1]);
  n->cnt[L]++;
  if (is_array)
    n->cnt[L + 1] = 0;
  else
    n->total++;
  return 0;
}

static int nest_close(es_v2_nest *n, int L) {
  if (n->mode == 2) {
    if (n->cnt[L] != (uint64_t)n->dims[L - 1])
      return v2_fail(n->e, ES_EINVAL,
                     "%s: data nesting does not match shape %s: an array at depth %d has %llu "
                     "elements, the shape says %lld",
                     n->who, n->shape, L, (unsigned long long)n->cnt[L],
                     (long long)n->dims[L - 1]);
    return 0;
  }
  if (n->total != n->expected)
    return v2_fail(n->e, ES_EINVAL, "%s: data has %llu elements, shape %s needs %llu", n->who,
                   (unsigned long long)n->total, n->shape, (unsigned long long)n->expected);
  return 0;
}

/* ==========================================================================
 * Skim: find the numeric "data" arrays before jansson sees the text.
 * ======================================================================== */

enum { ROLE_OTHER, ROLE_ROOT, ROLE_INPUTS, ROLE_INPUT };
enum { KEY_OTHER, KEY_INPUTS, KEY_DATA };

typedef struct es_v2_frame {
  char obj, expect_key, role, key;
  int count; /* values so far (arrays) */
  int input; /* ROLE_INPUT: index in "inputs" */
} es_v2_frame;

typedef struct es_v2_skim {
  int has[ES_V2_MAX_IO];        /* inputs[i] has a numeric data array */
  size_t start[ES_V2_MAX_IO];   /* its '[' */
  size_t len[ES_V2_MAX_IO];     /* through its ']' */
  int seen_inputs;
  size_t values;
} es_v2_skim;

/* Does the JSON string body s[0, n) (escapes undecoded) spell word? */
static int key_is(const char *s, size_t n, const char *word) {
  size_t wl = strlen(word), k = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned c = (unsigned char)s[i];
    if (c == '\\') {
      if (++i >= n)
        return 0;
      switch (s[i]) {
      case 'u': {
        if (i + 4 >= n)
          return 0;
        unsigned v = 0;
        for (int j = 1; j <= 4; j++) {
          int h = s[i + j] | 32; /* lower case; digits keep their value */
          if (is_digit(s[i + j]))
            v = v * 16 + (unsigned)(s[i + j] - '0');
          else if (h >= 'a' && h <= 'f')
            v = v * 16 + (unsigned)(h - 'a' + 10);
          else
            return 0;
        }
        i += 4;
        if (v >= 0x80) /* the words are ASCII */
          return 0;
        c = v;
        break;
      }
      case '"':
      case '\\':
      case '/':
        c = (unsigned char)s[i];
        break;
      case 'b':
        c = '\b';
        break;
      case 'f':
        c = '\f';
        break;
      case 'n':
        c = '\n';
        break;
      case 'r':
        c = '\r';
        break;
      case 't':
        c = '\t';
        break;
      default:
        return 0;
      }
    }
    if (k >= wl || (unsigned char)word[k] != c)
      return 0;
    k++;
  }
  return k == wl;
}

/* Bytes the skim must stop at inside a data array. */
static const unsigned char es_v2_special_[256] = {['['] = 1, [']'] = 2, ['{'] = 1, ['}'] = 2,
                                                  ['"'] = 3};

/* From the '[' at s[i]: 1 and *end at its matching bracket when no string
 * is inside; 0 when one is (the array is jansson's) or the text ends. */
static int numeric_array(const char *s, size_t len, size_t i, size_t *end) {
  size_t depth = 0;
  const unsigned char *u = (const unsigned char *)s;
  for (;;) {
    while (i < len && !es_v2_special_[u[i]])
      i++;
    if (i >= len)
      return 0;
    switch (es_v2_special_[u[i]]) {
    case 1:
      depth++;
      break;
    case 2:
      if (--depth == 0) {
        *end = i;
        return 1;
      }
      break;
    default:
      return 0;
    }
    i++;
  }
}

/* A value starts in frame f (NULL: depth 0 or past 3). A key names one
 * value only: in broken text such as {"inputs":[...] [...]} the second
 * array must not be taken for the inputs again. */
static int skim_value(es_v2_skim *k, es_v2_frame *f, es_v2_err *e) {
  if (f && f->obj)
    f->key = KEY_OTHER;
  if (++k->values > ES_V2_JSON_VALUES_MAX)
    return v2_fail(e, ES_EINVAL,
                   "the request has more than %u JSON values outside numeric data arrays; send "
                   "large BYTES tensors as binary data",
                   ES_V2_JSON_VALUES_MAX);
  if (f && !f->obj) {
    f->count++;
    if (f->role == ROLE_INPUTS && f->count > ES_V2_MAX_IO)
      return v2_fail(e, ES_EINVAL, "the request has more than %d inputs", ES_V2_MAX_IO);
  }
  return 0;
}

/* Malformed JSON is not reported here: the skim just stops, and jansson
 * (which sees everything outside the recorded arrays) says what is wrong. */
static int skim(const char *s, size_t len, es_v2_skim *k, es_v2_err *e) {
  es_v2_frame fr[4];
  size_t depth = 0, i = 0;
  int rc;
  memset(k, 0, sizeof *k);
  memset(fr, 0, sizeof fr);
  while (i < len) {
    char c = s[i];
    es_v2_frame *f = depth >= 1 && depth <= 3 ? &fr[depth] : NULL;
    if (is_ws(c) || c == ':') {
      i++;
      continue;
    }
    if (c == ',') {
      if (f && f->obj)
        f->expect_key = 1;
      i++;
      continue;
    }
    if (c == '}' || c == ']') {
      if (depth == 0)
        return 0;
      depth--;
      i++;
      continue;
    }
    if (c == '"') {
      size_t st = ++i;
      while (i < len && s[i] != '"')
        i += s[i] == '\\' ? 2 : 1;
      if (i >= len)
        return 0;
      if (f && f->obj && f->expect_key) {
        f->expect_key = 0;
        f->key = KEY_OTHER;
        if (f->role == ROLE_ROOT && key_is(s + st, i - st, "inputs") && !k->seen_inputs++)
          f->key = KEY_INPUTS;
        else if (f->role == ROLE_INPUT && key_is(s + st, i - st, "data"))
          f->key = KEY_DATA;
      } else if ((rc = skim_value(k, f, e)) != 0) {
        return rc;
      }
      i++;
      continue;
    }
    int key = f ? f->key : KEY_OTHER; /* the value's key, before skim_value drops it */
    if ((rc = skim_value(k, f, e)) != 0)
      return rc;
    if (c == '[' || c == '{') {
      if (c == '[' && f && f->role == ROLE_INPUT && key == KEY_DATA && !k->has[f->input]) {
        size_t end;
        if (numeric_array(s, len, i, &end)) {
          k->has[f->input] = 1;
          k->start[f->input] = i;
          k->len[f->input] = end + 1 - i;
          i = end + 1;
          continue;
        }
      }
      depth++;
      if (depth <= 3) {
        es_v2_frame *n = &fr[depth];
        memset(n, 0, sizeof *n);
        n->obj = c == '{';
        n->expect_key = n->obj;
        n->role = ROLE_OTHER;
        if (depth == 1 && n->obj)
          n->role = ROLE_ROOT;
        else if (f && f->role == ROLE_ROOT && key == KEY_INPUTS && !n->obj)
          n->role = ROLE_INPUTS;
        else if (f && f->role == ROLE_INPUTS && n->obj) {
          n->role = ROLE_INPUT;
          n->input = f->count - 1;
        }
      }
      i++;
      continue;
    }
    /* a number or literal (or garbage jansson will name): to a delimiter */
    while (i < len && !is_ws(s[i]) && s[i] != ',' && s[i] != ']' && s[i] != '}' && s[i] != ':' &&
           s[i] != '"' && s[i] != '[' && s[i] != '{')
      i++;
  }
  return 0;
}

/* jansson on the header with the recorded arrays replaced by 0. */
static int load_structure(const char *s, size_t len, const es_v2_skim *k, int has_header,
                          json_t **out, es_v2_err *e) {
  size_t clen = len;
  for (int i = 0; i < ES_V2_MAX_IO; i++)
    if (k->has[i])
      clen -= k->len[i] - 1;
  char *c = es_mem_alloc(ES_MEM_SERVER, clen);
  if (!c)
    return v2_fail(e, ES_ENOMEM, "out of memory for a %zu-byte JSON header", clen);
  size_t from = 0, to = 0;
  for (int i = 0; i < ES_V2_MAX_IO; i++) { /* input order is text order */
    if (!k->has[i])
      continue;
    if (k->start[i] < from) { /* cannot happen: the skim sees one inputs array */
      es_mem_free(c);
      return v2_fail(e, ES_EINVAL, "invalid JSON in \"inputs\"");
    }
    memcpy(c + to, s + from, k->start[i] - from);
    to += k->start[i] - from;
    c[to++] = '0';
    from = k->start[i] + k->len[i];
  }
  memcpy(c + to, s + from, len - from);
  json_error_t je;
  json_t *root = json_loadb(c, clen, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
  es_mem_free(c);
  if (!root) {
    /* Back to a position in the caller's text. */
    size_t pos = je.position > 0 ? (size_t)je.position : 0, shift = 0;
    for (int i = 0; i < ES_V2_MAX_IO; i++)
      if (k->has[i] && pos > k->start[i] - shift)
        shift += k->len[i] - 1;
    return v2_fail(e, ES_EINVAL, "invalid JSON%s at byte %zu: %s",
                   has_header ? " header (is Inference-Header-Content-Length right?)" : "",
                   pos + shift, je.text);
  }
  *out = root;
  return 0;
}

/* ==========================================================================
 * Request
 * ======================================================================== */

enum { DATA_SPAN, DATA_TREE, DATA_BINARY };

typedef struct es_v2_plan {
  int kind;
  const char *text; /* DATA_SPAN: the array text; DATA_BINARY: the bytes */
  size_t text_len, text_off; /* text_off: offset in the body, for messages */
  json_t *tree;     /* DATA_TREE */
  uint64_t count;
  size_t nbytes, offset;
  int in_place;     /* DATA_BINARY already aligned in the body: no copy */
  char who[ES_V2_NAME_MAX + 16];
  char shape[ES_MAX_RANK * 21 + 3];
} es_v2_plan;

/* A name, id-like string: present, a string, 1..ES_V2_NAME_MAX-1 bytes,
 * no NUL inside. */
static int get_name(const json_t *v, char *dst, const char *who, es_v2_err *e) {
  if (!v || !json_is_string(v))
    return v2_fail(e, ES_EINVAL, "%s has no \"name\" (a string)", who);
  size_t n = json_string_length(v);
  const char *s = json_string_value(v);
  if (n == 0)
    return v2_fail(e, ES_EINVAL, "%s: name is empty", who);
  if (n >= ES_V2_NAME_MAX)
    return v2_fail(e, ES_EINVAL, "%s: name is %zu bytes long, at most %d are allowed", who, n,
                   ES_V2_NAME_MAX - 1);
  if (strlen(s) != n)
    return v2_fail(e, ES_EINVAL, "%s: name contains a NUL character", who);
  memcpy(dst, s, n + 1);
  return 0;
}

static int get_uint(const json_t *v, uint64_t *out) {
  if (!json_is_integer(v) || json_integer_value(v) < 0)
    return -1;
  *out = (uint64_t)json_integer_value(v);
  return 0;
}

/* Stores the value at p into dst[idx]; *pp past it. */
static int put_value(const es_v2_input *in, es_v2_nest *n, const char **pp, const char *end,
                     void *dst, uint64_t idx, size_t off, es_v2_err *e) {
  const char *p = *pp, *who = n->who;
  const char *tname = es__v2_dtype_name(in->is_bytes ? ES_DTYPE_UNDEFINED : in->dtype);
  char c = *p;
  if (c == 't' || c == 'f' || c == 'n') {
    int lit = end - p >= 4 && memcmp(p, "true", 4) == 0    ? 1
              : end - p >= 5 && memcmp(p, "false", 5) == 0 ? 0
              : end - p >= 4 && memcmp(p, "null", 4) == 0  ? 2
                                                            : -1;
    if (lit < 0)
      return v2_fail(e, ES_EINVAL, "%s: invalid JSON in data at byte %zu", who, off);
    if (lit < 2 && in->dtype == ES_DTYPE_BOOL && !in->is_bytes) {
      if (dst)
        ((uint8_t *)dst)[idx] = (uint8_t)lit;
      *pp = p + (lit ? 4 : 5);
      return 0;
    }
    return v2_fail(e, ES_EINVAL, "%s: element %llu is %s; %s data must be %s", who,
                   (unsigned long long)idx, lit == 1 ? "true" : lit == 0 ? "false" : "null", tname,
                   in->is_bytes ? "strings"
                   : lit == 2   ? "numbers (send NaN and infinities as binary data)"
                                : "numbers");
  }
  es_v2_num t;
  const char *q = scan_number(p, end, &t);
  if (!q) {
    if (c == '{')
      return v2_fail(e, ES_EINVAL, "%s: element %llu is an object; %s data must be %s", who,
                     (unsigned long long)idx, tname, in->is_bytes ? "strings" : "numbers");
    return v2_fail(e, ES_EINVAL, "%s: invalid JSON in data at byte %zu (element %llu)", who, off,
                   (unsigned long long)idx);
  }
  size_t tl = (size_t)(q - p);
  if (in->is_bytes)
    return v2_fail(e, ES_EINVAL, "%s: element %llu is a number; BYTES data must be strings", who,
                   (unsigned long long)idx);
  if (in->dtype == ES_DTYPE_FLOAT) {
    float f;
    int r = f32_fast(t.m, t.e10, t.nd, t.neg, &f);
    if (r == 0)
      r = f32_slow(p, tl, &f) == 0 ? 1 : -1;
    if (r < 0)
      return v2_fail(e, ES_EINVAL, "%s: element %llu (%.*s) is out of range for FP32", who,
                     (unsigned long long)idx, tok_show(tl), p);
    if (dst)
      ((float *)dst)[idx] = f;
    *pp = q;
    return 0;
  }
  if (!t.is_int)
    return v2_fail(e, ES_EINVAL, "%s: element %llu (%.*s) is not an integer; %s data must be %s",
                   who, (unsigned long long)idx, tok_show(tl), p, tname,
                   in->dtype == ES_DTYPE_BOOL ? "true, false, 0 or 1" : "integers");
  /* Past 19 digits (e10 > 0) is past every integer type. */
  uint64_t lim_pos, lim_neg;
  switch (in->dtype) {
  case ES_DTYPE_INT64:
    lim_pos = INT64_MAX, lim_neg = (uint64_t)INT64_MAX + 1;
    break;
  case ES_DTYPE_INT32:
    lim_pos = INT32_MAX, lim_neg = (uint64_t)INT32_MAX + 1;
    break;
  case ES_DTYPE_INT8:
    lim_pos = 127, lim_neg = 128;
    break;
  case ES_DTYPE_UINT8:
    lim_pos = 255, lim_neg = 0;
    break;
  default: /* BOOL */
    lim_pos = 1, lim_neg = 0;
    break;
  }
  if (t.e10 > 0 || t.m > (t.neg ? lim_neg : lim_pos)) {
    if (in->dtype == ES_DTYPE_BOOL)
      return v2_fail(e, ES_EINVAL, "%s: element %llu (%.*s) is not true, false, 0 or 1", who,
                     (unsigned long long)idx, tok_show(tl), p);
    return v2_fail(e, ES_EINVAL, "%s: element %llu (%.*s) is out of range for %s", who,
                   (unsigned long long)idx, tok_show(tl), p, tname);
  }
  int64_t v = t.neg ? (int64_t)((uint64_t)0 - t.m) : (int64_t)t.m;
  switch (dst ? in->dtype : ES_DTYPE_UNDEFINED) {
  case ES_DTYPE_INT64:
    ((int64_t *)dst)[idx] = v;
    break;
  case ES_DTYPE_INT32:
    ((int32_t *)dst)[idx] = (int32_t)v;
    break;
  case ES_DTYPE_INT8:
    ((int8_t *)dst)[idx] = (int8_t)v;
    break;
  case ES_DTYPE_UINT8:
  case ES_DTYPE_BOOL:
    ((uint8_t *)dst)[idx] = (uint8_t)v;
    break;
  default: /* validating only */
    break;
  }
  *pp = q;
  return 0;
}

/* Decodes a numeric data array's text into dst. dst NULL only validates:
 * for BYTES, whose arrays here have no strings and so must be empty, and
 * for text too short for the shape, to say exactly what is wrong. */
static int decode_span(const es_v2_plan *pl, const es_v2_input *in, void *dst, es_v2_err *e) {
  const char *s = pl->text, *p = s + 1, *end = s + pl->text_len;
  es_v2_nest n;
  nest_init(&n, e, pl->who, pl->shape, in, pl->count);
  enum { VALUE_OR_CLOSE, VALUE, COMMA_OR_CLOSE } st = VALUE_OR_CLOSE;
  int level = 1, rc;
  while (level > 0) {
    while (p < end && is_ws(*p))
      p++;
    if (p >= end)
      return v2_fail(e, ES_EINVAL, "%s: data ends early", pl->who);
    char c = *p;
    size_t off = pl->text_off + (size_t)(p - s);
    if (st == COMMA_OR_CLOSE && c != ',' && c != ']')
      return v2_fail(e, ES_EINVAL, "%s: invalid JSON in data at byte %zu: expected ',' or ']'",
                     pl->who, off);
    if (c == ',') {
      if (st != COMMA_OR_CLOSE)
        return v2_fail(e, ES_EINVAL, "%s: invalid JSON in data at byte %zu: a value is missing",
                       pl->who, off);
      st = VALUE;
      p++;
      continue;
    }
    if (c == ']') {
      if (st == VALUE)
        return v2_fail(e, ES_EINVAL, "%s: invalid JSON in data at byte %zu: a value is missing",
                       pl->who, off);
      if ((rc = nest_close(&n, level)) != 0)
        return rc;
      level--;
      p++;
      st = COMMA_OR_CLOSE;
      continue;
    }
    if (c == '[') {
      if ((rc = nest_elem(&n, level, 1)) != 0)
        return rc;
      level++;
      p++;
      st = VALUE_OR_CLOSE;
      continue;
    }
    if ((rc = nest_elem(&n, level, 0)) != 0)
      return rc;
    if ((rc = put_value(in, &n, &p, end, dst, n.total - 1, off, e)) != 0)
      return rc;
    st = COMMA_OR_CLOSE;
  }
  if (p != end) /* the skim matched brackets, so this is a broken invariant */
    return v2_fail(e, ES_EINVAL, "%s: invalid JSON in data", pl->who);
  return 0;
}

/* Data left in jansson's tree (arrays with strings): BYTES are sized (dst
 * NULL) or written; for other types this names the first wrong value. */
static int walk_tree(const json_t *a, int level, es_v2_nest *n, const es_v2_input *in,
                     unsigned char *dst, size_t *pos, es_v2_err *e) {
  int rc;
  for (size_t i = 0; i < json_array_size(a); i++) {
    const json_t *v = json_array_get(a, i);
    if (json_is_array(v)) {
      if ((rc = nest_elem(n, level, 1)) != 0 || (rc = walk_tree(v, level + 1, n, in, dst, pos, e)))
        return rc;
      continue;
    }
    if ((rc = nest_elem(n, level, 0)) != 0)
      return rc;
    if (!in->is_bytes) {
      if (json_is_number(v) || (in->dtype == ES_DTYPE_BOOL && json_is_boolean(v)))
        continue; /* fine; the wrong one comes later */
      return v2_fail(e, ES_EINVAL, "%s: element %llu is %s; %s data must be numbers", n->who,
                     (unsigned long long)(n->total - 1), json_kind(v),
                     es__v2_dtype_name(in->dtype));
    }
    if (!json_is_string(v))
      return v2_fail(e, ES_EINVAL, "%s: element %llu is %s; BYTES data must be strings", n->who,
                     (unsigned long long)(n->total - 1), json_kind(v));
    size_t sl = json_string_length(v);
    if (sl > UINT32_MAX)
      return v2_fail(e, ES_EINVAL, "%s: element %llu is longer than 4 GiB", n->who,
                     (unsigned long long)(n->total - 1));
    if (dst) {
      uint32_t l32 = (uint32_t)sl;
      memcpy(dst + *pos, &l32, 4);
      memcpy(dst + *pos + 4, json_string_value(v), sl);
    }
    *pos += 4 + sl;
  }
  return nest_close(n, level);
}

/* BYTES in the binary layout: exactly count elements filling n bytes. */
static int bytes_layout_check(const unsigned char *p, size_t n, uint64_t count, const char *who,
                              const char *shape, es_v2_err *e) {
  size_t pos = 0;
  uint64_t k = 0;
  while (pos < n) {
    if (k == count)
      return v2_fail(e, ES_EINVAL, "%s: BYTES data has %zu bytes after its %llu elements", who,
                     n - pos, (unsigned long long)count);
    if (n - pos < 4)
      return v2_fail(e, ES_EINVAL, "%s: BYTES data ends inside the length of element %llu", who,
                     (unsigned long long)k);
    uint32_t l;
    memcpy(&l, p + pos, 4);
    pos += 4;
    if (l > n - pos)
      return v2_fail(e, ES_EINVAL,
                     "%s: BYTES element %llu is %u bytes long but only %zu bytes are left", who,
                     (unsigned long long)k, l, n - pos);
    pos += l;
    k++;
  }
  if (k != count)
    return v2_fail(e, ES_EINVAL, "%s: BYTES data has %llu elements, shape %s needs %llu", who,
                   (unsigned long long)k, shape, (unsigned long long)count);
  return 0;
}

typedef struct es_v2_ctx {
  const char *body;
  size_t max_elements;
  int has_header;
  const char *bin;  /* next binary tensor */
  size_t bin_left;  /* bytes after it */
  const es_v2_skim *sk;
  es_v2_err *e;
} es_v2_ctx;

/* inputs[i]'s name (unique among the inputs) and datatype. */
static int plan_name_type(es_v2_ctx *cx, const json_t *jin, int i, es_v2_request *r,
                          es_v2_plan *pl, const es_v2_type **type) {
  es_v2_err *e = cx->e;
  es_v2_input *in = &r->inputs[i];
  int rc;
  snprintf(pl->who, sizeof pl->who, "inputs[%d]", i);
  if (!json_is_object(jin))
    return v2_fail(e, ES_EINVAL, "%s is not an object", pl->who);
  if ((rc = get_name(json_object_get(jin, "name"), in->name, pl->who, e)) != 0)
    return rc;
  for (int j = 0; j < i; j++)
    if (strcmp(r->inputs[j].name, in->name) == 0)
      return v2_fail(e, ES_EINVAL, "input '%s' appears twice (inputs[%d] and inputs[%d])",
                     in->name, j, i);
  snprintf(pl->who, sizeof pl->who, "input '%s'", in->name);
  const char *who = pl->who;
  const json_t *dt = json_object_get(jin, "datatype");
  if (!json_is_string(dt))
    return v2_fail(e, ES_EINVAL, "%s has no \"datatype\" (a string such as \"FP32\")", who);
  const es_v2_type *ty = type_find(json_string_value(dt));
  if (!ty)
    return v2_fail(e, ES_EINVAL, "%s: datatype '%.32s' is not a protocol datatype (%s)", who,
                   json_string_value(dt), ES_V2_SUPPORTED);
  if (!ty->supported)
    return v2_fail(e, ES_EINVAL, "%s: datatype %s is not supported (%s)", who, ty->name,
                   ES_V2_SUPPORTED);
  in->dtype = ty->dtype;
  in->is_bytes = ty->is_bytes;
  *type = ty;
  return 0;
}

/* The shape, its element count (pl->count) and the bytes it needs. */
static int plan_shape(es_v2_ctx *cx, const json_t *jin, es_v2_input *in, es_v2_plan *pl,
                      size_t *need) {
  es_v2_err *e = cx->e;
  const char *who = pl->who;
  const json_t *sh = json_object_get(jin, "shape");
  if (!json_is_array(sh))
    return v2_fail(e, ES_EINVAL, "%s has no \"shape\" (an array of integers)", who);
  if (json_array_size(sh) > ES_MAX_RANK)
    return v2_fail(e, ES_EINVAL, "%s: shape has rank %zu, at most %d is supported", who,
                   json_array_size(sh), ES_MAX_RANK);
  in->rank = (int)json_array_size(sh);
  for (int d = 0; d < in->rank; d++) {
    const json_t *v = json_array_get(sh, (size_t)d);
    if (!json_is_integer(v))
      return v2_fail(e, ES_EINVAL, "%s: shape element %d is %s, not an integer", who, d,
                     json_kind(v));
    in->dims[d] = json_integer_value(v);
  }
  fmt_shape(pl->shape, sizeof pl->shape, in->dims, in->rank);
  /* The product of the nonzero dimensions is bounded too, so no later
   * product over this shape (by anyone) can overflow. */
  uint64_t nz = 1;
  int zero = 0;
  for (int d = 0; d < in->rank; d++) {
    if (in->dims[d] < 0)
      return v2_fail(e, ES_EINVAL, "%s: shape %s has a negative dimension", who, pl->shape);
    uint64_t dim = (uint64_t)in->dims[d];
    if (dim == 0) {
      zero = 1;
      continue;
    }
    if (dim > cx->max_elements || nz > cx->max_elements / dim)
      return v2_fail(e, ES_EINVAL, "%s: shape %s has more elements than the limit of %zu", who,
                     pl->shape, cx->max_elements);
    nz *= dim;
  }
  if (nz > cx->max_elements)
    return v2_fail(e, ES_EINVAL, "%s: shape %s has more elements than the limit of %zu", who,
                   pl->shape, cx->max_elements);
  pl->count = zero ? 0 : nz;
  size_t esize = in->is_bytes ? 0 : es_dtype_size(in->dtype);
  if (esize && pl->count > SIZE_MAX / esize)
    return v2_fail(e, ES_EINVAL, "%s: shape %s is too large", who, pl->shape);
  *need = (size_t)pl->count * esize;
  return 0;
}

/* Data in the binary part: the next binary_data_size bytes after the JSON. */
static int plan_binary(es_v2_ctx *cx, const json_t *bds, const es_v2_input *in,
                       const es_v2_type *ty, size_t need, es_v2_plan *pl) {
  es_v2_err *e = cx->e;
  const char *who = pl->who;
  uint64_t sz;
  if (get_uint(bds, &sz))
    return v2_fail(e, ES_EINVAL, "%s: parameters.binary_data_size is not a non-negative integer",
                   who);
  if (!cx->has_header)
    return v2_fail(e, ES_EINVAL,
                   "%s: parameters.binary_data_size is set but the request has no binary part "
                   "(no Inference-Header-Content-Length)",
                   who);
  if (!in->is_bytes && sz != need)
    return v2_fail(e, ES_EINVAL, "%s: shape %s needs %zu bytes of %s, got %llu", who, pl->shape,
                   need, ty->name, (unsigned long long)sz);
  if (sz > cx->bin_left)
    return v2_fail(e, ES_EINVAL,
                   "%s: binary_data_size %llu goes past the end of the body: %zu bytes of "
                   "binary data are left for it (truncated body, or wrong sizes)",
                   who, (unsigned long long)sz, cx->bin_left);
  pl->kind = DATA_BINARY;
  pl->text = cx->bin;
  pl->text_len = (size_t)sz;
  pl->text_off = (size_t)(cx->bin - cx->body);
  cx->bin += sz;
  cx->bin_left -= (size_t)sz;
  pl->nbytes = (size_t)sz;
  const unsigned char *u = (const unsigned char *)pl->text;
  if (in->is_bytes)
    return bytes_layout_check(u, pl->nbytes, pl->count, who, pl->shape, e);
  if (in->dtype == ES_DTYPE_BOOL)
    for (size_t k = 0; k < pl->nbytes; k++)
      if (u[k] > 1)
        return v2_fail(e, ES_EINVAL, "%s: BOOL element %zu is 0x%02x, not 0 or 1", who, k, u[k]);
  return 0;
}

/* Data as JSON: a numeric array the skim found (decoded later from the
 * text), or a tree jansson parsed (strings of a BYTES input). */
static int plan_json_data(es_v2_ctx *cx, int i, const json_t *data, es_v2_input *in,
                          const es_v2_type *ty, size_t need, es_v2_plan *pl) {
  es_v2_err *e = cx->e;
  const char *who = pl->who;
  int rc;
  if (cx->sk->has[i]) {
    /* The skim's array: jansson must see its placeholder right here. */
    if (!json_is_integer(data) || json_integer_value(data) != 0)
      return v2_fail(e, ES_EINVAL, "%s: invalid JSON in data", who);
    pl->kind = DATA_SPAN;
    pl->text = cx->body + cx->sk->start[i];
    pl->text_len = cx->sk->len[i];
    pl->text_off = cx->sk->start[i];
    if (in->is_bytes) { /* no strings in it: only an empty tensor fits */
      pl->nbytes = 0;
      return decode_span(pl, in, NULL, e);
    }
    /* "[a,b]": an element takes at least two bytes of text, so this much
     * text cannot fill the shape; the scan (storing nothing) says how. */
    if (pl->count > (pl->text_len - 1) / 2) {
      if ((rc = decode_span(pl, in, NULL, e)) != 0)
        return rc;
      return v2_fail(e, ES_EINVAL, "%s: data has fewer elements than shape %s needs (%llu)", who,
                     pl->shape, (unsigned long long)pl->count);
    }
    pl->nbytes = need;
    return 0;
  }
  if (!json_is_array(data))
    return v2_fail(e, ES_EINVAL, "%s: \"data\" is %s, not an array", who, json_kind(data));
  pl->kind = DATA_TREE;
  pl->tree = (json_t *)data;
  es_v2_nest n;
  nest_init(&n, e, who, pl->shape, in, pl->count);
  size_t pos = 0;
  if ((rc = walk_tree(data, 1, &n, in, NULL, &pos, e)) != 0)
    return rc;
  if (!in->is_bytes) /* only strings send an array here; cannot be reached */
    return v2_fail(e, ES_EINVAL, "%s: %s data must be numbers", who, ty->name);
  pl->nbytes = pos;
  return 0;
}

/* Everything about inputs[i] but its data: checked, sized, planned. */
static int plan_input(es_v2_ctx *cx, const json_t *jin, int i, es_v2_request *r, es_v2_plan *pl) {
  es_v2_err *e = cx->e;
  es_v2_input *in = &r->inputs[i];
  const es_v2_type *ty = NULL;
  size_t need = 0;
  int rc;
  if ((rc = plan_name_type(cx, jin, i, r, pl, &ty)) != 0 ||
      (rc = plan_shape(cx, jin, in, pl, &need)) != 0)
    return rc;
  const char *who = pl->who;
  const json_t *params = json_object_get(jin, "parameters");
  const json_t *bds = NULL;
  if (params) {
    if (!json_is_object(params))
      return v2_fail(e, ES_EINVAL, "%s: \"parameters\" is not an object", who);
    bds = json_object_get(params, "binary_data_size");
  }
  const json_t *data = json_object_get(jin, "data");
  if (data && bds)
    return v2_fail(e, ES_EINVAL,
                   "%s has both \"data\" and parameters.binary_data_size; give one of them", who);
  if (!data && !bds)
    return v2_fail(e, ES_EINVAL, "%s has neither \"data\" nor parameters.binary_data_size", who);
  if (bds)
    return plan_binary(cx, bds, in, ty, need, pl);
  return plan_json_data(cx, i, data, in, ty, need, pl);
}

static int parse_top(const json_t *root, es_v2_request *r, es_v2_err *e) {
  const json_t *id = json_object_get(root, "id");
  if (id) {
    if (!json_is_string(id))
      return v2_fail(e, ES_EINVAL, "\"id\" is %s, not a string", json_kind(id));
    size_t n = json_string_length(id);
    if (n >= ES_V2_NAME_MAX)
      return v2_fail(e, ES_EINVAL, "\"id\" is %zu bytes long, at most %d are allowed", n,
                     ES_V2_NAME_MAX - 1);
    if (strlen(json_string_value(id)) != n)
      return v2_fail(e, ES_EINVAL, "\"id\" contains a NUL character");
    memcpy(r->id, json_string_value(id), n + 1);
  }
  const json_t *pa = json_object_get(root, "parameters");
  if (!pa)
    return 0;
  if (!json_is_object(pa))
    return v2_fail(e, ES_EINVAL, "\"parameters\" is %s, not an object", json_kind(pa));
  const json_t *v;
  if ((v = json_object_get(pa, "priority")) != NULL) {
    if (get_uint(v, &r->priority))
      return v2_fail(e, ES_EINVAL, "parameters.priority is not a non-negative integer");
    r->has_priority = 1;
  }
  if ((v = json_object_get(pa, "timeout")) != NULL) {
    if (get_uint(v, &r->timeout_us))
      return v2_fail(e, ES_EINVAL,
                     "parameters.timeout is not a non-negative integer (microseconds)");
    r->has_timeout = 1;
  }
  if ((v = json_object_get(pa, "binary_data_output")) != NULL) {
    if (!json_is_boolean(v))
      return v2_fail(e, ES_EINVAL, "parameters.binary_data_output is not true or false");
    r->binary_output = json_is_true(v);
  }
  /* Sequences (Triton's sequence batcher): the id is a positive integer or
   * a string, each its own namespace (12 and "12" are two sequences). */
  if ((v = json_object_get(pa, "sequence_id")) != NULL) {
    if (json_is_string(v)) {
      size_t n = json_string_length(v);
      if (n == 0 || n >= ES_SEQ_KEY_MAX || strlen(json_string_value(v)) != n)
        return v2_fail(e, ES_EINVAL, "parameters.sequence_id is a string of %zu bytes: 1 to %d "
                       "without NUL are allowed", n, ES_SEQ_KEY_MAX - 1);
      memcpy(r->sequence_key, json_string_value(v), n + 1);
    } else if (get_uint(v, &r->sequence_id) || r->sequence_id == 0) {
      return v2_fail(e, ES_EINVAL, "parameters.sequence_id is neither a positive integer nor a "
                     "string");
    }
  }
  static const char *const flag_name[2] = {"sequence_start", "sequence_end"};
  for (int f = 0; f < 2; f++) {
    if ((v = json_object_get(pa, flag_name[f])) == NULL)
      continue;
    if (!json_is_boolean(v))
      return v2_fail(e, ES_EINVAL, "parameters.%s is not true or false", flag_name[f]);
    if (json_is_true(v)) {
      if (!r->sequence_id && !r->sequence_key[0])
        return v2_fail(e, ES_EINVAL, "parameters.%s without parameters.sequence_id",
                       flag_name[f]);
      r->sequence_flags |= 1u << f;
    }
  }
  return 0;
}

static int parse_outputs(const json_t *root, es_v2_request *r, es_v2_err *e) {
  const json_t *outs = json_object_get(root, "outputs");
  if (!outs)
    return 0;
  if (!json_is_array(outs))
    return v2_fail(e, ES_EINVAL, "\"outputs\" is %s, not an array", json_kind(outs));
  if (json_array_size(outs) > ES_V2_MAX_IO)
    return v2_fail(e, ES_EINVAL, "the request asks for %zu outputs, at most %d are supported",
                   json_array_size(outs), ES_V2_MAX_IO);
  int rc;
  for (int i = 0; i < (int)json_array_size(outs); i++) {
    const json_t *o = json_array_get(outs, (size_t)i);
    es_v2_output_req *q = &r->outputs[i];
    char who[32];
    snprintf(who, sizeof who, "outputs[%d]", i);
    if (!json_is_object(o))
      return v2_fail(e, ES_EINVAL, "%s is not an object", who);
    if ((rc = get_name(json_object_get(o, "name"), q->name, who, e)) != 0)
      return rc;
    for (int j = 0; j < i; j++)
      if (strcmp(r->outputs[j].name, q->name) == 0)
        return v2_fail(e, ES_EINVAL, "output '%s' is asked for twice", q->name);
    q->binary = -1;
    const json_t *pa = json_object_get(o, "parameters");
    if (pa) {
      if (!json_is_object(pa))
        return v2_fail(e, ES_EINVAL, "output '%s': \"parameters\" is not an object", q->name);
      const json_t *b = json_object_get(pa, "binary_data");
      if (b) {
        if (!json_is_boolean(b))
          return v2_fail(e, ES_EINVAL, "output '%s': parameters.binary_data is not true or false",
                         q->name);
        q->binary = json_is_true(b);
      }
    }
    r->n_outputs = i + 1;
  }
  return 0;
}

static int parse_request(const json_t *root, es_v2_ctx *cx, es_v2_request *r) {
  es_v2_err *e = cx->e;
  int rc;
  if (!json_is_object(root))
    return v2_fail(e, ES_EINVAL, "the request is not a JSON object");
  if ((rc = parse_top(root, r, e)) != 0)
    return rc;
  const json_t *inputs = json_object_get(root, "inputs");
  if (!inputs)
    return v2_fail(e, ES_EINVAL, "the request has no \"inputs\"");
  if (!json_is_array(inputs))
    return v2_fail(e, ES_EINVAL, "\"inputs\" is %s, not an array", json_kind(inputs));
  size_t ni = json_array_size(inputs);
  if (ni == 0)
    return v2_fail(e, ES_EINVAL, "\"inputs\" is empty");
  if (ni > ES_V2_MAX_IO)
    return v2_fail(e, ES_EINVAL, "the request has %zu inputs, at most %d are supported", ni,
                   ES_V2_MAX_IO);
  es_v2_plan plan[ES_V2_MAX_IO];
  memset(plan, 0, sizeof plan);
  int last_bin = -1;
  for (int i = 0; i < (int)ni; i++) {
    if ((rc = plan_input(cx, json_array_get(inputs, (size_t)i), i, r, &plan[i])) != 0)
      return rc;
    r->n_inputs = i + 1;
    if (plan[i].kind == DATA_BINARY)
      last_bin = i;
  }
  if (cx->bin_left) {
    if (last_bin < 0)
      return v2_fail(e, ES_EINVAL,
                     "%zu bytes follow the JSON header but no input has "
                     "parameters.binary_data_size",
                     cx->bin_left);
    return v2_fail(e, ES_EINVAL,
                   "%zu bytes follow the binary data of %s, the last binary input "
                   "(binary_data_size values do not add up to the body)",
                   cx->bin_left, plan[last_bin].who);
  }
  for (int i = (int)ni; i < ES_V2_MAX_IO; i++)
    if (cx->sk->has[i]) /* the skim saw an input jansson did not */
      return v2_fail(e, ES_EINVAL, "invalid JSON in \"inputs\"");
  if ((rc = parse_outputs(root, r, e)) != 0)
    return rc;

  /* Every size is known and bounded by the body: one block for all. */
  size_t total = 0;
  for (int i = 0; i < (int)ni; i++) {
    /* Binary tensor bytes that already sit 64-byte aligned in the body (the
     * server places the body so that they do) are used where they are: a
     * det input is 4.9 MB, copying it is half a millisecond of a core. */
    plan[i].in_place = plan[i].kind == DATA_BINARY && plan[i].nbytes &&
                       (uintptr_t)plan[i].text % ES_V2_ALIGN == 0;
    if (plan[i].in_place)
      continue;
    plan[i].offset = total;
    if (plan[i].nbytes > SIZE_MAX - total - ES_V2_ALIGN)
      return v2_fail(e, ES_EINVAL, "the inputs are too large");
    total = es__align_up(total + plan[i].nbytes, ES_V2_ALIGN);
  }
  if (total == 0)
    total = ES_V2_ALIGN;
  unsigned char *st = es_mem_aligned_alloc(ES_MEM_SERVER, ES_V2_ALIGN, total);
  if (!st)
    return v2_fail(e, ES_ENOMEM, "out of memory for %zu bytes of input tensors", total);
  r->storage = st;
  r->storage_bytes = total;
  for (int i = 0; i < (int)ni; i++) {
    es_v2_input *in = &r->inputs[i];
    es_v2_plan *pl = &plan[i];
    unsigned char *dst = st + pl->offset;
    in->data = pl->in_place ? (const void *)pl->text : dst;
    in->nbytes = pl->nbytes;
    if (pl->in_place) {
      continue;
    } else if (pl->kind == DATA_BINARY) {
      if (pl->nbytes)
        memcpy(dst, pl->text, pl->nbytes);
    } else if (pl->kind == DATA_SPAN) {
      if (!in->is_bytes && (rc = decode_span(pl, in, dst, e)) != 0)
        return rc;
    } else {
      es_v2_nest n;
      nest_init(&n, e, pl->who, pl->shape, in, pl->count);
      size_t pos = 0;
      if ((rc = walk_tree(pl->tree, 1, &n, in, dst, &pos, e)) != 0)
        return rc;
    }
  }
  return 0;
}

int es__v2_request_parse(const char *body, size_t len, long long header_len, size_t max_elements,
                        es_v2_request *out, char *err, size_t errlen) {
  es_v2_err e = {err, errlen};
  if (err && errlen)
    err[0] = '\0';
  if (!out)
    return v2_fail(&e, ES_EINVAL, "no request to fill");
  memset(out, 0, sizeof *out);
  if (!body && len)
    return v2_fail(&e, ES_EINVAL, "no body");
  size_t json_len = len;
  if (header_len < -1)
    return v2_fail(&e, ES_EINVAL, "Inference-Header-Content-Length %lld is negative", header_len);
  if (header_len >= 0) {
    if ((unsigned long long)header_len > len)
      return v2_fail(&e, ES_EINVAL,
                     "Inference-Header-Content-Length %lld is larger than the body (%zu bytes)",
                     header_len, len);
    json_len = (size_t)header_len;
  }
  if (json_len == 0)
    return v2_fail(&e, ES_EINVAL, "%s",
                   header_len >= 0 ? "Inference-Header-Content-Length is 0: no JSON header"
                                   : "the request body is empty");
  es_v2_skim sk;
  int rc = skim(body, json_len, &sk, &e);
  if (rc)
    return rc;
  json_t *root = NULL;
  if ((rc = load_structure(body, json_len, &sk, header_len >= 0, &root, &e)) != 0)
    return rc;
  es_v2_ctx cx = {.body = body,
                  .max_elements = max_elements,
                  .has_header = header_len >= 0,
                  .bin = body + json_len,
                  .bin_left = len - json_len,
                  .sk = &sk,
                  .e = &e};
  rc = parse_request(root, &cx, out);
  json_decref(root);
  if (rc) {
    es__v2_request_free(out);
    memset(out, 0, sizeof *out);
  }
  return rc;
}

void es__v2_request_free(es_v2_request *r) {
  if (!r)
    return;
  es_mem_free(r->storage);
  r->storage = NULL;
  r->storage_bytes = 0;
  for (int i = 0; i < ES_V2_MAX_IO; i++) {
    r->inputs[i].data = NULL;
    r->inputs[i].nbytes = 0;
  }
  r->n_inputs = 0;
}

/* ==========================================================================
 * Response
 * ======================================================================== */

/* Checks one output and gives its element count. */
static int output_check(const es_v2_output *o, int i, uint64_t *count) {
  es_v2_err e = {NULL, 0};
  if (!o->name)
    return v2_fail(&e, ES_EINVAL, "outputs[%d] has no name", i);
  const char *nm = o->name;
  char who[ES_V2_NAME_MAX + 16];
  snprintf(who, sizeof who, "output '%.*s'", ES_V2_NAME_MAX, nm);
  int bytes = o->dtype == ES_DTYPE_UNDEFINED;
  size_t esize = bytes ? 0 : es_dtype_size(o->dtype);
  if (!bytes && !esize)
    return v2_fail(&e, ES_EINVAL, "output '%s': dtype %d has no protocol datatype", nm,
                   (int)o->dtype);
  if (o->rank < 0 || o->rank > ES_MAX_RANK || (o->rank > 0 && !o->dims))
    return v2_fail(&e, ES_EINVAL, "output '%s': rank %d is not in [0, %d] (or no dims)", nm,
                   o->rank, ES_MAX_RANK);
  char shape[ES_MAX_RANK * 21 + 3];
  fmt_shape(shape, sizeof shape, o->dims, o->rank);
  uint64_t n = 1;
  for (int d = 0; d < o->rank; d++) {
    if (o->dims[d] < 0)
      return v2_fail(&e, ES_EINVAL, "output '%s': shape %s has a negative dimension", nm, shape);
    if (__builtin_mul_overflow(n, (uint64_t)o->dims[d], &n))
      return v2_fail(&e, ES_EINVAL, "output '%s': shape %s is too large", nm, shape);
  }
  if (o->nbytes && !o->data)
    return v2_fail(&e, ES_EINVAL, "output '%s' has no data", nm);
  if (bytes) {
    int rc = bytes_layout_check(o->data, o->nbytes, n, who, shape, &e);
    if (rc)
      return rc;
  } else if (n > SIZE_MAX / esize || n * esize != o->nbytes) {
    return v2_fail(&e, ES_EINVAL, "output '%s': shape %s needs %llu elements of %s, has %zu bytes",
                   nm, shape, (unsigned long long)n, es__v2_dtype_name(o->dtype), o->nbytes);
  }
  *count = n;
  return 0;
}

static int put_data(es_v2_buf *b, const es_v2_output *o, uint64_t count) {
  const unsigned char *s = o->data;
  if (o->dtype == ES_DTYPE_UNDEFINED) {
    size_t pos = 0;
    for (uint64_t i = 0; i < count; i++) {
      uint32_t l;
      memcpy(&l, s + pos, 4);
      if ((i && buf_put(b, ",", 1)))
        return ES_ENOMEM;
      int rc = buf_str(b, (const char *)s + pos + 4, l, 0);
      if (rc == ES_ENOMEM)
        return rc;
      if (rc)
        return es__fail(ES_EINVAL,
                        "output '%s': BYTES element %llu is not valid UTF-8, so it cannot be "
                        "JSON; ask for the output as binary data",
                        o->name, (unsigned long long)i);
      pos += 4 + (size_t)l;
    }
    return 0;
  }
  size_t es = es_dtype_size(o->dtype);
  for (uint64_t i = 0; i < count;) {
    uint64_t chunk = count - i < 4096 ? count - i : 4096;
    if (buf_reserve(b, (size_t)chunk * ES_V2_NUM_MAX))
      return ES_ENOMEM;
    char *w = b->p + b->len;
    for (uint64_t end = i + chunk; i < end; i++) {
      if (i)
        *w++ = ',';
      const unsigned char *v = s + i * es;
      switch (o->dtype) {
      case ES_DTYPE_FLOAT: {
        float f;
        memcpy(&f, v, 4);
        w = put_f32(w, f);
        break;
      }
      case ES_DTYPE_INT64: {
        int64_t x;
        memcpy(&x, v, 8);
        w = put_i64(w, x);
        break;
      }
      case ES_DTYPE_INT32: {
        int32_t x;
        memcpy(&x, v, 4);
        w = put_i64(w, x);
        break;
      }
      case ES_DTYPE_INT8:
        w = put_i64(w, (int8_t)v[0]);
        break;
      case ES_DTYPE_UINT8:
        w = put_u64(w, v[0]);
        break;
      case ES_DTYPE_BOOL:
        if (v[0]) {
          memcpy(w, "true", 4);
          w += 4;
        } else {
          memcpy(w, "false", 5);
          w += 5;
        }
        break;
      default:
        break;
      }
    }
    b->len = (size_t)(w - b->p);
  }
  return 0;
}

static int put_output(es_v2_buf *b, const es_v2_output *o, uint64_t count, int first) {
  char num[24];
  if (buf_puts(b, first ? "{\"name\":" : ",{\"name\":") ||
      buf_str(b, o->name, strlen(o->name), 1) || buf_puts(b, ",\"datatype\":\"") ||
      buf_puts(b, es__v2_dtype_name(o->dtype)) || buf_puts(b, "\",\"shape\":["))
    return ES_ENOMEM;
  for (int d = 0; d < o->rank; d++) {
    char *w = num;
    if (d)
      *w++ = ',';
    w = put_i64(w, o->dims[d]);
    if (buf_put(b, num, (size_t)(w - num)))
      return ES_ENOMEM;
  }
  if (o->binary) {
    char *w = put_u64(num, o->nbytes);
    if (buf_puts(b, "],\"parameters\":{\"binary_data_size\":") ||
        buf_put(b, num, (size_t)(w - num)) || buf_puts(b, "}}"))
      return ES_ENOMEM;
    return 0;
  }
  if (buf_puts(b, "],\"data\":["))
    return ES_ENOMEM;
  int rc = put_data(b, o, count);
  if (rc)
    return rc;
  return buf_puts(b, "]}") ? ES_ENOMEM : 0;
}

int es__v2_response_encode(const char *model, const char *version, const char *id,
                          const es_v2_output *outs, int n, char **body, size_t *len,
                          size_t *header_len) {
  if (!body || !len || !header_len || !model || n < 0 || (n > 0 && !outs))
    return es__fail(ES_EINVAL, "es__v2_response_encode: NULL argument or negative count");
  *body = NULL;
  *len = 0;
  *header_len = 0;
  size_t bin_total = 0;
  int any_bin = 0, rc;
  for (int i = 0; i < n; i++) {
    uint64_t count;
    if ((rc = output_check(&outs[i], i, &count)) != 0)
      return rc;
    if (outs[i].binary) {
      any_bin = 1;
      if (outs[i].nbytes > SIZE_MAX / 2 - bin_total)
        return es__fail(ES_EINVAL, "the binary outputs are too large");
      bin_total += outs[i].nbytes;
    }
  }
  es_v2_buf b = {NULL, 0, 0};
  rc = ES_ENOMEM;
  if (buf_puts(&b, "{\"model_name\":") || buf_str(&b, model, strlen(model), 1))
    goto fail;
  if (version && (buf_puts(&b, ",\"model_version\":") || buf_str(&b, version, strlen(version), 1)))
    goto fail;
  if (id && *id && (buf_puts(&b, ",\"id\":") || buf_str(&b, id, strlen(id), 1)))
    goto fail;
  if (buf_puts(&b, ",\"outputs\":["))
    goto fail;
  for (int i = 0; i < n; i++) {
    uint64_t count;
    output_check(&outs[i], i, &count);
    if ((rc = put_output(&b, &outs[i], count, i == 0)) != 0)
      goto fail;
  }
  rc = ES_ENOMEM;
  if (buf_puts(&b, "]}"))
    goto fail;
  if (any_bin) {
    *header_len = b.len;
    if (buf_reserve(&b, bin_total))
      goto fail;
    for (int i = 0; i < n; i++)
      if (outs[i].binary && outs[i].nbytes) {
        memcpy(b.p + b.len, outs[i].data, outs[i].nbytes);
        b.len += outs[i].nbytes;
      }
  }
  *body = b.p;
  *len = b.len;
  return 0;
fail:
  es_mem_free(b.p);
  *header_len = 0;
  if (rc == ES_ENOMEM)
    return es__fail(ES_ENOMEM, "out of memory encoding the response");
  return rc;
}

char *es__v2_error_body(const char *msg, size_t *len) {
  es_v2_buf b = {NULL, 0, 0};
  if (!msg)
    msg = "";
  if (len)
    *len = 0;
  if (buf_puts(&b, "{\"error\":") || buf_str(&b, msg, strlen(msg), 1) || buf_put(&b, "}", 2)) {
    es_mem_free(b.p);
    return NULL;
  }
  b.len--; /* the NUL is there for printing, not counted */
  if (len)
    *len = b.len;
  return b.p;
}
