/* Request arena: a bump allocator over one contiguous block.
 *
 * An allocation aligns the current offset up to the arena's alignment, checks
 * that size bytes fit before the capacity and moves the offset past them.
 * There is no per-allocation metadata and no partial free: reset drops
 * everything at once, rewind drops everything after a saved mark. Because the
 * base is aligned and every allocation starts at an aligned offset, the
 * offset of an allocation depends only on the sizes before it, so a memory
 * plan computed as offsets holds for the arena.
 *
 * The layout is the same in every build:
 *
 *   block  [slack to align] base [capacity usable bytes] [guard] end
 *
 * The guard (ES_ARENA_GUARD bytes, debug builds only) lives after the
 * capacity, never between allocations, so an allocation consumes the same
 * bytes in release and debug builds. In debug builds the guard holds a
 * pattern written at init and at each reset and checked on reset; released
 * bytes are filled with 0xDD so a use after reset reads garbage that stands
 * out. Under ASan everything that is not handed out (free space, alignment
 * padding, released bytes, the guard) is poisoned and exactly [p, p + size)
 * is unpoisoned on alloc, so reading one byte past a tensor faults at once.
 *
 * The allocation fast path is a magic check, an align-up, the bounds checks,
 * the bump and the peak update; errors and their messages live in cold
 * functions so the hot one stays small enough to inline well. Debug work is
 * under #ifndef NDEBUG, ASan work under ES_POISON/ES_UNPOISON (no-ops
 * otherwise).
 *
 * Marks carry the arena's epoch; reset bumps it so a mark from before a reset
 * is refused. The epoch of each new arena starts in its own 2^32 range, so a
 * mark from another arena is refused too (until 2^32 resets). */
#include "edgeserve/memory.h"
#include "common/internal.h"
#include "memory/map.h"

#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#define ES_ARENA_MAGIC 0x45534152454e4121ull /* "ESARENA!" while live */
#define ES_ARENA_DEAD 0x4553415244454144ull  /* "ESARDEAD" after fini/destroy */

#define ARENA_RELEASED_BYTE 0xDD /* debug: released bytes */
#define ARENA_GUARD_BYTE 0xFD    /* debug: the guard after the capacity */

/* Bytes reserved after the capacity: only debug builds check a guard, and
 * release builds must not pay for one. */
#ifdef NDEBUG
#define ARENA_GUARD_SIZE ((size_t)0)
#else
#define ARENA_GUARD_SIZE ((size_t)ES_ARENA_GUARD)
#endif

#define arena_unlikely(x) __builtin_expect(!!(x), 0)

static _Atomic uint64_t es_arena_epoch_seed_;

/* ---- validation and error reporting ----------------------------------------- */

static int arena_is_live(const es_arena *a) { return a != NULL && a->magic == ES_ARENA_MAGIC; }

static int arena_align_ok(size_t align) {
  return align == 0 || (es__is_pow2(align) && align <= ES_ARENA_MAX_ALIGN);
}

/* The error for a NULL or non-live arena, with what its magic says. */
__attribute__((cold, noinline)) static int arena_reject(const es_arena *a, const char *fn) {
  if (a == NULL)
    return es__fail(ES_EINVAL, "%s: arena is NULL", fn);
  if (a->magic == ES_ARENA_DEAD)
    return es__fail(ES_ECORRUPT, "%s: arena %p was finished or destroyed", fn, (const void *)a);
  return es__fail(ES_ECORRUPT, "%s: %p is not a live arena (magic 0x%llx): corrupted or foreign",
                  fn, (const void *)a, (unsigned long long)a->magic);
}

/* Everything that makes es_arena_alloc fail, out of the hot path. */
__attribute__((cold, noinline)) static int arena_alloc_fail(const es_arena *a, size_t size,
                                                            void **out) {
  if (!arena_is_live(a))
    return arena_reject(a, "es_arena_alloc");
  if (out == NULL)
    return es__fail(ES_EINVAL, "es_arena_alloc: out is NULL");
  size_t mask = a->align - 1;
  if (size > SIZE_MAX - mask)
    return es__fail(ES_EOVERFLOW,
                    "es_arena_alloc: size %zu B overflows when rounded up to the alignment %zu",
                    size, a->align);
  /* Cannot overflow: the padding is below align and size <= SIZE_MAX - mask. */
  size_t off = (a->used + mask) & ~mask;
  size_t need = (off - a->used) + size;
  size_t avail = a->capacity - a->used;
  return es__fail(ES_ENOSPC,
                  "arena exhausted: requested %zu B (%zu after alignment), available %zu B, "
                  "missing %zu B",
                  size, need, avail, need - avail);
}

/* ---- debug guard and fills --------------------------------------------------- */

#ifndef NDEBUG
static unsigned char *arena_guard(const es_arena *a) { return a->base + a->capacity; }

static void arena_guard_arm(es_arena *a) {
  unsigned char *g = arena_guard(a);
  ES_UNPOISON(g, ARENA_GUARD_SIZE);
  memset(g, ARENA_GUARD_BYTE, ARENA_GUARD_SIZE);
  ES_POISON(g, ARENA_GUARD_SIZE);
}

/* Index of the first damaged guard byte, or ARENA_GUARD_SIZE if intact. The
 * guard is poisoned under ASan, so it is opened just for the look. */
static size_t arena_guard_damage(const es_arena *a) {
  const unsigned char *g = arena_guard(a);
  size_t i = 0;
  ES_UNPOISON(g, ARENA_GUARD_SIZE);
  while (i < ARENA_GUARD_SIZE && g[i] == ARENA_GUARD_BYTE)
    i++;
  ES_POISON(g, ARENA_GUARD_SIZE);
  return i;
}

static void arena_fill_released(es_arena *a, size_t from, size_t to) {
  ES_UNPOISON(a->base + from, to - from);
  memset(a->base + from, ARENA_RELEASED_BYTE, to - from);
}
#endif

/* Give back [from, to): filled in debug builds, unaddressable under ASan. */
static void arena_release_range(es_arena *a, size_t from, size_t to) {
#ifndef NDEBUG
  arena_fill_released(a, from, to);
#endif
  ES_POISON(a->base + from, to - from);
}

/* ---- setup and teardown ------------------------------------------------------ */

/* Lay an arena over [block, block + size). The caller has checked a, block
 * and align. ES_EINVAL if nothing is left after alignment and guard. */
static int arena_setup(es_arena *a, void *block, size_t size, size_t align, const char *fn) {
  if (align == 0)
    align = ES_ARENA_DEFAULT_ALIGN;
  uintptr_t start = (uintptr_t)block;
  if (size > UINTPTR_MAX - start)
    return es__fail(ES_EINVAL, "%s: block %p + %zu B wraps the address space", fn, block, size);
  uintptr_t end = start + size;
  uintptr_t base = (start + (align - 1)) & ~(uintptr_t)(align - 1);
  if (base < start || base >= end || end - base <= ARENA_GUARD_SIZE)
    return es__fail(ES_EINVAL,
                    "%s: block of %zu B at %p holds nothing after aligning to %zu and a %zu B "
                    "guard",
                    fn, size, block, align, ARENA_GUARD_SIZE);

  a->base = (unsigned char *)base;
  a->capacity = (size_t)(end - base) - ARENA_GUARD_SIZE;
  a->used = 0;
  a->peak = 0;
  a->align = align;
  a->epoch = atomic_fetch_add_explicit(&es_arena_epoch_seed_, 1, memory_order_relaxed) << 32;
  a->block = NULL;
  a->block_size = 0;
  a->owner = NULL;
  a->allocs = 0;
#ifndef NDEBUG
  arena_guard_arm(a);
#endif
  ES_POISON(a->base, a->capacity + ARENA_GUARD_SIZE);
  a->magic = ES_ARENA_MAGIC;
  return 0;
}

/* Make the whole range addressable again (the caller may reuse it, or an
 * unmapped range may come back from a later mmap) and kill the magic. */
static void arena_teardown(es_arena *a) {
  ES_UNPOISON(a->base, a->capacity + ARENA_GUARD_SIZE);
  a->magic = ES_ARENA_DEAD;
}

/* Usable capacity over a caller block = (block end - block rounded up to
 * align), minus ES_ARENA_GUARD in debug builds; release builds reserve no
 * guard, so the same block holds ES_ARENA_GUARD more bytes there. */
int es_arena_init(es_arena *a, void *block, size_t size, size_t align) {
  if (a == NULL || block == NULL || size == 0)
    return es__fail(ES_EINVAL, "es_arena_init: %s", a == NULL       ? "arena is NULL"
                                                    : block == NULL ? "block is NULL"
                                                                    : "size is 0");
  if (!arena_align_ok(align))
    return es__fail(ES_EINVAL, "es_arena_init: align %zu is not a power of two in [1, %d]",
                    align, ES_ARENA_MAX_ALIGN);
  return arena_setup(a, block, size, align, "es_arena_init");
}

int es_arena_fini(es_arena *a) {
  if (!arena_is_live(a))
    return arena_reject(a, "es_arena_fini");
  if (a->owner != NULL)
    return es__fail(ES_EINVAL, "es_arena_fini: arena %p belongs to pool %p; release it there",
                    (void *)a, a->owner);
  if (a->block != NULL)
    return es__fail(ES_EINVAL, "es_arena_fini: arena %p is from es_arena_create; destroy it",
                    (void *)a);
  arena_teardown(a);
  return 0;
}

/* The struct comes from the heap, apart from the data, so an overrun of the
 * data can never reach the magic; the data mapping is page-aligned, which is
 * every alignment we accept, so the capacity is exactly what was asked. */
int es_arena_create(size_t capacity, size_t align, es_arena **out) {
  if (out == NULL || capacity == 0)
    return es__fail(ES_EINVAL, "es_arena_create: %s",
                    out == NULL ? "out is NULL" : "capacity is 0");
  if (!arena_align_ok(align))
    return es__fail(ES_EINVAL, "es_arena_create: align %zu is not a power of two in [1, %d]",
                    align, ES_ARENA_MAX_ALIGN);
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  if (capacity > SIZE_MAX - ARENA_GUARD_SIZE - page)
    return es__fail(ES_EOVERFLOW, "es_arena_create: capacity %zu B overflows the mapping size",
                    capacity);
  size_t size = capacity + ARENA_GUARD_SIZE;

  es_arena *a = es_mem_alloc(ES_MEM_ARENA, sizeof *a);
  if (a == NULL)
    return es__fail(ES_ENOMEM, "es_arena_create: no memory for the arena struct");
  /* Huge pages: a request's activations are read and written whole, often
   * tens of MB (fcn_resnet50 at 520: a 57.8 MB arena), and 4 KiB pages cost
   * the convolutions TLB misses: 1,750 against 1,470 ms a run, 1 thread. */
  void *block = es__mem_map_large(ES_MEM_ARENA, size);
  if (block == NULL) {
    es_mem_free(a);
    return es__fail(ES_ENOMEM, "es_arena_create: cannot map %zu B", size);
  }
  int rc = arena_setup(a, block, size, align, "es_arena_create");
  ES_ASSERT(rc == 0 && a->capacity == capacity);
  a->block = block;
  a->block_size = size;
  *out = a;
  return 0;
}

void es_arena_destroy(es_arena *a) {
  if (a == NULL)
    return;
  /* Nothing safe to free for a non-live arena or one that is not ours to
   * destroy; leave a detail and leak rather than crash. */
  if (!arena_is_live(a)) {
    arena_reject(a, "es_arena_destroy");
    return;
  }
  if (a->block == NULL || a->owner != NULL) {
    es__fail(ES_EINVAL, "es_arena_destroy: arena %p is not from es_arena_create", (void *)a);
    return;
  }
  void *block = a->block;
  size_t size = a->block_size;
  arena_teardown(a);
  es_mem_unmap(ES_MEM_ARENA, block, size);
  es_mem_free(a);
}

/* ---- allocation ----------------------------------------------------------------- */

/* ES_EOVERFLOW depends on size and alignment only (size rounded up to the
 * alignment must fit in size_t), never on the position, so whether a size is
 * representable does not change as the arena fills. Size 0 fails only when
 * the next aligned address is past the capacity, which happens only in a full
 * arena whose capacity is not a multiple of the alignment. */
int es_arena_alloc(es_arena *a, size_t size, void **out) {
  if (arena_unlikely(a == NULL || a->magic != ES_ARENA_MAGIC || out == NULL))
    return arena_alloc_fail(a, size, out);
  size_t mask = a->align - 1;
  size_t off = (a->used + mask) & ~mask;
  /* The first test is the size rounding overflow; the others the bounds,
   * written so that neither side can wrap. */
  if (arena_unlikely(size > SIZE_MAX - mask || off > a->capacity || size > a->capacity - off))
    return arena_alloc_fail(a, size, out);
  unsigned char *p = a->base + off;
  /* Size 0 gets the next aligned address but must not consume the padding
   * before it: a later allocation may still use those bytes. */
  size_t used = size != 0 ? off + size : a->used;
  a->used = used;
  if (used > a->peak)
    a->peak = used;
  a->allocs++;
  ES_UNPOISON(p, size);
  *out = p;
  return 0;
}

/* ---- reset and marks ------------------------------------------------------------ */

int es_arena_reset(es_arena *a) {
  if (!arena_is_live(a))
    return arena_reject(a, "es_arena_reset");
  int rc = 0;
#ifndef NDEBUG
  size_t bad = arena_guard_damage(a);
  if (bad < ARENA_GUARD_SIZE) {
    rc = es__fail(ES_ECORRUPT,
                  "arena %p: guard overwritten at capacity + %zu (capacity %zu B, used %zu B): "
                  "something wrote past the end of the arena",
                  (void *)a, bad, a->capacity, a->used);
    arena_guard_arm(a);
  }
#endif
  arena_release_range(a, 0, a->used);
  a->used = 0;
  a->allocs = 0;
  a->epoch++;
  return rc;
}

int es_arena_mark_get(const es_arena *a, es_arena_mark *out) {
  if (!arena_is_live(a))
    return arena_reject(a, "es_arena_mark_get");
  if (out == NULL)
    return es__fail(ES_EINVAL, "es_arena_mark_get: out is NULL");
  out->used = a->used;
  out->epoch = a->epoch;
  return 0;
}

int es_arena_rewind(es_arena *a, const es_arena_mark *m) {
  if (!arena_is_live(a))
    return arena_reject(a, "es_arena_rewind");
  if (m == NULL)
    return es__fail(ES_EINVAL, "es_arena_rewind: mark is NULL");
  if (m->epoch != a->epoch)
    return es__fail(ES_EREWIND,
                    "arena %p: mark is stale (taken before a reset, or from another arena)",
                    (void *)a);
  if (m->used > a->used)
    return es__fail(ES_EREWIND, "arena %p: mark at %zu B is ahead of the current position %zu B",
                    (void *)a, m->used, a->used);
  arena_release_range(a, m->used, a->used);
  a->used = m->used;
  return 0;
}

/* ---- accessors ------------------------------------------------------------------ */

size_t es_arena_used(const es_arena *a) { return arena_is_live(a) ? a->used : 0; }

size_t es_arena_peak(const es_arena *a) { return arena_is_live(a) ? a->peak : 0; }

size_t es_arena_capacity(const es_arena *a) { return arena_is_live(a) ? a->capacity : 0; }

size_t es_arena_available(const es_arena *a) {
  return arena_is_live(a) ? a->capacity - a->used : 0;
}

/* The peak restarts from what is in use now, not from 0: those bytes are
 * still held. */
int es_arena_peak_reset(es_arena *a) {
  if (!arena_is_live(a))
    return arena_reject(a, "es_arena_peak_reset");
  a->peak = a->used;
  return 0;
}

int es_arena_is_valid(const es_arena *a) {
  if (!arena_is_live(a) || a->base == NULL || a->capacity == 0 || !es__is_pow2(a->align) ||
      a->align > ES_ARENA_MAX_ALIGN || ((uintptr_t)a->base & (a->align - 1)) != 0 ||
      a->used > a->capacity || a->peak > a->capacity)
    return 0;
#ifndef NDEBUG
  if (arena_guard_damage(a) < ARENA_GUARD_SIZE)
    return 0;
#endif
  return 1;
}
