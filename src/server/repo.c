/* Server configuration, the model repository and the server's lifecycle.
 *
 * Where models come from, in order: a repository folder (one sub-folder per
 * model: its .onnx/.esm file and an optional config.json), the "models"
 * object of a server config file, and, when neither names any model, an
 * embedded default that serves the five target models from the fetched
 * models folder, so `edgeserve serve` works with no arguments.
 *
 * A model that fails to load does not stop the server: it is listed by the
 * repository index as UNAVAILABLE with the reason, and can be loaded later
 * through the repository API once fixed.
 *
 * Each model has a state (UNLOADED, LOADING, READY, UNLOADING) changed only
 * under the server's mutex, and a count of the requests holding it; the
 * thread that moves a model into LOADING or UNLOADING is the only one that
 * works on it until it settles, and the others wait on the server's
 * condition variable (server_internal.h tells the rules). Slow work (reading
 * a model file, waiting for requests to finish) happens outside the mutex.
 *
 * The memory budget is "auto" unless the configuration gives bytes: a
 * server built from the default configuration never runs unbounded. */
#include "common/internal.h"
#include "server/codec.h"
#include "server/server_internal.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- config -------------------------------------------------------------------- */

void es_server_config_default(es_server_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  snprintf(cfg->host, sizeof cfg->host, "127.0.0.1");
  cfg->port = 8000;
  snprintf(cfg->model_dir, sizeof cfg->model_dir, ".cache/models");
  cfg->use_default_models = 1;
  es_runtime_config_default(&cfg->runtime);
  cfg->memory_budget_auto = 1; /* an unbounded budget only when asked for */
  cfg->max_body_bytes = (size_t)64 << 20;
  cfg->max_buffered_bytes = (size_t)256 << 20;
  cfg->max_header_bytes = (size_t)16 << 10;
  cfg->read_buffer_bytes = SRV_READ_BUFFER_DEFAULT;
  cfg->max_connections = 4096;
  cfg->max_connections_per_client = 256;
  cfg->idle_timeout_s = 30;
  cfg->header_timeout_s = 10;
  cfg->body_timeout_s = 60;
  cfg->http_threads = 2;
  cfg->pipeline_threads = 2;
  cfg->pipeline_queue = 64;
  cfg->max_elements = (size_t)64 << 20;
}

void es_server_config_fini(es_server_config *cfg) {
  if (!cfg)
    return;
  es_mem_free(cfg->models_json);
  cfg->models_json = NULL;
}

/* 123, "123", "64K", "512M", "2G". */
static int size_of(json_t *v, size_t *out) {
  if (json_is_integer(v) && json_integer_value(v) >= 0) {
    *out = (size_t)json_integer_value(v);
    return 0;
  }
  if (!json_is_string(v))
    return -1;
  const char *s = json_string_value(v);
  char *end;
  errno = 0;
  unsigned long long n = strtoull(s, &end, 10);
  if (errno || end == s)
    return -1;
  unsigned shift = 0;
  if (*end == 'K' || *end == 'k')
    shift = 10;
  else if (*end == 'M' || *end == 'm')
    shift = 20;
  else if (*end == 'G' || *end == 'g')
    shift = 30;
  if (shift)
    end++;
  if (*end == 'i')
    end++;
  if (*end == 'B')
    end++;
  if (*end || (shift && n > (~0ull >> shift)))
    return -1;
  *out = (size_t)(n << shift);
  return 0;
}

static int int_of(json_t *v, long lo, long hi, long *out) {
  if (!json_is_integer(v))
    return -1;
  json_int_t x = json_integer_value(v);
  if (x < lo || x > hi)
    return -1;
  *out = (long)x;
  return 0;
}

int es_server_config_load(es_server_config *cfg, const char *path) {
  json_error_t je;
  json_t *root = json_load_file(path, 0, &je);
  if (!root)
    return es__fail(ES_EINVAL, "%s:%d: %s", path, je.line, je.text);
  if (!json_is_object(root)) {
    json_decref(root);
    return es__fail(ES_EINVAL, "%s: the config must be a JSON object", path);
  }
  const char *key;
  json_t *v;
  int rc = 0;
  json_object_foreach(root, key, v) {
    long n;
    size_t z;
    es_runtime_config *r = &cfg->runtime;
#define INT_FIELD(name, lo, hi, dst)                                                   \
  else if (!strcmp(key, name)) {                                                       \
    if (int_of(v, lo, hi, &n) < 0) {                                                   \
      rc = es__fail(ES_EINVAL, "%s: \"%s\" must be an integer in %ld..%ld", path, name, \
                    (long)(lo), (long)(hi));                                           \
      break;                                                                           \
    }                                                                                  \
    dst = n;                                                                           \
  }
#define SIZE_FIELD(name, dst)                                                          \
  else if (!strcmp(key, name)) {                                                       \
    if (size_of(v, &z) < 0) {                                                          \
      rc = es__fail(ES_EINVAL, "%s: \"%s\" must be bytes (1048576, \"512M\", \"2G\")",  \
                    path, name);                                                       \
      break;                                                                           \
    }                                                                                  \
    dst = z;                                                                           \
  }
#define REAL_FIELD(name, dst)                                                          \
  else if (!strcmp(key, name)) {                                                       \
    if (!json_is_number(v) || json_number_value(v) <= 0 || json_number_value(v) > 1) { \
      rc = es__fail(ES_EINVAL, "%s: \"%s\" must be a number in (0, 1]", path, name);    \
      break;                                                                           \
    }                                                                                  \
    dst = json_number_value(v);                                                        \
  }
    if (!strcmp(key, "host")) {
      if (!json_is_string(v) || strlen(json_string_value(v)) >= sizeof cfg->host) {
        rc = es__fail(ES_EINVAL, "%s: \"host\" must be an IPv4 address string", path);
        break;
      }
      snprintf(cfg->host, sizeof cfg->host, "%s", json_string_value(v));
    } else if (!strcmp(key, "model_repository")) {
      if (!json_is_string(v)) {
        rc = es__fail(ES_EINVAL, "%s: \"model_repository\" must be a path", path);
        break;
      }
      snprintf(cfg->repository, sizeof cfg->repository, "%s", json_string_value(v));
    } else if (!strcmp(key, "model_dir")) {
      if (!json_is_string(v)) {
        rc = es__fail(ES_EINVAL, "%s: \"model_dir\" must be a path", path);
        break;
      }
      snprintf(cfg->model_dir, sizeof cfg->model_dir, "%s", json_string_value(v));
    } else if (!strcmp(key, "mlock")) {
      if (!json_is_boolean(v)) {
        rc = es__fail(ES_EINVAL, "%s: \"mlock\" must be true or false", path);
        break;
      }
      cfg->mlock = json_is_true(v);
    } else if (!strcmp(key, "cache_dir")) {
      if (!json_is_string(v) || strlen(json_string_value(v)) >= sizeof cfg->cache_dir) {
        rc = es__fail(ES_EINVAL, "%s: \"cache_dir\" must be a path", path);
        break;
      }
      snprintf(cfg->cache_dir, sizeof cfg->cache_dir, "%s", json_string_value(v));
    } else if (!strcmp(key, "memory_budget")) {
      if (json_is_string(v) && !strcmp(json_string_value(v), "auto")) {
        cfg->memory_budget_auto = 1;
      } else if (size_of(v, &z) == 0) {
        r->memory_budget_bytes = z;
        cfg->memory_budget_auto = 0; /* given: 0 means unbounded, on purpose */
      } else {
        rc = es__fail(ES_EINVAL, "%s: \"memory_budget\" must be bytes (1048576, \"512M\", "
                      "\"2G\"), 0 for no budget, or \"auto\"", path);
        break;
      }
    } else if (!strcmp(key, "repository_control")) {
      if (!json_is_boolean(v)) {
        rc = es__fail(ES_EINVAL, "%s: \"repository_control\" must be true or false", path);
        break;
      }
      cfg->repository_control = json_is_true(v);
    } else if (!strcmp(key, "control_token")) {
      if (!json_is_string(v) || !es__srv_token_valid(json_string_value(v))) {
        rc = es__fail(ES_EINVAL, "%s: \"control_token\" must be a string of 16 to %d visible "
                      "ASCII characters", path, ES_SERVER_TOKEN_MAX - 1);
        break;
      }
      snprintf(cfg->control_token, sizeof cfg->control_token, "%s", json_string_value(v));
    } else if (!strcmp(key, "models")) {
      if (!json_is_object(v)) {
        rc = es__fail(ES_EINVAL, "%s: \"models\" must be an object of name: config", path);
        break;
      }
      /* Kept as text, so the config stays a plain struct its caller owns
       * (freed by es_server_config_fini) and two configs never share it. */
      char *txt = json_dumps(v, JSON_COMPACT);
      char *own = txt ? es_mem_strdup(ES_MEM_SERVER, txt) : NULL;
      free(txt);
      if (!own) {
        rc = es__fail(ES_ENOMEM, "%s: no memory for \"models\"", path);
        break;
      }
      es_mem_free(cfg->models_json);
      cfg->models_json = own;
      const char *slash = strrchr(path, '/');
      snprintf(cfg->models_base, sizeof cfg->models_base, "%.*s",
               slash ? (int)(slash - path) : 1, slash ? path : ".");
    }
    INT_FIELD("port", 0, 65535, cfg->port)
    INT_FIELD("workers", 0, 1024, r->workers)
    INT_FIELD("pin", 0, 1, r->pin)
    INT_FIELD("intra_threads", 1, 1024, r->intra_threads)
    INT_FIELD("priorities", 1, 16, r->priorities)
    INT_FIELD("preempt", 0, 1, r->preempt)
    INT_FIELD("rt_priority", 0, 98, r->rt_priority)
    INT_FIELD("rt_levels", 1, 16, r->rt_levels)
    INT_FIELD("queue_capacity", 1, 1 << 20, r->queue_capacity)
    INT_FIELD("max_inflight", 0, 1 << 20, r->max_inflight_total)
    INT_FIELD("model_max_inflight", 0, 1 << 20, r->model_max_inflight)
    INT_FIELD("watch_ms", 0, 60000, r->watch_ms)
    INT_FIELD("buddy_decay_ms", 0, 3600000, r->buddy_decay_ms)
    INT_FIELD("max_connections", 1, 1 << 16, cfg->max_connections)
    INT_FIELD("max_connections_per_client", 0, 1 << 16, cfg->max_connections_per_client)
    INT_FIELD("connection_timeout_s", 1, 3600, cfg->idle_timeout_s)
    INT_FIELD("idle_timeout_s", 1, 3600, cfg->idle_timeout_s)
    INT_FIELD("header_timeout_s", 1, 3600, cfg->header_timeout_s)
    INT_FIELD("body_timeout_s", 1, 3600, cfg->body_timeout_s)
    INT_FIELD("http_threads", 1, 64, cfg->http_threads)
    INT_FIELD("pipeline_threads", 1, 64, cfg->pipeline_threads)
    INT_FIELD("pipeline_queue", 1, 1 << 16, cfg->pipeline_queue)
    INT_FIELD("quiet", 0, 1, cfg->quiet)
    SIZE_FIELD("buddy_bytes", r->buddy_bytes)
    SIZE_FIELD("max_body_bytes", cfg->max_body_bytes)
    SIZE_FIELD("max_buffered_bytes", cfg->max_buffered_bytes)
    SIZE_FIELD("max_header_bytes", cfg->max_header_bytes)
    SIZE_FIELD("read_buffer_bytes", cfg->read_buffer_bytes)
    SIZE_FIELD("max_elements", cfg->max_elements)
    REAL_FIELD("soft_ratio", r->soft_ratio)
    REAL_FIELD("hard_ratio", r->hard_ratio)
    else {
      rc = es__fail(ES_EINVAL, "%s: unknown field \"%s\"", path, key);
      break;
    }
#undef INT_FIELD
#undef SIZE_FIELD
#undef REAL_FIELD
  }
  json_decref(root);
  return rc;
}

/* ---- model entries ----------------------------------------------------------------- */

/* "sequence": {"states": {"h0": "hn", ...}, "max_sequences": 64,
 * "idle_timeout_ms": 60000, "reserve": "step" | "max",
 * "max_state_bytes": "1M", "state_budget_bytes": "64M"}: the model serves
 * sequences (runtime.h). */
static int sequence_from_json(srv_model *sm, json_t *o, const char *name, const char *src) {
  if (!json_is_object(o))
    return es__fail(ES_EINVAL, "%s: model '%s': sequence must be an object", src, name);
  const char *key;
  json_t *v;
  long n;
  json_object_foreach(o, key, v) {
    if (!strcmp(key, "states")) {
      const char *in;
      json_t *out;
      if (!json_is_object(v) || !json_object_size(v))
        return es__fail(ES_EINVAL, "%s: model '%s': sequence.states must be {\"input\": "
                        "\"output\", ...}", src, name);
      json_object_foreach(v, in, out) {
        if (sm->n_states >= ES_RT_MAX_IO || !json_is_string(out) || strlen(in) >= 64 ||
            strlen(json_string_value(out)) >= 64)
          return es__fail(ES_EINVAL, "%s: model '%s': bad state pair for '%s'", src, name, in);
        snprintf(sm->state_in[sm->n_states], 64, "%s", in);
        snprintf(sm->state_out[sm->n_states], 64, "%s", json_string_value(out));
        sm->n_states++;
      }
    } else if (!strcmp(key, "max_sequences")) {
      if (int_of(v, 1, 1 << 20, &n) < 0)
        return es__fail(ES_EINVAL, "%s: model '%s': sequence.max_sequences must be 1..%d", src,
                        name, 1 << 20);
      sm->max_sequences = (unsigned)n;
    } else if (!strcmp(key, "idle_timeout_ms")) {
      if (int_of(v, 1, 1L << 30, &n) < 0)
        return es__fail(ES_EINVAL, "%s: model '%s': sequence.idle_timeout_ms must be positive",
                        src, name);
      sm->sequence_idle_ms = (int)n;
    } else if (!strcmp(key, "reserve")) {
      const char *r = json_is_string(v) ? json_string_value(v) : "";
      sm->state_reserve = !strcmp(r, "step") ? ES_STATE_RESERVE_STEP
                          : !strcmp(r, "max") ? ES_STATE_RESERVE_MAX : -1;
      if (sm->state_reserve < 0)
        return es__fail(ES_EINVAL, "%s: model '%s': sequence.reserve must be \"step\" or "
                        "\"max\"", src, name);
    } else if (!strcmp(key, "max_state_bytes") || !strcmp(key, "state_budget_bytes")) {
      if (size_of(v, key[0] == 'm' ? &sm->state_max_bytes : &sm->state_budget_bytes) < 0)
        return es__fail(ES_EINVAL, "%s: model '%s': sequence.%s must be bytes "
                        "(123, \"64K\", \"1M\")", src, name, key);
    } else {
      return es__fail(ES_EINVAL, "%s: model '%s': unknown field \"sequence.%s\"", src, name,
                      key);
    }
  }
  if (!sm->n_states)
    return es__fail(ES_EINVAL, "%s: model '%s': sequence needs states", src, name);
  return 0;
}

static int model_from_json(srv_model *sm, const char *name, json_t *o, const char *dir,
                           const char *src) {
  memset(sm, 0, sizeof *sm);
  snprintf(sm->name, sizeof sm->name, "%s", name);
  snprintf(sm->platform, sizeof sm->platform, "onnx");
  sm->rt_id = -1;
  sm->priority = 1;
  sm->max_priority = -1;
  sm->lane = -1;
  sm->share = 1;
  sm->load_at_start = 1;
  const char *key;
  json_t *v;
  long n;
  json_object_foreach(o, key, v) {
    if (!strcmp(key, "file") || !strcmp(key, "path")) {
      if (!json_is_string(v))
        return es__fail(ES_EINVAL, "%s: model '%s': \"%s\" must be a string", src, name, key);
      const char *f = json_string_value(v);
      if (f[0] == '/')
        snprintf(sm->path, sizeof sm->path, "%s", f);
      else
        snprintf(sm->path, sizeof sm->path, "%s/%s", dir, f);
    } else if (!strcmp(key, "pipeline")) {
      const char *k = json_is_string(v) ? json_string_value(v) : "";
      sm->pipeline = !strcmp(k, "face") ? SRV_PIPE_FACE : !strcmp(k, "ocr") ? SRV_PIPE_OCR : -1;
      if (sm->pipeline < 0)
        return es__fail(ES_EINVAL, "%s: model '%s': pipeline must be \"face\" or \"ocr\"", src,
                        name);
      snprintf(sm->platform, sizeof sm->platform, "pipeline");
    } else if (!strcmp(key, "model") || !strcmp(key, "det") || !strcmp(key, "cls") ||
               !strcmp(key, "rec")) {
      if (!json_is_string(v) || strlen(json_string_value(v)) >= ES_RT_NAME_MAX)
        return es__fail(ES_EINVAL, "%s: model '%s': \"%s\" must name a model", src, name, key);
      int slot = !strcmp(key, "cls") ? 1 : !strcmp(key, "rec") ? 2 : 0;
      snprintf(sm->member[slot], sizeof sm->member[slot], "%s", json_string_value(v));
    } else if (!strcmp(key, "keys")) {
      if (!json_is_string(v))
        return es__fail(ES_EINVAL, "%s: model '%s': \"keys\" must be a path", src, name);
      const char *f = json_string_value(v);
      snprintf(sm->keys, sizeof sm->keys, f[0] == '/' ? "%s%s" : "%s/%s", f[0] == '/' ? "" : dir,
               f);
    } else if (!strcmp(key, "priority")) {
      if (int_of(v, 0, 15, &n) < 0)
        return es__fail(ES_EINVAL, "%s: model '%s': priority must be 0..15", src, name);
      sm->priority = (int)n;
    } else if (!strcmp(key, "max_priority")) {
      if (int_of(v, 0, 15, &n) < 0)
        return es__fail(ES_EINVAL, "%s: model '%s': max_priority must be 0..15", src, name);
      sm->max_priority = (int)n;
    } else if (!strcmp(key, "lane")) {
      if (int_of(v, -1, 1023, &n) < 0)
        return es__fail(ES_EINVAL, "%s: model '%s': lane must be -1..1023", src, name);
      sm->lane = (int)n;
    } else if (!strcmp(key, "max_concurrency")) {
      if (int_of(v, 0, 1 << 20, &n) < 0)
        return es__fail(ES_EINVAL, "%s: model '%s': max_concurrency must be >= 0", src, name);
      sm->max_concurrency = (unsigned)n;
    } else if (!strcmp(key, "plans")) {
      if (int_of(v, 1, 4096, &n) < 0)
        return es__fail(ES_EINVAL, "%s: model '%s': plans must be 1..4096", src, name);
      sm->plans = (unsigned)n;
    } else if (!strcmp(key, "instances")) {
      if (int_of(v, 0, 4096, &n) < 0)
        return es__fail(ES_EINVAL, "%s: model '%s': instances must be 0..4096", src, name);
      sm->instances = (unsigned)n;
    } else if (!strcmp(key, "share") || !strcmp(key, "load")) {
      if (!json_is_boolean(v))
        return es__fail(ES_EINVAL, "%s: model '%s': \"%s\" must be true or false", src, name,
                        key);
      if (!strcmp(key, "share"))
        sm->share = json_is_true(v);
      else
        sm->load_at_start = json_is_true(v);
    } else if (!strcmp(key, "precision")) {
      es_precision p;
      if (!json_is_string(v) || es_precision_parse(json_string_value(v), &p) < 0)
        return es__fail(ES_EINVAL, "%s: model '%s': precision must be \"auto\", \"fp32\", "
                        "\"bf16\" or \"int8\"", src, name);
      sm->precision = (int)p;
    } else if (!strcmp(key, "sequence")) {
      int rc = sequence_from_json(sm, v, name, src);
      if (rc < 0)
        return rc;
    } else if (!strcmp(key, "shape")) {
      const char *in;
      json_t *dims;
      if (!json_is_object(v))
        return es__fail(ES_EINVAL, "%s: model '%s': shape must be {\"input\": [dims]}", src,
                        name);
      json_object_foreach(v, in, dims) {
        if (sm->n_shapes >= ES_RT_MAX_IO || !json_is_array(dims) ||
            json_array_size(dims) > ES_MAX_RANK || strlen(in) >= 64)
          return es__fail(ES_EINVAL, "%s: model '%s': bad shape for '%s'", src, name, in);
        es_tensor_info *ti = &sm->shapes[sm->n_shapes];
        snprintf(sm->shape_names[sm->n_shapes], 64, "%s", in);
        ti->name = sm->shape_names[sm->n_shapes];
        ti->rank = (int)json_array_size(dims);
        for (int d = 0; d < ti->rank; d++) {
          json_t *x = json_array_get(dims, (size_t)d);
          if (!json_is_integer(x) || json_integer_value(x) < 1 ||
              json_integer_value(x) > (1 << 24))
            return es__fail(ES_EINVAL, "%s: model '%s': shape of '%s' needs positive dims", src,
                            name, in);
          ti->dims[d] = json_integer_value(x);
        }
        sm->n_shapes++;
      }
    } else {
      return es__fail(ES_EINVAL, "%s: model '%s': unknown field \"%s\"", src, name, key);
    }
  }
  if (sm->pipeline == SRV_PIPE_FACE && !sm->member[0][0])
    return es__fail(ES_EINVAL, "%s: pipeline '%s': no \"model\"", src, name);
  if (sm->pipeline == SRV_PIPE_OCR && (!sm->member[0][0] || !sm->member[2][0] || !sm->keys[0]))
    return es__fail(ES_EINVAL, "%s: pipeline '%s': needs \"det\", \"rec\" and \"keys\"", src,
                    name);
  if (!sm->pipeline && !sm->path[0])
    return es__fail(ES_EINVAL, "%s: model '%s': no \"file\"", src, name);
  if (sm->max_priority < 0) /* clients may not jump ahead of the default */
    sm->max_priority = sm->priority;
  else if (sm->max_priority > sm->priority)
    return es__fail(ES_EINVAL, "%s: model '%s': max_priority %d is below its own priority %d "
                    "(0 is the highest level; a request that does not ask runs at priority, "
                    "max_priority caps what a request may ask for)", src, name,
                    sm->max_priority, sm->priority);
  return 0;
}

static int add_model(es_server *s, const srv_model *sm) {
  if (es__srv_find(s, sm->name))
    return es__fail(ES_EBUSY, "model '%s' is configured twice", sm->name);
  if (s->n_models >= SRV_MAX_MODELS)
    return es__fail(ES_ENOSPC, "more than %d models", SRV_MAX_MODELS);
  srv_model *dst = &s->models[s->n_models++];
  *dst = *sm;
  for (int i = 0; i < dst->n_shapes; i++) /* names point into the copy */
    dst->shapes[i].name = dst->shape_names[i];
  return 0;
}

/* A repository folder: DIR/NAME/config.json (optional) and the model file
 * (config "file", else the only .esm or .onnx in the folder). */
static int scan_repository(es_server *s, const char *root) {
  DIR *d = opendir(root);
  if (!d)
    return es__fail(ES_ENOENT, "model repository %s: %s", root, strerror(errno));
  struct dirent *e;
  int rc = 0;
  while (rc == 0 && (e = readdir(d))) {
    if (e->d_name[0] == '.')
      continue;
    char dir[2048], cfgp[2100];
    snprintf(dir, sizeof dir, "%s/%s", root, e->d_name);
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
      continue;
    snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
    json_t *o = NULL;
    if (access(cfgp, F_OK) == 0) {
      json_error_t je;
      o = json_load_file(cfgp, 0, &je);
      if (!o || !json_is_object(o)) {
        json_decref(o);
        rc = es__fail(ES_EINVAL, "%s:%d: %s", cfgp, je.line,
                      o ? "must be a JSON object" : je.text);
        break;
      }
    } else {
      o = json_object();
    }
    if (!json_object_get(o, "file")) {
      DIR *md = opendir(dir);
      struct dirent *f;
      char found[512] = "";
      while (md && (f = readdir(md))) {
        size_t n = strlen(f->d_name);
        if ((n > 5 && !strcmp(f->d_name + n - 5, ".onnx")) ||
            (n > 4 && !strcmp(f->d_name + n - 4, ".esm") && !found[0]))
          snprintf(found, sizeof found, "%s", f->d_name);
      }
      if (md)
        closedir(md);
      if (found[0])
        json_object_set_new(o, "file", json_string(found));
    }
    srv_model sm;
    rc = model_from_json(&sm, e->d_name, o, dir, cfgp);
    json_decref(o);
    if (rc == 0)
      rc = add_model(s, &sm);
  }
  closedir(d);
  return rc;
}

/* A JSON object of name: model config (a config file's "models", or the
 * embedded default); relative paths are taken from base. */
static int add_models(es_server *s, const char *text, const char *base, const char *src) {
  json_error_t je;
  json_t *o = json_loads(text, 0, &je);
  if (!json_is_object(o)) {
    json_decref(o);
    return es__fail(ES_EINVAL, "%s: \"models\" must be an object of name: config", src);
  }
  const char *name;
  json_t *v;
  int rc = 0;
  json_object_foreach(o, name, v) {
    srv_model sm;
    rc = json_is_object(v) ? model_from_json(&sm, name, v, base, src)
                           : es__fail(ES_EINVAL, "%s: model '%s' must be an object", src, name);
    if (rc == 0)
      rc = add_model(s, &sm);
    if (rc < 0)
      break;
  }
  json_decref(o);
  return rc;
}

/* The embedded default: the target models, configured for the shapes the
 * gateway scenario serves. The face pipeline (the door camera) is the one
 * urgent stream: level 0, which preemption pauses the others for and
 * rt_priority runs real-time (rt_levels 1). */
static const char default_models[] =
    "{\"blazeface_front\": {\"file\": \"blazeface_front_128.onnx\", \"priority\": 1},"
    " \"blazeface_back\": {\"file\": \"blazeface_back_256.onnx\", \"priority\": 1},"
    " \"ppocr_det\": {\"file\": \"ppocr_det.onnx\", \"priority\": 1,"
    "                 \"shape\": {\"x\": [1, 3, 640, 640]}},"
    " \"ppocr_rec\": {\"file\": \"ppocr_rec.onnx\", \"priority\": 2, \"plans\": 96,"
    "                 \"shape\": {\"x\": [1, 3, 48, 320]}},"
    " \"ppocr_cls\": {\"file\": \"ppocr_cls.onnx\", \"priority\": 2,"
    "                 \"shape\": {\"x\": [1, 3, 48, 192]}},"
    " \"face\": {\"pipeline\": \"face\", \"model\": \"blazeface_front\", \"priority\": 0},"
    " \"ocr\": {\"pipeline\": \"ocr\", \"det\": \"ppocr_det\", \"cls\": \"ppocr_cls\","
    "          \"rec\": \"ppocr_rec\", \"keys\": \"ppocr_keys_v1.txt\", \"priority\": 2}}";

/* ---- lifecycle ---------------------------------------------------------------------- */

srv_model *es__srv_find(es_server *s, const char *name) {
  for (int i = 0; i < s->n_models; i++)
    if (!strcmp(s->models[i].name, name))
      return &s->models[i];
  return NULL;
}

/* Wait, mutex held, until no thread is loading or unloading sm. Each such
 * transition ends by itself (a load, or an unload bounded by its timeout),
 * so the wait does too. */
static void wait_settled(es_server *s, srv_model *sm) {
  while (sm->state == SRV_LOADING || sm->state == SRV_UNLOADING)
    pthread_cond_wait(&s->cv, &s->mu);
}

/* pthread_cond_timedwait on the monotonic clock until deadline_ns (0: no
 * deadline). Mutex held. ETIMEDOUT once it has passed. */
static int wait_until(es_server *s, uint64_t deadline_ns) {
  if (!deadline_ns)
    return pthread_cond_wait(&s->cv, &s->mu);
  uint64_t now = es__now_ns();
  if (now >= deadline_ns)
    return ETIMEDOUT;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  uint64_t ns = (uint64_t)ts.tv_nsec + (deadline_ns - now);
  ts.tv_sec += (time_t)(ns / 1000000000ull);
  ts.tv_nsec = (long)(ns % 1000000000ull);
  return pthread_cond_timedwait(&s->cv, &s->mu, &ts);
}

static int plain_load(es_server *s, const srv_model *sm, int *id) {
  es_model_config mc;
  es_model_config_default(&mc);
  mc.name = sm->name;
  mc.path = sm->path;
  mc.shapes = sm->n_shapes ? sm->shapes : NULL;
  mc.n_shapes = sm->n_shapes;
  mc.lane = sm->lane;
  mc.max_inflight = sm->max_concurrency;
  mc.arenas = sm->instances;
  mc.share = sm->share;
  mc.precision = (es_precision)sm->precision;
  mc.plans = sm->plans;
  es_state_pair states[ES_RT_MAX_IO];
  for (int k = 0; k < sm->n_states; k++)
    states[k] = (es_state_pair){sm->state_in[k], sm->state_out[k]};
  mc.states = sm->n_states ? states : NULL;
  mc.n_states = sm->n_states;
  mc.max_sequences = sm->max_sequences;
  mc.sequence_idle_ms = sm->sequence_idle_ms;
  mc.state_reserve = sm->state_reserve;
  mc.state_max_bytes = sm->state_max_bytes;
  mc.state_budget_bytes = sm->state_budget_bytes;
  return es_runtime_model_load(s->rt, &mc, id);
}

/* A pipeline's detector or reader over its members' runtime ids, loading
 * the members not loaded yet. No member can be unloaded from here on until
 * the pipeline is UNLOADED again (es__srv_model_unload refuses), so the ids
 * it captures stay the members' for as long as it lives. *first: the first
 * member's id, the pipeline's rt_id (for the admission numbers). */
static int pipeline_load(es_server *s, srv_model *sm, int *first, es_face_detector **fd,
                         es_ocr **ocr) {
  int ids[3] = {-1, -1, -1};
  for (int i = 0; i < 3; i++) {
    if (!sm->member[i][0])
      continue;
    srv_model *mm = es__srv_find(s, sm->member[i]);
    if (!mm)
      return es__fail(ES_ENOENT, "pipeline '%s': no model '%s'", sm->name, sm->member[i]);
    if (mm->pipeline)
      return es__fail(ES_EINVAL, "pipeline '%s': '%s' is itself a pipeline", sm->name,
                      sm->member[i]);
    int rc = es__srv_model_load(s, mm);
    if (rc < 0)
      return es__fail(rc, "pipeline '%s': %s", sm->name, es_last_error_detail());
    pthread_mutex_lock(&s->mu);
    ids[i] = mm->rt_id;
    pthread_mutex_unlock(&s->mu);
  }
  *first = ids[0];
  if (sm->pipeline == SRV_PIPE_FACE)
    return es_face_detector_create(s->rt, ids[0], fd);
  es_ocr_config oc;
  es_ocr_config_default(&oc);
  oc.det_model = ids[0];
  oc.cls_model = ids[1];
  oc.rec_model = ids[2];
  oc.keys_path = sm->keys;
  return es_ocr_create(s->rt, &oc, ocr);
}

int es__srv_model_load(es_server *s, srv_model *sm) {
  pthread_mutex_lock(&s->mu);
  wait_settled(s, sm);
  if (sm->state == SRV_READY) {
    pthread_mutex_unlock(&s->mu);
    return 0;
  }
  sm->state = SRV_LOADING; /* ours until settled below */
  pthread_mutex_unlock(&s->mu);

  int id = -1;
  es_face_detector *fd = NULL;
  es_ocr *ocr = NULL;
  int rc = sm->pipeline ? pipeline_load(s, sm, &id, &fd, &ocr) : plain_load(s, sm, &id);
  char reason[sizeof sm->reason] = "";
  if (rc < 0)
    snprintf(reason, sizeof reason, "%s", es_last_error_detail());

  pthread_mutex_lock(&s->mu);
  if (rc == 0) {
    sm->fd = fd;
    sm->ocr = ocr;
    sm->rt_id = id;
    sm->state = SRV_READY;
    sm->start_failed = 0;
  } else {
    sm->rt_id = -1;
    sm->state = SRV_UNLOADED;
  }
  snprintf(sm->reason, sizeof sm->reason, "%s", reason);
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return rc < 0 ? es__fail(rc, "%s", reason) : 0;
}

/* A pipeline that is not UNLOADED and runs on sm (mutex held), or NULL. */
static const srv_model *dependent(const es_server *s, const srv_model *sm) {
  for (int i = 0; i < s->n_models; i++) {
    const srv_model *p = &s->models[i];
    for (int k = 0; p->pipeline && p->state != SRV_UNLOADED && k < 3; k++)
      if (!strcmp(p->member[k], sm->name))
        return p;
  }
  return NULL;
}

int es__srv_model_unload(es_server *s, srv_model *sm, int timeout_ms) {
  uint64_t deadline = timeout_ms >= 0 ? es__now_ns() + (uint64_t)timeout_ms * 1000000ull : 0;
  pthread_mutex_lock(&s->mu);
  wait_settled(s, sm);
  if (sm->state != SRV_READY) { /* unloaded meanwhile, or never loaded */
    sm->start_failed = 0;         /* either way, out of service on purpose now */
    pthread_mutex_unlock(&s->mu);
    return 0;
  }
  const srv_model *p = sm->pipeline ? NULL : dependent(s, sm);
  if (p) {
    int rc = es__fail(ES_ESTATE, "model '%s' is in use by pipeline '%s' (%s): unload '%s' first",
                      sm->name, p->name, es__srv_state_name(p), p->name);
    pthread_mutex_unlock(&s->mu);
    return rc;
  }
  sm->state = SRV_UNLOADING; /* ours; from now on acquires fail */
  while (sm->refs && wait_until(s, deadline) != ETIMEDOUT)
    ;
  if (sm->refs) {
    int rc = es__fail(ES_ETIMEDOUT, "unload '%s': %u requests still running after %d ms; it "
                      "stays loaded", sm->name, sm->refs, timeout_ms);
    sm->state = SRV_READY;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return rc;
  }
  /* No request holds it and none can take it: this thread alone tears it
   * down, once. */
  int id = sm->rt_id;
  es_face_detector *fd = sm->fd;
  es_ocr *ocr = sm->ocr;
  pthread_mutex_unlock(&s->mu);

  int rc = 0;
  char detail[sizeof sm->reason] = "";
  if (sm->pipeline) {
    /* While it is UNLOADING its members cannot go: destroy before that. */
    es_face_detector_destroy(fd);
    es_ocr_destroy(ocr);
  } else {
    /* Its requests were all freed before their release, so nothing is
     * pending in the runtime; the timeout only bounds the unexpected. */
    uint64_t now = es__now_ns();
    int left = !deadline ? -1 : deadline > now ? (int)((deadline - now) / 1000000ull) : 0;
    rc = es_runtime_model_unload(s->rt, id, left);
    if (rc < 0) {
      snprintf(detail, sizeof detail, "unload '%s': %s", sm->name, es_last_error_detail());
      es_runtime_model_resume(s->rt, id);
    }
  }
  pthread_mutex_lock(&s->mu);
  if (rc == 0) {
    sm->fd = NULL;
    sm->ocr = NULL;
    sm->rt_id = -1;
    sm->state = SRV_UNLOADED;
    sm->start_failed = 0; /* taken out on purpose */
    snprintf(sm->reason, sizeof sm->reason, "unloaded");
  } else {
    sm->state = SRV_READY;
  }
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return rc < 0 ? es__fail(rc, "%s", detail) : 0;
}

int es__srv_model_acquire(es_server *s, srv_model *sm, int *rt_id) {
  pthread_mutex_lock(&s->mu);
  if (sm->state != SRV_READY) {
    int rc = sm->state == SRV_LOADING     ? es__fail(ES_ENOENT, "model '%s' is loading", sm->name)
             : sm->state == SRV_UNLOADING ? es__fail(ES_ENOENT, "model '%s' is not loaded (being "
                                                     "unloaded)", sm->name)
             : sm->reason[0] ? es__fail(ES_ENOENT, "model '%s' is not loaded (%s)", sm->name,
                                        sm->reason)
                             : es__fail(ES_ENOENT, "model '%s' is not loaded", sm->name);
    pthread_mutex_unlock(&s->mu);
    return rc;
  }
  sm->refs++;
  if (rt_id)
    *rt_id = sm->rt_id;
  pthread_mutex_unlock(&s->mu);
  return 0;
}

void es__srv_model_release(es_server *s, srv_model *sm) {
  pthread_mutex_lock(&s->mu);
  if (sm->refs && --sm->refs == 0)
    pthread_cond_broadcast(&s->cv); /* an unload may be waiting */
  pthread_mutex_unlock(&s->mu);
}

int es__srv_ready(es_server *s, char *names, size_t size) {
  size_t used = 0;
  if (names && size)
    names[0] = 0;
  pthread_mutex_lock(&s->mu);
  int ready = !atomic_load(&s->stopping);
  for (int i = 0; i < s->n_models; i++) {
    if (!s->models[i].start_failed)
      continue;
    ready = 0;
    if (names && used + 1 < size) {
      int n = snprintf(names + used, size - used, "%s%s", used ? "," : "", s->models[i].name);
      used = n < 0 ? used : used + (size_t)n < size ? used + (size_t)n : size - 1;
    }
  }
  pthread_mutex_unlock(&s->mu);
  return ready;
}

int es__srv_model_ready(es_server *s, srv_model *sm) {
  pthread_mutex_lock(&s->mu);
  int ready = sm->state == SRV_READY;
  pthread_mutex_unlock(&s->mu);
  return ready;
}

const char *es__srv_state_name(const srv_model *sm) {
  switch (sm->state) {
  case SRV_READY:
    return "READY";
  case SRV_LOADING:
    return "LOADING";
  case SRV_UNLOADING:
    return "UNLOADING";
  default:
    return "UNAVAILABLE";
  }
}

int es__srv_level_of(const es_server *s, const srv_model *sm, int has_priority,
                     uint64_t priority) {
  int last = s->cfg.runtime.priorities > 0 ? s->cfg.runtime.priorities - 1 : 0;
  int dflt = sm->priority < last ? sm->priority : last;
  if (!has_priority || priority == 0)
    return dflt;
  int cap = sm->max_priority >= 0 ? sm->max_priority : sm->priority;
  if (cap > last)
    cap = last;
  uint64_t l = priority - 1;
  if (l > (uint64_t)last)
    l = (uint64_t)last;
  return (int)l < cap ? cap : (int)l;
}

/* ---- counters ----------------------------------------------------------------------- */

/* Seconds, as Prometheus histograms expect. */
const double es__srv_bucket_bounds[SRV_BUCKETS] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                               0.1,    0.25,  0.5,    1,     2.5,  5,     10};

void es__srv_count(es_server *s, srv_model *sm, int outcome, int reason) {
  if (!sm || outcome < 0 || outcome >= SRV_OUT_COUNT)
    return;
  pthread_mutex_lock(&s->mu);
  sm->outcomes[outcome]++;
  if (outcome == SRV_OUT_REFUSED && reason > 0 && reason < ES_REFUSE_COUNT)
    sm->refused_by[reason]++;
  pthread_mutex_unlock(&s->mu);
}

static void hist_add(uint64_t *h, double v) {
  int b = 0;
  while (b < SRV_BUCKETS && v > es__srv_bucket_bounds[b])
    b++;
  h[b]++;
}

void es__srv_observe(es_server *s, srv_model *sm, uint64_t queue_ns, uint64_t run_ns) {
  double q = (double)queue_ns / 1e9, r = (double)run_ns / 1e9;
  pthread_mutex_lock(&s->mu);
  hist_add(sm->queue_hist, q);
  hist_add(sm->run_hist, r);
  sm->queue_sum_s += q;
  sm->run_sum_s += r;
  sm->observed++;
  pthread_mutex_unlock(&s->mu);
}

void es__srv_track(es_server *s, es_request *r, int on) {
  pthread_mutex_lock(&s->track_mu);
  if (on) {
    if (s->n_tracked < sizeof s->tracked / sizeof s->tracked[0])
      s->tracked[s->n_tracked++] = r;
  } else {
    for (size_t i = 0; i < s->n_tracked; i++)
      if (s->tracked[i] == r) {
        s->tracked[i] = s->tracked[--s->n_tracked];
        break;
      }
  }
  pthread_mutex_unlock(&s->track_mu);
}

size_t es__srv_tracked(es_server *s) {
  pthread_mutex_lock(&s->track_mu);
  size_t n = s->n_tracked;
  pthread_mutex_unlock(&s->track_mu);
  return n;
}

/* Cancel what is still queued; running requests finish (runs are not
 * interrupted). Returns how many were cancelled. The handles stay owned by
 * their jobs, which answer 503. Under track_mu, not the server's mutex: a
 * cancel completes the request at once, and its callback gives the model
 * back (es__srv_model_release takes the server's mutex). A job leaves the
 * list (under track_mu) before its handle is freed. */
size_t es__srv_cancel_tracked(es_server *s) {
  pthread_mutex_lock(&s->track_mu);
  size_t n = 0;
  for (size_t i = 0; i < s->n_tracked; i++)
    n += es_request_cancel(s->tracked[i]) == 0;
  pthread_mutex_unlock(&s->track_mu);
  return n;
}

/* ---- create / destroy ----------------------------------------------------------------- */

/* The budget "auto": what the process's cgroup allows at its soft
 * watermark (min of memory.high and memory.max) minus what the group
 * already holds (inactive page cache aside, which the kernel drops first),
 * or without a cgroup limit the machine's MemTotal at the soft watermark
 * minus what is in use (MemTotal - MemAvailable). Read once, at create:
 * the budget is what admission promises requests; the cgroup watermarks,
 * read all along, cover the rest. */
static int budget_auto(es_runtime_config *rc) {
  es_memstat st;
  if (es_memstat_read(&st) < 0)
    return es__fail(ES_EIO, "memory budget auto: cannot read the memory limits (%s); set a "
                    "budget (memory_budget, --memory BYTES; 0 for none)", es_last_error_detail());
  size_t limit = st.high < st.max ? st.high : st.max;
  size_t used = st.current > st.inactive_file ? st.current - st.inactive_file : 0;
  if (limit == SIZE_MAX) {
    limit = st.mem_total;
    used = st.mem_total > st.mem_available ? st.mem_total - st.mem_available : 0;
  }
  double soft = (double)limit * rc->soft_ratio;
  if (soft <= (double)used)
    return es__fail(ES_ENOMEM, "memory budget auto: nothing left below the soft watermark "
                    "(limit %zu B x %.2f, in use %zu B); set a budget (memory_budget, --memory "
                    "BYTES; 0 for none)", limit, rc->soft_ratio, used);
  rc->memory_budget_bytes = (size_t)(soft - (double)used);
  return 0;
}

/* What es_server_create set up before the runtime, freed. */
static void free_server(es_server *s) {
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->track_mu);
  pthread_mutex_destroy(&s->mu);
  explicit_bzero(s->cfg.control_token, sizeof s->cfg.control_token);
  es_mem_free(s);
}

int es_server_create(const es_server_config *cfg, es_server **out) {
  if (!cfg || !out)
    return es__fail(ES_EINVAL, "es_server_create: NULL argument");
  *out = NULL;
  es_server *s = es_mem_calloc(ES_MEM_SERVER, 1, sizeof *s);
  if (!s)
    return es__fail(ES_ENOMEM, "es_server_create: no memory");
  s->cfg = *cfg;
  int rc = 0;
  if (cfg->repository_control && !es__srv_token_valid(cfg->control_token))
    rc = es__fail(ES_EINVAL, "repository control needs a control token of 16 to %d visible ASCII "
                  "characters (e.g. from `head -c 24 /dev/urandom | base64`)",
                  ES_SERVER_TOKEN_MAX - 1);
  if (rc == 0 && cfg->cache_dir[0])
    rc = es_engine_cache_dir_set(cfg->cache_dir);
  if (rc == 0 && cfg->mlock)
    es_engine_mlock_set(1);
  if (rc == 0 && cfg->memory_budget_auto)
    rc = budget_auto(&s->cfg.runtime);
  if (rc < 0) {
    explicit_bzero(s->cfg.control_token, sizeof s->cfg.control_token);
    es_mem_free(s);
    return rc;
  }
  /* Bodies are not part of the admission budget; keep their bound below it
   * so the two together stay what the operator planned for. */
  if (s->cfg.runtime.memory_budget_bytes &&
      s->cfg.max_buffered_bytes > s->cfg.runtime.memory_budget_bytes)
    s->cfg.max_buffered_bytes = s->cfg.runtime.memory_budget_bytes;
  pthread_mutex_init(&s->mu, NULL);
  pthread_mutex_init(&s->track_mu, NULL);
  pthread_condattr_t ca; /* the unload's timeout does not follow the wall clock */
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&s->cv, &ca);
  pthread_condattr_destroy(&ca);
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  s->started_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
  if (cfg->repository[0])
    rc = scan_repository(s, cfg->repository);
  if (rc == 0 && cfg->models_json)
    rc = add_models(s, cfg->models_json, cfg->models_base[0] ? cfg->models_base : ".", "config");
  if (rc == 0 && s->n_models == 0 && cfg->use_default_models)
    rc = add_models(s, default_models, cfg->model_dir, "default config");
  s->cfg.models_json = NULL; /* the caller's config owns it; read only here */
  if (rc == 0)
    rc = es_runtime_create(&s->cfg.runtime, &s->rt);
  if (rc < 0) {
    free_server(s);
    return rc;
  }
  /* A model that fails to load is served as not ready, except when its
   * weights cannot be locked in RAM with mlock asked for: the operator
   * asked for a guarantee the box cannot give, so the server does not start. */
  for (int i = 0; i < s->n_models && rc == 0; i++) {
    int lrc = s->models[i].load_at_start ? es__srv_model_load(s, &s->models[i]) : 0;
    if (lrc == ES_EMEMLOCK && cfg->mlock)
      rc = es__fail(ES_EMEMLOCK, "mlock: model '%s' cannot be locked in RAM: %s",
                    s->models[i].name, s->models[i].reason);
    else if (lrc < 0) {
      s->models[i].start_failed = 1; /* no HTTP thread yet: no lock needed */
      if (!cfg->quiet)
        fprintf(stderr, "edgeserve: model '%s' not loaded: %s\n", s->models[i].name,
                s->models[i].reason);
    }
  }
  if (rc == 0)
    rc = es__srv_start_http(s);
  if (rc < 0) {
    char detail[512];
    snprintf(detail, sizeof detail, "%s", es_last_error_detail());
    for (int i = 0; i < s->n_models; i++) {
      es_face_detector_destroy(s->models[i].fd);
      es_ocr_destroy(s->models[i].ocr);
    }
    es_runtime_destroy(s->rt);
    free_server(s);
    return es__fail(rc, "%s", detail);
  }
  *out = s;
  return 0;
}

void es_server_destroy(es_server *s) {
  if (!s)
    return;
  es_server_shutdown(s, 0, NULL);
  for (int i = 0; i < s->n_models; i++) {
    es_face_detector_destroy(s->models[i].fd);
    es_ocr_destroy(s->models[i].ocr);
  }
  /* Connection threads are joined; every handle was freed by its thread. */
  int rc;
  for (int tries = 0; (rc = es_runtime_destroy(s->rt)) == ES_EBUSY && tries < 1000; tries++)
    usleep(5000);
  free_server(s);
}
