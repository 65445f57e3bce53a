/* Kernels of the sample family: GridSample, RoiAlign, MaxUnpool, TopK, Det.
 *
 * ONNX's node tests cover GridSample in 2-D at opset 16; here every mode
 * (the opset-16 and opset-20 names) samples the exact pixels back from a
 * grid through their centres, in 2-D and 3-D (5-D X); linear sampling of
 * a linear function is exact inside; points far outside read zeros, the
 * edge (border) or their mirror image (reflection); NaN coordinates run
 * without undefined behaviour (the sanitizer build checks). TopK is
 * compared with a brute-force stable selection over random arrays full of
 * ties (and NaNs), every supported type, axis, k and direction, at opset
 * 1 (k attribute) and 11, and inside loaded models with K an initializer
 * or the input's own length (a shape chain folded while planning).
 * RoiAlign (covered by ONNX's node tests in avg mode with a fixed
 * sampling_ratio only): max mode takes the largest sample, each sample its
 * largest weighted corner; adaptive sampling takes ceil(bin size) samples
 * per side, seen through a single lit pixel that only the adaptive grid
 * touches; half_pixel equals output_half_pixel shifted by half a pixel;
 * rois pick their batch image; bad rois fail at run time.
 * Det is compared with the permutation expansion. MaxUnpool in 1-D and
 * 3-D, with a larger output_shape, and its run-time refusals. Invalid
 * nodes must fail with the right code. */
#include "es_test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernel.h"
#include "support/kernel_harness.h"
#include "support/onnx_builder.h"

static int64_t rnd(uint64_t *s, int64_t lo, int64_t hi) {
  return lo + (int64_t)(es_test_rand(s) % (uint64_t)(hi - lo + 1));
}

/* ==========================================================================
 * GridSample
 * ======================================================================== */

/* Runs GridSample on X (rank 4 or 5) and grid; returns the code. */
static int gs_eval(int64_t opset, const char *mode, const char *pad, int align,
                   const es_tdesc *xd, const float *x, const es_tdesc *gd, const float *g,
                   es_tdesc *out, void **od) {
  es_attr attrs[] = {KH_STR("mode", mode), KH_STR("padding_mode", pad),
                     KH_INT("align_corners", align)};
  es_knode node = kh_knode(ES_OP_GridSample, attrs, 3);
  const es_tdesc *in[] = {xd, gd};
  const void *data[] = {x, g};
  /* X and grid are request data */
  return kh_eval_with(&node, &(kh_opts){.opset = opset, .dyn = 3}, 2, in, data, 1, out, od);
}

/* The normalised coordinate of pixel i's centre along a dim of len. */
static float gs_norm(int64_t i, int64_t len, int align) {
  if (align)
    return len == 1 ? 0.0f : (float)(-1.0 + 2.0 * (double)i / (double)(len - 1));
  return (float)((2.0 * (double)i + 1) / (double)len - 1);
}

/* A grid over every pixel of X's spatial dims (r of them, dims d). */
static float *gs_identity_grid(int r, const int64_t *d, int align, int64_t *points) {
  int64_t n = 1;
  for (int i = 0; i < r; i++)
    n *= d[i];
  float *g = malloc((size_t)(n * r) * sizeof *g);
  for (int64_t p = 0; p < n; p++) {
    int64_t rest = p;
    for (int i = r - 1; i >= 0; i--) {
      /* component 0 is the last dim (x) */
      g[p * r + (r - 1 - i)] = gs_norm(rest % d[i], d[i], align);
      rest /= d[i];
    }
  }
  *points = n;
  return g;
}

static void test_gridsample_identity(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  static const char *const m16[] = {"nearest", "bilinear", "bicubic"};
  static const char *const m20[] = {"nearest", "linear", "cubic"};
  static const char *const pads[] = {"zeros", "border", "reflection"};
  for (int r = 2; r <= 3; r++)
    for (int m = 0; m < 3; m++)
      for (int align = 0; align < 2; align++)
        for (int pd = 0; pd < 3; pd++) {
          int64_t opset = r == 2 && rnd(&seed, 0, 1) ? 16 : 20;
          int64_t dims[5] = {2, 3, 0, 0, 0};
          for (int i = 0; i < r; i++)
            dims[2 + i] = rnd(&seed, 1, 6);
          es_tdesc xd = kh_td(ES_DTYPE_FLOAT, 2 + r, dims);
          float *x = malloc(xd.nbytes);
          kh_rand_f32(&seed, x, xd.count, -1, 1);
          int64_t points;
          float *g1 = gs_identity_grid(r, dims + 2, align, &points);
          float *g = malloc((size_t)(2 * points * r) * sizeof *g);
          memcpy(g, g1, (size_t)(points * r) * sizeof *g);
          memcpy(g + points * r, g1, (size_t)(points * r) * sizeof *g);
          int64_t gdims[5] = {2, dims[2], dims[3], dims[4], 0};
          gdims[1 + r] = r;
          es_tdesc gd = kh_td(ES_DTYPE_FLOAT, 2 + r, gdims), out;
          void *od;
          ES_CHECK_RC(gs_eval(opset, opset == 16 ? m16[m] : m20[m], pads[pd], align, &xd, x, &gd,
                              g, &out, &od));
          assert_true(es__tdesc_same_shape(&out, &xd));
          const float *y = od;
          for (size_t i = 0; i < xd.count; i++)
            if (!(fabsf(y[i] - x[i]) <= 1e-5f))
              fail_msg("GridSample %s %s align %d rank %d: [%zu] = %g, expected %g",
                       m20[m], pads[pd], align, 2 + r, i, (double)y[i], (double)x[i]);
          es_mem_free(od);
          free(g);
          free(g1);
          free(x);
        }
}

/* Linear sampling of X = a + sum_d b_d i_d at points whose taps all lie
 * inside gives the function's value; in 3-D too. */
static void test_gridsample_linear_fn(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  for (int r = 2; r <= 3; r++)
    for (int align = 0; align < 2; align++) {
      int64_t dims[5] = {1, 1, 5, 6, 7};
      es_tdesc xd = kh_td(ES_DTYPE_FLOAT, 2 + r, dims);
      float *x = malloc(xd.nbytes);
      double a = 0.25, b[3] = {0.5, -0.75, 0.125};
      for (size_t p = 0; p < xd.count; p++) {
        size_t rest = p;
        double v = a;
        for (int i = r - 1; i >= 0; i--) {
          v += b[i] * (double)(rest % (size_t)dims[2 + i]);
          rest /= (size_t)dims[2 + i];
        }
        x[p] = (float)v;
      }
      enum { P = 50 };
      float g[P * 3];
      double want[P];
      for (int p = 0; p < P; p++) {
        want[p] = a;
        for (int i = 0; i < r; i++) {
          double len = (double)dims[2 + i];
          double c = 0.5 + (len - 2) * (double)rnd(&seed, 0, 1000) / 1000.0; /* in [0.5, len-1.5] */
          g[p * r + (r - 1 - i)] =
              (float)(align ? 2 * c / (len - 1) - 1 : (2 * c + 1) / len - 1);
          want[p] += b[i] * c;
        }
      }
      int64_t gdims[5] = {1, P, 1, 1, 1};
      gdims[1 + r] = r;
      es_tdesc gd = kh_td(ES_DTYPE_FLOAT, 2 + r, gdims), out;
      void *od;
      ES_CHECK_RC(gs_eval(20, "linear", "zeros", align, &xd, x, &gd, g, &out, &od));
      const float *y = od;
      for (int p = 0; p < P; p++)
        if (!(fabs(y[p] - want[p]) <= 1e-4))
          fail_msg("linear GridSample rank %d align %d point %d: %g, expected %g", 2 + r, align,
                   p, (double)y[p], want[p]);
      es_mem_free(od);
      free(x);
    }
}

/* Far outside: zeros read 0, border the edge pixel, reflection the mirror
 * point inside; NaN coordinates run. */
static void test_gridsample_padding(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  float x[4 * 5];
  kh_rand_f32(&seed, x, 20, 1, 2); /* no zero pixel */
  es_tdesc xd = KH_TD(ES_DTYPE_FLOAT, 1, 1, 4, 5), gd = KH_TD(ES_DTYPE_FLOAT, 1, 1, 3, 2), out;
  /* (x, y) = right of the image, below it, and at the top-left corner beyond */
  float far[6] = {7.0f, 0.0f, 0.0f, 9.0f, -5.0f, -6.0f};
  static const char *const modes[] = {"nearest", "linear", "cubic"};
  void *od;
  for (int m = 0; m < 3; m++)
    for (int align = 0; align < 2; align++) {
      ES_CHECK_RC(gs_eval(20, modes[m], "zeros", align, &xd, x, &gd, far, &out, &od));
      for (int i = 0; i < 3; i++)
        assert_true(((float *)od)[i] == 0.0f);
      es_mem_free(od);
      ES_CHECK_RC(gs_eval(20, modes[m], "border", align, &xd, x, &gd, far, &out, &od));
      const float *y = od;
      /* clamped to the edge: column 4 at the middle row (y = 0 is between
       * rows 1 and 2 for linear; the corner pixel exactly) */
      assert_true(fabsf(y[2] - x[0]) <= 1e-6f);
      es_mem_free(od);
      /* reflection: u just past 1 reads what 2 - u (align) reads */
      float out_pt[2] = {1.3f, -0.2f}, in_pt[2] = {0.7f, -0.2f};
      if (!align) /* mirror about x = L - 0.5 in pixels: u' = 2 (L-1)/L... keep align only */
        continue;
      es_tdesc g1 = KH_TD(ES_DTYPE_FLOAT, 1, 1, 1, 2), o2;
      void *a, *b;
      ES_CHECK_RC(gs_eval(20, modes[m], "reflection", 1, &xd, x, &g1, out_pt, &o2, &a));
      ES_CHECK_RC(gs_eval(20, modes[m], "reflection", 1, &xd, x, &g1, in_pt, &o2, &b));
      assert_true(fabsf(*(float *)a - *(float *)b) <= 1e-5f);
      es_mem_free(a);
      es_mem_free(b);
    }
  float nan_grid[6] = {NAN, 0.0f, INFINITY, -INFINITY, 1e30f, -1e30f};
  static const char *const pads[] = {"zeros", "border", "reflection"};
  for (int m = 0; m < 3; m++)
    for (int p = 0; p < 3; p++) {
      ES_CHECK_RC(gs_eval(20, modes[m], pads[p], 0, &xd, x, &gd, nan_grid, &out, &od));
      es_mem_free(od);
    }
}

static void test_gridsample_errors(void **state) {
  (void)state;
  float x[2 * 2 * 2 * 2] = {0}, g[2 * 2 * 2 * 3] = {0};
  es_tdesc x4 = KH_TD(ES_DTYPE_FLOAT, 1, 1, 2, 2), g4 = KH_TD(ES_DTYPE_FLOAT, 1, 2, 2, 2);
  es_tdesc x5 = KH_TD(ES_DTYPE_FLOAT, 1, 1, 2, 2, 2), g5 = KH_TD(ES_DTYPE_FLOAT, 1, 1, 2, 2, 3);
  es_tdesc g4b = KH_TD(ES_DTYPE_FLOAT, 1, 2, 2, 3), g4n = KH_TD(ES_DTYPE_FLOAT, 2, 2, 2, 2);
  es_tdesc xi = KH_TD(ES_DTYPE_INT32, 1, 1, 2, 2), out;
  void *od;
  assert_int_equal(gs_eval(16, "bilinear", "zeros", 0, &x5, x, &g5, g, &out, &od), ES_EMODEL);
  ES_CHECK_RC(gs_eval(20, "linear", "zeros", 0, &x5, x, &g5, g, &out, &od));
  es_mem_free(od);
  assert_int_equal(gs_eval(16, "linear", "zeros", 0, &x4, x, &g4, g, &out, &od), ES_EMODEL);
  assert_int_equal(gs_eval(20, "bicubic", "zeros", 0, &x4, x, &g4, g, &out, &od), ES_EMODEL);
  assert_int_equal(gs_eval(20, "linear", "wrap", 0, &x4, x, &g4, g, &out, &od), ES_EMODEL);
  assert_int_equal(gs_eval(20, "linear", "zeros", 2, &x4, x, &g4, g, &out, &od), ES_EMODEL);
  assert_int_equal(gs_eval(20, "linear", "zeros", 0, &x4, x, &g4b, g, &out, &od), ES_EMODEL);
  assert_int_equal(gs_eval(20, "linear", "zeros", 0, &x4, x, &g4n, g, &out, &od), ES_EMODEL);
  assert_int_equal(gs_eval(20, "linear", "zeros", 0, &xi, x, &g4, g, &out, &od), ES_ENOTSUP);
}

/* ==========================================================================
 * TopK
 * ======================================================================== */

static double tk_val(es_dtype dt, const void *x, int64_t i) {
  switch (dt) {
  case ES_DTYPE_FLOAT:
    return ((const float *)x)[i];
  case ES_DTYPE_INT32:
    return ((const int32_t *)x)[i];
  case ES_DTYPE_INT64:
    return (double)((const int64_t *)x)[i];
  case ES_DTYPE_INT8:
    return ((const int8_t *)x)[i];
  default:
    return ((const uint8_t *)x)[i];
  }
}

/* a ranks before b: larger (or smaller) first, NaN largest, ties by index. */
static int tk_before(double va, int64_t a, double vb, int64_t b, int largest) {
  int na = va != va, nb = vb != vb;
  int gt = (na && !nb) || (!na && !nb && va > vb), lt = (nb && !na) || (!na && !nb && va < vb);
  if (gt || lt)
    return largest ? gt : lt;
  return a < b;
}

static void test_topk(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  static const es_dtype dts[] = {ES_DTYPE_FLOAT, ES_DTYPE_INT32, ES_DTYPE_INT64, ES_DTYPE_INT8,
                                 ES_DTYPE_UINT8};
  for (int iter = 0; iter < 200; iter++) {
    es_dtype dt = dts[iter % 5];
    int rank = (int)rnd(&seed, 1, 3);
    int64_t dims[3];
    for (int i = 0; i < rank; i++)
      dims[i] = rnd(&seed, 1, 9);
    int axis = (int)rnd(&seed, 0, rank - 1);
    int64_t n = dims[axis], kk = rnd(&seed, 0, n);
    int largest = (int)rnd(&seed, 0, 1), old = iter % 7 == 0;
    es_tdesc xd = kh_td(dt, rank, dims);
    void *x = malloc(xd.nbytes);
    for (size_t i = 0; i < xd.count; i++) {
      int64_t v = rnd(&seed, 0, 5); /* many ties */
      switch (dt) {
      case ES_DTYPE_FLOAT:
        ((float *)x)[i] = rnd(&seed, 0, 9) == 0 ? NAN : (float)v * 0.5f - 1;
        break;
      case ES_DTYPE_INT32:
        ((int32_t *)x)[i] = (int32_t)v - 3;
        break;
      case ES_DTYPE_INT64:
        ((int64_t *)x)[i] = (v - 3) * ((int64_t)1 << 40);
        break;
      case ES_DTYPE_INT8:
        ((int8_t *)x)[i] = (int8_t)(v * 40 - 100);
        break;
      default:
        ((uint8_t *)x)[i] = (uint8_t)(v * 50);
        break;
      }
    }
    int64_t axis_attr = axis - (rnd(&seed, 0, 1) ? rank : 0);
    es_attr attrs[4] = {KH_INT("axis", axis_attr), KH_INT("largest", largest),
                        KH_INT("sorted", 1), KH_INT("k", kk)};
    es_knode node = kh_knode(ES_OP_TopK, attrs, old ? 4 : 3);
    if (old) /* opset 1 has neither largest nor sorted */
      largest = 1, attrs[1] = KH_INT("k", kk), node = kh_knode(ES_OP_TopK, attrs, 2);
    es_tdesc kd = KH_TD(ES_DTYPE_INT64, 1), out[2];
    const es_tdesc *in[] = {&xd, &kd};
    const void *data[] = {x, &kk};
    void *od[2];
    ES_CHECK_RC(kh_eval_with(&node, &(kh_opts){.opset = old ? 1 : 11, .dyn = 1}, old ? 1 : 2, in,
                             data, 2, out, od));
    assert_int_equal(out[0].dtype, dt);
    assert_int_equal(out[1].dtype, ES_DTYPE_INT64);
    assert_int_equal(out[0].dims[axis], kk);
    int64_t outer = 1, inner = 1;
    for (int i = 0; i < axis; i++)
      outer *= dims[i];
    for (int i = axis + 1; i < rank; i++)
      inner *= dims[i];
    for (int64_t o = 0; o < outer; o++)
      for (int64_t j = 0; j < inner; j++) {
        /* selection: the r-th output is the element with exactly r elements before it */
        for (int64_t r = 0; r < kk; r++) {
          int64_t want = -1;
          for (int64_t i = 0; i < n && want < 0; i++) {
            double vi = tk_val(dt, x, (o * n + i) * inner + j);
            int64_t before = 0;
            for (int64_t t = 0; t < n; t++)
              before += t != i && tk_before(tk_val(dt, x, (o * n + t) * inner + j), t, vi, i,
                                            largest);
            if (before == r)
              want = i;
          }
          int64_t at = (o * kk + r) * inner + j;
          int64_t got = ((int64_t *)od[1])[at];
          if (got != want)
            fail_msg("TopK %s rank %d axis %d k %lld largest %d: index [%lld] = %lld, expected "
                     "%lld", es_dtype_name(dt), rank, axis, (long long)kk, largest,
                     (long long)at, (long long)got, (long long)want);
          double gv = tk_val(dt, od[0], at), wv = tk_val(dt, x, (o * n + want) * inner + j);
          assert_true(gv == wv || (gv != gv && wv != wv));
        }
      }
    es_mem_free(od[0]);
    es_mem_free(od[1]);
    free(x);
  }
}

static void test_topk_errors(void **state) {
  (void)state;
  float x[6] = {0};
  es_tdesc xd = KH_TD(ES_DTYPE_FLOAT, 2, 3), kd = KH_TD(ES_DTYPE_INT64, 1);
  es_tdesc k32 = KH_TD(ES_DTYPE_INT32, 1), k2 = KH_TD(ES_DTYPE_INT64, 2), out[2];
  int64_t four = 4, two[2] = {1, 1}, neg = -1, one = 1;
  void *od[2];
  es_knode n = kh_knode(ES_OP_TopK, NULL, 0);
  const es_tdesc *in[] = {&xd, &kd};
  const void *d4[] = {x, &four}, *dn[] = {x, &neg}, *d1[] = {x, &one};
  assert_int_equal(kh_eval_with(&n, &(kh_opts){.opset = 11}, 2, in, d4, 2, out, od), ES_EMODEL);
  assert_int_equal(kh_eval_with(&n, &(kh_opts){.opset = 11}, 2, in, dn, 2, out, od), ES_EMODEL);
  /* k from the data: the axis' length bounds the outputs, run sets their
   * shape, and a k out of range is the request's error */
  es_kinst kk;
  ES_CHECK_RC(kh_eval_with(&n, &(kh_opts){.opset = 11, .dyn = 2, .k_out = &kk}, 2, in, d1, 2,
                           out, od));
  assert_int_equal(kk.out_bound, 3);
  assert_int_equal(out[0].dims[1], 1);
  assert_int_equal(out[1].dims[1], 1);
  es_mem_free(od[0]);
  es_mem_free(od[1]);
  assert_int_equal(kh_eval_with(&n, &(kh_opts){.opset = 11, .dyn = 2}, 2, in, d4, 2, out, od),
                   ES_EINVAL);
  const es_tdesc *i32[] = {&xd, &k32}, *i2[] = {&xd, &k2};
  const void *dd[] = {x, two};
  assert_int_equal(kh_eval_with(&n, &(kh_opts){.opset = 11}, 2, i32, dd, 2, out, od), ES_EMODEL);
  assert_int_equal(kh_eval_with(&n, &(kh_opts){.opset = 11}, 2, i2, dd, 2, out, od), ES_EMODEL);
  es_attr ax[] = {KH_INT("axis", 2)};
  es_knode na = kh_knode(ES_OP_TopK, ax, 1);
  assert_int_equal(kh_eval_with(&na, &(kh_opts){.opset = 11}, 2, in, d1, 2, out, od), ES_EMODEL);
  /* opset 1 wants the attribute */
  assert_int_equal(kh_eval_with(&n, &(kh_opts){.opset = 1}, 1, in, d1, 2, out, od), ES_EMODEL);
}

/* K is an initializer: known while planning, as exporters write it. */
static void test_topk_in_model(void **state) {
  (void)state;
  static const int64_t k3 = 3;
  ob *b = ob_new(11);
  ob_input(b, "x", 2, (int64_t[]){-1, 6});
  ob_init_i64(b, "K", 1, (int64_t[]){1}, &k3);
  int t = ob_node(b, "TopK", "values", 2, "x", "K");
  ob_node_out(b, t, "indices");
  ob_attr_int(b, t, "largest", 0);
  ob_output(b, "values");
  es_model *m = ob_load(b);
  free(b);
  float x[12] = {5, 1, 4, 1, 3, 9, -2, 7, 7, -2, 0, 8};
  es_tensor in = ob_tensor_f32("x", 2, (int64_t[]){2, 6}, x);
  float *y;
  size_t count;
  ob_run(m, 1, &in, 1, &y, &count);
  assert_int_equal(count, 6);
  static const float want[6] = {1, 1, 3, -2, -2, 0};
  assert_memory_equal(y, want, sizeof want);
  free(y);
  es_model_release(m);
  /* K from the input's own shape (Shape with start 1, end 2): folded while
   * planning each shape, so the whole row comes back sorted */
  b = ob_new(15);
  ob_input(b, "x", 2, (int64_t[]){2, -1});
  int s = ob_node(b, "Shape", "K", 1, "x");
  ob_attr_int(b, s, "start", 1);
  ob_attr_int(b, s, "end", 2);
  t = ob_node(b, "TopK", "values", 2, "x", "K");
  ob_node_out(b, t, "indices");
  ob_output(b, "values");
  m = ob_load(b);
  free(b);
  in = ob_tensor_f32("x", 2, (int64_t[]){2, 6}, x);
  ob_run(m, 1, &in, 1, &y, &count);
  assert_int_equal(count, 12);
  static const float sorted[12] = {9, 5, 4, 3, 1, 1, 8, 7, 7, 0, -2, -2};
  assert_memory_equal(y, sorted, sizeof sorted);
  free(y);
  es_model_release(m);
}

/* ==========================================================================
 * Det
 * ======================================================================== */

/* Sum over permutations (Heap's order is not needed: recursion over rows). */
static double det_ref(const float *a, int m, int row, unsigned used) {
  if (row == m)
    return 1;
  double s = 0;
  int sign = 1;
  for (int c = 0; c < m; c++) {
    if (used & (1u << c))
      continue;
    s += sign * a[row * m + c] * det_ref(a, m, row + 1, used | (1u << c));
    sign = -sign;
  }
  return s;
}

static void test_det(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  for (int m = 0; m <= 6; m++) {
    enum { B = 3 };
    float a[B * 36];
    kh_rand_f32(&seed, a, B * 36, -2, 2);
    if (m >= 2) /* the second matrix singular: two equal rows */
      memcpy(a + m * m + m, a + m * m, (size_t)m * sizeof *a);
    es_tdesc xd = KH_TD(ES_DTYPE_FLOAT, B, m, m), out;
    void *od;
    es_knode n = kh_knode(ES_OP_Det, NULL, 0);
    ES_CHECK_RC(kh_eval1(&n, 11, &xd, a, &out, &od));
    assert_int_equal(out.rank, 1);
    assert_int_equal(out.dims[0], B);
    for (int b = 0; b < B; b++) {
      double want = det_ref(a + b * m * m, m, 0, 0);
      double got = ((float *)od)[b];
      if (!(fabs(got - want) <= 1e-4 * (1 + fabs(want))))
        fail_msg("Det %dx%d matrix %d: %g, expected %g", m, m, b, got, want);
    }
    es_mem_free(od);
  }
  float x[6] = {0};
  es_tdesc rect = KH_TD(ES_DTYPE_FLOAT, 2, 3), vec = KH_TD(ES_DTYPE_FLOAT, 6), out;
  es_tdesc xi = KH_TD(ES_DTYPE_INT32, 1, 1);
  void *od;
  es_knode n = kh_knode(ES_OP_Det, NULL, 0);
  assert_int_equal(kh_eval1(&n, 11, &rect, x, &out, &od), ES_EMODEL);
  assert_int_equal(kh_eval1(&n, 11, &vec, x, &out, &od), ES_EMODEL);
  assert_int_equal(kh_eval1(&n, 11, &xi, x, &out, &od), ES_ENOTSUP);
}

/* ==========================================================================
 * RoiAlign
 * ======================================================================== */

/* Runs RoiAlign (opset 16 unless ctm is NULL: opset 10) on X [n, c, h, w]
 * and r rois with their batch indices; returns the code. */
static int ra_eval(const char *mode, const char *ctm, int64_t ratio, int64_t oh, int64_t ow,
                   const es_tdesc *xd, const float *x, int64_t r, const float *rois,
                   const int64_t *bi, es_tdesc *out, void **od) {
  es_attr attrs[] = {KH_STR("mode", mode), KH_INT("sampling_ratio", ratio),
                     KH_INT("output_height", oh), KH_INT("output_width", ow),
                     KH_STR("coordinate_transformation_mode", ctm ? ctm : "")};
  es_knode node = kh_knode(ES_OP_RoiAlign, attrs, ctm ? 5 : 4);
  es_tdesc rd = KH_TD(ES_DTYPE_FLOAT, r, 4), bd = KH_TD(ES_DTYPE_INT64, r);
  const es_tdesc *in[] = {xd, &rd, &bd};
  const void *data[] = {x, rois, bi};
  return kh_eval_with(&node, &(kh_opts){.opset = ctm ? 16 : 10, .dyn = 7}, 3, in, data, 1, out,
                      od);
}

/* Max mode: samples on pixel centres (integer coordinates with
 * output_half_pixel) read one pixel each at weight 1, so a bin is the
 * largest of its sampled pixels, avg their mean; each roi reads its own
 * batch image and every channel. */
static void test_roialign_max(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  float x[2 * 2 * 5 * 5];
  kh_rand_f32(&seed, x, KH_LEN(x), 1, 2);
  es_tdesc xd = KH_TD(ES_DTYPE_FLOAT, 2, 2, 5, 5), out;
  /* roi 0..4 on batch 1, one bin of 2 x 2 samples: rows and cols 1 and 3 */
  float rois[4] = {0, 0, 4, 4};
  int64_t bi[1] = {1};
  void *od;
  for (int m = 0; m < 2; m++) {
    ES_CHECK_RC(ra_eval(m ? "max" : "avg", "output_half_pixel", 2, 1, 1, &xd, x, 1, rois, bi,
                        &out, &od));
    assert_int_equal(out.rank, 4);
    assert_int_equal(out.dims[0], 1);
    assert_int_equal(out.dims[1], 2);
    for (int c = 0; c < 2; c++) {
      const float *xc = x + (1 * 2 + c) * 25;
      float v[4] = {xc[1 * 5 + 1], xc[1 * 5 + 3], xc[3 * 5 + 1], xc[3 * 5 + 3]};
      float want = m ? fmaxf(fmaxf(v[0], v[1]), fmaxf(v[2], v[3]))
                     : (v[0] + v[1] + v[2] + v[3]) / 4;
      assert_true(fabsf(((float *)od)[c] - want) <= 1e-5f);
    }
    es_mem_free(od);
  }
  /* between pixels, max mode takes each sample's largest weighted corner:
   * all ones, samples at x.5 (2 x 2 bins of 1 pixel, 1 sample) give 0.25 */
  float ones[1 * 1 * 4 * 4];
  for (int i = 0; i < 16; i++)
    ones[i] = 1;
  es_tdesc od1 = KH_TD(ES_DTYPE_FLOAT, 1, 1, 4, 4);
  float r2[4] = {0, 0, 2, 2};
  int64_t b0[1] = {0};
  ES_CHECK_RC(ra_eval("max", "output_half_pixel", 1, 2, 2, &od1, ones, 1, r2, b0, &out, &od));
  for (int i = 0; i < 4; i++)
    assert_true(fabsf(((float *)od)[i] - 0.25f) <= 1e-6f);
  es_mem_free(od);
  ES_CHECK_RC(ra_eval("avg", "output_half_pixel", 1, 2, 2, &od1, ones, 1, r2, b0, &out, &od));
  for (int i = 0; i < 4; i++)
    assert_true(fabsf(((float *)od)[i] - 1.0f) <= 1e-6f);
  es_mem_free(od);
}

/* Adaptive sampling (sampling_ratio 0): a bin 4 high and 2 wide takes 4 x 2
 * samples at (0.5, 1.5, ...); only the one at (0.5, 0.5) touches pixel
 * (0, 0), at weight 1/4, so avg gives 1/4 / 8 and max 1/4 of the pixel.
 * Fixed grids of 1 or 2 per side miss the pixel. half_pixel with the roi
 * shifted by half a pixel gives the same. */
static void test_roialign_adaptive(void **state) {
  (void)state;
  float x[6 * 6] = {0};
  x[0] = 8;
  es_tdesc xd = KH_TD(ES_DTYPE_FLOAT, 1, 1, 6, 6), out;
  float rois[4] = {0, 0, 2, 4}; /* x1 y1 x2 y2 */
  float shifted[4] = {0.5f, 0.5f, 2.5f, 4.5f};
  int64_t bi[1] = {0};
  void *od;
  ES_CHECK_RC(ra_eval("avg", "output_half_pixel", 0, 1, 1, &xd, x, 1, rois, bi, &out, &od));
  assert_true(fabsf(*(float *)od - 8.0f / 4 / 8) <= 1e-6f);
  es_mem_free(od);
  ES_CHECK_RC(ra_eval("avg", NULL, 0, 1, 1, &xd, x, 1, rois, bi, &out, &od)); /* opset 10 */
  assert_true(fabsf(*(float *)od - 8.0f / 4 / 8) <= 1e-6f);
  es_mem_free(od);
  ES_CHECK_RC(ra_eval("avg", "half_pixel", 0, 1, 1, &xd, x, 1, shifted, bi, &out, &od));
  assert_true(fabsf(*(float *)od - 8.0f / 4 / 8) <= 1e-6f);
  es_mem_free(od);
  ES_CHECK_RC(ra_eval("max", "output_half_pixel", 0, 1, 1, &xd, x, 1, rois, bi, &out, &od));
  assert_true(fabsf(*(float *)od - 2.0f) <= 1e-6f);
  es_mem_free(od);
  for (int64_t ratio = 1; ratio <= 2; ratio++) {
    ES_CHECK_RC(ra_eval("avg", "output_half_pixel", ratio, 1, 1, &xd, x, 1, rois, bi, &out,
                        &od));
    assert_true(*(float *)od == 0.0f);
    es_mem_free(od);
  }
  /* with output_half_pixel a degenerate roi is 1 x 1: one adaptive sample
   * at (0.5, 0.5); with half_pixel it has no samples and gives 0 */
  float dot[4] = {0, 0, 0, 0};
  ES_CHECK_RC(ra_eval("avg", "output_half_pixel", 0, 1, 1, &xd, x, 1, dot, bi, &out, &od));
  assert_true(fabsf(*(float *)od - 2.0f) <= 1e-6f);
  es_mem_free(od);
  ES_CHECK_RC(ra_eval("max", "half_pixel", 0, 1, 1, &xd, x, 1, dot, bi, &out, &od));
  assert_true(*(float *)od == 0.0f);
  es_mem_free(od);
}

static void test_roialign_errors(void **state) {
  (void)state;
  float x[1 * 1 * 4 * 4] = {0};
  es_tdesc xd = KH_TD(ES_DTYPE_FLOAT, 1, 1, 4, 4), out;
  float ok[4] = {0, 0, 2, 2}, nan_roi[4] = {0, NAN, 2, 2}, huge[4] = {0, 0, 1e9f, 2};
  int64_t b0[1] = {0}, b1[1] = {1}, bneg[1] = {-1};
  void *od;
  assert_int_equal(ra_eval("avg", "half_pixel", 0, 1, 1, &xd, x, 1, ok, b1, &out, &od), ES_EINVAL);
  assert_int_equal(ra_eval("avg", "half_pixel", 0, 1, 1, &xd, x, 1, ok, bneg, &out, &od),
                   ES_EINVAL);
  assert_int_equal(ra_eval("avg", "half_pixel", 0, 1, 1, &xd, x, 1, nan_roi, b0, &out, &od),
                   ES_EINVAL);
  assert_int_equal(ra_eval("avg", "half_pixel", 0, 1, 1, &xd, x, 1, huge, b0, &out, &od),
                   ES_EINVAL);
  ES_CHECK_RC(ra_eval("avg", "half_pixel", 2, 1, 1, &xd, x, 1, huge, b0, &out, &od));
  es_mem_free(od);
  assert_int_equal(ra_eval("min", "half_pixel", 0, 1, 1, &xd, x, 1, ok, b0, &out, &od), ES_EMODEL);
  assert_int_equal(ra_eval("avg", "align", 0, 1, 1, &xd, x, 1, ok, b0, &out, &od), ES_EMODEL);
  assert_int_equal(ra_eval("avg", "half_pixel", -1, 1, 1, &xd, x, 1, ok, b0, &out, &od),
                   ES_EMODEL);
  assert_int_equal(ra_eval("avg", "half_pixel", 0, 0, 1, &xd, x, 1, ok, b0, &out, &od), ES_EMODEL);
  es_tdesc x3 = KH_TD(ES_DTYPE_FLOAT, 1, 4, 4), xi = KH_TD(ES_DTYPE_INT32, 1, 1, 4, 4);
  assert_int_equal(ra_eval("avg", "half_pixel", 0, 1, 1, &x3, x, 1, ok, b0, &out, &od), ES_EMODEL);
  assert_int_equal(ra_eval("avg", "half_pixel", 0, 1, 1, &xi, x, 1, ok, b0, &out, &od),
                   ES_ENOTSUP);
  /* rois [1, 3] and batch_indices of the wrong length or type */
  es_attr none[1];
  es_knode node = kh_knode(ES_OP_RoiAlign, none, 0);
  es_tdesc r3 = KH_TD(ES_DTYPE_FLOAT, 1, 3), r4 = KH_TD(ES_DTYPE_FLOAT, 1, 4);
  es_tdesc b2 = KH_TD(ES_DTYPE_INT64, 2), bi32 = KH_TD(ES_DTYPE_INT32, 1),
           bok = KH_TD(ES_DTYPE_INT64, 1);
  const void *data[] = {x, ok, b0};
  const es_tdesc *bad[][3] = {{&xd, &r3, &bok}, {&xd, &r4, &b2}, {&xd, &r4, &bi32}};
  for (int i = 0; i < 3; i++)
    assert_int_equal(kh_eval_with(&node, &(kh_opts){.opset = 16, .dyn = 7}, 3, bad[i], data, 1,
                                  &out, &od),
                     ES_EMODEL);
}

/* ==========================================================================
 * MaxUnpool
 * ======================================================================== */

static void test_maxunpool(void **state) {
  (void)state;
  /* 1-D: X [1, 2, 3], kernel 2 stride 2 -> 6 per channel; indices flat over [1, 2, 6] */
  float x1[6] = {1, 2, 3, 4, 5, 6};
  int64_t i1[6] = {1, 2, 5, 6, 9, 11};
  es_tdesc xd = KH_TD(ES_DTYPE_FLOAT, 1, 2, 3), idd = KH_TD(ES_DTYPE_INT64, 1, 2, 3), out;
  es_attr a1[] = {KH_INTS("kernel_shape", 2), KH_INTS("strides", 2)};
  es_knode n1 = kh_knode(ES_OP_MaxUnpool, a1, 2);
  const es_tdesc *in[] = {&xd, &idd};
  const void *d1[] = {x1, i1};
  void *od;
  ES_CHECK_RC(kh_eval_with(&n1, &(kh_opts){.opset = 11, .dyn = 3}, 2, in, d1, 1, &out, &od));
  static const float w1[12] = {0, 1, 2, 0, 0, 3, 4, 0, 0, 5, 0, 6};
  assert_int_equal(out.dims[2], 6);
  assert_memory_equal(od, w1, sizeof w1);
  es_mem_free(od);
  /* a larger output_shape: the unpooled tensor at its origin */
  int64_t os[3] = {1, 2, 8};
  es_tdesc osd = KH_TD(ES_DTYPE_INT64, 3);
  const es_tdesc *in3[] = {&xd, &idd, &osd};
  const void *d3[] = {x1, i1, os};
  ES_CHECK_RC(kh_eval_with(&n1, &(kh_opts){.opset = 11, .dyn = 3}, 3, in3, d3, 1, &out, &od));
  static const float w3[16] = {0, 1, 2, 0, 0, 3, 0, 0, 4, 0, 0, 5, 0, 6, 0, 0};
  assert_memory_equal(od, w3, sizeof w3);
  es_mem_free(od);
  /* a smaller one: index 5 lands at position 5 of 4 */
  int64_t small[3] = {1, 2, 4};
  const void *ds[] = {x1, i1, small};
  assert_int_equal(kh_eval_with(&n1, &(kh_opts){.opset = 11, .dyn = 3}, 3, in3, ds, 1, &out, &od),
                   ES_EINVAL);
  /* an index outside the unpooled tensor */
  int64_t bad[6] = {1, 2, 5, 6, 9, 12};
  const void *db[] = {x1, bad};
  assert_int_equal(kh_eval_with(&n1, &(kh_opts){.opset = 11, .dyn = 3}, 2, in, db, 1, &out, &od),
                   ES_EINVAL);
  int64_t negi[6] = {-1, 2, 5, 6, 9, 11};
  const void *dn[] = {x1, negi};
  assert_int_equal(kh_eval_with(&n1, &(kh_opts){.opset = 11, .dyn = 3}, 2, in, dn, 1, &out, &od),
                   ES_EINVAL);
  /* output_shape unknown while planning */
  assert_int_equal(kh_eval_with(&n1, &(kh_opts){.opset = 11, .dyn = 7}, 3, in3, d3, 1, &out, &od),
                   ES_ENOTSUP);
  /* 3-D, int8 values, int32 indices, pads: 2 -> (2-1)*2 + 3 - 1 = 4 per dim */
  int8_t x3[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  int32_t i3[8] = {0, 3, 12, 15, 48, 51, 60, 63};
  es_tdesc x3d = KH_TD(ES_DTYPE_INT8, 1, 1, 2, 2, 2), i3d = KH_TD(ES_DTYPE_INT32, 1, 1, 2, 2, 2);
  es_attr a3[] = {KH_INTS("kernel_shape", 3, 3, 3), KH_INTS("strides", 2, 2, 2),
                  KH_INTS("pads", 1, 1, 1, 0, 0, 0)};
  es_knode n3 = kh_knode(ES_OP_MaxUnpool, a3, 3);
  const es_tdesc *in5[] = {&x3d, &i3d};
  const void *d5[] = {x3, i3};
  ES_CHECK_RC(kh_eval_with(&n3, &(kh_opts){.opset = 11}, 2, in5, d5, 1, &out, &od));
  assert_int_equal(out.rank, 5);
  for (int d = 2; d < 5; d++)
    assert_int_equal(out.dims[d], 4);
  int8_t *y = od;
  int nonzero = 0;
  for (int i = 0; i < 64; i++)
    nonzero += y[i] != 0;
  assert_int_equal(nonzero, 8);
  for (int i = 0; i < 8; i++)
    assert_int_equal(y[i3[i]], x3[i]);
  es_mem_free(od);
  /* attribute errors */
  es_attr nok[] = {KH_INTS("strides", 2)};
  es_knode e1 = kh_knode(ES_OP_MaxUnpool, nok, 1);
  assert_int_equal(kh_eval(&e1, 11, 2, in, d1, &out, &od), ES_EMODEL);
  es_attr zk[] = {KH_INTS("kernel_shape", 0)};
  es_knode e2 = kh_knode(ES_OP_MaxUnpool, zk, 1);
  assert_int_equal(kh_eval(&e2, 11, 2, in, d1, &out, &od), ES_EMODEL);
  es_attr bigpad[] = {KH_INTS("kernel_shape", 2), KH_INTS("pads", 4, 4)};
  es_knode e3 = kh_knode(ES_OP_MaxUnpool, bigpad, 2);
  assert_int_equal(kh_eval(&e3, 11, 2, in, d1, &out, &od), ES_EMODEL);
  es_tdesc idw = KH_TD(ES_DTYPE_INT64, 1, 2, 2);
  const es_tdesc *inw[] = {&xd, &idw};
  assert_int_equal(kh_eval(&n1, 11, 2, inw, d1, &out, &od), ES_EMODEL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gridsample_identity), cmocka_unit_test(test_gridsample_linear_fn),
      cmocka_unit_test(test_gridsample_padding),  cmocka_unit_test(test_gridsample_errors),
      cmocka_unit_test(test_topk),                cmocka_unit_test(test_topk_errors),
      cmocka_unit_test(test_topk_in_model),       cmocka_unit_test(test_det),
      cmocka_unit_test(test_maxunpool),           cmocka_unit_test(test_roialign_max),
      cmocka_unit_test(test_roialign_adaptive),   cmocka_unit_test(test_roialign_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
