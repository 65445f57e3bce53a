/* Weights locked in RAM (es_engine_mlock_set): a model loaded while it is on
 * locks its constants and the prepared weights its plans make or map from
 * the prepared-weights cache; es_weights_locked_bytes counts them once and
 * gives them back when the model goes; a model loaded while it is off locks
 * nothing. Without CAP_IPC_LOCK and under a low RLIMIT_MEMLOCK (a forked
 * child), the load fails with ES_EMEMLOCK naming the limit and the bytes. */
#include "es_test.h"
#include "support/onnx_builder.h"
#include "support/privileges.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "edgeserve/engine.h"
#include "edgeserve/memory.h"

enum { C = 16, HW = 10 };

static float w1_[32 * C * 9], w2_[32 * 32 * 9], w3_[C * 32 * 9], b3_[C], x_[C * HW * HW];

static void data_init(void) {
  uint64_t s = 3;
  es_test_fill_small(w1_, sizeof w1_ / 4, &s);
  es_test_fill_small(w2_, sizeof w2_ / 4, &s);
  es_test_fill_small(w3_, sizeof w3_ / 4, &s);
  es_test_fill_small(b3_, sizeof b3_ / 4, &s);
  es_test_fill_small(x_, sizeof x_ / 4, &s);
}

/* The model written to a temporary file (path, cap bytes). */
static void model_file(char *path, size_t cap) {
  ob b;
  ob_conv_chain(&b, C, w1_, w2_, w3_, b3_);
  ob_save_temp(&b, "es-mlock", path, cap);
}

static void run_once(es_model *m) {
  es_tensor in = ob_tensor_f32("x", 4, (int64_t[]){1, C, HW, HW}, x_);
  float *out;
  size_t count;
  ob_run(m, 1, &in, 1, &out, &count);
  assert_int_equal(count, (size_t)C * HW * HW);
  free(out);
}

static void test_locked_while_on(void **state) {
  (void)state;
  char path[256];
  model_file(path, sizeof path);
  size_t base = es_weights_locked_bytes();

  /* off: nothing locked */
  es_model *m;
  ES_CHECK_RC(es_model_load(path, NULL, &m));
  run_once(m);
  assert_int_equal(es_weights_locked_bytes(), base);
  es_model_release(m);

  /* on: the file mapping the constants are read from, then the prepared
   * weights the plan adds */
  es_engine_mlock_set(1);
  assert_int_equal(es_engine_mlock_get(), 1);
  ES_CHECK_RC(es_model_load(path, NULL, &m));
  size_t loaded = es_weights_locked_bytes();
  assert_true(loaded > base);
  run_once(m);
  es_model_stats st;
  ES_CHECK_RC(es_model_stats_get(m, &st));
  assert_true(st.prepared_bytes > 0);
  assert_true(es_weights_locked_bytes() >= loaded + st.prepared_bytes);
  /* a second model of the same file: its own regions add, and both go */
  size_t one = es_weights_locked_bytes();
  es_model *m2;
  ES_CHECK_RC(es_model_load(path, NULL, &m2));
  run_once(m2);
  assert_true(es_weights_locked_bytes() > one);
  es_model_release(m2);
  assert_int_equal(es_weights_locked_bytes(), one);
  es_model_release(m);
  assert_int_equal(es_weights_locked_bytes(), base);

  /* prepared weights mapped from the cache are locked too */
  char dir[300];
  snprintf(dir, sizeof dir, "%s.cache", path);
  ES_CHECK_RC(es_engine_cache_dir_set(dir));
  for (int round = 0; round < 2; round++) {
    ES_CHECK_RC(es_model_load(path, NULL, &m));
    run_once(m);
    ES_CHECK_RC(es_model_stats_get(m, &st));
    assert_int_equal(st.prepared_cached_bytes, st.prepared_bytes);
    assert_int_equal(round ? st.prepared_cache_hits : st.prepared_cache_writes, 1);
    assert_true(es_weights_locked_bytes() >= base + st.prepared_bytes);
    es_model_release(m);
    assert_int_equal(es_weights_locked_bytes(), base);
  }
  ES_CHECK_RC(es_engine_cache_dir_set(NULL));
  es_engine_mlock_set(0);
  DIR *d = opendir(dir);
  struct dirent *e;
  char p[600];
  while (d && (e = readdir(d)))
    if (e->d_name[0] != '.') {
      snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
      unlink(p);
    }
  if (d)
    closedir(d);
  rmdir(dir);
  unlink(path);
}

static void test_limit_too_low(void **state) {
  (void)state;
  char path[256];
  model_file(path, sizeof path);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    es_test_ipc_lock_drop();
    struct rlimit rl = {4096, 4096};
    if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0)
      _exit(2);
    es_engine_mlock_set(1);
    es_model *m = NULL;
    int rc = es_model_load(path, NULL, &m);
    if (rc == 0) {
      es_model_release(m);
      _exit(ES_TEST_CHILD_SKIP); /* still privileged: the limit does not apply */
    }
    const char *d = es_last_error_detail();
    printf("# load with mlock under a 4 KiB limit: %s\n", d);
    fflush(stdout);
    _exit(rc == ES_EMEMLOCK && strstr(d, "RLIMIT_MEMLOCK") && strstr(d, "4096 B") &&
                  es_weights_locked_bytes() == 0
              ? 0
              : 1);
  }
  es_test_child_wait(pid, path);
}

int main(void) {
  data_init();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_locked_while_on),
      cmocka_unit_test(test_limit_too_low),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
