/* The model repository under concurrent loads, unloads and requests.
 *
 * One server in this process (port 0, the embedded default models from the
 * fetched-models folder, repository control on with a token), driven over
 * loopback HTTP by a small raw-socket HTTP/1.1 client, one connection per
 * request, every call bounded (socket timeouts, request counts).
 *
 * The interleavings that broke the repository are made on purpose: a
 * request in flight is a reference the test takes itself
 * (es__srv_model_acquire, what the infer path takes), so an unload is
 * certain to be waiting for it while the test sends a load, a second unload
 * or a request. Then the same server is hammered from several threads:
 * load/unload cycles of the ocr and face pipelines and of a plain model,
 * two threads unloading ocr at once, and pipeline and plain requests all
 * along. After each part every model must be consistent (the index says
 * READY exactly when its requests succeed), no answer may be a 500, and
 * after the server is destroyed the counting layer must be back where it
 * started (a destroyed-twice reader or a leaked one shows there, and in
 * ASan's reports in sanitizer builds). TSan runs it (label concurrency). */
#include "es_test.h"

#include "edgeserve/server.h"
#include "server/server_internal.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h> /* before jpeglib.h */
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <jpeglib.h>

#define TOKEN "races-test-control-token-0123456789"
#define RESP_MAX (64 << 10)

static es_server *srv_;
static int port_;
static unsigned char *jpeg_;
static unsigned long jpeg_len_;
static char *face_body_, *plain_body_;
static size_t face_len_, plain_len_, face_hl_, plain_hl_;

/* ---- a small HTTP/1.1 client ------------------------------------------------------ */

typedef struct resp {
  int status; /* -1: no answer */
  char body[RESP_MAX];
} resp;

static int write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
    if (w <= 0)
      return -1;
    c += w;
    n -= (size_t)w;
  }
  return 0;
}

/* One request on its own connection (Connection: close); the answer's status
 * and the start of its body. extra: more header lines, each ending \r\n. */
static int http(const char *method, const char *path, const char *extra, const void *body,
                size_t len, resp *r) {
  r->status = -1;
  r->body[0] = 0;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0)
    return -1;
  struct timeval tv = {120, 0}; /* a bound, not a measurement */
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port_)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  char head[1024];
  int hn = snprintf(head, sizeof head,
                    "%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n"
                    "Content-Length: %zu\r\n%s\r\n",
                    method, path, port_, len, extra ? extra : "");
  if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0 || write_all(fd, head, (size_t)hn) < 0 ||
      (len && write_all(fd, body, len) < 0)) {
    close(fd);
    return -1;
  }
  size_t cap = RESP_MAX + 4096, got = 0;
  char *buf = es_mem_alloc(ES_MEM_OTHER, cap);
  if (!buf) {
    close(fd);
    return -1;
  }
  ssize_t n;
  while ((n = recv(fd, buf + got, cap - 1 - got, 0)) > 0) {
    got += (size_t)n;
    if (got == cap - 1) { /* keep the head, drain the rest */
      char sink[4096];
      while (recv(fd, sink, sizeof sink, 0) > 0)
        ;
      break;
    }
  }
  close(fd);
  buf[got] = 0;
  if (sscanf(buf, "HTTP/1.%*d %d", &r->status) != 1)
    r->status = -1;
  const char *b = strstr(buf, "\r\n\r\n");
  snprintf(r->body, sizeof r->body, "%s", b ? b + 4 : "");
  es_mem_free(buf);
  return r->status;
}

static int control(const char *name, const char *verb) {
  char path[256];
  snprintf(path, sizeof path, "/v2/repository/models/%s/%s", name, verb);
  resp *r = es_mem_alloc(ES_MEM_OTHER, sizeof *r);
  assert_non_null(r);
  int st = http("POST", path, "Authorization: Bearer " TOKEN "\r\n", NULL, 0, r);
  if (st != 200 && st != 409)
    printf("# %s %s: %d %s\n", verb, name, st, r->body);
  es_mem_free(r);
  return st;
}

static int infer(const char *name) {
  char path[256], hl[128];
  snprintf(path, sizeof path, "/v2/models/%s/infer", name);
  int plain = strncmp(name, "blaze", 5) == 0;
  snprintf(hl, sizeof hl,
           "Content-Type: application/octet-stream\r\nInference-Header-Content-Length: %zu\r\n",
           plain ? plain_hl_ : face_hl_);
  resp *r = es_mem_alloc(ES_MEM_OTHER, sizeof *r);
  assert_non_null(r);
  int st = http("POST", path, hl, plain ? plain_body_ : face_body_,
                plain ? plain_len_ : face_len_, r);
  if (st != 200 && st != 404 && st != 429 && st != 503)
    printf("# infer %s: %d %s\n", name, st, r->body);
  es_mem_free(r);
  return st;
}

/* The index's state of one model ("" when absent). */
static void index_state(const char *name, char *state, size_t cap) {
  resp *r = es_mem_alloc(ES_MEM_OTHER, sizeof *r);
  assert_non_null(r);
  state[0] = 0;
  assert_int_equal(http("POST", "/v2/repository/index", NULL, NULL, 0, r), 200);
  json_t *arr = json_loads(r->body, 0, NULL);
  assert_true(json_is_array(arr));
  size_t i;
  json_t *m;
  json_array_foreach(arr, i, m) {
    if (!strcmp(json_string_value(json_object_get(m, "name")), name))
      snprintf(state, cap, "%s", json_string_value(json_object_get(m, "state")));
  }
  json_decref(arr);
  es_mem_free(r);
}

static int is_state(const char *name, const char *want) {
  char st[32];
  index_state(name, st, sizeof st);
  return !strcmp(st, want);
}

/* Until the index shows the state; each look is an HTTP round trip, and the
 * bound (a count, generous) only stops a broken server from hanging. */
static void await_state(const char *name, const char *want) {
  for (int i = 0; i < 20000 && !is_state(name, want); i++)
    usleep(1000);
  char st[32];
  index_state(name, st, sizeof st);
  assert_string_equal(st, want);
}

/* ---- the request bodies ------------------------------------------------------------- */

/* A 160x96 greyscale JPEG with a few dark bars (something for det to look
 * at, small enough that a request stays short under the sanitizers). */
static void make_jpeg(void) {
  struct jpeg_compress_struct c;
  struct jpeg_error_mgr e;
  c.err = jpeg_std_error(&e);
  jpeg_create_compress(&c);
  jpeg_mem_dest(&c, &jpeg_, &jpeg_len_);
  c.image_width = 160;
  c.image_height = 96;
  c.input_components = 1;
  c.in_color_space = JCS_GRAYSCALE;
  jpeg_set_defaults(&c);
  jpeg_start_compress(&c, TRUE);
  unsigned char row[160];
  for (unsigned y = 0; y < 96; y++) {
    for (unsigned x = 0; x < 160; x++)
      row[x] = (y / 12 % 3 == 1 && x / 8 % 2 == 0 && x > 16 && x < 144) ? 20 : 235;
    JSAMPROW p = row;
    jpeg_write_scanlines(&c, &p, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
}

/* KServe v2 binary extension: the JSON header, then the tensor bytes. */
static void make_bodies(void) {
  char h[512];
  int n = snprintf(h, sizeof h,
                   "{\"inputs\":[{\"name\":\"image\",\"shape\":[1],\"datatype\":\"BYTES\","
                   "\"parameters\":{\"binary_data_size\":%lu}}]}",
                   jpeg_len_ + 4);
  face_hl_ = (size_t)n;
  face_len_ = face_hl_ + 4 + jpeg_len_;
  face_body_ = es_mem_alloc(ES_MEM_OTHER, face_len_);
  assert_non_null(face_body_);
  memcpy(face_body_, h, face_hl_);
  for (int i = 0; i < 4; i++)
    face_body_[face_hl_ + (size_t)i] = (char)(jpeg_len_ >> (8 * i) & 0xff);
  memcpy(face_body_ + face_hl_ + 4, jpeg_, jpeg_len_);

  size_t tb = (size_t)128 * 128 * 3 * 4;
  n = snprintf(h, sizeof h,
               "{\"inputs\":[{\"name\":\"input:0\",\"shape\":[1,128,128,3],\"datatype\":\"FP32\","
               "\"parameters\":{\"binary_data_size\":%zu}}]}",
               tb);
  plain_hl_ = (size_t)n;
  plain_len_ = plain_hl_ + tb;
  plain_body_ = es_mem_calloc(ES_MEM_OTHER, 1, plain_len_);
  assert_non_null(plain_body_);
  memcpy(plain_body_, h, plain_hl_);
}

/* ---- setup -------------------------------------------------------------------------------- */

static size_t baseline_;

static int setup(void **state) {
  (void)state;
  char det[1100];
  es_test_model_path(det, sizeof det, "ppocr_det.onnx");
  if (access(det, R_OK) != 0) {
    printf("# models missing (scripts/setup/fetch-models.sh): %s\n", det);
    return 0; /* each test skips */
  }
  baseline_ = es_mem_total();
  make_jpeg();
  make_bodies();
  es_server_config c;
  es_server_config_default(&c);
  c.port = 0;
  c.quiet = 1;
  c.runtime.workers = 2;
  c.repository_control = 1;
  snprintf(c.control_token, sizeof c.control_token, "%s", TOKEN);
  snprintf(c.model_dir, sizeof c.model_dir, "%.*s", (int)(strrchr(det, '/') - det), det);
  ES_CHECK_RC(es_server_create(&c, &srv_));
  es_server_config_fini(&c);
  ES_CHECK_RC(es_server_port(srv_, &port_));
  return 0;
}

static int teardown(void **state) {
  (void)state;
  if (!srv_)
    return 0;
  es_server_destroy(srv_);
  srv_ = NULL;
  es_mem_free(face_body_);
  es_mem_free(plain_body_);
  free(jpeg_);
  /* Everything the server and its models held is back: no reader or
   * detector leaked, none destroyed twice (that would have crashed or
   * shown as a negative count). */
  size_t after = es_mem_total();
  printf("# counting layer: %zu B before the server, %zu B after destroy\n", baseline_, after);
  return after == baseline_ ? 0 : -1;
}

static srv_model *model(const char *name) {
  srv_model *sm = es__srv_find(srv_, name);
  assert_non_null(sm);
  return sm;
}

/* Every model: READY in the index exactly when its requests succeed. */
static void check_consistent(void) {
  static const char *const names[] = {"blazeface_front", "face", "ocr"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    char st[32];
    index_state(names[i], st, sizeof st);
    int code = infer(names[i]);
    printf("# %s: %s, infer %d\n", names[i], st, code);
    if (!strcmp(st, "READY"))
      assert_int_equal(code, 200);
    else
      assert_int_equal(code, 404);
  }
}

/* ---- the interleavings, made on purpose ------------------------------------------------------ */

typedef struct call {
  const char *name, *verb;
  int status;
  pthread_t th;
} call;

static void *call_main(void *p) {
  call *c = p;
  c->status = control(c->name, c->verb);
  return NULL;
}

static void call_start(call *c, const char *name, const char *verb) {
  c->name = name;
  c->verb = verb;
  c->status = 0;
  assert_int_equal(pthread_create(&c->th, NULL, call_main, c), 0);
}

static int call_join(call *c) {
  pthread_join(c->th, NULL);
  return c->status;
}

/* A load that arrives while an unload of ocr waits for a request in flight
 * waits for it, then loads: ocr ends READY and answers (before: READY in
 * the index, every request 500 "not a reader", the old reader leaked). */
static void test_load_during_unload(void **state) {
  (void)state;
  if (!srv_)
    skip();
  srv_model *ocr = model("ocr");
  ES_CHECK_RC(es__srv_model_acquire(srv_, ocr, NULL)); /* a request in flight */
  call un, ld;
  call_start(&un, "ocr", "unload");
  await_state("ocr", "UNLOADING");
  assert_int_equal(infer("ocr"), 404); /* new requests are refused meanwhile */
  call_start(&ld, "ocr", "load");
  usleep(100 * 1000); /* lets the load reach its wait (either order passes) */
  assert_true(is_state("ocr", "UNLOADING"));
  es__srv_model_release(srv_, ocr);
  assert_int_equal(call_join(&un), 200);
  assert_int_equal(call_join(&ld), 200);
  assert_true(is_state("ocr", "READY"));
  assert_int_equal(infer("ocr"), 200);
  check_consistent();
}

/* Two unloads waiting on the same request: one tears the reader down, the
 * other finds it gone; both succeed and nothing is destroyed twice. */
static void test_double_unload(void **state) {
  (void)state;
  if (!srv_)
    skip();
  srv_model *ocr = model("ocr");
  ES_CHECK_RC(es__srv_model_acquire(srv_, ocr, NULL));
  call a, b;
  call_start(&a, "ocr", "unload");
  await_state("ocr", "UNLOADING");
  call_start(&b, "ocr", "unload");
  usleep(100 * 1000);
  es__srv_model_release(srv_, ocr);
  assert_int_equal(call_join(&a), 200);
  assert_int_equal(call_join(&b), 200);
  assert_true(is_state("ocr", "UNAVAILABLE"));
  assert_int_equal(infer("ocr"), 404);
  assert_int_equal(control("ocr", "load"), 200);
  assert_int_equal(infer("ocr"), 200);
  check_consistent();
}

/* A plain model: requests hold it (an acquire fails once it is unloading),
 * the unload waits for the last one, and an unload that waits too long
 * leaves it READY. */
static void test_plain_refs(void **state) {
  (void)state;
  if (!srv_)
    skip();
  srv_model *bb = model("blazeface_back");
  int id = -1, id2 = -1;
  ES_CHECK_RC(es__srv_model_acquire(srv_, bb, &id));
  assert_true(id >= 0);
  ES_EXPECT_RC(es__srv_model_unload(srv_, bb, 50), ES_ETIMEDOUT);
  assert_true(is_state("blazeface_back", "READY"));
  call un;
  call_start(&un, "blazeface_back", "unload");
  await_state("blazeface_back", "UNLOADING");
  ES_EXPECT_RC(es__srv_model_acquire(srv_, bb, &id2), ES_ENOENT);
  assert_non_null(strstr(es_last_error_detail(), "unloaded"));
  es__srv_model_release(srv_, bb);
  assert_int_equal(call_join(&un), 200);
  ES_EXPECT_RC(es__srv_model_acquire(srv_, bb, &id2), ES_ENOENT);
  assert_int_equal(control("blazeface_back", "load"), 200);
  ES_CHECK_RC(es__srv_model_acquire(srv_, bb, &id2));
  es__srv_model_release(srv_, bb);
}

/* A member of a loaded pipeline cannot go (409) while the pipeline is
 * loaded, even with a face request in flight; once the pipeline is
 * unloaded it can, and loading the pipeline brings it back. */
static void test_member_of_pipeline(void **state) {
  (void)state;
  if (!srv_)
    skip();
  srv_model *face = model("face");
  ES_CHECK_RC(es__srv_model_acquire(srv_, face, NULL));
  assert_int_equal(control("blazeface_front", "unload"), 409);
  es__srv_model_release(srv_, face);
  assert_int_equal(control("blazeface_front", "unload"), 409);
  assert_int_equal(infer("face"), 200);
  assert_int_equal(control("face", "unload"), 200);
  assert_int_equal(control("blazeface_front", "unload"), 200);
  assert_int_equal(infer("blazeface_front"), 404);
  assert_int_equal(control("face", "load"), 200); /* loads its member too */
  assert_true(is_state("blazeface_front", "READY"));
  check_consistent();
}

/* ---- the hammer --------------------------------------------------------------------------- */

#define CYCLES 20    /* load/unload cycles per control thread */
#define MAX_REQ 300  /* requests per request thread, at most */

static atomic_int controls_left;
static atomic_int n_500, n_bad, n_ok, n_404, n_refused;

static void tally(int st) {
  if (st == 200)
    atomic_fetch_add(&n_ok, 1);
  else if (st == 404)
    atomic_fetch_add(&n_404, 1);
  else if (st == 429 || st == 503)
    atomic_fetch_add(&n_refused, 1);
  else if (st == 500)
    atomic_fetch_add(&n_500, 1);
  else
    atomic_fetch_add(&n_bad, 1);
}

static void control_ok(int st, int allowed_409) {
  if (st != 200 && !(allowed_409 && st == 409))
    atomic_fetch_add(st == 500 ? &n_500 : &n_bad, 1);
}

static void *cycle_ocr(void *p) { /* two of these: double unloads, loads during unloads */
  (void)p;
  for (int i = 0; i < CYCLES; i++) {
    control_ok(control("ocr", "unload"), 0);
    control_ok(control("ocr", "load"), 0);
  }
  atomic_fetch_sub(&controls_left, 1);
  return NULL;
}

static void *cycle_face(void *p) {
  (void)p;
  for (int i = 0; i < CYCLES; i++) {
    control_ok(control("blazeface_front", "unload"), 1); /* 409 while face is loaded */
    control_ok(control("face", "unload"), 0);
    control_ok(control("blazeface_front", "unload"), 1); /* 409 if the loader below won */
    control_ok(control("face", "load"), 0);
  }
  atomic_fetch_sub(&controls_left, 1);
  return NULL;
}

static void *cycle_face_loader(void *p) { /* loads racing the unloads above */
  (void)p;
  for (int i = 0; i < CYCLES; i++) {
    control_ok(control("face", "load"), 0);
    control_ok(control("blazeface_front", "load"), 0);
  }
  atomic_fetch_sub(&controls_left, 1);
  return NULL;
}

static void *requests(void *p) {
  const char *const *names = p;
  for (int i = 0; i < MAX_REQ && atomic_load(&controls_left) > 0; i++)
    tally(infer(names[i % 2]));
  return NULL;
}

static void test_hammer(void **state) {
  (void)state;
  if (!srv_)
    skip();
  static const char *const pipes[2] = {"ocr", "face"};
  static const char *const mixed[2] = {"blazeface_front", "ocr"};
  pthread_t th[6];
  atomic_store(&controls_left, 4);
  assert_int_equal(pthread_create(&th[0], NULL, cycle_ocr, NULL), 0);
  assert_int_equal(pthread_create(&th[1], NULL, cycle_ocr, NULL), 0);
  assert_int_equal(pthread_create(&th[2], NULL, cycle_face, NULL), 0);
  assert_int_equal(pthread_create(&th[3], NULL, cycle_face_loader, NULL), 0);
  assert_int_equal(pthread_create(&th[4], NULL, requests, (void *)pipes), 0);
  assert_int_equal(pthread_create(&th[5], NULL, requests, (void *)mixed), 0);
  for (int i = 0; i < 6; i++)
    pthread_join(th[i], NULL);
  printf("# hammer: %d requests 200, %d 404, %d refused (429/503), %d 500, %d other\n",
         atomic_load(&n_ok), atomic_load(&n_404), atomic_load(&n_refused), atomic_load(&n_500),
         atomic_load(&n_bad));
  assert_int_equal(atomic_load(&n_500), 0);
  assert_int_equal(atomic_load(&n_bad), 0);
  check_consistent(); /* as the threads left it */
  assert_int_equal(control("ocr", "load"), 200);
  assert_int_equal(control("face", "load"), 200);
  assert_int_equal(control("blazeface_front", "load"), 200);
  check_consistent();
  assert_int_equal(infer("ocr"), 200);
  assert_int_equal(infer("face"), 200);
  assert_int_equal(infer("blazeface_front"), 200);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_load_during_unload),
      cmocka_unit_test(test_double_unload),
      cmocka_unit_test(test_plain_refs),
      cmocka_unit_test(test_member_of_pipeline),
      cmocka_unit_test(test_hammer),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
