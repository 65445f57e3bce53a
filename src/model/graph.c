/* Graph IR plumbing: node helpers, topological ordering, dead-node removal,
 * Identity and Dropout removal, sealing the constants into the weights, and
 * the list of what a graph needs that the engine cannot run. */
#include "model/graph.h"
#include "common/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ==========================================================================
 * Node helpers
 * ======================================================================== */

const es_attr *es__node_attr(const es_node *n, const char *name) {
  return es__attr_find(n->attrs, n->n_attr, name);
}

const char *es__node_label(const es_node *n, char *buf, size_t size) {
  if (!n->unsup)
    return es__op_label(n->name, n->file_index, n->op, buf, size);
  /* the operator table does not know it: the file's name for it */
  if (n->name && n->name[0])
    snprintf(buf, size, "node '%s' (#%d %s)", n->name, n->file_index, n->unsup->op_type);
  else
    snprintf(buf, size, "node #%d (%s)", n->file_index, n->unsup->op_type);
  return buf;
}

const char *es__node_op_type(const es_node *n) {
  return n->unsup ? n->unsup->op_type : es__op_name(n->op);
}

/* ==========================================================================
 * Topological order (Kahn's algorithm) and pruning
 * ======================================================================== */

int *es__graph_if_conds(const es_graph *g, int *max_id) {
  int m = 0;
  for (int i = 0; i < g->n_nodes; i++)
    if (g->nodes[i].if_id > m)
      m = g->nodes[i].if_id;
  *max_id = -1;
  if (m == 0)
    return NULL;
  int *c = es_mem_alloc(ES_MEM_MODEL, ((size_t)m + 1) * sizeof *c);
  if (!c)
    return NULL;
  for (int k = 0; k <= m; k++)
    c[k] = -1;
  for (int i = 0; i < g->n_nodes; i++)
    if (g->nodes[i].if_id > 0 && g->nodes[i].n_in > 0)
      c[g->nodes[i].if_id] = g->nodes[i].in[0];
  *max_id = m;
  return c;
}

/* Input k of nd, its guards' conditions counted after its inputs (a
 * guarded node runs after its condition is known): -1 for none. */
static int node_dep(const es_node *nd, const int *cond, int max_id, int k) {
  if (k < nd->n_in)
    return nd->in[k];
  int id = abs(nd->guard[k - nd->n_in]);
  return id <= max_id && cond ? cond[id] : -1;
}

int es__graph_toposort(es_graph *g) {
  int n = g->n_nodes, nv = g->n_values;
  if (n == 0)
    return 0;
  int max_id;
  int *cond = es__graph_if_conds(g, &max_id);
  /* Consumer lists in CSR form: first[v]..first[v+1] index into cons[]. */
  size_t edges = 0;
  for (int i = 0; i < n; i++)
    edges += (size_t)g->nodes[i].n_in + (size_t)g->nodes[i].n_guard;
  int *pending = es_mem_calloc(ES_MEM_MODEL, (size_t)n, sizeof(int)); /* unmet inputs */
  int *queue = es_mem_calloc(ES_MEM_MODEL, (size_t)n, sizeof(int));
  int *first = es_mem_calloc(ES_MEM_MODEL, (size_t)nv + 1, sizeof(int));
  int *cons = es_mem_calloc(ES_MEM_MODEL, edges + 1, sizeof(int));
  es_node *sorted = es_mem_calloc(ES_MEM_MODEL, (size_t)n, sizeof(es_node));
  int rc = 0;
  if (!pending || !queue || !first || !cons || !sorted) {
    rc = es__fail(ES_ENOMEM, "out of memory sorting %d nodes", n);
    goto out;
  }
  for (int i = 0; i < n; i++)
    for (int k = 0; k < g->nodes[i].n_in + g->nodes[i].n_guard; k++) {
      int v = node_dep(&g->nodes[i], cond, max_id, k);
      if (v >= 0)
        first[v + 1]++;
    }
  for (int v = 0; v < nv; v++)
    first[v + 1] += first[v];
  int *fill = es_mem_calloc(ES_MEM_MODEL, (size_t)nv + 1, sizeof(int));
  if (!fill) {
    rc = es__fail(ES_ENOMEM, "out of memory sorting %d nodes", n);
    goto out;
  }
  for (int i = 0; i < n; i++)
    for (int k = 0; k < g->nodes[i].n_in + g->nodes[i].n_guard; k++) {
      int v = node_dep(&g->nodes[i], cond, max_id, k);
      if (v >= 0)
        cons[first[v] + fill[v]++] = i;
    }
  es_mem_free(fill);

  int head = 0, tail = 0;
  for (int i = 0; i < n; i++) {
    for (int k = 0; k < g->nodes[i].n_in + g->nodes[i].n_guard; k++) {
      int v = node_dep(&g->nodes[i], cond, max_id, k);
      if (v >= 0 && g->values[v].producer >= 0)
        pending[i]++;
    }
    if (pending[i] == 0)
      queue[tail++] = i;
  }
  while (head < tail) {
    int i = queue[head++];
    for (int o = 0; o < g->nodes[i].n_out; o++) {
      int v = g->nodes[i].out[o];
      if (v < 0)
        continue; /* omitted output in the middle */
      for (int c = first[v]; c < first[v + 1]; c++)
        if (--pending[cons[c]] == 0)
          queue[tail++] = cons[c];
    }
  }
  if (tail < n) {
    char lab[160];
    for (int i = 0; i < n; i++)
      if (pending[i] > 0) {
        rc = es__fail(ES_EMODEL, "%s: its inputs depend on its own outputs (cycle)",
                      es__node_label(&g->nodes[i], lab, sizeof lab));
        break;
      }
    goto out;
  }
  /* Renumber producers to the new positions. */
  for (int p = 0; p < n; p++) {
    sorted[p] = g->nodes[queue[p]];
    for (int o = 0; o < sorted[p].n_out; o++)
      if (sorted[p].out[o] >= 0)
        g->values[sorted[p].out[o]].producer = p;
  }
  memcpy(g->nodes, sorted, (size_t)n * sizeof(es_node));
out:
  es_mem_free(cond);
  es_mem_free(pending);
  es_mem_free(queue);
  es_mem_free(first);
  es_mem_free(cons);
  es_mem_free(sorted);
  return rc;
}

void es__graph_prune(es_graph *g) {
  int n = g->n_nodes;
  if (n == 0)
    return;
  /* Walk backwards in topological order: a node is live if any output is a
   * graph output or feeds a live node. */
  unsigned char *live_val = es_mem_calloc(ES_MEM_MODEL, (size_t)g->n_values, 1);
  if (!live_val)
    return; /* pruning is an optimisation; keeping everything is correct */
  for (int i = 0; i < g->n_outputs; i++)
    live_val[g->outputs[i]] = 1;
  int kept = 0;
  unsigned char *live_node = es_mem_calloc(ES_MEM_MODEL, (size_t)n, 1);
  if (!live_node) {
    es_mem_free(live_val);
    return;
  }
  for (int i = n - 1; i >= 0; i--) {
    es_node *nd = &g->nodes[i];
    for (int o = 0; o < nd->n_out && !live_node[i]; o++)
      if (nd->out[o] >= 0 && live_val[nd->out[o]])
        live_node[i] = 1;
    if (live_node[i])
      for (int k = 0; k < nd->n_in; k++)
        if (nd->in[k] >= 0)
          live_val[nd->in[k]] = 1;
  }
  for (int i = 0; i < n; i++)
    if (live_node[i])
      g->nodes[kept++] = g->nodes[i];
  g->n_nodes = kept;
  es__graph_reindex(g);
  es_mem_free(live_val);
  es_mem_free(live_node);
}

void es__graph_reindex(es_graph *g) {
  for (int v = 0; v < g->n_values; v++) {
    g->values[v].producer = -1;
    g->values[v].uses = 0;
  }
  for (int i = 0; i < g->n_nodes; i++) {
    const es_node *nd = &g->nodes[i];
    for (int o = 0; o < nd->n_out; o++)
      if (nd->out[o] >= 0)
        g->values[nd->out[o]].producer = i;
    for (int k = 0; k < nd->n_in; k++)
      if (nd->in[k] >= 0)
        g->values[nd->in[k]].uses++;
  }
}

/* ==========================================================================
 * Adding constants (load-time passes)
 * ======================================================================== */

/* A new value's slot, zeroed: the array grows in the context when full. */
static int value_new(es_graph *g, const char *name, int *out) {
  if (g->n_values >= g->cap_values) {
    /* The loader's estimate leaves slack (every attribute counts), so this
     * is rare; the old array stays in the context until the graph goes. */
    if (g->n_values > (1 << 28))
      return es__fail(ES_EMODEL, "the graph has too many values to add one");
    int cap = g->n_values < 8 ? 16 : g->n_values * 2;
    es_value *nv = es__ctx_alloc(&g->ctx, (size_t)cap * sizeof *nv);
    if (!nv)
      return es__fail(ES_ENOMEM, "out of memory adding a value");
    memcpy(nv, g->values, (size_t)g->n_values * sizeof *nv);
    g->values = nv;
    g->cap_values = cap;
  }
  const char *nm = es__ctx_strdup(&g->ctx, name);
  if (!nm)
    return es__fail(ES_ENOMEM, "out of memory adding a value");
  int v = g->n_values++;
  es_value *val = &g->values[v];
  memset(val, 0, sizeof *val);
  val->name = nm;
  val->producer = -1;
  *out = v;
  return 0;
}

int es__graph_act_append(es_graph *g, const char *name, int *out) {
  int rc = value_new(g, name, out);
  if (rc < 0)
    return rc;
  es_value *v = &g->values[*out];
  v->rank = -1;
  v->kind = ES_VALUE_ACT;
  return 0;
}

int es__graph_node_append(es_graph *g, const es_node *nd) {
  /* The array has no spare room: a copy one longer, in the context (the
   * old one stays there until the graph goes; load-time passes add few). */
  es_node *nn = es__ctx_alloc(&g->ctx, ((size_t)g->n_nodes + 2) * sizeof *nn);
  if (!nn)
    return es__fail(ES_ENOMEM, "out of memory adding a node");
  memcpy(nn, g->nodes, (size_t)g->n_nodes * sizeof *nn);
  nn[g->n_nodes] = *nd;
  g->nodes = nn;
  g->n_nodes++;
  return 0;
}

int es__graph_const_append(es_graph *g, const char *name, es_dtype dtype, int rank,
                           const int64_t *dims, void *data, size_t nbytes, int *out) {
  int rc = value_new(g, name, out);
  if (rc < 0) {
    es_mem_free(data);
    return rc;
  }
  es_value *val = &g->values[*out];
  val->dtype = dtype;
  val->rank = rank;
  if (rank > 0)
    memcpy(val->dims, dims, (size_t)rank * sizeof *dims);
  val->kind = ES_VALUE_CONST;
  val->data = data;
  val->nbytes = nbytes;
  return 0;
}

/* ==========================================================================
 * Constant data: staging blocks, then one sealed region
 * ======================================================================== */

#define ES_WEIGHT_ALIGN 64

/* Marks the constants the graph still reads. Tensor attributes count: they
 * are constants a kernel reads through es_attr.tensor (ConstantOfShape's
 * value), not node inputs. */
static void const_mark_live(const es_graph *g, unsigned char *live) {
  for (int i = 0; i < g->n_nodes; i++) {
    const es_node *nd = &g->nodes[i];
    for (int k = 0; k < nd->n_in; k++)
      if (nd->in[k] >= 0)
        live[nd->in[k]] = 1;
    for (int a = 0; a < nd->n_attr; a++)
      if (nd->attrs[a].type == ES_ATTR_TENSOR && nd->attrs[a].tensor >= 0)
        live[nd->attrs[a].tensor] = 1;
  }
  for (int i = 0; i < g->n_outputs; i++)
    live[g->outputs[i]] = 1;
}

unsigned char *es__graph_stage_slab(es_graph *g, size_t len, size_t room) {
  if (g->stage || len == 0 || room > SIZE_MAX - len)
    return NULL;
  /* Filled once from the file: es_weights regions start on a huge page and
   * have them advised, a fault per 2 MiB rather than per 4 KiB. */
  es_weights *w;
  void *p;
  if (es_weights_create(len + room, &w) < 0)
    return NULL;
  if (es_weights_data_mut(w, &p) < 0) {
    es_weights_release(w);
    return NULL;
  }
  g->stage = w;
  g->stage_slab = p;
  g->stage_len = len;
  g->stage_room = room;
  return p;
}

static int in_slab(const es_graph *g, const void *data) {
  const unsigned char *d = data;
  return g->stage_slab && d >= g->stage_slab && d < g->stage_slab + g->stage_len + g->stage_room;
}

int es__graph_in_file(const es_graph *g, const void *data) {
  if (!g->file)
    return 0;
  uintptr_t d = (uintptr_t)data, lo = (uintptr_t)es_weights_data(g->file);
  return d >= lo && d - lo < es_weights_size(g->file);
}

void es__graph_const_free(es_graph *g, const void *data) {
  if (!in_slab(g, data) && !es__graph_in_file(g, data))
    es_mem_free((void *)data);
}

static void stage_slab_drop(es_graph *g) {
  es_weights_release(g->stage);
  g->stage = NULL;
  g->stage_slab = NULL;
  g->stage_len = g->stage_room = 0;
}

/* Where each live constant goes when the slab is sealed in place: slab
 * constants stay, the others follow in its room. 1 and *end (the bytes in
 * use) when the slab lost at most 1/16 of its bytes to the passes and the
 * others fit; 0 otherwise. */
static int seal_in_place_fits(const es_graph *g, const unsigned char *live, size_t *offset,
                              size_t *end) {
  if (!g->stage)
    return 0;
  size_t kept = 0, at = g->stage_len, cap = g->stage_len + g->stage_room;
  for (int v = 0; v < g->n_values; v++) {
    const es_value *val = &g->values[v];
    if (val->kind != ES_VALUE_CONST || !live[v] || es__graph_in_file(g, val->data))
      continue;
    if (in_slab(g, val->data) && (const unsigned char *)val->data < g->stage_slab + g->stage_len) {
      kept += val->nbytes;
      offset[v] = (size_t)((const unsigned char *)val->data - g->stage_slab);
      continue;
    }
    size_t off = es__align_up(at, ES_WEIGHT_ALIGN);
    if (off > cap || val->nbytes > cap - off)
      return 0;
    offset[v] = off;
    at = off + val->nbytes;
  }
  if (kept < g->stage_len - g->stage_len / 16)
    return 0;
  *end = at;
  return 1;
}

int es__graph_seal(es_graph *g) {
  if (g->weights)
    return es__fail(ES_ESTATE, "the graph's weights are already sealed");
  for (int i = 0; i < g->n_bodies; i++) /* each body's constants: a region of its own */
    if (!g->bodies[i]->weights) {
      int brc = es__graph_seal(g->bodies[i]);
      if (brc < 0)
        return brc;
    }
  int nv = g->n_values;
  unsigned char *live = es_mem_calloc(ES_MEM_MODEL, (size_t)nv + 1, 1);
  size_t *offset = es_mem_calloc(ES_MEM_MODEL, (size_t)nv + 1, sizeof *offset);
  int rc = 0;
  if (!live || !offset) {
    rc = es__fail(ES_ENOMEM, "out of memory sealing the weights");
    goto out;
  }
  const_mark_live(g, live);
  size_t total = 0, count = 0, from_file = 0;
  for (int v = 0; v < nv; v++) {
    const es_value *val = &g->values[v];
    if (val->kind != ES_VALUE_CONST || !live[v])
      continue;
    count++;
    if (es__graph_in_file(g, val->data)) {
      from_file += val->nbytes;
      live[v] = 2; /* read in place: neither copied nor freed */
    }
  }
  es_weights *w = NULL;
  void *base;
  if (seal_in_place_fits(g, live, offset, &total)) {
    /* The weights are where they stay: the others join them, and the
     * region (dead bytes included, at most 1/16) is sealed as it is. */
    w = g->stage;
    base = g->stage_slab;
    for (int v = 0; v < nv; v++) {
      const es_value *val = &g->values[v];
      if (val->kind == ES_VALUE_CONST && live[v] == 1 && val->nbytes &&
          (unsigned char *)base + offset[v] != val->data)
        memcpy((unsigned char *)base + offset[v], val->data, val->nbytes);
    }
    rc = es_weights_seal(w);
    if (rc < 0)
      goto out;
  } else {
    for (int v = 0; v < nv; v++) {
      const es_value *val = &g->values[v];
      if (val->kind != ES_VALUE_CONST || live[v] != 1)
        continue;
      size_t off = es__align_up(total, ES_WEIGHT_ALIGN);
      if ((off == 0 && total) || val->nbytes > SIZE_MAX - off) {
        rc = es__fail(ES_EMODEL, "constant data size overflows");
        goto out;
      }
      offset[v] = off;
      total = off + val->nbytes;
    }
    /* Fill and seal a region of our own first: if any step fails, the
     * staging blocks are untouched and still the graph's to free. */
    rc = es_weights_create(total ? total : 1, &w);
    if (rc == 0)
      rc = es_weights_data_mut(w, &base);
    for (int v = 0; rc == 0 && v < nv; v++)
      if (g->values[v].kind == ES_VALUE_CONST && live[v] == 1 && g->values[v].nbytes)
        memcpy((unsigned char *)base + offset[v], g->values[v].data, g->values[v].nbytes);
    if (rc == 0)
      rc = es_weights_seal(w);
    if (rc < 0) {
      es_weights_release(w);
      goto out;
    }
  }
  const unsigned char *ro = es_weights_data(w);
  for (int v = 0; v < nv; v++) {
    es_value *val = &g->values[v];
    if (val->kind != ES_VALUE_CONST || live[v] == 2)
      continue;
    es__graph_const_free(g, val->data);
    val->data = live[v] ? ro + offset[v] : NULL;
  }
  if (w == g->stage)
    g->stage = NULL; /* the graph's weights now */
  stage_slab_drop(g);
  g->weights = w;
  g->weight_bytes = es__graph_const_bytes(g);
  g->file_weight_bytes = from_file;
  if (!from_file && g->file) { /* nothing reads the file: let it go */
    es_weights_release(g->file);
    g->file = NULL;
  }
  g->n_constants = count;
  rc = es__graph_attrs_resolve(g);
out:
  es_mem_free(live);
  es_mem_free(offset);
  return rc;
}

int es__graph_attrs_resolve(es_graph *g) {
  for (int i = 0; i < g->n_nodes; i++) {
    es_node *nd = &g->nodes[i];
    for (int a = 0; a < nd->n_attr; a++) {
      es_attr *at = &nd->attrs[a];
      if (at->type != ES_ATTR_TENSOR || at->tensor < 0)
        continue;
      if (at->tensor >= g->n_values || g->values[at->tensor].kind != ES_VALUE_CONST)
        return es__fail(ES_EMODEL, "attribute '%s' refers to value %d, not a constant", at->name,
                        at->tensor);
      const es_value *v = &g->values[at->tensor];
      es_attr_tensor *t = (es_attr_tensor *)at->t;
      if (!t && !(t = es__ctx_alloc(&g->ctx, sizeof *t)))
        return es__fail(ES_ENOMEM, "out of memory resolving tensor attributes");
      t->dtype = v->dtype;
      t->rank = v->rank < 0 ? 0 : v->rank;
      for (int d = 0; d < ES_MAX_RANK; d++)
        t->dims[d] = d < t->rank ? v->dims[d] : 0;
      t->data = v->data;
      t->nbytes = v->nbytes;
      at->t = t;
    }
  }
  return 0;
}

size_t es__graph_const_bytes(const es_graph *g) {
  size_t n = 0;
  for (int v = 0; v < g->n_values; v++)
    if (g->values[v].kind == ES_VALUE_CONST && g->values[v].data)
      n += g->values[v].nbytes;
  return n;
}

void es__graph_fini(es_graph *g) {
  if (!g)
    return;
  for (int i = 0; i < g->n_bodies; i++)
    es__graph_fini(g->bodies[i]);
  if (g->weights)
    es_weights_release(g->weights);
  else /* still staging: every constant's data is its own block (or NULL) */
    for (int v = 0; v < g->n_values; v++)
      if (g->values[v].kind == ES_VALUE_CONST)
        es__graph_const_free(g, g->values[v].data);
  stage_slab_drop(g);
  if (g->file)
    es_weights_release(g->file);
  es__ctx_free_all(&g->ctx);
  memset(g, 0, sizeof *g);
}

/* ==========================================================================
 * Identity and inference Dropout: removed, their readers rewired
 * ======================================================================== */

/* Union-find over values with path halving: rep[v] is the value that
 * stands for v once the nodes in between are gone. */
static int rep_find(int *rep, int v) {
  while (rep[v] != v) {
    rep[v] = rep[rep[v]];
    v = rep[v];
  }
  return v;
}

/* NULL when a Dropout is the identity at inference; else why it stays. */
static const char *dropout_stays(const es_graph *g, const es_node *nd) {
  if (nd->n_out > 1 && nd->out[1] >= 0 &&
      (g->values[nd->out[1]].uses > 0 || g->values[nd->out[1]].is_output))
    return "Dropout with its mask output used";
  if (g->opset < 12)
    return nd->n_in == 1 ? NULL : "Dropout with more than one input before opset 12";
  if (nd->n_in < 3 || nd->in[2] < 0)
    return NULL;
  /* training_mode: only a constant false makes the node an identity */
  const es_value *t = &g->values[nd->in[2]];
  if (t->kind != ES_VALUE_CONST || !t->data || t->nbytes == 0)
    return "Dropout with a training_mode input (training only when true)";
  const unsigned char *b = t->data;
  for (size_t i = 0; i < t->nbytes; i++)
    if (b[i])
      return "Dropout with training_mode=1 (training only)";
  return NULL;
}

/* Marks a Dropout that stays and that the operator table does not know with
 * the reason, so the list says why rather than "Dropout". */
static int dropout_mark(es_graph *g, es_node *nd, const char *why) {
  if (!nd->unsup)
    return 0; /* a kernel runs it */
  es_node_unsup *u = es__ctx_alloc(&g->ctx, sizeof *u);
  if (!u)
    return es__fail(ES_ENOMEM, "out of memory loading the model");
  *u = *nd->unsup;
  u->what = why;
  u->why = why;
  nd->unsup = u;
  return 0;
}

int es__graph_elide(es_graph *g) {
  int n = g->n_nodes, nv = g->n_values;
  if (n == 0)
    return 0;
  es__graph_reindex(g);
  int *rep = es_mem_alloc(ES_MEM_MODEL, ((size_t)nv + 1) * sizeof *rep);
  unsigned char *gone = es_mem_calloc(ES_MEM_MODEL, (size_t)n + 1, 1);
  int rc = 0, removed = 0;
  if (!rep || !gone) {
    rc = es__fail(ES_ENOMEM, "out of memory loading the model");
    goto out;
  }
  for (int v = 0; v < nv; v++)
    rep[v] = v;
  for (int i = 0; i < n; i++) {
    es_node *nd = &g->nodes[i];
    if (nd->unsup && nd->unsup->domain)
      continue;
    const char *ot = es__node_op_type(nd);
    int identity = !strcmp(ot, "Identity"), dropout = !strcmp(ot, "Dropout");
    if (!identity && !dropout)
      continue;
    if (nd->n_in < 1 || nd->in[0] < 0 || nd->n_out < 1 || nd->out[0] < 0 ||
        (identity && (nd->n_in != 1 || nd->n_out != 1)))
      continue; /* malformed: left to whatever runs it, or to the list */
    if (dropout) {
      const char *why = dropout_stays(g, nd);
      if (why) {
        if ((rc = dropout_mark(g, nd, why)) < 0)
          goto out;
        continue;
      }
    }
    int x = rep_find(rep, nd->in[0]), y = nd->out[0];
    es_value *xv = &g->values[x], *yv = &g->values[y];
    if (xv->kind == ES_VALUE_UNSUPPORTED)
      continue;
    if (!yv->is_output) {
      rep[y] = x; /* readers of y read x */
    } else if (xv->kind == ES_VALUE_ACT && !xv->is_output && xv->producer >= 0) {
      /* y must keep its name: x's producer writes y, and x's readers read y */
      es_node *p = &g->nodes[xv->producer];
      for (int o = 0; o < p->n_out; o++)
        if (p->out[o] == x)
          p->out[o] = y;
      yv->producer = xv->producer;
      xv->producer = -1;
      rep[x] = y;
    } else if (xv->kind == ES_VALUE_CONST && !g->weights) {
      /* a graph output that copies a constant is one: its own staging block */
      void *d = es_mem_alloc(ES_MEM_MODEL, xv->nbytes ? xv->nbytes : 1);
      if (!d) {
        rc = es__fail(ES_ENOMEM, "out of memory loading the model");
        goto out;
      }
      if (xv->nbytes)
        memcpy(d, xv->data, xv->nbytes);
      yv->kind = ES_VALUE_CONST;
      yv->dtype = xv->dtype;
      yv->rank = xv->rank;
      memcpy(yv->dims, xv->dims, sizeof yv->dims);
      yv->data = d;
      yv->nbytes = xv->nbytes;
      yv->producer = -1;
      yv->unsup = NULL;
    } else {
      continue; /* a graph input or another output copied: the node stays */
    }
    gone[i] = 1;
    removed++;
  }
  if (removed) {
    int kept = 0;
    for (int i = 0; i < n; i++) {
      if (gone[i])
        continue;
      es_node *nd = &g->nodes[i];
      for (int k = 0; k < nd->n_in; k++)
        if (nd->in[k] >= 0)
          nd->in[k] = rep_find(rep, nd->in[k]);
      g->nodes[kept++] = *nd;
    }
    g->n_nodes = kept;
    g->elided += removed;
  }
  es__graph_reindex(g);
out:
  es_mem_free(rep);
  es_mem_free(gone);
  return rc;
}

/* ==========================================================================
 * What the engine cannot run: the list
 * ======================================================================== */

static uint64_t issue_hash(const char *s) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (; *s; s++)
    h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static int issues_grow(es_issues *l) {
  if (l->n < l->cap)
    return 0;
  int cap = l->cap ? l->cap * 2 : 16;
  es_issue *items = l->items ? es_mem_realloc(l->items, (size_t)cap * sizeof *items)
                             : es_mem_alloc(ES_MEM_MODEL, (size_t)cap * sizeof *items);
  if (!items)
    return ES_ENOMEM;
  l->items = items;
  size_t nslots = 2 * (size_t)cap;
  int *slots = es_mem_alloc(ES_MEM_MODEL, nslots * sizeof *slots);
  if (!slots)
    return ES_ENOMEM;
  memset(slots, 0xff, nslots * sizeof *slots);
  for (int i = 0; i < l->n; i++) {
    size_t s = issue_hash(items[i].what) & (nslots - 1);
    while (slots[s] >= 0)
      s = (s + 1) & (nslots - 1);
    slots[s] = i;
  }
  es_mem_free(l->slots);
  l->slots = slots;
  l->nslots = nslots;
  l->cap = cap;
  return 0;
}

int es__issues_add(es_issues *l, const char *what, const char *where, int is_node,
                   const char *first) {
  es_issue *it = NULL;
  size_t s = 0;
  if (l->nslots) {
    for (s = issue_hash(what) & (l->nslots - 1); l->slots[s] >= 0; s = (s + 1) & (l->nslots - 1))
      if (!strcmp(l->items[l->slots[s]].what, what)) {
        it = &l->items[l->slots[s]];
        break;
      }
  }
  if (!it) {
    if (issues_grow(l) < 0)
      return es__fail(ES_ENOMEM, "out of memory listing what the model needs");
    for (s = issue_hash(what) & (l->nslots - 1); l->slots[s] >= 0; s = (s + 1) & (l->nslots - 1))
      ;
    it = &l->items[l->n];
    memset(it, 0, sizeof *it);
    it->what = es__ctx_strdup(&l->ctx, what);
    it->first = es__ctx_strdup(&l->ctx, first ? first : what);
    if (!it->what || !it->first)
      return es__fail(ES_ENOMEM, "out of memory listing what the model needs");
    it->nodes = is_node;
    l->slots[s] = l->n++;
  }
  it->count++;
  l->places++;
  if (where && it->n_where < ES_ISSUE_WHERE) {
    const char *w = es__ctx_strdup(&l->ctx, where);
    if (!w)
      return es__fail(ES_ENOMEM, "out of memory listing what the model needs");
    it->where[it->n_where++] = w;
  }
  return 0;
}

void es__issues_fini(es_issues *l) {
  if (!l)
    return;
  es_mem_free(l->items);
  es_mem_free(l->slots);
  es__ctx_free_all(&l->ctx);
  memset(l, 0, sizeof *l);
}

/* One item as text: "Erf ×12 (nodes 'a', 'b', ...)". */
static void issue_text(const es_issue *it, char *buf, size_t size, int max_where) {
  int pos = snprintf(buf, size, "%s", it->what);
  if (it->count > 1 && pos >= 0 && (size_t)pos < size)
    pos += snprintf(buf + pos, size - (size_t)pos, " \xc3\x97%d", it->count);
  int shown = it->n_where < max_where ? it->n_where : max_where;
  for (int w = 0; w < shown && pos >= 0 && (size_t)pos < size; w++)
    pos += snprintf(buf + pos, size - (size_t)pos, "%s%s%s", w ? ", " : " (",
                    w == 0 && it->nodes ? (it->count > 1 ? "nodes " : "node ") : "", it->where[w]);
  if (shown > 0 && pos >= 0 && (size_t)pos < size)
    snprintf(buf + pos, size - (size_t)pos, "%s)", it->count > shown ? ", ..." : "");
}

const char *es__issues_format(const es_issues *l, char *buf, size_t size, int max_where) {
  if (size == 0)
    return buf;
  buf[0] = '\0';
  size_t pos = 0;
  char item[600], more[48];
  for (int i = 0; i < l->n; i++) {
    issue_text(&l->items[i], item, sizeof item, max_where);
    size_t need = strlen(item) + (i ? 2 : 0);
    /* room for the "; and K more" that may have to follow */
    size_t tail = i + 1 < l->n ? (size_t)snprintf(more, sizeof more, "; and %d more", l->n - i - 1)
                               : 0;
    if (i > 0 && pos + need + tail >= size) {
      snprintf(buf + pos, size - pos, "; and %d more", l->n - i);
      break;
    }
    pos += (size_t)snprintf(buf + pos, size - pos, "%s%s", i ? "; " : "", item);
    if (pos >= size) { /* the first item alone did not fit: cut */
      pos = size - 1;
      break;
    }
  }
  return buf;
}

int es__issues_fail(const es_issues *l, const char *intro) {
  if (l->places == 1)
    return es__fail(ES_ENOTSUP, "%s", l->items[0].first);
  /* The detail holds 512 bytes and a file name may come before it. */
  char list[320];
  es__issues_format(l, list, sizeof list, 2);
  return es__fail(ES_ENOTSUP, "%s (%d kind%s, %d places): %s", intro, l->n, l->n == 1 ? "" : "s",
                  l->places, list);
}

/* es__issues_add, the place said to be inside holder (a body) when set. */
static int issue_add(const char *holder, es_issues *out, const char *what, const char *where,
                     int is_node, const char *first) {
  if (!holder)
    return es__issues_add(out, what, where, is_node, first);
  char w[400], f[800];
  snprintf(w, sizeof w, "%s in %s", where, holder);
  snprintf(f, sizeof f, "%s (in %s)", first, holder);
  return es__issues_add(out, what, w, is_node, f);
}

static int issues_in(const es_graph *g, es_issues *out, const char *holder) {
  unsigned char *listed = es_mem_calloc(ES_MEM_MODEL, (size_t)g->n_values + 1, 1);
  int max_fi = 0;
  for (int i = 0; i < g->n_nodes; i++)
    if (g->nodes[i].file_index > max_fi)
      max_fi = g->nodes[i].file_index;
  unsigned char *live = es_mem_calloc(ES_MEM_MODEL, (size_t)max_fi + 2, 1);
  int rc = 0;
  char where[200], first[600], label[200];
  if (!listed || !live) {
    rc = es__fail(ES_ENOMEM, "out of memory listing what the model needs");
    goto out;
  }
  for (int i = 0; rc == 0 && i < g->n_inputs; i++) {
    const es_value *v = &g->values[g->inputs[i]];
    listed[g->inputs[i]] = 1;
    if (!v->unsup)
      continue;
    snprintf(where, sizeof where, "input '%.120s'", v->name);
    snprintf(first, sizeof first, "graph input '%.120s': %s is not supported", v->name, v->unsup);
    rc = issue_add(holder, out, v->unsup, where, 0, first);
  }
  for (int i = 0; rc == 0 && i < g->n_nodes; i++) {
    const es_node *nd = &g->nodes[i];
    if (nd->file_index >= 0)
      live[nd->file_index] = 1;
    for (int k = 0; rc == 0 && k < nd->n_in; k++) {
      int v = nd->in[k];
      if (v < 0 || listed[v] || g->values[v].kind != ES_VALUE_UNSUPPORTED)
        continue;
      listed[v] = 1;
      const es_value *val = &g->values[v];
      snprintf(where, sizeof where, "constant '%.120s'", val->name);
      snprintf(first, sizeof first, "constant '%.120s': %s is not supported", val->name,
               val->unsup ? val->unsup : "its type");
      rc = issue_add(holder, out, val->unsup ? val->unsup : "a constant's type", where, 0, first);
    }
    if (rc == 0 && nd->body && !nd->unsup) {
      char h[160];
      if (nd->name && nd->name[0])
        snprintf(h, sizeof h, "'%.120s'.body", nd->name);
      else
        snprintf(h, sizeof h, "#%d.body", nd->file_index);
      rc = issues_in(nd->body, out, h);
    }
    if (rc < 0 || !nd->unsup)
      continue;
    if (nd->name && nd->name[0])
      snprintf(where, sizeof where, "'%.120s'", nd->name);
    else
      snprintf(where, sizeof where, "#%d", nd->file_index);
    snprintf(first, sizeof first, "%s: %s", es__node_label(nd, label, sizeof label),
             nd->unsup->why);
    rc = issue_add(holder, out, nd->unsup->what, where, 1, first);
  }
  for (int i = 0; rc == 0 && i < g->n_outputs; i++) {
    const es_value *v = &g->values[g->outputs[i]];
    if (!v->unsup || listed[g->outputs[i]])
      continue;
    listed[g->outputs[i]] = 1;
    snprintf(where, sizeof where, "output '%.120s'", v->name);
    snprintf(first, sizeof first, "graph output '%.120s': %s is not supported", v->name, v->unsup);
    rc = issue_add(holder, out, v->unsup, where, 0, first);
  }
  for (int i = 0; rc == 0 && i < g->n_sub; i++) {
    const es_sub_issue *s = &g->sub[i];
    if (s->owner >= 0 && s->owner <= max_fi && live[s->owner])
      rc = issue_add(holder, out, s->what, s->where, 1, s->first);
  }
out:
  es_mem_free(listed);
  es_mem_free(live);
  return rc;
}

int es__graph_issues(const es_graph *g, es_issues *out) { return issues_in(g, out, NULL); }
