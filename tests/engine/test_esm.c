/* Compiled model files: same results as the ONNX model, one physical copy
 * shared by several processes (PSS), and every mismatch or corruption
 * refused or worked around, never a wrong result. Uses the fetched
 * BlazeFace front model; skipped when models are missing. */
#include "es_test.h"

#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "edgeserve/engine.h"
#include "edgeserve/memory.h"

#ifndef ES_SOURCE_DIR
#define ES_SOURCE_DIR "."
#endif

static char dir_[256], onnx_[512], esm_[512];

static int copy_file(const char *from, const char *to) {
  FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
  if (!a || !b)
    return -1;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, a)) > 0)
    fwrite(buf, 1, n, b);
  fclose(a);
  return fclose(b);
}

static int setup(void **state) {
  (void)state;
  const char *mdir = getenv("ES_MODEL_DIR");
  char src[512];
  snprintf(src, sizeof src, "%s/blazeface_front_128.onnx",
           mdir ? mdir : ES_SOURCE_DIR "/.cache/models");
  snprintf(dir_, sizeof dir_, "/tmp/es-esm-XXXXXX");
  if (!mkdtemp(dir_))
    return -1;
  snprintf(onnx_, sizeof onnx_, "%s/face.onnx", dir_);
  snprintf(esm_, sizeof esm_, "%s/face.esm", dir_);
  if (copy_file(src, onnx_) < 0)
    onnx_[0] = '\0';
  return 0;
}

static int teardown(void **state) {
  (void)state;
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir_);
  return system(cmd) == 0 ? 0 : -1;
}

static const es_tensor_info shape_ = {
    .name = "input:0", .dtype = ES_DTYPE_FLOAT, .rank = 4, .dims = {1, 128, 128, 3}};

/* Runs m on a fixed input; copies output 3 ([1,384,16]) into out. */
static void run_model(es_model *m, float *out) {
  es_plan *p;
  ES_CHECK_RC(es_model_plan(m, &shape_, 1, &p));
  es_arena *a;
  ES_CHECK_RC(es_arena_create(es_plan_arena_bytes(p), 64, &a));
  static float x[128 * 128 * 3];
  for (size_t i = 0; i < sizeof x / sizeof x[0]; i++)
    x[i] = (float)((i * 7919) % 2001) / 1000.0f - 1.0f;
  es_tensor in = {.dtype = ES_DTYPE_FLOAT, .rank = 4, .dims = {1, 128, 128, 3}, .data = x};
  es_tensor o[4];
  ES_CHECK_RC(es_plan_run(p, &in, 1, a, o, 4));
  memcpy(out, o[3].data, 384 * 16 * sizeof(float));
  es_arena_destroy(a);
  es_plan_release(p);
}

static void compile_it(void) {
  es_model *m;
  ES_CHECK_RC(es_model_load(onnx_, NULL, &m));
  es_plan *p;
  ES_CHECK_RC(es_model_plan(m, &shape_, 1, &p)); /* prepares the weights */
  ES_CHECK_RC(es_model_compile(m, onnx_, esm_));
  es_plan_release(p);
  es_model_release(m);
}

static void test_same_results(void **state) {
  (void)state;
  if (!onnx_[0])
    skip();
  compile_it();
  static float a[384 * 16], b[384 * 16];
  es_model *m;
  ES_CHECK_RC(es_model_load(onnx_, NULL, &m));
  run_model(m, a);
  es_model_stats so;
  es_model_stats_get(m, &so);
  es_model_release(m);
  ES_CHECK_RC(es_model_load(esm_, NULL, &m));
  es_model_stats st;
  es_model_stats_get(m, &st);
  assert_int_equal(st.compiled, 1);
  assert_int_equal(st.nodes, so.nodes);
  assert_int_equal(st.weight_bytes, so.weight_bytes);
  run_model(m, b);
  es_model_stats_get(m, &st);
  /* weights prepared in the file are used, none made again here */
  if (st.compiled_prepared > 0)
    assert_int_equal(st.prepared_bytes, 0);
  es_model_release(m);
  assert_memory_equal(a, b, sizeof a);
}

/* PSS of the mappings of `file` in this process, in bytes. */
static long pss_of_file(const char *file) {
  FILE *f = fopen("/proc/self/smaps", "r");
  char line[1024];
  int in_map = 0;
  long total = 0;
  while (f && fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    if (sscanf(line, "%lx-%lx", &lo, &hi) == 2)
      in_map = strstr(line, file) != NULL;
    long kb;
    if (in_map && sscanf(line, "Pss: %ld kB", &kb) == 1)
      total += kb * 1024;
  }
  if (f)
    fclose(f);
  return total;
}

/* Child mode (a fresh process: OpenMP's threads do not survive fork, so
 * children are exec'ed): load, run, say "r", wait for a byte on stdin, then
 * print the PSS of the mapping. */
static int pss_child(const char *path) {
  es_model *m;
  static float out[384 * 16];
  int loaded = es_model_load(path, NULL, &m) == 0;
  if (loaded)
    run_model(m, out);
  char c;
  if (write(1, "r", 1) != 1 || read(0, &c, 1) != 1)
    return 2;
  long pss = loaded ? pss_of_file(strrchr(path, '/') + 1) : -1;
  if (write(1, &pss, sizeof pss) != (ssize_t)sizeof pss)
    return 3;
  if (read(0, &c, 1) != 1) /* stay mapped until every process has measured */
    return 4;
  if (loaded)
    es_model_release(m);
  return 0;
}

/* Whether this program can start itself again: not under a user-mode
 * emulator (qemu-user) on a host without binfmt_misc, where exec of the
 * target's binary fails (the arm64 check, scripts/arm64-check.sh). */
static int can_exec_self(void) {
  pid_t kid = fork();
  if (kid == 0) {
    execl("/proc/self/exe", "test_esm", "--exec-probe", (char *)NULL);
    _exit(127);
  }
  int st;
  return kid > 0 && waitpid(kid, &st, 0) == kid && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* Four processes map the same file: each one's PSS of the mapping is far
 * below the file size (about size / 4 when all touch every page). */
static void test_shared_between_processes(void **state) {
  (void)state;
  if (!onnx_[0])
    skip();
  if (!can_exec_self()) {
    printf("# this program cannot exec itself here: skipped\n");
    skip();
  }
  compile_it();
  struct stat fs;
  assert_int_equal(stat(esm_, &fs), 0);
  enum { N = 4 };
  int to[N][2], from[N][2];
  pid_t kids[N];
  for (int i = 0; i < N; i++) {
    assert_int_equal(pipe2(to[i], O_CLOEXEC), 0);
    assert_int_equal(pipe2(from[i], O_CLOEXEC), 0);
    kids[i] = fork();
    if (kids[i] == 0) {
      dup2(to[i][0], 0);
      dup2(from[i][1], 1);
      execl("/proc/self/exe", "test_esm", "--pss-child", esm_, (char *)NULL);
      _exit(127);
    }
    close(to[i][0]);
    close(from[i][1]);
  }
  char c;
  for (int i = 0; i < N; i++)
    assert_int_equal(read(from[i][0], &c, 1), 1); /* every one loaded and ran */
  long pss[N];
  for (int i = 0; i < N; i++)
    assert_int_equal(write(to[i][1], "g", 1), 1);
  for (int i = 0; i < N; i++) {
    pss[i] = -1;
    assert_int_equal(read(from[i][0], &pss[i], sizeof pss[i]), (ssize_t)sizeof pss[i]);
  }
  for (int i = 0; i < N; i++)
    assert_int_equal(write(to[i][1], "x", 1), 1);
  for (int i = 0; i < N; i++) {
    printf("# process %d: PSS of the mapping %ld of %lld bytes\n", i, pss[i],
           (long long)fs.st_size);
    assert_true(pss[i] > 0);
    assert_true(pss[i] <= fs.st_size / 2); /* shared: alone it would be about the size */
  }
  for (int i = 0; i < N; i++) {
    int st;
    waitpid(kids[i], &st, 0);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    close(to[i][1]);
    close(from[i][0]);
  }
}

static void patch(const char *path, long off, const void *bytes, size_t n) {
  int fd = open(path, O_WRONLY);
  assert_true(fd >= 0);
  assert_int_equal(pwrite(fd, bytes, n, off), (ssize_t)n);
  close(fd);
}

static void test_version_mismatch_refused(void **state) {
  (void)state;
  if (!onnx_[0])
    skip();
  compile_it();
  patch(esm_, 24, "9.9.9-other\0", 12); /* the version field */
  es_model *m;
  ES_EXPECT_RC(es_model_load(esm_, NULL, &m), ES_ENOTSUP);
  assert_non_null(strstr(es_last_error_detail(), "compile it again"));
}

static void test_stale_source_loads_source(void **state) {
  (void)state;
  if (!onnx_[0])
    skip();
  compile_it();
  /* the source changes after compiling (another model under the same name) */
  char other[600];
  const char *mdir = getenv("ES_MODEL_DIR");
  snprintf(other, sizeof other, "%s/blazeface_back_256.onnx",
           mdir ? mdir : ES_SOURCE_DIR "/.cache/models");
  assert_int_equal(copy_file(other, onnx_), 0);
  es_model *m;
  ES_CHECK_RC(es_model_load(esm_, NULL, &m));
  es_model_stats st;
  es_model_stats_get(m, &st);
  assert_int_equal(st.stale_compiled, 1);
  assert_int_equal(st.compiled, 0);
  es_tensor_info in;
  es_model_input_info(m, 0, &in);
  assert_int_equal(in.dims[1], 256); /* it is the new source */
  es_model_release(m);
  /* restore the source for later tests */
  snprintf(other, sizeof other, "%s/blazeface_front_128.onnx",
           mdir ? mdir : ES_SOURCE_DIR "/.cache/models");
  assert_int_equal(copy_file(other, onnx_), 0);
}

static void test_corruption_never_crashes(void **state) {
  (void)state;
  if (!onnx_[0])
    skip();
  compile_it();
  FILE *f = fopen(esm_, "rb");
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *orig = malloc((size_t)size);
  assert_int_equal(fread(orig, 1, (size_t)size, f), (size_t)size);
  fclose(f);
  char bad[600];
  snprintf(bad, sizeof bad, "%s/bad.esm", dir_);
  uint64_t seed = es_test_seed();
  size_t before = es_mem_total();
  for (int it = 0; it < 300; it++) {
    unsigned char *copy = malloc((size_t)size);
    memcpy(copy, orig, (size_t)size);
    long n = size;
    if (it % 3 == 0) {
      n = (long)(es_test_rand(&seed) % (uint64_t)size); /* truncated */
    } else {
      /* flips in the header and graph section, where everything is checked */
      for (int k = 0; k < 4; k++)
        copy[es_test_rand(&seed) % (uint64_t)(size < 65536 ? size : 65536)] ^=
            (unsigned char)(1 + es_test_rand(&seed) % 255);
    }
    FILE *w = fopen(bad, "wb");
    fwrite(copy, 1, (size_t)n, w);
    fclose(w);
    free(copy);
    es_model *m;
    if (es_model_load(bad, NULL, &m) == 0) {
      /* a flip that left a loadable model must still plan or fail cleanly */
      es_plan *p;
      if (es_model_plan(m, &shape_, 1, &p) == 0)
        es_plan_release(p);
      es_model_release(m);
    }
  }
  assert_int_equal(es_mem_total(), before);
  free(orig);
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "--pss-child"))
    return pss_child(argv[2]);
  if (argc == 2 && !strcmp(argv[1], "--exec-probe"))
    return 0;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_results),
      cmocka_unit_test(test_shared_between_processes),
      cmocka_unit_test(test_version_mismatch_refused),
      cmocka_unit_test(test_stale_source_loads_source),
      cmocka_unit_test(test_corruption_never_crashes),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
