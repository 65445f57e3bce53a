/* Load-time fusion: fewer, fatter nodes, so a request makes fewer passes
 * over its activations.
 *
 * Runs once per model inside es_onnx_load, after es_graph_fold and before
 * es_graph_seal (constants are still staged and writable, graph.h). Every
 * rewrite below removes nodes whose intermediate results nothing else can
 * see: each intermediate value has exactly the consumers the pattern names
 * (usually one) and is not a graph output. The fused node takes over the
 * output value of the pattern's last node, so consumers and graph outputs
 * keep their names, and it goes into that node's slot: every input of the
 * pattern is computed before its last node, so the order stays topological.
 * Constants the rewrites stop reading are dropped by es_graph_seal. In
 * order:
 *
 *   1. Identities. Mul or Div by ones, Add or Sub of zeros (a constant that
 *      does not broadcast the other operand to a larger shape) are removed;
 *      PP-OCR writes Swish as x * Sigmoid(x * 1).
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
 *   3. LayerNorm: PP-OCR's decomposition over the last axis (ReduceMean,
 *      Sub, Pow 2, ReduceMean, Add eps, Sqrt, Div, Mul gamma, Add beta)
 *      becomes one internal LayerNorm node (src/kernels/layernorm.c).
 *   4. Elementwise chains: what is left of Add, Sub, Mul, Div, Pow, Relu,
 *      Sigmoid, HardSigmoid, Clip and Sqrt over float32 is grouped into
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
 * es_engine_fusion_set(0) skips every pass (to compare fused and unfused
 * graphs on the same build; the CLI maps ES_FUSE=0 to it). */
#include "common/internal.h"
#include "kernels/fused.h"
#include "engine/engine_internal.h"

#include <float.h>
#include <stdatomic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* ==========================================================================
 * Symbolic shapes
 * ======================================================================== */

/* A dimension: >= 0 a known extent, < 0 symbol number -1 - d. Known
 * extents stay below DIM_MAX and the attributes used in arithmetic below
 * ATTR_MAX (anything larger becomes a fresh symbol), so no computation on
 * them can overflow, whatever a hostile model says. */
#define DIM_MAX ((int64_t)1 << 40)
#define ATTR_MAX ((int64_t)1 << 20)

static int attr_small(int64_t v) { return v >= -ATTR_MAX && v <= ATTR_MAX; }
typedef struct sshape {
  int rank; /* -1: unknown */
  int64_t d[ES_MAX_RANK];
  es_dtype dt; /* ES_DTYPE_UNDEFINED: unknown */
} sshape;

typedef enum sym_kind {
  SYM_FRESH = 0,   /* unknown, equal only to itself */
  SYM_WINDOW = 1,  /* sliding window: a = input, p = {pb, pe, span, stride, ceil} */
  SYM_CEILDIV = 2, /* ceil(a / p0): SAME padding */
  SYM_DECONV = 3,  /* p0 * (a - 1) + p1: ConvTranspose */
  SYM_SCALE = 4,   /* floor(a * float bits p0): Resize */
  SYM_SUM = 5,     /* a + p0: Concat */
} sym_kind;

typedef struct sym {
  sym_kind kind;
  int64_t a, p[5];
} sym;

typedef struct fuser {
  es_graph *g;
  sshape *shape;       /* per value, for the values that existed at the start */
  int n_shape;
  sym *syms;
  int n_syms, cap_syms;
  int oom;             /* a symbol could not be stored: every later one is fresh */
  int64_t n_unstored;  /* symbols handed out since */
  unsigned char *gone; /* per node: removed by the rewrite in progress */
} fuser;

static int64_t sym_get(fuser *f, sym_kind kind, int64_t a, int64_t p0, int64_t p1, int64_t p2,
                       int64_t p3, int64_t p4) {
  sym s;
  memset(&s, 0, sizeof s); /* padding too: symbols compare with memcmp */
  s.kind = kind;
  s.a = a;
  s.p[0] = p0, s.p[1] = p1, s.p[2] = p2, s.p[3] = p3, s.p[4] = p4;
  if (kind != SYM_FRESH)
    for (int i = 0; i < f->n_syms; i++)
      if (!memcmp(&f->syms[i], &s, sizeof s))
        return -1 - (int64_t)i;
  if (f->n_syms == f->cap_syms) {
    int cap = f->cap_syms ? f->cap_syms * 2 : 256;
    sym *ns = f->oom ? NULL : es_mem_realloc(f->syms, (size_t)cap * sizeof *ns);
    if (!ns) {
      /* A symbol that is not stored can never be found again, so it equals
       * nothing: the safe answer. Numbers from 2^40 on are free. */
      f->oom = 1;
      return -1 - ((int64_t)1 << 40) - (f->n_unstored++);
    }
    f->syms = ns;
    f->cap_syms = cap;
  }
  f->syms[f->n_syms] = s;
  return -1 - (int64_t)(f->n_syms++);
}

static int64_t sym_fresh(fuser *f) { return sym_get(f, SYM_FRESH, 0, 0, 0, 0, 0, 0); }

static void shape_of(const fuser *f, int v, sshape *out) {
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

static void shape_fresh(fuser *f, sshape *s, int rank) {
  s->rank = rank;
  for (int i = 0; i < rank && i < ES_MAX_RANK; i++)
    s->d[i] = sym_fresh(f);
}

static int shape_same(const sshape *a, const sshape *b) {
  if (a->rank < 0 || a->rank != b->rank)
    return 0;
  for (int i = 0; i < a->rank; i++)
    if (a->d[i] != b->d[i])
      return 0;
  return 1;
}

/* ---- reading attributes and constants ----------------------------------- */

static int attr_int(const es_node *n, const char *name, int64_t def, int64_t *out) {
  const es_attr *a = es_node_attr(n, name);
  if (a && a->type != ES_ATTR_INT)
    return 0;
  *out = a ? a->i : def;
  return 1;
}

static int attr_float(const es_node *n, const char *name, float def, float *out) {
  const es_attr *a = es_node_attr(n, name);
  if (a && a->type != ES_ATTR_FLOAT)
    return 0;
  *out = a ? a->f : def;
  return 1;
}

/* Exactly len ints (def each when absent); 0 when malformed. */
static int attr_ints(const es_node *n, const char *name, int len, int64_t def, int64_t *out) {
  const es_attr *a = es_node_attr(n, name);
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

static const char *attr_str(const es_node *n, const char *name, const char *def) {
  const es_attr *a = es_node_attr(n, name);
  if (!a)
    return def;
  return a->type == ES_ATTR_STRING ? a->s : NULL;
}

static int is_const(const es_graph *g, int v) {
  return v >= 0 && g->values[v].kind == ES_VALUE_CONST && g->values[v].data;
}

static int const_f32(const es_graph *g, int v) {
  return is_const(g, v) && g->values[v].dtype == ES_DTYPE_FLOAT;
}

static size_t const_count(const es_graph *g, int v) {
  const es_value *val = &g->values[v];
  size_t n = 1;
  for (int i = 0; i < val->rank; i++)
    n *= (size_t)val->dims[i];
  return n;
}

/* A constant 1-D int64/int32 tensor of at most max values into out. */
static int const_ints(const es_graph *g, int v, int max, int64_t *out, int *n) {
  if (!is_const(g, v))
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
static int const_scalar(const es_graph *g, int v, float *out) {
  if (!const_f32(g, v) || const_count(g, v) != 1)
    return 0;
  *out = *(const float *)g->values[v].data;
  return 1;
}

/* ---- per-operator shape rules ---------------------------------------------- */

static void shape_broadcast(fuser *f, const sshape *a, const sshape *b, sshape *o) {
  if (a->rank < 0 || b->rank < 0) {
    o->rank = -1;
    return;
  }
  int r = a->rank > b->rank ? a->rank : b->rank;
  for (int i = 0; i < r; i++) {
    int ia = i - (r - a->rank), ib = i - (r - b->rank);
    int64_t da = ia >= 0 ? a->d[ia] : 1, db = ib >= 0 ? b->d[ib] : 1;
    if (da == db || db == 1)
      o->d[i] = da;
    else if (da == 1)
      o->d[i] = db;
    else if (da < 0 && db >= 0) /* the symbol must be 1 or db */
      o->d[i] = db;
    else if (db < 0 && da >= 0)
      o->d[i] = da;
    else
      o->d[i] = sym_fresh(f);
  }
  o->rank = r;
}

/* Output extent of a sliding window (Conv, pools) along one axis. */
static int64_t window_dim(fuser *f, int64_t in, int64_t pb, int64_t pe, int64_t span, int64_t s,
                          int ceil_mode) {
  if (!ceil_mode && s == 1 && pb + pe == span - 1)
    return in;
  if (in >= 0 && !ceil_mode) {
    int64_t room = in + pb + pe - span;
    return room < 0 ? sym_fresh(f) : room / s + 1;
  }
  return sym_get(f, SYM_WINDOW, in, pb, pe, span, s, ceil_mode);
}

static int64_t ceildiv_dim(fuser *f, int64_t in, int64_t s) {
  if (s == 1)
    return in;
  if (in >= 0)
    return (in + s - 1) / s;
  return sym_get(f, SYM_CEILDIV, in, s, 0, 0, 0, 0);
}

/* Conv and the pools: rank from X, channels from W (Conv) or X, spatial
 * extents from the window geometry. ker: the kernel extents (NULL: read
 * kernel_shape). */
static void shape_window(fuser *f, const es_node *nd, const sshape *x, int64_t channels,
                         const int64_t *ker, int pool, sshape *o) {
  int nsp = x->rank - 2;
  if (x->rank < 3 || x->rank > ES_MAX_RANK) {
    o->rank = -1;
    return;
  }
  int64_t k[ES_MAX_RANK], st[ES_MAX_RANK], dl[ES_MAX_RANK], pads[2 * ES_MAX_RANK], ceil_mode = 0;
  const char *ap = attr_str(nd, "auto_pad", "NOTSET");
  int ok = ap && attr_ints(nd, "strides", nsp, 1, st) && attr_ints(nd, "dilations", nsp, 1, dl) &&
           attr_ints(nd, "pads", 2 * nsp, 0, pads) &&
           (!pool || attr_int(nd, "ceil_mode", 0, &ceil_mode));
  if (ker)
    memcpy(k, ker, (size_t)nsp * sizeof *k);
  else
    ok = ok && es_node_attr(nd, "kernel_shape") && attr_ints(nd, "kernel_shape", nsp, 1, k);
  o->rank = x->rank;
  o->d[0] = x->d[0];
  o->d[1] = channels;
  for (int i = 0; i < nsp; i++) {
    int64_t in = x->d[2 + i];
    if (!ok || st[i] < 1 || dl[i] < 1 || k[i] < 1 || pads[i] < 0 || pads[nsp + i] < 0 ||
        st[i] > ATTR_MAX || dl[i] > ATTR_MAX || k[i] > ATTR_MAX || pads[i] > ATTR_MAX ||
        pads[nsp + i] > ATTR_MAX) {
      o->d[2 + i] = sym_fresh(f);
      continue;
    }
    int64_t span = (k[i] - 1) * dl[i] + 1;
    if (!strcmp(ap, "SAME_UPPER") || !strcmp(ap, "SAME_LOWER"))
      o->d[2 + i] = ceildiv_dim(f, in, st[i]);
    else if (!strcmp(ap, "VALID"))
      o->d[2 + i] = window_dim(f, in, 0, 0, span, st[i], 0);
    else if (!strcmp(ap, "NOTSET"))
      o->d[2 + i] = window_dim(f, in, pads[i], pads[nsp + i], span, st[i], (int)ceil_mode);
    else
      o->d[2 + i] = sym_fresh(f);
  }
}

static void shape_conv_transpose(fuser *f, const es_node *nd, const sshape *x, sshape *o) {
  const es_graph *g = f->g;
  int w = nd->n_in > 1 ? nd->in[1] : -1;
  int nsp = x->rank - 2;
  int64_t group;
  if (x->rank < 3 || !is_const(g, w) || g->values[w].rank != x->rank ||
      !attr_int(nd, "group", 1, &group) || group < 1 || g->values[w].dims[0] % group) {
    o->rank = -1;
    return;
  }
  const es_value *wv = &g->values[w];
  int64_t st[ES_MAX_RANK], dl[ES_MAX_RANK], op[ES_MAX_RANK], pads[2 * ES_MAX_RANK],
      os[ES_MAX_RANK];
  const char *ap = attr_str(nd, "auto_pad", "NOTSET");
  int ok = ap && attr_ints(nd, "strides", nsp, 1, st) && attr_ints(nd, "dilations", nsp, 1, dl) &&
           attr_ints(nd, "pads", 2 * nsp, 0, pads) &&
           attr_ints(nd, "output_padding", nsp, 0, op);
  int has_os = es_node_attr(nd, "output_shape") != NULL;
  ok = ok && (!has_os || attr_ints(nd, "output_shape", nsp, 0, os));
  o->rank = x->rank;
  o->d[0] = x->d[0];
  o->d[1] = wv->dims[1] * group;
  for (int i = 0; i < nsp; i++) {
    int sane = ok && st[i] >= 1 && dl[i] >= 1 && attr_small(st[i]) && attr_small(dl[i]) &&
               attr_small(op[i]) && attr_small(pads[i]) && attr_small(pads[nsp + i]) &&
               attr_small(wv->dims[2 + i]) && (!has_os || (os[i] >= 0 && os[i] < DIM_MAX));
    int64_t in = x->d[2 + i];
    if (!sane || strcmp(ap, "NOTSET")) {
      o->d[2 + i] = sym_fresh(f);
      continue;
    }
    int64_t span = (wv->dims[2 + i] - 1) * dl[i] + 1;
    int64_t c = op[i] + span - pads[i] - pads[nsp + i];
    if (has_os)
      o->d[2 + i] = os[i];
    else if (in >= 0)
      o->d[2 + i] = st[i] * (in - 1) + c >= 0 ? st[i] * (in - 1) + c : sym_fresh(f);
    else
      o->d[2 + i] = sym_get(f, SYM_DECONV, in, st[i], c, 0, 0, 0);
  }
}

static void shape_resize(fuser *f, const es_node *nd, const sshape *x, sshape *o) {
  const es_graph *g = f->g;
  int si = g->opset < 11 ? 1 : 2, zi = 3;
  *o = *x;
  if (x->rank < 0)
    return;
  int sc = si < nd->n_in && is_const(g, nd->in[si]) && const_count(g, nd->in[si]) > 0
               ? nd->in[si]
               : -1;
  int64_t sizes[ES_MAX_RANK];
  int n;
  if (sc >= 0 && const_f32(g, sc) && const_count(g, sc) == (size_t)x->rank) {
    const float *s = g->values[sc].data;
    for (int i = 0; i < x->rank; i++) {
      if (s[i] == 1.0f)
        continue;
      uint32_t bits;
      memcpy(&bits, &s[i], sizeof bits);
      double v = (double)x->d[i] * (double)s[i];
      o->d[i] = x->d[i] >= 0 && s[i] > 0 && v < (double)DIM_MAX
                    ? (int64_t)floor(v)
                    : sym_get(f, SYM_SCALE, x->d[i], bits, 0, 0, 0, 0);
    }
  } else if (sc < 0 && zi < nd->n_in && const_ints(g, nd->in[zi], ES_MAX_RANK, sizes, &n) &&
             n == x->rank) {
    for (int i = 0; i < n; i++)
      o->d[i] = sizes[i] >= 0 ? sizes[i] : sym_fresh(f);
  } else {
    shape_fresh(f, o, x->rank);
  }
}

static void shape_concat(fuser *f, const es_node *nd, sshape *o) {
  sshape s;
  int64_t axis;
  shape_of(f, nd->in[0], o);
  if (o->rank < 1 || !attr_int(nd, "axis", 0, &axis) || axis < -o->rank || axis >= o->rank) {
    o->rank = -1;
    return;
  }
  int ax = (int)(axis < 0 ? axis + o->rank : axis);
  for (int k = 1; k < nd->n_in; k++) {
    shape_of(f, nd->in[k], &s);
    if (s.rank != o->rank) {
      o->rank = -1;
      return;
    }
    for (int i = 0; i < o->rank; i++)
      if (i != ax && o->d[i] < 0 && s.d[i] >= 0)
        o->d[i] = s.d[i]; /* equal in any model that runs */
    int64_t a = o->d[ax], b = s.d[ax];
    if (a >= 0 && b >= 0)
      o->d[ax] = a + b;
    else if (a >= 0) /* keep the symbol first so a + b and b + a meet */
      o->d[ax] = sym_get(f, SYM_SUM, b, a, 0, 0, 0, 0);
    else
      o->d[ax] = sym_get(f, SYM_SUM, a, b, 0, 0, 0, 0);
  }
}

static void shape_matmul(fuser *f, const sshape *a, const sshape *b, sshape *o) {
  if (a->rank < 1 || b->rank < 1) {
    o->rank = -1;
    return;
  }
  sshape a2 = *a, b2 = *b, ba, bb, bo;
  if (a->rank == 1) { /* [K] -> [1, K] */
    a2.rank = 2;
    a2.d[1] = a->d[0];
    a2.d[0] = 1;
  }
  if (b->rank == 1) { /* [K] -> [K, 1] */
    b2.rank = 2;
    b2.d[0] = b->d[0];
    b2.d[1] = 1;
  }
  ba.rank = a2.rank - 2;
  bb.rank = b2.rank - 2;
  memcpy(ba.d, a2.d, sizeof ba.d);
  memcpy(bb.d, b2.d, sizeof bb.d);
  shape_broadcast(f, &ba, &bb, &bo);
  int r = bo.rank;
  if (r + 2 > ES_MAX_RANK) {
    o->rank = -1;
    return;
  }
  *o = bo;
  if (a->rank > 1)
    o->d[o->rank++] = a2.d[a2.rank - 2];
  if (b->rank > 1)
    o->d[o->rank++] = b2.d[b2.rank - 1];
}

static void shape_reshape(fuser *f, const es_node *nd, const sshape *x, sshape *o) {
  int64_t s[ES_MAX_RANK], allowzero;
  int n, infer = -1;
  if (nd->n_in < 2 || !const_ints(f->g, nd->in[1], ES_MAX_RANK, s, &n) ||
      !attr_int(nd, "allowzero", 0, &allowzero)) {
    o->rank = -1;
    return;
  }
  o->rank = n;
  for (int i = 0; i < n; i++) {
    if (s[i] > 0 || (s[i] == 0 && allowzero)) {
      o->d[i] = s[i];
    } else if (s[i] == 0) {
      o->d[i] = i < x->rank ? x->d[i] : sym_fresh(f);
    } else if (s[i] == -1 && infer < 0) {
      infer = i;
    } else { /* the kernel refuses it */
      shape_fresh(f, o, n);
      return;
    }
  }
  if (infer < 0)
    return;
  /* -1: the element count over the others', when all are numbers */
  int64_t total = 1, rest = 1;
  int known = x->rank >= 0;
  for (int i = 0; known && i < x->rank; i++)
    known = x->d[i] >= 0 && !__builtin_mul_overflow(total, x->d[i], &total);
  for (int i = 0; known && i < n; i++)
    if (i != infer)
      known = o->d[i] > 0 && !__builtin_mul_overflow(rest, o->d[i], &rest);
  o->d[infer] = known && total % rest == 0 ? total / rest : sym_fresh(f);
}

/* Axes of ReduceMean / Squeeze: from the attribute, or from input 1 (later
 * opsets). Returns the count, 0 for none, -1 when unreadable. */
static int node_axes(const fuser *f, const es_node *nd, int rank, int *mark) {
  int64_t ax[ES_MAX_RANK];
  int n = 0;
  const es_attr *a = es_node_attr(nd, "axes");
  if (a) {
    if (a->type != ES_ATTR_INTS || a->n > ES_MAX_RANK)
      return -1;
    n = (int)a->n;
    memcpy(ax, a->ints, (size_t)n * sizeof *ax);
  } else if (nd->n_in > 1 && nd->in[1] >= 0) {
    if (!const_ints(f->g, nd->in[1], ES_MAX_RANK, ax, &n))
      return -1;
  }
  memset(mark, 0, ES_MAX_RANK * sizeof *mark);
  for (int i = 0; i < n; i++) {
    if (ax[i] < -rank || ax[i] >= rank)
      return -1;
    mark[ax[i] < 0 ? ax[i] + rank : ax[i]] = 1;
  }
  return n;
}

static void shape_reduce(fuser *f, const es_node *nd, const sshape *x, sshape *o) {
  int mark[ES_MAX_RANK];
  int64_t keep, noop;
  int n = x->rank >= 0 ? node_axes(f, nd, x->rank, mark) : -1;
  if (n < 0 || !attr_int(nd, "keepdims", 1, &keep) ||
      !attr_int(nd, "noop_with_empty_axes", 0, &noop)) {
    o->rank = -1;
    return;
  }
  if (n == 0) {
    if (noop) {
      *o = *x;
      return;
    }
    for (int i = 0; i < x->rank; i++)
      mark[i] = 1;
  }
  o->rank = 0;
  for (int i = 0; i < x->rank; i++)
    if (!mark[i])
      o->d[o->rank++] = x->d[i];
    else if (keep)
      o->d[o->rank++] = 1;
}

static void shape_squeeze(fuser *f, const es_node *nd, const sshape *x, sshape *o) {
  int mark[ES_MAX_RANK];
  int n = x->rank >= 0 ? node_axes(f, nd, x->rank, mark) : -1;
  o->rank = -1;
  if (n < 0)
    return;
  for (int i = 0; n == 0 && i < x->rank; i++) {
    if (x->d[i] < 0)
      return; /* squeezed or not depends on the input */
    mark[i] = x->d[i] == 1;
  }
  o->rank = 0;
  for (int i = 0; i < x->rank; i++)
    if (!mark[i])
      o->d[o->rank++] = x->d[i];
}

static void shape_transpose(const es_node *nd, const sshape *x, sshape *o) {
  int64_t perm[ES_MAX_RANK];
  o->rank = -1;
  if (x->rank < 0)
    return;
  if (!es_node_attr(nd, "perm"))
    for (int i = 0; i < x->rank; i++)
      perm[i] = x->rank - 1 - i;
  else if (!attr_ints(nd, "perm", x->rank, 0, perm))
    return;
  for (int i = 0; i < x->rank; i++) {
    if (perm[i] < 0 || perm[i] >= x->rank)
      return;
    o->d[i] = x->d[perm[i]];
  }
  o->rank = x->rank;
}

/* The element type of output 0, from input 0's (x). */
static es_dtype node_dtype(const es_node *nd, const sshape *x) {
  int64_t to;
  switch (nd->op) {
  case ES_OP_Cast:
    return attr_int(nd, "to", 0, &to) && es_dtype_size((es_dtype)to) ? (es_dtype)to
                                                                      : ES_DTYPE_UNDEFINED;
  case ES_OP_Shape:
    return ES_DTYPE_INT64;
  case ES_OP_Equal:
    return ES_DTYPE_BOOL;
  case ES_OP_Relu:
  case ES_OP_Sigmoid:
  case ES_OP_HardSigmoid:
  case ES_OP_Clip:
  case ES_OP_Sqrt:
  case ES_OP_Softmax:
  case ES_OP_BatchNormalization:
  case ES_OP_Add:
  case ES_OP_Sub:
  case ES_OP_Mul:
  case ES_OP_Div:
  case ES_OP_Pow:
  case ES_OP_Conv:
  case ES_OP_ConvTranspose:
  case ES_OP_MaxPool:
  case ES_OP_AveragePool:
  case ES_OP_GlobalAveragePool:
  case ES_OP_Resize:
  case ES_OP_Concat:
  case ES_OP_Transpose:
  case ES_OP_MatMul:
  case ES_OP_Reshape:
  case ES_OP_ReduceMean:
  case ES_OP_Squeeze:
  case ES_OP_Slice:
  case ES_OP_Pad:
  case ES_OP_Split:
    return x->dt; /* in every model that runs, the ops' inputs agree */
  default:
    return ES_DTYPE_UNDEFINED;
  }
}

/* Output shapes of one node from its inputs'. */
static void shape_node(fuser *f, const es_node *nd) {
  sshape x, b, o;
  shape_of(f, nd->n_in > 0 ? nd->in[0] : -1, &x);
  o.rank = -1;
  switch (nd->op) {
  case ES_OP_Relu:
  case ES_OP_Sigmoid:
  case ES_OP_HardSigmoid:
  case ES_OP_Clip:
  case ES_OP_Sqrt:
  case ES_OP_Cast:
  case ES_OP_Softmax:
  case ES_OP_BatchNormalization:
    o = x;
    break;
  case ES_OP_Add:
  case ES_OP_Sub:
  case ES_OP_Mul:
  case ES_OP_Div:
  case ES_OP_Pow:
  case ES_OP_Equal:
    shape_of(f, nd->n_in > 1 ? nd->in[1] : -1, &b);
    shape_broadcast(f, &x, &b, &o);
    break;
  case ES_OP_Conv: {
    int w = nd->n_in > 1 ? nd->in[1] : -1;
    if (x.rank < 0 && is_const(f->g, w))
      shape_fresh(f, &x, f->g->values[w].rank);
    if (is_const(f->g, w) && f->g->values[w].rank == x.rank)
      shape_window(f, nd, &x, f->g->values[w].dims[0], f->g->values[w].dims + 2, 0, &o);
    break;
  }
  case ES_OP_ConvTranspose:
    shape_conv_transpose(f, nd, &x, &o);
    break;
  case ES_OP_MaxPool:
  case ES_OP_AveragePool:
    if (x.rank >= 3)
      shape_window(f, nd, &x, x.d[1], NULL, 1, &o);
    break;
  case ES_OP_GlobalAveragePool:
    o = x;
    for (int i = 2; i < o.rank; i++)
      o.d[i] = 1;
    break;
  case ES_OP_Resize:
    shape_resize(f, nd, &x, &o);
    break;
  case ES_OP_Concat:
    shape_concat(f, nd, &o);
    break;
  case ES_OP_Transpose:
    shape_transpose(nd, &x, &o);
    break;
  case ES_OP_MatMul:
    shape_of(f, nd->n_in > 1 ? nd->in[1] : -1, &b);
    shape_matmul(f, &x, &b, &o);
    break;
  case ES_OP_Reshape:
    shape_reshape(f, nd, &x, &o);
    break;
  case ES_OP_ReduceMean:
    shape_reduce(f, nd, &x, &o);
    break;
  case ES_OP_Squeeze:
    shape_squeeze(f, nd, &x, &o);
    break;
  case ES_OP_Shape:
    o.rank = 1;
    o.d[0] = x.rank >= 0 && !es_node_attr(nd, "start") && !es_node_attr(nd, "end")
                 ? x.rank
                 : sym_fresh(f);
    break;
  case ES_OP_Slice:
  case ES_OP_Pad:
  case ES_OP_Split:
    shape_fresh(f, &o, x.rank);
    break;
  default:
    break;
  }
  o.dt = node_dtype(nd, &x);
  for (int i = 0; i < o.rank; i++)
    if (o.d[i] >= DIM_MAX)
      o.d[i] = sym_fresh(f);
  for (int k = 0; k < nd->n_out; k++) {
    int v = nd->out[k];
    if (v < 0 || v >= f->n_shape)
      continue;
    if (k == 0) {
      f->shape[v] = o;
    } else {
      shape_fresh(f, &f->shape[v], nd->op == ES_OP_Split ? x.rank : -1);
      f->shape[v].dt = nd->op == ES_OP_Split ? x.dt : ES_DTYPE_UNDEFINED;
    }
  }
}

static int shapes_infer(fuser *f) {
  es_graph *g = f->g;
  f->n_shape = g->n_values;
  f->shape = es_mem_calloc(ES_MEM_MODEL, (size_t)g->n_values + 1, sizeof *f->shape);
  if (!f->shape)
    return es__fail(ES_ENOMEM, "out of memory for the shapes of %d values", g->n_values);
  for (int v = 0; v < g->n_values; v++) {
    const es_value *val = &g->values[v];
    sshape *s = &f->shape[v];
    s->rank = -1;
    s->dt = ES_DTYPE_UNDEFINED;
    if (val->kind == ES_VALUE_CONST || val->kind == ES_VALUE_INPUT) {
      s->rank = val->rank;
      s->dt = val->dtype;
      for (int i = 0; i < val->rank; i++)
        s->d[i] = val->dims[i] >= 0 && val->dims[i] < DIM_MAX ? val->dims[i] : sym_fresh(f);
    }
  }
  for (int n = 0; n < g->n_nodes; n++)
    shape_node(f, &g->nodes[n]);
  return 0;
}

/* ==========================================================================
 * Graph edits
 * ======================================================================== */


/* Drops the nodes marked in f->gone, keeping the order, and recounts uses. */
static void nodes_compact(fuser *f) {
  es_graph *g = f->g;
  int kept = 0;
  for (int i = 0; i < g->n_nodes; i++)
    if (!f->gone[i])
      g->nodes[kept++] = g->nodes[i];
  memset(f->gone, 0, (size_t)g->n_nodes);
  g->n_nodes = kept;
  es_graph_reindex(g);
}

/* v is an intermediate a pattern may swallow: produced by a node, read by
 * exactly uses node inputs, not a graph output. */
static int inner(const es_graph *g, int v, int uses) {
  return v >= 0 && g->values[v].kind == ES_VALUE_ACT && g->values[v].producer >= 0 &&
         !g->values[v].is_output && g->values[v].uses == uses;
}

/* The nodes (up to max) reading v, in order, each once. */
static int consumers(const es_graph *g, int v, int *out, int max) {
  int n = 0;
  for (int i = g->values[v].producer + 1; i < g->n_nodes && n < max; i++)
    for (int k = 0; k < g->nodes[i].n_in; k++)
      if (g->nodes[i].in[k] == v) {
        out[n++] = i;
        break;
      }
  return n;
}

/* The one node reading v (which has one use), or -1. */
static int consumer(const es_graph *g, int v) {
  int c;
  return consumers(g, v, &c, 1) == 1 ? c : -1;
}

/* For a binary node reading v: the other operand. */
static int other_input(const es_node *nd, int v) {
  if (nd->n_in != 2 || nd->n_out != 1)
    return -1;
  return nd->in[0] == v ? nd->in[1] : nd->in[1] == v ? nd->in[0] : -1;
}

/* Node nd (n_in inputs in, attributes plus extra) with arrays in the
 * graph's context. */
static es_attr *attrs_extend(es_graph *g, const es_node *nd, int extra) {
  es_attr *a = es_ctx_alloc(&g->ctx, (size_t)(nd->n_attr + extra) * sizeof *a);
  if (a && nd->n_attr)
    memcpy(a, nd->attrs, (size_t)nd->n_attr * sizeof *a);
  return a;
}

/* ==========================================================================
 * Pass 1: identities
 * ======================================================================== */

/* Constant c broadcast against x yields x's shape unchanged. */
static int const_fits(const fuser *f, int c, int x) {
  sshape xs;
  shape_of(f, x, &xs);
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

static int const_all(const es_graph *g, int c, float want) {
  if (!const_f32(g, c))
    return 0;
  const float *d = g->values[c].data;
  size_t n = const_count(g, c);
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
    if (const_all(g, b, 1.0f) && const_fits(f, b, a))
      return a;
    if (const_all(g, a, 1.0f) && const_fits(f, a, b))
      return b;
    return -1;
  case ES_OP_Add:
    if (const_all(g, b, 0.0f) && const_fits(f, b, a))
      return a;
    if (const_all(g, a, 0.0f) && const_fits(f, a, b))
      return b;
    return -1;
  case ES_OP_Div:
    return const_all(g, b, 1.0f) && const_fits(f, b, a) ? a : -1;
  case ES_OP_Sub:
    return const_all(g, b, 0.0f) && const_fits(f, b, a) ? a : -1;
  default:
    return -1;
  }
}

static int fuse_identities(fuser *f) {
  es_graph *g = f->g;
  int removed = 0;
  for (int n = 0; n < g->n_nodes; n++) {
    const es_node *nd = &g->nodes[n];
    int x = identity_input(f, nd), y = nd->out[0];
    if (x < 0 || g->values[y].is_output || is_const(g, x))
      continue;
    for (int i = n + 1; i < g->n_nodes; i++)
      for (int k = 0; k < g->nodes[i].n_in; k++)
        if (g->nodes[i].in[k] == y)
          g->nodes[i].in[k] = x;
    f->gone[n] = 1;
    removed++;
  }
  if (removed)
    nodes_compact(f);
  return 0;
}

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
  if (!const_f32(g, c))
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
    if (nd->n_in != 5 || nd->in[0] < 0 || !attr_int(nd, "training_mode", 0, &tm) || tm != 0 ||
        !attr_int(nd, "spatial", 1, &spatial) || spatial != 1 ||
        !attr_float(nd, "epsilon", 1e-5f, &eps) || !(eps >= 0))
      return -1;
    for (int k = 1; k < 5; k++)
      if (!const_f32(g, nd->in[k]) || g->values[nd->in[k]].rank != 1 ||
          g->values[nd->in[k]].dims[0] != m)
        return -1;
    x = nd->in[0];
  } else {
    if (nd->op != ES_OP_Mul && nd->op != ES_OP_Add && nd->op != ES_OP_Sub &&
        nd->op != ES_OP_Div)
      return -1;
    if (nd->n_in != 2 || nd->in[0] < 0 || nd->in[1] < 0)
      return -1;
    int xi = is_const(g, nd->in[0]) ? 1 : 0;
    ci = 1 - xi;
    x = nd->in[xi];
    c = nd->in[ci];
    if (is_const(g, x) || !chan_const(g, c, rank, m, &chan))
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
} conv_info;

static int conv_info_get(const es_graph *g, es_node *nd, conv_info *ci) {
  if ((nd->op != ES_OP_Conv && nd->op != ES_OP_ConvTranspose) || nd->n_out != 1 ||
      nd->out[0] < 0 || nd->n_in < 2 || nd->n_in > 3 || nd->in[0] < 0)
    return 0;
  memset(ci, 0, sizeof *ci);
  ci->node = nd;
  ci->transpose = nd->op == ES_OP_ConvTranspose;
  ci->x = nd->in[0];
  ci->w = nd->in[1];
  ci->b = nd->n_in > 2 ? nd->in[2] : -1;
  if (!attr_int(nd, "group", 1, &ci->g) || ci->g < 1 || !const_f32(g, ci->w))
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
  if (ci->b >= 0 &&
      (!const_f32(g, ci->b) || g->values[ci->b].rank != 1 || g->values[ci->b].dims[0] != ci->m))
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
                    es_node_label(ci->node, label, sizeof label));
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
  int *in3 = ci->node->n_in < 3 ? es_ctx_alloc(&g->ctx, 3 * sizeof *in3) : ci->node->in;
  if (!in3) {
    es_mem_free(wd);
    es_mem_free(bd);
    return es__fail(ES_ENOMEM, "%s: out of memory fusing into its weights",
                    es_node_label(ci->node, label, sizeof label));
  }
  snprintf(nm, sizeof nm, "\x01" "fuse:%d:W:%d", ci->node->file_index, g->n_values);
  if ((rc = es_graph_const_append(g, nm, ES_DTYPE_FLOAT, w->rank, w->dims, wd, w->nbytes,
                                   &wv)) < 0) {
    es_mem_free(bd);
    return rc;
  }
  snprintf(nm, sizeof nm, "\x01" "fuse:%d:B:%d", ci->node->file_index, g->n_values);
  if ((rc = es_graph_const_append(g, nm, ES_DTYPE_FLOAT, 1, &ci->m, bd,
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
  const char *ap = attr_str(nd, "auto_pad", "NOTSET");
  if (!ap)
    return 0;
  if (!strcmp(ap, "VALID"))
    return 1;
  if (strcmp(ap, "NOTSET") || !attr_ints(nd, "pads", 2 * nsp, 0, pads))
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
  if (g->nodes[n].op != ES_OP_Conv || !conv_info_get(g, &g->nodes[n], &ci) ||
      !conv_pads_zero(ci.node, ci.rank - 2))
    return 0;
  affine a = {0}, tmp = {0};
  int rc = affine_alloc(&a, ci.c);
  if (rc == 0)
    rc = affine_alloc(&tmp, ci.c);
  int v = ci.x, folded = 0;
  while (rc == 0 && inner(g, v, 1)) {
    int p = g->values[v].producer;
    sshape us;
    const es_node *pn = &g->nodes[p];
    int u0 = pn->n_in > 0 ? pn->in[0] : -1, u1 = pn->n_in > 1 ? pn->in[1] : -1;
    int u = u0 >= 0 && !is_const(g, u0) ? u0 : u1;
    shape_of(f, u, &us);
    int known = us.rank == ci.rank && us.d[1] == ci.c;
    int x = pre_step(f, pn, ci.rank, known, &a, &tmp);
    if (x < 0)
      break;
    f->gone[p] = 1;
    folded++;
    v = x;
  }
  if (rc == 0 && folded) {
    rc = conv_rewrite_weights(g, &ci, NULL, &a);
    if (rc == 0) {
      g->nodes[n].in[0] = v;
      nodes_compact(f);
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

/* Clip's bounds, attribute (opset < 11) or constant input form; an absent
 * bound is -big / big (conv.c's post-op wants finite bounds, the program
 * infinite ones, as the Clip kernel). Bounds that are NaN or cross (ONNX
 * then gives hi everywhere, a clamp need not) are refused. */
static int clip_bounds(const es_graph *g, const es_node *nd, float big, float *lo, float *hi) {
  *lo = -big;
  *hi = big;
  if (g->opset < 11) {
    if (nd->n_in != 1 || !attr_float(nd, "min", -big, lo) || !attr_float(nd, "max", big, hi))
      return 0;
  } else {
    if (nd->n_in > 3)
      return 0;
    for (int k = 1; k < nd->n_in; k++)
      if (nd->in[k] >= 0 && !const_scalar(g, nd->in[k], k == 1 ? lo : hi))
        return 0;
  }
  return *lo <= *hi;
}

static int scalar_is(const fuser *f, int c, int x, float want) {
  float v;
  return const_scalar(f->g, c, &v) && v == want && const_fits(f, c, x);
}

/* HardSwish as PP-OCR writes it, from y (two uses): a = Add(y, 3),
 * b = Clip(a, 0, 6), then Mul(y, b) and Div(., 6) in either order.
 * Returns the final value and lists the four nodes in out. */
static int match_hardswish(const fuser *f, int y, int *out) {
  const es_graph *g = f->g;
  int cs[2];
  if (consumers(g, y, cs, 2) != 2)
    return -1;
  for (int first = 0; first < 2; first++) {
    const es_node *add = &g->nodes[cs[first]];
    int mul_n = cs[1 - first];
    if (add->op != ES_OP_Add || !scalar_is(f, other_input(add, y), y, 3.0f) ||
        !inner(g, add->out[0], 1))
      continue;
    int clip_n = consumer(g, add->out[0]);
    const es_node *clip = &g->nodes[clip_n];
    float lo, hi;
    if (clip->op != ES_OP_Clip || clip->in[0] != add->out[0] ||
        !clip_bounds(g, clip, FLT_MAX, &lo, &hi) || lo != 0.0f || hi != 6.0f ||
        clip->n_out != 1 || !inner(g, clip->out[0], 1))
      continue;
    int b = clip->out[0];
    const es_node *mul = &g->nodes[mul_n];
    int div_n;
    if (mul->op == ES_OP_Mul && other_input(mul, y) == b) {
      /* c = Mul(y, b); d = Div(c, 6) */
      if (!inner(g, mul->out[0], 1))
        continue;
      div_n = consumer(g, mul->out[0]);
      const es_node *div = &g->nodes[div_n];
      if (div->op != ES_OP_Div || div->n_in != 2 || div->in[0] != mul->out[0] ||
          !scalar_is(f, div->in[1], y, 6.0f))
        continue;
      out[0] = cs[first], out[1] = clip_n, out[2] = mul_n, out[3] = div_n;
      return div->out[0];
    }
    /* c = Div(b, 6); d = Mul(y, c): the Mul is y's other consumer */
    div_n = consumer(g, b);
    const es_node *div = &g->nodes[div_n];
    if (div->op != ES_OP_Div || div->n_in != 2 || div->in[0] != b ||
        !scalar_is(f, div->in[1], y, 6.0f) || !inner(g, div->out[0], 1))
      continue;
    if (mul->op != ES_OP_Mul || other_input(mul, y) != div->out[0])
      continue;
    out[0] = cs[first], out[1] = clip_n, out[2] = div_n, out[3] = mul_n;
    return mul->out[0];
  }
  return -1;
}

/* Swish: s = Sigmoid(y); Mul(y, s). */
static int match_swish(const es_graph *g, int y, int *out) {
  int cs[2];
  if (consumers(g, y, cs, 2) != 2)
    return -1;
  for (int first = 0; first < 2; first++) {
    const es_node *sig = &g->nodes[cs[first]], *mul = &g->nodes[cs[1 - first]];
    if (sig->op != ES_OP_Sigmoid || sig->n_out != 1 || !inner(g, sig->out[0], 1))
      continue;
    if (mul->op != ES_OP_Mul || other_input(mul, y) != sig->out[0])
      continue;
    out[0] = cs[first];
    out[1] = cs[1 - first];
    return mul->out[0];
  }
  return -1;
}

/* Extends pc by one post-op after pc->tip; 0 when nothing matches. */
static int post_step(const fuser *f, const sshape *yshape, post_chain *pc) {
  const es_graph *g = f->g;
  int y = pc->tip, found[4];
  if (pc->codes >= ES_POST_MAX || pc->n_nodes + 4 > 4 * ES_POST_MAX)
    return 0;
  if (inner(g, y, 2)) {
    int z = match_swish(g, y, found);
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
  if (!inner(g, y, 1))
    return 0;
  int n = consumer(g, y);
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
    if (nd->n_in != 1 || !attr_float(nd, "alpha", 0.2f, &a) || !attr_float(nd, "beta", 0.5f, &b))
      return 0;
    chain_add(pc, ES_POST_HARDSIGMOID, a, b);
    break;
  case ES_OP_Clip:
    if (nd->in[0] != y || !clip_bounds(g, nd, FLT_MAX, &a, &b))
      return 0;
    chain_add(pc, ES_POST_CLIP, a, b);
    break;
  case ES_OP_Add: {
    int r = other_input(nd, y);
    sshape rs;
    shape_of(f, r, &rs);
    if (pc->residual >= 0 || r < 0 || r == y || is_const(g, r) || !shape_same(&rs, yshape))
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

/* Writes the chain into conv node n and moves it to the slot of the chain's
 * last node. */
static int conv_take_chain(fuser *f, int n, const post_chain *pc) {
  es_graph *g = f->g;
  es_node nd = g->nodes[n];
  char label[120];
  int last = n;
  for (int i = 0; i < pc->n_nodes; i++)
    if (pc->nodes[i] > last)
      last = pc->nodes[i];
  if (pc->codes) {
    es_attr *attrs = attrs_extend(g, &nd, 2);
    int64_t *codes = es_ctx_alloc(&g->ctx, (size_t)pc->codes * sizeof *codes);
    float *par = es_ctx_alloc(&g->ctx, (size_t)pc->codes * 2 * sizeof *par);
    char *n1 = es_ctx_strdup(&g->ctx, "_post"), *n2 = es_ctx_strdup(&g->ctx, "_post_f");
    int *in4 = pc->residual >= 0 ? es_ctx_alloc(&g->ctx, 4 * sizeof *in4) : nd.in;
    if (!attrs || !codes || !par || !n1 || !n2 || !in4)
      return es__fail(ES_ENOMEM, "%s: out of memory fusing its activations",
                      es_node_label(&nd, label, sizeof label));
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
      nd.in = in4;
      nd.n_in = 4;
    }
  }
  nd.out[0] = pc->tip;
  for (int i = 0; i < pc->n_nodes; i++)
    f->gone[pc->nodes[i]] = 1;
  f->gone[n] = 1;
  f->gone[last] = 0;
  g->nodes[last] = nd;
  nodes_compact(f);
  return 0;
}

/* Everything after convolution n: per-channel affine nodes into its
 * weights, then (Conv only) post-ops. 1 when something was fused. */
static int fuse_conv_after(fuser *f, int n) {
  es_graph *g = f->g;
  conv_info ci;
  if (!conv_info_get(g, &g->nodes[n], &ci) || es_node_attr(ci.node, "_post"))
    return 0;
  post_chain pc = {.residual = -1, .tip = ci.node->out[0]};
  affine a = {0};
  int rc = affine_alloc(&a, ci.m), folded = 0;
  while (rc == 0 && inner(g, pc.tip, 1) && pc.n_nodes < 4 * ES_POST_MAX) {
    int c = consumer(g, pc.tip);
    if (affine_step(f, &g->nodes[c], ci.rank, 1, &a) != pc.tip)
      break;
    pc.nodes[pc.n_nodes++] = c;
    pc.tip = g->nodes[c].out[0];
    folded++;
  }
  if (rc == 0 && folded)
    rc = conv_rewrite_weights(g, &ci, &a, NULL);
  es_mem_free(a.s);
  if (rc < 0)
    return rc;
  if (!ci.transpose) {
    sshape ys;
    shape_of(f, ci.node->out[0], &ys);
    while (post_step(f, &ys, &pc))
      ;
  }
  if (pc.n_nodes == 0)
    return 0;
  rc = conv_take_chain(f, n, &pc);
  return rc < 0 ? rc : 1;
}

static int fuse_convs(fuser *f) {
  es_graph *g = f->g;
  for (int n = 0; n < g->n_nodes; n++) {
    if (g->nodes[n].op != ES_OP_Conv && g->nodes[n].op != ES_OP_ConvTranspose)
      continue;
    int rc = fuse_pre_affine(f, n);
    if (rc < 0)
      return rc;
    n -= rc; /* the nodes that went were before the conv */
    rc = fuse_conv_after(f, n);
    if (rc < 0)
      return rc;
    if (rc)
      n--; /* the conv moved later; what follows slot n is unvisited */
  }
  return 0;
}

/* ==========================================================================
 * Pass 3: LayerNorm
 * ======================================================================== */

/* ReduceMean over exactly the last axis of x, keepdims. */
static int reduce_last(const fuser *f, const es_node *nd, int x) {
  sshape xs;
  int64_t keep, ax[ES_MAX_RANK];
  int n = 0;
  if (nd->op != ES_OP_ReduceMean || nd->n_out != 1 || nd->in[0] != x ||
      !attr_int(nd, "keepdims", 1, &keep) || keep != 1)
    return 0;
  const es_attr *a = es_node_attr(nd, "axes");
  if (a) {
    if (a->type != ES_ATTR_INTS || a->n != 1)
      return 0;
    ax[0] = a->ints[0];
    n = 1;
  } else if (nd->n_in < 2 || !const_ints(f->g, nd->in[1], 1, ax, &n) || n != 1) {
    return 0;
  }
  if (ax[0] == -1)
    return 1;
  shape_of(f, x, &xs);
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
  if (!const_f32(f->g, c) || f->g->values[c].rank != 1)
    return 0;
  shape_of(f, x, &xs);
  int64_t k = f->g->values[c].dims[0];
  return k == 1 || xs.rank < 1 || xs.d[xs.rank - 1] < 0 || xs.d[xs.rank - 1] == k;
}

/* The constant operand of binary nd whose other operand is v, or -1. */
static int const_operand(const es_graph *g, const es_node *nd, int v) {
  int c = other_input(nd, v);
  return c >= 0 && is_const(g, c) ? c : -1;
}

static int fuse_layernorm_at(fuser *f, int n) {
  es_graph *g = f->g;
  const es_node *rm1 = &g->nodes[n];
  if (rm1->op != ES_OP_ReduceMean || rm1->n_in < 1 || rm1->in[0] < 0)
    return 0;
  int x = rm1->in[0], m = rm1->out[0];
  if (!reduce_last(f, rm1, x) || !inner(g, m, 1))
    return 0;
  int sub_n = consumer(g, m);
  const es_node *sub = &g->nodes[sub_n];
  if (sub->op != ES_OP_Sub || sub->n_in != 2 || sub->in[0] != x || sub->in[1] != m ||
      !inner(g, sub->out[0], 2))
    return 0;
  int d = sub->out[0], cs[2];
  if (consumers(g, d, cs, 2) != 2)
    return 0;
  int pow_n = node_with_op(g, ES_OP_Pow, cs, 2), div_n = node_with_op(g, ES_OP_Div, cs, 2);
  if (pow_n < 0 || div_n < 0)
    return 0;
  const es_node *pw = &g->nodes[pow_n], *dv = &g->nodes[div_n];
  float two, eps;
  if (pw->n_in != 2 || pw->in[0] != d || !const_scalar(g, pw->in[1], &two) || two != 2.0f ||
      g->values[pw->in[1]].rank > 1 || !inner(g, pw->out[0], 1))
    return 0;
  int rm2_n = consumer(g, pw->out[0]);
  const es_node *rm2 = &g->nodes[rm2_n];
  if (!reduce_last(f, rm2, pw->out[0]) || !inner(g, rm2->out[0], 1))
    return 0;
  int add_n = consumer(g, rm2->out[0]);
  const es_node *add = &g->nodes[add_n];
  int ec = add->op == ES_OP_Add ? const_operand(g, add, rm2->out[0]) : -1;
  if (ec < 0 || !const_scalar(g, ec, &eps) || g->values[ec].rank > 1 || !isfinite(eps) ||
      !inner(g, add->out[0], 1))
    return 0;
  int sqrt_n = consumer(g, add->out[0]);
  const es_node *sq = &g->nodes[sqrt_n];
  if (sq->op != ES_OP_Sqrt || sq->n_out != 1 || !inner(g, sq->out[0], 1))
    return 0;
  if (dv->n_in != 2 || dv->in[0] != d || dv->in[1] != sq->out[0] || !inner(g, dv->out[0], 1))
    return 0;
  int mul_n = consumer(g, dv->out[0]);
  const es_node *mul = &g->nodes[mul_n];
  int gamma = mul->op == ES_OP_Mul ? const_operand(g, mul, dv->out[0]) : -1;
  if (gamma < 0 || !ln_param(f, gamma, x) || !inner(g, mul->out[0], 1))
    return 0;
  int badd_n = consumer(g, mul->out[0]);
  const es_node *badd = &g->nodes[badd_n];
  int beta = badd->op == ES_OP_Add ? const_operand(g, badd, mul->out[0]) : -1;
  if (beta < 0 || !ln_param(f, beta, x) || badd->out[0] < 0)
    return 0;

  /* The final Add's slot becomes the LayerNorm. */
  es_node ln = g->nodes[badd_n];
  int *in = es_ctx_alloc(&g->ctx, 3 * sizeof *in);
  es_attr *attrs = es_ctx_alloc(&g->ctx, 2 * sizeof *attrs);
  char *a1 = es_ctx_strdup(&g->ctx, "epsilon"), *a2 = es_ctx_strdup(&g->ctx, "axis");
  if (!in || !attrs || !a1 || !a2) {
    char label[120];
    return es__fail(ES_ENOMEM, "%s: out of memory fusing a LayerNorm",
                    es_node_label(rm1, label, sizeof label));
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
  for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
    f->gone[parts[i]] = 1;
  g->nodes[badd_n] = ln;
  nodes_compact(f);
  return 1;
}

static int fuse_layernorms(fuser *f) {
  for (int n = 0; n < f->g->n_nodes; n++) {
    int rc = fuse_layernorm_at(f, n);
    if (rc < 0)
      return rc;
    if (rc)
      n--;
  }
  return 0;
}

/* ==========================================================================
 * Pass 4: elementwise chains
 * ======================================================================== */

/* A group of elementwise nodes that becomes one FusedElementwise node. */
typedef struct ew_group {
  int sink;              /* its last node: the group's one output */
  int n;
  int nodes[ES_FE_MAX_INSNS];
} ew_group;

/* nd may join a group: a listed operator over float32 operands, with the
 * operands the program can take. */
static int ew_eligible(const fuser *f, const es_node *nd) {
  const es_graph *g = f->g;
  int arity;
  switch (nd->op) {
  case ES_OP_Add:
  case ES_OP_Sub:
  case ES_OP_Mul:
  case ES_OP_Div:
  case ES_OP_Pow:
    arity = 2;
    break;
  case ES_OP_Relu:
  case ES_OP_Sigmoid:
  case ES_OP_Sqrt:
  case ES_OP_HardSigmoid:
    arity = 1;
    break;
  case ES_OP_Clip: {
    float lo, hi;
    if (!clip_bounds(g, nd, INFINITY, &lo, &hi))
      return 0;
    arity = 1;
    break;
  }
  default:
    return 0;
  }
  if (nd->n_out != 1 || nd->out[0] < 0 || nd->n_in < arity || (arity == 2 && nd->n_in != 2))
    return 0;
  sshape s;
  shape_of(f, nd->out[0], &s);
  if (s.dt != ES_DTYPE_FLOAT)
    return 0;
  for (int k = 0; k < arity; k++) {
    shape_of(f, nd->in[k], &s);
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
 * eligible node of no other group and every reader of v is in the group. */
static int ew_absorbable(const fuser *f, const ew_group *gr, const int *owner, int v) {
  const es_graph *g = f->g;
  if (v < 0 || g->values[v].kind != ES_VALUE_ACT || g->values[v].is_output)
    return -1;
  int p = g->values[v].producer;
  if (p < 0 || owner[p] >= 0 || in_group(gr, p) || !ew_eligible(f, &g->nodes[p]))
    return -1;
  for (int i = p + 1; i < g->n_nodes; i++)
    for (int k = 0; k < g->nodes[i].n_in; k++)
      if (g->nodes[i].in[k] == v && !in_group(gr, i))
        return -1;
  return p;
}

static int cmp_int(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

/* Grows the group ending at sink backwards to a fixpoint. */
static void ew_grow(const fuser *f, ew_group *gr, const int *owner) {
  int changed = 1;
  while (changed) {
    changed = 0;
    for (int i = 0; i < gr->n && gr->n < ES_FE_MAX_INSNS / 2; i++) {
      const es_node *nd = &f->g->nodes[gr->nodes[i]];
      for (int k = 0; k < nd->n_in && gr->n < ES_FE_MAX_INSNS / 2; k++) {
        int p = ew_absorbable(f, gr, owner, nd->in[k]);
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

static int ew_arity(es_op op) {
  return op == ES_OP_Add || op == ES_OP_Sub || op == ES_OP_Mul || op == ES_OP_Div ||
                 op == ES_OP_Pow
             ? 2
             : 1;
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
  return const_scalar(g, v, c) && g->values[v].rank <= max_rank;
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
        if (pass == 0 ? const_scalar(g, v, &c) : ew_is_imm(g, v, max_rank, &c))
          continue;
        if (p->n_in == ES_FE_MAX_REGS)
          return 0;
        p->in[p->n_in++] = v;
        sshape s;
        shape_of(f, v, &s);
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
    int64_t op;
    float a, b;
    switch (nd->op) {
    case ES_OP_Add: op = ES_FE_ADD; break;
    case ES_OP_Sub: op = ES_FE_SUB; break;
    case ES_OP_Mul: op = ES_FE_MUL; break;
    case ES_OP_Div: op = ES_FE_DIV; break;
    case ES_OP_Pow: op = ES_FE_POW; break;
    case ES_OP_Relu: op = ES_FE_RELU; break;
    case ES_OP_Sigmoid: op = ES_FE_SIGMOID; break;
    case ES_OP_Sqrt: op = ES_FE_SQRT; break;
    case ES_OP_HardSigmoid:
      op = ES_FE_HARDSIGMOID;
      if (!attr_float(nd, "alpha", 0.2f, &a) || !attr_float(nd, "beta", 0.5f, &b))
        return 0;
      opnd[1] = ew_imm2(p, a, b);
      break;
    default: /* Clip */
      op = ES_FE_CLIP;
      if (!clip_bounds(g, nd, INFINITY, &a, &b))
        return 0;
      opnd[1] = ew_imm2(p, a, b);
      break;
    }
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
  int *in = es_ctx_alloc(&g->ctx, (size_t)p->n_in * sizeof *in);
  int64_t *code = es_ctx_alloc(&g->ctx, (size_t)p->n_code * sizeof *code);
  float *imm = p->n_imm ? es_ctx_alloc(&g->ctx, (size_t)p->n_imm * sizeof *imm) : NULL;
  es_attr *attrs = es_ctx_alloc(&g->ctx, 2 * sizeof *attrs);
  char *n1 = es_ctx_strdup(&g->ctx, "_prog"), *n2 = es_ctx_strdup(&g->ctx, "_prog_f");
  if (!in || !code || (p->n_imm && !imm) || !attrs || !n1 || !n2)
    return es__fail(ES_ENOMEM, "%s: out of memory fusing an elementwise chain",
                    es_node_label(&nd, label, sizeof label));
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

static int fuse_elementwise(fuser *f) {
  es_graph *g = f->g;
  int *owner = es_mem_alloc(ES_MEM_MODEL, ((size_t)g->n_nodes + 1) * sizeof *owner);
  ew_prog *prog = es_mem_alloc(ES_MEM_MODEL, sizeof *prog);
  int rc = 0, fused = 0;
  if (!owner || !prog)
    rc = es__fail(ES_ENOMEM, "out of memory fusing elementwise chains");
  for (int i = 0; rc == 0 && i < g->n_nodes; i++)
    owner[i] = -1;
  /* Sinks from the last node back: a node whose output leaves every group
   * is the end of its own. Groups are disjoint and rewritten in place; the
   * graph is compacted once at the end. */
  for (int n = g->n_nodes - 1; rc == 0 && n >= 0; n--) {
    if (owner[n] >= 0 || !ew_eligible(f, &g->nodes[n]))
      continue;
    ew_group gr = {.sink = n, .n = 1, .nodes = {n}};
    ew_grow(f, &gr, owner);
    if (gr.n < 2 || !ew_program(f, &gr, prog))
      continue;
    for (int i = 0; i < gr.n; i++)
      owner[gr.nodes[i]] = n;
    rc = ew_rewrite(f, &gr, prog);
    fused++;
  }
  if (rc == 0 && fused)
    nodes_compact(f);
  es_mem_free(owner);
  es_mem_free(prog);
  return rc;
}

/* ==========================================================================
 * Entry point
 * ======================================================================== */

static _Atomic int fusion_on_ = 1;

void es_engine_fusion_set(int on) { atomic_store(&fusion_on_, on ? 1 : 0); }

int es_graph_fuse(es_graph *g) {
  if (g->weights)
    return es__fail(ES_ESTATE, "nodes can only be fused before the weights are sealed");
  if (!atomic_load(&fusion_on_))
    return 0;
  es_graph_reindex(g);
  fuser f = {.g = g};
  f.gone = es_mem_calloc(ES_MEM_MODEL, (size_t)g->n_nodes + 1, 1);
  int rc = f.gone ? 0 : es__fail(ES_ENOMEM, "out of memory fusing %d nodes", g->n_nodes);
  if (rc == 0)
    rc = shapes_infer(&f);
  if (rc == 0)
    rc = fuse_identities(&f);
  if (rc == 0)
    rc = fuse_convs(&f);
  if (rc == 0)
    rc = fuse_layernorms(&f);
  if (rc == 0)
    rc = fuse_elementwise(&f);
  es_mem_free(f.gone);
  es_mem_free(f.shape);
  es_mem_free(f.syms);
  return rc;
}
