/* MatMul (float32, numpy semantics: 1-D operands promoted, batch dimensions
 * broadcast).
 *
 * Shapes are reduced in infer to a batch of M x K by K x N products: the
 * output's batch dimensions with, per dimension, the element stride of A and
 * of B (0 where that operand broadcasts).
 *
 * Two paths, chosen per plan in infer:
 *   - oneDNN (default). When B has no batch of its own (2-D weights, the
 *     projections of the target models: [b, t, K] x [K, N]), A's batch folds
 *     into M and the product is one 2-D matmul; if B is static its layout is
 *     left to oneDNN and reordered once into a prepared copy shared by all
 *     plans of the model. Otherwise (attention: [1, h, t, d] x [1, h, d, t])
 *     one batched matmul with plain layouts and oneDNN's own broadcasting.
 *   - reference (ES_KERNELS=ref or es__kernels_use_reference(1)), also the
 *     fallback for shapes oneDNN refuses and for K = 0 (a zero output):
 *     per batch entry, each output row accumulates rows of B scaled by A's
 *     elements (i-k-j order, the inner loop contiguous over N).
 *
 * Fused bias and post-ops. The fusion pass (src/engine/fuse_conv.c) gives a
 * MatMul by static 2-D weights the Add of a bias over N that follows it
 * (input 2), then its activations (GELU among them: a transformer's MLP)
 * and a residual Add (input 3) as "_post" codes (kernels/post.h). On the
 * 2-D oneDNN path they are the primitive's bias and post-ops, applied while
 * the output tile is still in registers; elsewhere the same list runs over
 * the output afterwards. */
#include "kernels/dnnl_glue.h"
#include "kernels/post.h"
#include "kernels/kernel.h"

#include <string.h>

/* ==========================================================================
 * Parameters and shape inference
 * ======================================================================== */

typedef struct matmul_params {
  int64_t m, k, n;
  int nb;                       /* output batch rank */
  int64_t bdims[ES_MAX_RANK];   /* output batch dims */
  int64_t astr[ES_MAX_RANK];    /* A's element stride per output batch dim (0: broadcast) */
  int64_t bstr[ES_MAX_RANK];
  int64_t batch;                /* product of bdims */
  int empty;                    /* the output has no element: run does nothing */
  int use_dnnl;
  int epilogue;                 /* bias and post-ops after the product (not oneDNN's) */
  size_t count;                 /* output elements */
  int prepared;                 /* static B goes into a prepared copy in oneDNN's layout */
  es_aligned_in b_copy;         /* B read in place misaligned: read from an aligned copy */
  int has_bias;                 /* input 2: N floats added to every row */
  es_posts post;                /* fused post-ops; post.has_res: input 3 is added */
  int bf16;                     /* "_bf16" (static 2-D B): A rounded to bf16 at scratch
                                   offset bf_at, B prepared in bf16 (dnnl_glue.h) */
  size_t bf_at;
  es_dnnl_prim dnnl;
} matmul_params;

/* Batch dims of t (all but the last two; none for rank <= 2), padded on
 * the left with 1s to nb. */
static void matmul_batch_of(const es_tdesc *t, int nb, int64_t *dims) {
  int tb = t->rank > 2 ? t->rank - 2 : 0;
  for (int i = 0; i < nb; i++) {
    int j = i - (nb - tb);
    dims[i] = j >= 0 ? t->dims[j] : 1;
  }
}

static int matmul_shapes(es_kinst *k, matmul_params *p, int *out_rank, int64_t *out_dims) {
  /* Fused: input 2 the bias ("_bias" 1; -1 without one when a residual
   * follows), input 3 the residual. */
  int want = p->post.has_res ? 4 : 2 + p->has_bias;
  if (k->n_in != want || !k->in[0] || !k->in[1] || (p->has_bias && !k->in[2]) ||
      (p->post.has_res && !k->in[3]))
    return ES_KFAIL(k, ES_EMODEL, "MatMul needs exactly two inputs A and B%s",
                    want > 2 ? " (and its fused bias and residual)" : "");
  if (k->n_out != 1 || !k->out[0])
    return ES_KFAIL(k, ES_EMODEL, "MatMul has exactly one output");
  const es_tdesc *a = k->in[0], *b = k->in[1];
  for (int i = 0; i < 2; i++) {
    es_dtype t = k->in[i]->dtype;
    if (t == ES_DTYPE_INT32 || t == ES_DTYPE_INT64)
      return ES_KFAIL(k, ES_ENOTSUP, "MatMul on %s is not supported (float32 only)",
                      es_dtype_name(t));
    if (t != ES_DTYPE_FLOAT)
      return ES_KFAIL(k, ES_EMODEL, "input %c is %s, expected float32", i ? 'B' : 'A',
                      es_dtype_name(t));
  }
  if (a->rank < 1 || b->rank < 1)
    return ES_KFAIL(k, ES_EMODEL, "MatMul inputs must have rank 1 or more (A %d, B %d)", a->rank,
                    b->rank);
  /* A zero-sized tensor's other dims are otherwise unbounded; this keeps
   * the stride products below from overflowing. */
  for (int t = 0; t < 2; t++)
    for (int i = 0; i < k->in[t]->rank; i++)
      if (k->in[t]->dims[i] > ((int64_t)1 << 40))
        return ES_KFAIL(k, ES_EMODEL, "dimension %d of %c is %lld, more than 2^40", i,
                        t ? 'B' : 'A', (long long)k->in[t]->dims[i]);
  /* 1-D promotion: A [K] is [1, K], B [K] is [K, 1]; the 1 is dropped from
   * the output. */
  p->m = a->rank == 1 ? 1 : a->dims[a->rank - 2];
  int64_t ka = a->dims[a->rank - 1];
  int64_t kb = b->rank == 1 ? b->dims[0] : b->dims[b->rank - 2];
  p->n = b->rank == 1 ? 1 : b->dims[b->rank - 1];
  if (ka != kb)
    return ES_KFAIL(k, ES_EMODEL, "inner dimensions differ: A has K = %lld, B has K = %lld",
                    (long long)ka, (long long)kb);
  p->k = ka;
  int ab = a->rank > 2 ? a->rank - 2 : 0, bb = b->rank > 2 ? b->rank - 2 : 0;
  p->nb = ab > bb ? ab : bb;
  int64_t ad[ES_MAX_RANK], bd[ES_MAX_RANK];
  matmul_batch_of(a, p->nb, ad);
  matmul_batch_of(b, p->nb, bd);
  int64_t as = p->m * p->k, bs = p->k * p->n;
  p->batch = 1;
  for (int i = p->nb - 1; i >= 0; i--) {
    if (ad[i] != bd[i] && ad[i] != 1 && bd[i] != 1)
      return ES_KFAIL(k, ES_EMODEL,
                      "batch dimensions do not broadcast: %lld vs %lld (output batch axis %d)",
                      (long long)ad[i], (long long)bd[i], i);
    p->bdims[i] = ad[i] == 1 ? bd[i] : ad[i];
    p->astr[i] = ad[i] == 1 ? 0 : as;
    p->bstr[i] = bd[i] == 1 ? 0 : bs;
    as *= ad[i];
    bs *= bd[i];
    p->batch *= p->bdims[i];
  }
  int r = 0;
  for (int i = 0; i < p->nb; i++)
    out_dims[r++] = p->bdims[i];
  if (a->rank > 1)
    out_dims[r++] = p->m;
  if (b->rank > 1)
    out_dims[r++] = p->n;
  *out_rank = r;
  return 0;
}

/* ==========================================================================
 * oneDNN path
 * ======================================================================== */

static int matmul_dnnl_setup(es_kinst *k, matmul_params *p) {
  const es_tdesc *a = k->in[0], *b = k->in[1];
  int64_t bbatch = 1;
  for (int i = 0; i < b->rank - 2; i++)
    bbatch *= b->dims[i];
  const void *bstatic = k->in_static[1];
  dnnl_memory_desc_t amd, bmd, cmd, bany;
  dnnl_status_t st;
  int flat = bbatch == 1;
  if (flat) {
    /* One 2-D product: [batch * M, K] x [K, N]. */
    int64_t ad[2] = {p->batch * p->m, p->k}, bd[2] = {p->k, p->n}, cd[2] = {p->batch * p->m, p->n};
    st = es__dnnl_plain_md(&amd, 2, ad);
    if (st == dnnl_success)
      st = es__dnnl_plain_md(&bmd, 2, bd);
    if (st == dnnl_success)
      st = es__dnnl_plain_md(&cmd, 2, cd);
  } else {
    int nd = p->nb + 2;
    int64_t ad[ES_MAX_RANK + 2], bd[ES_MAX_RANK + 2], cd[ES_MAX_RANK + 2];
    matmul_batch_of(a, p->nb, ad);
    matmul_batch_of(b, p->nb, bd);
    memcpy(cd, p->bdims, sizeof(int64_t) * (size_t)p->nb);
    ad[p->nb] = p->m, ad[p->nb + 1] = p->k;
    bd[p->nb] = p->k, bd[p->nb + 1] = p->n;
    cd[p->nb] = p->m, cd[p->nb + 1] = p->n;
    st = es__dnnl_plain_md(&amd, nd, ad);
    if (st == dnnl_success)
      st = es__dnnl_plain_md(&bmd, nd, bd);
    if (st == dnnl_success)
      st = es__dnnl_plain_md(&cmd, nd, cd);
  }
  /* Static 2-D weights: let oneDNN pick their layout, prepared once. */
  int prepare = flat && bstatic;
  p->bf16 = p->bf16 && prepare;
  dnnl_memory_desc_t abf;
  if (st == dnnl_success && p->bf16)
    st = dnnl_memory_desc_init_by_tag(&abf, 2, amd.dims, dnnl_bf16, dnnl_ab);
  if (st == dnnl_success && prepare)
    st = dnnl_memory_desc_init_by_tag(&bany, 2, bmd.dims, p->bf16 ? dnnl_bf16 : dnnl_f32,
                                      dnnl_format_tag_any);
  if (st != dnnl_success)
    return es__dnnl_fail(k, st, "describing the tensors");
  /* Bias and post-ops go into the 2-D primitive; the batched one leaves
   * them to the epilogue. */
  p->epilogue = !flat && (p->has_bias || p->post.n);
  dnnl_memory_desc_t biasmd;
  int64_t bias_dims[2] = {1, p->n};
  int with_bias = flat && p->has_bias;
  if (with_bias && (st = es__dnnl_plain_md(&biasmd, 2, bias_dims)) != dnnl_success)
    return es__dnnl_fail(k, st, "describing the bias");
  dnnl_post_ops_t po = NULL;
  int res_sum = 0;
  if (flat && p->post.n) {
    st = dnnl_post_ops_create(&po);
    if (st == dnnl_success)
      st = es__dnnl_posts(&p->post, &cmd, po, 0, &p->dnnl, &res_sum);
    if (st != dnnl_success) {
      if (po)
        dnnl_post_ops_destroy(po);
      return es__dnnl_fail(k, st, "describing the fused post-ops");
    }
  }
  dnnl_matmul_desc_t d;
  st = dnnl_matmul_desc_init(&d, p->bf16 ? &abf : &amd, prepare ? &bany : &bmd,
                             with_bias ? &biasmd : NULL, &cmd);
  int rc = st != dnnl_success ? es__dnnl_fail(k, st, "describing the matmul")
                              : es__dnnl_prim_create(k, &d, po, &p->dnnl);
  if (po)
    dnnl_post_ops_destroy(po);
  if (rc < 0)
    return rc;
  p->prepared = prepare && !dnnl_memory_desc_equal(&bmd, p->dnnl.wei_md);
  rc = prepare ? es__dnnl_weights_prepare(k, &p->dnnl, &bmd, bstatic) : 0;
  if (rc == 0 && p->bf16)
    p->bf_at = es__dnnl_bf16_room(k, (size_t)(p->batch * p->m * p->k));
  return rc;
}

/* ==========================================================================
 * Reference path
 * ======================================================================== */


static void matmul_block(const float *restrict a, const float *restrict b, float *restrict c,
                         int64_t m, int64_t kk, int64_t n) {
  for (int64_t i = 0; i < m; i++) {
    float *restrict cr = c + i * n;
    for (int64_t j = 0; j < n; j++)
      cr[j] = 0.0f;
    for (int64_t t = 0; t < kk; t++)
      es__axpy_f32(cr, b + t * n, a[i * kk + t], n);
  }
}

static void matmul_ref(const matmul_params *p, const float *a, const float *b, float *c) {
  int64_t idx[ES_MAX_RANK] = {0};
  int64_t aoff = 0, boff = 0, csz = p->m * p->n;
  for (int64_t e = 0; e < p->batch; e++) {
    matmul_block(a + aoff, b + boff, c + e * csz, p->m, p->k, p->n);
    /* Odometer over the batch dims, keeping both operands' offsets. */
    for (int i = p->nb - 1; i >= 0; i--) {
      aoff += p->astr[i];
      boff += p->bstr[i];
      if (++idx[i] < p->bdims[i])
        break;
      aoff -= p->astr[i] * p->bdims[i];
      boff -= p->bstr[i] * p->bdims[i];
      idx[i] = 0;
    }
  }
}

/* The fused bias (per column of every output row), then the post-ops. */
ES_KCLONES static void matmul_epilogue(const matmul_params *p, float *c, const float *bias,
                                       const float *res, size_t count) {
  if (bias && p->n > 0)
    for (size_t r = 0; r < count / (size_t)p->n; r++) {
      float *restrict cr = c + r * (size_t)p->n;
      for (int64_t j = 0; j < p->n; j++)
        cr[j] += bias[j];
    }
  es__posts_ref(&p->post, c, res, count);
}

/* ==========================================================================
 * Kernel
 * ======================================================================== */

static int matmul_infer(es_kinst *k) {
  matmul_params *p = es__kinst_alloc(k, sizeof *p);
  if (!p)
    return ES_KFAIL(k, ES_ENOMEM, "out of memory for parameters");
  k->params = p;
  int rank = 0;
  int64_t dims[ES_MAX_RANK], bias_flag;
  int rc = es__posts_parse(k, &p->post);
  if (rc == 0)
    rc = es__attr_int(k, "_bias", 0, &bias_flag);
  if (rc < 0)
    return rc;
  p->has_bias = bias_flag != 0;
  if ((rc = matmul_shapes(k, p, &rank, dims)) < 0)
    return rc;
  if ((rc = es__tdesc_set(k->out[0], ES_DTYPE_FLOAT, rank, dims)) < 0)
    return ES_KFAIL(k, rc, "output shape: %s", es_last_error_detail());
  const es_tdesc *bias = p->has_bias ? k->in[2] : NULL, *res = p->post.has_res ? k->in[3] : NULL;
  if (bias && (bias->dtype != ES_DTYPE_FLOAT || bias->count != (size_t)p->n))
    return ES_KFAIL(k, ES_EMODEL, "the fused bias (input 2) must be %lld float32 values",
                    (long long)p->n);
  if (res && (res->dtype != ES_DTYPE_FLOAT || !es__tdesc_same_shape(res, k->out[0])))
    return ES_KFAIL(k, ES_EMODEL, "the residual (input 3) must be float32 of the output's shape");
  k->scratch_bytes = 0;
  k->inplace = -1;
  k->flops = 2 * (uint64_t)p->batch * (uint64_t)p->m * (uint64_t)p->n * (uint64_t)p->k;
  /* K = 0 (zeros out) stays on the reference loops. */
  p->count = k->out[0]->count;
  p->empty = p->count == 0;
  p->use_dnnl = !es__kernels_reference() && !p->empty && p->k > 0;
  p->bf16 = es__dnnl_bf16_wanted(k);
  if (p->use_dnnl) {
    int src = matmul_dnnl_setup(k, p);
    if (src == ES_ENOTSUP && p->bf16) { /* no bf16 kernel for this shape: float32 */
      es__dnnl_prim_destroy(&p->dnnl);
      k->scratch_bytes = 0;
      p->bf16 = 0;
      src = matmul_dnnl_setup(k, p);
    }
    if ((rc = es__dnnl_setup_done(k, &p->dnnl, src, &p->use_dnnl)) < 0)
      return rc;
  }
  if (!p->use_dnnl)
    p->bf16 = 0;
  /* A static B may be read in place from the model file at any byte
   * offset (onnx.c's matmul_b_only): where a run reads B itself rather than
   * its prepared copy, it reads an aligned copy made in scratch. */
  es__aligned_in_plan(k, 1, !p->empty && !(p->use_dnnl && p->prepared), &p->b_copy);
  return 0;
}

static int matmul_run(const es_kinst *k, const void *const *in, void *const *out,
                      void *scratch) {
  const matmul_params *p = k->params;
  if (p->empty)
    return 0;
  const float *bias = p->has_bias ? in[2] : NULL, *res = p->post.has_res ? in[3] : NULL;
  const void *b = es__aligned_in_get(&p->b_copy, in[1], scratch);
  if (p->use_dnnl) {
    const void *a = in[0];
    if (p->bf16) {
      uint16_t *ab = (uint16_t *)((char *)scratch + p->bf_at);
      es__f32_to_bf16(ab, in[0], (size_t)(p->batch * p->m * p->k));
      a = ab;
    }
    int rc = es__dnnl_prim_run(k, &p->dnnl, a, p->dnnl.weights ? p->dnnl.weights : b,
                               p->epilogue ? NULL : bias, out[0], p->epilogue ? NULL : res,
                               scratch);
    if (rc == 0 && p->epilogue)
      matmul_epilogue(p, out[0], bias, res, p->count);
    return rc;
  }
  matmul_ref(p, in[0], b, out[0]);
  if (bias || p->post.n)
    matmul_epilogue(p, out[0], bias, res, p->count);
  return 0;
}

static void matmul_release(es_kinst *k) {
  matmul_params *p = k->params;
  if (p)
    es__dnnl_prim_destroy(&p->dnnl);
}

static const es_kernel matmul_kernel = {matmul_infer, matmul_run, matmul_release, 0};

const es_kernel *es__kernels_matmul(es_op op) { return op == ES_OP_MatMul ? &matmul_kernel : NULL; }
