/* The counting layer (es_mem_*) and the kernel's view (es_sys_*).
 *
 * Nothing else in this process allocates through es_mem_*, so every counter
 * delta is checked exactly. */
#include "es_test.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Let the sanitizers' allocators return NULL for absurd sizes, as malloc
 * does, instead of aborting: the failure path is what is under test. */
#if defined(ES_ASAN)
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }
#elif defined(ES_TSAN)
const char *__tsan_default_options(void);
const char *__tsan_default_options(void) { return "allocator_may_return_null=1"; }
#endif

static size_t pg(void) { return (size_t)sysconf(_SC_PAGESIZE); }

static es_mem_stats stats_of(es_mem_tag tag) {
  es_mem_stats s;
  assert_int_equal(es_mem_stats_get(tag, &s), 0);
  return s;
}

/* The change in every counter between two snapshots. */
typedef struct delta {
  long long current;
  long long allocs;
  long long frees;
  long long failures;
  long long file_mapped;
} delta;

static delta delta_of(es_mem_stats a, es_mem_stats b) {
  return (delta){(long long)b.current - (long long)a.current,
                 (long long)(b.allocs - a.allocs), (long long)(b.frees - a.frees),
                 (long long)(b.failures - a.failures),
                 (long long)b.file_mapped - (long long)a.file_mapped};
}

#define ASSERT_DELTA(d, cur, al, fr, fa)                                               \
  do {                                                                                 \
    assert_int_equal((d).current, (cur));                                              \
    assert_int_equal((d).allocs, (al));                                                \
    assert_int_equal((d).frees, (fr));                                                 \
    assert_int_equal((d).failures, (fa));                                              \
  } while (0)

/* ---- heap ------------------------------------------------------------------------ */

static void test_alloc_free(void **state) {
  (void)state;
  es_mem_stats s0 = stats_of(ES_MEM_MODEL);
  unsigned char *p = es_mem_alloc(ES_MEM_MODEL, 1000);
  assert_non_null(p);
  assert_int_equal((uintptr_t)p % 16, 0);
  memset(p, 0x11, 1000);
  es_mem_stats s1 = stats_of(ES_MEM_MODEL);
  ASSERT_DELTA(delta_of(s0, s1), 1000, 1, 0, 0);
  assert_int_equal(s1.peak, s0.peak > s0.current + 1000 ? s0.peak : s0.current + 1000);

  void *q = es_mem_alloc(ES_MEM_MODEL, 24);
  assert_non_null(q);
  ASSERT_DELTA(delta_of(s0, stats_of(ES_MEM_MODEL)), 1024, 2, 0, 0);
  es_mem_free(p);
  ASSERT_DELTA(delta_of(s0, stats_of(ES_MEM_MODEL)), 24, 2, 1, 0);
  es_mem_free(q);
  es_mem_stats s2 = stats_of(ES_MEM_MODEL);
  ASSERT_DELTA(delta_of(s0, s2), 0, 2, 2, 0);
  assert_true(s2.peak >= s0.current + 1024);
  es_mem_free(NULL);
  ASSERT_DELTA(delta_of(s2, stats_of(ES_MEM_MODEL)), 0, 0, 0, 0);
}

static void test_alloc_refused(void **state) {
  (void)state;
  es_mem_stats s0 = stats_of(ES_MEM_KERNELS);
  assert_null(es_mem_alloc(ES_MEM_KERNELS, 0));
  assert_null(es_mem_alloc(ES_MEM_KERNELS, SIZE_MAX));
  assert_null(es_mem_alloc(ES_MEM_KERNELS, SIZE_MAX - 8));
  /* Passes the size checks; the system refuses it. */
  assert_null(es_mem_alloc(ES_MEM_KERNELS, SIZE_MAX / 2));
  ASSERT_DELTA(delta_of(s0, stats_of(ES_MEM_KERNELS)), 0, 0, 0, 4);
}

static void test_calloc_zeroed(void **state) {
  (void)state;
  es_mem_stats s0 = stats_of(ES_MEM_ENGINE);
  unsigned char *p = es_mem_calloc(ES_MEM_ENGINE, 100, 12);
  assert_non_null(p);
  for (size_t i = 0; i < 1200; i++)
    assert_int_equal(p[i], 0);
  ASSERT_DELTA(delta_of(s0, stats_of(ES_MEM_ENGINE)), 1200, 1, 0, 0);
  es_mem_free(p);
  ASSERT_DELTA(delta_of(s0, stats_of(ES_MEM_ENGINE)), 0, 1, 1, 0);

  es_mem_stats s1 = stats_of(ES_MEM_ENGINE);
  assert_null(es_mem_calloc(ES_MEM_ENGINE, SIZE_MAX / 2, 3)); /* n * size overflows */
  assert_null(es_mem_calloc(ES_MEM_ENGINE, 3, SIZE_MAX / 2));
  assert_null(es_mem_calloc(ES_MEM_ENGINE, 0, 16));
  assert_null(es_mem_calloc(ES_MEM_ENGINE, 16, 0));
  ASSERT_DELTA(delta_of(s1, stats_of(ES_MEM_ENGINE)), 0, 0, 0, 4);
}

static void test_aligned_alloc(void **state) {
  (void)state;
  const size_t aligns[] = {1, 2, 16, 64, 256, 4096};
  es_mem_stats s0 = stats_of(ES_MEM_BUDDY);
  for (size_t i = 0; i < sizeof aligns / sizeof aligns[0]; i++) {
    unsigned char *p = es_mem_aligned_alloc(ES_MEM_BUDDY, aligns[i], 333);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % aligns[i], 0);
    assert_int_equal((uintptr_t)p % 16, 0); /* never less than malloc's */
    memset(p, 0x5a, 333);
    ASSERT_DELTA(delta_of(s0, stats_of(ES_MEM_BUDDY)), 333, (long long)i + 1, (long long)i, 0);
    es_mem_free(p);
    ASSERT_DELTA(delta_of(s0, stats_of(ES_MEM_BUDDY)), 0, (long long)i + 1, (long long)i + 1, 0);
  }

  es_mem_stats s1 = stats_of(ES_MEM_BUDDY);
  assert_null(es_mem_aligned_alloc(ES_MEM_BUDDY, 3, 64));    /* not a power of two */
  assert_null(es_mem_aligned_alloc(ES_MEM_BUDDY, 0, 64));
  assert_null(es_mem_aligned_alloc(ES_MEM_BUDDY, 8192, 64)); /* above 4096 */
  assert_null(es_mem_aligned_alloc(ES_MEM_BUDDY, 64, 0));
  assert_null(es_mem_aligned_alloc(ES_MEM_BUDDY, 64, SIZE_MAX));
  /* Small alignments are padded to 16: the overflow check must know. */
  assert_null(es_mem_aligned_alloc(ES_MEM_BUDDY, 1, SIZE_MAX - 40));
  ASSERT_DELTA(delta_of(s1, stats_of(ES_MEM_BUDDY)), 0, 0, 0, 6);

  /* Aligned blocks cannot be resized (realloc would not keep the alignment),
   * even when the block happens to start right after malloc's header. */
  const size_t ralign[] = {16, 64, 4096};
  for (size_t i = 0; i < sizeof ralign / sizeof ralign[0]; i++) {
    unsigned char *a = es_mem_aligned_alloc(ES_MEM_BUDDY, ralign[i], 100);
    assert_non_null(a);
    memset(a, 0x77, 100);
    assert_null(es_mem_realloc(a, 200));
    assert_int_equal(a[99], 0x77);
    es_mem_free(a);
  }
  ASSERT_DELTA(delta_of(s1, stats_of(ES_MEM_BUDDY)), 0, 3, 3, 9);
}

static void test_realloc_resizes(void **state) {
  (void)state;
  es_mem_stats s0 = stats_of(ES_MEM_RUNTIME);
  unsigned char *p = es_mem_alloc(ES_MEM_RUNTIME, 100);
  assert_non_null(p);
  for (int i = 0; i < 100; i++)
    p[i] = (unsigned char)i;

  p = es_mem_realloc(p, 100000); /* grow */
  assert_non_null(p);
  for (int i = 0; i < 100; i++)
    assert_int_equal(p[i], i);
  es_mem_stats s1 = stats_of(ES_MEM_RUNTIME);
  ASSERT_DELTA(delta_of(s0, s1), 100000, 1, 0, 0);
  assert_true(s1.peak >= s0.current + 100000);
  memset(p + 100, 0xcc, 100000 - 100);

  p = es_mem_realloc(p, 50); /* shrink */
  assert_non_null(p);
  for (int i = 0; i < 50; i++)
    assert_int_equal(p[i], i);
  ASSERT_DELTA(delta_of(s0, stats_of(ES_MEM_RUNTIME)), 50, 1, 0, 0);
  assert_int_equal(stats_of(ES_MEM_RUNTIME).peak, s1.peak);

  /* Refusals leave the block and the counters (but failures) alone. */
  assert_null(es_mem_realloc(p, 0));
  assert_null(es_mem_realloc(p, SIZE_MAX));
  assert_null(es_mem_realloc(p, SIZE_MAX / 2));
  for (int i = 0; i < 50; i++)
    assert_int_equal(p[i], i);
  ASSERT_DELTA(delta_of(s0, stats_of(ES_MEM_RUNTIME)), 50, 1, 0, 3);
  assert_null(es_mem_realloc(NULL, 10));

  es_mem_free(p);
  ASSERT_DELTA(delta_of(s0, stats_of(ES_MEM_RUNTIME)), 0, 1, 1, 3);
}

static void test_strdup(void **state) {
  (void)state;
  es_mem_stats s0 = stats_of(ES_MEM_CLI);
  char *s = es_mem_strdup(ES_MEM_CLI, "edgeserve");
  assert_non_null(s);
  assert_string_equal(s, "edgeserve");
  ASSERT_DELTA(delta_of(s0, stats_of(ES_MEM_CLI)), 10, 1, 0, 0);
  char *e = es_mem_strdup(ES_MEM_CLI, "");
  assert_non_null(e);
  assert_string_equal(e, "");
  ASSERT_DELTA(delta_of(s0, stats_of(ES_MEM_CLI)), 11, 2, 0, 0);
  es_mem_free(s);
  es_mem_free(e);
  assert_null(es_mem_strdup(ES_MEM_CLI, NULL));
  ASSERT_DELTA(delta_of(s0, stats_of(ES_MEM_CLI)), 0, 2, 2, 0);
}

/* ---- anonymous maps and file accounting ---------------------------------------- */

static void test_map_unmap(void **state) {
  (void)state;
  size_t page = pg();
  es_mem_stats s0 = stats_of(ES_MEM_ARENA);
  unsigned char *a = es_mem_map(ES_MEM_ARENA, 1);
  assert_non_null(a);
  assert_int_equal((uintptr_t)a % page, 0);
  a[page - 1] = 1; /* the whole page is usable */
  ASSERT_DELTA(delta_of(s0, stats_of(ES_MEM_ARENA)), (long long)page, 1, 0, 0);

  unsigned char *b = es_mem_map(ES_MEM_ARENA, page + 1);
  assert_non_null(b);
  b[2 * page - 1] = 1;
  ASSERT_DELTA(delta_of(s0, stats_of(ES_MEM_ARENA)), (long long)(3 * page), 2, 0, 0);

  es_mem_unmap(ES_MEM_ARENA, a, 1);
  es_mem_unmap(ES_MEM_ARENA, b, page + 1);
  ASSERT_DELTA(delta_of(s0, stats_of(ES_MEM_ARENA)), 0, 2, 2, 0);
  es_mem_unmap(ES_MEM_ARENA, NULL, page);

  assert_null(es_mem_map(ES_MEM_ARENA, 0));
  assert_null(es_mem_map(ES_MEM_ARENA, SIZE_MAX)); /* page rounding overflows */
  ASSERT_DELTA(delta_of(s0, stats_of(ES_MEM_ARENA)), 0, 2, 2, 2);
}

/* An aligned map starts on its alignment, counts exactly its page-rounded
 * size as one block, and keeps nothing mapped beyond it. */
static void test_map_aligned(void **state) {
  (void)state;
  size_t page = pg(), huge = (size_t)2 << 20, n = (huge + huge / 2 + page) / page * page;
  es_mem_stats s0 = stats_of(ES_MEM_ARENA);
  for (int i = 0; i < 4; i++) {
    unsigned char *a = es_mem_map_aligned(ES_MEM_ARENA, huge + huge / 2 + 1, huge);
    assert_non_null(a);
    assert_int_equal((uintptr_t)a % huge, 0);
    a[0] = 1;
    a[n - 1] = 1;
    ASSERT_DELTA(delta_of(s0, stats_of(ES_MEM_ARENA)), (long long)n, i + 1, i, 0);
    unsigned char v;
    assert_int_equal(mincore(a + n, page, &v), -1); /* the tail went back */
    assert_int_equal(errno, ENOMEM);
    es_mem_unmap(ES_MEM_ARENA, a, huge + huge / 2 + 1);
  }
  ASSERT_DELTA(delta_of(s0, stats_of(ES_MEM_ARENA)), 0, 4, 4, 0);
  unsigned char *b = es_mem_map_aligned(ES_MEM_ARENA, 1, 1); /* below a page: a page */
  assert_non_null(b);
  assert_int_equal((uintptr_t)b % page, 0);
  es_mem_unmap(ES_MEM_ARENA, b, 1);
  assert_null(es_mem_map_aligned(ES_MEM_ARENA, page, 3 * page)); /* not a power of two */
  assert_null(es_mem_map_aligned(ES_MEM_ARENA, 0, huge));
  assert_null(es_mem_map_aligned(ES_MEM_ARENA, SIZE_MAX - page, huge));
  ASSERT_DELTA(delta_of(s0, stats_of(ES_MEM_ARENA)), 0, 5, 5, 3);
}

static void test_account_file(void **state) {
  (void)state;
  es_mem_stats s0 = stats_of(ES_MEM_APPS);
  es_mem_account_file(ES_MEM_APPS, 12345);
  delta d = delta_of(s0, stats_of(ES_MEM_APPS));
  assert_int_equal(d.file_mapped, 12345);
  ASSERT_DELTA(d, 0, 0, 0, 0); /* not heap, not counted in current */
  es_mem_account_file(ES_MEM_APPS, -12345);
  assert_int_equal(delta_of(s0, stats_of(ES_MEM_APPS)).file_mapped, 0);
  es_mem_account_file((es_mem_tag)ES_MEM_TAG_COUNT, 99); /* ignored */
}

/* ---- queries ------------------------------------------------------------------- */

static void test_total_is_sum(void **state) {
  (void)state;
  void *held[ES_MEM_TAG_COUNT];
  for (int t = 0; t < ES_MEM_TAG_COUNT; t++) {
    held[t] = es_mem_alloc((es_mem_tag)t, 100 + (size_t)t);
    assert_non_null(held[t]);
  }
  size_t sum = 0;
  for (int t = 0; t < ES_MEM_TAG_COUNT; t++)
    sum += stats_of((es_mem_tag)t).current;
  assert_int_equal(es_mem_total(), sum);
  for (int t = 0; t < ES_MEM_TAG_COUNT; t++)
    es_mem_free(held[t]);
  assert_int_equal(es_mem_total(), sum - (size_t)ES_MEM_TAG_COUNT * 100 -
                                       (size_t)(ES_MEM_TAG_COUNT * (ES_MEM_TAG_COUNT - 1) / 2));
}

static void test_tag_names(void **state) {
  (void)state;
  static const char *const want[] = {
#define TAG_STR_(name, str) str,
      ES_MEM_TAG_MAP(TAG_STR_)
#undef TAG_STR_
  };
  assert_int_equal(sizeof want / sizeof want[0], ES_MEM_TAG_COUNT);
  for (int t = 0; t < ES_MEM_TAG_COUNT; t++)
    assert_string_equal(es_mem_tag_name((es_mem_tag)t), want[t]);
  assert_string_equal(es_mem_tag_name(ES_MEM_WEIGHTS), "weights");
  assert_string_equal(es_mem_tag_name((es_mem_tag)ES_MEM_TAG_COUNT), "?");
  assert_string_equal(es_mem_tag_name((es_mem_tag)-1), "?");
}

static void test_bad_tag(void **state) {
  (void)state;
  es_mem_stats s;
  const es_mem_tag bad[] = {(es_mem_tag)ES_MEM_TAG_COUNT, (es_mem_tag)-1, (es_mem_tag)1000};
  size_t total = es_mem_total();
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(es_mem_stats_get(bad[i], &s), ES_EINVAL);
    assert_null(es_mem_alloc(bad[i], 16));
    assert_null(es_mem_calloc(bad[i], 2, 8));
    assert_null(es_mem_calloc(bad[i], SIZE_MAX, 2));
    assert_null(es_mem_aligned_alloc(bad[i], 64, 16));
    assert_null(es_mem_strdup(bad[i], "x"));
    assert_null(es_mem_map(bad[i], 4096));
  }
  assert_int_equal(es_mem_stats_get(ES_MEM_OTHER, NULL), ES_EINVAL);
  assert_int_equal(es_mem_total(), total);
}

/* ---- the kernel's view ---------------------------------------------------------------- */

static void test_sys_rss(void **state) {
  (void)state;
  size_t rss = 0, peak = 0;
  ES_CHECK_RC(es_sys_rss(&rss));
  ES_CHECK_RC(es_sys_peak_rss(&peak));
  assert_true(rss > 0);
  assert_true(peak > 0);
  assert_true(peak >= rss);
  assert_int_equal(es_sys_rss(NULL), ES_EINVAL);
  assert_int_equal(es_sys_peak_rss(NULL), ES_EINVAL);
}

static void test_sys_peak_reset(void **state) {
  (void)state;
  /* Raise the peak well above the current RSS, then drop back. */
  size_t big = 64u << 20;
  unsigned char *p = es_mem_map(ES_MEM_OTHER, big);
  assert_non_null(p);
  for (size_t i = 0; i < big; i += pg())
    p[i] = 1;
  size_t high = 0;
  ES_CHECK_RC(es_sys_peak_rss(&high));
  es_mem_unmap(ES_MEM_OTHER, p, big);

  int rc = es_sys_peak_rss_reset();
  if (rc == ES_ENOTSUP) {
    print_message("# peak RSS reset not supported: %s\n", es_last_error_detail());
    skip();
  }
  ES_CHECK_RC(rc);
  size_t rss = 0, peak = 0;
  ES_CHECK_RC(es_sys_peak_rss(&peak));
  ES_CHECK_RC(es_sys_rss(&rss));
  assert_true(peak >= rss - rss / 8); /* rss is read after peak; allow growth */
  assert_true(peak < high - big / 2);
}

static void test_sys_pss_of(void **state) {
  (void)state;
  size_t page = pg();
  unsigned char *p = es_mem_map(ES_MEM_OTHER, page);
  assert_non_null(p);
  p[0] = 1; /* private and touched: counts in full */
  size_t pss = 0;
  ES_CHECK_RC(es_sys_pss_of(p, &pss));
  assert_true(pss >= page);
  ES_CHECK_RC(es_sys_pss_of(p + page - 1, &pss));
  assert_true(pss >= page);
  es_mem_unmap(ES_MEM_OTHER, p, page);

  assert_int_equal(es_sys_pss_of(NULL, &pss), ES_EINVAL);
  assert_int_equal(es_sys_pss_of(&pss, NULL), ES_EINVAL);
  assert_int_equal(es_sys_pss_of((void *)(uintptr_t)16, &pss), ES_EINVAL); /* page 0 */
}

static void test_sys_success_keeps_detail(void **state) {
  (void)state;
  size_t v = 0;
  assert_int_equal(es_sys_pss_of((void *)(uintptr_t)16, &v), ES_EINVAL);
  char saved[512];
  snprintf(saved, sizeof saved, "%s", es_last_error_detail());
  assert_true(strlen(saved) > 0);
  ES_CHECK_RC(es_sys_rss(&v));
  ES_CHECK_RC(es_sys_peak_rss(&v));
  ES_CHECK_RC(es_sys_pss_of(&v, &v));
  assert_string_equal(es_last_error_detail(), saved);
}

/* ---- failure injection ------------------------------------------------------------ */

typedef struct seen_log {
  uint64_t n;                /* calls of the hook */
  uint64_t last;             /* last ordinal */
  es_mem_tag tag[16];
  size_t size[16];
  const void *caller[16];
} seen_log;

static void log_alloc(void *user, uint64_t ordinal, es_mem_tag tag, size_t size,
                      const void *caller) {
  seen_log *l = user;
  if (l->n < 16) {
    l->tag[l->n] = tag;
    l->size[l->n] = size;
    l->caller[l->n] = caller;
  }
  l->n++;
  l->last = ordinal;
}

static es_mem_fault_stats fault_stats(void) {
  es_mem_fault_stats fs;
  assert_int_equal(es_mem_fault_stats_get(&fs), 0);
  return fs;
}

/* One-shot: only the N-th attempt fails, counted as a failure of its tag,
 * whichever entry point makes it; the ones before and after succeed. */
static void test_fault_one_shot(void **state) {
  (void)state;
  for (uint64_t at = 1; at <= 6; at++) {
    void *r = es_mem_alloc(ES_MEM_KERNELS, 8); /* made before arming: not numbered */
    assert_non_null(r);
    es_mem_stats s0 = stats_of(ES_MEM_KERNELS);
    es_mem_fault_config fc = {.fail_at = at};
    ES_CHECK_RC(es_mem_fault_arm(&fc));
    void *p[6];
    p[0] = es_mem_alloc(ES_MEM_KERNELS, 100);
    p[1] = es_mem_calloc(ES_MEM_KERNELS, 10, 10);
    p[2] = es_mem_aligned_alloc(ES_MEM_KERNELS, 256, 100);
    p[3] = es_mem_strdup(ES_MEM_KERNELS, "injected");
    p[4] = es_mem_map(ES_MEM_KERNELS, 100);
    p[5] = es_mem_realloc(r, 4000);
    es_mem_fault_disarm();
    es_mem_fault_stats fs = fault_stats();
    assert_int_equal(fs.armed, 0);
    assert_int_equal(fs.calls, 6);
    assert_int_equal(fs.injected, 1);
    for (uint64_t i = 0; i < 6; i++) {
      if (i + 1 == at)
        assert_null(p[i]);
      else
        assert_non_null(p[i]);
    }
    if (at == 6)
      p[5] = r; /* the old block is untouched and still owned */
    es_mem_stats s1 = stats_of(ES_MEM_KERNELS);
    assert_int_equal(s1.failures - s0.failures, 1);
    for (int i = 0; i < 6; i++)
      if (i == 4)
        es_mem_unmap(ES_MEM_KERNELS, p[i], 100);
      else
        es_mem_free(p[i]);
    assert_int_equal(stats_of(ES_MEM_KERNELS).current + 8, s0.current);
  }
}

/* Persistent: the N-th and every later attempt fail until disarmed. */
static void test_fault_persistent(void **state) {
  (void)state;
  es_mem_fault_config fc = {.fail_at = 3, .persistent = 1};
  ES_CHECK_RC(es_mem_fault_arm(&fc));
  void *a = es_mem_alloc(ES_MEM_OTHER, 10), *b = es_mem_alloc(ES_MEM_OTHER, 10);
  void *c = es_mem_alloc(ES_MEM_OTHER, 10), *d = es_mem_map(ES_MEM_OTHER, 10);
  void *e = es_mem_realloc(a, 20);
  es_mem_fault_stats fs = fault_stats();
  assert_int_equal(fs.armed, 1);
  assert_int_equal(fs.calls, 5);
  assert_int_equal(fs.injected, 3);
  es_mem_fault_disarm();
  void *f = es_mem_alloc(ES_MEM_OTHER, 10);
  assert_non_null(a);
  assert_non_null(b);
  assert_null(c);
  assert_null(d);
  assert_null(e);
  assert_non_null(f);
  assert_int_equal(fault_stats().calls, 5); /* disarmed: not numbered */
  es_mem_free(a);
  es_mem_free(b);
  es_mem_free(f);
}

/* fail_at 0 numbers the attempts and shows them to the hook, with tag, size
 * and the caller (here: inside this function), and fails none. Arguments
 * refused before the system is asked are not attempts. */
static void test_fault_count_only(void **state) {
  (void)state;
  seen_log l = {0};
  es_mem_fault_config fc = {.on_alloc = log_alloc, .user = &l};
  ES_CHECK_RC(es_mem_fault_arm(&fc));
  void *a = es_mem_calloc(ES_MEM_APPS, 3, 7);
  assert_null(es_mem_alloc(ES_MEM_APPS, 0));
  assert_null(es_mem_aligned_alloc(ES_MEM_APPS, 3, 10));
  char *s = es_mem_strdup(ES_MEM_SERVER, "x");
  es_mem_fault_disarm();
  assert_non_null(a);
  assert_non_null(s);
  assert_int_equal(l.n, 2);
  assert_int_equal(l.last, 2);
  assert_int_equal(l.tag[0], ES_MEM_APPS);
  assert_int_equal(l.size[0], 21);
  assert_int_equal(l.tag[1], ES_MEM_SERVER);
  assert_int_equal(l.size[1], 2);
  /* The callers are return addresses into this function. */
  uintptr_t here = (uintptr_t)(void *)test_fault_count_only;
  for (int i = 0; i < 2; i++)
    assert_true((uintptr_t)l.caller[i] > here && (uintptr_t)l.caller[i] < here + 16384);
  es_mem_fault_stats fs = fault_stats();
  assert_int_equal(fs.calls, 2);
  assert_int_equal(fs.injected, 0);
  es_mem_free(a);
  es_mem_free(s);
  /* Arming again restarts the numbering. */
  es_mem_fault_config f1 = {.fail_at = 1};
  ES_CHECK_RC(es_mem_fault_arm(&f1));
  assert_int_equal(fault_stats().calls, 0);
  assert_null(es_mem_alloc(ES_MEM_OTHER, 1));
  es_mem_fault_disarm();
  assert_int_equal(es_mem_fault_arm(NULL), ES_EINVAL);
  assert_int_equal(es_mem_fault_stats_get(NULL), ES_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_alloc_free),
      cmocka_unit_test(test_alloc_refused),
      cmocka_unit_test(test_calloc_zeroed),
      cmocka_unit_test(test_aligned_alloc),
      cmocka_unit_test(test_realloc_resizes),
      cmocka_unit_test(test_strdup),
      cmocka_unit_test(test_map_unmap),
      cmocka_unit_test(test_map_aligned),
      cmocka_unit_test(test_account_file),
      cmocka_unit_test(test_total_is_sum),
      cmocka_unit_test(test_tag_names),
      cmocka_unit_test(test_bad_tag),
      cmocka_unit_test(test_sys_rss),
      cmocka_unit_test(test_sys_peak_reset),
      cmocka_unit_test(test_sys_pss_of),
      cmocka_unit_test(test_sys_success_keeps_detail),
      cmocka_unit_test(test_fault_one_shot),
      cmocka_unit_test(test_fault_persistent),
      cmocka_unit_test(test_fault_count_only),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
