/* Shared between the server's files (routes, repository, metrics). */
#ifndef ES_SERVER_INTERNAL_H
#define ES_SERVER_INTERNAL_H

#include "edgeserve/apps.h"
#include "edgeserve/server.h"

#include <pthread.h>
#include <stdatomic.h>

#define SRV_MAX_MODELS 64
#define SRV_BUCKETS 14

enum { SRV_PIPE_NONE = 0, SRV_PIPE_FACE, SRV_PIPE_OCR };
/* SRV_OUT_NONE: answered but not counted against the model (it is not
 * loaded, so it did not take the request). */
enum {
  SRV_OUT_NONE = -1,
  SRV_OUT_SUCCESS = 0,
  SRV_OUT_REFUSED,
  SRV_OUT_BAD_REQUEST,
  SRV_OUT_ERROR,
  SRV_OUT_COUNT
};
/* Requests answered before routing (no model known yet). */
enum { SRV_REJECT_TOO_LARGE = 0, SRV_REJECT_BUFFERED, SRV_REJECT_BAD, SRV_REJECT_COUNT };

/* A model the server knows: from the repository, the config or the default
 * set. Its configuration (name to keys) is fixed at create; everything else
 * is under the server's mutex: the lifecycle (state, rt_id, refs, fd, ocr,
 * reason; see the block at the end of this header) and the counters. */
typedef struct srv_model {
  char name[ES_RT_NAME_MAX];
  char path[1024];
  char platform[16];
  char reason[256];           /* why it is not loaded */
  int rt_id;                  /* the runtime's id while READY or UNLOADING
                                 (a pipeline: its first member's); else -1 */
  int priority;               /* default level */
  int lane;
  unsigned max_concurrency;
  unsigned instances;
  unsigned plans;
  int share;
  int precision; /* es_precision: "precision" */
  int load_at_start;
  int n_shapes;
  es_tensor_info shapes[ES_RT_MAX_IO];
  char shape_names[ES_RT_MAX_IO][64];
  /* "sequence": state pairs and the runtime's sequence settings */
  int n_states;
  char state_in[ES_RT_MAX_IO][64], state_out[ES_RT_MAX_IO][64];
  unsigned max_sequences;
  int sequence_idle_ms;
  int state_reserve;          /* ES_STATE_RESERVE_* */
  size_t state_max_bytes;
  size_t state_budget_bytes;
  int pipeline;               /* SRV_PIPE_*: answers from an image */
  char member[3][ES_RT_NAME_MAX]; /* face: model; ocr: det, cls, rec ("" none) */
  char keys[1024];            /* ocr: the recogniser's character list */
  struct es_face_detector *fd;
  struct es_ocr *ocr;
  /* ---- lifecycle and priority cap (repo.c) ---- */
  int state;                  /* SRV_UNLOADED, SRV_LOADING, SRV_READY, SRV_UNLOADING */
  int start_failed;           /* its load at start failed, and it has been neither
                                 loaded nor unloaded since: the server is not ready */
  unsigned refs;              /* requests holding it (es__srv_model_acquire) */
  int max_priority;           /* the highest level (smallest number) a client
                                 may ask for; -1 in a config being parsed:
                                 the default level */
  /* ---- end of lifecycle ---- */
  uint64_t outcomes[SRV_OUT_COUNT];
  uint64_t refused_by[ES_REFUSE_COUNT];
  uint64_t queue_hist[SRV_BUCKETS + 1], run_hist[SRV_BUCKETS + 1];
  double queue_sum_s, run_sum_s;
  uint64_t observed;
} srv_model;

typedef struct srv_tracked_req {
  es_request *r;
  struct srv_tracked_req *next;
} srv_tracked_req;

#define SRV_MAX_CONTROL 4    /* load/unload threads at once */
#define SRV_CONTROL_QUEUE 64 /* loads and unloads waiting; 429 above */
/* The HTTP library's buffer per connection: headers plus the read buffer
 * (read_buffer_bytes; 0 in the config: the default). */
#define SRV_READ_BUFFER_DEFAULT ((size_t)32 << 10)
#define SRV_CONN_BUFFER(cfg)                                                                  \
  ((cfg).max_header_bytes +                                                                   \
   ((cfg).read_buffer_bytes ? (cfg).read_buffer_bytes : SRV_READ_BUFFER_DEFAULT))

/* Connection phases with a time limit (http.c), for the timeout counters. */
enum { SRV_PHASE_IDLE = 0, SRV_PHASE_HEADERS, SRV_PHASE_BODY, SRV_PHASE_COUNT };

struct srv_conn;
typedef struct srv_job srv_job;
/* A FIFO of jobs waiting for a thread (handler.c), under its owner's lock. */
typedef struct srv_jobq {
  srv_job *head, *tail;
  unsigned n;
} srv_jobq;

struct es_server {
  es_server_config cfg;
  es_runtime *rt;
  struct MHD_Daemon *daemon;
  int port;
  int http_started;
  /* Connections (http.c): the sweeper's list, under conn_mu. */
  pthread_mutex_t conn_mu;
  pthread_cond_t sweeper_cv;
  pthread_t sweeper_thread;
  int sweeper_stop;
  struct srv_conn *conns;
  size_t n_conns;
  _Atomic uint64_t conns_total;
  _Atomic uint64_t timeouts[SRV_PHASE_COUNT];
  /* Pipeline jobs (handler.c: runtime tasks), under pipe_mu. */
  pthread_mutex_t pipe_mu;
  pthread_cond_t pipe_cv;    /* control_active reached 0 */
  int pipe_stop;             /* refusing new pipeline jobs */
  unsigned pipe_queued;      /* submitted, their task not begun */
  unsigned pipe_running;
  int control_active;        /* load/unload threads running (pipe_mu) */
  srv_jobq control_q;
  pthread_mutex_t mu;
  pthread_cond_t cv;         /* (repo.c) a model's state changed, or its refs
                                dropped to 0; with mu, on CLOCK_MONOTONIC */
  srv_model models[SRV_MAX_MODELS];
  int n_models;
  pthread_mutex_t track_mu;  /* tracked[]: never held while taking mu */
  es_request *tracked[1024]; /* requests in the runtime now (for shutdown) */
  size_t n_tracked;
  _Atomic size_t buffered;
  _Atomic uint64_t served;
  _Atomic uint64_t rejected[SRV_REJECT_COUNT];
  _Atomic size_t active;     /* HTTP requests between first callback and completion */
  _Atomic int stopping;
  es_server_report report;
  uint64_t started_ns;
};

extern const double es__srv_bucket_bounds[SRV_BUCKETS];

srv_model *es__srv_find(es_server *s, const char *name);
void es__srv_count(es_server *s, srv_model *sm, int outcome, int reason);
void es__srv_observe(es_server *s, srv_model *sm, uint64_t queue_ns, uint64_t run_ns);
/* Requests in the runtime, so shutdown can tell and cancel what is left. */
void es__srv_track(es_server *s, es_request *r, int on);
size_t es__srv_tracked(es_server *s);
size_t es__srv_cancel_tracked(es_server *s);
int es__srv_start_http(es_server *s);

/* ---- the request layer (handler.c) ----
 * One complete HTTP request, as the routes see it: no socket, no library.
 * Header values may be NULL (absent); body points into a buffer the caller
 * keeps until the request is answered. */
typedef struct srv_req {
  const char *method, *url;
  const char *content_type, *origin, *host, *authorization;
  const char *header_len;    /* Inference-Header-Content-Length */
  const char *body;
  size_t len;
} srv_req;

/* An answer. body (es_mem) is owned by the answer: es__srv_resp_free, or
 * hand it to whatever sends it. */
typedef struct srv_resp {
  unsigned status;
  char *body;
  size_t len;
  const char *ctype;         /* static */
  size_t header_len;         /* Inference-Header-Content-Length; 0 none */
  uint32_t retry_after_ms;   /* Retry-After (sent in whole seconds); 0 none */
  const char *allow;         /* Allow, for 405; static */
  int want_auth;             /* 401: WWW-Authenticate: Bearer */
} srv_resp;

typedef void (*srv_wake_fn)(void *user);

/* Route and answer rq. 0: the answer is in *out. 1: the answer is being
 * computed (an inference or a pipeline's task in the runtime): *job is
 * set, and wake(user) is called exactly once, from another thread, possibly
 * before this returns; after it, es__srv_job_answer(s, *job, out) makes the
 * answer and frees the job. rq's body must stay valid until then. Thread-safe. */
int es__srv_handle(es_server *s, const srv_req *rq, srv_wake_fn wake, void *user, srv_job **job,
                   srv_resp *out);
void es__srv_job_answer(es_server *s, srv_job *job, srv_resp *out);
/* Free a job whose wake came but whose answer is not wanted. */
void es__srv_job_free(srv_job *job);
void es__srv_resp_free(srv_resp *r);
/* The pipeline jobs' state (start), and no new ones from then on (stop). */
int es__srv_pipelines_start(es_server *s);
/* Wait for the load and unload threads still running (before destroy). */
void es__srv_control_wait(es_server *s);
void es__srv_pipelines_stop(es_server *s);

/* What an answer carries for a library return code (status.c states the
 * rule for each code). */
typedef struct srv_status {
  unsigned http;           /* HTTP status */
  uint32_t retry_after_ms; /* Retry-After (sent in whole seconds, rounded
                              up); 0 for statuses other than 429 and 503 */
  int outcome;             /* SRV_OUT_* for the model's counters */
  int reason;              /* es_refusal_reason, for SRV_OUT_REFUSED */
} srv_status;

/* rc: 0 or an ES_E* code; why: the refusal that came with it (the
 * admission's retry estimate), or NULL. Pure, thread-safe. */
srv_status es__srv_status_of(int rc, const es_refusal *why);
/* Retry-After for an answer with this status decided without a return code
 * of the library (rc 0) or with one: the estimate when there is one, else
 * the rule's default; 0 for statuses other than 429 and 503. */
uint32_t es__srv_retry_after_ms(unsigned http, int rc, uint32_t estimate_ms);

/* ---- model lifecycle, priority and the control plane (repo.c, guard.c) ----
 *
 * A model goes UNLOADED -> LOADING -> READY -> UNLOADING -> UNLOADED, each
 * step under the server's mutex; LOADING and UNLOADING belong to the one
 * thread that started them, and every other load or unload of the model
 * waits until it is done, then acts on the state it finds (a load of a
 * READY model and an unload of an UNLOADED one are no-ops returning 0). So
 * a load that arrives during an unload waits for it and then loads, two
 * unloads destroy once, and the index (READY only in state READY) never
 * shows a model that cannot answer.
 *
 * Requests hold a model between es__srv_model_acquire and
 * es__srv_model_release: an unload first marks it UNLOADING (new acquires
 * fail with ES_ENOENT), waits until no request holds it, and only then
 * unloads the runtime model or destroys the pipeline's detector or reader.
 * A model that a pipeline in any state but UNLOADED runs on cannot be
 * unloaded (ES_ESTATE, 409): the pipeline's detector or reader submits to
 * its runtime id, so the pipeline has to go first. */
enum { SRV_UNLOADED = 0, SRV_LOADING, SRV_READY, SRV_UNLOADING };

/* Load sm (a pipeline: its members first, loading those not loaded).
 * 0 when sm is READY on return; else the load's error (the reason is kept
 * in sm->reason for the index). Waits while another thread loads or
 * unloads sm. Thread-safe; not with the mutex held. */
int es__srv_model_load(es_server *s, srv_model *sm);
/* Unload sm: 0 when it is UNLOADED on return; ES_ESTATE when a loaded
 * pipeline runs on it; ES_ETIMEDOUT when requests still held it after
 * timeout_ms (< 0: no limit), and it stays READY. Waits while another thread
 * loads or unloads sm. Thread-safe; not with the mutex held. */
int es__srv_model_unload(es_server *s, srv_model *sm, int timeout_ms);
/* Take a reference on a READY model for one request, and its runtime id
 * (read once, under the mutex, valid until the release). ES_ENOENT (404)
 * when it is not READY (the detail says whether loading, unloading or not
 * loaded, and why). A pipeline's fd and ocr may be used until the release.
 * Every 0 return needs one es__srv_model_release. Thread-safe. */
int es__srv_model_acquire(es_server *s, srv_model *sm, int *rt_id);
void es__srv_model_release(es_server *s, srv_model *sm);
/* Whether sm is READY now (for GET .../ready; a request must acquire). */
int es__srv_model_ready(es_server *s, srv_model *sm);
/* Whether the server is ready (GET /v2/health/ready): not draining, and
 * every model it was to load at start is loaded, unless an operator has
 * unloaded it since (the protocol's "all models ready", for the models the
 * server was configured to serve). With names non-NULL, the models holding
 * readiness back, comma-separated, truncated to size. Takes the mutex. */
int es__srv_ready(es_server *s, char *names, size_t size);
/* "READY", "LOADING", "UNLOADING" or "UNAVAILABLE" for the repository
 * index. Call with the mutex held. */
const char *es__srv_state_name(const srv_model *sm);

/* The level a request runs at. Triton's priority parameter: 1 is the
 * highest level (0 here), 0 or absent the model's default; levels past the
 * runtime's last clamp to it, and a level higher than the model's
 * max_priority clamps to that cap. Pure, thread-safe. */
int es__srv_level_of(const es_server *s, const srv_model *sm, int has_priority,
                     uint64_t priority);

/* The gate of the state-changing routes (POST .../load and .../unload),
 * given the request's headers (NULL when absent) and body length: 0 when
 * allowed, else the HTTP status with the reason in why:
 *   403 repository control is off (cfg->repository_control 0);
 *   401 no "Authorization: Bearer <token>", or another token (compared in
 *       constant time); the answer should carry WWW-Authenticate: Bearer;
 *   403 an Origin whose host:port is not the Host's (a web page of another
 *       site; "null" included);
 *   415 a body whose Content-Type is not application/json.
 * Pure, thread-safe. */
int es__srv_guard_control(const es_server_config *cfg, const char *authorization,
                          const char *origin, const char *host, const char *content_type,
                          size_t body_len, char *why, size_t whylen);
/* The Origin part alone (for other POST routes that want it): 0 when origin
 * is NULL or names the Host's host:port, else 403 with the reason. */
int es__srv_guard_origin(const char *origin, const char *host, char *why, size_t whylen);
/* Whether token is acceptable as a control token: 16 to
 * ES_SERVER_TOKEN_MAX - 1 visible ASCII characters. */
int es__srv_token_valid(const char *token);

/* ---- end of model lifecycle, priority and the control plane ---- */

#endif
