/* es_model: a loaded graph plus its read-only weights, shared by reference.
 *
 * The model is immutable after es_model_load returns, which is what makes it
 * safe to share between threads without locks; only the reference count
 * changes, atomically.
 *
 * Loading goes: read the file (the loader marks what the engine cannot run
 * and goes on), remove Identity and inference Dropout, fold constants and
 * shapes fixed by the model, then check: the loader's list plus operators
 * without a kernel. Folding comes first, so a constant subgraph feeding an
 * operator the engine lacks still folds, and the list holds only what would
 * have to run. A model with anything on the list fails with all of it in
 * the detail (es__issues_fail: the first items, "and K more"); when its
 * inputs' shapes are fixed, a plan is attempted first on what can run, so
 * the kernels' own refusals (attributes, types: each kernel's infer) join
 * the list without a copy of their rules here. es_model_check reports the
 * same, item by item and unbounded. */
#include "edgeserve/engine.h"
#include "common/internal.h"
#include "engine/engine_internal.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ES_MODEL_MAX_FILE ((size_t)2 << 30)

static int model_ok(const es_model *m) { return es__model_ok(m); }

#define ES_LOAD_INTRO "the model uses what the engine cannot run"

/* Operators without a kernel, in g and the bodies it holds (a Loop or
 * Scan runs its body, not a kernel). */
static int check_kernels(const es_graph *g, es_issues *out) {
  int rc = 0;
  char what[160], where[160], first[400], label[160];
  for (int i = 0; rc == 0 && i < g->n_nodes; i++) {
    const es_node *nd = &g->nodes[i];
    if (nd->body && !nd->unsup) {
      rc = check_kernels(nd->body, out);
      continue;
    }
    if (nd->unsup || es__kernel_for(nd->op))
      continue;
    snprintf(what, sizeof what, "%s (no kernel)", es__op_name(nd->op));
    if (nd->name && nd->name[0])
      snprintf(where, sizeof where, "'%.120s'", nd->name);
    else
      snprintf(where, sizeof where, "#%d", nd->file_index);
    snprintf(first, sizeof first, "%s: no kernel for this operator",
             es__node_label(nd, label, sizeof label));
    rc = es__issues_add(out, what, where, 1, first);
  }
  return rc;
}

int es__graph_check(const es_graph *g, es_issues *out) {
  int rc = es__graph_issues(g, out);
  return rc < 0 ? rc : check_kernels(g, out);
}

/* Reads, elides, folds and checks: g is the folded graph, not fused or
 * sealed, and l lists what it needs that the engine cannot run. */
static int graph_prepare(const void *data, size_t size, es_weights *file, es_graph *g,
                         es_issues *l) {
  int rc = file ? es__onnx_load_file(file, g) : es__onnx_load_keep(data, size, g);
  if (rc < 0)
    return rc;
  if ((rc = es__graph_lower_qdq(g)) == 0 && (rc = es__graph_fold(g)) == 0)
    rc = es__graph_check(g, l);
  if (rc < 0)
    es__graph_fini(g);
  return rc;
}

int es__graph_load_checked(const void *data, size_t size, es_graph *g, es_issues *issues) {
  es_issues own = {0}, *l = issues ? issues : &own;
  int rc = graph_prepare(data, size, NULL, g, l);
  if (rc < 0) {
    es__issues_fini(&own);
    return rc;
  }
  if (l->n)
    rc = es__issues_fail(l, ES_LOAD_INTRO);
  else if ((rc = es__graph_fuse(g)) == 0 && (rc = es__graph_seal(g)) == 0)
    rc = es__graph_progs_make(g);
  es__issues_fini(&own);
  if (rc < 0)
    es__graph_fini(g);
  return rc;
}

int es__graph_load_lowered(const void *data, size_t size, es_graph *g) {
  return es__graph_load_checked(data, size, g, NULL);
}

static void info_of(const es_value *v, es_tensor_info *out);

static _Atomic int mlock_on_;

void es_engine_mlock_set(int on) { atomic_store(&mlock_on_, on ? 1 : 0); }
int es_engine_mlock_get(void) { return atomic_load(&mlock_on_); }

/* With es_engine_mlock_set: the model's constants (their region and the
 * file mapping read in place) and its prepared weights, now and as plans
 * add them, locked in RAM. */
static int model_lock(es_model *m) {
  int rc = 0;
  if (m->g.weights)
    rc = es_weights_lock(m->g.weights);
  if (rc == 0 && m->g.file)
    rc = es_weights_lock(m->g.file);
  if (rc == 0)
    rc = es__prep_store_lock(m->prep);
  return rc;
}

/* The last step of every load: a model whose graph (and store) were made
 * with status rc becomes the caller's reference (its weights locked first
 * while es_engine_mlock_set is on), or is freed. */
static int model_finish(es_model *m, int rc, es_model **out) {
  if (rc == 0 && atomic_load(&mlock_on_))
    rc = model_lock(m);
  if (rc < 0) {
    es__prep_store_destroy(m->prep);
    es__graph_fini(&m->g);
    es_mem_free(m);
    return rc;
  }
  m->magic = ES_MODEL_MAGIC;
  atomic_init(&m->refs, 1);
  *out = m;
  return 0;
}

/* The shapes to plan m with: each input's own, replaced by the one named
 * in given. *fixed: every input the engine can hold is then concrete. */
static int check_shapes(const es_model *m, const es_tensor_info *given, int n_given,
                        es_tensor_info *shapes, int *fixed) {
  const es_graph *g = &m->g;
  *fixed = 1;
  for (int i = 0; i < g->n_inputs; i++)
    info_of(&g->values[g->inputs[i]], &shapes[i]);
  for (int k = 0; k < n_given; k++) {
    int found = -1;
    for (int i = 0; i < g->n_inputs && found < 0; i++)
      if (given[k].name && !strcmp(given[k].name, shapes[i].name))
        found = i;
    if (found < 0)
      return es__fail(ES_EINVAL, "the model has no input named '%s'",
                      given[k].name ? given[k].name : "(null)");
    es_dtype dt = shapes[found].dtype;
    shapes[found] = given[k];
    shapes[found].name = g->values[g->inputs[found]].name;
    shapes[found].dtype = dt;
  }
  for (int i = 0; i < g->n_inputs; i++) {
    if (g->values[g->inputs[i]].kind == ES_VALUE_UNSUPPORTED)
      continue; /* the planner leaves what reads it */
    if (shapes[i].rank < 0)
      *fixed = 0;
    for (int d = 0; d < shapes[i].rank; d++)
      if (shapes[i].dims[d] < 0)
        *fixed = 0;
  }
  return 0;
}

/* ==========================================================================
 * Precision (es_model_options)
 * ======================================================================== */

static const char *const precision_names_[] = {"auto", "fp32", "bf16", "int8"};

const char *es_precision_name(es_precision p) {
  return (unsigned)p <= ES_PRECISION_INT8 ? precision_names_[p] : "unknown";
}

int es_precision_parse(const char *s, es_precision *out) {
  static const struct {
    const char *name;
    es_precision p;
  } names[] = {{"auto", ES_PRECISION_AUTO}, {"fp32", ES_PRECISION_FP32},
               {"float32", ES_PRECISION_FP32}, {"bf16", ES_PRECISION_BF16},
               {"bfloat16", ES_PRECISION_BF16}, {"int8", ES_PRECISION_INT8}};
  for (size_t i = 0; s && out && i < sizeof names / sizeof names[0]; i++)
    if (!strcmp(s, names[i].name)) {
      *out = names[i].p;
      return 0;
    }
  return es__fail(ES_EINVAL, "precision '%s': expected auto, fp32, bf16 or int8", s ? s : "(null)");
}

int es_engine_bf16_check(void) { return es__kernels_bf16_check(); }

static int is_float_compute(es_op op) {
  return op == ES_OP_Conv || op == ES_OP_ConvTranspose || op == ES_OP_MatMul || op == ES_OP_Gemm;
}

static int node_bf16(const es_node *nd) {
  const es_attr *a = es__node_attr(nd, "_bf16");
  return a && a->type == ES_ATTR_INT && a->i != 0;
}

/* The nodes that compute in int8, in bf16 (marked "_bf16") and in float32. */
static void precision_count(const es_graph *g, size_t *int8, size_t *bf16, size_t *fp32,
                            size_t *w8) {
  *int8 = *bf16 = *fp32 = *w8 = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    const es_node *nd = &g->nodes[i];
    if (nd->op == ES_OP_QLinearConv || nd->op == ES_OP_QLinearMatMul ||
        nd->op == ES_OP_QLinearConvTranspose)
      (*int8)++;
    else if (is_float_compute(nd->op))
      (*(node_bf16(nd) ? bf16 : fp32))++;
    if (is_float_compute(nd->op) && es__node_attr(nd, "_w8"))
      (*w8)++;
  }
}

/* Whether node nd gains from bf16. bf16 halves the cost of a product's
 * multiply-adds (oneDNN's vdpbf16ps pairs two along the reduction) but
 * adds a pass over the source (rounded to bf16 before each run, 0.15 ms
 * for det's largest). On det (640x640, one core) the 1x1 and 3x3 convs
 * ran in 0.38-0.81x of their float32 time (the 3x3 96->24 ones 0.50x, 1x1
 * 48->12 with 24 FLOPs per source element 0.81x), stride-1 depthwise convs
 * (18 and 50) in 0.70-0.90x, stride-2 depthwise ones (4.5 and 12.5) in
 * 1.12-1.19x: the line is 16 FLOPs per source element, which follows from
 * the weights' shape, the group and the strides: a conv's are
 * 2 (M/g) kh kw / (sh sw), a MatMul's 2 N. */
static int bf16_gains(const es_graph *g, const es_node *nd) {
  if (nd->n_in < 2 || nd->in[1] < 0 || es__node_attr(nd, "_w8"))
    return 0; /* a weight-only int8 Conv dequantizes to float32 (conv.c) */
  const es_value *w = &g->values[nd->in[1]];
  if (w->kind != ES_VALUE_CONST)
    return 0;
  if (nd->op == ES_OP_MatMul)
    return w->rank == 2 && w->dims[0] >= 2 && 2 * w->dims[1] >= 32;
  if (nd->op != ES_OP_Conv || w->rank < 3)
    return 0;
  const es_attr *ga = es__node_attr(nd, "group"), *sa = es__node_attr(nd, "strides");
  int64_t groups = ga && ga->type == ES_ATTR_INT && ga->i > 0 ? ga->i : 1, ker = 1, str = 1;
  for (int d = 2; d < w->rank; d++)
    ker *= w->dims[d] > 0 ? w->dims[d] : 1;
  for (size_t d = 0; sa && sa->type == ES_ATTR_INTS && d < sa->n; d++)
    str *= sa->ints[d] > 0 ? sa->ints[d] : 1;
  int64_t red = w->dims[1] * ker, m_per_g = w->dims[0] / groups;
  return red >= 2 && 2 * m_per_g * ker >= 16 * str;
}

/* ES_PRECISION_BF16: every Conv and MatMul by static weights that gains
 * (bf16_gains) gets "_bf16" 1, which its kernel reads (kernels/dnnl_glue.h).
 * An attribute rather than a flag of the plan: a compiled .esm keeps it,
 * with the bf16 weights its plans prepared. ConvTranspose stays float32:
 * oneDNN 2.6 runs a deconvolution as a backward-data convolution plus our
 * own epilogue, and det's two take 6% of its time. */
static int graph_mark_bf16(es_graph *g) {
  for (int i = 0; i < g->n_nodes; i++) {
    es_node *nd = &g->nodes[i];
    if (!bf16_gains(g, nd) || es__node_attr(nd, "_bf16"))
      continue;
    es_attr *a = es__ctx_alloc(&g->ctx, (size_t)(nd->n_attr + 1) * sizeof *a);
    char *name = es__ctx_strdup(&g->ctx, "_bf16");
    if (!a || !name)
      return es__fail(ES_ENOMEM, "out of memory marking nodes for bf16");
    if (nd->n_attr)
      memcpy(a, nd->attrs, (size_t)nd->n_attr * sizeof *a);
    a[nd->n_attr] = (es_attr){.name = name, .type = ES_ATTR_INT, .i = 1};
    nd->attrs = a;
    nd->n_attr++;
  }
  return 0;
}

/* A loaded model (from ONNX or .esm) against the precision asked for. */
static int precision_check(const es_model *m, es_precision want) {
  size_t int8, bf16, fp32, w8;
  precision_count(&m->g, &int8, &bf16, &fp32, &w8);
  if (bf16) {
    int rc = es_engine_bf16_check();
    if (rc < 0)
      return rc;
  }
  switch (want) {
  case ES_PRECISION_FP32:
    if (int8)
      return es__fail(ES_EINVAL, "precision fp32: the model is quantized (%zu convolutions and "
                      "matrix products run in int8); load its float model, or ask for int8 "
                      "or auto", int8);
    if (bf16)
      return es__fail(ES_EINVAL, "precision fp32: the compiled model runs %zu nodes in bf16; "
                      "compile it again with precision fp32", bf16);
    return 0;
  case ES_PRECISION_INT8:
    if (!int8)
      return es__fail(ES_EINVAL, "precision int8: the model is not quantized (no QDQ "
                      "convolution, QLinearConv or QLinearMatMul); make an int8 model with "
                      "`edgeserve quantize`, or ask for fp32 or bf16");
    return 0;
  case ES_PRECISION_BF16:
    if (!bf16 && fp32 && m->compiled)
      return es__fail(ES_EINVAL, "precision bf16: the compiled model runs in float32; compile "
                      "it again with precision bf16");
    return 0;
  default:
    return 0;
  }
}

/* What build_model reports besides the list. */
typedef struct build_info {
  int planned, unreached;
} build_info;

/* A model from bytes (file's whole mapping when file is not NULL: its
 * large constants are then read in place), into *out. l (non-NULL) collects what the engine
 * cannot run; a model with anything on it is still built (unfused,
 * unsealed: for planning what can run, never for serving) and the caller
 * decides. With plan set, or when the list is not empty, a plan for the
 * given shapes (the model's own for the others) is attempted when they are
 * concrete, its refusals joining the list. */
static int build_model(const void *data, size_t size, es_weights *file, es_issues *l, int plan,
                       const es_tensor_info *given, int n_given, es_precision prec, build_info *bi,
                       es_model **out) {
  es_model *m = es_mem_calloc(ES_MEM_MODEL, 1, sizeof *m);
  if (!m)
    return es__fail(ES_ENOMEM, "out of memory loading the model");
  int rc = graph_prepare(data, size, file, &m->g, l);
  if (rc < 0) {
    es_mem_free(m);
    return rc;
  }
  if (l->n == 0 && (rc = es__graph_fuse(&m->g)) == 0 &&
      (prec != ES_PRECISION_BF16 || (rc = graph_mark_bf16(&m->g)) == 0) &&
      (rc = es__graph_seal(&m->g)) == 0)
    rc = es__graph_progs_make(&m->g);
  if (rc == 0)
    rc = es__prep_store_create(&m->prep);
  if ((rc = model_finish(m, rc, &m)) < 0)
    return rc;
  if (plan || l->n) {
    int n = m->g.n_inputs, fixed = 0;
    es_tensor_info *shapes = es_mem_calloc(ES_MEM_MODEL, (size_t)n + 1, sizeof *shapes);
    if (!shapes)
      rc = es__fail(ES_ENOMEM, "out of memory loading the model");
    else
      rc = check_shapes(m, given, n_given, shapes, &fixed);
    if (rc == 0 && fixed) {
      rc = es__plan_diagnose(m, shapes, n, l, &bi->unreached);
      bi->planned = 1;
    }
    es_mem_free(shapes);
    if (rc < 0) {
      es_model_release(m);
      return rc;
    }
  }
  *out = m;
  return 0;
}

static es_precision opts_precision(const es_model_options *opts) {
  return opts ? opts->precision : ES_PRECISION_AUTO;
}

static int load_built(const void *data, size_t size, es_weights *file, es_precision prec,
                      es_model **out) {
  es_issues l = {0};
  build_info bi = {0};
  es_model *m = NULL;
  int rc = prec == ES_PRECISION_BF16 ? es_engine_bf16_check() : 0;
  if (rc == 0)
    rc = build_model(data, size, file, &l, 0, NULL, 0, prec, &bi, &m);
  if (rc == 0 && l.n) {
    rc = es__issues_fail(&l, ES_LOAD_INTRO);
    es_model_release(m);
  } else if (rc == 0 && (rc = precision_check(m, prec)) < 0) {
    es_model_release(m);
  } else if (rc == 0) {
    *out = m;
  }
  es__issues_fini(&l);
  return rc;
}

int es_model_load_buffer(const void *data, size_t size, const es_model_options *opts,
                         es_model **out) {
  if (!data || !out)
    return es__fail(ES_EINVAL, "es_model_load_buffer: NULL argument");
  if (opts && (unsigned)opts->precision > ES_PRECISION_INT8)
    return es__fail(ES_EINVAL, "es_model_load: precision %d is not one of auto, fp32, bf16, int8",
                    (int)opts->precision);
  return load_built(data, size, NULL, opts_precision(opts), out);
}

static int model_load_onnx(const char *path, const es_model_options *opts, es_model **out);

/* The source an .esm names, next to it: NULL path when there is none. */
static int esm_source_stale(const char *path, const unsigned char *head, size_t head_size,
                            char *src, size_t src_size) {
  /* header layout: see esm.c; magic 16, format 4, header_size 4, version 32,
   * isa 48, sha256 32, source_name 128 */
  const size_t sha_at = 16 + 4 + 4 + 32 + 48, name_at = sha_at + 32;
  if (head_size < name_at + 128)
    return 0;
  char name[129];
  memcpy(name, head + name_at, 128);
  name[128] = '\0';
  if (!name[0] || strchr(name, '/'))
    return 0;
  const char *slash = strrchr(path, '/');
  int dir_len = slash ? (int)(slash - path + 1) : 0;
  snprintf(src, src_size, "%.*s%s", dir_len, path, name);
  struct stat st;
  if (stat(src, &st) < 0 || !S_ISREG(st.st_mode))
    return 0;
  uint8_t sha[32];
  if (es__sha256_file(src, sha, NULL) < 0)
    return 0;
  return memcmp(sha, head + sha_at, 32) != 0;
}

int es_model_load(const char *path, const es_model_options *opts, es_model **out) {
  if (!path || !out)
    return es__fail(ES_EINVAL, "es_model_load: NULL argument");
  if (opts && (unsigned)opts->precision > ES_PRECISION_INT8)
    return es__fail(ES_EINVAL, "es_model_load: precision %d is not one of auto, fp32, bf16, int8",
                    (int)opts->precision);
  /* A compiled model file is mapped, not read: look at its header first. */
  unsigned char head[512];
  ssize_t got_head = -1;
  int hfd = open(path, O_RDONLY | O_CLOEXEC);
  if (hfd >= 0) {
    got_head = read(hfd, head, sizeof head);
    close(hfd);
  }
  if (got_head > 0 && es__esm_is(head, (size_t)got_head)) {
    char src[4096];
    if (esm_source_stale(path, head, (size_t)got_head, src, sizeof src)) {
      int rc = model_load_onnx(src, opts, out);
      if (rc == 0)
        (*out)->stale_compiled = 1;
      return rc;
    }
    es_model *m = es_mem_calloc(ES_MEM_MODEL, 1, sizeof *m);
    if (!m)
      return es__fail(ES_ENOMEM, "out of memory loading the model");
    int rc = model_finish(m, es__esm_load(path, m), out);
    if (rc == 0 && (rc = precision_check(*out, opts_precision(opts))) < 0) {
      char detail[512];
      snprintf(detail, sizeof detail, "%s", es_last_error_detail());
      es_model_release(*out);
      *out = NULL;
      rc = es__fail(rc, "%s: %s", path, detail);
    }
    return rc;
  }
  return model_load_onnx(path, opts, out);
}

/* The file's bytes, mapped read-only in *buf (file_unmap gives them back).
 * Mapped, not read: the weights, nearly all of a model file, are copied
 * once into staging by the loader, and a read would first copy them into a
 * buffer of fresh pages, which costs more than the copy itself (a page
 * fault per 4 KiB; MAP_POPULATE maps the cached file in one call). The
 * mapping lives only while the model is built. As for compiled files,
 * which stay mapped for the model's life, a file truncated by someone else
 * during that time faults the process (SIGBUS): model files are replaced
 * by renaming a new one over them, never rewritten in place. Counted as
 * file-mapped bytes of ES_MEM_MODEL while mapped. */
static const unsigned char empty_file_[1];

static int file_map(const char *path, const unsigned char **buf_out, size_t *size_out) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    return es__fail(e == ENOENT ? ES_ENOENT : e == EACCES ? ES_EACCES : ES_EIO,
                    "cannot open model '%s': %s", path, strerror(e));
  }
  struct stat st;
  if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return es__fail(ES_EINVAL, "model '%s' is not a regular file", path);
  }
  if ((size_t)st.st_size > ES_MODEL_MAX_FILE) {
    close(fd);
    return es__fail(ES_EMODEL, "model '%s' is larger than 2 GiB", path);
  }
  size_t size = (size_t)st.st_size;
  const unsigned char *buf = empty_file_;
  if (size) {
    void *p = mmap(NULL, size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      close(fd);
      return es__fail(e == ENOMEM ? ES_ENOMEM : ES_EIO, "cannot map model '%s' (%zu bytes): %s",
                      path, size, strerror(e));
    }
    buf = p;
    es_mem_account_file(ES_MEM_MODEL, (long long)size);
  }
  close(fd);
  *buf_out = buf;
  *size_out = size;
  return 0;
}

static void file_unmap(const unsigned char *buf, size_t size) {
  if (!size || buf == empty_file_)
    return;
  munmap((void *)buf, size);
  es_mem_account_file(ES_MEM_MODEL, -(long long)size);
}

/* Puts the file name before the loader's detail. */
static int fail_in_file(int rc, const char *path) {
  char detail[512];
  snprintf(detail, sizeof detail, "%s", es_last_error_detail());
  return es__fail(rc, "%s: %s", path, detail);
}

static int model_load_onnx(const char *path, const es_model_options *opts, es_model **out) {
  /* Mapped shared and kept while constants are read from it in place
   * (graph.h); a file that cannot be mapped so (or is empty, or too
   * large) goes the way below, which says why. */
  es_weights *file;
  if (es_weights_open(path, 0, &file) == 0) {
    if (es_weights_size(file) <= ES_MODEL_MAX_FILE) {
      int rc = load_built(es_weights_data(file), es_weights_size(file), file,
                          opts_precision(opts), out);
      es_weights_release(file); /* the graph holds its own reference when it reads it */
      if (rc == 0 && (rc = es__prep_cache_attach(*out, path)) < 0)
        es_model_release(*out);
      return rc < 0 ? fail_in_file(rc, path) : rc;
    }
    es_weights_release(file);
  }
  const unsigned char *buf;
  size_t size;
  int rc = file_map(path, &buf, &size);
  if (rc < 0)
    return rc;
  rc = es_model_load_buffer(buf, size, opts, out);
  if (rc == 0 && (rc = es__prep_cache_attach(*out, path)) < 0)
    es_model_release(*out);
  if (rc < 0)
    fail_in_file(rc, path);
  file_unmap(buf, size);
  return rc;
}

/* ==========================================================================
 * Checking what a model needs
 * ======================================================================== */

typedef void (*issue_fn)(void *user, const es_model_issue *issue);

static int check_report(const es_model *m, const es_issues *l, const build_info *bi,
                        issue_fn fn, void *user, es_model_check_info *info) {
  for (int i = 0; fn && i < l->n; i++) {
    const es_issue *it = &l->items[i];
    es_model_issue mi = {.what = it->what, .first = it->first, .count = it->count,
                         .nodes = it->nodes, .n_where = it->n_where, .where = it->where};
    fn(user, &mi);
  }
  if (info) {
    info->issues = l->n;
    info->places = l->places;
    info->planned = bi->planned;
    info->unreached = bi->unreached;
    info->opset = m->g.opset;
    info->ir_version = m->g.ir_version;
  }
  return l->n ? es__issues_fail(l, ES_LOAD_INTRO) : 0;
}

int es_model_check_buffer(const void *data, size_t size, const es_tensor_info *shapes,
                          int n_shapes, issue_fn fn, void *user, es_model_check_info *info) {
  if (!data || (n_shapes > 0 && !shapes) || n_shapes < 0)
    return es__fail(ES_EINVAL, "es_model_check_buffer: bad argument");
  if (info)
    memset(info, 0, sizeof *info);
  es_issues l = {0};
  build_info bi = {0};
  es_model *m;
  int rc = build_model(data, size, NULL, &l, 1, shapes, n_shapes, ES_PRECISION_AUTO, &bi, &m);
  if (rc == 0) {
    rc = check_report(m, &l, &bi, fn, user, info);
    es_model_release(m);
  }
  es__issues_fini(&l);
  return rc;
}

int es_model_check(const char *path, const es_tensor_info *shapes, int n_shapes, issue_fn fn,
                   void *user, es_model_check_info *info) {
  if (!path || (n_shapes > 0 && !shapes) || n_shapes < 0)
    return es__fail(ES_EINVAL, "es_model_check: bad argument");
  if (info)
    memset(info, 0, sizeof *info);
  unsigned char head[512];
  ssize_t got_head = -1;
  int hfd = open(path, O_RDONLY | O_CLOEXEC);
  if (hfd >= 0) {
    got_head = read(hfd, head, sizeof head);
    close(hfd);
  }
  if (got_head > 0 && es__esm_is(head, (size_t)got_head)) {
    /* compiled from a model that ran: only a plan can still refuse */
    es_model *m;
    int rc = es_model_load(path, NULL, &m);
    if (rc < 0)
      return rc;
    es_issues l = {0};
    build_info bi = {0};
    int n = m->g.n_inputs, fixed = 0;
    es_tensor_info *sh = es_mem_calloc(ES_MEM_MODEL, (size_t)n + 1, sizeof *sh);
    rc = sh ? check_shapes(m, shapes, n_shapes, sh, &fixed)
            : es__fail(ES_ENOMEM, "out of memory checking the model");
    if (rc == 0 && fixed) {
      bi.planned = 1;
      rc = es__plan_diagnose(m, sh, n, &l, &bi.unreached);
    }
    if (rc == 0)
      rc = check_report(m, &l, &bi, fn, user, info);
    es_mem_free(sh);
    es__issues_fini(&l);
    es_model_release(m);
    return rc < 0 ? fail_in_file(rc, path) : 0;
  }
  const unsigned char *buf;
  size_t size;
  int rc = file_map(path, &buf, &size);
  if (rc < 0)
    return rc;
  rc = es_model_check_buffer(buf, size, shapes, n_shapes, fn, user, info);
  file_unmap(buf, size);
  return rc < 0 ? fail_in_file(rc, path) : 0;
}

es_model *es_model_retain(es_model *m) {
  if (!model_ok(m))
    return NULL;
  atomic_fetch_add_explicit(&m->refs, 1, memory_order_relaxed);
  return m;
}

void es_model_release(es_model *m) {
  if (!model_ok(m))
    return;
  if (atomic_fetch_sub_explicit(&m->refs, 1, memory_order_acq_rel) != 1)
    return;
  es__prep_store_destroy(m->prep);
  es__graph_fini(&m->g);
  m->magic = 0;
  es_mem_free(m);
}

int es_model_input_count(const es_model *m) { return model_ok(m) ? m->g.n_inputs : 0; }
int es_model_output_count(const es_model *m) { return model_ok(m) ? m->g.n_outputs : 0; }

static void info_of(const es_value *v, es_tensor_info *out) {
  out->name = v->name;
  out->dtype = v->dtype;
  out->rank = v->rank;
  for (int i = 0; i < ES_MAX_RANK; i++)
    out->dims[i] = i < v->rank ? v->dims[i] : 0;
}

int es_model_input_info(const es_model *m, int i, es_tensor_info *out) {
  if (!model_ok(m) || !out || i < 0 || i >= m->g.n_inputs)
    return es__fail(ES_EINVAL, "no input #%d", i);
  info_of(&m->g.values[m->g.inputs[i]], out);
  return 0;
}

int es_model_output_info(const es_model *m, int i, es_tensor_info *out) {
  if (!model_ok(m) || !out || i < 0 || i >= m->g.n_outputs)
    return es__fail(ES_EINVAL, "no output #%d", i);
  info_of(&m->g.values[m->g.outputs[i]], out);
  return 0;
}

int es_model_stats_get(const es_model *m, es_model_stats *out) {
  if (!model_ok(m) || !out)
    return es__fail(ES_EINVAL, "es_model_stats_get: bad argument");
  out->nodes = (size_t)m->g.n_nodes;
  out->constants = m->g.n_constants;
  out->weight_bytes = m->g.weight_bytes;
  out->weight_file_bytes = m->g.file_weight_bytes;
  out->folded_nodes = (size_t)m->g.folded_nodes;
  out->folded_bn = (size_t)m->g.folded_bn;
  out->elided = (size_t)m->g.elided;
  precision_count(&m->g, &out->int8_nodes, &out->bf16_nodes, &out->float_nodes,
                  &out->w8_nodes);
  out->context_bytes = m->g.ctx.bytes;
  out->opset = m->g.opset;
  out->compiled = m->compiled;
  out->compiled_prepared = m->compiled_prepared;
  out->stale_compiled = m->stale_compiled;
  out->prepared_bytes = es__prep_store_bytes(m->prep);
  es_prep_cache_stats cs;
  es__prep_store_cache_stats(m->prep, &cs);
  out->prepared_cached_bytes = cs.bytes;
  out->prepared_cache_hits = cs.hits;
  out->prepared_cache_writes = cs.writes;
  out->prepared_cache_errors = cs.errors;
  out->ir_version = m->g.ir_version;
  out->weights_resident = 0;
  if (m->g.weights)
    (void)es_weights_resident(m->g.weights, &out->weights_resident);
  size_t in_file = 0;
  if (m->g.file && es_weights_resident(m->g.file, &in_file) == 0)
    out->weights_resident += in_file < m->g.file_weight_bytes ? in_file : m->g.file_weight_bytes;
  return 0;
}

int es_model_op_counts(const es_model *m, void (*fn)(void *user, const char *op, int count),
                       void *user) {
  if (!model_ok(m) || !fn)
    return es__fail(ES_EINVAL, "es_model_op_counts: bad argument");
  int counts[ES_OP_COUNT] = {0};
  for (int i = 0; i < m->g.n_nodes; i++)
    counts[m->g.nodes[i].op]++;
  for (int op = 1; op < ES_OP_COUNT; op++)
    if (counts[op])
      fn(user, es__op_name((es_op)op), counts[op]);
  return 0;
}
