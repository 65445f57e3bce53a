/* Arena pool, single-threaded: arguments, acquire/release semantics, refusal
 * of double and foreign releases, exact statistics, LIFO reuse and sizing.
 * The multi-threaded behaviour is in test_arena_pool_mt.c. */
#include "es_test.h"

#include <string.h>
#include <time.h>

#ifdef ES_ASAN
#include <sanitizer/asan_interface.h>
#endif

static int detail_has(const char *needle) {
  return strstr(es_last_error_detail(), needle) != NULL;
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static es_arena_pool_stats stats_of(es_arena_pool *p) {
  es_arena_pool_stats s;
  ES_CHECK_RC(es_arena_pool_stats_get(p, &s));
  return s;
}

/* ---- create / destroy ---------------------------------------------------------- */

static void test_create_args(void **state) {
  (void)state;
  es_arena_pool *sentinel = (es_arena_pool *)(uintptr_t)0x1234;
  es_arena_pool *p = sentinel;
  ES_EXPECT_RC(es_arena_pool_create(0, 4096, 0, &p), ES_EINVAL);
  ES_EXPECT_RC(es_arena_pool_create(65537, 4096, 0, &p), ES_EINVAL);
  ES_EXPECT_RC(es_arena_pool_create(SIZE_MAX, 4096, 0, &p), ES_EINVAL);
  ES_EXPECT_RC(es_arena_pool_create(4, 0, 0, &p), ES_EINVAL);
  ES_EXPECT_RC(es_arena_pool_create(4, 4096, 3, &p), ES_EINVAL);
  ES_EXPECT_RC(es_arena_pool_create(4, 4096, 8192, &p), ES_EINVAL);
  ES_EXPECT_RC(es_arena_pool_create(4, 4096, 0, NULL), ES_EINVAL);
  ES_EXPECT_RC(es_arena_pool_create(4, SIZE_MAX, 0, &p), ES_EOVERFLOW);
  ES_EXPECT_RC(es_arena_pool_create(4, SIZE_MAX - 100, 0, &p), ES_EOVERFLOW);
  ES_EXPECT_RC(es_arena_pool_create(65536, (size_t)1 << 50, 0, &p), ES_EOVERFLOW);
  assert_ptr_equal(p, sentinel);
  assert_int_equal(es_arena_pool_destroy(NULL), 0);
}

static void test_create_layout_and_counting(void **state) {
  (void)state;
  es_mem_stats before, after;
  ES_CHECK_RC(es_mem_stats_get(ES_MEM_ARENA_POOL, &before));
  const size_t aligns[] = {0, 1, 64, 256, 4096};
  for (size_t k = 0; k < sizeof aligns / sizeof aligns[0]; k++) {
    size_t align = aligns[k] ? aligns[k] : ES_ARENA_DEFAULT_ALIGN;
    enum { N = 3, CAP = 1000 };
    es_arena_pool *p;
    ES_CHECK_RC(es_arena_pool_create(N, CAP, aligns[k], &p));
    es_arena_pool_stats s = stats_of(p);
    assert_int_equal(s.count, N);
    assert_int_equal(s.arena_capacity, CAP);
    es_arena *a[N];
    unsigned char *data[N];
    for (int i = 0; i < N; i++) {
      ES_CHECK_RC(es_arena_pool_try_acquire(p, &a[i]));
      assert_int_equal(es_arena_capacity(a[i]), CAP);
      assert_true(es_arena_is_valid(a[i]));
      ES_CHECK_RC(es_arena_alloc(a[i], CAP, (void **)&data[i]));
      assert_int_equal((uintptr_t)data[i] & (align - 1), 0);
      memset(data[i], 'a' + i, CAP);
    }
    /* Full arenas do not overlap: each still holds its own bytes. */
    for (int i = 0; i < N; i++)
      for (size_t j = 0; j < CAP; j++)
        assert_int_equal(data[i][j], 'a' + i);
    for (int i = 0; i < N; i++)
      ES_CHECK_RC(es_arena_pool_release(p, a[i]));
    ES_CHECK_RC(es_arena_pool_destroy(p));
  }
  ES_CHECK_RC(es_mem_stats_get(ES_MEM_ARENA_POOL, &after));
  assert_int_equal(after.current, before.current);
}

static void test_destroy_busy(void **state) {
  (void)state;
  es_arena_pool *p;
  ES_CHECK_RC(es_arena_pool_create(2, 4096, 0, &p));
  es_arena *a;
  ES_CHECK_RC(es_arena_pool_acquire(p, 0, &a));
  ES_EXPECT_RC(es_arena_pool_destroy(p), ES_EBUSY);
  assert_true(detail_has("1 arenas acquired"));
  /* Refused, so the pool and the arena still work. */
  void *q;
  ES_CHECK_RC(es_arena_alloc(a, 100, &q));
  ES_CHECK_RC(es_arena_pool_release(p, a));
  ES_CHECK_RC(es_arena_pool_destroy(p));
}

/* ---- acquire ------------------------------------------------------------------ */

static void test_try_acquire_all_then_eagain(void **state) {
  (void)state;
  enum { N = 4 };
  es_arena_pool *p;
  ES_CHECK_RC(es_arena_pool_create(N, 4096, 0, &p));
  es_arena *a[N];
  for (int i = 0; i < N; i++) {
    ES_CHECK_RC(es_arena_pool_try_acquire(p, &a[i]));
    for (int j = 0; j < i; j++)
      assert_ptr_not_equal(a[i], a[j]);
  }
  es_arena *sentinel = (es_arena *)(uintptr_t)0x1234, *x = sentinel;
  ES_EXPECT_RC(es_arena_pool_try_acquire(p, &x), ES_EAGAIN);
  ES_EXPECT_RC(es_arena_pool_try_acquire(p, &x), ES_EAGAIN);
  assert_ptr_equal(x, sentinel);
  es_arena_pool_stats s = stats_of(p);
  assert_int_equal(s.in_use, N);
  assert_int_equal(s.try_failures, 2);
  assert_int_equal(s.acquires, N);

  ES_CHECK_RC(es_arena_pool_release(p, a[2]));
  ES_CHECK_RC(es_arena_pool_try_acquire(p, &x));
  assert_ptr_equal(x, a[2]);
  for (int i = 0; i < N; i++)
    ES_CHECK_RC(es_arena_pool_release(p, a[i]));

  ES_EXPECT_RC(es_arena_pool_try_acquire(p, NULL), ES_EINVAL);
  ES_EXPECT_RC(es_arena_pool_acquire(p, 0, NULL), ES_EINVAL);
  ES_EXPECT_RC(es_arena_pool_try_acquire(NULL, &x), ES_EINVAL);
  ES_EXPECT_RC(es_arena_pool_acquire(NULL, 0, &x), ES_EINVAL);
  ES_EXPECT_RC(es_arena_pool_release(NULL, x), ES_EINVAL);
  ES_EXPECT_RC(es_arena_pool_stats_get(NULL, &s), ES_EINVAL);
  ES_EXPECT_RC(es_arena_pool_stats_get(p, NULL), ES_EINVAL);
  ES_CHECK_RC(es_arena_pool_destroy(p));
}

static void test_acquire_timeouts(void **state) {
  (void)state;
  es_arena_pool *p;
  ES_CHECK_RC(es_arena_pool_create(1, 4096, 0, &p));
  es_arena *a, *x = NULL;
  ES_CHECK_RC(es_arena_pool_acquire(p, -1, &a)); /* free: no wait even if forever */

  double t0 = now_ms();
  ES_EXPECT_RC(es_arena_pool_acquire(p, 0, &x), ES_ETIMEDOUT);
  ES_EXPECT_RC(es_arena_pool_acquire(p, 50, &x), ES_ETIMEDOUT);
  double elapsed = now_ms() - t0;
  /* Never early; no upper bound asserted: the machine may be busy. */
  assert_true(elapsed >= 50.0);
  assert_null(x);

  t0 = now_ms();
  ES_EXPECT_RC(es_arena_pool_acquire(p, 1200, &x), ES_ETIMEDOUT);
  assert_true(now_ms() - t0 >= 1200.0); /* crosses a second: tv_nsec carry */

  es_arena_pool_stats s = stats_of(p);
  assert_int_equal(s.timeouts, 3);
  assert_int_equal(s.waits, 0);
  assert_int_equal(s.acquires, 1);
  ES_CHECK_RC(es_arena_pool_release(p, a));
  ES_CHECK_RC(es_arena_pool_acquire(p, 50, &x));
  assert_ptr_equal(x, a);
  ES_CHECK_RC(es_arena_pool_release(p, x));
  ES_CHECK_RC(es_arena_pool_destroy(p));
}

static void test_acquired_arena_is_reset(void **state) {
  (void)state;
  es_arena_pool *p;
  ES_CHECK_RC(es_arena_pool_create(2, 1 << 16, 0, &p));
  es_arena *a, *b;
  ES_CHECK_RC(es_arena_pool_acquire(p, 0, &a));
  unsigned char *first, *tmp;
  ES_CHECK_RC(es_arena_alloc(a, 5000, (void **)&first));
  ES_CHECK_RC(es_arena_alloc(a, 3000, (void **)&tmp));
  es_arena_mark m;
  ES_CHECK_RC(es_arena_mark_get(a, &m));
  ES_CHECK_RC(es_arena_pool_release(p, a)); /* left its allocations behind */

  ES_CHECK_RC(es_arena_pool_acquire(p, 0, &b));
  assert_ptr_equal(b, a);
  assert_int_equal(es_arena_used(b), 0);
  assert_int_equal(es_arena_peak(b), 0); /* this request's peak, not the last one's */
  assert_int_equal(es_arena_available(b), 1 << 16);
  ES_EXPECT_RC(es_arena_rewind(b, &m), ES_EREWIND); /* the old holder's mark */
  void *q;
  ES_CHECK_RC(es_arena_alloc(b, 10, &q));
  assert_ptr_equal(q, first);
  ES_CHECK_RC(es_arena_pool_release(p, b));
  ES_CHECK_RC(es_arena_pool_destroy(p));
}

/* A holder that keeps allocating after its release still cannot hand the
 * next request a dirty arena. */
static void test_use_after_release_is_cleaned(void **state) {
  (void)state;
  es_arena_pool *p;
  ES_CHECK_RC(es_arena_pool_create(1, 4096, 0, &p));
  es_arena *a, *b;
  ES_CHECK_RC(es_arena_pool_acquire(p, 0, &a));
  ES_CHECK_RC(es_arena_pool_release(p, a));
  void *q;
  ES_CHECK_RC(es_arena_alloc(a, 100, &q));
  ES_CHECK_RC(es_arena_pool_acquire(p, 0, &b));
  assert_int_equal(es_arena_used(b), 0);
  ES_CHECK_RC(es_arena_pool_release(p, b));
  ES_CHECK_RC(es_arena_pool_destroy(p));
}

/* ---- refused releases -------------------------------------------------------------- */

static void test_double_release(void **state) {
  (void)state;
  enum { N = 3 };
  es_arena_pool *p;
  ES_CHECK_RC(es_arena_pool_create(N, 4096, 0, &p));
  es_arena *a, *b;
  ES_CHECK_RC(es_arena_pool_acquire(p, 0, &a));
  ES_CHECK_RC(es_arena_pool_acquire(p, 0, &b));
  ES_CHECK_RC(es_arena_pool_release(p, a));
  ES_EXPECT_RC(es_arena_pool_release(p, a), ES_EDOUBLEFREE);
  assert_true(detail_has("not acquired"));
  ES_EXPECT_RC(es_arena_pool_release(p, a), ES_EDOUBLEFREE);

  /* Never acquired at all is the same thing. */
  es_arena *all[N];
  ES_CHECK_RC(es_arena_pool_try_acquire(p, &all[0]));
  ES_CHECK_RC(es_arena_pool_try_acquire(p, &all[1]));
  es_arena *x;
  ES_EXPECT_RC(es_arena_pool_try_acquire(p, &x), ES_EAGAIN);

  es_arena_pool_stats s = stats_of(p);
  assert_int_equal(s.bad_releases, 2);
  assert_int_equal(s.in_use, N);
  /* The free stack holds each arena once: all distinct. */
  es_arena *held[N] = {all[0], all[1], b};
  for (int i = 0; i < N; i++)
    for (int j = i + 1; j < N; j++)
      assert_ptr_not_equal(held[i], held[j]);
  for (int i = 0; i < N; i++)
    ES_CHECK_RC(es_arena_pool_release(p, held[i]));
  ES_EXPECT_RC(es_arena_pool_release(p, b), ES_EDOUBLEFREE);
  assert_int_equal(stats_of(p).in_use, 0);
  ES_CHECK_RC(es_arena_pool_destroy(p));
}

static void test_foreign_release(void **state) {
  (void)state;
  es_arena_pool *p, *other;
  ES_CHECK_RC(es_arena_pool_create(3, 4096, 0, &p));
  ES_CHECK_RC(es_arena_pool_create(3, 4096, 0, &other));
  es_arena *mine, *theirs, *standalone;
  ES_CHECK_RC(es_arena_pool_acquire(p, 0, &mine));
  ES_CHECK_RC(es_arena_pool_acquire(other, 0, &theirs));
  ES_CHECK_RC(es_arena_create(4096, 0, &standalone));
  es_arena on_stack;
  memset(&on_stack, 0, sizeof on_stack);

  ES_EXPECT_RC(es_arena_pool_release(p, theirs), ES_EFOREIGN);
  assert_true(detail_has("is not one of pool"));
  ES_EXPECT_RC(es_arena_pool_release(p, standalone), ES_EFOREIGN);
  ES_EXPECT_RC(es_arena_pool_release(p, &on_stack), ES_EFOREIGN);
  ES_EXPECT_RC(es_arena_pool_release(p, NULL), ES_EINVAL);
  /* Inside the pool's own slot array, but not at an arena. */
  ES_EXPECT_RC(es_arena_pool_release(p, (es_arena *)((char *)mine + 8)), ES_EFOREIGN);
  ES_EXPECT_RC(es_arena_pool_release(p, mine + 1), ES_EFOREIGN);

  es_arena_pool_stats s = stats_of(p);
  assert_int_equal(s.bad_releases, 6);
  assert_int_equal(s.in_use, 1);
  assert_int_equal(stats_of(other).bad_releases, 0);
  assert_int_equal(stats_of(other).in_use, 1);

  /* The pool's arenas cannot be finished or destroyed behind its back. */
  ES_EXPECT_RC(es_arena_fini(mine), ES_EINVAL);
  es_arena_destroy(mine);
  assert_true(es_arena_is_valid(mine));

  ES_CHECK_RC(es_arena_pool_release(p, mine));
  ES_CHECK_RC(es_arena_pool_release(other, theirs));
  es_arena_destroy(standalone);
  ES_CHECK_RC(es_arena_pool_destroy(other));
  ES_CHECK_RC(es_arena_pool_destroy(p));
}

static void test_corrupted_arena_is_rebuilt(void **state) {
  (void)state;
  es_arena_pool *p;
  ES_CHECK_RC(es_arena_pool_create(1, 4096, 0, &p));
  es_arena *a;
  ES_CHECK_RC(es_arena_pool_acquire(p, 0, &a));
  void *q;
  ES_CHECK_RC(es_arena_alloc(a, 100, &q));
  a->magic = 0;
  a->capacity = 1 << 30;
  ES_EXPECT_RC(es_arena_pool_release(p, a), ES_ECORRUPT);
  assert_true(detail_has("overwritten"));
  assert_int_equal(stats_of(p).in_use, 0);
  assert_int_equal(stats_of(p).bad_releases, 0);
  ES_CHECK_RC(es_arena_pool_acquire(p, 0, &a));
  assert_true(es_arena_is_valid(a));
  assert_int_equal(es_arena_capacity(a), 4096);
  assert_int_equal(es_arena_used(a), 0);

#ifndef NDEBUG
  /* Write past the end into the guard: reported at release, arena kept. */
  unsigned char *end;
  ES_CHECK_RC(es_arena_alloc(a, 4096, (void **)&end));
  end += 4096;
#ifdef ES_ASAN
  ASAN_UNPOISON_MEMORY_REGION(end, 1);
#endif
  *end = 0;
  ES_EXPECT_RC(es_arena_pool_release(p, a), ES_ECORRUPT);
  assert_true(detail_has("guard"));
  ES_CHECK_RC(es_arena_pool_acquire(p, 0, &a));
  assert_true(es_arena_is_valid(a));
#endif
  ES_CHECK_RC(es_arena_pool_release(p, a));
  ES_CHECK_RC(es_arena_pool_destroy(p));
}

/* ---- statistics, LIFO, sizing ---------------------------------------------------------- */

static void test_lifo_reuse(void **state) {
  (void)state;
  es_arena_pool *p;
  ES_CHECK_RC(es_arena_pool_create(4, 4096, 0, &p));
  es_arena *a, *b, *c, *x;
  ES_CHECK_RC(es_arena_pool_acquire(p, 0, &a));
  ES_CHECK_RC(es_arena_pool_acquire(p, 0, &b));
  ES_CHECK_RC(es_arena_pool_acquire(p, 0, &c));
  ES_CHECK_RC(es_arena_pool_release(p, b));
  ES_CHECK_RC(es_arena_pool_release(p, a));
  ES_CHECK_RC(es_arena_pool_release(p, c));
  /* Most recently released first. */
  ES_CHECK_RC(es_arena_pool_acquire(p, 0, &x));
  assert_ptr_equal(x, c);
  ES_CHECK_RC(es_arena_pool_release(p, x));
  ES_CHECK_RC(es_arena_pool_acquire(p, 0, &x));
  assert_ptr_equal(x, c);
  es_arena *y, *z;
  ES_CHECK_RC(es_arena_pool_acquire(p, 0, &y));
  ES_CHECK_RC(es_arena_pool_acquire(p, 0, &z));
  assert_ptr_equal(y, a);
  assert_ptr_equal(z, b);
  ES_CHECK_RC(es_arena_pool_release(p, x));
  ES_CHECK_RC(es_arena_pool_release(p, y));
  ES_CHECK_RC(es_arena_pool_release(p, z));
  ES_CHECK_RC(es_arena_pool_destroy(p));
}

static void test_stats_exact(void **state) {
  (void)state;
  es_arena_pool *p;
  ES_CHECK_RC(es_arena_pool_create(3, 8192, 128, &p));
  es_arena_pool_stats s = stats_of(p);
  es_arena_pool_stats zero = {.count = 3, .arena_capacity = 8192};
  assert_memory_equal(&s, &zero, sizeof s);

  es_arena *a, *b, *c, *x;
  void *q;
  ES_CHECK_RC(es_arena_pool_acquire(p, 0, &a));        /* acquires 1 */
  ES_CHECK_RC(es_arena_pool_try_acquire(p, &b));        /* 2 */
  ES_CHECK_RC(es_arena_pool_acquire(p, 10, &c));        /* 3, high water 3 */
  ES_EXPECT_RC(es_arena_pool_try_acquire(p, &x), ES_EAGAIN);      /* try_failures 1 */
  ES_EXPECT_RC(es_arena_pool_acquire(p, 0, &x), ES_ETIMEDOUT);    /* timeouts 1 */
  ES_EXPECT_RC(es_arena_pool_acquire(p, 5, &x), ES_ETIMEDOUT);    /* timeouts 2 */
  ES_CHECK_RC(es_arena_alloc(a, 1000, &q));
  ES_CHECK_RC(es_arena_alloc(b, 7000, &q));
  ES_CHECK_RC(es_arena_alloc(b, 0, &q));
  ES_CHECK_RC(es_arena_pool_release(p, a));                        /* peak_used 1000 */
  ES_CHECK_RC(es_arena_pool_release(p, b));                        /* peak_used 7000 */
  ES_EXPECT_RC(es_arena_pool_release(p, b), ES_EDOUBLEFREE);       /* bad 1 */
  ES_EXPECT_RC(es_arena_pool_release(p, NULL), ES_EINVAL);         /* bad 2 */
  ES_CHECK_RC(es_arena_pool_acquire(p, -1, &x));                   /* acquires 4 */

  s = stats_of(p);
  assert_int_equal(s.count, 3);
  assert_int_equal(s.arena_capacity, 8192);
  assert_int_equal(s.in_use, 2);
  assert_int_equal(s.high_water, 3);
  assert_int_equal(s.acquires, 4);
  assert_int_equal(s.waits, 0);
  assert_int_equal(s.timeouts, 2);
  assert_int_equal(s.try_failures, 1);
  assert_int_equal(s.bad_releases, 2);
  assert_int_equal(s.peak_used, 7000);
  ES_CHECK_RC(es_arena_pool_release(p, x));
  ES_CHECK_RC(es_arena_pool_release(p, c));
  assert_int_equal(stats_of(p).in_use, 0);
  ES_CHECK_RC(es_arena_pool_destroy(p));
}

/* BRIEF §4 sizing: the pool remembers the largest peak any request reached,
 * including temporaries rewound before the release. */
static void test_peak_used(void **state) {
  (void)state;
  es_arena_pool *p;
  ES_CHECK_RC(es_arena_pool_create(2, 1 << 16, 0, &p));
  es_arena *a;
  void *q;
  const size_t sizes[] = {1000, 500, 3000, 64, 0};
  const size_t want[] = {1000, 1000, 3000, 3000, 3000};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    ES_CHECK_RC(es_arena_pool_acquire(p, 0, &a));
    es_arena_mark m;
    ES_CHECK_RC(es_arena_mark_get(a, &m));
    ES_CHECK_RC(es_arena_alloc(a, sizes[i], &q));
    ES_CHECK_RC(es_arena_rewind(a, &m));
    ES_CHECK_RC(es_arena_pool_release(p, a));
    assert_int_equal(stats_of(p).peak_used, want[i]);
  }
  ES_CHECK_RC(es_arena_pool_destroy(p));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_create_args),
      cmocka_unit_test(test_create_layout_and_counting),
      cmocka_unit_test(test_destroy_busy),
      cmocka_unit_test(test_try_acquire_all_then_eagain),
      cmocka_unit_test(test_acquire_timeouts),
      cmocka_unit_test(test_acquired_arena_is_reset),
      cmocka_unit_test(test_use_after_release_is_cleaned),
      cmocka_unit_test(test_double_release),
      cmocka_unit_test(test_foreign_release),
      cmocka_unit_test(test_corrupted_arena_is_rebuilt),
      cmocka_unit_test(test_lifo_reuse),
      cmocka_unit_test(test_stats_exact),
      cmocka_unit_test(test_peak_used),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
