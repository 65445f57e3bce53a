/* Post-training static quantization: an FP32 ONNX model in, a standard QDQ
 * ONNX model out (QuantizeLinear / DequantizeLinear pairs of the default
 * domain, opset 13 or the model's own when newer), which this engine and
 * ONNX Runtime both run.
 *
 *   es_quant_options o;
 *   es_quant_options_default(&o);
 *   es_quantizer *q;
 *   es_quantizer_create(onnx_bytes, onnx_size, &o, &q);
 *   for (each calibration sample)
 *     es_quantizer_observe(q, inputs, n_inputs);    // the model's inputs
 *   es_quantizer_write(q, "model.int8.onnx");
 *   es_quantizer_destroy(q);
 *
 * What it writes:
 *   - Conv, ConvTranspose, MatMul and Gemm are quantized: their weights
 *     (initializers) as int8, symmetric, one scale per output channel; the
 *     bias as int32 at input scale x weight scale; their activation inputs
 *     and their output as uint8 with a zero point, the range from
 *     calibration (min-max; a percentile of a histogram that cuts
 *     outliers; or the range of least squared error over that histogram).
 *   - A Relu, or a Clip from 0, that alone reads such an output is folded
 *     into its quantization (the range starts at 0, so the quantizer's
 *     saturation is the activation): the pattern engines fuse.
 *   - Before that, BatchNormalization after a Conv is folded into the
 *     Conv's weights, and a model of opset below 13 is raised to 13 (per
 *     channel scales need it): the operators whose form changed (Clip,
 *     Slice, Squeeze, Unsqueeze, Split, ReduceSum, Pad, Softmax on the
 *     last axis, Dropout) are rewritten; any other whose meaning changed
 *     is refused by name (ES_ENOTSUP).
 *   - Nodes named in options.exclude stay in float, and with
 *     options.target_db (or options.judge) those the accuracy search
 *     finds it takes; of
 *     these, the Convs that keep the target with int8 weights alone get
 *     them (weight-only: DequantizeLinear of int8 weights into the float
 *     Conv), unless options.keep_float_weights. Their biases are
 *     corrected for the mean shift of their weights' rounding
 *     (options.bias_correction), and their weights can be rounded for
 *     their output's error rather than each weight's (options.rounding).
 *
 * The names of every tensor of the source model stay (a quantized tensor's
 * producer writes NAME_prequant, and the DequantizeLinear writes NAME).
 * Calibration runs the source model on this engine with the tensors it
 * observes added as outputs. */
#ifndef EDGESERVE_QUANTIZE_H
#define EDGESERVE_QUANTIZE_H

#include <stddef.h>

#include "edgeserve/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum es_quant_method {
  ES_QUANT_MINMAX = 0,     /* the range seen */
  ES_QUANT_PERCENTILE = 1, /* the range holding `percentile` % of the values seen */
  ES_QUANT_MSE = 2,        /* the range whose quantization leaves the least squared
                              error (rounding inside, clipping outside) over the
                              values seen: outliers are clipped where that pays */
} es_quant_method;

/* Which quantized Convs get their bias corrected for the mean shift their
 * int8 weights make (per output channel: the weights' rounding error times
 * the mean input each kernel tap reads in calibration). */
typedef enum es_quant_bias_correction {
  ES_QUANT_BC_WEIGHTS = 0, /* weight-only Convs: their input is float, the correction exact
                              on average (the default) */
  ES_QUANT_BC_ALL = 1,     /* int8 Convs too: their error is mostly their input's rounding,
                              which it does not see; may help or hurt (measure) */
  ES_QUANT_BC_NONE = 2,
} es_quant_bias_correction;

/* How a weight-only Conv's weights are rounded to int8 (the file's format
 * is the same either way). */
typedef enum es_quant_rounding {
  ES_QUANT_ROUND_NEAREST = 0, /* each weight to its nearest step (the default) */
  ES_QUANT_ROUND_GPTQ = 1,    /* error feedback (GPTQ): each weight's rounding error moved
                                 onto the weights not yet rounded, weighed by the second
                                 moments of the Conv's input in calibration, so the
                                 output's error is lowered, not each weight's. Needs the
                                 search (target_db or judge) without keep_float_weights,
                                 else ES_EINVAL; groups of more than 1152 inputs x kernel
                                 taps round to nearest. Calibration costs more: per 2-D
                                 Conv and sample, up to 4096 positions at (inputs x taps)^2
                                 / 2 products each, at most about 2^26 products; the
                                 moments held are groups x (inputs x taps)^2 doubles a
                                 Conv (8 MB for a 1x1 Conv of 1024 inputs) */
} es_quant_rounding;

typedef struct es_quant_options {
  es_quant_method method;
  double percentile;           /* ES_QUANT_PERCENTILE: in (50, 100]; default 99.999 */
  const char *const *exclude;  /* node names kept in float (the caller's strings) */
  int n_exclude;
  double target_db;  /* > 0: keep in float the nodes it takes for every output to stay
                        within this signal-to-noise ratio (dB) of FP32 on the first
                        eval_samples samples (each node's sensitivity measured alone,
                        the least sensitive kept in int8); 0: quantize all */
  int eval_samples;  /* samples kept for that search (default 4) */
  int keep_float_weights; /* 0 (default): a Conv the search keeps in float still gets
                             int8 weights (weight-only: DQ(int8 W) -> float Conv), unless
                             that alone misses the target; 1: its weights stay float.
                             Nodes named in exclude always stay wholly float */
  es_quant_bias_correction bias_correction;
  es_quant_rounding rounding;
  /* Optional: the search's own acceptance test, for what the outputs mean
   * (a detector's detections) where their SNR cannot tell. Called for each
   * kept sample with FP32's outputs and a candidate model's (model output
   * order, n of each; only read during the call), on the thread calling
   * es_quantizer_write; returns 1 when the candidate's are acceptable, 0
   * when not (the candidate's later samples are then not run), negative
   * to stop the search with that error (its detail as the judge set it).
   * Set, it runs the search (with target_db 0 too): a candidate holds when
   * every sample passes and, with target_db > 0, its SNR is within the
   * target. */
  int (*judge)(void *user, const es_tensor *fp32, const es_tensor *got, int n);
  void *judge_user;
} es_quant_options;

typedef struct es_quantizer es_quantizer;

typedef struct es_quant_stats {
  int nodes_quantized;    /* Conv, ConvTranspose, MatMul, Gemm written as QDQ */
  int nodes_excluded;     /* of those kinds, left in float (by name, or no constant weights) */
  int activations_folded; /* Relu / Clip folded into a quantized output */
  int bn_folded;          /* BatchNormalization or bias Add folded into a Conv(Transpose) */
  int tensors_observed;   /* activations calibrated */
  int64_t opset_from, opset_to;
  unsigned long long samples; /* es_quantizer_observe calls that succeeded */
  size_t weight_bytes_fp32;   /* the quantized nodes' weights, before ... */
  size_t weight_bytes_int8;   /* ... and after (int8 weights, int32 biases, scales) */
  int auto_excluded;          /* of nodes_excluded, those the accuracy search kept in float */
  double sqnr_db;             /* outputs' lowest SNR against FP32 on the kept samples (dB;
                                 NAN when not measured) */
  int weight_only;            /* of auto_excluded, Convs written with int8 weights alone */
} es_quant_stats;

ES_API void es_quant_options_default(es_quant_options *o);

/* Reads and checks the model (as es_model_load_buffer does: a malformed
 * one is ES_EMODEL / ES_ENOTSUP naming the node), picks what to quantize
 * and loads the calibration model. onnx is only read during the call. */
ES_API int es_quantizer_create(const void *onnx, size_t size, const es_quant_options *o,
                               es_quantizer **out);
/* The calibration model (the source plus observed outputs): its inputs
 * are the source's, for the caller to build tensors from. Owned by q. */
ES_API es_model *es_quantizer_model(const es_quantizer *q);
/* Runs the model on one sample (inputs in model input order) and adds what
 * the observed tensors hold to their statistics. Not thread-safe. */
ES_API int es_quantizer_observe(es_quantizer *q, const es_tensor *inputs, int n_in);
/* Writes the QDQ model to path (ES_ESTATE before any observation). After
 * it, q only answers es_quantizer_stats. */
ES_API int es_quantizer_write(es_quantizer *q, const char *path);
ES_API int es_quantizer_stats(const es_quantizer *q, es_quant_stats *out);
ES_API void es_quantizer_destroy(es_quantizer *q);

#ifdef __cplusplus
}
#endif

#endif
