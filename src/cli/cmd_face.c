/* edgeserve face: detect faces in one image and print them as JSON.
 *
 * The pipeline the way a server runs it, in miniature: a runtime with one
 * worker, the BlazeFace model loaded into it, es_face_detect through the
 * runtime's admission and queue. Output is JSON (one object on stdout) so
 * scripts and the e2e tests can read it without scraping; --json is accepted
 * for symmetry with other tools but changes nothing. "ms" is the time of
 * es_face_detect (resize, run, decode, suppression), the median over
 * --repeat runs; model loading and image decoding are not in it. */
#include "cli/app.h"
#include "cli/cli.h"
#include "edgeserve/apps.h"
#include "edgeserve/runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FACE_MAX 64

static void face_usage(FILE *f) {
  fprintf(f,
          "usage: edgeserve face IMAGE [--model front|back|FILE.onnx] [--min-score S]\n"
          "                      [--repeat N] [--json] [--precision auto|fp32|bf16|int8]\n\n"
          "Detects faces in a JPEG or PNG image with MediaPipe's BlazeFace and prints\n"
          "{\"image\", \"width\", \"height\", \"faces\": [{\"box\": [x0,y0,x1,y1], \"score\",\n"
          "\"keypoints\": [[x,y] x6]}], \"ms\"} in image pixels, best first. Keypoints:\n"
          "right eye, left eye, nose, mouth, right ear, left ear (the subject's).\n"
          "--model: front (blazeface_front_128.onnx, close faces; the default), back\n"
          "(blazeface_back_256.onnx, faces further away) from $ES_MODEL_DIR (default\n"
          ".cache/models), or a model file. --min-score: default 0.5. --repeat N:\n"
          "detect N times, ms is the median.\n");
}

static void print_json(const char *path, const es_image *img, const es_face *faces, int n,
                       double ms) {
  printf("{\"image\":");
  cli_json_string(stdout, path);
  printf(",\"width\":%d,\"height\":%d,\"faces\":[", img->width, img->height);
  for (int i = 0; i < n; i++) {
    const es_face *f = &faces[i];
    printf("%s{\"box\":[%.1f,%.1f,%.1f,%.1f],\"score\":%.4f,\"keypoints\":[", i ? "," : "",
           (double)f->x0, (double)f->y0, (double)f->x1, (double)f->y1, (double)f->score);
    for (int k = 0; k < 6; k++)
      printf("%s[%.1f,%.1f]", k ? "," : "", (double)f->keypoints[k][0],
             (double)f->keypoints[k][1]);
    printf("]}");
  }
  printf("],\"ms\":%.3f}\n", ms);
}

typedef struct face_run {
  es_face_detector *fd;
  const es_image *img;
  float min_score;
  es_face faces[FACE_MAX];
  int n;
} face_run;

static int detect_once(void *ctx) {
  face_run *f = ctx;
  es_refusal why;
  return es_face_detect(f->fd, f->img, f->min_score, 0, 0, f->faces, FACE_MAX, &f->n, &why);
}

/* The options. -1 to go on, else the exit status (0 after --help). */
static int parse_args(int argc, char **argv, cli_app_opts *o, const char **model,
                      double *min_score) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int r;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      face_usage(stdout);
      return 0;
    } else if ((r = cli_app_arg(o, "face", argc, argv, &i)) != 0) {
      if (r == 2)
        return 2;
    } else if (!strcmp(a, "--model") && i + 1 < argc) {
      *model = argv[++i];
    } else if (!strcmp(a, "--min-score") && i + 1 < argc) {
      char *end;
      *min_score = strtod(argv[++i], &end);
      if (*end || end == argv[i] || !(*min_score > 0 && *min_score <= 1)) {
        fprintf(stderr, "edgeserve face: --min-score wants a number in (0, 1], got '%s'\n",
                argv[i]);
        return 2;
      }
    } else {
      fprintf(stderr, "edgeserve face: unknown or incomplete option '%s'\n\n", a);
      face_usage(stderr);
      return 2;
    }
  }
  if (!o->image) {
    face_usage(stderr);
    return 2;
  }
  return -1;
}

int cli_cmd_face(int argc, char **argv) {
  cli_app_opts o = {.image = NULL, .repeat = 1};
  const char *model = "front";
  double min_score = 0.5;
  int status = parse_args(argc, argv, &o, &model, &min_score);
  if (status >= 0)
    return status;

  char path[4096];
  const char *dir = cli_model_dir();
  if (!strcmp(model, "front"))
    snprintf(path, sizeof path, "%s/blazeface_front_128.onnx", dir);
  else if (!strcmp(model, "back"))
    snprintf(path, sizeof path, "%s/blazeface_back_256.onnx", dir);
  else
    snprintf(path, sizeof path, "%s", model);

  es_image img;
  if (es_image_load(o.image, &img) < 0) {
    fprintf(stderr, "edgeserve face: %s\n", es_last_error_detail());
    return 1;
  }

  status = 1;
  es_runtime *rt = NULL;
  face_run f = {.fd = NULL, .img = &img, .min_score = (float)min_score, .n = 0};
  es_runtime_config rc;
  es_runtime_config_default(&rc);
  rc.workers = 1; /* one image, one request at a time */
  rc.pin = 0;
  rc.watch_ms = 0;
  if (es_runtime_create(&rc, &rt) < 0) {
    fprintf(stderr, "edgeserve face: runtime: %s\n", es_last_error_detail());
    goto out;
  }
  es_model_config mc;
  es_model_config_default(&mc);
  mc.name = "face";
  mc.path = path;
  mc.precision = (es_precision)o.precision;
  int id;
  if (es_runtime_model_load(rt, &mc, &id) < 0) {
    fprintf(stderr, "edgeserve face: %s: %s\n", path, es_last_error_detail());
    if (strcmp(model, "front") == 0 || strcmp(model, "back") == 0)
      fprintf(stderr, "edgeserve face: fetch the models with scripts/setup/fetch-models.sh\n");
    goto out;
  }
  if (es_face_detector_create(rt, id, &f.fd) < 0) {
    fprintf(stderr, "edgeserve face: %s: %s\n", path, es_last_error_detail());
    goto out;
  }
  double median, first;
  if (cli_app_time("face", o.repeat, detect_once, &f, &median, &first) < 0)
    goto out;
  print_json(o.image, &img, f.faces, f.n, median);
  status = 0;
out:
  es_face_detector_destroy(f.fd);
  if (rt && es_runtime_destroy(rt) < 0)
    fprintf(stderr, "edgeserve face: runtime shutdown: %s\n", es_last_error_detail());
  es_image_free(&img);
  return status;
}
