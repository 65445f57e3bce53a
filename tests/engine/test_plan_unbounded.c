/* Nodes no bound covers, run without a plan: a Loop whose scan output
 * grows with its trip count (a model input), a Resize to sizes given as
 * data, and ONNX's own Loop and Scan models planned whole. Their memory
 * comes from the run heap: every block goes back (a counting heap ends at
 * zero), a heap that refuses stops the run with its error and nothing
 * left out, and the plan serves the next run. In the runtime the heap is
 * the buddy pool charged to the request's admission: a request whose loop
 * outgrows the memory budget is refused with ES_EAGAIN (OVER_MEMORY, a
 * retry-after), and the model keeps serving. */
#include "es_test.h"

#include "edgeserve/engine.h"
#include "edgeserve/memory.h"
#include "edgeserve/runtime.h"
#include "model/graph.h"
#include "support/onnx_builder.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N 8 /* floats carried */

/* m (int64 scalar), acc0 [N] -> Loop(m, "", acc0) -> acc [N] = acc0 + m and
 * steps [m, N], step i = acc0 + i + 1. The body reads "one" from the main
 * graph (a capture). */
static char loop_path[256];

static void make_loop(void) {
  ob *body = ob_new(13), *b = ob_new(13);
  ob_loop(b, body, N);
  size_t n;
  uint8_t *bytes = ob_pack(b, &n);
  snprintf(loop_path, sizeof loop_path, "/tmp/es-loop-%d.onnx", (int)getpid());
  FILE *f = fopen(loop_path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(bytes, 1, n, f), n);
  fclose(f);
  free(bytes);
  free(b);
  free(body);
}

static int setup(void **state) {
  (void)state;
  make_loop();
  return 0;
}

static int teardown(void **state) {
  (void)state;
  unlink(loop_path);
  return 0;
}

static float acc0[N];

static void loop_inputs(es_tensor *in, int64_t *m) {
  for (int i = 0; i < N; i++)
    acc0[i] = (float)i * 0.5f;
  in[0] = (es_tensor){.name = "m", .dtype = ES_DTYPE_INT64, .rank = 0, .data = m,
                      .nbytes = sizeof *m};
  in[1] = ob_tensor_f32("acc0", 1, (int64_t[]){N}, acc0);
}

static es_plan *loop_plan(es_model *m) {
  es_tensor_info sh[2] = {{.name = "m", .dtype = ES_DTYPE_INT64, .rank = 0},
                          {.name = "acc0", .dtype = ES_DTYPE_FLOAT, .rank = 1, .dims = {N}}};
  es_plan *p;
  ES_CHECK_RC(es_model_plan(m, sh, 2, &p));
  return p;
}

static void check_loop_outputs(const es_tensor *out, int64_t m) {
  assert_int_equal(out[0].rank, 1);
  assert_int_equal(out[0].dims[0], N);
  assert_int_equal(out[1].dims[0], m);
  if (m == 0) { /* no iteration: the body says no step shape, so [0] */
    assert_int_equal(out[1].nbytes, 0);
  } else {
    assert_int_equal(out[1].rank, 2);
    assert_int_equal(out[1].dims[1], N);
  }
  const float *acc = out[0].data, *steps = out[1].data;
  for (int i = 0; i < N; i++)
    assert_float_equal(acc[i], acc0[i] + (float)m, 1e-6);
  for (int64_t t = 0; t < m; t++)
    for (int i = 0; i < N; i++)
      assert_float_equal(steps[t * N + i], acc0[i] + (float)(t + 1), 1e-6);
}

/* The Loop runs without a plan; every heap block comes back; the outputs
 * are heap blocks until es_plan_outputs_free, or in the arena's room for
 * es_plan_run. */
static void test_loop_runs_on_the_heap(void **state) {
  (void)state;
  size_t before = es_mem_total();
  es_model *m;
  ES_CHECK_RC(es_model_load(loop_path, NULL, &m));
  es_plan *p = loop_plan(m);
  assert_int_equal(es_plan_unbounded_count(p), 1);
  const char *node, *why;
  ES_CHECK_RC(es_plan_unbounded_info(p, &node, &why));
  assert_non_null(strstr(node, "loop"));
  assert_non_null(strstr(why, "Loop runs its body once per iteration"));
  es_arena *a;
  ES_CHECK_RC(es_arena_create(es_plan_arena_bytes(p) + 64, 64, &a));
  es_mem_heap h = {0};
  es_run_heap heap = es_mem_heap_make(&h);
  int64_t trips[] = {0, 1, 7, 300};
  for (size_t k = 0; k < sizeof trips / sizeof *trips; k++) {
    es_tensor in[2], out[2];
    loop_inputs(in, &trips[k]);
    es_arena_reset(a);
    ES_CHECK_RC(es_plan_run_heap(p, in, 2, a, &heap, out, 2));
    check_loop_outputs(out, trips[k]);
    assert_true(h.cur > 0 || trips[k] == 0 || out[1].nbytes == 0);
    es_plan_outputs_free(p, &heap, out, 2);
    assert_null(out[0].data);
    assert_int_equal(h.cur, 0); /* every block back */
  }
  printf("# 300 iterations: heap peak %zu B\n", h.peak);
  /* es_plan_run: the outputs move into the arena's room after the plan */
  int64_t m7 = 7;
  es_tensor in[2], out[2];
  loop_inputs(in, &m7);
  es_arena_reset(a);
  ES_EXPECT_RC(es_plan_run(p, in, 2, a, out, 2), ES_ENOSPC); /* 64 B of room */
  es_arena *big;
  ES_CHECK_RC(es_arena_create(es_plan_arena_bytes(p) + 4096, 64, &big));
  ES_CHECK_RC(es_plan_run(p, in, 2, big, out, 2));
  check_loop_outputs(out, 7);
  es_arena_destroy(big);
  es_arena_destroy(a);
  es_plan_release(p);
  es_model_release(m);
  assert_int_equal(es_mem_total(), before); /* the body and its program went with the model */
}

/* A Loop whose body holds an If (inlined in the body as in a main graph):
 * iterations 0-2 add one, later ones two; the branches read the main
 * graph's constants through two scopes. */
static void test_loop_body_with_if(void **state) {
  (void)state;
  static const float two = 2.0f, three = 3.0f;
  ob *th = ob_new(13), *el = ob_new(13), *body = ob_new(13), *b = ob_new(13);
  ob_node(th, "Add", "t", 2, "acc", "one");
  ob_output(th, "t");
  ob_node(el, "Add", "e", 2, "acc", "two");
  ob_output(el, "e");
  int c = ob_node(body, "Cast", "itf", 1, "iter");
  ob_attr_int(body, c, "to", 1);
  ob_node(body, "Less", "early", 2, "itf", "three");
  int f = ob_node(body, "If", "acc_out", 1, "early");
  ob_attr_graph(body, f, "then_branch", &th->graph);
  ob_attr_graph(body, f, "else_branch", &el->graph);
  ob_loop_main(b, body, N);
  ob_init_f32(b, "two", 0, NULL, &two);
  ob_init_f32(b, "three", 0, NULL, &three);
  es_model *m = ob_load(b);
  free(th), free(el), free(body), free(b);
  es_plan *p = loop_plan(m);
  es_arena *a;
  ES_CHECK_RC(es_arena_create(es_plan_arena_bytes(p) + 64, 64, &a));
  es_mem_heap h = {0};
  es_run_heap heap = es_mem_heap_make(&h);
  int64_t trips = 6;
  es_tensor in[2], out[2];
  loop_inputs(in, &trips);
  ES_CHECK_RC(es_plan_run_heap(p, in, 2, a, &heap, out, 2));
  assert_int_equal(out[1].dims[0], 6);
  const float *acc = out[0].data, *steps = out[1].data;
  float add[6] = {1, 2, 3, 5, 7, 9}; /* after each iteration */
  for (int t = 0; t < 6; t++)
    for (int i = 0; i < N; i++)
      assert_float_equal(steps[t * N + i], acc0[i] + add[t], 1e-6);
  for (int i = 0; i < N; i++)
    assert_float_equal(acc[i], acc0[i] + 9, 1e-6);
  es_plan_outputs_free(p, &heap, out, 2);
  assert_int_equal(h.cur, 0);
  es_arena_destroy(a);
  es_plan_release(p);
  es_model_release(m);
}

/* A heap that refuses stops the run with its error and leaves nothing out;
 * the plan then runs again with a heap that has room. */
static void test_heap_refusal(void **state) {
  (void)state;
  es_model *m;
  ES_CHECK_RC(es_model_load(loop_path, NULL, &m));
  es_plan *p = loop_plan(m);
  es_arena *a;
  ES_CHECK_RC(es_arena_create(es_plan_arena_bytes(p) + 64, 64, &a));
  es_mem_heap h = {.limit = 16384};
  es_run_heap heap = es_mem_heap_make(&h);
  int64_t many = 2000; /* 2000 x 32 B of steps, doubling: past 16 KiB */
  es_tensor in[2], out[2];
  loop_inputs(in, &many);
  ES_EXPECT_RC(es_plan_run_heap(p, in, 2, a, &heap, out, 2), ES_EAGAIN);
  assert_true(h.refusals > 0);
  assert_int_equal(h.cur, 0);
  h.limit = 0;
  es_arena_reset(a);
  ES_CHECK_RC(es_plan_run_heap(p, in, 2, a, &heap, out, 2));
  check_loop_outputs(out, many);
  es_plan_outputs_free(p, &heap, out, 2);
  assert_int_equal(h.cur, 0);
  es_arena_destroy(a);
  es_plan_release(p);
  es_model_release(m);
}

/* x [1, 1, 2, 2], sizes (int64 [4], data) -> Resize -> y: no bound, so the
 * Resize and the Relu after it run without a plan, at the sizes each run
 * gives. */
static void test_resize_to_data_sizes(void **state) {
  (void)state;
  ob *b = ob_new(13);
  ob_input(b, "x", 4, (int64_t[]){1, 1, 2, 2});
  ob_input(b, "sizes", 1, (int64_t[]){4});
  b->in_tt[1].elem_type = ONNX__TENSOR_PROTO__DATA_TYPE__INT64;
  int r = ob_node(b, "Resize", "r", 4, "x", "", "", "sizes");
  ob_attr_string(b, r, "mode", "nearest");
  ob_node(b, "Relu", "y", 1, "r");
  ob_output(b, "y");
  es_model *m = ob_load(b);
  free(b);
  es_tensor_info sh[2] = {{.name = "x", .dtype = ES_DTYPE_FLOAT, .rank = 4, .dims = {1, 1, 2, 2}},
                          {.name = "sizes", .dtype = ES_DTYPE_INT64, .rank = 1, .dims = {4}}};
  es_plan *p;
  ES_CHECK_RC(es_model_plan(m, sh, 2, &p));
  assert_int_equal(es_plan_unbounded_count(p), 2);
  const char *node, *why;
  ES_CHECK_RC(es_plan_unbounded_info(p, &node, &why));
  assert_non_null(strstr(why, "sizes"));
  float x[4] = {-1, 2, 3, -4};
  es_arena *a;
  ES_CHECK_RC(es_arena_create(es_plan_arena_bytes(p) + 64, 64, &a));
  es_mem_heap h = {0};
  es_run_heap heap = es_mem_heap_make(&h);
  int64_t sizes[2][4] = {{1, 1, 4, 4}, {1, 1, 2, 6}};
  for (int k = 0; k < 2; k++) {
    es_tensor in[2] = {ob_tensor_f32("x", 4, (int64_t[]){1, 1, 2, 2}, x),
                       {.name = "sizes", .dtype = ES_DTYPE_INT64, .rank = 1, .dims = {4},
                        .data = sizes[k], .nbytes = sizeof sizes[k]}};
    es_tensor out;
    es_arena_reset(a);
    ES_CHECK_RC(es_plan_run_heap(p, in, 2, a, &heap, &out, 1));
    assert_int_equal(out.rank, 4);
    assert_int_equal(out.dims[2], sizes[k][2]);
    assert_int_equal(out.dims[3], sizes[k][3]);
    const float *y = out.data;
    for (int64_t i = 0; i < sizes[k][2]; i++)
      for (int64_t j = 0; j < sizes[k][3]; j++) {
        float want = x[(i * 2 / sizes[k][2]) * 2 + j * 2 / sizes[k][3]];
        assert_float_equal(y[i * sizes[k][3] + j], want > 0 ? want : 0, 0);
      }
    es_plan_outputs_free(p, &heap, &out, 1);
    assert_int_equal(h.cur, 0);
  }
  es_arena_destroy(a);
  es_plan_release(p);
  es_model_release(m);
}

/* ONNX's Loop and Scan models (libonnx-testdata), planned whole and run
 * with the heap, against their expected outputs. */
static int read_tensor(const char *path, es_value *v, void **data) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return -1;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  void *buf = malloc((size_t)n + 1);
  size_t got = fread(buf, 1, (size_t)n, f);
  fclose(f);
  int rc = got == (size_t)n ? es__onnx_tensor_parse(buf, (size_t)n, v, data) : -1;
  free(buf);
  return rc;
}

static void test_onnx_loop_and_scan_planned(void **state) {
  (void)state;
  const char *root = "/usr/share/libonnx-testdata/data/node";
  const char *names[] = {"test_loop11", "test_scan9_sum", "test_range_float_type_positive_delta_expanded",
                         "test_range_int32_type_negative_delta_expanded"};
  int ran = 0;
  for (size_t t = 0; t < sizeof names / sizeof *names; t++) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s/model.onnx", root, names[t]);
    if (access(path, R_OK) != 0)
      continue;
    es_model *m;
    ES_CHECK_RC(es_model_load(path, NULL, &m));
    int n_in = es_model_input_count(m), n_out = es_model_output_count(m);
    es_tensor in[4], out[4];
    es_tensor_info sh[4];
    es_value vin[4], vout[4];
    void *din[4], *dout[4];
    for (int i = 0; i < n_in; i++) {
      snprintf(path, sizeof path, "%s/%s/test_data_set_0/input_%d.pb", root, names[t], i);
      ES_CHECK_RC(read_tensor(path, &vin[i], &din[i]));
      sh[i] = (es_tensor_info){.dtype = vin[i].dtype, .rank = vin[i].rank};
      in[i] = (es_tensor){.dtype = vin[i].dtype, .rank = vin[i].rank, .data = din[i],
                          .nbytes = vin[i].nbytes};
      for (int d = 0; d < vin[i].rank; d++)
        sh[i].dims[d] = in[i].dims[d] = vin[i].dims[d];
    }
    es_plan *p;
    ES_CHECK_RC(es_model_plan(m, sh, n_in, &p));
    assert_true(es_plan_unbounded_count(p) > 0);
    es_arena *a;
    ES_CHECK_RC(es_arena_create(es_plan_arena_bytes(p) + 64, 64, &a));
    es_mem_heap h = {0};
    es_run_heap heap = es_mem_heap_make(&h);
    ES_CHECK_RC(es_plan_run_heap(p, in, n_in, a, &heap, out, n_out));
    for (int o = 0; o < n_out; o++) {
      snprintf(path, sizeof path, "%s/%s/test_data_set_0/output_%d.pb", root, names[t], o);
      ES_CHECK_RC(read_tensor(path, &vout[o], &dout[o]));
      assert_int_equal(out[o].dtype, vout[o].dtype);
      assert_int_equal(out[o].rank, vout[o].rank);
      assert_int_equal(out[o].nbytes, vout[o].nbytes);
      for (int d = 0; d < vout[o].rank; d++)
        assert_int_equal(out[o].dims[d], vout[o].dims[d]);
      if (out[o].dtype == ES_DTYPE_FLOAT)
        for (size_t k = 0; k < out[o].nbytes / 4; k++)
          assert_float_equal(((float *)out[o].data)[k], ((float *)dout[o])[k], 1e-5);
      else
        assert_memory_equal(out[o].data, dout[o], out[o].nbytes);
      es_mem_free(dout[o]);
    }
    es_plan_outputs_free(p, &heap, out, n_out);
    assert_int_equal(h.cur, 0);
    for (int i = 0; i < n_in; i++)
      es_mem_free(din[i]);
    printf("# %s: planned, %d of its nodes without a plan; matches\n", names[t],
           es_plan_unbounded_count(p));
    es_arena_destroy(a);
    es_plan_release(p);
    es_model_release(m);
    ran++;
  }
  if (!ran)
    skip();
}

/* The runtime: the loop's memory is charged to the request's admission;
 * past the budget the request is refused (ES_EAGAIN, OVER_MEMORY, a
 * retry-after) and the model goes on serving; nothing stays reserved. */
static void test_runtime_refuses_past_budget(void **state) {
  (void)state;
  es_runtime_config rc;
  es_runtime_config_default(&rc);
  rc.workers = 2;
  rc.pin = 0;
  rc.memory_budget_bytes = (size_t)1 << 20;
  rc.buddy_bytes = (size_t)8 << 20;
  es_runtime *rt;
  ES_CHECK_RC(es_runtime_create(&rc, &rt));
  es_model_config mc;
  es_model_config_default(&mc);
  mc.name = "loop";
  mc.path = loop_path;
  int id;
  ES_CHECK_RC(es_runtime_model_load(rt, &mc, &id));
  es_admission *adm = es_runtime_admission(rt);
  int64_t trips[] = {5, 40000, 9}; /* 40000 x 32 B of steps: past 1 MiB */
  for (int k = 0; k < 3; k++) {
    es_tensor in[2];
    loop_inputs(in, &trips[k]);
    es_submit s = {.model = id, .inputs = in, .n_inputs = 2};
    es_request *r;
    es_refusal why;
    ES_CHECK_RC(es_runtime_submit(rt, &s, &r, &why));
    int st = es_request_wait(r, -1);
    if (k == 1) {
      assert_int_equal(st, ES_EAGAIN);
      es_request_info info;
      ES_CHECK_RC(es_request_info_get(r, &info));
      assert_int_equal(info.refusal.reason, ES_REFUSE_OVER_MEMORY);
      assert_true(info.refusal.retry_after_ms > 0);
      printf("# refused: %s\n", es_last_error_detail());
    } else {
      assert_int_equal(st, 0);
      es_tensor out[2];
      ES_CHECK_RC(es_request_output(r, 0, &out[0]));
      ES_CHECK_RC(es_request_output(r, 1, &out[1]));
      check_loop_outputs(out, trips[k]);
    }
    es_request_free(r);
    es_runtime_stats rs;
    ES_CHECK_RC(es_runtime_stats_get(rt, &rs));
    assert_int_equal(rs.run_heap_bytes, 0);
    es_admission_stats as;
    ES_CHECK_RC(es_admission_stats_get(adm, &as));
    assert_int_equal(as.reserved_bytes, 0);
  }
  ES_CHECK_RC(es_runtime_destroy(rt));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_loop_runs_on_the_heap),
      cmocka_unit_test(test_loop_body_with_if),
      cmocka_unit_test(test_heap_refusal),
      cmocka_unit_test(test_resize_to_data_sizes),
      cmocka_unit_test(test_onnx_loop_and_scan_planned),
      cmocka_unit_test(test_runtime_refuses_past_budget),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
