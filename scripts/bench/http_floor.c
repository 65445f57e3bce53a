/* The floor of an HTTP request's cost on this machine: what the kernel's
 * loopback TCP alone charges a server to receive a request and send an answer
 * of given sizes, with no HTTP library, no parsing and no copy beyond the
 * receive itself.
 *
 * bench_http.sh runs it beside `edgeserve serve` to say how much of the
 * server's overhead over the in-process runtime is the transport (which no
 * server can avoid) and how much is the server. It is deliberately the
 * cheapest possible server: one blocking thread per connection (no event
 * loop, no wake-ups), one reused buffer, reads of a fixed size (the same as
 * edgeserve's HTTP library uses, so the syscall count matches), the request
 * framed by Content-Length only, and a fixed answer of the given size sent
 * from one preallocated buffer.
 *
 *   http_floor PORT READ_BYTES ANSWER_BYTES
 * Prints "listening on 127.0.0.1:PORT" when ready (PORT 0: a free one);
 * runs until killed.
 * Loopback only; a benchmark tool, not a server (no limits, no timeouts). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static size_t read_bytes;
static char *answer;
static size_t answer_len;

/* Reads until n bytes are at buf[0..n) (have counts those already there). */
static int recv_until(int fd, char **buf, size_t *cap, size_t *have, size_t n) {
  while (*have < n) {
    if (*cap - *have < read_bytes) {
      size_t c = *cap * 2 > *have + read_bytes ? *cap * 2 : *have + read_bytes;
      char *p = realloc(*buf, c);
      if (!p)
        return -1;
      *buf = p;
      *cap = c;
    }
    ssize_t r = recv(fd, *buf + *have, read_bytes, 0);
    if (r <= 0)
      return -1;
    *have += (size_t)r;
  }
  return 0;
}

static void *serve(void *arg) {
  int fd = (int)(intptr_t)arg;
  size_t cap = (size_t)8 << 20, have = 0;
  char *buf = malloc(cap);
  while (buf) {
    /* The header: read until its blank line. */
    char *end = NULL;
    while (!(end = memmem(buf, have, "\r\n\r\n", 4)))
      if (recv_until(fd, &buf, &cap, &have, have + 1) < 0)
        goto out;
    size_t head = (size_t)(end + 4 - buf), body = 0;
    for (char *p = buf; p < end; p++)
      if ((p == buf || p[-1] == '\n') && !strncasecmp(p, "content-length:", 15)) {
        body = strtoull(p + 15, NULL, 10);
        break;
      }
    if (recv_until(fd, &buf, &cap, &have, head + body) < 0)
      break;
    for (size_t off = 0; off < answer_len;) {
      ssize_t w = send(fd, answer + off, answer_len - off, MSG_NOSIGNAL);
      if (w <= 0)
        goto out;
      off += (size_t)w;
    }
    have -= head + body;
    memmove(buf, buf + head + body, have); /* a pipelined next request */
  }
out:
  close(fd);
  free(buf);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s PORT READ_BYTES ANSWER_BYTES\n", argv[0]);
    return 2;
  }
  int port = atoi(argv[1]); /* 0: any free port */
  read_bytes = strtoull(argv[2], NULL, 10);
  size_t body = strtoull(argv[3], NULL, 10);
  if (port < 0 || port > 65535 || read_bytes == 0) {
    fprintf(stderr, "http_floor: bad port or read size\n");
    return 2;
  }
  char head[128];
  int h = snprintf(head, sizeof head, "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n\r\n", body);
  answer_len = (size_t)h + body;
  answer = malloc(answer_len);
  if (!answer)
    return 1;
  memcpy(answer, head, (size_t)h);
  memset(answer + h, 0x5a, body);
  int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 128)) {
    perror("http_floor");
    return 1;
  }
  socklen_t al = sizeof a;
  getsockname(s, (struct sockaddr *)&a, &al);
  port = ntohs(a.sin_port);
  printf("listening on 127.0.0.1:%d\n", port);
  fflush(stdout);
  for (;;) {
    int fd = accept(s, NULL, NULL);
    if (fd < 0)
      continue;
    /* As an HTTP server answers: no Nagle delay on the last segment. */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    pthread_t t;
    if (pthread_create(&t, NULL, serve, (void *)(intptr_t)fd) == 0)
      pthread_detach(t);
    else
      close(fd);
  }
}
