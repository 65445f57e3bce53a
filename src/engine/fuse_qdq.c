/* Load-time lowering of QDQ convolutions to QLinearConv (ConvTranspose to
 * the internal QLinearConvTranspose), of QDQ linear layers (MatMul or Gemm
 * by int8 weights) to QLinearMatMul, of such layers whose output stays
 * float (a model's last) to the same kernels with a float output, and of
 * the QDQ Add, Mul, Concat, GlobalAveragePool and AveragePool between
 * them to the com.microsoft QLinear kernels:
 * a feature pyramid runs in 8 bits from its input's quantization on. A
 * nearest Resize or a MaxPool moves before its DequantizeLinear (it
 * copies or picks bytes), and a QuantizeLinear that undoes the
 * DequantizeLinear before it goes. A float Conv by dequantized int8
 * weights whose input is float (weight-only int8) reads the int8 weights
 * itself (lower_weight_only).
 *
 * A QDQ model (what `edgeserve quantize` and ONNX Runtime's quantizer
 * write) says "int8" with QuantizeLinear / DequantizeLinear around float
 * operators:
 *
 *   xq -> DQ(sx, zx) -> Conv(W: DQ(wq, sw), B: DQ(bq, sx * sw)) [-> Relu] -> Q(sy, zy) -> yq
 *
 * which is, by the operators' definitions, QLinearConv(xq, sx, zx, wq, sw,
 * zw, sy, zy, bq) with the Relu applied before the rounding: the int32 sum
 * of (xq - zx) * wq plus bq, times sx * sw / sy, rounded, plus zy. The
 * pass rewrites the pattern to that one node (attribute "activation" 1 for
 * the Relu), so the kernel runs it as an int8 convolution (oneDNN, VNNI)
 * reading and writing 8-bit tensors, and the weights stay int8 in memory.
 * It runs before constant folding, which would otherwise turn DQ(wq) into
 * float weights.
 *
 * Only the exact pattern is taken: constants for every scale and zero
 * point (x's, y's per tensor), int8 weights with scales per tensor or per
 * output channel (axis 0), and a bias, when there is one, quantized at
 * exactly sx * sw (float32 product: what quantizers write). The Conv's and
 * the Relu's outputs must be read by the next node of the pattern alone.
 * Anything else is left as it is: the Q/DQ kernels and the float Conv
 * still give the same numbers, only slower. Results differ from the
 * unlowered graph where a float sum in another order rounds to another
 * 8-bit step (ONNX Runtime lowers the same way). Skipped with
 * es_engine_fusion_set(0). */
#include "common/internal.h"
#include "engine/engine_internal.h"

#include <float.h>
#include <math.h>
#include <string.h>

static int is_const(const es_graph *g, int v) {
  return v >= 0 && g->values[v].kind == ES_VALUE_CONST && g->values[v].data;
}

static size_t const_count(const es_graph *g, int v) {
  size_t n = 1;
  for (int i = 0; i < g->values[v].rank; i++)
    n *= (size_t)g->values[v].dims[i];
  return n;
}

/* A float32 constant of one element. */
static int const_scalar_f32(const es_graph *g, int v) {
  return is_const(g, v) && g->values[v].dtype == ES_DTYPE_FLOAT && const_count(g, v) == 1;
}

/* The node producing v if it is op, with one output and no guard; else -1. */
static int producer_is(const es_graph *g, int v, es_op op) {
  if (v < 0 || g->values[v].producer < 0)
    return -1;
  const es_node *n = &g->nodes[g->values[v].producer];
  return n->op == op && n->n_out == 1 && n->n_guard == 0 ? g->values[v].producer : -1;
}

/* Read once, by the node after it in the pattern, and not a graph output. */
static int inner(const es_graph *g, int v) {
  return v >= 0 && g->values[v].uses == 1 && !g->values[v].is_output;
}

static int64_t attr_int(const es_node *n, const char *name, int64_t def) {
  const es_attr *a = es__node_attr(n, name);
  return a && a->type == ES_ATTR_INT ? a->i : def;
}

/* xq's element type: its zero point's, or that of the QuantizeLinear
 * making it (intermediate values have no type before planning), or the
 * one the file declares. */
static es_dtype x_type(const es_graph *g, int xq, int zx) {
  if (zx >= 0)
    return g->values[zx].dtype;
  int p = g->values[xq].producer;
  if (p >= 0 && g->nodes[p].op == ES_OP_QuantizeLinear)
    return g->nodes[p].n_in > 2 && g->nodes[p].in[2] >= 0 ? g->values[g->nodes[p].in[2]].dtype
                                                           : ES_DTYPE_UINT8;
  return g->values[xq].dtype;
}

/* A zero point of n elements of type t, when the DQ omits it. */
static int zero_const(es_graph *g, es_dtype t, int64_t n, int *out) {
  size_t bytes = (size_t)n * es_dtype_size(t);
  void *z = es_mem_calloc(ES_MEM_MODEL, 1, bytes ? bytes : 1);
  if (!z)
    return es__fail(ES_ENOMEM, "out of memory lowering a QDQ node");
  int64_t dims[1] = {n};
  return es__graph_const_append(g, "", t, n == 1 ? 0 : 1, dims, z, bytes, out);
}

/* Node qi (the pattern's QuantizeLinear) becomes op: node base's name,
 * the attributes attrs[0..n_attr), inputs v[0..n), qi's output. The nodes the pattern leaves unread go with the next
 * prune. Returns 1. */
static int lower_to(es_graph *g, int qi, int base, es_op op, const int *v, int n,
                    es_attr *attrs, int n_attr) {
  int *in = es__ctx_alloc(&g->ctx, (size_t)n * sizeof *in);
  if (!in)
    return es__fail(ES_ENOMEM, "out of memory lowering a QDQ %s", es__op_name(g->nodes[base].op));
  memcpy(in, v, (size_t)n * sizeof *in);
  es_node nd = g->nodes[base];
  nd.op = op;
  nd.n_in = n;
  nd.in = in;
  nd.n_out = 1;
  nd.out = g->nodes[qi].out;
  nd.attrs = attrs;
  nd.n_attr = n_attr;
  g->nodes[qi] = nd;
  return 1;
}

/* x's DQ feeding input v of a node: DQ(xq, sx[, zx]) with a per-tensor
 * scale and zero point and an 8-bit xq. Its node, or -1. */
static int x_dq(const es_graph *g, int v, int *xq, int *sx, int *zx, es_dtype *xt) {
  int dx = producer_is(g, v, ES_OP_DequantizeLinear);
  if (dx < 0)
    return -1;
  const es_node *nx = &g->nodes[dx];
  *xq = nx->in[0], *sx = nx->in[1], *zx = nx->n_in > 2 ? nx->in[2] : -1;
  *xt = x_type(g, *xq, *zx);
  if ((*xt != ES_DTYPE_UINT8 && *xt != ES_DTYPE_INT8) || !const_scalar_f32(g, *sx) ||
      (*zx >= 0 && (!is_const(g, *zx) || const_count(g, *zx) != 1)))
    return -1;
  return dx;
}

static int per_tensor_dq(const es_graph *g, int v);

/* A bias DQ(bq int32 [m], sx * sw[, 0]) quantized at exactly x's scale
 * times w's (nsw: 1 or m scales), as quantizers write it: bq, else -1. */
static int dq_bias(const es_graph *g, int v, int64_t m, int sx, int sw, int64_t nsw) {
  int db = producer_is(g, v, ES_OP_DequantizeLinear);
  if (db < 0)
    return -1;
  const es_node *nb = &g->nodes[db];
  int bq = nb->in[0], sb = nb->in[1];
  if (!is_const(g, bq) || g->values[bq].dtype != ES_DTYPE_INT32 || g->values[bq].rank != 1 ||
      g->values[bq].dims[0] != m || !is_const(g, sb) || g->values[sb].dtype != ES_DTYPE_FLOAT)
    return -1;
  if (nb->n_in > 2 && nb->in[2] >= 0) {
    if (!is_const(g, nb->in[2]) || g->values[nb->in[2]].dtype != ES_DTYPE_INT32)
      return -1;
    const int32_t *z = g->values[nb->in[2]].data;
    for (size_t i = 0; i < const_count(g, nb->in[2]); i++)
      if (z[i])
        return -1;
  }
  int64_t nsb = (int64_t)const_count(g, sb);
  if (nsb != 1 && nsb != m)
    return -1;
  const float *bs = g->values[sb].data, *ws = g->values[sw].data;
  float xs = *(const float *)g->values[sx].data;
  for (int64_t o = 0; o < m; o++) {
    float want = xs * ws[nsw == 1 ? 0 : o], have = bs[nsb == 1 ? 0 : o];
    if (memcmp(&want, &have, sizeof want))
      return -1;
  }
  return bq;
}

/* A dequantized int8 weight DQ(wq, sw[, zw]) of rank rank_lo..rank_hi
 * whose scale is per tensor or has m values along axis wax: sets v[3..5]
 * (wq, sw, and zw, or -1 when it is absent or all zeros) and *nsw. 1 when
 * it is one, else 0. */
static int dq_weight(const es_graph *g, int v_in, int rank_lo, int rank_hi, int64_t m,
                     int64_t wax, int per_ok, int *v, int64_t *nsw) {
  int dw = producer_is(g, v_in, ES_OP_DequantizeLinear);
  if (dw < 0)
    return 0;
  const es_node *nw = &g->nodes[dw];
  int wq = nw->in[0], sw = nw->in[1], zw = nw->n_in > 2 ? nw->in[2] : -1;
  const es_value *wv = &g->values[wq];
  if (!is_const(g, wq) || wv->dtype != ES_DTYPE_INT8 || wv->rank < rank_lo ||
      wv->rank > rank_hi || !is_const(g, sw) || g->values[sw].dtype != ES_DTYPE_FLOAT)
    return 0;
  *nsw = (int64_t)const_count(g, sw);
  if (*nsw != 1) {
    int64_t axis = attr_int(nw, "axis", 1);
    if (!per_ok || g->values[sw].rank != 1 || *nsw != m ||
        (axis != wax && axis != wax - wv->rank))
      return 0;
  }
  if (zw >= 0 && (!is_const(g, zw) || g->values[zw].dtype != ES_DTYPE_INT8 ||
                  (int64_t)const_count(g, zw) != *nsw))
    return 0;
  /* Zero points of zero (symmetric weights; per channel in the file, as
   * the rule wants one per scale) are one scalar zero to the kernels: the
   * model does not keep a byte per channel of zeros. */
  int all_zero = 1;
  for (int64_t k = 0; zw >= 0 && k < *nsw && all_zero; k++)
    all_zero = ((const int8_t *)g->values[zw].data)[k] == 0;
  v[3] = wq, v[4] = sw, v[5] = all_zero ? -1 : zw;
  return 1;
}

/* The int8 operands of convolution ci (Conv or ConvTranspose) whose x,
 * W and B are dequantized: v[0..5] = xq, sx, zx, wq, sw, zw (zero points
 * made when the DQs omit them) and *bq (-1: no bias). 1 when the pattern
 * holds, 0 when not, < 0 on error. */
static int conv_parts(es_graph *g, int ci, int v[6], int *bq) {
  const es_node *c = &g->nodes[ci];
  int tr = c->op == ES_OP_ConvTranspose;
  if (c->n_in < 2 || c->n_out != 1 || c->n_guard)
    return 0;
  if (tr) { /* the kernel's geometry: explicit pads (or VALID), no output_shape */
    const es_attr *ap = es__node_attr(c, "auto_pad");
    if (es__node_attr(c, "output_shape") ||
        (ap && (ap->type != ES_ATTR_STRING ||
                (strcmp(ap->s, "NOTSET") && strcmp(ap->s, "VALID")))))
      return 0;
  }
  /* x: DQ(xq, sx[, zx]) */
  es_dtype xt;
  if (x_dq(g, c->in[0], &v[0], &v[1], &v[2], &xt) < 0)
    return 0;
  /* W: DQ(wq int8, sw per tensor or along the output channels[, zw]):
   * W's axis 0 ([M, C/g, k...]), a transposed one's axis 1 ([C, M/g,
   * k...]; per channel only with one group) */
  int dw = producer_is(g, c->in[1], ES_OP_DequantizeLinear);
  if (dw < 0 || !is_const(g, g->nodes[dw].in[0]) || g->values[g->nodes[dw].in[0]].rank < 3)
    return 0;
  const es_value *wv = &g->values[g->nodes[dw].in[0]];
  int64_t group = attr_int(c, "group", 1), nsw;
  int64_t m = tr ? wv->dims[1] * group : wv->dims[0];
  if (!dq_weight(g, c->in[1], 3, 5, m, tr ? 1 : 0, !tr || group == 1, v, &nsw))
    return 0;
  /* B: DQ(bq int32, sx * sw) */
  *bq = -1;
  if (c->n_in > 2 && c->in[2] >= 0 && (*bq = dq_bias(g, c->in[2], m, v[1], v[4], nsw)) < 0)
    return 0;
  int rc;
  if (v[2] < 0 && (rc = zero_const(g, xt, 1, &v[2])) < 0)
    return rc;
  if (v[5] < 0 && (rc = zero_const(g, ES_DTYPE_INT8, 1, &v[5])) < 0)
    return rc;
  return 1;
}

/* The attributes of node base plus "activation" (relu) and, with
 * float_out, "_float_out" 1; *n set. NULL when out of memory. */
static es_attr *attrs_plus(es_graph *g, int base, int relu, int float_out, int transb, int *n) {
  const es_node *c = &g->nodes[base];
  es_attr *attrs = es__ctx_alloc(&g->ctx, (size_t)(c->n_attr + 3) * sizeof *attrs);
  if (!attrs)
    return NULL;
  *n = c->n_attr;
  if (c->n_attr)
    memcpy(attrs, c->attrs, (size_t)c->n_attr * sizeof *attrs);
  const char *names[3] = {"activation", "_float_out", "_transB"};
  int64_t vals[3] = {relu, float_out, transb};
  for (int i = 0; i < 3; i++) {
    if (i > 0 && !vals[i])
      continue;
    char *an = es__ctx_strdup(&g->ctx, names[i]);
    if (!an)
      return NULL;
    attrs[(*n)++] = (es_attr){.name = an, .type = ES_ATTR_INT, .i = vals[i], .tensor = -1};
  }
  return attrs;
}

/* Node qi (a QuantizeLinear) and the Conv it quantizes, as one
 * QLinearConv; 1 when rewritten, 0 when the pattern does not hold. */
static int lower_conv(es_graph *g, int qi) {
  int t = g->nodes[qi].in[0], relu = 0;
  if (!inner(g, t))
    return 0;
  int ci = producer_is(g, t, ES_OP_Relu);
  if (ci >= 0) {
    relu = 1;
    t = g->nodes[ci].in[0];
    if (!inner(g, t))
      return 0;
  }
  ci = producer_is(g, t, ES_OP_Conv);
  if (ci < 0)
    ci = producer_is(g, t, ES_OP_ConvTranspose);
  if (ci < 0)
    return 0;
  int v[9], bq, rc, na;
  if ((rc = conv_parts(g, ci, v, &bq)) <= 0)
    return rc;
  int tr = g->nodes[ci].op == ES_OP_ConvTranspose;
  es_attr *attrs = attrs_plus(g, ci, relu, 0, 0, &na);
  if (!attrs)
    return es__fail(ES_ENOMEM, "out of memory lowering a QDQ convolution");
  v[6] = g->nodes[qi].in[1], v[7] = g->nodes[qi].in[2], v[8] = bq;
  return lower_to(g, qi, ci, tr ? ES_OP_QLinearConvTranspose : ES_OP_QLinearConv, v,
                  bq >= 0 ? 9 : 8, attrs, na);
}

/* The int8 operands of linear layer li: a MatMul by a dequantized int8
 * B [K, N] (scale per tensor or per column, axis 1), or a Gemm (alpha and
 * beta 1, no transA) by B [K, N] or, transB, [N, K] (scale along axis 0)
 * plus C = DQ(bq int32 [N], sa * sb). v[0..5] = aq, sa, za, bq, sb, zb
 * (zero points made when omitted), *bias (-1: none), *transb. 1 when the
 * pattern holds, 0 when not (a product of two activations, attention's,
 * stays as it is), < 0 on error. */
static int linear_parts(es_graph *g, int li, int v[6], int *bias, int *transb) {
  const es_node *mm = &g->nodes[li];
  int gemm = mm->op == ES_OP_Gemm;
  *bias = -1;
  *transb = 0;
  if (mm->n_out != 1 || mm->n_guard || (!gemm && mm->n_in != 2) ||
      (gemm && (mm->n_in < 2 || mm->n_in > 3)))
    return 0;
  if (gemm) {
    const es_attr *al = es__node_attr(mm, "alpha"), *be = es__node_attr(mm, "beta");
    if ((al && (al->type != ES_ATTR_FLOAT || al->f != 1)) ||
        (be && (be->type != ES_ATTR_FLOAT || be->f != 1)) || attr_int(mm, "transA", 0))
      return 0;
    *transb = attr_int(mm, "transB", 0) != 0;
  }
  es_dtype at;
  if (x_dq(g, mm->in[0], &v[0], &v[1], &v[2], &at) < 0)
    return 0;
  int db = producer_is(g, mm->in[1], ES_OP_DequantizeLinear);
  if (db < 0 || !is_const(g, g->nodes[db].in[0]) || g->values[g->nodes[db].in[0]].rank != 2)
    return 0;
  int64_t n = g->values[g->nodes[db].in[0]].dims[*transb ? 0 : 1], nsb;
  if (!dq_weight(g, mm->in[1], 2, 2, n, *transb ? 0 : 1, 1, v, &nsb))
    return 0;
  if (gemm && mm->n_in > 2 && mm->in[2] >= 0 &&
      (*bias = dq_bias(g, mm->in[2], n, v[1], v[4], nsb)) < 0)
    return 0;
  int rc;
  if (v[2] < 0 && (rc = zero_const(g, at, 1, &v[2])) < 0)
    return rc;
  if (v[5] < 0 && (rc = zero_const(g, ES_DTYPE_INT8, 1, &v[5])) < 0)
    return rc;
  return 1;
}

/* Node qi and the linear layer it quantizes (through a Relu, for a Gemm:
 * its bias goes in before the Relu):
 *
 *   aq -> DQ(sa, za) -> MatMul or Gemm(B: DQ(bq int8, sb[, zb]), C: DQ(bias
 *   int32, sa * sb)) [-> Relu] -> Q(sy, zy)
 *
 * as QLinearMatMul(aq, sa, za, bq, sb, zb, sy, zy[, bias]) (the bias, the
 * Relu as "activation" and "_transB" the kernel's own extensions), which
 * runs as oneDNN's int8 matmul. 1 when rewritten, 0 when the pattern does
 * not hold. */
static int lower_matmul(es_graph *g, int qi) {
  int t = g->nodes[qi].in[0], relu = 0;
  if (!inner(g, t))
    return 0;
  int mi = producer_is(g, t, ES_OP_Relu);
  if (mi >= 0) {
    relu = 1;
    t = g->nodes[mi].in[0];
    if (!inner(g, t))
      return 0;
  }
  mi = producer_is(g, t, ES_OP_MatMul);
  if (mi < 0)
    mi = producer_is(g, t, ES_OP_Gemm);
  if (mi < 0)
    return 0;
  int v[9], bias, transb, rc, na;
  if ((rc = linear_parts(g, mi, v, &bias, &transb)) <= 0)
    return rc;
  es_attr *attrs = attrs_plus(g, mi, relu, 0, transb, &na);
  if (!attrs)
    return es__fail(ES_ENOMEM, "out of memory lowering a QDQ linear layer");
  v[6] = g->nodes[qi].in[1], v[7] = g->nodes[qi].in[2], v[8] = bias;
  return lower_to(g, qi, mi, ES_OP_QLinearMatMul, v, bias >= 0 ? 9 : 8, attrs, na);
}

/* A convolution or linear layer of dequantized int8 operands whose output
 * stays float (no QuantizeLinear follows: a model's last layers, which
 * quantizers leave in float for accuracy) as the int8 kernel with a float
 * output: QLinearConv, QLinearConvTranspose or QLinearMatMul without y's
 * scale and zero point, attribute "_float_out" 1. The kernel writes the
 * exact integer sum plus the bias, times sx * sw: what the float operator
 * computes on the dequantized values, in another summation order. The
 * weights stay int8 in memory. 1 when rewritten. */
static int lower_float_out(es_graph *g, int i) {
  es_op op = g->nodes[i].op;
  int v[9], bias, transb = 0, rc, na;
  if (op == ES_OP_Conv || op == ES_OP_ConvTranspose)
    rc = conv_parts(g, i, v, &bias);
  else if (op == ES_OP_MatMul || op == ES_OP_Gemm)
    rc = linear_parts(g, i, v, &bias, &transb);
  else
    return 0;
  if (rc <= 0)
    return rc;
  es_attr *attrs = attrs_plus(g, i, 0, 1, transb, &na);
  if (!attrs)
    return es__fail(ES_ENOMEM, "out of memory lowering a QDQ %s", es__op_name(op));
  v[6] = v[7] = -1;
  v[8] = bias;
  es_op to = op == ES_OP_Conv            ? ES_OP_QLinearConv
             : op == ES_OP_ConvTranspose ? ES_OP_QLinearConvTranspose
                                         : ES_OP_QLinearMatMul;
  return lower_to(g, i, i, to, v, 9, attrs, na);
}

/* A float convolution by dequantized int8 weights, its input float (no
 * DequantizeLinear the lowerings above could take): what a quantizer
 * writes for a layer it keeps in float for accuracy, quantizing only its
 * weights ("weight-only" int8):
 *
 *   x (float) -> Conv(W: DQ(wq int8, sw per tensor or per output channel,
 *                zero point 0), B) -> y (float)
 *
 * becomes the Conv reading wq itself and sw as input 4 (input 3 is a
 * fused residual's; attribute "_w8" 1). The kernel (conv.c) dequantizes
 * W into its scratch on each run and runs the float convolution: the
 * float weights constant folding would make (float(wq) * sw, rounded
 * once), so the same numbers, while the model holds a quarter of the
 * bytes. The price is a pass over the weights per run, and the request's
 * arena holds the float weights while the Conv runs. Only Conv
 * (ConvTranspose's weights are laid out by input channel), only with zero
 * points 0 (what symmetric quantizers write), and only when the DQ feeds
 * this Conv alone. 1 when rewritten. */
static int lower_weight_only(es_graph *g, int i) {
  const es_node *c = &g->nodes[i];
  if (c->op != ES_OP_Conv || c->n_in < 2 || c->n_in > 3 || c->n_out != 1 || c->n_guard ||
      es__node_attr(c, "_w8") || !inner(g, c->in[1]))
    return 0;
  int dw = producer_is(g, c->in[1], ES_OP_DequantizeLinear);
  if (dw < 0 || !is_const(g, g->nodes[dw].in[0]))
    return 0;
  const es_value *wv = &g->values[g->nodes[dw].in[0]];
  if (wv->rank < 3 || wv->rank > 5 || wv->dims[0] < 1)
    return 0;
  int64_t m = wv->dims[0], nsw;
  int v[6];
  if (!dq_weight(g, c->in[1], 3, 5, m, 0, 1, v, &nsw))
    return 0;
  if (v[5] >= 0) /* zero points other than zeros */
    return 0;
  const float *sw = g->values[v[4]].data;
  for (int64_t o = 0; o < nsw; o++)
    if (!isfinite(sw[o]))
      return 0; /* left to DequantizeLinear's own rule */
  int na = c->n_attr;
  es_attr *attrs = es__ctx_alloc(&g->ctx, (size_t)(na + 1) * sizeof *attrs);
  char *an = es__ctx_strdup(&g->ctx, "_w8");
  int *in = es__ctx_alloc(&g->ctx, 5 * sizeof *in);
  if (!attrs || !an || !in)
    return es__fail(ES_ENOMEM, "out of memory lowering a weight-only int8 Conv");
  if (na)
    memcpy(attrs, c->attrs, (size_t)na * sizeof *attrs);
  attrs[na] = (es_attr){.name = an, .type = ES_ATTR_INT, .i = 1, .tensor = -1};
  in[0] = c->in[0];
  in[1] = v[3];
  in[2] = c->n_in > 2 ? c->in[2] : -1;
  in[3] = -1;
  in[4] = v[4];
  es_node *w = &g->nodes[i];
  w->in = in;
  w->n_in = 5;
  w->attrs = attrs;
  w->n_attr = na + 1;
  return 1;
}

/* Node qi and the Add of two dequantized 8-bit tensors it quantizes (a
 * residual or a feature pyramid's sum):
 *
 *   DQ(aq, sa, za) + DQ(bq, sb, zb) -> Q(sy, zy)
 *
 * as QLinearAdd(aq, sa, za, bq, sb, zb, sy, zy) (kernels/quant.c), which
 * reads and writes bytes: the sum in float32 as (a - za) (sa / sy) +
 * (b - zb) (sb / sy), one 8-bit step from the float graph's
 * ((a - za) sa + (b - zb) sb) / sy where the two round apart. A Mul (a
 * squeeze-excitation's scale) likewise becomes QLinearMul, (a - za)(b -
 * zb) (sa sb / sy). All three tensors must have one 8-bit type. 1 when
 * rewritten, else 0. */
static int lower_add(es_graph *g, int qi) {
  const es_node *q = &g->nodes[qi];
  int t = q->in[0];
  if (!inner(g, t))
    return 0;
  int ai = producer_is(g, t, ES_OP_Add), mul = 0;
  if (ai < 0 && (ai = producer_is(g, t, ES_OP_Mul)) >= 0)
    mul = 1;
  if (ai < 0 || g->nodes[ai].n_in != 2)
    return 0;
  const es_node *ad = &g->nodes[ai];
  int x[2], s[2], z[2];
  es_dtype xt[2];
  for (int i = 0; i < 2; i++)
    if (x_dq(g, ad->in[i], &x[i], &s[i], &z[i], &xt[i]) < 0)
      return 0;
  es_dtype yt = g->values[q->in[2]].dtype;
  if (xt[0] != xt[1] || yt != xt[0])
    return 0;
  int rc;
  for (int i = 0; i < 2; i++)
    if (z[i] < 0 && (rc = zero_const(g, xt[0], 1, &z[i])) < 0)
      return rc;
  q = &g->nodes[qi];
  int v[8] = {x[0], s[0], z[0], x[1], s[1], z[1], q->in[1], q->in[2]};
  return lower_to(g, qi, ai, mul ? ES_OP_QLinearMul : ES_OP_QLinearAdd, v, 8, NULL, 0);
}

/* Node qi and the GlobalAveragePool of a dequantized 8-bit tensor it
 * quantizes (a squeeze-excitation's pooling):
 *
 *   DQ(xq, sx, zx) -> GlobalAveragePool -> Q(sy, zy)
 *
 * as QLinearGlobalAveragePool(xq, sx, zx, sy, zy) (channels_last 0): the
 * integer sum times sx / (sy n), one 8-bit step from the float mean's
 * rounding at most. 1 when rewritten, else 0. */
static int lower_gap(es_graph *g, int qi) {
  const es_node *q = &g->nodes[qi];
  int t = q->in[0];
  if (!inner(g, t))
    return 0;
  int gi = producer_is(g, t, ES_OP_GlobalAveragePool);
  if (gi < 0 || g->nodes[gi].n_in != 1)
    return 0;
  int x, sx, zx;
  es_dtype xt;
  if (x_dq(g, g->nodes[gi].in[0], &x, &sx, &zx, &xt) < 0 || xt != g->values[q->in[2]].dtype)
    return 0;
  int rc;
  if (zx < 0 && (rc = zero_const(g, xt, 1, &zx)) < 0)
    return rc;
  q = &g->nodes[qi];
  int v[5] = {x, sx, zx, q->in[1], q->in[2]};
  return lower_to(g, qi, gi, ES_OP_QLinearGlobalAveragePool, v, 5, NULL, 0);
}

/* Node qi and the AveragePool of a dequantized 8-bit tensor it quantizes:
 *
 *   DQ(xq, sx, zx) -> AveragePool -> Q(sy, zy)
 *
 * as com.microsoft's QLinearAveragePool(xq, sx, zx, sy, zy) with the
 * pool's attributes (channels_last 0): the window's integer sum times sx
 * / (sy n), one 8-bit step from the float average's rounding at most.
 * 1 when rewritten, else 0. */
static int lower_avgpool(es_graph *g, int qi) {
  const es_node *q = &g->nodes[qi];
  int t = q->in[0];
  if (!inner(g, t))
    return 0;
  int pi = producer_is(g, t, ES_OP_AveragePool);
  if (pi < 0 || g->nodes[pi].n_in != 1)
    return 0;
  int x, sx, zx;
  es_dtype xt;
  if (x_dq(g, g->nodes[pi].in[0], &x, &sx, &zx, &xt) < 0 || xt != g->values[q->in[2]].dtype)
    return 0;
  int rc;
  if (zx < 0 && (rc = zero_const(g, xt, 1, &zx)) < 0)
    return rc;
  q = &g->nodes[qi];
  const es_node *pn = &g->nodes[pi];
  int v[5] = {x, sx, zx, q->in[1], q->in[2]};
  return lower_to(g, qi, pi, ES_OP_QLinearAveragePool, v, 5, pn->attrs, pn->n_attr);
}

/* Node qi and the Concat of dequantized 8-bit tensors it quantizes (a
 * feature pyramid's join):
 *
 *   Concat(DQ(x1, s1, z1), ..., DQ(xn, sn, zn)) -> Q(sy, zy)
 *
 * as QLinearConcat(sy, zy, x1, s1, z1, ...) (kernels/quant.c): an input
 * quantized like Y is copied, another requantized, which is what the
 * float graph computes for it. 1 when rewritten, else 0. */
#define LOWER_CAT_MAX 10 /* the kernel can ask for 10 inputs in another layout */
static int lower_concat(es_graph *g, int qi) {
  const es_node *q = &g->nodes[qi];
  int t = q->in[0];
  if (!inner(g, t))
    return 0;
  int ci = producer_is(g, t, ES_OP_Concat);
  if (ci < 0 || g->nodes[ci].n_in < 1 || g->nodes[ci].n_in > LOWER_CAT_MAX)
    return 0;
  int n = g->nodes[ci].n_in, x[LOWER_CAT_MAX], s[LOWER_CAT_MAX], z[LOWER_CAT_MAX];
  es_dtype yt = g->values[q->in[2]].dtype;
  for (int i = 0; i < n; i++) {
    es_dtype xt;
    if (x_dq(g, g->nodes[ci].in[i], &x[i], &s[i], &z[i], &xt) < 0 || xt != yt)
      return 0;
  }
  int rc;
  for (int i = 0; i < n; i++)
    if (z[i] < 0 && (rc = zero_const(g, yt, 1, &z[i])) < 0)
      return rc;
  q = &g->nodes[qi];
  int v[2 + 3 * LOWER_CAT_MAX] = {q->in[1], q->in[2]};
  for (int i = 0; i < n; i++) {
    v[2 + 3 * i] = x[i];
    v[3 + 3 * i] = s[i];
    v[4 + 3 * i] = z[i];
  }
  const es_node *c = &g->nodes[ci];
  return lower_to(g, qi, ci, ES_OP_QLinearConcat, v, 2 + 3 * n, c->attrs, c->n_attr);
}

/* Node qi (a QuantizeLinear) and what it quantizes as one int8 node. */
static int lower_one(es_graph *g, int qi) {
  const es_node *q = &g->nodes[qi];
  if (q->n_in != 3 || q->n_out != 1 || q->n_guard || !const_scalar_f32(g, q->in[1]) ||
      !is_const(g, q->in[2]) || const_count(g, q->in[2]) != 1)
    return 0;
  int rc = lower_conv(g, qi);
  if (rc == 0)
    rc = lower_matmul(g, qi);
  if (rc == 0)
    rc = lower_add(g, qi);
  if (rc == 0)
    rc = lower_gap(g, qi);
  if (rc == 0)
    rc = lower_avgpool(g, qi);
  return rc != 0 ? rc : lower_concat(g, qi);
}

/* fn on every QuantizeLinear, or with any_op on every node (1: it
 * rewrote the node there), then the nodes nothing reads any more go. */
static int lower_each(es_graph *g, int (*fn)(es_graph *g, int qi), int any_op) {
  if (!es__graph_fusion_enabled())
    return 0;
  es__graph_reindex(g);
  int changed = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    if (!any_op && g->nodes[i].op != ES_OP_QuantizeLinear)
      continue;
    int rc = fn(g, i);
    if (rc < 0)
      return rc;
    if (rc > 0) {
      changed++;
      es__graph_reindex(g); /* uses changed for the nodes after */
    }
  }
  if (changed) {
    es__graph_prune(g);
    es__graph_reindex(g);
  }
  return 0;
}

/* A nearest-neighbour Resize of a dequantized tensor copies dequantized
 * values, so it can copy the bytes before the DequantizeLinear as well
 * (and a MaxPool pick the largest byte: the same value by a positive
 * scale):
 *
 *   xq -> DQ(s, z) -> Resize(nearest) -> y   becomes   xq -> Resize -> DQ(s, z) -> y
 *
 * with the same numbers. Then the Resize moves a quarter of the bytes, and
 * what reads y sees a DQ it can lower (a feature pyramid's upsampled Add
 * becomes QLinearAdd, its Concat QLinearConcat). The Resize reads xq and
 * writes a new 8-bit value, which a new DQ (the old one's scale and zero
 * point) turns into y; the old DQ stays while something else reads it.
 * tf_crop_and_resize, whose extrapolation value is a float, is left as it
 * is. 1 when rewritten. */
static int commute_resize(es_graph *g, int ri) {
  const es_node *r = &g->nodes[ri];
  int pool = r->op == ES_OP_MaxPool;
  if ((r->op != ES_OP_Resize && r->op != ES_OP_Upsample && !pool) || r->n_in < 1 ||
      r->n_out != 1 || r->n_guard)
    return 0;
  const es_attr *m = es__node_attr(r, "mode");
  const es_attr *ct = es__node_attr(r, "coordinate_transformation_mode");
  if (!pool && ((m && (m->type != ES_ATTR_STRING || strcmp(m->s, "nearest"))) ||
                (ct && (ct->type != ES_ATTR_STRING || !strcmp(ct->s, "tf_crop_and_resize")))))
    return 0;
  int di = per_tensor_dq(g, r->in[0]);
  if (di < 0 || g->nodes[di].n_guard)
    return 0;
  /* the largest of dequantized values is the dequantized largest byte
   * while the scale is positive (a MaxPool's padding is ignored, not 0) */
  if (pool && !(*(const float *)g->values[g->nodes[di].in[1]].data > 0))
    return 0;
  int rq, rc;
  if ((rc = es__graph_act_append(g, "", &rq)) < 0)
    return rc;
  const es_node *dq = &g->nodes[di];
  int *in = es__ctx_alloc(&g->ctx, (size_t)dq->n_in * sizeof *in);
  int *out = es__ctx_alloc(&g->ctx, sizeof *out);
  if (!in || !out)
    return es__fail(ES_ENOMEM, "out of memory moving a Resize before its DequantizeLinear");
  memcpy(in, dq->in, (size_t)dq->n_in * sizeof *in);
  int xq = in[0];
  in[0] = rq;
  out[0] = g->nodes[ri].out[0];
  es_node nd = *dq;
  nd.in = in;
  nd.out = out;
  nd.n_out = 1;
  g->values[rq].dtype = x_type(g, xq, dq->n_in > 2 ? dq->in[2] : -1);
  g->nodes[ri].in[0] = xq;
  g->nodes[ri].out[0] = rq;
  g->values[rq].producer = ri;
  g->values[out[0]].producer = g->n_nodes; /* the sort reads producers */
  return (rc = es__graph_node_append(g, &nd)) < 0 ? rc : 1;
}

/* Q(DQ(xq, s, z), s, z) is xq: the byte dequantized and quantized again
 * by the same scale and zero point comes back (with |s| a normal float
 * below FLT_MAX / 256, (q - z) s / s is within 2^-15 of q - z, and nothing
 * overflows). Such pairs appear where a tensor and
 * its copy were calibrated alike (an upsampling's output and input) and
 * the copy's DQ moved (commute_resize). The Q's readers read xq; the
 * nodes go with the prune. 1 when rewritten. */
static int elide_requant(es_graph *g, int qi) {
  const es_node *q = &g->nodes[qi];
  if (q->n_in != 3 || q->n_out != 1 || q->n_guard || g->values[q->out[0]].is_output)
    return 0;
  int di = per_tensor_dq(g, q->in[0]);
  if (di < 0 || g->nodes[di].n_in != 3 || !const_scalar_f32(g, q->in[1]) ||
      !is_const(g, q->in[2]) || const_count(g, q->in[2]) != 1)
    return 0;
  const es_node *d = &g->nodes[di];
  const es_value *sq = &g->values[q->in[1]], *sd = &g->values[d->in[1]];
  const es_value *zq = &g->values[q->in[2]], *zd = &g->values[d->in[2]];
  float s = *(const float *)sd->data;
  if (memcmp(sq->data, sd->data, sizeof(float)) || !(fabsf(s) >= FLT_MIN) ||
      !(fabsf(s) <= FLT_MAX / 256) ||
      zq->dtype != zd->dtype || memcmp(zq->data, zd->data, 1))
    return 0;
  int from = q->out[0], to = d->in[0];
  for (int i = 0; i < g->n_nodes; i++)
    for (int k = 0; k < g->nodes[i].n_in; k++)
      if (g->nodes[i].in[k] == from)
        g->nodes[i].in[k] = to;
  return 1;
}

int es__graph_lower_qdq(es_graph *g) {
  if (!es__graph_fusion_enabled())
    return 0;
  es__graph_reindex(g);
  int moved = 0, rc, n = g->n_nodes;
  for (int i = 0; i < n; i++) {
    if ((rc = commute_resize(g, i)) < 0)
      return rc;
    moved += rc;
  }
  if (moved) {
    if ((rc = es__graph_toposort(g)) < 0)
      return rc;
    es__graph_reindex(g);
    es__graph_prune(g);
  }
  if ((rc = lower_each(g, elide_requant, 0)) < 0 || (rc = lower_each(g, lower_one, 0)) < 0)
    return rc;
  if ((rc = lower_each(g, lower_float_out, 1)) < 0)
    return rc;
  return lower_each(g, lower_weight_only, 1);
}

/* ==========================================================================
 * DequantizeLinear -> elementwise float ops -> QuantizeLinear as a table
 * ======================================================================== */

/* Between two quantized tensors, elementwise float operators whose only
 * runtime input is one 8-bit tensor (a HardSwish written as
 * x * Clip(x + 3, 0, 6) / 6, a Sigmoid, a Relu6) map 256 possible bytes
 * to 256 possible bytes: the pass evaluates the chain once, with the
 * operators' own kernels, on the 256 dequantized values, quantizes the
 * results by QuantizeLinear's rule, and replaces the chain by one QLookup
 * node (kernels/quant.c) reading the byte and writing the byte. The
 * numbers are the chain's exactly; what goes is a float tensor written
 * and read per operator. */

#define LU_MAX_NODES 16

static int lookup_op(es_op op) {
  switch (op) {
  case ES_OP_Add: case ES_OP_Sub: case ES_OP_Mul: case ES_OP_Div: case ES_OP_Clip:
  case ES_OP_Relu: case ES_OP_Sigmoid: case ES_OP_Tanh: case ES_OP_HardSigmoid:
  case ES_OP_HardSwish: case ES_OP_LeakyRelu: case ES_OP_Elu: case ES_OP_Exp: case ES_OP_Neg:
  case ES_OP_Abs: case ES_OP_Min: case ES_OP_Max: case ES_OP_Sqrt: case ES_OP_Erf:
  case ES_OP_Softplus: case ES_OP_Identity: case ES_OP_Pow:
    return 1;
  default:
    return 0;
  }
}

/* A per-tensor DequantizeLinear of an 8-bit tensor: its node, else -1. */
static int per_tensor_dq(const es_graph *g, int v) {
  int d = producer_is(g, v, ES_OP_DequantizeLinear);
  if (d < 0)
    return -1;
  const es_node *n = &g->nodes[d];
  int zx = n->n_in > 2 ? n->in[2] : -1;
  es_dtype xt = x_type(g, n->in[0], zx);
  if ((xt != ES_DTYPE_UINT8 && xt != ES_DTYPE_INT8) || !const_scalar_f32(g, n->in[1]) ||
      (zx >= 0 && (!is_const(g, zx) || const_count(g, zx) != 1)))
    return -1;
  return d;
}

static int32_t byte_value(es_dtype t, int i) { return t == ES_DTYPE_INT8 ? (int8_t)i : i; }

/* The chain ending in t (Q's input) back to one per-tensor DQ: its nodes
 * in s[] (ascending: topological), the DQ in *dq. 0 when it is not one. */
static int chain_of(const es_graph *g, int t, int *s, int *ns, int *dq) {
  int stack[LU_MAX_NODES * 4], sp = 0, n = 0, r = -1;
  *dq = -1;
  if (g->values[t].producer < 0)
    return 0;
  stack[sp++] = g->values[t].producer;
  while (sp > 0) {
    int ni = stack[--sp], seen = 0;
    for (int i = 0; i < n; i++)
      seen |= s[i] == ni;
    if (seen)
      continue;
    const es_node *nd = &g->nodes[ni];
    if (!lookup_op(nd->op) || nd->n_out != 1 || nd->n_guard || n == LU_MAX_NODES)
      return 0;
    s[n++] = ni;
    for (int k = 0; k < nd->n_in; k++) {
      int v = nd->in[k];
      if (v < 0)
        continue;
      if (is_const(g, v)) {
        if (const_count(g, v) != 1 || g->values[v].dtype != ES_DTYPE_FLOAT)
          return 0;
        continue;
      }
      int d = per_tensor_dq(g, v);
      if (d >= 0) {
        if (r >= 0 && r != v)
          return 0; /* two runtime inputs */
        r = v;
        *dq = d;
        continue;
      }
      if (g->values[v].producer < 0 || sp == (int)(sizeof stack / sizeof *stack))
        return 0;
      stack[sp++] = g->values[v].producer;
    }
  }
  if (r < 0)
    return 0;
  /* every value the chain makes is read by the chain alone (t by the Q) */
  for (int i = 0; i < n; i++) {
    int v = g->nodes[s[i]].out[0], uses = 0;
    if (v == t)
      continue;
    if (g->values[v].is_output)
      return 0;
    for (int j = 0; j < n; j++)
      for (int k = 0; k < g->nodes[s[j]].n_in; k++)
        uses += g->nodes[s[j]].in[k] == v;
    if (uses != g->values[v].uses)
      return 0;
  }
  for (int i = 1; i < n; i++) /* ascending */
    for (int j = i; j > 0 && s[j - 1] > s[j]; j--) {
      int tmp = s[j];
      s[j] = s[j - 1];
      s[j - 1] = tmp;
    }
  *ns = n;
  return 1;
}

/* The chain's outputs for the 256 bytes of its DQ's input, in ys. 0: done;
 * 1: a kernel could not evaluate it (left as it is); < 0: an error. */
static int chain_eval(const es_graph *g, const int *s, int ns, int dq, float *ys) {
  const es_node *d = &g->nodes[dq];
  int zx = d->n_in > 2 ? d->in[2] : -1;
  es_dtype xt = x_type(g, d->in[0], zx);
  float sx = *(const float *)g->values[d->in[1]].data;
  int32_t z = zx < 0 ? 0 : xt == ES_DTYPE_INT8 ? *(const int8_t *)g->values[zx].data
                                              : *(const uint8_t *)g->values[zx].data;
  float *val[LU_MAX_NODES + 1] = {0}; /* [0]: the DQ's output; [i + 1]: node s[i]'s */
  int owner[LU_MAX_NODES + 1] = {d->out[0]};
  if (!(val[0] = es_mem_alloc(ES_MEM_MODEL, 256 * sizeof(float))))
    return es__fail(ES_ENOMEM, "out of memory lowering a quantized chain");
  for (int i = 0; i < 256; i++) /* as DequantizeLinear computes it */
    val[0][i] = (float)(byte_value(xt, i) - z) * sx;
  int rc = 0;
  es_tdesc vec;
  int64_t n256 = 256;
  es__tdesc_set(&vec, ES_DTYPE_FLOAT, 1, &n256);
  for (int i = 0; i < ns && rc == 0; i++) {
    const es_node *nd = &g->nodes[s[i]];
    es_tdesc desc[8];
    const es_tdesc *in[8];
    const void *data[8];
    if (nd->n_in > 8) {
      rc = 1;
      break;
    }
    for (int k = 0; k < nd->n_in; k++) {
      int v = nd->in[k];
      in[k] = NULL;
      data[k] = NULL;
      if (v < 0)
        continue;
      if (is_const(g, v)) {
        es__tdesc_set(&desc[k], g->values[v].dtype, g->values[v].rank, g->values[v].dims);
        in[k] = &desc[k];
        data[k] = g->values[v].data;
        continue;
      }
      for (int j = 0; j <= i; j++)
        if (owner[j] == v)
          data[k] = val[j];
      in[k] = &vec;
    }
    es_knode kn = es__knode_of(nd);
    es_tdesc od;
    void *out = NULL;
    int erc = es__kernel_eval(&kn, g->opset, nd->n_in, in, data, 1, &od, &out);
    if (erc < 0 || od.dtype != ES_DTYPE_FLOAT || od.count != 256) {
      es_mem_free(out);
      rc = erc == ES_ENOMEM ? erc : 1;
      break;
    }
    val[i + 1] = out;
    owner[i + 1] = nd->out[0];
  }
  if (rc == 0)
    memcpy(ys, val[ns], 256 * sizeof(float));
  for (int i = 0; i <= ns; i++)
    es_mem_free(val[i]);
  return rc;
}

static int lookup_one(es_graph *g, int qi) {
  const es_node *q = &g->nodes[qi];
  if (q->n_in != 3 || q->n_out != 1 || q->n_guard || !const_scalar_f32(g, q->in[1]) ||
      !is_const(g, q->in[2]) || const_count(g, q->in[2]) != 1 || !inner(g, q->in[0]))
    return 0;
  es_dtype yt = g->values[q->in[2]].dtype;
  if (yt != ES_DTYPE_UINT8 && yt != ES_DTYPE_INT8)
    return 0;
  int s[LU_MAX_NODES], ns, dq;
  if (!chain_of(g, q->in[0], s, &ns, &dq))
    return 0;
  float ys[256];
  int rc = chain_eval(g, s, ns, dq, ys);
  if (rc != 0)
    return rc < 0 ? rc : 0;
  /* the table: the QuantizeLinear node itself, run by its kernel on the
   * chain's 256 results (so its rule is the one rule) */
  es_tdesc desc[3];
  const es_tdesc *in3[3];
  const void *data3[3] = {ys, g->values[q->in[1]].data, g->values[q->in[2]].data};
  int64_t n256v = 256;
  es__tdesc_set(&desc[0], ES_DTYPE_FLOAT, 1, &n256v);
  for (int k = 1; k < 3; k++)
    es__tdesc_set(&desc[k], g->values[q->in[k]].dtype, g->values[q->in[k]].rank,
                  g->values[q->in[k]].dims);
  for (int k = 0; k < 3; k++)
    in3[k] = &desc[k];
  es_knode kq = es__knode_of(q);
  es_tdesc td;
  void *table = NULL;
  rc = es__kernel_eval(&kq, g->opset, 3, in3, data3, 1, &td, &table);
  if (rc < 0 || td.dtype != yt || td.count != 256) {
    es_mem_free(table);
    return rc == ES_ENOMEM ? rc : 0;
  }
  int tv;
  int64_t n256 = 256;
  if ((rc = es__graph_const_append(g, "", yt, 1, &n256, table, 256, &tv)) < 0)
    return rc;
  int xq = g->nodes[dq].in[0];
  int *in = es__ctx_alloc(&g->ctx, 2 * sizeof *in);
  if (!in)
    return es__fail(ES_ENOMEM, "out of memory lowering a quantized chain");
  in[0] = xq;
  in[1] = tv;
  es_node nd = g->nodes[qi];
  nd.op = ES_OP_QLookup;
  nd.n_in = 2;
  nd.in = in;
  nd.n_attr = 0;
  nd.attrs = NULL;
  g->nodes[qi] = nd; /* the chain (and the DQ, if nothing else reads it) goes with the prune */
  return 1;
}

int es__graph_lower_lookups(es_graph *g) { return lower_each(g, lookup_one, 0); }
