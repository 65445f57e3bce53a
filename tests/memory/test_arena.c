/* Request arena: every function, its edge cases and its misuse detection.
 *
 * Debug-only behaviour (guard, 0xDD fill) is tested under #ifndef NDEBUG; the
 * fill is not checked under ASan, which makes those bytes unaddressable, and
 * ASan builds check the poisoning itself instead. */
#include "es_test.h"

#include <string.h>

#ifdef ES_ASAN
#include <sanitizer/asan_interface.h>
#endif

#ifdef NDEBUG
#define GUARD ((size_t)0)
#else
#define GUARD ((size_t)ES_ARENA_GUARD)
#endif

#define BLOCK_SIZE (64 * 1024)

static _Alignas(4096) unsigned char block_[BLOCK_SIZE];

static int is_aligned(const void *p, size_t align) { return ((uintptr_t)p & (align - 1)) == 0; }

static int detail_has(const char *needle) {
  return strstr(es_last_error_detail(), needle) != NULL;
}

/* ---- init / fini / create / destroy ----------------------------------------- */

static void test_init_args(void **state) {
  (void)state;
  es_arena a;
  ES_EXPECT_RC(es_arena_init(NULL, block_, BLOCK_SIZE, 0), ES_EINVAL);
  ES_EXPECT_RC(es_arena_init(&a, NULL, BLOCK_SIZE, 0), ES_EINVAL);
  ES_EXPECT_RC(es_arena_init(&a, block_, 0, 0), ES_EINVAL);
  const size_t bad_align[] = {3, 6, 48, 100, 8192, 1u << 20, SIZE_MAX};
  for (size_t i = 0; i < sizeof bad_align / sizeof bad_align[0]; i++)
    ES_EXPECT_RC(es_arena_init(&a, block_, BLOCK_SIZE, bad_align[i]), ES_EINVAL);
  /* Nothing left after aligning block + 1 up to 64. */
  ES_EXPECT_RC(es_arena_init(&a, block_ + 1, 63, 64), ES_EINVAL);
  /* Exactly a guard's worth: nothing usable in debug, all usable in release. */
#ifndef NDEBUG
  ES_EXPECT_RC(es_arena_init(&a, block_, ES_ARENA_GUARD, 64), ES_EINVAL);
  ES_CHECK_RC(es_arena_init(&a, block_, ES_ARENA_GUARD + 1, 64));
  assert_int_equal(es_arena_capacity(&a), 1);
#else
  ES_CHECK_RC(es_arena_init(&a, block_, ES_ARENA_GUARD, 64));
  assert_int_equal(es_arena_capacity(&a), ES_ARENA_GUARD);
#endif
  ES_CHECK_RC(es_arena_fini(&a));
}

static void test_init_capacity(void **state) {
  (void)state;
  es_arena a;
  ES_CHECK_RC(es_arena_init(&a, block_, BLOCK_SIZE, 0));
  assert_int_equal(es_arena_capacity(&a), BLOCK_SIZE - GUARD);
  assert_int_equal(es_arena_used(&a), 0);
  assert_int_equal(es_arena_peak(&a), 0);
  assert_int_equal(es_arena_available(&a), BLOCK_SIZE - GUARD);
  assert_true(es_arena_is_valid(&a));
  ES_CHECK_RC(es_arena_fini(&a));

  /* A misaligned block loses the slack up to the next aligned address. */
  ES_CHECK_RC(es_arena_init(&a, block_ + 3, BLOCK_SIZE - 3, 256));
  assert_int_equal(es_arena_capacity(&a), BLOCK_SIZE - 256 - GUARD);
  ES_CHECK_RC(es_arena_fini(&a));
}

static void test_create_args(void **state) {
  (void)state;
  es_arena *sentinel = (es_arena *)(uintptr_t)0x1234;
  es_arena *a = sentinel;
  ES_EXPECT_RC(es_arena_create(0, 0, &a), ES_EINVAL);
  ES_EXPECT_RC(es_arena_create(4096, 0, NULL), ES_EINVAL);
  ES_EXPECT_RC(es_arena_create(4096, 3, &a), ES_EINVAL);
  ES_EXPECT_RC(es_arena_create(4096, 8192, &a), ES_EINVAL);
  ES_EXPECT_RC(es_arena_create(SIZE_MAX, 0, &a), ES_EOVERFLOW);
  ES_EXPECT_RC(es_arena_create(SIZE_MAX - 10, 0, &a), ES_EOVERFLOW);
  assert_ptr_equal(a, sentinel);
  es_arena_destroy(NULL);
}

static void test_create_capacity_and_counting(void **state) {
  (void)state;
  es_mem_stats before, during, after;
  ES_CHECK_RC(es_mem_stats_get(ES_MEM_ARENA, &before));
  const size_t caps[] = {1, 100, 4096, 4097, 1 << 20};
  for (size_t i = 0; i < sizeof caps / sizeof caps[0]; i++) {
    es_arena *a = NULL;
    ES_CHECK_RC(es_arena_create(caps[i], 0, &a));
    /* Exactly what was asked, in every build: the guard is extra. */
    assert_int_equal(es_arena_capacity(a), caps[i]);
    assert_true(es_arena_is_valid(a));
    ES_CHECK_RC(es_mem_stats_get(ES_MEM_ARENA, &during));
    assert_true(during.current >= before.current + caps[i] + GUARD);
    void *p;
    ES_CHECK_RC(es_arena_alloc(a, caps[i], &p));
    memset(p, 0x5a, caps[i]);
    es_arena_destroy(a);
  }
  ES_CHECK_RC(es_mem_stats_get(ES_MEM_ARENA, &after));
  assert_int_equal(after.current, before.current);
}

static void test_fini_and_destroy_refuse_the_wrong_kind(void **state) {
  (void)state;
  es_arena *c;
  ES_CHECK_RC(es_arena_create(4096, 0, &c));
  ES_EXPECT_RC(es_arena_fini(c), ES_EINVAL);
  assert_true(es_arena_is_valid(c));
  es_arena_destroy(c);

  es_arena a;
  ES_CHECK_RC(es_arena_init(&a, block_, BLOCK_SIZE, 0));
  es_arena_destroy(&a); /* not ours to free: refused, arena untouched */
  assert_true(detail_has("not from es_arena_create"));
  assert_true(es_arena_is_valid(&a));
  ES_CHECK_RC(es_arena_fini(&a));
}

/* ---- alloc ----------------------------------------------------------------------- */

static void test_alloc_alignments(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  const size_t aligns[] = {0, 1, 2, 8, 16, 64, 128, 256, 4096};
  for (size_t k = 0; k < sizeof aligns / sizeof aligns[0]; k++) {
    size_t align = aligns[k] ? aligns[k] : ES_ARENA_DEFAULT_ALIGN;
    for (int misalign = 0; misalign < 2; misalign++) {
      es_arena a;
      unsigned char *blk = block_ + (misalign ? 3 : 0);
      ES_CHECK_RC(es_arena_init(&a, blk, BLOCK_SIZE - 3, aligns[k]));
      unsigned char *lo = NULL, *prev_end = NULL;
      for (;;) {
        size_t size = (size_t)(es_test_rand(&seed) % 700);
        void *p;
        int rc = es_arena_alloc(&a, size, &p);
        if (rc == ES_ENOSPC)
          break;
        ES_CHECK_RC(rc);
        if (!is_aligned(p, align))
          fail_msg("align %zu (block+%d): %p not aligned", align, misalign ? 3 : 0, p);
        unsigned char *q = p;
        if (lo == NULL)
          lo = q;
        assert_true(q >= blk);
        /* In order, no overlap, and the padding is less than align. */
        if (prev_end) {
          assert_true(q >= prev_end);
          assert_true((size_t)(q - prev_end) < align);
        }
        assert_true(q + size <= lo + es_arena_capacity(&a));
        if (size == 0) /* consumes nothing, not even the padding */
          continue;
        assert_int_equal(es_arena_used(&a), (size_t)(q + size - lo));
        memset(q, 0xab, size);
        prev_end = q + size;
      }
      assert_true(es_arena_is_valid(&a));
      ES_CHECK_RC(es_arena_fini(&a));
    }
  }
}

static void test_alloc_size_zero(void **state) {
  (void)state;
  es_arena *a;
  ES_CHECK_RC(es_arena_create(4096, 0, &a));
  void *p0, *p1, *p2, *p3;
  ES_CHECK_RC(es_arena_alloc(a, 0, &p0));
  ES_CHECK_RC(es_arena_alloc(a, 0, &p1));
  assert_ptr_equal(p0, p1);
  assert_true(is_aligned(p0, 64));
  assert_int_equal(es_arena_used(a), 0);
  ES_CHECK_RC(es_arena_alloc(a, 1, &p2));
  assert_ptr_equal(p2, p0);
  ES_CHECK_RC(es_arena_alloc(a, 0, &p3));
  assert_ptr_equal(p3, (char *)p0 + 64);
  assert_int_equal(es_arena_used(a), 1); /* size 0 consumed nothing */
  es_arena_destroy(a);
}

static void test_alloc_overflow(void **state) {
  (void)state;
  es_arena *a;
  ES_CHECK_RC(es_arena_create(4096, 0, &a));
  void *sentinel = (void *)(uintptr_t)0xdead;
  void *p = sentinel;
  ES_EXPECT_RC(es_arena_alloc(a, SIZE_MAX, &p), ES_EOVERFLOW);
  ES_EXPECT_RC(es_arena_alloc(a, SIZE_MAX - 1, &p), ES_EOVERFLOW);
  /* The last size whose round-up to 64 overflows, and the first that does not. */
  ES_EXPECT_RC(es_arena_alloc(a, SIZE_MAX - 62, &p), ES_EOVERFLOW);
  assert_true(detail_has("overflow"));
  ES_EXPECT_RC(es_arena_alloc(a, SIZE_MAX - 63, &p), ES_ENOSPC);
  /* Also with a position that needs padding first. */
  void *q;
  ES_CHECK_RC(es_arena_alloc(a, 1, &q));
  ES_EXPECT_RC(es_arena_alloc(a, SIZE_MAX - 62, &p), ES_EOVERFLOW);
  ES_EXPECT_RC(es_arena_alloc(a, SIZE_MAX - 63, &p), ES_ENOSPC);
  assert_ptr_equal(p, sentinel);
  assert_int_equal(es_arena_used(a), 1);
  es_arena_destroy(a);

  /* Alignment 1 never rounds, so nothing overflows: it just does not fit. */
  ES_CHECK_RC(es_arena_create(4096, 1, &a));
  ES_EXPECT_RC(es_arena_alloc(a, SIZE_MAX, &p), ES_ENOSPC);
  assert_ptr_equal(p, sentinel);
  es_arena_destroy(a);
}

static void test_alloc_exhaustion(void **state) {
  (void)state;
  es_arena *a;
  ES_CHECK_RC(es_arena_create(4096, 0, &a));
  void *sentinel = (void *)(uintptr_t)0xdead;
  void *p = sentinel, *q;
  ES_CHECK_RC(es_arena_alloc(a, 4096, &q));
  assert_int_equal(es_arena_available(a), 0);
  ES_EXPECT_RC(es_arena_alloc(a, 1, &p), ES_ENOSPC);
  assert_ptr_equal(p, sentinel);
  assert_string_equal(es_last_error_detail(),
                      "arena exhausted: requested 1 B (1 after alignment), available 0 B, "
                      "missing 1 B");
  ES_CHECK_RC(es_arena_reset(a));

  /* 100 used: the next start is 128, so 4000 B need 4028 of the 3996 left. */
  ES_CHECK_RC(es_arena_alloc(a, 100, &q));
  ES_EXPECT_RC(es_arena_alloc(a, 4000, &p), ES_ENOSPC);
  assert_string_equal(es_last_error_detail(),
                      "arena exhausted: requested 4000 B (4028 after alignment), available "
                      "3996 B, missing 32 B");
  assert_ptr_equal(p, sentinel);
  assert_int_equal(es_arena_used(a), 100);
  ES_CHECK_RC(es_arena_alloc(a, 4096 - 128, &p));
  assert_ptr_equal(p, (char *)q + 128);
  assert_int_equal(es_arena_available(a), 0);
  es_arena_destroy(a);

  /* A capacity that is not a multiple of the alignment is still all usable. */
  ES_CHECK_RC(es_arena_create(100, 64, &a));
  ES_CHECK_RC(es_arena_alloc(a, 100, &q));
  p = sentinel;
  ES_EXPECT_RC(es_arena_alloc(a, 1, &p), ES_ENOSPC);
  ES_EXPECT_RC(es_arena_alloc(a, 0, &p), ES_ENOSPC); /* the next aligned start is past the end */
  assert_ptr_equal(p, sentinel);
  es_arena_destroy(a);
}

static void test_alloc_null_args(void **state) {
  (void)state;
  void *p;
  ES_EXPECT_RC(es_arena_alloc(NULL, 8, &p), ES_EINVAL);
  es_arena *a;
  ES_CHECK_RC(es_arena_create(4096, 0, &a));
  ES_EXPECT_RC(es_arena_alloc(a, 8, NULL), ES_EINVAL);
  assert_int_equal(es_arena_used(a), 0);
  es_arena_destroy(a);
}

/* ---- usage and peak ------------------------------------------------------------------ */

static void test_peak(void **state) {
  (void)state;
  es_arena *a;
  ES_CHECK_RC(es_arena_create(1 << 16, 0, &a));
  void *p;
  ES_CHECK_RC(es_arena_alloc(a, 1000, &p));
  ES_CHECK_RC(es_arena_alloc(a, 1000, &p));
  assert_int_equal(es_arena_used(a), 2024);
  assert_int_equal(es_arena_peak(a), 2024);
  ES_CHECK_RC(es_arena_reset(a));
  assert_int_equal(es_arena_used(a), 0);
  assert_int_equal(es_arena_available(a), 1 << 16);
  assert_int_equal(es_arena_peak(a), 2024); /* survives reset */
  ES_CHECK_RC(es_arena_alloc(a, 500, &p));
  assert_int_equal(es_arena_peak(a), 2024);
  ES_CHECK_RC(es_arena_peak_reset(a));
  assert_int_equal(es_arena_peak(a), 500); /* what is still held */
  ES_CHECK_RC(es_arena_alloc(a, 3000, &p));
  assert_int_equal(es_arena_peak(a), 3512);
  ES_CHECK_RC(es_arena_reset(a));
  ES_CHECK_RC(es_arena_peak_reset(a));
  assert_int_equal(es_arena_peak(a), 0);
  es_arena_destroy(a);
}

/* ---- marks ------------------------------------------------------------------------- */

static void test_mark_rewind(void **state) {
  (void)state;
  es_arena *a, *b;
  ES_CHECK_RC(es_arena_create(1 << 16, 0, &a));
  ES_CHECK_RC(es_arena_create(1 << 16, 0, &b));
  void *keep, *t1, *t2, *t3, *again;
  es_arena_mark outer, inner, empty;
  ES_CHECK_RC(es_arena_mark_get(a, &empty));
  ES_CHECK_RC(es_arena_alloc(a, 100, &keep));
  ES_CHECK_RC(es_arena_mark_get(a, &outer));
  ES_CHECK_RC(es_arena_alloc(a, 200, &t1));
  ES_CHECK_RC(es_arena_mark_get(a, &inner));
  ES_CHECK_RC(es_arena_alloc(a, 300, &t2));
  ES_CHECK_RC(es_arena_alloc(a, 400, &t3));
  assert_int_equal(es_arena_peak(a), 1104);

  ES_CHECK_RC(es_arena_rewind(a, &inner));
  assert_int_equal(es_arena_used(a), 128 + 200);
  ES_CHECK_RC(es_arena_alloc(a, 300, &again));
  assert_ptr_equal(again, t2); /* the space is reused */
  ES_CHECK_RC(es_arena_rewind(a, &inner));
  ES_CHECK_RC(es_arena_rewind(a, &inner)); /* idempotent */

  /* Rewinding to the outer mark drops the inner one with it. */
  ES_CHECK_RC(es_arena_rewind(a, &outer));
  assert_int_equal(es_arena_used(a), 100);
  ES_EXPECT_RC(es_arena_rewind(a, &inner), ES_EREWIND);
  assert_true(detail_has("ahead"));
  assert_int_equal(es_arena_used(a), 100);
  assert_int_equal(es_arena_peak(a), 1104); /* rewind does not lower the peak */

  ES_CHECK_RC(es_arena_alloc(a, 5, &t1));
  ES_CHECK_RC(es_arena_rewind(a, &empty));
  assert_int_equal(es_arena_used(a), 0);

  /* Marks outstanding at a reset are all stale afterwards, even one at 0. */
  ES_CHECK_RC(es_arena_alloc(a, 100, &keep));
  ES_CHECK_RC(es_arena_mark_get(a, &outer));
  ES_CHECK_RC(es_arena_alloc(a, 100, &t1));
  ES_CHECK_RC(es_arena_mark_get(a, &inner));
  ES_CHECK_RC(es_arena_reset(a));
  ES_CHECK_RC(es_arena_alloc(a, 1000, &t1));
  ES_EXPECT_RC(es_arena_rewind(a, &inner), ES_EREWIND);
  assert_true(detail_has("stale"));
  ES_EXPECT_RC(es_arena_rewind(a, &outer), ES_EREWIND);
  ES_EXPECT_RC(es_arena_rewind(a, &empty), ES_EREWIND);
  assert_int_equal(es_arena_used(a), 1000);

  /* Another arena's mark is refused too. */
  es_arena_mark other;
  ES_CHECK_RC(es_arena_mark_get(b, &other));
  ES_EXPECT_RC(es_arena_rewind(a, &other), ES_EREWIND);

  ES_EXPECT_RC(es_arena_mark_get(a, NULL), ES_EINVAL);
  ES_EXPECT_RC(es_arena_rewind(a, NULL), ES_EINVAL);
  ES_EXPECT_RC(es_arena_mark_get(NULL, &other), ES_EINVAL);
  ES_EXPECT_RC(es_arena_rewind(NULL, &other), ES_EINVAL);
  es_arena_destroy(b);
  es_arena_destroy(a);
}

/* ---- dead, foreign and corrupted arenas ------------------------------------------------ */

/* Every entry point must refuse a and the accessors must read 0. */
static void expect_rejected(es_arena *a) {
  void *sentinel = (void *)(uintptr_t)0xdead;
  void *p = sentinel;
  es_arena_mark m = {0, 0};
  ES_EXPECT_RC(es_arena_alloc(a, 8, &p), ES_ECORRUPT);
  ES_EXPECT_RC(es_arena_alloc(a, 0, &p), ES_ECORRUPT);
  assert_ptr_equal(p, sentinel);
  ES_EXPECT_RC(es_arena_reset(a), ES_ECORRUPT);
  ES_EXPECT_RC(es_arena_mark_get(a, &m), ES_ECORRUPT);
  ES_EXPECT_RC(es_arena_rewind(a, &m), ES_ECORRUPT);
  ES_EXPECT_RC(es_arena_peak_reset(a), ES_ECORRUPT);
  ES_EXPECT_RC(es_arena_fini(a), ES_ECORRUPT);
  assert_int_equal(es_arena_used(a), 0);
  assert_int_equal(es_arena_peak(a), 0);
  assert_int_equal(es_arena_capacity(a), 0);
  assert_int_equal(es_arena_available(a), 0);
  assert_false(es_arena_is_valid(a));
}

static void test_use_after_fini(void **state) {
  (void)state;
  es_arena a;
  ES_CHECK_RC(es_arena_init(&a, block_, BLOCK_SIZE, 0));
  void *p;
  ES_CHECK_RC(es_arena_alloc(&a, 100, &p));
  ES_CHECK_RC(es_arena_fini(&a));
  expect_rejected(&a);
  assert_true(detail_has("finished or destroyed"));
  /* The block is the caller's again, all of it addressable. */
  memset(block_, 0, BLOCK_SIZE);
}

static void test_foreign_structs(void **state) {
  (void)state;
  es_arena zero;
  memset(&zero, 0, sizeof zero);
  expect_rejected(&zero);
  assert_true(detail_has("not a live arena"));

  es_arena garbage;
  memset(&garbage, 0xa5, sizeof garbage);
  expect_rejected(&garbage);

  /* A live arena whose magic got overwritten. */
  es_arena a;
  ES_CHECK_RC(es_arena_init(&a, block_, BLOCK_SIZE, 0));
  uint64_t magic = a.magic;
  a.magic ^= 1;
  expect_rejected(&a);
  a.magic = magic;
  assert_true(es_arena_is_valid(&a));
  ES_CHECK_RC(es_arena_fini(&a));
}

#if !defined(ES_ASAN) && !defined(ES_TSAN)
/* Reads the struct after it was freed, so only outside the sanitizers (both
 * report exactly that as heap-use-after-free); the magic was killed before
 * the free and nothing allocates in between. */
static void test_use_after_destroy(void **state) {
  (void)state;
  es_arena *a;
  ES_CHECK_RC(es_arena_create(4096, 0, &a));
  es_arena_destroy(a);
  void *p;
  ES_EXPECT_RC(es_arena_alloc(a, 8, &p), ES_ECORRUPT);
  assert_false(es_arena_is_valid(a));
}
#endif

/* ---- debug builds: guard, released-byte fill, ASan poisoning ----------------------------- */

#ifndef NDEBUG
static void guard_write(es_arena *a, size_t at, unsigned char v) {
  unsigned char *g = (unsigned char *)a->base + es_arena_capacity(a) + at;
#ifdef ES_ASAN
  ASAN_UNPOISON_MEMORY_REGION(g, 1); /* the guard is poisoned too */
#endif
  *g = v;
}

static void test_guard_detects_overrun(void **state) {
  (void)state;
  es_arena a;
  ES_CHECK_RC(es_arena_init(&a, block_, 4096, 0));
  for (size_t at = 0; at < ES_ARENA_GUARD; at += ES_ARENA_GUARD - 1) {
    void *p;
    ES_CHECK_RC(es_arena_alloc(&a, es_arena_capacity(&a), &p));
    guard_write(&a, at, 0);
    assert_false(es_arena_is_valid(&a));
    ES_EXPECT_RC(es_arena_reset(&a), ES_ECORRUPT);
    assert_true(detail_has("guard"));
    /* Still reset and usable, and the guard is armed again. */
    assert_int_equal(es_arena_used(&a), 0);
    assert_true(es_arena_is_valid(&a));
    ES_CHECK_RC(es_arena_alloc(&a, 64, &p));
    ES_CHECK_RC(es_arena_reset(&a));
  }
  ES_CHECK_RC(es_arena_fini(&a));

  es_arena *c;
  ES_CHECK_RC(es_arena_create(1000, 0, &c));
  guard_write(c, 0, 0x42);
  ES_EXPECT_RC(es_arena_reset(c), ES_ECORRUPT);
  ES_CHECK_RC(es_arena_reset(c));
  es_arena_destroy(c);
}
#endif

#if !defined(NDEBUG) && !defined(ES_ASAN)
static void test_released_bytes_filled(void **state) {
  (void)state;
  es_arena *a;
  ES_CHECK_RC(es_arena_create(4096, 0, &a));
  unsigned char *p, *q;
  ES_CHECK_RC(es_arena_alloc(a, 100, (void **)&p));
  es_arena_mark m;
  ES_CHECK_RC(es_arena_mark_get(a, &m));
  ES_CHECK_RC(es_arena_alloc(a, 200, (void **)&q));
  memset(p, 0x11, 100);
  memset(q, 0x22, 200);
  ES_CHECK_RC(es_arena_rewind(a, &m));
  for (size_t i = 0; i < 100; i++)
    assert_int_equal(p[i], 0x11);
  for (size_t i = 0; i < 200; i++)
    assert_int_equal(q[i], 0xDD);
  ES_CHECK_RC(es_arena_reset(a));
  for (size_t i = 0; i < 100; i++)
    assert_int_equal(p[i], 0xDD);
  es_arena_destroy(a);
}
#endif

#ifdef ES_ASAN
static void test_asan_poisoning(void **state) {
  (void)state;
  es_arena a;
  ES_CHECK_RC(es_arena_init(&a, block_, 4096 + GUARD, 0));
  unsigned char *p, *q;
  es_arena_mark m;
  ES_CHECK_RC(es_arena_alloc(&a, 100, (void **)&p));
  ES_CHECK_RC(es_arena_mark_get(&a, &m));
  /* Exactly [p, p + 100) is addressable: padding and free space are not. */
  assert_null(__asan_region_is_poisoned(p, 100));
  assert_true(__asan_address_is_poisoned(p + 100));
  assert_true(__asan_address_is_poisoned(p + 127));
  ES_CHECK_RC(es_arena_alloc(&a, 64, (void **)&q));
  assert_null(__asan_region_is_poisoned(q, 64));
  assert_true(__asan_address_is_poisoned(p + 100));
  assert_true(__asan_address_is_poisoned(q + 64));
  assert_true(__asan_address_is_poisoned(p + es_arena_capacity(&a))); /* the guard */
  ES_CHECK_RC(es_arena_rewind(&a, &m));
  assert_true(__asan_address_is_poisoned(q));
  assert_null(__asan_region_is_poisoned(p, 100));
  ES_CHECK_RC(es_arena_reset(&a));
  assert_true(__asan_address_is_poisoned(p));
  ES_CHECK_RC(es_arena_fini(&a));
  assert_null(__asan_region_is_poisoned(block_, BLOCK_SIZE));
}
#endif

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_init_args),
      cmocka_unit_test(test_init_capacity),
      cmocka_unit_test(test_create_args),
      cmocka_unit_test(test_create_capacity_and_counting),
      cmocka_unit_test(test_fini_and_destroy_refuse_the_wrong_kind),
      cmocka_unit_test(test_alloc_alignments),
      cmocka_unit_test(test_alloc_size_zero),
      cmocka_unit_test(test_alloc_overflow),
      cmocka_unit_test(test_alloc_exhaustion),
      cmocka_unit_test(test_alloc_null_args),
      cmocka_unit_test(test_peak),
      cmocka_unit_test(test_mark_rewind),
      cmocka_unit_test(test_use_after_fini),
      cmocka_unit_test(test_foreign_structs),
#if !defined(ES_ASAN) && !defined(ES_TSAN)
      cmocka_unit_test(test_use_after_destroy),
#endif
#ifndef NDEBUG
      cmocka_unit_test(test_guard_detects_overrun),
#endif
#if !defined(NDEBUG) && !defined(ES_ASAN)
      cmocka_unit_test(test_released_bytes_filled),
#endif
#ifdef ES_ASAN
      cmocka_unit_test(test_asan_poisoning),
#endif
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
