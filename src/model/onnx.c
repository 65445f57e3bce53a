/* ONNX loader: protobuf bytes -> validated graph IR.
 *
 * protobuf-c (code generated at build time from the onnx.proto that Debian's
 * libonnx-dev installs) does the wire parsing and rejects truncated or
 * malformed encodings. It recurses once per nested message, so a walk of
 * our own refuses deep nesting first (ES_EINVAL above 64 levels). Everything
 * the schema cannot express is checked here, before any of it is trusted:
 * ranks, dimension products that overflow, data lengths that disagree with
 * shapes, names that refer to nothing or are defined twice, opsets, cycles.
 * Every error names the node (or tensor) and the operator.
 *
 * What the engine cannot run is not an error of the file, so it does not
 * stop the reading: an operator it does not know (or of another domain, or
 * newer than the model's opset), an attribute it cannot take, a value whose
 * element type or kind of type it cannot hold. Such a node is kept, marked
 * (es_node.unsup, op ES_OP_UNKNOWN: its outputs still define the names the
 * rest reads), such a value becomes ES_VALUE_UNSUPPORTED, and subgraphs
 * (Loop, Scan bodies, which the engine does not run) are walked for their
 * operators and types. The main graph's If nodes are inlined first, both
 * branches guarded (flatten_ifs). Once the graph is sorted and pruned, only what
 * the live part needs is listed (es__graph_issues): all of it in one error,
 * or, for the engine, after its folding. Opsets are whole-model: one
 * outside 7..21 is refused at once.
 *
 * Constant data (initializers, Constant nodes, tensor attributes) is checked
 * while the graph is read, then copied into staging blocks of its own once
 * the whole graph is valid (raw_data blobs sit at arbitrary file offsets, and
 * int32_data needs narrowing for 8-bit types), so the protobuf tree can be
 * freed before the graph is sorted and optimised. es__graph_fold then works on
 * the staged constants and es__graph_seal copies the ones still read into the
 * model's sealed es_weights region. The IR keeps nothing that points into
 * the protobuf tree. */
#include "model/graph.h"
#include "common/internal.h"
#include "onnx.pb-c.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#define ES_ONNX_MAX_ELEMS ((uint64_t)1 << 40)
#define ES_ONNX_MAX_NODES (1 << 22)
/* Messages below the ModelProto, at most. A graph's deepest path is
 * ModelProto > GraphProto > ValueInfoProto > TypeProto > Tensor >
 * TensorShapeProto > Dimension (6 levels); each subgraph of an If, Loop or
 * Scan adds three (NodeProto > AttributeProto > GraphProto) and each
 * sequence, map or optional type two. 64 leaves room for 19 levels of
 * nested subgraphs, far beyond what exporters write (and the engine refuses
 * subgraphs anyway); C++ protobuf's own default limit is 100. */
#define ES_ONNX_MAX_DEPTH 64

/* ==========================================================================
 * protobuf-c allocations: one context allocator per parse
 * ======================================================================== */

/* Every string, array and message protobuf-c unpacks is bumped from one
 * context allocator (counted under ES_MEM_MODEL) and the whole tree goes in
 * one es__ctx_free_all: a model of 200,000 nodes is over a million small
 * blocks, and one malloc (plus a counting header) and one free each cost
 * more than the rest of the load. The few temporaries protobuf-c frees
 * while unpacking (its scan slabs) are reclaimed with the rest. oom is set
 * when an allocation failed, since unpack returns NULL for that and for a
 * corrupt encoding alike. */
typedef struct pb_arena {
  es_ctx ctx;
  int oom;
} pb_arena;

static void *pb_alloc(void *user, size_t size) {
  pb_arena *a = user;
  void *p = es__ctx_alloc_raw(&a->ctx, size); /* protobuf-c initialises what it uses */
  if (!p)
    a->oom = 1;
  return p;
}

static void pb_free(void *user, void *p) {
  (void)user;
  (void)p;
}

/* ==========================================================================
 * Nesting depth, checked before protobuf-c unpacks
 * ======================================================================== */

/* protobuf-c unpacks a sub-message by recursing, one C stack frame (and a
 * few hundred bytes) per level, with no limit: a file a few megabytes long
 * can nest a hundred thousand messages and overflow the stack. So the bytes
 * are walked first, without recursion: a stack of the enclosing messages'
 * ends, bounded by the limit. protobuf-c's own descriptors say which
 * length-delimited fields are sub-messages; strings, bytes (raw tensor
 * data) and packed numbers are skipped unread, and unknown fields are skipped
 * as protobuf-c keeps them (as bytes, never parsed). Each byte is read once.
 *
 * The walk refuses what protobuf-c's scan would refuse (a zero field number,
 * a tag longer than 5 bytes, a varint longer than 10, a length prefix longer
 * than 5 bytes or above INT_MAX or past its message's end, wire types 3, 4,
 * 6 and 7), so it never stops early on bytes protobuf-c would go on to
 * unpack deeper. */

typedef struct pb_walk {
  const uint8_t *p, *end;
  const char *why; /* set on a wire-format error */
} pb_walk;

/* One varint of at most max bytes (the value truncated to 64 bits). */
static int pb_varint(pb_walk *w, unsigned max, uint64_t *out) {
  uint64_t v = 0;
  for (unsigned i = 0; i < max && w->p + i < w->end; i++) {
    uint8_t b = w->p[i];
    if (i < 10)
      v |= (uint64_t)(b & 0x7f) << (7 * i);
    if (!(b & 0x80)) {
      w->p += i + 1;
      *out = v;
      return 1;
    }
  }
  return 0;
}

/* A tag as protobuf-c reads it: the field number from the same bits, 32-bit
 * arithmetic included. */
static int pb_tag(pb_walk *w, uint32_t *field, unsigned *wire) {
  const uint8_t *p = w->p;
  size_t left = (size_t)(w->end - p);
  if ((p[0] & 0xf8) == 0)
    return 0;
  uint32_t f = (uint32_t)(p[0] & 0x7f) >> 3;
  *wire = p[0] & 7;
  unsigned shift = 4, max = left < 5 ? (unsigned)left : 5;
  for (unsigned i = 0; i < max; i++) {
    if (i > 0) {
      f |= (uint32_t)(p[i] & 0x7f) << shift;
      shift += 7;
    }
    if (!(p[i] & 0x80)) {
      w->p += i + 1;
      *field = f;
      return 1;
    }
  }
  return 0;
}

/* 0 when data nests at most limit messages below the top one; ES_EINVAL
 * naming the limit otherwise; ES_EMODEL when the wire format is broken
 * before the depth is known. what names the top message ("ONNX model"). */
static int pb_depth_check(const ProtobufCMessageDescriptor *top, const void *data, size_t size,
                          int limit, const char *what) {
  struct {
    const ProtobufCMessageDescriptor *desc;
    const uint8_t *end;
  } stack[ES_ONNX_MAX_DEPTH + 1];
  if (limit > ES_ONNX_MAX_DEPTH)
    limit = ES_ONNX_MAX_DEPTH;
  pb_walk w = {data, (const uint8_t *)data + size, NULL};
  int depth = 0;
  stack[0].desc = top;
  stack[0].end = w.end;
  for (;;) {
    if (w.p == stack[depth].end) { /* this message is done (p never passes its end) */
      if (depth == 0)
        break;
      depth--;
      continue;
    }
    uint32_t field;
    unsigned wire;
    uint64_t len;
    pb_walk sub = {w.p, stack[depth].end, NULL};
    if (!pb_tag(&sub, &field, &wire)) {
      w.why = "a field tag is malformed";
      break;
    }
    switch (wire) {
    case PROTOBUF_C_WIRE_TYPE_VARINT:
      if (!pb_varint(&sub, 10, &len))
        w.why = "a varint is unterminated";
      break;
    case PROTOBUF_C_WIRE_TYPE_64BIT:
    case PROTOBUF_C_WIRE_TYPE_32BIT: {
      size_t n = wire == PROTOBUF_C_WIRE_TYPE_64BIT ? 8 : 4;
      if ((size_t)(sub.end - sub.p) < n)
        w.why = "a fixed-size field is truncated";
      else
        sub.p += n;
      break;
    }
    case PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED: {
      if (!pb_varint(&sub, 5, &len) || len > INT32_MAX || len > (uint64_t)(sub.end - sub.p)) {
        w.why = "a length prefix is malformed or runs past its message";
        break;
      }
      const ProtobufCFieldDescriptor *fd =
          protobuf_c_message_descriptor_get_field(stack[depth].desc, field);
      if (fd && fd->type == PROTOBUF_C_TYPE_MESSAGE && fd->descriptor) {
        if (depth == limit)
          return es__fail(ES_EINVAL,
                          "the %s has messages nested deeper than %d levels (field '%s' of a "
                          "%s at byte %zu)",
                          what, limit, fd->name, stack[depth].desc->short_name,
                          (size_t)(w.p - (const uint8_t *)data));
        depth++;
        stack[depth].desc = fd->descriptor;
        stack[depth].end = sub.p + len; /* the sub-message's fields come next */
      } else {
        sub.p += len;
      }
      break;
    }
    default:
      w.why = "a field has an unsupported wire type (groups are not protobuf-c's)";
      break;
    }
    if (w.why)
      break;
    w.p = sub.p;
  }
  if (w.why)
    return es__fail(ES_EMODEL,
                    "not a valid %s: the protobuf encoding is truncated or corrupted (%s at "
                    "byte %zu of %zu)",
                    what, w.why, (size_t)(w.p - (const uint8_t *)data), size);
  return 0;
}

/* ==========================================================================
 * Weights left out of the parse
 * ======================================================================== */

/* protobuf-c copies every bytes field it unpacks, so a model's weights
 * (TensorProto.raw_data, nearly all of the file) would be copied once into
 * the tree, then again into staging, then into the sealed region: three
 * passes over hundreds of megabytes and a page fault per fresh page each
 * time. Instead the bytes are unpacked from a copy of the file without the
 * large raw_data payloads (a few KB to a few MB of structure), each payload
 * replaced by a 16-byte marker: a per-parse nonce and the payload's index in
 * a table of (offset, length) into the original bytes, where the loader
 * reads it. Dropping bytes shortens every enclosing message, so a first
 * walk (the same non-recursive walk as the depth check, over a model that
 * has passed it) adds up what each message loses and records the new
 * length of every message that changes; a second walk writes the copy.
 * A forged marker can only name another payload of the same file (its
 * length is then checked against the shape like any raw_data). */
#define ES_RAW_STRIP_MIN 1024 /* payloads shorter than this stay in place */
#define ES_RAW_MARK 16

typedef struct raw_ref {
  size_t off, len; /* payload in the original bytes */
} raw_ref;

typedef struct raw_table {
  const uint8_t *base; /* the original bytes */
  raw_ref *refs;
  size_t n, cap;
  uint64_t nonce;
} raw_table;

typedef struct msg_len {
  size_t start;   /* offset of the message's payload in the original */
  size_t new_len; /* its length once stripped */
} msg_len;

static size_t varint_size(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    n++;
  }
  return n;
}

static uint8_t *varint_put(uint8_t *p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  *p++ = (uint8_t)v;
  return p;
}

static int push_item(void **arr, size_t *n, size_t *cap, size_t esz, const void *item) {
  if (*n == *cap) {
    size_t c = *cap ? *cap * 2 : 64;
    void *a = *arr ? es_mem_realloc(*arr, c * esz) : es_mem_alloc(ES_MEM_MODEL, c * esz);
    if (!a)
      return es__fail(ES_ENOMEM, "out of memory loading the model");
    *arr = a;
    *cap = c;
  }
  memcpy((char *)*arr + *n * esz, item, esz);
  (*n)++;
  return 0;
}

static int msg_len_cmp(const void *a, const void *b) {
  size_t x = ((const msg_len *)a)->start, y = ((const msg_len *)b)->start;
  return x < y ? -1 : x > y;
}

/* One field at w->p of a message of type desc (wire format already
 * validated by pb_depth_check): its tag's end in *after_tag, the payload
 * and its length for length-prefixed fields, the field's end in *next. */
typedef struct pb_field {
  uint32_t num;
  unsigned wire;
  const uint8_t *after_tag, *payload, *next;
  size_t len;
} pb_field;

static void pb_field_read(const uint8_t *p, const uint8_t *end, pb_field *f) {
  pb_walk sub = {p, end, NULL};
  uint64_t v = 0;
  pb_tag(&sub, &f->num, &f->wire);
  f->after_tag = sub.p;
  f->payload = NULL;
  f->len = 0;
  switch (f->wire) {
  case PROTOBUF_C_WIRE_TYPE_VARINT:
    pb_varint(&sub, 10, &v);
    break;
  case PROTOBUF_C_WIRE_TYPE_64BIT:
    sub.p += 8;
    break;
  case PROTOBUF_C_WIRE_TYPE_32BIT:
    sub.p += 4;
    break;
  default: /* length-prefixed */
    pb_varint(&sub, 5, &v);
    f->payload = sub.p;
    f->len = (size_t)v;
    sub.p += v;
    break;
  }
  f->next = sub.p;
}

/* A copy of the model in *out (es_mem, *out_size bytes) without its large
 * raw_data payloads, listed in rt; *out NULL when there is none to leave
 * out (the original is then unpacked as is). */
static int pb_strip_raw(const void *data, size_t size, raw_table *rt, uint8_t **out,
                        size_t *out_size) {
  struct {
    const ProtobufCMessageDescriptor *desc;
    const uint8_t *end;
    size_t start, len, removed;
  } stack[ES_ONNX_MAX_DEPTH + 1];
  const uint8_t *base = data;
  const ProtobufCFieldDescriptor *rawf =
      protobuf_c_message_descriptor_get_field_by_name(&onnx__tensor_proto__descriptor, "raw_data");
  uint32_t raw_id = rawf ? rawf->id : 9;
  msg_len *changed = NULL;
  size_t n_changed = 0, cap_changed = 0;
  int rc = 0;
  *out = NULL;
  *out_size = 0;
  rt->base = base;

  /* Pass 1: what each message loses. */
  int depth = 0;
  stack[0].desc = &onnx__model_proto__descriptor;
  stack[0].end = base + size;
  stack[0].start = 0;
  stack[0].len = size;
  stack[0].removed = 0;
  const uint8_t *p = base;
  for (;;) {
    if (p == stack[depth].end) {
      if (depth == 0)
        break;
      size_t r = stack[depth].removed;
      if (r) {
        size_t nl = stack[depth].len - r;
        msg_len m = {stack[depth].start, nl};
        if ((rc = push_item((void **)&changed, &n_changed, &cap_changed, sizeof m, &m)) < 0)
          goto fail;
        stack[depth - 1].removed += r + varint_size(stack[depth].len) - varint_size(nl);
      }
      depth--;
      continue;
    }
    pb_field f;
    pb_field_read(p, stack[depth].end, &f);
    if (f.wire == PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED) {
      if (stack[depth].desc == &onnx__tensor_proto__descriptor && f.num == raw_id &&
          f.len >= ES_RAW_STRIP_MIN) {
        raw_ref ref = {(size_t)(f.payload - base), f.len};
        if ((rc = push_item((void **)&rt->refs, &rt->n, &rt->cap, sizeof ref, &ref)) < 0)
          goto fail;
        stack[depth].removed += varint_size(f.len) + f.len - (1 + ES_RAW_MARK);
        p = f.next;
        continue;
      }
      const ProtobufCFieldDescriptor *fd =
          protobuf_c_message_descriptor_get_field(stack[depth].desc, f.num);
      if (fd && fd->type == PROTOBUF_C_TYPE_MESSAGE && fd->descriptor) {
        depth++; /* pb_depth_check bounded it */
        stack[depth].desc = fd->descriptor;
        stack[depth].end = f.next;
        stack[depth].start = (size_t)(f.payload - base);
        stack[depth].len = f.len;
        stack[depth].removed = 0;
        p = f.payload;
        continue;
      }
    }
    p = f.next;
  }
  if (rt->n == 0)
    goto done;
  qsort(changed, n_changed, sizeof *changed, msg_len_cmp);
  if (getrandom(&rt->nonce, sizeof rt->nonce, GRND_NONBLOCK) != (ssize_t)sizeof rt->nonce)
    rt->nonce = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)rt;

  /* Pass 2: the copy. Unchanged fields, sub-messages included, go over
   * whole; a changed message gets its new length and is walked into. */
  size_t total = size - stack[0].removed;
  uint8_t *o = es_mem_alloc(ES_MEM_MODEL, total ? total : 1), *q = o;
  if (!o) {
    rc = es__fail(ES_ENOMEM, "out of memory loading the model");
    goto fail;
  }
  size_t ci = 0, ri = 0;
  depth = 0;
  p = base;
  for (;;) {
    if (p == stack[depth].end) {
      if (depth == 0)
        break;
      depth--;
      continue;
    }
    pb_field f;
    pb_field_read(p, stack[depth].end, &f);
    if (f.wire == PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED) {
      size_t at = (size_t)(f.payload - base);
      if (ri < rt->n && rt->refs[ri].off == at) {
        memcpy(q, p, (size_t)(f.after_tag - p));
        q += f.after_tag - p;
        *q++ = ES_RAW_MARK;
        uint64_t idx = ri++;
        memcpy(q, &rt->nonce, 8);
        memcpy(q + 8, &idx, 8);
        q += ES_RAW_MARK;
        p = f.next;
        continue;
      }
      if (ci < n_changed && changed[ci].start == at) {
        const ProtobufCFieldDescriptor *fd =
            protobuf_c_message_descriptor_get_field(stack[depth].desc, f.num);
        memcpy(q, p, (size_t)(f.after_tag - p));
        q += f.after_tag - p;
        q = varint_put(q, changed[ci].new_len);
        ci++;
        depth++;
        stack[depth].desc = fd->descriptor;
        stack[depth].end = f.next;
        p = f.payload;
        continue;
      }
    }
    memcpy(q, p, (size_t)(f.next - p));
    q += f.next - p;
    p = f.next;
  }
  if ((size_t)(q - o) != total || ri != rt->n || ci != n_changed) {
    es_mem_free(o);
    rc = es__fail(ES_ESTATE, "stripping the model's weights went wrong (%zu of %zu bytes)",
                  (size_t)(q - o), total);
    goto fail;
  }
  *out = o;
  *out_size = total;
done:
  es_mem_free(changed);
  return 0;
fail:
  es_mem_free(changed);
  es_mem_free(rt->refs);
  rt->refs = NULL;
  rt->n = rt->cap = 0;
  return rc;
}

/* A TensorProto's raw bytes: from the original when the parse left them
 * out (a marker of this parse naming a listed payload), else its own. */
static void raw_of(const raw_table *rt, const Onnx__TensorProto *t, const uint8_t **p,
                   size_t *n) {
  *p = t->raw_data.data;
  *n = t->raw_data.len;
  if (rt && rt->n && t->raw_data.len == ES_RAW_MARK &&
      !memcmp(t->raw_data.data, &rt->nonce, 8)) {
    uint64_t idx;
    memcpy(&idx, t->raw_data.data + 8, 8);
    if (idx < rt->n) {
      *p = rt->base + rt->refs[idx].off;
      *n = rt->refs[idx].len;
    }
  }
}

/* ==========================================================================
 * Element types and shapes
 * ======================================================================== */

static const char *onnx_type_name(int32_t t) {
  static const char *const names[] = {"undefined", "float", "uint8",  "int8",      "uint16",
                                      "int16",     "int32", "int64",  "string",    "bool",
                                      "float16",   "double", "uint32", "uint64",   "complex64",
                                      "complex128", "bfloat16"};
  return t >= 0 && t < (int32_t)(sizeof names / sizeof names[0]) ? names[t] : "unknown";
}

/* The key an unsupported element type is listed under. */
static void type_key(int32_t t, char *key, size_t size) {
  const char *n = onnx_type_name(t);
  if (strcmp(n, "unknown"))
    snprintf(key, size, "element type %s", n);
  else
    snprintf(key, size, "element type %d", (int)t);
}

/* ==========================================================================
 * Loader state
 * ======================================================================== */

/* A constant whose bytes are still in the protobuf tree. */
typedef struct pending_const {
  const Onnx__TensorProto *t; /* source, NULL for a scalar/list attribute */
  int value;                  /* value index */
  /* Constant-node value_float(s) / value_int(s): data from the attribute */
  const void *attr_data;
} pending_const;

/* If nodes of the main graph, inlined (flatten_ifs): per node of the
 * flattened list, its place in the file and its guards. */
typedef struct flat_node {
  int file_index; /* the main graph's own nodes keep theirs; branch nodes
                     and merges follow the file's last */
  int if_id;      /* a merge: the If it ends (1...), else 0 */
  int n_guard;
  const int *guard; /* +id: runs when If id's condition holds; -id: when not */
} flat_node;

typedef struct loader {
  es_graph *g;
  const raw_table *raw; /* payloads the parse left out */
  const Onnx__GraphProto *gp;
  const flat_node *flat; /* per node of gp, when Ifs were inlined; else NULL */
  es_ctx *tmp;           /* lives as long as the protobuf tree */
  /* name -> value index, open addressing */
  int *slots;
  size_t nslots;
  int cap_values;
  pending_const *consts;
  int n_consts, cap_consts;
  int id_base;  /* added to this graph's node positions: a Loop or Scan body's
                   nodes follow every node before them, so a node id is
                   unique in the model (prepared weights are keyed by it) */
  int *next_id; /* the next free id, shared by the main graph and its bodies */
  int depth;    /* bodies nested so far */
  const unsigned char *b_only; /* per value while staging: 1 when only MatMuls read it as B */
} loader;

static uint64_t name_hash(const char *s) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (; *s; s++)
    h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static int name_find(const loader *L, const char *name) {
  size_t mask = L->nslots - 1;
  for (size_t i = name_hash(name) & mask;; i = (i + 1) & mask) {
    int v = L->slots[i];
    if (v < 0)
      return -1;
    if (!strcmp(L->g->values[v].name, name))
      return v;
  }
}

/* Adds a value; ES_EMODEL if the name is already defined. */
static int value_add(loader *L, const char *name, es_value_kind kind, const char *what,
                     int *out) {
  es_graph *g = L->g;
  if (!name || !name[0])
    return es__fail(ES_EMODEL, "%s has an empty name", what);
  if (name_find(L, name) >= 0)
    return es__fail(ES_EMODEL, "%s: name '%s' is defined twice", what, name);
  if (g->n_values >= L->cap_values)
    return es__fail(ES_EMODEL, "%s: more values than the graph declares", what);
  int v = g->n_values++;
  es_value *val = &g->values[v];
  val->name = es__ctx_strdup(&g->ctx, name);
  if (!val->name)
    return es__fail(ES_ENOMEM, "out of memory loading the model");
  val->kind = kind;
  val->rank = -1;
  val->producer = -1;
  size_t mask = L->nslots - 1;
  size_t i = name_hash(name) & mask;
  while (L->slots[i] >= 0)
    i = (i + 1) & mask;
  L->slots[i] = v;
  *out = v;
  return 0;
}

/* ==========================================================================
 * Constant tensors
 * ======================================================================== */

/* Validates a TensorProto and fills dtype, shape and byte size into v. On
 * ES_ENOTSUP, key (size KEY_MAX) says what, without the tensor's name, for
 * the list of what a model needs. */
#define KEY_MAX 160
static int tensor_check(const raw_table *rt, const Onnx__TensorProto *t, es_value *v,
                        const char *what, char *key) {
  es_dtype dt = (es_dtype)t->data_type;
  size_t esz = es_dtype_size(dt);
  if (!t->has_data_type || esz == 0) {
    type_key(t->data_type, key, KEY_MAX);
    return es__fail(ES_ENOTSUP, "%s: element type %s (%d) is not supported", what,
                    onnx_type_name(t->data_type), (int)t->data_type);
  }
  if (t->n_dims > ES_MAX_RANK) {
    snprintf(key, KEY_MAX, "rank above %d", ES_MAX_RANK);
    return es__fail(ES_ENOTSUP, "%s: rank %zu exceeds the maximum %d", what, t->n_dims,
                    ES_MAX_RANK);
  }
  if (t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL || t->n_external_data) {
    snprintf(key, KEY_MAX, "external tensor data");
    return es__fail(ES_ENOTSUP, "%s: external tensor data is not supported", what);
  }
  if (t->segment) {
    snprintf(key, KEY_MAX, "segmented tensor");
    return es__fail(ES_ENOTSUP, "%s: segmented tensors are not supported", what);
  }
  uint64_t n = 1;
  for (size_t i = 0; i < t->n_dims; i++) {
    if (t->dims[i] < 0)
      return es__fail(ES_EMODEL, "%s: dimension %zu is negative (%lld)", what, i,
                      (long long)t->dims[i]);
    if (__builtin_mul_overflow(n, (uint64_t)t->dims[i], &n) || n > ES_ONNX_MAX_ELEMS)
      return es__fail(ES_EMODEL, "%s: the product of its dimensions overflows", what);
    v->dims[i] = t->dims[i];
  }
  v->rank = (int)t->n_dims;
  v->dtype = dt;
  v->nbytes = (size_t)n * esz;
  size_t have;
  if (t->has_raw_data) {
    const uint8_t *raw;
    size_t raw_len;
    raw_of(rt, t, &raw, &raw_len);
    if (raw_len != v->nbytes)
      return es__fail(ES_EMODEL, "%s: raw_data holds %zu bytes, its shape needs %zu", what,
                      raw_len, v->nbytes);
    return 0;
  }
  switch (dt) {
  case ES_DTYPE_FLOAT:
    have = t->n_float_data;
    break;
  case ES_DTYPE_INT64:
    have = t->n_int64_data;
    break;
  default: /* int32, int8, uint8, bool are all carried in int32_data */
    have = t->n_int32_data;
    break;
  }
  if (have != n)
    return es__fail(ES_EMODEL, "%s: holds %zu %s elements, its shape needs %llu", what, have,
                    es_dtype_name(dt), (unsigned long long)n);
  return 0;
}

static void tensor_copy(const raw_table *rt, const Onnx__TensorProto *t, const es_value *v,
                        void *dst) {
  if (v->nbytes == 0)
    return;
  if (t->has_raw_data) {
    const uint8_t *raw;
    size_t raw_len;
    raw_of(rt, t, &raw, &raw_len);
    memcpy(dst, raw, v->nbytes); /* little-endian host, as ONNX; tensor_check matched it */
    return;
  }
  size_t n = v->nbytes / es_dtype_size(v->dtype);
  switch (v->dtype) {
  case ES_DTYPE_FLOAT:
    memcpy(dst, t->float_data, v->nbytes);
    break;
  case ES_DTYPE_INT64:
    memcpy(dst, t->int64_data, v->nbytes);
    break;
  case ES_DTYPE_INT32:
    memcpy(dst, t->int32_data, v->nbytes);
    break;
  default:
    for (size_t i = 0; i < n; i++)
      ((uint8_t *)dst)[i] = (uint8_t)t->int32_data[i];
    break;
  }
}

static int const_push(loader *L, const Onnx__TensorProto *t, const void *attr_data, int value) {
  if (L->n_consts == L->cap_consts) {
    int cap = L->cap_consts ? L->cap_consts * 2 : 64;
    pending_const *n = es_mem_realloc(L->consts, (size_t)cap * sizeof *n);
    if (!L->consts)
      n = es_mem_alloc(ES_MEM_MODEL, (size_t)cap * sizeof *n);
    if (!n)
      return es__fail(ES_ENOMEM, "out of memory loading the model");
    L->consts = n;
    L->cap_consts = cap;
  }
  L->consts[L->n_consts++] = (pending_const){t, value, attr_data};
  return 0;
}

/* Makes v a value the engine cannot hold, listed under key. */
static int value_unsupported(loader *L, int v, const char *key) {
  es_value *val = &L->g->values[v];
  val->kind = ES_VALUE_UNSUPPORTED;
  val->data = NULL;
  val->nbytes = 0;
  val->unsup = es__ctx_strdup(&L->g->ctx, key);
  return val->unsup ? 0 : es__fail(ES_ENOMEM, "out of memory loading the model");
}

/* A named constant from a TensorProto (initializer or tensor attribute).
 * One the engine cannot hold (its element type...) becomes an
 * ES_VALUE_UNSUPPORTED value, and the reading goes on. */
static int const_from_tensor(loader *L, const Onnx__TensorProto *t, const char *name,
                             const char *what, int *out) {
  int v;
  int rc = value_add(L, name, ES_VALUE_CONST, what, &v);
  if (rc < 0)
    return rc;
  *out = v;
  char key[KEY_MAX];
  rc = tensor_check(L->raw, t, &L->g->values[v], what, key);
  if (rc == ES_ENOTSUP)
    return value_unsupported(L, v, key);
  if (rc < 0)
    return rc;
  return const_push(L, t, NULL, v);
}

/* Copies every constant out of the protobuf tree into its own staging block
 * (graph.h). One block each, not one slab: the passes drop and replace
 * constants one at a time, and es__graph_seal copies the survivors anyway. A
 * constant left unstaged by a failure has data NULL, which es__graph_fini
 * skips. */
/* The file's own bytes of a constant that can be read where it is: raw
 * data of 1 KiB or more, inside the file, aligned to its element size (the
 * kernels read it through typed pointers); NULL when it must be staged. */
static int const_stage_all(loader *L);

static const void *const_in_file(const loader *L, const pending_const *c, const es_value *v) {
  if (!L->g->file || !c->t || !c->t->has_raw_data || v->nbytes < ES_RAW_STRIP_MIN)
    return NULL;
  const uint8_t *raw;
  size_t raw_len;
  raw_of(L->raw, c->t, &raw, &raw_len);
  size_t es = es_dtype_size(v->dtype);
  int aligned = es && (uintptr_t)raw % es == 0;
  if (raw_len < v->nbytes || !es || (!aligned && !(L->b_only && L->b_only[c->value])) ||
      !es__graph_in_file(L->g, raw) || !es__graph_in_file(L->g, raw + v->nbytes - 1))
    return NULL;
  return raw;
}

/* Per value, 1 when it is a 2-D float32 constant that only MatMuls and
 * Gemms read, as their B, beside an A that is not a constant: the weights
 * of a linear layer. Such a constant may be read in place even where
 * exporters left it misaligned (ONNX does not align raw_data), because no
 * run reads it through a float pointer: the kernels reorder it once into
 * their prepared copy, read it with unaligned loads (Gemm's dot products),
 * or read an aligned copy of it in scratch (matmul.c, linalg.c). Without
 * this, vit_b_16 copied 75% of its 346 MB of weights at load only to
 * reorder them once more when planned, and alexnet 151 MB of its 244 only
 * to read them as they were. NULL when out of memory (every misaligned
 * constant is then staged, as before). */
static unsigned char *matmul_b_only(const es_graph *g) {
  unsigned char *f = es_mem_calloc(ES_MEM_MODEL, (size_t)g->n_values + 1, 1);
  if (!f)
    return NULL;
  for (int n = 0; n < g->n_nodes; n++) {
    const es_node *nd = &g->nodes[n];
    for (int i = 0; i < nd->n_in; i++) {
      int v = nd->in[i];
      if (v < 0)
        continue;
      int as_b = (nd->op == ES_OP_MatMul || nd->op == ES_OP_Gemm) && i == 1 &&
                 (nd->op == ES_OP_Gemm || nd->n_in == 2) && nd->in[0] >= 0 &&
                 g->values[nd->in[0]].kind != ES_VALUE_CONST;
      f[v] = !as_b ? 2 : f[v] ? f[v] : 1;
    }
  }
  for (int v = 0; v < g->n_values; v++) {
    const es_value *val = &g->values[v];
    if (f[v] != 1 || val->kind != ES_VALUE_CONST || val->is_output || val->rank != 2 ||
        val->dtype != ES_DTYPE_FLOAT)
      f[v] = 0;
  }
  return f;
}

static int const_stage(loader *L) {
  es_graph *g = L->g;
  unsigned char *b_only = g->file ? matmul_b_only(g) : NULL;
  L->b_only = b_only;
  int rc = const_stage_all(L);
  L->b_only = NULL;
  es_mem_free(b_only);
  return rc;
}

static int const_stage_all(loader *L) {
  es_graph *g = L->g;
  /* Constants of 1 KiB and more (the weights) go into one slab: one
   * mapping, huge pages where the kernel has them, instead of a block each
   * (a fresh block faults every 4 KiB page it is copied into). The slab
   * keeps room for the small constants and for what the passes add, so
   * that sealing can keep it as the weights' region instead of copying
   * them all again (es__graph_seal): in the torchvision zoo the passes
   * kept every byte of the slab and added 1 to 25 KB, 64 KiB is ample. */
  size_t slab = 0, small = 0, at = 0;
  for (int i = 0; i < L->n_consts; i++) {
    size_t n = g->values[L->consts[i].value].nbytes;
    if (const_in_file(L, &L->consts[i], &g->values[L->consts[i].value]))
      continue;
    if (n >= ES_RAW_STRIP_MIN && slab <= SIZE_MAX - 64 - n)
      slab = es__align_up(slab, 64) + n;
    else if (n < ES_RAW_STRIP_MIN)
      small += es__align_up(n ? n : 1, 64);
  }
  unsigned char *base = slab >= ((size_t)1 << 20)
                            ? es__graph_stage_slab(g, slab, small + ((size_t)64 << 10))
                            : NULL;
  for (int i = 0; i < L->n_consts; i++) {
    const pending_const *c = &L->consts[i];
    es_value *v = &g->values[c->value];
    void *dst;
    const void *in_file = const_in_file(L, c, v);
    if (in_file) {
      v->data = in_file;
      continue;
    }
    if (base && v->nbytes >= ES_RAW_STRIP_MIN) {
      at = es__align_up(at, 64);
      dst = base + at;
      at += v->nbytes;
    } else {
      dst = es_mem_alloc(ES_MEM_MODEL, v->nbytes ? v->nbytes : 1);
    }
    if (!dst)
      return es__fail(ES_ENOMEM, "out of memory staging constant '%s' (%zu bytes)", v->name,
                      v->nbytes);
    if (c->t)
      tensor_copy(L->raw, c->t, v, dst);
    else if (v->nbytes)
      memcpy(dst, c->attr_data, v->nbytes);
    v->data = dst;
  }
  return 0;
}

/* ==========================================================================
 * Graph inputs and outputs
 * ======================================================================== */

/* Applies a declared type to v. On ES_ENOTSUP key (KEY_MAX) says what. */
static int value_info_apply(const Onnx__ValueInfoProto *vi, es_value *v, const char *what,
                            char *key) {
  const Onnx__TypeProto *tp = vi->type;
  if (!tp)
    return 0; /* allowed: type only known once planned */
  if (tp->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || !tp->tensor_type) {
    snprintf(key, KEY_MAX, "%s type",
             tp->value_case == ONNX__TYPE_PROTO__VALUE_SEQUENCE_TYPE        ? "sequence"
             : tp->value_case == ONNX__TYPE_PROTO__VALUE_OPTIONAL_TYPE      ? "optional"
             : tp->value_case == ONNX__TYPE_PROTO__VALUE_MAP_TYPE           ? "map"
             : tp->value_case == ONNX__TYPE_PROTO__VALUE_SPARSE_TENSOR_TYPE ? "sparse tensor"
                                                                            : "non-tensor");
    return es__fail(ES_ENOTSUP, "%s '%s': only tensor types are supported", what, vi->name);
  }
  const Onnx__TypeProto__Tensor *tt = tp->tensor_type;
  if (tt->has_elem_type) {
    if (es_dtype_size((es_dtype)tt->elem_type) == 0) {
      type_key(tt->elem_type, key, KEY_MAX);
      return es__fail(ES_ENOTSUP, "%s '%s': element type %s is not supported", what, vi->name,
                      onnx_type_name(tt->elem_type));
    }
    v->dtype = (es_dtype)tt->elem_type;
  }
  if (tt->shape) {
    if (tt->shape->n_dim > ES_MAX_RANK) {
      snprintf(key, KEY_MAX, "rank above %d", ES_MAX_RANK);
      return es__fail(ES_ENOTSUP, "%s '%s': rank %zu exceeds the maximum %d", what, vi->name,
                      tt->shape->n_dim, ES_MAX_RANK);
    }
    v->rank = (int)tt->shape->n_dim;
    for (size_t i = 0; i < tt->shape->n_dim; i++) {
      const Onnx__TensorShapeProto__Dimension *d = tt->shape->dim[i];
      int64_t x = -1;
      if (d && d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE &&
          d->dim_value >= 0)
        x = d->dim_value;
      v->dims[i] = x;
    }
  }
  return 0;
}

/* ==========================================================================
 * Nodes
 * ======================================================================== */

static int attr_convert(loader *L, const es_node *n, const Onnx__AttributeProto *a, es_attr *out,
                        const char *label, char *key) {
  es_graph *g = L->g;
  if (!a->name || !a->name[0])
    return es__fail(ES_EMODEL, "%s: attribute without a name", label);
  if (a->ref_attr_name && a->ref_attr_name[0])
    return es__fail(ES_EMODEL, "%s: attribute '%s' refers to a function attribute", label,
                    a->name);
  out->name = es__ctx_strdup(&g->ctx, a->name);
  out->tensor = -1;
  if (!out->name)
    return es__fail(ES_ENOMEM, "out of memory loading the model");
  switch (a->type) {
  case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT:
    out->type = ES_ATTR_FLOAT;
    out->f = a->f;
    return 0;
  case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT:
    out->type = ES_ATTR_INT;
    out->i = a->i;
    return 0;
  case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING: {
    out->type = ES_ATTR_STRING;
    if (a->s.len > 4096)
      return es__fail(ES_EMODEL, "%s: string attribute '%s' is too long", label, a->name);
    char *s = es__ctx_alloc(&g->ctx, a->s.len + 1);
    if (!s)
      return es__fail(ES_ENOMEM, "out of memory loading the model");
    if (a->s.len)
      memcpy(s, a->s.data, a->s.len);
    if (memchr(s, '\0', a->s.len))
      return es__fail(ES_EMODEL, "%s: string attribute '%s' contains a NUL byte", label,
                      a->name);
    out->s = s;
    return 0;
  }
  case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS: {
    out->type = ES_ATTR_INTS;
    out->n = a->n_ints;
    int64_t *v = es__ctx_alloc(&g->ctx, a->n_ints * sizeof(int64_t));
    if (!v)
      return es__fail(ES_ENOMEM, "out of memory loading the model");
    if (a->n_ints)
      memcpy(v, a->ints, a->n_ints * sizeof(int64_t));
    out->ints = v;
    return 0;
  }
  case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS: {
    out->type = ES_ATTR_FLOATS;
    out->n = a->n_floats;
    float *v = es__ctx_alloc(&g->ctx, a->n_floats * sizeof(float));
    if (!v)
      return es__fail(ES_ENOMEM, "out of memory loading the model");
    if (a->n_floats)
      memcpy(v, a->floats, a->n_floats * sizeof(float));
    out->floats = v;
    return 0;
  }
  case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRINGS: {
    out->type = ES_ATTR_STRINGS;
    out->n = a->n_strings;
    if (a->n_strings > 4096)
      return es__fail(ES_EMODEL, "%s: attribute '%s' has %zu strings", label, a->name,
                      a->n_strings);
    const char **v = es__ctx_alloc(&g->ctx, (a->n_strings + 1) * sizeof *v);
    if (!v)
      return es__fail(ES_ENOMEM, "out of memory loading the model");
    for (size_t i = 0; i < a->n_strings; i++) {
      const ProtobufCBinaryData *b = &a->strings[i];
      if (b->len > 4096 || (b->len && memchr(b->data, '\0', b->len)))
        return es__fail(ES_EMODEL, "%s: string %zu of attribute '%s' is too long or holds a NUL",
                        label, i, a->name);
      char *c = es__ctx_alloc(&g->ctx, b->len + 1);
      if (!c)
        return es__fail(ES_ENOMEM, "out of memory loading the model");
      if (b->len)
        memcpy(c, b->data, b->len);
      v[i] = c;
    }
    out->strs = v;
    return 0;
  }
  case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR: {
    out->type = ES_ATTR_TENSOR;
    if (!a->t)
      return es__fail(ES_EMODEL, "%s: tensor attribute '%s' has no tensor", label, a->name);
    /* Anonymous constants get a name no ONNX identifier can clash with. */
    char nm[96];
    snprintf(nm, sizeof nm, "\x01attr:%d:%s", n->file_index, a->name);
    char what[256];
    snprintf(what, sizeof what, "%s attribute '%s'", label, a->name);
    int rc = const_from_tensor(L, a->t, nm, what, &out->tensor);
    if (rc == 0 && g->values[out->tensor].kind == ES_VALUE_UNSUPPORTED) {
      snprintf(key, KEY_MAX, "%s", g->values[out->tensor].unsup);
      out->tensor = -1;
      return es__fail(ES_ENOTSUP, "%s: attribute '%s': %s is not supported", label, a->name, key);
    }
    return rc;
  }
  default: {
    static const char *const names[] = {
        [ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRINGS] = "strings",
        [ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSORS] = "tensors",
        [ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__SPARSE_TENSOR] = "sparse_tensor",
        [ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__SPARSE_TENSORS] = "sparse_tensors",
        [ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TYPE_PROTO] = "type_proto",
        [ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TYPE_PROTOS] = "type_protos",
    };
    const char *tn = (unsigned)a->type < sizeof names / sizeof names[0] && names[a->type]
                         ? names[a->type]
                         : "unknown";
    snprintf(key, KEY_MAX, "%s: attribute of type %s", es__op_name(n->op), tn);
    return es__fail(ES_ENOTSUP, "%s: attribute '%s' has unsupported type %s (%d)", label, a->name,
                    tn, (int)a->type);
  }
  }
}

/* Marks node n as one the engine cannot run (what: the item it is listed
 * under; why: the sentence after its label). */
static int node_unsup(loader *L, es_node *n, const char *op_type, const char *domain,
                      const char *what, const char *why) {
  es_graph *g = L->g;
  es_node_unsup *u = es__ctx_alloc(&g->ctx, sizeof *u);
  if (!u || !(u->op_type = es__ctx_strdup(&g->ctx, op_type)) ||
      !(u->what = es__ctx_strdup(&g->ctx, what)) || !(u->why = es__ctx_strdup(&g->ctx, why)) ||
      (domain && !(u->domain = es__ctx_strdup(&g->ctx, domain))))
    return es__fail(ES_ENOMEM, "out of memory loading the model");
  n->op = ES_OP_UNKNOWN;
  n->unsup = u;
  return 0;
}

/* A Constant node becomes a constant value named by its output. One whose
 * value the engine cannot hold (a string, a sparse tensor, an element type)
 * becomes an ES_VALUE_UNSUPPORTED value. */
static int constant_node(loader *L, const Onnx__NodeProto *np, int file_index, const char *label) {
  if (np->n_output != 1 || np->n_input != 0 || np->n_attribute != 1)
    return es__fail(ES_EMODEL, "%s: needs no input, one output and one attribute", label);
  const Onnx__AttributeProto *a = np->attribute[0];
  const char *name = np->output[0];
  if (!a || !a->name)
    return es__fail(ES_EMODEL, "%s: attribute without a name", label);
  if (!strcmp(a->name, "value") && a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR &&
      a->t) {
    int v;
    return const_from_tensor(L, a->t, name, label, &v);
  }
  int v, rc;
  es_value *val;
  const void *src = NULL;
  es_dtype dt;
  size_t n;
  int rank;
  if (!strcmp(a->name, "value_float") && a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT) {
    dt = ES_DTYPE_FLOAT, n = 1, rank = 0, src = &a->f;
  } else if (!strcmp(a->name, "value_floats") &&
             a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS) {
    dt = ES_DTYPE_FLOAT, n = a->n_floats, rank = 1, src = a->floats;
  } else if (!strcmp(a->name, "value_int") &&
             a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT) {
    dt = ES_DTYPE_INT64, n = 1, rank = 0, src = &a->i;
  } else if (!strcmp(a->name, "value_ints") &&
             a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS) {
    dt = ES_DTYPE_INT64, n = a->n_ints, rank = 1, src = a->ints;
  } else {
    if ((rc = value_add(L, name, ES_VALUE_CONST, label, &v)) < 0)
      return rc;
    const char *key = !strncmp(a->name, "value_string", 12) ? "element type string"
                      : !strcmp(a->name, "sparse_value")     ? "sparse tensor"
                                                             : "Constant attribute";
    (void)es__fail(ES_ENOTSUP, "%s: attribute '%s' (type %d) is not supported", label, a->name,
                   (int)a->type);
    return value_unsupported(L, v, key);
  }
  (void)file_index;
  rc = value_add(L, name, ES_VALUE_CONST, label, &v);
  if (rc < 0)
    return rc;
  val = &L->g->values[v];
  val->dtype = dt;
  val->rank = rank;
  if (rank == 1)
    val->dims[0] = (int64_t)n;
  val->nbytes = n * es_dtype_size(dt);
  /* The protobuf tree lives until const_stage, so src stays valid. */
  return const_push(L, NULL, src, v);
}

static void node_label(const Onnx__NodeProto *np, int file_index, char *label, size_t size) {
  const char *nm = np->name ? np->name : "";
  const char *ot = np->op_type ? np->op_type : "";
  if (nm[0])
    snprintf(label, size, "node '%.80s' (#%d %.60s)", nm, file_index, ot);
  else
    snprintf(label, size, "node #%d (%.60s)", file_index, ot);
}

/* The default domain is "" or "ai.onnx"; NULL for it, else the domain. */
static const char *node_domain(const Onnx__NodeProto *np) {
  return np->domain && np->domain[0] && strcmp(np->domain, "ai.onnx") ? np->domain : NULL;
}

/* Whether the engine knows an operator at the model's opset: the operator
 * in *op (ES_OP_UNKNOWN when not), and 0; or 1 with what (the item it is
 * listed under) and why (KEY_MAX and 240 bytes) filled. */
static int op_check(const es_graph *g, const char *dom, const char *ot, es_op *op, char *what,
                    char *why) {
  *op = ES_OP_UNKNOWN;
  if (dom && (*op = es__op_from_domain(dom, ot)) != ES_OP_UNKNOWN)
    return 0; /* ONNX Runtime's contrib operators have no default-domain opset */
  if (dom) {
    snprintf(what, KEY_MAX, "%.60s (domain '%.60s')", ot, dom);
    snprintf(why, 240,
             "operator domain '%.60s' is not supported (the engine runs the default ONNX "
             "domain and com.microsoft's QLinear operators)",
             dom);
    return 1;
  }
  *op = es__op_from_name(ot);
  if (*op == ES_OP_UNKNOWN) {
    snprintf(what, KEY_MAX, "%.80s", ot);
    snprintf(why, 240, "operator '%.80s' is not supported", ot);
    return 1;
  }
  if (g->opset < es__op_min_opset(*op)) {
    snprintf(what, KEY_MAX, "%s before opset %d", ot, es__op_min_opset(*op));
    snprintf(why, 240, "%s before opset %d is not supported (model opset %lld)", ot,
             es__op_min_opset(*op), (long long)g->opset);
    *op = ES_OP_UNKNOWN;
    return 1;
  }
  return 0;
}

/* Pass 1: check the operator, define the node's outputs (so inputs may refer
 * to nodes later in the file; the topological sort orders them and finds
 * cycles). A Constant node becomes a constant value and no node: returns 1
 * then, 0 for a node made (marked when the engine cannot run it). */
static int node_declare(loader *L, const Onnx__NodeProto *np, int file_index, es_node *out) {
  es_graph *g = L->g;
  char label[200];
  node_label(np, file_index, label, sizeof label);
  const char *ot = np->op_type ? np->op_type : "";
  const char *dom = node_domain(np);
  if (!dom && g->opset < 0)
    return es__fail(ES_EMODEL, "%s: the model imports no default-domain opset", label);
  es_op op;
  char what[KEY_MAX], why[240];
  int unsupported = op_check(g, dom, ot, &op, what, why);
  if (op == ES_OP_Constant) {
    int rc = constant_node(L, np, file_index, label);
    return rc < 0 ? rc : 1;
  }
  out->op = op;
  out->file_index = file_index;
  out->name = es__ctx_strdup(&g->ctx, np->name);
  out->n_in = (int)np->n_input;
  out->n_out = (int)np->n_output;
  out->in = es__ctx_alloc(&g->ctx, (np->n_input + 1) * sizeof(int));
  out->out = es__ctx_alloc(&g->ctx, (np->n_output + 1) * sizeof(int));
  out->attrs = es__ctx_alloc(&g->ctx, (np->n_attribute + 1) * sizeof(es_attr));
  if (!out->name || !out->in || !out->out || !out->attrs)
    return es__fail(ES_ENOMEM, "out of memory loading the model");
  if (unsupported) {
    int rc = node_unsup(L, out, ot, dom, what, why);
    if (rc < 0)
      return rc;
  }
  if (np->n_output == 0)
    return es__fail(ES_EMODEL, "%s: has no output", label);
  for (size_t i = 0; i < np->n_output; i++) {
    const char *o = np->output[i];
    if (!o || !o[0]) {
      out->out[i] = -1;
      continue;
    }
    int v, rc = value_add(L, o, ES_VALUE_ACT, label, &v);
    if (rc < 0)
      return rc;
    out->out[i] = v;
  }
  /* Omitted trailing outputs are dropped; an omitted one in the middle keeps
   * its slot as -1 and kernels must accept it. */
  while (out->n_out > 0 && out->out[out->n_out - 1] < 0)
    out->n_out--;
  if (out->n_out == 0)
    return es__fail(ES_EMODEL, "%s: all its outputs are unnamed", label);
  return 0;
}

/* ---- subgraphs ------------------------------------------------------------- */

static int sub_add(loader *L, int owner, const char *what, const char *where, const char *first) {
  es_graph *g = L->g;
  if (g->n_sub == g->cap_sub) {
    /* the old array stays in the context until the graph goes */
    int cap = g->cap_sub ? g->cap_sub * 2 : 16;
    es_sub_issue *s = es__ctx_alloc(&g->ctx, (size_t)cap * sizeof *s);
    if (!s)
      return es__fail(ES_ENOMEM, "out of memory loading the model");
    if (g->n_sub)
      memcpy(s, g->sub, (size_t)g->n_sub * sizeof *s);
    g->sub = s;
    g->cap_sub = cap;
  }
  es_sub_issue *s = &g->sub[g->n_sub];
  s->owner = owner;
  s->what = es__ctx_strdup(&g->ctx, what);
  s->where = es__ctx_strdup(&g->ctx, where);
  s->first = es__ctx_strdup(&g->ctx, first);
  if (!s->what || !s->where || !s->first)
    return es__fail(ES_ENOMEM, "out of memory loading the model");
  g->n_sub++;
  return 0;
}

static int subgraph_walk(loader *L, int owner, const char *holder, const Onnx__GraphProto *sg);

/* The subgraphs among a node's attributes, walked; holder names the node
 * ("'if0'" or "#3"). */
static int node_subgraphs(loader *L, int owner, const char *holder, const Onnx__NodeProto *np) {
  for (size_t a = 0; a < np->n_attribute; a++) {
    const Onnx__AttributeProto *at = np->attribute[a];
    if (!at)
      continue;
    char h[220];
    const char *an = at->name ? at->name : "?";
    int rc = 0;
    if (at->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH && at->g) {
      snprintf(h, sizeof h, "%.120s.%.60s", holder, an);
      rc = subgraph_walk(L, owner, h, at->g);
    } else if (at->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPHS) {
      for (size_t k = 0; rc == 0 && k < at->n_graphs; k++) {
        snprintf(h, sizeof h, "%.120s.%.60s[%zu]", holder, an, k);
        if (at->graphs[k])
          rc = subgraph_walk(L, owner, h, at->graphs[k]);
      }
    }
    if (rc < 0)
      return rc;
  }
  return 0;
}

/* Lists what the engine could not run inside a subgraph (one of a node the
 * engine cannot run, or the branches of an If the loader could not
 * inline): its nodes'
 * operators (domain, name, opset) and its initializers' element types, and
 * those of the subgraphs it holds, under owner, the main-graph node that
 * holds it all (listed only if that one is live). Identity and Dropout are
 * not listed: the engine removes them (es__graph_elide). Subgraphs the
 * engine runs (If branches, inlined by flatten_ifs; Loop and Scan bodies,
 * read by body_load) are not walked here.
 * The recursion is bounded by the nesting check (21 levels at most). */
static int subgraph_walk(loader *L, int owner, const char *holder, const Onnx__GraphProto *sg) {
  char what[KEY_MAX], why[240], where[300], first[600];
  int rc = 0;
  for (size_t i = 0; rc == 0 && i < sg->n_initializer; i++) {
    const Onnx__TensorProto *t = sg->initializer[i];
    if (!t || (t->has_data_type && es_dtype_size((es_dtype)t->data_type) != 0))
      continue;
    type_key(t->data_type, what, sizeof what);
    snprintf(where, sizeof where, "constant '%.80s' in %s", t->name ? t->name : "", holder);
    snprintf(first, sizeof first, "%s: %s is not supported", where, what);
    rc = sub_add(L, owner, what, where, first);
  }
  for (size_t i = 0; rc == 0 && i < sg->n_node; i++) {
    const Onnx__NodeProto *np = sg->node[i];
    if (!np)
      continue;
    const char *ot = np->op_type ? np->op_type : "";
    char self[120];
    if (np->name && np->name[0])
      snprintf(self, sizeof self, "'%.80s'", np->name);
    else
      snprintf(self, sizeof self, "#%zu", i);
    es_op op;
    const char *dom = node_domain(np);
    /* Identity and Dropout are removed wherever the engine runs a graph */
    int removable = !dom && (!strcmp(ot, "Identity") || !strcmp(ot, "Dropout"));
    int unrun = !removable && (dom || L->g->opset >= 0) && op_check(L->g, dom, ot, &op, what, why);
    if (!unrun && !dom && !strcmp(ot, "If")) {
      /* a graph's Ifs are inlined, with the Ifs their branches hold: one
       * met here is in a subgraph the engine does not run, or malformed */
      snprintf(what, KEY_MAX, "If");
      snprintf(why, 240, "an If without both branches, or in a subgraph the engine does not "
               "run, is not supported");
      unrun = 1;
    }
    if (unrun) {
      char label[200];
      node_label(np, (int)i, label, sizeof label);
      snprintf(where, sizeof where, "%s in %s", self, holder);
      snprintf(first, sizeof first, "%s in %s: %s", label, holder, why);
      rc = sub_add(L, owner, what, where, first);
    }
    if (rc == 0)
      rc = node_subgraphs(L, owner, self, np);
  }
  return rc;
}

/* After a graph is read (rc: how that went): its constants staged, the
 * loader's tables freed, then the nodes sorted, Identity and inference
 * Dropout removed, dead nodes pruned and tensor attributes resolved. The
 * main graph's and every body's last steps. */
static int loader_finish(loader *L, int rc) {
  if (rc == 0)
    rc = const_stage(L);
  es_mem_free(L->slots);
  es_mem_free(L->consts);
  L->slots = NULL;
  L->consts = NULL;
  if (rc == 0)
    rc = es__graph_toposort(L->g);
  if (rc == 0)
    rc = es__graph_elide(L->g);
  if (rc == 0)
    es__graph_prune(L->g);
  if (rc == 0)
    rc = es__graph_attrs_resolve(L->g);
  return rc;
}

/* ---- Loop and Scan bodies --------------------------------------------------
 *
 * A body becomes a graph of its own (es_node.body), read by the same code
 * as the main graph (its Ifs inlined, its constants staged). ONNX lets a
 * body read any value of the scopes around it; each name it reads and does
 * not define (nor do the subgraphs it holds) is a capture: an extra input
 * of the body and of the node, so the enclosing graph orders and keeps the
 * value, and a run hands it in. */

static int flat_push(void **arr, size_t n, size_t *cap, size_t esz, es_ctx *ctx);
static int graph_build(loader *L, const Onnx__GraphProto *gp, const es_graph *outer,
                       const char *const *cap_name, const int *cap_val, int n_cap);

typedef struct name_list {
  const char **s;
  size_t n, cap;
} name_list;

static int names_push(name_list *l, es_ctx *ctx, const char *name) {
  void *arr = (void *)l->s;
  int rc = flat_push(&arr, l->n, &l->cap, sizeof *l->s, ctx);
  l->s = arr;
  if (rc == 0)
    l->s[l->n++] = name;
  return rc;
}

static int cmp_name(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void names_unique(name_list *l) {
  if (!l->n)
    return;
  qsort((void *)l->s, l->n, sizeof *l->s, cmp_name);
  size_t k = 1;
  for (size_t i = 1; i < l->n; i++)
    if (strcmp(l->s[i], l->s[k - 1]))
      l->s[k++] = l->s[i];
  l->n = k;
}

/* Appends to out the names graph sg reads and does not define. */
static int free_names(const Onnx__GraphProto *sg, es_ctx *ctx, name_list *out, int depth) {
  if (depth > 32)
    return es__fail(ES_ENOTSUP, "subgraphs nested more than 32 deep");
  name_list def = {0}, used = {0};
  int rc = 0;
  for (size_t i = 0; rc == 0 && i < sg->n_input; i++)
    if (sg->input[i] && sg->input[i]->name)
      rc = names_push(&def, ctx, sg->input[i]->name);
  for (size_t i = 0; rc == 0 && i < sg->n_initializer; i++)
    if (sg->initializer[i] && sg->initializer[i]->name)
      rc = names_push(&def, ctx, sg->initializer[i]->name);
  for (size_t i = 0; rc == 0 && i < sg->n_node; i++) {
    const Onnx__NodeProto *np = sg->node[i];
    if (!np)
      continue;
    for (size_t o = 0; rc == 0 && o < np->n_output; o++)
      if (np->output[o] && np->output[o][0])
        rc = names_push(&def, ctx, np->output[o]);
    for (size_t k = 0; rc == 0 && k < np->n_input; k++)
      if (np->input[k] && np->input[k][0])
        rc = names_push(&used, ctx, np->input[k]);
    for (size_t a = 0; rc == 0 && a < np->n_attribute; a++) {
      const Onnx__AttributeProto *at = np->attribute[a];
      if (at && at->g)
        rc = free_names(at->g, ctx, &used, depth + 1);
      for (size_t k = 0; rc == 0 && at && k < at->n_graphs; k++)
        if (at->graphs[k])
          rc = free_names(at->graphs[k], ctx, &used, depth + 1);
    }
  }
  for (size_t i = 0; rc == 0 && i < sg->n_output; i++)
    if (sg->output[i] && sg->output[i]->name && sg->output[i]->name[0])
      rc = names_push(&used, ctx, sg->output[i]->name);
  if (rc < 0)
    return rc;
  names_unique(&def);
  for (size_t i = 0; rc == 0 && i < used.n; i++)
    if (!def.n || !bsearch(&used.s[i], def.s, def.n, sizeof *def.s, cmp_name))
      rc = names_push(out, ctx, used.s[i]);
  return rc;
}

/* Reads node out's body bgp into a graph of its own and appends the
 * captures to the node's inputs. */
static int body_load(loader *L, const Onnx__NodeProto *np, es_node *out,
                     const Onnx__GraphProto *bgp, const char *label) {
  es_graph *g = L->g;
  if (L->depth >= 8)
    return es__fail(ES_ENOTSUP, "%s: Loop and Scan bodies nested more than 8 deep", label);
  (void)np;
  name_list fn = {0};
  int rc = free_names(bgp, L->tmp, &fn, 0);
  if (rc < 0)
    return rc;
  names_unique(&fn);
  int *cv = es__ctx_alloc(L->tmp, (fn.n + 1) * sizeof *cv);
  int *in = es__ctx_alloc(&g->ctx, ((size_t)out->n_in + fn.n + 1) * sizeof *in);
  es_graph *bg = es__ctx_alloc(&g->ctx, sizeof *bg);
  if (!cv || !in || !bg)
    return es__fail(ES_ENOMEM, "out of memory loading the model");
  for (size_t i = 0; i < fn.n; i++)
    if ((cv[i] = name_find(L, fn.s[i])) < 0)
      return es__fail(ES_EMODEL, "%s: its body reads '%.80s', which no enclosing scope defines",
                      label, fn.s[i]);
  if (g->n_bodies == g->cap_bodies) {
    int cap = g->cap_bodies ? g->cap_bodies * 2 : 8;
    es_graph **nb = es__ctx_alloc(&g->ctx, (size_t)cap * sizeof *nb);
    if (!nb)
      return es__fail(ES_ENOMEM, "out of memory loading the model");
    if (g->n_bodies)
      memcpy(nb, g->bodies, (size_t)g->n_bodies * sizeof *nb);
    g->bodies = nb;
    g->cap_bodies = cap;
  }
  memset(bg, 0, sizeof *bg);
  g->bodies[g->n_bodies++] = bg; /* freed with g from now on */
  bg->opset = g->opset;
  bg->ir_version = g->ir_version;
  if (g->file)
    bg->file = es_weights_retain(g->file);
  loader L2 = {.g = bg, .raw = L->raw, .tmp = L->tmp, .next_id = L->next_id,
               .depth = L->depth + 1};
  rc = loader_finish(&L2, graph_build(&L2, bgp, g, fn.s, cv, (int)fn.n));
  if (rc < 0)
    return rc;
  memcpy(in, out->in, (size_t)out->n_in * sizeof *in);
  for (size_t i = 0; i < fn.n; i++)
    in[out->n_in + (int)i] = cv[i];
  out->in = in;
  out->n_in += (int)fn.n;
  out->n_capture = (int)fn.n;
  out->body = bg;
  return 0;
}

/* Pass 2: resolve inputs by name and convert attributes. A node the engine
 * cannot run keeps its inputs (they make the graph's order) but no
 * attributes: only its subgraphs are walked, for the list. An attribute
 * the engine cannot take (a subgraph, a type) marks a known node. */
static int node_resolve(loader *L, const Onnx__NodeProto *np, es_node *out) {
  char label[200];
  node_label(np, out->file_index, label, sizeof label);
  for (size_t i = 0; i < np->n_input; i++) {
    const char *in = np->input[i];
    if (!in || !in[0]) {
      out->in[i] = -1; /* omitted optional input */
      continue;
    }
    int v = name_find(L, in);
    if (v < 0)
      return es__fail(ES_EMODEL,
                      "%s: input %zu '%.80s' is not a graph input, an initializer or a node's "
                      "output",
                      label, i, in);
    out->in[i] = v;
  }
  char holder[120];
  if (np->name && np->name[0])
    snprintf(holder, sizeof holder, "'%.80s'", np->name);
  else
    snprintf(holder, sizeof holder, "#%d", out->file_index);
  /* A Loop's or Scan's body is read as a graph of its own, which lists
   * what it cannot run itself */
  int has_body = !out->unsup && (out->op == ES_OP_Loop || out->op == ES_OP_Scan);
  int rc = has_body ? 0 : node_subgraphs(L, out->file_index, holder, np);
  if (rc < 0 || out->unsup)
    return rc;
  const char *ot = np->op_type ? np->op_type : "";
  for (size_t a = 0; a < np->n_attribute; a++) {
    const Onnx__AttributeProto *at = np->attribute[a];
    if (!at)
      return es__fail(ES_EMODEL, "%s: attribute #%zu is empty", label, a);
    char key[KEY_MAX], why[300];
    if (has_body && at->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH && at->g &&
        at->name && !strcmp(at->name, "body") && !out->body) {
      if ((rc = body_load(L, np, out, at->g, label)) == ES_EMODEL || rc == ES_ENOTSUP) {
        /* listed if the node is live (a dead one's body is nobody's concern) */
        snprintf(key, sizeof key, "%s with a body the engine cannot read", ot);
        snprintf(why, sizeof why, "its body: %s", es_last_error_detail());
        return node_unsup(L, out, ot, NULL, key, why);
      }
      if (rc < 0)
        return rc;
      continue;
    }
    if (at->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH ||
        at->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPHS) {
      snprintf(key, sizeof key, "%s with a subgraph (control flow)", ot);
      snprintf(why, sizeof why, "attribute '%.60s' is a subgraph, which the engine runs only "
               "as If's two branches and as Loop's and Scan's body", at->name ? at->name : "?");
      return node_unsup(L, out, ot, NULL, key, why);
    }
    rc = attr_convert(L, out, at, &out->attrs[out->n_attr], label, key);
    if (rc == ES_ENOTSUP) {
      snprintf(why, sizeof why, "attribute '%.60s': %s is not supported",
               at->name ? at->name : "?", key);
      return node_unsup(L, out, ot, NULL, key, why);
    }
    if (rc < 0)
      return rc;
    out->n_attr++;
  }
  return 0;
}

/* ==========================================================================
 * Entry point
 * ======================================================================== */

/* ---- If, inlined ---------------------------------------------------------
 *
 * An If of the main graph (and the Ifs its branches hold, to any depth)
 * becomes plain nodes: the then-branch's nodes, each guarded to run only
 * when the condition holds, the else-branch's, guarded the other way, and a
 * merge node (op If without subgraphs: inputs cond, then's outputs, else's
 * outputs) that passes on the taken branch's outputs. The planner then
 * plans both branches in one arena (their buffers share it as their
 * lifetimes allow), skips a branch whose condition it knows, and a run
 * skips the steps whose guard fails. A branch's own names (outputs,
 * initializers) get a prefix naming the If and the branch, so sibling
 * branches may reuse a name; names a branch does not define are the
 * enclosing scopes', as ONNX's scoping says. */

typedef struct flat_scope {
  int parent;         /* -1 for the main graph */
  const char *prefix; /* its names' prefix ("" for the main graph) */
} flat_scope;

typedef struct flattener {
  es_ctx *ctx;
  const Onnx__GraphProto *gp;
  Onnx__NodeProto **node;
  flat_node *info;      /* per node */
  size_t n_node, cap_node, cap_info;
  Onnx__TensorProto **init;
  size_t n_init, cap_init;
  flat_scope *scope;
  size_t n_scope, cap_scope;
  /* (scope, local name) -> renamed, open addressing */
  struct flat_name {
    int scope;
    const char *local, *renamed;
  } *names;
  size_t n_slots;
  int ifs;        /* If ids handed out */
  int next_index; /* file_index for the next branch node or merge */
} flattener;

/* A well-formed If: one input, then_branch and else_branch graphs with as
 * many outputs as the node, no inputs of their own. Anything else is left
 * as it is (the loader lists it). */
static int if_branches(const Onnx__NodeProto *np, const Onnx__GraphProto **th,
                       const Onnx__GraphProto **el) {
  *th = *el = NULL;
  if (!np || !np->op_type || strcmp(np->op_type, "If") || node_domain(np) || np->n_input != 1)
    return 0;
  for (size_t a = 0; a < np->n_attribute; a++) {
    const Onnx__AttributeProto *at = np->attribute[a];
    if (!at || !at->name || at->type != ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH || !at->g)
      return 0;
    if (!strcmp(at->name, "then_branch"))
      *th = at->g;
    else if (!strcmp(at->name, "else_branch"))
      *el = at->g;
    else
      return 0;
  }
  return *th && *el && (*th)->n_output == np->n_output && (*el)->n_output == np->n_output &&
         (*th)->n_input == 0 && (*el)->n_input == 0;
}

/* Names a graph and the If branches it holds define, for the table's size. */
static size_t flat_count(const Onnx__GraphProto *sg, int depth) {
  size_t n = sg->n_initializer + sg->n_node + 1;
  for (size_t i = 0; i < sg->n_node; i++) {
    const Onnx__GraphProto *th, *el;
    if (!sg->node[i])
      continue;
    n += sg->node[i]->n_output;
    if (depth < 32 && if_branches(sg->node[i], &th, &el))
      n += flat_count(th, depth + 1) + flat_count(el, depth + 1);
  }
  return n;
}

static struct flat_name *flat_slot(flattener *F, int scope, const char *local) {
  uint64_t h = name_hash(local) ^ ((uint64_t)scope * 0x9e3779b97f4a7c15ull);
  size_t mask = F->n_slots - 1;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    struct flat_name *e = &F->names[i];
    if (!e->local || (e->scope == scope && !strcmp(e->local, local)))
      return e;
  }
}

/* What name refers to in scope: the innermost definition, or itself (a
 * main-graph name). */
static const char *flat_resolve(flattener *F, int scope, const char *name) {
  if (!name || !name[0])
    return name;
  for (int s = scope; s > 0; s = F->scope[s].parent) {
    struct flat_name *e = flat_slot(F, s, name);
    if (e->local)
      return e->renamed;
  }
  return name;
}

/* Defines name in scope: its new name (the name itself in the main graph). */
static const char *flat_define(flattener *F, int scope, const char *name) {
  if (scope == 0 || !name || !name[0])
    return name;
  struct flat_name *e = flat_slot(F, scope, name);
  if (e->local)
    return e->renamed; /* defined twice: the loader says so */
  size_t lp = strlen(F->scope[scope].prefix), ln = strlen(name);
  char *r = es__ctx_alloc(F->ctx, lp + ln + 1);
  if (!r)
    return NULL;
  memcpy(r, F->scope[scope].prefix, lp);
  memcpy(r + lp, name, ln + 1);
  e->scope = scope;
  e->local = name;
  e->renamed = r;
  return r;
}

/* Room in *arr (n elements of esz held, *cap allocated) for one more. */
static int flat_push(void **arr, size_t n, size_t *cap, size_t esz, es_ctx *ctx) {
  if (n < *cap)
    return 0;
  size_t nc = *cap ? *cap * 2 : 64;
  void *na = es__ctx_alloc(ctx, nc * esz);
  if (!na)
    return es__fail(ES_ENOMEM, "out of memory loading the model");
  if (n)
    memcpy(na, *arr, n * esz);
  *arr = na;
  *cap = nc;
  return 0;
}

static int flat_node_add(flattener *F, Onnx__NodeProto *np, int file_index, int if_id,
                         const int *guard, int n_guard) {
  void *arr = F->node, *inf = F->info;
  int rc = flat_push(&arr, F->n_node, &F->cap_node, sizeof *F->node, F->ctx);
  F->node = arr;
  if (rc == 0)
    rc = flat_push(&inf, F->n_node, &F->cap_info, sizeof *F->info, F->ctx);
  F->info = inf;
  if (rc < 0)
    return rc;
  int *g = NULL;
  if (n_guard) {
    g = es__ctx_alloc(F->ctx, (size_t)n_guard * sizeof *g);
    if (!g)
      return es__fail(ES_ENOMEM, "out of memory loading the model");
    memcpy(g, guard, (size_t)n_guard * sizeof *g);
  }
  F->info[F->n_node] = (flat_node){file_index, if_id, n_guard, g};
  F->node[F->n_node++] = np;
  return 0;
}

/* Appends graph sg's initializers and nodes, in scope, under guards. */
static int flat_graph(flattener *F, const Onnx__GraphProto *sg, int scope, int *guard,
                      int n_guard, int depth) {
  if (depth > 32)
    return es__fail(ES_ENOTSUP, "If nodes nested more than 32 deep");
  int rc = 0;
  for (size_t i = 0; scope && i < sg->n_initializer; i++) {
    Onnx__TensorProto *t = sg->initializer[i];
    if (!t)
      return es__fail(ES_EMODEL, "an If branch's initializer #%zu is empty", i);
    Onnx__TensorProto *c = es__ctx_alloc(F->ctx, sizeof *c);
    if (!c)
      return es__fail(ES_ENOMEM, "out of memory loading the model");
    *c = *t;
    if (!(c->name = (char *)flat_define(F, scope, t->name)))
      return es__fail(ES_ENOMEM, "out of memory loading the model");
    void *arr = F->init;
    if ((rc = flat_push(&arr, F->n_init, &F->cap_init, sizeof *F->init, F->ctx)) < 0)
      return rc;
    F->init = arr;
    F->init[F->n_init++] = c;
  }
  for (size_t i = 0; i < sg->n_node; i++) {
    Onnx__NodeProto *np = sg->node[i];
    if (!np)
      return es__fail(ES_EMODEL, "node #%zu is empty", i);
    int index = scope ? F->next_index++ : (int)i;
    const Onnx__GraphProto *th, *el;
    Onnx__NodeProto *c = es__ctx_alloc(F->ctx, sizeof *c);
    char **in = es__ctx_alloc(F->ctx, (np->n_input + 2 * np->n_output + 1) * sizeof *in);
    char **out = es__ctx_alloc(F->ctx, (np->n_output + 1) * sizeof *out);
    if (!c || !in || !out)
      return es__fail(ES_ENOMEM, "out of memory loading the model");
    *c = *np;
    for (size_t k = 0; k < np->n_input; k++)
      in[k] = (char *)flat_resolve(F, scope, np->input[k]);
    c->input = in;
    if (if_branches(np, &th, &el)) {
      /* the branches, then the merge: cond, then's outputs, else's */
      int id = ++F->ifs;
      const char *nm = np->name && np->name[0] ? np->name : "If";
      for (int b = 0; b < 2; b++) {
        const Onnx__GraphProto *bg = b ? el : th;
        void *arr = F->scope;
        if ((rc = flat_push(&arr, F->n_scope, &F->cap_scope, sizeof *F->scope, F->ctx)) < 0)
          return rc;
        F->scope = arr;
        int child = (int)F->n_scope++;
        char *pre = es__ctx_alloc(F->ctx, strlen(nm) + 40);
        if (!pre)
          return es__fail(ES_ENOMEM, "out of memory loading the model");
        sprintf(pre, "%s~%d/%s/", nm, id, b ? "else" : "then");
        F->scope[child] = (flat_scope){scope, pre};
        guard[n_guard] = b ? -id : id;
        if ((rc = flat_graph(F, bg, child, guard, n_guard + 1, depth + 1)) < 0)
          return rc;
        for (size_t o = 0; o < bg->n_output; o++) {
          const Onnx__ValueInfoProto *vi = bg->output[o];
          if (!vi || !vi->name || !vi->name[0])
            return es__fail(ES_EMODEL, "If '%.80s': %s-branch output #%zu has no name", nm,
                            b ? "else" : "then", o);
          in[1 + (size_t)b * np->n_output + o] = (char *)flat_resolve(F, child, vi->name);
        }
      }
      c->n_input = 1 + 2 * np->n_output;
      c->n_attribute = 0;
      c->attribute = NULL;
      for (size_t o = 0; o < np->n_output; o++)
        if (!(out[o] = (char *)flat_define(F, scope, np->output[o])) && np->output[o])
          return es__fail(ES_ENOMEM, "out of memory loading the model");
      c->output = out;
      if ((rc = flat_node_add(F, c, index, id, guard, n_guard)) < 0)
        return rc;
      continue;
    }
    for (size_t o = 0; o < np->n_output; o++)
      if (!(out[o] = (char *)flat_define(F, scope, np->output[o])) && np->output[o])
        return es__fail(ES_ENOMEM, "out of memory loading the model");
    c->output = out;
    if ((rc = flat_node_add(F, c, index, 0, guard, n_guard)) < 0)
      return rc;
  }
  return 0;
}

/* gp with its Ifs inlined into *flat (a shallow copy whose node and
 * initializer arrays are new), the per-node guards in *info; *flat = gp
 * and *info = NULL when it has none. Everything lives in ctx. */
static int flatten_ifs(es_ctx *ctx, const Onnx__GraphProto *gp, const Onnx__GraphProto **flat,
                       const flat_node **info) {
  *flat = gp;
  *info = NULL;
  int any = 0;
  for (size_t i = 0; i < gp->n_node && !any; i++) {
    const Onnx__GraphProto *th, *el;
    any = if_branches(gp->node[i], &th, &el);
  }
  if (!any)
    return 0;
  flattener F = {.ctx = ctx, .gp = gp, .next_index = (int)gp->n_node};
  size_t names = flat_count(gp, 0);
  F.n_slots = 16;
  while (F.n_slots < names * 2)
    F.n_slots <<= 1;
  F.names = es__ctx_alloc(ctx, F.n_slots * sizeof *F.names);
  F.scope = es__ctx_alloc(ctx, 8 * sizeof *F.scope);
  F.init = es__ctx_alloc(ctx, (gp->n_initializer + 1) * sizeof *F.init);
  int *guard = es__ctx_alloc(ctx, 40 * sizeof *guard);
  if (!F.names || !F.scope || !F.init || !guard)
    return es__fail(ES_ENOMEM, "out of memory loading the model");
  F.cap_scope = 8;
  F.n_scope = 1;
  F.scope[0] = (flat_scope){-1, ""};
  F.cap_init = gp->n_initializer + 1;
  for (size_t i = 0; i < gp->n_initializer; i++)
    F.init[F.n_init++] = gp->initializer[i];
  int rc = flat_graph(&F, gp, 0, guard, 0, 0);
  if (rc < 0)
    return rc;
  Onnx__GraphProto *g2 = es__ctx_alloc(ctx, sizeof *g2);
  if (!g2)
    return es__fail(ES_ENOMEM, "out of memory loading the model");
  *g2 = *gp;
  g2->node = F.node;
  g2->n_node = F.n_node;
  g2->initializer = F.init;
  g2->n_initializer = F.n_init;
  *flat = g2;
  *info = F.info;
  return 0;
}

static int graph_build(loader *L, const Onnx__GraphProto *gp, const es_graph *outer,
                       const char *const *cap_name, const int *cap_val, int n_cap);

static int graph_load(loader *L, const Onnx__ModelProto *mp) {
  es_graph *g = L->g;
  const Onnx__GraphProto *gp = mp->graph;
  if (!gp)
    return es__fail(ES_EMODEL, "the model has no graph");
  g->ir_version = mp->has_ir_version ? mp->ir_version : 0;
  /* The default domain is "" or "ai.onnx"; imports of other domains are
   * allowed (exporters add some they never use): their nodes are listed. */
  g->opset = -1;
  int seen = 0;
  for (size_t i = 0; i < mp->n_opset_import; i++) {
    const Onnx__OperatorSetIdProto *os = mp->opset_import[i];
    if (!os || (os->domain && os->domain[0] && strcmp(os->domain, "ai.onnx")))
      continue;
    int64_t v = os->has_version ? os->version : -1;
    if (seen && v != g->opset)
      return es__fail(ES_EMODEL, "the model imports the default domain twice (opsets %lld and %lld)",
                      (long long)g->opset, (long long)v);
    g->opset = v;
    seen = 1;
  }
  if (!seen && g->ir_version < 3)
    g->opset = 1; /* before IR 3 there were no opset imports */
  if (seen && g->opset < 0)
    return es__fail(ES_EMODEL, "the model's default-domain opset import has no version");
  if (g->opset >= 0 && g->opset < ES_ONNX_MIN_OPSET)
    return es__fail(ES_ENOTSUP,
                    "opset %lld is older than the supported %d (the engine runs opsets %d to %d "
                    "of the default domain)",
                    (long long)g->opset, ES_ONNX_MIN_OPSET, ES_ONNX_MIN_OPSET, ES_ONNX_MAX_OPSET);
  if (g->opset > ES_ONNX_MAX_OPSET)
    return es__fail(ES_ENOTSUP,
                    "opset %lld is newer than the supported %d (the engine runs opsets %d to %d "
                    "of the default domain)",
                    (long long)g->opset, ES_ONNX_MAX_OPSET, ES_ONNX_MIN_OPSET, ES_ONNX_MAX_OPSET);
  if (gp->n_node > ES_ONNX_MAX_NODES)
    return es__fail(ES_EMODEL, "the graph has %zu nodes, more than %d", gp->n_node,
                    ES_ONNX_MAX_NODES);
  for (size_t i = 0; i < gp->n_node; i++)
    if (!gp->node[i])
      return es__fail(ES_EMODEL, "node #%zu is empty", i);
  return graph_build(L, gp, NULL, NULL, NULL, 0);
}

/* Reads graph gp into L->g: its Ifs inlined, initializers, inputs (then
 * n_cap captures, for a body: names cap_name, types those of the
 * enclosing graph's values cap_val), nodes and outputs. A body's inputs may leave
 * their types out (a Loop's carried values take the types given at run
 * time). */
static int graph_build(loader *L, const Onnx__GraphProto *gp, const es_graph *outer,
                       const char *const *cap_name, const int *cap_val, int n_cap) {
  es_graph *g = L->g;
  int rc = flatten_ifs(L->tmp, gp, &gp, &L->flat);
  if (rc < 0)
    return rc;
  if (gp->n_node > ES_ONNX_MAX_NODES)
    return es__fail(ES_EMODEL, "the graph has %zu nodes with its If branches, more than %d",
                    gp->n_node, ES_ONNX_MAX_NODES);
  L->gp = gp;
  if (gp->n_sparse_initializer)
    return es__fail(ES_ENOTSUP, "sparse initializers are not supported");

  /* Upper bound on values: inputs + initializers + node outputs + tensor
   * attributes. All are bounded by the message size, so no overflow. */
  size_t cap = gp->n_input + gp->n_initializer + 1;
  for (size_t i = 0; i < gp->n_node; i++) {
    if (!gp->node[i])
      return es__fail(ES_EMODEL, "node #%zu is empty", i);
    cap += gp->node[i]->n_output + gp->node[i]->n_attribute;
  }
  cap += (size_t)n_cap;
  if (cap > (size_t)INT32_MAX / 4)
    return es__fail(ES_EMODEL, "the graph is too large (%zu values)", cap);
  int base = *L->next_id;
  L->id_base = base;
  *L->next_id = base + (int)gp->n_node;
  L->cap_values = (int)cap;
  g->cap_values = (int)cap;
  L->nslots = 16;
  while (L->nslots < cap * 2)
    L->nslots <<= 1;
  L->slots = es_mem_alloc(ES_MEM_MODEL, L->nslots * sizeof(int));
  g->values = es__ctx_alloc(&g->ctx, cap * sizeof(es_value));
  g->nodes = es__ctx_alloc(&g->ctx, (gp->n_node + 1) * sizeof(es_node));
  g->inputs = es__ctx_alloc(&g->ctx, (gp->n_input + (size_t)n_cap + 1) * sizeof(int));
  g->outputs = es__ctx_alloc(&g->ctx, (gp->n_output + 1) * sizeof(int));
  if (!L->slots || !g->values || !g->nodes || !g->inputs || !g->outputs)
    return es__fail(ES_ENOMEM, "out of memory loading the model");
  memset(L->slots, 0xff, L->nslots * sizeof(int));

  for (size_t i = 0; i < gp->n_initializer; i++) {
    const Onnx__TensorProto *t = gp->initializer[i];
    char what[160];
    snprintf(what, sizeof what, "initializer #%zu '%.80s'", i, t && t->name ? t->name : "");
    if (!t)
      return es__fail(ES_EMODEL, "%s is empty", what);
    int v;
    if ((rc = const_from_tensor(L, t, t->name, what, &v)) < 0)
      return rc;
  }
  for (size_t i = 0; i < gp->n_input; i++) {
    const Onnx__ValueInfoProto *vi = gp->input[i];
    if (!vi || !vi->name || !vi->name[0])
      return es__fail(ES_EMODEL, "graph input #%zu has no name", i);
    if (name_find(L, vi->name) >= 0)
      continue; /* IR < 4 lists initializers as inputs too: the constant wins */
    int v;
    if ((rc = value_add(L, vi->name, ES_VALUE_INPUT, "graph input", &v)) < 0)
      return rc;
    char key[KEY_MAX];
    rc = value_info_apply(vi, &g->values[v], "graph input", key);
    if (rc == ES_ENOTSUP)
      rc = value_unsupported(L, v, key);
    else if (rc == 0 && g->values[v].dtype == ES_DTYPE_UNDEFINED && !outer)
      rc = es__fail(ES_EMODEL, "graph input '%s' has no element type", vi->name);
    if (rc < 0)
      return rc;
    g->inputs[g->n_inputs++] = v;
  }
  for (int i = 0; i < n_cap; i++) {
    int v;
    if (name_find(L, cap_name[i]) >= 0)
      return es__fail(ES_ECORRUPT, "capture '%.80s' is defined in the body", cap_name[i]);
    if ((rc = value_add(L, cap_name[i], ES_VALUE_INPUT, "a body's capture", &v)) < 0)
      return rc;
    const es_value *ov = &outer->values[cap_val[i]];
    g->values[v].dtype = ov->dtype;
    g->values[v].rank = -1;
    g->values[v].unsup = ov->unsup;
    if (ov->kind == ES_VALUE_UNSUPPORTED)
      g->values[v].kind = ES_VALUE_UNSUPPORTED;
    g->inputs[g->n_inputs++] = v;
  }
  int *slot_of = es_mem_alloc(ES_MEM_MODEL, (gp->n_node + 1) * sizeof(int));
  if (!slot_of)
    return es__fail(ES_ENOMEM, "out of memory loading the model");
  rc = 0;
  for (size_t i = 0; i < gp->n_node && rc == 0; i++) {
    es_node *n = &g->nodes[g->n_nodes];
    const flat_node *fi = L->flat ? &L->flat[i] : NULL;
    rc = node_declare(L, gp->node[i], base + (fi ? fi->file_index : (int)i), n);
    slot_of[i] = rc == 0 ? g->n_nodes++ : -1;
    if (rc > 0)
      rc = 0; /* a Constant: a value, no node */
    if (rc == 0 && fi && slot_of[i] >= 0) {
      n->if_id = fi->if_id;
      n->n_guard = fi->n_guard;
      n->guard = fi->n_guard ? es__ctx_alloc(&g->ctx, (size_t)fi->n_guard * sizeof(int)) : NULL;
      if (fi->n_guard && !n->guard)
        rc = es__fail(ES_ENOMEM, "out of memory loading the model");
      else if (fi->n_guard)
        memcpy(n->guard, fi->guard, (size_t)fi->n_guard * sizeof(int));
    }
  }
  for (size_t i = 0; i < gp->n_node && rc == 0; i++)
    if (slot_of[i] >= 0)
      rc = node_resolve(L, gp->node[i], &g->nodes[slot_of[i]]);
  es_mem_free(slot_of);
  if (rc < 0)
    return rc;
  for (size_t i = 0; i < gp->n_output; i++) {
    const Onnx__ValueInfoProto *vi = gp->output[i];
    if (!vi || !vi->name || !vi->name[0])
      return es__fail(ES_EMODEL, "graph output #%zu has no name", i);
    int v = name_find(L, vi->name);
    if (v < 0)
      return es__fail(ES_EMODEL, "graph output '%.80s' is not produced by any node", vi->name);
    for (int k = 0; k < g->n_outputs; k++)
      if (g->outputs[k] == v)
        return es__fail(ES_EMODEL, "graph output '%.80s' is listed twice", vi->name);
    es_value tmp = g->values[v];
    char key[KEY_MAX];
    rc = value_info_apply(vi, &tmp, "graph output", key);
    if (rc == ES_ENOTSUP) {
      if (!(g->values[v].unsup = es__ctx_strdup(&g->ctx, key)))
        return es__fail(ES_ENOMEM, "out of memory loading the model");
    } else if (rc < 0) {
      return rc;
    } else if (g->values[v].kind == ES_VALUE_ACT) { /* declared type: kept for describing */
      g->values[v] = tmp;
    }
    g->values[v].is_output = 1;
    g->outputs[g->n_outputs++] = v;
  }
  if (g->n_outputs == 0)
    return es__fail(ES_EMODEL, "the graph has no outputs");
  for (int i = 0; i < g->n_nodes; i++)
    for (int o = 0; o < g->nodes[i].n_out; o++)
      if (g->nodes[i].out[o] >= 0)
        g->values[g->nodes[i].out[o]].producer = i;
  return 0;
}

static int onnx_load(const void *data, size_t size, int keep, es_weights *file, es_graph *g) {
  if (!data || !g)
    return es__fail(ES_EINVAL, "es__onnx_load: NULL argument");
  int rc = pb_depth_check(&onnx__model_proto__descriptor, data, size, ES_ONNX_MAX_DEPTH,
                          "ONNX model");
  if (rc < 0)
    return rc;
  raw_table rt = {0};
  uint8_t *stripped;
  size_t stripped_size;
  if ((rc = pb_strip_raw(data, size, &rt, &stripped, &stripped_size)) < 0)
    return rc;
  pb_arena pb = {0};
  ProtobufCAllocator al = {pb_alloc, pb_free, &pb};
  Onnx__ModelProto *mp = stripped ? onnx__model_proto__unpack(&al, stripped_size, stripped)
                                  : onnx__model_proto__unpack(&al, size, data);
  es_mem_free(stripped); /* the tree holds copies of all it keeps */
  if (!mp) {
    es__ctx_free_all(&pb.ctx);
    es_mem_free(rt.refs);
    if (pb.oom)
      return es__fail(ES_ENOMEM, "out of memory decoding the ONNX model (%zu bytes)", size);
    return es__fail(ES_EMODEL,
                    "not a valid ONNX model: the protobuf encoding is truncated or corrupted "
                    "(%zu bytes)",
                    size);
  }
  int next_id = 0;
  loader L = {.g = g, .raw = &rt, .tmp = &pb.ctx, .next_id = &next_id};
  if (file)
    g->file = es_weights_retain(file);
  rc = loader_finish(&L, graph_load(&L, mp));
  es_mem_free(rt.refs);
  es__ctx_free_all(&pb.ctx); /* the whole protobuf tree */
  if (rc == 0 && !keep) {
    es_issues issues = {0};
    rc = es__graph_issues(g, &issues);
    if (rc == 0 && issues.n)
      rc = es__issues_fail(&issues, "the model uses what the engine cannot run");
    es__issues_fini(&issues);
  }
  if (rc < 0)
    es__graph_fini(g);
  return rc;
}

int es__onnx_load(const void *data, size_t size, es_graph *g) {
  return onnx_load(data, size, 0, NULL, g);
}

int es__onnx_load_keep(const void *data, size_t size, es_graph *g) {
  return onnx_load(data, size, 1, NULL, g);
}

int es__onnx_load_file(es_weights *file, es_graph *g) {
  if (!file)
    return es__fail(ES_EINVAL, "es__onnx_load_file: NULL file");
  return onnx_load(es_weights_data(file), es_weights_size(file), 1, file, g);
}

int es__onnx_tensor_parse(const void *buf, size_t size, es_value *v, void **data) {
  if (!buf || !v || !data)
    return es__fail(ES_EINVAL, "es__onnx_tensor_parse: NULL argument");
  int rc = pb_depth_check(&onnx__tensor_proto__descriptor, buf, size, ES_ONNX_MAX_DEPTH,
                          "TensorProto");
  if (rc < 0)
    return rc;
  pb_arena pb = {0};
  ProtobufCAllocator al = {pb_alloc, pb_free, &pb};
  Onnx__TensorProto *t = onnx__tensor_proto__unpack(&al, size, buf);
  if (!t) {
    es__ctx_free_all(&pb.ctx);
    if (pb.oom)
      return es__fail(ES_ENOMEM, "out of memory decoding a TensorProto (%zu bytes)", size);
    return es__fail(ES_EMODEL, "not a valid TensorProto (%zu bytes)", size);
  }
  memset(v, 0, sizeof *v);
  v->rank = -1;
  v->producer = -1;
  v->kind = ES_VALUE_CONST;
  char key[KEY_MAX];
  rc = tensor_check(NULL, t, v, "tensor", key);
  void *d = NULL;
  if (rc == 0) {
    d = es_mem_aligned_alloc(ES_MEM_ENGINE, 64, v->nbytes ? v->nbytes : 1);
    if (!d)
      rc = es__fail(ES_ENOMEM, "out of memory reading a tensor of %zu bytes", v->nbytes);
    else
      tensor_copy(NULL, t, v, d);
  }
  es__ctx_free_all(&pb.ctx);
  v->data = d;
  *data = d;
  return rc;
}

/* ==========================================================================
 * The whole tree, for tools that rewrite a model (the quantizer)
 * ======================================================================== */

int es__onnx_unpack(const void *data, size_t size, es_ctx *ctx, void **out) {
  if (!data || !ctx || !out)
    return es__fail(ES_EINVAL, "es__onnx_unpack: NULL argument");
  *out = NULL;
  int rc = pb_depth_check(&onnx__model_proto__descriptor, data, size, ES_ONNX_MAX_DEPTH,
                          "ONNX model");
  if (rc < 0)
    return rc;
  pb_arena pb = {0};
  ProtobufCAllocator al = {pb_alloc, pb_free, &pb};
  Onnx__ModelProto *mp = onnx__model_proto__unpack(&al, size, data);
  if (!mp) {
    es__ctx_free_all(&pb.ctx);
    if (pb.oom)
      return es__fail(ES_ENOMEM, "out of memory decoding the ONNX model (%zu bytes)", size);
    return es__fail(ES_EMODEL, "not a valid ONNX model: the protobuf encoding is truncated or "
                               "corrupted (%zu bytes)", size);
  }
  *ctx = pb.ctx; /* the tree lives in this context from now on */
  *out = mp;
  return 0;
}
