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
 *
 * The API's conventions are written in edgeserve/error.h.
 */
#ifndef EDGESERVE_RUNTIME_H
#define EDGESERVE_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#include "edgeserve/engine.h"
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
ES_API const char *es_refusal_name(int reason);

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
ES_API void es_admission_config_default(es_admission_config *cfg);

/* The gate's memory (one block, counted under ES_MEM_RUNTIME) is taken here
 * and nowhere else. ES_EINVAL for a bad config (the detail names the field),
 * ES_ENOMEM. The caller owns the gate. */
ES_API int es_admission_create(const es_admission_config *cfg, es_admission **out);
/* Refuses with ES_EBUSY while requests are admitted and not done, or bytes
 * are reserved (the gate is kept). NULL is a no-op returning 0. Not thread-safe with other calls on
 * the same gate. */
ES_API int es_admission_destroy(es_admission *a);

/* Admit a request for model_id that will use `bytes` of arena memory.
 * On success (0) t holds the reservation until es_admission_done; why is
 * untouched. On refusal returns ES_EAGAIN and fills why (reason,
 * retry-after, the numbers) and the thread's error detail; t is untouched.
 * A request larger than the whole budget can never be admitted: ES_ENOSPC,
 * why->reason OVER_MEMORY, retry_after_ms 0. ES_EINVAL for a model id out of
 * range or NULL t or why. Thread-safe, lock-free. */
ES_API int es_admission_try(es_admission *a, int model_id, size_t bytes, es_admit_ticket *t,
                     es_refusal *why);

/* Reserve `bytes` of the budget on model_id's behalf without a concurrency
 * slot: memory held around a model's requests rather than by one of them
 * (a decoded image, a pipeline's pre-processing buffers). Checks draining,
 * memory pressure and the budget as es_admission_try does (same refusals,
 * same ES_ENOSPC for more than the whole budget) and counts refusals with
 * the others; the reservation is neither admitted nor in flight, and its
 * release (es_admission_done or es_admission_cancel, alike) feeds no
 * estimator. Thread-safe, lock-free. */
ES_API int es_admission_reserve(es_admission *a, int model_id, size_t bytes, es_admit_ticket *t,
                                es_refusal *why);
/* Grow a reservation made by es_admission_reserve, or an admitted
 * request's, by `bytes`, with the same checks and refusals (the ticket
 * unchanged on refusal): memory that grows while it is held, such as a
 * sequence's state or what a run takes beyond its plan. ES_EINVAL for a
 * ticket that is not a live reservation of this gate. Thread-safe,
 * lock-free. */
ES_API int es_admission_grow(es_admission *a, es_admit_ticket *t, size_t bytes, es_refusal *why);
/* Give back bytes of what a ticket holds (memory that grew with
 * es_admission_grow and is freed before the ticket is done). ES_EINVAL for
 * more than it holds or a ticket that is not live. Thread-safe,
 * lock-free. */
ES_API int es_admission_shrink(es_admission *a, es_admit_ticket *t, size_t bytes);

/* Release an admitted request's slots and bytes and feed the drain-rate
 * estimators. duration_ns: how long the request took (0: since it was
 * admitted, by the gate's clock). ES_EDOUBLEFREE for a ticket already done,
 * ES_EFOREIGN for one of another gate, ES_ECORRUPT for anything else that is
 * not a live ticket (a copy of a ticket already done is caught when the
 * counters would go below zero); the gate is unchanged then. Thread-safe (a
 * short lock around the estimators). */
ES_API int es_admission_done(es_admission *a, es_admit_ticket *t, uint64_t duration_ns);

/* Give back an admitted request's slots and bytes without counting it as a
 * completion (it was cancelled or left the queue before running), so the
 * drain-rate estimators only ever see real work. Errors as es_admission_done.
 * Thread-safe. */
ES_API int es_admission_cancel(es_admission *a, es_admit_ticket *t);

/* Record a refusal decided elsewhere (the scheduler: ES_REFUSE_QUEUE_FULL,
 * ES_REFUSE_DEADLINE) so it is counted with the others, and fill why with a
 * retry-after for `backlog` requests ahead of this one at the model's drain
 * rate (model_id -1: the overall rate). ES_EINVAL for a bad reason or model
 * id. Thread-safe. */
ES_API int es_admission_refuse(es_admission *a, int model_id, int reason, size_t backlog,
                        es_refusal *why);

/* Feed the memory state, typically from es_memstat_read every 100 ms. The
 * binding limit is the cgroup's min(high, max) with the group's working set
 * (current - inactive_file) against it; the machine (MemTotal -
 * MemAvailable against MemTotal) is checked as well when meminfo was read,
 * and the higher level wins. An increase of the group's oom or oom_kill
 * events since the previous observation counts as hard pressure until the
 * next one. Thread-safe. ES_EINVAL for NULL. */
ES_API int es_admission_observe(es_admission *a, const es_memstat *st);
/* ES_PRESSURE_* from the last observation (NONE before any). Thread-safe. */
ES_API int es_admission_pressure(es_admission *a);

/* Change a model's concurrency limit (0: none). Lowering it below the
 * model's in-flight count refuses new requests until it drains. Thread-safe. */
ES_API int es_admission_set_model_limit(es_admission *a, int model_id, unsigned max_inflight);
/* Refuse (ES_REFUSE_DRAINING) new requests for model_id, or for every model
 * with model_id -1, while on; in-flight ones finish normally. Thread-safe. */
ES_API int es_admission_set_draining(es_admission *a, int model_id, int on);

/* Snapshots; thread-safe. Counters are read one by one, so a snapshot taken
 * while requests move may be a few operations apart between fields. */
ES_API int es_admission_stats_get(es_admission *a, es_admission_stats *out);
ES_API int es_admission_model_stats_get(es_admission *a, int model_id,
                                        es_admission_model_stats *out);

/* ===========================================================================
 * The runtime: registry, queues, workers, lanes (BRIEF §4-§6).
 *
 *   es_runtime_config rc;
 *   es_runtime_config_default(&rc);          // one worker per core, pinned
 *   rc.memory_budget_bytes = 512u << 20;
 *   es_runtime *rt;
 *   es_runtime_create(&rc, &rt);
 *
 *   es_model_config mc;
 *   es_model_config_default(&mc);
 *   mc.name = "det"; mc.path = "det.onnx";   // .esm next to it is used
 *   mc.shapes = &shape; mc.n_shapes = 1;     // the shape it mostly serves
 *   int det;
 *   es_runtime_model_load(rt, &mc, &det);
 *
 *   es_submit s = {.model = det, .inputs = &in, .n_inputs = 1,
 *                  .priority = 0, .deadline_ns = now + 200 * 1000000ull};
 *   es_request *r;
 *   es_refusal why;
 *   if (es_runtime_submit(rt, &s, &r, &why) == ES_EAGAIN)
 *     ... 429/503 by why.reason, Retry-After why.retry_after_ms ...
 *   if (es_request_wait(r, -1) == 0) {
 *     es_tensor out;
 *     es_request_output(r, 0, &out);         // valid until es_request_free
 *   }
 *   es_request_free(r);
 *
 * The request path: submit checks the inputs against the model, gets the
 * plan for their shapes (planned once per shape, cached), and asks the
 * admission gate for a slot and the request's exact bytes (planned arena +
 * outputs). An admitted request waits in the queue of its priority level
 * (strict priority between levels, FIFO within; each level bounded). A
 * dispatcher hands the first request some idle worker can take to that
 * worker, preferring the worker that last ran the same model (its weights
 * are in that core's cache), then the model's home worker; different models
 * get different home workers. The worker takes an arena, runs the plan,
 * copies the outputs into one block of the runtime's buddy pool, gives the
 * arena back and completes the request (waitable handle and optional
 * callback).
 *
 * Where a request's arena comes from:
 *   - a model assigned to a lane (es_model_config.lane >= 0) runs on that
 *     lane's worker only, in the lane's scratchpad: one block per lane sized
 *     max(planned arena bytes of its models at their configured shapes), not
 *     their sum, since a lane runs one request at a time. Switching models is
 *     pointing an arena at the scratchpad: nothing is allocated;
 *   - otherwise, a model with a configured shape has a bounded pool of
 *     arenas of exactly that plan's size (one per worker: no more can run);
 *   - anything else (other shapes: det at another image size, rec at another
 *     width) gets an exact-size block of the buddy pool, which heals its own
 *     fragmentation as sizes come and go.
 *
 * Memory pressure: a monitor thread reads the process's cgroup (es_memstat)
 * every watch_ms and feeds the gate. Above the soft watermark new work is
 * refused and the queues are cut to one request per worker (the newest of
 * the lowest priorities leave first); above the hard one every queued
 * request leaves. Requests removed so complete with ES_EAGAIN and a refusal
 * (MEMORY_PRESSURE, retry-after); running ones finish.
 *
 * Lanes are the workers: worker i is lane i. rc.workers = 1 gives one lane
 * for all models (NPU-style time division); the default gives one per core.
 * ========================================================================= */

#define ES_RT_MAX_IO 16      /* inputs or outputs of one model */
#define ES_RT_NAME_MAX 64

typedef struct es_runtime es_runtime;
typedef struct es_request es_request;

/* The split a preempting runtime asks for: bands of about 256 MFLOP,
 * about a millisecond on one core of the machines measured, so a more
 * urgent request waits about that long for the step under way. Finer
 * bands cost throughput: at 64 MFLOP det at 640x640 ran 7-10% slower (thin
 * bands of small 1x1 convolutions), at 256 no slower than whole. */
#define ES_RT_SPLIT_FLOPS ((uint64_t)256 << 20)

typedef struct es_runtime_config {
  int workers;               /* worker threads = lanes; 0: one per core the
                                process may run on (default 0) */
  int pin;                   /* pin worker i to the i-th allowed core
                                (default 1) */
  int intra_threads;         /* engine threads per run (default 1); above 1,
                                the threads that load models and submit
                                requests get it too (es_engine_threads_set),
                                since plans are made there */
  int priorities;            /* levels 0 (highest) .. priorities-1
                                (default 4, at most 16) */
  int preempt;               /* 1 (default): a worker checks between the
                                steps of a run whether a request of a higher
                                priority waits with no worker free to take
                                it; if one does, it pauses the run (es_run:
                                its arena and reservation stay as they are),
                                runs that request to its end in its own
                                arena, and resumes. A run in a lane's shared
                                scratchpad is never paused (the scratchpad
                                holds one model at a time), and a lane's
                                request is never run in another's pause.
                                Inside a step, long convolutions give it
                                safe points too: creating a runtime with
                                preempt on makes plans split every conv
                                of more than ES_RT_SPLIT_FLOPS into bands
                                (es_engine_split_set), unless the process
                                chose a split already.
                                0: a started run always finishes first */
  int sched;                 /* ES_SCHED_PRIORITY (default): strict priority
                                between levels, FIFO within one;
                                ES_SCHED_EDF: earliest deadline first among
                                the queued requests that carry one (the
                                others after them, by priority), and with
                                preempt a run pauses for a waiting request
                                whose deadline is earlier than its own */
  int rt_priority;           /* 0 (default): workers run at the process's
                                ordinary priority, and the kernel shares a
                                core between a worker's urgent run and
                                whatever else wakes there (HTTP threads,
                                clients, other processes). 1..98: a worker
                                waits for work, and runs requests of levels
                                below rt_levels, as a SCHED_FIFO thread of
                                this priority, which nothing of ordinary
                                priority preempts; runs of other levels
                                drop to SCHED_OTHER while they run (and
                                back when they pause for an urgent one).
                                Needs root, CAP_SYS_NICE or an
                                RLIMIT_RTPRIO of at least rt_priority
                                (ulimit -r; LimitRTPRIO= in a systemd
                                unit): es_runtime_create fails with
                                ES_EACCES when the system refuses it. The
                                kernel still leaves ordinary threads 5% of
                                each core (sched_rt_runtime_us); keep the
                                real-time levels for short runs. Needs
                                intra_threads 1 (ES_EINVAL otherwise: an
                                OpenMP team keeps the policy of the run
                                that started it). */
  int rt_levels;             /* levels 0..rt_levels-1 run real-time when
                                rt_priority is set (default 1: level 0
                                only) */
  unsigned queue_capacity;   /* bounded queue per level (default 64) */
  unsigned max_inflight_total; /* admitted, not freed, all models; 0: none
                                  (default 0) */
  unsigned model_max_inflight; /* per model unless its config says; 0: none
                                  (default 0) */
  size_t memory_budget_bytes; /* what admitted requests may reserve (arena
                                 + outputs); 0: no budget (default 0) */
  size_t buddy_bytes;        /* first region of the buddy pool for dynamic
                                shapes and outputs; grows up to 4x
                                (default 64 MiB) */
  int buddy_decay_ms;        /* pages of the buddy pool left free this long
                                go back to the kernel (the monitor runs
                                es_buddy_purge ten times per period, and
                                trims the C heap once), so RSS follows the
                                working set of the last period, not the
                                historic peak; 0: never,
                                else at least 100 (default 10000) */
  int watch_ms;              /* memory watch period; 0: off (default 100) */
  double soft_ratio, hard_ratio; /* watermarks (default 0.85, 0.95) */
  int max_models;            /* registry slots (default 32, at most 1024) */
  /* For tests: where es_memstat comes from (NULL: es_memstat_read). */
  int (*memstat_fn)(void *user, es_memstat *out);
  void *memstat_user;
} es_runtime_config;

/* Sequences (the semantics of Triton's sequence batcher). A model
 * configured with states (pairs of an input and an output, such as an
 * LSTM's h0 -> hn) serves sequences: requests with the same
 * es_submit.sequence id, or the same string es_submit.sequence_key.
 *   - ES_SEQ_START begins one (or restarts a live one). Its state inputs
 *     are the caller's when given (data set), else zeros of the configured
 *     shape (es_model_config.shapes), or of the model's with each free
 *     dimension at 0 (a KV cache's empty past).
 *   - Every later request leaves the state inputs out (data NULL): the
 *     runtime feeds each with its output of the sequence's previous
 *     request that completed successfully.
 *   - Requests of one sequence run one at a time, in the order they were
 *     submitted: one submitted while another of its sequence is queued or
 *     running waits beside the queue, without admission, until then (its
 *     plan and admission happen then, and a refusal then completes it with
 *     the refusal, as a queued request removed under pressure).
 *   - ES_SEQ_END frees the state once its request completed; so does
 *     sequence_idle_ms without a request (an eviction). A request for a
 *     sequence that is not live is ES_ENOENT.
 * State memory is one block of the buddy pool per sequence, reserved
 * through admission on the model's behalf (es_admission_reserve) with its
 * exact bytes: at the start; then, with ES_STATE_RESERVE_STEP, grown by
 * what each request's state outputs add (a request whose growth is refused
 * is refused, the state untouched), or, with ES_STATE_RESERVE_MAX,
 * state_max_bytes at the start and a request that would pass it failing
 * with ES_ENOSPC. A state is never reserved into the room the model's runs
 * need: beside it the budget must keep as many requests like the one being
 * admitted as there are workers, and all the model's states together stay
 * within state_budget_bytes when set (else sequences whose states fill the
 * budget would leave none of their steps able to run). A new sequence
 * beyond max_sequences, or whose state does not fit, is refused
 * (ES_EAGAIN: OVER_CONCURRENCY or OVER_MEMORY, with a retry-after), as is
 * a step whose growth does not fit, its state untouched. */

/* A model's state: an input the runtime feeds, on each request of a
 * sequence after its first, with the output of the previous one. */
typedef struct es_state_pair {
  const char *input, *output;
} es_state_pair;

enum {
  ES_STATE_RESERVE_STEP = 0, /* reserve the state's bytes as it grows */
  ES_STATE_RESERVE_MAX = 1,  /* reserve state_max_bytes at the start */
};

/* es_submit.sequence_flags */
enum { ES_SEQ_START = 1, ES_SEQ_END = 2 };
#define ES_SEQ_KEY_MAX 128 /* a string sequence id: at most 127 bytes */

typedef struct es_model_config {
  const char *name;          /* unique, at most ES_RT_NAME_MAX-1 bytes */
  const char *path;          /* .onnx or .esm; a compiled .esm beside an
                                .onnx of the same name is used when its
                                checksum matches (see es_model_load) */
  const es_tensor_info *shapes; /* the shape it is configured for (one per
                                   input, as es_model_plan); NULL: none
                                   (requires a model without free dims to
                                   get an arena pool) */
  int n_shapes;
  int lane;                  /* -1: any worker (default); k: lane k only,
                                in its shared scratchpad (needs shapes) */
  unsigned max_inflight;     /* 0: the runtime's model_max_inflight */
  unsigned arenas;           /* arenas in its pool; 0: one per worker */
  unsigned plans;            /* plans cached by input shape, least recently
                                used evicted (default 32; dynamic-shape
                                models such as rec batched by width want
                                more) */
  int share;                 /* 1 (default): a file already loaded by another
                                registry entry is shared (one copy of its
                                weights); 0: a private copy of everything,
                                for the naive comparison mode */
  es_precision precision;    /* what its convolutions and matrix products
                                compute in (es_model_options; default
                                AUTO); entries share a file only at the
                                same precision */
  /* Sequences (stateful models; see "Sequences" below). */
  const es_state_pair *states; /* inputs fed from outputs between the
                                  requests of a sequence; NULL: none */
  int n_states;
  unsigned max_sequences;    /* live at once (default 64) */
  int sequence_idle_ms;      /* a live sequence with no request for this
                                long is ended and its state freed
                                (default 60000) */
  int state_reserve;         /* ES_STATE_RESERVE_STEP (default) or _MAX */
  size_t state_max_bytes;    /* _MAX: what a sequence reserves at its start,
                                the most its state may grow to; 0: the
                                state's size at the start (a state that
                                never grows) */
  size_t state_budget_bytes; /* the most all its sequences' states may hold
                                together, leaving the rest of the memory
                                budget to runs; 0: no cap of its own */
} es_model_config;

typedef void (*es_request_done_fn)(void *user, es_request *r);

typedef struct es_submit {
  int model;                 /* id from es_runtime_model_load */
  const es_tensor *inputs;   /* one per model input, in order; the data
                                must stay valid until the request completes */
  int n_inputs;
  int priority;              /* 0 highest */
  uint64_t deadline_ns;      /* CLOCK_MONOTONIC; 0: none. Refused at submit
                                (DEADLINE) when it cannot be met at the
                                measured service rate; a queued request
                                whose deadline passes completes with
                                ES_ETIMEDOUT without running */
  es_request_done_fn on_done; /* called once, from a runtime thread, after
                                 the request completed in any way; may call
                                 es_request_free. NULL: none */
  void *user;
  uint64_t sequence;         /* a model with states: the sequence this
                                request belongs to (0: none, every state
                                input given by the caller) */
  const char *sequence_key;  /* or its id as a string (1 to
                                ES_SEQ_KEY_MAX - 1 bytes; with sequence 0):
                                its own namespace, compared whole */
  unsigned sequence_flags;   /* ES_SEQ_START, ES_SEQ_END */
} es_submit;

typedef struct es_request_info {
  int status;                /* ES_REQUEST_PENDING while queued or running,
                                then 0 or the negative error */
  int model;
  int priority;
  int worker;                /* that ran it; -1 if it did not run */
  int arena_source;          /* ES_ARENA_FROM_*; NONE until it is done (the
                                worker sets it while running, unlocked) */
  uint64_t seq;              /* submission order, from 1 */
  uint64_t queue_ns;         /* submit to start (or to leaving the queue) */
  uint64_t run_ns;           /* the run, outputs copied */
  uint64_t switch_ns;        /* lane: time to switch to this model (0 when
                                the lane ran this model last, or until done) */
  size_t reserved_bytes;     /* planned arena + outputs */
  es_refusal refusal;        /* why it left the queue (status ES_EAGAIN) */
  int preemptions;           /* times its run was paused for a more urgent one */
  uint64_t paused_ns;        /* how long it was paused in all */
  int preempting;            /* 1: it ran in another run's pause */
} es_request_info;

enum { ES_ARENA_FROM_NONE = 0, ES_ARENA_FROM_LANE, ES_ARENA_FROM_POOL, ES_ARENA_FROM_BUDDY };

enum { ES_REQUEST_PENDING = 1 }; /* es_request_status while queued/running */

typedef struct es_lane_stats {
  size_t scratch_bytes;      /* the lane's scratchpad (max of its models) */
  size_t sum_bytes;          /* what private arenas would take (the sum) */
  int models;                /* models assigned to the lane */
  uint64_t runs;
  uint64_t switches;         /* runs of another model than the previous */
  uint64_t switch_ns_max;
  double switch_ns_mean;
  int busy;
} es_lane_stats;

#define ES_RT_PAUSE_BUCKETS 10

enum { ES_SCHED_PRIORITY = 0, ES_SCHED_EDF = 1 };

typedef struct es_runtime_stats {
  int workers;
  int priorities;
  size_t queued[16];         /* per level, now */
  size_t queued_total;
  size_t running;
  uint64_t submitted, completed, failed, cancelled, expired, dropped, refused;
  size_t scratch_bytes;      /* all lane scratchpads */
  size_t pool_bytes;         /* all model arena pools */
  size_t buddy_capacity, buddy_in_use, buddy_peak;
  uint64_t buddy_failures;
  double buddy_fragmentation;
  size_t weights_bytes;      /* distinct weight regions of loaded models */
  int models;
  size_t run_heap_bytes;     /* buddy blocks held now by runs beyond their plans (nodes
                                no bound covers), each charged to its request's admission */
  uint64_t preemptions;      /* runs paused for a more urgent request */
  uint64_t preemptions_in_kernel; /* of those, inside a step: at a safe point
                                     between two bands of a long convolution */
  uint64_t inlined;          /* requests a task ran itself while waiting for
                                them (es_task) */
  /* How long paused runs waited (the urgent run, and its hand-over):
   * counts per bucket, bucket i holding pauses up to
   * es_runtime_pause_bound_us(i) microseconds, the last one the rest. */
  uint64_t pause_hist[ES_RT_PAUSE_BUCKETS];
  uint64_t pause_ns_sum;
  /* What pausing itself costs: from the decision to pause to the urgent
   * run's start, and from its end to the paused run's next step (the
   * urgent run and its completion callback not counted). With
   * rt_priority, the worker's switch to SCHED_FIFO is in it, and its
   * switch back is not: that follows the callback, and its wall time is
   * mostly the ordinary threads that waited during the urgent run taking
   * the core first (about 75 us on average in bench_preempt.sh, of which
   * the call itself is about 2). */
  uint64_t pause_overhead_ns_sum, pause_overhead_ns_max;
  uint64_t pause_lock_wait_ns_sum; /* of that, waiting for the runtime's lock
                                      to hand back (contention with the
                                      submitting threads) */
} es_runtime_stats;

/* The pause histogram's bucket i upper bound in microseconds (the last
 * bucket, and one out of range: HUGE_VAL). */
ES_API double es_runtime_pause_bound_us(int i);

typedef struct es_runtime_model_stats {
  char name[ES_RT_NAME_MAX];
  int lane;
  int home_worker;
  int shared;                /* 1: shares its es_model with another entry */
  size_t weights_bytes;      /* of its es_model (shared ones counted once
                                in es_runtime_stats) */
  size_t planned_bytes;      /* arena bytes at the configured shape (0: none) */
  size_t pool_bytes;         /* its arena pool */
  size_t pool_in_use;        /* arenas of it in use now */
  size_t pool_high_water;    /* most in use at once */
  size_t weights_resident;   /* of weights_bytes' mapped region, resident */
  size_t int8_nodes;         /* its convolutions and matrix products in int8 ... */
  size_t float_nodes;        /* ... in float32 ... */
  size_t bf16_nodes;         /* ... and in bf16 (es_model_stats) */
  size_t w8_nodes;           /* of float_nodes, Convs from int8 weights (es_model_stats) */
  uint64_t completed, failed;
  double mean_run_ns;
  uint64_t preemptions;      /* times one of its runs was paused for a more
                                urgent request */
  uint64_t preempting;       /* its requests run in another's pause */
  unsigned pending;          /* submitted, not freed */
  int draining;
  unsigned sequences;        /* live now */
  size_t state_bytes;        /* their state memory, as reserved */
  uint64_t sequences_started, sequences_ended, sequences_evicted; /* evicted:
                                idle past sequence_idle_ms */
} es_runtime_model_stats;

ES_API void es_runtime_config_default(es_runtime_config *cfg);
ES_API void es_model_config_default(es_model_config *cfg);

/* Start the workers and the monitor. ES_EINVAL (detail names the field),
 * ES_ENOMEM. The caller owns the runtime. */
ES_API int es_runtime_create(const es_runtime_config *cfg, es_runtime **out);
/* Refuse new work, let queued and running requests finish (or leave at
 * their deadline), stop the threads, unload every model, free everything.
 * ES_EBUSY while request handles are still held (nothing is freed; new work
 * stays refused; free them and call again). NULL is a no-op returning 0.
 * Not thread-safe with other calls. */
ES_API int es_runtime_destroy(es_runtime *rt);

/* Load a model into the registry (planned at its configured shape, arena
 * pool or lane scratchpad sized) and return its id. ES_EBUSY for a name in
 * use, ES_ENOSPC when the registry is full, errors of es_model_load and
 * es_model_plan otherwise. Thread-safe; requests for other models go on. */
ES_API int es_runtime_model_load(es_runtime *rt, const es_model_config *cfg, int *id);
/* Refuse new requests for the model (DRAINING), wait up to timeout_ms
 * (< 0: forever) until every request submitted for it has completed and
 * been freed, then unload it. ES_ETIMEDOUT leaves it draining (call again,
 * or es_runtime_model_resume). ES_ENOENT for an unknown id. Thread-safe. */
ES_API int es_runtime_model_unload(es_runtime *rt, int id, int timeout_ms);
ES_API int es_runtime_model_resume(es_runtime *rt, int id);
/* Id of a loaded model by name, or ES_ENOENT. */
ES_API int es_runtime_model_find(es_runtime *rt, const char *name);
/* The loaded model (a new reference; es_model_release it). */
ES_API int es_runtime_model_get(es_runtime *rt, int id, es_model **out);

/* Submit a request. 0: queued, *out a handle the caller owns (free it with
 * es_request_free, also after a callback). ES_EAGAIN: refused, why says
 * why (queue full, over concurrency, over memory, memory pressure,
 * deadline, draining) with a retry-after; *out NULL. ES_ENOSPC: it can never
 * fit: more than the whole budget, or an arena or outputs larger than the
 * largest block the buddy pool can ever give (a shape other than the
 * configured one: why->limit is that block, retry_after_ms 0). ES_EINVAL /
 * ES_EMODEL: inputs that do not match the model (the detail names the
 * input). Thread-safe. */
ES_API int es_runtime_submit(es_runtime *rt, const es_submit *s, es_request **out, es_refusal *why);

/* Tasks: a function run on a worker under admission, for work that takes
 * memory the budget must see but is not a model run (decoding an image
 * before a pipeline runs). A task reserves `bytes` through the admission
 * gate on `model`'s behalf (es_admission_reserve: draining, pressure and
 * the budget apply, no concurrency slot is taken, so the model's own
 * requests are still admitted while the bytes are held), waits in the
 * queue of its priority like any request (bounded, deadline-checked,
 * trimmed under memory pressure), runs fn on any idle worker, and keeps the
 * reservation until its handle is freed: whatever fn allocated and handed
 * over through user stays budgeted as long as the caller keeps the handle.
 * fn's return is the request's status; its error detail is kept for
 * es_request_wait. A running task is not interrupted: fn checks the
 * deadline itself and returns ES_ETIMEDOUT (filled in as a DEADLINE
 * refusal). Tasks count in the runtime's submitted/completed/... counters,
 * not in the model's (its run time estimate stays its own), and hold the
 * model's pending count (unload waits for their handles).
 *
 * A task may submit requests and tasks of its own and wait for them: one
 * still queued when fn waits for it (es_request_wait) runs right there, on
 * fn's worker, in its own arena, as the next stage of the same work (a
 * model on another worker's lane in a block of the buddy pool). Until
 * then no other run pauses for it, and an idle worker takes it only if it
 * is not the first one fn left queued, so a pipeline's stages follow each
 * other on one thread while a batch of them still spreads over idle
 * workers. What fn leaves queued when it returns is scheduled as usual. */
typedef int (*es_task_fn)(void *user);

typedef struct es_task {
  int model;                 /* charged to this model (id from
                                es_runtime_model_load) */
  size_t bytes;              /* reserved from the budget until the handle
                                is freed */
  int priority;              /* 0 highest */
  uint64_t deadline_ns;      /* as es_submit's */
  es_task_fn fn;             /* run once, on a worker thread */
  void *user;                /* for fn and on_done; must stay valid until
                                the task completes */
  es_request_done_fn on_done; /* as es_submit's; NULL: none */
} es_task;

/* Submit a task. Returns as es_runtime_submit (0 and a handle, ES_EAGAIN
 * with why, ES_ENOSPC for more than the whole budget, ES_ENOENT for an
 * unknown model, ES_EINVAL). The handle has no outputs. Thread-safe. */
ES_API int es_runtime_submit_task(es_runtime *rt, const es_task *t, es_request **out,
                                  es_refusal *why);

/* Wait until the request completes (and its callback, if any, returned):
 * its status (0 or a negative error:
 * the run's error, ES_ECANCELED, ES_ETIMEDOUT for a passed deadline,
 * ES_EAGAIN when memory pressure removed it or the buddy pool had no block
 * for its arena or outputs at run time, with es_request_info's refusal
 * saying why and when to retry), or ES_ETIMEDOUT from the wait
 * itself when timeout_ms (>= 0) passed first; check es_request_status to
 * tell them apart. On an error status the calling thread's error detail is
 * the request's (the run's own detail, made on the worker). Thread-safe. */
ES_API int es_request_wait(es_request *r, int timeout_ms);
/* ES_REQUEST_PENDING while queued or running, then the final status. */
ES_API int es_request_status(es_request *r);
/* Take a queued request out of its queue: 0 and the request completes with
 * ES_ECANCELED. A run paused for a more urgent request is cancelled too
 * (0: it is dropped when its worker comes back to it, and completes with
 * ES_ECANCELED; its arena and reservation go back then). ES_EBUSY when it
 * is running (runs are not interrupted) and ES_ESTATE when it has
 * completed. Thread-safe. */
ES_API int es_request_cancel(es_request *r);
/* Output i of a completed request (data in the runtime's buddy pool, valid
 * until es_request_free). ES_ESTATE before completion or after a failure. */
ES_API int es_request_output(es_request *r, int i, es_tensor *out);
/* How many outputs the request's model has; 0 for a NULL or freed
 * handle. */
ES_API int es_request_output_count(es_request *r);
ES_API int es_request_info_get(es_request *r, es_request_info *out);
/* Release the handle: its outputs, its admission slot and bytes. A request
 * still queued is cancelled first; one still running is released when it
 * completes. NULL is a no-op. */
ES_API void es_request_free(es_request *r);

/* Stop or restart dispatching (queued requests stay queued). For tests and
 * for draining before maintenance. A task already running still runs the
 * requests it waits for (its work is under way: see es_task). Thread-safe. */
ES_API int es_runtime_pause(es_runtime *rt, int paused);
/* Read the memory state now (as the monitor does) and apply it. */
ES_API int es_runtime_watch_now(es_runtime *rt);

ES_API int es_runtime_stats_get(es_runtime *rt, es_runtime_stats *out);
ES_API int es_runtime_model_stats_get(es_runtime *rt, int id, es_runtime_model_stats *out);
ES_API int es_runtime_lane_stats_get(es_runtime *rt, int lane, es_lane_stats *out);
/* The admission gate (for its stats and limits). Owned by the runtime;
 * NULL for a NULL or dead runtime. */
ES_API es_admission *es_runtime_admission(es_runtime *rt);

#ifdef __cplusplus
}
#endif
#endif
