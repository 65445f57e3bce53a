/* Element types: sizes and names. One home for every layer (the loader,
 * the kernels, the codec and the CLI all ask here). */
#include "edgeserve/types.h"

size_t es_dtype_size(es_dtype t) {
  switch (t) {
  case ES_DTYPE_FLOAT:
  case ES_DTYPE_INT32:
    return 4;
  case ES_DTYPE_INT64:
    return 8;
  case ES_DTYPE_UINT8:
  case ES_DTYPE_INT8:
  case ES_DTYPE_BOOL:
    return 1;
  default:
    return 0;
  }
}

const char *es_dtype_name(es_dtype t) {
  switch (t) {
  case ES_DTYPE_FLOAT:
    return "float32";
  case ES_DTYPE_UINT8:
    return "uint8";
  case ES_DTYPE_INT8:
    return "int8";
  case ES_DTYPE_INT32:
    return "int32";
  case ES_DTYPE_INT64:
    return "int64";
  case ES_DTYPE_BOOL:
    return "bool";
  default:
    return "undefined";
  }
}
