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
  es_cli_inputs ci;
  int n_in;
  es_tensor in[ES_CLI_MAX_INPUTS];
  es_tensor_info shapes[ES_CLI_MAX_INPUTS];
  char *in_names[ES_CLI_MAX_INPUTS]; /* own copies: the probe model is released */
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
       cli_shapes_parse(ma.specs, bm->ci.shapes, ES_CLI_MAX_INPUTS, &bm->ci.n_shapes, why) < 0)) {
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
 * (es_cli_inputs_load would name its own options). 0, or 2 (printed). */
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
    const char *name = k < bm->ci.n_named ? bm->ci.named[k] : bm->ci.shapes[k - bm->ci.n_named].name;
    int len = k < bm->ci.n_named ? (int)(strchr(name, '=') - name)
                                 : (int)bm->ci.shapes[k - bm->ci.n_named].name_len;
    for (int i = 0; i < bm->n_in; i++)
      found |= k < bm->ci.n_named ? file_names(name, infos[i].name)
                                  : cli_shape_is(&bm->ci.shapes[k - bm->ci.n_named], infos[i].name);
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
 * shapes (es_cli_inputs_load: files, shapes, random data). 0, 1 or 2. */
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
  if ((status = es_cli_inputs_load(m, &bm->ci, label, bm->in, bm->shapes)) != 0)
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
  uint64_t t = es_cli_now_ns();
  pthread_mutex_lock(&s->mu);
  if (t > s->last_ns)
    s->last_ns = t;
  if (--s->left == 0)
    pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

static void json_num(double v, int decimals) { es_cli_json_real(stdout, v, decimals); }

static const char *mib(size_t b, char *buf, size_t n) {
  snprintf(buf, n, "%.1f MiB", cli_mib(b));
  return buf;
}

int es_cmd_bench_lane(int argc, char **argv) {
  long frames = 100, warmup = 3;
  int json = 0, private_mode = 0, n_models = 0, n_files = 0, status = 2;
  bl_input_opt files[BL_MAX_FILES];
  bl_model *models = es_mem_calloc(ES_MEM_CLI, BL_MAX_MODELS, sizeof *models);
  if (!models) {
    fprintf(stderr, "edgeserve bench-lane: out of memory\n");
    return 1;
  }
  es_runtime *rt = NULL;
  double *frame_ms = NULL;
  cli_rss_sampler smp;
  memset(&smp, 0, sizeof smp);
  bl_sync sync;
  pthread_mutex_init(&sync.mu, NULL);
  pthread_cond_init(&sync.cv, NULL);

  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      bench_lane_usage(stdout);
      status = 0;
      goto out;
    } else if (!strcmp(a, "--json")) {
      json = 1;
    } else if (!strcmp(a, "--private")) {
      private_mode = 1;
    } else if (!strcmp(a, "--frames") || !strcmp(a, "--warmup")) {
      long *dst = !strcmp(a, "--frames") ? &frames : &warmup;
      long lo = dst == &frames ? 1 : 0;
      if (i + 1 >= argc || es_cli_parse_count(argv[++i], lo, 1000000, dst) < 0) {
        fprintf(stderr, "edgeserve bench-lane: %s wants %ld..1000000\n", a, lo);
        goto out;
      }
    } else if (!strcmp(a, "--input")) {
      char *end;
      const char *v = i + 1 < argc ? argv[++i] : "";
      long idx = strtol(v, &end, 10);
      if (end == v || *end != ':' || idx < 0 || !end[1]) {
        fprintf(stderr, "edgeserve bench-lane: --input wants INDEX:NAME=FILE.npy or "
                        "INDEX:FILE.npy (INDEX: the model's position from 0), got '%s'\n", v);
        goto out;
      }
      if (n_files == BL_MAX_FILES) {
        fprintf(stderr, "edgeserve bench-lane: too many --input options\n");
        goto out;
      }
      files[n_files].model = idx;
      files[n_files++].value = end + 1;
    } else if (a[0] == '-') {
      fprintf(stderr, "edgeserve bench-lane: unknown option '%s'\n", a);
      bench_lane_usage(stderr);
      goto out;
    } else {
      if (n_models == BL_MAX_MODELS) {
        fprintf(stderr, "edgeserve bench-lane: at most %d models\n", BL_MAX_MODELS);
        goto out;
      }
      models[n_models].arg = a;
      models[n_models].id = -1;
      if (parse_model_arg(&models[n_models]) < 0)
        goto out;
      model_name(models, n_models);
      n_models++;
    }
  }
  if (n_models == 0) {
    bench_lane_usage(stderr);
    goto out;
  }
  for (int k = 0; k < n_files; k++) {
    if (files[k].model >= n_models) {
      fprintf(stderr, "edgeserve bench-lane: --input %ld:%s: no model %ld (models are 0..%d)\n",
              files[k].model, files[k].value, files[k].model, n_models - 1);
      goto out;
    }
    es_cli_inputs *ci = &models[files[k].model].ci;
    int named = strchr(files[k].value, '=') != NULL;
    if ((named ? ci->n_named : ci->n_pos) == ES_CLI_MAX_INPUTS) {
      fprintf(stderr, "edgeserve bench-lane: too many --input options for model %ld\n",
              files[k].model);
      goto out;
    }
    if (named)
      ci->named[ci->n_named++] = files[k].value;
    else
      ci->positional[ci->n_pos++] = files[k].value;
  }

  /* ---- inputs and shapes, before the runtime exists ---- */
  for (int i = 0; i < n_models; i++)
    if ((status = probe_model(&models[i], i)) != 0)
      goto out;
  status = 1;
  for (int i = 0; i < n_models; i++) {
    models[i].run_ms = es_mem_calloc(ES_MEM_CLI, (size_t)frames, sizeof(double));
    models[i].switch_ns = es_mem_calloc(ES_MEM_CLI, (size_t)frames, sizeof(double));
    if (!models[i].run_ms || !models[i].switch_ns)
      goto oom;
  }
  frame_ms = es_mem_calloc(ES_MEM_CLI, (size_t)frames, sizeof *frame_ms);
  if (!frame_ms)
    goto oom;
  /* What the probe freed goes back to the system, and the peak starts here:
   * the loads below are the runtime's own and are counted. */
  malloc_trim(0);
  int peak_reset = es_sys_peak_rss_reset() == 0;
  size_t baseline_rss = 0;
  es_sys_rss(&baseline_rss);
  cli_rss_sampler_start(&smp, baseline_rss);

  /* ---- the runtime: one worker = one lane ---- */
  es_runtime_config rc;
  es_runtime_config_default(&rc);
  rc.workers = 1;
  rc.pin = 1;
  rc.priorities = n_models > 4 ? n_models : 4;
  if (es_runtime_create(&rc, &rt) < 0) {
    fprintf(stderr, "edgeserve bench-lane: cannot create the runtime: %s\n",
            es_last_error_detail());
    goto out;
  }
  uint64_t t_load = es_cli_now_ns();
  for (int i = 0; i < n_models; i++) {
    es_model_config mc;
    es_model_config_default(&mc);
    mc.name = models[i].name;
    mc.path = models[i].path;
    mc.shapes = models[i].shapes;
    mc.n_shapes = models[i].n_in;
    mc.lane = private_mode ? -1 : 0;
    mc.arenas = private_mode ? 1 : 0;
    if (es_runtime_model_load(rt, &mc, &models[i].id) < 0) {
      fprintf(stderr, "edgeserve bench-lane: cannot load %s: %s\n", models[i].path,
              es_last_error_detail());
      goto out;
    }
  }
  double load_ms = (double)(es_cli_now_ns() - t_load) / 1e6;

  /* ---- frames ---- */
  es_request *req[BL_MAX_MODELS];
  for (long f = -warmup; f < frames; f++) {
    int submitted = 0, failed = 0;
    pthread_mutex_lock(&sync.mu);
    sync.left = n_models;
    sync.last_ns = 0;
    pthread_mutex_unlock(&sync.mu);
    uint64_t t0 = es_cli_now_ns();
    for (int i = 0; i < n_models; i++) {
      es_submit s = {.model = models[i].id, .inputs = models[i].in,
                     .n_inputs = models[i].n_in,
                     .priority = i < rc.priorities ? i : rc.priorities - 1,
                     .on_done = on_done, .user = &sync};
      es_refusal why;
      int r = es_runtime_submit(rt, &s, &req[i], &why);
      if (r < 0) {
        if (r == ES_EAGAIN)
          fprintf(stderr, "edgeserve bench-lane: %s refused (%s, retry after %u ms)\n",
                  models[i].name, es_refusal_name(why.reason), why.retry_after_ms);
        else
          fprintf(stderr, "edgeserve bench-lane: %s: %s\n", models[i].name,
                  es_last_error_detail());
        failed = 1;
        break;
      }
      submitted++;
    }
    /* Wait for what was submitted; a failed submit has no callback coming. */
    pthread_mutex_lock(&sync.mu);
    sync.left -= n_models - submitted;
    while (sync.left > 0)
      pthread_cond_wait(&sync.cv, &sync.mu);
    uint64_t t_end = sync.last_ns;
    pthread_mutex_unlock(&sync.mu);
    for (int i = 0; i < submitted; i++) {
      int st = es_request_wait(req[i], -1);
      es_request_info info;
      if (st == 0 && es_request_info_get(req[i], &info) == 0 && f >= 0) {
        bl_model *bm = &models[i];
        bm->run_ms[f] = (double)info.run_ns / 1e6;
        if (info.switch_ns)
          bm->switch_ns[bm->n_switch++] = (double)info.switch_ns;
        if (info.arena_source >= 0 && info.arena_source < 4)
          bm->src[info.arena_source]++;
      } else if (st != 0) {
        fprintf(stderr, "edgeserve bench-lane: %s failed: %s (%s)\n", models[i].name,
                es_err_name(st), es_strerror(st));
        failed = 1;
      }
      es_request_free(req[i]);
    }
    if (failed)
      goto out;
    if (f >= 0)
      frame_ms[f] = (double)(t_end - t0) / 1e6;
  }

  /* ---- numbers ---- */
  cli_rss_sampler_stop(&smp);
  size_t peak = 0, rss = 0, pss = cli_pss();
  es_sys_rss(&rss);
  es_sys_peak_rss(&peak);
  if (atomic_load(&smp.max) > peak)
    peak = atomic_load(&smp.max);
  if (rss > peak) /* read a moment apart: the peak is never below the end */
    peak = rss;
  es_runtime_stats rs;
  es_lane_stats ls;
  memset(&ls, 0, sizeof ls);
  if (es_runtime_stats_get(rt, &rs) < 0 || es_runtime_lane_stats_get(rt, 0, &ls) < 0) {
    fprintf(stderr, "edgeserve bench-lane: %s\n", es_last_error_detail());
    goto out;
  }
  size_t sum_planned = 0;
  for (int i = 0; i < n_models; i++) {
    es_runtime_model_stats ms;
    if (es_runtime_model_stats_get(rt, models[i].id, &ms) == 0) {
      models[i].planned = ms.planned_bytes;
      models[i].pool = ms.pool_bytes;
    }
    sum_planned += models[i].planned;
  }
  double f50 = pct(frame_ms, (int)frames, 0.5), f99 = pct(frame_ms, (int)frames, 0.99),
         fmax = pct(frame_ms, (int)frames, 1.0);
  double run50[BL_MAX_MODELS], sw50[BL_MAX_MODELS], swmax[BL_MAX_MODELS];
  /* Per-request switch times of the timed frames, all models together. */
  double *all_sw = es_mem_calloc(ES_MEM_CLI, (size_t)frames * (size_t)n_models, sizeof(double));
  int n_all_sw = 0;
  if (!all_sw)
    goto oom;
  uint64_t other_src = 0;
  for (int i = 0; i < n_models; i++) {
    bl_model *bm = &models[i];
    run50[i] = pct(bm->run_ms, (int)frames, 0.5);
    for (int k = 0; k < bm->n_switch; k++)
      all_sw[n_all_sw++] = bm->switch_ns[k];
    sw50[i] = pct(bm->switch_ns, bm->n_switch, 0.5);
    swmax[i] = pct(bm->switch_ns, bm->n_switch, 1.0);
    other_src += (uint64_t)frames - bm->src[private_mode ? ES_ARENA_FROM_POOL : ES_ARENA_FROM_LANE];
  }
  double req_sw50 = pct(all_sw, n_all_sw, 0.5), req_swmax = pct(all_sw, n_all_sw, 1.0);
  es_mem_free(all_sw);
  if (other_src)
    fprintf(stderr, "edgeserve bench-lane: warning: %llu run(s) did not get their arena from "
                    "the %s (the runtime fell back to another source)\n",
            (unsigned long long)other_src, private_mode ? "model's pool" : "lane scratchpad");

  if (json) {
    printf("{\"engine\":\"edgeserve\",\"mode\":\"%s\",\"models\":[",
           private_mode ? "private" : "lane");
    for (int i = 0; i < n_models; i++) {
      if (i)
        putchar(',');
      es_cli_json_string(stdout, models[i].name);
    }
    printf("],\"frames\":%ld,\"warmup\":%ld,\"frame_p50_ms\":", frames, warmup);
    json_num(f50, 3);
    printf(",\"frame_p99_ms\":");
    json_num(f99, 3);
    printf(",\"frame_max_ms\":");
    json_num(fmax, 3);
    printf(",\"run_p50_ms\":{");
    for (int i = 0; i < n_models; i++) {
      if (i)
        putchar(',');
      es_cli_json_string(stdout, models[i].name);
      putchar(':');
      json_num(run50[i], 3);
    }
    printf("},\"switches\":%llu,\"switch_ns_mean\":", (unsigned long long)ls.switches);
    json_num(private_mode ? NAN : ls.switch_ns_mean, 1);
    printf(",\"switch_ns_max\":");
    json_num(private_mode ? NAN : (double)ls.switch_ns_max, 0);
    printf(",\"request_switch_ns_p50\":");
    json_num(req_sw50, 0);
    printf(",\"request_switch_ns_max\":");
    json_num(req_swmax, 0);
    printf(",\"scratch_bytes\":%zu,\"lane_sum_bytes\":%zu,\"sum_planned_bytes\":%zu,"
           "\"planned_bytes\":{", ls.scratch_bytes, ls.sum_bytes, sum_planned);
    for (int i = 0; i < n_models; i++) {
      if (i)
        putchar(',');
      es_cli_json_string(stdout, models[i].name);
      printf(":%zu", models[i].planned);
    }
    printf("},\"pool_bytes\":%zu,\"weights_bytes\":%zu,\"load_ms\":%.1f,"
           "\"baseline_rss_bytes\":%zu,\"peak_rss_bytes\":%zu,\"rss_bytes\":%zu,"
           "\"pss_bytes\":",
           rs.pool_bytes, rs.weights_bytes, load_ms, baseline_rss, peak, rss);
    if (pss)
      printf("%zu", pss);
    else
      printf("null");
    printf(",\"peak_reset\":%s,\"mem_tag_bytes\":{", peak_reset ? "true" : "false");
    for (int t = 0, first = 1; t < ES_MEM_TAG_COUNT; t++) {
      es_mem_stats mst;
      if (es_mem_stats_get((es_mem_tag)t, &mst) == 0 && (mst.current || mst.file_mapped)) {
        printf("%s\"%s\":%zu", first ? "" : ",", es_mem_tag_name((es_mem_tag)t),
               mst.current + mst.file_mapped);
        first = 0;
      }
    }
    printf("}}\n");
  } else {
    char b1[32], b2[32], b3[32], b4[32];
    printf("bench-lane: %d model%s, one worker, %s; %ld frames after %ld warm-up\n", n_models,
           n_models > 1 ? "s" : "",
           private_mode ? "private arenas (one per model)" : "lane 0 (shared scratchpad)",
           frames, warmup);
    printf("frame latency ms: p50 %.3f  p99 %.3f  max %.3f\n", f50, f99, fmax);
    printf("  %-24s %4s %14s %12s %14s %14s\n", "model", "prio", "planned B", "run p50 ms",
           "switch p50 ns", "switch max ns");
    for (int i = 0; i < n_models; i++) {
      printf("  %-24s %4d %14zu %12.3f", models[i].name, i < rc.priorities ? i : rc.priorities - 1,
             models[i].planned, run50[i]);
      if (models[i].n_switch)
        printf(" %14.0f %14.0f\n", sw50[i], swmax[i]);
      else
        printf(" %14s %14s\n", "-", "-");
    }
    if (private_mode)
      printf("arenas: private pools %zu B (%s) for planned %zu B\n", rs.pool_bytes,
             mib(rs.pool_bytes, b1, sizeof b1), sum_planned);
    else
      printf("lane: scratchpad %zu B (%s, the max) vs %zu B (%s, the sum): %s saved; "
             "%llu switches, mean %.0f ns, max %llu ns\n",
             ls.scratch_bytes, mib(ls.scratch_bytes, b1, sizeof b1), ls.sum_bytes,
             mib(ls.sum_bytes, b2, sizeof b2),
             mib(ls.sum_bytes > ls.scratch_bytes ? ls.sum_bytes - ls.scratch_bytes : 0, b3,
                 sizeof b3),
             (unsigned long long)ls.switches, ls.switch_ns_mean,
             (unsigned long long)ls.switch_ns_max);
    printf("weights: %zu B (%s); load %.1f ms\n", rs.weights_bytes,
           mib(rs.weights_bytes, b1, sizeof b1), load_ms);
    printf("memory: baseline RSS %s, peak RSS %s%s, RSS %s, PSS %s\n",
           mib(baseline_rss, b1, sizeof b1), mib(peak, b2, sizeof b2),
           peak_reset ? "" : " (from process start)", mib(rss, b3, sizeof b3),
           pss ? mib(pss, b4, sizeof b4) : "n/a");
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
  status = 0;
  goto out;
oom:
  fprintf(stderr, "edgeserve bench-lane: out of memory\n");
  status = 1;
out:
  cli_rss_sampler_stop(&smp);
  if (rt && es_runtime_destroy(rt) < 0)
    fprintf(stderr, "edgeserve bench-lane: %s\n", es_last_error_detail());
  for (int i = 0; i < n_models; i++) {
    es_cli_inputs_free(models[i].in, ES_CLI_MAX_INPUTS);
    for (int k = 0; k < ES_CLI_MAX_INPUTS; k++)
      es_mem_free(models[i].in_names[k]);
    es_mem_free(models[i].run_ms);
    es_mem_free(models[i].switch_ns);
  }
  es_mem_free(frame_ms);
  es_mem_free(models);
  pthread_mutex_destroy(&sync.mu);
  pthread_cond_destroy(&sync.cv);
  return status;
}
