/* Out-of-memory through the server's code path, written against the public
 * API and HTTP only (include/edgeserve/server.h): an es_server made in this
 * process on a free loopback port, driven over a socket.
 *
 * requests: one server with the default model set (the five target models,
 * the face and OCR pipelines). A round is one request of each kind: health,
 * model metadata, infer with JSON tensors (cls), infer with binary tensors
 * in and out (BlazeFace front), the face pipeline on a photo, the OCR
 * pipeline on two printed lines, /metrics and the repository index. A
 * normal round gives the reference answers; a counting pass numbers the
 * allocations of a round and where they are made (support/oom_sched.h);
 * then a round is sent with the counting layer told to fail its N-th
 * allocation, for N on the schedule (ES_OOM_FULL=1: every N) until a round
 * meets no failure. Every answer must be a well-formed HTTP response: the
 * normal one (same status, same body but for /metrics), or, for the request
 * the failure hit, a 500, 503 (with Retry-After) or 507 with a JSON error
 * (or the normal answer, if it could do without that block). A dropped
 * connection is accepted only when the failure hit the connection's own
 * setup (the first allocation of its request). After each round the server
 * holds exactly what it held after the normal round (each tag's bytes and
 * live blocks), and after es_server_destroy the counting layer is back to
 * what it was before es_server_create.
 *
 * create: es_server_create with a config of one model and a face pipeline
 * over it, the N-th allocation failing (N sampled as above): an error with
 * a detail, or a server that starts (a model that could not load is
 * reported by the server, not fatal) and is destroyed; either way every
 * byte comes back.
 *
 * ES_OOM_PERSISTENT=1: from the N-th allocation on, all fail; ES_OOM_N=N:
 * one round, with the stack of the allocation that fails;
 * the two ways a server could fail a request without a proper refusal (an
 * answer dropped when its body cannot be allocated, a 400 for a request
 * that could not be parsed for want of memory) fail the test;
 * ES_OOM_SERVER_STRICT=0 only counts them (see known_gap). Allocations
 * outside the counting layer (libmicrohttpd, jansson, libspng, oneDNN) are
 * not injected. */
#include "es_test.h"

#include "common/internal.h"
#include "edgeserve/server.h"
#include "support/oom_sched.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#ifndef ES_SOURCE_DIR
#define ES_SOURCE_DIR "."
#endif

static char model_dir_[1024], image_dir_[1024], tmp_dir_[256], ocr_image_[2048];
static oom_sched sched_;
static int have_models_;
static int strict_; /* ES_OOM_SERVER_STRICT */

/* ---- HTTP over loopback ------------------------------------------------------- */

typedef struct http_req {
  const char *name;
  const char *method, *path;
  const char *headers; /* extra header lines, each ending in \r\n */
  char *body;          /* test memory (malloc) */
  size_t body_len;
} http_req;

typedef struct http_resp {
  int status;          /* -1: no response (connection dropped or refused) */
  char *raw;           /* whole response, malloc'd */
  size_t raw_len;
  const char *body;    /* into raw */
  size_t body_len;
  int retry_after;     /* has Retry-After */
  const char *problem; /* not well-formed: why */
} http_resp;

static void resp_free(http_resp *r) {
  free(r->raw);
  memset(r, 0, sizeof *r);
}

static int send_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
    if (k <= 0)
      return -1;
    c += k;
    n -= (size_t)k;
  }
  return 0;
}

/* Content-Length, if the header block [h, end) has one; -1 otherwise. */
static long long header_length(const char *h, const char *end) {
  for (const char *p = h; p && p < end; p = memchr(p, '\n', (size_t)(end - p)), p = p ? p + 1 : p)
    if (!strncasecmp(p, "Content-Length:", 15))
      return strtoll(p + 15, NULL, 10);
  return -1;
}

static int has_header(const char *h, const char *end, const char *name) {
  size_t n = strlen(name);
  for (const char *p = h; p && p < end; p = memchr(p, '\n', (size_t)(end - p)), p = p ? p + 1 : p)
    if (!strncasecmp(p, name, n))
      return 1;
  return 0;
}

/* One request on its own connection (Connection: close), the response read
 * to the end and checked for form. */
static http_resp http_do(int port, const http_req *q) {
  http_resp r = {.status = -1};
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0)
    return r;
  struct timeval tv = {.tv_sec = 120};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  char head[1024];
  int hn = snprintf(head, sizeof head,
                    "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                    "Content-Length: %zu\r\n%s\r\n",
                    q->method, q->path, q->body_len, q->headers ? q->headers : "");
  if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0 || send_all(fd, head, (size_t)hn) < 0 ||
      (q->body_len && send_all(fd, q->body, q->body_len) < 0)) {
    /* The server may answer and close before the whole body is sent. */
  }
  size_t cap = 1 << 16;
  r.raw = malloc(cap);
  for (;;) {
    if (r.raw_len + 4096 > cap)
      r.raw = realloc(r.raw, cap *= 2);
    if (!r.raw)
      break;
    ssize_t k = recv(fd, r.raw + r.raw_len, cap - r.raw_len - 1, 0);
    if (k <= 0)
      break;
    r.raw_len += (size_t)k;
  }
  close(fd);
  if (!r.raw || r.raw_len == 0)
    return r;
  r.raw[r.raw_len] = 0;
  r.problem = "no status line";
  int st = 0;
  if (sscanf(r.raw, "HTTP/1.%*1[01] %3d ", &st) != 1 || st < 100 || st > 599)
    return r;
  r.status = st;
  const char *end = strstr(r.raw, "\r\n\r\n");
  r.problem = "no end of headers";
  if (!end)
    return r;
  r.body = end + 4;
  r.body_len = r.raw_len - (size_t)(r.body - r.raw);
  long long cl = header_length(r.raw, end);
  r.retry_after = has_header(r.raw, end, "Retry-After:");
  r.problem = NULL;
  if (cl >= 0 && (size_t)cl != r.body_len)
    r.problem = "body length differs from Content-Length";
  else if (cl < 0 && !has_header(r.raw, end, "Transfer-Encoding: chunked"))
    r.problem = "neither Content-Length nor chunked";
  return r;
}

/* ---- the requests --------------------------------------------------------------- */

enum { REQ_HEALTH, REQ_META, REQ_JSON, REQ_BINARY, REQ_FACE, REQ_OCR, REQ_METRICS, REQ_INDEX,
       N_REQ };

static http_req reqs_[N_REQ];
static char bin_headers_[3][128];

static char *read_whole(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = n > 0 ? malloc((size_t)n) : NULL;
  if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
    free(b);
    b = NULL;
  }
  fclose(f);
  *len = b ? (size_t)n : 0;
  return b;
}

/* A JSON header then raw bytes (the binary tensor extension). */
static char *binary_body(const char *header, const void *data, size_t n, size_t *len,
                         char *hdr_line, size_t hdr_size) {
  size_t hl = strlen(header);
  char *b = malloc(hl + n);
  if (!b)
    return NULL;
  memcpy(b, header, hl);
  memcpy(b + hl, data, n);
  *len = hl + n;
  snprintf(hdr_line, hdr_size, "Inference-Header-Content-Length: %zu\r\n", hl);
  return b;
}

/* A pipeline request: the image file as one BYTES element (4-byte
 * little-endian length, then the bytes). */
static char *image_body(const char *path, size_t *len, char *hdr_line, size_t hdr_size) {
  size_t n;
  char *img = read_whole(path, &n);
  if (!img)
    return NULL;
  char header[256];
  snprintf(header, sizeof header,
           "{\"inputs\":[{\"name\":\"image\",\"shape\":[1],\"datatype\":\"BYTES\","
           "\"parameters\":{\"binary_data_size\":%zu}}]}",
           n + 4);
  char *data = malloc(n + 4);
  char *b = NULL;
  if (data) {
    uint32_t le = (uint32_t)n; /* the host is little-endian, as the server requires */
    memcpy(data, &le, 4);
    memcpy(data + 4, img, n);
    b = binary_body(header, data, n + 4, len, hdr_line, hdr_size);
  }
  free(data);
  free(img);
  return b;
}

static int make_requests(void) {
  reqs_[REQ_HEALTH] = (http_req){"health", "GET", "/v2/health/ready", NULL, NULL, 0};
  reqs_[REQ_META] = (http_req){"metadata", "GET", "/v2/models/blazeface_front", NULL, NULL, 0};
  reqs_[REQ_METRICS] = (http_req){"metrics", "GET", "/metrics", NULL, NULL, 0};
  reqs_[REQ_INDEX] = (http_req){"index", "POST", "/v2/repository/index", NULL, NULL, 0};

  /* cls, 1x3x48x192 as JSON numbers (eighths: exact in decimal). */
  size_t cap = 64 + 27648 * 8;
  char *j = malloc(cap);
  if (!j)
    return -1;
  size_t n = (size_t)snprintf(j, cap,
                              "{\"inputs\":[{\"name\":\"x\",\"shape\":[1,3,48,192],"
                              "\"datatype\":\"FP32\",\"data\":[");
  for (int i = 0; i < 27648; i++)
    n += (size_t)snprintf(j + n, cap - n, "%s%.3f", i ? "," : "", (double)(i % 17) / 8.0 - 1.0);
  n += (size_t)snprintf(j + n, cap - n, "]}]}");
  reqs_[REQ_JSON] = (http_req){"infer JSON", "POST", "/v2/models/ppocr_cls/infer",
                              "Content-Type: application/json\r\n", j, n};

  /* BlazeFace front, 1x128x128x3 binary in, binary out. */
  static float px[128 * 128 * 3];
  for (size_t i = 0; i < sizeof px / sizeof px[0]; i++)
    px[i] = (float)(i % 251) / 250.0f;
  const char *hdr = "{\"inputs\":[{\"name\":\"input:0\",\"shape\":[1,128,128,3],\"datatype\":"
                    "\"FP32\",\"parameters\":{\"binary_data_size\":196608}}],"
                    "\"parameters\":{\"binary_data_output\":true}}";
  size_t len = 0;
  char *b = binary_body(hdr, px, sizeof px, &len, bin_headers_[0], sizeof bin_headers_[0]);
  reqs_[REQ_BINARY] = (http_req){"infer binary", "POST", "/v2/models/blazeface_front/infer",
                                 bin_headers_[0], b, len};
  char path[2100];
  snprintf(path, sizeof path, "%s/astronaut.png", image_dir_);
  char *f = image_body(path, &len, bin_headers_[1], sizeof bin_headers_[1]);
  reqs_[REQ_FACE] = (http_req){"face", "POST", "/v2/models/face/infer", bin_headers_[1], f, len};
  char *o = image_body(ocr_image_, &len, bin_headers_[2], sizeof bin_headers_[2]);
  reqs_[REQ_OCR] = (http_req){"ocr", "POST", "/v2/models/ocr/infer", bin_headers_[2], o, len};
  return b && f && o ? 0 : -1;
}

/* ---- setup ------------------------------------------------------------------------ */

static int group_setup(void **state) {
  (void)state;
  const char *d = getenv("ES_MODEL_DIR");
  snprintf(model_dir_, sizeof model_dir_, "%s", d ? d : ES_SOURCE_DIR "/.cache/models");
  d = getenv("ES_IMAGE_DIR");
  snprintf(image_dir_, sizeof image_dir_, "%s", d ? d : ES_SOURCE_DIR "/.cache/images");
  if (oom_sched_init(&sched_) < 0)
    return -1;
  strict_ = !getenv("ES_OOM_SERVER_STRICT") || atoi(getenv("ES_OOM_SERVER_STRICT"));
  printf("# %s failures, %s\n", sched_.persistent ? "persistent" : "one-shot",
         sched_.full ? "every N (ES_OOM_FULL)" : "N sampled (every N: ES_OOM_FULL=1)");
  const char *need[] = {"blazeface_front_128.onnx", "blazeface_back_256.onnx", "ppocr_det.onnx",
                        "ppocr_cls.onnx", "ppocr_rec.onnx", "ppocr_keys_v1.txt"};
  have_models_ = 1;
  char p[2100];
  for (size_t i = 0; i < sizeof need / sizeof need[0]; i++) {
    snprintf(p, sizeof p, "%s/%s", model_dir_, need[i]);
    have_models_ &= access(p, R_OK) == 0;
  }
  snprintf(p, sizeof p, "%s/astronaut.png", image_dir_);
  have_models_ &= access(p, R_OK) == 0;
  snprintf(tmp_dir_, sizeof tmp_dir_, "/tmp/es_srv_oom_XXXXXX");
  if (!mkdtemp(tmp_dir_))
    return -1;
  if (oom_text_image(tmp_dir_, ocr_image_, sizeof ocr_image_) < 0) {
    printf("# ImageMagick's convert or a font missing: the OCR request sends the photo\n");
    snprintf(ocr_image_, sizeof ocr_image_, "%s/astronaut.png", image_dir_);
  }
  return have_models_ && make_requests() < 0 ? -1 : 0;
}

static int group_teardown(void **state) {
  (void)state;
  for (int i = 0; i < N_REQ; i++)
    free(reqs_[i].body);
  char f[2100];
  snprintf(f, sizeof f, "%s/lines.png", tmp_dir_);
  unlink(f);
  snprintf(f, sizeof f, "%s/create.json", tmp_dir_);
  unlink(f);
  rmdir(tmp_dir_);
  oom_sched_fini(&sched_);
  return 0;
}

static void server_config(es_server_config *sc) {
  es_server_config_default(sc);
  sc->port = 0;
  sc->quiet = 1;
  snprintf(sc->model_dir, sizeof sc->model_dir, "%s", model_dir_);
  sc->runtime.workers = 1; /* one sequence of allocations per round */
  sc->runtime.pin = 0;
  sc->runtime.watch_ms = 0;
}

/* Waits (up to 10 s) for the connection threads to give back what the
 * last round took: a response is read before the server frees its side. */
static int settle(const oom_snapshot *want) {
  for (int i = 0; i < 10000; i++) {
    oom_snapshot now = oom_snap();
    int same = now.total == want->total;
    for (int t = 0; same && t < ES_MEM_TAG_COUNT; t++)
      same = now.tag[t].current == want->tag[t].current &&
             now.tag[t].allocs - now.tag[t].frees == want->tag[t].allocs - want->tag[t].frees;
    if (same)
      return 0;
    usleep(1000);
  }
  return -1;
}

/* Wait until the counting layer has not moved for 300 ms (at most 10 s):
 * the server frees a connection's state when it sees the client's close,
 * on its own thread, a moment after the client's last answer. */
static oom_snapshot quiesce(void) {
  oom_snapshot last = oom_snap();
  int still = 0;
  for (int i = 0; i < 10000 && still < 300; i++) {
    usleep(1000);
    oom_snapshot now = oom_snap();
    int same = now.total == last.total;
    for (int t = 0; same && t < ES_MEM_TAG_COUNT; t++)
      same = now.tag[t].current == last.tag[t].current;
    still = same ? still + 1 : 0;
    last = now;
  }
  return last;
}

/* ---- requests under failure --------------------------------------------------------- */

typedef struct round_log {
  http_resp resp[N_REQ];
  uint64_t first[N_REQ];    /* number of the first allocation attempt of each request */
  int hit[N_REQ];           /* the injected failure happened during this request */
} round_log;

static void round_run(int port, round_log *l) {
  for (int i = 0; i < N_REQ; i++) {
    es_mem_fault_stats a, b;
    es_mem_fault_stats_get(&a);
    l->resp[i] = http_do(port, &reqs_[i]);
    es_mem_fault_stats_get(&b);
    l->first[i] = a.calls + 1;
    l->hit[i] = b.injected > a.injected;
  }
}

static void round_free(round_log *l) {
  for (int i = 0; i < N_REQ; i++)
    resp_free(&l->resp[i]);
}

/* Two gaps of the server known when this test was written, reported (and
 * counted) but failing the test only with ES_OOM_SERVER_STRICT=1 while the
 * server code is being rewritten:
 *   - no memory for a response body: the connection is closed without an
 *     answer (send_text and send_error return MHD_NO);
 *   - no memory while parsing the request or decoding a pipeline's image:
 *     answered 400 (every parse or decode error is taken as the client's)
 *     where ES_ENOMEM means 503. */
static unsigned gap_dropped_, gap_400_;

static int known_gap(const http_resp *r, int hit) {
  if (strict_ || !hit)
    return 0;
  if (r->status < 0 && r->raw_len == 0) {
    gap_dropped_++;
    return 1;
  }
  if (r->status == 400 && r->body &&
      (strstr(r->body, "out of memory") || strstr(r->body, "no memory"))) {
    gap_400_++;
    return 1;
  }
  return 0;
}

/* 0 when every answer of the round is what the contract allows. */
static int round_check(const round_log *l, const round_log *ref, uint64_t n, unsigned *codes) {
  int bad = 0;
  for (int i = 0; i < N_REQ; i++) {
    const http_resp *r = &l->resp[i], *w = &ref->resp[i];
    const char *why = NULL;
    int same = r->status == w->status &&
               (i == REQ_METRICS || (r->body_len == w->body_len &&
                                     !memcmp(r->body, w->body, r->body_len)));
    int dropped = r->status < 0 && r->raw_len == 0;
    /* The connection's own setup: its first allocation, or (persistent) a
     * failure already on before it. */
    int in_setup = l->hit[i] && (n == l->first[i] || (sched_.persistent && n < l->first[i]));
    if (dropped && in_setup)
      ;
    else if (known_gap(r, l->hit[i]))
      printf("# N=%llu: %s: server gap: %s\n", (unsigned long long)n, reqs_[i].name,
             dropped ? "connection closed without an answer" : "400 for out of memory");
    else if (r->status < 0 && r->problem)
      why = r->problem;
    else if (dropped)
      why = "connection dropped (the failure was not in its setup)";
    else if (r->status >= 0 && r->problem)
      why = r->problem;
    else if (r->status >= 0 && !l->hit[i] && !same)
      why = "answer differs from the normal one, though no allocation of it failed";
    else if (r->status >= 0 && l->hit[i] && !same) {
      if (r->status != 500 && r->status != 503 && r->status != 507)
        why = "status is not 500, 503 or 507";
      else if (r->status == 503 && !r->retry_after)
        why = "503 without Retry-After";
      else if (r->body_len < 10 || memcmp(r->body, "{\"error\":", 9) != 0)
        why = "error body is not {\"error\": ...}";
    }
    if (r->status >= 500 && r->status < 600)
      codes[r->status - 500]++;
    else if (r->status < 0)
      codes[99]++;
    if (getenv("ES_OOM_VERBOSE") && l->hit[i])
      printf("# N=%llu: %s: %d %.200s\n", (unsigned long long)n, reqs_[i].name, r->status,
             r->body ? r->body : "");
    if (why) {
      printf("# N=%llu: %s (%s %s): %d: %s: %.200s\n", (unsigned long long)n, reqs_[i].name,
             reqs_[i].method, reqs_[i].path, r->status, why, r->body ? r->body : "");
      bad = 1;
    }
  }
  return bad;
}

static void test_requests(void **state) {
  (void)state;
  if (!have_models_) {
    printf("# models or photos not fetched (%s, %s): skipped\n", model_dir_, image_dir_);
    skip();
  }
  oom_snapshot before = oom_snap();
  es_server_config sc;
  server_config(&sc);
  es_server *s = NULL;
  ES_CHECK_RC(es_server_create(&sc, &s));
  es_server_config_fini(&sc);
  int port = 0;
  ES_CHECK_RC(es_server_port(s, &port));

  /* Two normal rounds: the first makes the plans and pools a round needs
   * and is the reference; after the second, what the server holds is the
   * level every round must come back to. */
  round_log ref = {0}, l = {0};
  round_run(port, &ref);
  for (int i = 0; i < N_REQ; i++)
    if (ref.resp[i].status != 200 || ref.resp[i].problem)
      fail_msg("%s: normal request: %d %s: %.300s", reqs_[i].name, ref.resp[i].status,
               ref.resp[i].problem ? ref.resp[i].problem : "", ref.resp[i].body);
  round_run(port, &l);
  round_free(&l);
  oom_snapshot steady = quiesce();

  oom_count_begin(&sched_);
  round_run(port, &l);
  assert_int_equal(oom_count_end(&sched_), 0);
  unsigned codes[100] = {0};
  assert_int_equal(round_check(&l, &ref, 0, codes), 0);
  round_free(&l);
  if (settle(&steady) < 0)
    assert_int_equal(oom_baseline_diff(&steady, "normal round", 0), 0);
  printf("# a round: %llu allocations, %u call stacks\n", (unsigned long long)sched_.calls,
         sched_.sites);

  int bad = 0;
  unsigned attempts = 0;
  for (uint64_t n = sched_.trace_n ? sched_.trace_n : 1;; n++) {
    if (!sched_.trace_n && !oom_sched_takes(&sched_, n))
      continue;
    oom_arm(&sched_, n);
    round_run(port, &l);
    es_mem_fault_disarm();
    uint64_t injected = oom_injected();
    bad |= round_check(&l, &ref, n, codes);
    round_free(&l);
    if (settle(&steady) < 0 && oom_baseline_diff(&steady, "round", n))
      bad = 1;
    if (injected == 0)
      break;
    attempts++;
    if (sched_.trace_n)
      break;
  }
  printf("# %u rounds with a failure: answers 500: %u, 503: %u, 507: %u, dropped: %u; "
         "server gaps (fail unless ES_OOM_SERVER_STRICT=0): %u closed without an answer, "
         "%u 400 for out of memory\n",
         attempts, codes[0], codes[3], codes[7], codes[99], gap_dropped_, gap_400_);
  round_free(&ref);
  es_server_report rep;
  ES_CHECK_RC(es_server_shutdown(s, 1000, &rep));
  es_server_destroy(s);
  if (oom_baseline_diff(&before, "after es_server_destroy", 0))
    bad = 1;
  assert_int_equal(bad, 0);
}

/* ---- es_server_create under failure ----------------------------------------------- */

static void test_create(void **state) {
  (void)state;
  if (!have_models_) {
    printf("# models not fetched (%s): skipped\n", model_dir_);
    skip();
  }
  char cfg_path[2100];
  snprintf(cfg_path, sizeof cfg_path, "%s/create.json", tmp_dir_);
  FILE *f = fopen(cfg_path, "w");
  assert_non_null(f);
  fprintf(f,
          "{\"workers\": 1, \"pin\": 0, \"watch_ms\": 0, \"quiet\": 1, \"port\": 0,"
          " \"models\": {\"front\": {\"path\": \"%s/blazeface_front_128.onnx\"},"
          "              \"faces\": {\"pipeline\": \"face\", \"model\": \"front\"}}}\n",
          model_dir_);
  fclose(f);

  es_server_config sc;
  server_config(&sc);
  sc.use_default_models = 0;
  ES_CHECK_RC(es_server_config_load(&sc, cfg_path));
  es_server *s = NULL;
  ES_CHECK_RC(es_server_create(&sc, &s)); /* once: what a process makes once */
  es_server_destroy(s);
  oom_snapshot base = oom_snap();
  oom_count_begin(&sched_);
  ES_CHECK_RC(es_server_create(&sc, &s));
  es_server_destroy(s);
  assert_int_equal(oom_count_end(&sched_), 0);
  assert_int_equal(oom_baseline_diff(&base, "create", 0), 0);
  printf("# es_server_create: %llu allocations, %u call stacks\n",
         (unsigned long long)sched_.calls, sched_.sites);

  int bad = 0;
  unsigned attempts = 0, errors = 0;
  for (uint64_t n = sched_.trace_n ? sched_.trace_n : 1;; n++) {
    if (!sched_.trace_n && !oom_sched_takes(&sched_, n))
      continue;
    es__fail(ES_EINVAL, "sentinel: no detail was set");
    s = NULL;
    oom_arm(&sched_, n);
    int rc = es_server_create(&sc, &s);
    es_mem_fault_disarm();
    uint64_t injected = oom_injected();
    const char *detail = es_last_error_detail();
    if (rc < 0) {
      errors++;
      if (!strcmp(es_err_name(rc), "ES_UNKNOWN") || !detail[0] ||
          !strcmp(detail, "sentinel: no detail was set")) {
        printf("# create, N=%llu: %d %s, detail \"%s\"\n", (unsigned long long)n, rc,
               es_err_name(rc), detail);
        bad = 1;
      }
    } else {
      es_server_destroy(s);
    }
    if (oom_baseline_diff(&base, "create", n))
      bad = 1;
    if (injected == 0) {
      if (rc < 0) {
        printf("# create, N=%llu (nothing failed): %s: %s\n", (unsigned long long)n,
               es_err_name(rc), detail);
        bad = 1;
      }
      break;
    }
    attempts++;
    if (sched_.trace_n)
      break;
  }
  es_server_config_fini(&sc);
  printf("# %u creates with a failure: %u errors, %u servers started\n", attempts, errors,
         attempts - errors);
  assert_int_equal(bad, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_create),
      cmocka_unit_test(test_requests),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
