/* edgeserve bench-lane: several models time-sharing one execution lane
 * (BRIEF §6), with the lane's shared scratchpad or with private arenas.
 *
 * Why this command: an edge NPU has one pipeline, so models that share it run
 * one at a time and one scratchpad sized max(planned arena of each model) can
 * replace the sum of their arenas. The claim has two halves to check on a
 * real mix (e.g. a face detector, a text detector and a text recogniser run
 * every camera frame): the memory saved (sum - max) shows up in the process's
 * RSS, and switching models costs nothing measurable next to a run. This
 * command runs the same frame loop both ways, so the two columns differ only
 * in where the arenas come from; scripts/ort/bench_frames.js runs the same
 * loop with ONNX Runtime for the third column.
 *
 * Set-up, as an NPU-style gateway would be configured: one worker (= one
 * lane, pinned), every model loaded with a configured shape and lane 0; with
 * --private, lane -1 and one arena of its own per model (its arena pool), the
 * "before" column. Inputs come from .npy files or are random data of the
 * model's shape; the model files are opened once before the runtime exists
 * to learn their inputs (the runtime needs the shapes at load), released,
 * and the peak RSS is reset after that so the probe does not count.
 *
 * A frame submits one request per model, priority = the model's position
 * (the first model is the most urgent, like a 30 fps detector at priority 0),
 * and waits for all of them. Frame latency is the first submit to the last
 * completion, taken in the completion callback (not when the main thread
 * wakes up). Per-request run and switch times come from es_request_info;
 * the lane's own switch counters from es_runtime_lane_stats_get (those
 * include the warm-up frames). Memory: the runtime's scratchpad, pool and
 * weight bytes, and the kernel's view: peak RSS (the larger of VmHWM and a
 * 50 ms sampler, as the ONNX Runtime script measures it), RSS and PSS at
 * the end. */
#include "cli/cli.h"
#include "cli/inputs.h"
#include "cli/measure.h"
#include "cli/spec.h"
#include "edgeserve/engine.h"
#include "edgeserve/memory.h"
#include "edgeserve/runtime.h"

#include <limits.h>
#include <malloc.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define BL_MAX_MODELS 16
#define BL_MAX_FILES 64 /* --input options */

typedef struct bl_model {
  const char *arg;                 /* the MODEL[:SHAPES] argument */
  char path[PATH_MAX];
  char name[ES_RT_NAME_MAX];       /* registry name: the file's base name */
  cli_inputs ci;
  int n_in;
  es_tensor in[CLI_MAX_INPUTS];
  es_tensor_info shapes[CLI_MAX_INPUTS];
  char *in_names[CLI_MAX_INPUTS]; /* own copies: the probe model is released */
  int id;                          /* registry id; -1 until loaded */
  size_t planned;                  /* es_runtime_model_stats */
  size_t pool;
  double *run_ms;                  /* per timed frame */
  double *switch_ns;               /* per timed frame, when the lane switched */
  int n_switch;
  uint64_t src[4];                 /* timed runs by ES_ARENA_FROM_* */
} bl_model;

typedef struct bl_input_opt {
  long model;
  const char *value;               /* after "INDEX:" */
} bl_input_opt;

/* Completion of one frame's requests, from the runtime's callbacks. */
typedef struct bl_sync {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int left;
  uint64_t last_ns;
} bl_sync;

static void bench_lane_usage(FILE *f) {
  fprintf(f,
          "usage: edgeserve bench-lane MODEL[:NAME=DxDxD[,NAME=DxDxD]]...\n"
          "                           [--input INDEX:NAME=FILE.npy | INDEX:FILE.npy]...\n"
          "                           [--frames N] [--warmup K] [--private] [--json]\n\n"
          "Several models on one execution lane (one worker, NPU-style time division).\n"
          "A frame submits one request per model, priority = its position (the first\n"
          "model highest), and waits for all; frame latency is first submit to last\n"
          "completion. N frames (default 100) after K warm-up frames (default 3).\n"
          "  MODEL:SHAPES  the shape each input is configured for (a lane needs one);\n"
          "                inputs not named keep the model's fixed shape. Without a\n"
          "                file the input gets random data of that shape. MODEL is\n"
          "                the whole argument when that is an existing file, else\n"
          "                the text before the first ':' that leaves one.\n"
          "  --input       data for input NAME of model INDEX (0 = the first MODEL);\n"
          "                its shape is the file's\n"
          "  --private     each model its own arena (lane -1, one-arena pool) instead\n"
          "                of the lane's shared scratchpad: the comparison column\n"
          "  --json        one JSON line instead of the report\n"
          "Reports frame p50/p99/max, run p50 per model, lane switch time, scratchpad\n"
          "bytes against the sum of planned arenas (or the private pools), weights,\n"
          "peak RSS, RSS and PSS.\n");
}


/* Nearest-rank percentile (as the ONNX Runtime script takes it, so the
 * columns compare); sorts v in place. NAN for no values. */
static double pct(double *v, int n, double q) {
  cli_sort(v, (size_t)(n > 0 ? n : 0));
  return cli_pct(v, (size_t)(n > 0 ? n : 0), q);
}

/* MODEL[:NAME=DxD[,NAME=DxD]] by the rules of spec.h; the shapes go to the
 * model's inputs (random data of that shape unless --input gives a file).
 * -1 with a message on error. */
static int parse_model_arg(bl_model *bm) {
  cli_model_arg ma;
  char why[CLI_WHY_MAX];
  if (cli_model_arg_parse(bm->arg, &ma, why) < 0 ||
      (ma.specs &&
       cli_shapes_parse(ma.specs, bm->ci.shapes, CLI_MAX_INPUTS, &bm->ci.n_shapes, why) < 0)) {
    fprintf(stderr, "edgeserve bench-lane: '%s': wants FILE[:NAME=DxDxD[,NAME=DxDxD]], %s\n",
            bm->arg, why);
    return -1;
  }
  memcpy(bm->path, ma.path, sizeof bm->path);
  return 0;
}

/* Registry name: the file's base name without .onnx/.esm, made unique. */
static void model_name(bl_model *models, int i) {
  const char *b = strrchr(models[i].path, '/');
  b = b ? b + 1 : models[i].path;
  size_t n = strlen(b);
  const char *dot = strrchr(b, '.');
  if (dot && (!strcmp(dot, ".onnx") || !strcmp(dot, ".esm")))
    n = (size_t)(dot - b);
  if (n > ES_RT_NAME_MAX - 5)
    n = ES_RT_NAME_MAX - 5; /* room for a "#NN" suffix */
  snprintf(models[i].name, sizeof models[i].name, "%.*s", (int)n, b);
  for (int k = 0; k < i; k++)
    if (!strcmp(models[k].name, models[i].name)) {
      snprintf(models[i].name, sizeof models[i].name, "%.*s#%d", (int)n, b, i);
      break;
    }
}

/* "NAME=FILE.npy" names input `name` (the name ends at the first '='). */
static int file_names(const char *spec, const char *name) {
  const char *eq = strchr(spec, '=');
  return eq && strlen(name) == (size_t)(eq - spec) && !strncmp(spec, name, (size_t)(eq - spec));
}

/* A shape or file for an input the model does not have, or an input with
 * free dimensions and neither: said with this command's syntax
 * (cli_inputs_load would name its own options). 0, or 2 (printed). */
static int check_inputs(const bl_model *bm, es_model *m, int index) {
  es_tensor_info infos[ES_RT_MAX_IO];
  char have[256];
  size_t used = 0;
  have[0] = '\0';
  for (int i = 0; i < bm->n_in; i++) {
    es_model_input_info(m, i, &infos[i]);
    if (used < sizeof have) {
      int w = snprintf(have + used, sizeof have - used, "%s%s", i ? ", " : "", infos[i].name);
      used += w > 0 ? (size_t)w : 0;
    }
  }
  for (int k = 0; k < bm->ci.n_named + bm->ci.n_shapes; k++) {
    int found = 0;
    const cli_shape *sp = k < bm->ci.n_named ? NULL : &bm->ci.shapes[k - bm->ci.n_named];
    const char *name = sp ? sp->name : bm->ci.named[k];
    int len = sp ? (int)sp->name_len : (int)(strchr(name, '=') - name);
    for (int i = 0; i < bm->n_in; i++)
      found |= sp ? cli_shape_is(sp, infos[i].name) : file_names(name, infos[i].name);
    if (!found) {
      fprintf(stderr, "edgeserve bench-lane: %s has no input named '%.*s' (inputs: %s)\n",
              bm->path, len, name, have);
      return 2;
    }
  }
  for (int i = 0; i < bm->n_in; i++) {
    int given = i < bm->ci.n_pos;
    for (int k = 0; k < bm->ci.n_named; k++)
      given |= file_names(bm->ci.named[k], infos[i].name);
    for (int k = 0; k < bm->ci.n_shapes; k++)
      given |= cli_shape_is(&bm->ci.shapes[k], infos[i].name);
    if (cli_shape_open(&infos[i]) && !given) {
      fprintf(stderr, "edgeserve bench-lane: %s: input '%s' has free dimensions: give its "
                      "shape (%s:%s=DxDxD) or data (--input %d:%s=FILE.npy)\n",
              bm->path, infos[i].name, bm->path, infos[i].name, index, infos[i].name);
      return 2;
    }
  }
  return 0;
}

/* Open the model file once to learn its inputs and make their data and
 * shapes (cli_inputs_load: files, shapes, random data). 0, 1 or 2. */
static int probe_model(bl_model *bm, int index) {
  es_model *m = NULL;
  if (es_model_load(bm->path, NULL, &m) < 0) {
    fprintf(stderr, "edgeserve bench-lane: %s\n", es_last_error_detail());
    return 1;
  }
  int status = 0;
  bm->n_in = es_model_input_count(m);
  if (bm->n_in > ES_RT_MAX_IO) {
    fprintf(stderr, "edgeserve bench-lane: %s has %d inputs (the runtime takes %d)\n",
            bm->path, bm->n_in, ES_RT_MAX_IO);
    status = 1;
    goto out;
  }
  if ((status = check_inputs(bm, m, index)) != 0)
    goto out;
  char label[PATH_MAX + 16];
  snprintf(label, sizeof label, "bench-lane: %s", bm->path);
  if ((status = cli_inputs_load(m, &bm->ci, label, bm->in, bm->shapes)) != 0)
    goto out;
  for (int i = 0; i < bm->n_in; i++) {
    bm->in_names[i] = es_mem_strdup(ES_MEM_CLI, bm->shapes[i].name ? bm->shapes[i].name : "");
    if (!bm->in_names[i]) {
      fprintf(stderr, "edgeserve bench-lane: out of memory\n");
      status = 1;
      goto out;
    }
    bm->shapes[i].name = bm->in_names[i];
    bm->in[i].name = bm->in_names[i];
  }
out:
  es_model_release(m);
  return status;
}

static void on_done(void *user, es_request *r) {
  (void)r;
  bl_sync *s = user;
  uint64_t t = cli_now_ns();
  pthread_mutex_lock(&s->mu);
  if (t > s->last_ns)
    s->last_ns = t;
  if (--s->left == 0)
    pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

static void json_num(double v, int decimals) { cli_json_real(stdout, v, decimals); }

static const char *mib(size_t b, char *buf, size_t n) {
  snprintf(buf, n, "%.1f MiB", cli_mib(b));
  return buf;
}

/* One run of the command: the options, the models, the runtime and what
 * was measured, filled in by the steps of cli_cmd_bench_lane. */
typedef struct bl_run {
  long frames, warmup;
  int json, private_mode, n_models, n_files;
  bl_input_opt files[BL_MAX_FILES];
  bl_model *models;                /* BL_MAX_MODELS */
  es_runtime *rt;
  int priorities;
  double *frame_ms;                /* per timed frame */
  bl_sync sync;
  cli_rss_sampler smp;
  /* measured */
  double load_ms;
  int peak_reset;
  size_t baseline_rss, peak, rss, pss, sum_planned;
  es_runtime_stats rs;
  es_lane_stats ls;
  double f50, f99, fmax, req_sw50, req_swmax;
  double run50[BL_MAX_MODELS], sw50[BL_MAX_MODELS], swmax[BL_MAX_MODELS];
} bl_run;

static int priority_of(const bl_run *b, int i) { return i < b->priorities ? i : b->priorities - 1; }

/* The options into b. -1 to go on, else the exit status (0 after --help). */
static int parse_args(bl_run *b, int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      bench_lane_usage(stdout);
      return 0;
    } else if (!strcmp(a, "--json")) {
      b->json = 1;
    } else if (!strcmp(a, "--private")) {
      b->private_mode = 1;
    } else if (!strcmp(a, "--frames") || !strcmp(a, "--warmup")) {
      long *dst = !strcmp(a, "--frames") ? &b->frames : &b->warmup;
      long lo = dst == &b->frames ? 1 : 0;
      if (i + 1 >= argc || cli_parse_count(argv[++i], lo, 1000000, dst) < 0) {
        fprintf(stderr, "edgeserve bench-lane: %s wants %ld..1000000\n", a, lo);
        return 2;
      }
    } else if (!strcmp(a, "--input")) {
      char *end;
      const char *v = i + 1 < argc ? argv[++i] : "";
      long idx = strtol(v, &end, 10);
      if (end == v || *end != ':' || idx < 0 || !end[1]) {
        fprintf(stderr, "edgeserve bench-lane: --input wants INDEX:NAME=FILE.npy or "
                        "INDEX:FILE.npy (INDEX: the model's position from 0), got '%s'\n", v);
        return 2;
      }
      if (b->n_files == BL_MAX_FILES) {
        fprintf(stderr, "edgeserve bench-lane: too many --input options\n");
        return 2;
      }
      b->files[b->n_files].model = idx;
      b->files[b->n_files++].value = end + 1;
    } else if (a[0] == '-') {
      fprintf(stderr, "edgeserve bench-lane: unknown option '%s'\n", a);
      bench_lane_usage(stderr);
      return 2;
    } else {
      if (b->n_models == BL_MAX_MODELS) {
        fprintf(stderr, "edgeserve bench-lane: at most %d models\n", BL_MAX_MODELS);
        return 2;
      }
      bl_model *bm = &b->models[b->n_models];
      bm->arg = a;
      bm->id = -1;
      if (parse_model_arg(bm) < 0)
        return 2;
      model_name(b->models, b->n_models);
      b->n_models++;
    }
  }
  if (b->n_models == 0) {
    bench_lane_usage(stderr);
    return 2;
  }
  return -1;
}

/* Each --input to its model's inputs. 0, or 2 (printed). */
static int assign_files(bl_run *b) {
  for (int k = 0; k < b->n_files; k++) {
    const bl_input_opt *f = &b->files[k];
    if (f->model >= b->n_models) {
      fprintf(stderr, "edgeserve bench-lane: --input %ld:%s: no model %ld (models are 0..%d)\n",
              f->model, f->value, f->model, b->n_models - 1);
      return 2;
    }
    cli_inputs *ci = &b->models[f->model].ci;
    int named = strchr(f->value, '=') != NULL;
    if ((named ? ci->n_named : ci->n_pos) == CLI_MAX_INPUTS) {
      fprintf(stderr, "edgeserve bench-lane: too many --input options for model %ld\n",
              f->model);
      return 2;
    }
    if (named)
      ci->named[ci->n_named++] = f->value;
    else
      ci->positional[ci->n_pos++] = f->value;
  }
  return 0;
}

/* Inputs and shapes of every model, before the runtime exists, and the
 * arrays the frames fill. 0, 1 or 2 (printed). */
static int prepare(bl_run *b) {
  int status = assign_files(b);
  for (int i = 0; status == 0 && i < b->n_models; i++)
    status = probe_model(&b->models[i], i);
  if (status)
    return status;
  for (int i = 0; i < b->n_models; i++) {
    b->models[i].run_ms = es_mem_calloc(ES_MEM_CLI, (size_t)b->frames, sizeof(double));
    b->models[i].switch_ns = es_mem_calloc(ES_MEM_CLI, (size_t)b->frames, sizeof(double));
    if (!b->models[i].run_ms || !b->models[i].switch_ns)
      goto oom;
  }
  b->frame_ms = es_mem_calloc(ES_MEM_CLI, (size_t)b->frames, sizeof *b->frame_ms);
  if (!b->frame_ms)
    goto oom;
  return 0;
oom:
  fprintf(stderr, "edgeserve bench-lane: out of memory\n");
  return 1;
}

/* The runtime, one worker = one lane, with every model loaded on it (or
 * with its own arena under --private). 0, or 1 (printed). */
static int start_runtime(bl_run *b) {
  es_runtime_config rc;
  es_runtime_config_default(&rc);
  rc.workers = 1;
  rc.pin = 1;
  rc.priorities = b->n_models > 4 ? b->n_models : 4;
  b->priorities = rc.priorities;
  if (es_runtime_create(&rc, &b->rt) < 0) {
    fprintf(stderr, "edgeserve bench-lane: cannot create the runtime: %s\n",
            es_last_error_detail());
    return 1;
  }
  uint64_t t_load = cli_now_ns();
  for (int i = 0; i < b->n_models; i++) {
    bl_model *bm = &b->models[i];
    es_model_config mc;
    es_model_config_default(&mc);
    mc.name = bm->name;
    mc.path = bm->path;
    mc.shapes = bm->shapes;
    mc.n_shapes = bm->n_in;
    mc.lane = b->private_mode ? -1 : 0;
    mc.arenas = b->private_mode ? 1 : 0;
    if (es_runtime_model_load(b->rt, &mc, &bm->id) < 0) {
      fprintf(stderr, "edgeserve bench-lane: cannot load %s: %s\n", bm->path,
              es_last_error_detail());
      return 1;
    }
  }
  b->load_ms = (double)(cli_now_ns() - t_load) / 1e6;
  return 0;
}

/* Submits one request per model; returns how many went in (a failed submit
 * is printed and stops the frame). */
static int submit_frame(bl_run *b, es_request **req, int *failed) {
  for (int i = 0; i < b->n_models; i++) {
    const bl_model *bm = &b->models[i];
    es_submit s = {.model = bm->id, .inputs = bm->in, .n_inputs = bm->n_in,
                   .priority = priority_of(b, i), .on_done = on_done, .user = &b->sync};
    es_refusal why;
    int r = es_runtime_submit(b->rt, &s, &req[i], &why);
    if (r < 0) {
      if (r == ES_EAGAIN)
        fprintf(stderr, "edgeserve bench-lane: %s refused (%s, retry after %u ms)\n", bm->name,
                es_refusal_name(why.reason), why.retry_after_ms);
      else
        fprintf(stderr, "edgeserve bench-lane: %s: %s\n", bm->name, es_last_error_detail());
      *failed = 1;
      return i;
    }
  }
  return b->n_models;
}

/* One frame (f < 0: warm-up, not recorded). 0, or -1 when a request
 * failed (printed). */
static int run_frame(bl_run *b, long f) {
  es_request *req[BL_MAX_MODELS];
  int failed = 0;
  pthread_mutex_lock(&b->sync.mu);
  b->sync.left = b->n_models;
  b->sync.last_ns = 0;
  pthread_mutex_unlock(&b->sync.mu);
  uint64_t t0 = cli_now_ns();
  int submitted = submit_frame(b, req, &failed);
  /* Wait for what was submitted; a failed submit has no callback coming. */
  pthread_mutex_lock(&b->sync.mu);
  b->sync.left -= b->n_models - submitted;
  while (b->sync.left > 0)
    pthread_cond_wait(&b->sync.cv, &b->sync.mu);
  uint64_t t_end = b->sync.last_ns;
  pthread_mutex_unlock(&b->sync.mu);
  for (int i = 0; i < submitted; i++) {
    int st = es_request_wait(req[i], -1);
    es_request_info info;
    if (st == 0 && es_request_info_get(req[i], &info) == 0 && f >= 0) {
      bl_model *bm = &b->models[i];
      bm->run_ms[f] = (double)info.run_ns / 1e6;
      if (info.switch_ns)
        bm->switch_ns[bm->n_switch++] = (double)info.switch_ns;
      if (info.arena_source >= 0 && info.arena_source < 4)
        bm->src[info.arena_source]++;
    } else if (st != 0) {
      fprintf(stderr, "edgeserve bench-lane: %s failed: %s (%s)\n", b->models[i].name,
              es_err_name(st), es_strerror(st));
      failed = 1;
    }
    es_request_free(req[i]);
  }
  if (failed)
    return -1;
  if (f >= 0)
    b->frame_ms[f] = (double)(t_end - t0) / 1e6;
  return 0;
}

/* Memory at the end, and the percentiles of the timed frames. 0, or 1
 * (printed). */
static int collect(bl_run *b) {
  cli_rss_sampler_stop(&b->smp);
  b->pss = cli_pss();
  es_sys_rss(&b->rss);
  es_sys_peak_rss(&b->peak);
  if (atomic_load(&b->smp.max) > b->peak)
    b->peak = atomic_load(&b->smp.max);
  if (b->rss > b->peak) /* read a moment apart: the peak is never below the end */
    b->peak = b->rss;
  memset(&b->ls, 0, sizeof b->ls);
  if (es_runtime_stats_get(b->rt, &b->rs) < 0 || es_runtime_lane_stats_get(b->rt, 0, &b->ls) < 0) {
    fprintf(stderr, "edgeserve bench-lane: %s\n", es_last_error_detail());
    return 1;
  }
  for (int i = 0; i < b->n_models; i++) {
    es_runtime_model_stats ms;
    if (es_runtime_model_stats_get(b->rt, b->models[i].id, &ms) == 0) {
      b->models[i].planned = ms.planned_bytes;
      b->models[i].pool = ms.pool_bytes;
    }
    b->sum_planned += b->models[i].planned;
  }
  int frames = (int)b->frames;
  b->f50 = pct(b->frame_ms, frames, 0.5);
  b->f99 = pct(b->frame_ms, frames, 0.99);
  b->fmax = pct(b->frame_ms, frames, 1.0);
  /* Per-request switch times of the timed frames, all models together. */
  double *all_sw = es_mem_calloc(ES_MEM_CLI, (size_t)frames * (size_t)b->n_models, sizeof(double));
  if (!all_sw) {
    fprintf(stderr, "edgeserve bench-lane: out of memory\n");
    return 1;
  }
  int n_all_sw = 0;
  uint64_t other_src = 0;
  for (int i = 0; i < b->n_models; i++) {
    bl_model *bm = &b->models[i];
    b->run50[i] = pct(bm->run_ms, frames, 0.5);
    for (int k = 0; k < bm->n_switch; k++)
      all_sw[n_all_sw++] = bm->switch_ns[k];
    b->sw50[i] = pct(bm->switch_ns, bm->n_switch, 0.5);
    b->swmax[i] = pct(bm->switch_ns, bm->n_switch, 1.0);
    other_src += (uint64_t)frames -
                 bm->src[b->private_mode ? ES_ARENA_FROM_POOL : ES_ARENA_FROM_LANE];
  }
  b->req_sw50 = pct(all_sw, n_all_sw, 0.5);
  b->req_swmax = pct(all_sw, n_all_sw, 1.0);
  es_mem_free(all_sw);
  if (other_src)
    fprintf(stderr, "edgeserve bench-lane: warning: %llu run(s) did not get their arena from "
                    "the %s (the runtime fell back to another source)\n",
            (unsigned long long)other_src, b->private_mode ? "model's pool" : "lane scratchpad");
  return 0;
}

/* {"name":value,...} over the models, value printed by the callback. */
static void json_per_model(const bl_run *b, void (*value)(const bl_run *, int)) {
  putchar('{');
  for (int i = 0; i < b->n_models; i++) {
    if (i)
      putchar(',');
    cli_json_string(stdout, b->models[i].name);
    putchar(':');
    value(b, i);
  }
  putchar('}');
}

static void json_run50(const bl_run *b, int i) { json_num(b->run50[i], 3); }
static void json_planned(const bl_run *b, int i) { printf("%zu", b->models[i].planned); }

static void print_json(const bl_run *b) {
  printf("{\"engine\":\"edgeserve\",\"mode\":\"%s\",\"models\":[",
         b->private_mode ? "private" : "lane");
  for (int i = 0; i < b->n_models; i++) {
    if (i)
      putchar(',');
    cli_json_string(stdout, b->models[i].name);
  }
  printf("],\"frames\":%ld,\"warmup\":%ld,\"frame_p50_ms\":", b->frames, b->warmup);
  json_num(b->f50, 3);
  printf(",\"frame_p99_ms\":");
  json_num(b->f99, 3);
  printf(",\"frame_max_ms\":");
  json_num(b->fmax, 3);
  printf(",\"run_p50_ms\":");
  json_per_model(b, json_run50);
  printf(",\"switches\":%llu,\"switch_ns_mean\":", (unsigned long long)b->ls.switches);
  json_num(b->private_mode ? NAN : b->ls.switch_ns_mean, 1);
  printf(",\"switch_ns_max\":");
  json_num(b->private_mode ? NAN : (double)b->ls.switch_ns_max, 0);
  printf(",\"request_switch_ns_p50\":");
  json_num(b->req_sw50, 0);
  printf(",\"request_switch_ns_max\":");
  json_num(b->req_swmax, 0);
  printf(",\"scratch_bytes\":%zu,\"lane_sum_bytes\":%zu,\"sum_planned_bytes\":%zu,"
         "\"planned_bytes\":", b->ls.scratch_bytes, b->ls.sum_bytes, b->sum_planned);
  json_per_model(b, json_planned);
  printf(",\"pool_bytes\":%zu,\"weights_bytes\":%zu,\"load_ms\":%.1f,"
         "\"baseline_rss_bytes\":%zu,\"peak_rss_bytes\":%zu,\"rss_bytes\":%zu,"
         "\"pss_bytes\":",
         b->rs.pool_bytes, b->rs.weights_bytes, b->load_ms, b->baseline_rss, b->peak, b->rss);
  if (b->pss)
    printf("%zu", b->pss);
  else
    printf("null");
  printf(",\"peak_reset\":%s,\"mem_tag_bytes\":{", b->peak_reset ? "true" : "false");
  for (int t = 0, first = 1; t < ES_MEM_TAG_COUNT; t++) {
    es_mem_stats mst;
    if (es_mem_stats_get((es_mem_tag)t, &mst) == 0 && (mst.current || mst.file_mapped)) {
      printf("%s\"%s\":%zu", first ? "" : ",", es_mem_tag_name((es_mem_tag)t),
             mst.current + mst.file_mapped);
      first = 0;
    }
  }
  printf("}}\n");
}

static void print_text(const bl_run *b) {
  char b1[32], b2[32], b3[32], b4[32];
  const es_lane_stats *ls = &b->ls;
  printf("bench-lane: %d model%s, one worker, %s; %ld frames after %ld warm-up\n", b->n_models,
         b->n_models > 1 ? "s" : "",
         b->private_mode ? "private arenas (one per model)" : "lane 0 (shared scratchpad)",
         b->frames, b->warmup);
  printf("frame latency ms: p50 %.3f  p99 %.3f  max %.3f\n", b->f50, b->f99, b->fmax);
  printf("  %-24s %4s %14s %12s %14s %14s\n", "model", "prio", "planned B", "run p50 ms",
         "switch p50 ns", "switch max ns");
  for (int i = 0; i < b->n_models; i++) {
    const bl_model *bm = &b->models[i];
    printf("  %-24s %4d %14zu %12.3f", bm->name, priority_of(b, i), bm->planned, b->run50[i]);
    if (bm->n_switch)
      printf(" %14.0f %14.0f\n", b->sw50[i], b->swmax[i]);
    else
      printf(" %14s %14s\n", "-", "-");
  }
  if (b->private_mode)
    printf("arenas: private pools %zu B (%s) for planned %zu B\n", b->rs.pool_bytes,
           mib(b->rs.pool_bytes, b1, sizeof b1), b->sum_planned);
  else
    printf("lane: scratchpad %zu B (%s, the max) vs %zu B (%s, the sum): %s saved; "
           "%llu switches, mean %.0f ns, max %llu ns\n",
           ls->scratch_bytes, mib(ls->scratch_bytes, b1, sizeof b1), ls->sum_bytes,
           mib(ls->sum_bytes, b2, sizeof b2),
           mib(ls->sum_bytes > ls->scratch_bytes ? ls->sum_bytes - ls->scratch_bytes : 0, b3,
               sizeof b3),
           (unsigned long long)ls->switches, ls->switch_ns_mean,
           (unsigned long long)ls->switch_ns_max);
  printf("weights: %zu B (%s); load %.1f ms\n", b->rs.weights_bytes,
         mib(b->rs.weights_bytes, b1, sizeof b1), b->load_ms);
  printf("memory: baseline RSS %s, peak RSS %s%s, RSS %s, PSS %s\n",
         mib(b->baseline_rss, b1, sizeof b1), mib(b->peak, b2, sizeof b2),
         b->peak_reset ? "" : " (from process start)", mib(b->rss, b3, sizeof b3),
         b->pss ? mib(b->pss, b4, sizeof b4) : "n/a");
  /* What the library says it holds, by subsystem: the part of memory it
   * can name. Maps count whole (the buddy pool's region is mostly never
   * touched, so not resident); code, libraries and what oneDNN or the C
   * heap keep are not in it. */
  printf("held by edgeserve (counting layer; maps counted whole, resident or not):\n ");
  for (int t = 0; t < ES_MEM_TAG_COUNT; t++) {
    es_mem_stats mst;
    if (es_mem_stats_get((es_mem_tag)t, &mst) == 0 && (mst.current || mst.file_mapped))
      printf(" %s %s", es_mem_tag_name((es_mem_tag)t),
             mib(mst.current + mst.file_mapped, b1, sizeof b1));
  }
  printf("\n");
}

/* Prepare, load, run the frames, measure. 0, or the exit status (printed). */
static int bench(bl_run *b) {
  int status = prepare(b);
  if (status)
    return status;
  /* What the probe freed goes back to the system, and the peak starts here:
   * the loads below are the runtime's own and are counted. */
  malloc_trim(0);
  b->peak_reset = es_sys_peak_rss_reset() == 0;
  es_sys_rss(&b->baseline_rss);
  cli_rss_sampler_start(&b->smp, b->baseline_rss);
  if (start_runtime(b) != 0)
    return 1;
  for (long f = -b->warmup; f < b->frames; f++)
    if (run_frame(b, f) < 0)
      return 1;
  return collect(b);
}

int cli_cmd_bench_lane(int argc, char **argv) {
  bl_run b;
  memset(&b, 0, sizeof b);
  b.frames = 100;
  b.warmup = 3;
  b.models = es_mem_calloc(ES_MEM_CLI, BL_MAX_MODELS, sizeof *b.models);
  if (!b.models) {
    fprintf(stderr, "edgeserve bench-lane: out of memory\n");
    return 1;
  }
  pthread_mutex_init(&b.sync.mu, NULL);
  pthread_cond_init(&b.sync.cv, NULL);
  int status = parse_args(&b, argc, argv);
  if (status < 0)
    status = bench(&b);
  if (status == 0 && b.rt) {
    if (b.json)
      print_json(&b);
    else
      print_text(&b);
  }
  cli_rss_sampler_stop(&b.smp);
  if (b.rt && es_runtime_destroy(b.rt) < 0)
    fprintf(stderr, "edgeserve bench-lane: %s\n", es_last_error_detail());
  for (int i = 0; i < b.n_models; i++) {
    cli_inputs_free(b.models[i].in, CLI_MAX_INPUTS);
    for (int k = 0; k < CLI_MAX_INPUTS; k++)
      es_mem_free(b.models[i].in_names[k]);
    es_mem_free(b.models[i].run_ms);
    es_mem_free(b.models[i].switch_ns);
  }
  es_mem_free(b.frame_ms);
  es_mem_free(b.models);
  pthread_mutex_destroy(&b.sync.mu);
  pthread_cond_destroy(&b.sync.cv);
  return status;
}
