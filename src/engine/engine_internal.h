/* Engine internals shared by model.c and plan.c. */
#ifndef ES_ENGINE_INTERNAL_H
#define ES_ENGINE_INTERNAL_H

#include <stdatomic.h>

#include "edgeserve/engine.h"
#include "kernels/kernel.h"
#include "model/graph.h"

#define ES_MODEL_MAGIC 0x45534d4f44454c31ull /* "ESMODEL1" */

struct es_model {
  uint64_t magic;
  _Atomic int refs;
  es_graph g;          /* immutable after load */
  es_prep_store *prep; /* prepared (reordered) weights, shared by all plans */
  int compiled;          /* loaded from an .esm file */
  int compiled_prepared; /* prepared-weight entries taken from it */
  int stale_compiled;    /* an .esm was asked for, its source differed: loaded the source */
};

/* Compiled model files (esm.c). */
int es__esm_is(const void *data, size_t size);
int es__esm_load(const char *path, es_model *m);
int es__sha256_file(const char *path, uint8_t out[32], uint64_t *size);

static inline int es__model_ok(const es_model *m) { return m && m->magic == ES_MODEL_MAGIC; }

#endif
