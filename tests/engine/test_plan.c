/* Planner and run tests on a real model (BlazeFace front, the smallest
 * target): the plan's arena size is exact, a run allocates nothing, weights
 * are never written, bad inputs are refused, and one plan serves several
 * threads at once with identical results. Skipped when the models have not
 * been fetched (scripts/setup/fetch-models.sh). */
#include "es_test.h"

#include <pthread.h>
#include <string.h>

#include "edgeserve/engine.h"
#include "edgeserve/memory.h"

#ifndef ES_SOURCE_DIR
#define ES_SOURCE_DIR "."
#endif

static es_model *model_;

static int setup(void **state) {
  (void)state;
  const char *dir = getenv("ES_MODEL_DIR");
  char path[1024];
  snprintf(path, sizeof path, "%s/blazeface_front_128.onnx",
           dir ? dir : ES_SOURCE_DIR "/.cache/models");
  int rc = es_model_load(path, NULL, &model_);
  if (rc < 0)
    printf("# model not loaded (%s): tests skip\n", es_last_error_detail());
  return 0;
}

static int teardown(void **state) {
  (void)state;
  es_model_release(model_);
  return 0;
}

#define NEED_MODEL()                                                           \
  do {                                                                         \
    if (!model_)                                                               \
      skip();                                                                  \
  } while (0)

static const es_tensor_info shape_ = {
    .name = "input:0", .dtype = ES_DTYPE_FLOAT, .rank = 4, .dims = {1, 128, 128, 3}};

static float *make_input(size_t *n) {
  *n = 128 * 128 * 3;
  float *x = malloc(*n * sizeof *x);
  uint64_t s = 99;
  for (size_t i = 0; i < *n; i++)
    x[i] = (float)(es_test_rand(&s) % 2001) / 1000.0f - 1.0f;
  return x;
}

static void test_arena_exact_and_no_allocation(void **state) {
  (void)state;
  NEED_MODEL();
  es_plan *p;
  ES_CHECK_RC(es_model_plan(model_, &shape_, 1, &p));
  size_t bytes = es_plan_arena_bytes(p);
  assert_true(bytes > 0);
  es_arena *a;
  ES_CHECK_RC(es_arena_create(bytes, 64, &a));
  size_t n;
  float *x = make_input(&n);
  es_tensor in = {.dtype = ES_DTYPE_FLOAT, .rank = 4, .dims = {1, 128, 128, 3}, .data = x,
                  .nbytes = n * sizeof *x};
  es_tensor out[4];
  ES_CHECK_RC(es_plan_run(p, &in, 1, a, out, 4)); /* warm: per-thread library state */
  for (int r = 0; r < 3; r++) {
    es_arena_reset(a);
    uint64_t before = es_test_total_allocs();
    size_t mem_before = es_mem_total();
    ES_CHECK_RC(es_plan_run(p, &in, 1, a, out, 4));
    assert_int_equal(es_test_total_allocs(), before); /* a run allocates nothing */
    assert_int_equal(es_mem_total(), mem_before);
    assert_int_equal(es_arena_used(a), bytes); /* planned == used, exactly */
  }
  assert_int_equal(out[0].rank, 3);
  assert_int_equal(out[0].dims[1], 512);
  for (int o = 0; o < 4; o++) {
    const unsigned char *d = out[o].data;
    assert_true(d >= (const unsigned char *)a->base && d < (const unsigned char *)a->base + bytes);
  }
  free(x);
  es_arena_destroy(a);
  es_plan_release(p);
}

static void test_arena_too_small(void **state) {
  (void)state;
  NEED_MODEL();
  es_plan *p;
  ES_CHECK_RC(es_model_plan(model_, &shape_, 1, &p));
  es_arena *a;
  ES_CHECK_RC(es_arena_create(es_plan_arena_bytes(p) - 64, 64, &a));
  size_t n;
  float *x = make_input(&n);
  es_tensor in = {.dtype = ES_DTYPE_FLOAT, .rank = 4, .dims = {1, 128, 128, 3}, .data = x};
  es_tensor out[4];
  ES_EXPECT_RC(es_plan_run(p, &in, 1, a, out, 4), ES_ENOSPC);
  free(x);
  es_arena_destroy(a);
  es_plan_release(p);
}

static void test_bad_inputs(void **state) {
  (void)state;
  NEED_MODEL();
  es_plan *p;
  es_tensor_info bad = shape_;
  bad.dims[1] = 64; /* the model fixes 128 */
  ES_EXPECT_RC(es_model_plan(model_, &bad, 1, &p), ES_EINVAL);
  assert_non_null(strstr(es_last_error_detail(), "input:0"));
  bad = shape_;
  bad.dtype = ES_DTYPE_INT64;
  ES_EXPECT_RC(es_model_plan(model_, &bad, 1, &p), ES_EINVAL);
  bad = shape_;
  bad.rank = 3;
  ES_EXPECT_RC(es_model_plan(model_, &bad, 1, &p), ES_EINVAL);
  ES_EXPECT_RC(es_model_plan(model_, &shape_, 2, &p), ES_EINVAL);
  ES_EXPECT_RC(es_model_plan(NULL, &shape_, 1, &p), ES_EINVAL);

  ES_CHECK_RC(es_model_plan(model_, &shape_, 1, &p));
  es_arena *a;
  ES_CHECK_RC(es_arena_create(es_plan_arena_bytes(p), 64, &a));
  size_t n;
  float *x = make_input(&n);
  es_tensor in = {.dtype = ES_DTYPE_FLOAT, .rank = 4, .dims = {1, 128, 64, 3}, .data = x};
  es_tensor out[4];
  ES_EXPECT_RC(es_plan_run(p, &in, 1, a, out, 4), ES_EINVAL); /* shape differs from the plan */
  in.dims[2] = 128;
  in.data = NULL;
  ES_EXPECT_RC(es_plan_run(p, &in, 1, a, out, 4), ES_EINVAL);
  in.data = x;
  ES_EXPECT_RC(es_plan_run(p, &in, 1, NULL, out, 4), ES_ECORRUPT);
  ES_EXPECT_RC(es_plan_run(p, &in, 1, a, out, 5), ES_EINVAL);
  free(x);
  es_arena_destroy(a);
  es_plan_release(p);
}

/* Weights live in a sealed region (a write would fault; test_model_load checks
 * the seal); running must not make copies of them either. */
static void test_runs_copy_no_weights(void **state) {
  (void)state;
  NEED_MODEL();
  es_mem_stats before;
  es_mem_stats_get(ES_MEM_WEIGHTS, &before);
  es_plan *p;
  ES_CHECK_RC(es_model_plan(model_, &shape_, 1, &p));
  es_arena *a;
  ES_CHECK_RC(es_arena_create(es_plan_arena_bytes(p), 64, &a));
  size_t n;
  float *x = make_input(&n);
  es_tensor in = {.dtype = ES_DTYPE_FLOAT, .rank = 4, .dims = {1, 128, 128, 3}, .data = x};
  es_tensor out[4];
  for (int r = 0; r < 4; r++) {
    es_arena_reset(a);
    ES_CHECK_RC(es_plan_run(p, &in, 1, a, out, 4));
  }
  es_model_stats ms;
  es_model_stats_get(model_, &ms);
  es_mem_stats after;
  es_mem_stats_get(ES_MEM_WEIGHTS, &after);
  /* running made no new copy of the weights */
  assert_true(after.current <= before.current + es_plan_context_bytes(p));
  free(x);
  es_arena_destroy(a);
  es_plan_release(p);
}

typedef struct worker {
  const es_plan *p;
  const float *x;
  float result[512];
  int rc;
} worker;

static void *run_thread(void *arg) {
  worker *w = arg;
  es_arena *a;
  w->rc = es_arena_create(es_plan_arena_bytes(w->p), 64, &a);
  if (w->rc < 0)
    return NULL;
  es_tensor in = {.dtype = ES_DTYPE_FLOAT, .rank = 4, .dims = {1, 128, 128, 3},
                  .data = (void *)w->x};
  es_tensor out[4];
  for (int r = 0; r < 5 && w->rc == 0; r++) {
    es_arena_reset(a);
    w->rc = es_plan_run(w->p, &in, 1, a, out, 4);
  }
  if (w->rc == 0)
    memcpy(w->result, out[0].data, sizeof w->result);
  es_arena_destroy(a);
  return NULL;
}

static void test_one_plan_many_threads(void **state) {
  (void)state;
  NEED_MODEL();
  es_plan *p;
  ES_CHECK_RC(es_model_plan(model_, &shape_, 1, &p));
  size_t n;
  float *x = make_input(&n);
  enum { T = 4 };
  worker w[T];
  pthread_t th[T];
  for (int i = 0; i < T; i++) {
    w[i] = (worker){.p = p, .x = x};
    assert_int_equal(pthread_create(&th[i], NULL, run_thread, &w[i]), 0);
  }
  for (int i = 0; i < T; i++)
    pthread_join(th[i], NULL);
  for (int i = 0; i < T; i++) {
    ES_CHECK_RC(w[i].rc);
    assert_memory_equal(w[i].result, w[0].result, sizeof w[0].result);
  }
  free(x);
  es_plan_release(p);
}

/* The plan cache on a model with open dimensions (PP-OCR's direction
 * classifier, input [?,3,?,?]). */
static void test_plan_cache(void **state) {
  (void)state;
  const char *dir = getenv("ES_MODEL_DIR");
  char path[1024];
  snprintf(path, sizeof path, "%s/ppocr_cls.onnx", dir ? dir : ES_SOURCE_DIR "/.cache/models");
  es_model *m;
  if (es_model_load(path, NULL, &m) < 0)
    skip();
  es_plan_cache *c;
  ES_EXPECT_RC(es_plan_cache_create(m, 0, &c), ES_EINVAL);
  ES_CHECK_RC(es_plan_cache_create(m, 2, &c));
  ES_CHECK_RC(es_plan_cache_bucket(c, 0, 3, 32));
  ES_EXPECT_RC(es_plan_cache_bucket(c, 1, 0, 32), ES_EINVAL);
  es_tensor_info s = {.dtype = ES_DTYPE_FLOAT, .rank = 4, .dims = {1, 3, 48, 100}};
  es_plan *a, *b, *d, *e;
  ES_CHECK_RC(es_plan_cache_get(c, &s, 1, &a));
  es_tensor_info in;
  ES_CHECK_RC(es_plan_input_info(a, 0, &in));
  assert_int_equal(in.dims[3], 128); /* bucketed: the caller pads to this */
  s.dims[3] = 120;
  ES_CHECK_RC(es_plan_cache_get(c, &s, 1, &b));
  assert_ptr_equal(a, b); /* same bucket, same plan */
  s.dims[3] = 192;
  ES_CHECK_RC(es_plan_cache_get(c, &s, 1, &d));
  s.dims[3] = 300;
  ES_CHECK_RC(es_plan_cache_get(c, &s, 1, &e)); /* evicts the width-128 plan */
  es_plan_cache_stats st;
  ES_CHECK_RC(es_plan_cache_stats_get(c, &st));
  assert_int_equal(st.entries, 2);
  assert_int_equal(st.hits, 1);
  assert_int_equal(st.misses, 3);
  assert_int_equal(st.evictions, 1);
  assert_true(st.max_arena_bytes >= es_plan_arena_bytes(e));
  /* an evicted plan stays valid while referenced */
  es_arena *ar;
  ES_CHECK_RC(es_arena_create(es_plan_arena_bytes(a), 64, &ar));
  float *x = calloc(3 * 48 * 128, sizeof *x);
  es_tensor t = {.dtype = ES_DTYPE_FLOAT, .rank = 4, .dims = {1, 3, 48, 128}, .data = x};
  es_tensor out;
  ES_CHECK_RC(es_plan_run(a, &t, 1, ar, &out, 1));
  assert_int_equal(out.dims[1], 2);
  free(x);
  es_arena_destroy(ar);
  es_plan_release(a);
  es_plan_release(b);
  es_plan_release(d);
  es_plan_release(e);
  es_plan_cache_destroy(c);
  es_model_release(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_arena_exact_and_no_allocation),
      cmocka_unit_test(test_arena_too_small),
      cmocka_unit_test(test_bad_inputs),
      cmocka_unit_test(test_runs_copy_no_weights),
      cmocka_unit_test(test_one_plan_many_threads),
      cmocka_unit_test(test_plan_cache),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
