/* The counting layer under concurrent use (runs under TSan in CI).
 *
 * Four threads allocate and free through every es_mem_* entry point, each on
 * a tag of its own and all on one shared tag. With nothing else allocating in
 * the process, the counters must balance exactly once the threads are done,
 * and no peak may be below a value its tag was seen to hold.
 *
 * Failure injection from several threads: the attempts of all threads are
 * numbered in one sequence, so exactly one fails (one-shot) or exactly those
 * from the N-th on (persistent), and the counters still balance. */
#include "es_test.h"

#include <pthread.h>
#include <string.h>
#include <unistd.h>

enum { THREADS = 4, ROUNDS = 4000, LIVE = 32 };

#define SHARED_TAG ES_MEM_OTHER

static const es_mem_tag own_tags_[THREADS] = {ES_MEM_ARENA, ES_MEM_BUDDY, ES_MEM_MODEL,
                                              ES_MEM_KERNELS};

static size_t page_size_;

typedef struct block {
  void *p;
  size_t size;
  int mapped; /* es_mem_map rather than heap */
} block;

typedef struct worker {
  int id;
  uint64_t seed;
  pthread_barrier_t *start;
  size_t own_live_max;    /* most bytes this thread held on its own tag */
  size_t shared_live_max; /* most bytes this thread held on the shared tag */
  size_t shared_seen_max; /* largest `current` seen on the shared tag */
  int errors;
} worker;

static void block_free(es_mem_tag tag, block *b) {
  if (b->mapped)
    es_mem_unmap(tag, b->p, b->size);
  else
    es_mem_free(b->p);
  b->p = NULL;
}

/* One allocation of a random kind; returns the bytes counted for it. */
static size_t block_make(es_mem_tag tag, uint64_t r, block *b) {
  size_t size = 1 + (size_t)(r >> 20) % 3000;
  b->mapped = 0;
  switch (r % 6) {
  case 0:
    b->p = es_mem_alloc(tag, size);
    break;
  case 1:
    b->p = es_mem_calloc(tag, size, 2);
    size *= 2;
    break;
  case 2:
    b->p = es_mem_aligned_alloc(tag, (size_t)1 << ((r >> 8) % 13), size);
    break;
  case 3: {
    /* Allocated, then resized: counted at the final size. */
    void *p = es_mem_alloc(tag, 64);
    b->p = p ? es_mem_realloc(p, size) : NULL;
    if (p && !b->p)
      es_mem_free(p);
    break;
  }
  case 4:
    b->p = es_mem_strdup(tag, "a shared string for the counting test");
    size = sizeof "a shared string for the counting test";
    break;
  default:
    b->p = es_mem_map(tag, size);
    b->mapped = 1;
    size = (size + page_size_ - 1) & ~(page_size_ - 1);
    break;
  }
  b->size = size;
  if (b->p)
    memset(b->p, 0xa5, b->mapped ? 1 : size); /* the whole block is usable */
  return b->p ? size : 0;
}

static void *worker_run(void *arg) {
  worker *w = arg;
  es_mem_tag own = own_tags_[w->id];
  block own_blocks[LIVE] = {{0}}, shared_blocks[LIVE] = {{0}};
  size_t own_live = 0, shared_live = 0;
  pthread_barrier_wait(w->start);
  for (int i = 0; i < ROUNDS; i++) {
    uint64_t r = es_test_rand(&w->seed);
    int shared = (r >> 40) & 1;
    es_mem_tag tag = shared ? SHARED_TAG : own;
    block *slot = &(shared ? shared_blocks : own_blocks)[(r >> 44) % LIVE];
    size_t *live = shared ? &shared_live : &own_live;
    if (slot->p) {
      *live -= slot->size;
      block_free(tag, slot);
    } else {
      size_t n = block_make(tag, r, slot);
      if (n == 0)
        w->errors++;
      *live += n;
    }
    if (own_live > w->own_live_max)
      w->own_live_max = own_live;
    if (shared_live > w->shared_live_max)
      w->shared_live_max = shared_live;
    if (i % 64 == 0) {
      es_mem_stats s;
      if (es_mem_stats_get(SHARED_TAG, &s) != 0)
        w->errors++;
      else if (s.current > w->shared_seen_max)
        w->shared_seen_max = s.current;
    }
  }
  for (int i = 0; i < LIVE; i++) {
    if (own_blocks[i].p)
      block_free(own, &own_blocks[i]);
    if (shared_blocks[i].p)
      block_free(SHARED_TAG, &shared_blocks[i]);
  }
  return NULL;
}

static void test_concurrent_counters_balance(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  page_size_ = (size_t)sysconf(_SC_PAGESIZE);
  es_mem_stats own0[THREADS], shared0;
  for (int i = 0; i < THREADS; i++)
    assert_int_equal(es_mem_stats_get(own_tags_[i], &own0[i]), 0);
  assert_int_equal(es_mem_stats_get(SHARED_TAG, &shared0), 0);
  size_t total0 = es_mem_total();

  pthread_barrier_t start;
  assert_int_equal(pthread_barrier_init(&start, NULL, THREADS), 0);
  pthread_t t[THREADS];
  worker w[THREADS];
  for (int i = 0; i < THREADS; i++) {
    w[i] = (worker){.id = i, .seed = seed + (uint64_t)i * 0x9e3779b97f4a7c15ull,
                    .start = &start};
    assert_int_equal(pthread_create(&t[i], NULL, worker_run, &w[i]), 0);
  }
  for (int i = 0; i < THREADS; i++)
    pthread_join(t[i], NULL);
  pthread_barrier_destroy(&start);

  size_t shared_live_max = 0, shared_seen_max = 0;
  for (int i = 0; i < THREADS; i++) {
    assert_int_equal(w[i].errors, 0);
    es_mem_stats s;
    assert_int_equal(es_mem_stats_get(own_tags_[i], &s), 0);
    assert_int_equal(s.current, own0[i].current);
    assert_int_equal(s.allocs - own0[i].allocs, s.frees - own0[i].frees);
    assert_true(s.allocs > own0[i].allocs);
    assert_int_equal(s.failures, own0[i].failures);
    /* Only this thread used the tag: its peak is at least what it held. */
    assert_true(s.peak >= own0[i].current + w[i].own_live_max);
    if (w[i].shared_live_max > shared_live_max)
      shared_live_max = w[i].shared_live_max;
    if (w[i].shared_seen_max > shared_seen_max)
      shared_seen_max = w[i].shared_seen_max;
  }
  es_mem_stats s;
  assert_int_equal(es_mem_stats_get(SHARED_TAG, &s), 0);
  assert_int_equal(s.current, shared0.current);
  assert_int_equal(s.allocs - shared0.allocs, s.frees - shared0.frees);
  assert_int_equal(s.failures, shared0.failures);
  assert_true(s.peak >= shared_seen_max);
  /* Others' blocks never count negative, so the shared peak covers any one
   * thread's own holding too. */
  assert_true(s.peak >= shared0.current + shared_live_max);
  assert_int_equal(es_mem_total(), total0);
}

typedef struct fault_worker {
  pthread_barrier_t *start;
  int refused; /* allocations that returned NULL */
} fault_worker;

enum { FAULT_ALLOCS = 5000 };

static void *fault_run(void *arg) {
  fault_worker *w = arg;
  pthread_barrier_wait(w->start);
  for (int i = 0; i < FAULT_ALLOCS; i++) {
    void *p = (i & 1) ? es_mem_calloc(ES_MEM_CLI, 3, 5) : es_mem_alloc(ES_MEM_CLI, 32);
    if (p)
      es_mem_free(p);
    else
      w->refused++;
  }
  return NULL;
}

static void fault_round(int persistent, uint64_t at) {
  es_mem_stats s0;
  assert_int_equal(es_mem_stats_get(ES_MEM_CLI, &s0), 0);
  pthread_barrier_t start;
  assert_int_equal(pthread_barrier_init(&start, NULL, THREADS), 0);
  pthread_t t[THREADS];
  fault_worker w[THREADS];
  es_mem_fault_config fc = {.fail_at = at, .persistent = persistent};
  assert_int_equal(es_mem_fault_arm(&fc), 0);
  for (int i = 0; i < THREADS; i++) {
    w[i] = (fault_worker){.start = &start};
    assert_int_equal(pthread_create(&t[i], NULL, fault_run, &w[i]), 0);
  }
  int refused = 0;
  for (int i = 0; i < THREADS; i++) {
    pthread_join(t[i], NULL);
    refused += w[i].refused;
  }
  es_mem_fault_disarm();
  pthread_barrier_destroy(&start);
  uint64_t total = (uint64_t)THREADS * FAULT_ALLOCS;
  uint64_t want = persistent ? total - at + 1 : 1;
  es_mem_fault_stats fs;
  assert_int_equal(es_mem_fault_stats_get(&fs), 0);
  assert_int_equal(fs.calls, total);
  assert_int_equal(fs.injected, want);
  assert_int_equal(refused, want);
  es_mem_stats s;
  assert_int_equal(es_mem_stats_get(ES_MEM_CLI, &s), 0);
  assert_int_equal(s.current, s0.current);
  assert_int_equal(s.failures - s0.failures, want);
  assert_int_equal(s.allocs - s0.allocs, total - want);
}

static void test_concurrent_fault_injection(void **state) {
  (void)state;
  fault_round(0, 1);
  fault_round(0, 7777);
  fault_round(0, (uint64_t)THREADS * FAULT_ALLOCS);
  fault_round(1, 12345);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_concurrent_counters_balance),
      cmocka_unit_test(test_concurrent_fault_injection),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
