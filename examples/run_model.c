/* run_model: the smallest program on the installed library.
 *
 *   cc run_model.c $(pkg-config --cflags --libs edgeserve) -o run_model
 *   ./run_model model.onnx [DIM...]
 *
 * Loads an ONNX model, plans one request for its first input (DIMs replace
 * the dimensions the model leaves open, in order; 1 where none is given),
 * runs it once on an input of 0.5s in an arena of exactly the planned size,
 * and prints each output's shape and first values. The plan is made before
 * the run, so the arena's size is known before any request memory exists.
 * Only float32 inputs, and a model with one input: an example, not a tool
 * (`edgeserve run` is the tool). */
#include <edgeserve/engine.h>
#include <edgeserve/memory.h>

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s model.onnx [DIM...]\n", argv[0]);
    return 2;
  }
  es_model *m = NULL;
  es_plan *p = NULL;
  es_arena *arena = NULL;
  float *x = NULL;
  int rc = es_model_load(argv[1], NULL, &m);
  es_tensor_info in;
  if (rc == 0)
    rc = es_model_input_info(m, 0, &in);
  if (rc == 0 && (es_model_input_count(m) != 1 || in.dtype != ES_DTYPE_FLOAT || in.rank < 0)) {
    fprintf(stderr, "run_model: this example runs models with one float32 input of known rank\n");
    es_model_release(m);
    return 1;
  }
  size_t count = 1;
  for (int d = 0, next = 2; rc == 0 && d < in.rank; d++) {
    if (in.dims[d] < 0)
      in.dims[d] = next < argc ? atoll(argv[next++]) : 1;
    count *= (size_t)in.dims[d];
  }
  if (rc == 0)
    rc = es_model_plan(m, &in, 1, &p);
  if (rc == 0)
    rc = es_arena_create(es_plan_arena_bytes(p), 64, &arena);
  if (rc == 0 && !(x = malloc(count * sizeof *x)))
    rc = ES_ENOMEM;
  es_tensor xt = {.name = in.name, .dtype = ES_DTYPE_FLOAT, .rank = in.rank, .data = x,
                  .nbytes = count * sizeof *x};
  for (int d = 0; rc == 0 && d < in.rank; d++)
    xt.dims[d] = in.dims[d];
  for (size_t i = 0; x && i < count; i++)
    x[i] = 0.5f;
  int n_out = rc == 0 ? es_plan_output_count(p) : 0;
  es_tensor out[8];
  if (n_out > 8)
    n_out = 8;
  if (rc == 0)
    rc = es_plan_run(p, &xt, 1, arena, out, n_out);
  if (rc == 0) {
    printf("model %s: arena %zu bytes (planned before the run)\n", argv[1],
           es_plan_arena_bytes(p));
    for (int i = 0; i < n_out; i++) {
      printf("output %s: %s [", out[i].name, es_dtype_name(out[i].dtype));
      for (int d = 0; d < out[i].rank; d++)
        printf("%s%lld", d ? "," : "", (long long)out[i].dims[d]);
      printf("]");
      if (out[i].dtype == ES_DTYPE_FLOAT)
        for (size_t k = 0; k < 3 && k < out[i].nbytes / sizeof(float); k++)
          printf(" %g", (double)((const float *)out[i].data)[k]);
      printf("\n");
    }
  } else {
    fprintf(stderr, "run_model: %s: %s\n", es_strerror(rc), es_last_error_detail());
  }
  free(x);
  es_arena_destroy(arena);
  es_plan_release(p);
  es_model_release(m);
  return rc == 0 ? 0 : 1;
}
