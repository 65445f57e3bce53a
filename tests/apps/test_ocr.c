/* OCR end to end: images rendered here with ImageMagick (known text, sizes
 * 20 to 48 pt, turned 0, 5, -8 and 180 degrees, Chinese lines when a CJK
 * font is installed) go through es_ocr_read, and the character accuracy
 * 1 - edit_distance(expected, read) / len(expected) must be at least 0.95
 * per image. Rendering here instead of committing images keeps the
 * expected text next to the pixels it came from and needs no binary files.
 *
 * Accuracy is measured on the lines concatenated without whitespace, in
 * Unicode code points: the PP-OCR Chinese recogniser (the model fetched)
 * writes inter-word spaces only some of the time, and a line split into
 * two boxes must not count as an error. Full-width forms count as their
 * ASCII characters. An upside-down page comes back in its own reading
 * order: most of its lines turned by the direction classifier make the
 * reader read the page from the bottom of the image up.
 *
 * Also: a blank image gives no lines, a corrupt file is ES_EINVAL, a
 * deadline already passed is refused through the runtime (ES_EAGAIN,
 * DEADLINE), boxes are inside the image and clockwise from the top-left,
 * two threads reading at once get the same answer, the reader gives back
 * every byte it took (ES_MEM_APPS), and a runtime that admits one request
 * per model at a time still reads a page (the reader waits for its own
 * batches instead of failing on their refusals).
 *
 * Without the fetched models, ImageMagick's convert or a font, the tests
 * say so and skip. ES_OCR_KEEP=1 keeps the rendered images (the folder is
 * printed). CI runs this under ASan too, so the images stay few and small. */
#include "es_test.h"

#include "edgeserve/apps.h"
#include "edgeserve/runtime.h"

#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef ES_SOURCE_DIR
#define ES_SOURCE_DIR "."
#endif

extern char **environ;

#define MAX_LINES 64

static char model_dir_[1024];
static char tmp_dir_[256];
static char font_[1024];     /* DejaVu Sans (or what fc-match gives) */
static char cjk_font_[1024]; /* "" when no font covers Chinese */
static int have_convert_;
static es_runtime *rt_;
static es_ocr *ocr_;

static const char *model_path(const char *file) {
  static __thread char p[2048];
  snprintf(p, sizeof p, "%s/%s", model_dir_, file);
  return p;
}

static int have_models(void) {
  return access(model_path("ppocr_det.onnx"), R_OK) == 0 &&
         access(model_path("ppocr_cls.onnx"), R_OK) == 0 &&
         access(model_path("ppocr_rec.onnx"), R_OK) == 0 &&
         access(model_path("ppocr_keys_v1.txt"), R_OK) == 0;
}

#define NEED_READER()                                                          \
  do {                                                                         \
    if (!ocr_) {                                                               \
      printf("# models not fetched (%s): skipped\n", model_dir_);              \
      skip();                                                                  \
    }                                                                          \
  } while (0)

#define NEED_CONVERT()                                                         \
  do {                                                                         \
    if (!have_convert_ || !font_[0]) {                                         \
      printf("# ImageMagick convert or a font missing: skipped\n");            \
      skip();                                                                  \
    }                                                                          \
  } while (0)

/* Run a program (no shell: the texts hold $, #, quotes) and wait. */
static int run(char *const argv[]) {
  pid_t pid;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0)
    return -1;
  int st;
  if (waitpid(pid, &st, 0) < 0)
    return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* First line of a command's output, trailing newline and ':' dropped. */
static void first_line(const char *cmd, char *out, size_t size) {
  out[0] = '\0';
  FILE *p = popen(cmd, "r");
  if (!p)
    return;
  if (fgets(out, (int)size, p)) {
    size_t n = strlen(out);
    while (n && (out[n - 1] == '\n' || out[n - 1] == ':' || out[n - 1] == ' '))
      out[--n] = '\0';
  }
  pclose(p);
  if (out[0] && access(out, R_OK) != 0)
    out[0] = '\0';
}

/* ---- rendering ---------------------------------------------------------- */

typedef struct ocr_case {
  const char *name;
  int points;
  double angle;          /* degrees, clockwise (ImageMagick's -rotate) */
  int cjk;               /* render with the CJK font */
  const char *lines[4];  /* NULL-terminated */
} ocr_case;

/* Lines at pointsize pt, 1.9 pt apart, on white; then turned. (-annotate
 * expands %-escapes and backslashes: the texts avoid "%x" and "\".) */
static int render(const ocr_case *c, const char *path) {
  const char *font = c->cjk ? cjk_font_ : font_;
  int n = 0, longest = 0;
  while (n < 4 && c->lines[n]) {
    int len = (int)strlen(c->lines[n]);
    longest = len > longest ? len : longest;
    n++;
  }
  int w = (int)(c->points * (c->cjk ? 0.5 : 0.62) * longest) + 3 * c->points;
  int h = (int)(c->points * 1.9 * n + c->points * 1.2);
  char size[32], pts[16], pos[4][32], ang[32];
  snprintf(size, sizeof size, "%dx%d", w, h);
  snprintf(pts, sizeof pts, "%d", c->points);
  snprintf(ang, sizeof ang, "%.1f", c->angle);
  char *argv[64];
  int k = 0;
  argv[k++] = "convert";
  argv[k++] = "-size";
  argv[k++] = size;
  argv[k++] = "xc:white";
  argv[k++] = "-font";
  argv[k++] = (char *)font;
  argv[k++] = "-pointsize";
  argv[k++] = pts;
  argv[k++] = "-fill";
  argv[k++] = "black";
  for (int i = 0; i < n; i++) {
    snprintf(pos[i], sizeof pos[i], "+%d+%d", c->points, (int)(c->points * (1.5 + 1.9 * i)));
    argv[k++] = "-annotate";
    argv[k++] = pos[i];
    argv[k++] = (char *)c->lines[i];
  }
  if (c->angle != 0) {
    argv[k++] = "-background";
    argv[k++] = "white";
    argv[k++] = "-rotate";
    argv[k++] = ang;
  }
  argv[k++] = (char *)path;
  argv[k] = NULL;
  return run(argv);
}

/* ---- accuracy ------------------------------------------------------------ */

/* UTF-8 to code points, whitespace dropped, full-width ASCII forms
 * (U+FF01..U+FF5E: the Chinese model writes '！' for '!' at times) folded
 * to ASCII on both sides. */
static int codepoints(const char *s, uint32_t *out, int max) {
  int n = 0;
  const unsigned char *p = (const unsigned char *)s;
  while (*p && n < max) {
    uint32_t c = *p;
    int extra = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
    c &= extra == 3 ? 0x07 : extra == 2 ? 0x0F : extra == 1 ? 0x1F : 0x7F;
    p++;
    for (int i = 0; i < extra && (*p & 0xC0) == 0x80; i++, p++)
      c = (c << 6) | (*p & 0x3F);
    if (c >= 0xFF01 && c <= 0xFF5E)
      c -= 0xFF01 - 0x21;
    if (c != ' ' && c != '\t' && c != '\n')
      out[n++] = c;
  }
  return n;
}

static int edit_distance(const uint32_t *a, int na, const uint32_t *b, int nb) {
  int *row = calloc((size_t)nb + 1, sizeof *row);
  assert_non_null(row);
  for (int j = 0; j <= nb; j++)
    row[j] = j;
  for (int i = 1; i <= na; i++) {
    int diag = row[0];
    row[0] = i;
    for (int j = 1; j <= nb; j++) {
      int up = row[j];
      int best = diag + (a[i - 1] != b[j - 1]);
      if (up + 1 < best)
        best = up + 1;
      if (row[j - 1] + 1 < best)
        best = row[j - 1] + 1;
      row[j] = best;
      diag = up;
    }
  }
  int d = row[nb];
  free(row);
  return d;
}

static double accuracy(const char *want, const char *got) {
  static uint32_t a[4096], b[4096];
  int na = codepoints(want, a, 4096), nb = codepoints(got, b, 4096);
  return 1.0 - (double)edit_distance(a, na, b, nb) / (na ? na : 1);
}

/* ---- reader -------------------------------------------------------------- */

static int load(const char *file, int *id) {
  es_model_config mc;
  es_model_config_default(&mc);
  mc.name = file;
  mc.path = model_path(file);
  return es_runtime_model_load(rt_, &mc, id);
}

static int setup(void **state) {
  (void)state;
  const char *d = getenv("ES_MODEL_DIR");
  snprintf(model_dir_, sizeof model_dir_, "%s", d ? d : ES_SOURCE_DIR "/.cache/models");
  char conv[1024];
  first_line("command -v convert 2>/dev/null", conv, sizeof conv);
  have_convert_ = conv[0] != '\0';
  first_line("fc-match -f '%{file}' DejaVuSans 2>/dev/null", font_, sizeof font_);
  first_line("fc-list :lang=zh file 2>/dev/null | sort", cjk_font_, sizeof cjk_font_);
  snprintf(tmp_dir_, sizeof tmp_dir_, "/tmp/es_ocr_XXXXXX");
  if (!mkdtemp(tmp_dir_))
    return -1;
  if (!have_models())
    return 0;
  es_runtime_config rc;
  es_runtime_config_default(&rc);
  rc.workers = 2;
  rc.pin = 0;
  rc.watch_ms = 0;
  if (es_runtime_create(&rc, &rt_) < 0)
    return -1;
  es_ocr_config oc;
  es_ocr_config_default(&oc);
  static char keys[2048]; /* model_path's buffer is reused by load() */
  snprintf(keys, sizeof keys, "%s", model_path("ppocr_keys_v1.txt"));
  oc.keys_path = keys;
  if (load("ppocr_det.onnx", &oc.det_model) < 0 || load("ppocr_cls.onnx", &oc.cls_model) < 0 ||
      load("ppocr_rec.onnx", &oc.rec_model) < 0 || es_ocr_create(rt_, &oc, &ocr_) < 0) {
    printf("# setup: %s\n", es_last_error_detail());
    return -1;
  }
  return 0;
}

static int teardown(void **state) {
  (void)state;
  es_ocr_destroy(ocr_);
  if (rt_ && es_runtime_destroy(rt_) < 0)
    return -1;
  const char *keep = getenv("ES_OCR_KEEP");
  if (keep && *keep && strcmp(keep, "0")) {
    printf("# images kept in %s\n", tmp_dir_);
  } else {
    char *argv[] = {"rm", "-rf", tmp_dir_, NULL};
    run(argv);
  }
  return 0;
}

static void read_file(const char *path, es_ocr_line *lines, int *n) {
  es_image img;
  ES_CHECK_RC(es_image_load(path, &img));
  es_refusal why;
  ES_CHECK_RC(es_ocr_read(ocr_, &img, 0, 0, lines, MAX_LINES, n, &why));
  /* Every box inside the image, clockwise (y down) from its top-left. */
  for (int i = 0; i < *n; i++) {
    const float(*b)[2] = (const float(*)[2])lines[i].box;
    double area2 = 0;
    for (int k = 0; k < 4; k++) {
      assert_true(b[k][0] >= 0 && b[k][0] <= img.width - 1);
      assert_true(b[k][1] >= 0 && b[k][1] <= img.height - 1);
      area2 += b[k][0] * b[(k + 1) % 4][1] - b[(k + 1) % 4][0] * b[k][1];
      assert_true(b[0][0] + b[0][1] <= b[k][0] + b[k][1] + 1e-3);
    }
    assert_true(area2 > 0);
    assert_true(lines[i].confidence >= 0.5f && lines[i].confidence <= 1.0f);
  }
  es_image_free(&img);
}

static void check_case(const ocr_case *c) {
  char path[512], want[1024] = "", got[8192] = "", shown[8192] = "";
  snprintf(path, sizeof path, "%s/%s.png", tmp_dir_, c->name);
  if (render(c, path) != 0)
    fail_msg("convert could not render %s", path);
  int n = 0;
  while (n < 4 && c->lines[n])
    n++;
  for (int i = 0; i < n; i++)
    strcat(want, c->lines[i]);
  es_ocr_line *lines = calloc(MAX_LINES, sizeof *lines);
  assert_non_null(lines);
  int nl = 0;
  read_file(path, lines, &nl);
  for (int i = 0; i < nl; i++) {
    strncat(got, lines[i].text, sizeof got - strlen(got) - 1);
    if (i)
      strncat(shown, " | ", sizeof shown - strlen(shown) - 1);
    strncat(shown, lines[i].text, sizeof shown - strlen(shown) - 1);
  }
  double acc = accuracy(want, got);
  printf("# %-12s %2d pt %6.1f deg: accuracy %.4f, %d lines: %s\n", c->name, c->points,
         c->angle, acc, nl, shown);
  free(lines);
  if (acc < 0.95)
    fail_msg("%s: accuracy %.4f < 0.95 (want '%s')", c->name, acc, want);
}

/* ---- tests --------------------------------------------------------------- */

static const ocr_case cases_[] = {
    {"straight20", 20, 0, 0,
     {"The quick brown fox jumps over", "the lazy dog 1234567890.",
      "Invoice #A-42: total $19.99 (paid)", NULL}},
    {"tilt5", 32, 5, 0,
     {"Pack my box with five dozen", "liquor jugs! Call 555-0199,", "ext. 12 before 5:30 PM",
      NULL}},
    {"tilt-8", 48, -8, 0, {"Sphinx of black quartz,", "judge my vow: 98.6%", NULL}},
    {"upside-down", 32, 180, 0,
     {"How vexingly quick daft", "zebras jump; 2024-06-30", "Order No. 7781/B", NULL}},
};

static void test_accuracy(void **state) {
  (void)state;
  NEED_READER();
  NEED_CONVERT();
  for (size_t i = 0; i < sizeof cases_ / sizeof cases_[0]; i++)
    check_case(&cases_[i]);
}

static void test_chinese(void **state) {
  (void)state;
  NEED_READER();
  NEED_CONVERT();
  if (!cjk_font_[0]) {
    printf("# no font covers Chinese (fc-list :lang=zh): skipped\n");
    skip();
  }
  const ocr_case c = {"chinese", 32, 0, 1, {"今天天气很好，我们去公园。", "这本书的价格是一百元", NULL}};
  check_case(&c);
}

/* Boxes land on the lines that were drawn: in order, each box's vertical
 * middle between the top of its capitals and its baseline. */
static void test_boxes_where_drawn(void **state) {
  (void)state;
  NEED_READER();
  NEED_CONVERT();
  const ocr_case c = {"boxes", 32, 0, 0, {"First line 111", "Second line 222", NULL}};
  char path[512];
  snprintf(path, sizeof path, "%s/%s.png", tmp_dir_, c.name);
  assert_int_equal(render(&c, path), 0);
  es_ocr_line lines[MAX_LINES];
  int n = 0;
  read_file(path, lines, &n);
  assert_int_equal(n, 2);
  for (int i = 0; i < 2; i++) {
    double baseline = 32 * (1.5 + 1.9 * i);
    double mid = (lines[i].box[0][1] + lines[i].box[3][1]) / 2;
    printf("# line %d: baseline %.0f, box y %.0f..%.0f, x %.0f..%.0f\n", i, baseline,
           (double)lines[i].box[0][1], (double)lines[i].box[3][1], (double)lines[i].box[0][0],
           (double)lines[i].box[1][0]);
    assert_true(mid > baseline - 32 * 0.75 && mid < baseline);
    assert_true(lines[i].box[0][0] >= 32 - 12 && lines[i].box[0][0] <= 32 + 4);
  }
}

static void test_blank_and_corrupt(void **state) {
  (void)state;
  NEED_READER();
  /* Blank: a white image built here, no ImageMagick needed. */
  es_image img = {.width = 320, .height = 200};
  img.rgb = malloc((size_t)img.width * img.height * 3);
  assert_non_null(img.rgb);
  memset(img.rgb, 255, (size_t)img.width * img.height * 3);
  es_ocr_line lines[4];
  int n = -1;
  es_refusal why;
  ES_CHECK_RC(es_ocr_read(ocr_, &img, 0, 0, lines, 4, &n, &why));
  assert_int_equal(n, 0);
  /* Flat grey noise-free image: still nothing. */
  memset(img.rgb, 128, (size_t)img.width * img.height * 3);
  ES_CHECK_RC(es_ocr_read(ocr_, &img, 0, 0, lines, 4, &n, &why));
  assert_int_equal(n, 0);
  free(img.rgb);

  /* Corrupt files never reach the reader. */
  static const unsigned char png_head[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n',
                                           0,    0,   0,   13,  'I',  'H',  'D',  'R'};
  es_image bad;
  ES_EXPECT_RC(es_image_decode(png_head, sizeof png_head, &bad), ES_EINVAL);
  static const unsigned char jpeg_head[] = {0xFF, 0xD8, 0xFF, 0xE0, 0, 16, 'J', 'F', 'I', 'F'};
  ES_EXPECT_RC(es_image_decode(jpeg_head, sizeof jpeg_head, &bad), ES_EINVAL);
  ES_EXPECT_RC(es_image_decode("hello, world", 12, &bad), ES_EINVAL);
  char path[512];
  snprintf(path, sizeof path, "%s/corrupt.png", tmp_dir_);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  fwrite(png_head, 1, sizeof png_head, f);
  fwrite("garbage garbage garbage", 1, 23, f);
  fclose(f);
  ES_EXPECT_RC(es_image_load(path, &bad), ES_EINVAL);

  /* And the reader refuses what is not an image. */
  es_image empty = {0};
  ES_EXPECT_RC(es_ocr_read(ocr_, &empty, 0, 0, lines, 4, &n, &why), ES_EINVAL);
  ES_EXPECT_RC(es_ocr_read(ocr_, NULL, 0, 0, lines, 4, &n, &why), ES_EINVAL);
  ES_EXPECT_RC(es_ocr_read(NULL, &empty, 0, 0, lines, 4, &n, &why), ES_EINVAL);
}

static void test_config_errors(void **state) {
  (void)state;
  NEED_READER();
  es_ocr_config oc;
  es_ocr_config_default(&oc);
  es_ocr *o = NULL;
  /* Model ids that are not loaded, a missing keys file, a keys file that
   * is not the model's dictionary: clear errors, nothing created. */
  oc.det_model = 900;
  oc.rec_model = 901;
  oc.keys_path = model_path("ppocr_keys_v1.txt");
  ES_EXPECT_RC(es_ocr_create(rt_, &oc, &o), ES_ENOENT);
  assert_null(o);
  oc.det_model = es_runtime_model_find(rt_, "ppocr_det.onnx");
  oc.rec_model = es_runtime_model_find(rt_, "ppocr_rec.onnx");
  assert_true(oc.det_model >= 0 && oc.rec_model >= 0);
  oc.keys_path = NULL;
  ES_EXPECT_RC(es_ocr_create(rt_, &oc, &o), ES_EINVAL);
  char path[512];
  snprintf(path, sizeof path, "%s/nope.txt", tmp_dir_);
  oc.keys_path = path;
  ES_EXPECT_RC(es_ocr_create(rt_, &oc, &o), ES_ENOENT);
  snprintf(path, sizeof path, "%s/short_keys.txt", tmp_dir_);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs("a\nb\nc\n", f);
  fclose(f);
  ES_EXPECT_RC(es_ocr_create(rt_, &oc, &o), ES_EINVAL);
  printf("# wrong keys: %s\n", es_last_error_detail());
  assert_null(o);
  oc.keys_path = model_path("ppocr_keys_v1.txt");
  oc.det_limit_side = 8;
  ES_EXPECT_RC(es_ocr_create(rt_, &oc, &o), ES_EINVAL);
  oc.det_limit_side = 960;
  /* Without cls is fine. */
  ES_CHECK_RC(es_ocr_create(rt_, &oc, &o));
  es_ocr_destroy(o);
  es_ocr_destroy(NULL);
}

/* A deadline already passed is the runtime's refusal, passed through. */
static void test_deadline_refused(void **state) {
  (void)state;
  NEED_READER();
  es_image img = {.width = 64, .height = 64};
  img.rgb = calloc((size_t)64 * 64 * 3, 1);
  assert_non_null(img.rgb);
  es_ocr_line lines[4];
  int n = -1;
  es_refusal why;
  memset(&why, 0, sizeof why);
  ES_EXPECT_RC(es_ocr_read(ocr_, &img, 0, 1, lines, 4, &n, &why), ES_EAGAIN);
  assert_int_equal(why.reason, ES_REFUSE_DEADLINE);
  assert_int_equal(n, 0);
  /* A priority the runtime does not have is the caller's mistake. */
  ES_EXPECT_RC(es_ocr_read(ocr_, &img, 99, 0, lines, 4, &n, &why), ES_EINVAL);
  free(img.rgb);
}

/* Two threads on one reader: same lines, and every APPS byte comes back. */
typedef struct thread_arg {
  const es_image *img;
  es_ocr_line lines[MAX_LINES];
  int n, rc;
} thread_arg;

static void *read_thread(void *p) {
  thread_arg *a = p;
  es_refusal why;
  a->rc = es_ocr_read(ocr_, a->img, 1, 0, a->lines, MAX_LINES, &a->n, &why);
  return NULL;
}

static void test_concurrent_reads(void **state) {
  (void)state;
  NEED_READER();
  NEED_CONVERT();
  const ocr_case c = {"threads", 24, 0, 0, {"Two readers, one model", "Thread-safe 42", NULL}};
  char path[512];
  snprintf(path, sizeof path, "%s/%s.png", tmp_dir_, c.name);
  assert_int_equal(render(&c, path), 0);
  es_image img;
  ES_CHECK_RC(es_image_load(path, &img));
  es_mem_stats before, after;
  es_mem_stats_get(ES_MEM_APPS, &before);
  static thread_arg args[2];
  pthread_t th[2];
  for (int i = 0; i < 2; i++) {
    memset(&args[i], 0, sizeof args[i]);
    args[i].img = &img;
    assert_int_equal(pthread_create(&th[i], NULL, read_thread, &args[i]), 0);
  }
  for (int i = 0; i < 2; i++)
    pthread_join(th[i], NULL);
  es_mem_stats_get(ES_MEM_APPS, &after);
  for (int i = 0; i < 2; i++)
    if (args[i].rc < 0)
      fail_msg("thread %d: %s", i, es_err_name(args[i].rc));
  assert_int_equal(args[0].n, args[1].n);
  assert_true(args[0].n >= 2);
  for (int i = 0; i < args[0].n; i++) {
    assert_string_equal(args[0].lines[i].text, args[1].lines[i].text);
    assert_memory_equal(args[0].lines[i].box, args[1].lines[i].box, sizeof args[0].lines[i].box);
  }
  printf("# threads: '%s' '%s'; APPS bytes before %zu, after %zu, peak %zu\n",
         args[0].lines[0].text, args[0].lines[1].text, before.current, after.current,
         after.peak);
  assert_int_equal(before.current, after.current);
  es_image_free(&img);
}

/* A runtime that admits one request per model at a time: the reader's
 * rec batches (up to 8 in flight) are refused, and it must wait for its
 * own and retry instead of failing; the text is the same as with room. */
static void test_tight_runtime(void **state) {
  (void)state;
  NEED_READER();
  NEED_CONVERT();
  const ocr_case c = {"many", 20, 0, 0,
                      {"one two three four", "five six seven eight nine ten",
                       "eleven 11 twelve 12 thirteen 13", "fourteen"}};
  char path[512];
  snprintf(path, sizeof path, "%s/%s.png", tmp_dir_, c.name);
  assert_int_equal(render(&c, path), 0);
  es_runtime_config rc;
  es_runtime_config_default(&rc);
  rc.workers = 2;
  rc.pin = 0;
  rc.watch_ms = 0;
  rc.model_max_inflight = 1;
  es_runtime *rt;
  ES_CHECK_RC(es_runtime_create(&rc, &rt));
  es_ocr_config oc;
  es_ocr_config_default(&oc);
  char keys[2048];
  snprintf(keys, sizeof keys, "%s", model_path("ppocr_keys_v1.txt"));
  oc.keys_path = keys;
  const char *files[3] = {"ppocr_det.onnx", "ppocr_cls.onnx", "ppocr_rec.onnx"};
  int *ids[3] = {&oc.det_model, &oc.cls_model, &oc.rec_model};
  for (int i = 0; i < 3; i++) {
    es_model_config mc;
    es_model_config_default(&mc);
    mc.name = files[i];
    mc.path = model_path(files[i]);
    ES_CHECK_RC(es_runtime_model_load(rt, &mc, ids[i]));
  }
  es_ocr *o;
  ES_CHECK_RC(es_ocr_create(rt, &oc, &o));
  es_image img;
  ES_CHECK_RC(es_image_load(path, &img));
  es_ocr_line a[MAX_LINES], b[MAX_LINES];
  int na = 0, nb = 0;
  es_refusal why;
  ES_CHECK_RC(es_ocr_read(o, &img, 0, 0, a, MAX_LINES, &na, &why));
  ES_CHECK_RC(es_ocr_read(ocr_, &img, 0, 0, b, MAX_LINES, &nb, &why));
  assert_int_equal(na, nb);
  assert_true(na >= 4);
  for (int i = 0; i < na; i++)
    assert_string_equal(a[i].text, b[i].text);
  es_admission_stats st;
  ES_CHECK_RC(es_admission_stats_get(es_runtime_admission(rt), &st));
  printf("# tight runtime: %d lines, %llu admitted, %llu refused, peak in flight %zu\n", na,
         (unsigned long long)st.admitted, (unsigned long long)st.refused, st.peak_inflight);
  es_image_free(&img);
  es_ocr_destroy(o);
  ES_CHECK_RC(es_runtime_destroy(rt));
}

/* A failure mid-pipeline keeps its own code and detail. Memory pressure
 * removes the reader's queued rec batches (ES_EAGAIN, MEMORY_PRESSURE)
 * while others of its batches are in flight; cleaning those up (cancel:
 * ES_EBUSY or ES_ESTATE; wait: ES_ECANCELED, each with its own detail)
 * must not replace the refusal: the caller answers 503 with a Retry-After
 * from it, where "es_request_cancel: the request is running" was a 500. The
 * scenario is timed by the runtime's pause and stats, not by the clock; when
 * the page finished before the queue could be cut, it is run again. */
typedef struct fake_mem {
  _Atomic size_t current;
} fake_mem;

static int fake_memstat(void *user, es_memstat *out) {
  fake_mem *f = user;
  memset(out, 0, sizeof *out);
  out->version = 2;
  out->current = atomic_load(&f->current);
  out->high = SIZE_MAX;
  out->max = (size_t)1 << 30;
  return 0;
}

typedef struct pressed_read {
  es_ocr *o;
  const es_image *img;
  es_ocr_line lines[MAX_LINES];
  int n, rc;
  es_refusal why;
  char detail[512];
  _Atomic int done;
} pressed_read;

static void *pressed_thread(void *p) {
  pressed_read *a = p;
  a->rc = es_ocr_read(a->o, a->img, 0, 0, a->lines, MAX_LINES, &a->n, &a->why);
  snprintf(a->detail, sizeof a->detail, "%s", es_last_error_detail());
  atomic_store(&a->done, 1);
  return NULL;
}

static size_t queued(es_runtime *rt) {
  es_runtime_stats st;
  ES_CHECK_RC(es_runtime_stats_get(rt, &st));
  return st.queued_total;
}

/* Until cond holds or the reader is done; polled, each step a yield. */
#define WAIT_FOR(cond, a)                                                      \
  while (!(cond) && !atomic_load(&(a)->done))                                 \
  usleep(100)

static void test_failure_keeps_its_error(void **state) {
  (void)state;
  NEED_READER();
  NEED_CONVERT();
  const ocr_case c = {"pressed", 20, 0, 0,
                      {"one two three four", "five six seven eight nine ten",
                       "eleven 11 twelve 12 thirteen 13", "fourteen"}};
  char path[512];
  snprintf(path, sizeof path, "%s/%s.png", tmp_dir_, c.name);
  assert_int_equal(render(&c, path), 0);
  es_image one;
  ES_CHECK_RC(es_image_load(path, &one));
  /* Five copies stacked: twenty lines, four rec batches on one worker. */
  es_image img = {.width = one.width, .height = one.height * 5};
  size_t page = (size_t)one.width * one.height * 3;
  img.rgb = malloc(page * 5);
  assert_non_null(img.rgb);
  for (int k = 0; k < 5; k++)
    memcpy(img.rgb + page * k, one.rgb, page);
  es_image_free(&one);

  static fake_mem mem;
  static pressed_read a;
  int exercised = 0;
  for (int attempt = 1; attempt <= 5 && !exercised; attempt++) {
    atomic_store(&mem.current, 0);
    es_runtime_config rc;
    es_runtime_config_default(&rc);
    rc.workers = 1;
    rc.pin = 0;
    rc.watch_ms = 0;
    rc.memstat_fn = fake_memstat;
    rc.memstat_user = &mem;
    es_runtime *rt;
    ES_CHECK_RC(es_runtime_create(&rc, &rt));
    es_ocr_config oc;
    es_ocr_config_default(&oc);
    char keys[2048];
    snprintf(keys, sizeof keys, "%s", model_path("ppocr_keys_v1.txt"));
    oc.keys_path = keys;
    const char *files[2] = {"ppocr_det.onnx", "ppocr_rec.onnx"};
    int *ids[2] = {&oc.det_model, &oc.rec_model};
    for (int i = 0; i < 2; i++) {
      es_model_config mc;
      es_model_config_default(&mc);
      mc.name = files[i];
      mc.path = model_path(files[i]);
      ES_CHECK_RC(es_runtime_model_load(rt, &mc, ids[i]));
    }
    memset(&a, 0, sizeof a);
    ES_CHECK_RC(es_ocr_create(rt, &oc, &a.o));
    a.img = &img;

    ES_CHECK_RC(es_runtime_pause(rt, 1));
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, pressed_thread, &a), 0);
    WAIT_FOR(queued(rt) >= 1, &a); /* det */
    ES_CHECK_RC(es_runtime_pause(rt, 0));
    WAIT_FOR(queued(rt) >= 2, &a); /* rec batches waiting behind a running one */
    ES_CHECK_RC(es_runtime_pause(rt, 1));
    atomic_store(&mem.current, (size_t)1 << 30); /* above the hard mark */
    es_runtime_watch_now(rt);                     /* the queue is emptied */
    ES_CHECK_RC(es_runtime_pause(rt, 0));
    pthread_join(th, NULL);

    es_runtime_stats st;
    ES_CHECK_RC(es_runtime_stats_get(rt, &st));
    es_admission_stats as;
    ES_CHECK_RC(es_admission_stats_get(es_runtime_admission(rt), &as));
    printf("# attempt %d: %s (%s, retry after %u ms), %llu removed from the queue: %s\n",
           attempt, es_err_name(a.rc), es_refusal_name(a.why.reason), a.why.retry_after_ms,
           (unsigned long long)st.dropped, a.detail);
    assert_int_equal(as.reserved_bytes, 0); /* the reader's holds came back */
    if (a.rc != 0) {
      assert_int_equal(a.rc, ES_EAGAIN);
      assert_int_equal(a.why.reason, ES_REFUSE_MEMORY_PRESSURE);
      assert_true(a.why.retry_after_ms >= 1);
      assert_null(strstr(a.detail, "es_request_cancel"));
      assert_null(strstr(a.detail, "es_request_wait"));
      assert_non_null(strstr(a.detail, "ocr: "));
      assert_non_null(strstr(a.detail, "memory_pressure"));
      /* Two or more removed: the reader met the first with the others of
       * its window still to clean up. */
      exercised = st.dropped >= 2;
    }
    es_ocr_destroy(a.o);
    ES_CHECK_RC(es_runtime_destroy(rt));
  }
  free(img.rgb);
  assert_true(exercised);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_blank_and_corrupt),
      cmocka_unit_test(test_config_errors),
      cmocka_unit_test(test_deadline_refused),
      cmocka_unit_test(test_boxes_where_drawn),
      cmocka_unit_test(test_accuracy),
      cmocka_unit_test(test_chinese),
      cmocka_unit_test(test_concurrent_reads),
      cmocka_unit_test(test_tight_runtime),
      cmocka_unit_test(test_failure_keeps_its_error),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
