/* libFuzzer target for the ONNX loader alone: any byte string gives a
 * validated graph or an error, never a crash, a leak or an out-of-bounds
 * access; a graph that loads is sealed (its constants copied into one
 * read-only region) and freed. Linked against the loader library (common,
 * memory, model): no kernels, no oneDNN. fuzz_model covers what comes after
 * (lowering, planning, running).
 *
 *   build with -DES_FUZZ=ON (clang), then: fuzz_onnx_load -max_total_time=60 CORPUS */
#include <stdint.h>
#include <string.h>

#include "model/graph.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  es_graph g;
  memset(&g, 0, sizeof g);
  if (es__onnx_load(data, size, &g) < 0)
    return 0;
  es__graph_seal(&g);
  es__graph_fini(&g);
  return 0;
}
