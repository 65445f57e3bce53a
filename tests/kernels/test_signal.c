/* Kernels of the signal family: the windows, DFT, STFT, MelWeightMatrix.
 *
 * ONNX's node tests cover one case of each op; these cover the rest:
 * every window at several sizes (0, 1, even, odd), both periodic forms and
 * an integer output_datatype; DFT over random shapes, axes (the opset-17
 * attribute and the opset-20 input), real and complex input, dft_length
 * shorter and longer than the signal, onesided and inverse, against the
 * defining sum in double, and an inverse of a forward transform giving the
 * signal back; STFT with a window or a frame_length, one- and two-sided,
 * real and complex signals; MelWeightMatrix's run-time refusals. Then an
 * STFT whose window and frame step are constants inside a loaded model
 * (the window folds at load, the step is known while planning). Invalid
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

static void expect_close(const float *got, const double *want, size_t n, double tol,
                         const char *what) {
  for (size_t i = 0; i < n; i++)
    if (!(fabs((double)got[i] - want[i]) <= tol * (1 + fabs(want[i]))))
      fail_msg("%s: [%zu] = %.9g, expected %.9g", what, i, (double)got[i], want[i]);
}

/* ==========================================================================
 * Windows
 * ======================================================================== */

static void test_windows(void **state) {
  (void)state;
  static const es_op ops[3] = {ES_OP_HannWindow, ES_OP_HammingWindow, ES_OP_BlackmanWindow};
  static const int64_t sizes[] = {0, 1, 2, 7, 16};
  for (int o = 0; o < 3; o++)
    for (int periodic = 0; periodic < 2; periodic++)
      for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int64_t size = sizes[s];
        es_attr attrs[] = {KH_INT("periodic", periodic)};
        es_knode node = kh_knode(ops[o], attrs, 1);
        es_tdesc sd = KH_TD(ES_DTYPE_INT64), out;
        void *od;
        ES_CHECK_RC(kh_eval1(&node, 17, &sd, &size, &out, &od));
        assert_int_equal(out.dtype, ES_DTYPE_FLOAT);
        assert_int_equal(out.rank, 1);
        assert_int_equal(out.dims[0], size);
        double want[16];
        double n = (double)(periodic ? size : size - 1);
        for (int64_t t = 0; t < size; t++) {
          double x = 2 * M_PI * (double)t / n;
          want[t] = n == 0                      ? 1.0
                    : ops[o] == ES_OP_HannWindow ? 0.5 - 0.5 * cos(x)
                    : ops[o] == ES_OP_HammingWindow
                        ? 25.0 / 46 - 21.0 / 46 * cos(x)
                        : 0.42 - 0.5 * cos(x) + 0.08 * cos(2 * x);
        }
        char what[80];
        snprintf(what, sizeof what, "%s periodic %d size %lld", es__op_name(ops[o]), periodic,
                 (long long)size);
        expect_close(od, want, (size_t)size, 1e-6, what);
        es_mem_free(od);
      }
  /* int32 output: values truncated toward zero, so only a peak of 1 stays */
  int64_t size = 5;
  es_attr attrs[] = {KH_INT("periodic", 0), KH_INT("output_datatype", ES_DTYPE_INT32)};
  es_knode node = kh_knode(ES_OP_HannWindow, attrs, 2);
  es_tdesc sd = KH_TD(ES_DTYPE_INT64), out;
  void *od;
  ES_CHECK_RC(kh_eval1(&node, 17, &sd, &size, &out, &od));
  assert_int_equal(out.dtype, ES_DTYPE_INT32);
  static const int32_t want_i[5] = {0, 0, 1, 0, 0};
  assert_memory_equal(od, want_i, sizeof want_i);
  es_mem_free(od);
}

static void test_window_errors(void **state) {
  (void)state;
  es_tdesc sd = KH_TD(ES_DTYPE_INT64), out;
  es_tdesc fd = KH_TD(ES_DTYPE_FLOAT);
  void *od;
  int64_t neg = -3, size = 4;
  float fsize = 4;
  es_knode plain = kh_knode(ES_OP_HannWindow, NULL, 0);
  assert_int_equal(kh_eval1(&plain, 17, &sd, &neg, &out, &od), ES_EMODEL);
  assert_int_equal(kh_eval1(&plain, 17, &fd, &fsize, &out, &od), ES_EMODEL);
  const es_tdesc *in[] = {&sd};
  const void *data[] = {&size};
  assert_int_equal(kh_eval_with(&plain, &(kh_opts){.opset = 17, .dyn = 1}, 1, in, data, 1, &out,
                                &od),
                   ES_ENOTSUP);
  es_attr dbl[] = {KH_INT("output_datatype", 11)};
  es_knode n2 = kh_knode(ES_OP_BlackmanWindow, dbl, 1);
  assert_int_equal(kh_eval1(&n2, 17, &sd, &size, &out, &od), ES_ENOTSUP);
  es_attr per[] = {KH_INT("periodic", 2)};
  es_knode n3 = kh_knode(ES_OP_HammingWindow, per, 1);
  assert_int_equal(kh_eval1(&n3, 17, &sd, &size, &out, &od), ES_EMODEL);
}

/* ==========================================================================
 * DFT
 * ======================================================================== */

/* The defining sum along axis of x (dims, last dim c = 1 or 2), n points
 * (input zero-padded or cut), nb bins, into y (dims with axis = nb, last 2). */
static void dft_ref(const float *x, int rank, const int64_t *dims, int axis, int64_t n,
                    int64_t nb, int inverse, double *y) {
  int64_t outer = 1, inner = 1, len = dims[axis], c = dims[rank - 1];
  for (int i = 0; i < axis; i++)
    outer *= dims[i];
  for (int i = axis + 1; i < rank - 1; i++)
    inner *= dims[i];
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++)
      for (int64_t k = 0; k < nb; k++) {
        double re = 0, im = 0;
        for (int64_t t = 0; t < len && t < n; t++) {
          const float *v = x + ((o * len + t) * inner + i) * c;
          double a = (inverse ? 2 : -2) * M_PI * (double)((k * t) % n) / (double)n;
          double xr = v[0], xi = c == 2 ? v[1] : 0;
          re += xr * cos(a) - xi * sin(a);
          im += xr * sin(a) + xi * cos(a);
        }
        double *w = y + ((o * nb + k) * inner + i) * 2;
        w[0] = inverse ? re / (double)n : re;
        w[1] = inverse ? im / (double)n : im;
      }
}

static void test_dft(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  for (int iter = 0; iter < 120; iter++) {
    int rank = (int)rnd(&seed, 2, 4);
    int64_t dims[4];
    for (int i = 0; i < rank - 1; i++)
      dims[i] = rnd(&seed, 1, i == 0 ? 3 : 9);
    int cplx = (int)rnd(&seed, 0, 1);
    dims[rank - 1] = cplx ? 2 : 1;
    int axis = (int)rnd(&seed, 0, rank - 2);
    int64_t len = dims[axis];
    int use_len = (int)rnd(&seed, 0, 2); /* none, shorter or equal, longer */
    int64_t n = use_len == 0 ? len : use_len == 1 ? rnd(&seed, 1, len) : len + rnd(&seed, 1, 6);
    int onesided = !cplx && rnd(&seed, 0, 1);
    int inverse = (int)rnd(&seed, 0, 1);
    int v20 = (int)rnd(&seed, 0, 1);
    int64_t nb = onesided ? n / 2 + 1 : n;
    es_tdesc xd = kh_td(ES_DTYPE_FLOAT, rank, dims);
    float *x = malloc(xd.nbytes);
    kh_rand_f32(&seed, x, xd.count, -1, 1);
    int64_t axis_v = axis == rank - 2 && rnd(&seed, 0, 1) ? -2 : axis;
    es_attr attrs[3];
    int na = 0;
    attrs[na++] = KH_INT("onesided", onesided);
    attrs[na++] = KH_INT("inverse", inverse);
    if (!v20)
      attrs[na++] = KH_INT("axis", axis_v);
    es_knode node = kh_knode(ES_OP_DFT, attrs, na);
    es_tdesc ld = KH_TD(ES_DTYPE_INT64), ad = KH_TD(ES_DTYPE_INT64), out;
    const es_tdesc *in[3] = {&xd, use_len ? &ld : NULL, &ad};
    const void *data[3] = {x, &n, &axis_v};
    void *od;
    ES_CHECK_RC(kh_eval_with(&node, &(kh_opts){.opset = v20 ? 20 : 17}, v20 ? 3 : 2, in, data,
                             1, &out, &od));
    int64_t wd[4];
    memcpy(wd, dims, sizeof wd);
    wd[axis] = nb;
    wd[rank - 1] = 2;
    assert_int_equal(out.rank, rank);
    for (int i = 0; i < rank; i++)
      assert_int_equal(out.dims[i], wd[i]);
    double *want = malloc(out.count * sizeof *want);
    dft_ref(x, rank, dims, axis, n, nb, inverse, want);
    char what[160];
    snprintf(what, sizeof what, "DFT opset %d rank %d axis %d %s n %lld (len %lld) onesided %d "
             "inverse %d", v20 ? 20 : 17, rank, axis, cplx ? "complex" : "real", (long long)n,
             (long long)len, onesided, inverse);
    expect_close(od, want, out.count, 1e-5, what);
    free(want);
    free(x);
    es_mem_free(od);
  }
}

/* A forward transform then an inverse one gives the complex signal back. */
static void test_dft_roundtrip(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  enum { B = 2, N = 37 };
  float x[B * N * 2];
  kh_rand_f32(&seed, x, B * N * 2, -1, 1);
  es_tdesc xd = KH_TD(ES_DTYPE_FLOAT, B, N, 2), fd, bd;
  void *f, *back;
  es_knode fwd = kh_knode(ES_OP_DFT, NULL, 0);
  ES_CHECK_RC(kh_eval1(&fwd, 17, &xd, x, &fd, &f));
  es_attr inv[] = {KH_INT("inverse", 1)};
  es_knode bwd = kh_knode(ES_OP_DFT, inv, 1);
  ES_CHECK_RC(kh_eval1(&bwd, 17, &fd, f, &bd, &back));
  assert_true(es__tdesc_same_shape(&xd, &bd));
  double want[B * N * 2];
  for (int i = 0; i < B * N * 2; i++)
    want[i] = x[i];
  expect_close(back, want, B * N * 2, 1e-5, "DFT then inverse DFT");
  es_mem_free(f);
  es_mem_free(back);
}

static void test_dft_errors(void **state) {
  (void)state;
  float x[2 * 8 * 2] = {0};
  es_tdesc cd = KH_TD(ES_DTYPE_FLOAT, 2, 8, 2), rd = KH_TD(ES_DTYPE_FLOAT, 2, 8, 1), out;
  es_tdesc bad = KH_TD(ES_DTYPE_FLOAT, 2, 8, 3), r1 = KH_TD(ES_DTYPE_FLOAT, 8);
  es_tdesc ld = KH_TD(ES_DTYPE_INT64), lf = KH_TD(ES_DTYPE_FLOAT);
  void *od;
  es_attr one[] = {KH_INT("onesided", 1)};
  es_knode n1 = kh_knode(ES_OP_DFT, one, 1);
  assert_int_equal(kh_eval1(&n1, 17, &cd, x, &out, &od), ES_EMODEL); /* complex, onesided */
  es_knode n0 = kh_knode(ES_OP_DFT, NULL, 0);
  assert_int_equal(kh_eval1(&n0, 17, &bad, x, &out, &od), ES_EMODEL);
  assert_int_equal(kh_eval1(&n0, 17, &r1, x, &out, &od), ES_EMODEL);
  static const int64_t bad_axes[] = {-1, 2, -4};
  for (int i = 0; i < 3; i++) {
    es_attr ax[] = {KH_INT("axis", bad_axes[i])};
    es_knode na = kh_knode(ES_OP_DFT, ax, 1);
    assert_int_equal(kh_eval1(&na, 17, &rd, x, &out, &od), ES_EMODEL);
  }
  int64_t zero = 0, eight = 8;
  float f8 = 8;
  const es_tdesc *in[] = {&rd, &ld};
  const void *d0[] = {x, &zero}, *d8[] = {x, &eight};
  assert_int_equal(kh_eval(&n0, 17, 2, in, d0, &out, &od), ES_EMODEL);
  int64_t huge = ((int64_t)1 << 16) + 1; /* longer than a direct sum is allowed */
  const void *dh[] = {x, &huge};
  assert_int_equal(kh_eval(&n0, 17, 2, in, dh, &out, &od), ES_ENOTSUP);
  assert_int_equal(kh_eval_with(&n0, &(kh_opts){.opset = 17, .dyn = 2}, 2, in, d8, 1, &out, &od),
                   ES_ENOTSUP);
  const es_tdesc *inf[] = {&rd, &lf};
  const void *df[] = {x, &f8};
  assert_int_equal(kh_eval(&n0, 17, 2, inf, df, &out, &od), ES_EMODEL);
  /* opset 20: the axis input, known while planning, in range */
  int64_t ax = 2;
  const es_tdesc *in20[] = {&rd, NULL, &ld};
  const void *d20[] = {x, NULL, &ax};
  assert_int_equal(kh_eval_with(&n0, &(kh_opts){.opset = 20}, 3, in20, d20, 1, &out, &od),
                   ES_EMODEL);
  ax = 1;
  assert_int_equal(kh_eval_with(&n0, &(kh_opts){.opset = 20, .dyn = 4}, 3, in20, d20, 1, &out,
                                &od),
                   ES_ENOTSUP);
}

/* ==========================================================================
 * STFT
 * ======================================================================== */

static void stft_ref(const float *x, int64_t batch, int64_t len, int c, int64_t step,
                     int64_t frame, const float *w, int64_t nb, double *y) {
  int64_t frames = (len - frame) / step + 1;
  for (int64_t b = 0; b < batch; b++)
    for (int64_t f = 0; f < frames; f++)
      for (int64_t k = 0; k < nb; k++) {
        double re = 0, im = 0;
        for (int64_t t = 0; t < frame; t++) {
          const float *v = x + (b * len + f * step + t) * c;
          double wt = w ? w[t] : 1, a = -2 * M_PI * (double)(k * t % frame) / (double)frame;
          double xr = v[0] * wt, xi = c == 2 ? v[1] * wt : 0;
          re += xr * cos(a) - xi * sin(a);
          im += xr * sin(a) + xi * cos(a);
        }
        double *o = y + ((b * frames + f) * nb + k) * 2;
        o[0] = re;
        o[1] = im;
      }
}

static void test_stft(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  for (int iter = 0; iter < 60; iter++) {
    int64_t batch = rnd(&seed, 1, 2), len = rnd(&seed, 1, 40);
    int c = (int)rnd(&seed, 1, 2);
    int64_t frame = rnd(&seed, 1, len), step = rnd(&seed, 1, 7);
    int onesided = c == 1 && rnd(&seed, 0, 1);
    int how = (int)rnd(&seed, 0, 2); /* window, frame_length, both */
    int64_t nb = onesided ? frame / 2 + 1 : frame;
    es_tdesc xd = KH_TD(ES_DTYPE_FLOAT, batch, len, c), sd = KH_TD(ES_DTYPE_INT64);
    es_tdesc wd = KH_TD(ES_DTYPE_FLOAT, frame), fd = KH_TD(ES_DTYPE_INT64), out;
    float *x = malloc(xd.nbytes), *w = malloc(wd.nbytes);
    kh_rand_f32(&seed, x, xd.count, -1, 1);
    kh_rand_f32(&seed, w, wd.count, 0, 1);
    es_attr attrs[] = {KH_INT("onesided", onesided)};
    es_knode node = kh_knode(ES_OP_STFT, attrs, 1);
    const es_tdesc *in[] = {&xd, &sd, how != 1 ? &wd : NULL, how != 0 ? &fd : NULL};
    const void *data[] = {x, &step, w, &frame};
    void *od;
    /* the window is request data: unknown while planning */
    ES_CHECK_RC(kh_eval_with(&node, &(kh_opts){.opset = 17, .dyn = 4}, how == 0 ? 3 : 4, in,
                             data, 1, &out, &od));
    int64_t frames = (len - frame) / step + 1;
    assert_int_equal(out.rank, 4);
    assert_int_equal(out.dims[0], batch);
    assert_int_equal(out.dims[1], frames);
    assert_int_equal(out.dims[2], nb);
    assert_int_equal(out.dims[3], 2);
    double *want = malloc(out.count * sizeof *want);
    stft_ref(x, batch, len, c, step, frame, how != 1 ? w : NULL, nb, want);
    char what[160];
    snprintf(what, sizeof what, "STFT len %lld c %d frame %lld step %lld onesided %d how %d",
             (long long)len, c, (long long)frame, (long long)step, onesided, how);
    expect_close(od, want, out.count, 1e-5, what);
    free(want);
    free(x);
    free(w);
    es_mem_free(od);
  }
}

static void test_stft_errors(void **state) {
  (void)state;
  float x[16] = {0}, w[8] = {0};
  es_tdesc xd = KH_TD(ES_DTYPE_FLOAT, 1, 16, 1), cd = KH_TD(ES_DTYPE_FLOAT, 1, 8, 2);
  es_tdesc sd = KH_TD(ES_DTYPE_INT64), wd = KH_TD(ES_DTYPE_FLOAT, 8), fd = KH_TD(ES_DTYPE_INT64);
  es_tdesc out;
  void *od;
  int64_t step = 4, zero = 0, f7 = 7, f20 = 20;
  es_knode n = kh_knode(ES_OP_STFT, NULL, 0);
  const es_tdesc *only[] = {&xd, &sd};
  const void *d0[] = {x, &step};
  assert_int_equal(kh_eval(&n, 17, 2, only, d0, &out, &od), ES_EMODEL); /* no frame length */
  const es_tdesc *both[] = {&xd, &sd, &wd, &fd};
  const void *dm[] = {x, &step, w, &f7};
  assert_int_equal(kh_eval(&n, 17, 4, both, dm, &out, &od), ES_EMODEL); /* 7 vs 8 */
  const es_tdesc *fl[] = {&xd, &sd, NULL, &fd};
  const void *dl[] = {x, &step, NULL, &f20};
  assert_int_equal(kh_eval(&n, 17, 4, fl, dl, &out, &od), ES_EMODEL); /* longer than signal */
  const void *dz[] = {x, &zero, w};
  const es_tdesc *win[] = {&xd, &sd, &wd};
  assert_int_equal(kh_eval(&n, 17, 3, win, dz, &out, &od), ES_EMODEL); /* step 0 */
  const void *ds[] = {x, &step, w};
  assert_int_equal(kh_eval_with(&n, &(kh_opts){.opset = 17, .dyn = 2}, 3, win, ds, 1, &out, &od),
                   ES_ENOTSUP);
  const es_tdesc *cw[] = {&cd, &sd, &wd};
  assert_int_equal(kh_eval(&n, 17, 3, cw, ds, &out, &od), ES_EMODEL); /* complex, onesided */
}

/* HannWindow(16) and the frame step are constants: the window folds at
 * load, the step is known while planning, and the signal is a request's. */
static void test_stft_in_model(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  static const int64_t wsize = 16, step = 6;
  ob *b = ob_new(17);
  ob_input(b, "signal", 3, (int64_t[]){1, -1, 1});
  ob_init_i64(b, "wsize", 0, NULL, &wsize);
  ob_init_i64(b, "step", 0, NULL, &step);
  ob_node(b, "HannWindow", "window", 1, "wsize");
  ob_node(b, "STFT", "spec", 3, "signal", "step", "window");
  ob_output(b, "spec");
  es_model *m = ob_load(b);
  free(b);
  for (int64_t len = 16; len <= 64; len += 48) {
    float *x = malloc((size_t)len * sizeof *x);
    kh_rand_f32(&seed, x, (size_t)len, -1, 1);
    es_tensor in = ob_tensor_f32("signal", 3, (int64_t[]){1, len, 1}, x);
    float *y;
    size_t count;
    ob_run(m, 1, &in, 1, &y, &count);
    int64_t frames = (len - wsize) / step + 1, nb = wsize / 2 + 1;
    assert_int_equal(count, (size_t)(frames * nb * 2));
    float w[16];
    for (int t = 0; t < 16; t++)
      w[t] = (float)(0.5 - 0.5 * cos(2 * M_PI * t / 16.0));
    double *want = malloc(count * sizeof *want);
    stft_ref(x, 1, len, 1, step, wsize, w, nb, want);
    expect_close(y, want, count, 1e-5, "HannWindow + STFT model");
    free(want);
    free(y);
    free(x);
  }
  es_model_release(m);
}

/* ==========================================================================
 * MelWeightMatrix
 * ======================================================================== */

static void test_mel(void **state) {
  (void)state;
  es_knode n = kh_knode(ES_OP_MelWeightMatrix, NULL, 0);
  es_tdesc id = KH_TD(ES_DTYPE_INT64), fd = KH_TD(ES_DTYPE_FLOAT), out;
  const es_tdesc *in[] = {&id, &id, &id, &fd, &fd};
  int64_t mels = 8, dft = 16, rate = 8192, zero = 0;
  float lo = 0, hi = 4096, too_hi = 8192;
  void *od;
  const void *ok[] = {&mels, &dft, &rate, &lo, &hi};
  ES_CHECK_RC(kh_eval(&n, 17, 5, in, ok, &out, &od));
  assert_int_equal(out.rank, 2);
  assert_int_equal(out.dims[0], 9);
  assert_int_equal(out.dims[1], 8);
  /* each column is a triangle: its weights lie in [0, 1] and peak at 1 */
  const float *w = od;
  for (int i = 0; i < 8; i++) {
    float mx = 0;
    for (int j = 0; j < 9; j++) {
      assert_true(w[j * 8 + i] >= 0 && w[j * 8 + i] <= 1);
      mx = w[j * 8 + i] > mx ? w[j * 8 + i] : mx;
    }
    assert_true(mx == 1.0f);
  }
  es_mem_free(od);
  /* the rate and the edges are request data: refused at run, by value */
  const void *r0[] = {&mels, &dft, &zero, &lo, &hi};
  assert_int_equal(kh_eval_with(&n, &(kh_opts){.opset = 17, .dyn = 4}, 5, in, r0, 1, &out, &od),
                   ES_EINVAL);
  const void *rh[] = {&mels, &dft, &rate, &lo, &too_hi};
  assert_int_equal(kh_eval_with(&n, &(kh_opts){.opset = 17, .dyn = 16}, 5, in, rh, 1, &out, &od),
                   ES_EINVAL);
  const void *rl[] = {&mels, &dft, &rate, &hi, &lo};
  assert_int_equal(kh_eval(&n, 17, 5, in, rl, &out, &od), ES_EINVAL);
  const void *m0[] = {&zero, &dft, &rate, &lo, &hi};
  assert_int_equal(kh_eval(&n, 17, 5, in, m0, &out, &od), ES_EMODEL);
  assert_int_equal(kh_eval_with(&n, &(kh_opts){.opset = 17, .dyn = 1}, 5, in, ok, 1, &out, &od),
                   ES_ENOTSUP);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_windows),      cmocka_unit_test(test_window_errors),
      cmocka_unit_test(test_dft),          cmocka_unit_test(test_dft_roundtrip),
      cmocka_unit_test(test_dft_errors),   cmocka_unit_test(test_stft),
      cmocka_unit_test(test_stft_errors),  cmocka_unit_test(test_stft_in_model),
      cmocka_unit_test(test_mel),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
