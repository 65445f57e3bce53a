/* Control flow: the merge of an If whose branches the loader inlined
 * (src/model/onnx.c, flatten_ifs).
 *
 * The merge's inputs are the condition, the then-branch's n outputs and
 * the else-branch's n; its outputs pass on the taken branch's. The planner
 * skips a branch whose condition it knows (its values come here as omitted
 * inputs) and a run skips the steps of the branch not taken, so only the
 * taken side's inputs are ever read. With the condition known while
 * planning, each output is exactly the taken side's; otherwise it is planned
 * at the larger of the two sides' shapes (the same type and rank: ONNX
 * allows branches of other ranks, which the engine does not plan), a
 * data-dependent shape whose actual value run takes from the taken side
 * (kernel.h, "Data-dependent shapes"). The copy is a memcpy of the taken
 * side's bytes. */
#include "kernels/kernel.h"

#include <stdio.h>
#include <string.h>

typedef struct if_params {
  int n;     /* outputs per branch */
  int known; /* the condition while planning: 1 then, 0 else, -1 unknown */
  size_t bytes[]; /* per output, when its shape is the same on both sides */
} if_params;

static int if_infer(es_kinst *k) {
  if (k->n_in < 1 || (k->n_in - 1) % 2 != 0 || k->n_out > (k->n_in - 1) / 2)
    return ES_KFAIL(k, ES_EMODEL, "an If merge takes the condition and two equal lists of "
                    "branch outputs (%d inputs, %d outputs)", k->n_in, k->n_out);
  int n = (k->n_in - 1) / 2;
  const es_tdesc *c = k->in[0];
  if (!c || c->dtype != ES_DTYPE_BOOL || c->count != 1)
    return ES_KFAIL(k, ES_EMODEL, "cond must be one bool, it is %s with %zu elements",
                    c ? es_dtype_name(c->dtype) : "missing", c ? c->count : (size_t)0);
  int known = k->in_static && k->in_static[0] ? *(const uint8_t *)k->in_static[0] != 0 : -1;
  if_params *p = es__kinst_params(k, sizeof *p + (size_t)(n + 1) * sizeof(size_t));
  if (!p)
    return ES_ENOMEM;
  p->n = n;
  p->known = known;
  for (int j = 0; j < k->n_out; j++) {
    if (!k->out[j])
      continue;
    const es_tdesc *t = k->in[1 + j], *e = k->in[1 + n + j];
    const es_tdesc *pick = known == 1 ? t : known == 0 ? e : NULL;
    int rc;
    if (known >= 0) {
      if (!pick)
        return ES_KFAIL(k, ES_EMODEL, "the %s-branch's output %d is missing",
                        known ? "then" : "else", j);
      if ((rc = es__tdesc_set(k->out[j], pick->dtype, pick->rank, pick->dims)) < 0)
        return ES_KFAIL(k, rc, "output %d: %s", j, es_last_error_detail());
      p->bytes[j] = pick->nbytes;
      continue;
    }
    if (!t || !e)
      return ES_KFAIL(k, ES_EMODEL, "output %d: a branch's output is missing", j);
    if (t->dtype != e->dtype)
      return ES_KFAIL(k, ES_EMODEL, "output %d: the branches give %s and %s", j,
                      es_dtype_name(t->dtype), es_dtype_name(e->dtype));
    if (t->rank != e->rank)
      return ES_KFAIL(k, ES_ENOTSUP, "output %d: the branches give ranks %d and %d (branches "
                      "of different ranks are not supported)", j, t->rank, e->rank);
    int64_t dims[ES_MAX_RANK];
    int differ = 0;
    for (int d = 0; d < t->rank; d++) {
      dims[d] = t->dims[d] > e->dims[d] ? t->dims[d] : e->dims[d];
      differ |= t->dims[d] != e->dims[d];
      if (t->dims[d] != e->dims[d] && d < 32)
        k->bound_dims |= 1u << d;
    }
    if ((rc = es__tdesc_set(k->out[j], t->dtype, t->rank, dims)) < 0)
      return ES_KFAIL(k, rc, "output %d: %s", j, es_last_error_detail());
    p->bytes[j] = t->nbytes;
    if (differ && j < 32) {
      k->out_bound |= 1u << j;
      snprintf(k->bound_why, sizeof k->bound_why, "the larger of its If branches' shapes");
    } else if (differ) {
      return ES_KFAIL(k, ES_ENOTSUP, "output %d: more than 32 outputs of branches that differ "
                      "in shape", j);
    }
  }
  k->params = p;
  return 0;
}

static int if_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  (void)scratch;
  const if_params *p = k->params;
  int c = p->known >= 0 ? p->known : *(const uint8_t *)in[0] != 0;
  for (int j = 0; j < k->n_out; j++) {
    if (!out[j])
      continue;
    int src = c ? 1 + j : 1 + p->n + j;
    size_t bytes = p->bytes[j];
    if (k->out_bound >> j & 1) { /* the taken side's actual shape */
      const es_tdesc *s = k->in[src];
      int rc = es__tdesc_set(k->out[j], s->dtype, s->rank, s->dims);
      if (rc < 0)
        return rc;
      bytes = s->nbytes;
    }
    if (bytes)
      memcpy(out[j], in[src], bytes);
  }
  return 0;
}

static const es_kernel if_kernel = {if_infer, if_run, NULL, 0};

const es_kernel *es__kernels_control(es_op op) { return op == ES_OP_If ? &if_kernel : NULL; }
