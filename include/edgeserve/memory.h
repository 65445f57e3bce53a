/* edgeserve/memory.h - the memory layer: who owns every byte.
 *
 * Three tiers (read-only weights, per-request arenas, per-instance context)
 * and the allocators behind them. Everything here depends on libc only.
 *
 *   // Tier 2: a bounded pool of request arenas, one per in-flight request.
 *   es_arena_pool *pool;
 *   es_arena_pool_create(8, 100 << 20, 64, &pool);
 *   es_arena *a;
 *   if (es_arena_pool_acquire(pool, 50, &a) == ES_ETIMEDOUT) { ...429... }
 *   void *act;
 *   es_arena_alloc(a, 3 << 20, &act);          // bump, 64-byte aligned
 *   es_arena_pool_release(pool, a);           // everything freed at once
 *
 *   // Dynamic shapes: a buddy pool that merges buddies back on free.
 *   es_buddy_config cfg;
 *   es_buddy_config_default(&cfg);
 *   cfg.capacity = 512 << 20;
 *   es_buddy *b;
 *   es_buddy_create(&cfg, &b);
 *   void *t;
 *   es_buddy_alloc(b, 1536 << 10, &t);
 *   es_buddy_free(b, t);
 *
 *   // Tier 1: weights, one read-only copy shared by every process.
 *   es_weights *w;
 *   es_weights_open("model.esm", 0, &w);       // MAP_SHARED, PROT_READ
 *
 * Conventions: every function returns 0 or a negative code from
 * edgeserve/error.h (the detail is in es_last_error_detail()). Functions that
 * create return the object through an out-parameter, which is left untouched on
 * failure. Destroy functions accept NULL. "Thread-safe" means any number of
 * threads may call it on the same object at once; "not thread-safe" means the
 * caller serialises calls on one object.
 */
#ifndef EDGESERVE_MEMORY_H
#define EDGESERVE_MEMORY_H

#include <stddef.h>
#include <stdint.h>

#include "edgeserve/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ===========================================================================
 * Counting layer. Every byte the library takes from the system goes through
 * here, tagged by the subsystem that holds it, so the process can always say
 * what each part holds (like Redis's zmalloc). Thread-safe (atomic counters).
 * ========================================================================= */

#define ES_MEM_TAG_MAP(XX)                                                     \
  XX(ARENA, "arena")                                                           \
  XX(ARENA_POOL, "arena_pool")                                                 \
  XX(BUDDY, "buddy")                                                           \
  XX(SCRATCH, "lane_scratch")                                                  \
  XX(WEIGHTS, "weights")                                                       \
  XX(MODEL, "model")                                                           \
  XX(KERNELS, "kernels")                                                       \
  XX(ENGINE, "engine")                                                         \
  XX(RUNTIME, "runtime")                                                       \
  XX(SERVER, "server")                                                         \
  XX(APPS, "apps")                                                             \
  XX(CLI, "cli")                                                               \
  XX(OTHER, "other")

typedef enum es_mem_tag {
#define ES_MEM_TAG_ENUM_(name, str) ES_MEM_##name,
  ES_MEM_TAG_MAP(ES_MEM_TAG_ENUM_)
#undef ES_MEM_TAG_ENUM_
  ES_MEM_TAG_COUNT
} es_mem_tag;

typedef struct es_mem_stats {
  size_t current;      /* bytes held now (heap + anonymous maps) */
  size_t peak;         /* historic maximum of current */
  size_t file_mapped;  /* bytes of files mapped (not counted in current) */
  uint64_t allocs;     /* successful allocations and maps */
  uint64_t frees;      /* frees and unmaps */
  uint64_t failures;   /* allocations the system refused */
} es_mem_stats;

/* Heap allocation, malloc-like: at least 16-byte aligned. Returns NULL when
 * the system is out of memory, size is 0 or a size computation overflows.
 * The caller owns the block and frees it with es_mem_free. Thread-safe. */
ES_API void *es_mem_alloc(es_mem_tag tag, size_t size);
ES_API void *es_mem_calloc(es_mem_tag tag, size_t n, size_t size);
/* align: power of two up to 4096. */
ES_API void *es_mem_aligned_alloc(es_mem_tag tag, size_t align, size_t size);
/* Like realloc; the block keeps the tag it was allocated with. On failure the
 * old block is untouched and NULL is returned. Not for aligned blocks. */
ES_API void *es_mem_realloc(void *p, size_t size);
ES_API char *es_mem_strdup(es_mem_tag tag, const char *s);
/* Frees a block from any of the above; NULL is a no-op. */
ES_API void es_mem_free(void *p);

/* Anonymous private read-write pages (mmap), counted under tag. size is
 * rounded up to the page size. Returns NULL on failure. Unmap with the same
 * size. Thread-safe. */
ES_API void *es_mem_map(es_mem_tag tag, size_t size);
/* The same at an address that is a multiple of align (a power of two; the
 * page size when smaller): a mapping that starts on 2 MiB can be backed by
 * huge pages from its first byte. NULL also for an align that is not a
 * power of two. Unmap with es_mem_unmap. Thread-safe. */
ES_API void *es_mem_map_aligned(es_mem_tag tag, size_t size, size_t align);
ES_API void es_mem_unmap(es_mem_tag tag, void *p, size_t size);

/* Accounts a file mapping made elsewhere (delta may be negative). */
ES_API void es_mem_account_file(es_mem_tag tag, long long delta);

/* Snapshot of one tag's counters; ES_EINVAL for a bad tag or NULL out. */
ES_API int es_mem_stats_get(es_mem_tag tag, es_mem_stats *out);
/* Bytes held now by all tags together (heap + anonymous maps). */
ES_API size_t es_mem_total(void);
/* "arena", "buddy", ...; "?" for a bad tag. */
ES_API const char *es_mem_tag_name(es_mem_tag tag);

/* ---------------------------------------------------------------------------
 * Allocation-failure injection, for tests (as SQLite tests out-of-memory):
 * while armed, the counting layer numbers every allocation attempt that
 * would reach the system (es_mem_alloc, _calloc, _aligned_alloc, _realloc,
 * _strdup, _map, and so everything built on them: the context allocator,
 * protobuf-c's allocator, arenas, pools, buddy regions) from 1, and makes
 * the fail_at-th one return NULL as if the system had refused it (counted in
 * es_mem_stats.failures). persistent = 0 fails that one only (one-shot:
 * the code must carry the error out while later allocations succeed again);
 * persistent = 1 fails it and every later one (cleanup must not need
 * memory). fail_at = 0 fails nothing: the allocations are only numbered and
 * shown to on_alloc (to count them, or to record where they are made).
 *
 * on_alloc (may be NULL) is called in the allocating thread before the
 * decision, with the attempt's number, tag, size and caller (the return
 * address into the code that called es_mem_*, to tell allocation sites
 * apart); it must not allocate through es_mem_*. The attempts of all
 * threads are numbered in one sequence, so an exact replay needs the other
 * threads quiet.
 *
 * Disarmed (the default), the cost is one relaxed atomic load per
 * allocation. Arming and disarming are thread-safe; arming again restarts
 * the numbering. ES_EINVAL for a NULL cfg. */
typedef struct es_mem_fault_config {
  uint64_t fail_at; /* number of the attempt to fail, from 1; 0: none */
  int persistent;   /* 1: that one and every later one fail */
  void (*on_alloc)(void *user, uint64_t ordinal, es_mem_tag tag, size_t size,
                   const void *caller);
  void *user;
} es_mem_fault_config;

typedef struct es_mem_fault_stats {
  int armed;
  uint64_t calls;    /* attempts numbered since the last arming */
  uint64_t injected; /* of those, failed on purpose */
} es_mem_fault_stats;

ES_API int es_mem_fault_arm(const es_mem_fault_config *cfg);
/* Stop numbering and failing; the stats keep their last values. */
ES_API void es_mem_fault_disarm(void);
ES_API int es_mem_fault_stats_get(es_mem_fault_stats *out);

/* ===========================================================================
 * Request arena (BRIEF §3). A bump allocator: alloc moves a pointer, reset
 * frees everything at once, no per-allocation metadata, no partial free.
 *
 * The struct is public so it can live inside other objects (arena pools,
 * requests); its fields are private: use the functions. Not thread-safe: one
 * request owns an arena at a time.
 *
 * Debug builds (NDEBUG undefined) poison released bytes (0xDD) on reset and
 * rewind, keep a guard of ES_ARENA_GUARD bytes after the usable capacity and
 * check it on reset (ES_ECORRUPT if anything wrote past the end). ASan builds
 * also mark released memory and alignment padding unaddressable.
 * ========================================================================= */

#define ES_ARENA_DEFAULT_ALIGN 64
#define ES_ARENA_MAX_ALIGN 4096
#define ES_ARENA_GUARD 64

typedef struct es_arena {
  uint64_t magic;   /* ES_ARENA_MAGIC while live; anything else is rejected */
  unsigned char *base; /* first usable byte, aligned to align */
  size_t capacity;  /* usable bytes */
  size_t used;      /* bump offset from base */
  size_t peak;      /* max of used since creation or es_arena_peak_reset */
  size_t align;     /* every allocation's alignment */
  uint64_t epoch;   /* bumped by reset, so marks taken before it go stale */
  void *block;      /* what was allocated, if the arena owns it */
  size_t block_size;
  void *owner;      /* the arena pool it belongs to, or NULL */
  uint64_t allocs;  /* allocations since the last reset */
} es_arena;

typedef struct es_arena_mark {
  size_t used;
  uint64_t epoch;
} es_arena_mark;

/* Initialise over a caller-owned block. The usable start is block rounded up
 * to align; in debug builds ES_ARENA_GUARD bytes at the end are the guard. The
 * caller keeps owning the block and must keep it alive until es_arena_fini.
 * align: power of two in [1, 4096], 0 means 64. ES_EINVAL for a bad argument
 * or a block too small to hold anything after alignment and guard. */
ES_API int es_arena_init(es_arena *a, void *block, size_t size, size_t align);
/* Finish an arena from es_arena_init; the magic is cleared so later use is
 * rejected with ES_ECORRUPT. ES_ECORRUPT if a is not a live arena. */
ES_API int es_arena_fini(es_arena *a);

/* Create an arena with capacity usable bytes in memory it maps itself
 * (counted under ES_MEM_ARENA). ES_ENOMEM, ES_EINVAL, ES_EOVERFLOW. */
ES_API int es_arena_create(size_t capacity, size_t align, es_arena **out);
/* Destroy an arena from es_arena_create. NULL is a no-op. */
ES_API void es_arena_destroy(es_arena *a);

/* Allocate size bytes aligned to the arena's alignment. size 0 is allowed and
 * returns a valid, aligned pointer that must not be dereferenced (it consumes
 * no space). O(1).
 * Errors: ES_ECORRUPT (not a live arena), ES_EINVAL (NULL out),
 * ES_EOVERFLOW (size + padding overflows), ES_ENOSPC (not enough space; the
 * detail gives requested, available and missing bytes). *out untouched then. */
ES_API int es_arena_alloc(es_arena *a, size_t size, void **out);

/* Free everything at once: O(1) in release builds (debug builds poison the
 * released bytes). Marks taken before are invalidated. Returns ES_ECORRUPT
 * if a is not a live arena or (debug) the guard was overwritten; the arena is
 * reset and usable even then. */
ES_API int es_arena_reset(es_arena *a);

/* Save the current position; es_arena_rewind rolls back to it, releasing all
 * allocations made since (for scoped temporaries). A mark is valid until the
 * next reset; marks nest (rewinding to an outer mark drops the inner ones).
 * ES_EREWIND if the mark is stale (taken before a reset) or ahead of the
 * current position (the arena was already rewound further). */
ES_API int es_arena_mark_get(const es_arena *a, es_arena_mark *out);
ES_API int es_arena_rewind(es_arena *a, const es_arena_mark *m);

/* Accessors: 0 for a non-live arena. */
ES_API size_t es_arena_used(const es_arena *a);
ES_API size_t es_arena_peak(const es_arena *a);
ES_API size_t es_arena_capacity(const es_arena *a);
ES_API size_t es_arena_available(const es_arena *a);
ES_API int es_arena_peak_reset(es_arena *a);
/* 1 if a is a live, uncorrupted arena. */
ES_API int es_arena_is_valid(const es_arena *a);

/* ===========================================================================
 * Arena pool (BRIEF §4). count arenas of one size, made at creation; count is
 * the hard bound on concurrent requests. All functions are thread-safe.
 * ========================================================================= */

typedef struct es_arena_pool es_arena_pool;

typedef struct es_arena_pool_stats {
  size_t count;          /* arenas in the pool */
  size_t arena_capacity; /* usable bytes per arena */
  size_t in_use;         /* acquired now */
  size_t high_water;     /* max of in_use */
  uint64_t acquires;     /* successful acquires */
  uint64_t waits;        /* acquires that had to wait */
  uint64_t timeouts;     /* acquires that gave up (ES_ETIMEDOUT) */
  uint64_t try_failures; /* try_acquire calls that found none (ES_EAGAIN) */
  uint64_t bad_releases; /* double or foreign releases refused */
  size_t peak_used;      /* largest arena peak seen at release */
} es_arena_pool_stats;

/* count in [1, 65536]; arena_capacity > 0; align as es_arena_init. The
 * memory is one mapping counted under ES_MEM_ARENA_POOL.
 * ES_EINVAL, ES_EOVERFLOW, ES_ENOMEM. */
ES_API int es_arena_pool_create(size_t count, size_t arena_capacity, size_t align,
                         es_arena_pool **out);
/* Refuses with ES_EBUSY while arenas are acquired (the pool is kept). NULL
 * is a no-op returning 0. */
ES_API int es_arena_pool_destroy(es_arena_pool *p);

/* Take a free arena, already reset. Waits on a condition variable (never
 * polls) up to timeout_ms milliseconds; timeout_ms < 0 waits forever, 0 does
 * not wait. ES_ETIMEDOUT when none became free in time. */
ES_API int es_arena_pool_acquire(es_arena_pool *p, int timeout_ms, es_arena **out);
/* Never blocks. ES_EAGAIN when none is free. */
ES_API int es_arena_pool_try_acquire(es_arena_pool *p, es_arena **out);
/* Return an acquired arena and wake one waiter. ES_EFOREIGN for an arena of
 * another pool or none, ES_EDOUBLEFREE for an arena not currently acquired.
 * The arena is reset on release; ES_ECORRUPT if its guard was overwritten
 * (it is still returned to the pool). */
ES_API int es_arena_pool_release(es_arena_pool *p, es_arena *a);

ES_API int es_arena_pool_stats_get(es_arena_pool *p, es_arena_pool_stats *out);

/* ===========================================================================
 * Buddy pool with size-class slabs (BRIEF §7-8). One region reserved at
 * creation (more when growth is on); power-of-two blocks from min_block up;
 * a free list per level; split on demand; buddies merged on free, so
 * fragmentation heals itself. Requests up to slab_max bytes are served from
 * fixed-size slots in slabs carved out of min_block-sized buddy blocks; a slab
 * returns to the buddy levels as soon as it is empty. All functions are
 * thread-safe (one mutex per pool).
 * ========================================================================= */

typedef struct es_buddy es_buddy;
typedef struct es_buddy_stats es_buddy_stats;

/* Called (with the pool's lock released) the first time the peak of
 * bytes_in_use crosses watermark_ratio x capacity. */
typedef void (*es_buddy_watermark_fn)(void *user, const es_buddy_stats *stats);

typedef struct es_buddy_config {
  size_t capacity;        /* bytes of the first region; rounded down to a
                             multiple of min_block (default 64 MiB) */
  size_t min_block;       /* smallest buddy block, power of two >= 4096
                             (default 64 KiB) */
  size_t align;           /* alignment of the base and of every block, power
                             of two in [16, min_block] (default 256) */
  size_t slab_max;        /* requests <= this are served from size-class
                             slabs (each slab one buddy block of at least
                             min_block bytes); 0 disables
                             slabs (default 256 KiB) */
  int grow;               /* add regions when full (default 0) */
  size_t grow_max;        /* cap on total capacity when growing (default 0:
                             4 x capacity) */
  double watermark_ratio; /* default 0.85 */
  es_buddy_watermark_fn on_watermark; /* may be NULL */
  void *user;             /* passed to on_watermark */
} es_buddy_config;

struct es_buddy_stats {
  size_t capacity;        /* bytes in all regions */
  size_t regions;         /* regions reserved (1 + growths) */
  size_t bytes_in_use;    /* bytes handed out: the block or slot size of each
                             live allocation (after rounding) */
  size_t bytes_requested; /* sum of the sizes asked for by live allocations */
  size_t peak_in_use;     /* historic maximum of bytes_in_use */
  size_t free_bytes;      /* bytes in free buddy blocks (free slab slots are
                             not counted: they serve only their class) */
  size_t largest_free;    /* largest free buddy block */
  double fragmentation;   /* 1 - largest_free / min(free_bytes, largest top
                             block): 0 when free memory forms the largest
                             block it could (regions and the power-of-two
                             chunks of a region never merge); 0 when nothing
                             is free */
  uint64_t allocs;        /* successful allocations */
  uint64_t frees;         /* successful frees */
  uint64_t failures;      /* allocations that failed */
  uint64_t invalid_frees; /* frees refused (foreign, double, interior) */
  uint64_t splits;        /* block splits */
  uint64_t merges;        /* buddy merges */
  uint64_t growths;       /* regions added */
  size_t live_blocks;     /* live allocations */
  size_t slabs;           /* slabs currently carved */
  int watermark_crossed;  /* 1 once the watermark callback has fired */
  uint64_t purges;        /* es_buddy_purge calls */
  size_t purged_bytes;    /* bytes they gave back to the kernel, in total */
  size_t max_block;       /* the largest block an allocation could get if
                             every block were free: the largest top block
                             of the regions, or of a region growth may still
                             add; a larger request can never succeed */
};

/* Fill a config with the defaults above. */
ES_API void es_buddy_config_default(es_buddy_config *cfg);

/* The region(s) are mapped and counted under ES_MEM_BUDDY.
 * ES_EINVAL for a bad config (the detail names the field), ES_ENOMEM. */
ES_API int es_buddy_create(const es_buddy_config *cfg, es_buddy **out);
/* Unmaps everything, live blocks included. NULL is a no-op. */
ES_API void es_buddy_destroy(es_buddy *b);

/* size in [1, largest block]. ES_EINVAL (size 0 or NULL out), ES_ENOSPC (no
 * block large enough and growth off or capped; detail gives requested,
 * free and largest free bytes), ES_ENOMEM (growth failed), ES_EOVERFLOW.
 * The block is aligned to cfg.align. */
ES_API int es_buddy_alloc(es_buddy *b, size_t size, void **out);
/* ES_EFOREIGN (not in any region of this pool), ES_EBADPTR (interior
 * pointer), ES_EDOUBLEFREE (block already free). The pool is unchanged when
 * a free is refused. NULL is ES_EINVAL. */
ES_API int es_buddy_free(es_buddy *b, void *p);
/* Bytes usable at p (the block or slot size). ES_EFOREIGN etc. as free. */
ES_API int es_buddy_usable_size(es_buddy *b, const void *p, size_t *out);

ES_API int es_buddy_stats_get(es_buddy *b, es_buddy_stats *out);
/* Gives back to the kernel (MADV_DONTNEED) the written pages of free memory
 * that was freed at least min_age calls ago (tracked per min_block unit), so
 * the pool's RSS follows what it used over the last min_age periods rather
 * than the most it ever used; memory reused more often keeps its pages and
 * never faults again. Call it periodically (the runtime's monitor does: every
 * buddy_decay_ms / 10 with min_age 10). min_age 0 gives back every written
 * free page. Holds the pool's lock while it runs (one madvise per run of
 * such units). *purged (may be NULL): bytes given back.
 * ES_EINVAL, ES_EIO (madvise failed; the runs already given back stay so). */
ES_API int es_buddy_purge(es_buddy *b, unsigned min_age, size_t *purged);
/* Checks every internal invariant (free lists, bitmaps, counters); returns 0
 * or ES_ECORRUPT with a detail. O(capacity / min_block); for tests. */
ES_API int es_buddy_check(es_buddy *b);

/* ===========================================================================
 * Read-only weight region (BRIEF §2, tier 1). Either anonymous memory that is
 * written once at load and then sealed read-only (mprotect), so any later
 * write faults at once; or a file mapped PROT_READ + MAP_SHARED, so every
 * process mapping it shares the same physical pages. Reference-counted: the
 * same file (device, inode, size, mtime) opened twice in one process maps
 * once. All functions are thread-safe.
 * ========================================================================= */

typedef struct es_weights es_weights;

enum {
  ES_WEIGHTS_MLOCK = 1 << 0, /* lock the pages in RAM (ES_EMEMLOCK if
                                RLIMIT_MEMLOCK is too low) */
};

/* Anonymous region of size bytes (page-rounded), writable until sealed.
 * Counted under ES_MEM_WEIGHTS. The caller holds one reference. */
ES_API int es_weights_create(size_t size, es_weights **out);
/* Writable pointer before es_weights_seal; ES_ESTATE after (or for a file).
 * Not thread-safe with seal. */
ES_API int es_weights_data_mut(es_weights *w, void **out);
/* mprotect(PROT_READ). Idempotent. ES_ESTATE for file regions (always
 * read-only). */
ES_API int es_weights_seal(es_weights *w);

/* Map a file read-only and shared. flags: ES_WEIGHTS_MLOCK. If the same file
 * is already mapped, returns it with one more reference. ES_ENOENT, ES_EACCES,
 * ES_EINVAL (empty or not a regular file), ES_ENOMEM, ES_EMEMLOCK. */
ES_API int es_weights_open(const char *path, int flags, es_weights **out);

/* Lock pages in RAM. ES_EMEMLOCK names RLIMIT_MEMLOCK and the sizes.
 * Idempotent. Thread-safe. */
ES_API int es_weights_lock(es_weights *w);
/* Bytes of all regions of the process locked in RAM now (each region's
 * page-rounded mapping, counted once however many lock it). Thread-safe. */
ES_API size_t es_weights_locked_bytes(void);

/* One more reference; returns w, or NULL (no reference taken) for NULL or
 * a handle that is not live. */
ES_API es_weights *es_weights_retain(es_weights *w);
/* Drop a reference; the last one unmaps. NULL is a no-op. */
ES_API void es_weights_release(es_weights *w);

/* Read-only view (valid while a reference is held). NULL for a bad handle. */
ES_API const void *es_weights_data(const es_weights *w);
ES_API size_t es_weights_size(const es_weights *w);
ES_API int es_weights_is_sealed(const es_weights *w);
ES_API int es_weights_refcount(const es_weights *w);
/* Pages of the mapping resident in RAM (mincore), in bytes. */
ES_API int es_weights_resident(const es_weights *w, size_t *out);

/* ===========================================================================
 * Process memory as the kernel sees it (/proc/self). Thread-safe.
 * ========================================================================= */

/* Resident set size now (VmRSS), in bytes. */
ES_API int es_sys_rss(size_t *out);
/* Peak resident set size (VmHWM), in bytes. */
ES_API int es_sys_peak_rss(size_t *out);
/* Reset the peak to the current RSS (writes 5 to /proc/self/clear_refs).
 * ES_ENOTSUP where the kernel does not allow it. */
ES_API int es_sys_peak_rss_reset(void);
/* Proportional set size of the mapping that contains addr (smaps), bytes. */
ES_API int es_sys_pss_of(const void *addr, size_t *out);

/* ===========================================================================
 * Where the process stands: its memory cgroup, or the whole machine (BRIEF
 * §5). The kernel acts at the cgroup's limits (memory.high: reclaim and
 * throttling; memory.max: OOM inside the group), so the admission gate reads
 * them to refuse work before the kernel steps in.
 *
 *   es_memstat st;
 *   if (es_memstat_read(&st) == 0 && st.max != SIZE_MAX)
 *     printf("%s: %zu of %zu B\n", st.path, st.current, st.max);
 *
 * Which group: the process's own (from /proc/self/cgroup), or, when one of
 * its ancestors has a limit with less headroom left (max - current), that
 * ancestor: a parent's limit binds its children. cgroup v2 is tried first,
 * then the v1 memory controller; version 0 means neither is there (or the
 * process sits in a root group without memory files) and the numbers come
 * from /proc/meminfo alone. A group path that does not exist under the mount
 * (a container that mounts its own group as the root) falls back to the
 * mount's root. Thread-safe; reads a handful of small files and keeps
 * nothing.
 * ========================================================================= */

#define ES_MEMSTAT_PATH_MAX 512

typedef struct es_memstat {
  int version;          /* 0 no memory cgroup found, 1 cgroup v1, 2 cgroup v2 */
  size_t current;       /* bytes charged to the group (v2 memory.current, v1
                           memory.usage_in_bytes), page cache included;
                           version 0: MemTotal - MemAvailable */
  size_t inactive_file; /* of current, inactive page cache the kernel can
                           drop first (memory.stat inactive_file, v1
                           total_inactive_file); 0 for version 0 */
  size_t high;          /* soft limit: v2 memory.high, v1
                           memory.soft_limit_in_bytes; SIZE_MAX when none */
  size_t max;           /* hard limit: v2 memory.max, v1
                           memory.limit_in_bytes; SIZE_MAX when none */
  struct {
    uint64_t low;       /* v2 memory.events "low" (0 on v1) */
    uint64_t high;      /* times usage went over high (0 on v1) */
    uint64_t max;       /* times usage hit max (v1: memory.failcnt) */
    uint64_t oom;       /* times the group ran out at max (0 on v1) */
    uint64_t oom_kill;  /* processes the OOM killer killed in the group (v1:
                           memory.oom_control oom_kill, kernel >= 4.13) */
  } events;             /* cumulative counters since the group was made */
  size_t mem_available; /* /proc/meminfo MemAvailable (MemFree on kernels
                           without it); 0 if meminfo could not be read while
                           a cgroup limit was found */
  size_t mem_total;     /* /proc/meminfo MemTotal; 0 likewise */
  char path[ES_MEMSTAT_PATH_MAX]; /* the group directory the numbers come
                                     from; "" for version 0 */
} es_memstat;

/* Read the live state: the cgroup mounts are found in /proc/self/mountinfo
 * (defaults /sys/fs/cgroup/memory and /sys/fs/cgroup or
 * /sys/fs/cgroup/unified). Errors as es_memstat_read_at; *out untouched on
 * failure. */
ES_API int es_memstat_read(es_memstat *out);

/* Same from given files, for tests and unusual mounts. Any path may be NULL
 * (that source is absent). cgroup_root_v1_memory is the v1 memory
 * controller's mount, cgroup_root_v2 the v2 mount.
 * Errors: ES_EINVAL (NULL out, a path too long), ES_EIO (a file that exists
 * but is malformed: the detail names the file and what was wrong),
 * ES_ENOTSUP (no cgroup limit found and /proc/meminfo unreadable).
 * A missing /proc/self/cgroup means no cgroups (version 0). */
ES_API int es_memstat_read_at(const char *proc_self_cgroup, const char *cgroup_root_v1_memory,
                       const char *cgroup_root_v2, const char *proc_meminfo,
                       es_memstat *out);

#ifdef __cplusplus
}
#endif
#endif
