/* es_zoo_probe: why a model does not run, as an error code rather than a
 * message to match (tests/e2e/test_zoo.sh).
 *
 * The zoo test must tell "this engine does not support the model yet" (not a
 * failure while operators are being added) from "the engine took the model
 * and got it wrong" (a failure). `edgeserve run` exits 1 for both; this
 * program loads the model and plans it for each shape given, through the
 * public API, and prints one line:
 *   ok                             loaded and planned for every shape
 *   ES_ENOTSUP: <detail>           an operator, attribute or dtype outside the
 *                                  engine (exit 3)
 *   ES_<code>: <detail>            any other refusal (exit 1)
 * Exit 2 for a usage error.
 *   es_zoo_probe MODEL NAME=DxDx...[,NAME=DxD...]...  (one argument per plan;
 *                                                      inputs in model order) */
#include "edgeserve/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_IN 16

/* "NAME=1x3x224x224" into *t (dtype left to the caller). 0 or -1. */
static int parse_shape(const char *s, size_t len, es_tensor_info *t) {
  const char *eq = NULL;
  for (size_t i = 0; i < len; i++)
    if (s[i] == '=')
      eq = s + i;
  if (!eq)
    return -1;
  const char *p = eq + 1, *end = s + len;
  t->rank = 0;
  while (p < end) {
    char *q;
    long long d = strtoll(p, &q, 10);
    if (q == p || d < 0 || t->rank == ES_MAX_RANK || (q < end && *q != 'x'))
      return -1;
    t->dims[t->rank++] = d;
    if (q < end && q + 1 == end)
      return -1; /* a trailing 'x' */
    p = q < end ? q + 1 : q;
  }
  return t->rank > 0 ? 0 : -1;
}

static int report(int rc) {
  printf("%s: %s\n", es_err_name(rc), es_last_error_detail());
  return rc == ES_ENOTSUP ? 3 : 1;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: es_zoo_probe MODEL [NAME=DxD...[,NAME=DxD...]]...\n");
    return 2;
  }
  es_model *m;
  int rc = es_model_load(argv[1], NULL, &m);
  if (rc < 0)
    return report(rc);
  int nin = es_model_input_count(m), status = 0;
  if (nin > MAX_IN) {
    printf("ES_ENOTSUP: more than %d inputs\n", MAX_IN);
    es_model_release(m);
    return 3;
  }
  for (int a = 2; a < argc && status == 0; a++) {
    es_tensor_info shapes[MAX_IN];
    const char *s = argv[a];
    int n = 0;
    while (*s && n < MAX_IN) {
      size_t len = strcspn(s, ",");
      es_model_input_info(m, n, &shapes[n]);
      if (parse_shape(s, len, &shapes[n]) < 0) {
        fprintf(stderr, "es_zoo_probe: bad shape '%.*s'\n", (int)len, s);
        status = 2;
        break;
      }
      n++;
      s += len + (s[len] == ',');
    }
    if (status)
      break;
    if (n != nin) {
      fprintf(stderr, "es_zoo_probe: %d shapes given, the model has %d inputs\n", n, nin);
      status = 2;
      break;
    }
    es_plan *p;
    rc = es_model_plan(m, shapes, n, &p);
    if (rc < 0)
      status = report(rc);
    else
      es_plan_release(p);
  }
  if (status == 0)
    printf("ok\n");
  es_model_release(m);
  return status;
}
