/* Fusion pass 3 (see fuse.c): PP-OCR's decomposed layer normalisation
 * over the last axis becomes one internal LayerNorm node. */
#include "engine/fuse.h"

#include "common/internal.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ==========================================================================
 * Pass 3: LayerNorm
 * ======================================================================== */

/* ReduceMean over exactly the last axis of x, keepdims. */
static int reduce_last(const fuser *f, const es_node *nd, int x) {
  sshape xs;
  int64_t keep, ax[ES_MAX_RANK];
  int n = 0;
  if (nd->op != ES_OP_ReduceMean || nd->n_out != 1 || nd->in[0] != x ||
      !es__fz_attr_int(nd, "keepdims", 1, &keep) || keep != 1)
    return 0;
  const es_attr *a = es__node_attr(nd, "axes");
  if (a) {
    if (a->type != ES_ATTR_INTS || a->n != 1)
      return 0;
    ax[0] = a->ints[0];
    n = 1;
  } else if (nd->n_in < 2 || !es__fz_const_ints(f->g, nd->in[1], 1, ax, &n) || n != 1) {
    return 0;
  }
  if (ax[0] == -1)
    return 1;
  es__fz_shape_of(f, x, &xs);
  return xs.rank > 0 && ax[0] == xs.rank - 1;
}

/* The one of the nodes cs with operator op, else -1. */
static int node_with_op(const es_graph *g, es_op op, const int *cs, int ncs) {
  for (int i = 0; i < ncs; i++)
    if (g->nodes[cs[i]].op == op)
      return cs[i];
  return -1;
}

/* gamma or beta: a float32 constant [K] for x's last dimension D, K = D or
 * K = 1 (proven when D is known; the kernel checks the rest). */
static int ln_param(const fuser *f, int c, int x) {
  sshape xs;
  if (!es__fz_const_f32(f->g, c) || f->g->values[c].rank != 1)
    return 0;
  es__fz_shape_of(f, x, &xs);
  int64_t k = f->g->values[c].dims[0];
  return k == 1 || xs.rank < 1 || xs.d[xs.rank - 1] < 0 || xs.d[xs.rank - 1] == k;
}

/* The constant operand of binary nd whose other operand is v, or -1. */
static int const_operand(const es_graph *g, const es_node *nd, int v) {
  int c = es__fz_other_input(nd, v);
  return c >= 0 && es__fz_is_const(g, c) ? c : -1;
}

static int fuse_layernorm_at(fuser *f, int n) {
  es_graph *g = f->g;
  const es_node *rm1 = &g->nodes[n];
  if (rm1->op != ES_OP_ReduceMean || rm1->n_in < 1 || rm1->in[0] < 0)
    return 0;
  int x = rm1->in[0], m = rm1->out[0];
  if (!reduce_last(f, rm1, x) || !es__fz_inner(g, m, 1))
    return 0;
  int sub_n = es__fz_consumer(f, m);
  const es_node *sub = &g->nodes[sub_n];
  if (sub->op != ES_OP_Sub || sub->n_in != 2 || sub->in[0] != x || sub->in[1] != m ||
      !es__fz_inner(g, sub->out[0], 2))
    return 0;
  int d = sub->out[0], cs[2];
  if (es__fz_consumers(f, d, cs, 2) != 2)
    return 0;
  int pow_n = node_with_op(g, ES_OP_Pow, cs, 2), div_n = node_with_op(g, ES_OP_Div, cs, 2);
  if (pow_n < 0 || div_n < 0)
    return 0;
  const es_node *pw = &g->nodes[pow_n], *dv = &g->nodes[div_n];
  float two, eps;
  if (pw->n_in != 2 || pw->in[0] != d || !es__fz_const_scalar(g, pw->in[1], &two) || two != 2.0f ||
      g->values[pw->in[1]].rank > 1 || !es__fz_inner(g, pw->out[0], 1))
    return 0;
  int rm2_n = es__fz_consumer(f, pw->out[0]);
  const es_node *rm2 = &g->nodes[rm2_n];
  if (!reduce_last(f, rm2, pw->out[0]) || !es__fz_inner(g, rm2->out[0], 1))
    return 0;
  int add_n = es__fz_consumer(f, rm2->out[0]);
  const es_node *add = &g->nodes[add_n];
  int ec = add->op == ES_OP_Add ? const_operand(g, add, rm2->out[0]) : -1;
  if (ec < 0 || !es__fz_const_scalar(g, ec, &eps) || g->values[ec].rank > 1 || !isfinite(eps) ||
      !es__fz_inner(g, add->out[0], 1))
    return 0;
  int sqrt_n = es__fz_consumer(f, add->out[0]);
  const es_node *sq = &g->nodes[sqrt_n];
  if (sq->op != ES_OP_Sqrt || sq->n_out != 1 || !es__fz_inner(g, sq->out[0], 1))
    return 0;
  if (dv->n_in != 2 || dv->in[0] != d || dv->in[1] != sq->out[0] || !es__fz_inner(g, dv->out[0], 1))
    return 0;
  int mul_n = es__fz_consumer(f, dv->out[0]);
  const es_node *mul = &g->nodes[mul_n];
  int gamma = mul->op == ES_OP_Mul ? const_operand(g, mul, dv->out[0]) : -1;
  if (gamma < 0 || !ln_param(f, gamma, x) || !es__fz_inner(g, mul->out[0], 1))
    return 0;
  int badd_n = es__fz_consumer(f, mul->out[0]);
  const es_node *badd = &g->nodes[badd_n];
  int beta = badd->op == ES_OP_Add ? const_operand(g, badd, mul->out[0]) : -1;
  if (beta < 0 || !ln_param(f, beta, x) || badd->out[0] < 0)
    return 0;

  /* The final Add's slot becomes the LayerNorm. */
  es_node ln = g->nodes[badd_n];
  int *in = es__ctx_alloc(&g->ctx, 3 * sizeof *in);
  es_attr *attrs = es__ctx_alloc(&g->ctx, 2 * sizeof *attrs);
  char *a1 = es__ctx_strdup(&g->ctx, "epsilon"), *a2 = es__ctx_strdup(&g->ctx, "axis");
  if (!in || !attrs || !a1 || !a2) {
    char label[120];
    return es__fail(ES_ENOMEM, "%s: out of memory fusing a LayerNorm",
                    es__node_label(rm1, label, sizeof label));
  }
  in[0] = x;
  in[1] = gamma;
  in[2] = beta;
  attrs[0] = (es_attr){.name = a1, .type = ES_ATTR_FLOAT, .f = eps};
  attrs[1] = (es_attr){.name = a2, .type = ES_ATTR_INT, .i = -1};
  ln.op = ES_OP_LayerNorm;
  ln.name = rm1->name;
  ln.file_index = rm1->file_index;
  ln.in = in;
  ln.n_in = 3;
  ln.attrs = attrs;
  ln.n_attr = 2;
  const int parts[] = {n, sub_n, pow_n, rm2_n, add_n, sqrt_n, div_n, mul_n};
  int rc = es__fz_touch(f, badd_n);
  for (size_t i = 0; rc == 0 && i < sizeof parts / sizeof parts[0]; i++)
    rc = es__fz_touch(f, parts[i]);
  if (rc < 0)
    return rc;
  for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
    f->gone[parts[i]] = 1;
  g->nodes[badd_n] = ln;
  rc = es__fz_commit(f);
  return rc < 0 ? rc : 1;
}

/* One sweep over the slots, skipping the nodes that went (see
 * es__fuse_convs); the graph is compacted once at the end. */
int es__fuse_layernorms(fuser *f) {
  int changed = 0;
  for (int n = 0; n < f->g->n_nodes; n++) {
    if (f->gone[n])
      continue;
    int rc = fuse_layernorm_at(f, n);
    if (rc < 0)
      return rc;
    changed |= rc;
  }
  return changed ? es__fz_nodes_compact(f) : 0;
}
