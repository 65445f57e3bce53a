/* Symbolic shapes for the fusion passes (the "Shapes" part of fuse.c's
 * note): every dimension a number or an interned symbol, so two shapes are
 * proven equal whatever the input size. Element types ride along. */
#include "engine/fuse.h"

#include "common/internal.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ==========================================================================
 * Symbolic shapes
 * ======================================================================== */

/* Interning looks a symbol up in a hash table of the non-fresh ones (a
 * fresh symbol equals no other): comparing with every symbol made a graph
 * with n symbols cost n^2. */
static size_t sym_hash(const sym *s) {
  const unsigned char *b = (const unsigned char *)s;
  uint64_t h = 1469598103934665603ull; /* FNV-1a over the bytes, padding zeroed */
  for (size_t i = 0; i < sizeof *s; i++)
    h = (h ^ b[i]) * 1099511628211ull;
  return (size_t)(h ^ (h >> 32));
}

/* The slot of s in the table: where it is, or the empty one it would take. */
static size_t sym_slot(const fuser *f, const sym *s) {
  size_t mask = f->sym_slots - 1;
  size_t i = sym_hash(s) & mask;
  while (f->sym_table[i] >= 0 && memcmp(&f->syms[f->sym_table[i]], s, sizeof *s))
    i = (i + 1) & mask;
  return i;
}

/* Room for one more symbol in the table; 0 when out of memory. */
static int sym_table_room(fuser *f) {
  if (f->sym_slots && 2 * (f->sym_used + 1) <= f->sym_slots)
    return 1;
  size_t slots = f->sym_slots ? f->sym_slots * 2 : 512;
  int *t = es_mem_alloc(ES_MEM_MODEL, slots * sizeof *t);
  if (!t)
    return 0;
  memset(t, 0xff, slots * sizeof *t);
  int *old = f->sym_table;
  size_t old_slots = f->sym_slots;
  f->sym_table = t;
  f->sym_slots = slots;
  for (size_t i = 0; i < old_slots; i++)
    if (old[i] >= 0)
      t[sym_slot(f, &f->syms[old[i]])] = old[i];
  es_mem_free(old);
  return 1;
}

static int64_t sym_get(fuser *f, sym_kind kind, int64_t a, int64_t p0, int64_t p1, int64_t p2,
                       int64_t p3, int64_t p4) {
  sym s;
  memset(&s, 0, sizeof s); /* padding too: symbols compare with memcmp */
  s.kind = kind;
  s.a = a;
  s.p[0] = p0, s.p[1] = p1, s.p[2] = p2, s.p[3] = p3, s.p[4] = p4;
  size_t at = 0;
  if (kind != SYM_FRESH && !f->oom) {
    if (!sym_table_room(f))
      f->oom = 1; /* as when the symbol cannot be stored: see below */
    else if (f->sym_table[at = sym_slot(f, &s)] >= 0)
      return -1 - (int64_t)f->sym_table[at];
  }
  if (f->n_syms == f->cap_syms) {
    int cap = f->cap_syms ? f->cap_syms * 2 : 256;
    sym *ns = f->oom     ? NULL
              : f->syms ? es_mem_realloc(f->syms, (size_t)cap * sizeof *ns)
                        : es_mem_alloc(ES_MEM_MODEL, (size_t)cap * sizeof *ns);
    if (!ns) {
      /* A symbol that is not stored can never be found again, so it equals
       * nothing: the safe answer. Numbers from 2^40 on are free. */
      f->oom = 1;
      return -1 - ((int64_t)1 << 40) - (f->n_unstored++);
    }
    f->syms = ns;
    f->cap_syms = cap;
  }
  if (f->oom) /* stored symbols may not all be in the table: store no more */
    return -1 - ((int64_t)1 << 40) - (f->n_unstored++);
  if (kind != SYM_FRESH) {
    f->sym_table[at] = f->n_syms;
    f->sym_used++;
  }
  f->syms[f->n_syms] = s;
  return -1 - (int64_t)(f->n_syms++);
}

static int64_t sym_fresh(fuser *f) { return sym_get(f, SYM_FRESH, 0, 0, 0, 0, 0, 0); }

static void shape_fresh(fuser *f, sshape *s, int rank) {
  s->rank = rank;
  for (int i = 0; i < rank && i < ES_MAX_RANK; i++)
    s->d[i] = sym_fresh(f);
}

/* ---- reading attributes and constants ----------------------------------- */

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
  /* Without ceil_mode the extent is floor((in + pb + pe - span) / s) + 1:
   * only pb + pe - span and s matter, so a 3x3 stride-2 window padded by 1
   * and a 1x1 stride-2 window unpadded (a residual block's two branches)
   * get the same symbol. */
  if (!ceil_mode)
    return sym_get(f, SYM_WINDOW, in, 0, pb + pe - span, 0, s, 0);
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
  const char *ap = es__fz_attr_str(nd, "auto_pad", "NOTSET");
  int ok = ap && es__fz_attr_ints(nd, "strides", nsp, 1, st) &&
           es__fz_attr_ints(nd, "dilations", nsp, 1, dl) &&
           es__fz_attr_ints(nd, "pads", 2 * nsp, 0, pads) &&
           (!pool || es__fz_attr_int(nd, "ceil_mode", 0, &ceil_mode));
  if (ker)
    memcpy(k, ker, (size_t)nsp * sizeof *k);
  else
    ok = ok && es__node_attr(nd, "kernel_shape") && es__fz_attr_ints(nd, "kernel_shape", nsp, 1, k);
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

static void shape_conv_transpose(fuser *f, const es_node *nd, int wi, const sshape *x,
                                 sshape *o) {
  const es_graph *g = f->g;
  int w = nd->n_in > wi ? nd->in[wi] : -1;
  int nsp = x->rank - 2;
  int64_t group;
  if (x->rank < 3 || !es__fz_is_const(g, w) || g->values[w].rank != x->rank ||
      !es__fz_attr_int(nd, "group", 1, &group) || group < 1 || g->values[w].dims[0] % group) {
    o->rank = -1;
    return;
  }
  const es_value *wv = &g->values[w];
  int64_t st[ES_MAX_RANK], dl[ES_MAX_RANK], op[ES_MAX_RANK], pads[2 * ES_MAX_RANK],
      os[ES_MAX_RANK];
  const char *ap = es__fz_attr_str(nd, "auto_pad", "NOTSET");
  int ok = ap && es__fz_attr_ints(nd, "strides", nsp, 1, st) &&
           es__fz_attr_ints(nd, "dilations", nsp, 1, dl) &&
           es__fz_attr_ints(nd, "pads", 2 * nsp, 0, pads) &&
           es__fz_attr_ints(nd, "output_padding", nsp, 0, op);
  int has_os = es__node_attr(nd, "output_shape") != NULL;
  ok = ok && (!has_os || es__fz_attr_ints(nd, "output_shape", nsp, 0, os));
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
  int sc = si < nd->n_in && es__fz_is_const(g, nd->in[si]) && es__fz_const_count(g, nd->in[si]) > 0
               ? nd->in[si]
               : -1;
  int64_t sizes[ES_MAX_RANK];
  int n;
  if (sc >= 0 && es__fz_const_f32(g, sc) && es__fz_const_count(g, sc) == (size_t)x->rank) {
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
  } else if (sc < 0 && zi < nd->n_in && es__fz_const_ints(g, nd->in[zi], ES_MAX_RANK, sizes, &n) &&
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
  es__fz_shape_of(f, nd->in[0], o);
  if (o->rank < 1 || !es__fz_attr_int(nd, "axis", 0, &axis) || axis < -o->rank || axis >= o->rank) {
    o->rank = -1;
    return;
  }
  int ax = (int)(axis < 0 ? axis + o->rank : axis);
  for (int k = 1; k < nd->n_in; k++) {
    es__fz_shape_of(f, nd->in[k], &s);
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
  if (nd->n_in < 2 || !es__fz_const_ints(f->g, nd->in[1], ES_MAX_RANK, s, &n) ||
      !es__fz_attr_int(nd, "allowzero", 0, &allowzero)) {
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
  const es_attr *a = es__node_attr(nd, "axes");
  if (a) {
    if (a->type != ES_ATTR_INTS || a->n > ES_MAX_RANK)
      return -1;
    n = (int)a->n;
    memcpy(ax, a->ints, (size_t)n * sizeof *ax);
  } else if (nd->n_in > 1 && nd->in[1] >= 0) {
    if (!es__fz_const_ints(f->g, nd->in[1], ES_MAX_RANK, ax, &n))
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
  if (n < 0 || !es__fz_attr_int(nd, "keepdims", 1, &keep) ||
      !es__fz_attr_int(nd, "noop_with_empty_axes", 0, &noop)) {
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
  if (!es__node_attr(nd, "perm"))
    for (int i = 0; i < x->rank; i++)
      perm[i] = x->rank - 1 - i;
  else if (!es__fz_attr_ints(nd, "perm", x->rank, 0, perm))
    return;
  for (int i = 0; i < x->rank; i++) {
    if (perm[i] < 0 || perm[i] >= x->rank)
      return;
    o->d[i] = x->d[perm[i]];
  }
  o->rank = x->rank;
}

/* The element type of input i, ES_DTYPE_UNDEFINED when absent or unknown. */
static es_dtype input_dtype(const fuser *f, const es_node *nd, int i) {
  sshape s;
  es__fz_shape_of(f, i < nd->n_in ? nd->in[i] : -1, &s);
  return s.dt;
}

/* The element type of output 0, from input 0's (x). */
static es_dtype node_dtype(const fuser *f, const es_node *nd, const sshape *x) {
  int64_t to;
  switch (nd->op) {
  case ES_OP_QuantizeLinear: /* the zero point's type, else output_dtype, else uint8 */
    if (nd->n_in > 2 && nd->in[2] >= 0)
      return input_dtype(f, nd, 2);
    if (f->g->opset < 21)
      return ES_DTYPE_UINT8;
    if (!es__fz_attr_int(nd, "output_dtype", 0, &to))
      return ES_DTYPE_UNDEFINED;
    return to == 0 ? ES_DTYPE_UINT8
           : to == ES_DTYPE_UINT8 || to == ES_DTYPE_INT8 ? (es_dtype)to
                                                         : ES_DTYPE_UNDEFINED;
  case ES_OP_DequantizeLinear:
    return ES_DTYPE_FLOAT;
  case ES_OP_DynamicQuantizeLinear:
    return ES_DTYPE_UINT8;
  case ES_OP_MatMulInteger:
  case ES_OP_ConvInteger:
    return ES_DTYPE_INT32;
  case ES_OP_QLinearMatMul:
  case ES_OP_QLinearConv:
  case ES_OP_QLinearConvTranspose:
    if (es__fz_attr_int(nd, "_float_out", 0, &to) && to) /* engine/fuse_qdq.c's */
      return ES_DTYPE_FLOAT;
    return input_dtype(f, nd, 7); /* y_zero_point's */
  case ES_OP_QLinearAdd:
  case ES_OP_QLinearMul:
    return input_dtype(f, nd, 7);
  case ES_OP_QLinearSigmoid:
  case ES_OP_QLinearGlobalAveragePool:
  case ES_OP_QLinearAveragePool:
    return input_dtype(f, nd, 4);
  case ES_OP_QLinearConcat:
    return input_dtype(f, nd, 1);
  case ES_OP_QLookup:
    return input_dtype(f, nd, 0);
  case ES_OP_Cast:
    return es__fz_attr_int(nd, "to", 0, &to) && es_dtype_size((es_dtype)to) ? (es_dtype)to
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
    return es__fz_ew_dtype(nd, x->dt);
  }
}

#define QCAT_MAX 64

/* Output shapes of one node from its inputs'. */
static void shape_node(fuser *f, const es_node *nd) {
  sshape x, b, o;
  es__fz_shape_of(f, nd->n_in > 0 ? nd->in[0] : -1, &x);
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
    es__fz_shape_of(f, nd->n_in > 1 ? nd->in[1] : -1, &b);
    shape_broadcast(f, &x, &b, &o);
    break;
  case ES_OP_Conv:
  case ES_OP_ConvInteger:
  case ES_OP_QLinearConv: {
    int wi = nd->op == ES_OP_QLinearConv ? 3 : 1;
    int w = nd->n_in > wi ? nd->in[wi] : -1;
    if (x.rank < 0 && es__fz_is_const(f->g, w))
      shape_fresh(f, &x, f->g->values[w].rank);
    if (es__fz_is_const(f->g, w) && f->g->values[w].rank == x.rank)
      shape_window(f, nd, &x, f->g->values[w].dims[0], f->g->values[w].dims + 2, 0, &o);
    break;
  }
  case ES_OP_ConvTranspose:
  case ES_OP_QLinearConvTranspose:
    shape_conv_transpose(f, nd, nd->op == ES_OP_ConvTranspose ? 1 : 3, &x, &o);
    break;
  case ES_OP_MaxPool:
  case ES_OP_AveragePool:
  case ES_OP_QLinearAveragePool:
    if (x.rank >= 3)
      shape_window(f, nd, &x, x.d[1], NULL, 1, &o);
    break;
  case ES_OP_GlobalAveragePool:
    o = x;
    for (int i = 2; i < o.rank; i++)
      o.d[i] = 1;
    break;
  case ES_OP_QLinearGlobalAveragePool: { /* channels_last 1: [N, spatial..., C] */
    int64_t last = 0;
    o = x;
    if (!es__fz_attr_int(nd, "channels_last", 0, &last)) {
      o.rank = -1;
      break;
    }
    for (int i = last ? 1 : 2; i < o.rank - (last ? 1 : 0); i++)
      o.d[i] = 1;
    break;
  }
  case ES_OP_QLinearAdd:
  case ES_OP_QLinearMul:
    es__fz_shape_of(f, nd->n_in > 3 ? nd->in[3] : -1, &b);
    shape_broadcast(f, &x, &b, &o);
    break;
  case ES_OP_QLinearSigmoid:
  case ES_OP_QLookup:
    o = x;
    break;
  case ES_OP_QLinearConcat: { /* y_scale, y_zero_point, then (x, scale, zero point)... */
    int n = (nd->n_in - 2) / 3;
    if (n < 1 || n > QCAT_MAX) {
      o.rank = -1;
      break;
    }
    es_node view = *nd;
    int xs[QCAT_MAX];
    for (int i = 0; i < n; i++)
      xs[i] = nd->in[2 + 3 * i];
    view.in = xs;
    view.n_in = n;
    shape_concat(f, &view, &o);
    break;
  }
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
  case ES_OP_MatMulInteger:
    es__fz_shape_of(f, nd->n_in > 1 ? nd->in[1] : -1, &b);
    shape_matmul(f, &x, &b, &o);
    break;
  case ES_OP_QLinearMatMul: {
    es__fz_shape_of(f, nd->n_in > 3 ? nd->in[3] : -1, &b);
    int64_t tb = 0;
    if (es__fz_attr_int(nd, "_transB", 0, &tb) && tb && b.rank == 2) { /* B is [N, K] */
      int64_t d0 = b.d[0];
      b.d[0] = b.d[1];
      b.d[1] = d0;
    }
    shape_matmul(f, &x, &b, &o);
    break;
  }
  case ES_OP_QuantizeLinear:
  case ES_OP_DequantizeLinear:
  case ES_OP_DynamicQuantizeLinear:
    o = x;
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
    o.d[0] = x.rank >= 0 && !es__node_attr(nd, "start") && !es__node_attr(nd, "end")
                 ? x.rank
                 : sym_fresh(f);
    break;
  case ES_OP_Slice:
  case ES_OP_Pad:
  case ES_OP_Split:
    shape_fresh(f, &o, x.rank);
    break;
  default:
    if (es__fz_ew_shape(nd) == 1) {
      o = x;
    } else if (es__fz_ew_shape(nd) == 2) {
      es__fz_shape_of(f, nd->n_in > 1 ? nd->in[1] : -1, &b);
      shape_broadcast(f, &x, &b, &o);
    }
    break;
  }
  o.dt = node_dtype(f, nd, &x);
  for (int i = 0; i < o.rank; i++)
    if (o.d[i] >= DIM_MAX)
      o.d[i] = sym_fresh(f);
  for (int k = 0; k < nd->n_out; k++) {
    int v = nd->out[k];
    if (v < 0 || v >= f->n_shape)
      continue;
    if (k == 0) {
      f->shape[v] = o;
    } else if (nd->op == ES_OP_DynamicQuantizeLinear) { /* scalar scale, zero point */
      f->shape[v].rank = 0;
      f->shape[v].dt = k == 1 ? ES_DTYPE_FLOAT : ES_DTYPE_UINT8;
    } else {
      shape_fresh(f, &f->shape[v], nd->op == ES_OP_Split ? x.rank : -1);
      f->shape[v].dt = nd->op == ES_OP_Split ? x.dt : ES_DTYPE_UNDEFINED;
    }
  }
}

int es__fuse_shapes(fuser *f) {
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
