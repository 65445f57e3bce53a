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
 * es__graph_seal then puts exactly the constants something still reads into
 * one es_weights region, 64-byte aligned each, seals it read-only and frees
 * the staging: that region is the model's tier-1 memory, shared by every
 * request. The weights read from the file are staged in one slab that is
 * itself such a region, with room after them, so that when the passes kept
 * (nearly) all of them the slab is sealed where it is, the few other
 * constants copied into its room, instead of copying every weight once
 * more. g->weights is NULL until then, which is how es__graph_fini knows
 * whose memory the data pointers are.
 *
 * A model read from a file has a third home: a large constant whose bytes
 * the file holds as they are (raw_data, aligned to its element size in the
 * file, or at any offset when it is a linear layer's weights that only
 * MatMuls read and reorder: onnx.c's matmul_b_only) is not staged at all
 * but read where it is, in the file's read-only
 * shared mapping (g->file): no copy at load, and the page cache's pages are
 * shared by every process that loads the file and can be dropped and read
 * again under pressure instead of being swapped. Sealing leaves those in
 * place and keeps the mapping for the model's life.
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
  /* A graph input or constant the engine cannot hold (an element type or a
   * kind of type it does not run): kept only so the loader can go on and
   * list everything a model needs at once. A graph with one never runs. */
  ES_VALUE_UNSUPPORTED = 4,
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
  const char *unsup;         /* what about its type the engine cannot run
                                ("element type float16", "sequence type"):
                                set for ES_VALUE_UNSUPPORTED, and for a graph
                                output whose declared type is such; else NULL */
} es_value;

/* Why a node cannot run, as the loader found it (no kernel is asked). */
typedef struct es_node_unsup {
  const char *op_type; /* as the file writes it */
  const char *domain;  /* NULL for the default domain */
  const char *what;    /* the item listed: "Erf", "Dropout with training_mode=1" */
  const char *why;     /* the sentence after the node's label in a message */
} es_node_unsup;

typedef struct es_node {
  const char *name;      /* "" when the file gives none */
  es_op op;
  int n_in, n_out;
  int *in;               /* value indices; -1 for an omitted optional input */
  int *out;
  int n_attr;
  es_attr *attrs;
  int file_index;        /* position in the file, for error messages */
  const es_node_unsup *unsup; /* non-NULL: the node cannot run, and op is
                                 ES_OP_UNKNOWN (an operator, domain, opset or
                                 attribute the engine does not run) */
  /* Inlined If branches (the loader's flatten_ifs). A merge (op If, no
   * subgraphs: inputs cond, then's outputs, else's outputs) has if_id > 0;
   * a branch's node has guards: +id runs only when merge id's condition
   * (its input 0) holds, -id only when it does not. A pass that rebuilds a
   * node may drop its guards: the node then always runs, which computes
   * more but never differs. */
  int if_id;
  int n_guard;
  int *guard;
  /* Loop and Scan: the body, loaded as a graph of its own whose inputs are
   * the operator's (Loop: iteration, condition, carried values; Scan: state
   * and scan slices) followed by the captures, the enclosing graph's values
   * the body reads, which are also the node's last n_capture inputs (so the
   * enclosing graph orders, keeps and plans them). Owned by the enclosing
   * graph; NULL for other nodes. */
  struct es_graph *body;
  int n_capture;
} es_node;


/* ---- what a model needs that the engine cannot run -------------------------
 *
 * A list of distinct items ("Erf", "Resize: mode 'cubic' is not supported",
 * "element type float16"), each with the number of places (nodes or values)
 * it concerns and the first few of them by name, so one load names
 * everything at once. Items stay in the order they were first added. */

#define ES_ISSUE_WHERE 8

typedef struct es_issue {
  const char *what;  /* the item */
  const char *first; /* the full message of its first place */
  int count;         /* places */
  int nodes;         /* 1: the places are nodes ('name' or #index) */
  int n_where;
  const char *where[ES_ISSUE_WHERE]; /* the first places: "'conv1'", "input 'a'" */
} es_issue;

typedef struct es_issues {
  es_ctx ctx;       /* the strings */
  es_issue *items;  /* es_mem */
  int n, cap;
  int *slots;       /* es_mem, open addressing on what: item index or -1 */
  size_t nslots;
  int places;       /* sum of the counts */
} es_issues;

/* Adds one place of item what (counted once more if already listed). where
 * names the place, first is the full message (used when it stays the only
 * place). ES_ENOMEM only. A zeroed es_issues is empty and ready. */
int es__issues_add(es_issues *l, const char *what, const char *where, int is_node,
                   const char *first);
void es__issues_fini(es_issues *l);
/* "Erf ×12 (nodes 'a', 'b', ...); element type float16 (input 'x'); and 3
 * more" into buf: whole items while they fit in size (at least the first),
 * each with at most max_where places. Returns buf. */
const char *es__issues_format(const es_issues *l, char *buf, size_t size, int max_where);
/* ES_ENOTSUP with the list as the detail: the first message alone when
 * there is one place, else intro and the list, bounded to fit a detail. */
int es__issues_fail(const es_issues *l, const char *intro);

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
  /* While staging, the constants read from the file share one region
   * (es__graph_stage_slab) rather than a block each: sealed as the weights
   * or gone once sealed. */
  es_weights *stage;
  unsigned char *stage_slab; /* its writable bytes */
  size_t stage_len;          /* the bytes staged from the file; the region holds
                                stage_room more after them */
  size_t stage_room;
  /* The model file's read-only mapping when constants are read in place
   * (see above), else NULL. */
  es_weights *file;
  size_t weight_bytes;   /* bytes of constant data the graph reads, in the region and in
                            the file, alignment padding not counted (set by
                            es__graph_seal, or by the compiled-file loader) */
  size_t file_weight_bytes; /* of weight_bytes, those read in place from the file */
  size_t n_constants;    /* constants in the region (set by es__graph_seal) */
  int folded_nodes;      /* nodes evaluated away at load (the engine's folding) */
  int folded_bn;         /* BatchNormalization nodes merged into a Conv */
  int elided;            /* Identity and inference Dropout nodes removed at load */
  /* Unsupported nodes inside subgraphs (If, Loop, Scan bodies), which the IR
   * does not hold: listed with the main-graph node that holds them. */
  struct es_sub_issue *sub;
  int n_sub, cap_sub;
  /* Every Loop and Scan body read into this graph (es_node.body), kept
   * here too so that finishing the graph frees them even when their node
   * was pruned. */
  struct es_graph **bodies;
  int n_bodies, cap_bodies;
  /* A body's nodes as the engine runs them without a plan (engine/interp.c,
   * es__graph_prog_make); NULL for the main graph. */
  struct es_iprog *prog;
} es_graph;

/* The condition value of each merge, by if_id (cond[id], -1 where none):
 * an es_mem array of max_id + 1, or NULL when the graph has no merge (or
 * out of memory: *max_id is then -1). */
int *es__graph_if_conds(const es_graph *g, int *max_id);

/* A writable es_weights region of len bytes for the staged constants, and
 * room bytes after them for the constants sealing may add to it (huge
 * pages advised), owned by g until it is sealed or finished; NULL on OOM. */
unsigned char *es__graph_stage_slab(es_graph *g, size_t len, size_t room);
/* Frees a staged constant's data: its own block, or nothing for one inside
 * the slab or the file. */
void es__graph_const_free(es_graph *g, const void *data);

typedef struct es_sub_issue {
  int owner;         /* file_index of the main-graph node holding the subgraph */
  const char *what, *where, *first;
} es_sub_issue;

/* Parse and validate an ONNX model into g (zeroed by the caller): nodes
 * sorted, Identity and inference Dropout removed (es__graph_elide), dead
 * nodes removed, constants still staged (the engine lowers the graph for its
 * kernels, then seals it). On failure g is cleaned up and the detail names
 * the node and op. The engine runs opsets ES_ONNX_MIN_OPSET to
 * ES_ONNX_MAX_OPSET of the default domain ("" or "ai.onnx"); other opsets
 * fail at once.
 *
 * What the engine cannot run (an operator, another domain, an operator
 * newer than the model's opset, an attribute or element type) does not stop
 * the reading: es__onnx_load fails at the end with the whole list
 * (es__graph_issues), while es__onnx_load_keep returns such a graph, the
 * unsupported nodes marked (es_node.unsup) and the values that cannot be
 * held of kind ES_VALUE_UNSUPPORTED, so the engine can fold constants
 * first and then check. */
#define ES_ONNX_MIN_OPSET 7
#define ES_ONNX_MAX_OPSET 21
int es__onnx_load(const void *data, size_t size, es_graph *g);
int es__onnx_load_keep(const void *data, size_t size, es_graph *g);
/* es__onnx_load_keep of a file's whole mapping, file (data and size are
 * its bytes): large constants stored as they are in the file are read in
 * place, the graph taking a reference to file (graph.h). */
int es__onnx_load_file(es_weights *file, es_graph *g);
/* The model's whole protobuf tree (Onnx__ModelProto, onnx.pb-c.h) in *out,
 * every part of it allocated from *ctx (an empty context on entry; the
 * caller frees it all with es__ctx_free_all): for tools that rewrite a
 * model and write it back. Nesting is checked first, as the loader does;
 * nothing else is validated here (load the bytes with the engine first). */
int es__onnx_unpack(const void *data, size_t size, es_ctx *ctx, void **out);
/* Adds to out what the graph's live part needs that the loader found
 * unsupported: graph inputs and outputs, constants live nodes read, live
 * nodes, and the subgraphs those hold. */
int es__graph_issues(const es_graph *g, es_issues *out);
/* The operator as the file names it (for unsupported nodes too). */
const char *es__node_op_type(const es_node *n);
/* 1 if data points into the model file's mapping (g->file). */
int es__graph_in_file(const es_graph *g, const void *data);
/* Bytes of the constants that hold data (padding between them not counted). */
size_t es__graph_const_bytes(const es_graph *g);
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
/* Removes Identity and inference Dropout nodes (mask output unused;
 * training_mode absent or a constant false): their readers read the input
 * instead. Where the output is a graph output, the input's producer writes
 * it instead; an output that is the copy of a graph input or constant, or
 * of another graph output, keeps its node. A Dropout that stays and has no
 * operator of its own is marked with why. Needs producers and uses. */
int es__graph_elide(es_graph *g);

/* Appends an intermediate value (no type or shape until planned), index in
 * *out; and a node (its arrays must live in the graph's context) at the
 * end of the node list, which es__graph_toposort then puts in place. For
 * the load-time passes. */
int es__graph_act_append(es_graph *g, const char *name, int *out);
int es__graph_node_append(es_graph *g, const es_node *nd);
/* Appends a constant value that adopts the staging block data (es_mem; the
 * graph frees it from now on, whatever happens, failures included). Used by
 * the load-time passes before es__graph_seal. Index in *out. */
int es__graph_const_append(es_graph *g, const char *name, es_dtype dtype, int rank,
                           const int64_t *dims, void *data, size_t nbytes, int *out);
/* Puts every constant a node input, a node's tensor attribute or a graph
 * output refers to into one es_weights region (64-byte aligned each),
 * seals it and frees all staging blocks; sets weight_bytes and n_constants.
 * The region is the stage slab when the passes dropped at most 1/16 of it
 * and the other constants fit in its room (their data moves, the slab's
 * stays), else a new one. On failure the staging is left for
 * es__graph_fini. */
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
