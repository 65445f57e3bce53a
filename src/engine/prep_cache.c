/* The prepared-weights cache: oneDNN's reordered weights kept in files, so a
 * model loaded again (a restart, another process, another instance) maps
 * them instead of making them.
 *
 * Why: a plan reorders every convolution and linear layer's weights into
 * oneDNN's blocked layout once. For vit_b_16 that is 311 MB written into
 * fresh memory, which the kernel must first zero: about 200 ms, nearly all
 * of loading and planning the model, and a private copy in every process.
 * Mapped from a file, the same bytes cost neither, and every process on the
 * box shares one physical copy (page cache), like the model's own weights.
 *
 * What is cached: one file per batch of prepared weights (the new entries of
 * one plan, es__prep_batch_commit), named after a SHA-256 of
 *   - the model file's identity: its real path, device, inode, size, and
 *     modification and change times (ns), so that a file replaced or
 *     rewritten, even with the same size, is a different model; the content
 *     is not hashed, which would cost as much as reading the model;
 *   - the edgeserve version, oneDNN's version and the CPU ISA it picked;
 *   - every entry's key (node, layout and layout hash), offset and size.
 *
 *   header   magic, format, version, ISA, the SHA-256 above, counts
 *   table    per entry: key, offset, size (must equal what is asked for)
 *   data     page-aligned, the entries back to back as the batch lays them
 *
 * Files are written to a temporary name, synced, then renamed: a reader sees
 * a whole file or none, and a power cut cannot leave a renamed file whose
 * data never reached the disk. A file that does not check out (truncated,
 * another format, a table that differs) is removed and the batch is made
 * again. Files are never rewritten in place (a mapped file cut short would
 * fault its readers). Whoever can write a file in the directory decides the
 * weights, so a directory owned by another user, or that its group or
 * others may write, is not used at all (an error in the stats). Nothing
 * is evicted: a directory holds a file per model version and plan shape,
 * removed by whoever owns the directory. */
#include "common/internal.h"
#include "engine/engine_internal.h"

#include <fcntl.h>
#include <limits.h>
#include <oneapi/dnnl/dnnl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef ES_VERSION_STRING
#define ES_VERSION_STRING "0.0.0"
#endif

#define ESP_MAGIC "EDGESERVE-PREP\0\0"
#define ESP_FORMAT 1
#define ESP_PAGE 4096
#define ESP_MAX_KEY 4096

typedef struct esp_header {
  char magic[16];
  uint32_t format;
  uint32_t count;
  char version[32];
  char isa[48];
  uint8_t id[32];
  uint64_t table_off, table_size;
  uint64_t data_off, data_size;
  uint64_t file_size;
} esp_header;

/* One model's cache: where its files go and what the model is. */
typedef struct esp_ctx {
  char prefix[PATH_MAX + 80]; /* directory + '/' + the model file's stem */
  uint8_t ident[32];
} esp_ctx;

static pthread_mutex_t dir_lock_ = PTHREAD_MUTEX_INITIALIZER;
static char dir_[PATH_MAX];

int es_engine_cache_dir_set(const char *dir) {
  if (dir && strlen(dir) >= sizeof dir_ - 64)
    return es__fail(ES_EINVAL, "cache directory path is too long");
  pthread_mutex_lock(&dir_lock_);
  snprintf(dir_, sizeof dir_, "%s", dir ? dir : "");
  pthread_mutex_unlock(&dir_lock_);
  return 0;
}

int es_engine_cache_dir_get(char *buf, size_t size) {
  if (!buf || !size)
    return es__fail(ES_EINVAL, "es_engine_cache_dir_get: no buffer");
  pthread_mutex_lock(&dir_lock_);
  size_t n = strlen(dir_);
  int rc = n < size ? (memcpy(buf, dir_, n + 1), (int)n)
                    : es__fail(ES_EINVAL, "cache directory path is longer than the buffer");
  pthread_mutex_unlock(&dir_lock_);
  return rc;
}

static void esp_isa(char *buf, size_t size) {
  const dnnl_version_t *v = dnnl_version();
  snprintf(buf, size, "isa %d dnnl %d.%d.%d", (int)dnnl_get_effective_cpu_isa(), v->major,
           v->minor, v->patch);
}

static int sha_add(EVP_MD_CTX *c, const void *p, size_t n) {
  return EVP_DigestUpdate(c, p, n) ? 0 : ES_ENOMEM;
}

/* The batch's name: the model's identity, then every entry. */
static int esp_id(const esp_ctx *x, const es_prep_cache_entry *e, int n, size_t total,
                  uint8_t id[32]) {
  EVP_MD_CTX *c = EVP_MD_CTX_new();
  int rc = c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) ? 0 : ES_ENOMEM;
  uint64_t t = total, cnt = (uint64_t)n;
  if (rc == 0)
    rc = sha_add(c, x->ident, 32);
  if (rc == 0)
    rc = sha_add(c, &cnt, 8);
  for (int i = 0; rc == 0 && i < n; i++) {
    uint64_t v[2] = {e[i].offset, e[i].bytes};
    rc = sha_add(c, e[i].key, strlen(e[i].key) + 1);
    if (rc == 0)
      rc = sha_add(c, v, sizeof v);
  }
  if (rc == 0)
    rc = sha_add(c, &t, 8);
  unsigned len = 0;
  if (rc == 0 && !EVP_DigestFinal_ex(c, id, &len))
    rc = ES_ENOMEM;
  EVP_MD_CTX_free(c);
  return rc < 0 ? es__fail(rc, "hashing a prepared-weights batch") : 0;
}

static void esp_path(const esp_ctx *x, const uint8_t id[32], char *buf, size_t size) {
  char hex[17];
  for (int i = 0; i < 8; i++)
    snprintf(hex + 2 * i, 3, "%02x", id[i]);
  snprintf(buf, size, "%s-%s.esp", x->prefix, hex);
}

static void esp_header_fill(esp_header *h, const uint8_t id[32], int n) {
  memset(h, 0, sizeof *h);
  memcpy(h->magic, ESP_MAGIC, 16);
  h->format = ESP_FORMAT;
  h->count = (uint32_t)n;
  snprintf(h->version, sizeof h->version, "%s", ES_VERSION_STRING);
  esp_isa(h->isa, sizeof h->isa);
  memcpy(h->id, id, 32);
}

/* The table as it must read: per entry u32 key length, key, u64 offset,
 * u64 size. Caller frees. */
static unsigned char *esp_table(const es_prep_cache_entry *e, int n, size_t *size) {
  size_t sz = 0;
  for (int i = 0; i < n; i++)
    sz += 4 + strlen(e[i].key) + 16;
  unsigned char *t = es_mem_alloc(ES_MEM_ENGINE, sz ? sz : 1), *p = t;
  for (int i = 0; t && i < n; i++) {
    uint32_t kl = (uint32_t)strlen(e[i].key);
    uint64_t v[2] = {e[i].offset, e[i].bytes};
    memcpy(p, &kl, 4);
    memcpy(p + 4, e[i].key, kl);
    memcpy(p + 4 + kl, v, 16);
    p += 4 + kl + 16;
  }
  *size = sz;
  return t;
}

/* The directory part of the context's prefix into dir. */
static void esp_dir(const esp_ctx *x, char *dir, size_t size) {
  snprintf(dir, size, "%s", x->prefix);
  char *slash = strrchr(dir, '/');
  if (slash && slash != dir)
    *slash = '\0';
}

/* Whoever can write into the directory decides the weights models run
 * with, so a directory another user owns, or that its group or others may
 * write, is not used (as ssh treats a key file others can write).
 * ES_ENOENT when it does not exist (nor can: a file is in its path). */
static int esp_dir_safe(const char *dir) {
  struct stat st;
  if (lstat(dir, &st) < 0)
    return errno == ENOENT || errno == ENOTDIR
               ? ES_ENOENT
               : es__fail(ES_EIO, "cache directory '%s': %s", dir, strerror(errno));
  if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH)))
    return es__fail(ES_EACCES, "cache directory '%s' is not a directory of this user's that "
                    "only it may write: not used", dir);
  return 0;
}

static int esp_find(void *ctx, const es_prep_cache_entry *e, int n, size_t total, es_weights **w,
                    const unsigned char **base) {
  const esp_ctx *x = ctx;
  uint8_t id[32];
  char path[PATH_MAX + 120], dir[PATH_MAX + 80];
  esp_dir(x, dir, sizeof dir);
  int rc = esp_dir_safe(dir);
  if (rc < 0)
    return rc;
  rc = esp_id(x, e, n, total, id);
  if (rc < 0)
    return rc;
  esp_path(x, id, path, sizeof path);
  struct stat st;
  if (stat(path, &st) < 0)
    return ES_ENOENT;
  es_weights *f = NULL;
  if ((rc = es_weights_open(path, 0, &f)) < 0)
    return rc;
  /* Checked against what this batch needs, field by field: a file that
   * fails is removed (it can only be damaged or from another format). */
  const unsigned char *p = es_weights_data(f);
  size_t size = es_weights_size(f), tsize = 0;
  esp_header want, h;
  esp_header_fill(&want, id, n);
  unsigned char *table = esp_table(e, n, &tsize);
  int ok = table && size >= sizeof h;
  if (ok) {
    memcpy(&h, p, sizeof h);
    ok = !memcmp(h.magic, want.magic, 16) && h.format == want.format && h.count == want.count &&
         !memcmp(h.version, want.version, sizeof h.version) &&
         !memcmp(h.isa, want.isa, sizeof h.isa) && !memcmp(h.id, id, 32) &&
         h.file_size == size && h.table_off >= sizeof h && h.table_size == tsize &&
         h.table_off <= size && h.table_size <= size - h.table_off &&
         h.table_off + h.table_size <= h.data_off && h.data_off % ESP_PAGE == 0 &&
         h.data_size >= total && h.data_off <= size && h.data_size <= size - h.data_off &&
         !memcmp(p + h.table_off, table, tsize);
  }
  es_mem_free(table);
  if (!ok) {
    es_weights_release(f);
    unlink(path);
    return es__fail(ES_ECORRUPT, "prepared-weights cache file '%s' does not check out: removed",
                    path);
  }
  *w = f;
  *base = p + h.data_off;
  return 0;
}

static int write_all(int fd, const void *p, size_t n) {
  const unsigned char *b = p;
  while (n) {
    ssize_t k = write(fd, b, n > (1u << 30) ? (1u << 30) : n);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0)
      return -1;
    b += k, n -= (size_t)k;
  }
  return 0;
}

static int esp_store(void *ctx, const es_prep_cache_entry *e, int n, size_t total,
                     const unsigned char *data, es_weights **w, const unsigned char **base) {
  const esp_ctx *x = ctx;
  uint8_t id[32];
  char path[PATH_MAX + 120], tmp[PATH_MAX + 160];
  int rc = esp_id(x, e, n, total, id);
  if (rc < 0)
    return rc;
  esp_path(x, id, path, sizeof path);
  /* the directory itself may not exist yet (one level is made) */
  char dir[PATH_MAX + 80];
  esp_dir(x, dir, sizeof dir);
  if (mkdir(dir, 0755) < 0 && errno != EEXIST)
    return es__fail(ES_EIO, "cannot make the cache directory '%s': %s", dir, strerror(errno));
  if ((rc = esp_dir_safe(dir)) < 0)
    return rc;
  esp_header h;
  esp_header_fill(&h, id, n);
  size_t tsize = 0;
  unsigned char *table = esp_table(e, n, &tsize);
  if (!table)
    return es__fail(ES_ENOMEM, "out of memory writing the prepared-weights cache");
  h.table_off = sizeof h;
  h.table_size = tsize;
  h.data_off = es__align_up(h.table_off + tsize, ESP_PAGE);
  h.data_size = total;
  h.file_size = h.data_off + total;
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    es_mem_free(table);
    return es__fail(ES_EIO, "cannot create '%s': %s", tmp, strerror(errno));
  }
  static const unsigned char zeros[ESP_PAGE];
  int ok = write_all(fd, &h, sizeof h) == 0 && write_all(fd, table, tsize) == 0 &&
           write_all(fd, zeros, h.data_off - sizeof h - tsize) == 0 &&
           write_all(fd, data, total) == 0 && fsync(fd) == 0;
  int err = errno;
  ok = close(fd) == 0 && ok;
  es_mem_free(table);
  if (!ok || rename(tmp, path) < 0) {
    if (ok)
      err = errno;
    unlink(tmp);
    return es__fail(ES_EIO, "cannot write the prepared-weights cache file '%s': %s", path,
                    strerror(err));
  }
  es_weights *f = NULL;
  if ((rc = es_weights_open(path, 0, &f)) < 0)
    return rc;
  if (es_weights_size(f) != h.file_size) { /* replaced under us: use our own copy */
    es_weights_release(f);
    return es__fail(ES_EIO, "prepared-weights cache file '%s' changed while written", path);
  }
  *w = f;
  *base = (const unsigned char *)es_weights_data(f) + h.data_off;
  return 0;
}

static void esp_destroy(void *ctx) { es_mem_free(ctx); }

int es__prep_cache_attach(es_model *m, const char *path) {
  char dir[PATH_MAX];
  if (!m->prep || es_engine_cache_dir_get(dir, sizeof dir) <= 0)
    return 0;
  char real[PATH_MAX];
  struct stat st;
  if (!realpath(path, real) || stat(real, &st) < 0)
    return 0; /* no identity, no cache: loading goes on as without one */
  esp_ctx *x = es_mem_calloc(ES_MEM_ENGINE, 1, sizeof *x);
  EVP_MD_CTX *c = EVP_MD_CTX_new();
  int rc = x && c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) ? 0 : ES_ENOMEM;
  char isa[48] = {0}, ver[32] = {0};
  esp_isa(isa, sizeof isa);
  snprintf(ver, sizeof ver, "%s", ES_VERSION_STRING);
  uint64_t idv[7] = {(uint64_t)st.st_dev, (uint64_t)st.st_ino, (uint64_t)st.st_size,
                     (uint64_t)st.st_mtim.tv_sec, (uint64_t)st.st_mtim.tv_nsec,
                     (uint64_t)st.st_ctim.tv_sec, (uint64_t)st.st_ctim.tv_nsec};
  static const char tag[] = "edgeserve prepared weights 1";
  if (rc == 0)
    rc = sha_add(c, tag, sizeof tag);
  if (rc == 0)
    rc = sha_add(c, ver, sizeof ver);
  if (rc == 0)
    rc = sha_add(c, isa, sizeof isa);
  if (rc == 0)
    rc = sha_add(c, real, strlen(real) + 1);
  if (rc == 0)
    rc = sha_add(c, idv, sizeof idv);
  unsigned len = 0;
  if (rc == 0 && !EVP_DigestFinal_ex(c, x->ident, &len))
    rc = ES_ENOMEM;
  EVP_MD_CTX_free(c);
  if (rc < 0) {
    es_mem_free(x);
    return es__fail(ES_ENOMEM, "out of memory setting up the prepared-weights cache");
  }
  /* the stem: the file's name without its extension, for people reading
   * the directory */
  const char *base = strrchr(real, '/');
  base = base ? base + 1 : real;
  int stem = (int)strcspn(base, ".");
  if (stem > 64)
    stem = 64;
  snprintf(x->prefix, sizeof x->prefix, "%s/%.*s", dir, stem, base);
  es_prep_cache ops = {.ctx = x, .find = esp_find, .store = esp_store, .destroy = esp_destroy};
  es__prep_store_cache_set(m->prep, &ops);
  return 0;
}
