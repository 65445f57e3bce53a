/* libFuzzer target: the server's request layer (routes, headers, query and
 * body parameters) and its HTTP core, on a real server with a real model.
 *
 * The input's first byte picks the way in:
 *   even: straight to the request layer (es__srv_handle). The rest is split
 *         at '\n' into method, URL, Content-Type, Origin, Host,
 *         Authorization and Inference-Header-Content-Length (an empty line:
 *         header absent); what follows the seventh '\n' is the body.
 *   odd:  the rest is written as it is to a loopback socket of the server;
 *         what comes back within 100 ms of quiet starts with a status line;
 *         then the client closes. (The HTTP library notices a client's
 *         half-close only at its next read, so the client closes fully.)
 * Checks on every input, beyond "no crash, no leak":
 *   - the status is one the server uses; an error's body is JSON with an
 *     "error" string; 429 and 503 carry Retry-After, 405 carries Allow;
 *   - an answer that is still being computed wakes exactly once;
 *   - the server tag's byte count comes back to where it was (for the socket
 *     way, once the server has seen the close: at once, or when a phase's
 *     time limit, 2 s here, ends the connection), so no connection is held.
 * The server serves blazeface_front (128x128) and the face pipeline on it,
 * found in $ES_MODEL_DIR or .cache/models; repository control is off, as it
 * is by default.
 *
 *   build with -DES_FUZZ=ON (clang), then: fuzz_http_request -max_total_time=60 CORPUS */
#define _GNU_SOURCE 1 /* usleep, clock_gettime */
#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/internal.h"
#include "edgeserve/memory.h"
#include "edgeserve/server.h"
#include "server/server_internal.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static es_server *g_srv;
static int g_port;

typedef struct waiter {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int woken;
} waiter;

static void wake(void *user) {
  waiter *w = user;
  pthread_mutex_lock(&w->mu);
  w->woken++;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

static size_t server_bytes(void) {
  es_mem_stats s;
  es_mem_stats_get(ES_MEM_SERVER, &s);
  return s.current;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  const char *dir = getenv("ES_MODEL_DIR");
  char models[4096];
  snprintf(models, sizeof models,
           "{\"blazeface_front\": {\"path\": \"%s/blazeface_front_128.onnx\"},"
           " \"face\": {\"pipeline\": \"face\", \"model\": \"blazeface_front\"}}",
           dir ? dir : ".cache/models");
  es_server_config cfg;
  es_server_config_default(&cfg);
  cfg.port = 0;
  cfg.quiet = 1;
  cfg.runtime.workers = 1;
  cfg.runtime.watch_ms = 0;
  cfg.runtime.memory_budget_bytes = (size_t)256 << 20;
  cfg.max_body_bytes = (size_t)1 << 20;
  cfg.header_timeout_s = 2;
  cfg.body_timeout_s = 2;
  cfg.idle_timeout_s = 2;
  cfg.models_json = es_mem_strdup(ES_MEM_SERVER, models);
  snprintf(cfg.models_base, sizeof cfg.models_base, ".");
  if (es_server_create(&cfg, &g_srv) < 0) {
    fprintf(stderr, "fuzz_http_request: cannot start the server: %s\n", es_last_error_detail());
    abort();
  }
  es_server_config_fini(&cfg);
  es_server_port(g_srv, &g_port);
  return 0;
}

static void check_answer(const srv_resp *r) {
  static const unsigned ok[] = {200, 400, 401, 403, 404, 405, 409, 413, 415, 429, 500, 503};
  int known = 0;
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
    known |= r->status == ok[i];
  if (!known) {
    fprintf(stderr, "unexpected status %u\n", r->status);
    abort();
  }
  if ((r->status == 429 || r->status == 503) && !r->retry_after_ms)
    abort();
  if (r->status == 405 && !r->allow)
    abort();
  if (r->status >= 400 && r->status != 500) {
    json_error_t e;
    json_t *j = json_loadb(r->body, r->len, 0, &e);
    if (!j || !json_is_string(json_object_get(j, "error"))) {
      fprintf(stderr, "error body is not {\"error\": ...}: %.*s\n", (int)r->len, r->body);
      abort();
    }
    json_decref(j);
  }
}

/* The request layer, directly. */
static void direct(const uint8_t *data, size_t size) {
  const char *field[7] = {0};
  char *copy = malloc(size + 1);
  memcpy(copy, data, size);
  copy[size] = 0;
  size_t pos = 0;
  int n = 0;
  while (n < 7) {
    char *nl = memchr(copy + pos, '\n', size - pos);
    if (!nl)
      break;
    *nl = 0;
    field[n++] = copy + pos;
    pos = (size_t)(nl - copy) + 1;
  }
  if (n < 2) {
    free(copy);
    return;
  }
  srv_req rq = {.method = field[0], .url = field[1]};
  const char **hdr[5] = {&rq.content_type, &rq.origin, &rq.host, &rq.authorization,
                         &rq.header_len};
  for (int i = 0; i < 5; i++)
    *hdr[i] = n > 2 + i && field[2 + i][0] ? field[2 + i] : NULL;
  /* The body in its own block, so ASan sees a read past it. */
  size_t blen = n == 7 ? size - pos : 0;
  char *body = malloc(blen ? blen : 1);
  memcpy(body, copy + pos, blen);
  rq.body = blen ? body : NULL;
  rq.len = blen;
  waiter w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
  srv_job *job = NULL;
  srv_resp r;
  if (es__srv_handle(g_srv, &rq, wake, &w, &job, &r) == 1) {
    pthread_mutex_lock(&w.mu);
    while (!w.woken)
      pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    es__srv_job_answer(g_srv, job, &r);
    usleep(1000);
    if (w.woken != 1)
      abort(); /* woken more than once */
  }
  check_answer(&r);
  es__srv_resp_free(&r);
  free(body);
  free(copy);
}

/* connect(2), finished when a signal interrupts it: libFuzzer's unit timer
 * raises SIGALRM every few seconds without SA_RESTART, and a connect that
 * had to sleep (a loaded machine defers loopback's handshake) then fails
 * with EINTR while the handshake goes on. Any other failure is the server's
 * and is reported. */
static int connect_loopback(int fd, const struct sockaddr_in *a) {
  if (connect(fd, (const struct sockaddr *)a, sizeof *a) == 0)
    return 0;
  if (errno == EINTR) {
    struct pollfd p = {fd, POLLOUT, 0};
    int r;
    do
      r = poll(&p, 1, 10000);
    while (r < 0 && errno == EINTR);
    int err = r == 1 ? 0 : ETIMEDOUT;
    socklen_t len = sizeof err;
    if (r == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
      err = errno;
    if (!err)
      return 0;
    errno = err;
  }
  fprintf(stderr, "connect to the server: %s\n", strerror(errno));
  return -1;
}

/* Bytes on a socket: read what comes back until 100 ms of quiet, close. */
static void raw(const uint8_t *data, size_t size) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) {
    fprintf(stderr, "socket: %s\n", strerror(errno));
    abort();
  }
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)g_port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect_loopback(fd, &a) < 0)
    abort();
  size_t off = 0;
  while (off < size) {
    ssize_t w = send(fd, data + off, size - off, MSG_NOSIGNAL);
    if (w <= 0)
      break; /* the server may close early (a bad request) */
    off += (size_t)w;
  }
  char buf[4096];
  size_t got = 0;
  struct pollfd p = {fd, POLLIN, 0};
  while (poll(&p, 1, 100) == 1) {
    ssize_t r = recv(fd, buf + got, sizeof buf - 1 - got, 0);
    if (r <= 0)
      break;
    got += (size_t)r;
    if (got == sizeof buf - 1)
      got = 16; /* keep the status line, drain the rest */
  }
  close(fd);
  if (got >= 7 && strncmp(buf, "HTTP/1.", 7)) {
    fprintf(stderr, "answer does not start with a status line\n");
    abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  size_t before = server_bytes();
  if (data[0] & 1) {
    raw(data + 1, size - 1);
    for (int i = 0; i < 4000 && server_bytes() != before; i++)
      usleep(1000);
  } else {
    direct(data + 1, size - 1);
  }
  if (server_bytes() != before) {
    fprintf(stderr, "server bytes %zu -> %zu\n", before, server_bytes());
    abort();
  }
  return 0;
}
