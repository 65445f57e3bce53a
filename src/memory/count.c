/* Counting layer: every byte the library takes from the system, by tag.
 *
 * Heap blocks carry a 32-byte header just before the pointer handed out: the
 * requested size, the tag, the distance back to what malloc returned (for
 * aligned blocks) and a magic that catches frees of foreign pointers early.
 * 32 bytes keeps the payload 16-byte aligned as malloc's is. Anonymous maps
 * carry no header: the caller passes the size back, as munmap wants anyway.
 *
 * Counters are relaxed atomics: they are statistics, never used to order
 * other memory accesses. The peak is maintained with a CAS loop so it is
 * never below a value `current` really had.
 *
 * Failure injection (es_mem_fault_arm) sits in front of each call to the
 * system: disarmed, it is one relaxed load of a flag, and everything else
 * (numbering, the hook, the decision) is in a cold function. The flag is
 * stored with release after the configuration, and the cold path reloads it
 * with acquire, so an allocating thread that sees the flag sees the
 * configuration it belongs to. */
#include "edgeserve/memory.h"
#include "common/internal.h"
#include "memory/map.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define ES_MEM_HDR_MAGIC 0x45534d454d484452ull /* "ESMEMHDR" */

typedef struct es_mem_hdr {
  uint64_t magic;
  uint64_t size;    /* requested bytes */
  uint32_t tag;
  uint32_t offset;  /* bytes from the malloc'ed start to this header */
  uint64_t aligned; /* 1 for es_mem_aligned_alloc blocks, which realloc refuses */
} es_mem_hdr;

_Static_assert(sizeof(es_mem_hdr) == 32, "header keeps 16-byte alignment");

typedef struct es_mem_counter {
  _Atomic size_t current;
  _Atomic size_t peak;
  _Atomic long long file_mapped;
  _Atomic uint64_t allocs;
  _Atomic uint64_t frees;
  _Atomic uint64_t failures;
} es_mem_counter;

static es_mem_counter es_counters_[ES_MEM_TAG_COUNT];

static const char *const es_tag_names_[ES_MEM_TAG_COUNT] = {
#define ES_MEM_TAG_STR_(name, str) str,
    ES_MEM_TAG_MAP(ES_MEM_TAG_STR_)
#undef ES_MEM_TAG_STR_
};

static int tag_ok(es_mem_tag tag) { return (unsigned)tag < ES_MEM_TAG_COUNT; }

static void peak_raise(es_mem_counter *c, size_t now) {
  size_t peak = atomic_load_explicit(&c->peak, memory_order_relaxed);
  while (now > peak &&
         !atomic_compare_exchange_weak_explicit(&c->peak, &peak, now, memory_order_relaxed,
                                                memory_order_relaxed)) {
  }
}

static void count_add(es_mem_tag tag, size_t n) {
  es_mem_counter *c = &es_counters_[tag];
  peak_raise(c, atomic_fetch_add_explicit(&c->current, n, memory_order_relaxed) + n);
  atomic_fetch_add_explicit(&c->allocs, 1, memory_order_relaxed);
}

static void count_sub(es_mem_tag tag, size_t n) {
  es_mem_counter *c = &es_counters_[tag];
  atomic_fetch_sub_explicit(&c->current, n, memory_order_relaxed);
  atomic_fetch_add_explicit(&c->frees, 1, memory_order_relaxed);
}

static void count_fail(es_mem_tag tag) {
  atomic_fetch_add_explicit(&es_counters_[tag].failures, 1, memory_order_relaxed);
}

/* ---- failure injection ------------------------------------------------------ */

typedef void (*es_mem_fault_fn)(void *user, uint64_t ordinal, es_mem_tag tag, size_t size,
                                const void *caller);

static _Atomic int fault_on_;
static _Atomic uint64_t fault_at_;
static _Atomic int fault_persistent_;
static _Atomic(es_mem_fault_fn) fault_fn_;
static _Atomic(void *) fault_user_;
static _Atomic uint64_t fault_calls_;
static _Atomic uint64_t fault_injected_;

__attribute__((noinline, cold)) static int fault_hit_slow(es_mem_tag tag, size_t size,
                                                          const void *caller) {
  if (!atomic_load_explicit(&fault_on_, memory_order_acquire))
    return 0;
  uint64_t n = atomic_fetch_add_explicit(&fault_calls_, 1, memory_order_relaxed) + 1;
  es_mem_fault_fn fn = atomic_load_explicit(&fault_fn_, memory_order_relaxed);
  if (fn)
    fn(atomic_load_explicit(&fault_user_, memory_order_relaxed), n, tag, size, caller);
  uint64_t at = atomic_load_explicit(&fault_at_, memory_order_relaxed);
  int hit = at != 0 && (n == at ||
                        (n > at && atomic_load_explicit(&fault_persistent_, memory_order_relaxed)));
  if (hit)
    atomic_fetch_add_explicit(&fault_injected_, 1, memory_order_relaxed);
  return hit;
}

/* 1 when this attempt is to fail on purpose. */
static inline int fault_hit(es_mem_tag tag, size_t size, const void *caller) {
  if (__builtin_expect(!atomic_load_explicit(&fault_on_, memory_order_relaxed), 1))
    return 0;
  return fault_hit_slow(tag, size, caller);
}

/* The return address into the code that called the counting layer: the
 * public functions pass theirs down, so calloc and strdup name their
 * caller, not the alloc they call. */
#define CALLER() __builtin_return_address(0)

int es_mem_fault_arm(const es_mem_fault_config *cfg) {
  if (!cfg)
    return ES_EINVAL;
  /* Off while the fields change, so no thread mixes two configurations. */
  atomic_store_explicit(&fault_on_, 0, memory_order_release);
  atomic_store_explicit(&fault_at_, cfg->fail_at, memory_order_relaxed);
  atomic_store_explicit(&fault_persistent_, cfg->persistent != 0, memory_order_relaxed);
  atomic_store_explicit(&fault_fn_, cfg->on_alloc, memory_order_relaxed);
  atomic_store_explicit(&fault_user_, cfg->user, memory_order_relaxed);
  atomic_store_explicit(&fault_calls_, 0, memory_order_relaxed);
  atomic_store_explicit(&fault_injected_, 0, memory_order_relaxed);
  atomic_store_explicit(&fault_on_, 1, memory_order_release);
  return 0;
}

void es_mem_fault_disarm(void) { atomic_store_explicit(&fault_on_, 0, memory_order_release); }

int es_mem_fault_stats_get(es_mem_fault_stats *out) {
  if (!out)
    return ES_EINVAL;
  out->armed = atomic_load_explicit(&fault_on_, memory_order_acquire);
  out->calls = atomic_load_explicit(&fault_calls_, memory_order_relaxed);
  out->injected = atomic_load_explicit(&fault_injected_, memory_order_relaxed);
  return 0;
}

/* ---- heap ------------------------------------------------------------------ */

static void *hdr_init(void *raw, void *user, es_mem_tag tag, size_t size, int aligned) {
  es_mem_hdr *h = (es_mem_hdr *)user - 1;
  h->magic = ES_MEM_HDR_MAGIC;
  h->size = size;
  h->tag = (uint32_t)tag;
  h->offset = (uint32_t)((char *)h - (char *)raw);
  h->aligned = (uint64_t)aligned;
  count_add(tag, size);
  return user;
}

static es_mem_hdr *hdr_of(void *p) {
  es_mem_hdr *h = (es_mem_hdr *)p - 1;
  if (h->magic != ES_MEM_HDR_MAGIC || !tag_ok((es_mem_tag)h->tag))
    es__assert_fail("es_mem_free of a block not from es_mem_alloc", __FILE__, __LINE__);
  return h;
}

static void *alloc_from(es_mem_tag tag, size_t size, const void *caller) {
  if (!tag_ok(tag))
    return NULL;
  if (size == 0 || size > SIZE_MAX - sizeof(es_mem_hdr)) {
    count_fail(tag);
    return NULL;
  }
  void *raw = fault_hit(tag, size, caller) ? NULL : malloc(sizeof(es_mem_hdr) + size);
  if (!raw) {
    count_fail(tag);
    return NULL;
  }
  return hdr_init(raw, (es_mem_hdr *)raw + 1, tag, size, 0);
}

void *es_mem_alloc(es_mem_tag tag, size_t size) { return alloc_from(tag, size, CALLER()); }

void *es_mem_calloc(es_mem_tag tag, size_t n, size_t size) {
  if (size != 0 && n > SIZE_MAX / size) {
    if (tag_ok(tag))
      count_fail(tag);
    return NULL;
  }
  void *p = alloc_from(tag, n * size, CALLER());
  if (p)
    memset(p, 0, n * size);
  return p;
}

void *es_mem_aligned_alloc(es_mem_tag tag, size_t align, size_t size) {
  if (!tag_ok(tag))
    return NULL;
  if (!es__is_pow2(align) || align > 4096) {
    count_fail(tag);
    return NULL;
  }
  /* Raised before the size check, which must see the padding really added. */
  if (align < 16)
    align = 16;
  if (size == 0 || size > SIZE_MAX - sizeof(es_mem_hdr) - align) {
    count_fail(tag);
    return NULL;
  }
  void *raw =
      fault_hit(tag, size, CALLER()) ? NULL : malloc(sizeof(es_mem_hdr) + align + size);
  if (!raw) {
    count_fail(tag);
    return NULL;
  }
  uintptr_t user = ((uintptr_t)raw + sizeof(es_mem_hdr) + align - 1) & ~(uintptr_t)(align - 1);
  return hdr_init(raw, (void *)user, tag, size, 1);
}

void *es_mem_realloc(void *p, size_t size) {
  if (!p)
    return NULL;
  es_mem_hdr *h = hdr_of(p);
  es_mem_tag tag = (es_mem_tag)h->tag;
  /* An aligned block may sit at offset 0 by chance, but realloc would not
   * keep its alignment: refuse it by its flag. */
  if (h->aligned || size == 0 || size > SIZE_MAX - sizeof(es_mem_hdr)) {
    count_fail(tag);
    return NULL;
  }
  size_t old = h->size;
  es_mem_hdr *n = fault_hit(tag, size, CALLER()) ? NULL : realloc(h, sizeof(es_mem_hdr) + size);
  if (!n) {
    count_fail(tag);
    return NULL;
  }
  n->size = size;
  es_mem_counter *c = &es_counters_[tag];
  if (size > old)
    peak_raise(c, atomic_fetch_add_explicit(&c->current, size - old, memory_order_relaxed) +
                      (size - old));
  else
    atomic_fetch_sub_explicit(&c->current, old - size, memory_order_relaxed);
  return n + 1;
}

char *es_mem_strdup(es_mem_tag tag, const char *s) {
  if (!s)
    return NULL;
  size_t n = strlen(s) + 1;
  char *d = alloc_from(tag, n, CALLER());
  if (d)
    memcpy(d, s, n);
  return d;
}

void es_mem_free(void *p) {
  if (!p)
    return;
  es_mem_hdr *h = hdr_of(p);
  es_mem_tag tag = (es_mem_tag)h->tag;
  size_t size = h->size;
  void *raw = (char *)h - h->offset;
  h->magic = 0;
  count_sub(tag, size);
  free(raw);
}

/* ---- anonymous maps ----------------------------------------------------------- */

static size_t page_round(size_t n) {
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  return es__align_up(n, pg);
}

void *es_mem_map(es_mem_tag tag, size_t size) {
  if (!tag_ok(tag))
    return NULL;
  size_t n = size ? page_round(size) : 0;
  if (n == 0) {
    count_fail(tag);
    return NULL;
  }
  void *p = fault_hit(tag, n, CALLER()) ? MAP_FAILED
                              : mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                                     -1, 0);
  if (p == MAP_FAILED) {
    count_fail(tag);
    return NULL;
  }
  count_add(tag, n);
  return p;
}

void *es_mem_map_aligned(es_mem_tag tag, size_t size, size_t align) {
  if (!tag_ok(tag))
    return NULL;
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  if (align < pg)
    align = pg;
  size_t n = size ? page_round(size) : 0;
  if (n == 0 || (align & (align - 1)) || n > SIZE_MAX - align) {
    count_fail(tag);
    return NULL;
  }
  /* Mapped long enough to hold an aligned start (the mapping starts on a
   * page already), then the head before it and the tail after n given back. */
  unsigned char *raw = fault_hit(tag, n, CALLER())
                           ? MAP_FAILED
                           : mmap(NULL, n + align - pg, PROT_READ | PROT_WRITE,
                                  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    count_fail(tag);
    return NULL;
  }
  size_t head = (align - (uintptr_t)raw % align) % align, tail = align - pg - head;
  if (head)
    munmap(raw, head);
  if (tail)
    munmap(raw + head + n, tail);
  count_add(tag, n);
  return raw + head;
}

void *es__mem_map_large(es_mem_tag tag, size_t size) {
  const size_t huge = (size_t)2 << 20;
  if (size < huge)
    return es_mem_map(tag, size);
  void *p = es_mem_map_aligned(tag, size, huge);
  if (p)
    (void)madvise(p, page_round(size), MADV_HUGEPAGE);
  return p;
}

void es_mem_unmap(es_mem_tag tag, void *p, size_t size) {
  if (!p || !tag_ok(tag))
    return;
  size_t n = page_round(size);
  if (munmap(p, n) == 0)
    count_sub(tag, n);
  else
    es__assert_fail("es_mem_unmap of a range not from es_mem_map", __FILE__, __LINE__);
}

void es_mem_account_file(es_mem_tag tag, long long delta) {
  if (tag_ok(tag))
    atomic_fetch_add_explicit(&es_counters_[tag].file_mapped, delta, memory_order_relaxed);
}

/* ---- queries ---------------------------------------------------------------- */

int es_mem_stats_get(es_mem_tag tag, es_mem_stats *out) {
  if (!tag_ok(tag) || !out)
    return ES_EINVAL;
  es_mem_counter *c = &es_counters_[tag];
  out->current = atomic_load_explicit(&c->current, memory_order_relaxed);
  out->peak = atomic_load_explicit(&c->peak, memory_order_relaxed);
  long long f = atomic_load_explicit(&c->file_mapped, memory_order_relaxed);
  out->file_mapped = f > 0 ? (size_t)f : 0;
  out->allocs = atomic_load_explicit(&c->allocs, memory_order_relaxed);
  out->frees = atomic_load_explicit(&c->frees, memory_order_relaxed);
  out->failures = atomic_load_explicit(&c->failures, memory_order_relaxed);
  return 0;
}

size_t es_mem_total(void) {
  size_t t = 0;
  for (int i = 0; i < ES_MEM_TAG_COUNT; i++)
    t += atomic_load_explicit(&es_counters_[i].current, memory_order_relaxed);
  return t;
}

const char *es_mem_tag_name(es_mem_tag tag) { return tag_ok(tag) ? es_tag_names_[tag] : "?"; }
