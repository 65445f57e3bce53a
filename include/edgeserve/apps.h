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
 * Pre- and post-processing buffers are counted under ES_MEM_APPS and
 * reserved through the runtime's admission on the model's behalf before
 * they are allocated (es_admission_reserve), so they count against the
 * budget like the models' arenas; a server decodes its images with
 * es_image_decode_admitted, which does the same for the pixels. A failing
 * call returns its own first error and detail (cleaning up after it
 * reports nothing). Detectors and readers are immutable after create and
 * thread-safe.
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
  uint8_t *rgb;     /* width * height * 3, row-major, owned (es_image_free) */
  es_request *hold; /* private: the admission reservation of an image from
                       es_image_decode_admitted, NULL otherwise; released
                       by es_image_free. So an image is not to be copied:
                       pass pointers */
  int scale;        /* 0 or 1: the encoded image's size; k (2, 4 or 8):
                       decoded at 1/k of it (es_image_decode_scaled), so a
                       pixel here covers k x k of the encoded image's, and
                       es_face_detect gives its boxes in the encoded
                       image's pixels */
} es_image;

enum { ES_IMAGE_JPEG = 1, ES_IMAGE_PNG = 2 };

/* What an encoded image will cost, from its header alone. */
typedef struct es_image_info {
  int format;           /* ES_IMAGE_JPEG or ES_IMAGE_PNG */
  int width, height;
  int progressive;      /* JPEG: progressive frame; PNG: interlaced */
  size_t decoded_bytes; /* width * height * 3: the es_image's pixels */
  size_t work_bytes;    /* the decoder's own memory at most, while it runs
                           (a JPEG in several scans keeps every coefficient:
                           2 bytes a sample) */
} es_image_info;

/* Read an encoded image's header (JPEG markers up to the first scan, PNG's
 * IHDR) and price it. Allocates nothing; O(number of header segments).
 * ES_EINVAL with a detail for anything but a JPEG or PNG, a truncated or
 * malformed header, more than 64 megapixels, or a JPEG in several scans
 * whose coefficients need more than 64 MiB. Thread-safe. */
ES_API int es_image_probe(const void *bytes, size_t len, es_image_info *out);

/* JPEG or PNG (by signature), any bit depth or colour type the libraries
 * read, converted to 8-bit RGB (alpha dropped, grey expanded), on the
 * calling thread, outside any budget (the CLI's path; a server decodes with
 * es_image_decode_admitted). Refused from the header before the decoder
 * allocates as es_image_probe says; libjpeg's memory capped at 64 MiB, at
 * most 100 scans; libspng's memory (counted, ES_MEM_APPS) capped at the
 * probe's price and its ancillary chunks skipped. ES_EINVAL with a detail
 * for anything else or a corrupt file; ES_ENOMEM. The caller owns *out
 * (es_image_free). Thread-safe. */
ES_API int es_image_decode(const void *bytes, size_t len, es_image *out);
ES_API int es_image_load(const char *path, es_image *out);

/* Decode inside the runtime's memory budget, on one of its workers. Blocks
 * the calling thread until the image is decoded or refused; call it from a
 * thread of the caller's (an HTTP request's) or from a task (es_task: the
 * decode then runs on the task's own worker), never from a completion
 * callback.
 *
 * The header is priced (es_image_probe: decoded pixels + the decoder's
 * working memory) and that many bytes are reserved through the runtime's
 * admission on model_id's behalf (the pipeline's first model: refused
 * while it drains, counted in its refusals; no concurrency slot is taken,
 * see es_runtime_submit_task). The decode then waits in the queue of
 * `priority` and runs on a worker; it gives up at deadline_ns
 * (CLOCK_MONOTONIC; 0: 10 s from now), checked between rows and by
 * libjpeg's progress monitor. On success the reservation stays held by
 * *out until es_image_free, so the image counts against the budget as long
 * as it lives; the caller owns *out (bytes may be freed at once).
 *
 * Returns 0; ES_EAGAIN when the budget (or memory pressure, a full queue,
 * a draining model) refuses it now, why filled (reason, retry_after_ms);
 * ES_ENOSPC when it is larger than the whole budget (why: OVER_MEMORY,
 * retry_after_ms 0); ES_ETIMEDOUT when the deadline passed in the queue
 * or while decoding (why: DEADLINE with the admission's estimate);
 * ES_EINVAL with a detail for a bad image or argument (nothing reserved);
 * ES_ENOENT for an unknown model; ES_ENOMEM. why may be NULL. *out is
 * zeroed on failure. Thread-safe. */
ES_API int es_image_decode_admitted(es_runtime *rt, int model_id, const void *bytes, size_t len,
                                   int priority, uint64_t deadline_ns, es_image *out,
                                   es_refusal *why);
/* The same, for a consumer that needs no more than min_side pixels on the
 * image's longer side (a detector's input): a JPEG is decoded at 1/2, 1/4
 * or 1/8 of its size, the smallest whose longer side is still at least
 * min_side (libjpeg's scaled inverse DCT, which averages each k x k area:
 * less work, and a k*k times smaller image and reservation); out->scale
 * says k. A PNG, or min_side 0, is decoded whole (scale 1). */
ES_API int es_image_decode_scaled(es_runtime *rt, int model_id, const void *bytes, size_t len,
                                  int min_side, int priority, uint64_t deadline_ns,
                                  es_image *out, es_refusal *why);

/* Free the pixels, then give back the reservation of an admitted image.
 * NULL and a zeroed image are no-ops. Not thread-safe on one image. */
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
/* The model's input side (128 for front, 256 for back): an image need not
 * be larger than that on its longer side (es_image_decode_scaled). */
ES_API int es_face_detector_input_side(const es_face_detector *fd);
/* Detect faces with score >= min_score (0: the default 0.5). Writes up to
 * max faces, highest score first, *n the count. priority and deadline as
 * es_submit. The call's own buffers (the S x S x 3 float input and, for an
 * image more than twice the input's side, mip levels of at most 5/16 of
 * the image's bytes) are reserved for the call. ES_EAGAIN: refused (the
 * model's request, or those buffers); ES_ENOSPC: the buffers alone exceed
 * the budget; ES_ETIMEDOUT: the deadline passed before the run; all fill
 * why (when not NULL) with the reason and the admission's retry-after
 * estimate. The image is only read. NULL fd: no-op for destroy. */
ES_API int es_face_detect(es_face_detector *fd, const es_image *img, float min_score, int priority,
                   uint64_t deadline_ns, es_face *faces, int max, int *n, es_refusal *why);

/* The detector's input as es_face_detect makes it from img: letterboxed to
 * side x side, RGB in [-1, 1], 1 x side x side x 3 (nchw 0) or
 * 1 x 3 x side x side. For tools that need the model's real inputs (the
 * quantizer's calibration). out->data is allocated under ES_MEM_APPS
 * (es_mem_free it). */
ES_API int es_face_input(const es_image *img, int side, int nchw, es_tensor *out);

/* The intersection over union of two faces' boxes (0 when they do not
 * meet), as the detector's suppression measures overlap. Pure. */
ES_API float es_face_iou(const es_face *a, const es_face *b);

/* The faces in a BlazeFace model's outputs, decoded and suppressed as
 * es_face_detect does (min_score 0: the default 0.5), in the model input's
 * pixels (side x side: no letterbox undone). For callers that run the
 * model themselves (the quantizer's search compares int8 faces with FP32's).
 * outs: the model's n_out outputs in its order; the heads are found by
 * their shapes as es_face_detector_create finds them (ES_EMODEL when they
 * are not there). Only reads outs; thread-safe. */
ES_API int es_face_decode(const es_tensor *outs, int n_out, int side, float min_score,
                          es_face *faces, int max, int *n);

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
 * The call's buffers are reserved stage by stage (det: 12 B a pixel of the
 * detector's view for its input and 5 more for its map, about 16 MB at
 * 960; the crops: about 3 B a pixel of the boxes found; cls and rec: the
 * inputs of up to 8 batches in flight, at most 14 MB each).
 * ES_EAGAIN, ES_ENOSPC and ES_ETIMEDOUT fill why as es_face_detect. NULL o:
 * no-op for destroy. */
ES_API int es_ocr_read(es_ocr *o, const es_image *img, int priority, uint64_t deadline_ns,
                es_ocr_line *lines, int max, int *n, es_refusal *why);

/* The text detector's input as es_ocr_read makes it from img (its longer
 * side at most limit_side, 0: 960; both sides multiples of 32): 1 x 3 x H
 * x W, normalised, channels B, G, R. out->data is allocated under
 * ES_MEM_APPS (es_mem_free it). */
ES_API int es_ocr_det_input(const es_image *img, int limit_side, es_tensor *out);

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
