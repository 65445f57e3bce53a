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
    return ES_EINVAL;
  FILE *f = fopen("/proc/self/status", "re");
  if (!f)
    return es__fail(ES_ENOTSUP, "cannot open /proc/self/status");
  char line[256];
  size_t klen = strlen(key);
  int rc = es__fail(ES_ENOTSUP, "/proc/self/status has no %s line", key);
  while (fgets(line, sizeof line, f)) {
    unsigned long long kb;
    if (strncmp(line, key, klen) == 0 && line[klen] == ':' &&
        sscanf(line + klen + 1, "%llu", &kb) == 1) {
      *out = (size_t)kb * 1024;
      rc = 0;
      break;
    }
  }
  fclose(f);
  return rc;
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
    return ES_EINVAL;
  FILE *f = fopen("/proc/self/smaps", "re");
  if (!f)
    return es__fail(ES_ENOTSUP, "cannot open /proc/self/smaps");
  uintptr_t a = (uintptr_t)addr;
  char line[512];
  int inside = 0, rc = es__fail(ES_EINVAL, "address %p is not in any mapping", addr);
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    unsigned long long kb;
    if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) { /* header: "lo-hi perms ..." */
      inside = a >= lo && a < hi;
      continue;
    }
    if (inside && sscanf(line, "Pss: %llu kB", &kb) == 1) {
      *out = (size_t)kb * 1024;
      rc = 0;
      break;
    }
  }
  fclose(f);
  return rc;
}
