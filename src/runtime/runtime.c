/* The runtime: registry, priority queues, workers and lanes (BRIEF §4-§6).
 *
 * One mutex (rt->lock) guards the registry, the queues and the workers'
 * assignments; it is held only for bookkeeping, never across a run, a model
 * load or a callback. Admission (admission.c) is lock-free and is asked
 * before the lock is taken, so a refused request costs a few atomics.
 *
 * Scheduling is push, not pull: whenever something changes (a submit, a
 * finished run, a resume) dispatch_locked() walks the queues from the
 * highest priority down and gives each request the best idle worker that may
 * take it, until no idle worker can take anything. That keeps strict
 * priority between levels and FIFO within a level among requests that could
 * run on the same worker, and it is where affinity is decided: a worker that
 * just ran the model (its weights are warm in that core's cache), then the
 * model's home worker, then any idle one. A request pinned to a lane that is
 * busy does not hold back requests behind it that another worker can run.
 *
 * A request handle has two references: the caller's and the runtime's (the
 * latter dropped after the completion callback). Whoever drops the last one
 * gives back the admission ticket and the output block, so a slot stays
 * taken until the caller has consumed the outputs: what is in flight is
 * exactly what holds memory.
 *
 * Lanes: worker i owns lane i's scratchpad, one block sized by the largest
 * planned arena of the models assigned to it. Only that worker reads the
 * block's address (under the lock, when it starts a job), so a resize after
 * a load or unload is a pointer swap done by the worker itself between two
 * runs, and the old block is unmapped after it.
 *
 * Memory a request can never get is refused at submit, not found missing at
 * run time: besides the budget (admission), a shape other than the
 * configured one takes its arena from the buddy pool, whose largest block
 * is bounded (arena_fits). A run that still finds the pool short (blocks of
 * the requests beside it, fragmentation) completes with ES_EAGAIN and an
 * OVER_MEMORY refusal with a retry-after, like any other shortage: the
 * bytes were promised by admission and come back as those requests finish.
 *
 * Tasks are requests without a plan: a function run on a worker, admitted
 * with a byte reservation and no slot (es_admission_reserve), queued and
 * expired like the others. The reservation lives in the handle, so memory
 * a task hands to its caller (a decoded image) stays budgeted until the
 * caller frees the handle.
 *
 * Tasks that submit: a task is often a pipeline (decode, then a model,
 * then another), each stage a request it submits and waits for. Waiting
 * for a queued stage on a worker would leave that worker asleep while the
 * stage waits for a worker (with one worker, forever), and every stage
 * handed to another thread costs a wake-up, which on a loaded box can take
 * milliseconds. So a stage a task submits is marked as the task's while
 * queued (r->owner): the task runs it itself when it waits for it
 * (run_inline_locked), no other run pauses for it, and the first one is
 * kept from idle workers (kept_for_task) so the next stage starts on the
 * same thread; the others may spread over idle workers.
 *
 * Sequences (runtime.h): a model with state pairs keeps a table of live
 * sequences, each with its state in one buddy block under a byte
 * reservation of its own. One request of a sequence is active at a time;
 * the others wait in the sequence's line (RQ_PARKED), outside the queues
 * and without admission, because their inputs (the state) and so their
 * plan and bytes are known only when the one before completes. Completion
 * (complete_locked, under the lock) hands the sequence to the next in line
 * by putting it on rt->activate; finish_list, which every path that
 * completes requests calls outside the lock, plans and admits it there. */
#include "edgeserve/runtime.h"
#include "common/internal.h"

#include <stdatomic.h>
#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define RT_MAGIC 0x455352554e54494dull  /* "ESRUNTIM" */
#define RQ_MAGIC 0x4553524551554553ull  /* "ESREQUES" */
#define RQ_DEAD 0x4553524551444541ull
#define RT_MAX_LEVELS 16
#define RT_MAX_MODELS 1024
#define RT_PLAN_CACHE 32
#define RT_ALIGN 64
#define RT_DECAY_PASSES 10 /* es_buddy_purge calls per buddy_decay_ms */
#define RT_EWMA 0.2

enum { RQ_QUEUED = 1, RQ_RUNNING, RQ_DONE, RQ_PARKED };
enum { SLOT_FREE = 0, SLOT_LOADING, SLOT_LIVE, SLOT_UNLOADING };

/* A live sequence (see runtime.h, "Sequences"). Its fields change under
 * rt->lock, but for the state block, which only the sequence's active
 * request touches (one at a time), outside it. */
typedef struct rt_seq {
  int used;                  /* 0: a free slot */
  uint64_t id;               /* the caller's id, or 0 with key */
  char key[ES_SEQ_KEY_MAX];  /* the caller's string id, or "" with id */
  int busy;                  /* one of its requests is active: being
                                planned, queued or running */
  int has_state;             /* state[] holds the last request's outputs */
  int ended;                 /* END completed: requests waiting get ENOENT
                                unless they START it again */
  uint64_t last_ns;          /* the last request's submit or completion */
  es_request *wait_head, *wait_tail; /* submitted while busy, in order */
  unsigned waiting;
  es_tensor state[ES_RT_MAX_IO]; /* per pair: type and shape; data in block */
  void *block;               /* buddy block with the states, or NULL */
  size_t block_bytes;
  es_admit_ticket ticket;    /* the state's reservation (bytes only) */
  size_t reserved;           /* its bytes; 0: none yet */
} rt_seq;

typedef struct rt_model {
  int state; /* SLOT_* */
  char name[ES_RT_NAME_MAX];
  char *realpath;    /* for sharing one es_model between entries */
  int share;
  es_precision precision;
  es_model *model;
  es_plan_cache *cache;
  es_plan *cfg_plan; /* at the configured shape, or NULL */
  size_t planned;    /* its arena bytes */
  int lane;
  int home;
  int last_worker;
  es_arena_pool *pool;
  size_t pool_bytes;
  int n_in, n_out;
  es_dtype in_dtype[ES_RT_MAX_IO];
  unsigned pending; /* submitted, not yet freed */
  int draining;
  uint64_t completed, failed;
  double mean_run_ns;
  uint64_t preemptions, preempting;
  /* sequences: state pairs as input/output indices */
  int n_states;
  int state_in[ES_RT_MAX_IO], state_out[ES_RT_MAX_IO];
  es_tensor_info state_init[ES_RT_MAX_IO]; /* zeros at a start; rank -1:
                                               the caller must give it */
  rt_seq *seqs;
  unsigned max_seqs, live_seqs;
  uint64_t seq_idle_ns;
  int state_reserve;
  size_t state_max, state_budget, state_bytes;
  uint64_t seq_started, seq_ended, seq_evicted;
} rt_model;

typedef struct rt_worker {
  es_runtime *rt;
  int index;
  int cpu; /* pinned to, or -1 */
  pthread_t thread;
  int started;
  pthread_cond_t cv;
  es_request *job;
  /* lane: scratch/cap used by the worker; want_cap set by load/unload */
  void *scratch;
  size_t scratch_cap;
  size_t want_cap;
  int lane_models;
  size_t lane_sum;
  int last_model;
  uint64_t runs, switches, switch_ns_max;
  double switch_ns_sum;
  int depth; /* 1 while it runs a request in another's pause (no deeper) */
  struct rt_safe *safe; /* the run its kernels' safe points may pause, or NULL */
  es_request *task; /* the task whose function runs on it now (innermost), or NULL */
  int fifo;         /* its SCHED_FIFO priority now (rt_priority), 0: SCHED_OTHER */
} rt_worker;

typedef struct rt_queue {
  es_request *head, *tail;
  size_t count;
} rt_queue;

struct es_runtime {
  _Atomic size_t heap_bytes; /* run heaps' blocks out now (rt_heap) */
  /* The most urgent level with a queued request (INT_MAX: none), set under
   * lock by dispatch, read between steps by running workers. */
  _Atomic int urgent_level;
  _Atomic uint64_t urgent_deadline; /* EDF: the earliest queued deadline (0: none) */
  uint64_t preemptions;
  uint64_t preemptions_in_kernel; /* of those, at a kernel's safe point */
  uint64_t inlined; /* requests a task ran itself (run_inline_locked) */
  uint64_t pause_overhead_ns_sum, pause_overhead_ns_max, pause_lock_wait_ns_sum;
  uint64_t pause_hist[ES_RT_PAUSE_BUCKETS];
  uint64_t pause_ns_sum;
  uint64_t magic;
  es_runtime_config cfg;
  pthread_mutex_t lock;
  pthread_cond_t model_cv;   /* a model's pending count reached zero */
  pthread_cond_t monitor_cv; /* wakes the monitor: stop, new deadline */
  pthread_cond_t idle_cv;    /* queues and workers became idle */
  es_admission *adm;
  es_buddy *buddy;
  rt_model *models;
  int max_models;
  rt_worker *workers;
  int n_workers;
  int idle_workers;
  rt_queue q[RT_MAX_LEVELS];
  size_t queued;
  int paused, stopping;
  int finishing; /* completed requests whose callback or release is pending */
  int next_home;
  uint64_t seq;
  uint64_t submitted, completed, failed, cancelled, expired, dropped, refused;
  pthread_t monitor;
  int monitor_started;
  uint64_t next_watch_ns;
  uint64_t next_purge_ns; /* next es_buddy_purge of the pool */
  unsigned purge_passes;  /* since the last malloc_trim */
  es_request *activate;   /* sequence requests whose turn came, to plan and
                             queue outside the lock (finish_list) */
};

struct es_request {
  uint64_t magic;
  es_runtime *rt;
  int refs;  /* under rt->lock */
  int state; /* RQ_* */
  int status;
  int model, priority, worker, arena_source;
  uint64_t seq, deadline_ns, submit_ns, start_ns, end_ns, switch_ns;
  es_tensor inputs[ES_RT_MAX_IO];
  int n_in, n_out;
  es_plan *plan;
  size_t arena_bytes, out_bytes;
  es_admit_ticket ticket;
  int ran; /* the run happened: feeds the drain rate on release */
  int paused;        /* its run is paused for a more urgent request (under rt->lock) */
  int cancel_asked;  /* es_request_cancel while paused: dropped on resume */
  int preemptions;   /* times its run was paused */
  uint64_t paused_ns;
  int preempting;    /* it ran in another run's pause */
  int heap_refused; /* admission refused what the run took beyond its plan */
  int settled; /* done and its callback returned: waiters may go */
  es_tensor outputs[ES_RT_MAX_IO];
  void *out_block;
  es_refusal refusal;
  es_request_done_fn on_done;
  void *user;
  es_task_fn task;   /* a task: run instead of a plan (no arena, no outputs) */
  void *task_user;
  char detail[512];  /* why it failed, for es_request_wait's caller */
  int seq_slot;      /* its sequence's slot in the model, or -1 */
  int seq_active;    /* it holds the sequence (busy) */
  uint64_t seq_id;
  char seq_key[ES_SEQ_KEY_MAX];
  unsigned seq_flags;
  /* A request a running task submitted (see "Tasks that submit"): while
   * queued, its task; the task's first such request, which dispatch leaves
   * for the task to run itself; how many of its requests are queued. */
  es_request *owner, *own_next;
  unsigned owned;
  es_request *submitter; /* the task running on the submitting thread, or
                            NULL; read where the request is queued */
  pthread_cond_t cv;
  es_request *prev, *next; /* queue links, then the completion list */
};

/* The worker the calling thread is, or NULL: a task's submits and waits
 * (see "Tasks that submit") ask it. */
static _Thread_local rt_worker *tls_worker;


static void abs_timespec(uint64_t ns, struct timespec *ts) {
  ts->tv_sec = (time_t)(ns / 1000000000ull);
  ts->tv_nsec = (long)(ns % 1000000000ull);
}

/* Condition variables wait on CLOCK_MONOTONIC, so deadlines survive clock
 * changes. */
static int cond_init_mono(pthread_cond_t *cv) {
  pthread_condattr_t at;
  if (pthread_condattr_init(&at))
    return -1;
  pthread_condattr_setclock(&at, CLOCK_MONOTONIC);
  int rc = pthread_cond_init(cv, &at);
  pthread_condattr_destroy(&at);
  return rc ? -1 : 0;
}

static int rt_check(const es_runtime *rt, const char *fn) {
  if (!rt)
    return es__fail(ES_EINVAL, "%s: NULL runtime", fn);
  if (rt->magic != RT_MAGIC)
    return es__fail(ES_ECORRUPT, "%s: not a live runtime", fn);
  return 0;
}

static int rq_check(const es_request *r, const char *fn) {
  if (!r)
    return es__fail(ES_EINVAL, "%s: NULL request", fn);
  if (r->magic != RQ_MAGIC)
    return es__fail(ES_ECORRUPT, "%s: not a live request (freed twice?)", fn);
  return 0;
}

/* ---- configuration ------------------------------------------------------- */

void es_runtime_config_default(es_runtime_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->pin = 1;
  cfg->intra_threads = 1;
  cfg->priorities = 4;
  cfg->preempt = 1;
  cfg->rt_levels = 1;
  cfg->queue_capacity = 64;
  cfg->buddy_bytes = (size_t)64 << 20;
  cfg->watch_ms = 100;
  cfg->buddy_decay_ms = 10000;
  cfg->soft_ratio = 0.85;
  cfg->hard_ratio = 0.95;
  cfg->max_models = 32;
}

void es_model_config_default(es_model_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->lane = -1;
  cfg->share = 1;
}

/* The cores this process may run on, in order; worker i is pinned to the
 * (i mod n)-th. */
static int allowed_cpus(int *cpus, int max) {
  cpu_set_t set;
  int n = 0;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE && n < max; c++)
      if (CPU_ISSET(c, &set))
        cpus[n++] = c;
  }
  if (n == 0) {
    long k = sysconf(_SC_NPROCESSORS_ONLN);
    for (int c = 0; c < k && n < max; c++)
      cpus[n++] = c;
  }
  return n > 0 ? n : 1;
}

/* ---- queues (under the lock) --------------------------------------------- */

static void queue_push(rt_queue *q, es_request *r) {
  r->next = NULL;
  r->prev = q->tail;
  if (q->tail)
    q->tail->next = r;
  else
    q->head = r;
  q->tail = r;
  q->count++;
}

static void queue_remove(es_runtime *rt, es_request *r) {
  rt_queue *q = &rt->q[r->priority];
  if (r->owner) { /* off the queue, its task's claim ends */
    r->owner->owned--;
    if (r->owner->own_next == r)
      r->owner->own_next = NULL;
    r->owner = NULL;
  }
  if (r->prev)
    r->prev->next = r->next;
  else
    q->head = r->next;
  if (r->next)
    r->next->prev = r->prev;
  else
    q->tail = r->prev;
  r->prev = r->next = NULL;
  q->count--;
  rt->queued--;
}

/* ---- completion ----------------------------------------------------------- */

static int all_idle(const es_runtime *rt) {
  return rt->queued == 0 && rt->idle_workers == rt->n_workers && rt->finishing == 0;
}

/* Mark done and wake waiters. Without a callback the runtime's reference is
 * dropped right here, so a caller woken by es_request_wait who frees the
 * handle gives its slot back before es_request_free returns. With one, the
 * request goes on the list for finish_list() to call it once the lock is
 * released; so does a request whose last reference this was. */
static void seq_done_locked(es_runtime *rt, es_request *r, int status);

static void complete_locked(es_runtime *rt, es_request *r, int status, es_request **list) {
  if (r->seq_slot >= 0)
    seq_done_locked(rt, r, status);
  r->state = RQ_DONE;
  r->status = status;
  r->end_ns = es__now_ns();
  if (status < 0 && !r->detail[0]) {
    const char *what = rt->models[r->model].name;
    if (status == ES_ETIMEDOUT)
      snprintf(r->detail, sizeof r->detail, "%s: the deadline passed before the %s ran", what,
               r->task ? "task" : "model");
    else if (status == ES_ECANCELED)
      snprintf(r->detail, sizeof r->detail, "%s: cancelled before it ran", what);
    else if (status == ES_EAGAIN)
      snprintf(r->detail, sizeof r->detail, "%s: removed from the queue (%s), retry after %u ms",
               what, es_refusal_name(r->refusal.reason), r->refusal.retry_after_ms);
    else
      snprintf(r->detail, sizeof r->detail, "%s: %s", what, es_strerror(status));
  }
  if (status == 0)
    rt->completed++;
  else if (status == ES_ECANCELED)
    rt->cancelled++;
  else if (status == ES_ETIMEDOUT)
    rt->expired++;
  else if (status == ES_EAGAIN)
    rt->dropped++;
  else
    rt->failed++;
  if (!r->on_done) { /* with a callback, waiters are woken after it ran */
    r->settled = 1;
    pthread_cond_broadcast(&r->cv);
  }
  if (!r->on_done && --r->refs > 0) {
    if (all_idle(rt))
      pthread_cond_broadcast(&rt->idle_cv);
    return;
  }
  rt->finishing++;
  r->next = *list;
  *list = r;
}

static void request_destroy(es_request *r) {
  es_runtime *rt = r->rt;
  if (r->ticket.magic)
    (void)(r->ran ? es_admission_done(rt->adm, &r->ticket, r->end_ns - r->start_ns)
                  : es_admission_cancel(rt->adm, &r->ticket));
  if (r->out_block)
    es_buddy_free(rt->buddy, r->out_block);
  es_plan_release(r->plan);
  pthread_mutex_lock(&rt->lock);
  rt_model *m = &rt->models[r->model];
  if (--m->pending == 0)
    pthread_cond_broadcast(&rt->model_cv);
  pthread_mutex_unlock(&rt->lock);
  pthread_cond_destroy(&r->cv);
  r->magic = RQ_DEAD;
  es_mem_free(r);
}

static void drop_ref(es_request *r) {
  es_runtime *rt = r->rt;
  pthread_mutex_lock(&rt->lock);
  int last = --r->refs == 0;
  pthread_mutex_unlock(&rt->lock);
  if (last)
    request_destroy(r);
}

static int seq_activate_next(es_runtime *rt, es_request **done);

/* Callbacks, then the runtime's reference; never under the lock. Then the
 * sequence requests whose turn came meanwhile are planned and queued (a
 * refusal completes one, which goes round again). */
static void finish_list(es_runtime *rt, es_request *list) {
  do {
    while (list) {
      es_request *r = list;
      list = r->next;
      r->next = NULL;
      int last = 1; /* a request without callback is here only as the last ref */
      if (r->on_done) {
        r->on_done(r->user, r);
        pthread_mutex_lock(&rt->lock);
        r->settled = 1;
        pthread_cond_broadcast(&r->cv);
        last = --r->refs == 0;
        pthread_mutex_unlock(&rt->lock);
      }
      if (last)
        request_destroy(r);
      pthread_mutex_lock(&rt->lock);
      rt->finishing--;
      if (all_idle(rt))
        pthread_cond_broadcast(&rt->idle_cv);
      pthread_mutex_unlock(&rt->lock);
    }
  } while (seq_activate_next(rt, &list));
}

/* ---- sequences -------------------------------------------------------------- */

static int plan_request(es_runtime *rt, const rt_model *m, const es_submit *s, es_request *r);
static int arena_fits(es_runtime *rt, const rt_model *m, const es_request *r, es_refusal *why);
static int request_admit(es_runtime *rt, rt_model *m, es_request *r, es_refusal *why);
static void request_discard(es_runtime *rt, rt_model *m, es_request *r);

/* Bytes of a sequence's state block: each state 64-byte aligned. */
static size_t state_layout(const size_t *bytes, int n, size_t *off) {
  size_t at = 0;
  for (int k = 0; k < n; k++) {
    off[k] = at;
    at += es__align_up(bytes[k], RT_ALIGN);
  }
  return at;
}

/* The live sequence of that id (key NULL) or string id, or NULL. */
static rt_seq *seq_find_locked(rt_model *m, uint64_t id, const char *key) {
  for (unsigned i = 0; i < m->max_seqs; i++) {
    rt_seq *q = &m->seqs[i];
    if (q->used && q->id == id && !strcmp(q->key, key ? key : ""))
      return q;
  }
  return NULL;
}

static rt_seq *seq_free_slot_locked(rt_model *m) {
  for (unsigned i = 0; i < m->max_seqs; i++)
    if (!m->seqs[i].used)
      return &m->seqs[i];
  return NULL;
}

/* "sequence 12" or "sequence 'abc'", for messages. */
static const char *seq_name(const es_request *r, char *buf, size_t size) {
  if (r->seq_key[0])
    snprintf(buf, size, "sequence '%s'", r->seq_key);
  else
    snprintf(buf, size, "sequence %llu", (unsigned long long)r->seq_id);
  return buf;
}

/* The slot's state and reservation go back; the slot is free. */
static void seq_free_locked(es_runtime *rt, rt_model *m, rt_seq *q) {
  if (q->block)
    es_buddy_free(rt->buddy, q->block);
  if (q->reserved) {
    es_admission_cancel(rt->adm, &q->ticket);
    m->state_bytes -= q->reserved;
  }
  m->live_seqs--;
  memset(q, 0, sizeof *q);
}

/* Sequences with no request for their idle time are ended. */
static void seq_evict_locked(es_runtime *rt, rt_model *m, uint64_t now) {
  for (unsigned i = 0; m->seqs && i < m->max_seqs; i++) {
    rt_seq *q = &m->seqs[i];
    if (q->used && !q->busy && now - q->last_ns >= m->seq_idle_ns) {
      seq_free_locked(rt, m, q);
      m->seq_evicted++;
    }
  }
}

/* The sequence's active request let go of it (done, or refused before it
 * was queued): the next waiting request gets its turn (planned and queued
 * by finish_list, outside the lock), or the sequence goes idle, or, ended,
 * is freed. */
static void seq_release_locked(es_runtime *rt, rt_model *m, rt_seq *q, const es_request *r,
                               int status) {
  q->last_ns = es__now_ns();
  if ((r->seq_flags & ES_SEQ_END) && (status == 0 || r->ran)) {
    q->ended = 1;
    m->seq_ended++;
  } else if (status < 0 && !q->has_state) {
    q->ended = 1; /* a start that never got its state: nothing to go on from */
  }
  es_request *p = q->wait_head;
  if (p) {
    q->wait_head = p->next;
    if (!q->wait_head)
      q->wait_tail = NULL;
    q->waiting--;
    p->next = rt->activate;
    rt->activate = p;
    p->seq_active = 1;
    p->state = RQ_RUNNING; /* being planned: not cancellable, like a run */
    return;
  }
  q->busy = 0;
  if (q->ended)
    seq_free_locked(rt, m, q);
}

/* From complete_locked: a waiting request leaves its sequence's line; the
 * active one hands the sequence on. */
static void seq_done_locked(es_runtime *rt, es_request *r, int status) {
  rt_model *m = &rt->models[r->model];
  rt_seq *q = &m->seqs[r->seq_slot];
  if (r->state == RQ_PARKED) {
    es_request **pp = &q->wait_head, *prev = NULL;
    while (*pp && *pp != r) {
      prev = *pp;
      pp = &(*pp)->next;
    }
    if (*pp) {
      *pp = r->next;
      if (q->wait_tail == r)
        q->wait_tail = prev;
      q->waiting--;
    }
    r->next = NULL;
  } else if (r->seq_active) {
    r->seq_active = 0;
    seq_release_locked(rt, m, q, r, status);
  }
  r->seq_slot = -1;
}

/* What the sequence's state reserves before this request runs: `need`
 * bytes, the larger of its state now and after the run. A state never
 * takes the room the model's runs need: the reservation is refused
 * (OVER_MEMORY) unless the budget keeps, beside it, `keep` bytes, as many
 * requests like this one as there are workers. Otherwise sequences whose
 * states filled the budget would leave none of their own steps able to
 * run, and every one of them would wait on the others for good. */
static int seq_reserve(es_runtime *rt, rt_model *m, rt_seq *q, int model, size_t need,
                       size_t keep, es_refusal *why) {
  int max_mode = m->state_reserve == ES_STATE_RESERVE_MAX;
  if (q->reserved && need <= q->reserved)
    return 0;
  if (q->reserved && max_mode)
    return es__fail(ES_ENOSPC, "%s: the sequence's state would grow to %zu B, past the %zu B "
                    "it reserved at its start (state_max_bytes)", m->name, need, q->reserved);
  size_t want = need;
  if (!q->reserved && max_mode && m->state_max > want)
    want = m->state_max;
  if (!want)
    return 0;
  size_t grow = want - q->reserved;
  if (m->state_budget && want > m->state_budget)
    return es__fail(ES_ENOSPC, "%s: a sequence's state of %zu B exceeds the model's state "
                    "budget of %zu B", m->name, want, m->state_budget);
  /* The model's cap first, taken under the lock so that two starts cannot
   * both pass it; given back if admission then refuses. */
  pthread_mutex_lock(&rt->lock);
  int capped = m->state_budget && grow > m->state_budget - m->state_bytes;
  size_t held = m->state_bytes;
  if (!capped)
    m->state_bytes += grow;
  pthread_mutex_unlock(&rt->lock);
  int rc;
  es_admission_stats as;
  if (capped) {
    es_admission_refuse(rt->adm, model, ES_REFUSE_OVER_MEMORY, 0, why);
    why->requested = grow;
    why->in_use = held;
    why->limit = m->state_budget;
    return es__fail(ES_EAGAIN, "%s: its sequences' states hold %zu B of their %zu B budget, "
                    "%zu B more do not fit; retry after %u ms", m->name, held, m->state_budget,
                    grow, why->retry_after_ms);
  }
  if (es_admission_stats_get(rt->adm, &as) == 0 && as.memory_budget_bytes &&
      (keep > as.memory_budget_bytes || grow > as.memory_budget_bytes - keep ||
       as.reserved_bytes > as.memory_budget_bytes - keep - grow)) {
    es_admission_refuse(rt->adm, model, ES_REFUSE_OVER_MEMORY, 0, why);
    why->requested = grow;
    why->in_use = as.reserved_bytes;
    why->limit = as.memory_budget_bytes;
    if (keep + want > as.memory_budget_bytes) /* alone in the budget it would not fit */
      rc = es__fail(ES_ENOSPC, "%s: a sequence's state of %zu B beside its runs (%zu B) "
                    "exceeds the memory budget of %zu B", m->name, want, keep,
                    as.memory_budget_bytes);
    else
      rc = es__fail(ES_EAGAIN, "%s: no room in the memory budget for %zu B more of the "
                    "sequence's state beside its runs; retry after %u ms", m->name, grow,
                    why->retry_after_ms);
  } else {
    rc = q->reserved ? es_admission_grow(rt->adm, &q->ticket, grow, why)
                     : es_admission_reserve(rt->adm, model, want, &q->ticket, why);
  }
  if (rc < 0) {
    pthread_mutex_lock(&rt->lock);
    m->state_bytes -= grow;
    pthread_mutex_unlock(&rt->lock);
    return rc;
  }
  q->reserved = want;
  return 0;
}

/* A block for the state of `total` bytes, the old one given back first. */
static int seq_block(es_runtime *rt, rt_seq *q, size_t total) {
  if (q->block && q->block_bytes == total)
    return 0;
  if (q->block)
    es_buddy_free(rt->buddy, q->block);
  q->block = NULL;
  q->block_bytes = 0;
  if (total) {
    int rc = es_buddy_alloc(rt->buddy, total, &q->block);
    if (rc < 0)
      return rc;
  }
  q->block_bytes = total;
  return 0;
}

/* The sequence's turn for r (it is active): its state inputs bound, its
 * plan, the state's reservation, admission and the queue. 0: queued. On
 * failure r is not queued (the caller completes or discards it) and the
 * sequence's state is as before, but for a START past its reservation,
 * which has reset it. */
static int seq_activate(es_runtime *rt, es_request *r, es_refusal *why) {
  rt_model *m = &rt->models[r->model];
  rt_seq *q = &m->seqs[r->seq_slot];
  int start = (r->seq_flags & ES_SEQ_START) != 0;
  char sname[ES_SEQ_KEY_MAX + 16];
  if (!start && (q->ended || !q->has_state))
    return es__fail(ES_ENOENT, "%s: %s is not live (it ended, or its start failed)", m->name,
                    seq_name(r, sname, sizeof sname));
  es_tensor in[ES_RT_MAX_IO];
  memcpy(in, r->inputs, (size_t)m->n_in * sizeof *in);
  size_t bytes[ES_RT_MAX_IO], off[ES_RT_MAX_IO], before = q->block_bytes;
  int rc;
  if (start) { /* the state the caller gave, else zeros of the configured shape */
    for (int k = 0; k < m->n_states; k++) {
      es_tensor *t = &in[m->state_in[k]];
      const es_tensor_info *z = &m->state_init[k];
      bytes[k] = 0;
      if (t->data)
        continue;
      if (z->rank < 0)
        return es__fail(ES_EINVAL, "%s: state input '%s' has no known rank: give it with the "
                        "sequence's start, or configure its shape", m->name, z->name);
      bytes[k] = es_dtype_size(z->dtype);
      for (int d = 0; d < z->rank; d++)
        bytes[k] *= (size_t)z->dims[d];
      t->dtype = z->dtype;
      t->rank = z->rank;
      memcpy(t->dims, z->dims, sizeof t->dims);
      t->nbytes = bytes[k];
      t->data = bytes[k] ? (void *)in : NULL; /* for planning; the zeros' block below */
    }
    before = state_layout(bytes, m->n_states, off);
  } else {
    for (int k = 0; k < m->n_states; k++) {
      const char *nm = in[m->state_in[k]].name;
      in[m->state_in[k]] = q->state[k];
      in[m->state_in[k]].name = nm;
    }
  }
  es_submit sub = {.model = r->model, .inputs = in, .n_inputs = m->n_in};
  if ((rc = plan_request(rt, m, &sub, r)) < 0)
    return rc;
  size_t after = 0;
  for (int k = 0; k < m->n_states; k++) {
    es_tensor_info oi;
    es_plan_output_info(r->plan, m->state_out[k], &oi);
    size_t n = es_dtype_size(oi.dtype);
    for (int d = 0; d < oi.rank; d++)
      n *= (size_t)(oi.dims[d] > 0 ? oi.dims[d] : 0);
    after += es__align_up(n, RT_ALIGN);
  }
  size_t keep = (r->arena_bytes + r->out_bytes) * (size_t)rt->n_workers;
  if ((rc = seq_reserve(rt, m, q, r->model, after > before ? after : before, keep, why)) < 0)
    return rc;
  if (start) { /* the zeros go where the state will be */
    q->has_state = 0;
    if (seq_block(rt, q, before) < 0)
      goto short_mem;
    if (before)
      memset(q->block, 0, before);
    for (int k = 0; k < m->n_states; k++)
      if (bytes[k])
        r->inputs[m->state_in[k]].data = (char *)q->block + off[k];
    q->ended = 0;
  }
  if ((rc = arena_fits(rt, m, r, why)) < 0)
    return rc;
  if ((rc = request_admit(rt, m, r, why)) < 0)
    return rc;
  if (start) { /* counted once admitted: a refused start began nothing */
    pthread_mutex_lock(&rt->lock);
    m->seq_started++;
    pthread_mutex_unlock(&rt->lock);
  }
  return 0;

short_mem:
  es_admission_refuse(rt->adm, r->model, ES_REFUSE_OVER_MEMORY, 0, why);
  return es__fail(ES_EAGAIN, "%s: no block of the buddy pool for the sequence's state now; "
                  "retry after %u ms", m->name, why->retry_after_ms);
}

/* After a successful run: the state outputs become the sequence's state.
 * A step that ends the sequence keeps nothing. A state that changed size
 * takes its new block before the old one goes back: when the pool has
 * none now, the state from before this step stays whole, *short_mem is
 * set and the step is answered as a refusal (send it again; it runs on the
 * same state), so a sequence never loses its state to a moment's
 * shortage. */
static int seq_keep_state(es_runtime *rt, es_request *r, int *short_mem) {
  rt_model *m = &rt->models[r->model];
  rt_seq *q = &m->seqs[r->seq_slot];
  if (r->seq_flags & ES_SEQ_END)
    return 0;
  size_t bytes[ES_RT_MAX_IO], off[ES_RT_MAX_IO];
  for (int k = 0; k < m->n_states; k++)
    bytes[k] = r->outputs[m->state_out[k]].nbytes;
  size_t total = state_layout(bytes, m->n_states, off);
  void *blk = q->block;
  if (!q->block || q->block_bytes != total) {
    blk = NULL;
    if (total && es_buddy_alloc(rt->buddy, total, &blk) < 0) {
      char nm[ES_SEQ_KEY_MAX + 16];
      *short_mem = 1;
      return es__fail(ES_EAGAIN, "%s: %s ran, but the buddy pool had no %zu B block for its "
                      "new state; it keeps its state from before this step", m->name,
                      seq_name(r, nm, sizeof nm), total);
    }
  }
  for (int k = 0; k < m->n_states; k++) {
    const es_tensor *o = &r->outputs[m->state_out[k]];
    q->state[k] = *o;
    q->state[k].data = bytes[k] ? (char *)blk + off[k] : NULL;
    if (bytes[k])
      memcpy(q->state[k].data, o->data, bytes[k]);
  }
  if (blk != q->block) {
    if (q->block)
      es_buddy_free(rt->buddy, q->block);
    q->block = blk;
    q->block_bytes = total;
  }
  q->has_state = 1;
  return 0;
}

/* finish_list's second half: the requests whose sequence turn came. A
 * refusal then completes the request (its caller holds the handle). */
static int seq_activate_next(es_runtime *rt, es_request **done) {
  pthread_mutex_lock(&rt->lock);
  es_request *p = rt->activate;
  if (p) {
    rt->activate = p->next;
    p->next = NULL;
  }
  pthread_mutex_unlock(&rt->lock);
  if (!p)
    return 0;
  es_refusal why;
  memset(&why, 0, sizeof why);
  int rc = seq_activate(rt, p, &why);
  if (rc == 0)
    return 1;
  pthread_mutex_lock(&rt->lock);
  snprintf(p->detail, sizeof p->detail, "%s", es_last_error_detail());
  if (rc == ES_EAGAIN)
    p->refusal = why;
  complete_locked(rt, p, rc, done);
  pthread_mutex_unlock(&rt->lock);
  return 1;
}

/* A sequence request at submit: its sequence found (or started), then its
 * turn taken now or its place in the sequence's line. 0: queued or
 * waiting (*out set); else r was discarded. */
static int seq_submit(es_runtime *rt, rt_model *m, const es_submit *s, es_request *r,
                      es_refusal *why) {
  int start = (s->sequence_flags & ES_SEQ_START) != 0;
  if (!m->n_states) {
    request_discard(rt, m, r);
    return es__fail(ES_EINVAL, "%s has no state inputs: it takes no sequences", m->name);
  }
  if (s->n_inputs != m->n_in || !s->inputs) {
    request_discard(rt, m, r);
    return es__fail(ES_EINVAL, "%s takes %d inputs, got %d", m->name, m->n_in, s->n_inputs);
  }
  for (int k = 0; k < m->n_states; k++)
    if (!start && s->inputs[m->state_in[k]].data) {
      request_discard(rt, m, r);
      return es__fail(ES_EINVAL, "%s: input '%s' is the sequence's state: the runtime feeds it "
                      "after the start", m->name, m->state_init[k].name);
    }
  memcpy(r->inputs, s->inputs, (size_t)m->n_in * sizeof *r->inputs);
  r->seq_id = s->sequence;
  if (s->sequence_key)
    snprintf(r->seq_key, sizeof r->seq_key, "%s", s->sequence_key);
  r->seq_flags = s->sequence_flags;
  char nm[ES_SEQ_KEY_MAX + 16];
  seq_name(r, nm, sizeof nm);
  pthread_mutex_lock(&rt->lock);
  rt_seq *q = seq_find_locked(m, r->seq_id, r->seq_key);
  if (!q && !start) {
    pthread_mutex_unlock(&rt->lock);
    request_discard(rt, m, r);
    return es__fail(ES_ENOENT, "%s: %s is not live (never started, ended, or idle past its "
                    "timeout): start it with sequence_start", m->name, nm);
  }
  int reason = 0;
  if (!q) {
    if (m->live_seqs >= m->max_seqs)
      seq_evict_locked(rt, m, es__now_ns());
    q = seq_free_slot_locked(m);
    if (!q)
      reason = ES_REFUSE_OVER_CONCURRENCY;
    else {
      q->used = 1;
      q->id = r->seq_id;
      memcpy(q->key, r->seq_key, sizeof q->key);
      m->live_seqs++;
    }
  }
  if (!reason && q->busy && q->waiting >= rt->cfg.queue_capacity)
    reason = ES_REFUSE_QUEUE_FULL;
  if (reason) {
    size_t backlog = reason == ES_REFUSE_QUEUE_FULL ? q->waiting : m->live_seqs;
    rt->refused++;
    pthread_mutex_unlock(&rt->lock);
    es_admission_refuse(rt->adm, r->model, reason, backlog, why);
    request_discard(rt, m, r);
    if (reason == ES_REFUSE_QUEUE_FULL)
      return es__fail(ES_EAGAIN, "%s: %s has %u requests waiting", m->name, nm, q->waiting);
    return es__fail(ES_EAGAIN, "%s: %u sequences are live, its most", m->name, m->max_seqs);
  }
  r->seq_slot = (int)(q - m->seqs);
  q->last_ns = es__now_ns();
  if (q->busy) { /* its turn comes when the one before it completes */
    r->state = RQ_PARKED;
    r->submitter = NULL; /* queued later, by whoever completes the one before */
    r->next = NULL;
    if (q->wait_tail)
      q->wait_tail->next = r;
    else
      q->wait_head = r;
    q->wait_tail = r;
    q->waiting++;
    pthread_mutex_unlock(&rt->lock);
    return 0;
  }
  q->busy = 1;
  r->seq_active = 1;
  pthread_mutex_unlock(&rt->lock);
  int rc = seq_activate(rt, r, why);
  if (rc == 0)
    return 0;
  char detail[512];
  snprintf(detail, sizeof detail, "%s", es_last_error_detail());
  pthread_mutex_lock(&rt->lock);
  r->seq_active = 0;
  seq_release_locked(rt, m, q, r, rc);
  pthread_mutex_unlock(&rt->lock);
  finish_list(rt, NULL); /* a request that waited meanwhile gets its turn */
  request_discard(rt, m, r);
  return es__fail(rc, "%s", detail);
}

/* ---- dispatch (under the lock) ------------------------------------------- */

static int worker_idle(const es_runtime *rt, int w) { return w >= 0 && !rt->workers[w].job; }

static int choose_worker(es_runtime *rt, const es_request *r) {
  const rt_model *m = &rt->models[r->model];
  if (m->lane >= 0 && !r->task) /* a task touches no scratchpad */
    return worker_idle(rt, m->lane) ? m->lane : -1;
  if (worker_idle(rt, m->last_worker))
    return m->last_worker;
  if (worker_idle(rt, m->home))
    return m->home;
  for (int k = 1; k <= rt->n_workers; k++) {
    int w = (m->home + k) % rt->n_workers;
    if (worker_idle(rt, w))
      return w;
  }
  return -1;
}

/* The most urgent level still queued (and under EDF the earliest queued
 * deadline), for the running workers' check between steps. */
static void urgent_update_locked(es_runtime *rt) {
  int lvl = INT_MAX;
  uint64_t dl = 0;
  int edf = rt->cfg.sched == ES_SCHED_EDF;
  for (int l = 0; l < rt->cfg.priorities; l++) {
    if (lvl != INT_MAX && !edf)
      break;
    /* a task's own requests wait for it, not for another run's pause */
    for (es_request *r = rt->q[l].head; r; r = r->next) {
      if (r->owner)
        continue;
      if (lvl == INT_MAX)
        lvl = l;
      if (!edf)
        break;
      if (r->deadline_ns && (!dl || r->deadline_ns < dl))
        dl = r->deadline_ns;
    }
  }
  atomic_store_explicit(&rt->urgent_level, lvl, memory_order_relaxed);
  atomic_store_explicit(&rt->urgent_deadline, dl, memory_order_relaxed);
}

/* EDF's order: a deadline before none, an earlier one first; then priority,
 * then submission. 1 when a goes before b. */
static int edf_before(const es_request *a, const es_request *b) {
  if (a->deadline_ns != b->deadline_ns) {
    if (!a->deadline_ns || !b->deadline_ns)
      return a->deadline_ns != 0;
    return a->deadline_ns < b->deadline_ns;
  }
  if (a->priority != b->priority)
    return a->priority < b->priority;
  return a->seq < b->seq;
}

/* 1: r waits for the task that submitted it to run it (its first queued
 * request), so no idle worker takes it. */
static int kept_for_task(const es_request *r) { return r->owner && r->owner->own_next == r; }

static void dispatch_locked(es_runtime *rt) {
  while (!rt->paused && rt->idle_workers > 0 && rt->queued > 0) {
    es_request *pick = NULL;
    int w = -1;
    if (rt->cfg.sched == ES_SCHED_EDF) {
      for (int l = 0; l < rt->cfg.priorities; l++)
        for (es_request *r = rt->q[l].head; r; r = r->next) {
          int rw;
          if (!kept_for_task(r) && (!pick || edf_before(r, pick)) &&
              (rw = choose_worker(rt, r)) >= 0) {
            pick = r;
            w = rw;
          }
        }
    }
    for (int l = 0; l < rt->cfg.priorities && !pick; l++)
      for (es_request *r = rt->q[l].head; r; r = r->next)
        if (!kept_for_task(r) && (w = choose_worker(rt, r)) >= 0) {
          pick = r;
          break;
        }
    if (!pick)
      return;
    queue_remove(rt, pick);
    pick->state = RQ_RUNNING;
    pick->worker = w;
    rt->workers[w].job = pick;
    rt->idle_workers--;
    if (!pick->task) /* affinity follows the model's weights, not its tasks */
      rt->models[pick->model].last_worker = w;
    pthread_cond_signal(&rt->workers[w].cv);
  }
  urgent_update_locked(rt);
}

/* ---- workers -------------------------------------------------------------- */

static void pin_self(int cpu) {
  if (cpu < 0)
    return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  (void)pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

/* Copy the outputs into one buddy block: the arena goes back to its owner
 * (lane, pool, buddy) as soon as the run ends, the outputs live until the
 * caller frees the handle. Outputs made without a plan (es_plan_run_heap)
 * can be larger than the plan said: the request's admission grows by the
 * difference first (refused: *short_mem, answered like a pool without a
 * block). */
static int keep_outputs(es_runtime *rt, es_request *r, const es_tensor *outs, int *short_mem) {
  void *blk = NULL;
  size_t need = 0;
  for (int i = 0; i < r->n_out; i++)
    need += es__align_up(outs[i].nbytes, RT_ALIGN);
  if (need > r->out_bytes) {
    if (r->ticket.magic) {
      int rc = es_admission_grow(rt->adm, &r->ticket, need - r->out_bytes, &r->refusal);
      if (rc < 0) {
        r->heap_refused = 1;
        *short_mem = 1;
        return rc;
      }
    }
    r->out_bytes = need;
  }
  if (r->out_bytes) {
    int rc = es_buddy_alloc(rt->buddy, r->out_bytes, &blk);
    if (rc < 0) {
      *short_mem = 1;
      return rc;
    }
  }
  size_t off = 0;
  for (int i = 0; i < r->n_out; i++) {
    r->outputs[i] = outs[i];
    r->outputs[i].data = (char *)blk + off;
    if (outs[i].nbytes)
      memcpy(r->outputs[i].data, outs[i].data, outs[i].nbytes);
    off += es__align_up(outs[i].nbytes, RT_ALIGN);
  }
  r->out_block = blk;
  return 0;
}

/* The run heap of one request (es_run_heap): what its plan cannot bound
 * (a Loop, what follows a value no bound covers) takes blocks of the buddy
 * pool, each charged to the request's admission first and given back as
 * the run frees it. A refusal (the reservation cannot grow, or the pool has
 * no block) stops the run; the request is answered 503 with Retry-After,
 * never meeting a failed malloc. */
typedef struct rt_heap {
  es_runtime *rt;
  es_request *r;
  size_t held;     /* bytes of blocks out now */
  int refused;     /* admission refused (r->refusal holds why) */
  int no_block;    /* the pool had no block */
} rt_heap;

static int rt_heap_alloc(void *user, size_t bytes, void **out) {
  rt_heap *h = user;
  es_runtime *rt = h->rt;
  void *blk;
  if (es_buddy_alloc(rt->buddy, bytes, &blk) < 0) {
    h->no_block = 1;
    return es__fail(ES_EAGAIN, "no block of %zu B in the buddy pool for what the run takes "
                    "beyond its plan (%zu B held)", bytes, h->held);
  }
  size_t u = bytes;
  (void)es_buddy_usable_size(rt->buddy, blk, &u);
  if (h->r->ticket.magic) {
    int rc = es_admission_grow(rt->adm, &h->r->ticket, u, &h->r->refusal);
    if (rc < 0) {
      es_buddy_free(rt->buddy, blk);
      h->refused = 1;
      return es__fail(ES_EAGAIN, "the run needs %zu B beyond its plan (%zu B held) and admission "
                      "refuses them (%s)", u, h->held, es_refusal_name(h->r->refusal.reason));
    }
  }
  h->held += u;
  atomic_fetch_add_explicit(&rt->heap_bytes, u, memory_order_relaxed);
  *out = blk;
  return 0;
}

static void rt_heap_free(void *user, void *ptr) {
  rt_heap *h = user;
  es_runtime *rt = h->rt;
  size_t u = 0;
  if (es_buddy_usable_size(rt->buddy, ptr, &u) < 0)
    u = 0;
  es_buddy_free(rt->buddy, ptr);
  if (h->r->ticket.magic && u)
    (void)es_admission_shrink(rt->adm, &h->r->ticket, u);
  h->held -= u < h->held ? u : h->held;
  atomic_fetch_sub_explicit(&rt->heap_bytes, u, memory_order_relaxed);
}

/* Run one request with the arena its model's configuration gives it.
 * *short_mem: the buddy pool had no block for the arena or the outputs now
 * (the bytes were admitted, but others' blocks or fragmentation hold the
 * pool), which the caller answers as a refusal, not a failure. */
static int serve_urgent(rt_worker *w, es_request *cur, int in_kernel);
static void worker_sched(rt_worker *w, int level);
static int urgent_waiting(es_runtime *rt, const es_request *cur);

/* A run its kernels may pause at their safe points (es_engine_split_set:
 * between two bands of a long convolution), as run_request does between
 * steps; a cancel asked meanwhile is acted on after the step. */
typedef struct rt_safe {
  rt_worker *w;
  es_request *r;
  int cancelled;
} rt_safe;

static void safe_point(void *user) {
  rt_safe *s = user;
  if (urgent_waiting(s->w->rt, s->r) && serve_urgent(s->w, s->r, 1) == 2)
    s->cancelled = 1;
}

/* The worker's safe-point hook: s's run, or none (NULL). */
static void safe_set(rt_worker *w, rt_safe *s) {
  w->safe = s;
  es_engine_safe_point_set(s ? safe_point : NULL, s);
}

static int run_request(rt_worker *w, es_request *r, void *scratch, size_t scratch_cap,
                       int *short_mem) {
  es_runtime *rt = w->rt;
  rt_model *m = &rt->models[r->model];
  es_arena local, *a = NULL;
  memset(&local, 0, sizeof local); /* not a live arena until initialised */
  void *blk = NULL;
  int rc;
  size_t need = r->arena_bytes + ES_ARENA_GUARD + RT_ALIGN;
  uint64_t t0 = es__now_ns();
  if (m->lane == w->index && scratch && need <= scratch_cap) {
    /* A lane switch is this: point an arena at the shared scratchpad. */
    rc = es_arena_init(&local, scratch, scratch_cap, RT_ALIGN);
    a = &local;
    r->arena_source = ES_ARENA_FROM_LANE;
    uint64_t sw = es__now_ns() - t0;
    w->runs++;
    if (w->last_model != r->model) {
      r->switch_ns = sw;
      w->switches++;
      w->switch_ns_sum += (double)sw;
      if (sw > w->switch_ns_max)
        w->switch_ns_max = sw;
    }
    w->last_model = r->model;
  } else if (m->pool && r->plan == m->cfg_plan &&
             es_arena_pool_try_acquire(m->pool, &a) == 0) {
    rc = 0;
    r->arena_source = ES_ARENA_FROM_POOL;
  } else {
    rc = es_buddy_alloc(rt->buddy, need, &blk);
    if (rc < 0)
      *short_mem = 1;
    else
      rc = es_arena_init(&local, blk, need, RT_ALIGN);
    a = &local;
    r->arena_source = ES_ARENA_FROM_BUDDY;
  }
  if (rc == 0) {
    es_tensor outs[ES_RT_MAX_IO];
    rt_heap h = {.rt = rt, .r = r};
    es_run_heap heap = {rt_heap_alloc, rt_heap_free, &h};
    /* Step by step, looking between steps for a more urgent request that
     * no worker is free to take (not in a lane's scratchpad, which holds
     * one model at a time, and not inside another's pause). */
    es_run run;
    int can_pause = rt->cfg.preempt && w->depth == 0 && r->arena_source != ES_ARENA_FROM_LANE;
    /* Kernels' safe points pause this run only (a request run in its pause
     * has none: the hook goes back to the outer run after). */
    rt_safe sp = {w, r, 0}, *outer = w->safe;
    safe_set(w, can_pause ? &sp : NULL);
    rc = es_run_begin(&run, r->plan, r->inputs, r->n_in, a, &heap);
    while (rc == 0 && can_pause) {
      int left = es_run_steps(&run, 1);
      if (left <= 0) {
        rc = left < 0 ? left : 0;
        break;
      }
      if (!sp.cancelled && urgent_waiting(rt, r) && serve_urgent(w, r, 0) == 2)
        sp.cancelled = 1;
      if (sp.cancelled)
        break;
    }
    /* cancelled in a pause between steps or inside one (its last too) */
    if (rc == 0 && sp.cancelled) {
      es_run_abort(&run);
      rc = es__fail(ES_ECANCELED, "cancelled while paused");
    }
    if (rc == 0)
      rc = es_run_finish(&run, outs, r->n_out);
    safe_set(w, outer);
    if (rc < 0 && (h.refused || h.no_block)) {
      *short_mem = 1;
      r->heap_refused = h.refused;
    }
    if (rc == 0) { /* the outputs made without a plan go back once copied */
      rc = keep_outputs(rt, r, outs, short_mem);
      es_plan_outputs_free(r->plan, &heap, outs, r->n_out);
    }
  }
  if (r->arena_source == ES_ARENA_FROM_POOL)
    es_arena_pool_release(m->pool, a);
  else if (a == &local && es_arena_is_valid(&local))
    es_arena_fini(&local);
  if (blk)
    es_buddy_free(rt->buddy, blk);
  return rc;
}

/* A task on this worker: its own function, its error detail kept for the
 * waiter; a deadline it gave up on is a DEADLINE refusal like a queued
 * request's. */
static int task_run(rt_worker *w, es_request *r) {
  es_runtime *rt = w->rt;
  es_request *outer = w->task;
  w->task = r;
  int rc = r->task(r->task_user);
  w->task = outer;
  /* What it submitted and left queued is anyone's now. */
  pthread_mutex_lock(&rt->lock);
  if (r->owned) {
    for (int l = 0; l < rt->cfg.priorities; l++)
      for (es_request *q = rt->q[l].head; q; q = q->next)
        if (q->owner == r)
          q->owner = NULL;
    r->owned = 0;
    r->own_next = NULL;
    dispatch_locked(rt);
  }
  pthread_mutex_unlock(&rt->lock);
  r->ran = 1;
  if (rc < 0)
    snprintf(r->detail, sizeof r->detail, "%s", es_last_error_detail());
  if (rc == ES_ETIMEDOUT)
    es_admission_refuse(rt->adm, r->model, ES_REFUSE_DEADLINE, 0, &r->refusal);
  return rc;
}

/* The pool had no block now: a refusal with a retry-after (503), since the
 * blocks of the requests running beside this one come back as they finish;
 * a request that can never fit was refused at submit (arena_fits). */
static int refuse_short(es_runtime *rt, es_request *r) {
  char why[160];
  snprintf(why, sizeof why, "%s", es_last_error_detail());
  if (r->heap_refused) { /* admission refused the growth, and counted it */
    snprintf(r->detail, sizeof r->detail, "%s: %s; retry after %u ms", rt->models[r->model].name,
             why, r->refusal.retry_after_ms);
    return ES_EAGAIN;
  }
  pthread_mutex_lock(&rt->lock);
  size_t busy = (size_t)(rt->n_workers - rt->idle_workers);
  pthread_mutex_unlock(&rt->lock);
  es_admission_refuse(rt->adm, r->model, ES_REFUSE_OVER_MEMORY, busy, &r->refusal);
  es_buddy_stats bs;
  if (es_buddy_stats_get(rt->buddy, &bs) == 0) {
    r->refusal.in_use = bs.bytes_in_use;
    r->refusal.limit = bs.capacity;
  }
  r->refusal.requested = r->arena_bytes + r->out_bytes;
  snprintf(r->detail, sizeof r->detail, "%s: no memory for the run now (%s); retry after %u ms",
           rt->models[r->model].name, why, r->refusal.retry_after_ms);
  return ES_EAGAIN;
}

/* Runs request r on worker w (lock not held): a task, or a plan in the
 * given lane scratchpad (NULL: its pool or the buddy pool). *counted: the
 * run counts for the model's completions and mean run time (it ran, and was
 * neither refused for memory nor expired). Returns its status. */
static int execute(rt_worker *w, es_request *r, void *scratch, size_t cap, int expired,
                   int *counted) {
  es_runtime *rt = w->rt;
  int rc = ES_ETIMEDOUT, short_mem = 0;
  *counted = 0;
  if (expired) { /* its deadline passed while it was being handed over */
    es_admission_refuse(rt->adm, r->model, ES_REFUSE_DEADLINE, 0, &r->refusal);
    return rc;
  }
  if (r->task)
    return task_run(w, r);
  rc = run_request(w, r, scratch, cap, &short_mem);
  r->ran = !short_mem && rc != ES_ECANCELED;
  if (rc == 0 && r->seq_slot >= 0)
    rc = seq_keep_state(rt, r, &short_mem);
  if (short_mem)
    rc = refuse_short(rt, r);
  if (!short_mem && rc < 0)
    snprintf(r->detail, sizeof r->detail, "%s", es_last_error_detail());
  *counted = !short_mem && rc != ES_ECANCELED;
  return rc;
}

/* The model's counters after a run (lock held). */
static void account_locked(es_runtime *rt, es_request *r, int rc, int counted, uint64_t run_ns) {
  rt_model *m = &rt->models[r->model];
  if (!counted)
    return;
  if (rc == 0)
    m->completed++;
  else
    m->failed++;
  m->mean_run_ns = m->mean_run_ns > 0 ? (1 - RT_EWMA) * m->mean_run_ns + RT_EWMA * (double)run_ns
                                      : (double)run_ns;
}

static const double pause_bounds_us[ES_RT_PAUSE_BUCKETS - 1] = {100,  250,   500,   1000, 2500,
                                                                 5000, 10000, 25000, 50000};

double es_runtime_pause_bound_us(int i) {
  return i >= 0 && i < ES_RT_PAUSE_BUCKETS - 1 ? pause_bounds_us[i] : HUGE_VAL;
}

/* The first queued request more urgent than level `below` that may run in
 * a pause on worker w: not a lane's (its scratchpad is its lane's), and
 * its model not draining. NULL: none. Lock held. */
static es_request *urgent_pick_locked(es_runtime *rt, const es_request *cur) {
  if (rt->cfg.sched == ES_SCHED_EDF) { /* the earliest deadline before cur's */
    es_request *pick = NULL;
    for (int l = 0; l < rt->cfg.priorities; l++)
      for (es_request *q = rt->q[l].head; q; q = q->next)
        if (!q->owner && q->deadline_ns &&
            (!cur->deadline_ns || q->deadline_ns < cur->deadline_ns) &&
            (rt->models[q->model].lane < 0 || q->task) && (!pick || edf_before(q, pick)))
          pick = q;
    return pick;
  }
  for (int l = 0; l < cur->priority && l < rt->cfg.priorities; l++)
    for (es_request *q = rt->q[l].head; q; q = q->next)
      if (!q->owner && (rt->models[q->model].lane < 0 || q->task))
        return q;
  return NULL;
}

/* 1 when a request that should pause cur's run may be waiting (one atomic
 * read; serve_urgent looks under the lock). */
static int urgent_waiting(es_runtime *rt, const es_request *cur) {
  if (rt->cfg.sched == ES_SCHED_EDF) {
    uint64_t dl = atomic_load_explicit(&rt->urgent_deadline, memory_order_relaxed);
    return dl && (!cur->deadline_ns || dl < cur->deadline_ns);
  }
  return atomic_load_explicit(&rt->urgent_level, memory_order_relaxed) < cur->priority;
}

/* Cooperative preemption: between two steps of cur's run, worker w runs the
 * most urgent waiting request to its end, in that request's own arena (pool
 * or buddy pool), then returns to cur, whose arena and reservation stayed
 * as they were. 0: nothing to run; 1: it ran one; 2: it ran one and cur was
 * cancelled meanwhile (es_request_cancel on a paused run). */
static int serve_urgent(rt_worker *w, es_request *cur, int in_kernel) {
  es_runtime *rt = w->rt;
  pthread_mutex_lock(&rt->lock);
  es_request *u = rt->paused ? NULL : urgent_pick_locked(rt, cur);
  if (!u) {
    urgent_update_locked(rt);
    pthread_mutex_unlock(&rt->lock);
    return 0;
  }
  uint64_t t0 = es__now_ns();
  queue_remove(rt, u);
  urgent_update_locked(rt);
  u->state = RQ_RUNNING;
  u->worker = w->index;
  u->preempting = 1;
  u->start_ns = t0;
  int expired = u->deadline_ns && t0 > u->deadline_ns;
  cur->paused = 1;
  cur->preemptions++;
  rt->models[cur->model].preemptions++;
  rt->models[u->model].preempting++;
  rt->preemptions++;
  rt->preemptions_in_kernel += in_kernel != 0;
  w->depth = 1;
  pthread_mutex_unlock(&rt->lock);

  int counted;
  worker_sched(w, u->priority); /* part of the hand-over */
  uint64_t te0 = es__now_ns();
  int rc = execute(w, u, NULL, 0, expired, &counted);
  uint64_t t1 = es__now_ns();

  /* One critical section back: the urgent request's completion and the
   * paused run's release (a hand-over is mostly waiting for this lock) */
  pthread_mutex_lock(&rt->lock);
  uint64_t tl = es__now_ns();
  w->depth = 0;
  account_locked(rt, u, rc, counted, t1 - u->start_ns);
  es_request *done = NULL;
  complete_locked(rt, u, rc, &done);
  cur->paused = 0;
  uint64_t ns = t1 - t0;
  cur->paused_ns += ns;
  int b = 0;
  while (b < ES_RT_PAUSE_BUCKETS - 1 && (double)ns / 1e3 > pause_bounds_us[b])
    b++;
  rt->pause_hist[b]++;
  rt->pause_ns_sum += ns;
  int cancel = cur->cancel_asked;
  uint64_t t2 = es__now_ns();
  uint64_t over = (te0 - t0) + (t2 - t1);
  rt->pause_overhead_ns_sum += over;
  if (over > rt->pause_overhead_ns_max)
    rt->pause_overhead_ns_max = over;
  rt->pause_lock_wait_ns_sum += tl - t1;
  pthread_mutex_unlock(&rt->lock);
  finish_list(rt, done);
  /* after the answer is handed over; not in the pause's cost (see
   * es_runtime_stats.pause_overhead_ns_sum) */
  worker_sched(w, cur->priority);
  return cancel ? 2 : 1;
}

/* Tasks that submit: a task waiting (es_request_wait) for a queued request
 * it may run runs it here, on its own worker, in the request's own arena,
 * instead of sleeping while the request waits for a worker, which may be
 * this one (with one worker, a task that waits for its own request would
 * wait forever). A pipeline's stages thus follow each other on one thread,
 * with no wake-up between them. A model on this worker's lane runs in the
 * lane's scratchpad (free whenever a task runs: a lane's run is never
 * paused); one on another worker's lane runs in a block of the buddy pool,
 * as a request at another shape would (its admission counted its arena
 * already): waiting for that worker instead could wait forever, if that
 * worker's task waits for this one's lane. Lock held; released on return. */
static void run_inline_locked(rt_worker *w, es_request *r) {
  es_runtime *rt = w->rt;
  queue_remove(rt, r);
  urgent_update_locked(rt);
  r->state = RQ_RUNNING;
  r->worker = w->index;
  uint64_t t = es__now_ns();
  r->start_ns = t;
  int expired = r->deadline_ns && t > r->deadline_ns;
  int lane = !r->task && rt->models[r->model].lane == w->index;
  void *scratch = lane ? w->scratch : NULL;
  size_t cap = lane ? w->scratch_cap : 0;
  pthread_mutex_unlock(&rt->lock);
  int counted;
  int rc = execute(w, r, scratch, cap, expired, &counted);
  uint64_t run_ns = es__now_ns() - r->start_ns - r->paused_ns;
  pthread_mutex_lock(&rt->lock);
  account_locked(rt, r, rc, counted, run_ns);
  rt->inlined++;
  es_request *done = NULL;
  complete_locked(rt, r, rc, &done);
  pthread_mutex_unlock(&rt->lock);
  finish_list(rt, done);
}

/* Real-time scheduling (rt_priority): worker w takes the policy of level
 * `level`: SCHED_FIFO rt_priority below rt_levels, SCHED_OTHER at the
 * others. Why per run and not per worker: a worker runs every level, and
 * a long run of a low level at SCHED_FIFO would hold its core against
 * everything of ordinary priority, the HTTP threads that bring the urgent
 * requests among them. One system call when the policy changes (about 2
 * us on an idle core), none when it does not. If the system refuses the
 * change (a cgroup's real-time budget taken away meanwhile), the worker
 * stays as it was and the run goes on. Called by w's own thread. */
static void worker_sched(rt_worker *w, int level) {
  const es_runtime_config *c = &w->rt->cfg;
  if (!c->rt_priority)
    return;
  int want = level < c->rt_levels ? c->rt_priority : 0;
  if (want == w->fifo)
    return;
  struct sched_param sp = {.sched_priority = want};
  if (pthread_setschedparam(pthread_self(), want ? SCHED_FIFO : SCHED_OTHER, &sp) == 0)
    w->fifo = want;
}

static void *worker_main(void *arg) {
  rt_worker *w = arg;
  es_runtime *rt = w->rt;
  pin_self(w->cpu);
  tls_worker = w;
  es_engine_threads_set(rt->cfg.intra_threads);
  pthread_mutex_lock(&rt->lock);
  for (;;) {
    while (!w->job && !rt->stopping)
      pthread_cond_wait(&w->cv, &rt->lock);
    if (!w->job)
      break;
    es_request *r = w->job;
    /* Lane scratchpad resize asked for by a load or unload: swap here,
     * between runs, where nothing uses the old block. */
    void *old = NULL;
    size_t old_cap = 0;
    if (w->want_cap != w->scratch_cap) {
      void *nb = w->want_cap ? es_mem_map(ES_MEM_SCRATCH, w->want_cap) : NULL;
      if (nb || !w->want_cap) {
        old = w->scratch;
        old_cap = w->scratch_cap;
        w->scratch = nb;
        w->scratch_cap = w->want_cap;
        w->last_model = -1;
      }
    }
    void *scratch = w->scratch;
    size_t cap = w->scratch_cap;
    uint64_t t = es__now_ns();
    r->start_ns = t;
    int expired = r->deadline_ns && t > r->deadline_ns;
    pthread_mutex_unlock(&rt->lock);

    if (old)
      es_mem_unmap(ES_MEM_SCRATCH, old, old_cap);
    worker_sched(w, r->priority);
    int counted;
    int rc = execute(w, r, scratch, cap, expired, &counted);
    uint64_t run_ns = es__now_ns() - r->start_ns - r->paused_ns;

    pthread_mutex_lock(&rt->lock);
    account_locked(rt, r, rc, counted, run_ns);
    w->job = NULL;
    rt->idle_workers++;
    es_request *done = NULL;
    complete_locked(rt, r, rc, &done);
    dispatch_locked(rt);
    if (all_idle(rt))
      pthread_cond_broadcast(&rt->idle_cv);
    pthread_mutex_unlock(&rt->lock);
    finish_list(rt, done);
    worker_sched(w, 0); /* an idle worker wakes at once for urgent work */
    pthread_mutex_lock(&rt->lock);
  }
  pthread_mutex_unlock(&rt->lock);
  return NULL;
}

/* ---- monitor: deadlines of queued requests and memory pressure ------------ */

/* Cut the queues to `keep` requests, lowest priority and newest first. */
static void trim_queues_locked(es_runtime *rt, size_t keep, es_request **done) {
  for (int l = rt->cfg.priorities - 1; l >= 0 && rt->queued > keep; l--)
    while (rt->q[l].tail && rt->queued > keep) {
      es_request *r = rt->q[l].tail;
      queue_remove(rt, r);
      es_admission_refuse(rt->adm, r->model, ES_REFUSE_MEMORY_PRESSURE, rt->queued,
                          &r->refusal);
      complete_locked(rt, r, ES_EAGAIN, done);
    }
}

static uint64_t expire_locked(es_runtime *rt, uint64_t now, es_request **done) {
  uint64_t next = 0;
  for (int l = 0; l < rt->cfg.priorities; l++)
    for (es_request *r = rt->q[l].head, *nx; r; r = nx) {
      nx = r->next;
      if (!r->deadline_ns)
        continue;
      if (r->deadline_ns <= now) {
        queue_remove(rt, r);
        es_admission_refuse(rt->adm, r->model, ES_REFUSE_DEADLINE, rt->queued, &r->refusal);
        complete_locked(rt, r, ES_ETIMEDOUT, done);
      } else if (!next || r->deadline_ns < next) {
        next = r->deadline_ns;
      }
    }
  return next;
}

static int read_mem(es_runtime *rt, es_memstat *st) {
  if (rt->cfg.memstat_fn)
    return rt->cfg.memstat_fn(rt->cfg.memstat_user, st);
  return es_memstat_read(st);
}

/* Observe memory and act on the level; lock held on entry and exit, dropped
 * around the read (a few file reads). */
static void watch_locked(es_runtime *rt, es_request **done) {
  es_memstat st;
  pthread_mutex_unlock(&rt->lock);
  int rc = read_mem(rt, &st);
  if (rc == 0)
    es_admission_observe(rt->adm, &st);
  pthread_mutex_lock(&rt->lock);
  int level = es_admission_pressure(rt->adm);
  if (level == ES_PRESSURE_SOFT)
    trim_queues_locked(rt, (size_t)rt->n_workers, done);
  else if (level == ES_PRESSURE_HARD)
    trim_queues_locked(rt, 0, done);
  if (level != ES_PRESSURE_NONE) { /* freed heap goes back to the kernel too */
    pthread_mutex_unlock(&rt->lock);
    malloc_trim(0);
    pthread_mutex_lock(&rt->lock);
  }
}

static void *monitor_main(void *arg) {
  es_runtime *rt = arg;
  pthread_mutex_lock(&rt->lock);
  while (!rt->stopping || rt->queued) {
    es_request *done = NULL;
    uint64_t now = es__now_ns();
    uint64_t next = expire_locked(rt, now, &done);
    for (int i = 0; i < rt->max_models; i++)
      if (rt->models[i].state == SLOT_LIVE && rt->models[i].seqs)
        seq_evict_locked(rt, &rt->models[i], now);
    if (rt->cfg.watch_ms > 0 && now >= rt->next_watch_ns) {
      watch_locked(rt, &done);
      rt->next_watch_ns = es__now_ns() + (uint64_t)rt->cfg.watch_ms * 1000000ull;
    }
    if (rt->cfg.buddy_decay_ms > 0 && now >= rt->next_purge_ns) {
      /* Ten passes per decay period, each giving back what has been free
       * for ten: pages idle for the period go back within a tenth of it.
       * The pool's own lock only: requests keep flowing meanwhile. */
      int trim = ++rt->purge_passes >= RT_DECAY_PASSES;
      if (trim)
        rt->purge_passes = 0;
      pthread_mutex_unlock(&rt->lock);
      es_buddy_purge(rt->buddy, RT_DECAY_PASSES, NULL);
      /* Once per period the C heap too: glibc gives back only the top of
       * each arena on free, so pages freed in the middle of an arena (the
       * HTTP layer's request bodies, JSON trees, images) stay resident
       * until trimmed, and RSS creeps with the heap's historic layout. */
      if (trim)
        malloc_trim(0);
      pthread_mutex_lock(&rt->lock);
      rt->next_purge_ns =
          es__now_ns() + (uint64_t)rt->cfg.buddy_decay_ms * 1000000ull / RT_DECAY_PASSES;
    }
    if (done || rt->activate) {
      pthread_mutex_unlock(&rt->lock);
      finish_list(rt, done);
      pthread_mutex_lock(&rt->lock);
      continue;
    }
    uint64_t wake = rt->cfg.watch_ms > 0 ? rt->next_watch_ns : now + 1000000000ull;
    if (rt->cfg.buddy_decay_ms > 0 && rt->next_purge_ns < wake)
      wake = rt->next_purge_ns;
    if (next && next < wake)
      wake = next;
    struct timespec ts;
    abs_timespec(wake, &ts);
    pthread_cond_timedwait(&rt->monitor_cv, &rt->lock, &ts);
  }
  pthread_mutex_unlock(&rt->lock);
  return NULL;
}

/* ---- create / destroy ----------------------------------------------------- */

static int config_check(const es_runtime_config *c) {
  if (c->workers < 0 || c->workers > 1024)
    return es__fail(ES_EINVAL, "runtime config: workers %d outside 0..1024", c->workers);
  if (c->intra_threads < 1 || c->intra_threads > 1024)
    return es__fail(ES_EINVAL, "runtime config: intra_threads %d outside 1..1024",
                    c->intra_threads);
  if (c->priorities < 1 || c->priorities > RT_MAX_LEVELS)
    return es__fail(ES_EINVAL, "runtime config: priorities %d outside 1..%d", c->priorities,
                    RT_MAX_LEVELS);
  if (c->queue_capacity < 1)
    return es__fail(ES_EINVAL, "runtime config: queue_capacity must be >= 1");
  if (c->sched != ES_SCHED_PRIORITY && c->sched != ES_SCHED_EDF)
    return es__fail(ES_EINVAL, "runtime config: sched %d is neither ES_SCHED_PRIORITY nor "
                    "ES_SCHED_EDF", c->sched);
  if (c->preempt != 0 && c->preempt != 1)
    return es__fail(ES_EINVAL, "runtime config: preempt must be 0 or 1");
  if (c->rt_priority < 0 || c->rt_priority > 98)
    return es__fail(ES_EINVAL, "runtime config: rt_priority %d outside 0 (off)..98",
                    c->rt_priority);
  if (c->rt_priority && (c->rt_levels < 1 || c->rt_levels > c->priorities))
    return es__fail(ES_EINVAL, "runtime config: rt_levels %d outside 1..%d (the levels)",
                    c->rt_levels, c->priorities);
  /* A run of several engine threads has an OpenMP team, whose threads keep
   * the policy of the run that started them: a low run's team would be
   * real-time, or an urgent run's helpers ordinary. */
  if (c->rt_priority && c->intra_threads > 1)
    return es__fail(ES_EINVAL, "runtime config: rt_priority needs intra_threads 1 (the engine's "
                    "OpenMP threads keep the policy of the run that started them)");
  if (c->max_models < 1 || c->max_models > RT_MAX_MODELS)
    return es__fail(ES_EINVAL, "runtime config: max_models %d outside 1..%d", c->max_models,
                    RT_MAX_MODELS);
  if (c->watch_ms < 0)
    return es__fail(ES_EINVAL, "runtime config: watch_ms must be >= 0");
  if (c->buddy_decay_ms < 0 || (c->buddy_decay_ms > 0 && c->buddy_decay_ms < 100))
    return es__fail(ES_EINVAL, "runtime config: buddy_decay_ms must be 0 (never) or >= 100 "
                    "(its passes run every tenth of it)");
  if (c->buddy_bytes < ((size_t)1 << 20))
    return es__fail(ES_EINVAL, "runtime config: buddy_bytes must be >= 1 MiB");
  return 0;
}

static void stop_threads(es_runtime *rt) {
  pthread_mutex_lock(&rt->lock);
  rt->stopping = 1;
  for (int i = 0; i < rt->n_workers; i++)
    pthread_cond_signal(&rt->workers[i].cv);
  pthread_cond_broadcast(&rt->monitor_cv);
  pthread_mutex_unlock(&rt->lock);
  for (int i = 0; i < rt->n_workers; i++)
    if (rt->workers[i].started) {
      pthread_join(rt->workers[i].thread, NULL);
      rt->workers[i].started = 0;
    }
  if (rt->monitor_started) {
    pthread_join(rt->monitor, NULL);
    rt->monitor_started = 0;
  }
}

static void free_runtime(es_runtime *rt) {
  for (int i = 0; rt->workers && i < rt->n_workers; i++) { /* NULL: its calloc failed */
    rt_worker *w = &rt->workers[i];
    if (w->scratch)
      es_mem_unmap(ES_MEM_SCRATCH, w->scratch, w->scratch_cap);
    pthread_cond_destroy(&w->cv);
  }
  es_mem_free(rt->workers);
  es_mem_free(rt->models);
  es_buddy_destroy(rt->buddy);
  es_admission_destroy(rt->adm);
  pthread_cond_destroy(&rt->model_cv);
  pthread_cond_destroy(&rt->monitor_cv);
  pthread_cond_destroy(&rt->idle_cv);
  pthread_mutex_destroy(&rt->lock);
  rt->magic = 0;
  es_mem_free(rt);
}

int es_runtime_create(const es_runtime_config *cfg, es_runtime **out) {
  if (!cfg || !out)
    return es__fail(ES_EINVAL, "es_runtime_create: NULL argument");
  *out = NULL;
  int rc = config_check(cfg);
  if (rc < 0)
    return rc;
  int cpus[1024];
  int ncpu = allowed_cpus(cpus, 1024);
  es_runtime *rt = es_mem_calloc(ES_MEM_RUNTIME, 1, sizeof *rt);
  if (!rt)
    return es__fail(ES_ENOMEM, "es_runtime_create: no memory");
  rt->magic = RT_MAGIC;
  rt->cfg = *cfg;
  if (cfg->preempt && !es_engine_split_get())
    es_engine_split_set(ES_RT_SPLIT_FLOPS);
  rt->n_workers = cfg->workers ? cfg->workers : ncpu;
  rt->max_models = cfg->max_models;
  pthread_mutex_init(&rt->lock, NULL);
  cond_init_mono(&rt->model_cv);
  cond_init_mono(&rt->monitor_cv);
  cond_init_mono(&rt->idle_cv);
  rt->models = es_mem_calloc(ES_MEM_RUNTIME, (size_t)rt->max_models, sizeof *rt->models);
  rt->workers = es_mem_calloc(ES_MEM_RUNTIME, (size_t)rt->n_workers, sizeof *rt->workers);
  if (!rt->models || !rt->workers) {
    free_runtime(rt);
    return es__fail(ES_ENOMEM, "es_runtime_create: no memory");
  }
  for (int i = 0; i < rt->n_workers; i++) {
    rt_worker *w = &rt->workers[i];
    w->rt = rt;
    w->index = i;
    w->cpu = cfg->pin ? cpus[i % ncpu] : -1;
    w->last_model = -1;
    cond_init_mono(&w->cv);
  }
  rt->idle_workers = rt->n_workers;

  es_admission_config ac;
  es_admission_config_default(&ac);
  ac.max_inflight_total = cfg->max_inflight_total;
  ac.model_max_inflight = cfg->model_max_inflight;
  ac.max_models = (size_t)cfg->max_models;
  ac.memory_budget_bytes = cfg->memory_budget_bytes;
  ac.soft_ratio = cfg->soft_ratio;
  ac.hard_ratio = cfg->hard_ratio;
  rc = es_admission_create(&ac, &rt->adm);
  if (rc == 0) {
    es_buddy_config bc;
    es_buddy_config_default(&bc);
    bc.capacity = cfg->buddy_bytes;
    bc.grow = 1;
    rc = es_buddy_create(&bc, &rt->buddy);
  }
  if (rc < 0) {
    free_runtime(rt);
    return rc;
  }
  /* With rt_priority, workers start as SCHED_FIFO threads (they wait for
   * work at that priority): a system that refuses it refuses the first. */
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  if (cfg->rt_priority) {
    struct sched_param sp = {.sched_priority = cfg->rt_priority};
    pthread_attr_setinheritsched(&attr, PTHREAD_EXPLICIT_SCHED);
    pthread_attr_setschedpolicy(&attr, SCHED_FIFO);
    pthread_attr_setschedparam(&attr, &sp);
  }
  for (int i = 0; i < rt->n_workers; i++) {
    rt->workers[i].fifo = cfg->rt_priority;
    int e = pthread_create(&rt->workers[i].thread, &attr, worker_main, &rt->workers[i]);
    if (e != 0) {
      pthread_attr_destroy(&attr);
      stop_threads(rt);
      free_runtime(rt);
      if (e == EPERM)
        return es__fail(ES_EACCES, "es_runtime_create: rt_priority %d: the system refuses "
                        "real-time scheduling (it needs root, CAP_SYS_NICE or an "
                        "RLIMIT_RTPRIO of at least %d: ulimit -r, LimitRTPRIO= in a "
                        "systemd unit; or a cgroup with a real-time budget)",
                        cfg->rt_priority, cfg->rt_priority);
      return es__fail(ES_ENOMEM, "es_runtime_create: cannot start worker %d", i);
    }
    rt->workers[i].started = 1;
  }
  pthread_attr_destroy(&attr);
  if (pthread_create(&rt->monitor, NULL, monitor_main, rt) != 0) {
    stop_threads(rt);
    free_runtime(rt);
    return es__fail(ES_ENOMEM, "es_runtime_create: cannot start the monitor");
  }
  rt->monitor_started = 1;
  *out = rt;
  return 0;
}

static void unload_slot(es_runtime *rt, rt_model *m);

int es_runtime_destroy(es_runtime *rt) {
  if (!rt)
    return 0;
  int rc = rt_check(rt, "es_runtime_destroy");
  if (rc < 0)
    return rc;
  es_admission_set_draining(rt->adm, -1, 1);
  pthread_mutex_lock(&rt->lock);
  rt->paused = 0;
  dispatch_locked(rt);
  while (!all_idle(rt))
    pthread_cond_wait(&rt->idle_cv, &rt->lock);
  int held = 0;
  for (int i = 0; i < rt->max_models; i++)
    if (rt->models[i].state != SLOT_FREE && rt->models[i].pending)
      held = 1;
  pthread_mutex_unlock(&rt->lock);
  if (held)
    return es__fail(ES_EBUSY, "es_runtime_destroy: request handles are still held "
                              "(free them first); new work is refused meanwhile");
  stop_threads(rt);
  for (int i = 0; i < rt->max_models; i++)
    if (rt->models[i].state != SLOT_FREE)
      unload_slot(rt, &rt->models[i]);
  free_runtime(rt);
  return 0;
}

/* ---- registry ------------------------------------------------------------- */

/* Lane scratch wanted: the max over the lane's models, never the sum. */
static void lane_recompute_locked(es_runtime *rt, int lane) {
  rt_worker *w = &rt->workers[lane];
  size_t mx = 0, sum = 0;
  int n = 0;
  for (int i = 0; i < rt->max_models; i++) {
    rt_model *m = &rt->models[i];
    if ((m->state == SLOT_LIVE || m->state == SLOT_LOADING) && m->lane == lane && m->cfg_plan) {
      size_t need = m->planned + ES_ARENA_GUARD + RT_ALIGN;
      mx = need > mx ? need : mx;
      sum += need;
      n++;
    }
  }
  w->want_cap = mx;
  w->lane_models = n;
  w->lane_sum = sum;
  /* An idle worker swaps now, so the scratchpad exists before any run. */
  if (!w->job && w->want_cap != w->scratch_cap) {
    void *nb = mx ? es_mem_map(ES_MEM_SCRATCH, mx) : NULL;
    if (nb || !mx) {
      if (w->scratch)
        es_mem_unmap(ES_MEM_SCRATCH, w->scratch, w->scratch_cap);
      w->scratch = nb;
      w->scratch_cap = mx;
      w->last_model = -1;
    }
  }
}

/* Called with the slot UNLOADING (nobody else touches its resources); the
 * slot itself is cleared under the lock, since loads and stats read every
 * slot's state and name there. */
static void unload_slot(es_runtime *rt, rt_model *m) {
  pthread_mutex_lock(&rt->lock);
  for (unsigned i = 0; m->seqs && i < m->max_seqs; i++)
    if (m->seqs[i].used)
      seq_free_locked(rt, m, &m->seqs[i]);
  pthread_mutex_unlock(&rt->lock);
  es_mem_free(m->seqs);
  es_arena_pool_destroy(m->pool);
  es_plan_release(m->cfg_plan);
  es_plan_cache_destroy(m->cache);
  es_model_release(m->model);
  pthread_mutex_lock(&rt->lock);
  free(m->realpath);
  memset(m, 0, sizeof *m);
  pthread_mutex_unlock(&rt->lock);
}

static int shapes_fixed(es_model *model, es_tensor_info *shapes, int n) {
  for (int i = 0; i < n; i++) {
    if (es_model_input_info(model, i, &shapes[i]) < 0 || shapes[i].rank < 0)
      return 0;
    for (int d = 0; d < shapes[i].rank; d++)
      if (shapes[i].dims[d] < 0)
        return 0;
  }
  return 1;
}

/* The configured shapes in the model's input order: by name when the
 * config names them, else by position; a dtype left undefined is the
 * model's. */
static int configured_shapes(const rt_model *m, const es_model_config *cfg, es_tensor_info *out) {
  if (cfg->n_shapes != m->n_in)
    return es__fail(ES_EINVAL, "%s: %d configured shapes for %d inputs", cfg->name,
                    cfg->n_shapes, m->n_in);
  int named = 0;
  for (int j = 0; j < cfg->n_shapes; j++)
    named |= cfg->shapes[j].name != NULL;
  for (int i = 0; i < m->n_in; i++) {
    es_tensor_info ti;
    es_model_input_info(m->model, i, &ti);
    const es_tensor_info *c = named ? NULL : &cfg->shapes[i];
    for (int j = 0; named && j < cfg->n_shapes; j++)
      if (cfg->shapes[j].name && !strcmp(cfg->shapes[j].name, ti.name))
        c = &cfg->shapes[j];
    if (!c)
      return es__fail(ES_EINVAL, "%s: no configured shape for input '%s'", cfg->name, ti.name);
    out[i] = *c;
    out[i].name = ti.name;
    if (out[i].dtype == ES_DTYPE_UNDEFINED)
      out[i].dtype = ti.dtype;
  }
  return 0;
}

/* A model's state pairs, by index, with the shape of the zeros each state
 * starts from: the configured one (configured: the configured shapes in
 * input order, or NULL), else the model's with its free dimensions at 0
 * (rank -1, unknown: the start must give it). */
static int seq_config(rt_model *m, const es_model_config *cfg,
                      const es_tensor_info *configured) {
  if (cfg->n_states < 0 || cfg->n_states > ES_RT_MAX_IO || (cfg->n_states && !cfg->states))
    return es__fail(ES_EINVAL, "%s: bad states (%d pairs)", cfg->name, cfg->n_states);
  if (cfg->state_reserve != ES_STATE_RESERVE_STEP && cfg->state_reserve != ES_STATE_RESERVE_MAX)
    return es__fail(ES_EINVAL, "%s: state_reserve %d is neither STEP nor MAX", cfg->name,
                    cfg->state_reserve);
  if (cfg->sequence_idle_ms < 0)
    return es__fail(ES_EINVAL, "%s: sequence_idle_ms %d is negative", cfg->name,
                    cfg->sequence_idle_ms);
  for (int k = 0; k < cfg->n_states; k++) {
    const es_state_pair *sp = &cfg->states[k];
    int in = -1, out = -1;
    es_tensor_info ti, oi;
    for (int i = 0; sp->input && i < m->n_in && in < 0; i++)
      if (es_model_input_info(m->model, i, &ti) == 0 && !strcmp(ti.name, sp->input))
        in = i;
    for (int o = 0; sp->output && o < m->n_out && out < 0; o++)
      if (es_model_output_info(m->model, o, &oi) == 0 && !strcmp(oi.name, sp->output))
        out = o;
    if (in < 0 || out < 0)
      return es__fail(ES_EINVAL, "%s: state pair %d: the model has no %s '%s'", cfg->name, k,
                      in < 0 ? "input" : "output", in < 0 ? (sp->input ? sp->input : "(null)")
                                                          : (sp->output ? sp->output : "(null)"));
    for (int j = 0; j < k; j++)
      if (m->state_in[j] == in || m->state_out[j] == out)
        return es__fail(ES_EINVAL, "%s: state pair %d repeats an input or output", cfg->name, k);
    if (oi.dtype != ES_DTYPE_UNDEFINED && oi.dtype != ti.dtype)
      return es__fail(ES_EINVAL, "%s: state '%s' is %s, its output '%s' %s", cfg->name, ti.name,
                      es_dtype_name(ti.dtype), oi.name, es_dtype_name(oi.dtype));
    m->state_in[k] = in;
    m->state_out[k] = out;
    /* A free dimension starts at 0: an empty history, as a KV cache's
     * past length before the first token. */
    es_tensor_info z = configured ? configured[in] : ti;
    z.name = ti.name;
    for (int d = 0; d < z.rank; d++)
      if (z.dims[d] < 0)
        z.dims[d] = 0;
    m->state_init[k] = z;
  }
  m->n_states = cfg->n_states;
  m->max_seqs = cfg->max_sequences ? cfg->max_sequences : 64;
  m->seq_idle_ns = (uint64_t)(cfg->sequence_idle_ms ? cfg->sequence_idle_ms : 60000) * 1000000ull;
  m->state_reserve = cfg->state_reserve;
  m->state_max = cfg->state_max_bytes;
  m->state_budget = cfg->state_budget_bytes;
  if (!m->n_states)
    return 0;
  m->seqs = es_mem_calloc(ES_MEM_RUNTIME, m->max_seqs, sizeof *m->seqs);
  if (!m->seqs)
    return es__fail(ES_ENOMEM, "%s: no memory for %u sequences", cfg->name, m->max_seqs);
  return 0;
}

int es_runtime_model_load(es_runtime *rt, const es_model_config *cfg, int *id) {
  int rc = rt_check(rt, "es_runtime_model_load");
  if (rc < 0)
    return rc;
  if (!cfg || !id || !cfg->name || !cfg->path)
    return es__fail(ES_EINVAL, "es_runtime_model_load: NULL config, name, path or id");
  if (!cfg->name[0] || strlen(cfg->name) >= ES_RT_NAME_MAX)
    return es__fail(ES_EINVAL, "es_runtime_model_load: name must be 1..%d bytes",
                    ES_RT_NAME_MAX - 1);
  if (cfg->lane < -1 || cfg->lane >= rt->n_workers)
    return es__fail(ES_EINVAL, "es_runtime_model_load: lane %d outside -1..%d", cfg->lane,
                    rt->n_workers - 1);
  if (cfg->n_shapes < 0 || (cfg->n_shapes && !cfg->shapes))
    return es__fail(ES_EINVAL, "es_runtime_model_load: bad shapes");
  char *rp = realpath(cfg->path, NULL);
  if (!rp)
    return es__fail(errno == ENOENT ? ES_ENOENT : ES_EIO, "es_runtime_model_load: %s: %s",
                    cfg->path, strerror(errno));

  /* Reserve a slot and find a model to share, under the lock. */
  pthread_mutex_lock(&rt->lock);
  int slot = -1;
  es_model *shared = NULL;
  for (int i = 0; i < rt->max_models; i++) {
    rt_model *m = &rt->models[i];
    if (m->state == SLOT_FREE) {
      if (slot < 0)
        slot = i;
      continue;
    }
    if (!strcmp(m->name, cfg->name)) {
      pthread_mutex_unlock(&rt->lock);
      free(rp);
      return es__fail(ES_EBUSY, "es_runtime_model_load: a model named '%s' is loaded",
                      cfg->name);
    }
    if (cfg->share && m->share && m->state == SLOT_LIVE && !shared &&
        m->precision == cfg->precision && !strcmp(m->realpath, rp))
      shared = es_model_retain(m->model);
  }
  if (slot < 0) {
    pthread_mutex_unlock(&rt->lock);
    es_model_release(shared);
    free(rp);
    return es__fail(ES_ENOSPC, "es_runtime_model_load: registry full (%d models)",
                    rt->max_models);
  }
  rt_model *m = &rt->models[slot];
  memset(m, 0, sizeof *m);
  m->state = SLOT_LOADING;
  snprintf(m->name, sizeof m->name, "%s", cfg->name);
  m->lane = cfg->lane;
  m->realpath = rp;
  m->share = cfg->share;
  m->precision = cfg->precision;
  pthread_mutex_unlock(&rt->lock);

  /* The slow part, without the lock. Plans made here and at submit carry
   * the runtime's intra-op threads (see es_engine_threads_set). */
  if (rt->cfg.intra_threads > 1)
    es_engine_threads_set(rt->cfg.intra_threads);
  m->model = shared;
  es_model_options mo = {.precision = cfg->precision};
  rc = shared ? 0 : es_model_load(cfg->path, &mo, &m->model);
  if (rc == 0) {
    m->n_in = es_model_input_count(m->model);
    m->n_out = es_model_output_count(m->model);
    if (m->n_in > ES_RT_MAX_IO || m->n_out > ES_RT_MAX_IO)
      rc = es__fail(ES_ENOTSUP, "es_runtime_model_load: %s has %d inputs and %d outputs "
                    "(at most %d each)", cfg->name, m->n_in, m->n_out, ES_RT_MAX_IO);
  }
  if (rc == 0)
    rc = es_plan_cache_create(m->model, cfg->plans ? cfg->plans : RT_PLAN_CACHE, &m->cache);
  es_tensor_info fixed[ES_RT_MAX_IO];
  if (rc == 0) {
    for (int i = 0; i < m->n_in; i++) {
      es_tensor_info ti;
      es_model_input_info(m->model, i, &ti);
      m->in_dtype[i] = ti.dtype;
    }
    if (cfg->n_shapes)
      rc = configured_shapes(m, cfg, fixed);
    if (rc == 0 && cfg->n_shapes)
      rc = es_plan_cache_get(m->cache, fixed, m->n_in, &m->cfg_plan);
    else if (shapes_fixed(m->model, fixed, m->n_in))
      rc = es_plan_cache_get(m->cache, fixed, m->n_in, &m->cfg_plan);
  }
  if (rc == 0 && cfg->lane >= 0 && !m->cfg_plan)
    rc = es__fail(ES_EINVAL, "es_runtime_model_load: %s: a lane model needs a configured "
                  "shape (its inputs have free dimensions)", cfg->name);
  if (rc == 0 && m->cfg_plan)
    m->planned = es_plan_arena_bytes(m->cfg_plan);
  if (rc == 0 && cfg->n_states)
    rc = seq_config(m, cfg, cfg->n_shapes ? fixed : NULL);
  if (rc == 0 && m->cfg_plan && cfg->lane < 0) {
    unsigned n = cfg->arenas ? cfg->arenas : (unsigned)rt->n_workers;
    rc = es_arena_pool_create(n, m->planned ? m->planned : RT_ALIGN, RT_ALIGN, &m->pool);
    if (rc == 0) {
      es_arena_pool_stats ps;
      es_arena_pool_stats_get(m->pool, &ps);
      m->pool_bytes = ps.count * ps.arena_capacity;
    }
  }
  if (rc == 0)
    rc = es_admission_set_model_limit(
        rt->adm, slot, cfg->max_inflight ? cfg->max_inflight : rt->cfg.model_max_inflight);

  pthread_mutex_lock(&rt->lock);
  if (rc < 0) {
    es_mem_free(m->seqs);
    es_arena_pool_destroy(m->pool);
    es_plan_release(m->cfg_plan);
    es_plan_cache_destroy(m->cache);
    es_model_release(m->model);
    free(m->realpath);
    memset(m, 0, sizeof *m);
    pthread_mutex_unlock(&rt->lock);
    return rc;
  }
  m->home = m->lane >= 0 ? m->lane : rt->next_home++ % rt->n_workers;
  m->last_worker = -1;
  if (m->lane >= 0)
    lane_recompute_locked(rt, m->lane);
  m->state = SLOT_LIVE;
  es_admission_set_draining(rt->adm, slot, 0);
  pthread_mutex_unlock(&rt->lock);
  /* Loading decodes the whole protobuf and plans once: tens of MB of heap
   * freed again, which glibc would otherwise keep resident for good. */
  malloc_trim(0);
  *id = slot;
  return 0;
}

static rt_model *live_model(es_runtime *rt, int id) {
  if (id < 0 || id >= rt->max_models)
    return NULL;
  rt_model *m = &rt->models[id];
  return m->state == SLOT_LIVE ? m : NULL;
}

/* The preamble of the calls on one model: a live runtime, an out pointer
 * where the call has one (want_out), and the model, found under the lock.
 * Returns the model with rt->lock held, or NULL with *rc set and the lock
 * not held. */
static rt_model *lock_live_model(es_runtime *rt, int id, int want_out, const void *out,
                                 const char *fn, int *rc) {
  if ((*rc = rt_check(rt, fn)) < 0)
    return NULL;
  if (want_out && !out) {
    *rc = es__fail(ES_EINVAL, "%s: NULL out", fn);
    return NULL;
  }
  pthread_mutex_lock(&rt->lock);
  rt_model *m = live_model(rt, id);
  if (!m) {
    pthread_mutex_unlock(&rt->lock);
    *rc = es__fail(ES_ENOENT, "%s: no model with id %d", fn, id);
  }
  return m;
}

int es_runtime_model_unload(es_runtime *rt, int id, int timeout_ms) {
  int rc;
  rt_model *m = lock_live_model(rt, id, 0, NULL, "es_runtime_model_unload", &rc);
  if (!m)
    return rc;
  m->draining = 1;
  es_admission_set_draining(rt->adm, id, 1);
  struct timespec ts;
  if (timeout_ms >= 0)
    abs_timespec(es__now_ns() + (uint64_t)timeout_ms * 1000000ull, &ts);
  while (m->pending) {
    if (timeout_ms < 0)
      pthread_cond_wait(&rt->model_cv, &rt->lock);
    else if (pthread_cond_timedwait(&rt->model_cv, &rt->lock, &ts) == ETIMEDOUT && m->pending) {
      unsigned left = m->pending;
      pthread_mutex_unlock(&rt->lock);
      return es__fail(ES_ETIMEDOUT, "es_runtime_model_unload: %s still has %u requests "
                      "(it stays draining)", m->name, left);
    }
  }
  m->state = SLOT_UNLOADING;
  if (m->lane >= 0)
    lane_recompute_locked(rt, m->lane);
  pthread_mutex_unlock(&rt->lock);
  unload_slot(rt, m); /* state becomes SLOT_FREE */
  return 0;
}

int es_runtime_model_resume(es_runtime *rt, int id) {
  int rc;
  rt_model *m = lock_live_model(rt, id, 0, NULL, "es_runtime_model_resume", &rc);
  if (!m)
    return rc;
  m->draining = 0;
  es_admission_set_draining(rt->adm, id, 0);
  pthread_mutex_unlock(&rt->lock);
  return 0;
}

int es_runtime_model_find(es_runtime *rt, const char *name) {
  int rc = rt_check(rt, "es_runtime_model_find");
  if (rc < 0)
    return rc;
  if (!name)
    return es__fail(ES_EINVAL, "es_runtime_model_find: NULL name");
  pthread_mutex_lock(&rt->lock);
  int found = -1;
  for (int i = 0; i < rt->max_models && found < 0; i++)
    if (rt->models[i].state == SLOT_LIVE && !strcmp(rt->models[i].name, name))
      found = i;
  pthread_mutex_unlock(&rt->lock);
  return found >= 0 ? found : es__fail(ES_ENOENT, "no model named '%s'", name);
}

int es_runtime_model_get(es_runtime *rt, int id, es_model **out) {
  if (out)
    *out = NULL;
  int rc;
  rt_model *m = lock_live_model(rt, id, 1, out, "es_runtime_model_get", &rc);
  if (!m)
    return rc;
  *out = es_model_retain(m->model);
  pthread_mutex_unlock(&rt->lock);
  return 0;
}

/* ---- submit ---------------------------------------------------------------- */

static int check_inputs(const rt_model *m, const es_submit *s, es_tensor_info *shapes) {
  if (s->n_inputs != m->n_in)
    return es__fail(ES_EINVAL, "%s takes %d inputs, got %d", m->name, m->n_in, s->n_inputs);
  if (m->n_in && !s->inputs)
    return es__fail(ES_EINVAL, "%s: NULL inputs", m->name);
  for (int i = 0; i < m->n_in; i++) {
    const es_tensor *t = &s->inputs[i];
    es_tensor_info ti;
    es_model_input_info(m->model, i, &ti);
    if (t->dtype != m->in_dtype[i])
      return es__fail(ES_EINVAL, "%s: input %d (%s) must be %s, got %s", m->name, i, ti.name,
                      es_dtype_name(m->in_dtype[i]), es_dtype_name(t->dtype));
    if (t->rank < 0 || t->rank > ES_MAX_RANK)
      return es__fail(ES_EINVAL, "%s: input %d (%s) has rank %d", m->name, i, ti.name, t->rank);
    size_t n = es_dtype_size(t->dtype);
    for (int d = 0; d < t->rank; d++) {
      if (t->dims[d] < 0 || (t->dims[d] && n > SIZE_MAX / (size_t)t->dims[d]))
        return es__fail(ES_EINVAL, "%s: input %d (%s) has a bad dimension", m->name, i, ti.name);
      n *= (size_t)t->dims[d];
    }
    if (t->nbytes != n || (n && !t->data))
      return es__fail(ES_EINVAL, "%s: input %d (%s) has %zu bytes, its shape needs %zu",
                      m->name, i, ti.name, t->nbytes, n);
    shapes[i] = ti;
    shapes[i].rank = t->rank;
    memcpy(shapes[i].dims, t->dims, sizeof t->dims);
  }
  return 0;
}

/* The request's plan for its input shapes, and the arena and output bytes
 * admission reserves for it. */
static int plan_request(es_runtime *rt, const rt_model *m, const es_submit *s, es_request *r) {
  es_tensor_info shapes[ES_RT_MAX_IO];
  int rc = check_inputs(m, s, shapes);
  if (rc < 0)
    return rc;
  if (rt->cfg.intra_threads > 1)
    es_engine_threads_set(rt->cfg.intra_threads);
  rc = es_plan_cache_get(m->cache, shapes, m->n_in, &r->plan);
  if (rc < 0) { /* name the model: the engine's detail names the node */
    char detail[512];
    snprintf(detail, sizeof detail, "%s", es_last_error_detail());
    return es__fail(rc, "%s: %s", m->name, detail);
  }
  if (m->n_in)
    memcpy(r->inputs, s->inputs, (size_t)m->n_in * sizeof *r->inputs);
  /* A bucketed plan would want padded inputs; this cache has no buckets,
   * so the plan's shapes are the inputs'. */
  r->n_out = es_plan_output_count(r->plan);
  r->arena_bytes = es_plan_arena_bytes(r->plan);
  for (int i = 0; i < r->n_out; i++) {
    es_tensor_info oi;
    es_plan_output_info(r->plan, i, &oi);
    size_t n = es_dtype_size(oi.dtype);
    for (int d = 0; d < oi.rank; d++)
      n *= (size_t)(oi.dims[d] > 0 ? oi.dims[d] : 0);
    r->out_bytes += es__align_up(n, RT_ALIGN);
  }
  return 0;
}

/* The scheduler's own refusals, after admission: draining, a full queue,
 * or a deadline the queue ahead makes unreachable. ES_REFUSE_* (0: none)
 * and the backlog that decided it. */
static int queue_refusal_locked(const es_runtime *rt, const rt_model *m, const es_request *r,
                                uint64_t now, size_t *backlog) {
  const rt_queue *q = &rt->q[r->priority];
  if (rt->stopping)
    return ES_REFUSE_DRAINING;
  if (q->count >= rt->cfg.queue_capacity) {
    *backlog = q->count;
    return ES_REFUSE_QUEUE_FULL;
  }
  if (r->deadline_ns && m->mean_run_ns > 0) {
    /* Expected finish: the work queued at this level or above, and what is
     * running, spread over the workers that may take it, plus its own run
     * (a task's own time is not the model's). */
    size_t ahead = rt->n_workers - (size_t)rt->idle_workers;
    for (int l = 0; l <= r->priority; l++)
      ahead += rt->q[l].count;
    int lanes = m->lane >= 0 && !r->task ? 1 : rt->n_workers;
    double wait = m->mean_run_ns * ((double)ahead / lanes + (r->task ? 0.0 : 1.0));
    if ((double)now + wait > (double)r->deadline_ns) {
      *backlog = ahead;
      return ES_REFUSE_DEADLINE;
    }
  }
  return 0;
}

/* Where the request's arena comes from, and whether it can ever fit there.
 * The configured plan runs in the model's pool or its lane's scratchpad,
 * both sized for it; anything else, and every request's outputs, take a
 * block of the buddy pool, which grows only so far: a request needing more
 * than its largest possible block would be admitted and then fail on every
 * run, so it is refused here as never fitting (ES_ENOSPC, OVER_MEMORY,
 * like a request larger than the whole budget). */
static int arena_fits(es_runtime *rt, const rt_model *m, const es_request *r, es_refusal *why) {
  es_buddy_stats bs;
  if (es_buddy_stats_get(rt->buddy, &bs) < 0)
    return 0; /* cannot tell: the run will say */
  int own = r->plan == m->cfg_plan && (m->pool || m->lane >= 0);
  size_t arena = r->arena_bytes + ES_ARENA_GUARD + RT_ALIGN;
  size_t need = own ? 0 : arena;
  if (r->out_bytes > need)
    need = r->out_bytes;
  if (need <= bs.max_block)
    return 0;
  es_admission_refuse(rt->adm, r->model, ES_REFUSE_OVER_MEMORY, 0, why); /* counted */
  why->retry_after_ms = 0;
  why->requested = need;
  why->in_use = bs.bytes_in_use;
  why->limit = bs.max_block;
  return es__fail(ES_ENOSPC,
                  "%s: the run needs a %zu B block of the buddy pool (%s), whose largest block "
                  "can be %zu B: it can never run; configure the model for this shape or raise "
                  "the runtime's buddy_bytes (the pool grows to 4 times it)",
                  m->name, need, need == arena ? "its arena" : "its outputs", bs.max_block);
}

static es_request *request_new(es_runtime *rt, int model, int priority, uint64_t deadline_ns,
                               es_request_done_fn on_done, void *user) {
  es_request *r = es_mem_calloc(ES_MEM_RUNTIME, 1, sizeof *r);
  if (!r)
    return NULL;
  r->magic = RQ_MAGIC;
  r->rt = rt;
  r->refs = 2;
  r->model = model;
  r->priority = priority;
  r->worker = -1;
  r->seq_slot = -1;
  r->owner = r->own_next = NULL;
  rt_worker *me = tls_worker;
  r->submitter = me && me->rt == rt ? me->task : NULL;
  r->deadline_ns = deadline_ns;
  r->on_done = on_done;
  r->user = user;
  r->submit_ns = es__now_ns();
  if (cond_init_mono(&r->cv) < 0) {
    es_mem_free(r);
    return NULL;
  }
  return r;
}

/* The model by id with a pending count taken (it cannot go away while a
 * request holds one), or NULL. */
static rt_model *model_hold(es_runtime *rt, int id) {
  pthread_mutex_lock(&rt->lock);
  rt_model *m = live_model(rt, id);
  if (m)
    m->pending++;
  pthread_mutex_unlock(&rt->lock);
  return m;
}

static void model_unhold(es_runtime *rt, rt_model *m) {
  pthread_mutex_lock(&rt->lock);
  if (--m->pending == 0)
    pthread_cond_broadcast(&rt->model_cv);
  pthread_mutex_unlock(&rt->lock);
}

/* A new request's way in, after its plan (or task) is known: deadline,
 * admission (a slot and the bytes, or the bytes alone for a task), the
 * scheduler's refusals, the queue. On failure the request is not queued,
 * its refusal counted. */
static int request_admit(es_runtime *rt, rt_model *m, es_request *r, es_refusal *why) {
  int rc;
  if (r->deadline_ns && r->submit_ns >= r->deadline_ns) {
    es_admission_refuse(rt->adm, r->model, ES_REFUSE_DEADLINE, 0, why);
    rc = es__fail(ES_EAGAIN, "%s: the deadline has passed", m->name);
    goto refused;
  }
  size_t bytes = r->arena_bytes + r->out_bytes;
  rc = r->task ? es_admission_reserve(rt->adm, r->model, bytes, &r->ticket, why)
               : es_admission_try(rt->adm, r->model, bytes, &r->ticket, why);
  if (rc < 0) {
    r->ticket.magic = 0;
    goto refused;
  }

  pthread_mutex_lock(&rt->lock);
  size_t backlog = 0;
  int reason = queue_refusal_locked(rt, m, r, r->submit_ns, &backlog);
  if (reason) {
    pthread_mutex_unlock(&rt->lock);
    es_admission_cancel(rt->adm, &r->ticket);
    r->ticket.magic = 0;
    es_admission_refuse(rt->adm, r->model, reason, backlog, why);
    rc = es__fail(ES_EAGAIN, "%s: refused (%s)", m->name, es_refusal_name(reason));
    goto refused;
  }
  r->seq = ++rt->seq;
  r->state = RQ_QUEUED;
  rt_worker *me = tls_worker;
  if (r->submitter && me && me->rt == rt && me->task == r->submitter) {
    /* queued by the running task that submitted it: see "Tasks that submit" */
    r->owner = me->task;
    r->owner->owned++;
    if (!r->owner->own_next)
      r->owner->own_next = r;
  }
  queue_push(&rt->q[r->priority], r);
  rt->queued++;
  rt->submitted++;
  dispatch_locked(rt);
  if (r->deadline_ns)
    pthread_cond_signal(&rt->monitor_cv);
  pthread_mutex_unlock(&rt->lock);
  return 0;

refused:
  pthread_mutex_lock(&rt->lock);
  rt->refused++;
  pthread_mutex_unlock(&rt->lock);
  return rc;
}

/* The same for a request nobody holds yet: freed on failure, the model's
 * pending count given back. */
static int request_enqueue(es_runtime *rt, rt_model *m, es_request *r, es_refusal *why) {
  int rc = request_admit(rt, m, r, why);
  if (rc < 0)
    request_discard(rt, m, r);
  return rc;
}

/* A request that never reached the queue. */
static void request_discard(es_runtime *rt, rt_model *m, es_request *r) {
  es_plan_release(r->plan);
  pthread_cond_destroy(&r->cv);
  r->magic = RQ_DEAD;
  es_mem_free(r);
  model_unhold(rt, m);
}

int es_runtime_submit(es_runtime *rt, const es_submit *s, es_request **out, es_refusal *why) {
  int rc = rt_check(rt, "es_runtime_submit");
  if (rc < 0)
    return rc;
  if (!s || !out || !why)
    return es__fail(ES_EINVAL, "es_runtime_submit: NULL argument");
  *out = NULL;
  if (s->priority < 0 || s->priority >= rt->cfg.priorities)
    return es__fail(ES_EINVAL, "es_runtime_submit: priority %d outside 0..%d", s->priority,
                    rt->cfg.priorities - 1);
  rt_model *m = model_hold(rt, s->model);
  if (!m)
    return es__fail(ES_ENOENT, "es_runtime_submit: no model with id %d", s->model);
  es_request *r = request_new(rt, s->model, s->priority, s->deadline_ns, s->on_done, s->user);
  if (!r) {
    model_unhold(rt, m);
    return es__fail(ES_ENOMEM, "es_runtime_submit: no memory for the request");
  }
  r->n_in = s->n_inputs;
  if (s->sequence || s->sequence_key) {
    if ((s->sequence && s->sequence_key) ||
        (s->sequence_key && (!s->sequence_key[0] || strlen(s->sequence_key) >= ES_SEQ_KEY_MAX))) {
      request_discard(rt, m, r);
      return es__fail(ES_EINVAL, "es_runtime_submit: a sequence has a number or a string of 1 "
                      "to %d bytes as its id, not both", ES_SEQ_KEY_MAX - 1);
    }
    rc = seq_submit(rt, m, s, r, why);
    if (rc == 0)
      *out = r;
    return rc;
  }
  rc = plan_request(rt, m, s, r);
  if (rc == 0)
    rc = arena_fits(rt, m, r, why);
  if (rc < 0) {
    if (rc == ES_ENOSPC) {
      pthread_mutex_lock(&rt->lock);
      rt->refused++;
      pthread_mutex_unlock(&rt->lock);
    }
    request_discard(rt, m, r);
    return rc;
  }
  rc = request_enqueue(rt, m, r, why);
  if (rc == 0)
    *out = r;
  return rc;
}

int es_runtime_submit_task(es_runtime *rt, const es_task *t, es_request **out, es_refusal *why) {
  int rc = rt_check(rt, "es_runtime_submit_task");
  if (rc < 0)
    return rc;
  if (!t || !out || !why || !t->fn)
    return es__fail(ES_EINVAL, "es_runtime_submit_task: NULL argument or function");
  *out = NULL;
  if (t->priority < 0 || t->priority >= rt->cfg.priorities)
    return es__fail(ES_EINVAL, "es_runtime_submit_task: priority %d outside 0..%d", t->priority,
                    rt->cfg.priorities - 1);
  rt_model *m = model_hold(rt, t->model);
  if (!m)
    return es__fail(ES_ENOENT, "es_runtime_submit_task: no model with id %d", t->model);
  es_request *r = request_new(rt, t->model, t->priority, t->deadline_ns, t->on_done, t->user);
  if (!r) {
    model_unhold(rt, m);
    return es__fail(ES_ENOMEM, "es_runtime_submit_task: no memory for the request");
  }
  r->task = t->fn;
  r->task_user = t->user;
  r->arena_bytes = t->bytes;
  rc = request_enqueue(rt, m, r, why);
  if (rc == 0)
    *out = r;
  return rc;
}

/* ---- request handles ------------------------------------------------------- */

int es_request_wait(es_request *r, int timeout_ms) {
  int rc = rq_check(r, "es_request_wait");
  if (rc < 0)
    return rc;
  es_runtime *rt = r->rt;
  struct timespec ts;
  if (timeout_ms >= 0)
    abs_timespec(es__now_ns() + (uint64_t)timeout_ms * 1000000ull, &ts);
  pthread_mutex_lock(&rt->lock);
  rt_worker *me = tls_worker;
  if (me && me->rt == rt && me->task && r->state == RQ_QUEUED) {
    run_inline_locked(me, r); /* a task's own stage: see "Tasks that submit" */
    pthread_mutex_lock(&rt->lock);
  }
  while (!r->settled) {
    if (timeout_ms < 0) {
      pthread_cond_wait(&r->cv, &rt->lock);
    } else if (pthread_cond_timedwait(&r->cv, &rt->lock, &ts) == ETIMEDOUT && !r->settled) {
      pthread_mutex_unlock(&rt->lock);
      return es__fail(ES_ETIMEDOUT, "es_request_wait: not done within %d ms", timeout_ms);
    }
  }
  rc = r->status;
  pthread_mutex_unlock(&rt->lock);
  if (rc < 0) /* the waiter learns why, not only what */
    return es__fail(rc, "%s", r->detail);
  return rc;
}

int es_request_status(es_request *r) {
  int rc = rq_check(r, "es_request_status");
  if (rc < 0)
    return rc;
  pthread_mutex_lock(&r->rt->lock);
  rc = r->state == RQ_DONE ? r->status : ES_REQUEST_PENDING;
  pthread_mutex_unlock(&r->rt->lock);
  return rc;
}

int es_request_cancel(es_request *r) {
  int rc = rq_check(r, "es_request_cancel");
  if (rc < 0)
    return rc;
  es_runtime *rt = r->rt;
  es_request *done = NULL;
  pthread_mutex_lock(&rt->lock);
  if (r->state == RQ_QUEUED || r->state == RQ_PARKED) {
    if (r->state == RQ_QUEUED)
      queue_remove(rt, r);
    complete_locked(rt, r, ES_ECANCELED, &done);
    rc = 0;
  } else if (r->state == RQ_RUNNING && r->paused) {
    r->cancel_asked = 1; /* its worker drops it when it comes back to it */
    rc = 0;
  } else if (r->state == RQ_RUNNING) {
    rc = ES_EBUSY;
  } else {
    rc = ES_ESTATE;
  }
  pthread_mutex_unlock(&rt->lock);
  finish_list(rt, done);
  if (rc == ES_EBUSY)
    return es__fail(rc, "es_request_cancel: the request is running");
  if (rc == ES_ESTATE)
    return es__fail(rc, "es_request_cancel: the request has completed");
  return 0;
}

int es_request_output_count(es_request *r) {
  return rq_check(r, "es_request_output_count") < 0 ? 0 : r->n_out;
}

int es_request_output(es_request *r, int i, es_tensor *out) {
  int rc = rq_check(r, "es_request_output");
  if (rc < 0)
    return rc;
  if (!out || i < 0 || i >= r->n_out)
    return es__fail(ES_EINVAL, "es_request_output: no output %d", i);
  pthread_mutex_lock(&r->rt->lock);
  int ok = r->state == RQ_DONE && r->status == 0;
  pthread_mutex_unlock(&r->rt->lock);
  if (!ok)
    return es__fail(ES_ESTATE, "es_request_output: the request has not completed successfully");
  *out = r->outputs[i];
  return 0;
}

int es_request_info_get(es_request *r, es_request_info *out) {
  int rc = rq_check(r, "es_request_info_get");
  if (rc < 0)
    return rc;
  if (!out)
    return es__fail(ES_EINVAL, "es_request_info_get: NULL out");
  pthread_mutex_lock(&r->rt->lock);
  memset(out, 0, sizeof *out);
  out->status = r->state == RQ_DONE ? r->status : ES_REQUEST_PENDING;
  out->model = r->model;
  out->priority = r->priority;
  out->worker = r->worker;
  /* The worker writes these two while it runs r, without the lock; they
   * are read once r is done, which the lock orders after those writes. */
  int done = r->state == RQ_DONE;
  out->arena_source = done ? r->arena_source : ES_ARENA_FROM_NONE;
  out->seq = r->seq;
  uint64_t left = r->start_ns ? r->start_ns : r->end_ns;
  out->queue_ns = left > r->submit_ns ? left - r->submit_ns : 0;
  out->run_ns = r->start_ns && r->end_ns > r->start_ns ? r->end_ns - r->start_ns : 0;
  out->switch_ns = done ? r->switch_ns : 0;
  out->reserved_bytes = r->arena_bytes + r->out_bytes;
  out->preemptions = r->preemptions;
  out->paused_ns = r->paused_ns;
  out->preempting = r->preempting;
  out->refusal = r->refusal;
  pthread_mutex_unlock(&r->rt->lock);
  return 0;
}

void es_request_free(es_request *r) {
  if (!r || rq_check(r, "es_request_free") < 0)
    return;
  es_runtime *rt = r->rt;
  es_request *done = NULL;
  pthread_mutex_lock(&rt->lock);
  if (r->state == RQ_QUEUED || r->state == RQ_PARKED) {
    if (r->state == RQ_QUEUED)
      queue_remove(rt, r);
    complete_locked(rt, r, ES_ECANCELED, &done);
  }
  pthread_mutex_unlock(&rt->lock);
  finish_list(rt, done);
  drop_ref(r);
}

/* ---- control and stats ----------------------------------------------------- */

int es_runtime_pause(es_runtime *rt, int paused) {
  int rc = rt_check(rt, "es_runtime_pause");
  if (rc < 0)
    return rc;
  pthread_mutex_lock(&rt->lock);
  rt->paused = paused != 0;
  dispatch_locked(rt);
  pthread_mutex_unlock(&rt->lock);
  return 0;
}

int es_runtime_watch_now(es_runtime *rt) {
  int rc = rt_check(rt, "es_runtime_watch_now");
  if (rc < 0)
    return rc;
  es_request *done = NULL;
  pthread_mutex_lock(&rt->lock);
  watch_locked(rt, &done);
  pthread_mutex_unlock(&rt->lock);
  finish_list(rt, done);
  return es_admission_pressure(rt->adm);
}

es_admission *es_runtime_admission(es_runtime *rt) {
  return rt_check(rt, "es_runtime_admission") < 0 ? NULL : rt->adm;
}

int es_runtime_stats_get(es_runtime *rt, es_runtime_stats *out) {
  int rc = rt_check(rt, "es_runtime_stats_get");
  if (rc < 0)
    return rc;
  if (!out)
    return es__fail(ES_EINVAL, "es_runtime_stats_get: NULL out");
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&rt->lock);
  out->workers = rt->n_workers;
  out->priorities = rt->cfg.priorities;
  for (int l = 0; l < rt->cfg.priorities; l++)
    out->queued[l] = rt->q[l].count;
  out->queued_total = rt->queued;
  out->running = (size_t)(rt->n_workers - rt->idle_workers);
  out->submitted = rt->submitted;
  out->completed = rt->completed;
  out->failed = rt->failed;
  out->cancelled = rt->cancelled;
  out->expired = rt->expired;
  out->dropped = rt->dropped;
  out->refused = rt->refused;
  out->run_heap_bytes = atomic_load_explicit(&rt->heap_bytes, memory_order_relaxed);
  out->preemptions = rt->preemptions;
  out->preemptions_in_kernel = rt->preemptions_in_kernel;
  out->inlined = rt->inlined;
  memcpy(out->pause_hist, rt->pause_hist, sizeof out->pause_hist);
  out->pause_ns_sum = rt->pause_ns_sum;
  out->pause_overhead_ns_sum = rt->pause_overhead_ns_sum;
  out->pause_overhead_ns_max = rt->pause_overhead_ns_max;
  out->pause_lock_wait_ns_sum = rt->pause_lock_wait_ns_sum;
  for (int i = 0; i < rt->n_workers; i++)
    out->scratch_bytes += rt->workers[i].scratch_cap;
  for (int i = 0; i < rt->max_models; i++) {
    rt_model *m = &rt->models[i];
    if (m->state != SLOT_LIVE)
      continue;
    out->models++;
    out->pool_bytes += m->pool_bytes;
    int first = 1; /* weights counted once per distinct es_model */
    for (int j = 0; j < i && first; j++)
      if (rt->models[j].state == SLOT_LIVE && rt->models[j].model == m->model)
        first = 0;
    es_model_stats ms;
    if (first && es_model_stats_get(m->model, &ms) == 0)
      out->weights_bytes += ms.weight_bytes + ms.prepared_bytes;
  }
  pthread_mutex_unlock(&rt->lock);
  es_buddy_stats bs;
  if (es_buddy_stats_get(rt->buddy, &bs) == 0) {
    out->buddy_capacity = bs.capacity;
    out->buddy_in_use = bs.bytes_in_use;
    out->buddy_peak = bs.peak_in_use;
    out->buddy_fragmentation = bs.fragmentation;
    out->buddy_failures = bs.failures;
  }
  return 0;
}

int es_runtime_model_stats_get(es_runtime *rt, int id, es_runtime_model_stats *out) {
  int rc;
  rt_model *m = lock_live_model(rt, id, 1, out, "es_runtime_model_stats_get", &rc);
  if (!m)
    return rc;
  memset(out, 0, sizeof *out);
  snprintf(out->name, sizeof out->name, "%s", m->name);
  out->lane = m->lane;
  out->home_worker = m->home;
  for (int j = 0; j < rt->max_models; j++)
    if (j != id && rt->models[j].state == SLOT_LIVE && rt->models[j].model == m->model)
      out->shared = 1;
  es_model_stats ms;
  if (es_model_stats_get(m->model, &ms) == 0) {
    out->weights_bytes = ms.weight_bytes + ms.prepared_bytes;
    out->weights_resident = ms.weights_resident;
    out->int8_nodes = ms.int8_nodes;
    out->float_nodes = ms.float_nodes;
    out->bf16_nodes = ms.bf16_nodes;
    out->w8_nodes = ms.w8_nodes;
  }
  out->planned_bytes = m->planned;
  out->pool_bytes = m->pool_bytes;
  es_arena_pool_stats ps;
  if (m->pool && es_arena_pool_stats_get(m->pool, &ps) == 0) {
    out->pool_in_use = ps.in_use;
    out->pool_high_water = ps.high_water;
  }
  out->completed = m->completed;
  out->failed = m->failed;
  out->mean_run_ns = m->mean_run_ns;
  out->preemptions = m->preemptions;
  out->preempting = m->preempting;
  out->pending = m->pending;
  out->draining = m->draining;
  out->sequences = m->live_seqs;
  out->state_bytes = m->state_bytes;
  out->sequences_started = m->seq_started;
  out->sequences_ended = m->seq_ended;
  out->sequences_evicted = m->seq_evicted;
  pthread_mutex_unlock(&rt->lock);
  return 0;
}

int es_runtime_lane_stats_get(es_runtime *rt, int lane, es_lane_stats *out) {
  int rc = rt_check(rt, "es_runtime_lane_stats_get");
  if (rc < 0)
    return rc;
  if (!out || lane < 0 || lane >= rt->n_workers)
    return es__fail(ES_EINVAL, "es_runtime_lane_stats_get: no lane %d", lane);
  pthread_mutex_lock(&rt->lock);
  rt_worker *w = &rt->workers[lane];
  memset(out, 0, sizeof *out);
  out->scratch_bytes = w->want_cap;
  out->sum_bytes = w->lane_sum;
  out->models = w->lane_models;
  out->runs = w->runs;
  out->switches = w->switches;
  out->switch_ns_max = w->switch_ns_max;
  out->switch_ns_mean = w->switches ? w->switch_ns_sum / (double)w->switches : 0;
  out->busy = w->job != NULL;
  pthread_mutex_unlock(&rt->lock);
  return 0;
}
