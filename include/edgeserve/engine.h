/* edgeserve/engine.h - models: load, describe, (later) plan and run.
 *
 *   es_model *m;
 *   if (es_model_load("det.onnx", NULL, &m) < 0)
 *     fprintf(stderr, "%s\n", es_last_error_detail());
 *   es_tensor_info in;
 *   es_model_input_info(m, 0, &in);     // name "x", float32, [-1,3,-1,-1]
 *   es_model_release(m);
 *
 * A model is immutable once loaded: its graph and its weights (one read-only
 * copy in an es_weights region) are shared by every request and thread.
 * Reference-counted; all functions are thread-safe.
 */
#ifndef EDGESERVE_ENGINE_H
#define EDGESERVE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "edgeserve/error.h"
#include "edgeserve/types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct es_tensor_info {
  const char *name; /* owned by the model */
  es_dtype dtype;
  int rank;         /* -1 when the model does not say */
  int64_t dims[ES_MAX_RANK]; /* -1 for a dimension fixed only at run time */
} es_tensor_info;

typedef struct es_model es_model;

typedef struct es_model_stats {
  size_t nodes;        /* after dead-node removal and load-time folding */
  size_t constants;    /* constants kept (initializers, Constant nodes, folded
                          results that something still reads) */
  size_t weight_bytes; /* bytes of constant data the model reads (read-only) */
  size_t weight_file_bytes; /* of weight_bytes, those read in place from the ONNX file's
                               shared mapping (stored there as they are, aligned) rather
                               than copied: page cache, one copy for every process */
  size_t folded_nodes; /* nodes with constant inputs evaluated at load */
  size_t folded_bn;    /* BatchNormalization nodes merged into a Conv */
  size_t elided;       /* Identity and inference Dropout nodes removed at load */
  size_t context_bytes;/* graph and attribute memory */
  int64_t opset;       /* default-domain opset */
  int compiled;          /* 1: loaded from a compiled .esm file (mapped, shared) */
  int compiled_prepared; /* prepared-weight entries used from the .esm */
  int stale_compiled;    /* 1: an .esm was asked for but its source model next to it
                            has another checksum, so the source was loaded instead */
  size_t prepared_bytes; /* reordered weights this model's plans asked for (not those
                            of a compiled .esm), made here or mapped from the cache */
  size_t prepared_cached_bytes; /* of prepared_bytes, mapped from the prepared-weights
                                   cache's files (es_engine_cache_dir_set): page cache,
                                   one copy for every process */
  uint64_t prepared_cache_hits;   /* plans whose new prepared weights the cache held */
  uint64_t prepared_cache_writes; /* plans whose new prepared weights went into it */
  uint64_t prepared_cache_errors; /* cache files that could not be written or did not
                                     check out (removed): those plans made their own */
  int64_t ir_version;
  size_t weights_resident; /* of weight_bytes, pages resident in RAM now (mincore) */
  size_t int8_nodes;       /* convolutions and matrix products that run in int8 (QLinearConv,
                              QLinearMatMul: a QDQ model's are lowered to them at load) */
  size_t float_nodes;      /* those that run in float32 (Conv, ConvTranspose, MatMul, Gemm) */
  size_t bf16_nodes;       /* those that run in bfloat16 (ES_PRECISION_BF16) */
  size_t w8_nodes;         /* of float_nodes, Convs whose weights the model holds in int8
                              (weight-only: a float Conv by DequantizeLinear of int8
                              weights, dequantized into the arena on each run) */
} es_model_stats;

/* ===========================================================================
 * Precision: what a model's convolutions and matrix products compute in.
 *
 *   es_model_options o = {.precision = ES_PRECISION_BF16};
 *   if (es_model_load("det.onnx", &o, &m) < 0)   // ES_ENOTSUP on a CPU
 *     puts(es_last_error_detail());               // without avx512_bf16
 *
 * AUTO (the default, NULL options): as the file says: float32, and int8
 *   where the file is quantized (QDQ pairs around a Conv, a MatMul by int8
 *   weights and an Add are lowered at load to QLinearConv, QLinearMatMul
 *   and QLinearAdd; the QOperator format's nodes run as they are).
 * FP32: the same, and the model must not be quantized (ES_EINVAL names
 *   the quantized nodes; a compiled .esm made for bf16 is refused too).
 * INT8: the model must be quantized (ES_EINVAL otherwise: make one with
 *   `edgeserve quantize` or es_quantizer_*); its float nodes stay float32.
 * BF16: every Conv and every MatMul by static weights runs in bfloat16
 *   through oneDNN: weights prepared in bf16 (half the bytes of float32),
 *   the source rounded to bf16 into the plan's scratch before each run,
 *   products accumulated and written in float32; every other node, and a
 *   quantized model's int8 nodes, as they are. Needs a CPU with avx512_bf16
 *   or AMX: elsewhere the load fails with ES_ENOTSUP naming the feature. A
 *   model compiled (.esm) in bf16 keeps its bf16 weights and is refused by
 *   FP32; one compiled in float32 is refused by BF16 (compile again). With
 *   reference kernels (es_engine_reference_kernels_set) they run float32.
 * ========================================================================= */

typedef enum es_precision {
  ES_PRECISION_AUTO = 0,
  ES_PRECISION_FP32 = 1,
  ES_PRECISION_BF16 = 2,
  ES_PRECISION_INT8 = 3,
} es_precision;

typedef struct es_model_options {
  es_precision precision;
} es_model_options;

/* "auto", "fp32", "bf16", "int8" (and "float32", "bfloat16" when parsing).
 * parse: ES_EINVAL for anything else, with the accepted names. */
ES_API const char *es_precision_name(es_precision p);
ES_API int es_precision_parse(const char *s, es_precision *out);
/* 0 when this CPU (as oneDNN sees it, ONEDNN_MAX_CPU_ISA included) runs
 * bf16 convolutions natively; ES_ENOTSUP otherwise, the detail naming the
 * missing feature. Thread-safe. */
ES_API int es_engine_bf16_check(void);

/* Load an ONNX file. A malformed, truncated or hostile file gives an error
 * (ES_EMODEL, ES_ENOTSUP for an operator, dtype or feature outside what the
 * engine runs, ES_EINVAL for protobuf messages nested deeper than 64
 * levels) whose detail names the node and operator; never a crash. With
 * ES_ENOTSUP the detail lists everything unsupported the model holds (the
 * first items and how many more; es_model_check gives all). The engine
 * runs opsets 7 to 21 of the default ONNX domain ("" or "ai.onnx").
 * opts may be NULL (precision AUTO; see es_model_options). The caller
 * holds one reference. */
ES_API int es_model_load(const char *path, const es_model_options *opts, es_model **out);
/* Same from a buffer the caller keeps ownership of (may be freed after). */
ES_API int es_model_load_buffer(const void *data, size_t size, const es_model_options *opts,
                                es_model **out);

/* ===========================================================================
 * What a model needs that the engine cannot run, listed at once.
 *
 *   static void show(void *user, const es_model_issue *it) {
 *     printf("%s x%d\n", it->what, it->count);   // "Erf x12", "element type float16 x1"
 *   }
 *   es_model_check_info info;
 *   int rc = es_model_check("net.onnx", NULL, 0, show, NULL, &info);
 *   // rc 0: it runs; ES_ENOTSUP: info.issues items were shown
 *
 * es_model_load refuses such a model with ES_ENOTSUP, and its detail lists
 * the first items ("Erf x12 (nodes 'a', 'b', ...); ...; and 3 more").
 * es_model_check gives every item, with every count: operators the engine
 * does not run (and other domains, operators newer than the model's opset),
 * element types and kinds of types of inputs, outputs and constants, and
 * the nodes inside If, Loop and Scan bodies, which are walked although the
 * engine runs no subgraph yet. Dead nodes, Identity, inference Dropout and
 * constant subgraphs the engine can fold are not listed. When every input's
 * shape is concrete (the model's own or given), the model is also planned,
 * and each node whose kernel refuses an attribute or type is listed (nodes
 * after one that cannot run are not reached: info.unreached).
 * ========================================================================= */

typedef struct es_model_issue {
  const char *what;  /* the item: "Erf", "Resize: mode 'cubic' is not supported",
                        "element type float16", "Erf (domain 'com.microsoft')" */
  const char *first; /* the full message about its first place */
  int count;         /* places it concerns */
  int nodes;         /* 1: the places are nodes, written 'name' or #index (the node's
                        position in its graph); 0: values ("input 'x'",
                        "constant 'w'", "output 'y'") */
  int n_where;       /* places named in where: the first ones, at most 8 */
  const char *const *where;
} es_model_issue;

typedef struct es_model_check_info {
  int issues;      /* distinct items (calls of fn) */
  int places;      /* their counts summed */
  int planned;     /* 1: planned for concrete input shapes, so the kernels' own
                      checks ran too; 0: some input's shape is open (pass shapes) */
  int unreached;   /* nodes the plan could not check: an input comes from a node
                      that cannot run */
  int64_t opset, ir_version;
} es_model_check_info;

/* Checks the ONNX (or .esm) file at path: fn (may be NULL) is called once
 * per item, in the order found; info (may be NULL) is filled. shapes: for
 * the inputs they name (es_tensor_info.name; rank and dims), the shapes to
 * plan with; other inputs keep the model's. Returns 0 when the model can
 * run, ES_ENOTSUP when it cannot (the detail as es_model_load's), and other
 * errors as es_model_load for a file that is not a valid model (no list),
 * or ES_EINVAL for a shape naming no input. Thread-safe; items live only
 * during fn. */
ES_API int es_model_check(const char *path, const es_tensor_info *shapes, int n_shapes,
                          void (*fn)(void *user, const es_model_issue *issue), void *user,
                          es_model_check_info *info);
/* Same from a buffer the caller keeps. */
ES_API int es_model_check_buffer(const void *data, size_t size, const es_tensor_info *shapes,
                                 int n_shapes, void (*fn)(void *user, const es_model_issue *issue),
                                 void *user, es_model_check_info *info);

/* One more reference; returns m, or NULL (no reference taken) for NULL or a
 * handle that is not a live model. Thread-safe. */
ES_API es_model *es_model_retain(es_model *m);
/* Drop a reference; the last one frees the graph and unmaps the weights.
 * NULL is a no-op. */
ES_API void es_model_release(es_model *m);

ES_API int es_model_input_count(const es_model *m);
ES_API int es_model_output_count(const es_model *m);
/* i in [0, count). ES_EINVAL otherwise. */
ES_API int es_model_input_info(const es_model *m, int i, es_tensor_info *out);
ES_API int es_model_output_info(const es_model *m, int i, es_tensor_info *out);
ES_API int es_model_stats_get(const es_model *m, es_model_stats *out);

/* Write a compiled model file (.esm): the prepared graph, its weights and
 * the weights already reordered by plans made so far (plan the shapes you
 * serve first), 64-byte aligned; source_path (may be NULL) is the ONNX file,
 * recorded by name and SHA-256 so a changed source is noticed.
 * es_model_load recognises .esm files and maps them read-only and shared.
 * Written to a temporary name, then renamed. Thread-safe. */
ES_API int es_model_compile(es_model *m, const char *source_path, const char *out_path);

/* Number of nodes of each operator type, for inspect: calls fn once per
 * operator present, in a stable order. */
ES_API int es_model_op_counts(const es_model *m, void (*fn)(void *user, const char *op, int count),
                       void *user);

/* ===========================================================================
 * Plans and runs.
 *
 * A plan is the model prepared for one concrete set of input shapes: every
 * tensor's shape, shape chains folded, kernels prepared, and every
 * intermediate tensor and kernel scratch given an offset in one request
 * arena. es_plan_arena_bytes() is the exact arena size a request needs, known
 * before it runs; a run allocates nothing else.
 *
 *   es_tensor_info shape = {.name = "x", .dtype = ES_DTYPE_FLOAT, .rank = 4,
 *                           .dims = {1, 3, 640, 640}};
 *   es_plan *p;
 *   es_model_plan(m, &shape, 1, &p);
 *   es_arena *a;
 *   es_arena_create(es_plan_arena_bytes(p), 64, &a);
 *   es_tensor in = {.data = pixels, ...}, out[1];
 *   es_plan_run(p, &in, 1, a, out, 1);      // out[0].data points into a
 * ========================================================================= */

typedef struct es_plan es_plan;
struct es_arena;

typedef struct es_tensor {
  const char *name; /* outputs: owned by the model */
  es_dtype dtype;
  int rank;
  int64_t dims[ES_MAX_RANK];
  void *data;
  size_t nbytes;
} es_tensor;

/* Plan for concrete input shapes: shapes[i] for model input i (n must equal
 * the input count; names are not used). The plan holds a reference to the
 * model. ES_EINVAL when a shape contradicts the model (rank, a fixed
 * dimension, dtype); ES_EMODEL / ES_ENOTSUP naming the node when an operator
 * cannot run with these shapes (ES_ENOTSUP: the nodes that cannot are all
 * listed, planning goes past each). Thread-safe; the plan is immutable and may
 * be run by any number of threads at once. */
ES_API int es_model_plan(es_model *m, const es_tensor_info *shapes, int n, es_plan **out);
/* Plans are reference-counted: es_model_plan returns one reference. One
 * more; returns p, or NULL (no reference taken) for NULL or a handle that is
 * not a live plan. Thread-safe. */
ES_API es_plan *es_plan_retain(es_plan *p);
/* Drop a reference; the last one frees the plan. NULL is a no-op. */
ES_API void es_plan_release(es_plan *p);

/* ===========================================================================
 * Plan cache: plans of one model by input shape, bounded, least recently
 * used evicted. Optional bucketing rounds chosen dimensions up to a multiple
 * (e.g. rec's width to 32) so that few plans cover many shapes; the caller
 * then pads its input to the plan's input shape (es_plan_input_info).
 *
 *   es_plan_cache *c;
 *   es_plan_cache_create(m, 8, &c);
 *   es_plan_cache_bucket(c, 0, 3, 32);        // input 0, dim 3: multiple of 32
 *   es_plan *p;
 *   es_plan_cache_get(c, shapes, 1, &p);       // planned once, then reused
 *   ... es_plan_input_info(p, 0, &padded) ...
 *   es_plan_release(p);
 *
 * The cache holds a reference to the model and one to each cached plan.
 * Thread-safe.
 * ========================================================================= */

typedef struct es_plan_cache es_plan_cache;

typedef struct es_plan_cache_stats {
  size_t capacity, entries;
  uint64_t hits, misses, evictions;
  size_t context_bytes;   /* plan memory of the cached plans */
  size_t max_arena_bytes; /* largest planned arena among them */
} es_plan_cache_stats;

/* capacity in [1, 4096]. */
ES_API int es_plan_cache_create(es_model *m, size_t capacity, es_plan_cache **out);
/* NULL is a no-op; plans still referenced elsewhere stay alive. */
ES_API void es_plan_cache_destroy(es_plan_cache *c);
/* Round dimension dim of input `input` up to a multiple of `multiple`
 * (>= 1) before planning. Affects later gets. */
ES_API int es_plan_cache_bucket(es_plan_cache *c, int input, int dim, int64_t multiple);
/* A plan for these shapes (after bucketing), from the cache or planned now.
 * *out holds a new reference. Errors as es_model_plan. */
ES_API int es_plan_cache_get(es_plan_cache *c, const es_tensor_info *shapes, int n, es_plan **out);
ES_API int es_plan_cache_stats_get(es_plan_cache *c, es_plan_cache_stats *out);
/* Calls fn for each cached plan, most recently used first. */
ES_API int es_plan_cache_each(es_plan_cache *c, void (*fn)(void *user, const es_plan *p),
                              void *user);

/* Exact bytes of request arena a run needs (64-byte aligned arena). */
ES_API size_t es_plan_arena_bytes(const es_plan *p);
/* Bytes of plan memory (shapes, folded constants, kernel parameters). */
ES_API size_t es_plan_context_bytes(const es_plan *p);
ES_API int es_plan_output_count(const es_plan *p);
/* Shape and type of output i for this plan. For an output whose shape the
 * data decides (es_plan_bound_count), the largest it can be: a run's
 * es_tensor carries the actual one. */
ES_API int es_plan_output_info(const es_plan *p, int i, es_tensor_info *out);

/* Data-dependent shapes. Some operators' output shapes depend on input
 * values (NonZero, NonMaxSuppression, TopK with k from a tensor); the plan
 * places each such tensor, and every tensor computed from one, at the
 * largest shape its data can give, derived from shapes, attributes and
 * constant inputs, so es_plan_arena_bytes() still bounds what a run takes.
 * A run carries each tensor's actual shape with it and the nodes after a
 * bounded one are inferred again for the actual shapes (in a region of the
 * arena the plan counts). A run whose data would outgrow a bound (only a
 * shape computation that shrinks as its inputs grow can) fails with
 * ES_EBOUND, writing nothing past it.
 *
 * es_plan_bound_count: the values planned at a bound (0: a static plan).
 * es_plan_bound_info: value i's name, the node making it, what bounds it
 * (why: "" for a value whose bound follows from the values it is computed
 * from), the bound shape and its bytes, which of its dims the data
 * decides (bit d for dim d; set with why), and the most bytes the value
 * took in the runs made while profiling was on (es_engine_profile_set; 0
 * when none ran). Strings are owned by the plan. */
typedef struct es_bound_info {
  const char *value;
  const char *node;
  const char *why;
  es_tensor_info bound;
  uint32_t data_dims;
  size_t bound_bytes;
  size_t seen_bytes;
} es_bound_info;
ES_API int es_plan_bound_count(const es_plan *p);
ES_API int es_plan_bound_info(const es_plan *p, int i, es_bound_info *out);
ES_API int es_plan_input_info(const es_plan *p, int i, es_tensor_info *out);
/* Number of nodes run per request (the others were folded while planning). */
ES_API int es_plan_node_count(const es_plan *p);
/* Layout conversions (NCHW <-> NHWC) among those nodes. */
ES_API int es_plan_relayout_count(const es_plan *p);
/* Intra-op threads for plans made and runs made by the calling thread
 * (oneDNN fixes a primitive's threads when the plan creates it, so plan on
 * a thread with the setting the runs will use). Default 1
 * (throughput mode: one request per core, no oversubscription when several
 * workers run at once); more for latency mode. ES_EINVAL outside 1..1024. */
ES_API int es_engine_threads_set(int n);

/* Process-wide switches for comparisons and debugging; thread-safe. The
 * library reads no environment variables: the CLI maps ES_KERNELS=ref and
 * ES_FUSE=0 to these.
 * reference_kernels: plans made after the call run Conv, ConvTranspose and
 * MatMul with the plain C reference kernels instead of oneDNN (default 0).
 * fusion: models loaded after the call get the load-time fusion passes
 * (activations into Conv, elementwise chains, LayerNorm; default 1). */
ES_API void es_engine_reference_kernels_set(int on);
ES_API void es_engine_fusion_set(int on);

/* Weights locked in RAM (BRIEF 4: a model's pages never paged out, so no
 * request stalls on a fault and the kernel cannot evict them under
 * pressure). While on, models loaded after the call lock their constants
 * (the weights region and the file mapping they are read from in place, or
 * a compiled .esm's mapping) and every prepared-weights region their plans
 * make or map; a lock that fails fails the load or plan with ES_EMEMLOCK,
 * naming RLIMIT_MEMLOCK, the bytes needed and the fix (ulimit -l,
 * LimitMEMLOCK=, CAP_IPC_LOCK). es_weights_locked_bytes() counts what is
 * locked. Off by default. Thread-safe. */
ES_API void es_engine_mlock_set(int on);
ES_API int es_engine_mlock_get(void);

/* The prepared-weights cache. Planning reorders every Conv and MatMul's
 * static weights into oneDNN's layout for this CPU, into fresh memory (for
 * vit_b_16, 311 MB: most of its load and plan time). With a cache directory
 * set, models loaded from an ONNX file after the call keep those weights in
 * files there: the first plan of a model writes them (synced, then renamed
 * into place), and every later load of the same file (same path, inode,
 * size and times, same edgeserve, oneDNN and CPU ISA) maps them read-only
 * and shared instead of making them: no reorder, no fresh memory, one
 * physical copy for every process on the box. A file that does not check
 * out is removed and made again; a directory that cannot be written only
 * costs the cache (es_model_stats counts errors). Nothing is evicted.
 * dir NULL or "" turns it off (the default). ES_EINVAL for a path too long.
 * _get copies the directory ("" when off) into buf and returns its length.
 * Thread-safe. */
ES_API int es_engine_cache_dir_set(const char *dir);
ES_API int es_engine_cache_dir_get(char *buf, size_t size);

/* Safe points inside long kernels, for cooperative preemption.
 * es_engine_split_set: plans made after the call run every channels-last
 * 2-D convolution of more than flops floating-point operations as bands
 * of output rows of about that size (each its own oneDNN primitive over
 * the same prepared weights, reading and writing its rows in place), with
 * a safe point between two bands. 0 (the default): never. Process-wide,
 * thread-safe; a runtime that preempts sets it (es_runtime_config.preempt).
 * es_engine_safe_point_set: the calling thread's hook, called with user at
 * every safe point of the runs the thread makes (between two plan steps
 * the caller of es_run_steps looks itself); NULL removes it. The hook may
 * run other plans to their end on this thread, in their own arenas (a more
 * urgent request); it must not touch the run it interrupts. */
ES_API void es_engine_split_set(uint64_t flops);
ES_API uint64_t es_engine_split_get(void);
ES_API void es_engine_safe_point_set(void (*fn)(void *user), void *user);

/* Profiling: while on, every run also times each node (two clock reads per
 * node) and adds the time to its plan. Off by default. Thread-safe. */
ES_API void es_engine_profile_set(int on);
/* Per operator type: nodes run per request and mean milliseconds per
 * profiled run. fn is called once per operator present. */
ES_API int es_plan_profile(const es_plan *p,
                    void (*fn)(void *user, const char *op, int nodes, double ms_per_run),
                    void *user);
/* Per node, in run order: its label ("node 'name' (#12 Conv)"; a step the
 * planner added, such as a layout conversion, has its own), mean
 * milliseconds per profiled run, and its floating-point operations per run
 * (0 for the nodes that do not count them). fn is called once per step. */
ES_API int es_plan_profile_nodes(const es_plan *p,
                                 void (*fn)(void *user, const char *label, double ms_per_run,
                                            uint64_t flops),
                                 void *user);

/* Floating-point operations per run of the compute-heavy nodes (Conv,
 * ConvTranspose, MatMul: 2 x multiply-adds), for GFLOP/s figures. */
ES_API uint64_t es_plan_flops(const es_plan *p);

/* Run one request. inputs[i] must have the plan's dtype and shape for input
 * i (ES_EINVAL otherwise, naming the input). Temporaries and outputs are
 * carved from arena (es_plan_arena_bytes() of it, alignment >= 64);
 * outputs[i].data points into the arena (or, for an output the plan folded
 * to a constant, into plan memory) and stays valid until the arena is reset
 * and the plan is held. ES_ENOSPC when the arena has too little room left.
 * Thread-safe for distinct arenas. */
ES_API int es_plan_run(const es_plan *p, const es_tensor *inputs, int n_in, struct es_arena *arena,
                es_tensor *outputs, int n_out);

/* Memory no bound covers. Some models give the planner no bound for a
 * tensor: a Loop whose carried values grow every iteration, a Resize to
 * sizes computed from the pixels. The nodes from there on (and every Loop
 * and Scan: its body runs once per iteration) are run without a plan:
 * each is inferred when the request reaches it, its memory taken from a
 * run heap and given back after its last reader. es_plan_unbounded_count
 * says how many (0: the arena is all a run takes). es_plan_unbounded_info
 * names the first of them and why it has no bound.
 *
 * A run heap: alloc puts a 64-byte aligned block of at least bytes in
 * *out and returns 0, or returns a negative error with its detail set
 * (ES_EAGAIN: not now, the request may be sent again; the runtime's heap
 * is its buddy pool charged to the request's admission, and refuses so
 * when the reservation cannot grow). free gives a block back. Called from
 * the thread running the plan only. */
typedef struct es_run_heap {
  int (*alloc)(void *user, size_t bytes, void **out);
  void (*free)(void *user, void *ptr);
  void *user;
} es_run_heap;

/* A run heap over es_mem's engine heap that counts its blocks: what
 * es_plan_run uses, and what `edgeserve run` prints the peak of. Blocks
 * are 64-byte aligned, each with a 64-byte header holding its size. With
 * limit (0: none) a block that would take more than limit bytes out at
 * once is refused (ES_EAGAIN), counted in refusals. The heap returned
 * points at *state, which must outlive it; one thread at a time. */
typedef struct es_mem_heap {
  size_t cur, peak, limit;
  uint64_t refusals;
} es_mem_heap;
ES_API es_run_heap es_mem_heap_make(es_mem_heap *state);

ES_API int es_plan_unbounded_count(const es_plan *p);
/* 1 when output i is made without a plan (es_plan_output_info then gives
 * its declared type and rank, dims 0), else 0. */
ES_API int es_plan_output_unbounded(const es_plan *p, int i);
/* The first node run without a plan (its label) and why ("the outputs of
 * Loop ... grow with its iterations"); "" for both when there is none.
 * Strings owned by the plan. */
ES_API int es_plan_unbounded_info(const es_plan *p, const char **node, const char **why);

/* es_plan_run, the unbounded part's memory from heap (NULL: es_mem's
 * engine heap). Outputs that part makes are heap blocks: their data stays
 * valid until es_plan_outputs_free gives them back (the others point into
 * the arena as with es_plan_run). On failure nothing is left on the heap.
 * es_plan_run itself runs such a plan with es_mem's heap and copies those
 * outputs into the arena's room after es_plan_arena_bytes() (ES_ENOSPC
 * when it has too little). */
ES_API int es_plan_run_heap(const es_plan *p, const es_tensor *inputs, int n_in,
                            struct es_arena *arena, const es_run_heap *heap, es_tensor *outputs,
                            int n_out);
/* Runs in steps: resumable. A run is a loop over the plan's steps
 * (es_plan_node_count of them); an es_run holds where one is, so it can
 * stop between any two steps and go on later, on this thread or another,
 * its arena and inputs left as they are: pausing copies nothing and
 * allocates nothing. How a worker lets an urgent request through without
 * waiting for a whole run of another model.
 *
 *   es_run r;
 *   es_run_begin(&r, p, in, 1, arena, NULL);   // takes the plan's arena block
 *   while (es_run_steps(&r, 1) > 0)            // one step at a time
 *     if (urgent) { ... run something else in its own arena ... }
 *   es_run_finish(&r, out, 1);                 // what is left, then outputs
 *
 * The es_run lives where the caller puts it (no allocation) and must not
 * be moved while live; the inputs, the arena and the heap must stay until
 * it is finished or aborted. es_run_begin checks as es_plan_run_heap does.
 * es_run_steps runs up to max_steps more steps (<= 0: all) and returns how
 * many are left, or a negative error (the run is over then). es_run_finish
 * runs the steps left and the part no bound covers (whole: it does not
 * pause), and fills outputs as es_plan_run_heap does; the run is over
 * after it, whatever it returns. es_run_abort drops a run (a cancelled
 * one): nothing to free, its arena is the caller's. es_run_progress: steps
 * done and in all. One thread at a time per es_run. */
typedef struct es_run {
  uint64_t opaque[32];
} es_run;
ES_API int es_run_begin(es_run *r, const es_plan *p, const es_tensor *inputs, int n_in,
                        struct es_arena *arena, const es_run_heap *heap);
ES_API int es_run_steps(es_run *r, int max_steps);
ES_API int es_run_progress(es_run *r, int *done, int *total);
ES_API int es_run_finish(es_run *r, es_tensor *outputs, int n_out);
ES_API void es_run_abort(es_run *r);

/* Gives back the outputs of es_plan_run_heap that are heap blocks (the same
 * heap), setting their data to NULL; others are left. */
ES_API void es_plan_outputs_free(const es_plan *p, const es_run_heap *heap, es_tensor *outputs,
                                 int n_out);

#ifdef __cplusplus
}
#endif
#endif
