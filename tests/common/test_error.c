/* The error table (codes, names, messages) and the thread-local detail. */
#include "es_test.h"

#include <pthread.h>
#include <string.h>

typedef struct err_entry {
  const char *name; /* "EINVAL", without the prefix */
  int value;
  const char *msg;
} err_entry;

static const err_entry es_table_[] = {
#define ES_TEST_ENTRY_(name, value, msg) {#name, value, msg},
    ES_ERRNO_MAP(ES_TEST_ENTRY_)
#undef ES_TEST_ENTRY_
};

#define TABLE_LEN (sizeof es_table_ / sizeof es_table_[0])

static void test_codes_distinct_and_negative(void **state) {
  (void)state;
  for (size_t i = 0; i < TABLE_LEN; i++) {
    assert_true(es_table_[i].value < 0);
    for (size_t j = i + 1; j < TABLE_LEN; j++)
      if (es_table_[i].value == es_table_[j].value)
        fail_msg("%s and %s share the value %d", es_table_[i].name, es_table_[j].name,
                 es_table_[i].value);
  }
}

static void test_names_and_messages(void **state) {
  (void)state;
  for (size_t i = 0; i < TABLE_LEN; i++) {
    char want[64];
    snprintf(want, sizeof want, "ES_%s", es_table_[i].name);
    assert_string_equal(es_err_name(es_table_[i].value), want);
    const char *msg = es_strerror(es_table_[i].value);
    assert_non_null(msg);
    assert_true(strlen(msg) > 0);
    assert_string_equal(msg, es_table_[i].msg);
    assert_string_not_equal(msg, "unknown error");
  }
}

static void test_ok_and_unknown(void **state) {
  (void)state;
  assert_string_equal(es_err_name(0), "ES_OK");
  assert_true(strlen(es_strerror(0)) > 0);
  assert_string_not_equal(es_strerror(0), "unknown error");
  const int unknown[] = {1, -1 /* EPERM is not in the table */, -3999, -4000, -4999, 12345};
  for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
    assert_string_equal(es_strerror(unknown[i]), "unknown error");
    assert_string_equal(es_err_name(unknown[i]), "ES_UNKNOWN");
  }
}

static void test_errno_equivalents(void **state) {
  (void)state;
  assert_int_equal(ES_EINVAL, -EINVAL);
  assert_int_equal(ES_ENOMEM, -ENOMEM);
  assert_int_equal(ES_ENOSPC, -ENOSPC);
  assert_int_equal(ES_EOVERFLOW, -EOVERFLOW);
  assert_int_equal(ES_ETIMEDOUT, -ETIMEDOUT);
  assert_int_equal(ES_EAGAIN, -EAGAIN);
  assert_int_equal(ES_EBUSY, -EBUSY);
  assert_int_equal(ES_ENOENT, -ENOENT);
  assert_int_equal(ES_EACCES, -EACCES);
  assert_int_equal(ES_EIO, -EIO);
  assert_int_equal(ES_ENOTSUP, -ENOTSUP);
  /* Codes without an errno equivalent stay clear of errno's range. */
  const int own[] = {ES_ECORRUPT, ES_EFOREIGN, ES_EDOUBLEFREE, ES_EBADPTR,
                     ES_EMEMLOCK, ES_EREWIND, ES_ESTATE};
  for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
    assert_true(own[i] <= -4000);
}

/* ---- thread-local detail ---------------------------------------------------- */

typedef struct detail_job {
  const char *path;
  pthread_barrier_t *barrier;
  int rc;
  char seen[512];
} detail_job;

static void *detail_thread(void *arg) {
  detail_job *j = arg;
  es_weights *w = NULL;
  j->rc = es_weights_open(j->path, 0, &w);
  /* Both threads have failed before either reads its detail. */
  pthread_barrier_wait(j->barrier);
  snprintf(j->seen, sizeof j->seen, "%s", es_last_error_detail());
  pthread_barrier_wait(j->barrier);
  return NULL;
}

static void test_detail_thread_local(void **state) {
  (void)state;
  pthread_barrier_t barrier;
  assert_int_equal(pthread_barrier_init(&barrier, NULL, 2), 0);
  detail_job a = {.path = "/nonexistent/es-test-error/alpha.esm", .barrier = &barrier};
  detail_job b = {.path = "/nonexistent/es-test-error/bravo.esm", .barrier = &barrier};
  pthread_t ta, tb;
  assert_int_equal(pthread_create(&ta, NULL, detail_thread, &a), 0);
  assert_int_equal(pthread_create(&tb, NULL, detail_thread, &b), 0);
  pthread_join(ta, NULL);
  pthread_join(tb, NULL);
  pthread_barrier_destroy(&barrier);

  assert_int_equal(a.rc, ES_ENOENT);
  assert_int_equal(b.rc, ES_ENOENT);
  assert_non_null(strstr(a.seen, "alpha.esm"));
  assert_null(strstr(a.seen, "bravo.esm"));
  assert_non_null(strstr(b.seen, "bravo.esm"));
  assert_null(strstr(b.seen, "alpha.esm"));
}

static void test_detail_replaced_not_cleared(void **state) {
  (void)state;
  es_weights *w = NULL;
  ES_EXPECT_RC(es_weights_open("/nonexistent/es-test-error/first", 0, &w), ES_ENOENT);
  assert_non_null(strstr(es_last_error_detail(), "first"));
  /* A success leaves the detail alone. */
  ES_CHECK_RC(es_weights_create(1, &w));
  assert_non_null(strstr(es_last_error_detail(), "first"));
  es_weights_release(w);
  ES_EXPECT_RC(es_weights_open("/nonexistent/es-test-error/second", 0, &w), ES_ENOENT);
  assert_non_null(strstr(es_last_error_detail(), "second"));
  assert_null(strstr(es_last_error_detail(), "first"));
}

static void *fresh_thread_detail(void *arg) {
  snprintf(arg, 512, "%s", es_last_error_detail());
  return NULL;
}

static void test_detail_empty_in_new_thread(void **state) {
  (void)state;
  es_weights *w = NULL;
  ES_EXPECT_RC(es_weights_open("/nonexistent/es-test-error/main", 0, &w), ES_ENOENT);
  char seen[512] = "not run";
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, fresh_thread_detail, seen), 0);
  pthread_join(t, NULL);
  assert_string_equal(seen, "");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_codes_distinct_and_negative),
      cmocka_unit_test(test_names_and_messages),
      cmocka_unit_test(test_ok_and_unknown),
      cmocka_unit_test(test_errno_equivalents),
      cmocka_unit_test(test_detail_thread_local),
      cmocka_unit_test(test_detail_replaced_not_cleared),
      cmocka_unit_test(test_detail_empty_in_new_thread),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
