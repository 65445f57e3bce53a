/* The Relayout kernel (plain <-> NHWC, and NCDHW <-> NDHWC at rank 5)
 * against a naive transpose, for the channel counts that take different
 * paths (1, 3, 5, 17, 64) and element sizes 4 and 1, both directions, and a
 * round trip. */
#include "es_test.h"

#include <string.h>

#include "kernels/kernel.h"
#include "support/kernel_harness.h"

static int relayout(const es_tdesc *in, const void *data, es_layout to, es_tdesc *od,
                    void **out) {
  es_attr at = KH_INT("to", to);
  es_knode nd = kh_knode(ES_OP_Relayout, &at, 1);
  return kh_eval1(&nd, 13, in, data, od, out);
}

static void check_rank(int rank, const int64_t *dims, es_dtype dt) {
  es_tdesc in = kh_td(dt, rank, dims);
  unsigned char *x = malloc(in.nbytes);
  for (size_t i = 0; i < in.nbytes; i++)
    x[i] = (unsigned char)(i * 131 + 7);
  es_tdesc od;
  void *y = NULL;
  ES_CHECK_RC(relayout(&in, x, ES_LAYOUT_NHWC, &od, &y));
  assert_int_equal(od.layout, ES_LAYOUT_NHWC);
  void *want = kh_reorder4(x, &in, 1);
  assert_memory_equal(y, want, in.nbytes);
  es_mem_free(want);
  /* and back */
  void *z = NULL;
  es_tdesc od2;
  ES_CHECK_RC(relayout(&od, y, ES_LAYOUT_PLAIN, &od2, &z));
  assert_int_equal(od2.layout, ES_LAYOUT_PLAIN);
  assert_memory_equal(z, x, in.nbytes);
  es_mem_free(y);
  es_mem_free(z);
  free(x);
}

static void check(int64_t n, int64_t c, int64_t h, int64_t w, es_dtype dt) {
  check_rank(4, (const int64_t[]){n, c, h, w}, dt);
}

static void test_relayout_paths(void **state) {
  (void)state;
  static const int64_t cs[] = {1, 3, 5, 17, 64};
  for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
    check(2, cs[i], 7, 9, ES_DTYPE_FLOAT);
    check(1, cs[i], 19, 21, ES_DTYPE_UINT8);
    check_rank(5, (const int64_t[]){2, cs[i], 3, 5, 7}, ES_DTYPE_FLOAT);
    check_rank(5, (const int64_t[]){1, cs[i], 4, 6, 3}, ES_DTYPE_UINT8);
  }
}

static void test_relayout_rejects(void **state) {
  (void)state;
  float x[64] = {0};
  es_tdesc od;
  void *y = NULL;
  es_tdesc r3 = KH_TD(ES_DTYPE_FLOAT, 1, 3, 4), r6 = KH_TD(ES_DTYPE_FLOAT, 1, 2, 2, 2, 2, 2);
  ES_EXPECT_RC(relayout(&r3, x, ES_LAYOUT_NHWC, &od, &y), ES_EMODEL);
  ES_EXPECT_RC(relayout(&r6, x, ES_LAYOUT_NHWC, &od, &y), ES_EMODEL);
  es_tdesc r4 = KH_TD(ES_DTYPE_FLOAT, 1, 2, 2, 2);
  ES_EXPECT_RC(relayout(&r4, x, (es_layout)7, &od, &y), ES_EMODEL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_relayout_paths),
      cmocka_unit_test(test_relayout_rejects),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
