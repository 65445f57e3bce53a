/* Buddy pool with size-class slabs (BRIEF §7-8).
 *
 * Blocks. A region is capacity bytes cut into units of min_block. A block of
 * level k is 2^k units, starting at a unit offset (from the region base) that
 * is a multiple of 2^k, so its buddy is at offset ^ 2^k. A capacity that is
 * not a power of two is covered by its binary decomposition, largest chunk
 * first: every chunk is then aligned to its own size and is a top block with
 * no buddy. A merge is allowed exactly when the merged block ends inside the
 * region (an aligned block that ends inside the region never straddles two
 * chunks), so no per-chunk bookkeeping is needed.
 *
 * Metadata lives outside the blocks, in a side table with one es_unit (16 B)
 * per unit, indexed by a global unit number (regions take consecutive ranges).
 * The first unit of a block is its head (level and state: free, used, slab);
 * the other units are interior. User writes can never corrupt the allocator,
 * and the memory handed out stays plain tensor memory. Free blocks sit on one
 * doubly linked list per level whose links are unit indices in the side table,
 * so taking a buddy off its list when merging is O(1), and a bitmask of the
 * non-empty levels finds the smallest fitting level with one ctz. Alloc and
 * free are O(levels): at most one split or merge per level.
 *
 * Pointer validation needs no search: find the region (a handful, scanned),
 * then the containing block is the first head met when rounding the unit
 * down to 2^0, 2^1, ... units (heads partition the region). Its state tells a
 * live block from an interior pointer or a double free. A pointer into free
 * memory counts as a double free when it is aligned (it may well have been
 * handed out before) and as an interior pointer when it is not (it never was).
 *
 * Slabs. Requests up to slab_max are rounded to size classes, four per power
 * of two (sizes 5/4, 6/4, 7/4, 8/4 of the power below, then rounded up to
 * align, so the waste is at most about 25% plus alignment instead of the
 * buddy's 50%). The smallest slot is max(64, align, min_block / 4096) bytes,
 * so a min_block slab has at most 4096 slots. Each slab is one buddy block:
 * the smallest of at least min_block holding 8 slots, but no larger than an
 * eighth of the first region's largest top block; a class whose slab would
 * then hold fewer than 4 slots, or whose slot is itself a buddy block size
 * (a power of two >= min_block), is served by a buddy block directly. A slab
 * descriptor (kept on the heap, never in the slab) holds a two-level free-slot
 * bitmap (a summary word over at most 64 words: O(1) slot search) and each
 * slot's requested size. Slabs with a free slot sit on their class's partial
 * list; an empty slab goes back to the buddy levels at once, so freeing
 * everything always coalesces back to the top blocks. Released descriptors
 * are kept per class for reuse, so a slab's birth costs no malloc in steady
 * state.
 *
 * ASan builds keep every free byte (free blocks, free slots, slab tails)
 * unaddressable, so a use after free is caught at once, and so is an overrun
 * into free memory.
 *
 * Purge. Every unit remembers whether its pages were written since they were
 * mapped or last given back (dirty) and when it was last freed (an epoch:
 * the count of purge calls). es_buddy_purge(min_age) gives back, with one
 * madvise per run, the dirty units of free blocks freed at least min_age
 * calls ago, so RSS follows the units used over the last min_age periods
 * rather than the most the pool ever used, and the units the hot path keeps
 * reusing never fault again. The state is per unit, not per block, because
 * blocks split and merge all the time: a merged block may hold a unit freed
 * a moment ago next to one idle for an hour, and only the second should go.
 *
 * Growth adds a region of max(block, capacity / 4) bytes, capped by grow_max;
 * the unit table is reallocated to cover it (links are indices, so they
 * survive the move). One mutex per pool guards everything; the watermark
 * callback runs after it is released, with a stats snapshot. */
#include "edgeserve/memory.h"
#include "common/internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define ES_BUDDY_NIL UINT32_MAX
#define ES_BUDDY_LEVELS 64
#define ES_BUDDY_MAX_REGIONS 64
#define ES_BUDDY_MAX_MIN_BLOCK ((size_t)1 << 30)
#define ES_BUDDY_MAX_SLAB_MAX ((size_t)1 << 30)
#define ES_SLAB_TARGET_SLOTS 8
#define ES_SLAB_MIN_SLOTS 4
#define ES_SLAB_MAX_SLOTS 4096
#define ES_SLAB_MIN_SLOT 64

/* ---- types ------------------------------------------------------------------ */

enum { UNIT_INTERIOR = 0, UNIT_FREE = 1, UNIT_USED = 2, UNIT_SLAB = 3 };

typedef struct es_slab es_slab;

typedef struct es_unit {
  union {
    struct {
      uint32_t next, prev; /* UNIT_FREE: neighbours on its level's list */
    } link;
    size_t req;    /* UNIT_USED: bytes asked for */
    es_slab *slab; /* UNIT_SLAB: the slab's descriptor */
  } u;
  uint8_t level;  /* heads only: the block is 2^level units */
  uint8_t state;  /* UNIT_* */
  uint8_t region; /* index of the region holding the unit (every unit) */
  uint8_t dirty;  /* every unit: written since mapped or purged */
  uint32_t epoch; /* every unit: b->epoch when it was last freed */
} es_unit;

typedef struct es_region {
  void *map;           /* what es_mem_map returned */
  size_t map_size;     /* what was mapped (size plus alignment slack) */
  unsigned char *base; /* first byte, aligned to cfg.align */
  size_t size;         /* usable bytes, a multiple of min_block */
  uint32_t first;      /* global index of its first unit */
  uint32_t units;      /* size / min_block */
} es_region;

struct es_slab {
  es_slab *next, *prev; /* class partial list (or spare list: next only) */
  unsigned char *base;  /* first slot */
  uint32_t *req;        /* requested bytes per slot (live slots only) */
  uint32_t unit;        /* global index of the slab block's head */
  uint32_t nfree;       /* free slots */
  uint32_t cls;         /* index into es_buddy.classes */
  uint64_t summary;     /* bit w set: words[w] has a free slot */
  uint64_t words[];     /* bit set: slot free */
};

typedef struct es_slab_class {
  size_t slot;      /* slot bytes, a multiple of cfg.align */
  uint32_t nslots;  /* slots per slab; 0: served by a buddy block directly */
  uint8_t level;    /* buddy level of the slab block */
  es_slab *partial; /* slabs with at least one free slot */
  es_slab *spare;   /* descriptors of released slabs, reused first */
} es_slab_class;

struct es_buddy {
  pthread_mutex_t lock;
  es_buddy_config cfg; /* validated copy; capacity rounded down */
  unsigned shift;      /* log2(min_block) */
  size_t grow_max;     /* effective cap on capacity (0 when growth is off) */

  es_region regions[ES_BUDDY_MAX_REGIONS];
  size_t nregions;
  es_unit *units; /* side table, nunits entries */
  uint32_t nunits;

  uint32_t heads[ES_BUDDY_LEVELS]; /* free list heads (unit index or NIL) */
  uint64_t nonempty;               /* bit k: heads[k] != NIL */

  es_slab_class *classes;
  size_t nclasses;
  uint16_t *bin_class; /* size bin (see size_bin) -> class index */
  size_t nbins;

  size_t capacity, in_use, requested, peak, free_bytes, live, slabs;
  uint32_t epoch;      /* purge calls so far */
  uint64_t purged;     /* bytes given back by purges, in total */
  size_t watermark_at; /* peak >= this fires the callback */
  uint64_t allocs, frees, failures, invalid_frees, splits, merges, growths;
  int watermark_crossed;
};

/* What a pointer resolves to: a live buddy block (slab NULL) or a live slot. */
typedef struct es_ref {
  uint32_t unit;
  es_slab *slab;
  uint32_t slot;
} es_ref;

/* ---- small helpers ---------------------------------------------------------- */

static size_t block_bytes(const es_buddy *b, unsigned level) {
  return (size_t)1 << (b->shift + level);
}

static unsigned log2_floor(uint64_t x) { return 63u - (unsigned)__builtin_clzll(x); }

static unsigned log2_ceil(uint64_t x) {
  return x <= 1 ? 0 : 64u - (unsigned)__builtin_clzll(x - 1);
}

static unsigned char *unit_addr(const es_buddy *b, uint32_t g) {
  const es_region *r = &b->regions[b->units[g].region];
  return r->base + ((size_t)(g - r->first) << b->shift);
}

/* Level of the block for size bytes; ES_EOVERFLOW if its size would not fit
 * in a size_t. size > 0. */
static int size_level(const es_buddy *b, size_t size, unsigned *out) {
  uint64_t units = (((uint64_t)size - 1) >> b->shift) + 1;
  unsigned level = log2_ceil(units);
  if (b->shift + level >= sizeof(size_t) * 8)
    return es__fail(ES_EOVERFLOW, "buddy alloc: %zu B rounds up to a block of 2^%u B", size,
                    b->shift + level);
  *out = level;
  return 0;
}

/* Four bins per power of two: bin upper bounds 16, 20, 24, 28, 32, 40, ... */
static size_t size_bin(size_t size) {
  uint64_t v = (size < 16 ? 16 : size) - 1;
  unsigned k = log2_floor(v);
  return (size_t)(k - 3) * 4 + ((v >> (k - 2)) & 3);
}

static size_t bin_size(size_t bin) { return (size_t)(5 + (bin & 3)) << ((bin >> 2) + 1); }

static size_t largest_free(const es_buddy *b) {
  return b->nonempty ? block_bytes(b, log2_floor(b->nonempty)) : 0;
}

static void stats_fill(const es_buddy *b, es_buddy_stats *s) {
  memset(s, 0, sizeof *s);
  s->capacity = b->capacity;
  s->regions = b->nregions;
  s->bytes_in_use = b->in_use;
  s->bytes_requested = b->requested;
  s->peak_in_use = b->peak;
  s->free_bytes = b->free_bytes;
  s->largest_free = largest_free(b);
  /* Free memory can never form a block larger than the largest top block
   * (regions, and the power-of-two chunks of a region, never merge), so that
   * is the most a fully healed pool can offer. */
  size_t top = 0;
  for (size_t r = 0; r < b->nregions; r++) {
    size_t t = (size_t)1 << log2_floor(b->regions[r].units);
    if ((t << b->shift) > top)
      top = t << b->shift;
  }
  size_t ideal = b->free_bytes < top ? b->free_bytes : top;
  s->fragmentation = ideal ? 1.0 - (double)s->largest_free / (double)ideal : 0.0;
  /* Growth adds a region holding any block up to the room left (pool_grow). */
  s->max_block = top;
  if (b->cfg.grow && b->nregions < ES_BUDDY_MAX_REGIONS && b->grow_max > b->capacity) {
    size_t room = (b->grow_max - b->capacity) & ~(b->cfg.min_block - 1);
    if (room && ((size_t)1 << log2_floor(room)) > s->max_block)
      s->max_block = (size_t)1 << log2_floor(room);
  }
  s->allocs = b->allocs;
  s->frees = b->frees;
  s->failures = b->failures;
  s->invalid_frees = b->invalid_frees;
  s->splits = b->splits;
  s->merges = b->merges;
  s->growths = b->growths;
  s->live_blocks = b->live;
  s->slabs = b->slabs;
  s->watermark_crossed = b->watermark_crossed;
  s->purges = b->epoch;
  s->purged_bytes = b->purged;
}

/* Smallest size_t >= ratio * capacity, so "peak >= watermark_at" is exactly
 * "peak >= ratio x capacity". */
static void watermark_update(es_buddy *b) {
  double t = b->cfg.watermark_ratio * (double)b->capacity;
  size_t at = (size_t)t;
  if ((double)at < t)
    at++;
  b->watermark_at = at;
}

/* ---- free lists ------------------------------------------------------------- */

static void list_push(es_buddy *b, unsigned k, uint32_t g) {
  es_unit *u = &b->units[g];
  u->state = UNIT_FREE;
  u->level = (uint8_t)k;
  u->u.link.prev = ES_BUDDY_NIL;
  u->u.link.next = b->heads[k];
  if (b->heads[k] != ES_BUDDY_NIL)
    b->units[b->heads[k]].u.link.prev = g;
  b->heads[k] = g;
  b->nonempty |= (uint64_t)1 << k;
}

static void list_remove(es_buddy *b, unsigned k, uint32_t g) {
  es_unit *u = &b->units[g];
  uint32_t n = u->u.link.next, p = u->u.link.prev;
  if (p != ES_BUDDY_NIL)
    b->units[p].u.link.next = n;
  else
    b->heads[k] = n;
  if (n != ES_BUDDY_NIL)
    b->units[n].u.link.prev = p;
  if (b->heads[k] == ES_BUDDY_NIL)
    b->nonempty &= ~((uint64_t)1 << k);
}

/* ---- regions ---------------------------------------------------------------- */

/* Map a region of size bytes (a multiple of min_block), extend the unit table
 * over it and put its binary decomposition on the free lists. */
static int region_add(es_buddy *b, size_t size) {
  if (b->nregions == ES_BUDDY_MAX_REGIONS)
    return es__fail(ES_ENOSPC, "buddy pool: region limit (%d) reached", ES_BUDDY_MAX_REGIONS);
  size_t units = size >> b->shift;
  ES_ASSERT(units > 0 && units <= (size_t)(ES_BUDDY_NIL - 1) - b->nunits);

  /* mmap gives page alignment; larger alignments need slack to round up. */
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t slack = b->cfg.align > page ? b->cfg.align : 0;
  if (size > SIZE_MAX - slack)
    return es__fail(ES_EOVERFLOW, "buddy pool: region of %zu B overflows", size);
  size_t map_size = size + slack;
  void *map = es_mem_map(ES_MEM_BUDDY, map_size);
  if (!map)
    return es__fail(ES_ENOMEM, "buddy pool: mapping a region of %zu B failed", map_size);

  size_t total = (size_t)b->nunits + units;
  es_unit *table = b->units ? es_mem_realloc(b->units, total * sizeof *table)
                            : es_mem_alloc(ES_MEM_BUDDY, total * sizeof *table);
  if (!table) {
    es_mem_unmap(ES_MEM_BUDDY, map, map_size);
    return es__fail(ES_ENOMEM, "buddy pool: unit table of %zu entries", total);
  }
  b->units = table;

  es_region *r = &b->regions[b->nregions];
  r->map = map;
  r->map_size = map_size;
  r->base = (unsigned char *)es__align_up((uintptr_t)map, b->cfg.align);
  r->size = size;
  r->first = b->nunits;
  r->units = (uint32_t)units;
  memset(&table[r->first], 0, units * sizeof *table);
  for (size_t i = 0; i < units; i++)
    table[r->first + i].region = (uint8_t)b->nregions;
  b->nregions++;
  b->nunits = (uint32_t)total;

  /* Largest chunk first keeps each chunk aligned to its own size. */
  uint32_t off = 0;
  for (int k = 31; k >= 0; k--) {
    if (units & ((size_t)1 << k)) {
      list_push(b, (unsigned)k, r->first + off);
      off += (uint32_t)1 << k;
    }
  }
  ES_POISON(r->base, size);
  b->capacity += size;
  b->free_bytes += size;
  watermark_update(b);
  return 0;
}

static es_region *region_of(es_buddy *b, const void *p) {
  uintptr_t a = (uintptr_t)p;
  for (size_t i = 0; i < b->nregions; i++)
    if (a - (uintptr_t)b->regions[i].base < b->regions[i].size)
      return &b->regions[i];
  return NULL;
}

static int fail_nospc(es_buddy *b, size_t size, unsigned level, const char *why) {
  return es__fail(ES_ENOSPC,
                  "buddy pool exhausted: requested %zu B (block %zu B), free %zu B, largest "
                  "free %zu B%s",
                  size, block_bytes(b, level), b->free_bytes, largest_free(b), why);
}

/* Add a region able to hold a block of the given level: max(block, capacity
 * / 4) bytes, capped so the capacity stays within grow_max. */
static int pool_grow(es_buddy *b, size_t size, unsigned level) {
  if (!b->cfg.grow)
    return fail_nospc(b, size, level, "");
  size_t need = block_bytes(b, level);
  size_t room = b->grow_max > b->capacity ? b->grow_max - b->capacity : 0;
  room &= ~(b->cfg.min_block - 1);
  size_t want = b->capacity / 4 > need ? b->capacity / 4 : need;
  want = es__align_up(want, b->cfg.min_block);
  if (want == 0 || want > room)
    want = room;
  if (want < need) {
    char why[96];
    snprintf(why, sizeof why, "; growth capped at grow_max %zu B", b->grow_max);
    return fail_nospc(b, size, level, why);
  }
  int rc = region_add(b, want);
  if (rc == 0)
    b->growths++;
  return rc;
}

/* ---- blocks ----------------------------------------------------------------- */

/* Take a block of the given level off the free lists, splitting a larger one
 * (and growing the pool) if needed. The head is left for the caller to mark. */
static int block_get(es_buddy *b, size_t size, unsigned level, uint32_t *out) {
  uint64_t fit = level < ES_BUDDY_LEVELS ? b->nonempty & (~(uint64_t)0 << level) : 0;
  if (!fit) {
    int rc = pool_grow(b, size, level);
    if (rc < 0)
      return rc;
    fit = b->nonempty & (~(uint64_t)0 << level);
    ES_ASSERT(fit);
  }
  unsigned k = (unsigned)__builtin_ctzll(fit);
  uint32_t g = b->heads[k];
  ES_ASSERT(b->units[g].state == UNIT_FREE && b->units[g].level == k);
  list_remove(b, k, g);
  while (k > level) {
    k--;
    list_push(b, k, g + ((uint32_t)1 << k));
    b->splits++;
  }
  b->units[g].level = (uint8_t)level;
  b->free_bytes -= block_bytes(b, level);
  *out = g;
  return 0;
}

/* Return the block headed by unit g, merging with free buddies level by level
 * while the merged block stays inside the region. */
static void block_put(es_buddy *b, uint32_t g) {
  const es_region *r = &b->regions[b->units[g].region];
  unsigned level = b->units[g].level;
  uint32_t off = g - r->first;
  ES_POISON(r->base + ((size_t)off << b->shift), block_bytes(b, level));
  b->free_bytes += block_bytes(b, level);
  b->units[g].state = UNIT_INTERIOR;
  for (uint32_t i = 0; i < ((uint32_t)1 << level); i++) { /* written, idle from now */
    b->units[g + i].dirty = 1;
    b->units[g + i].epoch = b->epoch;
  }
  for (;;) {
    uint64_t half = (uint64_t)1 << level;
    uint64_t merged = off & ~half;
    if (merged + 2 * half > r->units)
      break;
    es_unit *bu = &b->units[r->first + (off ^ (uint32_t)half)];
    if (bu->state != UNIT_FREE || bu->level != level)
      break;
    list_remove(b, level, r->first + (off ^ (uint32_t)half));
    bu->state = UNIT_INTERIOR;
    off = (uint32_t)merged;
    level++;
    b->merges++;
  }
  list_push(b, level, r->first + off);
}

static int block_alloc(es_buddy *b, size_t size, void **out, size_t *usable) {
  unsigned level = 0;
  int rc = size_level(b, size, &level);
  if (rc < 0)
    return rc;
  uint32_t g;
  rc = block_get(b, size, level, &g);
  if (rc < 0)
    return rc;
  es_unit *u = &b->units[g];
  u->state = UNIT_USED;
  u->u.req = size;
  *out = unit_addr(b, g);
  *usable = block_bytes(b, level);
  ES_UNPOISON(*out, *usable);
  return 0;
}

/* ---- slabs ------------------------------------------------------------------ */

/* Build the size classes for slab_max (see the design note). top is the
 * first region's largest top block, which bounds the slab block. */
static int classes_build(es_buddy *b) {
  size_t min_slot = ES_SLAB_MIN_SLOT;
  if (min_slot < b->cfg.align)
    min_slot = b->cfg.align;
  if (min_slot < b->cfg.min_block / ES_SLAB_MAX_SLOTS)
    min_slot = b->cfg.min_block / ES_SLAB_MAX_SLOTS;

  unsigned top_level = log2_floor(b->capacity >> b->shift);
  unsigned cap_level = top_level > 3 ? top_level - 3 : 0;

  b->nbins = size_bin(b->cfg.slab_max) + 1;
  b->bin_class = es_mem_alloc(ES_MEM_BUDDY, b->nbins * sizeof *b->bin_class);
  b->classes = es_mem_calloc(ES_MEM_BUDDY, b->nbins, sizeof *b->classes);
  if (!b->bin_class || !b->classes)
    return es__fail(ES_ENOMEM, "buddy pool: size class tables");

  size_t n = 0;
  for (size_t bin = 0; bin < b->nbins; bin++) {
    size_t slot = es__align_up(bin_size(bin), b->cfg.align);
    if (slot < min_slot)
      slot = min_slot;
    if (n == 0 || b->classes[n - 1].slot != slot) {
      es_slab_class *c = &b->classes[n++];
      c->slot = slot;
      if (!(es__is_pow2(slot) && slot >= b->cfg.min_block)) {
        unsigned level = log2_ceil((ES_SLAB_TARGET_SLOTS * (uint64_t)slot + b->cfg.min_block - 1)
                                   >> b->shift);
        if (level > cap_level)
          level = cap_level;
        size_t nslots = block_bytes(b, level) / slot;
        if (nslots >= ES_SLAB_MIN_SLOTS) {
          ES_ASSERT(nslots <= ES_SLAB_MAX_SLOTS);
          c->nslots = (uint32_t)nslots;
          c->level = (uint8_t)level;
        }
      }
    }
    b->bin_class[bin] = (uint16_t)(n - 1);
  }
  b->nclasses = n;
  return 0;
}

static void partial_push(es_slab_class *c, es_slab *s) {
  s->prev = NULL;
  s->next = c->partial;
  if (c->partial)
    c->partial->prev = s;
  c->partial = s;
}

static void partial_remove(es_slab_class *c, es_slab *s) {
  if (s->prev)
    s->prev->next = s->next;
  else
    c->partial = s->next;
  if (s->next)
    s->next->prev = s->prev;
}

static size_t slab_words(uint32_t nslots) { return (nslots + 63) / 64; }

/* Carve a new slab for class c out of a buddy block. */
static int slab_create(es_buddy *b, es_slab_class *c, size_t size, es_slab **out) {
  size_t nwords = slab_words(c->nslots);
  es_slab *s = c->spare;
  if (s) {
    c->spare = s->next;
  } else {
    size_t bytes = sizeof *s + nwords * sizeof(uint64_t) + c->nslots * sizeof(uint32_t);
    s = es_mem_alloc(ES_MEM_BUDDY, bytes);
    if (!s)
      return es__fail(ES_ENOMEM, "buddy pool: slab descriptor of %zu B", bytes);
    s->req = (uint32_t *)(void *)&s->words[nwords];
    s->cls = (uint32_t)(c - b->classes);
  }
  uint32_t g;
  int rc = block_get(b, size, c->level, &g);
  if (rc < 0) {
    s->next = c->spare;
    c->spare = s;
    return rc;
  }
  es_unit *u = &b->units[g];
  u->state = UNIT_SLAB;
  u->u.slab = s;
  s->base = unit_addr(b, g);
  s->unit = g;
  s->nfree = c->nslots;
  for (size_t w = 0; w < nwords; w++)
    s->words[w] = ~(uint64_t)0;
  if (c->nslots % 64)
    s->words[nwords - 1] = ((uint64_t)1 << (c->nslots % 64)) - 1;
  s->summary = nwords == 64 ? ~(uint64_t)0 : ((uint64_t)1 << nwords) - 1;
  partial_push(c, s);
  b->slabs++;
  *out = s;
  return 0;
}

static int slab_alloc(es_buddy *b, es_slab_class *c, size_t size, void **out) {
  es_slab *s = c->partial;
  if (!s) {
    int rc = slab_create(b, c, size, &s);
    if (rc < 0)
      return rc;
  }
  unsigned w = (unsigned)__builtin_ctzll(s->summary);
  unsigned bit = (unsigned)__builtin_ctzll(s->words[w]);
  s->words[w] &= s->words[w] - 1;
  if (!s->words[w])
    s->summary &= ~((uint64_t)1 << w);
  uint32_t slot = w * 64 + bit;
  s->req[slot] = (uint32_t)size;
  if (--s->nfree == 0)
    partial_remove(c, s);
  *out = s->base + (size_t)slot * c->slot;
  ES_UNPOISON(*out, c->slot);
  return 0;
}

static void slab_free(es_buddy *b, es_slab *s, uint32_t slot) {
  es_slab_class *c = &b->classes[s->cls];
  ES_POISON(s->base + (size_t)slot * c->slot, c->slot);
  s->words[slot / 64] |= (uint64_t)1 << (slot % 64);
  s->summary |= (uint64_t)1 << (slot / 64);
  if (s->nfree++ == 0)
    partial_push(c, s);
  if (s->nfree == c->nslots) {
    /* Empty: give the block back at once so the levels can coalesce. */
    partial_remove(c, s);
    s->next = c->spare;
    c->spare = s;
    block_put(b, s->unit);
    b->slabs--;
  }
}

/* ---- pointer validation ------------------------------------------------------- */

/* Resolve p to a live block or slot, or fail with the reason. op names the
 * calling function in the detail. */
static int ptr_resolve(es_buddy *b, const void *p, const char *op, es_ref *ref) {
  const es_region *r = region_of(b, p);
  if (!r)
    return es__fail(ES_EFOREIGN, "buddy %s: pointer %p is not in any region of this pool", op, p);
  size_t off = (size_t)((const unsigned char *)p - r->base);
  uint32_t local = (uint32_t)(off >> b->shift);
  uint32_t head = 0;
  for (unsigned k = 0;; k++) {
    head = local & ~(((uint32_t)1 << k) - 1);
    if (b->units[r->first + head].state != UNIT_INTERIOR)
      break;
    ES_ASSERT(head != 0);
  }
  uint32_t g = r->first + head;
  const es_unit *u = &b->units[g];
  unsigned char *start = r->base + ((size_t)head << b->shift);
  size_t into = (size_t)((const unsigned char *)p - start);
  size_t bytes = block_bytes(b, u->level);

  if (u->state == UNIT_USED) {
    if (into)
      return es__fail(ES_EBADPTR, "buddy %s: pointer %p is %zu B inside the live block %p of %zu B",
                      op, p, into, (void *)start, bytes);
    ref->unit = g;
    ref->slab = NULL;
    ref->slot = 0;
    return 0;
  }
  if (u->state == UNIT_FREE) {
    /* Every pointer handed out was aligned, so an aligned one was probably
     * freed before; a misaligned one never came from here. */
    if ((uintptr_t)p % b->cfg.align)
      return es__fail(ES_EBADPTR, "buddy %s: pointer %p is inside the free block %p of %zu B", op,
                      p, (void *)start, bytes);
    return es__fail(ES_EDOUBLEFREE, "buddy %s: pointer %p is in the free block %p of %zu B", op, p,
                    (void *)start, bytes);
  }
  es_slab *s = u->u.slab;
  const es_slab_class *c = &b->classes[s->cls];
  size_t slot = into / c->slot, in_slot = into % c->slot;
  if (slot >= c->nslots)
    return es__fail(ES_EBADPTR, "buddy %s: pointer %p is in the unused tail of the slab %p", op, p,
                    (void *)start);
  if (in_slot)
    return es__fail(ES_EBADPTR, "buddy %s: pointer %p is %zu B inside a slot of %zu B (slab %p)",
                    op, p, in_slot, c->slot, (void *)start);
  if ((s->words[slot / 64] >> (slot % 64)) & 1)
    return es__fail(ES_EDOUBLEFREE, "buddy %s: slot %p (%zu B) is already free", op, p, c->slot);
  ref->unit = g;
  ref->slab = s;
  ref->slot = (uint32_t)slot;
  return 0;
}

/* ---- public API ----------------------------------------------------------------- */

void es_buddy_config_default(es_buddy_config *cfg) {
  if (!cfg)
    return;
  memset(cfg, 0, sizeof *cfg);
  cfg->capacity = (size_t)64 << 20;
  cfg->min_block = (size_t)64 << 10;
  cfg->align = 256;
  cfg->slab_max = (size_t)256 << 10;
  cfg->grow = 0;
  cfg->grow_max = 0;
  cfg->watermark_ratio = 0.85;
  cfg->on_watermark = NULL;
  cfg->user = NULL;
}

static int config_check(const es_buddy_config *cfg) {
  if (!es__is_pow2(cfg->min_block) || cfg->min_block < 4096 ||
      cfg->min_block > ES_BUDDY_MAX_MIN_BLOCK)
    return es__fail(ES_EINVAL, "buddy config: min_block %zu is not a power of two in [4096, %zu]",
                    cfg->min_block, ES_BUDDY_MAX_MIN_BLOCK);
  if (!es__is_pow2(cfg->align) || cfg->align < 16 || cfg->align > cfg->min_block)
    return es__fail(ES_EINVAL, "buddy config: align %zu is not a power of two in [16, %zu]",
                    cfg->align, cfg->min_block);
  if (cfg->capacity < cfg->min_block)
    return es__fail(ES_EINVAL, "buddy config: capacity %zu B is below min_block %zu B",
                    cfg->capacity, cfg->min_block);
  if ((cfg->capacity / cfg->min_block) >= ES_BUDDY_NIL)
    return es__fail(ES_EINVAL, "buddy config: capacity %zu B has too many min_block units",
                    cfg->capacity);
  if (cfg->slab_max > ES_BUDDY_MAX_SLAB_MAX)
    return es__fail(ES_EINVAL, "buddy config: slab_max %zu B is above %zu B", cfg->slab_max,
                    ES_BUDDY_MAX_SLAB_MAX);
  if (!(cfg->watermark_ratio > 0.0 && cfg->watermark_ratio <= 1.0))
    return es__fail(ES_EINVAL, "buddy config: watermark_ratio %g is not in (0, 1]",
                    cfg->watermark_ratio);
  size_t cap = cfg->capacity & ~(cfg->min_block - 1);
  if (cfg->grow && cfg->grow_max && cfg->grow_max < cap)
    return es__fail(ES_EINVAL, "buddy config: grow_max %zu B is below capacity %zu B",
                    cfg->grow_max, cap);
  return 0;
}

static void pool_release(es_buddy *b) {
  for (size_t i = 0; i < b->nregions; i++) {
    const es_region *r = &b->regions[i];
    for (uint32_t off = 0; off < r->units;) {
      const es_unit *u = &b->units[r->first + off];
      if (u->state == UNIT_SLAB)
        es_mem_free(u->u.slab);
      off += (uint32_t)1 << u->level;
    }
    ES_UNPOISON(r->map, r->map_size);
    es_mem_unmap(ES_MEM_BUDDY, r->map, r->map_size);
  }
  for (size_t i = 0; i < b->nclasses; i++) {
    for (es_slab *s = b->classes[i].spare, *next; s; s = next) {
      next = s->next;
      es_mem_free(s);
    }
  }
  es_mem_free(b->classes);
  es_mem_free(b->bin_class);
  es_mem_free(b->units);
  pthread_mutex_destroy(&b->lock);
  es_mem_free(b);
}

int es_buddy_create(const es_buddy_config *cfg, es_buddy **out) {
  if (!cfg || !out)
    return es__fail(ES_EINVAL, "buddy create: NULL %s", cfg ? "out" : "cfg");
  int rc = config_check(cfg);
  if (rc < 0)
    return rc;
  es_buddy *b = es_mem_calloc(ES_MEM_BUDDY, 1, sizeof *b);
  if (!b)
    return es__fail(ES_ENOMEM, "buddy create: pool struct");
  if (pthread_mutex_init(&b->lock, NULL) != 0) {
    es_mem_free(b);
    return es__fail(ES_ENOMEM, "buddy create: mutex");
  }
  b->cfg = *cfg;
  b->cfg.capacity &= ~(cfg->min_block - 1);
  b->shift = log2_floor(cfg->min_block);
  for (int k = 0; k < ES_BUDDY_LEVELS; k++)
    b->heads[k] = ES_BUDDY_NIL;
  if (cfg->grow) {
    size_t cap = b->cfg.capacity;
    size_t gm = cfg->grow_max ? cfg->grow_max : (cap > SIZE_MAX / 4 ? SIZE_MAX : cap * 4);
    size_t unit_limit = (size_t)(ES_BUDDY_NIL - 1) << b->shift;
    b->grow_max = gm < unit_limit ? gm : unit_limit;
    b->cfg.grow_max = b->grow_max;
  }
  rc = region_add(b, b->cfg.capacity);
  if (rc == 0 && cfg->slab_max)
    rc = classes_build(b);
  if (rc < 0) {
    pool_release(b);
    return rc;
  }
  *out = b;
  return 0;
}

void es_buddy_destroy(es_buddy *b) {
  if (b)
    pool_release(b);
}

int es_buddy_alloc(es_buddy *b, size_t size, void **out) {
  if (!b)
    return es__fail(ES_EINVAL, "buddy alloc: NULL pool");
  /* The class tables never change after create: look up before locking. */
  es_slab_class *c = size && size <= b->cfg.slab_max ? &b->classes[b->bin_class[size_bin(size)]]
                                                     : NULL;
  int rc;
  void *p = NULL;
  size_t usable = 0;
  pthread_mutex_lock(&b->lock);
  if (!out) {
    rc = es__fail(ES_EINVAL, "buddy alloc: NULL out");
  } else if (size == 0) {
    rc = es__fail(ES_EINVAL, "buddy alloc: size 0");
  } else if (c && c->nslots) {
    rc = slab_alloc(b, c, size, &p);
    usable = c->slot;
  } else {
    rc = block_alloc(b, size, &p, &usable);
  }
  if (rc < 0) {
    b->failures++;
    pthread_mutex_unlock(&b->lock);
    return rc;
  }
  b->allocs++;
  b->live++;
  b->in_use += usable;
  b->requested += size;
  if (b->in_use > b->peak)
    b->peak = b->in_use;
  es_buddy_stats snap;
  int fire = 0;
  if (!b->watermark_crossed && b->peak >= b->watermark_at) {
    b->watermark_crossed = 1;
    if (b->cfg.on_watermark) {
      stats_fill(b, &snap);
      fire = 1;
    }
  }
  es_buddy_watermark_fn fn = b->cfg.on_watermark;
  void *user = b->cfg.user;
  pthread_mutex_unlock(&b->lock);
  *out = p;
  if (fire)
    fn(user, &snap);
  return 0;
}

int es_buddy_free(es_buddy *b, void *p) {
  if (!b || !p)
    return es__fail(ES_EINVAL, "buddy free: NULL %s", b ? "pointer" : "pool");
  pthread_mutex_lock(&b->lock);
  es_ref ref;
  int rc = ptr_resolve(b, p, "free", &ref);
  if (rc < 0) {
    b->invalid_frees++;
    pthread_mutex_unlock(&b->lock);
    return rc;
  }
  if (ref.slab) {
    const es_slab_class *c = &b->classes[ref.slab->cls];
    b->in_use -= c->slot;
    b->requested -= ref.slab->req[ref.slot];
    slab_free(b, ref.slab, ref.slot);
  } else {
    const es_unit *u = &b->units[ref.unit];
    b->in_use -= block_bytes(b, u->level);
    b->requested -= u->u.req;
    block_put(b, ref.unit);
  }
  b->frees++;
  b->live--;
  pthread_mutex_unlock(&b->lock);
  return 0;
}

int es_buddy_usable_size(es_buddy *b, const void *p, size_t *out) {
  if (!b || !p || !out)
    return es__fail(ES_EINVAL, "buddy usable_size: NULL argument");
  pthread_mutex_lock(&b->lock);
  es_ref ref;
  int rc = ptr_resolve(b, p, "usable_size", &ref);
  size_t n = 0;
  if (rc == 0)
    n = ref.slab ? b->classes[ref.slab->cls].slot : block_bytes(b, b->units[ref.unit].level);
  pthread_mutex_unlock(&b->lock);
  if (rc == 0)
    *out = n;
  return rc;
}

/* Gives back the run of units [from, to) of one free block. */
static int purge_run(es_buddy *b, uint32_t from, uint32_t to, size_t *n) {
  size_t bytes = (size_t)(to - from) << b->shift;
  if (madvise(unit_addr(b, from), bytes, MADV_DONTNEED) != 0)
    return es__fail(ES_EIO, "buddy purge: madvise of %zu B failed: %s", bytes, strerror(errno));
  for (uint32_t i = from; i < to; i++)
    b->units[i].dirty = 0;
  *n += bytes;
  return 0;
}

int es_buddy_purge(es_buddy *b, unsigned min_age, size_t *purged) {
  if (purged)
    *purged = 0;
  if (!b)
    return es__fail(ES_EINVAL, "buddy purge: NULL pool");
  size_t n = 0;
  int rc = 0;
  pthread_mutex_lock(&b->lock);
  /* Under the lock: a block taken and written while its pages were being
   * dropped would lose what was written. */
  for (unsigned k = 0; k < ES_BUDDY_LEVELS && rc == 0; k++) {
    for (uint32_t g = b->heads[k]; g != ES_BUDDY_NIL && rc == 0; g = b->units[g].u.link.next) {
      uint32_t end = g + ((uint32_t)1 << k), run = ES_BUDDY_NIL;
      for (uint32_t i = g; i < end && rc == 0; i++) {
        const es_unit *u = &b->units[i];
        int old = u->dirty && b->epoch - u->epoch >= min_age;
        if (old && run == ES_BUDDY_NIL)
          run = i;
        else if (!old && run != ES_BUDDY_NIL) {
          rc = purge_run(b, run, i, &n);
          run = ES_BUDDY_NIL;
        }
      }
      if (rc == 0 && run != ES_BUDDY_NIL)
        rc = purge_run(b, run, end, &n);
    }
  }
  b->epoch++;
  b->purged += n;
  pthread_mutex_unlock(&b->lock);
  if (purged)
    *purged = n;
  return rc;
}

int es_buddy_stats_get(es_buddy *b, es_buddy_stats *out) {
  if (!b || !out)
    return es__fail(ES_EINVAL, "buddy stats: NULL argument");
  pthread_mutex_lock(&b->lock);
  stats_fill(b, out);
  pthread_mutex_unlock(&b->lock);
  return 0;
}

/* ---- invariant check ------------------------------------------------------------ */

#define CORRUPT(...) es__fail(ES_ECORRUPT, "buddy check: " __VA_ARGS__)

typedef struct es_tally {
  size_t free_bytes, in_use, requested, live, slabs, partial;
  size_t free_count[ES_BUDDY_LEVELS];
} es_tally;

static int slab_check(const es_buddy *b, uint32_t g, const es_slab *s, es_tally *t) {
  if (s->cls >= b->nclasses)
    return CORRUPT("slab at unit %u has class %u of %zu", g, s->cls, b->nclasses);
  const es_slab_class *c = &b->classes[s->cls];
  if (!c->nslots || s->unit != g || b->units[g].level != c->level || s->base != unit_addr(b, g))
    return CORRUPT("slab at unit %u disagrees with its descriptor", g);
  size_t nwords = slab_words(c->nslots), nfree = 0;
  for (size_t w = 0; w < nwords; w++) {
    uint64_t word = s->words[w];
    if (w == nwords - 1 && c->nslots % 64 && (word >> (c->nslots % 64)))
      return CORRUPT("slab at unit %u marks slots past its end free", g);
    if (((s->summary >> w) & 1) != (word != 0))
      return CORRUPT("slab at unit %u: summary bit %zu is wrong", g, w);
    nfree += (size_t)__builtin_popcountll(word);
    for (unsigned i = 0; i < 64 && w * 64 + i < c->nslots; i++) {
      if ((word >> i) & 1)
        continue;
      uint32_t req = s->req[w * 64 + i];
      if (req == 0 || req > c->slot)
        return CORRUPT("slab at unit %u: slot %zu records %u B in a %zu B slot", g, w * 64 + i,
                       req, c->slot);
      t->in_use += c->slot;
      t->requested += req;
      t->live++;
    }
  }
  if (nwords < 64 && (s->summary >> nwords))
    return CORRUPT("slab at unit %u: summary has bits past its words", g);
  if (nfree != s->nfree)
    return CORRUPT("slab at unit %u counts %u free slots, bitmap has %zu", g, s->nfree, nfree);
  if (nfree == c->nslots)
    return CORRUPT("slab at unit %u is empty but was not released", g);
  if (nfree)
    t->partial++;
  t->slabs++;
  return 0;
}

static int region_check(const es_buddy *b, size_t i, es_tally *t) {
  const es_region *r = &b->regions[i];
  if ((uintptr_t)r->base % b->cfg.align || ((size_t)r->units << b->shift) != r->size)
    return CORRUPT("region %zu: misaligned base or bad size", i);
  for (uint32_t off = 0; off < r->units;) {
    uint32_t g = r->first + off;
    const es_unit *u = &b->units[g];
    if (u->region != i)
      return CORRUPT("unit %u names region %u, not %zu", g, u->region, i);
    if (u->state == UNIT_INTERIOR || u->state > UNIT_SLAB)
      return CORRUPT("unit %u should head a block but has state %u", g, u->state);
    if (u->level >= 32)
      return CORRUPT("unit %u has level %u", g, u->level);
    uint32_t n = (uint32_t)1 << u->level;
    if (off & (n - 1) || (uint64_t)off + n > r->units)
      return CORRUPT("block at unit %u (level %u) is misaligned or overruns region %zu", g,
                     u->level, i);
    for (uint32_t j = 1; j < n; j++) {
      const es_unit *v = &b->units[g + j];
      if (v->state != UNIT_INTERIOR || v->region != i)
        return CORRUPT("unit %u inside the block at unit %u is a head (overlap)", g + j, g);
    }
    size_t bytes = block_bytes(b, u->level);
    int rc = 0;
    if (u->state == UNIT_FREE) {
      t->free_bytes += bytes;
      t->free_count[u->level]++;
      uint64_t merged = off & ~(uint64_t)n;
      const es_unit *bu = &b->units[r->first + (off ^ n)];
      if (merged + 2 * (uint64_t)n <= r->units && bu->state == UNIT_FREE && bu->level == u->level)
        return CORRUPT("free buddies at units %u and %u were not merged", g, r->first + (off ^ n));
    } else if (u->state == UNIT_USED) {
      if (u->u.req == 0 || u->u.req > bytes)
        return CORRUPT("block at unit %u records %zu B in %zu B", g, u->u.req, bytes);
      t->in_use += bytes;
      t->requested += u->u.req;
      t->live++;
    } else {
      rc = slab_check(b, g, u->u.slab, t);
    }
    if (rc < 0)
      return rc;
    off += n;
  }
  return 0;
}

static int lists_check(const es_buddy *b, const es_tally *t) {
  for (unsigned k = 0; k < ES_BUDDY_LEVELS; k++) {
    size_t count = 0;
    uint32_t prev = ES_BUDDY_NIL;
    for (uint32_t g = b->heads[k]; g != ES_BUDDY_NIL; g = b->units[g].u.link.next) {
      if (g >= b->nunits || count > b->nunits)
        return CORRUPT("free list %u is broken (unit %u, %zu entries)", k, g, count);
      const es_unit *u = &b->units[g];
      if (u->state != UNIT_FREE || u->level != k || u->u.link.prev != prev)
        return CORRUPT("free list %u: unit %u is not a free level-%u block or mislinked", k, g, k);
      prev = g;
      count++;
    }
    if (count != t->free_count[k])
      return CORRUPT("free list %u has %zu blocks, the table has %zu", k, count, t->free_count[k]);
    if (((b->nonempty >> k) & 1) != (count != 0))
      return CORRUPT("non-empty mask bit %u is wrong", k);
  }
  size_t partial = 0;
  for (size_t i = 0; i < b->nclasses; i++) {
    const es_slab_class *c = &b->classes[i];
    const es_slab *prev = NULL;
    for (const es_slab *s = c->partial; s; s = s->next) {
      if (partial++ > t->slabs)
        return CORRUPT("partial list of class %zu loops", i);
      if (s->prev != prev || s->cls != i || s->nfree == 0 || s->unit >= b->nunits ||
          b->units[s->unit].state != UNIT_SLAB || b->units[s->unit].u.slab != s)
        return CORRUPT("partial list of class %zu holds a bad slab", i);
      prev = s;
    }
  }
  if (partial != t->partial)
    return CORRUPT("%zu slabs on partial lists, %zu have free slots", partial, t->partial);
  return 0;
}

static int pool_check(const es_buddy *b) {
  es_tally t;
  memset(&t, 0, sizeof t);
  size_t capacity = 0;
  uint32_t next_first = 0;
  for (size_t i = 0; i < b->nregions; i++) {
    if (b->regions[i].first != next_first)
      return CORRUPT("region %zu starts at unit %u, expected %u", i, b->regions[i].first,
                     next_first);
    next_first += b->regions[i].units;
    capacity += b->regions[i].size;
    int rc = region_check(b, i, &t);
    if (rc < 0)
      return rc;
  }
  if (next_first != b->nunits || capacity != b->capacity)
    return CORRUPT("regions cover %u units / %zu B, pool says %u / %zu", next_first, capacity,
                   b->nunits, b->capacity);
  int rc = lists_check(b, &t);
  if (rc < 0)
    return rc;
  if (t.free_bytes != b->free_bytes)
    return CORRUPT("free_bytes %zu, recomputed %zu", b->free_bytes, t.free_bytes);
  if (t.in_use != b->in_use)
    return CORRUPT("bytes_in_use %zu, recomputed %zu", b->in_use, t.in_use);
  if (t.requested != b->requested)
    return CORRUPT("bytes_requested %zu, recomputed %zu", b->requested, t.requested);
  if (t.live != b->live)
    return CORRUPT("live_blocks %zu, recomputed %zu", b->live, t.live);
  if (t.slabs != b->slabs)
    return CORRUPT("slabs %zu, recomputed %zu", b->slabs, t.slabs);
  if (b->peak < b->in_use || b->allocs - b->frees != b->live)
    return CORRUPT("peak %zu < in use %zu, or allocs - frees != live", b->peak, b->in_use);
  return 0;
}

int es_buddy_check(es_buddy *b) {
  if (!b)
    return es__fail(ES_EINVAL, "buddy check: NULL pool");
  pthread_mutex_lock(&b->lock);
  int rc = pool_check(b);
  pthread_mutex_unlock(&b->lock);
  return rc;
}
