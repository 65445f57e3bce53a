/* Precision (es_model_options): bf16 convolutions and matrix products
 * close to float32 and not identical to it (so bf16 ran), only the nodes
 * that gain marked, a compiled .esm that keeps bf16 weights and refuses
 * the other precision, int8 and fp32 refused where the model says
 * otherwise, and every byte back. On a CPU without avx512_bf16 the bf16
 * load is refused with ES_ENOTSUP naming the feature, and the rest runs.
 * The five target models in bf16: tests/e2e/test_precision_cli.sh. */
#include "es_test.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "edgeserve/engine.h"
#include "edgeserve/memory.h"
#include "support/onnx_builder.h"

#define C_IN 16
#define C_MID 32
#define HW 12
#define N_OUT 24

static float w1_[C_MID * C_IN * 9], b1_[C_MID], wd_[C_MID * 9], wm_[(HW / 2) * N_OUT];

/* x [1,16,12,12] -> Conv 3x3 16->32 (gains: 576 FLOPs per source element)
 * -> Relu -> depthwise Conv 3x3 stride 2 (4.5 FLOPs per element: stays
 * float32) -> MatMul by static [6, 24] (48 per element: gains) -> y
 * [1,32,6,24]. */
static uint8_t *model(size_t *size) {
  uint64_t s = 7;
  es_test_fill_small(w1_, sizeof w1_ / 4, &s);
  es_test_fill_small(b1_, sizeof b1_ / 4, &s);
  es_test_fill_small(wd_, sizeof wd_ / 4, &s);
  es_test_fill_small(wm_, sizeof wm_ / 4, &s);
  ob *b = ob_new(13);
  ob_input(b, "x", 4, (int64_t[]){1, C_IN, HW, HW});
  ob_init_f32(b, "w1", 4, (int64_t[]){C_MID, C_IN, 3, 3}, w1_);
  ob_init_f32(b, "b1", 1, (int64_t[]){C_MID}, b1_);
  ob_init_f32(b, "wd", 4, (int64_t[]){C_MID, 1, 3, 3}, wd_);
  ob_init_f32(b, "wm", 2, (int64_t[]){HW / 2, N_OUT}, wm_);
  int c1 = ob_node(b, "Conv", "c1", 3, "x", "w1", "b1");
  ob_attr_ints(b, c1, "pads", 4, (int64_t[]){1, 1, 1, 1});
  ob_node(b, "Relu", "r", 1, "c1");
  int dw = ob_node(b, "Conv", "dw", 2, "r", "wd");
  ob_attr_int(b, dw, "group", C_MID);
  ob_attr_ints(b, dw, "strides", 2, (int64_t[]){2, 2});
  ob_attr_ints(b, dw, "pads", 4, (int64_t[]){1, 1, 1, 1});
  ob_node(b, "MatMul", "y", 2, "dw", "wm");
  ob_output(b, "y");
  uint8_t *bytes = ob_pack(b, size);
  free(b);
  return bytes;
}

#define Y_COUNT (C_MID * (HW / 2) * N_OUT)

static float x_[C_IN * HW * HW];

static void input(es_tensor *t) {
  uint64_t s = 99;
  for (int i = 0; i < C_IN * HW * HW; i++)
    x_[i] = (float)(es_test_rand(&s) % 2001) / 1000.0f - 1.0f;
  memset(t, 0, sizeof *t);
  t->name = "x";
  t->dtype = ES_DTYPE_FLOAT;
  t->rank = 4;
  t->dims[0] = 1;
  t->dims[1] = C_IN;
  t->dims[2] = HW;
  t->dims[3] = HW;
  t->data = x_;
  t->nbytes = sizeof x_;
}

/* y into out; the plan's arena bytes into *arena. */
static void run(es_model *m, float *out, size_t *arena) {
  es_tensor x;
  input(&x);
  es_plan *p;
  es_tensor_info shape = {.name = "x", .dtype = ES_DTYPE_FLOAT, .rank = 4,
                          .dims = {1, C_IN, HW, HW}};
  ES_CHECK_RC(es_model_plan(m, &shape, 1, &p));
  *arena = es_plan_arena_bytes(p);
  es_arena *a;
  ES_CHECK_RC(es_arena_create(*arena, 64, &a));
  es_tensor y;
  ES_CHECK_RC(es_plan_run(p, &x, 1, a, &y, 1));
  assert_int_equal(y.nbytes, sizeof(float) * Y_COUNT);
  memcpy(out, y.data, y.nbytes);
  es_arena_destroy(a);
  es_plan_release(p);
}

static void test_names(void **state) {
  (void)state;
  es_precision p;
  ES_CHECK_RC(es_precision_parse("bf16", &p));
  assert_int_equal(p, ES_PRECISION_BF16);
  ES_CHECK_RC(es_precision_parse("bfloat16", &p));
  assert_int_equal(p, ES_PRECISION_BF16);
  ES_CHECK_RC(es_precision_parse("float32", &p));
  assert_int_equal(p, ES_PRECISION_FP32);
  ES_CHECK_RC(es_precision_parse("int8", &p));
  assert_int_equal(p, ES_PRECISION_INT8);
  ES_EXPECT_RC(es_precision_parse("fp16", &p), ES_EINVAL);
  assert_non_null(strstr(es_last_error_detail(), "auto, fp32, bf16 or int8"));
  ES_EXPECT_RC(es_precision_parse(NULL, &p), ES_EINVAL);
  assert_string_equal(es_precision_name(ES_PRECISION_AUTO), "auto");
  assert_string_equal(es_precision_name(ES_PRECISION_BF16), "bf16");
  assert_string_equal(es_precision_name((es_precision)9), "unknown");
}

static char esm_[64], esm32_[64];

static void test_bf16(void **state) {
  (void)state;
  es_mem_stats before;
  es_mem_stats_get(ES_MEM_ENGINE, &before);
  size_t size;
  uint8_t *bytes = model(&size);
  es_model_options bf = {.precision = ES_PRECISION_BF16}, f32 = {.precision = ES_PRECISION_FP32};
  es_model *m32, *m16;
  ES_CHECK_RC(es_model_load_buffer(bytes, size, &f32, &m32));
  if (es_engine_bf16_check() < 0) {
    ES_EXPECT_RC(es_model_load_buffer(bytes, size, &bf, &m16), ES_ENOTSUP);
    assert_non_null(strstr(es_last_error_detail(), "avx512_bf16"));
    printf("# no bf16 here: %s\n", es_last_error_detail());
    es_model_release(m32);
    free(bytes);
    skip();
  }
  ES_CHECK_RC(es_model_load_buffer(bytes, size, &bf, &m16));
  es_model_stats st;
  ES_CHECK_RC(es_model_stats_get(m32, &st));
  assert_int_equal(st.float_nodes, 3);
  assert_int_equal(st.bf16_nodes, 0);
  ES_CHECK_RC(es_model_stats_get(m16, &st));
  assert_int_equal(st.bf16_nodes, 2); /* the 3x3 conv and the MatMul */
  assert_int_equal(st.float_nodes, 1); /* the strided depthwise conv */
  assert_int_equal(st.int8_nodes, 0);

  static float a[Y_COUNT], b[Y_COUNT];
  size_t arena32, arena16;
  run(m32, a, &arena32);
  run(m16, b, &arena16);
  /* the bf16 sources take room in scratch: x for the conv (16x12x12) and
   * the MatMul's A (32x6x6), 2 bytes each */
  printf("# arena: %zu B float32, %zu B bf16\n", arena32, arena16);
  assert_true(arena16 >= arena32);
  double sig = 0, err = 0;
  int same = 0;
  for (int i = 0; i < Y_COUNT; i++) {
    sig += (double)a[i] * a[i];
    err += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    same += a[i] == b[i];
  }
  double db = 10 * log10(sig / err);
  printf("# bf16 vs float32: %.1f dB, %d of %d values equal\n", db, same, Y_COUNT);
  /* 8 significant bits in the products' operands, sums in float32: far
   * above 30 dB, and not the float32 result itself */
  assert_true(db > 30);
  assert_true(same < Y_COUNT / 2);

  /* Split into bands of rows (safe points for preemption): each band
   * reads its rows of the bf16 source; the same values */
  es_engine_split_set(200000);
  static float d[Y_COUNT];
  size_t arena_s;
  run(m16, d, &arena_s);
  es_engine_split_set(0);
  for (int i = 0; i < Y_COUNT; i++)
    assert_true(fabsf(d[i] - b[i]) <= 1e-5f * (1.0f + fabsf(b[i])));

  /* Compiled: the bf16 marks and prepared bf16 weights are kept. */
  snprintf(esm_, sizeof esm_, "/tmp/es_prec_%d.esm", (int)getpid());
  snprintf(esm32_, sizeof esm32_, "/tmp/es_prec32_%d.esm", (int)getpid());
  ES_CHECK_RC(es_model_compile(m16, NULL, esm_));
  ES_CHECK_RC(es_model_compile(m32, NULL, esm32_));
  es_model *c16, *c;
  ES_CHECK_RC(es_model_load(esm_, NULL, &c16));
  ES_CHECK_RC(es_model_stats_get(c16, &st));
  assert_int_equal(st.compiled, 1);
  assert_int_equal(st.bf16_nodes, 2);
  assert_true(st.compiled_prepared >= 2);
  static float e[Y_COUNT];
  size_t arena_c;
  run(c16, e, &arena_c);
  assert_memory_equal(e, b, sizeof e); /* the same kernels on the same weights */
  assert_int_equal(arena_c, arena16);
  es_model_release(c16);
  ES_CHECK_RC(es_model_load(esm_, &bf, &c16));
  es_model_release(c16);
  ES_EXPECT_RC(es_model_load(esm_, &f32, &c), ES_EINVAL);
  assert_non_null(strstr(es_last_error_detail(), "compile it again with precision fp32"));
  ES_EXPECT_RC(es_model_load(esm32_, &bf, &c), ES_EINVAL);
  assert_non_null(strstr(es_last_error_detail(), "compile it again with precision bf16"));
  unlink(esm_);
  unlink(esm32_);

  es_model_release(m32);
  es_model_release(m16);
  free(bytes);
  es_mem_stats after;
  es_mem_stats_get(ES_MEM_ENGINE, &after);
  assert_int_equal(after.current, before.current);
}

static void test_refusals(void **state) {
  (void)state;
  size_t size;
  uint8_t *bytes = model(&size);
  es_model *m;
  es_model_options i8 = {.precision = ES_PRECISION_INT8};
  ES_EXPECT_RC(es_model_load_buffer(bytes, size, &i8, &m), ES_EINVAL);
  assert_non_null(strstr(es_last_error_detail(), "edgeserve quantize"));
  es_model_options bad = {.precision = (es_precision)7};
  ES_EXPECT_RC(es_model_load_buffer(bytes, size, &bad, &m), ES_EINVAL);
  ES_EXPECT_RC(es_model_load("/nonexistent.onnx", &bad, &m), ES_EINVAL);
  es_model_options aut = {.precision = ES_PRECISION_AUTO};
  ES_CHECK_RC(es_model_load_buffer(bytes, size, &aut, &m));
  es_model_release(m);
  free(bytes);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_names),
      cmocka_unit_test(test_bf16),
      cmocka_unit_test(test_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
