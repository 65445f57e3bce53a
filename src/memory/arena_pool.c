/* Arena pool: count request arenas of one size, made once at creation.
 *
 * The pool bounds concurrent requests: a request holds one arena from
 * acquire to release, and when all are out the next acquire waits on a
 * condition variable (CLOCK_MONOTONIC, so a wall-clock jump cannot stretch a
 * timeout) until a release signals it. Nothing polls.
 *
 * Memory: the arenas' bytes are one anonymous mapping, sliced at a stride
 * that keeps every arena's base aligned and, whatever the alignment, keeps
 * two arenas off a shared cache line. The arena structs live apart from the
 * data, in slots padded to a cache line: the struct a thread bumps on every
 * alloc does not share a line with another thread's, and no overrun of an
 * arena's data can reach any struct.
 *
 * Free arenas sit on a LIFO stack of slot indices, so the arena released last
 * (still warm in cache) is handed out first. Each slot records whether its
 * arena is free, acquired or being returned; the pool's own records, not the
 * caller's pointer, decide what a release means, so a double or foreign
 * release is refused and counted without touching the pool's state. A
 * release resets the arena outside the lock (a debug reset fills every used
 * byte), so one big release never stalls other threads' acquires. */
#include "edgeserve/memory.h"
#include "common/internal.h"
#include "memory/map.h"

#include <errno.h>
#include <pthread.h>
#include <time.h>

#define ES_ARENA_POOL_MAGIC 0x4553504f4f4c2121ull /* "ESPOOL!!" while live */
#define ES_ARENA_POOL_DEAD 0x4553504f44454144ull  /* "ESPODEAD" after destroy */
#define ES_ARENA_POOL_MAX 65536

/* Must match the guard es_arena_init reserves after the capacity, so that a
 * slice of capacity + guard bytes gives an arena of exactly capacity. */
#ifdef NDEBUG
#define POOL_GUARD_SIZE ((size_t)0)
#else
#define POOL_GUARD_SIZE ((size_t)ES_ARENA_GUARD)
#endif

#define POOL_LINE 64 /* cache line: minimum slice alignment, slot size unit */

enum { SLOT_FREE, SLOT_ACQUIRED, SLOT_RETURNING };

typedef struct pool_slot {
  _Alignas(POOL_LINE) es_arena arena;
  int state; /* SLOT_*, under the pool's lock */
} pool_slot;

struct es_arena_pool {
  uint64_t magic;
  pthread_mutex_t lock;
  pthread_cond_t freed;      /* signalled once per arena returned */
  pool_slot *slots;          /* count slots, cache-line aligned */
  uint32_t *free_stack;      /* indices of free slots; top at free_top - 1 */
  size_t free_top;
  size_t count;
  size_t capacity;           /* usable bytes per arena */
  size_t align;
  size_t stride;             /* bytes between two arenas' slices */
  unsigned char *map;        /* the arenas' data, one mapping */
  size_t map_size;
  size_t waiters;            /* threads blocked in acquire */
  es_arena_pool_stats stats; /* count and arena_capacity filled at create */
};

/* ---- locking ------------------------------------------------------------------ */

/* A mutex error here means memory corruption or a destroyed pool in use:
 * an invariant, not something a caller could handle. */
static void pool_lock(es_arena_pool *p) {
  int rc = pthread_mutex_lock(&p->lock);
  ES_ASSERT(rc == 0);
}

static void pool_unlock(es_arena_pool *p) {
  int rc = pthread_mutex_unlock(&p->lock);
  ES_ASSERT(rc == 0);
}

static int pool_check(const es_arena_pool *p, const char *fn) {
  if (p == NULL)
    return es__fail(ES_EINVAL, "%s: pool is NULL", fn);
  if (p->magic != ES_ARENA_POOL_MAGIC)
    return es__fail(ES_ECORRUPT, "%s: %p is not a live arena pool (magic 0x%llx)", fn,
                    (const void *)p, (unsigned long long)p->magic);
  return 0;
}

/* ---- slots -------------------------------------------------------------------- */

static unsigned char *pool_slice(const es_arena_pool *p, size_t i) {
  return p->map + i * p->stride;
}

/* (Re)build slot i's arena over its slice; cannot fail, the slice was sized
 * for it at create. */
static void pool_slot_arm(es_arena_pool *p, size_t i) {
  es_arena *a = &p->slots[i].arena;
  int rc = es_arena_init(a, pool_slice(p, i), p->capacity + POOL_GUARD_SIZE, p->align);
  ES_ASSERT(rc == 0 && a->capacity == p->capacity);
  a->owner = p;
}

/* Does slot i's struct still describe its slice? A caller may have scribbled
 * over it; then it is rebuilt rather than trusted. */
static int pool_slot_intact(const es_arena_pool *p, size_t i) {
  const es_arena *a = &p->slots[i].arena;
  return es_arena_capacity(a) == p->capacity && a->base == pool_slice(p, i) &&
         a->align == p->align && a->owner == p && a->used <= a->capacity &&
         a->peak <= a->capacity;
}

/* Index of a's slot, or count if a is not exactly one of this pool's arenas
 * (another pool's, a standalone one, or a pointer into the middle of the
 * slot array). Compares addresses only: a foreign pointer is never read. */
static size_t pool_slot_index(const es_arena_pool *p, const es_arena *a) {
  uintptr_t first = (uintptr_t)&p->slots[0].arena;
  uintptr_t addr = (uintptr_t)a;
  if (addr < first)
    return p->count;
  uintptr_t off = addr - first;
  if (off % sizeof(pool_slot) != 0 || off / sizeof(pool_slot) >= p->count)
    return p->count;
  return off / sizeof(pool_slot);
}

/* Reset slot i's arena for the next user; the caller owns the slot (state
 * SLOT_RETURNING). Returns ES_ECORRUPT, with the arena rebuilt and usable,
 * if the struct or (debug) its guard was damaged. *peak gets the peak of
 * the use that ends here. */
static int pool_slot_scrub(es_arena_pool *p, size_t i, size_t *peak) {
  es_arena *a = &p->slots[i].arena;
  if (!pool_slot_intact(p, i)) {
    *peak = 0;
    pool_slot_arm(p, i);
    return es__fail(ES_ECORRUPT,
                    "arena %zu of pool %p: its struct was overwritten; rebuilt it empty", i,
                    (void *)p);
  }
  *peak = a->peak;
  int rc = es_arena_reset(a);
  /* Peaks are per acquisition, so a holder reads its own request's peak. */
  a->peak = 0;
  return rc;
}

/* ---- create and destroy --------------------------------------------------------- */

/* The condition variable waits on CLOCK_MONOTONIC: timeouts are durations,
 * and the wall clock can jump. */
static int pool_sync_init(es_arena_pool *p) {
  pthread_condattr_t ca;
  int rc = pthread_condattr_init(&ca);
  if (rc != 0)
    return es__fail(ES_ENOMEM, "es_arena_pool_create: pthread_condattr_init: %d", rc);
  rc = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  if (rc == 0)
    rc = pthread_cond_init(&p->freed, &ca);
  pthread_condattr_destroy(&ca);
  if (rc != 0)
    return es__fail(ES_ENOMEM, "es_arena_pool_create: cannot make the condition variable: %d",
                    rc);
  rc = pthread_mutex_init(&p->lock, NULL);
  if (rc != 0) {
    pthread_cond_destroy(&p->freed);
    return es__fail(ES_ENOMEM, "es_arena_pool_create: pthread_mutex_init: %d", rc);
  }
  return 0;
}

int es_arena_pool_create(size_t count, size_t arena_capacity, size_t align,
                         es_arena_pool **out) {
  if (out == NULL)
    return es__fail(ES_EINVAL, "es_arena_pool_create: out is NULL");
  if (count == 0 || count > ES_ARENA_POOL_MAX)
    return es__fail(ES_EINVAL, "es_arena_pool_create: count %zu is not in [1, %d]", count,
                    ES_ARENA_POOL_MAX);
  if (arena_capacity == 0)
    return es__fail(ES_EINVAL, "es_arena_pool_create: arena_capacity is 0");
  if (align == 0)
    align = ES_ARENA_DEFAULT_ALIGN;
  if (!es__is_pow2(align) || align > ES_ARENA_MAX_ALIGN)
    return es__fail(ES_EINVAL, "es_arena_pool_create: align %zu is not a power of two in [1, %d]",
                    align, ES_ARENA_MAX_ALIGN);

  size_t slice_align = align > POOL_LINE ? align : POOL_LINE;
  size_t stride = arena_capacity <= SIZE_MAX - POOL_GUARD_SIZE
                      ? es__align_up(arena_capacity + POOL_GUARD_SIZE, slice_align)
                      : 0;
  /* Half the address space is far beyond any real mapping and leaves room
   * for the page rounding in es_mem_map. */
  if (stride == 0 || stride > (SIZE_MAX / 2) / count)
    return es__fail(ES_EOVERFLOW,
                    "es_arena_pool_create: %zu arenas of %zu B overflow the mapping size", count,
                    arena_capacity);
  size_t map_size = stride * count;
  int rc;

  es_arena_pool *p = es_mem_calloc(ES_MEM_ARENA_POOL, 1, sizeof *p);
  pool_slot *slots = es_mem_aligned_alloc(ES_MEM_ARENA_POOL, POOL_LINE, count * sizeof *slots);
  uint32_t *stack = es_mem_calloc(ES_MEM_ARENA_POOL, count, sizeof *stack);
  /* Huge pages, as for es_arena_create (arena.c). */
  unsigned char *map = es__mem_map_large(ES_MEM_ARENA_POOL, map_size);
  if (!p || !slots || !stack || !map) {
    rc = es__fail(ES_ENOMEM, "es_arena_pool_create: cannot allocate %zu arenas of %zu B", count,
                  arena_capacity);
    goto fail;
  }
  rc = pool_sync_init(p);
  if (rc < 0)
    goto fail;

  p->slots = slots;
  p->free_stack = stack;
  p->count = count;
  p->capacity = arena_capacity;
  p->align = align;
  p->stride = stride;
  p->map = map;
  p->map_size = map_size;
  for (size_t i = 0; i < count; i++) {
    slots[i].state = SLOT_FREE;
    pool_slot_arm(p, i);
    /* Arena 0 on top: the first acquire gets the lowest address. */
    stack[i] = (uint32_t)(count - 1 - i);
  }
  p->free_top = count;
  p->stats.count = count;
  p->stats.arena_capacity = arena_capacity;
  p->magic = ES_ARENA_POOL_MAGIC;
  *out = p;
  return 0;

fail:
  if (map)
    es_mem_unmap(ES_MEM_ARENA_POOL, map, map_size);
  es_mem_free(stack);
  es_mem_free(slots);
  es_mem_free(p);
  return rc;
}

int es_arena_pool_destroy(es_arena_pool *p) {
  if (p == NULL)
    return 0;
  int rc = pool_check(p, "es_arena_pool_destroy");
  if (rc < 0)
    return rc;
  pool_lock(p);
  if (p->stats.in_use > 0 || p->waiters > 0) {
    size_t in_use = p->stats.in_use, waiters = p->waiters;
    pool_unlock(p);
    return es__fail(ES_EBUSY, "es_arena_pool_destroy: %zu arenas acquired, %zu threads waiting",
                    in_use, waiters);
  }
  p->magic = ES_ARENA_POOL_DEAD;
  pool_unlock(p);

  /* All free, so every slot is intact or was rebuilt at its release; fini
   * only fails for a slot that has been scribbled on since, and then the
   * unpoison below still covers its slice. */
  for (size_t i = 0; i < p->count; i++) {
    p->slots[i].arena.owner = NULL;
    (void)es_arena_fini(&p->slots[i].arena);
  }
  ES_UNPOISON(p->map, p->map_size);
  es_mem_unmap(ES_MEM_ARENA_POOL, p->map, p->map_size);
  pthread_cond_destroy(&p->freed);
  pthread_mutex_destroy(&p->lock);
  es_mem_free(p->free_stack);
  es_mem_free(p->slots);
  es_mem_free(p);
  return 0;
}

/* ---- acquire -------------------------------------------------------------------- */

/* Pop the most recently released arena; the lock is held and one is free. */
static es_arena *pool_take_locked(es_arena_pool *p) {
  ES_ASSERT(p->free_top > 0);
  size_t i = p->free_stack[--p->free_top];
  ES_ASSERT(p->slots[i].state == SLOT_FREE);
  p->slots[i].state = SLOT_ACQUIRED;
  es_arena_pool_stats *s = &p->stats;
  s->in_use++;
  if (s->in_use > s->high_water)
    s->high_water = s->in_use;
  s->acquires++;
  return &p->slots[i].arena;
}

/* Every arena was reset at release; one is only dirty here if a previous
 * holder kept using it after releasing it. Hand out a clean one anyway. The
 * caller owns the arena now, so this runs outside the lock. */
static void pool_hand_out(es_arena_pool *p, es_arena *a, es_arena **out) {
  size_t i = pool_slot_index(p, a);
  if (!pool_slot_intact(p, i))
    pool_slot_arm(p, i);
  else if (a->used != 0 || a->peak != 0) {
    (void)es_arena_reset(a);
    a->peak = 0;
  }
  *out = a;
}

static struct timespec pool_deadline(int timeout_ms) {
  struct timespec t;
  int rc = clock_gettime(CLOCK_MONOTONIC, &t);
  ES_ASSERT(rc == 0);
  t.tv_sec += timeout_ms / 1000;
  t.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
  if (t.tv_nsec >= 1000000000L) {
    t.tv_sec++;
    t.tv_nsec -= 1000000000L;
  }
  return t;
}

int es_arena_pool_acquire(es_arena_pool *p, int timeout_ms, es_arena **out) {
  int rc = pool_check(p, "es_arena_pool_acquire");
  if (rc < 0)
    return rc;
  if (out == NULL)
    return es__fail(ES_EINVAL, "es_arena_pool_acquire: out is NULL");

  pool_lock(p);
  if (p->free_top == 0) {
    if (timeout_ms == 0) {
      p->stats.timeouts++;
      pool_unlock(p);
      return es__fail(ES_ETIMEDOUT, "arena pool: all %zu arenas in use (no wait)", p->count);
    }
    /* The deadline is fixed once, so spurious wakeups and arenas taken by
     * others between our wakeup and our relock never extend the wait. */
    struct timespec deadline = timeout_ms > 0 ? pool_deadline(timeout_ms) : (struct timespec){0};
    p->waiters++;
    while (p->free_top == 0) {
      int w = timeout_ms < 0 ? pthread_cond_wait(&p->freed, &p->lock)
                             : pthread_cond_timedwait(&p->freed, &p->lock, &deadline);
      /* On a timeout, an arena freed meanwhile is still taken: the loop
       * condition, not the wait's result, decides. */
      if (w == ETIMEDOUT && p->free_top == 0) {
        p->waiters--;
        p->stats.timeouts++;
        pool_unlock(p);
        return es__fail(ES_ETIMEDOUT, "arena pool: all %zu arenas in use for %d ms", p->count,
                        timeout_ms);
      }
      ES_ASSERT(w == 0 || w == ETIMEDOUT);
    }
    p->waiters--;
    p->stats.waits++;
  }
  es_arena *a = pool_take_locked(p);
  pool_unlock(p);
  pool_hand_out(p, a, out);
  return 0;
}

int es_arena_pool_try_acquire(es_arena_pool *p, es_arena **out) {
  int rc = pool_check(p, "es_arena_pool_try_acquire");
  if (rc < 0)
    return rc;
  if (out == NULL)
    return es__fail(ES_EINVAL, "es_arena_pool_try_acquire: out is NULL");
  pool_lock(p);
  if (p->free_top == 0) {
    p->stats.try_failures++;
    pool_unlock(p);
    return es__fail(ES_EAGAIN, "arena pool: all %zu arenas in use", p->count);
  }
  es_arena *a = pool_take_locked(p);
  pool_unlock(p);
  pool_hand_out(p, a, out);
  return 0;
}

/* ---- release -------------------------------------------------------------------- */

static int pool_refuse_locked(es_arena_pool *p, int err) {
  p->stats.bad_releases++;
  pool_unlock(p);
  return err;
}

int es_arena_pool_release(es_arena_pool *p, es_arena *a) {
  int rc = pool_check(p, "es_arena_pool_release");
  if (rc < 0)
    return rc;
  size_t i = a == NULL ? p->count : pool_slot_index(p, a);

  pool_lock(p);
  if (a == NULL)
    return pool_refuse_locked(p, es__fail(ES_EINVAL, "es_arena_pool_release: arena is NULL"));
  if (i == p->count)
    return pool_refuse_locked(
        p, es__fail(ES_EFOREIGN, "es_arena_pool_release: %p is not one of pool %p's %zu arenas",
                    (void *)a, (void *)p, p->count));
  if (p->slots[i].state != SLOT_ACQUIRED)
    return pool_refuse_locked(
        p, es__fail(ES_EDOUBLEFREE,
                    "es_arena_pool_release: arena %zu of pool %p is not acquired (released "
                    "twice?)",
                    i, (void *)p));
  /* Ours until it is back on the stack: a second release of it is refused,
   * and destroy still sees it in use. */
  p->slots[i].state = SLOT_RETURNING;
  pool_unlock(p);

  size_t peak;
  rc = pool_slot_scrub(p, i, &peak);

  pool_lock(p);
  p->slots[i].state = SLOT_FREE;
  p->free_stack[p->free_top++] = (uint32_t)i;
  p->stats.in_use--;
  if (peak > p->stats.peak_used)
    p->stats.peak_used = peak;
  pthread_cond_signal(&p->freed);
  pool_unlock(p);
  return rc;
}

int es_arena_pool_stats_get(es_arena_pool *p, es_arena_pool_stats *out) {
  int rc = pool_check(p, "es_arena_pool_stats_get");
  if (rc < 0)
    return rc;
  if (out == NULL)
    return es__fail(ES_EINVAL, "es_arena_pool_stats_get: out is NULL");
  pool_lock(p);
  *out = p->stats;
  pool_unlock(p);
  return 0;
}
