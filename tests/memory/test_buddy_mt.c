/* Buddy pool under concurrency: four threads allocate, write a pattern,
 * verify it and free on one shared pool, while a fifth reads stats and runs
 * the invariant check. At the end the counters must add up exactly and the
 * pool must have coalesced back to one free block. Clean under TSan.
 * ES_MT_OPS scales the per-thread operation count (default 200,000). */
#include "es_test.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define THREADS 4
#define LIVE_PER_THREAD 48

typedef struct worker {
  es_buddy *pool;
  unsigned id;
  uint64_t ops;
  uint64_t seed;
  uint64_t allocs, frees, failures, invalid_frees;
  const char *error; /* first problem seen, reported by the main thread */
} worker;

typedef struct held {
  unsigned char *p;
  size_t size;
  uint64_t tag;
} held;

static atomic_int stop_watcher;
static char watcher_error[512]; /* the detail outlives the watcher's thread */
static atomic_int watermark_calls;

static void on_watermark(void *user, const es_buddy_stats *s) {
  (void)user;
  (void)s;
  atomic_fetch_add(&watermark_calls, 1);
}

static uint64_t mt_ops(void) {
  const char *e = getenv("ES_MT_OPS");
  uint64_t n = e ? strtoull(e, NULL, 0) : 0;
  return n ? n : 200000;
}

static unsigned char pat(uint64_t tag, size_t pos) {
  return (unsigned char)((tag * 0x9e3779b97f4a7c15ull + pos * 131) >> 56);
}

static void pat_write(const held *h) {
  size_t edge = h->size < 16 ? h->size : 16;
  for (size_t i = 0; i < edge; i++) {
    h->p[i] = pat(h->tag, i);
    h->p[h->size - 1 - i] = pat(h->tag, h->size - 1 - i);
  }
}

static int pat_ok(const held *h) {
  size_t edge = h->size < 16 ? h->size : 16;
  for (size_t i = 0; i < edge; i++)
    if (h->p[i] != pat(h->tag, i) || h->p[h->size - 1 - i] != pat(h->tag, h->size - 1 - i))
      return 0;
  return 1;
}

static int held_free(worker *w, held *h) {
  if (!pat_ok(h)) {
    w->error = "a block's pattern was overwritten by another allocation";
    return -1;
  }
  if (es_buddy_free(w->pool, h->p) != 0) {
    w->error = "es_buddy_free of a live block failed";
    return -1;
  }
  w->frees++;
  h->p = NULL;
  return 0;
}

static void *worker_main(void *arg) {
  worker *w = arg;
  held live[LIVE_PER_THREAD];
  memset(live, 0, sizeof live);
  uint64_t rng = w->seed;
  for (uint64_t op = 0; op < w->ops && !w->error; op++) {
    uint64_t r = es_test_rand(&rng);
    held *h = &live[r % LIVE_PER_THREAD];
    if (h->p) {
      held_free(w, h);
      continue;
    }
    /* Mostly slab sizes, sometimes blocks up to 4 MiB. */
    unsigned bits = (unsigned)((r >> 8) % 22);
    size_t size = ((size_t)1 << bits) + (size_t)((r >> 32) % ((size_t)1 << bits));
    void *p = NULL;
    int rc = es_buddy_alloc(w->pool, size, &p);
    if (rc == ES_ENOSPC) {
      w->failures++;
      continue;
    }
    if (rc != 0 || !p || (uintptr_t)p % 256) {
      w->error = "es_buddy_alloc failed or returned a misaligned block";
      break;
    }
    w->allocs++;
    h->p = p;
    h->size = size;
    h->tag = ((uint64_t)w->id << 56) ^ op;
    pat_write(h);
    if (op % 1024 == 0) {
      /* A refused interior free must not disturb anyone. */
      if (es_buddy_free(w->pool, h->p + 1) != ES_EBADPTR)
        w->error = "interior free not refused";
      w->invalid_frees++;
    }
  }
  for (size_t i = 0; i < LIVE_PER_THREAD; i++)
    if (live[i].p && held_free(w, &live[i]) < 0)
      break;
  return NULL;
}

static void *watcher_main(void *arg) {
  es_buddy *pool = arg;
  uint64_t checks = 0;
  while (!atomic_load(&stop_watcher)) {
    es_buddy_stats s;
    if (es_buddy_stats_get(pool, &s) != 0 || s.bytes_in_use > s.capacity ||
        s.free_bytes + s.bytes_in_use > s.capacity)
      return (void *)"inconsistent stats snapshot";
    if (++checks % 16 == 0 && es_buddy_check(pool) != 0) {
      snprintf(watcher_error, sizeof watcher_error, "%s", es_last_error_detail());
      return watcher_error;
    }
    sched_yield();
  }
  return NULL;
}

static void test_mt_shared_pool(void **state) {
  (void)state;
  es_buddy_config cfg;
  es_buddy_config_default(&cfg);
  cfg.watermark_ratio = 0.5;
  cfg.on_watermark = on_watermark;
  es_buddy *pool = NULL;
  ES_CHECK_RC(es_buddy_create(&cfg, &pool));

  uint64_t seed = es_test_seed();
  worker ws[THREADS];
  pthread_t tids[THREADS], watcher;
  atomic_store(&stop_watcher, 0);
  atomic_store(&watermark_calls, 0);
  assert_int_equal(pthread_create(&watcher, NULL, watcher_main, pool), 0);
  for (unsigned i = 0; i < THREADS; i++) {
    memset(&ws[i], 0, sizeof ws[i]);
    ws[i].pool = pool;
    ws[i].id = i;
    ws[i].ops = mt_ops();
    ws[i].seed = seed + i * 0x1234567ull;
    assert_int_equal(pthread_create(&tids[i], NULL, worker_main, &ws[i]), 0);
  }
  uint64_t allocs = 0, frees = 0, failures = 0, invalid = 0;
  for (unsigned i = 0; i < THREADS; i++) {
    assert_int_equal(pthread_join(tids[i], NULL), 0);
    if (ws[i].error)
      fail_msg("thread %u: %s", i, ws[i].error);
    allocs += ws[i].allocs;
    frees += ws[i].frees;
    failures += ws[i].failures;
    invalid += ws[i].invalid_frees;
  }
  atomic_store(&stop_watcher, 1);
  void *werr = NULL;
  assert_int_equal(pthread_join(watcher, &werr), 0);
  if (werr)
    fail_msg("watcher: %s", (const char *)werr);

  ES_CHECK_RC(es_buddy_check(pool));
  es_buddy_stats s;
  ES_CHECK_RC(es_buddy_stats_get(pool, &s));
  printf("# %u threads: %llu allocs, %llu failures, %llu splits, %llu merges, peak %zu B\n",
         THREADS, (unsigned long long)allocs, (unsigned long long)failures,
         (unsigned long long)s.splits, (unsigned long long)s.merges, s.peak_in_use);
  assert_int_equal(s.allocs, allocs);
  assert_int_equal(s.frees, frees);
  assert_int_equal(allocs, frees);
  assert_int_equal(s.failures, failures);
  assert_int_equal(s.invalid_frees, invalid);
  assert_int_equal(s.live_blocks, 0);
  assert_int_equal(s.bytes_in_use, 0);
  assert_int_equal(s.bytes_requested, 0);
  assert_int_equal(s.slabs, 0);
  assert_int_equal(s.free_bytes, s.capacity);
  assert_int_equal(s.largest_free, s.capacity);
  assert_true(s.fragmentation == 0.0);
  assert_int_equal(atomic_load(&watermark_calls), s.watermark_crossed);
  assert_int_equal(s.watermark_crossed, s.peak_in_use >= s.capacity / 2);
  es_buddy_destroy(pool);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mt_shared_pool),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
