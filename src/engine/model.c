/* es_model: a loaded graph plus its read-only weights, shared by reference.
 *
 * The model is immutable after es_model_load returns, which is what makes it
 * safe to share between threads without locks; only the reference count
 * changes, atomically. */
#include "edgeserve/engine.h"
#include "common/internal.h"
#include "engine/engine_internal.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ES_MODEL_MAX_FILE ((size_t)2 << 30)

static int model_ok(const es_model *m) { return es__model_ok(m); }

int es__graph_load_lowered(const void *data, size_t size, es_graph *g) {
  int rc = es__onnx_load(data, size, g);
  if (rc < 0)
    return rc;
  if ((rc = es__graph_fold(g)) == 0 && (rc = es__graph_fuse(g)) == 0)
    rc = es__graph_seal(g);
  if (rc < 0)
    es__graph_fini(g);
  return rc;
}

/* The last step of every load: a model whose graph (and store) were made
 * with status rc becomes the caller's reference, or is freed. */
static int model_finish(es_model *m, int rc, es_model **out) {
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

int es_model_load_buffer(const void *data, size_t size, const void *opts, es_model **out) {
  (void)opts;
  if (!data || !out)
    return es__fail(ES_EINVAL, "es_model_load_buffer: NULL argument");
  es_model *m = es_mem_calloc(ES_MEM_MODEL, 1, sizeof *m);
  if (!m)
    return es__fail(ES_ENOMEM, "out of memory loading the model");
  int rc = es__graph_load_lowered(data, size, &m->g);
  if (rc < 0) {
    es_mem_free(m);
    return rc;
  }
  return model_finish(m, es__prep_store_create(&m->prep), out);
}

static int model_load_onnx(const char *path, const void *opts, es_model **out);

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

int es_model_load(const char *path, const void *opts, es_model **out) {
  if (!path || !out)
    return es__fail(ES_EINVAL, "es_model_load: NULL argument");
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
    return model_finish(m, es__esm_load(path, m), out);
  }
  return model_load_onnx(path, opts, out);
}

static int model_load_onnx(const char *path, const void *opts, es_model **out) {
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
  unsigned char *buf = es_mem_alloc(ES_MEM_MODEL, size ? size : 1);
  if (!buf) {
    close(fd);
    return es__fail(ES_ENOMEM, "out of memory reading '%s' (%zu bytes)", path, size);
  }
  size_t got = 0;
  while (got < size) {
    ssize_t n = read(fd, buf + got, size - got);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    got += (size_t)n;
  }
  close(fd);
  int rc;
  if (got != size) {
    rc = es__fail(ES_EIO, "short read of '%s' (%zu of %zu bytes)", path, got, size);
  } else {
    rc = es_model_load_buffer(buf, size, opts, out);
    if (rc < 0) {
      /* prefix the file name to the loader's detail */
      char detail[400];
      snprintf(detail, sizeof detail, "%s", es_last_error_detail());
      es__fail(rc, "%s: %s", path, detail);
    }
  }
  es_mem_free(buf);
  return rc;
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
  out->folded_nodes = (size_t)m->g.folded_nodes;
  out->folded_bn = (size_t)m->g.folded_bn;
  out->context_bytes = m->g.ctx.bytes;
  out->opset = m->g.opset;
  out->compiled = m->compiled;
  out->compiled_prepared = m->compiled_prepared;
  out->stale_compiled = m->stale_compiled;
  out->prepared_bytes = es__prep_store_bytes(m->prep);
  out->ir_version = m->g.ir_version;
  out->weights_resident = 0;
  if (m->g.weights)
    (void)es_weights_resident(m->g.weights, &out->weights_resident);
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
