/* edgeserve ocr: read the text of one image and print it as JSON.
 *
 * The OCR pipeline the way a server runs it, in miniature: a runtime (one
 * worker per core, so the recogniser's batches of one image run side by
 * side), PP-OCR's det, cls and rec models loaded into it, es_ocr_read
 * through the runtime's admission and queues. Output is one JSON object on
 * stdout so scripts and tests read it without scraping; --json is accepted
 * for symmetry with `edgeserve face` but changes nothing. "ms" is the time
 * of es_ocr_read (detection, crops, classification, recognition), the
 * median over --repeat runs; loading the models and decoding the image are
 * not in it. The first read of a new image size also plans the models for
 * its shapes (the runtime caches the plans), so --repeat shows the steady
 * state and "first_ms" the cold one. */
#include "cli/app.h"
#include "cli/cli.h"
#include "edgeserve/apps.h"
#include "edgeserve/memory.h"
#include "edgeserve/runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define OCR_CLI_MAX_LINES 1000 /* the detector's max_candidates */

static void ocr_usage(FILE *f) {
  fprintf(f,
          "usage: edgeserve ocr IMAGE [--no-cls] [--limit-side N] [--repeat N] [--json]\n"
          "                     [--precision auto|fp32|bf16]\n\n"
          "Reads the text in a JPEG or PNG image with PaddleOCR's PP-OCR models\n"
          "(detection, direction classification, recognition) and prints\n"
          "{\"image\", \"width\", \"height\", \"lines\": [{\"text\", \"confidence\", \"box\":\n"
          "[[x,y] x4]}], \"ms\", \"first_ms\"}: lines top to bottom, boxes in image pixels\n"
          "clockwise from the top-left corner. The models (ppocr_det.onnx,\n"
          "ppocr_cls.onnx, ppocr_rec.onnx, ppocr_keys_v1.txt) come from $ES_MODEL_DIR\n"
          "(default .cache/models). --no-cls skips the 180-degree classifier (text\n"
          "known to be upright). --limit-side: the longer side the detector sees\n"
          "(default 960). --repeat N: read N times, ms is the median.\n");
}

static void print_json(const char *path, const es_image *img, const es_ocr_line *lines, int n,
                       double ms, double first_ms) {
  printf("{\"image\":");
  cli_json_string(stdout, path);
  printf(",\"width\":%d,\"height\":%d,\"lines\":[", img->width, img->height);
  for (int i = 0; i < n; i++) {
    const es_ocr_line *l = &lines[i];
    printf("%s{\"text\":", i ? "," : "");
    cli_json_string(stdout, l->text);
    printf(",\"confidence\":%.4f,\"box_score\":%.4f,\"box\":[", (double)l->confidence,
           (double)l->box_score);
    for (int k = 0; k < 4; k++)
      printf("%s[%.0f,%.0f]", k ? "," : "", (double)l->box[k][0], (double)l->box[k][1]);
    printf("]}");
  }
  printf("],\"ms\":%.3f,\"first_ms\":%.3f}\n", ms, first_ms);
}

static int load_model(es_runtime *rt, const char *dir, const char *file, int precision,
                      int *id) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  es_model_config mc;
  es_model_config_default(&mc);
  mc.name = file;
  mc.path = path;
  mc.precision = (es_precision)precision;
  if (es_runtime_model_load(rt, &mc, id) < 0) {
    fprintf(stderr, "edgeserve ocr: %s: %s\n", path, es_last_error_detail());
    return -1;
  }
  return 0;
}

typedef struct ocr_run {
  es_ocr *ocr;
  const es_image *img;
  es_ocr_line *lines;
  int n;
} ocr_run;

static int read_once(void *ctx) {
  ocr_run *r = ctx;
  es_refusal why;
  return es_ocr_read(r->ocr, r->img, 0, 0, r->lines, OCR_CLI_MAX_LINES, &r->n, &why);
}

/* The options. -1 to go on, else the exit status (0 after --help). */
static int parse_args(int argc, char **argv, cli_app_opts *o, int *use_cls, long *limit) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int r;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      ocr_usage(stdout);
      return 0;
    } else if ((r = cli_app_arg(o, "ocr", argc, argv, &i)) != 0) {
      if (r == 2)
        return 2;
    } else if (!strcmp(a, "--no-cls")) {
      *use_cls = 0;
    } else if (!strcmp(a, "--limit-side") && i + 1 < argc) {
      if (cli_parse_count(argv[++i], 32, 8192, limit) < 0) {
        fprintf(stderr, "edgeserve ocr: --limit-side wants 32..8192, got '%s'\n", argv[i]);
        return 2;
      }
    } else {
      fprintf(stderr, "edgeserve ocr: unknown or incomplete option '%s'\n\n", a);
      ocr_usage(stderr);
      return 2;
    }
  }
  if (!o->image) {
    ocr_usage(stderr);
    return 2;
  }
  return -1;
}

int cli_cmd_ocr(int argc, char **argv) {
  cli_app_opts o = {.image = NULL, .repeat = 1};
  int use_cls = 1;
  long limit = 960;
  int status = parse_args(argc, argv, &o, &use_cls, &limit);
  if (status >= 0)
    return status;
  const char *dir = cli_model_dir();

  es_image img;
  if (es_image_load(o.image, &img) < 0) {
    fprintf(stderr, "edgeserve ocr: %s\n", es_last_error_detail());
    return 1;
  }

  status = 1;
  es_runtime *rt = NULL;
  ocr_run run = {.ocr = NULL, .img = &img, .lines = NULL, .n = 0};
  es_runtime_config rc;
  es_runtime_config_default(&rc);
  rc.pin = 0;
  rc.watch_ms = 0;
  if (es_runtime_create(&rc, &rt) < 0) {
    fprintf(stderr, "edgeserve ocr: runtime: %s\n", es_last_error_detail());
    goto out;
  }
  es_ocr_config oc;
  es_ocr_config_default(&oc);
  oc.det_limit_side = (int)limit;
  char keys[4096];
  snprintf(keys, sizeof keys, "%s/ppocr_keys_v1.txt", dir);
  oc.keys_path = keys;
  if (load_model(rt, dir, "ppocr_det.onnx", o.precision, &oc.det_model) < 0 ||
      load_model(rt, dir, "ppocr_rec.onnx", o.precision, &oc.rec_model) < 0 ||
      (use_cls && load_model(rt, dir, "ppocr_cls.onnx", o.precision, &oc.cls_model) < 0))
    goto out;
  if (es_ocr_create(rt, &oc, &run.ocr) < 0) {
    fprintf(stderr, "edgeserve ocr: %s\n", es_last_error_detail());
    goto out;
  }
  run.lines = es_mem_calloc(ES_MEM_CLI, OCR_CLI_MAX_LINES, sizeof *run.lines);
  if (!run.lines) {
    fprintf(stderr, "edgeserve ocr: out of memory\n");
    goto out;
  }
  double median, first;
  if (cli_app_time("ocr", o.repeat, read_once, &run, &median, &first) < 0)
    goto out;
  print_json(o.image, &img, run.lines, run.n, median, first);
  status = 0;
out:
  es_mem_free(run.lines);
  es_ocr_destroy(run.ocr);
  if (rt && es_runtime_destroy(rt) < 0)
    fprintf(stderr, "edgeserve ocr: runtime: %s\n", es_last_error_detail());
  es_image_free(&img);
  return status;
}
