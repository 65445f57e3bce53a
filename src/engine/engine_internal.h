/* Engine internals shared by model.c and plan.c. */
#ifndef ES_ENGINE_INTERNAL_H
#define ES_ENGINE_INTERNAL_H

#include <stdatomic.h>

#include "edgeserve/engine.h"
#include "kernels/kernel.h"
#include "model/graph.h"

#define ES_MODEL_MAGIC 0x45534d4f44454c31ull /* "ESMODEL1" */

struct es_model {
  uint64_t magic;
  _Atomic int refs;
  es_graph g;          /* immutable after load */
  es_prep_store *prep; /* prepared (reordered) weights, shared by all plans */
  int compiled;          /* loaded from an .esm file */
  int compiled_prepared; /* prepared-weight entries taken from it */
  int stale_compiled;    /* an .esm was asked for, its source differed: loaded the source */
};

/* prep_cache.c: gives m's prepared-weights store a cache in the directory
 * es_engine_cache_dir_set names, keyed by the model file at path; nothing
 * when none is set or the file has no identity (0 then too). */
int es__prep_cache_attach(es_model *m, const char *path);

/* What a kernel sees of graph node nd. */
static inline es_knode es__knode_of(const es_node *nd) {
  es_knode k = {nd->op, nd->file_index, nd->name, nd->attrs, nd->n_attr};
  return k;
}

/* Load-time lowering of a graph for our kernels, on a sorted, pruned graph
 * whose constants are still staged (es__onnx_load_keep's result).
 *
 * fold.c: constant folding (Shape of an input whose shape the model fixes
 * included), then BatchNormalization merged into the Conv / ConvTranspose
 * before it, then dead nodes removed. Nodes the loader marked unsupported
 * are left. Counts what it did in folded_nodes and folded_bn. ES_EMODEL (or
 * ES_ENOMEM) naming the node when evaluating a constant node fails other
 * than with ES_ENOTSUP. */
int es__graph_fold(es_graph *g);
/* fuse_qdq.c: QDQ convolutions (DQ -> Conv [-> Relu] -> Q) to QLinearConv,
 * the int8 kernel; before folding, which would make their weights float.
 * Skipped with fusion off. */
int es__graph_lower_qdq(es_graph *g);
/* fuse_qdq.c: DequantizeLinear -> elementwise float ops -> QuantizeLinear
 * (one 8-bit input) to one QLookup table; after folding. Skipped with
 * fusion off. */
int es__graph_lower_lookups(es_graph *g);
/* 0 after es_engine_fusion_set(0). */
int es__graph_fusion_enabled(void);
/* fuse.c: activations and residual Adds into the Conv before them,
 * elementwise chains into one node, the LayerNorm pattern into one node.
 * Runs after folding, before sealing. Skipped when es_engine_set_fusion(0)
 * was called (to compare fused and unfused graphs). */
int es__graph_fuse(es_graph *g);
/* Parse an ONNX file's bytes into g (zeroed by the caller), fold, check,
 * fuse and seal its weights: the graph a model holds. On failure g is
 * cleaned up; a graph with something the engine cannot run fails with
 * ES_ENOTSUP listing it (es__issues_fail), and es__graph_load_checked then
 * leaves the list in *issues when given (the caller's to es__issues_fini,
 * whatever the result). */
int es__graph_load_lowered(const void *data, size_t size, es_graph *g);
int es__graph_load_checked(const void *data, size_t size, es_graph *g, es_issues *issues);
/* Adds to out what a folded graph needs that the engine cannot run: the
 * loader's list (es__graph_issues) and operators without a kernel. */
int es__graph_check(const es_graph *g, es_issues *out);

/* es_model_plan, and with value_descs (one per graph value) the shape each
 * value got while planning (dtype ES_DTYPE_UNDEFINED for values the plan
 * never computed): how a test compares the fusion passes' symbolic shapes
 * with the kernels' own shape inference. */
int es__plan_make(es_model *m, const es_tensor_info *shapes, int n, es_plan **out,
                  es_tdesc *value_descs);

/* Plans m for shapes (one per input) to list what its kernels refuse: each
 * node's ES_ENOTSUP (and ES_EMODEL) joins out instead of stopping the plan,
 * the nodes after it are left (counted in *unreached), and so are nodes the
 * loader marked and inputs of kind ES_VALUE_UNSUPPORTED, which es__graph_check
 * lists. Other errors (out of memory, a shape that contradicts the model)
 * are returned. The plan is not kept. */
int es__plan_diagnose(es_model *m, const es_tensor_info *shapes, int n, es_issues *out,
                      int *unreached);

/* Compiled model files (esm.c). */
int es__esm_is(const void *data, size_t size);
int es__esm_load(const char *path, es_model *m);
int es__sha256_file(const char *path, uint8_t out[32], uint64_t *size);

static inline int es__model_ok(const es_model *m) { return m && m->magic == ES_MODEL_MAGIC; }

/* ---- interp.c: nodes run without a plan (see its design note) ------------- */

#define ES_IP_MAX_IO 256 /* a node's inputs or outputs */
#define ES_IP_MAX_CARRY 64 /* a Loop's carried values and scan outputs, a Scan's */
#define ES_IP_KEEP 0x7fffffff

/* A value while a program runs: its actual shape and data. own: the heap
 * block holding it when the program made it (freed after its last
 * reader), NULL for one it only reads (an input, a constant, a tensor of
 * the plan's arena). */
typedef struct es_ival {
  es_tdesc desc;
  const void *data;
  void *own;
  size_t own_bytes;
} es_ival;

/* Nodes over numbered slots, in order: node i is list[i] when list is set,
 * else nodes[i]; their in/out are slot numbers. last[s]: the last node
 * reading slot s, ES_IP_KEEP for the results, -1 for none. if_cond: per If
 * id, its condition's slot (inlined branches' guards). Read-only once made. */
typedef struct es_iprog {
  const es_node *nodes;
  const es_node *const *list;
  int n_nodes;
  int n_slots;
  const int *last;
  const int *if_cond;
  int max_if;
} es_iprog;

typedef struct es_interp {
  const es_run_heap *heap;
  int64_t opset;
} es_interp;

/* Heap blocks (64-byte aligned; a refusal's error as the heap gives it). */
int es__ip_alloc(const es_interp *I, size_t bytes, void **out);
void es__ip_free(const es_interp *I, void *p, size_t bytes);
/* Frees v's block if it owns one; v is zeroed. */
void es__ival_drop(const es_interp *I, es_ival *v);
/* Makes v own its bytes (a copy on the heap unless it owns them already). */
int es__ival_own(const es_interp *I, es_ival *v);
/* Runs P over vals (n_slots of them: the caller set the ones read from
 * outside, borrowed). Results (ES_IP_KEEP slots) are left owned in vals;
 * on failure the caller drops what is left (es__iprog_drop_all). */
int es__iprog_run(const es_interp *I, const es_iprog *P, es_ival *vals);
void es__iprog_drop_all(const es_interp *I, const es_iprog *P, es_ival *vals);
/* A Loop's or Scan's node with its body: reads its inputs from vals, leaves
 * its outputs there, owned. */
int es__interp_loop(const es_interp *I, const es_node *nd, es_ival *vals);
int es__interp_scan(const es_interp *I, const es_node *nd, es_ival *vals);
/* A Loop's or Scan's inputs, outputs and attributes against its body's:
 * ES_EMODEL naming the node when they disagree (checked while planning). */
int es__body_check(const es_node *nd);
/* last[] for nodes (list or nodes, n of them) over n_slots slots, with
 * kept[] kept. */
int es__iprog_last_uses(const es_node *const *list, const es_node *nodes, int n, int n_slots,
                        const int *if_cond, int max_if, const int *kept, int n_kept, int *last);
/* g->prog for a body graph (memory in g's context), and for the bodies it
 * holds, recursively: es__graph_progs_make from the main graph. */
int es__graph_prog_make(es_graph *g);
int es__graph_progs_make(es_graph *g);

#endif
