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

#endif
