/* Admission: the gate in front of the queues (BRIEF §5).
 *
 * Three things can run out on a small device: memory the kernel will give
 * us, memory we promised to requests, and execution slots. The gate keeps a
 * counter for each and moves it only with compare-and-swap inside its
 * limit, so the invariants (reserved <= budget, in flight <= limit) hold at
 * every instant, not just on average. A request that fails a later check
 * gives back what the earlier ones took; in between, another thread may be
 * refused because of bytes about to be returned, which errs on the safe side.
 *
 * Memory pressure is not measured here: whoever owns a timer feeds
 * es_memstat snapshots to es_admission_observe, which turns them into a level
 * the admit path reads with one atomic load.
 *
 * Retry-after comes from how fast work drains. Each completion updates an
 * EWMA of the interval between completions (overall and per model) under a
 * short lock; the results are published in atomics so a refusal computes its
 * estimate without a lock. An interval sample is capped at the request's own
 * duration: a gap longer than that means the lane sat idle, which says
 * nothing about its speed. The other way round, when work is in flight and
 * nothing has completed for longer than the average interval, the estimate
 * uses that longer gap, so a stalled lane stops promising quick retries. */
#include "edgeserve/runtime.h"
#include "common/internal.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#define ADM_MAGIC 0x455341444d495421ull   /* "ESADMIT!" while live */
#define ADM_DEAD 0x455341444445414eull    /* after destroy */
#define TICKET_LIVE 0x45535449434b4554ull /* "ESTICKET" */
#define TICKET_DONE 0x4553544b444f4e45ull /* "ESTKDONE" */
#define TICKET_BYTES 0x4553544b42595445ull /* "ESTKBYTE": bytes, no slot */

#define ADM_LINE 64
#define ADM_MAX_MODELS 65536
#define EWMA_ALPHA 0.2
#define RETRY_MIN_MS 1u
#define RETRY_MAX_MS 60000u

/* ---- the drain-rate estimator ---------------------------------------------- */

typedef struct drain_est {
  /* Under the gate's est_lock. */
  double interval_ns; /* EWMA of the interval between completions */
  double service_ns;  /* EWMA of the durations given to done */
  double bytes;       /* EWMA of the bytes a completion releases */
  uint64_t last_ns;   /* latest completion */
  uint64_t n;         /* completions seen */
  /* Published copies for lock-free readers (doubles as their bits). */
  _Atomic uint64_t pub_interval, pub_bytes, pub_last_ns, pub_n;
  _Atomic uint64_t busy_since; /* when in flight last went from 0 to 1 */
} drain_est;

static uint64_t dbits(double d) {
  uint64_t u;
  memcpy(&u, &d, sizeof u);
  return u;
}

static double bitsd(uint64_t u) {
  double d;
  memcpy(&d, &u, sizeof d);
  return d;
}

static void est_update(drain_est *e, uint64_t now, uint64_t duration, size_t bytes,
                       unsigned inflight_before) {
  double d = duration ? (double)duration : 1.0;
  if (e->n == 0) {
    /* No interval yet: c requests in flight each taking d complete about
     * every d / c. */
    e->interval_ns = d / (inflight_before ? inflight_before : 1);
    e->service_ns = d;
    e->bytes = (double)bytes;
  } else {
    uint64_t gap = now > e->last_ns ? now - e->last_ns : 0;
    double sample = (double)gap < d ? (double)gap : d;
    e->interval_ns += EWMA_ALPHA * (sample - e->interval_ns);
    e->service_ns += EWMA_ALPHA * (d - e->service_ns);
    e->bytes += EWMA_ALPHA * ((double)bytes - e->bytes);
  }
  if (now > e->last_ns)
    e->last_ns = now;
  e->n++;
  atomic_store_explicit(&e->pub_interval, dbits(e->interval_ns), memory_order_relaxed);
  atomic_store_explicit(&e->pub_bytes, dbits(e->bytes), memory_order_relaxed);
  atomic_store_explicit(&e->pub_last_ns, e->last_ns, memory_order_relaxed);
  atomic_store_explicit(&e->pub_n, e->n, memory_order_release);
}

/* Nanoseconds per completion now; 0 before any completion. */
static double est_interval(drain_est *e, uint64_t now, unsigned inflight) {
  if (atomic_load_explicit(&e->pub_n, memory_order_acquire) == 0)
    return 0;
  double iv = bitsd(atomic_load_explicit(&e->pub_interval, memory_order_relaxed));
  /* Stalled: work in flight and nothing done for longer than usual. The
   * wait counts from the later of the last completion and the moment work
   * arrived after an idle spell. */
  uint64_t last = atomic_load_explicit(&e->pub_last_ns, memory_order_relaxed);
  uint64_t busy = atomic_load_explicit(&e->busy_since, memory_order_relaxed);
  if (busy > last)
    last = busy;
  if (inflight > 0 && now > last && (double)(now - last) > iv)
    iv = (double)(now - last);
  return iv < 1.0 ? 1.0 : iv;
}

/* ---- the gate ------------------------------------------------------------------ */

typedef struct model_slot {
  _Alignas(ADM_LINE) _Atomic unsigned inflight;
  _Atomic unsigned limit; /* 0: none */
  _Atomic int draining;
  _Atomic uint64_t admitted, completed, refused;
  drain_est est;
} model_slot;

struct es_admission {
  uint64_t magic;
  size_t max_models;
  size_t budget; /* 0: none */
  unsigned max_total;
  double soft_ratio, hard_ratio;
  uint32_t default_retry_ms;
  es_clock_fn clock;
  void *clock_user;
  model_slot *models;

  /* The admit path's counters, each pair on its own line. */
  _Alignas(ADM_LINE) _Atomic size_t reserved;
  _Atomic size_t peak_reserved;
  _Alignas(ADM_LINE) _Atomic unsigned inflight;
  _Atomic unsigned peak_inflight;
  _Alignas(ADM_LINE) _Atomic int draining;
  _Atomic int pressure;
  _Atomic size_t mem_used, mem_soft, mem_hard;
  _Atomic uint64_t admitted, completed;
  _Atomic uint64_t refused_by[ES_REFUSE_COUNT];

  pthread_mutex_t obs_lock; /* the fields below */
  es_memstat prev;          /* previous observation, for event deltas */
  uint64_t observations;
  uint64_t high_events, max_events, oom_events;

  pthread_mutex_t est_lock; /* every drain_est's EWMA fields */
  drain_est est;            /* overall */
};

static uint64_t mono_ns(void *user) {
  (void)user;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t now_ns(const es_admission *a) { return a->clock(a->clock_user); }

static void lock(pthread_mutex_t *m) {
  int rc = pthread_mutex_lock(m);
  ES_ASSERT(rc == 0);
}

static void unlock(pthread_mutex_t *m) {
  int rc = pthread_mutex_unlock(m);
  ES_ASSERT(rc == 0);
}

static void max_size(_Atomic size_t *peak, size_t v) {
  size_t cur = atomic_load_explicit(peak, memory_order_relaxed);
  while (cur < v &&
         !atomic_compare_exchange_weak_explicit(peak, &cur, v, memory_order_relaxed,
                                                memory_order_relaxed))
    ;
}

static void max_unsigned(_Atomic unsigned *peak, unsigned v) {
  unsigned cur = atomic_load_explicit(peak, memory_order_relaxed);
  while (cur < v &&
         !atomic_compare_exchange_weak_explicit(peak, &cur, v, memory_order_relaxed,
                                                memory_order_relaxed))
    ;
}

static int gate_check(const es_admission *a, const char *fn) {
  if (!a)
    return es__fail(ES_EINVAL, "%s: NULL gate", fn);
  if (a->magic != ADM_MAGIC)
    return es__fail(ES_ECORRUPT, "%s: not a live admission gate", fn);
  return 0;
}

static int model_check(const es_admission *a, int model_id, const char *fn) {
  if (model_id < 0 || (size_t)model_id >= a->max_models)
    return es__fail(ES_EINVAL, "%s: model id %d out of range [0, %zu)", fn, model_id,
                    a->max_models);
  return 0;
}

const char *es_refusal_name(int reason) {
  switch (reason) {
  case ES_REFUSE_NONE:
    return "none";
#define ES_REFUSAL_NAME_(name, str) \
  case ES_REFUSE_##name:            \
    return str;
    ES_REFUSAL_MAP(ES_REFUSAL_NAME_)
#undef ES_REFUSAL_NAME_
  default:
    return "?";
  }
}

void es_admission_config_default(es_admission_config *cfg) {
  if (!cfg)
    return;
  memset(cfg, 0, sizeof *cfg);
  cfg->max_models = 64;
  cfg->soft_ratio = 0.85;
  cfg->hard_ratio = 0.95;
  cfg->default_retry_ms = 1000;
}

int es_admission_create(const es_admission_config *cfg, es_admission **out) {
  if (!cfg || !out)
    return es__fail(ES_EINVAL, "es_admission_create: NULL %s", cfg ? "out" : "config");
  if (cfg->max_models < 1 || cfg->max_models > ADM_MAX_MODELS)
    return es__fail(ES_EINVAL, "es_admission_create: max_models %zu not in [1, %d]",
                    cfg->max_models, ADM_MAX_MODELS);
  if (!(cfg->soft_ratio > 0 && cfg->soft_ratio <= cfg->hard_ratio && cfg->hard_ratio <= 1))
    return es__fail(ES_EINVAL,
                    "es_admission_create: need 0 < soft_ratio <= hard_ratio <= 1, got "
                    "soft_ratio %g, hard_ratio %g",
                    cfg->soft_ratio, cfg->hard_ratio);
  if (cfg->default_retry_ms < RETRY_MIN_MS || cfg->default_retry_ms > RETRY_MAX_MS)
    return es__fail(ES_EINVAL, "es_admission_create: default_retry_ms %u not in [%u, %u]",
                    cfg->default_retry_ms, RETRY_MIN_MS, RETRY_MAX_MS);

  size_t head = es__align_up(sizeof(es_admission), ADM_LINE);
  size_t total = head + cfg->max_models * sizeof(model_slot);
  es_admission *a = es_mem_aligned_alloc(ES_MEM_RUNTIME, ADM_LINE, total);
  if (!a)
    return es__fail(ES_ENOMEM, "es_admission_create: cannot allocate %zu B", total);
  memset(a, 0, total);
  if (pthread_mutex_init(&a->obs_lock, NULL) != 0) {
    es_mem_free(a);
    return es__fail(ES_ENOMEM, "es_admission_create: pthread_mutex_init failed");
  }
  if (pthread_mutex_init(&a->est_lock, NULL) != 0) {
    pthread_mutex_destroy(&a->obs_lock);
    es_mem_free(a);
    return es__fail(ES_ENOMEM, "es_admission_create: pthread_mutex_init failed");
  }
  a->max_models = cfg->max_models;
  a->budget = cfg->memory_budget_bytes;
  a->max_total = cfg->max_inflight_total;
  a->soft_ratio = cfg->soft_ratio;
  a->hard_ratio = cfg->hard_ratio;
  a->default_retry_ms = cfg->default_retry_ms;
  a->clock = cfg->clock ? cfg->clock : mono_ns;
  a->clock_user = cfg->clock_user;
  a->models = (model_slot *)((unsigned char *)a + head);
  for (size_t i = 0; i < a->max_models; i++)
    atomic_store_explicit(&a->models[i].limit, cfg->model_max_inflight, memory_order_relaxed);
  a->magic = ADM_MAGIC;
  *out = a;
  return 0;
}

int es_admission_destroy(es_admission *a) {
  if (!a)
    return 0;
  int rc = gate_check(a, "es_admission_destroy");
  if (rc < 0)
    return rc;
  unsigned n = atomic_load(&a->inflight);
  if (n > 0)
    return es__fail(ES_EBUSY, "es_admission_destroy: %u requests still admitted", n);
  size_t held = atomic_load(&a->reserved);
  if (held > 0)
    return es__fail(ES_EBUSY, "es_admission_destroy: %zu B still reserved", held);
  a->magic = ADM_DEAD;
  pthread_mutex_destroy(&a->obs_lock);
  pthread_mutex_destroy(&a->est_lock);
  es_mem_free(a);
  return 0;
}

/* ---- refusals ------------------------------------------------------------------ */

static uint32_t clamp_ms(double ms) {
  if (!(ms >= RETRY_MIN_MS)) /* also NaN */
    return RETRY_MIN_MS;
  if (ms >= RETRY_MAX_MS)
    return RETRY_MAX_MS;
  return (uint32_t)ceil(ms);
}

/* Time to drain `units` completions (or bytes) at e's rate. */
static uint32_t retry_after(const es_admission *a, drain_est *e, unsigned inflight,
                            double units, int in_bytes) {
  double iv = est_interval(e, now_ns(a), inflight);
  if (iv == 0)
    return a->default_retry_ms;
  if (in_bytes) {
    double per = bitsd(atomic_load_explicit(&e->pub_bytes, memory_order_relaxed));
    if (!(per > 0))
      return a->default_retry_ms; /* completions release no bytes */
    units /= per;
  }
  return clamp_ms(units * iv / 1e6);
}

/* Count a refusal and describe it. */
static void record(es_admission *a, model_slot *m, int model_id, int reason, uint64_t requested,
                   uint64_t in_use, uint64_t limit, uint32_t retry_ms, es_refusal *why) {
  atomic_fetch_add_explicit(&a->refused_by[reason], 1, memory_order_relaxed);
  if (m)
    atomic_fetch_add_explicit(&m->refused, 1, memory_order_relaxed);
  why->reason = reason;
  why->model_id = model_id;
  why->retry_after_ms = retry_ms;
  why->requested = requested;
  why->in_use = in_use;
  why->limit = limit;
}

/* The same, as es_admission_try's answer: ES_EAGAIN with a detail. */
static int refuse(es_admission *a, model_slot *m, int model_id, int reason, uint64_t requested,
                  uint64_t in_use, uint64_t limit, uint32_t retry_ms, es_refusal *why) {
  record(a, m, model_id, reason, requested, in_use, limit, retry_ms, why);
  const char *unit = (reason == ES_REFUSE_OVER_MEMORY || reason == ES_REFUSE_MEMORY_PRESSURE)
                         ? " B"
                         : "";
  return es__fail(ES_EAGAIN,
                  "admission refused (%s): model %d requested %llu%s, in use %llu%s of "
                  "%llu%s; retry after %u ms",
                  es_refusal_name(reason), model_id, (unsigned long long)requested, unit,
                  (unsigned long long)in_use, unit, (unsigned long long)limit, unit, retry_ms);
}

int es_admission_refuse(es_admission *a, int model_id, int reason, size_t backlog,
                        es_refusal *why) {
  int rc = gate_check(a, "es_admission_refuse");
  if (rc < 0)
    return rc;
  if (!why)
    return es__fail(ES_EINVAL, "es_admission_refuse: NULL why");
  if (reason <= ES_REFUSE_NONE || reason >= ES_REFUSE_COUNT)
    return es__fail(ES_EINVAL, "es_admission_refuse: bad reason %d", reason);
  if (model_id != -1 && (rc = model_check(a, model_id, "es_admission_refuse")) < 0)
    return rc;
  model_slot *m = model_id >= 0 ? &a->models[model_id] : NULL;
  drain_est *e = m ? &m->est : &a->est;
  unsigned inflight = atomic_load_explicit(m ? &m->inflight : &a->inflight, memory_order_relaxed);
  uint32_t ms = retry_after(a, e, inflight, (double)backlog + 1, 0);
  /* Recording is a success: the caller's last failure detail is kept. */
  record(a, m, model_id, reason, 1, backlog, backlog, ms, why);
  return 0;
}

/* ---- admit and done ---------------------------------------------------------- */

/* Take one slot of c unless that would pass limit (0: none). *seen is the
 * count the decision was made on. */
static int slot_take(_Atomic unsigned *c, unsigned limit, unsigned *seen) {
  unsigned cur = atomic_load_explicit(c, memory_order_relaxed);
  do {
    if (limit && cur >= limit) {
      *seen = cur;
      return 0;
    }
  } while (!atomic_compare_exchange_weak_explicit(c, &cur, cur + 1, memory_order_acq_rel,
                                                  memory_order_relaxed));
  *seen = cur + 1;
  return 1;
}

/* Give one slot of c back unless it is already 0. *before is the count
 * before. */
static int slot_give(_Atomic unsigned *c, unsigned *before) {
  unsigned cur = atomic_load_explicit(c, memory_order_relaxed);
  do {
    if (cur == 0)
      return 0;
  } while (!atomic_compare_exchange_weak_explicit(c, &cur, cur - 1, memory_order_acq_rel,
                                                  memory_order_relaxed));
  *before = cur;
  return 1;
}

/* Checks 1 to 3 (draining, pressure, the budget), shared by admitted
 * requests and byte reservations: on success the bytes are reserved. */
static int reserve_bytes(es_admission *a, model_slot *m, int model_id, size_t bytes,
                         es_refusal *why) {
  /* 1. Draining. */
  if (atomic_load_explicit(&a->draining, memory_order_relaxed) ||
      atomic_load_explicit(&m->draining, memory_order_relaxed))
    return refuse(a, m, model_id, ES_REFUSE_DRAINING, 1, 0, 0, a->default_retry_ms, why);

  /* 2. The kernel's view of memory. */
  if (atomic_load_explicit(&a->pressure, memory_order_acquire) >= ES_PRESSURE_SOFT) {
    size_t used = atomic_load_explicit(&a->mem_used, memory_order_relaxed);
    size_t soft = atomic_load_explicit(&a->mem_soft, memory_order_relaxed);
    double excess = (double)(used > soft ? used - soft : 0) + (double)bytes;
    uint32_t ms = retry_after(a, &a->est, atomic_load(&a->inflight), excess, 1);
    return refuse(a, m, model_id, ES_REFUSE_MEMORY_PRESSURE, bytes, used, soft, ms, why);
  }

  /* 3. The budget: reserve exactly bytes. */
  if (a->budget && bytes > a->budget) {
    record(a, m, model_id, ES_REFUSE_OVER_MEMORY, bytes,
           atomic_load_explicit(&a->reserved, memory_order_relaxed), a->budget, 0, why);
    return es__fail(ES_ENOSPC,
                    "admission: model %d request needs %zu B, more than the whole memory "
                    "budget of %zu B: it can never be admitted",
                    model_id, bytes, a->budget);
  }
  size_t cur = atomic_load_explicit(&a->reserved, memory_order_relaxed);
  for (;;) {
    size_t want = cur + bytes;
    if (want < cur || (a->budget && want > a->budget)) {
      size_t limit = a->budget ? a->budget : SIZE_MAX;
      double missing = want < cur ? (double)bytes : (double)(want - limit);
      uint32_t ms = retry_after(a, &a->est, atomic_load(&a->inflight), missing, 1);
      return refuse(a, m, model_id, ES_REFUSE_OVER_MEMORY, bytes, cur, limit, ms, why);
    }
    if (atomic_compare_exchange_weak_explicit(&a->reserved, &cur, want, memory_order_acq_rel,
                                              memory_order_relaxed))
      break;
  }
  max_size(&a->peak_reserved, cur + bytes);
  return 0;
}

static int try_args(es_admission *a, int model_id, es_admit_ticket *t, es_refusal *why,
                    const char *fn) {
  int rc = gate_check(a, fn);
  if (rc < 0)
    return rc;
  if (!t || !why)
    return es__fail(ES_EINVAL, "%s: NULL %s", fn, t ? "why" : "ticket");
  return model_check(a, model_id, fn);
}

int es_admission_try(es_admission *a, int model_id, size_t bytes, es_admit_ticket *t,
                     es_refusal *why) {
  int rc = try_args(a, model_id, t, why, "es_admission_try");
  if (rc < 0)
    return rc;
  model_slot *m = &a->models[model_id];
  if ((rc = reserve_bytes(a, m, model_id, bytes, why)) < 0)
    return rc;

  /* 4. The total slot, 5. the model's slot. */
  unsigned seen;
  if (!slot_take(&a->inflight, a->max_total, &seen)) {
    atomic_fetch_sub_explicit(&a->reserved, bytes, memory_order_acq_rel);
    uint32_t ms = retry_after(a, &a->est, seen, (double)(seen - a->max_total) + 1, 0);
    return refuse(a, m, model_id, ES_REFUSE_OVER_CONCURRENCY, 1, seen, a->max_total, ms, why);
  }
  unsigned total_seen = seen;
  unsigned mlimit = atomic_load_explicit(&m->limit, memory_order_relaxed);
  if (!slot_take(&m->inflight, mlimit, &seen)) {
    atomic_fetch_sub_explicit(&a->inflight, 1, memory_order_acq_rel);
    atomic_fetch_sub_explicit(&a->reserved, bytes, memory_order_acq_rel);
    uint32_t ms = retry_after(a, &m->est, seen, (double)(seen - mlimit) + 1, 0);
    return refuse(a, m, model_id, ES_REFUSE_OVER_CONCURRENCY, 1, seen, mlimit, ms, why);
  }
  uint64_t now = now_ns(a);
  if (total_seen == 1)
    atomic_store_explicit(&a->est.busy_since, now, memory_order_relaxed);
  if (seen == 1)
    atomic_store_explicit(&m->est.busy_since, now, memory_order_relaxed);
  max_unsigned(&a->peak_inflight, total_seen);
  atomic_fetch_add_explicit(&a->admitted, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&m->admitted, 1, memory_order_relaxed);

  t->magic = TICKET_LIVE;
  t->owner = a;
  t->model_id = model_id;
  t->bytes = bytes;
  t->admitted_ns = now;
  return 0;
}

/* Bytes without a slot: memory a caller holds on a model's behalf (a
 * decoded image, pre-processing buffers) is budgeted like a request's, but
 * takes no concurrency slot, since the model's own requests must still be
 * admitted while it is held. */
int es_admission_reserve(es_admission *a, int model_id, size_t bytes, es_admit_ticket *t,
                         es_refusal *why) {
  int rc = try_args(a, model_id, t, why, "es_admission_reserve");
  if (rc < 0)
    return rc;
  model_slot *m = &a->models[model_id];
  if ((rc = reserve_bytes(a, m, model_id, bytes, why)) < 0)
    return rc;
  t->magic = TICKET_BYTES;
  t->owner = a;
  t->model_id = model_id;
  t->bytes = bytes;
  t->admitted_ns = now_ns(a);
  return 0;
}

int es_admission_grow(es_admission *a, es_admit_ticket *t, size_t bytes, es_refusal *why) {
  int rc = gate_check(a, "es_admission_grow");
  if (rc < 0)
    return rc;
  if (!t || !why || (t->magic != TICKET_BYTES && t->magic != TICKET_LIVE) || t->owner != a ||
      t->model_id < 0 || (size_t)t->model_id >= a->max_models)
    return es__fail(ES_EINVAL, "es_admission_grow: not a live reservation of this gate");
  if (bytes > SIZE_MAX - t->bytes)
    return es__fail(ES_EINVAL, "es_admission_grow: size overflows");
  if ((rc = reserve_bytes(a, &a->models[t->model_id], t->model_id, bytes, why)) < 0)
    return rc;
  t->bytes += bytes;
  return 0;
}

int es_admission_shrink(es_admission *a, es_admit_ticket *t, size_t bytes) {
  int rc = gate_check(a, "es_admission_shrink");
  if (rc < 0)
    return rc;
  if (!t || (t->magic != TICKET_BYTES && t->magic != TICKET_LIVE) || t->owner != a)
    return es__fail(ES_EINVAL, "es_admission_shrink: not a live reservation of this gate");
  if (bytes > t->bytes)
    return es__fail(ES_EINVAL, "es_admission_shrink: %zu B of a reservation of %zu B", bytes,
                    t->bytes);
  size_t res = atomic_load_explicit(&a->reserved, memory_order_relaxed);
  do {
    if (res < bytes)
      return es__fail(ES_ECORRUPT, "es_admission_shrink: %zu B, only %zu B reserved", bytes, res);
  } while (!atomic_compare_exchange_weak_explicit(&a->reserved, &res, res - bytes,
                                                  memory_order_acq_rel, memory_order_relaxed));
  t->bytes -= bytes;
  return 0;
}

static int ticket_release(es_admission *a, es_admit_ticket *t, uint64_t duration_ns, int feed);

int es_admission_done(es_admission *a, es_admit_ticket *t, uint64_t duration_ns) {
  return ticket_release(a, t, duration_ns, 1);
}

int es_admission_cancel(es_admission *a, es_admit_ticket *t) {
  return ticket_release(a, t, 0, 0);
}

/* A reservation without slots: only the bytes go back, and nothing feeds
 * the estimators (holding an image is not a completion). */
static int bytes_release(es_admission *a, es_admit_ticket *t) {
  size_t res = atomic_load_explicit(&a->reserved, memory_order_relaxed);
  do {
    if (res < t->bytes)
      return es__fail(ES_ECORRUPT, "es_admission_done: reservation of %zu B, only %zu B "
                      "reserved (a copied ticket?)", t->bytes, res);
  } while (!atomic_compare_exchange_weak_explicit(&a->reserved, &res, res - t->bytes,
                                                  memory_order_acq_rel, memory_order_relaxed));
  t->magic = TICKET_DONE;
  return 0;
}

/* The counters go back either way; only a request that ran says anything
 * about the drain rate, so cancellations leave the estimators alone. */
static int ticket_release(es_admission *a, es_admit_ticket *t, uint64_t duration_ns, int feed) {
  int rc = gate_check(a, "es_admission_done");
  if (rc < 0)
    return rc;
  if (!t)
    return es__fail(ES_EINVAL, "es_admission_done: NULL ticket");
  if (t->magic == TICKET_DONE)
    return es__fail(ES_EDOUBLEFREE, "es_admission_done: ticket already done");
  if (t->magic != TICKET_LIVE && t->magic != TICKET_BYTES)
    return es__fail(ES_ECORRUPT, "es_admission_done: not an admitted ticket");
  if (t->owner != a)
    return es__fail(ES_EFOREIGN, "es_admission_done: ticket of another gate");
  if (t->model_id < 0 || (size_t)t->model_id >= a->max_models)
    return es__fail(ES_ECORRUPT, "es_admission_done: ticket model id %d out of range",
                    t->model_id);
  if (t->magic == TICKET_BYTES)
    return bytes_release(a, t);
  model_slot *m = &a->models[t->model_id];
  uint64_t now = now_ns(a);
  if (!duration_ns)
    duration_ns = now > t->admitted_ns ? now - t->admitted_ns : 0;

  /* A copy of a ticket already done could take the counters below zero:
   * refuse it rather than wrap, putting back whatever was taken. */
  unsigned m_before, before;
  if (!slot_give(&m->inflight, &m_before))
    return es__fail(ES_ECORRUPT, "es_admission_done: model %d has nothing in flight "
                    "(a copied ticket?)", t->model_id);
  if (!slot_give(&a->inflight, &before)) {
    atomic_fetch_add_explicit(&m->inflight, 1, memory_order_acq_rel);
    return es__fail(ES_ECORRUPT, "es_admission_done: nothing in flight (a copied ticket?)");
  }
  size_t res = atomic_load_explicit(&a->reserved, memory_order_relaxed);
  do {
    if (res < t->bytes) {
      atomic_fetch_add_explicit(&a->inflight, 1, memory_order_acq_rel);
      atomic_fetch_add_explicit(&m->inflight, 1, memory_order_acq_rel);
      return es__fail(ES_ECORRUPT, "es_admission_done: ticket holds %zu B, only %zu B "
                      "reserved (a copied ticket?)", t->bytes, res);
    }
  } while (!atomic_compare_exchange_weak_explicit(&a->reserved, &res, res - t->bytes,
                                                  memory_order_acq_rel, memory_order_relaxed));
  t->magic = TICKET_DONE;
  atomic_fetch_add_explicit(&a->completed, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&m->completed, 1, memory_order_relaxed);
  if (!feed)
    return 0;

  lock(&a->est_lock);
  est_update(&a->est, now, duration_ns, t->bytes, before);
  est_update(&m->est, now, duration_ns, t->bytes, m_before);
  unlock(&a->est_lock);
  return 0;
}

/* ---- memory observations --------------------------------------------------- */

typedef struct watermark {
  size_t used, soft, hard;
  int level;
} watermark;

static watermark mark_of(const es_admission *a, size_t used, size_t limit) {
  watermark w;
  w.used = used;
  w.soft = (size_t)((double)limit * a->soft_ratio);
  w.hard = (size_t)((double)limit * a->hard_ratio);
  w.level = used > w.hard ? ES_PRESSURE_HARD
            : used > w.soft ? ES_PRESSURE_SOFT
                            : ES_PRESSURE_NONE;
  return w;
}

static uint64_t delta(uint64_t now, uint64_t before) {
  return now >= before ? now - before : now; /* a counter reset: a new group */
}

int es_admission_observe(es_admission *a, const es_memstat *st) {
  int rc = gate_check(a, "es_admission_observe");
  if (rc < 0)
    return rc;
  if (!st)
    return es__fail(ES_EINVAL, "es_admission_observe: NULL memstat");

  /* The group: the kernel acts at min(high, max); page cache it can drop
   * first does not count. The machine: what MemAvailable says is left. */
  watermark w = {0, 0, 0, ES_PRESSURE_NONE};
  int have = 0;
  size_t glimit = st->high < st->max ? st->high : st->max;
  if (st->version > 0 && glimit != SIZE_MAX) {
    size_t ws = st->current - (st->inactive_file < st->current ? st->inactive_file : st->current);
    w = mark_of(a, ws, glimit);
    have = 1;
  }
  if (st->mem_total > 0) {
    size_t avail = st->mem_available < st->mem_total ? st->mem_available : st->mem_total;
    watermark s = mark_of(a, st->mem_total - avail, st->mem_total);
    /* The binding one: the higher level, or the nearer its soft mark. */
    if (!have || s.level > w.level ||
        (s.level == w.level && (double)s.used * (double)w.soft > (double)w.used * (double)s.soft))
      w = s;
    have = 1;
  }

  lock(&a->obs_lock);
  int level = w.level;
  if (a->observations > 0 && st->version > 0 && a->prev.version == st->version &&
      strcmp(a->prev.path, st->path) == 0) {
    uint64_t oom = delta(st->events.oom, a->prev.events.oom) +
                   delta(st->events.oom_kill, a->prev.events.oom_kill);
    a->high_events += delta(st->events.high, a->prev.events.high);
    a->max_events += delta(st->events.max, a->prev.events.max);
    a->oom_events += oom;
    if (oom > 0)
      level = ES_PRESSURE_HARD;
  }
  a->prev = *st;
  a->observations++;
  atomic_store_explicit(&a->mem_used, w.used, memory_order_relaxed);
  atomic_store_explicit(&a->mem_soft, w.soft, memory_order_relaxed);
  atomic_store_explicit(&a->mem_hard, w.hard, memory_order_relaxed);
  atomic_store_explicit(&a->pressure, have ? level : ES_PRESSURE_NONE, memory_order_release);
  unlock(&a->obs_lock);
  return 0;
}

int es_admission_pressure(es_admission *a) {
  if (gate_check(a, "es_admission_pressure") < 0)
    return ES_PRESSURE_NONE;
  return atomic_load_explicit(&a->pressure, memory_order_acquire);
}

/* ---- limits, draining, stats ---------------------------------------------- */

int es_admission_set_model_limit(es_admission *a, int model_id, unsigned max_inflight) {
  int rc = gate_check(a, "es_admission_set_model_limit");
  if (rc < 0 || (rc = model_check(a, model_id, "es_admission_set_model_limit")) < 0)
    return rc;
  atomic_store_explicit(&a->models[model_id].limit, max_inflight, memory_order_relaxed);
  return 0;
}

int es_admission_set_draining(es_admission *a, int model_id, int on) {
  int rc = gate_check(a, "es_admission_set_draining");
  if (rc < 0)
    return rc;
  if (model_id == -1) {
    atomic_store(&a->draining, on != 0);
    return 0;
  }
  if ((rc = model_check(a, model_id, "es_admission_set_draining")) < 0)
    return rc;
  atomic_store(&a->models[model_id].draining, on != 0);
  return 0;
}

int es_admission_stats_get(es_admission *a, es_admission_stats *out) {
  int rc = gate_check(a, "es_admission_stats_get");
  if (rc < 0)
    return rc;
  if (!out)
    return es__fail(ES_EINVAL, "es_admission_stats_get: NULL out");
  es_admission_stats s;
  memset(&s, 0, sizeof s);
  s.admitted = atomic_load(&a->admitted);
  s.completed = atomic_load(&a->completed);
  for (int r = 1; r < ES_REFUSE_COUNT; r++) {
    s.refused_by[r] = atomic_load(&a->refused_by[r]);
    s.refused += s.refused_by[r];
  }
  s.inflight = atomic_load(&a->inflight);
  s.peak_inflight = atomic_load(&a->peak_inflight);
  s.reserved_bytes = atomic_load(&a->reserved);
  s.peak_reserved_bytes = atomic_load(&a->peak_reserved);
  s.memory_budget_bytes = a->budget;
  double iv = est_interval(&a->est, now_ns(a), (unsigned)s.inflight);
  if (iv > 0) {
    s.drain_per_sec = 1e9 / iv;
    s.drain_bytes_per_sec =
        s.drain_per_sec * bitsd(atomic_load_explicit(&a->est.pub_bytes, memory_order_relaxed));
  }
  s.pressure = atomic_load(&a->pressure);
  s.mem_used = atomic_load(&a->mem_used);
  s.mem_soft = atomic_load(&a->mem_soft);
  s.mem_hard = atomic_load(&a->mem_hard);
  lock(&a->obs_lock);
  s.observations = a->observations;
  s.high_events = a->high_events;
  s.max_events = a->max_events;
  s.oom_events = a->oom_events;
  unlock(&a->obs_lock);
  *out = s;
  return 0;
}

int es_admission_model_stats_get(es_admission *a, int model_id, es_admission_model_stats *out) {
  int rc = gate_check(a, "es_admission_model_stats_get");
  if (rc < 0 || (rc = model_check(a, model_id, "es_admission_model_stats_get")) < 0)
    return rc;
  if (!out)
    return es__fail(ES_EINVAL, "es_admission_model_stats_get: NULL out");
  model_slot *m = &a->models[model_id];
  es_admission_model_stats s;
  memset(&s, 0, sizeof s);
  s.inflight = atomic_load(&m->inflight);
  s.max_inflight = atomic_load(&m->limit);
  s.draining = atomic_load(&m->draining);
  s.admitted = atomic_load(&m->admitted);
  s.completed = atomic_load(&m->completed);
  s.refused = atomic_load(&m->refused);
  double iv = est_interval(&m->est, now_ns(a), s.inflight);
  if (iv > 0)
    s.drain_per_sec = 1e9 / iv;
  lock(&a->est_lock);
  s.mean_service_ns = m->est.service_ns;
  unlock(&a->est_lock);
  *out = s;
  return 0;
}
