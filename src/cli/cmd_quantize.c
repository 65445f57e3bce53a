/* edgeserve quantize: an FP32 ONNX model in, a QDQ int8 ONNX model out,
 * calibrated on a folder of samples (quantize.h does the work).
 *
 * A sample is a .npy file (a single-input model), a folder of NAME.npy
 * files (one per input), or an image, which goes through a pipeline's own
 * preprocessing (--preprocess): the OCR detector's resize and
 * normalisation, or the face detector's letterbox. So the ranges come
 * from what the model sees when it serves. */
#include "cli/cli.h"
#include "cli/npy.h"
#include "edgeserve/apps.h"
#include "edgeserve/engine.h"
#include "edgeserve/memory.h"
#include "edgeserve/quantize.h"

#include <dirent.h>
#include <errno.h>
#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#define QCLI_MAX_EXCLUDE 256
#define QCLI_MAX_FILES 100000

static void quantize_usage(FILE *f) {
  fprintf(f,
          "usage: edgeserve quantize MODEL.onnx -o OUT.onnx --calibrate DIR\n"
          "                          [--method minmax|percentile|mse] [--percentile P]\n"
          "                          [--preprocess ocr-det[:LIMIT]|face] [--exclude NODE]...\n"
          "                          [--target-db DB] [--judge snr|faces[:IOU]]\n"
          "                          [--eval-samples N] [--keep-float-weights]\n"
          "                          [--bias-correction weights|all|none]\n"
          "                          [--rounding nearest|gptq]\n"
          "                          [--max-samples N] [--save-inputs DIR]\n\n"
          "Writes a standard QDQ ONNX model (QuantizeLinear / DequantizeLinear, opset 13 or\n"
          "newer) that edgeserve and ONNX Runtime both run: Conv, ConvTranspose, MatMul and\n"
          "Gemm weights in int8 (symmetric, per output channel), biases in int32, their\n"
          "activations in uint8 with ranges from calibration.\n\n"
          "DIR holds the calibration samples, taken in name order: .npy files (a model of\n"
          "one input), folders of INPUT_NAME.npy files (one per input), or JPEG/PNG\n"
          "images with --preprocess: ocr-det (the OCR pipeline's detector input; LIMIT\n"
          "is its longer side, default 960) or face (the face detector's letterboxed\n"
          "input, its side and layout read from the model).\n"
          "--method: minmax (default), percentile (the range holding P %% of the\n"
          "values, default 99.999) or mse (the range whose quantization leaves the least\n"
          "squared error over the values seen). --exclude keeps a node (by name) in float.\n"
          "--target-db keeps in float the nodes it takes for every output to stay within\n"
          "DB of FP32 (signal to quantization noise, on the first N samples: --eval-samples,\n"
          "default 4): each node's sensitivity is measured alone, and the least sensitive\n"
          "go to int8. A Conv it keeps in float still gets int8 weights (DequantizeLinear\n"
          "of int8 weights into the float Conv: weight-only int8, a quarter of the bytes),\n"
          "unless that alone misses the target; --keep-float-weights keeps their weights\n"
          "float. The search runs int8 first and weight-only first, and keeps the model\n"
          "of fewer weight bytes.\n"
          "--judge faces (a face detector) makes the search judge by the faces found: a\n"
          "candidate holds if, on each of those samples, it finds as many faces as FP32 at\n"
          "the pipeline's score 0.5 and at 0.25, each of FP32's boxes matched at IoU >= IOU\n"
          "(default 0.98); with --target-db too, the SNR must also hold. The SNR alone\n"
          "cannot see a detection: score logits far below 0, where nothing is found,\n"
          "swamp it. snr (default): the SNR alone.\n"
          "--bias-correction: the Convs whose bias takes back the mean shift their int8\n"
          "weights make (the weights' rounding times the mean input each kernel tap read in\n"
          "calibration): weights (default: the weight-only ones, whose input is float), all\n"
          "(the int8 ones too: may help or hurt, measure) or none.\n"
          "--rounding: how a weight-only Conv's weights become int8. nearest (default):\n"
          "each to its nearest step. gptq: one by one, each one's rounding error moved onto\n"
          "those not yet rounded, weighed by the second moments of the Conv's input in\n"
          "calibration: the output's error is lowered, not each weight's, and the search\n"
          "can leave fewer weights in float. Same file format; needs the search (--target-db\n"
          "or --judge) and calibration takes longer.\n"
          "--save-inputs writes each sample's inputs as DIR/NNNN[_INPUT].npy: what the\n"
          "model saw, to run it again elsewhere (ONNX Runtime).\n");
}

typedef struct qcli {
  const char *model_path, *out_path, *dir, *save_dir;
  es_quant_options opt;
  const char *exclude[QCLI_MAX_EXCLUDE];
  int prep; /* 0 none, 1 ocr-det, 2 face */
  int det_limit;
  long max_samples;
  /* --judge faces[:IOU]: the search keeps a candidate only if it finds
     FP32's faces (at the pipeline's score 0.5 and at half that), each box at
     IoU >= judge_iou */
  int judge_faces;
  double judge_iou;
  int face_side;          /* the model's input side, read after create */
  unsigned long judged, refused;
} qcli;

#define QCLI_FACES 64

/* The faces at min_score in outs, or -1 (the error printed). */
static int judge_decode(const qcli *c, const es_tensor *outs, int n, float min_score,
                        es_face *f) {
  int k = 0;
  if (es_face_decode(outs, n, c->face_side, min_score, f, QCLI_FACES, &k) < 0) {
    fprintf(stderr, "edgeserve quantize: --judge faces: %s\n", es_last_error_detail());
    return -1;
  }
  return k;
}

/* es_quant_options.judge for --judge faces: the candidate finds as many
 * faces as FP32 at the pipeline's threshold (0.5) and at half of it (a
 * face FP32 scores just under 0.5 that the candidate moves is the next
 * image's false detection), and each of FP32's faces at 0.5 has its own
 * candidate face with IoU >= judge_iou. The outputs' SNR cannot tell
 * this: a detector's score logits run to -100 and below where there is
 * nothing, and their error there, which changes no detection, swamps the
 * measure, while a logit near 0 that crosses over is one false face. */
static int judge_faces(void *user, const es_tensor *fp32, const es_tensor *got, int n) {
  qcli *c = user;
  es_face a[QCLI_FACES], b[QCLI_FACES];
  c->judged++;
  int ok = 1;
  for (int t = 0; t < 2 && ok; t++) {
    float thr = t ? 0.25f : 0.5f;
    int na = judge_decode(c, fp32, n, thr, a), nb = judge_decode(c, got, n, thr, b);
    if (na < 0 || nb < 0)
      return ES_EINVAL;
    ok = na == nb;
    unsigned long long used = 0;
    for (int i = 0; i < na && ok && t == 0; i++) {
      int best = -1;
      float bi = 0;
      for (int j = 0; j < nb && j < 64; j++) {
        float v = es_face_iou(&a[i], &b[j]);
        if (!(used >> j & 1) && v > bi) {
          bi = v;
          best = j;
        }
      }
      ok = best >= 0 && bi >= c->judge_iou;
      if (ok)
        used |= 1ull << best;
    }
  }
  c->refused += !ok;
  return ok;
}

/* v's index in names (NULL-terminated, in the enum's order), or -1 with
 * the choices printed. */
static int pick(const char *opt, const char *v, const char *const *names) {
  for (int i = 0; names[i]; i++)
    if (!strcmp(v, names[i]))
      return i;
  fprintf(stderr, "edgeserve quantize: %s is ", opt);
  for (int i = 0; names[i]; i++)
    fprintf(stderr, "%s%s", names[i], !names[i + 1] ? "" : !names[i + 2] ? " or " : ", ");
  fprintf(stderr, ", not '%s'\n", v);
  return -1;
}

static int has_ext(const char *name, const char *ext) {
  size_t n = strlen(name), e = strlen(ext);
  return n > e && !strcasecmp(name + n - e, ext);
}

static int is_image(const char *name) {
  return has_ext(name, ".png") || has_ext(name, ".jpg") || has_ext(name, ".jpeg");
}

static int name_cmp(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static void free_list(char **v, int n) {
  for (int i = 0; i < n; i++)
    es_mem_free(v[i]);
  es_mem_free(v);
}

/* The entries of dir (not starting with '.'), sorted; es_mem-allocated. */
static int list_dir(const char *dir, char ***out, int *n) {
  DIR *d = opendir(dir);
  if (!d) {
    fprintf(stderr, "edgeserve quantize: cannot open %s\n", dir);
    return 1;
  }
  char **v = NULL;
  int cnt = 0, cap = 0, oom = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL && cnt < QCLI_MAX_FILES) {
    if (e->d_name[0] == '.')
      continue;
    if (cnt == cap) {
      cap = cap ? cap * 2 : 64;
      char **nv = v ? es_mem_realloc(v, (size_t)cap * sizeof *nv)
                    : es_mem_alloc(ES_MEM_CLI, (size_t)cap * sizeof *nv);
      if (!nv) {
        oom = 1;
        break;
      }
      v = nv;
    }
    if (!(v[cnt] = es_mem_strdup(ES_MEM_CLI, e->d_name))) {
      oom = 1;
      break;
    }
    cnt++;
  }
  closedir(d);
  if (oom) {
    free_list(v, cnt);
    fprintf(stderr, "edgeserve quantize: out of memory listing %s\n", dir);
    return 1;
  }
  if (cnt > 1)
    qsort(v, (size_t)cnt, sizeof *v, name_cmp);
  *out = v;
  *n = cnt;
  return 0;
}

static void free_tensors(es_tensor *t, int n) {
  for (int i = 0; i < n; i++) {
    es_mem_free(t[i].data);
    t[i].data = NULL;
  }
}

/* One sample's inputs from path (a file or a folder). 0: ok; 1: error
 * (printed); 3: not a sample (skipped). */
static int sample_load(const qcli *c, es_model *m, const char *path, int is_dir, es_tensor *in,
                       int n_in) {
  memset(in, 0, (size_t)n_in * sizeof *in);
  if (is_dir) {
    for (int i = 0; i < n_in; i++) {
      es_tensor_info ti;
      es_model_input_info(m, i, &ti);
      char fname[256], full[4096];
      cli_npy_file_name(ti.name, fname, sizeof fname);
      int len = snprintf(full, sizeof full, "%s/%s.npy", path, fname);
      if (len < 0 || (size_t)len >= sizeof full) {
        fprintf(stderr, "edgeserve quantize: %s/%s.npy: the path is too long\n", path, fname);
        free_tensors(in, i);
        return 1;
      }
      if (cli_npy_read(full, &in[i]) < 0) {
        fprintf(stderr, "edgeserve quantize: %s: %s\n", full, es_last_error_detail());
        free_tensors(in, i);
        return 1;
      }
    }
    return 0;
  }
  if (has_ext(path, ".npy")) {
    if (n_in != 1) {
      fprintf(stderr, "edgeserve quantize: %s: the model has %d inputs; give each sample as a "
                      "folder of INPUT_NAME.npy files\n", path, n_in);
      return 1;
    }
    if (cli_npy_read(path, &in[0]) < 0) {
      fprintf(stderr, "edgeserve quantize: %s: %s\n", path, es_last_error_detail());
      return 1;
    }
    return 0;
  }
  if (!is_image(path))
    return 3;
  if (!c->prep) {
    fprintf(stderr, "edgeserve quantize: %s is an image: say how to turn it into the model's "
                    "input (--preprocess ocr-det or face)\n", path);
    return 1;
  }
  if (n_in != 1) {
    fprintf(stderr, "edgeserve quantize: --preprocess needs a model of one input (%d)\n", n_in);
    return 1;
  }
  es_image img;
  if (es_image_load(path, &img) < 0) {
    fprintf(stderr, "edgeserve quantize: %s: %s\n", path, es_last_error_detail());
    return 1;
  }
  int rc;
  if (c->prep == 1) {
    rc = es_ocr_det_input(&img, c->det_limit, &in[0]);
  } else {
    es_tensor_info ti;
    es_model_input_info(m, 0, &ti);
    int nchw = ti.rank == 4 && ti.dims[1] == 3;
    int side = (int)(nchw ? ti.dims[2] : ti.dims[1]);
    if (ti.rank != 4 || side < 8) {
      es_image_free(&img);
      fprintf(stderr, "edgeserve quantize: --preprocess face needs a fixed 1xSxSx3 or 1x3xSxS "
                      "input\n");
      return 1;
    }
    rc = es_face_input(&img, side, nchw, &in[0]);
  }
  es_image_free(&img);
  if (rc < 0) {
    fprintf(stderr, "edgeserve quantize: %s: %s\n", path, es_last_error_detail());
    return 1;
  }
  return 0;
}

static int parse(qcli *c, int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int more = i + 1 < argc;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      quantize_usage(stdout);
      return -1;
    } else if ((!strcmp(a, "-o") || !strcmp(a, "--output")) && more) {
      c->out_path = argv[++i];
    } else if (!strcmp(a, "--target-db") && more) {
      char *end;
      c->opt.target_db = strtod(argv[++i], &end);
      if (*end || !(c->opt.target_db > 0 && c->opt.target_db <= 200)) {
        fprintf(stderr, "edgeserve quantize: --target-db takes a ratio in (0, 200] dB\n");
        return 2;
      }
    } else if (!strcmp(a, "--save-inputs") && more) {
      c->save_dir = argv[++i];
    } else if (!strcmp(a, "--calibrate") && more) {
      c->dir = argv[++i];
    } else if (!strcmp(a, "--method") && more) {
      static const char *const m[] = {"minmax", "percentile", "mse", NULL}; /* es_quant_method */
      int k = pick(a, argv[++i], m);
      if (k < 0)
        return 2;
      c->opt.method = (es_quant_method)k;
    } else if (!strcmp(a, "--percentile") && more) {
      char *end;
      c->opt.percentile = strtod(argv[++i], &end);
      if (*end || !(c->opt.percentile > 50 && c->opt.percentile <= 100)) {
        fprintf(stderr, "edgeserve quantize: --percentile takes a number in (50, 100]\n");
        return 2;
      }
    } else if (!strcmp(a, "--bias-correction") && more) {
      static const char *const m[] = {"weights", "all", "none", NULL}; /* in enum order */
      int k = pick(a, argv[++i], m);
      if (k < 0)
        return 2;
      c->opt.bias_correction = (es_quant_bias_correction)k;
    } else if (!strcmp(a, "--rounding") && more) {
      static const char *const m[] = {"nearest", "gptq", NULL}; /* in enum order */
      int k = pick(a, argv[++i], m);
      if (k < 0)
        return 2;
      c->opt.rounding = (es_quant_rounding)k;
    } else if (!strcmp(a, "--eval-samples") && more) {
      char *end;
      long v = strtol(argv[++i], &end, 10);
      if (*end || v < 1 || v > 64) {
        fprintf(stderr, "edgeserve quantize: --eval-samples takes a count in [1, 64]\n");
        return 2;
      }
      c->opt.eval_samples = (int)v;
    } else if (!strcmp(a, "--judge") && more) {
      const char *v = argv[++i];
      c->judge_iou = 0.98;
      if (!strncmp(v, "faces", 5) && (v[5] == '\0' || v[5] == ':')) {
        char *end = NULL;
        if (v[5] == ':')
          c->judge_iou = strtod(v + 6, &end);
        if ((end && *end) || !(c->judge_iou > 0 && c->judge_iou <= 1)) {
          fprintf(stderr, "edgeserve quantize: faces:IOU takes an IoU in (0, 1]\n");
          return 2;
        }
        c->judge_faces = 1;
      } else if (!strcmp(v, "snr")) {
        c->judge_faces = 0;
      } else {
        fprintf(stderr, "edgeserve quantize: --judge is snr or faces[:IOU]\n");
        return 2;
      }
    } else if (!strcmp(a, "--keep-float-weights")) {
      c->opt.keep_float_weights = 1;
    } else if (!strcmp(a, "--exclude") && more) {
      if (c->opt.n_exclude == QCLI_MAX_EXCLUDE) {
        fprintf(stderr, "edgeserve quantize: at most %d --exclude\n", QCLI_MAX_EXCLUDE);
        return 2;
      }
      c->exclude[c->opt.n_exclude++] = argv[++i];
    } else if (!strcmp(a, "--preprocess") && more) {
      const char *v = argv[++i];
      if (!strcmp(v, "face")) {
        c->prep = 2;
      } else if (!strncmp(v, "ocr-det", 7) && (v[7] == '\0' || v[7] == ':')) {
        c->prep = 1;
        if (v[7] == ':') {
          char *end;
          long l = strtol(v + 8, &end, 10);
          if (*end || l < 32 || l > 8192) {
            fprintf(stderr, "edgeserve quantize: ocr-det:LIMIT takes a side in [32, 8192]\n");
            return 2;
          }
          c->det_limit = (int)l;
        }
      } else {
        fprintf(stderr, "edgeserve quantize: --preprocess is ocr-det[:LIMIT] or face\n");
        return 2;
      }
    } else if (!strcmp(a, "--max-samples") && more) {
      char *end;
      c->max_samples = strtol(argv[++i], &end, 10);
      if (*end || c->max_samples < 1) {
        fprintf(stderr, "edgeserve quantize: --max-samples takes a positive count\n");
        return 2;
      }
    } else if (a[0] == '-') {
      fprintf(stderr, "edgeserve quantize: unknown or incomplete option '%s'\n", a);
      return 2;
    } else if (!c->model_path) {
      c->model_path = a;
    } else {
      fprintf(stderr, "edgeserve quantize: one model at a time\n");
      return 2;
    }
  }
  if (!c->model_path || !c->out_path || !c->dir) {
    quantize_usage(stderr);
    return 2;
  }
  c->opt.exclude = c->exclude;
  return 0;
}

static void *read_file(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  void *buf = NULL;
  if (fseek(f, 0, SEEK_END) == 0) {
    long n = ftell(f);
    if (n > 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = es_mem_alloc(ES_MEM_CLI, (size_t)n))) {
      if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        es_mem_free(buf);
        buf = NULL;
      } else {
        *size = (size_t)n;
      }
    }
  }
  fclose(f);
  return buf;
}

int cli_cmd_quantize(int argc, char **argv) {
  /* The accuracy search builds and loads hundreds of models the size of
   * the source, one after the other. glibc would map each large buffer
   * fresh from the kernel and unmap it at free, so every build faulted in
   * every page again: 132 of rec's 220 ms per candidate. Keeping freed
   * memory for the next build (this command only: it ends when the file
   * is written) took rec's build from 25 s to 2.2 s of the search. */
  mallopt(M_MMAP_THRESHOLD, 32 << 20); /* glibc's largest: buffers up to 32 MB */
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  qcli c;
  memset(&c, 0, sizeof c);
  es_quant_options_default(&c.opt);
  int rc = parse(&c, argc, argv);
  if (rc)
    return rc < 0 ? 0 : rc;
  size_t size = 0;
  void *bytes = read_file(c.model_path, &size);
  if (!bytes) {
    fprintf(stderr, "edgeserve quantize: cannot read %s\n", c.model_path);
    return 1;
  }
  if (c.judge_faces) {
    c.opt.judge = judge_faces;
    c.opt.judge_user = &c;
  }
  es_quantizer *q;
  rc = es_quantizer_create(bytes, size, &c.opt, &q);
  es_mem_free(bytes);
  if (rc < 0) {
    fprintf(stderr, "edgeserve quantize: %s: %s\n", c.model_path, es_last_error_detail());
    return 1;
  }
  es_model *m = es_quantizer_model(q);
  int n_in = es_model_input_count(m);
  if (c.judge_faces) { /* the side the outputs' boxes are in */
    es_tensor_info ti;
    es_model_input_info(m, 0, &ti);
    const int64_t *d = ti.dims;
    int nchw = ti.rank == 4 && d[1] == 3 && d[2] == d[3], nhwc = ti.rank == 4 && d[3] == 3 &&
                                                                d[1] == d[2];
    c.face_side = (int)(nchw ? d[2] : nhwc ? d[1] : 0);
    if (n_in != 1 || c.face_side < 8 || c.face_side > 4096) {
      fprintf(stderr, "edgeserve quantize: --judge faces needs a face detector (one input, "
                      "1xSxSx3 or 1x3xSxS)\n");
      es_quantizer_destroy(q);
      return 1;
    }
  }
  es_tensor in[16];
  if (n_in > 16) {
    fprintf(stderr, "edgeserve quantize: models of more than 16 inputs are not supported\n");
    es_quantizer_destroy(q);
    return 1;
  }
  if (c.save_dir && mkdir(c.save_dir, 0755) < 0 && errno != EEXIST) {
    fprintf(stderr, "edgeserve quantize: cannot create %s: %s\n", c.save_dir, strerror(errno));
    es_quantizer_destroy(q);
    return 1;
  }
  char **names;
  int n_names;
  if (list_dir(c.dir, &names, &n_names)) {
    es_quantizer_destroy(q);
    return 1;
  }
  int status = 0;
  long used = 0;
  for (int k = 0; k < n_names && status == 0; k++) {
    if (c.max_samples && used >= c.max_samples)
      break;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", c.dir, names[k]);
    struct stat st;
    if (stat(path, &st) < 0)
      continue;
    int r = sample_load(&c, m, path, S_ISDIR(st.st_mode), in, n_in);
    if (r == 3)
      continue;
    if (r) {
      status = 1;
      break;
    }
    for (int i = 0; c.save_dir && i < n_in && status == 0; i++) {
      es_tensor_info ti;
      es_model_input_info(m, i, &ti);
      char fname[256], out[4096];
      cli_npy_file_name(ti.name, fname, sizeof fname);
      if (n_in == 1)
        snprintf(out, sizeof out, "%s/%04ld.npy", c.save_dir, used);
      else
        snprintf(out, sizeof out, "%s/%04ld_%s.npy", c.save_dir, used, fname);
      if (cli_npy_write(out, &in[i]) < 0) {
        fprintf(stderr, "edgeserve quantize: %s: %s\n", out, es_last_error_detail());
        status = 1;
      }
    }
    if (status == 0 && es_quantizer_observe(q, in, n_in) < 0) {
      fprintf(stderr, "edgeserve quantize: %s: %s\n", path, es_last_error_detail());
      status = 1;
    }
    free_tensors(in, n_in);
    used++;
  }
  free_list(names, n_names);
  if (status == 0 && used == 0) {
    fprintf(stderr, "edgeserve quantize: %s holds no calibration sample (.npy files, folders of "
                    "them, or images with --preprocess)\n", c.dir);
    status = 1;
  }
  if (status == 0 && es_quantizer_write(q, c.out_path) < 0) {
    fprintf(stderr, "edgeserve quantize: %s\n", es_last_error_detail());
    status = 1;
  }
  if (status == 0) {
    es_quant_stats s;
    es_quantizer_stats(q, &s);
    printf("quantized %s -> %s\n", c.model_path, c.out_path);
    printf("  calibration: %llu samples, %d tensors, %s\n", s.samples, s.tensors_observed,
           c.opt.method == ES_QUANT_PERCENTILE ? "percentile"
           : c.opt.method == ES_QUANT_MSE    ? "least squared error"
                                             : "min-max");
    printf("  nodes in int8: %d (activations folded: %d, BatchNormalization or bias Add "
           "folded: %d); left in float: %d\n",
           s.nodes_quantized, s.activations_folded, s.bn_folded, s.nodes_excluded);
    if (c.opt.target_db > 0 || c.judge_faces) {
      printf("  accuracy search: %d nodes kept in float (%d of them with int8 weights); outputs "
             "within %.1f dB of FP32", s.auto_excluded, s.weight_only, s.sqnr_db);
      if (c.opt.target_db > 0)
        printf(" (target %.1f)", c.opt.target_db);
      if (c.judge_faces)
        printf("; faces as FP32's (IoU >= %.2f): %lu candidates refused, in %lu comparisons "
               "of a sample's faces", c.judge_iou, c.refused, c.judged);
      printf("\n");
    }
    printf("  opset: %lld -> %lld\n", (long long)s.opset_from, (long long)s.opset_to);
    printf("  weights of those nodes: %zu B float32 -> %zu B int8 (%.2fx)\n", s.weight_bytes_fp32,
           s.weight_bytes_int8,
           s.weight_bytes_fp32 ? (double)s.weight_bytes_int8 / (double)s.weight_bytes_fp32 : 0.0);
  }
  es_quantizer_destroy(q);
  return status;
}
