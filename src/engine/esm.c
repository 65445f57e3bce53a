/* Compiled model files (.esm): a model prepared once, mapped by every process.
 *
 * An .esm holds what loading an ONNX file produces, so loading it does no
 * parsing, folding or weight reordering:
 *
 *   header   magic, format, the edgeserve version and CPU ISA it was made
 *            for, the source model's name, size and SHA-256
 *   graph    the IR after folding and fusion (values, nodes, attributes)
 *   weights  every live constant, 64-byte aligned
 *   prepared weights already reordered into oneDNN's layouts, keyed as the
 *            kernels key them (es__kinst_prepared), 64-byte aligned
 *
 * Loading maps the whole file PROT_READ + MAP_SHARED through es_weights_open:
 * constants and prepared weights are used in place, so N processes serving
 * the same file share one physical copy (their PSS of the mapping is about
 * size / N). Nothing is trusted: every count, index, offset and size is
 * checked against the file before use, as the ONNX loader does.
 *
 * Mismatches never give a wrong result: a file from another edgeserve
 * version is refused with a clear error; prepared weights made for another
 * ISA are ignored (kernels prepare their own); and when the source ONNX file
 * sits next to the .esm with a different checksum, the source is loaded
 * instead (es_model_stats says so). */
#include "common/internal.h"
#include "engine/engine_internal.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef ES_VERSION_STRING
#define ES_VERSION_STRING "0.0.0"
#endif

#define ESM_MAGIC "EDGESERVE-ESM\0\0"
#define ESM_FORMAT 1
#define ESM_ALIGN 64

typedef struct esm_header {
  char magic[16];
  uint32_t format;
  uint32_t header_size;
  char version[32];       /* edgeserve version that wrote it */
  char isa[48];           /* CPU ISA and oneDNN version the prepared weights are for */
  uint8_t source_sha256[32];
  char source_name[128];  /* basename of the ONNX file */
  uint64_t source_size;
  uint64_t graph_off, graph_size;
  uint64_t weights_off, weights_size;
  uint64_t prep_off, prep_size;
  uint64_t file_size;
} esm_header;

/* ==========================================================================
 * Identity: ISA, version, checksum
 * ======================================================================== */

static void esm_isa(char *buf, size_t size) {
  const dnnl_version_t *v = dnnl_version();
  snprintf(buf, size, "isa %d dnnl %d.%d.%d", (int)dnnl_get_effective_cpu_isa(), v->major,
           v->minor, v->patch);
}

int es__sha256_file(const char *path, uint8_t out[32], uint64_t *size) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return es__fail(errno == ENOENT ? ES_ENOENT : ES_EIO, "cannot open '%s'", path);
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  int rc = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) ? 0 : ES_ENOMEM;
  unsigned char buf[65536];
  uint64_t total = 0;
  while (rc == 0) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      rc = es__fail(ES_EIO, "read error on '%s'", path);
    if (n <= 0)
      break;
    total += (uint64_t)n;
    if (!EVP_DigestUpdate(ctx, buf, (size_t)n))
      rc = ES_EIO;
  }
  unsigned int len = 0;
  if (rc == 0 && !EVP_DigestFinal_ex(ctx, out, &len))
    rc = ES_EIO;
  EVP_MD_CTX_free(ctx);
  close(fd);
  if (size)
    *size = total;
  return rc;
}

/* ==========================================================================
 * Writing
 * ======================================================================== */

typedef struct wbuf {
  unsigned char *p;
  size_t n, cap;
  int err;
} wbuf;

static void put(wbuf *b, const void *src, size_t n) {
  if (b->err)
    return;
  if (b->n + n > b->cap) {
    size_t cap = b->cap ? b->cap : 65536;
    while (cap < b->n + n)
      cap *= 2;
    unsigned char *q = b->p ? es_mem_realloc(b->p, cap) : es_mem_alloc(ES_MEM_ENGINE, cap);
    if (!q) {
      b->err = 1;
      return;
    }
    b->p = q;
    b->cap = cap;
  }
  if (n)
    memcpy(b->p + b->n, src, n);
  b->n += n;
}

static void put_u32(wbuf *b, uint32_t v) { put(b, &v, 4); }
static void put_i32(wbuf *b, int32_t v) { put(b, &v, 4); }
static void put_u64(wbuf *b, uint64_t v) { put(b, &v, 8); }
static void put_i64(wbuf *b, int64_t v) { put(b, &v, 8); }
static void put_str(wbuf *b, const char *s) {
  uint32_t n = s ? (uint32_t)strlen(s) : 0;
  put_u32(b, n);
  put(b, s, n);
}
static void pad_to(wbuf *b, size_t align) {
  static const unsigned char zeros[ESM_ALIGN];
  size_t r = b->n % align;
  if (r)
    put(b, zeros, align - r);
}

static void graph_write(wbuf *b, const es_graph *g, const uint64_t *data_off) {
  put_u32(b, (uint32_t)g->n_values);
  put_u32(b, (uint32_t)g->n_nodes);
  put_u32(b, (uint32_t)g->n_inputs);
  put_u32(b, (uint32_t)g->n_outputs);
  put_i64(b, g->opset);
  put_i64(b, g->ir_version);
  put_i32(b, g->folded_nodes);
  put_i32(b, g->folded_bn);
  for (int v = 0; v < g->n_values; v++) {
    const es_value *val = &g->values[v];
    put_str(b, val->name);
    put_i32(b, (int32_t)val->dtype);
    put_i32(b, val->rank);
    for (int d = 0; d < (val->rank > 0 ? val->rank : 0); d++)
      put_i64(b, val->dims[d]);
    put_i32(b, (int32_t)val->kind);
    put_i32(b, val->is_output);
    put_u64(b, data_off[v]);
    put_u64(b, val->nbytes);
  }
  for (int n = 0; n < g->n_nodes; n++) {
    const es_node *nd = &g->nodes[n];
    put_str(b, nd->name);
    put_str(b, es__op_name(nd->op));
    put_i32(b, nd->file_index);
    put_i32(b, nd->n_in);
    for (int i = 0; i < nd->n_in; i++)
      put_i32(b, nd->in[i]);
    put_i32(b, nd->n_out);
    for (int i = 0; i < nd->n_out; i++)
      put_i32(b, nd->out[i]);
    put_i32(b, nd->n_attr);
    for (int a = 0; a < nd->n_attr; a++) {
      const es_attr *at = &nd->attrs[a];
      put_str(b, at->name);
      put_i32(b, (int32_t)at->type);
      put(b, &at->f, 4);
      put_i64(b, at->i);
      put_str(b, at->type == ES_ATTR_STRING ? at->s : "");
      int listed = at->type == ES_ATTR_INTS || at->type == ES_ATTR_FLOATS ||
                   at->type == ES_ATTR_STRINGS;
      uint64_t cnt = listed ? at->n : 0;
      put_u64(b, cnt);
      if (at->type == ES_ATTR_INTS)
        put(b, at->ints, cnt * 8);
      else if (at->type == ES_ATTR_FLOATS)
        put(b, at->floats, cnt * 4);
      else if (at->type == ES_ATTR_STRINGS)
        for (uint64_t i = 0; i < cnt; i++)
          put_str(b, at->strs[i]);
      put_i32(b, at->type == ES_ATTR_TENSOR ? at->tensor : -1);
    }
  }
  for (int i = 0; i < g->n_inputs; i++)
    put_i32(b, g->inputs[i]);
  for (int i = 0; i < g->n_outputs; i++)
    put_i32(b, g->outputs[i]);
}

typedef struct prep_collect {
  wbuf table, data; /* data offsets are relative to the data area */
  uint32_t count;
} prep_collect;

static int prep_one(void *user, const char *key, const void *data, size_t size) {
  prep_collect *c = user;
  pad_to(&c->data, ESM_ALIGN);
  put_str(&c->table, key);
  put_u64(&c->table, c->data.n);
  put_u64(&c->table, size);
  put(&c->data, data, size);
  c->count++;
  return c->table.err || c->data.err
             ? es__fail(ES_ENOMEM, "out of memory compiling the prepared weights")
             : 0;
}

int es_model_compile(es_model *m, const char *source_path, const char *out_path) {
  if (!es__model_ok(m) || !out_path)
    return es__fail(ES_EINVAL, "es_model_compile: bad argument");
  const es_graph *g = &m->g;
  if (g->n_bodies)
    return es__fail(ES_ENOTSUP, "compiling a model with Loop or Scan bodies is not supported "
                    "(serve the .onnx file)");
  esm_header h;
  memset(&h, 0, sizeof h);
  memcpy(h.magic, ESM_MAGIC, 16);
  h.format = ESM_FORMAT;
  h.header_size = sizeof h;
  snprintf(h.version, sizeof h.version, "%s", ES_VERSION_STRING);
  esm_isa(h.isa, sizeof h.isa);
  if (source_path) {
    int rc = es__sha256_file(source_path, h.source_sha256, &h.source_size);
    if (rc < 0)
      return rc;
    const char *base = strrchr(source_path, '/');
    snprintf(h.source_name, sizeof h.source_name, "%s", base ? base + 1 : source_path);
  }
  uint64_t *data_off = es_mem_calloc(ES_MEM_ENGINE, (size_t)g->n_values + 1, sizeof *data_off);
  wbuf weights = {0}, graph = {0}, file = {0};
  prep_collect pc = {0};
  int rc = data_off ? 0 : es__fail(ES_ENOMEM, "out of memory compiling");
  for (int v = 0; rc == 0 && v < g->n_values; v++) {
    const es_value *val = &g->values[v];
    data_off[v] = UINT64_MAX;
    if (val->kind != ES_VALUE_CONST || !val->data)
      continue;
    pad_to(&weights, ESM_ALIGN);
    data_off[v] = weights.n;
    put(&weights, val->data, val->nbytes);
  }
  if (rc == 0) {
    graph_write(&graph, g, data_off);
    rc = es__prep_store_each(m->prep, prep_one, &pc);
  }
  if (rc == 0 && (weights.err || graph.err || pc.table.err || pc.data.err))
    rc = es__fail(ES_ENOMEM, "out of memory compiling");
  if (rc == 0) {
    /* header | graph | weights | prep table | prep data, sections 64-aligned */
    put(&file, &h, sizeof h);
    pad_to(&file, ESM_ALIGN);
    h.graph_off = file.n;
    h.graph_size = graph.n;
    put(&file, graph.p, graph.n);
    pad_to(&file, ESM_ALIGN);
    h.weights_off = file.n;
    h.weights_size = weights.n;
    put(&file, weights.p, weights.n);
    pad_to(&file, ESM_ALIGN);
    h.prep_off = file.n;
    put_u32(&file, pc.count);
    put(&file, pc.table.p, pc.table.n);
    pad_to(&file, ESM_ALIGN);
    uint64_t data_base = file.n;
    put(&file, pc.data.p, pc.data.n);
    h.prep_size = file.n - h.prep_off;
    h.file_size = file.n;
    /* prep table offsets become file offsets: rewrite them in place */
    if (!file.err) {
      unsigned char *t = file.p + h.prep_off + 4;
      for (uint32_t i = 0; i < pc.count; i++) {
        uint32_t klen;
        memcpy(&klen, t, 4);
        t += 4 + klen;
        uint64_t off;
        memcpy(&off, t, 8);
        off += data_base;
        memcpy(t, &off, 8);
        t += 16;
      }
      memcpy(file.p, &h, sizeof h);
    }
    if (file.err)
      rc = es__fail(ES_ENOMEM, "out of memory compiling");
  }
  if (rc == 0) {
    /* write to a temporary name and rename: readers never see half a file,
     * and a mapped old version stays intact */
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", out_path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) {
      rc = es__fail(ES_EIO, "cannot create '%s'", tmp);
    } else {
      int ok = fwrite(file.p, 1, file.n, f) == file.n;
      ok = fclose(f) == 0 && ok;
      if (!ok || rename(tmp, out_path) < 0) {
        unlink(tmp);
        rc = es__fail(ES_EIO, "cannot write '%s'", out_path);
      }
    }
  }
  es_mem_free(data_off);
  es_mem_free(weights.p);
  es_mem_free(graph.p);
  es_mem_free(pc.table.p);
  es_mem_free(pc.data.p);
  es_mem_free(file.p);
  return rc;
}

/* ==========================================================================
 * Reading
 * ======================================================================== */

typedef struct rcur {
  const unsigned char *p, *end;
  int bad;
  int oom; /* bad because a copy could not be allocated: ES_ENOMEM, not corrupt */
} rcur;

static int take(rcur *c, void *dst, size_t n) {
  if (c->bad || (size_t)(c->end - c->p) < n) {
    c->bad = 1;
    if (dst)
      memset(dst, 0, n);
    return -1;
  }
  if (dst)
    memcpy(dst, c->p, n);
  c->p += n;
  return 0;
}

static uint32_t get_u32(rcur *c) {
  uint32_t v;
  take(c, &v, 4);
  return v;
}
static int32_t get_i32(rcur *c) {
  int32_t v;
  take(c, &v, 4);
  return v;
}
static uint64_t get_u64(rcur *c) {
  uint64_t v;
  take(c, &v, 8);
  return v;
}
static int64_t get_i64(rcur *c) {
  int64_t v;
  take(c, &v, 8);
  return v;
}

/* A string copied into graph memory; NULL when malformed or OOM. */
static const char *get_str(rcur *c, es_ctx *ctx) {
  uint32_t n = get_u32(c);
  if (c->bad || n > 65536 || (size_t)(c->end - c->p) < n) {
    c->bad = 1;
    return NULL;
  }
  char *s = es__ctx_alloc(ctx, (size_t)n + 1);
  if (!s) {
    c->bad = 1;
    c->oom = 1;
    return NULL;
  }
  memcpy(s, c->p, n);
  c->p += n;
  if (memchr(s, '\0', n))
    c->bad = 1;
  return s;
}

#define BAD(...) es__fail(ES_EMODEL, __VA_ARGS__)

static int graph_read(rcur *c, es_graph *g, const unsigned char *weights, uint64_t wsize) {
  uint32_t nv = get_u32(c), nn = get_u32(c), ni = get_u32(c), no = get_u32(c);
  g->opset = get_i64(c);
  g->ir_version = get_i64(c);
  g->folded_nodes = get_i32(c);
  g->folded_bn = get_i32(c);
  /* every value and node takes at least 8 bytes in the file */
  size_t left = (size_t)(c->end - c->p);
  if (c->bad || nv > left / 8 || nn > left / 8 || ni > nv || no > nv || nv > (1u << 24))
    return BAD("compiled model: graph counts are corrupt");
  g->values = es__ctx_alloc(&g->ctx, ((size_t)nv + 1) * sizeof *g->values);
  g->nodes = es__ctx_alloc(&g->ctx, ((size_t)nn + 1) * sizeof *g->nodes);
  g->inputs = es__ctx_alloc(&g->ctx, ((size_t)ni + 1) * sizeof(int));
  g->outputs = es__ctx_alloc(&g->ctx, ((size_t)no + 1) * sizeof(int));
  if (!g->values || !g->nodes || !g->inputs || !g->outputs)
    return es__fail(ES_ENOMEM, "out of memory loading a compiled model");
  g->cap_values = (int)nv;
  size_t consts = 0;
  for (uint32_t v = 0; v < nv; v++) {
    es_value *val = &g->values[v];
    val->name = get_str(c, &g->ctx);
    val->dtype = (es_dtype)get_i32(c);
    val->rank = get_i32(c);
    if (c->bad || val->rank < -1 || val->rank > ES_MAX_RANK ||
        (val->dtype != ES_DTYPE_UNDEFINED && es_dtype_size(val->dtype) == 0))
      return BAD("compiled model: value #%u is corrupt", v);
    for (int d = 0; d < val->rank; d++)
      val->dims[d] = get_i64(c);
    val->kind = (es_value_kind)get_i32(c);
    val->is_output = get_i32(c) != 0;
    uint64_t off = get_u64(c);
    val->nbytes = (size_t)get_u64(c);
    val->producer = -1;
    if (c->bad || (val->kind != ES_VALUE_INPUT && val->kind != ES_VALUE_CONST &&
                   val->kind != ES_VALUE_ACT))
      return BAD("compiled model: value #%u is corrupt", v);
    if (val->kind == ES_VALUE_CONST && off != UINT64_MAX) {
      uint64_t n = 1;
      for (int d = 0; d < val->rank; d++)
        if (val->dims[d] < 0 || __builtin_mul_overflow(n, (uint64_t)val->dims[d], &n))
          return BAD("compiled model: constant '%s' has a corrupt shape", val->name);
      if (val->rank < 0 || n * es_dtype_size(val->dtype) != val->nbytes ||
          off % ESM_ALIGN || off > wsize || val->nbytes > wsize - off)
        return BAD("compiled model: constant '%s' lies outside its section", val->name);
      val->data = weights + off;
      consts++;
    }
  }
  g->n_values = (int)nv;
  for (uint32_t n = 0; n < nn; n++) {
    es_node *nd = &g->nodes[n];
    nd->name = get_str(c, &g->ctx);
    const char *op = get_str(c, &g->ctx);
    nd->file_index = get_i32(c);
    if (c->bad || !op)
      return BAD("compiled model: node #%u is corrupt", n);
    nd->op = es__op_from_name(op);
    if (nd->op == ES_OP_UNKNOWN) {
      /* internal operators are written by name too */
      for (int k = 1; k < ES_OP_COUNT; k++)
        if (!strcmp(es__op_name((es_op)k), op))
          nd->op = (es_op)k;
      if (nd->op == ES_OP_UNKNOWN)
        return es__fail(ES_ENOTSUP, "compiled model: node #%u has unknown operator '%s'", n, op);
    }
    int32_t nin = get_i32(c);
    if (c->bad || nin < 0 || nin > 4096)
      return BAD("compiled model: node #%u is corrupt", n);
    nd->n_in = nin;
    nd->in = es__ctx_alloc(&g->ctx, ((size_t)nin + 1) * sizeof(int));
    for (int i = 0; nd->in && i < nin; i++)
      if ((nd->in[i] = get_i32(c)) < -1 || nd->in[i] >= (int)nv)
        c->bad = 1;
    int32_t nout = get_i32(c);
    if (c->bad || !nd->in || nout < 1 || nout > 4096)
      return BAD("compiled model: node #%u is corrupt", n);
    nd->n_out = nout;
    nd->out = es__ctx_alloc(&g->ctx, ((size_t)nout + 1) * sizeof(int));
    for (int i = 0; nd->out && i < nout; i++)
      if ((nd->out[i] = get_i32(c)) < -1 || nd->out[i] >= (int)nv)
        c->bad = 1;
    int32_t na = get_i32(c);
    if (c->bad || !nd->out || na < 0 || na > 4096)
      return BAD("compiled model: node #%u is corrupt", n);
    nd->n_attr = na;
    nd->attrs = es__ctx_alloc(&g->ctx, ((size_t)na + 1) * sizeof(es_attr));
    if (!nd->attrs)
      return es__fail(ES_ENOMEM, "out of memory loading a compiled model");
    for (int a = 0; a < na; a++) {
      es_attr *at = &nd->attrs[a];
      at->name = get_str(c, &g->ctx);
      at->type = (es_attr_type)get_i32(c);
      take(c, &at->f, 4);
      at->i = get_i64(c);
      at->s = get_str(c, &g->ctx);
      uint64_t cnt = get_u64(c);
      if (c->bad || cnt > (uint64_t)(c->end - c->p) / 4)
        return BAD("compiled model: attribute of node #%u is corrupt", n);
      at->n = (size_t)cnt;
      if (at->type == ES_ATTR_INTS) {
        int64_t *v = es__ctx_alloc(&g->ctx, at->n * 8 + 8);
        if (!v || take(c, v, at->n * 8) < 0)
          return BAD("compiled model: attribute of node #%u is corrupt", n);
        at->ints = v;
      } else if (at->type == ES_ATTR_FLOATS) {
        float *v = es__ctx_alloc(&g->ctx, at->n * 4 + 4);
        if (!v || take(c, v, at->n * 4) < 0)
          return BAD("compiled model: attribute of node #%u is corrupt", n);
        at->floats = v;
      } else if (at->type == ES_ATTR_STRINGS) {
        /* each string is at least its 4-byte length: cnt is bounded above */
        const char **v = es__ctx_alloc(&g->ctx, (at->n + 1) * sizeof *v);
        if (!v)
          return es__fail(ES_ENOMEM, "out of memory loading a compiled model");
        for (size_t i = 0; i < at->n; i++)
          if (!(v[i] = get_str(c, &g->ctx)))
            return BAD("compiled model: attribute of node #%u is corrupt", n);
        at->strs = v;
      } else if (cnt) {
        return BAD("compiled model: attribute of node #%u is corrupt", n);
      }
      at->tensor = get_i32(c);
      if (c->bad || (at->type == ES_ATTR_TENSOR &&
                     (at->tensor < 0 || at->tensor >= (int)nv ||
                      g->values[at->tensor].kind != ES_VALUE_CONST)))
        return BAD("compiled model: attribute of node #%u is corrupt", n);
    }
    for (int i = 0; i < nd->n_out; i++)
      if (nd->out[i] >= 0) {
        if (g->values[nd->out[i]].kind != ES_VALUE_ACT || g->values[nd->out[i]].producer >= 0)
          return BAD("compiled model: value '%s' is produced twice",
                     g->values[nd->out[i]].name);
        g->values[nd->out[i]].producer = (int)n;
      }
  }
  g->n_nodes = (int)nn;
  for (uint32_t i = 0; i < ni; i++) {
    g->inputs[i] = get_i32(c);
    if (c->bad || g->inputs[i] < 0 || g->inputs[i] >= (int)nv ||
        g->values[g->inputs[i]].kind != ES_VALUE_INPUT)
      return BAD("compiled model: graph input #%u is corrupt", i);
  }
  for (uint32_t i = 0; i < no; i++) {
    g->outputs[i] = get_i32(c);
    if (c->bad || g->outputs[i] < 0 || g->outputs[i] >= (int)nv)
      return BAD("compiled model: graph output #%u is corrupt", i);
  }
  g->n_inputs = (int)ni;
  g->n_outputs = (int)no;
  g->n_constants = consts;
  return 0;
}

int es__esm_is(const void *data, size_t size) {
  return size >= 16 && !memcmp(data, ESM_MAGIC, 16);
}

int es__esm_load(const char *path, es_model *m) {
  es_weights *w = NULL;
  int rc = es_weights_open(path, 0, &w);
  if (rc < 0)
    return rc;
  const unsigned char *base = es_weights_data(w);
  size_t size = es_weights_size(w);
  esm_header h;
  if (size < sizeof h) {
    es_weights_release(w);
    return BAD("%s: too short for a compiled model", path);
  }
  memcpy(&h, base, sizeof h);
  if (memcmp(h.magic, ESM_MAGIC, 16) || h.header_size != sizeof h || h.file_size != size) {
    es_weights_release(w);
    return BAD("%s: not a compiled model, or truncated", path);
  }
  if (h.format != ESM_FORMAT || strncmp(h.version, ES_VERSION_STRING, sizeof h.version)) {
    es_weights_release(w);
    return es__fail(ES_ENOTSUP,
                    "%s was compiled by edgeserve %.32s (format %u); this is %s (format %d): "
                    "compile it again",
                    path, h.version, h.format, ES_VERSION_STRING, ESM_FORMAT);
  }
  if (h.graph_off > size || h.graph_size > size - h.graph_off || h.weights_off > size ||
      h.weights_size > size - h.weights_off || h.weights_off % ESM_ALIGN || h.prep_off > size ||
      h.prep_size > size - h.prep_off) {
    es_weights_release(w);
    return BAD("%s: section table is corrupt", path);
  }
  es_graph *g = &m->g;
  rcur c = {base + h.graph_off, base + h.graph_off + h.graph_size, 0, 0};
  rc = graph_read(&c, g, base + h.weights_off, h.weights_size);
  if (rc < 0 && c.oom)
    rc = es__fail(ES_ENOMEM, "%s: out of memory loading a compiled model", path);
  if (rc == 0)
    rc = es__graph_toposort(g); /* refuses cycles; the order is already right */
  if (rc == 0) {
    es__graph_prune(g);
    g->weights = w; /* the graph holds the mapping's reference */
    g->weight_bytes = es__graph_const_bytes(g);
    rc = es__graph_attrs_resolve(g);
    if (rc == 0)
      rc = es__prep_store_create(&m->prep);
  } else {
    /* constants point into the mapping, not at blocks of their own: the
     * graph must not free them */
    for (int v = 0; v < g->cap_values && g->values; v++)
      if (g->values[v].kind == ES_VALUE_CONST)
        g->values[v].data = NULL;
    es_weights_release(w);
    return rc;
  }
  /* Prepared weights are ISA-specific: use them only on the ISA they were
   * made for; elsewhere kernels prepare their own (never a wrong layout). */
  char isa[48];
  esm_isa(isa, sizeof isa);
  if (rc == 0 && !strncmp(isa, h.isa, sizeof h.isa)) {
    rcur p = {base + h.prep_off, base + h.prep_off + h.prep_size, 0, 0};
    uint32_t count = get_u32(&p);
    es_ctx tmp = {0};
    for (uint32_t i = 0; rc == 0 && i < count; i++) {
      const char *key = get_str(&p, &tmp);
      uint64_t off = get_u64(&p), len = get_u64(&p);
      if (p.oom)
        rc = es__fail(ES_ENOMEM, "%s: out of memory loading a compiled model", path);
      else if (p.bad || !key || off % ESM_ALIGN || off > size || len > size - off)
        rc = BAD("%s: prepared weights table is corrupt", path);
      else
        rc = es__prep_store_add(m->prep, key, w, base + off, (size_t)len);
    }
    es__ctx_free_all(&tmp);
    m->compiled_prepared = (int)count;
  }
  m->compiled = 1;
  return rc;
}
