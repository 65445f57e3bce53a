/* Kernel lookup, attribute readers and helpers shared by every op family.
 *
 * Families (elementwise.c, shape.c, pool.c, ...) each answer for their own
 * operators; lookup asks them in turn. A family is a file, so adding an op
 * touches its family and the ops table, nothing else. */
#include "kernels/kernel.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ==========================================================================
 * Lookup
 * ======================================================================== */

const es_kernel *es__kernel_for(es_op op) {
  typedef const es_kernel *(*family_fn)(es_op);
  static const family_fn families[] = {
      es__kernels_elementwise, es__kernels_shape, es__kernels_pool, es__kernels_reduce,
      es__kernels_resize,      es__kernels_norm,  es__kernels_conv, es__kernels_matmul,
      es__kernels_layout,      es__kernels_layernorm, es__kernels_fused,
      es__kernels_indexing,    es__kernels_linalg,
      es__kernels_signal,      es__kernels_sample,
      es__kernels_quant,       es__kernels_recurrent, es__kernels_control,
  };
  for (size_t i = 0; i < sizeof families / sizeof families[0]; i++) {
    const es_kernel *k = families[i](op);
    if (k)
      return k;
  }
  return NULL;
}

static _Atomic int es_reference_;

void es__kernels_use_reference(int on) { atomic_store(&es_reference_, on ? 1 : 0); }

int es__kernels_reference(void) { return atomic_load(&es_reference_); }

static _Atomic uint64_t es_split_flops_;

uint64_t es__kernels_split_flops(void) { return atomic_load(&es_split_flops_); }

void es__kernels_split_set(uint64_t flops) { atomic_store(&es_split_flops_, flops); }

/* The hook is the thread's own: a worker sets it around the runs it may
 * pause, and a run on another thread never sees it. */
static _Thread_local void (*es_safe_fn_)(void *user);
static _Thread_local void *es_safe_user_;

void es__kernels_safe_point(void) {
  if (es_safe_fn_)
    es_safe_fn_(es_safe_user_);
}

void es__kernels_safe_point_set(void (*fn)(void *user), void *user) {
  es_safe_fn_ = fn;
  es_safe_user_ = user;
}

/* oneDNN's CPU runtime here is OpenMP: a parallel region started by a thread
 * uses that thread's nthreads setting. Found at run time so the library does
 * not link the OpenMP runtime itself (oneDNN already loads it). */
static _Thread_local int es_threads_applied_; /* this thread's setting, 0: none yet */

int es__kernels_set_threads(int n) {
  if (n < 1 || n > 1024)
    return es__fail(ES_EINVAL, "thread count %d is outside 1..1024", n);
  void (*set)(int) = (void (*)(int))dlsym(RTLD_DEFAULT, "omp_set_num_threads");
  if (set)
    set(n);
  es_threads_applied_ = n;
  return 0;
}

void es__kernels_threads_default(void) {
  /* One thread per request unless the caller chose: several workers each
   * starting a team of all cores would oversubscribe the machine. */
  if (!es_threads_applied_)
    es__kernels_set_threads(1);
}

/* ==========================================================================
 * Inputs read in place at any offset
 * ======================================================================== */

void es__aligned_in_plan(es_kinst *k, int input, int reads, es_aligned_in *c) {
  const void *src = k->in_static[input];
  c->at = SIZE_MAX;
  c->bytes = 0;
  if (!reads || !src || (uintptr_t)src % sizeof(float) == 0)
    return;
  c->bytes = k->in[input]->nbytes;
  c->at = es__align_up(k->scratch_bytes, 64);
  k->scratch_bytes = c->at + c->bytes;
}

const void *es__aligned_in_get(const es_aligned_in *c, const void *in, void *scratch) {
  if (c->at == SIZE_MAX)
    return in;
  void *copy = (char *)scratch + c->at;
  memcpy(copy, in, c->bytes);
  return copy;
}

/* ==========================================================================
 * Node arity
 * ======================================================================== */

int es__kio_check(es_kinst *k, int min_in, int max_in, int min_out, int max_out) {
  if (k->n_in < min_in || k->n_in > max_in) {
    if (min_in == max_in)
      return ES_KFAIL(k, ES_EMODEL, "has %d inputs, expected %d", k->n_in, min_in);
    return ES_KFAIL(k, ES_EMODEL, "has %d inputs, expected %d to %d", k->n_in, min_in, max_in);
  }
  for (int i = 0; i < min_in; i++)
    if (!k->in[i])
      return ES_KFAIL(k, ES_EMODEL, "required input %d is missing", i);
  if (k->n_out < min_out || k->n_out > max_out) {
    if (min_out == max_out)
      return ES_KFAIL(k, ES_EMODEL, "has %d outputs, expected %d", k->n_out, min_out);
    return ES_KFAIL(k, ES_EMODEL, "has %d outputs, expected %d to %d", k->n_out, min_out,
                    max_out);
  }
  for (int i = 0; i < min_out; i++)
    if (!k->out[i])
      return ES_KFAIL(k, ES_EMODEL, "required output %d is missing", i);
  return 0;
}

/* ==========================================================================
 * Tensor descriptors
 * ======================================================================== */

int es__tdesc_set(es_tdesc *t, es_dtype dtype, int rank, const int64_t *dims) {
  size_t esz = es_dtype_size(dtype);
  if (esz == 0)
    return es__fail(ES_ENOTSUP, "element type %s (%d) is not supported", es_dtype_name(dtype),
                    (int)dtype);
  if (rank < 0 || rank > ES_MAX_RANK)
    return es__fail(ES_ENOTSUP, "rank %d is outside 0..%d", rank, ES_MAX_RANK);
  uint64_t n = 1;
  for (int i = 0; i < rank; i++) {
    if (dims[i] < 0)
      return es__fail(ES_EMODEL, "dimension %d is negative (%lld)", i, (long long)dims[i]);
    if (__builtin_mul_overflow(n, (uint64_t)dims[i], &n) || n > ((uint64_t)1 << 40))
      return es__fail(ES_EMODEL, "shape has more than 2^40 elements");
  }
  t->layout = ES_LAYOUT_PLAIN;
  t->dtype = dtype;
  t->rank = rank;
  for (int i = 0; i < ES_MAX_RANK; i++)
    t->dims[i] = i < rank ? dims[i] : 0;
  t->count = (size_t)n;
  t->nbytes = (size_t)n * esz;
  return 0;
}

/* Channels-last: N, the spatial axes in order, then C (ranks 4 and 5). */
static int cl_tensor(const es_tdesc *t) {
  return t->layout == ES_LAYOUT_NHWC && (t->rank == 4 || t->rank == 5);
}

void es__tdesc_phys_dims(const es_tdesc *t, int64_t *dims) {
  for (int i = 0; i < t->rank; i++)
    dims[i] = t->dims[i];
  if (cl_tensor(t)) {
    for (int i = 1; i < t->rank - 1; i++)
      dims[i] = t->dims[i + 1];
    dims[t->rank - 1] = t->dims[1];
  }
}

int es__layout_axis(const es_tdesc *t, int a) {
  if (!cl_tensor(t) || a < 0 || a >= t->rank)
    return a;
  return a == 0 ? 0 : a == 1 ? t->rank - 1 : a - 1;
}

int es__tdesc_cl_compatible(const es_tdesc *t, int rank) {
  if (t->layout == ES_LAYOUT_NHWC)
    return t->rank == rank;
  if (t->rank > rank || rank < 3 || rank > ES_MAX_RANK)
    return 0;
  int64_t d[ES_MAX_RANK] = {0};
  for (int i = 0; i < rank; i++)
    d[i] = i < rank - t->rank ? 1 : t->dims[i - (rank - t->rank)];
  int spatial_one = 1;
  for (int i = 2; i < rank; i++)
    spatial_one &= d[i] == 1;
  return d[1] == 1 || spatial_one;
}

int es__tdesc_nhwc_compatible(const es_tdesc *t) { return es__tdesc_cl_compatible(t, 4); }

void es__tdesc_cl_view(const es_tdesc *t, int rank, int64_t *dims) {
  int64_t d[ES_MAX_RANK] = {0};
  if (rank < 2 || rank > ES_MAX_RANK || t->rank > rank)
    return;
  for (int i = 0; i < rank; i++)
    d[i] = i < rank - t->rank ? 1 : t->dims[i - (rank - t->rank)];
  dims[0] = d[0];
  for (int i = 1; i < rank - 1; i++)
    dims[i] = d[i + 1];
  dims[rank - 1] = d[1];
}

int es__broadcast_layout_pick(es_kinst *k, int n_in, int rank, int *nhwc) {
  uint32_t cl_in = 0, bad = 0;
  int other_rank = rank != 4 && rank != 5;
  *nhwc = 0;
  for (int i = 0; i < n_in && i < 32; i++) {
    if (!k->in[i])
      continue;
    if (k->in[i]->layout == ES_LAYOUT_NHWC) {
      cl_in |= 1u << i;
      other_rank |= k->in[i]->rank != rank;
    } else if (!es__tdesc_cl_compatible(k->in[i], rank)) {
      bad |= 1u << i;
      other_rank |= k->in[i]->rank != rank;
    }
  }
  if (!cl_in)
    return 0;
  /* Relayout converts whole tensors of rank 4 or 5: with a shape that
   * would have to be broadcast first in play, everything goes back to plain
   * instead. */
  if (other_rank) {
    k->want_plain = cl_in;
    return ES_KRELAYOUT;
  }
  if (bad) {
    k->want_nhwc = bad;
    return ES_KRELAYOUT;
  }
  *nhwc = 1;
  return 0;
}

int es__tdesc_same_shape(const es_tdesc *a, const es_tdesc *b) {
  if (a->rank != b->rank)
    return 0;
  for (int i = 0; i < a->rank; i++)
    if (a->dims[i] != b->dims[i])
      return 0;
  return 1;
}

/* ==========================================================================
 * Kernel instances and errors
 * ======================================================================== */

void *es__kinst_alloc(es_kinst *k, size_t size) { return es__ctx_alloc(k->ctx, size); }

void *es__kinst_params(es_kinst *k, size_t size) {
  void *p = es__kinst_alloc(k, size);
  if (!p)
    ES_KFAIL(k, ES_ENOMEM, "out of memory for %zu bytes of parameters", size);
  return p;
}

void es__strides_of(int rank, const int64_t *dims, int64_t *st) {
  int64_t s = 1;
  for (int i = rank - 1; i >= 0; i--) {
    st[i] = s;
    s *= dims[i];
  }
}

int es__kfail(const es_kinst *k, int err, const char *fmt, ...) {
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return es__fail(err, "%s: %s", k->label, msg);
}

/* ==========================================================================
 * Prepared weights
 * ======================================================================== */

typedef struct prep_entry {
  struct prep_entry *next;
  char *key;
  es_weights *w;    /* the region holding the bytes (one reference) */
  const void *data; /* the bytes: all of w, or a slice of a compiled file */
  size_t size;
} prep_entry;

struct es_prep_store {
  pthread_mutex_t lock;
  prep_entry *head;
  size_t bytes;
  /* Entries by key, open addressing, at most half full: a plan makes one
   * lookup per convolution, and walking the list made a model of n
   * convolutions cost n^2 string compares. */
  prep_entry **table;
  size_t slots, used;
  int mlock;                 /* 1: every region is locked in RAM (es__prep_store_lock) */
  es_prep_cache cache;       /* a lasting cache of batches, or all NULL */
  es_prep_cache_stats cstats;
};

static uint64_t prep_hash(const char *key) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (; *key; key++)
    h = (h ^ (unsigned char)*key) * 1099511628211ull;
  return h;
}

/* The entry stored under key, or NULL. Under the lock. */
static prep_entry *prep_find(const es_prep_store *s, const char *key) {
  if (!s->slots)
    return NULL;
  for (size_t i = prep_hash(key) & (s->slots - 1);; i = (i + 1) & (s->slots - 1))
    if (!s->table[i] || !strcmp(s->table[i]->key, key))
      return s->table[i];
}

/* Room in the table for n more entries, so that the next n links cannot
 * fail; 0 or ES_ENOMEM. Under the lock. */
static int prep_reserve(es_prep_store *s, size_t n) {
  if (2 * (s->used + n) <= s->slots)
    return 0;
  size_t slots = s->slots ? s->slots : 64;
  while (2 * (s->used + n) > slots)
    slots *= 2;
  prep_entry **t = es_mem_calloc(ES_MEM_ENGINE, slots, sizeof *t);
  if (!t)
    return ES_ENOMEM;
  for (size_t i = 0; i < s->slots; i++)
    if (s->table[i]) {
      size_t j = prep_hash(s->table[i]->key) & (slots - 1);
      while (t[j])
        j = (j + 1) & (slots - 1);
      t[j] = s->table[i];
    }
  es_mem_free(s->table);
  s->table = t;
  s->slots = slots;
  return 0;
}

/* Links e (whose key is not stored yet) into the list and the table; 0 or
 * ES_ENOMEM (nothing linked). Under the lock. */
static int prep_link(es_prep_store *s, prep_entry *e) {
  if (prep_reserve(s, 1) < 0)
    return ES_ENOMEM;
  size_t j = prep_hash(e->key) & (s->slots - 1);
  while (s->table[j])
    j = (j + 1) & (s->slots - 1);
  s->table[j] = e;
  s->used++;
  e->next = s->head;
  s->head = e;
  return 0;
}

int es__prep_store_create(es_prep_store **out) {
  es_prep_store *s = es_mem_calloc(ES_MEM_ENGINE, 1, sizeof *s);
  if (!s)
    return es__fail(ES_ENOMEM, "out of memory creating the prepared-weights store");
  pthread_mutex_init(&s->lock, NULL);
  *out = s;
  return 0;
}

void es__prep_store_destroy(es_prep_store *s) {
  if (!s)
    return;
  prep_entry *e = s->head;
  while (e) {
    prep_entry *next = e->next;
    es_weights_release(e->w);
    es_mem_free(e->key);
    es_mem_free(e);
    e = next;
  }
  es_mem_free(s->table);
  if (s->cache.destroy)
    s->cache.destroy(s->cache.ctx);
  pthread_mutex_destroy(&s->lock);
  es_mem_free(s);
}

void es__prep_store_cache_set(es_prep_store *s, const es_prep_cache *c) {
  if (!s)
    return;
  if (s->cache.destroy)
    s->cache.destroy(s->cache.ctx);
  if (c)
    s->cache = *c;
  else
    memset(&s->cache, 0, sizeof s->cache);
}

int es__prep_store_lock(es_prep_store *s) {
  if (!s)
    return 0;
  pthread_mutex_lock(&s->lock);
  s->mlock = 1;
  int rc = 0;
  for (prep_entry *e = s->head; e && rc == 0; e = e->next)
    rc = es_weights_lock(e->w);
  pthread_mutex_unlock(&s->lock);
  return rc;
}

void es__prep_store_cache_stats(es_prep_store *s, es_prep_cache_stats *out) {
  memset(out, 0, sizeof *out);
  if (!s)
    return;
  pthread_mutex_lock(&s->lock);
  *out = s->cstats;
  pthread_mutex_unlock(&s->lock);
}

size_t es__prep_store_bytes(const es_prep_store *s) { return s ? s->bytes : 0; }

int es__prep_store_add(es_prep_store *s, const char *key, es_weights *w, const void *data,
                       size_t size) {
  if (!s || !key || !w || (!data && size))
    return es__fail(ES_EINVAL, "es__prep_store_add: bad argument");
  pthread_mutex_lock(&s->lock);
  int rc = 0;
  if (prep_find(s, key))
    rc = es__fail(ES_EINVAL, "prepared weights '%s' are already stored", key);
  prep_entry *e = NULL;
  if (rc == 0) {
    e = es_mem_calloc(ES_MEM_ENGINE, 1, sizeof *e);
    if (!e || !(e->key = es_mem_strdup(ES_MEM_ENGINE, key))) {
      es_mem_free(e);
      rc = es__fail(ES_ENOMEM, "out of memory for prepared weights");
    }
  }
  if (rc == 0) {
    e->data = data;
    e->size = size;
    if (prep_link(s, e) < 0) {
      es_mem_free(e->key);
      es_mem_free(e);
      rc = es__fail(ES_ENOMEM, "out of memory for prepared weights");
    } else {
      e->w = es_weights_retain(w);
    }
  }
  pthread_mutex_unlock(&s->lock);
  return rc;
}

int es__prep_store_each(es_prep_store *s,
                        int (*fn)(void *user, const char *key, const void *data, size_t size),
                        void *user) {
  if (!s || !fn)
    return es__fail(ES_EINVAL, "es__prep_store_each: bad argument");
  pthread_mutex_lock(&s->lock);
  int rc = 0;
  for (prep_entry *e = s->head; e && rc == 0; e = e->next)
    rc = fn(user, e->key, e->data, e->size);
  pthread_mutex_unlock(&s->lock);
  return rc;
}

/* ---- batches: a plan's new entries, filled at once into one region --------
 *
 * Preparing each entry in a region of its own made every one a separate
 * mapping filled through 4 KiB page faults (most were below the 2 MiB of a
 * huge page, the others unaligned to one): resnet50's 102 MB of prepared
 * weights took 240 ms of faults and 40 ms of reorders, most of its plan.
 * A batch collects a plan's requests and fills them, back to back and
 * 64-byte aligned, into one region that starts on a huge page; the
 * faults then cost 10 ms. */

typedef struct prep_req {
  char *key;
  size_t bytes;
  es_prep_fill_fn fill;
  void *user;          /* the caller's job, copied */
  const void ***outs;  /* where the data's address goes once filled */
  int n_outs, cap_outs;
  size_t offset;       /* in the batch's region, while committing */
  const void *data;    /* the bytes, once committed */
} prep_req;

struct es_prep_batch {
  prep_req *req;
  int n, cap;
  int *table;          /* request index by key, open addressing, -1: free */
  size_t slots;
  int asks;            /* requests made, each reader counted */
};

int es__prep_batch_create(es_prep_batch **out) {
  es_prep_batch *b = es_mem_calloc(ES_MEM_ENGINE, 1, sizeof *b);
  if (!b)
    return es__fail(ES_ENOMEM, "out of memory for a prepared-weights batch");
  *out = b;
  return 0;
}

static void prep_batch_clear(es_prep_batch *b) {
  for (int i = 0; i < b->n; i++) {
    es_mem_free(b->req[i].key);
    es_mem_free(b->req[i].user);
    es_mem_free(b->req[i].outs);
  }
  b->n = 0;
  if (b->table)
    memset(b->table, 0xff, b->slots * sizeof *b->table);
}

void es__prep_batch_destroy(es_prep_batch *b) {
  if (!b)
    return;
  prep_batch_clear(b);
  es_mem_free(b->req);
  es_mem_free(b->table);
  es_mem_free(b);
}

int es__prep_batch_asks(const es_prep_batch *b) { return b ? b->asks : 0; }

/* The request for key, or -1. */
static int prep_batch_find(const es_prep_batch *b, const char *key) {
  if (!b->slots)
    return -1;
  for (size_t i = prep_hash(key) & (b->slots - 1);; i = (i + 1) & (b->slots - 1))
    if (b->table[i] < 0 || !strcmp(b->req[b->table[i]].key, key))
      return b->table[i];
}

/* Room for one more request (array and table); 0 or ES_ENOMEM. */
static int prep_batch_grow(es_prep_batch *b) {
  if (b->n == b->cap) {
    int cap = b->cap ? 2 * b->cap : 32;
    prep_req *r = b->req ? es_mem_realloc(b->req, (size_t)cap * sizeof *r)
                         : es_mem_alloc(ES_MEM_ENGINE, (size_t)cap * sizeof *r);
    if (!r)
      return ES_ENOMEM;
    b->req = r;
    b->cap = cap;
  }
  if (2 * ((size_t)b->n + 1) > b->slots) {
    size_t slots = b->slots ? 2 * b->slots : 64;
    int *t = es_mem_alloc(ES_MEM_ENGINE, slots * sizeof *t);
    if (!t)
      return ES_ENOMEM;
    memset(t, 0xff, slots * sizeof *t);
    for (int r = 0; r < b->n; r++) {
      size_t j = prep_hash(b->req[r].key) & (slots - 1);
      while (t[j] >= 0)
        j = (j + 1) & (slots - 1);
      t[j] = r;
    }
    es_mem_free(b->table);
    b->table = t;
    b->slots = slots;
  }
  return 0;
}

static int prep_req_wait(prep_req *r, const void **out) {
  if (r->n_outs == r->cap_outs) {
    int cap = r->cap_outs ? 2 * r->cap_outs : 2;
    const void ***o = r->outs ? es_mem_realloc(r->outs, (size_t)cap * sizeof *o)
                              : es_mem_alloc(ES_MEM_ENGINE, (size_t)cap * sizeof *o);
    if (!o)
      return ES_ENOMEM;
    r->outs = o;
    r->cap_outs = cap;
  }
  r->outs[r->n_outs++] = out;
  *out = NULL;
  return 0;
}

/* Adds a request (or one more reader of a request made before). */
static int prep_batch_add(es_kinst *k, es_prep_batch *b, const char *key, size_t bytes,
                          es_prep_fill_fn fill, const void *user, size_t user_size,
                          const void **out) {
  b->asks++;
  int i = prep_batch_find(b, key);
  if (i >= 0) {
    if (b->req[i].bytes != bytes)
      return es__kfail(k, ES_ECORRUPT, "prepared weights '%s' asked for with two sizes", key);
    if (prep_req_wait(&b->req[i], out) < 0)
      return es__kfail(k, ES_ENOMEM, "out of memory for prepared weights");
    return 0;
  }
  if (prep_batch_grow(b) < 0)
    return es__kfail(k, ES_ENOMEM, "out of memory for prepared weights");
  prep_req *r = &b->req[b->n];
  memset(r, 0, sizeof *r);
  r->key = es_mem_strdup(ES_MEM_ENGINE, key);
  r->user = es_mem_alloc(ES_MEM_ENGINE, user_size ? user_size : 1);
  if (!r->key || !r->user || prep_req_wait(r, out) < 0) {
    es_mem_free(r->key);
    es_mem_free(r->user);
    es_mem_free(r->outs);
    return es__kfail(k, ES_ENOMEM, "out of memory for prepared weights");
  }
  memcpy(r->user, user, user_size);
  r->bytes = bytes;
  r->fill = fill;
  size_t j = prep_hash(key) & (b->slots - 1);
  while (b->table[j] >= 0)
    j = (j + 1) & (b->slots - 1);
  b->table[j] = b->n++;
  return 0;
}

int es__prep_batch_commit(es_prep_batch *b, es_prep_store *s) {
  if (!b || !b->n)
    return 0;
  if (!s)
    return es__fail(ES_EINVAL, "es__prep_batch_commit: no store");
  /* Held across the fills so two plans made at once never prepare twice:
   * an entry another plan stored since it was asked for is taken as is. */
  pthread_mutex_lock(&s->lock);
  int rc = 0, fresh = 0;
  size_t total = 0;
  for (int i = 0; i < b->n && rc == 0; i++) {
    prep_req *r = &b->req[i];
    prep_entry *e = prep_find(s, r->key);
    r->data = NULL;
    if (e) {
      if (e->size < r->bytes)
        rc = es__fail(ES_ECORRUPT, "prepared weights '%s' exist with another size", r->key);
      r->data = e->data;
      continue;
    }
    r->offset = total;
    total += es__align_up(r->bytes ? r->bytes : 1, 64);
    fresh++;
  }
  prep_entry **ents = NULL;
  es_prep_cache_entry *ce = NULL;
  es_weights *w = NULL;
  unsigned char *base = NULL;
  const unsigned char *ro = NULL;
  int cached = 0; /* 1: the region was found in the cache, 2: stored there */
  if (rc == 0 && fresh) {
    ents = es_mem_calloc(ES_MEM_ENGINE, (size_t)fresh, sizeof *ents);
    rc = ents && prep_reserve(s, (size_t)fresh) == 0
             ? 0
             : es__fail(ES_ENOMEM, "out of memory for prepared weights");
    for (int i = 0; i < fresh && rc == 0; i++)
      if (!(ents[i] = es_mem_calloc(ES_MEM_ENGINE, 1, sizeof **ents)))
        rc = es__fail(ES_ENOMEM, "out of memory for prepared weights");
    /* The lasting cache: a file that holds this very batch is mapped
     * instead of filling it (no reorder, no fresh memory); a batch filled
     * here is stored for the next process, which then maps it too. */
    if (rc == 0 && s->cache.find &&
        (ce = es_mem_calloc(ES_MEM_ENGINE, (size_t)fresh, sizeof *ce))) {
      for (int i = 0, f = 0; i < b->n; i++)
        if (!b->req[i].data)
          ce[f++] = (es_prep_cache_entry){b->req[i].key, b->req[i].offset, b->req[i].bytes};
      int crc = s->cache.find(s->cache.ctx, ce, fresh, total, &w, &ro);
      if (crc == 0) {
        cached = 1;
      } else {
        w = NULL, ro = NULL;
        if (crc != ES_ENOENT)
          s->cstats.errors++;
      }
    }
    if (rc == 0 && !ro) {
      rc = es_weights_create(total, &w);
      if (rc == 0)
        rc = es_weights_data_mut(w, (void **)&base);
      for (int i = 0; i < b->n && rc == 0; i++)
        if (!b->req[i].data)
          rc = b->req[i].fill(b->req[i].user, base + b->req[i].offset, b->req[i].bytes);
      if (rc == 0)
        rc = es_weights_seal(w);
      if (rc == 0)
        ro = es_weights_data(w);
      es_weights *cw = NULL;
      const unsigned char *cbase = NULL;
      if (rc == 0 && ce) {
        if (s->cache.store(s->cache.ctx, ce, fresh, total, ro, &cw, &cbase) == 0) {
          /* the stored copy is what every later process maps: map it here
           * too, and this process's private copy goes */
          cached = 2;
          es_weights_release(w);
          w = cw, ro = cbase;
        } else {
          s->cstats.errors++;
        }
      }
    }
    if (rc == 0 && s->mlock)
      rc = es_weights_lock(w);
    if (rc == 0) {
      int f = 0;
      for (int i = 0; i < b->n; i++) {
        prep_req *r = &b->req[i];
        if (r->data)
          continue;
        prep_entry *e = ents[f++];
        e->key = r->key; /* the entry takes the key */
        r->key = NULL;
        e->w = es_weights_retain(w);
        e->data = r->data = ro + r->offset;
        e->size = r->bytes;
        (void)prep_link(s, e); /* cannot fail: reserved */
      }
      s->bytes += es_weights_data(w) == ro ? es_weights_size(w) : total;
      if (cached) {
        s->cstats.hits += cached == 1;
        s->cstats.writes += cached == 2;
        s->cstats.bytes += total;
      }
    } else if (ents) {
      for (int i = 0; i < fresh; i++)
        es_mem_free(ents[i]);
    }
  }
  es_mem_free(ents);
  es_mem_free(ce);
  es_weights_release(w); /* the entries hold it now, or nobody does */
  pthread_mutex_unlock(&s->lock);
  if (rc == 0)
    for (int i = 0; i < b->n; i++)
      for (int o = 0; o < b->req[i].n_outs; o++)
        *b->req[i].outs[o] = b->req[i].data;
  prep_batch_clear(b);
  return rc;
}

int es__kinst_prepared(es_kinst *k, const char *key, size_t bytes, es_prep_fill_fn fill,
                       const void *user, size_t user_size, const void **out) {
  if (!k->prep) {
    void *p = es__kinst_alloc(k, bytes ? bytes : 1);
    if (!p)
      return es__kfail(k, ES_ENOMEM, "out of memory for %zu bytes of prepared weights", bytes);
    int rc = fill((void *)user, p, bytes);
    if (rc == 0)
      *out = p;
    return rc;
  }
  es_prep_store *s = k->prep;
  pthread_mutex_lock(&s->lock);
  int rc = 0;
  prep_entry *e = prep_find(s, key);
  if (e) {
    if (e->size < bytes)
      rc = es__kfail(k, ES_ECORRUPT, "prepared weights '%s' exist with another size", key);
    else
      *out = e->data;
  }
  pthread_mutex_unlock(&s->lock);
  if (e)
    return rc;
  if (k->prep_batch)
    return prep_batch_add(k, k->prep_batch, key, bytes, fill, user, user_size, out);
  /* No batch (a kernel inferred alone): a batch of one, filled now. */
  es_prep_batch one = {0};
  rc = prep_batch_add(k, &one, key, bytes, fill, user, user_size, out);
  if (rc == 0)
    rc = es__prep_batch_commit(&one, s);
  prep_batch_clear(&one);
  es_mem_free(one.req);
  es_mem_free(one.table);
  return rc;
}

/* ==========================================================================
 * Attributes
 * ======================================================================== */

static const es_attr *attr_typed(const es_kinst *k, const char *name, es_attr_type type,
                                 int *rc) {
  const es_attr *a = es__kattr(k, name);
  *rc = 0;
  if (a && a->type != type) {
    *rc = es__kfail(k, ES_EMODEL, "attribute '%s' has type %d, expected %d", name, (int)a->type,
                    (int)type);
    return NULL;
  }
  return a;
}

int es__attr_int(const es_kinst *k, const char *name, int64_t def, int64_t *out) {
  int rc;
  const es_attr *a = attr_typed(k, name, ES_ATTR_INT, &rc);
  *out = a ? a->i : def;
  return rc;
}

int es__attr_float(const es_kinst *k, const char *name, float def, float *out) {
  int rc;
  const es_attr *a = attr_typed(k, name, ES_ATTR_FLOAT, &rc);
  *out = a ? a->f : def;
  return rc;
}

int es__attr_string(const es_kinst *k, const char *name, const char *def, const char **out) {
  int rc;
  const es_attr *a = attr_typed(k, name, ES_ATTR_STRING, &rc);
  *out = a ? a->s : def;
  return rc;
}

int es__attr_ints(const es_kinst *k, const char *name, const int64_t **v, size_t *n) {
  int rc;
  const es_attr *a = attr_typed(k, name, ES_ATTR_INTS, &rc);
  *v = a ? a->ints : NULL;
  *n = a ? a->n : 0;
  return rc;
}

int es__attr_floats(const es_kinst *k, const char *name, const float **v, size_t *n) {
  int rc;
  const es_attr *a = attr_typed(k, name, ES_ATTR_FLOATS, &rc);
  *v = a ? a->floats : NULL;
  *n = a ? a->n : 0;
  return rc;
}

int es__attr_strings(const es_kinst *k, const char *name, const char *const **v, size_t *n) {
  int rc;
  const es_attr *a = attr_typed(k, name, ES_ATTR_STRINGS, &rc);
  *v = a ? a->strs : NULL;
  *n = a ? a->n : 0;
  return rc;
}

/* ==========================================================================
 * Shared helpers
 * ======================================================================== */

int es__broadcast_shape(const es_kinst *k, const es_tdesc *a, const es_tdesc *b, int *rank,
                        int64_t *dims) {
  int r = a->rank > b->rank ? a->rank : b->rank;
  for (int i = 0; i < r; i++) {
    int ia = i - (r - a->rank), ib = i - (r - b->rank);
    int64_t da = ia >= 0 ? a->dims[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1;
    if (da != db && da != 1 && db != 1)
      return es__kfail(k, ES_EMODEL, "shapes do not broadcast: dimension %d is %lld vs %lld", i,
                       (long long)da, (long long)db);
    dims[i] = da == 1 ? db : da;
  }
  *rank = r;
  return 0;
}

int es__axis_norm(const es_kinst *k, int64_t axis, int rank, int *out) {
  if (axis < -(int64_t)rank || axis >= (int64_t)rank)
    return es__kfail(k, ES_EMODEL, "axis %lld is outside [-%d, %d)", (long long)axis, rank, rank);
  *out = (int)(axis < 0 ? axis + rank : axis);
  return 0;
}

int64_t es__static_i64(const es_tdesc *t, const void *data, size_t i) {
  return t->dtype == ES_DTYPE_INT64 ? ((const int64_t *)data)[i]
                                    : (int64_t)((const int32_t *)data)[i];
}

/* ==========================================================================
 * One node outside a plan
 * ======================================================================== */

int es__kernel_eval(const es_knode *node, int64_t opset, int n_in, const es_tdesc *const *in_desc,
                    const void *const *in_data, int n_out, es_tdesc *out_desc, void **out_data) {
  const es_kernel *kern = es__kernel_for(node->op);
  if (!kern)
    return es__fail(ES_ENOTSUP, "no kernel for %s", es__op_name(node->op));
  es_ctx ctx = {0};
  es_tdesc *outp[ES_MAX_RANK * 4];
  if (n_out > (int)(sizeof outp / sizeof outp[0]))
    return es__fail(ES_ENOTSUP, "too many outputs");
  for (int i = 0; i < n_out; i++) {
    memset(&out_desc[i], 0, sizeof out_desc[i]);
    outp[i] = &out_desc[i];
    out_data[i] = NULL;
  }
  es_kinst k = {.node = *node,
                .opset = opset,
                .n_in = n_in,
                .n_out = n_out,
                .in = in_desc,
                .out = outp,
                .in_static = in_data,
                .inplace = -1,
                .ctx = &ctx};
  es__op_label(node->name, node->id, node->op, k.label, sizeof k.label);
  int rc = kern->infer(&k);
  if (rc > 0) /* a layout or a value this call does not give: not for evaluation */
    rc = es__fail(ES_ENOTSUP, "%s: cannot be evaluated on its own here", k.label);
  void *scratch = NULL;
  if (rc == 0) { /* a valid pointer even for 0 bytes */
    scratch = es_mem_aligned_alloc(ES_MEM_ENGINE, 64, k.scratch_bytes ? k.scratch_bytes : 1);
    if (!scratch)
      rc = es__fail(ES_ENOMEM, "out of memory for %zu scratch bytes", k.scratch_bytes);
  }
  for (int i = 0; rc == 0 && i < n_out; i++) {
    out_data[i] =
        es_mem_aligned_alloc(ES_MEM_ENGINE, 64, out_desc[i].nbytes ? out_desc[i].nbytes : 1);
    if (!out_data[i])
      rc = es__fail(ES_ENOMEM, "out of memory for %zu output bytes", out_desc[i].nbytes);
  }
  if (rc == 0)
    rc = kern->run(&k, in_data, out_data, scratch);
  if (kern->release)
    kern->release(&k);
  es_mem_free(scratch);
  if (rc < 0)
    for (int i = 0; i < n_out; i++) {
      es_mem_free(out_data[i]);
      out_data[i] = NULL;
    }
  es__ctx_free_all(&ctx);
  return rc;
}
