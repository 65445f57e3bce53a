/* KServe v2 codec: requests parsed, responses encoded, hostile bodies
 * refused with a message that names the input and the problem.
 *
 * Every test checks, in its teardown, that the server tag's byte count is
 * back where it started: a leak anywhere in the codec fails the test that
 * caused it. The huge-shape test runs first, so "nothing big was allocated"
 * can be read off the tag's peak.
 *
 * Two oracles carry most of the weight. A response is a request in
 * disguise: its "outputs" have the shape of request inputs, so renaming the
 * key (same length: `"outputs":[` -> `"inputs" :[`) and parsing it again
 * must give back exactly the tensors that were encoded (bit for bit for
 * FP32: the encoder writes the shortest digits that read back). And a tiny
 * request writer of the test's own (flat or nested, random whitespace,
 * some inputs binary) feeds random tensors through the parser. */
#include "es_test.h"

#include "server/codec.h"

#include <float.h>
#include <jansson.h>
#include <math.h>
#include <string.h>

#define MAXEL ((size_t)1 << 24)

static size_t server_bytes(void) {
  es_mem_stats s;
  es_mem_stats_get(ES_MEM_SERVER, &s);
  return s.current;
}

static size_t start_bytes_;

static int setup(void **state) {
  (void)state;
  start_bytes_ = server_bytes();
  return 0;
}

static int teardown(void **state) {
  (void)state;
  size_t now = server_bytes();
  if (now != start_bytes_)
    fail_msg("server tag holds %zu bytes after the test, %zu before: a leak", now, start_bytes_);
  return 0;
}

/* ---- helpers ------------------------------------------------------------- */

static void parse_ok_(const char *body, size_t len, long long hl, es_v2_request *r, int line) {
  char err[512];
  int rc = es__v2_request_parse(body, len, hl, MAXEL, r, err, sizeof err);
  if (rc != 0)
    fail_msg("line %d: parse -> %s: %s\nbody: %.300s", line, es_err_name(rc), err, body);
}
#define PARSE_OK(body, r) parse_ok_((body), strlen(body), -1, (r), __LINE__)

/* The parse must fail with ES_EINVAL and a message holding every want. */
static void expect_fail_(const char *body, size_t len, long long hl, size_t max_el, const char *w1,
                         const char *w2, int line) {
  es_v2_request r;
  char err[512] = "untouched";
  size_t before = server_bytes();
  int rc = es__v2_request_parse(body, len, hl, max_el, &r, err, sizeof err);
  if (rc != ES_EINVAL)
    fail_msg("line %d: parse -> %s (%s), want ES_EINVAL\nbody: %.300s", line, es_err_name(rc), err,
             body);
  if ((w1 && !strstr(err, w1)) || (w2 && !strstr(err, w2)))
    fail_msg("line %d: message \"%s\" lacks \"%s\" / \"%s\"", line, err, w1 ? w1 : "",
             w2 ? w2 : "");
  if (strcmp(es_last_error_detail(), err) != 0)
    fail_msg("line %d: detail \"%s\" differs from err \"%s\"", line, es_last_error_detail(), err);
  if (r.storage || r.n_inputs)
    fail_msg("line %d: a failed parse left something in the request", line);
  if (server_bytes() != before)
    fail_msg("line %d: a failed parse leaked %lld bytes", line,
             (long long)(server_bytes() - before));
}
#define EXPECT_FAIL(body, w1, w2) expect_fail_((body), strlen(body), -1, MAXEL, (w1), (w2), __LINE__)

static int is_aligned(const void *p) { return ((uintptr_t)p & 63) == 0; }

/* A body made of a JSON header and binary bytes; *hl its header length. */
static char *with_binary(const char *json, const void *bin, size_t nbin, size_t *len) {
  size_t jl = strlen(json);
  /* One spare byte in front, so the body (and its binary part) is unaligned. */
  char *buf = malloc(jl + nbin + 2);
  char *b = buf + 1;
  memcpy(b, json, jl);
  memcpy(b + jl, bin, nbin);
  *len = jl + nbin;
  return b;
}
static void free_binary(char *b) { free(b - 1); }

/* Parses an encoded response again as a request: the same tensors. The
 * parsed binary tensors may point into the copy (aligned ones are used in
 * place), so the caller frees *copy_out after the request. */
static int reparse_response(const char *body, size_t len, size_t hl, es_v2_request *r, char *err,
                            size_t errlen, char **copy_out) {
  char *copy = malloc(len + 1);
  *copy_out = copy;
  memcpy(copy, body, len);
  copy[len] = '\0';
  char *k = strstr(copy, "\"outputs\":[");
  assert_non_null(k);
  memcpy(k, "\"inputs\" :[", 11);
  return es__v2_request_parse(copy, len, hl ? (long long)hl : -1, MAXEL, r, err, errlen);
}

static void check_reparse(const es_v2_output *outs, int n, int line) {
  char *body;
  size_t len, hl;
  int rc = es__v2_response_encode("m", "1", "rid", outs, n, &body, &len, &hl);
  if (rc)
    fail_msg("line %d: encode -> %s: %s", line, es_err_name(rc), es_last_error_detail());
  es_v2_request r;
  char err[512];
  char *copy;
  rc = reparse_response(body, len, hl, &r, err, sizeof err, &copy);
  if (rc)
    fail_msg("line %d: reparse -> %s: %s\n%.400s", line, es_err_name(rc), err, body);
  assert_int_equal(r.n_inputs, n);
  assert_string_equal(r.id, "rid");
  for (int i = 0; i < n; i++) {
    const es_v2_input *in = &r.inputs[i];
    assert_string_equal(in->name, outs[i].name);
    assert_int_equal(in->dtype, outs[i].dtype);
    assert_int_equal(in->is_bytes, outs[i].dtype == ES_DTYPE_UNDEFINED);
    assert_int_equal(in->rank, outs[i].rank);
    for (int d = 0; d < in->rank; d++)
      assert_int_equal(in->dims[d], outs[i].dims[d]);
    assert_int_equal(in->nbytes, outs[i].nbytes);
    if (in->nbytes && memcmp(in->data, outs[i].data, in->nbytes) != 0)
      fail_msg("line %d: output '%s' changed in the round trip\n%.400s", line, outs[i].name, body);
  }
  es__v2_request_free(&r);
  free(copy);
  es_mem_free(body);
}

/* ---- a tiny request writer for the property test ---------------------------- */

typedef struct tbuf {
  char *p;
  size_t len, cap;
} tbuf;

static void tb_put(tbuf *b, const void *s, size_t n) {
  if (b->len + n + 1 > b->cap) {
    b->cap = (b->len + n + 1) * 2;
    b->p = realloc(b->p, b->cap);
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

static void tb_printf(tbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tb_printf(tbuf *b, const char *fmt, ...) {
  char tmp[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  tb_put(b, tmp, (size_t)n);
}

static void tb_ws(tbuf *b, uint64_t *rng) {
  static const char *ws[] = {"", "", "", " ", "\n  ", "\t", "\r\n"};
  tb_printf(b, "%s", ws[es_test_rand(rng) % 7]);
}

static void tb_jstr(tbuf *b, const unsigned char *s, size_t n) {
  tb_put(b, "\"", 1);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = s[i];
    if (c == '"' || c == '\\')
      tb_printf(b, "\\%c", c);
    else if (c < 0x20)
      tb_printf(b, "\\u%04x", c);
    else
      tb_put(b, &c, 1);
  }
  tb_put(b, "\"", 1);
}

typedef struct ttensor {
  char name[40];
  es_dtype dtype;
  int is_bytes;
  int rank;
  int64_t dims[ES_MAX_RANK];
  uint64_t count;
  unsigned char *data;
  size_t nbytes;
  int binary, nested;
} ttensor;

static const es_dtype dtypes_[] = {ES_DTYPE_BOOL,  ES_DTYPE_UINT8, ES_DTYPE_INT8,     ES_DTYPE_INT32,
                                   ES_DTYPE_INT64, ES_DTYPE_FLOAT, ES_DTYPE_UNDEFINED};

static float rand_float(uint64_t *rng) {
  for (;;) {
    uint32_t bits = (uint32_t)es_test_rand(rng);
    switch (es_test_rand(rng) % 4) {
    case 0: /* small ordinary values */
      bits = (bits & 0x807fffffu) | ((uint32_t)(120 + es_test_rand(rng) % 16) << 23);
      break;
    case 1: /* integers */
    {
      float f = (float)((int32_t)(es_test_rand(rng) % 2001) - 1000);
      memcpy(&bits, &f, 4);
      break;
    }
    default: /* anything finite, subnormals included */
      break;
    }
    float f;
    memcpy(&f, &bits, 4);
    if (!isnan(f) && !isinf(f))
      return f;
  }
}

static void random_tensor(ttensor *t, int idx, uint64_t *rng) {
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, es_test_rand(rng) % 4 ? "in%d" : "in \"%d\"\\\t\u00e9", idx);
  t->dtype = dtypes_[es_test_rand(rng) % 7];
  t->is_bytes = t->dtype == ES_DTYPE_UNDEFINED;
  t->rank = (int)(es_test_rand(rng) % 5);
  t->count = 1;
  for (int d = 0; d < t->rank; d++) {
    t->dims[d] = (int64_t)(es_test_rand(rng) % 5);
    t->count *= (uint64_t)t->dims[d];
  }
  t->binary = es_test_rand(rng) % 3 == 0;
  t->nested = es_test_rand(rng) % 2;
  if (t->is_bytes) {
    tbuf b = {0};
    for (uint64_t i = 0; i < t->count; i++) {
      unsigned char s[16];
      uint32_t n = (uint32_t)(es_test_rand(rng) % 8);
      size_t k = 0;
      while (k < n) {
        uint64_t r = es_test_rand(rng) % 10;
        if (r == 0 && k + 2 <= 15) { /* é */
          s[k++] = 0xC3;
          s[k++] = 0xA9;
        } else if (r == 1) {
          s[k++] = (unsigned char)(es_test_rand(rng) % 32); /* control, NUL too */
        } else {
          s[k++] = (unsigned char)(32 + es_test_rand(rng) % 95);
        }
      }
      uint32_t l32 = (uint32_t)k;
      tb_put(&b, &l32, 4);
      tb_put(&b, s, k);
    }
    t->data = (unsigned char *)b.p;
    t->nbytes = b.len;
    if (!t->data)
      t->data = malloc(1);
    return;
  }
  size_t es = es_dtype_size(t->dtype);
  t->nbytes = (size_t)t->count * es;
  t->data = malloc(t->nbytes ? t->nbytes : 1);
  for (uint64_t i = 0; i < t->count; i++) {
    unsigned char *v = t->data + i * es;
    uint64_t r = es_test_rand(rng);
    switch (t->dtype) {
    case ES_DTYPE_BOOL:
      v[0] = (unsigned char)(r & 1);
      break;
    case ES_DTYPE_FLOAT: {
      float f = rand_float(rng);
      memcpy(v, &f, 4);
      break;
    }
    default: {
      if (r % 5 == 0) /* the extremes */
        r = (r & 8) ? ~(uint64_t)0 >> 1 : (uint64_t)1 << 63;
      if (t->dtype == ES_DTYPE_INT32 && r % 7 == 1)
        r = (uint64_t)(uint32_t)INT32_MIN;
      memcpy(v, &r, es);
      break;
    }
    }
  }
}

static void write_value(tbuf *b, const ttensor *t, uint64_t i, const unsigned char **bp,
                        uint64_t *rng) {
  if (t->is_bytes) {
    uint32_t l;
    memcpy(&l, *bp, 4);
    tb_jstr(b, *bp + 4, l);
    *bp += 4 + l;
    return;
  }
  const unsigned char *v = t->data + i * es_dtype_size(t->dtype);
  switch (t->dtype) {
  case ES_DTYPE_BOOL:
    tb_printf(b, "%s", es_test_rand(rng) % 2 ? (v[0] ? "true" : "false") : (v[0] ? "1" : "0"));
    break;
  case ES_DTYPE_UINT8:
    tb_printf(b, "%u", v[0]);
    break;
  case ES_DTYPE_INT8:
    tb_printf(b, "%d", (int8_t)v[0]);
    break;
  case ES_DTYPE_INT32: {
    int32_t x;
    memcpy(&x, v, 4);
    tb_printf(b, "%d", x);
    break;
  }
  case ES_DTYPE_INT64: {
    int64_t x;
    memcpy(&x, v, 8);
    tb_printf(b, "%lld", (long long)x);
    break;
  }
  default: {
    float f;
    memcpy(&f, v, 4);
    switch (es_test_rand(rng) % 4) {
    case 0:
      tb_printf(b, "%.9g", f);
      break;
    case 1:
      tb_printf(b, "%.17g", (double)f); /* past 15 digits: the long path */
      break;
    case 2:
      tb_printf(b, "%.12E", (double)f);
      break;
    default: /* long fractions, leading zeros (40 decimals hold small values) */
      tb_printf(b, fabsf(f) >= 1e-5f ? "%.40f" : "%.9g", (double)f);
      break;
    }
  }
  }
}

static void write_data(tbuf *b, const ttensor *t, int level, uint64_t *i,
                       const unsigned char **bp, uint64_t *rng) {
  tb_put(b, "[", 1);
  tb_ws(b, rng);
  if (!t->nested || t->rank <= 1) {
    for (uint64_t k = 0; k < t->count; k++) {
      if (k)
        tb_put(b, ",", 1), tb_ws(b, rng);
      write_value(b, t, (*i)++, bp, rng);
    }
  } else {
    for (int64_t k = 0; k < t->dims[level]; k++) {
      if (k)
        tb_put(b, ",", 1), tb_ws(b, rng);
      if (level + 1 == t->rank - 1) {
        tb_put(b, "[", 1);
        for (int64_t j = 0; j < t->dims[level + 1]; j++) {
          if (j)
            tb_put(b, ",", 1), tb_ws(b, rng);
          write_value(b, t, (*i)++, bp, rng);
        }
        tb_put(b, "]", 1);
      } else {
        write_data(b, t, level + 1, i, bp, rng);
      }
    }
  }
  tb_ws(b, rng);
  tb_put(b, "]", 1);
}

/* The request as text; *hl its header length or -1. */
static char *write_request(const ttensor *ts, int n, long long *hl, size_t *len, uint64_t *rng) {
  tbuf b = {0};
  int any_bin = 0;
  tb_printf(&b, "{\"id\":\"req\",");
  tb_ws(&b, rng);
  tb_printf(&b, "\"inputs\" : [");
  for (int k = 0; k < n; k++) {
    const ttensor *t = &ts[k];
    if (k)
      tb_put(&b, ",", 1);
    tb_put(&b, "{\"name\":", 8);
    tb_jstr(&b, (const unsigned char *)t->name, strlen(t->name));
    tb_printf(&b, ",\"datatype\":\"%s\",\"shape\":[", es__v2_dtype_name(t->dtype));
    for (int d = 0; d < t->rank; d++)
      tb_printf(&b, d ? ", %lld" : "%lld", (long long)t->dims[d]);
    tb_put(&b, "],", 2);
    tb_ws(&b, rng);
    if (t->binary) {
      any_bin = 1;
      tb_printf(&b, "\"parameters\":{\"binary_data_size\":%zu}}", t->nbytes);
    } else {
      uint64_t i = 0;
      const unsigned char *bp = t->data;
      tb_printf(&b, "\"data\":");
      write_data(&b, t, 0, &i, &bp, rng);
      tb_put(&b, "}", 1);
    }
  }
  tb_printf(&b, "]}");
  *hl = any_bin ? (long long)b.len : -1;
  for (int k = 0; k < n; k++)
    if (ts[k].binary)
      tb_put(&b, ts[k].data, ts[k].nbytes);
  *len = b.len;
  if (!b.p)
    tb_put(&b, "", 0);
  return b.p;
}

/* Binary tensors already 64-byte aligned in the body are used in place:
 * data then lies in [body, body + len) instead of the storage block. */
static void check_same_in(const es_v2_request *r, const ttensor *ts, int n, const char *body,
                          size_t len) {
  assert_int_equal(r->n_inputs, n);
  for (int k = 0; k < n; k++) {
    const es_v2_input *in = &r->inputs[k];
    assert_string_equal(in->name, ts[k].name);
    assert_int_equal(in->dtype, ts[k].dtype);
    assert_int_equal(in->is_bytes, ts[k].is_bytes);
    assert_int_equal(in->rank, ts[k].rank);
    for (int d = 0; d < in->rank; d++)
      assert_int_equal(in->dims[d], ts[k].dims[d]);
    assert_int_equal(in->nbytes, ts[k].nbytes);
    assert_true(is_aligned(in->data));
    const char *p = in->data;
    assert_true((p >= (const char *)r->storage &&
                 p + in->nbytes <= (const char *)r->storage + r->storage_bytes) ||
                (body && p >= body && p + in->nbytes <= body + len));
    if (in->nbytes && memcmp(in->data, ts[k].data, in->nbytes) != 0) {
      for (size_t i = 0; i < in->nbytes; i++)
        if (((const unsigned char *)in->data)[i] != ts[k].data[i])
          fail_msg("input '%s' (%s): byte %zu differs", in->name, es__v2_dtype_name(in->dtype), i);
    }
  }
}

/* ---- tests --------------------------------------------------------------- */

static void test_huge_shapes_allocate_nothing(void **state) {
  (void)state;
  es_mem_stats s0, s1;
  es_mem_stats_get(ES_MEM_SERVER, &s0);
  EXPECT_FAIL("{\"inputs\":[{\"name\":\"x\",\"shape\":[1000000,1000000,1000000],"
              "\"datatype\":\"FP32\",\"data\":[1]}]}",
              "input 'x'", "more elements than the limit");
  /* Within a generous limit but far beyond what the text can hold. */
  const char *b = "{\"inputs\":[{\"name\":\"x\",\"shape\":[100000000],\"datatype\":\"FP32\","
                  "\"data\":[1,2,3]}]}";
  expect_fail_(b, strlen(b), -1, SIZE_MAX, "input 'x'",
               "data has 3 elements, shape [100000000] needs 100000000", __LINE__);
  b = "{\"inputs\":[{\"name\":\"x\",\"shape\":[1000000,1000000,1000000],\"datatype\":\"FP32\","
      "\"data\":[1]}]}";
  expect_fail_(b, strlen(b), -1, SIZE_MAX, "input 'x'", "data has 1 elements", __LINE__);
  b = "{\"inputs\":[{\"name\":\"x\",\"shape\":[4294967296,4294967296,4294967296],"
      "\"datatype\":\"INT64\",\"data\":[1]}]}";
  expect_fail_(b, strlen(b), -1, SIZE_MAX, "input 'x'", "limit", __LINE__);
  /* Binary: the size is checked against the body, not trusted. */
  b = "{\"inputs\":[{\"name\":\"x\",\"shape\":[1000000000],\"datatype\":\"UINT8\","
      "\"parameters\":{\"binary_data_size\":1000000000}}]}";
  expect_fail_(b, strlen(b), (long long)strlen(b), SIZE_MAX, "input 'x'", "past the end",
               __LINE__);
  b = "{\"inputs\":[{\"name\":\"x\",\"shape\":[1000000],\"datatype\":\"BYTES\","
      "\"parameters\":{\"binary_data_size\":1000000000}}]}";
  expect_fail_(b, strlen(b), (long long)strlen(b), SIZE_MAX, "input 'x'", "past the end",
               __LINE__);
  es_mem_stats_get(ES_MEM_SERVER, &s1);
  assert_int_equal(s1.current, s0.current);
  size_t bound = s0.current + (1u << 20);
  if (s1.peak > s0.peak && s1.peak > bound)
    fail_msg("a refused request raised the server peak to %zu bytes", s1.peak);
}

static void test_dtype_names(void **state) {
  (void)state;
  struct {
    const char *name;
    es_dtype t;
    int bytes;
  } ok[] = {{"BOOL", ES_DTYPE_BOOL, 0},   {"UINT8", ES_DTYPE_UINT8, 0}, {"INT8", ES_DTYPE_INT8, 0},
            {"INT32", ES_DTYPE_INT32, 0}, {"INT64", ES_DTYPE_INT64, 0}, {"FP32", ES_DTYPE_FLOAT, 0},
            {"BYTES", ES_DTYPE_UNDEFINED, 1}};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    es_dtype t = (es_dtype)99;
    int b = -1;
    assert_int_equal(es__v2_dtype_parse(ok[i].name, &t, &b), 0);
    assert_int_equal(t, ok[i].t);
    assert_int_equal(b, ok[i].bytes);
    assert_string_equal(es__v2_dtype_name(t), ok[i].name);
  }
  const char *bad[] = {"FP64", "FP16", "BF16", "UINT16", "UINT32", "UINT64", "INT16",
                       "fp32", "FLOAT", "", " FP32"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    assert_int_equal(es__v2_dtype_parse(bad[i], NULL, NULL), -1);
  assert_int_equal(es__v2_dtype_parse(NULL, NULL, NULL), -1);
  assert_string_equal(es__v2_dtype_name((es_dtype)42), "INVALID");
}

static void test_json_every_dtype(void **state) {
  (void)state;
  es_v2_request r;
  PARSE_OK("{\"id\":\"a1\",\"inputs\":["
           "{\"name\":\"b\",\"shape\":[2,3],\"datatype\":\"BOOL\","
           "\"data\":[[true,false,1],[0,true,false]]},"
           "{\"name\":\"u\",\"shape\":[4],\"datatype\":\"UINT8\",\"data\":[0,1,254,255]},"
           "{\"name\":\"i8\",\"shape\":[2,2],\"datatype\":\"INT8\",\"data\":[-128,-1,0,127]},"
           "{\"name\":\"i32\",\"shape\":[1,2,2],\"datatype\":\"INT32\","
           "\"data\":[[[-2147483648,2147483647],[0,-0]]]},"
           "{\"name\":\"i64\",\"shape\":[3],\"datatype\":\"INT64\","
           "\"data\":[-9223372036854775808,9223372036854775807,12345678901234]},"
           "{\"name\":\"f\",\"shape\":[8],\"datatype\":\"FP32\","
           "\"data\":[0.1,-2.5e3,1E-45,3.4028234663852886e38,-0,0.0,1e-46,16777217]},"
           "{\"name\":\"s\",\"shape\":[],\"datatype\":\"FP32\",\"data\":[7]}"
           "]}",
           &r);
  assert_int_equal(r.n_inputs, 7);
  assert_string_equal(r.id, "a1");
  const uint8_t bools[] = {1, 0, 1, 0, 1, 0};
  assert_memory_equal(r.inputs[0].data, bools, 6);
  assert_int_equal(r.inputs[0].rank, 2);
  const uint8_t u8[] = {0, 1, 254, 255};
  assert_memory_equal(r.inputs[1].data, u8, 4);
  const int8_t i8[] = {-128, -1, 0, 127};
  assert_memory_equal(r.inputs[2].data, i8, 4);
  const int32_t i32[] = {INT32_MIN, INT32_MAX, 0, 0};
  assert_memory_equal(r.inputs[3].data, i32, 16);
  const int64_t i64[] = {INT64_MIN, INT64_MAX, 12345678901234};
  assert_memory_equal(r.inputs[4].data, i64, 24);
  const float *f = r.inputs[5].data;
  assert_true(f[0] == 0.1f && f[1] == -2500.0f && f[2] == 1e-45f && f[3] == FLT_MAX);
  assert_true(f[4] == 0.0f && signbit(f[4]) && f[5] == 0.0f && !signbit(f[5]));
  assert_true(f[6] == 0.0f && f[7] == 16777216.0f); /* ties to even */
  assert_int_equal(r.inputs[6].rank, 0);
  assert_true(*(const float *)r.inputs[6].data == 7.0f);
  for (int i = 0; i < r.n_inputs; i++)
    assert_true(is_aligned(r.inputs[i].data));

  /* Every one back through a JSON response and a binary one. */
  es_v2_output outs[7];
  for (int pass = 0; pass < 2; pass++) {
    for (int i = 0; i < 7; i++) {
      const es_v2_input *in = &r.inputs[i];
      outs[i] = (es_v2_output){in->name, in->dtype, in->rank, in->dims, in->data, in->nbytes,
                               pass};
    }
    check_reparse(outs, 7, __LINE__);
  }
  es__v2_request_free(&r);
  es__v2_request_free(&r); /* twice is harmless */
}

static void test_binary_every_dtype(void **state) {
  (void)state;
  unsigned char bin[64];
  const uint8_t b[] = {1, 0, 1};
  const int32_t i32[] = {-5, 7};
  const int64_t i64[] = {INT64_MIN, 3};
  const float f[] = {NAN, -INFINITY, 1.5f};
  const int8_t i8[] = {-3};
  size_t n = 0;
  memcpy(bin + n, b, 3), n += 3;
  memcpy(bin + n, i32, 8), n += 8;
  memcpy(bin + n, i64, 16), n += 16;
  memcpy(bin + n, f, 12), n += 12;
  memcpy(bin + n, i8, 1), n += 1;
  const char *json =
      "{\"inputs\":["
      "{\"name\":\"b\",\"shape\":[3],\"datatype\":\"BOOL\",\"parameters\":{\"binary_data_size\":3}},"
      "{\"name\":\"u\",\"shape\":[0,5],\"datatype\":\"UINT8\",\"data\":[]},"
      "{\"name\":\"i\",\"shape\":[2],\"datatype\":\"INT32\",\"parameters\":{\"binary_data_size\":8}},"
      "{\"name\":\"l\",\"shape\":[1,2],\"datatype\":\"INT64\","
      "\"parameters\":{\"binary_data_size\":16}},"
      "{\"name\":\"f\",\"shape\":[3],\"datatype\":\"FP32\",\"parameters\":{\"binary_data_size\":12}},"
      "{\"name\":\"c\",\"shape\":[1],\"datatype\":\"INT8\",\"parameters\":{\"binary_data_size\":1}}"
      "]}";
  size_t len;
  char *body = with_binary(json, bin, n, &len);
  es_v2_request r;
  parse_ok_(body, len, (long long)strlen(json), &r, __LINE__);
  assert_int_equal(r.n_inputs, 6);
  assert_memory_equal(r.inputs[0].data, b, 3);
  assert_int_equal(r.inputs[1].nbytes, 0);
  assert_memory_equal(r.inputs[2].data, i32, 8);
  assert_memory_equal(r.inputs[3].data, i64, 16);
  assert_memory_equal(r.inputs[4].data, f, 12); /* NaN bits kept */
  assert_memory_equal(r.inputs[5].data, i8, 1);
  for (int i = 0; i < 6; i++)
    assert_true(is_aligned(r.inputs[i].data));

  /* All binary out, then a mix; the binary part is in output order. */
  es_v2_output outs[6];
  for (int i = 0; i < 6; i++) {
    const es_v2_input *in = &r.inputs[i];
    outs[i] = (es_v2_output){in->name, in->dtype, in->rank, in->dims, in->data, in->nbytes, 1};
  }
  char *resp;
  size_t rlen, hl;
  ES_CHECK_RC(es__v2_response_encode("m", NULL, NULL, outs, 6, &resp, &rlen, &hl));
  assert_int_equal(rlen - hl, n);
  assert_memory_equal(resp + hl, bin, n);
  json_error_t je;
  json_t *j = json_loadb(resp, hl, 0, &je);
  assert_non_null(j);
  assert_int_equal(json_integer_value(json_object_get(
                       json_object_get(json_array_get(json_object_get(j, "outputs"), 4),
                                       "parameters"),
                       "binary_data_size")),
                   12);
  assert_null(json_object_get(j, "model_version"));
  assert_null(json_object_get(j, "id"));
  json_decref(j);
  es_mem_free(resp);
  check_reparse(outs, 6, __LINE__);
  outs[4].binary = 1; /* NaN stays binary */
  outs[0].binary = outs[2].binary = 0;
  check_reparse(outs, 6, __LINE__);
  es__v2_request_free(&r);
  free_binary(body);
}

static void test_bytes(void **state) {
  (void)state;
  es_v2_request r;
  PARSE_OK("{\"inputs\":[{\"name\":\"s\",\"shape\":[2,2],\"datatype\":\"BYTES\","
           "\"data\":[[\"ab\",\"\"],[\"\\u00e9\\n\\\"\",\"x\\u0000y\"]]},"
           "{\"name\":\"e\",\"shape\":[0],\"datatype\":\"BYTES\",\"data\":[]},"
           "{\"name\":\"t\",\"shape\":[1],\"datatype\":\"BYTES\",\"data\":[\"\xe2\x82\xac\"]}]}",
           &r);
  const unsigned char want[] = {2, 0, 0, 0, 'a', 'b', 0, 0,    0,   0,   4,   0, 0,
                                0, 0xC3, 0xA9, '\n', '"', 3, 0, 0, 0, 'x', 0, 'y'};
  assert_int_equal(r.inputs[0].nbytes, sizeof want);
  assert_memory_equal(r.inputs[0].data, want, sizeof want);
  assert_int_equal(r.inputs[0].is_bytes, 1);
  assert_int_equal(r.inputs[0].dtype, ES_DTYPE_UNDEFINED);
  assert_int_equal(r.inputs[1].nbytes, 0);
  assert_int_equal(r.inputs[2].nbytes, 7);
  es_v2_output outs[3];
  for (int pass = 0; pass < 2; pass++) {
    for (int i = 0; i < 3; i++) {
      const es_v2_input *in = &r.inputs[i];
      outs[i] = (es_v2_output){in->name, in->dtype, in->rank, in->dims, in->data, in->nbytes,
                               pass};
    }
    check_reparse(outs, 3, __LINE__);
  }
  es__v2_request_free(&r);

  /* Binary BYTES: any bytes, in the length-prefixed layout. */
  const unsigned char bin[] = {1, 0, 0, 0, 0xFF, 0, 0, 0, 0};
  const char *json = "{\"inputs\":[{\"name\":\"raw\",\"shape\":[2],\"datatype\":\"BYTES\","
                     "\"parameters\":{\"binary_data_size\":9}}]}";
  size_t len;
  char *body = with_binary(json, bin, sizeof bin, &len);
  parse_ok_(body, len, (long long)strlen(json), &r, __LINE__);
  assert_memory_equal(r.inputs[0].data, bin, sizeof bin);
  es_v2_output o = {"raw", ES_DTYPE_UNDEFINED, 1, r.inputs[0].dims, r.inputs[0].data, 9, 0};
  char *resp;
  size_t rlen, hl;
  /* 0xFF is not UTF-8: refused as JSON rather than changed... */
  ES_EXPECT_RC(es__v2_response_encode("m", NULL, NULL, &o, 1, &resp, &rlen, &hl), ES_EINVAL);
  assert_non_null(strstr(es_last_error_detail(), "output 'raw'"));
  assert_non_null(strstr(es_last_error_detail(), "UTF-8"));
  o.binary = 1; /* ...and fine as binary */
  check_reparse(&o, 1, __LINE__);
  es__v2_request_free(&r);
  free_binary(body);

  /* Broken binary layouts, each named. */
  struct {
    unsigned char b[12];
    size_t n;
    const char *want;
  } bad[] = {{{5, 0, 0, 0, 'a'}, 5, "BYTES element 0 is 5 bytes long"},
             {{1, 0, 0, 0, 'a', 1, 0}, 7, "ends inside the length of element 1"},
             {{1, 0, 0, 0, 'a', 1, 0, 0, 0, 'b', 'c'}, 11, "1 bytes after its 2 elements"},
             {{1, 0, 0, 0, 'a'}, 5, "has 1 elements, shape [2] needs 2"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char js[200];
    snprintf(js, sizeof js,
             "{\"inputs\":[{\"name\":\"raw\",\"shape\":[2],\"datatype\":\"BYTES\","
             "\"parameters\":{\"binary_data_size\":%zu}}]}",
             bad[i].n);
    body = with_binary(js, bad[i].b, bad[i].n, &len);
    expect_fail_(body, len, (long long)strlen(js), MAXEL, "input 'raw'", bad[i].want, __LINE__);
    free_binary(body);
  }
  EXPECT_FAIL("{\"inputs\":[{\"name\":\"s\",\"shape\":[1],\"datatype\":\"BYTES\",\"data\":[1]}]}",
              "input 's'", "BYTES data must be strings");
  EXPECT_FAIL("{\"inputs\":[{\"name\":\"s\",\"shape\":[2],\"datatype\":\"BYTES\","
              "\"data\":[\"a\",2]}]}",
              "input 's'", "element 1 is a number; BYTES data must be strings");
  EXPECT_FAIL("{\"inputs\":[{\"name\":\"s\",\"shape\":[3],\"datatype\":\"BYTES\","
              "\"data\":[\"a\",\"b\"]}]}",
              "input 's'", "data has 2 elements, shape [3] needs 3");
}

static void test_request_fields(void **state) {
  (void)state;
  es_v2_request r;
  PARSE_OK("{\"id\":\"r-7\",\"parameters\":{\"priority\":2,\"timeout\":1500000,"
           "\"binary_data_output\":true,\"other\":[1,{\"x\":null}]},"
           "\"data\":[\"not an input\"],"
           "\"inputs\":[{\"name\":\"x\",\"shape\":[2],\"datatype\":\"INT32\",\"data\":[1,2],"
           "\"parameters\":{\"data\":[9,9,9]}}],"
           "\"outputs\":[{\"name\":\"y\"},{\"name\":\"z\",\"parameters\":{\"binary_data\":false}},"
           "{\"name\":\"w\",\"parameters\":{\"binary_data\":true}}]}",
           &r);
  assert_string_equal(r.id, "r-7");
  assert_true(r.has_priority && r.priority == 2);
  assert_true(r.has_timeout && r.timeout_us == 1500000);
  assert_int_equal(r.binary_output, 1);
  assert_int_equal(r.n_outputs, 3);
  assert_string_equal(r.outputs[0].name, "y");
  assert_int_equal(r.outputs[0].binary, -1);
  assert_int_equal(r.outputs[1].binary, 0);
  assert_int_equal(r.outputs[2].binary, 1);
  const int32_t x[] = {1, 2};
  assert_memory_equal(r.inputs[0].data, x, 8);
  es__v2_request_free(&r);

  PARSE_OK("{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"INT64\",\"data\":[5]}],"
           "\"outputs\":[]}",
           &r);
  assert_string_equal(r.id, "");
  assert_int_equal(r.has_priority + r.has_timeout + r.binary_output + r.n_outputs, 0);
  es__v2_request_free(&r);

  /* Keys spelled with escapes are the same keys (the skim decodes them). */
  PARSE_OK("{\"in\\u0070uts\":[{\"name\":\"x\",\"shape\":[2],\"datatype\":\"FP32\","
           "\"d\\u0061ta\":[1.5,2]}]}",
           &r);
  assert_true(((const float *)r.inputs[0].data)[0] == 1.5f);
  es__v2_request_free(&r);
  /* A lone body with no header at all, with spaces everywhere. */
  PARSE_OK(" \n{ \"inputs\" : [ { \"name\" : \"x\" , \"shape\" : [ 2 , 1 ] , \"datatype\" : "
           "\"UINT8\" , \"data\" : [ [ 1 ] , [ 2 ] ] } ] }\n ",
           &r);
  assert_int_equal(((const uint8_t *)r.inputs[0].data)[1], 2);
  es__v2_request_free(&r);
}

static void test_input_errors(void **state) {
  (void)state;
#define IN1(dt, shape, rest)                                                                   \
  "{\"inputs\":[{\"name\":\"x\",\"shape\":" shape ",\"datatype\":\"" dt "\"" rest "}]}"
  EXPECT_FAIL(IN1("FP64", "[1]", ",\"data\":[1]"), "input 'x'",
              "datatype FP64 is not supported (BOOL, UINT8, INT8, INT32, INT64, FP32, BYTES)");
  EXPECT_FAIL(IN1("FP16", "[1]", ",\"data\":[1]"), "input 'x'", "FP16 is not supported");
  EXPECT_FAIL(IN1("FLOAT", "[1]", ",\"data\":[1]"), "input 'x'", "'FLOAT' is not a protocol");
  EXPECT_FAIL(IN1("FP32", "[1,1,1,1,1,1,1,1,1]", ",\"data\":[1]"), "input 'x'", "rank 9");
  EXPECT_FAIL(IN1("FP32", "[2,-1]", ",\"data\":[1]"), "input 'x'",
              "shape [2,-1] has a negative dimension");
  EXPECT_FAIL(IN1("FP32", "[2,\"3\"]", ",\"data\":[1]"), "input 'x'",
              "shape element 1 is a string");
  EXPECT_FAIL(IN1("FP32", "[1.5]", ",\"data\":[1]"), "input 'x'", "shape element 0 is a number");
  EXPECT_FAIL(IN1("FP32", "3", ",\"data\":[1]"), "input 'x'", "has no \"shape\"");
  expect_fail_(IN1("FP32", "[10,10]", ",\"data\":[1]"), strlen(IN1("FP32", "[10,10]", ",\"data\":[1]")),
               -1, 50, "input 'x'", "shape [10,10] has more elements than the limit of 50",
               __LINE__);
  EXPECT_FAIL(IN1("FP32", "[3]", ",\"data\":[1,2]"), "input 'x'",
              "data has 2 elements, shape [3] needs 3");
  EXPECT_FAIL(IN1("FP32", "[2]", ",\"data\":[1,2,3]"), "input 'x'",
              "data has more than 2 elements, shape [2] needs 2");
  EXPECT_FAIL(IN1("FP32", "[2,3]", ",\"data\":[[1,2],[3,4],[5,6]]"), "input 'x'",
              "does not match shape [2,3]: an array at depth 2 has 2 elements");
  EXPECT_FAIL(IN1("FP32", "[2,3]", ",\"data\":[[1,2,3],[4,5,6],[7,8,9]]"), "input 'x'",
              "an array at depth 1 has more than 2 elements");
  EXPECT_FAIL(IN1("FP32", "[2,1]", ",\"data\":[[1],2]"), "input 'x'", "a value at depth 1");
  EXPECT_FAIL(IN1("FP32", "[2,1]", ",\"data\":[1,[2]]"), "input 'x'", "mixes values and arrays");
  EXPECT_FAIL(IN1("FP32", "[2]", ",\"data\":[[1],[2]]"), "input 'x'", "nested deeper than shape [2]");
  EXPECT_FAIL(IN1("FP32", "[1,1]", ",\"data\":[[[1]]]"), "input 'x'", "nested deeper");
  EXPECT_FAIL(IN1("FP32", "[1]", ",\"data\":[\"1\"]"), "input 'x'",
              "element 0 is a string; FP32 data must be numbers");
  EXPECT_FAIL(IN1("FP32", "[2]", ",\"data\":[1,\"1\"]"), "input 'x'", "element 1 is a string");
  EXPECT_FAIL(IN1("FP32", "[2]", ",\"data\":[1,true]"), "input 'x'", "element 1 is true");
  EXPECT_FAIL(IN1("FP32", "[2]", ",\"data\":[1,null]"), "input 'x'", "element 1 is null");
  EXPECT_FAIL(IN1("FP32", "[1]", ",\"data\":[{}]"), "input 'x'", "element 0 is an object");
  EXPECT_FAIL(IN1("FP32", "[2]", ",\"data\":[1,3.5e38]"), "input 'x'",
              "element 1 (3.5e38) is out of range for FP32");
  EXPECT_FAIL(IN1("FP32", "[1]", ",\"data\":[-1e39]"), "input 'x'", "out of range for FP32");
  EXPECT_FAIL(IN1("INT32", "[2]", ",\"data\":[1,1.5]"), "input 'x'",
              "element 1 (1.5) is not an integer; INT32 data must be integers");
  EXPECT_FAIL(IN1("INT32", "[1]", ",\"data\":[1e3]"), "input 'x'", "(1e3) is not an integer");
  EXPECT_FAIL(IN1("INT32", "[1]", ",\"data\":[2147483648]"), "input 'x'",
              "(2147483648) is out of range for INT32");
  EXPECT_FAIL(IN1("INT32", "[1]", ",\"data\":[-2147483649]"), "input 'x'", "out of range");
  EXPECT_FAIL(IN1("INT8", "[1]", ",\"data\":[128]"), "input 'x'", "out of range for INT8");
  EXPECT_FAIL(IN1("INT8", "[1]", ",\"data\":[-129]"), "input 'x'", "out of range for INT8");
  EXPECT_FAIL(IN1("UINT8", "[1]", ",\"data\":[-1]"), "input 'x'", "out of range for UINT8");
  EXPECT_FAIL(IN1("UINT8", "[1]", ",\"data\":[256]"), "input 'x'", "out of range for UINT8");
  EXPECT_FAIL(IN1("INT64", "[1]", ",\"data\":[9223372036854775808]"), "input 'x'",
              "out of range for INT64");
  EXPECT_FAIL(IN1("INT64", "[1]", ",\"data\":[-9223372036854775809]"), "input 'x'",
              "out of range for INT64");
  EXPECT_FAIL(IN1("INT64", "[1]", ",\"data\":[100000000000000000000000]"), "input 'x'",
              "out of range for INT64");
  EXPECT_FAIL(IN1("INT64", "[1]", ",\"data\":[false]"), "input 'x'", "element 0 is false");
  EXPECT_FAIL(IN1("BOOL", "[1]", ",\"data\":[2]"), "input 'x'", "(2) is not true, false, 0 or 1");
  EXPECT_FAIL(IN1("BOOL", "[1]", ",\"data\":[-1]"), "input 'x'", "is not true, false, 0 or 1");
  EXPECT_FAIL(IN1("BOOL", "[1]", ",\"data\":[0.0]"), "input 'x'", "true, false, 0 or 1");
  EXPECT_FAIL(IN1("BOOL", "[1]", ",\"data\":[\"true\"]"), "input 'x'", "element 0 is a string");
  EXPECT_FAIL(IN1("FP32", "[1]", ",\"data\":5"), "input 'x'", "\"data\" is a number, not an array");
  EXPECT_FAIL(IN1("FP32", "[1]", ",\"data\":\"[1]\""), "input 'x'", "\"data\" is a string");
  EXPECT_FAIL(IN1("FP32", "[1]", ""), "input 'x'", "neither \"data\" nor");
  EXPECT_FAIL(IN1("FP32", "[1]", ",\"data\":[1],\"parameters\":{\"binary_data_size\":4}"),
              "input 'x'", "has both");
  EXPECT_FAIL(IN1("FP32", "[1]", ",\"parameters\":{\"binary_data_size\":4}"), "input 'x'",
              "no binary part");
  EXPECT_FAIL(IN1("FP32", "[1]", ",\"parameters\":[],\"data\":[1]"), "input 'x'",
              "\"parameters\" is not an object");
  EXPECT_FAIL(IN1("FP32", "[1]", ",\"parameters\":{\"binary_data_size\":-4}"), "input 'x'",
              "binary_data_size is not a non-negative integer");
  EXPECT_FAIL("{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"data\":[1]}]}", "input 'x'",
              "has no \"datatype\"");
  EXPECT_FAIL("{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":7,\"data\":[1]}]}",
              "input 'x'", "has no \"datatype\"");
  /* Names. */
  EXPECT_FAIL("{\"inputs\":[{\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}]}", "inputs[0]",
              "has no \"name\"");
  EXPECT_FAIL("{\"inputs\":[{\"name\":\"\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}]}",
              "inputs[0]", "name is empty");
  EXPECT_FAIL("{\"inputs\":[{\"name\":\"a\\u0000b\",\"shape\":[1],\"datatype\":\"FP32\","
              "\"data\":[1]}]}",
              "inputs[0]", "NUL");
  char big[600], name[200];
  memset(name, 'n', 128);
  name[128] = '\0';
  snprintf(big, sizeof big,
           "{\"inputs\":[{\"name\":\"%s\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}]}",
           name);
  EXPECT_FAIL(big, "inputs[0]", "name is 128 bytes long, at most 127");
  name[127] = '\0'; /* 127 is fine */
  snprintf(big, sizeof big,
           "{\"inputs\":[{\"name\":\"%s\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}]}",
           name);
  es_v2_request r;
  PARSE_OK(big, &r);
  assert_int_equal(strlen(r.inputs[0].name), 127);
  es__v2_request_free(&r);
  EXPECT_FAIL("{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]},"
              "{\"name\":\"y\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]},"
              "{\"name\":\"x\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}]}",
              "input 'x' appears twice", "inputs[0] and inputs[2]");
  EXPECT_FAIL("{\"inputs\":[3]}", "inputs[0]", "is not an object");
  EXPECT_FAIL("{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]},"
              "{\"name\":\"y\",\"shape\":[1],\"datatype\":\"FP64\",\"data\":[1]}]}",
              "input 'y'", "FP64");
#undef IN1
}

static void test_request_errors(void **state) {
  (void)state;
  const char *in = "{\"name\":\"x\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}";
  tbuf b = {0};
  /* 17 inputs / outputs. */
  tb_printf(&b, "{\"inputs\":[");
  for (int i = 0; i < 17; i++)
    tb_printf(&b, "%s{\"name\":\"x%d\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}",
              i ? "," : "", i);
  tb_printf(&b, "]}");
  EXPECT_FAIL(b.p, "more than 16 inputs", NULL);
  b.len = 0;
  tb_printf(&b, "{\"inputs\":[%s],\"outputs\":[", in);
  for (int i = 0; i < 17; i++)
    tb_printf(&b, "%s{\"name\":\"y%d\"}", i ? "," : "", i);
  tb_printf(&b, "]}");
  EXPECT_FAIL(b.p, "asks for 17 outputs, at most 16", NULL);
  free(b.p);
  char buf[1024];
#define REQ(fmt, ...) (snprintf(buf, sizeof buf, fmt, __VA_ARGS__), buf)
  EXPECT_FAIL(REQ("{\"inputs\":[%s],\"outputs\":[{\"name\":\"y\"},{\"name\":\"y\"}]}", in),
              "output 'y' is asked for twice", NULL);
  EXPECT_FAIL(REQ("{\"inputs\":[%s],\"outputs\":[{\"nam\":\"y\"}]}", in), "outputs[0]",
              "has no \"name\"");
  EXPECT_FAIL(REQ("{\"inputs\":[%s],\"outputs\":[{\"name\":\"y\",\"parameters\":"
                  "{\"binary_data\":1}}]}",
                  in),
              "output 'y'", "binary_data is not true or false");
  EXPECT_FAIL(REQ("{\"inputs\":[%s],\"outputs\":{}}", in), "\"outputs\" is an object", NULL);
  EXPECT_FAIL(REQ("{\"id\":7,\"inputs\":[%s]}", in), "\"id\" is a number", NULL);
  char id[200];
  memset(id, 'i', 128);
  id[128] = '\0';
  EXPECT_FAIL(REQ("{\"id\":\"%s\",\"inputs\":[%s]}", id, in), "\"id\" is 128 bytes long", NULL);
  EXPECT_FAIL(REQ("{\"parameters\":{\"priority\":-1},\"inputs\":[%s]}", in),
              "parameters.priority", NULL);
  EXPECT_FAIL(REQ("{\"parameters\":{\"timeout\":1.5},\"inputs\":[%s]}", in), "parameters.timeout",
              NULL);
  EXPECT_FAIL(REQ("{\"parameters\":{\"binary_data_output\":\"yes\"},\"inputs\":[%s]}", in),
              "binary_data_output", NULL);
  EXPECT_FAIL(REQ("{\"parameters\":3,\"inputs\":[%s]}", in), "\"parameters\" is a number", NULL);
  EXPECT_FAIL("{\"outputs\":[]}", "no \"inputs\"", NULL);
  EXPECT_FAIL("{\"inputs\":[]}", "\"inputs\" is empty", NULL);
  EXPECT_FAIL("{\"inputs\":{}}", "\"inputs\" is an object", NULL);
  EXPECT_FAIL("[{\"inputs\":[]}]", "not a JSON object", NULL);
#undef REQ
}

static void test_invalid_json(void **state) {
  (void)state;
  const char *bad[] = {
      "{",
      "{\"inputs\":[",
      "{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}]} x",
      "{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}]",
      "{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1}]}",
      "{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}]]}",
      "{'inputs':[]}",
      "{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"shape\":[1],\"datatype\":\"FP32\","
      "\"data\":[1]}]}",
      "{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1],"
      "\"data\":[2]}]}",
      "{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}],"
      "\"inputs\":[{\"name\":\"y\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}]}",
      "{\"inputs\":[{\"name\":\"x\xff\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}]}",
      "nul",
      "\"inputs\"",
      "{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}],}",
      /* Found by the fuzzer: a second array after "inputs" once restarted the
       * input count, and the data arrays came out of text order. */
      "{\"inputs\":[{\"name\":\"a\"},{\"name\":\"b\",\"data\":[1]}] [{\"data\":[2]}]}",
      "{\"inputs\":[{\"name\":\"a\"},{\"data\":[1]}] [{\"data\":[2]},{\"data\":[3]}]}",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    expect_fail_(bad[i], strlen(bad[i]), -1, MAXEL, "JSON", NULL, __LINE__);
  /* Inside data: the dedicated scanner is as strict as jansson. */
  const char *data[] = {"[1,,2]", "[1 2]",  "[1,]",    "[,1]", "[01]",       "[.5]",
                        "[1.]",   "[-]",    "[1e]",    "[1e+]", "[NaN]",     "[Infinity]",
                        "[+1]",   "[0x10]", "[1.5.2]", "[tru]", "[nulll]",  "[1,2]]",
                        "[1;2]",  "[\x01]", "[- 1]",   "[1,2,[3]]"};
  for (size_t i = 0; i < sizeof data / sizeof data[0]; i++) {
    char body[256];
    snprintf(body, sizeof body,
             "{\"inputs\":[{\"name\":\"x\",\"shape\":[2],\"datatype\":\"FP32\",\"data\":%s}]}",
             data[i]);
    expect_fail_(body, strlen(body), -1, MAXEL, NULL, NULL, __LINE__);
  }
  /* Deep nesting anywhere: refused, no stack blown. */
  size_t depth = 100000;
  char *deep = malloc(2 * depth + 160);
  size_t n = (size_t)sprintf(deep, "{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\","
                                   "\"shape\":[1,1,1,1,1,1,1,1],\"data\":");
  memset(deep + n, '[', depth);
  memset(deep + n + depth, ']', depth);
  strcpy(deep + n + 2 * depth, "}]}");
  expect_fail_(deep, strlen(deep), -1, MAXEL, "input 'x'", "nested deeper", __LINE__);
  n = (size_t)sprintf(deep, "{\"x\":");
  memset(deep + n, '[', depth);
  memset(deep + n + depth, ']', depth);
  strcpy(deep + n + 2 * depth, "}");
  expect_fail_(deep, strlen(deep), -1, MAXEL, "JSON", NULL, __LINE__);
  free(deep);
  /* Too many values for jansson outside the numeric arrays. */
  size_t many = 300000;
  char *wide = malloc(many * 4 + 200);
  n = (size_t)sprintf(wide, "{\"inputs\":[{\"name\":\"x\",\"shape\":[%zu],\"datatype\":\"BYTES\","
                            "\"data\":[", many);
  for (size_t i = 0; i < many; i++)
    n += (size_t)sprintf(wide + n, i ? ",\"\"" : "\"\"");
  strcpy(wide + n, "]}]}");
  expect_fail_(wide, strlen(wide), -1, MAXEL, "more than 262144 JSON values",
               "as binary data", __LINE__);
  free(wide);
  EXPECT_FAIL("", "empty", NULL);
}

static void test_binary_framing(void **state) {
  (void)state;
  const char *json = "{\"inputs\":[{\"name\":\"x\",\"shape\":[2],\"datatype\":\"FP32\","
                     "\"parameters\":{\"binary_data_size\":8}},"
                     "{\"name\":\"y\",\"shape\":[1],\"datatype\":\"INT32\",\"data\":[3]}]}";
  const float v[3] = {1.5f, -2.0f, 9.0f};
  size_t jl = strlen(json), len;
  char *body = with_binary(json, v, 12, &len); /* 4 bytes too many */
  es_v2_request r;
  parse_ok_(body, jl + 8, (long long)jl, &r, __LINE__);
  assert_memory_equal(r.inputs[0].data, v, 8);
  assert_true(is_aligned(r.inputs[0].data)); /* the body was not */
  assert_int_equal(*(const int32_t *)r.inputs[1].data, 3);
  es__v2_request_free(&r);
  expect_fail_(body, jl + 12, (long long)jl, MAXEL, "4 bytes follow the binary data of input 'x'",
               NULL, __LINE__);
  expect_fail_(body, jl + 4, (long long)jl, MAXEL, "input 'x'", "past the end", __LINE__);
  expect_fail_(body, jl, (long long)jl, MAXEL, "input 'x'", "past the end", __LINE__);
  expect_fail_(body, jl + 8, (long long)jl + 9, MAXEL, "larger than the body", NULL, __LINE__);
  expect_fail_(body, jl + 8, -2, MAXEL, "-2 is negative", NULL, __LINE__);
  expect_fail_(body, jl + 8, 0, MAXEL, "no JSON header", NULL, __LINE__);
  /* Not at the JSON's end: short, or reaching into the binary bytes. */
  expect_fail_(body, jl + 8, (long long)jl - 1, MAXEL, "invalid JSON header",
               "Inference-Header-Content-Length", __LINE__);
  expect_fail_(body, jl + 8, (long long)jl + 4, MAXEL, "invalid JSON header", NULL, __LINE__);
  /* The whole thing read as JSON, no header. */
  expect_fail_(body, jl + 8, -1, MAXEL, "invalid JSON", NULL, __LINE__);
  free_binary(body);
  /* Trailing whitespace in the header is still JSON. */
  char js2[300];
  snprintf(js2, sizeof js2, "%s  \n", json);
  body = with_binary(js2, v, 8, &len);
  parse_ok_(body, len, (long long)strlen(js2), &r, __LINE__);
  es__v2_request_free(&r);
  free_binary(body);
  /* A header with no binary inputs, and bytes after it. */
  const char *j3 = "{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"INT32\",\"data\":[3]}]}";
  body = with_binary(j3, v, 4, &len);
  expect_fail_(body, len, (long long)strlen(j3), MAXEL, "4 bytes follow the JSON header",
               "no input has", __LINE__);
  parse_ok_(body, strlen(j3), (long long)strlen(j3), &r, __LINE__);
  es__v2_request_free(&r);
  free_binary(body);
  /* Sizes that do not match the shape. */
  const char *j4 = "{\"inputs\":[{\"name\":\"x\",\"shape\":[1,3,640,640],\"datatype\":\"FP32\","
                   "\"parameters\":{\"binary_data_size\":100}}]}";
  body = with_binary(j4, v, 12, &len);
  expect_fail_(body, len, (long long)strlen(j4), MAXEL,
               "input 'x': shape [1,3,640,640] needs 4915200 bytes of FP32, got 100", NULL,
               __LINE__);
  free_binary(body);
  const unsigned char bools[3] = {1, 2, 0};
  const char *j5 = "{\"inputs\":[{\"name\":\"m\",\"shape\":[3],\"datatype\":\"BOOL\","
                   "\"parameters\":{\"binary_data_size\":3}}]}";
  body = with_binary(j5, bools, 3, &len);
  expect_fail_(body, len, (long long)strlen(j5), MAXEL, "input 'm'",
               "BOOL element 1 is 0x02, not 0 or 1", __LINE__);
  free_binary(body);
  /* Two binary inputs: bytes in input order. */
  const char *j6 = "{\"inputs\":[{\"name\":\"a\",\"shape\":[1],\"datatype\":\"INT32\","
                   "\"parameters\":{\"binary_data_size\":4}},"
                   "{\"name\":\"b\",\"shape\":[2],\"datatype\":\"FP32\","
                   "\"parameters\":{\"binary_data_size\":8}}]}";
  body = with_binary(j6, v, 12, &len);
  parse_ok_(body, len, (long long)strlen(j6), &r, __LINE__);
  assert_memory_equal(r.inputs[0].data, &v[0], 4);
  assert_memory_equal(r.inputs[1].data, &v[1], 8);
  es__v2_request_free(&r);
  free_binary(body);
}

/* Our FP32 reading against strtof's, on text meant to be hard. */
static void test_fp32_parse_exact(void **state) {
  (void)state;
  uint64_t rng = es_test_seed();
  tbuf list = {0};
  int n = 0;
  static const char *fixed[] = {
      "1.000000059604644775390625",       /* exact midpoint: ties to even, 1 */
      "1.000000059604644775390625000001", /* just above: up */
      "1.0000000596046447753906249999",   /* just below: down */
      "1.00000017881393432617187499",     /* below the next midpoint */
      "1.000000178813934326171875",       /* midpoint, ties to even (up) */
      "3.4028235677973365e38",            /* just under the overflow threshold */
      "1.1754942e-38",  "1.17549435e-38", "1.4e-45", "7.006492321624086e-46",
      "7.006492321624085e-46", "2.8e-45", "0.000000000000000000000000000000000000000001",
      "123456789012345678901234567890", "0.1", "0.2", "0.3", "1e22", "1e23", "9007199254740993",
      "4.35e-40", "-0", "-0.0e5", "0e-100000000", "1e-100000000", "16777217", "16777219",
      "33554435", "0.99999997", "0.999999985", "2147483647", "-2147483648"};
  for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
    tb_printf(&list, "%s%s", n++ ? "," : "", fixed[i]);
  /* 1000 digits of a value that sits on a midpoint until the very end. */
  tb_printf(&list, ",1.000000059604644775390625");
  for (int i = 0; i < 1000; i++)
    tb_put(&list, "0", 1);
  tb_put(&list, "1", 1);
  n++;
  for (; n < 20000; n++) {
    char tmp[64];
    float f = rand_float(&rng);
    double d = (double)f;
    switch (es_test_rand(&rng) % 5) {
    case 0: /* a random double near the float */
      d *= 1.0 + ((double)(int64_t)(es_test_rand(&rng) % 2001 - 1000)) * 1e-10;
      snprintf(tmp, sizeof tmp, "%.17g", d);
      break;
    case 1: /* a float midpoint, exactly */
      d = ((double)f + (double)nextafterf(f, INFINITY)) / 2;
      snprintf(tmp, sizeof tmp, "%.40g", d);
      break;
    case 2:
      snprintf(tmp, sizeof tmp, "%.9g", f);
      break;
    case 3:
      snprintf(tmp, sizeof tmp, "%.6e", d);
      break;
    default:
      snprintf(tmp, sizeof tmp, "%.25f", d);
      break;
    }
    if (isinf(strtof(tmp, NULL))) {
      n--;
      continue;
    }
    tb_printf(&list, ",%s", tmp);
  }
  tbuf body = {0};
  tb_printf(&body, "{\"inputs\":[{\"name\":\"f\",\"shape\":[%d],\"datatype\":\"FP32\",\"data\":[",
            n);
  tb_put(&body, list.p, list.len);
  tb_printf(&body, "]}]}");
  es_v2_request r;
  parse_ok_(body.p, body.len, -1, &r, __LINE__);
  const float *got = r.inputs[0].data;
  char *save, *tok = strtok_r(list.p, ",", &save);
  for (int i = 0; i < n; i++, tok = strtok_r(NULL, ",", &save)) {
    float want = strtof(tok, NULL);
    if (memcmp(&want, &got[i], 4) != 0)
      fail_msg("element %d \"%.60s\": got %.9g, strtof %.9g", i, tok, got[i], want);
  }
  es__v2_request_free(&r);
  free(list.p);
  free(body.p);
}

static int sig_digits(const char *s) {
  char m[64];
  size_t k = 0;
  for (; *s && *s != 'e'; s++)
    if (*s >= '0' && *s <= '9')
      m[k++] = *s;
  m[k] = '\0';
  char *p = m;
  while (*p == '0')
    p++;
  size_t n = strlen(p);
  while (n && p[n - 1] == '0')
    n--;
  return (int)n;
}

/* The out-pointers live in the caller's frame: gcc 12 at -O3 suspects
 * the encoder of storing a local's address in *body and returning it. */
static void encode_one(float *vals, const int64_t *n, char **body, size_t *len) {
  es_v2_output o = {"y", ES_DTYPE_FLOAT, 1, n, vals, (size_t)*n * 4, 0};
  size_t hl;
  ES_CHECK_RC(es__v2_response_encode("m", NULL, NULL, &o, 1, body, len, &hl));
  assert_int_equal(hl, 0);
}

static void test_fp32_encode(void **state) {
  (void)state;
  struct {
    float f;
    const char *s;
  } cases[] = {{0.1f, "0.1"},
               {1.0f / 3, "0.33333334"},
               {1e-45f, "1e-45"},
               {FLT_MAX, "3.4028235e38"},
               {-FLT_MAX, "-3.4028235e38"},
               {FLT_MIN, "1.1754944e-38"},
               {16777216.0f, "16777216"},
               {1e10f, "10000000000"},
               {1e16f, "1e16"},
               {-0.0f, "-0.0"},
               {0.0f, "0"},
               {1.5e-7f, "1.5e-7"},
               {3e-6f, "0.000003"},
               {123456.7f, "123456.7"},
               {-2.5f, "-2.5"},
               {100.0f, "100"},
               {0.3f, "0.3"},
               {NAN, "null"},
               {INFINITY, "null"},
               {-INFINITY, "null"}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    size_t len;
    const int64_t one = 1;
    char *body;
    encode_one(&cases[i].f, &one, &body, &len);
    char want[128];
    snprintf(want, sizeof want, "\"data\":[%s]}]}", cases[i].s);
    if (len < strlen(want) || memcmp(body + len - strlen(want), want, strlen(want)) != 0)
      fail_msg("%.9g: got %.*s, want %s", (double)cases[i].f, (int)len, body, want);
    es_mem_free(body);
  }
  /* Random floats: each reads back exactly and has the fewest digits that
   * do (found by brute force with printf and strtof). */
  uint64_t rng = es_test_seed();
  enum { N = 100000 };
  float *v = malloc(N * sizeof *v);
  for (int i = 0; i < N; i++) {
    uint32_t bits = (uint32_t)es_test_rand(&rng);
    memcpy(&v[i], &bits, 4);
    if (isnan(v[i]) || isinf(v[i]))
      v[i] = rand_float(&rng);
  }
  size_t len;
  const int64_t nv = N;
  char *body;
  encode_one(v, &nv, &body, &len);
  char *s = strstr(body, "\"data\":[") + 8;
  int longer = 0;
  for (int i = 0; i < N; i++) {
    char *end;
    float back = strtof(s, &end);
    char tok[64];
    snprintf(tok, sizeof tok, "%.*s", (int)(end - s), s);
    if (memcmp(&back, &v[i], 4) != 0)
      fail_msg("%.9g written as %s reads back as %.9g", (double)v[i], tok, (double)back);
    int p = 1;
    for (; p < 9; p++) {
      char t[64];
      snprintf(t, sizeof t, "%.*e", p - 1, (double)v[i]);
      if (strtof(t, NULL) == v[i])
        break;
    }
    if (sig_digits(tok) > p && v[i] != 0.0f)
      longer++;
    s = end + 1;
  }
  print_message("# %d of %d values written with more digits than needed\n", longer, N);
  assert_true(longer <= N / 10000);
  es_mem_free(body);
  free(v);
}

static void test_response(void **state) {
  (void)state;
  float y[2] = {0.1f, -2.5f};
  int64_t ydims[1] = {2};
  int64_t z = -7;
  uint8_t bo[3] = {1, 0, 5};
  int64_t bdims[2] = {1, 3};
  es_v2_output outs[3] = {{"y", ES_DTYPE_FLOAT, 1, ydims, y, 8, 0},
                          {"z", ES_DTYPE_INT64, 0, NULL, &z, 8, 0},
                          {"b\"\n", ES_DTYPE_BOOL, 2, bdims, bo, 3, 0}};
  char *body;
  size_t len, hl;
  ES_CHECK_RC(es__v2_response_encode("det", "1", "r", outs, 3, &body, &len, &hl));
  const char *want =
      "{\"model_name\":\"det\",\"model_version\":\"1\",\"id\":\"r\",\"outputs\":["
      "{\"name\":\"y\",\"datatype\":\"FP32\",\"shape\":[2],\"data\":[0.1,-2.5]},"
      "{\"name\":\"z\",\"datatype\":\"INT64\",\"shape\":[],\"data\":[-7]},"
      "{\"name\":\"b\\\"\\n\",\"datatype\":\"BOOL\",\"shape\":[1,3],\"data\":[true,false,true]}]}";
  assert_int_equal(hl, 0);
  assert_int_equal(len, strlen(want));
  assert_memory_equal(body, want, len);
  es_mem_free(body);
  /* No version, empty id, no outputs. */
  ES_CHECK_RC(es__v2_response_encode("m", NULL, "", NULL, 0, &body, &len, &hl));
  want = "{\"model_name\":\"m\",\"outputs\":[]}";
  assert_int_equal(len, strlen(want));
  assert_memory_equal(body, want, len);
  es_mem_free(body);
  /* Binary: the JSON's length is the header, then the bytes. */
  outs[0].binary = 1;
  ES_CHECK_RC(es__v2_response_encode("m", NULL, NULL, outs, 2, &body, &len, &hl));
  want = "{\"model_name\":\"m\",\"outputs\":[{\"name\":\"y\",\"datatype\":\"FP32\",\"shape\":[2],"
         "\"parameters\":{\"binary_data_size\":8}},"
         "{\"name\":\"z\",\"datatype\":\"INT64\",\"shape\":[],\"data\":[-7]}]}";
  assert_int_equal(hl, strlen(want));
  assert_int_equal(len, hl + 8);
  assert_memory_equal(body, want, hl);
  assert_memory_equal(body + hl, y, 8);
  es_mem_free(body);
  /* Non-finite values: null. */
  float nf[4] = {NAN, INFINITY, -INFINITY, 1};
  int64_t nd = 4;
  es_v2_output o = {"n", ES_DTYPE_FLOAT, 1, &nd, nf, 16, 0};
  ES_CHECK_RC(es__v2_response_encode("m", NULL, NULL, &o, 1, &body, &len, &hl));
  assert_non_null(memmem(body, len, "\"data\":[null,null,null,1]", 25));
  es_mem_free(body);
  /* Metadata that is not UTF-8 is replaced, so the body stays JSON. */
  ES_CHECK_RC(es__v2_response_encode("m\xff", NULL, "id\xc3", &o, 1, &body, &len, &hl));
  json_error_t je;
  json_t *j = json_loadb(body, len, 0, &je);
  assert_non_null(j);
  assert_string_equal(json_string_value(json_object_get(j, "model_name")), "m\xef\xbf\xbd");
  json_decref(j);
  es_mem_free(body);
  /* Refused outputs, named. */
  o.nbytes = 12;
  ES_EXPECT_RC(es__v2_response_encode("m", NULL, NULL, &o, 1, &body, &len, &hl), ES_EINVAL);
  assert_non_null(strstr(es_last_error_detail(), "output 'n'"));
  assert_non_null(strstr(es_last_error_detail(), "needs 4 elements of FP32, has 12 bytes"));
  o.nbytes = 16;
  nd = -1;
  ES_EXPECT_RC(es__v2_response_encode("m", NULL, NULL, &o, 1, &body, &len, &hl), ES_EINVAL);
  assert_non_null(strstr(es_last_error_detail(), "negative"));
  nd = 4;
  o.rank = 9;
  ES_EXPECT_RC(es__v2_response_encode("m", NULL, NULL, &o, 1, &body, &len, &hl), ES_EINVAL);
  o.rank = 1;
  o.dtype = (es_dtype)5;
  ES_EXPECT_RC(es__v2_response_encode("m", NULL, NULL, &o, 1, &body, &len, &hl), ES_EINVAL);
  o.dtype = ES_DTYPE_FLOAT;
  o.name = NULL;
  ES_EXPECT_RC(es__v2_response_encode("m", NULL, NULL, &o, 1, &body, &len, &hl), ES_EINVAL);
  ES_EXPECT_RC(es__v2_response_encode(NULL, NULL, NULL, NULL, 0, &body, &len, &hl), ES_EINVAL);
  ES_EXPECT_RC(es__v2_response_encode("m", NULL, NULL, NULL, -1, &body, &len, &hl), ES_EINVAL);
  /* Integers at their extremes. */
  int64_t l[2] = {INT64_MIN, INT64_MAX};
  int32_t i[2] = {INT32_MIN, INT32_MAX};
  int8_t c[2] = {-128, 127};
  uint8_t u[2] = {0, 255};
  int64_t two = 2;
  es_v2_output ints[4] = {{"l", ES_DTYPE_INT64, 1, &two, l, 16, 0},
                          {"i", ES_DTYPE_INT32, 1, &two, i, 8, 0},
                          {"c", ES_DTYPE_INT8, 1, &two, c, 2, 0},
                          {"u", ES_DTYPE_UINT8, 1, &two, u, 2, 0}};
  ES_CHECK_RC(es__v2_response_encode("m", NULL, NULL, ints, 4, &body, &len, &hl));
  assert_non_null(memmem(body, len, "[-9223372036854775808,9223372036854775807]", 42));
  assert_non_null(memmem(body, len, "[-2147483648,2147483647]", 24));
  assert_non_null(memmem(body, len, "[-128,127]", 10));
  assert_non_null(memmem(body, len, "[0,255]", 7));
  es_mem_free(body);
  check_reparse(ints, 4, __LINE__);
}

static void test_error_body(void **state) {
  (void)state;
  size_t len;
  char *b = es__v2_error_body("input 'x': bad \"q\"\\\n\x01\xff\xe2\x82\xac", &len);
  assert_non_null(b);
  const char *want = "{\"error\":\"input 'x': bad \\\"q\\\"\\\\\\n\\u0001\\ufffd\xe2\x82\xac\"}";
  assert_string_equal(b, want);
  assert_int_equal(len, strlen(want));
  json_error_t je;
  json_t *j = json_loadb(b, len, 0, &je);
  assert_non_null(j);
  json_decref(j);
  es_mem_free(b);
  b = es__v2_error_body(NULL, NULL);
  assert_string_equal(b, "{\"error\":\"\"}");
  es_mem_free(b);
}

static void test_property_roundtrip(void **state) {
  (void)state;
  uint64_t rng = es_test_seed();
  ttensor ts[ES_V2_MAX_IO];
  for (int iter = 0; iter < 3000; iter++) {
    int n = 1 + (int)(es_test_rand(&rng) % 5);
    for (int k = 0; k < n; k++)
      random_tensor(&ts[k], k, &rng);
    long long hl;
    size_t len;
    char *body = write_request(ts, n, &hl, &len, &rng);
    es_v2_request r;
    char err[512];
    int rc = es__v2_request_parse(body, len, hl, MAXEL, &r, err, sizeof err);
    if (rc)
      fail_msg("iteration %d: %s: %s\n%.600s", iter, es_err_name(rc), err, body);
    check_same_in(&r, ts, n, body, len);
    es_v2_output outs[ES_V2_MAX_IO];
    for (int k = 0; k < n; k++) {
      const es_v2_input *in = &r.inputs[k];
      outs[k] = (es_v2_output){in->name, in->dtype, in->rank, in->dims, in->data, in->nbytes,
                               (int)(es_test_rand(&rng) % 2)};
    }
    check_reparse(outs, n, __LINE__);
    es__v2_request_free(&r);
    /* Every strict prefix of a JSON-only body is refused (never a crash). */
    if (hl < 0 && iter % 50 == 0)
      for (size_t cut = 0; cut < len; cut += 1 + len / 40) {
        rc = es__v2_request_parse(body, cut, -1, MAXEL, &r, err, sizeof err);
        if (rc != ES_EINVAL)
          fail_msg("prefix of %zu bytes: %s", cut, es_err_name(rc));
      }
    free(body);
    for (int k = 0; k < n; k++)
      free(ts[k].data);
  }
}

/* A det-like tensor (at test size) through JSON both ways. */
static void test_large_tensor(void **state) {
  (void)state;
  int64_t dims[4] = {1, 3, 64, 64};
  size_t n = 3 * 64 * 64;
  float *v = malloc(n * sizeof *v);
  uint64_t rng = 42;
  for (size_t i = 0; i < n; i++)
    v[i] = (float)(es_test_rand(&rng) >> 40) / (float)(1 << 24);
  es_v2_output o = {"x", ES_DTYPE_FLOAT, 4, dims, v, n * 4, 0};
  check_reparse(&o, 1, __LINE__);
  free(v);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_huge_shapes_allocate_nothing, setup, teardown),
      cmocka_unit_test_setup_teardown(test_dtype_names, setup, teardown),
      cmocka_unit_test_setup_teardown(test_json_every_dtype, setup, teardown),
      cmocka_unit_test_setup_teardown(test_binary_every_dtype, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bytes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_request_fields, setup, teardown),
      cmocka_unit_test_setup_teardown(test_input_errors, setup, teardown),
      cmocka_unit_test_setup_teardown(test_request_errors, setup, teardown),
      cmocka_unit_test_setup_teardown(test_invalid_json, setup, teardown),
      cmocka_unit_test_setup_teardown(test_binary_framing, setup, teardown),
      cmocka_unit_test_setup_teardown(test_fp32_parse_exact, setup, teardown),
      cmocka_unit_test_setup_teardown(test_fp32_encode, setup, teardown),
      cmocka_unit_test_setup_teardown(test_response, setup, teardown),
      cmocka_unit_test_setup_teardown(test_error_body, setup, teardown),
      cmocka_unit_test_setup_teardown(test_property_roundtrip, setup, teardown),
      cmocka_unit_test_setup_teardown(test_large_tensor, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
