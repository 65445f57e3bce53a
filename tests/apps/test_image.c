/* Image decoding under hostile input, and inside the memory budget.
 *
 * JPEG: a header's dimensions are refused before libjpeg allocates for
 * them, libjpeg's own memory is capped (a progressive image whose
 * coefficients would need more is refused from the header), and so is a
 * JPEG's number of scans. The images are made here with libjpeg's encoder,
 * then patched.
 *
 * PNG: made here chunk by chunk (zlib for the streams and the CRCs, fed a
 * row at a time, so a bomb is built without its payload in memory) or with
 * libspng's encoder: a 65535x65535 IHDR is refused with nothing allocated;
 * a 62 KB file of 8000x8000 zeros is priced at 192 MB from its header;
 * zTXt, iTXt, iCCP and unknown ancillary chunks worth 150 MiB inflated cost
 * nothing (skipped); interlaced and 16-bit images decode row by row to the
 * same pixels.
 *
 * Admitted decoding (es_image_decode_admitted): refused beyond the budget
 * (ES_ENOSPC) and over what is left (ES_EAGAIN, retry-after) before a byte
 * is allocated, the reservation held until es_image_free, a deadline that
 * passes mid-decode is ES_ETIMEDOUT (PNG between rows, JPEG from libjpeg's
 * progress monitor; 64 megapixels take far longer than the 50 and 100 ms
 * they are given), and eight threads decoding the bomb at
 * once under a 256 MiB budget stay under it (peak RSS of a child process;
 * not checked under ASan, whose quarantine keeps freed memory resident).
 * The admitted tests need a model to charge (BlazeFace front, fetched);
 * they skip without it. */
#include "es_test.h"

#include <pthread.h>
#include <stdio.h> /* before jpeglib.h */
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jpeglib.h>
#include <spng.h>
#include <zlib.h>

#include "edgeserve/apps.h"

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

/* A progressive 64x48 RGB JPEG of a gradient (malloc'ed by libjpeg's
 * destination manager; free() it). */
static unsigned char *make_jpeg(unsigned long *len) {
  struct jpeg_compress_struct c;
  struct jpeg_error_mgr e;
  c.err = jpeg_std_error(&e);
  jpeg_create_compress(&c);
  unsigned char *buf = NULL;
  jpeg_mem_dest(&c, &buf, len);
  c.image_width = 64;
  c.image_height = 48;
  c.input_components = 3;
  c.in_color_space = JCS_RGB;
  jpeg_set_defaults(&c);
  jpeg_simple_progression(&c);
  jpeg_start_compress(&c, TRUE);
  unsigned char row[64 * 3];
  while (c.next_scanline < c.image_height) {
    for (int x = 0; x < 64; x++) {
      row[3 * x] = (unsigned char)(4 * x);
      row[3 * x + 1] = (unsigned char)(5 * c.next_scanline);
      row[3 * x + 2] = 128;
    }
    JSAMPROW r = row;
    jpeg_write_scanlines(&c, &r, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  return buf;
}

/* Offset of the first marker m (0xFF m) after the signature, or -1. */
static long find_marker(const unsigned char *b, unsigned long len, unsigned char m) {
  for (unsigned long i = 2; i + 1 < len; i++)
    if (b[i] == 0xFF && b[i + 1] == m)
      return (long)i;
  return -1;
}

/* Writes height and width into the SOF2 (progressive) frame header. */
static void set_dims(unsigned char *b, unsigned long len, unsigned w, unsigned h) {
  long sof = find_marker(b, len, 0xC2);
  assert_true(sof > 0);
  b[sof + 5] = (unsigned char)(h >> 8), b[sof + 6] = (unsigned char)h;
  b[sof + 7] = (unsigned char)(w >> 8), b[sof + 8] = (unsigned char)w;
}

static long peak_rss_kib(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

static void test_valid_progressive(void **state) {
  (void)state;
  unsigned long len;
  unsigned char *j = make_jpeg(&len);
  es_image img;
  ES_CHECK_RC(es_image_decode(j, len, &img));
  assert_int_equal(img.width, 64);
  assert_int_equal(img.height, 48);
  /* the blue channel was 128 everywhere */
  assert_true(img.rgb[2] > 118 && img.rgb[2] < 138);
  es_image_free(&img);
  free(j);
}

static void test_huge_header_refused_before_allocating(void **state) {
  (void)state;
  unsigned long len;
  unsigned char *j = make_jpeg(&len);
  set_dims(j, len, 16384, 16384);
  long before = peak_rss_kib();
  es_image img;
  ES_EXPECT_RC(es_image_decode(j, len, &img), ES_EINVAL);
  assert_non_null(strstr(es_last_error_detail(), "16384x16384"));
  long grew = peak_rss_kib() - before;
  printf("# 16384x16384 header (%lu bytes): refused, peak RSS +%ld KiB\n", len, grew);
  assert_true(grew < 32 * 1024);
  free(j);
}

static void test_progressive_memory_capped(void **state) {
  (void)state;
  unsigned long len;
  unsigned char *j = make_jpeg(&len);
  set_dims(j, len, 8000, 8000); /* under the pixel cap; its coefficients are 192 MB */
  long before = peak_rss_kib();
  es_image img;
  ES_EXPECT_RC(es_image_decode(j, len, &img), ES_EINVAL);
  assert_non_null(strstr(es_last_error_detail(), "MiB"));
  long grew = peak_rss_kib() - before;
  printf("# 8000x8000 progressive header: refused (%s), peak RSS +%ld KiB\n",
         es_last_error_detail(), grew);
  assert_true(grew < 96 * 1024);
  free(j);
}

static void test_scan_count_capped(void **state) {
  (void)state;
  unsigned long len;
  unsigned char *j = make_jpeg(&len);
  /* The last scan (SOS to EOI) repeated: 300 scans in all. */
  long last = -1;
  for (long i = 2; i + 1 < (long)len; i++)
    if (j[i] == 0xFF && j[i + 1] == 0xDA)
      last = i;
  assert_true(last > 0 && len >= 2);
  size_t scan = len - 2 - (size_t)last, reps = 300;
  size_t n = (size_t)last + reps * scan + 2;
  unsigned char *b = malloc(n);
  assert_non_null(b);
  memcpy(b, j, (size_t)last);
  for (size_t r = 0; r < reps; r++)
    memcpy(b + last + r * scan, j + last, scan);
  b[n - 2] = 0xFF, b[n - 1] = 0xD9;
  es_image img;
  ES_EXPECT_RC(es_image_decode(b, n, &img), ES_EINVAL);
  assert_non_null(strstr(es_last_error_detail(), "scans"));
  printf("# %zu-byte JPEG of 300+ scans: %s\n", n, es_last_error_detail());
  free(b);
  free(j);
}

/* ---- PNG, chunk by chunk --------------------------------------------------- */

typedef struct buf {
  unsigned char *p;
  size_t n, cap;
} buf;

static void put(buf *b, const void *d, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2;
    b->p = realloc(b->p, b->cap);
    assert_non_null(b->p);
  }
  memcpy(b->p + b->n, d, n);
  b->n += n;
}

static void put32(buf *b, uint32_t v) {
  unsigned char x[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16),
                        (unsigned char)(v >> 8), (unsigned char)v};
  put(b, x, 4);
}

/* length, type, data, CRC over type and data */
static void chunk(buf *b, const char *type, const void *data, size_t n) {
  put32(b, (uint32_t)n);
  put(b, type, 4);
  if (n)
    put(b, data, n);
  uLong crc = crc32(0, (const Bytef *)type, 4);
  if (n)
    crc = crc32(crc, data, (uInt)n);
  put32(b, (uint32_t)crc);
}

/* A zlib stream of `reps` copies of `unit` (n bytes) appended to out, fed
 * one copy at a time: the payload never exists in memory. */
static void deflate_repeat(buf *out, const void *unit, size_t n, size_t reps) {
  z_stream z;
  memset(&z, 0, sizeof z);
  assert_int_equal(deflateInit(&z, 9), Z_OK);
  unsigned char o[1 << 16];
  for (size_t r = 0; r <= reps; r++) {
    z.next_in = (Bytef *)unit;
    z.avail_in = r < reps ? (uInt)n : 0;
    int flush = r < reps ? Z_NO_FLUSH : Z_FINISH, rc;
    do {
      z.next_out = o;
      z.avail_out = sizeof o;
      rc = deflate(&z, flush);
      put(out, o, sizeof o - z.avail_out);
    } while (z.avail_out == 0 || (flush == Z_FINISH && rc != Z_STREAM_END));
  }
  deflateEnd(&z);
}

static void png_head(buf *b, uint32_t w, uint32_t h, int depth, int colour) {
  static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  put(b, sig, 8);
  unsigned char ih[13] = {0};
  for (int i = 0; i < 4; i++) {
    ih[i] = (unsigned char)(w >> (24 - 8 * i));
    ih[4 + i] = (unsigned char)(h >> (24 - 8 * i));
  }
  ih[8] = (unsigned char)depth;
  ih[9] = (unsigned char)colour;
  chunk(b, "IHDR", ih, 13);
}

/* Image data of one repeated scanline (filter byte, then the row). */
static void png_rows(buf *b, const unsigned char *row, size_t rowbytes, uint32_t h) {
  unsigned char *line = calloc(1, rowbytes + 1);
  assert_non_null(line);
  memcpy(line + 1, row, rowbytes);
  buf z = {0};
  deflate_repeat(&z, line, rowbytes + 1, h);
  chunk(b, "IDAT", z.p, z.n);
  chunk(b, "IEND", NULL, 0);
  free(z.p);
  free(line);
}

/* 8-bit grey, every pixel 0: w*h*3 bytes decoded from a few KB. */
static buf png_zeros(uint32_t w, uint32_t h) {
  buf b = {0};
  png_head(&b, w, h, 8, 0);
  unsigned char *row = calloc(1, w);
  assert_non_null(row);
  png_rows(&b, row, w, h);
  free(row);
  return b;
}

/* Bytes held now by the apps' counted allocations, and how many there were. */
static void apps_mem(size_t *current, uint64_t *allocs) {
  es_mem_stats st;
  ES_CHECK_RC(es_mem_stats_get(ES_MEM_APPS, &st));
  *current = st.current;
  *allocs = st.allocs;
}

static void test_png_huge_header_refused(void **state) {
  (void)state;
  buf b = {0};
  png_head(&b, 65535, 65535, 8, 2);
  chunk(&b, "IEND", NULL, 0);
  size_t cur0, cur1;
  uint64_t n0, n1;
  apps_mem(&cur0, &n0);
  es_image_info info;
  ES_EXPECT_RC(es_image_probe(b.p, b.n, &info), ES_EINVAL);
  assert_non_null(strstr(es_last_error_detail(), "65535x65535"));
  es_image img;
  ES_EXPECT_RC(es_image_decode(b.p, b.n, &img), ES_EINVAL);
  apps_mem(&cur1, &n1);
  printf("# %zu-byte PNG of 65535x65535: %s; %llu allocations on the way\n", b.n,
         es_last_error_detail(), (unsigned long long)(n1 - n0));
  assert_int_equal(n1, n0); /* not even the decoder's context */
  assert_int_equal(cur1, cur0);
  /* Truncated and malformed headers. */
  ES_EXPECT_RC(es_image_probe(b.p, 20, &info), ES_EINVAL);
  b.p[16 + 9] = 5; /* colour type 5 does not exist */
  ES_EXPECT_RC(es_image_probe(b.p, b.n, &info), ES_EINVAL);
  free(b.p);
}

static void test_probe_prices(void **state) {
  (void)state;
  buf b = png_zeros(8000, 8000);
  es_image_info info;
  ES_CHECK_RC(es_image_probe(b.p, b.n, &info));
  printf("# %zu-byte PNG of 8000x8000: %zu B decoded, %zu B for the decoder\n", b.n,
         info.decoded_bytes, info.work_bytes);
  assert_int_equal(info.format, ES_IMAGE_PNG);
  assert_int_equal(info.decoded_bytes, (size_t)8000 * 8000 * 3);
  assert_true(b.n < 100 * 1024);
  assert_true(info.work_bytes < ((size_t)1 << 20));
  free(b.p);

  /* A progressive JPEG keeps its coefficients: 2 bytes a sample (4:2:0:
   * 1.5 samples a pixel) over whole blocks. */
  unsigned long len;
  unsigned char *j = make_jpeg(&len);
  set_dims(j, len, 2048, 2048);
  ES_CHECK_RC(es_image_probe(j, len, &info));
  printf("# progressive JPEG of 2048x2048: %zu B decoded, %zu B for the decoder\n",
         info.decoded_bytes, info.work_bytes);
  assert_int_equal(info.format, ES_IMAGE_JPEG);
  assert_true(info.progressive);
  assert_true(info.work_bytes >= (size_t)2048 * 2048 * 3 / 2 * 2);
  assert_true(info.work_bytes < (size_t)2048 * 2048 * 3 * 2);
  free(j);
  ES_EXPECT_RC(es_image_probe("GIF89a", 6, &info), ES_EINVAL);
}

/* Everything but the pixels: zTXt and iTXt, iCCP, an unknown chunk; each
 * inflates (or weighs) megabytes. Decoded in a child process, whose peak
 * RSS says what the decode took. */
static buf png_with_bombs(void) {
  buf b = {0};
  png_head(&b, 64, 48, 8, 2);
  unsigned char unit[4096];
  memset(unit, 'a', sizeof unit);
  buf z = {0};
  put(&z, "Comment\0\0", 9); /* keyword, compression method 0 */
  deflate_repeat(&z, unit, sizeof unit, 16384); /* 64 MiB of text */
  chunk(&b, "zTXt", z.p, z.n);
  z.n = 0;
  put(&z, "XML:com.adobe.xmp\0\1\0\0\0", 22); /* iTXt, compressed */
  deflate_repeat(&z, unit, sizeof unit, 16384);
  chunk(&b, "iTXt", z.p, z.n);
  z.n = 0;
  memset(unit, 0, sizeof unit);
  put(&z, "icc\0\0", 5);
  deflate_repeat(&z, unit, sizeof unit, 4096); /* a 16 MiB profile */
  chunk(&b, "iCCP", z.p, z.n);
  unsigned char *raw = calloc(1, (size_t)4 << 20);
  assert_non_null(raw);
  chunk(&b, "prVt", raw, (size_t)4 << 20); /* 4 MiB, stored as is */
  free(raw);
  free(z.p);
  unsigned char row[64 * 3];
  for (int x = 0; x < 64 * 3; x++)
    row[x] = (unsigned char)x;
  png_rows(&b, row, sizeof row, 48);
  return b;
}

typedef struct child_result {
  int rc;
  long rss_kib; /* peak RSS growth */
  int pixels_ok;
} child_result;

static child_result decode_in_child(const buf *b) {
  int fd[2];
  assert_int_equal(pipe(fd), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(fd[0]);
    child_result r = {0, 0, 0};
    long before = peak_rss_kib();
    es_image img;
    r.rc = es_image_decode(b->p, b->n, &img);
    r.rss_kib = peak_rss_kib() - before;
    r.pixels_ok = r.rc == 0 && img.width == 64 && img.height == 48;
    for (int i = 0; r.pixels_ok && i < 64 * 48 * 3; i++)
      r.pixels_ok = img.rgb[i] == (unsigned char)(i % (64 * 3));
    es_image_free(&img);
    ssize_t w = write(fd[1], &r, sizeof r);
    _exit(w == (ssize_t)sizeof r ? 0 : 1);
  }
  close(fd[1]);
  child_result r;
  assert_int_equal(read(fd[0], &r, sizeof r), (ssize_t)sizeof r);
  close(fd[0]);
  int st;
  waitpid(pid, &st, 0);
  return r;
}

static void test_png_ancillary_bombs(void **state) {
  (void)state;
  buf b = png_with_bombs();
  child_result r = decode_in_child(&b);
  printf("# %zu-byte PNG with 64 MiB zTXt and iTXt, a 16 MiB iCCP, a 4 MiB unknown chunk: "
         "%s, peak RSS +%ld KiB\n", b.n, es_err_name(r.rc), r.rss_kib);
  assert_int_equal(r.rc, 0);
  assert_true(r.pixels_ok);
  assert_true(r.rss_kib < 2048);
  free(b.p);
}

/* ---- PNG through libspng's encoder: what row-by-row decoding must keep -------- */

static void *spng_encode(const void *px, size_t n, uint32_t w, uint32_t h, int depth, int colour,
                         int interlace, size_t *len) {
  spng_ctx *c = spng_ctx_new(SPNG_CTX_ENCODER);
  assert_non_null(c);
  spng_set_option(c, SPNG_ENCODE_TO_BUFFER, 1);
  struct spng_ihdr ih = {.width = w, .height = h, .bit_depth = (uint8_t)depth,
                         .color_type = (uint8_t)colour, .interlace_method = (uint8_t)interlace};
  assert_int_equal(spng_set_ihdr(c, &ih), 0);
  assert_int_equal(spng_encode_image(c, px, n, SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE), 0);
  int err = 0;
  void *out = spng_get_png_buffer(c, len, &err);
  assert_int_equal(err, 0);
  spng_ctx_free(c);
  return out;
}

static void test_png_rows_interlaced_16bit(void **state) {
  (void)state;
  const uint32_t w = 37, h = 23;
  unsigned char rgb[37 * 23 * 3];
  uint16_t rgb16[37 * 23 * 3];
  for (size_t i = 0; i < sizeof rgb; i++) {
    rgb[i] = (unsigned char)(i * 2654435761u >> 24);
    rgb16[i] = (uint16_t)(rgb[i] << 8 | 0x5A); /* SPNG_FMT_PNG: host order */
  }
  for (int interlace = 0; interlace <= 1; interlace++)
    for (int depth = 8; depth <= 16; depth += 8) {
      size_t len;
      void *png = depth == 8 ? spng_encode(rgb, sizeof rgb, w, h, 8, 2, interlace, &len)
                             : spng_encode(rgb16, sizeof rgb16, w, h, 16, 2, interlace, &len);
      es_image img;
      ES_CHECK_RC(es_image_decode(png, len, &img));
      assert_int_equal(img.width, (int)w);
      assert_int_equal(img.height, (int)h);
      assert_memory_equal(img.rgb, rgb, sizeof rgb); /* 16 bits: the high byte */
      es_image_free(&img);
      /* The same file cut short is refused, not padded. */
      ES_EXPECT_RC(es_image_decode(png, len - 20, &img), ES_EINVAL);
      free(png);
    }
}

/* ---- admitted decoding ------------------------------------------------------------- */

static char model_[1024];

static es_runtime *runtime_with_budget(size_t budget, int *model) {
  es_test_model_path(model_, sizeof model_, "blazeface_front_128.onnx");
  if (access(model_, R_OK) != 0)
    return NULL;
  es_runtime_config rc;
  es_runtime_config_default(&rc);
  rc.workers = 2;
  rc.pin = 0;
  rc.watch_ms = 0;
  rc.memory_budget_bytes = budget;
  es_runtime *rt;
  ES_CHECK_RC(es_runtime_create(&rc, &rt));
  es_model_config mc;
  es_model_config_default(&mc);
  mc.name = "face";
  mc.path = model_;
  ES_CHECK_RC(es_runtime_model_load(rt, &mc, model));
  return rt;
}

#define NEED_RUNTIME(rt)                                                       \
  do {                                                                         \
    if (!(rt)) {                                                               \
      printf("# model not fetched (%s): skipped\n", model_);                   \
      skip();                                                                  \
    }                                                                          \
  } while (0)

static size_t reserved(es_runtime *rt) {
  es_admission_stats as;
  ES_CHECK_RC(es_admission_stats_get(es_runtime_admission(rt), &as));
  return as.reserved_bytes;
}

static void test_admitted_budget(void **state) {
  (void)state;
  const size_t MiB = (size_t)1 << 20;
  int face;
  es_runtime *rt = runtime_with_budget(64 * MiB, &face);
  NEED_RUNTIME(rt);

  /* Beyond the whole budget: refused from the header, nothing allocated. */
  buf bomb = png_zeros(8000, 8000);
  size_t cur0, cur1;
  uint64_t n0, n1;
  apps_mem(&cur0, &n0);
  es_image img;
  es_refusal why;
  ES_EXPECT_RC(es_image_decode_admitted(rt, face, bomb.p, bomb.n, 0, 0, &img, &why), ES_ENOSPC);
  apps_mem(&cur1, &n1);
  printf("# 8000x8000 bomb, 64 MiB budget: %s\n", es_last_error_detail());
  assert_int_equal(why.reason, ES_REFUSE_OVER_MEMORY);
  assert_int_equal(n1, n0);
  assert_null(img.rgb);

  /* 2000x2000: 12 MB each; five fit, the sixth waits for one of them. */
  buf b = png_zeros(2000, 2000);
  es_image held[6];
  int k = 0;
  while (k < 6) {
    int rc = es_image_decode_admitted(rt, face, b.p, b.n, 0, 0, &held[k], &why);
    if (rc < 0) {
      printf("# image %d of 12 MB: %s: %s (retry after %u ms)\n", k + 1, es_err_name(rc),
             es_last_error_detail(), why.retry_after_ms);
      assert_int_equal(rc, ES_EAGAIN);
      assert_int_equal(why.reason, ES_REFUSE_OVER_MEMORY);
      assert_true(why.retry_after_ms >= 1);
      assert_null(held[k].rgb);
      break;
    }
    assert_int_equal(held[k].width, 2000);
    assert_int_equal(held[k].rgb[(size_t)1999 * 2000 * 3 + 5], 0);
    k++;
  }
  assert_int_equal(k, 5);
  es_image_info info;
  ES_CHECK_RC(es_image_probe(b.p, b.n, &info));
  assert_int_equal(reserved(rt), 5 * (info.decoded_bytes + info.work_bytes));
  es_image_free(&held[0]);
  ES_CHECK_RC(es_image_decode_admitted(rt, face, b.p, b.n, 0, 0, &held[0], &why));
  for (int i = 0; i < 5; i++)
    es_image_free(&held[i]);
  assert_int_equal(reserved(rt), 0);

  /* A bad image: ES_EINVAL, nothing reserved; an unknown model. */
  b.p[8 + 25 + 8 + 10] ^= 0xFF; /* early in the image data: its CRC fails */
  ES_EXPECT_RC(es_image_decode_admitted(rt, face, b.p, b.n, 0, 0, &img, &why), ES_EINVAL);
  assert_int_equal(reserved(rt), 0);
  ES_EXPECT_RC(es_image_decode_admitted(rt, 7, b.p, b.n, 0, 0, &img, &why), ES_ENOENT);
  ES_EXPECT_RC(es_image_decode_admitted(rt, face, "no", 2, 0, 0, &img, &why), ES_EINVAL);

  /* A JPEG, admitted the same way. */
  unsigned long len;
  unsigned char *j = make_jpeg(&len);
  ES_CHECK_RC(es_image_decode_admitted(rt, face, j, len, 0, 0, &img, NULL));
  assert_int_equal(img.width, 64);
  assert_true(reserved(rt) > 64 * 48 * 3);
  es_image_free(&img);
  es_image_free(&img); /* a freed image is a zeroed one */
  assert_int_equal(reserved(rt), 0);
  free(j);
  free(b.p);
  free(bomb.p);
  apps_mem(&cur1, &n1);
  assert_int_equal(cur1, cur0);
  ES_CHECK_RC(es_runtime_destroy(rt));
}

/* A baseline RGB JPEG of a gradient, w x h, made row by row (malloc'ed). */
static unsigned char *big_jpeg(int w, int h, unsigned long *len) {
  struct jpeg_compress_struct c;
  struct jpeg_error_mgr e;
  c.err = jpeg_std_error(&e);
  jpeg_create_compress(&c);
  unsigned char *out = NULL;
  jpeg_mem_dest(&c, &out, len);
  c.image_width = (JDIMENSION)w;
  c.image_height = (JDIMENSION)h;
  c.input_components = 3;
  c.in_color_space = JCS_RGB;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, 50, TRUE);
  jpeg_start_compress(&c, TRUE);
  unsigned char *row = malloc((size_t)w * 3);
  assert_non_null(row);
  while (c.next_scanline < c.image_height) {
    for (int x = 0; x < w; x++) {
      row[3 * x] = (unsigned char)(x >> 4);
      row[3 * x + 1] = (unsigned char)(c.next_scanline >> 4);
      row[3 * x + 2] = 90;
    }
    JSAMPROW r = row;
    jpeg_write_scanlines(&c, &r, 1);
  }
  free(row);
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  return out;
}

/* A JPEG decoded for a consumer that needs min_side pixels: at the
 * smallest of 1/2, 1/4, 1/8 whose longer side still has them, each pixel
 * the average of the k x k it covers (within a JPEG's rounding of the full
 * decode's), reserved at the smaller size; whole for min_side 0 or a PNG. */
static void test_admitted_scaled(void **state) {
  (void)state;
  int face;
  es_runtime *rt = runtime_with_budget((size_t)64 << 20, &face);
  NEED_RUNTIME(rt);
  unsigned long len;
  unsigned char *jp = big_jpeg(640, 400, &len);
  es_image full, img;
  es_refusal why;
  ES_CHECK_RC(es_image_decode_admitted(rt, face, jp, len, 0, 0, &full, &why));
  assert_true(full.scale <= 1);
  es_image_info info;
  ES_CHECK_RC(es_image_probe(jp, len, &info));
  const struct { int min_side, k, w, h; } cases[] = {
      {0, 1, 640, 400}, {640, 1, 640, 400}, {320, 2, 320, 200}, {161, 2, 320, 200},
      {160, 4, 160, 100}, {128, 4, 160, 100}, {80, 8, 80, 50}, {1, 8, 80, 50}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    ES_CHECK_RC(es_image_decode_scaled(rt, face, jp, len, cases[c].min_side, 0, 0, &img, &why));
    int k = img.scale > 1 ? img.scale : 1;
    assert_int_equal(k, cases[c].k);
    assert_int_equal(img.width, cases[c].w);
    assert_int_equal(img.height, cases[c].h);
    assert_int_equal(reserved(rt), (size_t)img.width * img.height * 3 + info.work_bytes +
                                       info.decoded_bytes + info.work_bytes);
    double diff = 0;
    for (int y = 0; y < img.height; y++)
      for (int x = 0; x < img.width; x++)
        for (int ch = 0; ch < 3; ch++) {
          double avg = 0;
          for (int dy = 0; dy < k; dy++)
            for (int dx = 0; dx < k; dx++)
              avg += full.rgb[((size_t)(y * k + dy) * 640 + (size_t)(x * k + dx)) * 3 + ch];
          avg /= k * k;
          double d = img.rgb[((size_t)y * img.width + x) * 3 + ch] - avg;
          diff += d < 0 ? -d : d;
        }
    diff /= (double)img.width * img.height * 3;
    printf("# 640x400 JPEG, min_side %d: 1/%d, %dx%d, mean |pixel - %dx%d average| %.2f\n",
           cases[c].min_side, k, img.width, img.height, k, k, diff);
    assert_true(diff < 2.0);
    es_image_free(&img);
  }
  ES_EXPECT_RC(es_image_decode_scaled(rt, face, jp, len, -1, 0, 0, &img, &why), ES_EINVAL);
  es_image_free(&full);
  free(jp);
  buf b = png_zeros(300, 200); /* a PNG is decoded whole */
  ES_CHECK_RC(es_image_decode_scaled(rt, face, b.p, b.n, 50, 0, 0, &img, &why));
  assert_int_equal(img.width, 300);
  assert_true(img.scale <= 1);
  es_image_free(&img);
  free(b.p);
  assert_int_equal(reserved(rt), 0);
  ES_CHECK_RC(es_runtime_destroy(rt));
}

static void test_admitted_deadline(void **state) {
  (void)state;
  int face;
  es_runtime *rt = runtime_with_budget((size_t)512 << 20, &face);
  NEED_RUNTIME(rt);
  buf bomb = png_zeros(8000, 8000);
  es_image img;
  es_refusal why;
  /* Passed already: refused at the door. */
  ES_EXPECT_RC(es_image_decode_admitted(rt, face, bomb.p, bomb.n, 0, 1, &img, &why), ES_EAGAIN);
  assert_int_equal(why.reason, ES_REFUSE_DEADLINE);
  /* Passing mid-decode (64 megapixels take far longer than 50 ms): the
   * decoder stops between rows and gives everything back. */
  size_t cur0, cur1;
  uint64_t n0, n1;
  apps_mem(&cur0, &n0);
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  uint64_t deadline = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + 50000000ull;
  int rc = es_image_decode_admitted(rt, face, bomb.p, bomb.n, 0, deadline, &img, &why);
  printf("# 8000x8000 with 50 ms to go: %s: %s (retry after %u ms)\n", es_err_name(rc),
         es_last_error_detail(), why.retry_after_ms);
  assert_int_equal(rc, ES_ETIMEDOUT);
  assert_non_null(strstr(es_last_error_detail(), "while decoding"));
  assert_int_equal(why.reason, ES_REFUSE_DEADLINE);
  assert_true(why.retry_after_ms >= 1);
  assert_null(img.rgb);
  apps_mem(&cur1, &n1);
  assert_int_equal(cur1, cur0);
  assert_int_equal(reserved(rt), 0);

  /* A JPEG: libjpeg's progress monitor checks the deadline. */
  unsigned long jlen;
  unsigned char *j = big_jpeg(8000, 8000, &jlen);
  clock_gettime(CLOCK_MONOTONIC, &ts);
  deadline = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + 100000000ull;
  rc = es_image_decode_admitted(rt, face, j, jlen, 0, deadline, &img, &why);
  printf("# %lu-byte 8000x8000 JPEG with 100 ms to go: %s: %s\n", jlen, es_err_name(rc),
         es_last_error_detail());
  assert_int_equal(rc, ES_ETIMEDOUT);
  assert_non_null(strstr(es_last_error_detail(), "while decoding"));
  assert_int_equal(why.reason, ES_REFUSE_DEADLINE);
  assert_null(img.rgb);
  assert_int_equal(reserved(rt), 0);
  ES_CHECK_RC(es_image_decode_admitted(rt, face, j, jlen, 0, 0, &img, &why)); /* in time */
  assert_int_equal(img.width, 8000);
  es_image_free(&img);
  free(j);
  apps_mem(&cur1, &n1);
  assert_int_equal(cur1, cur0);
  free(bomb.p);
  ES_CHECK_RC(es_runtime_destroy(rt));
}

/* Eight threads decode the 62 KB bomb (192 MB each) at once through a 256
 * MiB budget, in a child process whose peak RSS is the measure. */
typedef struct bomb_arg {
  es_runtime *rt;
  int model;
  const buf *b;
  int admitted;
  int rc;
} bomb_arg;

static void *bomb_thread(void *p) {
  bomb_arg *a = p;
  es_image img;
  es_refusal why;
  a->rc = a->admitted ? es_image_decode_admitted(a->rt, a->model, a->b->p, a->b->n, 0, 0, &img,
                                                 &why)
                      : es_image_decode(a->b->p, a->b->n, &img);
  es_image_free(&img);
  return NULL;
}

typedef struct bombs_result {
  int ok, refused, other;
  long rss_kib;
} bombs_result;

static bombs_result bombs_in_child(const buf *b, int threads, int admitted, size_t budget) {
  int fd[2];
  assert_int_equal(pipe(fd), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(fd[0]);
    bombs_result r = {0, 0, 0, 0};
    int face = -1;
    es_runtime *rt = runtime_with_budget(budget, &face);
    long before = peak_rss_kib();
    pthread_t t[16];
    bomb_arg a[16];
    for (int i = 0; i < threads; i++) {
      a[i] = (bomb_arg){rt, face, b, admitted, 0};
      pthread_create(&t[i], NULL, bomb_thread, &a[i]);
    }
    for (int i = 0; i < threads; i++) {
      pthread_join(t[i], NULL);
      if (a[i].rc == 0)
        r.ok++;
      else if (a[i].rc == ES_EAGAIN)
        r.refused++;
      else
        r.other++;
    }
    r.rss_kib = peak_rss_kib() - before;
    es_runtime_destroy(rt);
    ssize_t w = write(fd[1], &r, sizeof r);
    _exit(w == (ssize_t)sizeof r ? 0 : 1);
  }
  close(fd[1]);
  bombs_result r;
  assert_int_equal(read(fd[0], &r, sizeof r), (ssize_t)sizeof r);
  close(fd[0]);
  int st;
  waitpid(pid, &st, 0);
  return r;
}

static void test_admitted_bombs_stay_in_budget(void **state) {
  (void)state;
  int face;
  es_runtime *rt = runtime_with_budget(0, &face);
  NEED_RUNTIME(rt);
  ES_CHECK_RC(es_runtime_destroy(rt));
  buf bomb = png_zeros(8000, 8000);
  const size_t budget = (size_t)256 << 20;
  bombs_result r = bombs_in_child(&bomb, 8, 1, budget);
  printf("# 8 threads x %zu-byte 8000x8000 PNG, admitted, 256 MiB budget: %d decoded, %d "
         "refused, %d other; peak RSS +%ld KiB\n", bomb.n, r.ok, r.refused, r.other, r.rss_kib);
  assert_int_equal(r.other, 0);
  assert_true(r.ok >= 1);
  assert_int_equal(r.ok + r.refused, 8);
  if (!UNDER_ASAN)
    assert_true((size_t)r.rss_kib * 1024 < budget);
  free(bomb.p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_valid_progressive),
      cmocka_unit_test(test_huge_header_refused_before_allocating),
      cmocka_unit_test(test_progressive_memory_capped),
      cmocka_unit_test(test_scan_count_capped),
      cmocka_unit_test(test_png_huge_header_refused),
      cmocka_unit_test(test_probe_prices),
      cmocka_unit_test(test_png_ancillary_bombs),
      cmocka_unit_test(test_png_rows_interlaced_16bit),
      cmocka_unit_test(test_admitted_budget),
      cmocka_unit_test(test_admitted_scaled),
      cmocka_unit_test(test_admitted_deadline),
      cmocka_unit_test(test_admitted_bombs_stay_in_budget),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
