#!/usr/bin/env bash
# The main job (README's first command): install what is needed, fetch the
# models and images, build, then play BRIEF §1's edge-gateway scenario
# against the server over HTTP, twice:
#   shared  `edgeserve serve` with its default config: one copy of each
#           model's weights, arena pools, one memory budget;
#   naive   the same server with sharing disabled (scripts/scenario/naive.json):
#           every stream gets its own private model instance (weights,
#           prepared weights, plans, arenas).
# Six streams (scripts/scenario/streams.json) run at their frame rates, open
# loop like cameras: four detection cameras on ppocr_det at 640x640, 6 fps
# each; a door camera on the "face" pipeline, 20 fps; a serial-plate reader
# on the "ocr" pipeline, 10 fps. Frames are made by
# scripts/scenario/make_images.sh from the pinned public-domain sample images
# and rendered text. A table is redrawn every second (per stream fps achieved
# vs target, p50/p99 latency, refusals; the server's RSS vs the budget); at
# the end both runs are printed side by side (memory, latency, fps).
# Then, as before, the five models against ONNX Runtime and the allocator
# benchmark in its quick form.
#   scripts/demo.sh [--duration S] [--budget BYTES] [--fps STREAM=F]...
#                   [--scenario-only] [bench-mem options...]
# --duration: seconds per setup (default 30); --budget: the admission budget
# both servers get (default 512M); --fps: override a stream's frame rate
# (e.g. --fps cam0=8); --scenario-only: stop after the side-by-side table.
# Other arguments go to bench-mem, e.g. --ops 10000000 (the full benchmark).
# Outputs: .cache/scenario/{shared,naive}.summary.json and .serve.log.
set -euo pipefail
cd "$(dirname "$0")/.."
duration=30 budget=512M scenario_only=0
fps=() bench=()
while [ $# -gt 0 ]; do
  case $1 in
    --duration) duration=${2:?--duration needs seconds}; shift 2 ;;
    --budget) budget=${2:?--budget needs bytes}; shift 2 ;;
    --fps) fps+=(--fps "${2:?--fps needs STREAM=F}"); shift 2 ;;
    --scenario-only) scenario_only=1; shift ;;
    *) bench+=("$1"); shift ;;
  esac
done

scripts/deps.sh
scripts/fetch-models.sh
scripts/fetch-images.sh
[ $scenario_only -eq 1 ] || scripts/ort/install.sh
scripts/build.sh build-release -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF
es=build-release/edgeserve
$es version
scripts/scenario/make_images.sh

runs=.cache/scenario
srv_pid=""
stop_server() {
  if [ -n "$srv_pid" ] && kill -0 "$srv_pid" 2>/dev/null; then
    kill "$srv_pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$srv_pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$srv_pid" 2>/dev/null || true
  fi
  [ -z "$srv_pid" ] || wait "$srv_pid" 2>/dev/null || true
  srv_pid=""
}
trap stop_server EXIT
trap 'exit 130' INT TERM

# start_server NAME [serve options...]: sets srv_pid and port once
# /v2/health/ready answers 200.
start_server() {
  local name=$1 log=$runs/$1.serve.log
  shift
  "$es" serve --port 0 --quiet --memory "$budget" "$@" >"$log" 2>&1 &
  srv_pid=$!
  port=""
  for _ in $(seq 1200); do
    if ! kill -0 "$srv_pid" 2>/dev/null; then
      cat "$log" >&2
      echo "demo: the $name server exited at start" >&2
      exit 1
    fi
    port=$(sed -nE 's|.*serving .* on http://[^:]+:([0-9]+)/v2.*|\1|p' "$log")
    [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/v2/health/ready" >/dev/null && return 0
    sleep 0.1
  done
  cat "$log" >&2
  echo "demo: the $name server was not ready after 120 s" >&2
  exit 1
}

# run_setup NAME [serve options...]
run_setup() {
  local name=$1
  shift
  echo
  echo "== scenario: $name ($duration s; server: edgeserve serve --memory $budget${*:+ $*})"
  start_server "$name" "$@"
  grep -v '^edgeserve: serving' "$runs/$name.serve.log" >&2 || true  # models that did not load
  node scripts/scenario.js --url "http://127.0.0.1:$port" --setup "$name" --pid "$srv_pid" \
    --duration "$duration" --budget "$budget" ${fps[@]+"${fps[@]}"} --out "$runs/$name.summary.json"
  stop_server
}

run_setup shared
run_setup naive --config scripts/scenario/naive.json
echo
echo "== BRIEF §1 on this machine ($(nproc) cores): shared vs sharing disabled"
node scripts/scenario.js --compare "$runs/shared.summary.json" "$runs/naive.summary.json"
[ $scenario_only -eq 0 ] || exit 0

echo
echo "== the target models, edgeserve vs ONNX Runtime"
bash tests/e2e/test_vs_ort.sh "$es" "$PWD"
echo
echo "== allocators"
if [ ${#bench[@]} -eq 0 ]; then bench=(--quick); fi
exec "$es" bench-mem "${bench[@]}"
