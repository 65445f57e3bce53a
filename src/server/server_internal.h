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
 * set; loaded (rt_id >= 0) or not. Counters under the server's mutex. */
typedef struct srv_model {
  char name[ES_RT_NAME_MAX];
  char path[1024];
  char platform[16];
  char reason[256];           /* why it is not loaded */
  int rt_id;                  /* -1 not loaded */
  int priority;               /* default level */
  int lane;
  unsigned max_concurrency;
  unsigned instances;
  unsigned plans;
  int share;
  int load_at_start;
  int n_shapes;
  es_tensor_info shapes[ES_RT_MAX_IO];
  char shape_names[ES_RT_MAX_IO][64];
  int pipeline;               /* SRV_PIPE_*: answers from an image */
  char member[3][ES_RT_NAME_MAX]; /* face: model; ocr: det, cls, rec ("" none) */
  char keys[1024];            /* ocr: the recogniser's character list */
  struct es_face_detector *fd;
  struct es_ocr *ocr;
  _Atomic int busy;           /* pipeline requests running */
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

#define SRV_MAX_PIPE_THREADS 64
/* The HTTP library's read buffer per connection, beyond the headers. */
#define SRV_READ_BUFFER ((size_t)32 << 10)

/* Connection phases with a time limit (http.c), for the timeout counters. */
enum { SRV_PHASE_IDLE = 0, SRV_PHASE_HEADERS, SRV_PHASE_BODY, SRV_PHASE_COUNT };

struct srv_conn;
typedef struct srv_job srv_job;

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
  /* Pipeline jobs (handler.c), under pipe_mu. */
  pthread_mutex_t pipe_mu;
  pthread_cond_t pipe_cv;
  pthread_t pipe_threads[SRV_MAX_PIPE_THREADS];
  int n_pipe_threads;
  int pipe_stop;
  srv_job *pipe_head, *pipe_tail;
  unsigned pipe_queued, pipe_running;
  pthread_mutex_t mu;
  srv_model models[SRV_MAX_MODELS];
  int n_models;
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
int es__srv_model_load(es_server *s, srv_model *sm);
int es__srv_model_unload(es_server *s, srv_model *sm, int timeout_ms);
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
} srv_resp;

typedef void (*srv_wake_fn)(void *user);

/* Route and answer rq. 0: the answer is in *out. 1: the answer is being
 * computed (an inference in the runtime, a pipeline on its threads): *job is
 * set, and wake(user) is called exactly once, from another thread, possibly
 * before this returns; after it, es__srv_job_answer(s, *job, out) makes the
 * answer and frees the job. rq's body must stay valid until then. Thread-safe. */
int es__srv_handle(es_server *s, const srv_req *rq, srv_wake_fn wake, void *user, srv_job **job,
                   srv_resp *out);
void es__srv_job_answer(es_server *s, srv_job *job, srv_resp *out);
/* Free a job whose wake came but whose answer is not wanted. */
void es__srv_job_free(srv_job *job);
void es__srv_resp_free(srv_resp *r);
int es__srv_pipelines_start(es_server *s);
void es__srv_pipelines_stop(es_server *s);

/* ---- the control plane and model references (repo.c, guard.c) ---- */
/* 0 when a state-changing repository request may go ahead, else the HTTP
 * status (401, 403, 415) with the reason in why. Pure, thread-safe. */
int es__srv_guard_control(const es_server_config *cfg, const char *authorization,
                          const char *origin, const char *host, const char *content_type,
                          char *why, size_t whylen);
/* The runtime level for a request: Triton's priority (1 highest, 0 or
 * absent: the model's default), clamped to the runtime's levels and to the
 * model's cap. */
int es__srv_level_of(const es_server *s, const srv_model *sm, int has_priority,
                     uint64_t priority);
/* A reference on a loaded model: its runtime id read once under the lock.
 * ES_ENOENT when it is not loaded (or being unloaded). Unload waits for the
 * references to drop. */
int es__srv_model_acquire(es_server *s, srv_model *sm, int *rt_id);
void es__srv_model_release(es_server *s, srv_model *sm);

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

#endif
