/* The plan cache: plans of one model keyed by input shapes, bounded by an
 * LRU list.
 *
 * Planning costs milliseconds and plan memory (shapes, folded constants,
 * oneDNN primitives), so a server plans each shape once and reuses it; the
 * bound keeps a stream of unusual shapes from growing memory without limit.
 * Bucketing makes the bound practical for models whose input size varies
 * continuously (OCR text lines of any width). The list is short (capacity is
 * small), so lookups are a linear scan under one mutex; planning happens
 * outside the lock, and two threads planning the same new shape at once keep
 * the first result. */
#include "common/internal.h"
#include "engine/engine_internal.h"

#include <pthread.h>
#include <string.h>

#define ES_CACHE_MAGIC 0x4553504341434845ull /* "ESPCACHE" */
#define ES_CACHE_MAX_BUCKETS 16
#define ES_CACHE_MAX_INPUTS 8

typedef struct centry {
  es_tensor_info shapes[ES_CACHE_MAX_INPUTS]; /* the key */
  int n;
  es_plan *plan;
} centry;

typedef struct bucket {
  int input, dim;
  int64_t multiple;
} bucket;

struct es_plan_cache {
  uint64_t magic;
  pthread_mutex_t lock;
  es_model *model;
  centry *e;      /* e[0] most recently used */
  size_t n, cap;
  bucket buckets[ES_CACHE_MAX_BUCKETS];
  int n_buckets;
  uint64_t hits, misses, evictions;
};

static int cache_ok(const es_plan_cache *c) { return c && c->magic == ES_CACHE_MAGIC; }

int es_plan_cache_create(es_model *m, size_t capacity, es_plan_cache **out) {
  if (!es__model_ok(m) || !out || capacity < 1 || capacity > 4096)
    return es__fail(ES_EINVAL, "es_plan_cache_create: bad argument (capacity 1..4096)");
  if (es_model_input_count(m) > ES_CACHE_MAX_INPUTS)
    return es__fail(ES_ENOTSUP, "plan cache: more than %d inputs", ES_CACHE_MAX_INPUTS);
  es_plan_cache *c = es_mem_calloc(ES_MEM_ENGINE, 1, sizeof *c);
  centry *e = es_mem_calloc(ES_MEM_ENGINE, capacity, sizeof *e);
  if (!c || !e) {
    es_mem_free(c);
    es_mem_free(e);
    return es__fail(ES_ENOMEM, "out of memory for a plan cache");
  }
  pthread_mutex_init(&c->lock, NULL);
  c->magic = ES_CACHE_MAGIC;
  c->model = es_model_retain(m);
  c->e = e;
  c->cap = capacity;
  *out = c;
  return 0;
}

void es_plan_cache_destroy(es_plan_cache *c) {
  if (!cache_ok(c))
    return;
  for (size_t i = 0; i < c->n; i++)
    es_plan_release(c->e[i].plan);
  es_model_release(c->model);
  pthread_mutex_destroy(&c->lock);
  c->magic = 0;
  es_mem_free(c->e);
  es_mem_free(c);
}

int es_plan_cache_bucket(es_plan_cache *c, int input, int dim, int64_t multiple) {
  if (!cache_ok(c) || input < 0 || input >= es_model_input_count(c->model) || dim < 0 ||
      dim >= ES_MAX_RANK || multiple < 1)
    return es__fail(ES_EINVAL, "es_plan_cache_bucket: bad argument");
  pthread_mutex_lock(&c->lock);
  int rc = 0;
  if (c->n_buckets == ES_CACHE_MAX_BUCKETS)
    rc = es__fail(ES_ENOSPC, "plan cache: at most %d bucket rules", ES_CACHE_MAX_BUCKETS);
  else
    c->buckets[c->n_buckets++] = (bucket){input, dim, multiple};
  pthread_mutex_unlock(&c->lock);
  return rc;
}

static int same_key(const centry *e, const es_tensor_info *s, int n) {
  if (e->n != n)
    return 0;
  for (int i = 0; i < n; i++) {
    if (e->shapes[i].dtype != s[i].dtype || e->shapes[i].rank != s[i].rank)
      return 0;
    for (int d = 0; d < s[i].rank; d++)
      if (e->shapes[i].dims[d] != s[i].dims[d])
        return 0;
  }
  return 1;
}

/* Moves entry i to the front (most recently used). */
static void touch(es_plan_cache *c, size_t i) {
  centry t = c->e[i];
  memmove(&c->e[1], &c->e[0], i * sizeof t);
  c->e[0] = t;
}

int es_plan_cache_get(es_plan_cache *c, const es_tensor_info *shapes, int n, es_plan **out) {
  if (!cache_ok(c) || !out || n < 0 || n > ES_CACHE_MAX_INPUTS || (n > 0 && !shapes))
    return es__fail(ES_EINVAL, "es_plan_cache_get: bad argument");
  es_tensor_info key[ES_CACHE_MAX_INPUTS];
  memcpy(key, shapes, (size_t)n * sizeof *key);
  pthread_mutex_lock(&c->lock);
  for (int b = 0; b < c->n_buckets; b++) {
    const bucket *r = &c->buckets[b];
    if (r->input < n && r->dim < key[r->input].rank && key[r->input].dims[r->dim] > 0) {
      int64_t d = key[r->input].dims[r->dim];
      key[r->input].dims[r->dim] = (d + r->multiple - 1) / r->multiple * r->multiple;
    }
  }
  for (int i = 0; i < n; i++)
    for (int d = key[i].rank < 0 ? 0 : key[i].rank; d < ES_MAX_RANK; d++)
      key[i].dims[d] = 0;
  for (size_t i = 0; i < c->n; i++)
    if (same_key(&c->e[i], key, n)) {
      touch(c, i);
      c->hits++;
      *out = es_plan_retain(c->e[0].plan);
      pthread_mutex_unlock(&c->lock);
      return 0;
    }
  c->misses++;
  pthread_mutex_unlock(&c->lock);

  es_plan *p;
  int rc = es_model_plan(c->model, key, n, &p);
  if (rc < 0)
    return rc;
  pthread_mutex_lock(&c->lock);
  for (size_t i = 0; i < c->n; i++)
    if (same_key(&c->e[i], key, n)) { /* planned meanwhile by another thread */
      touch(c, i);
      *out = es_plan_retain(c->e[0].plan);
      pthread_mutex_unlock(&c->lock);
      es_plan_release(p);
      return 0;
    }
  es_plan *evicted = NULL;
  if (c->n == c->cap) {
    evicted = c->e[c->n - 1].plan;
    c->n--;
    c->evictions++;
  }
  memmove(&c->e[1], &c->e[0], c->n * sizeof *c->e);
  c->e[0].n = n;
  memcpy(c->e[0].shapes, key, (size_t)n * sizeof *key);
  for (int i = 0; i < n; i++)
    c->e[0].shapes[i].name = NULL; /* names are not part of the key */
  c->e[0].plan = p;
  c->n++;
  *out = es_plan_retain(p);
  pthread_mutex_unlock(&c->lock);
  es_plan_release(evicted); /* outside the lock: may free kernels' primitives */
  return 0;
}

int es_plan_cache_stats_get(es_plan_cache *c, es_plan_cache_stats *out) {
  if (!cache_ok(c) || !out)
    return es__fail(ES_EINVAL, "es_plan_cache_stats_get: bad argument");
  pthread_mutex_lock(&c->lock);
  memset(out, 0, sizeof *out);
  out->capacity = c->cap;
  out->entries = c->n;
  out->hits = c->hits;
  out->misses = c->misses;
  out->evictions = c->evictions;
  for (size_t i = 0; i < c->n; i++) {
    out->context_bytes += es_plan_context_bytes(c->e[i].plan);
    size_t a = es_plan_arena_bytes(c->e[i].plan);
    if (a > out->max_arena_bytes)
      out->max_arena_bytes = a;
  }
  pthread_mutex_unlock(&c->lock);
  return 0;
}

int es_plan_cache_each(es_plan_cache *c, void (*fn)(void *user, const es_plan *p), void *user) {
  if (!cache_ok(c) || !fn)
    return es__fail(ES_EINVAL, "es_plan_cache_each: bad argument");
  pthread_mutex_lock(&c->lock);
  for (size_t i = 0; i < c->n; i++)
    fn(user, c->e[i].plan);
  pthread_mutex_unlock(&c->lock);
  return 0;
}
