/* The context allocator: a chunk list for objects that are many, small and
 * all die together (a model's IR, a plan's kernel parameters). A bump per
 * chunk is simpler and tighter than one malloc each, and every byte is still
 * counted (ES_MEM_MODEL). */
#include "memory/ctx.h"

#include <stdint.h>
#include <string.h>

#include "edgeserve/memory.h"

#include "common/internal.h"

struct es_ctx_chunk {
  es_ctx_chunk *next;
  size_t size; /* usable bytes after the header */
  size_t used;
  max_align_t pad[]; /* payload */
};

#define ES_CTX_CHUNK 65536

void *es__ctx_alloc_raw(es_ctx *c, size_t size) {
  size_t need = es__align_up(size ? size : 1, 16);
  if (need == 0)
    return NULL;
  if (c->fixed) {
    if (c->fixed_size - c->asked < need) {
      c->exhausted = 1;
      return NULL;
    }
    void *p = c->fixed + c->asked;
    c->asked += need;
    return p;
  }
  c->asked += need;
  es_ctx_chunk *h = c->head;
  if (!h || h->size - h->used < need) {
    size_t payload = need > ES_CTX_CHUNK ? need : ES_CTX_CHUNK;
    if (payload > SIZE_MAX - sizeof(es_ctx_chunk))
      return NULL;
    h = es_mem_alloc(ES_MEM_MODEL, sizeof(es_ctx_chunk) + payload);
    if (!h)
      return NULL;
    h->size = payload;
    h->used = 0;
    /* A big one-off allocation goes behind the current chunk so the space
     * left in the current one is not abandoned. */
    if (c->head && payload > ES_CTX_CHUNK) {
      h->next = c->head->next;
      c->head->next = h;
    } else {
      h->next = c->head;
      c->head = h;
    }
    c->bytes += sizeof(es_ctx_chunk) + payload;
  }
  void *p = (char *)h->pad + h->used;
  h->used += need;
  return p;
}

void *es__ctx_alloc(es_ctx *c, size_t size) {
  void *p = es__ctx_alloc_raw(c, size);
  if (p)
    memset(p, 0, size);
  return p;
}

char *es__ctx_strdup(es_ctx *c, const char *s) {
  if (!s)
    s = "";
  size_t n = strlen(s) + 1;
  char *d = es__ctx_alloc(c, n);
  if (d)
    memcpy(d, s, n);
  return d;
}

void es__ctx_init_fixed(es_ctx *c, void *buf, size_t size) {
  memset(c, 0, sizeof *c);
  c->fixed = buf;
  c->fixed_size = size & ~(size_t)15;
}

void es__ctx_free_all(es_ctx *c) {
  if (c->fixed) {
    c->asked = 0;
    c->exhausted = 0;
    return;
  }
  es_ctx_chunk *h = c->head;
  while (h) {
    es_ctx_chunk *next = h->next;
    es_mem_free(h);
    h = next;
  }
  c->head = NULL;
  c->bytes = 0;
  c->asked = 0;
}

