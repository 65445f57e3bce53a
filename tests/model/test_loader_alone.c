/* The loader links and works without the layers above it: this test is
 * linked against the loader library alone (common, memory, model: no
 * kernels, no oneDNN). It loads the target models and ONNX's node-test
 * models with es__onnx_load, seals their constants and frees them, and
 * checks a graph as the loader leaves it: sorted, pruned, constants still
 * staged (folding and fusion are the engine's). */
#include "es_test.h"

#include <dirent.h>
#include <stdio.h>
#include <string.h>

#include "model/graph.h"

/* Loads and seals one file; 1 loaded, 0 refused with an error, -1 absent. */
static int load_one(const char *path, es_graph *out_stats) {
  void *buf;
  size_t size;
  if (es_test_read_file(path, &buf, &size) < 0)
    return -1;
  es_graph g;
  memset(&g, 0, sizeof g);
  int rc = es__onnx_load(buf, size, &g);
  es_mem_free(buf);
  if (rc < 0) {
    assert_true(es_last_error_detail()[0] != '\0');
    return 0;
  }
  assert_null(g.weights); /* staged: the engine folds and fuses before sealing */
  assert_int_equal(g.folded_nodes, 0);
  ES_CHECK_RC(es__graph_seal(&g));
  assert_non_null(g.weights);
  if (out_stats)
    *out_stats = g, out_stats->weights = NULL;
  es__graph_fini(&g);
  return 1;
}

static void test_target_models(void **state) {
  (void)state;
  static const char *const files[] = {"blazeface_front_128.onnx", "blazeface_back_256.onnx",
                                      "ppocr_cls.onnx", "ppocr_rec.onnx", "ppocr_det.onnx"};
  int found = 0;
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    char path[1024];
    es_graph st;
    int r = load_one(es_test_model_path(path, sizeof path, files[i]), &st);
    if (r < 0)
      continue;
    assert_int_equal(r, 1);
    assert_true(st.n_nodes > 0 && st.weight_bytes > 0);
    printf("# %-26s %5d nodes, %9zu weight bytes\n", files[i], st.n_nodes, st.weight_bytes);
    found++;
  }
  if (!found)
    skip(); /* models not fetched: scripts/setup/fetch-models.sh */
}

static void test_node_models(void **state) {
  (void)state;
  const char *root = "/usr/share/libonnx-testdata/data/node";
  DIR *d = opendir(root);
  if (!d)
    skip(); /* Debian's libonnx-testdata is not installed */
  int loaded = 0, refused = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.')
      continue;
    char path[1200];
    snprintf(path, sizeof path, "%s/%s/model.onnx", root, e->d_name);
    int r = load_one(path, NULL);
    loaded += r == 1;
    refused += r == 0;
  }
  closedir(d);
  printf("# ONNX node-test models: %d loaded, %d refused with an error\n", loaded, refused);
  assert_true(loaded > 100);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_target_models),
      cmocka_unit_test(test_node_models),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
