/* es_zoo_run: one model, loaded once, planned and run for each input given,
 * through the public API (tests/e2e/test_zoo.sh).
 *
 * Two reasons for it beside `edgeserve run`: the zoo test must tell "this
 * engine does not support the model yet" (not a failure while operators are
 * being added) from "the engine took the model and got it wrong" (a failure),
 * which takes the error code, not a message to match; and a model is loaded
 * once for both of its shapes (loading vgg11's 530 MB costs more than
 * running it).
 *
 *   es_zoo_run MODEL IN.npy OUTDIR [IN.npy OUTDIR]...
 *
 * For each pair: read IN.npy (the model's single input), plan for its shape,
 * run in an arena of exactly the planned size (the run must then have used
 * exactly that: planned bytes = measured bytes), write every output to
 * OUTDIR/NAME.npy (NAME with characters outside [A-Za-z0-9._-] replaced by
 * '_', as `edgeserve run` names them), print
 *   case K: arena BYTES (planned = used), run MS ms
 * Exit status, with one line "ES_<code>: <detail>" on stdout before it:
 *   0  every case ran
 *   3  ES_ENOTSUP while loading or planning: an operator, attribute or type
 *      the engine does not run (yet)
 *   1  any other refusal while loading or planning
 *   4  a run failed after its plan was made, or used other than the
 *      planned arena bytes
 *   2  usage, or an input or output file that cannot be read or written */
#include "cli/npy.h"
#include "edgeserve/engine.h"
#include "edgeserve/memory.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define MAX_OUT 16

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int refused(int rc) {
  printf("%s: %s\n", es_err_name(rc), es_last_error_detail());
  return rc == ES_ENOTSUP ? 3 : 1;
}

/* One case: 0, or the exit status (printed). */
static int run_case(es_model *m, int k, const char *in_path, const char *out_dir) {
  es_tensor in;
  memset(&in, 0, sizeof in);
  if (cli_npy_read(in_path, &in) < 0) {
    printf("input %s: %s\n", in_path, es_last_error_detail());
    return 2;
  }
  es_tensor_info shape;
  es_model_input_info(m, 0, &shape);
  shape.dtype = in.dtype;
  shape.rank = in.rank;
  memcpy(shape.dims, in.dims, sizeof shape.dims);
  in.name = shape.name;
  es_plan *p = NULL;
  es_arena *a = NULL;
  int status = 0, rc = es_model_plan(m, &shape, 1, &p);
  if (rc < 0) {
    status = refused(rc);
    goto out;
  }
  size_t bytes = es_plan_arena_bytes(p);
  if ((rc = es_arena_create(bytes ? bytes : 64, 64, &a)) < 0) {
    status = refused(rc);
    goto out;
  }
  es_tensor outs[MAX_OUT];
  int nout = es_plan_output_count(p);
  if (nout > MAX_OUT) {
    printf("ES_ENOTSUP: more than %d outputs\n", MAX_OUT);
    status = 3;
    goto out;
  }
  double t0 = now_ms();
  if ((rc = es_plan_run(p, &in, 1, a, outs, nout)) < 0) {
    printf("%s: %s\n", es_err_name(rc), es_last_error_detail());
    status = 4;
    goto out;
  }
  double ms = now_ms() - t0;
  /* The planner's promise: the arena it sized is exactly what the run used
   * (outputs included), no byte more or less. */
  if (es_arena_used(a) != bytes || es_arena_peak(a) != bytes) {
    printf("arena: planned %zu bytes, the run used %zu (peak %zu)\n", bytes, es_arena_used(a),
           es_arena_peak(a));
    status = 4;
    goto out;
  }
  if (mkdir(out_dir, 0777) < 0 && errno != EEXIST) {
    printf("cannot create %s: %s\n", out_dir, strerror(errno));
    status = 2;
    goto out;
  }
  for (int o = 0; o < nout; o++) {
    char name[256], path[4096];
    cli_npy_file_name(outs[o].name, name, sizeof name);
    snprintf(path, sizeof path, "%s/%s.npy", out_dir, name);
    if (cli_npy_write(path, &outs[o]) < 0) {
      printf("output %s: %s\n", path, es_last_error_detail());
      status = 2;
      goto out;
    }
  }
  printf("case %d: arena %zu (planned = used), run %.3f ms\n", k, bytes, ms);
out:
  es_arena_destroy(a);
  es_plan_release(p);
  es_mem_free(in.data);
  return status;
}

int main(int argc, char **argv) {
  if (argc < 4 || (argc - 2) % 2) {
    fprintf(stderr, "usage: es_zoo_run MODEL IN.npy OUTDIR [IN.npy OUTDIR]...\n");
    return 2;
  }
  es_model *m;
  double t0 = now_ms();
  int rc = es_model_load(argv[1], NULL, &m);
  if (rc < 0)
    return refused(rc);
  printf("load: %.1f ms\n", now_ms() - t0);
  int status = 0;
  if (es_model_input_count(m) != 1) {
    printf("ES_ENOTSUP: %d inputs (the zoo's models have one)\n", es_model_input_count(m));
    status = 3;
  }
  for (int i = 2, k = 1; i < argc && status == 0; i += 2, k++)
    status = run_case(m, k, argv[i], argv[i + 1]);
  es_model_release(m);
  return status;
}
