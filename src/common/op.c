/* The operator table and attribute lookup (see common/op.h). */
#include "common/op.h"

#include <stdio.h>
#include <string.h>

static const struct {
  const char *name;
  int min_opset;
} es_ops_[ES_OP_COUNT] = {
    [ES_OP_UNKNOWN] = {"?", 0},
#define ES_OP_ROW_(nm, minv) [ES_OP_##nm] = {#nm, minv},
    ES_OP_MAP(ES_OP_ROW_)
#undef ES_OP_ROW_
};

es_op es__op_from_name(const char *name) {
  if (!name)
    return ES_OP_UNKNOWN;
  for (int i = 1; i < ES_OP_COUNT; i++)
    if (es_ops_[i].min_opset != ES_OP_INTERNAL && es_ops_[i].min_opset != ES_OP_MS &&
        !strcmp(es_ops_[i].name, name))
      return (es_op)i;
  return ES_OP_UNKNOWN;
}

es_op es__op_from_domain(const char *dom, const char *name) {
  if (!dom || !name || strcmp(dom, "com.microsoft"))
    return ES_OP_UNKNOWN;
  for (int i = 1; i < ES_OP_COUNT; i++)
    if (es_ops_[i].min_opset == ES_OP_MS && !strcmp(es_ops_[i].name, name))
      return (es_op)i;
  return ES_OP_UNKNOWN;
}

const char *es__op_name(es_op op) {
  return (unsigned)op < ES_OP_COUNT ? es_ops_[op].name : "?";
}

int es__op_min_opset(es_op op) { return (unsigned)op < ES_OP_COUNT ? es_ops_[op].min_opset : 0; }

const char *es__op_label(const char *name, int index, es_op op, char *buf, size_t size) {
  if (name && name[0])
    snprintf(buf, size, "node '%s' (#%d %s)", name, index, es__op_name(op));
  else
    snprintf(buf, size, "node #%d (%s)", index, es__op_name(op));
  return buf;
}

const es_attr *es__attr_find(const es_attr *attrs, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (!strcmp(attrs[i].name, name))
      return &attrs[i];
  return NULL;
}
