/* The pipelines' answers as JSON, shared by the CLI and the server so both
 * print the same thing. A small growable buffer is enough: a few hundred
 * faces or text lines at most. Text from the recogniser is UTF-8 taken from
 * the keys file; control characters are escaped, everything else passes. */
#include "edgeserve/apps.h"
#include "common/internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

typedef struct jbuf {
  char *p;
  size_t len, cap;
  int oom;
} jbuf;

static void jput(jbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void jput(jbuf *b, const char *fmt, ...) {
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
    char *np = b->p ? es_mem_realloc(b->p, cap) : es_mem_alloc(ES_MEM_APPS, cap);
    if (!np) {
      b->oom = 1;
      return;
    }
    b->p = np;
    b->cap = cap;
  }
}

static void jstr(jbuf *b, const char *s) {
  jput(b, "\"");
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    if (*c == '"' || *c == '\\')
      jput(b, "\\%c", *c);
    else if (*c < 0x20)
      jput(b, "\\u%04x", *c);
    else
      jput(b, "%c", *c);
  }
  jput(b, "\"");
}

static char *jdone(jbuf *b, size_t *len) {
  if (b->oom) {
    es_mem_free(b->p);
    return NULL;
  }
  if (len)
    *len = b->len;
  return b->p;
}

char *es_faces_json(const es_face *faces, int n, size_t *len) {
  jbuf b = {0};
  jput(&b, "{\"faces\":[");
  for (int i = 0; i < n; i++) {
    const es_face *f = &faces[i];
    jput(&b, "%s{\"box\":[%.1f,%.1f,%.1f,%.1f],\"score\":%.4f,\"keypoints\":[", i ? "," : "",
         (double)f->x0, (double)f->y0, (double)f->x1, (double)f->y1, (double)f->score);
    for (int k = 0; k < 6; k++)
      jput(&b, "%s[%.1f,%.1f]", k ? "," : "", (double)f->keypoints[k][0],
           (double)f->keypoints[k][1]);
    jput(&b, "]}");
  }
  jput(&b, "]}");
  return jdone(&b, len);
}

char *es_ocr_json(const es_ocr_line *lines, int n, size_t *len) {
  jbuf b = {0};
  jput(&b, "{\"lines\":[");
  for (int i = 0; i < n; i++) {
    const es_ocr_line *l = &lines[i];
    jput(&b, "%s{\"text\":", i ? "," : "");
    jstr(&b, l->text);
    jput(&b, ",\"confidence\":%.4f,\"box_score\":%.4f,\"box\":[", (double)l->confidence,
         (double)l->box_score);
    for (int k = 0; k < 4; k++)
      jput(&b, "%s[%.1f,%.1f]", k ? "," : "", (double)l->box[k][0], (double)l->box[k][1]);
    jput(&b, "]}");
  }
  jput(&b, "]}");
  return jdone(&b, len);
}
