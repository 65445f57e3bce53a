/* ONNX loader: protobuf bytes -> validated graph IR.
 *
 * protobuf-c (code generated at build time from the onnx.proto that Debian's
 * libonnx-dev installs) does the wire parsing and rejects truncated or
 * malformed encodings. Everything the schema cannot express is checked here,
 * before any of it is trusted: element types, ranks, dimension products that
 * overflow, data lengths that disagree with shapes, names that refer to
 * nothing or are defined twice, unknown operators and opsets, cycles.
 * Every error names the node (or tensor) and the operator.
 *
 * Constant data (initializers, Constant nodes, tensor attributes) is checked
 * while the graph is read, then copied into staging blocks of its own once
 * the whole graph is valid (raw_data blobs sit at arbitrary file offsets, and
 * int32_data needs narrowing for 8-bit types), so the protobuf tree can be
 * freed before the graph is sorted and optimised. es__graph_fold then works on
 * the staged constants and es__graph_seal copies the ones still read into the
 * model's sealed es_weights region. The IR keeps nothing that points into
 * the protobuf tree. */
#include "model/graph.h"
#include "common/internal.h"
#include "onnx.pb-c.h"

#include <stdio.h>
#include <string.h>

#define ES_ONNX_MAX_OPSET 17
#define ES_ONNX_MAX_ELEMS ((uint64_t)1 << 40)
#define ES_ONNX_MAX_NODES (1 << 22)

/* ==========================================================================
 * protobuf-c allocations go through the counting layer
 * ======================================================================== */

/* user: an int set to 1 when an allocation failed, since unpack returns
 * NULL for that and for a corrupt encoding alike. */
static void *pb_alloc(void *user, size_t size) {
  void *p = es_mem_alloc(ES_MEM_MODEL, size ? size : 1);
  if (!p)
    *(int *)user = 1;
  return p;
}

static void pb_free(void *user, void *p) {
  (void)user;
  es_mem_free(p);
}

/* ==========================================================================
 * Element types and shapes
 * ======================================================================== */

static const char *onnx_type_name(int32_t t) {
  static const char *const names[] = {"undefined", "float", "uint8",  "int8",      "uint16",
                                      "int16",     "int32", "int64",  "string",    "bool",
                                      "float16",   "double", "uint32", "uint64",   "complex64",
                                      "complex128", "bfloat16"};
  return t >= 0 && t < (int32_t)(sizeof names / sizeof names[0]) ? names[t] : "unknown";
}

/* ==========================================================================
 * Loader state
 * ======================================================================== */

/* A constant whose bytes are still in the protobuf tree. */
typedef struct pending_const {
  const Onnx__TensorProto *t; /* source, NULL for a scalar/list attribute */
  int value;                  /* value index */
  /* Constant-node value_float(s) / value_int(s): data from the attribute */
  const void *attr_data;
} pending_const;

typedef struct loader {
  es_graph *g;
  const Onnx__GraphProto *gp;
  /* name -> value index, open addressing */
  int *slots;
  size_t nslots;
  int cap_values;
  pending_const *consts;
  int n_consts, cap_consts;
} loader;

static uint64_t name_hash(const char *s) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (; *s; s++)
    h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static int name_find(const loader *L, const char *name) {
  size_t mask = L->nslots - 1;
  for (size_t i = name_hash(name) & mask;; i = (i + 1) & mask) {
    int v = L->slots[i];
    if (v < 0)
      return -1;
    if (!strcmp(L->g->values[v].name, name))
      return v;
  }
}

/* Adds a value; ES_EMODEL if the name is already defined. */
static int value_add(loader *L, const char *name, es_value_kind kind, const char *what,
                     int *out) {
  es_graph *g = L->g;
  if (!name || !name[0])
    return es__fail(ES_EMODEL, "%s has an empty name", what);
  if (name_find(L, name) >= 0)
    return es__fail(ES_EMODEL, "%s: name '%s' is defined twice", what, name);
  if (g->n_values >= L->cap_values)
    return es__fail(ES_EMODEL, "%s: more values than the graph declares", what);
  int v = g->n_values++;
  es_value *val = &g->values[v];
  val->name = es__ctx_strdup(&g->ctx, name);
  if (!val->name)
    return es__fail(ES_ENOMEM, "out of memory loading the model");
  val->kind = kind;
  val->rank = -1;
  val->producer = -1;
  size_t mask = L->nslots - 1;
  size_t i = name_hash(name) & mask;
  while (L->slots[i] >= 0)
    i = (i + 1) & mask;
  L->slots[i] = v;
  *out = v;
  return 0;
}

/* ==========================================================================
 * Constant tensors
 * ======================================================================== */

/* Validates a TensorProto and fills dtype, shape and byte size into v. */
static int tensor_check(const Onnx__TensorProto *t, es_value *v, const char *what) {
  es_dtype dt = (es_dtype)t->data_type;
  size_t esz = es_dtype_size(dt);
  if (!t->has_data_type || esz == 0)
    return es__fail(ES_ENOTSUP, "%s: element type %s (%d) is not supported", what,
                    onnx_type_name(t->data_type), (int)t->data_type);
  if (t->n_dims > ES_MAX_RANK)
    return es__fail(ES_ENOTSUP, "%s: rank %zu exceeds the maximum %d", what, t->n_dims,
                    ES_MAX_RANK);
  if (t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL || t->n_external_data)
    return es__fail(ES_ENOTSUP, "%s: external tensor data is not supported", what);
  if (t->segment)
    return es__fail(ES_ENOTSUP, "%s: segmented tensors are not supported", what);
  uint64_t n = 1;
  for (size_t i = 0; i < t->n_dims; i++) {
    if (t->dims[i] < 0)
      return es__fail(ES_EMODEL, "%s: dimension %zu is negative (%lld)", what, i,
                      (long long)t->dims[i]);
    if (__builtin_mul_overflow(n, (uint64_t)t->dims[i], &n) || n > ES_ONNX_MAX_ELEMS)
      return es__fail(ES_EMODEL, "%s: the product of its dimensions overflows", what);
    v->dims[i] = t->dims[i];
  }
  v->rank = (int)t->n_dims;
  v->dtype = dt;
  v->nbytes = (size_t)n * esz;
  size_t have;
  if (t->has_raw_data) {
    if (t->raw_data.len != v->nbytes)
      return es__fail(ES_EMODEL, "%s: raw_data holds %zu bytes, its shape needs %zu", what,
                      t->raw_data.len, v->nbytes);
    return 0;
  }
  switch (dt) {
  case ES_DTYPE_FLOAT:
    have = t->n_float_data;
    break;
  case ES_DTYPE_INT64:
    have = t->n_int64_data;
    break;
  default: /* int32, int8, uint8, bool are all carried in int32_data */
    have = t->n_int32_data;
    break;
  }
  if (have != n)
    return es__fail(ES_EMODEL, "%s: holds %zu %s elements, its shape needs %llu", what, have,
                    es_dtype_name(dt), (unsigned long long)n);
  return 0;
}

static void tensor_copy(const Onnx__TensorProto *t, const es_value *v, void *dst) {
  if (v->nbytes == 0)
    return;
  if (t->has_raw_data) {
    memcpy(dst, t->raw_data.data, v->nbytes); /* little-endian host, as ONNX */
    return;
  }
  size_t n = v->nbytes / es_dtype_size(v->dtype);
  switch (v->dtype) {
  case ES_DTYPE_FLOAT:
    memcpy(dst, t->float_data, v->nbytes);
    break;
  case ES_DTYPE_INT64:
    memcpy(dst, t->int64_data, v->nbytes);
    break;
  case ES_DTYPE_INT32:
    memcpy(dst, t->int32_data, v->nbytes);
    break;
  default:
    for (size_t i = 0; i < n; i++)
      ((uint8_t *)dst)[i] = (uint8_t)t->int32_data[i];
    break;
  }
}

static int const_push(loader *L, const Onnx__TensorProto *t, const void *attr_data, int value) {
  if (L->n_consts == L->cap_consts) {
    int cap = L->cap_consts ? L->cap_consts * 2 : 64;
    pending_const *n = es_mem_realloc(L->consts, (size_t)cap * sizeof *n);
    if (!L->consts)
      n = es_mem_alloc(ES_MEM_MODEL, (size_t)cap * sizeof *n);
    if (!n)
      return es__fail(ES_ENOMEM, "out of memory loading the model");
    L->consts = n;
    L->cap_consts = cap;
  }
  L->consts[L->n_consts++] = (pending_const){t, value, attr_data};
  return 0;
}

/* A named constant from a TensorProto (initializer or tensor attribute). */
static int const_from_tensor(loader *L, const Onnx__TensorProto *t, const char *name,
                             const char *what, int *out) {
  int v;
  int rc = value_add(L, name, ES_VALUE_CONST, what, &v);
  if (rc < 0)
    return rc;
  rc = tensor_check(t, &L->g->values[v], what);
  if (rc < 0)
    return rc;
  *out = v;
  return const_push(L, t, NULL, v);
}

/* Copies every constant out of the protobuf tree into its own staging block
 * (graph.h). One block each, not one slab: the passes drop and replace
 * constants one at a time, and es__graph_seal copies the survivors anyway. A
 * constant left unstaged by a failure has data NULL, which es__graph_fini
 * skips. */
static int const_stage(loader *L) {
  es_graph *g = L->g;
  for (int i = 0; i < L->n_consts; i++) {
    const pending_const *c = &L->consts[i];
    es_value *v = &g->values[c->value];
    void *dst = es_mem_alloc(ES_MEM_MODEL, v->nbytes ? v->nbytes : 1);
    if (!dst)
      return es__fail(ES_ENOMEM, "out of memory staging constant '%s' (%zu bytes)", v->name,
                      v->nbytes);
    if (c->t)
      tensor_copy(c->t, v, dst);
    else if (v->nbytes)
      memcpy(dst, c->attr_data, v->nbytes);
    v->data = dst;
  }
  return 0;
}

/* ==========================================================================
 * Graph inputs and outputs
 * ======================================================================== */

static int value_info_apply(const Onnx__ValueInfoProto *vi, es_value *v, const char *what) {
  const Onnx__TypeProto *tp = vi->type;
  if (!tp)
    return 0; /* allowed: type only known once planned */
  if (tp->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || !tp->tensor_type)
    return es__fail(ES_ENOTSUP, "%s '%s': only tensor types are supported", what, vi->name);
  const Onnx__TypeProto__Tensor *tt = tp->tensor_type;
  if (tt->has_elem_type) {
    if (es_dtype_size((es_dtype)tt->elem_type) == 0)
      return es__fail(ES_ENOTSUP, "%s '%s': element type %s is not supported", what, vi->name,
                      onnx_type_name(tt->elem_type));
    v->dtype = (es_dtype)tt->elem_type;
  }
  if (tt->shape) {
    if (tt->shape->n_dim > ES_MAX_RANK)
      return es__fail(ES_ENOTSUP, "%s '%s': rank %zu exceeds the maximum %d", what, vi->name,
                      tt->shape->n_dim, ES_MAX_RANK);
    v->rank = (int)tt->shape->n_dim;
    for (size_t i = 0; i < tt->shape->n_dim; i++) {
      const Onnx__TensorShapeProto__Dimension *d = tt->shape->dim[i];
      int64_t x = -1;
      if (d && d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE &&
          d->dim_value >= 0)
        x = d->dim_value;
      v->dims[i] = x;
    }
  }
  return 0;
}

/* ==========================================================================
 * Nodes
 * ======================================================================== */

static int attr_convert(loader *L, const es_node *n, const Onnx__AttributeProto *a, es_attr *out,
                        const char *label) {
  es_graph *g = L->g;
  if (!a->name || !a->name[0])
    return es__fail(ES_EMODEL, "%s: attribute without a name", label);
  if (a->ref_attr_name && a->ref_attr_name[0])
    return es__fail(ES_EMODEL, "%s: attribute '%s' refers to a function attribute", label,
                    a->name);
  out->name = es__ctx_strdup(&g->ctx, a->name);
  out->tensor = -1;
  if (!out->name)
    return es__fail(ES_ENOMEM, "out of memory loading the model");
  switch (a->type) {
  case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT:
    out->type = ES_ATTR_FLOAT;
    out->f = a->f;
    return 0;
  case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT:
    out->type = ES_ATTR_INT;
    out->i = a->i;
    return 0;
  case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING: {
    out->type = ES_ATTR_STRING;
    if (a->s.len > 4096)
      return es__fail(ES_EMODEL, "%s: string attribute '%s' is too long", label, a->name);
    char *s = es__ctx_alloc(&g->ctx, a->s.len + 1);
    if (!s)
      return es__fail(ES_ENOMEM, "out of memory loading the model");
    if (a->s.len)
      memcpy(s, a->s.data, a->s.len);
    if (memchr(s, '\0', a->s.len))
      return es__fail(ES_EMODEL, "%s: string attribute '%s' contains a NUL byte", label,
                      a->name);
    out->s = s;
    return 0;
  }
  case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS: {
    out->type = ES_ATTR_INTS;
    out->n = a->n_ints;
    int64_t *v = es__ctx_alloc(&g->ctx, a->n_ints * sizeof(int64_t));
    if (!v)
      return es__fail(ES_ENOMEM, "out of memory loading the model");
    if (a->n_ints)
      memcpy(v, a->ints, a->n_ints * sizeof(int64_t));
    out->ints = v;
    return 0;
  }
  case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS: {
    out->type = ES_ATTR_FLOATS;
    out->n = a->n_floats;
    float *v = es__ctx_alloc(&g->ctx, a->n_floats * sizeof(float));
    if (!v)
      return es__fail(ES_ENOMEM, "out of memory loading the model");
    if (a->n_floats)
      memcpy(v, a->floats, a->n_floats * sizeof(float));
    out->floats = v;
    return 0;
  }
  case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR: {
    out->type = ES_ATTR_TENSOR;
    if (!a->t)
      return es__fail(ES_EMODEL, "%s: tensor attribute '%s' has no tensor", label, a->name);
    /* Anonymous constants get a name no ONNX identifier can clash with. */
    char nm[96];
    snprintf(nm, sizeof nm, "\x01attr:%d:%s", n->file_index, a->name);
    char what[256];
    snprintf(what, sizeof what, "%s attribute '%s'", label, a->name);
    return const_from_tensor(L, a->t, nm, what, &out->tensor);
  }
  case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH:
  case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPHS:
    return es__fail(ES_ENOTSUP, "%s: attribute '%s' is a subgraph (control flow is not supported)",
                    label, a->name);
  default:
    return es__fail(ES_ENOTSUP, "%s: attribute '%s' has unsupported type %d", label, a->name,
                    (int)a->type);
  }
}

/* A Constant node becomes a constant value named by its output. */
static int constant_node(loader *L, const Onnx__NodeProto *np, int file_index, const char *label) {
  if (np->n_output != 1 || np->n_input != 0 || np->n_attribute != 1)
    return es__fail(ES_EMODEL, "%s: needs no input, one output and one attribute", label);
  const Onnx__AttributeProto *a = np->attribute[0];
  const char *name = np->output[0];
  if (!a || !a->name)
    return es__fail(ES_EMODEL, "%s: attribute without a name", label);
  if (!strcmp(a->name, "value") && a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR &&
      a->t) {
    int v;
    return const_from_tensor(L, a->t, name, label, &v);
  }
  int v, rc;
  es_value *val;
  const void *src = NULL;
  es_dtype dt;
  size_t n;
  int rank;
  if (!strcmp(a->name, "value_float") && a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT) {
    dt = ES_DTYPE_FLOAT, n = 1, rank = 0, src = &a->f;
  } else if (!strcmp(a->name, "value_floats") &&
             a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS) {
    dt = ES_DTYPE_FLOAT, n = a->n_floats, rank = 1, src = a->floats;
  } else if (!strcmp(a->name, "value_int") &&
             a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT) {
    dt = ES_DTYPE_INT64, n = 1, rank = 0, src = &a->i;
  } else if (!strcmp(a->name, "value_ints") &&
             a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS) {
    dt = ES_DTYPE_INT64, n = a->n_ints, rank = 1, src = a->ints;
  } else {
    return es__fail(ES_ENOTSUP, "%s: attribute '%s' (type %d) is not supported", label, a->name,
                    (int)a->type);
  }
  (void)file_index;
  rc = value_add(L, name, ES_VALUE_CONST, label, &v);
  if (rc < 0)
    return rc;
  val = &L->g->values[v];
  val->dtype = dt;
  val->rank = rank;
  if (rank == 1)
    val->dims[0] = (int64_t)n;
  val->nbytes = n * es_dtype_size(dt);
  /* The protobuf tree lives until const_stage, so src stays valid. */
  return const_push(L, NULL, src, v);
}

static void node_label(const Onnx__NodeProto *np, int file_index, char *label, size_t size) {
  const char *nm = np->name ? np->name : "";
  const char *ot = np->op_type ? np->op_type : "";
  if (nm[0])
    snprintf(label, size, "node '%.80s' (#%d %.60s)", nm, file_index, ot);
  else
    snprintf(label, size, "node #%d (%.60s)", file_index, ot);
}

/* Pass 1: check the operator, define the node's outputs (so inputs may refer
 * to nodes later in the file; the topological sort orders them and finds
 * cycles). A Constant node becomes a constant value and no node. */
static int node_declare(loader *L, const Onnx__NodeProto *np, int file_index, es_node *out) {
  es_graph *g = L->g;
  char label[200];
  node_label(np, file_index, label, sizeof label);
  const char *ot = np->op_type ? np->op_type : "";
  if (np->domain && np->domain[0] && strcmp(np->domain, "ai.onnx"))
    return es__fail(ES_ENOTSUP, "%s: operator domain '%.60s' is not supported", label, np->domain);
  if (g->opset < 0)
    return es__fail(ES_EMODEL, "%s: the model imports no default-domain opset", label);
  es_op op = es__op_from_name(ot);
  if (op == ES_OP_UNKNOWN)
    return es__fail(ES_ENOTSUP, "%s: operator '%.60s' is not supported", label, ot);
  if (g->opset < es__op_min_opset(op))
    return es__fail(ES_ENOTSUP, "%s: %s before opset %d is not supported (model opset %lld)",
                    label, ot, es__op_min_opset(op), (long long)g->opset);
  if (op == ES_OP_Constant)
    return constant_node(L, np, file_index, label); /* out stays ES_OP_UNKNOWN */

  out->op = op;
  out->file_index = file_index;
  out->name = es__ctx_strdup(&g->ctx, np->name);
  out->n_in = (int)np->n_input;
  out->n_out = (int)np->n_output;
  out->in = es__ctx_alloc(&g->ctx, (np->n_input + 1) * sizeof(int));
  out->out = es__ctx_alloc(&g->ctx, (np->n_output + 1) * sizeof(int));
  out->attrs = es__ctx_alloc(&g->ctx, (np->n_attribute + 1) * sizeof(es_attr));
  if (!out->name || !out->in || !out->out || !out->attrs)
    return es__fail(ES_ENOMEM, "out of memory loading the model");
  if (np->n_output == 0)
    return es__fail(ES_EMODEL, "%s: has no output", label);
  for (size_t i = 0; i < np->n_output; i++) {
    const char *o = np->output[i];
    if (!o || !o[0]) {
      out->out[i] = -1;
      continue;
    }
    int v, rc = value_add(L, o, ES_VALUE_ACT, label, &v);
    if (rc < 0)
      return rc;
    out->out[i] = v;
  }
  /* Omitted trailing outputs are dropped; an omitted one in the middle keeps
   * its slot as -1 and kernels must accept it. */
  while (out->n_out > 0 && out->out[out->n_out - 1] < 0)
    out->n_out--;
  if (out->n_out == 0)
    return es__fail(ES_EMODEL, "%s: all its outputs are unnamed", label);
  return 0;
}

/* Pass 2: resolve inputs by name and convert attributes. */
static int node_resolve(loader *L, const Onnx__NodeProto *np, es_node *out) {
  char label[200];
  node_label(np, out->file_index, label, sizeof label);
  for (size_t i = 0; i < np->n_input; i++) {
    const char *in = np->input[i];
    if (!in || !in[0]) {
      out->in[i] = -1; /* omitted optional input */
      continue;
    }
    int v = name_find(L, in);
    if (v < 0)
      return es__fail(ES_EMODEL,
                      "%s: input %zu '%.80s' is not a graph input, an initializer or a node's "
                      "output",
                      label, i, in);
    out->in[i] = v;
  }
  for (size_t a = 0; a < np->n_attribute; a++) {
    if (!np->attribute[a])
      return es__fail(ES_EMODEL, "%s: attribute #%zu is empty", label, a);
    int rc = attr_convert(L, out, np->attribute[a], &out->attrs[a], label);
    if (rc < 0)
      return rc;
    out->n_attr++;
  }
  return 0;
}

/* ==========================================================================
 * Entry point
 * ======================================================================== */

static int graph_load(loader *L, const Onnx__ModelProto *mp) {
  es_graph *g = L->g;
  const Onnx__GraphProto *gp = mp->graph;
  if (!gp)
    return es__fail(ES_EMODEL, "the model has no graph");
  L->gp = gp;
  g->ir_version = mp->has_ir_version ? mp->ir_version : 0;
  g->opset = -1;
  for (size_t i = 0; i < mp->n_opset_import; i++) {
    const Onnx__OperatorSetIdProto *os = mp->opset_import[i];
    if (os && (!os->domain || !os->domain[0] || !strcmp(os->domain, "ai.onnx")))
      g->opset = os->has_version ? os->version : -1;
  }
  if (g->opset < 0 && g->ir_version < 3)
    g->opset = 1; /* before IR 3 there were no opset imports */
  if (g->opset > ES_ONNX_MAX_OPSET)
    return es__fail(ES_ENOTSUP, "opset %lld is newer than the engine supports (1..%d)",
                    (long long)g->opset, ES_ONNX_MAX_OPSET);
  if (gp->n_node > ES_ONNX_MAX_NODES)
    return es__fail(ES_EMODEL, "the graph has %zu nodes, more than %d", gp->n_node,
                    ES_ONNX_MAX_NODES);
  if (gp->n_sparse_initializer)
    return es__fail(ES_ENOTSUP, "sparse initializers are not supported");

  /* Upper bound on values: inputs + initializers + node outputs + tensor
   * attributes. All are bounded by the message size, so no overflow. */
  size_t cap = gp->n_input + gp->n_initializer + 1;
  for (size_t i = 0; i < gp->n_node; i++) {
    if (!gp->node[i])
      return es__fail(ES_EMODEL, "node #%zu is empty", i);
    cap += gp->node[i]->n_output + gp->node[i]->n_attribute;
  }
  if (cap > (size_t)INT32_MAX / 4)
    return es__fail(ES_EMODEL, "the graph is too large (%zu values)", cap);
  L->cap_values = (int)cap;
  g->cap_values = (int)cap;
  L->nslots = 16;
  while (L->nslots < cap * 2)
    L->nslots <<= 1;
  L->slots = es_mem_alloc(ES_MEM_MODEL, L->nslots * sizeof(int));
  g->values = es__ctx_alloc(&g->ctx, cap * sizeof(es_value));
  g->nodes = es__ctx_alloc(&g->ctx, (gp->n_node + 1) * sizeof(es_node));
  g->inputs = es__ctx_alloc(&g->ctx, (gp->n_input + 1) * sizeof(int));
  g->outputs = es__ctx_alloc(&g->ctx, (gp->n_output + 1) * sizeof(int));
  if (!L->slots || !g->values || !g->nodes || !g->inputs || !g->outputs)
    return es__fail(ES_ENOMEM, "out of memory loading the model");
  memset(L->slots, 0xff, L->nslots * sizeof(int));

  int rc;
  for (size_t i = 0; i < gp->n_initializer; i++) {
    const Onnx__TensorProto *t = gp->initializer[i];
    char what[160];
    snprintf(what, sizeof what, "initializer #%zu '%.80s'", i, t && t->name ? t->name : "");
    if (!t)
      return es__fail(ES_EMODEL, "%s is empty", what);
    int v;
    if ((rc = const_from_tensor(L, t, t->name, what, &v)) < 0)
      return rc;
  }
  for (size_t i = 0; i < gp->n_input; i++) {
    const Onnx__ValueInfoProto *vi = gp->input[i];
    if (!vi || !vi->name || !vi->name[0])
      return es__fail(ES_EMODEL, "graph input #%zu has no name", i);
    if (name_find(L, vi->name) >= 0)
      continue; /* IR < 4 lists initializers as inputs too: the constant wins */
    int v;
    if ((rc = value_add(L, vi->name, ES_VALUE_INPUT, "graph input", &v)) < 0)
      return rc;
    if ((rc = value_info_apply(vi, &g->values[v], "graph input")) < 0)
      return rc;
    if (g->values[v].dtype == ES_DTYPE_UNDEFINED)
      return es__fail(ES_EMODEL, "graph input '%s' has no element type", vi->name);
    g->inputs[g->n_inputs++] = v;
  }
  int *slot_of = es_mem_alloc(ES_MEM_MODEL, (gp->n_node + 1) * sizeof(int));
  if (!slot_of)
    return es__fail(ES_ENOMEM, "out of memory loading the model");
  rc = 0;
  for (size_t i = 0; i < gp->n_node && rc == 0; i++) {
    es_node *n = &g->nodes[g->n_nodes];
    rc = node_declare(L, gp->node[i], (int)i, n);
    slot_of[i] = n->op != ES_OP_UNKNOWN ? g->n_nodes++ : -1;
  }
  for (size_t i = 0; i < gp->n_node && rc == 0; i++)
    if (slot_of[i] >= 0)
      rc = node_resolve(L, gp->node[i], &g->nodes[slot_of[i]]);
  es_mem_free(slot_of);
  if (rc < 0)
    return rc;
  for (size_t i = 0; i < gp->n_output; i++) {
    const Onnx__ValueInfoProto *vi = gp->output[i];
    if (!vi || !vi->name || !vi->name[0])
      return es__fail(ES_EMODEL, "graph output #%zu has no name", i);
    int v = name_find(L, vi->name);
    if (v < 0)
      return es__fail(ES_EMODEL, "graph output '%.80s' is not produced by any node", vi->name);
    for (int k = 0; k < g->n_outputs; k++)
      if (g->outputs[k] == v)
        return es__fail(ES_EMODEL, "graph output '%.80s' is listed twice", vi->name);
    es_value tmp = g->values[v];
    if ((rc = value_info_apply(vi, &tmp, "graph output")) < 0)
      return rc;
    if (g->values[v].kind == ES_VALUE_ACT) /* declared type: kept for describing */
      g->values[v] = tmp;
    g->values[v].is_output = 1;
    g->outputs[g->n_outputs++] = v;
  }
  if (g->n_outputs == 0)
    return es__fail(ES_EMODEL, "the graph has no outputs");
  for (int i = 0; i < g->n_nodes; i++)
    for (int o = 0; o < g->nodes[i].n_out; o++)
      if (g->nodes[i].out[o] >= 0)
        g->values[g->nodes[i].out[o]].producer = i;
  return 0;
}

int es__onnx_load(const void *data, size_t size, es_graph *g) {
  if (!data || !g)
    return es__fail(ES_EINVAL, "es__onnx_load: NULL argument");
  int oom = 0;
  ProtobufCAllocator al = {pb_alloc, pb_free, &oom};
  Onnx__ModelProto *mp = onnx__model_proto__unpack(&al, size, data);
  if (!mp && oom)
    return es__fail(ES_ENOMEM, "out of memory decoding the ONNX model (%zu bytes)", size);
  if (!mp)
    return es__fail(ES_EMODEL,
                    "not a valid ONNX model: the protobuf encoding is truncated or corrupted "
                    "(%zu bytes)",
                    size);
  loader L = {.g = g};
  int rc = graph_load(&L, mp);
  if (rc == 0)
    rc = const_stage(&L);
  es_mem_free(L.slots);
  es_mem_free(L.consts);
  onnx__model_proto__free_unpacked(mp, &al);
  if (rc == 0)
    rc = es__graph_toposort(g);
  if (rc == 0)
    es__graph_prune(g);
  if (rc == 0)
    rc = es__graph_attrs_resolve(g);
  if (rc < 0)
    es__graph_fini(g);
  return rc;
}

int es__onnx_tensor_parse(const void *buf, size_t size, es_value *v, void **data) {
  if (!buf || !v || !data)
    return es__fail(ES_EINVAL, "es__onnx_tensor_parse: NULL argument");
  int oom = 0;
  ProtobufCAllocator al = {pb_alloc, pb_free, &oom};
  Onnx__TensorProto *t = onnx__tensor_proto__unpack(&al, size, buf);
  if (!t && oom)
    return es__fail(ES_ENOMEM, "out of memory decoding a TensorProto (%zu bytes)", size);
  if (!t)
    return es__fail(ES_EMODEL, "not a valid TensorProto (%zu bytes)", size);
  memset(v, 0, sizeof *v);
  v->rank = -1;
  v->producer = -1;
  v->kind = ES_VALUE_CONST;
  int rc = tensor_check(t, v, "tensor");
  void *d = NULL;
  if (rc == 0) {
    d = es_mem_aligned_alloc(ES_MEM_ENGINE, 64, v->nbytes ? v->nbytes : 1);
    if (!d)
      rc = es__fail(ES_ENOMEM, "out of memory reading a tensor of %zu bytes", v->nbytes);
    else
      tensor_copy(t, v, d);
  }
  onnx__tensor_proto__free_unpacked(t, &al);
  v->data = d;
  *data = d;
  return rc;
}
