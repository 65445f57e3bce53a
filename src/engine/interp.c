/* Running nodes without a plan: what no bound covers.
 *
 * A plan places every tensor before a request runs, which needs each
 * tensor's size, or a bound on it, from shapes, attributes and constants.
 * Some models give none: a Loop whose carried values grow each iteration
 * (torchvision's Keypoint and Mask R-CNN append one detection's result per
 * iteration), a Resize to sizes computed from the pixels. Those nodes, and
 * every node after them, are interpreted here: each is inferred for the
 * actual shapes of its inputs when the request reaches it, its parameters,
 * outputs and scratch are taken from the run's heap (es_run_heap: the
 * buddy pool charged to the request's admission in the runtime, so a
 * request that cannot grow is refused with 503, never meeting a failed
 * malloc), and each value goes back to the heap after its last reader.
 *
 * A program (es_iprog) is a list of nodes over numbered slots: a Loop or
 * Scan body's graph as loaded (slots are its values), or the tail of a
 * plan (the planner renumbers the nodes it could not place). Loop and
 * Scan run their body once per iteration as such a program; the body's
 * own Ifs are inlined as in the main graph, their guards checked here.
 *
 * Kernels are the planned ones. Every input is handed in as known data
 * (in_static): the values are all there, so a node that needs one as a
 * size (Reshape's shape, Resize's sizes) has it. Prepared weights are made
 * in the node's parameters, not in the model's store, whose entries are
 * keyed by node and would outlive the data they were made from. Kernels
 * see plain layouts only. Not thread-safe per program run; a program is
 * only read, so any number of runs may share it. */
#include "common/internal.h"
#include "edgeserve/memory.h"
#include "engine/engine_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Parameters start in a region this large and double while a kernel's
 * infer finds it too small. */
#define IP_CTX_FIRST 16384
#define IP_CTX_MAX ((size_t)1 << 31)

int es__ip_alloc(const es_interp *I, size_t bytes, void **out) {
  *out = NULL;
  if (bytes == 0)
    bytes = 1;
  int rc = I->heap->alloc(I->heap->user, bytes, out);
  if (rc < 0)
    return rc;
  if (!*out)
    return es__fail(ES_ECORRUPT, "the run's heap returned no block and no error");
  if ((uintptr_t)*out % 64) {
    I->heap->free(I->heap->user, *out);
    *out = NULL;
    return es__fail(ES_ECORRUPT, "the run's heap returned a block not 64-byte aligned");
  }
  return 0;
}

void es__ip_free(const es_interp *I, void *p, size_t bytes) {
  (void)bytes;
  if (p)
    I->heap->free(I->heap->user, p);
}

void es__ival_drop(const es_interp *I, es_ival *v) {
  if (v->own)
    es__ip_free(I, v->own, v->own_bytes);
  memset(v, 0, sizeof *v);
}

/* A value of the heap's own holding t's bytes (a value read from
 * elsewhere that must outlive where it lives). */
static int ival_copy(const es_interp *I, const es_ival *src, es_ival *dst) {
  es_ival c = {.desc = src->desc};
  int rc = es__ip_alloc(I, src->desc.nbytes, &c.own);
  if (rc < 0)
    return rc;
  c.own_bytes = src->desc.nbytes ? src->desc.nbytes : 1;
  if (src->desc.nbytes)
    memcpy(c.own, src->data, src->desc.nbytes);
  c.data = c.own;
  *dst = c;
  return 0;
}

/* dst takes src's value and its block (src keeps a view, owning nothing);
 * what dst held goes back first. */
static void ival_move(const es_interp *I, es_ival *dst, es_ival *src) {
  es__ival_drop(I, dst);
  *dst = *src;
  src->own = NULL;
}

int es__ival_own(const es_interp *I, es_ival *v) {
  return v->own ? 0 : ival_copy(I, v, v);
}

/* ---- a counting heap over es_mem ------------------------------------------- */

#define MH_HEADER 64 /* keeps the block 64-byte aligned */

static int mem_heap_alloc(void *user, size_t bytes, void **out) {
  es_mem_heap *h = user;
  if (h->limit && (bytes > h->limit || h->cur > h->limit - bytes)) {
    h->refusals++;
    return es__fail(ES_EAGAIN, "the run heap's limit of %zu B is reached (%zu B out, %zu B asked)",
                    h->limit, h->cur, bytes);
  }
  if (bytes > SIZE_MAX - MH_HEADER)
    return es__fail(ES_ENOMEM, "a run heap block of %zu B", bytes);
  unsigned char *b = es_mem_aligned_alloc(ES_MEM_ENGINE, 64, bytes + MH_HEADER);
  if (!b)
    return es__fail(ES_ENOMEM, "out of memory for %zu bytes a run takes beyond its plan", bytes);
  memcpy(b, &bytes, sizeof bytes);
  h->cur += bytes;
  if (h->cur > h->peak)
    h->peak = h->cur;
  *out = b + MH_HEADER;
  return 0;
}

static void mem_heap_free(void *user, void *ptr) {
  es_mem_heap *h = user;
  unsigned char *b = (unsigned char *)ptr - MH_HEADER;
  size_t bytes;
  memcpy(&bytes, b, sizeof bytes);
  h->cur -= bytes;
  es_mem_free(b);
}

es_run_heap es_mem_heap_make(es_mem_heap *state) {
  es_run_heap h = {mem_heap_alloc, mem_heap_free, state};
  return h;
}

/* ---- one node ---------------------------------------------------------------- */

static int run_kernel(const es_interp *I, const es_node *nd, es_ival *vals) {
  const es_kernel *kern = es__kernel_for(nd->op);
  char label[120];
  es__node_label(nd, label, sizeof label);
  if (!kern)
    return es__fail(ES_ENOTSUP, "%s: no kernel for this operator", label);
  const es_tdesc *ind[ES_IP_MAX_IO];
  const void *ins[ES_IP_MAX_IO];
  es_tdesc outd[ES_IP_MAX_IO];
  es_tdesc *outp[ES_IP_MAX_IO];
  void *outs[ES_IP_MAX_IO];
  size_t out_bytes[ES_IP_MAX_IO];
  if (nd->n_in > ES_IP_MAX_IO || nd->n_out > ES_IP_MAX_IO)
    return es__fail(ES_ENOTSUP, "%s: more than %d inputs or outputs", label, ES_IP_MAX_IO);
  for (int i = 0; i < nd->n_in; i++) {
    const es_ival *v = nd->in[i] >= 0 ? &vals[nd->in[i]] : NULL;
    /* a value not made (an If branch not taken) is an omitted input */
    ind[i] = v && v->data ? &v->desc : NULL;
    ins[i] = v && v->data ? v->data : NULL;
    if (ind[i] && ind[i]->layout != ES_LAYOUT_PLAIN)
      return es__fail(ES_ECORRUPT, "%s: input %d is not in plain order", label, i);
  }
  for (int o = 0; o < nd->n_out; o++) {
    memset(&outd[o], 0, sizeof outd[o]);
    outp[o] = nd->out[o] >= 0 ? &outd[o] : NULL;
    outs[o] = NULL;
    out_bytes[o] = 0;
  }
  es_ctx ctx;
  void *region = NULL;
  size_t region_bytes = IP_CTX_FIRST;
  es_kinst k;
  int rc;
  for (;;) {
    if ((rc = es__ip_alloc(I, region_bytes, &region)) < 0)
      return rc;
    es__ctx_init_fixed(&ctx, region, region_bytes);
    memset(&k, 0, sizeof k);
    k.node = es__knode_of(nd);
    k.opset = I->opset;
    k.n_in = nd->n_in;
    k.n_out = nd->n_out;
    k.in = ind;
    k.out = outp;
    k.in_static = ins;
    k.inplace = -1;
    k.ctx = &ctx;
    memcpy(k.label, label, sizeof label);
    rc = kern->infer(&k);
    if (rc == ES_ENOMEM && ctx.exhausted && region_bytes < IP_CTX_MAX) {
      if (kern->release)
        kern->release(&k);
      es__ip_free(I, region, region_bytes);
      region = NULL;
      region_bytes *= 2;
      continue;
    }
    break;
  }
  void *scratch = NULL;
  if (rc == ES_KRELAYOUT)
    rc = es__fail(ES_ENOTSUP, "%s: wants its inputs in another layout, which a part of the "
                  "model run without a plan does not convert", label);
  for (int o = 0; rc == 0 && o < nd->n_out; o++)
    if (outp[o] && (outd[o].dtype == ES_DTYPE_UNDEFINED || outd[o].layout != ES_LAYOUT_PLAIN))
      rc = es__fail(ES_ENOTSUP, "%s: output %d has no type or is not in plain order", label, o);
  if (rc == 0)
    rc = es__ip_alloc(I, k.scratch_bytes, &scratch);
  for (int o = 0; rc == 0 && o < nd->n_out; o++) {
    if (!outp[o])
      continue;
    out_bytes[o] = outd[o].nbytes ? outd[o].nbytes : 1;
    rc = es__ip_alloc(I, out_bytes[o], &outs[o]);
  }
  if (rc == 0) {
    /* an output a bounded kernel shrinks keeps its block's size */
    rc = kern->run(&k, ins, outs, scratch);
  }
  if (kern->release)
    kern->release(&k);
  es__ip_free(I, scratch, k.scratch_bytes);
  es__ip_free(I, region, region_bytes);
  for (int o = 0; o < nd->n_out; o++) {
    if (!outs[o])
      continue;
    if (rc < 0) {
      es__ip_free(I, outs[o], out_bytes[o]);
      continue;
    }
    es_ival *v = &vals[nd->out[o]];
    es__ival_drop(I, v);
    v->desc = outd[o];
    v->data = outs[o];
    v->own = outs[o];
    v->own_bytes = out_bytes[o];
  }
  return rc;
}

/* 1 when nd runs: every guard holds and no input comes from a node that
 * did not run (an If branch not taken), an If merge's branch inputs
 * excepted. */
static int node_runs(const es_iprog *P, const es_node *nd, const es_ival *vals) {
  for (int i = 0; i < nd->n_guard; i++) {
    int id = abs(nd->guard[i]);
    int c = id <= P->max_if && P->if_cond ? P->if_cond[id] : -1;
    if (c < 0)
      continue;
    const es_ival *cv = &vals[c];
    if (!cv->data)
      return 0;
    if ((*(const uint8_t *)cv->data != 0) != (nd->guard[i] > 0))
      return 0;
  }
  if (nd->op == ES_OP_If)
    return 1;
  for (int i = 0; i < nd->n_in; i++)
    if (nd->in[i] >= 0 && !vals[nd->in[i]].data)
      return 0;
  return 1;
}

int es__iprog_run(const es_interp *I, const es_iprog *P, es_ival *vals) {
  for (int n = 0; n < P->n_nodes; n++) {
    const es_node *nd = P->list ? P->list[n] : &P->nodes[n];
    int rc = 0;
    if (node_runs(P, nd, vals)) {
      if (nd->op == ES_OP_Loop && nd->body)
        rc = es__interp_loop(I, nd, vals);
      else if (nd->op == ES_OP_Scan && nd->body)
        rc = es__interp_scan(I, nd, vals);
      else
        rc = run_kernel(I, nd, vals);
    }
    if (rc < 0)
      return rc;
    /* values whose last reader this was go back to the heap */
    for (int i = 0; i < nd->n_in; i++) {
      int v = nd->in[i];
      if (v >= 0 && P->last[v] == n)
        es__ival_drop(I, &vals[v]);
    }
    for (int i = 0; i < nd->n_guard; i++) {
      int id = abs(nd->guard[i]);
      int c = id <= P->max_if && P->if_cond ? P->if_cond[id] : -1;
      if (c >= 0 && P->last[c] == n)
        es__ival_drop(I, &vals[c]);
    }
    for (int o = 0; o < nd->n_out; o++) {
      int v = nd->out[o];
      if (v >= 0 && P->last[v] < 0)
        es__ival_drop(I, &vals[v]); /* nothing reads it */
    }
  }
  return 0;
}

void es__iprog_drop_all(const es_interp *I, const es_iprog *P, es_ival *vals) {
  for (int v = 0; v < P->n_slots; v++)
    es__ival_drop(I, &vals[v]);
}

/* ---- bodies ------------------------------------------------------------------ */

/* Runs body b once: its inputs in[0..n_in) (borrowed: the caller keeps
 * them alive), its outputs left in out[] owned by the caller. */
static int body_run(const es_interp *I, const es_graph *b, const es_ival *in, int n_in,
                    es_ival *out) {
  const es_iprog *P = b->prog;
  if (!P)
    return es__fail(ES_ECORRUPT, "a body without its program (the model was not lowered)");
  es_ival *vals;
  size_t vb = (size_t)P->n_slots * sizeof *vals;
  int rc = es__ip_alloc(I, vb, (void **)&vals);
  if (rc < 0)
    return rc;
  memset(vals, 0, vb ? vb : 1);
  for (int v = 0; v < b->n_values; v++)
    if (b->values[v].kind == ES_VALUE_CONST && b->values[v].data) {
      const es_value *c = &b->values[v];
      es__tdesc_set(&vals[v].desc, c->dtype, c->rank, c->dims);
      vals[v].data = c->data;
    }
  for (int i = 0; i < n_in && i < b->n_inputs; i++) {
    es_ival *v = &vals[b->inputs[i]];
    v->desc = in[i].desc;
    v->data = in[i].data;
    v->own = NULL; /* borrowed */
  }
  rc = es__iprog_run(I, P, vals);
  for (int o = 0; rc == 0 && o < b->n_outputs; o++) {
    es_ival *v = &vals[b->outputs[o]];
    if (!v->data) {
      rc = es__fail(ES_EMODEL, "the body's output '%.80s' was not computed",
                    b->values[b->outputs[o]].name);
      break;
    }
    /* an output listed twice, or read from outside the body, is copied */
    if (!v->own)
      rc = ival_copy(I, v, &out[o]);
    else
      ival_move(I, &out[o], v);
  }
  if (rc < 0)
    for (int o = 0; o < b->n_outputs; o++)
      es__ival_drop(I, &out[o]);
  es__iprog_drop_all(I, P, vals);
  es__ip_free(I, vals, vb);
  return rc;
}

/* A stack of per-iteration outputs along axis 0, grown by doubling. */
typedef struct stack {
  es_tdesc item;
  int n;
  unsigned char *buf;
  size_t used, cap;
} stack;

static int stack_push(const es_interp *I, stack *s, const es_ival *v, const char *label, int k) {
  if (s->n == 0) {
    s->item = v->desc;
  } else if (!es__tdesc_same_shape(&s->item, &v->desc) || s->item.dtype != v->desc.dtype) {
    return es__fail(ES_EMODEL, "%s: scan output %d changes shape or type between iterations",
                    label, k);
  }
  size_t need = s->used + v->desc.nbytes;
  if (need > s->cap) {
    size_t nc = s->cap ? s->cap * 2 : 256;
    while (nc < need)
      nc *= 2;
    void *nb;
    int rc = es__ip_alloc(I, nc, &nb);
    if (rc < 0)
      return rc;
    if (s->used)
      memcpy(nb, s->buf, s->used);
    es__ip_free(I, s->buf, s->cap);
    s->buf = nb;
    s->cap = nc;
  }
  if (v->desc.nbytes)
    memcpy(s->buf + s->used, v->data, v->desc.nbytes);
  s->used = need;
  s->n++;
  return 0;
}

/* The stacked tensor as a value: [n, item dims...] (with no iteration,
 * [0] and the type the body declares). */
static int stack_take(const es_interp *I, stack *s, const es_value *declared, es_ival *out) {
  int64_t dims[ES_MAX_RANK];
  es_dtype dt;
  int rank;
  if (s->n == 0) {
    dt = declared->dtype != ES_DTYPE_UNDEFINED ? declared->dtype : ES_DTYPE_FLOAT;
    rank = declared->rank >= 0 && declared->rank < ES_MAX_RANK ? declared->rank + 1 : 1;
    for (int d = 0; d < rank; d++)
      dims[d] = d > 0 && declared->dims[d - 1] > 0 ? declared->dims[d - 1] : 0;
  } else {
    dt = s->item.dtype;
    rank = s->item.rank + 1;
    if (rank > ES_MAX_RANK)
      return es__fail(ES_ENOTSUP, "a scan output of rank %d is above the maximum %d", rank,
                      ES_MAX_RANK);
    dims[0] = s->n;
    for (int d = 0; d < s->item.rank; d++)
      dims[d + 1] = s->item.dims[d];
  }
  memset(out, 0, sizeof *out);
  int rc = es__tdesc_set(&out->desc, dt, rank, dims);
  if (rc < 0)
    return rc;
  if (!s->buf && (rc = es__ip_alloc(I, 1, (void **)&s->buf)) == 0)
    s->cap = 1;
  if (rc < 0)
    return rc;
  out->data = out->own = s->buf;
  out->own_bytes = s->cap;
  s->buf = NULL;
  s->cap = s->used = 0;
  return 0;
}

static int64_t scalar_i64(const es_ival *v) {
  if (v->desc.dtype == ES_DTYPE_INT32)
    return *(const int32_t *)v->data;
  return *(const int64_t *)v->data;
}

int es__interp_loop(const es_interp *I, const es_node *nd, es_ival *vals) {
  const es_graph *b = nd->body;
  char label[120];
  es__node_label(nd, label, sizeof label);
  int n_carry = nd->n_in - 2 - nd->n_capture;
  int n_scan = b->n_outputs - 1 - n_carry;
  if (n_carry < 0 || n_scan < 0 || b->n_inputs != 2 + n_carry + nd->n_capture ||
      nd->n_out > n_carry + n_scan)
    return es__fail(ES_EMODEL, "%s: its body takes %d inputs and gives %d outputs for %d carried "
                    "values", label, b->n_inputs - nd->n_capture, b->n_outputs,
                    n_carry < 0 ? 0 : n_carry);
  int64_t trips = INT64_MAX;
  uint8_t cond = 1;
  if (nd->in[0] >= 0) {
    const es_ival *m = &vals[nd->in[0]];
    if (!m->data || (m->desc.dtype != ES_DTYPE_INT64 && m->desc.dtype != ES_DTYPE_INT32) ||
        m->desc.count != 1)
      return es__fail(ES_EMODEL, "%s: M must be one int64", label);
    trips = scalar_i64(m);
  }
  if (nd->n_in > 1 && nd->in[1] >= 0) {
    const es_ival *c = &vals[nd->in[1]];
    if (!c->data || c->desc.dtype != ES_DTYPE_BOOL || c->desc.count != 1)
      return es__fail(ES_EMODEL, "%s: cond must be one bool", label);
    cond = *(const uint8_t *)c->data != 0;
  }
  es_ival carry[ES_IP_MAX_CARRY], in[ES_IP_MAX_CARRY + 2], out[ES_IP_MAX_CARRY + 1];
  stack scans[ES_IP_MAX_CARRY];
  int n_body_in = b->n_inputs;
  if (n_body_in > ES_IP_MAX_CARRY || b->n_outputs > ES_IP_MAX_CARRY)
    return es__fail(ES_ENOTSUP, "%s: more than %d body inputs or outputs", label,
                    ES_IP_MAX_CARRY);
  memset(carry, 0, sizeof carry);
  memset(scans, 0, sizeof scans);
  for (int k = 0; k < n_carry; k++) {
    const es_ival *v = &vals[nd->in[2 + k]];
    if (nd->in[2 + k] < 0 || !v->data)
      return es__fail(ES_EMODEL, "%s: carried value %d has no initial value", label, k);
    carry[k] = *v;
    carry[k].own = NULL; /* borrowed until the first iteration replaces it */
  }
  int64_t iv = 0;
  int rc = 0;
  for (; iv < trips && cond; iv++) {
    int64_t iter = iv;
    uint8_t cin = cond;
    memset(in, 0, sizeof(es_ival) * (size_t)n_body_in);
    memset(out, 0, sizeof(es_ival) * (size_t)b->n_outputs);
    es__tdesc_set(&in[0].desc, ES_DTYPE_INT64, 0, NULL);
    in[0].data = &iter;
    es__tdesc_set(&in[1].desc, ES_DTYPE_BOOL, 0, NULL);
    in[1].data = &cin;
    for (int k = 0; k < n_carry; k++)
      in[2 + k] = carry[k];
    for (int j = 0; j < nd->n_capture; j++)
      in[2 + n_carry + j] = vals[nd->in[2 + n_carry + j]];
    if ((rc = body_run(I, b, in, n_body_in, out)) < 0)
      break;
    const es_ival *co = &out[0];
    if (co->desc.dtype != ES_DTYPE_BOOL || co->desc.count != 1) {
      rc = es__fail(ES_EMODEL, "%s: the body's condition output must be one bool", label);
    } else {
      cond = *(const uint8_t *)co->data != 0;
      for (int k = 0; k < n_carry; k++)
        ival_move(I, &carry[k], &out[1 + k]);
      for (int s = 0; rc == 0 && s < n_scan; s++)
        rc = stack_push(I, &scans[s], &out[1 + n_carry + s], label, s);
    }
    for (int o = 0; o < b->n_outputs; o++)
      es__ival_drop(I, &out[o]);
    if (rc < 0)
      break;
  }
  for (int k = 0; rc == 0 && k < n_carry; k++)
    rc = es__ival_own(I, &carry[k]); /* no iteration ran: the initial value, copied */
  for (int o = 0; rc == 0 && o < nd->n_out; o++) {
    int v = nd->out[o];
    if (v < 0)
      continue;
    if (o < n_carry) {
      ival_move(I, &vals[v], &carry[o]);
    } else {
      es__ival_drop(I, &vals[v]);
      rc = stack_take(I, &scans[o - n_carry], &b->values[b->outputs[1 + o]], &vals[v]);
    }
  }
  for (int k = 0; k < n_carry; k++)
    es__ival_drop(I, &carry[k]);
  for (int s = 0; s < n_scan; s++)
    es__ip_free(I, scans[s].buf, scans[s].cap);
  return rc;
}

/* ---- Scan ---------------------------------------------------------------------- */

/* Copies slice t along axis ax of x into dst. */
static void slice_axis(const es_tdesc *x, const void *data, int ax, int64_t t, void *dst) {
  size_t es = es_dtype_size(x->dtype);
  size_t outer = 1, inner = es;
  for (int d = 0; d < ax; d++)
    outer *= (size_t)x->dims[d];
  for (int d = ax + 1; d < x->rank; d++)
    inner *= (size_t)x->dims[d];
  const unsigned char *s = data;
  unsigned char *o = dst;
  for (size_t i = 0; i < outer; i++)
    memcpy(o + i * inner, s + (i * (size_t)x->dims[ax] + (size_t)t) * inner, inner);
}

/* Writes item (the shape of y without axis ax) as slice t along ax of y. */
static void place_axis(const es_tdesc *y, void *ydata, int ax, int64_t t, const void *item) {
  size_t es = es_dtype_size(y->dtype);
  size_t outer = 1, inner = es;
  for (int d = 0; d < ax; d++)
    outer *= (size_t)y->dims[d];
  for (int d = ax + 1; d < y->rank; d++)
    inner *= (size_t)y->dims[d];
  unsigned char *o = ydata;
  const unsigned char *s = item;
  for (size_t i = 0; i < outer; i++)
    memcpy(o + (i * (size_t)y->dims[ax] + (size_t)t) * inner, s + i * inner, inner);
}

static int attr_ints_n(const es_node *nd, const char *name, int n, int64_t *out, int64_t def,
                       const char *label) {
  const es_attr *a = es__node_attr(nd, name);
  for (int i = 0; i < n; i++)
    out[i] = def;
  if (!a)
    return 0;
  if (a->type != ES_ATTR_INTS || (int)a->n != n)
    return es__fail(ES_EMODEL, "%s: attribute '%s' must hold %d ints", label, name, n);
  for (int i = 0; i < n; i++)
    out[i] = a->ints[i];
  return 0;
}

int es__interp_scan(const es_interp *I, const es_node *nd, es_ival *vals) {
  const es_graph *b = nd->body;
  char label[120];
  es__node_label(nd, label, sizeof label);
  const es_attr *ns = es__node_attr(nd, "num_scan_inputs");
  if (!ns || ns->type != ES_ATTR_INT)
    return es__fail(ES_EMODEL, "%s: needs the attribute num_scan_inputs", label);
  int n_own = nd->n_in - nd->n_capture;
  int m = (int)ns->i;
  int n_state = n_own - m;
  int n_sout = b->n_outputs - n_state;
  if (m < 1 || n_state < 0 || n_sout < 0 || b->n_inputs != n_own + nd->n_capture ||
      b->n_inputs > ES_IP_MAX_CARRY || b->n_outputs > ES_IP_MAX_CARRY ||
      nd->n_out > b->n_outputs)
    return es__fail(ES_EMODEL, "%s: %d scan inputs, %d inputs, a body of %d inputs and %d "
                    "outputs do not agree", label, m, n_own, b->n_inputs, b->n_outputs);
  int64_t in_dir[ES_IP_MAX_CARRY], in_ax[ES_IP_MAX_CARRY], out_dir[ES_IP_MAX_CARRY],
      out_ax[ES_IP_MAX_CARRY];
  int rc;
  if ((rc = attr_ints_n(nd, "scan_input_directions", m, in_dir, 0, label)) < 0 ||
      (rc = attr_ints_n(nd, "scan_input_axes", m, in_ax, 0, label)) < 0 ||
      (rc = attr_ints_n(nd, "scan_output_directions", n_sout, out_dir, 0, label)) < 0 ||
      (rc = attr_ints_n(nd, "scan_output_axes", n_sout, out_ax, 0, label)) < 0)
    return rc;
  int64_t T = -1;
  for (int j = 0; j < m; j++) {
    const es_ival *x = &vals[nd->in[n_state + j]];
    if (nd->in[n_state + j] < 0 || !x->data)
      return es__fail(ES_EMODEL, "%s: scan input %d is missing", label, j);
    int r = x->desc.rank;
    if (in_ax[j] < -r || in_ax[j] >= r)
      return es__fail(ES_EMODEL, "%s: scan input %d: axis %lld outside rank %d", label, j,
                      (long long)in_ax[j], r);
    if (in_ax[j] < 0)
      in_ax[j] += r;
    int64_t len = x->desc.dims[in_ax[j]];
    if (T >= 0 && len != T)
      return es__fail(ES_EMODEL, "%s: scan inputs of lengths %lld and %lld", label,
                      (long long)T, (long long)len);
    T = len;
  }
  es_ival state[ES_IP_MAX_CARRY], in[ES_IP_MAX_CARRY], out[ES_IP_MAX_CARRY],
      slice[ES_IP_MAX_CARRY];
  stack outs[ES_IP_MAX_CARRY];
  memset(state, 0, sizeof state);
  memset(slice, 0, sizeof slice);
  memset(outs, 0, sizeof outs);
  for (int k = 0; k < n_state; k++) {
    const es_ival *v = &vals[nd->in[k]];
    if (nd->in[k] < 0 || !v->data)
      return es__fail(ES_EMODEL, "%s: state %d has no initial value", label, k);
    state[k] = *v;
    state[k].own = NULL;
  }
  rc = 0;
  for (int j = 0; rc == 0 && j < m; j++) { /* one block per scan input, reused */
    const es_tdesc *x = &vals[nd->in[n_state + j]].desc;
    int64_t dims[ES_MAX_RANK];
    int r = 0;
    for (int d = 0; d < x->rank; d++)
      if (d != in_ax[j])
        dims[r++] = x->dims[d];
    if ((rc = es__tdesc_set(&slice[j].desc, x->dtype, r, dims)) == 0 &&
        (rc = es__ip_alloc(I, slice[j].desc.nbytes, &slice[j].own)) == 0) {
      slice[j].own_bytes = slice[j].desc.nbytes ? slice[j].desc.nbytes : 1;
      slice[j].data = slice[j].own;
    }
  }
  for (int64_t t = 0; rc == 0 && t < T; t++) {
    for (int j = 0; j < m; j++) {
      const es_ival *x = &vals[nd->in[n_state + j]];
      slice_axis(&x->desc, x->data, (int)in_ax[j], in_dir[j] ? T - 1 - t : t, slice[j].own);
    }
    memset(in, 0, sizeof(es_ival) * (size_t)b->n_inputs);
    memset(out, 0, sizeof(es_ival) * (size_t)b->n_outputs);
    for (int k = 0; k < n_state; k++)
      in[k] = state[k];
    for (int j = 0; j < m; j++) {
      in[n_state + j] = slice[j];
      in[n_state + j].own = NULL;
    }
    for (int c = 0; c < nd->n_capture; c++)
      in[n_own + c] = vals[nd->in[n_own + c]];
    if ((rc = body_run(I, b, in, b->n_inputs, out)) < 0)
      break;
    for (int k = 0; k < n_state; k++)
      ival_move(I, &state[k], &out[k]);
    for (int s = 0; rc == 0 && s < n_sout; s++)
      rc = stack_push(I, &outs[s], &out[n_state + s], label, s);
    for (int o = 0; o < b->n_outputs; o++)
      es__ival_drop(I, &out[o]);
  }
  for (int k = 0; rc == 0 && k < n_state; k++)
    rc = es__ival_own(I, &state[k]);
  for (int o = 0; rc == 0 && o < nd->n_out; o++) {
    int v = nd->out[o];
    if (v < 0)
      continue;
    if (o < n_state) {
      ival_move(I, &vals[v], &state[o]);
      continue;
    }
    es__ival_drop(I, &vals[v]);
    int s = o - n_state;
    es_ival st;
    if ((rc = stack_take(I, &outs[s], &b->values[b->outputs[o]], &st)) < 0)
      break;
    /* stacked along axis 0 in iteration order: move the axis and reverse
     * as the attributes ask */
    int r = st.desc.rank;
    int64_t ax = out_ax[s] < 0 ? out_ax[s] + r : out_ax[s];
    if (ax < 0 || ax >= r) {
      es__ival_drop(I, &st);
      rc = es__fail(ES_EMODEL, "%s: scan output %d: axis %lld outside rank %d", label, s,
                    (long long)out_ax[s], r);
      break;
    }
    if (ax == 0 && !out_dir[s]) {
      vals[v] = st;
      continue;
    }
    int64_t dims[ES_MAX_RANK];
    for (int d = 0, q = 1; d < r; d++)
      dims[d] = d == ax ? st.desc.dims[0] : st.desc.dims[q++];
    es_ival y = {0};
    if ((rc = es__tdesc_set(&y.desc, st.desc.dtype, r, dims)) == 0 &&
        (rc = es__ip_alloc(I, y.desc.nbytes, &y.own)) == 0) {
      y.own_bytes = y.desc.nbytes ? y.desc.nbytes : 1;
      y.data = y.own;
      size_t item = st.desc.dims[0] ? st.desc.nbytes / (size_t)st.desc.dims[0] : 0;
      for (int64_t t = 0; t < st.desc.dims[0]; t++)
        place_axis(&y.desc, y.own, (int)ax, out_dir[s] ? st.desc.dims[0] - 1 - t : t,
                   (const unsigned char *)st.data + (size_t)t * item);
      vals[v] = y;
    }
    es__ival_drop(I, &st);
  }
  for (int k = 0; k < n_state; k++)
    es__ival_drop(I, &state[k]);
  for (int j = 0; j < m; j++)
    es__ival_drop(I, &slice[j]);
  for (int s = 0; s < n_sout; s++)
    es__ip_free(I, outs[s].buf, outs[s].cap);
  return rc;
}

/* ---- checks while planning -------------------------------------------------- */

int es__body_check(const es_node *nd) {
  const es_graph *b = nd->body;
  char label[120];
  es__node_label(nd, label, sizeof label);
  int n_own = nd->n_in - nd->n_capture;
  if (b->n_inputs != nd->n_in)
    return es__fail(ES_EMODEL, "%s: %d inputs for a body of %d (with %d captured)", label,
                    n_own, b->n_inputs - nd->n_capture, nd->n_capture);
  if (b->n_inputs > ES_IP_MAX_CARRY || b->n_outputs > ES_IP_MAX_CARRY)
    return es__fail(ES_ENOTSUP, "%s: a body of more than %d inputs or outputs", label,
                    ES_IP_MAX_CARRY);
  if (nd->op == ES_OP_Loop) {
    int n_carry = n_own - 2;
    if (n_carry < 0 || b->n_outputs < 1 + n_carry || nd->n_out > b->n_outputs - 1)
      return es__fail(ES_EMODEL, "%s: a body of %d inputs and %d outputs for %d carried values "
                      "and %d outputs", label, b->n_inputs - nd->n_capture, b->n_outputs,
                      n_carry < 0 ? 0 : n_carry, nd->n_out);
    return 0;
  }
  const es_attr *ns = es__node_attr(nd, "num_scan_inputs");
  if (!ns || ns->type != ES_ATTR_INT || ns->i < 1 || ns->i > n_own)
    return es__fail(ES_EMODEL, "%s: num_scan_inputs must be in [1, %d]", label, n_own);
  int n_state = n_own - (int)ns->i;
  if (b->n_outputs < n_state || nd->n_out > b->n_outputs)
    return es__fail(ES_EMODEL, "%s: a body of %d outputs for %d states and %d outputs", label,
                    b->n_outputs, n_state, nd->n_out);
  return 0;
}

/* ---- programs from graphs -------------------------------------------------------- */

int es__iprog_last_uses(const es_node *const *list, const es_node *nodes, int n, int n_slots,
                        const int *if_cond, int max_if, const int *kept, int n_kept, int *last) {
  for (int v = 0; v < n_slots; v++)
    last[v] = -1;
  for (int i = 0; i < n; i++) {
    const es_node *nd = list ? list[i] : &nodes[i];
    for (int k = 0; k < nd->n_in; k++)
      if (nd->in[k] >= 0 && nd->in[k] < n_slots)
        last[nd->in[k]] = i;
    for (int k = 0; k < nd->n_guard; k++) {
      int id = abs(nd->guard[k]);
      int c = id <= max_if && if_cond ? if_cond[id] : -1;
      if (c >= 0 && c < n_slots)
        last[c] = i;
    }
  }
  for (int i = 0; i < n_kept; i++)
    if (kept[i] >= 0 && kept[i] < n_slots)
      last[kept[i]] = ES_IP_KEEP;
  return 0;
}

int es__graph_prog_make(es_graph *g) {
  es_iprog *P = es__ctx_alloc(&g->ctx, sizeof *P);
  int *last = es__ctx_alloc(&g->ctx, ((size_t)g->n_values + 1) * sizeof *last);
  if (!P || !last)
    return es__fail(ES_ENOMEM, "out of memory loading the model");
  int max_if = -1;
  int *cond = es__graph_if_conds(g, &max_if);
  int *c2 = NULL;
  if (cond) {
    c2 = es__ctx_alloc(&g->ctx, ((size_t)max_if + 1) * sizeof *c2);
    if (c2)
      memcpy(c2, cond, ((size_t)max_if + 1) * sizeof *c2);
    es_mem_free(cond);
    if (!c2)
      return es__fail(ES_ENOMEM, "out of memory loading the model");
  }
  P->nodes = g->nodes;
  P->n_nodes = g->n_nodes;
  P->n_slots = g->n_values;
  P->if_cond = c2;
  P->max_if = c2 ? max_if : -1;
  es__iprog_last_uses(NULL, g->nodes, g->n_nodes, g->n_values, c2, P->max_if, g->outputs,
                      g->n_outputs, last);
  /* values from outside (inputs, constants) are never the program's to free */
  P->last = last;
  g->prog = P;
  return 0;
}

int es__graph_progs_make(es_graph *g) {
  for (int i = 0; i < g->n_bodies; i++) {
    int rc = es__graph_prog_make(g->bodies[i]);
    if (rc == 0)
      rc = es__graph_progs_make(g->bodies[i]);
    if (rc < 0)
      return rc;
  }
  return 0;
}
