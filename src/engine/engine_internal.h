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
 * whose constants are still staged (es__onnx_load's result).
 *
 * fold.c: constant folding, then BatchNormalization merged into the Conv /
 * ConvTranspose before it. Counts what it did in folded_nodes and
 * folded_bn. ES_EMODEL (or ES_ENOMEM) naming the node when evaluating a
 * constant node fails other than with ES_ENOTSUP. */
int es__graph_fold(es_graph *g);
/* fuse.c: activations and residual Adds into the Conv before them,
 * elementwise chains into one node, the LayerNorm pattern into one node.
 * Runs after folding, before sealing. Skipped when es_engine_set_fusion(0)
 * was called (to compare fused and unfused graphs). */
int es__graph_fuse(es_graph *g);
/* Parse an ONNX file's bytes into g (zeroed by the caller), fold, fuse and
 * seal its weights: the graph a model holds. On failure g is cleaned up. */
int es__graph_load_lowered(const void *data, size_t size, es_graph *g);

/* es_model_plan, and with value_descs (one per graph value) the shape each
 * value got while planning (dtype ES_DTYPE_UNDEFINED for values the plan
 * never computed): how a test compares the fusion passes' symbolic shapes
 * with the kernels' own shape inference. */
int es__plan_make(es_model *m, const es_tensor_info *shapes, int n, es_plan **out,
                  es_tdesc *value_descs);

/* Compiled model files (esm.c). */
int es__esm_is(const void *data, size_t size);
int es__esm_load(const char *path, es_model *m);
int es__sha256_file(const char *path, uint8_t out[32], uint64_t *size);

static inline int es__model_ok(const es_model *m) { return m && m->magic == ES_MODEL_MAGIC; }

#endif
