/* libFuzzer target: any byte string given to es_model_load_buffer (loader,
 * load-time folding and fusion) gives a model or an error, never a crash, a
 * leak or an out-of-bounds access. A model that loads is also planned (unknown dimensions set to 1) and, when its arena is small,
 * run on zeros, so kernels' validation of shapes and attributes is fuzzed too.
 *
 *   build with -DES_FUZZ=ON (clang), then: fuzz_model -max_total_time=60 CORPUS */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "edgeserve/engine.h"
#include "edgeserve/memory.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  es_model *m;
  if (es_model_load_buffer(data, size, NULL, &m) < 0)
    return 0;
  int n = es_model_input_count(m);
  es_tensor_info shapes[8];
  es_tensor in[8];
  if (n > 8) {
    es_model_release(m);
    return 0;
  }
  size_t total = 0;
  for (int i = 0; i < n; i++) {
    es_model_input_info(m, i, &shapes[i]);
    if (shapes[i].rank < 0)
      shapes[i].rank = 1;
    size_t count = 1;
    for (int d = 0; d < shapes[i].rank; d++) {
      if (shapes[i].dims[d] < 0 || shapes[i].dims[d] > 64)
        shapes[i].dims[d] = shapes[i].dims[d] < 0 ? 1 : 64;
      count *= (size_t)shapes[i].dims[d];
    }
    size_t bytes = count * es_dtype_size(shapes[i].dtype);
    memset(&in[i], 0, sizeof in[i]);
    in[i].dtype = shapes[i].dtype;
    in[i].rank = shapes[i].rank;
    memcpy(in[i].dims, shapes[i].dims, sizeof in[i].dims);
    in[i].nbytes = bytes;
    total += bytes;
  }
  es_plan *p;
  if (total <= ((size_t)1 << 22) && es_model_plan(m, shapes, n, &p) == 0) {
    size_t need = es_plan_arena_bytes(p);
    es_arena *a;
    if (need <= ((size_t)16 << 20) && es_arena_create(need ? need : 64, 64, &a) == 0) {
      for (int i = 0; i < n; i++)
        in[i].data = calloc(1, in[i].nbytes ? in[i].nbytes : 1);
      es_tensor out[16];
      int nout = es_plan_output_count(p);
      es_plan_run(p, in, n, a, out, nout > 16 ? 16 : nout);
      for (int i = 0; i < n; i++)
        free(in[i].data);
      es_arena_destroy(a);
    }
    es_plan_release(p);
  }
  es_model_release(m);
  return 0;
}
