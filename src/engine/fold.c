/* Load-time graph optimisation: constant folding, and BatchNormalization
 * merged into the convolution before it.
 *
 * Both passes run once per model, after es__onnx_load_keep has sorted and
 * pruned the graph and before the engine checks it (es__graph_check) and
 * seals it (es__graph_seal). Every constant still sits in a
 * writable staging block of its own (graph.h), so a pass may add constants
 * and stop reading others; sealing then copies only what runs into the
 * read-only weight region. Doing this at load instead of in the planner
 * saves repeating it in every plan (one per input shape), and the results
 * live once in the shared region instead of once per plan.
 *
 * Constant folding. One sweep in topological order: a node whose inputs are
 * all constants (initializers, Constant nodes, outputs of nodes folded
 * earlier in the sweep) is evaluated with its kernel (es__kernel_eval);
 * its outputs become constants and the node goes. So is the Shape (or Size)
 * of a graph input whose every dimension the model fixes (a plan must give
 * that shape), and with it the chain it starts (Shape -> Gather -> Concat).
 * A chain that starts from another shape waits for the planner, which
 * knows it. A node the loader marked (an operator the engine does not
 * run) or without a kernel stays, and the check after folding lists it,
 * while the constants around it still fold: the list holds only what
 * would have to run. A kernel that cannot evaluate a node (ES_ENOTSUP)
 * leaves it in place for the planner; any other failure is the model's and
 * fails the load, naming the node. Nodes only folded nodes read go at the
 * end (es__graph_prune).
 *
 * BatchNormalization into Conv. Inference BatchNormalization is a
 * per-channel affine map y = a * x + b with a = scale / sqrt(var + epsilon)
 * and b = B - mean * a. Applied to output channel oc of a convolution it is
 * the same convolution with that channel's filter scaled by a[oc] and bias
 * (Bconv[oc] - mean[oc]) * a[oc] + B[oc]. Legal only when:
 *   - the convolution's output feeds this node alone (one use, not a graph
 *     output): anything else reading it would see the scaled values;
 *   - the convolution's W (and B, if it has one) and the four
 *     BatchNormalization parameters are float32 constants, the parameters
 *     (and B) of shape [M] for the convolution's M output channels;
 *   - the BatchNormalization is the inference form (one output,
 *     training_mode 0, spatial 1, epsilon finite and >= 0) and every a is
 *     finite (a zero variance with zero epsilon is left to the kernel).
 * Conv's W is [M, C/group, k...], so channel oc scales W[oc]. ConvTranspose's
 * is [C, M/group, k...]: channel g * M/group + j scales W[c, j] for each
 * input channel c of group g. a is computed in double and every product is
 * rounded once to float. W' and B' are new constants (W may be shared with
 * another node); the old ones are dropped at sealing when nothing else reads
 * them. The convolution takes over the BatchNormalization's output value, so
 * its consumers and graph outputs see the same name. */
#include "common/internal.h"
#include "engine/engine_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ==========================================================================
 * Graph edits
 * ======================================================================== */


/* Drops the nodes marked in gone, keeping the order (still topological). */
static void nodes_remove(es_graph *g, const unsigned char *gone) {
  int kept = 0;
  for (int i = 0; i < g->n_nodes; i++)
    if (!gone[i])
      g->nodes[kept++] = g->nodes[i];
  g->n_nodes = kept;
  es__graph_reindex(g);
}

/* ==========================================================================
 * Pass 1: constant folding
 * ======================================================================== */

/* Per-node argument arrays, sized once for the widest node. */
typedef struct fold_args {
  es_tdesc *desc;
  const es_tdesc **in_desc;
  const void **in_data;
  es_tdesc *out_desc;
  void **out_data;
} fold_args;

static int inputs_constant(const es_graph *g, const es_node *nd) {
  for (int k = 0; k < nd->n_in; k++)
    if (nd->in[k] >= 0 && g->values[nd->in[k]].kind != ES_VALUE_CONST)
      return 0;
  return 1;
}

/* Shape or Size of a graph input whose shape the model fixes: es_model_plan
 * refuses any other shape for it, so the answer is known now. */
static int shape_of_fixed_input(const es_graph *g, const es_node *nd) {
  if ((nd->op != ES_OP_Shape && nd->op != ES_OP_Size) || nd->n_in != 1 || nd->in[0] < 0)
    return 0;
  const es_value *x = &g->values[nd->in[0]];
  if (x->kind != ES_VALUE_INPUT || x->rank < 0 || es_dtype_size(x->dtype) == 0)
    return 0;
  for (int d = 0; d < x->rank; d++)
    if (x->dims[d] < 0)
      return 0;
  return 1;
}

/* The failure of a fold, naming the node: kernel errors (ES_KFAIL) already
 * start with its label, es__kernel_eval's own (out of memory) do not. */
static int fold_fail(const es_node *nd, int rc) {
  char label[120]; /* the size es_kinst uses, so the labels compare equal */
  es__node_label(nd, label, sizeof label);
  const char *detail = es_last_error_detail();
  if (strstr(detail, label))
    return rc;
  char copy[400];
  snprintf(copy, sizeof copy, "%s", detail);
  return es__fail(rc, "%s: evaluating it at load failed: %s", label, copy);
}

/* Evaluates nd; on success its outputs are staged constants. */
static int fold_node(es_graph *g, const es_node *nd, fold_args *a) {
  for (int k = 0; k < nd->n_in; k++) {
    int v = nd->in[k];
    a->in_desc[k] = NULL;
    a->in_data[k] = NULL;
    if (v < 0)
      continue;
    const es_value *val = &g->values[v];
    int rc = es__tdesc_set(&a->desc[k], val->dtype, val->rank, val->dims);
    if (rc < 0)
      return rc;
    a->in_desc[k] = &a->desc[k];
    a->in_data[k] = val->data;
  }
  es_knode kn = es__knode_of(nd);
  int rc = es__kernel_eval(&kn, g->opset, nd->n_in, a->in_desc, a->in_data, nd->n_out, a->out_desc,
                           a->out_data);
  if (rc < 0)
    return rc;
  for (int o = 0; o < nd->n_out; o++)
    if (nd->out[o] >= 0 && a->out_desc[o].dtype == ES_DTYPE_UNDEFINED) {
      for (int i = 0; i < nd->n_out; i++)
        es_mem_free(a->out_data[i]);
      char label[120];
      return es__fail(ES_ECORRUPT, "%s: kernel left output %d without a type",
                      es__node_label(nd, label, sizeof label), o);
    }
  for (int o = 0; o < nd->n_out; o++) {
    int v = nd->out[o];
    if (v < 0) {
      es_mem_free(a->out_data[o]);
      continue;
    }
    const es_tdesc *d = &a->out_desc[o];
    es_value *val = &g->values[v];
    val->kind = ES_VALUE_CONST;
    val->producer = -1;
    val->dtype = d->dtype;
    val->rank = d->rank;
    memcpy(val->dims, d->dims, sizeof val->dims);
    val->data = a->out_data[o]; /* es__kernel_eval's block, now staging */
    val->nbytes = d->nbytes;
  }
  return 0;
}

static int fold_constants(es_graph *g, unsigned char *gone) {
  int max_in = 1, max_out = 1;
  for (int n = 0; n < g->n_nodes; n++) {
    if (g->nodes[n].n_in > max_in)
      max_in = g->nodes[n].n_in;
    if (g->nodes[n].n_out > max_out)
      max_out = g->nodes[n].n_out;
  }
  fold_args a = {
      .desc = es_mem_calloc(ES_MEM_MODEL, (size_t)max_in, sizeof *a.desc),
      .in_desc = es_mem_calloc(ES_MEM_MODEL, (size_t)max_in, sizeof *a.in_desc),
      .in_data = es_mem_calloc(ES_MEM_MODEL, (size_t)max_in, sizeof *a.in_data),
      .out_desc = es_mem_calloc(ES_MEM_MODEL, (size_t)max_out, sizeof *a.out_desc),
      .out_data = es_mem_calloc(ES_MEM_MODEL, (size_t)max_out, sizeof *a.out_data),
  };
  int rc = 0;
  if (!a.desc || !a.in_desc || !a.in_data || !a.out_desc || !a.out_data)
    rc = es__fail(ES_ENOMEM, "out of memory folding constants");
  for (int n = 0; rc == 0 && n < g->n_nodes; n++) {
    const es_node *nd = &g->nodes[n];
    if (nd->unsup || !es__kernel_for(nd->op) ||
        (!inputs_constant(g, nd) && !shape_of_fixed_input(g, nd)))
      continue;
    rc = fold_node(g, nd, &a);
    if (rc == ES_ENOTSUP) {
      rc = 0; /* the planner meets it again and says so if it matters */
      continue;
    }
    if (rc < 0) {
      rc = fold_fail(nd, rc);
      break;
    }
    gone[n] = 1;
    g->folded_nodes++;
  }
  es_mem_free(a.desc);
  es_mem_free(a.in_desc);
  es_mem_free(a.in_data);
  es_mem_free(a.out_desc);
  es_mem_free(a.out_data);
  return rc;
}

/* ==========================================================================
 * Pass 2: BatchNormalization into Conv / ConvTranspose
 * ======================================================================== */

/* A BatchNormalization that may merge into the convolution before it. */
typedef struct bn_match {
  es_node *conv;
  int w, b;                    /* the convolution's W and B (-1: none) */
  int scale, bias, mean, var;  /* the BatchNormalization's parameters */
  int64_t m;                   /* output channels */
  int64_t group;
  double eps;
} bn_match;

static int const_f32(const es_graph *g, int v) {
  return v >= 0 && g->values[v].kind == ES_VALUE_CONST && g->values[v].dtype == ES_DTYPE_FLOAT;
}

static int const_f32_vec(const es_graph *g, int v, int64_t m) {
  return const_f32(g, v) && g->values[v].rank == 1 && g->values[v].dims[0] == m;
}

/* 1 when the attribute is absent or an int equal to want. */
static int attr_int_is(const es_node *n, const char *name, int64_t want) {
  const es_attr *a = es__node_attr(n, name);
  return !a || (a->type == ES_ATTR_INT && a->i == want);
}

/* Checks every legality condition of the design note; fills m. Anything the
 * kernels would reject (a bad attribute type, shapes that disagree) is not
 * folded, so the planner reports it as it would have. */
static int bn_match_find(es_graph *g, const es_node *bn, bn_match *m) {
  if (bn->n_in != 5 || bn->n_out != 1 || bn->out[0] < 0)
    return 0;
  if (!attr_int_is(bn, "training_mode", 0) || !attr_int_is(bn, "spatial", 1))
    return 0;
  const es_attr *ea = es__node_attr(bn, "epsilon");
  if (ea && ea->type != ES_ATTR_FLOAT)
    return 0;
  m->eps = ea ? (double)ea->f : (double)1e-5f; /* the kernel's default, as a float */
  if (!(m->eps >= 0) || isinf(m->eps))
    return 0;
  int x = bn->in[0];
  if (x < 0 || g->values[x].producer < 0 || g->values[x].uses != 1 || g->values[x].is_output)
    return 0;
  es_node *conv = &g->nodes[g->values[x].producer];
  if (conv->op != ES_OP_Conv && conv->op != ES_OP_ConvTranspose)
    return 0;
  if (conv->n_out != 1 || conv->out[0] != x || conv->n_in < 2 || conv->n_in > 3)
    return 0;
  const es_attr *ga = es__node_attr(conv, "group");
  if (ga && ga->type != ES_ATTR_INT)
    return 0;
  m->group = ga ? ga->i : 1;
  m->w = conv->in[1];
  m->b = conv->n_in > 2 ? conv->in[2] : -1;
  if (m->group < 1 || !const_f32(g, m->w) || g->values[m->w].rank < 3)
    return 0;
  const es_value *w = &g->values[m->w];
  for (int i = 0; i < w->rank; i++)
    if (w->dims[i] < 1)
      return 0;
  if (conv->op == ES_OP_Conv) {
    m->m = w->dims[0];
  } else {
    if (w->dims[0] % m->group)
      return 0;
    m->m = w->dims[1] * m->group; /* group <= dims[0], so no overflow */
  }
  if (m->b >= 0 && !const_f32_vec(g, m->b, m->m))
    return 0;
  m->scale = bn->in[1];
  m->bias = bn->in[2];
  m->mean = bn->in[3];
  m->var = bn->in[4];
  if (!const_f32_vec(g, m->scale, m->m) || !const_f32_vec(g, m->bias, m->m) ||
      !const_f32_vec(g, m->mean, m->m) || !const_f32_vec(g, m->var, m->m))
    return 0;
  m->conv = conv;
  return 1;
}

/* W' = W * a along the output-channel axis of either layout. */
static void bn_scale_weights(const es_node *conv, const es_value *w, int64_t group,
                             const double *a, float *dst) {
  const float *src = w->data;
  int64_t ksz = 1;
  for (int i = 2; i < w->rank; i++)
    ksz *= w->dims[i];
  if (conv->op == ES_OP_Conv) {
    int64_t per = w->dims[1] * ksz; /* one output channel's filter */
    for (int64_t oc = 0; oc < w->dims[0]; oc++)
      for (int64_t i = 0; i < per; i++)
        dst[oc * per + i] = (float)((double)src[oc * per + i] * a[oc]);
    return;
  }
  int64_t c = w->dims[0], mg = w->dims[1], cpg = c / group;
  for (int64_t ci = 0; ci < c; ci++)
    for (int64_t j = 0; j < mg; j++) {
      double s = a[(ci / cpg) * mg + j];
      const float *sp = src + (ci * mg + j) * ksz;
      float *dp = dst + (ci * mg + j) * ksz;
      for (int64_t i = 0; i < ksz; i++)
        dp[i] = (float)((double)sp[i] * s);
    }
}

/* Rewrites the convolution of m to include bn. Returns 1 when merged, 0 when
 * some a is not finite (left alone), or an error. */
static int bn_merge(es_graph *g, const es_node *bn, const bn_match *m) {
  const float *scale = g->values[m->scale].data, *bias = g->values[m->bias].data;
  const float *mean = g->values[m->mean].data, *var = g->values[m->var].data;
  const float *bconv = m->b >= 0 ? g->values[m->b].data : NULL;
  char label[120];
  es__node_label(bn, label, sizeof label);
  double *a = es_mem_alloc(ES_MEM_MODEL, (size_t)m->m * sizeof *a);
  if (!a)
    return es__fail(ES_ENOMEM, "%s: out of memory merging it into its convolution", label);
  for (int64_t c = 0; c < m->m; c++) {
    a[c] = (double)scale[c] / sqrt((double)var[c] + m->eps);
    if (!isfinite(a[c])) {
      es_mem_free(a);
      return 0;
    }
  }
  const es_value *w = &g->values[m->w];
  float *wd = es_mem_alloc(ES_MEM_MODEL, w->nbytes);
  float *bd = es_mem_alloc(ES_MEM_MODEL, (size_t)m->m * sizeof *bd);
  int *in3 = m->conv->n_in < 3 ? es__ctx_alloc(&g->ctx, 3 * sizeof *in3) : m->conv->in;
  if (!wd || !bd || !in3) {
    es_mem_free(a);
    es_mem_free(wd);
    es_mem_free(bd);
    return es__fail(ES_ENOMEM, "%s: out of memory merging it into its convolution", label);
  }
  bn_scale_weights(m->conv, w, m->group, a, wd);
  for (int64_t c = 0; c < m->m; c++)
    bd[c] = (float)(((bconv ? (double)bconv[c] : 0.0) - (double)mean[c]) * a[c] + (double)bias[c]);
  es_mem_free(a);

  /* Names no ONNX identifier can take, as the loader's tensor attributes. */
  char nm[64];
  int wv, bv, rc;
  snprintf(nm, sizeof nm, "\x01" "bn:%d:W", bn->file_index);
  if ((rc = es__graph_const_append(g, nm, g->values[m->w].dtype, g->values[m->w].rank,
                                   g->values[m->w].dims, wd, g->values[m->w].nbytes, &wv)) < 0) {
    es_mem_free(bd);
    return rc;
  }
  snprintf(nm, sizeof nm, "\x01" "bn:%d:B", bn->file_index);
  if ((rc = es__graph_const_append(g, nm, ES_DTYPE_FLOAT, 1, &m->m, bd,
                                   (size_t)m->m * sizeof *bd, &bv)) < 0)
    return rc;

  es_node *conv = m->conv;
  in3[0] = conv->in[0];
  in3[1] = wv;
  in3[2] = bv;
  conv->in = in3;
  conv->n_in = 3;
  /* The convolution now produces the BatchNormalization's output; its old
   * output value is read by nothing. */
  conv->out[0] = bn->out[0];
  g->values[bn->out[0]].producer = (int)(conv - g->nodes);
  return 1;
}

static int fold_batchnorms(es_graph *g, unsigned char *gone) {
  for (int n = 0; n < g->n_nodes; n++) {
    const es_node *bn = &g->nodes[n];
    bn_match m;
    if (bn->op != ES_OP_BatchNormalization || !bn_match_find(g, bn, &m))
      continue;
    int rc = bn_merge(g, bn, &m);
    if (rc < 0)
      return rc;
    if (rc == 1) {
      gone[n] = 1;
      g->folded_bn++;
    }
  }
  return 0;
}

/* ==========================================================================
 * Entry point
 * ======================================================================== */

int es__graph_fold(es_graph *g) {
  if (g->weights)
    return es__fail(ES_ESTATE, "constants can only be folded before the weights are sealed");
  es__graph_reindex(g);
  unsigned char *gone = es_mem_calloc(ES_MEM_MODEL, (size_t)g->n_nodes + 1, 1);
  if (!gone)
    return es__fail(ES_ENOMEM, "out of memory folding %d nodes", g->n_nodes);
  /* BatchNormalization merging needs exact use counts, so the folded nodes
   * go before it looks. */
  int rc = fold_constants(g, gone);
  if (rc == 0) {
    nodes_remove(g, gone);
    memset(gone, 0, (size_t)g->n_nodes + 1);
    rc = fold_batchnorms(g, gone);
  }
  if (rc == 0)
    nodes_remove(g, gone);
  es_mem_free(gone);
  if (rc == 0)
    es__graph_prune(g); /* what only folded nodes read */
  return rc;
}
