/* Image decoding under hostile input: a JPEG header's dimensions are
 * refused before libjpeg allocates for them, libjpeg's own memory is capped
 * (a progressive image whose coefficients would need more is refused), and
 * so is a JPEG's number of scans. The images are made here with libjpeg's
 * encoder, then patched. Peak RSS (getrusage) shows that nothing large was
 * allocated on the way to each refusal. */
#include "es_test.h"

#include <stdio.h> /* before jpeglib.h */
#include <string.h>
#include <sys/resource.h>

#include <jpeglib.h>

#include "edgeserve/apps.h"

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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_valid_progressive),
      cmocka_unit_test(test_huge_header_refused_before_allocating),
      cmocka_unit_test(test_progressive_memory_capped),
      cmocka_unit_test(test_scan_count_capped),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
