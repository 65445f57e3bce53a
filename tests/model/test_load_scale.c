/* Load time grows linearly with the graph. Chains of 20,000, 40,000 and
 * 80,000 nodes are loaded and planned (parse, graph build, topological
 * sort, pruning, folding, fusion, shape inference, sealing, planning: what
 * es_model_load and a first es_model_plan do), and the times printed with
 * their ratios:
 *   - Relu on [1,16], fused (into FusedElementwise groups) and unfused (a
 *     plan of n steps, each output in its input's buffer);
 *   - Transpose on [4,4] (not fused; a buffer per step for the planner to
 *     place).
 * A quadratic step makes t80/t20 about 16; the assertion allows 12, and an
 * absolute bound far above any machine's time, because the machine running
 * the suite may be shared and noisy: the times compared are the thread's CPU
 * time, the best of three runs, each started with the heap handed back to
 * the system (malloc_trim), so that no run reuses pages an earlier one
 * faulted in.
 *
 * ES_LOAD_SCALE_NODES=N (or N,M,...) times Relu chains of those sizes as
 * well and asserts nothing about them: scripts/bench/bench_load.sh runs it
 * for 200,000. */
#include "es_test.h"

#include <malloc.h>
#include <string.h>
#include <time.h>

#include "edgeserve/engine.h"
#include "support/onnx_builder.h"

static double clock_s(clockid_t id) {
  struct timespec t;
  clock_gettime(id, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

typedef struct chain {
  const char *op;
  int rank;
  int64_t dims[2];
  int fusion;
} chain;

typedef struct timing {
  double wall, cpu; /* seconds, the best of the repetitions each */
} timing;

static const chain relu_fused = {"Relu", 2, {1, 16}, 1};
static const chain relu_unfused = {"Relu", 2, {1, 16}, 0};
static const chain transposes = {"Transpose", 2, {4, 4}, 1};

/* x after the chain: Relu of Relu... is Relu; an even number of 2-D
 * Transposes is x. */
static float chain_expect(const chain *c, int n, const float *x, int i) {
  if (!strcmp(c->op, "Relu"))
    return x[i] > 0 ? x[i] : 0;
  return n % 2 ? x[(i % 4) * 4 + i / 4] : x[i];
}

/* Loads and plans a chain of n nodes reps times; runs each plan once and
 * checks the result. */
static timing load_plan_time(const chain *c, int n, int reps) {
  es_engine_fusion_set(c->fusion);
  size_t size;
  uint8_t *buf = ob_chain_pack(c->op, n, c->rank, c->dims, &size);
  timing best = {1e30, 1e30};
  for (int r = 0; r < reps; r++) {
    size_t before = es_mem_total();
    malloc_trim(0);
    double w0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
    es_model *m;
    ES_CHECK_RC(es_model_load_buffer(buf, size, NULL, &m));
    es_tensor_info in = {.name = "x", .dtype = ES_DTYPE_FLOAT, .rank = c->rank};
    memcpy(in.dims, c->dims, sizeof c->dims);
    es_plan *p;
    ES_CHECK_RC(es_model_plan(m, &in, 1, &p));
    double wall = clock_s(CLOCK_MONOTONIC) - w0, cpu = clock_s(CLOCK_THREAD_CPUTIME_ID) - c0;
    float x[16];
    for (int i = 0; i < 16; i++)
      x[i] = (float)(i - 8);
    es_tensor tin = {.name = "x", .dtype = ES_DTYPE_FLOAT, .rank = c->rank, .data = x,
                     .nbytes = sizeof x};
    memcpy(tin.dims, c->dims, sizeof c->dims);
    es_arena *a;
    ES_CHECK_RC(es_arena_create(es_plan_arena_bytes(p) + 64, 64, &a));
    es_tensor out;
    ES_CHECK_RC(es_plan_run(p, &tin, 1, a, &out, 1));
    assert_int_equal(out.nbytes, sizeof x);
    for (int i = 0; i < 16; i++)
      assert_true(((const float *)out.data)[i] == chain_expect(c, n, x, i));
    es_arena_destroy(a);
    es_plan_release(p);
    es_model_release(m);
    assert_int_equal(es_mem_total(), before);
    if (wall < best.wall)
      best.wall = wall;
    if (cpu < best.cpu)
      best.cpu = cpu;
  }
  free(buf);
  es_engine_fusion_set(1);
  return best;
}

static void print_time(const chain *c, long n, timing t) {
  printf("# %s chain, fusion %s: %ld nodes: load + plan %.3f s (CPU %.3f s)\n", c->op,
         c->fusion ? "on" : "off", n, t.wall, t.cpu);
}

static void scale(const chain *c) {
  static const int sizes[] = {20000, 40000, 80000};
  timing t[3];
  for (int i = 0; i < 3; i++) {
    t[i] = load_plan_time(c, sizes[i], 3);
    print_time(c, sizes[i], t[i]);
  }
  printf("# %s chain, fusion %s: CPU time t40/t20 %.2f, t80/t40 %.2f, t80/t20 %.2f "
         "(linear: 2, 2, 4; quadratic: 4, 4, 16)\n",
         c->op, c->fusion ? "on" : "off", t[1].cpu / t[0].cpu, t[2].cpu / t[1].cpu,
         t[2].cpu / t[0].cpu);
  assert_true(t[2].cpu / t[0].cpu < 12);
  assert_true(t[2].cpu < 60); /* seconds: many times what a sanitizer build takes */
}

static void test_relu_fused(void **state) {
  (void)state;
  scale(&relu_fused);
}

static void test_relu_unfused(void **state) {
  (void)state;
  scale(&relu_unfused);
}

static void test_transposes(void **state) {
  (void)state;
  scale(&transposes);
}

/* The sizes ES_LOAD_SCALE_NODES names, timed and printed. */
static void test_extra_sizes(void **state) {
  (void)state;
  const char *e = getenv("ES_LOAD_SCALE_NODES");
  if (!e || !*e) {
    printf("# no ES_LOAD_SCALE_NODES: nothing more to time\n");
    return;
  }
  while (*e) {
    char *end;
    long n = strtol(e, &end, 10);
    if (end == e || n < 1 || n > 4000000)
      fail_msg("ES_LOAD_SCALE_NODES: '%s' is not a node count (1..4000000)", e);
    print_time(&relu_fused, n, load_plan_time(&relu_fused, (int)n, 1));
    print_time(&relu_unfused, n, load_plan_time(&relu_unfused, (int)n, 1));
    e = *end == ',' ? end + 1 : end;
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_relu_fused),
      cmocka_unit_test(test_relu_unfused),
      cmocka_unit_test(test_transposes),
      cmocka_unit_test(test_extra_sizes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
