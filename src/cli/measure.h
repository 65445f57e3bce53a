/* What the benchmarking commands measure, measured one way: percentiles of
 * a sample, the process's RSS peak sampled while a phase runs, its PSS and
 * CPU time, and bytes printed as MiB. One home each, so that bench,
 * bench-lane, bench-mem and the other commands report numbers that mean the
 * same thing (and match the ONNX Runtime scripts, scripts/ort/common.js). */
#ifndef ES_CLI_MEASURE_H
#define ES_CLI_MEASURE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* Sorts v[0..n) ascending. */
void cli_sort(double *v, size_t n);
/* Nearest-rank percentile of sorted v[0..n): v[ceil(q n) - 1], clamped;
 * NAN when n is 0. */
double cli_pct(const double *sorted, size_t n, double q);
/* The median as ort_run.js takes it: sorted[n / 2]; NAN when n is 0. */
double cli_median(const double *sorted, size_t n);

static inline double cli_mib(size_t bytes) { return (double)bytes / 1048576.0; }

/* PSS of the whole process (smaps_rollup), bytes; 0 when unreadable. */
size_t cli_pss(void);
/* User + system CPU seconds of the process so far. */
double cli_cpu_seconds(void);
/* Sleeps ns, resumed after signals. */
void cli_sleep_ns(uint64_t ns);

/* VmHWM is refreshed lazily by the kernel (memory given back with madvise
 * can peak between its updates), so a phase's peak RSS is also sampled
 * every CLI_RSS_PERIOD_MS by a thread, as the ONNX Runtime scripts do. */
#define CLI_RSS_PERIOD_MS 50

typedef struct cli_rss_sampler {
  pthread_t thread;
  int started;
  atomic_int stop;
  atomic_size_t max;       /* the largest RSS seen, bytes */
  atomic_ulong samples;
} cli_rss_sampler;

/* Starts sampling; the peak starts at `floor` bytes. When no thread can be
 * started the peak stays at floor (callers also read VmHWM). */
void cli_rss_sampler_start(cli_rss_sampler *s, size_t floor);
/* Stops and joins; safe to call again, or without a start after a memset. */
void cli_rss_sampler_stop(cli_rss_sampler *s);

/* Hardware counters of the calling thread (perf_event_open): instructions
 * and last-level cache misses, counted between start and stop. Virtual
 * machines and locked-down kernels often have none: open then fails with
 * why (e.g. "perf_event_open(instructions): No such file or directory")
 * and the caller says so rather than printing zeros. */
typedef struct cli_perf {
  int fd[2]; /* instructions, cache misses; -1 when closed */
  char why[160];
} cli_perf;

/* 0, or -1 with p->why set (nothing left open). */
int cli_perf_open(cli_perf *p);
void cli_perf_start(cli_perf *p);
/* Stops and reads both counters. */
void cli_perf_stop(cli_perf *p, uint64_t *instructions, uint64_t *cache_misses);
void cli_perf_close(cli_perf *p);

#endif
