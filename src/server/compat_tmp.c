/* Placeholder until the control-plane work lands (replaced by repo.c and guard.c). */
#include "common/internal.h"
#include "server/server_internal.h"

int es__srv_guard_control(const es_server_config *cfg, const char *authorization,
                          const char *origin, const char *host, const char *content_type,
                          char *why, size_t whylen) {
  (void)cfg; (void)authorization; (void)origin; (void)host; (void)content_type; (void)why;
  (void)whylen;
  return 0;
}

int es__srv_level_of(const es_server *s, const srv_model *sm, int has_priority,
                     uint64_t priority) {
  if (!has_priority || priority == 0)
    return sm->priority;
  uint64_t l = priority - 1;
  uint64_t last = (uint64_t)s->cfg.runtime.priorities - 1;
  return (int)(l > last ? last : l);
}

int es__srv_model_acquire(es_server *s, srv_model *sm, int *rt_id) {
  pthread_mutex_lock(&s->mu);
  int id = sm->rt_id;
  if (id >= 0)
    atomic_fetch_add(&sm->busy, 1);
  pthread_mutex_unlock(&s->mu);
  if (id < 0)
    return es__fail(ES_ENOENT, "model '%s' is not loaded", sm->name);
  *rt_id = id;
  return 0;
}

void es__srv_model_release(es_server *s, srv_model *sm) {
  (void)s;
  atomic_fetch_sub(&sm->busy, 1);
}
