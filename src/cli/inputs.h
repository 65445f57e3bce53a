/* Model inputs for the CLI's run and bench: .npy files by name or position,
 * or random tensors of a given shape. One place, so both commands accept the
 * same options the same way. */
#ifndef ES_CLI_INPUTS_H
#define ES_CLI_INPUTS_H

#include "cli/spec.h"
#include "edgeserve/engine.h"
#include "edgeserve/memory.h"

#define CLI_MAX_INPUTS CLI_SHAPES_MAX

typedef struct cli_inputs {
  const char *named[CLI_MAX_INPUTS]; /* "NAME=FILE.npy" */
  int n_named;
  const char *positional[CLI_MAX_INPUTS];
  int n_pos;
  cli_shape shapes[CLI_MAX_INPUTS]; /* --shape NAME=1x3x640x640: random data */
  int n_shapes;
  int precision; /* --precision (es_precision) */
} cli_inputs;

/* Consumes argv[*i] (and its value) if it is --input, --precision or --shape (parsed by
 * cli_shape_parse, so a malformed shape is a usage error here). Returns 1
 * when consumed, 0 when not ours, 2 on a usage error (printed). Positional
 * files are the caller's to add to ci->positional. */
int cli_inputs_arg(cli_inputs *ci, const char *cmd, int argc, char **argv, int *i);

/* Any other argument of run/bench: the model path first, then positional
 * input files. 0 when taken; 2 for an unknown option or too many inputs
 * (message printed; the caller prints its usage). */
int cli_inputs_positional(cli_inputs *ci, const char *cmd, const char *arg,
                          const char **model_path);

/* Fills in[] and shapes[] for every model input: from its file, or random
 * values in [-1, 1) for a --shape, or the model's own shape when fully fixed
 * (random values too). Returns 0, 1 (bad file or model) or 2 (usage),
 * having printed the reason. in[k].data is es_mem-allocated: free with
 * cli_inputs_free. */
int cli_inputs_load(es_model *m, const cli_inputs *ci, const char *cmd, es_tensor *in,
                    es_tensor_info *shapes);
void cli_inputs_free(es_tensor *in, int n);

/* The request path in miniature, for run and bench: the model, its inputs
 * (as cli_inputs_load makes them), one plan for their shapes and one
 * arena of exactly the planned size. */
typedef struct cli_session {
  es_model *model;
  es_plan *plan;
  es_arena *arena;
  es_tensor in[CLI_MAX_INPUTS];
  es_tensor_info shapes[CLI_MAX_INPUTS];
  int nin;
  double load_ms; /* es_model_load */
  double plan_ms; /* es_model_plan and the arena */
} cli_session;

/* Opens s for the model at path; 0, 1 (model or runtime error) or 2
 * (usage), having printed the reason. Close s whatever it returns. */
int cli_session_open(cli_session *s, const char *path, const cli_inputs *ci, const char *cmd);
void cli_session_close(cli_session *s);

#endif
