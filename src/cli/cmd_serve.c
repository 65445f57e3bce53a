/* edgeserve serve: the KServe v2 HTTP server (include/edgeserve/server.h).
 *
 * Flags override the config file, which overrides the defaults. The memory
 * budget defaults to "auto" in the library's config (es_server_config's
 * memory_budget_auto: what the process's cgroup, or the machine, allows
 * below its soft watermark, minus what is already used), so admission says
 * 503 before the kernel's limit is reached; --memory 0 (or "memory_budget":
 * 0) is the only way to run without one. Repository control (loading and
 * unloading models over HTTP) is off unless --repository-control is given
 * with a token from a file (--control-token-file; a token on the command
 * line would show in ps). SIGTERM or SIGINT drains: no new connections,
 * in-flight requests get the grace period, the rest is reported.
 *
 * Process-wide settings (malloc tuning, the environment, signals) are made
 * here, not in the library: a program embedding the server keeps its own.
 *
 * Under systemd (Type=notify, sd_notify(3); without $NOTIFY_SOCKET every
 * call below does nothing): READY=1 once the models are loaded and the port
 * listens, STOPPING=1 when the drain starts, and with WatchdogSec= a
 * WATCHDOG=1 every half period, sent only after the server answered its own
 * GET /v2/health/live: a server whose HTTP threads hang is restarted by the
 * manager, one that merely has work queued is not. */
#include "cli/cli.h"
#include "edgeserve/server.h"

#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

static void serve_usage(FILE *f) {
  fprintf(f,
          "usage: edgeserve serve [--config FILE] [--model-repository DIR] [--host ADDR]\n"
          "                       [--port N] [--workers N] [--memory BYTES|auto|0]\n"
          "                       [--repository-control --control-token-file FILE]\n"
          "                       [--preempt on|off] [--sched priority|edf]\n"
          "                       [--rt-priority N [--rt-levels L]]\n"
          "                       [--cache-dir DIR] [--mlock] [--grace-ms N] [--quiet]\n\n"
          "Serves models over the Open Inference Protocol (KServe v2 REST) on\n"
          "http://ADDR:N/v2 (default 127.0.0.1:8000) with Prometheus metrics on\n"
          "/metrics. Without a config or a repository it serves the target models\n"
          "from $ES_MODEL_DIR (default .cache/models). --memory sets the admission\n"
          "budget for request memory (K/M/G suffixes); auto (the default): the\n"
          "cgroup's (or the machine's) limit at the soft watermark minus what is in\n"
          "use at start; 0: no budget. --repository-control turns on loading and\n"
          "unloading models over HTTP (off by default: 403), for requests with\n"
          "\"Authorization: Bearer TOKEN\", TOKEN the first line of the\n"
          "--control-token-file (16 to 127 visible ASCII characters; keep the file\n"
          "private). SIGTERM/SIGINT: stop accepting, finish in-flight work within\n"
          "--grace-ms (default 10000), report what was cut off. --cache-dir (or\n"
          "\"cache_dir\" in the config, or $EDGESERVE_CACHE_DIR) keeps the weights\n"
          "reordered for this CPU in DIR, so that the next start maps them instead\n"
          "of making them again (es_engine_cache_dir_set). --mlock (or \"mlock\": true)\n"
          "locks every model's weights in RAM; the server does not start when\n"
          "RLIMIT_MEMLOCK is too low for them (ulimit -l, LimitMEMLOCK=), and\n"
          "/metrics shows edgeserve_weights_locked_bytes. --rt-priority N (or\n"
          "\"rt_priority\") runs requests of priority levels below L (--rt-levels,\n"
          "default 1: level 0, the default config's face pipeline) as SCHED_FIFO\n"
          "threads of priority N, and the HTTP threads at N-1, so that the kernel\n"
          "never makes an urgent request share a core with ordinary work; it needs\n"
          "root, CAP_SYS_NICE or ulimit -r >= N (LimitRTPRIO=), or the server does\n"
          "not start.\n");
}

/* The token: the file's first line, its line end dropped. 0, or 2 (a
 * usage error, printed). */
static int read_token(const char *path, es_server_config *cfg) {
  FILE *f = fopen(path, "r");
  char line[ES_SERVER_TOKEN_MAX + 2] = "";
  int got = f && fgets(line, sizeof line, f) != NULL;
  if (f)
    fclose(f);
  line[strcspn(line, "\r\n")] = 0;
  size_t n = strlen(line);
  if (!got || n < 16 || n >= ES_SERVER_TOKEN_MAX) {
    fprintf(stderr, "edgeserve serve: --control-token-file %s: %s\n", path,
            !f ? "cannot be read" : "its first line must be a token of 16 to 127 visible ASCII "
                                    "characters");
    explicit_bzero(line, sizeof line);
    return 2;
  }
  memcpy(cfg->control_token, line, n + 1); /* n < ES_SERVER_TOKEN_MAX */
  explicit_bzero(line, sizeof line);
  return 0;
}

/* Parse the flags into cfg (after the config file, so that they override
 * it). 0, or the exit status: 0 after --help, 2 for a usage error. */
static int parse_flags(int argc, char **argv, es_server_config *cfg, long *grace, int *done) {
  const char *memory = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    char *end = NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      serve_usage(stdout);
      *done = 1;
      return 0;
    } else if (!strcmp(a, "--config") && v) {
      i++;
    } else if (!strcmp(a, "--model-repository") && v) {
      snprintf(cfg->repository, sizeof cfg->repository, "%s", v);
      i++;
    } else if (!strcmp(a, "--host") && v) {
      snprintf(cfg->host, sizeof cfg->host, "%s", v);
      i++;
    } else if (!strcmp(a, "--port") && v) {
      long p = strtol(v, &end, 10);
      if (*end || p < 0 || p > 65535) {
        fprintf(stderr, "edgeserve serve: --port wants 0..65535, got '%s'\n", v);
        return 2;
      }
      cfg->port = (int)p;
      i++;
    } else if (!strcmp(a, "--workers") && v) {
      long w = strtol(v, &end, 10);
      if (*end || w < 0 || w > 1024) {
        fprintf(stderr, "edgeserve serve: --workers wants 0..1024, got '%s'\n", v);
        return 2;
      }
      cfg->runtime.workers = (int)w;
      i++;
    } else if (!strcmp(a, "--memory") && v) {
      memory = v;
      i++;
    } else if (!strcmp(a, "--mlock")) {
      cfg->mlock = 1;
    } else if (!strcmp(a, "--cache-dir") && v) {
      if (strlen(v) >= sizeof cfg->cache_dir) {
        fprintf(stderr, "edgeserve serve: --cache-dir: path too long\n");
        return 2;
      }
      snprintf(cfg->cache_dir, sizeof cfg->cache_dir, "%s", v);
      i++;
    } else if (!strcmp(a, "--preempt") && v) {
      /* on (the default): a run pauses between two steps for a more urgent
       * request; off: a started run always finishes first */
      if (strcmp(v, "on") && strcmp(v, "off")) {
        fprintf(stderr, "edgeserve serve: --preempt wants on or off, got '%s'\n", v);
        return 2;
      }
      cfg->runtime.preempt = !strcmp(v, "on");
      i++;
    } else if ((!strcmp(a, "--rt-priority") || !strcmp(a, "--rt-levels")) && v) {
      /* real-time scheduling of the urgent levels (es_runtime_config) */
      long n = strtol(v, &end, 10);
      int pri = !strcmp(a, "--rt-priority");
      if (*end || n < (pri ? 0 : 1) || n > (pri ? 98 : 16)) {
        fprintf(stderr, "edgeserve serve: %s wants a number in %s, got '%s'\n", a,
                pri ? "0..98" : "1..16", v);
        return 2;
      }
      *(pri ? &cfg->runtime.rt_priority : &cfg->runtime.rt_levels) = (int)n;
      i++;
    } else if (!strcmp(a, "--sched") && v) {
      /* priority (the default) or edf: earliest deadline first among the
       * requests that carry a timeout */
      if (strcmp(v, "priority") && strcmp(v, "edf")) {
        fprintf(stderr, "edgeserve serve: --sched wants priority or edf, got '%s'\n", v);
        return 2;
      }
      cfg->runtime.sched = !strcmp(v, "edf") ? ES_SCHED_EDF : ES_SCHED_PRIORITY;
      i++;
    } else if (!strcmp(a, "--grace-ms") && v) {
      *grace = strtol(v, &end, 10);
      if (*end || *grace < 0) {
        fprintf(stderr, "edgeserve serve: --grace-ms wants a number, got '%s'\n", v);
        return 2;
      }
      i++;
    } else if (!strcmp(a, "--repository-control")) {
      cfg->repository_control = 1;
    } else if (!strcmp(a, "--control-token-file") && v) {
      int rc = read_token(v, cfg);
      if (rc)
        return rc;
      i++;
    } else if (!strcmp(a, "--quiet")) {
      cfg->quiet = 1;
    } else {
      fprintf(stderr, "edgeserve serve: unknown or incomplete option '%s'\n", a);
      serve_usage(stderr);
      return 2;
    }
  }
  if (memory && !strcmp(memory, "auto")) {
    cfg->memory_budget_auto = 1; /* es_server_create computes it */
  } else if (memory) {
    size_t b = 0;
    if (cli_parse_bytes(memory, &b) < 0) {
      fprintf(stderr, "edgeserve serve: --memory wants BYTES (K/M/G), auto, or 0 (no budget), "
                      "got '%s'\n", memory);
      return 2;
    }
    cfg->runtime.memory_budget_bytes = b;
    cfg->memory_budget_auto = 0;
  }
  if (cfg->repository_control && !cfg->control_token[0]) {
    fprintf(stderr, "edgeserve serve: --repository-control needs a token: "
                    "--control-token-file FILE (or \"control_token\" in the config)\n");
    return 2;
  }
  return 0;
}

/* SIGTERM and SIGINT are blocked in every thread (the server's threads
 * inherit the mask) and taken here, so no handler runs inside the library. */
static int wait_signal(const sigset_t *set) {
  int sig = 0;
  while (sigwait(set, &sig) != 0)
    ;
  return sig;
}

/* Milliseconds left until the monotonic deadline (0 when past). */
static int ms_left(const struct timespec *end) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  long long ms = (end->tv_sec - now.tv_sec) * 1000LL + (end->tv_nsec - now.tv_nsec) / 1000000;
  return ms > 0 ? (int)ms : 0;
}

/* 1 when the server answers GET /v2/health/live with 200 within timeout_ms
 * on its own port (a wildcard host is asked on the loopback), else 0. A
 * blocking-free client: one short request, poll for each step. */
static int self_live(const char *host, int port, int timeout_ms) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  if (!strcmp(host, "0.0.0.0") || inet_pton(AF_INET, host, &a.sin_addr) != 1)
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return 0;
  struct timespec end;
  clock_gettime(CLOCK_MONOTONIC, &end);
  end.tv_sec += timeout_ms / 1000;
  end.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
  if (end.tv_nsec >= 1000000000L) {
    end.tv_sec++;
    end.tv_nsec -= 1000000000L;
  }
  int ok = 0;
  struct pollfd p = {.fd = fd, .events = POLLOUT};
  if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0 && errno != EINPROGRESS)
    goto out;
  if (poll(&p, 1, ms_left(&end)) != 1 || !(p.revents & POLLOUT))
    goto out;
  int err = 0;
  socklen_t el = sizeof err;
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0 || err)
    goto out;
  static const char req[] = "GET /v2/health/live HTTP/1.0\r\nHost: localhost\r\n\r\n";
  if (send(fd, req, sizeof req - 1, MSG_NOSIGNAL) != (ssize_t)(sizeof req - 1))
    goto out;
  char buf[64];
  size_t got = 0;
  p.events = POLLIN;
  while (got < 12) { /* "HTTP/1.x 200" */
    if (poll(&p, 1, ms_left(&end)) != 1)
      goto out;
    ssize_t n = recv(fd, buf + got, sizeof buf - 1 - got, 0);
    if (n <= 0)
      goto out;
    got += (size_t)n;
  }
  buf[got] = 0;
  ok = !strncmp(buf, "HTTP/1.", 7) && !strncmp(buf + 9, "200", 3);
out:
  close(fd);
  return ok;
}

/* Waits for SIGTERM or SIGINT. With the manager's watchdog on, wakes every
 * half period to send WATCHDOG=1 when the server is live; a failed probe
 * sends nothing, so the manager's timer runs out if it stays failed. */
static int wait_signal_watchdog(const sigset_t *set, const char *host, int port) {
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0)
    return wait_signal(set);
  uint64_t half = usec / 2;
  for (;;) {
    struct timespec ts = {.tv_sec = (time_t)(half / 1000000),
                          .tv_nsec = (long)(half % 1000000) * 1000};
    int sig = sigtimedwait(set, NULL, &ts);
    if (sig > 0)
      return sig;
    if (errno != EAGAIN)
      continue; /* EINTR */
    /* A quarter period for the answer: the ping still lands in time. */
    int timeout = (int)(usec / 4000);
    if (self_live(host, port, timeout > 0 ? timeout : 1))
      sd_notify(0, "WATCHDOG=1");
  }
}

int cli_cmd_serve(int argc, char **argv) {
  es_server_config cfg;
  es_server_config_default(&cfg);
  const char *md = getenv("ES_MODEL_DIR");
  if (md && *md)
    snprintf(cfg.model_dir, sizeof cfg.model_dir, "%s", md);
  long grace = 10000;
  int done = 0, rc = 0;
  for (int i = 1; i < argc && rc == 0; i++)
    if (!strcmp(argv[i], "--config") && i + 1 < argc &&
        es_server_config_load(&cfg, argv[i + 1]) < 0) {
      fprintf(stderr, "edgeserve serve: %s\n", es_last_error_detail());
      sd_notifyf(0, "STATUS=not started: %s", es_last_error_detail());
      rc = 2;
    }
  if (rc == 0)
    rc = parse_flags(argc, argv, &cfg, &grace, &done);
  if (rc != 0 || done) {
    explicit_bzero(cfg.control_token, sizeof cfg.control_token);
    es_server_config_fini(&cfg);
    return rc;
  }
  /* Request bodies, tensor copies and responses are megabytes each and come
   * and go on connection threads. glibc would give each thread its own heap
   * and keep every heap's high-water mark resident after an overload; two
   * heaps bound that to about twice the peak in flight (itself bounded by
   * max_buffered_bytes), while keeping the freed blocks for the next
   * request (mapping each buffer afresh instead cost ~2,800 page faults and
   * ~6 ms of CPU per det request). Under memory pressure the runtime's
   * monitor gives the free memory back (malloc_trim). Set before the server
   * starts its threads. */
  mallopt(M_ARENA_MAX, 2);
  /* glibc's own give-back on free, fixed: blocks under 32 MiB (a det body is
   * 4.9 MB) come from the heaps, and a heap's free top is returned only past
   * 16 MiB. With the defaults the trim threshold follows the largest freed
   * block (about two bodies), so the heap shrank and grew by ~10 MB every
   * few requests: ~100 page faults per det request on the connection
   * threads (their CPU 5-6 ms per det request; fixed, 3.6-4.2 ms), and
   * every shrink flushed the TLBs of the other cores running the process.
   * Idle memory still goes back: the monitor trims every buddy_decay_ms
   * and under pressure. */
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 16 << 20);
  /* Each connection is a descriptor: the soft limit (often 1024) would cap
   * the server far below its max_connections; the hard one is the
   * operator's. The library keeps max_connections below what is left. */
  struct rlimit nofile;
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    setrlimit(RLIMIT_NOFILE, &nofile);
  }
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, NULL);
  es_server *s;
  rc = es_server_create(&cfg, &s);
  explicit_bzero(cfg.control_token, sizeof cfg.control_token); /* the server has its copy */
  es_server_config_fini(&cfg);
  if (rc < 0) {
    fprintf(stderr, "edgeserve serve: %s\n", es_last_error_detail());
    sd_notifyf(0, "STATUS=not started: %s", es_last_error_detail());
    return 1;
  }
  int port = 0;
  es_server_port(s, &port);
  es_runtime_stats rs;
  es_runtime_stats_get(es_server_runtime(s), &rs);
  es_admission_stats as;
  es_admission_stats_get(es_runtime_admission(es_server_runtime(s)), &as);
  /* Scripts and tests read this line's shape: keep it. */
  fprintf(stderr, "edgeserve: serving %d models on http://%s:%d/v2 (%d workers, budget %zu B)\n",
          rs.models, cfg.host, port, rs.workers, as.memory_budget_bytes);
  fprintf(stderr, "edgeserve: memory budget %s; repository control %s\n",
          cfg.memory_budget_auto ? "auto (the cgroup's or machine's limit below the soft "
                                   "watermark, minus what was in use)"
          : as.memory_budget_bytes ? "as given"
                                   : "none (unbounded, as asked for)",
          cfg.repository_control ? "on (bearer token)" : "off");
  sd_notifyf(0, "READY=1\nSTATUS=serving %d models on %s:%d, budget %zu B\nMAINPID=%lu",
             rs.models, cfg.host, port, as.memory_budget_bytes, (unsigned long)getpid());
  int sig = wait_signal_watchdog(&sigs, cfg.host, port);
  sd_notifyf(0, "STOPPING=1\nSTATUS=draining (grace %ld ms)", grace);
  fprintf(stderr, "edgeserve: signal %d: draining (grace %ld ms)\n", sig, grace);
  es_server_report rep;
  es_server_shutdown(s, (int)grace, &rep);
  fprintf(stderr,
          "edgeserve: stopped: %llu responses served; %llu requests in flight at the signal, "
          "%llu finished in the grace period, %llu cut off; drained in %.1f ms\n",
          (unsigned long long)rep.served, (unsigned long long)rep.inflight_at_stop,
          (unsigned long long)rep.finished_in_grace, (unsigned long long)rep.cut_off,
          rep.drain_ms);
  es_server_destroy(s);
  return 0;
}
