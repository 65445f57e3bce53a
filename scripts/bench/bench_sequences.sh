#!/usr/bin/env bash
# Reserving a sequence's state up front against step by step, at the same
# memory. `edgeserve serve` serves a decoder step whose KV cache is the
# sequence's state (es_seq_model --decoder 8192: 64 KiB a step, 1 MiB after
# 16 steps) with --memory 24M and the states capped at 16M: room for 16
# sequences at full length. For each offered load (streams of 16-step
# sequences, 1x to 3x that capacity; a quarter of the sequences left for the
# 2 s idle timeout; a step refused 5 times in a row given up) and each mode,
# A/B interleaved, one server runs for S seconds and the table prints:
# sequences admitted (starts that ran), completed, given up after refusals,
# refusals (429/503, all with Retry-After), steps answered per second, and
# the most state bytes held (the server's metric, sampled every 0.25 s).
#   "max"  reserves max_state_bytes (1M) at each start: fewer sequences at
#          once, and every admitted one can grow to its end;
#   "step" reserves what the state holds, growing it step by step: more
#          sequences at once, and growth refused once the states fill the
#          cap, which at a load above capacity leaves sequences stalled
#          half way until clients give up and the idle timeout frees them.
#   scripts/bench/bench_sequences.sh [--loads "16 32 48"] [--seconds S]
# Needs a build with tests (es_seq_model): ES_BUILD_DIR (default
# build-release).
set -euo pipefail
cd "$(dirname "$0")/../.."
loads="16 32 48" seconds=8
while [ $# -gt 0 ]; do
  case $1 in
    --loads) loads=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    *) echo "usage: $0 [--loads \"16 32 48\"] [--seconds S]" >&2; exit 2 ;;
  esac
done
dir=${ES_BUILD_DIR:-build-release}
[ -f "$dir/CMakeCache.txt" ] || cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=ON >/dev/null
cmake --build "$dir" -j"$(nproc)" --target edgeserve_cli es_seq_model >/dev/null
es=$dir/edgeserve
work=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill -KILL $pid 2>/dev/null; rm -rf "$work"' EXIT
mkdir -p "$work/repo/dec"
"$dir/tests/es_seq_model" --decoder 8192 "$work/repo/dec/model.onnx"
field() { node -e 'const j = JSON.parse(process.argv[1]); console.log(eval(process.argv[2]))' "$1" "$2"; }

run() { # MODE STREAMS
  cat >"$work/repo/dec/config.json" <<EOF
{"plans": 64, "sequence": {"states": {"past_k": "present_k", "past_v": "present_v"},
  "max_sequences": 256, "idle_timeout_ms": 2000, "reserve": "$1",
  "max_state_bytes": "1M", "state_budget_bytes": "16M"}}
EOF
  "$es" serve --model-repository "$work/repo" --port 0 --workers 2 --memory 24M --quiet \
    2>"$work/err" &
  pid=$!
  local port="" i=0
  while [ -z "$port" ] && [ $((i++)) -lt 300 ]; do
    sleep 0.1
    port=$(sed -n 's#^edgeserve: serving [0-9]* models on http://[0-9.]*:\([0-9]*\)/v2.*#\1#p' "$work/err")
  done
  local url=http://127.0.0.1:$port
  metric() { curl -s "$url/metrics" | sed -n "s/^$1{model=\"dec\"} //p"; }
  (most=0; while :; do
     b=$(metric edgeserve_sequence_state_bytes); [ -n "$b" ] && [ "$b" -gt "$most" ] && most=$b
     echo "$most" >"$work/most"; sleep 0.25; done) &
  local sampler=$!
  local res
  res=$(node tests/e2e/seq_client.js load "$url" dec --streams "$2" --steps 16 \
    --seconds "$seconds" --abandon 0.25)
  kill $sampler; wait $sampler 2>/dev/null || true
  local started
  started=$(metric edgeserve_sequences_started_total)
  kill -TERM $pid; wait $pid || true
  pid=
  printf '%-5s %8s %10s %10s %8s %9s %9s %8s %13s\n' "$1" "$2" "$started" \
    "$(field "$res" j.completed)" "$(field "$res" j.gave_up)" \
    "$(field "$res" '(j.statuses["429"] || 0) + (j.statuses["503"] || 0)')" \
    "$(field "$res" j.no_retry_after)" \
    "$(awk -v s="$(field "$res" j.steps)" -v t="$seconds" 'BEGIN {printf "%.0f", s / t}')" \
    "$(awk -v b="$(cat "$work/most")" 'BEGIN {printf "%.1f MiB", b / 1048576}')"
}

echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); --memory 24M, states capped at 16M (16 sequences of 1 MiB), $seconds s per run"
printf '%-5s %8s %10s %10s %8s %9s %9s %8s %13s\n' mode streams admitted completed "gave up" refusals "no R-A" "steps/s" "most state"
r=0
for n in $loads; do
  if [ $((r++ % 2)) -eq 0 ]; then run max "$n"; run step "$n"; else run step "$n"; run max "$n"; fi
done
echo "(admitted: sequence starts that ran; gave up: sequences a client stopped after a step was refused"
echo " 5 times in a row; refusals: 429/503 answers, \"no R-A\" of them without Retry-After)"
