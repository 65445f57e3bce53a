/* The prepared-weights cache (es_engine_cache_dir_set, src/engine/
 * prep_cache.c): the first plan of a model loaded from a file writes its
 * reordered weights into the cache directory and maps them from there; a
 * second load of the same file finds them and reorders nothing; a model
 * file rewritten in place, a cache file damaged on disk, a directory that
 * cannot be made, one that others may write and a cache turned off each
 * behave as documented, and
 * every run gives the reference kernels' result. Models are three
 * convolutions built in memory and written to a temporary file. */
#include "es_test.h"

#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "edgeserve/engine.h"
#include "support/onnx_builder.h"

enum { C = 16, HW = 12 };

static float w1_[32 * C * 9], w2_[32 * 32 * 9], w3_[C * 32 * 9], b3_[C];
static float x_[C * HW * HW];

static void data_init(void) {
  uint64_t s = 7;
  es_test_fill_small(w1_, sizeof w1_ / 4, &s);
  es_test_fill_small(w2_, sizeof w2_ / 4, &s);
  es_test_fill_small(w3_, sizeof w3_ / 4, &s);
  es_test_fill_small(b3_, sizeof b3_ / 4, &s);
  es_test_fill_small(x_, sizeof x_ / 4, &s);
}

/* Per test: a model file and an empty cache directory, the cache on. */
typedef struct fixture {
  ob b;
  char model[256], dir[256];
  float *want; /* the reference kernels' output */
  size_t want_count;
} fixture;

static es_tensor input(void) { return ob_tensor_f32("x", 4, (int64_t[]){1, C, HW, HW}, x_); }

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  assert_non_null(f);
  ob_conv_chain(&f->b, C, w1_, w2_, w3_, b3_);
  ob_save_temp(&f->b, "es-prepcache", f->model, sizeof f->model);
  const char *tmp = getenv("TMPDIR");
  snprintf(f->dir, sizeof f->dir, "%s/es-prepcache-dir-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  assert_non_null(mkdtemp(f->dir));
  es_engine_reference_kernels_set(1);
  es_model *m = ob_load(&f->b);
  es_tensor in = input();
  ob_run(m, 1, &in, 1, &f->want, &f->want_count);
  es_model_release(m);
  es_engine_reference_kernels_set(0);
  ES_CHECK_RC(es_engine_cache_dir_set(f->dir));
  *state = f;
  return 0;
}

/* Removes the directory's files (and the directory). */
static void rm_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d)
    return;
  struct dirent *e;
  char p[512];
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
      snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
      unlink(p);
    }
  closedir(d);
  rmdir(dir);
}

static int teardown(void **state) {
  fixture *f = *state;
  ES_CHECK_RC(es_engine_cache_dir_set(NULL));
  rm_dir(f->dir);
  unlink(f->model);
  free(f->want);
  free(f);
  return 0;
}

/* Files in dir ending in suffix; the first one's path into first. */
static int count_files(const char *dir, const char *suffix, char *first, size_t cap) {
  DIR *d = opendir(dir);
  if (!d)
    return 0;
  int n = 0;
  struct dirent *e;
  size_t sl = strlen(suffix);
  while ((e = readdir(d))) {
    size_t l = strlen(e->d_name);
    if (l >= sl && !strcmp(e->d_name + l - sl, suffix)) {
      if (!n && first)
        snprintf(first, cap, "%s/%s", dir, e->d_name);
      n++;
    }
  }
  closedir(d);
  return n;
}

/* Loads the model file, runs it once and checks the output against the
 * reference kernels'; the model's stats into st. Returns the output. */
static float *load_run(fixture *f, es_model_stats *st) {
  es_model *m = NULL;
  ES_CHECK_RC(es_model_load(f->model, NULL, &m));
  es_tensor in = input();
  float *out;
  size_t count;
  ob_run(m, 1, &in, 1, &out, &count);
  ES_CHECK_RC(es_model_stats_get(m, st));
  es_model_release(m);
  assert_int_equal(count, f->want_count);
  for (size_t i = 0; i < count; i++)
    if (fabsf(out[i] - f->want[i]) > 1e-4f)
      fail_msg("element %zu: %g, want %g", i, (double)out[i], (double)f->want[i]);
  return out;
}

static void test_written_then_mapped(void **state) {
  fixture *f = *state;
  es_model_stats st;
  float *first = load_run(f, &st);
  /* The first plan made its copies and stored them: one file, nothing
   * left half-written, and the model now maps that file. */
  assert_true(st.prepared_bytes >= sizeof w1_ + sizeof w2_ + sizeof w3_);
  assert_int_equal(st.prepared_cache_writes, 1);
  assert_int_equal(st.prepared_cache_hits, 0);
  assert_int_equal(st.prepared_cache_errors, 0);
  assert_int_equal(st.prepared_cached_bytes, st.prepared_bytes);
  assert_int_equal(count_files(f->dir, ".esp", NULL, 0), 1);
  assert_int_equal(count_files(f->dir, "", NULL, 0) - 2, 1); /* beside . and .. */

  /* Loaded again: found, nothing written, the same bytes out. */
  size_t bytes = st.prepared_bytes;
  for (int round = 0; round < 2; round++) {
    float *again = load_run(f, &st);
    assert_int_equal(st.prepared_cache_hits, 1);
    assert_int_equal(st.prepared_cache_writes, 0);
    assert_int_equal(st.prepared_cache_errors, 0);
    assert_int_equal(st.prepared_bytes, bytes);
    assert_int_equal(st.prepared_cached_bytes, bytes);
    assert_memory_equal(again, first, f->want_count * sizeof *first);
    free(again);
  }
  assert_int_equal(count_files(f->dir, ".esp", NULL, 0), 1);
  free(first);
}

/* A model file rewritten (same bytes, new times) is another model: its
 * copies are made and stored again, under another name. */
static void test_changed_model_is_another(void **state) {
  fixture *f = *state;
  es_model_stats st;
  free(load_run(f, &st));
  assert_int_equal(st.prepared_cache_writes, 1);
  size_t size = 0;
  uint8_t *bytes = ob_pack(&f->b, &size);
  usleep(20000); /* times differ even on a coarse clock */
  FILE *fp = fopen(f->model, "wb");
  assert_non_null(fp);
  assert_int_equal(fwrite(bytes, 1, size, fp), size);
  fclose(fp);
  free(bytes);
  free(load_run(f, &st));
  assert_int_equal(st.prepared_cache_hits, 0);
  assert_int_equal(st.prepared_cache_writes, 1);
  assert_int_equal(count_files(f->dir, ".esp", NULL, 0), 2);
  free(load_run(f, &st));
  assert_int_equal(st.prepared_cache_hits, 1);
}

/* A cache file damaged on disk (cut short; its header overwritten) is
 * removed, and the plan makes and stores its copies again. */
static void test_damaged_file_is_replaced(void **state) {
  fixture *f = *state;
  es_model_stats st;
  free(load_run(f, &st));
  char path[512];
  assert_int_equal(count_files(f->dir, ".esp", path, sizeof path), 1);
  struct stat sb;
  assert_int_equal(stat(path, &sb), 0);
  for (int how = 0; how < 2; how++) {
    if (how == 0) {
      assert_int_equal(truncate(path, sb.st_size / 2), 0);
    } else {
      int fd = open(path, O_WRONLY);
      assert_true(fd >= 0);
      assert_int_equal(pwrite(fd, "XXXX", 4, 0), 4);
      close(fd);
    }
    free(load_run(f, &st));
    assert_int_equal(st.prepared_cache_errors, 1);
    assert_int_equal(st.prepared_cache_hits, 0);
    assert_int_equal(st.prepared_cache_writes, 1);
    free(load_run(f, &st));
    assert_int_equal(st.prepared_cache_errors, 0);
    assert_int_equal(st.prepared_cache_hits, 1);
    assert_int_equal(count_files(f->dir, ".esp", path, sizeof path), 1);
  }
}

/* A cache directory that cannot be made (its parent is a file) costs only
 * the cache: the model runs on copies of its own. */
static void test_unwritable_directory(void **state) {
  fixture *f = *state;
  char dir[512];
  snprintf(dir, sizeof dir, "%s/sub", f->model);
  ES_CHECK_RC(es_engine_cache_dir_set(dir));
  es_model_stats st;
  free(load_run(f, &st));
  assert_int_equal(st.prepared_cache_errors, 1);
  assert_int_equal(st.prepared_cache_writes, 0);
  assert_int_equal(st.prepared_cached_bytes, 0);
  assert_true(st.prepared_bytes > 0);
}

/* A directory others may write (or another user owns) is not used: whoever
 * can write there decides the weights. Looked for and written nothing; the
 * model runs on copies of its own. */
static void test_directory_others_may_write(void **state) {
  fixture *f = *state;
  es_model_stats st;
  free(load_run(f, &st)); /* a good file is there */
  assert_int_equal(st.prepared_cache_writes, 1);
  assert_int_equal(chmod(f->dir, 0777), 0);
  free(load_run(f, &st));
  assert_int_equal(st.prepared_cache_hits, 0);
  assert_int_equal(st.prepared_cache_writes, 0);
  assert_int_equal(st.prepared_cache_errors, 2); /* not looked in, not written to */
  assert_int_equal(st.prepared_cached_bytes, 0);
  assert_int_equal(count_files(f->dir, ".esp", NULL, 0), 1);
  assert_int_equal(chmod(f->dir, 0700), 0);
  free(load_run(f, &st));
  assert_int_equal(st.prepared_cache_hits, 1);
}

/* Off: nothing is looked for or written. The directory setting reads back. */
static void test_off(void **state) {
  fixture *f = *state;
  char got[300];
  assert_int_equal(es_engine_cache_dir_get(got, sizeof got), (int)strlen(f->dir));
  assert_string_equal(got, f->dir);
  assert_int_equal(es_engine_cache_dir_get(got, 4), ES_EINVAL);
  char *huge = malloc(8192);
  assert_non_null(huge);
  memset(huge, 'a', 8191);
  huge[8191] = '\0';
  assert_int_equal(es_engine_cache_dir_set(huge), ES_EINVAL);
  free(huge);
  ES_CHECK_RC(es_engine_cache_dir_set(""));
  assert_int_equal(es_engine_cache_dir_get(got, sizeof got), 0);
  es_model_stats st;
  free(load_run(f, &st));
  assert_int_equal(st.prepared_cache_writes + st.prepared_cache_hits + st.prepared_cache_errors,
                   0);
  assert_int_equal(st.prepared_cached_bytes, 0);
  assert_int_equal(count_files(f->dir, "", NULL, 0), 2);
}

int main(void) {
  data_init();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_written_then_mapped, setup, teardown),
      cmocka_unit_test_setup_teardown(test_changed_model_is_another, setup, teardown),
      cmocka_unit_test_setup_teardown(test_damaged_file_is_replaced, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unwritable_directory, setup, teardown),
      cmocka_unit_test_setup_teardown(test_directory_others_may_write, setup, teardown),
      cmocka_unit_test_setup_teardown(test_off, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
