/* Shape specs: the one parser behind every command's NAME=DIMS and
 * MODEL[:NAME=DIMS,...] (rules in spec.h). The reasons quote the spec as
 * given so that a one-line message names what to fix. */
#include "cli/spec.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

__attribute__((format(printf, 4, 5))) static int fail(char why[CLI_WHY_MAX], const char *s,
                                                       size_t len, const char *fmt, ...) {
  char what[96];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  if (len)
    snprintf(why, CLI_WHY_MAX, "'%.*s': %s", (int)(len > 64 ? 64 : len), s, what);
  else
    snprintf(why, CLI_WHY_MAX, "%s", what);
  return -1;
}

/* One dimension at p (stop excluded): digits only. */
static int parse_dim(const char *p, const char *stop, int d, int64_t *out, const char *s,
                     size_t len, char why[CLI_WHY_MAX]) {
  if (p == stop)
    return fail(why, s, len, "dimension %d is empty (want DxDxD)", d + 1);
  if (*p == '-')
    return fail(why, s, len, "dimension %d is negative", d + 1);
  int64_t v = 0;
  for (const char *c = p; c < stop; c++) {
    if (*c < '0' || *c > '9')
      return fail(why, s, len, "dimension %d is not a number (want DxDxD)", d + 1);
    v = v * 10 + (*c - '0');
    if (v > CLI_DIM_MAX)
      return fail(why, s, len, "dimension %d is larger than 2^32", d + 1);
  }
  *out = v;
  return 0;
}

int cli_shape_parse(const char *s, size_t len, cli_shape *out, char why[CLI_WHY_MAX]) {
  const char *eq = NULL;
  for (const char *c = s; c < s + len; c++)
    if (*c == '=')
      eq = c;
  if (!eq)
    return fail(why, s, len, "wants NAME=DxDxD");
  if (eq == s)
    return fail(why, s, len, "no input name before '='");
  out->name = s;
  out->name_len = (size_t)(eq - s);
  out->rank = 0;
  const char *p = eq + 1, *stop = s + len;
  if (p == stop)
    return fail(why, s, len, "no dimensions after '='");
  for (;;) {
    const char *x = memchr(p, 'x', (size_t)(stop - p));
    const char *end = x ? x : stop;
    if (out->rank == ES_MAX_RANK)
      return fail(why, s, len, "more than %d dimensions", ES_MAX_RANK);
    if (parse_dim(p, end, out->rank, &out->dims[out->rank], s, len, why) < 0)
      return -1;
    out->rank++;
    if (!x)
      return 0;
    p = x + 1;
  }
}

int cli_shapes_parse(const char *s, cli_shape *out, int max, int *n, char why[CLI_WHY_MAX]) {
  *n = 0;
  for (;;) {
    const char *comma = strchr(s, ',');
    size_t len = comma ? (size_t)(comma - s) : strlen(s);
    if (len == 0)
      return fail(why, s, 0, "an empty shape (nothing %s)",
                  comma ? "before a ','" : "after the last ':' or ','");
    if (*n == max)
      return fail(why, s, len, "more than %d shapes", max);
    if (cli_shape_parse(s, len, &out[*n], why) < 0)
      return -1;
    (*n)++;
    if (!comma)
      return 0;
    s = comma + 1;
  }
}

static int is_file(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static int set_path(cli_model_arg *out, const char *arg, size_t n, char why[CLI_WHY_MAX]) {
  if (n == 0)
    return fail(why, arg, strlen(arg), "no model file before ':'");
  if (n >= sizeof out->path)
    return fail(why, arg, strlen(arg), "file name longer than %d bytes", PATH_MAX - 1);
  memcpy(out->path, arg, n);
  out->path[n] = '\0';
  return 0;
}

int cli_model_arg_parse(const char *arg, cli_model_arg *out, char why[CLI_WHY_MAX]) {
  size_t n = strlen(arg);
  out->specs = NULL;
  if (n < sizeof out->path && is_file(arg))
    return set_path(out, arg, n, why);
  for (const char *c = strchr(arg, ':'); c; c = strchr(c + 1, ':')) {
    size_t k = (size_t)(c - arg);
    if (k == 0 || k >= sizeof out->path)
      continue;
    memcpy(out->path, arg, k);
    out->path[k] = '\0';
    if (is_file(out->path)) {
      out->specs = c + 1;
      return 0;
    }
  }
  /* No file at any split: the syntax decides, so that a missing file is
   * reported as missing rather than as a bad shape. */
  for (const char *c = strchr(arg, ':'); c; c = strchr(c + 1, ':')) {
    cli_shape tmp[CLI_SHAPES_MAX];
    int k;
    char ignored[CLI_WHY_MAX];
    if (cli_shapes_parse(c + 1, tmp, CLI_SHAPES_MAX, &k, ignored) == 0) {
      out->specs = c + 1;
      return set_path(out, arg, (size_t)(c - arg), why);
    }
  }
  return set_path(out, arg, n, why);
}

int cli_shape_is(const cli_shape *s, const char *name) {
  return strlen(name) == s->name_len && !strncmp(s->name, name, s->name_len);
}

int cli_shape_find(const cli_shape *s, const es_tensor_info *infos, int n) {
  for (int i = 0; i < n; i++)
    if (infos[i].name && cli_shape_is(s, infos[i].name))
      return i;
  return -1;
}

void cli_shape_apply(const cli_shape *s, es_tensor_info *t) {
  t->rank = s->rank;
  memset(t->dims, 0, sizeof t->dims);
  memcpy(t->dims, s->dims, (size_t)s->rank * sizeof s->dims[0]);
}

int cli_shape_open(const es_tensor_info *t) {
  int open = t->rank < 0;
  for (int d = 0; d < t->rank; d++)
    open |= t->dims[d] < 0;
  return open;
}
