#!/usr/bin/env bash
# HTTP overhead of `edgeserve serve`: the same model, the same input, the same
# number of closed-loop streams, once over HTTP (wrk, KServe v2 binary tensor
# extension both ways) and once in-process (`edgeserve bench --concurrency N`,
# the same runtime without the HTTP layer), A/B interleaved over R rounds.
#   scripts/bench/bench_http.sh [--model det|rec|front|back|cls] [--connections "N ..."]
#                         [--duration S] [--rounds R] [--wrk-threads T] [--settle S]
#                         [--serve-env "K=V ..."] [--serve-args "..."]
# Defaults: det (1x3x640x640), connections "CORES 2xCORES" (the server runs
# one worker per core), 10 s, 3 rounds, wrk -t2 (capped at N). --settle S:
# before each run wait up to S s (default 30) for other processes to go
# quiet. --serve-env: environment for the server only (e.g. OMP_NUM_THREADS=1
# to see how the server does when its models are planned single-threaded, as
# `edgeserve bench` plans them); --serve-args: more `edgeserve serve` options
# (e.g. --config FILE with {"max_header_bytes": "1M"}, which sizes the HTTP
# library's per-connection buffer and so the chunks the body is read in).
# Prints per round, the median (and the median of the rounds the rest of the
# machine left alone, and the best of each side): HTTP rps/p50/p99 next to
# in-process rps/p50/p99, overhead = 1 - http_rps / inproc_rps, the p50
# difference, non-2xx responses (and socket errors), CPU ms per request of
# the server and of the in-process bench (the overhead in CPU, which is what
# caps throughput on saturated cores and which noise moves much less), the
# cores wrk used and the cores other processes used during each run; the rps
# overhead with wrk's cores taken out (wrk shares the server's cores); then
# where an HTTP request's time goes (wrk's mean latency minus the server's
# queue + compute means from /metrics), the body's trip alone (the same POST
# to a route that answers 404 after reading it), the server's CPU by thread,
# and its peak RSS (VmHWM); then the transport's floor: scripts/bench/http_floor.c,
# the cheapest server possible (blocking thread per connection, no HTTP
# library, reads of the same size as the server's), receiving the same body
# and sending an answer of the same size, driven by wrk with N connections
# while an in-process bench keeps the cores busy as the server's workers do.
# Its CPU per request is what loopback TCP costs any server here; the
# server's overhead over the in-process bench is compared with it.
# The server stays up during the in-process runs, idle (no connections); its
# CPU over them is measured and reported (it should be ~0).
# ES_BIN overrides the binary (default build-release/edgeserve).
set -euo pipefail
cd "$(dirname "$0")/../.."
cores=$(nproc)
model=det conns="$cores $((2 * cores))" duration=10 rounds=3 wrk_threads=2 settle=30 serve_env="" serve_args=""
floor_read=24576 # the HTTP library's read size with the default buffers (strace: ~24 KB per recv)
usage() {
  echo "usage: $0 [--model det|rec|front|back|cls] [--connections \"N ...\"] [--duration S]" \
       "[--rounds R] [--wrk-threads T] [--settle S] [--serve-env \"K=V ...\"] [--serve-args \"...\"]" \
       "[--floor-read BYTES]" >&2
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
    --serve-env) serve_env=$2; shift 2 ;;
    --serve-args) serve_args=$2; shift 2 ;;
    --floor-read) floor_read=$2; shift 2 ;;
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
command -v wrk >/dev/null || { echo "bench_http: wrk is needed (scripts/setup/deps.sh)" >&2; exit 1; }
command -v curl >/dev/null || { echo "bench_http: curl is needed (scripts/setup/deps.sh)" >&2; exit 1; }

es=${ES_BIN:-build-release/edgeserve}
if [ ! -x "$es" ] || ! "$es" bench --help 2>&1 | grep -q -- --concurrency; then
  scripts/build.sh build-release -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF >/dev/null
  es=build-release/edgeserve
fi
scripts/setup/fetch-models.sh >/dev/null
work=$(mktemp -d -t es-bench-http.XXXXXX)
srv_pid="" floor_pid=""
cleanup() {
  if [ -n "$floor_pid" ]; then kill "$floor_pid" 2>/dev/null || true; fi
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
# shellcheck disable=SC2086 # K=V words, options
env $serve_env "$es" serve --quiet --port 0 $serve_args >"$work/serve.log" 2>&1 &
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
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
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
      -s scripts/bench/wrk/v2_infer.lua "$url" >"$work/wrk.out" 2>&1 || true
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
  local cpr
  cpr=$(awk -v d="$((s1 - s0))" -v tk="$tck" -v q="$(kv "$line" requests)" \
    'BEGIN { printf "%.3f", (q > 0 ? 1e3 * d / tk / q : 0) }')
  echo "$line wrk_cpu=$wcpu srv_cpu=$scpu srv_cpu_ms_req=$cpr srv_queue_ms=$qm srv_compute_ms=$cm" \
    "other=$other" >>"$work/http_$n.txt"
}

# The in-process bench at N streams, the model and input of the HTTP runs:
# its JSON on stdout.
inproc_bench() {
  "$es" bench "$file" --input "$in_name=$work/$npy" --concurrency "$1" --duration "$duration" --json
}
bench_cpu_ms() { # JSON line -> CPU ms per request, requests, seconds
  awk -v c="$(json_field "$1" cpu_cores)" -v s="$(json_field "$1" seconds)" \
    -v q="$(json_field "$1" requests)" 'BEGIN { printf "%.3f %d %.3f", (q > 0 ? 1e3 * c * s / q : 0), q, s }'
}

# (b) in-process, the server idle. Appends the JSON line + the server's CPU
# over the run (cores; ~0 when idle).
run_inproc() {
  local n=$1 s0 t0 t1 s1 y0 y1 j
  s0=$(cpu_ticks "$srv_pid"); y0=$(sys_ticks); t0=$(now)
  ( inproc_bench "$n" >"$work/bench.out"
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
  -s scripts/bench/wrk/v2_infer.lua "$url" >/dev/null 2>&1 || true

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
# The body's trip alone: the same POST to a route that answers 404 once it
# has read the whole body (no parse, no inference), one connection.
settle_wait
ES_WRK_BODY=$work/body.bin wrk -t1 -c1 -d3s --timeout 30s -s scripts/bench/wrk/v2_infer.lua \
  "$base/no-such-route" >"$work/wrk404.out" 2>&1 || true
trip=$(grep '^ES_WRK ' "$work/wrk404.out" || true)
# The transport's floor, per N: http_floor answers the same body with an
# answer of the same size as the server's, while an in-process bench at the
# server's worker count keeps the cores as busy as the server's workers keep
# them (a quiet machine would flatter the floor: caches and cores to itself).
answer_bytes=$(curl -s -o /dev/null -w '%{size_download}' -H 'Content-Type: application/octet-stream' \
  -H "Inference-Header-Content-Length: $(cat "$work/body.bin.hlen")" --data-binary "@$work/body.bin" "$url")
floor_ok=1
cc -O2 -pthread -o "$work/http_floor" scripts/bench/http_floor.c 2>"$work/floor_cc.log" || floor_ok=0
if [ "$floor_ok" -eq 1 ]; then
  "$work/http_floor" 0 "$floor_read" "$answer_bytes" >"$work/floor.log" 2>&1 &
  floor_pid=$!
  fport=""
  for _ in $(seq 50); do
    fport=$(sed -nE 's/^listening on 127.0.0.1:([0-9]+)$/\1/p' "$work/floor.log")
    [ -n "$fport" ] && break
    sleep 0.1
  done
  [ -n "$fport" ] || floor_ok=0
fi
# The floor's cost is the floor server's own CPU plus what its traffic takes
# from the workers beside it: loopback TCP's softirq work runs on whatever
# thread holds the core (so on the workers), and the copies evict their
# caches. Measured A/B per round: the in-process bench at N streams alone,
# then again while wrk drives http_floor at about the HTTP run's rate; the
# bench's extra CPU per request, spread over the floor's requests in the
# same time, is that cost per request.
floor_alone() { # n -> appends "cpu_ms requests seconds" of the bench alone
  inproc_bench "$1" >"$work/fbench.out" 2>/dev/null || true
  bench_cpu_ms "$(grep '^{' "$work/fbench.out" || echo '{}')" >>"$work/falone_$1.txt"
  echo >>"$work/falone_$1.txt"
}
floor_beside() { # n delay_ms -> appends "floor_ms floor_rps bench_cpu_ms bench_req bench_s"
  local n=$1 t=$wrk_threads f0 f1 fl
  [ "$t" -gt "$n" ] && t=$n
  f0=$(cpu_ticks "$floor_pid")
  ES_WRK_DELAY_MS=$2 ES_WRK_BODY=$work/body.bin wrk -t"$t" -c"$n" -d"$((duration + 5))s" --timeout 30s \
    -s scripts/bench/wrk/v2_infer.lua "http://127.0.0.1:$fport/floor" >"$work/floor_$n.out" 2>&1 &
  local wp=$!
  sleep 1
  inproc_bench "$n" >"$work/fbench.out" 2>/dev/null || true
  wait "$wp" || true
  f1=$(cpu_ticks "$floor_pid")
  fl=$(grep '^ES_WRK ' "$work/floor_$n.out" || true)
  awk -v d="$((f1 - f0))" -v tk="$tck" -v q="$(kv "$fl" requests)" -v r="$(kv "$fl" rps)" \
    'BEGIN { printf "%.3f %.3f ", (q > 0 ? 1e3 * d / tk / q : 0), (r == "" ? 0 : r) }' >>"$work/fbeside_$n.txt"
  bench_cpu_ms "$(grep '^{' "$work/fbench.out" || echo '{}')" >>"$work/fbeside_$n.txt"
  echo >>"$work/fbeside_$n.txt"
}
if [ "$floor_ok" -eq 1 ]; then
  for n in $conns; do
    : >"$work/falone_$n.txt"; : >"$work/fbeside_$n.txt"
    # Pace: each connection at the HTTP run's median rate (less ~2 ms, the
    # floor's own answer time for this body).
    hr=$(while read -r h; do kv "$h" rps; done <"$work/http_$n.txt" | median)
    pace=$(awk -v n="$n" -v r="$hr" 'BEGIN { d = (r > 0 ? 1000 * n / r - 2 : 0); printf "%d", (d > 0 ? d : 0) }')
    for r in $(seq 1 "$rounds"); do
      if [ $((r % 2)) -eq 1 ]; then
        settle_wait; floor_alone "$n"; settle_wait; floor_beside "$n" "$pace"
      else
        settle_wait; floor_beside "$n" "$pace"; settle_wait; floor_alone "$n"
      fi
    done
  done
fi
# Where the server's CPU went, by thread (cumulative since start): workers,
# libgomp team threads (if any), MHD threads still open.
threads=$(for t in /proc/"$srv_pid"/task/*; do
  { awk -v tk="$tck" -v id="${t##*/}" -v c="$(cat "$t/comm")" \
    -v a="$(awk '/Cpus_allowed_list/ {print $2}' "$t/status")" \
    '{ s = ($14 + $15) / tk; if (s >= 0.5) printf "%s(%s,cpu %s) %.1fs  ", id, c, a, s }' "$t/stat"
  } 2>/dev/null || true  # a connection thread may have gone
done)
hwm=$(awk '/VmHWM/ {print $2}' "/proc/$srv_pid/status")
rss=$(awk '/VmRSS/ {print $2}' "/proc/$srv_pid/status")

fmt='%3s %6s | %8.2f %7.2f %7.2f | %8.2f %7.2f %7.2f | %5.1f%% %+7.2f %4d | %6.2f %6.2f %5.1f%% | %4.2f | %5.2f %5.2f\n'

# One summary line from a rows file: medians of every column; the overheads
# from the medians.
summary_row() {
  local n=$1 label=$2 f=$3
  col() { awk -v c="$1" '{print $c}' "$f" | median; }
  local hr ir sc ic
  hr=$(col 1) ir=$(col 4) sc=$(col 10) ic=$(col 11)
  # shellcheck disable=SC2059
  printf "$fmt" "$n" "$label" "$hr" "$(col 2)" "$(col 3)" "$ir" "$(col 5)" "$(col 6)" \
    "$(awk -v a="$hr" -v b="$ir" 'BEGIN { print 100 * (1 - a / b) }')" "$(col 8)" \
    "$(awk '{s += $9} END {print s}' "$f")" "$sc" "$ic" \
    "$(awk -v a="$sc" -v b="$ic" 'BEGIN { print (a > 0 ? 100 * (1 - b / a) : 0) }')" \
    "$(col 13)" "$(col 14)" "$(col 15)"
}

echo "model $name ($file, input $in_name from $npy; request $body_info bytes, binary output)"
echo "server: $workers workers, port $port${serve_env:+, env $serve_env}${serve_args:+, $serve_args}; wrk -t$wrk_threads (capped at N)," \
     "${duration}s per run, $rounds interleaved rounds; $cores cores"
printf '%3s %6s | %-24s | %-24s | %-19s | %-20s | %4s | %-11s\n' \
  "" "" "HTTP (wrk)" "in-process (bench)" "" "CPU ms per request" "" "other cores"
printf '%3s %6s | %8s %7s %7s | %8s %7s %7s | %6s %7s %4s | %6s %6s %6s | %4s | %5s %5s\n' \
  N round rps "p50 ms" "p99 ms" rps "p50 ms" "p99 ms" "ovh" "dp50" "err" srv inp ovh wrk http inp
for n in $conns; do
  mapfile -t H <"$work/http_$n.txt"
  mapfile -t I <"$work/inproc_$n.txt"
  : >"$work/rows_$n.txt"
  for r in $(seq 0 $((rounds - 1))); do
    h=${H[$r]} i=${I[$r]}
    errs=$(( $(kv "$h" non2xx) + $(kv "$h" connect) + $(kv "$h" read) + $(kv "$h" write) + $(kv "$h" timeout) ))
    ic=$(bench_cpu_ms "$i" | cut -d' ' -f1)
    row=$(awk -v hr="$(kv "$h" rps)" -v h50="$(kv "$h" p50_ms)" -v h99="$(kv "$h" p99_ms)" \
      -v ir="$(json_field "$i" throughput_rps)" -v i50="$(json_field "$i" p50_ms)" \
      -v i99="$(json_field "$i" p99_ms)" -v e="$errs" -v sc="$(kv "$h" srv_cpu_ms_req)" -v ic="$ic" \
      -v wc="$(kv "$h" wrk_cpu)" -v oh="$(kv "$h" other)" \
      -v oi="$(sed -nE 's/.* other=([^ ]+).*/\1/p' <<<"$i")" \
      -v id="$(sed -nE 's/.* srv_idle=([^ ]+).*/\1/p' <<<"$i")" \
      -v hm="$(kv "$h" mean_ms)" -v sq="$(kv "$h" srv_queue_ms)" -v sm="$(kv "$h" srv_compute_ms)" \
      'BEGIN { print hr, h50, h99, ir, i50, i99, 100 * (1 - hr / ir), h50 - i50, e,
               sc, ic, (sc > 0 ? 100 * (1 - ic / sc) : 0), wc, oh, oi, id, hm, sq, sm, hm - sq - sm }')
    echo "$row" >>"$work/rows_$n.txt"
    # shellcheck disable=SC2059,SC2046
    printf "$fmt" "$n" "$((r + 1))" $(awk '{print $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15}' <<<"$row")
  done
  summary_row "$n" median "$work/rows_$n.txt"
  awk '$14 < 0.25 && $15 < 0.25' "$work/rows_$n.txt" >"$work/quiet_$n.txt"
  q=$(wc -l <"$work/quiet_$n.txt")
  if [ "$q" -gt 0 ]; then summary_row "$n" "quiet$q" "$work/quiet_$n.txt"; fi
  awk -v n="$n" 'NR == 1 { hr = $1; h50 = $2; h99 = $3; ir = $4; i50 = $5; i99 = $6; sc = $10; ic = $11 }
    { if ($1 > hr) hr = $1; if ($2 < h50) h50 = $2; if ($3 < h99) h99 = $3
      if ($4 > ir) ir = $4; if ($5 < i50) i50 = $5; if ($6 < i99) i99 = $6
      if ($10 < sc) sc = $10; if ($11 < ic) ic = $11 }
    END { printf "%3d %6s | %8.2f %7.2f %7.2f | %8.2f %7.2f %7.2f | %5.1f%% %+7.2f %4s | %6.2f %6.2f %5.1f%% |\n",
          n, "best", hr, h50, h99, ir, i50, i99, 100 * (1 - hr / ir), h50 - i50, "", sc, ic,
          (sc > 0 ? 100 * (1 - ic / sc) : 0) }' "$work/rows_$n.txt"
done
idle_max=$(for n in $conns; do awk '{print $16}' "$work/rows_$n.txt"; done | sort -g | tail -1)
echo "(ovh = 1 - http rps / in-process rps; dp50 = http p50 - in-process p50, ms; err = HTTP status"
echo " >= 400 (e.g. 429) plus socket errors and timeouts, summed over the rounds on summary rows."
echo " CPU ms per request: the server's CPU time over the HTTP run / responses (srv), the bench's"
echo " over its timed phase / requests (inp); ovh = 1 - inp / srv: what HTTP costs in CPU, which"
echo " bounds throughput once the cores are saturated, and which contention from other processes"
echo " changes much less than it changes rps. wrk: cores used by wrk. other cores: used by other"
echo " processes on the machine during the HTTP / in-process run; rounds where they are not both"
echo " ~0 do not compare like with like. median: of each column (ovh from the medians); quietK:"
echo " the same over the K rounds with other < 0.25 cores in both runs; best: the highest rps and"
echo " the lowest latency and CPU of each side. The server stayed up, idle, during the in-process"
echo " runs: it used at most $idle_max cores then.)"
[ "$settled_all" -eq 1 ] || echo "note: the machine was busy (other processes over 0.25 cores) before some runs" \
  "even after waiting ${settle}s (--settle)"
echo
# The client's share. wrk shares the server's cores here (the in-process bench
# has no client), so part of the rps gap is wrk's own CPU, which a deployed
# server does not pay (its clients are cameras and other hosts). The rps the
# server gives per core left to it: http rps x cores / (cores - wrk cores).
echo "rps overhead with the client's cores taken out (1 - http rps x $cores / ($cores - wrk cores) / in-process rps):"
for n in $conns; do
  awk -v c="$cores" '{ print 100 * (1 - $1 * c / (c - $13) / $4) }' "$work/rows_$n.txt" >"$work/noclient_$n.txt"
  printf '%3d  rounds: %s  median: %.1f%%\n' "$n" "$(awk '{ printf "%s%.1f%%", (NR > 1 ? " " : ""), $1 }' \
    "$work/noclient_$n.txt")" "$(median <"$work/noclient_$n.txt")"
done
echo
echo "where the HTTP request's time goes (medians over rounds, ms per request):"
printf '%3s %10s %10s %12s %12s\n' N "wrk mean" "srv queue" "srv compute" "HTTP+client"
for n in $conns; do
  col() { awk -v c="$1" '{print $c}' "$work/rows_$n.txt" | median; }
  printf '%3d %10.2f %10.2f %12.2f %12.2f\n' "$n" "$(col 17)" "$(col 18)" "$(col 19)" "$(col 20)"
done
echo "(srv queue / compute: means from the server's own histograms over the run (/metrics);"
echo " HTTP+client = wrk's mean latency minus both: sending and receiving the body, copying and"
echo " parsing it, encoding and sending the response, thread wake-ups, and wrk itself)"
if [ -n "$trip" ]; then
  echo
  echo "the body's trip alone (POST of the same $(stat -c %s "$work/body.bin")-byte body to a route" \
       "that answers 404"
  echo " after reading it, 1 connection, 3 s): p50 $(kv "$trip" p50_ms) ms, mean $(kv "$trip" mean_ms) ms," \
       "$(kv "$trip" rps) req/s"
fi
if [ "$floor_ok" -eq 1 ]; then
  echo
  echo "the transport's floor (scripts/bench/http_floor.c: blocking thread per connection, no HTTP"
  echo " library, $floor_read-byte reads, the same body in and a $answer_bytes-byte answer out), driven by wrk"
  echo " with N connections paced to the HTTP run's rate, beside the in-process bench at N streams;"
  echo " A/B over $rounds rounds against the bench alone. CPU ms per request (medians):"
  printf '%3s %8s %8s %9s %8s %10s %10s %10s %14s\n' N "rps" floor "workers" total "srv - inp" inp \
    "total/inp" "(srv-inp)/inp"
  for n in $conns; do
    col() { awk -v c="$1" '{print $c}' "$work/rows_$n.txt" | median; }
    fcol() { awk -v c="$1" 'NF {print $c}' "$2" | median; }
    # Per round: the bench's extra CPU beside the floor, spread over the
    # floor's requests in the bench's timed phase.
    paste -d' ' "$work/fbeside_$n.txt" "$work/falone_$n.txt" | awk 'NF >= 6 && $2 > 0 && $5 > 0 {
        print ($3 - $6) * $4 / ($2 * $5) }' >"$work/finterf_$n.txt"
    awk -v n="$n" -v fr="$(fcol 2 "$work/fbeside_$n.txt")" -v f="$(fcol 1 "$work/fbeside_$n.txt")" \
      -v w="$(median <"$work/finterf_$n.txt")" -v sc="$(col 10)" -v ic="$(col 11)" \
      'BEGIN { if (w == "") w = 0
               printf "%3d %8.2f %8.2f %9.2f %8.2f %10.2f %10.2f %9.1f%% %13.1f%%\n", n, fr, f, w, f + w,
                 sc - ic, ic, (ic > 0 ? 100 * (f + w) / ic : 0), (ic > 0 ? 100 * (sc - ic) / ic : 0) }'
    echo "    per round: bench alone $(awk 'NF {printf "%s ", $1}' "$work/falone_$n.txt")ms/req;" \
         "beside the floor $(awk 'NF {printf "%s ", $3}' "$work/fbeside_$n.txt")ms/req;" \
         "workers' share $(awk '{printf "%.2f ", $1}' "$work/finterf_$n.txt")ms per floor request"
  done
  echo "(floor: the floor server's own CPU per request; workers: what its traffic costs the bench"
  echo " beside it per floor request (bench's extra CPU per request x its requests / the floor's);"
  echo " total/inp is the least CPU overhead any server pays here for this body over loopback TCP"
  echo " with its workers on the same cores; the rest of (srv-inp)/inp is the server's own: its"
  echo " event loop, copies, encoding, threads. The bench-alone/beside difference is as noisy as"
  echo " the runs: read it over several rounds)"
else
  echo
  echo "the transport's floor: not measured (http_floor did not build or start: $(head -c 300 "$work/floor_cc.log" "$work/floor.log" 2>/dev/null | tr '\n' ' '))"
fi
echo
echo "server threads with >= 0.5 s CPU since start (tid(name,cpus) seconds): $threads"
inp_rss=$(for n in $conns; do while read -r l; do json_field "$l" peak_rss_bytes; done <"$work/inproc_$n.txt"; done | sort -g | tail -1)
echo
echo "server memory: VmHWM $((hwm / 1024)) MiB, VmRSS at the end $((rss / 1024)) MiB (all default models"
echo " loaded); in-process bench peak RSS $(awk -v b="$inp_rss" 'BEGIN { printf "%.0f", b / 1048576 }') MiB (this model only)"
