/* Recurrent layers: LSTM, GRU and RNN (ONNX opsets 7 to 21, float32).
 *
 * Every attribute and input of the specification: direction (forward,
 * reverse, bidirectional), activations with activation_alpha / _beta, clip,
 * hidden_size, input_forget (LSTM), linear_before_reset (GRU), layout 0 / 1
 * (opset 14), the optional B, sequence_lens, initial_h, initial_c and P
 * (peepholes), and the optional outputs Y, Y_h, Y_c, each of which may be
 * absent.
 *
 * A layer's work is two products: the input projection X W^T, which does
 * not depend on the recurrence, and per time step the recurrent product
 * H(t-1) R^T, which does. So, per plan:
 *
 *   1. the input projection of every time step and both directions is one
 *      oneDNN matmul, [T*B, I] x [I, dirs*G*H] (G gates), with the static W
 *      reordered once into the layout oneDNN picks (a prepared copy shared by
 *      every plan of the model, as MatMul's weights) and the biases that add
 *      outside the gates' nonlinearity (Wb + Rb) as its bias;
 *   2. per step and direction, the recurrent product by a GEMV of our own
 *      over R packed once into panels of 16 outputs, k-major (each panel is
 *      one contiguous stream and its 16 sums stay in registers), then the
 *      gate arithmetic in vectorised passes of H elements.
 *
 * Why our own GEMV and not a oneDNN matmul per step: at batch 1 the step is
 * a matrix-vector product bound by streaming R from cache, and a library
 * call per step would add its dispatch to each of hundreds of steps (an
 * expectation: a oneDNN-per-step variant was not built to compare). The panel
 * GEMV reads R once per step as whole 64-byte lines, keeps four
 * independent accumulator chains (k split by 4) so FMA latency does not
 * bound it, and lets up to 4 rows of a batch share each panel read. Its
 * multiply-adds fuse (-ffp-contract=fast for this file): lstm_large below
 * went from 16.6-17.8 to 15.4-16.3 ms a run on the busy machine.
 *
 * Measured with the zoo's recurrent models (bench_vs_ort --zoo, one thread,
 * batch 1, 5 interleaved rounds of 20 runs, medians, on a shared 2-core
 * AMD EPYC with a load average of 2.6, so only the ratios mean much),
 * edgeserve / ONNX Runtime ms per run:
 *   gru_small_bi  GRU bidir 40->64, 50 frames           0.05 / 0.26   0.19
 *   rnn_tanh      RNN 2 layers 64->256, 100 frames      0.49 / 1.46   0.34
 *   gru_speech    GRU 2 layers 40->256, 100 frames      1.57 / 2.71   0.58
 *   lstm_speech   LSTM 2 layers bidir 40->128, 100      1.20 / 1.81   0.66
 *   lstm_large    LSTM 256->512, 200 frames            17.9 / 20.6    0.87
 * lstm_large's R (4 MB) does not fit the L2 cache: both engines stream it
 * from L3 each step, and its ratio is the closest to 1 (0.96 before the
 * multiply-adds were fused, 0.87 after).
 *
 * sequence_lens: a batch entry of length L runs L steps (the reverse
 * direction reads its steps L-1 .. 0); Y is zero past L, Y_h and Y_c hold
 * the state after its last valid step, and zeros for L = 0 (ONNX Runtime's
 * convention). Values outside [0, T] are an error of the request.
 *
 * Activations: the spec's list, case-insensitive. activation_alpha and
 * activation_beta are consumed in order by the functions that take one
 * (as ONNX Runtime reads them); a function without its value gets its ONNX
 * operator's default (LeakyRelu 0.01, ThresholdedRelu 1, HardSigmoid 0.2 /
 * 0.5, Elu 1, Affine 1 / 0, ScaledTanh 1 / 1; ONNX Runtime gives the last
 * three 0 instead, so a model relying on those defaults differs from it).
 * For a bidirectional layer a list of one direction's functions serves
 * both.
 *
 * clip bounds every gate's input before its activation and, in an LSTM,
 * the cell state before h() (the cell state itself is kept unclipped), as
 * ONNX Runtime does.
 *
 * Memory: the projection, the states, the recurrent products and, when B
 * or R are not known while planning, the biases and packed R are scratch
 * declared by infer; run allocates nothing. */
#include "kernels/dnnl_glue.h"
#include "kernels/kernel.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "kernels/ew_math.h"

/* ==========================================================================
 * Parameters
 * ======================================================================== */

enum { RNN_NB = 16, RNN_MAX_ROWS = 4 };

typedef enum rnn_cell { RNN_CELL_RNN, RNN_CELL_GRU, RNN_CELL_LSTM } rnn_cell;

typedef enum rnn_act_kind {
  RNN_ACT_RELU,
  RNN_ACT_TANH,
  RNN_ACT_SIGMOID,
  RNN_ACT_AFFINE,
  RNN_ACT_LEAKYRELU,
  RNN_ACT_THRESHOLDEDRELU,
  RNN_ACT_SCALEDTANH,
  RNN_ACT_HARDSIGMOID,
  RNN_ACT_ELU,
  RNN_ACT_SOFTSIGN,
  RNN_ACT_SOFTPLUS,
} rnn_act_kind;

typedef struct rnn_act {
  rnn_act_kind kind;
  float alpha, beta;
} rnn_act;

/* The spec's functions: name, whether they take alpha and beta, and their
 * operators' defaults. */
static const struct {
  const char *name;
  rnn_act_kind kind;
  int takes_alpha, takes_beta;
  float alpha, beta;
} rnn_acts[] = {
    {"Relu", RNN_ACT_RELU, 0, 0, 0, 0},
    {"Tanh", RNN_ACT_TANH, 0, 0, 0, 0},
    {"Sigmoid", RNN_ACT_SIGMOID, 0, 0, 0, 0},
    {"Affine", RNN_ACT_AFFINE, 1, 1, 1.0f, 0.0f},
    {"LeakyRelu", RNN_ACT_LEAKYRELU, 1, 0, 0.01f, 0},
    {"ThresholdedRelu", RNN_ACT_THRESHOLDEDRELU, 1, 0, 1.0f, 0},
    {"ScaledTanh", RNN_ACT_SCALEDTANH, 1, 1, 1.0f, 1.0f},
    {"HardSigmoid", RNN_ACT_HARDSIGMOID, 1, 1, 0.2f, 0.5f},
    {"Elu", RNN_ACT_ELU, 1, 0, 1.0f, 0},
    {"Softsign", RNN_ACT_SOFTSIGN, 0, 0, 0, 0},
    {"Softplus", RNN_ACT_SOFTPLUS, 0, 0, 0, 0},
};

/* Where a run's scratch goes (byte offsets, 64-byte aligned). */
typedef struct rnn_scratch {
  size_t proj;   /* [T*B, N] input projections (N = dirs * G * H) */
  size_t bias;   /* [N] projection bias, when B is known only at run; else 0 */
  size_t rbh;    /* GRU with linear_before_reset: [dirs, H] Rbh, same */
  size_t pack;   /* packed R, when R is known only at run; else 0 */
  size_t h, c;   /* [dirs, B, H] states */
  size_t rec;    /* [B, recw] recurrent products of a step */
  size_t tmp;    /* [B, H] GRU without linear_before_reset: r (.) H(t-1) */
  size_t lens;   /* [B] int32 lengths */
  size_t total;
} rnn_scratch;

typedef struct rnn_params {
  rnn_cell cell;
  int64_t t, b, in, hid; /* seq_length, batch_size, input_size, hidden_size */
  int dirs, reverse;     /* reverse: the one direction is "reverse" */
  int layout, gates;     /* gates: G (1, 3, 4) */
  int lbr, input_forget; /* GRU's linear_before_reset, LSTM's coupled gates */
  int has_clip;
  float clip;
  rnn_act act[2][3];      /* per direction: f, g, h as the cell uses them */
  int has_b, has_seq, has_h0, has_c0, has_p;
  int want_y, want_yh, want_yc;
  int64_t n;              /* dirs * G * H: a projection row */
  int64_t seg_a, seg_b;   /* R's rows per direction in its two packed parts
                             (seg_b: GRU's h gate without linear_before_reset) */
  size_t pack_dir;        /* floats of packed R per direction */
  int64_t recw;           /* a row's recurrent products: panels of seg_a and seg_b */
  const float *bias;      /* [N] projection bias made while planning, or NULL */
  const float *rbh;       /* GRU linear_before_reset: [dirs, H] made while planning */
  const void *rpack;      /* prepared packed R (set when the plan commits), or NULL */
  int r_static;
  int use_dnnl, proj_empty;
  es_dnnl_prim dnnl;
  rnn_scratch s;
} rnn_params;

static int64_t rnn_panels(int64_t rows) { return (rows + RNN_NB - 1) / RNN_NB; }

/* ==========================================================================
 * Packing R and the biases
 * ======================================================================== */

/* R's rows [r0, r0 + rows) of one direction (r: [G*H, H]) as panels of
 * RNN_NB outputs, each k-major: panel p holds, for k = 0 .. H-1, R[r0 +
 * p*NB + c][k] for c = 0 .. NB-1, zeros past the last row. */
static void rnn_pack_part(const float *r, int64_t hid, int64_t r0, int64_t rows, float *dst) {
  for (int64_t p = 0; p < rnn_panels(rows); p++)
    for (int64_t k = 0; k < hid; k++)
      for (int64_t c = 0; c < RNN_NB; c++) {
        int64_t row = p * RNN_NB + c;
        *dst++ = row < rows ? r[(r0 + row) * hid + k] : 0.0f;
      }
}

typedef struct rnn_pack_job {
  const float *r; /* [dirs, G*H, H] */
  int dirs;
  int64_t hid, seg_a, seg_b;
  size_t pack_dir;
} rnn_pack_job;

static void rnn_pack(const rnn_pack_job *j, float *dst) {
  int64_t rows = j->seg_a + j->seg_b;
  for (int d = 0; d < j->dirs; d++) {
    const float *r = j->r + (size_t)d * (size_t)(rows * j->hid);
    float *o = dst + (size_t)d * j->pack_dir;
    rnn_pack_part(r, j->hid, 0, j->seg_a, o);
    rnn_pack_part(r, j->hid, j->seg_a, j->seg_b, o + rnn_panels(j->seg_a) * j->hid * RNN_NB);
  }
}

/* es_prep_fill_fn for the prepared copy. */
static int rnn_pack_fill(void *user, void *dst, size_t bytes) {
  (void)bytes;
  rnn_pack(user, dst);
  return 0;
}

/* The projection's bias (Wb + Rb, per direction and gate, for every gate
 * whose recurrent bias adds outside a product; GRU's h gate with
 * linear_before_reset keeps Rbh apart: r multiplies it) into bias [N], and
 * that Rbh into rbh [dirs, H] when the cell needs it. */
static void rnn_bias_fill(const rnn_params *p, const float *b, float *bias, float *rbh) {
  int64_t gh = p->gates * p->hid;
  for (int d = 0; d < p->dirs; d++) {
    const float *wb = b + (size_t)d * (size_t)(2 * gh), *rb = wb + gh;
    for (int64_t i = 0; i < gh; i++) {
      int apart = p->cell == RNN_CELL_GRU && p->lbr && i >= 2 * p->hid;
      bias[d * gh + i] = wb[i] + (apart ? 0.0f : rb[i]);
    }
    if (rbh)
      for (int64_t i = 0; i < p->hid; i++)
        rbh[d * p->hid + i] = rb[2 * p->hid + i];
  }
}

/* ==========================================================================
 * The recurrent product
 * ======================================================================== */

typedef float rnn_v16 __attribute__((vector_size(64)));
/* The same, read where 4-byte aligned and through any type (panels start
 * 64-byte aligned, but the type promises nothing more). */
typedef float rnn_v16u __attribute__((vector_size(64), aligned(4), may_alias));

/* A panel row as a value (a macro: a function returning a 64-byte vector
 * would have an ABI that depends on the target). */
#define RNN_AT(ptr) (*(const rnn_v16u *)(ptr))

/* y[j] = sum_k x[k] R[j][k] for j < n, over packed panels; one row: four
 * partial sums over k (independent chains, so FMA latency does not bound
 * the loop), summed at the end. */
static inline __attribute__((always_inline)) void rnn_gemv_one(const float *restrict w, int64_t n,
                                                                int64_t kk,
                                                                const float *restrict x,
                                                                float *restrict y) {
  for (int64_t p = 0; p < rnn_panels(n); p++, w += kk * RNN_NB) {
    rnn_v16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    int64_t k = 0;
    for (; k + 4 <= kk; k += 4) {
      a0 += RNN_AT(w + k * RNN_NB) * x[k];
      a1 += RNN_AT(w + (k + 1) * RNN_NB) * x[k + 1];
      a2 += RNN_AT(w + (k + 2) * RNN_NB) * x[k + 2];
      a3 += RNN_AT(w + (k + 3) * RNN_NB) * x[k + 3];
    }
    for (; k < kk; k++)
      a0 += RNN_AT(w + k * RNN_NB) * x[k];
    rnn_v16 s = (a0 + a1) + (a2 + a3);
    int64_t left = n - p * RNN_NB;
    memcpy(y + p * RNN_NB, &s, (size_t)(left < RNN_NB ? left : RNN_NB) * sizeof(float));
  }
}

/* The same for nr rows (2..RNN_MAX_ROWS) sharing each panel's read. */
static inline __attribute__((always_inline)) void rnn_gemv_rows(const float *restrict w, int64_t n,
                                                                 int64_t kk, int nr,
                                                                 const float *const *x,
                                                                 float *const *y) {
  for (int64_t p = 0; p < rnn_panels(n); p++, w += kk * RNN_NB) {
    rnn_v16 a[RNN_MAX_ROWS] = {{0}};
    for (int64_t k = 0; k < kk; k++) {
      rnn_v16 wv = RNN_AT(w + k * RNN_NB);
      for (int r = 0; r < nr; r++)
        a[r] += wv * x[r][k];
    }
    int64_t left = n - p * RNN_NB;
    for (int r = 0; r < nr; r++)
      memcpy(y[r] + p * RNN_NB, &a[r], (size_t)(left < RNN_NB ? left : RNN_NB) * sizeof(float));
  }
}

/* Products of nr rows (1..RNN_MAX_ROWS): y[r] = R x[r]; R's n rows packed
 * in w, kk = H. Constant row counts so the accumulators stay in registers. */
ES_KCLONES static void rnn_gemv(const float *w, int64_t n, int64_t kk, int nr,
                                const float *const *x, float *const *y) {
  switch (nr) {
  case 1:
    rnn_gemv_one(w, n, kk, x[0], y[0]);
    break;
  case 2:
    rnn_gemv_rows(w, n, kk, 2, x, y);
    break;
  case 3:
    rnn_gemv_rows(w, n, kk, 3, x, y);
    break;
  default:
    rnn_gemv_rows(w, n, kk, 4, x, y);
    break;
  }
}

/* ==========================================================================
 * Gate arithmetic: vectorised passes over H elements
 * ======================================================================== */

/* v = clip(v) then act(v), in place. */
ES_KCLONES static void rnn_activate(const rnn_act *a, int has_clip, float clip, float *restrict v,
                                    int64_t n) {
  if (has_clip)
    for (int64_t i = 0; i < n; i++) {
      float x = es__ew_select(v[i] > clip, clip, v[i]);
      v[i] = es__ew_select(x < -clip, -clip, x);
    }
  const float al = a->alpha, be = a->beta;
  switch (a->kind) {
  case RNN_ACT_RELU:
    for (int64_t i = 0; i < n; i++)
      v[i] = es__ew_select(v[i] < 0.0f, 0.0f, v[i]);
    break;
  case RNN_ACT_TANH:
    for (int64_t i = 0; i < n; i++)
      v[i] = es__ew_tanh(v[i]);
    break;
  case RNN_ACT_SIGMOID:
    for (int64_t i = 0; i < n; i++)
      v[i] = es__ew_sigmoid(v[i]);
    break;
  case RNN_ACT_AFFINE:
    for (int64_t i = 0; i < n; i++)
      v[i] = al * v[i] + be;
    break;
  case RNN_ACT_LEAKYRELU:
    for (int64_t i = 0; i < n; i++)
      v[i] = es__ew_leakyrelu(v[i], al);
    break;
  case RNN_ACT_THRESHOLDEDRELU:
    for (int64_t i = 0; i < n; i++)
      v[i] = es__ew_thresholdedrelu(v[i], al);
    break;
  case RNN_ACT_SCALEDTANH:
    for (int64_t i = 0; i < n; i++)
      v[i] = al * es__ew_tanh(be * v[i]);
    break;
  case RNN_ACT_HARDSIGMOID:
    for (int64_t i = 0; i < n; i++) {
      float x = al * v[i] + be;
      x = es__ew_select(x < 0.0f, 0.0f, x);
      v[i] = es__ew_select(x > 1.0f, 1.0f, x);
    }
    break;
  case RNN_ACT_ELU:
    for (int64_t i = 0; i < n; i++)
      v[i] = es__ew_elu(v[i], al);
    break;
  case RNN_ACT_SOFTSIGN:
    for (int64_t i = 0; i < n; i++)
      v[i] = es__ew_softsign(v[i]);
    break;
  case RNN_ACT_SOFTPLUS:
    for (int64_t i = 0; i < n; i++)
      v[i] = es__ew_softplus(v[i]);
    break;
  }
}

/* v += a (+ p (.) c when p is not NULL). */
ES_KCLONES static void rnn_acc(float *restrict v, const float *restrict a, const float *restrict p,
                               const float *restrict c, int64_t n) {
  if (p)
    for (int64_t i = 0; i < n; i++)
      v[i] += a[i] + p[i] * c[i];
  else
    for (int64_t i = 0; i < n; i++)
      v[i] += a[i];
}

/* The default LSTM step in one pass: f = sigmoid, g = h = tanh, no clip,
 * no peepholes, separate forget gate. g holds the pre-activations [i, o, f,
 * c] (projection plus recurrent product); c is updated, h written. */
ES_KCLONES static void rnn_lstm_plain(const float *restrict xw, const float *restrict rec,
                                      float *restrict c, float *restrict h, int64_t n) {
  const float *xi = xw, *xo = xw + n, *xf = xw + 2 * n, *xc = xw + 3 * n;
  const float *ri = rec, *ro = rec + n, *rf = rec + 2 * n, *rc = rec + 3 * n;
  for (int64_t j = 0; j < n; j++) {
    float i = es__ew_sigmoid(xi[j] + ri[j]);
    float f = es__ew_sigmoid(xf[j] + rf[j]);
    float o = es__ew_sigmoid(xo[j] + ro[j]);
    float g = es__ew_tanh(xc[j] + rc[j]);
    float cn = f * c[j] + i * g;
    c[j] = cn;
    h[j] = o * es__ew_tanh(cn);
  }
}

/* Any LSTM step: rec [i, o, f, c] becomes the gates in place. */
static void rnn_lstm_step(const rnn_params *p, const rnn_act *act, const float *xw, float *rec,
                          const float *pe, float *c, float *h, float *tmp) {
  int64_t n = p->hid;
  float *gi = rec, *go = rec + n, *gf = rec + 2 * n, *gc = rec + 3 * n;
  rnn_acc(gi, xw, pe, c, n);
  rnn_activate(&act[0], p->has_clip, p->clip, gi, n);
  if (p->input_forget) {
    for (int64_t j = 0; j < n; j++)
      gf[j] = 1.0f - gi[j];
  } else {
    rnn_acc(gf, xw + 2 * n, pe ? pe + 2 * n : NULL, c, n);
    rnn_activate(&act[0], p->has_clip, p->clip, gf, n);
  }
  rnn_acc(gc, xw + 3 * n, NULL, NULL, n);
  rnn_activate(&act[1], p->has_clip, p->clip, gc, n);
  for (int64_t j = 0; j < n; j++)
    c[j] = gf[j] * c[j] + gi[j] * gc[j];
  rnn_acc(go, xw + n, pe ? pe + n : NULL, c, n);
  rnn_activate(&act[0], p->has_clip, p->clip, go, n);
  memcpy(tmp, c, (size_t)n * sizeof *tmp);
  rnn_activate(&act[2], p->has_clip, p->clip, tmp, n);
  for (int64_t j = 0; j < n; j++)
    h[j] = go[j] * tmp[j];
}

/* GRU: z and r from rec [z, r, ...] in place. */
static void rnn_gru_zr(const rnn_params *p, const rnn_act *act, const float *xw, float *rec) {
  rnn_acc(rec, xw, NULL, NULL, 2 * p->hid);
  rnn_activate(&act[0], p->has_clip, p->clip, rec, 2 * p->hid);
}

/* GRU: the new state from z, r (rec), the h gate's recurrent part rh
 * (R_h H(t-1) with linear_before_reset, R_h (r (.) H(t-1)) without), Rbh
 * (linear_before_reset with B; NULL: none) and H(t-1) in h. */
static void rnn_gru_h(const rnn_params *p, const rnn_act *act, const float *xw, const float *rec,
                      const float *rh, const float *rbh, float *h, float *tmp) {
  int64_t n = p->hid;
  const float *z = rec, *r = rec + n, *xh = xw + 2 * n;
  if (p->lbr && rbh)
    for (int64_t j = 0; j < n; j++)
      tmp[j] = xh[j] + r[j] * (rh[j] + rbh[j]);
  else if (p->lbr)
    for (int64_t j = 0; j < n; j++)
      tmp[j] = xh[j] + r[j] * rh[j];
  else
    for (int64_t j = 0; j < n; j++)
      tmp[j] = xh[j] + rh[j];
  rnn_activate(&act[1], p->has_clip, p->clip, tmp, n);
  for (int64_t j = 0; j < n; j++)
    h[j] = (1.0f - z[j]) * tmp[j] + z[j] * h[j];
}

/* ==========================================================================
 * Attributes and shapes
 * ======================================================================== */

static int rnn_act_parse(es_kinst *k, const char *name, const float **al, size_t *nal,
                         const float **be, size_t *nbe, rnn_act *out) {
  for (size_t i = 0; i < sizeof rnn_acts / sizeof rnn_acts[0]; i++) {
    if (strcasecmp(name, rnn_acts[i].name))
      continue;
    out->kind = rnn_acts[i].kind;
    out->alpha = rnn_acts[i].alpha;
    out->beta = rnn_acts[i].beta;
    if (rnn_acts[i].takes_alpha && *nal) {
      out->alpha = *(*al)++;
      (*nal)--;
    }
    if (rnn_acts[i].takes_beta && *nbe) {
      out->beta = *(*be)++;
      (*nbe)--;
    }
    return 0;
  }
  return ES_KFAIL(k, ES_EMODEL,
                  "unknown activation '%s' (expected Relu, Tanh, Sigmoid, Affine, LeakyRelu, "
                  "ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, Softsign or Softplus)",
                  name);
}

static int rnn_attrs(es_kinst *k, rnn_params *p, int64_t *hidden_attr) {
  const char *dir;
  int64_t layout = 0, lbr = 0, inf = 0;
  int rc;
  if ((rc = es__attr_string(k, "direction", "forward", &dir)) < 0 ||
      (rc = es__attr_int(k, "hidden_size", 0, hidden_attr)) < 0 ||
      (rc = es__attr_int(k, "layout", 0, &layout)) < 0 ||
      (rc = es__attr_int(k, "linear_before_reset", 0, &lbr)) < 0 ||
      (rc = es__attr_int(k, "input_forget", 0, &inf)) < 0)
    return rc;
  if (!strcmp(dir, "forward") || !strcmp(dir, "reverse")) {
    p->dirs = 1;
    p->reverse = dir[0] == 'r';
  } else if (!strcmp(dir, "bidirectional")) {
    p->dirs = 2;
  } else {
    return ES_KFAIL(k, ES_EMODEL, "direction '%s' is not forward, reverse or bidirectional", dir);
  }
  if (layout != 0 && layout != 1)
    return ES_KFAIL(k, ES_EMODEL, "layout is %lld, expected 0 or 1", (long long)layout);
  if (layout && k->opset < 14)
    return ES_KFAIL(k, ES_EMODEL, "layout 1 needs opset 14 (the model's is %lld)",
                    (long long)k->opset);
  p->layout = (int)layout;
  p->lbr = lbr != 0;
  p->input_forget = inf != 0;
  if (es__kattr(k, "clip")) {
    if ((rc = es__attr_float(k, "clip", 0.0f, &p->clip)) < 0)
      return rc;
    if (!(p->clip > 0.0f))
      return ES_KFAIL(k, ES_EMODEL, "clip is %g, expected a positive threshold", (double)p->clip);
    p->has_clip = 1;
  }
  /* activations: per direction f, g, h (as many as the cell has) */
  static const char *const defaults[3][3] = {
      [RNN_CELL_RNN] = {"Tanh"},
      [RNN_CELL_GRU] = {"Sigmoid", "Tanh"},
      [RNN_CELL_LSTM] = {"Sigmoid", "Tanh", "Tanh"},
  };
  int na = p->cell == RNN_CELL_RNN ? 1 : p->cell == RNN_CELL_GRU ? 2 : 3;
  const char *const *names;
  const float *al, *be;
  size_t nn, nal, nbe;
  if ((rc = es__attr_strings(k, "activations", &names, &nn)) < 0 ||
      (rc = es__attr_floats(k, "activation_alpha", &al, &nal)) < 0 ||
      (rc = es__attr_floats(k, "activation_beta", &be, &nbe)) < 0)
    return rc;
  if (nn && nn != (size_t)na && nn != (size_t)(na * p->dirs))
    return ES_KFAIL(k, ES_EMODEL, "%zu activations, expected %d (%d per direction)", nn,
                    na * p->dirs, na);
  for (int d = 0; d < p->dirs; d++)
    for (int i = 0; i < na; i++) {
      const char *nm = !nn ? defaults[p->cell][i] : names[nn == (size_t)na ? i : d * na + i];
      if ((rc = rnn_act_parse(k, nm, &al, &nal, &be, &nbe, &p->act[d][i])) < 0)
        return rc;
    }
  return 0;
}

/* t is float32 of rank `rank` with the given dims (-1: any). */
static int rnn_check(es_kinst *k, const es_tdesc *t, const char *name, es_dtype dt, int rank,
                     const int64_t *dims) {
  int ok = t->dtype == dt && t->rank == rank;
  for (int i = 0; ok && i < rank; i++)
    ok = dims[i] < 0 || t->dims[i] == dims[i];
  if (ok)
    return 0;
  char want[96] = "", got[96] = "";
  for (int i = 0; i < rank; i++)
    snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", i ? ", " : "",
             (long long)dims[i]);
  for (int i = 0; i < t->rank; i++)
    snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "",
             (long long)t->dims[i]);
  return ES_KFAIL(k, ES_EMODEL, "%s is %s [%s], expected %s [%s]", name, es_dtype_name(t->dtype),
                  got, es_dtype_name(dt), want);
}

static const es_tdesc *rnn_in(const es_kinst *k, int i) { return i < k->n_in ? k->in[i] : NULL; }

static int rnn_shapes(es_kinst *k, rnn_params *p, int64_t hidden_attr) {
  const es_tdesc *x = k->in[0], *w = k->in[1], *r = k->in[2];
  if (x->dtype != ES_DTYPE_FLOAT) /* the other types allowed are outside es_dtype */
    return ES_KFAIL(k, ES_EMODEL, "X is %s, expected float32", es_dtype_name(x->dtype));
  if (x->rank != 3)
    return ES_KFAIL(k, ES_EMODEL, "X has rank %d, expected 3", x->rank);
  p->t = x->dims[p->layout ? 1 : 0];
  p->b = x->dims[p->layout ? 0 : 1];
  p->in = x->dims[2];
  if (r->rank != 3)
    return ES_KFAIL(k, ES_EMODEL, "R has rank %d, expected 3", r->rank);
  p->hid = hidden_attr > 0 ? hidden_attr : r->dims[2];
  if (hidden_attr < 0 || (hidden_attr > 0 && r->dims[2] != hidden_attr))
    return ES_KFAIL(k, ES_EMODEL, "hidden_size is %lld but R is [%lld, %lld, %lld]",
                    (long long)hidden_attr, (long long)r->dims[0], (long long)r->dims[1],
                    (long long)r->dims[2]);
  for (int i = 0; i < 3; i++)
    if (x->dims[i] > ((int64_t)1 << 32) || r->dims[i] > ((int64_t)1 << 32))
      return ES_KFAIL(k, ES_EMODEL, "a dimension is larger than 2^32");
  int64_t gh = p->gates * p->hid, d = p->dirs, bt = p->b, hh = p->hid;
  int rc;
  if ((rc = rnn_check(k, w, "W", ES_DTYPE_FLOAT, 3, (int64_t[]){d, gh, p->in})) < 0 ||
      (rc = rnn_check(k, r, "R", ES_DTYPE_FLOAT, 3, (int64_t[]){d, gh, hh})) < 0)
    return rc;
  const es_tdesc *b = rnn_in(k, 3), *sl = rnn_in(k, 4), *h0 = rnn_in(k, 5), *c0 = rnn_in(k, 6),
                 *pp = rnn_in(k, 7);
  int64_t sdims[3] = {d, bt, hh};
  if (p->layout)
    sdims[0] = bt, sdims[1] = d;
  if (b && (rc = rnn_check(k, b, "B", ES_DTYPE_FLOAT, 2, (int64_t[]){d, 2 * gh})) < 0)
    return rc;
  if (sl && (rc = rnn_check(k, sl, "sequence_lens", ES_DTYPE_INT32, 1, (int64_t[]){bt})) < 0)
    return rc;
  if (h0 && (rc = rnn_check(k, h0, "initial_h", ES_DTYPE_FLOAT, 3, sdims)) < 0)
    return rc;
  if (c0 && (rc = rnn_check(k, c0, "initial_c", ES_DTYPE_FLOAT, 3, sdims)) < 0)
    return rc;
  if (pp && (rc = rnn_check(k, pp, "P", ES_DTYPE_FLOAT, 2, (int64_t[]){d, 3 * hh})) < 0)
    return rc;
  p->has_b = b != NULL;
  p->has_seq = sl != NULL;
  p->has_h0 = h0 != NULL;
  p->has_c0 = c0 != NULL;
  p->has_p = pp != NULL;
  /* outputs */
  int64_t ydims[4] = {p->t, d, bt, hh};
  if (p->layout)
    ydims[0] = bt, ydims[1] = p->t, ydims[2] = d;
  es_tdesc *y = k->n_out > 0 ? k->out[0] : NULL, *yh = k->n_out > 1 ? k->out[1] : NULL,
           *yc = k->n_out > 2 ? k->out[2] : NULL;
  if (y && (rc = es__tdesc_set(y, ES_DTYPE_FLOAT, 4, ydims)) < 0)
    return ES_KFAIL(k, rc, "Y's shape: %s", es_last_error_detail());
  if (yh && (rc = es__tdesc_set(yh, ES_DTYPE_FLOAT, 3, sdims)) < 0)
    return ES_KFAIL(k, rc, "Y_h's shape: %s", es_last_error_detail());
  if (yc && (rc = es__tdesc_set(yc, ES_DTYPE_FLOAT, 3, sdims)) < 0)
    return ES_KFAIL(k, rc, "Y_c's shape: %s", es_last_error_detail());
  p->want_y = y != NULL;
  p->want_yh = yh != NULL;
  p->want_yc = yc != NULL;
  return 0;
}

/* ==========================================================================
 * The input projection
 * ======================================================================== */

static int rnn_dnnl_setup(es_kinst *k, rnn_params *p) {
  dnnl_dims_t xd = {p->t * p->b, p->in}, wd = {p->in, p->n}, ws = {1, p->in};
  int64_t yd[2] = {p->t * p->b, p->n};
  dnnl_memory_desc_t xmd, wmd, ymd, bmd, wany;
  const void *wstatic = k->in_static[1];
  dnnl_status_t st = es__dnnl_plain_md(&xmd, 2, xd);
  /* W [dirs, G*H, I] is [N, I]: the matmul's [I, N] by its strides */
  if (st == dnnl_success)
    st = dnnl_memory_desc_init_by_strides(&wmd, 2, wd, dnnl_f32, ws);
  if (st == dnnl_success)
    st = es__dnnl_plain_md(&ymd, 2, yd);
  if (st == dnnl_success && p->has_b)
    st = es__dnnl_plain_md(&bmd, 2, (int64_t[2]){1, p->n});
  if (st == dnnl_success && wstatic)
    st = dnnl_memory_desc_init_by_tag(&wany, 2, wd, dnnl_f32, dnnl_format_tag_any);
  if (st != dnnl_success)
    return es__dnnl_fail(k, st, "describing the input projection");
  dnnl_matmul_desc_t md;
  st = dnnl_matmul_desc_init(&md, &xmd, wstatic ? &wany : &wmd, p->has_b ? &bmd : NULL, &ymd);
  if (st != dnnl_success)
    return es__dnnl_fail(k, st, "describing the input projection");
  int rc = es__dnnl_prim_create(k, &md, NULL, &p->dnnl);
  if (rc < 0)
    return rc;
  return wstatic ? es__dnnl_weights_prepare(k, &p->dnnl, &wmd, wstatic) : 0;
}

/* proj [T*B, N] = X W^T + bias, with plain loops (reference kernels, and
 * shapes oneDNN refuses). */
static void rnn_proj_ref(const rnn_params *p, const float *x, const float *w, const float *bias,
                         float *proj) {
  int64_t m = p->t * p->b;
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < p->n; j++) {
      const float *xr = x + i * p->in, *wr = w + j * p->in;
      float s = 0.0f;
      for (int64_t q = 0; q < p->in; q++)
        s += xr[q] * wr[q];
      proj[i * p->n + j] = s + (bias ? bias[j] : 0.0f);
    }
}

/* ==========================================================================
 * Kernel
 * ======================================================================== */

static int rnn_infer_cell(es_kinst *k, rnn_cell cell) {
  rnn_params *p = es__kinst_params(k, sizeof *p);
  if (!p)
    return ES_ENOMEM;
  k->params = p;
  p->cell = cell;
  p->gates = cell == RNN_CELL_RNN ? 1 : cell == RNN_CELL_GRU ? 3 : 4;
  int rc = es__kio_check(k, 3, cell == RNN_CELL_LSTM ? 8 : 6, 0, cell == RNN_CELL_LSTM ? 3 : 2);
  if (rc < 0)
    return rc;
  int64_t hidden_attr;
  if ((rc = rnn_attrs(k, p, &hidden_attr)) < 0 || (rc = rnn_shapes(k, p, hidden_attr)) < 0)
    return rc;
  int64_t gh = p->gates * p->hid;
  p->n = p->dirs * gh;
  p->seg_a = cell == RNN_CELL_GRU && !p->lbr ? 2 * p->hid : gh;
  p->seg_b = gh - p->seg_a;
  p->recw = (rnn_panels(p->seg_a) + rnn_panels(p->seg_b)) * RNN_NB;
  p->pack_dir = (size_t)(rnn_panels(p->seg_a) + rnn_panels(p->seg_b)) * (size_t)p->hid * RNN_NB;
  k->inplace = -1;
  k->flops = 2 * (uint64_t)p->t * (uint64_t)p->b * (uint64_t)p->n * (uint64_t)(p->in + p->hid);

  /* Biases made once when B is known now. */
  const float *bst = p->has_b ? k->in_static[3] : NULL;
  int need_rbh = cell == RNN_CELL_GRU && p->lbr;
  if (bst) {
    float *bias = es__kinst_alloc(k, (size_t)p->n * sizeof(float) + 1);
    float *rbh = need_rbh ? es__kinst_alloc(k, (size_t)(p->dirs * p->hid) * sizeof(float) + 1)
                          : NULL;
    if (!bias || (need_rbh && !rbh))
      return ES_KFAIL(k, ES_ENOMEM, "out of memory for the biases");
    rnn_bias_fill(p, bst, bias, rbh);
    p->bias = bias;
    p->rbh = rbh;
  }

  /* The input projection. */
  p->proj_empty = p->t * p->b == 0 || p->n == 0;
  p->use_dnnl = !es__kernels_reference() && !p->proj_empty && p->in > 0;
  k->scratch_bytes = 0;
  if (p->use_dnnl &&
      (rc = es__dnnl_setup_done(k, &p->dnnl, rnn_dnnl_setup(k, p), &p->use_dnnl)) < 0)
    return rc;

  /* R packed once when known now. */
  p->r_static = k->in_static[2] != NULL;
  if (p->r_static && p->hid > 0) {
    rnn_pack_job job = {.r = k->in_static[2], .dirs = p->dirs, .hid = p->hid,
                        .seg_a = p->seg_a, .seg_b = p->seg_b, .pack_dir = p->pack_dir};
    char key[96];
    snprintf(key, sizeof key, "%s#%d:r:p%d", es__op_name(k->node.op), k->node.id, RNN_NB);
    if ((rc = es__kinst_prepared(k, key, p->pack_dir * (size_t)p->dirs * sizeof(float),
                                 rnn_pack_fill, &job, sizeof job, &p->rpack)) < 0)
      return rc;
  }

  /* Scratch after oneDNN's own. */
  rnn_scratch *s = &p->s;
  size_t at = es__align_up(k->scratch_bytes, 64), f = sizeof(float);
  size_t states = (size_t)(p->dirs * p->b * p->hid) * f;
#define RNN_TAKE(field, bytes)                                                                   \
  do {                                                                                           \
    s->field = at;                                                                               \
    at = es__align_up(at + (bytes), 64);                                                         \
  } while (0)
  RNN_TAKE(proj, (size_t)(p->t * p->b * p->n) * f);
  if (p->has_b && !bst) {
    RNN_TAKE(bias, (size_t)p->n * f);
    if (need_rbh)
      RNN_TAKE(rbh, (size_t)(p->dirs * p->hid) * f);
  }
  if (!p->r_static)
    RNN_TAKE(pack, p->pack_dir * (size_t)p->dirs * f);
  RNN_TAKE(h, states);
  RNN_TAKE(c, cell == RNN_CELL_LSTM ? states : 0);
  RNN_TAKE(rec, (size_t)(p->b * p->recw) * f);
  RNN_TAKE(tmp, (size_t)(p->b * p->hid) * f);
  RNN_TAKE(lens, (size_t)p->b * sizeof(int32_t));
#undef RNN_TAKE
  s->total = at;
  k->scratch_bytes = at;
  return 0;
}

static int lstm_infer(es_kinst *k) { return rnn_infer_cell(k, RNN_CELL_LSTM); }
static int gru_infer(es_kinst *k) { return rnn_infer_cell(k, RNN_CELL_GRU); }
static int simple_infer(es_kinst *k) { return rnn_infer_cell(k, RNN_CELL_RNN); }

/* Offsets of a state [dirs, B, H] (layout 0) or [B, dirs, H] (layout 1). */
static int64_t rnn_state_off(const rnn_params *p, int d, int64_t b) {
  return (p->layout ? b * p->dirs + d : d * p->b + b) * p->hid;
}

static int64_t rnn_y_off(const rnn_params *p, int64_t t, int d, int64_t b) {
  return (p->layout ? (b * p->t + t) * p->dirs + d : (t * p->dirs + d) * p->b + b) * p->hid;
}

/* One direction over the whole sequence. */
static void rnn_direction(const rnn_params *p, int d, const void *const *in, void *const *out,
                          char *scratch) {
  const int64_t hid = p->hid, bt = p->b, gh = p->gates * hid;
  const int rev = p->dirs == 2 ? d == 1 : p->reverse;
  const rnn_act *act = p->act[d];
  const int32_t *lens = (const int32_t *)(scratch + p->s.lens);
  const float *proj = (const float *)(scratch + p->s.proj);
  const float *pack = (const float *)(p->r_static ? p->rpack : scratch + p->s.pack) +
                      (size_t)d * p->pack_dir;
  const float *pack_b = pack + rnn_panels(p->seg_a) * hid * RNN_NB;
  const float *pe = p->has_p ? (const float *)in[7] + d * 3 * hid : NULL;
  const float *rbh = NULL;
  if (p->cell == RNN_CELL_GRU && p->lbr)
    rbh = p->has_b ? (p->rbh ? p->rbh : (const float *)(scratch + p->s.rbh)) + d * hid : NULL;
  float *hs = (float *)(scratch + p->s.h) + d * bt * hid;
  float *cs = p->cell == RNN_CELL_LSTM ? (float *)(scratch + p->s.c) + d * bt * hid : NULL;
  float *rec = (float *)(scratch + p->s.rec), *tmp = (float *)(scratch + p->s.tmp);
  float *y = p->want_y ? out[0] : NULL;
  int lstm_plain = p->cell == RNN_CELL_LSTM && !p->has_clip && !pe && !p->input_forget &&
                   act[0].kind == RNN_ACT_SIGMOID && act[1].kind == RNN_ACT_TANH &&
                   act[2].kind == RNN_ACT_TANH;

  for (int64_t b = 0; b < bt; b++) {
    const float *h0 = p->has_h0 ? (const float *)in[5] + rnn_state_off(p, d, b) : NULL;
    const float *c0 = p->has_c0 ? (const float *)in[6] + rnn_state_off(p, d, b) : NULL;
    for (int64_t j = 0; j < hid; j++) {
      hs[b * hid + j] = h0 ? h0[j] : 0.0f;
      if (cs)
        cs[b * hid + j] = c0 ? c0[j] : 0.0f;
    }
  }
  int32_t maxlen = 0;
  for (int64_t b = 0; b < bt; b++)
    maxlen = lens[b] > maxlen ? lens[b] : maxlen;

  for (int32_t step = 0; step < maxlen; step++) {
    /* the batch entries still running, by groups sharing the panels' reads */
    int64_t act_rows[RNN_MAX_ROWS];
    int64_t b = 0;
    while (b < bt) {
      int nr = 0;
      for (; b < bt && nr < RNN_MAX_ROWS; b++)
        if (step < lens[b])
          act_rows[nr++] = b;
      if (!nr)
        break;
      const float *xs[RNN_MAX_ROWS];
      float *ys[RNN_MAX_ROWS];
      for (int r = 0; r < nr; r++) {
        xs[r] = hs + act_rows[r] * hid;
        ys[r] = rec + act_rows[r] * p->recw;
      }
      if (hid > 0)
        rnn_gemv(pack, p->seg_a, hid, nr, xs, ys);
      for (int r = 0; r < nr; r++) {
        int64_t row = act_rows[r];
        int64_t t = rev ? lens[row] - 1 - step : step;
        const float *xw = proj + (p->layout ? row * p->t + t : t * bt + row) * p->n + d * gh;
        float *g = rec + row * p->recw, *h = hs + row * hid;
        float *tm = tmp + row * hid;
        switch (p->cell) {
        case RNN_CELL_LSTM:
          if (lstm_plain)
            rnn_lstm_plain(xw, g, cs + row * hid, h, hid);
          else
            rnn_lstm_step(p, act, xw, g, pe, cs + row * hid, h, tm);
          break;
        case RNN_CELL_RNN:
          rnn_acc(g, xw, NULL, NULL, hid);
          rnn_activate(&act[0], p->has_clip, p->clip, g, hid);
          memcpy(h, g, (size_t)hid * sizeof *h);
          break;
        case RNN_CELL_GRU:
          rnn_gru_zr(p, act, xw, g);
          if (p->lbr) {
            rnn_gru_h(p, act, xw, g, g + 2 * hid, rbh, h, tm);
          } else {
            /* r (.) H(t-1), then its product with R_h below */
            for (int64_t j = 0; j < hid; j++)
              tm[j] = g[hid + j] * h[j];
          }
          break;
        }
      }
      if (p->cell == RNN_CELL_GRU && !p->lbr) {
        for (int r = 0; r < nr; r++) {
          xs[r] = tmp + act_rows[r] * hid;
          ys[r] = rec + act_rows[r] * p->recw + rnn_panels(p->seg_a) * RNN_NB;
        }
        if (hid > 0)
          rnn_gemv(pack_b, p->seg_b, hid, nr, xs, ys);
        for (int r = 0; r < nr; r++) {
          int64_t row = act_rows[r];
          int64_t t = rev ? lens[row] - 1 - step : step;
          const float *xw = proj + (p->layout ? row * p->t + t : t * bt + row) * p->n + d * gh;
          float *g = rec + row * p->recw;
          rnn_gru_h(p, act, xw, g, g + rnn_panels(p->seg_a) * RNN_NB, NULL, hs + row * hid,
                    tmp + row * hid);
        }
      }
      if (y)
        for (int r = 0; r < nr; r++) {
          int64_t row = act_rows[r];
          int64_t t = rev ? lens[row] - 1 - step : step;
          memcpy(y + rnn_y_off(p, t, d, row), hs + row * hid, (size_t)hid * sizeof(float));
        }
    }
  }

  /* Y past each entry's length is zero; Y_h and Y_c are the last states
   * (zeros for an entry of length 0). */
  for (int64_t b = 0; b < bt; b++) {
    if (y)
      for (int64_t t = lens[b]; t < p->t; t++)
        memset(y + rnn_y_off(p, t, d, b), 0, (size_t)hid * sizeof(float));
    if (p->want_yh) {
      float *yh = (float *)out[1] + rnn_state_off(p, d, b);
      if (lens[b])
        memcpy(yh, hs + b * hid, (size_t)hid * sizeof(float));
      else
        memset(yh, 0, (size_t)hid * sizeof(float));
    }
    if (p->want_yc) {
      float *yc = (float *)out[2] + rnn_state_off(p, d, b);
      if (lens[b])
        memcpy(yc, cs + b * hid, (size_t)hid * sizeof(float));
      else
        memset(yc, 0, (size_t)hid * sizeof(float));
    }
  }
}

static int rnn_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  const rnn_params *p = k->params;
  char *sc = scratch;
  int32_t *lens = (int32_t *)(sc + p->s.lens);
  for (int64_t b = 0; b < p->b; b++) {
    int64_t l = p->has_seq ? ((const int32_t *)in[4])[b] : p->t;
    if (l < 0 || l > p->t)
      return ES_KFAIL(k, ES_EINVAL, "sequence_lens[%lld] is %lld, outside [0, %lld]",
                      (long long)b, (long long)l, (long long)p->t);
    lens[b] = (int32_t)l;
  }
  const float *bias = NULL;
  if (p->has_b) {
    bias = p->bias;
    if (!bias) {
      float *bv = (float *)(sc + p->s.bias);
      rnn_bias_fill(p, in[3], bv,
                    p->cell == RNN_CELL_GRU && p->lbr ? (float *)(sc + p->s.rbh) : NULL);
      bias = bv;
    }
  }
  if (!p->r_static && p->hid > 0) {
    rnn_pack_job job = {.r = in[2], .dirs = p->dirs, .hid = p->hid,
                        .seg_a = p->seg_a, .seg_b = p->seg_b, .pack_dir = p->pack_dir};
    rnn_pack(&job, (float *)(sc + p->s.pack));
  }
  float *proj = (float *)(sc + p->s.proj);
  if (!p->proj_empty) {
    if (p->use_dnnl) {
      int rc = es__dnnl_prim_run(k, &p->dnnl, in[0], p->dnnl.weights ? p->dnnl.weights : in[1],
                                 bias, proj, NULL, scratch);
      if (rc < 0)
        return rc;
    } else {
      rnn_proj_ref(p, in[0], in[1], bias, proj);
    }
  }
  for (int d = 0; d < p->dirs; d++)
    rnn_direction(p, d, in, out, sc);
  return 0;
}

static void rnn_release(es_kinst *k) {
  rnn_params *p = k->params;
  if (p)
    es__dnnl_prim_destroy(&p->dnnl);
}

static const es_kernel lstm_kernel = {lstm_infer, rnn_run, rnn_release, 0};
static const es_kernel gru_kernel = {gru_infer, rnn_run, rnn_release, 0};
static const es_kernel simple_kernel = {simple_infer, rnn_run, rnn_release, 0};

const es_kernel *es__kernels_recurrent(es_op op) {
  switch (op) {
  case ES_OP_LSTM:
    return &lstm_kernel;
  case ES_OP_GRU:
    return &gru_kernel;
  case ES_OP_RNN:
    return &simple_kernel;
  default:
    return NULL;
  }
}
