/* libFuzzer target: any bytes as a KServe v2 request body give tensors or a
 * message, never a crash, a leak or a read past the body.
 *
 * The first two bytes pick the Inference-Header-Content-Length, the rest is
 * the body: 0x8000 set means no header (the whole body is JSON), 0x7fff a
 * negative one, anything else is the header length itself (little-endian),
 * so inputs in the seed corpus can carry a valid binary split.
 *
 * Beyond "no crash" the target checks what the unit tests check, on every
 * input the fuzzer finds: a refusal says why, in a message that
 * es__v2_error_body turns into valid JSON; a parse gives 64-byte aligned
 * tensors inside the one storage block (or, binary ones already aligned, in
 * the body itself); and the parsed inputs, encoded as a
 * response and parsed again (a response's "outputs" read as a request's
 * "inputs", the key renamed in place), come back bit for bit, unless a
 * JSON output held NaN or an infinity (written as null) or BYTES that are
 * not UTF-8 (refused as JSON). The server tag's byte count must be back
 * where it was after every input.
 *
 *   build with -DES_FUZZ=ON (clang), then: fuzz_v2_request -max_total_time=60 CORPUS */
#define _GNU_SOURCE 1 /* memmem: the response's JSON part is not a C string */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "edgeserve/memory.h"
#include "server/codec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_MAX_ELEMENTS ((size_t)1 << 20)

static size_t server_bytes(void) {
  es_mem_stats s;
  es_mem_stats_get(ES_MEM_SERVER, &s);
  return s.current;
}

static void check_error_body(const char *msg) {
  size_t len;
  char *b = es__v2_error_body(msg, &len);
  if (!b)
    abort();
  json_t *j = json_loadb(b, len, 0, NULL);
  if (!j)
    abort();
  json_decref(j);
  es_mem_free(b);
}

static int has_nonfinite(const es_v2_input *in) {
  if (in->is_bytes || in->dtype != ES_DTYPE_FLOAT)
    return 0;
  for (size_t i = 0; i < in->nbytes / 4; i++) {
    float f;
    memcpy(&f, (const char *)in->data + 4 * i, 4);
    if (isnan(f) || isinf(f))
      return 1;
  }
  return 0;
}

/* Encode r's inputs as outputs; parse the response back; compare. */
static void round_trip(const es_v2_request *r) {
  es_v2_output outs[ES_V2_MAX_IO];
  int lossy = 0;
  for (int i = 0; i < r->n_inputs; i++) {
    const es_v2_input *in = &r->inputs[i];
    outs[i] = (es_v2_output){in->name, in->dtype, in->rank, in->dims, in->data, in->nbytes,
                             r->binary_output ^ (i & 1)};
    if (!outs[i].binary && (has_nonfinite(in) || in->is_bytes))
      lossy = 1; /* null for NaN; BYTES may not be UTF-8 */
  }
  char *body;
  size_t len, hl;
  int rc = es__v2_response_encode("m", "1", r->id, outs, r->n_inputs, &body, &len, &hl);
  if (rc) {
    if (rc != ES_EINVAL || !lossy)
      abort();
    return;
  }
  size_t jl = hl ? hl : len;
  json_t *j = json_loadb(body, jl, JSON_ALLOW_NUL, NULL); /* BYTES may hold \u0000 */
  if (!j)
    abort();
  json_decref(j);
  char *copy = malloc(len ? len : 1);
  memcpy(copy, body, len);
  char *k = memmem(copy, jl, "\"outputs\":[", 11);
  if (!k)
    abort();
  memcpy(k, "\"inputs\" :[", 11);
  es_v2_request back;
  char err[256];
  rc = es__v2_request_parse(copy, len, hl ? (long long)hl : -1, FZ_MAX_ELEMENTS, &back, err,
                           sizeof err);
  if (rc) {
    if (!lossy)
      abort();
  } else {
    if (back.n_inputs != r->n_inputs || strcmp(back.id, r->id) != 0)
      abort();
    for (int i = 0; i < r->n_inputs; i++) {
      const es_v2_input *a = &r->inputs[i], *b = &back.inputs[i];
      if (strcmp(a->name, b->name) != 0 || a->dtype != b->dtype || a->is_bytes != b->is_bytes ||
          a->rank != b->rank || memcmp(a->dims, b->dims, sizeof(int64_t) * (size_t)a->rank) != 0 ||
          a->nbytes != b->nbytes || (a->nbytes && memcmp(a->data, b->data, a->nbytes) != 0))
        abort();
    }
    es__v2_request_free(&back);
  }
  free(copy);
  es_mem_free(body);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2)
    return 0;
  unsigned mode = (unsigned)data[0] | (unsigned)data[1] << 8;
  long long hl = mode == 0x7fff ? -2 : (mode & 0x8000) ? -1 : (long long)mode;
  /* libFuzzer's buffer is exactly size bytes: a read past the body is one
   * past the allocation, which ASan reports. */
  const char *body = (const char *)data + 2;
  size_t len = size - 2;
  size_t before = server_bytes();
  es_v2_request r;
  char err[256];
  int rc = es__v2_request_parse(body, len, hl, FZ_MAX_ELEMENTS, &r, err, sizeof err);
  if (rc) {
    if ((rc != ES_EINVAL && rc != ES_ENOMEM) || err[0] == '\0' || r.storage || r.n_inputs)
      abort();
    check_error_body(err);
  } else {
    if (r.n_inputs < 1 || r.n_inputs > ES_V2_MAX_IO)
      abort();
    for (int i = 0; i < r.n_inputs; i++) {
      const es_v2_input *in = &r.inputs[i];
      const char *p = in->data, *s = r.storage;
      int in_storage = p >= s && p + in->nbytes <= s + r.storage_bytes;
      int in_body = p >= body && p + in->nbytes <= body + len; /* aligned binary, in place */
      if (((uintptr_t)p & 63) || !(in_storage || in_body))
        abort();
    }
    round_trip(&r);
    es__v2_request_free(&r);
  }
  if (server_bytes() != before)
    abort();
  return 0;
}
