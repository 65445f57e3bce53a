/* Shared helpers for the test programs (cmocka underneath).
 *
 * Each test file is its own executable, run by CTest in its own process with
 * a timeout. ES_CHECK_RC prints the error name and detail when a call that
 * should succeed fails, so a red test says why. */
#ifndef ES_TEST_H
#define ES_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <cmocka.h>

#include "edgeserve/error.h"
#include "edgeserve/memory.h"

#define ES_CHECK_RC(expr)                                                              \
  do {                                                                                 \
    int es_rc_ = (expr);                                                               \
    if (es_rc_ != 0)                                                                   \
      fail_msg("%s -> %d %s: %s", #expr, es_rc_, es_err_name(es_rc_),                 \
               es_last_error_detail());                                                \
  } while (0)

#define ES_EXPECT_RC(expr, want)                                                       \
  do {                                                                                 \
    int es_rc_ = (expr);                                                               \
    if (es_rc_ != (want))                                                              \
      fail_msg("%s -> %d %s, want %s (detail: %s)", #expr, es_rc_, es_err_name(es_rc_), \
               es_err_name(want), es_last_error_detail());                             \
  } while (0)

/* Deterministic, seedable PRNG (splitmix64) for property tests; the seed is
 * printed so a failure can be replayed with ES_TEST_SEED=... */
static inline uint64_t es_test_rand(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* p[0..n) from the stream s: multiples of 1/8000 in [-0.125, 0.125], the
 * weights and inputs of the small models the tests build (small enough
 * that sums stay exact to the tolerances they check). */
static inline void es_test_fill_small(float *p, size_t n, uint64_t *s) {
  for (size_t i = 0; i < n; i++)
    p[i] = (float)(es_test_rand(s) % 2001) / 8000.0f - 0.125f;
}

static inline uint64_t es_test_seed(void) {
  const char *e = getenv("ES_TEST_SEED");
  uint64_t seed = e ? strtoull(e, NULL, 0) : 0x5eed5eed12345678ull;
  printf("# ES_TEST_SEED=0x%llx\n", (unsigned long long)seed);
  return seed;
}

#ifdef ES_SOURCE_DIR
/* The path of a fetched target model: $ES_MODEL_DIR/file, or the tree's
 * .cache/models/file (scripts/setup/fetch-models.sh). */
static inline const char *es_test_model_path(char *buf, size_t size, const char *file) {
  const char *dir = getenv("ES_MODEL_DIR");
  snprintf(buf, size, "%s/%s", dir ? dir : ES_SOURCE_DIR "/.cache/models", file);
  return buf;
}
#endif

/* Allocations made through the counting layer so far, every tag: a code
 * path that allocates nothing leaves it unchanged. */
static inline uint64_t es_test_total_allocs(void) {
  uint64_t n = 0;
  for (int t = 0; t < ES_MEM_TAG_COUNT; t++) {
    es_mem_stats st;
    es_mem_stats_get((es_mem_tag)t, &st);
    n += st.allocs;
  }
  return n;
}

/* A whole file in a counted block (es_mem_free it; *buf is NULL on
 * failure); -1 when it cannot be read whole. */
static inline int es_test_read_file(const char *path, void **buf, size_t *size) {
  *buf = NULL;
  *size = 0;
  FILE *f = fopen(path, "rb");
  if (!f)
    return -1;
  long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
  int rc = -1;
  if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
      (*buf = es_mem_alloc(ES_MEM_OTHER, n > 0 ? (size_t)n : 1)) != NULL) {
    *size = fread(*buf, 1, (size_t)n, f);
    rc = *size == (size_t)n ? 0 : -1;
  }
  fclose(f);
  if (rc < 0) {
    es_mem_free(*buf);
    *buf = NULL;
  }
  return rc;
}

#endif
