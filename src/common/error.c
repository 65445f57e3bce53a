/* The error table's lookups, and the per-thread failure detail.
 *
 * Detail messages are formatted into a thread-local buffer so that a failing
 * call never allocates (it may be failing because memory ran out) and threads
 * never see each other's messages. */
#include "edgeserve/error.h"
#include "common/internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

const char *es_strerror(int err) {
  switch (err) {
  case ES_OK:
    return "success";
#define ES_ERR_MSG_(name, value, msg) \
  case ES_##name:                     \
    return msg;
    ES_ERRNO_MAP(ES_ERR_MSG_)
#undef ES_ERR_MSG_
  default:
    return "unknown error";
  }
}

const char *es_err_name(int err) {
  switch (err) {
  case ES_OK:
    return "ES_OK";
#define ES_ERR_NAME_(name, value, msg) \
  case ES_##name:                      \
    return "ES_" #name;
    ES_ERRNO_MAP(ES_ERR_NAME_)
#undef ES_ERR_NAME_
  default:
    return "ES_UNKNOWN";
  }
}

static _Thread_local char es_detail_[512];

const char *es_last_error_detail(void) { return es_detail_; }

int es__fail(int err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(es_detail_, sizeof es_detail_, fmt, ap);
  va_end(ap);
  if (n < 0)
    es_detail_[0] = '\0';
  return err;
}

_Noreturn void es__assert_fail(const char *expr, const char *file, int line) {
  fprintf(stderr, "edgeserve: internal invariant broken: %s (%s:%d)\n", expr, file, line);
  abort();
}
