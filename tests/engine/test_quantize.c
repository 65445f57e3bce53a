/* The quantizer (quantize.h) on small models built here: the QDQ model it
 * writes loads, runs and stays close to FP32; BatchNormalization and Relu
 * are folded; an opset 9 model is raised to 13 (Clip's attributes become
 * inputs); a Softmax whose meaning would change is refused by name; misuse
 * gets clear errors; and all of its memory goes back. The five target
 * models are covered by tests/e2e/test_quantize_cli.sh against ONNX Runtime. */
#include "es_test.h"

#include <math.h>
#include <string.h>
#include <unistd.h>

#include "edgeserve/engine.h"
#include "edgeserve/memory.h"
#include "edgeserve/quantize.h"
#include "support/onnx_builder.h"

#define C_IN 3
#define C_MID 8
#define HW 12

static float w1_[C_MID * C_IN * 9], w2_[4 * C_MID], b2_[4];
static float bn_s_[C_MID], bn_b_[C_MID], bn_m_[C_MID], bn_v_[C_MID];
static float clip_max_ = 6.0f;

/* x [1,3,12,12] -> Conv 3x3 -> BatchNormalization -> Relu -> Conv 1x1 (bias)
 * -> Clip(0, 6) -> y (before opset 11 Clip's bounds are attributes). With
 * softmax, y -> Softmax(axis) -> z as well. */
static uint8_t *small_model(int64_t opset, int softmax, int64_t axis, size_t *size) {
  uint64_t s = 42;
  es_test_fill_small(w1_, sizeof w1_ / 4, &s);
  es_test_fill_small(w2_, sizeof w2_ / 4, &s);
  es_test_fill_small(b2_, 4, &s);
  for (int i = 0; i < C_MID; i++) {
    bn_s_[i] = 1.0f + 0.1f * (float)i;
    bn_b_[i] = 0.05f * (float)(i - 4);
    bn_m_[i] = 0.01f * (float)i;
    bn_v_[i] = 0.5f + 0.05f * (float)i;
  }
  ob *b = ob_new(opset);
  ob_input(b, "x", 4, (int64_t[]){1, C_IN, HW, HW});
  ob_init_f32(b, "w1", 4, (int64_t[]){C_MID, C_IN, 3, 3}, w1_);
  ob_init_f32(b, "w2", 4, (int64_t[]){4, C_MID, 1, 1}, w2_);
  ob_init_f32(b, "b2", 1, (int64_t[]){4}, b2_);
  ob_init_f32(b, "bn_s", 1, (int64_t[]){C_MID}, bn_s_);
  ob_init_f32(b, "bn_b", 1, (int64_t[]){C_MID}, bn_b_);
  ob_init_f32(b, "bn_m", 1, (int64_t[]){C_MID}, bn_m_);
  ob_init_f32(b, "bn_v", 1, (int64_t[]){C_MID}, bn_v_);
  int c1 = ob_node(b, "Conv", "c1", 2, "x", "w1");
  ob_attr_ints(b, c1, "pads", 4, (int64_t[]){1, 1, 1, 1});
  ob_node(b, "BatchNormalization", "bn", 5, "c1", "bn_s", "bn_b", "bn_m", "bn_v");
  ob_node(b, "Relu", "r", 1, "bn");
  ob_node(b, "Conv", "c2", 3, "r", "w2", "b2");
  int cl = ob_node(b, "Clip", "y", 1, "c2");
  if (opset < 11) {
    ob_attr_float(b, cl, "min", 0.0f);
    ob_attr_float(b, cl, "max", clip_max_);
  }
  ob_output(b, "y");
  if (softmax) {
    int sm = ob_node(b, "Softmax", "z", 1, "y");
    ob_attr_int(b, sm, "axis", axis);
    ob_output(b, "z");
  }
  uint8_t *bytes = ob_pack(b, size);
  free(b);
  return bytes;
}

static void input_of(es_tensor *t, float *x, uint64_t seed) {
  uint64_t s = seed;
  for (int i = 0; i < C_IN * HW * HW; i++)
    x[i] = (float)(es_test_rand(&s) % 2001) / 1000.0f - 1.0f;
  memset(t, 0, sizeof *t);
  t->name = "x";
  t->dtype = ES_DTYPE_FLOAT;
  t->rank = 4;
  t->dims[0] = 1;
  t->dims[1] = C_IN;
  t->dims[2] = HW;
  t->dims[3] = HW;
  t->data = x;
  t->nbytes = sizeof(float) * C_IN * HW * HW;
}

/* Runs m on x: its first output, of count floats, into out. */
static void run_n(es_model *m, es_tensor *x, float *out, size_t count) {
  es_plan *p;
  es_tensor_info shape = {.name = "x", .dtype = ES_DTYPE_FLOAT, .rank = 4,
                          .dims = {1, C_IN, HW, HW}};
  ES_CHECK_RC(es_model_plan(m, &shape, 1, &p));
  es_arena *a;
  ES_CHECK_RC(es_arena_create(es_plan_arena_bytes(p) + 64, 64, &a));
  es_tensor y[2];
  ES_CHECK_RC(es_plan_run(p, x, 1, a, y, es_plan_output_count(p)));
  assert_int_equal(y[0].nbytes, count * sizeof(float));
  memcpy(out, y[0].data, y[0].nbytes);
  es_arena_destroy(a);
  es_plan_release(p);
}

/* y [1,4,12,12] of the small model. */
static void run(es_model *m, es_tensor *x, float *out) { run_n(m, x, out, 4 * HW * HW); }

static char path_[64];

static void test_quantize_and_run(void **state) {
  (void)state;
  es_mem_stats before;
  es_mem_stats_get(ES_MEM_ENGINE, &before);
  size_t size;
  uint8_t *bytes = small_model(9, 0, 0, &size);
  es_quantizer *q;
  es_quant_options o;
  es_quant_options_default(&o);
  ES_CHECK_RC(es_quantizer_create(bytes, size, &o, &q));
  ES_EXPECT_RC(es_quantizer_write(q, path_), ES_ESTATE); /* nothing observed yet */
  float xs[4][C_IN * HW * HW];
  es_tensor x[4];
  for (int k = 0; k < 4; k++) {
    input_of(&x[k], xs[k], 100 + (uint64_t)k);
    ES_CHECK_RC(es_quantizer_observe(q, &x[k], 1));
  }
  ES_EXPECT_RC(es_quantizer_observe(q, x, 2), ES_EINVAL);
  ES_CHECK_RC(es_quantizer_write(q, path_));
  ES_EXPECT_RC(es_quantizer_write(q, path_), ES_ESTATE);
  es_quant_stats st;
  ES_CHECK_RC(es_quantizer_stats(q, &st));
  assert_int_equal(st.nodes_quantized, 2);
  assert_int_equal(st.bn_folded, 1);
  assert_int_equal(st.activations_folded, 2); /* the Relu, and Clip(0, 6) */
  assert_int_equal(st.opset_from, 9);
  assert_int_equal(st.opset_to, 13);
  assert_int_equal(st.samples, 4);
  assert_true(st.weight_bytes_int8 < st.weight_bytes_fp32 / 2);
  es_quantizer_destroy(q);

  es_model *fp, *i8;
  ES_CHECK_RC(es_model_load_buffer(bytes, size, NULL, &fp));
  ES_CHECK_RC(es_model_load(path_, NULL, &i8));
  es_model_stats ms;
  ES_CHECK_RC(es_model_stats_get(i8, &ms));
  assert_int_equal(ms.opset, 13);
  /* both convolutions lowered to int8 kernels at load */
  assert_int_equal(ms.int8_nodes, 2);
  assert_int_equal(ms.float_nodes, 0);
  /* precision: int8 takes it, fp32 refuses it by what it is */
  es_model_options o8 = {.precision = ES_PRECISION_INT8}, o32 = {.precision = ES_PRECISION_FP32};
  es_model *other;
  ES_CHECK_RC(es_model_load(path_, &o8, &other));
  es_model_release(other);
  ES_EXPECT_RC(es_model_load(path_, &o32, &other), ES_EINVAL);
  assert_non_null(strstr(es_last_error_detail(), "quantized (2 convolutions"));
  /* against the file's Q/DQ operators run as written (no lowering): one
   * 8-bit step of y at most (y's range is within [0, 6]), where a float
   * sum and the exact integer one round to different sides */
  es_engine_fusion_set(0);
  es_model *ref;
  ES_CHECK_RC(es_model_load(path_, NULL, &ref));
  es_engine_fusion_set(1);
  ES_CHECK_RC(es_model_stats_get(ref, &ms));
  assert_int_equal(ms.int8_nodes, 0);
  for (int k = 0; k < 4; k++) {
    float a[4 * HW * HW], b[4 * HW * HW];
    run(ref, &x[k], a);
    run(i8, &x[k], b);
    int diff = 0;
    for (int i = 0; i < 4 * HW * HW; i++) {
      assert_true(fabsf(a[i] - b[i]) <= 6.0f / 255 + 1e-6f);
      diff += a[i] != b[i];
    }
    printf("# sample %d: %d of %d values one step apart from the unlowered graph\n", k, diff,
           4 * HW * HW);
  }
  es_model_release(ref);
  /* the same outputs to within the quantization: the signal-to-noise
   * ratio of a 2-layer 8-bit model is far above 30 dB, and Clip(0, 6)
   * holds as the quantizer's saturation */
  for (int k = 0; k < 4; k++) {
    float a[4 * HW * HW], b[4 * HW * HW];
    run(fp, &x[k], a);
    run(i8, &x[k], b);
    double sig = 0, err = 0, lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < 4 * HW * HW; i++) {
      sig += (double)a[i] * a[i];
      err += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
      lo = fmin(lo, b[i]);
      hi = fmax(hi, b[i]);
    }
    double db = 10 * log10(sig / err);
    printf("# sample %d: %.1f dB, int8 output in [%g, %g]\n", k, db, lo, hi);
    assert_true(db > 30);
    assert_true(lo >= 0 && hi <= clip_max_);
  }
  es_model_release(fp);
  es_model_release(i8);
  free(bytes);
  unlink(path_);
  es_mem_stats after;
  es_mem_stats_get(ES_MEM_ENGINE, &after);
  assert_int_equal(after.current, before.current);
}

/* Before opset 13 a Softmax flattens its input from axis on; raising the
 * opset would change a Softmax that is not over the last axis. */
static void test_softmax_refused(void **state) {
  (void)state;
  unlink(path_);
  size_t size;
  uint8_t *bytes = small_model(9, 1, 1, &size);
  es_quantizer *q;
  ES_CHECK_RC(es_quantizer_create(bytes, size, NULL, &q));
  float xs[C_IN * HW * HW];
  es_tensor x;
  input_of(&x, xs, 7);
  ES_CHECK_RC(es_quantizer_observe(q, &x, 1));
  ES_EXPECT_RC(es_quantizer_write(q, path_), ES_ENOTSUP);
  assert_non_null(strstr(es_last_error_detail(), "Softmax"));
  assert_int_equal(access(path_, F_OK), -1); /* nothing written */
  es_quantizer_destroy(q);
  free(bytes);
  /* over the last axis it means the same at 13 */
  bytes = small_model(9, 1, 3, &size);
  ES_CHECK_RC(es_quantizer_create(bytes, size, NULL, &q));
  ES_CHECK_RC(es_quantizer_observe(q, &x, 1));
  ES_CHECK_RC(es_quantizer_write(q, path_));
  es_quantizer_destroy(q);
  free(bytes);
  unlink(path_);
}

static void test_bad_input(void **state) {
  (void)state;
  size_t size;
  uint8_t *bytes = small_model(13, 0, 0, &size);
  es_quantizer *q = NULL;
  ES_EXPECT_RC(es_quantizer_create(bytes, size / 2, NULL, &q), ES_EMODEL);
  assert_null(q);
  es_quant_options o;
  es_quant_options_default(&o);
  o.method = ES_QUANT_PERCENTILE;
  o.percentile = 40;
  ES_EXPECT_RC(es_quantizer_create(bytes, size, &o, &q), ES_EINVAL);
  o.percentile = 99.9;
  o.target_db = -1;
  ES_EXPECT_RC(es_quantizer_create(bytes, size, &o, &q), ES_EINVAL);
  ES_EXPECT_RC(es_quantizer_create(NULL, size, NULL, &q), ES_EINVAL);
  /* opset 13 already: written as it is, Clip's bounds as inputs */
  ES_CHECK_RC(es_quantizer_create(bytes, size, NULL, &q));
  float xs[C_IN * HW * HW];
  es_tensor x;
  input_of(&x, xs, 9);
  x.dims[2] = HW + 1; /* a shape the model refuses */
  x.nbytes = sizeof(float) * C_IN * (HW + 1) * HW;
  assert_true(es_quantizer_observe(q, &x, 1) < 0);
  es_quantizer_destroy(q);
  free(bytes);
}

/* The accuracy search keeps every node in int8 when the target is met. */
static void test_target_met(void **state) {
  (void)state;
  size_t size;
  uint8_t *bytes = small_model(13, 0, 0, &size);
  es_quant_options o;
  es_quant_options_default(&o);
  o.target_db = 20;
  es_quantizer *q;
  ES_CHECK_RC(es_quantizer_create(bytes, size, &o, &q));
  float xs[C_IN * HW * HW];
  es_tensor x;
  input_of(&x, xs, 11);
  ES_CHECK_RC(es_quantizer_observe(q, &x, 1));
  ES_CHECK_RC(es_quantizer_write(q, path_));
  es_quant_stats st;
  ES_CHECK_RC(es_quantizer_stats(q, &st));
  assert_int_equal(st.auto_excluded, 0);
  assert_int_equal(st.nodes_quantized, 2);
  assert_true(st.sqnr_db >= 20);
  es_quantizer_destroy(q);
  /* a target no 8-bit model reaches: every node stays float */
  o.target_db = 150;
  ES_CHECK_RC(es_quantizer_create(bytes, size, &o, &q));
  ES_CHECK_RC(es_quantizer_observe(q, &x, 1));
  ES_CHECK_RC(es_quantizer_write(q, path_));
  ES_CHECK_RC(es_quantizer_stats(q, &st));
  assert_int_equal(st.nodes_quantized, 0);
  assert_int_equal(st.auto_excluded, 2);
  es_quantizer_destroy(q);
  free(bytes);
  unlink(path_);
}

/* options.judge: the search's own acceptance test. It is handed FP32's
 * outputs and the candidate's, runs the search with no target, and what it
 * refuses stays float; an error it returns stops the write. */
typedef struct judge_log {
  int calls, verdict, bad_args;
  double worst; /* the largest |got - fp32| seen */
} judge_log;

static int judge_fn(void *user, const es_tensor *fp32, const es_tensor *got, int n) {
  judge_log *j = user;
  j->calls++;
  if (n != 1 || fp32[0].nbytes != got[0].nbytes || fp32[0].dtype != ES_DTYPE_FLOAT)
    j->bad_args++;
  const float *a = fp32[0].data, *b = got[0].data;
  for (size_t i = 0; n == 1 && i < fp32[0].nbytes / 4; i++)
    j->worst = fmax(j->worst, fabs((double)a[i] - b[i]));
  return j->verdict;
}

static void test_judge(void **state) {
  (void)state;
  size_t size;
  uint8_t *bytes = small_model(13, 0, 0, &size);
  float xs[C_IN * HW * HW];
  es_tensor x;
  input_of(&x, xs, 11);
  es_quant_options o;
  es_quant_options_default(&o);
  judge_log j = {0};
  o.judge = judge_fn;
  o.judge_user = &j;
  es_quant_stats st;
  es_quantizer *q;
  static const struct {
    int verdict, rc, quantized, float_kept, weight_only;
  } cases[] = {
      {1, 0, 2, 0, 0},            /* all accepted: every node int8, one evaluation */
      {0, 0, 0, 2, 0},            /* all refused: every node float, weights too */
      {ES_EIO, ES_EIO, 0, 0, 0},  /* the judge's error ends the write */
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    memset(&j, 0, sizeof j);
    j.verdict = cases[c].verdict;
    ES_CHECK_RC(es_quantizer_create(bytes, size, &o, &q));
    ES_CHECK_RC(es_quantizer_observe(q, &x, 1));
    int rc = es_quantizer_write(q, path_);
    printf("# judge answering %d: write %d, %d calls, worst difference %.3g\n", cases[c].verdict,
           rc, j.calls, j.worst);
    assert_int_equal(rc, cases[c].rc);
    assert_int_equal(j.bad_args, 0);
    assert_true(j.calls >= 1);
    if (rc == 0) {
      ES_CHECK_RC(es_quantizer_stats(q, &st));
      assert_int_equal(st.nodes_quantized, cases[c].quantized);
      assert_int_equal(st.auto_excluded, cases[c].float_kept);
      assert_int_equal(st.weight_only, cases[c].weight_only);
      assert_true(j.worst > 0); /* it saw int8 outputs, not FP32's twice */
      if (cases[c].verdict == 1)
        assert_int_equal(j.calls, 1);
    }
    es_quantizer_destroy(q);
  }
  unlink(path_);
  free(bytes);
}

/* x -> Conv -> Sigmoid -> Conv -> y, quantized: the Sigmoid sits between
 * two quantized tensors (DQ -> Sigmoid -> Q) and runs as a 256-entry
 * table (QLookup), giving what the unlowered graph gives. */
static void count_ops(void *user, const char *op, int n) {
  if (!strcmp(op, "QLookup"))
    *(int *)user += n;
}

static void test_lookup(void **state) {
  (void)state;
  ob *b = ob_new(13);
  ob_input(b, "x", 4, (int64_t[]){1, C_IN, HW, HW});
  ob_init_f32(b, "w1", 4, (int64_t[]){C_MID, C_IN, 3, 3}, w1_);
  ob_init_f32(b, "w2", 4, (int64_t[]){4, C_MID, 1, 1}, w2_);
  int c1 = ob_node(b, "Conv", "c1", 2, "x", "w1");
  ob_attr_ints(b, c1, "pads", 4, (int64_t[]){1, 1, 1, 1});
  ob_node(b, "Sigmoid", "s", 1, "c1");
  ob_node(b, "Conv", "c2", 2, "s", "w2");
  ob_node(b, "Relu", "y", 1, "c2");
  ob_output(b, "y");
  size_t size;
  uint8_t *bytes = ob_pack(b, &size);
  free(b);
  es_quantizer *q;
  ES_CHECK_RC(es_quantizer_create(bytes, size, NULL, &q));
  float xs[2][C_IN * HW * HW];
  es_tensor x[2];
  for (int k = 0; k < 2; k++) {
    input_of(&x[k], xs[k], 300 + (uint64_t)k);
    ES_CHECK_RC(es_quantizer_observe(q, &x[k], 1));
  }
  ES_CHECK_RC(es_quantizer_write(q, path_));
  es_quantizer_destroy(q);
  es_model *m, *ref;
  ES_CHECK_RC(es_model_load(path_, NULL, &m));
  es_engine_fusion_set(0);
  ES_CHECK_RC(es_model_load(path_, NULL, &ref));
  es_engine_fusion_set(1);
  int lookups = 0;
  ES_CHECK_RC(es_model_op_counts(m, count_ops, &lookups));
  assert_int_equal(lookups, 1);
  for (int k = 0; k < 2; k++) {
    float a[4 * HW * HW], c[4 * HW * HW], hi = 0;
    run(ref, &x[k], a);
    run(m, &x[k], c);
    for (int i = 0; i < 4 * HW * HW; i++)
      hi = fmaxf(hi, a[i]);
    for (int i = 0; i < 4 * HW * HW; i++)
      assert_true(fabsf(a[i] - c[i]) <= hi / 255 + 1e-6f);
  }
  es_model_release(m);
  es_model_release(ref);
  free(bytes);
  unlink(path_);
}

/* DQ(aq) + DQ(bq) -> Q, what ONNX Runtime's quantizer writes around a
 * residual Add, lowered to QLinearAdd: within one 8-bit step of the
 * unlowered graph (the two round the float sum differently at most by
 * one). */
static void count_qadd(void *user, const char *op, int n) {
  if (!strcmp(op, "QLinearAdd"))
    *(int *)user += n;
}

static void test_qdq_add(void **state) {
  (void)state;
  static const float s1 = 0.01f, s2 = 0.007f, s3 = 0.013f;
  static const uint8_t z1 = 128, z2 = 0, z3 = 100;
  ob *b = ob_new(13);
  ob_input(b, "x", 4, (int64_t[]){1, C_IN, HW, HW});
  ob_init_f32(b, "s1", 0, NULL, &s1);
  ob_init_f32(b, "s2", 0, NULL, &s2);
  ob_init_f32(b, "s3", 0, NULL, &s3);
  ob_init_8bit(b, "z1", ONNX__TENSOR_PROTO__DATA_TYPE__UINT8, 0, NULL, &z1);
  ob_init_8bit(b, "z2", ONNX__TENSOR_PROTO__DATA_TYPE__UINT8, 0, NULL, &z2);
  ob_init_8bit(b, "z3", ONNX__TENSOR_PROTO__DATA_TYPE__UINT8, 0, NULL, &z3);
  ob_node(b, "QuantizeLinear", "xq", 3, "x", "s1", "z1");
  ob_node(b, "DequantizeLinear", "a", 3, "xq", "s1", "z1");
  ob_node(b, "Relu", "r", 1, "x");
  ob_node(b, "QuantizeLinear", "rq", 3, "r", "s2", "z2");
  ob_node(b, "DequantizeLinear", "bb", 3, "rq", "s2", "z2");
  ob_node(b, "Add", "sum", 2, "a", "bb");
  ob_node(b, "QuantizeLinear", "yq", 3, "sum", "s3", "z3");
  ob_node(b, "DequantizeLinear", "y", 3, "yq", "s3", "z3");
  ob_output(b, "y");
  size_t size;
  uint8_t *bytes = ob_pack(b, &size);
  free(b);
  es_model *m, *ref;
  ES_CHECK_RC(es_model_load_buffer(bytes, size, NULL, &m));
  es_engine_fusion_set(0);
  ES_CHECK_RC(es_model_load_buffer(bytes, size, NULL, &ref));
  es_engine_fusion_set(1);
  int adds = 0;
  ES_CHECK_RC(es_model_op_counts(m, count_qadd, &adds));
  assert_int_equal(adds, 1);
  enum { N = C_IN * HW * HW };
  float xs[N], y0[N], y1[N];
  es_tensor x;
  input_of(&x, xs, 77);
  for (int i = 0; i < N; i++)
    xs[i] *= 1.2f; /* past both ranges: saturation too */
  run_n(ref, &x, y0, N);
  run_n(m, &x, y1, N);
  int off = 0;
  for (int i = 0; i < N; i++) {
    assert_true(fabsf(y0[i] - y1[i]) <= s3 * 1.001f);
    off += y0[i] != y1[i];
  }
  printf("# QLinearAdd: %d of %d values one step from the unlowered graph\n", off, N);
  es_model_release(m);
  es_model_release(ref);
  free(bytes);
}

/* A feature pyramid with a detection head, float32, as det's neck and
 * head are built: convolutions, a squeeze-excitation (GlobalAveragePool,
 * Conv, Sigmoid, Mul), a residual Add, a nearest 2x upsampling added to
 * the finer map (max-pooled 3x3) and joined with it (Concat), then two 2x2 stride-2
 * ConvTransposes, the first followed by a bias Add, BatchNormalization and
 * Relu, the last by a bias Add and the Sigmoid that ends the model.
 * Quantized, every node of it runs in 8 bits: the sums, joins, pooling and
 * scaling as the QLinear operators, the upsampling and pooling on bytes, the
 * ConvTransposes as QLinearConvTranspose with the first's bias Add and
 * BatchNormalization folded in (the last's Add, which ends the model,
 * stays). The lowered model stays close to the unlowered graph and to
 * FP32, and the reference kernels give what oneDNN gives. */
typedef struct op_tally {
  int qadd, qmul, qgap, qcat, qconvt, q, dq, resize, maxpool, fp;
} op_tally;

static void tally_ops(void *user, const char *op, int n) {
  op_tally *t = user;
  if (!strcmp(op, "QLinearAdd"))
    t->qadd += n;
  else if (!strcmp(op, "QLinearMul"))
    t->qmul += n;
  else if (!strcmp(op, "QLinearGlobalAveragePool"))
    t->qgap += n;
  else if (!strcmp(op, "QLinearConcat"))
    t->qcat += n;
  else if (!strcmp(op, "QLinearConvTranspose"))
    t->qconvt += n;
  else if (!strcmp(op, "QuantizeLinear"))
    t->q += n;
  else if (!strcmp(op, "DequantizeLinear"))
    t->dq += n;
  else if (!strcmp(op, "Resize"))
    t->resize += n;
  else if (!strcmp(op, "MaxPool"))
    t->maxpool += n;
  else if (strncmp(op, "QLinear", 7) && strcmp(op, "QLookup"))
    t->fp += n;
}

enum { PY_HW = 16, PY_OUT = 4 * PY_HW * PY_HW };

static uint8_t *pyramid_model(size_t *size) {
  static float w1[8 * C_IN * 9], w2[8 * 8 * 9], wse[8 * 8], bse[8], wh[8 * 16], wt1[8 * 4 * 4],
      bt1[4], bns[4], bnb[4], bnm[4], bnv[4], wt2[4 * 1 * 4], bt2[1];
  static const float up[4] = {1, 1, 2, 2};
  uint64_t s = 9;
  float *ws[] = {w1, w2, wse, bse, wh, wt1, bt1, bnb, bnm, wt2, bt2};
  size_t ns[] = {sizeof w1, sizeof w2, sizeof wse, sizeof bse, sizeof wh, sizeof wt1,
                 sizeof bt1, sizeof bnb, sizeof bnm, sizeof wt2, sizeof bt2};
  /* each layer's gain about 1.5 (weights in +-0.125 times k) so the
   * output spreads over the Sigmoid's range */
  float gain[] = {4, 2.5f, 7, 1, 5, 7, 1, 1, 1, 10, 4};
  for (size_t i = 0; i < sizeof ws / sizeof *ws; i++) {
    es_test_fill_small(ws[i], ns[i] / 4, &s);
    for (size_t j = 0; j < ns[i] / 4; j++)
      ws[i][j] *= gain[i];
  }
  for (int i = 0; i < 4; i++) {
    bns[i] = 0.8f + 0.1f * (float)i;
    bnv[i] = 0.6f + 0.1f * (float)i;
  }
  ob *b = ob_new(13);
  ob_input(b, "x", 4, (int64_t[]){1, C_IN, PY_HW, PY_HW});
  ob_init_f32(b, "w1", 4, (int64_t[]){8, C_IN, 3, 3}, w1);
  ob_init_f32(b, "w2", 4, (int64_t[]){8, 8, 3, 3}, w2);
  ob_init_f32(b, "wse", 4, (int64_t[]){8, 8, 1, 1}, wse);
  ob_init_f32(b, "bse", 1, (int64_t[]){8}, bse);
  ob_init_f32(b, "wh", 4, (int64_t[]){8, 16, 1, 1}, wh);
  ob_init_f32(b, "wt1", 4, (int64_t[]){8, 4, 2, 2}, wt1);
  ob_init_f32(b, "bt1", 4, (int64_t[]){1, 4, 1, 1}, bt1);
  ob_init_f32(b, "bns", 1, (int64_t[]){4}, bns);
  ob_init_f32(b, "bnb", 1, (int64_t[]){4}, bnb);
  ob_init_f32(b, "bnm", 1, (int64_t[]){4}, bnm);
  ob_init_f32(b, "bnv", 1, (int64_t[]){4}, bnv);
  ob_init_f32(b, "wt2", 4, (int64_t[]){4, 1, 2, 2}, wt2);
  ob_init_f32(b, "bt2", 4, (int64_t[]){1, 1, 1, 1}, bt2);
  ob_init_f32(b, "up", 1, (int64_t[]){4}, up);
  int c1 = ob_node(b, "Conv", "c1", 2, "x", "w1");
  ob_attr_ints(b, c1, "pads", 4, (int64_t[]){1, 1, 1, 1});
  ob_node(b, "Relu", "r1", 1, "c1");
  int c2 = ob_node(b, "Conv", "c2", 2, "r1", "w2");
  ob_attr_ints(b, c2, "pads", 4, (int64_t[]){1, 1, 1, 1});
  ob_attr_ints(b, c2, "strides", 2, (int64_t[]){2, 2});
  ob_node(b, "Relu", "r2", 1, "c2");
  ob_node(b, "GlobalAveragePool", "g", 1, "r2");
  ob_node(b, "Conv", "gc", 3, "g", "wse", "bse");
  ob_node(b, "Sigmoid", "gs", 1, "gc");
  ob_node(b, "Mul", "se", 2, "r2", "gs");
  ob_node(b, "Add", "a2", 2, "se", "r2");
  int rs = ob_node(b, "Resize", "u", 3, "a2", "", "up");
  ob_attr_string(b, rs, "mode", "nearest");
  int mp = ob_node(b, "MaxPool", "mp", 1, "r1");
  ob_attr_ints(b, mp, "kernel_shape", 2, (int64_t[]){3, 3});
  ob_attr_ints(b, mp, "pads", 4, (int64_t[]){1, 1, 1, 1});
  ob_node(b, "Add", "a1", 2, "mp", "u");
  int cat = ob_node(b, "Concat", "cat", 2, "a1", "u");
  ob_attr_int(b, cat, "axis", 1);
  ob_node(b, "Conv", "hc", 2, "cat", "wh");
  ob_node(b, "Relu", "h", 1, "hc");
  int t1 = ob_node(b, "ConvTranspose", "t1", 2, "h", "wt1");
  ob_attr_ints(b, t1, "strides", 2, (int64_t[]){2, 2});
  ob_node(b, "Add", "t1b", 2, "t1", "bt1");
  ob_node(b, "BatchNormalization", "t1n", 5, "t1b", "bns", "bnb", "bnm", "bnv");
  ob_node(b, "Relu", "t1r", 1, "t1n");
  int t2 = ob_node(b, "ConvTranspose", "t2", 2, "t1r", "wt2");
  ob_attr_ints(b, t2, "strides", 2, (int64_t[]){2, 2});
  ob_node(b, "Add", "t2b", 2, "t2", "bt2");
  ob_node(b, "Sigmoid", "y", 1, "t2b");
  ob_output(b, "y");
  uint8_t *bytes = ob_pack(b, size);
  free(b);
  return bytes;
}

static void pyramid_input(es_tensor *t, float *x, uint64_t seed) {
  uint64_t s = seed;
  for (int i = 0; i < C_IN * PY_HW * PY_HW; i++)
    x[i] = (float)(es_test_rand(&s) % 2001) / 1000.0f - 1.0f + 0.5f * sinf((float)i * 0.05f);
  *t = ob_tensor_f32("x", 4, (int64_t[]){1, C_IN, PY_HW, PY_HW}, x);
}

/* The quantizer's file (path_) as served (*m: lowered to the int8
 * kernels) and with the lowering off (*unlowered: its QuantizeLinear and
 * DequantizeLinear as written), and the FP32 source (*fp). The reference
 * kernels are chosen when planning (es_engine_reference_kernels_set is
 * read then), so a test plans and runs *m again with them on. */
static void load_three(const uint8_t *bytes, size_t size, es_model **m, es_model **unlowered,
                       es_model **fp) {
  ES_CHECK_RC(es_model_load(path_, NULL, m));
  ES_CHECK_RC(es_model_load_buffer(bytes, size, NULL, fp));
  es_engine_fusion_set(0);
  ES_CHECK_RC(es_model_load(path_, NULL, unlowered));
  es_engine_fusion_set(1);
}

static float *pyramid_run(es_model *m, const es_tensor *x) {
  float *out[1];
  size_t n[1];
  ob_run(m, 1, x, 1, out, n);
  assert_int_equal(n[0], 64 * 64);
  return out[0];
}

static void test_pyramid(void **state) {
  (void)state;
  size_t size;
  uint8_t *bytes = pyramid_model(&size);
  es_quantizer *q;
  ES_CHECK_RC(es_quantizer_create(bytes, size, NULL, &q));
  enum { NX = C_IN * PY_HW * PY_HW };
  static float xs[4][NX];
  es_tensor x[4];
  for (int k = 0; k < 4; k++) {
    pyramid_input(&x[k], xs[k], 500 + (uint64_t)k);
    if (k < 3)
      ES_CHECK_RC(es_quantizer_observe(q, &x[k], 1));
  }
  ES_CHECK_RC(es_quantizer_write(q, path_));
  es_quant_stats st;
  ES_CHECK_RC(es_quantizer_stats(q, &st));
  es_quantizer_destroy(q);
  assert_int_equal(st.bn_folded, 2); /* t1's bias Add and BatchNormalization; not t2's Add */
  es_model *m, *ref, *fp;
  load_three(bytes, size, &m, &ref, &fp);
  op_tally t = {0};
  ES_CHECK_RC(es_model_op_counts(m, tally_ops, &t));
  printf("# lowered: QLinearAdd %d, QLinearMul %d, QLinearGlobalAveragePool %d, QLinearConcat "
         "%d, QLinearConvTranspose %d, QuantizeLinear %d, DequantizeLinear %d, Resize %d, "
         "float %d\n", t.qadd, t.qmul, t.qgap, t.qcat, t.qconvt, t.q, t.dq, t.resize, t.fp);
  assert_int_equal(t.qadd, 2);
  assert_int_equal(t.qmul, 1);
  assert_int_equal(t.qgap, 1);
  assert_int_equal(t.qcat, 1);
  assert_int_equal(t.qconvt, 2);
  assert_int_equal(t.resize, 1);
  assert_int_equal(t.maxpool, 1); /* on bytes: no pair around it (below) */
  assert_int_equal(t.q, 1);  /* the input's */
  assert_int_equal(t.dq, 1); /* before t2's bias Add, which ends the model in float */
  op_tally tr = {0};
  ES_CHECK_RC(es_model_op_counts(ref, tally_ops, &tr));
  assert_int_equal(tr.qadd + tr.qmul + tr.qgap + tr.qcat + tr.qconvt, 0); /* unlowered */
  for (int k = 0; k < 4; k++) { /* k = 3 was not calibrated on */
    float *yl = pyramid_run(m, &x[k]), *yr = pyramid_run(ref, &x[k]);
    float *yf = pyramid_run(fp, &x[k]);
    es_engine_reference_kernels_set(1);
    float *yk = pyramid_run(m, &x[k]);
    es_engine_reference_kernels_set(0);
    double el = 0, ef = 0, ml = 0, lo = 1, hi = 0;
    for (int i = 0; i < 64 * 64; i++) {
      lo = yf[i] < lo ? yf[i] : lo;
      hi = yf[i] > hi ? yf[i] : hi;
      double d = fabs((double)yl[i] - yr[i]);
      el += d;
      ml = d > ml ? d : ml;
      ef += fabs((double)yl[i] - yf[i]);
      if (yk[i] != yl[i])
        fail_msg("sample %d [%d]: the reference kernels give %g, oneDNN %g", k, i, yk[i], yl[i]);
    }
    el /= 64 * 64;
    ef /= 64 * 64;
    printf("# sample %d (FP32 in [%.3f, %.3f]): lowered vs unlowered mean %.5f max %.5f; vs "
           "FP32 mean %.5f\n", k, lo, hi, el, ml, ef);
    assert_true(hi - lo > 0.5); /* a map, not a constant */
    assert_true(el < 0.004 && ml < 0.05); /* one-step differences, a few carried on */
    assert_true(ef < 0.02);
    free(yl);
    free(yr);
    free(yf);
    free(yk);
  }
  es_model_release(m);
  es_model_release(ref);
  es_model_release(fp);
  free(bytes);
  unlink(path_);
}

/* A classifier's head: x -> Conv 3x3 -> Relu -> GlobalAveragePool ->
 * Flatten -> Gemm (transB 1, bias) -> Relu -> Gemm (transB 0, bias) -> y.
 * The quantizer writes both Gemms in QDQ, the last with a float output
 * (it ends the model); at load the first becomes QLinearMatMul (B [N, K],
 * its bias and Relu inside) and the last QLinearMatMul with a float
 * output, so no convolution or product is left in float and every weight
 * stays int8. The lowered model stays close to the unlowered graph and to
 * FP32, and the reference kernels give what oneDNN gives. */
enum { GM_H = 16, GM_C = 4 };

static uint8_t *gemm_model(size_t *size) {
  static float w1[8 * C_IN * 9], g1[16 * 8], gb1[16], g2[16 * GM_C], gb2[GM_C];
  uint64_t s = 5;
  es_test_fill_small(w1, sizeof w1 / 4, &s);
  es_test_fill_small(g1, sizeof g1 / 4, &s);
  es_test_fill_small(gb1, 16, &s);
  es_test_fill_small(g2, sizeof g2 / 4, &s);
  es_test_fill_small(gb2, GM_C, &s);
  for (size_t i = 0; i < sizeof g1 / 4; i++)
    g1[i] *= 4; /* a gain near 1 per layer */
  for (size_t i = 0; i < sizeof g2 / 4; i++)
    g2[i] *= 4;
  ob *b = ob_new(13);
  ob_input(b, "x", 4, (int64_t[]){1, C_IN, HW, HW});
  ob_init_f32(b, "w1", 4, (int64_t[]){8, C_IN, 3, 3}, w1);
  ob_init_f32(b, "g1", 2, (int64_t[]){16, 8}, g1);
  ob_init_f32(b, "gb1", 1, (int64_t[]){16}, gb1);
  ob_init_f32(b, "g2", 2, (int64_t[]){16, GM_C}, g2);
  ob_init_f32(b, "gb2", 1, (int64_t[]){GM_C}, gb2);
  int c1 = ob_node(b, "Conv", "c1", 2, "x", "w1");
  ob_attr_ints(b, c1, "pads", 4, (int64_t[]){1, 1, 1, 1});
  ob_node(b, "Relu", "r1", 1, "c1");
  ob_node(b, "GlobalAveragePool", "gap", 1, "r1");
  ob_node(b, "Flatten", "flat", 1, "gap");
  int n1 = ob_node(b, "Gemm", "fc1", 3, "flat", "g1", "gb1");
  ob_attr_int(b, n1, "transB", 1);
  ob_node(b, "Relu", "r2", 1, "fc1");
  ob_node(b, "Gemm", "y", 3, "r2", "g2", "gb2");
  ob_output(b, "y");
  uint8_t *bytes = ob_pack(b, size);
  free(b);
  return bytes;
}

/* Five inputs x[k] (seeds seed + k) and the model quantized on the first
 * four into path_ (the fifth is held out); its stats in *st. */
static void quantize_four(const uint8_t *bytes, size_t size, uint64_t seed,
                          float xs[5][C_IN * HW * HW], es_tensor x[5], es_quant_stats *st) {
  es_quantizer *q;
  es_quant_options o;
  es_quant_options_default(&o);
  ES_CHECK_RC(es_quantizer_create(bytes, size, &o, &q));
  for (int k = 0; k < 5; k++) {
    input_of(&x[k], xs[k], seed + (uint64_t)k);
    if (k < 4)
      ES_CHECK_RC(es_quantizer_observe(q, &x[k], 1));
  }
  ES_CHECK_RC(es_quantizer_write(q, path_));
  ES_CHECK_RC(es_quantizer_stats(q, st));
  es_quantizer_destroy(q);
}

static void test_gemm(void **state) {
  (void)state;
  size_t size;
  uint8_t *bytes = gemm_model(&size);
  float xs[5][C_IN * HW * HW];
  es_tensor x[5];
  es_quant_stats st;
  quantize_four(bytes, size, 300, xs, x, &st);
  assert_int_equal(st.nodes_quantized, 4); /* the Conv, the pooling, both Gemms */
  es_model *m, *ref, *fp;
  load_three(bytes, size, &m, &ref, &fp);
  es_model_stats ms, mf;
  ES_CHECK_RC(es_model_stats_get(m, &ms));
  ES_CHECK_RC(es_model_stats_get(fp, &mf));
  printf("# int8 nodes %zu, float %zu; weights %zu B (FP32 %zu B)\n", (size_t)ms.int8_nodes,
         (size_t)ms.float_nodes, ms.weight_bytes, mf.weight_bytes);
  assert_int_equal(ms.int8_nodes, 3);
  assert_int_equal(ms.float_nodes, 0);
  assert_true(ms.weight_bytes * 2 < mf.weight_bytes);
  for (int k = 0; k < 5; k++) { /* k = 4 was not calibrated on */
    float yl[GM_C], yr[GM_C], yf[GM_C], yk[GM_C];
    run_n(m, &x[k], yl, GM_C);
    run_n(ref, &x[k], yr, GM_C);
    run_n(fp, &x[k], yf, GM_C);
    es_engine_reference_kernels_set(1);
    run_n(m, &x[k], yk, GM_C);
    es_engine_reference_kernels_set(0);
    double sig = 0, el = 0, ef = 0;
    for (int i = 0; i < GM_C; i++) {
      sig += (double)yf[i] * yf[i];
      el += ((double)yl[i] - yr[i]) * ((double)yl[i] - yr[i]);
      ef += ((double)yl[i] - yf[i]) * ((double)yl[i] - yf[i]);
      if (fabsf(yk[i] - yl[i]) > 1e-5f * fabsf(yl[i]) + 1e-6f)
        fail_msg("sample %d [%d]: the reference kernels give %g, oneDNN %g", k, i, yk[i], yl[i]);
    }
    printf("# sample %d: y %.4f %.4f %.4f %.4f; vs unlowered %.1f dB, vs FP32 %.1f dB\n", k,
           yl[0], yl[1], yl[2], yl[3], 10 * log10(sig / (el + 1e-30)), 10 * log10(sig / ef));
    assert_true(10 * log10(sig / (el + 1e-30)) > 40);
    assert_true(10 * log10(sig / ef) > 25);
  }
  es_model_release(m);
  es_model_release(ref);
  es_model_release(fp);
  free(bytes);
  unlink(path_);
}

/* An AveragePool between convolutions: the quantizer writes it in QDQ (a
 * pooling of a convolution's map), the loader lowers it to
 * QLinearAveragePool, so x stays 8 bits from the first convolution to the
 * last; close to the unlowered graph and to FP32. */
static void count_qavg(void *user, const char *op, int n) {
  int *c = user;
  if (!strcmp(op, "QLinearAveragePool"))
    c[0] += n;
  else if (!strcmp(op, "AveragePool") || !strcmp(op, "DequantizeLinear"))
    c[1] += n;
}

static void test_avgpool(void **state) {
  (void)state;
  static float w1[8 * C_IN * 9], w2[4 * 8];
  uint64_t s = 11;
  es_test_fill_small(w1, sizeof w1 / 4, &s);
  es_test_fill_small(w2, sizeof w2 / 4, &s);
  ob *b = ob_new(13);
  ob_input(b, "x", 4, (int64_t[]){1, C_IN, HW, HW});
  ob_init_f32(b, "w1", 4, (int64_t[]){8, C_IN, 3, 3}, w1);
  ob_init_f32(b, "w2", 4, (int64_t[]){4, 8, 1, 1}, w2);
  int c1 = ob_node(b, "Conv", "c1", 2, "x", "w1");
  ob_attr_ints(b, c1, "pads", 4, (int64_t[]){1, 1, 1, 1});
  ob_node(b, "Relu", "r1", 1, "c1");
  int ap = ob_node(b, "AveragePool", "ap", 1, "r1");
  ob_attr_ints(b, ap, "kernel_shape", 2, (int64_t[]){3, 3});
  ob_attr_ints(b, ap, "strides", 2, (int64_t[]){2, 2});
  ob_attr_ints(b, ap, "pads", 4, (int64_t[]){1, 1, 1, 1});
  ob_node(b, "Conv", "y", 2, "ap", "w2");
  ob_output(b, "y");
  size_t size;
  uint8_t *bytes = ob_pack(b, &size);
  free(b);
  float xs[5][C_IN * HW * HW];
  es_tensor x[5];
  es_quant_stats st;
  quantize_four(bytes, size, 500, xs, x, &st);
  assert_int_equal(st.nodes_quantized, 3); /* both convolutions and the pooling */
  es_model *m, *ref, *fp;
  ES_CHECK_RC(es_model_load(path_, NULL, &m));
  ES_CHECK_RC(es_model_load_buffer(bytes, size, NULL, &fp));
  es_engine_fusion_set(0);
  ES_CHECK_RC(es_model_load(path_, NULL, &ref));
  es_engine_fusion_set(1);
  int cnt[2] = {0, 0};
  ES_CHECK_RC(es_model_op_counts(m, count_qavg, cnt));
  printf("# QLinearAveragePool %d; AveragePool and DequantizeLinear left %d\n", cnt[0], cnt[1]);
  assert_int_equal(cnt[0], 1);
  assert_int_equal(cnt[1], 0);
  enum { N_OUT = 4 * 6 * 6 };
  for (int k = 0; k < 5; k++) { /* k = 4 was not calibrated on */
    float yl[N_OUT], yr[N_OUT], yf[N_OUT];
    run_n(m, &x[k], yl, N_OUT);
    run_n(ref, &x[k], yr, N_OUT);
    run_n(fp, &x[k], yf, N_OUT);
    double sig = 0, el = 0, ef = 0;
    for (int i = 0; i < N_OUT; i++) {
      sig += (double)yf[i] * yf[i];
      el += ((double)yl[i] - yr[i]) * ((double)yl[i] - yr[i]);
      ef += ((double)yl[i] - yf[i]) * ((double)yl[i] - yf[i]);
    }
    printf("# sample %d: vs unlowered %.1f dB, vs FP32 %.1f dB\n", k,
           10 * log10(sig / (el + 1e-30)), 10 * log10(sig / ef));
    assert_true(10 * log10(sig / (el + 1e-30)) > 35);
    assert_true(10 * log10(sig / ef) > 25);
  }
  es_model_release(m);
  es_model_release(ref);
  es_model_release(fp);
  free(bytes);
  unlink(path_);
}

/* Weight-only int8 and bias correction. x [1, 8, 12, 12] -> depthwise
 * Conv 3x3 (bias) -> c1 -> Relu -> Conv 1x1 (no bias) -> y (c1 an output
 * too), calibrated on an input in [2, 3] with one outlier of 500: 8-bit
 * steps of x are 2 wide, so neither Conv can run in int8 within 40 dB,
 * while int8 weights alone (per channel) can. The search writes both as
 * DQ(int8 W) -> float Conv, each bias corrected for its weights'
 * quantization (the 1x1 gets one); at load both run from int8 weights (no
 * DequantizeLinear left, the weights the model holds under 0.6x FP32's),
 * giving what the same file gives with its DequantizeLinear folded to
 * float weights, on oneDNN and on the reference kernels; compiled to .esm
 * it gives the same bytes. On the calibration input, each channel of c1
 * has a mean error of nothing (rounding) against FP32 while its error is
 * not nothing: without the correction, an input of mean 2.5 turns the
 * weights' error into an offset nearly as large as the error itself. */
enum { WO_C = 8, WO_HW = 12, WO_OUT = 4 * WO_HW * WO_HW, WO_DB = 40 };

static uint8_t *wonly_model(size_t *size) {
  static float w1[WO_C * 9], b1[WO_C], w2[4 * WO_C];
  uint64_t s = 77;
  es_test_fill_small(w1, WO_C * 9, &s);
  es_test_fill_small(b1, WO_C, &s);
  es_test_fill_small(w2, 4 * WO_C, &s);
  ob *b = ob_new(13);
  ob_input(b, "x", 4, (int64_t[]){1, WO_C, WO_HW, WO_HW});
  ob_init_f32(b, "w1", 4, (int64_t[]){WO_C, 1, 3, 3}, w1);
  ob_init_f32(b, "b1", 1, (int64_t[]){WO_C}, b1);
  ob_init_f32(b, "w2", 4, (int64_t[]){4, WO_C, 1, 1}, w2);
  int c1 = ob_node(b, "Conv", "c1", 3, "x", "w1", "b1");
  ob_attr_ints(b, c1, "pads", 4, (int64_t[]){1, 1, 1, 1});
  ob_attr_int(b, c1, "group", WO_C);
  ob_node(b, "Relu", "r", 1, "c1");
  ob_node(b, "Conv", "y", 2, "r", "w2");
  ob_output(b, "y");
  ob_output(b, "c1");
  uint8_t *bytes = ob_pack(b, size);
  free(b);
  return bytes;
}

/* y, then c1, in one allocation. */
static float *wonly_run(es_model *m, float *x) {
  es_tensor t = {.name = "x", .dtype = ES_DTYPE_FLOAT, .rank = 4,
                 .dims = {1, WO_C, WO_HW, WO_HW}, .data = x,
                 .nbytes = sizeof(float) * WO_C * WO_HW * WO_HW};
  es_tensor_info shape = {.name = "x", .dtype = ES_DTYPE_FLOAT, .rank = 4,
                          .dims = {1, WO_C, WO_HW, WO_HW}};
  es_plan *p;
  ES_CHECK_RC(es_model_plan(m, &shape, 1, &p));
  es_arena *a; /* exactly the planned bytes: the dequantized weights fit in them */
  ES_CHECK_RC(es_arena_create(es_plan_arena_bytes(p), 64, &a));
  es_tensor y[2];
  ES_CHECK_RC(es_plan_run(p, &t, 1, a, y, 2));
  assert_int_equal(y[0].nbytes, WO_OUT * sizeof(float));
  assert_int_equal(y[1].nbytes, WO_C * WO_HW * WO_HW * sizeof(float));
  float *out = malloc(y[0].nbytes + y[1].nbytes);
  memcpy(out, y[0].data, y[0].nbytes);
  memcpy(out + WO_OUT, y[1].data, y[1].nbytes);
  es_arena_destroy(a);
  es_plan_release(p);
  return out;
}

/* The calibration input: values in [2, 3], one outlier of 500. */
static es_tensor wonly_input(float *x) {
  uint64_t s = 5;
  for (int i = 0; i < WO_C * WO_HW * WO_HW; i++)
    x[i] = 2.0f + (float)(es_test_rand(&s) % 1001) / 1000.0f;
  x[0] = 500.0f;
  return (es_tensor){.name = "x", .dtype = ES_DTYPE_FLOAT, .rank = 4,
                     .dims = {1, WO_C, WO_HW, WO_HW}, .data = x,
                     .nbytes = sizeof(float) * WO_C * WO_HW * WO_HW};
}

/* Quantizes the model, calibrated on x, to path_. */
static void wonly_quantize(const uint8_t *bytes, size_t size, const es_quant_options *o,
                           const es_tensor *x, es_quant_stats *st) {
  es_quantizer *q;
  ES_CHECK_RC(es_quantizer_create(bytes, size, o, &q));
  ES_CHECK_RC(es_quantizer_observe(q, x, 1));
  ES_CHECK_RC(es_quantizer_write(q, path_));
  ES_CHECK_RC(es_quantizer_stats(q, st));
  es_quantizer_destroy(q);
}

static void test_weight_only(void **state) {
  (void)state;
  size_t size;
  uint8_t *bytes = wonly_model(&size);
  static float x[WO_C * WO_HW * WO_HW];
  es_tensor xt = wonly_input(x);
  es_quant_options o;
  es_quant_options_default(&o);
  o.target_db = WO_DB;
  es_quant_stats st;
  wonly_quantize(bytes, size, &o, &xt, &st);
  printf("# search: %d kept in float, %d of them weight-only; %.1f dB\n", st.auto_excluded,
         st.weight_only, st.sqnr_db);
  assert_int_equal(st.auto_excluded, 2);
  assert_int_equal(st.weight_only, 2);
  assert_true(st.sqnr_db >= WO_DB);

  es_model *m, *folded, *fp;
  load_three(bytes, size, &m, &folded, &fp);
  es_model_stats ms, fs;
  ES_CHECK_RC(es_model_stats_get(m, &ms));
  ES_CHECK_RC(es_model_stats_get(fp, &fs));
  op_tally t = {0};
  ES_CHECK_RC(es_model_op_counts(m, tally_ops, &t));
  printf("# weights held: %zu B (FP32 model %zu B); DequantizeLinear left: %d\n", ms.weight_bytes,
         fs.weight_bytes, t.dq);
  assert_int_equal(ms.w8_nodes, 2);
  assert_int_equal(ms.int8_nodes, 0);
  assert_int_equal(t.dq, 0);
  assert_true(ms.weight_bytes < fs.weight_bytes * 6 / 10);

  /* compiled (.esm): the int8 weights and their scales as they are */
  char esm[80];
  snprintf(esm, sizeof esm, "%s.esm", path_);
  ES_CHECK_RC(es_model_compile(m, path_, esm));
  es_model *me;
  ES_CHECK_RC(es_model_load(esm, NULL, &me));
  es_model_stats es;
  ES_CHECK_RC(es_model_stats_get(me, &es));
  assert_int_equal(es.w8_nodes, 2);
  assert_int_equal(es.weight_bytes, ms.weight_bytes);
  float *yw = wonly_run(m, x), *yd = wonly_run(folded, x);
  float *yf = wonly_run(fp, x), *ye = wonly_run(me, x);
  es_engine_reference_kernels_set(1);
  float *yr = wonly_run(m, x);
  es_engine_reference_kernels_set(0);
  assert_memory_equal(ye, yw, (WO_OUT + WO_C * WO_HW * WO_HW) * sizeof(float));
  es_model_release(me);
  unlink(esm);
  free(ye);
  enum { N = WO_OUT + WO_C * WO_HW * WO_HW, P = WO_HW * WO_HW };
  for (int at = 0; at < N; at++) {
    double tol = 1e-5 * (1 + fabs(yd[at]));
    if (fabs((double)yw[at] - yd[at]) > tol || fabs((double)yr[at] - yd[at]) > tol)
      fail_msg("[%d]: from int8 weights %g (reference kernels %g), folded %g", at, yw[at],
               yr[at], yd[at]);
  }
  for (int c = 0; c < WO_C; c++) {
    double mean = 0, sq = 0;
    for (int i = 0; i < P; i++) {
      double d = (double)yw[WO_OUT + c * P + i] - yf[WO_OUT + c * P + i];
      mean += d;
      sq += d * d;
    }
    mean /= P;
    double rms = sqrt(sq / P);
    printf("# c1 channel %d: error vs FP32 mean %.2e, rms %.2e\n", c, mean, rms);
    assert_true(rms > 0);
    assert_true(fabs(mean) < 0.02 * rms);
  }
  free(yw);
  free(yd);
  free(yr);
  free(yf);
  es_model_release(m);
  es_model_release(folded);
  es_model_release(fp);
  free(bytes);
  unlink(path_);
}

/* Error-feedback rounding (ES_QUANT_ROUND_GPTQ) on the weight-only model
 * above: the same two Convs go weight-only, and on the calibration input
 * each Conv's output lies closer to FP32 than with each weight rounded to
 * nearest (no bias correction, so the rounding alone differs), while the
 * file is as before (per-channel int8, loaded and run the same way). It
 * is refused where no weight-only Conv can come from (no search). */
static double sq_err(const float *a, const float *b, int n) {
  double e = 0;
  for (int i = 0; i < n; i++)
    e += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
  return e;
}

static void test_gptq_rounding(void **state) {
  (void)state;
  size_t size;
  uint8_t *bytes = wonly_model(&size);
  static float x[WO_C * WO_HW * WO_HW];
  es_tensor xt = wonly_input(x);
  es_model *fp;
  ES_CHECK_RC(es_model_load_buffer(bytes, size, NULL, &fp));
  float *yf = wonly_run(fp, x);
  enum { N1 = WO_C * WO_HW * WO_HW };
  double err[2][2]; /* [nearest, gptq][y, c1] */
  for (int r = 0; r < 2; r++) {
    es_quant_options o;
    es_quant_options_default(&o);
    o.target_db = WO_DB;
    o.bias_correction = ES_QUANT_BC_NONE;
    o.rounding = r ? ES_QUANT_ROUND_GPTQ : ES_QUANT_ROUND_NEAREST;
    es_quant_stats st;
    wonly_quantize(bytes, size, &o, &xt, &st);
    assert_int_equal(st.weight_only, 2);
    es_model *m;
    ES_CHECK_RC(es_model_load(path_, NULL, &m));
    es_model_stats ms;
    ES_CHECK_RC(es_model_stats_get(m, &ms));
    assert_int_equal(ms.w8_nodes, 2);
    float *y = wonly_run(m, x);
    err[r][0] = sq_err(y, yf, WO_OUT);
    err[r][1] = sq_err(y + WO_OUT, yf + WO_OUT, N1);
    printf("# %s: squared error vs FP32: y %.3e, c1 %.3e\n", r ? "gptq" : "nearest", err[r][0],
           err[r][1]);
    free(y);
    es_model_release(m);
  }
  assert_true(err[1][1] > 0 && err[1][1] < err[0][1]);
  assert_true(err[1][0] > 0 && err[1][0] < err[0][0]);
  /* no search, or its weights kept float: nothing to round this way */
  es_quant_options o;
  es_quant_options_default(&o);
  o.rounding = ES_QUANT_ROUND_GPTQ;
  es_quantizer *q = NULL;
  assert_int_equal(es_quantizer_create(bytes, size, &o, &q), ES_EINVAL);
  o.target_db = WO_DB;
  o.keep_float_weights = 1;
  assert_int_equal(es_quantizer_create(bytes, size, &o, &q), ES_EINVAL);
  o.keep_float_weights = 0;
  o.rounding = (es_quant_rounding)7;
  assert_int_equal(es_quantizer_create(bytes, size, &o, &q), ES_EINVAL);
  assert_null(q);
  free(yf);
  es_model_release(fp);
  free(bytes);
  unlink(path_);
}

int main(void) {
  snprintf(path_, sizeof path_, "/tmp/es-quantize-%d.onnx", (int)getpid());
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_quantize_and_run),
      cmocka_unit_test(test_softmax_refused),
      cmocka_unit_test(test_bad_input),
      cmocka_unit_test(test_target_met),
      cmocka_unit_test(test_judge),
      cmocka_unit_test(test_lookup),
      cmocka_unit_test(test_qdq_add),
      cmocka_unit_test(test_pyramid),
      cmocka_unit_test(test_gemm),
      cmocka_unit_test(test_avgpool),
      cmocka_unit_test(test_weight_only),
      cmocka_unit_test(test_gptq_rounding),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
