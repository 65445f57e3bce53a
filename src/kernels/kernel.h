/* The kernel interface: how the engine plans and runs one node.
 *
 * For every node of a plan (one concrete input shape) the planner makes an
 * es_kinst and calls the operator's infer(): it validates attributes and
 * input types/shapes, sets each output's dtype and shape, parses parameters
 * into k->params (plan memory), says how many scratch bytes run() needs and
 * whether output 0 may reuse an input's buffer. Inputs whose data is known
 * while planning (weights, folded shape chains) are in k->in_static; ops
 * that need an input's values to know their output shape (Reshape's shape,
 * Slice's starts, Resize's sizes...) read them there, and refuse with
 * ES_ENOTSUP when they are not static.
 *
 * run() computes: it reads inputs, writes outputs and may use scratch; it
 * allocates nothing, writes nothing but out[] and scratch, and only reads
 * k (so one plan serves any number of threads at once). Buffers: outputs and
 * scratch are 64-byte aligned and never NULL (even for 0 bytes); inputs are
 * at least 4-byte aligned and never NULL either; an output never overlaps an input unless infer allowed it through k->inplace, in
 * which case out[0] == in[k->inplace] exactly.
 *
 * Data-dependent shapes. An op whose output shape depends on input values
 * the plan does not know (NonZero's count, NonMaxSuppression's selection,
 * TopK's k from a tensor) sets bit o of k->out_bound in infer, gives
 * k->out[o] the largest shape the data can give (the plan places that many
 * bytes) and says what bounds it in k->bound_why. Its run then writes the
 * actual shape through k->out[o] (es__tdesc_set: same dtype and rank, at
 * most the bound's bytes), packed in row-major order at the start of the
 * buffer. The planner gives such a step, and every step that reads a value
 * whose shape came from one, a private es_kinst per run: the nodes after it
 * are inferred again for the actual shapes, so their infer may run at
 * request time (in a fixed region, k->ctx, and without creating prepared
 * weights into a batch) and must not keep pointers to the inputs' data
 * beyond what in_static gave it.
 *
 * Errors: ES_EMODEL (bad attribute or input for this op) or ES_ENOTSUP (a
 * legal ONNX feature the engine does not implement), via ES_KFAIL so the
 * message names the node and op.
 */
#ifndef ES_KERNELS_KERNEL_H
#define ES_KERNELS_KERNEL_H

#include <stddef.h>
#include <stdint.h>

#include "common/internal.h"
#include "common/op.h"
#include "edgeserve/memory.h"
#include "edgeserve/types.h"
#include "memory/ctx.h"

/* Physical order of a tensor's elements. Shapes (dims) are always logical,
 * as ONNX defines them. ES_LAYOUT_NHWC is channels-last, what oneDNN's fast
 * convolutions want: a rank-4 tensor holds logical [N, C, H, W] in memory
 * as [N, H, W, C], a rank-5 one logical [N, C, D, H, W] as [N, D, H, W, C]
 * (NDHWC). Only ranks 4 and 5 are ever channels-last; a kernel sees a rank-5
 * one only if it says it handles it (es_kernel.layout_aware). Every other
 * tensor is plain. */
typedef enum es_layout { ES_LAYOUT_PLAIN = 0, ES_LAYOUT_NHWC = 1 } es_layout;

typedef struct es_tdesc {
  es_layout layout; /* set by es__tdesc_set to plain; layout-aware kernels change it */
  es_dtype dtype;
  int rank;
  int64_t dims[ES_MAX_RANK];
  size_t count;  /* elements (product of dims; 1 for a scalar) */
  size_t nbytes; /* count x element size */
} es_tdesc;

/* Set dtype and shape and compute count and nbytes. ES_EMODEL when a dim is
 * negative or the product overflows (more than 2^40 elements); ES_ENOTSUP
 * for an unsupported dtype or rank > ES_MAX_RANK. */
int es__tdesc_set(es_tdesc *t, es_dtype dtype, int rank, const int64_t *dims);
/* 1 if a and b have the same rank and dims. */
int es__tdesc_same_shape(const es_tdesc *a, const es_tdesc *b);

typedef struct es_prep_store es_prep_store;
typedef struct es_prep_batch es_prep_batch;

/* What a kernel sees of a node: its operator and resolved attributes
 * (tensor attributes included, es_attr.t), never the graph around it. */
typedef struct es_knode {
  es_op op;
  int id;                /* unique within the model (the node's position in its file) */
  const char *name;      /* may be NULL or "" */
  const es_attr *attrs;
  int n_attr;
} es_knode;

typedef struct es_kinst {
  es_knode node;
  int64_t opset;                /* the model's default-domain opset */
  int n_in, n_out;
  const es_tdesc *const *in;    /* [n_in]; NULL for an omitted optional input */
  es_tdesc *const *out;         /* [n_out]; NULL for an omitted output */
  const void *const *in_static; /* [n_in]: data known while planning, else NULL */
  void *params;                 /* the op's parameters (es__kinst_alloc) */
  size_t scratch_bytes;         /* set by infer */
  uint32_t want_plain;          /* infer returning ES_KRELAYOUT: bit i asks for input i plain */
  uint32_t want_nhwc;           /* ... or in NHWC */
  uint64_t flops;               /* set by infer for compute-heavy ops (multiply-adds x 2),
                                   for reporting GFLOP/s; 0 otherwise */
  int inplace;                  /* set by infer: input that out[0] may share, or -1 */
  uint32_t out_bound;           /* set by infer: bit o when output o's shape is decided by
                                   the data; k->out[o] then holds its upper bound, and run
                                   sets the actual shape (see "Data-dependent shapes") */
  uint32_t bound_dims;          /* set by infer with out_bound: bit d when dim d of the
                                   bounded outputs is the one the data decides */
  char bound_why[96];           /* set by infer with out_bound: what bounds it ("the
                                   element count of X", "k <= the axis' length 300") */
  int data_needed;              /* set by infer refusing with ES_ENOTSUP because its output's
                                   shape comes from an input's values the plan does not know
                                   and nothing bounds (Resize's sizes, Range's limits, a
                                   Reshape's shape computed from the pixels): the planner
                                   then runs the node, and what follows from it, without a
                                   plan (engine/interp.c), where every value is known */
  es_ctx *ctx;                  /* the plan's context memory */
  es_prep_store *prep;          /* the model's prepared weights, or NULL */
  es_prep_batch *prep_batch;    /* the plan's prepared weights still to fill, or NULL:
                                   filled when asked for (es__kinst_prepared) */
  char label[120];              /* "node 'name' (#12 Conv)" */
} es_kinst;

/* Zeroed plan memory that lives as long as the plan; NULL on OOM. */
void *es__kinst_alloc(es_kinst *k, size_t size);
/* The same for a kernel's parameters: on OOM also sets the node's error
 * (ES_ENOMEM naming it), so infer can return ES_ENOMEM at once. */
void *es__kinst_params(es_kinst *k, size_t size);
/* Inputs [0, min_in) are required and at most max_in are accepted; outputs
 * likewise, where required outputs must not have been omitted. 0, or
 * ES_EMODEL naming the node. */
int es__kio_check(es_kinst *k, int min_in, int max_in, int min_out, int max_out);
/* Row-major element strides of a shape (st[rank - 1] = 1). */
void es__strides_of(int rank, const int64_t *dims, int64_t *st);

/* A static input the loader left in the model file's mapping at whatever
 * byte offset the exporter wrote it (onnx.c's matmul_b_only: the weights
 * of a MatMul or Gemm), which a run reads as floats: it reads an aligned
 * copy made in scratch instead. es__aligned_in_plan (infer, once the path
 * is known; reads: the run reads the input itself, not a prepared copy)
 * reserves the copy's room when the input is static and misaligned;
 * es__aligned_in_get gives what to read (in itself, or the copy, made). */
typedef struct es_aligned_in {
  size_t at;    /* SIZE_MAX: read in place; else the copy's scratch offset */
  size_t bytes;
} es_aligned_in;
void es__aligned_in_plan(es_kinst *k, int input, int reads, es_aligned_in *c);
const void *es__aligned_in_get(const es_aligned_in *c, const void *in, void *scratch);

/* Prepared weights (reordered or packed once, read-only, shared by every
 * plan and request of the model). Gives in *out the copy stored under key
 * (unique per node and format, e.g. "conv:12:w:ABcd16b16a"), creating it
 * the first time with fill(user, dst, bytes) into writable memory that is
 * then sealed read-only. In a model's plan (k->prep_batch set) a copy not
 * stored yet is only asked for: *out is NULL until the planner commits the
 * batch (es__prep_batch_commit), which fills the plan's new copies into one
 * region, so infer must not read *out (run may). fill then gets a copy of
 * user's user_size bytes, taken now: user may live on infer's stack but
 * must not point to anything that dies before the plan. Without a model
 * store (k->prep NULL, as in es__kernel_eval) the copy lives in plan memory
 * and is filled now. Thread-safe. */
typedef int (*es_prep_fill_fn)(void *user, void *dst, size_t bytes);
int es__kinst_prepared(es_kinst *k, const char *key, size_t bytes, es_prep_fill_fn fill,
                       const void *user, size_t user_size, const void **out);

/* A plan's requests for prepared weights (owned by the planner, used by
 * one thread). Commit fills every request whose key the store does not
 * hold yet into one new region (huge pages, 64-byte aligned copies), seals
 * it, adds the entries to s and sets each reader's pointer; the batch is
 * then empty. On failure nothing is stored and the pointers stay NULL. */
int es__prep_batch_create(es_prep_batch **out);
void es__prep_batch_destroy(es_prep_batch *b);
/* Requests made into b so far, each reader counted (a node that asked
 * while inferring moved it): 0 for NULL. */
int es__prep_batch_asks(const es_prep_batch *b);
int es__prep_batch_commit(es_prep_batch *b, es_prep_store *s);

/* The store: owned by a model, one sealed es_weights region per entry. */
int es__prep_store_create(es_prep_store **out);
void es__prep_store_destroy(es_prep_store *s);
/* Bytes of prepared weights held in regions of the store's own (entries
 * borrowed from a compiled file are not counted: the file's mapping is). */
size_t es__prep_store_bytes(const es_prep_store *s);
/* Adds an entry whose bytes live in w (e.g. a compiled model file's
 * mapping): the store takes a reference to w. ES_EINVAL for a key already
 * stored. */
int es__prep_store_add(es_prep_store *s, const char *key, es_weights *w, const void *data,
                       size_t size);
/* Locks every region of the store in RAM, and those commits add from now
 * on (a commit whose lock fails fails: ES_EMEMLOCK names RLIMIT_MEMLOCK). */
int es__prep_store_lock(es_prep_store *s);

/* A lasting cache of prepared weights, kept in files by the engine
 * (engine/prep_cache.c). A store given one looks there before filling a
 * batch's new entries and offers it what it filled. A batch's entries, in
 * order, at their offsets in the region: */
typedef struct es_prep_cache_entry {
  const char *key;
  size_t offset, bytes;
} es_prep_cache_entry;
typedef struct es_prep_cache {
  void *ctx;
  /* 0: *w (one reference) maps a region laid out as e says, its first byte
   * at *base; ES_ENOENT: not cached; other < 0: unusable (counted). */
  int (*find)(void *ctx, const es_prep_cache_entry *e, int n, size_t total, es_weights **w,
              const unsigned char **base);
  /* Stores the filled, sealed bytes at data: 0 and in *w, *base a mapping
   * of the stored copy to use instead (one reference), or < 0. */
  int (*store)(void *ctx, const es_prep_cache_entry *e, int n, size_t total,
               const unsigned char *data, es_weights **w, const unsigned char **base);
  void (*destroy)(void *ctx);
} es_prep_cache;
/* The store takes c's ctx (destroy is called when the store dies). Set it
 * before the model is planned: not thread-safe with commits. */
void es__prep_store_cache_set(es_prep_store *s, const es_prep_cache *c);
typedef struct es_prep_cache_stats {
  uint64_t hits, writes, errors; /* batches found, batches stored, failures */
  size_t bytes;                  /* prepared bytes mapped from the cache's files */
} es_prep_cache_stats;
void es__prep_store_cache_stats(es_prep_store *s, es_prep_cache_stats *out);
/* Calls fn for every entry until it returns non-zero (which is returned). */
int es__prep_store_each(es_prep_store *s,
                        int (*fn)(void *user, const char *key, const void *data, size_t size),
                        void *user);

#define ES_KFAIL(k, err, ...) es__kfail((k), (err), __VA_ARGS__)
int es__kfail(const es_kinst *k, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A hot loop over runtime lengths built once per x86-64 vector width, the
 * loader picking the one the CPU runs: the default build targets baseline
 * x86-64 (SSE2), where a pooling window's 64-channel accumulator does not
 * even fit the registers. Not under ThreadSanitizer: the loader runs the
 * clone resolvers before the sanitizer runtime is up, and instrumented
 * resolvers crash. */
#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
#define ES_KCLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define ES_KCLONES
#endif

typedef struct es_kernel {
  int (*infer)(es_kinst *k);
  int (*run)(const es_kinst *k, const void *const *in, void *const *out, void *scratch);
  void (*release)(es_kinst *k); /* frees what params hold outside plan memory; may be NULL */
  /* 0: the planner converts every NHWC input to plain before infer, and the
   * outputs are plain. 1: infer sees inputs in whatever layout they are, sets
   * each output's layout, and may ask for other input layouts by setting
   * want_plain / want_nhwc bits and returning ES_KRELAYOUT (once); the
   * planner then adds the conversions and calls infer again. Channels-last
   * inputs are rank 4 (NHWC) only: the planner converts rank-5 ones to
   * plain first, so a kernel written for NHWC never meets NDHWC.
   * ES_KLAYOUT_5D (2): as 1, and rank-5 inputs may be channels-last too. */
  int layout_aware;
} es_kernel;

#define ES_KLAYOUT_5D 2

/* Positive: not an error, "convert the inputs I marked and ask me again". */
#define ES_KRELAYOUT 1


/* NULL for an op without a kernel (Constant is folded by the loader). */
const es_kernel *es__kernel_for(es_op op);

/* Each op family answers for its own ops, NULL for others. */
const es_kernel *es__kernels_elementwise(es_op op);
const es_kernel *es__kernels_shape(es_op op);
const es_kernel *es__kernels_pool(es_op op);
const es_kernel *es__kernels_reduce(es_op op);
const es_kernel *es__kernels_resize(es_op op);
const es_kernel *es__kernels_norm(es_op op);
const es_kernel *es__kernels_conv(es_op op);
const es_kernel *es__kernels_matmul(es_op op);
const es_kernel *es__kernels_layout(es_op op);
const es_kernel *es__kernels_fused(es_op op);
const es_kernel *es__kernels_layernorm(es_op op);
const es_kernel *es__kernels_indexing(es_op op);
const es_kernel *es__kernels_linalg(es_op op);
const es_kernel *es__kernels_signal(es_op op);
const es_kernel *es__kernels_sample(es_op op);
const es_kernel *es__kernels_quant(es_op op);
const es_kernel *es__kernels_recurrent(es_op op);
const es_kernel *es__kernels_control(es_op op);

/* Run heavy ops (Conv, ConvTranspose, MatMul) with the plain C reference
 * kernels instead of oneDNN, for plans made after the call (the public
 * es_engine_reference_kernels_set). Thread-safe. */
void es__kernels_use_reference(int on);
/* Safe points (es_engine_split_set, es_engine_safe_point_set): the FLOPs
 * above which a kernel made now splits its run into parts (0: never), and
 * the call a kernel makes between two parts, which runs the calling
 * thread's hook if it has one. */
uint64_t es__kernels_split_flops(void);
void es__kernels_split_set(uint64_t flops);
void es__kernels_safe_point(void);
void es__kernels_safe_point_set(void (*fn)(void *user), void *user);
int es__kernels_reference(void);
/* 0 when oneDNN runs bf16 convolutions natively here (avx512_bf16 or AMX,
 * within ONEDNN_MAX_CPU_ISA); ES_ENOTSUP naming the missing feature. */
int es__kernels_bf16_check(void);

/* Intra-op threads for kernels run by the calling thread (oneDNN's
 * OpenMP regions); our own kernels are single-threaded. ES_EINVAL outside
 * 1..1024. */
int es__kernels_set_threads(int n);
/* Applies 1 thread on the calling thread if it never chose (cheap after the
 * first call); the planner calls it at the start of every run. */
void es__kernels_threads_default(void);

/* ---- attributes: absent -> default; present with another type -> ES_EMODEL */
int es__attr_int(const es_kinst *k, const char *name, int64_t def, int64_t *out);
int es__attr_float(const es_kinst *k, const char *name, float def, float *out);
int es__attr_string(const es_kinst *k, const char *name, const char *def, const char **out);
/* *n = 0 and *v = NULL when absent. */
int es__attr_ints(const es_kinst *k, const char *name, const int64_t **v, size_t *n);
int es__attr_floats(const es_kinst *k, const char *name, const float **v, size_t *n);
int es__attr_strings(const es_kinst *k, const char *name, const char *const **v, size_t *n);

/* Evaluate one node outside a plan: infer, then run into fresh outputs.
 * Used for load-time folding and by tests. out_data[i] is allocated with
 * es_mem_alloc(ES_MEM_ENGINE) and owned by the caller (free with
 * es_mem_free). */
int es__kernel_eval(const es_knode *node, int64_t opset, int n_in, const es_tdesc *const *in_desc,
                    const void *const *in_data, int n_out, es_tdesc *out_desc, void **out_data);

/* The node's attribute called name, or NULL. */
static inline const es_attr *es__kattr(const es_kinst *k, const char *name) {
  return es__attr_find(k->node.attrs, k->node.n_attr, name);
}

/* ---- helpers shared by kernels ------------------------------------------------ */

/* A ConvTranspose whose kernel equals its stride as one matmul (conv.c,
 * quant.c): its weights [C][M][kh][kw] (esz bytes each) as the matmul's
 * [kh][C][kw*M]. */
void es__kxs_weights(void *dst, const void *w, size_t esz, int64_t c, int64_t m, int64_t kh,
                     int64_t kw);

/* Layouts. The physical dims of t (its dims in memory order). */
void es__tdesc_phys_dims(const es_tdesc *t, int64_t *dims);
/* The physical position of logical axis a (in [0, rank)). */
int es__layout_axis(const es_tdesc *t, int a);
/* 1 if a plain tensor's bytes, broadcast against a channels-last tensor of
 * rank `rank` (4 or 5), can be read in channels-last order as they are:
 * after right-aligning to that rank, its channel dim is 1 or all its spatial
 * dims are 1 (a per-channel vector or a scalar), so no element moves. A
 * channels-last tensor of that rank is compatible too. */
int es__tdesc_cl_compatible(const es_tdesc *t, int rank);
/* The same against a rank-4 NHWC tensor. */
int es__tdesc_nhwc_compatible(const es_tdesc *t);
/* t's dims as a broadcast into a channels-last output of rank `rank` reads
 * them: right-aligned to that rank (leading 1s), in memory order (N,
 * spatial..., C). For a compatible plain tensor this only moves dims of
 * size 1, so its bytes are read as they are. rank in [2, ES_MAX_RANK] and
 * at least t->rank (else dims is left as it is). */
void es__tdesc_cl_view(const es_tdesc *t, int rank, int64_t *dims);

/* The layout rule of broadcasting elementwise ops over inputs 0..n_in-1
 * whose broadcast output has rank `rank`: no NHWC input -> plain output
 * (*nhwc = 0); otherwise the output is channels-last (*nhwc = 1) when the
 * output has rank 4 or 5, every channels-last input has that rank and every
 * other input reads correctly in that order (es__tdesc_cl_compatible);
 * inputs that do not are marked for conversion and ES_KRELAYOUT is returned
 * (to channels-last for ones of the output's rank; when another rank is
 * involved, the channels-last inputs go back to plain instead). A caller
 * that is not ES_KLAYOUT_5D never meets a rank-5 channels-last input, so
 * never gets a rank-5 channels-last output. */
int es__broadcast_layout_pick(es_kinst *k, int n_in, int rank, int *nhwc);

/* y[i] += a * x[i] for i in [0, n): the inner loop of the reference Conv
 * and MatMul kernels. Written with vector extensions because -O2 does not
 * vectorise a loop of unknown trip count. */
typedef float es_v8f __attribute__((vector_size(32)));
static inline void es__axpy_f32(float *restrict y, const float *restrict x, float a, int64_t n) {
  es_v8f av = (es_v8f){0} + a;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    es_v8f xv, yv;
    __builtin_memcpy(&xv, x + i, sizeof xv);
    __builtin_memcpy(&yv, y + i, sizeof yv);
    yv += av * xv;
    __builtin_memcpy(y + i, &yv, sizeof yv);
  }
  for (; i < n; i++)
    y[i] += a * x[i];
}

/* Numpy-style broadcast of a and b into out (shape only). ES_EMODEL if the
 * shapes do not broadcast. */
int es__broadcast_shape(const es_kinst *k, const es_tdesc *a, const es_tdesc *b, int *rank,
                        int64_t *dims);
/* Normalise an axis in [-rank, rank) to [0, rank); ES_EMODEL otherwise. */
int es__axis_norm(const es_kinst *k, int64_t axis, int rank, int *out);
/* Read element i of a static int32/int64 tensor as int64. */
int64_t es__static_i64(const es_tdesc *t, const void *data, size_t i);

#endif
