/* NumPy .npy reader and writer.
 *
 * The header is a Python dict literal; we accept exactly the keys numpy
 * writes ('descr', 'fortran_order', 'shape') and parse them by hand, with
 * every length checked against the file, because input files come from
 * users. Only little-endian, C-order arrays of the engine's types. */
#include "cli/npy.h"
#include "common/internal.h"
#include "edgeserve/memory.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
  const char *descr;
  es_dtype dtype;
} npy_types_[] = {
    {"<f4", ES_DTYPE_FLOAT}, {"<i8", ES_DTYPE_INT64}, {"<i4", ES_DTYPE_INT32},
    {"|b1", ES_DTYPE_BOOL},  {"|u1", ES_DTYPE_UINT8}, {"|i1", ES_DTYPE_INT8},
};

static const char *find_key(const char *h, const char *key) {
  const char *p = strstr(h, key);
  if (!p)
    return NULL;
  p += strlen(key);
  while (*p == ' ')
    p++;
  if (*p != ':')
    return NULL;
  p++;
  while (*p == ' ')
    p++;
  return p;
}

static int parse_header(const char *path, const char *h, es_tensor *t) {
  const char *d = find_key(h, "'descr'");
  if (!d || *d != '\'')
    return es__fail(ES_EINVAL, "%s: .npy header has no 'descr'", path);
  d++;
  t->dtype = ES_DTYPE_UNDEFINED;
  for (size_t i = 0; i < sizeof npy_types_ / sizeof npy_types_[0]; i++)
    if (!strncmp(d, npy_types_[i].descr, 3) && d[3] == '\'')
      t->dtype = npy_types_[i].dtype;
  if (t->dtype == ES_DTYPE_UNDEFINED)
    return es__fail(ES_EINVAL, "%s: element type '%.8s' is not supported (float32, int64, int32, "
                    "bool, uint8, int8; little-endian)", path, d);
  const char *f = find_key(h, "'fortran_order'");
  if (!f || strncmp(f, "False", 5))
    return es__fail(ES_EINVAL, "%s: only C-order arrays are supported", path);
  const char *s = find_key(h, "'shape'");
  if (!s || *s != '(')
    return es__fail(ES_EINVAL, "%s: .npy header has no 'shape'", path);
  s++;
  t->rank = 0;
  for (;;) {
    while (*s == ' ' || *s == ',')
      s++;
    if (*s == ')')
      break;
    if (*s < '0' || *s > '9')
      return es__fail(ES_EINVAL, "%s: malformed shape in the .npy header", path);
    if (t->rank == ES_MAX_RANK)
      return es__fail(ES_EINVAL, "%s: rank above %d", path, ES_MAX_RANK);
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (v > ((unsigned long long)1 << 40))
      return es__fail(ES_EINVAL, "%s: dimension %llu is too large", path, v);
    t->dims[t->rank++] = (int64_t)v;
    s = end;
  }
  uint64_t n = 1;
  for (int i = 0; i < t->rank; i++)
    if (__builtin_mul_overflow(n, (uint64_t)t->dims[i], &n) || n > ((uint64_t)1 << 40))
      return es__fail(ES_EINVAL, "%s: shape too large", path);
  t->nbytes = (size_t)n * es_dtype_size(t->dtype);
  return 0;
}

int cli_npy_read(const char *path, es_tensor *t) {
  if (!path || !t)
    return es__fail(ES_EINVAL, "cli_npy_read: NULL argument");
  memset(t, 0, sizeof *t);
  FILE *f = fopen(path, "rb");
  if (!f)
    return es__fail(ES_ENOENT, "cannot open '%s'", path);
  unsigned char pre[12];
  int rc = 0;
  char *hdr = NULL;
  if (fread(pre, 1, 10, f) != 10 || memcmp(pre, "\x93NUMPY", 6)) {
    rc = es__fail(ES_EINVAL, "%s: not a .npy file", path);
    goto out;
  }
  size_t hlen;
  if (pre[6] == 1) {
    hlen = (size_t)pre[8] | (size_t)pre[9] << 8;
  } else if (pre[6] == 2 || pre[6] == 3) {
    if (fread(pre + 10, 1, 2, f) != 2) {
      rc = es__fail(ES_EINVAL, "%s: truncated .npy header", path);
      goto out;
    }
    hlen = (size_t)pre[8] | (size_t)pre[9] << 8 | (size_t)pre[10] << 16 | (size_t)pre[11] << 24;
  } else {
    rc = es__fail(ES_EINVAL, "%s: .npy version %d is not supported", path, pre[6]);
    goto out;
  }
  if (hlen > 65536) {
    rc = es__fail(ES_EINVAL, "%s: .npy header too long", path);
    goto out;
  }
  hdr = es_mem_alloc(ES_MEM_CLI, hlen + 1);
  if (!hdr || fread(hdr, 1, hlen, f) != hlen) {
    rc = es__fail(ES_EINVAL, "%s: truncated .npy header", path);
    goto out;
  }
  hdr[hlen] = '\0';
  rc = parse_header(path, hdr, t);
  if (rc < 0)
    goto out;
  t->data = es_mem_aligned_alloc(ES_MEM_CLI, 64, t->nbytes ? t->nbytes : 1);
  if (!t->data) {
    rc = es__fail(ES_ENOMEM, "%s: out of memory for %zu bytes", path, t->nbytes);
    goto out;
  }
  if (fread(t->data, 1, t->nbytes, f) != t->nbytes) {
    rc = es__fail(ES_EINVAL, "%s: holds fewer bytes than its shape needs (%zu)", path, t->nbytes);
    es_mem_free(t->data);
    t->data = NULL;
  }
out:
  es_mem_free(hdr);
  fclose(f);
  return rc;
}

int cli_npy_write(const char *path, const es_tensor *t) {
  if (!path || !t)
    return es__fail(ES_EINVAL, "cli_npy_write: NULL argument");
  const char *descr = NULL;
  for (size_t i = 0; i < sizeof npy_types_ / sizeof npy_types_[0]; i++)
    if (npy_types_[i].dtype == t->dtype)
      descr = npy_types_[i].descr;
  if (!descr)
    return es__fail(ES_EINVAL, "%s: cannot write dtype %s", path, es_dtype_name(t->dtype));
  char shape[256] = "";
  for (int i = 0; i < t->rank; i++)
    snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%lld,%s",
             (long long)t->dims[i], i + 1 < t->rank ? " " : "");
  if (t->rank > 1) /* "(3,)" only for rank 1 */
    shape[strlen(shape) - 1] = '\0';
  char hdr[512];
  int n = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }",
                   descr, shape);
  /* pad with spaces so data starts at a multiple of 64, newline-terminated */
  size_t total = 10 + (size_t)n + 1;
  size_t pad = (64 - total % 64) % 64;
  FILE *f = fopen(path, "wb");
  if (!f)
    return es__fail(ES_EIO, "cannot create '%s'", path);
  size_t hlen = (size_t)n + pad + 1;
  unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hlen & 0xff),
                           (unsigned char)(hlen >> 8)};
  int ok = fwrite(pre, 1, 10, f) == 10 && fwrite(hdr, 1, (size_t)n, f) == (size_t)n;
  for (size_t i = 0; ok && i < pad; i++)
    ok = fputc(' ', f) != EOF;
  ok = ok && fputc('\n', f) != EOF;
  ok = ok && (t->nbytes == 0 || fwrite(t->data, 1, t->nbytes, f) == t->nbytes);
  ok = fclose(f) == 0 && ok;
  return ok ? 0 : es__fail(ES_EIO, "short write to '%s'", path);
}

void cli_npy_file_name(const char *name, char *out, size_t size) {
  size_t i = 0;
  for (; name[i] && i + 1 < size; i++) {
    char c = name[i];
    int ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
             c == '.' || c == '_' || c == '-';
    out[i] = ok ? c : '_';
  }
  out[i] = '\0';
}
