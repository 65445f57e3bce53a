/* The context allocator: chunked bump allocation, counted under
 * ES_MEM_MODEL, freed in one go. Holds tier-3 memory (BRIEF §2): a graph's
 * IR, a plan's kernel parameters. Not thread-safe; one owner. A zeroed
 * es_ctx is empty and ready. */
#ifndef ES_MEMORY_CTX_H
#define ES_MEMORY_CTX_H

#include <stddef.h>

typedef struct es_ctx_chunk es_ctx_chunk;
typedef struct es_ctx {
  es_ctx_chunk *head;
  size_t bytes; /* total chunk bytes held */
  size_t asked; /* bytes handed out (each rounded up to 16), over its life */
  unsigned char *fixed; /* es__ctx_init_fixed: the one region it hands out */
  size_t fixed_size;
  int exhausted;        /* a fixed context refused an allocation */
} es_ctx;

/* A context over the caller's region [buf, buf + size) (16-byte aligned)
 * that never takes memory elsewhere: an allocation that does not fit gets
 * NULL. es__ctx_free_all empties it for reuse. How a run re-infers a node
 * whose shapes the data decides: its parameters go to a region of the
 * request's arena the plan sized. */
void es__ctx_init_fixed(es_ctx *c, void *buf, size_t size);

void *es__ctx_alloc(es_ctx *c, size_t size); /* 16-byte aligned, zeroed; NULL on OOM */
/* The same, not zeroed: for callers that write every byte (a parser's
 * output), where zeroing megabytes first is a pass for nothing. */
void *es__ctx_alloc_raw(es_ctx *c, size_t size);
char *es__ctx_strdup(es_ctx *c, const char *s);
void es__ctx_free_all(es_ctx *c);

#endif
