/* Admission decisions inside a real memory cgroup, end to end.
 *
 * What is tested: that the runtime, fed by es_memstat_read on the live
 * kernel files (not a fake memstat_fn), says no before the kernel has to.
 *   1. test_pressure_in_real_group: a child process joins a memory cgroup
 *      the test makes under its own group (hard limit 512 MiB, soft mark
 *      448 MiB: v1 memory.limit_in_bytes / memory.soft_limit_in_bytes, v2
 *      memory.max / memory.high). es_memstat_read must report that group; a
 *      request runs at pressure NONE; anonymous memory touched up to between
 *      the soft and hard watermarks of min(high, max) must turn
 *      es_runtime_watch_now to SOFT and refuse a submit with ES_EAGAIN and
 *      MEMORY_PRESSURE; unmapping it must bring NONE back and a request must
 *      run again. No OOM kill, no hit of the hard limit, child not killed.
 *   2. test_budget_in_real_group: in such a group, memory_budget_bytes =
 *      limit / 4: a request larger than the whole budget is ES_ENOSPC with
 *      retry-after 0; requests queued while paused are admitted until the
 *      next would exceed the budget, which is refused OVER_MEMORY with a
 *      retry-after; after resuming every admitted one completes and the
 *      reservations all come back.
 * Why a child process: moving the test process itself would charge the
 * cmocka runner's memory to the group and, on v2, would block enabling the
 * controller in its own group; a child also makes an OOM kill observable
 * (it dies, the runner does not). The child reports through its exit code
 * (0, or a code per failed check, printed with what failed on stderr),
 * since cmocka asserts cannot cross the fork; the parent asserts on it.
 * Why mmap for the ballast: munmap gives the pages back to the kernel at
 * once, where free() may keep them (malloc arenas, ASan's quarantine), and
 * the test needs usage to drop for real.
 *
 * Where the groups are: /proc/self/cgroup names the process's group and
 * /proc/self/mountinfo the hierarchies' mount points (the usual ones only as
 * a fallback). cgroup v2 is used when its mount has the memory controller
 * and the process's group can hand it down (cgroup.subtree_control), else
 * the v1 memory controller. When no group can be made (no controller, no
 * permission, read-only mount) the tests print "# cgroup: <why>: skipped"
 * and skip; without the fetched models (scripts/setup/fetch-models.sh) likewise.
 * The group is removed whatever the outcome: every check in the parent
 * comes after the rmdir. */
#include "es_test.h"

#include "edgeserve/engine.h"
#include "edgeserve/runtime.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef ES_SOURCE_DIR
#define ES_SOURCE_DIR "."
#endif

#define MIB ((size_t)1 << 20)
/* The group's limits. 512 MiB leaves room for a runtime, a model and the
 * ballast even under ASan; the soft mark below the hard one makes the gate
 * prove it binds on min(high, max), not on max alone. */
#define GROUP_MAX (512 * MIB)
#define GROUP_HIGH (448 * MIB)
/* How long a child may take before the parent kills it (CTest's timeout
 * for the whole file is 300 s, two children run). */
#define CHILD_DEADLINE_MS 120000
#define GROUP_PREFIX "es-rtcg-"

static char dir_[PATH_MAX];

static const char *model_path(const char *file) {
  static char p[PATH_MAX * 2];
  snprintf(p, sizeof p, "%s/%s", dir_, file);
  return p;
}

static void sleep_ms(int ms) {
  struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* ---- small file helpers ---------------------------------------------------- */

/* 0, or -errno (open and write errors both: the cgroup files report a bad
 * value or a refused move at write time). */
static int write_str(const char *dir, const char *file, const char *val) {
  char p[PATH_MAX * 2];
  snprintf(p, sizeof p, "%s/%s", dir, file);
  int fd = open(p, O_WRONLY | O_CLOEXEC);
  if (fd < 0)
    return -errno;
  ssize_t n = write(fd, val, strlen(val));
  int err = n < 0 ? errno : 0;
  if (close(fd) != 0 && !err)
    err = errno;
  return err ? -err : (n == (ssize_t)strlen(val) ? 0 : -EIO);
}

static int read_str(const char *dir, const char *file, char *buf, size_t cap) {
  char p[PATH_MAX * 2];
  snprintf(p, sizeof p, "%s/%s", dir, file);
  buf[0] = '\0';
  FILE *f = fopen(p, "re");
  if (!f)
    return -errno;
  size_t n = fread(buf, 1, cap - 1, f);
  buf[n] = '\0';
  fclose(f);
  return 0;
}

/* The value of "key N" in a keyed cgroup file (memory.events,
 * memory.oom_control); -1 when the file or the key is missing. */
static long long read_key(const char *dir, const char *file, const char *key) {
  char buf[4096];
  if (read_str(dir, file, buf, sizeof buf) != 0)
    return -1;
  size_t kl = strlen(key);
  for (char *line = buf; line;) {
    if (strncmp(line, key, kl) == 0 && line[kl] == ' ')
      return strtoll(line + kl + 1, NULL, 10);
    char *nl = strchr(line, '\n');
    line = nl ? nl + 1 : NULL;
  }
  return -1;
}

/* Whether a list separated by blanks or commas holds word. */
static int has_word(const char *list, const char *word) {
  size_t wl = strlen(word);
  for (const char *p = list; *p;) {
    size_t l = strcspn(p, " ,\t\n");
    if (l == wl && strncmp(p, word, wl) == 0)
      return 1;
    p += l;
    p += strspn(p, " ,\t\n");
  }
  return 0;
}

static int is_dir(const char *p) {
  struct stat s;
  return stat(p, &s) == 0 && S_ISDIR(s.st_mode);
}

/* ---- where the process's memory cgroup is --------------------------------- */

/* The group path on one hierarchy from /proc/self/cgroup: v2's "0::/path"
 * when v1 is 0, else the v1 line whose controllers include memory. */
static int self_group(int v1, char *out, size_t cap) {
  FILE *f = fopen("/proc/self/cgroup", "re");
  if (!f)
    return -1;
  char line[PATH_MAX + 256];
  int found = -1;
  while (found < 0 && fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = '\0';
    char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2)
      continue;
    *c2 = '\0';
    int match = v1 ? has_word(c1 + 1, "memory") : (strcmp(line, "0") == 0 && c1[1] == '\0');
    if (match) {
      snprintf(out, cap, "%s", c2 + 1);
      found = 0;
    }
  }
  fclose(f);
  return found;
}

/* mountinfo escapes blanks and backslashes as \ooo. */
static void unescape(char *s) {
  char *w = s;
  for (char *r = s; *r; r++) {
    if (r[0] == '\\' && r[1] >= '0' && r[1] <= '3' && r[2] >= '0' && r[2] <= '7' &&
        r[3] >= '0' && r[3] <= '7') {
      *w++ = (char)((r[1] - '0') * 64 + (r[2] - '0') * 8 + (r[3] - '0'));
      r += 3;
    } else {
      *w++ = *r;
    }
  }
  *w = '\0';
}

/* The first mount of fstype ("cgroup2", or "cgroup" with the memory
 * controller among its super options) from /proc/self/mountinfo: "id parent
 * dev root mountpoint opts [optional...] - fstype source superopts". root is
 * the group the mount shows as its top (not "/" for a bind mount of a
 * group). */
static int find_mount(const char *fstype, char *mnt, char *root, size_t cap) {
  FILE *f = fopen("/proc/self/mountinfo", "re");
  if (!f)
    return -1;
  char line[PATH_MAX * 3];
  int found = -1;
  while (found < 0 && fgets(line, sizeof line, f)) {
    char *tok[64], *save = NULL;
    int n = 0, dash = -1;
    for (char *t = strtok_r(line, " \n", &save); t && n < 64; t = strtok_r(NULL, " \n", &save)) {
      if (dash < 0 && n >= 6 && strcmp(t, "-") == 0)
        dash = n;
      tok[n++] = t;
    }
    if (dash < 0 || dash + 3 >= n || strcmp(tok[dash + 1], fstype) != 0)
      continue;
    if (strcmp(fstype, "cgroup") == 0 && !has_word(tok[dash + 3], "memory"))
      continue;
    unescape(tok[3]);
    unescape(tok[4]);
    snprintf(root, cap, "%s", tok[3]);
    snprintf(mnt, cap, "%s", tok[4]);
    found = 0;
  }
  fclose(f);
  return found;
}

/* The directory of group path `grp` on a hierarchy mounted at mnt showing
 * `root` as its top. A path under root is taken relative to it; a path the
 * mount does not show (a container whose mount's root is its own group)
 * falls back to the mount itself. */
static void group_dir(const char *mnt, const char *root, const char *grp, char *out, size_t cap) {
  const char *rel = grp;
  size_t rl = strlen(root);
  if (strcmp(root, "/") != 0 && strncmp(grp, root, rl) == 0 && (grp[rl] == '/' || !grp[rl]))
    rel = grp + rl;
  snprintf(out, cap, "%s%s", mnt, strcmp(rel, "/") == 0 ? "" : rel);
  if (!is_dir(out))
    snprintf(out, cap, "%s", mnt);
}

/* ---- the test's group ------------------------------------------------------ */

typedef struct cg_env {
  int version;              /* 1 or 2 */
  char own[PATH_MAX];       /* the process's group directory */
  char grp[PATH_MAX + 64];  /* the group made for the child */
  char name[64];            /* its last path component */
  int enabled_subtree;      /* v2: the test enabled memory in own's
                               cgroup.subtree_control (undone at the end) */
} cg_env;

/* Groups of earlier runs that were killed before they could clean up
 * (CTest timeout): named with a pid that no longer exists. */
static void remove_stale(const char *own) {
  DIR *d = opendir(own);
  if (!d)
    return;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    int pid, idx;
    if (sscanf(de->d_name, GROUP_PREFIX "%d-%d", &pid, &idx) != 2 || pid <= 0)
      continue;
    if (kill(pid, 0) == 0 || errno != ESRCH)
      continue;
    char p[PATH_MAX * 2];
    snprintf(p, sizeof p, "%s/%s", own, de->d_name);
    if (rmdir(p) == 0)
      printf("# removed a stale group %s\n", p);
  }
  closedir(d);
}

/* v2: the process's group, if the mount has the memory controller and the
 * group hands it down to children. 0, or -1 with why filled. */
static int pick_v2(cg_env *e, char *why, size_t cap) {
  char mnt[PATH_MAX], root[PATH_MAX], grp[PATH_MAX], buf[1024];
  if (find_mount("cgroup2", mnt, root, sizeof mnt) != 0) {
    /* The usual places: unified under a v1 tmpfs (hybrid), or the top. */
    const char *fb = NULL;
    if (read_str("/sys/fs/cgroup/unified", "cgroup.controllers", buf, sizeof buf) == 0)
      fb = "/sys/fs/cgroup/unified";
    else if (read_str("/sys/fs/cgroup", "cgroup.controllers", buf, sizeof buf) == 0)
      fb = "/sys/fs/cgroup";
    if (!fb) {
      snprintf(why, cap, "no cgroup v2 mount");
      return -1;
    }
    snprintf(mnt, sizeof mnt, "%s", fb);
    snprintf(root, sizeof root, "/");
  }
  if (self_group(0, grp, sizeof grp) != 0) {
    snprintf(why, cap, "no v2 line in /proc/self/cgroup");
    return -1;
  }
  group_dir(mnt, root, grp, e->own, sizeof e->own);
  /* The controllers a group may enable for its children. */
  if (read_str(e->own, "cgroup.controllers", buf, sizeof buf) != 0 || !has_word(buf, "memory")) {
    buf[strcspn(buf, "\n")] = '\0';
    snprintf(why, cap, "cgroup v2 at %s has no memory controller (controllers: %.200s)", e->own,
             buf[0] ? buf : "none");
    return -1;
  }
  if (read_str(e->own, "cgroup.subtree_control", buf, sizeof buf) != 0 || !has_word(buf, "memory")) {
    /* v2 lets only groups without processes of their own (or the root)
     * enable controllers for children: EBUSY otherwise. */
    int rc = write_str(e->own, "cgroup.subtree_control", "+memory");
    if (rc < 0) {
      snprintf(why, cap, "cannot enable memory in %s/cgroup.subtree_control: %s", e->own,
               strerror(-rc));
      return -1;
    }
    e->enabled_subtree = 1;
  }
  e->version = 2;
  return 0;
}

/* v1: the memory controller's hierarchy. */
static int pick_v1(cg_env *e, char *why, size_t cap) {
  char mnt[PATH_MAX], root[PATH_MAX], grp[PATH_MAX];
  if (find_mount("cgroup", mnt, root, sizeof mnt) != 0) {
    if (!is_dir("/sys/fs/cgroup/memory")) {
      snprintf(why, cap, "no cgroup v1 memory controller mounted");
      return -1;
    }
    snprintf(mnt, sizeof mnt, "%s", "/sys/fs/cgroup/memory");
    snprintf(root, sizeof root, "/");
  }
  if (self_group(1, grp, sizeof grp) != 0) {
    snprintf(why, cap, "no memory line in /proc/self/cgroup");
    return -1;
  }
  group_dir(mnt, root, grp, e->own, sizeof e->own);
  e->version = 1;
  return 0;
}

/* Hand the controller back only when no other group below own uses it: a
 * test running at the same time (test_cgroup) may have made one, and
 * disabling memory would take its memory files away. */
static void undo_subtree(cg_env *e) {
  if (!e->enabled_subtree)
    return;
  DIR *d = opendir(e->own);
  int others = 0;
  struct dirent *de;
  while (d && (de = readdir(d)) != NULL) {
    char p[PATH_MAX * 2];
    snprintf(p, sizeof p, "%s/%s", e->own, de->d_name);
    others += de->d_name[0] != '.' && is_dir(p);
  }
  if (d)
    closedir(d);
  if (others == 0 && write_str(e->own, "cgroup.subtree_control", "-memory") == 0)
    e->enabled_subtree = 0;
  else
    printf("# left memory enabled in %s/cgroup.subtree_control (%d other groups)\n", e->own,
           others);
}

/* rmdir, retried: the kernel may take a moment after the last task left. */
static int cg_remove(cg_env *e) {
  int rc = -1, err = 0;
  for (int i = 0; i < 500; i++) {
    if ((rc = rmdir(e->grp)) == 0 || errno == ENOENT) {
      rc = 0;
      break;
    }
    err = errno;
    if (err != EBUSY)
      break;
    sleep_ms(10);
  }
  printf("# removed %s: %s\n", e->grp, rc == 0 ? "yes" : strerror(err));
  undo_subtree(e);
  return rc;
}

static int skippable(int err) { return err == EACCES || err == EPERM || err == EROFS; }

#define SKIP_BECAUSE(...)                                                      \
  do {                                                                         \
    printf("# cgroup: ");                                                      \
    printf(__VA_ARGS__);                                                       \
    printf(": skipped\n");                                                     \
    skip();                                                                    \
  } while (0)

/* Make <own>/es-rtcg-<pid>-<idx> with the limits, or skip saying why. */
static void cg_make(cg_env *e, int idx) {
  memset(e, 0, sizeof *e);
  char why2[PATH_MAX + 512], why1[PATH_MAX + 512];
  /* v2 first, as es_memstat_read: with the controller on v2 it is not on v1. */
  if (pick_v2(e, why2, sizeof why2) != 0 && pick_v1(e, why1, sizeof why1) != 0)
    SKIP_BECAUSE("%s; %s", why2, why1);

  /* A limit of an ancestor with less room than ours would bind instead (the
   * reader reports the tightest level), and the machine must hold it all. */
  es_memstat st;
  if (es_memstat_read(&st) != 0) {
    undo_subtree(e);
    SKIP_BECAUSE("es_memstat_read fails here: %s", es_last_error_detail());
  }
  size_t need = GROUP_MAX + 64 * MIB;
  if (st.max != SIZE_MAX && st.max - (st.current < st.max ? st.current : st.max) < need) {
    undo_subtree(e);
    SKIP_BECAUSE("%s has less than %zu MiB of room under its limit", st.path, need / MIB);
  }
  /* The gate watches the machine too (meminfo): it must stay below its
   * soft mark with the group full, or the machine would be what refuses. */
  es_runtime_config defaults;
  es_runtime_config_default(&defaults);
  if (st.mem_total &&
      (st.mem_available < 2 * need ||
       (double)(st.mem_total - st.mem_available + need) > defaults.soft_ratio * (double)st.mem_total)) {
    undo_subtree(e);
    SKIP_BECAUSE("the machine has only %zu of %zu MiB available", st.mem_available / MIB,
                 st.mem_total / MIB);
  }

  remove_stale(e->own);
  snprintf(e->name, sizeof e->name, GROUP_PREFIX "%d-%d", (int)getpid(), idx);
  snprintf(e->grp, sizeof e->grp, "%s/%s", e->own, e->name);
  if (mkdir(e->grp, 0755) != 0) {
    int err = errno;
    undo_subtree(e);
    SKIP_BECAUSE("cannot create %s (v%d): %s", e->grp, e->version, strerror(err));
  }
  printf("# created %s (cgroup v%d)\n", e->grp, e->version);

  char max[32], high[32];
  snprintf(max, sizeof max, "%zu", GROUP_MAX);
  snprintf(high, sizeof high, "%zu", GROUP_HIGH);
  const char *fmax = e->version == 2 ? "memory.max" : "memory.limit_in_bytes";
  const char *fhigh = e->version == 2 ? "memory.high" : "memory.soft_limit_in_bytes";
  int rc = write_str(e->grp, fmax, max);
  const char *bad = fmax;
  if (rc == 0) {
    rc = write_str(e->grp, fhigh, high);
    bad = fhigh;
  }
  if (rc < 0) {
    cg_remove(e);
    if (skippable(-rc))
      SKIP_BECAUSE("cannot set %s/%s: %s", e->grp, bad, strerror(-rc));
    fail_msg("cannot set %s/%s: %s", e->grp, bad, strerror(-rc));
  }
}

/* ---- the child's side ------------------------------------------------------ */

/* Exit codes of the child, one per check, with what they mean. */
#define CHILD_CODES(X)                                                          \
  X(MOVE_DENIED, 10, "not permitted to join the group (environment: skip)")     \
  X(MOVE, 11, "joining the group failed")                                       \
  X(MEMSTAT, 12, "es_memstat_read failed in the group")                         \
  X(VERSION, 13, "es_memstat version is not the group's cgroup version")        \
  X(LIMITS, 14, "es_memstat max/high are not the limits the test set")          \
  X(PATH, 15, "es_memstat path is not the test's group")                        \
  X(CREATE, 16, "es_runtime_create failed")                                     \
  X(LOAD, 17, "loading a model failed")                                         \
  X(WATCH_START, 18, "pressure was not NONE in the fresh group")                \
  X(RUN_START, 19, "a request at no pressure was not admitted or did not run")  \
  X(BALLAST, 20, "could not bring usage between the soft and hard marks")       \
  X(WATCH_SOFT, 21, "pressure was not SOFT (HARD) above the soft mark")         \
  X(MARKS, 22, "the gate's watermarks are not those of min(high, max)")         \
  X(PRESSURE_ADMIT, 23, "a submit under pressure was not refused")              \
  X(PRESSURE_WHY, 24, "the pressure refusal's reason/retry/numbers are wrong")  \
  X(WATCH_RELEASED, 25, "pressure did not go back to NONE after the unmap")     \
  X(RUN_AFTER, 26, "a request after the pressure was not admitted or ran")      \
  X(OOM, 27, "the group recorded an OOM (kill) while the test ran")             \
  X(DESTROY, 28, "es_runtime_destroy failed")                                   \
  X(PLAN, 29, "no shape of the detector plans bigger than the budget")          \
  X(ENOSPC, 30, "a request larger than the budget was not ES_ENOSPC")           \
  X(BUDGET_FILL, 31, "requests within the budget were not all admitted")        \
  X(OVER_MEMORY, 32, "the request past the budget was not refused OVER_MEMORY") \
  X(BUDGET_RUN, 33, "an admitted request did not complete after resuming")      \
  X(BUDGET_LEFT, 34, "reservations did not all come back")

enum {
#define CC_ENUM_(name, code, text) CC_##name = code,
  CHILD_CODES(CC_ENUM_)
#undef CC_ENUM_
};

static const char *child_code_text(int code) {
  switch (code) {
#define CC_TEXT_(name, code, text)                                             \
  case code:                                                                   \
    return #name ": " text;
    CHILD_CODES(CC_TEXT_)
#undef CC_TEXT_
  default:
    return "unknown exit code (a crash, or ASan/LSan's own exit code)";
  }
}

#define CHILD_CHECK(cond, code, ...)                                           \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "# child: check failed: %s\n#   ", child_code_text(code)); \
      fprintf(stderr, __VA_ARGS__);                                            \
      fprintf(stderr, "\n#   (%s, line %d; last error: %s)\n", #cond, __LINE__,   \
              es_last_error_detail());                                         \
      return code;                                                             \
    }                                                                          \
  } while (0)

/* The working set the gate compares with the watermarks. */
static size_t working_set(const es_memstat *st) {
  return st->current - (st->inactive_file < st->current ? st->inactive_file : st->current);
}

static size_t binding_limit(const es_memstat *st) { return st->high < st->max ? st->high : st->max; }

/* es_memstat_read must report the test's group, with its limits. */
static int check_group(const cg_env *e, es_memstat *st) {
  int rc = es_memstat_read(st);
  CHILD_CHECK(rc == 0, CC_MEMSTAT, "es_memstat_read -> %s", es_err_name(rc));
  printf("# child: cgroup v%d %s: current %zu KiB, inactive_file %zu KiB, high %zu, max %zu\n",
         st->version, st->path, st->current >> 10, st->inactive_file >> 10, st->high, st->max);
  CHILD_CHECK(st->version == e->version, CC_VERSION, "version %d, want %d", st->version,
              e->version);
  CHILD_CHECK(st->max == GROUP_MAX && st->high == GROUP_HIGH, CC_LIMITS,
              "max %zu high %zu, want %zu and %zu", st->max, st->high, GROUP_MAX, GROUP_HIGH);
  size_t pl = strlen(st->path), nl = strlen(e->name);
  CHILD_CHECK(pl > nl && st->path[pl - nl - 1] == '/' && strcmp(st->path + pl - nl, e->name) == 0,
              CC_PATH, "path \"%s\" does not end with /%s", st->path, e->name);
  return 0;
}

typedef struct input {
  es_tensor t;
  float *data;
} input;

static int input_make(input *in, int64_t d0, int64_t d1, int64_t d2, int64_t d3, int fill) {
  memset(in, 0, sizeof *in);
  size_t n = (size_t)(d0 * d1 * d2 * d3);
  /* A request refused at admission never reads its data: left untouched
   * (calloc: no pages charged), the big one costs nothing. */
  in->data = calloc(n, sizeof(float));
  if (!in->data)
    return -1;
  for (size_t i = 0; fill && i < n; i++)
    in->data[i] = (float)((i * 2654435761u) % 1000u) / 1000.0f;
  in->t.dtype = ES_DTYPE_FLOAT;
  in->t.rank = 4;
  in->t.dims[0] = d0, in->t.dims[1] = d1, in->t.dims[2] = d2, in->t.dims[3] = d3;
  in->t.data = in->data;
  in->t.nbytes = n * sizeof(float);
  return 0;
}

static es_runtime *runtime_new(size_t budget) {
  es_runtime_config rc;
  es_runtime_config_default(&rc);
  rc.workers = 1;
  rc.pin = 0;     /* nothing here depends on placement */
  rc.watch_ms = 0; /* observations only when the test calls watch_now */
  rc.memory_budget_bytes = budget;
  /* Room to queue everything the budget admits (about 80 requests of the
   * small model at limit / 4) without the queue refusing first. */
  rc.queue_capacity = 1024;
  es_runtime *rt = NULL;
  return es_runtime_create(&rc, &rt) == 0 ? rt : NULL;
}

static int load(es_runtime *rt, const char *name, const char *file) {
  es_model_config mc;
  es_model_config_default(&mc);
  mc.name = name;
  mc.path = model_path(file);
  int id = -1;
  return es_runtime_model_load(rt, &mc, &id) == 0 ? id : -1;
}

static int submit(es_runtime *rt, int model, const input *in, es_request **r, es_refusal *why) {
  es_submit s = {.model = model, .inputs = &in->t, .n_inputs = 1};
  memset(why, 0, sizeof *why);
  *r = NULL;
  return es_runtime_submit(rt, &s, r, why);
}

/* Submit one request and wait for it; its reserved bytes in *bytes. */
static int run_one(es_runtime *rt, int model, const input *in, int code, size_t *bytes) {
  es_request *r;
  es_refusal why;
  int rc = submit(rt, model, in, &r, &why);
  CHILD_CHECK(rc == 0 && r, code, "submit -> %s (refusal %s, retry %u ms)", es_err_name(rc),
              es_refusal_name(why.reason), why.retry_after_ms);
  rc = es_request_wait(r, 30000);
  es_request_info info;
  es_request_info_get(r, &info);
  int outs = es_request_output_count(r);
  es_request_free(r);
  CHILD_CHECK(rc == 0 && outs > 0 && info.worker >= 0, code,
              "wait -> %s, %d outputs, worker %d", es_err_name(rc), outs, info.worker);
  if (bytes)
    *bytes = info.reserved_bytes;
  return 0;
}

/* Anonymous memory, each region its own mapping so that munmap returns it. */
#define BALLAST_MAX 256
typedef struct ballast {
  void *p[BALLAST_MAX];
  size_t n[BALLAST_MAX];
  int count;
  size_t bytes;
} ballast;

static void ballast_release(ballast *b) {
  for (int i = 0; i < b->count; i++)
    munmap(b->p[i], b->n[i]);
  b->count = 0;
  b->bytes = 0;
}

/* Touch memory in steps of at most 16 MiB, re-reading the group after each,
 * until the working set reaches the middle of (soft, hard): the margin on
 * both sides absorbs what else the process charges meanwhile. */
static int ballast_fill(ballast *b, size_t soft, size_t hard, es_memstat *st) {
  size_t target = soft + (hard - soft) / 2, page = (size_t)sysconf(_SC_PAGESIZE);
  memset(b, 0, sizeof *b);
  for (;;) {
    int rc = es_memstat_read(st);
    CHILD_CHECK(rc == 0, CC_MEMSTAT, "es_memstat_read -> %s", es_err_name(rc));
    size_t ws = working_set(st);
    if (ws >= target)
      break;
    CHILD_CHECK(b->count < BALLAST_MAX, CC_BALLAST, "%d regions and still at %zu KiB",
                b->count, ws >> 10);
    size_t step = target - ws;
    step = step > 16 * MIB ? 16 * MIB : (step + page - 1) / page * page;
    void *p = mmap(NULL, step, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHILD_CHECK(p != MAP_FAILED, CC_BALLAST, "mmap %zu B: %s", step, strerror(errno));
    memset(p, 0x5a, step); /* the pages are charged when first written */
    b->p[b->count] = p;
    b->n[b->count++] = step;
    b->bytes += step;
  }
  size_t ws = working_set(st);
  CHILD_CHECK(ws > soft && ws < hard, CC_BALLAST,
              "working set %zu KiB not within (%zu, %zu) KiB after %zu KiB of ballast", ws >> 10,
              soft >> 10, hard >> 10, b->bytes >> 10);
  return 0;
}

/* Test 1 in the child: NONE, then SOFT with a refusal, then NONE again. */
static int child_pressure(const cg_env *e) {
  es_memstat st0, st;
  int code = check_group(e, &st0);
  if (code)
    return code;
  es_runtime_config defaults;
  es_runtime_config_default(&defaults);
  size_t limit = binding_limit(&st0);
  /* As the gate computes them (admission.c mark_of). */
  size_t soft = (size_t)((double)limit * defaults.soft_ratio);
  size_t hard = (size_t)((double)limit * defaults.hard_ratio);

  es_runtime *rt = runtime_new(0);
  CHILD_CHECK(rt, CC_CREATE, "es_runtime_create");
  int front = load(rt, "front", "blazeface_front_128.onnx");
  CHILD_CHECK(front >= 0, CC_LOAD, "blazeface_front_128.onnx");
  input in;
  CHILD_CHECK(input_make(&in, 1, 128, 128, 3, 1) == 0, CC_LOAD, "no memory for the input");

  int level = es_runtime_watch_now(rt);
  CHILD_CHECK(level == ES_PRESSURE_NONE, CC_WATCH_START, "level %d", level);
  if ((code = run_one(rt, front, &in, CC_RUN_START, NULL)) != 0)
    return code;

  ballast b;
  if ((code = ballast_fill(&b, soft, hard, &st)) != 0)
    return code;
  size_t ws_before = working_set(&st);
  level = es_runtime_watch_now(rt);
  es_memstat st_after;
  CHILD_CHECK(es_memstat_read(&st_after) == 0, CC_MEMSTAT, "es_memstat_read");
  size_t ws_after = working_set(&st_after);
  printf("# child: ballast %zu MiB, working set %zu..%zu KiB, soft %zu KiB, hard %zu KiB, "
         "level %d\n",
         b.bytes / MIB, ws_before >> 10, ws_after >> 10, soft >> 10, hard >> 10, level);
  /* HARD is right only if the usage really crossed the hard mark around
   * the observation. */
  int crossed = ws_before > hard || ws_after > hard;
  CHILD_CHECK(level == ES_PRESSURE_SOFT || (level == ES_PRESSURE_HARD && crossed), CC_WATCH_SOFT,
              "level %d at working set %zu..%zu KiB (soft %zu, hard %zu KiB)", level,
              ws_before >> 10, ws_after >> 10, soft >> 10, hard >> 10);
  es_admission_stats as;
  es_admission_stats_get(es_runtime_admission(rt), &as);
  CHILD_CHECK(as.pressure == level && as.mem_soft == soft && as.mem_hard == hard &&
                  as.mem_used > soft,
              CC_MARKS, "stats: pressure %d used %zu soft %zu hard %zu, want soft %zu hard %zu",
              as.pressure, as.mem_used, as.mem_soft, as.mem_hard, soft, hard);

  es_request *r;
  es_refusal why;
  int rc = submit(rt, front, &in, &r, &why);
  if (rc == 0 && r) {
    es_request_wait(r, 30000);
    es_request_free(r);
  }
  CHILD_CHECK(rc == ES_EAGAIN && !r, CC_PRESSURE_ADMIT, "submit -> %s", es_err_name(rc));
  /* For MEMORY_PRESSURE in_use is the working set and limit the soft mark. */
  CHILD_CHECK(why.reason == ES_REFUSE_MEMORY_PRESSURE && why.retry_after_ms >= 1 &&
                  why.retry_after_ms <= 60000 && why.limit == soft && why.in_use > soft,
              CC_PRESSURE_WHY, "reason %s retry %u ms in_use %llu limit %llu (soft %zu)",
              es_refusal_name(why.reason), why.retry_after_ms, (unsigned long long)why.in_use,
              (unsigned long long)why.limit, soft);
  printf("# child: refused %s, retry after %u ms\n", es_refusal_name(why.reason),
         why.retry_after_ms);

  ballast_release(&b);
  /* Uncharging is synchronous with the unmap but a few pages may sit in
   * per-CPU charge caches: allow a short settling time. */
  int tries = 0;
  while ((level = es_runtime_watch_now(rt)) != ES_PRESSURE_NONE && ++tries < 100)
    sleep_ms(20);
  CHILD_CHECK(level == ES_PRESSURE_NONE, CC_WATCH_RELEASED, "level %d after %d tries", level,
              tries);
  if ((code = run_one(rt, front, &in, CC_RUN_AFTER, NULL)) != 0)
    return code;

  CHILD_CHECK(es_memstat_read(&st) == 0, CC_MEMSTAT, "es_memstat_read");
  CHILD_CHECK(st.events.oom_kill == st0.events.oom_kill && st.events.oom == st0.events.oom, CC_OOM,
              "oom_kill %llu -> %llu, oom %llu -> %llu", (unsigned long long)st0.events.oom_kill,
              (unsigned long long)st.events.oom_kill, (unsigned long long)st0.events.oom,
              (unsigned long long)st.events.oom);
  rc = es_runtime_destroy(rt);
  CHILD_CHECK(rc == 0, CC_DESTROY, "es_runtime_destroy -> %s", es_err_name(rc));
  free(in.data);
  return 0;
}

/* The first square detector input whose plan alone is over the budget. */
static int big_side(es_runtime *rt, int det, size_t budget, int64_t *side) {
  es_model *m = NULL;
  CHILD_CHECK(es_runtime_model_get(rt, det, &m) == 0, CC_PLAN, "es_runtime_model_get");
  *side = 0;
  for (int64_t s = 640; s <= 4096 && !*side; s += 320) {
    es_tensor_info ti;
    memset(&ti, 0, sizeof ti);
    ti.dtype = ES_DTYPE_FLOAT;
    ti.rank = 4;
    ti.dims[0] = 1, ti.dims[1] = 3, ti.dims[2] = s, ti.dims[3] = s;
    es_plan *p;
    if (es_model_plan(m, &ti, 1, &p) != 0)
      break;
    if (es_plan_arena_bytes(p) > budget)
      *side = s;
    es_plan_release(p);
  }
  es_model_release(m);
  CHILD_CHECK(*side > 0, CC_PLAN, "no side up to 4096 plans over %zu B", budget);
  return 0;
}

/* Test 2 in the child: ENOSPC, then OVER_MEMORY at the budget. */
static int child_budget(const cg_env *e) {
  es_memstat st0;
  int code = check_group(e, &st0);
  if (code)
    return code;
  size_t budget = st0.max / 4;
  es_runtime *rt = runtime_new(budget);
  CHILD_CHECK(rt, CC_CREATE, "es_runtime_create");
  int front = load(rt, "front", "blazeface_front_128.onnx");
  CHILD_CHECK(front >= 0, CC_LOAD, "blazeface_front_128.onnx");
  int det = load(rt, "det", "ppocr_det.onnx"); /* free dims: any image size */
  CHILD_CHECK(det >= 0, CC_LOAD, "ppocr_det.onnx");
  input in;
  CHILD_CHECK(input_make(&in, 1, 128, 128, 3, 1) == 0, CC_LOAD, "no memory for the input");
  /* No pressure in the group: what refuses below is the budget. */
  int level = es_runtime_watch_now(rt);
  CHILD_CHECK(level == ES_PRESSURE_NONE, CC_WATCH_START, "level %d", level);
  size_t req = 0;
  if ((code = run_one(rt, front, &in, CC_RUN_START, &req)) != 0)
    return code;
  CHILD_CHECK(req > 0 && req < budget, CC_BUDGET_FILL, "a request reserves %zu B of %zu", req,
              budget);

  /* Bigger than the whole budget: never admissible, nothing to retry. */
  int64_t side;
  if ((code = big_side(rt, det, budget, &side)) != 0)
    return code;
  input big;
  CHILD_CHECK(input_make(&big, 1, 3, side, side, 0) == 0, CC_ENOSPC, "no memory for the input");
  es_request *r;
  es_refusal why;
  int rc = submit(rt, det, &big, &r, &why);
  if (rc == 0 && r) {
    es_request_cancel(r);
    es_request_wait(r, 30000);
    es_request_free(r);
  }
  CHILD_CHECK(rc == ES_ENOSPC && !r && why.reason == ES_REFUSE_OVER_MEMORY &&
                  why.retry_after_ms == 0 && why.requested > budget && why.limit == budget,
              CC_ENOSPC, "1x3x%lldx%lld: %s, reason %s, retry %u ms, requested %llu limit %llu",
              (long long)side, (long long)side, es_err_name(rc), es_refusal_name(why.reason),
              why.retry_after_ms, (unsigned long long)why.requested,
              (unsigned long long)why.limit);
  printf("# child: 1x3x%lldx%lld needs %llu B > budget %zu B: ENOSPC\n", (long long)side,
         (long long)side, (unsigned long long)why.requested, budget);
  free(big.data);

  /* Paused, nothing runs or completes: reservations only add up, and every
   * request reserves the same bytes, so exactly budget / req fit. */
  es_runtime_pause(rt, 1);
  size_t want = budget / req, n = 0;
  es_request **held = calloc(want + 1, sizeof *held);
  CHILD_CHECK(held, CC_BUDGET_FILL, "no memory");
  for (;;) {
    rc = submit(rt, front, &in, &r, &why);
    if (rc != 0)
      break;
    held[n++] = r;
    CHILD_CHECK(n <= want, CC_BUDGET_FILL, "%zu admitted, more than %zu x %zu B fit in %zu B", n,
                want, req, budget);
  }
  CHILD_CHECK(n == want, CC_BUDGET_FILL, "%zu admitted of %zu (%s, %s)", n, want,
              es_err_name(rc), es_refusal_name(why.reason));
  CHILD_CHECK(rc == ES_EAGAIN && why.reason == ES_REFUSE_OVER_MEMORY && why.retry_after_ms >= 1 &&
                  why.retry_after_ms <= 60000 && why.requested == req &&
                  why.in_use == n * req && why.limit == budget,
              CC_OVER_MEMORY, "%s reason %s retry %u ms requested %llu in_use %llu limit %llu",
              es_err_name(rc), es_refusal_name(why.reason), why.retry_after_ms,
              (unsigned long long)why.requested, (unsigned long long)why.in_use,
              (unsigned long long)why.limit);
  es_admission_stats as;
  es_admission_stats_get(es_runtime_admission(rt), &as);
  CHILD_CHECK(as.reserved_bytes == n * req && as.reserved_bytes <= budget, CC_OVER_MEMORY,
              "reserved %zu B after the refusal, want %zu", as.reserved_bytes, n * req);
  printf("# child: %zu requests of %zu B admitted in %zu B, the next refused %s (retry %u ms)\n",
         n, req, budget, es_refusal_name(why.reason), why.retry_after_ms);

  es_runtime_pause(rt, 0);
  int failed = 0;
  for (size_t i = 0; i < n; i++) {
    rc = es_request_wait(held[i], 60000);
    if (rc != 0 && !failed++)
      fprintf(stderr, "# child: request %zu of %zu -> %s\n", i, n, es_err_name(rc));
    es_request_free(held[i]);
  }
  free(held);
  CHILD_CHECK(!failed, CC_BUDGET_RUN, "%d of %zu admitted requests did not complete", failed, n);
  es_admission_stats_get(es_runtime_admission(rt), &as);
  CHILD_CHECK(as.reserved_bytes == 0 && as.inflight == 0, CC_BUDGET_LEFT,
              "reserved %zu B, %zu in flight after all were freed", as.reserved_bytes,
              as.inflight);
  /* And the budget admits again. */
  if ((code = run_one(rt, front, &in, CC_BUDGET_RUN, NULL)) != 0)
    return code;

  es_memstat st;
  CHILD_CHECK(es_memstat_read(&st) == 0, CC_MEMSTAT, "es_memstat_read");
  CHILD_CHECK(st.events.oom_kill == st0.events.oom_kill && st.events.oom == st0.events.oom, CC_OOM,
              "oom_kill %llu -> %llu", (unsigned long long)st0.events.oom_kill,
              (unsigned long long)st.events.oom_kill);
  rc = es_runtime_destroy(rt);
  CHILD_CHECK(rc == 0, CC_DESTROY, "es_runtime_destroy -> %s", es_err_name(rc));
  free(in.data);
  return 0;
}

/* In the forked child: join the group, run the body, exit with its code. */
static void child_main(const cg_env *e, int (*body)(const cg_env *)) {
  /* cmocka's handlers would longjmp into the runner's copy in this process
   * and go on with the next test: a crash must end the child instead. */
  signal(SIGSEGV, SIG_DFL);
  signal(SIGBUS, SIG_DFL);
  signal(SIGILL, SIG_DFL);
  signal(SIGFPE, SIG_DFL);
  char pid[32];
  snprintf(pid, sizeof pid, "%d", (int)getpid());
  int rc = write_str(e->grp, "cgroup.procs", pid);
  if (rc < 0 && e->version == 1)
    rc = write_str(e->grp, "tasks", pid);
  if (rc < 0) {
    fprintf(stderr, "# child: cannot join %s: %s\n", e->grp, strerror(-rc));
    _exit(skippable(-rc) ? CC_MOVE_DENIED : CC_MOVE);
  }
  int code = body(e);
  fflush(stdout);
  if (code)
    _exit(code); /* threads still running, memory still held: just go */
  /* exit, not _exit: under ASan, LeakSanitizer then checks the runtime
   * gave everything back. */
  exit(0);
}

/* ---- the parent's side ------------------------------------------------------ */

static void with_group(int idx, int (*body)(const cg_env *), int need_det) {
  if (access(model_path("blazeface_front_128.onnx"), R_OK) != 0 ||
      (need_det && access(model_path("ppocr_det.onnx"), R_OK) != 0)) {
    printf("# models not fetched (%s): skipped\n", dir_);
    skip();
  }
  cg_env e;
  cg_make(&e, idx);

  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    int err = errno;
    cg_remove(&e);
    fail_msg("fork: %s", strerror(err));
  }
  if (pid == 0)
    child_main(&e, body);

  int status = 0, timed_out = 0;
  uint64_t until = now_ms() + CHILD_DEADLINE_MS;
  pid_t w;
  while ((w = waitpid(pid, &status, WNOHANG)) == 0) {
    if (now_ms() > until) {
      timed_out = 1;
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    sleep_ms(10);
  }
  /* The kernel's own account, read before the group goes: an OOM kill and
   * a hit of the hard limit are both what admission is there to prevent. */
  long long oom_kill = read_key(e.grp, e.version == 2 ? "memory.events" : "memory.oom_control",
                                "oom_kill");
  long long hit_max = -1, peak = -1;
  char buf[64];
  if (e.version == 2) {
    hit_max = read_key(e.grp, "memory.events", "max");
    if (read_str(e.grp, "memory.peak", buf, sizeof buf) == 0) /* kernel >= 5.19 */
      peak = atoll(buf);
  } else {
    if (read_str(e.grp, "memory.failcnt", buf, sizeof buf) == 0)
      hit_max = atoll(buf);
    if (read_str(e.grp, "memory.max_usage_in_bytes", buf, sizeof buf) == 0)
      peak = atoll(buf);
  }
  printf("# group after the child: oom_kill %lld, limit hits %lld, peak %lld KiB of %zu\n",
         oom_kill, hit_max, peak < 0 ? -1 : peak >> 10, GROUP_MAX >> 10);
  int removed = cg_remove(&e);

  /* Every check from here on: the group is gone whatever they say. */
  assert_true(w == pid || timed_out);
  if (timed_out)
    fail_msg("the child did not finish within %d s (killed)", CHILD_DEADLINE_MS / 1000);
  if (WIFSIGNALED(status))
    fail_msg("the child was killed by signal %d%s", WTERMSIG(status),
             WTERMSIG(status) == SIGKILL ? " (the OOM killer?)" : "");
  assert_true(WIFEXITED(status));
  int code = WEXITSTATUS(status);
  if (code == CC_MOVE_DENIED)
    SKIP_BECAUSE("the child may not join %s", e.grp);
  if (code != 0)
    fail_msg("child exit %d: %s (details above)", code, child_code_text(code));
  if (oom_kill > 0)
    fail_msg("the OOM killer killed %lld task(s) in the group", oom_kill);
  if (hit_max > 0)
    fail_msg("the group hit its hard limit %lld times: the kernel had to step in", hit_max);
  assert_int_equal(removed, 0);
}

static void test_pressure_in_real_group(void **state) {
  (void)state;
  with_group(1, child_pressure, 0);
}

static void test_budget_in_real_group(void **state) {
  (void)state;
  with_group(2, child_budget, 1);
}

int main(void) {
  /* Line by line: the child's and the parent's messages then come out in
   * the order they happened (stdout is a pipe under CTest). */
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *d = getenv("ES_MODEL_DIR");
  snprintf(dir_, sizeof dir_, "%s", d ? d : ES_SOURCE_DIR "/.cache/models");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pressure_in_real_group),
      cmocka_unit_test(test_budget_in_real_group),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
