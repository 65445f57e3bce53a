/* Buddy pool: every public function, its edge cases and its error paths.
 * Sizes in the comments assume the defaults (64 MiB, 64 KiB units, 256-byte
 * alignment, slabs up to 256 KiB) unless a test says otherwise. */
#include "es_test.h"

#include <math.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static es_buddy *pool_new(const es_buddy_config *cfg) {
  es_buddy *b = NULL;
  ES_CHECK_RC(es_buddy_create(cfg, &b));
  assert_non_null(b);
  return b;
}

static es_buddy *pool_default(void) {
  es_buddy_config cfg;
  es_buddy_config_default(&cfg);
  return pool_new(&cfg);
}

static es_buddy *pool_no_slabs(void) {
  es_buddy_config cfg;
  es_buddy_config_default(&cfg);
  cfg.slab_max = 0;
  return pool_new(&cfg);
}

static es_buddy_stats stats_of(es_buddy *b) {
  es_buddy_stats s;
  ES_CHECK_RC(es_buddy_stats_get(b, &s));
  return s;
}

static void *alloc_ok(es_buddy *b, size_t size) {
  void *p = NULL;
  ES_CHECK_RC(es_buddy_alloc(b, size, &p));
  assert_non_null(p);
  return p;
}

static size_t usable_of(es_buddy *b, const void *p) {
  size_t n = 0;
  ES_CHECK_RC(es_buddy_usable_size(b, p, &n));
  return n;
}

static void assert_aligned(const void *p, size_t align) {
  if ((uintptr_t)p % align)
    fail_msg("%p is not aligned to %zu", p, align);
}

/* Everything free again: the pool coalesced back to its top blocks. */
static void assert_pristine(es_buddy *b) {
  ES_CHECK_RC(es_buddy_check(b));
  es_buddy_stats s = stats_of(b);
  assert_int_equal(s.bytes_in_use, 0);
  assert_int_equal(s.bytes_requested, 0);
  assert_int_equal(s.live_blocks, 0);
  assert_int_equal(s.slabs, 0);
  assert_int_equal(s.free_bytes, s.capacity);
}

/* ---- configuration -------------------------------------------------------------- */

static void test_config_default(void **state) {
  (void)state;
  es_buddy_config cfg;
  memset(&cfg, 0xAB, sizeof cfg);
  es_buddy_config_default(&cfg);
  assert_int_equal(cfg.capacity, 64 * MiB);
  assert_int_equal(cfg.min_block, 64 * KiB);
  assert_int_equal(cfg.align, 256);
  assert_int_equal(cfg.slab_max, 256 * KiB);
  assert_int_equal(cfg.grow, 0);
  assert_int_equal(cfg.grow_max, 0);
  assert_true(fabs(cfg.watermark_ratio - 0.85) < 1e-12);
  assert_null(cfg.on_watermark);
  assert_null(cfg.user);
  es_buddy_config_default(NULL);
}

static void expect_bad_config(const es_buddy_config *cfg, const char *field) {
  es_buddy *b = (es_buddy *)(uintptr_t)0x1234;
  ES_EXPECT_RC(es_buddy_create(cfg, &b), ES_EINVAL);
  assert_ptr_equal(b, (es_buddy *)(uintptr_t)0x1234);
  if (!strstr(es_last_error_detail(), field))
    fail_msg("detail \"%s\" does not name %s", es_last_error_detail(), field);
}

static void test_create_invalid(void **state) {
  (void)state;
  es_buddy_config cfg;
  es_buddy *b = NULL;
  es_buddy_config_default(&cfg);
  ES_EXPECT_RC(es_buddy_create(NULL, &b), ES_EINVAL);
  ES_EXPECT_RC(es_buddy_create(&cfg, NULL), ES_EINVAL);
  assert_null(b);

  static const size_t bad_min[] = {0, 3000, 2048, 100000, 65535};
  for (size_t i = 0; i < sizeof bad_min / sizeof bad_min[0]; i++) {
    es_buddy_config_default(&cfg);
    cfg.min_block = bad_min[i];
    expect_bad_config(&cfg, "min_block");
  }
  static const size_t bad_align[] = {0, 3, 8, 100, 8192};
  for (size_t i = 0; i < sizeof bad_align / sizeof bad_align[0]; i++) {
    es_buddy_config_default(&cfg);
    cfg.min_block = 4096;
    cfg.align = bad_align[i];
    expect_bad_config(&cfg, "align");
  }
  es_buddy_config_default(&cfg);
  cfg.align = 128 * KiB; /* above the 64 KiB min_block */
  expect_bad_config(&cfg, "align");

  es_buddy_config_default(&cfg);
  cfg.capacity = 0;
  expect_bad_config(&cfg, "capacity");
  cfg.capacity = 64 * KiB - 1;
  expect_bad_config(&cfg, "capacity");

  static const double bad_ratio[] = {0.0, -0.5, 1.5};
  for (size_t i = 0; i < sizeof bad_ratio / sizeof bad_ratio[0]; i++) {
    es_buddy_config_default(&cfg);
    cfg.watermark_ratio = bad_ratio[i];
    expect_bad_config(&cfg, "watermark_ratio");
  }
  es_buddy_config_default(&cfg);
  cfg.watermark_ratio = NAN;
  expect_bad_config(&cfg, "watermark_ratio");

  es_buddy_config_default(&cfg);
  cfg.grow = 1;
  cfg.grow_max = 32 * MiB;
  expect_bad_config(&cfg, "grow_max");

  es_buddy_config_default(&cfg);
  cfg.slab_max = (size_t)4 << 30;
  expect_bad_config(&cfg, "slab_max");
}

static void test_create_destroy(void **state) {
  (void)state;
  es_mem_stats m0, m1, m2;
  ES_CHECK_RC(es_mem_stats_get(ES_MEM_BUDDY, &m0));
  es_buddy *b = pool_default();
  ES_CHECK_RC(es_mem_stats_get(ES_MEM_BUDDY, &m1));
  assert_true(m1.current >= m0.current + 64 * MiB);

  es_buddy_stats s = stats_of(b);
  assert_int_equal(s.capacity, 64 * MiB);
  assert_int_equal(s.regions, 1);
  assert_int_equal(s.free_bytes, 64 * MiB);
  assert_int_equal(s.largest_free, 64 * MiB);
  assert_true(s.fragmentation == 0.0);
  assert_int_equal(s.allocs + s.frees + s.failures + s.invalid_frees, 0);
  assert_int_equal(s.splits + s.merges + s.growths, 0);
  assert_int_equal(s.peak_in_use, 0);
  assert_int_equal(s.watermark_crossed, 0);
  ES_CHECK_RC(es_buddy_check(b));
  es_buddy_destroy(b);
  es_buddy_destroy(NULL);
  ES_CHECK_RC(es_mem_stats_get(ES_MEM_BUDDY, &m2));
  assert_int_equal(m2.current, m0.current);
}

static void test_capacity_rounded_down(void **state) {
  (void)state;
  es_buddy_config cfg;
  es_buddy_config_default(&cfg);
  cfg.capacity = 10 * MiB + 1000;
  es_buddy *b = pool_new(&cfg);
  es_buddy_stats s = stats_of(b);
  assert_int_equal(s.capacity, 10 * MiB);
  assert_int_equal(s.free_bytes, 10 * MiB);
  assert_int_equal(s.largest_free, 8 * MiB);
  ES_CHECK_RC(es_buddy_check(b));
  es_buddy_destroy(b);
}

static void test_null_arguments(void **state) {
  (void)state;
  es_buddy *b = pool_default();
  void *p = NULL;
  size_t n = 0;
  es_buddy_stats s;
  ES_EXPECT_RC(es_buddy_alloc(NULL, 16, &p), ES_EINVAL);
  ES_EXPECT_RC(es_buddy_alloc(b, 16, NULL), ES_EINVAL);
  ES_EXPECT_RC(es_buddy_free(NULL, &n), ES_EINVAL);
  ES_EXPECT_RC(es_buddy_free(b, NULL), ES_EINVAL);
  ES_EXPECT_RC(es_buddy_usable_size(b, NULL, &n), ES_EINVAL);
  ES_EXPECT_RC(es_buddy_stats_get(b, NULL), ES_EINVAL);
  ES_EXPECT_RC(es_buddy_stats_get(NULL, &s), ES_EINVAL);
  ES_EXPECT_RC(es_buddy_check(NULL), ES_EINVAL);
  s = stats_of(b);
  assert_int_equal(s.invalid_frees, 0);
  assert_int_equal(s.live_blocks, 0);
  ES_CHECK_RC(es_buddy_check(b));
  es_buddy_destroy(b);
}

/* ---- allocation sizes and failures ----------------------------------------------- */

static void test_alloc_size_zero(void **state) {
  (void)state;
  es_buddy *b = pool_default();
  void *p = (void *)(uintptr_t)0x42;
  ES_EXPECT_RC(es_buddy_alloc(b, 0, &p), ES_EINVAL);
  assert_ptr_equal(p, (void *)(uintptr_t)0x42);
  es_buddy_stats s = stats_of(b);
  assert_int_equal(s.failures, 1);
  assert_int_equal(s.allocs, 0);
  assert_pristine(b);
  es_buddy_destroy(b);
}

static void test_alloc_huge(void **state) {
  (void)state;
  es_buddy *b = pool_default();
  void *p = NULL;
  ES_EXPECT_RC(es_buddy_alloc(b, SIZE_MAX, &p), ES_EOVERFLOW);
  ES_EXPECT_RC(es_buddy_alloc(b, SIZE_MAX / 2 + 2, &p), ES_EOVERFLOW);
  ES_EXPECT_RC(es_buddy_alloc(b, SIZE_MAX / 4, &p), ES_ENOSPC);
  ES_EXPECT_RC(es_buddy_alloc(b, 64 * MiB + 1, &p), ES_ENOSPC);
  assert_null(p);
  es_buddy_stats s = stats_of(b);
  assert_int_equal(s.failures, 4);
  assert_int_equal(s.splits, 0);
  assert_pristine(b);
  es_buddy_destroy(b);
}

static void test_exhaust_exactly_at_capacity(void **state) {
  (void)state;
  es_buddy *b = pool_default();
  void *all = alloc_ok(b, 64 * MiB);
  es_buddy_stats s = stats_of(b);
  assert_int_equal(s.bytes_in_use, 64 * MiB);
  assert_int_equal(s.free_bytes, 0);
  assert_int_equal(s.largest_free, 0);
  assert_true(s.fragmentation == 0.0);
  assert_int_equal(s.splits, 0);

  void *p = NULL;
  ES_EXPECT_RC(es_buddy_alloc(b, 1, &p), ES_ENOSPC);
  assert_non_null(strstr(es_last_error_detail(), "buddy pool exhausted: requested 1 B"));
  ES_EXPECT_RC(es_buddy_alloc(b, 1 * MiB, &p), ES_ENOSPC);
  assert_non_null(
      strstr(es_last_error_detail(), "requested 1048576 B (block 1048576 B), free 0 B"));
  assert_null(p);
  s = stats_of(b);
  assert_int_equal(s.failures, 2);
  assert_int_equal(s.allocs, 1);
  ES_CHECK_RC(es_buddy_check(b));

  ES_CHECK_RC(es_buddy_free(b, all));
  assert_pristine(b);
  assert_int_equal(stats_of(b).largest_free, 64 * MiB);
  es_buddy_destroy(b);
}

static void test_split_merge_counts(void **state) {
  (void)state;
  es_buddy *b = pool_no_slabs();
  /* 64 MiB / 64 KiB = 1024 units = level 10: ten halvings down to one unit. */
  void *p = alloc_ok(b, 1);
  es_buddy_stats s = stats_of(b);
  assert_int_equal(s.splits, 10);
  assert_int_equal(s.merges, 0);
  assert_int_equal(s.bytes_in_use, 64 * KiB);
  assert_int_equal(s.bytes_requested, 1);
  assert_int_equal(s.free_bytes, 64 * MiB - 64 * KiB);
  assert_int_equal(s.largest_free, 32 * MiB);
  /* Its buddy is free now: taking it needs no split. */
  void *q = alloc_ok(b, 64 * KiB);
  assert_int_equal(stats_of(b).splits, 10);
  assert_int_equal((uintptr_t)q - (uintptr_t)p, 64 * KiB);

  ES_CHECK_RC(es_buddy_free(b, p));
  assert_int_equal(stats_of(b).merges, 0); /* its buddy is still live */
  ES_CHECK_RC(es_buddy_free(b, q));
  s = stats_of(b);
  assert_int_equal(s.merges, 10);
  assert_int_equal(s.largest_free, 64 * MiB);
  assert_true(s.fragmentation == 0.0);
  assert_pristine(b);
  es_buddy_destroy(b);
}

static void test_block_rounding(void **state) {
  (void)state;
  es_buddy *b = pool_no_slabs();
  static const struct {
    size_t size, block;
  } cases[] = {
      {1, 64 * KiB},           {64 * KiB, 64 * KiB},     {64 * KiB + 1, 128 * KiB},
      {100 * KiB, 128 * KiB},  {1536 * KiB, 2 * MiB},    {3200 * KiB, 4 * MiB},
      {8 * MiB, 8 * MiB},      {8 * MiB + 1, 16 * MiB},
  };
  void *ps[sizeof cases / sizeof cases[0]];
  size_t in_use = 0, requested = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ps[i] = alloc_ok(b, cases[i].size);
    assert_int_equal(usable_of(b, ps[i]), cases[i].block);
    in_use += cases[i].block;
    requested += cases[i].size;
    es_buddy_stats s = stats_of(b);
    assert_int_equal(s.bytes_in_use, in_use);
    assert_int_equal(s.bytes_requested, requested);
    assert_int_equal(s.peak_in_use, in_use);
    assert_int_equal(s.free_bytes, 64 * MiB - in_use);
  }
  ES_CHECK_RC(es_buddy_check(b));
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    ES_CHECK_RC(es_buddy_free(b, ps[i]));
  es_buddy_stats s = stats_of(b);
  assert_int_equal(s.peak_in_use, in_use);
  assert_int_equal(s.frees, sizeof cases / sizeof cases[0]);
  assert_pristine(b);
  es_buddy_destroy(b);
}

/* ---- alignment ------------------------------------------------------------------ */

static void check_alignment(size_t align, size_t min_block) {
  es_buddy_config cfg;
  es_buddy_config_default(&cfg);
  cfg.align = align;
  cfg.min_block = min_block;
  es_buddy *b = pool_new(&cfg);
  static const size_t sizes[] = {1,         17,         100,        255,       256,
                                 257,       1000,       4097,       10000,     65535,
                                 64 * KiB,  100 * KiB,  200 * KiB,  256 * KiB, 256 * KiB + 1,
                                 1536 * KiB, 3 * MiB,   5 * MiB + 7};
  void *ps[3 * (sizeof sizes / sizeof sizes[0])];
  size_t n = 0;
  for (int round = 0; round < 3; round++) {
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
      void *p = alloc_ok(b, sizes[i]);
      assert_aligned(p, align);
      size_t u = usable_of(b, p);
      assert_true(u >= sizes[i]);
      assert_int_equal(u % align, 0);
      memset(p, (int)n, sizes[i]);
      ps[n++] = p;
    }
  }
  ES_CHECK_RC(es_buddy_check(b));
  for (size_t i = 0; i < n; i++)
    ES_CHECK_RC(es_buddy_free(b, ps[i]));
  assert_pristine(b);
  es_buddy_destroy(b);
}

static void test_alignment_default(void **state) {
  (void)state;
  check_alignment(256, 64 * KiB);
}

static void test_alignment_4096(void **state) {
  (void)state;
  check_alignment(4096, 64 * KiB);
}

static void test_alignment_above_page(void **state) {
  (void)state;
  /* Larger than mmap's page alignment: the region base is rounded up. */
  check_alignment(64 * KiB, 64 * KiB);
  check_alignment(16, 4096);
}

/* ---- slabs ---------------------------------------------------------------------- */

static void test_slab_classes(void **state) {
  (void)state;
  es_buddy *b = pool_default();
  static const struct {
    size_t size, slot;
  } cases[] = {
      /* the smallest slot is the alignment */
      {1, 256},
      {256, 256},
      {257, 512},
      {1000, 1024},
      {1025, 1280}, /* four classes per power of two: 1280 1536 1792 2048 */
      {1537, 1792},
      {5000, 5120},
      {200 * KiB, 224 * KiB},
      {224 * KiB + 1, 256 * KiB}, /* a buddy block size: served by the buddy directly */
      {100 * KiB, 112 * KiB},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    void *p = alloc_ok(b, cases[i].size);
    if (usable_of(b, p) != cases[i].slot)
      fail_msg("size %zu: usable %zu, want %zu", cases[i].size, usable_of(b, p), cases[i].slot);
    ES_CHECK_RC(es_buddy_free(b, p));
  }
  assert_pristine(b);
  es_buddy_destroy(b);
}

static void test_slab_lifecycle(void **state) {
  (void)state;
  es_buddy *b = pool_default();
  void *p = alloc_ok(b, 100);
  es_buddy_stats s = stats_of(b);
  assert_int_equal(s.slabs, 1);
  assert_int_equal(s.bytes_in_use, 256);
  assert_int_equal(s.bytes_requested, 100);
  assert_int_equal(s.live_blocks, 1);
  /* The slab is one 64 KiB block: it left the free bytes. */
  assert_int_equal(s.free_bytes, 64 * MiB - 64 * KiB);

  /* Same class: same slab, no new block. */
  void *q = alloc_ok(b, 200);
  assert_int_equal(stats_of(b).slabs, 1);
  assert_true((uintptr_t)q - (uintptr_t)p < 64 * KiB || (uintptr_t)p - (uintptr_t)q < 64 * KiB);
  /* Another class: another slab. */
  void *r = alloc_ok(b, 3000);
  assert_int_equal(stats_of(b).slabs, 2);
  ES_CHECK_RC(es_buddy_check(b));

  ES_CHECK_RC(es_buddy_free(b, p));
  assert_int_equal(stats_of(b).slabs, 2);
  ES_CHECK_RC(es_buddy_free(b, q));
  assert_int_equal(stats_of(b).slabs, 1); /* emptied: back to the buddy at once */
  ES_CHECK_RC(es_buddy_free(b, r));
  s = stats_of(b);
  assert_int_equal(s.slabs, 0);
  assert_int_equal(s.largest_free, 64 * MiB);
  assert_pristine(b);
  es_buddy_destroy(b);
}

static void test_slab_fill_many(void **state) {
  (void)state;
  es_buddy *b = pool_default();
  /* 256-byte slots: 256 per 64 KiB slab, so 1000 allocations need 4 slabs. */
  enum { N = 1000 };
  static void *ps[N];
  for (size_t i = 0; i < N; i++) {
    ps[i] = alloc_ok(b, 1 + i % 256);
    assert_aligned(ps[i], 256);
    memset(ps[i], (int)(i & 0xff), 1 + i % 256);
  }
  es_buddy_stats s = stats_of(b);
  assert_int_equal(s.slabs, 4);
  assert_int_equal(s.bytes_in_use, N * 256);
  ES_CHECK_RC(es_buddy_check(b));
  /* No two slots overlap: every byte pattern survived. */
  for (size_t i = 0; i < N; i++) {
    const unsigned char *c = ps[i];
    assert_int_equal(c[0], i & 0xff);
    assert_int_equal(c[i % 256], i & 0xff);
  }
  /* Free in a scrambled order. */
  for (size_t i = 0; i < N; i++)
    ES_CHECK_RC(es_buddy_free(b, ps[(i * 7919) % N]));
  assert_pristine(b);
  assert_int_equal(stats_of(b).largest_free, 64 * MiB);
  es_buddy_destroy(b);
}

static void test_slab_large_class(void **state) {
  (void)state;
  es_buddy *b = pool_default();
  /* 224 KiB slots: the smallest block holding 8 is 2 MiB, so 9 fit. */
  void *ps[10];
  for (int i = 0; i < 10; i++) {
    ps[i] = alloc_ok(b, 200 * KiB);
    assert_aligned(ps[i], 256);
  }
  es_buddy_stats s = stats_of(b);
  assert_int_equal(s.slabs, 2);
  assert_int_equal(s.bytes_in_use, 10 * 224 * KiB);
  assert_int_equal(s.free_bytes, 64 * MiB - 4 * MiB);
  ES_CHECK_RC(es_buddy_check(b));
  for (int i = 0; i < 10; i++)
    ES_CHECK_RC(es_buddy_free(b, ps[i]));
  assert_pristine(b);
  es_buddy_destroy(b);
}

static void test_slabs_small_pool(void **state) {
  (void)state;
  /* In a 1 MiB pool a slab block is at most 128 KiB (an eighth of the top
   * block), so 200 KiB no longer fits four slots: it takes a buddy block. */
  es_buddy_config cfg;
  es_buddy_config_default(&cfg);
  cfg.capacity = 1 * MiB;
  es_buddy *b = pool_new(&cfg);
  void *p = alloc_ok(b, 200 * KiB);
  assert_int_equal(usable_of(b, p), 256 * KiB);
  assert_int_equal(stats_of(b).slabs, 0);
  void *q = alloc_ok(b, 20 * KiB); /* 20 KiB slots, 6 per 128 KiB slab */
  assert_int_equal(usable_of(b, q), 20 * KiB);
  assert_int_equal(stats_of(b).slabs, 1);
  ES_CHECK_RC(es_buddy_check(b));
  ES_CHECK_RC(es_buddy_free(b, p));
  ES_CHECK_RC(es_buddy_free(b, q));
  assert_pristine(b);
  es_buddy_destroy(b);
}

static void test_slabs_disabled(void **state) {
  (void)state;
  es_buddy *b = pool_no_slabs();
  void *p = alloc_ok(b, 10);
  assert_int_equal(usable_of(b, p), 64 * KiB);
  assert_int_equal(stats_of(b).slabs, 0);
  ES_CHECK_RC(es_buddy_free(b, p));
  assert_pristine(b);
  es_buddy_destroy(b);
}

/* ---- invalid frees ---------------------------------------------------------------- */

/* A refused free: the right code, one more invalid free, nothing else moved. */
static void expect_refused(es_buddy *b, void *p, int want) {
  es_buddy_stats before = stats_of(b);
  ES_EXPECT_RC(es_buddy_free(b, p), want);
  assert_true(strlen(es_last_error_detail()) > 0);
  es_buddy_stats after = stats_of(b);
  assert_int_equal(after.invalid_frees, before.invalid_frees + 1);
  assert_int_equal(after.frees, before.frees);
  assert_int_equal(after.live_blocks, before.live_blocks);
  assert_int_equal(after.bytes_in_use, before.bytes_in_use);
  assert_int_equal(after.free_bytes, before.free_bytes);
  assert_int_equal(after.slabs, before.slabs);
  ES_CHECK_RC(es_buddy_check(b));
}

static void test_free_foreign(void **state) {
  (void)state;
  es_buddy *b = pool_default();
  es_buddy *other = pool_default();
  int on_stack = 0;
  expect_refused(b, &on_stack, ES_EFOREIGN);
  assert_non_null(strstr(es_last_error_detail(), "not in any region"));
  void *heap = malloc(64);
  assert_non_null(heap);
  expect_refused(b, heap, ES_EFOREIGN);
  free(heap);
  void *theirs = alloc_ok(other, 1 * MiB);
  expect_refused(b, theirs, ES_EFOREIGN);
  ES_CHECK_RC(es_buddy_free(other, theirs));

  void *all = alloc_ok(b, 64 * MiB);
  expect_refused(b, (char *)all + 64 * MiB, ES_EFOREIGN); /* one past the region */
  expect_refused(b, (char *)all - 256, ES_EFOREIGN);
  size_t n;
  ES_EXPECT_RC(es_buddy_usable_size(b, (char *)all + 64 * MiB, &n), ES_EFOREIGN);
  ES_CHECK_RC(es_buddy_free(b, all));
  assert_int_equal(stats_of(b).invalid_frees, 5);
  assert_pristine(b);
  es_buddy_destroy(other);
  es_buddy_destroy(b);
}

static void test_free_interior(void **state) {
  (void)state;
  es_buddy *b = pool_default();
  char *blk = alloc_ok(b, 2 * MiB);
  expect_refused(b, blk + 1, ES_EBADPTR);
  expect_refused(b, blk + 256, ES_EBADPTR);
  expect_refused(b, blk + 64 * KiB, ES_EBADPTR); /* a unit boundary inside it */
  expect_refused(b, blk + 2 * MiB - 1, ES_EBADPTR);
  assert_non_null(strstr(es_last_error_detail(), "inside the live block"));

  char *slot = alloc_ok(b, 1000); /* 1024-byte slot */
  char *keep = alloc_ok(b, 1000);
  expect_refused(b, slot + 1, ES_EBADPTR);
  expect_refused(b, slot + 512, ES_EBADPTR);
  assert_non_null(strstr(es_last_error_detail(), "inside a slot"));
  /* 64 slots of 1 KiB fill the 64 KiB slab exactly: no tail. 5 KiB slots
   * leave one: 12 slots in 64 KiB, 4 KiB unused. */
  char *odd = alloc_ok(b, 5 * KiB); /* first slot of a new slab */
  expect_refused(b, odd + 60 * KiB + 256, ES_EBADPTR);
  assert_non_null(strstr(es_last_error_detail(), "tail"));

  size_t n;
  ES_EXPECT_RC(es_buddy_usable_size(b, blk + 1, &n), ES_EBADPTR);
  ES_EXPECT_RC(es_buddy_usable_size(b, slot + 1, &n), ES_EBADPTR);
  assert_int_equal(stats_of(b).invalid_frees, 7);

  ES_CHECK_RC(es_buddy_free(b, blk));
  ES_CHECK_RC(es_buddy_free(b, slot));
  ES_CHECK_RC(es_buddy_free(b, keep));
  ES_CHECK_RC(es_buddy_free(b, odd));
  /* Misaligned pointers into free memory were never handed out. */
  expect_refused(b, blk + 3, ES_EBADPTR);
  assert_pristine(b);
  es_buddy_destroy(b);
}

static void test_double_free(void **state) {
  (void)state;
  es_buddy *b = pool_default();
  void *keep = alloc_ok(b, 1 * MiB);
  void *blk = alloc_ok(b, 1 * MiB);
  ES_CHECK_RC(es_buddy_free(b, blk));
  expect_refused(b, blk, ES_EDOUBLEFREE);
  assert_non_null(strstr(es_last_error_detail(), "free block"));

  /* A slot freed twice while its slab lives on. */
  void *s1 = alloc_ok(b, 300);
  void *s2 = alloc_ok(b, 300);
  ES_CHECK_RC(es_buddy_free(b, s1));
  expect_refused(b, s1, ES_EDOUBLEFREE);
  assert_non_null(strstr(es_last_error_detail(), "already free"));
  size_t n;
  ES_EXPECT_RC(es_buddy_usable_size(b, s1, &n), ES_EDOUBLEFREE);
  /* A slot freed twice after its slab went back to the buddy. */
  ES_CHECK_RC(es_buddy_free(b, s2));
  assert_int_equal(stats_of(b).slabs, 0);
  expect_refused(b, s2, ES_EDOUBLEFREE);
  expect_refused(b, s1, ES_EDOUBLEFREE);

  ES_CHECK_RC(es_buddy_free(b, keep));
  expect_refused(b, keep, ES_EDOUBLEFREE);
  es_buddy_stats s = stats_of(b);
  assert_int_equal(s.invalid_frees, 5);
  assert_int_equal(s.frees, 4);
  assert_pristine(b);
  es_buddy_destroy(b);
}

/* ---- usable size ------------------------------------------------------------------- */

static void test_usable_size(void **state) {
  (void)state;
  es_buddy *b = pool_default();
  void *big = alloc_ok(b, 1536 * KiB);
  void *small = alloc_ok(b, 48);
  size_t n = 7;
  ES_CHECK_RC(es_buddy_usable_size(b, big, &n));
  assert_int_equal(n, 2 * MiB);
  ES_CHECK_RC(es_buddy_usable_size(b, small, &n));
  assert_int_equal(n, 256);
  memset(small, 0x5a, n); /* all of it is usable */
  int local;
  n = 7;
  ES_EXPECT_RC(es_buddy_usable_size(b, &local, &n), ES_EFOREIGN);
  assert_int_equal(n, 7);
  ES_EXPECT_RC(es_buddy_usable_size(b, big, NULL), ES_EINVAL);
  assert_int_equal(stats_of(b).invalid_frees, 0); /* not a free */
  ES_CHECK_RC(es_buddy_free(b, big));
  ES_CHECK_RC(es_buddy_free(b, small));
  assert_pristine(b);
  es_buddy_destroy(b);
}

/* ---- watermark ---------------------------------------------------------------------- */

typedef struct wm_probe {
  es_buddy *pool;
  int calls;
  size_t peak_seen;
  int crossed_seen;
  int stats_rc;
} wm_probe;

static void on_watermark(void *user, const es_buddy_stats *s) {
  wm_probe *w = user;
  w->calls++;
  w->peak_seen = s->peak_in_use;
  w->crossed_seen = s->watermark_crossed;
  /* The lock is released: calling back into the pool must not deadlock. */
  es_buddy_stats again;
  w->stats_rc = es_buddy_stats_get(w->pool, &again);
}

static void test_watermark(void **state) {
  (void)state;
  wm_probe w = {0};
  es_buddy_config cfg;
  es_buddy_config_default(&cfg);
  cfg.on_watermark = on_watermark;
  cfg.user = &w;
  es_buddy *b = pool_new(&cfg);
  w.pool = b;
  /* 85% of 64 MiB is 54.4 MiB. */
  void *a = alloc_ok(b, 32 * MiB);
  void *c = alloc_ok(b, 16 * MiB);
  void *d = alloc_ok(b, 4 * MiB); /* 52 MiB: 81% */
  assert_int_equal(w.calls, 0);
  assert_int_equal(stats_of(b).watermark_crossed, 0);
  void *e = alloc_ok(b, 4 * MiB); /* 56 MiB: 87.5% */
  assert_int_equal(w.calls, 1);
  assert_int_equal(w.peak_seen, 56 * MiB);
  assert_int_equal(w.crossed_seen, 1);
  assert_int_equal(w.stats_rc, 0);
  assert_int_equal(stats_of(b).watermark_crossed, 1);

  /* Only the first crossing fires. */
  ES_CHECK_RC(es_buddy_free(b, e));
  ES_CHECK_RC(es_buddy_free(b, d));
  d = alloc_ok(b, 4 * MiB);
  e = alloc_ok(b, 8 * MiB);
  assert_int_equal(w.calls, 1);
  ES_CHECK_RC(es_buddy_free(b, a));
  ES_CHECK_RC(es_buddy_free(b, c));
  ES_CHECK_RC(es_buddy_free(b, d));
  ES_CHECK_RC(es_buddy_free(b, e));
  assert_int_equal(stats_of(b).peak_in_use, 60 * MiB);
  assert_pristine(b);
  es_buddy_destroy(b);
}

static void test_watermark_exact_ratio(void **state) {
  (void)state;
  wm_probe w = {0};
  es_buddy_config cfg;
  es_buddy_config_default(&cfg);
  cfg.watermark_ratio = 0.5;
  cfg.on_watermark = on_watermark;
  cfg.user = &w;
  cfg.slab_max = 0;
  es_buddy *b = pool_new(&cfg);
  w.pool = b;
  static void *ps[512];
  for (int i = 0; i < 511; i++)
    ps[i] = alloc_ok(b, 64 * KiB);
  assert_int_equal(w.calls, 0);
  ps[511] = alloc_ok(b, 64 * KiB); /* exactly half: the peak reaches the mark */
  assert_int_equal(w.calls, 1);
  assert_int_equal(w.peak_seen, 32 * MiB);
  for (int i = 0; i < 512; i++)
    ES_CHECK_RC(es_buddy_free(b, ps[i]));
  assert_pristine(b);
  es_buddy_destroy(b);
}

/* ---- growth --------------------------------------------------------------------------- */

static void test_growth(void **state) {
  (void)state;
  es_buddy_config cfg;
  es_buddy_config_default(&cfg);
  cfg.grow = 1;
  es_buddy *b = pool_new(&cfg);
  void *all = alloc_ok(b, 64 * MiB);

  /* A small request adds capacity / 4. */
  void *p = alloc_ok(b, 1 * MiB);
  es_buddy_stats s = stats_of(b);
  assert_int_equal(s.regions, 2);
  assert_int_equal(s.growths, 1);
  assert_int_equal(s.capacity, 80 * MiB);
  assert_int_equal(s.free_bytes, 15 * MiB);
  assert_int_equal(usable_of(b, p), 1 * MiB);
  ES_CHECK_RC(es_buddy_check(b));

  /* A request larger than capacity / 4 adds a region of its block size. */
  void *q = alloc_ok(b, 30 * MiB);
  s = stats_of(b);
  assert_int_equal(s.regions, 3);
  assert_int_equal(s.capacity, 112 * MiB);
  assert_aligned(q, 256);
  /* 16 MiB: the second region has 15 MiB left, largest 8: grow by 112 / 4. */
  void *big2 = alloc_ok(b, 16 * MiB);
  s = stats_of(b);
  assert_int_equal(s.regions, 4);
  assert_int_equal(s.capacity, 140 * MiB);
  assert_int_equal(s.growths, 3);
  void *t = alloc_ok(b, 100); /* a slab from the leftovers */
  assert_aligned(t, 256);
  ES_CHECK_RC(es_buddy_check(b));

  ES_CHECK_RC(es_buddy_free(b, all));
  ES_CHECK_RC(es_buddy_free(b, p));
  ES_CHECK_RC(es_buddy_free(b, q));
  ES_CHECK_RC(es_buddy_free(b, big2));
  ES_CHECK_RC(es_buddy_free(b, t));
  s = stats_of(b);
  /* Every region healed back to its top blocks: nothing left to merge. */
  assert_int_equal(s.largest_free, 64 * MiB);
  assert_true(s.fragmentation == 0.0);
  assert_int_equal(s.failures, 0);
  assert_int_equal(s.largest_free, 64 * MiB); /* regions never merge together */
  assert_pristine(b);
  es_buddy_destroy(b);
}

static void test_growth_request_beyond_capacity(void **state) {
  (void)state;
  es_buddy_config cfg;
  es_buddy_config_default(&cfg);
  cfg.grow = 1; /* grow_max defaults to 4 x 64 MiB */
  es_buddy *b = pool_new(&cfg);
  void *p = alloc_ok(b, 100 * MiB);
  es_buddy_stats s = stats_of(b);
  assert_int_equal(s.regions, 2);
  assert_int_equal(s.capacity, 64 * MiB + 128 * MiB);
  assert_int_equal(usable_of(b, p), 128 * MiB);
  /* 192 MiB + 128 MiB > 256 MiB: capped. */
  void *q = NULL;
  ES_EXPECT_RC(es_buddy_alloc(b, 100 * MiB, &q), ES_ENOSPC);
  assert_non_null(strstr(es_last_error_detail(), "grow_max"));
  assert_int_equal(stats_of(b).failures, 1);
  ES_CHECK_RC(es_buddy_free(b, p));
  assert_pristine(b);
  es_buddy_destroy(b);
}

static void test_growth_capped(void **state) {
  (void)state;
  es_buddy_config cfg;
  es_buddy_config_default(&cfg);
  cfg.grow = 1;
  cfg.grow_max = 72 * MiB;
  es_buddy *b = pool_new(&cfg);
  void *all = alloc_ok(b, 64 * MiB);
  void *p = NULL;
  /* Room for 8 MiB more only. */
  ES_EXPECT_RC(es_buddy_alloc(b, 16 * MiB, &p), ES_ENOSPC);
  assert_int_equal(stats_of(b).regions, 1);
  p = alloc_ok(b, 8 * MiB); /* wants max(8, 16) MiB, capped to 8 MiB: enough */
  es_buddy_stats s = stats_of(b);
  assert_int_equal(s.regions, 2);
  assert_int_equal(s.capacity, 72 * MiB);
  void *q = NULL;
  ES_EXPECT_RC(es_buddy_alloc(b, 1, &q), ES_ENOSPC);
  ES_EXPECT_RC(es_buddy_alloc(b, 64 * KiB, &q), ES_ENOSPC);
  s = stats_of(b);
  assert_int_equal(s.failures, 3);
  assert_int_equal(s.growths, 1);
  ES_CHECK_RC(es_buddy_free(b, all));
  ES_CHECK_RC(es_buddy_free(b, p));
  assert_pristine(b);
  es_buddy_destroy(b);
}

static void test_growth_off(void **state) {
  (void)state;
  es_buddy_config cfg;
  es_buddy_config_default(&cfg);
  cfg.grow_max = 1; /* ignored without grow */
  es_buddy *b = pool_new(&cfg);
  void *all = alloc_ok(b, 64 * MiB);
  void *q = NULL;
  ES_EXPECT_RC(es_buddy_alloc(b, 64 * KiB, &q), ES_ENOSPC);
  assert_int_equal(stats_of(b).regions, 1);
  ES_CHECK_RC(es_buddy_free(b, all));
  es_buddy_destroy(b);
}

/* ---- capacities that are not powers of two --------------------------------------------- */

static void test_non_pow2_capacity(void **state) {
  (void)state;
  es_buddy_config cfg;
  es_buddy_config_default(&cfg);
  cfg.capacity = 100 * MiB; /* top blocks of 64, 32 and 4 MiB */
  cfg.slab_max = 0;
  es_buddy *b = pool_new(&cfg);
  es_buddy_stats s = stats_of(b);
  assert_int_equal(s.capacity, 100 * MiB);
  assert_int_equal(s.free_bytes, 100 * MiB);
  assert_int_equal(s.largest_free, 64 * MiB);
  /* the 64 MiB top block is the most any free memory here can form */
  assert_true(s.fragmentation == 0.0);

  void *a = alloc_ok(b, 64 * MiB);
  void *c = alloc_ok(b, 32 * MiB);
  void *d = alloc_ok(b, 4 * MiB);
  assert_int_equal(stats_of(b).splits, 0);
  void *e = NULL;
  ES_EXPECT_RC(es_buddy_alloc(b, 1, &e), ES_ENOSPC);
  ES_CHECK_RC(es_buddy_free(b, c));
  ES_CHECK_RC(es_buddy_free(b, d));
  /* The 32 and 4 MiB chunks have no buddy: they must not merge. */
  s = stats_of(b);
  assert_int_equal(s.largest_free, 32 * MiB);
  assert_int_equal(s.merges, 0);
  ES_CHECK_RC(es_buddy_check(b));

  /* Many small blocks across the chunks, then all free. */
  void *ps[36 * 4];
  for (size_t i = 0; i < 36 * 4; i++)
    ps[i] = alloc_ok(b, 256 * KiB);
  ES_EXPECT_RC(es_buddy_alloc(b, 64 * KiB, &e), ES_ENOSPC);
  for (size_t i = 0; i < 36 * 4; i++)
    ES_CHECK_RC(es_buddy_free(b, ps[(i * 37) % (36 * 4)]));
  ES_CHECK_RC(es_buddy_free(b, a));
  s = stats_of(b);
  assert_int_equal(s.largest_free, 64 * MiB);
  assert_int_equal(s.free_bytes, 100 * MiB);
  assert_pristine(b);
  es_buddy_destroy(b);
}

static void test_non_pow2_capacity_growth(void **state) {
  (void)state;
  es_buddy_config cfg;
  es_buddy_config_default(&cfg);
  cfg.capacity = 100 * MiB;
  cfg.grow = 1;
  es_buddy *b = pool_new(&cfg);
  void *a = alloc_ok(b, 64 * MiB);
  void *c = alloc_ok(b, 32 * MiB);
  void *d = alloc_ok(b, 3 * MiB); /* 4 MiB block */
  /* Grows by 25 MiB (top blocks 16 + 8 + 1); the smallest fitting level is
   * split, so the 4 MiB comes out of the 8 MiB block. */
  void *e = alloc_ok(b, 3 * MiB);
  es_buddy_stats s = stats_of(b);
  assert_int_equal(s.regions, 2);
  assert_int_equal(s.capacity, 125 * MiB);
  assert_int_equal(s.largest_free, 16 * MiB);
  assert_int_equal(s.free_bytes, 21 * MiB);
  void *f = alloc_ok(b, 50 * MiB); /* block 64 MiB > 125/4: region of 64 MiB */
  s = stats_of(b);
  assert_int_equal(s.regions, 3);
  assert_int_equal(s.capacity, 189 * MiB);
  ES_CHECK_RC(es_buddy_check(b));
  void *ps[] = {a, c, d, e, f};
  for (size_t i = 0; i < 5; i++)
    ES_CHECK_RC(es_buddy_free(b, ps[i]));
  assert_pristine(b);
  es_buddy_destroy(b);
}

/* ---- fragmentation heals ----------------------------------------------------------------- */

static void test_fragmentation_heals(void **state) {
  (void)state;
  es_buddy *b = pool_no_slabs();
  /* Fill with 1 MiB blocks, free every other: lots free, nothing large. */
  void *ps[64];
  for (int i = 0; i < 64; i++)
    ps[i] = alloc_ok(b, 1 * MiB);
  for (int i = 0; i < 64; i += 2)
    ES_CHECK_RC(es_buddy_free(b, ps[i]));
  es_buddy_stats s = stats_of(b);
  assert_int_equal(s.free_bytes, 32 * MiB);
  assert_int_equal(s.largest_free, 1 * MiB);
  assert_true(fabs(s.fragmentation - (1.0 - 1.0 / 32.0)) < 1e-9);
  void *big = NULL;
  ES_EXPECT_RC(es_buddy_alloc(b, 2 * MiB, &big), ES_ENOSPC);
  assert_non_null(strstr(es_last_error_detail(), "free 33554432 B, largest free 1048576 B"));
  for (int i = 1; i < 64; i += 2)
    ES_CHECK_RC(es_buddy_free(b, ps[i]));
  s = stats_of(b);
  assert_true(s.fragmentation == 0.0);
  assert_int_equal(s.largest_free, 64 * MiB);
  big = alloc_ok(b, 64 * MiB);
  ES_CHECK_RC(es_buddy_free(b, big));
  assert_pristine(b);
  es_buddy_destroy(b);
}

/* Pages of [p, p + n) the kernel holds (mincore). */
static size_t resident_pages(const void *p, size_t n) {
  size_t pg = (size_t)sysconf(_SC_PAGESIZE), np = (n + pg - 1) / pg, in = 0;
  unsigned char *v = malloc(np);
  assert_non_null(v);
  assert_int_equal(mincore((void *)p, n, v), 0);
  for (size_t i = 0; i < np; i++)
    in += v[i] & 1;
  free(v);
  return in;
}

/* Memory left free for min_age purge calls gives its pages back; memory
 * reused in between keeps them; memory never handed out is not counted; the age
 * is per unit, so a block freed now that merges with a long-free neighbour
 * keeps its own pages. */
static void test_purge(void **state) {
  (void)state;
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  es_buddy *b = pool_no_slabs();
  size_t purged = 1;
  ES_CHECK_RC(es_buddy_purge(b, 0, &purged)); /* nothing written yet */
  assert_int_equal(purged, 0);
  /* hot at 0, a live separator at 4 MiB (so hot cannot merge), cold at 8. */
  unsigned char *hot = alloc_ok(b, 4 * MiB);
  void *sep = alloc_ok(b, 4 * MiB);
  unsigned char *cold = alloc_ok(b, 4 * MiB);
  assert_ptr_equal(cold, hot + 8 * MiB);
  memset(hot, 1, 4 * MiB);
  memset(cold, 2, 4 * MiB);
  ES_CHECK_RC(es_buddy_free(b, cold));
  ES_CHECK_RC(es_buddy_free(b, hot));
  assert_int_equal(resident_pages(cold, 4 * MiB), 4 * MiB / pg);
  ES_CHECK_RC(es_buddy_purge(b, 1, &purged)); /* both freed since the last call */
  assert_int_equal(purged, 0);
  /* The hot block is taken again and written before the next purge. */
  unsigned char *again = alloc_ok(b, 4 * MiB);
  assert_ptr_equal(again, hot);
  memset(again, 3, 4 * MiB);
  ES_CHECK_RC(es_buddy_purge(b, 1, &purged));
  assert_int_equal(purged, 4 * MiB); /* cold only: its merged buddy was never written */
  assert_int_equal(resident_pages(cold, 4 * MiB), 0);
  assert_int_equal(resident_pages(again, 4 * MiB), 4 * MiB / pg);
  for (size_t i = 0; i < 4 * MiB; i += pg)
    assert_int_equal(again[i], 3);
  ES_CHECK_RC(es_buddy_check(b));
  es_buddy_stats s = stats_of(b);
  assert_int_equal(s.purges, 3);
  assert_int_equal(s.purged_bytes, 4 * MiB);
  /* A purged block is still a block: it comes back zeroed and whole. */
  unsigned char *back = alloc_ok(b, 8 * MiB);
  assert_ptr_equal(back, cold);
  for (size_t i = 0; i < 8 * MiB; i += pg)
    assert_int_equal(back[i], 0);
  memset(back, 4, 8 * MiB);
  ES_CHECK_RC(es_buddy_free(b, back));
  /* Free the hot block now: it merges with the 8 MiB freed a call earlier
   * (and the rest); with min_age 1 only the older blocks go. */
  ES_CHECK_RC(es_buddy_free(b, sep));
  ES_CHECK_RC(es_buddy_purge(b, 1, &purged)); /* back and sep freed since the last call */
  assert_int_equal(purged, 0);
  ES_CHECK_RC(es_buddy_free(b, again));
  ES_CHECK_RC(es_buddy_purge(b, 1, &purged));
  /* back and sep (a freed block counts as written: the pool cannot know);
   * again is too young. */
  assert_int_equal(purged, 12 * MiB);
  assert_int_equal(resident_pages(again, 4 * MiB), 4 * MiB / pg);
  ES_CHECK_RC(es_buddy_purge(b, 0, &purged)); /* min_age 0: everything written */
  assert_int_equal(purged, 4 * MiB);
  assert_int_equal(resident_pages(hot, 64 * MiB), 0);
  assert_pristine(b);
  ES_EXPECT_RC(es_buddy_purge(NULL, 0, NULL), ES_EINVAL);
  es_buddy_destroy(b);
}

static void test_destroy_with_live_blocks(void **state) {
  (void)state;
  es_mem_stats m0, m1;
  ES_CHECK_RC(es_mem_stats_get(ES_MEM_BUDDY, &m0));
  es_buddy *b = pool_default();
  for (int i = 0; i < 100; i++)
    alloc_ok(b, (size_t)(i + 1) * 999);
  alloc_ok(b, 5 * MiB);
  void *p = alloc_ok(b, 100); /* a slab that empties: its descriptor is kept */
  ES_CHECK_RC(es_buddy_free(b, alloc_ok(b, 1 * KiB)));
  ES_CHECK_RC(es_buddy_free(b, p));
  es_buddy_destroy(b);
  ES_CHECK_RC(es_mem_stats_get(ES_MEM_BUDDY, &m1));
  assert_int_equal(m1.current, m0.current);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_config_default),
      cmocka_unit_test(test_create_invalid),
      cmocka_unit_test(test_create_destroy),
      cmocka_unit_test(test_capacity_rounded_down),
      cmocka_unit_test(test_null_arguments),
      cmocka_unit_test(test_alloc_size_zero),
      cmocka_unit_test(test_alloc_huge),
      cmocka_unit_test(test_exhaust_exactly_at_capacity),
      cmocka_unit_test(test_split_merge_counts),
      cmocka_unit_test(test_block_rounding),
      cmocka_unit_test(test_alignment_default),
      cmocka_unit_test(test_alignment_4096),
      cmocka_unit_test(test_alignment_above_page),
      cmocka_unit_test(test_slab_classes),
      cmocka_unit_test(test_slab_lifecycle),
      cmocka_unit_test(test_slab_fill_many),
      cmocka_unit_test(test_slab_large_class),
      cmocka_unit_test(test_slabs_small_pool),
      cmocka_unit_test(test_slabs_disabled),
      cmocka_unit_test(test_free_foreign),
      cmocka_unit_test(test_free_interior),
      cmocka_unit_test(test_double_free),
      cmocka_unit_test(test_usable_size),
      cmocka_unit_test(test_watermark),
      cmocka_unit_test(test_watermark_exact_ratio),
      cmocka_unit_test(test_growth),
      cmocka_unit_test(test_growth_request_beyond_capacity),
      cmocka_unit_test(test_growth_capped),
      cmocka_unit_test(test_growth_off),
      cmocka_unit_test(test_non_pow2_capacity),
      cmocka_unit_test(test_non_pow2_capacity_growth),
      cmocka_unit_test(test_fragmentation_heals),
      cmocka_unit_test(test_purge),
      cmocka_unit_test(test_destroy_with_live_blocks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
