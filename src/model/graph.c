/* Graph IR plumbing: node helpers, topological ordering, dead-node removal
 * and sealing the constants into the weights. */
#include "model/graph.h"
#include "common/internal.h"

#include <stdio.h>
#include <string.h>

/* ==========================================================================
 * Node helpers
 * ======================================================================== */

const es_attr *es__node_attr(const es_node *n, const char *name) {
  return es__attr_find(n->attrs, n->n_attr, name);
}

const char *es__node_label(const es_node *n, char *buf, size_t size) {
  return es__op_label(n->name, n->file_index, n->op, buf, size);
}

/* ==========================================================================
 * Topological order (Kahn's algorithm) and pruning
 * ======================================================================== */

int es__graph_toposort(es_graph *g) {
  int n = g->n_nodes, nv = g->n_values;
  if (n == 0)
    return 0;
  /* Consumer lists in CSR form: first[v]..first[v+1] index into cons[]. */
  size_t edges = 0;
  for (int i = 0; i < n; i++)
    edges += (size_t)g->nodes[i].n_in;
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
    for (int k = 0; k < g->nodes[i].n_in; k++)
      if (g->nodes[i].in[k] >= 0)
        first[g->nodes[i].in[k] + 1]++;
  for (int v = 0; v < nv; v++)
    first[v + 1] += first[v];
  int *fill = es_mem_calloc(ES_MEM_MODEL, (size_t)nv + 1, sizeof(int));
  if (!fill) {
    rc = es__fail(ES_ENOMEM, "out of memory sorting %d nodes", n);
    goto out;
  }
  for (int i = 0; i < n; i++)
    for (int k = 0; k < g->nodes[i].n_in; k++) {
      int v = g->nodes[i].in[k];
      if (v >= 0)
        cons[first[v] + fill[v]++] = i;
    }
  es_mem_free(fill);

  int head = 0, tail = 0;
  for (int i = 0; i < n; i++) {
    for (int k = 0; k < g->nodes[i].n_in; k++) {
      int v = g->nodes[i].in[k];
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

int es__graph_const_append(es_graph *g, const char *name, es_dtype dtype, int rank,
                           const int64_t *dims, void *data, size_t nbytes, int *out) {
  if (g->n_values >= g->cap_values) {
    /* The loader's estimate leaves slack (every attribute counts), so this
     * is rare; the old array stays in the context until the graph goes. */
    if (g->n_values > (1 << 28)) {
      es_mem_free(data);
      return es__fail(ES_EMODEL, "the graph has too many values to add a constant");
    }
    int cap = g->n_values < 8 ? 16 : g->n_values * 2;
    es_value *nv = es__ctx_alloc(&g->ctx, (size_t)cap * sizeof *nv);
    if (!nv) {
      es_mem_free(data);
      return es__fail(ES_ENOMEM, "out of memory adding a constant");
    }
    memcpy(nv, g->values, (size_t)g->n_values * sizeof *nv);
    g->values = nv;
    g->cap_values = cap;
  }
  const char *nm = es__ctx_strdup(&g->ctx, name);
  if (!nm) {
    es_mem_free(data);
    return es__fail(ES_ENOMEM, "out of memory adding a constant");
  }
  int v = g->n_values++;
  es_value *val = &g->values[v];
  memset(val, 0, sizeof *val);
  val->name = nm;
  val->dtype = dtype;
  val->rank = rank;
  if (rank > 0)
    memcpy(val->dims, dims, (size_t)rank * sizeof *dims);
  val->kind = ES_VALUE_CONST;
  val->producer = -1;
  val->data = data;
  val->nbytes = nbytes;
  *out = v;
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

int es__graph_seal(es_graph *g) {
  if (g->weights)
    return es__fail(ES_ESTATE, "the graph's weights are already sealed");
  int nv = g->n_values;
  unsigned char *live = es_mem_calloc(ES_MEM_MODEL, (size_t)nv + 1, 1);
  size_t *offset = es_mem_calloc(ES_MEM_MODEL, (size_t)nv + 1, sizeof *offset);
  int rc = 0;
  if (!live || !offset) {
    rc = es__fail(ES_ENOMEM, "out of memory sealing the weights");
    goto out;
  }
  const_mark_live(g, live);
  size_t total = 0, count = 0;
  for (int v = 0; v < nv; v++) {
    const es_value *val = &g->values[v];
    if (val->kind != ES_VALUE_CONST || !live[v])
      continue;
    size_t off = es__align_up(total, ES_WEIGHT_ALIGN);
    if ((off == 0 && total) || val->nbytes > SIZE_MAX - off) {
      rc = es__fail(ES_EMODEL, "constant data size overflows");
      goto out;
    }
    offset[v] = off;
    total = off + val->nbytes;
    count++;
  }
  /* Fill and seal a region of our own first: if any step fails, the staging
   * blocks are untouched and still the graph's to free. */
  es_weights *w = NULL;
  void *base;
  rc = es_weights_create(total ? total : 1, &w);
  if (rc == 0)
    rc = es_weights_data_mut(w, &base);
  for (int v = 0; rc == 0 && v < nv; v++)
    if (g->values[v].kind == ES_VALUE_CONST && live[v] && g->values[v].nbytes)
      memcpy((unsigned char *)base + offset[v], g->values[v].data, g->values[v].nbytes);
  if (rc == 0)
    rc = es_weights_seal(w);
  if (rc < 0) {
    es_weights_release(w);
    goto out;
  }
  const unsigned char *ro = es_weights_data(w);
  for (int v = 0; v < nv; v++) {
    es_value *val = &g->values[v];
    if (val->kind != ES_VALUE_CONST)
      continue;
    es_mem_free((void *)val->data);
    val->data = live[v] ? ro + offset[v] : NULL;
  }
  g->weights = w;
  g->weight_bytes = total;
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

void es__graph_fini(es_graph *g) {
  if (!g)
    return;
  if (g->weights)
    es_weights_release(g->weights);
  else /* still staging: every constant's data is its own block (or NULL) */
    for (int v = 0; v < g->n_values; v++)
      if (g->values[v].kind == ES_VALUE_CONST)
        es_mem_free((void *)g->values[v].data);
  es__ctx_free_all(&g->ctx);
  memset(g, 0, sizeof *g);
}
