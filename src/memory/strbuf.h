/* A growable text buffer for building responses (metrics, JSON answers):
 * printf-style appends into memory counted under the buffer's tag. The
 * first failure sticks, so a long sequence of appends needs one check at
 * the end (es__sb_take returns NULL). Not thread-safe; one per builder. */
#ifndef ES_MEMORY_STRBUF_H
#define ES_MEMORY_STRBUF_H

#include <stddef.h>

#include "edgeserve/memory.h"

typedef struct es_strbuf {
  char *p;
  size_t len, cap;
  int oom;
  es_mem_tag tag;
} es_strbuf;

/* Start empty; nothing is allocated until the first append. */
static inline es_strbuf es__sb_init(es_mem_tag tag) {
  es_strbuf b = {NULL, 0, 0, 0, tag};
  return b;
}
void es__sb_printf(es_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The NUL-terminated text (es_mem_free it) and its length, or NULL (and the
 * buffer freed) when an append failed. */
char *es__sb_take(es_strbuf *b, size_t *len);

#endif
