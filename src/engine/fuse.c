/* Load-time fusion: fewer, fatter nodes, so a request makes fewer passes
 * over its activations.
 *
 * Runs once per model when the engine loads it, after es__graph_fold and
 * before es__graph_seal (constants are still staged and writable, graph.h). Every
 * rewrite below removes nodes whose intermediate results nothing else can
 * see: each intermediate value has exactly the consumers the pattern names
 * (usually one) and is not a graph output. The fused node takes over the
 * output value of the pattern's last node, so consumers and graph outputs
 * keep their names, and it goes into that node's slot: every input of the
 * pattern is computed before its last node, so the order stays topological.
 * Constants the rewrites stop reading are dropped by es__graph_seal. In
 * order:
 *
 *   1. Identities. Mul or Div by ones, Add or Sub of zeros (a constant that
 *      does not broadcast the other operand to a larger shape) are removed;
 *      PP-OCR writes Swish as x * Sigmoid(x * 1).
 *   1a. A Concat of one tensor with float32 zero constants (a channel
 *      padding, as TensorFlow-converted BlazeFace writes it) becomes a Pad:
 *      the zeros need no memory.
 *   1b. Zero padding: a constant-zero Pad of the spatial axes read only by
 *      a Conv, or by an AveragePool whose averages count the zeros, becomes
 *      that node's pads.
 *   2. Convolutions, in topological order:
 *      - a per-channel affine map y = s * x + t after a Conv or
 *        ConvTranspose (Mul, Add, Sub or Div by a scalar or per-channel
 *        constant, or an inference BatchNormalization) goes into its
 *        weights and bias, as fold.c does for BatchNormalization alone;
 *      - the same map before a Conv without padding (where the zeros the
 *        convolution pads with would not be mapped) goes into its weights
 *        and bias too: W' = W s, B' = B + sum(W t);
 *      - then the activations and the residual Add after a Conv become its
 *        post-ops (attributes "_post" and "_post_f", applied by conv.c after
 *        the bias, in order): Relu, Clip, HardSigmoid, Sigmoid, Swish
 *        (Mul(y, Sigmoid(y))), HardSwish (PP-OCR's Add 3, Clip 0..6, Mul,
 *        Div 6) and Add of a runtime tensor of exactly the conv's output
 *        shape (appended as input 3).
 *   2a. A MatMul by static 2-D weights [K, N] takes the Add of a constant
 *      bias over N that follows it (input 2, attribute "_bias"), then a
 *      GELU (a Gelu node, or its erf form as exporters spell it: Div by
 *      sqrt 2, Erf, Add 1, two Muls) and the activations and residual Add
 *      above as "_post" codes: a transformer's MLP becomes one oneDNN
 *      matmul with bias and GELU applied on the output tile (vit_b_16: 48
 *      nodes fewer, about 1 ms of 180 ms).
 *   2b. A Relu that alone reads an inference BatchNormalization (one the
 *      convolutions did not take: DenseNet's pre-activation) becomes its
 *      "_relu" attribute, applied by norm.c in the same pass.
 *   3. LayerNorm: PP-OCR's decomposition over the last axis (ReduceMean,
 *      Sub, Pow 2, ReduceMean, Add eps, Sqrt, Div, Mul gamma, Add beta)
 *      becomes one internal LayerNorm node (src/kernels/layernorm.c).
 *   4. Elementwise chains: what is left of Add, Sub, Mul, Div, Pow, Relu,
 *      Sigmoid, HardSigmoid, Clip and Sqrt, two-input Max and Min, PRelu,
 *      and the float math and activations (Exp, Log, Tanh, Erf, Gelu, the
 *      exponential units...; fuse_ew.c's table) over float32 is grouped into
 *      maximal groups with one output (every other value of a group is read
 *      only inside it, so a value may feed several of its nodes: PP-OCR's
 *      hard-swish reads x twice), two nodes or more, each becoming one
 *      FusedElementwise node running a register program (format in
 *      src/kernels/fused.h). Broadcasting composes, so evaluating every
 *      node of a group at the group's output index is exact; one-element
 *      constants become immediates.
 *
 * Shapes. Most of the models' activation shapes are only known once the
 * input shape is (det takes any image size), but fusing a residual Add is
 * only right when the other operand has exactly the conv's output shape:
 * with a broadcast the fused kernel would compute something else. So a
 * symbolic shape pass runs first: every dimension is either a number or a
 * symbol; a symbol is either a fresh unknown or an operation on another
 * dimension (the output extent of a sliding window with given kernel,
 * stride and pads, an upsampling, a sum...), interned so the same
 * operation on the same dimension is the same symbol. Two shapes are proven
 * equal when their ranks and dimensions are identical. A stride-1 "same"
 * window keeps its input's symbol, so the two branches of a residual block
 * meet with equal shapes whatever the image size. Anything the pass does
 * not understand gets fresh symbols (or an unknown rank), which only ever
 * blocks a fusion. The same pass tracks element types, which the loader
 * leaves unknown for activations: only float32 chains become programs.
 *
 * Files: this one holds the entry point, pass 1 and the helpers the passes
 * share (fuse.h); fuse_shapes.c the symbolic shapes, fuse_conv.c passes 2 to 2b,
 * fuse_layernorm.c pass 3, fuse_ew.c pass 4.
 *
 * es_engine_fusion_set(0) skips every pass (to compare fused and unfused
 * graphs on the same build; the CLI maps ES_FUSE=0 to it). */
#include "engine/fuse.h"

#include "common/internal.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

/* ==========================================================================
 * Shared helpers (fuse.h)
 * ======================================================================== */

void es__fz_shape_of(const fuser *f, int v, sshape *out) {
  out->rank = -1;
  out->dt = ES_DTYPE_UNDEFINED;
  if (v < 0)
    return;
  const es_value *val = &f->g->values[v];
  if (val->kind == ES_VALUE_CONST) {
    out->rank = val->rank;
    out->dt = val->dtype;
    memcpy(out->d, val->dims, sizeof out->d);
  } else if (v < f->n_shape) {
    *out = f->shape[v];
  }
}

int es__fz_shape_same(const sshape *a, const sshape *b) {
  if (a->rank < 0 || a->rank != b->rank)
    return 0;
  for (int i = 0; i < a->rank; i++)
    if (a->d[i] != b->d[i])
      return 0;
  return 1;
}

int es__fz_attr_int(const es_node *n, const char *name, int64_t def, int64_t *out) {
  const es_attr *a = es__node_attr(n, name);
  if (a && a->type != ES_ATTR_INT)
    return 0;
  *out = a ? a->i : def;
  return 1;
}

int es__fz_attr_float(const es_node *n, const char *name, float def, float *out) {
  const es_attr *a = es__node_attr(n, name);
  if (a && a->type != ES_ATTR_FLOAT)
    return 0;
  *out = a ? a->f : def;
  return 1;
}

/* Exactly len ints (def each when absent); 0 when malformed. */
int es__fz_attr_ints(const es_node *n, const char *name, int len, int64_t def, int64_t *out) {
  const es_attr *a = es__node_attr(n, name);
  if (!a) {
    for (int i = 0; i < len; i++)
      out[i] = def;
    return 1;
  }
  if (a->type != ES_ATTR_INTS || a->n != (size_t)len)
    return 0;
  memcpy(out, a->ints, (size_t)len * sizeof *out);
  return 1;
}

const char *es__fz_attr_str(const es_node *n, const char *name, const char *def) {
  const es_attr *a = es__node_attr(n, name);
  if (!a)
    return def;
  return a->type == ES_ATTR_STRING ? a->s : NULL;
}

int es__fz_is_const(const es_graph *g, int v) {
  return v >= 0 && g->values[v].kind == ES_VALUE_CONST && g->values[v].data;
}

int es__fz_const_f32(const es_graph *g, int v) {
  return es__fz_is_const(g, v) && g->values[v].dtype == ES_DTYPE_FLOAT;
}

size_t es__fz_const_count(const es_graph *g, int v) {
  const es_value *val = &g->values[v];
  size_t n = 1;
  for (int i = 0; i < val->rank; i++)
    n *= (size_t)val->dims[i];
  return n;
}

/* A constant 1-D int64/int32 tensor of at most max values into out. */
int es__fz_const_ints(const es_graph *g, int v, int max, int64_t *out, int *n) {
  if (!es__fz_is_const(g, v))
    return 0;
  const es_value *val = &g->values[v];
  if (val->rank != 1 || val->dims[0] > max)
    return 0;
  for (int64_t i = 0; i < val->dims[0]; i++) {
    if (val->dtype == ES_DTYPE_INT64)
      out[i] = ((const int64_t *)val->data)[i];
    else if (val->dtype == ES_DTYPE_INT32)
      out[i] = ((const int32_t *)val->data)[i];
    else
      return 0;
  }
  *n = (int)val->dims[0];
  return 1;
}

/* The single float of a one-element float32 constant. */
int es__fz_const_scalar(const es_graph *g, int v, float *out) {
  if (!es__fz_const_f32(g, v) || es__fz_const_count(g, v) != 1)
    return 0;
  *out = *(const float *)g->values[v].data;
  return 1;
}

/* Drops the nodes marked in f->gone, keeping the order, recounts uses and
 * rebuilds the readers. Once per pass: compacting after every rewrite made
 * a pass over a graph of n nodes cost n^2. */
int es__fz_nodes_compact(fuser *f) {
  es_graph *g = f->g;
  int kept = 0;
  for (int i = 0; i < g->n_nodes; i++)
    if (!f->gone[i])
      g->nodes[kept++] = g->nodes[i];
  memset(f->gone, 0, (size_t)g->n_nodes);
  g->n_nodes = kept;
  es__graph_reindex(g);
  return es__fz_index(f);
}

/* ---- readers ------------------------------------------------------------- */

/* Within a pass, rewrites leave the node array as it is: a node that goes is
 * marked in f->gone, a fused node takes the slot of one it replaces, and
 * es__fz_commit brings uses and producers up to date around the slots a
 * rewrite touched, as compacting would have (slots keep their order, so
 * "the first reader" means the same). The reader lists answer "who reads v"
 * without scanning the graph. */

static int reader_add(fuser *f, int v, int node) {
  if (f->n_ent == f->cap_ent) {
    int cap = f->cap_ent ? f->cap_ent * 2 : 256;
    int *nn = f->rd_node ? es_mem_realloc(f->rd_node, (size_t)cap * sizeof *nn)
                         : es_mem_alloc(ES_MEM_MODEL, (size_t)cap * sizeof *nn);
    if (!nn)
      return es__fail(ES_ENOMEM, "out of memory indexing the graph's readers");
    f->rd_node = nn;
    int *nx = f->rd_next ? es_mem_realloc(f->rd_next, (size_t)cap * sizeof *nx)
                         : es_mem_alloc(ES_MEM_MODEL, (size_t)cap * sizeof *nx);
    if (!nx)
      return es__fail(ES_ENOMEM, "out of memory indexing the graph's readers");
    f->rd_next = nx;
    f->cap_ent = cap;
  }
  f->rd_node[f->n_ent] = node;
  f->rd_next[f->n_ent] = f->rd_head[v];
  f->rd_head[v] = f->n_ent++;
  return 0;
}

int es__fz_index(fuser *f) {
  es_graph *g = f->g;
  es_mem_free(f->rd_head);
  f->rd_head = es_mem_alloc(ES_MEM_MODEL, ((size_t)g->n_values + 1) * sizeof *f->rd_head);
  f->n_rd = 0;
  f->n_ent = 0;
  if (!f->rd_head)
    return es__fail(ES_ENOMEM, "out of memory indexing the graph's readers");
  f->n_rd = g->n_values;
  memset(f->rd_head, 0xff, (size_t)g->n_values * sizeof *f->rd_head);
  /* Backwards, so each list comes out in slot order. */
  for (int i = g->n_nodes - 1; i >= 0; i--)
    for (int k = 0; k < g->nodes[i].n_in; k++) {
      int v = g->nodes[i].in[k];
      if (v >= 0 && v < f->n_rd) {
        int rc = reader_add(f, v, i);
        if (rc < 0)
          return rc;
      }
    }
  return 0;
}

void es__fz_index_free(fuser *f) {
  es_mem_free(f->rd_head);
  es_mem_free(f->rd_node);
  es_mem_free(f->rd_next);
  es_mem_free(f->log);
  f->rd_head = f->rd_node = f->rd_next = f->log = NULL;
  f->n_rd = f->n_ent = f->cap_ent = f->n_log = f->cap_log = 0;
}

static int log_put(fuser *f, int x) {
  if (f->n_log == f->cap_log) {
    int cap = f->cap_log ? f->cap_log * 2 : 256;
    int *l = f->log ? es_mem_realloc(f->log, (size_t)cap * sizeof *l)
                    : es_mem_alloc(ES_MEM_MODEL, (size_t)cap * sizeof *l);
    if (!l)
      return es__fail(ES_ENOMEM, "out of memory fusing nodes");
    f->log = l;
    f->cap_log = cap;
  }
  f->log[f->n_log++] = x;
  return 0;
}

/* Before a rewrite marks slot gone or changes it: records what it reads and
 * writes now, for es__fz_commit. Each slot once per rewrite. */
int es__fz_touch(fuser *f, int slot) {
  const es_node *nd = &f->g->nodes[slot];
  int rc = log_put(f, slot);
  if (rc == 0)
    rc = log_put(f, nd->n_in);
  if (rc == 0)
    rc = log_put(f, nd->n_out);
  for (int k = 0; rc == 0 && k < nd->n_in; k++)
    rc = log_put(f, nd->in[k]);
  for (int o = 0; rc == 0 && o < nd->n_out; o++)
    rc = log_put(f, nd->out[o]);
  return rc;
}

/* After a rewrite: brings uses and producers up to date for the touched
 * slots, as es__graph_reindex would after compacting. Only touched slots
 * changed, so each value's uses move by the reads the touched slots gave up
 * and the reads the live ones make now; the values they wrote lose their
 * producer and the live ones' outputs get theirs. O(touched inputs and
 * outputs), whatever else reads those values. */
int es__fz_commit(fuser *f) {
  es_graph *g = f->g;
  int rc = 0;
  for (int at = 0; at < f->n_log;) { /* what they read and wrote before */
    int slot = f->log[at], nin = f->log[at + 1], nout = f->log[at + 2];
    const int *in = &f->log[at + 3], *out = in + nin;
    for (int k = 0; k < nin; k++)
      if (in[k] >= 0)
        g->values[in[k]].uses--;
    for (int o = 0; o < nout; o++)
      if (out[o] >= 0 && g->values[out[o]].producer == slot)
        g->values[out[o]].producer = -1;
    at += 3 + nin + nout;
  }
  for (int at = 0; at < f->n_log;) { /* what the live ones read and write now */
    int slot = f->log[at], nin = f->log[at + 1], nout = f->log[at + 2];
    at += 3 + nin + nout;
    if (f->gone[slot])
      continue;
    const es_node *nd = &g->nodes[slot];
    for (int k = 0; k < nd->n_in; k++) {
      int v = nd->in[k];
      if (v < 0)
        continue;
      g->values[v].uses++;
      if (rc == 0 && v < f->n_rd)
        rc = reader_add(f, v, slot);
    }
    for (int o = 0; o < nd->n_out; o++)
      if (nd->out[o] >= 0)
        g->values[nd->out[o]].producer = slot;
  }
  f->n_log = 0;
  return rc;
}

/* v is an intermediate a pattern may swallow: produced by a node, read by
 * exactly uses node inputs, not a graph output. */
int es__fz_inner(const es_graph *g, int v, int uses) {
  return v >= 0 && g->values[v].kind == ES_VALUE_ACT && g->values[v].producer >= 0 &&
         !g->values[v].is_output && g->values[v].uses == uses;
}

/* The first nodes (up to max) reading v, in order, each once. Entries of
 * nodes that went or read v no more are dropped on the way, so a list is
 * scanned past each dead entry once. */
int es__fz_consumers(fuser *f, int v, int *out, int max) {
  const es_graph *g = f->g;
  int n = 0;
  if (v < 0 || v >= f->n_rd)
    return 0;
  for (int *at = &f->rd_head[v]; *at >= 0;) {
    int e = *at, node = f->rd_node[e], reads = 0;
    for (int k = 0; !f->gone[node] && k < g->nodes[node].n_in && !reads; k++)
      reads = g->nodes[node].in[k] == v;
    if (!reads) {
      *at = f->rd_next[e]; /* unlinked; the pool slot is not reused */
      continue;
    }
    at = &f->rd_next[e];
    /* Insert in order among the smallest max slots, once. */
    int pos = n;
    while (pos > 0 && out[pos - 1] > node)
      pos--;
    if ((pos > 0 && out[pos - 1] == node) || pos == max)
      continue;
    if (n == max)
      n--;
    memmove(out + pos + 1, out + pos, (size_t)(n - pos) * sizeof *out);
    out[pos] = node;
    n++;
  }
  return n;
}

/* The one node reading v (which has one use), or -1. */
int es__fz_consumer(fuser *f, int v) {
  int c;
  return es__fz_consumers(f, v, &c, 1) == 1 ? c : -1;
}

/* For a binary node reading v: the other operand. */
int es__fz_other_input(const es_node *nd, int v) {
  if (nd->n_in != 2 || nd->n_out != 1)
    return -1;
  return nd->in[0] == v ? nd->in[1] : nd->in[1] == v ? nd->in[0] : -1;
}

/* Node nd (n_in inputs in, attributes plus extra) with arrays in the
 * graph's context. */
es_attr *es__fz_attrs_extend(es_graph *g, const es_node *nd, int extra) {
  es_attr *a = es__ctx_alloc(&g->ctx, (size_t)(nd->n_attr + extra) * sizeof *a);
  if (a && nd->n_attr)
    memcpy(a, nd->attrs, (size_t)nd->n_attr * sizeof *a);
  return a;
}

/* Constant c broadcast against x yields x's shape unchanged. */
int es__fz_const_fits(const fuser *f, int c, int x) {
  sshape xs;
  es__fz_shape_of(f, x, &xs);
  const es_value *cv = &f->g->values[c];
  if (cv->rank == 0)
    return 1;
  if (xs.rank < cv->rank)
    return 0;
  for (int i = 0; i < cv->rank; i++) {
    int64_t dc = cv->dims[i], dx = xs.d[xs.rank - cv->rank + i];
    if (dc != 1 && dc != dx)
      return 0;
  }
  return 1;
}

/* Clip's bounds, attribute (opset < 11) or constant input form; an absent
 * bound is -big / big (conv.c's post-op wants finite bounds, the program
 * infinite ones, as the Clip kernel). Bounds that are NaN or cross (ONNX
 * then gives hi everywhere, a clamp need not) are refused. */
int es__fz_clip_bounds(const es_graph *g, const es_node *nd, float big, float *lo, float *hi) {
  *lo = -big;
  *hi = big;
  if (g->opset < 11) {
    if (nd->n_in != 1 || !es__fz_attr_float(nd, "min", -big, lo) ||
        !es__fz_attr_float(nd, "max", big, hi))
      return 0;
  } else {
    if (nd->n_in > 3)
      return 0;
    for (int k = 1; k < nd->n_in; k++)
      if (nd->in[k] >= 0 && !es__fz_const_scalar(g, nd->in[k], k == 1 ? lo : hi))
        return 0;
  }
  return *lo <= *hi;
}

/* ==========================================================================
 * Pass 1: identities
 * ======================================================================== */

static int const_all(const es_graph *g, int c, float want) {
  if (!es__fz_const_f32(g, c))
    return 0;
  const float *d = g->values[c].data;
  size_t n = es__fz_const_count(g, c);
  for (size_t i = 0; i < n; i++)
    if (d[i] != want)
      return 0;
  return 1;
}

/* The runtime operand that nd passes through unchanged, or -1. */
static int identity_input(const fuser *f, const es_node *nd) {
  const es_graph *g = f->g;
  if (nd->n_in != 2 || nd->n_out != 1 || nd->out[0] < 0)
    return -1;
  int a = nd->in[0], b = nd->in[1];
  if (a < 0 || b < 0)
    return -1;
  switch (nd->op) {
  case ES_OP_Mul:
    if (const_all(g, b, 1.0f) && es__fz_const_fits(f, b, a))
      return a;
    if (const_all(g, a, 1.0f) && es__fz_const_fits(f, a, b))
      return b;
    return -1;
  case ES_OP_Add:
    if (const_all(g, b, 0.0f) && es__fz_const_fits(f, b, a))
      return a;
    if (const_all(g, a, 0.0f) && es__fz_const_fits(f, a, b))
      return b;
    return -1;
  case ES_OP_Div:
    return const_all(g, b, 1.0f) && es__fz_const_fits(f, b, a) ? a : -1;
  case ES_OP_Sub:
    return const_all(g, b, 0.0f) && es__fz_const_fits(f, b, a) ? a : -1;
  default:
    return -1;
  }
}

int es__fuse_identities(fuser *f) {
  es_graph *g = f->g;
  int removed = 0;
  for (int n = 0; n < g->n_nodes; n++) {
    const es_node *nd = &g->nodes[n];
    int x = identity_input(f, nd), y = nd->out[0];
    if (x < 0 || g->values[y].is_output || es__fz_is_const(g, x))
      continue;
    /* y's readers are still those the pass started with: a reader is only
     * ever rewired to a value made before an earlier identity node, and y
     * is made later. */
    for (int e = y < f->n_rd ? f->rd_head[y] : -1; e >= 0; e = f->rd_next[e]) {
      es_node *r = &g->nodes[f->rd_node[e]];
      for (int k = 0; k < r->n_in; k++)
        if (r->in[k] == y)
          r->in[k] = x;
    }
    f->gone[n] = 1;
    removed++;
  }
  return removed ? es__fz_nodes_compact(f) : 0;
}

/* ==========================================================================
 * Pass 1a: a Concat with zeros is a Pad
 * ======================================================================== */

static int attr_set(es_graph *g, es_node *nd, const char *name, const int64_t *v, int n);

/* Concat(Z1, x, Z2) along an axis, the Z constants of float32 zeros: what
 * TensorFlow-converted networks write for a channel padding (BlazeFace's
 * residual blocks widen their shortcut this way, 172 KB of zeros in the
 * front model, 30% of its weights). As Pad(x) with the Zs' extents as
 * pads, the zeros take no memory and the copy is the same. Only where
 * x's shape is proven to match the Zs' on every other axis (as Concat
 * requires: a mismatch must still fail as it would). */
static int zero_concat(fuser *f, int c) {
  es_graph *g = f->g;
  const es_node *nd = &g->nodes[c];
  if (nd->op != ES_OP_Concat || nd->n_out != 1 || nd->n_in < 2 || nd->n_guard)
    return 0;
  int x = -1, xi = -1;
  for (int i = 0; i < nd->n_in; i++) {
    int v = nd->in[i];
    if (v < 0)
      return 0;
    if (es__fz_is_const(g, v)) {
      if (!es__fz_const_f32(g, v))
        return 0;
      const float *d = g->values[v].data;
      for (size_t e = 0; e < es__fz_const_count(g, v); e++)
        if (d[e] != 0.0f || signbit(d[e]))
          return 0;
    } else if (x >= 0) {
      return 0; /* two runtime inputs: a real concat */
    } else {
      x = v, xi = i;
    }
  }
  sshape xs;
  es__fz_shape_of(f, x, &xs);
  int64_t axis;
  if (x < 0 || xs.rank < 1 || xs.dt != ES_DTYPE_FLOAT || !es__fz_attr_int(nd, "axis", 0, &axis) ||
      axis < -xs.rank || axis >= xs.rank)
    return 0;
  int a = (int)(axis < 0 ? axis + xs.rank : axis), r = xs.rank;
  int64_t *pads = es_mem_calloc(ES_MEM_MODEL, 2 * (size_t)r, sizeof *pads);
  if (!pads)
    return es__fail(ES_ENOMEM, "out of memory rewriting a Concat of zeros");
  for (int i = 0; i < nd->n_in; i++) {
    if (i == xi)
      continue;
    const es_value *z = &g->values[nd->in[i]];
    int ok = z->rank == r;
    for (int d = 0; ok && d < r; d++)
      ok = d == a || (xs.d[d] >= 0 && z->dims[d] == xs.d[d]);
    if (!ok) {
      es_mem_free(pads);
      return 0;
    }
    pads[(i < xi ? 0 : r) + a] += z->dims[a];
  }
  int pv, rc = es__fz_touch(f, c);
  int64_t pd = 2 * r;
  if (rc == 0)
    rc = es__graph_const_append(g, "", ES_DTYPE_INT64, 1, &pd, pads, 2 * (size_t)r * sizeof *pads,
                                &pv);
  else
    es_mem_free(pads);
  if (rc < 0)
    return rc;
  es_node pad = g->nodes[c];
  pad.op = ES_OP_Pad;
  pad.n_attr = 0;
  pad.attrs = NULL;
  if (g->opset < 11) { /* the attribute form: pads, mode constant, value 0 */
    pad.n_in = 1;
    pad.in = es__ctx_alloc(&g->ctx, sizeof *pad.in);
    if (pad.in)
      pad.in[0] = x;
    if (pad.in && (rc = attr_set(g, &pad, "pads", g->values[pv].data, (int)pd)) < 0)
      return rc;
  } else {
    pad.n_in = 2;
    pad.in = es__ctx_alloc(&g->ctx, 2 * sizeof *pad.in);
    if (pad.in)
      pad.in[0] = x, pad.in[1] = pv;
  }
  if (!pad.in)
    return es__fail(ES_ENOMEM, "out of memory rewriting a Concat of zeros");
  g->nodes[c] = pad;
  rc = es__fz_commit(f);
  return rc < 0 ? rc : 1;
}

int es__fuse_zero_concats(fuser *f) {
  int changed = 0;
  for (int c = 0; c < f->g->n_nodes; c++) {
    if (f->gone[c])
      continue;
    int rc = zero_concat(f, c);
    if (rc < 0)
      return rc;
    changed |= rc;
  }
  return changed ? es__fz_nodes_compact(f) : 0;
}

/* ==========================================================================
 * Pass 1b: zero padding into the window that reads it
 * ======================================================================== */

/* Pad's spatial pads (begin..., end... of the trailing rank - 2 axes) when
 * it is a zero constant pad of a rank-4 or rank-5 tensor that leaves N and C
 * alone; 0 otherwise. PyTorch exports avg_pool2d(padding=p,
 * count_include_pad=True) as Pad then AveragePool, and some exporters pad
 * before a Conv the same way: run as written, the Pad is one more pass over
 * the activations (and a layout conversion around it, as Pad is plain). */
static int zero_pad_of(const es_graph *g, const es_node *nd, int *rank, int64_t *sp) {
  if (nd->op != ES_OP_Pad || nd->n_out != 1 || nd->n_in < 1 || nd->in[0] < 0)
    return 0;
  const char *mode = es__fz_attr_str(nd, "mode", "constant");
  if (!mode || strcmp(mode, "constant"))
    return 0;
  int64_t pads[2 * ES_MAX_RANK];
  int n = 0;
  float value = 0.0f;
  if (g->opset < 11) {
    const es_attr *a = es__node_attr(nd, "pads");
    if (!a || a->type != ES_ATTR_INTS || a->n > 2 * ES_MAX_RANK ||
        !es__fz_attr_float(nd, "value", 0.0f, &value))
      return 0;
    n = (int)a->n;
    memcpy(pads, a->ints, (size_t)n * sizeof *pads);
  } else {
    if (nd->n_in < 2 || nd->n_in > 3 || nd->in[1] < 0 ||
        !es__fz_const_ints(g, nd->in[1], 2 * ES_MAX_RANK, pads, &n))
      return 0;
    if (nd->n_in == 3 && nd->in[2] >= 0 && !es__fz_const_scalar(g, nd->in[2], &value))
      return 0;
  }
  int r = n / 2;
  if (value != 0.0f || n % 2 || (r != 4 && r != 5))
    return 0;
  for (int i = 0; i < n; i++)
    if (pads[i] < 0 || pads[i] > ATTR_MAX)
      return 0;
  if (pads[0] || pads[1] || pads[r] || pads[r + 1])
    return 0;
  for (int i = 0; i < r - 2; i++) {
    sp[i] = pads[2 + i];
    sp[r - 2 + i] = pads[r + 2 + i];
  }
  *rank = r;
  return 1;
}

/* Sets attribute name of *nd (a copy whose arrays are in the graph's
 * context) to ints v[0..n) or, with n < 0, to the int v[0]. */
static int attr_set(es_graph *g, es_node *nd, const char *name, const int64_t *v, int n) {
  es_attr *attrs = es__fz_attrs_extend(g, nd, 1);
  int64_t *ints = n > 0 ? es__ctx_alloc(&g->ctx, (size_t)n * sizeof *ints) : NULL;
  char *nm = es__ctx_strdup(&g->ctx, name);
  if (!attrs || !nm || (n > 0 && !ints))
    return es__fail(ES_ENOMEM, "out of memory fusing a Pad");
  es_attr a = n >= 0 ? (es_attr){.name = nm, .type = ES_ATTR_INTS, .n = (size_t)n, .ints = ints}
                     : (es_attr){.name = nm, .type = ES_ATTR_INT, .i = v[0]};
  if (n > 0)
    memcpy(ints, v, (size_t)n * sizeof *ints);
  int at = nd->n_attr;
  for (int i = 0; i < nd->n_attr; i++)
    if (!strcmp(attrs[i].name, name))
      at = i;
  attrs[at] = a;
  nd->n_attr += at == nd->n_attr;
  nd->attrs = attrs;
  return 0;
}

/* Pad node p read only by node c: c with the padding added to its own, or 0
 * when c cannot take it. A Conv pads with zeros: its pads grow. An
 * AveragePool can when the zeros count in its averages as they did in the
 * padded tensor: count_include_pad 1 (then its own pads count too), or no
 * pads of its own; without ceil_mode, where a window may run past the
 * padding and the two would count differently. */
static int pad_into(fuser *f, int p, int c) {
  es_graph *g = f->g;
  int r;
  int64_t sp[2 * ES_MAX_RANK], own[2 * ES_MAX_RANK], inc, ceil_mode;
  if (!zero_pad_of(g, &g->nodes[p], &r, sp))
    return 0;
  const es_node *cn = &g->nodes[c];
  int ns = r - 2;
  if ((cn->op != ES_OP_Conv && cn->op != ES_OP_AveragePool) || cn->in[0] != g->nodes[p].out[0])
    return 0;
  const char *ap = es__fz_attr_str(cn, "auto_pad", "NOTSET");
  if (!ap || strcmp(ap, "NOTSET") || !es__fz_attr_ints(cn, "pads", 2 * ns, 0, own))
    return 0;
  int own_any = 0;
  for (int i = 0; i < 2 * ns; i++)
    own_any |= own[i] != 0;
  if (cn->op == ES_OP_AveragePool) {
    if (!es__fz_attr_int(cn, "count_include_pad", 0, &inc) ||
        !es__fz_attr_int(cn, "ceil_mode", 0, &ceil_mode) || ceil_mode || (own_any && !inc))
      return 0;
  }
  /* The window's rank must be the Pad's: kernel_shape (pools) or W. */
  const es_attr *ks = es__node_attr(cn, "kernel_shape");
  if (ks ? ks->n != (size_t)ns
         : (cn->op != ES_OP_Conv || cn->n_in < 2 || cn->in[1] < 0 ||
            g->values[cn->in[1]].rank != r))
    return 0;
  for (int i = 0; i < 2 * ns; i++)
    own[i] += sp[i];
  int rc = es__fz_touch(f, p);
  if (rc == 0)
    rc = es__fz_touch(f, c);
  if (rc < 0)
    return rc;
  es_node nd = *cn;
  int64_t one = 1;
  rc = attr_set(g, &nd, "pads", own, 2 * ns);
  if (rc == 0 && nd.op == ES_OP_AveragePool)
    rc = attr_set(g, &nd, "count_include_pad", &one, -1);
  int *in = es__ctx_alloc(&g->ctx, (size_t)nd.n_in * sizeof *in);
  if (rc == 0 && !in)
    rc = es__fail(ES_ENOMEM, "out of memory fusing a Pad");
  if (rc < 0)
    return rc;
  memcpy(in, nd.in, (size_t)nd.n_in * sizeof *in);
  in[0] = g->nodes[p].in[0];
  nd.in = in;
  g->nodes[c] = nd;
  f->gone[p] = 1;
  rc = es__fz_commit(f);
  return rc < 0 ? rc : 1;
}

int es__fuse_pads(fuser *f) {
  es_graph *g = f->g;
  int changed = 0;
  for (int p = 0; p < g->n_nodes; p++) {
    const es_node *nd = &g->nodes[p];
    if (f->gone[p] || nd->op != ES_OP_Pad || nd->n_out != 1 || nd->out[0] < 0 ||
        !es__fz_inner(g, nd->out[0], 1))
      continue;
    int c = es__fz_consumer(f, nd->out[0]);
    if (c < 0)
      continue;
    int rc = pad_into(f, p, c);
    if (rc < 0)
      return rc;
    changed |= rc;
  }
  return changed ? es__fz_nodes_compact(f) : 0;
}

/* ==========================================================================
 * Entry point
 * ======================================================================== */

void es__fuser_fini(fuser *f) {
  es_mem_free(f->gone);
  es_mem_free(f->shape);
  es_mem_free(f->syms);
  es_mem_free(f->sym_table);
  es__fz_index_free(f);
  f->gone = NULL;
  f->shape = NULL;
  f->syms = NULL;
  f->sym_table = NULL;
}

static _Atomic int fusion_on_ = 1;

void es_engine_fusion_set(int on) { atomic_store(&fusion_on_, on ? 1 : 0); }

int es__graph_fusion_enabled(void) { return atomic_load(&fusion_on_); }

int es__graph_fuse(es_graph *g) {
  if (g->weights)
    return es__fail(ES_ESTATE, "nodes can only be fused before the weights are sealed");
  if (!atomic_load(&fusion_on_))
    return 0;
  int lrc = es__graph_lower_lookups(g);
  if (lrc < 0)
    return lrc;
  es__graph_reindex(g);
  fuser f = {.g = g};
  f.gone = es_mem_calloc(ES_MEM_MODEL, (size_t)g->n_nodes + 1, 1);
  int rc = f.gone ? 0 : es__fail(ES_ENOMEM, "out of memory fusing %d nodes", g->n_nodes);
  if (rc == 0)
    rc = es__fz_index(&f);
  if (rc == 0)
    rc = es__fuse_shapes(&f);
  if (rc == 0)
    rc = es__fuse_identities(&f);
  if (rc == 0)
    rc = es__fuse_zero_concats(&f);
  if (rc == 0)
    rc = es__fuse_pads(&f);
  if (rc == 0)
    rc = es__fuse_convs(&f);
  if (rc == 0)
    rc = es__fuse_matmuls(&f);
  if (rc == 0)
    rc = es__fuse_bn_relu(&f);
  if (rc == 0)
    rc = es__fuse_layernorms(&f);
  if (rc == 0)
    rc = es__fuse_elementwise(&f);
  es__fuser_fini(&f);
  return rc;
}
