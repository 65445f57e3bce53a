/* The kernel tests' harness: build a node a kernel can see, describe
 * tensors, and evaluate the node either through es__kernel_eval (what
 * load-time folding does) or by hand, the way the planner makes and runs an
 * instance: some inputs known while planning and others not, the output
 * sharing an input's buffer when infer allows it, inputs in NHWC, and one
 * round of the layouts infer asks for (ES_KRELAYOUT).
 *
 *   kh_node t;
 *   kh_node_init(&t, ES_OP_Transpose);
 *   kh_attr_ints(&t, "perm", perm, 4);
 *   es_tdesc x = KH_TD(ES_DTYPE_FLOAT, 2, 3, 4, 5), y;
 *   void *yd;
 *   ES_CHECK_RC(kh_eval1(&t.node, 13, &x, xd, &y, &yd));
 *   ...
 *   es_mem_free(yd);
 *
 * Failures of the harness itself (out of memory, a kernel asking twice for
 * other layouts) fail the test through cmocka; the kernel's own codes are
 * returned. Outputs and reordered copies are es_mem_alloc'ed: free them
 * with es_mem_free. */
#ifndef ES_TEST_KERNEL_HARNESS_H
#define ES_TEST_KERNEL_HARNESS_H

#include <stdint.h>

#include "kernels/kernel.h"

/* ---- nodes ---------------------------------------------------------------- */

#define KH_MAX_ATTRS 16

/* A node named "t" (#7) with room for its attributes; the values an
 * attribute points at (ints, floats, strings) must outlive the node. */
typedef struct kh_node {
  es_knode node;
  es_attr attrs[KH_MAX_ATTRS];
} kh_node;

void kh_node_init(kh_node *t, es_op op);
es_attr *kh_attr_add(kh_node *t, const char *name, es_attr_type type);
void kh_attr_int(kh_node *t, const char *name, int64_t v);
void kh_attr_float(kh_node *t, const char *name, float v);
void kh_attr_str(kh_node *t, const char *name, const char *s);
void kh_attr_ints(kh_node *t, const char *name, const int64_t *v, size_t n);
void kh_attr_floats(kh_node *t, const char *name, const float *v, size_t n);

/* The same node over a caller's attribute array (for the KH_ATTR_* forms). */
es_knode kh_knode(es_op op, const es_attr *attrs, int n_attr);

#define KH_INT(nm, v) ((es_attr){.name = (nm), .type = ES_ATTR_INT, .i = (v), .tensor = -1})
#define KH_FLOAT(nm, v) ((es_attr){.name = (nm), .type = ES_ATTR_FLOAT, .f = (v), .tensor = -1})
#define KH_STR(nm, v) ((es_attr){.name = (nm), .type = ES_ATTR_STRING, .s = (v), .tensor = -1})
#define KH_INTS(nm, ...)                                                             \
  ((es_attr){.name = (nm),                                                           \
             .type = ES_ATTR_INTS,                                                   \
             .n = sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t),                \
             .ints = (const int64_t[]){__VA_ARGS__},                                 \
             .tensor = -1})
#define KH_LEN(arr) ((int)(sizeof(arr) / sizeof((arr)[0])))

/* ---- tensors -------------------------------------------------------------- */

/* A plain descriptor; the test fails if es__tdesc_set refuses it. */
es_tdesc kh_td(es_dtype dt, int rank, const int64_t *dims);
#define KH_TD(dt, ...)                                                               \
  kh_td((dt), (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)),             \
        (const int64_t[]){__VA_ARGS__})
/* t with layout NHWC (same logical dims). */
es_tdesc kh_as_nhwc(es_tdesc t);

/* A rank-4 or rank-5 tensor's elements [N, C, pixels] reordered to
 * [N, pixels, C] (to_nhwc: NHWC or NDHWC) or back, into dst (t->nbytes).
 * Other ranks are copied as they are. */
void kh_reorder4_into(void *dst, const void *src, const es_tdesc *t, int to_nhwc);
/* The same into a new buffer (t->nbytes + 1 bytes). */
void *kh_reorder4(const void *src, const es_tdesc *t, int to_nhwc);

/* v[0..n) uniform in [lo, hi) from the splitmix stream at *seed
 * (es_test_rand). */
void kh_rand_f32(uint64_t *seed, float *v, size_t n, float lo, float hi);

/* ---- evaluating ----------------------------------------------------------- */

/* es__kernel_eval with one output. */
int kh_eval(const es_knode *nd, int64_t opset, int n_in, const es_tdesc *const *in,
            const void *const *data, es_tdesc *out, void **outd);
/* The same for a one-input node. */
int kh_eval1(const es_knode *nd, int64_t opset, const es_tdesc *x, const void *xd,
             es_tdesc *out, void **outd);

#define KH_MAX_IO 16 /* QLinearConv has 9 inputs, a QLinearConcat of 3 has 11 */

/* An instance made by hand, as the planner makes one. */
typedef struct kh_run {
  es_kinst k;
  const es_kernel *kern;
  es_ctx ctx;
  es_prep_store *prep;
  int64_t opset;
  es_tdesc desc[KH_MAX_IO]; /* the inputs, in the layouts infer saw last */
  const es_tdesc *inp[KH_MAX_IO];
  const void *stat[KH_MAX_IO];
  es_tdesc out[KH_MAX_IO];
  es_tdesc *outp[KH_MAX_IO];
  unsigned relayouts; /* bit i: input i changed layout on the kernel's request */
} kh_run;

/* Prepares node nd at opset with inputs in[] (NULL: omitted) and n_out
 * outputs. Input i is known while planning (in_static) as data[i] unless
 * bit i of dyn is set; data may be NULL (nothing known). prep is the
 * prepared-weights store, or NULL. Calls nothing of the kernel. */
void kh_begin(kh_run *h, const es_knode *nd, int64_t opset, int n_in, const es_tdesc *const *in,
              const void *const *data, unsigned dyn, int n_out, es_prep_store *prep);
/* Calls infer once and returns its code; on ES_KRELAYOUT the requests are
 * in h->k.want_plain / want_nhwc. */
int kh_infer(kh_run *h);
/* Calls infer; when the kernel asks for other input layouts, changes them
 * (h->desc, h->relayouts) and calls it again, once, as the planner does. */
int kh_infer_relayout(kh_run *h);
/* Runs the inferred instance on data into new outputs outd[0..n_out) and
 * scratch of the size infer asked for. inplace: infer must have allowed
 * out[0] to share input 0 (same size); data[0] is copied into out[0],
 * which is passed as both. On an error the outputs are freed and NULL. */
int kh_exec(kh_run *h, const void *const *data, int inplace, void **outd);
/* Runs on plain data, reordered to NHWC for the inputs h has in NHWC, and
 * returns output 0 in plain order. */
void *kh_exec_plain(kh_run *h, const void *const *data);
/* Releases the kernel's parameters and the instance's memory. */
void kh_end(kh_run *h);

/* How kh_eval_with evaluates. */
typedef struct kh_opts {
  int64_t opset;
  unsigned dyn;         /* bit i: input i unknown while planning */
  int inplace;          /* out[0] shares input 0 (see kh_exec) */
  es_prep_store *prep;  /* prepared-weights store, or NULL */
  es_kinst *k_out;      /* if set: the instance after infer (requests, inplace) */
} kh_opts;

/* Evaluates nd by hand (kh_begin, kh_infer, kh_exec, kh_end): out[] gets
 * the output descriptors, outd[] new buffers (NULL on an error). Returns
 * infer's code (ES_KRELAYOUT included, nothing run) or run's. */
int kh_eval_with(const es_knode *nd, const kh_opts *o, int n_in, const es_tdesc *const *in,
                 const void *const *data, int n_out, es_tdesc *out, void **outd);

#endif
