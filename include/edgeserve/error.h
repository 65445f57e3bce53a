/* edgeserve/error.h - the one error table.
 *
 * Every public function returns 0 on success or a negative error code. Where
 * errno has an equivalent the code equals -errno (ES_ENOMEM == -ENOMEM), as in
 * libuv; codes without one live at -4000 and below. es_strerror() gives the
 * message, es_err_name() the symbolic name, both from the table below.
 *
 * A failure can also leave a precise, human-readable detail for the calling
 * thread ("arena exhausted: requested 4096 B, available 1024 B, missing 3072
 * B"). es_last_error_detail() returns it; the next failure on the same thread
 * replaces it. Functions that succeed do not clear it.
 *
 * Usage:
 *
 *   int rc = es_arena_alloc(arena, n, &p);
 *   if (rc < 0)
 *     fprintf(stderr, "%s: %s\n", es_err_name(rc), es_last_error_detail());
 *
 * Conventions of the public API (every include/edgeserve header):
 *   - Names: es_noun_verb for functions, declared only in these headers and
 *     marked ES_API (the only symbols a shared build exports). Internal
 *     cross-file functions are es__* and hidden; tests/layers/check_api.sh
 *     holds the library to this.
 *   - A call that can fail returns int: 0, or a negative ES_E* code with the
 *     detail in es_last_error_detail(); values come back through out
 *     parameters. A lookup may return its value when it cannot be negative
 *     (es_runtime_model_find: an id >= 0, or a code).
 *   - Plain getters that only a bad handle could make fail (a count, a
 *     size, a name, a borrowed pointer) return the value itself, and the
 *     empty value (0, NULL) for a NULL or dead handle.
 *   - retain returns its argument, or NULL (no reference taken) for a NULL
 *     or dead handle.
 *   - destroy, fini, and the release or free of a handle, return void and
 *     accept NULL, except the three that hand out handles which must come
 *     back first: es_runtime_destroy, es_admission_destroy and
 *     es_arena_pool_destroy return ES_EBUSY (nothing freed; give the handles
 *     back and call again) while such handles are held, and 0 for NULL.
 *     Giving a block back to its allocator (es_buddy_free,
 *     es_arena_pool_release) returns int: it catches double and foreign
 *     frees.
 */
#ifndef EDGESERVE_ERROR_H
#define EDGESERVE_ERROR_H

#include <errno.h>

#include "edgeserve/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* XX(name, value, message) */
#define ES_ERRNO_MAP(XX)                                                              \
  XX(EINVAL, -EINVAL, "invalid argument")                                            \
  XX(ENOMEM, -ENOMEM, "out of memory")                                               \
  XX(ENOSPC, -ENOSPC, "memory region exhausted")                                     \
  XX(EOVERFLOW, -EOVERFLOW, "size computation overflows")                            \
  XX(ETIMEDOUT, -ETIMEDOUT, "timed out")                                             \
  XX(EAGAIN, -EAGAIN, "resource temporarily unavailable")                            \
  XX(EBUSY, -EBUSY, "resource busy")                                                 \
  XX(ENOENT, -ENOENT, "no such file or directory")                                   \
  XX(EACCES, -EACCES, "permission denied")                                           \
  XX(EIO, -EIO, "i/o error")                                                         \
  XX(ENOTSUP, -ENOTSUP, "operation not supported")                                   \
  XX(ECORRUPT, -4001, "corrupted, foreign or destroyed object (bad magic)")          \
  XX(EFOREIGN, -4002, "pointer or object does not belong to this allocator")         \
  XX(EDOUBLEFREE, -4003, "block or arena released twice")                            \
  XX(EBADPTR, -4004, "pointer is inside a block but not its start")                  \
  XX(EMEMLOCK, -4005, "mlock failed: RLIMIT_MEMLOCK is too low (raise ulimit -l)")   \
  XX(EREWIND, -4006, "arena mark is stale or ahead of the current position")         \
  XX(ESTATE, -4007, "operation not allowed in the object's current state")            \
  XX(ECANCELED, -ECANCELED, "request cancelled")                                     \
  XX(EMODEL, -4100, "malformed or invalid model")                                   \
  XX(EBOUND, -4101, "a data-dependent shape outgrew the bound its plan holds")

typedef enum es_error {
  ES_OK = 0,
#define ES_ERR_ENUM_(name, value, msg) ES_##name = (value),
  ES_ERRNO_MAP(ES_ERR_ENUM_)
#undef ES_ERR_ENUM_
} es_error;

/* Message for an error code ("unknown error" for codes not in the table).
 * Thread-safe; the string is static. */
ES_API const char *es_strerror(int err);

/* Symbolic name ("ES_ENOSPC"), or "ES_UNKNOWN". Thread-safe; static string. */
ES_API const char *es_err_name(int err);

/* Detail of the calling thread's last failure, or "" if none. The string stays
 * valid until the next failure on this thread. Thread-safe (thread-local). */
ES_API const char *es_last_error_detail(void);

#ifdef __cplusplus
}
#endif
#endif
