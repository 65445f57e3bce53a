/* FusedElementwise: a program of float32 elementwise instructions (format in
 * fused.h) run over the output in one pass.
 *
 * Why: as separate nodes, hard-swish (Add, Clip, Mul, Div) reads and writes
 * its whole tensor four times. Here the output is cut into blocks of at
 * most FE_BLOCK elements; for each block the program runs over block-sized
 * registers that stay in L1, the inputs are read once and the result is
 * stored once.
 *
 * Broadcasting (planned in infer) is the binary ops' collapse extended to
 * any number of operands: output dims of size 1 are dropped and neighbours
 * merged where every input is present ("full") in both or broadcast in both.
 * The innermost collapsed dim is a row: along it each input is either a
 * contiguous vector or one value for the whole row (a per-row scalar, such
 * as the per-channel scale in [N,C,H,W] * [C,1,1]). Rows are walked by an
 * odometer over the outer dims, each in blocks. Short rows (NHWC's [H*W, C]
 * with a per-channel [C]) would pay the program's per-block cost every few
 * elements, so blocks then span several rows, and an input repeated along
 * them is copied into a block-sized tile in scratch (fe_blocks).
 *
 * Scalar registers: within a block a register is either a vector or one
 * value. An instruction whose operands are all values (immediates, per-row
 * inputs, temporaries made of those) computes one value, so the HardSigmoid
 * of a plain [N,C,H,W]'s per-channel gate runs once per row, not once per
 * element.
 *
 * Temporaries get scratch slots by liveness: a slot is free again after its
 * register's last reader, so a long SSA-style program needs only as many
 * block buffers as values alive at once. The last instruction stores into
 * the output directly.
 *
 * Layouts, as binary ops (elementwise.c): plain unless an input is
 * channels-last (NHWC, or NDHWC at rank 5). Then the output is too and
 * every other input must be channels-last or es__tdesc_cl_compatible; an
 * input of the output's rank that is neither is asked for channels-last,
 * and with one of another rank the channels-last inputs are asked for in
 * plain instead (ES_KRELAYOUT). The collapse then runs on physical shapes
 * (each operand right-aligned to the output's rank, dims in (N, spatial...,
 * C) order).
 *
 * In place: output 0 may take an input of the output's shape. Every loop
 * loads a chunk of its operands before storing it, so out == in (and dst ==
 * src among temporaries) is exact-alias safe; such an input's elements of a
 * block are read only by that block's instructions, all before the last
 * one stores. The chunks are also what GCC's SLP vectoriser turns into
 * vector code.
 */
#include "kernels/fused.h"

#include <math.h>
#include <string.h>

#include "kernels/ew_math.h"
#include "kernels/kernel.h"
#include "kernels/walk.h"

#define FE_BLOCK 256 /* elements per block: registers of 1 KiB */

/* ==========================================================================
 * Element loops
 * ======================================================================== */

#define FE_CHUNK 16
/* The loops are inlined into fe_block, which x86-64 builds compile once
 * per vector width (SSE2, AVX2, AVX-512), the loader picking the one the
 * CPU runs: a block of a few instructions over L1 data is bound by vector
 * width, not memory. */
#define FE_INLINE static inline __attribute__((always_inline))
#define FE_CLONES ES_KCLONES
#define FE_UNROLL _Pragma("GCC unroll 16")

/* o[i] = OP(a[i], b[i]) with either side a vector (v) or one value (s). */
#define FE_BIN_DEFINE(NAME, OP)                                                           \
  FE_INLINE void NAME##_vv(const float *a, const float *b, float *o, size_t n) {          \
    size_t i = 0;                                                                         \
    for (; i + FE_CHUNK <= n; i += FE_CHUNK) {                                            \
      float x[FE_CHUNK], y[FE_CHUNK];                                                     \
      FE_UNROLL for (int j = 0; j < FE_CHUNK; j++) {                                      \
        x[j] = a[i + j];                                                                  \
        y[j] = b[i + j];                                                                  \
      }                                                                                   \
      FE_UNROLL for (int j = 0; j < FE_CHUNK; j++) o[i + j] = OP(x[j], y[j]);             \
    }                                                                                     \
    for (; i < n; i++) {                                                                  \
      float x = a[i], y = b[i];                                                           \
      o[i] = OP(x, y);                                                                    \
    }                                                                                     \
  }                                                                                       \
  FE_INLINE void NAME##_vs(const float *a, float y, float *o, size_t n) {                 \
    size_t i = 0;                                                                         \
    for (; i + FE_CHUNK <= n; i += FE_CHUNK) {                                            \
      float x[FE_CHUNK];                                                                  \
      FE_UNROLL for (int j = 0; j < FE_CHUNK; j++) x[j] = a[i + j];                       \
      FE_UNROLL for (int j = 0; j < FE_CHUNK; j++) o[i + j] = OP(x[j], y);                \
    }                                                                                     \
    for (; i < n; i++) {                                                                  \
      float x = a[i];                                                                     \
      o[i] = OP(x, y);                                                                    \
    }                                                                                     \
  }                                                                                       \
  FE_INLINE void NAME##_sv(float x, const float *b, float *o, size_t n) {                 \
    size_t i = 0;                                                                         \
    for (; i + FE_CHUNK <= n; i += FE_CHUNK) {                                            \
      float y[FE_CHUNK];                                                                  \
      FE_UNROLL for (int j = 0; j < FE_CHUNK; j++) y[j] = b[i + j];                       \
      FE_UNROLL for (int j = 0; j < FE_CHUNK; j++) o[i + j] = OP(x, y[j]);                \
    }                                                                                     \
    for (; i < n; i++) {                                                                  \
      float y = b[i];                                                                     \
      o[i] = OP(x, y);                                                                    \
    }                                                                                     \
  }

/* o[i] = OP(a[i], p, q) with the instruction's two parameters. */
#define FE_UN_DEFINE(NAME, OP)                                                            \
  FE_INLINE void NAME##_v(const float *a, float *o, size_t n, float p, float q) {         \
    (void)p;                                                                              \
    (void)q;                                                                              \
    size_t i = 0;                                                                         \
    for (; i + FE_CHUNK <= n; i += FE_CHUNK) {                                            \
      float x[FE_CHUNK];                                                                  \
      FE_UNROLL for (int j = 0; j < FE_CHUNK; j++) x[j] = a[i + j];                       \
      FE_UNROLL for (int j = 0; j < FE_CHUNK; j++) o[i + j] = OP(x[j], p, q);             \
    }                                                                                     \
    for (; i < n; i++) {                                                                  \
      float x = a[i];                                                                     \
      o[i] = OP(x, p, q);                                                                 \
    }                                                                                     \
  }

/* The formulas of the single-operator kernels (elementwise.c), so a fused
 * chain gives the bits the nodes it replaces would. */
static inline float fe_add(float x, float y) { return x + y; }
static inline float fe_sub(float x, float y) { return x - y; }
static inline float fe_mul(float x, float y) { return x * y; }
static inline float fe_div(float x, float y) { return x / y; }
static inline float fe_pow(float x, float y) { return powf(x, y); }

static inline float fe_square(float x, float p, float q) {
  (void)p;
  (void)q;
  return x * x;
}
static inline float fe_sqrt(float x, float p, float q) {
  (void)p;
  (void)q;
  return sqrtf(x);
}
static inline float fe_relu(float x, float p, float q) {
  (void)p;
  (void)q;
  return x < 0 ? 0 : x;
}
static inline float fe_sigmoid(float x, float p, float q) {
  (void)p;
  (void)q;
  return es__ew_sigmoid(x);
}
/* Comparisons (not fmaxf/fminf) so NaN propagates. */
static inline float fe_hardsigmoid(float x, float alpha, float beta) {
  float v = alpha * x + beta;
  v = v < 0.0f ? 0.0f : v;
  return v > 1.0f ? 1.0f : v;
}
static inline float fe_clip(float x, float lo, float hi) {
  float v = x < lo ? lo : x;
  return v > hi ? hi : v;
}
static inline float fe_mov(float x, float p, float q) {
  (void)p;
  (void)q;
  return x;
}
static inline float fe_max(float x, float y) { return es__ew_max(x, y); }
static inline float fe_min(float x, float y) { return es__ew_min(x, y); }
static inline float fe_prelu(float x, float y) { return es__ew_prelu(x, y); }

/* The shared formulas (ew_math.h) of the elementwise kernels. */
#define FE_MATH(NAME, EXPR)                                                               \
  static inline float fe_##NAME(float x, float p, float q) {                              \
    (void)p;                                                                              \
    (void)q;                                                                              \
    return EXPR;                                                                          \
  }
FE_MATH(abs, fabsf(x))
FE_MATH(neg, -x)
FE_MATH(exp, es__ew_exp(x))
FE_MATH(log, es__ew_log(x))
FE_MATH(tanh, es__ew_tanh(x))
FE_MATH(erf, es__ew_erf(x))
FE_MATH(reciprocal, 1.0f / x)
FE_MATH(floor, es__ew_floor(x))
FE_MATH(ceil, es__ew_ceil(x))
FE_MATH(round, es__ew_round(x))
FE_MATH(sign, es__ew_sign(x))
FE_MATH(softplus, es__ew_softplus(x))
FE_MATH(softsign, es__ew_softsign(x))
FE_MATH(mish, es__ew_mish(x))
FE_MATH(hardswish, es__ew_hardswish(x))
FE_MATH(gelu, es__ew_gelu(x))
FE_MATH(gelu_tanh, es__ew_gelu_tanh(x))
FE_MATH(leakyrelu, es__ew_leakyrelu(x, p))
FE_MATH(elu, es__ew_elu(x, p))
FE_MATH(selu, es__ew_selu(x, p, q))
FE_MATH(celu, es__ew_celu(x, p))
FE_MATH(thresholdedrelu, es__ew_thresholdedrelu(x, p))
FE_MATH(shrink, es__ew_shrink(x, p, q))

FE_BIN_DEFINE(fe_add, fe_add)
FE_BIN_DEFINE(fe_sub, fe_sub)
FE_BIN_DEFINE(fe_mul, fe_mul)
FE_BIN_DEFINE(fe_div, fe_div)
FE_BIN_DEFINE(fe_pow, fe_pow)
FE_UN_DEFINE(fe_square, fe_square)
FE_UN_DEFINE(fe_sqrt, fe_sqrt)
FE_UN_DEFINE(fe_relu, fe_relu)
FE_UN_DEFINE(fe_sigmoid, fe_sigmoid)
FE_UN_DEFINE(fe_hardsigmoid, fe_hardsigmoid)
FE_UN_DEFINE(fe_clip, fe_clip)
FE_UN_DEFINE(fe_mov, fe_mov)
FE_BIN_DEFINE(fe_max, fe_max)
FE_BIN_DEFINE(fe_min, fe_min)
FE_BIN_DEFINE(fe_prelu, fe_prelu)
FE_UN_DEFINE(fe_abs, fe_abs)
FE_UN_DEFINE(fe_neg, fe_neg)
FE_UN_DEFINE(fe_exp, fe_exp)
FE_UN_DEFINE(fe_log, fe_log)
FE_UN_DEFINE(fe_tanh, fe_tanh)
FE_UN_DEFINE(fe_erf, fe_erf)
FE_UN_DEFINE(fe_reciprocal, fe_reciprocal)
FE_UN_DEFINE(fe_floor, fe_floor)
FE_UN_DEFINE(fe_ceil, fe_ceil)
FE_UN_DEFINE(fe_round, fe_round)
FE_UN_DEFINE(fe_sign, fe_sign)
FE_UN_DEFINE(fe_softplus, fe_softplus)
FE_UN_DEFINE(fe_softsign, fe_softsign)
FE_UN_DEFINE(fe_mish, fe_mish)
FE_UN_DEFINE(fe_hardswish, fe_hardswish)
FE_UN_DEFINE(fe_gelu, fe_gelu)
FE_UN_DEFINE(fe_gelu_tanh, fe_gelu_tanh)
FE_UN_DEFINE(fe_leakyrelu, fe_leakyrelu)
FE_UN_DEFINE(fe_elu, fe_elu)
FE_UN_DEFINE(fe_selu, fe_selu)
FE_UN_DEFINE(fe_celu, fe_celu)
FE_UN_DEFINE(fe_thresholdedrelu, fe_thresholdedrelu)
FE_UN_DEFINE(fe_shrink, fe_shrink)

/* ==========================================================================
 * Planning
 * ======================================================================== */

/* Opcodes after specialisation: fused.h's, plus Pow by 2 and by 0.5. */
enum { FE_SQUARE = ES_FE_NOPCODES, FE_POW_SQRT };

typedef struct fe_insn {
  int op;
  int a, b;     /* registers, or -1: the value in fa / fb */
  int dst;
  float fa, fb; /* immediate operands */
  float p, q;   /* parameters: HARDSIGMOID alpha, beta; CLIP lo, hi */
} fe_insn;

/* How an input is read in a block. */
enum {
  FE_IN_VEC,    /* contiguous in the input */
  FE_IN_TILE,   /* a row of `tile` elements, repeated into a block in scratch */
  FE_IN_SCALAR, /* one value for the block */
};

typedef struct fe_plan {
  fe_insn *ins;
  int n_ins, n_in;
  int *slot;                 /* [ES_FE_MAX_REGS]: scratch slot of a temporary, -1 none */
  int kind[ES_FE_MAX_REGS];  /* per input, FE_IN_* */
  int tile_slot[ES_FE_MAX_REGS]; /* TILE inputs: their scratch slot */
  size_t slot_floats;        /* floats per slot (block rounded to 64 bytes) */
  size_t count;              /* output elements */
  size_t row;                /* elements per row: the innermost dim (two with tiles) */
  size_t block;              /* elements per block, a multiple of tile */
  size_t tile;               /* TILE inputs' row length */
  int outer;                 /* dims walked outside rows: the first `outer` ones */
  int rank;                  /* collapsed rank, >= 1 */
  int64_t dims[ES_MAX_RANK]; /* collapsed output dims */
  int64_t *strides;          /* [rank][n_in] element strides, 0 where broadcast */
} fe_plan;

/* Checks the program and turns it into p->ins. */
static int fe_parse(es_kinst *k, fe_plan *p) {
  const int64_t *w;
  const float *f;
  size_t nw, nf;
  int rc = es__attr_ints(k, "_prog", &w, &nw);
  if (rc == 0)
    rc = es__attr_floats(k, "_prog_f", &f, &nf);
  if (rc < 0)
    return rc;
  if (!w)
    return ES_KFAIL(k, ES_EMODEL, "attribute '_prog' is required");
  if (nw == 0 || nw % ES_FE_WORDS || nw / ES_FE_WORDS > ES_FE_MAX_INSNS)
    return ES_KFAIL(k, ES_EMODEL, "'_prog' has %zu values; expected 1 to %d instructions of %d",
                    nw, ES_FE_MAX_INSNS, ES_FE_WORDS);
  p->n_ins = (int)(nw / ES_FE_WORDS);
  p->ins = es__kinst_alloc(k, (size_t)p->n_ins * sizeof *p->ins);
  if (!p->ins)
    return ES_KFAIL(k, ES_ENOMEM, "out of memory for the program");
  uint32_t written = 0;
  for (int i = 0; i < p->n_ins; i++) {
    const int64_t *q = w + (size_t)i * ES_FE_WORDS;
    fe_insn *in = &p->ins[i];
    int64_t op = q[0];
    if (op < 1 || op >= ES_FE_NOPCODES)
      return ES_KFAIL(k, ES_EMODEL, "instruction %d: opcode %lld is not one of 1..%d", i,
                      (long long)op, ES_FE_NOPCODES - 1);
    in->op = (int)op;
    int params = es__fe_params(in->op);
    in->b = -1;
    if (params) {
      int64_t ix = q[2] < 0 ? ES_FE_IMM_INDEX(q[2]) : -1;
      if (ix < 0 || ix + 1 >= (int64_t)nf)
        return ES_KFAIL(k, ES_EMODEL, "instruction %d: operand b (%lld) must name two "
                        "immediates of '_prog_f' (%zu values)", i, (long long)q[2], nf);
      in->p = f[ix];
      in->q = f[ix + 1];
    }
    for (int s = 0; s < (es__fe_binary(in->op) ? 2 : 1); s++) {
      int64_t r = q[1 + s];
      int *reg = s ? &in->b : &in->a;
      float *imm = s ? &in->fb : &in->fa;
      if (r < 0) {
        int64_t ix = ES_FE_IMM_INDEX(r);
        if (ix >= (int64_t)nf)
          return ES_KFAIL(k, ES_EMODEL, "instruction %d: immediate %lld is outside '_prog_f' "
                          "(%zu values)", i, (long long)ix, nf);
        *reg = -1;
        *imm = f[ix];
        continue;
      }
      if (r >= ES_FE_MAX_REGS || (r >= p->n_in && !(written >> r & 1)))
        return ES_KFAIL(k, ES_EMODEL, "instruction %d reads register %lld, which is not an "
                        "input (0..%d) or a temporary written before", i, (long long)r,
                        p->n_in - 1);
      *reg = (int)r;
    }
    if (q[3] < p->n_in || q[3] >= ES_FE_MAX_REGS)
      return ES_KFAIL(k, ES_EMODEL, "instruction %d writes register %lld; temporaries are "
                      "%d..%d", i, (long long)q[3], p->n_in, ES_FE_MAX_REGS - 1);
    in->dst = (int)q[3];
    written |= 1u << in->dst;
    /* Static exponents, as the Pow kernel's fast path. powf(x, 1) is x. */
    if (in->op == ES_FE_POW && in->b < 0)
      in->op = in->fb == 2.0f ? FE_SQUARE : in->fb == 0.5f ? FE_POW_SQRT
               : in->fb == 1.0f ? ES_FE_MOV : in->op;
  }
  return 0;
}

/* Scratch slots for temporaries by liveness (see the design note): slot[r]
 * for each temporary, -1 for none. Returns the number of slots. */
static int fe_slots(const fe_plan *p, int *slot) {
  int first[ES_FE_MAX_REGS], end[ES_FE_MAX_REGS];
  for (int r = 0; r < ES_FE_MAX_REGS; r++) {
    first[r] = -1;
    end[r] = -1;
    slot[r] = -1;
  }
  for (int i = 0; i < p->n_ins; i++) {
    const fe_insn *in = &p->ins[i];
    if (in->a >= 0)
      end[in->a] = i;
    if (in->b >= 0)
      end[in->b] = i;
    if (first[in->dst] < 0)
      first[in->dst] = i;
    end[in->dst] = i;
  }
  int owner[ES_FE_MAX_REGS]; /* register holding each slot, -1 when free */
  int n = 0, last = p->n_ins - 1;
  for (int s = 0; s < ES_FE_MAX_REGS; s++)
    owner[s] = -1;
  for (int i = 0; i < p->n_ins; i++) {
    const fe_insn *in = &p->ins[i];
    int d = in->dst;
    /* Operands read for the last time free their slot before dst takes
     * one: exact aliasing is safe. */
    int src[2] = {in->a, in->b};
    for (int s = 0; s < 2; s++)
      if (src[s] >= p->n_in && src[s] != d && end[src[s]] == i && owner[slot[src[s]]] == src[s])
        owner[slot[src[s]]] = -1;
    /* The last instruction stores into the output. */
    if (first[d] == i && i < last) {
      int s = 0;
      while (owner[s] >= 0)
        s++;
      owner[s] = d;
      slot[d] = s;
      n = s + 1 > n ? s + 1 : n;
    }
    /* Written and never read: dead at once. */
    if (end[d] == i && slot[d] >= 0 && owner[slot[d]] == d)
      owner[slot[d]] = -1;
  }
  return n;
}


/* t's dims as read by the broadcast into output o: as they are, or for a
 * channels-last output right-aligned to its rank and in (N, spatial..., C)
 * order. */
static void fe_view(const es_tdesc *t, const es_tdesc *o, int nhwc, int *rank, int64_t *dims) {
  *rank = t->rank;
  for (int i = 0; i < t->rank; i++)
    dims[i] = t->dims[i];
  if (!nhwc)
    return;
  *rank = o->rank;
  es__tdesc_cl_view(t, o->rank, dims);
}

/* Collapse the broadcast (design note) into p->rank, dims, strides. */
static int fe_collapse(es_kinst *k, fe_plan *p, const es_tdesc *o, int nhwc) {
  int n = k->n_in, orank;
  int64_t od[ES_MAX_RANK];
  fe_view(o, o, nhwc, &orank, od);
  int ir[ES_FE_MAX_REGS];
  int64_t id[ES_FE_MAX_REGS][ES_MAX_RANK];
  for (int i = 0; i < n; i++)
    fe_view(k->in[i], o, nhwc, &ir[i], id[i]);
  uint32_t mask[ES_MAX_RANK];
  int r = 0;
  for (int d = 0; d < orank; d++) {
    if (od[d] == 1)
      continue;
    uint32_t m = 0;
    for (int i = 0; i < n; i++) {
      int di = d - (orank - ir[i]);
      if (di >= 0 && id[i][di] == od[d])
        m |= 1u << i;
    }
    if (r > 0 && mask[r - 1] == m) {
      p->dims[r - 1] *= od[d];
      continue;
    }
    mask[r] = m;
    p->dims[r++] = od[d];
  }
  if (r == 0) { /* one element: every input is a single value */
    mask[0] = 0;
    p->dims[0] = 1;
    r = 1;
  }
  p->rank = r;
  p->strides = es__kinst_alloc(k, (size_t)r * (size_t)n * sizeof *p->strides);
  if (!p->strides)
    return ES_KFAIL(k, ES_ENOMEM, "out of memory for the plan");
  for (int i = 0; i < n; i++) {
    int64_t acc = 1;
    for (int d = r - 1; d >= 0; d--) {
      int full = mask[d] >> i & 1;
      p->strides[(size_t)d * (size_t)n + (size_t)i] = full ? acc : 0;
      acc *= full ? p->dims[d] : 1;
    }
  }
  return 0;
}

/* Block geometry. Rows of the innermost dim, cut into blocks, unless rows
 * are short (the per-block cost of running the program would dominate) and
 * the second-innermost dim lets blocks span several rows: every input is
 * then contiguous over both dims, one value, or a row repeated along the
 * second dim (a tile, such as [C] against NHWC [H*W, C]), which is copied
 * k times into scratch so a block of k rows reads it as a vector. An input
 * with one value per row cannot be read that way and keeps single rows.
 * Sets p->kind, row, block, tile, outer, slot_floats and the tiles' slots,
 * numbered from `first`; returns the number of tiles. */
static int fe_blocks(fe_plan *p, int first) {
  int r = p->rank, n = p->n_in;
  size_t len = (size_t)p->dims[r - 1];
  const int64_t *inner = p->strides + (size_t)(r - 1) * (size_t)n;
  const int64_t *mid = r >= 2 ? p->strides + (size_t)(r - 2) * (size_t)n : NULL;
  int multi = r >= 2 && len <= FE_BLOCK / 2;
  for (int i = 0; i < n && multi; i++)
    if (!inner[i] && mid[i])
      multi = 0;
  int tiles = 0;
  if (multi) {
    size_t m = (size_t)p->dims[r - 2], k = FE_BLOCK / len < m ? FE_BLOCK / len : m;
    p->row = m * len;
    p->block = k * len;
    p->tile = len;
    p->outer = r - 2;
  } else {
    p->row = len;
    p->block = len < FE_BLOCK ? len : FE_BLOCK;
    p->tile = 0;
    p->outer = r - 1;
  }
  p->slot_floats = (p->block + 15) / 16 * 16;
  for (int i = 0; i < n; i++) {
    p->kind[i] = !inner[i] ? FE_IN_SCALAR : multi && !mid[i] ? FE_IN_TILE : FE_IN_VEC;
    p->tile_slot[i] = p->kind[i] == FE_IN_TILE ? first + tiles++ : -1;
  }
  return tiles;
}

static int fe_infer(es_kinst *k) {
  if (k->n_out != 1 || !k->out[0])
    return ES_KFAIL(k, ES_EMODEL, "expects 1 output, got %d", k->n_out);
  if (k->n_in < 1 || k->n_in >= ES_FE_MAX_REGS)
    return ES_KFAIL(k, ES_EMODEL, "expects 1 to %d inputs, got %d", ES_FE_MAX_REGS - 1, k->n_in);
  for (int i = 0; i < k->n_in; i++) {
    if (!k->in[i])
      return ES_KFAIL(k, ES_EMODEL, "input %d is omitted; every input is required", i);
    if (k->in[i]->dtype != ES_DTYPE_FLOAT)
      return ES_KFAIL(k, ES_EMODEL, "input %d has type %s, expected float32", i,
                      es_dtype_name(k->in[i]->dtype));
  }
  fe_plan *p = es__kinst_alloc(k, sizeof *p);
  int *slot = es__kinst_alloc(k, ES_FE_MAX_REGS * sizeof *slot);
  if (!p || !slot)
    return ES_KFAIL(k, ES_ENOMEM, "out of memory for the plan");
  p->n_in = k->n_in;
  p->slot = slot;
  int rc = fe_parse(k, p);
  if (rc < 0)
    return rc;

  es_tdesc acc = *k->in[0];
  for (int i = 1; i < k->n_in; i++) {
    int rank;
    int64_t dims[ES_MAX_RANK];
    if ((rc = es__broadcast_shape(k, &acc, k->in[i], &rank, dims)) < 0)
      return rc;
    acc.rank = rank;
    memcpy(acc.dims, dims, sizeof dims);
  }
  int nhwc;
  if ((rc = es__broadcast_layout_pick(k, k->n_in, acc.rank, &nhwc)) != 0)
    return rc;
  es_tdesc *o = k->out[0];
  if ((rc = es__tdesc_set(o, ES_DTYPE_FLOAT, acc.rank, acc.dims)) < 0)
    return rc;
  if (nhwc)
    o->layout = ES_LAYOUT_NHWC;
  p->count = o->count;
  if ((rc = fe_collapse(k, p, o, nhwc)) < 0)
    return rc;
  int nslots = fe_slots(p, slot);
  nslots += fe_blocks(p, nslots);
  k->scratch_bytes = p->count ? (size_t)nslots * p->slot_floats * sizeof(float) : 0;
  k->params = p;
  /* Same shape as the output: in either layout, the output's bytes order. */
  k->inplace = -1;
  for (int i = 0; i < k->n_in && k->inplace < 0; i++)
    if (es__tdesc_same_shape(k->in[i], o))
      k->inplace = i;
  return 0;
}

/* ==========================================================================
 * Running
 * ======================================================================== */

/* Register file for one block: a vector (v) or, where v is NULL, a value. */
typedef struct fe_regs {
  const float *v[ES_FE_MAX_REGS];
  float s[ES_FE_MAX_REGS];
} fe_regs;

#define FE_BIN_CASE(OPC, NAME)                                                            \
  case OPC:                                                                               \
    if (!va && !vb) {                                                                     \
      val = NAME(sa, sb);                                                                 \
      break;                                                                              \
    }                                                                                     \
    if (!va)                                                                              \
      NAME##_sv(sa, vb, d, n);                                                            \
    else if (!vb)                                                                         \
      NAME##_vs(va, sb, d, n);                                                            \
    else                                                                                  \
      NAME##_vv(va, vb, d, n);                                                            \
    vec = 1;                                                                              \
    break;

#define FE_UN_CASE(OPC, NAME)                                                             \
  case OPC:                                                                               \
    if (!va) {                                                                            \
      val = NAME(sa, in->p, in->q);                                                       \
      break;                                                                              \
    }                                                                                     \
    NAME##_v(va, d, n, in->p, in->q);                                                     \
    vec = 1;                                                                              \
    break;

/* Runs the program over one block of n elements whose inputs are in R;
 * the result goes to out. */
FE_CLONES static void fe_block(const fe_plan *p, fe_regs *R, float *scratch, float *out,
                                size_t n) {
  for (int i = 0; i < p->n_ins; i++) {
    const fe_insn *in = &p->ins[i];
    const float *va = NULL, *vb = NULL;
    float sa = in->fa, sb = in->fb;
    if (in->a >= 0) {
      va = R->v[in->a];
      sa = R->s[in->a];
    }
    if (in->b >= 0) {
      vb = R->v[in->b];
      sb = R->s[in->b];
    }
    int last = i == p->n_ins - 1;
    float *d = last ? out : scratch + (size_t)p->slot[in->dst] * p->slot_floats;
    float val = 0;
    int vec = 0;
    switch (in->op) {
      FE_BIN_CASE(ES_FE_ADD, fe_add)
      FE_BIN_CASE(ES_FE_SUB, fe_sub)
      FE_BIN_CASE(ES_FE_MUL, fe_mul)
      FE_BIN_CASE(ES_FE_DIV, fe_div)
      FE_BIN_CASE(ES_FE_POW, fe_pow)
      FE_UN_CASE(FE_SQUARE, fe_square)
      FE_UN_CASE(FE_POW_SQRT, fe_sqrt)
      FE_UN_CASE(ES_FE_SQRT, fe_sqrt)
      FE_UN_CASE(ES_FE_RELU, fe_relu)
      FE_UN_CASE(ES_FE_SIGMOID, fe_sigmoid)
      FE_UN_CASE(ES_FE_HARDSIGMOID, fe_hardsigmoid)
      FE_UN_CASE(ES_FE_CLIP, fe_clip)
      FE_UN_CASE(ES_FE_MOV, fe_mov)
      FE_BIN_CASE(ES_FE_MAX, fe_max)
      FE_BIN_CASE(ES_FE_MIN, fe_min)
      FE_BIN_CASE(ES_FE_PRELU, fe_prelu)
      FE_UN_CASE(ES_FE_ABS, fe_abs)
      FE_UN_CASE(ES_FE_NEG, fe_neg)
      FE_UN_CASE(ES_FE_EXP, fe_exp)
      FE_UN_CASE(ES_FE_LOG, fe_log)
      FE_UN_CASE(ES_FE_TANH, fe_tanh)
      FE_UN_CASE(ES_FE_ERF, fe_erf)
      FE_UN_CASE(ES_FE_RECIPROCAL, fe_reciprocal)
      FE_UN_CASE(ES_FE_FLOOR, fe_floor)
      FE_UN_CASE(ES_FE_CEIL, fe_ceil)
      FE_UN_CASE(ES_FE_ROUND, fe_round)
      FE_UN_CASE(ES_FE_SIGN, fe_sign)
      FE_UN_CASE(ES_FE_SOFTPLUS, fe_softplus)
      FE_UN_CASE(ES_FE_SOFTSIGN, fe_softsign)
      FE_UN_CASE(ES_FE_MISH, fe_mish)
      FE_UN_CASE(ES_FE_HARDSWISH, fe_hardswish)
      FE_UN_CASE(ES_FE_GELU, fe_gelu)
      FE_UN_CASE(ES_FE_GELU_TANH, fe_gelu_tanh)
      FE_UN_CASE(ES_FE_LEAKYRELU, fe_leakyrelu)
      FE_UN_CASE(ES_FE_ELU, fe_elu)
      FE_UN_CASE(ES_FE_SELU, fe_selu)
      FE_UN_CASE(ES_FE_CELU, fe_celu)
      FE_UN_CASE(ES_FE_THRESHOLDEDRELU, fe_thresholdedrelu)
      FE_UN_CASE(ES_FE_SHRINK, fe_shrink)
    default:
      break;
    }
    if (vec) {
      R->v[in->dst] = d;
    } else {
      R->v[in->dst] = NULL;
      R->s[in->dst] = val;
      if (last)
        for (size_t j = 0; j < n; j++)
          out[j] = val;
    }
  }
}

static int fe_run(const es_kinst *k, const void *const *in, void *const *out, void *scratch) {
  const fe_plan *p = k->params;
  if (p->count == 0)
    return 0;
  int n_in = p->n_in;
  size_t rows = p->count / p->row;
  int64_t off[ES_FE_MAX_REGS] = {0}, idx[ES_MAX_RANK] = {0}, tiled[ES_FE_MAX_REGS];
  fe_regs R = {{0}, {0}};
  float *o = out[0];
  for (size_t t = 0; t < rows; t++, o += p->row) {
    /* Tiles: the input's row, repeated to fill a block, when it changes. */
    for (int i = 0; i < n_in; i++)
      if (p->kind[i] == FE_IN_TILE && (t == 0 || tiled[i] != off[i])) {
        tiled[i] = off[i];
        float *dst = (float *)scratch + (size_t)p->tile_slot[i] * p->slot_floats;
        const float *src = (const float *)in[i] + off[i];
        for (size_t j = 0; j < p->block; j += p->tile)
          memcpy(dst + j, src, p->tile * sizeof *src);
      }
    for (size_t j = 0; j < p->row; j += p->block) {
      size_t n = p->row - j < p->block ? p->row - j : p->block;
      for (int i = 0; i < n_in; i++) {
        const float *x = (const float *)in[i] + off[i];
        R.v[i] = p->kind[i] == FE_IN_VEC    ? x + j
                 : p->kind[i] == FE_IN_TILE ? (const float *)scratch +
                                                  (size_t)p->tile_slot[i] * p->slot_floats
                                            : NULL;
        R.s[i] = *x;
      }
      fe_block(p, &R, scratch, o + j, n);
    }
    es__walk_step(p->outer, p->dims, idx, n_in, off, p->strides);
  }
  return 0;
}

/* ==========================================================================
 * Family lookup
 * ======================================================================== */

static const es_kernel fe_kernel = {fe_infer, fe_run, NULL, ES_KLAYOUT_5D};

const es_kernel *es__kernels_fused(es_op op) {
  return op == ES_OP_FusedElementwise ? &fe_kernel : NULL;
}
