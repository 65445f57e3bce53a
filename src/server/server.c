/* The KServe v2 (Open Inference Protocol) server on libmicrohttpd.
 *
 * One thread per connection, bounded by max_connections: an inference
 * handler blocks on its request's completion, which keeps the code a
 * straight line (parse, submit, wait, encode) and costs one small stack per
 * connection; the runtime's workers, not the HTTP threads, do the compute, so
 * the number of connections never changes how many runs happen at once.
 *
 * Memory: a body is received into one buffer counted under ES_MEM_SERVER,
 * sized from Content-Length (413 above max_body_bytes before any byte is
 * read) and charged to a server-wide budget (max_buffered_bytes, 503 when it
 * is spent), so a flood of large uploads cannot grow the process past a known
 * bound before admission even sees the requests. Tensors go from the body
 * to the runtime's arenas; outputs come back in the runtime's buddy pool and
 * are encoded straight into the response buffer.
 *
 * Statuses come from one rule for each return code (status.c): 429 for
 * queue full and concurrency, 503 for memory, deadline, draining; both with
 * Retry-After in whole seconds, rounded up, from the admission's estimate. */
#include "edgeserve/server.h"
#include "common/internal.h"
#include "server/codec.h"
#include "server/server_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>


/* ---- per-connection state --------------------------------------------------- */

typedef struct conn {
  char *block;      /* what was allocated; body starts inside it */
  char *body;
  size_t len, cap;
  size_t charged;   /* bytes charged to the buffered budget */
  int reject;       /* HTTP status decided before the body was read */
  char reject_msg[160];
  uint64_t start_ns;
} conn;

static int charge(es_server *s, size_t n) {
  size_t cur = atomic_load(&s->buffered);
  do {
    if (cur + n > s->cfg.max_buffered_bytes || cur + n < cur)
      return -1;
  } while (!atomic_compare_exchange_weak(&s->buffered, &cur, cur + n));
  return 0;
}

static void uncharge(es_server *s, size_t n) { atomic_fetch_sub(&s->buffered, n); }

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
  (void)c;
  (void)toe;
  es_server *s = cls;
  conn *k = *con_cls;
  if (!k)
    return;
  atomic_fetch_sub(&s->active, 1);
  es_mem_free(k->block);
  if (k->charged)
    uncharge(s, k->charged);
  es_mem_free(k);
  *con_cls = NULL;
}

/* ---- responses ---------------------------------------------------------------- */

static enum MHD_Result send_body(es_server *s, struct MHD_Connection *c, unsigned status,
                                 char *body, size_t len, const char *ctype, size_t header_len,
                                 uint32_t retry_after_ms) {
  struct MHD_Response *r =
      MHD_create_response_from_buffer_with_free_callback(len, body, es_mem_free);
  if (!r) {
    es_mem_free(body);
    return MHD_NO;
  }
  MHD_add_response_header(r, "Content-Type", ctype);
  char buf[32];
  if (header_len) {
    snprintf(buf, sizeof buf, "%zu", header_len);
    MHD_add_response_header(r, "Inference-Header-Content-Length", buf);
  }
  if (retry_after_ms) {
    snprintf(buf, sizeof buf, "%u", (retry_after_ms + 999) / 1000);
    MHD_add_response_header(r, "Retry-After", buf);
  }
  enum MHD_Result ok = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  atomic_fetch_add(&s->served, 1);
  return ok;
}

static enum MHD_Result send_text(es_server *s, struct MHD_Connection *c, unsigned status,
                                 const char *ctype, const char *text, size_t len) {
  char *b = es_mem_alloc(ES_MEM_SERVER, len ? len : 1);
  if (!b)
    return MHD_NO;
  memcpy(b, text, len);
  return send_body(s, c, status, b, len, ctype, 0, 0);
}

static enum MHD_Result send_json_obj(es_server *s, struct MHD_Connection *c, unsigned status,
                                     json_t *obj) {
  char *txt = json_dumps(obj, JSON_COMPACT);
  json_decref(obj);
  if (!txt)
    return MHD_NO;
  enum MHD_Result r = send_text(s, c, status, "application/json", txt, strlen(txt));
  free(txt);
  return r;
}

static enum MHD_Result send_error(es_server *s, struct MHD_Connection *c, unsigned status,
                                  uint32_t retry_after_ms, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static enum MHD_Result send_error(es_server *s, struct MHD_Connection *c, unsigned status,
                                  uint32_t retry_after_ms, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  size_t len;
  char *body = es__v2_error_body(msg, &len);
  if (!body)
    return MHD_NO;
  if (retry_after_ms == 0)
    retry_after_ms = es__srv_retry_after_ms(status, 0, 0);
  return send_body(s, c, status, body, len, "application/json", 0, retry_after_ms);
}

/* 405 with Allow for a path that exists under another method. */
static enum MHD_Result send_method_error(es_server *s, struct MHD_Connection *c,
                                         const char *method, const char *url,
                                         const char *allow) {
  char msg[600];
  snprintf(msg, sizeof msg, "%s is not allowed on %.500s (allowed: %s)", method, url, allow);
  size_t len;
  char *body = es__v2_error_body(msg, &len);
  if (!body)
    return MHD_NO;
  struct MHD_Response *r =
      MHD_create_response_from_buffer_with_free_callback(len, body, es_mem_free);
  if (!r) {
    es_mem_free(body);
    return MHD_NO;
  }
  MHD_add_response_header(r, "Content-Type", "application/json");
  MHD_add_response_header(r, "Allow", allow);
  enum MHD_Result ok = MHD_queue_response(c, 405, r);
  MHD_destroy_response(r);
  atomic_fetch_add(&s->served, 1);
  return ok;
}

/* The control plane's refusal (es__srv_guard_control); a 401 names the
 * scheme it wants. */
static enum MHD_Result send_guard_error(es_server *s, struct MHD_Connection *c, unsigned status,
                                        const char *why) {
  size_t len;
  char *body = es__v2_error_body(why, &len);
  if (!body)
    return MHD_NO;
  struct MHD_Response *r =
      MHD_create_response_from_buffer_with_free_callback(len, body, es_mem_free);
  if (!r) {
    es_mem_free(body);
    return MHD_NO;
  }
  MHD_add_response_header(r, "Content-Type", "application/json");
  if (status == 401)
    MHD_add_response_header(r, "WWW-Authenticate", "Bearer realm=\"edgeserve\"");
  enum MHD_Result ok = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  atomic_fetch_add(&s->served, 1);
  return ok;
}

/* ---- routes ------------------------------------------------------------------- */

/* Split "/v2/models/NAME/versions/V/infer" into segments (in place, in a
 * copy). Returns the count, at most max. */
static int split_path(char *path, char **seg, int max) {
  int n = 0;
  char *save = NULL; /* strtok's state is shared by every connection thread */
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

static enum MHD_Result model_metadata(es_server *s, struct MHD_Connection *c, srv_model *sm) {
  if (sm->pipeline) {
    json_t *o = json_pack("{s:s, s:[s], s:s, s:[{s:s, s:s, s:[i]}], s:[{s:s, s:s, s:[i]}]}",
                          "name", sm->name, "versions", "1", "platform", sm->platform, "inputs",
                          "name", "image", "datatype", "BYTES", "shape", 1, "outputs", "name",
                          "result", "datatype", "BYTES", "shape", 1);
    return send_json_obj(s, c, 200, o);
  }
  es_model *m;
  int id;
  if (es__srv_model_acquire(s, sm, &id) < 0)
    return send_error(s, c, 404, 0, "%s", es_last_error_detail());
  int got = es_runtime_model_get(s->rt, id, &m);
  es__srv_model_release(s, sm);
  if (got < 0)
    return send_error(s, c, 404, 0, "model '%s' is not loaded", sm->name);
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
  json_t *o = json_pack("{s:s, s:[s], s:s, s:o, s:o}", "name", sm->name, "versions", "1",
                        "platform", sm->platform, "inputs", ins, "outputs", outs);
  return send_json_obj(s, c, 200, o);
}

static int level_of(const es_server *s, const srv_model *sm, const es_v2_request *q) {
  return es__srv_level_of(s, sm, q->has_priority, q->priority);
}

static uint64_t deadline_of(const es_v2_request *q) {
  return q->has_timeout && q->timeout_us ? es__now_ns() + q->timeout_us * 1000ull : 0;
}

/* The answer for a failed request, by es__srv_status_of's one rule: status,
 * Retry-After and the model's counters (sm NULL: none). */
static enum MHD_Result send_status(es_server *s, struct MHD_Connection *c, srv_model *sm, int rc,
                                   const es_refusal *why, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static enum MHD_Result send_status(es_server *s, struct MHD_Connection *c, srv_model *sm, int rc,
                                   const es_refusal *why, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  srv_status st = es__srv_status_of(rc, why);
  es__srv_count(s, sm, st.outcome, st.reason);
  return send_error(s, c, st.http, st.retry_after_ms, "%s", msg);
}

/* A 200 with the encoded outputs; counted with the request's timings. */
static enum MHD_Result send_outputs(es_server *s, struct MHD_Connection *c, srv_model *sm,
                                    const es_v2_request *q, const es_v2_output *outs, int n,
                                    uint64_t queue_ns, uint64_t run_ns) {
  char *body;
  size_t len, hlen;
  if (es__v2_response_encode(sm->name, "1", q->id, outs, n, &body, &len, &hlen) < 0)
    return send_error(s, c, 500, 0, "cannot encode the response: %s", es_last_error_detail());
  es__srv_count(s, sm, SRV_OUT_SUCCESS, 0);
  es__srv_observe(s, sm, queue_ns, run_ns);
  return send_body(s, c, 200, body, len, hlen ? "application/octet-stream" : "application/json",
                   hlen, 0);
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

/* The image of a pipeline request: one BYTES element holding a JPEG or
 * PNG. 0, or ES_EINVAL with the reason in why. */
static int pipeline_image(const srv_model *sm, const es_v2_request *q, es_image *img, char *why,
                          size_t whylen) {
  const es_v2_input *x = q->n_inputs == 1 ? &q->inputs[0] : NULL;
  if (!x || !x->is_bytes) {
    snprintf(why, whylen, "pipeline '%s' takes one BYTES input (an encoded JPEG or PNG image)%s",
             sm->name, x ? ", got another datatype" : "");
    return ES_EINVAL;
  }
  const unsigned char *d = x->data;
  uint32_t len = 0;
  if (x->nbytes >= 4)
    len = (uint32_t)d[0] | (uint32_t)d[1] << 8 | (uint32_t)d[2] << 16 | (uint32_t)d[3] << 24;
  if (x->nbytes < 4 || (size_t)len > x->nbytes - 4) {
    snprintf(why, whylen, "input '%s': no image in the BYTES element", x->name);
    return ES_EINVAL;
  }
  if (es_image_decode(d + 4, len, img) < 0) {
    snprintf(why, whylen, "input '%s': %s", x->name, es_last_error_detail());
    return ES_EINVAL;
  }
  return 0;
}

/* Run the pipeline's detector or reader; its answer as JSON text. ES_ENOENT
 * when the pipeline was unloaded meanwhile. */
static int pipeline_run(es_server *s, srv_model *sm, const es_image *img, int prio,
                        uint64_t deadline, char **json, size_t *jlen, es_refusal *why) {
  int rc, n = 0;
  if ((rc = es__srv_model_acquire(s, sm, NULL)) < 0) /* unload waits for the release */
    return rc;
  if (sm->pipeline == SRV_PIPE_FACE) {
    es_face faces[64];
    rc = es_face_detect(sm->fd, img, 0, prio, deadline, faces, 64, &n, why);
    if (rc == 0 && !(*json = es_faces_json(faces, n, jlen)))
      rc = es__fail(ES_ENOMEM, "no memory for the answer");
  } else {
    es_ocr_line *lines = es_mem_alloc(ES_MEM_SERVER, 64 * sizeof *lines);
    rc = lines ? es_ocr_read(sm->ocr, img, prio, deadline, lines, 64, &n, why)
               : es__fail(ES_ENOMEM, "no memory for the answer");
    if (rc == 0 && !(*json = es_ocr_json(lines, n, jlen)))
      rc = es__fail(ES_ENOMEM, "no memory for the answer");
    es_mem_free(lines);
  }
  es__srv_model_release(s, sm);
  return rc;
}

/* A pipeline model: one BYTES input holding an encoded JPEG or PNG, one
 * BYTES output "result" holding the answer as a JSON string. The models it
 * runs go through the runtime like any request, so admission refusals come
 * back as 429/503 here too. */
static enum MHD_Result pipeline_infer(es_server *s, struct MHD_Connection *c, srv_model *sm,
                                      const es_v2_request *q) {
  es_image img;
  char bad[600];
  if (pipeline_image(sm, q, &img, bad, sizeof bad) < 0)
    return send_status(s, c, sm, ES_EINVAL, NULL, "%s", bad);
  es_refusal why;
  memset(&why, 0, sizeof why);
  char *json = NULL;
  size_t jlen = 0;
  uint64_t t0 = es__now_ns();
  int rc = pipeline_run(s, sm, &img, level_of(s, sm, q), deadline_of(q), &json, &jlen, &why);
  uint64_t run_ns = es__now_ns() - t0;
  es_image_free(&img);
  if (rc < 0)
    return send_status(s, c, sm, rc, &why, "pipeline '%s': %s", sm->name,
                       es_last_error_detail());
  /* One BYTES element: 4-byte little-endian length, then the JSON. */
  char *elem = es_mem_alloc(ES_MEM_SERVER, jlen + 4);
  if (!elem) {
    es_mem_free(json);
    return send_status(s, c, NULL, ES_ENOMEM, NULL, "no memory for the answer");
  }
  elem[0] = (char)(jlen & 0xff);
  elem[1] = (char)(jlen >> 8 & 0xff);
  elem[2] = (char)(jlen >> 16 & 0xff);
  elem[3] = (char)(jlen >> 24 & 0xff);
  memcpy(elem + 4, json, jlen);
  es_mem_free(json);
  int binary;
  output_wanted(q, "result", &binary);
  int64_t one = 1;
  es_v2_output out = {"result", ES_DTYPE_UNDEFINED, 1, &one, elem, jlen + 4, binary};
  enum MHD_Result res = send_outputs(s, c, sm, q, &out, 1, 0, run_ns);
  es_mem_free(elem);
  return res;
}

/* The request's body parsed, with the binary extension's header length.
 * 0, or ES_EINVAL with the reason in err. */
static int read_request(es_server *s, struct MHD_Connection *c, const conn *k, es_v2_request *q,
                        char *err, size_t errlen) {
  const char *hl =
      MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Inference-Header-Content-Length");
  long long header_len = -1;
  if (hl) {
    char *end;
    errno = 0;
    header_len = strtoll(hl, &end, 10);
    if (errno || end == hl || *end || header_len < 0) {
      snprintf(err, errlen, "Inference-Header-Content-Length '%.40s' is not a non-negative "
               "integer", hl);
      return ES_EINVAL;
    }
  }
  if (es__v2_request_parse(k->body ? k->body : "", k->len, header_len, s->cfg.max_elements, q, err,
                          errlen) < 0)
    return ES_EINVAL;
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
  if (q->n_inputs != n_in) {
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

/* The completed request's outputs, those the request asked for. */
static enum MHD_Result answer_outputs(es_server *s, struct MHD_Connection *c, srv_model *sm,
                                      const es_v2_request *q, es_request *r,
                                      const es_request_info *info) {
  int n_out = es_request_output_count(r);
  es_v2_output outs[ES_RT_MAX_IO];
  es_tensor keep[ES_RT_MAX_IO]; /* outs[] points at their dims */
  int n = 0;
  for (int i = 0; i < n_out; i++) {
    es_tensor *t = &keep[n];
    es_request_output(r, i, t);
    int binary;
    if (output_wanted(q, t->name, &binary))
      outs[n++] = (es_v2_output){t->name, t->dtype, t->rank, t->dims, t->data, t->nbytes, binary};
  }
  return send_outputs(s, c, sm, q, outs, n, info->queue_ns, info->run_ns);
}

/* Submit, wait (tracked, so shutdown can cancel it while queued), answer. */
static enum MHD_Result run_and_answer(es_server *s, struct MHD_Connection *c, srv_model *sm,
                                      int id, const es_v2_request *q, es_tensor *in, int n_in) {
  es_submit sub = {.model = id, .inputs = in, .n_inputs = n_in,
                   .priority = level_of(s, sm, q), .deadline_ns = deadline_of(q)};
  es_request *r = NULL;
  es_refusal ref;
  memset(&ref, 0, sizeof ref);
  int rc = es_runtime_submit(s->rt, &sub, &r, &ref);
  if (rc == ES_EAGAIN)
    return send_status(s, c, sm, rc, &ref, "refused: %s (model '%s')",
                       es_refusal_name(ref.reason), sm->name);
  if (rc < 0)
    return send_status(s, c, sm, rc, &ref, "%s", es_last_error_detail());
  es__srv_track(s, r, 1);
  rc = es_request_wait(r, -1);
  es__srv_track(s, r, 0);
  es_request_info info;
  es_request_info_get(r, &info);
  enum MHD_Result res;
  if (rc == 0)
    res = answer_outputs(s, c, sm, q, r, &info);
  else if (rc == ES_ETIMEDOUT)
    res = send_status(s, c, sm, rc, &info.refusal, "deadline passed before '%s' could run",
                      sm->name);
  else if (rc == ES_EAGAIN)
    res = send_status(s, c, sm, rc, &info.refusal, "removed from the queue: %s",
                      es_refusal_name(info.refusal.reason));
  else if (rc == ES_ECANCELED)
    res = send_status(s, c, sm, rc, &info.refusal, "cancelled: the server is shutting down");
  else
    res = send_status(s, c, sm, rc, &info.refusal, "'%s' failed: %s", sm->name, es_strerror(rc));
  es_request_free(r);
  return res;
}

static enum MHD_Result infer(es_server *s, struct MHD_Connection *c, srv_model *sm, conn *k) {
  es_v2_request q;
  char why[512];
  if (read_request(s, c, k, &q, why, sizeof why) < 0)
    return send_status(s, c, sm, ES_EINVAL, NULL, "%s", why);
  enum MHD_Result res;
  es_model *m = NULL;
  es_tensor in[ES_RT_MAX_IO];
  int id = -1, held = 0;
  if (sm->pipeline)
    res = pipeline_infer(s, c, sm, &q);
  else if (!(held = es__srv_model_acquire(s, sm, &id) == 0) ||
           es_runtime_model_get(s->rt, id, &m) < 0)
    res = send_status(s, c, NULL, ES_ENOENT, NULL, "%s", es_last_error_detail());
  else if (bind_inputs(sm, m, &q, in, why, sizeof why) < 0)
    res = send_status(s, c, sm, ES_EINVAL, NULL, "%s", why);
  else
    res = run_and_answer(s, c, sm, id, &q, in, es_model_input_count(m));
  es_model_release(m);
  if (held) /* after the request was freed: an unload waits for this */
    es__srv_model_release(s, sm);
  es__v2_request_free(&q);
  return res;
}

static enum MHD_Result repository_index(es_server *s, struct MHD_Connection *c) {
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
  return send_json_obj(s, c, 200, arr);
}

static enum MHD_Result repository_load(es_server *s, struct MHD_Connection *c, srv_model *sm,
                                       int load) {
  int rc = load ? es__srv_model_load(s, sm) : es__srv_model_unload(s, sm, 10000);
  if (rc < 0)
    return send_status(s, c, NULL, rc, NULL, "%s '%s': %s", load ? "load" : "unload", sm->name,
                       es_last_error_detail());
  return send_text(s, c, 200, "application/json", "{}", 2);
}

static enum MHD_Result route(es_server *s, struct MHD_Connection *c, const char *url,
                             const char *method, conn *k) {
  int get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
  int post = !strcmp(method, "POST");
  if (!strcmp(url, "/metrics") && get) {
    size_t len;
    char *txt;
    if (es_server_metrics_text(s, &txt, &len) < 0)
      return send_error(s, c, 500, 0, "metrics unavailable: %s", es_last_error_detail());
    return send_body(s, c, 200, txt, len, "text/plain; version=0.0.4; charset=utf-8", 0, 0);
  }
  char path[512];
  if (strlen(url) >= sizeof path)
    return send_error(s, c, 404, 0, "no such route");
  snprintf(path, sizeof path, "%s", url);
  char *seg[8];
  int n = split_path(path, seg, 8);
  if (n < 1 || strcmp(seg[0], "v2"))
    return send_error(s, c, 404, 0, "no such route: %s", url);
  if (n == 1 && get) {
    json_t *o = json_pack("{s:s, s:s, s:[s,s,s,s]}", "name", "edgeserve", "version",
                          ES_VERSION_STRING, "extensions", "binary_tensor_data",
                          "model_repository", "schedule_policy", "metrics");
    return send_json_obj(s, c, 200, o);
  }
  if (n == 3 && !strcmp(seg[1], "health") && get) {
    if (!strcmp(seg[2], "live"))
      return send_json_obj(s, c, 200, json_pack("{s:b}", "live", 1));
    if (!strcmp(seg[2], "ready")) {
      int ready = !atomic_load(&s->stopping);
      return send_json_obj(s, c, ready ? 200 : 503, json_pack("{s:b}", "ready", ready));
    }
  }
  if (n >= 2 && !strcmp(seg[1], "repository")) {
    if (n == 3 && !strcmp(seg[2], "index") && post)
      return repository_index(s, c);
    if (n == 5 && !strcmp(seg[2], "models") && post &&
        (!strcmp(seg[4], "load") || !strcmp(seg[4], "unload"))) {
      char why[400];
      int st = es__srv_guard_control(
          &s->cfg, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"),
          MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin"),
          MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host"),
          MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type"), k->len, why,
          sizeof why);
      if (st)
        return send_guard_error(s, c, (unsigned)st, why);
      srv_model *sm = es__srv_find(s, seg[3]);
      if (!sm)
        return send_error(s, c, 404, 0, "unknown model '%s'", seg[3]);
      return repository_load(s, c, sm, !strcmp(seg[4], "load"));
    }
    return send_method_error(s, c, method, url, "POST");
  }
  if (n >= 3 && !strcmp(seg[1], "models")) {
    srv_model *sm = es__srv_find(s, seg[2]);
    if (!sm)
      return send_error(s, c, 404, 0, "unknown model '%s'", seg[2]);
    int rest = 3;
    if (n >= 5 && !strcmp(seg[3], "versions")) {
      if (strcmp(seg[4], "1"))
        return send_error(s, c, 404, 0, "model '%s' has no version '%s' (only '1')", sm->name,
                          seg[4]);
      rest = 5;
    }
    if (n == rest && get) {
      if (!es__srv_model_ready(s, sm))
        return send_error(s, c, 404, 0, "model '%s' is not loaded", sm->name);
      return model_metadata(s, c, sm);
    }
    if (n == rest + 1 && !strcmp(seg[rest], "ready") && get) {
      int ready = es__srv_model_ready(s, sm) && !atomic_load(&s->stopping);
      return send_json_obj(s, c, ready ? 200 : 503,
                           json_pack("{s:s, s:b}", "name", sm->name, "ready", ready));
    }
    if (n == rest + 1 && !strcmp(seg[rest], "infer") && post) {
      if (atomic_load(&s->stopping))
        return send_status(s, c, NULL, ES_ECANCELED, NULL, "the server is shutting down");
      if (!es__srv_model_ready(s, sm)) /* before parsing; infer acquires it */
        return send_error(s, c, 404, 0, "model '%s' is not loaded", sm->name);
      return infer(s, c, sm, k);
    }
    if (n == rest || (n == rest + 1 && !strcmp(seg[rest], "ready")))
      return send_method_error(s, c, method, url, "GET, HEAD");
    if (n == rest + 1 && !strcmp(seg[rest], "infer"))
      return send_method_error(s, c, method, url, "POST");
  }
  return send_error(s, c, 404, 0, "no such route: %s %s", method, url);
}

/* Writes s with control characters, backslashes and bytes above 0x7e as
 * \xNN: the URL arrives percent-decoded, so a %0a in it would otherwise
 * start a forged line of the access log. */
static void log_escaped(FILE *f, const char *s) {
  for (const unsigned char *p = (const unsigned char *)s; *p; p++)
    if (*p < 0x20 || *p > 0x7e || *p == '\\')
      fprintf(f, "\\x%02x", *p);
    else
      fputc(*p, f);
}

/* One access-log line: method, URL, time taken. */
static void log_request(const char *method, const char *url, uint64_t ns) {
  flockfile(stderr);
  log_escaped(stderr, method);
  fputc(' ', stderr);
  log_escaped(stderr, url);
  fprintf(stderr, " %.2f ms\n", (double)ns / 1e6);
  funlockfile(stderr);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **con_cls) {
  (void)version;
  es_server *s = cls;
  conn *k = *con_cls;
  if (!k) {
    k = es_mem_calloc(ES_MEM_SERVER, 1, sizeof *k);
    if (!k)
      return MHD_NO;
    k->start_ns = es__now_ns();
    *con_cls = k;
    atomic_fetch_add(&s->active, 1);
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    if (cl) {
      char *end;
      errno = 0;
      unsigned long long v = strtoull(cl, &end, 10);
      if (errno || end == cl || *end) {
        k->reject = 400;
        snprintf(k->reject_msg, sizeof k->reject_msg, "bad Content-Length");
      } else if (v > s->cfg.max_body_bytes) {
        k->reject = 413;
        snprintf(k->reject_msg, sizeof k->reject_msg,
                 "body of %llu bytes is over the limit of %zu", v, s->cfg.max_body_bytes);
      } else if (v) {
        if (charge(s, (size_t)v) < 0) {
          k->reject = 503;
          snprintf(k->reject_msg, sizeof k->reject_msg,
                   "too many request bytes in flight (limit %zu)", s->cfg.max_buffered_bytes);
        } else {
          /* With the binary extension, start the body so that the tensor
           * bytes after the JSON header land 64-byte aligned: the codec then
           * hands them to the runtime without a copy. */
          const char *hl = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                       "Inference-Header-Content-Length");
          unsigned long long h = hl ? strtoull(hl, NULL, 10) : 0;
          size_t pad = (size_t)((64 - h % 64) % 64);
          k->charged = (size_t)v;
          k->block = es_mem_aligned_alloc(ES_MEM_SERVER, 64, (size_t)v + pad);
          k->body = k->block ? k->block + pad : NULL;
          k->cap = k->body ? (size_t)v : 0;
          if (!k->body) {
            k->reject = 503;
            snprintf(k->reject_msg, sizeof k->reject_msg, "no memory for the body");
          }
        }
      }
    }
    /* A body over the limit is refused before it is read (clients that
     * send "Expect: 100-continue" never send it). A 503 is answered after
     * the body was read and dropped: refusing mid-upload makes most clients
     * see a reset connection instead of the status and its Retry-After. */
    if (k->reject == 413 || k->reject == 400) {
      atomic_fetch_add(&s->rejected[k->reject == 413 ? SRV_REJECT_TOO_LARGE : SRV_REJECT_BAD], 1);
      return send_error(s, c, (unsigned)k->reject, 0, "%s", k->reject_msg);
    }
    return MHD_YES;
  }
  if (*upload_size) {
    size_t n = *upload_size;
    *upload_size = 0;
    if (k->reject)
      return MHD_YES;
    if (k->len + n > k->cap) { /* chunked upload: grow within the limits */
      size_t want = k->len + n;
      if (want > s->cfg.max_body_bytes) {
        k->reject = 413;
        snprintf(k->reject_msg, sizeof k->reject_msg, "body over the limit of %zu bytes",
                 s->cfg.max_body_bytes);
        return MHD_YES;
      }
      size_t cap = k->cap ? k->cap : 65536;
      while (cap < want)
        cap *= 2;
      if (cap > s->cfg.max_body_bytes)
        cap = s->cfg.max_body_bytes;
      if (charge(s, cap - k->charged) < 0) {
        k->reject = 503;
        snprintf(k->reject_msg, sizeof k->reject_msg, "too many request bytes in flight");
        return MHD_YES;
      }
      /* A chunked body (no Content-Length) starts at the block's base. */
      char *nb = k->block && k->body == k->block ? es_mem_realloc(k->block, cap)
                 : k->block                      ? NULL
                                                 : es_mem_alloc(ES_MEM_SERVER, cap);
      if (!nb) {
        uncharge(s, cap - k->charged);
        k->reject = 503;
        snprintf(k->reject_msg, sizeof k->reject_msg, "no memory for the body");
        return MHD_YES;
      }
      k->charged = cap;
      k->block = nb;
      k->body = nb;
      k->cap = cap;
    }
    memcpy(k->body + k->len, upload, n);
    k->len += n;
    return MHD_YES;
  }
  if (k->reject) {
    atomic_fetch_add(&s->rejected[k->reject == 413   ? SRV_REJECT_TOO_LARGE
                                  : k->reject == 503 ? SRV_REJECT_BUFFERED
                                                     : SRV_REJECT_BAD],
                     1);
    return send_error(s, c, (unsigned)k->reject, 0, "%s",
                      k->reject_msg);
  }
  enum MHD_Result r = route(s, c, url, method, k);
  if (!s->cfg.quiet)
    log_request(method, url, es__now_ns() - k->start_ns);
  return r;
}

/* ---- lifecycle ------------------------------------------------------------------ */

int es__srv_start_http(es_server *s) {
  struct sockaddr_in addr;
  memset(&addr, 0, sizeof addr);
  addr.sin_family = AF_INET;
  addr.sin_port = htons((uint16_t)s->cfg.port);
  if (inet_pton(AF_INET, s->cfg.host, &addr.sin_addr) != 1)
    return es__fail(ES_EINVAL, "host '%s' is not an IPv4 address", s->cfg.host);
  s->daemon = MHD_start_daemon(
      MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
          MHD_USE_ITC,
      (uint16_t)s->cfg.port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR,
      (struct sockaddr *)&addr, MHD_OPTION_CONNECTION_LIMIT, s->cfg.max_connections,
      MHD_OPTION_CONNECTION_TIMEOUT, s->cfg.connection_timeout_s,
      /* Headers and the read buffer share this pool: a small one makes
       * the body arrive 8 KiB per recv; 256 KiB more reads it in a few. */
      MHD_OPTION_CONNECTION_MEMORY_LIMIT, s->cfg.max_header_bytes + (size_t)(256 << 10),
      MHD_OPTION_THREAD_STACK_SIZE, (size_t)512 * 1024, MHD_OPTION_NOTIFY_COMPLETED,
      on_completed, s, MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u, MHD_OPTION_END);
  if (!s->daemon)
    return es__fail(ES_EIO, "cannot listen on %s:%d (in use, or not allowed)", s->cfg.host,
                    s->cfg.port);
  const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
  s->port = di ? di->port : s->cfg.port;
  return 0;
}

int es_server_shutdown(es_server *s, int grace_ms, es_server_report *report) {
  if (!s)
    return es__fail(ES_EINVAL, "es_server_shutdown: NULL server");
  es_server_report rep;
  memset(&rep, 0, sizeof rep);
  if (atomic_exchange(&s->stopping, 1)) {
    if (report)
      *report = s->report;
    return 0;
  }
  uint64_t t0 = es__now_ns();
  if (s->daemon)
    MHD_quiesce_daemon(s->daemon); /* no new connections */
  es_admission_set_draining(es_runtime_admission(s->rt), -1, 1);
  /* Requests count until their response is handed to the connection
   * (on_completed), so none is cut off between its run and its answer. */
  rep.inflight_at_stop = atomic_load(&s->active);
  uint64_t until = t0 + (uint64_t)(grace_ms > 0 ? grace_ms : 0) * 1000000ull;
  while (atomic_load(&s->active) && es__now_ns() < until)
    usleep(2000);
  rep.cut_off = es__srv_cancel_tracked(s); /* queued ones leave now, answered 503 */
  /* Running ones finish (runs are not interrupted); their answers and the
   * 503s of the cancelled ones go out before the connections close. */
  uint64_t last = es__now_ns() + 30ull * 1000000000ull;
  while (atomic_load(&s->active) && es__now_ns() < last)
    usleep(2000);
  rep.finished_in_grace =
      rep.inflight_at_stop > rep.cut_off ? rep.inflight_at_stop - rep.cut_off : 0;
  if (s->daemon) {
    MHD_stop_daemon(s->daemon); /* joins the connection threads */
    s->daemon = NULL;
  }
  rep.served = atomic_load(&s->served);
  rep.drain_ms = (double)(es__now_ns() - t0) / 1e6;
  s->report = rep;
  if (report)
    *report = rep;
  return 0;
}

int es_server_port(const es_server *s, int *port) {
  if (!s || !port)
    return es__fail(ES_EINVAL, "es_server_port: NULL argument");
  *port = s->port;
  return 0;
}

es_runtime *es_server_runtime(es_server *s) { return s ? s->rt : NULL; }
