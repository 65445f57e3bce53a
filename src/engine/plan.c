/* The planner: a model, made concrete for one set of input shapes.
 *
 * Planning walks the graph once in topological order:
 *
 *   1. Shapes. Every node's kernel infers its outputs' types and shapes from
 *      its inputs' (and from input *values* where ONNX needs them: Reshape's
 *      shape, Slice's starts...).
 *   2. Folding. A node whose inputs are all known while planning (weights,
 *      or values computed from shapes: Shape -> Cast -> Slice -> Concat
 *      chains) is run right away; its outputs become plan constants. What is
 *      left are the nodes a request actually runs.
 *   3. Memory. Each remaining intermediate tensor lives from the step that
 *      produces it to the last step that reads it (outputs to the end); each
 *      kernel's scratch lives for its own step. Where a kernel allows it and
 *      its input dies at that step, the output takes over the input's buffer
 *      (in place). Buffers are then placed in one arena, largest first, each
 *      at the lowest offset that overlaps no placed buffer alive at the same
 *      time (TensorFlow Lite Micro's greedy-by-size). The highest end is the
 *      arena's exact size.
 *   4. Prepared weights. What kernels asked for while inferring (weights
 *      reordered into oneDNN's layouts) and the model does not hold yet is
 *      filled after the walk, all into one region (es__prep_batch_commit):
 *      one mapping in huge pages instead of one per node, whose 4 KiB page
 *      faults were most of a plan's time. A node folded while planning
 *      that asked for some gets the batch filled before it runs.
 *
 * Layouts. Each value has one (plain, or channels-last: NHWC at rank 4,
 * NDHWC at rank 5; src/kernels/kernel.h). A kernel that does not know
 * layouts gets its inputs plain, one written for rank 4 only gets rank-5
 * inputs plain, and a layout-aware kernel may ask for other input layouts
 * (ES_KRELAYOUT). Each conversion is a Relayout step, made once per value
 * and layout and shared by its readers; graph outputs leave plain.
 *
 * A run is then a loop over steps with pointers computed from the arena's
 * base: nothing is allocated and the plan is only read, so one plan serves
 * any number of concurrent requests, each in its own arena.
 *
 * Data-dependent shapes. A kernel whose output shape depends on values the
 * plan does not know (NonZero, NonMaxSuppression, TopK with k from data)
 * gives the largest shape the data can make (kernel.h); the planner places
 * that, and every value computed from it is planned at the bounds too:
 * shape chains over bounded tensors (Shape -> Gather -> Min...) are
 * computed now at the bounds, for the kernels that read them as sizes, and
 * again by each run. Such values get a slot in the run's shape table; the
 * steps that make them run with a private es_kinst whose outputs are those
 * slots, and a step reading one is inferred again at run time, for the
 * actual shapes, its parameters in a region of the arena as large as the
 * largest planned ones and half again. Each inferred output must fit its
 * planned bytes (a shape computation that shrinks as its inputs grow would
 * not): else the run stops with ES_EBOUND, never writing past a buffer.
 * The table and the region sit after the buffers, inside arena_bytes. A
 * model without such ops plans and runs exactly as before.
 *
 * A node whose kernel refuses it (ES_ENOTSUP: an attribute value, a type the
 * kernel does not run) does not end the walk: it is listed, its outputs are
 * lost, the nodes that read them are skipped, and the others are still
 * planned, so one failed plan names every node that cannot run rather than
 * the first. es__plan_diagnose does the same for a model that the loader
 * already found unable to run (its marked nodes and values are lost from the
 * start) and keeps model errors (ES_EMODEL) on the list too. */
#include "common/internal.h"
#include "edgeserve/memory.h"
#include "engine/engine_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ES_PLAN_MAGIC 0x4553504c414e3031ull /* "ESPLAN01" */
#define ES_PLAN_ALIGN 64
#define ES_PLAN_MAX_IO 256

/* Where a step finds a tensor at run time. */
typedef enum loc_kind {
  LOC_NONE = 0,   /* omitted optional tensor */
  LOC_STATIC = 1, /* weights or plan constant: ptr */
  LOC_INPUT = 2,  /* request input: index */
  LOC_ARENA = 3,  /* request arena: offset */
  LOC_HEAP = 4,   /* made by the nodes run without a plan: slot `input` of the tail */
} loc_kind;

typedef struct loc {
  loc_kind kind;
  int input;
  int rt;  /* LOC_ARENA: the value's slot in the run's shape table (the data
              decides its shape), or -1 */
  int sym; /* the value is a shape computation's result over such shapes:
              a step inferred again reads it as a value (in_static) */
  size_t offset;
  const void *ptr;
} loc;

typedef struct step {
  const es_node *nd; /* the graph node (or a planner-made Relayout node) */
  es_kinst k;
  const es_kernel *kern;
  loc *in;
  loc *out;
  size_t scratch_offset;
  /* Data-dependent shapes: 0 runs k as planned; 1 runs a private copy of k
   * whose outputs' shapes go to the run's table (a bounded output); 2 also
   * infers again first, for its inputs' actual shapes. */
  int dyn;
  es_tdesc *in_desc;  /* dyn: the planned input descriptors (bounds) */
  es_tdesc *out_desc; /* dyn: the planned output descriptors (bounds) */
  /* An inlined If branch's step whose condition the plan does not know: it
   * runs only when each guard's value (a bool) is guard_on[i]. */
  int n_guard;
  int *guard_v;       /* while planning: the values */
  loc *guard;
  unsigned char *guard_on;
} step;

/* A value whose shape the data decides, for es_plan_bound_info. */
typedef struct bound_rec {
  const char *value;
  uint32_t dims; /* the dims the data decides (an operator's bound) */
  char node[120];
  char why[96];  /* "" for a value inheriting its bound */
  es_tdesc desc; /* the bound */
} bound_rec;

struct es_plan {
  uint64_t magic;
  _Atomic int refs;
  es_model *model;
  es_ctx ctx;          /* everything below lives here, but the steps */
  step *steps;         /* es_mem: grown while planning, then trimmed */
  int n_steps;
  es_tdesc *in_desc;   /* per model input */
  int n_in;
  es_tdesc *out_desc;  /* per model output */
  loc *out_loc;
  int *out_value;      /* planner value index per output (for its name) */
  int n_out;
  int relayouts;       /* conversion steps between layouts */
  size_t arena_bytes;
  uint64_t flops;      /* per run, from the kernels that report it */
  _Atomic uint64_t *step_ns; /* per step, summed over profiled runs; the
                                extra last slot counts the runs */
  /* Data-dependent shapes: the run's table of actual shapes (one es_tdesc
   * per slot) and the region steps are inferred again in sit in the arena
   * after the buffers: arena_bytes counts them. */
  int n_rt;
  size_t rt_offset;
  size_t infer_offset, infer_bytes;
  bound_rec *bounds; /* one per slot */
  _Atomic uint64_t *bound_seen; /* per slot: the most bytes a profiled run gave it */
  /* Nodes no bound covers, run without a plan after the steps (interp.c):
   * the tail, a program over slots; the entries are the slots it reads
   * from the plan (their buffers live to the end of the steps). */
  es_iprog tail;
  struct tail_entry *entry;
  int n_entry;
  char tail_node[120];
  char tail_why[240];
};

typedef struct tail_entry {
  int slot;
  loc l;
  es_tdesc desc; /* the planned one (l.rt >= 0: the run's table has it) */
} tail_entry;

static _Atomic int es_profile_; /* es_engine_profile_set */

static int plan_ok(const es_plan *p) { return p && p->magic == ES_PLAN_MAGIC; }

/* ==========================================================================
 * Memory planning: buffers, lifetimes, greedy placement
 * ======================================================================== */

typedef struct buffer {
  size_t size;
  int first, last; /* steps during which it must stay intact */
  size_t offset;
  int placed;
} buffer;

static int cmp_buf_size(const void *a, const void *b, void *bufs_) {
  const buffer *bufs = bufs_;
  const buffer *x = &bufs[*(const int *)a], *y = &bufs[*(const int *)b];
  if (x->size != y->size)
    return x->size < y->size ? 1 : -1;
  if (x->first != y->first) /* stable tie-break: earlier first */
    return x->first < y->first ? -1 : 1;
  return *(const int *)a < *(const int *)b ? -1 : 1;
}

/* Placement asks, for each buffer in turn, which buffers placed before it
 * are alive at some step of its lifetime [first, last]. A segment tree over
 * first steps answers it: each node holds the latest last step among the
 * placed buffers whose first step lies in its range (-1: none), and each
 * leaf lists those buffers. The buffers alive during [a, b] are those with
 * first <= b and last >= a: the walk visits only the nodes left of b whose
 * latest last reaches a, so a query costs O((k + 1) log steps) for k
 * answers, where scanning every placed buffer made planning a graph of n
 * steps cost n^2 (a chain of 20,000 Transposes: 0.9 s, 200,000: minutes). */
typedef struct live_index {
  int leaves;    /* a power of two >= the number of first steps */
  int *max_last; /* 2 * leaves tree nodes, root at 1 */
  int *head;     /* per first step: the last placed buffer starting there, or -1 */
  int *next;     /* per buffer: the previous one placed with the same first step */
  int *stack;    /* the walk's pending nodes: at most 2 per tree level */
} live_index;

static int live_index_init(live_index *ix, int steps, int nbuf) {
  ix->leaves = 1;
  int levels = 1;
  while (ix->leaves < steps) {
    ix->leaves *= 2;
    levels++;
  }
  ix->max_last = es_mem_alloc(ES_MEM_ENGINE, 2 * (size_t)ix->leaves * sizeof *ix->max_last);
  ix->head = es_mem_alloc(ES_MEM_ENGINE, (size_t)ix->leaves * sizeof *ix->head);
  ix->next = es_mem_alloc(ES_MEM_ENGINE, ((size_t)nbuf + 1) * sizeof *ix->next);
  ix->stack = es_mem_alloc(ES_MEM_ENGINE, 2 * ((size_t)levels + 1) * sizeof *ix->stack);
  if (!ix->max_last || !ix->head || !ix->next || !ix->stack)
    return ES_ENOMEM;
  memset(ix->max_last, 0xff, 2 * (size_t)ix->leaves * sizeof *ix->max_last);
  memset(ix->head, 0xff, (size_t)ix->leaves * sizeof *ix->head);
  return 0;
}

static void live_index_fini(live_index *ix) {
  es_mem_free(ix->max_last);
  es_mem_free(ix->head);
  es_mem_free(ix->next);
  es_mem_free(ix->stack);
}

static void live_index_add(live_index *ix, const buffer *b, int i) {
  ix->next[i] = ix->head[b[i].first];
  ix->head[b[i].first] = i;
  for (int node = ix->leaves + b[i].first; node >= 1 && ix->max_last[node] < b[i].last;
       node /= 2)
    ix->max_last[node] = b[i].last;
}

/* The placed buffers alive at some step of [a, bl] into out; their count. */
static int live_index_query(const live_index *ix, const buffer *b, int a, int bl, int *out) {
  int n = 0, top = 0;
  ix->stack[top++] = 1;
  while (top > 0) {
    int node = ix->stack[--top];
    if (ix->max_last[node] < a)
      continue;
    /* the node's range of first steps: [lo, lo + width) */
    int depth = 31 - __builtin_clz((unsigned)node);
    int width = ix->leaves >> depth;
    int lo = (node - (1 << depth)) * width;
    if (lo > bl)
      continue;
    if (width == 1) {
      for (int i = ix->head[lo]; i >= 0; i = ix->next[i])
        if (b[i].last >= a)
          out[n++] = i;
      continue;
    }
    ix->stack[top++] = 2 * node + 1;
    ix->stack[top++] = 2 * node;
  }
  return n;
}

static int cmp_buf_offset(const void *a, const void *b, void *bufs_) {
  const buffer *bufs = bufs_;
  size_t x = bufs[*(const int *)a].offset, y = bufs[*(const int *)b].offset;
  return (x > y) - (x < y);
}

/* Place buffers, largest first, each at the lowest offset where it overlaps
 * no placed buffer alive at the same time (TensorFlow Lite Micro's greedy
 * by size). Returns the arena size, (size_t)-1 on overflow, (size_t)-2
 * when out of memory. */
static size_t place_buffers(buffer *b, int n, int *order, int steps) {
  for (int i = 0; i < n; i++)
    order[i] = i;
  qsort_r(order, (size_t)n, sizeof *order, cmp_buf_size, b);
  live_index ix = {0};
  int *alive = es_mem_alloc(ES_MEM_ENGINE, ((size_t)n + 1) * sizeof *alive);
  size_t total = 0;
  if (!alive || live_index_init(&ix, steps > 0 ? steps : 1, n) < 0) {
    total = (size_t)-2;
    goto out;
  }
  for (int oi = 0; oi < n; oi++) {
    buffer *x = &b[order[oi]];
    x->placed = 1;
    if (x->size == 0) {
      x->offset = 0; /* takes no room: conflicts with nothing */
      continue;
    }
    /* The lowest offset that fits: walk the alive buffers by offset, moving
     * past each one that would overlap a placement at the current offset. */
    int k = live_index_query(&ix, b, x->first, x->last, alive);
    qsort_r(alive, (size_t)k, sizeof *alive, cmp_buf_offset, b);
    size_t at = 0;
    for (int j = 0; j < k; j++) {
      const buffer *o = &b[alive[j]];
      if (o->offset >= at && o->offset - at >= x->size)
        break; /* the gap before o holds x */
      if (o->offset + o->size > at)
        at = o->offset + o->size;
    }
    x->offset = at;
    if (x->size > SIZE_MAX - at) {
      total = (size_t)-1;
      goto out;
    }
    if (at + x->size > total)
      total = at + x->size;
    live_index_add(&ix, b, order[oi]);
  }
out:
  live_index_fini(&ix);
  es_mem_free(alive);
  return total;
}

/* ==========================================================================
 * Planning
 * ======================================================================== */

/* The planner's view of a value. Graph values keep their indices; values the
 * planner adds (a tensor converted to another layout) follow them. */
typedef struct pval {
  es_tdesc desc;
  const void *sdata;  /* data known while planning (weights, folded), or NULL */
  const char *name;
  int input;          /* graph input index, or -1 */
  int is_output;      /* a graph output (after any conversion to plain) */
  int last_use;       /* last step reading it */
  int buf;            /* arena buffer, or -1 */
  int copy[2];        /* the value holding it in layout L (ES_LAYOUT_*), or -1 */
  int lost;           /* not computed: made by a node that cannot run */
  int rt;             /* its shape is decided by the data: its slot in the run's
                         shape table (desc holds the bound), or -1 */
  int sym;            /* sdata holds its value at the bounds, for planning the
                         nodes that read it; a run computes it too */
  int untaken;        /* made in an If branch the plan knows is not taken */
  int heap;           /* made by a node run without a plan (the tail) */
  int tail_read;      /* read by the tail: its buffer lives to the end */
  int slot;           /* its slot in the tail, or -1 */
} pval;

/* Both arrays grow as planning goes (doubling), so that a plan holds what
 * it uses: sizing them for the worst case (a layout conversion for every
 * node input) made a chain of 200,000 nodes zero 220 MB it never used. */
typedef struct planner {
  es_plan *p;
  const es_graph *g;
  pval *v;             /* es_mem */
  int nv, cap_v;
  int cap_steps;
  es_prep_batch *prep; /* prepared weights asked for and not filled yet */
  es_issues *issues;   /* the nodes that cannot run */
  int diagnose;        /* es__plan_diagnose: model errors are listed too */
  int unreached;       /* nodes skipped after one that cannot run */
  int cap_rt;          /* p->bounds' room */
  size_t infer_max;    /* the largest parameters a step inferred again takes */
  int *if_cond;        /* per If id, its merge's condition value (es__graph_if_conds) */
  int max_if;
  int reveal;          /* kinst_bind shows values at the bounds to every op */
  const es_node **tail; /* es_mem: the nodes run without a plan, in order */
  int n_tail, cap_tail;
} planner;

/* Room for one more element in *arr (es_mem, *cap elements of size). */
static int grow(void **arr, int *cap, int n, size_t size) {
  if (n < *cap)
    return 0;
  if (*cap > (1 << 28))
    return es__fail(ES_ENOTSUP, "the plan needs more than %d steps or values", *cap);
  int ncap = *cap < 64 ? 64 : *cap * 2;
  void *na = *arr ? es_mem_realloc(*arr, (size_t)ncap * size)
                  : es_mem_alloc(ES_MEM_ENGINE, (size_t)ncap * size);
  if (!na)
    return es__fail(ES_ENOMEM, "out of memory planning");
  *arr = na;
  *cap = ncap;
  return 0;
}

static int check_input_shape(const es_value *v, const es_tensor_info *s, int i) {
  if (s->dtype != v->dtype)
    return es__fail(ES_EINVAL, "input %d '%s': dtype %s, the model wants %s", i, v->name,
                    es_dtype_name(s->dtype), es_dtype_name(v->dtype));
  if (s->rank < 0 || s->rank > ES_MAX_RANK)
    return es__fail(ES_EINVAL, "input %d '%s': rank %d is invalid", i, v->name, s->rank);
  if (v->rank >= 0 && s->rank != v->rank)
    return es__fail(ES_EINVAL, "input %d '%s': rank %d, the model wants %d", i, v->name, s->rank,
                    v->rank);
  for (int d = 0; d < s->rank; d++) {
    if (s->dims[d] < 0)
      return es__fail(ES_EINVAL, "input %d '%s': dimension %d is negative", i, v->name, d);
    if (v->rank >= 0 && v->dims[d] >= 0 && v->dims[d] != s->dims[d])
      return es__fail(ES_EINVAL, "input %d '%s': dimension %d is %lld, the model fixes it to %lld",
                      i, v->name, d, (long long)s->dims[d], (long long)v->dims[d]);
  }
  return 0;
}

/* The next step slot, zeroed, in *out. A slot taken before may move: hold
 * no step pointer across a call that can make steps. */
static int step_new(planner *P, step **out) {
  es_plan *p = P->p;
  void *arr = p->steps;
  int rc = grow(&arr, &P->cap_steps, p->n_steps, sizeof(step));
  p->steps = arr;
  if (rc < 0)
    return rc;
  *out = &p->steps[p->n_steps];
  memset(*out, 0, sizeof **out);
  return 0;
}

/* Ops whose output shape counts input values rather than reading them as
 * sizes: a value computed at the bounds says nothing of the actual count,
 * so they read such an input as data the plan does not know. An If merge
 * too: a condition computed at the bounds does not say which branch a run
 * takes. */
static int counts_values(es_op op) {
  return op == ES_OP_NonZero || op == ES_OP_Unique || op == ES_OP_Compress ||
         op == ES_OP_NonMaxSuppression || op == ES_OP_If;
}

/* Fill st's kernel instance for node nd with the planner's current
 * descriptors. *all_static: every input is known (a value at the bounds
 * counts); *dyn_in: some input's shape is decided by the data, or its value
 * computed over such shapes. */
static int kinst_bind(planner *P, step *st, const es_node *nd, int *all_static, int *dyn_in) {
  es_plan *p = P->p;
  es_kinst *k = &st->k;
  st->nd = nd;
  const es_tdesc **in = es__ctx_alloc(&p->ctx, ((size_t)nd->n_in + 1) * sizeof *in);
  es_tdesc **out = es__ctx_alloc(&p->ctx, ((size_t)nd->n_out + 1) * sizeof *out);
  const void **ins = es__ctx_alloc(&p->ctx, ((size_t)nd->n_in + 1) * sizeof *ins);
  if (!in || !out || !ins)
    return es__fail(ES_ENOMEM, "out of memory planning");
  *all_static = 1;
  *dyn_in = 0;
  for (int i = 0; i < nd->n_in; i++) {
    int v = nd->in[i];
    if (v < 0)
      continue;
    if (P->v[v].untaken)
      continue; /* an If merge's input from the branch not taken: omitted */
    if (P->v[v].desc.dtype == ES_DTYPE_UNDEFINED)
      return es__fail(ES_EMODEL, "%s: input %d '%s' has no computed value", k->label, i,
                      P->v[v].name);
    in[i] = &P->v[v].desc;
    ins[i] = P->v[v].sym && counts_values(nd->op) && !P->reveal ? NULL : P->v[v].sdata;
    if (!ins[i])
      *all_static = 0;
    if (P->v[v].rt >= 0)
      *dyn_in = 1;
  }
  for (int o = 0; o < nd->n_out; o++)
    out[o] = nd->out[o] >= 0 ? &P->v[nd->out[o]].desc : NULL;
  k->node = es__knode_of(nd);
  k->opset = P->g->opset;
  k->n_in = nd->n_in;
  k->n_out = nd->n_out;
  k->in = in;
  k->out = out;
  k->in_static = ins;
  k->inplace = -1;
  k->ctx = &p->ctx;
  k->prep = p->model->prep;
  k->prep_batch = P->prep;
  return 0;
}

/* Runs a node whose inputs are all known now; its outputs become plan
 * constants. asked: the node asked for prepared weights while inferring,
 * which are filled first (with the rest of the plan's so far). */
static int fold_step(planner *P, step *st, const es_kernel *kern, int asked) {
  const es_node *nd = st->nd;
  es_kinst *k = &st->k;
  int rc = asked ? es__prep_batch_commit(P->prep, P->p->model->prep) : 0;
  if (rc < 0)
    return rc;
  void *outs[ES_PLAN_MAX_IO];
  for (int o = 0; o < nd->n_out; o++) {
    outs[o] = NULL;
    if (nd->out[o] < 0)
      continue;
    size_t n = P->v[nd->out[o]].desc.nbytes;
    outs[o] = es__ctx_alloc(&P->p->ctx, n ? n : 1);
    if (!outs[o])
      return es__fail(ES_ENOMEM, "out of memory folding %s", k->label);
  }
  /* Kernels get a valid scratch pointer even when they asked for 0 bytes. */
  void *scratch = es_mem_aligned_alloc(ES_MEM_ENGINE, ES_PLAN_ALIGN,
                                       k->scratch_bytes ? k->scratch_bytes : 1);
  if (!scratch)
    return es__fail(ES_ENOMEM, "out of memory folding %s", k->label);
  rc = kern->run(k, k->in_static, outs, scratch);
  es_mem_free(scratch);
  if (rc < 0)
    return rc;
  for (int o = 0; o < nd->n_out; o++)
    if (nd->out[o] >= 0)
      P->v[nd->out[o]].sdata = outs[o];
  return 0;
}

/* Records a runtime step: flops, producers, last uses. */
static void step_commit(planner *P, step *st, const es_kernel *kern) {
  es_plan *p = P->p;
  const es_node *nd = st->nd;
  st->kern = kern;
  p->flops += st->k.flops;
  for (int i = 0; i < nd->n_in; i++)
    if (nd->in[i] >= 0)
      P->v[nd->in[i]].last_use = p->n_steps;
  for (int i = 0; i < st->n_guard; i++)
    P->v[st->guard_v[i]].last_use = p->n_steps;
  p->n_steps++;
}

/* A value at the bounds is computed while planning (for the nodes that read
 * it as a size) only while it is this small: a shape chain's ints, not a
 * tensor of zeros made at a bound's size. */
#define SYM_FOLD_MAX 65536

/* Records a step that runs with a data-dependent shape in or out (dyn 2:
 * an input's; 1: only its own outputs'): the planned descriptors it checks
 * a run's against, a slot in the run's shape table per output, and the
 * parameter bytes its infer took (the region a run infers it again in). */
static int dyn_commit(planner *P, step *st, const es_kernel *kern, int dyn_in, int sym,
                      size_t param_bytes) {
  es_plan *p = P->p;
  const es_node *nd = st->nd;
  es_kinst *k = &st->k;
  st->dyn = dyn_in ? 2 : 1;
  st->out_desc = es__ctx_alloc(&p->ctx, ((size_t)nd->n_out + 1) * sizeof(es_tdesc));
  st->in_desc = es__ctx_alloc(&p->ctx, ((size_t)nd->n_in + 1) * sizeof(es_tdesc));
  if (!st->out_desc || !st->in_desc)
    return es__fail(ES_ENOMEM, "out of memory planning");
  for (int i = 0; i < nd->n_in; i++)
    if (nd->in[i] >= 0 && !P->v[nd->in[i]].untaken)
      st->in_desc[i] = P->v[nd->in[i]].desc;
  for (int o = 0; o < nd->n_out; o++) {
    int v = nd->out[o];
    if (v < 0)
      continue;
    st->out_desc[o] = P->v[v].desc;
    void *arr = p->bounds;
    int rc = grow(&arr, &P->cap_rt, p->n_rt, sizeof *p->bounds);
    p->bounds = arr;
    if (rc < 0)
      return rc;
    bound_rec *b = &p->bounds[p->n_rt];
    memset(b, 0, sizeof *b);
    b->value = P->v[v].name;
    snprintf(b->node, sizeof b->node, "%s", k->label);
    if (o < 32 && (k->out_bound >> o & 1)) {
      snprintf(b->why, sizeof b->why, "%s", k->bound_why[0] ? k->bound_why : "the data");
      b->dims = k->bound_dims;
    }
    b->desc = P->v[v].desc;
    P->v[v].rt = p->n_rt++;
    P->v[v].sym = sym;
  }
  if (dyn_in && param_bytes > P->infer_max)
    P->infer_max = param_bytes;
  step_commit(P, st, kern);
  return 0;
}

/* Makes (or reuses) the copy of value v in layout lay: a conversion step,
 * or for a value known while planning, a conversion done now. Returns the
 * copy's value index or a negative error. */
static int value_in_layout(planner *P, int v, es_layout lay) {
  es_plan *p = P->p;
  if (P->v[v].desc.layout == lay)
    return v;
  if (P->v[v].copy[lay] >= 0)
    return P->v[v].copy[lay];
  void *arr = P->v;
  int rc = grow(&arr, &P->cap_v, P->nv, sizeof *P->v);
  P->v = arr;
  if (rc < 0)
    return rc;
  int c = P->nv++;
  pval *pv = &P->v[c];
  memset(pv, 0, sizeof *pv);
  pv->name = P->v[v].name;
  pv->input = -1;
  pv->last_use = -1;
  pv->buf = -1;
  pv->rt = -1;
  pv->copy[0] = pv->copy[1] = -1;
  P->v[v].copy[lay] = c;
  pv->copy[P->v[v].desc.layout] = v;

  es_node *nd = es__ctx_alloc(&p->ctx, sizeof *nd);
  int *io = es__ctx_alloc(&p->ctx, 2 * sizeof *io);
  es_attr *at = es__ctx_alloc(&p->ctx, sizeof *at);
  if (!nd || !io || !at)
    return es__fail(ES_ENOMEM, "out of memory planning");
  io[0] = v;
  io[1] = c;
  at->name = "to";
  at->type = ES_ATTR_INT;
  at->i = lay;
  at->tensor = -1;
  nd->name = P->v[v].name;
  nd->op = ES_OP_Relayout;
  nd->n_in = nd->n_out = 1;
  nd->in = io;
  nd->out = io + 1;
  nd->n_attr = 1;
  nd->attrs = at;
  nd->file_index = -1;

  const es_kernel *kern = es__kernel_for(ES_OP_Relayout);
  step *st;
  if ((rc = step_new(P, &st)) < 0)
    return rc;
  es_kinst *k = &st->k;
  snprintf(k->label, sizeof k->label, "relayout of '%.60s' to %s", P->v[v].name,
           lay == ES_LAYOUT_PLAIN ? "plain" : P->v[v].desc.rank == 5 ? "NDHWC" : "NHWC");
  int all_static, dyn_in;
  rc = kinst_bind(P, st, nd, &all_static, &dyn_in);
  size_t asked = p->ctx.asked;
  if (rc == 0)
    rc = kern->infer(k);
  if (rc == 0 && all_static && !dyn_in)
    return fold_step(P, st, kern, 0) < 0 ? ES_ENOMEM : c;
  if (rc < 0)
    return rc;
  p->relayouts++;
  if (dyn_in) /* a value at the bounds is converted at run time, as data */
    return (rc = dyn_commit(P, st, kern, 1, 0, p->ctx.asked - asked)) < 0 ? rc : c;
  step_commit(P, st, kern);
  return c;
}

/* Points node input i at the copy of its value in layout lay. The graph is
 * shared and immutable, so the first change copies the node (*copied). */
static int node_input_relayout(planner *P, es_node **nd, int *copied, int i, es_layout lay) {
  int c = value_in_layout(P, (*nd)->in[i], lay);
  if (c < 0)
    return c;
  if (!*copied) {
    es_node *cp = es__ctx_alloc(&P->p->ctx, sizeof *cp);
    int *in = es__ctx_alloc(&P->p->ctx, ((size_t)(*nd)->n_in + 1) * sizeof *in);
    if (!cp || !in)
      return es__fail(ES_ENOMEM, "out of memory planning");
    *cp = **nd;
    memcpy(in, (*nd)->in, (size_t)(*nd)->n_in * sizeof *in);
    cp->in = in;
    *nd = cp;
    *copied = 1;
  }
  (*nd)->in[i] = c;
  return 0;
}

/* Lists node nd (label) as one that cannot run, with the failure just
 * recorded, and loses its outputs. The item is the failure without the
 * label, under the operator's name, so nodes refused for the same reason
 * are one item. */
static int node_refused(planner *P, const es_node *nd, const char *label) {
  char what[400], where[160], first[512];
  const char *d = es_last_error_detail();
  snprintf(first, sizeof first, "%s", d);
  size_t ll = strlen(label);
  const char *rest = !strncmp(d, label, ll) && !strncmp(d + ll, ": ", 2) ? d + ll + 2 : d;
  snprintf(what, sizeof what, "%s: %s", es__node_op_type(nd), rest);
  if (nd->name && nd->name[0])
    snprintf(where, sizeof where, "'%.120s'", nd->name);
  else
    snprintf(where, sizeof where, "#%d", nd->file_index);
  for (int o = 0; o < nd->n_out; o++)
    if (nd->out[o] >= 0)
      P->v[nd->out[o]].lost = 1;
  return es__issues_add(P->issues, what, where, 1, first);
}

/* The outputs of a node that is not planned are lost too. */
static void node_skip(planner *P, const es_node *nd) {
  for (int o = 0; o < nd->n_out; o++)
    if (nd->out[o] >= 0)
      P->v[nd->out[o]].lost = 1;
}

/* A guarded node (an inlined If branch's): 1 when the plan knows a guard
 * fails (the node is not planned: its outputs are untaken, as are those of
 * a node reading an untaken value other than a merge); else 0, with the
 * guards the plan does not know in *n_rt and rt_v / rt_on (room for
 * nd->n_guard). */
static int guards_fail(const planner *P, const es_node *nd, int *n_rt, int *rt_v,
                       unsigned char *rt_on) {
  *n_rt = 0;
  for (int i = 0; i < nd->n_in; i++)
    if (nd->op != ES_OP_If && nd->in[i] >= 0 && P->v[nd->in[i]].untaken)
      return 1;
  for (int i = 0; i < nd->n_guard; i++) {
    int id = abs(nd->guard[i]);
    int c = id <= P->max_if && P->if_cond ? P->if_cond[id] : -1;
    if (c < 0)
      continue; /* its merge is gone: the node always runs */
    const pval *cv = &P->v[c];
    if (cv->untaken)
      return 1;
    if (cv->sdata && !cv->sym) {
      if ((*(const uint8_t *)cv->sdata != 0) != (nd->guard[i] > 0))
        return 1;
      continue;
    }
    rt_v[*n_rt] = c;
    rt_on[(*n_rt)++] = nd->guard[i] > 0;
  }
  return 0;
}


/* ---- the tail: nodes no bound covers --------------------------------------- */

/* Node nd runs without a plan, after the steps (interp.c): its inputs from
 * the plan are read in plain order and kept to the end; its outputs are
 * the heap's. why: what left it without a bound. */
static int tail_add(planner *P, es_node *nd, int *copied, const char *label, const char *why) {
  es_plan *p = P->p;
  for (int i = 0; i < nd->n_in; i++) {
    int v = nd->in[i];
    if (v < 0 || P->v[v].heap || P->v[v].untaken || P->v[v].desc.layout == ES_LAYOUT_PLAIN)
      continue;
    int rc = node_input_relayout(P, &nd, copied, i, ES_LAYOUT_PLAIN);
    if (rc < 0)
      return rc;
  }
  void *arr = (void *)P->tail;
  int rc = grow(&arr, &P->cap_tail, P->n_tail, sizeof *P->tail);
  P->tail = arr;
  if (rc < 0)
    return rc;
  P->tail[P->n_tail++] = nd;
  for (int i = 0; i < nd->n_in; i++)
    if (nd->in[i] >= 0 && !P->v[nd->in[i]].heap)
      P->v[nd->in[i]].tail_read = 1;
  for (int i = 0; i < nd->n_guard; i++) {
    int id = abs(nd->guard[i]);
    int c = id <= P->max_if && P->if_cond ? P->if_cond[id] : -1;
    if (c >= 0 && !P->v[c].heap)
      P->v[c].tail_read = 1;
  }
  const es_graph *g = P->g;
  for (int o = 0; o < nd->n_out; o++) {
    int v = nd->out[o];
    if (v < 0)
      continue;
    pval *pv = &P->v[v];
    pv->heap = 1;
    /* what a caller is told of it before a run: the declared type */
    const es_value *gv = v < g->n_values ? &g->values[v] : NULL;
    int64_t dims[ES_MAX_RANK] = {0};
    int rank = gv && gv->rank >= 0 ? gv->rank : 0;
    for (int d = 0; d < rank; d++)
      dims[d] = gv->dims[d] > 0 ? gv->dims[d] : 0;
    es_dtype dt = gv && gv->dtype != ES_DTYPE_UNDEFINED ? gv->dtype : ES_DTYPE_FLOAT;
    if (es__tdesc_set(&pv->desc, dt, rank, dims) < 0)
      es__tdesc_set(&pv->desc, ES_DTYPE_FLOAT, 0, NULL);
  }
  if (!p->tail_node[0]) {
    snprintf(p->tail_node, sizeof p->tail_node, "%s", label);
    snprintf(p->tail_why, sizeof p->tail_why, "%s", why);
  }
  return 0;
}

/* The tail as a program over slots: every value it reads or makes gets
 * one; the nodes are copied with their inputs and outputs renumbered. */
static int tail_build(planner *P) {
  es_plan *p = P->p;
  for (int v = 0; v < P->nv; v++)
    P->v[v].slot = -1;
  int ns = 0;
#define TAIL_SLOT(x)                                                                               \
  do {                                                                                             \
    int x_ = (x);                                                                                  \
    if (x_ >= 0 && P->v[x_].slot < 0)                                                              \
      P->v[x_].slot = ns++;                                                                        \
  } while (0)
  for (int t = 0; t < P->n_tail; t++) {
    const es_node *nd = P->tail[t];
    for (int i = 0; i < nd->n_in; i++)
      TAIL_SLOT(nd->in[i]);
    for (int i = 0; i < nd->n_guard; i++) {
      int id = abs(nd->guard[i]);
      TAIL_SLOT(id <= P->max_if && P->if_cond ? P->if_cond[id] : -1);
    }
    for (int o = 0; o < nd->n_out; o++)
      TAIL_SLOT(nd->out[o]);
  }
#undef TAIL_SLOT
  es_node *nodes = es__ctx_alloc(&p->ctx, (size_t)P->n_tail * sizeof *nodes);
  int *last = es__ctx_alloc(&p->ctx, ((size_t)ns + 1) * sizeof *last);
  int *kept = es__ctx_alloc(&p->ctx, ((size_t)p->n_out + 1) * sizeof *kept);
  int *cond = P->max_if > 0 ? es__ctx_alloc(&p->ctx, ((size_t)P->max_if + 1) * sizeof *cond) : NULL;
  p->entry = es__ctx_alloc(&p->ctx, ((size_t)ns + 1) * sizeof *p->entry);
  if (!nodes || !last || !kept || !p->entry || (P->max_if > 0 && !cond))
    return es__fail(ES_ENOMEM, "out of memory planning");
  for (int id = 0; cond && id <= P->max_if; id++)
    cond[id] = P->if_cond[id] >= 0 ? P->v[P->if_cond[id]].slot : -1;
  for (int t = 0; t < P->n_tail; t++) {
    const es_node *nd = P->tail[t];
    es_node *c = &nodes[t];
    *c = *nd;
    c->in = es__ctx_alloc(&p->ctx, ((size_t)nd->n_in + 1) * sizeof *c->in);
    c->out = es__ctx_alloc(&p->ctx, ((size_t)nd->n_out + 1) * sizeof *c->out);
    if (!c->in || !c->out)
      return es__fail(ES_ENOMEM, "out of memory planning");
    for (int i = 0; i < nd->n_in; i++)
      c->in[i] = nd->in[i] >= 0 ? P->v[nd->in[i]].slot : -1;
    for (int o = 0; o < nd->n_out; o++)
      c->out[o] = nd->out[o] >= 0 ? P->v[nd->out[o]].slot : -1;
  }
  int nk = 0;
  for (int i = 0; i < p->n_out; i++) {
    int v = p->out_value[i];
    if (P->v[v].heap)
      kept[nk++] = P->v[v].slot;
  }
  for (int v = 0; v < P->nv; v++)
    if (P->v[v].slot >= 0 && !P->v[v].heap)
      p->entry[p->n_entry++] = (tail_entry){.slot = v}; /* the value, till plan_memory */
  es__iprog_last_uses(NULL, nodes, P->n_tail, ns, cond, cond ? P->max_if : -1, kept, nk, last);
  p->tail = (es_iprog){.nodes = nodes, .n_nodes = P->n_tail, .n_slots = ns, .last = last,
                       .if_cond = cond, .max_if = cond ? P->max_if : -1};
  return 0;
}

static int plan_nodes(planner *P) {
  es_plan *p = P->p;
  const es_graph *g = P->g;
  for (int n = 0; n < g->n_nodes; n++) {
    es_node *nd = &g->nodes[n];
    int copied = 0;
    int lost = 0;
    for (int i = 0; i < nd->n_in; i++)
      if (nd->in[i] >= 0 && P->v[nd->in[i]].lost)
        lost = 1;
    if (lost) {
      node_skip(P, nd);
      P->unreached++;
      continue;
    }
    int n_guard = 0, guard_v[64];
    unsigned char guard_on[64];
    if (nd->n_guard > 64)
      return es__fail(ES_ENOTSUP, "node #%d: If branches nested more than 64 deep",
                      nd->file_index);
    if (guards_fail(P, nd, &n_guard, guard_v, guard_on)) {
      for (int o = 0; o < nd->n_out; o++)
        if (nd->out[o] >= 0)
          P->v[nd->out[o]].untaken = 1;
      continue;
    }
    const es_kernel *kern = es__kernel_for(nd->op);
    char label[120];
    es__node_label(nd, label, sizeof label);
    if (!nd->unsup) {
      /* a Loop or Scan, or a node reading a value no bound covers, runs
       * without a plan */
      int heap_in = -1;
      for (int i = 0; i < nd->n_in && heap_in < 0; i++)
        if (nd->in[i] >= 0 && P->v[nd->in[i]].heap)
          heap_in = nd->in[i];
      if (nd->body || heap_in >= 0) {
        char why[240];
        if (nd->body && !nd->body->prog) {
          /* a model the loader found unable to run (its body's issues are
           * listed already): only a diagnosis meets one */
          node_skip(P, nd);
          continue;
        }
        int brc = nd->body ? es__body_check(nd) : 0;
        if (brc == ES_EMODEL && !P->diagnose && !P->issues->n)
          return brc;
        if (brc < 0) { /* listed, as a kernel's refusal is */
          int rc = node_refused(P, nd, label);
          if (rc < 0)
            return rc;
          continue;
        }
        if (nd->body)
          snprintf(why, sizeof why, "a %s runs its body once per iteration, without a plan",
                   es__op_name(nd->op));
        else
          snprintf(why, sizeof why, "it reads '%.100s', which no bound covers", P->v[heap_in].name);
        int rc = tail_add(P, nd, &copied, label, why);
        if (rc < 0)
          return rc;
        continue;
      }
    }
    if (nd->unsup || !kern) {
      /* es__graph_check listed it: only a diagnosis meets one */
      if (P->diagnose) {
        node_skip(P, nd);
        continue;
      }
      if (nd->unsup)
        es__fail(ES_ENOTSUP, "%s: %s", label, nd->unsup->why);
      else
        es__fail(ES_ENOTSUP, "%s: no kernel for this operator", label);
      int rc = node_refused(P, nd, label);
      if (rc < 0)
        return rc;
      continue;
    }
    if (nd->n_in > ES_PLAN_MAX_IO || nd->n_out > ES_PLAN_MAX_IO)
      return es__fail(ES_ENOTSUP, "%s: more than %d inputs or outputs", label, ES_PLAN_MAX_IO);
    /* Kernels that do not know layouts see every input in plain order;
     * layout-aware ones written for rank 4 see rank-5 inputs plain. */
    for (int i = 0; i < nd->n_in; i++) {
      const es_tdesc *d = nd->in[i] >= 0 ? &P->v[nd->in[i]].desc : NULL;
      if (d && d->layout != ES_LAYOUT_PLAIN &&
          (!kern->layout_aware || (d->rank == 5 && kern->layout_aware != ES_KLAYOUT_5D))) {
        int rc = node_input_relayout(P, &nd, &copied, i, ES_LAYOUT_PLAIN);
        if (rc < 0)
          return rc;
      }
    }
    step *st;
    int rc = step_new(P, &st);
    if (rc < 0)
      return rc;
    es_kinst *k = &st->k;
    memcpy(k->label, label, sizeof label);
    int all_static, dyn_in, asks = es__prep_batch_asks(P->prep);
    size_t asked = 0;
    for (int attempt = 0;; attempt++) {
      if ((rc = kinst_bind(P, st, nd, &all_static, &dyn_in)) < 0)
        return rc;
      k->want_plain = k->want_nhwc = 0;
      asked = p->ctx.asked;
      rc = kern->infer(k);
      asked = p->ctx.asked - asked;
      if (rc != ES_KRELAYOUT)
        break;
      if (kern->release)
        kern->release(k);
      if (attempt > 0)
        return es__fail(ES_ECORRUPT, "%s: kernel asked twice for other input layouts", label);
      /* The conversions become steps before this one; they reuse the step
       * slot k lives in, so read the requests first. */
      uint32_t want_plain = k->want_plain, want_nhwc = k->want_nhwc;
      for (int i = 0; i < nd->n_in && i < 32; i++) {
        int want = (want_plain >> i) & 1 ? ES_LAYOUT_PLAIN
                   : (want_nhwc >> i) & 1 ? ES_LAYOUT_NHWC
                                          : -1;
        if (want == ES_LAYOUT_NHWC && nd->in[i] >= 0 && P->v[nd->in[i]].desc.rank == 5 &&
            kern->layout_aware != ES_KLAYOUT_5D)
          return es__fail(ES_ECORRUPT, "%s: kernel asked for a rank-5 input channels-last",
                          label);
        if (want >= 0 && nd->in[i] >= 0 &&
            (rc = node_input_relayout(P, &nd, &copied, i, (es_layout)want)) < 0)
          return rc;
      }
      if ((rc = step_new(P, &st)) < 0)
        return rc;
      k = &st->k;
      memcpy(k->label, label, sizeof label);
    }
    if (rc == ES_ENOTSUP && nd->op == ES_OP_If && nd->in[0] >= 0 && P->v[nd->in[0]].sym) {
      /* Branches of different ranks (torchvision's Squeeze-or-not on a dim
       * the data does not decide): planned for the branch the bounds take.
       * A run infers the merge again on its actual condition, so one that
       * takes the other branch still gets its outputs, if they fit. */
      if (kern->release)
        kern->release(k);
      P->reveal = 1;
      rc = kinst_bind(P, st, nd, &all_static, &dyn_in);
      P->reveal = 0;
      if (rc < 0)
        return rc;
      asked = p->ctx.asked;
      rc = kern->infer(k);
      asked = p->ctx.asked - asked;
    }
    if (rc == ES_ENOTSUP && k->data_needed) {
      /* its output's shape comes from data nothing bounds: it and what
       * follows from it run without a plan */
      char why[240];
      snprintf(why, sizeof why, "%s", es_last_error_detail());
      if (kern->release)
        kern->release(k);
      if ((rc = tail_add(P, nd, &copied, label, why)) < 0)
        return rc;
      continue;
    }
    if (rc < 0) {
      if (kern->release)
        kern->release(k);
      /* ES_ENOTSUP: listed, and the walk goes on. A model error after
       * that too (the list is the answer then), and in a diagnosis. */
      if (rc == ES_ENOTSUP || (rc == ES_EMODEL && (P->diagnose || P->issues->n))) {
        if ((rc = node_refused(P, nd, label)) < 0)
          return rc;
        continue;
      }
      return rc;
    }
    for (int o = 0; o < nd->n_out; o++)
      if (k->out[o] && k->out[o]->dtype == ES_DTYPE_UNDEFINED) {
        if (kern->release)
          kern->release(k);
        return es__fail(ES_ECORRUPT, "%s: kernel left output %d without a type", label, o);
      }
    /* Shape and Size read only their input's shape, which planning knows
     * (or its bound). */
    if (nd->op == ES_OP_Shape || nd->op == ES_OP_Size)
      all_static = 1;
    if (all_static && !dyn_in) {
      rc = fold_step(P, st, kern, es__prep_batch_asks(P->prep) != asks);
      if (kern->release)
        kern->release(k);
      if (rc < 0)
        return rc;
      continue;
    }
    if (n_guard) {
      st->n_guard = n_guard;
      st->guard_v = es__ctx_alloc(&p->ctx, (size_t)n_guard * sizeof *st->guard_v);
      st->guard_on = es__ctx_alloc(&p->ctx, (size_t)n_guard);
      if (!st->guard_v || !st->guard_on) {
        if (kern->release)
          kern->release(k);
        return es__fail(ES_ENOMEM, "out of memory planning");
      }
      memcpy(st->guard_v, guard_v, (size_t)n_guard * sizeof *guard_v);
      memcpy(st->guard_on, guard_on, (size_t)n_guard);
    }
    if (dyn_in || k->out_bound) {
      /* A value computed from bounds (a shape chain over a bounded tensor)
       * is computed now too, at the bounds, for the nodes that plan from
       * it, and again by every run, at the actual shapes. */
      size_t out_bytes = 0;
      for (int o = 0; o < nd->n_out; o++)
        if (k->out[o])
          out_bytes += k->out[o]->nbytes;
      int sym = all_static && !k->out_bound && out_bytes <= SYM_FOLD_MAX;
      if (sym && (rc = fold_step(P, st, kern, es__prep_batch_asks(P->prep) != asks)) < 0) {
        if (kern->release)
          kern->release(k);
        return rc;
      }
      if ((rc = dyn_commit(P, st, kern, dyn_in, sym, asked)) < 0) {
        if (kern->release)
          kern->release(k); /* not a step yet: the plan's release skips it */
        return rc;
      }
      continue;
    }
    step_commit(P, st, kern);
  }
  if (P->issues->n)
    return 0; /* the caller answers with the list */
  /* Outputs leave in plain order. */
  for (int i = 0; i < g->n_outputs; i++) {
    int v = g->outputs[i];
    if (!P->v[v].heap && P->v[v].desc.layout != ES_LAYOUT_PLAIN) {
      int c = value_in_layout(P, v, ES_LAYOUT_PLAIN);
      if (c < 0)
        return c;
      P->v[v].is_output = 0;
      P->v[c].is_output = 1;
      p->out_value[i] = c;
    } else {
      p->out_value[i] = v;
    }
  }
  return 0;
}

static void loc_of(const planner *P, const buffer *b, int v, loc *l) {
  l->rt = v >= 0 ? P->v[v].rt : -1;
  l->sym = v >= 0 && P->v[v].sym;
  if (v < 0 || P->v[v].untaken) { /* an If branch the plan left out: never read */
    l->kind = LOC_NONE;
  } else if (P->v[v].sdata && !P->v[v].sym) {
    l->kind = LOC_STATIC;
    l->ptr = P->v[v].sdata;
  } else if (P->v[v].input >= 0) {
    l->kind = LOC_INPUT;
    l->input = P->v[v].input;
  } else {
    l->kind = LOC_ARENA;
    l->offset = b[P->v[v].buf].offset;
  }
}

/* Buffers for activations and scratch, in-place aliasing, placement. */
static int plan_memory(planner *P) {
  es_plan *p = P->p;
  int end = p->n_steps; /* graph outputs live to here */
  int cap = P->nv + p->n_steps + 1;
  buffer *b = es_mem_calloc(ES_MEM_ENGINE, (size_t)cap, sizeof *b);
  int *order = es_mem_calloc(ES_MEM_ENGINE, (size_t)cap, sizeof *order);
  int *scratch_buf = es_mem_calloc(ES_MEM_ENGINE, (size_t)p->n_steps + 1, sizeof *scratch_buf);
  if (!b || !order || !scratch_buf) {
    es_mem_free(b);
    es_mem_free(order);
    es_mem_free(scratch_buf);
    return es__fail(ES_ENOMEM, "out of memory planning");
  }
  int nb = 0;
  for (int s = 0; s < p->n_steps; s++) {
    step *st = &p->steps[s];
    const es_node *nd = st->nd;
    for (int o = 0; o < nd->n_out; o++) {
      int v = nd->out[o];
      if (v < 0)
        continue;
      int last = P->v[v].is_output || P->v[v].tail_read ? end : P->v[v].last_use;
      if (last < s)
        last = s; /* unused output: still written at its step */
      size_t size = es__align_up(P->v[v].desc.nbytes, ES_PLAN_ALIGN);
      /* In place: output 0 takes an input buffer that dies at this step
       * (not where shapes are decided at run time: the kernel inferred
       * again decides anew). */
      int ip = o == 0 && !st->dyn ? st->k.inplace : -1;
      if (ip >= 0 && ip < nd->n_in && nd->in[ip] >= 0) {
        int u = nd->in[ip];
        int bu = P->v[u].buf;
        int shared = 0;
        for (int i = 0; i < nd->n_in; i++)
          if (i != ip && nd->in[i] == u)
            shared = 1; /* the same tensor feeds another input */
        if (bu >= 0 && !shared && P->v[u].last_use == s && !P->v[u].is_output &&
            !P->v[u].tail_read &&
            P->v[u].desc.nbytes == P->v[v].desc.nbytes) {
          P->v[v].buf = bu;
          if (b[bu].last < last)
            b[bu].last = last;
          continue;
        }
      }
      b[nb] = (buffer){.size = size, .first = s, .last = last};
      P->v[v].buf = nb++;
    }
    scratch_buf[s] = -1;
    if (st->k.scratch_bytes) {
      b[nb] = (buffer){.size = es__align_up(st->k.scratch_bytes, ES_PLAN_ALIGN), .first = s,
                       .last = s};
      scratch_buf[s] = nb++;
    }
  }
  size_t total = place_buffers(b, nb, order, p->n_steps);
  int rc = 0;
  if (total == (size_t)-1) {
    rc = es__fail(ES_EOVERFLOW, "arena size overflows");
    goto out;
  }
  if (total == (size_t)-2) {
    rc = es__fail(ES_ENOMEM, "out of memory placing %d buffers", nb);
    goto out;
  }
  /* The run's shape table and the region steps are inferred again in. */
  p->rt_offset = es__align_up(total, ES_PLAN_ALIGN);
  p->infer_offset = p->rt_offset + es__align_up((size_t)p->n_rt * sizeof(es_tdesc), ES_PLAN_ALIGN);
  /* Parameters rarely differ with the dims, but may with a dim's value
   * (a kernel choosing a path): room for half as much again. */
  p->infer_bytes = P->infer_max ? es__align_up(P->infer_max + P->infer_max / 2 + 1024, ES_PLAN_ALIGN)
                                : 0;
  p->arena_bytes = p->n_rt ? p->infer_offset + p->infer_bytes : total;

  /* Resolve every step's tensor locations. */
  for (int s = 0; s < p->n_steps; s++) {
    step *st = &p->steps[s];
    const es_node *nd = st->nd;
    st->in = es__ctx_alloc(&p->ctx, ((size_t)nd->n_in + 1) * sizeof(loc));
    st->out = es__ctx_alloc(&p->ctx, ((size_t)nd->n_out + 1) * sizeof(loc));
    if (!st->in || !st->out) {
      rc = es__fail(ES_ENOMEM, "out of memory planning");
      goto out;
    }
    for (int i = 0; i < nd->n_in; i++)
      loc_of(P, b, nd->in[i], &st->in[i]);
    for (int o = 0; o < nd->n_out; o++) {
      int v = nd->out[o];
      st->out[o].kind = v < 0 ? LOC_NONE : LOC_ARENA;
      st->out[o].rt = v >= 0 ? P->v[v].rt : -1;
      st->out[o].sym = v >= 0 && P->v[v].sym;
      if (v >= 0)
        st->out[o].offset = b[P->v[v].buf].offset;
    }
    st->scratch_offset = scratch_buf[s] >= 0 ? b[scratch_buf[s]].offset : 0;
    if (st->n_guard) {
      st->guard = es__ctx_alloc(&p->ctx, (size_t)st->n_guard * sizeof(loc));
      if (!st->guard) {
        rc = es__fail(ES_ENOMEM, "out of memory planning");
        goto out;
      }
      for (int i = 0; i < st->n_guard; i++)
        loc_of(P, b, st->guard_v[i], &st->guard[i]);
    }
  }
  for (int e = 0; e < p->n_entry; e++) { /* the tail's inputs from the plan */
    tail_entry *te = &p->entry[e];
    int v = te->slot;
    te->slot = P->v[v].slot;
    te->desc = P->v[v].desc;
    loc_of(P, b, v, &te->l);
  }
  for (int i = 0; i < p->n_out; i++) {
    int v = p->out_value[i];
    p->out_desc[i] = P->v[v].desc;
    if (P->v[v].heap) {
      p->out_loc[i] = (loc){.kind = LOC_HEAP, .input = P->v[v].slot, .rt = -1};
      continue;
    }
    if (!P->v[v].sdata && P->v[v].input < 0 && P->v[v].buf < 0) {
      rc = es__fail(ES_EMODEL, "output '%s' is not computed by any node", P->v[v].name);
      goto out;
    }
    loc_of(P, b, v, &p->out_loc[i]);
  }
out:
  es_mem_free(b);
  es_mem_free(order);
  es_mem_free(scratch_buf);
  return rc;
}

int es_model_plan(es_model *m, const es_tensor_info *shapes, int n, es_plan **out) {
  return es__plan_make(m, shapes, n, out, NULL);
}

static int plan_build(es_model *m, const es_tensor_info *shapes, int n, es_plan **out,
                      es_tdesc *value_descs, es_issues *diagnose, int *unreached);

int es__plan_make(es_model *m, const es_tensor_info *shapes, int n, es_plan **out,
                  es_tdesc *value_descs) {
  return plan_build(m, shapes, n, out, value_descs, NULL, NULL);
}

int es__plan_diagnose(es_model *m, const es_tensor_info *shapes, int n, es_issues *out,
                      int *unreached) {
  es_plan *p = NULL;
  int rc = plan_build(m, shapes, n, &p, NULL, out, unreached);
  es_plan_release(p);
  return rc;
}

static int plan_build(es_model *m, const es_tensor_info *shapes, int n, es_plan **out,
                      es_tdesc *value_descs, es_issues *diagnose, int *unreached) {
  if (!es__model_ok(m) || !out || (n > 0 && !shapes))
    return es__fail(ES_EINVAL, "es_model_plan: bad argument");
  const es_graph *g = &m->g;
  if (n != g->n_inputs)
    return es__fail(ES_EINVAL, "the model has %d inputs, %d shapes given", g->n_inputs, n);
  /* oneDNN fixes a primitive's thread count when it is created, from the
   * creating thread's setting: plan with the same default a run uses, or a
   * plan made on a fresh thread would start a team of every core on each
   * run (on a pinned worker, two threads taking turns on one core). */
  es__kernels_threads_default();
  es_plan *p = es_mem_calloc(ES_MEM_ENGINE, 1, sizeof *p);
  if (!p)
    return es__fail(ES_ENOMEM, "out of memory planning");
  p->model = es_model_retain(m);
  p->magic = ES_PLAN_MAGIC;
  atomic_init(&p->refs, 1);
  /* A step per node, and a little room for layout conversions (each a step
   * and a value); more when a graph needs many. */
  es_issues own = {0};
  planner P = {.p = p, .g = g, .nv = g->n_values, .issues = diagnose ? diagnose : &own,
               .diagnose = diagnose != NULL};
  P.cap_v = g->n_values + 16;
  P.cap_steps = g->n_nodes + 16;
  P.v = es_mem_calloc(ES_MEM_ENGINE, (size_t)P.cap_v, sizeof *P.v);
  p->steps = es_mem_alloc(ES_MEM_ENGINE, (size_t)P.cap_steps * sizeof(step));
  p->in_desc = es__ctx_alloc(&p->ctx, ((size_t)g->n_inputs + 1) * sizeof(es_tdesc));
  p->out_desc = es__ctx_alloc(&p->ctx, ((size_t)g->n_outputs + 1) * sizeof(es_tdesc));
  p->out_loc = es__ctx_alloc(&p->ctx, ((size_t)g->n_outputs + 1) * sizeof(loc));
  p->out_value = es__ctx_alloc(&p->ctx, ((size_t)g->n_outputs + 1) * sizeof(int));
  int rc = 0;
  if (!P.v || !p->steps || !p->in_desc || !p->out_desc || !p->out_loc || !p->out_value)
    rc = es__fail(ES_ENOMEM, "out of memory planning");
  if (rc == 0)
    rc = es__prep_batch_create(&P.prep);
  if (rc == 0) {
    P.if_cond = es__graph_if_conds(g, &P.max_if);
    if (!P.if_cond && P.max_if < 0) {
      for (int i = 0; i < g->n_nodes && rc == 0; i++)
        if (g->nodes[i].if_id > 0)
          rc = es__fail(ES_ENOMEM, "out of memory planning");
    }
  }
  for (int v = 0; rc == 0 && v < g->n_values; v++) {
    pval *pv = &P.v[v];
    const es_value *val = &g->values[v];
    pv->name = val->name;
    pv->input = -1;
    pv->is_output = val->is_output;
    pv->last_use = -1;
    pv->buf = -1;
    pv->rt = -1;
    pv->copy[0] = pv->copy[1] = -1;
    if (val->kind == ES_VALUE_CONST) {
      rc = es__tdesc_set(&pv->desc, val->dtype, val->rank, val->dims);
      pv->sdata = val->data ? val->data : (const void *)val; /* empty tensors: any non-NULL */
    }
    pv->lost = val->kind == ES_VALUE_UNSUPPORTED;
  }
  for (int i = 0; rc == 0 && i < g->n_inputs; i++) {
    const es_value *val = &g->values[g->inputs[i]];
    if (val->kind == ES_VALUE_UNSUPPORTED)
      continue; /* lost: what reads it is not planned */
    rc = check_input_shape(val, &shapes[i], i);
    if (rc == 0)
      rc = es__tdesc_set(&P.v[g->inputs[i]].desc, val->dtype, shapes[i].rank, shapes[i].dims);
    if (rc == 0) {
      P.v[g->inputs[i]].input = i;
      p->in_desc[i] = P.v[g->inputs[i]].desc;
    }
  }
  p->n_in = g->n_inputs;
  p->n_out = g->n_outputs;
  if (rc == 0)
    rc = plan_nodes(&P);
  if (unreached)
    *unreached = P.unreached;
  if (rc == 0 && P.issues->n) {
    /* a diagnosis returns its list; a plan fails with it */
    if (!diagnose)
      rc = es__issues_fail(&own, "nodes the engine cannot run with these shapes");
    es__issues_fini(&own);
    es_mem_free(P.v);
    es_mem_free(P.if_cond);
    es_mem_free(P.tail);
    es__prep_batch_destroy(P.prep);
    if (rc < 0) {
      es_plan_release(p);
      return rc;
    }
    *out = p;
    return 0;
  }
  es__issues_fini(&own);
  if (rc == 0 && P.n_tail)
    rc = tail_build(&P);
  if (rc == 0)
    rc = es__prep_batch_commit(P.prep, m->prep);
  es__prep_batch_destroy(P.prep);
  if (rc == 0)
    rc = plan_memory(&P);
  if (rc == 0 && p->n_steps > 0 && p->n_steps < P.cap_steps) {
    step *trimmed = es_mem_realloc(p->steps, (size_t)p->n_steps * sizeof(step));
    if (trimmed) /* else the larger block serves as well */
      p->steps = trimmed;
  }
  if (rc == 0) {
    p->step_ns = es__ctx_alloc(&p->ctx, ((size_t)p->n_steps + 2) * sizeof *p->step_ns);
    p->bound_seen = es__ctx_alloc(&p->ctx, ((size_t)p->n_rt + 1) * sizeof *p->bound_seen);
    if (!p->step_ns || !p->bound_seen)
      rc = es__fail(ES_ENOMEM, "out of memory planning");
  }
  if (rc == 0 && value_descs)
    for (int v = 0; v < g->n_values; v++)
      value_descs[v] = P.v[v].desc;
  es_mem_free(P.v);
  es_mem_free(P.if_cond);
  es_mem_free(P.tail);
  if (rc < 0) {
    es_plan_release(p);
    return rc;
  }
  *out = p;
  return 0;
}

es_plan *es_plan_retain(es_plan *p) {
  if (!plan_ok(p))
    return NULL;
  atomic_fetch_add_explicit(&p->refs, 1, memory_order_relaxed);
  return p;
}

void es_plan_release(es_plan *p) {
  if (!plan_ok(p))
    return;
  if (atomic_fetch_sub_explicit(&p->refs, 1, memory_order_acq_rel) != 1)
    return;
  for (int s = 0; s < p->n_steps; s++)
    if (p->steps[s].kern && p->steps[s].kern->release)
      p->steps[s].kern->release(&p->steps[s].k);
  es_mem_free(p->steps);
  es_mem_free(p->bounds);
  es__ctx_free_all(&p->ctx);
  es_model_release(p->model);
  p->magic = 0;
  es_mem_free(p);
}

/* ==========================================================================
 * Queries
 * ======================================================================== */

size_t es_plan_arena_bytes(const es_plan *p) { return plan_ok(p) ? p->arena_bytes : 0; }
size_t es_plan_context_bytes(const es_plan *p) {
  return plan_ok(p) ? p->ctx.bytes + (size_t)p->n_steps * sizeof(step) : 0;
}
int es_plan_output_count(const es_plan *p) { return plan_ok(p) ? p->n_out : 0; }
int es_plan_node_count(const es_plan *p) { return plan_ok(p) ? p->n_steps : 0; }
int es_plan_bound_count(const es_plan *p) { return plan_ok(p) ? p->n_rt : 0; }
uint64_t es_plan_flops(const es_plan *p) { return plan_ok(p) ? p->flops : 0; }
int es_plan_relayout_count(const es_plan *p) { return plan_ok(p) ? p->relayouts : 0; }

int es_engine_threads_set(int n) { return es__kernels_set_threads(n); }

void es_engine_reference_kernels_set(int on) { es__kernels_use_reference(on); }

void es_engine_split_set(uint64_t flops) { es__kernels_split_set(flops); }

uint64_t es_engine_split_get(void) { return es__kernels_split_flops(); }

void es_engine_safe_point_set(void (*fn)(void *user), void *user) {
  es__kernels_safe_point_set(fn, user);
}

void es_engine_profile_set(int on) { atomic_store(&es_profile_, on ? 1 : 0); }

int es_plan_profile(const es_plan *p,
                    void (*fn)(void *user, const char *op, int nodes, double ms_per_run),
                    void *user) {
  if (!plan_ok(p) || !fn)
    return es__fail(ES_EINVAL, "es_plan_profile: bad argument");
  uint64_t runs = atomic_load(&p->step_ns[p->n_steps]);
  double ns_of[ES_OP_COUNT] = {0};
  int nodes_of[ES_OP_COUNT] = {0};
  for (int s = 0; s < p->n_steps; s++) {
    es_op op = p->steps[s].k.node.op;
    ns_of[op] += (double)atomic_load(&p->step_ns[s]);
    nodes_of[op]++;
  }
  for (int op = 1; op < ES_OP_COUNT; op++)
    if (nodes_of[op])
      fn(user, es__op_name((es_op)op), nodes_of[op], runs ? ns_of[op] / 1e6 / (double)runs : 0);
  if (p->tail.n_nodes)
    fn(user, "(without a plan)", p->tail.n_nodes,
       runs ? (double)atomic_load(&p->step_ns[p->n_steps + 1]) / 1e6 / (double)runs : 0);
  return 0;
}

int es_plan_profile_nodes(const es_plan *p,
                          void (*fn)(void *user, const char *label, double ms_per_run,
                                     uint64_t flops),
                          void *user) {
  if (!plan_ok(p) || !fn)
    return es__fail(ES_EINVAL, "es_plan_profile_nodes: bad argument");
  uint64_t runs = atomic_load(&p->step_ns[p->n_steps]);
  for (int s = 0; s < p->n_steps; s++)
    fn(user, p->steps[s].k.label,
       runs ? (double)atomic_load(&p->step_ns[s]) / 1e6 / (double)runs : 0,
       p->steps[s].k.flops);
  if (p->tail.n_nodes) {
    char label[200];
    snprintf(label, sizeof label, "%d nodes without a plan, from %s", p->tail.n_nodes,
             p->tail_node);
    fn(user, label, runs ? (double)atomic_load(&p->step_ns[p->n_steps + 1]) / 1e6 / (double)runs : 0,
       0);
  }
  return 0;
}

static void info_from(const es_tdesc *t, const char *name, es_tensor_info *out) {
  out->name = name;
  out->dtype = t->dtype;
  out->rank = t->rank;
  for (int i = 0; i < ES_MAX_RANK; i++)
    out->dims[i] = t->dims[i];
}

int es_plan_output_info(const es_plan *p, int i, es_tensor_info *out) {
  if (!plan_ok(p) || !out || i < 0 || i >= p->n_out)
    return es__fail(ES_EINVAL, "no output #%d", i);
  info_from(&p->out_desc[i], p->model->g.values[p->model->g.outputs[i]].name, out);
  return 0;
}

int es_plan_bound_info(const es_plan *p, int i, es_bound_info *out) {
  if (!plan_ok(p) || !out || i < 0 || i >= p->n_rt)
    return es__fail(ES_EINVAL, "no bounded value #%d", i);
  const bound_rec *b = &p->bounds[i];
  out->value = b->value;
  out->node = b->node;
  out->why = b->why;
  info_from(&b->desc, b->value, &out->bound);
  out->bound_bytes = b->desc.nbytes;
  out->data_dims = b->dims;
  out->seen_bytes = (size_t)atomic_load(&p->bound_seen[i]);
  return 0;
}

int es_plan_input_info(const es_plan *p, int i, es_tensor_info *out) {
  if (!plan_ok(p) || !out || i < 0 || i >= p->n_in)
    return es__fail(ES_EINVAL, "no input #%d", i);
  info_from(&p->in_desc[i], p->model->g.values[p->model->g.inputs[i]].name, out);
  return 0;
}

/* ==========================================================================
 * Run
 * ======================================================================== */

static const void *loc_ptr(const loc *l, unsigned char *base, const es_tensor *inputs) {
  switch (l->kind) {
  case LOC_STATIC:
    return l->ptr;
  case LOC_INPUT: /* an empty input may come without data: kernels get a
                     valid pointer for every tensor (memcpy of 0 bytes from
                     NULL is still undefined) */
    return inputs[l->input].data ? inputs[l->input].data : base;
  case LOC_ARENA:
    return base + l->offset;
  default:
    return NULL;
  }
}

/* Runs a step whose shapes the data decides, with its own es_kinst: its
 * outputs' descriptors are the run's table entries (a bounded kernel's run
 * writes the actual shape there), and for dyn 2 its infer runs first for the
 * actual input shapes, its parameters in the arena's region ictx. What the
 * kernel infers must fit what the plan placed: the outputs' bytes, the
 * scratch, the parameters; else ES_EBOUND. */
static int run_dyn(const es_plan *p, const step *st, const void *const *in, void *const *out,
                   void *scratch, es_tdesc *table, es_ctx *ictx) {
  const es_node *nd = st->nd;
  const es_kernel *kern = st->kern;
  es_kinst lk = st->k;
  const es_tdesc *ind[ES_PLAN_MAX_IO];
  es_tdesc *outd[ES_PLAN_MAX_IO];
  const void *ins[ES_PLAN_MAX_IO];
  for (int o = 0; o < nd->n_out; o++)
    outd[o] = st->out[o].kind == LOC_NONE ? NULL : &table[st->out[o].rt];
  lk.out = outd;
  int rc;
  if (st->dyn == 2) {
    for (int i = 0; i < nd->n_in; i++) {
      const loc *l = &st->in[i];
      ind[i] = l->kind == LOC_NONE ? NULL : l->rt >= 0 ? &table[l->rt] : &st->in_desc[i];
      /* what the plan read as a value: a constant, or now its actual value */
      const void *planned = st->k.in_static ? st->k.in_static[i] : NULL;
      ins[i] = !planned ? NULL : l->sym ? in[i] : planned;
    }
    for (int o = 0; o < nd->n_out; o++)
      if (outd[o])
        memset(outd[o], 0, sizeof *outd[o]);
    lk.in = ind;
    lk.in_static = ins;
    lk.params = NULL;
    lk.scratch_bytes = 0;
    lk.want_plain = lk.want_nhwc = 0;
    lk.flops = 0;
    lk.inplace = -1;
    lk.out_bound = 0;
    lk.ctx = ictx;
    lk.prep = p->model->prep;
    lk.prep_batch = NULL;
    es__ctx_free_all(ictx);
    rc = kern->infer(&lk);
    if (rc == ES_ENOMEM && ictx->exhausted) {
      rc = es__fail(ES_EBOUND, "%s: its parameters for these shapes need more than the %zu "
                    "bytes the plan holds", lk.label, p->infer_bytes);
      goto out;
    }
    if (rc == ES_KRELAYOUT)
      rc = es__fail(ES_ECORRUPT, "%s: asked for other input layouts at run time", lk.label);
    if (rc < 0)
      goto out;
    if (lk.scratch_bytes > st->k.scratch_bytes) {
      rc = es__fail(ES_EBOUND, "%s: %zu scratch bytes for these shapes, the plan holds %zu",
                    lk.label, lk.scratch_bytes, st->k.scratch_bytes);
      goto out;
    }
  } else {
    for (int i = 0; i < nd->n_in; i++)
      ind[i] = st->in[i].kind == LOC_NONE ? NULL : &st->in_desc[i];
    lk.in = ind;
    for (int o = 0; o < nd->n_out; o++)
      if (outd[o])
        *outd[o] = st->out_desc[o];
  }
  for (int o = 0; o < nd->n_out; o++) {
    if (outd[o] && outd[o]->nbytes > st->out_desc[o].nbytes) {
      rc = es__fail(ES_EBOUND, "%s: output %d takes %zu bytes for these inputs, its bound %zu",
                    lk.label, o, outd[o]->nbytes, st->out_desc[o].nbytes);
      goto out;
    }
    if (outd[o] && outd[o]->layout != st->out_desc[o].layout) {
      rc = es__fail(ES_ECORRUPT, "%s: output %d changed layout at run time", lk.label, o);
      goto out;
    }
  }
  rc = kern->run(&lk, in, out, scratch);
  for (int o = 0; rc == 0 && o < nd->n_out; o++)
    if (outd[o] && outd[o]->nbytes > st->out_desc[o].nbytes)
      rc = es__fail(ES_ECORRUPT, "%s: output %d wrote a shape past its bound", lk.label, o);
out:
  if (st->dyn == 2 && kern->release)
    kern->release(&lk);
  return rc;
}

/* 1 when every guard of st has the value it runs under. */
static int guards_hold(const step *st, unsigned char *base, const es_tensor *inputs) {
  for (int i = 0; i < st->n_guard; i++) {
    const uint8_t *c = loc_ptr(&st->guard[i], base, inputs);
    if ((*c != 0) != st->guard_on[i])
      return 0;
  }
  return 1;
}

/* Runs the tail after the steps: its entries read from the arena, its
 * results given to outputs[] (heap blocks). */
static int run_tail(const es_plan *p, const es_run_heap *heap, unsigned char *base,
                    const es_tensor *inputs, const es_tdesc *table, es_tensor *outputs, int n_out) {
  es_interp I = {heap, p->model->g.opset};
  const es_iprog *T = &p->tail;
  es_ival *vals;
  size_t vb = (size_t)T->n_slots * sizeof *vals;
  int rc = es__ip_alloc(&I, vb, (void **)&vals);
  if (rc < 0)
    return rc;
  memset(vals, 0, vb ? vb : 1);
  for (int e = 0; e < p->n_entry; e++) {
    const tail_entry *te = &p->entry[e];
    es_ival *v = &vals[te->slot];
    if (te->l.kind == LOC_NONE)
      continue; /* an If branch not taken */
    v->desc = te->l.rt >= 0 ? table[te->l.rt] : te->desc;
    v->data = loc_ptr(&te->l, base, inputs);
  }
  rc = es__iprog_run(&I, T, vals);
  for (int i = 0; rc == 0 && i < n_out; i++) {
    if (p->out_loc[i].kind != LOC_HEAP)
      continue;
    es_ival *v = &vals[p->out_loc[i].input];
    if (!v->data) {
      rc = es__fail(ES_EMODEL, "output '%s' was not computed (its branch did not run)",
                    p->model->g.values[p->model->g.outputs[i]].name);
      break;
    }
    if ((rc = es__ival_own(&I, v)) < 0) /* one output twice, or a value read from the plan */
      break;
    es_tensor *t = &outputs[i];
    t->dtype = v->desc.dtype;
    t->rank = v->desc.rank;
    for (int k = 0; k < ES_MAX_RANK; k++)
      t->dims[k] = k < v->desc.rank ? v->desc.dims[k] : 0;
    t->nbytes = v->desc.nbytes;
    t->data = v->own;
    v->own = NULL; /* the caller's now */
    v->data = NULL;
  }
  if (rc < 0)
    for (int i = 0; i < n_out; i++)
      if (p->out_loc[i].kind == LOC_HEAP && outputs[i].data) {
        heap->free(heap->user, outputs[i].data);
        outputs[i].data = NULL;
      }
  es__iprog_drop_all(&I, T, vals);
  es__ip_free(&I, vals, vb);
  return rc;
}

int es_plan_unbounded_count(const es_plan *p) { return plan_ok(p) ? p->tail.n_nodes : 0; }

int es_plan_output_unbounded(const es_plan *p, int i) {
  return plan_ok(p) && i >= 0 && i < p->n_out && p->out_loc[i].kind == LOC_HEAP;
}

int es_plan_unbounded_info(const es_plan *p, const char **node, const char **why) {
  if (!plan_ok(p) || !node || !why)
    return es__fail(ES_EINVAL, "es_plan_unbounded_info: bad argument");
  *node = p->tail_node;
  *why = p->tail_why;
  return 0;
}

void es_plan_outputs_free(const es_plan *p, const es_run_heap *heap, es_tensor *outputs,
                          int n_out) {
  if (!plan_ok(p) || !outputs)
    return;
  es_mem_heap st = {0};
  es_run_heap mh = es_mem_heap_make(&st); /* its blocks need no state to be freed */
  if (!heap)
    heap = &mh;
  for (int i = 0; i < n_out && i < p->n_out; i++)
    if (p->out_loc[i].kind == LOC_HEAP && outputs[i].data) {
      heap->free(heap->user, outputs[i].data);
      outputs[i].data = NULL;
    }
}

int es_plan_run(const es_plan *p, const es_tensor *inputs, int n_in, es_arena *arena,
                es_tensor *outputs, int n_out) {
  if (!plan_ok(p) || (n_out > 0 && !outputs))
    return es__fail(ES_EINVAL, "es_plan_run: bad argument");
  es_mem_heap st = {0};
  es_run_heap heap = es_mem_heap_make(&st);
  int rc = es_plan_run_heap(p, inputs, n_in, arena, &heap, outputs, n_out);
  if (rc < 0 || !p->tail.n_nodes)
    return rc;
  /* the tail's outputs move into the arena's room after the plan's bytes */
  int i = 0;
  for (; i < n_out; i++) {
    if (p->out_loc[i].kind != LOC_HEAP)
      continue;
    void *dst;
    if (es_arena_alloc(arena, outputs[i].nbytes ? outputs[i].nbytes : 1, &dst) < 0) {
      rc = es__fail(ES_ENOSPC, "output '%s' (%zu bytes, made without a plan) does not fit in the "
                    "arena's room after the plan's %zu bytes: give the arena more, or run with "
                    "es_plan_run_heap", outputs[i].name, outputs[i].nbytes, p->arena_bytes);
      break;
    }
    if (outputs[i].nbytes)
      memcpy(dst, outputs[i].data, outputs[i].nbytes);
    heap.free(heap.user, outputs[i].data);
    outputs[i].data = dst;
  }
  for (; rc < 0 && i < n_out; i++) /* the ones not moved yet */
    if (p->out_loc[i].kind == LOC_HEAP && outputs[i].data) {
      heap.free(heap.user, outputs[i].data);
      outputs[i].data = NULL;
    }
  return rc;
}

/* A run in steps (es_run's private form): where it is, and what each step
 * needs that es_run_begin worked out. Lives in the caller's es_run, so
 * pausing and resuming allocate nothing. */
#define ES_RUN_MAGIC 0x4553525531ull /* "ESRU1" */
typedef struct run_state {
  uint64_t magic;
  const es_plan *p;
  const es_tensor *inputs;
  unsigned char *base;
  const es_run_heap *heap; /* NULL: es_mem's (mh, over mstate) */
  es_ctx ictx;             /* the arena's region steps are inferred again in */
  int next;                /* the next step */
  int failed;
  int profile;
  struct timespec t0;
  es_mem_heap mstate;
  es_run_heap mh;
} run_state;
_Static_assert(sizeof(run_state) <= sizeof(es_run), "es_run is too small for a run's state");

static run_state *run_of(es_run *r) {
  run_state *st = (run_state *)(void *)r;
  return r && st->magic == ES_RUN_MAGIC ? st : NULL;
}

int es_run_begin(es_run *r, const es_plan *p, const es_tensor *inputs, int n_in, es_arena *arena,
                 const es_run_heap *heap) {
  if (!r || !plan_ok(p) || (n_in > 0 && !inputs))
    return es__fail(ES_EINVAL, "es_plan_run: bad argument");
  memset(r, 0, sizeof *r);
  if (heap && (!heap->alloc || !heap->free))
    return es__fail(ES_EINVAL, "es_plan_run_heap: a heap without alloc or free");
  if (n_in != p->n_in)
    return es__fail(ES_EINVAL, "the plan has %d inputs, %d given", p->n_in, n_in);
  const es_graph *g = &p->model->g;
  for (int i = 0; i < n_in; i++) {
    const es_tdesc *want = &p->in_desc[i];
    const es_tensor *t = &inputs[i];
    const char *nm = g->values[g->inputs[i]].name;
    int same = t->dtype == want->dtype && t->rank == want->rank;
    for (int d = 0; same && d < want->rank; d++)
      same = t->dims[d] == want->dims[d];
    if (!same)
      return es__fail(ES_EINVAL, "input %d '%s': type or shape differs from the plan's", i, nm);
    if (!t->data && want->nbytes)
      return es__fail(ES_EINVAL, "input %d '%s': no data", i, nm);
    if (t->nbytes && t->nbytes < want->nbytes)
      return es__fail(ES_EINVAL, "input %d '%s': %zu bytes given, %zu needed", i, nm, t->nbytes,
                      want->nbytes);
  }
  if (!es_arena_is_valid(arena))
    return es__fail(ES_ECORRUPT, "es_plan_run: not a live arena");
  /* Even a plan of 0 bytes takes its (empty) block: the base is then a
   * valid pointer for zero-sized tensors. */
  void *blk;
  int rc = es_arena_alloc(arena, p->arena_bytes, &blk);
  if (rc < 0)
    return rc;
  if ((uintptr_t)blk % ES_PLAN_ALIGN)
    return es__fail(ES_EINVAL, "the arena's alignment is below %d bytes", ES_PLAN_ALIGN);
  run_state *st = (run_state *)(void *)r;
  st->p = p;
  st->inputs = inputs;
  st->base = blk;
  st->heap = heap;
  es__ctx_init_fixed(&st->ictx, st->base + p->infer_offset, p->infer_bytes);
  st->profile = atomic_load_explicit(&es_profile_, memory_order_relaxed);
  if (st->profile) {
    atomic_fetch_add_explicit(&p->step_ns[p->n_steps], 1, memory_order_relaxed);
    clock_gettime(CLOCK_MONOTONIC, &st->t0);
  }
  st->magic = ES_RUN_MAGIC;
  return 0;
}

int es_run_steps(es_run *r, int max_steps) {
  run_state *rs = run_of(r);
  if (!rs || rs->failed)
    return es__fail(ES_EINVAL, "es_run_steps: not a live run");
  const es_plan *p = rs->p;
  const es_tensor *inputs = rs->inputs;
  unsigned char *base = rs->base;
  es_tdesc *table = (es_tdesc *)(void *)(base + p->rt_offset);
  const void *in[ES_PLAN_MAX_IO];
  void *out[ES_PLAN_MAX_IO];
  struct timespec t1;
  /* oneDNN's threads follow the calling thread: a run resumed elsewhere
   * applies the default there too */
  es__kernels_threads_default();
  int end = max_steps > 0 && max_steps < p->n_steps - rs->next ? rs->next + max_steps : p->n_steps;
  for (int s = rs->next; s < end; s++) {
    const step *st = &p->steps[s];
    const es_node *nd = st->nd;
    rs->next = s + 1;
    if (st->n_guard && !guards_hold(st, base, inputs)) {
      /* an If branch not taken: what reads its values (the merge) sees
       * their planned shapes */
      for (int o = 0; o < nd->n_out; o++)
        if (st->out[o].rt >= 0)
          table[st->out[o].rt] = st->out_desc[o];
      continue;
    }
    for (int i = 0; i < nd->n_in; i++)
      in[i] = loc_ptr(&st->in[i], base, inputs);
    for (int o = 0; o < nd->n_out; o++)
      out[o] = (void *)loc_ptr(&st->out[o], base, inputs);
    void *scratch = base + st->scratch_offset; /* valid even when 0 bytes */
    int rc = st->dyn ? run_dyn(p, st, in, out, scratch, table, &rs->ictx)
                     : st->kern->run(&st->k, in, out, scratch);
    if (rc < 0) {
      rs->failed = 1;
      return rc;
    }
    if (rs->profile && st->dyn)
      for (int o = 0; o < nd->n_out; o++) {
        if (st->out[o].rt < 0)
          continue;
        uint64_t b = table[st->out[o].rt].nbytes;
        _Atomic uint64_t *m = &p->bound_seen[st->out[o].rt];
        uint64_t cur = atomic_load_explicit(m, memory_order_relaxed);
        while (b > cur && !atomic_compare_exchange_weak_explicit(m, &cur, b, memory_order_relaxed,
                                                                 memory_order_relaxed))
          ;
      }
    if (rs->profile) {
      clock_gettime(CLOCK_MONOTONIC, &t1);
      uint64_t ns = (uint64_t)((t1.tv_sec - rs->t0.tv_sec) * 1000000000ll +
                               (t1.tv_nsec - rs->t0.tv_nsec));
      atomic_fetch_add_explicit(&p->step_ns[s], ns, memory_order_relaxed);
      rs->t0 = t1;
    }
  }
  return p->n_steps - rs->next;
}

int es_run_progress(es_run *r, int *done, int *total) {
  run_state *rs = run_of(r);
  if (!rs)
    return es__fail(ES_EINVAL, "es_run_progress: not a live run");
  if (done)
    *done = rs->next;
  if (total)
    *total = rs->p->n_steps;
  return 0;
}

int es_run_finish(es_run *r, es_tensor *outputs, int n_out) {
  run_state *rs = run_of(r);
  if (!rs || rs->failed)
    return es__fail(ES_EINVAL, "es_run_finish: not a live run");
  const es_plan *p = rs->p;
  if ((n_out > 0 && !outputs) || n_out > p->n_out) {
    es_run_abort(r);
    return es__fail(ES_EINVAL, "the plan has %d outputs, %d asked for", p->n_out, n_out);
  }
  int rc = rs->next < p->n_steps ? es_run_steps(r, 0) : 0;
  if (rc < 0) {
    es_run_abort(r);
    return rc;
  }
  const es_graph *g = &p->model->g;
  unsigned char *base = rs->base;
  es_tdesc *table = (es_tdesc *)(void *)(base + p->rt_offset);
  for (int i = 0; i < n_out; i++) {
    es_tensor *t = &outputs[i];
    t->name = g->values[g->outputs[i]].name;
    t->data = NULL;
    if (p->out_loc[i].kind == LOC_HEAP)
      continue; /* the tail's */
    const es_tdesc *d = p->out_loc[i].rt >= 0 ? &table[p->out_loc[i].rt] : &p->out_desc[i];
    t->dtype = d->dtype;
    t->rank = d->rank;
    for (int k = 0; k < ES_MAX_RANK; k++)
      t->dims[k] = d->dims[k];
    t->nbytes = d->nbytes;
    t->data = (void *)loc_ptr(&p->out_loc[i], base, rs->inputs);
  }
  if (p->tail.n_nodes) {
    if (!rs->heap)
      rs->mh = es_mem_heap_make(&rs->mstate);
    rc = run_tail(p, rs->heap ? rs->heap : &rs->mh, base, rs->inputs, table, outputs, n_out);
    if (rc == 0 && rs->profile) {
      struct timespec t1;
      clock_gettime(CLOCK_MONOTONIC, &t1);
      uint64_t ns = (uint64_t)((t1.tv_sec - rs->t0.tv_sec) * 1000000000ll +
                               (t1.tv_nsec - rs->t0.tv_nsec));
      atomic_fetch_add_explicit(&p->step_ns[p->n_steps + 1], ns, memory_order_relaxed);
    }
  }
  es_run_abort(r);
  return rc;
}

void es_run_abort(es_run *r) {
  run_state *rs = run_of(r);
  if (rs)
    rs->magic = 0;
}

int es_plan_run_heap(const es_plan *p, const es_tensor *inputs, int n_in, es_arena *arena,
                     const es_run_heap *heap, es_tensor *outputs, int n_out) {
  if (!plan_ok(p) || (n_out > 0 && !outputs))
    return es__fail(ES_EINVAL, "es_plan_run: bad argument");
  if (n_out > p->n_out)
    return es__fail(ES_EINVAL, "the plan has %d outputs, %d asked for", p->n_out, n_out);
  es_run r;
  int rc = es_run_begin(&r, p, inputs, n_in, arena, heap);
  return rc < 0 ? rc : es_run_finish(&r, outputs, n_out);
}
