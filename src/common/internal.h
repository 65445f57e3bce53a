/* Internal helpers shared by every layer. Not installed, not public. */
#ifndef ES_COMMON_INTERNAL_H
#define ES_COMMON_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "edgeserve/error.h"

/* Record a detail message for the calling thread and return err, so a failure
 * site reads: return es__fail(ES_ENOSPC, "arena exhausted: ..."); */
int es__fail(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Broken internal invariant: print and abort. Never for user-caused errors. */
#define ES_ASSERT(cond)                                                        \
  do {                                                                         \
    if (!(cond))                                                               \
      es__assert_fail(#cond, __FILE__, __LINE__);                              \
  } while (0)
_Noreturn void es__assert_fail(const char *expr, const char *file, int line);

/* CLOCK_MONOTONIC in nanoseconds: durations and deadlines. */
static inline uint64_t es__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline int es__is_pow2(size_t x) { return x != 0 && (x & (x - 1)) == 0; }

/* Round x up to a multiple of the power of two a; 0 on overflow (x > 0). */
static inline size_t es__align_up(size_t x, size_t a) {
  size_t r = (x + (a - 1)) & ~(a - 1);
  return r < x ? 0 : r;
}

#if defined(ES_ASAN) || defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define ES_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define ES_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define ES_POISON(p, n) ((void)(p), (void)(n))
#define ES_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#endif
