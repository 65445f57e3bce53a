/* The graph IR: what a loaded model is, independent of ONNX's protobuf.
 *
 * Values are every tensor the graph names: graph inputs, constants (weights,
 * initializers, Constant nodes, results of load-time folding) and activations
 * produced by nodes. Nodes refer to values by index. After loading, nodes are
 * in topological order and only nodes that contribute to an output remain.
 *
 * Constant data has two homes in a graph's life. While loading, each
 * constant's bytes sit in a staging block of their own (es_mem, writable),
 * so the engine's load-time passes (engine/fold.c, engine/fuse*.c) can add,
 * rewrite and drop constants.
 * es__graph_seal then copies exactly the constants something still reads into
 * one es_weights region, 64-byte aligned each, seals it read-only and frees
 * the staging: that region is the model's tier-1 memory, shared by every
 * request. g->weights is NULL until then, which is how es__graph_fini knows
 * whose memory the data pointers are.
 *
 * All IR memory (names, index arrays, attributes) comes from one context
 * allocator owned by the graph (tier 3 of BRIEF §2), freed in one go. */
#ifndef ES_MODEL_GRAPH_H
#define ES_MODEL_GRAPH_H

#include <stddef.h>
#include <stdint.h>

#include "edgeserve/types.h"
#include "edgeserve/memory.h"
#include "memory/ctx.h"
#include "common/op.h"

/* ---- IR ------------------------------------------------------------------- */

typedef enum es_value_kind {
  ES_VALUE_INPUT = 1,
  ES_VALUE_CONST = 2,
  ES_VALUE_ACT = 3,
} es_value_kind;

typedef struct es_value {
  const char *name;
  es_dtype dtype;
  int rank;                  /* -1: unknown until planned */
  int64_t dims[ES_MAX_RANK]; /* -1: known only at run time */
  es_value_kind kind;
  int is_output;
  int producer;              /* node index; -1 for inputs and constants */
  int uses;                  /* number of node inputs referring to it */
  const void *data;          /* CONST: staging block before es__graph_seal, then in
                                the weight region (64-byte aligned); NULL once
                                sealed for a constant nothing reads */
  size_t nbytes;             /* CONST: bytes of data */
} es_value;

typedef struct es_node {
  const char *name;      /* "" when the file gives none */
  es_op op;
  int n_in, n_out;
  int *in;               /* value indices; -1 for an omitted optional input */
  int *out;
  int n_attr;
  es_attr *attrs;
  int file_index;        /* position in the file, for error messages */
} es_node;

typedef struct es_graph {
  es_ctx ctx;
  es_value *values;
  int n_values;
  int cap_values;        /* slots allocated in values (passes may add values) */
  es_node *nodes;        /* topological order */
  int n_nodes;
  int *inputs;           /* graph inputs (excluding initializers) */
  int n_inputs;
  int *outputs;
  int n_outputs;
  int64_t opset;
  int64_t ir_version;
  es_weights *weights;   /* constant data, sealed read-only; NULL while staging */
  size_t weight_bytes;   /* bytes of the region in use (set by es__graph_seal) */
  size_t n_constants;    /* constants in the region (set by es__graph_seal) */
  int folded_nodes;      /* nodes evaluated away at load (the engine's folding) */
  int folded_bn;         /* BatchNormalization nodes merged into a Conv */
} es_graph;

/* Parse and validate an ONNX model into g (zeroed by the caller): nodes
 * sorted, dead ones removed, constants still staged (the engine lowers the
 * graph for its kernels, then seals it). On failure g is cleaned up and the
 * detail names the node and op. */
int es__onnx_load(const void *data, size_t size, es_graph *g);
/* Frees the IR, the staging blocks (if not sealed) or the weight region. */
void es__graph_fini(es_graph *g);
/* Parse a serialized TensorProto (as ONNX test data is stored). Fills v's
 * dtype, rank, dims and nbytes; *data is es_mem_aligned_alloc'ed (64) and
 * owned by the caller. The name is not kept. */
int es__onnx_tensor_parse(const void *buf, size_t size, es_value *v, void **data);

/* Orders nodes topologically; ES_EMODEL naming a node on a cycle. */
int es__graph_toposort(es_graph *g);
/* Removes nodes whose outputs reach no graph output. */
void es__graph_prune(es_graph *g);
/* Recomputes every value's producer and uses from the node list. */
void es__graph_reindex(es_graph *g);

/* Appends a constant value that adopts the staging block data (es_mem; the
 * graph frees it from now on, whatever happens, failures included). Used by
 * the load-time passes before es__graph_seal. Index in *out. */
int es__graph_const_append(es_graph *g, const char *name, es_dtype dtype, int rank,
                           const int64_t *dims, void *data, size_t nbytes, int *out);
/* Copies every constant a node input, a node's tensor attribute or a graph
 * output refers to into one new es_weights region (64-byte aligned each),
 * seals it and frees all staging blocks; sets weight_bytes and n_constants.
 * On failure the staging is left for es__graph_fini. */
int es__graph_seal(es_graph *g);

/* Points every tensor attribute's view (es_attr.t) at its constant's
 * current data, dtype and shape. Constants move when sealed, so the seal
 * calls it again; so does anything that builds a graph another way (a
 * compiled file). ES_EMODEL for an attribute that names no constant. */
int es__graph_attrs_resolve(es_graph *g);

/* Attribute lookup; NULL when absent. */
const es_attr *es__node_attr(const es_node *n, const char *name);
/* "node 'name' (#3 Conv)" style label for error messages, in buf. */
const char *es__node_label(const es_node *n, char *buf, size_t size);

#endif
