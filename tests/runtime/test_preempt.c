/* Cooperative preemption in the runtime: one worker runs a long request of
 * low priority (PP-OCR det at 640x640); an urgent one (BlazeFace front,
 * priority 0) submitted meanwhile runs in a pause of it, between two of its
 * steps, in its own arena, and completes first; the paused run then goes
 * on and its outputs are exactly those of a run never paused. While the
 * urgent request completes (its callback), admission still counts the
 * paused run (2 in flight, both reservations held); a paused run can be
 * cancelled (by a task run in its pause: it completes with ES_ECANCELED
 * and gives its memory back); EDF pauses a run for an earlier deadline;
 * with preemption off the long run finishes first. The counters
 * (preemptions per model, the pause histogram) say so. Models from
 * scripts/setup/fetch-models.sh; skipped without them. */
#include "es_test.h"

#include "edgeserve/engine.h"
#include "edgeserve/runtime.h"
#include "support/onnx_builder.h"

#include <linux/capability.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static char det_path_[1024], face_path_[1024];
static float *det_x_, *face_x_;
#define DET_N (3 * 640 * 640)
#define FACE_N (128 * 128 * 3)

static int setup(void **state) {
  (void)state;
  es_test_model_path(det_path_, sizeof det_path_, "ppocr_det.onnx");
  es_test_model_path(face_path_, sizeof face_path_, "blazeface_front_128.onnx");
  det_x_ = malloc(DET_N * sizeof(float));
  face_x_ = malloc(FACE_N * sizeof(float));
  uint64_t s = 5;
  for (int i = 0; i < DET_N; i++)
    det_x_[i] = (float)(es_test_rand(&s) % 2001) / 1000.0f - 1.0f;
  for (int i = 0; i < FACE_N; i++)
    face_x_[i] = (float)(es_test_rand(&s) % 2001) / 1000.0f - 1.0f;
  return 0;
}

static int teardown(void **state) {
  (void)state;
  free(det_x_);
  free(face_x_);
  return 0;
}

static int have_models(void) {
  return access(det_path_, R_OK) == 0 && access(face_path_, R_OK) == 0;
}

typedef struct rig {
  es_runtime *rt;
  int det, face;
  es_tensor det_in, face_in;
} rig;

static int rt_priority_ = 0; /* the next rig's real-time priority, once */

static void rig_up_sched(rig *g, int preempt, int sched) {
  es_runtime_config rc;
  es_runtime_config_default(&rc);
  rc.rt_priority = rt_priority_;
  rt_priority_ = 0;
  rc.workers = 1;
  rc.pin = 0;
  rc.preempt = preempt;
  rc.sched = sched;
  rc.buddy_bytes = (size_t)256 << 20;
  ES_CHECK_RC(es_runtime_create(&rc, &g->rt));
  es_tensor_info dsh = {.name = "x", .dtype = ES_DTYPE_FLOAT, .rank = 4, .dims = {1, 3, 640, 640}};
  es_tensor_info fsh = {.name = "input:0", .dtype = ES_DTYPE_FLOAT, .rank = 4,
                        .dims = {1, 128, 128, 3}};
  es_model_config mc;
  es_model_config_default(&mc);
  mc.name = "det";
  mc.path = det_path_;
  mc.shapes = &dsh;
  mc.n_shapes = 1;
  ES_CHECK_RC(es_runtime_model_load(g->rt, &mc, &g->det));
  es_model_config_default(&mc);
  mc.name = "face";
  mc.path = face_path_;
  mc.shapes = &fsh;
  mc.n_shapes = 1;
  ES_CHECK_RC(es_runtime_model_load(g->rt, &mc, &g->face));
  g->det_in = (es_tensor){.dtype = ES_DTYPE_FLOAT, .rank = 4, .dims = {1, 3, 640, 640},
                          .data = det_x_, .nbytes = DET_N * sizeof(float)};
  g->face_in = (es_tensor){.dtype = ES_DTYPE_FLOAT, .rank = 4, .dims = {1, 128, 128, 3},
                           .data = face_x_, .nbytes = FACE_N * sizeof(float)};
}

static void rig_up(rig *g, int preempt) { rig_up_sched(g, preempt, ES_SCHED_PRIORITY); }

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t deadline_ = 0; /* the next submission's, once */

static es_request *submit(rig *g, int model, int priority, es_request_done_fn fn, void *user) {
  es_submit s = {.model = model,
                 .deadline_ns = deadline_,
                 .inputs = model == g->det ? &g->det_in : &g->face_in,
                 .n_inputs = 1,
                 .priority = priority,
                 .on_done = fn,
                 .user = user};
  deadline_ = 0;
  es_request *r;
  es_refusal why;
  ES_CHECK_RC(es_runtime_submit(g->rt, &s, &r, &why));
  return r;
}

/* Waits until r has started running (a worker took it) and has run a
 * little, so that the next submission finds it mid-run. */
static void wait_running(es_request *r) {
  for (int i = 0; i < 20000; i++) {
    es_request_info info;
    ES_CHECK_RC(es_request_info_get(r, &info));
    if (info.worker >= 0) {
      struct timespec ts = {0, 3 * 1000000}; /* into its steps */
      nanosleep(&ts, NULL);
      return;
    }
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
  }
  fail_msg("the request never started");
}

/* The urgent request's callback: the paused run is still in flight. */
typedef struct seen {
  es_runtime *rt;
  size_t inflight, reserved;
  _Atomic int order; /* completions so far */
  int urgent_at;
} seen;

static void on_urgent(void *user, es_request *r) {
  (void)r;
  seen *sn = user;
  es_admission_stats as;
  es_admission_stats_get(es_runtime_admission(sn->rt), &as);
  sn->inflight = as.inflight;
  sn->reserved = as.reserved_bytes;
  sn->urgent_at = atomic_fetch_add(&sn->order, 1);
}

static void on_slow(void *user, es_request *r) {
  (void)r;
  seen *sn = user;
  atomic_fetch_add(&sn->order, 1);
}

/* A long det run (priority 3) and, once it is under way, a face request
 * (priority 0); waits for both. */
static void race(rig *g, seen *sn, es_request **slow, es_request **urgent) {
  *slow = submit(g, g->det, 3, on_slow, sn);
  wait_running(*slow);
  *urgent = submit(g, g->face, 0, on_urgent, sn);
  ES_CHECK_RC(es_request_wait(*urgent, -1));
  ES_CHECK_RC(es_request_wait(*slow, -1));
}

static void copy_outputs(es_request *r, float **out, size_t *bytes, int *n) {
  *n = es_request_output_count(r);
  for (int i = 0; i < *n; i++) {
    es_tensor t;
    ES_CHECK_RC(es_request_output(r, i, &t));
    out[i] = malloc(t.nbytes ? t.nbytes : 1);
    memcpy(out[i], t.data, t.nbytes);
    bytes[i] = t.nbytes;
  }
}

/* r's outputs are exactly want (n_want of them, copy_outputs'), which it
 * frees. */
static void expect_outputs(es_request *r, float **want, const size_t *want_bytes, int n_want) {
  float *got[8];
  size_t got_bytes[8];
  int n_got;
  copy_outputs(r, got, got_bytes, &n_got);
  assert_int_equal(n_got, n_want);
  for (int i = 0; i < n_got; i++) {
    assert_int_equal(got_bytes[i], want_bytes[i]);
    assert_memory_equal(got[i], want[i], want_bytes[i]);
    free(got[i]);
    free(want[i]);
  }
}

static void test_urgent_runs_in_a_pause(void **state) {
  (void)state;
  if (!have_models())
    skip();
  rig g;
  rig_up(&g, 1);
  /* the reference: det alone, never paused */
  es_request *ref = submit(&g, g.det, 3, NULL, NULL);
  ES_CHECK_RC(es_request_wait(ref, -1));
  float *want[8];
  size_t want_bytes[8];
  int n_want;
  copy_outputs(ref, want, want_bytes, &n_want);
  es_request_free(ref);

  seen sn = {.rt = g.rt};
  es_request *slow, *urgent;
  race(&g, &sn, &slow, &urgent);
  assert_int_equal(sn.urgent_at, 0); /* the urgent one completed first */
  assert_int_equal(sn.inflight, 2);  /* the paused run still counted */
  es_request_info si, ui;
  ES_CHECK_RC(es_request_info_get(slow, &si));
  ES_CHECK_RC(es_request_info_get(urgent, &ui));
  assert_true(sn.reserved >= si.reserved_bytes + ui.reserved_bytes);
  assert_int_equal(si.preemptions, 1);
  assert_true(si.paused_ns > 0);
  assert_int_equal(ui.preempting, 1);
  printf("# det paused once for %.2f ms while face ran; face waited %.2f ms in the queue\n",
         (double)si.paused_ns / 1e6, (double)ui.queue_ns / 1e6);
  expect_outputs(slow, want, want_bytes, n_want); /* exactly a run never paused */
  es_request_free(urgent);
  es_request_free(slow);
  es_runtime_model_stats ms;
  ES_CHECK_RC(es_runtime_model_stats_get(g.rt, g.det, &ms));
  assert_int_equal(ms.preemptions, 1);
  ES_CHECK_RC(es_runtime_model_stats_get(g.rt, g.face, &ms));
  assert_int_equal(ms.preempting, 1);
  es_runtime_stats rs;
  ES_CHECK_RC(es_runtime_stats_get(g.rt, &rs));
  assert_int_equal(rs.preemptions, 1);
  uint64_t in_hist = 0;
  for (int b = 0; b < ES_RT_PAUSE_BUCKETS; b++)
    in_hist += rs.pause_hist[b];
  assert_int_equal(in_hist, 1);
  es_admission_stats as;
  ES_CHECK_RC(es_admission_stats_get(es_runtime_admission(g.rt), &as));
  assert_int_equal(as.reserved_bytes, 0);
  ES_CHECK_RC(es_runtime_destroy(g.rt));
}

/* A model that is one long convolution: x [1, 64, 192, 192] -> Conv 3x3
 * (64 filters, pad 1, bias) -> y, 2.7 GFLOP, written to a temporary file
 * (path, cap bytes) for the runtime to load. */
#define CONV_N (64 * 192 * 192)
static float conv_w_[64 * 64 * 9], conv_b_[64];

static void conv_model_file(char *path, size_t cap) {
  static const int64_t xd[4] = {1, 64, 192, 192}, wd[4] = {64, 64, 3, 3}, bd[1] = {64},
                       pads[4] = {1, 1, 1, 1};
  uint64_t seed = 9;
  for (size_t i = 0; i < sizeof conv_w_ / sizeof conv_w_[0]; i++)
    conv_w_[i] = (float)(es_test_rand(&seed) % 2001) / 20000.0f - 0.05f;
  for (int i = 0; i < 64; i++)
    conv_b_[i] = (float)i / 64.0f;
  ob *b = ob_new(13);
  ob_input(b, "x", 4, xd);
  ob_init_f32(b, "W", 4, wd, conv_w_);
  ob_init_f32(b, "B", 1, bd, conv_b_);
  int n = ob_node(b, "Conv", "y", 3, "x", "W", "B");
  ob_attr_ints(b, n, "pads", 4, pads);
  ob_output(b, "y");
  ob_save_temp(b, "es-preempt-conv", path, cap);
  free(b);
}

/* Safe points inside a step: with the runtime's split, a long convolution
 * runs in bands, and an urgent request arriving while it runs is served
 * between two bands rather than after the whole conv. Eight face requests,
 * one after the other, during one run of a model that is one 2.7 GFLOP
 * convolution (and the two layout steps around it): each runs in a pause
 * (the only worker is busy), nearly all of them inside the conv (a
 * counter, not a clock, says where), and the conv's outputs are those of a
 * run never paused. */
static void test_pause_inside_a_conv(void **state) {
  (void)state;
  if (!have_models())
    skip();
  rig g;
  rig_up(&g, 1);
  assert_true(es_engine_split_get() > 0); /* a preempting runtime asks for bands */
  char path[512];
  conv_model_file(path, sizeof path);
  es_model_config mc;
  es_model_config_default(&mc);
  mc.name = "conv";
  mc.path = path;
  int conv;
  ES_CHECK_RC(es_runtime_model_load(g.rt, &mc, &conv));
  assert_int_equal(unlink(path), 0);
  float *x = malloc(CONV_N * sizeof(float));
  uint64_t seed = 3;
  for (int i = 0; i < CONV_N; i++)
    x[i] = (float)(es_test_rand(&seed) % 2001) / 1000.0f - 1.0f;
  es_tensor in = {.name = "x", .dtype = ES_DTYPE_FLOAT, .rank = 4, .dims = {1, 64, 192, 192},
                  .data = x, .nbytes = CONV_N * sizeof(float)};
  es_submit sub = {.model = conv, .inputs = &in, .n_inputs = 1, .priority = 3};
  es_request *ref, *slow;
  es_refusal why;
  ES_CHECK_RC(es_runtime_submit(g.rt, &sub, &ref, &why));
  ES_CHECK_RC(es_request_wait(ref, -1));
  float *want[8];
  size_t want_bytes[8];
  int n_want;
  copy_outputs(ref, want, want_bytes, &n_want);
  es_request_free(ref);
  ES_CHECK_RC(es_runtime_submit(g.rt, &sub, &slow, &why));
  wait_running(slow);
  int urgent = 0;
  for (; urgent < 8; urgent++) {
    es_request_info si;
    ES_CHECK_RC(es_request_info_get(slow, &si));
    if (si.status != ES_REQUEST_PENDING)
      break; /* the conv finished first (a very slow machine) */
    es_request *u = submit(&g, g.face, 0, NULL, NULL);
    ES_CHECK_RC(es_request_wait(u, -1));
    es_request_free(u);
  }
  ES_CHECK_RC(es_request_wait(slow, -1));
  es_runtime_stats rs;
  ES_CHECK_RC(es_runtime_stats_get(g.rt, &rs));
  printf("# %d urgent requests during one conv run: %llu paused it, %llu inside the conv\n",
         urgent, (unsigned long long)rs.preemptions,
         (unsigned long long)rs.preemptions_in_kernel);
  assert_true(urgent >= 1);
  assert_true(rs.preemptions_in_kernel >= 1);
  expect_outputs(slow, want, want_bytes, n_want);
  es_request_free(slow);
  free(x);
  ES_CHECK_RC(es_runtime_destroy(g.rt));
}

/* Cancelled while paused: an urgent task (a function run on the worker in
 * the long run's pause) cancels the paused run; it is dropped when its
 * worker comes back, completes ES_ECANCELED, and its memory goes back. */
typedef struct canceller {
  es_request *victim;
  int rc;
} canceller;

static int cancel_task(void *user) {
  canceller *c = user;
  c->rc = es_request_cancel(c->victim);
  return 0;
}

static void test_cancel_while_paused(void **state) {
  (void)state;
  if (!have_models())
    skip();
  rig g;
  rig_up(&g, 1);
  seen sn = {.rt = g.rt};
  es_request *slow = submit(&g, g.det, 3, on_slow, &sn);
  wait_running(slow);
  canceller c = {.victim = slow, .rc = 1};
  es_task t = {.model = g.face, .priority = 0, .fn = cancel_task, .user = &c};
  es_request *task;
  es_refusal why;
  ES_CHECK_RC(es_runtime_submit_task(g.rt, &t, &task, &why));
  ES_CHECK_RC(es_request_wait(task, -1));
  assert_int_equal(c.rc, 0); /* it was paused: cancellable */
  assert_int_equal(es_request_wait(slow, -1), ES_ECANCELED);
  es_request_free(task);
  es_request_free(slow);
  es_admission_stats as;
  ES_CHECK_RC(es_admission_stats_get(es_runtime_admission(g.rt), &as));
  assert_int_equal(as.reserved_bytes, 0);
  assert_int_equal(as.inflight, 0);
  /* the model serves on */
  es_request *again = submit(&g, g.det, 3, NULL, NULL);
  ES_CHECK_RC(es_request_wait(again, -1));
  es_request_free(again);
  ES_CHECK_RC(es_runtime_destroy(g.rt));
}

/* slow was paused n times; both requests and the rig go. */
static void end_race(rig *g, es_request *slow, es_request *urgent, int n) {
  es_request_info si;
  ES_CHECK_RC(es_request_info_get(slow, &si));
  assert_int_equal(si.preemptions, n);
  es_request_free(urgent);
  es_request_free(slow);
  ES_CHECK_RC(es_runtime_destroy(g->rt));
}

/* Preemption off: the started run finishes first, as before. */
static void test_no_preemption(void **state) {
  (void)state;
  if (!have_models())
    skip();
  rig g;
  rig_up(&g, 0);
  seen sn = {.rt = g.rt};
  es_request *slow, *urgent;
  race(&g, &sn, &slow, &urgent);
  assert_int_equal(sn.urgent_at, 1); /* after the slow one */
  end_race(&g, slow, urgent, 0);
}

/* EDF: the long run has the higher priority but the later deadline; the
 * face request, of the lowest priority, has the earlier one and runs in
 * its pause. Under priority scheduling it would wait. */
static void test_edf_pauses_for_an_earlier_deadline(void **state) {
  (void)state;
  if (!have_models())
    skip();
  rig g;
  rig_up_sched(&g, 1, ES_SCHED_EDF);
  seen sn = {.rt = g.rt};
  deadline_ = mono_ns() + 20ull * 1000000000ull;
  es_request *slow = submit(&g, g.det, 0, on_slow, &sn);
  wait_running(slow);
  deadline_ = mono_ns() + 10ull * 1000000000ull;
  es_request *urgent = submit(&g, g.face, 3, on_urgent, &sn);
  ES_CHECK_RC(es_request_wait(urgent, -1));
  ES_CHECK_RC(es_request_wait(slow, -1));
  assert_int_equal(sn.urgent_at, 0);
  es_request_info si;
  ES_CHECK_RC(es_request_info_get(slow, &si));
  assert_int_equal(si.preemptions, 1);
  es_request_free(urgent);
  es_request_free(slow);
  es_runtime_stats rs;
  ES_CHECK_RC(es_runtime_stats_get(g.rt, &rs));
  assert_true(rs.pause_overhead_ns_sum > 0);
  printf("# EDF: one pause, its hand-over cost %.1f us\n", (double)rs.pause_overhead_ns_sum / 1e3);
  ES_CHECK_RC(es_runtime_destroy(g.rt));
}

/* ---- real-time scheduling (rt_priority) ----------------------------------- */

/* What the thread that completes a request (its worker) runs as. */
typedef struct policy_seen {
  _Atomic int policy, tid;
} policy_seen;

static void on_policy(void *user, es_request *r) {
  (void)r;
  policy_seen *p = user;
  atomic_store(&p->policy, sched_getscheduler(0));
  atomic_store(&p->tid, (int)gettid());
}

/* Whether this thread may make SCHED_FIFO threads: a thread started so. */
static void *nothing(void *arg) { return arg; }

static int fifo_allowed(int prio) {
  pthread_attr_t a;
  pthread_attr_init(&a);
  struct sched_param sp = {.sched_priority = prio};
  pthread_attr_setinheritsched(&a, PTHREAD_EXPLICIT_SCHED);
  pthread_attr_setschedpolicy(&a, SCHED_FIFO);
  pthread_attr_setschedparam(&a, &sp);
  pthread_t t;
  int e = pthread_create(&t, &a, nothing, NULL);
  pthread_attr_destroy(&a);
  if (e == 0)
    pthread_join(t, NULL);
  return e == 0;
}

/* This thread's effective CAP_SYS_NICE, on (1) or off (0); capabilities
 * are per thread, and the runtime's workers are made by this one. */
static void sys_nice_set(int on) {
  struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
  struct __user_cap_data_struct d[2];
  assert_int_equal(syscall(SYS_capget, &h, d), 0);
  if (on)
    d[CAP_SYS_NICE / 32].effective |= 1u << (CAP_SYS_NICE % 32);
  else
    d[CAP_SYS_NICE / 32].effective &= ~(1u << (CAP_SYS_NICE % 32));
  assert_int_equal(syscall(SYS_capset, &h, d), 0);
}

/* rt_priority: requests of levels below rt_levels (1 by default: level 0)
 * run on a SCHED_FIFO worker, the others on a SCHED_OTHER one, an idle
 * worker waits as a SCHED_FIFO thread, and an urgent request run in a low
 * one's pause runs real-time while the paused run stays ordinary. Where the system refuses
 * real-time threads (not root, no CAP_SYS_NICE, RLIMIT_RTPRIO below the
 * priority), es_runtime_create fails with ES_EACCES; where it allows them,
 * the same refusal is made by taking CAP_SYS_NICE away from this thread
 * (RLIMIT_RTPRIO at 0) for the call. Bad values are refused, and so is
 * rt_priority with more than one engine thread per run. */
static void test_realtime_levels(void **state) {
  (void)state;
  es_runtime_config rc;
  es_runtime *rt = NULL;
  es_runtime_config_default(&rc);
  assert_int_equal(rc.rt_priority, 0);
  rc.rt_priority = 99;
  assert_int_equal(es_runtime_create(&rc, &rt), ES_EINVAL);
  rc.rt_priority = 5;
  rc.rt_levels = 0;
  assert_int_equal(es_runtime_create(&rc, &rt), ES_EINVAL);
  rc.rt_levels = 5; /* above the 4 levels */
  assert_int_equal(es_runtime_create(&rc, &rt), ES_EINVAL);
  rc.rt_levels = 1;
  rc.intra_threads = 2; /* an OpenMP team would keep one run's policy */
  assert_int_equal(es_runtime_create(&rc, &rt), ES_EINVAL);
  rc.intra_threads = 1;
  rc.workers = 1;

  struct rlimit old, zero = {0, 0};
  assert_int_equal(getrlimit(RLIMIT_RTPRIO, &old), 0);
  if (!fifo_allowed(5)) {
    assert_int_equal(es_runtime_create(&rc, &rt), ES_EACCES);
    printf("# real-time threads refused here: es_runtime_create said ES_EACCES\n");
    skip(); /* the rest needs them */
  }
  /* the refusal, made here: no CAP_SYS_NICE, RLIMIT_RTPRIO 0 */
  int lowered = old.rlim_cur > 0 && setrlimit(RLIMIT_RTPRIO, &zero) == 0;
  sys_nice_set(0);
  int refused = es_runtime_create(&rc, &rt);
  sys_nice_set(1);
  if (lowered)
    assert_int_equal(setrlimit(RLIMIT_RTPRIO, &old), 0);
  assert_int_equal(refused, ES_EACCES);
  assert_non_null(strstr(es_last_error_detail(), "RLIMIT_RTPRIO"));

  if (!have_models())
    skip();
  rig g;
  rt_priority_ = 5;
  rig_up(&g, 1);
  /* a low request: ordinary while it runs (its answer is handed over
   * before the worker goes back to waiting real-time) */
  policy_seen low = {0}, mid = {0};
  es_request *r = submit(&g, g.face, 3, on_policy, &low);
  ES_CHECK_RC(es_request_wait(r, -1));
  es_request_free(r);
  assert_int_equal(atomic_load(&low.policy), SCHED_OTHER);
  pid_t tid = atomic_load(&low.tid);
  int idle = -1;
  for (int i = 0; i < 2000 && idle != SCHED_FIFO; i++) {
    idle = sched_getscheduler(tid);
    struct timespec ts = {0, 500000};
    nanosleep(&ts, NULL);
  }
  assert_int_equal(idle, SCHED_FIFO); /* idle: waits real-time */
  /* level 1 is not below rt_levels (1 by default): ordinary; level 0 is */
  policy_seen top = {0};
  r = submit(&g, g.face, 1, on_policy, &mid);
  ES_CHECK_RC(es_request_wait(r, -1));
  es_request_free(r);
  r = submit(&g, g.face, 0, on_policy, &top);
  ES_CHECK_RC(es_request_wait(r, -1));
  es_request_free(r);
  assert_int_equal(atomic_load(&mid.policy), SCHED_OTHER);
  assert_int_equal(atomic_load(&top.policy), SCHED_FIFO);
  assert_int_equal(atomic_load(&top.tid), tid);
  /* an urgent request in a low run's pause: real-time, the run ordinary */
  policy_seen slow_p = {0}, urgent_p = {0};
  es_request *slow = submit(&g, g.det, 3, on_policy, &slow_p);
  wait_running(slow);
  int during = sched_getscheduler(tid);
  es_request *urgent = submit(&g, g.face, 0, on_policy, &urgent_p);
  ES_CHECK_RC(es_request_wait(urgent, -1));
  ES_CHECK_RC(es_request_wait(slow, -1));
  assert_int_equal(during, SCHED_OTHER);
  assert_int_equal(atomic_load(&urgent_p.policy), SCHED_FIFO);
  assert_int_equal(atomic_load(&slow_p.policy), SCHED_OTHER);
  end_race(&g, slow, urgent, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_urgent_runs_in_a_pause),
      cmocka_unit_test(test_cancel_while_paused),
      cmocka_unit_test(test_pause_inside_a_conv),
      cmocka_unit_test(test_no_preemption),
      cmocka_unit_test(test_edf_pauses_for_an_earlier_deadline),
      cmocka_unit_test(test_realtime_levels),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
