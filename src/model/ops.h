/* The operators the engine knows, as one X-macro table: the loader maps an
 * ONNX op_type to an es_op, inspect prints names, kernels dispatch on it.
 * XX(name, min_opset) : the oldest default-domain opset whose semantics the
 * engine implements for that operator. ES_OP_INTERNAL marks operators only
 * the planner creates (never read from a model file). */
#define ES_OP_INTERNAL 1000000
#ifndef ES_MODEL_OPS_H
#define ES_MODEL_OPS_H

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
  XX(Relayout, ES_OP_INTERNAL)                                                 \
  XX(FusedElementwise, ES_OP_INTERNAL)                                         \
  XX(LayerNorm, ES_OP_INTERNAL)

typedef enum es_op {
  ES_OP_UNKNOWN = 0,
#define ES_OP_ENUM_(name, minv) ES_OP_##name,
  ES_OP_MAP(ES_OP_ENUM_)
#undef ES_OP_ENUM_
  ES_OP_COUNT
} es_op;

/* ES_OP_UNKNOWN for a name the engine does not run. */
es_op es_op_from_name(const char *name);
const char *es_op_name(es_op op);
int es_op_min_opset(es_op op);

#endif
