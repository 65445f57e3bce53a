/* Memory the runtime cannot give is a refusal, never a failure:
 *
 * - a request whose arena (or outputs) can never fit the buddy pool it
 *   would come from (det at 1x3x2048x2048 and up, with the default 64 MiB
 *   pool that grows to 256 MiB: 128 MiB blocks at most) is refused at
 *   submit with ES_ENOSPC and an OVER_MEMORY refusal, as a request larger
 *   than the whole budget is, instead of being admitted and failing in the
 *   run; det at 1536 fits one such block, and a second one at once is a
 *   refusal (ES_EAGAIN, retry-after), not an error;
 * - a run that finds the pool short at run time (the blocks held by other
 *   requests' outputs) completes with ES_EAGAIN and an OVER_MEMORY refusal
 *   with a retry-after, and the pool serves the same request again once
 *   the others are freed;
 * - tasks (es_runtime_submit_task): run on a worker, reserve their bytes
 *   through admission until the handle is freed, take no concurrency slot,
 *   are refused over the budget (ES_EAGAIN, retry-after) or beyond it
 *   (ES_ENOSPC), expire in the queue, keep their error code and detail,
 *   and a draining model refuses them.
 *
 * The models come from the fetched packages; without them the tests
 * skip. */
#include "es_test.h"

#include "common/internal.h"
#include "edgeserve/runtime.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char det_[1024], face_[1024];

static int have_models(void) {
  return access(det_, R_OK) == 0 && access(face_, R_OK) == 0;
}

#define NEED_MODELS()                                                          \
  do {                                                                         \
    if (!have_models()) {                                                      \
      printf("# models not fetched (%s): skipped\n", det_);                    \
      skip();                                                                  \
    }                                                                          \
  } while (0)

typedef struct tweak {
  size_t buddy, budget;
  unsigned model_limit;
} tweak;

static es_runtime *runtime_new(int workers, const tweak *t) {
  es_runtime_config rc;
  es_runtime_config_default(&rc);
  rc.workers = workers;
  rc.pin = 0;
  rc.watch_ms = 0;
  if (t && t->buddy)
    rc.buddy_bytes = t->buddy;
  if (t)
    rc.memory_budget_bytes = t->budget;
  if (t)
    rc.model_max_inflight = t->model_limit;
  es_runtime *rt;
  ES_CHECK_RC(es_runtime_create(&rc, &rt));
  return rt;
}

/* det with its free dimensions left free: every shape from the buddy pool. */
static int load(es_runtime *rt, const char *name, const char *path) {
  es_model_config mc;
  es_model_config_default(&mc);
  mc.name = name;
  mc.path = path;
  int id = -1;
  ES_CHECK_RC(es_runtime_model_load(rt, &mc, &id));
  return id;
}

/* A det input of 1x3xSxS; zeros (calloc: pages never touched by the test
 * for the large ones). */
typedef struct input {
  es_tensor t;
  float *data;
} input;

static void input_make(input *in, int side) {
  memset(in, 0, sizeof *in);
  size_t n = (size_t)3 * side * side;
  in->data = calloc(n, sizeof(float));
  assert_non_null(in->data);
  in->t.dtype = ES_DTYPE_FLOAT;
  in->t.rank = 4;
  in->t.dims[0] = 1;
  in->t.dims[1] = 3;
  in->t.dims[2] = side;
  in->t.dims[3] = side;
  in->t.data = in->data;
  in->t.nbytes = n * sizeof(float);
}

static int submit(es_runtime *rt, int model, const input *in, es_request **r, es_refusal *why) {
  es_submit s = {.model = model, .inputs = &in->t, .n_inputs = 1};
  memset(why, 0, sizeof *why);
  return es_runtime_submit(rt, &s, r, why);
}

/* ---- never fits: refused at submit ----------------------------------------- */

static void test_never_fits_buddy(void **state) {
  (void)state;
  NEED_MODELS();
  es_runtime *rt = runtime_new(1, NULL); /* 64 MiB, grows to 256 MiB */
  int det = load(rt, "det", det_);
  es_runtime_stats st0;
  ES_CHECK_RC(es_runtime_stats_get(rt, &st0));

  int sides[2] = {2048, 3072};
  for (int i = 0; i < 2; i++) {
    input in;
    input_make(&in, sides[i]);
    es_request *r = (es_request *)1;
    es_refusal why;
    int rc = submit(rt, det, &in, &r, &why);
    printf("# det 1x3x%dx%d: %s, %s, requested %llu B, largest block %llu B: %s\n", sides[i],
           sides[i], es_err_name(rc), es_refusal_name(why.reason),
           (unsigned long long)why.requested, (unsigned long long)why.limit,
           es_last_error_detail());
    assert_int_equal(rc, ES_ENOSPC);
    assert_null(r);
    assert_int_equal(why.reason, ES_REFUSE_OVER_MEMORY);
    assert_int_equal(why.model_id, det);
    assert_int_equal(why.retry_after_ms, 0);
    assert_int_equal(why.limit, (uint64_t)128 << 20);
    assert_true(why.requested > why.limit);
    assert_non_null(strstr(es_last_error_detail(), "buddy_bytes"));
    free(in.data);
  }
  /* Counted as refusals, by the runtime and by admission; nothing ran. */
  es_runtime_stats st;
  ES_CHECK_RC(es_runtime_stats_get(rt, &st));
  assert_int_equal(st.refused, st0.refused + 2);
  assert_int_equal(st.failed, 0);
  assert_int_equal(st.buddy_failures, 0);
  es_admission_stats as;
  ES_CHECK_RC(es_admission_stats_get(es_runtime_admission(rt), &as));
  assert_int_equal(as.refused_by[ES_REFUSE_OVER_MEMORY], 2);
  assert_int_equal(as.reserved_bytes, 0);

  /* A shape that fits still runs. */
  input small;
  input_make(&small, 320);
  es_request *r;
  es_refusal why;
  ES_CHECK_RC(submit(rt, det, &small, &r, &why));
  ES_CHECK_RC(es_request_wait(r, -1));
  es_request_free(r);
  free(small.data);
  ES_CHECK_RC(es_runtime_destroy(rt));
}

/* det at 1536 (a 126 MiB arena) fits the largest block the default pool
 * can grow (128 MiB), once: two at once are admitted, and the one the pool
 * cannot serve comes back as a refusal (ES_EAGAIN, OVER_MEMORY, a
 * retry-after), never as an error. */
static void test_two_at_the_ceiling(void **state) {
  (void)state;
  NEED_MODELS();
  es_runtime *rt = runtime_new(2, NULL);
  int det = load(rt, "det", det_);
  input in;
  es_request *r[2];
  es_refusal why;
  ES_CHECK_RC(es_runtime_pause(rt, 1)); /* both start together */
  /* oneDNN's portable GEMM convolution (CPUs without its JIT kernels, e.g.
   * Armv8.2 without SVE) adds im2col buffers: det at 1536 needs 144 MiB
   * there, more than a block. The side steps down until one run fits. */
  int side = 1536, first;
  for (;;) {
    input_make(&in, side);
    first = submit(rt, det, &in, &r[0], &why);
    if (first != ES_ENOSPC || side <= 1024)
      break;
    free(in.data);
    side -= 128;
  }
  ES_CHECK_RC(first);
  ES_CHECK_RC(submit(rt, det, &in, &r[1], &why));
  ES_CHECK_RC(es_runtime_pause(rt, 0));
  int ok = 0;
  for (int i = 0; i < 2; i++) {
    int rc = es_request_wait(r[i], -1);
    es_request_info info;
    ES_CHECK_RC(es_request_info_get(r[i], &info));
    printf("# det 1x3x%dx%d #%d: %s (%s, retry after %u ms), %zu B reserved\n", side, side,
           i, es_err_name(rc), es_refusal_name(info.refusal.reason),
           info.refusal.retry_after_ms, info.reserved_bytes);
    if (rc == 0) {
      ok++;
    } else {
      assert_int_equal(rc, ES_EAGAIN);
      assert_int_equal(info.refusal.reason, ES_REFUSE_OVER_MEMORY);
      assert_true(info.refusal.retry_after_ms >= 1);
    }
    es_request_free(r[i]);
  }
  assert_true(ok >= 1);
  es_runtime_stats st;
  ES_CHECK_RC(es_runtime_stats_get(rt, &st));
  assert_int_equal(st.failed, 0);
  free(in.data);
  ES_CHECK_RC(es_runtime_destroy(rt));
}

/* ---- short at run time: a refusal with a retry-after -------------------------- */

static void test_short_at_run_time(void **state) {
  (void)state;
  NEED_MODELS();
  /* 4 MiB growing to 16: det at 320 (5.7 MB arena) takes an 8 MiB block,
   * the largest there can be; each finished request keeps its 400 KB of
   * outputs in the pool until its handle is freed. */
  tweak tw = {.buddy = (size_t)4 << 20};
  es_runtime *rt = runtime_new(1, &tw);
  int det = load(rt, "det", det_);
  input in;
  input_make(&in, 320);

  /* 640 (a 22.9 MB arena) can never fit that pool. */
  input big;
  input_make(&big, 640);
  es_request *r = NULL;
  es_refusal why;
  ES_EXPECT_RC(submit(rt, det, &big, &r, &why), ES_ENOSPC);
  assert_int_equal(why.limit, (uint64_t)8 << 20);
  free(big.data);

  es_request *held[64];
  int n = 0, refused = 0;
  while (n < 64 && !refused) {
    ES_CHECK_RC(submit(rt, det, &in, &r, &why));
    int rc = es_request_wait(r, -1);
    if (rc == 0) {
      held[n++] = r;
      continue;
    }
    char detail[512];
    snprintf(detail, sizeof detail, "%s", es_last_error_detail());
    es_request_info info;
    ES_CHECK_RC(es_request_info_get(r, &info));
    printf("# request %d: %s (%s), retry after %u ms: %s\n", n + 1, es_err_name(rc),
           es_refusal_name(info.refusal.reason), info.refusal.retry_after_ms, detail);
    assert_int_equal(rc, ES_EAGAIN);
    assert_int_equal(info.refusal.reason, ES_REFUSE_OVER_MEMORY);
    assert_true(info.refusal.retry_after_ms >= 1);
    assert_non_null(strstr(detail, "no memory for the run now"));
    assert_int_equal(es_request_status(r), ES_EAGAIN);
    es_request_free(r);
    refused = 1;
  }
  assert_true(refused);
  es_runtime_stats st;
  ES_CHECK_RC(es_runtime_stats_get(rt, &st));
  assert_int_equal(st.failed, 0);  /* a refusal, not a failure */
  assert_int_equal(st.dropped, 1);
  for (int i = 0; i < n; i++)
    es_request_free(held[i]);

  /* The pool heals: the same request runs again. */
  ES_CHECK_RC(submit(rt, det, &in, &r, &why));
  ES_CHECK_RC(es_request_wait(r, -1));
  es_request_free(r);
  free(in.data);
  ES_CHECK_RC(es_runtime_destroy(rt));
}

/* ---- tasks ------------------------------------------------------------------------ */

typedef struct task_arg {
  pthread_t caller, ran_on;
  _Atomic int runs;
  int ret;
} task_arg;

static int task_fn(void *user) {
  task_arg *t = user;
  t->ran_on = pthread_self();
  atomic_fetch_add(&t->runs, 1);
  if (t->ret == ES_EINVAL)
    return es__fail(ES_EINVAL, "task says no (%d)", 7);
  if (t->ret == ES_ETIMEDOUT)
    return es__fail(ES_ETIMEDOUT, "task ran out of time");
  return t->ret;
}

static int task_submit(es_runtime *rt, int model, size_t bytes, uint64_t deadline, task_arg *a,
                       es_request **r, es_refusal *why) {
  a->caller = pthread_self();
  es_task t = {.model = model, .bytes = bytes, .deadline_ns = deadline, .fn = task_fn,
               .user = a};
  memset(why, 0, sizeof *why);
  *r = NULL;
  return es_runtime_submit_task(rt, &t, r, why);
}

static size_t reserved(es_runtime *rt) {
  es_admission_stats as;
  ES_CHECK_RC(es_admission_stats_get(es_runtime_admission(rt), &as));
  return as.reserved_bytes;
}

static void test_task_reserves_until_freed(void **state) {
  (void)state;
  NEED_MODELS();
  tweak tw = {.budget = (size_t)64 << 20, .model_limit = 1};
  es_runtime *rt = runtime_new(2, &tw);
  int face = load(rt, "face", face_);
  const size_t MiB = (size_t)1 << 20;

  task_arg a = {.ret = 0};
  es_request *r;
  es_refusal why;
  ES_CHECK_RC(task_submit(rt, face, 48 * MiB, 0, &a, &r, &why));
  ES_CHECK_RC(es_request_wait(r, -1));
  assert_int_equal(atomic_load(&a.runs), 1);
  assert_false(pthread_equal(a.ran_on, a.caller)); /* on a worker */
  assert_int_equal(es_request_output_count(r), 0);
  es_request_info info;
  ES_CHECK_RC(es_request_info_get(r, &info));
  assert_int_equal(info.reserved_bytes, 48 * MiB);
  assert_int_equal(reserved(rt), 48 * MiB); /* held after the run */

  /* No slot taken: the model (limit 1) still admits its own request. */
  float x[128 * 128 * 3] = {0};
  es_tensor in = {.dtype = ES_DTYPE_FLOAT, .rank = 4, .dims = {1, 128, 128, 3},
                  .data = x, .nbytes = sizeof x};
  es_submit s = {.model = face, .inputs = &in, .n_inputs = 1};
  es_request *q;
  ES_CHECK_RC(es_runtime_submit(rt, &s, &q, &why));
  ES_CHECK_RC(es_request_wait(q, -1));
  es_request_free(q);

  /* Over what is left: refused now, with a retry-after; beyond the whole
   * budget: never. */
  task_arg b = {.ret = 0};
  es_request *r2;
  ES_EXPECT_RC(task_submit(rt, face, 32 * MiB, 0, &b, &r2, &why), ES_EAGAIN);
  assert_null(r2);
  assert_int_equal(why.reason, ES_REFUSE_OVER_MEMORY);
  assert_true(why.retry_after_ms >= 1);
  ES_EXPECT_RC(task_submit(rt, face, 65 * MiB, 0, &b, &r2, &why), ES_ENOSPC);
  assert_int_equal(why.reason, ES_REFUSE_OVER_MEMORY);
  assert_int_equal(atomic_load(&b.runs), 0);

  /* A draining model refuses tasks; unload waits for the held handle. */
  ES_EXPECT_RC(es_runtime_model_unload(rt, face, 0), ES_ETIMEDOUT);
  ES_EXPECT_RC(task_submit(rt, face, MiB, 0, &b, &r2, &why), ES_EAGAIN);
  assert_int_equal(why.reason, ES_REFUSE_DRAINING);
  ES_CHECK_RC(es_runtime_model_resume(rt, face));

  es_request_free(r);
  assert_int_equal(reserved(rt), 0);
  ES_CHECK_RC(task_submit(rt, face, 32 * MiB, 0, &b, &r2, &why));
  ES_CHECK_RC(es_request_wait(r2, -1));
  es_request_free(r2);
  assert_int_equal(reserved(rt), 0);
  ES_CHECK_RC(es_runtime_destroy(rt));
}

static void test_task_errors_and_deadlines(void **state) {
  (void)state;
  NEED_MODELS();
  es_runtime *rt = runtime_new(1, NULL);
  int face = load(rt, "face", face_);
  es_request *r;
  es_refusal why;

  /* Its own code and detail, through es_request_wait. */
  task_arg a = {.ret = ES_EINVAL};
  ES_CHECK_RC(task_submit(rt, face, 4096, 0, &a, &r, &why));
  assert_int_equal(es_request_wait(r, -1), ES_EINVAL);
  assert_string_equal(es_last_error_detail(), "task says no (7)");
  es_request_free(r);

  /* A task that gave up at its deadline: a DEADLINE refusal with the
   * admission's estimate. */
  task_arg t = {.ret = ES_ETIMEDOUT};
  ES_CHECK_RC(task_submit(rt, face, 4096, 0, &t, &r, &why));
  assert_int_equal(es_request_wait(r, -1), ES_ETIMEDOUT);
  es_request_info info;
  ES_CHECK_RC(es_request_info_get(r, &info));
  assert_int_equal(info.refusal.reason, ES_REFUSE_DEADLINE);
  assert_true(info.refusal.retry_after_ms >= 1);
  es_request_free(r);

  /* Queued past its deadline: completes without running. */
  ES_CHECK_RC(es_runtime_pause(rt, 1));
  task_arg q = {.ret = 0};
  ES_CHECK_RC(task_submit(rt, face, 4096, es__now_ns() + 20 * 1000000ull, &q, &r, &why));
  assert_int_equal(es_request_wait(r, -1), ES_ETIMEDOUT);
  assert_non_null(strstr(es_last_error_detail(), "deadline"));
  assert_int_equal(atomic_load(&q.runs), 0);
  es_request_free(r);
  ES_CHECK_RC(es_runtime_pause(rt, 0));

  /* Bad arguments. */
  es_task bad = {.model = face, .bytes = 1};
  ES_EXPECT_RC(es_runtime_submit_task(rt, &bad, &r, &why), ES_EINVAL); /* no fn */
  es_task none = {.model = 31, .bytes = 1, .fn = task_fn, .user = &a};
  ES_EXPECT_RC(es_runtime_submit_task(rt, &none, &r, &why), ES_ENOENT);
  es_task prio = {.model = face, .bytes = 1, .priority = 9, .fn = task_fn, .user = &a};
  ES_EXPECT_RC(es_runtime_submit_task(rt, &prio, &r, &why), ES_EINVAL);
  assert_int_equal(reserved(rt), 0);
  ES_CHECK_RC(es_runtime_destroy(rt));
}

int main(void) {
  es_test_model_path(det_, sizeof det_, "ppocr_det.onnx");
  es_test_model_path(face_, sizeof face_, "blazeface_front_128.onnx");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_never_fits_buddy),
      cmocka_unit_test(test_two_at_the_ceiling),
      cmocka_unit_test(test_short_at_run_time),
      cmocka_unit_test(test_task_reserves_until_freed),
      cmocka_unit_test(test_task_errors_and_deadlines),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
