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
 * Scope. Each test is also classified from its model alone, whatever the
 * engine supports: OUT OF SCOPE when it holds what an edge inference
 * engine does not mean to run (element types double, float16, bfloat16,
 * string, complex, int16 and the unsigned ones above 8 bits; sequence,
 * optional and map types; training: the ai.onnx.preview.training domain,
 * the loss operators, Dropout or BatchNormalization in training mode, the
 * random generators; string operators; opsets older than the engine's 7),
 * else IN SCOPE. The summary counts both and gives the in-scope pass rate,
 * then the reasons for skips with their counts.
 *
 *   test_onnx_nodes [DATA_DIR]       (default: the Debian package's folder)
 *   ES_NODE_FILTER=conv test_onnx_nodes   runs only names containing "conv"
 *   ES_NODE_VERBOSE=1                      prints passes and each skip's reason
 *   ES_NODE_MIN_PASS=95                    fails below 95% passed in scope */
#include "es_test.h"

#include "common/internal.h"
#include "kernels/kernel.h"
#include "engine/engine_internal.h"
#include "model/graph.h"
#include "onnx.pb-c.h"

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
static int heap_alloc(void *user, size_t bytes, void **out) {
  (void)user;
  *out = es_mem_aligned_alloc(ES_MEM_OTHER, 64, bytes);
  return *out ? 0 : ES_ENOMEM;
}
static void heap_free(void *user, void *p) {
  (void)user;
  es_mem_free(p);
}

/* A Loop or Scan: its body run by the engine's interpreter, over the same
 * values; outputs are es_mem blocks like es__kernel_eval's. */
static int body_eval(const es_graph *g, const es_node *nd, const es_tdesc *desc, void **data,
                     es_tdesc *outd, void **outp) {
  es_ival *iv = es_mem_calloc(ES_MEM_OTHER, (size_t)g->n_values + 1, sizeof *iv);
  if (!iv)
    return ES_ENOMEM;
  for (int k = 0; k < nd->n_in; k++) {
    int v = nd->in[k];
    if (v >= 0 && data[v]) {
      iv[v].desc = desc[v];
      iv[v].data = data[v];
    }
  }
  es_run_heap heap = {heap_alloc, heap_free, NULL};
  es_interp I = {&heap, g->opset};
  int rc = nd->op == ES_OP_Loop ? es__interp_loop(&I, nd, iv) : es__interp_scan(&I, nd, iv);
  for (int o = 0; o < nd->n_out; o++) {
    int v = nd->out[o];
    outp[o] = NULL;
    if (v < 0)
      continue;
    if (rc == 0) {
      outd[o] = iv[v].desc;
      outp[o] = iv[v].own;
    } else {
      es__ival_drop(&I, &iv[v]);
    }
  }
  es_mem_free(iv);
  return rc;
}

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
    int rc;
    if (nd->body) {
      rc = body_eval(g, nd, desc, data, outd, outp);
    } else {
      es_knode kn = es__knode_of(nd);
      rc = es__kernel_eval(&kn, g->opset, nd->n_in, ind, inp, nd->n_out, outd, outp);
    }
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

/* ---- scope ------------------------------------------------------------------ */

static char scope_[200]; /* why the test is out of scope; "" when in scope */

static const char *type_out_of_scope(int32_t t) {
  switch (t) {
  case ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE:
    return "double";
  case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16:
    return "float16";
  case ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16:
    return "bfloat16";
  case ONNX__TENSOR_PROTO__DATA_TYPE__STRING:
    return "string";
  case ONNX__TENSOR_PROTO__DATA_TYPE__COMPLEX64:
  case ONNX__TENSOR_PROTO__DATA_TYPE__COMPLEX128:
    return "complex";
  case ONNX__TENSOR_PROTO__DATA_TYPE__UINT16:
    return "uint16";
  case ONNX__TENSOR_PROTO__DATA_TYPE__UINT32:
    return "uint32";
  case ONNX__TENSOR_PROTO__DATA_TYPE__UINT64:
    return "uint64";
  case ONNX__TENSOR_PROTO__DATA_TYPE__INT16:
    return "int16";
  default:
    return t > ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16 ? "a newer element type" : NULL;
  }
}

/* The first reason found: what, and arg in parentheses when given. */
static void scope_set(const char *what, const char *arg) {
  if (!scope_[0])
    snprintf(scope_, sizeof scope_, "%s%s%.80s%s", what, arg ? " (" : "", arg ? arg : "",
             arg ? ")" : "");
}

static void scope_type(const Onnx__TypeProto *tp) {
  if (!tp)
    return;
  switch (tp->value_case) {
  case ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE: {
    const char *t = tp->tensor_type && tp->tensor_type->has_elem_type
                        ? type_out_of_scope(tp->tensor_type->elem_type)
                        : NULL;
    if (t)
      scope_set("type", t);
    return;
  }
  case ONNX__TYPE_PROTO__VALUE_SEQUENCE_TYPE:
    scope_set("sequence types", NULL);
    return;
  case ONNX__TYPE_PROTO__VALUE_OPTIONAL_TYPE:
    scope_set("optional types", NULL);
    return;
  case ONNX__TYPE_PROTO__VALUE_MAP_TYPE:
    scope_set("map types", NULL);
    return;
  default:
    scope_set("sparse tensor types", NULL);
    return;
  }
}

/* The constant called name in gp (initializer or Constant node), or NULL. */
static const Onnx__TensorProto *scope_const(const Onnx__GraphProto *gp, const char *name) {
  for (size_t i = 0; i < gp->n_initializer; i++)
    if (gp->initializer[i]->name && !strcmp(gp->initializer[i]->name, name))
      return gp->initializer[i];
  for (size_t i = 0; i < gp->n_node; i++) {
    const Onnx__NodeProto *n = gp->node[i];
    if (n->op_type && !strcmp(n->op_type, "Constant") && n->n_output == 1 &&
        !strcmp(n->output[0], name) && n->n_attribute == 1 && n->attribute[0]->t)
      return n->attribute[0]->t;
  }
  return NULL;
}

static int tensor_all_zero(const Onnx__TensorProto *t) {
  for (size_t i = 0; i < t->raw_data.len; i++)
    if (t->raw_data.data[i])
      return 0;
  for (size_t i = 0; i < t->n_int32_data; i++)
    if (t->int32_data[i])
      return 0;
  return 1;
}

static void scope_graph(const Onnx__GraphProto *gp) {
  static const char *const training[] = {"SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss",
                                         "Bernoulli", "RandomUniform", "RandomUniformLike",
                                         "RandomNormal", "RandomNormalLike"};
  static const char *const strings[] = {"StringNormalizer", "TfIdfVectorizer", "RegexFullMatch",
                                        "StringConcat", "StringSplit"};
  for (size_t i = 0; i < gp->n_input; i++)
    scope_type(gp->input[i]->type);
  for (size_t i = 0; i < gp->n_output; i++)
    scope_type(gp->output[i]->type);
  for (size_t i = 0; i < gp->n_value_info; i++)
    scope_type(gp->value_info[i]->type);
  for (size_t i = 0; i < gp->n_initializer; i++) {
    const char *t = type_out_of_scope(gp->initializer[i]->data_type);
    if (t)
      scope_set("type", t);
  }
  for (size_t i = 0; i < gp->n_node; i++) {
    const Onnx__NodeProto *n = gp->node[i];
    const char *op = n->op_type ? n->op_type : "";
    if (n->domain && !strcmp(n->domain, "ai.onnx.preview.training"))
      scope_set("training operators", op);
    for (size_t k = 0; k < sizeof training / sizeof *training; k++)
      if (!strcmp(op, training[k]))
        scope_set("training operators", op);
    for (size_t k = 0; k < sizeof strings / sizeof *strings; k++)
      if (!strcmp(op, strings[k]))
        scope_set("string operators", op);
    /* Dropout's training_mode: only a constant false is inference */
    if (!strcmp(op, "Dropout") && n->n_input > 2 && n->input[2][0]) {
      const Onnx__TensorProto *t = scope_const(gp, n->input[2]);
      if (!t || !tensor_all_zero(t))
        scope_set("training mode", op);
    }
    for (size_t a = 0; a < n->n_attribute; a++) {
      const Onnx__AttributeProto *at = n->attribute[a];
      const char *t = NULL;
      if (!strcmp(op, "BatchNormalization") && at->name && !strcmp(at->name, "training_mode") &&
          at->i)
        scope_set("training mode", op);
      if (at->name && !strcmp(at->name, "to") &&
          at->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT)
        t = type_out_of_scope((int32_t)at->i);
      if (at->t)
        t = type_out_of_scope(at->t->data_type);
      if (t)
        scope_set("type", t);
      if (at->g)
        scope_graph(at->g);
      for (size_t k = 0; k < at->n_graphs; k++)
        scope_graph(at->graphs[k]);
    }
  }
}

/* Classifies the model in buf into scope_ ("" when in scope). */
static void scope_classify(const void *buf, size_t size) {
  scope_[0] = '\0';
  Onnx__ModelProto *mp = onnx__model_proto__unpack(NULL, size, buf);
  if (!mp)
    return; /* the loader says what is wrong with it */
  for (size_t i = 0; i < mp->n_opset_import; i++) {
    const Onnx__OperatorSetIdProto *os = mp->opset_import[i];
    if ((!os->domain || !os->domain[0] || !strcmp(os->domain, "ai.onnx")) &&
        os->version < ES_ONNX_MIN_OPSET)
      scope_set("opsets older than 7", NULL);
  }
  if (mp->graph)
    scope_graph(mp->graph);
  onnx__model_proto__free_unpacked(mp, NULL);
}

/* A kernel's or loader's message without the node's label: "Resize: mode
 * 'cubic' is not supported" for "node 'r' (#0 Resize): mode ...". */
static void reason_of(const char *detail, char *out, size_t size) {
  const char *open = strstr(detail, " (#"), *close = open ? strstr(open, "): ") : NULL;
  if (!strncmp(detail, "node ", 5) && open && close) {
    const char *op = strchr(open, ' ') + 1; /* "#12 Resize)" */
    const char *sp = strchr(op, ' ');
    if (sp && sp < close) {
      snprintf(out, size, "%.*s: %.300s", (int)(close - sp - 1), sp + 1, close + 3);
      return;
    }
  }
  if (!strncmp(detail, "node #", 6) && (open = strstr(detail, " (")) &&
      (close = strstr(open, "): "))) {
    snprintf(out, size, "%.*s: %.300s", (int)(close - open - 2), open + 2, close + 3);
    return;
  }
  snprintf(out, size, "%.380s", detail);
}

static char reason_[1200]; /* a skip's reasons, one per line, grouped in the summary */

static result run_node_test(const char *dir) {
  char path[1100];
  snprintf(path, sizeof path, "%s/model.onnx", dir);
  void *buf;
  size_t size;
  scope_[0] = '\0';
  if (es_test_read_file(path, &buf, &size) < 0) {
    es_mem_free(buf);
    snprintf(why_, sizeof why_, "no model.onnx");
    snprintf(reason_, sizeof reason_, "no model.onnx");
    return R_SKIP;
  }
  scope_classify(buf, size);
  es_graph g;
  memset(&g, 0, sizeof g);
  es_issues issues = {0};
  int rc = es__graph_load_checked(buf, size, &g, &issues);
  es_mem_free(buf);
  if (rc < 0) {
    snprintf(why_, sizeof why_, "%s", es_last_error_detail());
    /* every item, one per line: the summary counts the test under each */
    reason_[0] = '\0';
    for (int i = 0; i < issues.n; i++) {
      size_t at = strlen(reason_);
      snprintf(reason_ + at, sizeof reason_ - at, "%s%.200s", i ? "\n" : "", issues.items[i].what);
    }
    if (!issues.n)
      reason_of(why_, reason_, sizeof reason_);
    es__issues_fini(&issues);
    return rc == ES_ENOTSUP ? R_SKIP : R_FAIL;
  }
  es__issues_fini(&issues);
  result res = R_SKIP;
  snprintf(why_, sizeof why_, "no data set");
  snprintf(reason_, sizeof reason_, "no data set");
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
  if (res == R_SKIP && strcmp(why_, "no data set"))
    reason_of(why_, reason_, sizeof reason_);
  es__graph_fini(&g);
  return res;
}

/* ---- the summary ----------------------------------------------------------- */

typedef struct tally {
  int pass, fail, skip;
  char **reason; /* every reason of every skip */
  int n_reason, cap_reason;
} tally;

/* Adds each line of reasons to t; 0 when out of memory. */
static int tally_reasons(tally *t, const char *reasons) {
  for (const char *p = reasons;;) {
    const char *nl = strchr(p, '\n');
    size_t len = nl ? (size_t)(nl - p) : strlen(p);
    if (t->n_reason == t->cap_reason) {
      int cap = t->cap_reason ? 2 * t->cap_reason : 256;
      char **r = realloc(t->reason, (size_t)cap * sizeof *r);
      if (!r)
        return 0;
      t->reason = r;
      t->cap_reason = cap;
    }
    if (!(t->reason[t->n_reason++] = strndup(p, len)))
      return 0;
    if (!nl)
      return 1;
    p = nl + 1;
  }
}

static int cmp_count_desc(const void *a, const void *b, void *counts_) {
  const int *counts = counts_;
  int x = *(const int *)a, y = *(const int *)b;
  return counts[y] != counts[x] ? counts[y] - counts[x] : x - y;
}

/* One line per distinct reason, most frequent first. */
static void print_reasons(const char *title, const tally *t) {
  if (!t->n_reason)
    return;
  size_t m = (size_t)t->n_reason;
  qsort(t->reason, m, sizeof *t->reason, cmp_names);
  int *first = calloc(m, sizeof *first), *count = calloc(m, sizeof *count);
  int *order = calloc(m, sizeof *order);
  if (!first || !count || !order)
    abort();
  int n = 0;
  for (int i = 0; i < t->n_reason; i++) {
    if (i == 0 || strcmp(t->reason[i], t->reason[i - 1])) {
      first[n] = i;
      order[n] = n;
      n++;
    }
    count[n - 1]++;
  }
  qsort_r(order, (size_t)n, sizeof *order, cmp_count_desc, count);
  printf("skipped %s: %d tests, by reason (%d reasons; a test that needs several things counts "
         "under each):\n",
         title, t->skip, n);
  for (int i = 0; i < n; i++)
    printf("  %4d  %s\n", count[order[i]], t->reason[first[order[i]]]);
  free(first);
  free(count);
  free(order);
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
  tally in = {0}, out = {0};
  for (size_t i = 0; i < n; i++) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", root, names[i]);
    result r = run_node_test(dir);
    int scoped = !scope_[0];
    tally *t = scoped ? &in : &out;
    const char *tag = scoped ? "" : " [out of scope]";
    if (r == R_PASS) {
      t->pass++;
      if (verbose)
        printf("PASS %s%s\n", names[i], tag);
    } else if (r == R_FAIL) {
      t->fail++;
      printf("FAIL %s%s: %s\n", names[i], tag, why_);
    } else {
      /* out of scope: grouped by what puts it there; in scope: by the
       * engine's reason */
      t->skip++;
      if (!tally_reasons(t, scoped ? reason_ : scope_))
        return 1;
      if (verbose)
        printf("SKIP %s%s: %s\n", names[i], tag, why_);
    }
    free(names[i]);
  }
  free(names);
  int pass = in.pass + out.pass, fail = in.fail + out.fail, skip = in.skip + out.skip;
  int in_total = in.pass + in.fail + in.skip;
  double rate = in_total ? 100.0 * in.pass / in_total : 0;
  print_reasons("in scope", &in);
  print_reasons("out of scope", &out);
  printf("onnx node tests: %d passed, %d failed, %d skipped\n", pass, fail, skip);
  printf("  in scope:     %d passed, %d failed, %d skipped: %.1f%% of %d passed\n", in.pass,
         in.fail, in.skip, rate, in_total);
  printf("  out of scope: %d passed, %d failed, %d skipped\n", out.pass, out.fail, out.skip);
  for (int i = 0; i < in.n_reason; i++)
    free(in.reason[i]);
  for (int i = 0; i < out.n_reason; i++)
    free(out.reason[i]);
  free(in.reason);
  free(out.reason);
  int status = fail == 0 && pass > 0 ? 0 : 1;
  const char *min = getenv("ES_NODE_MIN_PASS");
  if (min && *min) {
    char *end;
    double want = strtod(min, &end);
    if (*end || !(want >= 0 && want <= 100)) {
      printf("test_onnx_nodes: ES_NODE_MIN_PASS='%s' is not a percentage\n", min);
      return 1;
    }
    if (rate < want) {
      printf("in-scope pass rate %.1f%% is below ES_NODE_MIN_PASS=%g%%\n", rate, want);
      status = 1;
    }
  }
  return status;
}
