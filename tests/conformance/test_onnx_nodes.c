/* ONNX's own operator conformance tests (Debian libonnx-testdata), run node
 * by node through the kernels.
 *
 * Every test folder holds model.onnx (usually one node) and data sets of
 * input_K.pb / output_K.pb tensors. A test whose model uses an operator,
 * attribute or type the engine does not claim (ES_ENOTSUP from the loader or
 * a kernel) is skipped and says why; anything else must match the expected
 * outputs (rtol 1e-3, atol 1e-5 for floats, exact otherwise, as ONNX's own
 * backend runner). The program fails if any claimed test fails, or if none
 * passed.
 *
 *   test_onnx_nodes [DATA_DIR]       (default: the Debian package's folder)
 *   ES_NODE_FILTER=conv test_onnx_nodes   runs only names containing "conv"
 *   ES_NODE_VERBOSE=1                      prints passes too */
#include "es_test.h"

#include "common/internal.h"
#include "kernels/kernel.h"
#include "engine/engine_internal.h"
#include "model/graph.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define DEFAULT_DIR "/usr/share/libonnx-testdata/data/node"

static int cmp_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

typedef enum { R_PASS, R_FAIL, R_SKIP } result;

static char why_[1400];

static void tdesc_of(const es_value *v, es_tdesc *t) {
  es__tdesc_set(t, v->dtype, v->rank, v->dims);
}

static int compare(const es_tdesc *got, const void *gd, const es_value *want, const void *wd,
                   const char *name) {
  if (got->dtype != want->dtype) {
    snprintf(why_, sizeof why_, "output '%s': dtype %s, expected %s", name,
             es_dtype_name(got->dtype), es_dtype_name(want->dtype));
    return -1;
  }
  int same = got->rank == want->rank;
  for (int i = 0; same && i < got->rank; i++)
    same = got->dims[i] == want->dims[i];
  if (!same) {
    char a[128] = "", b[128] = "";
    for (int i = 0; i < got->rank; i++)
      snprintf(a + strlen(a), sizeof a - strlen(a), "%lld,", (long long)got->dims[i]);
    for (int i = 0; i < want->rank; i++)
      snprintf(b + strlen(b), sizeof b - strlen(b), "%lld,", (long long)want->dims[i]);
    snprintf(why_, sizeof why_, "output '%s': shape [%s], expected [%s]", name, a, b);
    return -1;
  }
  if (got->dtype == ES_DTYPE_FLOAT) {
    const float *g = gd, *w = wd;
    for (size_t i = 0; i < got->count; i++) {
      if (isnan(w[i]) && isnan(g[i]))
        continue;
      if (isinf(w[i]) && g[i] == w[i])
        continue;
      if (!(fabsf(g[i] - w[i]) <= 1e-5f + 1e-3f * fabsf(w[i]))) {
        snprintf(why_, sizeof why_, "output '%s'[%zu] = %g, expected %g", name, i, (double)g[i],
                 (double)w[i]);
        return -1;
      }
    }
    return 0;
  }
  if (memcmp(gd, wd, got->nbytes)) {
    snprintf(why_, sizeof why_, "output '%s': values differ (%s)", name, es_dtype_name(got->dtype));
    return -1;
  }
  return 0;
}

/* Reads and parses SETDIR/FILE_I.pb; on failure why_ says why, naming the
 * tensor as what. */
static result read_tensor(const char *setdir, const char *file, const char *what, int i,
                          es_value *tv, void **d) {
  char path[1200];
  snprintf(path, sizeof path, "%s/%s_%d.pb", setdir, file, i);
  void *buf = NULL;
  size_t size;
  if (es_test_read_file(path, &buf, &size) < 0) {
    snprintf(why_, sizeof why_, "missing %s", path);
    es_mem_free(buf);
    return R_FAIL;
  }
  int rc = es__onnx_tensor_parse(buf, size, tv, d);
  es_mem_free(buf);
  if (rc < 0) {
    snprintf(why_, sizeof why_, "%s %d: %s", what, i, es_last_error_detail());
    return rc == ES_ENOTSUP ? R_SKIP : R_FAIL;
  }
  return R_PASS;
}

/* Run one data set through the graph, node by node. */
static result run_set(const es_graph *g, const char *setdir) {
  int nv = g->n_values;
  es_tdesc *desc = es_mem_calloc(ES_MEM_OTHER, (size_t)nv, sizeof *desc);
  void **data = es_mem_calloc(ES_MEM_OTHER, (size_t)nv, sizeof *data);
  unsigned char *owned = es_mem_calloc(ES_MEM_OTHER, (size_t)nv, 1);
  result res = R_PASS;
  for (int v = 0; v < nv; v++)
    if (g->values[v].kind == ES_VALUE_CONST) {
      tdesc_of(&g->values[v], &desc[v]);
      data[v] = (void *)g->values[v].data;
    }
  for (int i = 0; i < g->n_inputs; i++) {
    es_value tv;
    void *d;
    if ((res = read_tensor(setdir, "input", "input", i, &tv, &d)) != R_PASS)
      goto out;
    int v = g->inputs[i];
    tdesc_of(&tv, &desc[v]);
    data[v] = d;
    owned[v] = 1;
  }
  for (int n = 0; n < g->n_nodes; n++) {
    const es_node *nd = &g->nodes[n];
    const es_tdesc *ind[16];
    const void *inp[16];
    es_tdesc outd[16];
    void *outp[16];
    if (nd->n_in > 16 || nd->n_out > 16) {
      snprintf(why_, sizeof why_, "too many inputs");
      res = R_SKIP;
      goto out;
    }
    for (int k = 0; k < nd->n_in; k++) {
      int v = nd->in[k];
      ind[k] = v >= 0 ? &desc[v] : NULL;
      inp[k] = v >= 0 ? data[v] : NULL;
    }
    es_knode kn = es__knode_of(nd);
    int rc = es__kernel_eval(&kn, g->opset, nd->n_in, ind, inp, nd->n_out, outd, outp);
    if (rc < 0) {
      snprintf(why_, sizeof why_, "%s", es_last_error_detail());
      res = rc == ES_ENOTSUP ? R_SKIP : R_FAIL;
      goto out;
    }
    for (int o = 0; o < nd->n_out; o++) {
      int v = nd->out[o];
      if (v < 0) {
        es_mem_free(outp[o]);
        continue;
      }
      desc[v] = outd[o];
      data[v] = outp[o];
      owned[v] = 1;
    }
  }
  for (int i = 0; i < g->n_outputs; i++) {
    es_value tv;
    void *d;
    if ((res = read_tensor(setdir, "output", "expected output", i, &tv, &d)) != R_PASS)
      goto out;
    int v = g->outputs[i];
    int rc = data[v] ? compare(&desc[v], data[v], &tv, d, g->values[v].name) : -1;
    if (!data[v])
      snprintf(why_, sizeof why_, "output '%s' was not computed", g->values[v].name);
    es_mem_free(d);
    if (rc < 0) {
      res = R_FAIL;
      goto out;
    }
  }
out:
  for (int v = 0; v < nv; v++)
    if (owned[v])
      es_mem_free(data[v]);
  es_mem_free(desc);
  es_mem_free(data);
  es_mem_free(owned);
  return res;
}

static result run_node_test(const char *dir) {
  char path[1100];
  snprintf(path, sizeof path, "%s/model.onnx", dir);
  void *buf;
  size_t size;
  if (es_test_read_file(path, &buf, &size) < 0) {
    es_mem_free(buf);
    snprintf(why_, sizeof why_, "no model.onnx");
    return R_SKIP;
  }
  es_graph g;
  memset(&g, 0, sizeof g);
  int rc = es__graph_load_lowered(buf, size, &g);
  es_mem_free(buf);
  if (rc < 0) {
    snprintf(why_, sizeof why_, "%s", es_last_error_detail());
    return rc == ES_ENOTSUP ? R_SKIP : R_FAIL;
  }
  result res = R_SKIP;
  snprintf(why_, sizeof why_, "no data set");
  for (int s = 0;; s++) {
    char setdir[1100];
    snprintf(setdir, sizeof setdir, "%s/test_data_set_%d", dir, s);
    struct stat st;
    if (stat(setdir, &st) < 0)
      break;
    res = run_set(&g, setdir);
    if (res != R_PASS)
      break;
  }
  es__graph_fini(&g);
  return res;
}

int main(int argc, char **argv) {
  const char *root = argc > 1 ? argv[1] : DEFAULT_DIR;
  const char *filter = getenv("ES_NODE_FILTER");
  int verbose = getenv("ES_NODE_VERBOSE") != NULL;
  DIR *d = opendir(root);
  if (!d) {
    printf("test_onnx_nodes: cannot open %s (install libonnx-testdata)\n", root);
    return 1;
  }
  char **names = NULL;
  size_t n = 0, cap = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, "test_", 5) || (filter && !strstr(e->d_name, filter)))
      continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 256;
      char **nn = realloc(names, cap * sizeof *names);
      if (!nn)
        return 1;
      names = nn;
    }
    names[n++] = strdup(e->d_name);
  }
  closedir(d);
  qsort(names, n, sizeof *names, cmp_names);
  int pass = 0, fail = 0, skip = 0;
  for (size_t i = 0; i < n; i++) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", root, names[i]);
    result r = run_node_test(dir);
    if (r == R_PASS) {
      pass++;
      if (verbose)
        printf("PASS %s\n", names[i]);
    } else if (r == R_FAIL) {
      fail++;
      printf("FAIL %s: %s\n", names[i], why_);
    } else {
      skip++;
      printf("SKIP %s: %s\n", names[i], why_);
    }
    free(names[i]);
  }
  free(names);
  printf("onnx node tests: %d passed, %d failed, %d skipped\n", pass, fail, skip);
  return fail == 0 && pass > 0 ? 0 : 1;
}
