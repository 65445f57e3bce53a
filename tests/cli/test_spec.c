/* The CLI's shape-spec parser (src/cli/spec.c), compiled into this test:
 * good and bad NAME=DIMS specs, lists, and MODEL[:SHAPES] splits with ':'
 * in the file name and in the input name, against files made here. */
#include "es_test.h"

#include <string.h>
#include <unistd.h>

#include "cli/spec.h"

static int parse(const char *s, cli_shape *out, char *why) {
  return cli_shape_parse(s, strlen(s), out, why);
}

static void test_good_shapes(void **state) {
  (void)state;
  cli_shape t;
  char why[CLI_WHY_MAX];
  assert_int_equal(parse("x=1x3x640x640", &t, why), 0);
  assert_int_equal(t.name_len, 1);
  assert_int_equal(t.rank, 4);
  assert_int_equal(t.dims[0], 1);
  assert_int_equal(t.dims[3], 640);
  assert_true(cli_shape_is(&t, "x"));
  assert_false(cli_shape_is(&t, "xx"));
  /* one dimension, a zero (empty tensor), the largest allowed */
  assert_int_equal(parse("n=7", &t, why), 0);
  assert_int_equal(t.rank, 1);
  assert_int_equal(parse("n=1x0x5", &t, why), 0);
  assert_int_equal(t.dims[1], 0);
  assert_int_equal(parse("n=4294967296", &t, why), 0);
  assert_int_equal(t.dims[0], (int64_t)1 << 32);
  /* ES_MAX_RANK dimensions */
  assert_int_equal(parse("n=1x1x1x1x1x1x1x2", &t, why), 0);
  assert_int_equal(t.rank, ES_MAX_RANK);
  /* the name runs to the last '=': names may hold '=' and ':' */
  assert_int_equal(parse("a=b:0=2x3", &t, why), 0);
  assert_true(cli_shape_is(&t, "a=b:0"));
  assert_int_equal(t.rank, 2);
}

static void expect_bad(const char *spec, const char *reason) {
  cli_shape t;
  char why[CLI_WHY_MAX] = "";
  if (parse(spec, &t, why) == 0)
    fail_msg("'%s' parsed, want an error", spec);
  if (!strstr(why, reason) || !strstr(why, spec))
    fail_msg("'%s': reason '%s' does not say '%s' and quote the spec", spec, why, reason);
}

static void test_bad_shapes(void **state) {
  (void)state;
  expect_bad("x1x3", "wants NAME=DxDxD");
  expect_bad("=1x3", "no input name");
  expect_bad("x=", "no dimensions");
  expect_bad("x=1x-3", "dimension 2 is negative");
  expect_bad("x=-1", "dimension 1 is negative");
  expect_bad("x=1xAx640", "dimension 2 is not a number");
  expect_bad("x=1x3.5", "dimension 2 is not a number");
  expect_bad("x=1x 3", "dimension 2 is not a number");
  expect_bad("x=1xx3", "dimension 2 is empty");
  expect_bad("x=1x3x", "dimension 3 is empty");
  expect_bad("x=4294967297", "larger than 2^32");
  expect_bad("x=99999999999999999999999", "larger than 2^32");
  expect_bad("x=1x1x1x1x1x1x1x1x1", "more than 8 dimensions");
}

static void test_lists(void **state) {
  (void)state;
  cli_shape t[4];
  int n = -1;
  char why[CLI_WHY_MAX];
  assert_int_equal(cli_shapes_parse("x=1x3x48x320", t, 4, &n, why), 0);
  assert_int_equal(n, 1);
  assert_int_equal(cli_shapes_parse("a=1x2,b=3", t, 4, &n, why), 0);
  assert_int_equal(n, 2);
  assert_true(cli_shape_is(&t[1], "b"));
  assert_int_equal(t[1].dims[0], 3);
  assert_int_equal(cli_shapes_parse("a=1,", t, 4, &n, why), -1);
  assert_non_null(strstr(why, "an empty shape"));
  assert_int_equal(cli_shapes_parse("", t, 4, &n, why), -1);
  assert_int_equal(cli_shapes_parse(",a=1", t, 4, &n, why), -1);
  assert_int_equal(cli_shapes_parse("a=1,b=x", t, 4, &n, why), -1);
  assert_int_equal(cli_shapes_parse("a=1,b=2,c=3", t, 2, &n, why), -1);
  assert_non_null(strstr(why, "more than 2 shapes"));

  /* find, apply, open */
  es_tensor_info infos[2] = {{.name = "a", .rank = 2, .dims = {-1, 2}},
                             {.name = "b", .rank = -1}};
  assert_int_equal(cli_shapes_parse("b=5x6x7", t, 4, &n, why), 0);
  assert_true(cli_shape_open(&infos[0]));
  assert_true(cli_shape_open(&infos[1]));
  assert_int_equal(cli_shape_find(&t[0], infos, 2), 1);
  cli_shape_apply(&t[0], &infos[1]);
  assert_int_equal(infos[1].rank, 3);
  assert_int_equal(infos[1].dims[2], 7);
  assert_false(cli_shape_open(&infos[1]));
  assert_int_equal(parse("c=1", &t[0], why), 0);
  assert_int_equal(cli_shape_find(&t[0], infos, 2), -1);
}

static char dir_[64];

static void touch(const char *name, char *path, size_t n) {
  snprintf(path, n, "%s/%s", dir_, name);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fclose(f);
}

static void test_model_args(void **state) {
  (void)state;
  snprintf(dir_, sizeof dir_, "/tmp/es_test_spec.XXXXXX");
  assert_non_null(mkdtemp(dir_));
  char plain[128], colon[128], arg[256], why[CLI_WHY_MAX];
  touch("m.onnx", plain, sizeof plain);
  touch("a:b.onnx", colon, sizeof colon);
  cli_model_arg ma;

  /* a bare file, then shapes after it */
  assert_int_equal(cli_model_arg_parse(plain, &ma, why), 0);
  assert_string_equal(ma.path, plain);
  assert_null(ma.specs);
  snprintf(arg, sizeof arg, "%s:x=1x3", plain);
  assert_int_equal(cli_model_arg_parse(arg, &ma, why), 0);
  assert_string_equal(ma.path, plain);
  assert_string_equal(ma.specs, "x=1x3");

  /* ':' in the file name and in the input name */
  assert_int_equal(cli_model_arg_parse(colon, &ma, why), 0);
  assert_string_equal(ma.path, colon);
  assert_null(ma.specs);
  snprintf(arg, sizeof arg, "%s:input:0=1x3,y=2", colon);
  assert_int_equal(cli_model_arg_parse(arg, &ma, why), 0);
  assert_string_equal(ma.path, colon);
  assert_string_equal(ma.specs, "input:0=1x3,y=2");

  /* an existing file followed by a bad or empty list: the split stands and
   * the list fails to parse */
  snprintf(arg, sizeof arg, "%s:", plain);
  assert_int_equal(cli_model_arg_parse(arg, &ma, why), 0);
  assert_string_equal(ma.specs, "");
  cli_shape t[4];
  int n;
  assert_int_equal(cli_shapes_parse(ma.specs, t, 4, &n, why), -1);

  /* no file at all: split where shapes parse, so the load names the file */
  snprintf(arg, sizeof arg, "%s/missing:dir/m.onnx:x=1x3", dir_);
  assert_int_equal(cli_model_arg_parse(arg, &ma, why), 0);
  assert_string_equal(ma.specs, "dir/m.onnx:x=1x3");
  assert_int_equal(cli_model_arg_parse("nothing.onnx", &ma, why), 0);
  assert_string_equal(ma.path, "nothing.onnx");
  assert_null(ma.specs);
  assert_int_equal(cli_model_arg_parse(":x=1x3", &ma, why), -1);
  assert_non_null(strstr(why, "no model file"));

  unlink(plain);
  unlink(colon);
  rmdir(dir_);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_good_shapes),
      cmocka_unit_test(test_bad_shapes),
      cmocka_unit_test(test_lists),
      cmocka_unit_test(test_model_args),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
