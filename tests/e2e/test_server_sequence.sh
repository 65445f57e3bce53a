#!/usr/bin/env bash
# Sequences over KServe v2, end to end: `edgeserve serve` on a repository
# holding a stateful LSTM (tests/e2e/seq_model.c) configured with its state
# pairs (h0 -> hn, c0 -> cn), at most 12 live sequences, idle timeout 10 s
# (long enough for 13 client runs to start sequences under a sanitizer on a
# busy machine before the first expires).
#   1. 12 sequences streamed in 5 chunks each, all at once, give what one
#      whole-sequence run of each gives (max diff 1e-5), every request 200;
#   2. then: no sequence live, 12 started and 12 ended in /metrics, state
#      bytes 0;
#   3. misuse gets a clear 400: a sequence never started, one already
#      ended, sequence_start without sequence_id, a state input sent after
#      the start, an empty string id; a string id streams as a numeric one;
#   4. 12 sequences started and left open, the 13th start is refused with
#      429 and Retry-After; /metrics shows 12 live and their exact state
#      bytes (2 states x 64 bytes each); after the idle timeout they are
#      evicted (12 evictions, 0 live, 0 state bytes) and continuing one is
#      a 400;
#   5. the server's stderr has no sanitizer report and it exits 0 on
#      SIGTERM.
# Prints "ok - ..." / "not ok - ..." lines; exits 1 if any failed, 77 when
# node or curl is missing.
#   test_server_sequence.sh EDGESERVE_BINARY ES_SEQ_MODEL_BINARY SOURCE_DIR
set -uo pipefail
es=$1
mk=$2
src=$3
client="$src/tests/e2e/seq_client.js"
. "$src/tests/e2e/serve_lib.sh"
serve_begin test_server_sequence

mkdir -p "$work/repo/lstm"
"$mk" "$work/repo/lstm/model.onnx" || { echo "not ok - es_seq_model wrote the model"; exit 1; }
cat >"$work/repo/lstm/config.json" <<'EOF'
{"sequence": {"states": {"h0": "hn", "c0": "cn"}, "max_sequences": 12,
              "idle_timeout_ms": 10000}}
EOF
"$es" serve --model-repository "$work/repo" --port 0 --workers 2 --memory 256M \
  >"$work/out" 2>"$work/err" &
pid=$!
await_server lstm "$pid" "$work/err" || exit 1

metric() { # NAME: the lstm model's value of a metric family
  curl -s "$url/metrics" | sed -n "s/^$1{model=\"lstm\"} //p"
}
infer() { node "$client" infer "$url" lstm "$@"; }
field() { node -e 'const j = JSON.parse(process.argv[1]); console.log(eval(process.argv[2]))' "$1" "$2"; }

# 1. streamed = whole
res=$(node "$client" stream "$url" lstm --sequences 12 --chunks 5 --chunk 4 --first 100)
echo "# $res"
check "12 interleaved sequences in 5 chunks equal their whole runs" \
  test "$(field "$res" j.ok)" = true

# 2. all ended
check "no sequence live after they ended" test "$(metric edgeserve_sequences_live)" = 0
check "12 sequences started" test "$(metric edgeserve_sequences_started_total)" = 12
check "12 sequences ended" test "$(metric edgeserve_sequences_ended_total)" = 12
check "no state bytes held" test "$(metric edgeserve_sequence_state_bytes)" = 0

# 3. misuse: a clear 400 each
r=$(infer 4 1 --sequence 555)
check "a sequence never started: 400 ($(field "$r" j.error))" \
  test "$(field "$r" j.status)" = 400
r=$(infer 4 1 --sequence 100)
check "a sequence that ended: 400" test "$(field "$r" j.status)" = 400
r=$(curl -s -w '\n%{http_code}' -H 'Content-Type: application/json' -d \
  '{"inputs":[{"name":"x","shape":[1,1,8],"datatype":"FP32","data":[0,0,0,0,0,0,0,0]}],"parameters":{"sequence_start":true}}' \
  "$url/v2/models/lstm/infer")
check "sequence_start without sequence_id: 400 ($(head -1 <<<"$r"))" test "$(tail -1 <<<"$r")" = 400
r=$(curl -s -w '\n%{http_code}' -H 'Content-Type: application/json' -d \
  '{"inputs":[{"name":"x","shape":[1,1,8],"datatype":"FP32","data":[0,0,0,0,0,0,0,0]}],"parameters":{"sequence_id":"","sequence_start":true}}' \
  "$url/v2/models/lstm/infer")
check "an empty string sequence_id: 400" test "$(tail -1 <<<"$r")" = 400
# string ids: a namespace of their own ("7" is not 7), the same steps as a
# numeric id give the same outputs
a1=$(infer 4 3 --sequence 17 --start) a2=$(infer 4 4 --sequence 17 --end)
b1=$(infer 4 3 --sequence cam-7 --start) b2=$(infer 4 4 --sequence cam-7 --end)
check "a string sequence_id streams as a numeric one (${b2:0:90})" \
  test "$(field "$a2" 'JSON.stringify(j.y)')" = "$(field "$b2" 'JSON.stringify(j.y)')" \
    -a "$(field "$b1" j.status)" = 200 -a "$(field "$b2" j.status)" = 200
r=$(infer 4 1 --sequence cam-7)
check "a string sequence that ended: 400" test "$(field "$r" j.status)" = 400
infer 4 1 --sequence 7 --start >/dev/null
r=$(infer 4 1 --sequence 7 --with-state)
check "a state input sent after the start: 400 ($(field "$r" j.error))" \
  test "$(field "$r" j.status)" = 400
infer 4 1 --sequence 7 --end >/dev/null

# 4. the limit, exact state bytes, eviction
for s in $(seq 201 212); do infer 4 "$s" --sequence "$s" --start >"$work/start.$s"; done
starts_ok=$(cat "$work"/start.* | grep -c '"status":200')
check "12 sequences started and left open" test "$starts_ok" = 12
r=$(infer 4 1 --sequence 213 --start)
check "the 13th start: 429 with Retry-After ($(field "$r" j.error))" \
  test "$(field "$r" j.status)" = 429 -a "$(field "$r" j.retry_after)" != null
check "12 sequences live" test "$(metric edgeserve_sequences_live)" = 12
check "their state: 12 x 2 x 64 bytes" test "$(metric edgeserve_sequence_state_bytes)" = 1536
for ((i = 0; i < 300; i++)); do
  [ "$(metric edgeserve_sequences_live)" = 0 ] && break
  sleep 0.1
done
check "idle sequences evicted after their timeout" \
  test "$(metric edgeserve_sequence_evictions_total)" = 12 -a "$(metric edgeserve_sequences_live)" = 0
check "their state bytes given back" test "$(metric edgeserve_sequence_state_bytes)" = 0
r=$(infer 4 1 --sequence 201)
check "an evicted sequence: 400" test "$(field "$r" j.status)" = 400

# 5. clean stop
kill -TERM "$pid"
wait "$pid"
rc=$?
pid=
check "SIGTERM: exit 0" test "$rc" = 0
if grep -qE "ERROR: (Address|Leak|Undefined|Thread)Sanitizer|runtime error:" "$work/err"; then
  notok "no sanitizer report"
  sed 's/^/#   /' "$work/err" | head -40
else
  ok "no sanitizer report"
fi
[ "$n_fail" -eq 0 ] || exit 1
exit 0
