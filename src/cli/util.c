/* Small helpers every subcommand needs the same way: a monotonic clock,
 * strict number parsing and JSON output. One definition each, so that the
 * commands parse and print alike (measurements: measure.c). */
#include "cli/cli.h"
#include "edgeserve/engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double cli_now_ms(void) { return (double)cli_now_ns() / 1e6; }

void cli_print_bound_shape(const es_bound_info *b) {
  putchar('[');
  for (int d = 0; d < b->bound.rank; d++)
    printf("%s%s%lld", d ? "," : "", d < 32 && (b->data_dims >> d & 1) ? "<=" : "",
           (long long)b->bound.dims[d]);
  putchar(']');
}

uint64_t cli_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int cli_parse_count(const char *s, long lo, long hi, long *out) {
  char *end;
  long v = strtol(s, &end, 10);
  if (end == s || *end || v < lo || v > hi)
    return -1;
  *out = v;
  return 0;
}

int cli_parse_bytes(const char *s, size_t *out) {
  char *end;
  double v = strtod(s, &end);
  if (end == s || !(v >= 0))
    return -1;
  double mul = 1;
  switch (*end) {
  case 'k': case 'K': mul = 1024.0; end++; break;
  case 'm': case 'M': mul = 1024.0 * 1024; end++; break;
  case 'g': case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
  case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
  default: break;
  }
  if (mul > 1 && *end == 'i')
    end++;
  if (*end == 'B')
    end++;
  if (*end || v * mul >= 18e18)
    return -1;
  *out = (size_t)(v * mul);
  return 0;
}

void cli_json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      fprintf(f, "\\%c", c);
    else if (c < 0x20)
      fprintf(f, "\\u%04x", c);
    else
      fputc(c, f);
  }
  fputc('"', f);
}

void cli_json_real(FILE *f, double v, int decimals) {
  if (isnan(v) || isinf(v))
    fputs("null", f);
  else
    fprintf(f, "%.*f", decimals, v);
}

int cli_precision_arg(const char *cmd, int argc, char **argv, int *i, int *prec) {
  if (strcmp(argv[*i], "--precision"))
    return 0;
  if (*i + 1 >= argc) {
    fprintf(stderr, "edgeserve %s: --precision wants auto, fp32, bf16 or int8\n", cmd);
    return 2;
  }
  es_precision p;
  if (es_precision_parse(argv[++*i], &p) < 0) {
    fprintf(stderr, "edgeserve %s: %s\n", cmd, es_last_error_detail());
    return 2;
  }
  *prec = (int)p;
  return 1;
}
