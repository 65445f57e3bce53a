/* Linear algebra beyond MatMul: Gemm and Einsum.
 *
 * Gemm, Y = alpha * A' B' + beta * C (A' = A or its transpose, the same for
 * B'; float32), runs as one oneDNN matmul, the primitive MatMul uses
 * (dnnl_glue.h), with C fused:
 *   - a transposed A or B is described by its strides, not copied; static
 *     B (the weights of a classifier's last layer, [N, K] with transB = 1)
 *     gets a layout oneDNN picks, reordered once into a prepared copy shared
 *     by every plan of the model, exactly as MatMul's weights;
 *   - a C of one row ([N], [1, N], a scalar) with alpha = 1 (what exporters
 *     write) is oneDNN's [1, N] bias: C itself when beta is 1 and C has N
 *     elements, else beta * C expanded to [N], made once in plan memory
 *     when C is static, into scratch at run time when it is not. oneDNN
 *     2.x's fast matmul kernels take no other bias shape (a [M, N] or
 *     [1, 1] bias sends it to its slow reference kernel), so any other C,
 *     or a C with alpha != 1, is written into Y as beta * C first and a sum
 *     post-op adds the product to it; alpha is an eltwise post-op (linear)
 *     on the product before that sum. beta = 0 drops C.
 *   - a product of at most GEMV_MAX_M rows against a B stored [N, K]
 *     (transB = 1: a classifier's fully connected layers at batch 1 to 4)
 *     does not go to oneDNN: it is a matrix-vector product that reads every
 *     weight once, so its speed is memory bandwidth whatever the layout,
 *     and oneDNN runs it fast only on weights reordered into a prepared
 *     copy. That copy is as large as the weights (vgg11: 494 MB of its 531)
 *     and costs a write of all of it at every load. Dot products of our own
 *     over B's rows as the model stores them (four rows at a time, 16 lanes
 *     each, one pass over B per row of A) ran vgg11's three layers in 14 to
 *     17 ms against oneDNN's 19 on its prepared copy and 26 on B as stored,
 *     one thread. They use one thread whatever the request's intra-op
 *     setting: a product this size is bound by memory, not by cores.
 * The reference path (ES_KERNELS=ref, shapes oneDNN refuses, K = 0) loops
 * in C: a dot product per output for transB (both rows contiguous), rows of
 * B scaled and accumulated otherwise, then alpha and beta * C.
 *
 * Einsum (float32, int32, int64) runs every equation with one loop nest:
 * each label (a letter, or one dimension of the ellipsis) gets an extent
 * and, per operand, a stride, the sum of the strides of the operand's axes
 * that carry it, so a repeated label (a diagonal, "ii->i") reads along the
 * diagonal and a missing or broadcast one has stride 0. An odometer walks
 * the output's labels, and for each output element a second one walks the
 * summed labels, accumulating the product of the operands. It is a
 * reference loop, not a tuned matrix product: the models seen use Einsum on
 * small tensors (attention over a few heads, bilinear pooling). Without
 * "->" the output is the ellipsis dims then the labels that appear once, in
 * ASCII order, as numpy. */
#include "kernels/dnnl_glue.h"
#include "kernels/kernel.h"

#include <string.h>

/* ==========================================================================
 * Gemm
 * ======================================================================== */

/* Rows of A up to which a transB Gemm is dot products over B as stored
 * (above: see the design note). Four rows of B at 25,088 floats are 400 KB,
 * still in L2 for the later rows of A. */
#define GEMV_MAX_M 4

/* How beta * C reaches oneDNN's result. */
enum {
  GC_NONE, /* no C, or beta = 0 */
  GC_BIAS, /* a [1, N] bias: C when beta = 1 and C is [N] or [1, N], else bvec */
  GC_SUM,  /* Y is filled with beta * C first, and a sum post-op adds the product */
};

typedef struct gemm_params {
  int64_t m, n, kk;
  int ta, tb;
  float alpha, beta;
  int has_c;             /* beta * C is added (C given and beta != 0) */
  int64_t cm, cn;        /* C as [cm, cn]: each 1 (broadcast) or m, n */
  int empty;             /* Y has no element */
  int use_dnnl;
  int gemv;              /* dot products over B as stored (GEMV_MAX_M) */
  int prepared;          /* static B goes into a prepared copy in oneDNN's layout */
  es_aligned_in b_copy;  /* B read in place misaligned: read from an aligned copy */
  int cmode;             /* GC_*, on the oneDNN path */
  const float *bvec;     /* GC_BIAS: beta * C as [N], made while planning, or NULL */
  size_t bvec_off;       /* GC_BIAS with C known only at run: bvec's scratch offset, or 0 */
  es_dnnl_prim dnnl;
} gemm_params;

static size_t gemm_align(size_t v) { return (v + 63) & ~(size_t)63; }

/* The bias vector beta * C expanded to [N] (C is [1, 1] or [1, N]). */
static void gemm_bvec_fill(const gemm_params *p, const float *c, float *v) {
  for (int64_t j = 0; j < p->n; j++)
    v[j] = p->beta * c[p->cn == 1 ? 0 : j];
}

static int gemm_dnnl_setup(es_kinst *k, gemm_params *p) {
  /* oneDNN reads whole dnnl_dims_t arrays */
  dnnl_dims_t ad = {p->m, p->kk}, bd = {p->kk, p->n}, as = {p->kk, 1}, bs = {p->n, 1};
  int64_t cd[2] = {p->m, p->n};
  /* a transpose with a dimension of 1 has the plain bytes */
  if (p->ta && p->m > 1 && p->kk > 1)
    as[0] = 1, as[1] = p->m; /* A stored [K, M] */
  if (p->tb && p->n > 1 && p->kk > 1)
    bs[0] = 1, bs[1] = p->kk; /* B stored [N, K] */
  dnnl_memory_desc_t amd, bmd, cmd, bany, biasmd;
  dnnl_status_t st = dnnl_memory_desc_init_by_strides(&amd, 2, ad, dnnl_f32, as);
  if (st == dnnl_success)
    st = dnnl_memory_desc_init_by_strides(&bmd, 2, bd, dnnl_f32, bs);
  if (st == dnnl_success)
    st = es__dnnl_plain_md(&cmd, 2, cd);
  if (st == dnnl_success && p->cmode == GC_BIAS)
    st = es__dnnl_plain_md(&biasmd, 2, (int64_t[2]){1, p->n});
  const void *bstatic = k->in_static[1];
  if (st == dnnl_success && bstatic)
    st = dnnl_memory_desc_init_by_tag(&bany, 2, bd, dnnl_f32, dnnl_format_tag_any);
  if (st != dnnl_success)
    return es__dnnl_fail(k, st, "describing the tensors");
  dnnl_matmul_desc_t d;
  st = dnnl_matmul_desc_init(&d, &amd, bstatic ? &bany : &bmd,
                             p->cmode == GC_BIAS ? &biasmd : NULL, &cmd);
  if (st != dnnl_success)
    return es__dnnl_fail(k, st, "describing the matmul");
  /* alpha scales the product only: a post-op before the sum of beta * C */
  dnnl_post_ops_t po = NULL;
  if (p->alpha != 1.0f || p->cmode == GC_SUM) {
    st = dnnl_post_ops_create(&po);
    if (st == dnnl_success && p->alpha != 1.0f)
      st = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_linear, p->alpha, 0.0f);
    if (st == dnnl_success && p->cmode == GC_SUM)
      st = dnnl_post_ops_append_sum(po, 1.0f);
    if (st != dnnl_success) {
      if (po)
        dnnl_post_ops_destroy(po);
      return es__dnnl_fail(k, st, "making the post-ops");
    }
  }
  int rc = es__dnnl_prim_create(k, &d, po, &p->dnnl);
  if (po)
    dnnl_post_ops_destroy(po);
  if (rc < 0)
    return rc;
  p->prepared = bstatic && !dnnl_memory_desc_equal(&bmd, p->dnnl.wei_md);
  return bstatic ? es__dnnl_weights_prepare(k, &p->dnnl, &bmd, bstatic) : 0;
}

/* C's extents right-aligned to [cm, cn]; each must be 1 or Y's. */
static int gemm_c_shape(es_kinst *k, const es_tdesc *c, gemm_params *p) {
  if (c->dtype != ES_DTYPE_FLOAT)
    return ES_KFAIL(k, ES_EMODEL, "C is %s, expected float32", es_dtype_name(c->dtype));
  if (c->rank > 2)
    return ES_KFAIL(k, ES_EMODEL, "C has rank %d, expected at most 2", c->rank);
  p->cm = c->rank == 2 ? c->dims[0] : 1;
  p->cn = c->rank >= 1 ? c->dims[c->rank - 1] : 1;
  if ((p->cm != 1 && p->cm != p->m) || (p->cn != 1 && p->cn != p->n))
    return ES_KFAIL(k, ES_EMODEL, "C [%lld, %lld] does not broadcast to Y [%lld, %lld]",
                    (long long)p->cm, (long long)p->cn, (long long)p->m, (long long)p->n);
  return 0;
}

/* A static B the loader left misaligned in the model file's mapping is
 * read as floats only by the reference loops, and by oneDNN when it keeps
 * B's layout: those read an aligned copy (es__aligned_in_plan). The dot
 * products read B with unaligned loads, and a prepared copy is reordered
 * from it, so neither needs one. Done last in infer, once the path is
 * known. */
static int gemm_b_copy(es_kinst *k, gemm_params *p) {
  es__aligned_in_plan(k, 1, !p->empty && !p->gemv && !(p->use_dnnl && p->prepared), &p->b_copy);
  return 0;
}

static int gemm_infer(es_kinst *k) {
  gemm_params *p = es__kinst_alloc(k, sizeof *p);
  if (!p)
    return ES_KFAIL(k, ES_ENOMEM, "out of memory for parameters");
  k->params = p;
  if (k->n_in < 2 || k->n_in > 3 || !k->in[0] || !k->in[1])
    return ES_KFAIL(k, ES_EMODEL, "needs inputs A, B and optionally C");
  if (k->n_out != 1 || !k->out[0])
    return ES_KFAIL(k, ES_EMODEL, "%d outputs, expected 1", k->n_out);
  const es_tdesc *a = k->in[0], *b = k->in[1], *c = k->n_in > 2 ? k->in[2] : NULL;
  for (int i = 0; i < 2; i++) {
    const es_tdesc *t = k->in[i];
    if (t->dtype != ES_DTYPE_FLOAT)
      return ES_KFAIL(k, t->dtype == ES_DTYPE_INT32 || t->dtype == ES_DTYPE_INT64 ? ES_ENOTSUP
                                                                                  : ES_EMODEL,
                      "%c is %s: only float32 is implemented", i ? 'B' : 'A',
                      es_dtype_name(t->dtype));
    if (t->rank != 2)
      return ES_KFAIL(k, ES_EMODEL, "%c has rank %d, expected 2", i ? 'B' : 'A', t->rank);
    for (int j = 0; j < 2; j++)
      if (t->dims[j] > ((int64_t)1 << 40))
        return ES_KFAIL(k, ES_EMODEL, "%c's dimension %d is more than 2^40", i ? 'B' : 'A', j);
  }
  int64_t ta, tb;
  int rc;
  if ((rc = es__attr_int(k, "transA", 0, &ta)) < 0 ||
      (rc = es__attr_int(k, "transB", 0, &tb)) < 0 ||
      (rc = es__attr_float(k, "alpha", 1.0f, &p->alpha)) < 0 ||
      (rc = es__attr_float(k, "beta", 1.0f, &p->beta)) < 0)
    return rc;
  if ((ta != 0 && ta != 1) || (tb != 0 && tb != 1))
    return ES_KFAIL(k, ES_EMODEL, "transA is %lld and transB %lld, each expected 0 or 1",
                    (long long)ta, (long long)tb);
  p->ta = (int)ta;
  p->tb = (int)tb;
  p->m = a->dims[ta ? 1 : 0];
  p->kk = a->dims[ta ? 0 : 1];
  int64_t kb = b->dims[tb ? 1 : 0];
  p->n = b->dims[tb ? 0 : 1];
  if (kb != p->kk)
    return ES_KFAIL(k, ES_EMODEL, "inner dimensions differ: A' is [%lld, %lld], B' [%lld, %lld]",
                    (long long)p->m, (long long)p->kk, (long long)kb, (long long)p->n);
  if (c && (rc = gemm_c_shape(k, c, p)) < 0)
    return rc;
  p->has_c = c && p->beta != 0.0f;
  if ((rc = es__tdesc_set(k->out[0], ES_DTYPE_FLOAT, 2, (int64_t[2]){p->m, p->n})) < 0)
    return rc;
  k->inplace = -1;
  k->flops = 2 * (uint64_t)p->m * (uint64_t)p->n * (uint64_t)p->kk;
  p->empty = k->out[0]->count == 0;
  p->use_dnnl = !es__kernels_reference() && !p->empty && p->kk > 0;
  if (p->use_dnnl && p->tb && p->m <= GEMV_MAX_M && (!p->ta || p->m == 1)) {
    p->gemv = 1;
    p->use_dnnl = 0;
  }
  if (!p->use_dnnl)
    return gemm_b_copy(k, p);

  /* A bias row ([1, 1] or [1, N]) is oneDNN's bias unless alpha must scale
   * the product alone; anything else goes through Y and the sum post-op
   * (oneDNN's fast kernels take a [1, N] bias only). */
  p->cmode = !p->has_c                              ? GC_NONE
             : p->cm == 1 && p->alpha == 1.0f ? GC_BIAS
                                                    : GC_SUM;
  int direct = p->cmode == GC_BIAS && p->beta == 1.0f && p->cn == p->n;
  if (p->cmode == GC_BIAS && !direct && k->in_static[2]) {
    float *v = es__kinst_alloc(k, (size_t)p->n * sizeof(float));
    if (!v)
      return ES_KFAIL(k, ES_ENOMEM, "out of memory for beta * C");
    gemm_bvec_fill(p, k->in_static[2], v);
    p->bvec = v;
  }
  if ((rc = es__dnnl_setup_done(k, &p->dnnl, gemm_dnnl_setup(k, p), &p->use_dnnl)) < 0)
    return rc;
  if (p->use_dnnl && p->cmode == GC_BIAS && !direct && !p->bvec) {
    p->bvec_off = gemm_align(k->scratch_bytes ? k->scratch_bytes : 1);
    k->scratch_bytes = p->bvec_off + (size_t)p->n * sizeof(float);
  }
  return gemm_b_copy(k, p);
}

/* Y = alpha * Y + beta * C, C broadcast from [cm, cn]. */
static void gemm_scale_add_c(const gemm_params *p, const float *c, float *y) {
  if (p->alpha == 1.0f && !p->has_c)
    return;
  for (int64_t i = 0; i < p->m; i++)
    for (int64_t j = 0; j < p->n; j++) {
      float v = p->alpha * y[i * p->n + j];
      if (p->has_c)
        v += p->beta * c[(p->cm == 1 ? 0 : i * p->cn) + (p->cn == 1 ? 0 : j)];
      y[i * p->n + j] = v;
    }
}

/* 16 floats as one value, read from any address: B may sit in the model
 * file's mapping at whatever offset the exporter left it. */
typedef float gemv_v16 __attribute__((vector_size(64)));
typedef float gemv_v16u __attribute__((vector_size(64), aligned(1), may_alias));
#define GEMV_AT(ptr) (*(const gemv_v16u *)(const void *)(ptr))

/* B's element t of the row at byte address row (any alignment). */
static inline float gemv_ld(const unsigned char *row, int64_t t) {
  float v;
  memcpy(&v, row + t * (int64_t)sizeof v, sizeof v);
  return v;
}

/* y[i, j] = A's row i . B's row j, B [n, kk] row-major, A [m, kk]: four
 * rows of B at a time against one row of A, each row in a 16-lane partial
 * sum held in a register, summed at the end of the row. Memory-bound:
 * every float of B is read once from memory, the later rows of A reread
 * the four rows from cache. */
ES_KCLONES static void gemv_rows_f32(const float *restrict a, int64_t m,
                                     const unsigned char *restrict b, int64_t n, int64_t kk,
                                     float *restrict y) {
  int64_t j = 0, kv = kk - kk % 16, row = kk * (int64_t)sizeof(float);
  for (; j + 4 <= n; j += 4) {
    const unsigned char *restrict b0 = b + j * row, *restrict b1 = b0 + row,
                                  *restrict b2 = b1 + row, *restrict b3 = b2 + row;
    for (int64_t i = 0; i < m; i++) {
      const float *restrict ai = a + i * kk;
      gemv_v16 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
      for (int64_t t = 0; t < kv; t += 16) {
        gemv_v16 x = GEMV_AT(ai + t);
        s0 += x * GEMV_AT(b0 + 4 * t);
        s1 += x * GEMV_AT(b1 + 4 * t);
        s2 += x * GEMV_AT(b2 + 4 * t);
        s3 += x * GEMV_AT(b3 + 4 * t);
      }
      float r[4] = {0, 0, 0, 0};
      for (int l = 0; l < 16; l++) {
        r[0] += s0[l];
        r[1] += s1[l];
        r[2] += s2[l];
        r[3] += s3[l];
      }
      for (int64_t t = kv; t < kk; t++) {
        r[0] += ai[t] * gemv_ld(b0, t);
        r[1] += ai[t] * gemv_ld(b1, t);
        r[2] += ai[t] * gemv_ld(b2, t);
        r[3] += ai[t] * gemv_ld(b3, t);
      }
      memcpy(y + i * n + j, r, sizeof r);
    }
  }
  for (; j < n; j++)
    for (int64_t i = 0; i < m; i++) {
      float s = 0.0f;
      for (int64_t t = 0; t < kk; t++)
        s += a[i * kk + t] * gemv_ld(b + j * row, t);
      y[i * n + j] = s;
    }
}

/* Y = alpha * A' B' + beta * C with plain loops. */
static void gemm_ref(const gemm_params *p, const float *a, const float *b, const float *c,
                     float *y) {
  int64_t m = p->m, n = p->n, kk = p->kk;
  for (int64_t i = 0; i < m; i++) {
    float *restrict yr = y + i * n;
    if (p->tb) {
      for (int64_t j = 0; j < n; j++) {
        const float *bj = b + j * kk;
        float s = 0.0f;
        for (int64_t t = 0; t < kk; t++)
          s += (p->ta ? a[t * m + i] : a[i * kk + t]) * bj[t];
        yr[j] = s;
      }
    } else {
      for (int64_t j = 0; j < n; j++)
        yr[j] = 0.0f;
      for (int64_t t = 0; t < kk; t++)
        es__axpy_f32(yr, b + t * n, p->ta ? a[t * m + i] : a[i * kk + t], n);
    }
  }
  gemm_scale_add_c(p, c, y);
}

static int gemm_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  const gemm_params *p = k->params;
  if (p->empty)
    return 0;
  const float *c = p->has_c ? in[2] : NULL;
  if (p->gemv) {
    gemv_rows_f32(in[0], p->m, in[1], p->n, p->kk, out[0]);
    gemm_scale_add_c(p, c, out[0]);
    return 0;
  }
  const void *b = es__aligned_in_get(&p->b_copy, in[1], scratch);
  if (!p->use_dnnl) {
    gemm_ref(p, in[0], b, c, out[0]);
    return 0;
  }
  const float *bias = NULL;
  if (p->cmode == GC_BIAS) {
    bias = p->bvec ? p->bvec : c;
    if (p->bvec_off) {
      float *v = (float *)((char *)scratch + p->bvec_off);
      gemm_bvec_fill(p, c, v);
      bias = v;
    }
  } else if (p->cmode == GC_SUM) {
    float *y = out[0];
    for (int64_t i = 0; i < p->m; i++)
      for (int64_t j = 0; j < p->n; j++)
        y[i * p->n + j] = p->beta * c[(p->cm == 1 ? 0 : i * p->cn) + (p->cn == 1 ? 0 : j)];
  }
  return es__dnnl_prim_run(k, &p->dnnl, in[0], p->dnnl.weights ? p->dnnl.weights : b, bias,
                           out[0], NULL, scratch);
}

static void gemm_release(es_kinst *k) {
  gemm_params *p = k->params;
  if (p)
    es__dnnl_prim_destroy(&p->dnnl);
}

/* ==========================================================================
 * Einsum
 * ======================================================================== */

enum { EIN_MAX_OPS = 8, EIN_MAX_LABELS = 52 + ES_MAX_RANK };

typedef struct einsum_params {
  int n_ops;
  int n_out, n_sum;                         /* output labels, then summed ones */
  int64_t ext[EIN_MAX_LABELS];              /* extent per label (output ones first) */
  int64_t str[EIN_MAX_LABELS][EIN_MAX_OPS]; /* stride per label and operand */
  es_dtype dt;
  int64_t out_count;
} einsum_params;

/* One term of the equation, parsed: its labels by axis; -1 marks the
 * ellipsis' place. */
typedef struct ein_term {
  int n;                 /* entries in lab */
  int lab[ES_MAX_RANK + 1];
  int ell;               /* index of the ellipsis in lab, or -1 */
} ein_term;

static int ein_label(char ch) {
  if (ch >= 'a' && ch <= 'z')
    return ch - 'a' + 26; /* ASCII order: upper case first */
  if (ch >= 'A' && ch <= 'Z')
    return ch - 'A';
  return -1;
}

/* Parses s[0..len) into t. */
static int ein_term_parse(es_kinst *k, const char *eq, const char *s, size_t len, ein_term *t) {
  t->n = 0;
  t->ell = -1;
  for (size_t i = 0; i < len; i++) {
    if (s[i] == ' ')
      continue;
    if (t->n > ES_MAX_RANK)
      return ES_KFAIL(k, ES_ENOTSUP, "equation '%s': a term has more than %d axes", eq,
                      ES_MAX_RANK);
    if (s[i] == '.') {
      if (t->ell >= 0 || i + 2 >= len || s[i + 1] != '.' || s[i + 2] != '.')
        return ES_KFAIL(k, ES_EMODEL, "equation '%s': a misplaced '.' (an ellipsis is '...', "
                        "once per term)", eq);
      t->ell = t->n;
      t->lab[t->n++] = -1;
      i += 2;
      continue;
    }
    int l = ein_label(s[i]);
    if (l < 0)
      return ES_KFAIL(k, ES_EMODEL, "equation '%s': '%c' is not a label (letters only)", eq, s[i]);
    t->lab[t->n++] = l;
  }
  return 0;
}

static int einsum_infer(es_kinst *k) {
  einsum_params *p = es__kinst_alloc(k, sizeof *p);
  if (!p)
    return ES_KFAIL(k, ES_ENOMEM, "out of memory for parameters");
  k->params = p;
  const char *eq;
  int rc;
  if ((rc = es__attr_string(k, "equation", NULL, &eq)) < 0)
    return rc;
  if (!eq)
    return ES_KFAIL(k, ES_EMODEL, "attribute equation is missing");
  if (k->n_out != 1 || !k->out[0])
    return ES_KFAIL(k, ES_EMODEL, "%d outputs, expected 1", k->n_out);
  if (k->n_in < 1 || k->n_in > EIN_MAX_OPS)
    return ES_KFAIL(k, k->n_in < 1 ? ES_EMODEL : ES_ENOTSUP,
                    "equation '%s': %d operands (1 to %d are supported)", eq, k->n_in,
                    EIN_MAX_OPS);
  es_dtype dt = k->in[0] ? k->in[0]->dtype : ES_DTYPE_UNDEFINED;
  for (int i = 0; i < k->n_in; i++) {
    if (!k->in[i])
      return ES_KFAIL(k, ES_EMODEL, "operand %d is missing", i);
    if (k->in[i]->dtype != dt)
      return ES_KFAIL(k, ES_EMODEL, "operand %d is %s, operand 0 %s", i,
                      es_dtype_name(k->in[i]->dtype), es_dtype_name(dt));
  }
  if (dt != ES_DTYPE_FLOAT && dt != ES_DTYPE_INT32 && dt != ES_DTYPE_INT64)
    return ES_KFAIL(k, ES_EMODEL, "operands are %s, expected float32, int32 or int64",
                    es_dtype_name(dt));

  /* the terms */
  ein_term terms[EIN_MAX_OPS], out_t;
  const char *arrow = strstr(eq, "->");
  size_t lhs_len = arrow ? (size_t)(arrow - eq) : strlen(eq);
  int nt = 0;
  for (size_t s = 0, i = 0; i <= lhs_len; i++) {
    if (i < lhs_len && eq[i] != ',')
      continue;
    if (nt >= k->n_in)
      return ES_KFAIL(k, ES_EMODEL, "equation '%s' has more terms than the %d operands", eq,
                      k->n_in);
    if ((rc = ein_term_parse(k, eq, eq + s, i - s, &terms[nt])) < 0)
      return rc;
    nt++;
    s = i + 1;
  }
  if (nt != k->n_in)
    return ES_KFAIL(k, ES_EMODEL, "equation '%s' has %d terms for %d operands", eq, nt, k->n_in);

  /* label extents; the ellipsis' dims are labels 52.. (right-aligned, broadcast) */
  int64_t ext[EIN_MAX_LABELS];
  int count[EIN_MAX_LABELS] = {0};
  for (int l = 0; l < EIN_MAX_LABELS; l++)
    ext[l] = -1;
  int ell_rank = 0;
  for (int o = 0; o < nt; o++) {
    const ein_term *t = &terms[o];
    const es_tdesc *x = k->in[o];
    int named = t->n - (t->ell >= 0);
    if (t->ell < 0 ? named != x->rank : named > x->rank)
      return ES_KFAIL(k, ES_EMODEL, "equation '%s': term %d names %d axes, operand %d has rank %d",
                      eq, o, named, o, x->rank);
    int er = x->rank - named;
    ell_rank = er > ell_rank ? er : ell_rank;
  }
  for (int o = 0; o < nt; o++) {
    const ein_term *t = &terms[o];
    const es_tdesc *x = k->in[o];
    int er = x->rank - (t->n - (t->ell >= 0)), axis = 0;
    for (int j = 0; j < t->n; j++) {
      if (t->lab[j] < 0) {
        for (int e = 0; e < er; e++, axis++) {
          int l = 52 + ell_rank - er + e;
          int64_t d = x->dims[axis];
          if (ext[l] < 0 || ext[l] == 1)
            ext[l] = d;
          else if (d != 1 && d != ext[l])
            return ES_KFAIL(k, ES_EMODEL, "equation '%s': ellipsis dims do not broadcast "
                            "(%lld vs %lld)", eq, (long long)d, (long long)ext[l]);
        }
        continue;
      }
      int l = t->lab[j];
      int64_t d = x->dims[axis++];
      if (ext[l] >= 0 && ext[l] != d)
        return ES_KFAIL(k, ES_EMODEL, "equation '%s': label '%c' is %lld and %lld", eq,
                        l < 26 ? 'A' + l : 'a' + l - 26, (long long)ext[l], (long long)d);
      ext[l] = d;
      count[l]++;
    }
  }

  /* the output term */
  if (arrow) {
    if ((rc = ein_term_parse(k, eq, arrow + 2, strlen(arrow + 2), &out_t)) < 0)
      return rc;
    if (out_t.ell < 0 && ell_rank > 0)
      return ES_KFAIL(k, ES_ENOTSUP, "equation '%s': summing over the ellipsis (an output "
                      "without '...') is not implemented", eq);
    for (int j = 0; j < out_t.n; j++)
      for (int i = 0; i < j; i++)
        if (out_t.lab[j] >= 0 && out_t.lab[i] == out_t.lab[j])
          return ES_KFAIL(k, ES_EMODEL, "equation '%s': an output label appears twice", eq);
    for (int j = 0; j < out_t.n; j++)
      if (out_t.lab[j] >= 0 && ext[out_t.lab[j]] < 0)
        return ES_KFAIL(k, ES_EMODEL, "equation '%s': output label '%c' is in no input", eq,
                        out_t.lab[j] < 26 ? 'A' + out_t.lab[j] : 'a' + out_t.lab[j] - 26);
  } else {
    out_t.n = 0;
    out_t.ell = ell_rank > 0 ? 0 : -1;
    if (ell_rank > 0)
      out_t.lab[out_t.n++] = -1;
    for (int l = 0; l < 52; l++)
      if (count[l] == 1) {
        if (out_t.n > ES_MAX_RANK)
          return ES_KFAIL(k, ES_ENOTSUP, "equation '%s': the output has more than %d axes", eq,
                          ES_MAX_RANK);
        out_t.lab[out_t.n++] = l;
      }
  }

  /* label order: the output's, then the summed ones */
  int order[EIN_MAX_LABELS], pos[EIN_MAX_LABELS], n_lab = 0;
  for (int l = 0; l < EIN_MAX_LABELS; l++)
    pos[l] = -1;
  int64_t odims[ES_MAX_RANK];
  int orank = 0;
  for (int j = 0; j < out_t.n; j++) {
    if (out_t.lab[j] < 0) {
      for (int e = 0; e < ell_rank; e++) {
        if (orank >= ES_MAX_RANK)
          return ES_KFAIL(k, ES_ENOTSUP, "equation '%s': the output has more than %d axes", eq,
                          ES_MAX_RANK);
        pos[52 + e] = n_lab;
        order[n_lab++] = 52 + e;
        odims[orank++] = ext[52 + e];
      }
      continue;
    }
    if (orank >= ES_MAX_RANK)
      return ES_KFAIL(k, ES_ENOTSUP, "equation '%s': the output has more than %d axes", eq,
                      ES_MAX_RANK);
    pos[out_t.lab[j]] = n_lab;
    order[n_lab++] = out_t.lab[j];
    odims[orank++] = ext[out_t.lab[j]];
  }
  p->n_out = n_lab;
  for (int l = 0; l < EIN_MAX_LABELS; l++)
    if (ext[l] >= 0 && pos[l] < 0) {
      pos[l] = n_lab;
      order[n_lab++] = l;
    }
  p->n_sum = n_lab - p->n_out;
  p->n_ops = nt;
  p->dt = dt;
  for (int i = 0; i < n_lab; i++)
    p->ext[i] = ext[order[i]];
  /* strides: each axis adds its stride to its label's */
  for (int o = 0; o < nt; o++) {
    const ein_term *t = &terms[o];
    const es_tdesc *x = k->in[o];
    int er = x->rank - (t->n - (t->ell >= 0)), axis = 0;
    int64_t st[ES_MAX_RANK], s = 1;
    for (int a = x->rank - 1; a >= 0; a--) {
      st[a] = s;
      s *= x->dims[a];
    }
    for (int j = 0; j < t->n; j++) {
      if (t->lab[j] < 0) {
        for (int e = 0; e < er; e++, axis++)
          if (x->dims[axis] != 1)
            p->str[pos[52 + ell_rank - er + e]][o] += st[axis];
        continue;
      }
      p->str[pos[t->lab[j]]][o] += st[axis++];
    }
  }
  if ((rc = es__tdesc_set(k->out[0], dt, orank, odims)) < 0)
    return rc;
  p->out_count = (int64_t)k->out[0]->count;
  return 0;
}

/* For each output element (output labels' odometer, last fastest), the sum
 * over the summed labels' odometer of the operands' product. */
#define EINSUM_FN(NAME, T, U)                                                             \
  static void NAME(const einsum_params *p, const void *const *in, T *y) {                 \
    const T *x[EIN_MAX_OPS];                                                              \
    int no = p->n_ops, nl = p->n_out + p->n_sum;                                          \
    for (int o = 0; o < no; o++)                                                          \
      x[o] = in[o];                                                                       \
    int64_t idx[EIN_MAX_LABELS] = {0}, off[EIN_MAX_OPS] = {0};                            \
    int64_t sum_count = 1;                                                                \
    for (int l = p->n_out; l < nl; l++)                                                   \
      sum_count *= p->ext[l];                                                             \
    for (int64_t e = 0; e < p->out_count; e++) {                                          \
      T acc = 0;                                                                          \
      for (int64_t s = 0; s < sum_count; s++) {                                           \
        T v = 1;                                                                          \
        for (int o = 0; o < no; o++)                                                      \
          v = (T)((U)v * (U)x[o][off[o]]);                                                \
        acc = (T)((U)acc + (U)v);                                                         \
        for (int l = nl - 1; l >= p->n_out; l--) {                                        \
          for (int o = 0; o < no; o++)                                                    \
            off[o] += p->str[l][o];                                                       \
          if (++idx[l] < p->ext[l])                                                       \
            break;                                                                        \
          for (int o = 0; o < no; o++)                                                    \
            off[o] -= p->str[l][o] * p->ext[l];                                           \
          idx[l] = 0;                                                                     \
        }                                                                                 \
      }                                                                                   \
      y[e] = acc;                                                                         \
      for (int l = p->n_out - 1; l >= 0; l--) {                                           \
        for (int o = 0; o < no; o++)                                                      \
          off[o] += p->str[l][o];                                                         \
        if (++idx[l] < p->ext[l])                                                         \
          break;                                                                          \
        for (int o = 0; o < no; o++)                                                      \
          off[o] -= p->str[l][o] * p->ext[l];                                             \
        idx[l] = 0;                                                                       \
      }                                                                                   \
    }                                                                                     \
  }

EINSUM_FN(einsum_f32, float, float)
EINSUM_FN(einsum_i32, int32_t, uint32_t)
EINSUM_FN(einsum_i64, int64_t, uint64_t)

static int einsum_run(const es_kinst *k, const void *const *in, void *const *out,
                      void *scratch) {
  (void)scratch;
  const einsum_params *p = k->params;
  if (p->dt == ES_DTYPE_FLOAT)
    einsum_f32(p, in, out[0]);
  else if (p->dt == ES_DTYPE_INT32)
    einsum_i32(p, in, out[0]);
  else
    einsum_i64(p, in, out[0]);
  return 0;
}

/* ==========================================================================
 * Family
 * ======================================================================== */

static const es_kernel gemm_kernel = {gemm_infer, gemm_run, gemm_release, 0};
static const es_kernel einsum_kernel = {einsum_infer, einsum_run, NULL, 0};

const es_kernel *es__kernels_linalg(es_op op) {
  switch (op) {
  case ES_OP_Gemm:
    return &gemm_kernel;
  case ES_OP_Einsum:
    return &einsum_kernel;
  default:
    return NULL;
  }
}
