/* The control plane's gate (src/server/guard.c): off by default, a bearer
 * token compared whole, the server's own origin only, JSON or no body. The
 * cases a web page on the same machine can send come first: each must be
 * refused on its own. */
#include "es_test.h"

#include "edgeserve/server.h"
#include "server/server_internal.h"

#include <string.h>

#define TOKEN "0123456789abcdef-secret"

static es_server_config cfg_;
static char why_[512];

static int guard(const char *auth, const char *origin, const char *host, const char *ctype,
                 size_t body) {
  why_[0] = 0;
  int st = es__srv_guard_control(&cfg_, auth, origin, host, ctype, body, why_, sizeof why_);
  if (st)
    assert_true(why_[0] != 0); /* every refusal says why */
  return st;
}

static int setup(void **state) {
  (void)state;
  es_server_config_default(&cfg_);
  cfg_.repository_control = 1;
  snprintf(cfg_.control_token, sizeof cfg_.control_token, "%s", TOKEN);
  return 0;
}

static void test_off_by_default(void **state) {
  (void)state;
  es_server_config d;
  es_server_config_default(&d);
  assert_int_equal(d.repository_control, 0);
  assert_string_equal(d.control_token, "");
  snprintf(d.control_token, sizeof d.control_token, "%s", TOKEN);
  int st = es__srv_guard_control(&d, "Bearer " TOKEN, NULL, "127.0.0.1:8000", NULL, 0, why_,
                                 sizeof why_);
  assert_int_equal(st, 403);
  assert_non_null(strstr(why_, "disabled"));
}

/* The reported attack: a page's cross-origin "simple" POST. */
static void test_web_page(void **state) {
  (void)state;
  assert_int_equal(guard(NULL, "http://evil.example", "127.0.0.1:8000", "text/plain", 2), 401);
  /* Even a page that had the token could not use it from another origin,
   * nor send a simple content type. */
  assert_int_equal(guard("Bearer " TOKEN, "http://evil.example", "127.0.0.1:8000",
                         "text/plain", 2),
                   403);
  assert_non_null(strstr(why_, "evil.example"));
  assert_int_equal(guard("Bearer " TOKEN, "null", "127.0.0.1:8000", NULL, 0), 403);
  assert_int_equal(guard("Bearer " TOKEN, NULL, "127.0.0.1:8000", "text/plain", 2), 415);
  assert_int_equal(
      guard("Bearer " TOKEN, NULL, "127.0.0.1:8000", "application/x-www-form-urlencoded", 1),
      415);
  assert_int_equal(guard("Bearer " TOKEN, NULL, "127.0.0.1:8000", "multipart/form-data", 9), 415);
  assert_int_equal(guard("Bearer " TOKEN, NULL, "127.0.0.1:8000", NULL, 9), 415);
}

static void test_token(void **state) {
  (void)state;
  const char *h = "127.0.0.1:8000";
  assert_int_equal(guard("Bearer " TOKEN, NULL, h, NULL, 0), 0);
  assert_int_equal(guard("bearer   " TOKEN "  ", NULL, h, NULL, 0), 0);
  assert_int_equal(guard(NULL, NULL, h, NULL, 0), 401);
  assert_non_null(strstr(why_, "Authorization: Bearer"));
  assert_int_equal(guard("", NULL, h, NULL, 0), 401);
  assert_int_equal(guard("Bearer", NULL, h, NULL, 0), 401);
  assert_int_equal(guard("Bearer ", NULL, h, NULL, 0), 401);
  assert_int_equal(guard("Basic " TOKEN, NULL, h, NULL, 0), 401);
  assert_int_equal(guard("Bearer" TOKEN, NULL, h, NULL, 0), 401);
  assert_int_equal(guard("Bearer x" TOKEN, NULL, h, NULL, 0), 401);
  assert_non_null(strstr(why_, "not the control token"));
  /* A prefix, a longer string, one byte off: all refused. */
  char t[64];
  snprintf(t, sizeof t, "Bearer %.*s", (int)strlen(TOKEN) - 1, TOKEN);
  assert_int_equal(guard(t, NULL, h, NULL, 0), 401);
  snprintf(t, sizeof t, "Bearer %sx", TOKEN);
  assert_int_equal(guard(t, NULL, h, NULL, 0), 401);
  snprintf(t, sizeof t, "Bearer %s", TOKEN);
  t[strlen(t) - 1] ^= 1;
  assert_int_equal(guard(t, NULL, h, NULL, 0), 401);
  /* A server whose token is not acceptable takes no token at all. */
  es_server_config weak = cfg_;
  snprintf(weak.control_token, sizeof weak.control_token, "short");
  assert_int_equal(es__srv_guard_control(&weak, "Bearer short", NULL, h, NULL, 0, why_,
                                         sizeof why_),
                   401);
  weak.control_token[0] = 0;
  assert_int_equal(es__srv_guard_control(&weak, "Bearer ", NULL, h, NULL, 0, why_, sizeof why_),
                   401);
}

static void test_origin(void **state) {
  (void)state;
  const char *a = "Bearer " TOKEN;
  assert_int_equal(guard(a, "http://127.0.0.1:8000", "127.0.0.1:8000", NULL, 0), 0);
  assert_int_equal(guard(a, "HTTP://LocalHost:8000", "localhost:8000", NULL, 0), 0);
  assert_int_equal(guard(a, "http://127.0.0.1:8001", "127.0.0.1:8000", NULL, 0), 403);
  assert_int_equal(guard(a, "http://127.0.0.1", "127.0.0.1:8000", NULL, 0), 403);
  assert_int_equal(guard(a, "http://127.0.0.1", "127.0.0.1:80", NULL, 0), 0);
  assert_int_equal(guard(a, "http://127.0.0.1:80", "127.0.0.1", NULL, 0), 0);
  /* Behind a TLS proxy that passes the Host on. */
  assert_int_equal(guard(a, "https://gw.example", "gw.example", NULL, 0), 0);
  assert_int_equal(guard(a, "https://gw.example:8443", "gw.example", NULL, 0), 403);
  assert_int_equal(guard(a, "http://gw.example.evil", "gw.example", NULL, 0), 403);
  assert_int_equal(guard(a, "http://gw.exampl", "gw.example", NULL, 0), 403);
  assert_int_equal(guard(a, "http://[::1]:8000", "[::1]:8000", NULL, 0), 0);
  assert_int_equal(guard(a, "http://[::1]:8000", "[::2]:8000", NULL, 0), 403);
  assert_int_equal(guard(a, "http://127.0.0.1:8000", NULL, NULL, 0), 403);
  assert_int_equal(guard(a, "http://127.0.0.1:8000", "127.0.0.1:x", NULL, 0), 403);
  assert_int_equal(guard(a, "ftp://127.0.0.1:8000", "127.0.0.1:8000", NULL, 0), 403);
  assert_int_equal(guard(a, "", "127.0.0.1:8000", NULL, 0), 403);
  assert_int_equal(guard(a, "http://", "127.0.0.1:8000", NULL, 0), 403);
  assert_int_equal(guard(a, "http://127.0.0.1:99999", "127.0.0.1:99999", NULL, 0), 403);
  /* The origin check alone, for other routes. */
  assert_int_equal(es__srv_guard_origin(NULL, NULL, why_, sizeof why_), 0);
  assert_int_equal(es__srv_guard_origin("http://evil.example", "127.0.0.1:8000", why_,
                                        sizeof why_),
                   403);
}

static void test_content_type(void **state) {
  (void)state;
  const char *a = "Bearer " TOKEN, *h = "127.0.0.1:8000";
  assert_int_equal(guard(a, NULL, h, "application/json", 2), 0);
  assert_int_equal(guard(a, NULL, h, "Application/JSON; charset=utf-8", 2), 0);
  assert_int_equal(guard(a, NULL, h, " application/json ;charset=utf-8", 2), 0);
  assert_int_equal(guard(a, NULL, h, "application/jsonp", 2), 415);
  assert_int_equal(guard(a, NULL, h, "application/json-seq", 2), 415);
  /* No body: nothing to mistake, whatever the type says (curl -d ''). */
  assert_int_equal(guard(a, NULL, h, "application/x-www-form-urlencoded", 0), 0);
}

static void test_token_valid(void **state) {
  (void)state;
  char t[ES_SERVER_TOKEN_MAX + 1];
  assert_false(es__srv_token_valid(NULL));
  assert_false(es__srv_token_valid(""));
  assert_false(es__srv_token_valid("fifteen-chars-x"));
  assert_true(es__srv_token_valid("sixteen-chars-xx"));
  assert_false(es__srv_token_valid("sixteen chars xx"));
  assert_false(es__srv_token_valid("sixteen-chars-x\n"));
  memset(t, 'a', sizeof t);
  t[ES_SERVER_TOKEN_MAX - 1] = 0;
  assert_true(es__srv_token_valid(t));
  t[ES_SERVER_TOKEN_MAX - 1] = 'a';
  t[ES_SERVER_TOKEN_MAX] = 0;
  assert_false(es__srv_token_valid(t));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_off_by_default), cmocka_unit_test(test_web_page),
      cmocka_unit_test(test_token),          cmocka_unit_test(test_origin),
      cmocka_unit_test(test_content_type),   cmocka_unit_test(test_token_valid),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
