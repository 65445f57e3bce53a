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

struct es_server {
  es_server_config cfg;
  es_runtime *rt;
  struct MHD_Daemon *daemon;
  int port;
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
