/* The runtime on real models: outputs equal a direct run, one weight copy
 * for concurrent requests, weights write-protected, priority order, deadline
 * expiry, cancellation, bounded queues, unload while busy, lanes sharing one
 * scratchpad (max, not sum), dynamic shapes from the buddy pool, memory
 * pressure trimming the queues. The models come from the fetched packages
 * (scripts/setup/fetch-models.sh); without them the tests say so and skip. */
#include "es_test.h"

#include "edgeserve/engine.h"
#include "edgeserve/runtime.h"
#include "engine/engine_internal.h"

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef ES_SOURCE_DIR
#define ES_SOURCE_DIR "."
#endif

static char dir_[1024];

static const char *model_path(const char *file) {
  static __thread char p[2048];
  snprintf(p, sizeof p, "%s/%s", dir_, file);
  return p;
}

static int have_models(void) {
  return access(model_path("blazeface_front_128.onnx"), R_OK) == 0 &&
         access(model_path("ppocr_det.onnx"), R_OK) == 0 &&
         access(model_path("ppocr_rec.onnx"), R_OK) == 0;
}

#define NEED_MODELS()                                                          \
  do {                                                                         \
    if (!have_models()) {                                                      \
      printf("# models not fetched (%s): skipped\n", dir_);                    \
      skip();                                                                  \
    }                                                                          \
  } while (0)

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A float input of the given shape filled with a deterministic pattern. */
typedef struct input {
  es_tensor t;
  float *data;
} input;

static void input_make(input *in, int rank, const int64_t *dims, unsigned seed) {
  memset(in, 0, sizeof *in);
  size_t n = 1;
  for (int i = 0; i < rank; i++)
    n *= (size_t)dims[i];
  in->data = malloc(n * sizeof(float));
  assert_non_null(in->data);
  for (size_t i = 0; i < n; i++)
    in->data[i] = (float)((i * 2654435761u + seed * 97u) % 1000u) / 1000.0f;
  in->t.dtype = ES_DTYPE_FLOAT;
  in->t.rank = rank;
  memcpy(in->t.dims, dims, (size_t)rank * sizeof *dims);
  in->t.data = in->data;
  in->t.nbytes = n * sizeof(float);
}

static es_tensor_info info_of(const input *in) {
  es_tensor_info ti;
  memset(&ti, 0, sizeof ti);
  ti.dtype = in->t.dtype;
  ti.rank = in->t.rank;
  memcpy(ti.dims, in->t.dims, sizeof ti.dims);
  return ti;
}

/* Output 0 of a direct run (the reference), copied. */
static float *direct_run(es_model *m, const input *in, size_t *nbytes) {
  es_tensor_info ti = info_of(in);
  es_plan *p;
  assert_int_equal(es_model_plan(m, &ti, 1, &p), 0);
  es_arena *a;
  assert_int_equal(es_arena_create(es_plan_arena_bytes(p), 64, &a), 0);
  es_tensor out[4];
  int n = es_plan_output_count(p);
  assert_int_equal(es_plan_run(p, &in->t, 1, a, out, n), 0);
  float *copy = malloc(out[0].nbytes);
  memcpy(copy, out[0].data, out[0].nbytes);
  *nbytes = out[0].nbytes;
  es_arena_destroy(a);
  es_plan_release(p);
  return copy;
}

static es_runtime *runtime_new(int workers, void (*tweak)(es_runtime_config *)) {
  es_runtime_config rc;
  es_runtime_config_default(&rc);
  rc.workers = workers;
  rc.pin = 0;
  rc.watch_ms = 0;
  if (tweak)
    tweak(&rc);
  es_runtime *rt;
  assert_int_equal(es_runtime_create(&rc, &rt), 0);
  return rt;
}

static int load(es_runtime *rt, const char *name, const char *file, const input *shape_of,
                int lane, int share) {
  es_model_config mc;
  es_model_config_default(&mc);
  mc.name = name;
  mc.path = model_path(file);
  es_tensor_info ti;
  if (shape_of) {
    ti = info_of(shape_of);
    mc.shapes = &ti;
    mc.n_shapes = 1;
  }
  mc.lane = lane;
  mc.share = share;
  int id = -1;
  int rc = es_runtime_model_load(rt, &mc, &id);
  if (rc < 0)
    fail_msg("load %s: %s", name, es_last_error_detail());
  return id;
}

static es_request *submit(es_runtime *rt, int model, const input *in, int prio,
                          uint64_t deadline, es_request_done_fn fn, void *user) {
  es_submit s = {.model = model, .inputs = &in->t, .n_inputs = 1, .priority = prio,
                 .deadline_ns = deadline, .on_done = fn, .user = user};
  es_request *r = NULL;
  es_refusal why;
  int rc = es_runtime_submit(rt, &s, &r, &why);
  if (rc < 0)
    fail_msg("submit: %s (%s)", es_last_error_detail(), es_refusal_name(why.reason));
  return r;
}

static void assert_same(const es_tensor *got, const float *want, size_t nbytes) {
  assert_int_equal(got->nbytes, nbytes);
  assert_memory_equal(got->data, want, nbytes);
}

/* ---- 8 concurrent requests, one copy of the weights ----------------------- */

typedef struct conc_arg {
  es_runtime *rt;
  int model;
  const input *in;
  const float *want;
  size_t want_bytes;
  int ok;
} conc_arg;

static void *conc_thread(void *p) {
  conc_arg *a = p;
  es_request *r = submit(a->rt, a->model, a->in, 0, 0, NULL, NULL);
  a->ok = es_request_wait(r, -1) == 0;
  es_tensor out;
  if (a->ok && es_request_output(r, 0, &out) == 0 && out.nbytes == a->want_bytes &&
      memcmp(out.data, a->want, a->want_bytes) == 0)
    a->ok = 2;
  es_request_free(r);
  return NULL;
}

static void test_concurrent_one_copy(void **state) {
  (void)state;
  NEED_MODELS();
  int64_t dims[4] = {1, 128, 128, 3};
  input in;
  input_make(&in, 4, dims, 1);
  es_model *ref;
  assert_int_equal(es_model_load(model_path("blazeface_front_128.onnx"), NULL, &ref), 0);
  size_t want_bytes;
  float *want = direct_run(ref, &in, &want_bytes);
  es_model_release(ref);

  es_runtime *rt = runtime_new(2, NULL);
  int id = load(rt, "front", "blazeface_front_128.onnx", NULL, -1, 1);
  es_mem_stats w0;
  es_mem_stats_get(ES_MEM_WEIGHTS, &w0);
  es_runtime_stats st0;
  es_runtime_stats_get(rt, &st0);
  assert_true(st0.weights_bytes > 0);

  /* A second name for the same file shares the model: no new weights. */
  int id2 = load(rt, "front-again", "blazeface_front_128.onnx", NULL, -1, 1);
  es_mem_stats w1;
  es_mem_stats_get(ES_MEM_WEIGHTS, &w1);
  assert_int_equal(w1.current, w0.current);
  es_runtime_model_stats ms;
  assert_int_equal(es_runtime_model_stats_get(rt, id2, &ms), 0);
  assert_int_equal(ms.shared, 1);

  enum { N = 8 };
  pthread_t th[N];
  conc_arg args[N];
  for (int i = 0; i < N; i++) {
    args[i] = (conc_arg){rt, i % 2 ? id : id2, &in, want, want_bytes, 0};
    pthread_create(&th[i], NULL, conc_thread, &args[i]);
  }
  for (int i = 0; i < N; i++) {
    pthread_join(th[i], NULL);
    assert_int_equal(args[i].ok, 2);
  }
  es_mem_stats w2;
  es_mem_stats_get(ES_MEM_WEIGHTS, &w2);
  assert_int_equal(w2.current, w1.current); /* no copy made by any request */
  assert_int_equal(w2.allocs, w1.allocs);
  es_runtime_stats st;
  es_runtime_stats_get(rt, &st);
  assert_int_equal(st.weights_bytes, st0.weights_bytes);
  assert_int_equal(st.completed, N);

  /* The naive mode: a private copy, the weights counted twice. */
  int id3 = load(rt, "front-private", "blazeface_front_128.onnx", NULL, -1, 0);
  es_mem_stats w3;
  es_mem_stats_get(ES_MEM_WEIGHTS, &w3);
  assert_true(w3.current > w2.current);
  es_runtime_stats_get(rt, &st);
  assert_true(st.weights_bytes > st0.weights_bytes);
  assert_int_equal(es_runtime_model_unload(rt, id3, 1000), 0);
  assert_int_equal(es_runtime_destroy(rt), 0);
  free(want);
  free(in.data);
}

/* Weights are in a sealed region: a write is a fault, not a silent change. */
static void test_weights_write_protected(void **state) {
  (void)state;
  NEED_MODELS();
  es_runtime *rt = runtime_new(1, NULL);
  int id = load(rt, "front", "blazeface_front_128.onnx", NULL, -1, 1);
  es_model *m;
  assert_int_equal(es_runtime_model_get(rt, id, &m), 0);
  assert_non_null(m->g.weights);
  assert_true(es_weights_is_sealed(m->g.weights));
  volatile unsigned char *w = (volatile unsigned char *)es_weights_data(m->g.weights);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    signal(SIGSEGV, SIG_DFL); /* the test runner's handlers are inherited */
    signal(SIGBUS, SIG_DFL);
    w[0] = (unsigned char)(w[0] + 1);
    _exit(0); /* reached only if the write went through */
  }
  int status = 0;
  waitpid(pid, &status, 0);
  assert_true(WIFSIGNALED(status));
  assert_true(WTERMSIG(status) == SIGSEGV || WTERMSIG(status) == SIGBUS);
  es_model_release(m);
  assert_int_equal(es_runtime_destroy(rt), 0);
}

/* ---- priority, deadlines, cancellation, queues ----------------------------- */

typedef struct order_log {
  pthread_mutex_t mu;
  int n;
  int prio[64];
  uint64_t seq[64];
} order_log;

static void log_done(void *user, es_request *r) {
  order_log *l = user;
  es_request_info info;
  es_request_info_get(r, &info);
  pthread_mutex_lock(&l->mu);
  l->prio[l->n] = info.priority;
  l->seq[l->n] = info.seq;
  l->n++;
  pthread_mutex_unlock(&l->mu);
}

static void test_priority_order(void **state) {
  (void)state;
  NEED_MODELS();
  int64_t dims[4] = {1, 128, 128, 3};
  input in;
  input_make(&in, 4, dims, 2);
  es_runtime *rt = runtime_new(1, NULL);
  int id = load(rt, "front", "blazeface_front_128.onnx", NULL, -1, 1);
  order_log log = {.mu = PTHREAD_MUTEX_INITIALIZER};
  es_runtime_pause(rt, 1);
  const int prios[12] = {3, 1, 2, 0, 3, 1, 0, 2, 2, 0, 1, 3};
  es_request *r[12];
  for (int i = 0; i < 12; i++)
    r[i] = submit(rt, id, &in, prios[i], 0, log_done, &log);
  es_runtime_stats st;
  es_runtime_stats_get(rt, &st);
  assert_int_equal(st.queued_total, 12);
  assert_int_equal(st.queued[0], 3);
  es_runtime_pause(rt, 0);
  for (int i = 0; i < 12; i++) {
    assert_int_equal(es_request_wait(r[i], -1), 0);
  }
  for (int i = 0; i < 12; i++)
    es_request_free(r[i]);
  /* Strict priority between levels, FIFO (submission order) within. */
  assert_int_equal(log.n, 12);
  for (int i = 1; i < 12; i++) {
    assert_true(log.prio[i - 1] <= log.prio[i]);
    if (log.prio[i - 1] == log.prio[i])
      assert_true(log.seq[i - 1] < log.seq[i]);
  }
  assert_int_equal(es_runtime_destroy(rt), 0);
  free(in.data);
}

static void test_deadline_and_cancel(void **state) {
  (void)state;
  NEED_MODELS();
  int64_t dims[4] = {1, 128, 128, 3};
  input in;
  input_make(&in, 4, dims, 3);
  es_runtime *rt = runtime_new(1, NULL);
  int id = load(rt, "front", "blazeface_front_128.onnx", NULL, -1, 1);
  es_runtime_pause(rt, 1);

  /* A deadline already past is refused at once. */
  es_submit s = {.model = id, .inputs = &in.t, .n_inputs = 1, .deadline_ns = now_ns() - 1};
  es_request *r = NULL;
  es_refusal why;
  assert_int_equal(es_runtime_submit(rt, &s, &r, &why), ES_EAGAIN);
  assert_null(r);
  assert_int_equal(why.reason, ES_REFUSE_DEADLINE);
  assert_true(why.retry_after_ms >= 1);

  /* A queued request whose deadline passes leaves with its own status. */
  es_request *late = submit(rt, id, &in, 0, now_ns() + 30 * 1000000ull, NULL, NULL);
  es_request *keep = submit(rt, id, &in, 1, 0, NULL, NULL);
  es_request *gone = submit(rt, id, &in, 1, 0, NULL, NULL);
  assert_int_equal(es_request_wait(late, 5000), ES_ETIMEDOUT);
  assert_int_equal(es_request_status(late), ES_ETIMEDOUT);
  es_request_info info;
  es_request_info_get(late, &info);
  assert_int_equal(info.refusal.reason, ES_REFUSE_DEADLINE);
  assert_int_equal(info.worker, -1);

  /* Cancel a queued one; cancelling twice says it is over. */
  assert_int_equal(es_request_cancel(gone), 0);
  assert_int_equal(es_request_status(gone), ES_ECANCELED);
  assert_int_equal(es_request_cancel(gone), ES_ESTATE);
  es_tensor out;
  assert_int_equal(es_request_output(gone, 0, &out), ES_ESTATE);

  es_runtime_pause(rt, 0);
  assert_int_equal(es_request_wait(keep, -1), 0);
  assert_int_equal(es_request_cancel(keep), ES_ESTATE);
  es_runtime_stats st;
  es_runtime_stats_get(rt, &st);
  assert_int_equal(st.expired, 1);
  assert_int_equal(st.cancelled, 1);
  assert_int_equal(st.completed, 1);
  es_request_free(late);
  es_request_free(keep);
  es_request_free(gone);
  /* Everything given back to the gate. */
  es_admission_stats as;
  es_admission_stats_get(es_runtime_admission(rt), &as);
  assert_int_equal(as.inflight, 0);
  assert_int_equal(as.reserved_bytes, 0);
  assert_int_equal(es_runtime_destroy(rt), 0);
  free(in.data);
}

static void small_queue(es_runtime_config *c) {
  c->queue_capacity = 2;
  c->priorities = 2;
  c->max_inflight_total = 5;
}

static void test_bounded_queue_and_limits(void **state) {
  (void)state;
  NEED_MODELS();
  int64_t dims[4] = {1, 128, 128, 3};
  input in;
  input_make(&in, 4, dims, 4);
  es_runtime *rt = runtime_new(1, small_queue);
  int id = load(rt, "front", "blazeface_front_128.onnx", NULL, -1, 1);
  es_runtime_pause(rt, 1);
  es_request *r[5];
  r[0] = submit(rt, id, &in, 0, 0, NULL, NULL);
  r[1] = submit(rt, id, &in, 0, 0, NULL, NULL);
  es_submit s = {.model = id, .inputs = &in.t, .n_inputs = 1};
  es_request *x = NULL;
  es_refusal why;
  assert_int_equal(es_runtime_submit(rt, &s, &x, &why), ES_EAGAIN);
  assert_int_equal(why.reason, ES_REFUSE_QUEUE_FULL);
  assert_true(why.retry_after_ms >= 1);
  /* The other level has its own bound; then the total limit (5) bites. */
  s.priority = 1;
  r[2] = submit(rt, id, &in, 1, 0, NULL, NULL);
  r[3] = submit(rt, id, &in, 1, 0, NULL, NULL);
  assert_int_equal(es_runtime_submit(rt, &s, &x, &why), ES_EAGAIN);
  assert_int_equal(why.reason, ES_REFUSE_QUEUE_FULL);
  es_runtime_stats st;
  es_runtime_stats_get(rt, &st);
  assert_int_equal(st.refused, 2);

  /* Bad input: a clear error, nothing queued. */
  input wrong;
  int64_t wd[4] = {1, 64, 64, 3};
  input_make(&wrong, 4, wd, 5);
  s.inputs = &wrong.t;
  s.priority = 0;
  int rc = es_runtime_submit(rt, &s, &x, &why);
  assert_true(rc == ES_EINVAL || rc == ES_EMODEL);
  assert_non_null(strstr(es_last_error_detail(), "front"));
  wrong.t.nbytes -= 4; /* truncated tensor */
  assert_int_equal(es_runtime_submit(rt, &s, &x, &why), ES_EINVAL);
  s.model = 17;
  assert_int_equal(es_runtime_submit(rt, &s, &x, &why), ES_ENOENT);

  es_runtime_pause(rt, 0);
  for (int i = 0; i < 4; i++) {
    assert_int_equal(es_request_wait(r[i], -1), 0);
    es_request_free(r[i]);
  }
  assert_int_equal(es_runtime_destroy(rt), 0);
  free(in.data);
  free(wrong.data);
}

static void test_unload_waits(void **state) {
  (void)state;
  NEED_MODELS();
  int64_t dims[4] = {1, 128, 128, 3};
  input in;
  input_make(&in, 4, dims, 6);
  es_runtime *rt = runtime_new(1, NULL);
  int id = load(rt, "front", "blazeface_front_128.onnx", NULL, -1, 1);
  es_runtime_pause(rt, 1);
  es_request *r = submit(rt, id, &in, 0, 0, NULL, NULL);
  assert_int_equal(es_runtime_model_unload(rt, id, 20), ES_ETIMEDOUT);
  /* Draining: new requests are refused with that reason. */
  es_submit s = {.model = id, .inputs = &in.t, .n_inputs = 1};
  es_request *x = NULL;
  es_refusal why;
  assert_int_equal(es_runtime_submit(rt, &s, &x, &why), ES_EAGAIN);
  assert_int_equal(why.reason, ES_REFUSE_DRAINING);
  /* Destroy refuses while a handle is held. */
  es_runtime_pause(rt, 0);
  assert_int_equal(es_request_wait(r, -1), 0);
  es_request_free(r);
  assert_int_equal(es_runtime_model_unload(rt, id, 1000), 0);
  assert_int_equal(es_runtime_model_find(rt, "front"), ES_ENOENT);
  /* The slot and the name can be used again. */
  int id2 = load(rt, "front", "blazeface_front_128.onnx", NULL, -1, 1);
  r = submit(rt, id2, &in, 0, 0, NULL, NULL);
  assert_int_equal(es_request_wait(r, -1), 0);
  assert_int_equal(es_runtime_destroy(rt), ES_EBUSY);
  es_request_free(r);
  assert_int_equal(es_runtime_destroy(rt), 0);
  free(in.data);
}

/* ---- lanes: one scratchpad, the max of the models' planned bytes ---------- */

static void test_lane_max_not_sum(void **state) {
  (void)state;
  NEED_MODELS();
  int64_t fd[4] = {1, 128, 128, 3}, dd[4] = {1, 3, 320, 320}, rd[4] = {1, 3, 48, 320};
  input fin, din, rin;
  input_make(&fin, 4, fd, 7);
  input_make(&din, 4, dd, 8);
  input_make(&rin, 4, rd, 9);
  es_mem_stats sc0;
  es_mem_stats_get(ES_MEM_SCRATCH, &sc0);
  es_runtime *rt = runtime_new(1, NULL);
  int f = load(rt, "front", "blazeface_front_128.onnx", &fin, 0, 1);
  int d = load(rt, "det", "ppocr_det.onnx", &din, 0, 1);
  int r = load(rt, "rec", "ppocr_rec.onnx", &rin, 0, 1);
  size_t planned[3];
  int ids[3] = {f, d, r};
  size_t mx = 0, sum = 0;
  for (int i = 0; i < 3; i++) {
    es_runtime_model_stats ms;
    es_runtime_model_stats_get(rt, ids[i], &ms);
    planned[i] = ms.planned_bytes;
    assert_true(planned[i] > 0);
    assert_int_equal(ms.lane, 0);
    assert_int_equal(ms.pool_bytes, 0); /* no private arenas */
  }
  es_lane_stats ls;
  assert_int_equal(es_runtime_lane_stats_get(rt, 0, &ls), 0);
  for (int i = 0; i < 3; i++) {
    size_t need = planned[i] + ES_ARENA_GUARD + 64;
    mx = need > mx ? need : mx;
    sum += need;
  }
  assert_int_equal(ls.models, 3);
  assert_int_equal(ls.scratch_bytes, mx);
  assert_int_equal(ls.sum_bytes, sum);
  assert_true(ls.scratch_bytes < ls.sum_bytes);
  /* What the counting layer sees held for scratch: the max, once. */
  es_mem_stats sc1;
  es_mem_stats_get(ES_MEM_SCRATCH, &sc1);
  assert_true(sc1.current - sc0.current >= mx);
  assert_true(sc1.current - sc0.current < mx + 4096);

  /* Frames of three models, in turn: switching allocates nothing. */
  es_model *mods[3];
  const input *ins[3] = {&fin, &din, &rin};
  float *want[3];
  size_t wb[3];
  for (int i = 0; i < 3; i++) {
    es_runtime_model_get(rt, ids[i], &mods[i]);
    want[i] = direct_run(mods[i], ins[i], &wb[i]);
  }
  es_mem_stats a0, s0;
  es_mem_stats_get(ES_MEM_ARENA, &a0);
  es_mem_stats_get(ES_MEM_SCRATCH, &s0);
  for (int frame = 0; frame < 3; frame++)
    for (int i = 0; i < 3; i++) {
      es_request *q = submit(rt, ids[i], ins[i], i, 0, NULL, NULL);
      assert_int_equal(es_request_wait(q, -1), 0);
      es_tensor out;
      assert_int_equal(es_request_output(q, 0, &out), 0);
      assert_same(&out, want[i], wb[i]);
      es_request_info info;
      es_request_info_get(q, &info);
      assert_int_equal(info.arena_source, ES_ARENA_FROM_LANE);
      assert_int_equal(info.worker, 0);
      es_request_free(q);
    }
  es_mem_stats a1, s1;
  es_mem_stats_get(ES_MEM_ARENA, &a1);
  es_mem_stats_get(ES_MEM_SCRATCH, &s1);
  assert_int_equal(a1.allocs, a0.allocs);
  assert_int_equal(s1.allocs, s0.allocs);
  es_runtime_lane_stats_get(rt, 0, &ls);
  assert_int_equal(ls.runs, 9);
  assert_int_equal(ls.switches, 9);
  printf("# lane: scratch %zu B for 3 models (sum %zu B), switch mean %.0f ns, max %llu ns\n",
         ls.scratch_bytes, ls.sum_bytes, ls.switch_ns_mean,
         (unsigned long long)ls.switch_ns_max);

  /* Unloading the largest shrinks the scratchpad to the max of the rest. */
  assert_int_equal(es_runtime_model_unload(rt, d, 1000), 0);
  es_runtime_lane_stats_get(rt, 0, &ls);
  size_t rest = 0;
  for (int i = 0; i < 3; i++)
    if (ids[i] != d && planned[i] + ES_ARENA_GUARD + 64 > rest)
      rest = planned[i] + ES_ARENA_GUARD + 64;
  assert_int_equal(ls.scratch_bytes, rest);
  for (int i = 0; i < 3; i++) {
    es_model_release(mods[i]);
    free(want[i]);
  }
  assert_int_equal(es_runtime_destroy(rt), 0);
  free(fin.data);
  free(din.data);
  free(rin.data);
}

/* ---- dynamic shapes: exact-size arenas from the buddy pool ----------------- */

static void test_dynamic_shapes(void **state) {
  (void)state;
  NEED_MODELS();
  int64_t cfg[4] = {1, 3, 48, 320};
  input cin;
  input_make(&cin, 4, cfg, 10);
  es_runtime *rt = runtime_new(2, NULL);
  int id = load(rt, "rec", "ppocr_rec.onnx", &cin, -1, 1);
  es_model *m;
  es_runtime_model_get(rt, id, &m);
  int widths[4] = {320, 160, 480, 320};
  for (int i = 0; i < 4; i++) {
    int64_t dims[4] = {1, 3, 48, widths[i]};
    input in;
    input_make(&in, 4, dims, 11 + (unsigned)i);
    size_t wb;
    float *want = direct_run(m, &in, &wb);
    es_request *q = submit(rt, id, &in, 0, 0, NULL, NULL);
    assert_int_equal(es_request_wait(q, -1), 0);
    es_tensor out;
    assert_int_equal(es_request_output(q, 0, &out), 0);
    assert_same(&out, want, wb);
    es_request_info info;
    es_request_info_get(q, &info);
    assert_int_equal(info.arena_source,
                     widths[i] == 320 ? ES_ARENA_FROM_POOL : ES_ARENA_FROM_BUDDY);
    es_request_free(q);
    free(want);
    free(in.data);
  }
  es_runtime_stats st;
  es_runtime_stats_get(rt, &st);
  assert_int_equal(st.buddy_in_use, 0); /* every block came back */
  assert_true(st.buddy_fragmentation < 1e-9);
  es_model_release(m);
  assert_int_equal(es_runtime_destroy(rt), 0);
  free(cin.data);
}

/* ---- memory pressure: refuse new work, shorten the queues ------------------ */

typedef struct fake_mem {
  size_t current, max;
} fake_mem;

static int fake_memstat(void *user, es_memstat *out) {
  fake_mem *f = user;
  memset(out, 0, sizeof *out);
  out->version = 2;
  out->current = f->current;
  out->high = SIZE_MAX;
  out->max = f->max;
  return 0;
}

static fake_mem fake_;

static void with_fake_mem(es_runtime_config *c) {
  c->memstat_fn = fake_memstat;
  c->memstat_user = &fake_;
}

static void test_pressure_trims_queues(void **state) {
  (void)state;
  NEED_MODELS();
  int64_t dims[4] = {1, 128, 128, 3};
  input in;
  input_make(&in, 4, dims, 20);
  fake_.max = (size_t)1 << 30;
  fake_.current = fake_.max / 2;
  es_runtime *rt = runtime_new(1, with_fake_mem);
  int id = load(rt, "front", "blazeface_front_128.onnx", NULL, -1, 1);
  assert_int_equal(es_runtime_watch_now(rt), ES_PRESSURE_NONE);
  es_runtime_pause(rt, 1);
  es_request *r[6];
  for (int i = 0; i < 6; i++)
    r[i] = submit(rt, id, &in, i % 3, 0, NULL, NULL);
  /* Soft: the queues keep one request per worker, the most urgent. */
  fake_.current = (size_t)(0.9 * (double)fake_.max);
  assert_int_equal(es_runtime_watch_now(rt), ES_PRESSURE_SOFT);
  es_submit s = {.model = id, .inputs = &in.t, .n_inputs = 1};
  es_request *x = NULL;
  es_refusal why;
  assert_int_equal(es_runtime_submit(rt, &s, &x, &why), ES_EAGAIN);
  assert_int_equal(why.reason, ES_REFUSE_MEMORY_PRESSURE);
  es_runtime_stats st;
  es_runtime_stats_get(rt, &st);
  assert_int_equal(st.queued_total, 1);
  assert_int_equal(st.queued[0], 1);
  assert_int_equal(st.dropped, 5);
  for (int i = 1; i < 6; i++) {
    assert_int_equal(es_request_status(r[i]), ES_EAGAIN);
    es_request_info info;
    es_request_info_get(r[i], &info);
    assert_int_equal(info.refusal.reason, ES_REFUSE_MEMORY_PRESSURE);
  }
  /* Pressure gone: work is admitted again. */
  fake_.current = fake_.max / 2;
  assert_int_equal(es_runtime_watch_now(rt), ES_PRESSURE_NONE);
  es_runtime_pause(rt, 0);
  x = submit(rt, id, &in, 0, 0, NULL, NULL);
  assert_int_equal(es_request_wait(x, -1), 0);
  assert_int_equal(es_request_wait(r[0], -1), 0);
  es_request_free(x);
  for (int i = 0; i < 6; i++)
    es_request_free(r[i]);
  assert_int_equal(es_runtime_destroy(rt), 0);
  free(in.data);
}

/* ---- many threads: submit, wait, cancel, free, callbacks (TSan) ------------ */

typedef struct storm_arg {
  es_runtime *rt;
  int models[2];
  const input *in;
  int done, cancelled, refused;
  unsigned seed;
} storm_arg;

static void free_in_callback(void *user, es_request *r) {
  (void)user;
  es_request_free(r);
}

static void *storm_thread(void *p) {
  storm_arg *a = p;
  for (int i = 0; i < 12; i++) {
    a->seed = a->seed * 1103515245u + 12345u;
    unsigned k = (a->seed >> 16) % 4;
    es_submit s = {.model = a->models[i % 2], .inputs = &a->in->t, .n_inputs = 1,
                   .priority = (int)(a->seed >> 8) % 4};
    if (k == 3)
      s.on_done = free_in_callback;
    es_request *r = NULL;
    es_refusal why;
    if (es_runtime_submit(a->rt, &s, &r, &why) < 0) {
      a->refused++;
      continue;
    }
    if (k == 3)
      continue; /* the callback frees it */
    if (k == 2 && es_request_cancel(r) == 0)
      a->cancelled++;
    if (k == 1) {
      es_request_free(r); /* freed while queued or running */
      continue;
    }
    int st = es_request_wait(r, -1);
    if (st == 0)
      a->done++;
    es_request_free(r);
  }
  return NULL;
}

static void storm_cfg(es_runtime_config *c) {
  c->queue_capacity = 8;
  c->watch_ms = 5;
}

static void test_storm(void **state) {
  (void)state;
  NEED_MODELS();
  int64_t dims[4] = {1, 128, 128, 3};
  input in;
  input_make(&in, 4, dims, 30);
  es_runtime *rt = runtime_new(2, storm_cfg);
  storm_arg args[6];
  int m0 = load(rt, "a", "blazeface_front_128.onnx", NULL, -1, 1);
  int m1 = load(rt, "b", "blazeface_front_128.onnx", &in, 1, 1);
  pthread_t th[6];
  for (int i = 0; i < 6; i++) {
    args[i] = (storm_arg){rt, {m0, m1}, &in, 0, 0, 0, (unsigned)i + 1};
    pthread_create(&th[i], NULL, storm_thread, &args[i]);
  }
  for (int i = 0; i < 6; i++)
    pthread_join(th[i], NULL);
  /* Callback-freed requests may still be finishing: destroy waits. */
  int rc;
  for (int tries = 0; (rc = es_runtime_destroy(rt)) == ES_EBUSY && tries < 500; tries++)
    usleep(10000);
  assert_int_equal(rc, 0);
  int done = 0;
  for (int i = 0; i < 6; i++)
    done += args[i].done;
  assert_true(done > 0);
  free(in.data);
}

/* The API's conventions on NULL and dead handles: retain takes no reference
 * and says NULL, plain getters give the empty value, calls that can fail
 * give a code, destroy and free accept NULL. */
static void test_bad_handles(void **state) {
  (void)state;
  assert_null(es_model_retain(NULL));
  assert_null(es_plan_retain(NULL));
  assert_null(es_weights_retain(NULL));
  static uint64_t junk[4096]; /* zeros: no live magic anywhere in it */
  assert_null(es_model_retain((es_model *)junk));
  assert_null(es_plan_retain((es_plan *)junk));
  assert_int_equal(es_request_output_count(NULL), 0);
  assert_int_equal(es_request_output_count((es_request *)junk), 0);
  assert_null(es_runtime_admission(NULL));
  es_model *m = (es_model *)junk;
  ES_EXPECT_RC(es_runtime_model_get(NULL, 0, &m), ES_EINVAL);
  es_runtime_stats st;
  ES_EXPECT_RC(es_runtime_stats_get(NULL, &st), ES_EINVAL);
  ES_EXPECT_RC(es_runtime_destroy(NULL), 0);
  es_request_free(NULL);
  es_model_release(NULL);
  es_plan_release(NULL);

  es_runtime *rt = runtime_new(1, NULL);
  ES_EXPECT_RC(es_runtime_model_get(rt, 3, &m), ES_ENOENT);
  assert_null(m);
  ES_EXPECT_RC(es_runtime_model_get(rt, 0, NULL), ES_EINVAL);
  es_runtime_model_stats ms;
  ES_EXPECT_RC(es_runtime_model_stats_get(rt, 3, &ms), ES_ENOENT);
  ES_EXPECT_RC(es_runtime_model_stats_get(rt, 0, NULL), ES_EINVAL);
  ES_EXPECT_RC(es_runtime_model_resume(rt, -1), ES_ENOENT);
  ES_EXPECT_RC(es_runtime_model_unload(rt, 5, 0), ES_ENOENT);
  ES_CHECK_RC(es_runtime_destroy(rt));
}

int main(void) {
  const char *d = getenv("ES_MODEL_DIR");
  snprintf(dir_, sizeof dir_, "%s", d ? d : ES_SOURCE_DIR "/.cache/models");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_handles),
      cmocka_unit_test(test_concurrent_one_copy),
      cmocka_unit_test(test_weights_write_protected),
      cmocka_unit_test(test_priority_order),
      cmocka_unit_test(test_deadline_and_cancel),
      cmocka_unit_test(test_bounded_queue_and_limits),
      cmocka_unit_test(test_unload_waits),
      cmocka_unit_test(test_lane_max_not_sum),
      cmocka_unit_test(test_dynamic_shapes),
      cmocka_unit_test(test_pressure_trims_queues),
      cmocka_unit_test(test_storm),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
