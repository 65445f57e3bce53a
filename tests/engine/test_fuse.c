/* Fusion pass tests (src/engine/fuse*.c): each pattern fuses into the node it
 * should (checked on the loaded graph: operators, post-op codes), the fused
 * model computes what the unfused one does, and what must not fuse stays.
 *
 * The reference is the same model loaded with es_engine_fusion_set(0), which skips the
 * passes: every operator then runs its own kernel, which the kernel and
 * conformance tests check against ONNX. Models are built here with
 * protobuf-c's structs. */
#include "es_test.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "edgeserve/engine.h"
#include "kernels/fused.h"
#include "kernels/kernel.h"
#include "engine/engine_internal.h"
#include "model/graph.h"
#include "support/onnx_builder.h"

#ifndef ES_SOURCE_DIR
#define ES_SOURCE_DIR "."
#endif

/* ==========================================================================
 * Building models
 * ======================================================================== */

/* A 2-D Conv with square kernel k, symmetric pads, group 1. */
static int add_conv(ob *b, const char *x, const char *w, const char *bias, const char *out, int k,
                    int pad) {
  static const int64_t pads[4][4] = {{0, 0, 0, 0}, {1, 1, 1, 1}, {2, 2, 2, 2}, {3, 3, 3, 3}};
  static const int64_t ks[8][2] = {{0, 0}, {1, 1}, {2, 2}, {3, 3}, {4, 4}, {5, 5}, {6, 6}, {7, 7}};
  int n = bias ? ob_node(b, "Conv", out, 3, x, w, bias) : ob_node(b, "Conv", out, 2, x, w);
  ob_attr_ints(b, n, "kernel_shape", 2, ks[k]);
  ob_attr_ints(b, n, "pads", 4, pads[pad]);
  return n;
}

/* ==========================================================================
 * Loading and running
 * ======================================================================== */

static void fuse_set(int on) { es_engine_fusion_set(on); }

static es_model *load_model(const ob *b, int fuse) {
  fuse_set(fuse);
  es_model *m = ob_load(b);
  fuse_set(1);
  return m;
}

/* The fused graph itself, for its nodes and attributes. */
static void lowered_graph(const ob *b, es_graph *g) {
  size_t size;
  uint8_t *buf = ob_pack(b, &size);
  memset(g, 0, sizeof *g);
  fuse_set(1);
  ES_CHECK_RC(es__graph_load_lowered(buf, size, g));
  free(buf);
}

static int graph_count(const es_graph *g, es_op op) {
  int n = 0;
  for (int i = 0; i < g->n_nodes; i++)
    n += g->nodes[i].op == op;
  return n;
}

static const es_node *graph_find(const es_graph *g, es_op op) {
  for (int i = 0; i < g->n_nodes; i++)
    if (g->nodes[i].op == op)
      return &g->nodes[i];
  return NULL;
}

/* The node's "_post" codes, as a string like "7,1" (or ""). */
static const char *post_codes(const es_node *n, char *buf, size_t size) {
  const es_attr *a = es__node_attr(n, "_post");
  buf[0] = 0;
  for (size_t i = 0; a && i < a->n; i++)
    snprintf(buf + strlen(buf), size - strlen(buf), "%s%lld", i ? "," : "",
             (long long)a->ints[i]);
  return buf;
}

/* Inputs of one run: names, shapes and data. */
typedef struct feed {
  int n;
  const char *name[OB_IO];
  int rank[OB_IO];
  int64_t dims[OB_IO][4];
  float *data[OB_IO];
} feed;

static uint64_t seed_ = 0x5eedf05eull;

static void fill_random(float *v, size_t n, float lo, float hi) {
  for (size_t i = 0; i < n; i++)
    v[i] = lo + (hi - lo) * (float)(es_test_rand(&seed_) >> 11) / (float)(1ull << 53);
}

/* Adds an input of the given shape with random data in [-3, 3]. */
static void feed_add(feed *f, const char *name, int rank, const int64_t *dims) {
  int i = f->n++;
  size_t n = 1;
  f->name[i] = name;
  f->rank[i] = rank;
  for (int d = 0; d < rank; d++) {
    f->dims[i][d] = dims[d];
    n *= (size_t)dims[d];
  }
  f->data[i] = malloc(n * sizeof(float));
  assert_non_null(f->data[i]);
  fill_random(f->data[i], n, -3, 3);
}

static void feed_free(feed *f) {
  for (int i = 0; i < f->n; i++)
    free(f->data[i]);
  f->n = 0;
}

/* Plans and runs m on f; copies the n_out outputs into out[] (malloc'ed). */
static void model_run(es_model *m, const feed *f, int n_out, float **out, size_t *count) {
  es_tensor in[OB_IO];
  for (int i = 0; i < f->n; i++)
    in[i] = ob_tensor_f32(f->name[i], f->rank[i], f->dims[i], f->data[i]);
  ob_run(m, f->n, in, n_out, out, count);
}

/* Runs b fused and unfused on f and compares every output (absolute
 * tolerance tol, relative for large values). Returns the fused model's
 * node count. */
static int check_same(const ob *b, const feed *f, float tol) {
  int n_out = (int)b->graph.n_output;
  float *want[OB_IO], *got[OB_IO];
  size_t nw[OB_IO], ng[OB_IO];
  es_model *plain = load_model(b, 0), *fused = load_model(b, 1);
  model_run(plain, f, n_out, want, nw);
  model_run(fused, f, n_out, got, ng);
  for (int o = 0; o < n_out; o++) {
    assert_int_equal(ng[o], nw[o]);
    for (size_t i = 0; i < nw[o]; i++) {
      float lim = tol * (1 + fabsf(want[o][i]));
      if (!(fabsf(got[o][i] - want[o][i]) <= lim))
        fail_msg("output %d element %zu: fused %.7g, unfused %.7g", o, i, (double)got[o][i],
                 (double)want[o][i]);
    }
    free(want[o]);
    free(got[o]);
  }
  es_model_stats st;
  ES_CHECK_RC(es_model_stats_get(fused, &st));
  es_model_release(plain);
  es_model_release(fused);
  return (int)st.nodes;
}

/* ==========================================================================
 * Conv post-ops
 * ======================================================================== */

/* x [1,4,5,5] -> Conv (6 filters 3x3, pad 1, bias) -> "c"; the caller adds
 * the pattern after "c". Constant data lives in static storage. */
static float conv_w_[6 * 4 * 3 * 3], conv_b_[6];
static float k0_ = 0, k1_ = 1, k3_ = 3, k6_ = 6, k2_ = 2, kneg_ = -0.5f;

static ob *conv_model(int64_t opset, int bias) {
  static const int64_t xd[4] = {1, 4, 5, 5}, wd[4] = {6, 4, 3, 3}, bd[1] = {6};
  fill_random(conv_w_, sizeof conv_w_ / sizeof conv_w_[0], -0.5f, 0.5f);
  fill_random(conv_b_, 6, -1, 1);
  ob *b = ob_new(opset);
  ob_input(b, "x", 4, xd);
  ob_init_f32(b, "W", 4, wd, conv_w_);
  if (bias)
    ob_init_f32(b, "B", 1, bd, conv_b_);
  add_conv(b, "x", "W", bias ? "B" : NULL, "c", 3, 1);
  return b;
}

static void feed_conv(feed *f) {
  static const int64_t xd[4] = {1, 4, 5, 5};
  *f = (feed){0};
  feed_add(f, "x", 4, xd);
}

/* Loads b, expects one Conv node with the given codes (and the given node
 * count), and compares the fused run with the unfused one. */
static void expect_conv_post(const ob *b, const feed *f, int nodes, const char *codes) {
  es_graph g;
  char buf[64];
  lowered_graph(b, &g);
  const es_node *conv = graph_find(&g, ES_OP_Conv);
  assert_non_null(conv);
  if (g.n_nodes != nodes || strcmp(post_codes(conv, buf, sizeof buf), codes))
    fail_msg("fused graph has %d nodes and post-ops '%s', want %d and '%s'", g.n_nodes, buf,
             nodes, codes);
  es__graph_fini(&g);
  assert_int_equal(check_same(b, f, 1e-4f), nodes);
}

/* Adds the output y, then expect_conv_post (one node) on the usual conv
 * input, and frees b. */
static void conv_post_done(ob *b, const char *codes) {
  ob_output(b, "y");
  feed f;
  feed_conv(&f);
  expect_conv_post(b, &f, 1, codes);
  feed_free(&f);
  free(b);
}

/* The scalars a hard-swish reads: three, zero and six. */
static void hswish_consts(ob *b) {
  ob_init_f32(b, "three", 0, NULL, &k3_);
  ob_init_f32(b, "zero", 0, NULL, &k0_);
  ob_init_f32(b, "six", 0, NULL, &k6_);
}

static void test_conv_relu_sigmoid_hardsigmoid(void **state) {
  (void)state;
  static const char *const ops[] = {"Relu", "Sigmoid", "HardSigmoid"};
  static const char *const codes[] = {"1", "5", "3"};
  for (int i = 0; i < 3; i++) {
    ob *b = conv_model(13, 1);
    int n = ob_node(b, ops[i], "y", 1, "c");
    if (i == 2) {
      ob_attr_float(b, n, "alpha", 0.25f);
      ob_attr_float(b, n, "beta", 0.4f);
    }
    conv_post_done(b, codes[i]);
  }
}

static void test_conv_clip_forms(void **state) {
  (void)state;
  for (int form = 0; form < 3; form++) {
    /* 0: opset 9 attributes; 1: opset 13 inputs min and max; 2: min only */
    ob *b = conv_model(form ? 13 : 9, 1);
    int n;
    if (form == 0) {
      n = ob_node(b, "Clip", "y", 1, "c");
      ob_attr_float(b, n, "min", -0.5f);
      ob_attr_float(b, n, "max", 6);
    } else {
      ob_init_f32(b, "lo", 0, NULL, &kneg_);
      ob_init_f32(b, "hi", 0, NULL, &k6_);
      if (form == 1)
        ob_node(b, "Clip", "y", 3, "c", "lo", "hi");
      else
        ob_node(b, "Clip", "y", 2, "c", "lo");
    }
    ob_output(b, "y");
    feed f;
    feed_conv(&f);
    expect_conv_post(b, &f, 1, "2");
    es_graph g;
    lowered_graph(b, &g);
    const es_attr *pf = es__node_attr(graph_find(&g, ES_OP_Conv), "_post_f");
    assert_non_null(pf);
    assert_int_equal(pf->n, 2);
    assert_true(pf->floats[0] == -0.5f);
    assert_true(pf->floats[1] == (form == 2 ? FLT_MAX : 6.0f));
    es__graph_fini(&g);
    feed_free(&f);
    free(b);
  }
}

/* PP-OCR's hard-swish: a = c + 3; b = Clip(a, 0, 6); Mul(c, b) / 6, with
 * the Mul's operands either way round, and the Div-first variant. */
static void test_conv_hardswish(void **state) {
  (void)state;
  for (int variant = 0; variant < 3; variant++) {
    ob *b = conv_model(11, 1);
    hswish_consts(b);
    ob_node(b, "Add", "a", 2, variant == 1 ? "three" : "c", variant == 1 ? "c" : "three");
    ob_node(b, "Clip", "cl", 3, "a", "zero", "six");
    if (variant < 2) {
      ob_node(b, "Mul", "m", 2, variant ? "cl" : "c", variant ? "c" : "cl");
      ob_node(b, "Div", "y", 2, "m", "six");
    } else {
      ob_node(b, "Div", "d", 2, "cl", "six");
      ob_node(b, "Mul", "y", 2, "c", "d");
    }
    conv_post_done(b, "4");
  }
}

/* Swish as rec writes it: Mul(c, Sigmoid(Mul(c, 1))); the identity Mul goes
 * first, then Mul(c, Sigmoid(c)) is one post-op. */
static void test_conv_swish(void **state) {
  (void)state;
  ob *b = conv_model(9, 1);
  ob_init_f32(b, "one", 0, NULL, &k1_);
  ob_node(b, "Mul", "c1", 2, "c", "one");
  ob_node(b, "Sigmoid", "s", 1, "c1");
  ob_node(b, "Mul", "y", 2, "c", "s");
  conv_post_done(b, "6");
}

/* Add of a second input of the conv's output shape, then Relu: codes 7, 1,
 * the residual as input 3; without a bias, input 2 is omitted. */
static void test_conv_residual(void **state) {
  (void)state;
  static const int64_t rd[4] = {1, 6, 5, 5};
  for (int bias = 0; bias < 2; bias++) {
    ob *b = conv_model(13, bias);
    ob_input(b, "r", 4, rd);
    ob_node(b, "Add", "a", 2, bias ? "r" : "c", bias ? "c" : "r");
    ob_node(b, "Relu", "y", 1, "a");
    ob_output(b, "y");
    feed f;
    feed_conv(&f);
    feed_add(&f, "r", 4, rd);
    expect_conv_post(b, &f, 1, "7,1");
    es_graph g;
    lowered_graph(b, &g);
    const es_node *conv = graph_find(&g, ES_OP_Conv);
    assert_int_equal(conv->n_in, 4);
    assert_string_equal(g.values[conv->in[3]].name, "r");
    if (!bias)
      assert_int_equal(conv->in[2], -1);
    es__graph_fini(&g);
    feed_free(&f);
    free(b);
  }
}

/* A residual block on an input of any size: both branches are stride-1
 * "same" convolutions, so the shapes are proven equal symbolically. */
static void test_conv_residual_symbolic(void **state) {
  (void)state;
  static const int64_t xd[4] = {1, 4, -1, -1}, wd[4] = {4, 4, 3, 3}, bd[1] = {4};
  static float w1[4 * 4 * 9], w2[4 * 4 * 9], b1[4], b2[4];
  fill_random(w1, 144, -0.3f, 0.3f);
  fill_random(w2, 144, -0.3f, 0.3f);
  fill_random(b1, 4, -1, 1);
  fill_random(b2, 4, -1, 1);
  ob *b = ob_new(13);
  ob_input(b, "x", 4, xd);
  ob_init_f32(b, "W1", 4, wd, w1);
  ob_init_f32(b, "B1", 1, bd, b1);
  ob_init_f32(b, "W2", 4, wd, w2);
  ob_init_f32(b, "B2", 1, bd, b2);
  add_conv(b, "x", "W1", "B1", "c1", 3, 1);
  ob_node(b, "Relu", "r1", 1, "c1");
  add_conv(b, "r1", "W2", "B2", "c2", 3, 1);
  ob_node(b, "Add", "y", 2, "c2", "r1");
  ob_output(b, "y");
  es_graph g;
  char buf[64];
  lowered_graph(b, &g);
  assert_int_equal(g.n_nodes, 2);
  assert_string_equal(post_codes(&g.nodes[0], buf, sizeof buf), "1");
  assert_string_equal(post_codes(&g.nodes[1], buf, sizeof buf), "7");
  es__graph_fini(&g);
  static const int64_t shapes[2][4] = {{1, 4, 7, 9}, {1, 4, 1, 3}};
  for (int s = 0; s < 2; s++) {
    feed f = {0};
    feed_add(&f, "x", 4, shapes[s]);
    assert_int_equal(check_same(b, &f, 1e-4f), 2);
    feed_free(&f);
  }
  free(b);
}

/* ==========================================================================
 * Affine maps into convolutions
 * ======================================================================== */

/* det's pattern: Conv, Mul by a scalar, Add a scalar, then hard-swish: the
 * Mul and Add go into the weights, the hard-swish becomes a post-op. */
static void test_affine_after_conv(void **state) {
  (void)state;
  static const int64_t one[1] = {1}, chan[3] = {6, 1, 1};
  static float s_ = 1.7f, t_ = -0.3f, per[6] = {0.5f, -1, 2, 0.25f, 1.5f, -0.75f};
  for (int variant = 0; variant < 2; variant++) {
    /* 0: scalar Mul, Add; 1: per-channel Sub, Div */
    ob *b = conv_model(11, variant);
    hswish_consts(b);
    if (variant == 0) {
      ob_init_f32(b, "s", 1, one, &s_);
      ob_init_f32(b, "t", 1, one, &t_);
      ob_node(b, "Mul", "m0", 2, "s", "c");
      ob_node(b, "Add", "p", 2, "m0", "t");
    } else {
      ob_init_f32(b, "per", 3, chan, per);
      ob_node(b, "Sub", "m0", 2, "per", "c");
      ob_node(b, "Div", "p", 2, "m0", "per");
    }
    ob_node(b, "Add", "a", 2, "p", "three");
    ob_node(b, "Clip", "cl", 3, "a", "zero", "six");
    ob_node(b, "Mul", "m", 2, "p", "cl");
    ob_node(b, "Div", "y", 2, "m", "six");
    conv_post_done(b, "4");
  }
}

/* ConvTranspose, Add of a per-channel bias, BatchNormalization (det's
 * head): both go into the ConvTranspose. */
static void test_affine_after_conv_transpose(void **state) {
  (void)state;
  static const int64_t xd[4] = {1, 3, 4, 4}, wd[4] = {3, 2, 2, 2}, bd[4] = {1, 2, 1, 1},
                       pd[1] = {2}, st[2] = {2, 2};
  static float w[24], bias[2], sc[2] = {1.5f, 0.5f}, sh[2] = {0.1f, -0.2f}, mean[2] = {0.3f, -1},
                                  var[2] = {2, 0.5f};
  fill_random(w, 24, -1, 1);
  fill_random(bias, 2, -1, 1);
  ob *b = ob_new(11);
  ob_input(b, "x", 4, xd);
  ob_init_f32(b, "W", 4, wd, w);
  ob_init_f32(b, "b", 4, bd, bias);
  ob_init_f32(b, "sc", 1, pd, sc);
  ob_init_f32(b, "sh", 1, pd, sh);
  ob_init_f32(b, "mean", 1, pd, mean);
  ob_init_f32(b, "var", 1, pd, var);
  int n = ob_node(b, "ConvTranspose", "ct", 2, "x", "W");
  ob_attr_ints(b, n, "strides", 2, st);
  ob_node(b, "Add", "a", 2, "ct", "b");
  ob_node(b, "BatchNormalization", "bn", 5, "a", "sc", "sh", "mean", "var");
  ob_node(b, "Relu", "y", 1, "bn");
  ob_output(b, "y");
  es_graph g;
  lowered_graph(b, &g);
  assert_int_equal(g.n_nodes, 2);
  assert_int_equal(graph_count(&g, ES_OP_ConvTranspose), 1);
  assert_int_equal(graph_count(&g, ES_OP_Relu), 1);
  es__graph_fini(&g);
  feed f = {0};
  feed_add(&f, "x", 4, xd);
  assert_int_equal(check_same(b, &f, 1e-4f), 2);
  feed_free(&f);
  free(b);
}

/* Relu, Mul, Add, then a Conv: into the Conv's weights when it has no
 * padding (1x1), not when it pads (3x3, pad 1: the zeros it pads with are
 * not mapped), where the Mul and Add become one fused elementwise node. */
static void test_affine_before_conv(void **state) {
  (void)state;
  static const int64_t xd[4] = {1, 4, 5, 5}, w1d[4] = {6, 4, 1, 1}, w3d[4] = {6, 4, 3, 3},
                       one[1] = {1}, chan[4] = {1, 4, 1, 1};
  static float w1[24], w3[216], s_ = 0.6f, per[4] = {0.5f, 2, -1, 0.1f};
  fill_random(w1, 24, -1, 1);
  fill_random(w3, 216, -1, 1);
  for (int k = 1; k <= 3; k += 2) {
    ob *b = ob_new(13);
    ob_input(b, "x", 4, xd);
    ob_init_f32(b, "W", 4, k == 1 ? w1d : w3d, k == 1 ? w1 : w3);
    ob_init_f32(b, "s", 1, one, &s_);
    ob_init_f32(b, "t", 4, chan, per);
    ob_node(b, "Relu", "r", 1, "x");
    ob_node(b, "Mul", "m", 2, "r", "s");
    ob_node(b, "Add", "a", 2, "t", "m");
    add_conv(b, "a", "W", NULL, "y", k, k / 2);
    ob_output(b, "y");
    es_graph g;
    lowered_graph(b, &g);
    if (k == 1) {
      assert_int_equal(g.n_nodes, 2); /* Relu, Conv */
      assert_int_equal(graph_count(&g, ES_OP_Relu), 1);
    } else {
      assert_int_equal(g.n_nodes, 2); /* FusedElementwise(Relu, Mul, Add), Conv */
      assert_int_equal(graph_count(&g, ES_OP_FusedElementwise), 1);
    }
    es__graph_fini(&g);
    feed f = {0};
    feed_add(&f, "x", 4, xd);
    check_same(b, &f, 1e-4f);
    feed_free(&f);
    free(b);
  }
}

/* ==========================================================================
 * Zero padding into the window that reads it
 * ======================================================================== */

/* x [1,4,6,7] -> Pad -> a window node -> y. Each case: what reads the
 * padding, how it pads, and how many nodes must be left. */
static void test_pad_into_window(void **state) {
  (void)state;
  static const int64_t xd[4] = {1, 4, 6, 7}, pd8[1] = {8}, wd[4] = {5, 4, 3, 3},
                       k3[2] = {3, 3}, st2[2] = {2, 2}, own1[4] = {1, 1, 1, 1},
                       sp[8] = {0, 0, 1, 2, 0, 0, 2, 1}, batch[8] = {1, 0, 1, 1, 0, 0, 1, 1};
  static float w[180], one_ = 1.0f;
  fill_random(w, 180, -1, 1);
  /* The first five fuse; from AVG_VALUE1 on the Pad must stay. */
  enum { AVG, AVG_STRIDE, AVG_OWN_INC, CONV, CONV_OPSET9,
         AVG_VALUE1, AVG_OWN_EXCL, AVG_CEIL, MAXPOOL, CONV_BATCH, REFLECT, N_CASES };
  for (int c = 0; c < N_CASES; c++) {
    ob *b = ob_new(c == CONV_OPSET9 ? 9 : 13);
    ob_input(b, "x", 4, xd);
    int n;
    if (c == CONV_OPSET9) {
      n = ob_node(b, "Pad", "p", 1, "x");
      ob_attr_ints(b, n, "pads", 8, sp);
    } else {
      ob_init_i64(b, "pads", 1, pd8, c == CONV_BATCH ? batch : sp);
      if (c == AVG_VALUE1) {
        ob_init_f32(b, "v", 0, NULL, &one_);
        n = ob_node(b, "Pad", "p", 3, "x", "pads", "v");
      } else {
        n = ob_node(b, "Pad", "p", 2, "x", "pads");
      }
      if (c == REFLECT)
        ob_attr_string(b, n, "mode", "reflect");
    }
    if (c == CONV || c == CONV_OPSET9 || c == CONV_BATCH) {
      ob_init_f32(b, "W", 4, wd, w);
      n = ob_node(b, "Conv", "y", 2, "p", "W");
      ob_attr_ints(b, n, "pads", 4, own1);
    } else {
      n = ob_node(b, c == MAXPOOL ? "MaxPool" : "AveragePool", "y", 1, "p");
      ob_attr_ints(b, n, "kernel_shape", 2, k3);
      if (c == AVG_STRIDE || c == AVG_CEIL)
        ob_attr_ints(b, n, "strides", 2, st2);
      if (c == AVG_CEIL)
        ob_attr_int(b, n, "ceil_mode", 1);
      if (c == AVG_OWN_INC || c == AVG_OWN_EXCL)
        ob_attr_ints(b, n, "pads", 4, own1);
      if (c == AVG_OWN_INC)
        ob_attr_int(b, n, "count_include_pad", 1);
    }
    ob_output(b, "y");
    es_graph g;
    lowered_graph(b, &g);
    int want = c < AVG_VALUE1 ? 1 : 2;
    if (g.n_nodes != want || graph_count(&g, ES_OP_Pad) != want - 1)
      fail_msg("case %d: %d nodes (%d Pad), want %d", c, g.n_nodes, graph_count(&g, ES_OP_Pad),
               want);
    es__graph_fini(&g);
    feed f = {0};
    feed_add(&f, "x", 4, xd);
    check_same(b, &f, 1e-5f);
    feed_free(&f);
    free(b);
  }
}

/* A Concat of a tensor with float32 zero constants (BlazeFace's channel
 * padding of a residual shortcut) becomes a Pad: zeros after, before and
 * on both sides of the channels between convolutions (channels-last, the
 * Pad runs on NHWC without conversions), and in the opset 9 attribute
 * form; the zeros leave the weights. It stays a Concat where a constant is
 * not all zeros (-0 included), where two tensors are joined, or where the
 * constant's other dims differ from the tensor's (the load must still
 * refuse that model as the unfused one does). */
static void test_zero_concat(void **state) {
  (void)state;
  static const int64_t xd[4] = {1, 4, 5, 5}, wd[4] = {4, 4, 3, 3}, w2d[4] = {7, 7, 1, 1},
                       z2[4] = {1, 2, 5, 5}, z1[4] = {1, 1, 5, 5}, zbad[4] = {1, 3, 5, 4};
  static float w[144], w2[49], zeros[64], negz[64];
  fill_random(w, 144, -1, 1);
  fill_random(w2, 49, -1, 1);
  for (int i = 0; i < 50; i++)
    negz[i] = i == 7 ? -0.0f : 0.0f;
  enum { AFTER, BEFORE, BOTH, OPSET9, NEG_ZERO, TWO_TENSORS, MISMATCH, N_CASES };
  for (int c = 0; c < N_CASES; c++) {
    ob *b = ob_new(c == OPSET9 ? 9 : 13);
    ob_input(b, "x", 4, xd);
    ob_init_f32(b, "W", 4, wd, w);
    ob_init_f32(b, "W2", 4, w2d, w2);
    ob_init_f32(b, "z2", 4, z2, c == NEG_ZERO ? negz : zeros);
    ob_init_f32(b, "z1", 4, z1, zeros);
    ob_init_f32(b, "zbad", 4, zbad, zeros);
    add_conv(b, "x", "W", NULL, "c", 3, 1);
    int n;
    if (c == BEFORE)
      n = ob_node(b, "Concat", "p", 3, "z2", "z1", "c");
    else if (c == BOTH)
      n = ob_node(b, "Concat", "p", 3, "z1", "c", "z2");
    else if (c == TWO_TENSORS)
      n = ob_node(b, "Concat", "p", 3, "c", "z1", "x");
    else if (c == MISMATCH)
      n = ob_node(b, "Concat", "p", 2, "c", "zbad");
    else
      n = ob_node(b, "Concat", "p", 3, "c", "z2", "z1");
    ob_attr_int(b, n, "axis", c == OPSET9 ? 1 : -3);
    if (c == TWO_TENSORS) {
      static const int64_t w3d[4] = {9, 9, 1, 1};
      static float w3[81];
      fill_random(w3, 81, -1, 1);
      ob_init_f32(b, "W3", 4, w3d, w3);
      add_conv(b, "p", "W3", NULL, "y", 1, 0);
    } else {
      add_conv(b, "p", "W2", NULL, "y", 1, 0); /* reads the padded channels */
    }
    ob_output(b, "y");
    if (c == MISMATCH) { /* refused by the Concat, fused or not */
      size_t size;
      uint8_t *buf = ob_pack(b, &size);
      es_model *m;
      for (int fu = 0; fu < 2; fu++) {
        fuse_set(fu);
        int rc = es_model_load_buffer(buf, size, NULL, &m);
        if (rc == 0) {
          es_plan *pl;
          es_tensor_info in = {.name = "x", .dtype = ES_DTYPE_FLOAT, .rank = 4,
                               .dims = {1, 4, 5, 5}};
          assert_true(es_model_plan(m, &in, 1, &pl) < 0);
          es_model_release(m);
        }
      }
      fuse_set(1);
      free(buf);
      free(b);
      continue;
    }
    es_graph g;
    lowered_graph(b, &g);
    int fused = c <= OPSET9;
    if (graph_count(&g, ES_OP_Pad) != fused || graph_count(&g, ES_OP_Concat) != !fused)
      fail_msg("case %d: %d Pad, %d Concat; want %d Pad", c, graph_count(&g, ES_OP_Pad),
               graph_count(&g, ES_OP_Concat), fused);
    es__graph_fini(&g);
    es_model *m0 = load_model(b, 0), *m1 = load_model(b, 1);
    es_model_stats s0, s1;
    ES_CHECK_RC(es_model_stats_get(m0, &s0));
    ES_CHECK_RC(es_model_stats_get(m1, &s1));
    if (fused) /* the zeros are gone (the pads are 8 int64 at most) */
      assert_true(s1.weight_bytes + 3 * 25 * sizeof(float) - 64 <= s0.weight_bytes);
    es_model_release(m0);
    es_model_release(m1);
    feed f = {0};
    feed_add(&f, "x", 4, xd);
    check_same(b, &f, 1e-5f);
    feed_free(&f);
    free(b);
  }
}

/* A Relu alone after an inference BatchNormalization that no convolution
 * took becomes the BatchNormalization's "_relu" (DenseNet's pre-activation):
 * plain input, and channels-last between convolutions (Concat of two convs,
 * BatchNormalization, Relu, Conv). The pair stays when the
 * BatchNormalization's output is read elsewhere too. */
static void test_bn_relu(void **state) {
  (void)state;
  static const int64_t xd[4] = {2, 6, 5, 4}, cd[1] = {6}, wd[4] = {3, 6, 1, 1},
                       w2d[4] = {4, 6, 3, 3}, one1[4] = {1, 1, 1, 1};
  static float scale[6], bias[6], mean[6], var[6], w[18], w2[216];
  fill_random(scale, 6, -2, 2);
  fill_random(bias, 6, -1, 1);
  fill_random(mean, 6, -0.5f, 0.5f);
  fill_random(var, 6, 0.1f, 2);
  fill_random(w, 18, -1, 1);
  fill_random(w2, 216, -1, 1);
  enum { PLAIN, BETWEEN_CONVS, READ_TWICE, N_CASES };
  for (int c = 0; c < N_CASES; c++) {
    ob *b = ob_new(13);
    ob_input(b, "x", 4, xd);
    ob_init_f32(b, "s", 1, cd, scale);
    ob_init_f32(b, "bb", 1, cd, bias);
    ob_init_f32(b, "m", 1, cd, mean);
    ob_init_f32(b, "v", 1, cd, var);
    const char *bn_in = "x";
    if (c == BETWEEN_CONVS) {
      ob_init_f32(b, "W", 4, wd, w);
      ob_init_f32(b, "W2", 4, wd, w2);
      ob_node(b, "Conv", "c1", 2, "x", "W");
      ob_node(b, "Conv", "c2", 2, "x", "W2");
      int n = ob_node(b, "Concat", "cat", 2, "c1", "c2");
      ob_attr_int(b, n, "axis", 1);
      bn_in = "cat";
    }
    int n = ob_node(b, "BatchNormalization", "bn", 5, bn_in, "s", "bb", "m", "v");
    ob_attr_float(b, n, "epsilon", 1e-3f);
    ob_node(b, "Relu", c == BETWEEN_CONVS ? "r" : "y", 1, "bn");
    if (c == BETWEEN_CONVS) {
      ob_init_f32(b, "W3", 4, w2d, w2);
      n = ob_node(b, "Conv", "y", 2, "r", "W3");
      ob_attr_ints(b, n, "pads", 4, one1);
    }
    ob_output(b, "y");
    if (c == READ_TWICE)
      ob_output(b, "bn");
    es_graph g;
    lowered_graph(b, &g);
    const es_node *bn = graph_find(&g, ES_OP_BatchNormalization);
    int fused = c != READ_TWICE;
    assert_non_null(bn);
    if (graph_count(&g, ES_OP_Relu) != !fused || (es__node_attr(bn, "_relu") != NULL) != fused)
      fail_msg("case %d: %d Relu, _relu %s; want %s", c, graph_count(&g, ES_OP_Relu),
               es__node_attr(bn, "_relu") ? "set" : "unset", fused ? "fused" : "not fused");
    es__graph_fini(&g);
    feed f = {0};
    feed_add(&f, "x", 4, xd);
    check_same(b, &f, 1e-5f);
    feed_free(&f);
    free(b);
  }
}

/* ==========================================================================
 * What must not fuse
 * ======================================================================== */

static void test_conv_not_fused(void **state) {
  (void)state;
  static const int64_t bc[4] = {1, 6, 1, 1}, full[3] = {6, 5, 5};
  static float cfull[150];
  fill_random(cfull, 150, -1, 1);
  for (int c = 0; c < 5; c++) {
    ob *b = conv_model(13, 1);
    feed f;
    feed_conv(&f);
    int want = 2;
    switch (c) {
    case 0: /* the conv's output is also a graph output */
      ob_node(b, "Relu", "y", 1, "c");
      ob_output(b, "y");
      ob_output(b, "c");
      break;
    case 1: /* two readers outside any pattern */
      ob_node(b, "Relu", "y", 1, "c");
      ob_node(b, "Sigmoid", "z", 1, "c");
      ob_output(b, "y");
      ob_output(b, "z");
      want = 3;
      break;
    case 2: /* Add of a runtime tensor that broadcasts */
      ob_input(b, "r", 4, bc);
      feed_add(&f, "r", 4, bc);
      ob_node(b, "Add", "y", 2, "c", "r");
      ob_output(b, "y");
      break;
    case 3: /* Add of a constant that is not per channel */
      ob_init_f32(b, "k", 3, full, cfull);
      ob_node(b, "Add", "y", 2, "c", "k");
      ob_output(b, "y");
      break;
    default: { /* Add of an input whose shape is not proven equal */
      static const int64_t rd[4] = {1, 6, -1, -1}, rs[4] = {1, 6, 5, 5};
      ob_input(b, "r", 4, rd);
      feed_add(&f, "r", 4, rs);
      ob_node(b, "Add", "y", 2, "c", "r");
      ob_output(b, "y");
      break;
    }
    }
    es_graph g;
    char buf[64];
    lowered_graph(b, &g);
    if (g.n_nodes != want || strcmp(post_codes(graph_find(&g, ES_OP_Conv), buf, sizeof buf), ""))
      fail_msg("case %d: %d nodes, post-ops '%s'; want %d nodes and none", c, g.n_nodes, buf,
               want);
    es__graph_fini(&g);
    check_same(b, &f, 1e-4f);
    feed_free(&f);
    free(b);
  }
}

/* ==========================================================================
 * MatMul bias and post-ops
 * ======================================================================== */

/* x [2,5,8] -> MatMul by a constant [8,12] (w_input: by an input) -> "c";
 * the caller adds the pattern after "c". */
static float mm_w_[8 * 12], mm_b_[12], mm_b2_[5 * 12];
static float ksqrt2_ = 1.41421356f, krsqrt2_ = 0.70710678f, khalf_ = 0.5f, ksqrt3_ = 1.7320508f;

static ob *matmul_model(int64_t opset, int w_input) {
  static const int64_t xd[3] = {2, 5, 8}, wd[2] = {8, 12};
  fill_random(mm_w_, 96, -0.5f, 0.5f);
  fill_random(mm_b_, 12, -1, 1);
  fill_random(mm_b2_, 60, -1, 1);
  ob *b = ob_new(opset);
  ob_input(b, "x", 3, xd);
  if (w_input)
    ob_input(b, "W", 2, wd);
  else
    ob_init_f32(b, "W", 2, wd, mm_w_);
  ob_node(b, "MatMul", "c", 2, "x", "W");
  ob_init_f32(b, "sqrt2", 0, NULL, &ksqrt2_);
  ob_init_f32(b, "rsqrt2", 0, NULL, &krsqrt2_);
  ob_init_f32(b, "sqrt3", 0, NULL, &ksqrt3_);
  ob_init_f32(b, "half", 0, NULL, &khalf_);
  ob_init_f32(b, "one", 0, NULL, &k1_);
  return b;
}

/* GELU's erf form after value v, ending in out: form 0 (v a) 0.5 with a
 * Div by sqrt 2 (PyTorch's export), 1 (v 0.5) a with a Mul by 1 / sqrt 2,
 * 2 v (a 0.5); form 3 divides by sqrt 3 (not a GELU). */
static void gelu_spelt(ob *b, const char *v, const char *out, int form) {
  if (form == 1)
    ob_node(b, "Mul", "g_d", 2, v, "rsqrt2");
  else
    ob_node(b, "Div", "g_d", 2, v, form == 3 ? "sqrt3" : "sqrt2");
  ob_node(b, "Erf", "g_e", 1, "g_d");
  ob_node(b, "Add", "g_a", 2, "g_e", "one");
  if (form == 1) {
    ob_node(b, "Mul", "g_m", 2, "half", v);
    ob_node(b, "Mul", out, 2, "g_a", "g_m");
  } else if (form == 2) {
    ob_node(b, "Mul", "g_h", 2, "g_a", "half");
    ob_node(b, "Mul", out, 2, v, "g_h");
  } else {
    ob_node(b, "Mul", "g_m", 2, v, "g_a");
    ob_node(b, "Mul", out, 2, "g_m", "half");
  }
}

/* Loads b, expects one MatMul with the given inputs and codes among nodes
 * nodes, and compares the fused run with the unfused one, on oneDNN and on
 * the reference loops. */
static void expect_matmul_post(const ob *b, const feed *f, int nodes, int n_in, const char *codes) {
  es_graph g;
  char buf[64];
  lowered_graph(b, &g);
  const es_node *mm = graph_find(&g, ES_OP_MatMul);
  assert_non_null(mm);
  if (g.n_nodes != nodes || mm->n_in != n_in || strcmp(post_codes(mm, buf, sizeof buf), codes))
    fail_msg("fused graph has %d nodes, a MatMul of %d inputs and post-ops '%s'; want %d, %d "
             "and '%s'", g.n_nodes, mm->n_in, buf, nodes, n_in, codes);
  es__graph_fini(&g);
  for (int ref = 0; ref < 2; ref++) {
    es__kernels_use_reference(ref);
    assert_int_equal(check_same(b, f, 1e-5f), nodes);
  }
  es__kernels_use_reference(0);
}

static void test_matmul_bias_gelu(void **state) {
  (void)state;
  static const int64_t xd[3] = {2, 5, 8}, bd[1] = {12}, rd[3] = {2, 5, 12};
  for (int form = 0; form < 7; form++) {
    /* 0-2: the spelt-out forms; 3: a Gelu node; 4: its tanh form; 5: the
     * bias as [1, 1, 12] then a residual Add; 6: a bias without GELU */
    ob *b = matmul_model(form == 3 || form == 4 ? 20 : 13, 0);
    feed f = {0};
    feed_add(&f, "x", 3, xd);
    if (form == 5) {
      static const int64_t b3[3] = {1, 1, 12};
      ob_init_f32(b, "B", 3, b3, mm_b_);
    } else {
      ob_init_f32(b, "B", 1, bd, mm_b_);
    }
    /* the Add's operands either way round */
    ob_node(b, "Add", "cb", 2, form == 1 ? "B" : "c", form == 1 ? "c" : "B");
    const char *codes = "8";
    if (form <= 2) {
      gelu_spelt(b, "cb", "y", form);
    } else if (form <= 4) {
      int n = ob_node(b, "Gelu", "y", 1, "cb");
      if (form == 4) {
        ob_attr_string(b, n, "approximate", "tanh");
        codes = "9";
      }
    } else if (form == 5) {
      ob_input(b, "r", 3, rd);
      feed_add(&f, "r", 3, rd);
      gelu_spelt(b, "cb", "gy", 0);
      ob_node(b, "Add", "y", 2, "r", "gy");
      codes = "8,7";
    } else {
      ob_node(b, "Relu", "y", 1, "cb");
      codes = "1";
    }
    ob_output(b, "y");
    expect_matmul_post(b, &f, 1, form == 5 ? 4 : 3, codes);
    feed_free(&f);
    free(b);
  }
}

/* What must stay: a bias that is not over N alone, a Div by sqrt 3, a
 * MatMul whose weights are an input. */
static void test_matmul_not_fused(void **state) {
  (void)state;
  static const int64_t xd[3] = {2, 5, 8}, b2d[2] = {5, 12}, bd[1] = {12}, wd[2] = {8, 12};
  for (int c = 0; c < 3; c++) {
    ob *b = matmul_model(13, c == 2);
    feed f = {0};
    feed_add(&f, "x", 3, xd);
    int want_nodes, want_in = 2;
    if (c == 0) { /* [5, 12]: a bias per row and column */
      ob_init_f32(b, "B", 2, b2d, mm_b2_);
      ob_node(b, "Add", "y", 2, "c", "B");
      want_nodes = 2;
    } else if (c == 1) { /* bias fused, the rest stays elementwise */
      ob_init_f32(b, "B", 1, bd, mm_b_);
      ob_node(b, "Add", "cb", 2, "c", "B");
      gelu_spelt(b, "cb", "y", 3);
      want_nodes = 2;
      want_in = 3;
    } else { /* weights from an input */
      feed_add(&f, "W", 2, wd);
      ob_init_f32(b, "B", 1, bd, mm_b_);
      ob_node(b, "Add", "y", 2, "c", "B");
      want_nodes = 2;
    }
    ob_output(b, "y");
    es_graph g;
    char buf[64];
    lowered_graph(b, &g);
    const es_node *mm = graph_find(&g, ES_OP_MatMul);
    if (g.n_nodes != want_nodes || mm->n_in != want_in ||
        strcmp(post_codes(mm, buf, sizeof buf), ""))
      fail_msg("case %d: %d nodes, MatMul of %d inputs, post-ops '%s'; want %d, %d and none", c,
               g.n_nodes, mm->n_in, buf, want_nodes, want_in);
    es__graph_fini(&g);
    check_same(b, &f, 1e-5f);
    feed_free(&f);
    free(b);
  }
}

/* ==========================================================================
 * LayerNorm
 * ======================================================================== */

static float ln_gamma_[8], ln_beta_[8], ln_eps_ = 1e-5f;

/* x [2,3,8] -> decomposed LayerNorm over the last axis -> y. axis: the
 * ReduceMeans' axis; leak: also output the Sub's result. */
static ob *ln_model(int64_t axis, int leak) {
  static const int64_t xd[3] = {2, 3, 8}, pd[1] = {8};
  static int64_t ax[1];
  ax[0] = axis;
  fill_random(ln_gamma_, 8, 0.5f, 2);
  fill_random(ln_beta_, 8, -1, 1);
  ob *b = ob_new(9);
  ob_input(b, "x", 3, xd);
  ob_init_f32(b, "gamma", 1, pd, ln_gamma_);
  ob_init_f32(b, "beta", 1, pd, ln_beta_);
  ob_init_f32(b, "two", 0, NULL, &k2_);
  ob_init_f32(b, "eps", 0, NULL, &ln_eps_);
  int n = ob_node(b, "ReduceMean", "m", 1, "x");
  ob_attr_ints(b, n, "axes", 1, ax);
  ob_attr_int(b, n, "keepdims", 1);
  ob_node(b, "Sub", "d", 2, "x", "m");
  ob_node(b, "Pow", "p", 2, "d", "two");
  n = ob_node(b, "ReduceMean", "v", 1, "p");
  ob_attr_ints(b, n, "axes", 1, ax);
  ob_node(b, "Add", "e", 2, "v", "eps");
  ob_node(b, "Sqrt", "s", 1, "e");
  ob_node(b, "Div", "nrm", 2, "d", "s");
  ob_node(b, "Mul", "g", 2, "nrm", "gamma");
  ob_node(b, "Add", "y", 2, "beta", "g");
  ob_output(b, "y");
  if (leak)
    ob_output(b, "d");
  return b;
}

static void test_layernorm(void **state) {
  (void)state;
  static const int64_t xd[3] = {2, 3, 8};
  for (int axis = -1; axis <= 2; axis += 3) { /* -1 and 2 name the same axis */
    ob *b = ln_model(axis, 0);
    es_graph g;
    lowered_graph(b, &g);
    assert_int_equal(g.n_nodes, 1);
    const es_node *ln = graph_find(&g, ES_OP_LayerNorm);
    assert_non_null(ln);
    assert_int_equal(ln->n_in, 3);
    assert_string_equal(g.values[ln->in[0]].name, "x");
    assert_string_equal(g.values[ln->in[1]].name, "gamma");
    assert_string_equal(g.values[ln->in[2]].name, "beta");
    assert_true(es__node_attr(ln, "epsilon")->f == ln_eps_);
    es__graph_fini(&g);
    feed f = {0};
    feed_add(&f, "x", 3, xd);
    /* a large common offset: the variance must not cancel */
    for (int i = 0; i < 48; i++)
      f.data[0][i] += 100;
    assert_int_equal(check_same(b, &f, 1e-4f), 1);
    feed_free(&f);
    free(b);
  }
}

static void test_layernorm_not_fused(void **state) {
  (void)state;
  static const int64_t xd[3] = {2, 3, 8};
  for (int c = 0; c < 2; c++) {
    /* 0: over axis 1, not the last; 1: the centred x is a graph output */
    ob *b = c == 0 ? ln_model(1, 0) : ln_model(-1, 1);
    es_graph g;
    lowered_graph(b, &g);
    assert_int_equal(graph_count(&g, ES_OP_LayerNorm), 0);
    assert_int_equal(graph_count(&g, ES_OP_ReduceMean), 2);
    es__graph_fini(&g);
    feed f = {0};
    feed_add(&f, "x", 3, xd);
    check_same(b, &f, 1e-4f);
    feed_free(&f);
    free(b);
  }
}

/* The kernel alone (es__kernel_eval): against the formula in double, with
 * gamma and beta of the row's length or broadcast from one value, and the
 * inputs it refuses. */
static int ln_eval(int64_t axis, const int64_t *gd, const float *x, const float *gamma,
                   const float *beta, float *y) {
  static const int64_t xd[2] = {3, 37};
  es_attr attrs[2] = {{.name = "epsilon", .type = ES_ATTR_FLOAT, .f = 1e-3f},
                      {.name = "axis", .type = ES_ATTR_INT, .i = axis}};
  es_knode nd = {.name = "ln", .op = ES_OP_LayerNorm, .n_attr = 2, .attrs = attrs};
  es_tdesc d[3];
  ES_CHECK_RC(es__tdesc_set(&d[0], ES_DTYPE_FLOAT, 2, xd));
  ES_CHECK_RC(es__tdesc_set(&d[1], ES_DTYPE_FLOAT, 1, gd));
  ES_CHECK_RC(es__tdesc_set(&d[2], ES_DTYPE_FLOAT, 1, gd));
  const es_tdesc *dp[3] = {&d[0], &d[1], &d[2]};
  const void *data[3] = {x, gamma, beta};
  es_tdesc od;
  void *o;
  int rc = es__kernel_eval(&nd, 17, 3, dp, data, 1, &od, &o);
  if (rc == 0) {
    assert_int_equal(od.count, 3 * 37);
    memcpy(y, o, od.nbytes);
    es_mem_free(o);
  }
  return rc;
}

static void test_layernorm_kernel(void **state) {
  (void)state;
  float x[3 * 37], gamma[37], beta[37], y[3 * 37];
  fill_random(x, 3 * 37, -2, 2);
  fill_random(gamma, 37, 0.5f, 2);
  fill_random(beta, 37, -1, 1);
  for (int i = 0; i < 37; i++)
    x[37 + i] += 1000; /* row 1: a large mean */
  for (int bc = 0; bc < 2; bc++) {
    int64_t gd[1] = {bc ? 1 : 37};
    ES_CHECK_RC(ln_eval(bc ? -1 : 1, gd, x, gamma, beta, y));
    for (int r = 0; r < 3; r++) {
      double mean = 0, var = 0;
      for (int i = 0; i < 37; i++)
        mean += x[r * 37 + i];
      mean /= 37;
      for (int i = 0; i < 37; i++)
        var += (x[r * 37 + i] - mean) * (x[r * 37 + i] - mean);
      var /= 37;
      for (int i = 0; i < 37; i++) {
        double want = (x[r * 37 + i] - mean) / sqrt(var + 1e-3) * gamma[bc ? 0 : i] +
                      beta[bc ? 0 : i];
        if (!(fabs(y[r * 37 + i] - want) <= 1e-4 * (1 + fabs(want))))
          fail_msg("row %d element %d: %.7g, want %.7g", r, i, (double)y[r * 37 + i], want);
      }
    }
  }
  static const int64_t bad[1] = {36}, good[1] = {37};
  assert_int_equal(ln_eval(-1, bad, x, gamma, beta, y), ES_EMODEL);
  assert_int_equal(ln_eval(0, good, x, gamma, beta, y), ES_ENOTSUP);
}

/* ==========================================================================
 * Elementwise chains
 * ======================================================================== */

/* ((x + 3) * g - 0.5) -> Sigmoid -> Pow 2 -> Relu, with g [4,1,1] a second
 * input broadcast per channel: one FusedElementwise with inputs x and g. */
static void test_elementwise_chain(void **state) {
  (void)state;
  static const int64_t xd[4] = {1, 4, 3, 5}, gd[3] = {4, 1, 1};
  ob *b = ob_new(13);
  ob_input(b, "x", 4, xd);
  ob_input(b, "g", 3, gd);
  ob_init_f32(b, "three", 0, NULL, &k3_);
  ob_init_f32(b, "half", 0, NULL, &kneg_);
  ob_init_f32(b, "two", 0, NULL, &k2_);
  ob_node(b, "Add", "a", 2, "x", "three");
  ob_node(b, "Mul", "m", 2, "g", "a");
  ob_node(b, "Add", "s", 2, "m", "half");
  ob_node(b, "Sigmoid", "sg", 1, "s");
  ob_node(b, "Pow", "p", 2, "sg", "two");
  ob_node(b, "Relu", "y", 1, "p");
  ob_output(b, "y");
  es_graph g;
  lowered_graph(b, &g);
  assert_int_equal(g.n_nodes, 1);
  const es_node *fe = graph_find(&g, ES_OP_FusedElementwise);
  assert_non_null(fe);
  assert_int_equal(fe->n_in, 2);
  const es_attr *prog = es__node_attr(fe, "_prog");
  assert_non_null(prog);
  assert_int_equal(prog->n, 6 * ES_FE_WORDS);
  es__graph_fini(&g);
  feed f = {0};
  feed_add(&f, "x", 4, xd);
  feed_add(&f, "g", 3, gd);
  assert_int_equal(check_same(b, &f, 1e-5f), 1);
  feed_free(&f);
  free(b);
}

/* A value read outside a chain ends it: the Add's result is also a graph
 * output, so Add stays and (Relu, Mul) fuse; a lone Sqrt is left alone. */
static void test_elementwise_boundaries(void **state) {
  (void)state;
  static const int64_t xd[2] = {3, 4};
  ob *b = ob_new(13);
  ob_input(b, "x", 2, xd);
  ob_init_f32(b, "three", 0, NULL, &k3_);
  ob_init_f32(b, "two", 0, NULL, &k2_);
  ob_node(b, "Add", "a", 2, "x", "three");
  ob_node(b, "Relu", "r", 1, "a");
  ob_node(b, "Mul", "y", 2, "r", "two");
  ob_node(b, "Sqrt", "z", 1, "x");
  ob_output(b, "y");
  ob_output(b, "a");
  ob_output(b, "z");
  es_graph g;
  lowered_graph(b, &g);
  assert_int_equal(g.n_nodes, 3);
  assert_int_equal(graph_count(&g, ES_OP_FusedElementwise), 1);
  assert_int_equal(graph_count(&g, ES_OP_Add), 1);
  assert_int_equal(graph_count(&g, ES_OP_Sqrt), 1);
  es__graph_fini(&g);
  feed f = {0};
  feed_add(&f, "x", 2, xd);
  for (int i = 0; i < 12; i++)
    f.data[0][i] = fabsf(f.data[0][i]);
  assert_int_equal(check_same(b, &f, 1e-5f), 3);
  feed_free(&f);
  free(b);
}

/* A one-element constant of higher rank than the inputs widens the output
 * (x [4] + k [1,1] is [1,4]): it must stay a node input, not an immediate. */
static void test_elementwise_rank_from_constant(void **state) {
  (void)state;
  static const int64_t xd[1] = {4}, kd[2] = {1, 1};
  static float k = 2.5f;
  ob *b = ob_new(13);
  ob_input(b, "x", 1, xd);
  ob_init_f32(b, "k", 2, kd, &k);
  ob_node(b, "Add", "a", 2, "x", "k");
  ob_node(b, "Relu", "y", 1, "a");
  ob_output(b, "y");
  feed f = {0};
  feed_add(&f, "x", 1, xd);
  assert_int_equal(check_same(b, &f, 0), 1);
  es_model *m = load_model(b, 1);
  es_tensor_info info;
  es_plan *p;
  es_tensor_info shape = {.name = "x", .dtype = ES_DTYPE_FLOAT, .rank = 1, .dims = {4}};
  ES_CHECK_RC(es_model_plan(m, &shape, 1, &p));
  ES_CHECK_RC(es_plan_output_info(p, 0, &info));
  assert_int_equal(info.rank, 2);
  es_plan_release(p);
  es_model_release(m);
  feed_free(&f);
  free(b);
}

/* ==========================================================================
 * The five models
 * ======================================================================== */

static void count_op(void *user, const char *op, int count) {
  (void)op;
  *(int *)user += count;
}

static void test_real_models(void **state) {
  (void)state;
  static const char *const files[] = {"blazeface_front_128.onnx", "blazeface_back_256.onnx",
                                      "ppocr_cls.onnx", "ppocr_rec.onnx", "ppocr_det.onnx"};
  const char *dir = getenv("ES_MODEL_DIR");
  char path[1024];
  int found = 0;
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    snprintf(path, sizeof path, "%s/%s", dir ? dir : ES_SOURCE_DIR "/.cache/models", files[i]);
    es_model *plain, *fused;
    fuse_set(0);
    int rc = es_model_load(path, NULL, &plain);
    fuse_set(1);
    if (rc == ES_ENOENT)
      continue;
    ES_CHECK_RC(rc);
    ES_CHECK_RC(es_model_load(path, NULL, &fused));
    found++;
    es_model_stats a, b;
    ES_CHECK_RC(es_model_stats_get(plain, &a));
    ES_CHECK_RC(es_model_stats_get(fused, &b));
    int counted = 0;
    ES_CHECK_RC(es_model_op_counts(fused, count_op, &counted));
    assert_int_equal((size_t)counted, b.nodes);
    printf("# %-26s %4zu nodes -> %4zu fused\n", files[i], a.nodes, b.nodes);
    assert_true(b.nodes < a.nodes);
    es_model_release(plain);
    es_model_release(fused);
  }
  if (!found)
    skip(); /* models not fetched: scripts/setup/fetch-models.sh */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_conv_relu_sigmoid_hardsigmoid),
      cmocka_unit_test(test_conv_clip_forms),
      cmocka_unit_test(test_conv_hardswish),
      cmocka_unit_test(test_conv_swish),
      cmocka_unit_test(test_conv_residual),
      cmocka_unit_test(test_conv_residual_symbolic),
      cmocka_unit_test(test_affine_after_conv),
      cmocka_unit_test(test_affine_after_conv_transpose),
      cmocka_unit_test(test_affine_before_conv),
      cmocka_unit_test(test_conv_not_fused),
      cmocka_unit_test(test_zero_concat),
      cmocka_unit_test(test_matmul_bias_gelu),
      cmocka_unit_test(test_matmul_not_fused),
      cmocka_unit_test(test_layernorm),
      cmocka_unit_test(test_layernorm_not_fused),
      cmocka_unit_test(test_pad_into_window),
      cmocka_unit_test(test_bn_relu),
      cmocka_unit_test(test_layernorm_kernel),
      cmocka_unit_test(test_elementwise_chain),
      cmocka_unit_test(test_elementwise_boundaries),
      cmocka_unit_test(test_elementwise_rank_from_constant),
      cmocka_unit_test(test_real_models),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
