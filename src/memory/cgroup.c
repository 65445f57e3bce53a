/* Where the process stands: its memory cgroup's usage, limits and events.
 *
 * The kernel enforces memory per cgroup: above memory.high it reclaims and
 * throttles, at memory.max it OOM-kills inside the group. A server that
 * wants to say 503 before the kernel says OOM must read the same numbers.
 *
 * Finding them:
 *  1. /proc/self/cgroup names the group: "0::/path" for v2, "N:...memory...:
 *     /path" for the v1 memory controller.
 *  2. The group's directory is the mount's root joined with that path. Inside
 *     a container the mount's root often *is* the group (the path printed by
 *     the kernel then does not exist under it), so a missing directory falls
 *     back to the root.
 *  3. From the group up to the mount's root, every level with a limit is a
 *     candidate: a parent's limit binds its children, so the level with the
 *     least headroom (max - current) is the one reported, with its own
 *     current, high, max and events, all of a piece.
 *  4. v2 is tried first (it is the future and hybrid systems leave it without
 *     the memory controller), then v1; with neither, /proc/meminfo alone.
 *
 * Files are read whole with stdio, line by line; every line of a keyed file
 * (memory.events, memory.stat, memory.oom_control, meminfo) must be a key and
 * a number, so a malformed file is an error with its name in the detail and
 * never a silent zero. A missing file is not an error: kernels differ. */
#include "edgeserve/memory.h"
#include "common/internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* v1 prints "no limit" as PAGE_COUNTER_MAX pages (0x7ffffffffffff000 on
 * 64-bit kernels); anything from 2^60 up is that or an absurd setting. */
#define V1_UNLIMITED ((uint64_t)1 << 60)

/* Path buffers: a group directory must fit es_memstat.path anyway, and a few
 * KiB of stack keeps this callable from small-stacked threads. */
#define CG_PATH 1024
#define NUM_UNLIMITED UINT64_MAX

/* ---- small helpers --------------------------------------------------------- */

static size_t to_size(uint64_t v) { return v >= (uint64_t)SIZE_MAX ? SIZE_MAX : (size_t)v; }

static int join(char *dst, size_t cap, const char *a, const char *b) {
  int n = snprintf(dst, cap, "%s%s%s", a, (b[0] == '/' || b[0] == '\0') ? "" : "/", b);
  if (n < 0 || (size_t)n >= cap)
    return es__fail(ES_EINVAL, "es_memstat: path too long: %s/%s", a, b);
  return 0;
}

static int is_dir(const char *p) {
  struct stat s;
  return stat(p, &s) == 0 && S_ISDIR(s.st_mode);
}

/* Opens path for reading. Returns 1 with *f set, 0 when the file does not
 * exist, or a negative error. */
static int open_file(const char *path, FILE **f) {
  *f = fopen(path, "re");
  if (*f)
    return 1;
  if (errno == ENOENT || errno == ENOTDIR)
    return 0;
  return es__fail(errno == EACCES ? ES_EACCES : ES_EIO, "es_memstat: cannot open %s: %s",
                  path, strerror(errno));
}

/* Opens dir/name (name alone when dir is NULL), its path in path[CG_PATH]:
 * 1 with *f set, 0 when the file does not exist, or a negative error;
 * *present says which of the first two. */
static int open_in(const char *dir, const char *name, char *path, FILE **f, int *present) {
  int rc = dir ? join(path, CG_PATH, dir, name)
               : (snprintf(path, CG_PATH, "%s", name) < CG_PATH
                      ? 0
                      : es__fail(ES_EINVAL, "es_memstat: path too long: %s", name));
  *present = 0;
  if (rc < 0)
    return rc;
  rc = open_file(path, f);
  *present = rc > 0;
  return rc;
}

/* Reads one line into buf without its newline. 1 line read, 0 end of file,
 * negative for a line longer than the buffer. */
static int read_line(FILE *f, const char *path, char *buf, size_t cap) {
  if (!fgets(buf, (int)cap, f))
    return 0;
  size_t n = strlen(buf);
  if (n > 0 && buf[n - 1] == '\n')
    buf[--n] = '\0';
  else if (!feof(f))
    return es__fail(ES_EIO, "es_memstat: %s: line longer than %zu bytes", path, cap - 1);
  return 1;
}

/* A decimal number filling the whole of s (leading/trailing blanks aside),
 * or "max" when allow_max. */
static int parse_num(const char *s, int allow_max, uint64_t *out) {
  while (*s == ' ' || *s == '\t')
    s++;
  if (allow_max && strncmp(s, "max", 3) == 0) {
    const char *e = s + 3;
    while (*e == ' ' || *e == '\t' || *e == '\n')
      e++;
    if (*e == '\0') {
      *out = NUM_UNLIMITED;
      return 0;
    }
  }
  if (*s < '0' || *s > '9')
    return -1;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno == ERANGE)
    return -1;
  while (*end == ' ' || *end == '\t' || *end == '\n')
    end++;
  if (*end != '\0')
    return -1;
  *out = v;
  return 0;
}

/* A file holding one number. *present = 0 (and *out untouched) when the file
 * does not exist. */
static int read_num(const char *dir, const char *name, int allow_max, uint64_t *out,
                    int *present) {
  char path[CG_PATH], line[128];
  FILE *f;
  int rc = open_in(dir, name, path, &f, present);
  if (rc <= 0)
    return rc;
  rc = read_line(f, path, line, sizeof line);
  fclose(f);
  if (rc < 0)
    return rc;
  if (rc == 0 || parse_num(line, allow_max, out) < 0)
    return es__fail(ES_EIO, "es_memstat: %s: expected a number%s, got \"%.40s\"", path,
                    allow_max ? " or \"max\"" : "", rc == 0 ? "" : line);
  return 0;
}

typedef struct kv_want {
  const char *key;
  uint64_t *dst; /* set when the key is found */
  int *found;    /* may be NULL */
} kv_want;

/* A keyed file: every non-empty line is "key value" or "key: value", with an
 * optional " kB" (meminfo) that multiplies by 1024. */
static int read_keyed(const char *dir, const char *name, const kv_want *want, size_t nwant,
                      int *present) {
  char path[CG_PATH], line[256];
  FILE *f;
  int rc = open_in(dir, name, path, &f, present);
  if (rc <= 0)
    return rc;
  int lineno = 0;
  while ((rc = read_line(f, path, line, sizeof line)) > 0) {
    lineno++;
    char *p = line;
    while (*p == ' ' || *p == '\t')
      p++;
    if (*p == '\0')
      continue;
    char *key = p;
    while (*p && *p != ' ' && *p != '\t' && *p != ':')
      p++;
    size_t klen = (size_t)(p - key);
    if (*p == ':')
      p++;
    uint64_t v, mul = 1;
    char *unit = strstr(p, " kB");
    if (unit && unit[3] == '\0') {
      *unit = '\0';
      mul = 1024;
    }
    if (klen == 0 || parse_num(p, 0, &v) < 0 || (mul > 1 && v > UINT64_MAX / mul)) {
      rc = es__fail(ES_EIO, "es_memstat: %s line %d: expected \"key value\", got \"%.60s\"",
                    path, lineno, key);
      break;
    }
    for (size_t i = 0; i < nwant; i++)
      if (strlen(want[i].key) == klen && strncmp(want[i].key, key, klen) == 0) {
        *want[i].dst = v * mul;
        if (want[i].found)
          *want[i].found = 1;
      }
  }
  fclose(f);
  return rc < 0 ? rc : 0;
}

/* ---- /proc/self/cgroup -------------------------------------------------------- */

typedef struct cg_self {
  int has_v1, has_v2;
  char v1[CG_PATH]; /* path of the v1 memory group */
  char v2[CG_PATH]; /* path of the v2 group */
} cg_self;

static int controller_list_has(const char *list, size_t len, const char *name) {
  size_t nlen = strlen(name);
  const char *p = list, *end = list + len;
  while (p < end) {
    const char *c = memchr(p, ',', (size_t)(end - p));
    size_t l = c ? (size_t)(c - p) : (size_t)(end - p);
    if (l == nlen && strncmp(p, name, nlen) == 0)
      return 1;
    p += l + 1;
  }
  return 0;
}

/* A group path must be absolute and must not climb out of the mount. */
static int path_ok(const char *p) {
  if (p[0] != '/')
    return 0;
  for (const char *s = p; (s = strstr(s, "/..")) != NULL; s += 3)
    if (s[3] == '/' || s[3] == '\0')
      return 0;
  return 1;
}

static int read_self(const char *file, cg_self *self) {
  self->has_v1 = self->has_v2 = 0;
  if (!file)
    return 0;
  FILE *f;
  int rc = open_file(file, &f);
  if (rc <= 0)
    return rc; /* no /proc/self/cgroup: a kernel without cgroups */
  char line[CG_PATH + 128];
  int lineno = 0;
  while ((rc = read_line(f, file, line, sizeof line)) > 0) {
    lineno++;
    if (line[0] == '\0')
      continue;
    /* "hierarchy-id:controller-list:path"; the path may hold colons. */
    char *c1 = strchr(line, ':');
    char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    char *id_end;
    long id = strtol(line, &id_end, 10);
    if (!c2 || id_end != c1 || id < 0 || !path_ok(c2 + 1)) {
      rc = es__fail(ES_EIO, "es_memstat: %s line %d: expected \"id:controllers:/path\", got "
                    "\"%.80s\"", file, lineno, line);
      break;
    }
    const char *path = c2 + 1;
    if (strlen(path) >= CG_PATH) {
      rc = es__fail(ES_EINVAL, "es_memstat: %s line %d: group path longer than %d bytes",
                    file, lineno, CG_PATH - 1);
      break;
    }
    if (id == 0 && c2 == c1 + 1) {
      self->has_v2 = 1;
      snprintf(self->v2, sizeof self->v2, "%s", path);
    } else if (controller_list_has(c1 + 1, (size_t)(c2 - c1 - 1), "memory")) {
      self->has_v1 = 1;
      snprintf(self->v1, sizeof self->v1, "%s", path);
    }
  }
  fclose(f);
  return rc < 0 ? rc : 0;
}

/* ---- one cgroup hierarchy -------------------------------------------------- */

typedef struct level {
  uint64_t current, high, max;
} level;

/* The names of the files in one cgroup version. */
typedef struct cg_files {
  int version;
  const char *current, *high, *max;
  int allow_max;               /* "max" spells no limit (v2) */
  uint64_t unlimited_from;     /* values from here up mean no limit */
} cg_files;

static const cg_files V2 = {2, "memory.current", "memory.high", "memory.max", 1, NUM_UNLIMITED};
static const cg_files V1 = {1, "memory.usage_in_bytes", "memory.soft_limit_in_bytes",
                            "memory.limit_in_bytes", 0, V1_UNLIMITED};

/* Reads a level's usage and limits; *present = 0 without a usage file. */
static int read_level(const cg_files *cf, const char *dir, level *lv, int *present) {
  int rc = read_num(dir, cf->current, 0, &lv->current, present);
  if (rc < 0 || !*present)
    return rc;
  int have;
  lv->high = lv->max = NUM_UNLIMITED;
  if ((rc = read_num(dir, cf->high, cf->allow_max, &lv->high, &have)) < 0 ||
      (rc = read_num(dir, cf->max, cf->allow_max, &lv->max, &have)) < 0)
    return rc;
  if (lv->high >= cf->unlimited_from)
    lv->high = NUM_UNLIMITED;
  if (lv->max >= cf->unlimited_from)
    lv->max = NUM_UNLIMITED;
  return 0;
}

/* The events and page-cache figures of the chosen level. */
static int read_extras(const cg_files *cf, const char *dir, es_memstat *st) {
  int present, rc;
  uint64_t inactive = 0, total_inactive = 0;
  int have_total = 0;
  if (cf->version == 2) {
    const kv_want ev[] = {{"low", &st->events.low, NULL},
                          {"high", &st->events.high, NULL},
                          {"max", &st->events.max, NULL},
                          {"oom", &st->events.oom, NULL},
                          {"oom_kill", &st->events.oom_kill, NULL}};
    if ((rc = read_keyed(dir, "memory.events", ev, 5, &present)) < 0)
      return rc;
  } else {
    const kv_want oc[] = {{"oom_kill", &st->events.oom_kill, NULL}};
    if ((rc = read_num(dir, "memory.failcnt", 0, &st->events.max, &present)) < 0 ||
        (rc = read_keyed(dir, "memory.oom_control", oc, 1, &present)) < 0)
      return rc;
  }
  const kv_want ms[] = {{"inactive_file", &inactive, NULL},
                        {"total_inactive_file", &total_inactive, &have_total}};
  if ((rc = read_keyed(dir, "memory.stat", ms, 2, &present)) < 0)
    return rc;
  /* v1's plain inactive_file is this group alone; total_ includes children,
   * as current does. */
  st->inactive_file = to_size(have_total ? total_inactive : inactive);
  if (st->inactive_file > st->current)
    st->inactive_file = st->current;
  return 0;
}

/* Fills st from one hierarchy. *found = 0 when the group has no memory
 * files there (no such controller on this hierarchy). */
/* The group path in /proc/self/cgroup is relative to the hierarchy's root;
 * a mount whose root is a group (a container on a v1 host without a cgroup
 * namespace mounts its own group) shows that group at the mount point, so
 * the mount's root is stripped from the path first. */
static const char *below_mount_root(const char *group, const char *mount_root) {
  size_t n = mount_root ? strlen(mount_root) : 0;
  while (n > 1 && mount_root[n - 1] == '/')
    n--;
  if (n <= 1 || strncmp(group, mount_root, n) != 0 || (group[n] && group[n] != '/'))
    return group;
  return group[n] ? group + n : "/";
}

static int read_hierarchy(const cg_files *cf, const char *root_in, const char *mount_root,
                          const char *group, es_memstat *st, int *found) {
  *found = 0;
  group = below_mount_root(group, mount_root);
  char root[CG_PATH], dir[CG_PATH], best_dir[CG_PATH];
  size_t root_len = strlen(root_in);
  while (root_len > 1 && root_in[root_len - 1] == '/')
    root_len--;
  if (root_len >= sizeof root)
    return es__fail(ES_EINVAL, "es_memstat: path too long: %s", root_in);
  memcpy(root, root_in, root_len);
  root[root_len] = '\0';
  int rc = join(dir, sizeof dir, (root_len == 1 && root[0] == '/') ? "" : root, group);
  if (rc < 0)
    return rc;
  size_t len = strlen(dir);
  while (len > root_len && dir[len - 1] == '/')
    dir[--len] = '\0';
  if (!is_dir(dir)) { /* the mount's root is the group (container) */
    memcpy(dir, root, root_len + 1);
    len = root_len;
  }

  level best = {0, NUM_UNLIMITED, NUM_UNLIMITED};
  uint64_t best_room = NUM_UNLIMITED;
  for (int depth = 0;; depth++) {
    level lv;
    int present;
    if ((rc = read_level(cf, dir, &lv, &present)) < 0)
      return rc;
    if (!present) {
      if (depth == 0)
        return 0;
      break; /* an ancestor without memory files: the hierarchy's root */
    }
    uint64_t room = lv.max == NUM_UNLIMITED ? NUM_UNLIMITED
                                            : (lv.max > lv.current ? lv.max - lv.current : 0);
    if (depth == 0 || room < best_room) {
      best = lv;
      best_room = room;
      memcpy(best_dir, dir, len + 1);
    }
    if (len <= root_len)
      break;
    /* Up one level, never above the mount's root. */
    char *slash = strrchr(dir, '/');
    len = slash ? (size_t)(slash - dir) : 0;
    if (len < root_len)
      len = root_len;
    memcpy(dir, root, root_len); /* restores root "/" when len == 1 */
    dir[len] = '\0';
  }

  if (strlen(best_dir) >= sizeof st->path)
    return es__fail(ES_EINVAL, "es_memstat: cgroup path longer than %d bytes: %s",
                    ES_MEMSTAT_PATH_MAX - 1, best_dir);
  st->version = cf->version;
  st->current = to_size(best.current);
  st->high = to_size(best.high);
  st->max = to_size(best.max);
  memcpy(st->path, best_dir, strlen(best_dir) + 1);
  if ((rc = read_extras(cf, best_dir, st)) < 0)
    return rc;
  *found = 1;
  return 0;
}

/* ---- public ---------------------------------------------------------------- */

static int memstat_read(const char *proc_self_cgroup, const char *cgroup_root_v1_memory,
                        const char *v1_mount_root, const char *cgroup_root_v2,
                        const char *v2_mount_root, const char *proc_meminfo, es_memstat *out);

int es_memstat_read_at(const char *proc_self_cgroup, const char *cgroup_root_v1_memory,
                       const char *cgroup_root_v2, const char *proc_meminfo, es_memstat *out) {
  return memstat_read(proc_self_cgroup, cgroup_root_v1_memory, "/", cgroup_root_v2, "/",
                      proc_meminfo, out);
}

static int memstat_read(const char *proc_self_cgroup, const char *cgroup_root_v1_memory,
                        const char *v1_mount_root, const char *cgroup_root_v2,
                        const char *v2_mount_root, const char *proc_meminfo, es_memstat *out) {
  if (!out)
    return es__fail(ES_EINVAL, "es_memstat_read_at: NULL out");
  es_memstat st;
  memset(&st, 0, sizeof st);
  st.high = st.max = SIZE_MAX;

  cg_self self;
  int rc = read_self(proc_self_cgroup, &self);
  if (rc < 0)
    return rc;
  int found = 0;
  if (cgroup_root_v2 && self.has_v2 &&
      (rc = read_hierarchy(&V2, cgroup_root_v2, v2_mount_root, self.v2, &st, &found)) < 0)
    return rc;
  if (!found && cgroup_root_v1_memory && self.has_v1 &&
      (rc = read_hierarchy(&V1, cgroup_root_v1_memory, v1_mount_root, self.v1, &st, &found)) < 0)
    return rc;

  uint64_t total = 0, avail = 0, mfree = 0;
  int have_total = 0, have_avail = 0, have_free = 0, present = 0;
  if (proc_meminfo) {
    const kv_want mi[] = {{"MemTotal", &total, &have_total},
                          {"MemAvailable", &avail, &have_avail},
                          {"MemFree", &mfree, &have_free}};
    if ((rc = read_keyed(NULL, proc_meminfo, mi, 3, &present)) < 0)
      return rc;
    if (present && (!have_total || !(have_avail || have_free)))
      return es__fail(ES_EIO, "es_memstat: %s has no %s line", proc_meminfo,
                      have_total ? "MemAvailable or MemFree" : "MemTotal");
  }
  if (!present && st.max == SIZE_MAX)
    return es__fail(ES_ENOTSUP, "es_memstat: no cgroup memory limit found and %s unreadable",
                    proc_meminfo ? proc_meminfo : "meminfo (none given)");
  if (present) {
    st.mem_total = to_size(total);
    st.mem_available = to_size(have_avail ? avail : mfree);
    if (st.mem_available > st.mem_total)
      st.mem_available = st.mem_total;
  }
  if (!found) { /* the machine is the limit */
    st.version = 0;
    st.current = st.mem_total - st.mem_available;
    st.inactive_file = 0;
    st.high = st.max = SIZE_MAX;
    memset(&st.events, 0, sizeof st.events);
    st.path[0] = '\0';
  }
  *out = st;
  return 0;
}

/* Mount points from /proc/self/mountinfo: "id parent dev root mountpoint
 * opts [optional...] - fstype source superopts". Mount points with escaped
 * characters (\040) are left to the defaults. */
static void find_mounts(char *v1, size_t v1cap, char *v1root, char *v2, size_t v2cap,
                        char *v2root) {
  v1[0] = v2[0] = '\0';
  snprintf(v1root, v1cap, "/");
  snprintf(v2root, v2cap, "/");
  FILE *f = fopen("/proc/self/mountinfo", "re");
  if (!f)
    return;
  char line[CG_PATH + 512];
  while (fgets(line, sizeof line, f)) {
    char *tok[32], *save = NULL;
    int n = 0, dash = -1;
    for (char *t = strtok_r(line, " \n", &save); t && n < 32; t = strtok_r(NULL, " \n", &save)) {
      if (dash < 0 && n >= 6 && strcmp(t, "-") == 0)
        dash = n;
      tok[n++] = t;
    }
    if (dash < 0 || dash + 3 >= n || strchr(tok[4], '\\') || strchr(tok[3], '\\'))
      continue;
    const char *fstype = tok[dash + 1], *superopts = tok[dash + 3];
    if (strcmp(fstype, "cgroup2") == 0 && !v2[0]) {
      snprintf(v2, v2cap, "%s", tok[4]);
      snprintf(v2root, v2cap, "%s", tok[3]);
    } else if (strcmp(fstype, "cgroup") == 0 && !v1[0] &&
               controller_list_has(superopts, strlen(superopts), "memory")) {
      snprintf(v1, v1cap, "%s", tok[4]);
      snprintf(v1root, v1cap, "%s", tok[3]);
    }
  }
  fclose(f);
}

int es_memstat_read(es_memstat *out) {
  char v1[CG_PATH], v2[CG_PATH], v1root[CG_PATH], v2root[CG_PATH];
  find_mounts(v1, sizeof v1, v1root, v2, sizeof v2, v2root);
  if (!v1[0])
    snprintf(v1, sizeof v1, "%s", "/sys/fs/cgroup/memory");
  if (!v2[0])
    snprintf(v2, sizeof v2, "%s",
             is_dir("/sys/fs/cgroup/unified") ? "/sys/fs/cgroup/unified" : "/sys/fs/cgroup");
  return memstat_read("/proc/self/cgroup", v1, v1root, v2, v2root, "/proc/meminfo", out);
}
