#!/usr/bin/env bash
# Growing state under a real memory limit: `edgeserve serve` alone in a
# memory cgroup the test makes (tests/e2e/cgroup_lib.sh), serving a decoder
# step whose KV cache is the sequence's state (tests/e2e/seq_model.c
# --decoder 8192: each step adds 64 KiB, 16 steps make 1 MiB), with
# --memory 24M and the model's states capped at 16M ("state_budget_bytes"):
# room for 16 sequences at their full length.
#
# Phase 1 takes the baseline B (the group's peak with the server loaded and
# a few sequences run, no limit); then the limit is B + budget (24M) +
# margin (48M; 32M more under ASan), as in test_server_overload.sh.
# Phase 2, once per reservation mode ("max": 1M reserved at each start;
# "step": reserved as the state grows), offers 3x that capacity: 48
# streams of 16-step sequences for 8 s (20 s under ASan; tests/e2e/seq_client.js load; a
# quarter of the sequences are left without sequence_end, for the idle
# timeout of 2 s; a step refused 5 times in a row is given up) and checks:
#   - every answer is 200, 429 or 503, no transport error, and every 429 or
#     503 carries Retry-After; there are refusals;
#   - "max": sequences complete; "step": what completes or not is printed
#     (at 3x capacity growing states crowd each other out: the comparison
#     is scripts/bench/bench_sequences.sh's);
#   - no OOM kill in the group and its peak stays below the limit;
#   - within the idle timeout after the load stops, no sequence is live and
#     no state byte is held (ended ones freed at once, the others evicted:
#     the eviction counter moved);
#   - SIGTERM: exit 0, no sanitizer report.
# Skipped (77) where no memory cgroup can be made, or node or curl is
# missing.
#   test_server_sequence_memory.sh EDGESERVE_BINARY ES_SEQ_MODEL_BINARY SOURCE_DIR
set -uo pipefail
es=$1
mk=$2
src=$3
client="$src/tests/e2e/seq_client.js"
work=$(mktemp -d)
MiB=$((1 << 20))
budget=$((24 * MiB))
margin=$((48 * MiB))
seconds=8
if grep -qa __asan_init "$es"; then
  margin=$((margin + 32 * MiB))
  seconds=20 # a step takes ~10x longer: sequences need the time to finish
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
  [[ $ASAN_OPTIONS == *quarantine_size_mb* ]] || ASAN_OPTIONS="$ASAN_OPTIONS:quarantine_size_mb=16"
fi
skip() {
  echo "# skipped: $*"
  exit 77
}
n_fail=0
ok() { echo "ok - $*"; }
notok() { echo "not ok - $*"; n_fail=$((n_fail + 1)); }
check() { # DESCRIPTION COMMAND...
  local what=$1
  shift
  if "$@"; then ok "$what"; else notok "$what"; fi
}
for need in node curl; do
  command -v $need >/dev/null || skip "'$need' is missing (scripts/setup/deps.sh installs it)"
done

source "$src/tests/e2e/cgroup_lib.sh"
source "$src/tests/e2e/serve_lib.sh"
cg_begin es_seqmem

mkdir -p "$work/repo/dec"
"$mk" --decoder 8192 "$work/repo/dec/model.onnx" || { echo "not ok - es_seq_model wrote the decoder"; exit 1; }
config() { # MODE
  cat >"$work/repo/dec/config.json" <<EOF
{"plans": 64, "sequence": {"states": {"past_k": "present_k", "past_v": "present_v"},
  "max_sequences": 256, "idle_timeout_ms": 2000, "reserve": "$1",
  "max_state_bytes": "1M", "state_budget_bytes": "16M"}}
EOF
}
start_server() { # NAME
  (echo "$BASHPID" >"$cg/cgroup.procs" &&
    exec "$es" serve --model-repository "$work/repo" --port 0 --workers 2 --memory $budget \
      --quiet) 2>"$work/$1.err" &
  spid=$!
  await_server "$1" "$spid" "$work/$1.err"
}
stop_server() { # NAME
  kill -TERM "$spid"
  wait_exit "$spid" 60
  local rc=$?
  [ $rc != 255 ] && spid=""
  check "server '$1': exit 0 on SIGTERM (status $rc)" test $rc = 0
  if grep -Eq 'AddressSanitizer|LeakSanitizer|runtime error:' "$work/$1.err"; then
    notok "server '$1': sanitizer report:"
    grep -E -A30 'Sanitizer|runtime error:' "$work/$1.err" | head -60 | sed 's/^/#   /'
  fi
}
metric() { curl -s "$url/metrics" | sed -n "s/^$1{model=\"dec\"} //p"; }
field() { node -e 'const j = JSON.parse(process.argv[1]); console.log(eval(process.argv[2]))' "$1" "$2"; }

# ---- phase 1: the baseline ------------------------------------------------------
config max
start_server baseline || exit 1
node "$client" load "$url" dec --streams 4 --steps 16 --seconds 2 >/dev/null
base=$(cat "$cg/$f_peak")
hwm=$(awk '/^VmHWM/ {print $2 * 1024}' "/proc/$spid/status")
stop_server baseline
[ "${hwm:-0}" -gt "$base" ] && base=$hwm
limit=$((base + budget + margin))
echo "# limit = baseline $(mib "$base") + budget $(mib $budget) + margin $(mib $margin) = $(mib $limit)"

# ---- phase 2: 3x capacity, per mode ----------------------------------------------
for mode in max step; do
  config $mode
  reset_peak
  echo "$limit" >"$cg/$f_limit" || { notok "cannot set $f_limit to $limit"; exit 1; }
  oom0=$(oom_kills)
  start_server "$mode" || exit 1
  res=$(node "$client" load "$url" dec --streams 48 --steps 16 --seconds $seconds --abandon 0.25 \
    --first 1000)
  echo "# $mode: $res"
  check "$mode: only 200, 429 and 503, no transport error" \
    test "$(field "$res" 'Object.keys(j.statuses).filter(s => !["200", "429", "503"].includes(s)).length + j.transport')" = 0
  check "$mode: refusals, each with Retry-After" \
    test "$(field "$res" '(j.statuses["429"] || 0) + (j.statuses["503"] || 0) > 0 && j.no_retry_after === 0')" = true
  if [ $mode = max ]; then
    check "max: sequences complete ($(field "$res" j.completed))" \
      test "$(field "$res" 'j.completed > 0')" = true
  fi
  echo "# $mode: $(metric edgeserve_sequences_live) live, $(metric edgeserve_sequence_state_bytes) state bytes when the load stopped"
  for ((i = 0; i < 100; i++)); do
    [ "$(metric edgeserve_sequences_live)" = 0 ] && break
    sleep 0.1
  done
  check "$mode: no sequence live within the idle timeout" test "$(metric edgeserve_sequences_live)" = 0
  check "$mode: no state byte held" test "$(metric edgeserve_sequence_state_bytes)" = 0
  check "$mode: idle sequences evicted ($(metric edgeserve_sequence_evictions_total)), ended ones freed ($(metric edgeserve_sequences_ended_total))" \
    test "$(metric edgeserve_sequence_evictions_total)" -gt 0
  stop_server "$mode"
  oom1=$(oom_kills)
  check "$mode: no OOM kill in the group (oom_kill $oom0 -> $oom1, failcnt $(failcnt))" test "$oom0" = "$oom1"
  peak=$(cat "$cg/$f_peak")
  check "$mode: group peak $(mib "$peak") below the limit $(mib $limit)" test "$peak" -lt "$limit"
done
[ "$n_fail" -eq 0 ] || exit 1
exit 0
