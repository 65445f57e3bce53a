/* Buddy pool property test: millions of random allocations and frees checked
 * against a simple model, an address-sorted array of the live blocks.
 *
 * After every step: the new block overlaps no live block (its neighbours in
 * the sorted array are found by binary search), it is aligned, its usable
 * size is what the size classes promise, and the pool's counters equal the
 * model's. Every block carries a byte pattern at its ends, checked when it
 * is freed, so a block handed out twice shows up even if the overlap check
 * were wrong. es_buddy_check runs every 4096 steps. Bursts of frees empty the
 * pool now and then, and each time it must coalesce back to its top blocks.
 * ES_PROP_OPS scales the run (default 2,000,000 for the main test). */
#include "es_test.h"

#include <string.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define LIVE_MAX 1024
#define CHECK_EVERY 4096
#define BURST_EVERY 20000

typedef struct live_block {
  uintptr_t addr;
  size_t size;
  size_t usable;
  uint64_t tag;
} live_block;

typedef struct model {
  live_block v[LIVE_MAX];
  size_t n;
  size_t in_use, requested;
  uint64_t allocs, frees, failures, invalid_frees;
} model;

typedef struct prop_params {
  es_buddy_config cfg;
  uint64_t ops;
  unsigned max_bits;      /* sizes below 2^max_bits */
  size_t max_slab_block;  /* every slab block is at most this */
  int single_region;      /* 1: after emptying, largest_free == capacity */
} prop_params;

static uint64_t prop_ops(void) {
  const char *e = getenv("ES_PROP_OPS");
  uint64_t n = e ? strtoull(e, NULL, 0) : 0;
  return n ? n : 2000000;
}

static size_t pow2_ceil(size_t x) {
  size_t p = 1;
  while (p < x)
    p <<= 1;
  return p;
}

/* Log-uniform-ish: a random bit length, then a random value of that length. */
static size_t rand_size(uint64_t *rng, unsigned max_bits) {
  unsigned bits = (unsigned)(es_test_rand(rng) % max_bits);
  size_t lo = (size_t)1 << bits;
  return lo + (size_t)(es_test_rand(rng) % lo);
}

static unsigned char pat(uint64_t tag, size_t pos) {
  return (unsigned char)((tag * 0x9e3779b97f4a7c15ull + pos * 131) >> 56);
}

/* Ends of the requested bytes and the last usable byte. */
static void pat_apply(const live_block *l, int verify) {
  unsigned char *p = (unsigned char *)l->addr;
  size_t edge = l->size < 8 ? l->size : 8;
  size_t pos[17];
  size_t n = 0;
  for (size_t i = 0; i < edge; i++) {
    pos[n++] = i;
    pos[n++] = l->size - 1 - i;
  }
  pos[n++] = l->usable - 1;
  for (size_t i = 0; i < n; i++) {
    if (!verify)
      p[pos[i]] = pat(l->tag, pos[i]);
    else if (p[pos[i]] != pat(l->tag, pos[i]))
      fail_msg("block %p (%zu B, tag %llu) was overwritten at +%zu", (void *)l->addr, l->size,
               (unsigned long long)l->tag, pos[i]);
  }
}

/* First index whose address is >= a. */
static size_t model_find(const model *m, uintptr_t a) {
  size_t lo = 0, hi = m->n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (m->v[mid].addr < a)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static void model_insert(model *m, const live_block *l) {
  size_t i = model_find(m, l->addr);
  if (i > 0 && m->v[i - 1].addr + m->v[i - 1].usable > l->addr)
    fail_msg("new block %p (%zu B) overlaps %p (%zu B)", (void *)l->addr, l->usable,
             (void *)m->v[i - 1].addr, m->v[i - 1].usable);
  if (i < m->n && l->addr + l->usable > m->v[i].addr)
    fail_msg("new block %p (%zu B) overlaps %p (%zu B)", (void *)l->addr, l->usable,
             (void *)m->v[i].addr, m->v[i].usable);
  memmove(&m->v[i + 1], &m->v[i], (m->n - i) * sizeof m->v[0]);
  m->v[i] = *l;
  m->n++;
  m->in_use += l->usable;
  m->requested += l->size;
  m->allocs++;
}

static void stats_match(es_buddy *b, const model *m) {
  es_buddy_stats s;
  ES_CHECK_RC(es_buddy_stats_get(b, &s));
  if (s.bytes_in_use != m->in_use || s.bytes_requested != m->requested ||
      s.live_blocks != m->n || s.allocs != m->allocs || s.frees != m->frees ||
      s.failures != m->failures || s.invalid_frees != m->invalid_frees)
    fail_msg("stats drifted: in_use %zu/%zu requested %zu/%zu live %zu/%zu allocs %llu/%llu "
             "frees %llu/%llu failures %llu/%llu invalid %llu/%llu (pool/model)",
             s.bytes_in_use, m->in_use, s.bytes_requested, m->requested, s.live_blocks, m->n,
             (unsigned long long)s.allocs, (unsigned long long)m->allocs,
             (unsigned long long)s.frees, (unsigned long long)m->frees,
             (unsigned long long)s.failures, (unsigned long long)m->failures,
             (unsigned long long)s.invalid_frees, (unsigned long long)m->invalid_frees);
  if (s.free_bytes + s.bytes_in_use > s.capacity || s.largest_free > s.free_bytes)
    fail_msg("free %zu + in use %zu > capacity %zu, or largest %zu > free", s.free_bytes,
             s.bytes_in_use, s.capacity, s.largest_free);
}

static void step_alloc(es_buddy *b, model *m, const prop_params *pp, uint64_t *rng,
                       uint64_t tag) {
  size_t size = rand_size(rng, pp->max_bits);
  void *p = NULL;
  int rc = es_buddy_alloc(b, size, &p);
  if (rc == ES_ENOSPC) {
    m->failures++;
    es_buddy_stats s;
    ES_CHECK_RC(es_buddy_stats_get(b, &s));
    size_t need = size > pp->cfg.slab_max ? pow2_ceil(size > pp->cfg.min_block ? size
                                                                             : pp->cfg.min_block)
                                          : pp->max_slab_block;
    if (s.largest_free >= need)
      fail_msg("alloc %zu B refused with a free block of %zu B", size, s.largest_free);
    return;
  }
  ES_CHECK_RC(rc);
  if ((uintptr_t)p % pp->cfg.align)
    fail_msg("alloc %zu B returned %p, not aligned to %zu", size, p, pp->cfg.align);
  size_t usable = 0;
  ES_CHECK_RC(es_buddy_usable_size(b, p, &usable));
  if (usable < size || usable % pp->cfg.align)
    fail_msg("alloc %zu B: usable %zu", size, usable);
  if (size > pp->cfg.slab_max) {
    size_t want = pow2_ceil(size > pp->cfg.min_block ? size : pp->cfg.min_block);
    if (usable != want)
      fail_msg("alloc %zu B: block %zu, want %zu", size, usable, want);
  } else {
    size_t min_slot = pp->cfg.align > 64 ? pp->cfg.align : 64;
    if (usable > min_slot && usable > size + size / 4 + pp->cfg.align)
      fail_msg("alloc %zu B: slot %zu is more than a class step away", size, usable);
  }
  live_block l = {(uintptr_t)p, size, usable, tag};
  pat_apply(&l, 0);
  model_insert(m, &l);
}

static void step_free(es_buddy *b, model *m, size_t i, uint64_t *rng) {
  live_block l = m->v[i];
  pat_apply(&l, 1);
  ES_CHECK_RC(es_buddy_free(b, (void *)l.addr));
  memmove(&m->v[i], &m->v[i + 1], (m->n - i - 1) * sizeof m->v[0]);
  m->n--;
  m->in_use -= l.usable;
  m->requested -= l.size;
  m->frees++;
  /* Now and then free it again: nothing was allocated since, so it is free. */
  if (es_test_rand(rng) % 64 == 0) {
    ES_EXPECT_RC(es_buddy_free(b, (void *)l.addr), ES_EDOUBLEFREE);
    m->invalid_frees++;
  }
}

static void check_empty(es_buddy *b, const prop_params *pp) {
  ES_CHECK_RC(es_buddy_check(b));
  es_buddy_stats s;
  ES_CHECK_RC(es_buddy_stats_get(b, &s));
  assert_int_equal(s.live_blocks, 0);
  assert_int_equal(s.bytes_in_use, 0);
  assert_int_equal(s.slabs, 0);
  assert_int_equal(s.free_bytes, s.capacity);
  if (pp->single_region) {
    assert_int_equal(s.largest_free, s.capacity);
    assert_true(s.fragmentation == 0.0);
  }
}

static void prop_run(const prop_params *pp) {
  uint64_t rng = es_test_seed();
  model *m = calloc(1, sizeof *m);
  assert_non_null(m);
  es_buddy *b = NULL;
  ES_CHECK_RC(es_buddy_create(&pp->cfg, &b));
  uint64_t empties = 0;

  for (uint64_t op = 1; op <= pp->ops; op++) {
    uint64_t r = es_test_rand(&rng);
    if (op % BURST_EVERY == 0) {
      /* Burst: empty the pool (or nine in ten blocks) in random order. */
      int all = (r >> 8) & 1;
      while (m->n > (all ? 0 : m->n / 10)) {
        step_free(b, m, (size_t)(es_test_rand(&rng) % m->n), &rng);
        stats_match(b, m);
      }
      if (all) {
        check_empty(b, pp);
        empties++;
      }
    } else if (m->n == 0 || (m->n < LIVE_MAX && (r & 1))) {
      step_alloc(b, m, pp, &rng, op);
    } else {
      step_free(b, m, (size_t)((r >> 1) % m->n), &rng);
    }
    if (op % 997 == 0 && m->n) {
      /* An interior pointer into a live block is refused. */
      const live_block *l = &m->v[(r >> 20) % m->n];
      ES_EXPECT_RC(es_buddy_free(b, (void *)(l->addr + 1 + (r >> 40) % (l->usable - 1))),
                   ES_EBADPTR);
      m->invalid_frees++;
    }
    stats_match(b, m);
    if (op % CHECK_EVERY == 0)
      ES_CHECK_RC(es_buddy_check(b));
  }
  ES_CHECK_RC(es_buddy_check(b));
  while (m->n)
    step_free(b, m, m->n - 1, &rng);
  stats_match(b, m);
  check_empty(b, pp);
  es_buddy_stats s;
  ES_CHECK_RC(es_buddy_stats_get(b, &s));
  printf("# %llu ops: %llu allocs, %llu failures, %llu splits, %llu merges, %zu regions, "
         "peak %zu B, %llu empties\n",
         (unsigned long long)pp->ops, (unsigned long long)s.allocs,
         (unsigned long long)s.failures, (unsigned long long)s.splits,
         (unsigned long long)s.merges, s.regions, s.peak_in_use, (unsigned long long)empties);
  assert_true(s.allocs > pp->ops / 3);
  es_buddy_destroy(b);
  free(m);
}

static void test_prop_default(void **state) {
  (void)state;
  prop_params pp;
  es_buddy_config_default(&pp.cfg);
  pp.ops = prop_ops();
  pp.max_bits = 24; /* sizes up to capacity / 4 */
  pp.max_slab_block = 2 * MiB;
  pp.single_region = 1;
  prop_run(&pp);
}

/* Odd shapes: a capacity that is not a power of two, small units, a large
 * alignment, small slabs and growth. */
static void test_prop_odd(void **state) {
  (void)state;
  prop_params pp;
  es_buddy_config_default(&pp.cfg);
  pp.cfg.capacity = 100 * MiB + 5 * 16 * KiB;
  pp.cfg.min_block = 16 * KiB;
  pp.cfg.align = 1024;
  pp.cfg.slab_max = 64 * KiB;
  pp.cfg.grow = 1;
  pp.cfg.grow_max = 160 * MiB;
  pp.ops = prop_ops() / 4;
  pp.max_bits = 25;
  pp.max_slab_block = 512 * KiB;
  pp.single_region = 0;
  prop_run(&pp);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_prop_default),
      cmocka_unit_test(test_prop_odd),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
