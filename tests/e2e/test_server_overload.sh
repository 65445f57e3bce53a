#!/usr/bin/env bash
# `edgeserve serve` under overload inside a real memory cgroup.
#
# The server runs alone in a child memory cgroup the test makes under its
# own group (v1: the memory controller's mount from /proc/self/mountinfo and
# the "memory:" line of /proc/self/cgroup; else v2 when the group can hand
# the memory controller down). Only the server is in it: a subshell writes
# its own pid to cgroup.procs and then execs the server.
#
# The limit. Phase 1 runs the server in the group without a limit, with the
# same config, warms it up with a few det requests, and takes the group's
# peak (which covers the process's RSS and any page cache charged to it) as
# the baseline B. Phase 2 sets
#     limit = B + budget (64M, --memory) + margin (48M)
# The budget is what admission lets requests reserve (arenas, outputs); the
# margin is for what is outside the budget by design and bounded by the
# config: request bodies being received (max_buffered_bytes 16M, 503 above),
# their parsed copies (at most as much again), response buffers of the
# max_inflight 6 admitted requests (det: 1.6 MB each) and thread stacks.
# A server that keeps its promises stays below that; one whose memory grows
# with the offered load does not. Under ASan 32M more is allowed (shadow
# memory of the budget and margin, and a 16M quarantine set here).
#
# Phase 2 then hammers the server (config "queue_capacity": 4,
# "max_inflight": 6, "max_buffered_bytes": "16M", --memory 64M) with 24
# concurrent loops posting det 640x640 binary requests for 15 s (far more
# than it can serve; tests/e2e/v2_client.js load, with Expect: 100-continue
# as a well-behaved client of large uploads does) and checks:
#   - no crash: /v2/health/live answers, a det request still gets 200, and
#     SIGTERM gives exit 0 with the "stopped:" report; no sanitizer report;
#   - no OOM kill (the group's oom_kill counter unchanged); failcnt printed;
#   - every response is 200, 429 or 503, with no transport errors; some of
#     each (200 and 429/503); every 429/503 has Retry-After;
#   - the group's peak (memory.max_usage_in_bytes / memory.peak) is below
#     the limit;
#   - the server sees the group's limit (its /metrics
#     edgeserve_cgroup_memory_max_bytes).
# Counts, peak and timings are printed. The group is removed at the end
# (after the server exited, with retries). When no group can be made, the
# test prints "# skipped: <why>" and exits 77 (CTest SKIP_RETURN_CODE).
#   test_server_overload.sh EDGESERVE_BINARY SOURCE_DIR
set -uo pipefail
es=$1
src=$2
models=${ES_MODEL_DIR:-$src/.cache/models}
client="$src/tests/e2e/v2_client.js"
work=$(mktemp -d)
MiB=$((1 << 20))
budget=$((64 * MiB))
margin=$((48 * MiB))
concurrency=${ES_OVERLOAD_CONCURRENCY:-24}
seconds=${ES_OVERLOAD_SECONDS:-15}
t_start=$(date +%s)

asan=0
if grep -qa __asan_init "$es"; then
  asan=1
  margin=$((margin + 32 * MiB))
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
  [[ $ASAN_OPTIONS == *quarantine_size_mb* ]] || ASAN_OPTIONS="$ASAN_OPTIONS:quarantine_size_mb=16"
fi

skip() {
  echo "# skipped: $*"
  exit 77
}

n_ok=0
n_fail=0
ok() { echo "ok - $*"; n_ok=$((n_ok + 1)); }
notok() { echo "not ok - $*"; n_fail=$((n_fail + 1)); }
get() { node "$client" get "$@"; }

for need in node curl; do
  command -v $need >/dev/null || skip "'$need' is missing (scripts/setup/deps.sh installs it)"
done
[ -f "$models/ppocr_det.onnx" ] || { echo "test_server_overload: models missing (scripts/setup/fetch-models.sh)"; exit 1; }
models=$(cd "$models" && pwd)
export ES_MODEL_DIR=$models

# ---- the cgroup ------------------------------------------------------------------

source "$(dirname "$0")/cgroup_lib.sh"
cg_begin es_overload

# ---- the server ------------------------------------------------------------------------

cat >"$work/server.json" <<'EOF'
{"queue_capacity": 4, "max_inflight": 6, "max_buffered_bytes": "16M", "quiet": 1}
EOF
# start_server NAME: the server alone in the group; sets spid and url.
source "$(dirname "$0")/serve_lib.sh"
start_server() {
  local name=$1
  (echo "$BASHPID" >"$cg/cgroup.procs" &&
    exec "$es" serve --port 0 --config "$work/server.json" --memory $budget --grace-ms 20000) 2>"$work/$name.err" &
  spid=$!
  await_server "$name" "$spid" "$work/$name.err" || return 1
  grep -qx "$spid" "$cg/cgroup.procs" || notok "server '$name' (pid $spid) is not in $cg: $(cat "$cg/cgroup.procs")"
}
# stop_server NAME: SIGTERM, exit 0, the report, no sanitizer report.
stop_server() {
  local name=$1 t0 rc
  t0=$(date +%s%N)
  kill -TERM "$spid"
  wait_exit "$spid" 60
  rc=$?
  [ $rc != 255 ] && spid=""
  local ms=$((($(date +%s%N) - t0) / 1000000))
  [ $rc = 0 ] && ok "server '$name': exit 0 on SIGTERM ($ms ms)" ||
    notok "server '$name': exit status $rc on SIGTERM after $ms ms (137: killed, 255: still running)"
  grep -q '^edgeserve: stopped: ' "$work/$name.err" &&
    ok "server '$name': $(grep '^edgeserve: stopped: ' "$work/$name.err" | sed 's/^edgeserve: //')" ||
    notok "server '$name': no 'stopped:' report: $(tail -3 "$work/$name.err")"
  if grep -Eq 'AddressSanitizer|LeakSanitizer|runtime error:' "$work/$name.err"; then
    notok "server '$name': sanitizer report:"
    grep -E -A30 'Sanitizer|runtime error:' "$work/$name.err" | head -60 | sed 's/^/#   /'
  fi
}

node "$client" gen "$work/det.npy" 1,3,640,640 640 || exit 1
det_hl=$(node "$client" build --input "x=$work/det.npy" --binary --binary-output --body "$work/det.bin") || exit 1
det_one() { # a single det request: its status
  curl -s -m 120 -o "$work/one.body" -w '%{http_code}' -X POST -H 'Content-Type: application/octet-stream' \
    -H "Inference-Header-Content-Length: $det_hl" --data-binary @"$work/det.bin" "$url/v2/models/ppocr_det/infer"
}

# ---- phase 1: the baseline, no limit ----------------------------------------------------------

start_server baseline || exit 1
for i in 1 2 3; do
  st=$(det_one)
  [ "$st" = 200 ] || notok "baseline: det request $i got $st: $(head -c 200 "$work/one.body")"
done
base_peak=$(cat "$cg/$f_peak")
base_usage=$(cat "$cg/$f_usage")
rss=$(awk '/^VmRSS/ {print $2 * 1024}' "/proc/$spid/status")
hwm=$(awk '/^VmHWM/ {print $2 * 1024}' "/proc/$spid/status")
stop_server baseline
baseline=$base_peak
[ "${hwm:-0}" -gt "$baseline" ] && baseline=$hwm
limit=$((baseline + budget + margin))
echo "# baseline after loading and 3 det requests: group peak $(mib "$base_peak"), usage $(mib "$base_usage"), server RSS $(mib "${rss:-0}") (high water $(mib "${hwm:-0}"))"
echo "# limit = baseline $(mib "$baseline") + budget $(mib $budget) + margin $(mib $margin) = $(mib $limit) ($limit B)"

# ---- phase 2: overload under the limit --------------------------------------------------------

reset_peak
echo "$limit" >"$cg/$f_limit" || { notok "cannot set $f_limit to $limit"; exit 1; }
oom_before=$(oom_kills)
start_server overload || exit 1
curl -s "$url/metrics" >"$work/metrics0.txt"
seen=$(awk '$1 == "edgeserve_cgroup_memory_max_bytes" {print $2}' "$work/metrics0.txt")
[ "$seen" = "$limit" ] && ok "the server sees the group's limit ($seen B)" ||
  notok "the server's edgeserve_cgroup_memory_max_bytes is '$seen', the group's limit $limit"
echo "# after start: group usage $(mib "$(cat "$cg/$f_usage")")"

t0=$(date +%s)
node "$client" load "$url" ppocr_det --input "x=$work/det.npy" --binary --binary-output --expect-continue \
  --concurrency "$concurrency" --seconds "$seconds" >"$work/load.json" 2>"$work/load.err"
load_rc=$?
echo "# load: $concurrency loops for ${seconds}s took $(($(date +%s) - t0)) s: $(cat "$work/load.json") $(cat "$work/load.err")"
peak=$(cat "$cg/$f_peak")
oom_after=$(oom_kills)
fails=$(failcnt)

alive=0
st=$(ps -o stat= -p "$spid" 2>/dev/null)
[ -n "$st" ] && [[ $st != Z* ]] && alive=1
if [ $alive = 1 ] && [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/v2/health/live")" = 200 ]; then
  ok "the server survived the overload: /v2/health/live 200"
  st=$(det_one)
  [ "$st" = 200 ] && ok "a det request after the overload: 200" ||
    notok "a det request after the overload: $st $(head -c 200 "$work/one.body")"
  curl -s "$url/metrics" >"$work/metrics1.txt"
  echo "# server refusals for ppocr_det: $(awk '$1 ~ /^edgeserve_refused_total\{model="ppocr_det"/ {sub(/.*reason="/, "", $1); sub(/"}/, "", $1); printf "%s=%s ", $1, $2}' "$work/metrics1.txt")"
  echo "# server: $(awk '$1 == "edgeserve_process_resident_bytes" || $1 == "edgeserve_cgroup_memory_current_bytes" {printf "%s=%.1fMiB ", $1, $2 / 1048576}' "$work/metrics1.txt")"
else
  notok "the server did not survive the overload (state '${st:-gone}'); stderr:"
  tail -20 "$work/overload.err" | sed 's/^/#   /'
fi

[ "$oom_before" = "$oom_after" ] && ok "no OOM kill in the group (oom_kill $oom_after; failcnt $fails)" ||
  notok "OOM kill in the group: oom_kill $oom_before -> $oom_after (failcnt $fails)"
if [ $load_rc != 0 ] || [ "$(get "$work/load.json" 'typeof j.counts')" != object ]; then
  notok "the load client failed (exit $load_rc): $(cat "$work/load.err")"
else
  c200=$(get "$work/load.json" 'j.counts["200"] || 0')
  c429=$(get "$work/load.json" 'j.counts["429"] || 0')
  c503=$(get "$work/load.json" 'j.counts["503"] || 0')
  other=$(get "$work/load.json" 'Object.keys(j.counts).filter(k => !["200", "429", "503"].includes(k)).map(k => k + ":" + j.counts[k]).join(" ")')
  transport=$(get "$work/load.json" 'j.transport_errors')
  nora=$(get "$work/load.json" 'j.no_retry_after')
  echo "# responses: 200: $c200, 429: $c429, 503: $c503${other:+, other: $other}; transport errors: $transport; p50 $(get "$work/load.json" 'j.p50_ms') ms, p99 $(get "$work/load.json" 'j.p99_ms') ms for the 200s"
  echo "# refusals: $(get "$work/load.json" 'j.refusals')"
  [ -z "$other" ] && [ "$transport" = 0 ] && ok "every response 200, 429 or 503, no transport errors" ||
    notok "responses other than 200/429/503: '${other}', transport errors: $transport ($(get "$work/load.json" 'j.first_error'))"
  [ "$c200" -gt 0 ] && ok "some requests served ($c200)" || notok "no request got 200"
  [ $((c429 + c503)) -gt 0 ] && ok "some requests refused (429: $c429, 503: $c503)" || notok "no request was refused: not an overload"
  [ "$nora" = 0 ] && ok "every 429/503 has Retry-After" || notok "$nora refusals without Retry-After"
fi
echo "# group peak $(mib "$peak") ($peak B), limit $(mib $limit), baseline $(mib "$baseline"); failcnt $fails"
[ "$peak" -lt "$limit" ] && ok "group peak $(mib "$peak") below the limit $(mib $limit) (headroom $(mib $((limit - peak))))" ||
  notok "group peak $(mib "$peak") reached the limit $(mib $limit): the server's memory grew past budget + margin ($(mib $((peak - baseline))) over the baseline)"

if [ -n "$spid" ] && [ $alive = 1 ]; then
  stop_server overload
elif [ -n "$spid" ]; then
  wait "$spid" 2>/dev/null
  echo "# server exit status $?"
  spid=""
fi

echo "# $n_ok passed, $n_fail failed in $(($(date +%s) - t_start)) s"
[ $n_fail -eq 0 ]
