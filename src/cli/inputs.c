/* Model inputs for the CLI: files, positions, random tensors of a shape. */
#include "cli/inputs.h"
#include "cli/cli.h"
#include "cli/npy.h"
#include "edgeserve/memory.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_inputs_arg(cli_inputs *ci, const char *cmd, int argc, char **argv, int *i) {
  const char *a = argv[*i];
  int got = cli_precision_arg(cmd, argc, argv, i, &ci->precision);
  if (got)
    return got;
  int is_input = !strcmp(a, "--input"), is_shape = !strcmp(a, "--shape");
  if (!is_input && !is_shape)
    return 0;
  if (*i + 1 >= argc) {
    fprintf(stderr, "edgeserve %s: %s wants a value\n", cmd, a);
    return 2;
  }
  const char *v = argv[++*i];
  if ((is_input ? ci->n_named : ci->n_shapes) == CLI_MAX_INPUTS) {
    fprintf(stderr, "edgeserve %s: too many %s options\n", cmd, a);
    return 2;
  }
  if (is_shape) {
    char why[CLI_WHY_MAX];
    if (cli_shape_parse(v, strlen(v), &ci->shapes[ci->n_shapes], why) < 0) {
      fprintf(stderr, "edgeserve %s: --shape: %s\n", cmd, why);
      return 2;
    }
    ci->n_shapes++;
    return 1;
  }
  const char *eq = strchr(v, '=');
  if (!eq || eq == v) {
    fprintf(stderr, "edgeserve %s: --input wants NAME=FILE.npy, got '%s'\n", cmd, v);
    return 2;
  }
  ci->named[ci->n_named++] = v;
  return 1;
}

int cli_inputs_positional(cli_inputs *ci, const char *cmd, const char *arg,
                          const char **model_path) {
  if (arg[0] == '-') {
    fprintf(stderr, "edgeserve %s: unknown or incomplete option '%s'\n", cmd, arg);
    return 2;
  }
  if (!*model_path) {
    *model_path = arg;
  } else if (ci->n_pos < CLI_MAX_INPUTS) {
    ci->positional[ci->n_pos++] = arg;
  } else {
    fprintf(stderr, "edgeserve %s: too many inputs\n", cmd);
    return 2;
  }
  return 0;
}

/* "NAME=FILE.npy": the name ends at the first '=' (a path may hold more). */
static int name_is(const char *spec, const char *name) {
  const char *eq = strchr(spec, '=');
  size_t len = (size_t)(eq - spec);
  return strlen(name) == len && !strncmp(spec, name, len);
}

static int has_input(es_model *m, const char *name, size_t len) {
  for (int i = 0; i < es_model_input_count(m); i++) {
    es_tensor_info info;
    es_model_input_info(m, i, &info);
    if (strlen(info.name) == len && !strncmp(info.name, name, len))
      return 1;
  }
  return 0;
}

static int random_tensor(es_tensor *t, const es_tensor_info *info, uint64_t seed) {
  uint64_t n = 1;
  for (int d = 0; d < info->rank; d++)
    if (__builtin_mul_overflow(n, (uint64_t)info->dims[d], &n) || n > ((uint64_t)1 << 32))
      return -1;
  size_t esz = es_dtype_size(info->dtype);
  t->dtype = info->dtype;
  t->rank = info->rank;
  memcpy(t->dims, info->dims, sizeof t->dims);
  t->nbytes = (size_t)n * esz;
  t->data = es_mem_aligned_alloc(ES_MEM_CLI, 64, t->nbytes ? t->nbytes : 1);
  if (!t->data)
    return -1;
  uint64_t s = seed;
  for (size_t i = 0; i < (size_t)n; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    double u = (double)(s >> 11) / 9007199254740992.0; /* [0, 1) */
    switch (info->dtype) {
    case ES_DTYPE_FLOAT:
      ((float *)t->data)[i] = (float)(2 * u - 1);
      break;
    case ES_DTYPE_INT64:
      ((int64_t *)t->data)[i] = (int64_t)(u * 16);
      break;
    case ES_DTYPE_INT32:
      ((int32_t *)t->data)[i] = (int32_t)(u * 16);
      break;
    default:
      ((uint8_t *)t->data)[i] = (uint8_t)(u * 2);
      break;
    }
  }
  return 0;
}

int cli_inputs_load(es_model *m, const cli_inputs *ci, const char *cmd, es_tensor *in,
                    es_tensor_info *shapes) {
  int nin = es_model_input_count(m);
  memset(in, 0, sizeof *in * (size_t)(nin > 0 ? nin : 1));
  if (nin > CLI_MAX_INPUTS) {
    fprintf(stderr, "edgeserve %s: the model has more than %d inputs\n", cmd, CLI_MAX_INPUTS);
    return 1;
  }
  if (ci->n_pos > nin) {
    fprintf(stderr, "edgeserve %s: %d inputs given, the model has %d\n", cmd, ci->n_pos, nin);
    return 2;
  }
  for (int k = 0; k < ci->n_named + ci->n_shapes; k++) {
    const char *name = k < ci->n_named ? ci->named[k] : ci->shapes[k - ci->n_named].name;
    size_t len = k < ci->n_named ? (size_t)(strchr(name, '=') - name)
                                 : ci->shapes[k - ci->n_named].name_len;
    if (!has_input(m, name, len)) {
      fprintf(stderr, "edgeserve %s: the model has no input named '%.*s'\n", cmd, (int)len,
              name);
      return 2;
    }
  }
  for (int i = 0; i < nin; i++) {
    es_tensor_info info;
    es_model_input_info(m, i, &info);
    const char *file = i < ci->n_pos ? ci->positional[i] : NULL;
    const cli_shape *shape = NULL;
    for (int k = 0; k < ci->n_named; k++)
      if (name_is(ci->named[k], info.name))
        file = strchr(ci->named[k], '=') + 1;
    for (int k = 0; k < ci->n_shapes; k++)
      if (cli_shape_is(&ci->shapes[k], info.name))
        shape = &ci->shapes[k];
    if (file) {
      if (cli_npy_read(file, &in[i]) < 0) {
        fprintf(stderr, "edgeserve %s: %s\n", cmd, es_last_error_detail());
        return 1;
      }
    } else {
      es_tensor_info want = info;
      if (shape)
        cli_shape_apply(shape, &want);
      if (cli_shape_open(&want)) {
        fprintf(stderr, "edgeserve %s: no data for input '%s' (--input %s=FILE.npy or --shape "
                        "%s=DxDxD)\n", cmd, info.name, info.name, info.name);
        return 2;
      }
      if (random_tensor(&in[i], &want, 0x5eed + (uint64_t)i) < 0) {
        fprintf(stderr, "edgeserve %s: cannot make a random input of that shape\n", cmd);
        return 1;
      }
    }
    shapes[i].name = info.name;
    shapes[i].dtype = in[i].dtype;
    shapes[i].rank = in[i].rank;
    memcpy(shapes[i].dims, in[i].dims, sizeof shapes[i].dims);
  }
  return 0;
}

void cli_inputs_free(es_tensor *in, int n) {
  for (int i = 0; i < n; i++) {
    es_mem_free(in[i].data);
    in[i].data = NULL;
  }
}

int cli_session_open(cli_session *s, const char *path, const cli_inputs *ci, const char *cmd) {
  memset(s, 0, sizeof *s);
  double t0 = cli_now_ms();
  es_model_options mo = {.precision = (es_precision)ci->precision};
  if (es_model_load(path, &mo, &s->model) < 0) {
    fprintf(stderr, "edgeserve %s: %s\n", cmd, es_last_error_detail());
    return 1;
  }
  s->load_ms = cli_now_ms() - t0;
  s->nin = es_model_input_count(s->model);
  int status = cli_inputs_load(s->model, ci, cmd, s->in, s->shapes);
  if (status)
    return status;
  t0 = cli_now_ms();
  if (es_model_plan(s->model, s->shapes, s->nin, &s->plan) < 0) {
    fprintf(stderr, "edgeserve %s: %s\n", cmd, es_last_error_detail());
    return 1;
  }
  size_t bytes = es_plan_arena_bytes(s->plan);
  if (es_arena_create(bytes ? bytes : 64, 64, &s->arena) < 0) {
    fprintf(stderr, "edgeserve %s: %s\n", cmd, es_last_error_detail());
    return 1;
  }
  s->plan_ms = cli_now_ms() - t0;
  return 0;
}

void cli_session_close(cli_session *s) {
  cli_inputs_free(s->in, CLI_MAX_INPUTS);
  es_arena_destroy(s->arena);
  es_plan_release(s->plan);
  es_model_release(s->model);
  memset(s, 0, sizeof *s);
}
