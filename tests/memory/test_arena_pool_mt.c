/* Arena pool under threads (label "concurrency": CI also runs it under TSan).
 *
 * Worker threads never call cmocka's assertions (they longjmp into the main
 * thread's test); they count failures and keep the first message, and the
 * main thread asserts after joining. */
#include "es_test.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#ifdef ES_TSAN
#define ITERS 10000 /* TSan is several times slower */
#else
#define ITERS 20000
#endif

static atomic_int failures_;
static char first_failure_[256];
static pthread_mutex_t failure_lock_ = PTHREAD_MUTEX_INITIALIZER;

static void fail_in_thread(const char *what, int rc) {
  pthread_mutex_lock(&failure_lock_);
  if (atomic_fetch_add(&failures_, 1) == 0)
    snprintf(first_failure_, sizeof first_failure_, "%s (rc %s: %s)", what, es_err_name(rc),
             es_last_error_detail());
  pthread_mutex_unlock(&failure_lock_);
}

static void assert_no_thread_failures(void) {
  if (atomic_load(&failures_) != 0)
    fail_msg("%d failures in threads; first: %s", atomic_load(&failures_), first_failure_);
}

static void sleep_ms(int ms) {
  struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

static es_arena_pool_stats stats_of(es_arena_pool *p) {
  es_arena_pool_stats s;
  ES_CHECK_RC(es_arena_pool_stats_get(p, &s));
  return s;
}

/* Block until `want` threads are parked in acquire. The pool shows its
 * waiters only in destroy's refusal (it holds arenas out, so destroy is
 * always refused here), which makes this wait exact instead of a guess. */
static void wait_for_waiters(es_arena_pool *p, int want) {
  char needle[64];
  snprintf(needle, sizeof needle, ", %d threads waiting", want);
  for (int i = 0; i < 30000; i++) {
    ES_EXPECT_RC(es_arena_pool_destroy(p), ES_EBUSY);
    if (strstr(es_last_error_detail(), needle))
      return;
    sleep_ms(1);
  }
  fail_msg("%d waiters never showed up: %s", want, es_last_error_detail());
}

/* ---- exclusive ownership under contention ------------------------------------------ */

enum { OWN_THREADS = 6, OWN_ARENAS = 3, OWN_CAP = 16 * 1024, OWN_MAX_ALLOCS = 4 };

typedef struct own_ctx {
  es_arena_pool *pool;
  atomic_int *holders;
  int id;
} own_ctx;

static int own_acquire(own_ctx *c, int i, es_arena **a) {
  switch (i % 3) {
  case 0:
    return es_arena_pool_acquire(c->pool, -1, a);
  case 1:
    /* A liveness bound, not a timing assertion: holders keep an arena for
     * microseconds. */
    return es_arena_pool_acquire(c->pool, 60000, a);
  default: {
    int rc = es_arena_pool_try_acquire(c->pool, a);
    return rc == ES_EAGAIN ? es_arena_pool_acquire(c->pool, -1, a) : rc;
  }
  }
}

static void *own_worker(void *arg) {
  own_ctx *c = arg;
  uint64_t seed = 0x1234567ull * (uint64_t)(c->id + 1);
  unsigned char tag = (unsigned char)(0x10 + c->id);
  for (int i = 0; i < ITERS && atomic_load(&failures_) == 0; i++) {
    es_arena *a;
    int rc = own_acquire(c, i, &a);
    if (rc != 0) {
      fail_in_thread("acquire", rc);
      break;
    }
    if (atomic_fetch_add(c->holders, 1) + 1 > OWN_ARENAS)
      fail_in_thread("more holders than arenas", 0);
    if (es_arena_used(a) != 0 || es_arena_peak(a) != 0)
      fail_in_thread("acquired arena not reset", 0);

    unsigned char *ptr[OWN_MAX_ALLOCS];
    size_t len[OWN_MAX_ALLOCS];
    int n = 1 + (int)(es_test_rand(&seed) % OWN_MAX_ALLOCS);
    for (int k = 0; k < n; k++) {
      len[k] = 1 + (size_t)(es_test_rand(&seed) % 2048);
      rc = es_arena_alloc(a, len[k], (void **)&ptr[k]);
      if (rc != 0) {
        fail_in_thread("alloc", rc);
        n = k;
        break;
      }
      memset(ptr[k], tag, len[k]);
    }
    /* Any other thread in this arena would have overwritten a byte. */
    for (int k = 0; k < n; k++)
      for (size_t j = 0; j < len[k]; j++)
        if (ptr[k][j] != tag) {
          fail_in_thread("foreign pattern in an owned arena", 0);
          k = n;
          break;
        }
    atomic_fetch_sub(c->holders, 1);
    rc = es_arena_pool_release(c->pool, a);
    if (rc != 0)
      fail_in_thread("release", rc);
  }
  return NULL;
}

static void test_exclusive_ownership(void **state) {
  (void)state;
  atomic_store(&failures_, 0);
  es_arena_pool *p;
  ES_CHECK_RC(es_arena_pool_create(OWN_ARENAS, OWN_CAP, 0, &p));
  atomic_int holders = 0;
  pthread_t th[OWN_THREADS];
  own_ctx ctx[OWN_THREADS];
  for (int t = 0; t < OWN_THREADS; t++) {
    ctx[t] = (own_ctx){p, &holders, t};
    assert_int_equal(pthread_create(&th[t], NULL, own_worker, &ctx[t]), 0);
  }
  for (int t = 0; t < OWN_THREADS; t++)
    pthread_join(th[t], NULL);
  assert_no_thread_failures();

  es_arena_pool_stats s = stats_of(p);
  printf("# %d threads x %d: waits %llu, try_failures %llu, high_water %zu, peak_used %zu\n",
         OWN_THREADS, ITERS, (unsigned long long)s.waits, (unsigned long long)s.try_failures,
         s.high_water, s.peak_used);
  assert_int_equal(s.in_use, 0);
  assert_true(s.high_water >= 1 && s.high_water <= OWN_ARENAS);
  assert_int_equal(s.acquires, (uint64_t)OWN_THREADS * ITERS);
  assert_true(s.waits <= s.acquires);
  assert_int_equal(s.timeouts, 0);
  assert_int_equal(s.bad_releases, 0);
  assert_true(s.peak_used > 0 && s.peak_used <= OWN_CAP);
  ES_CHECK_RC(es_arena_pool_destroy(p));
}

/* ---- waking waiters ------------------------------------------------------------------ */

typedef struct waiter_ctx {
  es_arena_pool *pool;
  int timeout_ms;
  int hold_and_release; /* release what it got, so the next waiter can run */
  int rc;
  es_arena *got;
} waiter_ctx;

static void *waiter(void *arg) {
  waiter_ctx *w = arg;
  w->rc = es_arena_pool_acquire(w->pool, w->timeout_ms, &w->got);
  if (w->rc == 0 && w->hold_and_release) {
    void *q;
    if (es_arena_alloc(w->got, 100, &q) != 0)
      fail_in_thread("alloc in waiter", -1);
    int rc = es_arena_pool_release(w->pool, w->got);
    if (rc != 0)
      fail_in_thread("release in waiter", rc);
  }
  return NULL;
}

static void test_release_wakes_blocked_acquire(void **state) {
  (void)state;
  atomic_store(&failures_, 0);
  es_arena_pool *p;
  ES_CHECK_RC(es_arena_pool_create(2, 4096, 0, &p));
  es_arena *a, *b;
  ES_CHECK_RC(es_arena_pool_acquire(p, 0, &a));
  ES_CHECK_RC(es_arena_pool_acquire(p, 0, &b));

  waiter_ctx w = {p, -1, 0, 1, NULL};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, waiter, &w), 0);
  wait_for_waiters(p, 1);
  ES_CHECK_RC(es_arena_pool_release(p, b));
  pthread_join(th, NULL);

  ES_CHECK_RC(w.rc);
  assert_ptr_equal(w.got, b);
  assert_int_equal(es_arena_used(w.got), 0);
  es_arena_pool_stats s = stats_of(p);
  assert_int_equal(s.waits, 1);
  assert_int_equal(s.acquires, 3);
  assert_int_equal(s.timeouts, 0);
  assert_int_equal(s.in_use, 2);
  ES_CHECK_RC(es_arena_pool_release(p, w.got));
  ES_CHECK_RC(es_arena_pool_release(p, a));
  ES_CHECK_RC(es_arena_pool_destroy(p));
}

/* More waiters than arenas, timed and untimed: each release wakes one, which
 * releases in turn; a lost wakeup would leave a thread blocked for good. */
static void test_no_lost_wakeups(void **state) {
  (void)state;
  atomic_store(&failures_, 0);
  enum { WAITERS = 6 };
  es_arena_pool *p;
  ES_CHECK_RC(es_arena_pool_create(2, 4096, 0, &p));
  es_arena *a, *b;
  ES_CHECK_RC(es_arena_pool_acquire(p, 0, &a));
  ES_CHECK_RC(es_arena_pool_acquire(p, 0, &b));

  pthread_t th[WAITERS];
  waiter_ctx w[WAITERS];
  for (int i = 0; i < WAITERS; i++) {
    w[i] = (waiter_ctx){p, i % 2 ? 60000 : -1, 1, 1, NULL};
    assert_int_equal(pthread_create(&th[i], NULL, waiter, &w[i]), 0);
  }
  wait_for_waiters(p, WAITERS);
  ES_CHECK_RC(es_arena_pool_release(p, a));
  ES_CHECK_RC(es_arena_pool_release(p, b));
  for (int i = 0; i < WAITERS; i++) {
    pthread_join(th[i], NULL);
    ES_CHECK_RC(w[i].rc);
  }
  assert_no_thread_failures();
  es_arena_pool_stats s = stats_of(p);
  assert_int_equal(s.waits, WAITERS);
  assert_int_equal(s.acquires, 2 + WAITERS);
  assert_int_equal(s.in_use, 0);
  assert_int_equal(s.high_water, 2);
  assert_int_equal(s.timeouts, 0);
  ES_CHECK_RC(es_arena_pool_destroy(p));
}

/* ---- racing double release ---------------------------------------------------------- */

typedef struct racer_ctx {
  es_arena_pool *pool;
  es_arena *arena;
  pthread_barrier_t *go;
  int rc;
} racer_ctx;

static void *racer(void *arg) {
  racer_ctx *r = arg;
  pthread_barrier_wait(r->go);
  r->rc = es_arena_pool_release(r->pool, r->arena);
  return NULL;
}

static void test_racing_double_release(void **state) {
  (void)state;
  enum { ROUNDS = 300 };
  es_arena_pool *p;
  ES_CHECK_RC(es_arena_pool_create(2, 4096, 0, &p));
  pthread_barrier_t go;
  assert_int_equal(pthread_barrier_init(&go, NULL, 2), 0);
  for (int i = 0; i < ROUNDS; i++) {
    es_arena *a;
    ES_CHECK_RC(es_arena_pool_acquire(p, 0, &a));
    racer_ctx r[2] = {{p, a, &go, 1}, {p, a, &go, 1}};
    pthread_t th[2];
    for (int k = 0; k < 2; k++)
      assert_int_equal(pthread_create(&th[k], NULL, racer, &r[k]), 0);
    for (int k = 0; k < 2; k++)
      pthread_join(th[k], NULL);
    /* Exactly one wins; the pool never holds the arena twice. */
    int ok = (r[0].rc == 0) + (r[1].rc == 0);
    int dbl = (r[0].rc == ES_EDOUBLEFREE) + (r[1].rc == ES_EDOUBLEFREE);
    if (ok != 1 || dbl != 1)
      fail_msg("round %d: releases returned %d and %d", i, r[0].rc, r[1].rc);
  }
  pthread_barrier_destroy(&go);
  es_arena_pool_stats s = stats_of(p);
  assert_int_equal(s.bad_releases, ROUNDS);
  assert_int_equal(s.in_use, 0);
  es_arena *x, *y, *z;
  ES_CHECK_RC(es_arena_pool_try_acquire(p, &x));
  ES_CHECK_RC(es_arena_pool_try_acquire(p, &y));
  assert_ptr_not_equal(x, y);
  ES_EXPECT_RC(es_arena_pool_try_acquire(p, &z), ES_EAGAIN);
  ES_CHECK_RC(es_arena_pool_release(p, x));
  ES_CHECK_RC(es_arena_pool_release(p, y));
  ES_CHECK_RC(es_arena_pool_destroy(p));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_exclusive_ownership),
      cmocka_unit_test(test_release_wakes_blocked_acquire),
      cmocka_unit_test(test_no_lost_wakeups),
      cmocka_unit_test(test_racing_double_release),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
