/* es_hostile: the load and attack client of the server's hardening tests
 * (tests/e2e/test_server_hostile.sh) and of the soak run (scripts/soak.sh).
 *
 * One thread, one epoll loop, thousands of non-blocking sockets: a client
 * that cost a thread per connection would measure itself, not the server,
 * on a two-core machine. Every request's bytes are built once at start
 * (binary and JSON tensors, pipeline images) and sent from memory, so the
 * client spends its time on send/recv and the loop's bookkeeping.
 *
 * The server caps connections per source address, so every connection is
 * bound to a source address before connect: connection i of a mode uses
 * base + i / per_addr, walking through 127/8 (all of it is loopback on
 * Linux) and skipping host parts .0 and .255. IP_BIND_ADDRESS_NO_PORT
 * leaves the port to connect, so each address has the whole ephemeral range.
 *
 * Modes (usage() lists the options):
 *   flood   C clients, each in a closed loop of real infer requests for S s;
 *           any status other than 200/429/503, a 429/503 without
 *           Retry-After, a reset or a timeout is a failure.
 *   hold    K idle, slowloris (a header line every T s, never finished) and
 *           trickle (Content-Length 64 MiB, one byte every T s) sockets,
 *           reopened when the server closes them, while fresh-connection
 *           probes (health and a small infer) are timed against a baseline
 *           taken before; each kind must be closed by the server within its
 *           phase limit plus a slack, and every probe answered 200 in time.
 *   cap     P keep-alive connections from one address get 200; more from
 *           the same address are refused (closed, or 429/503) while another
 *           address still gets 200 and the P keep working.
 *   refuse  a POST announcing Content-Length N and sending none of it must
 *           be answered with one of the --accept statuses (a 503 with
 *           Retry-After) within S s: the server may not wait for the body.
 *   charge  K trickle uploads announcing 64 MiB are open while M small
 *           infers run: every infer must get 200 (bytes are charged as they
 *           arrive, not as announced).
 *   soak    C keep-alive clients send N requests of a weighted mix; every
 *           R answers it prints the server's RSS (/proc), the bytes its
 *           counting layer holds and the buddy pool's state (/metrics); RSS
 *           after warm-up must stay within a tolerance, the buddy pool must
 *           be empty and unfragmented at idle at the end. --idle-wait S:
 *           at each report the clients pause, and once nothing is in flight
 *           and S more seconds have passed (the server's buddy_decay_ms and
 *           a little: what the pool no longer uses has gone back) RSS is
 *           read again; that idle RSS is the one checked (RSS under load
 *           moves with the requests in flight and the pool's working set,
 *           which say nothing about a leak).
 * Output: "# ..." lines with the numbers and one "ok - ..." or "not ok - ..."
 * line per check. Exit 0 when every check passed, 1 when one failed, 2 on a
 * usage error or when the client itself cannot run (files, descriptors). */
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include <jpeglib.h>

#include "edgeserve/apps.h"

#ifndef IP_BIND_ADDRESS_NO_PORT
#define IP_BIND_ADDRESS_NO_PORT 24
#endif

/* ---- small helpers ------------------------------------------------------------ */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("es_hostile: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(2);
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p)
    die("out of memory (%zu bytes)", n);
  return p;
}

static void *xrealloc(void *p, size_t n) {
  void *q = realloc(p, n ? n : 1);
  if (!q)
    die("out of memory (%zu bytes)", n);
  return q;
}

/* A growing byte string (request bodies, JSON text). */
typedef struct sbuf {
  char *p;
  size_t len, cap;
} sbuf;

static void sb_put(sbuf *b, const void *d, size_t n) {
  if (b->len + n + 1 > b->cap) {
    b->cap = (b->len + n + 1) * 2;
    b->p = xrealloc(b->p, b->cap);
  }
  memcpy(b->p + b->len, d, n);
  b->len += n;
  b->p[b->len] = 0;
}

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
  char tmp[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= sizeof tmp)
    die("sb_printf: text too long");
  sb_put(b, tmp, (size_t)n);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng_next(void) { /* xorshift64*: reproducible with --seed */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 2685821657736338717ull;
}
static double rng_unit(void) { return (double)(rng_next() >> 11) / 9007199254740992.0; }

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Latencies (seconds) of one kind of answer, for percentiles. */
typedef struct lat {
  double *v;
  size_t n, cap;
} lat;

static void lat_add(lat *l, double s) {
  if (l->n == l->cap) {
    l->cap = l->cap ? l->cap * 2 : 256;
    l->v = xrealloc(l->v, l->cap * sizeof *l->v);
  }
  l->v[l->n++] = s;
}

/* The q-quantile (0..1) in ms; sorts in place. 0 when empty. */
static double lat_ms(lat *l, double q) {
  if (!l->n)
    return 0;
  qsort(l->v, l->n, sizeof *l->v, cmp_double);
  size_t i = (size_t)(q * (double)(l->n - 1) + 0.5);
  return l->v[i] * 1e3;
}

static int n_ok, n_fail;
static void check(int pass, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(int pass, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs(pass ? "ok - " : "not ok - ", stdout);
  vprintf(fmt, ap);
  fputc('\n', stdout);
  va_end(ap);
  fflush(stdout);
  if (pass)
    n_ok++;
  else
    n_fail++;
}

static void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void note(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("# ", stdout);
  vprintf(fmt, ap);
  fputc('\n', stdout);
  va_end(ap);
  fflush(stdout);
}

/* ---- options ------------------------------------------------------------------- */

typedef struct req req;

static struct {
  const char *mode;
  const char *host;       /* the server's address */
  int port;
  uint32_t src;           /* first source address (host order) */
  uint32_t probe_src;     /* probes' source address */
  int per_addr;           /* connections per source address */
  int clients;
  double seconds;
  double timeout;         /* an answer must come within this */
  double backoff_max;     /* after 429/503: wait up to min(Retry-After, this) */
  double drain;           /* after the end: wait this long for answers in flight */
  int n_idle, n_slow, n_trickle;
  double interval;        /* slowloris / trickle byte interval */
  double limit_idle, limit_header, limit_body, slack;
  double probe_every, probe_limit;
  int baseline;
  int reconnect;
  int cap, extra;
  unsigned long long content_length;
  int accept[4], n_accept;
  int probes;
  long long requests;
  double max_seconds;
  int server_pid;
  long long report_every;
  double warmup, rss_tolerance;
  double idle_wait;          /* soak: seconds idle before the RSS sample */
  const char *probe_req;
  req *reqs;
  int n_reqs;
} opt;

/* ---- requests ------------------------------------------------------------------ */

/* One kind of request, whole HTTP bytes ready to send, and what came back. */
struct req {
  char name[64];
  char *bytes;
  size_t len;
  size_t head_len;         /* the request line and headers */
  double weight;
  int infer;               /* a 200 must hold "outputs" */
  uint64_t by_status[600];
  uint64_t no_retry_after; /* 429/503 without it */
  uint64_t bad_200;        /* 200 without "outputs" */
  lat ok_lat;              /* of the 200s */
};

static void fill_floats(sbuf *body, size_t n, int json) {
  if (json) {
    for (size_t i = 0; i < n; i++)
      sb_printf(body, i ? ",%.3f" : "%.3f", rng_unit());
    return;
  }
  float chunk[1024];
  while (n) {
    size_t k = n < 1024 ? n : 1024;
    for (size_t i = 0; i < k; i++)
      chunk[i] = (float)rng_unit();
    sb_put(body, chunk, k * sizeof(float));
    n -= k;
  }
}

static void req_finish(req *r, const char *method, const char *path, const char *ctype,
                       long ihcl, const sbuf *body) {
  sbuf b = {0};
  sb_printf(&b, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n", method, path);
  if (body) {
    sb_printf(&b, "Content-Type: %s\r\n", ctype);
    if (ihcl >= 0)
      sb_printf(&b, "Inference-Header-Content-Length: %ld\r\n", ihcl);
    sb_printf(&b, "Content-Length: %zu\r\n", body->len);
  }
  sb_put(&b, "\r\n", 2);
  r->head_len = b.len;
  if (body)
    sb_put(&b, body->p, body->len);
  r->bytes = b.p;
  r->len = b.len;
}

/* A tensor request: binary extension (outputs binary too) or JSON data. */
static void req_tensor(req *r, const char *model, const char *input, const long *shape, int rank,
                       int json) {
  size_t n = 1;
  char dims[128] = "";
  for (int i = 0; i < rank; i++) {
    n *= (size_t)shape[i];
    snprintf(dims + strlen(dims), sizeof dims - strlen(dims), "%s%ld", i ? "," : "", shape[i]);
  }
  sbuf body = {0};
  long ihcl = -1;
  if (json) {
    sb_printf(&body, "{\"inputs\":[{\"name\":\"%s\",\"shape\":[%s],\"datatype\":\"FP32\",\"data\":[",
              input, dims);
    fill_floats(&body, n, 1);
    sb_printf(&body, "]}]}");
  } else {
    sb_printf(&body,
              "{\"inputs\":[{\"name\":\"%s\",\"shape\":[%s],\"datatype\":\"FP32\","
              "\"parameters\":{\"binary_data_size\":%zu}}],"
              "\"parameters\":{\"binary_data_output\":true}}",
              input, dims, n * sizeof(float));
    ihcl = (long)body.len;
    fill_floats(&body, n, 0);
  }
  char path[160];
  snprintf(path, sizeof path, "/v2/models/%s/infer", model);
  req_finish(r, "POST", path, json ? "application/json" : "application/octet-stream", ihcl,
             &body);
  free(body.p);
  r->infer = 1;
}

static unsigned char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f)
    die("cannot open '%s': %s", path, strerror(errno));
  sbuf b = {0};
  char tmp[65536];
  size_t k;
  while ((k = fread(tmp, 1, sizeof tmp, f)) > 0)
    sb_put(&b, tmp, k);
  fclose(f);
  *len = b.len;
  return (unsigned char *)b.p;
}

/* An image as a baseline JPEG (quality 90), decoded by the library's own
 * reader, so that a PNG test photo can exercise the JPEG path. */
static unsigned char *to_jpeg(const char *path, size_t *len) {
  es_image img;
  if (es_image_load(path, &img) < 0)
    die("cannot decode '%s' as an image", path);
  struct jpeg_compress_struct c;
  struct jpeg_error_mgr e;
  c.err = jpeg_std_error(&e);
  jpeg_create_compress(&c);
  unsigned char *buf = NULL;
  unsigned long n = 0;
  jpeg_mem_dest(&c, &buf, &n);
  c.image_width = (JDIMENSION)img.width;
  c.image_height = (JDIMENSION)img.height;
  c.input_components = 3;
  c.in_color_space = JCS_RGB;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, 90, TRUE);
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = (JSAMPROW)(img.rgb + (size_t)c.next_scanline * (size_t)img.width * 3);
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  es_image_free(&img);
  *len = n;
  return buf;
}

/* A pipeline request: one BYTES element (4-byte length, then the file). */
static void req_image(req *r, const char *model, const char *file, int jpeg) {
  size_t n;
  unsigned char *img = jpeg ? to_jpeg(file, &n) : read_file(file, &n);
  sbuf body = {0};
  sb_printf(&body,
            "{\"inputs\":[{\"name\":\"image\",\"shape\":[1],\"datatype\":\"BYTES\","
            "\"parameters\":{\"binary_data_size\":%zu}}]}",
            n + 4);
  long ihcl = (long)body.len;
  uint32_t l32 = (uint32_t)n; /* little-endian on the machines this runs on */
  sb_put(&body, &l32, 4);
  sb_put(&body, img, n);
  free(img);
  char path[160];
  snprintf(path, sizeof path, "/v2/models/%s/infer", model);
  req_finish(r, "POST", path, "application/octet-stream", ihcl, &body);
  free(body.p);
  r->infer = 1;
}

/* KIND[:PARAM] -> a request:
 *   front, front-json, back      blazeface_front 1x128x128x3 / _back 1x256x256x3
 *   cls                          ppocr_cls 1x3x48x192
 *   rec:W                        ppocr_rec 1x3x48xW
 *   det:S | det:HxW              ppocr_det 1x3xSxS / 1x3xHxW
 *   face:FILE, face-jpeg:FILE    the face pipeline, the file as is / as JPEG
 *   ocr:FILE, ocr-jpeg:FILE      the ocr pipeline
 *   health                       GET /v2/health/ready */
static void req_build(req *r, const char *spec) {
  memset(r, 0, sizeof *r);
  snprintf(r->name, sizeof r->name, "%s", spec);
  const char *colon = strchr(spec, ':');
  char kind[32];
  snprintf(kind, sizeof kind, "%.*s", colon ? (int)(colon - spec) : (int)strlen(spec), spec);
  const char *param = colon ? colon + 1 : NULL;
  if (colon) { /* name images by their base name, not their path */
    const char *slash = strrchr(param, '/');
    snprintf(r->name, sizeof r->name, "%s:%s", kind, slash ? slash + 1 : param);
  }
  if (!strcmp(kind, "front") || !strcmp(kind, "front-json")) {
    long s[] = {1, 128, 128, 3};
    req_tensor(r, "blazeface_front", "input:0", s, 4, !strcmp(kind, "front-json"));
  } else if (!strcmp(kind, "back")) {
    long s[] = {1, 256, 256, 3};
    req_tensor(r, "blazeface_back", "input:0", s, 4, 0);
  } else if (!strcmp(kind, "cls")) {
    long s[] = {1, 3, 48, 192};
    req_tensor(r, "ppocr_cls", "x", s, 4, 0);
  } else if (!strcmp(kind, "rec") && param) {
    long s[] = {1, 3, 48, atol(param)};
    if (s[3] <= 0)
      die("rec:W wants a width, got '%s'", spec);
    req_tensor(r, "ppocr_rec", "x", s, 4, 0);
  } else if (!strcmp(kind, "det") && param) {
    long h = atol(param), w = h;
    const char *x = strchr(param, 'x');
    if (x)
      w = atol(x + 1);
    if (h <= 0 || w <= 0)
      die("det:S or det:HxW wants sizes, got '%s'", spec);
    long s[] = {1, 3, h, w};
    req_tensor(r, "ppocr_det", "x", s, 4, 0);
  } else if ((!strcmp(kind, "face") || !strcmp(kind, "face-jpeg")) && param) {
    req_image(r, "face", param, !strcmp(kind, "face-jpeg"));
  } else if ((!strcmp(kind, "ocr") || !strcmp(kind, "ocr-jpeg")) && param) {
    req_image(r, "ocr", param, !strcmp(kind, "ocr-jpeg"));
  } else if (!strcmp(kind, "health")) {
    req_finish(r, "GET", "/v2/health/ready", NULL, -1, NULL);
  } else {
    die("unknown request kind '%s' (front, front-json, back, cls, rec:W, det:S, det:HxW, "
        "face:FILE, face-jpeg:FILE, ocr:FILE, ocr-jpeg:FILE, health)",
        spec);
  }
}

/* --req WEIGHT:KIND[:PARAM] (weight optional). */
static void req_add(const char *arg) {
  char *end;
  double w = strtod(arg, &end);
  const char *spec = arg;
  if (end != arg && *end == ':') {
    spec = end + 1;
  } else {
    w = 1;
  }
  if (!(w > 0))
    die("--req: weight must be > 0 in '%s'", arg);
  opt.reqs = xrealloc(opt.reqs, (size_t)(opt.n_reqs + 1) * sizeof *opt.reqs);
  req_build(&opt.reqs[opt.n_reqs], spec);
  opt.reqs[opt.n_reqs].weight = w;
  opt.n_reqs++;
}

static req *req_pick(void) {
  double total = 0;
  for (int i = 0; i < opt.n_reqs; i++)
    total += opt.reqs[i].weight;
  double x = rng_unit() * total;
  for (int i = 0; i < opt.n_reqs; i++) {
    if (x < opt.reqs[i].weight)
      return &opt.reqs[i];
    x -= opt.reqs[i].weight;
  }
  return &opt.reqs[opt.n_reqs - 1];
}

/* ---- HTTP responses ---------------------------------------------------------- */

typedef struct resp {
  int status;
  size_t total;          /* bytes of the whole response (1xx heads included) */
  size_t body_off, body_len;
  int retry_after;       /* header present */
  int close;             /* Connection: close */
} resp;

static int hdr_is(const char *line, size_t n, const char *name, const char **val) {
  size_t k = strlen(name);
  if (n <= k || strncasecmp(line, name, k) || line[k] != ':')
    return 0;
  const char *v = line + k + 1;
  while (v < line + n && (*v == ' ' || *v == '\t'))
    v++;
  *val = v;
  return 1;
}

/* 1: a whole response is in b[0..n); 0: more is needed; -1: not HTTP.
 * eof: the peer closed (a body with no length ends there). */
static int resp_parse(const char *b, size_t n, int eof, resp *r) {
  size_t off = 0;
  memset(r, 0, sizeof *r);
  for (;;) {
    const char *end = memmem(b + off, n - off, "\r\n\r\n", 4);
    if (!end)
      return n - off > 65536 ? -1 : 0;
    size_t head = (size_t)(end - b) + 4;
    if (n - off < 12 || memcmp(b + off, "HTTP/1.", 7))
      return -1;
    int st = atoi(b + off + 9);
    if (st < 100 || st > 599)
      return -1;
    if (st < 200) { /* 100 Continue and friends: skip */
      off = head;
      continue;
    }
    r->status = st;
    long long cl = -1;
    int chunked = 0;
    const char *line = memchr(b + off, '\n', head - off);
    while (line && line + 1 < b + head) {
      line++;
      const char *eol = memchr(line, '\n', (size_t)(b + head - line));
      if (!eol)
        break;
      size_t ln = (size_t)(eol - line);
      const char *v;
      if (hdr_is(line, ln, "content-length", &v))
        cl = atoll(v);
      else if (hdr_is(line, ln, "transfer-encoding", &v))
        chunked = !strncasecmp(v, "chunked", 7);
      else if (hdr_is(line, ln, "connection", &v))
        r->close = !strncasecmp(v, "close", 5);
      else if (hdr_is(line, ln, "retry-after", &v))
        r->retry_after = atoi(v) > 0 ? atoi(v) : 1; /* present; at least 1 s */
      line = eol;
    }
    r->body_off = head;
    if (chunked) {
      size_t p = head;
      for (;;) {
        const char *le = memmem(b + p, n - p, "\r\n", 2);
        if (!le)
          return 0;
        unsigned long long sz = strtoull(b + p, NULL, 16);
        p = (size_t)(le - b) + 2;
        if (sz == 0) {
          const char *t = memmem(b + p - 2, n - (p - 2), "\r\n\r\n", 4);
          if (!t)
            return 0;
          r->total = (size_t)(t - b) + 4;
          r->body_len = r->total - head;
          return 1;
        }
        if (n - p < sz + 2)
          return 0;
        p += sz + 2;
      }
    }
    if (cl >= 0) {
      if (n - head < (unsigned long long)cl)
        return 0;
      r->body_len = (size_t)cl;
      r->total = head + (size_t)cl;
      return 1;
    }
    if (st == 204 || st == 304) {
      r->total = head;
      return 1;
    }
    if (!eof)
      return 0;
    r->body_len = n - head;
    r->total = n;
    r->close = 1;
    return 1;
  }
}

/* ---- connections and the loop ------------------------------------------------------ */

enum role { R_CLIENT, R_PROBE, R_IDLE, R_SLOW, R_TRICKLE, R_HELD, R_EXTRA, R_ONESHOT };
enum state { S_CONNECTING, S_SENDING, S_WAITING, S_PAUSED, S_HOLDING, S_DONE };

typedef struct conn {
  int fd;
  int role, state;
  int slot;              /* index in the loop's table */
  int id;                /* the owner's index (client number, probe number) */
  uint32_t src;
  double t_open, t_req, t_next;
  req *rq;               /* the request being sent or waited for */
  size_t sent, send_len; /* send_len < rq->len: send only part (refuse) */
  int reused;            /* a keep-alive connection's second or later request */
  int answered;          /* hold kinds: the server answered or closed */
  int overdue;           /* hold kinds: counted once as overdue */
  int pad_lines;
  char *rb;
  size_t rlen, rcap;
} conn;

static int ep = -1;
static conn **table;
static int n_conns, table_cap;
static struct sockaddr_in dst;

/* Transport failures, by kind, for the modes that count them. */
static struct {
  uint64_t connect_err, reset, reset_reused, eof_midway, timeout, malformed;
  int last_errno;
} terr;

static uint32_t addr_nth(uint32_t base, unsigned k) {
  uint32_t a = base;
  for (;;) {
    uint32_t h = a & 0xff;
    if (h != 0 && h != 255) {
      if (!k)
        return a;
      k--;
    }
    a++;
  }
}

static void ep_set(conn *c, uint32_t events) {
  struct epoll_event ev = {.events = events | EPOLLRDHUP, .data.ptr = c};
  if (epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev) < 0)
    die("epoll_ctl: %s", strerror(errno));
}

/* A non-blocking connection from src to the server; NULL when the socket
 * cannot even be made (errno kept in terr.last_errno). */
static conn *conn_open(int role, uint32_t src, int id) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    terr.last_errno = errno;
    terr.connect_err++;
    return NULL;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(src)};
  if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 ||
      (connect(fd, (struct sockaddr *)&dst, sizeof dst) < 0 && errno != EINPROGRESS)) {
    terr.last_errno = errno;
    terr.connect_err++;
    close(fd);
    return NULL;
  }
  conn *c = calloc(1, sizeof *c);
  if (!c)
    die("out of memory");
  c->fd = fd;
  c->role = role;
  c->state = S_CONNECTING;
  c->src = src;
  c->id = id;
  c->t_open = now_s();
  struct epoll_event ev = {.events = EPOLLOUT | EPOLLRDHUP, .data.ptr = c};
  if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0)
    die("epoll_ctl: %s", strerror(errno));
  if (n_conns == table_cap) {
    table_cap = table_cap ? table_cap * 2 : 1024;
    table = xrealloc(table, (size_t)table_cap * sizeof *table);
  }
  c->slot = n_conns;
  table[n_conns++] = c;
  return c;
}

static void conn_free(conn *c) {
  close(c->fd);
  table[c->slot] = table[--n_conns];
  table[c->slot]->slot = c->slot;
  free(c->rb);
  free(c);
}

/* Start sending rq (or its first send_len bytes) on a connected socket. */
static void conn_send_req(conn *c, req *rq, size_t send_len) {
  c->rq = rq;
  c->sent = 0;
  c->send_len = send_len ? send_len : rq->len;
  c->rlen = 0;
  c->t_req = now_s();
  c->state = S_SENDING;
  ep_set(c, EPOLLIN | EPOLLOUT);
}

/* Send a few bytes now (hostile kinds); -1 when the peer is gone. */
static int send_small(conn *c, const char *p, size_t n) {
  ssize_t k = send(c->fd, p, n, MSG_NOSIGNAL);
  if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
    return -1;
  return 0;
}

/* What each mode does on its connections' events. */
typedef struct handlers {
  void (*connected)(conn *c);
  void (*answer)(conn *c, const resp *r);    /* a whole response */
  void (*gone)(conn *c, int why);            /* closed, reset, refused, timed out */
  void (*timer)(conn *c);                    /* t_next passed */
} handlers;
enum { GONE_CONNECT, GONE_EOF, GONE_RESET, GONE_TIMEOUT, GONE_MALFORMED };
static const handlers *H;

static void on_readable(conn *c) {
  for (;;) {
    if (c->rcap - c->rlen < 65536) {
      c->rcap = c->rcap ? c->rcap * 2 : 131072;
      c->rb = xrealloc(c->rb, c->rcap);
    }
    ssize_t k = recv(c->fd, c->rb + c->rlen, c->rcap - c->rlen, 0);
    if (k > 0) {
      c->rlen += (size_t)k;
      if (c->state != S_SENDING && c->state != S_WAITING) {
        /* Bytes nobody asked for: a hostile socket's answer (408, 400) or
         * a keep-alive connection's unsolicited close notice. */
        H->gone(c, GONE_EOF);
        return;
      }
      resp r;
      int p = resp_parse(c->rb, c->rlen, 0, &r);
      if (p < 0) {
        H->gone(c, GONE_MALFORMED);
        return;
      }
      if (p > 0) {
        H->answer(c, &r);
        return;
      }
      continue;
    }
    if (k == 0) {
      resp r;
      if ((c->state == S_SENDING || c->state == S_WAITING) && c->rlen &&
          resp_parse(c->rb, c->rlen, 1, &r) > 0) {
        H->answer(c, &r);
        return;
      }
      H->gone(c, GONE_EOF);
      return;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK)
      return;
    if (errno == EINTR)
      continue;
    terr.last_errno = errno;
    H->gone(c, GONE_RESET);
    return;
  }
}

static void on_writable(conn *c) {
  if (c->state == S_CONNECTING) {
    int err = 0;
    socklen_t l = sizeof err;
    getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &l);
    if (err) {
      terr.last_errno = err;
      H->gone(c, GONE_CONNECT);
      return;
    }
    c->state = S_HOLDING;
    ep_set(c, EPOLLIN);
    H->connected(c);
    return;
  }
  if (c->state != S_SENDING)
    return;
  while (c->sent < c->send_len) {
    ssize_t k = send(c->fd, c->rq->bytes + c->sent, c->send_len - c->sent, MSG_NOSIGNAL);
    if (k > 0) {
      c->sent += (size_t)k;
      continue;
    }
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return;
    if (k < 0 && errno == EINTR)
      continue;
    terr.last_errno = errno;
    H->gone(c, GONE_RESET);
    return;
  }
  c->state = S_WAITING;
  ep_set(c, EPOLLIN);
}

/* Run the loop until done() says so; timers are scanned every tick. */
static void loop(int (*done)(void), void (*tick)(void)) {
  struct epoll_event evs[512];
  while (!done()) {
    int n = epoll_wait(ep, evs, 512, 10);
    if (n < 0 && errno != EINTR)
      die("epoll_wait: %s", strerror(errno));
    for (int i = 0; i < n; i++) {
      conn *c = evs[i].data.ptr;
      uint32_t e = evs[i].events;
      /* A handler may free c; each step re-reads nothing from it after. */
      if (c->state == S_CONNECTING) {
        on_writable(c);
        continue;
      }
      if (e & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
        on_readable(c);
        continue;
      }
      if (e & EPOLLOUT)
        on_writable(c);
    }
    double t = now_s();
    for (int i = 0; i < n_conns; i++) {
      conn *c = table[i];
      if ((c->state == S_SENDING || c->state == S_WAITING) && t - c->t_req > opt.timeout) {
        H->gone(c, GONE_TIMEOUT);
        i--; /* the slot now holds another connection (or a new one) */
        continue;
      }
      if (c->t_next > 0 && t >= c->t_next) {
        c->t_next = 0;
        int before = n_conns;
        conn *was = table[i];
        H->timer(c);
        if (n_conns < before || table[i] != was)
          i--;
      }
    }
    if (tick)
      tick();
  }
}

static int is_refusal(int st) { return st == 429 || st == 503; }

static void raise_nofile(long want) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
    die("getrlimit: %s", strerror(errno));
  if ((long)rl.rlim_cur >= want)
    return;
  rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || (long)rl.rlim_max >= want ? (rlim_t)want
                                                                           : rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
  getrlimit(RLIMIT_NOFILE, &rl);
  if ((long)rl.rlim_cur < want)
    die("needs %ld open files, the hard limit is %llu", want, (unsigned long long)rl.rlim_max);
}

/* A blocking GET on a fresh connection: the status, the body in *body
 * (malloc'd, NUL-terminated); -1 on transport errors. For /metrics and
 * checks between the loop's phases. */
static int http_get(uint32_t src, const char *path, char **body, double timeout) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  struct timeval tv = {.tv_sec = (long)timeout, .tv_usec = (long)((timeout - (long)timeout) * 1e6)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  int one = 1;
  setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(src)};
  if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 ||
      connect(fd, (struct sockaddr *)&dst, sizeof dst) < 0) {
    close(fd);
    return -1;
  }
  char head[256];
  int hn = snprintf(head, sizeof head,
                    "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", path);
  if (send(fd, head, (size_t)hn, MSG_NOSIGNAL) != hn) {
    close(fd);
    return -1;
  }
  sbuf b = {0};
  char tmp[65536];
  resp r;
  int p = 0;
  for (;;) {
    ssize_t k = recv(fd, tmp, sizeof tmp, 0);
    if (k > 0)
      sb_put(&b, tmp, (size_t)k);
    if (k <= 0 || (p = resp_parse(b.p, b.len, 0, &r)) != 0)
      break;
  }
  if (p == 0 && b.len)
    p = resp_parse(b.p, b.len, 1, &r);
  close(fd);
  if (p <= 0) {
    free(b.p);
    return -1;
  }
  if (body) {
    *body = xmalloc(r.body_len + 1);
    memcpy(*body, b.p + r.body_off, r.body_len);
    (*body)[r.body_len] = 0;
  }
  free(b.p);
  return r.status;
}

/* ---- flood and soak: closed-loop clients ------------------------------------------- */

static struct {
  int stopping;          /* no new requests */
  int pausing;           /* no new requests until the soak's idle sample */
  long long issued, answered, target;
  int active;            /* clients with a request out or about to send */
  int peak_open;         /* connected clients at once */
  int open;
  double t_start, t_end;
  uint64_t reconnects;
} cl;

static void client_next(conn *c) {
  if (cl.stopping || cl.pausing || (cl.target && cl.issued >= cl.target)) {
    c->state = S_DONE;
    ep_set(c, EPOLLIN);
    return;
  }
  cl.issued++;
  conn_send_req(c, req_pick(), 0);
}

static void client_reopen(int id, uint32_t src) {
  cl.reconnects++;
  conn *n = conn_open(R_CLIENT, src, id);
  if (!n)
    return; /* counted in terr.connect_err; this client is gone */
}

static void client_connected(conn *c) {
  cl.open++;
  if (cl.open > cl.peak_open)
    cl.peak_open = cl.open;
  client_next(c);
}

static void client_answer(conn *c, const resp *r) {
  req *q = c->rq;
  double t = now_s() - c->t_req;
  q->by_status[r->status]++;
  cl.answered++;
  if (is_refusal(r->status) && !r->retry_after)
    q->no_retry_after++;
  if (r->status == 200) {
    lat_add(&q->ok_lat, t);
    if (q->infer && !memmem(c->rb + r->body_off, r->body_len < 4096 ? r->body_len : 4096,
                            "\"outputs\"", 9))
      q->bad_200++;
  }
  /* Bytes past the answer, or an answer before the whole request went out:
   * this connection is out of step; open another. */
  int out_of_step = c->rlen != r->total || c->sent < c->send_len;
  c->reused = 1;
  c->rlen = 0;
  if (r->close || out_of_step) {
    uint32_t src = c->src;
    int id = c->id;
    cl.open--;
    conn_free(c);
    if (!cl.stopping)
      client_reopen(id, src);
    return;
  }
  if (is_refusal(r->status) && opt.backoff_max > 0) {
    double ra = r->retry_after ? r->retry_after : 1;
    c->state = S_PAUSED;
    c->t_next = now_s() + rng_unit() * (ra < opt.backoff_max ? ra : opt.backoff_max) + 1e-3;
    ep_set(c, EPOLLIN);
    return;
  }
  client_next(c);
}

static void client_gone(conn *c, int why) {
  int mid = c->state == S_SENDING || c->state == S_WAITING;
  if (why == GONE_CONNECT)
    terr.connect_err++;
  else if (why == GONE_TIMEOUT)
    terr.timeout++;
  else if (why == GONE_MALFORMED)
    terr.malformed++;
  else if (mid && c->reused && c->rlen == 0)
    terr.reset_reused++; /* the server closed a kept-alive connection as we reused it */
  else if (mid && why == GONE_RESET)
    terr.reset++;
  else if (mid)
    terr.eof_midway++;
  /* An idle kept-alive connection the server closed is no failure. */
  if (c->state != S_CONNECTING)
    cl.open--;
  uint32_t src = c->src;
  int id = c->id;
  conn_free(c);
  if (!cl.stopping && why != GONE_CONNECT)
    client_reopen(id, src);
}

static void client_timer(conn *c) {
  if (c->state == S_PAUSED)
    client_next(c);
}

static const handlers client_h = {client_connected, client_answer, client_gone, client_timer};

static int clients_busy(void) {
  for (int i = 0; i < n_conns; i++)
    if (table[i]->state == S_SENDING || table[i]->state == S_WAITING ||
        table[i]->state == S_CONNECTING)
      return 1;
  return 0;
}

static void clients_start(int n, uint32_t base) {
  H = &client_h;
  for (int i = 0; i < n; i++)
    conn_open(R_CLIENT, addr_nth(base, (unsigned)(i / opt.per_addr)), i);
}

static void clients_close_all(void) {
  while (n_conns)
    conn_free(table[0]);
}

/* Totals over the request kinds; prints a line per kind. */
static void print_by_kind(uint64_t *n200, uint64_t *nref, uint64_t *nbad, uint64_t *nora,
                          uint64_t *bad200) {
  *n200 = *nref = *nbad = *nora = *bad200 = 0;
  for (int i = 0; i < opt.n_reqs; i++) {
    req *q = &opt.reqs[i];
    uint64_t tot = 0, other = 0;
    char others[256] = "";
    for (int s = 0; s < 600; s++) {
      tot += q->by_status[s];
      if (q->by_status[s] && s != 200 && !is_refusal(s)) {
        other += q->by_status[s];
        snprintf(others + strlen(others), sizeof others - strlen(others), " %d:%llu", s,
                 (unsigned long long)q->by_status[s]);
      }
    }
    note("%-22s %8llu answers: 200 %llu, 429 %llu, 503 %llu, other %llu%s; 200 p50 %.1f ms, "
         "p99 %.1f ms, max %.1f ms",
         q->name, (unsigned long long)tot, (unsigned long long)q->by_status[200],
         (unsigned long long)q->by_status[429], (unsigned long long)q->by_status[503],
         (unsigned long long)other, others, lat_ms(&q->ok_lat, 0.5), lat_ms(&q->ok_lat, 0.99),
         lat_ms(&q->ok_lat, 1.0));
    *n200 += q->by_status[200];
    *nref += q->by_status[429] + q->by_status[503];
    *nbad += other;
    *nora += q->no_retry_after;
    *bad200 += q->bad_200;
  }
}

static int flood_done(void) {
  double t = now_s();
  if (!n_conns) /* every client lost (the server is gone): nothing to wait for */
    return 1;
  if (!cl.stopping && t >= cl.t_end)
    cl.stopping = 1;
  if (!cl.stopping)
    return 0;
  return !clients_busy() || t >= cl.t_end + opt.drain;
}

static int mode_flood(void) {
  if (!opt.n_reqs)
    die("flood: give at least one --req");
  raise_nofile(opt.clients + 256);
  note("flood: %d clients (%d per source address), %.0f s, %d request kinds, backoff up to "
       "%.2f s after 429/503",
       opt.clients, opt.per_addr, opt.seconds, opt.n_reqs, opt.backoff_max);
  cl.t_start = now_s();
  cl.t_end = cl.t_start + opt.seconds;
  clients_start(opt.clients, opt.src);
  loop(flood_done, NULL);
  int in_flight = 0;
  for (int i = 0; i < n_conns; i++)
    if (table[i]->state == S_SENDING || table[i]->state == S_WAITING)
      in_flight++;
  terr.timeout += (uint64_t)in_flight;
  double el = now_s() - cl.t_start;
  clients_close_all();
  uint64_t n200, nref, nbad, nora, bad200;
  print_by_kind(&n200, &nref, &nbad, &nora, &bad200);
  uint64_t transport = terr.connect_err + terr.reset + terr.reset_reused + terr.eof_midway +
                       terr.timeout + terr.malformed;
  note("flood: %lld answers in %.1f s (%.0f/s): 200 %llu, 429/503 %llu; peak %d clients "
       "connected at once; %llu reconnects",
       cl.answered, el, (double)cl.answered / el, (unsigned long long)n200,
       (unsigned long long)nref, cl.peak_open, (unsigned long long)cl.reconnects);
  check(cl.peak_open >= opt.clients, "flood: all %d clients connected at once (peak %d)",
        opt.clients, cl.peak_open);
  check(nbad == 0 && bad200 == 0,
        "flood: every answer 200, 429 or 503 (others: %llu; 200 without outputs: %llu)",
        (unsigned long long)nbad, (unsigned long long)bad200);
  check(nora == 0, "flood: every 429/503 carries Retry-After (%llu without)",
        (unsigned long long)nora);
  check(transport == 0,
        "flood: no transport failure (connect %llu, reset %llu, closed on a reused connection "
        "%llu, closed mid-answer %llu, timeout %llu (>%.0f s or unanswered %.0f s after the "
        "end), malformed %llu%s%s)",
        (unsigned long long)terr.connect_err, (unsigned long long)terr.reset,
        (unsigned long long)terr.reset_reused, (unsigned long long)terr.eof_midway,
        (unsigned long long)terr.timeout, opt.timeout, opt.drain,
        (unsigned long long)terr.malformed, terr.last_errno ? "; last error: " : "",
        terr.last_errno ? strerror(terr.last_errno) : "");
  check(n200 > 0, "flood: some requests served (%llu answers 200)", (unsigned long long)n200);
  return 0;
}

/* ---- soak -------------------------------------------------------------------------- */

static long read_rss_kib(int pid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", pid);
  FILE *f = fopen(path, "r");
  if (!f)
    return -1;
  long v = -1;
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, "VmRSS:", 6))
      v = atol(line + 6);
  fclose(f);
  return v;
}

/* A gauge's value in Prometheus text; NAN when absent. */
static double metric(const char *text, const char *name) {
  size_t k = strlen(name);
  for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
    if (!strncmp(p, name, k) && p[k] == ' ')
      return strtod(p + k + 1, NULL);
  return NAN;
}

/* The sum of a labelled gauge's series (the counting layer's tags). */
static double metric_sum(const char *text, const char *name) {
  size_t k = strlen(name);
  double sum = NAN;
  for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
    if (!strncmp(p, name, k) && p[k] == '{') {
      const char *sp = strchr(p, ' ');
      const char *nl = strchr(p, '\n');
      if (sp && (!nl || sp < nl))
        sum = (isnan(sum) ? 0 : sum) + strtod(sp + 1, NULL);
    }
  return sum;
}

static struct {
  long long next_report;
  double t_last;
  long long n_last;
  long rss_base, rss_min, rss_max;
  double paused_s;     /* total time paused for idle samples */
  long long warm_at;
  int samples_after;
  double frag_max;
} sk;

static void soak_report(void) {
  double t = now_s();
  long rss = opt.server_pid > 0 ? read_rss_kib(opt.server_pid) : -1, rss_load = rss;
  if (opt.idle_wait > 0 && rss > 0) { /* nothing in flight: let it settle */
    struct timespec ts = {(time_t)opt.idle_wait,
                          (long)((opt.idle_wait - floor(opt.idle_wait)) * 1e9)};
    nanosleep(&ts, NULL);
    rss = read_rss_kib(opt.server_pid);
    /* The pool gives pages back in passes (a tenth of its decay period
     * apart), late under load: while RSS still falls, a pass is under way;
     * wait for it (at most 5 s more). A leak never falls. */
    for (int i = 0; i < 5; i++) {
      struct timespec pass = {1, 0};
      nanosleep(&pass, NULL);
      long again = read_rss_kib(opt.server_pid);
      if (again >= rss) {
        rss = again < rss ? again : rss;
        break;
      }
      rss = again;
    }
  }
  /* ES_SOAK_SMAPS=DIR keeps the server's smaps at each idle sample (which
   * mapping grows when RSS creeps): DIR/smaps.<answers>. */
  const char *smaps_dir = getenv("ES_SOAK_SMAPS");
  if (smaps_dir && opt.server_pid > 0) {
    char src[64], path[4096], buf[65536];
    snprintf(src, sizeof src, "/proc/%d/smaps", opt.server_pid);
    snprintf(path, sizeof path, "%s/smaps.%lld", smaps_dir, cl.answered);
    FILE *in = fopen(src, "r"), *out = in ? fopen(path, "w") : NULL;
    size_t n;
    while (out && (n = fread(buf, 1, sizeof buf, in)) > 0)
      fwrite(buf, 1, n, out);
    if (out)
      fclose(out);
    if (in)
      fclose(in);
  }
  char *m = NULL;
  double frag = NAN, inuse = NAN, counted = NAN, peak = NAN;
  if (http_get(opt.probe_src, "/metrics", &m, 10) == 200) {
    frag = metric(m, "edgeserve_buddy_fragmentation_ratio");
    inuse = metric(m, "edgeserve_buddy_in_use_bytes");
    peak = metric(m, "edgeserve_buddy_peak_bytes");
    counted = metric_sum(m, "edgeserve_memory_tag_bytes");
  }
  free(m);
  uint64_t s200 = 0, sref = 0, sbad = 0;
  for (int i = 0; i < opt.n_reqs; i++)
    for (int s = 0; s < 600; s++) {
      uint64_t v = opt.reqs[i].by_status[s];
      if (s == 200)
        s200 += v;
      else if (is_refusal(s))
        sref += v;
      else
        sbad += v;
    }
  const char *mark = "";
  if (cl.answered >= sk.warm_at && rss > 0) {
    if (!sk.rss_base) {
      sk.rss_base = sk.rss_min = sk.rss_max = rss;
      mark = "  <- warm-up done: RSS baseline";
    } else {
      sk.samples_after++;
      if (rss < sk.rss_min)
        sk.rss_min = rss;
      if (rss > sk.rss_max)
        sk.rss_max = rss;
    }
  }
  if (!isnan(frag) && frag > sk.frag_max)
    sk.frag_max = frag;
  printf("%10lld %8.1f %8.0f %10llu %8llu %6llu %10ld %10ld %11.0f %12.0f %11.0f %8.4f%s\n",
         cl.answered, t - cl.t_start - sk.paused_s,
         (double)(cl.answered - sk.n_last) / (t - sk.t_last), (unsigned long long)s200,
         (unsigned long long)sref, (unsigned long long)sbad, rss_load, rss, counted / 1024,
         inuse, peak / 1024, frag, mark);
  fflush(stdout);
  double t1 = now_s();
  sk.paused_s += t1 - t;
  sk.t_last = t1;
  sk.n_last = cl.answered;
}

static void soak_tick(void) {
  if (cl.answered < sk.next_report)
    return;
  if (opt.idle_wait > 0 && !cl.stopping) { /* pause, drain, sample, resume */
    cl.pausing = 1;
    if (clients_busy())
      return;
    soak_report();
    cl.pausing = 0;
    for (int i = 0; i < n_conns; i++)
      if (table[i]->state == S_DONE)
        client_next(table[i]);
  } else {
    soak_report();
  }
  sk.next_report += opt.report_every;
}

static int soak_done(void) {
  double t = now_s();
  if (!n_conns)
    return 1;
  if (!cl.stopping && ((cl.target && cl.issued >= cl.target) ||
                       (opt.max_seconds > 0 && t >= cl.t_start + opt.max_seconds))) {
    cl.stopping = 1;
    cl.t_end = t;
  }
  if (!cl.stopping)
    return 0;
  return !clients_busy() || t >= cl.t_end + opt.drain;
}

static int mode_soak(void) {
  if (!opt.n_reqs)
    die("soak: give at least one --req");
  raise_nofile(opt.clients + 256);
  cl.target = opt.requests;
  sk.warm_at = (long long)(opt.warmup * (double)opt.requests);
  sk.next_report = opt.report_every;
  char bound[48] = "no time bound";
  if (opt.max_seconds > 0)
    snprintf(bound, sizeof bound, "at most %.0f s", opt.max_seconds);
  note("soak: %d keep-alive clients, %lld requests (%s), %d request kinds; a line every %lld "
       "answers; RSS baseline after %lld answers, tolerance %.1f%%",
       opt.clients, opt.requests, bound, opt.n_reqs, opt.report_every, sk.warm_at,
       opt.rss_tolerance * 100);
  if (opt.idle_wait > 0)
    note("soak: at each line the clients pause; load_rssK is RSS once nothing is in flight, "
         "rss_KiB (the one checked) %.1f s later; secs and req/s leave the pauses out",
         opt.idle_wait);
  else
    note("soak: load_rssK and rss_KiB are both RSS under load (no --idle-wait)");
  for (int i = 0; i < opt.n_reqs; i++)
    note("  %-22s weight %5.1f, %zu bytes", opt.reqs[i].name, opt.reqs[i].weight,
         opt.reqs[i].len);
  printf("%10s %8s %8s %10s %8s %6s %10s %10s %11s %12s %11s %8s\n", "answers", "secs",
         "req/s", "200", "429/503", "other", "load_rssK", "rss_KiB", "counted_KiB",
         "buddy_in_use", "buddy_peakK", "frag");
  fflush(stdout);
  cl.t_start = sk.t_last = now_s();
  cl.t_end = 1e300;
  clients_start(opt.clients, opt.src);
  loop(soak_done, soak_tick);
  double el = now_s() - cl.t_start - sk.paused_s;
  int in_flight = 0;
  for (int i = 0; i < n_conns; i++)
    if (table[i]->state == S_SENDING || table[i]->state == S_WAITING)
      in_flight++;
  terr.timeout += (uint64_t)in_flight;
  clients_close_all();
  if (cl.answered != sk.n_last)
    soak_report();
  /* Idle: nothing in flight; the buddy pool must be whole again. */
  double frag = NAN, inuse = NAN;
  for (int i = 0; i < 50; i++) {
    char *m = NULL;
    if (http_get(opt.probe_src, "/metrics", &m, 10) == 200) {
      frag = metric(m, "edgeserve_buddy_fragmentation_ratio");
      inuse = metric(m, "edgeserve_buddy_in_use_bytes");
    }
    free(m);
    if (inuse == 0 && frag == 0)
      break;
    struct timespec ts = {0, 100000000};
    nanosleep(&ts, NULL);
  }
  uint64_t n200, nref, nbad, nora, bad200;
  print_by_kind(&n200, &nref, &nbad, &nora, &bad200);
  uint64_t transport = terr.connect_err + terr.reset + terr.reset_reused + terr.eof_midway +
                       terr.timeout + terr.malformed;
  note("soak: %lld answers in %.1f s: %.0f requests/s; 200 %llu, 429/503 %llu, other %llu, "
       "transport failures %llu",
       cl.answered, el, (double)cl.answered / el, (unsigned long long)n200,
       (unsigned long long)nref, (unsigned long long)nbad, (unsigned long long)transport);
  if (sk.rss_base)
    note("soak: server RSS after warm-up %ld KiB; later %ld..%ld KiB (%+.2f%% .. %+.2f%%) over "
         "%d samples; buddy fragmentation peak %.4f",
         sk.rss_base, sk.rss_min, sk.rss_max,
         100.0 * (double)(sk.rss_min - sk.rss_base) / (double)sk.rss_base,
         100.0 * (double)(sk.rss_max - sk.rss_base) / (double)sk.rss_base, sk.samples_after,
         sk.frag_max);
  check(cl.answered >= opt.requests, "soak: %lld of %lld requests answered", cl.answered,
        opt.requests);
  check(nbad == 0 && bad200 == 0 && transport == 0 && nora == 0,
        "soak: every answer 200, 429 or 503 (other %llu, 200 without outputs %llu, 429/503 "
        "without Retry-After %llu, transport failures %llu: reset %llu, closed on reuse %llu, "
        "closed mid-answer %llu, timeout %llu, connect %llu)",
        (unsigned long long)nbad, (unsigned long long)bad200, (unsigned long long)nora,
        (unsigned long long)transport, (unsigned long long)terr.reset,
        (unsigned long long)terr.reset_reused, (unsigned long long)terr.eof_midway,
        (unsigned long long)terr.timeout, (unsigned long long)terr.connect_err);
  if (opt.server_pid > 0) {
    double lo = sk.rss_base ? (double)(sk.rss_min - sk.rss_base) / (double)sk.rss_base : 0;
    double hi = sk.rss_base ? (double)(sk.rss_max - sk.rss_base) / (double)sk.rss_base : 0;
    check(sk.rss_base && sk.samples_after > 0 && -lo <= opt.rss_tolerance &&
              hi <= opt.rss_tolerance,
          "soak: server RSS within %.1f%% of its post-warm-up %ld KiB (%+.2f%% .. %+.2f%%, "
          "%d samples)",
          opt.rss_tolerance * 100, sk.rss_base, lo * 100, hi * 100, sk.samples_after);
  }
  check(inuse == 0 && frag == 0,
        "soak: buddy pool at idle: %.0f bytes in use, fragmentation %.4f (want 0 and 0)", inuse,
        frag);
  return 0;
}

/* ---- probes (hold, charge) ------------------------------------------------------------ */

static req probe_health, probe_infer;

typedef struct probe_set {
  lat health, infer;     /* latencies of the 200s */
  int sent, answered, ok, slow, failed;
  double worst;
  char first_failure[160];
} probe_set;

static probe_set *cur_probes;
static int probes_out;

static void probe_result(conn *c, int status, const char *why) {
  probe_set *p = cur_probes;
  double t = now_s() - c->t_open;
  p->answered++;
  if (t > p->worst)
    p->worst = t;
  if (status == 200) {
    p->ok++;
    lat_add(c->rq == &probe_health ? &p->health : &p->infer, t);
    if (t > opt.probe_limit)
      p->slow++;
  } else {
    p->failed++;
    if (!p->first_failure[0])
      snprintf(p->first_failure, sizeof p->first_failure, "%s: %s after %.2f s",
               c->rq == &probe_health ? "health" : "infer", why, t);
  }
  probes_out--;
  conn_free(c);
}

static void probe_start(int kind) {
  conn *c = conn_open(R_PROBE, opt.probe_src, kind);
  cur_probes->sent++;
  probes_out++;
  if (!c) {
    cur_probes->answered++;
    cur_probes->failed++;
    probes_out--;
    if (!cur_probes->first_failure[0])
      snprintf(cur_probes->first_failure, sizeof cur_probes->first_failure,
               "connect: %s", strerror(terr.last_errno));
    return;
  }
  c->rq = kind ? &probe_infer : &probe_health;
}

static void probe_set_free(probe_set *p) {
  free(p->health.v);
  free(p->infer.v);
}

static void req_free(req *r) {
  free(r->bytes);
  free(r->ok_lat.v);
}

static void print_probes(const char *what, probe_set *p) {
  note("%s: %d probes, %d answered 200 (%d over %.1f s), %d failed; health p50 %.1f ms "
       "max %.1f ms; infer p50 %.1f ms max %.1f ms%s%s",
       what, p->sent, p->ok, p->slow, opt.probe_limit, p->failed, lat_ms(&p->health, 0.5),
       lat_ms(&p->health, 1), lat_ms(&p->infer, 0.5), lat_ms(&p->infer, 1),
       p->first_failure[0] ? "; first failure: " : "", p->first_failure);
}

/* ---- hold: idle, slowloris and trickle sockets ------------------------------------------ */

enum { K_IDLE, K_SLOW, K_TRICKLE, K_N };
static const char *const kind_name[K_N] = {"idle", "slowloris", "trickle"};

static struct {
  int want[K_N];
  int open[K_N], peak[K_N], opened[K_N], connect_err[K_N];
  int closed[K_N], answered_status[K_N], early[K_N], overdue[K_N];
  lat life[K_N];
  double limit[K_N];
  int peak_total, open_total;
  int reconnect;
  double t_end;
  int phase;             /* 0 baseline, 1 hold, 2 wind down */
  int n_baseline;
  double next_probe;
  int probe_kind;
  char slow_head[256], trickle_head[512];
  uint32_t base;
  int next_id;
} hd;

static int kind_of_role(int role) {
  return role == R_IDLE ? K_IDLE : role == R_SLOW ? K_SLOW : K_TRICKLE;
}

static void hostile_open(int k, int id) {
  static const int roles[K_N] = {R_IDLE, R_SLOW, R_TRICKLE};
  conn *c = conn_open(roles[k], addr_nth(hd.base, (unsigned)(id / opt.per_addr)), id);
  if (!c)
    hd.connect_err[k]++;
}

static void hold_connected(conn *c) {
  if (c->role == R_PROBE) {
    conn_send_req(c, c->rq, 0);
    return;
  }
  int k = kind_of_role(c->role);
  hd.opened[k]++;
  hd.open[k]++;
  hd.open_total++;
  if (hd.open[k] > hd.peak[k])
    hd.peak[k] = hd.open[k];
  if (hd.open_total > hd.peak_total)
    hd.peak_total = hd.open_total;
  c->state = S_HOLDING;
  if (c->role == R_SLOW) {
    send_small(c, hd.slow_head, strlen(hd.slow_head));
    c->t_next = now_s() + opt.interval;
  } else if (c->role == R_TRICKLE) {
    send_small(c, hd.trickle_head, strlen(hd.trickle_head));
    send_small(c, "{", 1);
    c->t_next = now_s() + opt.interval;
  }
}

static void hostile_closed(conn *c, int why) {
  int k = kind_of_role(c->role);
  double life = now_s() - c->t_open;
  if (why == GONE_CONNECT) {
    hd.connect_err[k]++;
  } else {
    hd.open[k]--;
    hd.open_total--;
    hd.closed[k]++;
    if (c->rlen)
      hd.answered_status[k]++;
    lat_add(&hd.life[k], life);
    if (life < hd.limit[k] / 2)
      hd.early[k]++;
    if (life > hd.limit[k] + opt.slack && !c->overdue)
      hd.overdue[k]++;
  }
  int id = c->id;
  conn_free(c);
  /* Reopen what the server closed after holding it; one refused at once
   * (or never connected) is not retried, so a refusing server is not
   * hammered in a tight loop. */
  if (hd.reconnect && hd.phase == 1 && why != GONE_CONNECT && life >= hd.limit[k] / 2)
    hostile_open(k, id);
}

static void hold_answer(conn *c, const resp *r) {
  if (c->role == R_PROBE) {
    char why[32];
    snprintf(why, sizeof why, "status %d", r->status);
    probe_result(c, r->status, why);
    return;
  }
  hostile_closed(c, GONE_EOF);
}

static void hold_gone(conn *c, int why) {
  if (c->role == R_PROBE) {
    static const char *const whys[] = {"connect failed", "closed", "reset", "no answer",
                                       "malformed answer"};
    probe_result(c, 0, whys[why]);
    return;
  }
  hostile_closed(c, why);
}

static void hold_timer(conn *c) {
  if (c->state != S_HOLDING)
    return;
  if (c->role == R_SLOW) {
    char line[64];
    int n = snprintf(line, sizeof line, "X-Slow-%d: %d\r\n", c->pad_lines++, c->id);
    if (send_small(c, line, (size_t)n) < 0) {
      hostile_closed(c, GONE_RESET);
      return;
    }
  } else if (c->role == R_TRICKLE) {
    if (send_small(c, " ", 1) < 0) {
      hostile_closed(c, GONE_RESET);
      return;
    }
  }
  c->t_next = now_s() + opt.interval;
}

static const handlers hold_h = {hold_connected, hold_answer, hold_gone, hold_timer};

static void hold_tick(void) {
  double t = now_s();
  /* Overdue: still open past its limit and the slack. */
  for (int i = 0; i < n_conns; i++) {
    conn *c = table[i];
    if (c->role == R_PROBE || c->state == S_CONNECTING || c->overdue)
      continue;
    int k = kind_of_role(c->role);
    if (t - c->t_open > hd.limit[k] + opt.slack) {
      c->overdue = 1;
      hd.overdue[k]++;
    }
  }
  if (hd.phase == 1 && t >= hd.next_probe) {
    probe_start(hd.probe_kind);
    hd.probe_kind ^= 1;
    hd.next_probe = t + opt.probe_every;
  }
}

static int baseline_done(void) {
  if (!probes_out && cur_probes->sent < hd.n_baseline) {
    probe_start(cur_probes->sent & 1);
  }
  return cur_probes->sent >= hd.n_baseline && !probes_out;
}

static int hold_done(void) {
  if (now_s() < hd.t_end)
    return 0;
  hd.phase = 2;
  return !probes_out;
}

static void probes_build(void) {
  req_build(&probe_health, "health");
  req_build(&probe_infer, opt.probe_req);
}

static int mode_hold(void) {
  hd.want[K_IDLE] = opt.n_idle;
  hd.want[K_SLOW] = opt.n_slow;
  hd.want[K_TRICKLE] = opt.n_trickle;
  hd.limit[K_IDLE] = opt.limit_idle;
  hd.limit[K_SLOW] = opt.limit_header;
  hd.limit[K_TRICKLE] = opt.limit_body;
  hd.reconnect = opt.reconnect;
  hd.base = opt.src;
  hd.n_baseline = opt.baseline;
  int total = opt.n_idle + opt.n_slow + opt.n_trickle;
  raise_nofile(2L * total + 256);
  snprintf(hd.slow_head, sizeof hd.slow_head,
           "POST /v2/models/blazeface_front/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n");
  snprintf(hd.trickle_head, sizeof hd.trickle_head,
           "POST /v2/models/blazeface_front/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
           "Content-Type: application/json\r\nContent-Length: 67108864\r\n\r\n");
  probes_build();
  H = &hold_h;

  probe_set base = {0}, during = {0};
  cur_probes = &base;
  loop(baseline_done, NULL);
  print_probes("baseline (no hostile sockets)", &base);

  note("hold: %d idle, %d slowloris, %d trickle sockets (%d per source address, a byte or "
       "line every %.1f s%s) for %.0f s; phase limits idle %.1f s, header %.1f s, body %.1f "
       "s, slack %.1f s; a probe every %.2f s",
       opt.n_idle, opt.n_slow, opt.n_trickle, opt.per_addr, opt.interval,
       opt.reconnect ? ", reopened when closed" : "", opt.seconds, opt.limit_idle,
       opt.limit_header, opt.limit_body, opt.slack, opt.probe_every);
  hd.phase = 1;
  cur_probes = &during;
  int id = 0;
  for (int k = 0; k < K_N; k++)
    for (int i = 0; i < hd.want[k]; i++)
      hostile_open(k, id++);
  hd.t_end = now_s() + opt.seconds;
  hd.next_probe = now_s() + 0.2; /* let the sockets connect first */
  loop(hold_done, hold_tick);
  hd.phase = 2;
  hold_tick(); /* the last overdue marks */
  while (n_conns)
    conn_free(table[0]);
  print_probes("probes while hostile sockets are open", &during);
  check(base.ok == base.sent && base.sent > 0, "hold: baseline probes all 200 (%d of %d)",
        base.ok, base.sent);
  check(hd.peak_total >= total,
        "hold: %d hostile sockets open at once (peak %d; idle %d, slowloris %d, trickle %d; "
        "connect failures %d)",
        total, hd.peak_total, hd.peak[K_IDLE], hd.peak[K_SLOW], hd.peak[K_TRICKLE],
        hd.connect_err[K_IDLE] + hd.connect_err[K_SLOW] + hd.connect_err[K_TRICKLE]);
  for (int k = 0; k < K_N; k++) {
    if (!hd.want[k])
      continue;
    note("%s: %d opened, %d closed by the server (%d with an answer first); lifetime min "
         "%.0f ms p50 %.0f ms max %.0f ms",
         kind_name[k], hd.opened[k], hd.closed[k], hd.answered_status[k], lat_ms(&hd.life[k], 0),
         lat_ms(&hd.life[k], 0.5), lat_ms(&hd.life[k], 1));
    check(hd.closed[k] > 0 && hd.overdue[k] == 0,
          "hold: %s sockets closed by the server within %.1f s + %.1f s (closed %d, still open "
          "or closed later: %d)",
          kind_name[k], hd.limit[k], opt.slack, hd.closed[k], hd.overdue[k]);
    check(hd.early[k] == 0,
          "hold: %s sockets held, not refused (%d closed before half the limit, %.1f s)",
          kind_name[k], hd.early[k], hd.limit[k] / 2);
  }
  check(during.sent > 0 && during.ok == during.sent && during.slow == 0,
        "hold: every probe during the hold answered 200 within %.1f s (%d of %d; %d slower; "
        "worst %.0f ms; health p50 %.1f ms vs %.1f ms before, infer p50 %.1f ms vs %.1f ms "
        "before)",
        opt.probe_limit, during.ok, during.sent, during.slow, during.worst * 1e3,
        lat_ms(&during.health, 0.5), lat_ms(&base.health, 0.5), lat_ms(&during.infer, 0.5),
        lat_ms(&base.infer, 0.5));
  probe_set_free(&base);
  probe_set_free(&during);
  for (int k = 0; k < K_N; k++)
    free(hd.life[k].v);
  req_free(&probe_health);
  req_free(&probe_infer);
  return 0;
}

/* ---- cap: the per-client connection limit ----------------------------------------------- */

static struct {
  int held_ok, held_failed, held_pings, held_alive;
  int extra_refused, extra_served, extra_pending, extra_unanswered;
  int phase;
  req health;
  char first_extra[160];
} cp;

static void cap_connected(conn *c) { conn_send_req(c, &cp.health, 0); }

static void cap_answer(conn *c, const resp *r) {
  if (c->role == R_HELD) {
    if (r->status == 200 && !r->close) {
      if (!c->reused)
        cp.held_ok++;
      else
        cp.held_pings++;
      c->reused = 1;
      c->rlen = 0;
      c->state = S_PAUSED;
      c->t_next = now_s() + 0.4; /* keep it busy: it must never look idle */
      ep_set(c, EPOLLIN);
    } else {
      cp.held_failed++;
      cp.held_alive--;
      conn_free(c);
    }
    return;
  }
  /* An extra connection above the cap. */
  cp.extra_pending--;
  if (r->status == 200) {
    cp.extra_served++;
  } else if (is_refusal(r->status) && r->retry_after) {
    cp.extra_refused++;
  } else if (!cp.first_extra[0]) {
    snprintf(cp.first_extra, sizeof cp.first_extra, "status %d%s", r->status,
             is_refusal(r->status) ? " without Retry-After" : "");
  }
  conn_free(c);
}

static void cap_gone(conn *c, int why) {
  if (c->role == R_HELD) {
    cp.held_failed++;
    cp.held_alive--;
    conn_free(c);
    return;
  }
  cp.extra_pending--;
  if (why == GONE_TIMEOUT) {
    cp.extra_unanswered++;
  } else {
    cp.extra_refused++; /* closed, reset or refused before an answer */
  }
  conn_free(c);
}

static void cap_timer(conn *c) {
  if (c->role == R_HELD && c->state == S_PAUSED)
    conn_send_req(c, &cp.health, 0);
}

static const handlers cap_h = {cap_connected, cap_answer, cap_gone, cap_timer};

static double cap_until;
static int cap_held_ready(void) {
  return cp.held_ok + cp.held_failed >= opt.cap || now_s() > cap_until;
}
static int cap_extras_done(void) { return cp.extra_pending == 0 || now_s() > cap_until; }
static int cap_wait(void) { return now_s() > cap_until; }

static int mode_cap(void) {
  raise_nofile(opt.cap + opt.extra + 256);
  req_build(&cp.health, "health");
  H = &cap_h;
  uint32_t a = opt.src, b = addr_nth(opt.src, 1);
  char as[32], bs[32];
  struct in_addr ia = {htonl(a)}, ib = {htonl(b)};
  snprintf(as, sizeof as, "%s", inet_ntoa(ia));
  snprintf(bs, sizeof bs, "%s", inet_ntoa(ib));
  note("cap: %d keep-alive connections from %s, then %d more from it; %s alongside", opt.cap,
       as, opt.extra, bs);
  for (int i = 0; i < opt.cap; i++)
    if (conn_open(R_HELD, a, i))
      cp.held_alive++;
  cap_until = now_s() + 10;
  loop(cap_held_ready, NULL);
  check(cp.held_ok == opt.cap, "cap: %d connections from %s up to the cap answered 200 (%d)",
        opt.cap, as, cp.held_ok);

  double t0 = now_s();
  for (int i = 0; i < opt.extra; i++) {
    conn *c = conn_open(R_EXTRA, a, opt.cap + i);
    if (c)
      cp.extra_pending++;
    else
      cp.extra_refused++; /* refused at connect: that is a refusal too */
  }
  double save = opt.timeout;
  opt.timeout = 5; /* an extra that is held open this long was not refused */
  cap_until = now_s() + 6;
  loop(cap_extras_done, NULL);
  opt.timeout = save;
  cp.extra_unanswered += cp.extra_pending;
  note("cap: extras resolved in %.0f ms", (now_s() - t0) * 1e3);
  check(cp.extra_refused == opt.extra,
        "cap: the %d connections above the cap from %s refused (%d refused: closed or "
        "429/503; %d served 200; %d held open 5 s without an answer%s%s)",
        opt.extra, as, cp.extra_refused, cp.extra_served, cp.extra_unanswered,
        cp.first_extra[0] ? "; other: " : "", cp.first_extra);
  while (n_conns && cp.extra_pending > 0) { /* drop extras still open */
    for (int i = 0; i < n_conns; i++)
      if (table[i]->role == R_EXTRA) {
        conn_free(table[i]);
        cp.extra_pending--;
        break;
      }
  }

  double tb = now_s();
  int sb = http_get(b, "/v2/health/ready", NULL, 5);
  check(sb == 200, "cap: another address (%s) served meanwhile: %d in %.0f ms", bs, sb,
        (now_s() - tb) * 1e3);
  int pings = cp.held_pings;
  cap_until = now_s() + 1.0; /* two more pings each */
  loop(cap_wait, NULL);
  check(cp.held_failed == 0 && cp.held_pings > pings,
        "cap: the %d connections under the cap kept working (%d pings answered 200 after the "
        "extras, %d failed)",
        opt.cap, cp.held_pings - pings, cp.held_failed);
  while (n_conns)
    conn_free(table[0]);
  int sa = -1;
  double ta = now_s();
  while (now_s() - ta < 3) {
    sa = http_get(a, "/v2/health/ready", NULL, 2);
    if (sa == 200)
      break;
    struct timespec ts = {0, 100000000};
    nanosleep(&ts, NULL);
  }
  check(sa == 200, "cap: %s served again once its connections closed (%d after %.0f ms)", as,
        sa, (now_s() - ta) * 1e3);
  req_free(&cp.health);
  return 0;
}

/* ---- refuse: a body that could never be admitted ------------------------------------------ */

static int ref_done;
static resp ref_resp;
static int ref_why = -1;
static double ref_t;
static req ref_req;

static void ref_connected(conn *c) { conn_send_req(c, &ref_req, ref_req.head_len); }
static void ref_answer(conn *c, const resp *r) {
  ref_resp = *r;
  ref_t = now_s() - c->t_req;
  ref_done = 1;
  conn_free(c);
}
static void ref_gone(conn *c, int why) {
  ref_why = why;
  ref_t = now_s() - c->t_req;
  ref_done = 1;
  conn_free(c);
}
static void ref_timer(conn *c) { (void)c; }
static const handlers ref_h = {ref_connected, ref_answer, ref_gone, ref_timer};
static int ref_is_done(void) { return ref_done; }

static int mode_refuse(void) {
  if (!opt.n_accept)
    die("refuse: give --accept STATUS[,STATUS]");
  char head[512];
  snprintf(head, sizeof head,
           "POST /v2/models/blazeface_front/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
           "Content-Type: application/json\r\nContent-Length: %llu\r\n\r\n",
           opt.content_length);
  ref_req.bytes = head;
  ref_req.len = ref_req.head_len = strlen(head);
  H = &ref_h;
  double save = opt.timeout;
  opt.timeout = opt.seconds; /* the answer must come before any body byte */
  if (!conn_open(R_ONESHOT, opt.src, 0))
    die("refuse: cannot connect: %s", strerror(terr.last_errno));
  loop(ref_is_done, NULL);
  opt.timeout = save;
  int good = 0;
  for (int i = 0; i < opt.n_accept; i++)
    if (ref_resp.status == opt.accept[i])
      good = 1;
  if (is_refusal(ref_resp.status) && !ref_resp.retry_after)
    good = 0;
  char want[64] = "";
  for (int i = 0; i < opt.n_accept; i++)
    snprintf(want + strlen(want), sizeof want - strlen(want), "%s%d", i ? "/" : "",
             opt.accept[i]);
  static const char *const whys[] = {"connect failed", "closed without an answer",
                                     "reset without an answer", "no answer",
                                     "malformed answer"};
  char got[96];
  if (ref_resp.status)
    snprintf(got, sizeof got, "%d%s", ref_resp.status,
             is_refusal(ref_resp.status) && !ref_resp.retry_after ? " without Retry-After" : "");
  else
    snprintf(got, sizeof got, "%s", ref_why >= 0 ? whys[ref_why] : "nothing");
  check(good,
        "refuse: Content-Length %llu with no body sent: want %s within %.0f s, got %s after "
        "%.0f ms",
        opt.content_length, want, opt.seconds, got, ref_t * 1e3);
  return 0;
}

/* ---- charge: announced bytes are not charged before they arrive --------------------------- */

static struct {
  int trickle_open, trickle_closed;
  int phase;             /* 0 connecting, 1 settling, 2 probing */
  double t_next_phase;
  int probe_next;
} ch;

static void charge_connected(conn *c) {
  if (c->role == R_PROBE) {
    conn_send_req(c, c->rq, 0);
    return;
  }
  ch.trickle_open++;
  send_small(c, hd.trickle_head, strlen(hd.trickle_head));
  send_small(c, "{", 1);
  c->state = S_HOLDING;
  c->t_next = now_s() + opt.interval;
}
static void charge_answer(conn *c, const resp *r) {
  if (c->role == R_PROBE) {
    char why[32];
    snprintf(why, sizeof why, "status %d", r->status);
    probe_result(c, r->status, why);
    return;
  }
  ch.trickle_open--;
  ch.trickle_closed++;
  conn_free(c);
}
static void charge_gone(conn *c, int why) {
  if (c->role == R_PROBE) {
    static const char *const whys[] = {"connect failed", "closed", "reset", "no answer",
                                       "malformed answer"};
    probe_result(c, 0, whys[why]);
    return;
  }
  if (why != GONE_CONNECT)
    ch.trickle_open--;
  ch.trickle_closed++;
  conn_free(c);
}
static void charge_timer(conn *c) {
  if (c->role == R_TRICKLE && send_small(c, " ", 1) == 0)
    c->t_next = now_s() + opt.interval;
}
static const handlers charge_h = {charge_connected, charge_answer, charge_gone, charge_timer};

static int charge_done(void) {
  double t = now_s();
  if (ch.phase == 0 && (ch.trickle_open + ch.trickle_closed >= opt.n_trickle || t > ch.t_next_phase)) {
    ch.phase = 1;
    ch.t_next_phase = t + 0.5; /* the server reads the headers and starts each body */
  } else if (ch.phase == 1 && t >= ch.t_next_phase) {
    ch.phase = 2;
  }
  if (ch.phase == 2 && !probes_out) {
    if (cur_probes->sent >= opt.probes)
      return 1;
    probe_start(1);
  }
  return 0;
}

static int mode_charge(void) {
  raise_nofile(opt.n_trickle + 256);
  snprintf(hd.trickle_head, sizeof hd.trickle_head,
           "POST /v2/models/blazeface_front/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
           "Content-Type: application/json\r\nContent-Length: 67108864\r\n\r\n");
  probes_build();
  H = &charge_h;
  probe_set ps = {0};
  cur_probes = &ps;
  for (int i = 0; i < opt.n_trickle; i++)
    conn_open(R_TRICKLE, addr_nth(opt.src, (unsigned)(i / opt.per_addr)), i);
  ch.t_next_phase = now_s() + 5;
  loop(charge_done, NULL);
  int still = ch.trickle_open;
  while (n_conns)
    conn_free(table[0]);
  print_probes("charge: infers while the uploads are open", &ps);
  check(still == opt.n_trickle,
        "charge: the %d uploads announcing 64 MiB were open throughout (%d still open, %d "
        "closed)",
        opt.n_trickle, still, ch.trickle_closed);
  check(ps.ok == opt.probes,
        "charge: every infer beside %d open 64 MiB uploads answered 200 (%d of %d%s%s)",
        opt.n_trickle, ps.ok, opt.probes, ps.first_failure[0] ? "; first failure: " : "",
        ps.first_failure);
  probe_set_free(&ps);
  req_free(&probe_health);
  req_free(&probe_infer);
  return 0;
}

/* ---- main ------------------------------------------------------------------------------ */

static void usage(void) {
  fputs(
      "usage: es_hostile MODE --port N [options]\n"
      "modes:\n"
      "  flood   --clients C --seconds S --req [W:]KIND[:PARAM]... [--backoff-max S] [--drain S]\n"
      "  hold    [--idle K] [--slowloris K] [--trickle K] --seconds S [--interval T]\n"
      "          [--limit-idle S] [--limit-header S] [--limit-body S] [--slack S] [--no-reconnect]\n"
      "          [--probe-every S] [--probe-limit S] [--baseline N] [--probe-req KIND]\n"
      "  cap     --cap P [--extra E]\n"
      "  refuse  --content-length N --accept STATUS[,STATUS] [--seconds S]\n"
      "  charge  [--trickle K] [--probes N] [--interval T] [--probe-req KIND]\n"
      "  soak    --clients C --requests N --req [W:]KIND[:PARAM]... [--max-seconds S]\n"
      "          [--server-pid PID] [--report-every N] [--warmup F] [--rss-tolerance F]\n"
      "          [--idle-wait S]\n"
      "common: --src A.B.C.D (first source address) --per-addr M (connections per address)\n"
      "        --probe-src A.B.C.D --timeout S (an answer must come within S s) --seed N\n"
      "request kinds: front, front-json, back, cls, rec:W, det:S, det:HxW, face:FILE,\n"
      "        face-jpeg:FILE, ocr:FILE, ocr-jpeg:FILE, health\n",
      stderr);
  exit(2);
}

static uint32_t parse_addr(const char *s) {
  struct in_addr a;
  if (inet_pton(AF_INET, s, &a) != 1)
    die("'%s' is not an IPv4 address", s);
  return ntohl(a.s_addr);
}

static double num(const char *flag, const char *v, double lo, double hi) {
  char *end;
  double x = v ? strtod(v, &end) : NAN;
  if (!v || *end || !(x >= lo && x <= hi))
    die("%s wants a number in %g..%g, got '%s'", flag, lo, hi, v ? v : "(nothing)");
  return x;
}

int main(int argc, char **argv) {
  if (argc < 2)
    usage();
  opt.mode = argv[1];
  opt.host = "127.0.0.1";
  opt.per_addr = 8;
  opt.clients = 100;
  opt.seconds = 10;
  opt.timeout = 60;
  opt.backoff_max = 0.5;
  opt.drain = 60;
  opt.interval = 1;
  opt.limit_idle = opt.limit_header = 2;
  opt.limit_body = 3;
  opt.slack = 3;
  opt.probe_every = 0.25;
  opt.probe_limit = 2;
  opt.baseline = 10;
  opt.reconnect = 1;
  opt.cap = 16;
  opt.extra = 8;
  opt.n_trickle = 0;
  opt.probes = 10;
  opt.requests = 1000000;
  opt.report_every = 10000;
  opt.warmup = 0.1;
  opt.rss_tolerance = 0.02;
  opt.probe_req = "front";
  opt.src = parse_addr("127.0.1.1");
  opt.probe_src = parse_addr("127.0.0.1");
  int charge_trickle_set = 0;
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define TAKE (i++, v)
    if (!strcmp(a, "--port"))
      opt.port = (int)num(a, TAKE, 1, 65535);
    else if (!strcmp(a, "--host"))
      opt.host = TAKE;
    else if (!strcmp(a, "--src"))
      opt.src = parse_addr(TAKE ? v : "");
    else if (!strcmp(a, "--probe-src"))
      opt.probe_src = parse_addr(TAKE ? v : "");
    else if (!strcmp(a, "--per-addr"))
      opt.per_addr = (int)num(a, TAKE, 1, 1 << 20);
    else if (!strcmp(a, "--clients"))
      opt.clients = (int)num(a, TAKE, 1, 1 << 20);
    else if (!strcmp(a, "--seconds"))
      opt.seconds = num(a, TAKE, 0.01, 1e6);
    else if (!strcmp(a, "--timeout"))
      opt.timeout = num(a, TAKE, 0.01, 1e6);
    else if (!strcmp(a, "--backoff-max"))
      opt.backoff_max = num(a, TAKE, 0, 60);
    else if (!strcmp(a, "--drain"))
      opt.drain = num(a, TAKE, 0, 1e6);
    else if (!strcmp(a, "--req"))
      req_add(TAKE ? v : "");
    else if (!strcmp(a, "--idle"))
      opt.n_idle = (int)num(a, TAKE, 0, 1 << 20);
    else if (!strcmp(a, "--slowloris"))
      opt.n_slow = (int)num(a, TAKE, 0, 1 << 20);
    else if (!strcmp(a, "--trickle")) {
      opt.n_trickle = (int)num(a, TAKE, 0, 1 << 20);
      charge_trickle_set = 1;
    } else if (!strcmp(a, "--interval"))
      opt.interval = num(a, TAKE, 0.01, 3600);
    else if (!strcmp(a, "--limit-idle"))
      opt.limit_idle = num(a, TAKE, 0, 3600);
    else if (!strcmp(a, "--limit-header"))
      opt.limit_header = num(a, TAKE, 0, 3600);
    else if (!strcmp(a, "--limit-body"))
      opt.limit_body = num(a, TAKE, 0, 3600);
    else if (!strcmp(a, "--slack"))
      opt.slack = num(a, TAKE, 0, 3600);
    else if (!strcmp(a, "--no-reconnect"))
      opt.reconnect = 0;
    else if (!strcmp(a, "--probe-every"))
      opt.probe_every = num(a, TAKE, 0.001, 3600);
    else if (!strcmp(a, "--probe-limit"))
      opt.probe_limit = num(a, TAKE, 0.001, 3600);
    else if (!strcmp(a, "--baseline"))
      opt.baseline = (int)num(a, TAKE, 1, 1 << 20);
    else if (!strcmp(a, "--probe-req"))
      opt.probe_req = TAKE;
    else if (!strcmp(a, "--cap"))
      opt.cap = (int)num(a, TAKE, 1, 1 << 20);
    else if (!strcmp(a, "--extra"))
      opt.extra = (int)num(a, TAKE, 1, 1 << 20);
    else if (!strcmp(a, "--content-length"))
      opt.content_length = (unsigned long long)num(a, TAKE, 0, 1e18);
    else if (!strcmp(a, "--accept")) {
      const char *p = TAKE;
      if (!p)
        usage();
      while (*p && opt.n_accept < 4) {
        opt.accept[opt.n_accept++] = atoi(p);
        p += strcspn(p, ",");
        p += *p == ',';
      }
    } else if (!strcmp(a, "--probes"))
      opt.probes = (int)num(a, TAKE, 1, 1 << 20);
    else if (!strcmp(a, "--requests"))
      opt.requests = (long long)num(a, TAKE, 1, 1e12);
    else if (!strcmp(a, "--max-seconds"))
      opt.max_seconds = num(a, TAKE, 0, 1e9);
    else if (!strcmp(a, "--server-pid"))
      opt.server_pid = (int)num(a, TAKE, 1, 1 << 30);
    else if (!strcmp(a, "--report-every"))
      opt.report_every = (long long)num(a, TAKE, 1, 1e12);
    else if (!strcmp(a, "--warmup"))
      opt.warmup = num(a, TAKE, 0, 1);
    else if (!strcmp(a, "--rss-tolerance"))
      opt.rss_tolerance = num(a, TAKE, 0, 10);
    else if (!strcmp(a, "--idle-wait"))
      opt.idle_wait = num(a, TAKE, 0, 3600);
    else if (!strcmp(a, "--seed"))
      rng_state = (uint64_t)num(a, TAKE, 1, 1e18) * 0x9e3779b97f4a7c15ull | 1;
    else {
      fprintf(stderr, "es_hostile: unknown or incomplete option '%s'\n", a);
      usage();
    }
#undef TAKE
    if (i >= argc)
      usage();
  }
  if (!opt.port)
    die("--port is required");
  if (!strcmp(opt.mode, "charge") && !charge_trickle_set)
    opt.n_trickle = 4;
  dst.sin_family = AF_INET;
  dst.sin_port = htons((uint16_t)opt.port);
  dst.sin_addr.s_addr = htonl(parse_addr(opt.host));
  ep = epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0)
    die("epoll_create1: %s", strerror(errno));
  if (!strcmp(opt.mode, "flood"))
    mode_flood();
  else if (!strcmp(opt.mode, "hold"))
    mode_hold();
  else if (!strcmp(opt.mode, "cap"))
    mode_cap();
  else if (!strcmp(opt.mode, "refuse"))
    mode_refuse();
  else if (!strcmp(opt.mode, "charge"))
    mode_charge();
  else if (!strcmp(opt.mode, "soak"))
    mode_soak();
  else
    usage();
  for (int i = 0; i < opt.n_reqs; i++)
    req_free(&opt.reqs[i]);
  free(opt.reqs);
  free(table);
  close(ep);
  return n_fail ? 1 : 0;
}
