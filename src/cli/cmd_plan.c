/* edgeserve plan: the capacity planner (BRIEF §5).
 *
 *   Total = M_weights + N x M_per_request(shape) + M_runtime
 *
 * Every term is measured, not guessed: each distinct model file is loaded
 * once (its read-only weights, the weights reordered for this CPU and the
 * graph memory count once however many shapes name it), each model-at-shape
 * is planned (the plan's context bytes and the exact arena bytes a request
 * needs), and the runtime overhead comes from the process's own RSS. The
 * budget is the cgroup limit the process runs under, else what the machine
 * has available, else --memory. Then
 *
 *   free = budget - reserve - fixed    (fixed = weights + prepared + model
 *                                       contexts + plan contexts + runtime)
 *   per_request = ceil(arena x margin)
 *   N = floor(free / per_request)
 *
 * "alone" gives all of free to one model-at-shape's requests; "mix" admits
 * one request of each model-at-shape in turn (round robin, in the order of
 * the --model options) and stops at the first one that does not fit, as an
 * admission gate would refuse it. The numbers are an upper bound: the margin
 * stands for fragmentation and peaks, the real threshold is set by load test. */
#include "cli/cli.h"
#include "cli/spec.h"
#include "edgeserve/engine.h"
#include "edgeserve/error.h"
#include "edgeserve/memory.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PLAN_MAX_MODELS 16
#define PLAN_MAX_INPUTS 16

typedef struct plan_file {
  const char *path;        /* as given (argv) */
  char *real;              /* realpath, es_mem-allocated; NULL if unresolved */
  es_model *model;
  es_model_stats st;       /* read after every plan of this file was made */
} plan_file;

typedef struct plan_item {
  const char *arg;         /* the --model value */
  char path[PATH_MAX];     /* FILE part */
  cli_shape specs[PLAN_MAX_INPUTS]; /* the NAME=SHAPE[,...] part */
  int n_specs;
  int file;                /* index into files[] */
  es_tensor_info shapes[PLAN_MAX_INPUTS];
  int n_inputs;
  char shape_str[256];     /* "x=1x3x640x640", every input */
  es_plan *plan;
  size_t arena, context, per_request;
  size_t alone, mix;
} plan_item;

/* One run of the planner: the options, what was loaded and planned, and
 * every term of the formula, filled in by the steps of cli_cmd_plan. */
typedef struct plan_run {
  plan_item *items;        /* PLAN_MAX_MODELS */
  plan_file files[PLAN_MAX_MODELS];
  int n_items, n_files, json;
  int precision;           /* --precision (es_precision) of every model */
  const char *memory, *reserve_arg;
  double margin;
  /* the runtime overhead */
  size_t rss_before, rss_after, counted, mapped, uncounted, runtime;
  /* the fixed costs */
  size_t weights, prepared, model_ctx, plan_ctx, fixed;
  /* the budget */
  es_memstat ms;
  int have_ms;
  size_t budget, reserve, avail, free_b;
  const char *source, *reserve_why;
  char source_buf[ES_MEMSTAT_PATH_MAX + 64];
  /* the mix */
  size_t left, mix_total;
} plan_run;

static void plan_usage(FILE *f) {
  fprintf(f,
          "usage: edgeserve plan --model FILE[:NAME=SHAPE[,NAME=SHAPE]]... [--memory BYTES|auto]\n"
          "                      [--reserve BYTES] [--margin RATIO] [--json]\n"
          "                      [--precision auto|fp32|bf16|int8]\n\n"
          "Capacity planner (BRIEF 5): loads each model file once, plans each model at\n"
          "its shape (SHAPE like 1x3x640x640; inputs not named keep the model's fixed\n"
          "shape), and prints weights, prepared weights, plan context and per-request\n"
          "arena bytes, the measured runtime overhead, the memory budget and where it\n"
          "came from, and the maximum safe concurrency per model:\n"
          "  N = floor((budget - reserve - fixed) / ceil(arena x margin))\n"
          "alone (all free memory to that model) and in a round-robin mix of all.\n"
          "FILE is the whole argument when that is an existing file, else the text\n"
          "before the first ':' that leaves an existing file (paths and input names\n"
          "may hold ':'). Dimensions are 0..2^32, at most 8.\n"
          "  --memory   budget in bytes (suffix K, M, G, T: powers of 1024), or auto\n"
          "             (default): the cgroup limit min(memory.high, memory.max), else\n"
          "             MemAvailable + this process's RSS\n"
          "  --reserve  bytes kept for the system (default 0 under a cgroup limit,\n"
          "             else 10%% of the total)\n"
          "  --margin   factor on per-request bytes for fragmentation and peaks\n"
          "             (default 1.2)\n"
          "  --json     one JSON object instead of the table\n"
          "  --precision  what every model computes in (bf16: half the prepared weight\n"
          "             bytes; int8 needs quantized files)\n");
}

/* ---- parsing ---------------------------------------------------------------- */

/* "FILE[:NAME=SHAPE[,NAME=SHAPE]]" by the rules of spec.h, checked before
 * any model is loaded so that a malformed spec is a usage error however the
 * files are. -1 with the reason in why. */
static int parse_model_arg(plan_item *it, char why[CLI_WHY_MAX]) {
  cli_model_arg ma;
  if (cli_model_arg_parse(it->arg, &ma, why) < 0)
    return -1;
  memcpy(it->path, ma.path, sizeof it->path);
  it->n_specs = 0;
  return ma.specs ? cli_shapes_parse(ma.specs, it->specs, PLAN_MAX_INPUTS, &it->n_specs, why) : 0;
}

/* Appends sep, name and dim (when >= 0) to buf at o; truncates, never
 * overflows. Returns the new length. */
static size_t append(char *buf, size_t cap, size_t o, const char *sep, const char *name,
                     int64_t dim) {
  if (o + 1 >= cap)
    return o;
  int n = dim >= 0 ? snprintf(buf + o, cap - o, "%s%s%lld", sep, name, (long long)dim)
                   : snprintf(buf + o, cap - o, "%s%s", sep, name);
  if (n < 0)
    return o;
  return o + (size_t)n < cap ? o + (size_t)n : cap - 1;
}

/* The model's input shapes with the spec's applied; 2 on a usage error. */
static int resolve_shapes(plan_item *it, es_model *m) {
  int n = es_model_input_count(m);
  if (n > PLAN_MAX_INPUTS) {
    fprintf(stderr, "edgeserve plan: %s: more than %d inputs\n", it->path, PLAN_MAX_INPUTS);
    return 1;
  }
  it->n_inputs = n;
  for (int i = 0; i < n; i++)
    es_model_input_info(m, i, &it->shapes[i]);
  for (int k = 0; k < it->n_specs; k++) {
    const cli_shape *sp = &it->specs[k];
    int found = cli_shape_find(sp, it->shapes, n);
    if (found < 0) {
      fprintf(stderr, "edgeserve plan: %s has no input named '%.*s'\n", it->path,
              (int)sp->name_len, sp->name);
      return 2;
    }
    cli_shape_apply(sp, &it->shapes[found]);
  }
  size_t o = 0;
  it->shape_str[0] = '\0';
  for (int i = 0; i < n; i++) {
    const es_tensor_info *t = &it->shapes[i];
    if (cli_shape_open(t)) {
      fprintf(stderr, "edgeserve plan: input '%s' of %s has open dimensions: give %s:%s=SHAPE\n",
              t->name, it->path, it->path, t->name);
      return 2;
    }
    o = append(it->shape_str, sizeof it->shape_str, o, i ? "," : "", t->name, -1);
    for (int d = 0; d < t->rank; d++)
      o = append(it->shape_str, sizeof it->shape_str, o, d ? "x" : "=", "", t->dims[d]);
  }
  return 0;
}

/* ---- output ----------------------------------------------------------------- */

/* A limit for text: "none" for SIZE_MAX. */
static const char *lim_str(size_t v, char *buf, size_t n) {
  if (v == SIZE_MAX)
    snprintf(buf, n, "none");
  else
    snprintf(buf, n, "%zu B", v);
  return buf;
}

static void json_lim(size_t v) {
  if (v == SIZE_MAX)
    printf("null");
  else
    printf("%zu", v);
}

static const char *base_name(const char *p) {
  const char *s = strrchr(p, '/');
  return s ? s + 1 : p;
}

/* ---- the steps ------------------------------------------------------------- */

/* The options into pr. -1 to go on, else the exit status (0 after --help). */
static int parse_args(plan_run *pr, int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int r;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      plan_usage(stdout);
      return 0;
    } else if ((r = cli_precision_arg("plan", argc, argv, &i, &pr->precision)) != 0) {
      if (r == 2)
        return 2;
    } else if (!strcmp(a, "--json")) {
      pr->json = 1;
    } else if (!strcmp(a, "--model") && i + 1 < argc) {
      if (pr->n_items == PLAN_MAX_MODELS) {
        fprintf(stderr, "edgeserve plan: at most %d --model options\n", PLAN_MAX_MODELS);
        return 2;
      }
      plan_item *it = &pr->items[pr->n_items++];
      memset(it, 0, sizeof *it);
      it->arg = argv[++i];
      char why[CLI_WHY_MAX];
      if (parse_model_arg(it, why) < 0) {
        fprintf(stderr,
                "edgeserve plan: --model wants FILE[:NAME=SHAPE[,NAME=SHAPE]], got '%s' (%s)\n",
                it->arg, why);
        return 2;
      }
    } else if (!strcmp(a, "--memory") && i + 1 < argc) {
      pr->memory = argv[++i];
    } else if (!strcmp(a, "--reserve") && i + 1 < argc) {
      pr->reserve_arg = argv[++i];
    } else if (!strcmp(a, "--margin") && i + 1 < argc) {
      char *end;
      pr->margin = strtod(argv[++i], &end);
      if (*end || end == argv[i] || !(pr->margin >= 1.0 && pr->margin <= 100.0)) {
        fprintf(stderr, "edgeserve plan: --margin wants a ratio in [1, 100], got '%s'\n",
                argv[i]);
        return 2;
      }
    } else {
      fprintf(stderr, "edgeserve plan: unknown or incomplete option '%s'\n", a);
      plan_usage(stderr);
      return 2;
    }
  }
  if (pr->n_items == 0) {
    fprintf(stderr, "edgeserve plan: at least one --model FILE[:NAME=SHAPE] is needed\n");
    plan_usage(stderr);
    return 2;
  }
  if (strcmp(pr->memory, "auto") && (cli_parse_bytes(pr->memory, &pr->budget) < 0 ||
                                     pr->budget == 0)) {
    fprintf(stderr, "edgeserve plan: --memory wants BYTES (K/M/G/T suffix) or auto, got '%s'\n",
            pr->memory);
    return 2;
  }
  if (pr->reserve_arg && cli_parse_bytes(pr->reserve_arg, &pr->reserve) < 0) {
    fprintf(stderr, "edgeserve plan: --reserve wants BYTES (K/M/G/T suffix), got '%s'\n",
            pr->reserve_arg);
    return 2;
  }
  return -1;
}

/* The file of item k: one already loaded (same realpath, or same string),
 * else loaded now. Its index, or -1 (printed). */
static int load_file(plan_run *pr, const plan_item *it) {
  char *real = realpath(it->path, NULL);
  for (int j = 0; j < pr->n_files; j++) {
    const plan_file *f = &pr->files[j];
    if (real && f->real ? !strcmp(real, f->real) : !strcmp(it->path, f->path)) {
      free(real);
      return j;
    }
  }
  plan_file *pf = &pr->files[pr->n_files];
  memset(pf, 0, sizeof *pf);
  pf->path = it->path;
  pf->real = real ? es_mem_strdup(ES_MEM_CLI, real) : NULL;
  free(real);
  es_model_options mo = {.precision = (es_precision)pr->precision};
  if (es_model_load(it->path, &mo, &pf->model) < 0) {
    fprintf(stderr, "edgeserve plan: %s: %s\n", it->path, es_last_error_detail());
    es_mem_free(pf->real);
    return -1;
  }
  return pr->n_files++;
}

/* Loads each distinct file once and plans each item at its shape. 0, or
 * the exit status (printed). */
static int load_and_plan(plan_run *pr) {
  for (int k = 0; k < pr->n_items; k++) {
    plan_item *it = &pr->items[k];
    if ((it->file = load_file(pr, it)) < 0)
      return 1;
    es_model *m = pr->files[it->file].model;
    int rc = resolve_shapes(it, m);
    if (rc)
      return rc;
    if (es_model_plan(m, it->shapes, it->n_inputs, &it->plan) < 0) {
      fprintf(stderr, "edgeserve plan: %s at %s: %s\n", it->path, it->shape_str,
              es_last_error_detail());
      return 1;
    }
    it->arena = es_plan_arena_bytes(it->plan);
    it->context = es_plan_context_bytes(it->plan);
    double per = ceil((double)it->arena * pr->margin);
    it->per_request = per < 1 ? 1 : (size_t)per;
  }
  return 0;
}

/* The fixed costs. Model stats are read after every plan: planning may
 * reorder weights (prepared).
 *
 * The runtime overhead, part 2 (part 1 is the RSS before any load: the
 * executable, libc, libm and whatever the library set up at start): RSS
 * now minus what the counting layer attributes to the library (weights,
 * prepared weights, graphs, plans: es_mem_total) and minus mapped model
 * files (.esm, counted as file_mapped, at most that much of it resident).
 * What is left is memory no counter names: code, libc's heap slack after
 * load-time parsing, thread stacks. The overhead used is the larger of the
 * two measures, so that neither a start-up footprint nor load-time slack
 * is planned away. */
static void measure_fixed(plan_run *pr) {
  for (int j = 0; j < pr->n_files; j++) {
    es_model_stats_get(pr->files[j].model, &pr->files[j].st);
    pr->weights += pr->files[j].st.weight_bytes;
    pr->prepared += pr->files[j].st.prepared_bytes;
    pr->model_ctx += pr->files[j].st.context_bytes;
  }
  for (int k = 0; k < pr->n_items; k++)
    pr->plan_ctx += pr->items[k].context;
  es_sys_rss(&pr->rss_after);
  pr->counted = es_mem_total();
  for (int t = 0; t < ES_MEM_TAG_COUNT; t++) {
    es_mem_stats st;
    if (es_mem_stats_get((es_mem_tag)t, &st) == 0)
      pr->mapped += st.file_mapped;
  }
  size_t named = pr->counted + pr->mapped;
  pr->uncounted = pr->rss_after > named ? pr->rss_after - named : 0;
  pr->runtime = pr->rss_before > pr->uncounted ? pr->rss_before : pr->uncounted;
  pr->fixed = pr->weights + pr->prepared + pr->model_ctx + pr->plan_ctx + pr->runtime;
}

/* The budget and the reserve, and where they came from. 0, or 1 when
 * "auto" has nothing to read (printed). */
static int find_budget(plan_run *pr) {
  pr->have_ms = es_memstat_read(&pr->ms) == 0;
  const es_memstat *ms = &pr->ms;
  size_t limit = SIZE_MAX;
  if (pr->have_ms && ms->version)
    limit = ms->high < ms->max ? ms->high : ms->max;
  int given = pr->reserve_arg != NULL;
  if (strcmp(pr->memory, "auto")) {
    pr->source = "--memory";
    if (!given)
      pr->reserve = pr->budget / 10;
    pr->reserve_why = given ? "--reserve" : "10% of --memory";
  } else if (limit != SIZE_MAX) {
    pr->budget = limit;
    snprintf(pr->source_buf, sizeof pr->source_buf, "cgroup v%d %s (min of high and max)",
             ms->version, ms->path);
    pr->source = pr->source_buf;
    pr->reserve_why = given ? "--reserve" : "none: the cgroup limit already bounds the process";
  } else if (pr->have_ms) {
    /* What the machine can still give, plus what this process already holds. */
    pr->budget = ms->mem_available + pr->rss_after;
    pr->source = "meminfo (MemAvailable + this process's RSS; no cgroup limit)";
    if (!given)
      pr->reserve = ms->mem_total / 10;
    pr->reserve_why = given ? "--reserve" : "10% of MemTotal";
  } else {
    fprintf(stderr, "edgeserve plan: cannot read the memory limits (%s); give --memory BYTES\n",
            es_last_error_detail());
    return 1;
  }
  pr->avail = pr->budget > pr->reserve ? pr->budget - pr->reserve : 0;
  pr->free_b = pr->avail > pr->fixed ? pr->avail - pr->fixed : 0;
  return 0;
}

/* N alone for each item, and the round-robin mix: one request of each
 * model-at-shape in turn, until the next one in the rotation does not fit. */
static void concurrency(plan_run *pr) {
  size_t round = 0;
  for (int k = 0; k < pr->n_items; k++) {
    pr->items[k].alone = pr->free_b / pr->items[k].per_request;
    round += pr->items[k].per_request;
  }
  size_t rounds = pr->free_b / round;
  pr->left = pr->free_b - rounds * round;
  for (int k = 0; k < pr->n_items; k++)
    pr->items[k].mix = rounds;
  for (int k = 0; k < pr->n_items && pr->items[k].per_request <= pr->left; k++) {
    pr->left -= pr->items[k].per_request;
    pr->items[k].mix++;
  }
  pr->mix_total = 0;
  for (int k = 0; k < pr->n_items; k++)
    pr->mix_total += pr->items[k].mix;
}

static void print_json(const plan_run *pr) {
  const es_memstat *ms = &pr->ms;
  printf("{\"budget\": {\"bytes\": %zu, \"source\": ", pr->budget);
  cli_json_string(stdout, pr->source);
  printf(", \"cgroup\": ");
  if (pr->have_ms && ms->version) {
    printf("{\"version\": %d, \"path\": ", ms->version);
    cli_json_string(stdout, ms->path);
    printf(", \"current\": %zu, \"high\": ", ms->current);
    json_lim(ms->high);
    printf(", \"max\": ");
    json_lim(ms->max);
    printf("}");
  } else {
    printf("null");
  }
  printf(", \"mem_total\": %zu, \"mem_available\": %zu}", pr->have_ms ? ms->mem_total : 0,
         pr->have_ms ? ms->mem_available : 0);
  printf(", \"reserve_bytes\": %zu, \"margin\": %.4g", pr->reserve, pr->margin);
  printf(", \"runtime\": {\"bytes\": %zu, \"rss_before_load\": %zu, \"rss_after\": %zu, "
         "\"counted\": %zu, \"file_mapped\": %zu, \"uncounted\": %zu}",
         pr->runtime, pr->rss_before, pr->rss_after, pr->counted, pr->mapped, pr->uncounted);
  printf(", \"files\": [");
  for (int j = 0; j < pr->n_files; j++) {
    const plan_file *f = &pr->files[j];
    printf("%s{\"path\": ", j ? ", " : "");
    cli_json_string(stdout, f->path);
    printf(", \"weight_bytes\": %zu, \"prepared_bytes\": %zu, \"context_bytes\": %zu, "
           "\"compiled\": %s}",
           f->st.weight_bytes, f->st.prepared_bytes, f->st.context_bytes,
           f->st.compiled ? "true" : "false");
  }
  printf("], \"fixed\": {\"weight_bytes\": %zu, \"prepared_bytes\": %zu, "
         "\"model_context_bytes\": %zu, \"plan_context_bytes\": %zu, \"runtime_bytes\": %zu, "
         "\"total\": %zu}, \"free_bytes\": %zu",
         pr->weights, pr->prepared, pr->model_ctx, pr->plan_ctx, pr->runtime, pr->fixed,
         pr->free_b);
  printf(", \"models\": [");
  for (int k = 0; k < pr->n_items; k++) {
    const plan_item *it = &pr->items[k];
    printf("%s{\"file\": ", k ? ", " : "");
    cli_json_string(stdout, it->path);
    printf(", \"shape\": ");
    cli_json_string(stdout, it->shape_str);
    printf(", \"arena_bytes\": %zu, \"per_request_bytes\": %zu, \"plan_context_bytes\": %zu, "
           "\"max_concurrency\": %zu, \"mix_concurrency\": %zu}",
           it->arena, it->per_request, it->context, it->alone, it->mix);
  }
  printf("], \"mix_total\": %zu, \"fits\": %s}\n", pr->mix_total,
         pr->free_b ? "true" : "false");
}

/* The budget, the reserve, the margin, the runtime overhead and the files. */
static void print_inputs(const plan_run *pr) {
  const es_memstat *ms = &pr->ms;
  char b1[48], b2[48];
  printf("budget: %zu B from %s\n", pr->budget, pr->source);
  if (pr->have_ms && ms->version)
    printf("  cgroup v%d %s: current %zu B, high %s, max %s\n", ms->version, ms->path,
           ms->current, lim_str(ms->high, b1, sizeof b1), lim_str(ms->max, b2, sizeof b2));
  else
    printf("  cgroup: no memory cgroup found\n");
  if (pr->have_ms && ms->mem_total)
    printf("  meminfo: MemTotal %zu B, MemAvailable %zu B\n", ms->mem_total, ms->mem_available);
  printf("reserve: %zu B (%s)\n", pr->reserve, pr->reserve_why);
  printf("margin: %.2f on per-request bytes (fragmentation and peaks)\n", pr->margin);
  printf("runtime: %zu B (the larger of: RSS before loading any model %zu B; RSS after "
         "loading and planning %zu B - counted %zu B - mapped files %zu B = %zu B)\n",
         pr->runtime, pr->rss_before, pr->rss_after, pr->counted, pr->mapped, pr->uncounted);
  printf("\nfiles (loaded once each; weights read-only and shared by every request):\n");
  printf("  %14s %14s %14s  %s\n", "weights B", "prepared B", "context B", "file");
  for (int j = 0; j < pr->n_files; j++) {
    const plan_file *f = &pr->files[j];
    printf("  %14zu %14zu %14zu  %s%s\n", f->st.weight_bytes, f->st.prepared_bytes,
           f->st.context_bytes, f->path, f->st.compiled ? " (compiled)" : "");
  }
}

/* The models at their shapes, the fixed costs and the formula per model. */
static void print_results(const plan_run *pr) {
  printf("\nmodels at shapes:\n");
  printf("  %-20s %-24s %14s %14s %12s %8s %6s\n", "model", "shape", "arena B", "per-request B",
         "plan ctx B", "alone", "mix");
  for (int k = 0; k < pr->n_items; k++) {
    const plan_item *it = &pr->items[k];
    printf("  %-20s %-24s %14zu %14zu %12zu %8zu %6zu\n", base_name(it->path), it->shape_str,
           it->arena, it->per_request, it->context, it->alone, it->mix);
  }
  printf("\nfixed: weights %zu + prepared %zu + model contexts %zu + plan contexts %zu + "
         "runtime %zu = %zu B\n",
         pr->weights, pr->prepared, pr->model_ctx, pr->plan_ctx, pr->runtime, pr->fixed);
  if (!pr->free_b)
    printf("does not fit: budget %zu - reserve %zu = %zu B is not more than the fixed %zu B "
           "(short by %zu B); no request can be admitted, concurrency 0\n",
           pr->budget, pr->reserve, pr->avail, pr->fixed, pr->fixed - pr->avail);
  else
    printf("free for requests: budget %zu - reserve %zu - fixed %zu = %zu B\n", pr->budget,
           pr->reserve, pr->fixed, pr->free_b);
  for (int k = 0; k < pr->n_items; k++) {
    const plan_item *it = &pr->items[k];
    printf("formula %s %s: N = floor((budget %zu - reserve %zu - fixed %zu) / ceil(arena %zu "
           "x margin %.2f)) = floor(%zu / %zu) = %zu\n",
           base_name(it->path), it->shape_str, pr->budget, pr->reserve, pr->fixed, it->arena,
           pr->margin, pr->free_b, it->per_request, it->alone);
  }
  printf("mix (round robin, one request of each model in turn until the next does not fit): "
         "%zu requests:",
         pr->mix_total);
  for (int k = 0; k < pr->n_items; k++)
    printf("%s %s %s x %zu", k ? "," : "", base_name(pr->items[k].path),
           pr->items[k].shape_str, pr->items[k].mix);
  printf("; %zu B left\n", pr->left);
}

/* ---- the command ------------------------------------------------------------ */

int cli_cmd_plan(int argc, char **argv) {
  static plan_item items[PLAN_MAX_MODELS];
  static plan_run pr;
  memset(&pr, 0, sizeof pr);
  pr.items = items;
  pr.memory = "auto";
  pr.margin = 1.2;
  int status = parse_args(&pr, argc, argv);
  if (status >= 0)
    return status;
  /* The runtime overhead, part 1: RSS before any model is loaded. */
  if (es_sys_rss(&pr.rss_before) < 0) {
    fprintf(stderr, "edgeserve plan: cannot read the process RSS: %s\n", es_last_error_detail());
    return 1;
  }
  status = load_and_plan(&pr);
  if (status == 0) {
    measure_fixed(&pr);
    status = find_budget(&pr);
  }
  if (status == 0) {
    concurrency(&pr);
    if (pr.json) {
      print_json(&pr);
    } else {
      print_inputs(&pr);
      print_results(&pr);
    }
  }
  for (int k = 0; k < pr.n_items; k++)
    es_plan_release(items[k].plan);
  for (int j = 0; j < pr.n_files; j++) {
    es_model_release(pr.files[j].model);
    es_mem_free(pr.files[j].real);
  }
  return status;
}
