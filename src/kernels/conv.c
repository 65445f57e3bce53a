/* Conv and ConvTranspose (float32, 1-D to 3-D, groups, strides, dilations,
 * asymmetric pads, auto_pad, optional bias, fused post-ops), and the oneDNN
 * glue shared with matmul.c.
 *
 * Two paths, chosen per plan in infer:
 *   - oneDNN (default): a forward-inference (de)convolution primitive with
 *     weights left to oneDNN (format "any"), so it picks the layout its
 *     fastest kernel wants; forcing plain weights can drop it to a reference
 *     kernel hundreds of times slower. When that layout is not the model's,
 *     the static weights are reordered once into a prepared copy shared by
 *     every plan of the model (keyed by node and layout).
 *   - reference (es_engine_reference_kernels_set(1), ES_KERNELS=ref in the CLI): direct
 *     loops in plain C, correct for every attribute combination; used by
 *     tests, and as the fallback where oneDNN refuses: ConvTranspose with a
 *     negative begin pad or an end pad below -(stride - 1) (output_shape or
 *     output_padding), and any geometry it reports as unimplemented.
 *
 * Layouts (the kernels are layout-aware). 2-D and 3-D convs on the oneDNN
 * path run channels-last: X is read and Y written in NHWC, or NDHWC for
 * 3-D (oneDNN's nhwc and ndhwc tags), where oneDNN 2.6 has its fast
 * kernels (brgconv and brdgmm depthwise, at 100-200 GFLOP/s on one AVX-512
 * core; with nchw it runs im2col + sgemm, and depthwise convs 10-16x
 * slower). For 3-D convs, plain ncdhw also gets im2col + sgemm (r3d_18's
 * 3x3x3 convs: 45-97 GFLOP/s, its 7x7x3 stem 17, its 1x1x1 downsamplings
 * 3), ndhwc jit:avx512_core (105-210 GFLOP/s; the stem 176, 1x1x1 115).
 * oneDNN's blocked nCdhw16c is 8-20% faster still on the 3x3x3 convs but
 * has no fast kernel for 3 input channels and would be one more layout
 * for every other kernel to know. X and Y always share the layout: a mixed
 * pair (nchw in, nhwc out) gets oneDNN's reference kernel. So inside a
 * model's plan a plain X is asked for channels-last (ES_KRELAYOUT);
 * es__kernel_eval, which has no prepared-weights store (constant folding,
 * the tests' plain tensors), keeps plain in and out unless X already is
 * channels-last. 1-D convs and the reference path are plain and ask for a
 * plain X.
 *
 * Fused post-ops (attributes "_post" and "_post_f", written by the graph's
 * fusion pass) are applied after the bias, in order: Relu, Clip,
 * HardSigmoid, HardSwish, Sigmoid, Swish, and Add of input 3 (a residual
 * of the output's shape, asked for in the output's layout). Conv hands them
 * to oneDNN as post-ops (eltwise; binary add for the residual), computed
 * in registers before the store. A residual Add that comes first (ResNet's
 * Add then Relu) is oneDNN's sum post-op instead: Y holds the residual
 * before the conv and the conv adds into it. oneDNN 2.6 runs a binary add
 * with its older jit kernel, a sum with brgconv: r3d_18's 64-channel
 * 3x3x3 conv with Add and Relu took 92 ms with binary, 68 with sum (69
 * with no post-op at all). Y takes the residual's buffer when the planner
 * can give it (k->inplace = 3), else run copies the residual into Y. ConvTranspose does not: oneDNN 2.6 builds
 * a deconvolution from a backward-data convolution and adds bias and
 * post-ops in a separate slow loop, so conv_epilogue adds them instead.
 * The reference path applies them per element after its loops.
 *
 * Geometry is parsed once into conv_params with the spatial dimensions
 * right-aligned in three slots (a 2-D conv has depth 1, a 1-D conv depth
 * and height 1), so one loop nest serves every rank. The reference loops
 * accumulate whole output rows per kernel tap: the inner loop runs over the
 * output (Conv) or input (ConvTranspose) width with the valid range computed
 * up front, contiguous when the stride is 1.
 *
 * Weights must be static (known when planning): oneDNN needs them to
 * prepare its layout; the reference path follows the same rule so the two
 * accept the same models. A weight-only int8 Conv ("_w8", lowered from
 * DequantizeLinear of int8 weights by engine/fuse_qdq.c) keeps W in int8
 * with its scales as input 4 and dequantizes it into its scratch before
 * each run, into the layout the primitive chose (conv_w8_setup): the
 * model holds a quarter of the bytes, the request's arena the float copy
 * while the Conv runs. */
#include "kernels/dnnl_glue.h"
#include "kernels/fused.h"
#include "kernels/kernel.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ==========================================================================
 * Parameters and shape inference
 * ======================================================================== */

typedef enum { PAD_NOTSET, PAD_SAME_UPPER, PAD_SAME_LOWER, PAD_VALID } conv_autopad;

/* Bounds that keep every size computation far from int64 overflow: tensor
 * dims (a zero-sized tensor's other dims are otherwise unbounded) and the
 * strides, dilations and pads that multiply or add to them. */
#define ES_CONV_MAX ((int64_t)1 << 40)
#define ES_CONV_ATTR_MAX ((int64_t)1 << 20)

/* Bands (a long convolution split for safe points): at most this many, of
 * at most this many geometries (the first band, padded at the top; the
 * middle ones; the last, padded at the bottom and maybe shorter). */
#define CONV_BANDS_MAX 64
#define CONV_BAND_KINDS 4

typedef struct conv_params {
  int transpose;     /* ConvTranspose */
  int nsp;           /* spatial rank: 1..3 */
  int64_t n, c, m, g; /* batch, input channels, output channels, groups */
  /* Spatial geometry right-aligned in 3 slots (unused leading slots are 1
   * for sizes, strides and dilations, 0 for pads). pb/pe are the begin and
   * end pads; ConvTranspose's may be negative (from output_shape). */
  int64_t in[3], out[3], ker[3], str[3], dil[3], pb[3], pe[3];
  int64_t outpad[3]; /* ConvTranspose output_padding */
  int has_bias;
  size_t count;      /* output elements */
  int empty;         /* the output has no element: run does nothing */
  int use_dnnl;
  int nhwc;              /* X read and Y written channels-last (oneDNN 2-D and 3-D only) */
  int epilogue;          /* oneDNN path: bias and post-ops are ours (conv_epilogue) */
  int kxs;               /* ConvTranspose as one matmul (conv_kxs_setup) ... */
  size_t kxs_bias_at;    /* ... its bias repeated per kernel column, at this float
                            offset of the prepared weights (with has_bias) */
  es_posts post;         /* fused post-ops, applied after the bias in order; post.has_res:
                            one adds input 3 (the residual) */
  int nbands;            /* > 1: the run goes band by band of output rows, a safe point
                            between two (conv_bands_setup); 0: one primitive */
  int64_t band_rows;     /* output rows per band (the last may have fewer) */
  int band_prim[CONV_BANDS_MAX]; /* each band's geometry: an index into bprim */
  int64_t band_in0[CONV_BANDS_MAX]; /* ... and the first input row it reads */
  es_dnnl_prim bprim[CONV_BAND_KINDS]; /* one primitive per band geometry */
  int res_sum;           /* ... as oneDNN's sum: Y holds the residual before the conv */
  int bf16;              /* "_bf16": X rounded to bf16 at scratch offset bf_at, bf16
                            weights (dnnl_glue.h) */
  size_t bf_at;
  int w8;               /* "_w8": W is int8, dequantized per run by its scales (input 4:
                            one, or one per output channel) into scratch at w8_at, by
                            w8r on the oneDNN path (into the layout the conv wants),
                            else plainly */
  const float *w8_scale;
  int64_t w8_n;          /* scales: 1 or M */
  size_t w8_count;       /* W's elements (k->in is the planner's, gone when running) */
  size_t w8_at;
  es_dnnl_prim w8r;
  es_dnnl_prim dnnl;
} conv_params;

static int64_t floor_div(int64_t a, int64_t b) { /* b > 0 */
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}

static int conv_autopad_parse(es_kinst *k, conv_autopad *out) {
  const char *s;
  int rc = es__attr_string(k, "auto_pad", "NOTSET", &s);
  if (rc < 0)
    return rc;
  if (!strcmp(s, "NOTSET"))
    *out = PAD_NOTSET;
  else if (!strcmp(s, "SAME_UPPER"))
    *out = PAD_SAME_UPPER;
  else if (!strcmp(s, "SAME_LOWER"))
    *out = PAD_SAME_LOWER;
  else if (!strcmp(s, "VALID"))
    *out = PAD_VALID;
  else
    return ES_KFAIL(k, ES_EMODEL,
                    "auto_pad '%s' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID", s);
  return 0;
}

/* An ints attribute of exactly len values, each >= min (def when absent). */
static int conv_ints(es_kinst *k, const char *name, size_t len, int64_t min, int64_t def,
                     int64_t *out) {
  const int64_t *v;
  size_t n;
  int rc = es__attr_ints(k, name, &v, &n);
  if (rc < 0)
    return rc;
  if (!v) {
    for (size_t i = 0; i < len; i++)
      out[i] = def;
    return 0;
  }
  if (n != len)
    return ES_KFAIL(k, ES_EMODEL, "attribute '%s' has %zu values, expected %zu", name, n, len);
  for (size_t i = 0; i < len; i++) {
    if (v[i] < min)
      return ES_KFAIL(k, ES_EMODEL, "%s[%zu] is %lld, expected at least %lld", name, i,
                      (long long)v[i], (long long)min);
    out[i] = v[i];
  }
  return 0;
}

/* Inputs and the attributes common to Conv and ConvTranspose. Fills p's
 * channels and its spatial in/ker/str/dil (right-aligned). Sets *ap and the
 * raw pads (pads[0..nsp) begin, pads[nsp..2nsp) end). */
static int conv_parse_common(es_kinst *k, conv_params *p, conv_autopad *ap, int64_t *pads) {
  const char *op = es__op_name(k->node.op);
  if (k->n_in < 2 || !k->in[0] || !k->in[1])
    return ES_KFAIL(k, ES_EMODEL, "%s needs inputs X and W", op);
  int64_t w8 = 0;
  int rc = es__attr_int(k, "_w8", 0, &w8);
  if (rc < 0)
    return rc;
  p->w8 = w8 != 0;
  if (k->n_in > (p->w8 ? 5 : 3 + p->post.has_res))
    return ES_KFAIL(k, ES_EMODEL, "%s takes at most %d inputs (X, W, B%s), got %d", op,
                    p->w8 ? 5 : 3 + p->post.has_res,
                    p->w8 ? ", residual, W's scales" : p->post.has_res ? ", residual" : "",
                    k->n_in);
  if (p->post.has_res && (k->n_in < 4 || !k->in[3]))
    return ES_KFAIL(k, ES_EMODEL, "the fused Add (post-op 7) needs input 3, the residual");
  if (k->n_out != 1 || !k->out[0])
    return ES_KFAIL(k, ES_EMODEL, "%s has exactly one output", op);
  const es_tdesc *x = k->in[0], *w = k->in[1], *b = k->n_in > 2 ? k->in[2] : NULL;
  const char *names[3] = {"X", "W", "B"};
  const es_tdesc *ts[3] = {x, w, b};
  for (int i = 0; i < 3; i++) {
    es_dtype want = i == 1 && p->w8 ? ES_DTYPE_INT8 : ES_DTYPE_FLOAT;
    if (ts[i] && ts[i]->dtype != want)
      return ES_KFAIL(k, ES_EMODEL, "input %s is %s, expected %s", names[i],
                      es_dtype_name(ts[i]->dtype), es_dtype_name(want));
  }
  if (p->w8) {
    const es_tdesc *sc = k->n_in > 4 ? k->in[4] : NULL;
    if (p->transpose || !sc || !k->in_static[4] || sc->dtype != ES_DTYPE_FLOAT ||
        (sc->count != 1 && (sc->rank != 1 || (int64_t)sc->count != w->dims[0])))
      return ES_KFAIL(k, ES_EMODEL, "int8 weights (_w8) need a Conv's W scales as a constant "
                      "input 4, float32, one or one per output channel (%lld)",
                      (long long)w->dims[0]);
    p->w8_scale = k->in_static[4];
    p->w8_n = (int64_t)sc->count;
    p->w8_count = w->count;
  }
  if (x->rank < 3)
    return ES_KFAIL(k, ES_EMODEL, "X has rank %d, expected N x C x D1 ... (rank 3 or more)",
                    x->rank);
  if (x->rank > 5)
    return ES_KFAIL(k, ES_ENOTSUP, "X has rank %d: only 1-D to 3-D convolutions are supported",
                    x->rank);
  if (w->rank != x->rank)
    return ES_KFAIL(k, ES_EMODEL, "W has rank %d, expected %d (as X)", w->rank, x->rank);
  for (int t = 0; t < 2; t++)
    for (int i = 0; i < ts[t]->rank; i++)
      if (ts[t]->dims[i] > ES_CONV_MAX)
        return ES_KFAIL(k, ES_EMODEL, "dimension %d of %s is %lld, more than 2^40", i, names[t],
                        (long long)ts[t]->dims[i]);
  if (!k->in_static[1])
    return ES_KFAIL(k, ES_ENOTSUP, "W (weights) must be known when planning");
  int nsp = x->rank - 2;
  p->nsp = nsp;
  rc = es__attr_int(k, "group", 1, &p->g);
  if (rc < 0)
    return rc;
  if (p->g < 1)
    return ES_KFAIL(k, ES_EMODEL, "group is %lld, expected at least 1", (long long)p->g);
  p->n = x->dims[0];
  p->c = x->dims[1];
  if (p->c % p->g)
    return ES_KFAIL(k, ES_EMODEL, "X has %lld channels, not a multiple of group %lld",
                    (long long)p->c, (long long)p->g);
  if (!p->transpose) {
    p->m = w->dims[0];
    if (w->dims[1] * p->g != p->c)
      return ES_KFAIL(k, ES_EMODEL,
                      "W has %lld input channels per group, expected %lld (X's %lld / group %lld)",
                      (long long)w->dims[1], (long long)(p->c / p->g), (long long)p->c,
                      (long long)p->g);
    if (p->m % p->g)
      return ES_KFAIL(k, ES_EMODEL, "W has %lld output channels, not a multiple of group %lld",
                      (long long)p->m, (long long)p->g);
  } else {
    if (w->dims[0] != p->c)
      return ES_KFAIL(k, ES_EMODEL, "W's first dimension is %lld, expected X's %lld channels",
                      (long long)w->dims[0], (long long)p->c);
    p->m = w->dims[1] * p->g;
  }
  if (b && (b->rank != 1 || b->dims[0] != p->m))
    return ES_KFAIL(k, ES_EMODEL, "B must be 1-D with %lld values (the output channels)",
                    (long long)p->m);
  p->has_bias = b != NULL;

  int64_t ks[3], st[3], dl[3];
  for (int i = 0; i < nsp; i++)
    if (w->dims[2 + i] < 1)
      return ES_KFAIL(k, ES_EMODEL, "W's kernel dimension %d is %lld, expected at least 1", i,
                      (long long)w->dims[2 + i]);
  const int64_t *kv;
  size_t kn;
  if ((rc = es__attr_ints(k, "kernel_shape", &kv, &kn)) < 0)
    return rc;
  if (kv) {
    if (kn != (size_t)nsp)
      return ES_KFAIL(k, ES_EMODEL, "kernel_shape has %zu values, expected %d", kn, nsp);
    for (int i = 0; i < nsp; i++)
      if (kv[i] != w->dims[2 + i])
        return ES_KFAIL(k, ES_EMODEL, "kernel_shape[%d] is %lld but W's kernel is %lld", i,
                        (long long)kv[i], (long long)w->dims[2 + i]);
  }
  if ((rc = conv_ints(k, "strides", (size_t)nsp, 1, 1, st)) < 0 ||
      (rc = conv_ints(k, "dilations", (size_t)nsp, 1, 1, dl)) < 0 ||
      (rc = conv_ints(k, "pads", 2 * (size_t)nsp, 0, 0, pads)) < 0 ||
      (rc = conv_autopad_parse(k, ap)) < 0)
    return rc;
  for (int i = 0; i < nsp; i++) {
    ks[i] = w->dims[2 + i];
    if (st[i] > ES_CONV_ATTR_MAX || dl[i] > ES_CONV_ATTR_MAX || pads[i] > ES_CONV_ATTR_MAX ||
        pads[nsp + i] > ES_CONV_ATTR_MAX)
      return ES_KFAIL(k, ES_EMODEL, "strides, dilations or pads of spatial axis %d exceed 2^20",
                      i);
  }
  for (int s = 0; s < 3; s++) {
    int i = s - (3 - nsp);
    p->in[s] = i >= 0 ? x->dims[2 + i] : 1;
    p->ker[s] = i >= 0 ? ks[i] : 1;
    p->str[s] = i >= 0 ? st[i] : 1;
    p->dil[s] = i >= 0 ? dl[i] : 1;
  }
  return 0;
}

/* Split a total padding between begin and end (SAME_UPPER puts the extra
 * one at the end). Floor division, so a negative total (ConvTranspose asked
 * for a larger output) trims the end first. */
static void conv_split_pad(int64_t total, int upper, int64_t *pb, int64_t *pe) {
  if (upper) {
    *pb = floor_div(total, 2);
    *pe = total - *pb;
  } else {
    *pe = floor_div(total, 2);
    *pb = total - *pe;
  }
}

static int conv_geometry(es_kinst *k, conv_params *p) {
  conv_autopad ap;
  int64_t pads[6];
  int rc = conv_parse_common(k, p, &ap, pads);
  if (rc < 0)
    return rc;
  int nsp = p->nsp;
  for (int s = 0; s < 3; s++) {
    int i = s - (3 - nsp);
    int64_t in = p->in[s], dk = (p->ker[s] - 1) * p->dil[s] + 1, st = p->str[s];
    if (i < 0) {
      p->pb[s] = p->pe[s] = 0;
      p->out[s] = 1;
      continue;
    }
    if (ap == PAD_SAME_UPPER || ap == PAD_SAME_LOWER) {
      int64_t out = (in + st - 1) / st;
      int64_t total = (out - 1) * st + dk - in;
      conv_split_pad(total > 0 ? total : 0, ap == PAD_SAME_UPPER, &p->pb[s], &p->pe[s]);
    } else if (ap == PAD_VALID) {
      p->pb[s] = p->pe[s] = 0;
    } else {
      p->pb[s] = pads[i];
      p->pe[s] = pads[nsp + i];
    }
    int64_t span = in + p->pb[s] + p->pe[s];
    if (span < dk)
      return ES_KFAIL(k, ES_EMODEL,
                      "kernel extent %lld (kernel %lld, dilation %lld) is larger than the padded "
                      "input %lld on spatial axis %d",
                      (long long)dk, (long long)p->ker[s], (long long)p->dil[s], (long long)span,
                      i);
    p->out[s] = (span - dk) / st + 1;
  }
  return 0;
}

static int convtranspose_geometry(es_kinst *k, conv_params *p) {
  conv_autopad ap;
  int64_t pads[6], outpad[3];
  int rc = conv_parse_common(k, p, &ap, pads);
  if (rc < 0)
    return rc;
  int nsp = p->nsp;
  if ((rc = conv_ints(k, "output_padding", (size_t)nsp, 0, 0, outpad)) < 0)
    return rc;
  const int64_t *os;
  size_t osn;
  if ((rc = es__attr_ints(k, "output_shape", &os, &osn)) < 0)
    return rc;
  if (os && osn != (size_t)nsp && osn != (size_t)nsp + 2)
    return ES_KFAIL(k, ES_EMODEL, "output_shape has %zu values, expected %d (spatial) or %d",
                    osn, nsp, nsp + 2);
  if (os && osn == (size_t)nsp + 2)
    os += 2;
  for (int s = 0; s < 3; s++) {
    int i = s - (3 - nsp);
    if (i < 0) {
      p->pb[s] = p->pe[s] = p->outpad[s] = 0;
      p->out[s] = 1;
      continue;
    }
    if (outpad[i] > ES_CONV_ATTR_MAX)
      return ES_KFAIL(k, ES_EMODEL, "output_padding[%d] exceeds 2^20", i);
    p->outpad[s] = outpad[i];
    int64_t natural = p->str[s] * (p->in[s] - 1) + outpad[i] + (p->ker[s] - 1) * p->dil[s] + 1;
    if (os || ap == PAD_SAME_UPPER || ap == PAD_SAME_LOWER) {
      int64_t want = os ? os[i] : p->in[s] * p->str[s];
      if (want < 1 || want > ES_CONV_MAX)
        return ES_KFAIL(k, ES_EMODEL, "output_shape[%d] is %lld, expected a positive size", i,
                        (long long)want);
      conv_split_pad(natural - want, ap == PAD_SAME_UPPER, &p->pb[s], &p->pe[s]);
    } else if (ap == PAD_VALID) {
      p->pb[s] = p->pe[s] = 0;
    } else {
      p->pb[s] = pads[i];
      p->pe[s] = pads[nsp + i];
    }
    p->out[s] = natural - p->pb[s] - p->pe[s];
    if (p->out[s] < 1 && p->in[s] > 0)
      return ES_KFAIL(k, ES_EMODEL,
                      "output size %lld on spatial axis %d is not positive (pads %lld + %lld)",
                      (long long)p->out[s], i, (long long)p->pb[s], (long long)p->pe[s]);
    if (p->in[s] == 0)
      p->out[s] = 0;
  }
  return 0;
}

/* ==========================================================================
 * oneDNN path: descriptors
 * ======================================================================== */

/* Weights as the model stores them, in oneDNN's logical order
 * ([G,] O, I, spatial): Conv's W is [M, C/G, k...] = goihw in memory;
 * ConvTranspose's is [C, M/G, k...], i.e. g, i, o, spatial. */
static dnnl_status_t conv_user_wei_md(const conv_params *p, dnnl_memory_desc_t *md) {
  int nsp = p->nsp, grouped = p->g > 1, nd = 2 + nsp + grouped;
  int64_t og = p->m / p->g, ig = p->c / p->g, ksz = 1;
  dnnl_dims_t dims = {0}, str = {0};
  for (int i = nsp - 1; i >= 0; i--) {
    dims[nd - nsp + i] = p->ker[3 - nsp + i];
    str[nd - nsp + i] = ksz;
    ksz *= p->ker[3 - nsp + i];
  }
  int o = grouped + 0, in = grouped + 1;
  dims[o] = og;
  dims[in] = ig;
  if (!p->transpose) {
    str[in] = ksz;
    str[o] = ig * ksz;
  } else {
    str[o] = ksz;
    str[in] = og * ksz;
  }
  if (grouped) {
    dims[0] = p->g;
    str[0] = og * ig * ksz;
  }
  return dnnl_memory_desc_init_by_strides(md, nd, dims, dnnl_f32, str);
}

/* 1 when oneDNN takes this geometry; ConvTranspose maps output_padding to
 * the end pad, which oneDNN allows down to -(stride - 1). */
static int conv_dnnl_fits(const conv_params *p) {
  if (p->c / p->g == 0)
    return 0;
  for (int s = 3 - p->nsp; s < 3; s++) {
    if (p->pb[s] < 0)
      return 0;
    if (p->transpose && p->pe[s] - p->outpad[s] + p->str[s] <= 0)
      return 0;
  }
  return 1;
}

/* An activation descriptor: plain row-major, or channels-last for a 2-D
 * conv's NHWC or a 3-D conv's NDHWC tensor. */
static dnnl_status_t conv_act_md(dnnl_memory_desc_t *md, int nd, const int64_t *dims, int nhwc,
                                 dnnl_data_type_t dt) {
  if (!nhwc && dt == dnnl_f32)
    return es__dnnl_plain_md(md, nd, dims);
  dnnl_dims_t d = {0};
  for (int i = 0; i < nd; i++)
    d[i] = dims[i];
  dnnl_format_tag_t tag = nhwc ? (nd == 5 ? dnnl_ndhwc : dnnl_nhwc)
                               : (nd == 5 ? dnnl_abcde : nd == 4 ? dnnl_abcd : dnnl_abc);
  return dnnl_memory_desc_init_by_tag(md, nd, d, dt, tag);
}

/* ConvTranspose whose kernel equals its stride (no pads, dilation, output
 * padding or groups), channels-last, with static bias: each input pixel
 * writes its own kh x kw block of the output, so the whole op is one
 * matmul [N*H, 1, W, C] x [1, kh, C, kw*M] -> [N*H, kh, W, kw*M] (the
 * source broadcast over kh), whose dense source and destination are
 * exactly the NHWC input and output. oneDNN's brgemm matmul runs det's
 * 2x2 upsampling deconvolutions about twice as fast as its deconvolution,
 * bias and post-ops included. */
static int conv_kxs_fits(const es_kinst *k, const conv_params *p) {
  if (!p->transpose || p->nsp != 2 || !p->nhwc || p->g != 1 || (p->has_bias && !k->in_static[2]))
    return 0;
  for (int s = 1; s < 3; s++)
    if (p->ker[s] != p->str[s] || p->dil[s] != 1 || p->pb[s] || p->pe[s] || p->outpad[s])
      return 0;
  return 1;
}

typedef struct conv_kxs_job {
  const conv_params *p;
  const float *w, *b;
} conv_kxs_job;

void es__kxs_weights(void *dst, const void *w, size_t esz, int64_t c, int64_t m, int64_t kh,
                     int64_t kw) {
  int64_t n = kw * m;
  for (int64_t a = 0; a < kh; a++)
    for (int64_t ci = 0; ci < c; ci++)
      for (int64_t b = 0; b < kw; b++)
        for (int64_t o = 0; o < m; o++)
          memcpy((char *)dst + (size_t)((a * c + ci) * n + b * m + o) * esz,
                 (const char *)w + (size_t)(((ci * m + o) * kh + a) * kw + b) * esz, esz);
}

/* es_prep_fill_fn: the matmul's weights [kh][C][kw*M] from ConvTranspose's
 * [C][M][kh][kw], then the bias repeated kw times. */
static int conv_kxs_fill(void *user, void *dst, size_t bytes) {
  const conv_kxs_job *j = user;
  const conv_params *p = j->p;
  int64_t kh = p->ker[1], kw = p->ker[2], c = p->c, m = p->m, n = kw * m;
  float *d = dst;
  (void)bytes;
  es__kxs_weights(d, j->w, sizeof *d, c, m, kh, kw);
  if (j->b)
    for (int64_t b = 0; b < kw; b++)
      for (int64_t o = 0; o < m; o++)
        d[kh * c * n + b * m + o] = j->b[o];
  return 0;
}

static int conv_kxs_setup(es_kinst *k, conv_params *p) {
  int64_t kh = p->ker[1], kw = p->ker[2], nh = p->n * p->in[1], n = kw * p->m;
  dnnl_dims_t sd = {nh, 1, p->in[2], p->c}, wd = {1, kh, p->c, n}, dd = {nh, kh, p->in[2], n},
              bd = {1, 1, 1, n};
  dnnl_memory_desc_t smd, wmd, dmd, bmd;
  dnnl_status_t st = dnnl_memory_desc_init_by_tag(&smd, 4, sd, dnnl_f32, dnnl_abcd);
  if (st == dnnl_success)
    st = dnnl_memory_desc_init_by_tag(&wmd, 4, wd, dnnl_f32, dnnl_abcd);
  if (st == dnnl_success)
    st = dnnl_memory_desc_init_by_tag(&dmd, 4, dd, dnnl_f32, dnnl_abcd);
  if (st == dnnl_success)
    st = dnnl_memory_desc_init_by_tag(&bmd, 4, bd, dnnl_f32, dnnl_abcd);
  dnnl_post_ops_t po = NULL;
  if (st == dnnl_success && p->post.n) {
    st = dnnl_post_ops_create(&po);
    if (st == dnnl_success)
      st = es__dnnl_posts(&p->post, &dmd, po, 0, &p->dnnl, &p->res_sum);
  }
  dnnl_matmul_desc_t d;
  if (st == dnnl_success)
    st = dnnl_matmul_desc_init(&d, &smd, &wmd, p->has_bias ? &bmd : NULL, &dmd);
  int rc = st != dnnl_success ? es__dnnl_fail(k, st, "describing the matmul")
                              : es__dnnl_prim_create(k, &d, po, &p->dnnl);
  if (po)
    dnnl_post_ops_destroy(po);
  if (rc < 0)
    return rc;
  char key[160];
  snprintf(key, sizeof key, "%s#%d:w:kxs-matmul-abcd:%lldx%lldx%lldx%lld%s",
           es__op_name(k->node.op), k->node.id, (long long)kh, (long long)p->c,
           (long long)kw, (long long)p->m, p->has_bias ? "+b" : "");
  conv_kxs_job job = {p, k->in_static[1], p->has_bias ? k->in_static[2] : NULL};
  size_t wn = (size_t)(kh * p->c * n), bn = p->has_bias ? (size_t)n : 0;
  p->kxs_bias_at = wn;
  return es__kinst_prepared(k, key, (wn + bn) * sizeof(float), conv_kxs_fill, &job, sizeof job,
                            &p->dnnl.weights);
}

/* Output rows [o0, o0 + h) of a channels-last 2-D conv as a conv of its
 * own: the input rows it reads from *in0 on, *rows of them, with the pads
 * that fall inside the band (pt at the top, pb at the bottom). 0 when the
 * band reads no input row. */
static int conv_band_geometry(const conv_params *p, int64_t o0, int64_t h, int64_t *in0,
                              int64_t *rows, int64_t *pt, int64_t *pb) {
  int64_t s = p->str[1], ext = (p->ker[1] - 1) * p->dil[1] + 1;
  int64_t i0 = o0 * s - p->pb[1], i1 = (o0 + h - 1) * s - p->pb[1] + ext;
  *pt = i0 < 0 ? -i0 : 0;
  *pb = i1 > p->in[1] ? i1 - p->in[1] : 0;
  *in0 = i0 < 0 ? 0 : i0;
  *rows = (i1 < p->in[1] ? i1 : p->in[1]) - *in0;
  return *rows > 0;
}

/* a and b run oneDNN's same implementation (its name, e.g. "brg:avx512_core"). */
static int conv_same_impl(const es_dnnl_prim *a, const es_dnnl_prim *b) {
  const char *ia = NULL, *ib = NULL;
  if (dnnl_primitive_desc_query(a->pd, dnnl_query_impl_info_str, 0, &ia) != dnnl_success ||
      dnnl_primitive_desc_query(b->pd, dnnl_query_impl_info_str, 0, &ib) != dnnl_success)
    return 0;
  return ia && ib && !strcmp(ia, ib);
}

static void conv_bands_destroy(conv_params *p) {
  for (int i = 0; i < CONV_BAND_KINDS; i++)
    es__dnnl_prim_destroy(&p->bprim[i]);
  p->nbands = 0;
}

/* Splits a long channels-last 2-D convolution (more FLOPs than
 * es__kernels_split_flops) into bands of output rows, each a primitive over
 * the whole conv's prepared weights (p->dnnl's layout, which every band
 * must accept), so that a run can stop at a safe point between two bands
 * (es__kernels_safe_point). Rows are contiguous in NHWC: a band reads and
 * writes its part of X, Y and the residual in place. A geometry oneDNN
 * turns down leaves the conv whole. */
static int conv_bands_setup(es_kinst *k, conv_params *p, const dnnl_memory_desc_t *bias) {
  uint64_t split = es__kernels_split_flops();
  int64_t oh = p->out[1];
  if (!split || k->flops <= split || p->transpose || p->kxs || !p->nhwc || p->nsp != 2 ||
      p->n != 1 || p->epilogue || oh < 2)
    return 0;
  int64_t want = (int64_t)((k->flops + split - 1) / split);
  if (want > CONV_BANDS_MAX)
    want = CONV_BANDS_MAX;
  if (want > oh)
    want = oh;
  int64_t rows_per = (oh + want - 1) / want;
  int nb = (int)((oh + rows_per - 1) / rows_per);
  if (nb < 2)
    return 0;
  int64_t kind_key[CONV_BAND_KINDS][4];
  int kinds = 0;
  size_t scratch = k->scratch_bytes;
  dnnl_dims_t st = {p->str[1], p->str[2]}, dl = {p->dil[1] - 1, p->dil[2] - 1};
  int rc = 0;
  for (int b = 0; b < nb && rc == 0; b++) {
    int64_t o0 = b * rows_per, h = o0 + rows_per <= oh ? rows_per : oh - o0, in0, rows, pt, pb;
    if (!conv_band_geometry(p, o0, h, &in0, &rows, &pt, &pb)) {
      rc = 1;
      break;
    }
    int kind = 0;
    while (kind < kinds && !(kind_key[kind][0] == h && kind_key[kind][1] == rows &&
                             kind_key[kind][2] == pt && kind_key[kind][3] == pb))
      kind++;
    p->band_prim[b] = kind;
    p->band_in0[b] = in0;
    if (kind < kinds)
      continue;
    if (kinds == CONV_BAND_KINDS) {
      rc = 1;
      break;
    }
    kind_key[kinds][0] = h, kind_key[kinds][1] = rows, kind_key[kinds][2] = pt;
    kind_key[kinds][3] = pb;
    kinds++;
    int64_t xd[4] = {1, p->c, rows, p->in[2]}, yd[4] = {1, p->m, h, p->out[2]};
    dnnl_dims_t pl = {pt, p->pb[2]}, pr = {pb, p->pe[2]};
    dnnl_memory_desc_t xmd, ymd;
    dnnl_status_t stt = conv_act_md(&xmd, 4, xd, 1, p->bf16 ? dnnl_bf16 : dnnl_f32);
    if (stt == dnnl_success)
      stt = conv_act_md(&ymd, 4, yd, 1, dnnl_f32);
    es_dnnl_prim *bp = &p->bprim[kind];
    dnnl_post_ops_t po = NULL;
    int res_sum = 0;
    if (stt == dnnl_success && p->post.n) {
      stt = dnnl_post_ops_create(&po);
      if (stt == dnnl_success)
        stt = es__dnnl_posts(&p->post, &ymd, po, 1, bp, &res_sum);
    }
    dnnl_convolution_desc_t d;
    if (stt == dnnl_success)
      stt = dnnl_dilated_convolution_forward_desc_init(&d, dnnl_forward_inference,
                                                       dnnl_convolution_direct, &xmd,
                                                       p->dnnl.wei_md, bias, &ymd, st, dl, pl, pr);
    if (stt != dnnl_success || res_sum != p->res_sum)
      rc = 1;
    else if ((rc = es__dnnl_prim_create(k, &d, po, bp)) == ES_ENOTSUP)
      rc = 1;
    if (po)
      dnnl_post_ops_destroy(po);
    /* every band must take the whole conv's weights as they are prepared,
     * with the whole conv's implementation: oneDNN answers some band
     * geometries (a few rows, pads at one end only) with its reference
     * loops only, twenty times slower */
    if (rc == 0 && (!dnnl_memory_desc_equal(bp->wei_md, p->dnnl.wei_md) ||
                    !conv_same_impl(bp, &p->dnnl)))
      rc = 1;
    if (rc == 0 && k->scratch_bytes > scratch)
      scratch = k->scratch_bytes;
  }
  k->scratch_bytes = scratch;
  if (rc != 0) { /* 1: a geometry the bands cannot take; the conv stays whole */
    conv_bands_destroy(p);
    return rc < 0 ? rc : 0;
  }
  p->nbands = nb;
  p->band_rows = rows_per;
  return 0;
}

/* The primitive for p's descriptors: bias and post-ops fused unless
 * p->epilogue leaves them to conv_epilogue. */
static int conv_dnnl_create(es_kinst *k, conv_params *p, const dnnl_memory_desc_t *xmd,
                            const dnnl_memory_desc_t *wany, const dnnl_memory_desc_t *bmd,
                            const dnnl_memory_desc_t *ymd, const int64_t *st, const int64_t *dl,
                            const int64_t *pl, const int64_t *pr) {
  dnnl_status_t stt = dnnl_success;
  dnnl_post_ops_t po = NULL;
  if (p->post.n && !p->epilogue) {
    stt = dnnl_post_ops_create(&po);
    if (stt == dnnl_success)
      stt = es__dnnl_posts(&p->post, ymd, po, 1, &p->dnnl, &p->res_sum);
    if (stt != dnnl_success) {
      if (po)
        dnnl_post_ops_destroy(po);
      return es__dnnl_fail(k, stt, "describing the fused post-ops");
    }
  }
  const dnnl_memory_desc_t *bias = p->has_bias && !p->epilogue ? bmd : NULL;
  int rc;
  if (!p->transpose) {
    dnnl_convolution_desc_t d;
    stt = dnnl_dilated_convolution_forward_desc_init(&d, dnnl_forward_inference,
                                                     dnnl_convolution_direct, xmd, wany, bias,
                                                     ymd, st, dl, pl, pr);
    rc = stt != dnnl_success ? es__dnnl_fail(k, stt, "describing the convolution")
                             : es__dnnl_prim_create(k, &d, po, &p->dnnl);
  } else {
    dnnl_deconvolution_desc_t d;
    stt = dnnl_dilated_deconvolution_forward_desc_init(&d, dnnl_forward_inference,
                                                       dnnl_deconvolution_direct, xmd, wany,
                                                       bias, ymd, st, dl, pl, pr);
    rc = stt != dnnl_success ? es__dnnl_fail(k, stt, "describing the transposed convolution")
                             : es__dnnl_prim_create(k, &d, po, &p->dnnl);
  }
  if (po)
    dnnl_post_ops_destroy(po);
  return rc;
}

/* Weight-only int8 ("_w8"): a reorder from the int8 weights as the
 * model stores them to the layout the conv chose, times the per-channel
 * scales (float(wq) * s, rounded once: DequantizeLinear's numbers), into
 * scratch at w8_at, sized by that layout; run before each convolution. */
static int conv_w8_setup(es_kinst *k, conv_params *p, const dnnl_memory_desc_t *wuser) {
  dnnl_memory_desc_t ws = *wuser;
  ws.data_type = dnnl_s8;
  int rc = es__dnnl_reorder_create(k, &ws, p->dnnl.wei_md, p->w8_scale, p->w8_n,
                                   p->g > 1 ? 3 : 1, &p->w8r);
  if (rc == 0) {
    p->w8_at = es__align_up(k->scratch_bytes, 64);
    k->scratch_bytes = p->w8_at + dnnl_memory_desc_get_size(p->dnnl.wei_md);
  }
  return rc;
}

static int conv_dnnl_setup(es_kinst *k, conv_params *p) {
  int nsp = p->nsp, nd = 2 + nsp;
  int64_t xd[5] = {p->n, p->c}, yd[5] = {p->n, p->m}, bd[1] = {p->m};
  dnnl_dims_t st = {0}, dl = {0}, pl = {0}, pr = {0};
  for (int i = 0; i < nsp; i++) {
    int s = 3 - nsp + i;
    xd[2 + i] = p->in[s];
    yd[2 + i] = p->out[s];
    st[i] = p->str[s];
    dl[i] = p->dil[s] - 1; /* oneDNN counts the holes, ONNX the step */
    pl[i] = p->pb[s];
    pr[i] = p->transpose ? p->pe[s] - p->outpad[s] : p->pe[s];
  }
  if (conv_kxs_fits(k, p)) {
    p->kxs = 1;
    p->epilogue = 0;
    return conv_kxs_setup(k, p);
  }
  dnnl_memory_desc_t xmd, ymd, bmd, wany, wuser;
  dnnl_data_type_t wdt = p->bf16 ? dnnl_bf16 : dnnl_f32;
  dnnl_status_t stt = conv_act_md(&xmd, nd, xd, p->nhwc, wdt);
  if (stt == dnnl_success)
    stt = conv_act_md(&ymd, nd, yd, p->nhwc, dnnl_f32);
  if (stt == dnnl_success)
    stt = es__dnnl_plain_md(&bmd, 1, bd);
  if (stt == dnnl_success)
    stt = conv_user_wei_md(p, &wuser);
  if (stt == dnnl_success)
    stt = dnnl_memory_desc_init_by_tag(&wany, wuser.ndims, wuser.dims, wdt,
                                       dnnl_format_tag_any);
  if (stt != dnnl_success)
    return es__dnnl_fail(k, stt, "describing the tensors");
  /* oneDNN 2.6 builds a deconvolution from a backward-data convolution and
   * then adds the bias, and applies post-ops, in a separate plain loop
   * (adding 24 biases to a 24x320x320 output took 4.5 ms, five times the
   * deconvolution itself): ConvTranspose leaves both to conv_epilogue. */
  p->epilogue = p->transpose;
  int rc = conv_dnnl_create(k, p, &xmd, &wany, &bmd, &ymd, st, dl, pl, pr);
  /* oneDNN 2.6's portable GEMM convolution (the only one it has for CPUs
   * without its JIT kernels, e.g. Armv8.2 without SVE) gets a binary
   * post-op wrong when the tensors are channels-last: a residual Add
   * after HardSwish was off by up to 1.9 (test_conv). Such a conv runs
   * without post-ops, and conv_epilogue applies them. */
  if (rc == 0 && !p->epilogue && p->nhwc && p->dnnl.bin_arg &&
      !strcmp(es__dnnl_impl_name(&p->dnnl), "gemm:ref")) {
    es__dnnl_prim_destroy(&p->dnnl);
    p->res_sum = 0;
    p->epilogue = 1;
    rc = conv_dnnl_create(k, p, &xmd, &wany, &bmd, &ymd, st, dl, pl, pr);
  }
  const dnnl_memory_desc_t *bias = p->has_bias && !p->epilogue ? &bmd : NULL;
  if (rc == 0 && !p->transpose)
    rc = conv_bands_setup(k, p, bias);
  if (rc == 0 && p->w8)
    rc = conv_w8_setup(k, p, &wuser);
  else if (rc == 0)
    rc = es__dnnl_weights_prepare(k, &p->dnnl, &wuser, k->in_static[1]);
  if (rc == 0 && p->bf16) /* after oneDNN's scratchpad, the largest of the bands' */
    p->bf_at = es__dnnl_bf16_room(k, (size_t)xd[0] * (size_t)xd[1] * (size_t)p->in[0] *
                                         (size_t)p->in[1] * (size_t)p->in[2]);
  if (rc < 0)
    conv_bands_destroy(p);
  return rc;
}

/* ==========================================================================
 * Reference path
 * ======================================================================== */

/* [lo, hi) of positions o in [0, n_o) with o * st + off inside [0, n_i). */
static void conv_range(int64_t n_o, int64_t n_i, int64_t st, int64_t off, int64_t *lo,
                       int64_t *hi) {
  int64_t a = off >= 0 ? 0 : (-off + st - 1) / st;
  int64_t b = n_i - 1 - off < 0 ? 0 : floor_div(n_i - 1 - off, st) + 1;
  *lo = a;
  *hi = b < n_o ? b : n_o;
  if (*hi < *lo)
    *hi = *lo;
}


/* Accumulate w * x[o * st + off] into y[o] for o in [lo, hi). */
static void conv_row(float *restrict y, const float *restrict x, float w, int64_t lo, int64_t hi,
                     int64_t st, int64_t off) {
  if (st == 1) {
    es__axpy_f32(y + lo, x + lo + off, w, hi - lo);
  } else {
    for (int64_t o = lo; o < hi; o++)
      y[o] += w * x[o * st + off];
  }
}

/* Scatter w * x[i] into y[i * st + off] for i in [lo, hi). */
static void convt_row(float *restrict y, const float *restrict x, float w, int64_t lo, int64_t hi,
                      int64_t st, int64_t off) {
  if (st == 1) {
    es__axpy_f32(y + lo + off, x + lo, w, hi - lo);
  } else {
    for (int64_t i = lo; i < hi; i++)
      y[i * st + off] += w * x[i];
  }
}

static void conv_ref(const conv_params *p, const float *x, const float *w, const float *b,
                     float *y) {
  const int64_t *in = p->in, *out = p->out, *ks = p->ker, *st = p->str, *dl = p->dil, *pb = p->pb;
  int64_t cg = p->c / p->g, mg = p->m / p->g;
  int64_t isz = in[0] * in[1] * in[2], osz = out[0] * out[1] * out[2];
  int64_t ksz = ks[0] * ks[1] * ks[2];
  for (int64_t n = 0; n < p->n; n++)
    for (int64_t oc = 0; oc < p->m; oc++) {
      float *yp = y + (n * p->m + oc) * osz;
      float bias = b ? b[oc] : 0.0f;
      for (int64_t i = 0; i < osz; i++)
        yp[i] = bias;
      int64_t g = oc / mg;
      for (int64_t icl = 0; icl < cg; icl++) {
        const float *xp = x + (n * p->c + g * cg + icl) * isz;
        const float *wp = w + (oc * cg + icl) * ksz;
        for (int64_t kd = 0; kd < ks[0]; kd++)
          for (int64_t kh = 0; kh < ks[1]; kh++)
            for (int64_t kw = 0; kw < ks[2]; kw++) {
              float wv = wp[(kd * ks[1] + kh) * ks[2] + kw];
              int64_t d_lo, d_hi, h_lo, h_hi, w_lo, w_hi;
              int64_t doff = kd * dl[0] - pb[0], hoff = kh * dl[1] - pb[1],
                      woff = kw * dl[2] - pb[2];
              conv_range(out[0], in[0], st[0], doff, &d_lo, &d_hi);
              conv_range(out[1], in[1], st[1], hoff, &h_lo, &h_hi);
              conv_range(out[2], in[2], st[2], woff, &w_lo, &w_hi);
              for (int64_t od = d_lo; od < d_hi; od++)
                for (int64_t oh = h_lo; oh < h_hi; oh++) {
                  int64_t id = od * st[0] + doff, ih = oh * st[1] + hoff;
                  conv_row(yp + (od * out[1] + oh) * out[2], xp + (id * in[1] + ih) * in[2], wv,
                           w_lo, w_hi, st[2], woff);
                }
            }
      }
    }
}

static void convtranspose_ref(const conv_params *p, const float *x, const float *w,
                              const float *b, float *y) {
  const int64_t *in = p->in, *out = p->out, *ks = p->ker, *st = p->str, *dl = p->dil, *pb = p->pb;
  int64_t cg = p->c / p->g, mg = p->m / p->g;
  int64_t isz = in[0] * in[1] * in[2], osz = out[0] * out[1] * out[2];
  int64_t ksz = ks[0] * ks[1] * ks[2];
  for (int64_t n = 0; n < p->n; n++)
    for (int64_t oc = 0; oc < p->m; oc++) {
      float *yp = y + (n * p->m + oc) * osz;
      float bias = b ? b[oc] : 0.0f;
      for (int64_t i = 0; i < osz; i++)
        yp[i] = bias;
      int64_t g = oc / mg, ocl = oc % mg;
      for (int64_t icl = 0; icl < cg; icl++) {
        int64_t ic = g * cg + icl;
        const float *xp = x + (n * p->c + ic) * isz;
        const float *wp = w + (ic * mg + ocl) * ksz;
        for (int64_t kd = 0; kd < ks[0]; kd++)
          for (int64_t kh = 0; kh < ks[1]; kh++)
            for (int64_t kw = 0; kw < ks[2]; kw++) {
              float wv = wp[(kd * ks[1] + kh) * ks[2] + kw];
              int64_t d_lo, d_hi, h_lo, h_hi, w_lo, w_hi;
              int64_t doff = kd * dl[0] - pb[0], hoff = kh * dl[1] - pb[1],
                      woff = kw * dl[2] - pb[2];
              /* Input positions i whose output i * st + off lands inside. */
              conv_range(in[0], out[0], st[0], doff, &d_lo, &d_hi);
              conv_range(in[1], out[1], st[1], hoff, &h_lo, &h_hi);
              conv_range(in[2], out[2], st[2], woff, &w_lo, &w_hi);
              for (int64_t id = d_lo; id < d_hi; id++)
                for (int64_t ih = h_lo; ih < h_hi; ih++) {
                  int64_t od = id * st[0] + doff, oh = ih * st[1] + hoff;
                  convt_row(yp + (od * out[1] + oh) * out[2], xp + (id * in[1] + ih) * in[2], wv,
                            w_lo, w_hi, st[2], woff);
                }
            }
      }
    }
}

/* Bias and post-ops after a oneDNN primitive that computed neither: the
 * bias per channel plane (plain) or per pixel (channels-last; one channel:
 * the whole output), vectorisable either way, then the post-ops. */
static void conv_epilogue(const conv_params *p, float *y, const float *b, const float *res) {
  if (b) {
    size_t planes = (size_t)p->n * (size_t)p->m, psz = p->count / (planes ? planes : 1);
    if (p->m == 1) {
      for (size_t i = 0; i < p->count; i++)
        y[i] += b[0];
    } else if (p->nhwc) {
      size_t m = (size_t)p->m;
      for (size_t px = 0; px < p->count / m; px++)
        for (size_t c = 0; c < m; c++)
          y[px * m + c] += b[c];
    } else {
      for (size_t pl = 0; pl < planes; pl++)
        for (size_t i = 0; i < psz; i++)
          y[pl * psz + i] += b[pl % (size_t)p->m];
    }
  }
  es__posts_ref(&p->post, y, res, p->count);
}

/* ==========================================================================
 * Kernels
 * ======================================================================== */

/* Whether the conv runs channels-last (X read and Y written NHWC, or
 * NDHWC): on oneDNN's 2-D and 3-D paths, inside a model's plan (k->prep
 * set: the planner tracks layouts, converts a plain X for us and the
 * graph's outputs back) or when X already is channels-last.
 * es__kernel_eval, which folds constants and serves the tests with plain
 * tensors, has no store and so gets plain results. X and Y always share a
 * layout: oneDNN 2.6 runs a mixed pair (nchw in, nhwc out) with its
 * reference kernel, hundreds of times slower. */
static int conv_wants_nhwc(const es_kinst *k, const conv_params *p) {
  return p->use_dnnl && (p->nsp == 2 || p->nsp == 3) &&
         (k->in[0]->layout == ES_LAYOUT_NHWC || k->prep);
}

static int conv_infer_common(es_kinst *k, int transpose) {
  conv_params *p = es__kinst_alloc(k, sizeof *p);
  if (!p)
    return ES_KFAIL(k, ES_ENOMEM, "out of memory for parameters");
  k->params = p;
  p->transpose = transpose;
  int rc = es__posts_parse(k, &p->post);
  if (rc == 0)
    rc = transpose ? convtranspose_geometry(k, p) : conv_geometry(k, p);
  if (rc < 0)
    return rc;
  int64_t dims[5] = {p->n, p->m};
  for (int i = 0; i < p->nsp; i++)
    dims[2 + i] = p->out[3 - p->nsp + i];
  es_tdesc *y = k->out[0];
  if ((rc = es__tdesc_set(y, ES_DTYPE_FLOAT, 2 + p->nsp, dims)) < 0)
    return ES_KFAIL(k, rc, "output shape: %s", es_last_error_detail());
  const es_tdesc *res = p->post.has_res ? k->in[3] : NULL;
  if (res && (res->dtype != ES_DTYPE_FLOAT || !es__tdesc_same_shape(res, y)))
    return ES_KFAIL(k, ES_EMODEL, "the residual (input 3) must be float32 of the output's shape");
  k->scratch_bytes = 0;
  k->inplace = -1;
  {
    /* each output (conv) or input (transpose) position: C/g x kernel MACs */
    uint64_t pos = 1, ker = 1;
    for (int i = 0; i < 3; i++) {
      pos *= (uint64_t)(transpose ? p->in[i] : p->out[i]);
      ker *= (uint64_t)p->ker[i];
    }
    uint64_t per = transpose ? (uint64_t)(p->m / p->g) : (uint64_t)(p->c / p->g);
    k->flops = 2 * (uint64_t)p->n * (uint64_t)(transpose ? p->c : p->m) * pos * per * ker;
  }
  p->count = y->count;
  p->empty = y->count == 0;
  p->use_dnnl = !p->empty && !es__kernels_reference() && conv_dnnl_fits(p);
  p->nhwc = conv_wants_nhwc(k, p);
  p->bf16 = !transpose && !p->w8 && es__dnnl_bf16_wanted(k);
  if (p->use_dnnl) {
    int src = conv_dnnl_setup(k, p);
    if (src == ES_ENOTSUP && p->bf16) { /* no bf16 kernel for this geometry: float32 */
      es__dnnl_prim_destroy(&p->dnnl);
      conv_bands_destroy(p);
      k->scratch_bytes = 0;
      p->bf16 = 0;
      src = conv_dnnl_setup(k, p);
    }
    if ((rc = es__dnnl_setup_done(k, &p->dnnl, src, &p->use_dnnl)) < 0)
      return rc;
  }
  if (!p->use_dnnl) {
    conv_bands_destroy(p);
    es__dnnl_prim_destroy(&p->w8r);
    p->nhwc = p->res_sum = 0; /* the reference loops read and write plain tensors only */
    p->bf16 = 0;
    if (p->w8) { /* W dequantized plainly into scratch on each run */
      p->w8_at = es__align_up(k->scratch_bytes, 64);
      k->scratch_bytes = p->w8_at + p->w8_count * sizeof(float);
    }
  }
  /* Ask for X, and the residual, in the layout the conv runs in. */
  k->want_plain = k->want_nhwc = 0;
  uint32_t *want = p->nhwc ? &k->want_nhwc : &k->want_plain;
  if ((k->in[0]->layout == ES_LAYOUT_NHWC) != p->nhwc)
    *want |= 1u;
  if (res && (res->layout == ES_LAYOUT_NHWC) != p->nhwc)
    *want |= 1u << 3;
  if (*want) {
    es__dnnl_prim_destroy(&p->dnnl);
    es__dnnl_prim_destroy(&p->w8r);
    conv_bands_destroy(p);
    return ES_KRELAYOUT;
  }
  if (p->nhwc)
    y->layout = ES_LAYOUT_NHWC;
  /* A sum adds into Y: Y may as well be the residual's own buffer. */
  if (p->res_sum)
    k->inplace = 3;
  return 0;
}

static int conv_infer(es_kinst *k) { return conv_infer_common(k, 0); }
static int convtranspose_infer(es_kinst *k) { return conv_infer_common(k, 1); }

/* Band by band (conv_bands_setup), each reading and writing its rows of
 * the channels-last tensors in place, with a safe point between two. x is
 * float32, or bf16 (p->bf16): esz bytes per element. */
static int conv_run_bands(const es_kinst *k, const conv_params *p, const void *x, size_t esz,
                          const void *w, const void *bias, float *y, const float *res,
                          void *scratch) {
  size_t xrow = (size_t)p->in[2] * (size_t)p->c * esz, yrow = (size_t)p->out[2] * (size_t)p->m;
  for (int b = 0; b < p->nbands; b++) {
    size_t yo = (size_t)(b * p->band_rows) * yrow;
    int rc = es__dnnl_prim_run(k, &p->bprim[p->band_prim[b]],
                               (const char *)x + (size_t)p->band_in0[b] * xrow, w, bias, y + yo,
                               res ? res + yo : NULL, scratch);
    if (rc < 0)
      return rc;
    if (b + 1 < p->nbands)
      es__kernels_safe_point();
  }
  return 0;
}

static int conv_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  const conv_params *p = k->params;
  if (p->empty)
    return 0;
  const void *bias = p->has_bias ? in[2] : NULL;
  const void *res = p->post.has_res ? in[3] : NULL;
  if (p->use_dnnl) {
    if (p->kxs) /* prepared weights, then the bias */
      bias = p->has_bias ? (const float *)p->dnnl.weights + p->kxs_bias_at : NULL;
    if (p->res_sum && out[0] != res)
      memcpy(out[0], res, p->count * sizeof(float));
    const void *w = p->dnnl.weights ? p->dnnl.weights : in[1];
    if (p->w8) {
      void *wf = (char *)scratch + p->w8_at;
      int rc = es__dnnl_prim_run(k, &p->w8r, in[1], NULL, NULL, wf, NULL, scratch);
      if (rc < 0)
        return rc;
      w = wf;
    }
    const void *x = in[0];
    if (p->bf16) {
      uint16_t *xb = (uint16_t *)((char *)scratch + p->bf_at);
      es__f32_to_bf16(xb, in[0], (size_t)p->n * (size_t)p->c * (size_t)p->in[0] *
                                     (size_t)p->in[1] * (size_t)p->in[2]);
      x = xb;
    }
    if (p->nbands > 1)
      return conv_run_bands(k, p, x, p->bf16 ? 2 : 4, w, bias, out[0], p->res_sum ? NULL : res,
                            scratch);
    int rc = es__dnnl_prim_run(k, &p->dnnl, x, w, p->epilogue ? NULL : bias, out[0],
                               p->epilogue || p->res_sum ? NULL : res, scratch);
    if (rc == 0 && p->epilogue)
      conv_epilogue(p, out[0], bias, res);
    return rc;
  }
  const float *w = in[1];
  if (p->w8) {
    float *wf = (float *)((char *)scratch + p->w8_at);
    const int8_t *wq = in[1];
    size_t per = p->w8_count / (size_t)p->m; /* W is [M, C/g, k...] */
    for (size_t i = 0; i < p->w8_count; i++)
      wf[i] = (float)wq[i] * p->w8_scale[p->w8_n == 1 ? 0 : i / per];
    w = wf;
  }
  if (p->transpose)
    convtranspose_ref(p, in[0], w, bias, out[0]);
  else
    conv_ref(p, in[0], w, bias, out[0]);
  es__posts_ref(&p->post, out[0], res, p->count);
  return 0;
}

static void conv_release(es_kinst *k) {
  conv_params *p = k->params;
  if (p) {
    es__dnnl_prim_destroy(&p->dnnl);
    es__dnnl_prim_destroy(&p->w8r);
    conv_bands_destroy(p);
  }
}

static const es_kernel conv_kernel = {conv_infer, conv_run, conv_release, ES_KLAYOUT_5D};
static const es_kernel convtranspose_kernel = {convtranspose_infer, conv_run, conv_release,
                                               ES_KLAYOUT_5D};

const es_kernel *es__kernels_conv(es_op op) {
  switch (op) {
  case ES_OP_Conv:
    return &conv_kernel;
  case ES_OP_ConvTranspose:
    return &convtranspose_kernel;
  default:
    return NULL;
  }
}
