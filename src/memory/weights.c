/* Read-only weight region: tier 1 of the three memory tiers (BRIEF §2).
 *
 * Model weights are the largest thing an inference server holds and they never
 * change after load, so there should be exactly one physical copy of them per
 * machine, shared by every request, every model instance and every worker
 * process. Two ways to get there:
 *
 *   - A file region maps the weight file PROT_READ + MAP_SHARED. The pages are
 *     the page cache's own pages, so every process that maps the same file
 *     shares them (PSS = size / number of mappers) and the kernel can drop and
 *     re-read them under pressure instead of swapping. MAP_PRIVATE would work
 *     for reading too, but a stray write would silently make a private copy;
 *     with MAP_SHARED + PROT_READ a write faults.
 *   - An anonymous region is for weights that must be transformed at load
 *     (dequantised, repacked): written once through es_weights_data_mut, then
 *     sealed with mprotect(PROT_READ) so any later write faults at once instead
 *     of corrupting every in-flight request.
 *
 * Regions are reference-counted with an atomic counter. File regions also sit
 * in a process-global registry so that opening the same file twice maps it
 * once. The key is (device, inode, size, mtime with nanoseconds): device and
 * inode identify the file, and size and mtime tell a file rewritten in place
 * from the one already mapped, which then gets a mapping of its own while
 * holders of the old one keep theirs. (Deploy new weights by writing a new
 * file and renaming it over the old one: a file truncated in place under a
 * live mapping makes reads past the new end raise SIGBUS.)
 *
 * Locking: the registry mutex guards the list and the "find and take a
 * reference" step of es_weights_open. Release drops the count without the
 * mutex; only the release that reaches zero takes it, to unlink. Open
 * therefore takes a reference only if the count is still non-zero, so a dying
 * region found in the list is skipped rather than resurrected. */
#include "edgeserve/memory.h"
#include "common/internal.h"
#include "memory/map.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ES_WEIGHTS_MAGIC 0x4553574549474854ull /* "ESWEIGHT" */

/* Bytes of mincore vector per call: bounds the stack use of es_weights_resident
 * whatever the size of the mapping. */
#define ES_WEIGHTS_MINCORE_CHUNK 4096

typedef enum es_weights_kind {
  ES_WEIGHTS_ANON = 1, /* es_weights_create: written, then sealed */
  ES_WEIGHTS_FILE = 2, /* es_weights_open: file mapped read-only, shared */
} es_weights_kind;

struct es_weights {
  uint64_t magic;       /* ES_WEIGHTS_MAGIC while live; 0 once destroyed */
  _Atomic int refs;     /* references held; the last release unmaps */
  es_weights_kind kind;
  _Atomic int sealed;   /* read-only now (always 1 for files) */
  _Atomic int locked;   /* mlock succeeded */
  void *data;           /* start of the mapping */
  size_t size;          /* es_weights_size: file size, or page-rounded size */
  size_t map_len;       /* bytes mapped (size rounded up to the page) */
  /* Registry key and link, file regions only. */
  dev_t dev;
  ino_t ino;
  off_t file_size;
  struct timespec mtime;
  struct es_weights *next;
};

static pthread_mutex_t es_registry_lock_ = PTHREAD_MUTEX_INITIALIZER;
static es_weights *es_registry_; /* live file regions, newest first */
static pthread_once_t es_registry_atfork_once_ = PTHREAD_ONCE_INIT;

/* ---- helpers ----------------------------------------------------------------- */

static size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }

/* 0 for a live handle, else the error to return (NULL is a bad argument,
 * anything else without the magic is a corrupted or released handle). */
static int handle_check(const es_weights *w, const char *fn) {
  if (!w)
    return es__fail(ES_EINVAL, "%s: NULL weights handle", fn);
  if (w->magic != ES_WEIGHTS_MAGIC)
    return es__fail(ES_ECORRUPT, "%s: %p is not a live weights handle (bad magic)", fn,
                    (const void *)w);
  return 0;
}

static int handle_ok(const es_weights *w) { return w && w->magic == ES_WEIGHTS_MAGIC; }

static void handle_free(es_weights *w) {
  w->magic = 0;
  es_mem_free(w);
}

/* ---- fork safety ---------------------------------------------------------------
 * Worker processes are typically forked from the process that loaded the
 * weights. Holding the registry lock across fork keeps a child from inheriting
 * it locked by a thread that does not exist there. */

static void registry_prepare(void) { pthread_mutex_lock(&es_registry_lock_); }
static void registry_resume(void) { pthread_mutex_unlock(&es_registry_lock_); }

static void registry_atfork_install(void) {
  pthread_atfork(registry_prepare, registry_resume, registry_resume);
}

/* ---- mlock ------------------------------------------------------------------------ */

/* The raw system call: sanitizer runtimes intercept mlock() and turn it into a
 * no-op that succeeds, which would hide the RLIMIT_MEMLOCK failure that
 * sanitized test builds must see like any other build. */
static int mlock_range(const void *p, size_t len) { return (int)syscall(SYS_mlock, p, len); }

/* Bytes of every region locked now, for es_weights_locked_bytes. */
static _Atomic size_t es_locked_bytes_;

size_t es_weights_locked_bytes(void) {
  return atomic_load_explicit(&es_locked_bytes_, memory_order_relaxed);
}

/* A region going away gives its locked bytes back (munmap unlocks). */
static void weights_unlocked(es_weights *w) {
  if (atomic_load_explicit(&w->locked, memory_order_acquire))
    atomic_fetch_sub_explicit(&es_locked_bytes_, w->map_len, memory_order_relaxed);
}

static int weights_mlock(es_weights *w) {
  if (atomic_load_explicit(&w->locked, memory_order_acquire))
    return 0;
  if (mlock_range(w->data, w->map_len) == 0) {
    int was = 0; /* two threads locking at once count the bytes once */
    if (atomic_compare_exchange_strong_explicit(&w->locked, &was, 1, memory_order_acq_rel,
                                                memory_order_acquire))
      atomic_fetch_add_explicit(&es_locked_bytes_, w->map_len, memory_order_relaxed);
    return 0;
  }
  int e = errno;
  if (e != EPERM && e != ENOMEM && e != EAGAIN)
    return es__fail(ES_EINVAL, "mlock of %zu B at %p failed: %s", w->map_len, w->data,
                    strerror(e));
  struct rlimit rl;
  char soft[32];
  if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0)
    strcpy(soft, "unknown");
  else if (rl.rlim_cur == RLIM_INFINITY)
    strcpy(soft, "unlimited");
  else
    snprintf(soft, sizeof soft, "%llu B", (unsigned long long)rl.rlim_cur);
  return es__fail(ES_EMEMLOCK,
                  "mlock of the weights failed (%s): RLIMIT_MEMLOCK soft limit is %s, "
                  "%zu B needed; raise it (ulimit -l, LimitMEMLOCK=) or grant CAP_IPC_LOCK",
                  strerror(e), soft, w->map_len);
}

/* ---- anonymous regions ------------------------------------------------------------ */

int es_weights_create(size_t size, es_weights **out) {
  if (!out)
    return es__fail(ES_EINVAL, "es_weights_create: NULL out");
  if (size == 0)
    return es__fail(ES_EINVAL, "es_weights_create: size is 0");
  size_t len = es__align_up(size, page_size());
  if (len == 0)
    return es__fail(ES_EOVERFLOW, "es_weights_create: %zu B overflows when page-rounded", size);
  es_weights *w = es_mem_calloc(ES_MEM_WEIGHTS, 1, sizeof *w);
  if (!w)
    return es__fail(ES_ENOMEM, "es_weights_create: no memory for the handle");
  /* Written once, whole, then read for the model's life: huge pages where
   * the kernel offers them cost one fault per 2 MiB instead of per 4 KiB
   * (the fill is most of a load's time otherwise: a 4 KiB fault took 13 us
   * on a virtual machine, 300 MB/s, where huge pages filled 12 GB/s) and
   * fewer TLB misses in every run. The kernel puts huge pages only on
   * aligned 2 MiB of a mapping, so a large region starts on one. Advice
   * only: without THP nothing changes. */
  w->data = es__mem_map_large(ES_MEM_WEIGHTS, len);
  if (!w->data) {
    es_mem_free(w);
    return es__fail(ES_ENOMEM, "es_weights_create: cannot map %zu B", len);
  }
  w->kind = ES_WEIGHTS_ANON;
  w->size = len;
  w->map_len = len;
  atomic_init(&w->refs, 1);
  atomic_init(&w->sealed, 0);
  atomic_init(&w->locked, 0);
  w->magic = ES_WEIGHTS_MAGIC;
  *out = w;
  return 0;
}

int es_weights_data_mut(es_weights *w, void **out) {
  int rc = handle_check(w, "es_weights_data_mut");
  if (rc)
    return rc;
  if (!out)
    return es__fail(ES_EINVAL, "es_weights_data_mut: NULL out");
  if (w->kind != ES_WEIGHTS_ANON)
    return es__fail(ES_ESTATE, "es_weights_data_mut: a file region is read-only");
  if (atomic_load_explicit(&w->sealed, memory_order_acquire))
    return es__fail(ES_ESTATE, "es_weights_data_mut: the region is sealed");
  *out = w->data;
  return 0;
}

int es_weights_seal(es_weights *w) {
  int rc = handle_check(w, "es_weights_seal");
  if (rc)
    return rc;
  if (w->kind != ES_WEIGHTS_ANON)
    return es__fail(ES_ESTATE, "es_weights_seal: a file region is always read-only");
  if (atomic_load_explicit(&w->sealed, memory_order_acquire))
    return 0;
  /* Concurrent seals both reach here; mprotect is idempotent. */
  if (mprotect(w->data, w->map_len, PROT_READ) != 0)
    return es__fail(ES_ENOMEM, "es_weights_seal: mprotect(PROT_READ) of %zu B failed: %s",
                    w->map_len, strerror(errno));
  atomic_store_explicit(&w->sealed, 1, memory_order_release);
  return 0;
}

/* ---- file regions ------------------------------------------------------------------ */

static int open_errno_code(int e) {
  switch (e) {
  case ENOENT:
  case ENOTDIR:
    return ES_ENOENT;
  case EACCES:
  case EPERM:
    return ES_EACCES;
  case ENOMEM:
    return ES_ENOMEM;
  case EMFILE:
  case ENFILE:
    return ES_EAGAIN;
  case ELOOP:
  case ENAMETOOLONG:
  case ENXIO:
  case ENODEV:
    return ES_EINVAL;
  default:
    return ES_EIO;
  }
}

static int key_equal(const es_weights *w, const struct stat *st) {
  return w->dev == st->st_dev && w->ino == st->st_ino && w->file_size == st->st_size &&
         w->mtime.tv_sec == st->st_mtim.tv_sec && w->mtime.tv_nsec == st->st_mtim.tv_nsec;
}

/* A reference on w unless its count already reached zero (a release is on
 * its way to unlink and unmap it). */
static int ref_take_if_live(es_weights *w) {
  int n = atomic_load_explicit(&w->refs, memory_order_relaxed);
  while (n > 0)
    if (atomic_compare_exchange_weak_explicit(&w->refs, &n, n + 1, memory_order_acquire,
                                              memory_order_relaxed))
      return 1;
  return 0;
}

/* Caller holds the registry lock. */
static es_weights *registry_find(const struct stat *st) {
  for (es_weights *w = es_registry_; w; w = w->next)
    if (key_equal(w, st) && ref_take_if_live(w))
      return w;
  return NULL;
}

static void registry_unlink(es_weights *w) {
  pthread_mutex_lock(&es_registry_lock_);
  for (es_weights **pp = &es_registry_; *pp; pp = &(*pp)->next)
    if (*pp == w) {
      *pp = w->next;
      break;
    }
  pthread_mutex_unlock(&es_registry_lock_);
}

/* Map fd (already checked to be a non-empty regular file) into a new handle. */
static int file_map(int fd, const struct stat *st, const char *path, es_weights **out) {
  if ((unsigned long long)st->st_size > SIZE_MAX)
    return es__fail(ES_EOVERFLOW, "es_weights_open: %s: %lld B does not fit in memory", path,
                    (long long)st->st_size);
  size_t size = (size_t)st->st_size;
  size_t len = es__align_up(size, page_size());
  if (len == 0)
    return es__fail(ES_EOVERFLOW, "es_weights_open: %s: %zu B overflows when page-rounded",
                    path, size);
  es_weights *w = es_mem_calloc(ES_MEM_WEIGHTS, 1, sizeof *w);
  if (!w)
    return es__fail(ES_ENOMEM, "es_weights_open: %s: no memory for the handle", path);
  void *p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    es_mem_free(w);
    return es__fail(e == ENOMEM ? ES_ENOMEM : e == EACCES ? ES_EACCES : ES_EINVAL,
                    "es_weights_open: %s: mmap of %zu B failed: %s", path, size, strerror(e));
  }
  w->kind = ES_WEIGHTS_FILE;
  w->data = p;
  w->size = size;
  w->map_len = len;
  w->dev = st->st_dev;
  w->ino = st->st_ino;
  w->file_size = st->st_size;
  w->mtime = st->st_mtim;
  atomic_init(&w->refs, 1);
  atomic_init(&w->sealed, 1);
  atomic_init(&w->locked, 0);
  w->magic = ES_WEIGHTS_MAGIC;
  es_mem_account_file(ES_MEM_WEIGHTS, (long long)size);
  *out = w;
  return 0;
}

/* The last reference is gone and w is out of the registry. */
static void file_unmap(es_weights *w) {
  munmap(w->data, w->map_len);
  es_mem_account_file(ES_MEM_WEIGHTS, -(long long)w->size);
  handle_free(w);
}

int es_weights_open(const char *path, int flags, es_weights **out) {
  if (!path || !*path)
    return es__fail(ES_EINVAL, "es_weights_open: NULL or empty path");
  if (!out)
    return es__fail(ES_EINVAL, "es_weights_open: %s: NULL out", path);
  if (flags & ~ES_WEIGHTS_MLOCK)
    return es__fail(ES_EINVAL, "es_weights_open: %s: unknown flags 0x%x", path,
                    (unsigned)(flags & ~ES_WEIGHTS_MLOCK));
  pthread_once(&es_registry_atfork_once_, registry_atfork_install);

  /* O_NONBLOCK so that a FIFO given by mistake is refused below rather than
   * blocking the open until a writer shows up. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) {
    int e = errno;
    return es__fail(open_errno_code(e), "es_weights_open: cannot open %s: %s", path,
                    strerror(e));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return es__fail(ES_EIO, "es_weights_open: cannot stat %s: %s", path, strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return es__fail(ES_EINVAL, "es_weights_open: %s is %s, not a regular file", path,
                    S_ISDIR(st.st_mode) ? "a directory" : "a special file");
  }
  if (st.st_size <= 0) {
    close(fd);
    return es__fail(ES_EINVAL, "es_weights_open: %s is empty", path);
  }

  /* Map under the lock so that two threads opening the same new file at
   * once end up with one mapping, not two. */
  pthread_mutex_lock(&es_registry_lock_);
  es_weights *w = registry_find(&st);
  int rc = 0;
  if (!w) {
    rc = file_map(fd, &st, path, &w);
    if (rc == 0) {
      w->next = es_registry_;
      es_registry_ = w;
    }
  }
  pthread_mutex_unlock(&es_registry_lock_);
  close(fd); /* the mapping keeps its own reference to the file */
  if (rc)
    return rc;

  /* Outside the lock: mlock of a large file faults every page in and must
   * not stall other opens. On failure the region goes (or stays, if others
   * hold it) as if this open had not happened. */
  if (flags & ES_WEIGHTS_MLOCK) {
    rc = weights_mlock(w);
    if (rc) {
      es_weights_release(w);
      return rc;
    }
  }
  *out = w;
  return 0;
}

/* ---- common to both kinds ------------------------------------------------------- */

int es_weights_lock(es_weights *w) {
  int rc = handle_check(w, "es_weights_lock");
  return rc ? rc : weights_mlock(w);
}

es_weights *es_weights_retain(es_weights *w) {
  if (!handle_ok(w))
    return NULL;
  atomic_fetch_add_explicit(&w->refs, 1, memory_order_relaxed);
  return w;
}

void es_weights_release(es_weights *w) {
  if (!handle_ok(w))
    return;
  /* acq_rel: every holder's reads of the data happen before the unmap. */
  if (atomic_fetch_sub_explicit(&w->refs, 1, memory_order_acq_rel) != 1)
    return;
  weights_unlocked(w);
  if (w->kind == ES_WEIGHTS_FILE) {
    registry_unlink(w);
    file_unmap(w);
  } else {
    es_mem_unmap(ES_MEM_WEIGHTS, w->data, w->map_len);
    handle_free(w);
  }
}

const void *es_weights_data(const es_weights *w) { return handle_ok(w) ? w->data : NULL; }

size_t es_weights_size(const es_weights *w) { return handle_ok(w) ? w->size : 0; }

int es_weights_is_sealed(const es_weights *w) {
  return handle_ok(w) ? atomic_load_explicit(&w->sealed, memory_order_acquire) : 0;
}

int es_weights_refcount(const es_weights *w) {
  return handle_ok(w) ? atomic_load_explicit(&w->refs, memory_order_relaxed) : 0;
}

int es_weights_resident(const es_weights *w, size_t *out) {
  int rc = handle_check(w, "es_weights_resident");
  if (rc)
    return rc;
  if (!out)
    return es__fail(ES_EINVAL, "es_weights_resident: NULL out");
  size_t pg = page_size(), pages = w->map_len / pg, resident = 0;
  unsigned char vec[ES_WEIGHTS_MINCORE_CHUNK];
  for (size_t first = 0; first < pages; first += ES_WEIGHTS_MINCORE_CHUNK) {
    size_t n = pages - first < ES_WEIGHTS_MINCORE_CHUNK ? pages - first : ES_WEIGHTS_MINCORE_CHUNK;
    if (mincore((char *)w->data + first * pg, n * pg, vec) != 0)
      return es__fail(ES_EIO, "es_weights_resident: mincore failed: %s", strerror(errno));
    for (size_t i = 0; i < n; i++)
      resident += vec[i] & 1;
  }
  size_t bytes = resident * pg;
  /* The last page of a file is partly beyond its end; report file bytes. */
  *out = bytes < w->size ? bytes : w->size;
  return 0;
}
