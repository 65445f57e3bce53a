/* Post-training static quantization to a QDQ ONNX model (quantize.h).
 *
 * The quantizer edits the model's own protobuf tree (es__onnx_unpack): what
 * it does not touch is written back as it was read, so a model keeps its
 * names, metadata, other domains and subgraphs. Everything it adds (nodes,
 * initializers, strings) is bumped from the tree's context and freed with
 * it.
 *
 * Three stages:
 *   1. create: BatchNormalization (or a per-channel bias Add) after a Conv
 *      or ConvTranspose is folded into it (a quantized convolution's
 *      weights must be the ones that run); nodes are classified (the
 *      weighted ones, and the Adds, Muls, Concats and GlobalAveragePools
 *      of convolutions' maps); the tensors to calibrate are chosen; the
 *      tree (with
 *      those tensors added as graph outputs) is loaded into the engine as
 *      the calibration model.
 *   2. observe: a run per sample; each observed tensor keeps its min and
 *      max and, for the percentile method, a histogram whose range doubles
 *      (adjacent bins merged in pairs, so no count moves between values)
 *      when a sample leaves it.
 *   3. write: opset raised to 13 when lower (per-axis QuantizeLinear /
 *      DequantizeLinear need it), then the QDQ rewrite, initializers no
 *      node reads any more dropped, and the tree packed.
 *
 * Numbers follow what ONNX Runtime's own quantizer writes, so files from
 * either look alike to either engine: weight scale = max|w| / 127 per output
 * channel (int8, zero point 0, values in [-127, 127]); activation scale =
 * (hi - lo) / 255 over a range that holds 0, zero point rint(-lo / scale)
 * (uint8); bias = rint(b / (x_scale * w_scale)) in int32, its scale
 * computed in float32. */
#include "edgeserve/quantize.h"

#include "common/internal.h"
#include "memory/ctx.h"
#include "model/graph.h"
#include "onnx.pb-c.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define QZ_BINS 2048
/* Error-feedback rounding: the largest patch (inputs per group x kernel
 * taps) it takes (its factorization is dg^3 / 2 operations, its moments
 * hold g x dg^2 doubles and cost g x dg^2 / 2 per position), and the
 * positions sampled per sample: at most QZ_GPTQ_POSITIONS, and fewer
 * where the moments would cost more than QZ_GPTQ_WORK products a sample
 * (a 1x1 Conv of 1024 inputs: 128 positions; BlazeFace's all 4096) */
#define QZ_GPTQ_MAX_D 1152
#define QZ_GPTQ_POSITIONS 4096
#define QZ_GPTQ_WORK (1 << 26)
#define QZ_OPSET 13

/* ==========================================================================
 * A name -> int map (open addressing; keys are strings the tree holds)
 * ======================================================================== */

typedef struct smap {
  const char **keys;
  int *vals;
  size_t cap, n;
} smap;

static uint64_t smap_hash(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++)
    h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static int smap_grow(smap *m) {
  size_t cap = m->cap ? m->cap * 2 : 256;
  const char **k = es_mem_calloc(ES_MEM_ENGINE, cap, sizeof *k);
  int *v = es_mem_calloc(ES_MEM_ENGINE, cap, sizeof *v);
  if (!k || !v) {
    es_mem_free(k);
    es_mem_free(v);
    return ES_ENOMEM;
  }
  for (size_t i = 0; i < m->cap; i++) {
    if (!m->keys[i])
      continue;
    size_t j = smap_hash(m->keys[i]) & (cap - 1);
    while (k[j])
      j = (j + 1) & (cap - 1);
    k[j] = m->keys[i];
    v[j] = m->vals[i];
  }
  es_mem_free(m->keys);
  es_mem_free(m->vals);
  m->keys = k;
  m->vals = v;
  m->cap = cap;
  return 0;
}

static int *smap_slot(smap *m, const char *key, int create) {
  if (!key || !key[0])
    return NULL;
  if (create && (m->n + 1) * 2 > m->cap && smap_grow(m) < 0)
    return NULL;
  if (!m->cap)
    return NULL;
  size_t j = smap_hash(key) & (m->cap - 1);
  while (m->keys[j]) {
    if (!strcmp(m->keys[j], key))
      return &m->vals[j];
    j = (j + 1) & (m->cap - 1);
  }
  if (!create)
    return NULL;
  m->keys[j] = key;
  m->vals[j] = 0;
  m->n++;
  return &m->vals[j];
}

static int smap_get(const smap *m, const char *key) {
  int *v = smap_slot((smap *)m, key, 0);
  return v ? *v : -1;
}

static int smap_set(smap *m, const char *key, int val) {
  int *v = smap_slot(m, key, 1);
  if (!v)
    return ES_ENOMEM;
  *v = val;
  return 0;
}

static void smap_free(smap *m) {
  es_mem_free(m->keys);
  es_mem_free(m->vals);
  memset(m, 0, sizeof *m);
}

/* ==========================================================================
 * The quantizer
 * ======================================================================== */

/* QK_ADD, QK_CONCAT, QK_MUL and QK_GAP (a GlobalAveragePool or an
 * AveragePool) have activations only (no weights): a pair on each input
 * and on the output, which engines run as QLinearAdd / QLinearConcat /
 * QLinearMul / QLinearGlobalAveragePool / QLinearAveragePool (a feature
 * pyramid's sums and joins, a squeeze-excitation's pooling and scaling
 * stay in 8 bits). */
typedef enum qkind {
  QK_NONE, QK_CONV, QK_CONVT, QK_MATMUL, QK_GEMM, QK_ADD, QK_CONCAT, QK_MUL, QK_GAP
} qkind;

typedef struct qz_node {
  qkind kind;
  int removed;    /* folded away: a BatchNormalization, or an activation */
  int act;        /* the Relu / Clip folded into this node's output, -1 */
  double act_max; /* the Clip's upper bound (INFINITY for Relu) */
  int quant;      /* written as QDQ */
  int w_axis;     /* weight scale axis, -1: per tensor */
  int n_act;      /* activation inputs (1; 2 for a MatMul of two or an Add; a Concat's) */
  int out_float;  /* the output stays float: only shape ops lie between it and
                     the model's outputs */
  int wonly;      /* a Conv kept in float whose weights alone are int8 */
} qz_node;

typedef struct qz_obs {
  const char *name;
  int out_index;   /* output of the calibration model, or -1 ... */
  int in_index;    /* ... a model input, or -1 */
  int bad;         /* not float32: cannot be quantized */
  int seen, rank;
  double lo, hi;
  double hlo, hw;  /* histogram range [hlo, hlo + hw) */
  uint64_t *hist;  /* QZ_BINS counts (percentile method) */
  uint64_t count;
  /* write */
  int need, out_kind; /* a pair is written; 1: the producer is a quantized node */
  float scale;
  uint8_t zp;
} qz_obs;

/* Bias correction: per input channel and kernel tap of a 2-D Conv, the
 * mean of the input values that tap reads (zero padding included), summed
 * over the samples. Quantizing W moves each output channel's mean by
 * sum (Wq - W) * that mean; the bias takes it back (emit_weights). */
typedef struct qz_taps {
  double *sum;      /* [c][kh * kw] */
  int64_t c, kh, kw;
  uint64_t n;       /* samples summed */
  /* Error-feedback rounding (ES_QUANT_ROUND_GPTQ): per group of the Conv,
   * the second moment of the patch each output position reads (dg = c / g
   * * kh * kw values, zero padding included), upper triangle, averaged per
   * sample like sum; NULL when not asked for or dg > QZ_GPTQ_MAX_D. */
  double *h;        /* [g][dg][dg] */
  int64_t g, dg;
  int8_t *qw;       /* the rounding it made (made once: weights and h are fixed), or NULL */
} qz_taps;

struct es_quantizer {
  es_ctx ctx; /* the protobuf tree and all that is added to it */
  Onnx__ModelProto *mp;
  Onnx__GraphProto *g;
  int64_t opset;
  es_quant_options opt;
  qz_node *nodes;
  size_t n_nodes;
  qz_obs *obs;
  int n_obs, cap_obs;
  smap obs_map, init_map, prod_map, cons_n, names;
  int has_subgraphs;
  es_model *calib;
  es_plan_cache *cache;
  es_arena *arena;
  size_t arena_cap;
  es_quant_stats st;
  int written;
  qz_taps *taps; /* per node: 2-D Convs to quantize (NULL until observed) */
  unsigned name_seq;
  /* what each build starts from (write and the accuracy search build
   * many models from one calibration) */
  uint8_t *pristine; /* the tree as create left it, packed */
  size_t pristine_size;
  qz_node *nodes0;
  es_quant_stats st0;
  int64_t opset0;
  int n_out0; /* the source model's outputs: the calibration model's first */
  /* samples kept for the accuracy search: inputs and FP32 outputs */
  struct qz_sample *keep;
  int n_keep;
  double ref_sig[16]; /* each output's signal (sum of squares) over them all, */
  int ref_sig_known;  /* once measured */
};

typedef struct qz_sample {
  es_tensor in[16], ref[16];
  int n_in, n_ref;
} qz_sample;

static void *qz_alloc(es_quantizer *q, size_t n) { return es__ctx_alloc(&q->ctx, n ? n : 1); }

static char *qz_strdup(es_quantizer *q, const char *s) { return es__ctx_strdup(&q->ctx, s); }

/* A tensor name no one uses yet: base + suffix, or with a number after. */
static char *qz_name(es_quantizer *q, const char *base, const char *suffix) {
  char buf[512];
  snprintf(buf, sizeof buf, "%s%s", base, suffix);
  while (smap_get(&q->names, buf) >= 0)
    snprintf(buf, sizeof buf, "%s%s_%u", base, suffix, ++q->name_seq);
  char *s = qz_strdup(q, buf);
  if (!s || smap_set(&q->names, s, 1) < 0)
    return NULL;
  return s;
}

static int is_op(const Onnx__NodeProto *n, const char *op) {
  return n->op_type && !strcmp(n->op_type, op) && (!n->domain || !n->domain[0] ||
                                                   !strcmp(n->domain, "ai.onnx"));
}

static Onnx__AttributeProto *attr_find(const Onnx__NodeProto *n, const char *name) {
  for (size_t i = 0; i < n->n_attribute; i++)
    if (n->attribute[i]->name && !strcmp(n->attribute[i]->name, name))
      return n->attribute[i];
  return NULL;
}

static int64_t attr_int(const Onnx__NodeProto *n, const char *name, int64_t def) {
  Onnx__AttributeProto *a = attr_find(n, name);
  return a && a->has_i ? a->i : def;
}

static double attr_float(const Onnx__NodeProto *n, const char *name, double def) {
  Onnx__AttributeProto *a = attr_find(n, name);
  return a && a->has_f ? a->f : def;
}

static void attr_drop(Onnx__NodeProto *n, const char *name) {
  size_t k = 0;
  for (size_t i = 0; i < n->n_attribute; i++)
    if (!n->attribute[i]->name || strcmp(n->attribute[i]->name, name))
      n->attribute[k++] = n->attribute[i];
  n->n_attribute = k;
}

static int attr_add_int(es_quantizer *q, Onnx__NodeProto *n, const char *name, int64_t v) {
  static const Onnx__AttributeProto init = ONNX__ATTRIBUTE_PROTO__INIT;
  Onnx__AttributeProto *a = qz_alloc(q, sizeof *a);
  Onnx__AttributeProto **arr = qz_alloc(q, (n->n_attribute + 1) * sizeof *arr);
  if (!a || !arr)
    return ES_ENOMEM;
  *a = init;
  a->name = qz_strdup(q, name);
  a->has_type = 1;
  a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT;
  a->has_i = 1;
  a->i = v;
  if (n->n_attribute)
    memcpy(arr, n->attribute, n->n_attribute * sizeof *arr);
  arr[n->n_attribute++] = a;
  n->attribute = arr;
  return a->name ? 0 : ES_ENOMEM;
}

static Onnx__NodeProto *node_make(es_quantizer *q, const char *op, const char *name, int n_in,
                                  const char *const *in, const char *out) {
  static const Onnx__NodeProto init = ONNX__NODE_PROTO__INIT;
  Onnx__NodeProto *n = qz_alloc(q, sizeof *n);
  char **ins = qz_alloc(q, (size_t)n_in * sizeof *ins);
  char **outs = qz_alloc(q, sizeof *outs);
  if (!n || !ins || !outs)
    return NULL;
  *n = init;
  n->op_type = qz_strdup(q, op);
  n->name = qz_strdup(q, name);
  n->domain = qz_strdup(q, "");
  for (int i = 0; i < n_in; i++)
    if (!(ins[i] = qz_strdup(q, in[i])))
      return NULL;
  outs[0] = qz_strdup(q, out);
  if (!n->op_type || !n->name || !n->domain || !outs[0])
    return NULL;
  n->n_input = (size_t)n_in;
  n->input = ins;
  n->n_output = 1;
  n->output = outs;
  return n;
}

/* ---- initializers -------------------------------------------------------- */

static Onnx__TensorProto *init_of(const es_quantizer *q, const char *name) {
  int i = smap_get(&q->init_map, name);
  return i >= 0 ? q->g->initializer[i] : NULL;
}

static int64_t tp_count(const Onnx__TensorProto *t) {
  int64_t n = 1;
  for (size_t i = 0; i < t->n_dims; i++) {
    if (t->dims[i] < 0 || (t->dims[i] && n > INT64_MAX / t->dims[i]))
      return -1;
    n *= t->dims[i];
  }
  return n;
}

/* A float32 initializer's values (a copy in the context), NULL when it is
 * not one held in the file. */
static float *tp_floats(es_quantizer *q, const Onnx__TensorProto *t, int64_t *count) {
  if (!t || !t->has_data_type || t->data_type != ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT ||
      (t->has_data_location && t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL))
    return NULL;
  int64_t n = tp_count(t);
  if (n < 0)
    return NULL;
  float *v = qz_alloc(q, (size_t)n * sizeof *v);
  if (!v)
    return NULL;
  if (t->has_raw_data && t->raw_data.len == (size_t)n * 4)
    memcpy(v, t->raw_data.data, (size_t)n * 4); /* little-endian hosts only (es_dtype) */
  else if (!t->has_raw_data && t->n_float_data == (size_t)n)
    memcpy(v, t->float_data, (size_t)n * 4);
  else
    return NULL;
  *count = n;
  return v;
}

static Onnx__TensorProto *tp_make(es_quantizer *q, const char *name, int dtype, int rank,
                                  const int64_t *dims, const void *data, size_t bytes) {
  static const Onnx__TensorProto init = ONNX__TENSOR_PROTO__INIT;
  Onnx__TensorProto *t = qz_alloc(q, sizeof *t);
  if (!t)
    return NULL;
  *t = init;
  t->name = qz_strdup(q, name);
  t->has_data_type = 1;
  t->data_type = dtype;
  t->n_dims = (size_t)rank;
  t->dims = qz_alloc(q, (size_t)(rank ? rank : 1) * sizeof *t->dims);
  t->has_raw_data = 1;
  t->raw_data.len = bytes;
  t->raw_data.data = qz_alloc(q, bytes);
  if (!t->name || !t->dims || !t->raw_data.data)
    return NULL;
  if (rank)
    memcpy(t->dims, dims, (size_t)rank * sizeof *dims);
  memcpy(t->raw_data.data, data, bytes);
  return t;
}

/* Appends an initializer to the graph (and the maps). */
static int init_add(es_quantizer *q, Onnx__TensorProto *t) {
  if (!t)
    return ES_ENOMEM;
  Onnx__GraphProto *g = q->g;
  Onnx__TensorProto **arr = qz_alloc(q, (g->n_initializer + 1) * sizeof *arr);
  if (!arr)
    return ES_ENOMEM;
  if (g->n_initializer)
    memcpy(arr, g->initializer, g->n_initializer * sizeof *arr);
  arr[g->n_initializer] = t;
  g->initializer = arr;
  if (smap_set(&q->init_map, t->name, (int)g->n_initializer) < 0)
    return ES_ENOMEM;
  g->n_initializer++;
  return smap_set(&q->names, t->name, 1);
}

/* A new float32 initializer named after base. */
static const char *init_floats(es_quantizer *q, const char *base, const char *suffix, int rank,
                               const int64_t *dims, const float *v, int64_t n) {
  const char *name = qz_name(q, base, suffix);
  if (!name || init_add(q, tp_make(q, name, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, rank, dims, v,
                                   (size_t)n * 4)) < 0)
    return NULL;
  return name;
}

static const char *init_int64s(es_quantizer *q, const char *base, const char *suffix,
                               const int64_t *v, int64_t n) {
  const char *name = qz_name(q, base, suffix);
  if (!name || init_add(q, tp_make(q, name, ONNX__TENSOR_PROTO__DATA_TYPE__INT64, 1, &n, v,
                                   (size_t)n * 8)) < 0)
    return NULL;
  return name;
}

/* ---- graph facts ------------------------------------------------------- */

static int is_graph_output(const es_quantizer *q, const char *name) {
  for (size_t i = 0; i < q->g->n_output; i++)
    if (q->g->output[i]->name && !strcmp(q->g->output[i]->name, name))
      return 1;
  return 0;
}

static int graph_input_index(const es_quantizer *q, const char *name) {
  int k = 0;
  for (size_t i = 0; i < q->g->n_input; i++) {
    const char *n = q->g->input[i]->name;
    if (n && smap_get(&q->init_map, n) >= 0)
      continue; /* old models list initializers as inputs too */
    if (n && !strcmp(n, name))
      return k;
    k++;
  }
  return -1;
}

/* The one live node reading name, or -1 (none or several). */
static int sole_consumer(const es_quantizer *q, const char *name) {
  if (smap_get(&q->cons_n, name) != 1)
    return -1;
  for (size_t i = 0; i < q->n_nodes; i++) {
    if (q->nodes[i].removed)
      continue;
    const Onnx__NodeProto *n = q->g->node[i];
    for (size_t k = 0; k < n->n_input; k++)
      if (n->input[k] && !strcmp(n->input[k], name))
        return (int)i;
  }
  return -1;
}

static int index_graph(es_quantizer *q) {
  Onnx__GraphProto *g = q->g;
  smap_free(&q->prod_map);
  smap_free(&q->cons_n);
  int rc = 0;
  for (size_t i = 0; i < g->n_input && rc == 0; i++)
    rc = smap_set(&q->names, g->input[i]->name, 1);
  for (size_t i = 0; i < q->n_nodes && rc == 0; i++) {
    const Onnx__NodeProto *n = g->node[i];
    if (n->n_attribute)
      for (size_t a = 0; a < n->n_attribute; a++)
        if (n->attribute[a]->g || n->attribute[a]->n_graphs)
          q->has_subgraphs = 1;
    if (q->nodes[i].removed)
      continue;
    for (size_t k = 0; k < n->n_output && rc == 0; k++)
      if (n->output[k] && n->output[k][0]) {
        rc = smap_set(&q->prod_map, n->output[k], (int)i);
        if (rc == 0)
          rc = smap_set(&q->names, n->output[k], 1);
      }
    for (size_t k = 0; k < n->n_input && rc == 0; k++)
      if (n->input[k] && n->input[k][0]) {
        int *c = smap_slot(&q->cons_n, n->input[k], 1);
        if (!c)
          rc = ES_ENOMEM;
        else
          (*c)++;
      }
  }
  return rc < 0 ? es__fail(ES_ENOMEM, "quantize: out of memory indexing the graph") : 0;
}

/* An activation: made at run time, not constant. */
static int is_activation(const es_quantizer *q, const char *name) {
  if (!name || !name[0] || init_of(q, name))
    return 0;
  int p = smap_get(&q->prod_map, name);
  if (p >= 0)
    return !is_op(q->g->node[p], "Constant");
  return graph_input_index(q, name) >= 0;
}

/* ==========================================================================
 * Stage 1: BatchNormalization into Conv, classification, observation list
 * ======================================================================== */

/* The per-channel constant an Add puts on a 2-D convolution's m output
 * channels: [1, m, 1, 1] or [m, 1, 1] (or one value); NULL otherwise. */
static float *channel_const(es_quantizer *q, const char *name, int64_t m) {
  const Onnx__TensorProto *t = init_of(q, name);
  int64_t cnt;
  float *v = t ? tp_floats(q, t, &cnt) : NULL;
  if (!v || t->n_dims > 4 || (cnt != m && cnt != 1))
    return NULL;
  for (size_t d = 0; d < t->n_dims; d++)
    if (t->dims[d] != 1 && !(cnt == m && d == t->n_dims - 3))
      return NULL;
  if (cnt == m && m > 1 && t->n_dims < 3)
    return NULL; /* [m] broadcasts along the width, not the channels */
  return v;
}

/* Whether tensor name is a graph output or read by one node alone that
 * writes one (a head's last bias before its Sigmoid). */
static int ends_model(const es_quantizer *q, const char *name) {
  if (is_graph_output(q, name))
    return 1;
  int c = sole_consumer(q, name);
  if (c < 0)
    return 0;
  const Onnx__NodeProto *n = q->g->node[c];
  for (size_t k = 0; k < n->n_output; k++)
    if (is_graph_output(q, n->output[k]))
      return 1;
  return 0;
}

/* BatchNormalization, or an Add of a per-channel constant, after a Conv
 * or a ConvTranspose (one group) goes into the convolution's weights and
 * bias: the quantized convolution's numbers must be the ones that run, and
 * the int8 kernel then writes what the next node reads (a detection head's
 * upsampling: ConvTranspose, bias Add, BatchNormalization, Relu becomes
 * one node). An Add whose result ends the model stays: folded, it would
 * leave the convolution a float output (see near_outputs). */
static int fold_bn(es_quantizer *q) {
  Onnx__GraphProto *g = q->g;
  for (size_t i = 0; i < q->n_nodes; i++) {
    Onnx__NodeProto *bn = g->node[i];
    if (q->nodes[i].removed || bn->n_output < 1)
      continue;
    int is_bn = is_op(bn, "BatchNormalization") && bn->n_input >= 5 &&
                !attr_int(bn, "training_mode", 0);
    int is_add = is_op(bn, "Add") && bn->n_input == 2 && bn->n_output == 1;
    if (!is_bn && !is_add)
      continue;
    int xi = 0;
    if (is_add) {
      xi = init_of(q, bn->input[0]) ? 1 : 0;
      if (!init_of(q, bn->input[1 - xi]) || ends_model(q, bn->output[0]))
        continue;
    }
    int c = smap_get(&q->prod_map, bn->input[xi]);
    if (c < 0 || (!is_op(g->node[c], "Conv") && !is_op(g->node[c], "ConvTranspose")) ||
        g->node[c]->n_output != 1 || smap_get(&q->cons_n, bn->input[xi]) != 1 ||
        is_graph_output(q, bn->input[xi]) || g->node[c]->n_input < 2)
      continue;
    Onnx__NodeProto *cv = g->node[c];
    int tr = is_op(cv, "ConvTranspose");
    if (tr && attr_int(cv, "group", 1) != 1)
      continue;
    const Onnx__TensorProto *wt = init_of(q, cv->input[1]);
    int64_t nw, ns = 0, nb = 0, nm = 0, nv = 0, nbias = 0;
    float *w = tp_floats(q, wt, &nw);
    float *sc = NULL, *be = NULL, *me = NULL, *va = NULL, *add = NULL;
    if (!w || wt->n_dims < 3)
      continue;
    int64_t m = tr ? wt->dims[1] : wt->dims[0];
    if (is_bn) {
      sc = tp_floats(q, init_of(q, bn->input[1]), &ns);
      be = tp_floats(q, init_of(q, bn->input[2]), &nb);
      me = tp_floats(q, init_of(q, bn->input[3]), &nm);
      va = tp_floats(q, init_of(q, bn->input[4]), &nv);
      if (!sc || !be || !me || !va || ns != m || nb != m || nm != m || nv != m)
        continue;
    } else if (wt->n_dims != 4 || !(add = channel_const(q, bn->input[1 - xi], m))) {
      continue;
    }
    float *bias = NULL;
    if (cv->n_input > 2 && cv->input[2][0] && !(bias = tp_floats(q, init_of(q, cv->input[2]),
                                                                   &nbias)))
      continue;
    if (m <= 0 || (bias && nbias != m))
      continue;
    double eps = attr_float(bn, "epsilon", 1e-5);
    int64_t per = nw / (tr ? wt->dims[0] * m : m); /* kernel taps (and inputs, for Conv) */
    float *nbv = qz_alloc(q, (size_t)m * sizeof *nbv);
    if (!nbv)
      return ES_ENOMEM;
    int64_t nadd = 0;
    if (add)
      tp_floats(q, init_of(q, bn->input[1 - xi]), &nadd);
    for (int64_t o = 0; o < m; o++) {
      double b0 = bias ? (double)bias[o] : 0.0;
      if (add) {
        nbv[o] = (float)(b0 + (double)add[nadd == 1 ? 0 : o]);
        continue;
      }
      double s = (double)sc[o] / sqrt((double)va[o] + eps);
      if (tr)
        for (int64_t ci = 0; ci < wt->dims[0]; ci++)
          for (int64_t k = 0; k < per; k++)
            w[(ci * m + o) * per + k] = (float)((double)w[(ci * m + o) * per + k] * s);
      else
        for (int64_t k = 0; k < per; k++)
          w[o * per + k] = (float)((double)w[o * per + k] * s);
      nbv[o] = (float)((b0 - (double)me[o]) * s + (double)be[o]);
    }
    const char *wn = add ? cv->input[1]
                         : init_floats(q, cv->input[1], "_bnfold", (int)wt->n_dims, wt->dims, w,
                                       nw);
    const char *bnm = init_floats(q, cv->name && cv->name[0] ? cv->name : cv->output[0],
                                  add ? "_bias_addfold" : "_bias_bnfold", 1, &m, nbv, m);
    if (!wn || !bnm)
      return ES_ENOMEM;
    char **ins = qz_alloc(q, 3 * sizeof *ins);
    if (!ins)
      return ES_ENOMEM;
    ins[0] = cv->input[0];
    ins[1] = (char *)wn;
    ins[2] = (char *)bnm;
    cv->input = ins;
    cv->n_input = 3;
    cv->output[0] = bn->output[0];
    q->nodes[i].removed = 1;
    q->st.bn_folded++;
    int rc = index_graph(q);
    if (rc < 0)
      return rc;
  }
  return 0;
}

/* Constant nodes holding a tensor become initializers (some exporters
 * write every weight so): the same graph, and weights are found in one
 * place. */
static int constants_to_initializers(es_quantizer *q) {
  for (size_t i = 0; i < q->n_nodes; i++) {
    Onnx__NodeProto *n = q->g->node[i];
    if (q->nodes[i].removed || !is_op(n, "Constant") || n->n_output != 1 || !n->output[0][0] ||
        n->n_attribute != 1 || !n->attribute[0]->t || !n->attribute[0]->name ||
        strcmp(n->attribute[0]->name, "value"))
      continue;
    Onnx__TensorProto *t = n->attribute[0]->t;
    t->name = n->output[0];
    int rc = init_add(q, t);
    if (rc < 0)
      return rc;
    q->nodes[i].removed = 1;
  }
  return index_graph(q);
}

static int excluded(const es_quantizer *q, const Onnx__NodeProto *n) {
  for (int i = 0; i < q->opt.n_exclude; i++)
    if (n->name && q->opt.exclude[i] && !strcmp(n->name, q->opt.exclude[i]))
      return 1;
  return 0;
}

/* A float32 initializer of the given rank range. */
static int weight_ok(es_quantizer *q, const char *name, size_t rmin, size_t rmax) {
  const Onnx__TensorProto *t = init_of(q, name);
  int64_t n;
  return t && t->n_dims >= rmin && t->n_dims <= rmax && tp_floats(q, t, &n) != NULL && n > 0;
}

/* Ops a model's outputs are often made with from a head's raw values:
 * reshaping, joining, or squashing them into probabilities. */
static int is_output_op(const Onnx__NodeProto *n) {
  static const char *const ops[] = {"Reshape", "Transpose", "Concat",  "Squeeze", "Unsqueeze",
                                    "Flatten", "Identity",  "Sigmoid", "Softmax", NULL};
  for (int i = 0; ops[i]; i++)
    if (is_op(n, ops[i]))
      return 1;
  return 0;
}

/* near: tensors that reach the model's outputs through output ops only
 * (every reader one of them, leading there too). A quantized node writing
 * one keeps its output float: a head's raw values (box offsets, logits)
 * span ranges whose 255 steps are far coarser than what the outputs are
 * read for (a score's logit near 0 in a range of hundreds). Nodes are in
 * topological order, so walking them backwards sees every reader of a
 * tensor before its producer. */
static int near_outputs(es_quantizer *q, smap *near) {
  smap hits = {0};
  int rc = 0;
  for (size_t i = 0; i < q->g->n_output && rc == 0; i++)
    rc = smap_set(near, q->g->output[i]->name, 1);
  for (size_t i = q->n_nodes; i-- > 0 && rc == 0;) {
    const Onnx__NodeProto *n = q->g->node[i];
    if (q->nodes[i].removed)
      continue;
    for (size_t k = 0; k < n->n_output && rc == 0; k++) {
      const char *o = n->output[k];
      if (smap_get(near, o) < 0 && smap_get(&hits, o) > 0 && smap_get(&hits, o) == smap_get(&q->cons_n, o))
        rc = smap_set(near, o, 1);
    }
    if (rc == 0 && is_output_op(n) && n->n_output == 1 && smap_get(near, n->output[0]) > 0)
      for (size_t k = 0; k < n->n_input && rc == 0; k++) {
        int *h = smap_slot(&hits, n->input[k], 1);
        if (n->input[k] && n->input[k][0] && !h)
          rc = ES_ENOMEM;
        else if (h)
          (*h)++;
      }
  }
  smap_free(&hits);
  return rc;
}

static int derived_from(const es_quantizer *q, const char *b, const char *a, int depth);

/* An elementwise node's one runtime source: its only runtime input, or
 * the one its other runtime inputs are made from (x in x * Sigmoid(x));
 * NULL for anything else. */
static const char *ew_source(const es_quantizer *q, const Onnx__NodeProto *n, int depth) {
  static const char *const ew[] = {"Add", "Sub", "Mul", "Div", "Clip", "Relu", "Sigmoid",
                                   "HardSigmoid", "HardSwish", "Max", "Min", "Tanh", NULL};
  int known = 0;
  for (int i = 0; ew[i]; i++)
    known |= is_op(n, ew[i]);
  if (!known || depth > 8)
    return NULL;
  const char *src = NULL;
  for (size_t k = 0; k < n->n_input; k++) {
    const char *in = n->input[k];
    if (!in[0] || init_of(q, in) || (src && derived_from(q, in, src, depth + 1)))
      continue;
    if (src && !derived_from(q, src, in, depth + 1))
      return NULL; /* two independent runtime inputs */
    src = in;
  }
  return src;
}

/* Whether tensor b is made from tensor a by elementwise ops of one
 * runtime source (constants aside): then a * b is a gate of a by itself
 * (HardSwish written as x * Clip(x + 3, 0, 6) / 6, Swish as x *
 * Sigmoid(x)), which the engine runs from a's bytes as one 256-entry
 * table; quantizing the Mul would cut that chain in two. */
static int derived_from(const es_quantizer *q, const char *b, const char *a, int depth) {
  if (!strcmp(a, b))
    return 1;
  int p = depth > 8 ? -1 : smap_get(&q->prod_map, b);
  const char *src = p < 0 ? NULL : ew_source(q, q->g->node[p], depth + 1);
  return src && derived_from(q, src, a, depth + 1);
}

/* Whether tensor name is a quantized convolution's feature map: made by
 * a Conv or ConvTranspose (or an Add, Mul or Concat of such) classified
 * for int8, possibly through value-preserving ops (Relu, Clip, Resize,
 * MaxPool). Adds and Concats are quantized only there (a pyramid's sums
 * and joins), not on a transformer's residual stream, whose float sums
 * carry more than 255 steps can (rec lost a character with them); nor
 * behind other activations (a HardSwish): rec's squeeze-excitations there,
 * quantized, cost its held-out line a character too. */
static int conv_map(const es_quantizer *q, const char *name, int depth) {
  int p = depth > 8 ? -1 : smap_get(&q->prod_map, name);
  if (p < 0)
    return 0;
  const qz_node *qn = &q->nodes[p];
  const Onnx__NodeProto *n = q->g->node[p];
  if (qn->quant && (qn->kind == QK_CONV || qn->kind == QK_CONVT || qn->kind == QK_ADD ||
                    qn->kind == QK_CONCAT || qn->kind == QK_MUL))
    return 1;
  if ((is_op(n, "Relu") || is_op(n, "Clip") || is_op(n, "Resize") || is_op(n, "Upsample") ||
       is_op(n, "MaxPool")) && n->n_input >= 1)
    return conv_map(q, n->input[0], depth + 1);
  return 0;
}

static int classify(es_quantizer *q) {
  Onnx__GraphProto *g = q->g;
  smap near = {0};
  if (near_outputs(q, &near) < 0) {
    smap_free(&near);
    return ES_ENOMEM;
  }
  for (size_t i = 0; i < q->n_nodes; i++) {
    qz_node *qn = &q->nodes[i];
    Onnx__NodeProto *n = g->node[i];
    qn->act = -1;
    qn->w_axis = -1;
    if (qn->removed || n->n_output != 1)
      continue;
    qkind k = QK_NONE;
    if (is_op(n, "Conv") && n->n_input >= 2 && is_activation(q, n->input[0]) &&
        weight_ok(q, n->input[1], 3, 5) &&
        (n->n_input < 3 || !n->input[2][0] || weight_ok(q, n->input[2], 1, 1))) {
      k = QK_CONV;
      qn->w_axis = 0;
      qn->n_act = 1;
    } else if (is_op(n, "ConvTranspose") && n->n_input >= 2 && is_activation(q, n->input[0]) &&
               weight_ok(q, n->input[1], 3, 5) &&
               (n->n_input < 3 || !n->input[2][0] || weight_ok(q, n->input[2], 1, 1))) {
      k = QK_CONVT;
      qn->w_axis = attr_int(n, "group", 1) == 1 ? 1 : -1;
      qn->n_act = 1;
    } else if (is_op(n, "MatMul") && n->n_input == 2 && is_activation(q, n->input[0])) {
      if (weight_ok(q, n->input[1], 2, 2)) {
        k = QK_MATMUL;
        qn->w_axis = 1;
        qn->n_act = 1;
      } else if (is_activation(q, n->input[1])) {
        k = QK_MATMUL;
        qn->n_act = 2;
      }
    } else if (is_op(n, "Gemm") && n->n_input >= 2 && is_activation(q, n->input[0]) &&
               attr_float(n, "alpha", 1) == 1 && attr_float(n, "beta", 1) == 1 &&
               !attr_int(n, "transA", 0) && weight_ok(q, n->input[1], 2, 2) &&
               (n->n_input < 3 || !n->input[2][0] || weight_ok(q, n->input[2], 1, 1))) {
      k = QK_GEMM;
      qn->w_axis = attr_int(n, "transB", 0) ? 0 : 1;
      qn->n_act = 1;
    } else if (is_op(n, "Add") && n->n_input == 2 && conv_map(q, n->input[0], 0) &&
               conv_map(q, n->input[1], 0) && strcmp(n->input[0], n->input[1])) {
      k = QK_ADD;
      qn->n_act = 2;
    } else if (is_op(n, "Mul") && n->n_input == 2 && is_activation(q, n->input[0]) &&
               is_activation(q, n->input[1]) && !derived_from(q, n->input[1], n->input[0], 0) &&
               !derived_from(q, n->input[0], n->input[1], 0) &&
               (conv_map(q, n->input[0], 0) || conv_map(q, n->input[1], 0))) {
      k = QK_MUL; /* a map scaled per channel (squeeze-excitation) or gated */
      qn->n_act = 2;
    } else if ((is_op(n, "GlobalAveragePool") || is_op(n, "AveragePool")) && n->n_input == 1 &&
               conv_map(q, n->input[0], 0)) {
      k = QK_GAP;
      qn->n_act = 1;
    } else if (is_op(n, "Concat") && n->n_input >= 2 && n->n_input <= 16) {
      k = QK_CONCAT;
      for (size_t j = 0; j < n->n_input && k; j++) {
        if (!conv_map(q, n->input[j], 0))
          k = QK_NONE;
        for (size_t l = 0; l < j && k; l++)
          if (!strcmp(n->input[j], n->input[l]))
            k = QK_NONE;
      }
      qn->n_act = (int)n->n_input;
    }
    if (k == QK_NONE)
      continue;
    if (excluded(q, n)) {
      q->st.nodes_excluded++;
      continue;
    }
    qn->kind = k;
    qn->quant = 1;
    if (smap_get(&near, n->output[0]) > 0) {
      if (k >= QK_ADD) { /* no weights: nothing to gain with a float output */
        qn->quant = 0;
        continue;
      }
      qn->out_float = 1;
      continue;
    }
    /* A Relu or Clip(0, max) that alone reads the output: its range is the
     * quantized output's, and the quantizer's saturation does its work. */
    const char *out = n->output[0];
    int c = q->has_subgraphs || is_graph_output(q, out) ? -1 : sole_consumer(q, out);
    if (c < 0 || excluded(q, g->node[c]))
      continue;
    Onnx__NodeProto *a = g->node[c];
    if (is_op(a, "Relu") && a->n_output == 1) {
      qn->act = c;
      qn->act_max = INFINITY;
    } else if (is_op(a, "Clip") && a->n_output == 1) {
      double lo = -INFINITY, hi = INFINITY;
      int64_t cnt;
      float *v;
      if (q->opset < 11) {
        lo = attr_float(a, "min", -FLT_MAX);
        hi = attr_float(a, "max", FLT_MAX);
      } else {
        if (a->n_input > 1 && a->input[1][0]) {
          if (!(v = tp_floats(q, init_of(q, a->input[1]), &cnt)) || cnt != 1)
            continue;
          lo = v[0];
        }
        if (a->n_input > 2 && a->input[2][0]) {
          if (!(v = tp_floats(q, init_of(q, a->input[2]), &cnt)) || cnt != 1)
            continue;
          hi = v[0];
        }
      }
      if (lo != 0)
        continue;
      qn->act = c;
      qn->act_max = hi >= FLT_MAX ? INFINITY : hi;
    }
  }
  smap_free(&near);
  return 0;
}


static const char *quant_out_name(const es_quantizer *q, size_t i) {
  const qz_node *qn = &q->nodes[i];
  return qn->act >= 0 ? q->g->node[qn->act]->output[0] : q->g->node[i]->output[0];
}

static int obs_add(es_quantizer *q, const char *name) {
  if (smap_get(&q->obs_map, name) >= 0)
    return 0;
  if (q->n_obs == q->cap_obs) {
    int cap = q->cap_obs ? q->cap_obs * 2 : 64;
    qz_obs *o = q->obs ? es_mem_realloc(q->obs, (size_t)cap * sizeof *o)
                       : es_mem_alloc(ES_MEM_ENGINE, (size_t)cap * sizeof *o);
    if (!o)
      return ES_ENOMEM;
    q->obs = o;
    q->cap_obs = cap;
  }
  qz_obs *o = &q->obs[q->n_obs];
  memset(o, 0, sizeof *o);
  o->name = name;
  o->out_index = o->in_index = -1;
  o->rank = -1;
  if (q->opt.method != ES_QUANT_MINMAX &&
      !(o->hist = es_mem_calloc(ES_MEM_ENGINE, QZ_BINS, sizeof *o->hist)))
    return ES_ENOMEM;
  if (smap_set(&q->obs_map, name, q->n_obs) < 0) {
    es_mem_free(o->hist);
    return ES_ENOMEM;
  }
  q->n_obs++;
  return 0;
}

static int choose_observed(es_quantizer *q) {
  int rc = 0;
  for (size_t i = 0; i < q->n_nodes && rc == 0; i++) {
    const qz_node *qn = &q->nodes[i];
    const Onnx__NodeProto *n = q->g->node[i];
    if (qn->quant) {
      for (int k = 0; k < qn->n_act && rc == 0; k++)
        rc = obs_add(q, n->input[k]);
      if (rc == 0 && !qn->out_float)
        rc = obs_add(q, quant_out_name(q, i));
    } else if (!qn->removed && q->opset < QZ_OPSET && n->n_input > 0 &&
               (is_op(n, "Softmax") || is_op(n, "LogSoftmax") || is_op(n, "Hardmax")) &&
               is_activation(q, n->input[0])) {
      rc = obs_add(q, n->input[0]); /* its rank decides how it is raised to opset 13 */
    }
  }
  return rc < 0 ? es__fail(ES_ENOMEM, "quantize: out of memory") : 0;
}

/* The tree with every observed tensor as a graph output, loaded. */
static int load_calibration(es_quantizer *q) {
  static const Onnx__ValueInfoProto vinit = ONNX__VALUE_INFO_PROTO__INIT;
  static const Onnx__TypeProto tinit = ONNX__TYPE_PROTO__INIT;
  static const Onnx__TypeProto__Tensor ttinit = ONNX__TYPE_PROTO__TENSOR__INIT;
  Onnx__GraphProto *g = q->g;
  size_t n_out0 = g->n_output;
  Onnx__ValueInfoProto **outs0 = g->output;
  Onnx__ValueInfoProto **outs = qz_alloc(q, (n_out0 + (size_t)q->n_obs) * sizeof *outs);
  if (!outs)
    return es__fail(ES_ENOMEM, "quantize: out of memory");
  memcpy(outs, outs0, n_out0 * sizeof *outs);
  size_t n = n_out0;
  for (int k = 0; k < q->n_obs; k++) {
    qz_obs *o = &q->obs[k];
    if ((o->in_index = graph_input_index(q, o->name)) >= 0 || is_graph_output(q, o->name))
      continue;
    Onnx__ValueInfoProto *v = qz_alloc(q, sizeof *v);
    Onnx__TypeProto *t = qz_alloc(q, sizeof *t);
    Onnx__TypeProto__Tensor *tt = qz_alloc(q, sizeof *tt);
    if (!v || !t || !tt)
      return es__fail(ES_ENOMEM, "quantize: out of memory");
    *v = vinit;
    *t = tinit;
    *tt = ttinit;
    tt->has_elem_type = 1;
    tt->elem_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
    t->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    t->tensor_type = tt;
    v->name = (char *)o->name;
    v->type = t;
    outs[n++] = v;
  }
  /* Removed nodes (folded BatchNormalization) leave the list for the pack. */
  Onnx__NodeProto **nodes0 = g->node;
  size_t n_nodes0 = g->n_node;
  Onnx__NodeProto **live = qz_alloc(q, (n_nodes0 ? n_nodes0 : 1) * sizeof *live);
  if (!live)
    return es__fail(ES_ENOMEM, "quantize: out of memory");
  size_t nl = 0;
  for (size_t i = 0; i < n_nodes0; i++)
    if (!q->nodes[i].removed)
      live[nl++] = nodes0[i];
  g->node = live;
  g->n_node = nl;
  g->output = outs;
  g->n_output = n;
  size_t size = onnx__model_proto__get_packed_size(q->mp);
  uint8_t *buf = es_mem_alloc(ES_MEM_ENGINE, size ? size : 1);
  int rc = buf ? 0 : es__fail(ES_ENOMEM, "quantize: out of memory packing the model");
  if (buf) {
    onnx__model_proto__pack(q->mp, buf);
    rc = es_model_load_buffer(buf, size, NULL, &q->calib);
    es_mem_free(buf);
  }
  g->node = nodes0;
  g->n_node = n_nodes0;
  g->output = outs0;
  g->n_output = n_out0;
  if (rc < 0)
    return rc;
  int no = es_model_output_count(q->calib);
  for (int i = 0; i < no; i++) {
    es_tensor_info ti;
    if (es_model_output_info(q->calib, i, &ti) < 0)
      continue;
    int k = smap_get(&q->obs_map, ti.name);
    if (k >= 0)
      q->obs[k].out_index = i;
  }
  for (int k = 0; k < q->n_obs; k++)
    if (q->obs[k].out_index < 0 && q->obs[k].in_index < 0)
      return es__fail(ES_EMODEL, "quantize: tensor '%s' is not an output of the calibration model",
                      q->obs[k].name);
  return es_plan_cache_create(q->calib, 4, &q->cache);
}

/* Whether write searches for the nodes to keep in float. */
static int searching(const es_quant_options *o) { return o->target_db > 0 || o->judge; }

void es_quant_options_default(es_quant_options *o) {
  memset(o, 0, sizeof *o);
  o->method = ES_QUANT_MINMAX;
  o->percentile = 99.999;
  o->eval_samples = 4;
}

int es_quantizer_create(const void *onnx, size_t size, const es_quant_options *o,
                        es_quantizer **out) {
  if (!onnx || !out)
    return es__fail(ES_EINVAL, "es_quantizer_create: NULL argument");
  *out = NULL;
  es_quant_options def;
  if (!o) {
    es_quant_options_default(&def);
    o = &def;
  }
  if (o->method != ES_QUANT_MINMAX && o->method != ES_QUANT_PERCENTILE && o->method != ES_QUANT_MSE)
    return es__fail(ES_EINVAL, "quantize: unknown calibration method %d", (int)o->method);
  if (o->target_db < 0 || o->target_db > 200 || o->eval_samples < 0 || o->eval_samples > 64)
    return es__fail(ES_EINVAL, "quantize: target_db %g is not in [0, 200] or eval_samples %d not in "
                    "[0, 64]", o->target_db, o->eval_samples);
  if (o->method == ES_QUANT_PERCENTILE && !(o->percentile > 50 && o->percentile <= 100))
    return es__fail(ES_EINVAL, "quantize: percentile %g is not in (50, 100]", o->percentile);
  if (o->rounding != ES_QUANT_ROUND_NEAREST && o->rounding != ES_QUANT_ROUND_GPTQ)
    return es__fail(ES_EINVAL, "quantize: unknown rounding %d", (int)o->rounding);
  if (o->rounding == ES_QUANT_ROUND_GPTQ && (!searching(o) || o->keep_float_weights))
    return es__fail(ES_EINVAL, "quantize: gptq rounding is for weight-only Convs, which only the "
                    "accuracy search makes (a target_db or a judge, without keep_float_weights)");
  /* The engine's loader checks the model first: a malformed one gets its
   * error naming the node, and what the engine cannot run is refused. */
  es_model *src;
  int rc = es_model_load_buffer(onnx, size, NULL, &src);
  if (rc < 0)
    return rc;
  es_model_stats ms;
  es_model_stats_get(src, &ms);
  es_model_release(src);
  es_quantizer *q = es_mem_calloc(ES_MEM_ENGINE, 1, sizeof *q);
  if (!q)
    return es__fail(ES_ENOMEM, "quantize: out of memory");
  q->opt = *o;
  void *tree;
  if ((rc = es__onnx_unpack(onnx, size, &q->ctx, &tree)) < 0)
    goto fail;
  q->mp = tree;
  q->g = q->mp->graph;
  q->opset = ms.opset;
  q->st.opset_from = ms.opset;
  q->st.opset_to = ms.opset < QZ_OPSET ? QZ_OPSET : ms.opset;
  if (q->opt.n_exclude > 0) {
    const char **ex = qz_alloc(q, (size_t)q->opt.n_exclude * sizeof *ex);
    if (!ex) {
      rc = es__fail(ES_ENOMEM, "quantize: out of memory");
      goto fail;
    }
    for (int i = 0; i < q->opt.n_exclude; i++)
      ex[i] = o->exclude[i] ? qz_strdup(q, o->exclude[i]) : NULL;
    q->opt.exclude = ex;
  }
  q->n_nodes = q->g->n_node;
  q->nodes = es_mem_calloc(ES_MEM_ENGINE, q->n_nodes ? q->n_nodes : 1, sizeof *q->nodes);
  if (!q->nodes) {
    rc = es__fail(ES_ENOMEM, "quantize: out of memory");
    goto fail;
  }
  for (size_t i = 0; i < q->g->n_initializer; i++)
    if (q->g->initializer[i]->name &&
        ((rc = smap_set(&q->init_map, q->g->initializer[i]->name, (int)i)) < 0 ||
         (rc = smap_set(&q->names, q->g->initializer[i]->name, 1)) < 0))
      goto fail;
  if ((rc = index_graph(q)) < 0 || (rc = constants_to_initializers(q)) < 0 ||
      (rc = fold_bn(q)) < 0)
    goto fail;
  if ((rc = classify(q)) < 0)
    goto fail;
  if ((rc = choose_observed(q)) < 0 || (rc = load_calibration(q)) < 0)
    goto fail;
  for (size_t i = 0; i < q->n_nodes; i++) {
    q->st.nodes_quantized += q->nodes[i].quant;
    q->st.activations_folded += q->nodes[i].act >= 0;
  }
  q->st.tensors_observed = q->n_obs;
  q->n_out0 = (int)q->g->n_output;
  q->pristine_size = onnx__model_proto__get_packed_size(q->mp);
  q->pristine = es_mem_alloc(ES_MEM_ENGINE, q->pristine_size ? q->pristine_size : 1);
  q->nodes0 = es_mem_alloc(ES_MEM_ENGINE, (q->n_nodes ? q->n_nodes : 1) * sizeof *q->nodes0);
  if (searching(&q->opt) && q->opt.eval_samples > 0)
    q->keep = es_mem_calloc(ES_MEM_ENGINE, (size_t)q->opt.eval_samples, sizeof *q->keep);
  if (!q->pristine || !q->nodes0 || (searching(&q->opt) && q->opt.eval_samples > 0 && !q->keep)) {
    rc = es__fail(ES_ENOMEM, "quantize: out of memory");
    goto fail;
  }
  onnx__model_proto__pack(q->mp, q->pristine);
  memcpy(q->nodes0, q->nodes, q->n_nodes * sizeof *q->nodes);
  q->st0 = q->st;
  q->opset0 = q->opset;
  *out = q;
  return 0;
fail:
  es_quantizer_destroy(q);
  return rc == ES_ENOMEM ? es__fail(ES_ENOMEM, "quantize: out of memory") : rc;
}

es_model *es_quantizer_model(const es_quantizer *q) { return q ? q->calib : NULL; }

void es_quantizer_destroy(es_quantizer *q) {
  if (!q)
    return;
  es_plan_cache_destroy(q->cache);
  es_model_release(q->calib);
  es_arena_destroy(q->arena);
  for (int k = 0; k < q->n_obs; k++)
    es_mem_free(q->obs[k].hist);
  es_mem_free(q->obs);
  if (q->taps)
    for (size_t i = 0; i < q->n_nodes; i++) {
      es_mem_free(q->taps[i].sum);
      es_mem_free(q->taps[i].h);
      es_mem_free(q->taps[i].qw);
    }
  es_mem_free(q->taps);
  es_mem_free(q->nodes);
  es_mem_free(q->nodes0);
  es_mem_free(q->pristine);
  for (int k = 0; k < q->n_keep; k++)
    for (int i = 0; i < 16; i++) {
      es_mem_free(q->keep[k].in[i].data);
      es_mem_free(q->keep[k].ref[i].data);
    }
  es_mem_free(q->keep);
  smap_free(&q->obs_map);
  smap_free(&q->init_map);
  smap_free(&q->prod_map);
  smap_free(&q->cons_n);
  smap_free(&q->names);
  es__ctx_free_all(&q->ctx);
  es_mem_free(q);
}

int es_quantizer_stats(const es_quantizer *q, es_quant_stats *out) {
  if (!q || !out)
    return es__fail(ES_EINVAL, "es_quantizer_stats: NULL argument");
  *out = q->st;
  return 0;
}

/* ==========================================================================
 * Stage 2: calibration
 * ======================================================================== */

/* Widens o's histogram (doubling its width, bins merged in pairs) until
 * [lo, hi] fits. */
static void hist_cover(qz_obs *o, double lo, double hi) {
  if (o->hw <= 0) {
    o->hlo = lo;
    o->hw = hi > lo ? (hi - lo) * (1 + 1e-6) : fmax(fabs(lo), 1.0) * 1e-6;
    return;
  }
  int guard = 0;
  while ((lo < o->hlo || hi >= o->hlo + o->hw) && guard++ < 2048) {
    uint64_t *h = o->hist;
    if (hi >= o->hlo + o->hw) { /* grow upward: lower half holds the old range */
      for (int i = 0; i < QZ_BINS / 2; i++)
        h[i] = h[2 * i] + h[2 * i + 1];
      memset(h + QZ_BINS / 2, 0, QZ_BINS / 2 * sizeof *h);
    } else { /* grow downward: upper half holds the old range */
      for (int i = QZ_BINS / 2 - 1; i >= 0; i--)
        h[QZ_BINS / 2 + i] = h[2 * i] + h[2 * i + 1];
      memset(h, 0, QZ_BINS / 2 * sizeof *h);
      o->hlo -= o->hw;
    }
    o->hw *= 2;
  }
}

static void obs_update(es_quantizer *q, qz_obs *o, const es_tensor *t) {
  (void)q;
  if (t->dtype != ES_DTYPE_FLOAT) {
    o->bad = 1;
    return;
  }
  o->rank = t->rank;
  size_t n = t->nbytes / 4;
  const float *v = t->data;
  double lo = INFINITY, hi = -INFINITY;
  for (size_t i = 0; i < n; i++) {
    float x = v[i];
    if (x < lo)
      lo = x;
    if (x > hi)
      hi = x;
  }
  if (!(lo <= hi)) /* empty, or NaN only */
    return;
  if (isinf(lo) || isinf(hi)) {
    o->bad = 1; /* an infinite value has no quantized form */
    return;
  }
  o->lo = o->seen ? fmin(o->lo, lo) : lo;
  o->hi = o->seen ? fmax(o->hi, hi) : hi;
  o->seen = 1;
  o->count += n;
  if (!o->hist)
    return;
  hist_cover(o, lo, hi);
  double k = QZ_BINS / o->hw;
  for (size_t i = 0; i < n; i++) {
    double x = v[i];
    if (x != x)
      continue;
    long b = (long)((x - o->hlo) * k);
    o->hist[b < 0 ? 0 : b >= QZ_BINS ? QZ_BINS - 1 : b]++;
  }
}

static int tensor_copy(es_tensor *dst, const es_tensor *src) {
  *dst = *src;
  dst->data = es_mem_alloc(ES_MEM_ENGINE, src->nbytes ? src->nbytes : 1);
  if (!dst->data)
    return ES_ENOMEM;
  memcpy(dst->data, src->data, src->nbytes);
  return 0;
}

/* A copy of a sample's inputs and FP32 outputs, for the accuracy search;
 * a sample that does not fit in memory is just not kept. */
static void keep_sample(es_quantizer *q, const es_tensor *in, int n_in, const es_tensor *out,
                        int n_out) {
  qz_sample *k = &q->keep[q->n_keep];
  int ok = n_out <= 16;
  for (int i = 0; ok && i < n_in; i++)
    ok = tensor_copy(&k->in[i], &in[i]) == 0;
  for (int i = 0; ok && i < n_out; i++)
    ok = tensor_copy(&k->ref[i], &out[i]) == 0;
  if (!ok) {
    for (int i = 0; i < 16; i++) {
      es_mem_free(k->in[i].data);
      es_mem_free(k->ref[i].data);
    }
    memset(k, 0, sizeof *k);
    return;
  }
  k->n_in = n_in;
  k->n_ref = n_out;
  q->n_keep++;
}

/* A 2-D Conv's geometry for input x [N, C, H, W] and weights [M, C/g,
 * KH, KW]: strides, dilations, begin pads and output size per axis. 0
 * when it is one the correction takes (plain NOTSET pads, or auto_pad). */
static int conv2d_geometry(const Onnx__NodeProto *n, const int64_t *x, const int64_t *w,
                           int64_t st[2], int64_t dl[2], int64_t pb[2], int64_t out[2]) {
  const Onnx__AttributeProto *a;
  const char *ap = "NOTSET";
  char apbuf[16];
  if ((a = attr_find(n, "auto_pad")) && a->has_s && a->s.len < sizeof apbuf) {
    memcpy(apbuf, a->s.data, a->s.len);
    apbuf[a->s.len] = 0;
    ap = apbuf;
  }
  for (int d = 0; d < 2; d++) {
    st[d] = dl[d] = 1;
    pb[d] = 0;
  }
  int64_t pe[2] = {0, 0};
  if ((a = attr_find(n, "strides")) && a->n_ints == 2)
    st[0] = a->ints[0], st[1] = a->ints[1];
  if ((a = attr_find(n, "dilations")) && a->n_ints == 2)
    dl[0] = a->ints[0], dl[1] = a->ints[1];
  if ((a = attr_find(n, "pads")) && a->n_ints == 4)
    pb[0] = a->ints[0], pb[1] = a->ints[1], pe[0] = a->ints[2], pe[1] = a->ints[3];
  for (int d = 0; d < 2; d++) {
    int64_t in = x[2 + d], ext = (w[2 + d] - 1) * dl[d] + 1;
    if (st[d] < 1 || dl[d] < 1 || pb[d] < 0 || pe[d] < 0 || in < 1)
      return -1;
    if (!strcmp(ap, "SAME_UPPER") || !strcmp(ap, "SAME_LOWER")) {
      out[d] = (in + st[d] - 1) / st[d];
      int64_t total = (out[d] - 1) * st[d] + ext - in;
      total = total > 0 ? total : 0;
      pb[d] = !strcmp(ap, "SAME_UPPER") ? total / 2 : total - total / 2;
    } else if (!strcmp(ap, "VALID") || !strcmp(ap, "NOTSET")) {
      if (ap[0] == 'V')
        pb[d] = pe[d] = 0;
      if (in + pb[d] + pe[d] < ext)
        return -1;
      out[d] = (in + pb[d] + pe[d] - ext) / st[d] + 1;
    } else {
      return -1;
    }
  }
  return 0;
}

/* First output position o in [0, n) whose tap reads a row inside [0, in):
 * o * st + off >= 0; and one past the last. */
static void tap_range(int64_t n, int64_t in, int64_t st, int64_t off, int64_t *lo, int64_t *hi) {
  int64_t a = off >= 0 ? 0 : (-off + st - 1) / st;
  int64_t b = in - 1 - off < 0 ? 0 : (in - 1 - off) / st + 1;
  *lo = a;
  *hi = b < n ? b : n;
  if (*hi < *lo)
    *hi = *lo;
}

/* Adds sample x (a 2-D Conv's input, g groups) to the second moments of
 * the patches its output positions read (qz_taps.h): positions evenly
 * strided, as many per sample as QZ_GPTQ_* allow. ES_ENOMEM. */
static int moments_update(qz_taps *t, const es_tensor *x, int64_t g, const int64_t st[2],
                          const int64_t dl[2], const int64_t pb[2], const int64_t out[2]) {
  int64_t cg = t->c / g, kh = t->kh, kw = t->kw, dg = cg * kh * kw;
  if (dg > QZ_GPTQ_MAX_D)
    return 0;
  if (!t->h) {
    if (!(t->h = es_mem_calloc(ES_MEM_ENGINE, (size_t)(g * dg * dg), sizeof *t->h)))
      return ES_ENOMEM;
    t->g = g, t->dg = dg;
  } else if (t->g != g || t->dg != dg) {
    return 0;
  }
  float *p = es_mem_alloc(ES_MEM_ENGINE, (size_t)dg * sizeof *p);
  if (!p)
    return ES_ENOMEM;
  int64_t h = x->dims[2], w = x->dims[3], npos = out[0] * out[1];
  int64_t most = QZ_GPTQ_WORK / (g * dg * dg / 2 + 1);
  most = most > QZ_GPTQ_POSITIONS ? QZ_GPTQ_POSITIONS : most < 64 ? 64 : most;
  int64_t step = (npos + most - 1) / most;
  int64_t taken = (npos + step - 1) / step;
  double per = 1.0 / ((double)x->dims[0] * (double)taken);
  const float *xv = x->data;
  for (int64_t b = 0; b < x->dims[0]; b++)
    for (int64_t pos = 0; pos < npos; pos += step) {
      int64_t r = pos / out[1], cc = pos % out[1];
      for (int64_t gi = 0; gi < g; gi++) {
        for (int64_t ic = 0; ic < cg; ic++) {
          const float *plane = xv + (b * t->c + gi * cg + ic) * h * w;
          for (int64_t u = 0; u < kh; u++) {
            int64_t y = r * st[0] + u * dl[0] - pb[0];
            for (int64_t v = 0; v < kw; v++) {
              int64_t xx = cc * st[1] + v * dl[1] - pb[1];
              int inside = y >= 0 && y < h && xx >= 0 && xx < w;
              p[(ic * kh + u) * kw + v] = inside ? plane[y * w + xx] : 0.0f;
            }
          }
        }
        double *hg = t->h + gi * dg * dg;
        for (int64_t j = 0; j < dg; j++) {
          if (p[j] == 0.0f)
            continue;
          double pj = (double)p[j] * per, *row = hg + j * dg;
          for (int64_t k = j; k < dg; k++)
            row[k] += pj * (double)p[k];
        }
      }
    }
  es_mem_free(p);
  return 0;
}

/* Adds sample x (the input of 2-D Conv i) to its tap means (and, for
 * error-feedback rounding, its patches' second moments). */
static int taps_update(es_quantizer *q, size_t i, const es_tensor *x) {
  const Onnx__NodeProto *n = q->g->node[i];
  const Onnx__TensorProto *wt = n->n_input > 1 ? init_of(q, n->input[1]) : NULL;
  int64_t g = attr_int(n, "group", 1), st[2], dl[2], pb[2], out[2];
  if (!wt || wt->n_dims != 4 || x->rank != 4 || x->dtype != ES_DTYPE_FLOAT || g < 1 ||
      x->dims[1] != wt->dims[1] * g || x->dims[0] < 1 ||
      conv2d_geometry(n, x->dims, wt->dims, st, dl, pb, out) < 0)
    return 0;
  if (!q->taps && !(q->taps = es_mem_calloc(ES_MEM_ENGINE, q->n_nodes, sizeof *q->taps)))
    return es__fail(ES_ENOMEM, "quantize: out of memory");
  qz_taps *t = &q->taps[i];
  int64_t c = x->dims[1], kh = wt->dims[2], kw = wt->dims[3], h = x->dims[2], w = x->dims[3];
  if (!t->sum) {
    if (!(t->sum = es_mem_calloc(ES_MEM_ENGINE, (size_t)(c * kh * kw), sizeof *t->sum)))
      return es__fail(ES_ENOMEM, "quantize: out of memory");
    t->c = c, t->kh = kh, t->kw = kw;
  } else if (t->c != c || t->kh != kh || t->kw != kw) {
    return 0;
  }
  const float *xv = x->data;
  double per = 1.0 / ((double)x->dims[0] * (double)out[0] * (double)out[1]);
  for (int64_t b = 0; b < x->dims[0]; b++)
    for (int64_t ic = 0; ic < c; ic++) {
      const float *plane = xv + (b * c + ic) * h * w;
      for (int64_t u = 0; u < kh; u++) {
        int64_t r0, r1;
        tap_range(out[0], h, st[0], u * dl[0] - pb[0], &r0, &r1);
        for (int64_t v = 0; v < kw; v++) {
          int64_t c0, c1;
          tap_range(out[1], w, st[1], v * dl[1] - pb[1], &c0, &c1);
          double sum = 0;
          for (int64_t r = r0; r < r1; r++) {
            const float *row = plane + (r * st[0] + u * dl[0] - pb[0]) * w;
            for (int64_t cc = c0; cc < c1; cc++)
              sum += row[cc * st[1] + v * dl[1] - pb[1]];
          }
          t->sum[(ic * kh + u) * kw + v] += sum * per;
        }
      }
    }
  if (q->opt.rounding == ES_QUANT_ROUND_GPTQ && moments_update(t, x, g, st, dl, pb, out) < 0)
    return es__fail(ES_ENOMEM, "quantize: out of memory");
  t->n++;
  return 0;
}

int es_quantizer_observe(es_quantizer *q, const es_tensor *inputs, int n_in) {
  if (!q || (!inputs && n_in))
    return es__fail(ES_EINVAL, "es_quantizer_observe: NULL argument");
  if (q->written)
    return es__fail(ES_ESTATE, "es_quantizer_observe: the model was written already");
  int nm = es_model_input_count(q->calib);
  if (n_in != nm)
    return es__fail(ES_EINVAL, "quantize: the model has %d inputs, %d given", nm, n_in);
  es_tensor_info shapes[16];
  if (n_in > 16)
    return es__fail(ES_ENOTSUP, "quantize: models of more than 16 inputs are not supported");
  for (int i = 0; i < n_in; i++) {
    es_model_input_info(q->calib, i, &shapes[i]);
    shapes[i].dtype = inputs[i].dtype;
    shapes[i].rank = inputs[i].rank;
    memcpy(shapes[i].dims, inputs[i].dims, sizeof shapes[i].dims);
  }
  es_plan *p;
  int rc = es_plan_cache_get(q->cache, shapes, n_in, &p);
  if (rc < 0)
    return rc;
  size_t need = es_plan_arena_bytes(p);
  if (need > q->arena_cap || !q->arena) {
    es_arena_destroy(q->arena);
    q->arena = NULL;
    q->arena_cap = 0;
    if ((rc = es_arena_create(need ? need : 64, 64, &q->arena)) < 0) {
      es_plan_release(p);
      return rc;
    }
    q->arena_cap = need;
  }
  int no = es_plan_output_count(p);
  es_tensor *outs = es_mem_calloc(ES_MEM_ENGINE, (size_t)(no ? no : 1), sizeof *outs);
  if (!outs) {
    es_plan_release(p);
    return es__fail(ES_ENOMEM, "quantize: out of memory");
  }
  es_mem_heap hs = {0};
  es_run_heap heap = es_mem_heap_make(&hs);
  es_arena_reset(q->arena);
  rc = es_plan_run_heap(p, inputs, n_in, q->arena, &heap, outs, no);
  if (rc == 0) {
    for (int k = 0; k < q->n_obs; k++) {
      qz_obs *o = &q->obs[k];
      obs_update(q, o, o->in_index >= 0 ? &inputs[o->in_index] : &outs[o->out_index]);
    }
    /* tap means (and moments): for the Convs a correction or error-feedback
     * rounding may be asked of (weight-only ones come only from the
     * search) */
    int taps = q->opt.bias_correction == ES_QUANT_BC_ALL ||
               q->opt.rounding == ES_QUANT_ROUND_GPTQ ||
               (q->opt.bias_correction == ES_QUANT_BC_WEIGHTS && !q->opt.keep_float_weights &&
                searching(&q->opt));
    for (size_t i = 0; taps && i < q->n_nodes && rc == 0; i++) {
      int k = q->nodes[i].kind == QK_CONV && q->nodes[i].quant
                  ? smap_get(&q->obs_map, q->g->node[i]->input[0])
                  : -1;
      if (k >= 0)
        rc = taps_update(q, i, q->obs[k].in_index >= 0 ? &inputs[q->obs[k].in_index]
                                                        : &outs[q->obs[k].out_index]);
    }
    if (q->keep && q->n_keep < q->opt.eval_samples && n_in <= 16)
      keep_sample(q, inputs, n_in, outs, no < q->n_out0 ? no : q->n_out0);
    q->st.samples++;
    es_plan_outputs_free(p, &heap, outs, no);
  }
  es_mem_free(outs);
  es_arena_reset(q->arena);
  es_plan_release(p);
  return rc;
}

/* ==========================================================================
 * Stage 3: write
 * ======================================================================== */

/* ---- opset 13 ------------------------------------------------------------ */

/* Operators whose meaning (for inference) did not change between opset 7
 * and 13, or changed only by accepting more (types, negative axes). */
static const char *const same_to_13[] = {
    "Abs", "Acos", "Acosh", "Add", "And", "ArgMax", "ArgMin", "Asin", "Asinh", "Atan", "Atanh",
    "AveragePool", "BatchNormalization", "Cast", "Ceil", "Concat", "Constant", "ConstantOfShape",
    "Conv", "ConvTranspose", "Cos", "Cosh", "CumSum", "DepthToSpace", "Div", "Einsum", "Elu",
    "Equal", "Erf", "Exp", "Expand", "Flatten", "Floor", "Gather", "GatherElements", "GatherND",
    "Gemm", "GlobalAveragePool", "GlobalMaxPool", "Greater", "HardSigmoid", "Identity",
    "InstanceNormalization", "LRN", "LeakyRelu", "Less", "Log", "MatMul", "Max", "MaxPool", "Mean",
    "Min", "Mul", "Neg", "NonZero", "Not", "OneHot", "Or", "PRelu", "Pow", "Range", "Reciprocal",
    "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean",
    "ReduceMin", "ReduceProd", "ReduceSumSquare", "Relu", "Reshape", "Round", "ScatterND", "Selu",
    "Shape", "Sigmoid", "Sign", "Sin", "Sinh", "Size", "Softplus", "Softsign", "SpaceToDepth",
    "Sqrt", "Sub", "Sum", "Tan", "Tanh", "Tile", "Transpose", "Where", "Xor", NULL};

/* Input pos of n set to name, the inputs before it that n lacks left
 * empty (omitted). */
static int set_input(es_quantizer *q, Onnx__NodeProto *n, size_t pos, const char *name) {
  size_t ni = n->n_input > pos + 1 ? n->n_input : pos + 1;
  char **ins = qz_alloc(q, ni * sizeof *ins);
  if (!ins)
    return ES_ENOMEM;
  for (size_t i = 0; i < ni; i++)
    ins[i] = i < n->n_input ? n->input[i] : (char *)"";
  ins[pos] = (char *)name;
  n->input = ins;
  n->n_input = ni;
  return 0;
}

/* An attribute of ints moved to an int64 input at position pos. */
static int ints_to_input(es_quantizer *q, Onnx__NodeProto *n, const char *attr, size_t pos) {
  Onnx__AttributeProto *a = attr_find(n, attr);
  const char *name = "";
  if (a) {
    name = init_int64s(q, n->name && n->name[0] ? n->name : n->output[0], attr, a->ints,
                       (int64_t)a->n_ints);
    if (!name)
      return ES_ENOMEM;
    attr_drop(n, attr);
  }
  if (!a && n->n_input <= pos)
    return 0;
  return set_input(q, n, pos, name);
}

static int float_to_input(es_quantizer *q, Onnx__NodeProto *n, const char *attr, size_t pos,
                          int keep_empty) {
  Onnx__AttributeProto *a = attr_find(n, attr);
  const char *name = "";
  if (a && a->has_f) {
    float v = a->f;
    name = init_floats(q, n->name && n->name[0] ? n->name : n->output[0], attr, 0, NULL, &v, 1);
    if (!name)
      return ES_ENOMEM;
  }
  attr_drop(n, attr);
  if (!name[0] && !keep_empty)
    return 0;
  return set_input(q, n, pos, name);
}

static int raise_opset(es_quantizer *q) {
  if (q->opset >= QZ_OPSET)
    return 0;
  Onnx__GraphProto *g = q->g;
  for (size_t i = 0; i < q->n_nodes; i++) {
    Onnx__NodeProto *n = g->node[i];
    if (q->nodes[i].removed || (n->domain && n->domain[0] && strcmp(n->domain, "ai.onnx")))
      continue;
    const char *op = n->op_type ? n->op_type : "";
    char label[256];
    snprintf(label, sizeof label, "%s (%s)", n->name && n->name[0] ? n->name : n->output[0], op);
    int rc = 0;
    if (!strcmp(op, "Clip")) {
      if (q->opset < 11 && ((rc = float_to_input(q, n, "min", 1, 1)) < 0 ||
                            (rc = float_to_input(q, n, "max", 2, 0)) < 0))
        return rc;
    } else if (!strcmp(op, "Slice")) {
      if (q->opset < 10 && ((rc = ints_to_input(q, n, "starts", 1)) < 0 ||
                            (rc = ints_to_input(q, n, "ends", 2)) < 0 ||
                            (rc = ints_to_input(q, n, "axes", 3)) < 0))
        return rc;
    } else if (!strcmp(op, "Squeeze") || !strcmp(op, "Unsqueeze") || !strcmp(op, "ReduceSum")) {
      if ((rc = ints_to_input(q, n, "axes", 1)) < 0)
        return rc;
    } else if (!strcmp(op, "Split")) {
      if ((rc = ints_to_input(q, n, "split", 1)) < 0)
        return rc;
    } else if (!strcmp(op, "Pad")) {
      if (q->opset < 11 && ((rc = ints_to_input(q, n, "pads", 1)) < 0 ||
                            (rc = float_to_input(q, n, "value", 2, 0)) < 0))
        return rc;
    } else if (!strcmp(op, "TopK")) {
      if (q->opset < 10) {
        Onnx__AttributeProto *a = attr_find(n, "k");
        if (!a)
          return es__fail(ES_EMODEL, "quantize: %s has no k", label);
        int64_t k = a->i;
        const char *name = init_int64s(q, n->output[0], "_k", &k, 1);
        char **ins = qz_alloc(q, 2 * sizeof *ins);
        if (!name || !ins)
          return ES_ENOMEM;
        ins[0] = n->input[0];
        ins[1] = (char *)name;
        n->input = ins;
        n->n_input = 2;
        attr_drop(n, "k");
      }
    } else if (!strcmp(op, "Dropout")) {
      if (n->n_output > 1 && n->output[1][0] && smap_get(&q->cons_n, n->output[1]) > 0)
        return es__fail(ES_ENOTSUP, "quantize: %s: its mask is read; raising opset %lld to 13 "
                        "is not supported for it", label, (long long)q->opset);
      n->op_type = "Identity";
      n->n_attribute = 0;
      n->n_input = 1;
      n->n_output = 1;
    } else if (!strcmp(op, "Softmax") || !strcmp(op, "LogSoftmax") || !strcmp(op, "Hardmax")) {
      int k = smap_get(&q->obs_map, n->input[0]);
      int rank = k >= 0 ? q->obs[k].rank : -1;
      int64_t axis = attr_int(n, "axis", 1);
      if (rank < 1 || (axis < 0 ? axis + rank : axis) != rank - 1)
        return es__fail(ES_ENOTSUP, "quantize: %s: axis %lld of a rank-%d input: before opset 13 "
                        "it spans the axes after it too, so raising opset %lld to 13 changes it",
                        label, (long long)axis, rank, (long long)q->opset);
      attr_drop(n, "axis");
      if ((rc = attr_add_int(q, n, "axis", -1)) < 0)
        return rc;
    } else if (!strcmp(op, "Resize") && q->opset >= 11) {
      /* opset 11's form is 13's */
    } else {
      int same = 0;
      for (int k = 0; same_to_13[k]; k++)
        same |= !strcmp(same_to_13[k], op);
      if (!same)
        return es__fail(ES_ENOTSUP, "quantize: %s: its form changed between opset %lld and 13 "
                        "(per-channel quantization needs 13); export the model at opset 13",
                        label, (long long)q->opset);
      if (!strcmp(op, "BatchNormalization"))
        attr_drop(n, "spatial");
    }
  }
  for (size_t i = 0; i < q->mp->n_opset_import; i++) {
    Onnx__OperatorSetIdProto *os = q->mp->opset_import[i];
    if (!os->domain || !os->domain[0] || !strcmp(os->domain, "ai.onnx")) {
      os->has_version = 1;
      os->version = QZ_OPSET;
    }
  }
  if (!q->mp->has_ir_version || q->mp->ir_version < 7) {
    q->mp->has_ir_version = 1;
    q->mp->ir_version = 7;
  }
  q->opset = QZ_OPSET;
  return 0;
}

/* ---- ranges ------------------------------------------------------------- */

/* The range [L, H] (L <= 0 <= H, from the histogram's bin edges) whose
 * 8-bit quantization leaves the least expected squared error over the
 * values seen: the rounding noise, step^2 / 12 for each value inside, plus
 * the clipping error of each value outside. Prefix sums of the counts and
 * of their first and second moments (bin centres) make each candidate
 * O(1); 192 candidates a side. L is pinned at 0 for a folded activation
 * (lo_fixed), H kept at most hmax. */
static void mse_range(const qz_obs *o, int lo_fixed, double hmax, double *plo, double *phi) {
  enum { CAND = 192 };
  const double bw = o->hw / QZ_BINS;
  double *s0 = es_mem_alloc(ES_MEM_ENGINE, 3 * (QZ_BINS + 1) * sizeof *s0);
  if (!s0)
    return; /* keep min-max */
  double *s1 = s0 + QZ_BINS + 1, *s2 = s1 + QZ_BINS + 1;
  s0[0] = s1[0] = s2[0] = 0;
  for (int i = 0; i < QZ_BINS; i++) {
    double c = o->hlo + (i + 0.5) * bw, h = (double)o->hist[i];
    s0[i + 1] = s0[i] + h;
    s1[i + 1] = s1[i] + h * c;
    s2[i + 1] = s2[i] + h * c * c;
  }
  /* bin edges: edge e is hlo + e * bw; z the edge at or below 0 */
  int z = (int)floor(-o->hlo / bw);
  z = z < 0 ? 0 : z > QZ_BINS ? QZ_BINS : z;
  int emax = QZ_BINS;
  if (hmax == hmax && hmax < o->hlo + o->hw)
    emax = (int)ceil((hmax - o->hlo) / bw);
  emax = emax < z ? z : emax > QZ_BINS ? QZ_BINS : emax;
  double best = INFINITY, blo = *plo, bhi = *phi;
  for (int a = 0; a <= CAND; a++) {
    int el = lo_fixed ? z : (int)((long)z * a / CAND); /* 0 .. z */
    for (int b = 0; b <= CAND; b++) {
      int eh = z + (int)((long)(emax - z) * b / CAND); /* z .. emax */
      double L = fmin(o->hlo + el * bw, 0), H = fmax(o->hlo + eh * bw, 0);
      if (H - L <= 0)
        continue;
      double step = (H - L) / 255;
      double below = s2[el] - 2 * L * s1[el] + L * L * s0[el];
      double above = (s2[QZ_BINS] - s2[eh]) - 2 * H * (s1[QZ_BINS] - s1[eh]) +
                     H * H * (s0[QZ_BINS] - s0[eh]);
      double err = below + above + (s0[eh] - s0[el]) * step * step / 12;
      if (err < best) {
        best = err;
        blo = L;
        bhi = H;
      }
      if (lo_fixed)
        continue;
    }
    if (lo_fixed)
      break;
  }
  es_mem_free(s0);
  *plo = blo;
  *phi = bhi;
}

static void obs_range(const es_quantizer *q, const qz_obs *o, double act_max, double *plo,
                      double *phi) {
  double lo = o->lo, hi = o->hi;
  int folded = act_max == act_max; /* a folded Relu / Clip: the range starts at 0 */
  if (o->hist && o->count > 0 && q->opt.method == ES_QUANT_PERCENTILE) {
    double cut = (double)o->count * (1 - q->opt.percentile / 100.0);
    double bw = o->hw / QZ_BINS, acc = 0;
    int i;
    for (i = 0; i < QZ_BINS - 1; i++) {
      acc += (double)o->hist[i];
      if (acc > cut)
        break;
    }
    lo = fmax(lo, o->hlo + i * bw);
    acc = 0;
    for (i = QZ_BINS - 1; i > 0; i--) {
      acc += (double)o->hist[i];
      if (acc > cut)
        break;
    }
    hi = fmin(hi, o->hlo + (i + 1) * bw);
  } else if (o->hist && o->count > 0 && q->opt.method == ES_QUANT_MSE) {
    lo = fmin(lo, 0);
    hi = fmax(hi, 0);
    mse_range(o, folded, folded ? act_max : NAN, &lo, &hi);
  }
  if (folded) {
    lo = 0;
    hi = fmin(hi, act_max);
  }
  *plo = fmin(lo, 0);
  *phi = fmax(hi, 0);
}

static void obs_params(const es_quantizer *q, qz_obs *o, double act_max) {
  double lo, hi;
  obs_range(q, o, act_max, &lo, &hi);
  float scale = (float)((hi - lo) / 255.0);
  if (!(scale > 0) || !isfinite(scale))
    scale = 1.0f / 255; /* all zeros: any scale holds them */
  double zp = rint(-lo / scale);
  o->scale = scale;
  o->zp = (uint8_t)(zp < 0 ? 0 : zp > 255 ? 255 : zp);
}

/* ---- the rewrite --------------------------------------------------------- */

typedef struct qz_out {
  Onnx__NodeProto **v;
  size_t n, cap;
} qz_out;

static int emit(es_quantizer *q, qz_out *o, Onnx__NodeProto *n) {
  if (!n)
    return ES_ENOMEM;
  if (o->n == o->cap) {
    size_t cap = o->cap ? o->cap * 2 : 256;
    Onnx__NodeProto **v = qz_alloc(q, cap * sizeof *v);
    if (!v)
      return ES_ENOMEM;
    if (o->n)
      memcpy(v, o->v, o->n * sizeof *v);
    o->v = v;
    o->cap = cap;
  }
  o->v[o->n++] = n;
  return 0;
}

/* The pair of observed tensor k: Q then DQ. An output pair: the producer
 * now writes NAME_prequant and the DQ writes NAME. An input pair: the DQ
 * writes NAME_dq, which quantized readers take. */
typedef struct qz_pair {
  const char *src, *dq; /* what Q reads; what DQ writes */
} qz_pair;

static int emit_pair(es_quantizer *q, qz_out *out, qz_obs *o, qz_pair *pr) {
  const char *sn = init_floats(q, o->name, "_scale", 0, NULL, &o->scale, 1);
  const char *zn = qz_name(q, o->name, "_zero_point");
  if (!sn || !zn ||
      init_add(q, tp_make(q, zn, ONNX__TENSOR_PROTO__DATA_TYPE__UINT8, 0, NULL, &o->zp, 1)) < 0)
    return ES_ENOMEM;
  const char *qn = qz_name(q, o->name, "_quantized");
  const char *qnode = qz_name(q, o->name, "_QuantizeLinear");
  const char *dnode = qz_name(q, o->name, "_DequantizeLinear");
  if (!qn || !qnode || !dnode)
    return ES_ENOMEM;
  const char *qin[3] = {pr->src, sn, zn};
  const char *din[3] = {qn, sn, zn};
  int rc = emit(q, out, node_make(q, "QuantizeLinear", qnode, 3, qin, qn));
  if (rc == 0)
    rc = emit(q, out, node_make(q, "DequantizeLinear", dnode, 3, din, pr->dq));
  return rc;
}

/* The bias of 2-D Conv i with its weights' quantization error's mean
 * taken back: b[oc] - sum over its taps of (dq(wq) - w) * the tap's mean
 * input (qz_taps). *out: that new initializer's name (the Conv had no
 * bias: one is made), or bname (NULL: none) when nothing was observed.
 * ES_ENOMEM, else 0. */
static int bias_corrected(es_quantizer *q, size_t i, const float *w, const int8_t *qw,
                          const float *sc, const char *bname, const char **out) {
  const qz_taps *t = q->taps ? &q->taps[i] : NULL;
  const Onnx__NodeProto *n = q->g->node[i];
  const Onnx__TensorProto *wt = init_of(q, n->input[1]);
  *out = bname;
  if (!t || !t->n || !wt || wt->n_dims != 4)
    return 0;
  int64_t m = wt->dims[0], cg = wt->dims[1], k = t->kh * t->kw, g = attr_int(n, "group", 1);
  if (g < 1 || m % g || cg * g != t->c || wt->dims[2] != t->kh || wt->dims[3] != t->kw)
    return 0;
  int64_t nb = 0;
  const float *b = bname ? tp_floats(q, init_of(q, bname), &nb) : NULL;
  if (bname && (!b || nb != m))
    return 0;
  float *nbv = qz_alloc(q, (size_t)m * sizeof *nbv);
  if (!nbv)
    return ES_ENOMEM;
  for (int64_t oc = 0; oc < m; oc++) {
    int64_t ic0 = oc / (m / g) * cg;
    double d = 0;
    for (int64_t j = 0; j < cg * k; j++) {
      int64_t at = oc * cg * k + j;
      float dq = (float)qw[at] * sc[oc]; /* DequantizeLinear's value */
      d += ((double)dq - (double)w[at]) * t->sum[ic0 * k + j];
    }
    nbv[oc] = (float)((b ? (double)b[oc] : 0.0) - d / (double)t->n);
  }
  *out = init_floats(q, n->input[1], "_bias_corrected", 1, &m, nbv, m);
  return *out ? 0 : ES_ENOMEM;
}

/* Cholesky factor of the symmetric positive definite a (n x n, row major):
 * its lower triangle becomes L (a = L L^T). -1 when a is not. */
static int cholesky(double *a, int64_t n) {
  for (int64_t j = 0; j < n; j++) {
    double d = a[j * n + j];
    for (int64_t k = 0; k < j; k++)
      d -= a[j * n + k] * a[j * n + k];
    if (!(d > 0))
      return -1;
    d = sqrt(d);
    a[j * n + j] = d;
    for (int64_t i = j + 1; i < n; i++) {
      double v = a[i * n + j];
      for (int64_t k = 0; k < j; k++)
        v -= a[i * n + k] * a[j * n + k];
      a[i * n + j] = v / d;
    }
  }
  return 0;
}

/* Error-feedback rounding of weight-only 2-D Conv i's weights w (scales
 * sc, one per output channel) into qw, the method of GPTQ (Frantar et
 * al., 2022): per group, each weight in turn is rounded and its rounding
 * error, weighed by the inverse of the second moments H of the Conv's
 * input patches in calibration, moved onto the weights not yet rounded.
 * That lowers E[((Wq - W) x)^2], the output's error, where rounding each
 * to nearest lowers only |Wq - W|. The file stays a per-channel symmetric
 * int8 tensor.
 *
 * Weight-only Convs alone: their input is the float tensor H was measured
 * on. An int8 Conv's input carries its own rounding noise, which the
 * error moved into directions H calls quiet then meets: on rec quantized
 * wholly to int8, the outputs' SNR fell from 10.7 dB to 7.9 dB (8.6 dB
 * with that noise's variance added to H). The inputs are taken in their
 * own order: taking the largest moments first (GPTQ's "act order") made
 * the search keep more in float, measured (BlazeFace back 0.33x of FP32's
 * weight bytes against 0.30x, rec 0.39x against 0.26x).
 *
 * Measured on BlazeFace back with every Conv weight-only (3 photos): the
 * output error each Conv adds, E[((Wq - W) x)^2] on those photos, falls to
 * 0.05x-0.86x of nearest rounding's (0.4x typical), and on 13 photos the
 * model finds FP32's faces at IoU >= 0.98 on 10 against 2.
 *
 * 1: qw written; 0: no moments for this Conv, or H is singular even
 * damped (qw untouched); ES_ENOMEM. */
static int gptq_round(es_quantizer *q, size_t i, const float *w, const float *sc, int64_t m,
                      int8_t *qw) {
  qz_taps *t = q->taps ? &q->taps[i] : NULL;
  if (!t || !t->h || !t->n || m % t->g)
    return 0;
  int64_t dg = t->dg, rows = m / t->g;
  if (t->qw) {
    memcpy(qw, t->qw, (size_t)(m * dg));
    return 1;
  }
  double *a = es_mem_alloc(ES_MEM_ENGINE, (size_t)(dg * dg) * sizeof *a);
  double *inv = es_mem_alloc(ES_MEM_ENGINE, (size_t)(dg * dg) * sizeof *inv);
  double *wr = es_mem_alloc(ES_MEM_ENGINE, (size_t)dg * sizeof *wr);
  int8_t *out = es_mem_alloc(ES_MEM_ENGINE, (size_t)(m * dg));
  int rc = a && inv && wr && out ? 1 : ES_ENOMEM;
  for (int64_t gi = 0; gi < t->g && rc == 1; gi++) {
    const double *hg = t->h + gi * dg * dg;
    /* H per sample (hg holds its upper triangle), damped by 1% of its
     * mean diagonal (GPTQ's choice; on BlazeFace back 3% and 10% made
     * files within 0.1% of its size, 0.1% and 0.3% larger ones); an input
     * calibration never saw non-zero gets 1: it takes no error */
    double mean = 0;
    for (int64_t j = 0; j < dg; j++)
      mean += hg[j * dg + j];
    mean = mean / (double)dg / (double)t->n;
    for (int64_t j = 0; j < dg; j++)
      for (int64_t k = j; k < dg; k++)
        a[j * dg + k] = a[k * dg + j] = hg[j * dg + k] / (double)t->n;
    for (int64_t j = 0; j < dg; j++)
      a[j * dg + j] = a[j * dg + j] > 0 ? a[j * dg + j] + 0.01 * mean : 1.0;
    if (!(mean > 0) || cholesky(a, dg) < 0) {
      rc = 0;
      break;
    }
    /* inv = L^-1 (lower), then H^-1 = L^-T L^-1 into a */
    for (int64_t j = 0; j < dg; j++)
      for (int64_t r = 0; r < dg; r++) {
        if (r < j) {
          inv[r * dg + j] = 0;
          continue;
        }
        double v = r == j ? 1.0 : 0.0;
        for (int64_t k = j; k < r; k++)
          v -= a[r * dg + k] * inv[k * dg + j];
        inv[r * dg + j] = v / a[r * dg + r];
      }
    for (int64_t r = 0; r < dg; r++)
      for (int64_t c = 0; c <= r; c++) {
        double v = 0;
        for (int64_t k = r; k < dg; k++)
          v += inv[k * dg + r] * inv[k * dg + c];
        a[r * dg + c] = a[c * dg + r] = v;
      }
    /* H^-1 = U^T U, U upper: U is its lower Cholesky factor transposed,
     * so U[j][k] = a[k * dg + j] */
    if (cholesky(a, dg) < 0) {
      rc = 0;
      break;
    }
    for (int64_t oc = gi * rows; oc < (gi + 1) * rows; oc++) {
      float s = sc[oc];
      for (int64_t j = 0; j < dg; j++)
        wr[j] = w[oc * dg + j];
      for (int64_t j = 0; j < dg; j++) {
        float v = rintf((float)wr[j] / s);
        v = v > 127 ? 127 : v < -127 ? -127 : v;
        out[oc * dg + j] = (int8_t)v;
        double err = (wr[j] - (double)(v * s)) / a[j * dg + j];
        for (int64_t k = j + 1; k < dg; k++)
          wr[k] -= err * a[k * dg + j];
      }
    }
  }
  if (rc == 1) {
    memcpy(qw, out, (size_t)(m * dg));
    t->qw = out;
    out = NULL;
  }
  es_mem_free(a);
  es_mem_free(inv);
  es_mem_free(wr);
  es_mem_free(out);
  return rc;
}

/* Node i's weights as DQ(int8, scale) (symmetric, per channel along
 * w_axis): the DQ's output name, its scales in *w_scale (*n_scale), and
 * with correct, for a 2-D Conv with observed inputs, in *cbias its
 * corrected bias (bias_corrected; else *cbias is bname). With feedback
 * (a weight-only Conv under ES_QUANT_ROUND_GPTQ), its weights are rounded
 * by gptq_round where its input's moments were taken. NULL when out of
 * memory.
 *
 * By default only weight-only Convs are corrected: their input is the
 * float tensor calibration saw, so the correction is exact on average. An
 * int8 Conv's error is mostly its input's rounding and clipping, whose
 * mean the correction does not see: on a trained mobilenet_v2 correcting
 * its int8 Convs too lowered top-1 agreement with FP32 from 99.2% to 98.6%
 * (scripts/bench/classifier_agreement.sh --trained, --method mse), while
 * on rec and BlazeFace front it let the search keep more in int8
 * (ES_QUANT_BC_ALL). */
static const char *emit_weights(es_quantizer *q, qz_out *out, size_t i, int feedback,
                                float **w_scale, int64_t *n_scale, int correct, const char *bname,
                                const char **cbias) {
  Onnx__NodeProto *n = q->g->node[i];
  const Onnx__TensorProto *t = init_of(q, n->input[1]);
  int64_t cnt;
  float *w = tp_floats(q, t, &cnt);
  if (!w)
    return NULL;
  int axis = q->nodes[i].w_axis;
  int64_t ch = axis >= 0 ? t->dims[axis] : 1, inner = 1, outer = 1;
  if (axis >= 0) {
    for (size_t d = 0; d < t->n_dims; d++)
      if ((int)d < axis)
        outer *= t->dims[d];
      else if ((int)d > axis)
        inner *= t->dims[d];
  } else {
    inner = cnt;
  }
  float *sc = qz_alloc(q, (size_t)ch * sizeof *sc);
  int8_t *qw = qz_alloc(q, (size_t)cnt);
  int8_t *zp = qz_alloc(q, (size_t)ch);
  if (!sc || !qw || !zp)
    return NULL;
  for (int64_t c = 0; c < ch; c++) {
    float m = 0;
    for (int64_t o = 0; o < outer; o++)
      for (int64_t k = 0; k < inner; k++) {
        float a = fabsf(w[(o * ch + c) * inner + k]);
        if (a > m)
          m = a;
      }
    sc[c] = m > 0 && isfinite(m) ? m / 127.0f : 1.0f;
    for (int64_t o = 0; o < outer; o++)
      for (int64_t k = 0; k < inner; k++) {
        int64_t at = (o * ch + c) * inner + k;
        float v = rintf(w[at] / sc[c]);
        qw[at] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
      }
  }
  if (feedback && q->nodes[i].kind == QK_CONV && axis == 0 && gptq_round(q, i, w, sc, ch, qw) < 0)
    return NULL;
  const char *base = n->input[1];
  const char *qn = qz_name(q, base, "_quantized");
  const char *sn = init_floats(q, base, "_scale", axis >= 0 ? 1 : 0, &ch, sc, ch);
  const char *zn = qz_name(q, base, "_zero_point");
  const char *dq = qz_name(q, base, "_dequantized");
  const char *dnode = qz_name(q, base, "_DequantizeLinear");
  if (!qn || !sn || !zn || !dq || !dnode ||
      init_add(q, tp_make(q, qn, ONNX__TENSOR_PROTO__DATA_TYPE__INT8, (int)t->n_dims, t->dims, qw,
                          (size_t)cnt)) < 0 ||
      init_add(q, tp_make(q, zn, ONNX__TENSOR_PROTO__DATA_TYPE__INT8, axis >= 0 ? 1 : 0, &ch, zp,
                          (size_t)ch)) < 0)
    return NULL;
  const char *din[3] = {qn, sn, zn};
  Onnx__NodeProto *d = node_make(q, "DequantizeLinear", dnode, 3, din, dq);
  if (!d || (axis >= 0 && attr_add_int(q, d, "axis", axis) < 0) || emit(q, out, d) < 0)
    return NULL;
  q->st.weight_bytes_fp32 += (size_t)cnt * 4;
  q->st.weight_bytes_int8 += (size_t)cnt + (size_t)ch * 5;
  *cbias = bname;
  if (correct && q->nodes[i].kind == QK_CONV && axis == 0 &&
      bias_corrected(q, i, w, qw, sc, bname, cbias) < 0)
    return NULL;
  *w_scale = sc;
  *n_scale = ch;
  return dq;
}

/* The bias as int32 at x_scale * w_scale; NULL (the float bias is kept)
 * when a value leaves int32. */
static const char *emit_bias(es_quantizer *q, qz_out *out, const char *bname, float x_scale,
                             const float *w_scale, int64_t n_scale) {
  int64_t n;
  float *b = tp_floats(q, init_of(q, bname), &n);
  if (!b || (n_scale != 1 && n_scale != n))
    return bname;
  float *bs = qz_alloc(q, (size_t)n * sizeof *bs);
  int32_t *qb = qz_alloc(q, (size_t)n * sizeof *qb);
  if (!bs || !qb)
    return NULL;
  for (int64_t c = 0; c < n; c++) {
    bs[c] = x_scale * w_scale[n_scale == 1 ? 0 : c];
    double v = rint((double)b[c] / (double)bs[c]);
    if (!(bs[c] > 0) || !(fabs(v) <= 2147483647.0))
      return bname;
    qb[c] = (int32_t)v;
  }
  const char *qn = qz_name(q, bname, "_quantized");
  const char *sn = init_floats(q, bname, "_scale", 1, &n, bs, n);
  const char *dq = qz_name(q, bname, "_dequantized");
  const char *dnode = qz_name(q, bname, "_DequantizeLinear");
  if (!qn || !sn || !dq || !dnode ||
      init_add(q, tp_make(q, qn, ONNX__TENSOR_PROTO__DATA_TYPE__INT32, 1, &n, qb,
                          (size_t)n * 4)) < 0)
    return NULL;
  const char *din[2] = {qn, sn};
  Onnx__NodeProto *d = node_make(q, "DequantizeLinear", dnode, 2, din, dq);
  if (!d || attr_add_int(q, d, "axis", 0) < 0 || emit(q, out, d) < 0)
    return NULL;
  q->st.weight_bytes_fp32 += (size_t)n * 4;
  q->st.weight_bytes_int8 += (size_t)n * 8;
  return dq;
}

/* Which nodes stay quantized: every tensor they need was calibrated. */
static void finalize(es_quantizer *q) {
  q->st.nodes_quantized = q->st.activations_folded = 0;
  for (size_t i = 0; i < q->n_nodes; i++) {
    qz_node *qn = &q->nodes[i];
    if (!qn->quant)
      continue;
    const Onnx__NodeProto *n = q->g->node[i];
    int ok = 1;
    for (int k = 0; k < qn->n_act; k++) {
      int j = smap_get(&q->obs_map, n->input[k]);
      ok &= j >= 0 && !q->obs[j].bad && q->obs[j].seen;
    }
    if (!qn->out_float) {
      int j = smap_get(&q->obs_map, quant_out_name(q, i));
      ok &= j >= 0 && !q->obs[j].bad && q->obs[j].seen;
    }
    if (!ok) {
      qn->quant = 0;
      qn->act = -1;
      q->st.nodes_excluded++;
      continue;
    }
    if (qn->act >= 0)
      q->nodes[qn->act].removed = 1;
    q->st.nodes_quantized++;
    q->st.activations_folded += qn->act >= 0;
  }
  for (int k = 0; k < q->n_obs; k++)
    q->obs[k].need = q->obs[k].out_kind = 0;
  for (size_t i = 0; i < q->n_nodes; i++) {
    qz_node *qn = &q->nodes[i];
    if (!qn->quant)
      continue;
    const Onnx__NodeProto *n = q->g->node[i];
    for (int k = 0; k < qn->n_act; k++)
      q->obs[smap_get(&q->obs_map, n->input[k])].need = 1;
    if (qn->out_float)
      continue;
    qz_obs *o = &q->obs[smap_get(&q->obs_map, quant_out_name(q, i))];
    o->need = o->out_kind = 1;
    obs_params(q, o, qn->act >= 0 ? qn->act_max : NAN);
  }
  for (int k = 0; k < q->n_obs; k++)
    if (q->obs[k].need && !q->obs[k].out_kind)
      obs_params(q, &q->obs[k], NAN);
  /* A MaxPool's or nearest Resize's output takes its input's scale and
   * zero point when the input has a pair (its values are some of the
   * input's): the engine then runs the op on the bytes and reads them on
   * with no requantization between. */
  for (int k = 0; k < q->n_obs; k++) {
    qz_obs *o = &q->obs[k];
    int p = o->need ? smap_get(&q->prod_map, o->name) : -1;
    if (p < 0 || q->nodes[p].removed)
      continue;
    const Onnx__NodeProto *n = q->g->node[p];
    Onnx__AttributeProto *mode = attr_find(n, "mode");
    int copy = is_op(n, "MaxPool") ? n->n_output == 1
               : is_op(n, "Resize") || is_op(n, "Upsample")
                   ? !mode || (mode->has_s && mode->s.len == 7 && !memcmp(mode->s.data, "nearest", 7))
                   : 0;
    int j = copy && n->n_input >= 1 ? smap_get(&q->obs_map, n->input[0]) : -1;
    if (j < 0 || !q->obs[j].need)
      continue;
    o->scale = q->obs[j].scale;
    o->zp = q->obs[j].zp;
  }
}

/* Node i, quantized, with its weight / bias DQs before it and its output
 * pair after it. */
static int emit_quantized(es_quantizer *q, qz_out *out, size_t i, const char *const *dq_of) {
  Onnx__NodeProto *n = q->g->node[i];
  qz_node *qn = &q->nodes[i];
  char **ins = qz_alloc(q, (n->n_input > 3 ? n->n_input : 3) * sizeof *ins);
  if (!ins)
    return ES_ENOMEM;
  memcpy(ins, n->input, n->n_input * sizeof *ins);
  float x_scale = 1;
  for (int k = 0; k < qn->n_act; k++) {
    int j = smap_get(&q->obs_map, n->input[k]);
    if (!q->obs[j].out_kind) /* an input pair: read its DQ */
      ins[k] = (char *)dq_of[j];
    if (k == 0)
      x_scale = q->obs[j].scale;
  }
  if (qn->n_act == 1 && qn->kind < QK_ADD) { /* weights (and a bias) */
    float *ws = NULL;
    int64_t nws = 0;
    int bias_at = qn->kind == QK_GEMM ? 2 : (qn->kind == QK_MATMUL ? -1 : 2);
    const char *bname = bias_at > 0 && (int)n->n_input > bias_at && n->input[bias_at][0]
                            ? n->input[bias_at]
                            : NULL, *cb;
    const char *wdq = emit_weights(q, out, i, 0, &ws, &nws,
                                   q->opt.bias_correction == ES_QUANT_BC_ALL, bname, &cb);
    if (!wdq)
      return ES_ENOMEM;
    ins[1] = (char *)wdq;
    if (cb && !bname) { /* the correction made a bias */
      ins[2] = (char *)cb;
      n->n_input = 3;
    }
    if (cb) {
      const char *bdq = emit_bias(q, out, cb, x_scale, ws, nws);
      if (!bdq)
        return ES_ENOMEM;
      ins[bias_at] = (char *)bdq;
    }
  }
  n->input = ins;
  if (qn->out_float)
    return emit(q, out, n);
  qz_obs *o = &q->obs[smap_get(&q->obs_map, quant_out_name(q, i))];
  qz_pair pr = {qz_name(q, o->name, "_prequant"), o->name};
  if (!pr.src)
    return ES_ENOMEM;
  n->output[0] = (char *)pr.src;
  int rc = emit(q, out, n);
  return rc < 0 ? rc : emit_pair(q, out, o, &pr);
}

/* A Conv the accuracy search keeps in float, its weights int8 all the
 * same: DQ(wq, per-channel scale) -> Conv, x and the bias float. The
 * weights' error alone (symmetric, per channel: half a step of each
 * channel's largest weight / 127) is far below an activation's, which
 * is what the search found too coarse; the engine runs the Conv in float
 * from int8 weights it holds (weight-only int8). */
static int emit_weight_only(es_quantizer *q, qz_out *out, size_t i) {
  Onnx__NodeProto *n = q->g->node[i];
  char **ins = qz_alloc(q, (n->n_input > 3 ? n->n_input : 3) * sizeof *ins);
  if (!ins)
    return ES_ENOMEM;
  memcpy(ins, n->input, n->n_input * sizeof *ins);
  float *ws = NULL;
  int64_t nws = 0;
  const char *bname = n->n_input > 2 && n->input[2][0] ? n->input[2] : NULL, *cb;
  const char *wdq = emit_weights(q, out, i, q->opt.rounding == ES_QUANT_ROUND_GPTQ, &ws, &nws,
                                 q->opt.bias_correction != ES_QUANT_BC_NONE, bname, &cb);
  if (!wdq)
    return ES_ENOMEM;
  ins[1] = (char *)wdq;
  if (cb) {
    ins[2] = (char *)cb;
    if (n->n_input < 3)
      n->n_input = 3;
  }
  n->input = ins;
  return emit(q, out, n);
}

static int mark_used(es_quantizer *q, smap *used, const Onnx__GraphProto *g, int depth) {
  if (depth > 16)
    return 0;
  for (size_t i = 0; i < g->n_node; i++) {
    const Onnx__NodeProto *n = g->node[i];
    for (size_t k = 0; k < n->n_input; k++)
      if (n->input[k] && n->input[k][0] && smap_set(used, n->input[k], 1) < 0)
        return ES_ENOMEM;
    for (size_t a = 0; a < n->n_attribute; a++) {
      const Onnx__AttributeProto *at = n->attribute[a];
      if (at->g && mark_used(q, used, at->g, depth + 1) < 0)
        return ES_ENOMEM;
      for (size_t s = 0; s < at->n_graphs; s++)
        if (mark_used(q, used, at->graphs[s], depth + 1) < 0)
          return ES_ENOMEM;
    }
  }
  for (size_t i = 0; i < g->n_output; i++)
    if (g->output[i]->name && smap_set(used, g->output[i]->name, 1) < 0)
      return ES_ENOMEM;
  return 0;
}

static int rewrite(es_quantizer *q) {
  finalize(q);
  int rc = raise_opset(q);
  if (rc < 0)
    return rc;
  qz_out out = {0};
  /* input pairs: DQ output names, fixed once per tensor */
  const char **dq_of = qz_alloc(q, (size_t)(q->n_obs ? q->n_obs : 1) * sizeof *dq_of);
  if (!dq_of)
    return ES_ENOMEM;
  for (int k = 0; k < q->n_obs; k++)
    if (q->obs[k].need && !q->obs[k].out_kind && !(dq_of[k] = qz_name(q, q->obs[k].name, "_dq")))
      return ES_ENOMEM;
  /* anchors: pairs of graph inputs first, others right after their producer */
  for (int k = 0; k < q->n_obs; k++) {
    qz_obs *o = &q->obs[k];
    if (o->need && !o->out_kind && smap_get(&q->prod_map, o->name) < 0) {
      qz_pair pr = {o->name, dq_of[k]};
      if ((rc = emit_pair(q, &out, o, &pr)) < 0)
        return rc;
    }
  }
  for (size_t i = 0; i < q->n_nodes; i++) {
    Onnx__NodeProto *n = q->g->node[i];
    if (q->nodes[i].removed)
      continue;
    if (q->nodes[i].quant) {
      if ((rc = emit_quantized(q, &out, i, dq_of)) < 0)
        return rc;
    } else if (q->nodes[i].wonly) {
      if ((rc = emit_weight_only(q, &out, i)) < 0)
        return rc;
    } else if ((rc = emit(q, &out, n)) < 0) {
      return rc;
    }
    for (size_t m = 0; m < n->n_output; m++) {
      const char *name = n->output[m];
      if (q->nodes[i].quant) /* its own output pair is written; inputs below */
        break;
      int k = smap_get(&q->obs_map, name);
      if (k >= 0 && q->obs[k].need && !q->obs[k].out_kind) {
        qz_pair pr = {name, dq_of[k]};
        if ((rc = emit_pair(q, &out, &q->obs[k], &pr)) < 0)
          return rc;
      }
    }
  }
  q->g->node = out.v;
  q->g->n_node = out.n;
  /* initializers nothing reads any more (the float weights) go */
  smap used = {0};
  if ((rc = mark_used(q, &used, q->g, 0)) < 0) {
    smap_free(&used);
    return rc;
  }
  size_t w = 0;
  for (size_t i = 0; i < q->g->n_initializer; i++)
    if (smap_get(&used, q->g->initializer[i]->name) >= 0)
      q->g->initializer[w++] = q->g->initializer[i];
  q->g->n_initializer = w;
  /* graph inputs that listed dropped initializers */
  size_t wi = 0;
  for (size_t i = 0; i < q->g->n_input; i++) {
    const char *nm = q->g->input[i]->name;
    if (smap_get(&q->init_map, nm) >= 0 && smap_get(&used, nm) < 0)
      continue;
    q->g->input[wi++] = q->g->input[i];
  }
  q->g->n_input = wi;
  smap_free(&used);
  return 0;
}

/* How build writes each node create chose to quantize (mask[i]). */
enum { QZ_FLOAT = 0, QZ_INT8 = 1, QZ_WEIGHTS = 2 };

/* The QDQ model with the nodes mask[i] QZ_INT8 quantized (of those create
 * chose) and the QZ_WEIGHTS ones (Convs) with int8 weights alone, packed
 * into *out (es_mem). Works on a fresh copy of the tree as create left
 * it, so any number of builds can be made. */
static int build(es_quantizer *q, const unsigned char *mask, uint8_t **out, size_t *size) {
  es_ctx saved_ctx = q->ctx;
  Onnx__ModelProto *saved_mp = q->mp;
  Onnx__GraphProto *saved_g = q->g;
  smap saved[4] = {q->init_map, q->prod_map, q->cons_n, q->names};
  memset(&q->init_map, 0, sizeof q->init_map);
  memset(&q->prod_map, 0, sizeof q->prod_map);
  memset(&q->cons_n, 0, sizeof q->cons_n);
  memset(&q->names, 0, sizeof q->names);
  es_ctx fresh = {0};
  void *tree = NULL;
  int rc = es__onnx_unpack(q->pristine, q->pristine_size, &fresh, &tree);
  *out = NULL;
  if (rc == 0) {
    q->ctx = fresh;
    q->mp = tree;
    q->g = q->mp->graph;
    memcpy(q->nodes, q->nodes0, q->n_nodes * sizeof *q->nodes);
    unsigned long long samples = q->st.samples;
    q->st = q->st0;
    q->st.samples = samples;
    q->opset = q->opset0;
    q->name_seq = 0;
    for (size_t i = 0; i < q->n_nodes; i++)
      if (q->nodes[i].quant && mask[i] != QZ_INT8) {
        q->nodes[i].quant = 0;
        q->nodes[i].act = -1;
        q->st.nodes_excluded++;
        q->st.auto_excluded++;
        if (mask[i] == QZ_WEIGHTS && q->nodes[i].kind == QK_CONV) {
          q->nodes[i].wonly = 1;
          q->st.weight_only++;
        }
      }
    for (size_t i = 0; i < q->g->n_initializer && rc == 0; i++)
      if (q->g->initializer[i]->name &&
          ((rc = smap_set(&q->init_map, q->g->initializer[i]->name, (int)i)) < 0 ||
           (rc = smap_set(&q->names, q->g->initializer[i]->name, 1)) < 0))
        break;
    if (rc == 0)
      rc = index_graph(q);
    if (rc == 0)
      rc = rewrite(q);
    if (rc == 0) {
      *size = onnx__model_proto__get_packed_size(q->mp);
      if (!(*out = es_mem_alloc(ES_MEM_ENGINE, *size ? *size : 1)))
        rc = ES_ENOMEM;
      else
        onnx__model_proto__pack(q->mp, *out);
    }
    es__ctx_free_all(&q->ctx);
  }
  smap_free(&q->init_map);
  smap_free(&q->prod_map);
  smap_free(&q->cons_n);
  smap_free(&q->names);
  q->init_map = saved[0];
  q->prod_map = saved[1];
  q->cons_n = saved[2];
  q->names = saved[3];
  q->ctx = saved_ctx;
  q->mp = saved_mp;
  q->g = saved_g;
  if (rc == ES_ENOMEM)
    return es__fail(ES_ENOMEM, "quantize: out of memory building the model");
  return rc;
}

/* The int8 model's accuracy on the kept samples: the lowest signal to
 * quantization-noise ratio (dB) of its float outputs against FP32, or
 * -INFINITY when the judge refuses it. Unless exact, it stops at the
 * first sample after which it cannot hold: the judge refused, or an
 * output's error so far already puts it below the target against its
 * whole signal (error only grows), and *db is then that bound. A search
 * mostly asks whether a candidate holds; under a sanitizer the runs are
 * most of its time. */
static int evaluate(es_quantizer *q, const uint8_t *bytes, size_t size, int exact, double *db) {
  if (!q->ref_sig_known) {
    for (int k = 0; k < q->n_keep; k++)
      for (int o = 0; o < q->keep[k].n_ref && o < 16; o++) {
        const es_tensor *r = &q->keep[k].ref[o];
        const float *rv = r->data;
        for (size_t e = 0; r->dtype == ES_DTYPE_FLOAT && e < r->nbytes / 4; e++)
          q->ref_sig[o] += (double)rv[e] * rv[e];
      }
    q->ref_sig_known = 1;
  }
  es_model *m;
  int rc = es_model_load_buffer(bytes, size, NULL, &m);
  if (rc < 0)
    return rc;
  double sig[16] = {0}, err[16] = {0}, bound = INFINITY;
  int n_out = 0, refused = 0;
  for (int k = 0; k < q->n_keep && rc == 0 && !refused && bound == INFINITY; k++) {
    qz_sample *sm = &q->keep[k];
    es_tensor_info shapes[16];
    for (int i = 0; i < sm->n_in; i++) {
      es_model_input_info(m, i, &shapes[i]);
      shapes[i].dtype = sm->in[i].dtype;
      shapes[i].rank = sm->in[i].rank;
      memcpy(shapes[i].dims, sm->in[i].dims, sizeof shapes[i].dims);
    }
    es_plan *p;
    if ((rc = es_model_plan(m, shapes, sm->n_in, &p)) < 0)
      break;
    es_arena *a = NULL;
    int no = es_plan_output_count(p);
    es_tensor outs[16];
    if (no > 16 || (rc = es_arena_create(es_plan_arena_bytes(p) + 64, 64, &a)) < 0) {
      es_plan_release(p);
      rc = rc < 0 ? rc : es__fail(ES_ENOTSUP, "quantize: more than 16 outputs");
      break;
    }
    es_mem_heap hs = {0};
    es_run_heap heap = es_mem_heap_make(&hs);
    if ((rc = es_plan_run_heap(p, sm->in, sm->n_in, a, &heap, outs, no)) == 0) {
      n_out = no < sm->n_ref ? no : sm->n_ref;
      for (int o = 0; o < n_out; o++) {
        const es_tensor *r = &sm->ref[o], *x = &outs[o];
        if (r->dtype != ES_DTYPE_FLOAT || x->dtype != ES_DTYPE_FLOAT || r->nbytes != x->nbytes)
          continue;
        const float *rv = r->data, *xv = x->data;
        for (size_t e = 0; e < r->nbytes / 4; e++) {
          double d = (double)xv[e] - (double)rv[e];
          sig[o] += (double)rv[e] * rv[e];
          err[o] += d * d;
        }
      }
      if (q->opt.judge) {
        int ok = q->opt.judge(q->opt.judge_user, sm->ref, outs, n_out);
        if (ok < 0)
          rc = ok;
        refused = ok == 0;
      }
      for (int o = 0; o < n_out && !exact && q->opt.target_db > 0 && k + 1 < q->n_keep; o++) {
        double b = err[o] > 0 && q->ref_sig[o] > 0 ? 10 * log10(q->ref_sig[o] / err[o]) : INFINITY;
        if (b < q->opt.target_db)
          bound = fmin(bound, b);
      }
      es_plan_outputs_free(p, &heap, outs, no);
    }
    es_arena_destroy(a);
    es_plan_release(p);
  }
  es_model_release(m);
  if (rc < 0)
    return rc;
  double worst = INFINITY;
  for (int o = 0; o < n_out; o++)
    if (sig[o] > 0)
      worst = fmin(worst, err[o] > 0 ? 10 * log10(sig[o] / err[o]) : 200);
  *db = refused ? -INFINITY : bound < INFINITY ? bound : worst;
  return 0;
}

/* Whether a candidate of accuracy db (evaluate's) is good enough: within
 * the target when there is one, and passed by the judge (-INFINITY when
 * not). */
static int holds(const es_quantizer *q, double db) {
  return q->opt.target_db > 0 ? db >= q->opt.target_db : db > -INFINITY;
}

/* The candidate mask's accuracy (evaluate; exact: the whole measure, for
 * ranking). */
static int build_eval(es_quantizer *q, const unsigned char *mask, int exact, double *db) {
  uint8_t *b;
  size_t n;
  int rc = build(q, mask, &b, &n);
  if (rc == 0)
    rc = evaluate(q, b, n, exact, db);
  es_mem_free(b);
  return rc;
}

typedef struct qz_rank {
  int node;
  double db;
  int64_t weights; /* elements of its largest initializer input */
} qz_rank;

static int rank_cmp(const void *pa, const void *pb) {
  const qz_rank *a = pa, *b = pb;
  return a->db > b->db ? -1 : a->db < b->db ? 1 : a->node - b->node;
}

static int bytes_cmp(const void *pa, const void *pb) {
  const qz_rank *a = pa, *b = pb;
  return a->weights > b->weights ? -1 : a->weights < b->weights ? 1 : rank_cmp(pa, pb);
}

static int64_t node_weights(const es_quantizer *q, int i) {
  const Onnx__NodeProto *n = q->g->node[i];
  int64_t most = 0;
  for (size_t k = 0; k < n->n_input; k++) {
    const Onnx__TensorProto *t = n->input[k] && n->input[k][0] ? init_of(q, n->input[k]) : NULL;
    int64_t c = t ? tp_count(t) : 0;
    most = c > most ? c : most;
  }
  return most;
}

/* Of the nodes cand[0..n) (in mask not yet in state), as many as keep the
 * outputs within target_db of FP32 go to state, least sensitive first:
 * all of them if that holds; else each one's sensitivity is the accuracy
 * with it alone moved (the rest as mask has them), and a binary search
 * finds how many of the least sensitive can move (more lose more). For
 * weight-only (QZ_WEIGHTS), each one left is then tried on its own, the
 * largest weights first, and moves if the target still holds: sensitivity
 * alone does not add up (errors cancel or compound), and a large node the
 * ranking left behind is worth more bytes than the small ones before it.
 * Not for int8: there the fill spends the margin weight-only would have
 * used (the same bytes for less error), measured: rec's weights grew from
 * 0.32x to 0.35x of FP32 with it, front's from 0.31x to 0.37x.
 * *best: the accuracy with those moved (unchanged when none). */
static int tier(es_quantizer *q, unsigned char *mask, const int *cand, int n,
                unsigned char state, double *best) {
  if (n == 0)
    return 0;
  double db = 0;
  qz_rank *r = es_mem_alloc(ES_MEM_ENGINE, (size_t)n * sizeof *r);
  unsigned char *m = es_mem_alloc(ES_MEM_ENGINE, q->n_nodes);
  if (!r || !m) {
    es_mem_free(r);
    es_mem_free(m);
    return es__fail(ES_ENOMEM, "quantize: out of memory");
  }
  memcpy(m, mask, q->n_nodes);
  for (int j = 0; j < n; j++)
    m[cand[j]] = state;
  int rc = build_eval(q, m, 0, &db), lo = n;
  if (rc == 0 && !holds(q, db)) {
    for (int j = 0; j < n && rc == 0; j++) {
      memcpy(m, mask, q->n_nodes);
      m[cand[j]] = state;
      r[j].node = cand[j];
      rc = build_eval(q, m, 1, &r[j].db);
    }
    if (rc == 0)
      qsort(r, (size_t)n, sizeof *r, rank_cmp);
    int hi = n - 1; /* the answer is in [lo, hi]: all n miss the target */
    lo = 0;
    double got = *best;
    while (lo < hi && rc == 0) {
      int mid = (lo + hi + 1) / 2;
      memcpy(m, mask, q->n_nodes);
      for (int j = 0; j < mid; j++)
        m[r[j].node] = state;
      if ((rc = build_eval(q, m, 0, &db)) < 0)
        break;
      if (holds(q, db)) {
        lo = mid;
        got = db;
      } else {
        hi = mid - 1;
      }
    }
    if (state == QZ_WEIGHTS && rc == 0) { /* the fill: r[lo..n) by weight size */
      for (int j = lo; j < n; j++)
        r[j].weights = node_weights(q, r[j].node);
      qsort(r + lo, (size_t)(n - lo), sizeof *r, bytes_cmp);
      memcpy(m, mask, q->n_nodes);
      for (int j = 0; j < lo; j++)
        m[r[j].node] = state;
      for (int j = lo; j < n && rc == 0; j++) {
        m[r[j].node] = state;
        if ((rc = build_eval(q, m, 0, &db)) < 0)
          break;
        if (holds(q, db)) {
          qz_rank t = r[lo];
          r[lo++] = r[j];
          r[j] = t;
          got = db;
        } else {
          m[r[j].node] = mask[r[j].node];
        }
      }
    }
    db = got;
  } else {
    for (int j = 0; j < n; j++)
      r[j].node = cand[j];
  }
  if (rc == 0) {
    for (int j = 0; j < lo; j++)
      mask[r[j].node] = state;
    if (lo > 0)
      *best = db;
  }
  es_mem_free(r);
  es_mem_free(m);
  return rc;
}

/* One order of the search, from an all-float mask: int8 first (the
 * nodes that run in int8 within the target, then, of the Convs left in
 * float, those that still take int8 weights), or weight-only first (the
 * Convs that take int8 weights, then of all candidates those that run in
 * int8). cand: scratch for n_nodes indices. */
static int search_order(es_quantizer *q, unsigned char *mask, int *cand, int weights_first,
                        double *best) {
  int rc = 0, n = 0;
  memset(mask, QZ_FLOAT, q->n_nodes);
  *best = 200; /* the float model: FP32's outputs */
  for (int pass = 0; pass < 2 && rc == 0; pass++) {
    int weights = weights_first ? pass == 0 : pass == 1;
    if (weights && q->opt.keep_float_weights)
      continue;
    n = 0;
    for (size_t i = 0; i < q->n_nodes; i++)
      if (q->nodes0[i].quant &&
          (weights ? q->nodes0[i].kind == QK_CONV && mask[i] == QZ_FLOAT : mask[i] != QZ_INT8))
        cand[n++] = (int)i;
    rc = tier(q, mask, cand, n, weights ? QZ_WEIGHTS : QZ_INT8, best);
  }
  return rc;
}

/* Which nodes go to int8, which Convs take int8 weights alone and which
 * stay in float, so that the outputs stay within target_db of FP32 (and
 * the judge passes them): both orders of search_order, keeping the one
 * whose weights the engine holds in fewer bytes (ties: int8 first, the
 * faster). Neither wins everywhere:
 * int8 first spends the accuracy on activations where weight-only would
 * have kept the same bytes for less error (rec: 0.32x of FP32's weights
 * against 0.27x weight-only first), while on BlazeFace the int8 nodes it
 * picks leave more room for the weights (front 0.30x against 0.31x). A
 * model whose every candidate runs in int8 within the target is not
 * searched. */
static int search(es_quantizer *q, unsigned char *mask) {
  double db;
  int rc = build_eval(q, mask, 0, &db);
  if (rc < 0 || holds(q, db)) {
    q->st.sqnr_db = db;
    return rc;
  }
  int *cand = es_mem_alloc(ES_MEM_ENGINE, (q->n_nodes ? q->n_nodes : 1) * sizeof *cand);
  unsigned char *other = es_mem_alloc(ES_MEM_ENGINE, q->n_nodes ? q->n_nodes : 1);
  uint8_t *b = NULL;
  size_t size[2] = {0, 0}; /* weight bytes of each order's model */
  double best[2] = {200, 200};
  if (!cand || !other)
    rc = es__fail(ES_ENOMEM, "quantize: out of memory");
  if (rc == 0)
    rc = search_order(q, mask, cand, 0, &best[0]);
  if (rc == 0 && !q->opt.keep_float_weights)
    rc = search_order(q, other, cand, 1, &best[1]);
  for (int k = 0; k < 2 && rc == 0 && !q->opt.keep_float_weights; k++) {
    size_t n;
    es_model *m = NULL;
    es_model_stats ms;
    if ((rc = build(q, k ? other : mask, &b, &n)) == 0 &&
        (rc = es_model_load_buffer(b, n, NULL, &m)) == 0 && (rc = es_model_stats_get(m, &ms)) == 0)
      size[k] = ms.weight_bytes; /* what the engine holds, as inspect counts it */
    es_model_release(m);
    es_mem_free(b);
  }
  int pick = rc == 0 && !q->opt.keep_float_weights && size[1] < size[0];
  if (pick)
    memcpy(mask, other, q->n_nodes);
  es_mem_free(cand);
  es_mem_free(other);
  q->st.sqnr_db = best[pick];
  return rc;
}

int es_quantizer_write(es_quantizer *q, const char *path) {
  if (!q || !path)
    return es__fail(ES_EINVAL, "es_quantizer_write: NULL argument");
  if (q->written)
    return es__fail(ES_ESTATE, "es_quantizer_write: written already");
  if (!q->st.samples)
    return es__fail(ES_ESTATE, "quantize: no calibration sample was observed");
  unsigned char *mask = es_mem_alloc(ES_MEM_ENGINE, q->n_nodes ? q->n_nodes : 1);
  if (!mask)
    return es__fail(ES_ENOMEM, "quantize: out of memory");
  memset(mask, QZ_INT8, q->n_nodes ? q->n_nodes : 1);
  q->st.sqnr_db = NAN;
  int rc = searching(&q->opt) && q->n_keep > 0 ? search(q, mask) : 0;
  double db = q->st.sqnr_db;
  uint8_t *buf = NULL;
  size_t size = 0;
  if (rc == 0)
    rc = build(q, mask, &buf, &size);
  es_mem_free(mask);
  if (rc < 0)
    return rc;
  q->st.sqnr_db = db; /* build resets the counts */
  q->written = 1;
  FILE *f = fopen(path, "wb");
  if (!f) {
    int e = errno;
    es_mem_free(buf);
    return es__fail(-e, "quantize: cannot write %s: %s", path, strerror(e));
  }
  size_t wr = fwrite(buf, 1, size, f);
  int bad = fclose(f) != 0 || wr != size;
  es_mem_free(buf);
  if (bad) {
    unlink(path);
    return es__fail(ES_EIO, "quantize: writing %s failed", path);
  }
  return 0;
}
