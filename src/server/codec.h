/* Open Inference Protocol (KServe v2) request and response codec.
 *
 * Pure functions over byte buffers, no HTTP and no runtime: the HTTP layer
 * hands the body (and the Inference-Header-Content-Length value when the
 * binary tensor extension is used) to es__v2_request_parse and gets tensors
 * ready for es_runtime_submit; es__v2_response_encode turns outputs back
 * into a JSON body or a JSON header followed by binary tensors.
 *
 * Hostile input is the normal case here: every length, count, dimension and
 * offset is checked before use, and a failure says which input is wrong and
 * how, for a 400 response. Thread-safe (no shared state).
 */
#ifndef ES_SERVER_CODEC_H
#define ES_SERVER_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "edgeserve/engine.h"
#include "edgeserve/runtime.h"

#define ES_V2_MAX_IO 16
#define ES_V2_NAME_MAX 128

/* Datatype names of the protocol ("FP32", "INT64", ...). BYTES is carried as
 * ES_DTYPE_UNDEFINED with is_bytes set. */
const char *es__v2_dtype_name(es_dtype t);
/* 0 and *out set, or -1 for an unknown or unsupported name. */
int es__v2_dtype_parse(const char *name, es_dtype *out, int *is_bytes);

typedef struct es_v2_input {
  char name[ES_V2_NAME_MAX];
  es_dtype dtype;
  int is_bytes;                /* BYTES: data holds the raw elements, each
                                  preceded by a 4-byte little-endian length
                                  (the binary extension's layout); JSON
                                  strings are converted to that layout */
  int rank;
  int64_t dims[ES_MAX_RANK];
  const void *data;            /* 64-byte aligned: into the request's
                                  storage, or, for binary data already
                                  aligned in the body, into the body (which
                                  must then outlive the request) */
  size_t nbytes;
} es_v2_input;

typedef struct es_v2_output_req {
  char name[ES_V2_NAME_MAX];
  int binary;                  /* -1: not said, 0 JSON, 1 binary */
} es_v2_output_req;

typedef struct es_v2_request {
  char id[ES_V2_NAME_MAX];     /* "" when absent */
  int has_priority;
  uint64_t priority;           /* parameters.priority (Triton: 1 highest, 0
                                  the model's default) */
  int has_timeout;
  uint64_t timeout_us;         /* parameters.timeout, microseconds */
  int binary_output;           /* parameters.binary_data_output (default 0) */
  uint64_t sequence_id;        /* parameters.sequence_id as a number; 0: none */
  char sequence_key[ES_SEQ_KEY_MAX]; /* ... or as a string; "": none */
  unsigned sequence_flags;     /* 1: parameters.sequence_start, 2: _end (as
                                  ES_SEQ_START / ES_SEQ_END) */
  int n_inputs;
  es_v2_input inputs[ES_V2_MAX_IO];
  int n_outputs;               /* 0: all outputs */
  es_v2_output_req outputs[ES_V2_MAX_IO];
  void *storage;               /* owned: tensor data, freed by es__v2_request_free */
  size_t storage_bytes;
} es_v2_request;

/* Parse a request body. header_len: the Inference-Header-Content-Length
 * value, or -1 when the header is absent (then the whole body is JSON).
 * With it, body[0, header_len) is the JSON header and the rest holds the
 * binary tensors of the inputs whose parameters.binary_data_size is set, in
 * input order, and their sizes must add up to exactly the rest.
 * max_elements bounds the elements of one tensor (huge dimensions are
 * refused before anything is allocated).
 * Returns 0, or ES_EINVAL with a message in err naming what is wrong
 * ("input 'x': shape [1,3,640,640] needs 4915200 bytes of FP32, got 100"),
 * ES_ENOMEM. On failure out holds nothing to free. */
int es__v2_request_parse(const char *body, size_t len, long long header_len, size_t max_elements,
                        es_v2_request *out, char *err, size_t errlen);
void es__v2_request_free(es_v2_request *r);

typedef struct es_v2_output {
  const char *name;
  es_dtype dtype;
  int rank;
  const int64_t *dims;
  const void *data;
  size_t nbytes;
  int binary;                  /* 1: in the binary part (parameters
                                  binary_data_size), 0: JSON "data" */
} es_v2_output;

/* Encode a response: {"model_name", "model_version" (omitted if NULL),
 * "id" (omitted if NULL or ""), "outputs": [...]}. When any output is
 * binary, *body is the JSON followed by the binary tensors and
 * *header_len the JSON's length (for Inference-Header-Content-Length);
 * otherwise *header_len is 0. *body is allocated with es_mem_alloc
 * (ES_MEM_SERVER); free it with es_mem_free. ES_ENOMEM, ES_EINVAL. */
int es__v2_response_encode(const char *model, const char *version, const char *id,
                          const es_v2_output *outs, int n, char **body, size_t *len,
                          size_t *header_len);

/* {"error": "<msg>"} with the message JSON-escaped; es_mem_free it. */
char *es__v2_error_body(const char *msg, size_t *len);

#endif
