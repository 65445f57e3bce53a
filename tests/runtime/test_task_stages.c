/* Tasks that submit (runtime.h, es_task): a task's own requests run on the
 * task's worker when it waits for them.
 *
 * - With one worker, a task that submits a model's request and a task of
 *   its own and waits for each completes (without the rule it would wait
 *   forever for the worker it holds); both ran on its thread, in their own
 *   arena, with the same outputs as a request run from outside; the
 *   runtime counts them as inlined.
 * - With two workers and one idle, the task's first queued request is
 *   kept for the task (it runs on the task's worker), while a second one
 *   goes to the idle worker.
 * - A request the task submits and leaves queued when it returns is
 *   scheduled as usual and completes.
 * - Two tasks on two workers, each waiting for a model on the other's lane
 *   (which would wait for each other forever if a lane's request could
 *   only run on its lane), both complete, with the right outputs.
 * Every wait has a timeout: a regression fails, it does not hang. Models
 * are built here (a chain of Relu and one of Neg), so the test needs no
 * fetched files. */
#include "es_test.h"

#include "edgeserve/runtime.h"
#include "support/onnx_builder.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N 4096
static const int64_t dims_[2] = {1, N};
static char relu_path_[512], neg_path_[512];
static float x_[N];

static void save(const char *op, char *path, size_t cap) {
  size_t size = 0;
  uint8_t *bytes = ob_chain_pack(op, 3, 2, dims_, &size);
  assert_non_null(bytes);
  const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  snprintf(path, cap, "%s/es-task-%s-XXXXXX", tmp, op);
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, bytes, size), (ssize_t)size);
  close(fd);
  free(bytes);
}

static int setup(void **state) {
  (void)state;
  save("Relu", relu_path_, sizeof relu_path_);
  save("Neg", neg_path_, sizeof neg_path_);
  for (int i = 0; i < N; i++)
    x_[i] = (float)(i % 17) - 8.0f;
  return 0;
}

static int teardown(void **state) {
  (void)state;
  unlink(relu_path_);
  unlink(neg_path_);
  return 0;
}

static es_runtime *rt_new(int workers) {
  es_runtime_config rc;
  es_runtime_config_default(&rc);
  rc.workers = workers;
  rc.pin = 0;
  rc.watch_ms = 0;
  es_runtime *rt;
  ES_CHECK_RC(es_runtime_create(&rc, &rt));
  return rt;
}

static int load(es_runtime *rt, const char *name, const char *path, int lane) {
  es_tensor_info sh = {.name = "x", .dtype = ES_DTYPE_FLOAT, .rank = 2, .dims = {1, N}};
  es_model_config mc;
  es_model_config_default(&mc);
  mc.name = name;
  mc.path = path;
  mc.shapes = &sh;
  mc.n_shapes = 1;
  mc.lane = lane;
  int id = -1;
  ES_CHECK_RC(es_runtime_model_load(rt, &mc, &id));
  return id;
}

/* What a stage gives: relu(x) (three Relus) or -(-(-x)) = -x (three Negs). */
static float want(int neg, int i) { return neg ? -x_[i] : (x_[i] > 0 ? x_[i] : 0.0f); }

static void check_out(es_request *r, int neg) {
  es_tensor out;
  ES_CHECK_RC(es_request_output(r, 0, &out));
  assert_int_equal(out.nbytes, N * sizeof(float));
  const float *y = out.data;
  for (int i = 0; i < N; i++)
    assert_true(y[i] == want(neg, i));
}

/* ---- the task ------------------------------------------------------------------ */

typedef struct stage_arg {
  pthread_t ran_on;
  int runs;
} stage_arg;

static int stage_fn(void *user) {
  stage_arg *a = user;
  a->ran_on = pthread_self();
  a->runs++;
  return 0;
}

typedef struct job {
  es_runtime *rt;
  int model[2];      /* its stages' models */
  int neg[2];        /* stage k gives -x (Neg) or relu(x) */
  int subtask;       /* also submit a task of its own and wait for it */
  int leave;         /* submit stage 0 and return without waiting for it */
  int batch;         /* submit both stages, then wait for each */
  pthread_t ran_on;
  int worker;        /* of its task (es_request_info) */
  es_request *r[2];  /* its stages, freed by the test */
  int rc[2];
  stage_arg sub;
  int sub_rc;
  es_tensor in;
} job;

static int submit_stage(job *j, int k) {
  es_submit s = {.model = j->model[k], .inputs = &j->in, .n_inputs = 1};
  es_refusal why;
  return es_runtime_submit(j->rt, &s, &j->r[k], &why);
}

static int job_fn(void *user) {
  job *j = user;
  j->ran_on = pthread_self();
  j->in = ob_tensor_f32("x", 2, dims_, x_);
  int rc = submit_stage(j, 0);
  if (rc < 0 || j->leave)
    return rc;
  if (j->batch && (rc = submit_stage(j, 1)) < 0)
    return rc;
  j->rc[0] = es_request_wait(j->r[0], 10000);
  if (!j->batch && (rc = submit_stage(j, 1)) < 0)
    return rc;
  j->rc[1] = es_request_wait(j->r[1], 10000);
  if (j->subtask) {
    es_task t = {.model = j->model[0], .bytes = 64, .fn = stage_fn, .user = &j->sub};
    es_request *r;
    es_refusal why;
    if ((rc = es_runtime_submit_task(j->rt, &t, &r, &why)) < 0)
      return rc;
    j->sub_rc = es_request_wait(r, 10000);
    es_request_free(r);
  }
  return 0;
}

static es_request *job_submit(job *j) {
  es_task t = {.model = j->model[0], .fn = job_fn, .user = j};
  es_request *r = NULL;
  es_refusal why;
  ES_CHECK_RC(es_runtime_submit_task(j->rt, &t, &r, &why));
  return r;
}

static void job_finish(job *j, es_request *task) {
  ES_CHECK_RC(es_request_wait(task, 10000));
  es_request_info info;
  ES_CHECK_RC(es_request_info_get(task, &info));
  j->worker = info.worker;
  es_request_free(task);
}

/* ---- tests ----------------------------------------------------------------------- */

static void test_one_worker_runs_its_stages(void **state) {
  (void)state;
  es_runtime *rt = rt_new(1);
  job j = {.rt = rt, .subtask = 1};
  j.model[0] = load(rt, "relu", relu_path_, -1);
  j.model[1] = load(rt, "neg", neg_path_, -1);
  j.neg[1] = 1;
  es_runtime_stats st0;
  ES_CHECK_RC(es_runtime_stats_get(rt, &st0));
  job_finish(&j, job_submit(&j));
  for (int k = 0; k < 2; k++) {
    ES_CHECK_RC(j.rc[k]);
    es_request_info info;
    ES_CHECK_RC(es_request_info_get(j.r[k], &info));
    assert_int_equal(info.worker, j.worker);
    assert_int_equal(info.preempting, 0);
    assert_true(info.arena_source == ES_ARENA_FROM_POOL ||
                info.arena_source == ES_ARENA_FROM_BUDDY);
    check_out(j.r[k], j.neg[k]);
    es_request_free(j.r[k]);
  }
  ES_CHECK_RC(j.sub_rc);
  assert_int_equal(j.sub.runs, 1);
  assert_true(pthread_equal(j.sub.ran_on, j.ran_on));
  es_runtime_stats st;
  ES_CHECK_RC(es_runtime_stats_get(rt, &st));
  assert_int_equal(st.inlined - st0.inlined, 3);

  /* The same request from outside: the same outputs, not inlined. */
  es_tensor in = ob_tensor_f32("x", 2, dims_, x_);
  es_submit s = {.model = j.model[1], .inputs = &in, .n_inputs = 1};
  es_request *r;
  es_refusal why;
  ES_CHECK_RC(es_runtime_submit(rt, &s, &r, &why));
  ES_CHECK_RC(es_request_wait(r, 10000));
  check_out(r, 1);
  es_request_free(r);
  ES_CHECK_RC(es_runtime_stats_get(rt, &st));
  assert_int_equal(st.inlined - st0.inlined, 3);
  ES_CHECK_RC(es_runtime_destroy(rt));
}

static void test_first_stage_kept_second_spread(void **state) {
  (void)state;
  es_runtime *rt = rt_new(2);
  job j = {.rt = rt, .batch = 1};
  j.model[0] = load(rt, "relu", relu_path_, -1);
  j.model[1] = load(rt, "neg", neg_path_, -1);
  j.neg[1] = 1;
  job_finish(&j, job_submit(&j));
  int on[2];
  for (int k = 0; k < 2; k++) {
    ES_CHECK_RC(j.rc[k]);
    es_request_info info;
    ES_CHECK_RC(es_request_info_get(j.r[k], &info));
    on[k] = info.worker;
    check_out(j.r[k], j.neg[k]);
    es_request_free(j.r[k]);
  }
  printf("# task on worker %d; its first stage on %d, its second on %d\n", j.worker, on[0],
         on[1]);
  assert_int_equal(on[0], j.worker); /* kept for the task */
  assert_int_not_equal(on[1], j.worker); /* the idle worker took it */
  ES_CHECK_RC(es_runtime_destroy(rt));
}

static void test_left_queued_runs_after(void **state) {
  (void)state;
  es_runtime *rt = rt_new(1);
  job j = {.rt = rt, .leave = 1};
  j.model[0] = load(rt, "neg", neg_path_, -1);
  j.neg[0] = 1;
  job_finish(&j, job_submit(&j));
  ES_CHECK_RC(es_request_wait(j.r[0], 10000));
  check_out(j.r[0], 1);
  es_request_free(j.r[0]);
  ES_CHECK_RC(es_runtime_destroy(rt));
}

static void test_lanes_crossed(void **state) {
  (void)state;
  es_runtime *rt = rt_new(2);
  int relu = load(rt, "relu", relu_path_, 0), neg = load(rt, "neg", neg_path_, 1);
  for (int round = 0; round < 20; round++) {
    job a = {.rt = rt}, b = {.rt = rt};
    a.model[0] = relu;
    a.model[1] = neg;
    a.neg[1] = 1;
    b.model[0] = neg;
    b.model[1] = relu;
    b.neg[0] = 1;
    es_request *ta = job_submit(&a), *tb = job_submit(&b);
    job_finish(&a, ta);
    job_finish(&b, tb);
    job *js[2] = {&a, &b};
    for (int i = 0; i < 2; i++)
      for (int k = 0; k < 2; k++) {
        ES_CHECK_RC(js[i]->rc[k]);
        check_out(js[i]->r[k], js[i]->neg[k]);
        es_request_free(js[i]->r[k]);
      }
  }
  ES_CHECK_RC(es_runtime_destroy(rt));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_one_worker_runs_its_stages),
      cmocka_unit_test(test_first_stage_kept_second_spread),
      cmocka_unit_test(test_left_queued_runs_after),
      cmocka_unit_test(test_lanes_crossed),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
