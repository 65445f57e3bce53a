/* Read-only weight regions: sealing, file mapping, sharing, mlock, errors.
 *
 * Several checks need a second process: a write into a sealed region must
 * kill the writer, and sharing is only visible as PSS across two processes.
 * Children never call cmocka; they report through exit codes and pipes. */
#include "es_test.h"
#include "support/privileges.h"

#include <fcntl.h>
#include <linux/capability.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* Exit code of a child that found the check impossible (privileged). */
#define CHILD_SKIP 77

static size_t pg(void) { return (size_t)sysconf(_SC_PAGESIZE); }

static unsigned char pattern_byte(size_t i, unsigned seed) {
  return (unsigned char)(i * 31u + seed * 7u + (i >> 12));
}

static void pattern_fill(unsigned char *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++)
    p[i] = pattern_byte(i, seed);
}

static int pattern_check(const unsigned char *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != pattern_byte(i, seed))
      return 0;
  return 1;
}

static const char *tmp_dir(void) {
  const char *d = getenv("TMPDIR");
  return d && *d ? d : "/tmp";
}

static int write_all(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n > 0) {
    ssize_t k = write(fd, p, n);
    if (k <= 0)
      return -1;
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

/* A new temporary file holding n pattern bytes (n may be 0); path gets its
 * name. */
static void temp_file_make(char *path, size_t cap, size_t n, unsigned seed) {
  snprintf(path, cap, "%s/es-weights-XXXXXX", tmp_dir());
  int fd = mkstemp(path);
  if (fd < 0)
    fail_msg("mkstemp(%s) failed", path);
  unsigned char *buf = malloc(n ? n : 1);
  assert_non_null(buf);
  pattern_fill(buf, n, seed);
  assert_int_equal(write_all(fd, buf, n), 0);
  free(buf);
  assert_int_equal(close(fd), 0);
}

static es_mem_stats weights_stats(void) {
  es_mem_stats s;
  assert_int_equal(es_mem_stats_get(ES_MEM_WEIGHTS, &s), 0);
  return s;
}

static void touch_all(const es_weights *w) {
  const volatile unsigned char *p = es_weights_data(w);
  size_t n = es_weights_size(w);
  unsigned sum = 0;
  for (size_t i = 0; i < n; i += pg())
    sum += p[i];
  sum += p[n - 1];
  (void)sum;
}

/* ---- anonymous regions -------------------------------------------------------- */

static void test_create_write_seal(void **state) {
  (void)state;
  es_mem_stats before = weights_stats();
  es_weights *w = NULL;
  ES_CHECK_RC(es_weights_create(10000, &w));
  size_t size = es_weights_size(w);
  assert_true(size >= 10000);
  assert_int_equal(size % pg(), 0);
  assert_int_equal(es_weights_refcount(w), 1);
  assert_int_equal(es_weights_is_sealed(w), 0);
  es_mem_stats mid = weights_stats();
  assert_true(mid.current >= before.current + size);
  assert_int_equal(mid.file_mapped, before.file_mapped);

  void *p = NULL;
  ES_CHECK_RC(es_weights_data_mut(w, &p));
  assert_ptr_equal(p, es_weights_data(w));
  pattern_fill(p, size, 1);
  ES_CHECK_RC(es_weights_seal(w));
  assert_int_equal(es_weights_is_sealed(w), 1);
  assert_true(pattern_check(es_weights_data(w), size, 1));
  ES_CHECK_RC(es_weights_seal(w)); /* idempotent */

  void *sentinel = (void *)&before;
  p = sentinel;
  ES_EXPECT_RC(es_weights_data_mut(w, &p), ES_ESTATE);
  assert_ptr_equal(p, sentinel);

  es_weights_release(w);
  es_mem_stats after = weights_stats();
  assert_int_equal(after.current, before.current);
  assert_int_equal(after.allocs - before.allocs, after.frees - before.frees);
}

/* Fork a child that writes one byte into data; return its wait status. */
static int child_write_status(const void *data) {
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    struct rlimit nocore = {0, 0};
    setrlimit(RLIMIT_CORE, &nocore);
    /* Sanitizer runtimes install their own SIGSEGV handler (report, then exit
     * 1); restore the default so the child dies of the signal in every build. */
    signal(SIGSEGV, SIG_DFL);
    *(volatile unsigned char *)data = 0x5a;
    _exit(0);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  return status;
}

static void assert_died_of_segv(int status) {
  if (WIFEXITED(status))
    fail_msg("the writer exited with %d instead of faulting", WEXITSTATUS(status));
  assert_true(WIFSIGNALED(status));
  assert_int_equal(WTERMSIG(status), SIGSEGV);
}

static void test_sealed_write_faults(void **state) {
  (void)state;
  es_weights *w = NULL;
  ES_CHECK_RC(es_weights_create(3 * pg(), &w));
  void *p = NULL;
  ES_CHECK_RC(es_weights_data_mut(w, &p));
  pattern_fill(p, es_weights_size(w), 2);

  /* Before sealing, the same write succeeds (in the child's copy). */
  int status = child_write_status((char *)p + pg());
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);

  ES_CHECK_RC(es_weights_seal(w));
  assert_died_of_segv(child_write_status((const char *)es_weights_data(w) + pg()));
  assert_true(pattern_check(es_weights_data(w), es_weights_size(w), 2));
  es_weights_release(w);
}

static void test_create_errors(void **state) {
  (void)state;
  es_weights *w = (es_weights *)&w;
  es_weights *const keep = w;
  ES_EXPECT_RC(es_weights_create(0, &w), ES_EINVAL);
  ES_EXPECT_RC(es_weights_create(SIZE_MAX, &w), ES_EOVERFLOW);
  assert_ptr_equal(w, keep);
  ES_EXPECT_RC(es_weights_create(1, NULL), ES_EINVAL);
}

/* ---- file regions ------------------------------------------------------------------ */

static void test_open_matches_file(void **state) {
  (void)state;
  char path[512];
  size_t n = 3 * pg() + 123;
  temp_file_make(path, sizeof path, n, 3);
  es_mem_stats before = weights_stats();

  es_weights *w = NULL;
  ES_CHECK_RC(es_weights_open(path, 0, &w));
  assert_int_equal(es_weights_size(w), n);
  assert_true(pattern_check(es_weights_data(w), n, 3));
  assert_int_equal(es_weights_refcount(w), 1);
  assert_int_equal(es_weights_is_sealed(w), 1);
  es_mem_stats mid = weights_stats();
  assert_int_equal(mid.file_mapped, before.file_mapped + n);

  void *p = NULL;
  ES_EXPECT_RC(es_weights_data_mut(w, &p), ES_ESTATE);
  assert_null(p);
  ES_EXPECT_RC(es_weights_seal(w), ES_ESTATE);
  assert_died_of_segv(child_write_status(es_weights_data(w)));

  es_weights_release(w);
  es_mem_stats after = weights_stats();
  assert_int_equal(after.file_mapped, before.file_mapped);
  assert_int_equal(after.current, before.current);
  unlink(path);
}

static void test_open_twice_maps_once(void **state) {
  (void)state;
  char path[512];
  size_t n = 5 * pg();
  temp_file_make(path, sizeof path, n, 4);
  es_mem_stats before = weights_stats();

  es_weights *a = NULL, *b = NULL;
  ES_CHECK_RC(es_weights_open(path, 0, &a));
  ES_CHECK_RC(es_weights_open(path, 0, &b));
  assert_ptr_equal(a, b);
  assert_int_equal(es_weights_refcount(a), 2);
  assert_int_equal(weights_stats().file_mapped, before.file_mapped + n);

  es_weights_release(b);
  assert_int_equal(es_weights_refcount(a), 1);
  assert_int_equal(weights_stats().file_mapped, before.file_mapped + n);
  assert_true(pattern_check(es_weights_data(a), n, 4));
  es_weights_release(a);
  assert_int_equal(weights_stats().file_mapped, before.file_mapped);

  /* Gone from the registry: the next open maps afresh. */
  ES_CHECK_RC(es_weights_open(path, 0, &a));
  assert_int_equal(es_weights_refcount(a), 1);
  assert_int_equal(weights_stats().file_mapped, before.file_mapped + n);
  es_weights_release(a);
  assert_int_equal(weights_stats().file_mapped, before.file_mapped);
  unlink(path);
}

static void test_retain_release(void **state) {
  (void)state;
  es_weights *w = NULL;
  ES_CHECK_RC(es_weights_create(1, &w));
  assert_ptr_equal(es_weights_retain(w), w);
  assert_ptr_equal(es_weights_retain(w), w);
  assert_int_equal(es_weights_refcount(w), 3);
  es_weights_release(w);
  es_weights_release(w);
  assert_int_equal(es_weights_refcount(w), 1);
  assert_non_null(es_weights_data(w));
  es_weights_release(w);
}

static void test_changed_file_maps_anew(void **state) {
  (void)state;
  char path[512];
  size_t n = 2 * pg();
  temp_file_make(path, sizeof path, n, 5);
  es_mem_stats before = weights_stats();

  es_weights *a = NULL, *b = NULL, *c = NULL, *d = NULL;
  ES_CHECK_RC(es_weights_open(path, 0, &a));

  /* Same size, new mtime (nanoseconds only): a different file version. */
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  struct timespec ts[2] = {st.st_atim, st.st_mtim};
  ts[1].tv_nsec = (ts[1].tv_nsec + 1) % 1000000000L;
  int fd = open(path, O_WRONLY);
  assert_true(fd >= 0);
  assert_int_equal(futimens(fd, ts), 0);
  ES_CHECK_RC(es_weights_open(path, 0, &b));
  assert_ptr_not_equal(a, b);
  assert_int_equal(es_weights_refcount(a), 1);
  assert_int_equal(es_weights_refcount(b), 1);
  assert_int_equal(weights_stats().file_mapped, before.file_mapped + 2 * n);

  /* Grown (never shrunk: the old mappings must stay readable). */
  unsigned char extra[100];
  memset(extra, 0xee, sizeof extra);
  assert_true(lseek(fd, 0, SEEK_END) >= 0);
  assert_int_equal(write_all(fd, extra, sizeof extra), 0);
  assert_int_equal(close(fd), 0);
  ES_CHECK_RC(es_weights_open(path, 0, &c));
  assert_ptr_not_equal(c, a);
  assert_ptr_not_equal(c, b);
  assert_int_equal(es_weights_size(c), n + sizeof extra);
  assert_int_equal(((const unsigned char *)es_weights_data(c))[n], 0xee);
  assert_true(pattern_check(es_weights_data(a), n, 5));

  /* The current version is still shared. */
  ES_CHECK_RC(es_weights_open(path, 0, &d));
  assert_ptr_equal(d, c);
  assert_int_equal(es_weights_refcount(c), 2);

  es_weights_release(a);
  es_weights_release(b);
  es_weights_release(c);
  es_weights_release(d);
  assert_int_equal(weights_stats().file_mapped, before.file_mapped);
  unlink(path);
}

static int read_full(int fd, void *buf, size_t n) {
  char *p = buf;
  while (n > 0) {
    ssize_t k = read(fd, p, n);
    if (k <= 0)
      return -1;
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

/* The child maps the file on its own (it is forked before the parent opens),
 * so both processes hold separate mappings of the same page-cache pages. */
static void test_pss_shared_across_processes(void **state) {
  (void)state;
  char path[512];
  size_t n = 64 * pg();
  temp_file_make(path, sizeof path, n, 6);
  int c2p[2], p2c[2];
  assert_int_equal(pipe(c2p), 0);
  assert_int_equal(pipe(p2c), 0);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(c2p[0]);
    close(p2c[1]);
    es_weights *w = NULL;
    size_t pss = 0;
    char go;
    if (es_weights_open(path, 0, &w) != 0)
      _exit(2);
    touch_all(w);
    if (write_all(c2p[1], "r", 1) != 0 || read_full(p2c[0], &go, 1) != 0)
      _exit(3);
    if (es_sys_pss_of(es_weights_data(w), &pss) != 0)
      _exit(4);
    if (write_all(c2p[1], &pss, sizeof pss) != 0 || read_full(p2c[0], &go, 1) != 0)
      _exit(5);
    es_weights_release(w);
    _exit(0);
  }
  close(c2p[1]);
  close(p2c[0]);
  es_weights *w = NULL;
  ES_CHECK_RC(es_weights_open(path, 0, &w));
  touch_all(w);
  char ready;
  assert_int_equal(read_full(c2p[0], &ready, 1), 0);
  assert_int_equal(write_all(p2c[1], "g", 1), 0);
  size_t pss_parent = 0, pss_child = 0;
  ES_CHECK_RC(es_sys_pss_of(es_weights_data(w), &pss_parent));
  assert_int_equal(read_full(c2p[0], &pss_child, sizeof pss_child), 0);
  assert_int_equal(write_all(p2c[1], "q", 1), 0);
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  close(c2p[0]);
  close(p2c[1]);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);

  print_message("# PSS of a %zu B mapping: parent %zu B, child %zu B\n", n, pss_parent,
                pss_child);
  /* One physical copy split between two mappers: about n / 2 each. */
  assert_true(pss_parent <= n * 3 / 4);
  assert_true(pss_parent >= n / 4);
  assert_true(pss_child <= n * 3 / 4);
  assert_true(pss_child >= n / 4);
  es_weights_release(w);
  unlink(path);
}

static void test_resident(void **state) {
  (void)state;
  char path[512];
  size_t n = 5 * pg() + 100;
  temp_file_make(path, sizeof path, n, 7);
  es_weights *w = NULL;
  size_t r = SIZE_MAX;
  ES_CHECK_RC(es_weights_open(path, 0, &w));
  ES_CHECK_RC(es_weights_resident(w, &r));
  assert_true(r <= n);
  touch_all(w);
  ES_CHECK_RC(es_weights_resident(w, &r));
  assert_int_equal(r, n);
  es_weights_release(w);
  unlink(path);

  ES_CHECK_RC(es_weights_create(16 * pg(), &w));
  r = SIZE_MAX;
  ES_CHECK_RC(es_weights_resident(w, &r));
  assert_true(r <= es_weights_size(w));
  void *p = NULL;
  ES_CHECK_RC(es_weights_data_mut(w, &p));
  pattern_fill(p, es_weights_size(w), 7);
  ES_CHECK_RC(es_weights_resident(w, &r));
  assert_int_equal(r, es_weights_size(w));
  ES_CHECK_RC(es_weights_seal(w));
  ES_CHECK_RC(es_weights_resident(w, &r));
  assert_int_equal(r, es_weights_size(w));
  es_weights_release(w);
}

/* ---- mlock --------------------------------------------------------------------- */

static void test_mlock_within_limit(void **state) {
  (void)state;
  es_weights *w = NULL;
  ES_CHECK_RC(es_weights_create(pg(), &w));
  ES_CHECK_RC(es_weights_lock(w));
  ES_CHECK_RC(es_weights_lock(w)); /* idempotent */
  es_weights_release(w);

  char path[512];
  temp_file_make(path, sizeof path, pg(), 8);
  ES_CHECK_RC(es_weights_open(path, ES_WEIGHTS_MLOCK, &w));
  size_t r = 0;
  ES_CHECK_RC(es_weights_resident(w, &r));
  assert_int_equal(r, pg()); /* locking faults the pages in */
  es_weights_release(w);
  unlink(path);
}

static int detail_names_limit(const char *soft, const char *need) {
  const char *d = es_last_error_detail();
  printf("# ES_EMEMLOCK detail: %s\n", d);
  fflush(stdout); /* the child leaves with _exit */
  return strstr(d, "RLIMIT_MEMLOCK") && strstr(d, soft) && strstr(d, need);
}

static void test_mlock_over_limit(void **state) {
  (void)state;
  char path[512];
  size_t n = 64 * pg();
  temp_file_make(path, sizeof path, n, 9);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    es_test_ipc_lock_drop();
    struct rlimit rl = {pg(), pg()};
    if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0)
      _exit(2);
    char soft[32], need[32];
    snprintf(soft, sizeof soft, "%zu B", pg());
    snprintf(need, sizeof need, "%zu B", n);

    es_weights *w = NULL;
    if (es_weights_create(n, &w) != 0)
      _exit(3);
    int rc = es_weights_lock(w);
    if (rc == 0)
      _exit(CHILD_SKIP); /* still privileged: the limit does not apply */
    if (rc != ES_EMEMLOCK || !detail_names_limit(soft, need))
      _exit(4);
    es_weights_release(w);

    es_mem_stats s0, s1;
    es_mem_stats_get(ES_MEM_WEIGHTS, &s0);
    w = NULL;
    rc = es_weights_open(path, ES_WEIGHTS_MLOCK, &w);
    if (rc != ES_EMEMLOCK || w != NULL || !detail_names_limit(soft, need))
      _exit(5);
    es_mem_stats_get(ES_MEM_WEIGHTS, &s1);
    if (s1.file_mapped != s0.file_mapped || s1.current != s0.current)
      _exit(6); /* the failed open left nothing mapped */
    _exit(0);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  unlink(path);
  assert_true(WIFEXITED(status));
  if (WEXITSTATUS(status) == CHILD_SKIP) {
    print_message("# mlock succeeded over RLIMIT_MEMLOCK: privileged, check skipped\n");
    skip();
  }
  assert_int_equal(WEXITSTATUS(status), 0);
}

/* ---- errors -------------------------------------------------------------------- */

static void expect_open_fails(const char *path, int want, const char *in_detail) {
  es_weights *w = (es_weights *)&w;
  es_weights *const keep = w;
  ES_EXPECT_RC(es_weights_open(path, 0, &w), want);
  assert_ptr_equal(w, keep);
  if (in_detail && !strstr(es_last_error_detail(), in_detail))
    fail_msg("detail \"%s\" does not name %s", es_last_error_detail(), in_detail);
}

static void test_open_errors(void **state) {
  (void)state;
  char missing[512];
  snprintf(missing, sizeof missing, "%s/es-weights-missing-%d", tmp_dir(), (int)getpid());
  expect_open_fails(missing, ES_ENOENT, missing);
  expect_open_fails("/etc/hostname/not-a-dir", ES_ENOENT, "/etc/hostname/not-a-dir");
  expect_open_fails(tmp_dir(), ES_EINVAL, tmp_dir());
  expect_open_fails("/dev/null", ES_EINVAL, "/dev/null");

  char empty[512];
  temp_file_make(empty, sizeof empty, 0, 0);
  expect_open_fails(empty, ES_EINVAL, empty);
  unlink(empty);

  /* A FIFO is refused without waiting for a writer. */
  char fifo[512];
  snprintf(fifo, sizeof fifo, "%s/es-weights-fifo-%d", tmp_dir(), (int)getpid());
  unlink(fifo);
  assert_int_equal(mkfifo(fifo, 0600), 0);
  expect_open_fails(fifo, ES_EINVAL, fifo);
  unlink(fifo);

  char path[512];
  temp_file_make(path, sizeof path, 16, 10);
  es_weights *w = NULL;
  ES_EXPECT_RC(es_weights_open(NULL, 0, &w), ES_EINVAL);
  ES_EXPECT_RC(es_weights_open("", 0, &w), ES_EINVAL);
  ES_EXPECT_RC(es_weights_open(path, 0, NULL), ES_EINVAL);
  ES_EXPECT_RC(es_weights_open(path, 1 << 7, &w), ES_EINVAL);
  assert_null(w);
  unlink(path);
}

static void test_open_permission(void **state) {
  (void)state;
  char path[512];
  temp_file_make(path, sizeof path, 16, 11);
  assert_int_equal(chmod(path, 0), 0);
  if (geteuid() != 0) {
    expect_open_fails(path, ES_EACCES, path);
    unlink(path);
    return;
  }
  /* Root reads anything: check as an unprivileged user in a child. */
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    if (setgid(65534) != 0 || setuid(65534) != 0)
      _exit(CHILD_SKIP);
    es_weights *w = NULL;
    int rc = es_weights_open(path, 0, &w);
    if (rc != ES_EACCES || !strstr(es_last_error_detail(), path))
      _exit(1);
    _exit(0);
  }
  es_test_child_wait(pid, path);
}

static void test_null_handle(void **state) {
  (void)state;
  size_t r = 42;
  void *p = NULL;
  assert_null(es_weights_data(NULL));
  assert_int_equal(es_weights_size(NULL), 0);
  assert_int_equal(es_weights_is_sealed(NULL), 0);
  assert_int_equal(es_weights_refcount(NULL), 0);
  assert_null(es_weights_retain(NULL));
  es_weights_release(NULL);
  ES_EXPECT_RC(es_weights_resident(NULL, &r), ES_EINVAL);
  assert_int_equal(r, 42);
  ES_EXPECT_RC(es_weights_data_mut(NULL, &p), ES_EINVAL);
  ES_EXPECT_RC(es_weights_seal(NULL), ES_EINVAL);
  ES_EXPECT_RC(es_weights_lock(NULL), ES_EINVAL);

  es_weights *w = NULL;
  ES_CHECK_RC(es_weights_create(1, &w));
  ES_EXPECT_RC(es_weights_resident(w, NULL), ES_EINVAL);
  ES_EXPECT_RC(es_weights_data_mut(w, NULL), ES_EINVAL);
  es_weights_release(w);
}

static void test_garbage_handle(void **state) {
  (void)state;
  uint64_t junk[64];
  memset(junk, 0xab, sizeof junk);
  es_weights *g = (es_weights *)junk;
  size_t r = 42;
  void *p = NULL;
  assert_null(es_weights_data(g));
  assert_int_equal(es_weights_size(g), 0);
  assert_int_equal(es_weights_is_sealed(g), 0);
  assert_int_equal(es_weights_refcount(g), 0);
  assert_null(es_weights_retain(g));
  es_weights_release(g);
  ES_EXPECT_RC(es_weights_resident(g, &r), ES_ECORRUPT);
  ES_EXPECT_RC(es_weights_data_mut(g, &p), ES_ECORRUPT);
  ES_EXPECT_RC(es_weights_seal(g), ES_ECORRUPT);
  ES_EXPECT_RC(es_weights_lock(g), ES_ECORRUPT);
  assert_int_equal(r, 42);
  assert_null(p);
  for (size_t i = 0; i < 64; i++)
    assert_true(junk[i] == 0xababababababababull);
}

/* ---- concurrency ------------------------------------------------------------------- */

typedef struct open_job {
  const char *path;
  size_t size;
  int failures;
} open_job;

static void *open_release_loop(void *arg) {
  open_job *j = arg;
  for (int i = 0; i < 300; i++) {
    es_weights *w = NULL;
    if (es_weights_open(j->path, 0, &w) != 0 || es_weights_size(w) != j->size) {
      j->failures++;
      continue;
    }
    es_weights *again = es_weights_retain(w);
    const volatile unsigned char *d = es_weights_data(again);
    if (d[i % j->size] != pattern_byte((size_t)i % j->size, 12))
      j->failures++;
    es_weights_release(again);
    es_weights_release(w);
  }
  return NULL;
}

static void test_concurrent_open_release(void **state) {
  (void)state;
  char path[512];
  size_t n = 2 * pg() + 10;
  temp_file_make(path, sizeof path, n, 12);
  es_mem_stats before = weights_stats();
  enum { THREADS = 4 };
  pthread_t t[THREADS];
  open_job jobs[THREADS];
  for (int i = 0; i < THREADS; i++) {
    jobs[i] = (open_job){path, n, 0};
    assert_int_equal(pthread_create(&t[i], NULL, open_release_loop, &jobs[i]), 0);
  }
  for (int i = 0; i < THREADS; i++) {
    pthread_join(t[i], NULL);
    assert_int_equal(jobs[i].failures, 0);
  }
  es_mem_stats after = weights_stats();
  assert_int_equal(after.file_mapped, before.file_mapped);
  assert_int_equal(after.current, before.current);
  unlink(path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_create_write_seal),
      cmocka_unit_test(test_sealed_write_faults),
      cmocka_unit_test(test_create_errors),
      cmocka_unit_test(test_open_matches_file),
      cmocka_unit_test(test_open_twice_maps_once),
      cmocka_unit_test(test_retain_release),
      cmocka_unit_test(test_changed_file_maps_anew),
      cmocka_unit_test(test_pss_shared_across_processes),
      cmocka_unit_test(test_resident),
      cmocka_unit_test(test_mlock_within_limit),
      cmocka_unit_test(test_mlock_over_limit),
      cmocka_unit_test(test_open_errors),
      cmocka_unit_test(test_open_permission),
      cmocka_unit_test(test_null_handle),
      cmocka_unit_test(test_garbage_handle),
      /* Last: the other tests fork, which is simplest with one thread. */
      cmocka_unit_test(test_concurrent_open_release),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
