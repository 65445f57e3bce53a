/* oneDNN glue shared by the heavy kernels (Conv and ConvTranspose in conv.c,
 * MatMul in matmul.c). Internal to src/kernels.
 *
 * One CPU engine serves the process (created once); each thread that runs a
 * primitive gets its own stream, created on first use and destroyed when the
 * thread exits. A planned primitive (es_dnnl_prim) lives in a kernel's
 * params: infer creates it, run executes it, release destroys it. Primitives
 * are created with a user scratchpad, so run passes the plan's scratch and
 * one primitive serves any number of threads at once. Each thread also
 * keeps the memory objects of a primitive's last run (keyed by the
 * primitive's unique id), so a run after the first on a thread allocates
 * nothing.
 *
 *   es_dnnl_prim *p = &params->dnnl;
 *   if ((rc = es__dnnl_prim_create(k, &op_desc, post_ops_or_NULL, p)) < 0)
 *     return rc;  // scratch_bytes set
 *   if ((rc = es__dnnl_weights_prepare(k, p, &plain_w_md, w)) < 0) return rc;
 *   ...
 *   es__dnnl_prim_run(k, p, x, p->weights ? p->weights : w, bias, y, bin, scratch);
 */
#ifndef ES_KERNELS_DNNL_GLUE_H
#define ES_KERNELS_DNNL_GLUE_H

#include <oneapi/dnnl/dnnl.h>

#include "kernels/kernel.h"
#include "kernels/post.h"

typedef struct es_dnnl_prim {
  dnnl_primitive_desc_t pd;             /* owns the memory descriptors below */
  dnnl_primitive_t prim;
  const dnnl_memory_desc_t *src_md;     /* as the engine's tensor: plain or nhwc */
  const dnnl_memory_desc_t *wei_md;     /* the layout oneDNN chose */
  const dnnl_memory_desc_t *bias_md;    /* NULL without bias */
  const dnnl_memory_desc_t *dst_md;
  const dnnl_memory_desc_t *scratch_md; /* NULL when no scratchpad is needed */
  dnnl_memory_desc_t bin_md;            /* a binary post-op's second operand ... */
  int bin_arg;                          /* ... and its execution argument; 0: none */
  uint64_t id;                          /* unique per primitive made (never 0) */
  const void *weights;                  /* weights in wei_md's layout (prepared, read-only),
                                           or NULL: run passes the input as it is */
} es_dnnl_prim;

/* Row-major float32 descriptor of ndims dims (1..12). */
dnnl_status_t es__dnnl_plain_md(dnnl_memory_desc_t *md, int ndims, const int64_t *dims);

/* Create the primitive descriptor and primitive for op_desc (forward
 * inference, user scratchpad, post-ops when post is not NULL) and set
 * k->scratch_bytes. A caller with a binary post-op sets p->bin_md and
 * p->bin_arg first. ES_ENOTSUP when oneDNN has no implementation; *p is
 * left for es__dnnl_prim_destroy either way. */
int es__dnnl_prim_create(es_kinst *k, const_dnnl_op_desc_t op_desc, const_dnnl_post_ops_t post,
                         es_dnnl_prim *p);

/* An int8 primitive's requantization: dst = scales[c] * (sum + bias),
 * after the post-ops plus zp_dst, with zp_src taken from the source's
 * values; one scale (n_scales 1) or one per output channel (dim 1, or the
 * dims set in mask: a matmul's columns). */
typedef struct es_dnnl_quant {
  const float *scales;
  int64_t n_scales;
  int32_t zp_src, zp_dst;
  int mask; /* 0: dim 1 */
} es_dnnl_quant;

/* es__dnnl_prim_create with an int8 primitive's scales and zero points. */
int es__dnnl_prim_create_q(es_kinst *k, const_dnnl_op_desc_t op_desc, const_dnnl_post_ops_t post,
                           const es_dnnl_quant *q, es_dnnl_prim *p);

/* A reorder from src to dst (e.g. int8 weights to the float layout a
 * primitive chose), times scales: n of them along the dimensions in mask
 * (or one), fixed in the primitive. Its scratchpad, if any, is at offset 0
 * of k's scratch, like the kernel's own primitive's: run it before that
 * one, with es__dnnl_prim_run(k, p, src, NULL, NULL, dst, NULL, scratch).
 * Raises k->scratch_bytes to its scratchpad when larger. */
int es__dnnl_reorder_create(es_kinst *k, const dnnl_memory_desc_t *src,
                            const dnnl_memory_desc_t *dst, const float *scales, int64_t n,
                            int mask, es_dnnl_prim *p);

/* The fused post-ops as oneDNN's attribute, appended to po: eltwise ops
 * where oneDNN has them (HardSigmoid, missing from 2.6, is linear then
 * clip), the residual as a binary add whose second operand is described
 * like the output (ymd; p->bin_md and p->bin_arg set for
 * es__dnnl_prim_run), or, when sum_ok and it is the first post-op, as a sum
 * into the output (*res_sum = 1: the output must hold the residual before
 * the primitive runs). */
dnnl_status_t es__dnnl_posts(const es_posts *ps, const dnnl_memory_desc_t *ymd,
                             dnnl_post_ops_t po, int sum_ok, es_dnnl_prim *p, int *res_sum);

/* Give the primitive its weights: user_md describes user_data (static, as
 * the model stores it). When oneDNN chose another layout, the weights are
 * reordered once into a prepared copy shared by every plan of the model
 * (keyed by node and layout) and p->weights points to it: at once, or in a
 * model's plan when the plan commits its prepared weights (after infer;
 * es__kinst_prepared), non-NULL from then on. */
int es__dnnl_weights_prepare(es_kinst *k, es_dnnl_prim *p, const dnnl_memory_desc_t *user_md,
                             const void *user_data);

/* Execute on the calling thread's stream. bias and bin (the binary
 * post-op's operand) may be NULL when the primitive has none. Prepared
 * (p->weights) must be passed as they are: a padded layout's pointer is
 * never set again. Thread-safe for one p shared by many threads; allocates
 * only on a thread's first run of p (or when another primitive took its
 * slot in the thread's table). */
int es__dnnl_prim_run(const es_kinst *k, const es_dnnl_prim *p, const void *src,
                      const void *weights, const void *bias, void *dst, const void *bin,
                      void *scratch);

/* Ends a kernel's oneDNN setup that returned rc. ES_ENOTSUP before the
 * primitive exists means oneDNN has no implementation for this geometry or
 * broadcast: the kernel falls back to its reference loops (*use_dnnl = 0,
 * no scratch, returns 0). Any other failure destroys the half-made
 * primitive and is returned. */
int es__dnnl_setup_done(es_kinst *k, es_dnnl_prim *p, int rc, int *use_dnnl);

/* bf16 (es_model_options' ES_PRECISION_BF16). A node marked "_bf16" 1
 * (engine/model.c) runs its primitive on bf16 source and weights, writing
 * float32 (oneDNN accumulates in float32): the weights are prepared in bf16
 * once, like any reordered weights; the source, a float32 tensor of the
 * plan, is rounded to bf16 into the kernel's scratch before each run
 * (es__dnnl_bf16_room, es__f32_to_bf16). Where oneDNN has no bf16 kernel
 * the node falls back to float32. */
int es__dnnl_bf16_wanted(const es_kinst *k);
/* Reserve n bf16 values at the end of k's scratch (after oneDNN's
 * scratchpad, which stays at offset 0); returns their offset. */
size_t es__dnnl_bf16_room(es_kinst *k, size_t n);
/* Round to nearest even, NaN kept a (quiet) NaN. */
void es__f32_to_bf16(uint16_t *dst, const float *src, size_t n);

/* Destroy what es__dnnl_prim_create made; safe on a zeroed or half-made p. */
void es__dnnl_prim_destroy(es_dnnl_prim *p);

/* The implementation oneDNN picked for p, as ONEDNN_VERBOSE names it
 * ("gemm:ref", "brgconv:avx512_core", ...); "" when p has none. */
const char *es__dnnl_impl_name(const es_dnnl_prim *p);

/* ES_ENOMEM / ES_ENOTSUP / ES_EINVAL for a oneDNN status, with a message
 * naming the node and what failed. */
int es__dnnl_fail(const es_kinst *k, dnnl_status_t st, const char *what);

#endif
