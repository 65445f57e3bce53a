/* Admission gate (label "concurrency": CI also runs it under TSan).
 *
 * Single-threaded tests drive a fake clock so the drain-rate estimates are
 * exact; the stress test runs 8 threads against the real clock and checks
 * the invariants from outside: counters the test keeps itself (raised after
 * an admit, lowered before its done, so they never exceed the gate's) must
 * stay within the limits, and everything must balance at the end.
 *
 * Worker threads never call cmocka's assertions; they count failures and
 * keep the first message, and the main thread asserts after joining. */
#include "es_test.h"

#include "edgeserve/runtime.h"

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#define MS 1000000ull

static _Atomic uint64_t fake_ns_ = 1000 * MS;

static uint64_t fake_clock(void *user) {
  (void)user;
  return atomic_load(&fake_ns_);
}

static void advance(uint64_t ns) { atomic_fetch_add(&fake_ns_, ns); }

static es_admission_config fake_cfg(void) {
  es_admission_config c;
  es_admission_config_default(&c);
  c.clock = fake_clock;
  c.default_retry_ms = 777;
  return c;
}

static es_admission *make(const es_admission_config *c) {
  es_admission *a = NULL;
  ES_CHECK_RC(es_admission_create(c, &a));
  return a;
}

static es_admission_stats stats_of(es_admission *a) {
  es_admission_stats s;
  ES_CHECK_RC(es_admission_stats_get(a, &s));
  return s;
}

/* Expect a refusal for this reason; returns it. */
static es_refusal expect_refused(es_admission *a, int model, size_t bytes, int want, int line) {
  es_admit_ticket t;
  es_refusal w;
  memset(&w, 0, sizeof w);
  int rc = es_admission_try(a, model, bytes, &t, &w);
  if (rc != ES_EAGAIN || w.reason != want)
    fail_msg("line %d: try -> %s refused for %s, want ES_EAGAIN and %s (%s)", line,
             es_err_name(rc), es_refusal_name(w.reason), es_refusal_name(want),
             es_last_error_detail());
  if (!strstr(es_last_error_detail(), es_refusal_name(want)))
    fail_msg("line %d: detail does not name the reason: %s", line, es_last_error_detail());
  if (w.retry_after_ms < 1 || w.retry_after_ms > 60000 || w.model_id != model)
    fail_msg("line %d: retry %u ms, model %d", line, w.retry_after_ms, w.model_id);
  return w;
}
#define EXPECT_REFUSED(a, model, bytes, want)                                          \
  expect_refused((a), (model), (bytes), (want), __LINE__)

static es_memstat memstat_v2(size_t current, size_t high, size_t max) {
  es_memstat st;
  memset(&st, 0, sizeof st);
  st.version = 2;
  st.current = current;
  st.high = high;
  st.max = max;
  snprintf(st.path, sizeof st.path, "/sys/fs/cgroup/test");
  return st;
}

/* ---- configuration and names ---------------------------------------------- */

static void test_config(void **state) {
  (void)state;
  es_admission_config c;
  es_admission_config_default(&c);
  assert_int_equal(c.max_models, 64);
  assert_true(c.soft_ratio == 0.85 && c.hard_ratio == 0.95);
  assert_int_equal(c.default_retry_ms, 1000);

  es_admission *a = (es_admission *)0x1;
  es_admission_config bad = c;
  bad.max_models = 0;
  ES_EXPECT_RC(es_admission_create(&bad, &a), ES_EINVAL);
  bad = c;
  bad.max_models = 65537;
  ES_EXPECT_RC(es_admission_create(&bad, &a), ES_EINVAL);
  bad = c;
  bad.soft_ratio = 0.99;
  ES_EXPECT_RC(es_admission_create(&bad, &a), ES_EINVAL);
  assert_non_null(strstr(es_last_error_detail(), "soft_ratio"));
  bad = c;
  bad.hard_ratio = 1.5;
  ES_EXPECT_RC(es_admission_create(&bad, &a), ES_EINVAL);
  bad = c;
  bad.soft_ratio = 0;
  ES_EXPECT_RC(es_admission_create(&bad, &a), ES_EINVAL);
  bad = c;
  bad.soft_ratio = NAN;
  ES_EXPECT_RC(es_admission_create(&bad, &a), ES_EINVAL);
  bad = c;
  bad.default_retry_ms = 0;
  ES_EXPECT_RC(es_admission_create(&bad, &a), ES_EINVAL);
  bad.default_retry_ms = 60001;
  ES_EXPECT_RC(es_admission_create(&bad, &a), ES_EINVAL);
  ES_EXPECT_RC(es_admission_create(NULL, &a), ES_EINVAL);
  ES_EXPECT_RC(es_admission_create(&c, NULL), ES_EINVAL);
  assert_ptr_equal(a, (es_admission *)0x1); /* untouched on failure */

  size_t before = es_mem_total();
  a = make(&c);
  assert_true(es_mem_total() > before); /* counted */
  ES_CHECK_RC(es_admission_destroy(a));
  assert_int_equal(es_mem_total(), before);
  ES_CHECK_RC(es_admission_destroy(NULL));
}

static void test_names(void **state) {
  (void)state;
  assert_string_equal(es_refusal_name(ES_REFUSE_NONE), "none");
  assert_string_equal(es_refusal_name(ES_REFUSE_QUEUE_FULL), "queue_full");
  assert_string_equal(es_refusal_name(ES_REFUSE_OVER_CONCURRENCY), "over_concurrency");
  assert_string_equal(es_refusal_name(ES_REFUSE_OVER_MEMORY), "over_memory");
  assert_string_equal(es_refusal_name(ES_REFUSE_MEMORY_PRESSURE), "memory_pressure");
  assert_string_equal(es_refusal_name(ES_REFUSE_DEADLINE), "deadline");
  assert_string_equal(es_refusal_name(ES_REFUSE_DRAINING), "draining");
  assert_string_equal(es_refusal_name(ES_REFUSE_COUNT), "?");
  assert_string_equal(es_refusal_name(-1), "?");
}

/* ---- reservations and limits ------------------------------------------------ */

static void test_budget_exact(void **state) {
  (void)state;
  es_admission_config c = fake_cfg();
  c.memory_budget_bytes = 1000;
  es_admission *a = make(&c);
  es_admit_ticket t1, t2, t3, t0;
  es_refusal why;
  ES_CHECK_RC(es_admission_try(a, 0, 300, &t1, &why));
  assert_int_equal(stats_of(a).reserved_bytes, 300);
  ES_CHECK_RC(es_admission_try(a, 1, 700, &t2, &why)); /* exactly fills it */
  assert_int_equal(stats_of(a).reserved_bytes, 1000);
  ES_CHECK_RC(es_admission_try(a, 2, 0, &t0, &why)); /* zero bytes always fit */

  es_refusal w = EXPECT_REFUSED(a, 3, 1, ES_REFUSE_OVER_MEMORY);
  assert_int_equal(w.requested, 1);
  assert_int_equal(w.in_use, 1000);
  assert_int_equal(w.limit, 1000);
  assert_int_equal(w.retry_after_ms, 777); /* nothing completed yet */

  ES_CHECK_RC(es_admission_done(a, &t1, 5 * MS));
  assert_int_equal(stats_of(a).reserved_bytes, 700);
  EXPECT_REFUSED(a, 3, 301, ES_REFUSE_OVER_MEMORY);
  ES_CHECK_RC(es_admission_try(a, 3, 300, &t3, &why));
  assert_int_equal(stats_of(a).reserved_bytes, 1000);

  /* Larger than the whole budget: never, and said so. */
  memset(&why, 0, sizeof why);
  ES_EXPECT_RC(es_admission_try(a, 0, 1001, &t1, &why), ES_ENOSPC);
  assert_int_equal(why.reason, ES_REFUSE_OVER_MEMORY);
  assert_int_equal(why.retry_after_ms, 0);
  assert_non_null(strstr(es_last_error_detail(), "never"));

  ES_CHECK_RC(es_admission_done(a, &t2, 0));
  ES_CHECK_RC(es_admission_done(a, &t3, 0));
  ES_CHECK_RC(es_admission_done(a, &t0, 0));
  es_admission_stats s = stats_of(a);
  assert_int_equal(s.reserved_bytes, 0);
  assert_int_equal(s.peak_reserved_bytes, 1000);
  assert_int_equal(s.admitted, 4);
  assert_int_equal(s.completed, 4);
  assert_int_equal(s.inflight, 0);
  assert_int_equal(s.refused_by[ES_REFUSE_OVER_MEMORY], 3);
  assert_int_equal(s.refused, 3);
  assert_int_equal(s.memory_budget_bytes, 1000);
  ES_CHECK_RC(es_admission_destroy(a));

  /* No budget: reservations are still counted. */
  c.memory_budget_bytes = 0;
  a = make(&c);
  ES_CHECK_RC(es_admission_try(a, 0, (size_t)1 << 40, &t1, &why));
  ES_CHECK_RC(es_admission_try(a, 0, 5, &t2, &why));
  assert_int_equal(stats_of(a).reserved_bytes, ((size_t)1 << 40) + 5);
  EXPECT_REFUSED(a, 0, SIZE_MAX, ES_REFUSE_OVER_MEMORY); /* would overflow */
  ES_CHECK_RC(es_admission_done(a, &t1, 0));
  ES_CHECK_RC(es_admission_done(a, &t2, 0));
  assert_int_equal(stats_of(a).reserved_bytes, 0);
  ES_CHECK_RC(es_admission_destroy(a));
}

static void test_concurrency_limits(void **state) {
  (void)state;
  es_admission_config c = fake_cfg();
  c.max_inflight_total = 3;
  c.model_max_inflight = 2;
  c.memory_budget_bytes = 1 << 20;
  es_admission *a = make(&c);
  es_admit_ticket t[4];
  es_refusal why;
  ES_CHECK_RC(es_admission_try(a, 0, 100, &t[0], &why));
  ES_CHECK_RC(es_admission_try(a, 0, 100, &t[1], &why));
  es_refusal w = EXPECT_REFUSED(a, 0, 100, ES_REFUSE_OVER_CONCURRENCY);
  assert_int_equal(w.in_use, 2); /* the model's slots */
  assert_int_equal(w.limit, 2);
  assert_int_equal(stats_of(a).reserved_bytes, 200); /* the refusal gave its bytes back */
  assert_int_equal(stats_of(a).inflight, 2);

  ES_CHECK_RC(es_admission_try(a, 1, 100, &t[2], &why));
  w = EXPECT_REFUSED(a, 1, 100, ES_REFUSE_OVER_CONCURRENCY);
  assert_int_equal(w.in_use, 3); /* the total */
  assert_int_equal(w.limit, 3);
  assert_int_equal(stats_of(a).reserved_bytes, 300);

  /* Raising the model's limit does not lift the total. */
  ES_CHECK_RC(es_admission_set_model_limit(a, 0, 0));
  EXPECT_REFUSED(a, 0, 100, ES_REFUSE_OVER_CONCURRENCY);
  ES_CHECK_RC(es_admission_done(a, &t[2], 0));
  ES_CHECK_RC(es_admission_try(a, 0, 100, &t[2], &why)); /* model 0's third */

  /* Lowering it below what is in flight refuses until it drains. */
  ES_CHECK_RC(es_admission_set_model_limit(a, 0, 1));
  ES_CHECK_RC(es_admission_done(a, &t[0], 0));
  w = EXPECT_REFUSED(a, 0, 100, ES_REFUSE_OVER_CONCURRENCY);
  assert_int_equal(w.in_use, 2);
  assert_int_equal(w.limit, 1);
  ES_CHECK_RC(es_admission_done(a, &t[1], 0));
  EXPECT_REFUSED(a, 0, 100, ES_REFUSE_OVER_CONCURRENCY);
  ES_CHECK_RC(es_admission_done(a, &t[2], 0));
  ES_CHECK_RC(es_admission_try(a, 0, 100, &t[0], &why));

  es_admission_model_stats ms;
  ES_CHECK_RC(es_admission_model_stats_get(a, 0, &ms));
  assert_int_equal(ms.inflight, 1);
  assert_int_equal(ms.max_inflight, 1);
  assert_int_equal(ms.admitted, 4);
  assert_int_equal(ms.completed, 3);
  assert_int_equal(ms.refused, 4);
  ES_CHECK_RC(es_admission_model_stats_get(a, 1, &ms));
  assert_int_equal(ms.admitted, 1);
  assert_int_equal(ms.refused, 1);
  assert_int_equal(ms.max_inflight, 2);
  ES_CHECK_RC(es_admission_done(a, &t[0], 0));

  es_admission_stats s = stats_of(a);
  assert_int_equal(s.peak_inflight, 3);
  assert_int_equal(s.refused_by[ES_REFUSE_OVER_CONCURRENCY], 5);
  assert_int_equal(s.reserved_bytes, 0);
  assert_int_equal(s.inflight, 0);
  ES_CHECK_RC(es_admission_destroy(a));
}

/* Draining, then pressure, then budget, then total, then model slots; a
 * refusal holds nothing. */
static void test_check_order(void **state) {
  (void)state;
  es_admission_config c = fake_cfg();
  c.memory_budget_bytes = 1000;
  c.max_inflight_total = 1;
  c.model_max_inflight = 1;
  es_admission *a = make(&c);
  es_admit_ticket held;
  es_refusal why;
  ES_CHECK_RC(es_admission_try(a, 0, 900, &held, &why));

  es_memstat hot = memstat_v2(950, SIZE_MAX, 1000), cool = memstat_v2(100, SIZE_MAX, 1000);
  ES_CHECK_RC(es_admission_observe(a, &hot));
  ES_CHECK_RC(es_admission_set_draining(a, 0, 1));
  EXPECT_REFUSED(a, 0, 500, ES_REFUSE_DRAINING);
  ES_CHECK_RC(es_admission_set_draining(a, 0, 0));
  EXPECT_REFUSED(a, 0, 500, ES_REFUSE_MEMORY_PRESSURE);
  ES_CHECK_RC(es_admission_observe(a, &cool));
  EXPECT_REFUSED(a, 0, 500, ES_REFUSE_OVER_MEMORY);
  es_refusal w = EXPECT_REFUSED(a, 0, 50, ES_REFUSE_OVER_CONCURRENCY);
  assert_int_equal(w.limit, 1);

  es_admission_stats s = stats_of(a);
  assert_int_equal(s.reserved_bytes, 900);
  assert_int_equal(s.inflight, 1);
  assert_int_equal(s.refused, 4);
  for (int r = ES_REFUSE_OVER_CONCURRENCY; r <= ES_REFUSE_DRAINING; r++)
    if (r != ES_REFUSE_DEADLINE)
      assert_int_equal(s.refused_by[r], 1);

  /* Draining the whole gate; in-flight work still finishes. */
  ES_CHECK_RC(es_admission_set_draining(a, -1, 1));
  EXPECT_REFUSED(a, 5, 0, ES_REFUSE_DRAINING);
  ES_CHECK_RC(es_admission_done(a, &held, 0));
  EXPECT_REFUSED(a, 0, 0, ES_REFUSE_DRAINING);
  ES_CHECK_RC(es_admission_set_draining(a, -1, 0));
  ES_CHECK_RC(es_admission_try(a, 0, 1000, &held, &why));
  ES_CHECK_RC(es_admission_done(a, &held, 0));
  ES_EXPECT_RC(es_admission_set_draining(a, 64, 1), ES_EINVAL);
  ES_CHECK_RC(es_admission_destroy(a));
}

static void test_bad_args(void **state) {
  (void)state;
  es_admission_config c = fake_cfg();
  c.max_models = 4;
  es_admission *a = make(&c), *b = make(&c);
  es_admit_ticket t, tb;
  es_refusal why;
  ES_EXPECT_RC(es_admission_try(a, -1, 0, &t, &why), ES_EINVAL);
  ES_EXPECT_RC(es_admission_try(a, 4, 0, &t, &why), ES_EINVAL);
  ES_EXPECT_RC(es_admission_try(a, 0, 0, NULL, &why), ES_EINVAL);
  ES_EXPECT_RC(es_admission_try(a, 0, 0, &t, NULL), ES_EINVAL);
  ES_EXPECT_RC(es_admission_try(NULL, 0, 0, &t, &why), ES_EINVAL);
  ES_EXPECT_RC(es_admission_set_model_limit(a, 4, 1), ES_EINVAL);
  ES_EXPECT_RC(es_admission_observe(a, NULL), ES_EINVAL);
  ES_EXPECT_RC(es_admission_stats_get(a, NULL), ES_EINVAL);
  ES_EXPECT_RC(es_admission_model_stats_get(a, 9, NULL), ES_EINVAL);

  ES_CHECK_RC(es_admission_try(a, 1, 10, &t, &why));
  ES_CHECK_RC(es_admission_try(b, 1, 10, &tb, &why));
  ES_EXPECT_RC(es_admission_destroy(a), ES_EBUSY);
  ES_EXPECT_RC(es_admission_done(a, &tb, 0), ES_EFOREIGN);
  es_admit_ticket junk;
  memset(&junk, 0, sizeof junk);
  ES_EXPECT_RC(es_admission_done(a, &junk, 0), ES_ECORRUPT);
  ES_EXPECT_RC(es_admission_done(a, NULL, 0), ES_EINVAL);
  assert_int_equal(stats_of(a).inflight, 1); /* unchanged by the refused calls */
  es_admit_ticket copy = t;
  ES_CHECK_RC(es_admission_done(a, &t, 0));
  ES_EXPECT_RC(es_admission_done(a, &t, 0), ES_EDOUBLEFREE);
  ES_EXPECT_RC(es_admission_done(a, &copy, 0), ES_ECORRUPT); /* no wrap below zero */
  es_admission_stats s = stats_of(a);
  assert_int_equal(s.inflight, 0);
  assert_int_equal(s.completed, 1);
  assert_int_equal(s.reserved_bytes, 0);
  ES_CHECK_RC(es_admission_done(b, &tb, 0));
  ES_CHECK_RC(es_admission_destroy(a));
  ES_CHECK_RC(es_admission_destroy(b));
}

/* ---- memory watermarks ------------------------------------------------------ */

static void test_pressure(void **state) {
  (void)state;
  es_admission_config c = fake_cfg();
  es_admission *a = make(&c);
  es_memstat st;
  assert_int_equal(es_admission_pressure(a), ES_PRESSURE_NONE); /* nothing seen yet */

  /* A group with max 1000: soft mark 850, hard 950. */
  st = memstat_v2(800, SIZE_MAX, 1000);
  ES_CHECK_RC(es_admission_observe(a, &st));
  assert_int_equal(es_admission_pressure(a), ES_PRESSURE_NONE);
  es_admission_stats s = stats_of(a);
  assert_int_equal(s.mem_used, 800);
  assert_int_equal(s.mem_soft, 850);
  assert_int_equal(s.mem_hard, 950);

  st.current = 900;
  ES_CHECK_RC(es_admission_observe(a, &st));
  assert_int_equal(es_admission_pressure(a), ES_PRESSURE_SOFT);
  es_refusal w = EXPECT_REFUSED(a, 0, 100, ES_REFUSE_MEMORY_PRESSURE);
  assert_int_equal(w.requested, 100);
  assert_int_equal(w.in_use, 900);
  assert_int_equal(w.limit, 850);

  /* Page cache the kernel can drop first does not count. */
  st.inactive_file = 100;
  ES_CHECK_RC(es_admission_observe(a, &st));
  assert_int_equal(es_admission_pressure(a), ES_PRESSURE_NONE);
  assert_int_equal(stats_of(a).mem_used, 800);

  st.inactive_file = 0;
  st.current = 960;
  ES_CHECK_RC(es_admission_observe(a, &st));
  assert_int_equal(es_admission_pressure(a), ES_PRESSURE_HARD);
  EXPECT_REFUSED(a, 0, 0, ES_REFUSE_MEMORY_PRESSURE);

  /* memory.high is where the kernel starts throttling: it is the limit. */
  st = memstat_v2(430, 500, SIZE_MAX);
  ES_CHECK_RC(es_admission_observe(a, &st));
  assert_int_equal(es_admission_pressure(a), ES_PRESSURE_SOFT);
  assert_int_equal(stats_of(a).mem_soft, 425);
  st = memstat_v2(430, 500, 5000);
  ES_CHECK_RC(es_admission_observe(a, &st));
  assert_int_equal(es_admission_pressure(a), ES_PRESSURE_SOFT);

  /* No cgroup: the machine's MemTotal - MemAvailable. */
  memset(&st, 0, sizeof st);
  st.high = st.max = SIZE_MAX;
  st.mem_total = 1000;
  st.mem_available = 100;
  ES_CHECK_RC(es_admission_observe(a, &st));
  assert_int_equal(es_admission_pressure(a), ES_PRESSURE_SOFT);
  assert_int_equal(stats_of(a).mem_used, 900);
  st.mem_available = 500;
  ES_CHECK_RC(es_admission_observe(a, &st));
  assert_int_equal(es_admission_pressure(a), ES_PRESSURE_NONE);

  /* A roomy group on a machine that is out of memory: the machine binds. */
  st = memstat_v2(100, SIZE_MAX, 1000);
  st.mem_total = 1000;
  st.mem_available = 30;
  ES_CHECK_RC(es_admission_observe(a, &st));
  assert_int_equal(es_admission_pressure(a), ES_PRESSURE_HARD);
  assert_int_equal(stats_of(a).mem_used, 970);
  st.mem_available = 900;
  ES_CHECK_RC(es_admission_observe(a, &st));
  assert_int_equal(es_admission_pressure(a), ES_PRESSURE_NONE);
  assert_int_equal(stats_of(a).mem_used, 100); /* the group is nearer its mark */

  /* Nothing known: no pressure. */
  memset(&st, 0, sizeof st);
  st.high = st.max = SIZE_MAX;
  ES_CHECK_RC(es_admission_observe(a, &st));
  assert_int_equal(es_admission_pressure(a), ES_PRESSURE_NONE);
  ES_CHECK_RC(es_admission_destroy(a));
}

static void test_events(void **state) {
  (void)state;
  es_admission_config c = fake_cfg();
  es_admission *a = make(&c);
  es_memstat st = memstat_v2(100, SIZE_MAX, 10000);
  st.events.high = 3;
  st.events.oom = 2; /* history before we started watching */
  ES_CHECK_RC(es_admission_observe(a, &st));
  assert_int_equal(es_admission_pressure(a), ES_PRESSURE_NONE);
  st.events.high = 5;
  st.events.max = 1;
  ES_CHECK_RC(es_admission_observe(a, &st));
  assert_int_equal(es_admission_pressure(a), ES_PRESSURE_NONE);
  st.events.oom_kill = 1; /* the kernel killed someone in the group */
  ES_CHECK_RC(es_admission_observe(a, &st));
  assert_int_equal(es_admission_pressure(a), ES_PRESSURE_HARD);
  EXPECT_REFUSED(a, 0, 0, ES_REFUSE_MEMORY_PRESSURE);
  ES_CHECK_RC(es_admission_observe(a, &st)); /* no new event: back to the level */
  assert_int_equal(es_admission_pressure(a), ES_PRESSURE_NONE);
  st.events.oom = 3;
  ES_CHECK_RC(es_admission_observe(a, &st));
  assert_int_equal(es_admission_pressure(a), ES_PRESSURE_HARD);

  es_admission_stats s = stats_of(a);
  assert_int_equal(s.observations, 5);
  assert_int_equal(s.high_events, 2);
  assert_int_equal(s.max_events, 1);
  assert_int_equal(s.oom_events, 2);
  ES_CHECK_RC(es_admission_destroy(a));
}

/* ---- retry-after from the drain rate --------------------------------------- */

/* With one slot, complete and re-admit every `step` ns, `n` times. */
static void cycle(es_admission *a, es_admit_ticket *t, uint64_t step, int n) {
  es_refusal why;
  for (int i = 0; i < n; i++) {
    advance(step);
    ES_CHECK_RC(es_admission_done(a, t, step));
    ES_CHECK_RC(es_admission_try(a, 0, 0, t, &why));
  }
}

static uint32_t retry_now(es_admission *a) {
  return EXPECT_REFUSED(a, 0, 0, ES_REFUSE_OVER_CONCURRENCY).retry_after_ms;
}

static void test_retry_tracks_drain(void **state) {
  (void)state;
  es_admission_config c = fake_cfg();
  c.model_max_inflight = 1;
  es_admission *a = make(&c);
  es_admit_ticket t;
  es_refusal why;
  ES_CHECK_RC(es_admission_try(a, 0, 0, &t, &why));
  assert_int_equal(retry_now(a), 777); /* the default, before any completion */

  cycle(a, &t, 10 * MS, 40);
  uint32_t mid = retry_now(a);
  cycle(a, &t, 1 * MS, 60);
  uint32_t fast = retry_now(a);
  cycle(a, &t, 100 * MS, 60);
  uint32_t slow = retry_now(a);
  print_message("# one slot: retry after %u ms at 10 ms/request, %u at 1 ms, %u at 100 ms\n",
                mid, fast, slow);
  assert_true(mid >= 10 && mid <= 11);
  assert_true(fast >= 1 && fast <= 2);
  assert_true(slow >= 100 && slow <= 101);

  es_admission_model_stats ms;
  ES_CHECK_RC(es_admission_model_stats_get(a, 0, &ms));
  assert_true(ms.drain_per_sec > 9.9 && ms.drain_per_sec < 10.1);
  assert_true(ms.mean_service_ns > 99.0 * MS && ms.mean_service_ns < 101.0 * MS);

  /* A stall: work in flight, nothing done for 5 s, then 2 min (clamped). */
  advance(5000 * MS);
  uint32_t stalled = retry_now(a);
  assert_true(stalled >= 5000 && stalled <= 5001);
  advance(120000 * MS);
  assert_int_equal(retry_now(a), 60000);

  /* An idle spell is not a stall: done, wait 10 s with nothing in flight,
   * admit again: the estimate is back to the request's pace. */
  ES_CHECK_RC(es_admission_done(a, &t, 100 * MS));
  advance(10000 * MS);
  ES_CHECK_RC(es_admission_try(a, 0, 0, &t, &why));
  uint32_t after_idle = retry_now(a);
  assert_true(after_idle >= 100 && after_idle <= 101);
  ES_CHECK_RC(es_admission_model_stats_get(a, 0, &ms));
  assert_true(ms.drain_per_sec > 9.9 && ms.drain_per_sec < 10.1);
  ES_CHECK_RC(es_admission_done(a, &t, 0));
  ES_CHECK_RC(es_admission_destroy(a));
}

/* Bytes: 10 requests of 100 B in flight, one completing every 10 ms: 300 B
 * missing is 3 completions, 30 ms. */
static void test_retry_bytes(void **state) {
  (void)state;
  es_admission_config c = fake_cfg();
  c.memory_budget_bytes = 1000;
  es_admission *a = make(&c);
  es_admit_ticket t[10];
  es_refusal why;
  for (int i = 0; i < 10; i++)
    ES_CHECK_RC(es_admission_try(a, i % 3, 100, &t[i], &why));
  es_refusal w = EXPECT_REFUSED(a, 0, 300, ES_REFUSE_OVER_MEMORY);
  assert_int_equal(w.retry_after_ms, 777);
  for (int round = 0; round < 50; round++) {
    advance(10 * MS);
    ES_CHECK_RC(es_admission_done(a, &t[round % 10], 100 * MS));
    ES_CHECK_RC(es_admission_try(a, round % 3, 100, &t[round % 10], &why));
  }
  w = EXPECT_REFUSED(a, 0, 300, ES_REFUSE_OVER_MEMORY);
  assert_int_equal(w.in_use, 1000);
  assert_true(w.retry_after_ms >= 30 && w.retry_after_ms <= 31);
  es_admission_stats s = stats_of(a);
  assert_true(s.drain_per_sec > 99 && s.drain_per_sec < 101);
  assert_true(s.drain_bytes_per_sec > 9900 && s.drain_bytes_per_sec < 10100);

  /* Pressure: 200 B over the soft mark plus the request's 100 B. */
  es_memstat st = memstat_v2(1050, SIZE_MAX, 1000);
  ES_CHECK_RC(es_admission_observe(a, &st));
  w = EXPECT_REFUSED(a, 1, 100, ES_REFUSE_MEMORY_PRESSURE);
  assert_true(w.retry_after_ms >= 30 && w.retry_after_ms <= 31);

  /* The scheduler's own refusals: 9 ahead at model 0's pace. */
  ES_EXPECT_RC(es_admission_try(a, 0, 0, &t[0], NULL), ES_EINVAL); /* sets a detail */
  ES_CHECK_RC(es_admission_refuse(a, -1, ES_REFUSE_QUEUE_FULL, 9, &w));
  assert_non_null(strstr(es_last_error_detail(), "NULL")); /* a success keeps it */
  assert_int_equal(w.reason, ES_REFUSE_QUEUE_FULL);
  assert_int_equal(w.model_id, -1);
  assert_true(w.retry_after_ms >= 100 && w.retry_after_ms <= 101);
  ES_CHECK_RC(es_admission_refuse(a, 0, ES_REFUSE_DEADLINE, 0, &w));
  assert_int_equal(w.reason, ES_REFUSE_DEADLINE);
  assert_true(w.retry_after_ms >= 1);
  ES_EXPECT_RC(es_admission_refuse(a, 0, ES_REFUSE_NONE, 0, &w), ES_EINVAL);
  ES_EXPECT_RC(es_admission_refuse(a, 0, ES_REFUSE_COUNT, 0, &w), ES_EINVAL);
  ES_EXPECT_RC(es_admission_refuse(a, 99, ES_REFUSE_DEADLINE, 0, &w), ES_EINVAL);
  s = stats_of(a);
  assert_int_equal(s.refused_by[ES_REFUSE_QUEUE_FULL], 1);
  assert_int_equal(s.refused_by[ES_REFUSE_DEADLINE], 1);
  es_admission_model_stats ms;
  ES_CHECK_RC(es_admission_model_stats_get(a, 0, &ms));
  assert_int_equal(ms.refused, 3); /* over_memory twice, deadline */

  for (int i = 0; i < 10; i++)
    ES_CHECK_RC(es_admission_done(a, &t[i], 0));
  ES_CHECK_RC(es_admission_destroy(a));
}

/* ---- threads ------------------------------------------------------------------ */

#define THREADS 8
#define ITERS 50000
#define MODELS 4
#define MODEL_LIMIT 2
#define TOTAL_LIMIT 6
#define BUDGET (256u << 10)
#define HELD 3

static atomic_int failures_;
static char first_failure_[256];
static pthread_mutex_t failure_lock_ = PTHREAD_MUTEX_INITIALIZER;

static void fail_in_thread(const char *what, int rc) {
  pthread_mutex_lock(&failure_lock_);
  if (atomic_fetch_add(&failures_, 1) == 0)
    snprintf(first_failure_, sizeof first_failure_, "%s (rc %s: %s)", what, es_err_name(rc),
             es_last_error_detail());
  pthread_mutex_unlock(&failure_lock_);
}

typedef struct stress {
  es_admission *gate;
  /* The test's own view, never ahead of the gate's. */
  _Atomic size_t reserved, max_reserved;
  _Atomic unsigned total, max_total;
  _Atomic unsigned model[MODELS], max_model[MODELS];
  _Atomic uint64_t admitted, completed, model_admitted[MODELS];
  _Atomic uint64_t refused_by[ES_REFUSE_COUNT];
  atomic_int running;
  atomic_int go; /* workers start together */
} stress;

typedef struct worker {
  stress *s;
  uint64_t seed;
} worker;

static void raise_max_size(_Atomic size_t *m, size_t v) {
  size_t cur = atomic_load(m);
  while (cur < v && !atomic_compare_exchange_weak(m, &cur, v))
    ;
}

static void raise_max_u(_Atomic unsigned *m, unsigned v) {
  unsigned cur = atomic_load(m);
  while (cur < v && !atomic_compare_exchange_weak(m, &cur, v))
    ;
}

static void release(stress *s, es_admit_ticket *t) {
  int model = t->model_id;
  atomic_fetch_sub(&s->reserved, t->bytes);
  atomic_fetch_sub(&s->total, 1);
  atomic_fetch_sub(&s->model[model], 1);
  int rc = es_admission_done(s->gate, t, 0);
  if (rc != 0)
    fail_in_thread("done", rc);
  atomic_fetch_add(&s->completed, 1);
}

static void *worker_main(void *arg) {
  worker *w = arg;
  stress *s = w->s;
  es_admit_ticket held[HELD];
  int nheld = 0;
  while (!atomic_load(&s->go))
    sched_yield();
  for (int i = 0; i < ITERS; i++) {
    uint64_t r = es_test_rand(&w->seed);
    if (nheld < HELD && (nheld == 0 || (r & 1))) {
      int model = (int)((r >> 8) % MODELS);
      size_t bytes = (size_t)((r >> 16) % (64u << 10));
      es_refusal why;
      int rc = es_admission_try(s->gate, model, bytes, &held[nheld], &why);
      if (rc == 0) {
        size_t res = atomic_fetch_add(&s->reserved, bytes) + bytes;
        unsigned tot = atomic_fetch_add(&s->total, 1) + 1;
        unsigned mod = atomic_fetch_add(&s->model[model], 1) + 1;
        raise_max_size(&s->max_reserved, res);
        raise_max_u(&s->max_total, tot);
        raise_max_u(&s->max_model[model], mod);
        atomic_fetch_add(&s->admitted, 1);
        atomic_fetch_add(&s->model_admitted[model], 1);
        nheld++;
      } else if (rc == ES_EAGAIN && why.reason > 0 && why.reason < ES_REFUSE_COUNT &&
                 why.retry_after_ms >= 1 && why.retry_after_ms <= 60000) {
        atomic_fetch_add(&s->refused_by[why.reason], 1);
      } else {
        fail_in_thread("try: unexpected result", rc);
      }
    } else {
      int k = (int)((r >> 8) % (uint64_t)nheld);
      release(s, &held[k]);
      held[k] = held[--nheld];
    }
  }
  while (nheld > 0)
    release(s, &held[--nheld]);
  return NULL;
}

/* Flips memory pressure on for short spells and takes snapshots while the
 * workers run. */
static void *observer_main(void *arg) {
  stress *s = arg;
  es_memstat hot = memstat_v2(990, SIZE_MAX, 1000), cool = memstat_v2(10, SIZE_MAX, 1000);
  struct timespec pause = {0, 200000};
  for (int n = 0; atomic_load(&s->running); n++) {
    int rc = es_admission_observe(s->gate, n % 50 == 25 ? &hot : &cool);
    es_admission_stats st;
    if (rc == 0)
      rc = es_admission_stats_get(s->gate, &st);
    if (rc != 0)
      fail_in_thread("observe/stats", rc);
    else if (st.reserved_bytes > BUDGET || st.inflight > TOTAL_LIMIT)
      fail_in_thread("snapshot over a limit", 0);
    nanosleep(&pause, NULL);
  }
  es_admission_observe(s->gate, &cool);
  return NULL;
}

/* Bytes without a slot (es_admission_reserve): budgeted and refused like a
 * request's, but neither admitted nor in flight, so the model's requests
 * are still admitted under a concurrency limit of one; released by done or
 * cancel alike, once, feeding no estimator; a gate holding them is not
 * destroyed. */
static void test_reserve_bytes(void **state) {
  (void)state;
  es_admission_config c = fake_cfg();
  c.memory_budget_bytes = 1000;
  c.max_inflight_total = 1;
  c.model_max_inflight = 1;
  es_admission *a = make(&c);
  es_admit_ticket hold, t;
  es_refusal w;
  ES_CHECK_RC(es_admission_reserve(a, 0, 600, &hold, &w));
  es_admission_stats s = stats_of(a);
  assert_int_equal(s.reserved_bytes, 600);
  assert_int_equal(s.inflight, 0);
  assert_int_equal(s.admitted, 0);
  ES_CHECK_RC(es_admission_try(a, 0, 300, &t, &w)); /* its slot is free */
  EXPECT_REFUSED(a, 1, 50, ES_REFUSE_OVER_CONCURRENCY);
  memset(&w, 0, sizeof w);
  ES_EXPECT_RC(es_admission_reserve(a, 0, 200, &t, &w), ES_EAGAIN);
  assert_int_equal(w.reason, ES_REFUSE_OVER_MEMORY);
  assert_int_equal(w.retry_after_ms, 777); /* nothing completed yet */
  ES_EXPECT_RC(es_admission_reserve(a, 0, 1001, &t, &w), ES_ENOSPC);
  ES_EXPECT_RC(es_admission_reserve(a, 64, 1, &t, &w), ES_EINVAL);
  ES_EXPECT_RC(es_admission_reserve(a, 0, 1, NULL, &w), ES_EINVAL);
  ES_CHECK_RC(es_admission_done(a, &t, 5 * MS));
  s = stats_of(a);
  assert_int_equal(s.reserved_bytes, 600);
  assert_int_equal(s.refused_by[ES_REFUSE_OVER_MEMORY], 2);

  /* Held bytes keep the gate alive; released once. */
  ES_EXPECT_RC(es_admission_destroy(a), ES_EBUSY);
  ES_CHECK_RC(es_admission_cancel(a, &hold));
  ES_EXPECT_RC(es_admission_done(a, &hold, 0), ES_EDOUBLEFREE);
  s = stats_of(a);
  assert_int_equal(s.reserved_bytes, 0);
  assert_int_equal(s.completed, 1); /* the request, not the reservation */
  /* Draining and pressure refuse reservations too. */
  ES_CHECK_RC(es_admission_set_draining(a, 0, 1));
  ES_EXPECT_RC(es_admission_reserve(a, 0, 1, &t, &w), ES_EAGAIN);
  assert_int_equal(w.reason, ES_REFUSE_DRAINING);
  ES_CHECK_RC(es_admission_set_draining(a, 0, 0));
  es_memstat st = memstat_v2(95, SIZE_MAX, 100);
  ES_CHECK_RC(es_admission_observe(a, &st));
  ES_EXPECT_RC(es_admission_reserve(a, 0, 1, &t, &w), ES_EAGAIN);
  assert_int_equal(w.reason, ES_REFUSE_MEMORY_PRESSURE);
  ES_CHECK_RC(es_admission_destroy(a));
}

static void test_stress(void **state) {
  (void)state;
  es_admission_config c;
  es_admission_config_default(&c);
  c.max_models = MODELS;
  c.model_max_inflight = MODEL_LIMIT;
  c.max_inflight_total = TOTAL_LIMIT;
  c.memory_budget_bytes = BUDGET;
  static stress s;
  memset(&s, 0, sizeof s);
  s.gate = make(&c);
  atomic_store(&s.running, 1);
  uint64_t seed = es_test_seed();

  worker w[THREADS];
  pthread_t th[THREADS], obs;
  assert_int_equal(pthread_create(&obs, NULL, observer_main, &s), 0);
  for (int i = 0; i < THREADS; i++) {
    w[i].s = &s;
    w[i].seed = seed + (uint64_t)i * 0x1234567ull;
    assert_int_equal(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
  }
  atomic_store(&s.go, 1);
  for (int i = 0; i < THREADS; i++)
    pthread_join(th[i], NULL);
  atomic_store(&s.running, 0);
  pthread_join(obs, NULL);
  if (atomic_load(&failures_) != 0)
    fail_msg("%d failures in threads; first: %s", atomic_load(&failures_), first_failure_);

  es_admission_stats st = stats_of(s.gate);
  print_message("# %d threads x %d: admitted %llu, refused %llu (concurrency %llu, memory %llu, "
                "pressure %llu); peak %zu in flight, %zu of %u B reserved; test saw %u, %zu B\n",
                THREADS, ITERS, (unsigned long long)st.admitted, (unsigned long long)st.refused,
                (unsigned long long)st.refused_by[ES_REFUSE_OVER_CONCURRENCY],
                (unsigned long long)st.refused_by[ES_REFUSE_OVER_MEMORY],
                (unsigned long long)st.refused_by[ES_REFUSE_MEMORY_PRESSURE], st.peak_inflight,
                st.peak_reserved_bytes, BUDGET, atomic_load(&s.max_total),
                atomic_load(&s.max_reserved));

  /* Never over a limit. */
  assert_true(atomic_load(&s.max_reserved) <= BUDGET);
  assert_true(st.peak_reserved_bytes <= BUDGET);
  assert_true(atomic_load(&s.max_total) <= TOTAL_LIMIT);
  assert_true(st.peak_inflight <= TOTAL_LIMIT);
  for (int m = 0; m < MODELS; m++)
    assert_true(atomic_load(&s.max_model[m]) <= MODEL_LIMIT);

  /* Everything balances. */
  assert_int_equal(st.admitted, atomic_load(&s.admitted));
  assert_int_equal(st.completed, atomic_load(&s.completed));
  assert_int_equal(st.admitted, st.completed);
  assert_int_equal(st.inflight, 0);
  assert_int_equal(st.reserved_bytes, 0);
  uint64_t refused = 0;
  for (int r = 1; r < ES_REFUSE_COUNT; r++) {
    assert_int_equal(st.refused_by[r], atomic_load(&s.refused_by[r]));
    refused += st.refused_by[r];
  }
  assert_int_equal(st.refused, refused);
  assert_int_equal(st.admitted + st.refused, atomic_load(&s.admitted) + refused);
  uint64_t model_refused = 0;
  for (int m = 0; m < MODELS; m++) {
    es_admission_model_stats ms;
    ES_CHECK_RC(es_admission_model_stats_get(s.gate, m, &ms));
    assert_int_equal(ms.inflight, 0);
    assert_int_equal(ms.admitted, atomic_load(&s.model_admitted[m]));
    assert_int_equal(ms.completed, ms.admitted);
    model_refused += ms.refused;
  }
  assert_int_equal(model_refused, refused);
  /* The limits were actually contended. */
  assert_true(st.refused_by[ES_REFUSE_OVER_CONCURRENCY] > 0);
  assert_true(st.refused_by[ES_REFUSE_OVER_MEMORY] > 0);
  assert_true(st.peak_inflight == TOTAL_LIMIT);
  ES_CHECK_RC(es_admission_destroy(s.gate));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_config),
      cmocka_unit_test(test_names),
      cmocka_unit_test(test_budget_exact),
      cmocka_unit_test(test_concurrency_limits),
      cmocka_unit_test(test_check_order),
      cmocka_unit_test(test_bad_args),
      cmocka_unit_test(test_pressure),
      cmocka_unit_test(test_events),
      cmocka_unit_test(test_retry_tracks_drain),
      cmocka_unit_test(test_retry_bytes),
      cmocka_unit_test(test_reserve_bytes),
      cmocka_unit_test(test_stress),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
