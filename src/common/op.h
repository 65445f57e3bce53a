/* Operators and their attributes: the vocabulary the model layer reads from
 * files and the kernels run. It sits in common because both use it and
 * neither may include the other.
 *
 * The operators the engine knows, as one X-macro table: the loader maps an
 * ONNX op_type to an es_op, inspect prints names, kernels dispatch on it.
 * XX(name, min_opset) : the oldest default-domain opset whose semantics the
 * engine implements for that operator. ES_OP_INTERNAL marks operators only
 * the planner creates (never read from a model file); ES_OP_MS those of
 * the com.microsoft domain. */
#ifndef ES_COMMON_OP_H
#define ES_COMMON_OP_H

#include <stddef.h>
#include <stdint.h>

#include "edgeserve/types.h"

#define ES_OP_INTERNAL 1000000
/* Operators of the com.microsoft domain (ONNX Runtime's contrib operators,
 * what its quantizer writes in the QOperator format), read from a node of
 * that domain only (es__op_from_domain). */
#define ES_OP_MS 1000001

#define ES_OP_MAP(XX)                                                          \
  XX(Add, 7)                                                                   \
  XX(AveragePool, 7)                                                           \
  XX(BatchNormalization, 7)                                                    \
  XX(Cast, 6)                                                                  \
  XX(Clip, 6)                                                                  \
  XX(Concat, 4)                                                                \
  XX(Constant, 1)                                                              \
  XX(ConstantOfShape, 9)                                                       \
  XX(Conv, 1)                                                                  \
  XX(ConvTranspose, 1)                                                         \
  XX(Div, 7)                                                                   \
  XX(Equal, 7)                                                                 \
  XX(GlobalAveragePool, 1)                                                     \
  XX(HardSigmoid, 6)                                                           \
  XX(MatMul, 1)                                                                \
  XX(MaxPool, 1)                                                               \
  XX(Mul, 7)                                                                   \
  XX(Pad, 2)                                                                   \
  XX(Pow, 7)                                                                   \
  XX(ReduceMean, 1)                                                            \
  XX(Relu, 6)                                                                  \
  XX(Reshape, 5)                                                               \
  XX(Resize, 10)                                                               \
  XX(Shape, 1)                                                                 \
  XX(Sigmoid, 6)                                                               \
  XX(Slice, 1)                                                                 \
  XX(Softmax, 1)                                                               \
  XX(Split, 2)                                                                 \
  XX(Sqrt, 6)                                                                  \
  XX(Squeeze, 1)                                                               \
  XX(Sub, 7)                                                                   \
  XX(Transpose, 1)                                                             \
  /* elementwise, logic and activations (elementwise.c) */                     \
  XX(Abs, 6)                                                                   \
  XX(Acos, 7)                                                                  \
  XX(Acosh, 9)                                                                 \
  XX(And, 7)                                                                   \
  XX(Asin, 7)                                                                  \
  XX(Asinh, 9)                                                                 \
  XX(Atan, 7)                                                                  \
  XX(Atanh, 9)                                                                 \
  XX(BitShift, 11)                                                             \
  XX(Ceil, 6)                                                                  \
  XX(Celu, 12)                                                                 \
  XX(Cos, 7)                                                                   \
  XX(Cosh, 9)                                                                  \
  XX(Dropout, 7)                                                               \
  XX(Elu, 6)                                                                   \
  XX(Erf, 9)                                                                   \
  XX(Exp, 6)                                                                   \
  XX(Floor, 6)                                                                 \
  XX(Gelu, 20)                                                                 \
  XX(Greater, 7)                                                               \
  XX(GreaterOrEqual, 12)                                                       \
  XX(HardSwish, 14)                                                            \
  XX(Identity, 1)                                                              \
  XX(IsInf, 10)                                                                \
  XX(IsNaN, 9)                                                                 \
  XX(LeakyRelu, 6)                                                             \
  XX(Less, 7)                                                                  \
  XX(LessOrEqual, 12)                                                          \
  XX(Log, 6)                                                                   \
  XX(Max, 6)                                                                   \
  XX(Mean, 6)                                                                  \
  XX(Min, 6)                                                                   \
  XX(Mish, 18)                                                                 \
  XX(Mod, 10)                                                                  \
  XX(Neg, 6)                                                                   \
  XX(Not, 1)                                                                   \
  XX(Or, 7)                                                                    \
  XX(PRelu, 7)                                                                 \
  XX(Reciprocal, 6)                                                            \
  XX(Round, 11)                                                                \
  XX(Selu, 6)                                                                  \
  XX(Shrink, 9)                                                                \
  XX(Sign, 9)                                                                  \
  XX(Sin, 7)                                                                   \
  XX(Sinh, 9)                                                                  \
  XX(Softplus, 1)                                                              \
  XX(Softsign, 1)                                                              \
  XX(Sum, 6)                                                                   \
  XX(Tan, 7)                                                                   \
  XX(Tanh, 6)                                                                  \
  XX(ThresholdedRelu, 10)                                                      \
  XX(Where, 9)                                                                 \
  XX(Xor, 7)                                                                   \
  /* shape, layout and indexing (shape.c, indexing.c) */                       \
  XX(Compress, 9)                                                              \
  XX(DepthToSpace, 1)                                                          \
  XX(Expand, 8)                                                                \
  XX(EyeLike, 9)                                                               \
  XX(Flatten, 1)                                                               \
  XX(Gather, 1)                                                                \
  XX(GatherElements, 11)                                                       \
  XX(GatherND, 11)                                                             \
  XX(NonZero, 9)                                                               \
  XX(OneHot, 9)                                                                \
  XX(Range, 11)                                                                \
  XX(ReverseSequence, 10)                                                      \
  XX(Scatter, 9)                                                               \
  XX(ScatterElements, 11)                                                      \
  XX(ScatterND, 11)                                                            \
  XX(Size, 1)                                                                  \
  XX(SpaceToDepth, 1)                                                          \
  XX(Tile, 6)                                                                  \
  XX(Trilu, 14)                                                                \
  XX(Unique, 11)                                                               \
  XX(Unsqueeze, 1)                                                             \
  XX(Upsample, 7)                                                              \
  /* reductions, softmax, normalisation, linear algebra (reduce.c, norm.c,     \
     linalg.c) */                                                              \
  XX(ArgMax, 1)                                                                \
  XX(ArgMin, 1)                                                                \
  XX(CumSum, 11)                                                               \
  XX(Einsum, 12)                                                               \
  XX(Gemm, 7)                                                                  \
  XX(GlobalLpPool, 2)                                                          \
  XX(GlobalMaxPool, 1)                                                         \
  XX(GroupNormalization, 18)                                                   \
  XX(Hardmax, 1)                                                               \
  XX(InstanceNormalization, 6)                                                 \
  XX(LayerNormalization, 17)                                                   \
  XX(LogSoftmax, 1)                                                            \
  XX(LpNormalization, 1)                                                       \
  XX(LRN, 1)                                                                   \
  XX(MeanVarianceNormalization, 9)                                             \
  XX(ReduceL1, 1)                                                              \
  XX(ReduceL2, 1)                                                              \
  XX(ReduceLogSum, 1)                                                          \
  XX(ReduceLogSumExp, 1)                                                       \
  XX(ReduceMax, 1)                                                             \
  XX(ReduceMin, 1)                                                             \
  XX(ReduceProd, 1)                                                            \
  XX(ReduceSum, 1)                                                             \
  XX(ReduceSumSquare, 1)                                                       \
  /* signal processing, sampling and selection (signal.c, sample.c) */         \
  XX(BlackmanWindow, 17)                                                       \
  XX(Det, 11)                                                                  \
  XX(DFT, 17)                                                                  \
  XX(GridSample, 16)                                                           \
  XX(HammingWindow, 17)                                                        \
  XX(HannWindow, 17)                                                           \
  XX(MaxUnpool, 9)                                                             \
  XX(MelWeightMatrix, 17)                                                      \
  XX(NonMaxSuppression, 10)                                                    \
  XX(RoiAlign, 10)                                                             \
  XX(STFT, 17)                                                                 \
  XX(TopK, 1)                                                                  \
  /* quantisation: 8-bit quantize and dequantize, integer products (quant.c) */ \
  XX(ConvInteger, 10)                                                          \
  XX(DequantizeLinear, 10)                                                     \
  XX(DynamicQuantizeLinear, 11)                                                \
  XX(MatMulInteger, 10)                                                        \
  XX(QLinearConv, 10)                                                          \
  XX(QLinearMatMul, 10)                                                        \
  XX(QuantizeLinear, 10)                                                       \
  XX(QLinearAdd, ES_OP_MS)                                                     \
  XX(QLinearMul, ES_OP_MS)                                                     \
  XX(QLinearSigmoid, ES_OP_MS)                                                 \
  XX(QLinearGlobalAveragePool, ES_OP_MS)                                       \
  XX(QLinearAveragePool, ES_OP_MS)                                             \
  XX(QLinearConcat, ES_OP_MS)                                                  \
  /* recurrent layers (recurrent.c) */                                         \
  XX(GRU, 7)                                                                   \
  XX(LSTM, 7)                                                                  \
  XX(RNN, 7)                                                                   \
  /* control flow: an If's merge, its branches inlined (control.c) */          \
  XX(If, 1)                                                                    \
  /* control flow with a body, run without a plan (engine/interp.c) */          \
  XX(Loop, 1)                                                                  \
  XX(Scan, 9)                                                                  \
  XX(Relayout, ES_OP_INTERNAL)                                                 \
  XX(FusedElementwise, ES_OP_INTERNAL)                                         \
  XX(LayerNorm, ES_OP_INTERNAL)                                                \
  XX(QLookup, ES_OP_INTERNAL)                                                  \
  XX(QLinearConvTranspose, ES_OP_INTERNAL)

typedef enum es_op {
  ES_OP_UNKNOWN = 0,
#define ES_OP_ENUM_(name, minv) ES_OP_##name,
  ES_OP_MAP(ES_OP_ENUM_)
#undef ES_OP_ENUM_
  ES_OP_COUNT
} es_op;

/* ES_OP_UNKNOWN for a name the engine does not run. */
es_op es__op_from_name(const char *name);
/* An operator of domain dom (not the default one): ES_OP_UNKNOWN for a
 * domain or name the engine does not run. */
es_op es__op_from_domain(const char *dom, const char *name);
const char *es__op_name(es_op op);
int es__op_min_opset(es_op op);

/* "node 'name' (#3 Conv)" (or "node #3 (Conv)" without a name) in buf, for
 * error messages; index is the node's position in its file. */
const char *es__op_label(const char *name, int index, es_op op, char *buf, size_t size);

/* ---- attributes ------------------------------------------------------------ */

typedef enum es_attr_type {
  ES_ATTR_FLOAT = 1,
  ES_ATTR_INT = 2,
  ES_ATTR_STRING = 3,
  ES_ATTR_TENSOR = 4,
  ES_ATTR_FLOATS = 6,
  ES_ATTR_INTS = 7,
  ES_ATTR_STRINGS = 8,
} es_attr_type;

/* A tensor attribute's value, as a kernel reads it (ConstantOfShape's
 * value). */
typedef struct es_attr_tensor {
  es_dtype dtype;
  int rank;
  int64_t dims[ES_MAX_RANK];
  const void *data; /* read-only */
  size_t nbytes;
} es_attr_tensor;

typedef struct es_attr {
  const char *name;
  es_attr_type type;
  float f;
  int64_t i;
  const char *s;
  size_t n;              /* elements of ints / floats / strs */
  const int64_t *ints;
  const float *floats;
  const char *const *strs; /* STRINGS: n strings */
  int tensor;            /* TENSOR: the graph's constant value holding it (the
                            model layer's index), or -1 */
  const es_attr_tensor *t; /* TENSOR: its value, resolved by the model layer
                              (es__graph_attrs_resolve); NULL until then */
} es_attr;

/* The attribute called name in attrs[0..n), or NULL. */
const es_attr *es__attr_find(const es_attr *attrs, int n, const char *name);

#endif
