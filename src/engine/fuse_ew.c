/* Fusion pass 4 (see fuse.c): chains of float32 elementwise operators
 * become FusedElementwise nodes running a register program (format in
 * kernels/fused.h). */
#include "engine/fuse.h"

#include "common/internal.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ==========================================================================
 * Pass 4: elementwise chains
 * ======================================================================== */

/* A group of elementwise nodes that becomes one FusedElementwise node. */
typedef struct ew_group {
  int sink;              /* its last node: the group's one output */
  int n;
  int nodes[ES_FE_MAX_INSNS];
} ew_group;

/* The operators a program runs: opcode, operands, and the float
 * attributes (with their defaults) that become the opcode's two
 * immediates. Clip (bounds from inputs or attributes) and Gelu (opcode by
 * its 'approximate') are decided in ew_code. */
typedef struct ew_opdef {
  es_op op;
  int code; /* ES_FE_* */
  int arity;
  const char *p1, *p2; /* attribute names, or NULL (immediate 0) */
  float d1, d2;
} ew_opdef;

static const ew_opdef ew_opdefs[] = {
    {ES_OP_Add, ES_FE_ADD, 2, NULL, NULL, 0, 0},
    {ES_OP_Sub, ES_FE_SUB, 2, NULL, NULL, 0, 0},
    {ES_OP_Mul, ES_FE_MUL, 2, NULL, NULL, 0, 0},
    {ES_OP_Div, ES_FE_DIV, 2, NULL, NULL, 0, 0},
    {ES_OP_Pow, ES_FE_POW, 2, NULL, NULL, 0, 0},
    {ES_OP_Max, ES_FE_MAX, 2, NULL, NULL, 0, 0}, /* two inputs only (ew_eligible) */
    {ES_OP_Min, ES_FE_MIN, 2, NULL, NULL, 0, 0},
    {ES_OP_PRelu, ES_FE_PRELU, 2, NULL, NULL, 0, 0},
    {ES_OP_Relu, ES_FE_RELU, 1, NULL, NULL, 0, 0},
    {ES_OP_Sigmoid, ES_FE_SIGMOID, 1, NULL, NULL, 0, 0},
    {ES_OP_Sqrt, ES_FE_SQRT, 1, NULL, NULL, 0, 0},
    {ES_OP_Clip, ES_FE_CLIP, 1, NULL, NULL, 0, 0},
    {ES_OP_HardSigmoid, ES_FE_HARDSIGMOID, 1, "alpha", "beta", 0.2f, 0.5f},
    {ES_OP_Abs, ES_FE_ABS, 1, NULL, NULL, 0, 0},
    {ES_OP_Neg, ES_FE_NEG, 1, NULL, NULL, 0, 0},
    {ES_OP_Exp, ES_FE_EXP, 1, NULL, NULL, 0, 0},
    {ES_OP_Log, ES_FE_LOG, 1, NULL, NULL, 0, 0},
    {ES_OP_Tanh, ES_FE_TANH, 1, NULL, NULL, 0, 0},
    {ES_OP_Erf, ES_FE_ERF, 1, NULL, NULL, 0, 0},
    {ES_OP_Reciprocal, ES_FE_RECIPROCAL, 1, NULL, NULL, 0, 0},
    {ES_OP_Floor, ES_FE_FLOOR, 1, NULL, NULL, 0, 0},
    {ES_OP_Ceil, ES_FE_CEIL, 1, NULL, NULL, 0, 0},
    {ES_OP_Round, ES_FE_ROUND, 1, NULL, NULL, 0, 0},
    {ES_OP_Sign, ES_FE_SIGN, 1, NULL, NULL, 0, 0},
    {ES_OP_Softplus, ES_FE_SOFTPLUS, 1, NULL, NULL, 0, 0},
    {ES_OP_Softsign, ES_FE_SOFTSIGN, 1, NULL, NULL, 0, 0},
    {ES_OP_Mish, ES_FE_MISH, 1, NULL, NULL, 0, 0},
    {ES_OP_HardSwish, ES_FE_HARDSWISH, 1, NULL, NULL, 0, 0},
    {ES_OP_Gelu, ES_FE_GELU, 1, NULL, NULL, 0, 0},
    {ES_OP_LeakyRelu, ES_FE_LEAKYRELU, 1, "alpha", NULL, 0.01f, 0},
    {ES_OP_Elu, ES_FE_ELU, 1, "alpha", NULL, 1.0f, 0},
    {ES_OP_Selu, ES_FE_SELU, 1, "alpha", "gamma", 1.67326319217681884765625f,
     1.05070102214813232421875f},
    {ES_OP_Celu, ES_FE_CELU, 1, "alpha", NULL, 1.0f, 0},
    {ES_OP_ThresholdedRelu, ES_FE_THRESHOLDEDRELU, 1, "alpha", NULL, 1.0f, 0},
    {ES_OP_Shrink, ES_FE_SHRINK, 1, "bias", "lambd", 0.0f, 0.5f},
};

static const ew_opdef *ew_opdef_of(es_op op) {
  for (size_t i = 0; i < sizeof ew_opdefs / sizeof ew_opdefs[0]; i++)
    if (ew_opdefs[i].op == op)
      return &ew_opdefs[i];
  return NULL;
}

/* nd's opcode and its two parameters (unused ones 0); -1 when the node's
 * attributes are not what the kernel accepts (it then stays a node of its
 * own, whose kernel says what is wrong). */
static int ew_code(const es_graph *g, const es_node *nd, float *a, float *b) {
  const ew_opdef *d = ew_opdef_of(nd->op);
  *a = *b = 0;
  if (!d)
    return -1;
  if (nd->op == ES_OP_Clip)
    return es__fz_clip_bounds(g, nd, INFINITY, a, b) ? ES_FE_CLIP : -1;
  if (nd->op == ES_OP_Gelu) {
    const char *ap = es__fz_attr_str(nd, "approximate", "none");
    return !ap ? -1 : !strcmp(ap, "none") ? ES_FE_GELU : !strcmp(ap, "tanh") ? ES_FE_GELU_TANH : -1;
  }
  if ((d->p1 && !es__fz_attr_float(nd, d->p1, d->d1, a)) ||
      (d->p2 && !es__fz_attr_float(nd, d->p2, d->d2, b)))
    return -1;
  if (nd->op == ES_OP_Celu && (*a == 0 || *a != *a))
    return -1; /* the kernel refuses alpha 0 */
  return d->code;
}

/* Operands an operator reads in a program. */
static int ew_arity(es_op op) {
  const ew_opdef *d = ew_opdef_of(op);
  return d ? d->arity : 0;
}

/* PRelu's slope s broadcasts to x without growing it (else the kernel
 * refuses the node): every dim of s, right-aligned, is 1 or x's dim,
 * symbolically. */
static int ew_slope_fits(const fuser *f, int s, int x) {
  sshape ss, xs;
  es__fz_shape_of(f, s, &ss);
  es__fz_shape_of(f, x, &xs);
  if (ss.rank < 0 || xs.rank < ss.rank)
    return 0;
  for (int i = 0; i < ss.rank; i++)
    if (ss.d[i] != 1 && ss.d[i] != xs.d[xs.rank - ss.rank + i])
      return 0;
  return 1;
}

/* nd may join a group: a listed operator over float32 operands, with the
 * operands and attributes the program can take. */
static int ew_eligible(const fuser *f, const es_node *nd) {
  float a, b;
  int arity = ew_arity(nd->op);
  if (!arity || ew_code(f->g, nd, &a, &b) < 0)
    return 0;
  if (nd->n_out != 1 || nd->out[0] < 0 || nd->n_in < arity || (arity == 2 && nd->n_in != 2))
    return 0;
  if (nd->op == ES_OP_PRelu && !ew_slope_fits(f, nd->in[1], nd->in[0]))
    return 0;
  sshape s;
  es__fz_shape_of(f, nd->out[0], &s);
  if (s.dt != ES_DTYPE_FLOAT)
    return 0;
  for (int k = 0; k < arity; k++) {
    es__fz_shape_of(f, nd->in[k], &s);
    if (nd->in[k] < 0 || s.dt != ES_DTYPE_FLOAT)
      return 0;
  }
  return 1;
}

static int in_group(const ew_group *gr, int node) {
  for (int i = 0; i < gr->n; i++)
    if (gr->nodes[i] == node)
      return 1;
  return 0;
}

/* v (read by the group) can be computed inside it: its producer is an
 * eligible node of no other group and every reader of v is in the group.
 * reads[v] counts the node inputs reading v when the pass started; every
 * reader is in the group exactly when the group's own inputs account for
 * all of them. Counting within the group (at most ES_FE_MAX_INSNS / 2
 * nodes) instead of scanning the graph for readers keeps the pass linear:
 * a scan made a chain of n nodes cost n^2 / 2 input checks. */
static int ew_absorbable(const fuser *f, const ew_group *gr, const int *owner, const int *reads,
                         int v) {
  const es_graph *g = f->g;
  if (v < 0 || g->values[v].kind != ES_VALUE_ACT || g->values[v].is_output)
    return -1;
  int p = g->values[v].producer;
  if (p < 0 || owner[p] >= 0 || in_group(gr, p) || !ew_eligible(f, &g->nodes[p]))
    return -1;
  int inside = 0;
  for (int i = 0; i < gr->n; i++) {
    const es_node *nd = &g->nodes[gr->nodes[i]];
    for (int k = 0; k < nd->n_in; k++)
      inside += nd->in[k] == v;
  }
  return inside == reads[v] ? p : -1;
}

static int cmp_int(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

/* Grows the group ending at sink backwards to a fixpoint. */
static void ew_grow(const fuser *f, ew_group *gr, const int *owner, const int *reads) {
  int changed = 1;
  while (changed) {
    changed = 0;
    for (int i = 0; i < gr->n && gr->n < ES_FE_MAX_INSNS / 2; i++) {
      const es_node *nd = &f->g->nodes[gr->nodes[i]];
      for (int k = 0; k < nd->n_in && gr->n < ES_FE_MAX_INSNS / 2; k++) {
        int p = ew_absorbable(f, gr, owner, reads, nd->in[k]);
        if (p >= 0) {
          gr->nodes[gr->n++] = p;
          changed = 1;
        }
      }
    }
  }
  qsort(gr->nodes, (size_t)gr->n, sizeof gr->nodes[0], cmp_int);
}

typedef struct ew_prog {
  int64_t code[ES_FE_MAX_INSNS * ES_FE_WORDS];
  int n_code;
  float imm[2 * ES_FE_MAX_INSNS];
  int n_imm;
  int in[ES_FE_MAX_REGS]; /* the node's inputs (registers 0 .. n_in-1) */
  int n_in;
} ew_prog;

static int64_t ew_imm(ew_prog *p, float a) {
  p->imm[p->n_imm] = a;
  return ES_FE_IMM(p->n_imm++);
}

static int64_t ew_imm2(ew_prog *p, float a, float b) {
  int64_t op = ew_imm(p, a);
  ew_imm(p, b);
  return op;
}

static int ew_index(const int *v, int n, int x) {
  for (int i = 0; i < n; i++)
    if (v[i] == x)
      return i;
  return -1;
}

/* Operand v of a group node is an immediate: a one-element constant whose
 * rank is no more than the broadcast shape of the node's inputs already
 * has (the kernel's output shape comes from its inputs alone). */
static int ew_is_imm(const es_graph *g, int v, int max_rank, float *c) {
  return es__fz_const_scalar(g, v, c) && g->values[v].rank <= max_rank;
}

/* Writes the program of gr. 0 when it does not fit the format's limits. */
static int ew_program(const fuser *f, const ew_group *gr, ew_prog *p) {
  const es_graph *g = f->g;
  int out[ES_FE_MAX_INSNS];      /* each node's output value */
  int reg_of[ES_FE_MAX_INSNS];   /* the temporary holding it */
  int last_use[ES_FE_MAX_INSNS]; /* its last reader in the group */
  float c;
  memset(p, 0, sizeof *p);
  for (int i = 0; i < gr->n; i++)
    out[i] = g->nodes[gr->nodes[i]].out[0];
  /* Inputs: every operand from outside the group but one-element
   * constants, which become immediates when the inputs' rank allows. */
  int max_rank = 0;
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < gr->n; i++) {
      const es_node *nd = &g->nodes[gr->nodes[i]];
      for (int k = 0; k < ew_arity(nd->op); k++) {
        int v = nd->in[k];
        if (ew_index(out, gr->n, v) >= 0 || ew_index(p->in, p->n_in, v) >= 0)
          continue;
        if (pass == 0 ? es__fz_const_scalar(g, v, &c) : ew_is_imm(g, v, max_rank, &c))
          continue;
        if (p->n_in == ES_FE_MAX_REGS)
          return 0;
        p->in[p->n_in++] = v;
        sshape s;
        es__fz_shape_of(f, v, &s);
        if (s.rank > max_rank)
          max_rank = s.rank;
      }
    }
  if (p->n_in == 0)
    return 0;
  for (int i = 0; i < gr->n; i++) {
    last_use[i] = i;
    for (int j = i + 1; j < gr->n; j++) {
      const es_node *nd = &g->nodes[gr->nodes[j]];
      for (int k = 0; k < nd->n_in; k++)
        if (nd->in[k] == out[i])
          last_use[i] = j;
    }
  }
  int holder[ES_FE_MAX_REGS]; /* per temporary: the node whose value it holds, or -1 */
  for (int r = 0; r < ES_FE_MAX_REGS; r++)
    holder[r] = -1;
  for (int i = 0; i < gr->n; i++) {
    const es_node *nd = &g->nodes[gr->nodes[i]];
    int64_t opnd[2] = {0, 0};
    for (int k = 0; k < ew_arity(nd->op); k++) {
      int v = nd->in[k], j = ew_index(out, i, v);
      if (j >= 0)
        opnd[k] = reg_of[j];
      else if ((j = ew_index(p->in, p->n_in, v)) >= 0)
        opnd[k] = j;
      else if (ew_is_imm(g, v, max_rank, &c))
        opnd[k] = ew_imm(p, c);
      else
        return 0;
    }
    float a, b;
    int64_t op = ew_code(g, nd, &a, &b);
    if (op < 0)
      return 0;
    if (es__fe_params((int)op))
      opnd[1] = ew_imm2(p, a, b);
    /* Temporaries whose last reader is this instruction are free for its
     * result (the kernel allows dst == operand); take the lowest free. */
    int dst = -1;
    for (int r = p->n_in; r < ES_FE_MAX_REGS; r++) {
      if (holder[r] >= 0 && last_use[holder[r]] <= i)
        holder[r] = -1;
      if (holder[r] < 0 && dst < 0)
        dst = r;
    }
    if (dst < 0)
      return 0;
    holder[dst] = i;
    reg_of[i] = dst;
    int64_t *w = &p->code[p->n_code];
    w[0] = op;
    w[1] = opnd[0];
    w[2] = opnd[1];
    w[3] = dst;
    p->n_code += ES_FE_WORDS;
  }
  return 1;
}

/* Replaces gr's sink by the FusedElementwise node and marks the rest gone. */
static int ew_rewrite(fuser *f, const ew_group *gr, const ew_prog *p) {
  es_graph *g = f->g;
  es_node nd = g->nodes[gr->sink];
  char label[120];
  int *in = es__ctx_alloc(&g->ctx, (size_t)p->n_in * sizeof *in);
  int64_t *code = es__ctx_alloc(&g->ctx, (size_t)p->n_code * sizeof *code);
  float *imm = p->n_imm ? es__ctx_alloc(&g->ctx, (size_t)p->n_imm * sizeof *imm) : NULL;
  es_attr *attrs = es__ctx_alloc(&g->ctx, 2 * sizeof *attrs);
  char *n1 = es__ctx_strdup(&g->ctx, "_prog"), *n2 = es__ctx_strdup(&g->ctx, "_prog_f");
  if (!in || !code || (p->n_imm && !imm) || !attrs || !n1 || !n2)
    return es__fail(ES_ENOMEM, "%s: out of memory fusing an elementwise chain",
                    es__node_label(&nd, label, sizeof label));
  memcpy(in, p->in, (size_t)p->n_in * sizeof *in);
  memcpy(code, p->code, (size_t)p->n_code * sizeof *code);
  if (p->n_imm)
    memcpy(imm, p->imm, (size_t)p->n_imm * sizeof *imm);
  attrs[0] = (es_attr){.name = n1, .type = ES_ATTR_INTS, .n = (size_t)p->n_code, .ints = code};
  attrs[1] = (es_attr){.name = n2, .type = ES_ATTR_FLOATS, .n = (size_t)p->n_imm, .floats = imm};
  nd.op = ES_OP_FusedElementwise;
  nd.in = in;
  nd.n_in = p->n_in;
  nd.attrs = attrs;
  nd.n_attr = p->n_imm ? 2 : 1;
  for (int i = 0; i < gr->n; i++)
    f->gone[gr->nodes[i]] = 1;
  f->gone[gr->sink] = 0;
  g->nodes[gr->sink] = nd;
  return 0;
}

/* ==========================================================================
 * The elementwise family in the symbolic shape pass (fuse_shapes.c)
 * ======================================================================== */

/* The operators of kernels/elementwise.c that fuse_shapes.c does not list
 * itself: 1 if output 0 has input 0's shape, 2 if it is the broadcast of
 * inputs 0 and 1, 0 when not known here. */
int es__fz_ew_shape(const es_node *nd) {
  switch (nd->op) {
  case ES_OP_Max:
  case ES_OP_Min:
  case ES_OP_Sum:
  case ES_OP_Mean:
    return nd->n_in == 1 ? 1 : nd->n_in == 2 ? 2 : 0;
  case ES_OP_PRelu:
  case ES_OP_Less:
  case ES_OP_Greater:
  case ES_OP_LessOrEqual:
  case ES_OP_GreaterOrEqual:
  case ES_OP_And:
  case ES_OP_Or:
  case ES_OP_Xor:
  case ES_OP_Mod:
  case ES_OP_BitShift:
    return 2;
  case ES_OP_Where:
    return 0;
  default:
    return ew_opdef_of(nd->op) || es__fz_ew_dtype(nd, ES_DTYPE_FLOAT) != ES_DTYPE_UNDEFINED;
  }
}

/* Output 0's element type given input 0's (x); ES_DTYPE_UNDEFINED for
 * operators not known here. */
es_dtype es__fz_ew_dtype(const es_node *nd, es_dtype x) {
  switch (nd->op) {
  case ES_OP_Less:
  case ES_OP_Greater:
  case ES_OP_LessOrEqual:
  case ES_OP_GreaterOrEqual:
  case ES_OP_And:
  case ES_OP_Or:
  case ES_OP_Xor:
  case ES_OP_Not:
  case ES_OP_IsNaN:
  case ES_OP_IsInf:
    return ES_DTYPE_BOOL;
  case ES_OP_Sum:
  case ES_OP_Mean:
  case ES_OP_Mod:
  case ES_OP_BitShift:
  case ES_OP_Sin:
  case ES_OP_Cos:
  case ES_OP_Tan:
  case ES_OP_Asin:
  case ES_OP_Acos:
  case ES_OP_Atan:
  case ES_OP_Sinh:
  case ES_OP_Cosh:
  case ES_OP_Asinh:
  case ES_OP_Acosh:
  case ES_OP_Atanh:
  case ES_OP_Identity:
  case ES_OP_Dropout:
    return x;
  case ES_OP_Where:
    return ES_DTYPE_UNDEFINED; /* input 1's */
  default:
    return ew_opdef_of(nd->op) ? x : ES_DTYPE_UNDEFINED;
  }
}

int es__fuse_elementwise(fuser *f) {
  es_graph *g = f->g;
  int *owner = es_mem_alloc(ES_MEM_MODEL, ((size_t)g->n_nodes + 1) * sizeof *owner);
  int *reads = es_mem_calloc(ES_MEM_MODEL, (size_t)g->n_values + 1, sizeof *reads);
  ew_prog *prog = es_mem_alloc(ES_MEM_MODEL, sizeof *prog);
  int rc = 0, fused = 0;
  if (!owner || !reads || !prog)
    rc = es__fail(ES_ENOMEM, "out of memory fusing elementwise chains");
  for (int i = 0; rc == 0 && i < g->n_nodes; i++) {
    owner[i] = -1;
    for (int k = 0; k < g->nodes[i].n_in; k++)
      if (g->nodes[i].in[k] >= 0)
        reads[g->nodes[i].in[k]]++;
  }
  /* Sinks from the last node back: a node whose output leaves every group
   * is the end of its own. Groups are disjoint and rewritten in place; the
   * graph is compacted once at the end. */
  for (int n = g->n_nodes - 1; rc == 0 && n >= 0; n--) {
    if (owner[n] >= 0 || !ew_eligible(f, &g->nodes[n]))
      continue;
    ew_group gr = {.sink = n, .n = 1, .nodes = {n}};
    ew_grow(f, &gr, owner, reads);
    if (gr.n < 2 || !ew_program(f, &gr, prog))
      continue;
    for (int i = 0; i < gr.n; i++)
      owner[gr.nodes[i]] = n;
    rc = ew_rewrite(f, &gr, prog);
    fused++;
  }
  if (rc == 0 && fused)
    rc = es__fz_nodes_compact(f);
  es_mem_free(owner);
  es_mem_free(reads);
  es_mem_free(prog);
  return rc;
}
