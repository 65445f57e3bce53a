/* Measurement helpers of the CLI (see measure.h). */
#include "cli/measure.h"
#include "edgeserve/memory.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <linux/perf_event.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

void cli_sort(double *v, size_t n) {
  if (n)
    qsort(v, n, sizeof *v, cmp_double);
}

double cli_pct(const double *sorted, size_t n, double q) {
  if (n == 0)
    return NAN;
  double r = ceil(q * (double)n) - 1;
  size_t i = r < 0 ? 0 : (size_t)r;
  return sorted[i < n ? i : n - 1];
}

double cli_median(const double *sorted, size_t n) { return n ? sorted[n / 2] : NAN; }

size_t cli_pss(void) {
  FILE *f = fopen("/proc/self/smaps_rollup", "re");
  if (!f)
    return 0;
  char line[256];
  unsigned long long kb = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "Pss: %llu kB", &kb) == 1)
      break;
  fclose(f);
  return (size_t)kb * 1024;
}

double cli_cpu_seconds(void) {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0)
    return 0;
  return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
         (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

void cli_sleep_ns(uint64_t ns) {
  struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000ull),
                        .tv_nsec = (long)(ns % 1000000000ull)};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

static void *sampler_main(void *arg) {
  cli_rss_sampler *s = arg;
  while (!atomic_load(&s->stop)) {
    size_t v = 0;
    if (es_sys_rss(&v) == 0) {
      if (v > atomic_load(&s->max))
        atomic_store(&s->max, v);
      atomic_fetch_add(&s->samples, 1);
    }
    cli_sleep_ns(CLI_RSS_PERIOD_MS * 1000000ull);
  }
  return NULL;
}

void cli_rss_sampler_start(cli_rss_sampler *s, size_t floor) {
  atomic_store(&s->stop, 0);
  atomic_store(&s->max, floor);
  atomic_store(&s->samples, 0);
  s->started = pthread_create(&s->thread, NULL, sampler_main, s) == 0;
}

void cli_rss_sampler_stop(cli_rss_sampler *s) {
  atomic_store(&s->stop, 1);
  if (s->started)
    pthread_join(s->thread, NULL);
  s->started = 0;
}

/* ---- hardware counters ------------------------------------------------------ */

int cli_perf_open(cli_perf *p) {
  static const struct {
    uint64_t config;
    const char *name;
  } ev[2] = {{PERF_COUNT_HW_INSTRUCTIONS, "instructions"},
             {PERF_COUNT_HW_CACHE_MISSES, "cache-misses"}};
  p->fd[0] = p->fd[1] = -1;
  p->why[0] = '\0';
  for (int i = 0; i < 2; i++) {
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.type = PERF_TYPE_HARDWARE;
    a.size = sizeof a;
    a.config = ev[i].config;
    a.disabled = 1;
    a.exclude_kernel = 1; /* what the engine's own code does */
    a.exclude_hv = 1;
    p->fd[i] = (int)syscall(SYS_perf_event_open, &a, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
    if (p->fd[i] < 0) {
      snprintf(p->why, sizeof p->why, "perf_event_open(%s): %s", ev[i].name, strerror(errno));
      cli_perf_close(p);
      return -1;
    }
  }
  return 0;
}

void cli_perf_start(cli_perf *p) {
  for (int i = 0; i < 2; i++)
    if (p->fd[i] >= 0) {
      ioctl(p->fd[i], PERF_EVENT_IOC_RESET, 0);
      ioctl(p->fd[i], PERF_EVENT_IOC_ENABLE, 0);
    }
}

void cli_perf_stop(cli_perf *p, uint64_t *instructions, uint64_t *cache_misses) {
  uint64_t v[2] = {0, 0};
  for (int i = 0; i < 2; i++)
    if (p->fd[i] >= 0) {
      ioctl(p->fd[i], PERF_EVENT_IOC_DISABLE, 0);
      if (read(p->fd[i], &v[i], sizeof v[i]) != (ssize_t)sizeof v[i])
        v[i] = 0;
    }
  *instructions = v[0];
  *cache_misses = v[1];
}

void cli_perf_close(cli_perf *p) {
  for (int i = 0; i < 2; i++) {
    if (p->fd[i] >= 0)
      close(p->fd[i]);
    p->fd[i] = -1;
  }
}
