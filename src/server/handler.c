/* The request layer: one HTTP request in, one answer out, no socket.
 *
 * The HTTP core (http.c) hands a complete request (method, URL, the headers
 * the routes read, the body) to es__srv_handle and sends what comes back.
 * Nothing here knows libmicrohttpd, so the fuzzer (tests/fuzz) and the
 * failure-injection tests drive the same routes the server serves.
 *
 * Answers that need the runtime are asynchronous: an inference is parsed,
 * bound and submitted here, and the call returns at once with a job; the
 * runtime's completion callback wakes the caller, which then asks for the
 * answer (es__srv_job_answer) on its own thread. A connection waiting for
 * its answer thus costs its buffers and a job, never a thread. Pipeline
 * models (face, OCR) run several models in sequence, so a pipeline job is
 * one runtime task at the request's priority (bounded: 429 when
 * pipeline_queue are waiting) whose stages (the image's decode, its pixels
 * reserved through admission like any tensor, then each model) run on the
 * worker that took the task, one after the other.
 *
 * A job holds a reference on its model (es__srv_model_acquire): the model's
 * runtime id is read once under the server's lock, and an unload waits for
 * the references to drop, so a slot reused by another load can never run a
 * request meant for the model that was there before.
 *
 * Statuses come from one rule for each return code (status.c): 429 for
 * queue full and concurrency, 503 for memory, deadline, draining; both with
 * Retry-After in whole seconds, rounded up, from the admission's estimate. */
#include "common/internal.h"
#include "server/codec.h"
#include "server/server_internal.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { JOB_INFER = 1, JOB_PIPELINE, JOB_CONTROL };

struct srv_job {
  int kind;
  es_server *s;
  srv_model *sm;
  int rt_id;                 /* read once when the reference was taken */
  int held;                  /* holds a reference on sm */
  int level;
  uint64_t deadline_ns;
  es_v2_request q;           /* parsed request; tensors point into the body */
  es_request *r;             /* JOB_INFER: the runtime's request */
  srv_wake_fn wake;
  void *user;
  /* JOB_PIPELINE: the encoded image (inside the body) and the answer. */
  const void *image;
  size_t image_len;
  int rc;
  es_refusal why;
  char detail[512];
  char *json;
  size_t json_len;
  uint64_t run_ns;
  int load;                  /* JOB_CONTROL: 1 load, 0 unload */
  int rt_first;              /* JOB_PIPELINE: its first member's runtime id */
  int started;               /* JOB_PIPELINE: its task began (pipe_mu) */
  struct srv_job *next;      /* pipeline queue */
};

/* ---- answers ------------------------------------------------------------------ */

void es__srv_resp_free(srv_resp *r) {
  if (!r)
    return;
  es_mem_free(r->body);
  r->body = NULL;
}

static void resp_set(srv_resp *out, unsigned status, char *body, size_t len, const char *ctype) {
  memset(out, 0, sizeof *out);
  out->status = status;
  out->body = body;
  out->len = len;
  out->ctype = ctype;
}

/* An answer whose body could not be allocated: 503 with Retry-After, and
 * the HTTP core sends a static error body (srv_resp.body NULL). */
static void resp_oom(srv_resp *out) {
  resp_set(out, 503, NULL, 0, "application/json");
  out->retry_after_ms = es__srv_retry_after_ms(503, ES_ENOMEM, 0);
}

static void resp_text(srv_resp *out, unsigned status, const char *ctype, const char *text,
                      size_t len) {
  char *b = es_mem_alloc(ES_MEM_SERVER, len ? len : 1);
  if (!b) {
    resp_oom(out);
    return;
  }
  memcpy(b, text, len);
  resp_set(out, status, b, len, ctype);
}

static void resp_json(srv_resp *out, unsigned status, json_t *obj) {
  char *txt = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
  json_decref(obj);
  if (!txt) {
    resp_oom(out); /* jansson fails only for memory */
    return;
  }
  resp_text(out, status, "application/json", txt, strlen(txt));
  free(txt);
}

static void resp_error(srv_resp *out, unsigned status, uint32_t retry_after_ms, const char *fmt,
                       ...) __attribute__((format(printf, 4, 5)));
static void resp_error(srv_resp *out, unsigned status, uint32_t retry_after_ms, const char *fmt,
                       ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  size_t len = 0;
  char *body = es__v2_error_body(msg, &len);
  if (!body) {
    resp_oom(out);
    return;
  }
  resp_set(out, status, body, len, "application/json");
  out->retry_after_ms =
      retry_after_ms ? retry_after_ms : es__srv_retry_after_ms(out->status, 0, 0);
}

/* The answer for a failed request, by es__srv_status_of's one rule: status,
 * Retry-After and the model's counters (sm NULL: none). */
static void resp_status(es_server *s, srv_resp *out, srv_model *sm, int rc, const es_refusal *why,
                        const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static void resp_status(es_server *s, srv_resp *out, srv_model *sm, int rc, const es_refusal *why,
                        const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  srv_status st = es__srv_status_of(rc, why);
  es__srv_count(s, sm, st.outcome, st.reason);
  resp_error(out, st.http, st.retry_after_ms, "%s", msg);
}

/* 405 with Allow for a path that exists under another method. */
static void resp_method(srv_resp *out, const char *method, const char *url, const char *allow) {
  resp_error(out, 405, 0, "%.16s is not allowed on %.500s (allowed: %s)", method, url, allow);
  out->allow = allow;
}

/* A 200 with the encoded outputs; counted with the request's timings. */
static void resp_outputs(es_server *s, srv_resp *out, srv_model *sm, const es_v2_request *q,
                         const es_v2_output *outs, int n, uint64_t queue_ns, uint64_t run_ns) {
  char *body;
  size_t len, hlen;
  if (es__v2_response_encode(sm->name, "1", q->id, outs, n, &body, &len, &hlen) < 0) {
    resp_status(s, out, sm, ES_ENOMEM, NULL, "cannot encode the response: %s",
                es_last_error_detail());
    return;
  }
  es__srv_count(s, sm, SRV_OUT_SUCCESS, 0);
  es__srv_observe(s, sm, queue_ns, run_ns);
  resp_set(out, 200, body, len, hlen ? "application/octet-stream" : "application/json");
  out->header_len = hlen;
}

/* ---- metadata ----------------------------------------------------------------- */

/* Split "/v2/models/NAME/versions/V/infer" into segments (in place, in a
 * copy). Returns the count, at most max. */
static int split_path(char *path, char **seg, int max) {
  int n = 0;
  char *save = NULL; /* strtok's state would be shared by every thread */
  for (char *p = strtok_r(path, "/", &save); p && n < max; p = strtok_r(NULL, "/", &save))
    seg[n++] = p;
  return n;
}

static json_t *tensor_meta(const es_tensor_info *ti) {
  json_t *shape = json_array();
  for (int d = 0; d < ti->rank; d++)
    json_array_append_new(shape, json_integer(ti->dims[d]));
  return json_pack("{s:s, s:s, s:o}", "name", ti->name, "datatype",
                   es__v2_dtype_name(ti->dtype), "shape", shape);
}

static void model_metadata(es_server *s, srv_resp *out, srv_model *sm) {
  if (sm->pipeline) {
    json_t *o = json_pack("{s:s, s:[s], s:s, s:[{s:s, s:s, s:[i]}], s:[{s:s, s:s, s:[i]}]}",
                          "name", sm->name, "versions", "1", "platform", sm->platform, "inputs",
                          "name", "image", "datatype", "BYTES", "shape", 1, "outputs", "name",
                          "result", "datatype", "BYTES", "shape", 1);
    resp_json(out, 200, o);
    return;
  }
  int id;
  if (es__srv_model_acquire(s, sm, &id) < 0) {
    resp_error(out, 404, 0, "%s", es_last_error_detail());
    return;
  }
  es_model *m;
  if (es_runtime_model_get(s->rt, id, &m) < 0) {
    es__srv_model_release(s, sm);
    resp_error(out, 404, 0, "model '%s' is not loaded", sm->name);
    return;
  }
  json_t *ins = json_array(), *outs = json_array();
  for (int i = 0; i < es_model_input_count(m); i++) {
    es_tensor_info ti;
    es_model_input_info(m, i, &ti);
    json_array_append_new(ins, tensor_meta(&ti));
  }
  for (int i = 0; i < es_model_output_count(m); i++) {
    es_tensor_info ti;
    es_model_output_info(m, i, &ti);
    json_array_append_new(outs, tensor_meta(&ti));
  }
  es_model_release(m);
  es__srv_model_release(s, sm);
  json_t *o = json_pack("{s:s, s:[s], s:s, s:o, s:o}", "name", sm->name, "versions", "1",
                        "platform", sm->platform, "inputs", ins, "outputs", outs);
  resp_json(out, 200, o);
}

static uint64_t deadline_of(const es_v2_request *q) {
  return q->has_timeout && q->timeout_us ? es__now_ns() + q->timeout_us * 1000ull : 0;
}

/* Whether output `name` is sent, and in binary: the request's outputs list
 * (none listed: all, in the request-wide binary mode). */
static int output_wanted(const es_v2_request *q, const char *name, int *binary) {
  int want = q->n_outputs == 0;
  *binary = q->binary_output;
  for (int j = 0; j < q->n_outputs; j++)
    if (!strcmp(q->outputs[j].name, name)) {
      want = 1;
      if (q->outputs[j].binary >= 0)
        *binary = q->outputs[j].binary;
    }
  return want;
}

/* ---- jobs --------------------------------------------------------------------- */

static srv_job *job_new(es_server *s, srv_model *sm, int kind, srv_wake_fn wake, void *user) {
  srv_job *j = es_mem_calloc(ES_MEM_SERVER, 1, sizeof *j);
  if (!j)
    return NULL;
  j->kind = kind;
  j->s = s;
  j->sm = sm;
  j->rt_id = -1;
  j->wake = wake;
  j->user = user;
  return j;
}

static void job_free(srv_job *j) {
  if (!j)
    return;
  if (j->r) {
    es__srv_track(j->s, j->r, 0);
    es_request_free(j->r);
  }
  if (j->held)
    es__srv_model_release(j->s, j->sm);
  es__v2_request_free(&j->q);
  es_mem_free(j->json);
  es_mem_free(j);
}

void es__srv_job_free(srv_job *j) { job_free(j); }

/* The model's reference goes back as soon as the work is done, not when
 * the answer is made: the answer is made on a connection thread, which an
 * unload waiting for the references must never have to wait for. */
static void job_work_done(srv_job *j) {
  if (j->held) {
    j->held = 0;
    es__srv_model_release(j->s, j->sm);
  }
}

/* The runtime's completion callback (a runtime thread): wake the caller.
 * The outputs stay in the request (the runtime's), not in the model. */
static void infer_done(void *user, es_request *r) {
  (void)r;
  srv_job *j = user;
  job_work_done(j);
  j->wake(j->user);
}

/* 1: name is one of the model's state inputs and the request is part of a
 * sequence. */
static int state_input(const srv_model *sm, const es_v2_request *q, const char *name) {
  for (int k = 0; (q->sequence_id || q->sequence_key[0]) && k < sm->n_states; k++)
    if (!strcmp(sm->state_in[k], name))
      return 1;
  return 0;
}

/* The request's inputs bound to the model's, in the model's order, and its
 * requested outputs checked. 0, or ES_EINVAL with the reason in why. The
 * tensors point into q. */
static int bind_inputs(const srv_model *sm, es_model *m, const es_v2_request *q, es_tensor *in,
                       char *why, size_t whylen) {
  int n_in = es_model_input_count(m);
  es_tensor_info ti;
  for (int j = 0; j < q->n_inputs; j++) {
    int known = 0;
    for (int i = 0; i < n_in && !known; i++)
      known = es_model_input_info(m, i, &ti) == 0 && !strcmp(ti.name, q->inputs[j].name);
    if (!known) {
      es_model_input_info(m, 0, &ti);
      snprintf(why, whylen, "model '%s' has no input '%s' (its first input is '%s')", sm->name,
               q->inputs[j].name, ti.name);
      return ES_EINVAL;
    }
  }
  /* In a sequence the state inputs are the runtime's to feed: they may be
   * left out (and must be, after the start; the runtime says so). */
  int states_left = 0;
  for (int i = 0; i < n_in; i++) {
    es_model_input_info(m, i, &ti);
    if (!state_input(sm, q, ti.name))
      continue;
    int given = 0;
    for (int j = 0; j < q->n_inputs; j++)
      given |= !strcmp(q->inputs[j].name, ti.name);
    states_left += !given;
  }
  if (q->n_inputs + states_left != n_in) {
    snprintf(why, whylen, "model '%s' takes %d inputs, the request has %d", sm->name, n_in,
             q->n_inputs);
    return ES_EINVAL;
  }
  for (int i = 0; i < n_in; i++) {
    es_model_input_info(m, i, &ti);
    const es_v2_input *x = NULL;
    for (int j = 0; j < q->n_inputs; j++)
      if (!strcmp(q->inputs[j].name, ti.name))
        x = &q->inputs[j];
    if (!x && state_input(sm, q, ti.name)) {
      memset(&in[i], 0, sizeof in[i]);
      in[i].name = ti.name;
      in[i].dtype = ti.dtype;
      continue;
    }
    if (!x) {
      snprintf(why, whylen, "input '%s' is missing", ti.name);
      return ES_EINVAL;
    }
    if (x->is_bytes || x->dtype != ti.dtype) {
      snprintf(why, whylen, "input '%s' must be %s, got %s", ti.name, es__v2_dtype_name(ti.dtype),
               x->is_bytes ? "BYTES" : es__v2_dtype_name(x->dtype));
      return ES_EINVAL;
    }
    memset(&in[i], 0, sizeof in[i]);
    in[i].name = ti.name;
    in[i].dtype = x->dtype;
    in[i].rank = x->rank;
    memcpy(in[i].dims, x->dims, sizeof in[i].dims);
    in[i].data = (void *)x->data;
    in[i].nbytes = x->nbytes;
  }
  for (int j = 0; j < q->n_outputs; j++) {
    int known = 0;
    for (int i = 0; i < es_model_output_count(m) && !known; i++)
      known = es_model_output_info(m, i, &ti) == 0 && !strcmp(ti.name, q->outputs[j].name);
    if (!known) {
      snprintf(why, whylen, "model '%s' has no output '%s'", sm->name, q->outputs[j].name);
      return ES_EINVAL;
    }
  }
  return 0;
}

/* Bind and submit a plain model's request. 1 with the job running, or 0
 * with the answer in out (the job freed). */
static int infer_submit(es_server *s, srv_job *j, srv_resp *out) {
  srv_model *sm = j->sm;
  es_model *m = NULL;
  es_tensor in[ES_RT_MAX_IO];
  char why[512];
  if (es_runtime_model_get(s->rt, j->rt_id, &m) < 0) {
    resp_status(s, out, NULL, ES_ENOENT, NULL, "model '%s' is not loaded", sm->name);
    job_free(j);
    return 0;
  }
  if (bind_inputs(sm, m, &j->q, in, why, sizeof why) < 0) {
    es_model_release(m);
    resp_status(s, out, sm, ES_EINVAL, NULL, "%s", why);
    job_free(j);
    return 0;
  }
  es_submit sub = {.model = j->rt_id, .inputs = in, .n_inputs = es_model_input_count(m),
                   .priority = j->level, .deadline_ns = j->deadline_ns,
                   .on_done = infer_done, .user = j,
                   .sequence = j->q.sequence_id,
                   .sequence_key = j->q.sequence_key[0] ? j->q.sequence_key : NULL,
                   .sequence_flags = j->q.sequence_flags};
  es_model_release(m);
  es_refusal ref;
  memset(&ref, 0, sizeof ref);
  es_request *r = NULL;
  /* The callback may run before submit returns; it only wakes the caller,
   * which reads j->r after this function returned. */
  int rc = es_runtime_submit(s->rt, &sub, &r, &ref);
  if (rc < 0) {
    int in_seq = j->q.sequence_id || j->q.sequence_key[0];
    if (rc == ES_EAGAIN && in_seq) /* the runtime's words: which limit */
      resp_status(s, out, sm, rc, &ref, "refused: %s (%s)", es_refusal_name(ref.reason),
                  es_last_error_detail());
    else if (rc == ES_EAGAIN)
      resp_status(s, out, sm, rc, &ref, "refused: %s (model '%s')", es_refusal_name(ref.reason),
                  sm->name);
    else /* a sequence that is not live is the request's fault: 400, not 404 */
      resp_status(s, out, sm, rc == ES_ENOENT && in_seq ? ES_EINVAL : rc, &ref, "%s",
                  es_last_error_detail());
    job_free(j);
    return 0;
  }
  j->r = r;
  es__srv_track(s, r, 1); /* so shutdown can cancel it while queued */
  return 1;
}

static void infer_answer(es_server *s, srv_job *j, srv_resp *out) {
  srv_model *sm = j->sm;
  es_request *r = j->r;
  int rc = es_request_status(r);
  es_request_info info;
  es_request_info_get(r, &info);
  if (rc == 0) {
    int n_out = es_request_output_count(r);
    es_v2_output outs[ES_RT_MAX_IO];
    es_tensor keep[ES_RT_MAX_IO]; /* outs[] points at their dims */
    int n = 0;
    for (int i = 0; i < n_out; i++) {
      es_tensor *t = &keep[n];
      es_request_output(r, i, t);
      int binary;
      if (output_wanted(&j->q, t->name, &binary))
        outs[n++] =
            (es_v2_output){t->name, t->dtype, t->rank, t->dims, t->data, t->nbytes, binary};
    }
    resp_outputs(s, out, sm, &j->q, outs, n, info.queue_ns, info.run_ns);
  } else if (rc == ES_ETIMEDOUT) {
    resp_status(s, out, sm, rc, &info.refusal, "deadline passed before '%s' could run",
                sm->name);
  } else if (rc == ES_EAGAIN && info.worker >= 0) {
    /* refused on its worker: no memory for what the run takes (its
     * detail says how much and why) */
    es_request_wait(r, 0);
    resp_status(s, out, sm, rc, &info.refusal, "refused while it ran (%s): %s",
                es_refusal_name(info.refusal.reason), es_last_error_detail());
  } else if (rc == ES_EAGAIN) {
    resp_status(s, out, sm, rc, &info.refusal, "removed from the queue: %s",
                es_refusal_name(info.refusal.reason));
  } else if (rc == ES_ECANCELED) {
    resp_status(s, out, sm, rc, &info.refusal, "cancelled: the server is shutting down");
  } else if (rc == ES_ENOENT && (j->q.sequence_id || j->q.sequence_key[0])) {
    es_request_wait(r, 0); /* its detail: why the sequence is not live */
    resp_status(s, out, sm, ES_EINVAL, &info.refusal, "%s", es_last_error_detail());
  } else {
    resp_status(s, out, sm, rc, &info.refusal, "'%s' failed: %s", sm->name, es_strerror(rc));
  }
}

/* ---- pipelines ---------------------------------------------------------------- */

/* The image of a pipeline request: one BYTES element holding a JPEG or PNG
 * (4-byte little-endian length, then the bytes). 0, or ES_EINVAL with the
 * reason in why. */
static int pipeline_image(const srv_model *sm, const es_v2_request *q, const void **img,
                          size_t *len, char *why, size_t whylen) {
  const es_v2_input *x = q->n_inputs == 1 ? &q->inputs[0] : NULL;
  if (!x || !x->is_bytes) {
    snprintf(why, whylen, "pipeline '%s' takes one BYTES input (an encoded JPEG or PNG image)%s",
             sm->name, x ? ", got another datatype" : "");
    return ES_EINVAL;
  }
  const unsigned char *d = x->data;
  uint32_t n = 0;
  if (x->nbytes >= 4)
    n = (uint32_t)d[0] | (uint32_t)d[1] << 8 | (uint32_t)d[2] << 16 | (uint32_t)d[3] << 24;
  if (x->nbytes < 4 || (size_t)n > x->nbytes - 4) {
    snprintf(why, whylen, "input '%s': no image in the BYTES element", x->name);
    return ES_EINVAL;
  }
  *img = d + 4;
  *len = n;
  return 0;
}

/* The request's image, decoded with its pixels reserved through
 * admission, charged to the pipeline's first model (face: its detector;
 * ocr: det), whose runtime id the job's task is charged to as well. The
 * face detector reads at most its input's side of an image (it averages
 * larger ones down first), so a JPEG is decoded no larger than that needs
 * (the boxes come back in the encoded image's pixels); OCR reads text,
 * and gets every pixel. */
static int image_decode(es_server *s, srv_job *j, es_image *img) {
  int side = j->sm->pipeline == SRV_PIPE_FACE ? es_face_detector_input_side(j->sm->fd) : 0;
  return es_image_decode_scaled(s->rt, j->rt_first, j->image, j->image_len, side, j->level,
                                j->deadline_ns, img, &j->why);
}

/* Decode and run the pipeline's detector or reader (the job's task, on a
 * runtime worker: each stage it submits runs on that worker in turn). */
static void pipeline_run(es_server *s, srv_job *j) {
  srv_model *sm = j->sm;
  es_image img;
  memset(&img, 0, sizeof img);
  uint64_t t0 = es__now_ns();
  int n = 0;
  int rc = image_decode(s, j, &img);
  if (rc == 0 && sm->pipeline == SRV_PIPE_FACE) {
    es_face faces[64];
    rc = es_face_detect(sm->fd, &img, 0, j->level, j->deadline_ns, faces, 64, &n, &j->why);
    if (rc == 0 && !(j->json = es_faces_json(faces, n, &j->json_len)))
      rc = es__fail(ES_ENOMEM, "no memory for the answer");
  } else if (rc == 0) {
    es_ocr_line *lines = es_mem_alloc(ES_MEM_SERVER, 64 * sizeof *lines);
    rc = lines ? es_ocr_read(sm->ocr, &img, j->level, j->deadline_ns, lines, 64, &n, &j->why)
               : es__fail(ES_ENOMEM, "no memory for the answer");
    if (rc == 0 && !(j->json = es_ocr_json(lines, n, &j->json_len)))
      rc = es__fail(ES_ENOMEM, "no memory for the answer");
    es_mem_free(lines);
  }
  es_image_free(&img);
  j->run_ns = es__now_ns() - t0;
  j->rc = rc;
  if (rc < 0)
    snprintf(j->detail, sizeof j->detail, "%s", es_last_error_detail());
}

/* A pipeline job is one runtime task at the request's priority: it waits
 * in the runtime's queues with the models' requests, a run of lower
 * priority pauses for it at its next safe point, and its stages (decode,
 * the detector, the reader's models) then run one after the other on that
 * worker, with no thread to wake between them. Its outcome is the job's
 * (rc, detail, why), so the task itself always succeeds. */
static int pipeline_task(void *user) {
  srv_job *j = user;
  es_server *s = j->s;
  pthread_mutex_lock(&s->pipe_mu);
  s->pipe_queued--;
  s->pipe_running++;
  j->started = 1;
  pthread_mutex_unlock(&s->pipe_mu);
  pipeline_run(s, j);
  pthread_mutex_lock(&s->pipe_mu);
  s->pipe_running--;
  pthread_mutex_unlock(&s->pipe_mu);
  return 0;
}

/* The task's completion (a runtime thread): a task that never ran (its
 * deadline passed in the queue, the shutdown cancelled it, memory pressure
 * removed it) answers for the job; then the caller is woken. */
static void pipeline_done(void *user, es_request *r) {
  srv_job *j = user;
  es_server *s = j->s;
  pthread_mutex_lock(&s->pipe_mu);
  int started = j->started;
  if (!started)
    s->pipe_queued--;
  pthread_mutex_unlock(&s->pipe_mu);
  if (!started) {
    es_request_info info;
    if (es_request_info_get(r, &info) == 0)
      j->why = info.refusal;
    j->rc = es_request_status(r);
    if (j->rc >= 0) /* cannot be: a task that completed ran */
      j->rc = ES_ESTATE;
    if (j->rc == ES_ETIMEDOUT)
      snprintf(j->detail, sizeof j->detail, "the deadline passed before it ran");
    else if (j->rc == ES_ECANCELED)
      snprintf(j->detail, sizeof j->detail, "cancelled: the server is shutting down");
    else if (j->rc == ES_EAGAIN)
      snprintf(j->detail, sizeof j->detail, "removed from the queue (%s), retry after %u ms",
               es_refusal_name(j->why.reason), j->why.retry_after_ms);
    else
      snprintf(j->detail, sizeof j->detail, "%s", es_strerror(j->rc));
  }
  job_work_done(j);
  j->wake(j->user);
}

static void jobq_push(srv_jobq *q, srv_job *j) {
  j->next = NULL;
  if (q->tail)
    q->tail->next = j;
  else
    q->head = j;
  q->tail = j;
  q->n++;
}

static srv_job *jobq_pop(srv_jobq *q) {
  srv_job *j = q->head;
  if (j) {
    q->head = j->next;
    if (!q->head)
      q->tail = NULL;
    q->n--;
  }
  return j;
}

int es__srv_pipelines_start(es_server *s) {
  pthread_mutex_init(&s->pipe_mu, NULL);
  pthread_cond_init(&s->pipe_cv, NULL);
  return 0;
}

/* New pipeline jobs are refused from here on (503); queued ones are the
 * runtime's, cancelled with the other tracked requests. */
void es__srv_pipelines_stop(es_server *s) {
  pthread_mutex_lock(&s->pipe_mu);
  s->pipe_stop = 1;
  pthread_mutex_unlock(&s->pipe_mu);
}

/* Submit a pipeline job's task. 1 submitted, or 0 with the refusal in out
 * (the job freed). */
static int pipeline_submit(es_server *s, srv_job *j, srv_resp *out) {
  char bad[600];
  if (pipeline_image(j->sm, &j->q, &j->image, &j->image_len, bad, sizeof bad) < 0) {
    resp_status(s, out, j->sm, ES_EINVAL, NULL, "%s", bad);
    job_free(j);
    return 0;
  }
  /* The members cannot be unloaded while the pipeline is loaded, and the
   * job holds the pipeline, so the id read here stays the member's. */
  pthread_mutex_lock(&s->mu);
  srv_model *first = es__srv_find(s, j->sm->member[0]);
  j->rt_first = first ? first->rt_id : -1;
  pthread_mutex_unlock(&s->mu);
  if (j->rt_first < 0) {
    resp_status(s, out, NULL, ES_ENOENT, NULL, "pipeline '%s': its model '%s' is not loaded",
                j->sm->name, j->sm->member[0]);
    job_free(j);
    return 0;
  }
  pthread_mutex_lock(&s->pipe_mu);
  unsigned cap = s->cfg.pipeline_queue ? s->cfg.pipeline_queue : 64;
  int full = s->pipe_queued >= cap, stopping = s->pipe_stop;
  if (!full && !stopping)
    s->pipe_queued++;
  pthread_mutex_unlock(&s->pipe_mu);
  es_refusal why;
  memset(&why, 0, sizeof why);
  if (full || stopping) {
    why.reason = full ? ES_REFUSE_QUEUE_FULL : ES_REFUSE_DRAINING;
    if (full)
      resp_status(s, out, j->sm, ES_EAGAIN, &why, "pipeline '%s': %u images are waiting already",
                  j->sm->name, cap);
    else
      resp_status(s, out, j->sm, ES_ECANCELED, &why, "pipeline '%s': the server is shutting down",
                  j->sm->name);
    job_free(j);
    return 0;
  }
  es_task t = {.model = j->rt_first, .priority = j->level, .deadline_ns = j->deadline_ns,
               .fn = pipeline_task, .user = j, .on_done = pipeline_done};
  es_request *r = NULL;
  /* The callback may run before submit returns; it only wakes the caller,
   * which reads j->r after this function returned. */
  int rc = es_runtime_submit_task(s->rt, &t, &r, &why);
  if (rc < 0) {
    pthread_mutex_lock(&s->pipe_mu);
    s->pipe_queued--;
    pthread_mutex_unlock(&s->pipe_mu);
    resp_status(s, out, j->sm, rc, &why, "pipeline '%s': %s", j->sm->name,
                es_last_error_detail());
    job_free(j);
    return 0;
  }
  j->r = r;
  es__srv_track(s, r, 1); /* so shutdown can cancel it while queued */
  return 1;
}

static void pipeline_answer(es_server *s, srv_job *j, srv_resp *out) {
  srv_model *sm = j->sm;
  if (j->rc < 0) {
    resp_status(s, out, sm, j->rc, &j->why, "pipeline '%s': %s", sm->name, j->detail);
    return;
  }
  /* One BYTES element: 4-byte little-endian length, then the JSON. */
  size_t jlen = j->json_len;
  char *elem = es_mem_alloc(ES_MEM_SERVER, jlen + 4);
  if (!elem) {
    resp_status(s, out, NULL, ES_ENOMEM, NULL, "no memory for the answer");
    return;
  }
  elem[0] = (char)(jlen & 0xff);
  elem[1] = (char)(jlen >> 8 & 0xff);
  elem[2] = (char)(jlen >> 16 & 0xff);
  elem[3] = (char)(jlen >> 24 & 0xff);
  memcpy(elem + 4, j->json, jlen);
  int binary;
  output_wanted(&j->q, "result", &binary);
  int64_t one = 1;
  es_v2_output o = {"result", ES_DTYPE_UNDEFINED, 1, &one, elem, jlen + 4, binary};
  /* the task's wait for a worker, as a model's request reports it */
  es_request_info info;
  uint64_t queue_ns = j->r && es_request_info_get(j->r, &info) == 0 ? info.queue_ns : 0;
  resp_outputs(s, out, sm, &j->q, &o, 1, queue_ns, j->run_ns);
  es_mem_free(elem);
}

/* ---- repository control --------------------------------------------------------- */

/* A load or an unload may take seconds (reading a model, waiting for the
 * requests that hold it), so it runs on a thread of its own, never on a
 * connection thread, whose requests might be the very ones it waits for.
 * Up to SRV_MAX_CONTROL threads, started when work comes and gone when the
 * queue is empty, take the jobs in order; at most SRV_CONTROL_QUEUE wait. */
static void *control_thread(void *arg) {
  es_server *s = arg;
  pthread_mutex_lock(&s->pipe_mu);
  for (srv_job *j; (j = jobq_pop(&s->control_q));) {
    pthread_mutex_unlock(&s->pipe_mu);
    j->rc = j->load ? es__srv_model_load(s, j->sm) : es__srv_model_unload(s, j->sm, 10000);
    if (j->rc < 0)
      snprintf(j->detail, sizeof j->detail, "%s", es_last_error_detail());
    j->wake(j->user); /* after this the job belongs to the caller again */
    pthread_mutex_lock(&s->pipe_mu);
  }
  if (--s->control_active == 0)
    pthread_cond_broadcast(&s->pipe_cv);
  pthread_mutex_unlock(&s->pipe_mu);
  return NULL;
}

/* Waits for the load and unload threads still running. */
void es__srv_control_wait(es_server *s) {
  pthread_mutex_lock(&s->pipe_mu);
  while (s->control_active)
    pthread_cond_wait(&s->pipe_cv, &s->pipe_mu);
  pthread_mutex_unlock(&s->pipe_mu);
}

static int control_submit(es_server *s, srv_job *j, srv_resp *out) {
  pthread_mutex_lock(&s->pipe_mu);
  if (s->control_q.n >= SRV_CONTROL_QUEUE) {
    pthread_mutex_unlock(&s->pipe_mu);
    es_refusal why = {.reason = ES_REFUSE_QUEUE_FULL};
    resp_status(s, out, NULL, ES_EAGAIN, &why, "%d loads and unloads are waiting already",
                SRV_CONTROL_QUEUE);
    job_free(j);
    return 0;
  }
  jobq_push(&s->control_q, j);
  int start = s->control_active < SRV_MAX_CONTROL;
  if (start)
    s->control_active++;
  pthread_mutex_unlock(&s->pipe_mu);
  if (!start)
    return 1; /* a running control thread takes it */
  pthread_t th;
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  int rc = pthread_create(&th, &at, control_thread, s);
  pthread_attr_destroy(&at);
  if (rc == 0)
    return 1;
  /* No thread. A thread leaves only with the queue empty, so when none is
   * left the jobs queued now (this one, and any queued meanwhile by other
   * requests whose thread could not start either) have none: each is
   * answered 503 through its own wake, as a finished job would be. */
  pthread_mutex_lock(&s->pipe_mu);
  srv_jobq orphans = {0};
  if (--s->control_active == 0) {
    orphans = s->control_q;
    memset(&s->control_q, 0, sizeof s->control_q);
    pthread_cond_broadcast(&s->pipe_cv);
  }
  pthread_mutex_unlock(&s->pipe_mu);
  for (srv_job *o; (o = jobq_pop(&orphans));) {
    o->rc = ES_ENOMEM;
    snprintf(o->detail, sizeof o->detail, "cannot start a thread for the %s",
             o->load ? "load" : "unload");
    o->wake(o->user);
  }
  return 1;
}

static void control_answer(es_server *s, srv_job *j, srv_resp *out) {
  if (j->rc < 0)
    resp_status(s, out, NULL, j->rc, NULL, "%s '%s': %s", j->load ? "load" : "unload",
                j->sm->name, j->detail);
  else
    resp_text(out, 200, "application/json", "{}", 2);
}

void es__srv_job_answer(es_server *s, srv_job *j, srv_resp *out) {
  if (j->kind == JOB_INFER)
    infer_answer(s, j, out);
  else if (j->kind == JOB_PIPELINE)
    pipeline_answer(s, j, out);
  else
    control_answer(s, j, out);
  job_free(j);
}

/* ---- routes ------------------------------------------------------------------- */

/* The request's body parsed, with the binary extension's header length.
 * 0, or ES_EINVAL (the request) or ES_ENOMEM (the server: 503) with the
 * reason in err. */
static int read_request(es_server *s, const srv_req *rq, es_v2_request *q, char *err,
                        size_t errlen) {
  long long header_len = -1;
  if (rq->header_len) {
    char *end;
    errno = 0;
    header_len = strtoll(rq->header_len, &end, 10);
    if (errno || end == rq->header_len || *end || header_len < 0) {
      snprintf(err, errlen, "Inference-Header-Content-Length '%.40s' is not a non-negative "
               "integer", rq->header_len);
      return ES_EINVAL;
    }
  }
  int rc = es__v2_request_parse(rq->body ? rq->body : "", rq->len, header_len,
                                s->cfg.max_elements, q, err, errlen);
  return rc < 0 ? rc : 0; /* ES_EINVAL for the request, ES_ENOMEM for the server */
}

static int infer(es_server *s, srv_model *sm, const srv_req *rq, srv_wake_fn wake, void *user,
                 srv_job **job, srv_resp *out) {
  srv_job *j = job_new(s, sm, sm->pipeline ? JOB_PIPELINE : JOB_INFER, wake, user);
  if (!j) {
    resp_status(s, out, NULL, ES_ENOMEM, NULL, "no memory for the request");
    return 0;
  }
  char why[512];
  int prc = read_request(s, rq, &j->q, why, sizeof why);
  if (prc < 0) {
    resp_status(s, out, sm, prc, NULL, "%s", why);
    job_free(j);
    return 0;
  }
  int id = -1;
  if (es__srv_model_acquire(s, sm, &id) < 0) {
    resp_status(s, out, NULL, ES_ENOENT, NULL, "%s", es_last_error_detail());
    job_free(j);
    return 0;
  }
  j->held = 1;
  j->rt_id = id;
  j->level = es__srv_level_of(s, sm, j->q.has_priority, j->q.priority);
  j->deadline_ns = deadline_of(&j->q);
  int rc = j->kind == JOB_PIPELINE ? pipeline_submit(s, j, out) : infer_submit(s, j, out);
  if (rc == 1)
    *job = j;
  return rc;
}

static void repository_index(es_server *s, srv_resp *out) {
  json_t *arr = json_array();
  pthread_mutex_lock(&s->mu);
  for (int i = 0; i < s->n_models; i++) {
    srv_model *sm = &s->models[i];
    json_t *o = json_pack("{s:s, s:s, s:s}", "name", sm->name, "version", "1", "state",
                          es__srv_state_name(sm));
    if (sm->state == SRV_UNLOADED && sm->reason[0])
      json_object_set_new(o, "reason", json_string(sm->reason));
    json_array_append_new(arr, o);
  }
  pthread_mutex_unlock(&s->mu);
  resp_json(out, 200, arr);
}

static int repository_load(es_server *s, const srv_req *rq, srv_model *sm, int load,
                           srv_wake_fn wake, void *user, srv_job **job, srv_resp *out) {
  char why[400];
  unsigned st = (unsigned)es__srv_guard_control(&s->cfg, rq->authorization, rq->origin, rq->host,
                                                rq->content_type, rq->len, why, sizeof why);
  if (st) {
    resp_error(out, st, 0, "%s", why);
    out->want_auth = st == 401;
    return 0;
  }
  srv_job *j = job_new(s, sm, JOB_CONTROL, wake, user);
  if (!j) {
    resp_status(s, out, NULL, ES_ENOMEM, NULL, "no memory for the request");
    return 0;
  }
  j->load = load;
  int rc = control_submit(s, j, out);
  if (rc == 1)
    *job = j;
  return rc;
}

int es__srv_handle(es_server *s, const srv_req *rq, srv_wake_fn wake, void *user, srv_job **job,
                   srv_resp *out) {
  *job = NULL;
  memset(out, 0, sizeof *out);
  const char *url = rq->url, *method = rq->method;
  int get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
  int post = !strcmp(method, "POST");
  if (!strcmp(url, "/metrics") && get) {
    size_t len;
    char *txt;
    if (es_server_metrics_text(s, &txt, &len) < 0)
      resp_error(out, 500, 0, "metrics unavailable: %s", es_last_error_detail());
    else
      resp_set(out, 200, txt, len, "text/plain; version=0.0.4; charset=utf-8");
    return 0;
  }
  char path[512];
  if (strlen(url) >= sizeof path) {
    resp_error(out, 404, 0, "no such route");
    return 0;
  }
  snprintf(path, sizeof path, "%s", url);
  char *seg[8];
  int n = split_path(path, seg, 8);
  if (n < 1 || strcmp(seg[0], "v2")) {
    resp_error(out, 404, 0, "no such route: %.500s", url);
    return 0;
  }
  if (n == 1 && get) {
    json_t *o = json_pack("{s:s, s:s, s:[s,s,s,s]}", "name", "edgeserve", "version",
                          ES_VERSION_STRING, "extensions", "binary_tensor_data",
                          "model_repository", "schedule_policy", "metrics");
    resp_json(out, 200, o);
    return 0;
  }
  if (n == 3 && !strcmp(seg[1], "health") && get) {
    if (!strcmp(seg[2], "live")) {
      resp_json(out, 200, json_pack("{s:b}", "live", 1));
      return 0;
    }
    if (!strcmp(seg[2], "ready")) {
      /* 503 while draining, or while a model the server was to serve at
       * start failed to load: a balancer or Kubernetes sends no work to a
       * box that lacks part of its models. The names say which. */
      char failed[512];
      int ready = es__srv_ready(s, failed, sizeof failed);
      resp_json(out, ready ? 200 : 503,
                ready || !failed[0] ? json_pack("{s:b}", "ready", ready)
                                    : json_pack("{s:b, s:s}", "ready", ready, "not_loaded", failed));
      return 0;
    }
  }
  if (n >= 2 && !strcmp(seg[1], "repository")) {
    if (n == 3 && !strcmp(seg[2], "index") && post) {
      repository_index(s, out);
      return 0;
    }
    if (n == 5 && !strcmp(seg[2], "models") && post &&
        (!strcmp(seg[4], "load") || !strcmp(seg[4], "unload"))) {
      srv_model *sm = es__srv_find(s, seg[3]);
      if (!sm) {
        resp_error(out, 404, 0, "unknown model '%.200s'", seg[3]);
        return 0;
      }
      return repository_load(s, rq, sm, !strcmp(seg[4], "load"), wake, user, job, out);
    }
    resp_method(out, method, url, "POST");
    return 0;
  }
  if (n >= 3 && !strcmp(seg[1], "models")) {
    srv_model *sm = es__srv_find(s, seg[2]);
    if (!sm) {
      resp_error(out, 404, 0, "unknown model '%.200s'", seg[2]);
      return 0;
    }
    int rest = 3;
    if (n >= 5 && !strcmp(seg[3], "versions")) {
      if (strcmp(seg[4], "1")) {
        resp_error(out, 404, 0, "model '%s' has no version '%.100s' (only '1')", sm->name,
                   seg[4]);
        return 0;
      }
      rest = 5;
    }
    if (n == rest && get) {
      model_metadata(s, out, sm);
      return 0;
    }
    if (n == rest + 1 && !strcmp(seg[rest], "ready") && get) {
      int ready = es__srv_model_ready(s, sm) && !atomic_load(&s->stopping);
      resp_json(out, ready ? 200 : 503, json_pack("{s:s, s:b}", "name", sm->name, "ready", ready));
      return 0;
    }
    if (n == rest + 1 && !strcmp(seg[rest], "infer") && post) {
      if (atomic_load(&s->stopping)) {
        resp_status(s, out, NULL, ES_ECANCELED, NULL, "the server is shutting down");
        return 0;
      }
      if (!es__srv_model_ready(s, sm)) { /* before parsing; infer acquires it */
        resp_error(out, 404, 0, "model '%s' is not loaded", sm->name);
        return 0;
      }
      return infer(s, sm, rq, wake, user, job, out);
    }
    if (n == rest || (n == rest + 1 && !strcmp(seg[rest], "ready"))) {
      resp_method(out, method, url, "GET, HEAD");
      return 0;
    }
    if (n == rest + 1 && !strcmp(seg[rest], "infer")) {
      resp_method(out, method, url, "POST");
      return 0;
    }
  }
  resp_error(out, 404, 0, "no such route: %.16s %.500s", method, url);
  return 0;
}
