/* edgeserve/apps.h - answers, not tensors: image decoding, face detection
 * (BlazeFace) and OCR (PP-OCRv4 det -> cls -> rec) on top of the runtime.
 *
 *   es_image img;
 *   es_image_decode(jpeg_bytes, len, &img);        // RGB, 8 bits
 *   es_face_detector *fd;
 *   es_face_detector_create(rt, face_model_id, &fd);
 *   es_face faces[16];
 *   int n;
 *   es_face_detect(fd, &img, 0.5f, faces, 16, &n);
 *
 * Pipelines run their models through es_runtime_submit, so they share the
 * runtime's admission, queues, arenas and weights with every other request:
 * a refusal surfaces as ES_EAGAIN with the refusal (retry-after) filled.
 * Pre- and post-processing buffers are counted under ES_MEM_APPS.
 * Detectors and readers are immutable after create and thread-safe.
 */
#ifndef EDGESERVE_APPS_H
#define EDGESERVE_APPS_H

#include <stddef.h>
#include <stdint.h>

#include "edgeserve/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- images ------------------------------------------------------------ */

typedef struct es_image {
  int width, height;
  uint8_t *rgb; /* width * height * 3, row-major, owned (es_image_free) */
} es_image;

/* JPEG or PNG (by signature), any bit depth or colour type the libraries
 * read, converted to 8-bit RGB (alpha dropped, grey expanded).
 * ES_EINVAL with a detail for anything else or a corrupt file; ES_ENOMEM;
 * images above 64 megapixels are refused (ES_EINVAL). */
ES_API int es_image_decode(const void *bytes, size_t len, es_image *out);
ES_API int es_image_load(const char *path, es_image *out);
ES_API void es_image_free(es_image *img);

/* ---- face detection ----------------------------------------------------- */

typedef struct es_face {
  float x0, y0, x1, y1;   /* box in original image pixels */
  float score;            /* 0..1 */
  float keypoints[6][2];  /* right eye, left eye, nose, mouth, right ear,
                             left ear (MediaPipe's order), image pixels */
} es_face;

typedef struct es_face_detector es_face_detector;

/* model_id: a BlazeFace model loaded in rt (front 128x128 or back 256x256;
 * the input size is read from the model). */
ES_API int es_face_detector_create(es_runtime *rt, int model_id, es_face_detector **out);
ES_API void es_face_detector_destroy(es_face_detector *fd);
/* Detect faces with score >= min_score (0: the default 0.5). Writes up to
 * max faces, highest score first, *n the count. priority and deadline as
 * es_submit. ES_EAGAIN: refused; ES_ETIMEDOUT: the deadline passed before
 * the run; both fill why (when not NULL) with the reason and the
 * admission's retry-after estimate. NULL fd: no-op for destroy. */
ES_API int es_face_detect(es_face_detector *fd, const es_image *img, float min_score, int priority,
                   uint64_t deadline_ns, es_face *faces, int max, int *n, es_refusal *why);

/* ---- OCR ----------------------------------------------------------------- */

typedef struct es_ocr_line {
  float box[4][2];        /* corners in image pixels, clockwise from top-left */
  char text[1024];        /* UTF-8 */
  float confidence;       /* mean of the characters' probabilities */
  float box_score;        /* the detector's score for the box */
} es_ocr_line;

typedef struct es_ocr es_ocr;

typedef struct es_ocr_config {
  int det_model, cls_model, rec_model; /* ids in the runtime; cls may be -1 */
  const char *keys_path;  /* ppocr_keys_v1.txt */
  int det_limit_side;     /* longer side the detector sees (default 960) */
  float det_thresh;       /* pixel threshold (default 0.3) */
  float box_thresh;       /* box score threshold (default 0.6) */
  float unclip_ratio;     /* default 1.5 */
  float cls_thresh;       /* rotate 180 when cls says so above this (0.9) */
  int rec_height;         /* 48 */
} es_ocr_config;

ES_API void es_ocr_config_default(es_ocr_config *cfg);
ES_API int es_ocr_create(es_runtime *rt, const es_ocr_config *cfg, es_ocr **out);
ES_API void es_ocr_destroy(es_ocr *o);
/* Read the text lines of an image, top to bottom. Writes up to max lines.
 * ES_EAGAIN and ES_ETIMEDOUT fill why as es_face_detect. NULL o: no-op for
 * destroy. */
ES_API int es_ocr_read(es_ocr *o, const es_image *img, int priority, uint64_t deadline_ns,
                es_ocr_line *lines, int max, int *n, es_refusal *why);

/* ---- answers as JSON ------------------------------------------------------ */

/* {"faces":[{"box":[x0,y0,x1,y1],"score":s,"keypoints":[[x,y],...]}]} and
 * {"lines":[{"text":"...","confidence":c,"box_score":s,"box":[[x,y],...]}]}
 * (what the CLI prints and the server's pipeline models return). The
 * string is NUL-terminated, allocated under ES_MEM_APPS (es_mem_free it);
 * NULL when out of memory. */
ES_API char *es_faces_json(const es_face *faces, int n, size_t *len);
ES_API char *es_ocr_json(const es_ocr_line *lines, int n, size_t *len);

#ifdef __cplusplus
}
#endif
#endif
