/* Kernels of the recurrent family: LSTM, GRU and RNN.
 *
 * ONNX's node tests cover the defaults, an initial bias, peepholes, layout 1
 * and sequence lengths of one direction. Here the combinations they miss
 * run against a plain reference written from the specification's
 * equations (double precision, one gate at a time): bidirectional with
 * sequence lengths (0 and full included), layout 1, peepholes,
 * input_forget, clip, linear_before_reset 0 and 1, every non-default
 * activation with and without its alpha / beta, absent optional inputs
 * and outputs, batches that are larger than the kernel's row groups.
 * Each case runs with W, R and B known while planning and only at run
 * time, through a prepared-weights store and without, on the oneDNN path
 * and on the reference loops. Invalid nodes must fail with the right
 * code and a message that says what is wrong. */
#include "es_test.h"

#include <math.h>
#include <string.h>
#include <strings.h>

#include "kernels/kernel.h"
#include "support/kernel_harness.h"

enum { CELL_RNN, CELL_GRU, CELL_LSTM };

typedef struct rcase {
  const char *what;
  int cell;
  int64_t t, b, in, hid;
  const char *direction; /* NULL: forward (attribute absent) */
  int layout, lbr, input_forget, peep, has_b, has_h0, has_c0;
  const int32_t *lens;   /* NULL: no sequence_lens */
  float clip;            /* 0: no clip attribute */
  const char *acts[6];   /* NULL-terminated; none: the defaults */
  float alpha[4], beta[4];
  int nalpha, nbeta;
  unsigned outs;         /* bit i: output i present (0: all) */
} rcase;

/* ==========================================================================
 * Reference
 * ======================================================================== */

typedef struct ract {
  const char *name;
  double alpha, beta;
} ract;

static double act_apply(const ract *a, double x) {
  const char *n = a->name;
  if (!strcasecmp(n, "Relu"))
    return x > 0 ? x : 0;
  if (!strcasecmp(n, "Tanh"))
    return tanh(x);
  if (!strcasecmp(n, "Sigmoid"))
    return 1 / (1 + exp(-x));
  if (!strcasecmp(n, "Affine"))
    return a->alpha * x + a->beta;
  if (!strcasecmp(n, "LeakyRelu"))
    return x >= 0 ? x : a->alpha * x;
  if (!strcasecmp(n, "ThresholdedRelu"))
    return x > a->alpha ? x : 0;
  if (!strcasecmp(n, "ScaledTanh"))
    return a->alpha * tanh(a->beta * x);
  if (!strcasecmp(n, "HardSigmoid"))
    return fmin(fmax(a->alpha * x + a->beta, 0), 1);
  if (!strcasecmp(n, "Elu"))
    return x >= 0 ? x : a->alpha * (exp(x) - 1);
  if (!strcasecmp(n, "Softsign"))
    return x / (1 + fabs(x));
  if (!strcasecmp(n, "Softplus"))
    return log1p(exp(x));
  fail_msg("reference: unknown activation %s", n);
  return 0;
}

/* The functions per direction, alpha and beta consumed in order by those
 * that take them, else their operators' defaults. */
static void acts_of(const rcase *c, int dirs, ract act[2][3]) {
  static const char *const def[3][3] = {
      {"Tanh"}, {"Sigmoid", "Tanh"}, {"Sigmoid", "Tanh", "Tanh"}};
  int na = c->cell == CELL_RNN ? 1 : c->cell == CELL_GRU ? 2 : 3, nn = 0;
  while (nn < 6 && c->acts[nn])
    nn++;
  int ia = 0, ib = 0;
  for (int d = 0; d < dirs; d++)
    for (int i = 0; i < na; i++) {
      ract *a = &act[d][i];
      a->name = !nn ? def[c->cell][i] : c->acts[nn == na ? i : d * na + i];
      int ta = 0, tb = 0;
      a->alpha = a->beta = 0;
      if (!strcasecmp(a->name, "Affine"))
        ta = tb = 1, a->alpha = 1, a->beta = 0;
      else if (!strcasecmp(a->name, "LeakyRelu"))
        ta = 1, a->alpha = 0.01;
      else if (!strcasecmp(a->name, "ThresholdedRelu"))
        ta = 1, a->alpha = 1;
      else if (!strcasecmp(a->name, "ScaledTanh"))
        ta = tb = 1, a->alpha = a->beta = 1;
      else if (!strcasecmp(a->name, "HardSigmoid"))
        ta = tb = 1, a->alpha = 0.2, a->beta = 0.5;
      else if (!strcasecmp(a->name, "Elu"))
        ta = 1, a->alpha = 1;
      if (ta && ia < c->nalpha)
        a->alpha = c->alpha[ia++];
      if (tb && ib < c->nbeta)
        a->beta = c->beta[ib++];
    }
}

typedef struct rdata {
  float *x, *w, *r, *bias, *h0, *c0, *p;
  int32_t *lens;
} rdata;

static double clipped(const rcase *c, double v) {
  if (c->clip > 0)
    v = fmin(fmax(v, -c->clip), c->clip);
  return v;
}

/* Y, Y_h, Y_c as the specification computes them. */
static void reference(const rcase *c, const rdata *in, double *y, double *yh, double *yc) {
  int dirs = c->direction && !strcmp(c->direction, "bidirectional") ? 2 : 1;
  int rev1 = c->direction && !strcmp(c->direction, "reverse");
  int64_t T = c->t, B = c->b, I = c->in, H = c->hid;
  int G = c->cell == CELL_RNN ? 1 : c->cell == CELL_GRU ? 3 : 4;
  ract act[2][3];
  acts_of(c, dirs, act);
  double *h = calloc((size_t)H, sizeof *h), *cc = calloc((size_t)H, sizeof *cc);
  double *a = calloc((size_t)(G * H), sizeof *a), *ar = calloc((size_t)(G * H), sizeof *ar);
  double *hn = calloc((size_t)H, sizeof *hn);
#define ST(d, b) ((c->layout ? (b) * dirs + (d) : (d) * B + (b)) * H)
#define YO(t, d, b) ((c->layout ? ((b) * T + (t)) * dirs + (d) : ((t) * dirs + (d)) * B + (b)) * H)
  for (int64_t i = 0; i < T * B * dirs * H; i++)
    y[i] = 0;
  for (int d = 0; d < dirs; d++)
    for (int64_t b = 0; b < B; b++) {
      int rev = dirs == 2 ? d == 1 : rev1;
      int64_t len = c->lens ? c->lens[b] : T;
      for (int64_t j = 0; j < H; j++) {
        h[j] = c->has_h0 ? in->h0[ST(d, b) + j] : 0;
        cc[j] = c->has_c0 ? in->c0[ST(d, b) + j] : 0;
      }
      const float *W = in->w + d * G * H * I, *R = in->r + d * G * H * H;
      const float *Wb = c->has_b ? in->bias + d * 2 * G * H : NULL, *Rb = Wb ? Wb + G * H : NULL;
      for (int64_t s = 0; s < len; s++) {
        int64_t t = rev ? len - 1 - s : s;
        const float *x = in->x + (c->layout ? b * T + t : t * B + b) * I;
        for (int64_t g = 0; g < G * H; g++) {
          double sx = Wb ? Wb[g] : 0, sr = Rb ? Rb[g] : 0;
          for (int64_t k = 0; k < I; k++)
            sx += (double)x[k] * W[g * I + k];
          for (int64_t k = 0; k < H; k++)
            sr += h[k] * R[g * H + k];
          a[g] = sx;
          ar[g] = sr;
        }
        if (c->cell == CELL_RNN) {
          for (int64_t j = 0; j < H; j++)
            hn[j] = act_apply(&act[d][0], clipped(c, a[j] + ar[j]));
        } else if (c->cell == CELL_GRU) {
          /* gates z, r, h */
          double rh[1024];
          for (int64_t j = 0; j < H; j++)
            rh[j] = act_apply(&act[d][0], clipped(c, a[H + j] + ar[H + j])) * h[j];
          for (int64_t j = 0; j < H; j++) {
            double z = act_apply(&act[d][0], clipped(c, a[j] + ar[j]));
            double r = act_apply(&act[d][0], clipped(c, a[H + j] + ar[H + j]));
            double pre;
            if (c->lbr) {
              pre = a[2 * H + j] + r * ar[2 * H + j];
            } else {
              pre = a[2 * H + j] + (Rb ? Rb[2 * H + j] : 0);
              for (int64_t k = 0; k < H; k++)
                pre += rh[k] * R[(2 * H + j) * H + k];
            }
            double n = act_apply(&act[d][1], clipped(c, pre));
            hn[j] = (1 - z) * n + z * h[j];
          }
        } else {
          /* gates i, o, f, c; peepholes i, o, f */
          const float *P = c->peep ? in->p + d * 3 * H : NULL;
          for (int64_t j = 0; j < H; j++) {
            double i = act_apply(&act[d][0],
                                 clipped(c, a[j] + ar[j] + (P ? P[j] * cc[j] : 0)));
            double f = c->input_forget
                           ? 1 - i
                           : act_apply(&act[d][0], clipped(c, a[2 * H + j] + ar[2 * H + j] +
                                                                  (P ? P[2 * H + j] * cc[j] : 0)));
            double g = act_apply(&act[d][1], clipped(c, a[3 * H + j] + ar[3 * H + j]));
            double cn = f * cc[j] + i * g;
            double o = act_apply(&act[d][0],
                                 clipped(c, a[H + j] + ar[H + j] + (P ? P[H + j] * cn : 0)));
            cc[j] = cn;
            hn[j] = o * act_apply(&act[d][2], clipped(c, cn));
          }
        }
        for (int64_t j = 0; j < H; j++) {
          h[j] = hn[j];
          y[YO(t, d, b) + j] = h[j];
        }
      }
      for (int64_t j = 0; j < H; j++) {
        yh[ST(d, b) + j] = len ? h[j] : 0;
        if (yc)
          yc[ST(d, b) + j] = len ? cc[j] : 0;
      }
    }
#undef ST
#undef YO
  free(h);
  free(cc);
  free(a);
  free(ar);
  free(hn);
}

/* ==========================================================================
 * Running a case
 * ======================================================================== */

static void expect_close(const float *got, const double *want, size_t n, const char *what,
                         const char *out) {
  for (size_t i = 0; i < n; i++)
    if (!(fabs((double)got[i] - want[i]) <= 2e-5 + 1e-4 * fabs(want[i])))
      fail_msg("%s: %s[%zu] = %.9g, expected %.9g", what, out, i, (double)got[i], want[i]);
}

/* The node's attributes for c (pointing into c). */
static int attrs_of(const rcase *c, es_attr *at) {
  int n = 0;
  at[n++] = KH_INT("hidden_size", c->hid);
  if (c->direction)
    at[n++] = KH_STR("direction", c->direction);
  if (c->layout)
    at[n++] = KH_INT("layout", c->layout);
  if (c->cell == CELL_GRU)
    at[n++] = KH_INT("linear_before_reset", c->lbr);
  if (c->input_forget)
    at[n++] = KH_INT("input_forget", 1);
  if (c->clip > 0)
    at[n++] = KH_FLOAT("clip", c->clip);
  size_t na = 0;
  while (na < 6 && c->acts[na])
    na++;
  if (na)
    at[n++] = (es_attr){.name = "activations", .type = ES_ATTR_STRINGS, .n = na,
                        .strs = c->acts, .tensor = -1};
  if (c->nalpha)
    at[n++] = (es_attr){.name = "activation_alpha", .type = ES_ATTR_FLOATS,
                        .n = (size_t)c->nalpha, .floats = c->alpha, .tensor = -1};
  if (c->nbeta)
    at[n++] = (es_attr){.name = "activation_beta", .type = ES_ATTR_FLOATS,
                        .n = (size_t)c->nbeta, .floats = c->beta, .tensor = -1};
  return n;
}

static es_op op_of(int cell) {
  return cell == CELL_LSTM ? ES_OP_LSTM : cell == CELL_GRU ? ES_OP_GRU : ES_OP_RNN;
}

/* Runs c in one mode (dyn: inputs unknown while planning; ref: reference
 * kernels; store: through a prepared-weights store) and checks every
 * present output against the reference. */
static void run_mode(const rcase *c, const rdata *d, unsigned dyn, int ref, int store,
                     const double *y, const double *yh, const double *yc) {
  int dirs = c->direction && !strcmp(c->direction, "bidirectional") ? 2 : 1;
  int G = c->cell == CELL_RNN ? 1 : c->cell == CELL_GRU ? 3 : 4;
  int64_t T = c->t, B = c->b, I = c->in, H = c->hid;
  es_tdesc xd = c->layout ? KH_TD(ES_DTYPE_FLOAT, B, T, I) : KH_TD(ES_DTYPE_FLOAT, T, B, I);
  es_tdesc wd = KH_TD(ES_DTYPE_FLOAT, dirs, G * H, I), rd = KH_TD(ES_DTYPE_FLOAT, dirs, G * H, H);
  es_tdesc bd = KH_TD(ES_DTYPE_FLOAT, dirs, 2 * G * H), ld = KH_TD(ES_DTYPE_INT32, B);
  es_tdesc sd = c->layout ? KH_TD(ES_DTYPE_FLOAT, B, dirs, H) : KH_TD(ES_DTYPE_FLOAT, dirs, B, H);
  es_tdesc pd = KH_TD(ES_DTYPE_FLOAT, dirs, 3 * H);
  const es_tdesc *in[8] = {&xd, &wd, &rd, c->has_b ? &bd : NULL, c->lens ? &ld : NULL,
                           c->has_h0 ? &sd : NULL, c->has_c0 ? &sd : NULL, c->peep ? &pd : NULL};
  const void *data[8] = {d->x, d->w, d->r, d->bias, d->lens, d->h0, d->c0, d->p};
  int n_in = c->cell == CELL_LSTM ? 8 : 6;
  while (n_in > 3 && !in[n_in - 1])
    n_in--;
  int n_out = c->cell == CELL_LSTM ? 3 : 2;
  unsigned outs = c->outs ? c->outs : (1u << n_out) - 1;
  es_attr at[12];
  es_knode node = kh_knode(op_of(c->cell), at, attrs_of(c, at));
  es_prep_store *ps = NULL;
  if (store)
    ES_CHECK_RC(es__prep_store_create(&ps));
  es__kernels_use_reference(ref);
  kh_run h;
  kh_begin(&h, &node, 14, n_in, in, data, dyn, n_out, ps);
  for (int i = 0; i < n_out; i++)
    if (!(outs >> i & 1))
      h.outp[i] = NULL;
  char what[200];
  snprintf(what, sizeof what, "%s (dyn %#x%s%s)", c->what, dyn, ref ? ", reference" : "",
           store ? ", store" : "");
  int rc = kh_infer(&h);
  if (rc != 0)
    fail_msg("%s: infer -> %s: %s", what, es_err_name(rc), es_last_error_detail());
  void *od[3];
  rc = kh_exec(&h, data, 0, od);
  if (rc != 0)
    fail_msg("%s: run -> %s: %s", what, es_err_name(rc), es_last_error_detail());
  es__kernels_use_reference(0);
  if (outs & 1) {
    assert_int_equal(h.out[0].rank, 4);
    expect_close(od[0], y, (size_t)(T * B * dirs * H), what, "Y");
  }
  if (outs & 2)
    expect_close(od[1], yh, (size_t)(B * dirs * H), what, "Y_h");
  if (n_out > 2 && (outs & 4))
    expect_close(od[2], yc, (size_t)(B * dirs * H), what, "Y_c");
  for (int i = 0; i < n_out; i++)
    es_mem_free(od[i]);
  kh_end(&h);
  es__prep_store_destroy(ps);
}

static float *rand_buf(uint64_t *seed, size_t n, float lo, float hi) {
  float *v = malloc((n ? n : 1) * sizeof *v);
  kh_rand_f32(seed, v, n, lo, hi);
  return v;
}

static void run_case(const rcase *c, uint64_t *seed) {
  int dirs = c->direction && !strcmp(c->direction, "bidirectional") ? 2 : 1;
  int G = c->cell == CELL_RNN ? 1 : c->cell == CELL_GRU ? 3 : 4;
  int64_t T = c->t, B = c->b, I = c->in, H = c->hid;
  float sc = 1.0f / sqrtf((float)H);
  rdata d = {
      .x = rand_buf(seed, (size_t)(T * B * I), -1, 1),
      .w = rand_buf(seed, (size_t)(dirs * G * H * I), -sc, sc),
      .r = rand_buf(seed, (size_t)(dirs * G * H * H), -sc, sc),
      .bias = rand_buf(seed, (size_t)(dirs * 2 * G * H), -0.3f, 0.3f),
      .h0 = rand_buf(seed, (size_t)(dirs * B * H), -0.5f, 0.5f),
      .c0 = rand_buf(seed, (size_t)(dirs * B * H), -0.5f, 0.5f),
      .p = rand_buf(seed, (size_t)(dirs * 3 * H), -0.5f, 0.5f),
      .lens = (int32_t *)c->lens,
  };
  size_t ny = (size_t)(T * B * dirs * H), ns = (size_t)(B * dirs * H);
  double *y = malloc((ny + 1) * sizeof *y), *yh = malloc((ns + 1) * sizeof *yh);
  double *yc = malloc((ns + 1) * sizeof *yc);
  reference(c, &d, y, yh, c->cell == CELL_LSTM ? yc : NULL);
  /* static weights; W, R and B at run; reference kernels; a store */
  run_mode(c, &d, 0, 0, 0, y, yh, yc);
  run_mode(c, &d, 0xe, 0, 0, y, yh, yc);
  run_mode(c, &d, 0, 1, 0, y, yh, yc);
  run_mode(c, &d, 0x4, 0, 1, y, yh, yc);
  free(y);
  free(yh);
  free(yc);
  free(d.x);
  free(d.w);
  free(d.r);
  free(d.bias);
  free(d.h0);
  free(d.c0);
  free(d.p);
}

/* ==========================================================================
 * Cases
 * ======================================================================== */

static const int32_t lens3[] = {5, 0, 3};
static const int32_t lens6[] = {4, 7, 1, 7, 0, 6};
static const int32_t lens2[] = {2, 5};

static const rcase cases[] = {
    {"LSTM bidirectional, sequence_lens, initial states", CELL_LSTM, 5, 3, 4, 6, "bidirectional",
     .has_b = 1, .has_h0 = 1, .has_c0 = 1, .lens = lens3},
    {"LSTM layout 1, reverse, peepholes, input_forget, clip", CELL_LSTM, 5, 2, 3, 5, "reverse",
     .layout = 1, .peep = 1, .input_forget = 1, .clip = 0.7f, .has_b = 1, .has_h0 = 1,
     .has_c0 = 1, .lens = lens2},
    {"LSTM peepholes, bidirectional, layout 1", CELL_LSTM, 4, 2, 5, 17, "bidirectional",
     .layout = 1, .peep = 1, .has_b = 1, .has_c0 = 1},
    {"LSTM HardSigmoid / LeakyRelu / ScaledTanh with alpha and beta", CELL_LSTM, 4, 1, 3, 4, NULL,
     .has_b = 1, .acts = {"HardSigmoid", "LeakyRelu", "ScaledTanh"}, .alpha = {0.3f, 0.2f, 1.5f},
     .nalpha = 3, .beta = {0.4f, 0.8f}, .nbeta = 2},
    {"LSTM six activations, defaults for the missing alphas", CELL_LSTM, 3, 2, 3, 4,
     "bidirectional", .has_b = 1,
     .acts = {"sigmoid", "tanh", "Softsign", "HardSigmoid", "Elu", "Affine"}, .alpha = {0.25f},
     .nalpha = 1},
    {"LSTM no B, no outputs but Y_c", CELL_LSTM, 4, 2, 3, 5, NULL, .outs = 4},
    {"LSTM batch 6 (row groups), lengths", CELL_LSTM, 7, 6, 4, 20, "bidirectional", .has_b = 1,
     .has_h0 = 1, .lens = lens6},
    {"GRU linear_before_reset 0, bidirectional, lengths", CELL_GRU, 5, 3, 4, 6, "bidirectional",
     .lbr = 0, .has_b = 1, .has_h0 = 1, .lens = lens3},
    {"GRU linear_before_reset 1, bidirectional, lengths", CELL_GRU, 5, 3, 4, 6, "bidirectional",
     .lbr = 1, .has_b = 1, .has_h0 = 1, .lens = lens3},
    {"GRU layout 1, clip, reverse, HardSigmoid / Elu", CELL_GRU, 6, 2, 3, 18, "reverse",
     .layout = 1, .lbr = 1, .clip = 0.5f, .has_b = 1, .acts = {"HardSigmoid", "Elu"},
     .alpha = {0.15f, 0.9f}, .nalpha = 2, .beta = {0.45f}, .nbeta = 1},
    {"GRU linear_before_reset 1 without B, Y absent", CELL_GRU, 4, 5, 3, 7, NULL, .lbr = 1,
     .outs = 2},
    {"GRU linear_before_reset 0 without B, batch 6", CELL_GRU, 7, 6, 4, 9, "bidirectional",
     .lbr = 0, .lens = lens6},
    {"RNN Relu, reverse, no B", CELL_RNN, 5, 2, 3, 4, "reverse", .acts = {"Relu"}, .has_h0 = 1},
    {"RNN Affine / ThresholdedRelu, bidirectional, layout 1", CELL_RNN, 5, 3, 4, 5,
     "bidirectional", .layout = 1, .has_b = 1, .acts = {"Affine", "ThresholdedRelu"},
     .alpha = {0.8f, 0.1f}, .nalpha = 2, .beta = {0.2f}, .nbeta = 1, .lens = lens3},
    {"RNN Softplus, clip, Y_h absent", CELL_RNN, 4, 2, 3, 33, NULL, .has_b = 1,
     .acts = {"Softplus"}, .clip = 2.0f, .outs = 1},
    {"RNN LeakyRelu default alpha, lengths", CELL_RNN, 5, 3, 2, 3, NULL, .has_b = 1,
     .acts = {"LeakyRelu"}, .lens = lens3},
};

static void test_cases(void **state) {
  (void)state;
  uint64_t seed = es_test_seed();
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    run_case(&cases[i], &seed);
}

/* ==========================================================================
 * Errors
 * ======================================================================== */

/* Infers (and runs, when infer succeeds) an LSTM [T 3, B 2, I 4, H 5] whose
 * W is wdims, with attrs; returns the first failure's code. */
static int lstm_try(const es_attr *attrs, int na, const int64_t *wdims, const int32_t *lens,
                    int64_t opset) {
  es_tdesc xd = KH_TD(ES_DTYPE_FLOAT, 3, 2, 4), wd = kh_td(ES_DTYPE_FLOAT, 3, wdims);
  es_tdesc rd = KH_TD(ES_DTYPE_FLOAT, 1, 20, 5), ld = KH_TD(ES_DTYPE_INT32, 2);
  float x[24] = {0}, w[400] = {0}, r[100] = {0};
  const es_tdesc *in[5] = {&xd, &wd, &rd, NULL, lens ? &ld : NULL};
  const void *data[5] = {x, w, r, NULL, lens};
  es_knode node = kh_knode(ES_OP_LSTM, attrs, na);
  kh_run h;
  kh_begin(&h, &node, opset, lens ? 5 : 3, in, data, 0, 3, NULL);
  int rc = kh_infer(&h);
  if (rc == 0) {
    void *od[3];
    rc = kh_exec(&h, data, 0, od);
    if (rc == 0)
      for (int i = 0; i < 3; i++)
        es_mem_free(od[i]);
  }
  kh_end(&h);
  return rc;
}

static void expect_detail(const char *part) {
  if (!strstr(es_last_error_detail(), part))
    fail_msg("error '%s' does not say '%s'", es_last_error_detail(), part);
}

static void test_errors(void **state) {
  (void)state;
  const int64_t good[3] = {1, 20, 4}, bad_w[3] = {1, 20, 3}, bad_dirs[3] = {2, 20, 4};
  es_attr h5[] = {KH_INT("hidden_size", 5)};
  ES_CHECK_RC(lstm_try(h5, 1, good, NULL, 14));
  ES_EXPECT_RC(lstm_try(h5, 1, bad_w, NULL, 14), ES_EMODEL);
  expect_detail("W is float32 [1, 20, 3], expected float32 [1, 20, 4]");
  ES_EXPECT_RC(lstm_try(h5, 1, bad_dirs, NULL, 14), ES_EMODEL);
  expect_detail("W is");
  es_attr h6[] = {KH_INT("hidden_size", 6)};
  ES_EXPECT_RC(lstm_try(h6, 1, good, NULL, 14), ES_EMODEL);
  expect_detail("hidden_size is 6");
  const char *unknown[] = {"Sigmoid", "Swish", "Tanh"};
  es_attr acts[] = {KH_INT("hidden_size", 5),
                    {.name = "activations", .type = ES_ATTR_STRINGS, .n = 3, .strs = unknown,
                     .tensor = -1}};
  ES_EXPECT_RC(lstm_try(acts, 2, good, NULL, 14), ES_EMODEL);
  expect_detail("unknown activation 'Swish'");
  const char *two[] = {"Sigmoid", "Tanh"};
  es_attr acts2[] = {{.name = "activations", .type = ES_ATTR_STRINGS, .n = 2, .strs = two,
                      .tensor = -1}};
  ES_EXPECT_RC(lstm_try(acts2, 1, good, NULL, 14), ES_EMODEL);
  expect_detail("2 activations, expected 3");
  es_attr dir[] = {KH_STR("direction", "sideways")};
  ES_EXPECT_RC(lstm_try(dir, 1, good, NULL, 14), ES_EMODEL);
  expect_detail("direction 'sideways'");
  es_attr lay[] = {KH_INT("layout", 1)};
  ES_EXPECT_RC(lstm_try(lay, 1, good, NULL, 13), ES_EMODEL);
  expect_detail("opset 14");
  es_attr clip[] = {KH_FLOAT("clip", -1.0f)};
  ES_EXPECT_RC(lstm_try(clip, 1, good, NULL, 14), ES_EMODEL);
  const int32_t long_lens[2] = {3, 4}, neg_lens[2] = {-1, 2}, ok_lens[2] = {3, 0};
  ES_CHECK_RC(lstm_try(h5, 1, good, ok_lens, 14));
  ES_EXPECT_RC(lstm_try(h5, 1, good, long_lens, 14), ES_EINVAL);
  expect_detail("sequence_lens[1] is 4");
  ES_EXPECT_RC(lstm_try(h5, 1, good, neg_lens, 14), ES_EINVAL);
  /* X of rank 2, or of integers */
  es_tdesc x2 = KH_TD(ES_DTYPE_FLOAT, 3, 8), wd = kh_td(ES_DTYPE_FLOAT, 3, good);
  es_tdesc rd = KH_TD(ES_DTYPE_FLOAT, 1, 20, 5);
  es_knode node = kh_knode(ES_OP_LSTM, h5, 1);
  kh_run h;
  kh_begin(&h, &node, 14, 3, (const es_tdesc *[]){&x2, &wd, &rd}, NULL, 0, 3, NULL);
  ES_EXPECT_RC(kh_infer(&h), ES_EMODEL);
  kh_end(&h);
  es_tdesc xi8 = KH_TD(ES_DTYPE_INT8, 3, 2, 4);
  kh_begin(&h, &node, 14, 3, (const es_tdesc *[]){&xi8, &wd, &rd}, NULL, 0, 3, NULL);
  ES_EXPECT_RC(kh_infer(&h), ES_EMODEL);
  kh_end(&h);
  /* GRU's activations count: two per direction */
  es_tdesc gw = KH_TD(ES_DTYPE_FLOAT, 1, 15, 4), gr = KH_TD(ES_DTYPE_FLOAT, 1, 15, 5);
  es_tdesc xd = KH_TD(ES_DTYPE_FLOAT, 3, 2, 4);
  const char *three[] = {"Sigmoid", "Tanh", "Tanh"};
  es_attr g3[] = {{.name = "activations", .type = ES_ATTR_STRINGS, .n = 3, .strs = three,
                   .tensor = -1}};
  es_knode gn = kh_knode(ES_OP_GRU, g3, 1);
  kh_begin(&h, &gn, 14, 3, (const es_tdesc *[]){&xd, &gw, &gr}, NULL, 0, 2, NULL);
  ES_EXPECT_RC(kh_infer(&h), ES_EMODEL);
  kh_end(&h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cases),
      cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
