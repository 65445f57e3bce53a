/* es_strbuf: see strbuf.h. Grows by doubling plus what the failed append
 * needed, so an append is formatted at most twice. */
#include "memory/strbuf.h"

#include <stdarg.h>
#include <stdio.h>

void es__sb_printf(es_strbuf *b, const char *fmt, ...) {
  while (!b->oom) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
      b->oom = 1;
      return;
    }
    if (b->p && (size_t)n < b->cap - b->len) {
      b->len += (size_t)n;
      return;
    }
    size_t cap = (b->cap ? b->cap * 2 : 1024) + (size_t)n;
    char *np = b->p ? es_mem_realloc(b->p, cap) : es_mem_alloc(b->tag, cap);
    if (!np) {
      b->oom = 1;
      return;
    }
    b->p = np;
    b->cap = cap;
  }
}

char *es__sb_take(es_strbuf *b, size_t *len) {
  if (!b->p)
    es__sb_printf(b, "%s", ""); /* nothing appended: an empty string */
  if (b->oom) {
    es_mem_free(b->p);
    b->p = NULL;
    return NULL;
  }
  char *p = b->p;
  if (len)
    *len = b->len;
  b->p = NULL;
  b->len = b->cap = 0;
  return p;
}
