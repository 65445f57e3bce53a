/* Test models built in memory (onnx_builder.h). Every array a message
 * points at lives in the builder, so a model needs no allocation but the
 * builder itself, and a test can edit any field before packing. */
#include "es_test.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/onnx_builder.h"

void ob_init(ob *b, int64_t opset) {
  memset(b, 0, sizeof *b);
  onnx__model_proto__init(&b->model);
  onnx__graph_proto__init(&b->graph);
  onnx__operator_set_id_proto__init(&b->opset);
  b->opset.domain = "";
  b->opset.has_version = 1;
  b->opset.version = opset;
  b->opsets[0] = &b->opset;
  b->model.has_ir_version = 1;
  b->model.ir_version = 8;
  b->model.n_opset_import = 1;
  b->model.opset_import = b->opsets;
  b->model.graph = &b->graph;
  b->graph.node = b->node_ptrs;
  b->graph.initializer = b->init_ptrs;
  b->graph.input = b->ins;
  b->graph.output = b->outs;
}

ob *ob_new(int64_t opset) {
  ob *b = malloc(sizeof *b);
  assert_non_null(b);
  ob_init(b, opset);
  return b;
}

/* ---- inputs and outputs ---------------------------------------------------- */

static void tensor_type(Onnx__TypeProto *tp, Onnx__TypeProto__Tensor *tt, int elem_type) {
  onnx__type_proto__tensor__init(tt);
  tt->has_elem_type = 1;
  tt->elem_type = elem_type;
  onnx__type_proto__init(tp);
  tp->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
  tp->tensor_type = tt;
}

void ob_input(ob *b, const char *name, int rank, const int64_t *dims) {
  size_t i = b->graph.n_input++;
  assert_true(i < OB_IO && rank <= OB_RANK);
  for (int d = 0; d < rank; d++) {
    Onnx__TensorShapeProto__Dimension *dm = &b->dims[i][d];
    onnx__tensor_shape_proto__dimension__init(dm);
    if (dims[d] >= 0) {
      dm->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
      dm->dim_value = dims[d];
    } else {
      snprintf(b->dim_names[i][d], sizeof b->dim_names[i][d], "%s%d", name, d);
      dm->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
      dm->dim_param = b->dim_names[i][d];
    }
    b->dim_ptrs[i][d] = dm;
  }
  onnx__tensor_shape_proto__init(&b->in_shape[i]);
  b->in_shape[i].n_dim = (size_t)rank;
  b->in_shape[i].dim = b->dim_ptrs[i];
  tensor_type(&b->in_tp[i], &b->in_tt[i], ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT);
  b->in_tt[i].shape = &b->in_shape[i];
  onnx__value_info_proto__init(&b->in_vi[i]);
  b->in_vi[i].name = (char *)name;
  b->in_vi[i].type = &b->in_tp[i];
  b->ins[i] = &b->in_vi[i];
}

void ob_output(ob *b, const char *name) {
  size_t i = b->graph.n_output++;
  assert_true(i < OB_IO);
  onnx__value_info_proto__init(&b->out_vi[i]);
  b->out_vi[i].name = (char *)name;
  b->outs[i] = &b->out_vi[i];
}

void ob_output_typed(ob *b, const char *name, int elem_type) {
  ob_output(b, name);
  size_t i = b->graph.n_output - 1;
  tensor_type(&b->out_tp[i], &b->out_tt[i], elem_type);
  b->out_vi[i].type = &b->out_tp[i];
}

/* ---- initializers ---------------------------------------------------------- */

/* The next initializer with its name, type and dims; *count gets the
 * element count. */
static Onnx__TensorProto *init_add(ob *b, const char *name, int type, int rank,
                                   const int64_t *dims, size_t *count) {
  size_t i = b->graph.n_initializer++;
  assert_true(i < OB_INITS && rank <= OB_RANK);
  Onnx__TensorProto *t = &b->inits[i];
  onnx__tensor_proto__init(t);
  t->name = (char *)name;
  t->has_data_type = 1;
  t->data_type = type;
  size_t n = 1;
  for (int d = 0; d < rank; d++) {
    b->init_dims[i][d] = dims[d];
    n *= (size_t)dims[d];
  }
  t->n_dims = (size_t)rank;
  t->dims = b->init_dims[i];
  b->init_ptrs[i] = t;
  *count = n;
  return t;
}

Onnx__TensorProto *ob_init_f32(ob *b, const char *name, int rank, const int64_t *dims,
                               const float *data) {
  size_t n;
  Onnx__TensorProto *t = init_add(b, name, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, rank, dims, &n);
  t->n_float_data = n;
  t->float_data = (float *)data;
  return t;
}

Onnx__TensorProto *ob_init_8bit(ob *b, const char *name, int elem_type, int rank,
                                const int64_t *dims, const void *data) {
  size_t n;
  Onnx__TensorProto *t = init_add(b, name, elem_type, rank, dims, &n);
  t->has_raw_data = 1;
  t->raw_data.len = n;
  t->raw_data.data = (uint8_t *)data;
  return t;
}

Onnx__TensorProto *ob_init_i64(ob *b, const char *name, int rank, const int64_t *dims,
                               const int64_t *data) {
  size_t n;
  Onnx__TensorProto *t = init_add(b, name, ONNX__TENSOR_PROTO__DATA_TYPE__INT64, rank, dims, &n);
  t->n_int64_data = n;
  t->int64_data = (int64_t *)data;
  return t;
}

/* ---- nodes and attributes -------------------------------------------------- */

static int node_v(ob *b, const char *op, const char *name, const char *out, int n_in,
                  va_list ap) {
  int i = (int)b->graph.n_node++;
  assert_true(i < OB_NODES && n_in <= OB_NODE_IN);
  Onnx__NodeProto *n = &b->nodes[i];
  onnx__node_proto__init(n);
  n->op_type = (char *)op;
  n->name = (char *)name;
  for (int k = 0; k < n_in; k++)
    b->node_in[i][k] = va_arg(ap, char *);
  b->node_out[i][0] = (char *)out;
  n->n_input = (size_t)n_in;
  n->input = b->node_in[i];
  n->n_output = 1;
  n->output = b->node_out[i];
  n->attribute = b->attr_ptrs[i];
  b->node_ptrs[i] = n;
  return i;
}

int ob_node(ob *b, const char *op, const char *out, int n_in, ...) {
  va_list ap;
  va_start(ap, n_in);
  int i = node_v(b, op, out, out, n_in, ap);
  va_end(ap);
  return i;
}

int ob_node_named(ob *b, const char *op, const char *name, const char *out, int n_in, ...) {
  va_list ap;
  va_start(ap, n_in);
  int i = node_v(b, op, name, out, n_in, ap);
  va_end(ap);
  return i;
}

void ob_node_out(ob *b, int node, const char *out) {
  Onnx__NodeProto *n = &b->nodes[node];
  assert_true(n->n_output < OB_NODE_OUT);
  b->node_out[node][n->n_output++] = (char *)out;
}

Onnx__AttributeProto *ob_attr(ob *b, int node, const char *name, int type) {
  Onnx__NodeProto *n = &b->nodes[node];
  size_t a = n->n_attribute++;
  assert_true(a < OB_ATTRS);
  Onnx__AttributeProto *at = &b->attrs[node][a];
  onnx__attribute_proto__init(at);
  at->name = (char *)name;
  at->has_type = 1;
  at->type = type;
  b->attr_ptrs[node][a] = at;
  return at;
}

void ob_attr_int(ob *b, int node, const char *name, int64_t v) {
  Onnx__AttributeProto *a = ob_attr(b, node, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT);
  a->has_i = 1;
  a->i = v;
}

void ob_attr_float(ob *b, int node, const char *name, float v) {
  Onnx__AttributeProto *a = ob_attr(b, node, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT);
  a->has_f = 1;
  a->f = v;
}

void ob_attr_string(ob *b, int node, const char *name, const char *s) {
  Onnx__AttributeProto *a = ob_attr(b, node, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING);
  a->has_s = 1;
  a->s.data = (uint8_t *)s;
  a->s.len = strlen(s);
}

void ob_attr_ints(ob *b, int node, const char *name, size_t n, const int64_t *v) {
  Onnx__AttributeProto *a = ob_attr(b, node, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS);
  a->n_ints = n;
  a->ints = (int64_t *)v;
}

void ob_attr_floats(ob *b, int node, const char *name, size_t n, const float *v) {
  Onnx__AttributeProto *a = ob_attr(b, node, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS);
  a->n_floats = n;
  a->floats = (float *)v;
}

void ob_attr_tensor(ob *b, int node, const char *name, Onnx__TensorProto *t) {
  ob_attr(b, node, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR)->t = t;
}

void ob_attr_graph(ob *b, int node, const char *name, Onnx__GraphProto *g) {
  ob_attr(b, node, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH)->g = g;
}

/* ---- bytes ------------------------------------------------------------------ */

uint8_t *ob_pack(const ob *b, size_t *size) {
  *size = onnx__model_proto__get_packed_size(&b->model);
  uint8_t *buf = malloc(*size ? *size : 1);
  assert_non_null(buf);
  onnx__model_proto__pack(&b->model, buf);
  return buf;
}

void ob_conv3x3(ob *b, const char *out, const char *x, const char *w, const char *bias) {
  static const int64_t ks[2] = {3, 3}, pads[4] = {1, 1, 1, 1};
  int n = bias ? ob_node(b, "Conv", out, 3, x, w, bias) : ob_node(b, "Conv", out, 2, x, w);
  ob_attr_ints(b, n, "kernel_shape", 2, ks);
  ob_attr_ints(b, n, "pads", 4, pads);
}

void ob_conv_chain(ob *b, int c, const float *w1, const float *w2, const float *w3,
                   const float *b3) {
  const int64_t xd[4] = {1, c, -1, -1}, d1[4] = {32, c, 3, 3}, d2[4] = {32, 32, 3, 3},
                d3[4] = {c, 32, 3, 3}, db[1] = {c};
  ob_init(b, 13);
  ob_input(b, "x", 4, xd);
  ob_init_f32(b, "W1", 4, d1, w1);
  ob_init_f32(b, "W2", 4, d2, w2);
  ob_init_f32(b, "W3", 4, d3, w3);
  ob_init_f32(b, "B3", 1, db, b3);
  ob_conv3x3(b, "c1", "x", "W1", NULL);
  ob_conv3x3(b, "c2", "c1", "W2", NULL);
  ob_conv3x3(b, "y", "c2", "W3", "B3");
  ob_output(b, "y");
}

void ob_save_temp(const ob *b, const char *prefix, char *path, size_t cap) {
  size_t size;
  uint8_t *buf = ob_pack(b, &size);
  const char *tmp = getenv("TMPDIR");
  snprintf(path, cap, "%s/%s-XXXXXX", tmp && *tmp ? tmp : "/tmp", prefix);
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, buf, size), (ssize_t)size);
  assert_int_equal(close(fd), 0);
  free(buf);
}

es_model *ob_load(const ob *b) {
  size_t size;
  uint8_t *buf = ob_pack(b, &size);
  es_model *m;
  ES_CHECK_RC(es_model_load_buffer(buf, size, NULL, &m));
  free(buf);
  return m;
}

/* ---- running --------------------------------------------------------------- */

es_tensor ob_tensor_f32(const char *name, int rank, const int64_t *dims, const float *data) {
  es_tensor t = {.name = name, .dtype = ES_DTYPE_FLOAT, .rank = rank, .data = (void *)data};
  size_t bytes = sizeof(float);
  for (int d = 0; d < rank; d++) {
    t.dims[d] = dims[d];
    bytes *= (size_t)dims[d];
  }
  t.nbytes = bytes;
  return t;
}

void ob_run(es_model *m, int n_in, const es_tensor *in, int n_out, float **out, size_t *count) {
  es_tensor_info shapes[OB_IO];
  assert_true(n_in <= OB_IO && n_out <= OB_IO);
  for (int i = 0; i < n_in; i++) {
    shapes[i] = (es_tensor_info){.name = in[i].name, .dtype = in[i].dtype, .rank = in[i].rank};
    memcpy(shapes[i].dims, in[i].dims, sizeof shapes[i].dims);
  }
  es_plan *p;
  ES_CHECK_RC(es_model_plan(m, shapes, n_in, &p));
  es_arena *a;
  ES_CHECK_RC(es_arena_create(es_plan_arena_bytes(p) + 64, 64, &a));
  es_tensor outs[OB_IO];
  ES_CHECK_RC(es_plan_run(p, in, n_in, a, outs, n_out));
  for (int i = 0; i < n_out; i++) {
    assert_int_equal(outs[i].dtype, ES_DTYPE_FLOAT);
    count[i] = outs[i].nbytes / sizeof(float);
    out[i] = malloc(outs[i].nbytes ? outs[i].nbytes : 1);
    assert_non_null(out[i]);
    memcpy(out[i], outs[i].data, outs[i].nbytes);
  }
  es_arena_destroy(a);
  es_plan_release(p);
}

void ob_nms(ob *b) {
  /* initializer data must outlive packing */
  static const int64_t max_out = 4, col = 2;
  static const float iou = 0.5f, thr = 0.0f;
  ob_input(b, "boxes", 3, (int64_t[]){1, 6, 4});
  ob_input(b, "scores", 3, (int64_t[]){1, 1, 6});
  ob_init_i64(b, "max_out", 1, (int64_t[]){1}, &max_out);
  ob_init_f32(b, "iou", 1, (int64_t[]){1}, &iou);
  ob_init_f32(b, "thr", 1, (int64_t[]){1}, &thr);
  ob_init_i64(b, "col", 0, NULL, &col);
  ob_node(b, "NonMaxSuppression", "sel", 5, "boxes", "scores", "max_out", "iou", "thr");
}

void ob_loop(ob *b, ob *body, int64_t n) {
  ob_node(body, "Add", "acc_out", 2, "acc", "one");
  ob_loop_main(b, body, n);
}

void ob_loop_main(ob *b, ob *body, int64_t n) {
  static const float one = 1.0f;
  /* the body's frame: its inputs (untyped: a body may leave their types
   * out), the step it stacks and the condition it passes on */
  ob_input(body, "iter", 0, NULL);
  ob_input(body, "cond", 0, NULL);
  ob_input(body, "acc", 1, (int64_t[]){n});
  for (int i = 0; i < 3; i++)
    body->in_vi[i].type = NULL;
  ob_node(body, "Mul", "step", 2, "acc_out", "one");
  ob_node(body, "Identity", "cond_out", 1, "cond");
  ob_output(body, "cond_out");
  ob_output(body, "acc_out");
  ob_output(body, "step");
  ob_input(b, "m", 0, NULL);
  b->in_tt[0].elem_type = ONNX__TENSOR_PROTO__DATA_TYPE__INT64;
  ob_input(b, "acc0", 1, (int64_t[]){n});
  ob_init_f32(b, "one", 0, NULL, &one);
  int loop = ob_node_named(b, "Loop", "loop", "acc", 3, "m", "", "acc0");
  ob_node_out(b, loop, "steps");
  ob_attr_graph(b, loop, "body", &body->graph);
  ob_output(b, "acc");
  ob_output(b, "steps");
}

void ob_nms_tail(ob *b) {
  static const int64_t two = 2;
  ob_nms(b);
  ob_init_i64(b, "two", 1, (int64_t[]){1}, &two);
  int g = ob_node(b, "Gather", "bidx", 2, "sel", "col");
  ob_attr_int(b, g, "axis", 1);
  g = ob_node(b, "Gather", "kept", 2, "boxes", "bidx");
  ob_attr_int(b, g, "axis", 1);
  g = ob_node(b, "Gather", "ks", 2, "scores", "bidx");
  ob_attr_int(b, g, "axis", 2);
  ob_node(b, "Shape", "nkept", 1, "bidx");
  ob_node(b, "Min", "k", 2, "nkept", "two");
  int t = ob_node(b, "TopK", "best", 2, "ks", "k");
  ob_node_out(b, t, "best_i");
  ob_output(b, "kept");
  ob_output(b, "best");
}

/* ---- large and hostile models ---------------------------------------------- */

uint8_t *ob_chain_pack(const char *op, int n, int rank, const int64_t *dims, size_t *size) {
  assert_true(n > 0);
  ob *b = ob_new(13);
  Onnx__NodeProto *nodes = calloc((size_t)n, sizeof *nodes);
  Onnx__NodeProto **ptrs = calloc((size_t)n, sizeof *ptrs);
  char **io = calloc(2 * (size_t)n, sizeof *io); /* per node: input, output */
  char *names = calloc((size_t)n, 32);           /* per node: "r<i>" then "n<i>" */
  assert_true(nodes && ptrs && io && names);
  for (int i = 0; i < n; i++) {
    char *out = names + 32 * (size_t)i, *name = out + 16;
    snprintf(out, 16, "r%d", i);
    snprintf(name, 16, "n%d", i);
    io[2 * i] = i ? names + 32 * (size_t)(i - 1) : "x";
    io[2 * i + 1] = out;
    onnx__node_proto__init(&nodes[i]);
    nodes[i].op_type = (char *)op;
    nodes[i].name = name;
    nodes[i].n_input = 1;
    nodes[i].input = &io[2 * i];
    nodes[i].n_output = 1;
    nodes[i].output = &io[2 * i + 1];
    ptrs[i] = &nodes[i];
  }
  ob_input(b, "x", rank, dims);
  ob_output(b, names + 32 * (size_t)(n - 1));
  b->graph.n_node = (size_t)n;
  b->graph.node = ptrs;
  uint8_t *buf = ob_pack(b, size);
  free(nodes);
  free(ptrs);
  free(io);
  free(names);
  free(b);
  return buf;
}

/* Writing backwards: each call puts bytes just before *pos. */
static void wire_put(uint8_t *buf, size_t *pos, const void *p, size_t n) {
  assert_true(*pos >= n);
  *pos -= n;
  memcpy(buf + *pos, p, n);
}

static void wire_varint(uint8_t *buf, size_t *pos, uint64_t v) {
  uint8_t tmp[10];
  size_t n = 0;
  do {
    tmp[n] = (uint8_t)(v & 0x7f) | (v > 0x7f ? 0x80 : 0);
    v >>= 7;
    n++;
  } while (v);
  wire_put(buf, pos, tmp, n);
}

/* Field number, wire type 2, and the length of everything from *pos to
 * end: the message or string just written. */
static void wire_len_key(uint8_t *buf, size_t *pos, size_t end, int field) {
  wire_varint(buf, pos, end - *pos);
  wire_varint(buf, pos, (uint64_t)field << 3 | 2);
}

static void wire_string(uint8_t *buf, size_t *pos, int field, const char *s) {
  size_t end = *pos;
  wire_put(buf, pos, s, strlen(s));
  wire_len_key(buf, pos, end, field);
}

static void wire_int(uint8_t *buf, size_t *pos, int field, uint64_t v) {
  wire_varint(buf, pos, v);
  wire_varint(buf, pos, (uint64_t)field << 3);
}

uint8_t *ob_nested_graphs_pack(int levels, size_t *size) {
  assert_true(levels >= 0);
  /* Each level takes 36 bytes plus its length prefixes, 4 bytes each at most
   * below 256 MiB. */
  size_t cap = (size_t)levels * 64 + 128, end = cap, pos = cap;
  uint8_t *buf = malloc(cap);
  assert_non_null(buf);
  /* Every sub-message is the last field of its parent, so each message
   * ends at the buffer's end: its length is end - pos once written. */
  for (int i = 0; i < levels; i++) {
    /* AttributeProto { name, type GRAPH, g = the graph so far } */
    wire_len_key(buf, &pos, end, 6); /* g */
    wire_int(buf, &pos, 20, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH);
    wire_string(buf, &pos, 1, "then_branch");
    /* NodeProto { output, op_type, attribute } */
    wire_len_key(buf, &pos, end, 5); /* attribute */
    wire_string(buf, &pos, 4, "If");
    wire_string(buf, &pos, 2, "y");
    wire_string(buf, &pos, 1, "c");
    /* GraphProto { node } */
    wire_len_key(buf, &pos, end, 1); /* node */
  }
  /* ModelProto { ir_version 8, opset_import { version 13 }, graph } */
  wire_len_key(buf, &pos, end, 7); /* graph */
  size_t os_end = pos;
  wire_int(buf, &pos, 2, 13);
  wire_len_key(buf, &pos, os_end, 8); /* opset_import */
  wire_int(buf, &pos, 1, 8);
  *size = end - pos;
  memmove(buf, buf + pos, *size);
  return buf;
}

void ob_seq_lstm(ob *b) {
  enum { F = OB_SEQ_F, H = OB_SEQ_H };
  static float w[4 * H * F + 4 * H * H + 8 * H];
  for (size_t i = 0; i < sizeof w / sizeof *w; i++)
    w[i] = (float)((int)((i * 2654435761u) % 2001u) - 1000) / 4000.0f;
  ob_input(b, "x", 3, (int64_t[]){-1, 1, F});
  ob_input(b, "h0", 3, (int64_t[]){1, 1, H});
  ob_input(b, "c0", 3, (int64_t[]){1, 1, H});
  ob_init_f32(b, "W", 3, (int64_t[]){1, 4 * H, F}, w);
  ob_init_f32(b, "R", 3, (int64_t[]){1, 4 * H, H}, w + 4 * H * F);
  ob_init_f32(b, "B", 2, (int64_t[]){1, 8 * H}, w + 4 * H * F + 4 * H * H);
  int n = ob_node(b, "LSTM", "y", 7, "x", "W", "R", "B", "", "h0", "c0");
  ob_node_out(b, n, "hn");
  ob_node_out(b, n, "cn");
  ob_attr_int(b, n, "hidden_size", H);
  ob_output(b, "y");
  ob_output(b, "hn");
  ob_output(b, "cn");
}

float *ob_seq_decoder(ob *b, int d) {
  enum { E = OB_DEC_E, V = OB_DEC_V };
  size_t nw = (size_t)3 * E * d + (size_t)d * V + 1;
  float *w = malloc(nw * sizeof *w);
  assert_non_null(w);
  for (size_t i = 0; i + 1 < nw; i++)
    w[i] = (float)((int)((i * 2654435761u) % 2001u) - 1000) / 1000.0f;
  w[nw - 1] = 1.0f / sqrtf((float)d);
  ob_input(b, "x", 3, (int64_t[]){1, 1, E});
  ob_input(b, "past_k", 3, (int64_t[]){1, -1, d});
  ob_input(b, "past_v", 3, (int64_t[]){1, -1, d});
  ob_init_f32(b, "Wq", 2, (int64_t[]){E, d}, w);
  ob_init_f32(b, "Wk", 2, (int64_t[]){E, d}, w + (size_t)E * d);
  ob_init_f32(b, "Wv", 2, (int64_t[]){E, d}, w + (size_t)2 * E * d);
  ob_init_f32(b, "Wo", 2, (int64_t[]){d, V}, w + (size_t)3 * E * d);
  ob_init_f32(b, "scale", 0, NULL, w + nw - 1);
  ob_node(b, "MatMul", "q", 2, "x", "Wq");
  ob_node(b, "MatMul", "k", 2, "x", "Wk");
  ob_node(b, "MatMul", "v", 2, "x", "Wv");
  ob_attr_int(b, ob_node(b, "Concat", "present_k", 2, "past_k", "k"), "axis", 1);
  ob_attr_int(b, ob_node(b, "Concat", "present_v", 2, "past_v", "v"), "axis", 1);
  static const int64_t perm[3] = {0, 2, 1}; /* attribute values must outlive packing */
  ob_attr_ints(b, ob_node(b, "Transpose", "kt", 1, "present_k"), "perm", 3, perm);
  ob_node(b, "MatMul", "s", 2, "q", "kt");
  ob_node(b, "Mul", "ss", 2, "s", "scale");
  ob_attr_int(b, ob_node(b, "Softmax", "p", 1, "ss"), "axis", -1);
  ob_node(b, "MatMul", "a", 2, "p", "present_v");
  ob_node(b, "MatMul", "y", 2, "a", "Wo");
  ob_output(b, "y");
  ob_output(b, "present_k");
  ob_output(b, "present_v");
  return w;
}
