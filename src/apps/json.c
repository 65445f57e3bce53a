/* The pipelines' answers as JSON, shared by the CLI and the server so both
 * print the same thing. A small growable buffer is enough: a few hundred
 * faces or text lines at most (memory/strbuf.h). Text from the recogniser is UTF-8 taken from
 * the keys file; control characters are escaped, everything else passes. */
#include "edgeserve/apps.h"
#include "common/internal.h"
#include "memory/strbuf.h"

#include <stdio.h>
#include <string.h>

static void jstr(es_strbuf *b, const char *s) {
  es__sb_printf(b, "\"");
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    if (*c == '"' || *c == '\\')
      es__sb_printf(b, "\\%c", *c);
    else if (*c < 0x20)
      es__sb_printf(b, "\\u%04x", *c);
    else
      es__sb_printf(b, "%c", *c);
  }
  es__sb_printf(b, "\"");
}

char *es_faces_json(const es_face *faces, int n, size_t *len) {
  es_strbuf b = es__sb_init(ES_MEM_APPS);
  es__sb_printf(&b, "{\"faces\":[");
  for (int i = 0; i < n; i++) {
    const es_face *f = &faces[i];
    es__sb_printf(&b, "%s{\"box\":[%.1f,%.1f,%.1f,%.1f],\"score\":%.4f,\"keypoints\":[",
                  i ? "," : "", (double)f->x0, (double)f->y0, (double)f->x1, (double)f->y1,
                  (double)f->score);
    for (int k = 0; k < 6; k++)
      es__sb_printf(&b, "%s[%.1f,%.1f]", k ? "," : "", (double)f->keypoints[k][0],
           (double)f->keypoints[k][1]);
    es__sb_printf(&b, "]}");
  }
  es__sb_printf(&b, "]}");
  return es__sb_take(&b, len);
}

char *es_ocr_json(const es_ocr_line *lines, int n, size_t *len) {
  es_strbuf b = es__sb_init(ES_MEM_APPS);
  es__sb_printf(&b, "{\"lines\":[");
  for (int i = 0; i < n; i++) {
    const es_ocr_line *l = &lines[i];
    es__sb_printf(&b, "%s{\"text\":", i ? "," : "");
    jstr(&b, l->text);
    es__sb_printf(&b, ",\"confidence\":%.4f,\"box_score\":%.4f,\"box\":[", (double)l->confidence,
         (double)l->box_score);
    for (int k = 0; k < 4; k++)
      es__sb_printf(&b, "%s[%.1f,%.1f]", k ? "," : "", (double)l->box[k][0], (double)l->box[k][1]);
    es__sb_printf(&b, "]}");
  }
  es__sb_printf(&b, "]}");
  return es__sb_take(&b, len);
}
