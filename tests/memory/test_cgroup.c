/* cgroup and meminfo readers.
 *
 * Fake layouts (v2, v1, none, a container's namespaced root, malformed files)
 * are written in a temporary directory and read with es_memstat_read_at,
 * checking every field. Then the real thing: es_memstat_read on this
 * machine, and a child process moved into a memory cgroup the test creates
 * under its own, with a 256 MiB limit, reporting what it sees through a
 * pipe. Where cgroups cannot be created the real tests skip and say why. */
#include "es_test.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char tmp_[PATH_MAX];

static void put(const char *rel, const char *content) {
  char path[PATH_MAX * 2];
  snprintf(path, sizeof path, "%s/%s", tmp_, rel);
  /* Make the parent directories. */
  for (char *s = path + strlen(tmp_) + 1; (s = strchr(s, '/')) != NULL; s++) {
    *s = '\0';
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
      fail_msg("mkdir %s: %s", path, strerror(errno));
    *s = '/';
  }
  FILE *f = fopen(path, "w");
  if (!f)
    fail_msg("fopen %s: %s", path, strerror(errno));
  fputs(content, f);
  fclose(f);
}

static const char *at(const char *rel) {
  static char bufs[8][PATH_MAX * 2];
  static int next;
  char *b = bufs[next++ % 8];
  snprintf(b, sizeof bufs[0], "%s/%s", tmp_, rel);
  return b;
}

static int rm_one(const char *p, const struct stat *s, int flag, struct FTW *f) {
  (void)s, (void)flag, (void)f;
  return remove(p);
}

static int setup(void **state) {
  (void)state;
  snprintf(tmp_, sizeof tmp_, "/tmp/es-test-cgroup-XXXXXX");
  if (!mkdtemp(tmp_))
    return -1;
  return 0;
}

static int teardown(void **state) {
  (void)state;
  nftw(tmp_, rm_one, 16, FTW_DEPTH | FTW_PHYS);
  return 0;
}

#define MEMINFO                                                                \
  "MemTotal:        1000 kB\n"                                                 \
  "MemFree:          100 kB\n"                                                 \
  "MemAvailable:     600 kB\n"                                                 \
  "HugePages_Total:       0\n"

/* A v2 group /svc/app under /svc, the root having no memory files. */
static void v2_layout(void) {
  put("proc_cgroup", "0::/svc/app\n");
  put("v2/cgroup.controllers", "cpu io memory pids\n");
  put("v2/svc/memory.current", "200000000\n");
  put("v2/svc/memory.high", "max\n");
  put("v2/svc/memory.max", "max\n");
  put("v2/svc/memory.events", "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n");
  put("v2/svc/app/memory.current", "123456789\n");
  put("v2/svc/app/memory.high", "400000000\n");
  put("v2/svc/app/memory.max", "500000000\n");
  put("v2/svc/app/memory.events", "low 1\nhigh 2\nmax 3\noom 4\noom_kill 5\noom_group_kill 0\n");
  put("v2/svc/app/memory.stat",
      "anon 100\nfile 2000\nkernel 12\nactive_file 7\ninactive_file 1000\n");
  put("meminfo", MEMINFO);
}

/* A v1 memory group /a/b under /a and the root; v2 has no memory. */
static void v1_layout(void) {
  put("proc_cgroup", "12:pids:/\n4:blkio,memory:/a/b\n3:cpu,cpuacct:/\n0::/\n");
  put("v2/cgroup.controllers", "");
  put("v1/memory.usage_in_bytes", "1000000000\n");
  put("v1/memory.limit_in_bytes", "9223372036854771712\n");
  put("v1/a/memory.usage_in_bytes", "500000\n");
  put("v1/a/memory.limit_in_bytes", "9223372036854771712\n");
  put("v1/a/memory.soft_limit_in_bytes", "9223372036854771712\n");
  put("v1/a/b/memory.usage_in_bytes", "300000\n");
  put("v1/a/b/memory.limit_in_bytes", "268435456\n");
  put("v1/a/b/memory.soft_limit_in_bytes", "9223372036854771712\n");
  put("v1/a/b/memory.failcnt", "7\n");
  put("v1/a/b/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n");
  put("v1/a/b/memory.stat", "cache 5\ninactive_file 10\ntotal_inactive_file 4096\n");
  put("meminfo", MEMINFO);
}

static int read_fake(es_memstat *st) {
  return es_memstat_read_at(at("proc_cgroup"), at("v1"), at("v2"), at("meminfo"), st);
}

static void test_v2(void **state) {
  (void)state;
  v2_layout();
  es_memstat st;
  ES_CHECK_RC(read_fake(&st));
  assert_int_equal(st.version, 2);
  assert_int_equal(st.current, 123456789);
  assert_int_equal(st.high, 400000000);
  assert_int_equal(st.max, 500000000);
  assert_int_equal(st.inactive_file, 1000);
  assert_int_equal(st.events.low, 1);
  assert_int_equal(st.events.high, 2);
  assert_int_equal(st.events.max, 3);
  assert_int_equal(st.events.oom, 4);
  assert_int_equal(st.events.oom_kill, 5);
  assert_int_equal(st.mem_total, 1000 * 1024);
  assert_int_equal(st.mem_available, 600 * 1024);
  assert_string_equal(st.path, at("v2/svc/app"));

  /* "max" everywhere: no limit. */
  put("v2/svc/app/memory.high", "max\n");
  put("v2/svc/app/memory.max", "max\n");
  ES_CHECK_RC(read_fake(&st));
  assert_true(st.high == SIZE_MAX && st.max == SIZE_MAX);
  assert_string_equal(st.path, at("v2/svc/app"));

  /* A trailing slash on the root changes nothing. */
  char root[PATH_MAX * 2];
  snprintf(root, sizeof root, "%s/", at("v2"));
  ES_CHECK_RC(es_memstat_read_at(at("proc_cgroup"), NULL, root, at("meminfo"), &st));
  assert_string_equal(st.path, at("v2/svc/app"));
}

/* A parent with less room left than the group binds it: its numbers win. */
static void test_v2_parent_binds(void **state) {
  (void)state;
  v2_layout();
  put("v2/svc/memory.max", "250000000\n");
  put("v2/svc/memory.events", "low 0\nhigh 0\nmax 9\noom 0\noom_kill 0\n");
  es_memstat st;
  ES_CHECK_RC(read_fake(&st));
  assert_int_equal(st.version, 2);
  assert_string_equal(st.path, at("v2/svc"));
  assert_int_equal(st.current, 200000000);
  assert_int_equal(st.max, 250000000);
  assert_true(st.high == SIZE_MAX);
  assert_int_equal(st.events.max, 9);
  assert_int_equal(st.inactive_file, 0); /* svc has no memory.stat */

  /* More room in the parent than in the group: the group. */
  put("v2/svc/memory.max", "900000000\n");
  ES_CHECK_RC(read_fake(&st));
  assert_string_equal(st.path, at("v2/svc/app"));
  assert_int_equal(st.max, 500000000);
}

static void test_v1(void **state) {
  (void)state;
  v1_layout();
  es_memstat st;
  ES_CHECK_RC(read_fake(&st));
  assert_int_equal(st.version, 1);
  assert_int_equal(st.current, 300000);
  assert_int_equal(st.max, 256u << 20);
  assert_true(st.high == SIZE_MAX); /* huge soft limit: none */
  assert_int_equal(st.inactive_file, 4096);
  assert_int_equal(st.events.low, 0);
  assert_int_equal(st.events.high, 0);
  assert_int_equal(st.events.max, 7); /* failcnt */
  assert_int_equal(st.events.oom, 0);
  assert_int_equal(st.events.oom_kill, 2);
  assert_int_equal(st.mem_total, 1000 * 1024);
  assert_int_equal(st.mem_available, 600 * 1024);
  assert_string_equal(st.path, at("v1/a/b"));

  /* Soft limit set; no oom_kill line (kernels before 4.13); no stat. */
  put("v1/a/b/memory.soft_limit_in_bytes", "134217728\n");
  put("v1/a/b/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\n");
  char p[PATH_MAX * 2];
  snprintf(p, sizeof p, "%s", at("v1/a/b/memory.stat"));
  unlink(p);
  ES_CHECK_RC(read_fake(&st));
  assert_int_equal(st.high, 128u << 20);
  assert_int_equal(st.events.oom_kill, 0);
  assert_int_equal(st.inactive_file, 0);

  /* No limit anywhere: the process's own group. */
  put("v1/a/b/memory.limit_in_bytes", "9223372036854771712\n");
  ES_CHECK_RC(read_fake(&st));
  assert_int_equal(st.version, 1);
  assert_true(st.max == SIZE_MAX);
  assert_string_equal(st.path, at("v1/a/b"));
}

static void test_none(void **state) {
  (void)state;
  put("proc_cgroup", "0::/\n");
  put("v2/cgroup.controllers", "cpu io\n");
  put("meminfo", MEMINFO);
  es_memstat st;
  ES_CHECK_RC(es_memstat_read_at(at("proc_cgroup"), NULL, at("v2"), at("meminfo"), &st));
  assert_int_equal(st.version, 0);
  assert_int_equal(st.mem_total, 1000 * 1024);
  assert_int_equal(st.mem_available, 600 * 1024);
  assert_int_equal(st.current, 400 * 1024);
  assert_int_equal(st.inactive_file, 0);
  assert_true(st.high == SIZE_MAX && st.max == SIZE_MAX);
  assert_int_equal(st.events.max + st.events.oom + st.events.oom_kill, 0);
  assert_string_equal(st.path, "");

  /* No /proc/self/cgroup at all (a kernel without cgroups). */
  ES_CHECK_RC(es_memstat_read_at(at("no-such-file"), at("v1"), at("v2"), at("meminfo"), &st));
  assert_int_equal(st.version, 0);
  ES_CHECK_RC(es_memstat_read_at(NULL, NULL, NULL, at("meminfo"), &st));
  assert_int_equal(st.version, 0);

  /* The v1 line names a group, but the v1 mount is not given. */
  put("proc_cgroup", "4:memory:/a\n0::/\n");
  ES_CHECK_RC(es_memstat_read_at(at("proc_cgroup"), NULL, at("v2"), at("meminfo"), &st));
  assert_int_equal(st.version, 0);

  /* An old kernel: no MemAvailable, MemFree stands in. */
  put("meminfo", "MemTotal: 1000 kB\nMemFree: 100 kB\n");
  ES_CHECK_RC(es_memstat_read_at(NULL, NULL, NULL, at("meminfo"), &st));
  assert_int_equal(st.mem_available, 100 * 1024);

  /* Nothing at all to go by. */
  ES_EXPECT_RC(es_memstat_read_at(NULL, NULL, NULL, at("no-meminfo"), &st), ES_ENOTSUP);
  ES_EXPECT_RC(es_memstat_read_at(NULL, NULL, NULL, NULL, &st), ES_ENOTSUP);

  /* With a cgroup limit, meminfo is optional. */
  v2_layout();
  ES_CHECK_RC(es_memstat_read_at(at("proc_cgroup"), NULL, at("v2"), NULL, &st));
  assert_int_equal(st.version, 2);
  assert_int_equal(st.max, 500000000);
  assert_int_equal(st.mem_total, 0);
}

/* Inside a container the kernel prints the host's path, while the mount's
 * root is the container's own group. */
static void test_container_root(void **state) {
  (void)state;
  put("proc_cgroup", "0::/kubepods/pod1/ctr\n");
  put("v2/memory.current", "4096\n");
  put("v2/memory.high", "max\n");
  put("v2/memory.max", "1073741824\n");
  put("v2/memory.events", "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n");
  put("meminfo", MEMINFO);
  es_memstat st;
  ES_CHECK_RC(es_memstat_read_at(at("proc_cgroup"), NULL, at("v2"), at("meminfo"), &st));
  assert_int_equal(st.version, 2);
  assert_int_equal(st.current, 4096);
  assert_int_equal(st.max, 1u << 30);
  assert_string_equal(st.path, at("v2"));

  /* The group is the root of a hierarchy: "/". */
  put("proc_cgroup", "0::/\n");
  ES_CHECK_RC(es_memstat_read_at(at("proc_cgroup"), NULL, at("v2"), at("meminfo"), &st));
  assert_string_equal(st.path, at("v2"));
}

typedef struct bad_case {
  int v1;               /* layout: 1 v1, 0 v2 */
  const char *file;     /* relative file to corrupt */
  const char *content;
} bad_case;

static void test_malformed(void **state) {
  (void)state;
  char longline[600];
  memset(longline, 'x', sizeof longline - 2);
  longline[sizeof longline - 2] = '\n';
  longline[sizeof longline - 1] = '\0';
  const bad_case cases[] = {
      {0, "proc_cgroup", "garbage line\n"},
      {0, "proc_cgroup", "0::relative/path\n"},
      {0, "proc_cgroup", "x:memory:/a\n"},
      {1, "proc_cgroup", "4:memory:/a/../../etc\n"},
      {0, "v2/svc/app/memory.max", "12abc\n"},
      {0, "v2/svc/app/memory.max", "maximum\n"},
      {0, "v2/svc/app/memory.current", ""},
      {0, "v2/svc/app/memory.current", "\n"},
      {0, "v2/svc/app/memory.high", "-5\n"},
      {0, "v2/svc/app/memory.high", "99999999999999999999999\n"},
      {0, "v2/svc/memory.current", "lots\n"},
      {0, "v2/svc/app/memory.events", "low 1\noom x\n"},
      {0, "v2/svc/app/memory.events", "high\n"},
      {0, "v2/svc/app/memory.events", longline},
      {0, "v2/svc/app/memory.stat", "inactive_file\n"},
      {1, "v1/a/b/memory.limit_in_bytes", "max\n"},
      {1, "v1/a/b/memory.usage_in_bytes", "1e9\n"},
      {1, "v1/a/b/memory.soft_limit_in_bytes", "\n"},
      {1, "v1/a/b/memory.failcnt", "seven\n"},
      {1, "v1/a/b/memory.oom_control", "oom_kill_disable 0\noom_kill\n"},
      {1, "v1/a/b/memory.stat", "total_inactive_file 4096 pages\n"},
      {1, "v1/a/memory.usage_in_bytes", "12 34\n"},
      {0, "meminfo", "MemTotal: lots kB\nMemAvailable: 600 kB\n"},
      {0, "meminfo", "MemFree: 100 kB\nMemAvailable: 600 kB\n"},
      {0, "meminfo", "MemTotal: 1000 kB\n"},
      {0, "meminfo", "MemTotal: 99999999999999999999 kB\nMemFree: 1 kB\n"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    teardown(NULL);
    assert_int_equal(setup(NULL), 0);
    if (cases[i].v1)
      v1_layout();
    else
      v2_layout();
    put(cases[i].file, cases[i].content);
    es_memstat st;
    memset(&st, 0x5a, sizeof st);
    int rc = read_fake(&st);
    if (rc != ES_EIO)
      fail_msg("case %zu (%s = \"%.20s\"): rc %s, want ES_EIO (detail: %s)", i, cases[i].file,
               cases[i].content, es_err_name(rc), es_last_error_detail());
    const char *base = strrchr(cases[i].file, '/');
    base = base ? base + 1 : cases[i].file;
    if (!strstr(es_last_error_detail(), base))
      fail_msg("case %zu: detail does not name %s: %s", i, base, es_last_error_detail());
    assert_int_equal(st.version, 0x5a5a5a5a); /* out untouched */
    print_message("# malformed %-34s -> %s\n", cases[i].file, es_last_error_detail());
  }

  ES_EXPECT_RC(es_memstat_read_at(NULL, NULL, NULL, NULL, NULL), ES_EINVAL);
  ES_EXPECT_RC(es_memstat_read(NULL), ES_EINVAL);
}

/* ---- the real thing ---------------------------------------------------------- */

static void test_real_read(void **state) {
  (void)state;
  es_memstat st;
  ES_CHECK_RC(es_memstat_read(&st));
  print_message("# this process: cgroup v%d %s current %zu B, high %s, max %s, "
                "MemAvailable %zu of %zu B\n",
                st.version, st.version ? st.path : "(none)", st.current,
                st.high == SIZE_MAX ? "none" : "set", st.max == SIZE_MAX ? "none" : "set",
                st.mem_available, st.mem_total);
  assert_true(st.version >= 0 && st.version <= 2);
  assert_true(st.current > 0);
  assert_true(st.mem_total > 0 && st.mem_available <= st.mem_total);
  if (st.version > 0)
    assert_true(st.path[0] == '/');
}

static int write_str(const char *dir, const char *name, const char *s) {
  char path[PATH_MAX * 2];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0)
    return -errno;
  ssize_t n = write(fd, s, strlen(s));
  int err = n < 0 ? errno : 0;
  close(fd);
  return n == (ssize_t)strlen(s) ? 0 : -(err ? err : EIO);
}

static int read_str(const char *path, char *buf, size_t cap) {
  FILE *f = fopen(path, "r");
  if (!f)
    return -1;
  size_t n = fread(buf, 1, cap - 1, f);
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
    n--;
  buf[n] = '\0';
  fclose(f);
  return 0;
}

/* The group path of this process on one hierarchy: v2 when controller is
 * NULL, else the v1 line whose controllers include it. */
static int own_group(const char *controller, char *out, size_t cap) {
  FILE *f = fopen("/proc/self/cgroup", "r");
  if (!f)
    return -1;
  char line[PATH_MAX + 128];
  int found = -1;
  while (found < 0 && fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = '\0';
    char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2)
      continue;
    *c2 = '\0';
    int match = 0;
    if (!controller)
      match = strcmp(line, "0") == 0 && c1[1] == '\0';
    else
      for (char *save = NULL, *t = strtok_r(c1 + 1, ",", &save); t; t = strtok_r(NULL, ",", &save))
        match |= strcmp(t, controller) == 0;
    if (match) {
      snprintf(out, cap, "%s", strcmp(c2 + 1, "/") == 0 ? "" : c2 + 1);
      found = 0;
    }
  }
  fclose(f);
  return found;
}

static void sleep_ms(int ms) {
  struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

typedef struct child_report {
  int rc;
  es_memstat st;
  char detail[256];
} child_report;

/* Make <own>/es-test-<pid> with a 256 MiB limit, move a forked child into it,
 * have it allocate (so it is charged there) and read es_memstat, move it back
 * out, end it and remove the group; fails or skips on the way. */
static void run_in_child_group(const char *own_dir, const char *limit_file, int want_version) {
  char grp[PATH_MAX * 2];
  snprintf(grp, sizeof grp, "%s/es-test-%d", own_dir, (int)getpid());
  if (mkdir(grp, 0755) != 0) {
    print_message("# SKIP: cannot create memory cgroup %s: %s\n", grp, strerror(errno));
    skip();
  }
  print_message("# created %s\n", grp);
  int rc = write_str(grp, limit_file, "268435456");
  if (rc < 0) {
    rmdir(grp);
    fail_msg("cannot set %s/%s: %s", grp, limit_file, strerror(-rc));
  }

  int go[2], res[2];
  assert_int_equal(pipe(go), 0);
  assert_int_equal(pipe(res), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(go[1]);
    close(res[0]);
    char c;
    if (read(go[0], &c, 1) != 1)
      _exit(2);
    /* Charges land in the group of the task that faults the pages in. */
    size_t n = 8u << 20;
    volatile unsigned char *p = malloc(n); /* volatile: the stores must happen */
    for (size_t i = 0; p && i < n; i += 4096)
      p[i] = 1;
    child_report r;
    memset(&r, 0, sizeof r);
    r.rc = es_memstat_read(&r.st);
    snprintf(r.detail, sizeof r.detail, "%s", es_last_error_detail());
    ssize_t w = write(res[1], &r, sizeof r);
    free((void *)p);
    if (read(go[0], &c, 1) < 0) /* wait to be told to go (EOF) */
      _exit(3);
    _exit(w == (ssize_t)sizeof r ? 0 : 4);
  }
  close(go[0]);
  close(res[1]);

  char pidstr[32];
  snprintf(pidstr, sizeof pidstr, "%d", (int)pid);
  int moved = write_str(grp, "cgroup.procs", pidstr);
  if (moved < 0 && want_version == 1)
    moved = write_str(grp, "tasks", pidstr);
  child_report r;
  memset(&r, 0, sizeof r);
  ssize_t got = -1;
  if (moved == 0) {
    assert_int_equal(write(go[1], "g", 1), 1);
    got = read(res[0], &r, sizeof r);
    /* Back to where it came from, then let it exit. */
    if (write_str(own_dir, "cgroup.procs", pidstr) < 0 && want_version == 1)
      write_str(own_dir, "tasks", pidstr);
  }
  close(go[1]);
  close(res[0]);
  if (moved < 0)
    kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  int removed = -1;
  for (int i = 0; i < 500 && (removed = rmdir(grp)) != 0 && errno == EBUSY; i++)
    sleep_ms(10);
  print_message("# removed %s: %s\n", grp, removed == 0 ? "yes" : strerror(errno));

  if (moved < 0)
    fail_msg("cannot move the child into %s: %s", grp, strerror(-moved));
  assert_int_equal(got, (ssize_t)sizeof r);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  assert_int_equal(removed, 0);
  if (r.rc != 0)
    fail_msg("es_memstat_read in the child: %s: %s", es_err_name(r.rc), r.detail);
  print_message("# child in %s: cgroup v%d, current %zu B, max %zu B, path %s\n", grp,
                r.st.version, r.st.current, r.st.max, r.st.path);
  assert_int_equal(r.st.version, want_version);
  assert_int_equal(r.st.max, 256u << 20);
  assert_true(r.st.current >= (8u << 20)); /* at least what the child touched */
  assert_string_equal(r.st.path, grp);
}

static int mount_of(const char *fstype, const char *opt, char *out, size_t cap) {
  FILE *f = fopen("/proc/self/mounts", "r");
  if (!f)
    return -1;
  char dev[256], dir[PATH_MAX], type[64], opts[1024];
  int found = -1;
  while (found < 0 && fscanf(f, "%255s %4095s %63s %1023s %*d %*d", dev, dir, type, opts) == 4) {
    if (strcmp(type, fstype) != 0)
      continue;
    if (opt) {
      int has = 0;
      for (char *save = NULL, *t = strtok_r(opts, ",", &save); t; t = strtok_r(NULL, ",", &save))
        has |= strcmp(t, opt) == 0;
      if (!has)
        continue;
    }
    snprintf(out, cap, "%s", dir);
    found = 0;
  }
  fclose(f);
  return found;
}

/* The group must not bind tighter than 256 MiB already, or the child
 * would report the parent. */
static void skip_if_tight(const char *own_dir) {
  es_memstat st;
  ES_CHECK_RC(es_memstat_read(&st));
  if (st.max != SIZE_MAX && st.max - (st.current < st.max ? st.current : st.max) < (300u << 20)) {
    print_message("# SKIP: %s already has less than 300 MiB of room under its limit\n", own_dir);
    skip();
  }
}

static void test_real_v1_child(void **state) {
  (void)state;
  char mnt[PATH_MAX], own[PATH_MAX], own_dir[PATH_MAX * 2];
  if (mount_of("cgroup", "memory", mnt, sizeof mnt) != 0) {
    print_message("# SKIP: no cgroup v1 memory controller mounted\n");
    skip();
  }
  if (own_group("memory", own, sizeof own) != 0) {
    print_message("# SKIP: /proc/self/cgroup has no v1 memory line\n");
    skip();
  }
  snprintf(own_dir, sizeof own_dir, "%s%s", mnt, own);
  if (access(own_dir, W_OK) != 0) {
    print_message("# SKIP: cannot write in %s: %s\n", own_dir, strerror(errno));
    skip();
  }
  skip_if_tight(own_dir);
  run_in_child_group(own_dir, "memory.limit_in_bytes", 1);
}

static void test_real_v2_child(void **state) {
  (void)state;
  char mnt[PATH_MAX], own[PATH_MAX], own_dir[PATH_MAX * 2], buf[512], path[PATH_MAX * 3];
  if (mount_of("cgroup2", NULL, mnt, sizeof mnt) != 0) {
    print_message("# SKIP: no cgroup v2 mounted\n");
    skip();
  }
  snprintf(path, sizeof path, "%s/cgroup.controllers", mnt);
  if (read_str(path, buf, sizeof buf) != 0 || !strstr(buf, "memory")) {
    print_message("# SKIP: cgroup v2 at %s has no memory controller (controllers: %s)\n", mnt,
                  buf[0] ? buf : "none");
    skip();
  }
  if (own_group(NULL, own, sizeof own) != 0) {
    print_message("# SKIP: /proc/self/cgroup has no v2 line\n");
    skip();
  }
  snprintf(own_dir, sizeof own_dir, "%s%s", mnt, own);
  /* Children get the memory controller only if the group hands it down,
   * which v2 allows only to groups without processes of their own (or the
   * root). */
  snprintf(path, sizeof path, "%s/cgroup.subtree_control", own_dir);
  if (read_str(path, buf, sizeof buf) != 0 || !strstr(buf, "memory")) {
    int rc = write_str(own_dir, "cgroup.subtree_control", "+memory");
    if (rc < 0) {
      print_message("# SKIP: cannot enable the memory controller below %s: %s\n", own_dir,
                    strerror(-rc));
      skip();
    }
  }
  skip_if_tight(own_dir);
  run_in_child_group(own_dir, "memory.max", 2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_v2, setup, teardown),
      cmocka_unit_test_setup_teardown(test_v2_parent_binds, setup, teardown),
      cmocka_unit_test_setup_teardown(test_v1, setup, teardown),
      cmocka_unit_test_setup_teardown(test_none, setup, teardown),
      cmocka_unit_test_setup_teardown(test_container_root, setup, teardown),
      cmocka_unit_test_setup_teardown(test_malformed, setup, teardown),
      cmocka_unit_test(test_real_read),
      cmocka_unit_test(test_real_v1_child),
      cmocka_unit_test(test_real_v2_child),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
