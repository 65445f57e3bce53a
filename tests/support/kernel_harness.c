/* The kernel tests' harness (kernel_harness.h). An instance made by hand
 * follows the planner's contract in kernel.h: outputs and scratch 64-byte
 * aligned and never NULL, in_static for what is known while planning, one
 * round of relayout requests, release before the plan memory goes. */
#include "es_test.h"

#include <string.h>

#include "support/kernel_harness.h"

/* ---- nodes ---------------------------------------------------------------- */

void kh_node_init(kh_node *t, es_op op) {
  memset(t, 0, sizeof *t);
  t->node = kh_knode(op, t->attrs, 0);
}

es_knode kh_knode(es_op op, const es_attr *attrs, int n_attr) {
  return (es_knode){.name = "t", .op = op, .id = 7, .attrs = attrs, .n_attr = n_attr};
}

es_attr *kh_attr_add(kh_node *t, const char *name, es_attr_type type) {
  assert_true(t->node.n_attr < KH_MAX_ATTRS);
  es_attr *a = &t->attrs[t->node.n_attr++];
  *a = (es_attr){.name = name, .type = type, .tensor = -1};
  return a;
}

void kh_attr_int(kh_node *t, const char *name, int64_t v) {
  kh_attr_add(t, name, ES_ATTR_INT)->i = v;
}

void kh_attr_float(kh_node *t, const char *name, float v) {
  kh_attr_add(t, name, ES_ATTR_FLOAT)->f = v;
}

void kh_attr_str(kh_node *t, const char *name, const char *s) {
  kh_attr_add(t, name, ES_ATTR_STRING)->s = s;
}

void kh_attr_ints(kh_node *t, const char *name, const int64_t *v, size_t n) {
  es_attr *a = kh_attr_add(t, name, ES_ATTR_INTS);
  a->ints = v;
  a->n = n;
}

void kh_attr_floats(kh_node *t, const char *name, const float *v, size_t n) {
  es_attr *a = kh_attr_add(t, name, ES_ATTR_FLOATS);
  a->floats = v;
  a->n = n;
}

/* ---- tensors -------------------------------------------------------------- */

es_tdesc kh_td(es_dtype dt, int rank, const int64_t *dims) {
  es_tdesc t;
  memset(&t, 0, sizeof t);
  ES_CHECK_RC(es__tdesc_set(&t, dt, rank, dims));
  return t;
}

es_tdesc kh_as_nhwc(es_tdesc t) {
  t.layout = ES_LAYOUT_NHWC;
  return t;
}

void kh_reorder4_into(void *dst, const void *src, const es_tdesc *t, int to_nhwc) {
  if (t->rank != 4 && t->rank != 5) {
    memcpy(dst, src, t->nbytes);
    return;
  }
  int64_t esz = (int64_t)es_dtype_size(t->dtype);
  int64_t n = t->dims[0], c = t->dims[1], hw = t->dims[2] * t->dims[3];
  if (t->rank == 5)
    hw *= t->dims[4];
  for (int64_t b = 0; b < n; b++)
    for (int64_t ci = 0; ci < c; ci++)
      for (int64_t p = 0; p < hw; p++) {
        int64_t plain = (b * c + ci) * hw + p, nhwc = (b * hw + p) * c + ci;
        memcpy((char *)dst + (to_nhwc ? nhwc : plain) * esz,
               (const char *)src + (to_nhwc ? plain : nhwc) * esz, (size_t)esz);
      }
}

void *kh_reorder4(const void *src, const es_tdesc *t, int to_nhwc) {
  void *d = es_mem_alloc(ES_MEM_OTHER, t->nbytes + 1);
  assert_non_null(d);
  kh_reorder4_into(d, src, t, to_nhwc);
  return d;
}

void kh_rand_f32(uint64_t *seed, float *v, size_t n, float lo, float hi) {
  double span = (double)hi - (double)lo;
  for (size_t i = 0; i < n; i++)
    v[i] = (float)((double)(es_test_rand(seed) >> 11) / 9007199254740992.0 * span + (double)lo);
}

/* ---- evaluating ----------------------------------------------------------- */

int kh_eval(const es_knode *nd, int64_t opset, int n_in, const es_tdesc *const *in,
            const void *const *data, es_tdesc *out, void **outd) {
  return es__kernel_eval(nd, opset, n_in, in, data, 1, out, outd);
}

int kh_eval1(const es_knode *nd, int64_t opset, const es_tdesc *x, const void *xd,
             es_tdesc *out, void **outd) {
  return kh_eval(nd, opset, 1, (const es_tdesc *[]){x}, (const void *[]){xd}, out, outd);
}

void kh_begin(kh_run *h, const es_knode *nd, int64_t opset, int n_in, const es_tdesc *const *in,
              const void *const *data, unsigned dyn, int n_out, es_prep_store *prep) {
  assert_true(n_in <= KH_MAX_IO && n_out <= KH_MAX_IO);
  memset(h, 0, sizeof *h);
  h->kern = es__kernel_for(nd->op);
  assert_non_null(h->kern);
  h->prep = prep;
  h->opset = opset;
  for (int i = 0; i < n_in; i++) {
    if (in[i]) {
      h->desc[i] = *in[i];
      h->inp[i] = &h->desc[i];
    }
    h->stat[i] = data && !(dyn >> i & 1) ? data[i] : NULL;
  }
  for (int i = 0; i < n_out; i++)
    h->outp[i] = &h->out[i];
  h->k = (es_kinst){.node = *nd, .n_in = n_in, .n_out = n_out};
}

int kh_infer(kh_run *h) {
  es_knode nd = h->k.node;
  int n_in = h->k.n_in, n_out = h->k.n_out;
  h->k = (es_kinst){.node = nd,
                    .opset = h->opset,
                    .n_in = n_in,
                    .n_out = n_out,
                    .in = h->inp,
                    .out = h->outp,
                    .in_static = h->stat,
                    .inplace = -1,
                    .ctx = &h->ctx,
                    .prep = h->prep};
  es__op_label(nd.name, nd.id, nd.op, h->k.label, sizeof h->k.label);
  return h->kern->infer(&h->k);
}

int kh_infer_relayout(kh_run *h) {
  for (int attempt = 0;; attempt++) {
    int rc = kh_infer(h);
    if (rc != ES_KRELAYOUT)
      return rc;
    if (attempt > 0)
      fail_msg("%s asked twice for other input layouts", h->k.label);
    assert_int_equal(h->k.want_plain & h->k.want_nhwc, 0);
    for (int i = 0; i < h->k.n_in; i++) {
      if (!((h->k.want_plain | h->k.want_nhwc) >> i & 1))
        continue;
      assert_non_null(h->inp[i]);
      h->desc[i].layout = (h->k.want_nhwc >> i & 1) ? ES_LAYOUT_NHWC : ES_LAYOUT_PLAIN;
      h->relayouts |= 1u << i;
    }
    if (h->kern->release)
      h->kern->release(&h->k);
    es__ctx_free_all(&h->ctx);
  }
}

int kh_exec(kh_run *h, const void *const *data, int inplace, void **outd) {
  const void *rin[KH_MAX_IO] = {0};
  for (int i = 0; i < h->k.n_in; i++)
    rin[i] = data[i];
  void *scratch = es_mem_aligned_alloc(ES_MEM_OTHER, 64, h->k.scratch_bytes + 1);
  assert_non_null(scratch);
  for (int i = 0; i < h->k.n_out; i++) {
    outd[i] = es_mem_aligned_alloc(ES_MEM_OTHER, 64, h->out[i].nbytes + 1);
    assert_non_null(outd[i]);
  }
  if (inplace) {
    assert_int_equal(h->k.inplace, 0);
    assert_int_equal(h->out[0].nbytes, h->inp[0]->nbytes);
    memcpy(outd[0], data[0], h->inp[0]->nbytes);
    rin[0] = outd[0];
  }
  int rc = h->kern->run(&h->k, rin, outd, scratch);
  es_mem_free(scratch);
  if (rc != 0)
    for (int i = 0; i < h->k.n_out; i++) {
      es_mem_free(outd[i]);
      outd[i] = NULL;
    }
  return rc;
}

void *kh_exec_plain(kh_run *h, const void *const *data) {
  const void *rin[KH_MAX_IO] = {0};
  void *tmp[KH_MAX_IO] = {0};
  for (int i = 0; i < h->k.n_in; i++) {
    rin[i] = data[i];
    if (h->inp[i] && h->desc[i].layout == ES_LAYOUT_NHWC)
      rin[i] = tmp[i] = kh_reorder4(data[i], &h->desc[i], 1);
  }
  void *y[KH_MAX_IO];
  ES_CHECK_RC(kh_exec(h, rin, 0, y));
  for (int i = 1; i < h->k.n_out; i++)
    es_mem_free(y[i]);
  if (h->out[0].layout == ES_LAYOUT_NHWC) {
    void *p = kh_reorder4(y[0], &h->out[0], 0);
    es_mem_free(y[0]);
    y[0] = p;
  }
  for (int i = 0; i < KH_MAX_IO; i++)
    es_mem_free(tmp[i]);
  return y[0];
}

void kh_end(kh_run *h) {
  if (h->kern->release && h->k.ctx)
    h->kern->release(&h->k);
  es__ctx_free_all(&h->ctx);
}

int kh_eval_with(const es_knode *nd, const kh_opts *o, int n_in, const es_tdesc *const *in,
                 const void *const *data, int n_out, es_tdesc *out, void **outd) {
  kh_run h;
  kh_begin(&h, nd, o->opset, n_in, in, data, o->dyn, n_out, o->prep);
  for (int i = 0; i < n_out; i++)
    outd[i] = NULL;
  int rc = kh_infer(&h);
  if (rc == 0)
    rc = kh_exec(&h, data, o->inplace, outd);
  for (int i = 0; i < n_out; i++)
    out[i] = h.out[i];
  if (o->k_out)
    *o->k_out = h.k;
  kh_end(&h);
  return rc;
}
