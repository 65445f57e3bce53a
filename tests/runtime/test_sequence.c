/* Sequences in the runtime: a stateful model served in chunks gives what
 * one run over the whole sequence gives; requests of one sequence run in
 * submission order even when submitted all at once; state memory is
 * reserved through admission with exact bytes, grows step by step or is
 * reserved up front, and comes back at the end, after an idle timeout and
 * at unload; string ids are sequences of their own; every misuse gets its
 * error. The models are built here: an
 * LSTM (two state pairs, h and c) and a growing state (Concat of the past
 * and the new step, a KV cache in miniature). */
#include "es_test.h"

#include "edgeserve/engine.h"
#include "edgeserve/runtime.h"
#include "support/onnx_builder.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define F OB_SEQ_F /* LSTM input features */
#define H OB_SEQ_H /* hidden */
#define CHUNK 4
#define CHUNKS 5
#define STEP 4 /* growing state: floats per step */

static char lstm_path[256], grow_path[256];

static void write_model(const ob *b, char *path, const char *stem) {
  size_t n;
  uint8_t *bytes = ob_pack(b, &n);
  snprintf(path, 256, "/tmp/es-seq-%s-%d.onnx", stem, (int)getpid());
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(bytes, 1, n, f), n);
  fclose(f);
  free(bytes);
}

/* x [T, 1, F] (T free), h0 and c0 [1, 1, H] -> y [T, 1, 1, H], hn, cn. */
static void make_lstm(void) {
  ob *b = ob_new(14);
  ob_seq_lstm(b);
  write_model(b, lstm_path, "lstm");
  free(b);
}

/* past [1, P, STEP] (P free), x [1, 1, STEP] -> present = concat(past, x). */
static void make_grow(void) {
  ob *b = ob_new(13);
  ob_input(b, "past", 3, (int64_t[]){1, -1, STEP});
  ob_input(b, "x", 3, (int64_t[]){1, 1, STEP});
  int n = ob_node(b, "Concat", "present", 2, "past", "x");
  ob_attr_int(b, n, "axis", 1);
  ob_output(b, "present");
  write_model(b, grow_path, "grow");
  free(b);
}

static int setup(void **state) {
  (void)state;
  make_lstm();
  make_grow();
  return 0;
}

static int teardown(void **state) {
  (void)state;
  unlink(lstm_path);
  unlink(grow_path);
  return 0;
}

static es_runtime *rt_new(size_t budget, int watch_ms) {
  es_runtime_config rc;
  es_runtime_config_default(&rc);
  rc.workers = 2;
  rc.pin = 0;
  rc.memory_budget_bytes = budget;
  rc.watch_ms = watch_ms;
  rc.buddy_bytes = (size_t)8 << 20;
  es_runtime *rt;
  assert_int_equal(es_runtime_create(&rc, &rt), 0);
  return rt;
}

static const es_state_pair lstm_states[2] = {{"h0", "hn"}, {"c0", "cn"}};

static int load_lstm(es_runtime *rt, unsigned max_seqs) {
  es_model_config mc;
  es_model_config_default(&mc);
  mc.name = "lstm";
  mc.path = lstm_path;
  mc.states = lstm_states;
  mc.n_states = 2;
  mc.max_sequences = max_seqs;
  int id;
  assert_int_equal(es_runtime_model_load(rt, &mc, &id), 0);
  return id;
}

static float xs[CHUNK * CHUNKS * F];

static void fill_x(unsigned seed) {
  for (size_t i = 0; i < sizeof xs / sizeof *xs; i++)
    xs[i] = sinf((float)(i * 0.37 + seed));
}

/* Inputs x (T steps from xs + at), h0 and c0 (data NULL: left to the
 * runtime, or zeros when given). */
static void lstm_inputs(es_tensor *in, int at, int T, const float *h0, const float *c0) {
  in[0] = ob_tensor_f32("x", 3, (int64_t[]){T, 1, F}, xs + (size_t)at * F);
  in[1] = ob_tensor_f32("h0", 3, (int64_t[]){1, 1, H}, h0);
  in[2] = ob_tensor_f32("c0", 3, (int64_t[]){1, 1, H}, c0);
  if (!h0)
    in[1].nbytes = 0;
  if (!c0)
    in[2].nbytes = 0;
}

static int submit(es_runtime *rt, int id, es_tensor *in, int n, uint64_t seq, unsigned flags,
                  es_request **r) {
  es_submit s = {.model = id, .inputs = in, .n_inputs = n, .sequence = seq,
                 .sequence_flags = flags};
  es_refusal why;
  return es_runtime_submit(rt, &s, r, &why);
}

static void out_of(es_request *r, int i, es_tensor *t) {
  assert_int_equal(es_request_output(r, i, t), 0);
}

static void assert_close(const float *a, const float *b, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (fabsf(a[i] - b[i]) > 1e-5f) {
      printf("# at %zu: %g against %g\n", i, a[i], b[i]);
      fail();
    }
}

static size_t reserved(es_runtime *rt) {
  es_admission_stats as;
  assert_int_equal(es_admission_stats_get(es_runtime_admission(rt), &as), 0);
  return as.reserved_bytes;
}

static es_runtime_model_stats mstats(es_runtime *rt, int id) {
  es_runtime_model_stats ms;
  assert_int_equal(es_runtime_model_stats_get(rt, id, &ms), 0);
  return ms;
}

/* The reference: the whole of xs as one request outside any sequence,
 * from zero states (seed picks xs); waited for, the caller frees it. */
static es_request *whole_run(es_runtime *rt, int id, unsigned seed) {
  fill_x(seed);
  float zeros[H] = {0};
  es_tensor in[3];
  es_request *whole;
  lstm_inputs(in, 0, CHUNK * CHUNKS, zeros, zeros);
  assert_int_equal(submit(rt, id, in, 3, 0, 0, &whole), 0);
  assert_int_equal(es_request_wait(whole, -1), 0);
  return whole;
}

/* Chunks through the sequence's state equal one whole run: y chunk by
 * chunk, hn and cn at the end; then the state is freed at the end. */
static void test_lstm_chunks_equal_whole(void **state) {
  (void)state;
  es_runtime *rt = rt_new((size_t)64 << 20, 100);
  int id = load_lstm(rt, 8);
  es_request *whole = whole_run(rt, id, 1);
  es_tensor in[3];
  es_tensor wy, wh, wc;
  out_of(whole, 0, &wy);
  out_of(whole, 1, &wh);
  out_of(whole, 2, &wc);
  for (int c = 0; c < CHUNKS; c++) {
    es_request *r;
    lstm_inputs(in, c * CHUNK, CHUNK, NULL, NULL);
    unsigned flags = (c == 0 ? ES_SEQ_START : 0) | (c == CHUNKS - 1 ? ES_SEQ_END : 0);
    assert_int_equal(submit(rt, id, in, 3, 42, flags, &r), 0);
    assert_int_equal(es_request_wait(r, -1), 0);
    es_tensor y, hn, cn;
    out_of(r, 0, &y);
    assert_int_equal(y.dims[0], CHUNK);
    assert_close(y.data, (const float *)wy.data + (size_t)c * CHUNK * H, (size_t)CHUNK * H);
    if (c < CHUNKS - 1) {
      es_runtime_model_stats ms = mstats(rt, id);
      assert_int_equal(ms.sequences, 1);
      assert_int_equal(ms.state_bytes, 2 * 64); /* two states of 16 floats, aligned */
      assert_true(reserved(rt) >= ms.state_bytes);
    } else {
      out_of(r, 1, &hn);
      out_of(r, 2, &cn);
      assert_close(hn.data, wh.data, H);
      assert_close(cn.data, wc.data, H);
    }
    es_request_free(r);
  }
  /* the state matters: chunk 1 from zeros differs from chunk 1 in sequence */
  es_request *alone;
  lstm_inputs(in, CHUNK, CHUNK, NULL, NULL);
  assert_int_equal(submit(rt, id, in, 3, 43, ES_SEQ_START | ES_SEQ_END, &alone), 0);
  assert_int_equal(es_request_wait(alone, -1), 0);
  es_tensor ay;
  out_of(alone, 0, &ay);
  float diff = 0;
  for (int i = 0; i < CHUNK * H; i++)
    diff = fmaxf(diff, fabsf(((const float *)ay.data)[i] - ((const float *)wy.data)[CHUNK * H + i]));
  assert_true(diff > 1e-3f);
  es_request_free(alone);
  es_request_free(whole);
  es_runtime_model_stats ms = mstats(rt, id);
  assert_int_equal(ms.sequences, 0);
  assert_int_equal(ms.state_bytes, 0);
  assert_int_equal(ms.sequences_started, 2);
  assert_int_equal(ms.sequences_ended, 2);
  assert_int_equal(reserved(rt), 0);
  assert_int_equal(es_runtime_destroy(rt), 0);
}

/* Many sequences interleaved from several threads, each checked against
 * its own whole run. */
typedef struct seq_job {
  es_runtime *rt;
  int id;
  uint64_t first;
  int n;
  const float *whole_h; /* per sequence: hn of the whole run (all the same x) */
  int bad;
} seq_job;

static void *seq_thread(void *arg) {
  seq_job *j = arg;
  for (int c = 0; c < CHUNKS; c++)
    for (int s = 0; s < j->n; s++) {
      es_tensor in[3];
      lstm_inputs(in, c * CHUNK, CHUNK, NULL, NULL);
      unsigned flags = (c == 0 ? ES_SEQ_START : 0) | (c == CHUNKS - 1 ? ES_SEQ_END : 0);
      es_request *q;
      if (submit(j->rt, j->id, in, 3, j->first + (uint64_t)s, flags, &q) != 0 ||
          es_request_wait(q, -1) != 0) {
        j->bad++;
        continue;
      }
      if (c == CHUNKS - 1) {
        es_tensor hn;
        if (es_request_output(q, 1, &hn) != 0)
          j->bad++;
        else
          for (int i = 0; i < H; i++)
            if (fabsf(((const float *)hn.data)[i] - j->whole_h[i]) > 1e-5f)
              j->bad++;
      }
      es_request_free(q);
    }
  return NULL;
}

static void test_interleaved_sequences(void **state) {
  (void)state;
  es_runtime *rt = rt_new((size_t)64 << 20, 100);
  int id = load_lstm(rt, 64);
  es_request *whole = whole_run(rt, id, 2);
  es_tensor wh;
  out_of(whole, 1, &wh);
  enum { THREADS = 4 };
  pthread_t th[THREADS];
  seq_job jobs[THREADS];
  for (int t = 0; t < THREADS; t++) {
    jobs[t] = (seq_job){rt, id, 1000 + 100 * (uint64_t)t, 8, wh.data, 0};
    assert_int_equal(pthread_create(&th[t], NULL, seq_thread, &jobs[t]), 0);
  }
  for (int t = 0; t < THREADS; t++) {
    pthread_join(th[t], NULL);
    assert_int_equal(jobs[t].bad, 0);
  }
  es_request_free(whole);
  es_runtime_model_stats ms = mstats(rt, id);
  assert_int_equal(ms.sequences, 0);
  assert_int_equal(ms.sequences_started, THREADS * 8);
  assert_int_equal(ms.sequences_ended, THREADS * 8);
  assert_int_equal(reserved(rt), 0);
  assert_int_equal(es_runtime_destroy(rt), 0);
}

static int load_grow(es_runtime *rt, int reserve, size_t max_bytes, int idle_ms) {
  static const es_state_pair st[1] = {{"past", "present"}};
  es_model_config mc;
  es_model_config_default(&mc);
  mc.name = "grow";
  mc.path = grow_path;
  mc.states = st;
  mc.n_states = 1;
  mc.max_sequences = 2;
  mc.state_reserve = reserve;
  mc.state_max_bytes = max_bytes;
  mc.sequence_idle_ms = idle_ms;
  mc.plans = 64;
  int id;
  assert_int_equal(es_runtime_model_load(rt, &mc, &id), 0);
  return id;
}

static float steps[64][STEP];

static void grow_inputs(es_tensor *in, int k, const float *past0) {
  for (int i = 0; i < STEP; i++)
    steps[k][i] = (float)(k * STEP + i);
  in[0] = ob_tensor_f32("past", 3, (int64_t[]){1, 1, STEP}, past0);
  if (!past0)
    in[0].nbytes = 0;
  in[1] = ob_tensor_f32("x", 3, (int64_t[]){1, 1, STEP}, steps[k]);
}

/* Requests submitted all at once, while the workers are paused, still run
 * one at a time in submission order: the state is the steps in order. The
 * state's reservation grows by each step's bytes. */
static void test_order_and_growth(void **state) {
  (void)state;
  es_runtime *rt = rt_new((size_t)64 << 20, 100);
  int id = load_grow(rt, ES_STATE_RESERVE_STEP, 0, 0);
  enum { N = 12 };
  es_request *r[N];
  es_tensor in[N][2];
  float past0[STEP] = {-1, -2, -3, -4};
  es_runtime_pause(rt, 1);
  for (int k = 0; k < N; k++) {
    grow_inputs(in[k], k, k == 0 ? past0 : NULL);
    assert_int_equal(submit(rt, id, in[k], 2, 7, k == 0 ? ES_SEQ_START : 0, &r[k]), 0);
  }
  es_runtime_pause(rt, 0);
  for (int k = 0; k < N; k++) {
    assert_int_equal(es_request_wait(r[k], -1), 0);
    es_tensor p;
    out_of(r[k], 0, &p);
    assert_int_equal(p.dims[1], k + 2); /* the first state and k + 1 steps */
    const float *d = p.data;
    for (int i = 0; i < STEP; i++)
      assert_true(d[i] == past0[i]);
    for (int s = 0; s <= k; s++)
      for (int i = 0; i < STEP; i++)
        assert_true(d[(s + 1) * STEP + i] == (float)(s * STEP + i));
  }
  /* reserved: the largest state, (N + 1) steps of floats, 64-byte aligned */
  es_runtime_model_stats ms = mstats(rt, id);
  size_t want = ((size_t)(N + 1) * STEP * sizeof(float) + 63) / 64 * 64;
  assert_int_equal(ms.state_bytes, want);
  for (int k = 0; k < N; k++)
    es_request_free(r[k]);
  assert_int_equal(reserved(rt), want);
  /* a start without its state starts from an empty past (the free
   * dimension at 0): the first state is the first step */
  es_tensor bad[2];
  grow_inputs(bad, 5, NULL);
  es_request *q;
  assert_int_equal(submit(rt, id, bad, 2, 8, ES_SEQ_START | ES_SEQ_END, &q), 0);
  assert_int_equal(es_request_wait(q, -1), 0);
  es_tensor p;
  out_of(q, 0, &p);
  assert_int_equal(p.dims[1], 1);
  assert_true(((const float *)p.data)[0] == (float)(5 * STEP));
  es_request_free(q);
  /* the state input given after the start: refused */
  grow_inputs(bad, 0, past0);
  assert_int_equal(submit(rt, id, bad, 2, 7, 0, &q), ES_EINVAL);
  /* a sequence that was never started */
  grow_inputs(bad, 0, NULL);
  assert_int_equal(submit(rt, id, bad, 2, 99, 0, &q), ES_ENOENT);
  /* unload frees the live sequence's state */
  assert_int_equal(es_runtime_model_unload(rt, id, -1), 0);
  assert_int_equal(reserved(rt), 0);
  assert_int_equal(es_runtime_destroy(rt), 0);
}

/* Up front: the start reserves state_max_bytes, and a step past it fails
 * with ES_ENOSPC, the state as it was. A budget that cannot hold a new
 * sequence's state refuses its start (OVER_MEMORY); more sequences than
 * max_sequences are refused (OVER_CONCURRENCY); an idle one is evicted. */
static void test_reserve_max_limits_and_idle(void **state) {
  (void)state;
  size_t max = 4 * STEP * sizeof(float); /* room for 4 steps */
  es_runtime *rt = rt_new((size_t)1 << 20, 10);
  int id = load_grow(rt, ES_STATE_RESERVE_MAX, max, 400);
  float past0[STEP] = {0};
  es_tensor in[2];
  es_request *r;
  grow_inputs(in, 0, past0);
  assert_int_equal(submit(rt, id, in, 2, 1, ES_SEQ_START, &r), 0);
  assert_int_equal(es_request_wait(r, -1), 0);
  es_request_free(r);
  assert_int_equal(mstats(rt, id).state_bytes, max);
  for (int k = 1; k < 3; k++) { /* states of 3 and 4 steps fit */
    grow_inputs(in, k, NULL);
    assert_int_equal(submit(rt, id, in, 2, 1, 0, &r), 0);
    assert_int_equal(es_request_wait(r, -1), 0);
    es_request_free(r);
  }
  grow_inputs(in, 3, NULL);
  assert_int_equal(submit(rt, id, in, 2, 1, 0, &r), ES_ENOSPC);
  assert_int_equal(mstats(rt, id).state_bytes, max);
  /* a second sequence fits, a third is one too many */
  grow_inputs(in, 0, past0);
  assert_int_equal(submit(rt, id, in, 2, 2, ES_SEQ_START, &r), 0);
  assert_int_equal(es_request_wait(r, -1), 0);
  es_request_free(r);
  es_refusal why;
  es_submit s = {.model = id, .inputs = in, .n_inputs = 2, .sequence = 3,
                 .sequence_flags = ES_SEQ_START};
  assert_int_equal(es_runtime_submit(rt, &s, &r, &why), ES_EAGAIN);
  assert_int_equal(why.reason, ES_REFUSE_OVER_CONCURRENCY);
  assert_true(why.retry_after_ms > 0);
  /* idle past 400 ms: both are evicted, their memory back */
  for (int i = 0; i < 250 && mstats(rt, id).sequences; i++)
    usleep(20000);
  es_runtime_model_stats ms = mstats(rt, id);
  assert_int_equal(ms.sequences, 0);
  assert_int_equal(ms.sequences_evicted, 2);
  assert_int_equal(reserved(rt), 0);
  grow_inputs(in, 1, NULL);
  assert_int_equal(submit(rt, id, in, 2, 1, 0, &r), ES_ENOENT);
  assert_int_equal(es_runtime_model_unload(rt, id, -1), 0);

  /* a budget smaller than the state up front: the start is refused */
  id = load_grow(rt, ES_STATE_RESERVE_MAX, (size_t)2 << 20, 0);
  grow_inputs(in, 0, past0);
  s.model = id;
  s.sequence = 5;
  assert_int_equal(es_runtime_submit(rt, &s, &r, &why), ES_ENOSPC);
  assert_int_equal(mstats(rt, id).sequences, 0);
  assert_int_equal(reserved(rt), 0);
  assert_int_equal(es_runtime_destroy(rt), 0);
}

/* A model without states takes no sequences; a waiting request can be
 * cancelled, and the sequence goes on without it. */
static void test_misuse_and_cancel(void **state) {
  (void)state;
  es_runtime *rt = rt_new((size_t)64 << 20, 100);
  es_model_config mc;
  es_model_config_default(&mc);
  mc.name = "plain";
  mc.path = grow_path;
  int plain;
  assert_int_equal(es_runtime_model_load(rt, &mc, &plain), 0);
  float past0[STEP] = {0};
  es_tensor in[3][2];
  es_request *r[3];
  grow_inputs(in[0], 0, past0);
  assert_int_equal(submit(rt, plain, in[0], 2, 1, ES_SEQ_START, &r[0]), ES_EINVAL);
  int id = load_grow(rt, ES_STATE_RESERVE_STEP, 0, 0);
  es_runtime_pause(rt, 1);
  assert_int_equal(submit(rt, id, in[0], 2, 1, ES_SEQ_START, &r[0]), 0);
  grow_inputs(in[1], 1, NULL);
  assert_int_equal(submit(rt, id, in[1], 2, 1, 0, &r[1]), 0);
  grow_inputs(in[2], 2, NULL);
  assert_int_equal(submit(rt, id, in[2], 2, 1, ES_SEQ_END, &r[2]), 0);
  assert_int_equal(es_request_cancel(r[1]), 0);
  es_runtime_pause(rt, 0);
  assert_int_equal(es_request_wait(r[0], -1), 0);
  assert_int_equal(es_request_wait(r[1], -1), ES_ECANCELED);
  assert_int_equal(es_request_wait(r[2], -1), 0);
  es_tensor p;
  out_of(r[2], 0, &p);
  assert_int_equal(p.dims[1], 3); /* the first state, step 0, step 2 */
  assert_true(((const float *)p.data)[2 * STEP] == (float)(2 * STEP));
  for (int k = 0; k < 3; k++)
    es_request_free(r[k]);
  assert_int_equal(mstats(rt, id).sequences, 0);
  assert_int_equal(reserved(rt), 0);
  assert_int_equal(es_runtime_destroy(rt), 0);
}

/* String ids: compared whole, a namespace apart from numbers ("1" is not
 * 1); an empty or too long one, or both kinds at once, is refused. */
static void test_string_ids(void **state) {
  (void)state;
  es_runtime *rt = rt_new((size_t)64 << 20, 100);
  int id = load_grow(rt, ES_STATE_RESERVE_STEP, 0, 0);
  const char *keys[2] = {"cam-1", "1"}; /* the model's most: 2 live */
  float past0[2][STEP] = {{1, 1, 1, 1}, {2, 2, 2, 2}};
  es_tensor in[2];
  es_request *r;
  es_refusal why;
  for (int k = 0; k < 2; k++) {
    grow_inputs(in, k, past0[k]);
    es_submit s = {.model = id, .inputs = in, .n_inputs = 2, .sequence_key = keys[k],
                   .sequence_flags = ES_SEQ_START};
    assert_int_equal(es_runtime_submit(rt, &s, &r, &why), 0);
    assert_int_equal(es_request_wait(r, -1), 0);
    es_request_free(r);
  }
  grow_inputs(in, 3, NULL);
  assert_int_equal(submit(rt, id, in, 2, 1, 0, &r), ES_ENOENT); /* 1 is not "1" */
  for (int k = 0; k < 2; k++) { /* each continues from its own state */
    grow_inputs(in, 4, NULL);
    es_submit s = {.model = id, .inputs = in, .n_inputs = 2, .sequence_key = keys[k],
                   .sequence_flags = ES_SEQ_END};
    assert_int_equal(es_runtime_submit(rt, &s, &r, &why), 0);
    assert_int_equal(es_request_wait(r, -1), 0);
    es_tensor p;
    out_of(r, 0, &p);
    assert_int_equal(p.dims[1], 3);
    assert_true(((const float *)p.data)[0] == past0[k][0]);
    es_request_free(r);
  }
  assert_int_equal(mstats(rt, id).sequences, 0);
  char longkey[ES_SEQ_KEY_MAX + 1];
  memset(longkey, 'k', ES_SEQ_KEY_MAX);
  longkey[ES_SEQ_KEY_MAX] = 0;
  const char *bad[2] = {"", longkey};
  grow_inputs(in, 0, past0[0]);
  for (int k = 0; k < 2; k++) {
    es_submit s = {.model = id, .inputs = in, .n_inputs = 2, .sequence_key = bad[k],
                   .sequence_flags = ES_SEQ_START};
    assert_int_equal(es_runtime_submit(rt, &s, &r, &why), ES_EINVAL);
  }
  es_submit both = {.model = id, .inputs = in, .n_inputs = 2, .sequence = 5,
                    .sequence_key = "five", .sequence_flags = ES_SEQ_START};
  assert_int_equal(es_runtime_submit(rt, &both, &r, &why), ES_EINVAL);
  assert_int_equal(reserved(rt), 0);
  assert_int_equal(es_runtime_destroy(rt), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lstm_chunks_equal_whole),
      cmocka_unit_test(test_interleaved_sequences),
      cmocka_unit_test(test_order_and_growth),
      cmocka_unit_test(test_reserve_max_limits_and_idle),
      cmocka_unit_test(test_misuse_and_cancel),
      cmocka_unit_test(test_string_ids),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
