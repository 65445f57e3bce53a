/* edgeserve bench-mem: BRIEF §7's failure and its cure, measured in one run.
 *
 * A long-running service allocates and frees tensor-sized blocks (64 KiB to
 * 64 MiB) with random lifetimes. We replay the same seeded operation sequence
 * against each allocator and compare latency, resident memory and
 * fragmentation:
 *
 *   glibc     malloc/free of the C library
 *   buddy     es_buddy_alloc/es_buddy_free (one pre-reserved region)
 *   jemalloc  malloc/free with libjemalloc preloaded (LD_PRELOAD)
 *   mimalloc  malloc/free with libmimalloc preloaded (LD_PRELOAD)
 *
 * Each measurement runs in a fresh child process (this binary re-executed
 * with --worker), so one allocator's retained memory never pollutes the next
 * one's RSS, and the peers are the real libraries, not re-implementations.
 * The operations are split into rounds; each round runs every allocator once
 * in a rotated order (A/B interleaved), so drift in a shared, noisy machine
 * hits all of them alike. Latency histograms from all rounds are merged.
 *
 * Two kinds of run, each in fresh processes:
 *   - latency runs (the long ones, 10 million operations by default) write
 *     only the first and last byte of each block, so the allocator's own cost
 *     is what is timed, and fragmentation is sampled from allocator stats;
 *   - memory runs (shorter) write every page of every block once, as a real
 *     tensor would be: resident memory is only meaningful for touched pages.
 *     Their wall time includes the page faults an allocator causes by giving
 *     memory back to the kernel and taking it again.
 * Allocation latency is timed around the allocator call alone.
 *
 * Finally the parent measures the request arena's bump allocation in batches
 * (a single alloc is shorter than the clock's resolution). */
#include "cli/cli.h"
#include "cli/measure.h"
#include "edgeserve/memory.h"

#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ==========================================================================
 * Options
 * ======================================================================== */

typedef struct bench_opts {
  uint64_t ops;          /* latency-run operations per allocator, all rounds */
  uint64_t rss_ops;      /* memory-run operations per allocator, all rounds */
  int touch_all;         /* worker: write every page (memory run) */
  int rounds;            /* interleaved rounds */
  uint64_t seed;
  size_t pool_bytes;     /* buddy pool capacity */
  size_t live_max;       /* the workload never keeps more than this live */
  int slots;             /* live-set slots: lifetimes are geometric */
  int samples;           /* fragmentation samples per worker */
  const char *only;      /* comma list of allocators, or NULL for all */
} bench_opts;

static void bench_usage(FILE *f) {
  fprintf(f,
          "usage: edgeserve bench-mem [--quick] [--ops N] [--rounds N] [--seed N]\n"
          "                           [--pool-mib N] [--live-mib N] [--only LIST]\n"
          "\n"
          "Replays one seeded workload of tensor-sized allocations (64 KiB-64 MiB,\n"
          "random lifetimes) against glibc malloc, the buddy pool, jemalloc and\n"
          "mimalloc, each in its own process, rounds interleaved; then times the\n"
          "request arena. Prints latency p50/p99/max, peak RSS, RSS after free,\n"
          "fragmentation over time and one line per claim with its ratio.\n"
          "\n"
          "  --quick       20k + 120 operations, 2 rounds, live set 128 MiB, buddy\n"
          "                pool 256 MiB (a demo, well under a minute; other options\n"
          "                still apply)\n"
          "  --ops N       latency-run operations per allocator (default 10000000)\n"
          "  --rss-ops N   memory-run operations per allocator, every page written\n"
          "                (default 30000)\n"
          "  --rounds N    interleaved rounds (default 5)\n"
          "  --seed N      workload seed (default 42)\n"
          "  --pool-mib N  buddy pool's first region in MiB (default 512; it may grow\n"
          "                to twice that, as BRIEF §8's growth rule allows)\n"
          "  --live-mib N  cap on live bytes in MiB (default 256)\n"
          "  --only LIST   e.g. glibc,buddy\n");
}

/* ==========================================================================
 * Latency histogram: log-linear, 16 sub-buckets per power of two (about 6%
 * resolution), constant memory whatever the number of operations.
 * ======================================================================== */

#define HIST_SUB 16
#define HIST_BUCKETS (HIST_SUB + 48 * HIST_SUB)

typedef struct hist {
  uint64_t n[HIST_BUCKETS];
  uint64_t count;
  uint64_t max;
} hist;

static int hist_index(uint64_t v) {
  if (v < HIST_SUB)
    return (int)v;
  int oct = 63 - __builtin_clzll(v); /* >= 4 */
  int sub = (int)((v >> (oct - 4)) & (HIST_SUB - 1));
  int i = HIST_SUB + (oct - 4) * HIST_SUB + sub;
  return i < HIST_BUCKETS ? i : HIST_BUCKETS - 1;
}

/* Middle of bucket i, in ns. */
static double hist_value(int i) {
  if (i < HIST_SUB)
    return i;
  int oct = (i - HIST_SUB) / HIST_SUB + 4;
  int sub = (i - HIST_SUB) % HIST_SUB;
  double lo = (double)((uint64_t)(HIST_SUB + sub) << (oct - 4));
  double width = (double)(1ull << (oct - 4));
  return lo + width / 2;
}

static void hist_add(hist *h, uint64_t v) {
  h->n[hist_index(v)]++;
  h->count++;
  if (v > h->max)
    h->max = v;
}

static double hist_pct(const hist *h, double p) {
  if (!h->count)
    return 0;
  uint64_t want = (uint64_t)ceil(p * (double)h->count);
  uint64_t seen = 0;
  for (int i = 0; i < HIST_BUCKETS; i++) {
    seen += h->n[i];
    if (seen >= want && h->n[i])
      return hist_value(i);
  }
  return (double)h->max;
}

/* ==========================================================================
 * The workload: tensor shapes as CNN activations have them (float32
 * C x H x W), kept to 64 KiB..64 MiB. Deterministic from the seed.
 * ======================================================================== */

static uint64_t rng_next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static size_t tensor_size(uint64_t *rng) {
  static const unsigned ch[] = {8, 16, 24, 32, 48, 64, 96, 120, 128, 192, 256, 384, 512};
  static const unsigned sp[] = {8,  10, 12,  16,  20,  24,  32,  40,  48, 60,
                                64, 80, 96, 120, 128, 160, 192, 240, 320, 640};
  for (;;) {
    size_t c = ch[rng_next(rng) % (sizeof ch / sizeof ch[0])];
    size_t h = sp[rng_next(rng) % (sizeof sp / sizeof sp[0])];
    size_t w = rng_next(rng) % 5 ? h : sp[rng_next(rng) % (sizeof sp / sizeof sp[0])];
    size_t bytes = c * h * w * 4;
    if (bytes >= (64u << 10) && bytes <= (64u << 20))
      return bytes;
  }
}


/* ==========================================================================
 * Worker: one allocator, one round, in its own process. Writes its results
 * to stdout as lines the parent parses.
 * ======================================================================== */

typedef struct backend {
  const char *name;
  const char *preload; /* library to preload, or NULL */
  const char *probe;   /* a symbol proving the preload took effect */
} backend;

static const backend backends_[] = {
    {"glibc", NULL, NULL},
    {"buddy", NULL, NULL},
    {"jemalloc", "libjemalloc.so.2", "mallctl"},
    {"mimalloc", "libmimalloc.so.2", "mi_version"},
};
#define NBACKENDS ((int)(sizeof backends_ / sizeof backends_[0]))

typedef struct slot {
  void *p;
  size_t size;
} slot;

static void touch_pages(void *p, size_t size) {
  volatile unsigned char *c = p;
  for (size_t off = 0; off < size; off += 4096)
    c[off] = (unsigned char)off;
  c[size - 1] = 1;
}

static void print_hist(const char *what, const hist *h) {
  printf("hist %s %" PRIu64, what, h->max);
  for (int i = 0; i < HIST_BUCKETS; i++)
    if (h->n[i])
      printf(" %d:%" PRIu64, i, h->n[i]);
  printf("\n");
}

/* One worker's state: its allocator, the live set and what it measured. */
typedef struct alloc_worker {
  const bench_opts *o;
  const backend *be;
  int is_buddy;
  es_buddy *pool;
  slot *slots;
  hist *ha, *hf;
  size_t rss0, live, live_peak;
  uint64_t failures, allocs;
} alloc_worker;

static void w_free(alloc_worker *w, slot *s) {
  uint64_t t0 = cli_now_ns();
  if (w->is_buddy)
    es_buddy_free(w->pool, s->p);
  else
    free(s->p);
  hist_add(w->hf, cli_now_ns() - t0);
  w->live -= s->size;
  s->p = NULL;
}

static void w_alloc(alloc_worker *w, slot *s, size_t want) {
  void *p = NULL;
  uint64_t t0 = cli_now_ns();
  if (w->is_buddy) {
    if (es_buddy_alloc(w->pool, want, &p) < 0)
      p = NULL;
  } else {
    p = malloc(want);
  }
  hist_add(w->ha, cli_now_ns() - t0);
  if (!p) {
    w->failures++;
    return;
  }
  w->allocs++;
  if (w->o->touch_all)
    touch_pages(p, want);
  else
    ((volatile unsigned char *)p)[0] = ((volatile unsigned char *)p)[want - 1] = 1;
  s->p = p;
  s->size = want;
  w->live += want;
  if (w->live > w->live_peak)
    w->live_peak = w->live;
}

/* One operation of the workload on slot k: free when the slot is taken,
 * else allocate; when the new block would push the live set over its cap,
 * the slot's neighbours are freed first until it fits. */
static void w_step(alloc_worker *w, int k, size_t want) {
  const bench_opts *o = w->o;
  slot *s = &w->slots[k];
  if (!s->p && w->live + want > o->live_max)
    for (int j = 1; j < o->slots && w->live + want > o->live_max; j++) {
      slot *v = &w->slots[(k + j) % o->slots];
      if (v->p)
        w_free(w, v);
    }
  if (s->p)
    w_free(w, s);
  else
    w_alloc(w, s, want);
}

/* A "sample" line: operations so far, live bytes, RSS above the start and
 * the allocator's fragmentation where it can say. */
static void w_sample(const alloc_worker *w, uint64_t done) {
  size_t rss = 0;
  es_sys_rss(&rss);
  double frag = -1, largest = -1;
  if (w->is_buddy) {
    es_buddy_stats st;
    es_buddy_stats_get(w->pool, &st);
    frag = st.fragmentation;
    largest = (double)st.largest_free;
  } else if (!w->be->preload) {
    struct mallinfo2 mi = mallinfo2();
    /* glibc: bytes free inside the heap that the kernel still backs */
    double held = (double)mi.arena + (double)mi.hblkhd;
    frag = held > 0 ? (double)mi.fordblks / held : 0;
  }
  printf("sample %" PRIu64 " %zu %zu %.4f %.0f\n", done, w->live, rss > w->rss0 ? rss - w->rss0 : 0,
         frag, largest);
}

/* The allocator named, with a buddy pool when it is "buddy". 0 and *be
 * set; 1 on an error (printed); 2 when a preloaded library is missing
 * ("unavailable" printed for the parent). */
static int w_open(alloc_worker *w, const char *name) {
  const bench_opts *o = w->o;
  for (int i = 0; i < NBACKENDS; i++)
    if (!strcmp(backends_[i].name, name))
      w->be = &backends_[i];
  if (!w->be) {
    fprintf(stderr, "bench-mem: unknown allocator %s\n", name);
    return 1;
  }
  if (w->be->probe && !dlsym(RTLD_DEFAULT, w->be->probe)) {
    printf("unavailable %s not preloaded\n", w->be->preload);
    return 2;
  }
  w->is_buddy = !strcmp(name, "buddy");
  if (w->is_buddy) {
    es_buddy_config cfg;
    es_buddy_config_default(&cfg);
    cfg.capacity = o->pool_bytes;
    /* BRIEF §8: when a level and all larger ones are empty, add a region
     * rather than fail; power-of-two rounding needs the headroom. */
    cfg.grow = 1;
    cfg.grow_max = 2 * o->pool_bytes;
    int rc = es_buddy_create(&cfg, &w->pool);
    if (rc < 0) {
      fprintf(stderr, "bench-mem: buddy pool: %s: %s\n", es_strerror(rc), es_last_error_detail());
      return 1;
    }
  }
  w->slots = es_mem_calloc(ES_MEM_CLI, (size_t)o->slots, sizeof *w->slots);
  w->ha = es_mem_calloc(ES_MEM_CLI, 1, sizeof *w->ha);
  w->hf = es_mem_calloc(ES_MEM_CLI, 1, sizeof *w->hf);
  return w->slots && w->ha && w->hf ? 0 : 1;
}

/* Frees everything, then prints the "result" line with what each
 * allocator still holds, and the histograms. */
static void w_finish(alloc_worker *w, uint64_t ops, uint64_t wall, size_t peak) {
  for (int k = 0; k < w->o->slots; k++)
    if (w->slots[k].p) {
      if (w->is_buddy)
        es_buddy_free(w->pool, w->slots[k].p);
      else
        free(w->slots[k].p);
    }
  size_t rss_end = 0;
  es_sys_rss(&rss_end);
  es_buddy_stats st;
  memset(&st, 0, sizeof st);
  if (w->is_buddy)
    es_buddy_stats_get(w->pool, &st);
  size_t rss0 = w->rss0;
  printf("result ops=%" PRIu64 " allocs=%" PRIu64 " failures=%" PRIu64 " wall_ns=%" PRIu64
         " rss_base=%zu peak_rss=%zu rss_end=%zu live_peak=%zu frag_end=%.6f largest_end=%zu"
         " capacity=%zu\n",
         ops, w->allocs, w->failures, wall, rss0, peak > rss0 ? peak - rss0 : 0,
         rss_end > rss0 ? rss_end - rss0 : 0, w->live_peak, w->is_buddy ? st.fragmentation : 0.0,
         w->is_buddy ? st.largest_free : 0, w->is_buddy ? st.capacity : 0);
  print_hist("alloc", w->ha);
  print_hist("free", w->hf);
  fflush(stdout);
}

static void w_close(alloc_worker *w) {
  es_buddy_destroy(w->pool);
  es_mem_free(w->slots);
  es_mem_free(w->ha);
  es_mem_free(w->hf);
}

static int worker_run(const bench_opts *o, const char *name, uint64_t ops, uint64_t seed) {
  alloc_worker w;
  memset(&w, 0, sizeof w);
  w.o = o;
  int rc = w_open(&w, name);
  if (rc) {
    w_close(&w);
    return rc == 2 ? 0 : 1;
  }
  es_sys_rss(&w.rss0);
  int can_reset_peak = es_sys_peak_rss_reset() == 0;
  uint64_t rng = seed;
  uint64_t sample_every = ops / (uint64_t)o->samples + 1;
  uint64_t t_start = cli_now_ns();
  for (uint64_t op = 0; op < ops; op++) {
    int k = (int)(rng_next(&rng) % (uint64_t)o->slots);
    size_t want = tensor_size(&rng);
    w_step(&w, k, want);
    if (op % sample_every == 0 || op + 1 == ops)
      w_sample(&w, op + 1);
  }
  uint64_t wall = cli_now_ns() - t_start;
  size_t peak = 0;
  if (can_reset_peak)
    es_sys_peak_rss(&peak);
  w_finish(&w, ops, wall, peak);
  w_close(&w);
  return 0;
}

/* ==========================================================================
 * Parent: spawn workers round by round, merge, print.
 * ======================================================================== */

typedef struct agg {
  int available;
  const char *why;
  hist alloc, free;
  uint64_t ops, allocs, failures, wall_ns;
  size_t peak_rss, rss_end, live_peak, largest_end, capacity;
  double frag_end;
  /* fragmentation over time, from the first round */
  int nsamples;
  uint64_t s_ops[64];
  size_t s_live[64], s_rss[64];
  double s_frag[64], s_largest[64];
} agg;

static void parse_hist(char *line, hist *h) {
  char *save = NULL;
  char *tok = strtok_r(line, " ", &save);
  if (!tok)
    return;
  uint64_t mx = strtoull(tok, NULL, 10);
  if (mx > h->max)
    h->max = mx;
  while ((tok = strtok_r(NULL, " \n", &save))) {
    int i;
    unsigned long long c;
    if (sscanf(tok, "%d:%llu", &i, &c) == 2 && i >= 0 && i < HIST_BUCKETS) {
      h->n[i] += c;
      h->count += c;
    }
  }
}

/* A worker's "result" line, folded into a (sums, and the largest of the
 * peaks). 0, or -1 when malformed. */
static int parse_result(const char *line, agg *a) {
  unsigned long long ops_, allocs_, fail_, wall_;
  size_t base_, peak_, end_, lp_, le_, capa_;
  double fe_;
  if (sscanf(line,
             "result ops=%llu allocs=%llu failures=%llu wall_ns=%llu rss_base=%zu "
             "peak_rss=%zu rss_end=%zu live_peak=%zu frag_end=%lf largest_end=%zu "
             "capacity=%zu",
             &ops_, &allocs_, &fail_, &wall_, &base_, &peak_, &end_, &lp_, &fe_, &le_,
             &capa_) != 11)
    return -1;
  a->available = 1;
  a->ops += ops_;
  a->allocs += allocs_;
  a->failures += fail_;
  a->wall_ns += wall_;
  if (peak_ > a->peak_rss)
    a->peak_rss = peak_;
  if (end_ > a->rss_end)
    a->rss_end = end_;
  if (lp_ > a->live_peak)
    a->live_peak = lp_;
  if (fe_ > a->frag_end)
    a->frag_end = fe_;
  a->largest_end = le_;
  a->capacity = capa_;
  return 0;
}

static int run_worker(const bench_opts *o, const backend *be, uint64_t ops, uint64_t seed, agg *a,
                      int first_round) {
  int fd[2];
  if (pipe(fd) < 0)
    return -1;
  pid_t pid = fork();
  if (pid < 0)
    return -1;
  if (pid == 0) {
    close(fd[0]);
    dup2(fd[1], STDOUT_FILENO);
    close(fd[1]);
    if (be->preload)
      setenv("LD_PRELOAD", be->preload, 1);
    char sops[32], sseed[32], spool[32], slive[32];
    snprintf(sops, sizeof sops, "%" PRIu64, ops);
    snprintf(sseed, sizeof sseed, "%" PRIu64, seed);
    snprintf(spool, sizeof spool, "%zu", o->pool_bytes >> 20);
    snprintf(slive, sizeof slive, "%zu", o->live_max >> 20);
    execl("/proc/self/exe", "edgeserve", "bench-mem", "--worker", be->name, "--ops", sops,
          "--seed", sseed, "--pool-mib", spool, "--live-mib", slive, "--touch",
          o->touch_all ? "all" : "ends", (char *)NULL);
    _exit(127);
  }
  close(fd[1]);
  FILE *f = fdopen(fd[0], "r");
  char *line = NULL;
  size_t cap = 0;
  int got_result = 0;
  while (f && getline(&line, &cap, f) > 0) {
    if (!strncmp(line, "unavailable ", 12)) {
      a->available = 0;
      a->why = "library not installed or not preloadable";
    } else if (!strncmp(line, "result ", 7)) {
      got_result |= parse_result(line, a) == 0;
    } else if (!strncmp(line, "hist alloc ", 11)) {
      parse_hist(line + 11, &a->alloc);
    } else if (!strncmp(line, "hist free ", 10)) {
      parse_hist(line + 10, &a->free);
    } else if (!strncmp(line, "sample ", 7) && first_round && a->nsamples < 64) {
      int i = a->nsamples;
      unsigned long long so;
      if (sscanf(line + 7, "%llu %zu %zu %lf %lf", &so, &a->s_live[i], &a->s_rss[i], &a->s_frag[i],
                 &a->s_largest[i]) == 5) {
        a->s_ops[i] = so;
        a->nsamples++;
      }
    }
  }
  free(line);
  if (f)
    fclose(f);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return -1;
  return got_result || !a->available ? 0 : -1;
}

/* Arena bump allocation, in batches: the clock cannot time one call. */
static int arena_bench(double *ns_per_alloc, double *malloc_ns_per_pair) {
  es_arena *a;
  int rc = es_arena_create(64u << 20, 64, &a);
  if (rc < 0)
    return rc;
  enum { BATCH = 1000, BATCHES = 2000 };
  uint64_t rng = 7;
  size_t sizes[BATCH];
  for (int i = 0; i < BATCH; i++)
    sizes[i] = (size_t)(rng_next(&rng) % 60000) + 64; /* fits 64 MiB per batch */
  hist per;
  memset(&per, 0, sizeof per);
  uint64_t best = UINT64_MAX;
  void *sink = NULL;
  for (int b = 0; b < BATCHES; b++) {
    uint64_t t0 = cli_now_ns();
    for (int i = 0; i < BATCH; i++) {
      void *p;
      if (es_arena_alloc(a, sizes[i], &p) == 0)
        sink = p;
    }
    uint64_t dt = cli_now_ns() - t0;
    if (dt < best)
      best = dt;
    hist_add(&per, dt);
    es_arena_reset(a);
  }
  *ns_per_alloc = hist_pct(&per, 0.5) / BATCH;
  es_arena_destroy(a);

  /* The same sizes through malloc+free, for scale. */
  memset(&per, 0, sizeof per);
  void *ptrs[BATCH];
  for (int b = 0; b < BATCHES / 4; b++) {
    uint64_t t0 = cli_now_ns();
    for (int i = 0; i < BATCH; i++)
      ptrs[i] = malloc(sizes[i]);
    for (int i = 0; i < BATCH; i++)
      free(ptrs[i]);
    hist_add(&per, cli_now_ns() - t0);
  }
  *malloc_ns_per_pair = hist_pct(&per, 0.5) / BATCH;
  (void)sink;
  (void)best;
  return 0;
}

static int parse_u64(const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s || *end || s[0] == '-')
    return -1;
  *out = v;
  return 0;
}

/* --quick: the same workload, short. Every claim keeps a measurement
 * behind it: all four allocators, latency and memory runs, two rounds in
 * turn. The live set and the pool are halved together, so that the short
 * memory runs reach the cap and the pool keeps the full run's headroom.
 * The memory runs' page faults are most of the time, so they are the
 * fewest: 60 a run (the live set reaches the cap in about 20). */
static void quick_opts(bench_opts *o, int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--quick")) {
      o->ops = 20000;
      o->rss_ops = 120;
      o->rounds = 2;
      o->live_max = (size_t)128 << 20;
      o->pool_bytes = (size_t)256 << 20;
    }
}

/* The options into o (and the worker's allocator when this process is
 * one). -1 to go on, else the exit status (0 after --help). */
static int parse_opts(bench_opts *o, const char **worker, int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    uint64_t v = 0;
    int has_val = i + 1 < argc;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      bench_usage(stdout);
      return 0;
    } else if (!strcmp(a, "--quick")) {
      /* applied before the loop (quick_opts), so that other options win */
    } else if (!strcmp(a, "--touch") && has_val) {
      o->touch_all = !strcmp(argv[++i], "all");
    } else if (!strcmp(a, "--worker") && has_val) {
      *worker = argv[++i];
    } else if (!strcmp(a, "--only") && has_val) {
      o->only = argv[++i];
    } else if (has_val && (!strcmp(a, "--ops") || !strcmp(a, "--rss-ops") ||
                           !strcmp(a, "--rounds") || !strcmp(a, "--seed") ||
                           !strcmp(a, "--pool-mib") || !strcmp(a, "--live-mib"))) {
      if (parse_u64(argv[++i], &v) < 0 || (strcmp(a, "--seed") && v == 0)) {
        fprintf(stderr, "bench-mem: %s wants a positive integer, got '%s'\n", a, argv[i]);
        return 2;
      }
      if (!strcmp(a, "--ops"))
        o->ops = v;
      else if (!strcmp(a, "--rss-ops"))
        o->rss_ops = v;
      else if (!strcmp(a, "--rounds"))
        o->rounds = v > 100 ? 100 : (int)v;
      else if (!strcmp(a, "--seed"))
        o->seed = v;
      else if (!strcmp(a, "--pool-mib"))
        o->pool_bytes = (size_t)v << 20;
      else
        o->live_max = (size_t)v << 20;
    } else {
      fprintf(stderr, "bench-mem: unknown or incomplete option '%s'\n\n", a);
      bench_usage(stderr);
      return 2;
    }
  }
  if (o->live_max < ((size_t)64 << 20)) {
    fprintf(stderr, "bench-mem: --live-mib must be at least 64 (the largest tensor)\n");
    return 2;
  }
  return -1;
}

/* Every round: the latency runs, then the memory runs, of each allocator
 * in turn (the order rotated each round). 0, or 1 (printed). */
static int run_rounds(const bench_opts *o, const int *use, agg *aggs, agg *mem,
                      uint64_t per_round, uint64_t rss_per_round) {
  for (int r = 0; r < o->rounds; r++) {
    for (int pass = 0; pass < 2; pass++) {
      bench_opts wo = *o;
      wo.touch_all = pass == 1;
      agg *dst = pass ? mem : aggs;
      for (int k = 0; k < NBACKENDS; k++) {
        int b = (k + r) % NBACKENDS;
        if (!use[b] || !dst[b].available)
          continue;
        if (run_worker(&wo, &backends_[b], pass ? rss_per_round : per_round,
                       o->seed + (uint64_t)r, &dst[b], r == 0) < 0) {
          fprintf(stderr, "bench-mem: worker for %s failed\n", backends_[b].name);
          return 1;
        }
      }
    }
    printf("  round %d/%d done\n", r + 1, o->rounds);
    fflush(stdout);
  }
  return 0;
}

static void print_table(const int *use, const agg *aggs, const agg *mem) {
  printf("\n%-9s %9s %9s %10s %9s %9s %10s %8s | %9s %9s %9s\n", "allocator", "alloc p50",
         "alloc p99", "alloc max", "free p50", "free p99", "free max", "failed", "peak RSS",
         "RSS end", "wall s");
  printf("%-9s %9s %9s %10s %9s %9s %10s %8s | %9s %9s %9s\n", "", "ns", "ns", "ns", "ns", "ns",
         "ns", "", "MiB", "MiB", "");
  for (int b = 0; b < NBACKENDS; b++) {
    const agg *a = &aggs[b], *m = &mem[b];
    if (!use[b])
      continue;
    if (!a->available) {
      printf("%-9s (skipped: %s)\n", backends_[b].name, a->why ? a->why : "not run");
      continue;
    }
    printf("%-9s %9.0f %9.0f %10" PRIu64 " %9.0f %9.0f %10" PRIu64 " %8" PRIu64
           " | %9.1f %9.1f %9.2f\n",
           backends_[b].name, hist_pct(&a->alloc, .5), hist_pct(&a->alloc, .99), a->alloc.max,
           hist_pct(&a->free, .5), hist_pct(&a->free, .99), a->free.max, a->failures,
           cli_mib(m->peak_rss), cli_mib(m->rss_end), (double)m->wall_ns / 1e9);
  }
  printf("(latency from the latency runs; RSS and wall time from the memory runs, above each\n"
         " worker's start; the live set peaked at %.1f MiB)\n",
         cli_mib(mem[0].available ? mem[0].live_peak : mem[1].live_peak));
}

static void print_over_time(const int *use, const agg *aggs, const agg *mem) {
  printf("\nfragmentation over time (latency run, round 1): live MiB / fragmentation\n");
  printf("  buddy: 1 - largest free block / free bytes; glibc: free bytes held in its heap / "
         "heap\n");
  for (int b = 0; b < NBACKENDS; b++) {
    const agg *a = &aggs[b];
    if (!use[b] || !a->available || !a->nsamples || a->s_frag[0] < 0)
      continue;
    printf("  %-9s", backends_[b].name);
    for (int i = 0; i < a->nsamples; i += (a->nsamples + 5) / 6)
      printf(" | %.0f/%.2f", cli_mib(a->s_live[i]), a->s_frag[i]);
    printf("\n");
  }
  printf("resident memory over time (memory run, round 1): live MiB / RSS MiB\n");
  for (int b = 0; b < NBACKENDS; b++) {
    const agg *m = &mem[b];
    if (!use[b] || !m->available || !m->nsamples)
      continue;
    printf("  %-9s", backends_[b].name);
    for (int i = 0; i < m->nsamples; i += (m->nsamples + 5) / 6)
      printf(" | %.0f/%.0f", cli_mib(m->s_live[i]), cli_mib(m->s_rss[i]));
    printf("\n");
  }
}

static double ratio(uint64_t a, uint64_t b) { return (double)a / (double)(b ? b : 1); }

/* The buddy pool's claims against glibc and the preloaded peers. */
static void print_buddy_claims(const bench_opts *o, const int *use, const agg *aggs,
                               const agg *mem) {
  const agg *g = &aggs[0], *bd = &aggs[1], *gm = &mem[0], *bm = &mem[1];
  double bp99 = hist_pct(&bd->alloc, .99) + hist_pct(&bd->free, .99);
  printf("  buddy alloc+free p99: %.0f ns (goal < 1000 ns)", bp99);
  if (g->available) {
    double gp99 = hist_pct(&g->alloc, .99) + hist_pct(&g->free, .99);
    printf("; glibc %.0f ns: ratio %.3f", gp99, bp99 / gp99);
  }
  printf("\n");
  printf("  buddy max alloc latency %" PRIu64 " ns", bd->alloc.max);
  if (g->available)
    printf(" vs glibc %" PRIu64 " ns: ratio %.3f", g->alloc.max,
           ratio(bd->alloc.max, g->alloc.max));
  printf("\n");
  printf("  buddy fragmentation after everything is freed: %.4f (largest free %.0f MiB; "
         "capacity %.0f MiB after growth from %.0f MiB; goal 0)\n",
         bd->frag_end, cli_mib(bd->largest_end), cli_mib(bd->capacity), cli_mib(o->pool_bytes));
  printf("  buddy failed allocations: %" PRIu64 " of %" PRIu64 "\n", bd->failures,
         bd->allocs + bd->failures);
  if (g->available && gm->available && bm->available) {
    printf("  peak RSS: buddy %.1f MiB vs glibc %.1f MiB: ratio %.3f\n", cli_mib(bm->peak_rss),
           cli_mib(gm->peak_rss), ratio(bm->peak_rss, gm->peak_rss));
    printf("  RSS after everything is freed: buddy %.1f MiB (kept for reuse, bounded by the "
           "pool) vs glibc %.1f MiB\n",
           cli_mib(bm->rss_end), cli_mib(gm->rss_end));
    printf("  memory-run wall time (page faults included): buddy %.2f s vs glibc %.2f s: ratio "
           "%.3f\n",
           (double)bm->wall_ns / 1e9, (double)gm->wall_ns / 1e9, ratio(bm->wall_ns, gm->wall_ns));
  }
  for (int b = 2; b < NBACKENDS; b++)
    if (use[b] && aggs[b].available && mem[b].available) {
      double p99 = hist_pct(&aggs[b].alloc, .99) + hist_pct(&aggs[b].free, .99);
      printf("  vs %s: alloc+free p99 %.0f ns (ratio %.3f), peak RSS %.1f MiB (ratio %.3f), "
             "memory-run wall %.2f s (ratio %.3f)\n",
             backends_[b].name, p99, bp99 / p99, cli_mib(mem[b].peak_rss),
             ratio(bm->peak_rss, mem[b].peak_rss), (double)mem[b].wall_ns / 1e9,
             ratio(bm->wall_ns, mem[b].wall_ns));
    }
}

static void print_claims(const bench_opts *o, const int *use, const agg *aggs, const agg *mem) {
  double arena_ns = 0, malloc_pair_ns = 0;
  int arc = arena_bench(&arena_ns, &malloc_pair_ns);
  printf("\nclaims (measured in this run):\n");
  if (arc == 0)
    printf("  arena alloc: %.2f ns per allocation (goal < 10 ns); glibc malloc+free of the same "
           "sizes %.1f ns: ratio %.3f\n",
           arena_ns, malloc_pair_ns, arena_ns / malloc_pair_ns);
  else
    printf("  arena alloc: not measured (%s)\n", es_strerror(arc));
  if (aggs[1].available)
    print_buddy_claims(o, use, aggs, mem);
}

int cli_cmd_bench_mem(int argc, char **argv) {
  bench_opts o = {.ops = 10000000,
                  .rss_ops = 30000,
                  .rounds = 5,
                  .seed = 42,
                  .pool_bytes = (size_t)512 << 20,
                  .live_max = (size_t)256 << 20,
                  .slots = 128,
                  .samples = 12,
                  .only = NULL};
  const char *worker = NULL;
  quick_opts(&o, argc, argv);
  int status = parse_opts(&o, &worker, argc, argv);
  if (status >= 0)
    return status;
  if (worker)
    return worker_run(&o, worker, o.ops, o.seed);

  /* aggs[b]: latency runs; mem[b]: memory runs (every page written) */
  agg *aggs = es_mem_calloc(ES_MEM_CLI, 2 * NBACKENDS, sizeof *aggs);
  if (!aggs)
    return 1;
  agg *mem = aggs + NBACKENDS;
  int use[NBACKENDS];
  for (int b = 0; b < NBACKENDS; b++) {
    use[b] = !o.only || strstr(o.only, backends_[b].name) != NULL;
    aggs[b].available = mem[b].available = use[b];
  }
  uint64_t per_round = o.ops / (uint64_t)o.rounds, rss_per_round = o.rss_ops / (uint64_t)o.rounds;
  if (per_round == 0 || rss_per_round == 0) {
    fprintf(stderr, "bench-mem: --ops and --rss-ops must be at least --rounds\n");
    es_mem_free(aggs);
    return 2;
  }
  printf("bench-mem: per allocator %" PRIu64 " latency operations and %" PRIu64
         " memory operations (every page written), %d interleaved rounds, seed %" PRIu64 "\n"
         "  tensors 64 KiB-64 MiB (float32 CxHxW), live set <= %.0f MiB, buddy pool %.0f MiB\n",
         per_round * (uint64_t)o.rounds, rss_per_round * (uint64_t)o.rounds, o.rounds, o.seed,
         cli_mib(o.live_max), cli_mib(o.pool_bytes));
  fflush(stdout);
  status = run_rounds(&o, use, aggs, mem, per_round, rss_per_round);
  if (status == 0) {
    print_table(use, aggs, mem);
    print_over_time(use, aggs, mem);
    print_claims(&o, use, aggs, mem);
  }
  es_mem_free(aggs);
  return status;
}
