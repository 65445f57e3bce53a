/* edgeserve bench: how fast one model serves, and in how much memory.
 *
 * Two modes, because two questions are asked:
 *
 * In-process (no --concurrency, no --rate): latency of the engine alone, for
 * comparison with ONNX Runtime (scripts/bench/bench_vs_ort.sh runs both,
 * interleaved). One plan, one arena of exactly the planned size, warm-up
 * runs, then timed runs on the same inputs. Reports median and p99 latency,
 * GFLOP/s of the compute-heavy nodes, peak RSS and the planned arena bytes.
 *
 * Runtime (--concurrency N and/or --rate R): the same model served through
 * the real runtime (es_runtime_*: admission, queues, workers, arena pools),
 * so what is measured is what a server would see, overheads included.
 *   - closed loop (--concurrency N): N client threads ("streams") each
 *     submit, wait, repeat; that is how a camera stream behaves and what
 *     scripts/ort/bench_streams.js does with one ONNX Runtime session per
 *     stream, so the JSON keys match it.
 *   - --no-share loads the model N times, each with its own weights and one
 *     private arena: the naive deployment, for the "before" column.
 *   - open loop (--rate R): one submitter issues requests at Poisson arrival
 *     times whether or not earlier ones finished, so overload shows up as
 *     refusals (admission, queue) rather than as a slower client; that is
 *     the only way to see how the gate behaves past capacity.
 * Memory is reported next to the budget formula (weights + N x planned
 * arena) so the RSS the kernel sees can be checked against what the
 * capacity planner promised. */
#include "cli/cli.h"
#include "cli/inputs.h"
#include "cli/measure.h"
#include "edgeserve/engine.h"
#include "edgeserve/memory.h"
#include "edgeserve/runtime.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static void bench_usage(FILE *f) {
  fprintf(f,
          "usage: edgeserve bench MODEL.onnx [--input NAME=FILE.npy]... [FILE.npy]...\n"
          "                      [--shape NAME=DxDxD]... [--threads N] [--iters N]\n"
          "                      [--warmup N] [--json] [--profile] [--load-twice]\n"
          "                      [--split MFLOP] [--cache-dir DIR] [--perf]\n"
          "                      [--precision auto|fp32|bf16|int8]\n"
          "       edgeserve bench MODEL.onnx [inputs as above] --concurrency N [--no-share]\n"
          "                      [--workers W] [--duration S] [--warmup K] [--threads N]\n"
          "                      [--memory BYTES] [--queue N] [--json]\n"
          "       edgeserve bench MODEL.onnx [inputs as above] --rate R [--concurrency N\n"
          "                      --no-share] [--workers W] [--duration S] [--warmup K]\n"
          "                      [--memory BYTES] [--queue N] [--json]\n\n"
          "Without --concurrency or --rate: times one model in-process: median and p99\n"
          "latency over N runs (default 50, after 5 warm-up runs), GFLOP/s of\n"
          "Conv/ConvTranspose/MatMul, peak RSS and the planned arena bytes. --threads\n"
          "sets the intra-op threads of a request (default 1). --profile also times\n"
          "every node and prints the time per operator type and the ten slowest\n"
          "nodes (with GFLOP/s where counted). --load-twice loads and\n"
          "plans the model once and lets it go before the measured load and plan:\n"
          "the second pair's times (load2/plan2) are the engine's work on memory\n"
          "this process has just used, which a virtual machine whose host backs\n"
          "fresh memory lazily makes far cheaper than the first (load/plan). oneDNN's\n"
          "primitive cache would hand the second plan the first one's kernels:\n"
          "ONEDNN_PRIMITIVE_CACHE_CAPACITY=0 makes both generate them. The measured\n"
          "load and plan's CPU time is also split into user (the engine's own work)\n"
          "and system time (mostly the kernel faulting in and zeroing fresh pages),\n"
          "with the page faults taken. --split plans convolutions of more than MFLOP\n"
          "as bands of output rows of about that size, with a safe point between two\n"
          "(what a preempting runtime does; es_engine_split_set), to see their cost.\n"
          "--cache-dir (or $EDGESERVE_CACHE_DIR) keeps the weights reordered for this\n"
          "CPU in DIR: the first run writes them, later ones map them (the\n"
          "\"prepared weights\" line says which; es_engine_cache_dir_set). --perf\n"
          "counts the timed runs' instructions and cache misses with the CPU's\n"
          "hardware counters (perf_event_open, this thread, user space); where the\n"
          "machine has none (most virtual machines) it says so and why.\n\n"
          "With --concurrency N (closed loop): serves the model through the runtime\n"
          "(admission, queues, pinned workers, arena pool). N client streams each\n"
          "submit a request, wait for it and repeat, for --duration seconds (default 10)\n"
          "after --warmup requests per stream (default 2). The model is loaded once:\n"
          "one copy of the weights for all streams. --no-share loads it N times instead\n"
          "(own weights, one private arena each, stream i to copy i): the naive setup.\n"
          "--workers W runs W worker threads (default 0: one per core); --threads\n"
          "sets the engine threads per request (default 1).\n\n"
          "With --rate R (open loop): one submitter issues R requests/s overall at\n"
          "Poisson arrival times (fixed seed; --paced: evenly spaced, like camera\n"
          "frames) without waiting for them; refused ones are\n"
          "counted by reason with the time the refusal took and its retry-after. With\n"
          "--no-share, --concurrency N copies take the requests in turn. --warmup K is\n"
          "K rounds of one request per worker (per copy with --no-share) here.\n\n"
          "--memory BYTES (suffix K, M, G: powers of 1024) is the admission budget for\n"
          "all admitted requests (planned arena + outputs each); --queue N bounds the\n"
          "runtime's queue (default 64). Reported: throughput, latency submit to\n"
          "completion (p50/p99/max) and the run alone (p50/p99), refusals, and memory:\n"
          "weights, planned arena, arena pools, peak RSS (also sampled every 50 ms in\n"
          "the timed phase), RSS and PSS at the end, and the budget formula\n"
          "weights + N x planned arena (N x weights with --no-share; with --rate,\n"
          "weights + the budget, or + the peak bytes admitted without --memory).\n"
          "--json prints one line of JSON. Inputs as for 'edgeserve run'; --shape gives\n"
          "random data.\n");
}


static void print_profile(void *user, const char *op, int nodes, double ms) {
  (void)user;
  printf("  %-20s %4d nodes %9.3f ms\n", op, nodes, ms);
}

/* The slowest nodes: kept sorted, at most PROFILE_TOP. */
#define PROFILE_TOP 10
typedef struct slow_nodes {
  int n;
  struct {
    char label[120];
    double ms;
    uint64_t flops;
  } v[PROFILE_TOP];
} slow_nodes;

static void keep_slow(void *user, const char *label, double ms, uint64_t flops) {
  slow_nodes *t = user;
  if (t->n == PROFILE_TOP && ms <= t->v[PROFILE_TOP - 1].ms)
    return;
  int at = t->n < PROFILE_TOP ? t->n++ : PROFILE_TOP - 1;
  while (at > 0 && t->v[at - 1].ms < ms) {
    t->v[at] = t->v[at - 1];
    at--;
  }
  snprintf(t->v[at].label, sizeof t->v[at].label, "%s", label);
  t->v[at].ms = ms;
  t->v[at].flops = flops;
}

static int parse_real(const char *s, double lo, double hi, double *out) {
  char *end;
  double v = strtod(s, &end);
  if (end == s || *end || !(v > lo) || v > hi)
    return -1;
  *out = v;
  return 0;
}

typedef struct bench_args {
  const char *model_path;
  cli_inputs ci;
  long threads, iters, warmup;
  int json, profile, load_twice;
  int perf; /* count instructions and cache misses over the timed runs */
  double split_mflop; /* > 0: convolutions split into bands of this many MFLOP */
  int threads_set, iters_set, warmup_set;
  /* runtime mode */
  long concurrency; /* 0: not given */
  int no_share;
  long workers;
  double duration;
  double rate; /* 0: closed loop */
  int paced;   /* open loop: evenly spaced arrivals instead of Poisson */
  size_t memory;
  long queue; /* 0: the runtime's default */
  const char *runtime_opt_name; /* a runtime-only option given, for the message */
} bench_args;

/* ===========================================================================
 * In-process mode: one plan, one arena.
 * ========================================================================= */

static double tv_ms(const struct timeval *tv) {
  return (double)tv->tv_sec * 1e3 + (double)tv->tv_usec / 1e3;
}

/* warmup + iters runs of the session's plan; the timed ones in lat[], the
 * first warm-up run in *first. 0, or -1 (printed). */
static int time_runs(cli_session *s, const bench_args *ba, double *lat, double *first,
                     cli_perf *perf) {
  es_tensor out[64];
  int nout = es_plan_output_count(s->plan);
  if (nout > 64)
    nout = 64;
  for (long r = -ba->warmup; r < ba->iters; r++) {
    if (r == 0 && ba->profile)
      es_engine_profile_set(1);
    if (r == 0 && perf)
      cli_perf_start(perf);
    es_arena_reset(s->arena);
    double t0 = cli_now_ms();
    /* a part no bound covers takes es_mem's heap; its outputs go back
     * inside the timing, as a peer's allocated outputs would */
    if (es_plan_run_heap(s->plan, s->in, s->nin, s->arena, NULL, out, nout) < 0) {
      fprintf(stderr, "edgeserve bench: %s\n", es_last_error_detail());
      return -1;
    }
    es_plan_outputs_free(s->plan, NULL, out, nout);
    double dt = cli_now_ms() - t0;
    if (r == -ba->warmup)
      *first = dt;
    if (r >= 0)
      lat[r] = dt;
  }
  return 0;
}

static int bench_inproc(const bench_args *ba) {
  const char *model_path = ba->model_path;
  long threads = ba->threads, iters = ba->iters, warmup = ba->warmup;
  es_engine_threads_set((int)threads);
  cli_session s;
  double *lat = NULL, first = 0, load1 = 0, plan1 = 0;
  int status = 0;
  if (ba->split_mflop > 0)
    es_engine_split_set((uint64_t)(ba->split_mflop * 1048576.0));
  if (ba->load_twice) { /* the first pair, let go: its times are the cold ones */
    status = cli_session_open(&s, model_path, &ba->ci, "bench");
    load1 = s.load_ms;
    plan1 = s.plan_ms;
    cli_session_close(&s);
    if (status)
      return status;
  }
  /* The measured pair's CPU time split: user (the engine's own work) and
   * system (mostly the kernel faulting in and zeroing fresh pages, which a
   * virtual machine's host can make the larger part). */
  struct rusage ru0, ru1;
  getrusage(RUSAGE_SELF, &ru0);
  status = cli_session_open(&s, model_path, &ba->ci, "bench");
  getrusage(RUSAGE_SELF, &ru1);
  if (status)
    goto out;
  double lp_user = tv_ms(&ru1.ru_utime) - tv_ms(&ru0.ru_utime);
  double lp_sys = tv_ms(&ru1.ru_stime) - tv_ms(&ru0.ru_stime);
  long lp_faults = ru1.ru_minflt - ru0.ru_minflt + ru1.ru_majflt - ru0.ru_majflt;
  status = 1;
  lat = es_mem_calloc(ES_MEM_CLI, (size_t)iters, sizeof *lat);
  /* --perf: the calling thread's counters over the timed runs (all of the
   * work at --threads 1), or why there are none */
  cli_perf perf = {{-1, -1}, ""};
  int perf_ok = ba->perf && cli_perf_open(&perf) == 0;
  uint64_t p_ins = 0, p_miss = 0;
  if (!lat || time_runs(&s, ba, lat, &first, perf_ok ? &perf : NULL) < 0) {
    cli_perf_close(&perf);
    goto out;
  }
  if (perf_ok)
    cli_perf_stop(&perf, &p_ins, &p_miss);
  cli_perf_close(&perf);
  cli_sort(lat, (size_t)iters);
  double med = cli_median(lat, (size_t)iters), p99 = cli_pct(lat, (size_t)iters, 0.99);
  double gflop = (double)es_plan_flops(s.plan) / 1e9;
  size_t peak = 0, arena = es_plan_arena_bytes(s.plan);
  es_sys_peak_rss(&peak);
  es_model_stats ms;
  es_model_stats_get(s.model, &ms);
  /* With --load-twice the measured session is the second: load/plan are
   * the first pair's, load2/plan2 its own. */
  double load = ba->load_twice ? load1 : s.load_ms, plan = ba->load_twice ? plan1 : s.plan_ms;
  if (ba->json) {
    printf("{\"model\": \"%s\", \"threads\": %ld, \"iters\": %ld, \"median_ms\": %.4f, "
           "\"p99_ms\": %.4f, \"first_ms\": %.4f, \"load_ms\": %.3f, \"plan_ms\": %.3f, ",
           model_path, threads, iters, med, p99, first, load, plan);
    if (ba->load_twice)
      printf("\"load2_ms\": %.3f, \"plan2_ms\": %.3f, ", s.load_ms, s.plan_ms);
    printf("\"lp_user_ms\": %.3f, \"lp_sys_ms\": %.3f, \"lp_faults\": %ld, ", lp_user, lp_sys,
           lp_faults);
    if (ba->perf && perf_ok)
      printf("\"perf_instructions_per_run\": %.0f, \"perf_cache_misses_per_run\": %.0f, ",
             (double)p_ins / (double)iters, (double)p_miss / (double)iters);
    else if (ba->perf)
      printf("\"perf_unavailable\": \"%s\", ", perf.why);
    printf("\"gflop\": %.4f, \"gflops\": %.2f, \"peak_rss_bytes\": %zu, "
           "\"arena_bytes\": %zu, \"weight_bytes\": %zu, \"prepared_bytes\": %zu, "
           "\"prepared_cached_bytes\": %zu, \"cache_hits\": %llu, \"cache_writes\": %llu, "
           "\"cache_errors\": %llu}\n",
           gflop, med > 0 ? gflop / (med / 1e3) : 0.0, peak, arena, ms.weight_bytes,
           ms.prepared_bytes, ms.prepared_cached_bytes,
           (unsigned long long)ms.prepared_cache_hits,
           (unsigned long long)ms.prepared_cache_writes,
           (unsigned long long)ms.prepared_cache_errors);
  } else {
    printf("model: %s (%ld thread%s, %ld runs after %ld warm-up)\n", model_path, threads,
           threads > 1 ? "s" : "", iters, warmup);
    printf("latency ms: median %.3f  p99 %.3f  first run %.3f\n", med, p99, first);
    printf("load ms: %.1f  plan ms: %.1f\n", load, plan);
    if (ba->load_twice)
      printf("again: load ms: %.1f  plan ms: %.1f\n", s.load_ms, s.plan_ms);
    printf("load + plan CPU: user %.1f ms, system %.1f ms (%ld page faults)\n", lp_user, lp_sys,
           lp_faults);
    printf("compute: %.3f GFLOP per run, %.1f GFLOP/s\n", gflop,
           med > 0 ? gflop / (med / 1e3) : 0.0);
    printf("memory: planned arena %zu B, weights %zu B, peak RSS %zu B\n", arena, ms.weight_bytes,
           peak);
    printf("prepared weights: %zu B, %zu B of them mapped from the cache (hits %llu, "
           "writes %llu, errors %llu)\n",
           ms.prepared_bytes, ms.prepared_cached_bytes,
           (unsigned long long)ms.prepared_cache_hits,
           (unsigned long long)ms.prepared_cache_writes,
           (unsigned long long)ms.prepared_cache_errors);
    if (ba->perf && perf_ok)
      printf("perf (this thread, per run): %.0f instructions, %.0f cache misses (%.2f per 1000 "
             "instructions)\n",
             (double)p_ins / (double)iters, (double)p_miss / (double)iters,
             p_ins ? 1000.0 * (double)p_miss / (double)p_ins : 0.0);
    else if (ba->perf)
      printf("perf: no hardware counters here (%s)\n", perf.why);
  }
  if (ba->profile && !ba->json) {
    printf("profile (ms per run, by operator; timing adds a little to each node):\n");
    es_plan_profile(s.plan, print_profile, NULL);
    slow_nodes top = {0};
    es_plan_profile_nodes(s.plan, keep_slow, &top);
    printf("slowest nodes (ms per run; GFLOP/s where the node counts its work):\n");
    for (int i = 0; i < top.n; i++) {
      printf("  %9.3f ms  ", top.v[i].ms);
      if (top.v[i].flops && top.v[i].ms > 0)
        printf("%6.1f GFLOP/s  ", (double)top.v[i].flops / (top.v[i].ms * 1e6));
      else
        printf("%15s", "");
      printf("%s\n", top.v[i].label);
    }
  }
  status = 0;
out:
  es_mem_free(lat);
  cli_session_close(&s);
  return status;
}

/* ===========================================================================
 * Runtime mode.
 * ========================================================================= */

/* A growable series of samples. Each recording thread owns its own (or
 * holds the lock that guards it), so pushing never contends. */
typedef struct bench_series {
  double *v;
  size_t n, cap;
} bench_series;

static int series_push(bench_series *s, double x) {
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 1024;
    double *v = s->v ? es_mem_realloc(s->v, cap * sizeof *v)
                     : es_mem_alloc(ES_MEM_CLI, cap * sizeof *v);
    if (!v)
      return -1;
    s->v = v;
    s->cap = cap;
  }
  s->v[s->n++] = x;
  return 0;
}

static int series_append(bench_series *dst, const bench_series *src) {
  for (size_t i = 0; i < src->n; i++)
    if (series_push(dst, src->v[i]) < 0)
      return -1;
  return 0;
}

static void series_free(bench_series *s) {
  es_mem_free(s->v);
  memset(s, 0, sizeof *s);
}

/* Nearest-rank percentile of a sorted series (as bench_streams.js). */
static double series_pct(const bench_series *s, double q) { return cli_pct(s->v, s->n, q); }

/* What one recording thread saw. The same record serves a stream of the
 * closed loop, the open loop's submitter (admissions and refusals) and its
 * completion callbacks (under a lock), and the merged result. */
typedef struct bench_rec {
  bench_series lat_ms;     /* submit to completion, completed requests */
  bench_series run_ms;     /* the run on a worker (es_request_info run_ns) */
  bench_series queue_ms;   /* submit to start of the run */
  bench_series refusal_us; /* how long a refused submit took */
  uint64_t admitted, completed, dropped, failed;
  uint64_t refused, refused_by[ES_REFUSE_COUNT];
  double retry_ms_sum;
  int oom; /* a series could not grow */
} bench_rec;

static void rec_free(bench_rec *r) {
  series_free(&r->lat_ms);
  series_free(&r->run_ms);
  series_free(&r->queue_ms);
  series_free(&r->refusal_us);
}

static void rec_merge(bench_rec *dst, const bench_rec *src) {
  if (series_append(&dst->lat_ms, &src->lat_ms) < 0 ||
      series_append(&dst->run_ms, &src->run_ms) < 0 ||
      series_append(&dst->queue_ms, &src->queue_ms) < 0 ||
      series_append(&dst->refusal_us, &src->refusal_us) < 0)
    dst->oom = 1;
  dst->oom |= src->oom;
  dst->admitted += src->admitted;
  dst->completed += src->completed;
  dst->dropped += src->dropped;
  dst->failed += src->failed;
  dst->refused += src->refused;
  for (int i = 0; i < ES_REFUSE_COUNT; i++)
    dst->refused_by[i] += src->refused_by[i];
  dst->retry_ms_sum += src->retry_ms_sum;
}

static void rec_refusal(bench_rec *r, const es_refusal *why, uint64_t took_ns) {
  r->refused++;
  if (why->reason > 0 && why->reason < ES_REFUSE_COUNT)
    r->refused_by[why->reason]++;
  r->retry_ms_sum += why->retry_after_ms;
  if (series_push(&r->refusal_us, (double)took_ns / 1e3) < 0)
    r->oom = 1;
}

typedef struct bench_rt bench_rt;

typedef struct bench_stream {
  bench_rt *b;
  int index;
  int model; /* the runtime model id it submits to */
  pthread_t thread;
  int started;
  bench_rec rec;
  uint64_t end_ns;
} bench_stream;

struct bench_rt {
  const bench_args *a;
  es_runtime *rt;
  int ids[1024]; /* model ids: one shared entry, or one per copy */
  int n_ids;
  es_tensor *in;
  int nin;
  int n_workers;
  atomic_ulong *worker_runs; /* completed runs per worker */
  atomic_int warmed;    /* closed loop: streams done with their warm-up */
  atomic_int go;        /* closed loop: the timed phase has started */
  uint64_t t0_ns, deadline_ns; /* written before go is set */
  atomic_int failed;
  pthread_mutex_t lock; /* the first failure; the open loop's completions */
  int err_rc;
  char err[384];
  bench_rec done;       /* open loop: completions, under lock */
  uint64_t last_done_ns; /* open loop, under lock */
  atomic_ulong finished; /* open loop: callbacks that have run */
  /* the driver's own (bench_runtime and its steps) */
  es_tensor in_store[CLI_MAX_INPUTS];
  es_tensor_info shapes[CLI_MAX_INPUTS];
  char *names[CLI_MAX_INPUTS]; /* the inputs' names: the probe model goes away */
  bench_stream *streams;
  int n_streams;
  int handles_out; /* open-loop requests never called back: keep the runtime */
  cli_rss_sampler smp;
  bench_rec sub_rec; /* open loop: the submitter's */
};

/* Remember the first failure and stop everyone. */
static void bench_fail(bench_rt *b, int rc, const char *what) {
  pthread_mutex_lock(&b->lock);
  if (!b->err_rc) {
    b->err_rc = rc;
    snprintf(b->err, sizeof b->err, "%s", what);
  }
  pthread_mutex_unlock(&b->lock);
  atomic_store(&b->failed, 1);
}

/* Fold a finished request's status and times into rec (NULL: warm-up, only
 * the status matters). Returns the status when it is fatal, else 0; the
 * caller reports it with bench_fail (not here: the open loop's callback
 * holds the lock that bench_fail takes). */
static int rec_completion(bench_rt *b, bench_rec *rec, int status, const es_request_info *info,
                          uint64_t lat_ns) {
  if (status == 0) {
    if (!rec)
      return 0;
    rec->completed++;
    if (series_push(&rec->lat_ms, (double)lat_ns / 1e6) < 0 ||
        series_push(&rec->run_ms, (double)info->run_ns / 1e6) < 0 ||
        series_push(&rec->queue_ms, (double)info->queue_ns / 1e6) < 0)
      rec->oom = 1;
    if (info->worker >= 0 && info->worker < b->n_workers)
      atomic_fetch_add(&b->worker_runs[info->worker], 1);
    return 0;
  }
  if (status == ES_EAGAIN || status == ES_ETIMEDOUT || status == ES_ECANCELED) {
    if (rec)
      rec->dropped++; /* left the queue: memory pressure, deadline */
    return 0;
  }
  if (rec)
    rec->failed++;
  return status;
}

static void fail_request(bench_rt *b, int status) {
  char msg[256];
  snprintf(msg, sizeof msg, "a request failed: %s (%s)", es_strerror(status),
           es_err_name(status));
  bench_fail(b, status, msg);
}

/* A submit that failed other than by a refusal. ES_ENOSPC is a request
 * larger than the whole budget: say so in numbers, the fix is --memory. */
static void fail_submit(bench_rt *b, int rc, const es_refusal *why) {
  char msg[384];
  if (rc == ES_ENOSPC)
    snprintf(msg, sizeof msg, "a request needs %llu B, more than the whole --memory budget "
             "(%llu B)", (unsigned long long)why->requested, (unsigned long long)why->limit);
  else
    snprintf(msg, sizeof msg, "submit: %s", es_last_error_detail());
  bench_fail(b, rc, msg);
}

/* ---- closed loop ------------------------------------------------------------ */

/* One request of a stream: submit, wait, record. A refusal backs off for
 * its retry-after, as a well-behaved client would, but never past the end
 * of the timed phase (until = 0: at most a second). Returns -1 on a fatal
 * error (recorded in b). */
static int stream_one(bench_stream *s, const es_submit *sub, bench_rec *rec, uint64_t until) {
  bench_rt *b = s->b;
  es_request *r = NULL;
  es_refusal why;
  uint64_t t0 = cli_now_ns();
  int rc = es_runtime_submit(b->rt, sub, &r, &why);
  uint64_t t1 = cli_now_ns();
  if (rc == ES_EAGAIN) {
    if (rec)
      rec_refusal(rec, &why, t1 - t0);
    uint64_t wait = (uint64_t)why.retry_after_ms * 1000000ull;
    uint64_t cap = until ? (until > t1 ? until - t1 : 0) : 1000000000ull;
    cli_sleep_ns(wait < cap ? wait : cap);
    return 0;
  }
  if (rc < 0) {
    fail_submit(b, rc, &why);
    return -1;
  }
  if (rec)
    rec->admitted++;
  int st = es_request_wait(r, -1);
  uint64_t t2 = cli_now_ns();
  es_request_info info;
  memset(&info, 0, sizeof info);
  es_request_info_get(r, &info);
  es_request_free(r);
  int bad = rec_completion(b, rec, st, &info, t2 - t0);
  if (bad)
    fail_request(b, bad);
  return atomic_load(&b->failed) ? -1 : 0;
}

static void *stream_main(void *arg) {
  bench_stream *s = arg;
  bench_rt *b = s->b;
  es_submit sub = {.model = s->model, .inputs = b->in, .n_inputs = b->nin};
  for (long k = 0; k < b->a->warmup && !atomic_load(&b->failed); k++)
    stream_one(s, &sub, NULL, 0);
  /* Counted warmed up even after a failure, so the main thread never waits
   * for a stream that will not come. */
  atomic_fetch_add(&b->warmed, 1);
  while (!atomic_load(&b->go))
    cli_sleep_ns(200 * 1000ull);
  uint64_t deadline = b->deadline_ns;
  while (!atomic_load(&b->failed) && cli_now_ns() < deadline)
    if (stream_one(s, &sub, &s->rec, deadline) < 0)
      break;
  s->end_ns = cli_now_ns();
  return NULL;
}

/* ---- open loop ---------------------------------------------------------------- */

typedef struct open_tag {
  bench_rt *b;
  uint64_t submit_ns;
} open_tag;

/* Completion callback, on a runtime thread: record, free the handle (the
 * API allows it here), then count it finished last, since the main thread
 * tears things down once every admitted request is counted. */
static void open_done(void *user, es_request *r) {
  open_tag *t = user;
  bench_rt *b = t->b;
  uint64_t t1 = cli_now_ns();
  es_request_info info;
  memset(&info, 0, sizeof info);
  int st = es_request_info_get(r, &info) == 0 ? info.status : ES_ECORRUPT;
  pthread_mutex_lock(&b->lock);
  if (t1 > b->last_done_ns)
    b->last_done_ns = t1;
  int bad = rec_completion(b, &b->done, st, &info, t1 - t->submit_ns);
  pthread_mutex_unlock(&b->lock);
  if (bad)
    fail_request(b, bad);
  es_mem_free(t);
  es_request_free(r);
  atomic_fetch_add(&b->finished, 1);
}

/* Warm every worker's arena and caches before timing: rounds of one request
 * per worker (or per copy), waited for together. */
static int open_warmup(bench_rt *b) {
  int batch = b->a->no_share ? b->n_ids : b->n_workers;
  es_request **rs = es_mem_calloc(ES_MEM_CLI, (size_t)batch, sizeof *rs);
  if (!rs) {
    bench_fail(b, ES_ENOMEM, "no memory for the warm-up");
    return -1;
  }
  int rc = 0;
  for (long k = 0; k < b->a->warmup && rc == 0; k++) {
    int n = 0;
    for (int i = 0; i < batch && rc == 0; i++) {
      es_submit sub = {.model = b->ids[i % b->n_ids], .inputs = b->in, .n_inputs = b->nin};
      es_refusal why;
      int s = es_runtime_submit(b->rt, &sub, &rs[n], &why);
      if (s == 0)
        n++;
      else if (s != ES_EAGAIN) {
        fail_submit(b, s, &why);
        rc = -1;
      }
      /* a refusal (small budget or queue): this round warms fewer workers */
    }
    for (int i = 0; i < n; i++) {
      int st = es_request_wait(rs[i], -1);
      es_request_free(rs[i]);
      if (rec_completion(b, NULL, st, NULL, 0) && rc == 0) {
        fail_request(b, st);
        rc = -1;
      }
    }
  }
  es_mem_free(rs);
  return rc;
}

/* The submitter: Poisson arrivals at b->a->rate for the timed phase. A late
 * submitter (a slow submit, a descheduled thread) catches up at once rather
 * than stretching the schedule, so the offered load stays R; how late it
 * ever was is reported. */
static void open_submit(bench_rt *b, bench_rec *rec, double *lag_max_ms, uint64_t *arrivals) {
  uint64_t rng = 0x9e3779b97f4a7c15ull; /* fixed seed: runs are comparable */
  double next = (double)b->t0_ns;
  uint64_t i = 0;
  *lag_max_ms = 0;
  for (;;) {
    rng ^= rng << 13; /* xorshift64 */
    rng ^= rng >> 7;
    rng ^= rng << 17;
    double u = (double)(rng >> 11) / 9007199254740992.0; /* [0, 1) */
    /* --paced: evenly spaced arrivals, like camera frames; otherwise
     * Poisson (exponential gaps), the queueing-theory worst case of
     * independent clients. */
    next += (b->a->paced ? 1.0 : -log1p(-u)) / b->a->rate * 1e9;
    if (next >= (double)b->deadline_ns || atomic_load(&b->failed))
      break;
    uint64_t at = (uint64_t)next, t = cli_now_ns();
    if (at > t) {
      struct timespec ts = {.tv_sec = (time_t)(at / 1000000000ull),
                            .tv_nsec = (long)(at % 1000000000ull)};
      while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
      }
    } else if ((double)(t - at) / 1e6 > *lag_max_ms) {
      *lag_max_ms = (double)(t - at) / 1e6;
    }
    open_tag *tag = es_mem_alloc(ES_MEM_CLI, sizeof *tag);
    if (!tag) {
      bench_fail(b, ES_ENOMEM, "no memory for a request tag");
      break;
    }
    es_submit sub = {.model = b->ids[i++ % (uint64_t)b->n_ids], .inputs = b->in,
                     .n_inputs = b->nin, .on_done = open_done, .user = tag};
    es_request *r = NULL;
    es_refusal why;
    uint64_t t0 = cli_now_ns();
    tag->b = b;
    tag->submit_ns = t0;
    int rc = es_runtime_submit(b->rt, &sub, &r, &why);
    uint64_t t1 = cli_now_ns();
    (*arrivals)++;
    if (rc == 0) {
      /* r and tag belong to the callback now (it may even have run). */
      rec->admitted++;
      continue;
    }
    es_mem_free(tag);
    if (rc == ES_EAGAIN) {
      rec_refusal(rec, &why, t1 - t0);
      continue;
    }
    fail_submit(b, rc, &why);
    break;
  }
}

/* ---- report --------------------------------------------------------------------- */

/* ,"key":value with 3 decimals, or null for a missing value (NAN). */
static void json_real(const char *key, double v) {
  printf(",\"%s\":", key);
  cli_json_real(stdout, v, 3);
}

static void json_size(const char *key, size_t v) { printf(",\"%s\":%zu", key, v); }

typedef struct bench_result {
  const char *model; /* basename */
  bench_rec rec;
  double seconds, cpu_cores, load_ms;
  uint64_t offered;
  double lag_max_ms;
  size_t planned, weights, weights_one, pool, scratch, buddy_peak, peak_rss, timed_peak_rss,
      rss, pss, baseline_rss, formula, budget;
  unsigned long rss_samples;
  size_t counted, counted_by[ES_MEM_TAG_COUNT]; /* es_mem's own counters */
  int peak_reset_ok;
  size_t peak_inflight, peak_reserved;
  unsigned queue_capacity;
} bench_result;

static void report_json(const bench_rt *b, const bench_result *r) {
  const bench_args *a = b->a;
  const bench_rec *rec = &r->rec;
  printf("{\"engine\":\"edgeserve\",\"mode\":\"%s\",\"loop\":\"%s\",\"model\":",
         a->no_share ? "no-share" : "shared", a->rate > 0 ? "open" : "closed");
  cli_json_string(stdout, r->model);
  printf(",\"concurrency\":%ld,\"workers\":%d,\"threads\":%ld,\"rate\":%g", a->concurrency,
         b->n_workers, a->threads, a->rate);
  printf(",\"arrivals\":\"%s\"", a->rate > 0 ? (a->paced ? "paced" : "poisson") : "closed");
  printf(",\"requests\":%llu", (unsigned long long)rec->completed);
  json_real("seconds", r->seconds);
  json_real("throughput_rps", r->seconds > 0 ? (double)rec->completed / r->seconds : NAN);
  json_real("p50_ms", series_pct(&rec->lat_ms, 0.50));
  json_real("p99_ms", series_pct(&rec->lat_ms, 0.99));
  json_real("max_ms", series_pct(&rec->lat_ms, 1.0));
  json_real("run_p50_ms", series_pct(&rec->run_ms, 0.50));
  json_real("run_p99_ms", series_pct(&rec->run_ms, 0.99));
  json_real("queue_p50_ms", series_pct(&rec->queue_ms, 0.50));
  json_real("queue_p99_ms", series_pct(&rec->queue_ms, 0.99));
  json_size("planned_arena_bytes", r->planned);
  json_size("weights_bytes", r->weights);
  printf(",\"weights_copies\":%ld", a->no_share ? a->concurrency : 1);
  json_size("pool_bytes", r->pool);
  json_size("scratch_bytes", r->scratch);
  json_size("buddy_peak_bytes", r->buddy_peak);
  json_size("peak_rss_bytes", r->peak_rss);
  json_size("timed_peak_rss_bytes", r->timed_peak_rss);
  json_size("rss_bytes", r->rss);
  json_size("pss_bytes", r->pss);
  json_size("baseline_rss_bytes", r->baseline_rss);
  json_size("counted_bytes", r->counted);
  printf(",\"counted_by\":{");
  for (int t = 0, first = 1; t < ES_MEM_TAG_COUNT; t++)
    if (r->counted_by[t]) {
      printf("%s\"%s\":%zu", first ? "" : ",", es_mem_tag_name((es_mem_tag)t), r->counted_by[t]);
      first = 0;
    }
  printf("}");
  json_size("formula_bytes", r->formula);
  json_size("memory_budget_bytes", r->budget);
  printf(",\"queue_capacity\":%u", r->queue_capacity);
  printf(",\"admitted\":%llu,\"refused\":%llu,\"refused_by\":{",
         (unsigned long long)rec->admitted, (unsigned long long)rec->refused);
  for (int i = 1; i < ES_REFUSE_COUNT; i++)
    printf("%s\"%s\":%llu", i > 1 ? "," : "", es_refusal_name(i),
           (unsigned long long)rec->refused_by[i]);
  printf("}");
  json_real("refusal_p50_us", series_pct(&rec->refusal_us, 0.50));
  json_real("refusal_p99_us", series_pct(&rec->refusal_us, 0.99));
  json_real("retry_after_ms_mean",
            rec->refused ? rec->retry_ms_sum / (double)rec->refused : NAN);
  printf(",\"dropped\":%llu", (unsigned long long)rec->dropped);
  if (a->rate > 0) {
    printf(",\"offered\":%llu", (unsigned long long)r->offered);
    json_real("submit_lag_max_ms", r->lag_max_ms);
  }
  json_size("peak_inflight", r->peak_inflight);
  json_size("peak_reserved_bytes", r->peak_reserved);
  json_real("cpu_cores", r->cpu_cores);
  json_real("load_ms", r->load_ms);
  json_real("duration", a->duration);
  printf(",\"warmup\":%ld}\n", a->warmup);
}

static void report_text(const bench_rt *b, const bench_result *r) {
  const bench_args *a = b->a;
  const bench_rec *rec = &r->rec;
  printf("model: %s through the runtime, %s: ", r->model,
         a->no_share ? "no-share (one private copy and arena per stream)"
                     : "shared (one copy of the weights)");
  if (a->rate > 0)
    printf("open loop at %g req/s (%s arrivals)", a->rate, a->paced ? "paced" : "Poisson");
  else
    printf("closed loop, %ld stream%s", a->concurrency, a->concurrency > 1 ? "s" : "");
  printf("\n  %d worker%s (pinned), %ld engine thread%s per run, %g s after %ld warm-up "
         "request%s%s\n",
         b->n_workers, b->n_workers > 1 ? "s" : "", a->threads, a->threads > 1 ? "s" : "",
         a->duration, a->warmup, a->warmup == 1 ? "" : "s",
         a->rate > 0 ? " per worker" : " per stream");
  printf("throughput: %llu requests in %.3f s = %.2f req/s (%.2f cores busy)\n",
         (unsigned long long)rec->completed, r->seconds,
         r->seconds > 0 ? (double)rec->completed / r->seconds : 0.0, r->cpu_cores);
  printf("latency ms, submit to completion: p50 %.3f  p99 %.3f  max %.3f\n",
         series_pct(&rec->lat_ms, 0.5), series_pct(&rec->lat_ms, 0.99),
         series_pct(&rec->lat_ms, 1.0));
  printf("  run alone: p50 %.3f  p99 %.3f;  queued: p50 %.3f  p99 %.3f\n",
         series_pct(&rec->run_ms, 0.5), series_pct(&rec->run_ms, 0.99),
         series_pct(&rec->queue_ms, 0.5), series_pct(&rec->queue_ms, 0.99));
  printf("  runs by worker:");
  for (int w = 0; w < b->n_workers; w++)
    printf(" %d:%lu", w, (unsigned long)atomic_load(&b->worker_runs[w]));
  printf("\n");
  if (a->rate > 0)
    printf("offered %llu, admitted %llu, completed %llu, dropped %llu, refused %llu "
           "(submitter at most %.3f ms late)\n",
           (unsigned long long)r->offered, (unsigned long long)rec->admitted,
           (unsigned long long)rec->completed, (unsigned long long)rec->dropped,
           (unsigned long long)rec->refused, r->lag_max_ms);
  else
    printf("admitted %llu, completed %llu, dropped %llu, refused %llu\n",
           (unsigned long long)rec->admitted, (unsigned long long)rec->completed,
           (unsigned long long)rec->dropped, (unsigned long long)rec->refused);
  if (rec->refused) {
    printf("  refused by:");
    for (int i = 1; i < ES_REFUSE_COUNT; i++)
      if (rec->refused_by[i])
        printf(" %s %llu", es_refusal_name(i), (unsigned long long)rec->refused_by[i]);
    printf("; refusal took p50 %.1f us, p99 %.1f us; retry-after mean %.1f ms\n",
           series_pct(&rec->refusal_us, 0.5), series_pct(&rec->refusal_us, 0.99),
           rec->retry_ms_sum / (double)rec->refused);
  }
  printf("memory: weights %.2f MiB (%ld cop%s), planned arena %.2f MiB, arena pools %.2f MiB, "
         "lane scratch %.2f MiB, buddy peak %.2f MiB\n",
         cli_mib(r->weights), a->no_share ? a->concurrency : 1L,
         a->no_share && a->concurrency > 1 ? "ies" : "y", cli_mib(r->planned), cli_mib(r->pool),
         cli_mib(r->scratch), cli_mib(r->buddy_peak));
  if (a->rate > 0)
    printf("  formula: weights + %s = %.2f MiB\n",
           r->budget ? "budget" : "peak bytes admitted", cli_mib(r->formula));
  else
    printf("  formula: weights + %ld x planned arena = %.2f MiB\n", a->concurrency,
           cli_mib(r->formula));
  printf("  RSS: baseline %.2f MiB, peak %.2f MiB%s (timed phase %.2f MiB over %lu samples), "
         "end %.2f MiB; PSS %.2f MiB\n",
         cli_mib(r->baseline_rss), cli_mib(r->peak_rss),
         r->peak_reset_ok ? " (model loads included)" : " (whole process)",
         cli_mib(r->timed_peak_rss), r->rss_samples, cli_mib(r->rss), cli_mib(r->pss));
  printf("  mapped or allocated by edgeserve (its counters; not all resident): %.2f MiB:",
         cli_mib(r->counted));
  for (int t = 0; t < ES_MEM_TAG_COUNT; t++)
    if (r->counted_by[t] >= 64 * 1024)
      printf(" %s %.2f", es_mem_tag_name((es_mem_tag)t), cli_mib(r->counted_by[t]));
  printf("\n");
  if (r->budget || a->queue)
    printf("  admission: budget %.2f MiB, queue %u, peak in flight %zu, peak reserved %.2f MiB\n",
           cli_mib(r->budget), r->queue_capacity, r->peak_inflight, cli_mib(r->peak_reserved));
  if (rec->oom)
    printf("warning: out of memory for some samples; percentiles are over fewer requests\n");
}

/* ---- the runtime mode's driver --------------------------------------------------- */

/* Wait until every open-loop request has called back (each holds a handle
 * and admission bytes until then). 0, or -1 after `limit_ms`. */
static int open_drain(bench_rt *b, uint64_t admitted, int limit_ms) {
  for (int waited = 0; atomic_load(&b->finished) < admitted; waited++) {
    if (waited >= limit_ms)
      return -1;
    cli_sleep_ns(1000000ull);
  }
  return 0;
}

/* The runtime: pinned workers, the admission budget and queue asked for,
 * room for every no-share copy. 0, or -1 (printed). */
static int create_runtime(bench_rt *b, bench_result *res) {
  const bench_args *a = b->a;
  es_runtime_config rc;
  es_runtime_config_default(&rc);
  rc.workers = (int)a->workers;
  rc.pin = 1;
  rc.intra_threads = (int)a->threads;
  if (a->queue)
    rc.queue_capacity = (unsigned)a->queue;
  rc.memory_budget_bytes = a->memory;
  int copies = a->no_share ? (int)a->concurrency : 1;
  if (copies + 1 > rc.max_models)
    rc.max_models = copies + 1;
  if (es_runtime_create(&rc, &b->rt) < 0) {
    fprintf(stderr, "edgeserve bench: %s\n", es_last_error_detail());
    return -1;
  }
  es_runtime_stats rs;
  es_runtime_stats_get(b->rt, &rs);
  b->n_workers = rs.workers;
  res->queue_capacity = rc.queue_capacity;
  res->budget = a->memory;
  b->worker_runs = es_mem_calloc(ES_MEM_CLI, (size_t)b->n_workers, sizeof *b->worker_runs);
  if (!b->worker_runs) {
    fprintf(stderr, "edgeserve bench: out of memory\n");
    return -1;
  }
  return 0;
}

/* The inputs are read against the model's inputs, and the configured
 * shape comes from the inputs: so an entry without a shape is loaded
 * first, only to read them. The shared entry loaded next takes the same
 * es_model (the file is parsed once, as a server would); no-share copies
 * are private anyway, so the probe goes before they load. Its id (-1 when
 * already unloaded) in *probe_id; 0, or the exit status (printed). */
static int probe_inputs(bench_rt *b, int *probe_id) {
  const bench_args *a = b->a;
  es_model_config pc;
  es_model_config_default(&pc);
  pc.precision = (es_precision)a->ci.precision;
  pc.name = "probe";
  pc.path = a->model_path;
  pc.arenas = 1;
  if (es_runtime_model_load(b->rt, &pc, probe_id) < 0) {
    fprintf(stderr, "edgeserve bench: %s\n", es_last_error_detail());
    return 1;
  }
  es_model *pm = NULL;
  int irc = es_runtime_model_get(b->rt, *probe_id, &pm) < 0 ? 1 : 0;
  if (irc) {
    fprintf(stderr, "edgeserve bench: %s\n", es_last_error_detail());
  } else {
    b->nin = es_model_input_count(pm);
    irc = cli_inputs_load(pm, &a->ci, "bench", b->in_store, b->shapes);
  }
  /* The names belong to the model: copied, as the probe goes away. */
  for (int i = 0; irc == 0 && i < b->nin; i++) {
    b->names[i] = es_mem_strdup(ES_MEM_CLI, b->shapes[i].name ? b->shapes[i].name : "");
    if (!b->names[i]) {
      fprintf(stderr, "edgeserve bench: out of memory\n");
      irc = 1;
    }
    b->shapes[i].name = b->names[i];
  }
  es_model_release(pm);
  if (irc != 0 || a->no_share) {
    es_runtime_model_unload(b->rt, *probe_id, -1);
    *probe_id = -1;
  }
  b->in = b->in_store;
  return irc;
}

/* Shared: one registry entry whose arena pool has one arena per worker;
 * every stream submits to it. No-share: N entries with share 0, one arena
 * and one request in flight each, stream i to entry i. 0, or -1 (printed). */
static int load_copies(bench_rt *b) {
  const bench_args *a = b->a;
  int copies = a->no_share ? (int)a->concurrency : 1;
  for (int k = 0; k < copies; k++) {
    char name[ES_RT_NAME_MAX];
    if (a->no_share)
      snprintf(name, sizeof name, "m%d", k);
    else
      snprintf(name, sizeof name, "m");
    es_model_config mc;
    es_model_config_default(&mc);
    mc.name = name;
    mc.path = a->model_path;
    mc.shapes = b->shapes;
    mc.n_shapes = b->nin;
    mc.lane = -1;
    mc.share = a->no_share ? 0 : 1;
    mc.precision = (es_precision)a->ci.precision;
    if (a->no_share) {
      mc.arenas = 1;
      mc.max_inflight = 1;
    }
    if (es_runtime_model_load(b->rt, &mc, &b->ids[k]) < 0) {
      fprintf(stderr, "edgeserve bench: loading %s: %s\n", a->model_path,
              es_last_error_detail());
      return -1;
    }
    b->n_ids++;
  }
  return 0;
}

/* Starts the timed phase: CPU time, the RSS sampler, the deadline. */
static double start_timed(bench_rt *b) {
  double cpu0 = cli_cpu_seconds();
  cli_rss_sampler_start(&b->smp, 0);
  b->t0_ns = cli_now_ns();
  b->deadline_ns = b->t0_ns + (uint64_t)(b->a->duration * 1e9);
  return cpu0;
}

/* Closed loop: streams warm up, then start the timed phase together. The
 * end of the phase in *t_end; returns the CPU seconds at its start, or -1
 * (printed). */
static double run_closed(bench_rt *b, bench_result *res, uint64_t *t_end) {
  b->n_streams = (int)b->a->concurrency;
  b->streams = es_mem_calloc(ES_MEM_CLI, (size_t)b->n_streams, sizeof *b->streams);
  if (!b->streams) {
    fprintf(stderr, "edgeserve bench: out of memory\n");
    return -1;
  }
  int started = 0;
  for (int i = 0; i < b->n_streams; i++) {
    bench_stream *st = &b->streams[i];
    st->b = b;
    st->index = i;
    st->model = b->ids[b->a->no_share ? i : 0];
    if (pthread_create(&st->thread, NULL, stream_main, st) != 0) {
      bench_fail(b, ES_ENOMEM, "cannot start a stream thread");
      break;
    }
    st->started = 1;
    started++;
  }
  while (atomic_load(&b->warmed) < started)
    cli_sleep_ns(1000000ull);
  double cpu0 = start_timed(b);
  atomic_store(&b->go, 1);
  for (int i = 0; i < b->n_streams; i++)
    if (b->streams[i].started) {
      pthread_join(b->streams[i].thread, NULL);
      b->streams[i].started = 0;
      if (b->streams[i].end_ns > *t_end)
        *t_end = b->streams[i].end_ns;
    }
  cli_rss_sampler_stop(&b->smp);
  for (int i = 0; i < b->n_streams; i++)
    rec_merge(&res->rec, &b->streams[i].rec);
  return cpu0;
}

/* Open loop: warm every worker, then the submitter runs in this thread and
 * completions are recorded by the callback. As run_closed. */
static double run_open(bench_rt *b, bench_result *res, uint64_t *t_end) {
  if (open_warmup(b) != 0)
    return -1;
  double cpu0 = start_timed(b);
  open_submit(b, &b->sub_rec, &res->lag_max_ms, &res->offered);
  uint64_t t_sub = cli_now_ns();
  /* Everything admitted finishes before anything is reported: the queue is
   * bounded, so this is at most a few runs per worker. */
  if (open_drain(b, b->sub_rec.admitted, 600 * 1000) < 0) {
    bench_fail(b, ES_ETIMEDOUT, "requests still unfinished 10 minutes after the end");
    b->handles_out = 1;
  }
  cli_rss_sampler_stop(&b->smp);
  pthread_mutex_lock(&b->lock);
  /* The phase lasts the whole duration even when the last arrival came
   * early, and until the last admitted request is done. */
  *t_end = b->last_done_ns > t_sub ? b->last_done_ns : t_sub;
  if (*t_end < b->deadline_ns)
    *t_end = b->deadline_ns;
  rec_merge(&res->rec, &b->sub_rec);
  rec_merge(&res->rec, &b->done);
  pthread_mutex_unlock(&b->lock);
  return cpu0;
}

/* Memory, before anything is torn down. */
static void collect_memory(bench_rt *b, bench_result *res) {
  const bench_args *a = b->a;
  es_runtime_stats rs;
  es_runtime_stats_get(b->rt, &rs);
  es_runtime_model_stats ms;
  memset(&ms, 0, sizeof ms);
  es_runtime_model_stats_get(b->rt, b->ids[0], &ms);
  es_admission_stats as;
  memset(&as, 0, sizeof as);
  es_admission_stats_get(es_runtime_admission(b->rt), &as);
  res->planned = ms.planned_bytes;
  res->weights_one = ms.weights_bytes;
  res->weights = rs.weights_bytes;
  res->pool = rs.pool_bytes;
  res->scratch = rs.scratch_bytes;
  res->buddy_peak = rs.buddy_peak;
  res->peak_inflight = as.peak_inflight;
  res->peak_reserved = as.peak_reserved_bytes;
  size_t hwm = 0;
  es_sys_peak_rss(&hwm);
  res->peak_rss = hwm > res->timed_peak_rss ? hwm : res->timed_peak_rss;
  es_sys_rss(&res->rss);
  res->pss = cli_pss();
  /* What edgeserve itself holds, by subsystem: the part of the RSS it can
   * account for (the rest is code, the C library's heap, oneDNN). */
  res->counted = es_mem_total();
  for (int t = 0; t < ES_MEM_TAG_COUNT; t++) {
    es_mem_stats st;
    if (es_mem_stats_get((es_mem_tag)t, &st) == 0)
      res->counted_by[t] = st.current + st.file_mapped;
  }
  if (a->rate > 0)
    res->formula = res->weights + (a->memory ? a->memory : res->peak_reserved);
  else
    res->formula = res->weights + (size_t)a->concurrency * res->planned;
}

/* Loads, runs the timed phase and measures; the report is printed by the
 * caller. 0, or the exit status (printed). */
static int bench_runtime_run(bench_rt *b, bench_result *res) {
  const bench_args *a = b->a;
  es_sys_rss(&res->baseline_rss);
  /* From here the peak is the runtime's own: loads, warm-up, timed phase. */
  res->peak_reset_ok = es_sys_peak_rss_reset() == 0;
  if (create_runtime(b, res) < 0)
    return 1;
  /* The runtime plans on the caller's thread, and oneDNN fixes a
   * primitive's thread count when it is created, from the creating thread's
   * OpenMP setting (all cores by default). Unset, every run on a worker
   * would start a team of all cores, and since the team inherits the pinned
   * worker's one-core affinity its threads would take turns on that core
   * (runs about twice as slow). So this thread plans with the workers'
   * setting. */
  es_engine_threads_set((int)a->threads);
  double t_load = cli_now_ms();
  int probe_id = -1;
  int irc = probe_inputs(b, &probe_id);
  if (irc != 0)
    return irc;
  if (load_copies(b) < 0)
    return 1;
  if (probe_id >= 0)
    es_runtime_model_unload(b->rt, probe_id, -1);
  res->load_ms = cli_now_ms() - t_load;

  uint64_t t_end = 0;
  double cpu0 = a->rate <= 0 ? run_closed(b, res, &t_end) : run_open(b, res, &t_end);
  if (atomic_load(&b->failed)) {
    fprintf(stderr, "edgeserve bench: %s\n", b->err);
    return 1;
  }
  if (cpu0 < 0)
    return 1;
  res->seconds = (double)(t_end - b->t0_ns) / 1e9;
  res->cpu_cores = res->seconds > 0 ? (cli_cpu_seconds() - cpu0) / res->seconds : 0;
  res->timed_peak_rss = atomic_load(&b->smp.max);
  res->rss_samples = atomic_load(&b->smp.samples);
  collect_memory(b, res);
  cli_sort(res->rec.lat_ms.v, res->rec.lat_ms.n);
  cli_sort(res->rec.run_ms.v, res->rec.run_ms.n);
  cli_sort(res->rec.queue_ms.v, res->rec.queue_ms.n);
  cli_sort(res->rec.refusal_us.v, res->rec.refusal_us.n);
  return 0;
}

/* Stops what still runs, shuts the runtime down and frees; a runtime with
 * open-loop requests never called back is left alone (they may still read
 * the inputs). Returns status, or 1 when the shutdown failed. */
static int bench_runtime_end(bench_rt *b, bench_result *res, int status) {
  if (b->streams) { /* only after an early failure are threads still running */
    atomic_store(&b->go, 1);
    for (int i = 0; i < b->n_streams; i++)
      if (b->streams[i].started)
        pthread_join(b->streams[i].thread, NULL);
    for (int i = 0; i < b->n_streams; i++)
      rec_free(&b->streams[i].rec);
  }
  cli_rss_sampler_stop(&b->smp);
  if (b->rt && !b->handles_out) {
    /* Handles freed by a callback are released just after it returns:
     * destroy says busy until then. */
    int drc, tries = 0;
    while ((drc = es_runtime_destroy(b->rt)) == ES_EBUSY && tries++ < 10000)
      cli_sleep_ns(1000000ull);
    if (drc < 0) {
      fprintf(stderr, "edgeserve bench: shutting the runtime down: %s\n",
              es_last_error_detail());
      status = 1;
    }
  }
  rec_free(&res->rec);
  rec_free(&b->sub_rec);
  rec_free(&b->done);
  for (int i = 0; i < CLI_MAX_INPUTS; i++)
    es_mem_free(b->names[i]);
  es_mem_free(b->streams);
  if (!b->handles_out) {
    cli_inputs_free(b->in_store, CLI_MAX_INPUTS);
    es_mem_free(b->worker_runs);
    pthread_mutex_destroy(&b->lock);
    es_mem_free(b);
  }
  return status;
}

static int bench_runtime(const bench_args *a) {
  bench_rt *b = es_mem_calloc(ES_MEM_CLI, 1, sizeof *b);
  if (!b) {
    fprintf(stderr, "edgeserve bench: out of memory\n");
    return 1;
  }
  b->a = a;
  pthread_mutex_init(&b->lock, NULL);
  bench_result res;
  memset(&res, 0, sizeof res);
  const char *slash = strrchr(a->model_path, '/');
  res.model = slash ? slash + 1 : a->model_path;
  int status = bench_runtime_run(b, &res);
  if (status == 0) {
    if (a->json)
      report_json(b, &res);
    else
      report_text(b, &res);
    fflush(stdout);
  }
  return bench_runtime_end(b, &res, status);
}

/* ===========================================================================
 * Arguments.
 * ========================================================================= */

/* The options into a. -1 to go on, else the exit status (0 after --help). */
static int parse_args(bench_args *a, int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    int r;
    if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
      bench_usage(stdout);
      return 0;
    } else if ((r = cli_inputs_arg(&a->ci, "bench", argc, argv, &i)) != 0) {
      if (r == 2)
        return 2;
    } else if (!strcmp(arg, "--json")) {
      a->json = 1;
    } else if (!strcmp(arg, "--profile")) {
      a->profile = 1;
    } else if (!strcmp(arg, "--load-twice")) {
      a->load_twice = 1;
    } else if (!strcmp(arg, "--perf")) {
      a->perf = 1;
    } else if (!strcmp(arg, "--cache-dir") && i + 1 < argc) {
      if (es_engine_cache_dir_set(argv[++i]) < 0) {
        fprintf(stderr, "edgeserve bench: --cache-dir: %s\n", es_last_error_detail());
        return 2;
      }
    } else if (!strcmp(arg, "--split") && i + 1 < argc) {
      if (parse_real(argv[++i], 0, 1e6, &a->split_mflop) < 0) {
        fprintf(stderr, "edgeserve bench: --split wants MFLOP above 0, got '%s'\n", argv[i]);
        return 2;
      }
    } else if (!strcmp(arg, "--no-share")) {
      a->no_share = 1;
      a->runtime_opt_name = arg;
    } else if ((!strcmp(arg, "--threads") || !strcmp(arg, "--iters") ||
                !strcmp(arg, "--warmup")) &&
               i + 1 < argc) {
      long *dst = !strcmp(arg, "--threads") ? &a->threads
                  : !strcmp(arg, "--iters")   ? &a->iters
                                              : &a->warmup;
      long lo = dst == &a->warmup ? 0 : 1, hi = dst == &a->threads ? 1024 : 1000000;
      if (cli_parse_count(argv[++i], lo, hi, dst) < 0) {
        fprintf(stderr, "edgeserve bench: %s wants %ld..%ld, got '%s'\n", arg, lo, hi, argv[i]);
        return 2;
      }
      *(dst == &a->threads ? &a->threads_set
        : dst == &a->iters ? &a->iters_set
                           : &a->warmup_set) = 1;
    } else if ((!strcmp(arg, "--concurrency") || !strcmp(arg, "--workers") ||
                !strcmp(arg, "--queue")) &&
               i + 1 < argc) {
      int conc = !strcmp(arg, "--concurrency"), work = !strcmp(arg, "--workers");
      long *dst = conc ? &a->concurrency : work ? &a->workers : &a->queue;
      long lo = work ? 0 : 1, hi = conc ? 1000 : work ? 1024 : 1000000;
      if (cli_parse_count(argv[++i], lo, hi, dst) < 0) {
        fprintf(stderr, "edgeserve bench: %s wants %ld..%ld, got '%s'\n", arg, lo, hi, argv[i]);
        return 2;
      }
      if (!conc)
        a->runtime_opt_name = arg;
    } else if (!strcmp(arg, "--paced")) {
      a->paced = 1;
    } else if ((!strcmp(arg, "--duration") || !strcmp(arg, "--rate")) && i + 1 < argc) {
      int dur = !strcmp(arg, "--duration");
      double hi = dur ? 86400 : 1e6;
      if (parse_real(argv[++i], 0, hi, dur ? &a->duration : &a->rate) < 0) {
        fprintf(stderr, "edgeserve bench: %s wants a number in (0, %g], got '%s'\n", arg, hi,
                argv[i]);
        return 2;
      }
      if (dur)
        a->runtime_opt_name = arg;
    } else if (!strcmp(arg, "--memory") && i + 1 < argc) {
      if (cli_parse_bytes(argv[++i], &a->memory) < 0 || a->memory == 0) {
        fprintf(stderr, "edgeserve bench: --memory wants BYTES (K/M/G suffix), got '%s'\n",
                argv[i]);
        return 2;
      }
      a->runtime_opt_name = arg;
    } else if (cli_inputs_positional(&a->ci, "bench", arg, &a->model_path) != 0) {
      bench_usage(stderr);
      return 2;
    }
  }
  if (!a->model_path) {
    bench_usage(stderr);
    return 2;
  }
  return -1;
}

int cli_cmd_bench(int argc, char **argv) {
  bench_args a;
  memset(&a, 0, sizeof a);
  a.threads = 1;
  a.iters = 50;
  a.warmup = 5;
  a.duration = 10;
  int status = parse_args(&a, argc, argv);
  if (status >= 0)
    return status;
  if (!a.concurrency && a.rate <= 0) {
    if (a.runtime_opt_name) {
      fprintf(stderr, "edgeserve bench: %s needs --concurrency N or --rate R\n",
              a.runtime_opt_name);
      return 2;
    }
    return bench_inproc(&a);
  }
  if (a.iters_set || a.profile || a.load_twice || a.split_mflop > 0 || a.perf) {
    fprintf(stderr, "edgeserve bench: %s is for the in-process mode (without --concurrency "
                    "or --rate)\n",
            a.profile        ? "--profile"
            : a.load_twice   ? "--load-twice"
            : a.split_mflop > 0 ? "--split"
            : a.perf         ? "--perf"
                             : "--iters");
    return 2;
  }
  if (a.no_share && !a.concurrency) {
    fprintf(stderr, "edgeserve bench: --no-share needs --concurrency N (the number of "
                    "copies)\n");
    return 2;
  }
  if (!a.warmup_set)
    a.warmup = 2;
  return bench_runtime(&a);
}
