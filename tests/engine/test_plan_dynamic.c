/* Data-dependent shapes in bounded plans: models whose tensors' shapes
 * depend on input values (NonZero, NonMaxSuppression, TopK with k from a
 * shape computation over them, an If on a condition the plan cannot know)
 * plan at a bound, report each bound and what sets it, and run in an arena
 * of exactly the planned size, each tensor carrying its actual shape: the
 * same plan serves inputs that select nothing, some, or everything, from
 * several threads at once. A shape computation that shrinks as its input
 * grows outgrows its bound at run time: the run fails with ES_EBOUND and
 * the process goes on. If branches run only when taken, nested too; a
 * branch whose condition the plan knows is not planned. Models are built
 * in memory (onnx_builder). */
#include "es_test.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

#include "edgeserve/engine.h"
#include "edgeserve/memory.h"
#include "onnx.pb-c.h"
#include "support/onnx_builder.h"

#define I64 ONNX__TENSOR_PROTO__DATA_TYPE__INT64

typedef struct run_ctx {
  es_plan *p;
  es_arena *a;
  es_tensor out[4];
} run_ctx;

/* Plans m for the inputs' shapes and runs it in an arena of exactly
 * es_plan_arena_bytes (plus the base's alignment): returns the run's code. */
static int plan_run(es_model *m, int n_in, const es_tensor *in, int n_out, run_ctx *r) {
  es_tensor_info shapes[4];
  for (int i = 0; i < n_in; i++) {
    shapes[i] = (es_tensor_info){.name = in[i].name, .dtype = in[i].dtype, .rank = in[i].rank};
    memcpy(shapes[i].dims, in[i].dims, sizeof shapes[i].dims);
  }
  ES_CHECK_RC(es_model_plan(m, shapes, n_in, &r->p));
  ES_CHECK_RC(es_arena_create(es_plan_arena_bytes(r->p), 64, &r->a));
  return es_plan_run(r->p, in, n_in, r->a, r->out, n_out);
}

static void run_done(run_ctx *r) {
  es_arena_destroy(r->a);
  es_plan_release(r->p);
}

/* x [8] -> the positive elements, their squares and their count:
 *   nz = NonZero(x > 0) [1, n]; idx = Reshape(nz, [-1]); sel = Gather(x, idx)
 *   sq = sel * sel; n = Shape(sel) */
static es_model *select_model(void) {
  ob *b = ob_new(13);
  ob_input(b, "x", 1, (int64_t[]){8});
  ob_init_f32(b, "zero", 0, NULL, (float[]){0});
  ob_init_i64(b, "flat", 1, (int64_t[]){1}, (int64_t[]){-1});
  ob_node(b, "Greater", "pos", 2, "x", "zero");
  ob_node(b, "NonZero", "nz", 1, "pos");
  ob_node(b, "Reshape", "idx", 2, "nz", "flat");
  ob_node(b, "Gather", "sel", 2, "x", "idx");
  ob_node(b, "Mul", "sq", 2, "sel", "sel");
  ob_node(b, "Shape", "n", 1, "sel");
  ob_output(b, "sel");
  ob_output(b, "sq");
  ob_output_typed(b, "n", I64);
  es_model *m = ob_load(b);
  free(b);
  return m;
}

static void check_select(es_model *m, const float *x) {
  float want[8];
  int n = 0;
  for (int i = 0; i < 8; i++)
    if (x[i] > 0)
      want[n++] = x[i];
  es_tensor in = ob_tensor_f32("x", 1, (int64_t[]){8}, x);
  run_ctx r;
  ES_CHECK_RC(plan_run(m, 1, &in, 3, &r));
  assert_int_equal(r.out[0].rank, 1);
  assert_int_equal(r.out[0].dims[0], n);
  assert_int_equal(r.out[0].nbytes, (size_t)n * sizeof(float));
  assert_int_equal(r.out[1].dims[0], n);
  for (int i = 0; i < n; i++) {
    assert_true(((float *)r.out[0].data)[i] == want[i]);
    assert_true(((float *)r.out[1].data)[i] == want[i] * want[i]);
  }
  assert_int_equal(r.out[2].dims[0], 1);
  assert_int_equal(*(int64_t *)r.out[2].data, n);
  run_done(&r);
}

/* Nothing, some and every element selected by one model; the plan's
 * outputs report their bounds and the bounded values say what sets them. */
static void test_nonzero_select(void **state) {
  (void)state;
  es_model *m = select_model();
  check_select(m, (float[]){-1, 2, -3, 4, 0, 6, -7, 0.5f});
  check_select(m, (float[]){-1, -2, -3, -4, 0, -6, -7, 0});
  check_select(m, (float[]){1, 2, 3, 4, 5, 6, 7, 8});

  es_plan *p;
  es_tensor_info s = {.name = "x", .dtype = ES_DTYPE_FLOAT, .rank = 1, .dims = {8}};
  ES_CHECK_RC(es_model_plan(m, &s, 1, &p));
  es_tensor_info oi;
  ES_CHECK_RC(es_plan_output_info(p, 0, &oi));
  assert_int_equal(oi.dims[0], 8); /* the bound */
  int nb = es_plan_bound_count(p), found = 0;
  assert_true(nb >= 5); /* nz, idx, sel, sq, n */
  for (int i = 0; i < nb; i++) {
    es_bound_info bi;
    ES_CHECK_RC(es_plan_bound_info(p, i, &bi));
    if (!strcmp(bi.value, "nz")) {
      found = 1;
      assert_non_null(strstr(bi.node, "NonZero"));
      assert_non_null(strstr(bi.why, "X's 8 elements, all non-zero"));
      assert_int_equal(bi.bound.rank, 2);
      assert_int_equal(bi.bound.dims[1], 8);
      assert_int_equal(bi.data_dims, 2); /* [1, <=8] */
    } else {
      assert_string_equal(bi.why, ""); /* inherited */
    }
  }
  assert_true(found);
  es_bound_info bi;
  ES_EXPECT_RC(es_plan_bound_info(p, nb, &bi), ES_EINVAL);
  es_plan_release(p);
  es_model_release(m);
}

/* The boxes and scores of ONNX's suppress_by_IOU example (boxes 3, 0 and 5
 * kept), or with keep_none scores of 0 (nothing kept), as the inputs in[]
 * over c's arrays. */
typedef struct nms_case {
  float boxes[24], scores[6];
  es_tensor in[2];
} nms_case;

static void nms_case_init(nms_case *c, int keep_none) {
  static const float boxes[24] = {0, 0,  1, 1,  0, 0.1f, 1, 1.1f,  0, -0.1f, 1, 0.9f,
                                  0, 10, 1, 11, 0, 10.1f, 1, 11.1f, 0, 100,   1, 101};
  static const float scores[6] = {0.9f, 0.75f, 0.6f, 0.95f, 0.5f, 0.3f};
  memcpy(c->boxes, boxes, sizeof boxes);
  memcpy(c->scores, scores, sizeof scores);
  if (keep_none)
    memset(c->scores, 0, sizeof c->scores);
  c->in[0] = ob_tensor_f32("boxes", 3, (int64_t[]){1, 6, 4}, c->boxes);
  c->in[1] = ob_tensor_f32("scores", 3, (int64_t[]){1, 1, 6}, c->scores);
}

/* A detector's tail (ob_nms_tail): NonMaxSuppression keeps some boxes
 * (ONNX's suppress_by_IOU example), their boxes are gathered, and TopK
 * takes the best min(kept, 2) scores, k computed from the kept count's
 * shape. */
static es_model *nms_model(void) {
  ob *b = ob_new(13);
  ob_nms_tail(b);
  es_model *m = ob_load(b);
  free(b);
  return m;
}

static void test_nms_topk(void **state) {
  (void)state;
  es_model *m = nms_model();
  nms_case c;
  nms_case_init(&c, 0);
  run_ctx r;
  ES_CHECK_RC(plan_run(m, 2, c.in, 2, &r));
  /* kept: boxes 3, 0, 5 (the others overlap a better one by IoU > 0.5) */
  assert_int_equal(r.out[0].rank, 3);
  assert_int_equal(r.out[0].dims[1], 3);
  const float *kb = r.out[0].data;
  assert_true(kb[1] == 10 && kb[5] == 0 && kb[9] == 100);
  assert_int_equal(r.out[1].dims[2], 2);
  assert_true(((float *)r.out[1].data)[0] == 0.95f && ((float *)r.out[1].data)[1] == 0.9f);
  /* the bound: 1 batch x 1 class x max 4 boxes */
  int nb = es_plan_bound_count(r.p), found = 0;
  for (int i = 0; i < nb; i++) {
    es_bound_info bi;
    ES_CHECK_RC(es_plan_bound_info(r.p, i, &bi));
    if (!strcmp(bi.value, "sel")) {
      found = 1;
      assert_int_equal(bi.bound.dims[0], 4);
      assert_int_equal(bi.data_dims, 1); /* [<=4, 3] */
      assert_non_null(strstr(bi.why, "max_output_boxes_per_class"));
    }
  }
  assert_true(found);
  run_done(&r);

  /* nothing above the threshold: empty outputs, k = 0 */
  nms_case_init(&c, 1);
  ES_CHECK_RC(plan_run(m, 2, c.in, 2, &r));
  assert_int_equal(r.out[0].dims[1], 0);
  assert_int_equal(r.out[1].dims[2], 0);
  assert_int_equal(r.out[1].nbytes, 0);
  run_done(&r);
  es_model_release(m);
}

/* zeros [10 - n] for n positive elements of x [8]: planned at n = 8 (2
 * zeros), so an input with fewer positives needs more than the bound. */
static void test_bound_outgrown(void **state) {
  (void)state;
  ob *b = ob_new(13);
  ob_input(b, "x", 1, (int64_t[]){8});
  ob_init_f32(b, "zero", 0, NULL, (float[]){0});
  ob_init_i64(b, "ten", 1, (int64_t[]){1}, (int64_t[]){10});
  ob_init_i64(b, "one", 1, (int64_t[]){1}, (int64_t[]){1});
  ob_node(b, "Greater", "pos", 2, "x", "zero");
  ob_node(b, "NonZero", "nz", 1, "pos");
  ob_node(b, "Shape", "nzs", 1, "nz");
  ob_node(b, "Gather", "n", 2, "nzs", "one");
  ob_node(b, "Sub", "len", 2, "ten", "n");
  ob_node(b, "ConstantOfShape", "z", 1, "len");
  ob_output(b, "z");
  es_model *m = ob_load(b);
  free(b);
  float all[8] = {1, 1, 1, 1, 1, 1, 1, 1}, some[8] = {1, 1, 1, 0, 0, 0, 0, 0};
  es_tensor in = ob_tensor_f32("x", 1, (int64_t[]){8}, all);
  run_ctx r;
  ES_CHECK_RC(plan_run(m, 1, &in, 1, &r));
  assert_int_equal(r.out[0].dims[0], 2);
  run_done(&r);
  in.data = some;
  ES_EXPECT_RC(plan_run(m, 1, &in, 1, &r), ES_EBOUND);
  assert_non_null(strstr(es_last_error_detail(), "ConstantOfShape"));
  run_done(&r);
  /* the model still serves inputs within the bound */
  in.data = all;
  ES_CHECK_RC(plan_run(m, 1, &in, 1, &r));
  run_done(&r);
  es_model_release(m);
}

/* ---- If: both branches inlined, guarded --------------------------------- */

/* torchvision's batched NMS: if nothing is kept, an empty int64 [0] (the
 * then-branch), else the kept boxes' indices (the else-branch, reading
 * outer values); the condition (the kept count is 0) is computed from the
 * NMS output's shape, so the plan, at the bounds, cannot know it. */
static es_model *nms_if_model(void) {
  static ob th, el;
  static const int64_t zero = 0, empty_dims[1] = {0};
  ob_init(&th, 13);
  ob_init(&el, 13);
  ob_init_i64(&th, "empty", 1, empty_dims, NULL);
  ob_output(&th, "empty");
  int g = ob_node(&el, "Gather", "idx", 2, "sel", "col");
  ob_attr_int(&el, g, "axis", 1);
  ob_output(&el, "idx");
  ob *b = ob_new(13);
  ob_nms(b);
  ob_init_i64(b, "zero", 0, NULL, &zero);
  ob_node(b, "Shape", "sh", 1, "sel");
  int r = ob_node(b, "ReduceProd", "n", 1, "sh");
  ob_attr_int(b, r, "keepdims", 0);
  ob_node(b, "Equal", "none", 2, "n", "zero");
  int f = ob_node(b, "If", "keep", 1, "none");
  ob_attr_graph(b, f, "then_branch", &th.graph);
  ob_attr_graph(b, f, "else_branch", &el.graph);
  g = ob_node(b, "Gather", "kept", 2, "boxes", "keep");
  ob_attr_int(b, g, "axis", 1);
  ob_output(b, "kept");
  es_model *m = ob_load(b);
  free(b);
  return m;
}

static void test_if_on_bounded_condition(void **state) {
  (void)state;
  es_model *m = nms_if_model();
  nms_case c;
  nms_case_init(&c, 0);
  run_ctx r;
  ES_CHECK_RC(plan_run(m, 2, c.in, 1, &r)); /* the else-branch: 3 kept */
  assert_int_equal(r.out[0].dims[1], 3);
  const float *kb = r.out[0].data;
  assert_true(kb[1] == 10 && kb[5] == 0 && kb[9] == 100);
  int nb = es_plan_bound_count(r.p), found = 0;
  for (int i = 0; i < nb; i++) {
    es_bound_info bi;
    ES_CHECK_RC(es_plan_bound_info(r.p, i, &bi));
    if (!strcmp(bi.value, "keep")) {
      found = 1;
      assert_int_equal(bi.bound.dims[0], 4); /* the else-branch's bound, over then's 0 */
      assert_int_equal(bi.data_dims, 1);
      assert_non_null(strstr(bi.why, "If branches"));
    }
  }
  assert_true(found);
  run_done(&r);
  nms_case_init(&c, 1); /* the then-branch: nothing kept */
  ES_CHECK_RC(plan_run(m, 2, c.in, 1, &r));
  assert_int_equal(r.out[0].dims[1], 0);
  run_done(&r);
  es_model_release(m);
}

/* An If on data: y = s > 0 ? (max > 5 ? x + 100 : relu(x)) : -x, with s the
 * sum and max the largest element of x, the inner If nested in the outer's
 * then-branch; and the same If on a constant condition, whose branch not
 * taken the plan leaves out. */
static es_model *if_data_model(int constant) {
  static ob th, el, th2, el2;
  static const float zero = 0, five = 5, hundred = 100;
  static const uint8_t yes = 1;
  ob_init(&th2, 13);
  ob_node(&th2, "Add", "big", 2, "x", "hundred");
  ob_output(&th2, "big");
  ob_init(&el2, 13);
  ob_node(&el2, "Relu", "rl", 1, "x");
  ob_output(&el2, "rl");
  ob_init(&th, 13);
  int r = ob_node(&th, "ReduceMax", "mx", 1, "x");
  ob_attr_int(&th, r, "keepdims", 0);
  ob_node(&th, "Greater", "over", 2, "mx", "five");
  int f = ob_node(&th, "If", "inner", 1, "over");
  ob_attr_graph(&th, f, "then_branch", &th2.graph);
  ob_attr_graph(&th, f, "else_branch", &el2.graph);
  ob_output(&th, "inner");
  ob_init(&el, 13);
  ob_node(&el, "Neg", "ng", 1, "x");
  ob_output(&el, "ng");
  ob *b = ob_new(13);
  ob_input(b, "x", 1, (int64_t[]){4});
  ob_init_f32(b, "zero", 0, NULL, &zero);
  ob_init_f32(b, "five", 0, NULL, &five);
  ob_init_f32(b, "hundred", 0, NULL, &hundred);
  if (constant) {
    Onnx__TensorProto *t = ob_init_i64(b, "c", 0, NULL, NULL);
    t->data_type = ONNX__TENSOR_PROTO__DATA_TYPE__BOOL;
    t->n_int64_data = 0;
    t->has_raw_data = 1;
    t->raw_data.len = 1;
    t->raw_data.data = (uint8_t *)&yes;
  } else {
    int s = ob_node(b, "ReduceSum", "s", 1, "x");
    ob_attr_int(b, s, "keepdims", 0);
    ob_node(b, "Greater", "c", 2, "s", "zero");
  }
  f = ob_node(b, "If", "y", 1, "c");
  ob_attr_graph(b, f, "then_branch", &th.graph);
  ob_attr_graph(b, f, "else_branch", &el.graph);
  ob_output(b, "y");
  es_model *m = ob_load(b);
  free(b);
  return m;
}

static void check_if_data(es_model *m, const float *x) {
  float s = 0, mx = x[0];
  for (int i = 0; i < 4; i++) {
    s += x[i];
    mx = x[i] > mx ? x[i] : mx;
  }
  es_tensor in = ob_tensor_f32("x", 1, (int64_t[]){4}, x);
  run_ctx r;
  ES_CHECK_RC(plan_run(m, 1, &in, 1, &r));
  assert_int_equal(r.out[0].dims[0], 4);
  for (int i = 0; i < 4; i++) {
    float want = s > 0 ? (mx > 5 ? x[i] + 100 : fmaxf(x[i], 0)) : -x[i];
    assert_true(((float *)r.out[0].data)[i] == want);
  }
  run_done(&r);
}

static void test_if_on_data_nested(void **state) {
  (void)state;
  es_model *m = if_data_model(0);
  check_if_data(m, (float[]){1, -2, 3, 9});  /* then, then */
  check_if_data(m, (float[]){1, -2, 3, 4});  /* then, else */
  check_if_data(m, (float[]){-1, -2, 3, 1}); /* else */
  es_plan *p;
  es_tensor_info s = {.name = "x", .dtype = ES_DTYPE_FLOAT, .rank = 1, .dims = {4}};
  ES_CHECK_RC(es_model_plan(m, &s, 1, &p));
  int all = es_plan_node_count(p);
  assert_int_equal(es_plan_bound_count(p), 0); /* the branches agree on shapes */
  es_plan_release(p);
  es_model_release(m);

  /* the condition a constant: the else-branch (Neg) is not planned */
  m = if_data_model(1);
  ES_CHECK_RC(es_model_plan(m, &s, 1, &p));
  assert_true(es_plan_node_count(p) < all);
  es_plan_release(p);
  float x[4] = {1, -2, 3, -9}, mx = 3;
  es_tensor in = ob_tensor_f32("x", 1, (int64_t[]){4}, x);
  run_ctx r;
  ES_CHECK_RC(plan_run(m, 1, &in, 1, &r));
  for (int i = 0; i < 4; i++)
    assert_true(((float *)r.out[0].data)[i] == (mx > 5 ? x[i] + 100 : fmaxf(x[i], 0)));
  run_done(&r);
  es_model_release(m);
}

/* One plan, two threads at once, each its own arena: one keeps 3 boxes,
 * the other none, 200 times each; every run gets its own shapes (the
 * shape table and the inferred parameters live in the run's arena). */
typedef struct nms_thread {
  const es_plan *p;
  int keep_none;
  int bad;
} nms_thread;

static void *nms_thread_main(void *arg) {
  nms_thread *t = arg;
  nms_case c;
  nms_case_init(&c, t->keep_none);
  es_arena *a;
  if (es_arena_create(es_plan_arena_bytes(t->p), 64, &a) < 0) {
    t->bad = 1;
    return NULL;
  }
  for (int i = 0; i < 200; i++) {
    es_arena_reset(a);
    es_tensor out[2];
    if (es_plan_run(t->p, c.in, 2, a, out, 2) < 0 || out[0].dims[1] != (t->keep_none ? 0 : 3) ||
        out[1].dims[2] != (t->keep_none ? 0 : 2))
      t->bad++;
  }
  es_arena_destroy(a);
  return NULL;
}

static void test_concurrent_runs(void **state) {
  (void)state;
  es_model *m = nms_model();
  es_tensor_info s[2] = {{.name = "boxes", .dtype = ES_DTYPE_FLOAT, .rank = 3, .dims = {1, 6, 4}},
                         {.name = "scores", .dtype = ES_DTYPE_FLOAT, .rank = 3, .dims = {1, 1, 6}}};
  es_plan *p;
  ES_CHECK_RC(es_model_plan(m, s, 2, &p));
  nms_thread t[2] = {{p, 0, 0}, {p, 1, 0}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++)
    assert_int_equal(pthread_create(&th[i], NULL, nms_thread_main, &t[i]), 0);
  for (int i = 0; i < 2; i++)
    pthread_join(th[i], NULL);
  assert_int_equal(t[0].bad, 0);
  assert_int_equal(t[1].bad, 0);
  es_plan_release(p);
  es_model_release(m);
}

/* A plan without data-dependent shapes has no bounds and no extra bytes. */
static void test_static_plan_unchanged(void **state) {
  (void)state;
  ob *b = ob_new(13);
  ob_input(b, "x", 1, (int64_t[]){8});
  ob_node(b, "Relu", "y", 1, "x");
  ob_output(b, "y");
  es_model *m = ob_load(b);
  free(b);
  es_plan *p;
  es_tensor_info s = {.name = "x", .dtype = ES_DTYPE_FLOAT, .rank = 1, .dims = {8}};
  ES_CHECK_RC(es_model_plan(m, &s, 1, &p));
  assert_int_equal(es_plan_bound_count(p), 0);
  assert_int_equal(es_plan_arena_bytes(p), 64); /* y alone */
  es_plan_release(p);
  es_model_release(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_nonzero_select),
      cmocka_unit_test(test_nms_topk),
      cmocka_unit_test(test_bound_outgrown),
      cmocka_unit_test(test_if_on_bounded_condition),
      cmocka_unit_test(test_if_on_data_nested),
      cmocka_unit_test(test_concurrent_runs),
      cmocka_unit_test(test_static_plan_unchanged),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
