/* Image decoding: JPEG (libjpeg-turbo) and PNG (libspng) to 8-bit RGB.
 *
 * Both decoders are told the output format up front (JCS_RGB,
 * SPNG_FMT_RGB8), so grey, palette, 16-bit and alpha inputs arrive as plain
 * RGB and the pipelines see one layout. Dimensions are checked against a
 * 64-megapixel cap from the header, before any decoder allocates: a 30-byte
 * header claiming 65535 x 65535 must not turn into a 12 GB allocation, and
 * libjpeg sizes a progressive image's coefficient buffer in
 * jpeg_start_decompress, so the check comes right after jpeg_read_header.
 * libjpeg's own memory is capped too (max_memory_to_use: a progressive image
 * whose coefficients need more is refused, not decoded), and so is its
 * number of scans (each scan is a pass over the whole image: a small file
 * of a thousand scans would hold a thread for seconds). libjpeg reports
 * errors through a longjmp, the only way out of its error manager. */
#include "edgeserve/apps.h"
#include "common/internal.h"

#include <errno.h>
#include <setjmp.h>
#include <stdio.h> /* before jpeglib.h, which uses FILE */
#include <string.h>

#include <jpeglib.h>
#include <jerror.h>
#include <spng.h>

#define IMG_MAX_PIXELS ((size_t)64 << 20)
/* libjpeg's working memory: a few rows for a baseline image, the whole
 * coefficient buffer (2 bytes per sample) for a progressive one. */
#define IMG_JPEG_MAX_MEMORY (64L << 20)
/* Scans of a progressive JPEG: encoders write about ten. */
#define IMG_JPEG_MAX_SCANS 100

typedef struct jerr {
  struct jpeg_error_mgr mgr;
  jmp_buf jump;
  char msg[JMSG_LENGTH_MAX];
} jerr;

static void jpeg_fail(j_common_ptr c) {
  jerr *e = (jerr *)c->err;
  (*c->err->format_message)(c, e->msg);
  longjmp(e->jump, 1);
}

/* Warnings (corrupt-but-decodable data) are not printed; a file that ends
 * before the image does is an error, not a grey-padded picture. */
static void jpeg_quiet(j_common_ptr c, int level) {
  if (level < 0 && c->err->msg_code == JWRN_JPEG_EOF)
    jpeg_fail(c);
}

/* Called while libjpeg reads input, once per scan and more: stops a file
 * with too many scans. */
static void jpeg_progress(j_common_ptr c) {
  j_decompress_ptr d = (j_decompress_ptr)c;
  if (d->input_scan_number > IMG_JPEG_MAX_SCANS) {
    jerr *e = (jerr *)c->err;
    snprintf(e->msg, sizeof e->msg, "more than %d scans", IMG_JPEG_MAX_SCANS);
    longjmp(e->jump, 1);
  }
}

static int decode_jpeg(const void *bytes, size_t len, es_image *out) {
  struct jpeg_decompress_struct d;
  struct jpeg_progress_mgr progress = {.progress_monitor = jpeg_progress};
  jerr e;
  uint8_t *volatile rgb = NULL;
  d.err = jpeg_std_error(&e.mgr);
  e.mgr.error_exit = jpeg_fail;
  e.mgr.emit_message = jpeg_quiet;
  if (setjmp(e.jump)) {
    jpeg_destroy_decompress(&d);
    es_mem_free(rgb);
    if (e.mgr.msg_code == JERR_NO_BACKING_STORE || e.mgr.msg_code == JERR_OUT_OF_MEMORY)
      return es__fail(ES_EINVAL, "JPEG: the decoder needs more than %ld MiB (progressive "
                                 "image too large)", IMG_JPEG_MAX_MEMORY >> 20);
    return es__fail(ES_EINVAL, "JPEG: %s", e.msg);
  }
  jpeg_create_decompress(&d);
  d.mem->max_memory_to_use = IMG_JPEG_MAX_MEMORY;
  d.progress = &progress;
  jpeg_mem_src(&d, (const unsigned char *)bytes, (unsigned long)len);
  jpeg_read_header(&d, TRUE);
  size_t w = d.image_width, h = d.image_height;
  if (!w || !h || w * h > IMG_MAX_PIXELS) {
    jpeg_destroy_decompress(&d);
    return es__fail(ES_EINVAL, "JPEG: %zux%zu image (limit %zu pixels)", w, h, IMG_MAX_PIXELS);
  }
  d.out_color_space = JCS_RGB;
  jpeg_start_decompress(&d);
  w = d.output_width;
  h = d.output_height;
  if (!w || !h || w * h > IMG_MAX_PIXELS || d.output_components != 3) {
    jpeg_destroy_decompress(&d);
    return es__fail(ES_EINVAL, "JPEG: %zux%zu image (limit %zu pixels)", w, h, IMG_MAX_PIXELS);
  }
  rgb = es_mem_alloc(ES_MEM_APPS, w * h * 3);
  if (!rgb) {
    jpeg_destroy_decompress(&d);
    return es__fail(ES_ENOMEM, "JPEG: no memory for %zux%zu", w, h);
  }
  while (d.output_scanline < d.output_height) {
    JSAMPROW row = rgb + (size_t)d.output_scanline * w * 3;
    jpeg_read_scanlines(&d, &row, 1);
  }
  jpeg_finish_decompress(&d);
  jpeg_destroy_decompress(&d);
  out->width = (int)w;
  out->height = (int)h;
  out->rgb = rgb;
  return 0;
}

static int decode_png(const void *bytes, size_t len, es_image *out) {
  spng_ctx *c = spng_ctx_new(0);
  if (!c)
    return es__fail(ES_ENOMEM, "PNG: no memory");
  /* Ancillary chunks are not needed; a bad CRC there is not worth a 400.
   * A bad one on image data is. */
  spng_set_crc_action(c, SPNG_CRC_ERROR, SPNG_CRC_USE);
  spng_set_image_limits(c, 1u << 16, 1u << 16);
  spng_set_chunk_limits(c, 1u << 24, 1u << 26);
  int rc = spng_set_png_buffer(c, bytes, len);
  struct spng_ihdr ih;
  if (rc == 0)
    rc = spng_get_ihdr(c, &ih);
  if (rc) {
    spng_ctx_free(c);
    return es__fail(ES_EINVAL, "PNG: %s", spng_strerror(rc));
  }
  if ((size_t)ih.width * ih.height > IMG_MAX_PIXELS) {
    spng_ctx_free(c);
    return es__fail(ES_EINVAL, "PNG: %ux%u image (limit %zu pixels)", ih.width, ih.height,
                    IMG_MAX_PIXELS);
  }
  size_t n = 0;
  rc = spng_decoded_image_size(c, SPNG_FMT_RGB8, &n);
  uint8_t *rgb = rc ? NULL : es_mem_alloc(ES_MEM_APPS, n);
  if (!rc && !rgb) {
    spng_ctx_free(c);
    return es__fail(ES_ENOMEM, "PNG: no memory for %ux%u", ih.width, ih.height);
  }
  if (!rc)
    rc = spng_decode_image(c, rgb, n, SPNG_FMT_RGB8, SPNG_DECODE_TRNS);
  spng_ctx_free(c);
  if (rc) {
    es_mem_free(rgb);
    return es__fail(ES_EINVAL, "PNG: %s", spng_strerror(rc));
  }
  out->width = (int)ih.width;
  out->height = (int)ih.height;
  out->rgb = rgb;
  return 0;
}

int es_image_decode(const void *bytes, size_t len, es_image *out) {
  if (!out || (!bytes && len))
    return es__fail(ES_EINVAL, "es_image_decode: NULL argument");
  memset(out, 0, sizeof *out);
  const unsigned char *b = bytes;
  if (len >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF)
    return decode_jpeg(bytes, len, out);
  static const unsigned char png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (len >= 8 && !memcmp(b, png_sig, 8))
    return decode_png(bytes, len, out);
  return es__fail(ES_EINVAL, "not a JPEG or PNG image (%zu bytes)", len);
}

int es_image_load(const char *path, es_image *out) {
  if (!path || !out)
    return es__fail(ES_EINVAL, "es_image_load: NULL argument");
  FILE *f = fopen(path, "rb");
  if (!f)
    return es__fail(errno == ENOENT ? ES_ENOENT : ES_EIO, "%s: %s", path, strerror(errno));
  void *buf = NULL;
  long size = -1;
  if (fseek(f, 0, SEEK_END) == 0)
    size = ftell(f);
  if (size < 0 || size > (1L << 30) || fseek(f, 0, SEEK_SET) != 0) {
    fclose(f);
    return es__fail(ES_EIO, "%s: cannot read its size (or over 1 GiB)", path);
  }
  buf = es_mem_alloc(ES_MEM_APPS, size ? (size_t)size : 1);
  if (!buf) {
    fclose(f);
    return es__fail(ES_ENOMEM, "%s: no memory", path);
  }
  size_t got = fread(buf, 1, (size_t)size, f);
  fclose(f);
  int rc = got == (size_t)size ? es_image_decode(buf, (size_t)size, out)
                               : es__fail(ES_EIO, "%s: short read", path);
  es_mem_free(buf);
  if (rc < 0) {
    char d[512];
    snprintf(d, sizeof d, "%s", es_last_error_detail());
    return es__fail(rc, "%s: %s", path, d);
  }
  return 0;
}

void es_image_free(es_image *img) {
  if (!img)
    return;
  es_mem_free(img->rgb);
  memset(img, 0, sizeof *img);
}
