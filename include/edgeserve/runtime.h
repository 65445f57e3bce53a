/* edgeserve/runtime.h - the runtime between callers and the engine.
 *
 * Admission (BRIEF §5): the gate every request passes before it is queued.
 * It says no before memory or concurrency runs out, with a reason and a
 * retry-after estimate, so the kernel never has to say OOM.
 *
 *   es_admission_config cfg;
 *   es_admission_config_default(&cfg);
 *   cfg.max_inflight_total = 8;
 *   cfg.model_max_inflight = 4;
 *   cfg.memory_budget_bytes = 2048u << 20;   // for all request arenas
 *   es_admission *gate;
 *   es_admission_create(&cfg, &gate);
 *
 *   // every 100 ms or so, from whoever owns a timer:
 *   es_memstat st;
 *   if (es_memstat_read(&st) == 0)
 *     es_admission_observe(gate, &st);
 *
 *   // per request, before it is queued:
 *   es_admit_ticket t;
 *   es_refusal why;
 *   if (es_admission_try(gate, model_id, planned_arena_bytes, &t, &why) < 0) {
 *     // 429 or 503 by why.reason (below), Retry-After from why.retry_after_ms
 *     return;
 *   }
 *   ... queue, run ...
 *   es_admission_done(gate, &t, run_ns);      // releases the slot and bytes
 *
 * The gate is pure bookkeeping: no threads, no locks on the admit path
 * (compare-and-swap on counters), nothing allocated after create.
 */
#ifndef EDGESERVE_RUNTIME_H
#define EDGESERVE_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#include "edgeserve/error.h"
#include "edgeserve/memory.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ===========================================================================
 * Admission control.
 *
 * es_admission_try checks, in this order, and stops at the first refusal:
 *   1. draining: the model (or the whole gate) is being unloaded or shut down;
 *   2. memory pressure: the last es_memstat observed put memory above the
 *      soft watermark (see es_admission_observe);
 *   3. memory budget: reserve exactly `bytes` (the request's planned arena
 *      bytes) from memory_budget_bytes;
 *   4. the total concurrency slot, then 5. the model's slot.
 * A refusal at 4 or 5 gives back what 3 (and 4) took. Counters are only ever
 * moved by compare-and-swap within their limits, so the reserved bytes never
 * exceed the budget and in-flight counts never exceed their limits, whatever
 * the number of threads.
 *
 * Retry-after: completions feed a drain-rate estimator per model and overall
 * (an EWMA of the interval between completions; a completion interval is
 * never counted longer than the request's own duration, so idle gaps do not
 * read as slowness, while a stall with work in flight stretches the interval
 * as it lasts). A refusal's estimate is the time to drain what is missing:
 * slots / completions per second, or bytes / bytes released per second,
 * clamped to [1 ms, 60 s]; default_retry_ms before any completion.
 *
 * For the HTTP layer (mapping kept there, the runtime knows no HTTP):
 * OVER_CONCURRENCY and QUEUE_FULL are 429 Too Many Requests; OVER_MEMORY,
 * MEMORY_PRESSURE, DEADLINE and DRAINING are 503 Service Unavailable; both
 * with Retry-After.
 * ========================================================================= */

/* XX(name, string) */
#define ES_REFUSAL_MAP(XX)                                                     \
  XX(QUEUE_FULL, "queue_full")             /* the scheduler's bounded queue */ \
  XX(OVER_CONCURRENCY, "over_concurrency") /* total or per-model slots */      \
  XX(OVER_MEMORY, "over_memory")           /* the budget cannot hold bytes */  \
  XX(MEMORY_PRESSURE, "memory_pressure")   /* cgroup/system above soft mark */ \
  XX(DEADLINE, "deadline")                 /* cannot finish in time */         \
  XX(DRAINING, "draining")                 /* model unloading, shutting down */

typedef enum es_refusal_reason {
  ES_REFUSE_NONE = 0,
#define ES_REFUSAL_ENUM_(name, str) ES_REFUSE_##name,
  ES_REFUSAL_MAP(ES_REFUSAL_ENUM_)
#undef ES_REFUSAL_ENUM_
  ES_REFUSE_COUNT
} es_refusal_reason;

/* "over_memory", ...; "none" for ES_REFUSE_NONE, "?" otherwise. Static. */
const char *es_refusal_name(int reason);

/* Why a request was refused; filled by es_admission_try and
 * es_admission_refuse. The units of requested / in_use / limit follow the
 * reason: bytes for OVER_MEMORY (in_use: reserved, limit: the budget) and
 * MEMORY_PRESSURE (in_use: the working set, limit: the soft watermark);
 * requests for OVER_CONCURRENCY (in flight and the limit that was hit) and
 * for es_admission_refuse (requested 1, in_use and limit the backlog). */
typedef struct es_refusal {
  int reason;              /* es_refusal_reason */
  int model_id;
  uint32_t retry_after_ms; /* [1, 60000]; 0 only for a request that can never
                              fit (es_admission_try returned ES_ENOSPC) */
  uint64_t requested;
  uint64_t in_use;
  uint64_t limit;
} es_refusal;

/* Memory pressure levels, from the last observation. */
enum {
  ES_PRESSURE_NONE = 0, /* below the soft watermark */
  ES_PRESSURE_SOFT = 1, /* above it: refuse new work, shorten queues */
  ES_PRESSURE_HARD = 2, /* above the hard one (or an OOM event since the last
                           observation): also cancel cancellable work */
};

typedef struct es_admission es_admission;

/* An admitted request's hold on the gate. Caller-owned (a request embeds
 * it); its fields are private. Valid from a successful es_admission_try to
 * its es_admission_done. */
typedef struct es_admit_ticket {
  uint64_t magic;
  const es_admission *owner;
  int model_id;
  size_t bytes;
  uint64_t admitted_ns;
} es_admit_ticket;

typedef uint64_t (*es_clock_fn)(void *user); /* nanoseconds, monotonic */

typedef struct es_admission_config {
  unsigned max_inflight_total;  /* admitted, not yet done, all models; 0: no
                                   limit (default 0) */
  size_t max_models;            /* model ids are 0 .. max_models-1
                                   (default 64, at most 65536) */
  unsigned model_max_inflight;  /* each model's limit until
                                   es_admission_set_model_limit; 0: no
                                   limit (default 0) */
  size_t memory_budget_bytes;   /* bytes all admitted requests may reserve;
                                   0: no budget (reservations still counted)
                                   (default 0) */
  double soft_ratio;            /* soft watermark, a fraction of the memory
                                   limit (default 0.85) */
  double hard_ratio;            /* hard watermark (default 0.95);
                                   0 < soft_ratio <= hard_ratio <= 1 */
  uint32_t default_retry_ms;    /* retry-after before any completion
                                   (default 1000) */
  es_clock_fn clock;            /* NULL: CLOCK_MONOTONIC (tests pass a fake) */
  void *clock_user;
} es_admission_config;

typedef struct es_admission_stats {
  uint64_t admitted;        /* successful es_admission_try */
  uint64_t completed;       /* es_admission_done */
  uint64_t refused;         /* all refusals */
  uint64_t refused_by[ES_REFUSE_COUNT]; /* by reason (index 0 unused) */
  size_t inflight;          /* admitted - completed */
  size_t peak_inflight;
  size_t reserved_bytes;    /* held by admitted requests now */
  size_t peak_reserved_bytes;
  size_t memory_budget_bytes;
  double drain_per_sec;     /* completions per second, now (0: none yet) */
  double drain_bytes_per_sec;
  int pressure;             /* ES_PRESSURE_* */
  size_t mem_used;          /* last observation: working set of the binding */
  size_t mem_soft;          /*   limit, and its soft and hard watermarks */
  size_t mem_hard;          /*   (0 when nothing was observed) */
  uint64_t observations;    /* es_admission_observe calls */
  uint64_t high_events;     /* memory.events high/max/oom+oom_kill counted */
  uint64_t max_events;      /*   since the first observation */
  uint64_t oom_events;
} es_admission_stats;

typedef struct es_admission_model_stats {
  unsigned inflight;
  unsigned max_inflight;    /* 0: no limit */
  int draining;
  uint64_t admitted;
  uint64_t completed;
  uint64_t refused;
  double drain_per_sec;     /* this model's completions per second */
  double mean_service_ns;   /* EWMA of the durations given to done */
} es_admission_model_stats;

/* Fill a config with the defaults above. */
void es_admission_config_default(es_admission_config *cfg);

/* The gate's memory (one block, counted under ES_MEM_RUNTIME) is taken here
 * and nowhere else. ES_EINVAL for a bad config (the detail names the field),
 * ES_ENOMEM. The caller owns the gate. */
int es_admission_create(const es_admission_config *cfg, es_admission **out);
/* Refuses with ES_EBUSY while requests are admitted and not done (the gate
 * is kept). NULL is a no-op returning 0. Not thread-safe with other calls on
 * the same gate. */
int es_admission_destroy(es_admission *a);

/* Admit a request for model_id that will use `bytes` of arena memory.
 * On success (0) t holds the reservation until es_admission_done; why is
 * untouched. On refusal returns ES_EAGAIN and fills why (reason,
 * retry-after, the numbers) and the thread's error detail; t is untouched.
 * A request larger than the whole budget can never be admitted: ES_ENOSPC,
 * why->reason OVER_MEMORY, retry_after_ms 0. ES_EINVAL for a model id out of
 * range or NULL t or why. Thread-safe, lock-free. */
int es_admission_try(es_admission *a, int model_id, size_t bytes, es_admit_ticket *t,
                     es_refusal *why);

/* Release an admitted request's slots and bytes and feed the drain-rate
 * estimators. duration_ns: how long the request took (0: since it was
 * admitted, by the gate's clock). ES_EDOUBLEFREE for a ticket already done,
 * ES_EFOREIGN for one of another gate, ES_ECORRUPT for anything else that is
 * not a live ticket (a copy of a ticket already done is caught when the
 * counters would go below zero); the gate is unchanged then. Thread-safe (a
 * short lock around the estimators). */
int es_admission_done(es_admission *a, es_admit_ticket *t, uint64_t duration_ns);

/* Record a refusal decided elsewhere (the scheduler: ES_REFUSE_QUEUE_FULL,
 * ES_REFUSE_DEADLINE) so it is counted with the others, and fill why with a
 * retry-after for `backlog` requests ahead of this one at the model's drain
 * rate (model_id -1: the overall rate). ES_EINVAL for a bad reason or model
 * id. Thread-safe. */
int es_admission_refuse(es_admission *a, int model_id, int reason, size_t backlog,
                        es_refusal *why);

/* Feed the memory state, typically from es_memstat_read every 100 ms. The
 * binding limit is the cgroup's min(high, max) with the group's working set
 * (current - inactive_file) against it; the machine (MemTotal -
 * MemAvailable against MemTotal) is checked as well when meminfo was read,
 * and the higher level wins. An increase of the group's oom or oom_kill
 * events since the previous observation counts as hard pressure until the
 * next one. Thread-safe. ES_EINVAL for NULL. */
int es_admission_observe(es_admission *a, const es_memstat *st);
/* ES_PRESSURE_* from the last observation (NONE before any). Thread-safe. */
int es_admission_pressure(es_admission *a);

/* Change a model's concurrency limit (0: none). Lowering it below the
 * model's in-flight count refuses new requests until it drains. Thread-safe. */
int es_admission_set_model_limit(es_admission *a, int model_id, unsigned max_inflight);
/* Refuse (ES_REFUSE_DRAINING) new requests for model_id, or for every model
 * with model_id -1, while on; in-flight ones finish normally. Thread-safe. */
int es_admission_set_draining(es_admission *a, int model_id, int on);

/* Snapshots; thread-safe. Counters are read one by one, so a snapshot taken
 * while requests move may be a few operations apart between fields. */
int es_admission_stats_get(es_admission *a, es_admission_stats *out);
int es_admission_model_stats_get(es_admission *a, int model_id, es_admission_model_stats *out);

#ifdef __cplusplus
}
#endif
#endif
