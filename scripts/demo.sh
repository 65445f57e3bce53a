#!/usr/bin/env bash
# The main job (README's first command): install what is needed, fetch the
# models and images, build, then play BRIEF §1's edge-gateway scenario
# against the server over HTTP, three times:
#   shared  `edgeserve serve` with its default config: one copy of each
#           model's weights, arena pools, one memory budget;
#   naive   the same single server with sharing disabled
#           (scripts/demo/naive.json): every stream gets its own private
#           model instance (weights, prepared weights, plans, arenas), but
#           code, libraries, the HTTP stack and the runtime's pools are still
#           one process's;
#   procs   one `edgeserve serve` process per stream, nothing shared but what
#           the kernel shares (the binary, the libraries): BRIEF §1's
#           "before". Stream S of kind K gets a server started with
#           scripts/demo/procs-K.json, which loads only what that stream
#           needs (det: ppocr_det planned at 640x640; face: blazeface_front
#           and the face pipeline; ocr: ppocr_det/cls/rec and the ocr
#           pipeline), with 1 worker, unpinned (pinned, every process's
#           worker 0 would sit on core 0; 6 processes share the machine's
#           cores through the kernel, as the shared server's 2 pinned
#           workers do), and budget/6 as its admission budget. Each listens
#           on its own port; the driver sends stream S to its server
#           (scenario.js --stream-url) and sums the processes' VmHWM, RSS,
#           PSS (smaps_rollup: the fair sum, shared pages split) and CPU.
#           All are started together and each must answer
#           /v2/health/ready; all are stopped (TERM, then KILL after 10 s)
#           when the run ends or the script exits for any reason.
#           (The files' own "memory_budget", 85M, is 512M/6 for a manual
#           run; here --memory overrides it.)
#   int8    the shared setup with det quantized to int8 by `edgeserve
#           quantize` (scripts/demo/int8.json: the default config's models,
#           ppocr_det from .cache/scenario/ppocr_det.int8.onnx, made here
#           once from rendered pages and a photo), for the memory table's
#           int8 column.
# Same models in every setup: the door camera runs blazeface_front (the
# default "face" pipeline's). naive.json and procs-ocr.json do not plan the
# plate's detector at 640x640 (plates are small) and the default config
# also loads blazeface_back, unused here: both count against "shared".
# Six streams (scripts/demo/streams.json) run at their frame rates, open
# loop like cameras: four detection cameras on ppocr_det at 640x640, 6 fps
# each; a door camera on the "face" pipeline, 20 fps; a serial-plate reader
# on the "ocr" pipeline, 10 fps. Frames are made by
# scripts/demo/make_images.sh from the pinned public-domain sample images
# and rendered text. A table is redrawn every second (per stream fps achieved
# vs target, p50/p99 latency, refusals; the server's RSS vs the budget); at
# the end the three runs are printed side by side (memory, latency, fps),
# memory relative to the shared run.
# Then, as before, the five models against ONNX Runtime and the allocator
# benchmark in its quick form.
#   scripts/demo.sh [--duration S] [--budget BYTES] [--fps STREAM=F]...
#                   [--scenario-only] [--preempt on|off] [--rt on|off]
#                   [bench-mem options...]
# --duration: seconds per setup (default 30); --budget: the admission budget
# of the single servers (default 512M; in procs each of the N processes gets
# BYTES/N, auto stays auto); --fps: override a stream's frame rate
# (e.g. --fps cam0=8); --scenario-only: stop after the side-by-side table;
# --preempt off: the servers let a started run finish before an urgent
# request (the runtime's cooperative preemption is on by default).
# --rt on (the default): where the system allows real-time threads (root,
# CAP_SYS_NICE, ulimit -r >= 10), every server runs with --rt-priority 10:
# the door camera's face requests (level 0: the face pipeline's in every
# config here) run on SCHED_FIFO workers and the HTTP threads at 9, so that
# the kernel does not make them share a core with the det runs (README: real-time scheduling); elsewhere, and
# with --rt off, at ordinary priority (the run says which).
# Other arguments go to bench-mem, e.g. --ops 10000000 (the full benchmark).
# Outputs: .cache/scenario/{shared,naive,procs,int8}.summary.json, and the
# servers' logs: {shared,naive,int8}.serve.log, procs-STREAM.serve.log.
set -euo pipefail
cd "$(dirname "$0")/.."
duration=30 budget=512M scenario_only=0 rt=on
fps=() bench=() serve_extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --duration) duration=${2:?--duration needs seconds}; shift 2 ;;
    --budget) budget=${2:?--budget needs bytes}; shift 2 ;;
    --fps) fps+=(--fps "${2:?--fps needs STREAM=F}"); shift 2 ;;
    --scenario-only) scenario_only=1; shift ;;
    --preempt) serve_extra+=(--preempt "${2:?--preempt needs on or off}"); shift 2 ;;
    --rt) rt=${2:?--rt needs on or off}; shift 2 ;;
    *) bench+=("$1"); shift ;;
  esac
done
if [ "$rt" = on ] && chrt -f 10 true 2>/dev/null; then
  serve_extra+=(--rt-priority 10)
  echo "demo: servers with --rt-priority 10 (urgent requests on real-time workers)"
elif [ "$rt" = on ]; then
  echo "demo: real-time threads are not allowed here (not root, no CAP_SYS_NICE, ulimit -r below 10):" \
    "the servers run at ordinary priority"
fi

# bytes_of 512M: the bytes (K/M/G suffixes, optional i and B, as edgeserve reads them)
bytes_of() {
  [[ $1 =~ ^([0-9]+)([KkMmGg]?)i?B?$ ]] || return 1
  local n=${BASH_REMATCH[1]}
  case ${BASH_REMATCH[2]} in
    K|k) echo $((n << 10)) ;;
    M|m) echo $((n << 20)) ;;
    G|g) echo $((n << 30)) ;;
    *) echo "$n" ;;
  esac
}
if [ "$budget" != auto ] && ! bytes_of "$budget" >/dev/null; then
  echo "demo: --budget wants BYTES (K/M/G suffixes) or auto, got '$budget'" >&2
  exit 2
fi

scripts/setup/deps.sh
scripts/setup/fetch-models.sh
scripts/setup/fetch-images.sh
[ $scenario_only -eq 1 ] || scripts/setup/install-ort.sh
scripts/build.sh build-release -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF
es=build-release/edgeserve
$es version
scripts/demo/make_images.sh
det8=.cache/scenario/ppocr_det.int8.onnx
if [ ! -s "$det8" ]; then
  cal=$(mktemp -d)
  scripts/bench/calib_pages.sh "$cal"
  $es quantize .cache/models/ppocr_det.onnx -o "$det8" --calibrate "$cal" --preprocess ocr-det:640 \
    --method percentile
  rm -rf "$cal"
fi

runs=.cache/scenario
srv_pids=()  # the servers running now
drv_pid=""   # the driver running now
# stop_servers: the driver, if it runs, then TERM to each server, up to 10 s
# for all to drain, then KILL; all reaped.
stop_servers() {
  local p alive
  if [ -n "$drv_pid" ]; then
    kill "$drv_pid" 2>/dev/null || true
    wait "$drv_pid" 2>/dev/null || true
    drv_pid=""
  fi
  for p in ${srv_pids[@]+"${srv_pids[@]}"}; do kill "$p" 2>/dev/null || true; done
  for _ in $(seq 100); do
    alive=0
    for p in ${srv_pids[@]+"${srv_pids[@]}"}; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive -eq 1 ] || break
    sleep 0.1
  done
  for p in ${srv_pids[@]+"${srv_pids[@]}"}; do
    kill -9 "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  srv_pids=()
}
trap stop_servers EXIT
trap 'exit 130' INT TERM

# launch_server LOG [serve options...]: starts a server on a free port in
# the background and appends its pid to srv_pids.
launch_server() {
  local log=$1
  shift
  "$es" serve --port 0 --quiet ${serve_extra[@]+"${serve_extra[@]}"} "$@" >"$log" 2>&1 &
  srv_pids+=($!)
}

# wait_ready NAME PID LOG: sets port once the server's /v2/health/ready
# answers 200 (and shows what its log says besides the serving line:
# models that did not load); exits when it dies or is not ready in 120 s.
wait_ready() {
  local name=$1 pid=$2 log=$3
  port=""
  for _ in $(seq 1200); do
    if ! kill -0 "$pid" 2>/dev/null; then
      cat "$log" >&2
      echo "demo: the $name server exited at start" >&2
      exit 1
    fi
    port=$(sed -nE 's|.*serving .* on http://[^:]+:([0-9]+)/v2.*|\1|p' "$log")
    if [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/v2/health/ready" >/dev/null; then
      grep -v '^edgeserve: serving' "$log" >&2 || true
      return 0
    fi
    sleep 0.1
  done
  cat "$log" >&2
  echo "demo: the $name server was not ready after 120 s" >&2
  exit 1
}

# drive [scenario.js options...]: the driver, in the background so that a
# signal to this script is handled at once (bash runs traps only between
# foreground commands), then waited for; its failure fails the script.
drive() {
  node scripts/demo/scenario.js "$@" &
  drv_pid=$!
  wait "$drv_pid"
  drv_pid=""
}

# run_setup NAME LABEL ABOUT [serve options...]: one server for every stream.
run_setup() {
  local name=$1 label=$2 about=$3
  shift 3
  echo
  echo "== scenario: $name ($duration s; server: edgeserve serve --memory $budget${*:+ $*})"
  launch_server "$runs/$name.serve.log" --memory "$budget" "$@"
  wait_ready "$name" "${srv_pids[0]}" "$runs/$name.serve.log"
  drive --url "http://127.0.0.1:$port" --setup "$name" --pid "${srv_pids[0]}" \
    --label "$label" --about "$about" --duration "$duration" --budget "$budget" ${fps[@]+"${fps[@]}"} \
    --out "$runs/$name.summary.json"
  stop_servers
}

# run_procs: one server per stream of scripts/demo/streams.json, the
# stream's kind choosing its config; all started, then each waited for.
run_procs() {
  local streams=() route=() i s kind share share_h
  mapfile -t streams < <(node -e \
    'for (const s of require("./scripts/demo/streams.json").streams) console.log(`${s.name} ${s.kind || "other"}`)')
  share=auto share_h=auto
  if [ "$budget" != auto ]; then
    share=$(($(bytes_of "$budget") / ${#streams[@]}))
    share_h=$(awk -v b="$share" 'BEGIN { printf "%.1f MiB", b / 1048576 }')
  fi
  echo
  echo "== scenario: procs ($duration s; ${#streams[@]} servers, one per stream:" \
       "edgeserve serve --config scripts/demo/procs-KIND.json --memory $share)"
  for i in "${!streams[@]}"; do
    read -r s kind <<<"${streams[$i]}"
    [ -f "scripts/demo/procs-$kind.json" ] || { echo "demo: stream $s: no scripts/demo/procs-$kind.json" >&2; exit 1; }
    launch_server "$runs/procs-$s.serve.log" --config "scripts/demo/procs-$kind.json" --memory "$share"
  done
  for i in "${!streams[@]}"; do
    read -r s kind <<<"${streams[$i]}"
    wait_ready "procs/$s" "${srv_pids[$i]}" "$runs/procs-$s.serve.log"
    route+=(--stream-url "$s=$port" --pid "${srv_pids[$i]}")
  done
  drive --setup procs --label "1 process per stream" \
    --about "${#streams[@]} processes, one per stream, each loading only its stream's models (scripts/demo/procs-KIND.json: 1 worker, unpinned, budget $share_h each)" \
    "${route[@]}" --duration "$duration" ${fps[@]+"${fps[@]}"} --out "$runs/procs.summary.json"
  stop_servers
}

echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores)"
run_setup shared shared "1 process, the default config: one copy of each model, one budget ($budget)"
run_setup naive "1 process, no sharing" \
  "1 process, every stream its own private model copies (scripts/demo/naive.json, \"share\": false), budget $budget" \
  --config scripts/demo/naive.json
run_procs
run_setup int8 "shared, det int8" \
  "1 process, the default config with det in int8 (scripts/demo/int8.json), budget $budget" \
  --config scripts/demo/int8.json
echo
echo "== BRIEF §1 on this machine ($(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)): shared vs sharing disabled vs one process per stream, and shared with det in int8"
node scripts/demo/scenario.js --compare "$runs/shared.summary.json" "$runs/naive.summary.json" "$runs/procs.summary.json" \
  "$runs/int8.summary.json"
[ $scenario_only -eq 0 ] || exit 0

echo
echo "== the target models, edgeserve vs ONNX Runtime"
bash tests/e2e/test_vs_ort.sh "$es" "$PWD"
echo
echo "== allocators"
if [ ${#bench[@]} -eq 0 ]; then bench=(--quick); fi
exec "$es" bench-mem "${bench[@]}"
