/* Out-of-memory, the way SQLite tests it: each step below (loading,
 * planning and running each target model; the runtime path; the face and
 * OCR pipelines) is attempted again and again with the counting layer told
 * to fail its N-th allocation (es_mem_fault_arm), N = 1, 2, 3, ..., until an
 * attempt makes no failed allocation. Every attempt that met a failure must
 * come back with a negative ES_E* code and a detail (or, if the code could
 * do without that block, with the normal answer), crash nothing, and give
 * back every byte: each tag's bytes and live blocks equal the baseline taken
 * before (and ASan's leak check at exit finds nothing). The last attempt
 * must give the same answer as a normal run.
 *
 * Which N. A step makes thousands of allocations (see the numbers printed),
 * and under ASan every N would take far too long for CI. So a counting pass
 * first numbers the allocations of a normal run and records where each is
 * made (a hash of the call stack, from the counting layer's hook); then the
 * attempts take every N up to 24, every N whose call stack was not seen at
 * a smaller N (so each distinct allocation site fails at least once), and
 * every 97th N (support/oom_sched.h). ES_OOM_FULL=1 takes every N. Failures are one-shot by
 * default (only the N-th fails, later ones succeed: the error must be carried
 * out while the process goes on); ES_OOM_PERSISTENT=1 fails the N-th and
 * every later one (cleanup must not need memory). ES_OOM_STEP=name runs one
 * step, ES_OOM_N=N one attempt (with the counting pass), for debugging.
 *
 * What is not injected: allocations that do not go through the counting
 * layer (oneDNN's primitives and its scratch, libjpeg's and libspng's
 * decoder state, jansson, glibc's stdio and thread stacks). Those fail only
 * when the system is really out of memory.
 *
 * The pipelines run in a runtime loaded before the baseline (its models and
 * the plans a normal read needs are there already): the step is the
 * pipeline's own code, decoding the image included. The runtime step makes
 * and destroys a whole runtime, with models on a lane, in an arena pool and
 * at a shape served from the buddy pool. */
#include "es_test.h"

#include "common/internal.h"
#include "edgeserve/apps.h"
#include "edgeserve/engine.h"
#include "edgeserve/runtime.h"
#include "support/oom_sched.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef ES_SOURCE_DIR
#define ES_SOURCE_DIR "."
#endif

static char model_dir_[1024], image_dir_[1024], tmp_dir_[256], ocr_image_[2048];
static oom_sched sched_;
static es_runtime *prt_; /* the pipelines' runtime, loaded before their baselines */
static const char *only_step_;

/* Answers are compared as hashes. */
#define fnv oom_fnv
#define FNV0 OOM_FNV0

/* ---- the loop ---------------------------------------------------------------------- */

typedef struct oom_step oom_step;
struct oom_step {
  const char *name;
  int (*attempt)(const oom_step *st, uint64_t *answer);
  const void *arg;
};

typedef struct step_result {
  uint64_t calls;     /* allocations of a normal run */
  unsigned sites;     /* distinct call stacks among them */
  unsigned attempts;  /* with a failure injected */
  unsigned errors;    /* of those, ended with an error */
  unsigned recovered; /* of those, ended with the normal answer */
  unsigned enomem;    /* errors that were ES_ENOMEM */
} step_result;

static void run_step(const oom_step *st) {
  if (only_step_ && strcmp(only_step_, st->name) != 0)
    skip();
  if (!prt_) {
    printf("# models or photos not fetched (%s, %s): skipped\n", model_dir_, image_dir_);
    skip();
  }
  uint64_t ref = 0, ans = 0;
  /* A first normal run makes what a process makes once (oneDNN's engine,
   * thread-local streams, the unwinder backtrace loads) and gives the
   * reference answer. */
  ES_CHECK_RC(st->attempt(st, &ref));
  oom_snapshot base = oom_snap();

  oom_count_begin(&sched_);
  int rc = st->attempt(st, &ans);
  assert_int_equal(oom_count_end(&sched_), 0);
  if (rc < 0)
    fail_msg("%s: counting pass: %s: %s", st->name, es_err_name(rc), es_last_error_detail());
  assert_true(ans == ref);
  assert_int_equal(oom_baseline_diff(&base, st->name, 0), 0);
  step_result r = {.calls = sched_.calls, .sites = sched_.sites};

  int bad = 0;
  for (uint64_t n = sched_.trace_n ? sched_.trace_n : 1;; n++) {
    if (!sched_.trace_n && !oom_sched_takes(&sched_, n))
      continue;
    es__fail(ES_EINVAL, "sentinel: no detail was set");
    ans = 0;
    oom_arm(&sched_, n);
    rc = st->attempt(st, &ans);
    es_mem_fault_disarm();
    uint64_t injected = oom_injected();
    const char *detail = es_last_error_detail();
    if (oom_baseline_diff(&base, st->name, n))
      bad = 1;
    if (injected == 0) { /* the allocations ran out before N: a normal run */
      if (rc < 0 || ans != ref) {
        printf("# %s, N=%llu (nothing failed): %s: %s, answer %s\n", st->name,
               (unsigned long long)n, es_err_name(rc), detail, ans == ref ? "same" : "differs");
        bad = 1;
      }
      if (n <= r.calls)
        printf("# %s: only %llu allocations this time (the counting pass made %llu)\n",
               st->name, (unsigned long long)n - 1, (unsigned long long)r.calls);
      break;
    }
    r.attempts++;
    if (rc == 0) {
      r.recovered++;
      if (getenv("ES_OOM_VERBOSE"))
        printf("# %s, N=%llu: done without it\n", st->name, (unsigned long long)n);
      if (ans != ref) {
        printf("# %s, N=%llu: success with another answer\n", st->name, (unsigned long long)n);
        bad = 1;
      }
    } else {
      r.errors++;
      r.enomem += rc == ES_ENOMEM;
      if (rc > 0 || !strcmp(es_err_name(rc), "ES_UNKNOWN") || !detail[0] ||
          !strcmp(detail, "sentinel: no detail was set")) {
        printf("# %s, N=%llu: %d %s, detail \"%s\"\n", st->name, (unsigned long long)n, rc,
               es_err_name(rc), detail);
        bad = 1;
      } else if (rc != ES_ENOMEM) {
        printf("# %s, N=%llu: %s (%s)\n", st->name, (unsigned long long)n, es_err_name(rc),
               detail);
      }
    }
    if (sched_.trace_n)
      break;
  }
  printf("# %-16s %7llu allocations, %5u call stacks, %5u attempts: %u errors (%u ES_ENOMEM), "
         "%u with the normal answer\n",
         st->name, (unsigned long long)r.calls, r.sites, r.attempts, r.errors, r.enomem,
         r.recovered);
  assert_int_equal(bad, 0);
}

static void test_step(void **state) { run_step(*state); }

/* ---- steps: one model, loaded, planned, run ------------------------------------- */

typedef struct model_case {
  const char *file;
  es_tensor_info shape;
} model_case;

static const model_case models_[] = {
    {"blazeface_front_128.onnx", {"input:0", ES_DTYPE_FLOAT, 4, {1, 128, 128, 3}}},
    {"blazeface_back_256.onnx", {"input:0", ES_DTYPE_FLOAT, 4, {1, 256, 256, 3}}},
    {"ppocr_det.onnx", {"x", ES_DTYPE_FLOAT, 4, {1, 3, 320, 320}}},
    {"ppocr_cls.onnx", {"x", ES_DTYPE_FLOAT, 4, {1, 3, 48, 192}}},
    {"ppocr_rec.onnx", {"x", ES_DTYPE_FLOAT, 4, {1, 3, 48, 320}}},
};

static float input_[1 * 3 * 320 * 320]; /* the largest input above */

static size_t elements(const es_tensor_info *ti) {
  size_t n = 1;
  for (int i = 0; i < ti->rank; i++)
    n *= (size_t)ti->dims[i];
  return n;
}

static const char *in_dir(const char *dir, const char *file) {
  static char p[2048];
  snprintf(p, sizeof p, "%s/%s", dir, file);
  return p;
}

/* Load, plan, make an arena, run once, fold the outputs into *answer. */
static int run_model(const char *path, const es_tensor_info *shape, uint64_t *answer) {
  es_model *m = NULL;
  es_plan *p = NULL;
  es_arena *a = NULL;
  int rc = es_model_load(path, NULL, &m);
  if (rc == 0)
    rc = es_model_plan(m, shape, 1, &p);
  if (rc == 0)
    rc = es_arena_create(es_plan_arena_bytes(p), 64, &a);
  if (rc == 0) {
    es_tensor in = {.dtype = shape->dtype, .rank = shape->rank, .data = input_,
                    .nbytes = elements(shape) * sizeof(float)};
    memcpy(in.dims, shape->dims, sizeof in.dims);
    es_tensor out[8];
    int n_out = es_plan_output_count(p);
    rc = n_out <= 8 ? es_plan_run(p, &in, 1, a, out, n_out) : ES_EINVAL;
    uint64_t h = FNV0;
    for (int i = 0; rc == 0 && i < n_out; i++) {
      h = fnv(h, out[i].dims, sizeof(int64_t) * (size_t)out[i].rank);
      h = fnv(h, out[i].data, out[i].nbytes);
    }
    *answer = h;
  }
  es_arena_destroy(a);
  es_plan_release(p);
  es_model_release(m);
  return rc;
}

static int attempt_model(const oom_step *st, uint64_t *answer) {
  const model_case *c = st->arg;
  return run_model(in_dir(model_dir_, c->file), &c->shape, answer);
}

/* ---- step: a compiled model file, written and loaded ----------------------------- */

static es_model *esm_src_; /* BlazeFace back, loaded and planned before the baselines */

/* es_model_compile of that model (with the weights its plan reordered),
 * then the .esm loaded (mapped), planned and run. */
static int attempt_esm(const oom_step *st, uint64_t *answer) {
  (void)st;
  char path[300];
  snprintf(path, sizeof path, "%s/back.esm", tmp_dir_);
  int rc = es_model_compile(esm_src_, in_dir(model_dir_, models_[1].file), path);
  if (rc == 0)
    rc = run_model(path, &models_[1].shape, answer);
  unlink(path);
  return rc;
}

/* ---- step: the runtime, created, loaded, serving, destroyed ---------------------- */

static es_runtime_config rt_config(void) {
  es_runtime_config rc;
  es_runtime_config_default(&rc);
  rc.workers = 1; /* one sequence of allocations, so runs replay exactly */
  rc.pin = 0;
  rc.watch_ms = 0;
  rc.buddy_bytes = 8u << 20;
  return rc;
}

static int load_model(es_runtime *rt, const char *name, const char *file,
                      const es_tensor_info *shape, int lane, int *id) {
  es_model_config mc;
  es_model_config_default(&mc);
  mc.name = name;
  mc.path = in_dir(model_dir_, file);
  mc.shapes = shape;
  mc.n_shapes = shape ? 1 : 0;
  mc.lane = lane;
  return es_runtime_model_load(rt, &mc, id);
}

/* Submit one request, wait, fold its outputs into *h. */
static int serve_one(es_runtime *rt, int id, const es_tensor_info *shape, uint64_t *h) {
  es_tensor in = {.dtype = shape->dtype, .rank = shape->rank, .data = input_,
                  .nbytes = elements(shape) * sizeof(float)};
  memcpy(in.dims, shape->dims, sizeof in.dims);
  es_submit s = {.model = id, .inputs = &in, .n_inputs = 1};
  es_request *r = NULL;
  es_refusal why;
  int rc = es_runtime_submit(rt, &s, &r, &why);
  if (rc == 0)
    rc = es_request_wait(r, -1);
  for (int i = 0; rc == 0 && i < es_request_output_count(r); i++) {
    es_tensor out;
    rc = es_request_output(r, i, &out);
    if (rc == 0) {
      *h = fnv(*h, out.dims, sizeof(int64_t) * (size_t)out.rank);
      *h = fnv(*h, out.data, out.nbytes);
    }
  }
  es_request_free(r);
  return rc;
}

static int attempt_runtime(const oom_step *st, uint64_t *answer) {
  (void)st;
  es_runtime_config cfg = rt_config();
  es_runtime *rt = NULL;
  int rc = es_runtime_create(&cfg, &rt);
  if (rc < 0)
    return rc;
  const model_case *front = &models_[0], *cls = &models_[3];
  es_tensor_info cls_narrow = cls->shape;
  cls_narrow.dims[3] = 96;
  int front_id = -1, front2_id = -1, cls_id = -1;
  uint64_t h = FNV0;
  /* front: an arena pool at its fixed shape, and again under another name
   * (one shared model); cls: lane 0's scratchpad at 48x192, the buddy pool
   * at 48x96. */
  rc = load_model(rt, "front", front->file, NULL, -1, &front_id);
  if (rc == 0)
    rc = load_model(rt, "front2", front->file, NULL, -1, &front2_id);
  if (rc == 0)
    rc = load_model(rt, "cls", cls->file, &cls->shape, 0, &cls_id);
  if (rc == 0)
    rc = serve_one(rt, front_id, &front->shape, &h);
  if (rc == 0)
    rc = serve_one(rt, front2_id, &front->shape, &h);
  if (rc == 0)
    rc = serve_one(rt, cls_id, &cls->shape, &h);
  if (rc == 0)
    rc = serve_one(rt, cls_id, &cls_narrow, &h);
  if (rc == 0)
    rc = es_runtime_model_unload(rt, front_id, -1);
  *answer = h;
  int drc = es_runtime_destroy(rt);
  if (drc < 0)
    fail_msg("es_runtime_destroy: %s: %s", es_err_name(drc), es_last_error_detail());
  return rc;
}

/* ---- steps: the pipelines, in a runtime loaded beforehand ------------------------ */

static int face_id_ = -1, det_id_ = -1, cls_id_ = -1, rec_id_ = -1;

static int attempt_face(const oom_step *st, uint64_t *answer) {
  (void)st;
  es_image img = {0};
  es_face_detector *fd = NULL;
  es_face faces[16];
  int n = 0;
  int rc = es_image_load(in_dir(image_dir_, "astronaut.png"), &img);
  if (rc == 0)
    rc = es_face_detector_create(prt_, face_id_, &fd);
  if (rc == 0)
    rc = es_face_detect(fd, &img, 0.5f, 0, 0, faces, 16, &n, NULL);
  if (rc == 0) {
    uint64_t h = fnv(FNV0, &n, sizeof n);
    *answer = fnv(h, faces, sizeof faces[0] * (size_t)n);
    static int told;
    if (!told++)
      printf("# face: %d faces\n", n);
  }
  es_face_detector_destroy(fd);
  es_image_free(&img);
  return rc;
}

static es_ocr_line lines_[16];

static int attempt_ocr(const oom_step *st, uint64_t *answer) {
  (void)st;
  es_image img = {0};
  es_ocr *o = NULL;
  es_ocr_config oc;
  es_ocr_config_default(&oc);
  oc.det_model = det_id_;
  oc.cls_model = cls_id_;
  oc.rec_model = rec_id_;
  char keys[2048];
  snprintf(keys, sizeof keys, "%s", in_dir(model_dir_, "ppocr_keys_v1.txt"));
  oc.keys_path = keys;
  int n = 0;
  int rc = es_image_load(ocr_image_, &img);
  if (rc == 0)
    rc = es_ocr_create(prt_, &oc, &o);
  if (rc == 0)
    rc = es_ocr_read(o, &img, 0, 0, lines_, 16, &n, NULL);
  if (rc == 0) {
    uint64_t h = fnv(FNV0, &n, sizeof n);
    for (int i = 0; i < n; i++) {
      h = fnv(h, lines_[i].text, strlen(lines_[i].text));
      h = fnv(h, lines_[i].box, sizeof lines_[i].box);
      h = fnv(h, &lines_[i].confidence, sizeof(float));
    }
    *answer = h;
    static int told;
    if (!told++)
      printf("# ocr: %d lines, first \"%s\"\n", n, n ? lines_[0].text : "");
  }
  es_ocr_destroy(o);
  es_image_free(&img);
  return rc;
}

/* ---- setup ----------------------------------------------------------------------- */

static int have_models(void) {
  for (size_t i = 0; i < sizeof models_ / sizeof models_[0]; i++)
    if (access(in_dir(model_dir_, models_[i].file), R_OK) != 0)
      return 0;
  return access(in_dir(model_dir_, "ppocr_keys_v1.txt"), R_OK) == 0 &&
         access(in_dir(image_dir_, "astronaut.png"), R_OK) == 0;
}

/* The OCR step reads two printed lines (so that the classifier and the
 * recogniser run too: the photos hold no text), or the astronaut photo
 * without ImageMagick (the detector runs and finds nothing). */
static void make_ocr_image(void) {
  snprintf(tmp_dir_, sizeof tmp_dir_, "/tmp/es_oom_XXXXXX");
  if (!mkdtemp(tmp_dir_))
    tmp_dir_[0] = 0;
  if (!tmp_dir_[0] || oom_text_image(tmp_dir_, ocr_image_, sizeof ocr_image_) < 0) {
    printf("# ImageMagick's convert or a font missing: the OCR step reads the astronaut photo\n");
    snprintf(ocr_image_, sizeof ocr_image_, "%s", in_dir(image_dir_, "astronaut.png"));
  }
}

static int group_setup(void **state) {
  (void)state;
  const char *d = getenv("ES_MODEL_DIR");
  snprintf(model_dir_, sizeof model_dir_, "%s", d ? d : ES_SOURCE_DIR "/.cache/models");
  d = getenv("ES_IMAGE_DIR");
  snprintf(image_dir_, sizeof image_dir_, "%s", d ? d : ES_SOURCE_DIR "/.cache/images");
  only_step_ = getenv("ES_OOM_STEP");
  if (oom_sched_init(&sched_) < 0)
    return -1;
  printf("# %s failures, %s\n", sched_.persistent ? "persistent" : "one-shot",
         sched_.full ? "every N (ES_OOM_FULL)" : "N sampled (every N: ES_OOM_FULL=1)");
  uint64_t s = 0x0dd5eedull;
  for (size_t i = 0; i < sizeof input_ / sizeof input_[0]; i++)
    input_[i] = (float)(es_test_rand(&s) >> 40) / (float)(1u << 24);
  if (!have_models())
    return 0;
  make_ocr_image();
  es_plan *p = NULL;
  if (es_model_load(in_dir(model_dir_, models_[1].file), NULL, &esm_src_) < 0 ||
      es_model_plan(esm_src_, &models_[1].shape, 1, &p) < 0) {
    fprintf(stderr, "load: %s\n", es_last_error_detail());
    return -1;
  }
  es_plan_release(p); /* its reordered weights stay with the model */
  es_runtime_config cfg = rt_config();
  if (es_runtime_create(&cfg, &prt_) < 0)
    return -1;
  if (load_model(prt_, "back", "blazeface_back_256.onnx", NULL, -1, &face_id_) < 0 ||
      load_model(prt_, "det", "ppocr_det.onnx", NULL, -1, &det_id_) < 0 ||
      load_model(prt_, "cls", "ppocr_cls.onnx", NULL, -1, &cls_id_) < 0 ||
      load_model(prt_, "rec", "ppocr_rec.onnx", NULL, -1, &rec_id_) < 0) {
    fprintf(stderr, "load: %s\n", es_last_error_detail());
    return -1;
  }
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  int rc = es_runtime_destroy(prt_);
  es_model_release(esm_src_);
  if (tmp_dir_[0]) {
    char f[1200];
    snprintf(f, sizeof f, "%s/lines.png", tmp_dir_);
    unlink(f);
    rmdir(tmp_dir_);
  }
  oom_sched_fini(&sched_);
  return rc == 0 ? 0 : -1;
}

static const oom_step steps_[] = {
    {"blazeface_front", attempt_model, &models_[0]},
    {"blazeface_back", attempt_model, &models_[1]},
    {"ppocr_det", attempt_model, &models_[2]},
    {"ppocr_cls", attempt_model, &models_[3]},
    {"ppocr_rec", attempt_model, &models_[4]},
    {"esm", attempt_esm, NULL},
    {"runtime", attempt_runtime, NULL},
    {"face", attempt_face, NULL},
    {"ocr", attempt_ocr, NULL},
};

int main(void) {
  const struct CMUnitTest tests[] = {
      {"oom_blazeface_front", test_step, NULL, NULL, (void *)&steps_[0]},
      {"oom_blazeface_back", test_step, NULL, NULL, (void *)&steps_[1]},
      {"oom_ppocr_det", test_step, NULL, NULL, (void *)&steps_[2]},
      {"oom_ppocr_cls", test_step, NULL, NULL, (void *)&steps_[3]},
      {"oom_ppocr_rec", test_step, NULL, NULL, (void *)&steps_[4]},
      {"oom_esm", test_step, NULL, NULL, (void *)&steps_[5]},
      {"oom_runtime", test_step, NULL, NULL, (void *)&steps_[6]},
      {"oom_face", test_step, NULL, NULL, (void *)&steps_[7]},
      {"oom_ocr", test_step, NULL, NULL, (void *)&steps_[8]},
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
