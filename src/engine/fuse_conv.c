/* Fusion pass 2 (see fuse.c): per-channel affine maps folded into a
 * convolution's weights and bias, then the activations and residual Add
 * after it as post-ops (codes in kernels/fused.h). */
#include "engine/fuse.h"

#include "common/internal.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ==========================================================================
 * Pass 2a: per-channel affine maps into a convolution's weights
 * ======================================================================== */

/* Per-channel y = s[c] * x + t[c], double. */
typedef struct affine {
  int64_t m;
  double *s, *t;
} affine;

/* Reads a per-channel constant for a rank-R tensor with m channels on axis 1:
 * every dimension 1 but that axis, which is 1 or m. *chan says whether it
 * varies per channel. */
static int chan_const(const es_graph *g, int c, int rank, int64_t m, int *chan) {
  if (!es__fz_const_f32(g, c))
    return 0;
  const es_value *cv = &g->values[c];
  if (cv->rank > rank)
    return 0;
  *chan = 0;
  for (int i = 0; i < cv->rank; i++) {
    int pos = rank - cv->rank + i;
    if (cv->dims[i] == 1)
      continue;
    if (pos != 1 || cv->dims[i] != m)
      return 0;
    *chan = 1;
  }
  return 1;
}

static double chan_at(const es_graph *g, int c, int chan, int64_t i) {
  return (double)((const float *)g->values[c].data)[chan ? i : 0];
}

/* Channel i of nd's own map (s, t), for affine_step. */
static void affine_of(const es_graph *g, const es_node *nd, int c, int ci, int chan, double eps,
                      int64_t i, double *s, double *t) {
  if (nd->op == ES_OP_BatchNormalization) {
    const float *sc = g->values[nd->in[1]].data, *bi = g->values[nd->in[2]].data;
    const float *me = g->values[nd->in[3]].data, *va = g->values[nd->in[4]].data;
    *s = (double)sc[i] / sqrt((double)va[i] + eps);
    *t = (double)bi[i] - (double)me[i] * *s;
    return;
  }
  double v = chan_at(g, c, chan, i);
  *s = 1;
  *t = 0;
  switch (nd->op) {
  case ES_OP_Mul:
    *s = v;
    break;
  case ES_OP_Add:
    *t = v;
    break;
  case ES_OP_Sub: /* x - c, or c - x */
    *s = ci == 1 ? 1 : -1;
    *t = ci == 1 ? -v : v;
    break;
  default: /* Div: x / c */
    *s = 1 / v;
    break;
  }
}

/* If nd maps x (its only runtime input) by a per-channel affine map of a
 * rank-`rank` tensor with a->m channels on axis 1, composes it after a
 * (a := nd o a) and returns x; -1 (a unchanged) otherwise. x_shape_known:
 * x is proven to have that rank and channel count; without it only
 * constants that broadcast nothing are accepted, so the map cannot change
 * x's shape. */
static int affine_step(const fuser *f, const es_node *nd, int rank, int x_shape_known,
                       affine *a) {
  const es_graph *g = f->g;
  if (nd->n_out != 1 || nd->out[0] < 0)
    return -1;
  int64_t m = a->m;
  int x, c = -1, ci = 0, chan = 0;
  float eps = 0;
  if (nd->op == ES_OP_BatchNormalization) {
    int64_t tm, spatial;
    if (nd->n_in != 5 || nd->in[0] < 0 || !es__fz_attr_int(nd, "training_mode", 0, &tm) ||
        tm != 0 || !es__fz_attr_int(nd, "spatial", 1, &spatial) || spatial != 1 ||
        !es__fz_attr_float(nd, "epsilon", 1e-5f, &eps) || !(eps >= 0))
      return -1;
    for (int k = 1; k < 5; k++)
      if (!es__fz_const_f32(g, nd->in[k]) || g->values[nd->in[k]].rank != 1 ||
          g->values[nd->in[k]].dims[0] != m)
        return -1;
    x = nd->in[0];
  } else {
    if (nd->op != ES_OP_Mul && nd->op != ES_OP_Add && nd->op != ES_OP_Sub &&
        nd->op != ES_OP_Div)
      return -1;
    if (nd->n_in != 2 || nd->in[0] < 0 || nd->in[1] < 0)
      return -1;
    int xi = es__fz_is_const(g, nd->in[0]) ? 1 : 0;
    ci = 1 - xi;
    x = nd->in[xi];
    c = nd->in[ci];
    if (es__fz_is_const(g, x) || !chan_const(g, c, rank, m, &chan))
      return -1;
    if (!x_shape_known && (chan || g->values[c].rank >= rank))
      return -1;
    if (nd->op == ES_OP_Div && ci != 1)
      return -1;
  }
  /* All channels checked before any changes, so a refusal leaves a as is. */
  for (int pass = 0; pass < 2; pass++)
    for (int64_t i = 0; i < m; i++) {
      double s, t;
      affine_of(g, nd, c, ci, chan, (double)eps, i, &s, &t);
      double ns = a->s[i] * s, nt = a->t[i] * s + t;
      if (pass == 0 && (!isfinite(ns) || !isfinite(nt)))
        return -1;
      if (pass == 1) {
        a->s[i] = ns;
        a->t[i] = nt;
      }
    }
  return x;
}

/* The same for the map before a convolution: a maps v to the conv's input
 * and v = nd(x); a := a o nd. tmp is scratch of a's size. */
static int pre_step(const fuser *f, const es_node *nd, int rank, int x_shape_known, affine *a,
                    affine *tmp) {
  for (int64_t i = 0; i < a->m; i++) {
    tmp->s[i] = 1;
    tmp->t[i] = 0;
  }
  int x = affine_step(f, nd, rank, x_shape_known, tmp);
  if (x < 0)
    return -1;
  /* conv input = a(v), v = tmp(x)  =>  a(tmp(x)) = a.s * tmp.s x + a.s * tmp.t + a.t */
  for (int64_t i = 0; i < a->m; i++) {
    a->t[i] += a->s[i] * tmp->t[i];
    a->s[i] *= tmp->s[i];
  }
  return x;
}

typedef struct conv_info {
  es_node *node;
  int transpose;
  int x, w, b;      /* inputs (b -1 when absent) */
  int64_t m, c, g;  /* output channels, input channels, groups */
  int64_t ksz;      /* kernel elements per (output, input) channel pair */
  int rank;
  int w8;           /* int8 weights dequantized by the kernel ("_w8", their scales
                       input 4): post-ops fuse, affine maps do not (they would
                       rewrite W in float) */
} conv_info;

static int conv_info_get(const es_graph *g, es_node *nd, conv_info *ci) {
  int w8 = es__node_attr(nd, "_w8") != NULL;
  if ((nd->op != ES_OP_Conv && nd->op != ES_OP_ConvTranspose) || nd->n_out != 1 ||
      nd->out[0] < 0 || nd->n_in < 2 || nd->n_in > (w8 ? 5 : 3) || nd->in[0] < 0 ||
      (w8 && nd->n_in > 3 && nd->in[3] >= 0))
    return 0;
  memset(ci, 0, sizeof *ci);
  ci->node = nd;
  ci->transpose = nd->op == ES_OP_ConvTranspose;
  ci->x = nd->in[0];
  ci->w = nd->in[1];
  ci->b = nd->n_in > 2 ? nd->in[2] : -1;
  ci->w8 = w8;
  if (!es__fz_attr_int(nd, "group", 1, &ci->g) || ci->g < 1 ||
      (!ci->w8 && !es__fz_const_f32(g, ci->w)) ||
      (ci->w8 && (!es__fz_is_const(g, ci->w) || g->values[ci->w].dtype != ES_DTYPE_INT8)))
    return 0;
  const es_value *w = &g->values[ci->w];
  if (w->rank < 3 || w->rank > 5)
    return 0;
  ci->rank = w->rank;
  ci->ksz = 1;
  for (int i = 0; i < w->rank; i++)
    if (w->dims[i] < 1)
      return 0;
  for (int i = 2; i < w->rank; i++)
    ci->ksz *= w->dims[i];
  if (ci->transpose) {
    if (w->dims[0] % ci->g)
      return 0;
    ci->c = w->dims[0];
    ci->m = w->dims[1] * ci->g;
  } else {
    if (w->dims[0] % ci->g)
      return 0;
    ci->m = w->dims[0];
    ci->c = w->dims[1] * ci->g;
  }
  if (ci->b >= 0 && (!es__fz_const_f32(g, ci->b) || g->values[ci->b].rank != 1 ||
                     g->values[ci->b].dims[0] != ci->m))
    return 0;
  return 1;
}

/* New W and B constants for ci: post (per output channel: W[oc] * s, B * s
 * + t) and/or pre (per input channel: W[.., ic, ..] * s, B + sum W t). */
static int conv_rewrite_weights(es_graph *g, conv_info *ci, const affine *post,
                                const affine *pre) {
  const es_value *w = &g->values[ci->w];
  const float *src = w->data;
  const float *bsrc = ci->b >= 0 ? g->values[ci->b].data : NULL;
  float *wd = es_mem_alloc(ES_MEM_MODEL, w->nbytes);
  double *bacc = es_mem_calloc(ES_MEM_MODEL, (size_t)ci->m, sizeof *bacc);
  float *bd = es_mem_alloc(ES_MEM_MODEL, (size_t)ci->m * sizeof *bd);
  char label[120];
  if (!wd || !bd || !bacc) {
    es_mem_free(wd);
    es_mem_free(bd);
    es_mem_free(bacc);
    return es__fail(ES_ENOMEM, "%s: out of memory fusing into its weights",
                    es__node_label(ci->node, label, sizeof label));
  }
  int64_t cg = ci->c / ci->g, mg = ci->m / ci->g;
  for (int64_t oc = 0; oc < ci->m; oc++)
    bacc[oc] = bsrc ? (double)bsrc[oc] : 0.0;
  /* One (output, input) channel pair's kernel at a time: W is [M, C/g, k]
   * (Conv) or [C, M/g, k] (ConvTranspose), outer index a, inner b. */
  int64_t na = ci->transpose ? ci->c : ci->m, nb = ci->transpose ? mg : cg;
  for (int64_t a = 0; a < na; a++) {
    int64_t grp = a / (ci->transpose ? cg : mg);
    for (int64_t b = 0; b < nb; b++) {
      int64_t oc = ci->transpose ? grp * mg + b : a, ic = ci->transpose ? a : grp * cg + b;
      double s = (pre ? pre->s[ic] : 1.0) * (post ? post->s[oc] : 1.0), sum = 0;
      const float *sp = src + (a * nb + b) * ci->ksz;
      float *dp = wd + (a * nb + b) * ci->ksz;
      for (int64_t i = 0; i < ci->ksz; i++)
        dp[i] = (float)(sp[i] * s);
      if (pre) {
        for (int64_t i = 0; i < ci->ksz; i++)
          sum += sp[i];
        bacc[oc] += sum * pre->t[ic];
      }
    }
  }
  for (int64_t oc = 0; oc < ci->m; oc++)
    bd[oc] = (float)(post ? bacc[oc] * post->s[oc] + post->t[oc] : bacc[oc]);
  es_mem_free(bacc);

  /* Names no ONNX identifier can take, as fold.c's. */
  char nm[64];
  int wv, bv, rc;
  int *in3 = ci->node->n_in < 3 ? es__ctx_alloc(&g->ctx, 3 * sizeof *in3) : ci->node->in;
  if (!in3) {
    es_mem_free(wd);
    es_mem_free(bd);
    return es__fail(ES_ENOMEM, "%s: out of memory fusing into its weights",
                    es__node_label(ci->node, label, sizeof label));
  }
  snprintf(nm, sizeof nm, "\x01" "fuse:%d:W:%d", ci->node->file_index, g->n_values);
  if ((rc = es__graph_const_append(g, nm, ES_DTYPE_FLOAT, w->rank, w->dims, wd, w->nbytes,
                                   &wv)) < 0) {
    es_mem_free(bd);
    return rc;
  }
  snprintf(nm, sizeof nm, "\x01" "fuse:%d:B:%d", ci->node->file_index, g->n_values);
  if ((rc = es__graph_const_append(g, nm, ES_DTYPE_FLOAT, 1, &ci->m, bd,
                                   (size_t)ci->m * sizeof *bd, &bv)) < 0)
    return rc;
  in3[0] = ci->node->in[0];
  in3[1] = wv;
  in3[2] = bv;
  ci->node->in = in3;
  ci->node->n_in = 3;
  ci->w = wv;
  ci->b = bv;
  return 0;
}

static int affine_alloc(affine *a, int64_t m) {
  a->m = m;
  a->s = es_mem_alloc(ES_MEM_MODEL, (size_t)m * 2 * sizeof *a->s);
  if (!a->s)
    return es__fail(ES_ENOMEM, "out of memory for %lld channels", (long long)m);
  a->t = a->s + m;
  for (int64_t i = 0; i < m; i++) {
    a->s[i] = 1;
    a->t[i] = 0;
  }
  return 0;
}

/* A Conv without padding: its input's affine map goes into the weights. */
static int conv_pads_zero(const es_node *nd, int nsp) {
  int64_t pads[2 * ES_MAX_RANK];
  const char *ap = es__fz_attr_str(nd, "auto_pad", "NOTSET");
  if (!ap)
    return 0;
  if (!strcmp(ap, "VALID"))
    return 1;
  if (strcmp(ap, "NOTSET") || !es__fz_attr_ints(nd, "pads", 2 * nsp, 0, pads))
    return 0;
  for (int i = 0; i < 2 * nsp; i++)
    if (pads[i])
      return 0;
  return 1;
}

/* Folds the chain of affine nodes before conv n into it. Returns how many
 * nodes went (all before n). */
static int fuse_pre_affine(fuser *f, int n) {
  es_graph *g = f->g;
  conv_info ci;
  if (g->nodes[n].op != ES_OP_Conv || !conv_info_get(g, &g->nodes[n], &ci) || ci.w8 ||
      !conv_pads_zero(ci.node, ci.rank - 2))
    return 0;
  affine a = {0}, tmp = {0};
  int rc = affine_alloc(&a, ci.c);
  if (rc == 0)
    rc = affine_alloc(&tmp, ci.c);
  int v = ci.x, folded = 0;
  while (rc == 0 && es__fz_inner(g, v, 1)) {
    int p = g->values[v].producer;
    sshape us;
    const es_node *pn = &g->nodes[p];
    int u0 = pn->n_in > 0 ? pn->in[0] : -1, u1 = pn->n_in > 1 ? pn->in[1] : -1;
    int u = u0 >= 0 && !es__fz_is_const(g, u0) ? u0 : u1;
    es__fz_shape_of(f, u, &us);
    int known = us.rank == ci.rank && us.d[1] == ci.c;
    int x = pre_step(f, pn, ci.rank, known, &a, &tmp);
    if (x < 0)
      break;
    f->gone[p] = 1;
    folded++;
    rc = es__fz_touch(f, p);
    v = x;
  }
  if (rc == 0 && folded && (rc = es__fz_touch(f, n)) == 0) {
    rc = conv_rewrite_weights(g, &ci, NULL, &a);
    if (rc == 0) {
      g->nodes[n].in[0] = v;
      rc = es__fz_commit(f);
    }
  }
  es_mem_free(a.s);
  es_mem_free(tmp.s);
  return rc < 0 ? rc : folded;
}

/* ==========================================================================
 * Pass 2b: activations and residual Adds after a Conv
 * ======================================================================== */

typedef struct post_chain {
  int codes;
  int64_t code[ES_POST_MAX];
  float par[2 * ES_POST_MAX];
  int residual;           /* value appended as input 3, or -1 */
  int nodes[4 * ES_POST_MAX]; /* swallowed nodes */
  int n_nodes;
  int tip;                /* the value the chain ends with */
} post_chain;

static void chain_add(post_chain *pc, int code, float a, float b) {
  pc->code[pc->codes] = code;
  pc->par[2 * pc->codes] = a;
  pc->par[2 * pc->codes + 1] = b;
  pc->codes++;
}

static int scalar_is(const fuser *f, int c, int x, float want) {
  float v;
  return es__fz_const_scalar(f->g, c, &v) && v == want && es__fz_const_fits(f, c, x);
}

/* HardSwish as PP-OCR writes it, from y (two uses): a = Add(y, 3),
 * b = Clip(a, 0, 6), then Mul(y, b) and Div(., 6) in either order.
 * Returns the final value and lists the four nodes in out. */
static int match_hardswish(fuser *f, int y, int *out) {
  const es_graph *g = f->g;
  int cs[2];
  if (es__fz_consumers(f, y, cs, 2) != 2)
    return -1;
  for (int first = 0; first < 2; first++) {
    const es_node *add = &g->nodes[cs[first]];
    int mul_n = cs[1 - first];
    if (add->op != ES_OP_Add || !scalar_is(f, es__fz_other_input(add, y), y, 3.0f) ||
        !es__fz_inner(g, add->out[0], 1))
      continue;
    int clip_n = es__fz_consumer(f, add->out[0]);
    const es_node *clip = &g->nodes[clip_n];
    float lo, hi;
    if (clip->op != ES_OP_Clip || clip->in[0] != add->out[0] ||
        !es__fz_clip_bounds(g, clip, FLT_MAX, &lo, &hi) || lo != 0.0f || hi != 6.0f ||
        clip->n_out != 1 || !es__fz_inner(g, clip->out[0], 1))
      continue;
    int b = clip->out[0];
    const es_node *mul = &g->nodes[mul_n];
    int div_n;
    if (mul->op == ES_OP_Mul && es__fz_other_input(mul, y) == b) {
      /* c = Mul(y, b); d = Div(c, 6) */
      if (!es__fz_inner(g, mul->out[0], 1))
        continue;
      div_n = es__fz_consumer(f, mul->out[0]);
      const es_node *div = &g->nodes[div_n];
      if (div->op != ES_OP_Div || div->n_in != 2 || div->in[0] != mul->out[0] ||
          !scalar_is(f, div->in[1], y, 6.0f))
        continue;
      out[0] = cs[first], out[1] = clip_n, out[2] = mul_n, out[3] = div_n;
      return div->out[0];
    }
    /* c = Div(b, 6); d = Mul(y, c): the Mul is y's other consumer */
    div_n = es__fz_consumer(f, b);
    const es_node *div = &g->nodes[div_n];
    if (div->op != ES_OP_Div || div->n_in != 2 || div->in[0] != b ||
        !scalar_is(f, div->in[1], y, 6.0f) || !es__fz_inner(g, div->out[0], 1))
      continue;
    if (mul->op != ES_OP_Mul || es__fz_other_input(mul, y) != div->out[0])
      continue;
    out[0] = cs[first], out[1] = clip_n, out[2] = div_n, out[3] = mul_n;
    return mul->out[0];
  }
  return -1;
}

/* Swish: s = Sigmoid(y); Mul(y, s). */
static int match_swish(fuser *f, int y, int *out) {
  const es_graph *g = f->g;
  int cs[2];
  if (es__fz_consumers(f, y, cs, 2) != 2)
    return -1;
  for (int first = 0; first < 2; first++) {
    const es_node *sig = &g->nodes[cs[first]], *mul = &g->nodes[cs[1 - first]];
    if (sig->op != ES_OP_Sigmoid || sig->n_out != 1 || !es__fz_inner(g, sig->out[0], 1))
      continue;
    if (mul->op != ES_OP_Mul || es__fz_other_input(mul, y) != sig->out[0])
      continue;
    out[0] = cs[first];
    out[1] = cs[1 - first];
    return mul->out[0];
  }
  return -1;
}

/* Extends pc by one post-op after pc->tip; 0 when nothing matches. */
static int post_step(fuser *f, const sshape *yshape, post_chain *pc) {
  const es_graph *g = f->g;
  int y = pc->tip, found[4];
  if (pc->codes >= ES_POST_MAX || pc->n_nodes + 4 > 4 * ES_POST_MAX)
    return 0;
  if (es__fz_inner(g, y, 2)) {
    int z = match_swish(f, y, found);
    if (z >= 0) {
      chain_add(pc, ES_POST_SWISH, 0, 0);
      pc->nodes[pc->n_nodes++] = found[0];
      pc->nodes[pc->n_nodes++] = found[1];
      pc->tip = z;
      return 1;
    }
    z = match_hardswish(f, y, found);
    if (z >= 0) {
      chain_add(pc, ES_POST_HARDSWISH, 0, 0);
      for (int i = 0; i < 4; i++)
        pc->nodes[pc->n_nodes++] = found[i];
      pc->tip = z;
      return 1;
    }
    return 0;
  }
  if (!es__fz_inner(g, y, 1))
    return 0;
  int n = es__fz_consumer(f, y);
  const es_node *nd = &g->nodes[n];
  if (nd->n_out != 1 || nd->out[0] < 0 || nd->in[0] < 0)
    return 0;
  float a = 0, b = 0;
  switch (nd->op) {
  case ES_OP_Relu:
    if (nd->n_in != 1)
      return 0;
    chain_add(pc, ES_POST_RELU, 0, 0);
    break;
  case ES_OP_Sigmoid:
    if (nd->n_in != 1)
      return 0;
    chain_add(pc, ES_POST_SIGMOID, 0, 0);
    break;
  case ES_OP_HardSigmoid:
    if (nd->n_in != 1 || !es__fz_attr_float(nd, "alpha", 0.2f, &a) ||
        !es__fz_attr_float(nd, "beta", 0.5f, &b))
      return 0;
    chain_add(pc, ES_POST_HARDSIGMOID, a, b);
    break;
  case ES_OP_Clip:
    if (nd->in[0] != y || !es__fz_clip_bounds(g, nd, FLT_MAX, &a, &b))
      return 0;
    chain_add(pc, ES_POST_CLIP, a, b);
    break;
  case ES_OP_Add: {
    int r = es__fz_other_input(nd, y);
    sshape rs;
    es__fz_shape_of(f, r, &rs);
    if (pc->residual >= 0 || r < 0 || r == y || es__fz_is_const(g, r) ||
        !es__fz_shape_same(&rs, yshape))
      return 0;
    pc->residual = r;
    chain_add(pc, ES_POST_ADD, 0, 0);
    break;
  }
  default:
    return 0;
  }
  pc->nodes[pc->n_nodes++] = n;
  pc->tip = nd->out[0];
  return 1;
}

/* Writes the chain into node n (a Conv, ConvTranspose or MatMul) and moves
 * it to the slot of the chain's last node. conv_touched: es__fz_touch(f, n)
 * was called already (before its weights or inputs changed). */
static int conv_take_chain(fuser *f, int n, const post_chain *pc, int conv_touched) {
  es_graph *g = f->g;
  int rc = conv_touched ? 0 : es__fz_touch(f, n);
  for (int i = 0; rc == 0 && i < pc->n_nodes; i++)
    rc = es__fz_touch(f, pc->nodes[i]);
  if (rc < 0)
    return rc;
  es_node nd = g->nodes[n];
  char label[120];
  int last = n;
  for (int i = 0; i < pc->n_nodes; i++)
    if (pc->nodes[i] > last)
      last = pc->nodes[i];
  if (pc->codes) {
    es_attr *attrs = es__fz_attrs_extend(g, &nd, 2);
    int64_t *codes = es__ctx_alloc(&g->ctx, (size_t)pc->codes * sizeof *codes);
    float *par = es__ctx_alloc(&g->ctx, (size_t)pc->codes * 2 * sizeof *par);
    char *n1 = es__ctx_strdup(&g->ctx, "_post"), *n2 = es__ctx_strdup(&g->ctx, "_post_f");
    int nin = nd.n_in > 4 ? nd.n_in : 4; /* a weight-only Conv's scales stay input 4 */
    int *in4 = pc->residual >= 0 ? es__ctx_alloc(&g->ctx, (size_t)nin * sizeof *in4) : nd.in;
    if (!attrs || !codes || !par || !n1 || !n2 || !in4)
      return es__fail(ES_ENOMEM, "%s: out of memory fusing its activations",
                      es__node_label(&nd, label, sizeof label));
    memcpy(codes, pc->code, (size_t)pc->codes * sizeof *codes);
    memcpy(par, pc->par, (size_t)pc->codes * 2 * sizeof *par);
    attrs[nd.n_attr] = (es_attr){.name = n1, .type = ES_ATTR_INTS, .n = (size_t)pc->codes,
                                 .ints = codes};
    attrs[nd.n_attr + 1] = (es_attr){.name = n2, .type = ES_ATTR_FLOATS,
                                     .n = (size_t)pc->codes * 2, .floats = par};
    nd.attrs = attrs;
    nd.n_attr += 2;
    if (pc->residual >= 0) {
      in4[0] = nd.in[0];
      in4[1] = nd.in[1];
      in4[2] = nd.n_in > 2 ? nd.in[2] : -1;
      in4[3] = pc->residual;
      for (int i = 4; i < nin; i++)
        in4[i] = nd.in[i];
      nd.in = in4;
      nd.n_in = nin;
    }
  }
  nd.out[0] = pc->tip;
  for (int i = 0; i < pc->n_nodes; i++)
    f->gone[pc->nodes[i]] = 1;
  f->gone[n] = 1;
  f->gone[last] = 0;
  g->nodes[last] = nd;
  return es__fz_commit(f);
}

/* Everything after convolution n: per-channel affine nodes into its
 * weights, then (Conv only) post-ops. 1 when something was fused. */
static int fuse_conv_after(fuser *f, int n) {
  es_graph *g = f->g;
  conv_info ci;
  if (!conv_info_get(g, &g->nodes[n], &ci) || es__node_attr(ci.node, "_post"))
    return 0;
  post_chain pc = {.residual = -1, .tip = ci.node->out[0]};
  affine a = {0};
  int rc = affine_alloc(&a, ci.m), folded = 0;
  while (rc == 0 && !ci.w8 && es__fz_inner(g, pc.tip, 1) && pc.n_nodes < 4 * ES_POST_MAX) {
    int c = es__fz_consumer(f, pc.tip);
    if (affine_step(f, &g->nodes[c], ci.rank, 1, &a) != pc.tip)
      break;
    pc.nodes[pc.n_nodes++] = c;
    pc.tip = g->nodes[c].out[0];
    folded++;
  }
  if (rc == 0 && folded && (rc = es__fz_touch(f, n)) == 0)
    rc = conv_rewrite_weights(g, &ci, &a, NULL);
  es_mem_free(a.s);
  if (rc < 0)
    return rc;
  if (!ci.transpose) {
    sshape ys;
    es__fz_shape_of(f, ci.node->out[0], &ys);
    while (post_step(f, &ys, &pc))
      ;
  }
  if (pc.n_nodes == 0)
    return 0;
  rc = conv_take_chain(f, n, &pc, folded > 0);
  return rc < 0 ? rc : 1;
}

/* One sweep over the slots: a node that went is skipped, a conv that took
 * the slot of its chain's last node is met again there (as it would be,
 * later in a compacted array). */
int es__fuse_convs(fuser *f) {
  es_graph *g = f->g;
  int changed = 0;
  for (int n = 0; n < g->n_nodes; n++) {
    if (f->gone[n] || (g->nodes[n].op != ES_OP_Conv && g->nodes[n].op != ES_OP_ConvTranspose))
      continue;
    int rc = fuse_pre_affine(f, n);
    if (rc < 0)
      return rc;
    changed |= rc > 0;
    rc = fuse_conv_after(f, n);
    if (rc < 0)
      return rc;
    changed |= rc > 0;
  }
  return changed ? es__fz_nodes_compact(f) : 0;
}

/* A Relu that is the only reader of an inference BatchNormalization's Y
 * becomes the BatchNormalization's attribute "_relu" (norm.c clamps in the
 * same pass), and the pair takes the Relu's output and slot. DenseNet's
 * pre-activation blocks (Concat, BatchNormalization, Relu, Conv) then read
 * and write each activation once instead of twice: densenet121 has 62 such
 * pairs, 2.7 ms of its 34 ms run before. */
int es__fuse_bn_relu(fuser *f) {
  es_graph *g = f->g;
  int changed = 0;
  for (int n = 0; n < g->n_nodes; n++) {
    const es_node *bn = &g->nodes[n];
    if (f->gone[n] || bn->op != ES_OP_BatchNormalization || bn->n_out < 1 ||
        es__node_attr(bn, "_relu"))
      continue;
    /* Only the inference form, which norm.c runs: a training one (its
     * statistics outputs, training_mode 1, spatial 0) stays as the file has
     * it, so its refusal names the nodes as they are. */
    int more = 0;
    for (int o = 1; o < bn->n_out; o++)
      more |= bn->out[o] >= 0;
    const es_attr *tm = es__node_attr(bn, "training_mode"), *sp = es__node_attr(bn, "spatial");
    if (more || (tm && tm->i != 0) || (sp && sp->i != 1) || !es__fz_inner(g, bn->out[0], 1))
      continue;
    int r = es__fz_consumer(f, bn->out[0]);
    if (r < 0)
      continue;
    const es_node *rl = &g->nodes[r];
    if (rl->op != ES_OP_Relu || rl->n_in != 1 || rl->n_out != 1 || rl->out[0] < 0)
      continue;
    int rc = es__fz_touch(f, n);
    if (rc == 0)
      rc = es__fz_touch(f, r);
    if (rc < 0)
      return rc;
    es_node nd = *bn;
    es_attr *attrs = es__fz_attrs_extend(g, &nd, 1);
    char *name = es__ctx_strdup(&g->ctx, "_relu");
    int *out = es__ctx_alloc(&g->ctx, (size_t)nd.n_out * sizeof *out);
    if (!attrs || !name || !out) {
      char label[120];
      return es__fail(ES_ENOMEM, "%s: out of memory fusing its Relu",
                      es__node_label(bn, label, sizeof label));
    }
    attrs[nd.n_attr] = (es_attr){.name = name, .type = ES_ATTR_INT, .i = 1};
    nd.attrs = attrs;
    nd.n_attr++;
    memcpy(out, nd.out, (size_t)nd.n_out * sizeof *out);
    out[0] = rl->out[0];
    nd.out = out;
    f->gone[n] = 1;
    g->nodes[r] = nd; /* r comes after n: the Relu reads n's output */
    if ((rc = es__fz_commit(f)) < 0)
      return rc;
    changed = 1;
  }
  return changed ? es__fz_nodes_compact(f) : 0;
}

/* ==========================================================================
 * Pass 2c: bias and activations after a MatMul by static weights
 * ======================================================================== */

/* v is a float32 scalar constant within a few ulp of want that broadcasts
 * to nothing larger than x. */
static int scalar_near(const fuser *f, int c, int x, float want) {
  float v;
  return c >= 0 && es__fz_const_scalar(f->g, c, &v) && fabsf(v - want) <= 1e-6f * fabsf(want) &&
         es__fz_const_fits(f, c, x);
}

/* The node reading v (v's only reader) when it is op with one output. */
static int sole_reader(fuser *f, int v, es_op op) {
  if (!es__fz_inner(f->g, v, 1))
    return -1;
  int n = es__fz_consumer(f, v);
  const es_node *nd = n >= 0 ? &f->g->nodes[n] : NULL;
  return nd && nd->op == op && nd->n_out == 1 && nd->out[0] >= 0 ? n : -1;
}

/* GELU in its erf form as exporters write it, from y (two uses):
 * e = Erf(y / sqrt 2) (a Div by sqrt 2 or a Mul by 1 / sqrt 2), a = e + 1,
 * then y * a * 0.5 in any of the three orders PyTorch's and others' exports
 * use: (y a) 0.5, (y 0.5) a, y (a 0.5). Lists the five nodes in out and
 * returns the final value; -1 when y does not start one. */
static int match_gelu(fuser *f, int y, int *out) {
  const es_graph *g = f->g;
  int cs[2];
  if (es__fz_consumers(f, y, cs, 2) != 2)
    return -1;
  for (int first = 0; first < 2; first++) {
    const es_node *d = &g->nodes[cs[first]], *m = &g->nodes[cs[1 - first]];
    if (d->n_in != 2 || d->n_out != 1 || d->in[0] != y ||
        !((d->op == ES_OP_Div && scalar_near(f, d->in[1], y, 1.41421356f)) ||
          (d->op == ES_OP_Mul && scalar_near(f, d->in[1], y, 0.70710678f))))
      continue;
    int erf = sole_reader(f, d->out[0], ES_OP_Erf);
    int add = erf >= 0 ? sole_reader(f, g->nodes[erf].out[0], ES_OP_Add) : -1;
    if (add < 0 || !scalar_near(f, es__fz_other_input(&g->nodes[add], g->nodes[erf].out[0]), y,
                                1.0f))
      continue;
    int a = g->nodes[add].out[0];
    if (m->op != ES_OP_Mul || m->n_in != 2 || m->n_out != 1 || m->out[0] < 0)
      continue;
    int other = es__fz_other_input(m, y), last;
    if (other == a) { /* (y a) 0.5 */
      last = sole_reader(f, m->out[0], ES_OP_Mul);
      if (last < 0 || !scalar_near(f, es__fz_other_input(&g->nodes[last], m->out[0]), y, 0.5f))
        continue;
    } else if (scalar_near(f, other, y, 0.5f)) { /* (y 0.5) a */
      last = sole_reader(f, m->out[0], ES_OP_Mul);
      if (last < 0 || sole_reader(f, a, ES_OP_Mul) != last ||
          es__fz_other_input(&g->nodes[last], m->out[0]) != a)
        continue;
    } else { /* y (a 0.5): m reads h = a 0.5 */
      int h = sole_reader(f, a, ES_OP_Mul);
      if (h < 0 || g->nodes[h].out[0] != other || !es__fz_inner(g, other, 1) ||
          !scalar_near(f, es__fz_other_input(&g->nodes[h], a), y, 0.5f))
        continue;
      last = cs[1 - first];
      out[0] = cs[first], out[1] = erf, out[2] = add, out[3] = h, out[4] = last;
      return m->out[0];
    }
    out[0] = cs[first], out[1] = erf, out[2] = add, out[3] = cs[1 - first], out[4] = last;
    return g->nodes[last].out[0];
  }
  return -1;
}

/* Extends pc by a GELU after pc->tip: a Gelu node (opset 20) or the erf
 * form spelt out. 0 when there is none. */
static int gelu_step(fuser *f, post_chain *pc) {
  const es_graph *g = f->g;
  if (pc->codes >= ES_POST_MAX || pc->n_nodes + 5 > 4 * ES_POST_MAX)
    return 0;
  int found[5];
  if (es__fz_inner(g, pc->tip, 2)) {
    int z = match_gelu(f, pc->tip, found);
    if (z < 0)
      return 0;
    chain_add(pc, ES_POST_GELU, 0, 0);
    for (int i = 0; i < 5; i++)
      pc->nodes[pc->n_nodes++] = found[i];
    pc->tip = z;
    return 1;
  }
  int n = sole_reader(f, pc->tip, ES_OP_Gelu);
  if (n < 0 || g->nodes[n].n_in != 1)
    return 0;
  const char *ap = es__fz_attr_str(&g->nodes[n], "approximate", "none");
  if (!ap || (strcmp(ap, "none") && strcmp(ap, "tanh")))
    return 0; /* the kernel says what is wrong */
  chain_add(pc, strcmp(ap, "none") ? ES_POST_GELU_TANH : ES_POST_GELU, 0, 0);
  pc->nodes[pc->n_nodes++] = n;
  pc->tip = g->nodes[n].out[0];
  return 1;
}

/* MatMul n by static 2-D float32 weights [K, N]: the Add of a constant
 * bias over N that follows it becomes input 2 (attribute "_bias"), then a
 * GELU and post_step's activations and residual Add become "_post" codes.
 * 1 when something was fused. */
static int fuse_matmul_after(fuser *f, int n) {
  es_graph *g = f->g;
  const es_node *mm = &g->nodes[n];
  if (mm->n_in != 2 || mm->n_out != 1 || mm->out[0] < 0 || mm->in[0] < 0 ||
      !es__fz_const_f32(g, mm->in[1]) || g->values[mm->in[1]].rank != 2 ||
      es__node_attr(mm, "_post") || es__node_attr(mm, "_bias"))
    return 0;
  int64_t nn = g->values[mm->in[1]].dims[1];
  sshape ys;
  es__fz_shape_of(f, mm->out[0], &ys);
  if (ys.dt != ES_DTYPE_FLOAT && ys.dt != ES_DTYPE_UNDEFINED)
    return 0;
  post_chain pc = {.residual = -1, .tip = mm->out[0]};
  int bias = -1, add = sole_reader(f, pc.tip, ES_OP_Add);
  if (add >= 0 && g->nodes[add].n_in == 2) {
    int b = es__fz_other_input(&g->nodes[add], pc.tip);
    const es_value *bv = b >= 0 ? &g->values[b] : NULL;
    int only_last = bv && bv->rank >= 1 && bv->dims[bv->rank - 1] == nn;
    for (int i = 0; only_last && i + 1 < bv->rank; i++)
      only_last = bv->dims[i] == 1;
    /* [N] never broadcasts the output ([..., N]) to more; [1, .., N] only
     * onto an output of a lower rank. */
    if (only_last && es__fz_const_f32(g, b) &&
        (bv->rank == 1 || es__fz_const_fits(f, b, pc.tip))) {
      bias = b;
      pc.nodes[pc.n_nodes++] = add;
      pc.tip = g->nodes[add].out[0];
    }
  }
  while (gelu_step(f, &pc) || post_step(f, &ys, &pc))
    ;
  if (pc.n_nodes == 0)
    return 0;
  int rc = es__fz_touch(f, n);
  if (rc < 0)
    return rc;
  if (bias >= 0) {
    es_node nd = *mm;
    es_attr *attrs = es__fz_attrs_extend(g, &nd, 1);
    char *name = es__ctx_strdup(&g->ctx, "_bias");
    int *in3 = es__ctx_alloc(&g->ctx, 3 * sizeof *in3);
    if (!attrs || !name || !in3) {
      char label[120];
      return es__fail(ES_ENOMEM, "%s: out of memory fusing its bias",
                      es__node_label(mm, label, sizeof label));
    }
    attrs[nd.n_attr] = (es_attr){.name = name, .type = ES_ATTR_INT, .i = 1};
    nd.attrs = attrs;
    nd.n_attr++;
    in3[0] = nd.in[0], in3[1] = nd.in[1], in3[2] = bias;
    nd.in = in3;
    nd.n_in = 3;
    g->nodes[n] = nd;
  }
  rc = conv_take_chain(f, n, &pc, 1);
  return rc < 0 ? rc : 1;
}

int es__fuse_matmuls(fuser *f) {
  es_graph *g = f->g;
  int changed = 0;
  for (int n = 0; n < g->n_nodes; n++) {
    if (f->gone[n] || g->nodes[n].op != ES_OP_MatMul)
      continue;
    int rc = fuse_matmul_after(f, n);
    if (rc < 0)
      return rc;
    changed |= rc > 0;
  }
  return changed ? es__fz_nodes_compact(f) : 0;
}
