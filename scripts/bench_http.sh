#!/usr/bin/env bash
# HTTP overhead of `edgeserve serve`: the same model, the same input, the same
# number of closed-loop streams, once over HTTP (wrk, KServe v2 binary tensor
# extension both ways) and once in-process (`edgeserve bench --concurrency N`,
# the same runtime without the HTTP layer), A/B interleaved over R rounds.
#   scripts/bench_http.sh [--model det|rec|front|back|cls] [--connections "N ..."]
#                         [--duration S] [--rounds R] [--wrk-threads T]
# Defaults: det (1x3x640x640), connections "CORES 2xCORES" (the server runs
# one worker per core), 10 s, 3 rounds, wrk -t2 (capped at N).
# Prints per round and the median: HTTP rps/p50/p99 next to in-process
# rps/p50/p99, overhead = 1 - http_rps / inproc_rps, the p50 difference,
# non-2xx responses, and the CPU each side used (wrk, the server, the
# in-process bench, in cores); then where the HTTP time goes (wrk's mean
# latency minus the server's queue + compute means from /metrics) and the
# server's peak RSS (VmHWM).
# The server stays up during the in-process runs but idle (no connections):
# its CPU time over each in-process run is measured and shown (srv idle).
# ES_BIN overrides the binary (default build-release/edgeserve).
set -euo pipefail
cd "$(dirname "$0")/.."
cores=$(nproc)
model=det conns="$cores $((2 * cores))" duration=10 rounds=3 wrk_threads=2 settle=30
usage() {
  echo "usage: $0 [--model det|rec|front|back|cls] [--connections \"N ...\"] [--duration S]" \
       "[--rounds R] [--wrk-threads T] [--settle S]" >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case $1 in
    --model) model=$2; shift 2 ;;
    --connections) conns=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --wrk-threads) wrk_threads=$2; shift 2 ;;
    --settle) settle=$2; shift 2 ;;
    *) usage ;;
  esac
done
m=.cache/models
# short name -> served model name, model file, input file (from make_inputs.js)
case $model in
  det) name=ppocr_det file=$m/ppocr_det.onnx npy=ppocr_det_640.npy ;;
  rec) name=ppocr_rec file=$m/ppocr_rec.onnx npy=ppocr_rec_w320.npy ;;
  cls) name=ppocr_cls file=$m/ppocr_cls.onnx npy=ppocr_cls.npy ;;
  front) name=blazeface_front file=$m/blazeface_front_128.onnx npy=blazeface_front_128.npy ;;
  back) name=blazeface_back file=$m/blazeface_back_256.onnx npy=blazeface_back_256.npy ;;
  *) usage ;;
esac
command -v wrk >/dev/null || { echo "bench_http: wrk is needed (scripts/deps.sh)" >&2; exit 1; }
command -v curl >/dev/null || { echo "bench_http: curl is needed (scripts/deps.sh)" >&2; exit 1; }

es=${ES_BIN:-build-release/edgeserve}
if [ ! -x "$es" ] || ! "$es" bench --help 2>&1 | grep -q -- --concurrency; then
  scripts/build.sh build-release -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF >/dev/null
  es=build-release/edgeserve
fi
scripts/fetch-models.sh >/dev/null
work=$(mktemp -d)
srv_pid=""
cleanup() {
  if [ -n "$srv_pid" ] && kill -0 "$srv_pid" 2>/dev/null; then
    kill "$srv_pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$srv_pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$srv_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
node scripts/ort/make_inputs.js "$work" >/dev/null

# ---- the server ---------------------------------------------------------------
"$es" serve --quiet --port 0 >"$work/serve.log" 2>&1 &
srv_pid=$!
port=""
for _ in $(seq 300); do
  kill -0 "$srv_pid" 2>/dev/null || { cat "$work/serve.log" >&2; echo "bench_http: the server exited" >&2; exit 1; }
  port=$(sed -nE 's|.*serving .* on http://[^:]+:([0-9]+)/v2.*|\1|p' "$work/serve.log")
  [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/v2/health/ready" >/dev/null && break
  port=""
  sleep 0.1
done
[ -n "$port" ] || { cat "$work/serve.log" >&2; echo "bench_http: the server did not get ready" >&2; exit 1; }
base=http://127.0.0.1:$port/v2
workers=$(sed -nE 's/.*\(([0-9]+) workers.*/\1/p' "$work/serve.log")
# The model's input name, from its metadata.
in_name=$(curl -sf "$base/models/$name" | node -e '
  const m = JSON.parse(require("fs").readFileSync(0, "utf8"));
  if (m.inputs.length !== 1) { console.error("bench_http: one input expected"); process.exit(1); }
  console.log(m.inputs[0].name);')
body_info=$(node scripts/ort/make_v2_body.js "$work/body.bin" "$in_name=$work/$npy")
url=$base/models/$name/infer

tck=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# All CPUs' busy ticks (user nice system irq softirq steal): what else runs
# on the machine during a run is this minus what our processes used.
sys_ticks() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat; }
# Cores used: ticks over the wall time between two `now`s.
cores_used() { awk -v d="$1" -v tk="$tck" -v a="$2" -v b="$3" 'BEGIN { printf "%.3f", d / tk / (b - a) }'; }
# Children's CPU seconds from the second line of `times`.
child_secs() {
  local l
  l=$(sed -n 2p "$1")
  awk -v u="$(secs "${l%% *}")" -v s="$(secs "${l##* }")" 'BEGIN { print u + s }'
}
now() { date +%s.%N; }
# Sum and count of a per-model histogram in /metrics.
metric() { curl -sf "http://127.0.0.1:$port/metrics" |
  awk -v k="$1{model=\"$name\"}" '$1 == k {print $2}'; }
json_field() {
  local v
  v=$(sed -nE "s/.*\"$2\": ?(-?[0-9.]+(e[+-]?[0-9]+)?)[,}].*/\1/p" <<<"$1")
  echo "${v:-nan}"
}
kv() { sed -nE "s/.* $2=([^ ]+).*/\1/p" <<<" $1"; }
secs() { awk '{ n = split($0, a, "m"); sub("s", "", a[2]); print a[1] * 60 + a[2] }' <<<"$1"; }

# Before each run, wait (up to --settle seconds) for the rest of the machine
# to be quiet: under 0.25 cores busy over one second (our server idles at ~0).
settle_wait() {
  local t0 y0 y1 t1 busy
  local until=$(( $(date +%s) + settle ))
  while :; do
    y0=$(sys_ticks); t0=$(now); sleep 1; y1=$(sys_ticks); t1=$(now)
    busy=$(cores_used "$((y1 - y0))" "$t0" "$t1")
    awk -v b="$busy" 'BEGIN { exit !(b < 0.25) }' && return 0
    [ "$(date +%s)" -ge "$until" ] && { settled_all=0; return 0; }
  done
}
settled_all=1

# (a) over HTTP. Appends one line: wrk's fields + wrk/server CPU and the
# server-side queue/compute means over the run.
run_http() {
  local n=$1 t=$wrk_threads
  [ "$t" -gt "$n" ] && t=$n
  local qs0 qn0 cs0 cn0 s0 t0 t1 s1
  qs0=$(metric edgeserve_queue_duration_seconds_sum); qn0=$(metric edgeserve_queue_duration_seconds_count)
  cs0=$(metric edgeserve_compute_duration_seconds_sum); cn0=$(metric edgeserve_compute_duration_seconds_count)
  local y0 y1
  s0=$(cpu_ticks "$srv_pid"); y0=$(sys_ticks); t0=$(now)
  ( ES_WRK_BODY=$work/body.bin wrk -t"$t" -c"$n" -d"${duration}s" --timeout 30s --latency \
      -s scripts/wrk/v2_infer.lua "$url" >"$work/wrk.out" 2>&1 || true
    times >"$work/wrk.times" )
  t1=$(now); s1=$(cpu_ticks "$srv_pid"); y1=$(sys_ticks)
  local line
  line=$(grep '^ES_WRK ' "$work/wrk.out") || { cat "$work/wrk.out" >&2; echo "bench_http: wrk failed" >&2; exit 1; }
  local wcpu scpu other
  wcpu=$(awk -v c="$(child_secs "$work/wrk.times")" -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", c / (b - a) }')
  scpu=$(cores_used "$((s1 - s0))" "$t0" "$t1")
  other=$(awk -v all="$(cores_used "$((y1 - y0))" "$t0" "$t1")" -v w="$wcpu" -v s="$scpu" \
    'BEGIN { v = all - w - s; printf "%.2f", v < 0 ? 0 : v }')
  local qm cm
  qm=$(awk -v a="$qs0" -v b="$(metric edgeserve_queue_duration_seconds_sum)" -v n0="$qn0" \
    -v n1="$(metric edgeserve_queue_duration_seconds_count)" 'BEGIN { printf "%.3f", (n1 > n0 ? 1e3 * (b - a) / (n1 - n0) : 0) }')
  cm=$(awk -v a="$cs0" -v b="$(metric edgeserve_compute_duration_seconds_sum)" -v n0="$cn0" \
    -v n1="$(metric edgeserve_compute_duration_seconds_count)" 'BEGIN { printf "%.3f", (n1 > n0 ? 1e3 * (b - a) / (n1 - n0) : 0) }')
  echo "$line wrk_cpu=$wcpu srv_cpu=$scpu srv_queue_ms=$qm srv_compute_ms=$cm other=$other" >>"$work/http_$n.txt"
}

# (b) in-process, the server idle. Appends the JSON line + the server's CPU
# over the run (cores; ~0 when idle).
run_inproc() {
  local n=$1 s0 t0 t1 s1 y0 y1 j
  s0=$(cpu_ticks "$srv_pid"); y0=$(sys_ticks); t0=$(now)
  ( "$es" bench "$file" --input "$in_name=$work/$npy" --concurrency "$n" --duration "$duration" \
      --json >"$work/bench.out"
    times >"$work/bench.times" )
  t1=$(now); s1=$(cpu_ticks "$srv_pid"); y1=$(sys_ticks)
  j=$(grep '^{' "$work/bench.out") || { cat "$work/bench.out" >&2; echo "bench_http: bench failed" >&2; exit 1; }
  local idle other
  idle=$(cores_used "$((s1 - s0))" "$t0" "$t1")
  other=$(awk -v all="$(cores_used "$((y1 - y0))" "$t0" "$t1")" -v c="$(child_secs "$work/bench.times")" \
    -v i="$idle" -v a="$t0" -v b="$t1" 'BEGIN { v = all - c / (b - a) - i; printf "%.2f", v < 0 ? 0 : v }')
  echo "$j srv_idle=$idle other=$other" >>"$work/inproc_$n.txt"
}

# Warm-up: the server's arenas, page faults, the HTTP threads' first requests.
ES_WRK_BODY=$work/body.bin wrk -t1 -c"$(awk '{print $NF}' <<<"$conns")" -d3s --timeout 30s \
  -s scripts/wrk/v2_infer.lua "$url" >/dev/null 2>&1 || true

for n in $conns; do
  : >"$work/http_$n.txt"; : >"$work/inproc_$n.txt"
  for r in $(seq 1 "$rounds"); do
    if [ $((r % 2)) -eq 1 ]; then
      settle_wait; run_http "$n"; settle_wait; run_inproc "$n"
    else
      settle_wait; run_inproc "$n"; settle_wait; run_http "$n"
    fi
  done
done
hwm=$(awk '/VmHWM/ {print $2}' "/proc/$srv_pid/status")
rss=$(awk '/VmRSS/ {print $2}' "/proc/$srv_pid/status")

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

# One summary line from a rows file: medians of every column.
summary_row() {
  local n=$1 label=$2 f=$3
  col() { awk -v c="$1" '{print $c}' "$f" | median; }
  local hr ir
  hr=$(col 1) ir=$(col 4)
  printf '%3d %6s | %8.2f %7.2f %7.2f | %8.2f %7.2f %7.2f | %5.1f%% %+7.2f %6d | %5.2f %5.2f %5.2f %5.2f | %5.2f %5.2f\n' \
    "$n" "$label" "$hr" "$(col 2)" "$(col 3)" "$ir" "$(col 5)" "$(col 6)" \
    "$(awk -v a="$hr" -v b="$ir" 'BEGIN { print 100 * (1 - a / b) }')" "$(col 8)" \
    "$(awk '{s += $9} END {print s}' "$f")" "$(col 10)" "$(col 11)" "$(col 12)" "$(col 13)" \
    "$(col 18)" "$(col 19)"
}

echo "model $name ($file, input $in_name from $npy; request $body_info bytes, binary output)"
echo "server: $workers workers, port $port; wrk -t$wrk_threads (capped at N), ${duration}s per run," \
     "$rounds interleaved rounds; $cores cores"
printf '%3s %6s | %8s %7s %7s | %8s %7s %7s | %6s %7s %6s | %5s %5s %5s %5s | %5s %5s\n' \
  N round "http rps" "p50 ms" "p99 ms" "inp rps" "p50 ms" "p99 ms" "ovh" "dp50" non2xx \
  "wrk" "srv" "inp" "idle" "oth-h" "oth-i"
for n in $conns; do
  mapfile -t H <"$work/http_$n.txt"
  mapfile -t I <"$work/inproc_$n.txt"
  : >"$work/rows_$n.txt"
  for r in $(seq 0 $((rounds - 1))); do
    h=${H[$r]} i=${I[$r]}
    errs=$(( $(kv "$h" non2xx) + $(kv "$h" connect) + $(kv "$h" read) + $(kv "$h" write) + $(kv "$h" timeout) ))
    row=$(awk -v hr="$(kv "$h" rps)" -v h50="$(kv "$h" p50_ms)" -v h99="$(kv "$h" p99_ms)" \
      -v ir="$(json_field "$i" throughput_rps)" -v i50="$(json_field "$i" p50_ms)" \
      -v i99="$(json_field "$i" p99_ms)" -v e="$errs" -v wc="$(kv "$h" wrk_cpu)" \
      -v sc="$(kv "$h" srv_cpu)" -v ic="$(json_field "$i" cpu_cores)" \
      -v id="$(sed -nE 's/.* srv_idle=([^ ]+).*/\1/p' <<<"$i")" \
      -v hm="$(kv "$h" mean_ms)" -v sq="$(kv "$h" srv_queue_ms)" -v sm="$(kv "$h" srv_compute_ms)" \
      -v oh="$(kv "$h" other)" -v oi="$(sed -nE 's/.* other=([^ ]+).*/\1/p' <<<"$i")" \
      'BEGIN { print hr, h50, h99, ir, i50, i99, 100 * (1 - hr / ir), h50 - i50, e, wc, sc, ic, id,
               hm, sq, sm, hm - sq - sm, oh, oi }')
    echo "$row" >>"$work/rows_$n.txt"
    awk -v n="$n" -v r="$((r + 1))" '{ printf "%3d %6d | %8.2f %7.2f %7.2f | %8.2f %7.2f %7.2f | %5.1f%% %+7.2f %6d | %5.2f %5.2f %5.2f %5.2f | %5.2f %5.2f\n",
      n, r, $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $18, $19 }' <<<"$row"
  done
  summary_row "$n" median "$work/rows_$n.txt"
  awk '$18 < 0.25 && $19 < 0.25' "$work/rows_$n.txt" >"$work/quiet_$n.txt"
  q=$(wc -l <"$work/quiet_$n.txt")
  if [ "$q" -gt 0 ]; then summary_row "$n" "quiet$q" "$work/quiet_$n.txt"; fi
  awk -v n="$n" 'NR == 1 { hr = $1; h50 = $2; h99 = $3; ir = $4; i50 = $5; i99 = $6 }
    { if ($1 > hr) hr = $1; if ($2 < h50) h50 = $2; if ($3 < h99) h99 = $3
      if ($4 > ir) ir = $4; if ($5 < i50) i50 = $5; if ($6 < i99) i99 = $6 }
    END { printf "%3d %6s | %8.2f %7.2f %7.2f | %8.2f %7.2f %7.2f | %5.1f%% %+7.2f\n",
          n, "best", hr, h50, h99, ir, i50, i99, 100 * (1 - hr / ir), h50 - i50 }' "$work/rows_$n.txt"
done
echo "(median: of each column over the rounds, ovh from the median rps; quietK: the same over the K"
echo " rounds where other processes used under 0.25 cores in both runs; best: highest rps and lowest"
echo " latencies of each side over the rounds, the least disturbed estimate on a noisy machine."
echo " ovh = 1 - http rps / in-process rps; dp50 = http p50 - in-process p50 in ms; non2xx ="
echo " status >= 400 plus socket errors and timeouts (summed over rounds on summary rows);"
echo " wrk / srv / inp = CPU cores used by wrk, by the server during the HTTP run and by the"
echo " in-process bench; idle = the server's CPU cores while the in-process bench ran;"
echo " oth-h / oth-i = cores used by other processes on the machine during the HTTP / in-process"
echo " run: a round where they differ much is not a fair comparison)"
[ "$settled_all" -eq 1 ] || echo "note: the machine was busy (other processes over 0.25 cores) before some runs" \
  "even after waiting ${settle}s (--settle): see oth-h / oth-i"
echo
echo "where the HTTP time goes (medians over rounds, ms per request):"
printf '%3s %10s %10s %10s %12s\n' N "wrk mean" "srv queue" "srv compute" "HTTP+client"
for n in $conns; do
  col() { awk -v c="$1" '{print $c}' "$work/rows_$n.txt" | median; }
  printf '%3d %10.2f %10.2f %10.2f %12.2f\n' "$n" "$(col 14)" "$(col 15)" "$(col 16)" "$(col 17)"
done
echo "(srv queue / compute: the server's own histograms over the run (/metrics); HTTP+client = wrk's"
echo " mean latency minus both: receiving and parsing the body, encoding and sending the response,"
echo " the HTTP thread's wake-ups and wrk itself)"
inp_rss=$(for n in $conns; do while read -r l; do json_field "$l" peak_rss_bytes; done <"$work/inproc_$n.txt"; done | sort -g | tail -1)
echo
echo "server memory: VmHWM $((hwm / 1024)) MiB, VmRSS at the end $((rss / 1024)) MiB (all default models"
echo " loaded); in-process bench peak RSS $(awk -v b="$inp_rss" 'BEGIN { printf "%.0f", b / 1048576 }') MiB (this model only)"
