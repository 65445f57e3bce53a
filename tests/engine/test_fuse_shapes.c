/* The fusion passes' symbolic shapes (src/engine/fuse_shapes.c) against the
 * kernels' own shape inference: on the target models loaded without fusion,
 * every value's symbolic shape is compared with the shape the planner gave
 * it at concrete input sizes. A known rank, dimension or element type must
 * match; and one symbol must stand for one extent, since fusion treats two
 * equal symbols as proof that two shapes are equal (a residual Add becomes
 * a post-op on that proof). Two input sizes per model, so a coincidence at
 * one size does not hide a wrong rule. */
#include "es_test.h"

#include <math.h>
#include <string.h>

#include "edgeserve/engine.h"
#include "engine/engine_internal.h"
#include "engine/fuse.h"
#include "support/onnx_builder.h"

typedef struct case_ {
  const char *file;
  int rank;
  int64_t dims[2][4]; /* two input shapes */
} case_;

typedef struct tally {
  long dims, symbolic, values;
} tally;

/* Symbol number -> the extent it stood for at this size (-1: not seen). */
static void check_size(es_model *m, const fuser *f, const es_tensor_info *in, tally *t) {
  const es_graph *g = &m->g;
  es_tdesc *vd = es_mem_calloc(ES_MEM_ENGINE, (size_t)g->n_values + 1, sizeof *vd);
  int64_t *sym_val = es_mem_calloc(ES_MEM_ENGINE, (size_t)f->n_syms + 64, sizeof *sym_val);
  assert_non_null(vd);
  assert_non_null(sym_val);
  for (int i = 0; i < f->n_syms + 64; i++)
    sym_val[i] = -1;
  es_plan *p;
  ES_CHECK_RC(es__plan_make(m, in, 1, &p, vd));
  for (int v = 0; v < f->n_shape; v++) {
    const sshape *s = &f->shape[v];
    const es_tdesc *d = &vd[v];
    if (d->dtype == ES_DTYPE_UNDEFINED)
      continue;
    t->values++;
    if (s->dt != ES_DTYPE_UNDEFINED && s->dt != d->dtype)
      fail_msg("value '%s': symbolic type %s, planned %s", g->values[v].name,
               es_dtype_name(s->dt), es_dtype_name(d->dtype));
    if (s->rank < 0)
      continue;
    if (s->rank != d->rank)
      fail_msg("value '%s': symbolic rank %d, planned %d", g->values[v].name, s->rank, d->rank);
    for (int i = 0; i < s->rank; i++) {
      t->dims++;
      if (s->d[i] >= 0) {
        if (s->d[i] != d->dims[i])
          fail_msg("value '%s' dim %d: symbolic %lld, planned %lld", g->values[v].name, i,
                   (long long)s->d[i], (long long)d->dims[i]);
        continue;
      }
      int64_t sn = -1 - s->d[i];
      t->symbolic++;
      if (sn >= f->n_syms) /* fresh and never stored: equal only to itself */
        continue;
      if (sym_val[sn] < 0)
        sym_val[sn] = d->dims[i];
      else if (sym_val[sn] != d->dims[i])
        fail_msg("value '%s' dim %d: symbol %lld stands for %lld here and %lld elsewhere",
                 g->values[v].name, i, (long long)sn, (long long)d->dims[i],
                 (long long)sym_val[sn]);
    }
  }
  es_plan_release(p);
  es_mem_free(vd);
  es_mem_free(sym_val);
}

static void test_target_models(void **state) {
  (void)state;
  static const case_ cases[] = {
      {"blazeface_front_128.onnx", 4, {{1, 128, 128, 3}, {1, 128, 128, 3}}},
      {"blazeface_back_256.onnx", 4, {{1, 256, 256, 3}, {1, 256, 256, 3}}},
      {"ppocr_cls.onnx", 4, {{1, 3, 48, 192}, {3, 3, 48, 97}}},
      {"ppocr_rec.onnx", 4, {{1, 3, 48, 320}, {2, 3, 48, 97}}},
      {"ppocr_det.onnx", 4, {{1, 3, 320, 320}, {1, 3, 352, 224}}},
  };
  es_engine_fusion_set(0); /* the graph the passes see: folded, not fused */
  int found = 0;
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    char path[1024];
    es_model *m;
    int rc = es_model_load(es_test_model_path(path, sizeof path, cases[c].file), NULL, &m);
    if (rc == ES_ENOENT)
      continue;
    ES_CHECK_RC(rc);
    found++;
    es__graph_reindex(&m->g);
    fuser f = {.g = &m->g};
    ES_CHECK_RC(es__fuse_shapes(&f));
    tally t = {0};
    for (int s = 0; s < 2; s++) {
      es_tensor_info in;
      ES_CHECK_RC(es_model_input_info(m, 0, &in));
      in.rank = cases[c].rank;
      memcpy(in.dims, cases[c].dims[s], sizeof cases[c].dims[s]);
      check_size(m, &f, &in, &t);
    }
    printf("# %-26s %ld values, %ld dims checked (%ld symbolic)\n", cases[c].file, t.values,
           t.dims, t.symbolic);
    assert_true(t.dims > 0);
    es__fuser_fini(&f);
    es_model_release(m);
  }
  es_engine_fusion_set(1);
  if (!found)
    skip(); /* models not fetched: scripts/setup/fetch-models.sh */
}

/* Two stride-2 convolutions of one input of unknown size have outputs of
 * one symbolic shape, so their sum becomes the second one's residual
 * post-op, and computes what the unfused graph does. Interning is what
 * proves it: a symbol table that stored nothing made every derived
 * dimension a stranger to every other. */
/* x [1,4,H,W] -> two stride-2 Convs -> Add. down: the second is 1x1 and
 * unpadded, as in a ResNet's downsampling block (the same extents as a
 * 3x3 padded by 1, by another formula). */
static es_model *two_branch_model(int fuse, float *w, int down) {
  static const int64_t wd[4] = {4, 4, 3, 3}, w1d[4] = {4, 4, 1, 1}, st[2] = {2, 2},
                       pads[4] = {1, 1, 1, 1};
  ob *b = ob_new(13);
  ob_input(b, "x", 4, (int64_t[]){1, 4, -1, -1});
  ob_init_f32(b, "W1", 4, wd, w);
  ob_init_f32(b, "W2", 4, down ? w1d : wd, w + 144);
  int c1 = ob_node(b, "Conv", "a", 2, "x", "W1");
  int c2 = ob_node(b, "Conv", "c", 2, "x", "W2");
  for (int c = 0; c < 2; c++) {
    ob_attr_ints(b, c ? c2 : c1, "strides", 2, st);
    if (!c || !down)
      ob_attr_ints(b, c ? c2 : c1, "pads", 4, pads);
  }
  ob_node(b, "Add", "y", 2, "a", "c");
  ob_output(b, "y");
  es_engine_fusion_set(fuse);
  es_model *m = ob_load(b);
  es_engine_fusion_set(1);
  free(b);
  return m;
}

static void test_symbolic_residual(void **state) {
  (void)state;
  float w[288], x[4 * 9 * 7];
  for (int i = 0; i < 288; i++)
    w[i] = (float)((i * 37) % 17 - 8) / 16.0f;
  for (int i = 0; i < 4 * 9 * 7; i++)
    x[i] = (float)((i * 11) % 13 - 6) / 8.0f;
  for (int down = 0; down < 2; down++) {
    es_model *fused = two_branch_model(1, w, down), *plain = two_branch_model(0, w, down);
    es_model_stats sf, sp;
    ES_CHECK_RC(es_model_stats_get(fused, &sf));
    ES_CHECK_RC(es_model_stats_get(plain, &sp));
    assert_int_equal(sp.nodes, 3);
    assert_int_equal(sf.nodes, 2); /* the Add is the second Conv's post-op */
    es_tensor in = ob_tensor_f32("x", 4, (int64_t[]){1, 4, 9, 7}, x);
    float *yf, *yp;
    size_t nf, np;
    ob_run(fused, 1, &in, 1, &yf, &nf);
    ob_run(plain, 1, &in, 1, &yp, &np);
    assert_int_equal(nf, np);
    assert_int_equal(nf, 4 * 5 * 4);
    for (size_t i = 0; i < nf; i++)
      assert_true(fabsf(yf[i] - yp[i]) <= 1e-5f * (1.0f + fabsf(yp[i])));
    free(yf);
    free(yp);
    es_model_release(fused);
    es_model_release(plain);
  }
}

/* An initializer of an 8-bit or int32 type, carried in int32_data as ONNX
 * stores them. */
static void init_i32s(ob *b, const char *name, int elem, int rank, const int64_t *dims,
                      const int32_t *data) {
  Onnx__TensorProto *t = ob_init_f32(b, name, rank, dims, NULL);
  t->data_type = elem;
  t->n_float_data = 0;
  size_t n = 1;
  for (int i = 0; i < rank; i++)
    n *= (size_t)dims[i];
  t->n_int32_data = n;
  t->int32_data = (int32_t *)data;
}

/* The quantisation operators' rules: a model of each over an input of
 * unknown height and width (QuantizeLinear, ConvInteger and QLinearConv
 * with stride 2, DequantizeLinear, DynamicQuantizeLinear, MatMulInteger
 * and QLinearMatMul of the input by its transpose), every value's symbolic
 * shape and type checked against the planner's at two sizes. */
static void test_quantized_ops(void **state) {
  (void)state;
  static int32_t w[144], wz[4] = {1, 2, 3, 4}, zero = 0, bias[4] = {5, -6, 7, -8};
  static const float s = 0.1f, ws[4] = {0.01f, 0.02f, 0.03f, 0.04f};
  static const int64_t perm[4] = {0, 1, 3, 2}, st[2] = {2, 2}, pads[4] = {1, 1, 1, 1};
  for (int i = 0; i < 144; i++)
    w[i] = (i * 37) % 251;
  ob *b = ob_new(13);
  ob_input(b, "x", 4, (int64_t[]){1, 4, -1, -1});
  ob_init_f32(b, "s", 0, NULL, &s);
  ob_init_f32(b, "ws", 1, (int64_t[]){4}, ws);
  init_i32s(b, "z", ONNX__TENSOR_PROTO__DATA_TYPE__UINT8, 0, NULL, &zero);
  init_i32s(b, "W", ONNX__TENSOR_PROTO__DATA_TYPE__UINT8, 4, (int64_t[]){4, 4, 3, 3}, w);
  init_i32s(b, "wz", ONNX__TENSOR_PROTO__DATA_TYPE__UINT8, 1, (int64_t[]){4}, wz);
  init_i32s(b, "B", ONNX__TENSOR_PROTO__DATA_TYPE__INT32, 1, (int64_t[]){4}, bias);
  ob_node(b, "QuantizeLinear", "q", 3, "x", "s", "z");
  int ci = ob_node(b, "ConvInteger", "ci", 4, "q", "W", "z", "wz");
  int qc = ob_node(b, "QLinearConv", "qc", 9, "q", "s", "z", "W", "ws", "wz", "s", "z", "B");
  for (int c = 0; c < 2; c++) {
    ob_attr_ints(b, c ? qc : ci, "strides", 2, st);
    ob_attr_ints(b, c ? qc : ci, "pads", 4, pads);
  }
  ob_node(b, "DequantizeLinear", "dq", 3, "qc", "s", "z");
  int dy = ob_node(b, "DynamicQuantizeLinear", "dy", 1, "dq");
  ob_node_out(b, dy, "dys");
  int t = ob_node(b, "Transpose", "xt", 1, "x");
  ob_attr_ints(b, t, "perm", 4, perm);
  ob_node(b, "QuantizeLinear", "qt", 2, "xt", "s");
  ob_node(b, "MatMulInteger", "mi", 4, "q", "qt", "z", "z");
  ob_node(b, "QLinearMatMul", "qm", 8, "q", "s", "z", "qt", "s", "z", "s", "z");
  int cast = ob_node(b, "Cast", "mf", 1, "mi");
  ob_attr_int(b, cast, "to", 1);
  ob_node(b, "DequantizeLinear", "qmf", 3, "qm", "s", "z");
  ob_node(b, "Add", "mm", 2, "mf", "qmf");
  ob_output(b, "ci");
  ob_output(b, "mm");
  ob_output(b, "dy");
  es_engine_fusion_set(0);
  es_model *m = ob_load(b);
  es_engine_fusion_set(1);
  free(b);
  es__graph_reindex(&m->g);
  fuser f = {.g = &m->g};
  ES_CHECK_RC(es__fuse_shapes(&f));
  static const int64_t sizes[2][4] = {{1, 4, 9, 7}, {1, 4, 6, 6}};
  tally tl = {0};
  for (int sz = 0; sz < 2; sz++) {
    es_tensor_info in;
    ES_CHECK_RC(es_model_input_info(m, 0, &in));
    memcpy(in.dims, sizes[sz], sizeof sizes[sz]);
    check_size(m, &f, &in, &tl);
  }
  /* every value has a known type and rank: nothing left to chance */
  for (int v = 0; v < f.n_shape; v++) {
    if (m->g.values[v].kind == ES_VALUE_CONST)
      continue;
    if (f.shape[v].rank < 0 || f.shape[v].dt == ES_DTYPE_UNDEFINED)
      fail_msg("value '%s': no symbolic rank or type", m->g.values[v].name);
  }
  printf("# quantised ops: %ld values, %ld dims checked (%ld symbolic)\n", tl.values, tl.dims,
         tl.symbolic);
  assert_true(tl.values >= 12);
  es__fuser_fini(&f);
  es_model_release(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_target_models),
      cmocka_unit_test(test_symbolic_residual),
      cmocka_unit_test(test_quantized_ops),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
