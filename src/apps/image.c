/* Image decoding: JPEG (libjpeg-turbo) and PNG (libspng) to 8-bit RGB.
 *
 * Both decoders are told the output format up front (JCS_RGB,
 * SPNG_FMT_RGB8), so grey, palette, 16-bit and alpha inputs arrive as plain
 * RGB and the pipelines see one layout.
 *
 * A few hundred bytes can ask for gigabytes, so nothing is allocated before
 * the file's own header has been read and priced. es_image_probe walks the
 * header by hand (JPEG: markers up to the frame header and the first scan
 * header; PNG: the IHDR chunk), allocates nothing, and gives the decoded
 * size and the decoder's working memory: for a JPEG whose components come
 * in several scans (progressive, or sequential non-interleaved) libjpeg
 * keeps every coefficient of the image (2 bytes per sample, computed from
 * the sampling factors), otherwise a few rows; for a PNG a few rows, the
 * inflater and the context. Images above 64 megapixels, and JPEGs whose
 * coefficients need more than 64 MiB, are refused right there.
 *
 * es_image_decode_admitted prices an image this way, reserves the price
 * through the runtime's admission (a task charged to a model, see
 * es_runtime_submit_task) and decodes on a worker: an image that does not
 * fit the budget is refused with a retry-after before a byte is allocated,
 * decoding never runs on the caller's (an HTTP connection's) thread, and
 * the reservation lives as long as the image. es_image_decode is the same
 * decoder on the caller's thread, for the CLI.
 *
 * Limits inside the decoders, whoever calls them:
 *   - libjpeg's memory is capped (max_memory_to_use: a coefficient buffer
 *     above it is refused), so is its number of scans (each scan is a pass
 *     over the whole image: a small file of a thousand scans would hold a
 *     thread for seconds), and a deadline is checked from its progress
 *     monitor and between rows. libjpeg reports errors through a longjmp,
 *     the only way out of its error manager.
 *   - libspng allocates through the counting layer, capped at the working
 *     memory the probe priced; ancillary chunks never reach it (the reader
 *     below skips them: with RGB8 output and no gamma, none changes a
 *     pixel), so zTXt, iTXt, iCCP and eXIf bombs cost nothing, and its
 *     chunk and cache limits are small besides. It decodes row by row, the
 *     deadline checked between rows. */
#include "edgeserve/apps.h"
#include "common/internal.h"

#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdio.h> /* before jpeglib.h, which uses FILE */
#include <string.h>

#include <jpeglib.h>
#include <jerror.h>
#include <spng.h>

#define IMG_MAX_PIXELS ((size_t)64 << 20)
/* libjpeg's working memory: a few rows for a single-scan image, the whole
 * coefficient buffer for one in several scans. */
#define IMG_JPEG_MAX_MEMORY ((size_t)64 << 20)
/* Scans of a progressive JPEG: encoders write about ten. */
#define IMG_JPEG_MAX_SCANS 100
/* What libjpeg and libspng take besides rows: tables, contexts, the
 * inflater and its window, libspng's 8 KiB read buffer. */
#define IMG_FIXED_WORK ((size_t)256 << 10)
/* libspng: one inflated ancillary chunk, and all of them (a second line of
 * defence: the reader skips ancillary chunks). */
#define IMG_PNG_CHUNK_LIMIT ((size_t)64 << 10)
#define IMG_PNG_CACHE_LIMIT ((size_t)256 << 10)
#define IMG_PNG_CHUNK_COUNT 64
/* The time bound of an admitted decode that came without a deadline. */
#define IMG_DEFAULT_BOUND_NS (10ull * 1000000000ull)

/* ---- the header, by hand ----------------------------------------------- */

static const unsigned char png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};

static unsigned be16(const unsigned char *p) { return (unsigned)p[0] << 8 | p[1]; }

static uint32_t be32(const unsigned char *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static size_t div_up(size_t a, size_t b) { return (a + b - 1) / b; }

static int is_sof(unsigned m) {
  return m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC;
}

/* What libjpeg will allocate for this frame (jdcoefct.c, jdmainct.c,
 * jdsample.c): the coefficient buffer when the image comes in several
 * scans, JCOEF per sample over whole blocks of each component, rounded to
 * its sampling factors; and rows of samples for the upsampler and the main
 * buffer, a few row groups of every component. */
static int jpeg_price(const unsigned char *sof, int multi_scan, es_image_info *info) {
  unsigned nc = sof[7]; /* sof: Lf(2) P(1) Y(2) X(2) Nf(1), then Ci HiVi Tqi */
  size_t w = info->width, h = info->height;
  unsigned hmax = 1, vmax = 1;
  for (unsigned c = 0; c < nc; c++) {
    unsigned hs = sof[9 + 3 * c] >> 4, vs = sof[9 + 3 * c] & 15;
    if (hs < 1 || hs > 4 || vs < 1 || vs > 4)
      return es__fail(ES_EINVAL, "JPEG: component %u has sampling factors %ux%u", c, hs, vs);
    hmax = hs > hmax ? hs : hmax;
    vmax = vs > vmax ? vs : vmax;
  }
  size_t coef = 0, rows = 0;
  for (unsigned c = 0; c < nc; c++) {
    unsigned hs = sof[9 + 3 * c] >> 4, vs = sof[9 + 3 * c] & 15;
    size_t bw = div_up(w * hs, (size_t)hmax * 8), bh = div_up(h * vs, (size_t)vmax * 8);
    bw = div_up(bw, hs) * hs;
    bh = div_up(bh, vs) * vs;
    coef += bw * bh * 64 * sizeof(JCOEF);
    rows += bw * 8 * vs * 8 * 4; /* row groups with context, and spares */
  }
  rows += w * 3 * vmax * 2; /* the upsampler's colour rows */
  if (multi_scan && coef > IMG_JPEG_MAX_MEMORY)
    return es__fail(ES_EINVAL, "JPEG: %zux%zu in several scans: the decoder would need %zu B "
                    "of coefficients, more than %zu MiB (image too large)",
                    w, h, coef, IMG_JPEG_MAX_MEMORY >> 20);
  info->work_bytes = IMG_FIXED_WORK + rows + (multi_scan ? coef : 0);
  return 0;
}

/* Markers up to the first scan header: the frame's size and components
 * from SOFn, whether all components come in one scan from SOS. Only
 * segment lengths are followed, never entropy-coded data. */
static int jpeg_probe(const unsigned char *b, size_t len, es_image_info *info) {
  const unsigned char *sof = NULL;
  size_t pos = 2;
  for (;;) {
    while (pos < len && b[pos] == 0xFF && pos + 1 < len && b[pos + 1] == 0xFF)
      pos++; /* fill bytes */
    if (pos + 2 > len || b[pos] != 0xFF)
      return es__fail(ES_EINVAL, "JPEG: %s at byte %zu before the first scan",
                      pos + 2 > len ? "the file ends" : "no marker", pos);
    unsigned m = b[pos + 1];
    pos += 2;
    if ((m >= 0xD0 && m <= 0xD7) || m == 0x01 || m == 0xD8)
      continue; /* markers without a segment */
    if (m == 0xD9)
      return es__fail(ES_EINVAL, "JPEG: the image ends before its first scan");
    if (pos + 2 > len || be16(b + pos) < 2 || be16(b + pos) > len - pos)
      return es__fail(ES_EINVAL, "JPEG: marker 0x%02X at byte %zu: segment truncated", m,
                      pos - 2);
    const unsigned char *seg = b + pos;
    unsigned seglen = be16(seg);
    if (is_sof(m) && !sof) {
      if (seglen < 8 || seg[7] < 1 || seg[7] > 4 || seglen < 8 + 3u * seg[7])
        return es__fail(ES_EINVAL, "JPEG: bad frame header (%u components, %u bytes)",
                        seglen >= 8 ? seg[7] : 0, seglen);
      info->format = ES_IMAGE_JPEG;
      info->height = (int)be16(seg + 3);
      info->width = (int)be16(seg + 5);
      info->progressive = m == 0xC2 || m == 0xC6 || m == 0xCA || m == 0xCE;
      if (info->height == 0)
        return es__fail(ES_EINVAL, "JPEG: the height is given after the first scan (DNL), "
                                   "not supported");
      sof = seg;
    } else if (m == 0xDA) {
      if (!sof)
        return es__fail(ES_EINVAL, "JPEG: a scan before the frame header");
      if (seglen < 3)
        return es__fail(ES_EINVAL, "JPEG: bad scan header");
      break;
    }
    pos += seglen;
  }
  size_t w = (size_t)info->width, h = (size_t)info->height;
  if (!w || w * h > IMG_MAX_PIXELS)
    return es__fail(ES_EINVAL, "JPEG: %zux%zu image (limit %zu pixels)", w, h, IMG_MAX_PIXELS);
  info->decoded_bytes = w * h * 3;
  /* libjpeg buffers the whole image when the first scan lacks a component
   * (jdinput.c: comps_in_scan < num_components) or the frame is
   * progressive. */
  int multi = info->progressive || b[pos + 2] < sof[7];
  return jpeg_price(sof, multi, info);
}

static int png_probe(const unsigned char *b, size_t len, es_image_info *info) {
  if (len < 8 + 8 + 13 || be32(b + 8) != 13 || memcmp(b + 12, "IHDR", 4))
    return es__fail(ES_EINVAL, "PNG: no IHDR chunk at the start (%zu bytes)", len);
  const unsigned char *ih = b + 16;
  uint32_t w = be32(ih), h = be32(ih + 4);
  unsigned depth = ih[8], colour = ih[9];
  static const unsigned char channels[7] = {1, 0, 3, 1, 2, 0, 4};
  if (colour > 6 || !channels[colour] || (depth != 1 && depth != 2 && depth != 4 &&
                                          depth != 8 && depth != 16))
    return es__fail(ES_EINVAL, "PNG: colour type %u at %u bits", colour, depth);
  if (!w || !h || w > INT32_MAX || h > INT32_MAX || (size_t)w * h > IMG_MAX_PIXELS)
    return es__fail(ES_EINVAL, "PNG: %" PRIu32 "x%" PRIu32 " image (limit %zu pixels)", w, h,
                    IMG_MAX_PIXELS);
  info->format = ES_IMAGE_PNG;
  info->width = (int)w;
  info->height = (int)h;
  info->progressive = ih[12] != 0;
  info->decoded_bytes = (size_t)w * h * 3;
  /* Two scanlines of the file (at most 8 bytes a pixel), the output row
   * and, interlaced, a row of the pass: libspng's decode_init. */
  size_t scan = div_up((size_t)w * channels[colour] * depth, 8) + 1 + 32;
  info->work_bytes = IMG_FIXED_WORK + 3 * scan + (size_t)w * 4;
  return 0;
}

int es_image_probe(const void *bytes, size_t len, es_image_info *out) {
  if (!out || (!bytes && len))
    return es__fail(ES_EINVAL, "es_image_probe: NULL argument");
  memset(out, 0, sizeof *out);
  const unsigned char *b = bytes;
  if (len >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF)
    return jpeg_probe(b, len, out);
  if (len >= 8 && !memcmp(b, png_sig, 8))
    return png_probe(b, len, out);
  return es__fail(ES_EINVAL, "not a JPEG or PNG image (%zu bytes)", len);
}

/* ---- one decode ---------------------------------------------------------- */

typedef struct img_job {
  const unsigned char *bytes;
  size_t len;
  es_image_info info;
  uint64_t deadline_ns; /* 0: none */
  int denom;            /* JPEG: decode at 1/denom (1, 2, 4, 8) */
  es_image out;
} img_job;

static int past(const img_job *j) { return j->deadline_ns && es__now_ns() > j->deadline_ns; }

static int timed_out(const img_job *j, const char *fmt, const char *when) {
  return es__fail(ES_ETIMEDOUT, "%s: the deadline passed %s decoding %dx%d", fmt, when,
                  j->info.width, j->info.height);
}

/* ---- JPEG ---------------------------------------------------------------- */

typedef struct jerr {
  struct jpeg_error_mgr mgr;
  jmp_buf jump;
  char msg[JMSG_LENGTH_MAX];
  int expired;
} jerr;

typedef struct jprogress {
  struct jpeg_progress_mgr mgr;
  const img_job *job;
} jprogress;

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

/* Called while libjpeg reads input and writes rows, about once per row of
 * blocks: stops a file with too many scans, and a decode past its
 * deadline. */
static void jpeg_progress(j_common_ptr c) {
  j_decompress_ptr d = (j_decompress_ptr)c;
  jerr *e = (jerr *)c->err;
  if (d->input_scan_number > IMG_JPEG_MAX_SCANS) {
    snprintf(e->msg, sizeof e->msg, "more than %d scans", IMG_JPEG_MAX_SCANS);
    longjmp(e->jump, 1);
  }
  if (past(((jprogress *)c->progress)->job)) {
    e->expired = 1;
    longjmp(e->jump, 1);
  }
}

static int decode_jpeg(img_job *j) {
  struct jpeg_decompress_struct d;
  jprogress progress = {.mgr = {.progress_monitor = jpeg_progress}, .job = j};
  jerr e = {.expired = 0};
  uint8_t *volatile rgb = NULL;
  d.err = jpeg_std_error(&e.mgr);
  e.mgr.error_exit = jpeg_fail;
  e.mgr.emit_message = jpeg_quiet;
  if (setjmp(e.jump)) {
    jpeg_destroy_decompress(&d);
    es_mem_free(rgb);
    if (e.expired)
      return timed_out(j, "JPEG", "while");
    if (e.mgr.msg_code == JERR_NO_BACKING_STORE || e.mgr.msg_code == JERR_OUT_OF_MEMORY)
      return es__fail(ES_EINVAL, "JPEG: the decoder needs more than %zu MiB (image in several "
                                 "scans too large)", IMG_JPEG_MAX_MEMORY >> 20);
    return es__fail(ES_EINVAL, "JPEG: %s", e.msg);
  }
  jpeg_create_decompress(&d);
  d.mem->max_memory_to_use = (long)IMG_JPEG_MAX_MEMORY;
  d.progress = &progress.mgr;
  jpeg_mem_src(&d, j->bytes, (unsigned long)j->len);
  jpeg_read_header(&d, TRUE);
  /* The probe read the same header; libjpeg's reading is the one that
   * counts, so the price must still hold. */
  size_t w = d.image_width, h = d.image_height;
  if (w != (size_t)j->info.width || h != (size_t)j->info.height) {
    jpeg_destroy_decompress(&d);
    return es__fail(ES_EINVAL, "JPEG: frame header says %zux%zu, not %dx%d", w, h,
                    j->info.width, j->info.height);
  }
  d.out_color_space = JCS_RGB;
  int k = j->denom > 1 ? j->denom : 1;
  d.scale_num = 1;
  d.scale_denom = (unsigned)k;
  w = div_up(w, (size_t)k); /* libjpeg rounds a scaled size up */
  h = div_up(h, (size_t)k);
  jpeg_start_decompress(&d);
  if (d.output_width != w || d.output_height != h || d.output_components != 3) {
    jpeg_destroy_decompress(&d);
    return es__fail(ES_EINVAL, "JPEG: decodes to %ux%u x %d, not %zux%zu RGB", d.output_width,
                    d.output_height, d.output_components, w, h);
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
  j->out.width = (int)w;
  j->out.height = (int)h;
  j->out.rgb = rgb;
  j->out.scale = k;
  return 0;
}

/* ---- PNG ------------------------------------------------------------------ */

/* libspng's allocations, through the counting layer and capped at the
 * working memory the probe priced. libspng's allocator has no user
 * pointer, and one decode runs on one thread: the cap is the thread's. */
typedef struct png_mem {
  size_t used, peak, cap;
  int capped; /* an allocation was refused for the cap */
  int oom;    /* an allocation failed for want of memory: whatever libspng
                 or zlib then says ("zlib init error", "IDAT stream error"),
                 the decode failed for the server, not for the image */
} png_mem;

static _Thread_local png_mem *png_mem_;

#define PNG_HDR 16 /* keeps es_mem_alloc's 16-byte alignment */

static void *png_take(void *old, size_t n) {
  png_mem *pm = png_mem_;
  size_t was = old ? *(size_t *)((char *)old - PNG_HDR) : 0;
  if (n > SIZE_MAX - PNG_HDR)
    return NULL;
  if (pm && pm->used - was + n > pm->cap) {
    pm->capped = 1; /* libspng answers SPNG_EMEM: reported as over the price */
    return NULL;
  }
  char *p = old ? es_mem_realloc((char *)old - PNG_HDR, n + PNG_HDR)
                : es_mem_alloc(ES_MEM_APPS, n + PNG_HDR);
  if (!p) {
    if (pm)
      pm->oom = 1;
    return NULL;
  }
  *(size_t *)p = n;
  if (pm) {
    pm->used = pm->used - was + n;
    pm->peak = pm->used > pm->peak ? pm->used : pm->peak;
  }
  return p + PNG_HDR;
}

static void *png_malloc(size_t n) { return png_take(NULL, n); }
static void *png_realloc(void *p, size_t n) { return png_take(p, n); }

static void *png_calloc(size_t count, size_t n) {
  if (n && count > SIZE_MAX / n)
    return NULL;
  void *p = png_take(NULL, count * n);
  if (p)
    memset(p, 0, count * n);
  return p;
}

static void png_free(void *p) {
  if (!p)
    return;
  char *h = (char *)p - PNG_HDR;
  if (png_mem_)
    png_mem_->used -= *(size_t *)h;
  es_mem_free(h);
}

/* The file as libspng reads it, minus its ancillary chunks (first letter
 * lower-case): none changes an RGB8 pixel without gamma, and skipping them
 * here means their contents are never inflated or stored. A chunk claiming
 * more bytes than the file has is passed on, for libspng to refuse. */
typedef struct png_src {
  const unsigned char *b;
  size_t len, pos;
  size_t left; /* bytes of the current chunk (header, data, CRC) still to go */
} png_src;

static int png_read(spng_ctx *ctx, void *user, void *dst, size_t n) {
  (void)ctx;
  png_src *s = user;
  unsigned char *d = dst;
  while (n) {
    if (s->pos >= 8 && !s->left) { /* at a chunk's start */
      if (s->len - s->pos >= 8) {
        size_t clen = be32(s->b + s->pos);
        if ((s->b[s->pos + 4] & 0x20) && clen <= s->len - s->pos - 8 &&
            s->len - s->pos - 8 - clen >= 4) {
          s->pos += 12 + clen;
          continue;
        }
        s->left = clen > SIZE_MAX - 12 ? SIZE_MAX : clen + 12;
      } else {
        s->left = s->len - s->pos;
      }
    }
    size_t k = s->pos < 8 ? 8 - s->pos : s->left;
    k = k < n ? k : n;
    k = k < s->len - s->pos ? k : s->len - s->pos;
    if (!k)
      return SPNG_IO_EOF;
    memcpy(d, s->b + s->pos, k);
    d += k;
    n -= k;
    if (s->pos >= 8)
      s->left -= k;
    s->pos += k;
  }
  return 0;
}

static int png_fail(spng_ctx *c, int rc, const img_job *j, const png_mem *pm) {
  spng_ctx_free(c);
  if (pm->oom)
    return es__fail(ES_ENOMEM, "PNG: no memory for the decoder's state (%s)", spng_strerror(rc));
  if (rc == SPNG_EMEM && !pm->capped)
    return es__fail(ES_ENOMEM, "PNG: no memory");
  if (rc == SPNG_EMEM)
    return es__fail(ES_EINVAL, "PNG: %dx%d: the decoder asked for more than its %zu B of "
                               "working memory", j->info.width, j->info.height, pm->cap);
  return es__fail(ES_EINVAL, "PNG: %s", spng_strerror(rc));
}

static int decode_png_ctx(img_job *j, png_mem *pm) {
  struct spng_alloc alloc = {png_malloc, png_realloc, png_calloc, png_free};
  spng_ctx *c = spng_ctx_new2(&alloc, 0);
  if (!c)
    return es__fail(ES_ENOMEM, "PNG: no memory for the decoder");
  /* Ancillary chunks never arrive (png_read); a bad CRC on image data is
   * a 400. */
  spng_set_crc_action(c, SPNG_CRC_ERROR, SPNG_CRC_USE);
  spng_set_image_limits(c, (uint32_t)j->info.width, (uint32_t)j->info.height);
  spng_set_chunk_limits(c, IMG_PNG_CHUNK_LIMIT, IMG_PNG_CACHE_LIMIT);
  spng_set_option(c, SPNG_CHUNK_COUNT_LIMIT, IMG_PNG_CHUNK_COUNT);
  png_src src = {.b = j->bytes, .len = j->len};
  int rc = spng_set_png_stream(c, png_read, &src);
  struct spng_ihdr ih;
  if (rc == 0)
    rc = spng_get_ihdr(c, &ih);
  if (rc)
    return png_fail(c, rc, j, pm);
  if ((int)ih.width != j->info.width || (int)ih.height != j->info.height) {
    spng_ctx_free(c);
    return es__fail(ES_EINVAL, "PNG: IHDR says %ux%u, not %dx%d", ih.width, ih.height,
                    j->info.width, j->info.height);
  }
  size_t n = 0;
  rc = spng_decoded_image_size(c, SPNG_FMT_RGB8, &n);
  if (rc)
    return png_fail(c, rc, j, pm);
  if (n != j->info.decoded_bytes) {
    spng_ctx_free(c);
    return es__fail(ES_EINVAL, "PNG: decodes to %zu B, not %zu", n, j->info.decoded_bytes);
  }
  rc = spng_decode_image(c, NULL, 0, SPNG_FMT_RGB8, SPNG_DECODE_PROGRESSIVE);
  if (rc)
    return png_fail(c, rc, j, pm);
  size_t stride = (size_t)ih.width * 3;
  uint8_t *rgb = es_mem_alloc(ES_MEM_APPS, n);
  if (!rgb) {
    spng_ctx_free(c);
    return es__fail(ES_ENOMEM, "PNG: no memory for %ux%u", ih.width, ih.height);
  }
  /* Row by row (interlaced: each pass's rows land in their image rows),
   * the deadline checked between rows. */
  struct spng_row_info ri;
  do {
    if (past(j)) {
      es_mem_free(rgb);
      spng_ctx_free(c);
      return timed_out(j, "PNG", "while");
    }
    rc = spng_get_row_info(c, &ri);
    if (rc == 0)
      rc = spng_decode_row(c, rgb + (size_t)ri.row_num * stride, stride);
  } while (rc == 0);
  if (rc != SPNG_EOI) {
    es_mem_free(rgb);
    return png_fail(c, rc, j, pm);
  }
  spng_ctx_free(c);
  j->out.width = (int)ih.width;
  j->out.height = (int)ih.height;
  j->out.rgb = rgb;
  return 0;
}

static int decode_png(img_job *j) {
  png_mem pm = {0, 0, j->info.work_bytes, 0, 0};
  png_mem *outer = png_mem_;
  png_mem_ = &pm;
  int rc = decode_png_ctx(j, &pm);
  png_mem_ = outer;
  return rc;
}

/* The decode of a probed image: the caller's thread or a worker. */
static int decode_job(img_job *j) {
  memset(&j->out, 0, sizeof j->out);
  if (past(j))
    return timed_out(j, j->info.format == ES_IMAGE_JPEG ? "JPEG" : "PNG", "before");
  return j->info.format == ES_IMAGE_JPEG ? decode_jpeg(j) : decode_png(j);
}

static int decode_task(void *user) { return decode_job(user); }

/* ---- the API ------------------------------------------------------------- */

int es_image_decode(const void *bytes, size_t len, es_image *out) {
  if (!out || (!bytes && len))
    return es__fail(ES_EINVAL, "es_image_decode: NULL argument");
  memset(out, 0, sizeof *out);
  img_job j = {.bytes = bytes, .len = len};
  int rc = es_image_probe(bytes, len, &j.info);
  if (rc == 0)
    rc = decode_job(&j);
  if (rc == 0)
    *out = j.out;
  return rc;
}

int es_image_decode_admitted(es_runtime *rt, int model_id, const void *bytes, size_t len,
                             int priority, uint64_t deadline_ns, es_image *out,
                             es_refusal *why) {
  return es_image_decode_scaled(rt, model_id, bytes, len, 0, priority, deadline_ns, out, why);
}

int es_image_decode_scaled(es_runtime *rt, int model_id, const void *bytes, size_t len,
                           int min_side, int priority, uint64_t deadline_ns, es_image *out,
                           es_refusal *why) {
  if (!rt || !out || (!bytes && len))
    return es__fail(ES_EINVAL, "es_image_decode_admitted: NULL argument");
  if (min_side < 0)
    return es__fail(ES_EINVAL, "es_image_decode_scaled: min_side %d < 0", min_side);
  memset(out, 0, sizeof *out);
  es_refusal local;
  if (!why)
    why = &local;
  memset(why, 0, sizeof *why);
  img_job j = {.bytes = bytes, .len = len};
  int rc = es_image_probe(bytes, len, &j.info);
  if (rc < 0)
    return rc;
  j.deadline_ns = deadline_ns ? deadline_ns : es__now_ns() + IMG_DEFAULT_BOUND_NS;
  /* The smallest scale libjpeg offers whose longer side is still min_side:
   * the pixels to keep shrink by its square (the decoder's own working
   * memory does not: a JPEG in several scans keeps every coefficient). */
  j.denom = 1;
  int side = j.info.width > j.info.height ? j.info.width : j.info.height;
  while (j.info.format == ES_IMAGE_JPEG && min_side > 0 && j.denom < 8 &&
         (int)div_up((size_t)side, (size_t)j.denom * 2) >= min_side)
    j.denom *= 2;
  size_t decoded = div_up((size_t)j.info.width, (size_t)j.denom) *
                   div_up((size_t)j.info.height, (size_t)j.denom) * 3;
  size_t price = decoded + j.info.work_bytes;
  es_task t = {.model = model_id, .bytes = price, .priority = priority,
               .deadline_ns = deadline_ns, .fn = decode_task, .user = &j};
  es_request *r = NULL;
  rc = es_runtime_submit_task(rt, &t, &r, why);
  if (rc < 0) {
    char d[400];
    snprintf(d, sizeof d, "%s", es_last_error_detail());
    return es__fail(rc, "%dx%d image (%zu B decoded, %zu B for the decoder): %s",
                    j.info.width, j.info.height, j.info.decoded_bytes, j.info.work_bytes, d);
  }
  rc = es_request_wait(r, -1);
  if (rc == 0) {
    *out = j.out;
    out->hold = r; /* the reservation lives as long as the image */
    return 0;
  }
  char d[512];
  snprintf(d, sizeof d, "%s", es_last_error_detail());
  es_request_info info;
  if ((rc == ES_EAGAIN || rc == ES_ETIMEDOUT) && es_request_info_get(r, &info) == 0)
    *why = info.refusal;
  es_request_free(r);
  return es__fail(rc, "%s", d);
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
  /* After the pixels: the reservation never covers less than is held. */
  es_request_free(img->hold);
  memset(img, 0, sizeof *img);
}
