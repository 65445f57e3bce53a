/* Small ONNX models built in memory for the tests, with the protobuf-c
 * structs the loader reads: inputs and outputs, initializers, nodes and
 * attributes of every type, packed to bytes.
 *
 *   ob *b = ob_new(13);
 *   ob_input(b, "x", 4, (int64_t[]){1, 3, -1, -1});  // -1: a symbolic dim
 *   ob_init_f32(b, "W", 4, wdims, w);
 *   int n = ob_node(b, "Conv", "y", 2, "x", "W");    // the node is named "y"
 *   ob_attr_ints(b, n, "pads", 4, pads);
 *   ob_output(b, "y");
 *   es_model *m = ob_load(b);
 *   free(b);
 *
 * Dims are copied; names, initializer data and attribute values are not
 * and must outlive packing. The structs stay public so a test can break
 * a valid model in one precise place before packing it (b->nodes[1].op_type
 * = "StringNormalizer"). A builder's room is fixed (OB_*); going past it fails the
 * test. */
#ifndef ES_TEST_ONNX_BUILDER_H
#define ES_TEST_ONNX_BUILDER_H

#include <stddef.h>
#include <stdint.h>

#include "edgeserve/engine.h"
#include "onnx.pb-c.h"

#define OB_NODES 24
#define OB_INITS 24
#define OB_IO 3
#define OB_ATTRS 6
#define OB_NODE_IN 9 /* QLinearConv */
#define OB_NODE_OUT 3 /* LSTM */
#define OB_RANK 5

typedef struct ob {
  Onnx__ModelProto model;
  Onnx__GraphProto graph;
  Onnx__OperatorSetIdProto opset;
  Onnx__OperatorSetIdProto *opsets[1];
  Onnx__NodeProto nodes[OB_NODES];
  Onnx__NodeProto *node_ptrs[OB_NODES];
  char *node_in[OB_NODES][OB_NODE_IN];
  char *node_out[OB_NODES][OB_NODE_OUT];
  Onnx__AttributeProto attrs[OB_NODES][OB_ATTRS];
  Onnx__AttributeProto *attr_ptrs[OB_NODES][OB_ATTRS];
  Onnx__TensorProto inits[OB_INITS];
  Onnx__TensorProto *init_ptrs[OB_INITS];
  int64_t init_dims[OB_INITS][OB_RANK];
  Onnx__ValueInfoProto in_vi[OB_IO], out_vi[OB_IO];
  Onnx__ValueInfoProto *ins[OB_IO], *outs[OB_IO];
  Onnx__TypeProto in_tp[OB_IO], out_tp[OB_IO];
  Onnx__TypeProto__Tensor in_tt[OB_IO], out_tt[OB_IO];
  Onnx__TensorShapeProto in_shape[OB_IO];
  Onnx__TensorShapeProto__Dimension dims[OB_IO][OB_RANK];
  Onnx__TensorShapeProto__Dimension *dim_ptrs[OB_IO][OB_RANK];
  char dim_names[OB_IO][OB_RANK][32];
} ob;

/* An empty model of the default domain at opset, IR version 8. */
void ob_init(ob *b, int64_t opset);
/* The same, allocated (free it with free()). */
ob *ob_new(int64_t opset);

/* A float graph input; a dimension of -1 is symbolic ("<name><d>"). */
void ob_input(ob *b, const char *name, int rank, const int64_t *dims);
/* A graph output with no type, or with an element type and no shape. */
void ob_output(ob *b, const char *name);
void ob_output_typed(ob *b, const char *name, int elem_type);

/* A float initializer in float_data (rank 0: a scalar); returns it. */
Onnx__TensorProto *ob_init_f32(ob *b, const char *name, int rank, const int64_t *dims,
                               const float *data);
/* An 8-bit initializer (elem_type ONNX's UINT8 or INT8) in raw_data. */
Onnx__TensorProto *ob_init_8bit(ob *b, const char *name, int elem_type, int rank,
                                const int64_t *dims, const void *data);
/* An int64 initializer in int64_data. */
Onnx__TensorProto *ob_init_i64(ob *b, const char *name, int rank, const int64_t *dims,
                               const int64_t *data);

/* Appends op(inputs...) -> out ("" for an omitted input) and returns its
 * index; ob_node names the node after its output. ob_node_out adds another
 * output to node i. */
int ob_node(ob *b, const char *op, const char *out, int n_in, ...);
int ob_node_named(ob *b, const char *op, const char *name, const char *out, int n_in, ...);
void ob_node_out(ob *b, int node, const char *out);

/* Attributes of node i. */
Onnx__AttributeProto *ob_attr(ob *b, int node, const char *name, int type);
void ob_attr_int(ob *b, int node, const char *name, int64_t v);
void ob_attr_float(ob *b, int node, const char *name, float v);
void ob_attr_string(ob *b, int node, const char *name, const char *s);
void ob_attr_ints(ob *b, int node, const char *name, size_t n, const int64_t *v);
void ob_attr_floats(ob *b, int node, const char *name, size_t n, const float *v);
void ob_attr_tensor(ob *b, int node, const char *name, Onnx__TensorProto *t);
void ob_attr_graph(ob *b, int node, const char *name, Onnx__GraphProto *g);

/* The stateful model of the sequence tests: an LSTM over x [T, 1, OB_SEQ_F]
 * (T free) with its states as graph inputs and outputs, h0/c0
 * [1, 1, OB_SEQ_H] -> y [T, 1, 1, OB_SEQ_H], hn, cn; deterministic weights
 * (static: one such model at a time). b: empty, opset 14. */
#define OB_SEQ_F 8
#define OB_SEQ_H 16
void ob_seq_lstm(ob *b);
/* A one-layer, one-head decoder step with a KV cache, the growing state of
 * the sequence tests: x [1, 1, OB_DEC_E] (the new token's embedding),
 * past_k and past_v [1, T, d] (T free) -> y [1, 1, OB_DEC_V] (logits of
 * attention over the past and the token), present_k and present_v
 * [1, T + 1, d]: each step's state grows by 2 d floats. Returns the
 * weights (malloc'ed; free them after packing). b: empty, opset 13. */
#define OB_DEC_E 16
#define OB_DEC_V 32
float *ob_seq_decoder(ob *b, int d);

/* Non-maximum suppression with a data-dependent output: inputs boxes
 * [1, 6, 4] and scores [1, 1, 6] -> sel [k, 3] (NonMaxSuppression: at most
 * 4 boxes, IoU 0.5, score > 0), and "col", an int64 scalar 2 (sel's box
 * index column). No outputs. b: empty, opset 13. */
void ob_nms(ob *b);
/* A detector's tail over ob_nms: kept [1, k, 4] (the kept boxes) and best
 * [1, 1, min(k, 2)] (the best kept scores: TopK, k from the kept count's
 * shape). b: empty, opset 13. */
void ob_nms_tail(ob *b);
/* A Loop with no bound: m (int64 scalar, the trip count) and acc0 [n] ->
 * acc [n] = acc0 + m and steps [m, n] (step i = acc0 + i + 1), the body
 * reading the main graph's "one" (a capture). b and body: empty, opset 13;
 * body becomes the Loop's body (keep it until packing). */
void ob_loop(ob *b, ob *body, int64_t n);
/* ob_loop's model around a body of the caller's, which makes "acc_out"
 * ([n] floats) from "acc" (and may read "iter", "cond" and the main
 * graph's values): this adds the body's inputs iter, cond, acc and its
 * outputs cond_out, acc_out and step (acc_out x one), then the main graph. */
void ob_loop_main(ob *b, ob *body, int64_t n);

/* ---- large and hostile models (malloc'ed bytes, freed by the caller) -------- */

/* A chain of n unary nodes op (an operator without attributes), named
 * "n0".."n<n-1>": x (float, dims) -> r0 -> ... -> r<n-1>, the output. */
uint8_t *ob_chain_pack(const char *op, int n, int rank, const int64_t *dims, size_t *size);
/* A model whose main graph holds an If node whose then_branch attribute
 * holds a graph holding an If node, and so on: levels subgraphs, the last
 * one empty (levels 0: the main graph is empty). Each level nests three
 * messages (NodeProto, AttributeProto, GraphProto), so the deepest
 * GraphProto sits 1 + 3 * levels messages below the ModelProto. Written
 * straight to the wire format, inside out, without recursion (protobuf-c's
 * packer recurses). */
uint8_t *ob_nested_graphs_pack(int levels, size_t *size);

/* A 3x3 Conv node, pads 1: out = Conv(x, w[, bias]) (bias may be NULL). */
void ob_conv3x3(ob *b, const char *out, const char *x, const char *w, const char *bias);
/* A small model whose convolutions all get prepared weights: x [1, c, H, W]
 * (H and W free) -> three 3x3 convs, pads 1 (c -> 32 -> 32 -> c, the last
 * with bias b3) -> y. w1 [32, c, 3, 3], w2 [32, 32, 3, 3], w3 [c, 32, 3, 3]
 * and b3 [c] are referenced, not copied. Starts b (ob_init). */
void ob_conv_chain(ob *b, int c, const float *w1, const float *w2, const float *w3,
                   const float *b3);

/* The model's bytes (malloc'ed, at least one byte). */
uint8_t *ob_pack(const ob *b, size_t *size);
/* Packs and loads the model; the test fails if loading does. */
es_model *ob_load(const ob *b);
/* Packs the model into a new file in $TMPDIR (default /tmp) named
 * PREFIX-XXXXXX; its path into path (cap bytes). The caller unlinks it. */
void ob_save_temp(const ob *b, const char *prefix, char *path, size_t cap);

/* A float32 tensor over data (not copied). */
es_tensor ob_tensor_f32(const char *name, int rank, const int64_t *dims, const float *data);
/* Plans m for the inputs' shapes, runs it in an arena of the planned size
 * and copies the n_out float outputs into out[i] (malloc'ed, count[i]
 * elements). The test fails if a step does. */
void ob_run(es_model *m, int n_in, const es_tensor *in, int n_out, float **out, size_t *count);

#endif
