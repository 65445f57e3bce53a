/* Resumable runs (es_run): a run paused between steps and resumed later,
 * with other models' runs in between (what a worker does to let an urgent
 * request through), gives exactly the outputs of an uninterrupted one, on
 * the five target models (BlazeFace front and back, PP-OCR det, cls and
 * rec), paused at every step boundary for BlazeFace front and at random
 * ones for the others; pausing and resuming allocate nothing; a paused run
 * can be dropped and the arena's next run is whole; plans that split long
 * convolutions into bands (es_engine_split_set) give the same outputs, and
 * an urgent run made at each safe point inside a band's conv (what a worker
 * does there) changes nothing. The models come from
 * scripts/setup/fetch-models.sh (the tests skip without them). */
#include "es_test.h"

#include "edgeserve/engine.h"
#include "edgeserve/memory.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct target {
  const char *file;
  int rank;
  int64_t dims[4];
} target;

/* Shapes within each model's fixed dims; det at 320x320 to keep the test
 * quick. */
static const target targets_[] = {
    {"blazeface_front_128.onnx", 4, {1, 128, 128, 3}},
    {"blazeface_back_256.onnx", 4, {1, 256, 256, 3}},
    {"ppocr_det.onnx", 4, {1, 3, 320, 320}},
    {"ppocr_cls.onnx", 4, {1, 3, 48, 192}},
    {"ppocr_rec.onnx", 4, {1, 3, 48, 320}},
};
#define N_TARGETS 5

typedef struct loaded {
  es_model *m;
  es_plan *p;
  es_tensor in;
  float *x;
  int n_out;
} loaded;

static loaded t_[N_TARGETS];
static int have_;

static int setup(void **state) {
  (void)state;
  uint64_t seed = 7;
  for (int i = 0; i < N_TARGETS; i++) {
    char path[1024];
    es_test_model_path(path, sizeof path, targets_[i].file);
    if (es_model_load(path, NULL, &t_[i].m) < 0) {
      printf("# %s not loaded (%s): tests skip\n", targets_[i].file, es_last_error_detail());
      return 0;
    }
    es_tensor_info info;
    ES_CHECK_RC(es_model_input_info(t_[i].m, 0, &info));
    info.rank = targets_[i].rank;
    size_t n = 1;
    for (int d = 0; d < info.rank; d++)
      n *= (size_t)(info.dims[d] = targets_[i].dims[d]);
    ES_CHECK_RC(es_model_plan(t_[i].m, &info, 1, &t_[i].p));
    t_[i].x = malloc(n * sizeof(float));
    for (size_t k = 0; k < n; k++)
      t_[i].x[k] = (float)(es_test_rand(&seed) % 2001) / 1000.0f - 1.0f;
    t_[i].in = (es_tensor){.name = info.name, .dtype = ES_DTYPE_FLOAT, .rank = info.rank,
                           .data = t_[i].x, .nbytes = n * sizeof(float)};
    memcpy(t_[i].in.dims, info.dims, sizeof info.dims);
    t_[i].n_out = es_plan_output_count(t_[i].p);
  }
  have_ = 1;
  return 0;
}

static int teardown(void **state) {
  (void)state;
  for (int i = 0; i < N_TARGETS; i++) {
    es_plan_release(t_[i].p);
    es_model_release(t_[i].m);
    free(t_[i].x);
  }
  return 0;
}

static es_arena *arena_for(const es_plan *p) {
  es_arena *a;
  ES_CHECK_RC(es_arena_create(es_plan_arena_bytes(p), 64, &a));
  return a;
}

/* Each model: an uninterrupted run, then one paused at every boundary
 * (front) or after 1-7 steps at a time (the others), an "urgent" run of
 * BlazeFace front in its own arena at every pause; outputs byte for byte
 * the same, no allocation from the first step to the outputs. */
static void test_paused_runs_match(void **state) {
  (void)state;
  if (!have_)
    skip();
  es_arena *urgent_a = arena_for(t_[0].p);
  es_tensor urgent_out[8];
  uint64_t seed = 11;
  for (int i = 0; i < N_TARGETS; i++) {
    loaded *L = &t_[i];
    es_arena *a = arena_for(L->p), *b = arena_for(L->p);
    es_tensor whole[8], paused[8];
    assert_true(L->n_out <= 8);
    ES_CHECK_RC(es_plan_run(L->p, &L->in, 1, a, whole, L->n_out)); /* warms the thread too */
    ES_CHECK_RC(es_plan_run(L->p, &L->in, 1, b, paused, L->n_out));
    es_arena_reset(urgent_a);
    ES_CHECK_RC(es_plan_run(t_[0].p, &t_[0].in, 1, urgent_a, urgent_out, t_[0].n_out));
    memset(b->base, 0xa5, es_plan_arena_bytes(L->p)); /* nothing left from before */
    es_arena_reset(b);
    int total = es_plan_node_count(L->p), pauses = 0;
    uint64_t allocs = es_test_total_allocs();
    size_t mem = es_mem_total();
    es_run r;
    ES_CHECK_RC(es_run_begin(&r, L->p, &L->in, 1, b, NULL));
    int left;
    while ((left = es_run_steps(&r, i == 0 ? 1 : 1 + (int)(es_test_rand(&seed) % 7))) > 0) {
      int done, all;
      ES_CHECK_RC(es_run_progress(&r, &done, &all));
      assert_int_equal(all, total);
      assert_int_equal(done + left, total);
      pauses++;
      es_arena_reset(urgent_a);
      ES_CHECK_RC(es_plan_run(t_[0].p, &t_[0].in, 1, urgent_a, urgent_out, t_[0].n_out));
    }
    assert_int_equal(left, 0);
    ES_CHECK_RC(es_run_finish(&r, paused, L->n_out));
    assert_int_equal(es_test_total_allocs(), allocs); /* pausing and resuming allocate nothing */
    assert_int_equal(es_mem_total(), mem);
    if (i == 0)
      assert_int_equal(pauses, total - 1); /* every boundary */
    for (int o = 0; o < L->n_out; o++) {
      assert_int_equal(paused[o].nbytes, whole[o].nbytes);
      assert_memory_equal(paused[o].data, whole[o].data, whole[o].nbytes);
    }
    printf("# %-26s %4d steps, paused %4d times: outputs identical\n", targets_[i].file, total,
           pauses);
    es_arena_destroy(a);
    es_arena_destroy(b);
  }
  es_arena_destroy(urgent_a);
}

/* A paused run dropped (a cancelled request): the arena's next run is whole
 * and right; a run that is over refuses more steps. */
static void test_abort_and_misuse(void **state) {
  (void)state;
  if (!have_)
    skip();
  loaded *L = &t_[0];
  es_arena *a = arena_for(L->p), *b = arena_for(L->p);
  es_tensor whole[8], again[8];
  ES_CHECK_RC(es_plan_run(L->p, &L->in, 1, a, whole, L->n_out));
  es_run r;
  ES_CHECK_RC(es_run_begin(&r, L->p, &L->in, 1, b, NULL));
  assert_true(es_run_steps(&r, 5) > 0);
  es_run_abort(&r);
  ES_EXPECT_RC(es_run_steps(&r, 1), ES_EINVAL);
  ES_EXPECT_RC(es_run_finish(&r, again, L->n_out), ES_EINVAL);
  es_arena_reset(b);
  ES_CHECK_RC(es_run_begin(&r, L->p, &L->in, 1, b, NULL));
  ES_CHECK_RC(es_run_finish(&r, again, L->n_out));
  for (int o = 0; o < L->n_out; o++)
    assert_memory_equal(again[o].data, whole[o].data, whole[o].nbytes);
  ES_EXPECT_RC(es_run_steps(&r, 1), ES_EINVAL); /* finished: over */
  /* an arena without room for the plan: begin refuses, nothing taken */
  es_arena_reset(b);
  void *blk;
  ES_CHECK_RC(es_arena_alloc(b, 64, &blk));
  ES_EXPECT_RC(es_run_begin(&r, L->p, &L->in, 1, b, NULL), ES_ENOSPC);
  es_arena_destroy(a);
  es_arena_destroy(b);
}

typedef struct safe_count {
  int calls;
  es_arena *a;
  es_tensor out[8];
} safe_count;

/* The hook: an "urgent" BlazeFace front run in its own arena. */
static void urgent_at_safe_point(void *user) {
  safe_count *c = user;
  c->calls++;
  es_arena_reset(c->a);
  ES_CHECK_RC(es_plan_run(t_[0].p, &t_[0].in, 1, c->a, c->out, t_[0].n_out));
}

/* A band's outputs against the whole conv's. oneDNN's x86 kernels compute
 * each output the same way whatever the band; its portable GEMM
 * convolution (CPUs without its JIT kernels, e.g. Armv8.2 without SVE)
 * blocks the product by the band's size, which reorders the sums. */
#if defined(__x86_64__)
#define SPLIT_TOL 1e-5
#else
#define SPLIT_TOL 1e-4
#endif

/* Each model planned again with convolutions split into bands of 8 MFLOP:
 * the outputs equal the whole plan's (to float rounding: a band is its own
 * oneDNN primitive, whose blocking may differ), the hook runs at the safe
 * points between bands with an urgent run inside, and the runs allocate
 * nothing. */
static void test_split_safe_points(void **state) {
  (void)state;
  if (!have_)
    skip();
  safe_count c = {.a = arena_for(t_[0].p)};
  es_engine_split_set((uint64_t)8 << 20);
  int any = 0;
  for (int i = 0; i < N_TARGETS; i++) {
    loaded *L = &t_[i];
    es_tensor_info info;
    ES_CHECK_RC(es_model_input_info(L->m, 0, &info));
    info.rank = L->in.rank;
    memcpy(info.dims, L->in.dims, sizeof info.dims);
    es_plan *split;
    ES_CHECK_RC(es_model_plan(L->m, &info, 1, &split));
    es_arena *a = arena_for(L->p), *b = arena_for(split);
    es_tensor whole[8], banded[8];
    ES_CHECK_RC(es_plan_run(L->p, &L->in, 1, a, whole, L->n_out));
    ES_CHECK_RC(es_plan_run(split, &L->in, 1, b, banded, L->n_out)); /* warms the thread */
    es_arena_reset(b);
    c.calls = 0;
    uint64_t allocs = es_test_total_allocs();
    es_engine_safe_point_set(urgent_at_safe_point, &c);
    ES_CHECK_RC(es_plan_run(split, &L->in, 1, b, banded, L->n_out));
    es_engine_safe_point_set(NULL, NULL);
    assert_int_equal(es_test_total_allocs(), allocs);
    double worst = 0;
    for (int o = 0; o < L->n_out; o++) {
      assert_int_equal(banded[o].nbytes, whole[o].nbytes);
      const float *x = whole[o].data, *y = banded[o].data;
      for (size_t k = 0; k < whole[o].nbytes / sizeof(float); k++) {
        double d = fabs((double)x[k] - (double)y[k]) / (1 + fabs((double)x[k]));
        worst = d > worst ? d : worst;
      }
    }
    printf("# %-26s %3d safe points in a run, worst difference %.3g\n", targets_[i].file,
           c.calls, worst);
    assert_true(worst <= SPLIT_TOL);
    any |= c.calls > 0;
    es_arena_destroy(a);
    es_arena_destroy(b);
    es_plan_release(split);
  }
  es_engine_split_set(0);
  assert_true(any); /* det's convolutions at 320x320 are above 8 MFLOP */
  es_arena_destroy(c.a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_paused_runs_match),
      cmocka_unit_test(test_abort_and_misuse),
      cmocka_unit_test(test_split_safe_points),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
