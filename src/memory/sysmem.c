/* Process memory as the kernel reports it, from /proc/self.
 *
 * These are the numbers an OOM killer looks at, so benchmarks and the
 * capacity planner read them rather than trusting our own counters alone. */
#include "edgeserve/memory.h"
#include "common/internal.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int status_field(const char *key, size_t *out) {
  if (!out)
    return es__fail(ES_EINVAL, "es_sys: NULL out");
  FILE *f = fopen("/proc/self/status", "re");
  if (!f)
    return es__fail(ES_ENOTSUP, "cannot open /proc/self/status");
  char line[256];
  size_t klen = strlen(key);
  int found = 0;
  while (!found && fgets(line, sizeof line, f)) {
    unsigned long long kb;
    if (strncmp(line, key, klen) == 0 && line[klen] == ':' &&
        sscanf(line + klen + 1, "%llu", &kb) == 1) {
      *out = (size_t)kb * 1024;
      found = 1;
    }
  }
  fclose(f);
  /* The detail is only written on failure: a success must not replace the
   * caller's last failure detail. */
  return found ? 0 : es__fail(ES_ENOTSUP, "/proc/self/status has no %s line", key);
}

int es_sys_rss(size_t *out) { return status_field("VmRSS", out); }

int es_sys_peak_rss(size_t *out) { return status_field("VmHWM", out); }

int es_sys_peak_rss_reset(void) {
  int fd = open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
  if (fd < 0)
    return es__fail(ES_ENOTSUP, "cannot open /proc/self/clear_refs");
  ssize_t n = write(fd, "5", 1);
  close(fd);
  return n == 1 ? 0 : es__fail(ES_ENOTSUP, "kernel refused to reset the peak RSS");
}

int es_sys_pss_of(const void *addr, size_t *out) {
  if (!addr || !out)
    return es__fail(ES_EINVAL, "es_sys_pss_of: NULL %s", addr ? "out" : "address");
  FILE *f = fopen("/proc/self/smaps", "re");
  if (!f)
    return es__fail(ES_ENOTSUP, "cannot open /proc/self/smaps");
  uintptr_t a = (uintptr_t)addr;
  char line[512];
  int inside = 0, found = 0;
  /* A header line with a long path does not fit in line; its tail must not
   * be parsed as a line of its own. */
  int at_line_start = 1;
  while (!found && fgets(line, sizeof line, f)) {
    int starts_line = at_line_start;
    at_line_start = strchr(line, '\n') != NULL;
    if (!starts_line)
      continue;
    unsigned long lo, hi;
    unsigned long long kb;
    if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) { /* header: "lo-hi perms ..." */
      inside = a >= lo && a < hi;
      continue;
    }
    if (inside && sscanf(line, "Pss: %llu kB", &kb) == 1) {
      *out = (size_t)kb * 1024;
      found = 1;
    }
  }
  fclose(f);
  return found ? 0 : es__fail(ES_EINVAL, "address %p is not in any mapping", addr);
}
