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
};

static inline int es__model_ok(const es_model *m) { return m && m->magic == ES_MODEL_MAGIC; }

#endif
