/* GET /metrics: Prometheus text exposition (format 0.0.4).
 *
 * Everything is read at scrape time from the runtime, the admission gate,
 * the pools, the counting layer and the cgroup, so the numbers cannot drift
 * from what the code actually holds; the server itself only keeps the
 * per-model request outcomes and duration histograms. */
#include "common/internal.h"
#include "memory/strbuf.h"
#include "server/server_internal.h"

#include <stdio.h>
#include <string.h>

static void head(es_strbuf *b, const char *name, const char *type, const char *help) {
  es__sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void hist(es_strbuf *b, const char *name, const char *model, const uint64_t *h, double sum,
                 uint64_t count) {
  uint64_t cum = 0;
  for (int i = 0; i < SRV_BUCKETS; i++) {
    cum += h[i];
    es__sb_printf(b, "%s_bucket{model=\"%s\",le=\"%g\"} %llu\n", name, model,
                  es__srv_bucket_bounds[i], (unsigned long long)cum);
  }
  cum += h[SRV_BUCKETS];
  es__sb_printf(b, "%s_bucket{model=\"%s\",le=\"+Inf\"} %llu\n", name, model,
                (unsigned long long)cum);
  es__sb_printf(b, "%s_sum{model=\"%s\"} %.9g\n%s_count{model=\"%s\"} %llu\n", name, model, sum,
                name, model, (unsigned long long)count);
}

static const char *const outcome_names[SRV_OUT_COUNT] = {"success", "refused", "bad_request",
                                                         "error"};

/* Request outcomes, refusals and durations, per model. */
static void model_requests(es_strbuf *b, const srv_model *snap, int n) {
  head(b, "edgeserve_requests_total", "counter", "Inference requests by outcome.");
  for (int i = 0; i < n; i++)
    for (int o = 0; o < SRV_OUT_COUNT; o++)
      es__sb_printf(b, "edgeserve_requests_total{model=\"%s\",outcome=\"%s\"} %llu\n", snap[i].name,
          outcome_names[o], (unsigned long long)snap[i].outcomes[o]);
  head(b, "edgeserve_refused_total", "counter",
       "Requests refused (429/503) by reason.");
  for (int i = 0; i < n; i++)
    for (int r = 1; r < ES_REFUSE_COUNT; r++)
      es__sb_printf(b, "edgeserve_refused_total{model=\"%s\",reason=\"%s\"} %llu\n", snap[i].name,
          es_refusal_name(r), (unsigned long long)snap[i].refused_by[r]);
  head(b, "edgeserve_queue_duration_seconds", "histogram",
       "Time from admission to the start of the run.");
  for (int i = 0; i < n; i++)
    hist(b, "edgeserve_queue_duration_seconds", snap[i].name, snap[i].queue_hist,
         snap[i].queue_sum_s, snap[i].observed);
  head(b, "edgeserve_compute_duration_seconds", "histogram",
       "Time of the run, outputs copied.");
  for (int i = 0; i < n; i++)
    hist(b, "edgeserve_compute_duration_seconds", snap[i].name, snap[i].run_hist,
         snap[i].run_sum_s, snap[i].observed);
}

/* Whether each model is loaded and what it holds. ms: scratch for the
 * runtime's per-model numbers (heap, as snap). */
static void model_memory(es_strbuf *b, es_server *s, const srv_model *snap, int n,
                         es_runtime_model_stats *ms) {
  head(b, "edgeserve_model_loaded", "gauge", "1 when the model is loaded.");
  for (int i = 0; i < n; i++)
    es__sb_printf(b, "edgeserve_model_loaded{model=\"%s\"} %d\n", snap[i].name, snap[i].rt_id >= 0);
  head(b, "edgeserve_model_inflight_requests", "gauge",
       "Admitted requests of the model not yet answered.");
  for (int i = 0; i < n; i++) {
    es_admission_model_stats am;
    memset(&am, 0, sizeof am);
    if (snap[i].rt_id >= 0)
      es_admission_model_stats_get(es_runtime_admission(s->rt), snap[i].rt_id, &am);
    es__sb_printf(b, "edgeserve_model_inflight_requests{model=\"%s\"} %u\n", snap[i].name,
                  am.inflight);
  }
  for (int i = 0; i < n; i++) {
    memset(&ms[i], 0, sizeof ms[i]);
    if (snap[i].rt_id >= 0)
      es_runtime_model_stats_get(s->rt, snap[i].rt_id, &ms[i]);
  }
#define MODEL_GAUGE(fam, help, field)                                                  \
  head(b, fam, "gauge", help);                                                        \
  for (int i = 0; i < n; i++)                                                          \
    es__sb_printf(b, fam "{model=\"%s\"} %zu\n", snap[i].name, (size_t)ms[i].field);
  MODEL_GAUGE("edgeserve_arena_pool_bytes", "Bytes of the model's arena pool.", pool_bytes)
  MODEL_GAUGE("edgeserve_arena_pool_in_use", "Arenas of the model's pool in use.", pool_in_use)
  MODEL_GAUGE("edgeserve_arena_pool_high_water", "Most arenas of the pool in use at once.",
              pool_high_water)
  MODEL_GAUGE("edgeserve_model_planned_arena_bytes",
              "Planned arena bytes at the configured shape.", planned_bytes)
  MODEL_GAUGE("edgeserve_weights_mapped_bytes", "Weight bytes of the model (shared copies "
              "counted for each name).", weights_bytes)
  MODEL_GAUGE("edgeserve_weights_resident_bytes", "Of the mapped weights, bytes in RAM.",
              weights_resident)
  head(b, "edgeserve_model_compute_nodes", "gauge",
       "Convolutions and matrix products of the model by the precision they run in.");
  for (int i = 0; i < n; i++) {
    es__sb_printf(b, "edgeserve_model_compute_nodes{model=\"%s\",precision=\"int8\"} %zu\n",
                  snap[i].name, ms[i].int8_nodes);
    es__sb_printf(b, "edgeserve_model_compute_nodes{model=\"%s\",precision=\"float32\"} %zu\n",
                  snap[i].name, ms[i].float_nodes);
    es__sb_printf(b, "edgeserve_model_compute_nodes{model=\"%s\",precision=\"bf16\"} %zu\n",
                  snap[i].name, ms[i].bf16_nodes);
  }
  MODEL_GAUGE("edgeserve_model_int8_weight_nodes",
              "Of the float32 convolutions, those whose weights the model holds in int8.",
              w8_nodes)
  MODEL_GAUGE("edgeserve_sequences_live", "Live sequences of the model.", sequences)
  MODEL_GAUGE("edgeserve_sequence_state_bytes",
              "Bytes reserved for the state of the model's live sequences.", state_bytes)
#undef MODEL_GAUGE
#define MODEL_COUNTER(fam, help, field)                                                \
  head(b, fam, "counter", help);                                                      \
  for (int i = 0; i < n; i++)                                                          \
    es__sb_printf(b, fam "{model=\"%s\"} %llu\n", snap[i].name,                        \
                  (unsigned long long)ms[i].field);
  MODEL_COUNTER("edgeserve_sequences_started_total", "Sequences started (or restarted).",
                sequences_started)
  MODEL_COUNTER("edgeserve_sequences_ended_total", "Sequences ended by their last request.",
                sequences_ended)
  MODEL_COUNTER("edgeserve_sequence_evictions_total",
                "Sequences ended because they were idle past their timeout.", sequences_evicted)
  MODEL_COUNTER("edgeserve_preemptions_total",
                "Times a run of the model was paused between two steps for a more urgent "
                "request.", preemptions)
  MODEL_COUNTER("edgeserve_preempting_total",
                "Requests of the model run in another run's pause.", preempting)
#undef MODEL_COUNTER
}

/* The runtime's queues, the admission gate, the buddy pool and the lanes. */
static void runtime_state(es_strbuf *b, es_server *s, const es_runtime_stats *rs,
                          const es_admission_stats *as) {
  head(b, "edgeserve_inflight_requests", "gauge", "Admitted requests not yet answered.");
  es__sb_printf(b, "edgeserve_inflight_requests %zu\n", as->inflight);
  head(b, "edgeserve_queue_depth", "gauge", "Queued requests per priority level.");
  for (int l = 0; l < rs->priorities; l++)
    es__sb_printf(b, "edgeserve_queue_depth{priority=\"%d\"} %zu\n", l, rs->queued[l]);
  head(b, "edgeserve_running_requests", "gauge", "Requests running on the workers.");
  es__sb_printf(b, "edgeserve_running_requests %zu\n", rs->running);
  head(b, "edgeserve_admission_reserved_bytes", "gauge",
       "Arena and output bytes reserved by admitted requests.");
  es__sb_printf(b, "edgeserve_admission_reserved_bytes %zu\n", as->reserved_bytes);
  head(b, "edgeserve_admission_budget_bytes", "gauge", "The memory budget (0: none).");
  es__sb_printf(b, "edgeserve_admission_budget_bytes %zu\n", as->memory_budget_bytes);
  head(b, "edgeserve_memory_pressure", "gauge", "0 none, 1 above soft, 2 above hard.");
  es__sb_printf(b, "edgeserve_memory_pressure %d\n", as->pressure);

  head(b, "edgeserve_pause_duration_seconds", "histogram",
       "How long runs stayed paused for a more urgent request (its run and hand-over).");
  uint64_t cum = 0;
  for (int k = 0; k < ES_RT_PAUSE_BUCKETS - 1; k++) {
    cum += rs->pause_hist[k];
    es__sb_printf(b, "edgeserve_pause_duration_seconds_bucket{le=\"%g\"} %llu\n",
                  es_runtime_pause_bound_us(k) / 1e6, (unsigned long long)cum);
  }
  cum += rs->pause_hist[ES_RT_PAUSE_BUCKETS - 1];
  es__sb_printf(b, "edgeserve_pause_duration_seconds_bucket{le=\"+Inf\"} %llu\n",
                (unsigned long long)cum);
  es__sb_printf(b, "edgeserve_pause_duration_seconds_sum %.9g\n"
                   "edgeserve_pause_duration_seconds_count %llu\n",
                (double)rs->pause_ns_sum / 1e9, (unsigned long long)cum);

  head(b, "edgeserve_preemptions_in_kernel_total", "counter",
       "Runs paused inside a step, at a safe point between two bands of a long convolution.");
  es__sb_printf(b, "edgeserve_preemptions_in_kernel_total %llu\n",
                (unsigned long long)rs->preemptions_in_kernel);
  head(b, "edgeserve_task_stages_inline_total", "counter",
       "Requests a task (a pipeline: face, OCR) submitted and ran itself on its worker when it "
       "waited for them, with no hand-over to another thread.");
  es__sb_printf(b, "edgeserve_task_stages_inline_total %llu\n", (unsigned long long)rs->inlined);
  head(b, "edgeserve_pause_overhead_seconds_total", "counter",
       "What pausing itself cost: hand-over to the urgent run and back, its run not counted.");
  es__sb_printf(b, "edgeserve_pause_overhead_seconds_total %.9g\n",
                (double)rs->pause_overhead_ns_sum / 1e9);
  head(b, "edgeserve_pause_lock_wait_seconds_total", "counter",
       "Of the pauses' cost, the time spent waiting for the runtime's lock to hand back.");
  es__sb_printf(b, "edgeserve_pause_lock_wait_seconds_total %.9g\n",
                (double)rs->pause_lock_wait_ns_sum / 1e9);
  head(b, "edgeserve_pause_overhead_max_seconds", "gauge", "The largest one pause cost.");
  es__sb_printf(b, "edgeserve_pause_overhead_max_seconds %.9g\n",
                (double)rs->pause_overhead_ns_max / 1e9);

  head(b, "edgeserve_buddy_capacity_bytes", "gauge", "Buddy pool capacity.");
  es__sb_printf(b, "edgeserve_buddy_capacity_bytes %zu\n", rs->buddy_capacity);
  head(b, "edgeserve_buddy_in_use_bytes", "gauge", "Buddy pool bytes handed out.");
  es__sb_printf(b, "edgeserve_buddy_in_use_bytes %zu\n", rs->buddy_in_use);
  head(b, "edgeserve_buddy_peak_bytes", "gauge", "Buddy pool historic peak.");
  es__sb_printf(b, "edgeserve_buddy_peak_bytes %zu\n", rs->buddy_peak);
  head(b, "edgeserve_run_heap_bytes", "gauge",
       "Buddy pool bytes held by runs beyond their plans (nodes no bound covers), charged to "
       "their requests' admission.");
  es__sb_printf(b, "edgeserve_run_heap_bytes %zu\n", rs->run_heap_bytes);
  head(b, "edgeserve_buddy_failures_total", "counter", "Buddy allocations that failed.");
  es__sb_printf(b, "edgeserve_buddy_failures_total %llu\n", (unsigned long long)rs->buddy_failures);
  head(b, "edgeserve_buddy_fragmentation_ratio", "gauge",
       "1 - largest free block / what free memory could form.");
  es__sb_printf(b, "edgeserve_buddy_fragmentation_ratio %.6f\n", rs->buddy_fragmentation);
  head(b, "edgeserve_lane_scratch_bytes", "gauge", "Shared scratchpad of each lane.");
  for (int w = 0; w < rs->workers; w++) {
    es_lane_stats ls;
    if (es_runtime_lane_stats_get(s->rt, w, &ls) == 0)
      es__sb_printf(b, "edgeserve_lane_scratch_bytes{lane=\"%d\"} %zu\n", w, ls.scratch_bytes);
  }
  head(b, "edgeserve_weights_bytes", "gauge", "Distinct weight bytes of loaded models.");
  es__sb_printf(b, "edgeserve_weights_bytes %zu\n", rs->weights_bytes);
}

/* The counting layer's tags, the process and its memory cgroup. */
static void process_memory(es_strbuf *b) {
  head(b, "edgeserve_memory_tag_bytes", "gauge",
       "Bytes held per subsystem, from the counting layer.");
  for (int t = 0; t < ES_MEM_TAG_COUNT; t++) {
    es_mem_stats tag;
    if (es_mem_stats_get((es_mem_tag)t, &tag) == 0)
      es__sb_printf(b, "edgeserve_memory_tag_bytes{tag=\"%s\"} %zu\n",
                    es_mem_tag_name((es_mem_tag)t), tag.current);
  }
  size_t rss = 0;
  es_sys_rss(&rss);
  head(b, "edgeserve_process_resident_bytes", "gauge", "Resident set size of the process.");
  es__sb_printf(b, "edgeserve_process_resident_bytes %zu\n", rss);
  head(b, "edgeserve_weights_locked_bytes", "gauge",
       "Bytes of weights and prepared weights locked in RAM (mlock).");
  es__sb_printf(b, "edgeserve_weights_locked_bytes %zu\n", es_weights_locked_bytes());
  es_memstat st;
  if (es_memstat_read(&st) == 0) {
    head(b, "edgeserve_cgroup_version", "gauge", "Memory cgroup version found (0: none).");
    es__sb_printf(b, "edgeserve_cgroup_version %d\n", st.version);
    head(b, "edgeserve_cgroup_memory_current_bytes", "gauge", "Bytes charged to the group.");
    es__sb_printf(b, "edgeserve_cgroup_memory_current_bytes %zu\n", st.current);
    head(b, "edgeserve_cgroup_memory_high_bytes", "gauge", "Soft limit (-1: none).");
    es__sb_printf(b, "edgeserve_cgroup_memory_high_bytes %.0f\n",
        st.high == SIZE_MAX ? -1.0 : (double)st.high);
    head(b, "edgeserve_cgroup_memory_max_bytes", "gauge", "Hard limit (-1: none).");
    es__sb_printf(b, "edgeserve_cgroup_memory_max_bytes %.0f\n",
        st.max == SIZE_MAX ? -1.0 : (double)st.max);
    head(b, "edgeserve_cgroup_memory_events_total", "counter", "memory.events counters.");
    es__sb_printf(b, "edgeserve_cgroup_memory_events_total{event=\"high\"} %llu\n",
        (unsigned long long)st.events.high);
    es__sb_printf(b, "edgeserve_cgroup_memory_events_total{event=\"max\"} %llu\n",
        (unsigned long long)st.events.max);
    es__sb_printf(b, "edgeserve_cgroup_memory_events_total{event=\"oom\"} %llu\n",
        (unsigned long long)st.events.oom);
    es__sb_printf(b, "edgeserve_cgroup_memory_events_total{event=\"oom_kill\"} %llu\n",
        (unsigned long long)st.events.oom_kill);
  }
}

static void http_state(es_strbuf *b, es_server *s) {
  head(b, "edgeserve_http_responses_total", "counter", "HTTP responses sent.");
  es__sb_printf(b, "edgeserve_http_responses_total %llu\n",
                (unsigned long long)atomic_load(&s->served));
  head(b, "edgeserve_http_rejected_total", "counter",
       "Requests answered before reaching a model: body too large (413), request bytes "
       "in flight over the limit (503), malformed headers (400).");
  static const char *const rej[SRV_REJECT_COUNT] = {"body_too_large", "buffered_limit",
                                                    "bad_header"};
  for (int i = 0; i < SRV_REJECT_COUNT; i++)
    es__sb_printf(b, "edgeserve_http_rejected_total{reason=\"%s\"} %llu\n", rej[i],
        (unsigned long long)atomic_load(&s->rejected[i]));
  head(b, "edgeserve_http_buffered_bytes", "gauge", "Request bodies and answers being sent: bytes held now.");
  es__sb_printf(b, "edgeserve_http_buffered_bytes %zu\n", atomic_load(&s->buffered));
  size_t open = 0;
  unsigned queued = 0, running = 0;
  if (s->http_started) {
    pthread_mutex_lock(&s->conn_mu);
    open = s->n_conns;
    pthread_mutex_unlock(&s->conn_mu);
    pthread_mutex_lock(&s->pipe_mu);
    queued = s->pipe_queued;
    running = s->pipe_running;
    pthread_mutex_unlock(&s->pipe_mu);
  }
  head(b, "edgeserve_http_connections", "gauge", "Connections open now.");
  es__sb_printf(b, "edgeserve_http_connections %zu\n", open);
  head(b, "edgeserve_http_connections_max", "gauge",
       "Connections the server holds at most (max_connections, kept below the descriptor "
       "limit).");
  es__sb_printf(b, "edgeserve_http_connections_max %u\n", s->cfg.max_connections);
  head(b, "edgeserve_http_connections_total", "counter", "Connections accepted.");
  es__sb_printf(b, "edgeserve_http_connections_total %llu\n",
                (unsigned long long)atomic_load(&s->conns_total));
  head(b, "edgeserve_http_connection_buffer_bytes", "gauge",
       "Upper bound of the HTTP library's buffers of the open connections (headers and "
       "read buffer, allocated by the library per connection).");
  es__sb_printf(b, "edgeserve_http_connection_buffer_bytes %zu\n",
                open * SRV_CONN_BUFFER(s->cfg));
  head(b, "edgeserve_http_timeouts_total", "counter",
       "Connections closed for exceeding a phase's time limit.");
  static const char *const ph[SRV_PHASE_COUNT] = {"idle", "headers", "body"};
  for (int i = 0; i < SRV_PHASE_COUNT; i++)
    es__sb_printf(b, "edgeserve_http_timeouts_total{phase=\"%s\"} %llu\n", ph[i],
                  (unsigned long long)atomic_load(&s->timeouts[i]));
  head(b, "edgeserve_pipeline_jobs", "gauge", "Pipeline requests (face, OCR) by state.");
  es__sb_printf(b, "edgeserve_pipeline_jobs{state=\"queued\"} %u\n", queued);
  es__sb_printf(b, "edgeserve_pipeline_jobs{state=\"running\"} %u\n", running);
}

int es_server_metrics_text(es_server *s, char **text, size_t *len) {
  if (!s || !text)
    return es__fail(ES_EINVAL, "es_server_metrics_text: NULL argument");
  *text = NULL;
  es_strbuf b = es__sb_init(ES_MEM_SERVER);
  es_runtime_stats rs;
  es_runtime_stats_get(s->rt, &rs);
  es_admission_stats as;
  es_admission_stats_get(es_runtime_admission(s->rt), &as);

  /* Copy the server's counters under its lock, then format without it.
   * (Heap, not thread-local: every connection thread would carry it.) */
  srv_model *snap = es_mem_alloc(ES_MEM_SERVER, SRV_MAX_MODELS * sizeof *snap);
  es_runtime_model_stats *ms = es_mem_alloc(ES_MEM_SERVER, SRV_MAX_MODELS * sizeof *ms);
  if (!snap || !ms) {
    es_mem_free(snap);
    es_mem_free(ms);
    return es__fail(ES_ENOMEM, "metrics: no memory for a snapshot of %d models", SRV_MAX_MODELS);
  }
  pthread_mutex_lock(&s->mu);
  int n = s->n_models;
  memcpy(snap, s->models, (size_t)n * sizeof *snap);
  pthread_mutex_unlock(&s->mu);
  model_requests(&b, snap, n);
  model_memory(&b, s, snap, n, ms);
  runtime_state(&b, s, &rs, &as);
  process_memory(&b);
  http_state(&b, s);
  es_mem_free(snap);
  es_mem_free(ms);
  *text = es__sb_take(&b, len);
  return *text ? 0 : es__fail(ES_ENOMEM, "metrics: no memory for the text");
}
