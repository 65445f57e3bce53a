/* edgeserve/server.h - the Open Inference Protocol (KServe v2 REST) server.
 *
 *   es_server_config sc;
 *   es_server_config_default(&sc);             // 127.0.0.1:8000
 *   es_server *s;
 *   es_server_create(&sc, &s);                 // runtime, models, HTTP
 *   es_server_config_fini(&sc);                // the server kept a copy
 *   ... wait for a signal, or your own loop ...
 *   es_server_report r;
 *   es_server_shutdown(s, 10000, &r);          // stop accepting, drain
 *   es_server_destroy(s);
 *
 * The library touches no process-wide state: it installs no signal
 * handlers, reads no environment variable and leaves malloc's settings
 * alone; the program embedding it decides those (the edgeserve CLI takes
 * SIGTERM/SIGINT, reads $ES_MODEL_DIR and caps glibc's heaps).
 *
 * The server owns a runtime (include/edgeserve/runtime.h) and maps HTTP onto
 * it: routes and codec here, scheduling and memory there. One rule maps
 * each return code to a status, wherever it comes from: 429 for queue full
 * and concurrency limits, 503 for memory, deadlines and draining, both with
 * Retry-After (the admission's measured estimate when it made one, else
 * 1 s; 60 s for a request larger than the whole budget); 400 for a request
 * the model cannot take (the message names the input), 404 for an unknown
 * or unloaded model, 413 for a body over the limit.
 *
 * Model repository: a folder per model holding its .onnx (or .esm) file and
 * an optional config.json:
 *   {"file": "model.onnx", "priority": 0, "lane": -1, "max_concurrency": 0,
 *    "instances": 0, "share": true, "shape": {"x": [1, 3, 640, 640]},
 *    "plans": 32, "load": true, "max_priority": 0}
 * priority: the level of requests that do not say (0 highest); max_priority:
 * the highest level a request may ask for (default: priority, so a client
 * can ask for its model's level or a lower one, never jump ahead of other
 * models' defaults unless the operator allows it; must be <= priority); lane: -1 any
 * worker, k: lane k's shared scratchpad; instances: arenas in its pool (how
 * many of its requests run at once; 0 one per worker); shape: the shape it
 * is configured for (arena pool or lane scratchpad sized by it); other shapes
 * still run, with exact-size arenas from the buddy pool; plans: how many
 * input shapes keep a plan (least recently used evicted).
 * Pipeline models answer from an image (one BYTES input "image" holding a
 * JPEG or PNG, one BYTES output "result" holding JSON) by running other
 * models of the server:
 *   {"pipeline": "face", "model": "blazeface_back"}
 *   {"pipeline": "ocr", "det": "ppocr_det", "cls": "ppocr_cls",
 *    "rec": "ppocr_rec", "keys": "ppocr_keys_v1.txt"}
 * Server config (--config FILE, JSON): every es_server_config field by name
 * ("port", "workers", "memory_budget" as bytes or "512M", ...) plus
 * "models": {"name": {config.json fields + "path"}} for models outside a
 * repository. Without either, an embedded default serves the target models
 * from the fetched-models folder.
 *
 * The control plane is closed by default: POST /v2/repository/models/NAME/
 * load and /unload answer 403 unless repository_control is 1, and then want
 * "Authorization: Bearer <control_token>" (401 without it), an Origin (if
 * any) naming the server's own Host (403: a web page of another site) and a
 * JSON body or none (415). es_server_create refuses repository_control
 * without a control token of at least 16 characters (ES_EINVAL): the
 * library generates no secrets and prints nothing. Inference, health,
 * metadata, the index and /metrics stay open to whoever reaches the
 * address (127.0.0.1 by default); put an authenticating TLS proxy in front
 * to expose them further (README, "Threat model").
 *
 * Memory: the admission budget is "auto" by default (memory_budget_auto 1):
 * es_server_create sets runtime.memory_budget_bytes to what the process's
 * cgroup allows below its soft watermark (min of memory.high and
 * memory.max) minus what the group already uses, or without a cgroup limit
 * the machine's MemTotal at the soft watermark minus what is in use
 * (MemTotal - MemAvailable). An unbounded budget (0) is only had by asking
 * for it: memory_budget_auto 0 with runtime.memory_budget_bytes 0 (the
 * config file's "memory_budget": 0, the CLI's --memory 0).
 */
#ifndef EDGESERVE_SERVER_H
#define EDGESERVE_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "edgeserve/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct es_server es_server;

/* Room for a control token and its terminating NUL. */
#define ES_SERVER_TOKEN_MAX 128

typedef struct es_server_config {
  char host[64];              /* default "127.0.0.1" */
  int port;                   /* default 8000; 0 picks a free port */
  char repository[1024];      /* model repository folder; "" none */
  char model_dir[1024];       /* where the embedded default finds the
                                 models (default ".cache/models"; the
                                 library reads no environment: the CLI
                                 fills it from $ES_MODEL_DIR) */
  char cache_dir[1024];       /* prepared-weights cache directory, "" none
                                 (the default): es_server_create sets it
                                 process-wide (es_engine_cache_dir_set), so
                                 a restarted server maps the weights its
                                 last run reordered. Config: "cache_dir" */
  int mlock;                  /* 1: lock every model's weights and prepared
                                 weights in RAM (es_engine_mlock_set, set
                                 process-wide by es_server_create before the
                                 models load); a model that cannot be locked
                                 fails to load, so the server does not start,
                                 with ES_EMEMLOCK naming RLIMIT_MEMLOCK.
                                 Config: "mlock": true. Default 0 */
  int use_default_models;     /* 1: serve the embedded default set when no
                                 repository and no config models (default 1) */
  es_runtime_config runtime;  /* workers, priorities, queues, budget, ... */
  int memory_budget_auto;     /* 1 (default): es_server_create replaces
                                 runtime.memory_budget_bytes with what the
                                 cgroup or machine allows (see above); 0:
                                 runtime.memory_budget_bytes as given (0:
                                 unbounded). Config file: "memory_budget":
                                 "auto" sets 1, bytes set 0 */
  int repository_control;     /* 1: the repository's load and unload
                                 routes work (with the token); 0 (default):
                                 403. Config file: "repository_control" */
  char control_token[ES_SERVER_TOKEN_MAX]; /* the bearer token those routes
                                 want: 16 to 127 visible ASCII characters;
                                 required when repository_control is 1
                                 (config file: "control_token"; keep that
                                 file private) */
  size_t max_body_bytes;      /* per request (default 64 MiB): 413 above */
  size_t max_buffered_bytes;  /* all request bodies being received or
                                 served, and answers being sent, at once (default 256 MiB, at most the
                                 runtime's memory budget when one is set):
                                 503 above */
  size_t max_header_bytes;    /* per connection, headers (default 16 KiB) */
  size_t read_buffer_bytes;   /* per connection, the HTTP library's read
                                 buffer beyond the headers: bodies arrive
                                 in reads of about this size (default 32
                                 KiB; 4 KiB to 16 MiB). Larger means fewer
                                 system calls per megabyte of body (det's
                                 4.9 MB body: ~200 reads at 32 KiB, ~35 at
                                 256 KiB) and more memory per busy
                                 connection */
  unsigned max_connections;   /* open at once, all clients (default 4096;
                                 each holds max_header_bytes +
                                 read_buffer_bytes of the HTTP library's
                                 buffer at most) */
  unsigned max_connections_per_client; /* from one IP address (default 256;
                                 0: no cap); above it a connection is
                                 closed at once */
  unsigned idle_timeout_s;    /* a connection with no request under way,
                                 and a response the client does not read
                                 (default 30; config key also
                                 "connection_timeout_s") */
  unsigned header_timeout_s;  /* request line to the end of the headers
                                 (default 10) */
  unsigned body_timeout_s;    /* end of the headers to the end of the
                                 body (default 60) */
  unsigned http_threads;      /* threads serving the connections, each an
                                 event loop (default 2) */
  unsigned pipeline_threads;  /* no longer used: a pipeline request (face,
                                 OCR) is a task on the runtime's workers;
                                 accepted for older configs */
  unsigned pipeline_queue;    /* pipeline requests waiting for a worker
                                 (default 64): 429 above */
  size_t max_elements;        /* per input tensor (default 64 M) */
  int quiet;                  /* no access log on stderr */
  char *models_json;          /* a config file's "models" object as JSON
                                 text, owned by this config (set by
                                 es_server_config_load, freed by
                                 es_server_config_fini); NULL: none */
  char models_base[1024];     /* folder the relative paths in models_json
                                 are taken from (the config file's) */
} es_server_config;

typedef struct es_server_report {
  uint64_t served;            /* responses sent */
  uint64_t inflight_at_stop;  /* requests in the runtime when shutdown began */
  uint64_t finished_in_grace; /* of those, finished within the grace period */
  uint64_t cut_off;           /* still queued or running at the deadline */
  double drain_ms;
} es_server_report;

/* A config is caller-owned memory (_init/_fini style): default it, load
 * files into it, pass it to es_server_create (which copies what it needs and
 * keeps no pointer into it), then es_server_config_fini it. A struct copy
 * shares models_json: fini only one of them. */
ES_API void es_server_config_default(es_server_config *cfg);
/* Parse a JSON server config file into cfg (fields not given keep their
 * values); its "models" are kept in cfg->models_json (replacing earlier
 * ones) and added at create. ES_EINVAL with a detail naming the file and
 * field, ES_ENOMEM. */
ES_API int es_server_config_load(es_server_config *cfg, const char *path);
/* Free what es_server_config_load allocated in cfg. NULL: no-op; calling it
 * twice is harmless. */
ES_API void es_server_config_fini(es_server_config *cfg);

/* Thread safety: es_server_config_* work on caller-owned memory (one
 * thread per config). es_server_create may be called from any thread, and
 * several servers may live in one process: they share nothing but the
 * memory counters (memory.h). es_server_port, es_server_runtime and
 * es_server_metrics_text may be called from any thread while the server
 * exists; es_server_shutdown from any one thread, also concurrently with
 * those; es_server_destroy last, with no other call on the server running or
 * to come. */

/* Create the runtime, load the models (repository, config, or the default
 * set), start listening. ES_EIO when the address cannot be bound (the
 * detail says why), model errors as es_runtime_model_load. cfg is copied:
 * it may be finished (es_server_config_fini) right after. */
ES_API int es_server_create(const es_server_config *cfg, es_server **out);
/* The port actually bound (useful with port 0). ES_EINVAL for NULL. */
ES_API int es_server_port(const es_server *s, int *port);
/* The server's runtime (owned by the server, valid until
 * es_server_destroy); NULL for a NULL server. */
ES_API es_runtime *es_server_runtime(es_server *s);
/* Stop accepting connections, refuse new requests (503 draining), give
 * queued and running ones up to grace_ms to finish, then cancel what is
 * still queued. report may be NULL. A second call only copies the first
 * call's report. ES_EINVAL for NULL. */
ES_API int es_server_shutdown(es_server *s, int grace_ms, es_server_report *report);
/* Shut down (if not yet) with no grace and free everything. NULL: no-op. */
ES_API void es_server_destroy(es_server *s);

/* Prometheus text exposition of the server and runtime state, as served on
 * GET /metrics, in *text (es_mem_free it) of *len bytes (len may be NULL).
 * ES_EINVAL, ES_ENOMEM. */
ES_API int es_server_metrics_text(es_server *s, char **text, size_t *len);

#ifdef __cplusplus
}
#endif
#endif
