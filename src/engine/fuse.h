/* The fusion passes' shared state and helpers (src/engine/fuse*.c): the
 * symbolic shape of every value, and the small graph queries and edits the
 * passes share. Internal to the engine; the passes are explained in
 * fuse.c. */
#ifndef ES_ENGINE_FUSE_H
#define ES_ENGINE_FUSE_H

#include "engine/engine_internal.h"
#include "kernels/fused.h"

/* A dimension: >= 0 a known extent, < 0 symbol number -1 - d. Known
 * extents stay below DIM_MAX and the attributes used in arithmetic below
 * ATTR_MAX (anything larger becomes a fresh symbol), so no computation on
 * them can overflow, whatever a hostile model says. */
#define DIM_MAX ((int64_t)1 << 40)
#define ATTR_MAX ((int64_t)1 << 20)

static inline int attr_small(int64_t v) { return v >= -ATTR_MAX && v <= ATTR_MAX; }
typedef struct sshape {
  int rank; /* -1: unknown */
  int64_t d[ES_MAX_RANK];
  es_dtype dt; /* ES_DTYPE_UNDEFINED: unknown */
} sshape;

typedef enum sym_kind {
  SYM_FRESH = 0,   /* unknown, equal only to itself */
  SYM_WINDOW = 1,  /* sliding window: a = input, p = {pb, pe, span, stride, ceil}; without
                      ceil {0, pb + pe - span, 0, stride, 0}, all that decides it */
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
  int *sym_table;      /* open addressing: index of a non-fresh symbol, or -1 */
  size_t sym_slots;    /* a power of two, at least twice the symbols in it */
  size_t sym_used;
  int oom;             /* a symbol could not be stored: every later one is fresh */
  int64_t n_unstored;  /* symbols handed out since */
  unsigned char *gone; /* per node: removed, until the pass compacts the graph */
  /* Readers: per value below n_rd, a list (entries rd_node, linked by
   * rd_next from rd_head) of the node slots that may read it: every live
   * reader is listed, and dead or stale entries are skipped (and dropped).
   * Built when the node array is compacted; es__fz_commit adds the readers
   * a rewrite makes. */
  int *rd_head;
  int n_rd;
  int *rd_node, *rd_next;
  int n_ent, cap_ent;
  /* The rewrite in progress (es__fz_touch): per touched slot, what it read
   * and wrote before: slot, n_in, n_out, then the value indices. */
  int *log;
  int n_log, cap_log;
} fuser;

/* ---- passes, in the order es__graph_fuse runs them ------------------------ */

int es__fuse_shapes(fuser *f);      /* fuse_shapes.c: symbolic shapes and types */
/* Frees what the passes allocated in f (not f itself). */
void es__fuser_fini(fuser *f);
int es__fuse_identities(fuser *f);  /* fuse.c: Mul by ones, Add of zeros... */
int es__fuse_zero_concats(fuser *f); /* fuse.c: Concat of zeros as a Pad */
int es__fuse_pads(fuser *f);        /* fuse.c: zero Pad into Conv / AveragePool */
int es__fuse_convs(fuser *f);       /* fuse_conv.c: affine maps and post-ops */
int es__fuse_matmuls(fuser *f);    /* fuse_conv.c: a MatMul's bias and post-ops */
int es__fuse_bn_relu(fuser *f);     /* fuse_conv.c: Relu into BatchNormalization */
int es__fuse_layernorms(fuser *f);  /* fuse_layernorm.c */
int es__fuse_elementwise(fuser *f); /* fuse_ew.c: FusedElementwise programs */
/* fuse_ew.c: the elementwise family's operators that fuse_shapes.c does
 * not list: output 0's shape (1: input 0's, 2: the broadcast of inputs 0
 * and 1, 0: unknown) and type from input 0's (ES_DTYPE_UNDEFINED: unknown). */
int es__fz_ew_shape(const es_node *nd);
es_dtype es__fz_ew_dtype(const es_node *nd, es_dtype x);

/* ---- shared helpers (fuse.c) -------------------------------------------- */

void es__fz_shape_of(const fuser *f, int v, sshape *out);
int es__fz_shape_same(const sshape *a, const sshape *b);
int es__fz_attr_int(const es_node *n, const char *name, int64_t def, int64_t *out);
int es__fz_attr_float(const es_node *n, const char *name, float def, float *out);
int es__fz_attr_ints(const es_node *n, const char *name, int len, int64_t def, int64_t *out);
const char *es__fz_attr_str(const es_node *n, const char *name, const char *def);
int es__fz_is_const(const es_graph *g, int v);
int es__fz_const_f32(const es_graph *g, int v);
size_t es__fz_const_count(const es_graph *g, int v);
int es__fz_const_ints(const es_graph *g, int v, int max, int64_t *out, int *n);
int es__fz_const_scalar(const es_graph *g, int v, float *out);
int es__fz_nodes_compact(fuser *f);
int es__fz_index(fuser *f);
int es__fz_touch(fuser *f, int slot);
int es__fz_commit(fuser *f);
void es__fz_index_free(fuser *f);
int es__fz_inner(const es_graph *g, int v, int uses);
int es__fz_consumers(fuser *f, int v, int *out, int max);
int es__fz_consumer(fuser *f, int v);
int es__fz_other_input(const es_node *nd, int v);
es_attr *es__fz_attrs_extend(es_graph *g, const es_node *nd, int extra);
int es__fz_const_fits(const fuser *f, int c, int x);
int es__fz_clip_bounds(const es_graph *g, const es_node *nd, float big, float *lo, float *hi);

#endif
