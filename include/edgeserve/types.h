/* edgeserve/types.h - element types, the vocabulary every layer shares.
 *
 *   size_t bytes = count * es_dtype_size(ES_DTYPE_FLOAT);   // 4 per element
 *   printf("%s\n", es_dtype_name(ES_DTYPE_INT64));          // "int64"
 *
 * Nothing here allocates or keeps state; every function is pure and
 * thread-safe. Included by the other public headers; includes nothing of
 * ours, so the lowest layer of the library may use it.
 */
#ifndef EDGESERVE_TYPES_H
#define EDGESERVE_TYPES_H

#include <stddef.h>
#include <stdint.h>

/* Marks the library's public functions: with everything else compiled with
 * hidden visibility, they are the only symbols a shared build exports. */
#ifndef ES_API
#if defined(__GNUC__)
#define ES_API __attribute__((visibility("default")))
#else
#define ES_API
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Dimensions a tensor may have. */
#define ES_MAX_RANK 8

/* Element types, numbered as ONNX's TensorProto.DataType. */
typedef enum es_dtype {
  ES_DTYPE_UNDEFINED = 0,
  ES_DTYPE_FLOAT = 1,
  ES_DTYPE_UINT8 = 2,
  ES_DTYPE_INT8 = 3,
  ES_DTYPE_INT32 = 6,
  ES_DTYPE_INT64 = 7,
  ES_DTYPE_BOOL = 9,
} es_dtype;

/* Bytes per element; 0 for an unsupported type. */
ES_API size_t es_dtype_size(es_dtype t);
/* "float32", "int64", ...; "undefined" otherwise. */
ES_API const char *es_dtype_name(es_dtype t);

#ifdef __cplusplus
}
#endif

#endif
