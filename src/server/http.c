/* The HTTP core: libmicrohttpd, event-driven, on a small pool of threads.
 *
 * Connections live in epoll sets served by http_threads threads (default
 * 2), not a thread each: a held or slow connection costs its socket, the
 * library's per-connection buffer (max_header_bytes + read_buffer_bytes,
 * 16 + 32 KiB by default) and a few
 * hundred bytes here, so thousands fit (max_connections, default 4096, at
 * most max_connections_per_client, default 256, from one address). A
 * request that waits for the runtime is suspended (MHD_suspend_connection)
 * and resumed by the runtime's completion callback; its connection thread
 * goes on serving the others meanwhile.
 *
 * Time limits, one per phase of a connection, enforced by a sweeper thread
 * that shuts the socket down (the library then closes it on its own
 * thread):
 *   idle     no request started (before the first, between keep-alive
 *            requests): idle_timeout_s (default 30)
 *   headers  from the request line to the end of the headers:
 *            header_timeout_s (default 10), however slowly they trickle
 *   body     from the end of the headers to the end of the body:
 *            body_timeout_s (default 60)
 * A request waiting for its answer has no limit here (the runtime's
 * deadlines and admission bound it); a response being sent is bounded by
 * the library's inactivity timeout (idle_timeout_s).
 *
 * Memory: a body is charged to a server-wide budget (max_buffered_bytes),
 * never from the announced Content-Length alone, so a client that
 * announces 64 MiB and sends a byte every few seconds holds a few bytes,
 * not the budget. A body that could never be held (announced above
 * min(max_body_bytes, max_buffered_bytes)) is refused at once with 413.
 * The first 64 KiB are charged as they arrive. A body with a
 * Content-Length that outgrows them reserves all of it at once, all or
 * nothing: when the budget cannot take it, the body is refused there and
 * its buffer freed. Why not grow by doubling all the way: many uploads at
 * once would each hold a part of the budget and refuse each other's next
 * growth until none could finish (24 clients of 4.9 MB bodies against
 * 16 MiB got no answer but 503). Now an upload holds either at most 64 KiB
 * or its whole reservation, and a reservation always completes. A body
 * without a Content-Length (chunked) grows by doubling. The buffer is
 * counted under ES_MEM_SERVER and freed as soon as the answer is queued.
 * An answer's bytes are charged the same way until they are sent (see
 * sent_free). A body announced when the budget cannot take it is refused
 * with 503 before any of it is read (a client that sent "Expect:
 * 100-continue" never sends it); one refused mid-body has the rest read
 * and dropped and gets 503 with Retry-After: refusing mid-upload makes
 * most clients see a reset instead.
 *
 * The routes, the codec and the runtime are behind es__srv_handle
 * (handler.c), which sees a complete request and no socket. */
#include "common/internal.h"
#include "server/codec.h"
#include "server/server_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

enum { PH_IDLE = 0, PH_HEADERS, PH_BODY, PH_WORK, PH_SEND, PH_CLOSING };
enum { WAIT_RUNNING = 0, WAIT_SUSPENDED, WAIT_DONE };

/* One per socket (the library's socket context), on the sweeper's list. */
typedef struct srv_conn {
  struct srv_conn *prev, *next;
  int fd;
  int phase;
  uint64_t since_ns;
  struct conn *pending;      /* request begun, not yet seen by the handler */
} srv_conn;

/* One per request (the library's con_cls). */
typedef struct conn {
  es_server *s;
  srv_conn *sc;
  struct MHD_Connection *c;
  int started;               /* the handler has seen it */
  char *block;               /* the buffer; the body starts pad bytes in */
  size_t pad, len, cap;
  size_t charged;            /* bytes charged to the buffered budget */
  size_t announced;          /* Content-Length, 0 when there is none */
  size_t header_len;         /* Inference-Header-Content-Length, for the
                                alignment of the tensor bytes after it */
  int reject;                /* HTTP status decided before the body was read */
  char reject_msg[160];
  uint64_t start_ns;
  srv_job *job;
  _Atomic int wait;          /* WAIT_*: the job's handshake with its wake */
} conn;

static void phase_set(es_server *s, srv_conn *sc, int phase) {
  if (!sc)
    return;
  pthread_mutex_lock(&s->conn_mu);
  if (sc->phase != PH_CLOSING) {
    sc->phase = phase;
    sc->since_ns = es__now_ns();
  }
  pthread_mutex_unlock(&s->conn_mu);
}

static int charge(es_server *s, size_t n) {
  size_t cur = atomic_load(&s->buffered);
  do {
    if (cur + n > s->cfg.max_buffered_bytes || cur + n < cur)
      return -1;
  } while (!atomic_compare_exchange_weak(&s->buffered, &cur, cur + n));
  return 0;
}

static void uncharge(es_server *s, size_t n) { atomic_fetch_sub(&s->buffered, n); }

/* An answer being sent: its bytes are charged like a body's until the
 * library has sent them and frees it, so clients that ask and never read
 * hold the buffered budget (new bodies then get 503), not memory outside
 * it. The charge is forced: the work is done and its answer is not thrown
 * away; it replaces the body's larger or similar charge, and the budget
 * refuses new bodies until answers drain. */
typedef struct sent {
  es_server *s;
  void *body;
  size_t len;
} sent;

static void sent_free(void *cls) {
  sent *t = cls;
  uncharge(t->s, t->len);
  es_mem_free(t->body);
  es_mem_free(t);
}

static conn *conn_new(es_server *s, struct MHD_Connection *c) {
  conn *k = es_mem_calloc(ES_MEM_SERVER, 1, sizeof *k);
  if (!k)
    return NULL;
  k->s = s;
  k->c = c;
  k->start_ns = es__now_ns();
  return k;
}

/* Free the body and give its charge back (refused, or answered). */
static void body_release(es_server *s, conn *k) {
  es_mem_free(k->block);
  k->block = NULL;
  k->len = k->cap = k->pad = 0;
  if (k->charged)
    uncharge(s, k->charged);
  k->charged = 0;
}

static void conn_free(es_server *s, conn *k) {
  if (k->job)
    es__srv_job_free(k->job); /* answered or never woken: not running */
  body_release(s, k);
  if (k->started)
    atomic_fetch_sub(&s->active, 1);
  es_mem_free(k);
}

/* ---- connection and request lifecycle ----------------------------------------- */

/* Once the server drains, a new connection is closed as it is accepted
 * ("no new connections"). Not MHD_quiesce_daemon: with a pool of epoll
 * threads, it takes the listening socket out of each thread's epoll set
 * while each thread, seeing it quiesced, may do the same; the second
 * removal fails and libmicrohttpd aborts the process ("Failed to remove
 * listen FD from epoll set", seen once in a test whose server shut down
 * as it started). It also hands the socket to the caller to close. */
static enum MHD_Result accept_policy(void *cls, const struct sockaddr *addr, socklen_t len) {
  (void)addr;
  (void)len;
  es_server *s = cls;
  return atomic_load(&s->stopping) ? MHD_NO : MHD_YES;
}

/* With the runtime's real-time scheduling (rt_priority N), the HTTP threads
 * run as SCHED_FIFO threads of priority N-1: they bring urgent requests in
 * and take their answers out, and at ordinary priority each of those steps
 * waited for a core behind the workers' low-priority runs. One below the
 * urgent runs, so that such a run goes first on a shared core. The library
 * starts its threads; each sets itself at its first connection, once (a
 * refusal leaves it as it was: the runtime's start proved the right). */
static _Thread_local int http_sched_set;

static void http_thread_sched(const es_server *s) {
  int p = s->cfg.runtime.rt_priority - 1;
  if (http_sched_set || p < 1)
    return;
  http_sched_set = 1;
  struct sched_param sp = {.sched_priority = p};
  (void)pthread_setschedparam(pthread_self(), SCHED_FIFO, &sp);
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
  es_server *s = cls;
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    http_thread_sched(s);
    srv_conn *sc = es_mem_calloc(ES_MEM_SERVER, 1, sizeof *sc);
    *socket_context = sc;
    if (!sc)
      return; /* untracked: the library's own inactivity timeout still applies */
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    sc->fd = ci ? ci->connect_fd : -1;
    sc->phase = PH_IDLE;
    sc->since_ns = es__now_ns();
    pthread_mutex_lock(&s->conn_mu);
    sc->next = s->conns;
    if (s->conns)
      s->conns->prev = sc;
    s->conns = sc;
    s->n_conns++;
    pthread_mutex_unlock(&s->conn_mu);
    atomic_fetch_add(&s->conns_total, 1);
    return;
  }
  srv_conn *sc = *socket_context;
  if (!sc)
    return;
  /* Closed: the library closes the socket after this returns, so the
   * sweeper never shuts down a descriptor number already reused. */
  pthread_mutex_lock(&s->conn_mu);
  if (sc->prev)
    sc->prev->next = sc->next;
  else
    s->conns = sc->next;
  if (sc->next)
    sc->next->prev = sc->prev;
  s->n_conns--;
  pthread_mutex_unlock(&s->conn_mu);
  if (sc->pending) /* a request line whose headers never completed */
    conn_free(s, sc->pending);
  es_mem_free(sc);
  *socket_context = NULL;
}

static srv_conn *socket_of(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return ci ? ci->socket_context : NULL;
}

/* The request line has arrived: the headers phase begins. What is returned
 * becomes the request's con_cls. */
static void *on_request_line(void *cls, const char *uri, struct MHD_Connection *c) {
  (void)uri;
  es_server *s = cls;
  srv_conn *sc = socket_of(c);
  conn *k = conn_new(s, c);
  if (k) {
    k->sc = sc;
    if (sc) {
      if (sc->pending)
        conn_free(s, sc->pending);
      sc->pending = k;
    }
  }
  phase_set(s, sc, PH_HEADERS);
  return k;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
  (void)toe;
  es_server *s = cls;
  conn *k = *con_cls;
  srv_conn *sc = k ? k->sc : socket_of(c);
  if (k) {
    if (sc && sc->pending == k)
      sc->pending = NULL;
    conn_free(s, k);
  }
  *con_cls = NULL;
  phase_set(s, sc, PH_IDLE);
}

/* ---- answers ---------------------------------------------------------------------- */

/* Writes s with control characters, backslashes and bytes above 0x7e as
 * \xNN: the URL arrives percent-decoded, so a %0a in it would otherwise
 * start a forged line of the access log. */
static void log_escaped(FILE *f, const char *s) {
  for (const unsigned char *p = (const unsigned char *)s; *p; p++)
    if (*p < 0x20 || *p > 0x7e || *p == '\\')
      fprintf(f, "\\x%02x", *p);
    else
      fputc(*p, f);
}

/* One access-log line: method, URL, status, time taken. */
static void log_request(const char *method, const char *url, unsigned status, uint64_t ns) {
  flockfile(stderr);
  log_escaped(stderr, method);
  fputc(' ', stderr);
  log_escaped(stderr, url);
  fprintf(stderr, " %u %.2f ms\n", status, (double)ns / 1e6);
  funlockfile(stderr);
}

static enum MHD_Result send_resp(es_server *s, struct MHD_Connection *c, conn *k, srv_resp *r,
                                 const char *method, const char *url) {
  /* No body: the answer itself could not be allocated (a 503). */
  static const char oom_body[] = "{\"error\":\"the server is out of memory for this answer\"}";
  sent *t = NULL;
  if (r->body) {
    t = es_mem_alloc(ES_MEM_SERVER, sizeof *t);
    if (!t) { /* the answer cannot be kept: say so instead */
      es__srv_resp_free(r);
      r->status = 503;
      r->ctype = NULL;
      r->header_len = 0;
      r->retry_after_ms = es__srv_retry_after_ms(503, ES_ENOMEM, 0);
    } else {
      *t = (sent){s, r->body, r->len};
    }
  }
  struct MHD_Response *m =
      t ? MHD_create_response_from_buffer_with_free_callback_cls(r->len, r->body, sent_free, t)
        : MHD_create_response_from_buffer(sizeof oom_body - 1, (void *)oom_body,
                                          MHD_RESPMEM_PERSISTENT);
  if (!m) {
    es_mem_free(t);
    es__srv_resp_free(r);
    return MHD_NO;
  }
  if (t)
    atomic_fetch_add(&s->buffered, t->len); /* given back by sent_free */
  r->body = NULL; /* the response owns it now */
  MHD_add_response_header(m, "Content-Type", r->ctype ? r->ctype : "application/json");
  char buf[32];
  if (r->header_len) {
    snprintf(buf, sizeof buf, "%zu", r->header_len);
    MHD_add_response_header(m, "Inference-Header-Content-Length", buf);
  }
  if (r->retry_after_ms) {
    snprintf(buf, sizeof buf, "%u", (r->retry_after_ms + 999) / 1000);
    MHD_add_response_header(m, "Retry-After", buf);
  }
  if (r->allow)
    MHD_add_response_header(m, "Allow", r->allow);
  if (r->want_auth)
    MHD_add_response_header(m, "WWW-Authenticate", "Bearer realm=\"edgeserve\"");
  enum MHD_Result ok = MHD_queue_response(c, r->status, m);
  MHD_destroy_response(m);
  atomic_fetch_add(&s->served, 1);
  if (k) {
    body_release(s, k); /* the answer is made: the inputs are not needed */
    phase_set(s, k->sc, PH_SEND);
    if (!s->cfg.quiet)
      log_request(method, url, r->status, es__now_ns() - k->start_ns);
  }
  return ok;
}

static enum MHD_Result send_reject(es_server *s, struct MHD_Connection *c, conn *k,
                                   const char *method, const char *url) {
  int i = k->reject == 413 ? SRV_REJECT_TOO_LARGE
          : k->reject == 503 ? SRV_REJECT_BUFFERED
                             : SRV_REJECT_BAD;
  atomic_fetch_add(&s->rejected[i], 1);
  srv_resp r;
  memset(&r, 0, sizeof r);
  size_t len = 0;
  r.body = es__v2_error_body(k->reject_msg, &len);
  r.len = len;
  r.status = r.body ? (unsigned)k->reject : 503;
  r.retry_after_ms = es__srv_retry_after_ms(r.status, r.body ? 0 : ES_ENOMEM, 0);
  return send_resp(s, c, k, &r, method, url);
}

/* The job's wake (a runtime or pipeline thread): the answer can be made.
 * Resumes the connection unless the handler has not suspended it yet, in
 * which case the handler sees WAIT_DONE and answers at once. */
static void on_wake(void *user) {
  conn *k = user;
  if (atomic_exchange(&k->wait, WAIT_DONE) == WAIT_SUSPENDED)
    MHD_resume_connection(k->c);
}

static enum MHD_Result answer_job(es_server *s, struct MHD_Connection *c, conn *k,
                                  const char *method, const char *url) {
  srv_resp r;
  srv_job *j = k->job;
  k->job = NULL;
  es__srv_job_answer(s, j, &r);
  return send_resp(s, c, k, &r, method, url);
}

/* ---- the body ----------------------------------------------------------------------- */

static size_t body_limit(const es_server *s) {
  return s->cfg.max_body_bytes < s->cfg.max_buffered_bytes ? s->cfg.max_body_bytes
                                                           : s->cfg.max_buffered_bytes;
}

/* Refuse the request; what was buffered is freed (the rest is dropped). */
static void reject(es_server *s, conn *k, int status, const char *msg) {
  k->reject = status;
  snprintf(k->reject_msg, sizeof k->reject_msg, "%s", msg);
  body_release(s, k);
}

/* The first bytes of a body are charged as they arrive; past them a body
 * with a Content-Length reserves the whole of it (the note at the top). */
#define BODY_FIRST_BYTES ((size_t)64 << 10)

/* The headers are in: decide what can be decided before any body byte. */
static void on_headers(es_server *s, struct MHD_Connection *c, conn *k) {
  /* From here the request counts as in flight (shutdown waits for it); a
   * request line whose headers never complete does not. */
  k->started = 1;
  atomic_fetch_add(&s->active, 1);
  if (k->sc && k->sc->pending == k)
    k->sc->pending = NULL;
  phase_set(s, k->sc, PH_BODY);
  const char *hl =
      MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Inference-Header-Content-Length");
  k->header_len = hl ? (size_t)strtoull(hl, NULL, 10) : 0;
  const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
  if (!cl)
    return;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(cl, &end, 10);
  if (errno || end == cl || *end) {
    reject(s, k, 400, "bad Content-Length");
  } else if (v > body_limit(s)) {
    char msg[160];
    snprintf(msg, sizeof msg, "body of %llu bytes is over the limit of %zu", v, body_limit(s));
    reject(s, k, 413, msg);
  } else {
    k->announced = (size_t)v;
    /* Would its reservation fail now? Then say so before the client sends
     * it (a hint only: the reservation itself is made when the bytes come). */
    if (k->announced > BODY_FIRST_BYTES &&
        atomic_load(&s->buffered) + k->announced > s->cfg.max_buffered_bytes)
      reject(s, k, 503, "too many request bytes in flight");
  }
}

/* Append n bytes of body, growing the buffer (and its charge) as they come. */
static void body_append(es_server *s, conn *k, const char *data, size_t n) {
  if (k->reject)
    return; /* read and dropped */
  size_t want = k->len + n;
  size_t limit = k->announced ? k->announced : body_limit(s);
  if (want > limit || want < n) {
    char msg[160];
    if (k->announced)
      snprintf(msg, sizeof msg, "body longer than its Content-Length of %zu bytes", limit);
    else
      snprintf(msg, sizeof msg, "body over the limit of %zu bytes", limit);
    reject(s, k, k->announced ? 400 : 413, msg);
    return;
  }
  if (want > k->cap) {
    size_t cap;
    if (want <= BODY_FIRST_BYTES)
      cap = BODY_FIRST_BYTES;
    else if (k->announced)
      cap = k->announced; /* all of it, once */
    else
      cap = k->cap * 2 > want ? k->cap * 2 : want;
    if (cap > limit)
      cap = limit;
    if (charge(s, cap - k->charged) < 0) {
      reject(s, k, 503, "too many request bytes in flight");
      return;
    }
    /* 64 bytes of slack: the body starts at the offset that puts the
     * tensor bytes after the binary extension's JSON header on a 64-byte
     * boundary, so the codec hands them to the runtime without a copy. */
    char *nb = k->block ? es_mem_realloc(k->block, cap + 64) : es_mem_alloc(ES_MEM_SERVER, cap + 64);
    if (!nb) {
      uncharge(s, cap - k->charged);
      reject(s, k, 503, "no memory for the body");
      return;
    }
    size_t pad = (64 - ((uintptr_t)nb + k->header_len) % 64) % 64;
    if (k->block && pad != k->pad)
      memmove(nb + pad, nb + k->pad, k->len);
    k->block = nb;
    k->pad = pad;
    k->charged = cap;
    k->cap = cap;
  }
  memcpy(k->block + k->pad + k->len, data, n);
  k->len = want;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **con_cls) {
  (void)version;
  es_server *s = cls;
  conn *k = *con_cls;
  if (!k) { /* the request-line callback could not allocate */
    k = conn_new(s, c);
    if (!k)
      return MHD_NO;
    k->sc = socket_of(c);
    *con_cls = k;
  }
  if (!k->started) {
    on_headers(s, c, k);
    /* Refused before the body is read (clients that send "Expect:
     * 100-continue" then never send it). */
    if (k->reject)
      return send_reject(s, c, k, method, url);
    return MHD_YES;
  }
  if (*upload_size) {
    body_append(s, k, upload, *upload_size);
    *upload_size = 0;
    return MHD_YES;
  }
  if (k->job) { /* resumed: the answer is ready */
    return answer_job(s, c, k, method, url);
  }
  if (k->reject)
    return send_reject(s, c, k, method, url);

  srv_req rq = {
      .method = method,
      .url = url,
      .content_type = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type"),
      .origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin"),
      .host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host"),
      .authorization = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"),
      .header_len =
          MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Inference-Header-Content-Length"),
      .body = k->block ? k->block + k->pad : NULL,
      .len = k->len,
  };
  srv_resp r;
  srv_job *job = NULL;
  atomic_store(&k->wait, WAIT_RUNNING);
  if (es__srv_handle(s, &rq, on_wake, k, &job, &r) == 0)
    return send_resp(s, c, k, &r, method, url);
  /* Running: suspend until the wake, unless it came already. */
  k->job = job;
  phase_set(s, k->sc, PH_WORK);
  MHD_suspend_connection(c);
  int expect = WAIT_RUNNING;
  if (!atomic_compare_exchange_strong(&k->wait, &expect, WAIT_SUSPENDED))
    MHD_resume_connection(c); /* done meanwhile: the handler runs again */
  return MHD_YES;
}

/* ---- the sweeper -------------------------------------------------------------------- */

static void *sweeper(void *arg) {
  es_server *s = arg;
  const uint64_t sec = 1000000000ull;
  uint64_t limit[PH_CLOSING] = {0};
  limit[PH_IDLE] = (uint64_t)s->cfg.idle_timeout_s * sec;
  limit[PH_HEADERS] = (uint64_t)s->cfg.header_timeout_s * sec;
  limit[PH_BODY] = (uint64_t)s->cfg.body_timeout_s * sec;
  pthread_mutex_lock(&s->conn_mu);
  while (!s->sweeper_stop) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += 200 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&s->sweeper_cv, &s->conn_mu, &ts);
    uint64_t now = es__now_ns();
    for (srv_conn *sc = s->conns; sc; sc = sc->next) {
      if (sc->phase >= PH_WORK || !limit[sc->phase] || sc->fd < 0 ||
          now - sc->since_ns <= limit[sc->phase])
        continue;
      atomic_fetch_add(&s->timeouts[sc->phase], 1);
      sc->phase = PH_CLOSING;
      shutdown(sc->fd, SHUT_RDWR); /* the library sees it and closes */
    }
  }
  pthread_mutex_unlock(&s->conn_mu);
  return NULL;
}

/* ---- lifecycle ------------------------------------------------------------------ */

int es__srv_start_http(es_server *s) {
  struct sockaddr_in addr;
  memset(&addr, 0, sizeof addr);
  addr.sin_family = AF_INET;
  addr.sin_port = htons((uint16_t)s->cfg.port);
  if (inet_pton(AF_INET, s->cfg.host, &addr.sin_addr) != 1)
    return es__fail(ES_EINVAL, "host '%s' is not an IPv4 address", s->cfg.host);
  size_t rb = s->cfg.read_buffer_bytes;
  if (rb && (rb < ((size_t)4 << 10) || rb > ((size_t)16 << 20)))
    return es__fail(ES_EINVAL, "read_buffer_bytes %zu is outside 4 KiB to 16 MiB", rb);
  pthread_mutex_init(&s->conn_mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&s->sweeper_cv, &ca);
  pthread_condattr_destroy(&ca);
  int rc = es__srv_pipelines_start(s);
  if (rc < 0)
    return rc;
  unsigned threads = s->cfg.http_threads ? s->cfg.http_threads : 2;
  /* Connections beyond the descriptors left would fail at accept, after
   * the library counted them: keep the limit where it holds (the model
   * files, the pipes and the runtime take a few dozen). */
  struct rlimit nofile;
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur != RLIM_INFINITY &&
      nofile.rlim_cur > 128 && s->cfg.max_connections > nofile.rlim_cur - 128)
    s->cfg.max_connections = (unsigned)(nofile.rlim_cur - 128);
  s->daemon = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME,
      (uint16_t)s->cfg.port, accept_policy, s, on_request, s, MHD_OPTION_SOCK_ADDR,
      (struct sockaddr *)&addr, MHD_OPTION_THREAD_POOL_SIZE, threads,
      MHD_OPTION_CONNECTION_LIMIT, s->cfg.max_connections, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
      s->cfg.max_connections_per_client, MHD_OPTION_CONNECTION_TIMEOUT, s->cfg.idle_timeout_s,
      /* Headers and the read buffer share this pool, allocated per
       * connection: it bounds what thousands of connections can hold. */
      MHD_OPTION_CONNECTION_MEMORY_LIMIT, SRV_CONN_BUFFER(s->cfg),
      MHD_OPTION_NOTIFY_CONNECTION, on_connection, s, MHD_OPTION_URI_LOG_CALLBACK,
      on_request_line, s, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
      MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u, MHD_OPTION_END);
  if (!s->daemon) {
    es__srv_pipelines_stop(s);
    return es__fail(ES_EIO, "cannot listen on %s:%d (in use, or not allowed)", s->cfg.host,
                    s->cfg.port);
  }
  const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
  s->port = di ? di->port : s->cfg.port;
  if (pthread_create(&s->sweeper_thread, NULL, sweeper, s) != 0) {
    MHD_stop_daemon(s->daemon);
    s->daemon = NULL;
    es__srv_pipelines_stop(s);
    return es__fail(ES_EIO, "cannot start the connection sweeper");
  }
  s->http_started = 1;
  return 0;
}

int es_server_shutdown(es_server *s, int grace_ms, es_server_report *report) {
  if (!s)
    return es__fail(ES_EINVAL, "es_server_shutdown: NULL server");
  es_server_report rep;
  memset(&rep, 0, sizeof rep);
  if (atomic_exchange(&s->stopping, 1)) {
    if (report)
      *report = s->report;
    return 0;
  }
  uint64_t t0 = es__now_ns();
  /* no new connections from here on: accept_policy */
  es_admission_set_draining(es_runtime_admission(s->rt), -1, 1);
  /* Requests count until their response is handed to the connection
   * (on_completed), so none is cut off between its run and its answer. */
  rep.inflight_at_stop = atomic_load(&s->active);
  uint64_t until = t0 + (uint64_t)(grace_ms > 0 ? grace_ms : 0) * 1000000ull;
  while (atomic_load(&s->active) && es__now_ns() < until)
    usleep(2000);
  /* Queued ones leave now, answered 503; running ones finish (runs are not
   * interrupted), and their answers go out before the connections close. */
  rep.cut_off = es__srv_cancel_tracked(s);
  if (s->http_started)
    es__srv_pipelines_stop(s);
  uint64_t last = es__now_ns() + 30ull * 1000000000ull;
  while (atomic_load(&s->active) && es__now_ns() < last)
    usleep(2000);
  if (s->http_started)
    es__srv_control_wait(s); /* loads and unloads finish; their answers went out */
  rep.finished_in_grace =
      rep.inflight_at_stop > rep.cut_off ? rep.inflight_at_stop - rep.cut_off : 0;
  if (s->daemon) {
    MHD_stop_daemon(s->daemon); /* closes the connections, joins the threads */
    s->daemon = NULL;
  }
  if (s->http_started) {
    pthread_mutex_lock(&s->conn_mu);
    s->sweeper_stop = 1;
    pthread_cond_signal(&s->sweeper_cv);
    pthread_mutex_unlock(&s->conn_mu);
    pthread_join(s->sweeper_thread, NULL);
  }
  rep.served = atomic_load(&s->served);
  rep.drain_ms = (double)(es__now_ns() - t0) / 1e6;
  s->report = rep;
  if (report)
    *report = rep;
  return 0;
}

int es_server_port(const es_server *s, int *port) {
  if (!s || !port)
    return es__fail(ES_EINVAL, "es_server_port: NULL argument");
  *port = s->port;
  return 0;
}

es_runtime *es_server_runtime(es_server *s) { return s ? s->rt : NULL; }
