/* Which N to fail, for the out-of-memory tests (test_oom, test_server_oom).
 *
 * A counting pass arms the counting layer's failure injection with
 * fail_at = 0 (nothing fails) and records, for each allocation attempt n,
 * a key of the site that made it: the caller the counting layer reports
 * (the return address into the code that called es_mem_*) and the
 * OOM_SITE_DEPTH - 1 frames above it, so that the callers of the context
 * allocator or of protobuf-c's allocator are told apart. The schedule then
 * takes every N up to OOM_PREFIX, every N whose site was not met at a
 * smaller N (each distinct allocation site fails at least once), and every
 * OOM_STRIDE-th N; in full mode, every N.
 *
 * Header-only; the test owns one oom_sched. Not thread-safe to arm from two
 * threads, but the hook itself may run in any thread (each attempt writes
 * its own slot). Test memory (plain malloc), so that it never counts. */
#ifndef ES_TEST_OOM_SCHED_H
#define ES_TEST_OOM_SCHED_H

#include <execinfo.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "edgeserve/memory.h"

#if defined(ES_ASAN)
#include <sanitizer/lsan_interface.h>
#endif

#define OOM_PREFIX 24
#define OOM_STRIDE 97
#define OOM_SITE_SEARCH 8 /* frames of the hook and the counting layer, at most */
#define OOM_SITE_DEPTH 4  /* frames that name an allocation site */
#define OOM_MAX_CALLS (1u << 21)

typedef struct oom_sched {
  uint64_t *key;        /* key[n-1]: site of attempt n in the counting pass */
  uint64_t calls;       /* attempts of the counting pass */
  unsigned sites;       /* distinct keys among them */
  unsigned char *fresh; /* fresh[n]: attempt n is its site's first */
  int full;             /* take every N */
  int persistent;       /* arm persistent failures */
  uint64_t trace_n;     /* print the stack of this attempt when it fails (0: none) */
} oom_sched;

static inline uint64_t oom_fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = (const unsigned char *)p;
  for (size_t i = 0; i < n; i++)
    h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}
#define OOM_FNV0 0xcbf29ce484222325ull

static inline void oom_record_site(void *user, uint64_t n, es_mem_tag tag, size_t size,
                                   const void *caller) {
  (void)size;
  oom_sched *s = (oom_sched *)user;
  if (n > OOM_MAX_CALLS)
    return;
  void *fr[OOM_SITE_SEARCH + OOM_SITE_DEPTH];
  int k = backtrace(fr, OOM_SITE_SEARCH + OOM_SITE_DEPTH);
  int at = 0;
  while (at < k && fr[at] != caller)
    at++;
  uint64_t h = oom_fnv(OOM_FNV0, &tag, sizeof tag);
  h = oom_fnv(h, &caller, sizeof caller);
  for (int i = at + 1; i < k && i < at + OOM_SITE_DEPTH; i++)
    h = oom_fnv(h, &fr[i], sizeof fr[i]);
  s->key[n - 1] = h;
}

/* The stack of the allocation made to fail (ES_OOM_N=... debugging);
 * symbols need the test linked with -rdynamic, addr2line does the rest. */
static inline void oom_trace_failure(void *user, uint64_t n, es_mem_tag tag, size_t size,
                                     const void *caller) {
  (void)caller;
  if (n != ((const oom_sched *)user)->trace_n)
    return;
  printf("# allocation %llu (%s, %zu bytes) fails here:\n", (unsigned long long)n,
         es_mem_tag_name(tag), size);
  fflush(stdout);
  void *fr[32];
  backtrace_symbols_fd(fr, backtrace(fr, 32), 1);
}

/* Reads ES_OOM_FULL, ES_OOM_PERSISTENT and ES_OOM_N; loads the unwinder
 * now (its first use allocates), not inside a counted attempt. 0, or -1
 * when out of (test) memory. */
static inline int oom_sched_init(oom_sched *s) {
  const char *e;
  s->full = (e = getenv("ES_OOM_FULL")) && atoi(e);
  s->persistent = (e = getenv("ES_OOM_PERSISTENT")) && atoi(e);
  s->trace_n = (e = getenv("ES_OOM_N")) ? strtoull(e, NULL, 10) : 0;
  s->key = (uint64_t *)calloc(OOM_MAX_CALLS, sizeof(uint64_t));
  s->fresh = NULL;
  void *fr[4];
  backtrace(fr, 4);
  return s->key ? 0 : -1;
}

static inline void oom_sched_fini(oom_sched *s) {
  free(s->key);
  free(s->fresh);
  s->key = NULL;
  s->fresh = NULL;
}

/* Counting pass: arm before the normal run, end after it. */
static inline void oom_count_begin(oom_sched *s) {
  es_mem_fault_config fc = {.fail_at = 0, .on_alloc = oom_record_site, .user = s};
  es_mem_fault_arm(&fc);
}

/* -1 when the pass made more attempts than can be recorded. */
static inline int oom_count_end(oom_sched *s) {
  es_mem_fault_disarm();
  es_mem_fault_stats fs;
  es_mem_fault_stats_get(&fs);
  s->calls = fs.calls;
  if (s->calls > OOM_MAX_CALLS)
    return -1;
  size_t cap = 1;
  while (cap < 2 * s->calls + 2)
    cap <<= 1;
  uint64_t *slot = (uint64_t *)calloc(cap, sizeof *slot);
  free(s->fresh);
  s->fresh = (unsigned char *)calloc(s->calls + 1, 1);
  if (!slot || !s->fresh) {
    free(slot);
    return -1;
  }
  s->sites = 0;
  for (uint64_t n = 1; n <= s->calls; n++) {
    uint64_t k = s->key[n - 1] | 1; /* 0 marks an empty slot */
    size_t i = (size_t)(k * 0x9e3779b97f4a7c15ull) & (cap - 1);
    while (slot[i] && slot[i] != k)
      i = (i + 1) & (cap - 1);
    if (!slot[i]) {
      slot[i] = k;
      s->fresh[n] = 1;
      s->sites++;
    }
  }
  free(slot);
  return 0;
}

/* Whether attempt N is on the schedule (N beyond the counting pass always
 * is: that is where the loop ends). */
static inline int oom_sched_takes(const oom_sched *s, uint64_t n) {
  return s->full || n > s->calls || n <= OOM_PREFIX || s->fresh[n] || n % OOM_STRIDE == 0;
}

/* Arm a failure at N (one-shot or persistent as configured). */
static inline void oom_arm(oom_sched *s, uint64_t n) {
  es_mem_fault_config fc = {.fail_at = n, .persistent = s->persistent};
  if (s->trace_n) {
    fc.on_alloc = oom_trace_failure;
    fc.user = s;
  }
  es_mem_fault_arm(&fc);
}

/* Attempts failed on purpose since the last arming. */
static inline uint64_t oom_injected(void) {
  es_mem_fault_stats fs;
  es_mem_fault_stats_get(&fs);
  return fs.injected;
}

/* ---- a text image for the OCR pipeline --------------------------------------- */

/* DIR/lines.png: two printed lines, 320x110, made with ImageMagick's
 * convert and the DejaVu Sans font (as test_ocr makes its images); its path
 * in out. -1 when convert or the font is missing. */
static inline int oom_text_image(const char *dir, char *out, size_t size) {
  extern char **environ;
  char font[1024] = "";
  FILE *p = popen("fc-match -f '%{file}' DejaVuSans 2>/dev/null", "r");
  if (p) {
    if (!fgets(font, sizeof font, p))
      font[0] = 0;
    pclose(p);
  }
  if (!font[0] || access(font, R_OK) != 0)
    return -1;
  snprintf(out, size, "%s/lines.png", dir);
  char *argv[] = {(char *)"convert", (char *)"-size", (char *)"320x110", (char *)"xc:white",
                  (char *)"-font", font, (char *)"-pointsize", (char *)"30", (char *)"-fill",
                  (char *)"black", (char *)"-annotate", (char *)"+16+42", (char *)"EDGE 2048",
                  (char *)"-annotate", (char *)"+16+92", (char *)"Serve 17 models", out, NULL};
  pid_t pid;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  int st = -1;
  if (posix_spawnp(&pid, "convert", &fa, NULL, argv, environ) == 0)
    waitpid(pid, &st, 0);
  posix_spawn_file_actions_destroy(&fa);
  return st == 0 && access(out, R_OK) == 0 ? 0 : -1;
}

/* ---- baseline: every tag's bytes and live blocks --------------------------- */

typedef struct oom_snapshot {
  es_mem_stats tag[ES_MEM_TAG_COUNT];
  size_t total;
} oom_snapshot;

static inline oom_snapshot oom_snap(void) {
  oom_snapshot s;
  for (int t = 0; t < ES_MEM_TAG_COUNT; t++)
    es_mem_stats_get((es_mem_tag)t, &s.tag[t]);
  s.total = es_mem_total();
  return s;
}

/* 0 when every tag holds the bytes and the blocks it held in base; else
 * prints the differences (and, under ASan, the stacks of the blocks no
 * longer reachable) and returns 1. */
static inline int oom_baseline_diff(const oom_snapshot *base, const char *what, uint64_t n) {
  oom_snapshot now = oom_snap();
  int bad = 0;
  for (int t = 0; t < ES_MEM_TAG_COUNT; t++) {
    const es_mem_stats *a = &base->tag[t], *b = &now.tag[t];
    long long live_a = (long long)(a->allocs - a->frees);
    long long live_b = (long long)(b->allocs - b->frees);
    if (a->current != b->current || live_a != live_b) {
      printf("# %s, N=%llu: tag %s holds %lld bytes and %lld blocks more than before\n", what,
             (unsigned long long)n, es_mem_tag_name((es_mem_tag)t),
             (long long)b->current - (long long)a->current, live_b - live_a);
      bad = 1;
    }
  }
  if (now.total != base->total)
    bad = 1;
#if defined(ES_ASAN)
  if (bad)
    __lsan_do_recoverable_leak_check();
#endif
  return bad;
}

#endif
