/* The formats the fusion pass (src/engine/fuse*.c) writes and the kernels
 * read: Conv's fused post-ops, and FusedElementwise programs.
 *
 * ---- Conv / ConvTranspose / MatMul post-ops -------------------------------
 *
 * Attribute "_post": INTS, one ES_POST_* code per post-op, applied after
 * the bias in order; "_post_f": FLOATS, two parameters per post-op (0 where
 * unused). At most ES_POST_MAX post-ops. The residual of ES_POST_ADD is
 * input 3 (after X, W and the bias, -1 where there is none). kernels/post.h
 * parses and applies them.
 *
 * ---- FusedElementwise: the program format ---------------------------------
 *
 * A chain of float32 elementwise operators whose intermediates have no other
 * reader runs as one internal node, so every element is read and written
 * once instead of once per operator. The fusion pass (src/engine/fuse_ew.c)
 * writes the program; the kernel (src/kernels/fused.c) checks and runs it.
 *
 * The node. Inputs: the chain's outside tensors, all float32, broadcast to
 * one output shape like a binary op's operands (numpy rules over all of
 * them). One float32 output. Attributes:
 *
 *   "_prog"    INTS, ES_FE_WORDS per instruction: {opcode, a, b, dst}
 *   "_prog_f"  FLOATS, the immediates (absent when no instruction uses one)
 *
 * Registers. 0 .. n_in-1 are the node's inputs, read-only; n_in ..
 * ES_FE_MAX_REGS-1 are temporaries, each written before it is read (a
 * temporary may be written again). An operand a or b below zero names an
 * immediate instead of a register: ES_FE_IMM(i) is _prog_f[i]. dst is always
 * a temporary. The output is the dst of the last instruction.
 *
 * Opcodes, dst = ...:
 *
 *   ADD SUB MUL DIV  a op b
 *   POW              powf(a, b); an immediate b of 2 or 0.5 runs as a * a or
 *                    sqrtf(a), as the Pow kernel does with a static exponent
 *   RELU             a < 0 ? 0 : a
 *   SIGMOID          1 / (1 + exp(-a))
 *   HARDSIGMOID      clamp(alpha * a + beta, 0, 1); b = ES_FE_IMM(i) with
 *                    alpha = _prog_f[i], beta = _prog_f[i + 1]
 *   CLIP             min(max(a, lo), hi); b = ES_FE_IMM(i) with lo =
 *                    _prog_f[i], hi = _prog_f[i + 1] (-INFINITY / INFINITY
 *                    for an absent bound)
 *   SQRT             sqrtf(a)
 *   MOV              a (with an immediate: load immediate)
 *   MAX MIN          max(a, b), min(a, b), NaN from either side propagating
 *   PRELU            a < 0 ? b * a : a (b the slope)
 *   ABS NEG EXP LOG TANH ERF RECIPROCAL FLOOR CEIL ROUND SIGN SOFTPLUS
 *   SOFTSIGN MISH HARDSWISH GELU GELU_TANH
 *                    the operator of that name (GELU_TANH: Gelu with
 *                    approximate = "tanh")
 *   LEAKYRELU ELU CELU THRESHOLDEDRELU
 *                    the operator with alpha = _prog_f[i], b = ES_FE_IMM(i)
 *                    (_prog_f[i + 1] unused, 0)
 *   SELU             alpha = _prog_f[i], gamma = _prog_f[i + 1]
 *   SHRINK           bias = _prog_f[i], lambd = _prog_f[i + 1]
 *
 * Unary opcodes without parameters ignore b (write 0); those with take two
 * immediates through b as above. Each opcode computes what the
 * single-operator kernel computes, bit for bit (the formulas are shared,
 * kernels/ew_math.h), so fusing a chain does not change its result.
 *
 * Example, hard-swish x * clip(x + 3, 0, 6) / 6 over input 0 (x):
 *   _prog_f = {3, 0, 6, 6}
 *   _prog   = {ADD, 0, IMM(0), 1,   CLIP, 1, IMM(1), 1,
 *              MUL, 0, 1, 1,        DIV, 1, IMM(3), 1}
 */
#ifndef ES_KERNELS_FUSED_H
#define ES_KERNELS_FUSED_H

enum {
  ES_POST_RELU = 1,
  ES_POST_CLIP = 2,        /* min, max */
  ES_POST_HARDSIGMOID = 3, /* alpha, beta: max(0, min(1, alpha x + beta)) */
  ES_POST_HARDSWISH = 4,   /* x max(0, min(1, x / 6 + 1 / 2)) */
  ES_POST_SIGMOID = 5,
  ES_POST_SWISH = 6,       /* x sigmoid(x) */
  ES_POST_ADD = 7,         /* + the residual input, same shape as the output */
  ES_POST_GELU = 8,        /* x (1 + erf(x / sqrt 2)) / 2 */
  ES_POST_GELU_TANH = 9,   /* GELU's tanh approximation */
};
#define ES_POST_LAST ES_POST_GELU_TANH
#define ES_POST_MAX 8 /* post-ops per node, at most */

enum {
  ES_FE_ADD = 1,
  ES_FE_SUB = 2,
  ES_FE_MUL = 3,
  ES_FE_DIV = 4,
  ES_FE_POW = 5,
  ES_FE_RELU = 6,
  ES_FE_SIGMOID = 7,
  ES_FE_HARDSIGMOID = 8,
  ES_FE_CLIP = 9,
  ES_FE_SQRT = 10,
  ES_FE_MOV = 11,
  ES_FE_MAX = 12, /* binary, like ADD .. POW */
  ES_FE_MIN = 13,
  ES_FE_PRELU = 14,
  ES_FE_ABS = 15, /* unary */
  ES_FE_NEG = 16,
  ES_FE_EXP = 17,
  ES_FE_LOG = 18,
  ES_FE_TANH = 19,
  ES_FE_ERF = 20,
  ES_FE_RECIPROCAL = 21,
  ES_FE_FLOOR = 22,
  ES_FE_CEIL = 23,
  ES_FE_ROUND = 24,
  ES_FE_SIGN = 25,
  ES_FE_SOFTPLUS = 26,
  ES_FE_SOFTSIGN = 27,
  ES_FE_MISH = 28,
  ES_FE_HARDSWISH = 29,
  ES_FE_GELU = 30,
  ES_FE_GELU_TANH = 31,
  ES_FE_LEAKYRELU = 32, /* unary with parameters */
  ES_FE_ELU = 33,
  ES_FE_SELU = 34,
  ES_FE_CELU = 35,
  ES_FE_THRESHOLDEDRELU = 36,
  ES_FE_SHRINK = 37,
  ES_FE_NOPCODES = 38, /* opcodes are 1 .. ES_FE_NOPCODES-1 */
};

/* Operands an opcode reads: 2 for the binary ones, else 1. */
static inline int es__fe_binary(int op) {
  return (op >= ES_FE_ADD && op <= ES_FE_POW) || (op >= ES_FE_MAX && op <= ES_FE_PRELU);
}

/* 1 if b names the two immediates of the opcode's parameters. */
static inline int es__fe_params(int op) {
  return op == ES_FE_HARDSIGMOID || op == ES_FE_CLIP ||
         (op >= ES_FE_LEAKYRELU && op <= ES_FE_SHRINK);
}

#define ES_FE_WORDS 4      /* ints per instruction */
#define ES_FE_MAX_REGS 32  /* inputs + temporaries */
#define ES_FE_MAX_INSNS 64 /* instructions per program */

/* Operand naming immediate i; ES_FE_IMM_INDEX inverts it. */
#define ES_FE_IMM(i) (-1 - (long long)(i))
#define ES_FE_IMM_INDEX(op) (-1 - (long long)(op))

#endif
