/* The server as a library: configs own their models, servers in one
 * process do not see each other's, nothing is left behind, and one rule maps
 * every return code to an HTTP status and Retry-After.
 *
 * The servers listen on port 0 (a free port each) and their models are
 * declared with "load": false, so no model file is needed: the metrics text
 * lists every model a server knows, loaded or not, which is what the
 * isolation checks read. Leaks show in the server tag's byte count (and in
 * ASan's leak check in sanitizer builds). */
#include "es_test.h"

#include "edgeserve/server.h"
#include "server/server_internal.h"

#include <string.h>
#include <unistd.h>

static char dir_[64];

static size_t server_bytes(void) {
  es_mem_stats s;
  es_mem_stats_get(ES_MEM_SERVER, &s);
  return s.current;
}

/* A config file naming two models of its own (not loaded at start). */
static void write_config(const char *path, const char *a, const char *b) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f,
          "{\"port\": 0, \"workers\": 1, \"quiet\": 1,\n"
          " \"models\": {\"%s\": {\"file\": \"%s.onnx\", \"load\": false},\n"
          "            \"%s\": {\"file\": \"%s.onnx\", \"load\": false}}}\n",
          a, a, b, b);
  fclose(f);
}

/* one.json names alpha and beta, two.json gamma and delta. */
static void write_configs(char one[128], char two[128]) {
  snprintf(one, 128, "%s/one.json", dir_);
  snprintf(two, 128, "%s/two.json", dir_);
  write_config(one, "alpha", "beta");
  write_config(two, "gamma", "delta");
}

static int knows(es_server *s, const char *model) {
  char *txt;
  size_t len;
  ES_CHECK_RC(es_server_metrics_text(s, &txt, &len));
  assert_int_equal(strlen(txt), len);
  char needle[128];
  snprintf(needle, sizeof needle, "edgeserve_model_loaded{model=\"%s\"}", model);
  int found = strstr(txt, needle) != NULL;
  es_mem_free(txt);
  return found;
}

static int setup(void **state) {
  (void)state;
  snprintf(dir_, sizeof dir_, "/tmp/es_test_server_config.XXXXXX");
  return mkdtemp(dir_) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char p[128];
  snprintf(p, sizeof p, "%s/one.json", dir_);
  unlink(p);
  snprintf(p, sizeof p, "%s/two.json", dir_);
  unlink(p);
  rmdir(dir_);
  return 0;
}

static void test_two_servers(void **state) {
  (void)state;
  size_t before = server_bytes();
  char one[128], two[128];
  write_configs(one, two);

  es_server_config c1, c2;
  es_server_config_default(&c1);
  es_server_config_default(&c2);
  ES_CHECK_RC(es_server_config_load(&c1, one));
  ES_CHECK_RC(es_server_config_load(&c2, two));
  /* Loading the second config left the first one's models alone. */
  assert_non_null(strstr(c1.models_json, "alpha"));
  assert_null(strstr(c1.models_json, "gamma"));
  assert_non_null(strstr(c2.models_json, "gamma"));
  assert_string_equal(c1.models_base, dir_);

  es_server *s1 = NULL, *s2 = NULL;
  ES_CHECK_RC(es_server_create(&c1, &s1));
  ES_CHECK_RC(es_server_create(&c2, &s2));
  /* The servers copied what they need: the configs can go now. */
  es_server_config_fini(&c1);
  es_server_config_fini(&c2);
  assert_null(c1.models_json);
  es_server_config_fini(&c1); /* twice is harmless */

  int p1 = 0, p2 = 0;
  ES_CHECK_RC(es_server_port(s1, &p1));
  ES_CHECK_RC(es_server_port(s2, &p2));
  assert_true(p1 > 0 && p2 > 0 && p1 != p2);

  assert_true(knows(s1, "alpha") && knows(s1, "beta"));
  assert_false(knows(s1, "gamma") || knows(s1, "delta"));
  assert_true(knows(s2, "gamma") && knows(s2, "delta"));
  assert_false(knows(s2, "alpha") || knows(s2, "beta"));
  /* Neither fell back to the embedded default set. */
  assert_false(knows(s1, "ppocr_det") || knows(s2, "ppocr_det"));

  es_server_report rep;
  ES_CHECK_RC(es_server_shutdown(s1, 0, &rep));
  es_server_destroy(s1);
  es_server_destroy(s2);
  assert_int_equal(server_bytes(), before);
}

/* A second file replaces the first one's models (and frees them). */
static void test_reload_replaces(void **state) {
  (void)state;
  size_t before = server_bytes();
  char one[128], two[128];
  write_configs(one, two);
  es_server_config c;
  es_server_config_default(&c);
  ES_CHECK_RC(es_server_config_load(&c, one));
  ES_CHECK_RC(es_server_config_load(&c, two));
  assert_null(strstr(c.models_json, "alpha"));
  assert_non_null(strstr(c.models_json, "gamma"));
  es_server_config_fini(&c);
  assert_int_equal(server_bytes(), before);
}

/* The library reads no environment: the default model folder is fixed, and
 * the caller (the CLI) sets it from $ES_MODEL_DIR. */
static void test_no_environment(void **state) {
  (void)state;
  setenv("ES_MODEL_DIR", "/nonexistent/models", 1);
  es_server_config c;
  es_server_config_default(&c);
  assert_string_equal(c.model_dir, ".cache/models");
  assert_null(c.models_json);
  unsetenv("ES_MODEL_DIR");
}

static void test_null_handles(void **state) {
  (void)state;
  int port = 7;
  ES_EXPECT_RC(es_server_port(NULL, &port), ES_EINVAL);
  assert_int_equal(port, 7);
  ES_EXPECT_RC(es_server_shutdown(NULL, 0, NULL), ES_EINVAL);
  char *txt = (char *)1;
  ES_EXPECT_RC(es_server_metrics_text(NULL, &txt, NULL), ES_EINVAL);
  assert_null(es_server_runtime(NULL));
  es_server_destroy(NULL);
  es_server_config_fini(NULL);
}

/* ---- rc -> HTTP status ---------------------------------------------------- */

static void expect_status(int rc, const es_refusal *why, unsigned http, uint32_t retry,
                          int outcome, int reason) {
  srv_status st = es__srv_status_of(rc, why);
  if (st.http != http || st.retry_after_ms != retry || st.outcome != outcome ||
      st.reason != reason)
    fail_msg("%s (reason %d, estimate %u): got %u retry %u outcome %d reason %d, want %u retry "
             "%u outcome %d reason %d",
             es_err_name(rc), why ? why->reason : -1, why ? why->retry_after_ms : 0, st.http,
             st.retry_after_ms, st.outcome, st.reason, http, retry, outcome, reason);
}

static void test_status_rule(void **state) {
  (void)state;
  es_refusal why;
  memset(&why, 0, sizeof why);
  expect_status(0, NULL, 200, 0, SRV_OUT_SUCCESS, ES_REFUSE_NONE);

  /* Refusals: the client's excess is 429, the server's shortage 503; both
   * carry the admission's estimate. */
  why.retry_after_ms = 2345;
  why.reason = ES_REFUSE_QUEUE_FULL;
  expect_status(ES_EAGAIN, &why, 429, 2345, SRV_OUT_REFUSED, ES_REFUSE_QUEUE_FULL);
  why.reason = ES_REFUSE_OVER_CONCURRENCY;
  expect_status(ES_EAGAIN, &why, 429, 2345, SRV_OUT_REFUSED, ES_REFUSE_OVER_CONCURRENCY);
  why.reason = ES_REFUSE_OVER_MEMORY;
  expect_status(ES_EAGAIN, &why, 503, 2345, SRV_OUT_REFUSED, ES_REFUSE_OVER_MEMORY);
  why.reason = ES_REFUSE_MEMORY_PRESSURE;
  expect_status(ES_EAGAIN, &why, 503, 2345, SRV_OUT_REFUSED, ES_REFUSE_MEMORY_PRESSURE);
  why.reason = ES_REFUSE_DRAINING;
  expect_status(ES_EAGAIN, &why, 503, 2345, SRV_OUT_REFUSED, ES_REFUSE_DRAINING);

  /* A passed deadline: the estimate when there is one (a model's request
   * and a pipeline's alike), 1 s without. */
  why.reason = ES_REFUSE_DEADLINE;
  why.retry_after_ms = 870;
  expect_status(ES_ETIMEDOUT, &why, 503, 870, SRV_OUT_REFUSED, ES_REFUSE_DEADLINE);
  expect_status(ES_ETIMEDOUT, NULL, 503, 1000, SRV_OUT_REFUSED, ES_REFUSE_DEADLINE);
  why.retry_after_ms = 0;
  expect_status(ES_ETIMEDOUT, &why, 503, 1000, SRV_OUT_REFUSED, ES_REFUSE_DEADLINE);

  expect_status(ES_ECANCELED, NULL, 503, 1000, SRV_OUT_REFUSED, ES_REFUSE_DRAINING);
  /* Larger than the whole budget: no estimate, the longest hint. */
  why.reason = ES_REFUSE_OVER_MEMORY;
  expect_status(ES_ENOSPC, &why, 503, 60000, SRV_OUT_REFUSED, ES_REFUSE_OVER_MEMORY);
  /* Out of memory now: a memory refusal, never a 500 (the runtime answers
   * its own shortages with ES_EAGAIN and an estimate). */
  expect_status(ES_ENOMEM, NULL, 503, 1000, SRV_OUT_REFUSED, ES_REFUSE_OVER_MEMORY);
  why.reason = ES_REFUSE_OVER_MEMORY;
  why.retry_after_ms = 750;
  expect_status(ES_EAGAIN, &why, 503, 750, SRV_OUT_REFUSED, ES_REFUSE_OVER_MEMORY);
  why.retry_after_ms = 0;

  expect_status(ES_ENOENT, NULL, 404, 0, SRV_OUT_NONE, ES_REFUSE_NONE);
  /* Unloading a model a loaded pipeline runs on. */
  expect_status(ES_ESTATE, NULL, 409, 0, SRV_OUT_NONE, ES_REFUSE_NONE);
  expect_status(ES_EINVAL, NULL, 400, 0, SRV_OUT_BAD_REQUEST, ES_REFUSE_NONE);
  expect_status(ES_EMODEL, NULL, 400, 0, SRV_OUT_BAD_REQUEST, ES_REFUSE_NONE);
  expect_status(ES_ENOTSUP, NULL, 400, 0, SRV_OUT_BAD_REQUEST, ES_REFUSE_NONE);
  expect_status(ES_EOVERFLOW, NULL, 400, 0, SRV_OUT_BAD_REQUEST, ES_REFUSE_NONE);
  /* An estimate that came with a non-refusal is not sent. */
  why.retry_after_ms = 500;
  expect_status(ES_EINVAL, &why, 400, 0, SRV_OUT_BAD_REQUEST, ES_REFUSE_NONE);
  expect_status(ES_EIO, NULL, 500, 0, SRV_OUT_ERROR, ES_REFUSE_NONE);
  expect_status(ES_ECORRUPT, NULL, 500, 0, SRV_OUT_ERROR, ES_REFUSE_NONE);

  /* Statuses decided before any library call (body limits, draining). */
  assert_int_equal(es__srv_retry_after_ms(503, 0, 0), 1000);
  assert_int_equal(es__srv_retry_after_ms(429, 0, 0), 1000);
  assert_int_equal(es__srv_retry_after_ms(503, 0, 4000), 4000);
  assert_int_equal(es__srv_retry_after_ms(413, 0, 4000), 0);
  assert_int_equal(es__srv_retry_after_ms(200, 0, 0), 0);
}

/* ---- the control plane, the budget and the priority cap in the config ------------ */

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

/* Load text as a config file into a fresh default config: the return code. */
static int load_text(es_server_config *c, const char *text) {
  char p[128];
  snprintf(p, sizeof p, "%s/one.json", dir_);
  write_text(p, text);
  es_server_config_default(c);
  return es_server_config_load(c, p);
}

static void test_control_config(void **state) {
  (void)state;
  size_t before = server_bytes();
  es_server_config c;
  ES_CHECK_RC(load_text(&c, "{\"repository_control\": true, "
                            "\"control_token\": \"0123456789abcdef\"}"));
  assert_int_equal(c.repository_control, 1);
  assert_string_equal(c.control_token, "0123456789abcdef");
  es_server_config_fini(&c);
  ES_EXPECT_RC(load_text(&c, "{\"repository_control\": 1}"), ES_EINVAL);
  assert_non_null(strstr(es_last_error_detail(), "repository_control"));
  ES_EXPECT_RC(load_text(&c, "{\"control_token\": \"short\"}"), ES_EINVAL);
  assert_non_null(strstr(es_last_error_detail(), "control_token"));
  ES_EXPECT_RC(load_text(&c, "{\"control_token\": \"has a space 0123456\"}"), ES_EINVAL);
  ES_EXPECT_RC(load_text(&c, "{\"control_token\": 1234567890123456789}"), ES_EINVAL);

  /* Control on without a token: refused at create, nothing kept. */
  es_server_config_default(&c);
  c.port = 0;
  c.use_default_models = 0;
  c.repository_control = 1;
  es_server *s = NULL;
  ES_EXPECT_RC(es_server_create(&c, &s), ES_EINVAL);
  assert_null(s);
  assert_non_null(strstr(es_last_error_detail(), "control token"));
  snprintf(c.control_token, sizeof c.control_token, "0123456789abcdef");
  ES_CHECK_RC(es_server_create(&c, &s));
  es_server_destroy(s);
  es_server_config_fini(&c);
  assert_int_equal(server_bytes(), before);
}

/* cache_dir: a path in the config file; es_server_create makes it the
 * process's prepared-weights cache directory. mlock: a boolean. */
static void test_cache_dir_config(void **state) {
  (void)state;
  size_t before = server_bytes();
  es_server_config c;
  es_server_config_default(&c);
  assert_string_equal(c.cache_dir, "");
  ES_CHECK_RC(load_text(&c, "{\"cache_dir\": \"/tmp/es-cache-config\"}"));
  assert_string_equal(c.cache_dir, "/tmp/es-cache-config");
  c.port = 0;
  c.use_default_models = 0;
  es_server *s = NULL;
  ES_CHECK_RC(es_server_create(&c, &s));
  char got[64];
  assert_int_equal(es_engine_cache_dir_get(got, sizeof got), (int)strlen(c.cache_dir));
  assert_string_equal(got, c.cache_dir);
  es_server_destroy(s);
  es_server_config_fini(&c);
  ES_CHECK_RC(es_engine_cache_dir_set(NULL));
  ES_EXPECT_RC(load_text(&c, "{\"cache_dir\": 5}"), ES_EINVAL);
  assert_non_null(strstr(es_last_error_detail(), "cache_dir"));
  /* "mlock": a boolean, off by default */
  es_server_config_default(&c);
  assert_int_equal(c.mlock, 0);
  ES_CHECK_RC(load_text(&c, "{\"mlock\": true}"));
  assert_int_equal(c.mlock, 1);
  es_server_config_fini(&c);
  ES_EXPECT_RC(load_text(&c, "{\"mlock\": \"yes\"}"), ES_EINVAL);
  assert_non_null(strstr(es_last_error_detail(), "mlock"));
  assert_int_equal(server_bytes(), before);
}

/* read_buffer_bytes: bytes in the config file, checked at create (a read
 * buffer under 4 KiB or over 16 MiB is refused with its name), nothing kept. */
static void test_read_buffer_config(void **state) {
  (void)state;
  size_t before = server_bytes();
  es_server_config c;
  es_server_config_default(&c);
  assert_int_equal(c.read_buffer_bytes, 32 << 10);
  ES_CHECK_RC(load_text(&c, "{\"read_buffer_bytes\": \"256K\"}"));
  assert_int_equal(c.read_buffer_bytes, 256 << 10);
  es_server_config_fini(&c);
  ES_EXPECT_RC(load_text(&c, "{\"read_buffer_bytes\": \"lots\"}"), ES_EINVAL);
  assert_non_null(strstr(es_last_error_detail(), "read_buffer_bytes"));
  const size_t bad[] = {1024, (size_t)32 << 20};
  for (int i = 0; i < 2; i++) {
    es_server_config_default(&c);
    c.port = 0;
    c.use_default_models = 0;
    c.read_buffer_bytes = bad[i];
    es_server *s = NULL;
    ES_EXPECT_RC(es_server_create(&c, &s), ES_EINVAL);
    assert_null(s);
    assert_non_null(strstr(es_last_error_detail(), "read_buffer_bytes"));
    es_server_config_fini(&c);
  }
  es_server_config_default(&c);
  c.port = 0;
  c.use_default_models = 0;
  c.read_buffer_bytes = (size_t)256 << 10;
  es_server *s = NULL;
  ES_CHECK_RC(es_server_create(&c, &s));
  es_server_destroy(s);
  es_server_config_fini(&c);
  assert_int_equal(server_bytes(), before);
}

static size_t budget_of(es_server *s) {
  es_admission_stats as;
  ES_CHECK_RC(es_admission_stats_get(es_runtime_admission(es_server_runtime(s)), &as));
  return as.memory_budget_bytes;
}

/* The budget is auto unless bytes are given; 0 only when asked for. */
static void test_budget_default(void **state) {
  (void)state;
  es_server_config c;
  es_server_config_default(&c);
  assert_int_equal(c.memory_budget_auto, 1);
  ES_CHECK_RC(load_text(&c, "{\"port\": 0, \"quiet\": 1, \"workers\": 1}"));
  assert_int_equal(c.memory_budget_auto, 1);
  c.use_default_models = 0;
  es_server *s = NULL;
  ES_CHECK_RC(es_server_create(&c, &s));
  size_t b = budget_of(s);
  es_server_destroy(s);
  es_memstat st;
  ES_CHECK_RC(es_memstat_read(&st));
  size_t limit = st.high < st.max ? st.high : st.max;
  if (limit == SIZE_MAX)
    limit = st.mem_total;
  printf("# auto budget %zu B (limit %zu B)\n", b, limit);
  assert_true(b > 0 && b < limit);

  ES_CHECK_RC(load_text(&c, "{\"port\": 0, \"memory_budget\": 0}"));
  assert_int_equal(c.memory_budget_auto, 0);
  assert_int_equal(c.runtime.memory_budget_bytes, 0);
  c.use_default_models = 0;
  ES_CHECK_RC(es_server_create(&c, &s));
  assert_int_equal(budget_of(s), 0);
  es_server_destroy(s);

  ES_CHECK_RC(load_text(&c, "{\"port\": 0, \"memory_budget\": \"64M\"}"));
  assert_int_equal(c.memory_budget_auto, 0);
  c.use_default_models = 0;
  ES_CHECK_RC(es_server_create(&c, &s));
  assert_int_equal(budget_of(s), (size_t)64 << 20);
  es_server_destroy(s);

  ES_CHECK_RC(load_text(&c, "{\"memory_budget\": \"auto\"}"));
  assert_int_equal(c.memory_budget_auto, 1);
  ES_EXPECT_RC(load_text(&c, "{\"memory_budget\": \"lots\"}"), ES_EINVAL);
  assert_non_null(strstr(es_last_error_detail(), "auto"));
}

static void test_level_of(void **state) {
  (void)state;
  es_server *s = es_mem_calloc(ES_MEM_OTHER, 1, sizeof *s);
  assert_non_null(s);
  s->cfg.runtime.priorities = 4; /* levels 0..3 */
  srv_model m = {.priority = 2, .max_priority = 2};
  /* No priority, or Triton's 0: the model's default. */
  assert_int_equal(es__srv_level_of(s, &m, 0, 1), 2);
  assert_int_equal(es__srv_level_of(s, &m, 1, 0), 2);
  /* Triton's 1 (the highest level) is capped at the model's cap. */
  assert_int_equal(es__srv_level_of(s, &m, 1, 1), 2);
  assert_int_equal(es__srv_level_of(s, &m, 1, 2), 2);
  assert_int_equal(es__srv_level_of(s, &m, 1, 3), 2);
  assert_int_equal(es__srv_level_of(s, &m, 1, 4), 3);
  /* Past the last level: the last. */
  assert_int_equal(es__srv_level_of(s, &m, 1, 5), 3);
  assert_int_equal(es__srv_level_of(s, &m, 1, UINT64_MAX), 3);
  /* An operator who allows more. */
  m.max_priority = 0;
  assert_int_equal(es__srv_level_of(s, &m, 1, 1), 0);
  assert_int_equal(es__srv_level_of(s, &m, 1, 2), 1);
  m.max_priority = 1;
  assert_int_equal(es__srv_level_of(s, &m, 1, 1), 1);
  /* A default past the runtime's levels clamps too. */
  m.priority = 9;
  m.max_priority = 9;
  assert_int_equal(es__srv_level_of(s, &m, 0, 0), 3);
  assert_int_equal(es__srv_level_of(s, &m, 1, 1), 3);
  es_mem_free(s);
}

/* "max_priority" in a model's config: default the model's own priority,
 * higher allowed, lower than its own default refused. */
static void test_priority_cap_config(void **state) {
  (void)state;
  size_t before = server_bytes();
  es_server_config c;
  ES_CHECK_RC(load_text(&c, "{\"port\": 0, \"quiet\": 1, \"workers\": 1, \"models\": {"
                            "\"a\": {\"file\": \"a.onnx\", \"load\": false, \"priority\": 2},"
                            "\"b\": {\"file\": \"b.onnx\", \"load\": false, \"priority\": 2,"
                            "       \"max_priority\": 0},"
                            "\"c\": {\"file\": \"c.onnx\", \"load\": false}}}"));
  es_server *s = NULL;
  ES_CHECK_RC(es_server_create(&c, &s));
  es_server_config_fini(&c);
  assert_int_equal(es__srv_find(s, "a")->max_priority, 2);
  assert_int_equal(es__srv_find(s, "b")->max_priority, 0);
  assert_int_equal(es__srv_find(s, "c")->max_priority, es__srv_find(s, "c")->priority);
  /* The reported case: priority 1 from any client no longer jumps ahead. */
  assert_int_equal(es__srv_level_of(s, es__srv_find(s, "a"), 1, 1), 2);
  assert_int_equal(es__srv_level_of(s, es__srv_find(s, "b"), 1, 1), 0);
  es_server_destroy(s);

  ES_CHECK_RC(load_text(&c, "{\"port\": 0, \"models\": {\"a\": {\"file\": \"a.onnx\", "
                            "\"load\": false, \"priority\": 1, \"max_priority\": 3}}}"));
  ES_EXPECT_RC(es_server_create(&c, &s), ES_EINVAL);
  assert_non_null(strstr(es_last_error_detail(), "max_priority"));
  es_server_config_fini(&c);
  ES_CHECK_RC(load_text(&c, "{\"port\": 0, \"models\": {\"a\": {\"file\": \"a.onnx\", "
                            "\"load\": false, \"max_priority\": 16}}}"));
  ES_EXPECT_RC(es_server_create(&c, &s), ES_EINVAL);
  es_server_config_fini(&c);
  assert_int_equal(server_bytes(), before);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_two_servers, setup, teardown),
      cmocka_unit_test_setup_teardown(test_reload_replaces, setup, teardown),
      cmocka_unit_test(test_no_environment),
      cmocka_unit_test(test_null_handles),
      cmocka_unit_test(test_status_rule),
      cmocka_unit_test_setup_teardown(test_control_config, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cache_dir_config, setup, teardown),
      cmocka_unit_test_setup_teardown(test_read_buffer_config, setup, teardown),
      cmocka_unit_test_setup_teardown(test_budget_default, setup, teardown),
      cmocka_unit_test(test_level_of),
      cmocka_unit_test_setup_teardown(test_priority_cap_config, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
