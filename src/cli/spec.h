/* Shape specs on the command line, parsed by one set of rules for every
 * command (inspect, run, bench, compile, plan, bench-lane):
 *
 *   NAME=DIMS   DIMS is decimal dimensions joined by 'x' ("1x3x640x640"),
 *               1 to ES_MAX_RANK of them, each 0..CLI_DIM_MAX (0 is an empty
 *               tensor, which the engine plans like any other). The name is
 *               everything before the last '=' (dimensions never hold one).
 *   MODEL[:NAME=DIMS[,NAME=DIMS]...]
 *               the model file, then the shapes of some of its inputs. Both
 *               a path and an input name may hold ':' ("input:0"), so the
 *               split is found on the disk: the whole argument when it names
 *               an existing file, else the first ':' whose left side is an
 *               existing file. When no prefix exists, the first ':' followed
 *               by text that parses as shapes is taken (the load then says
 *               which file is missing). Shapes in a list are separated by
 *               ','; a name holding ',' can only be given by --shape.
 *
 * Negative, empty, non-numeric and too large dimensions, more than
 * ES_MAX_RANK of them and a missing name are usage errors: the parsers
 * return -1 with a one-line reason that quotes the offending spec. */
#ifndef ES_CLI_SPEC_H
#define ES_CLI_SPEC_H

#include "edgeserve/engine.h"

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#define CLI_DIM_MAX ((int64_t)1 << 32)
#define CLI_WHY_MAX 160
#define CLI_SHAPES_MAX 32 /* shapes in one list */

typedef struct cli_shape {
  const char *name; /* into the parsed text: not NUL-terminated */
  size_t name_len;
  int rank;
  int64_t dims[ES_MAX_RANK];
} cli_shape;

/* "NAME=DIMS", len bytes at s. 0, or -1 with the reason in why. */
int cli_shape_parse(const char *s, size_t len, cli_shape *out, char why[CLI_WHY_MAX]);

/* "NAME=DIMS[,NAME=DIMS]..." into out[0..max); *n shapes. 0, or -1 with the
 * reason in why (also for more than max shapes). */
int cli_shapes_parse(const char *s, cli_shape *out, int max, int *n, char why[CLI_WHY_MAX]);

typedef struct cli_model_arg {
  char path[PATH_MAX];
  const char *specs; /* the shape list inside the argument; NULL when none */
} cli_model_arg;

/* MODEL[:SHAPES] as described above; the shapes are not parsed here (the
 * caller does, with cli_shapes_parse). 0, or -1 with the reason in why. */
int cli_model_arg_parse(const char *arg, cli_model_arg *out, char why[CLI_WHY_MAX]);

/* 1 when the spec names the input `name`. */
int cli_shape_is(const cli_shape *s, const char *name);

/* The index of the input the spec names among infos[0..n), else -1. */
int cli_shape_find(const cli_shape *s, const es_tensor_info *infos, int n);

/* Copies the spec's rank and dims into t (its name and dtype stay). */
void cli_shape_apply(const cli_shape *s, es_tensor_info *t);

/* 1 when t has no rank or a dimension fixed only at run time. */
int cli_shape_open(const es_tensor_info *t);

#endif
