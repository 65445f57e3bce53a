#!/usr/bin/env bash
# The runtime's claims, measured side by side in one run (A/B interleaved
# rounds, medians over the rounds):
#   1. streams: 6 concurrent streams of one model (det at 640x640, rec at
#      48x320) on this machine's cores: edgeserve (one weight copy, arena
#      pool), edgeserve --no-share (a copy of everything per stream, BRIEF §1's
#      "before") and ONNX Runtime (one onnxruntime-node session per stream):
#      throughput, p50/p99, peak RSS and PSS, against the budget formula
#      weights + 6 x planned arena + 30 MB; for det also edgeserve in bf16
#      (where the CPU has avx512_bf16) and edgeserve and ONNX Runtime on det
#      quantized to int8 by `edgeserve quantize` (the same QDQ file);
#   2. lane: BlazeFace back, det and rec on one lane with one shared
#      scratchpad vs private arenas vs ONNX Runtime: per-frame latency,
#      memory, switch time;
#   3. scaling: 2 workers vs 1 on det (closed loop, 2 streams);
#   4. load at 80% of the measured capacity (open loop): p99/p50, with
#      Poisson arrivals (independent clients) and paced ones (camera frames);
#   5. overload at 3x capacity with a memory budget and short queues:
#      refusals by reason and how fast they come, admitted p99, peak RSS
#      against weights + budget.
#   scripts/bench/bench_runtime.sh [--rounds R] [--duration S] [--only "streams lane scaling load"]
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=3 dur=10 only=""
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --duration) dur=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    *) echo "usage: $0 [--rounds R] [--duration S] [--only \"streams lane scaling load\"]" >&2; exit 2 ;;
  esac
done
want() { [ -z "$only" ] || grep -qw "$1" <<<"$only"; }
es=${ES_BIN:-build-release/edgeserve}
scripts/setup/deps.sh >/dev/null # the build's packages, on a new machine
[ -x "$es" ] || scripts/build.sh build-release -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF >/dev/null
scripts/setup/fetch-models.sh >/dev/null
scripts/setup/install-ort.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
node scripts/ort/make_inputs.js "$work" >/dev/null
m=.cache/models
det="$m/ppocr_det.onnx" rec="$m/ppocr_rec.onnx" back="$m/blazeface_back_256.onnx"
det_in="$work/ppocr_det_640.npy" rec_in="$work/ppocr_rec_w320.npy" back_in="$work/blazeface_back_256.npy"
table() { node scripts/bench/runtime_table.js "$@"; }
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"

if want streams; then
  # det in int8 (quantized here) and bf16 beside FP32
  det8=""
  if command -v convert >/dev/null; then
    scripts/bench/calib_pages.sh "$work/cal_det"
    "$es" quantize "$det" -o "$work/det.int8.onnx" --calibrate "$work/cal_det" \
      --preprocess ocr-det:640 --method percentile >/dev/null && det8="$work/det.int8.onnx"
  fi
  bf16=1
  "$es" inspect "$det" --precision bf16 >/dev/null 2>&1 || bf16=0
  for c in "det $det x=$det_in" "rec $rec x=$rec_in"; do
    read -r name model input <<<"$c"
    for r in $(seq 1 "$rounds"); do
      a() { "$es" bench "$model" --input "$input" --concurrency 6 --duration "$dur" --json >>"$work/s_${name}_es.jsonl"; }
      b() { "$es" bench "$model" --input "$input" --concurrency 6 --no-share --duration "$dur" --json >>"$work/s_${name}_naive.jsonl"; }
      o() { node scripts/ort/bench_streams.js "$model" --concurrency 6 --input "${input#x=}" --duration "$dur" --json >>"$work/s_${name}_ort.jsonl"; }
      case $((r % 3)) in 1) a; b; o ;; 2) o; a; b ;; 0) b; o; a ;; esac
      [ "$name" = det ] || continue
      h() { [ $bf16 = 0 ] || "$es" bench "$model" --input "$input" --concurrency 6 --precision bf16 --duration "$dur" --json >>"$work/s_det_es16.jsonl"; }
      e8() { [ -z "$det8" ] || "$es" bench "$det8" --input "$input" --concurrency 6 --duration "$dur" --json >>"$work/s_det_es8.jsonl"; }
      o8() { [ -z "$det8" ] || node scripts/ort/bench_streams.js "$det8" --concurrency 6 --input "${input#x=}" --duration "$dur" --json >>"$work/s_det_ort8.jsonl"; }
      case $((r % 3)) in 1) h; e8; o8 ;; 2) o8; h; e8 ;; 0) e8; o8; h ;; esac
    done
    table streams "$name" "$work/s_${name}_es.jsonl" "$work/s_${name}_naive.jsonl" "$work/s_${name}_ort.jsonl" \
      "edgeserve bf16=$work/s_${name}_es16.jsonl" "edgeserve int8=$work/s_${name}_es8.jsonl" \
      "onnxruntime int8=$work/s_${name}_ort8.jsonl"
  done
fi

if want lane; then
  for r in $(seq 1 "$rounds"); do
    l() { "$es" bench-lane "$back" "$det" "$rec" --input "0:input:0=$back_in" --input "1:x=$det_in" \
            --input "2:x=$rec_in" --frames 100 --json >>"$work/lane_es.jsonl"; }
    p() { "$es" bench-lane "$back" "$det" "$rec" --input "0:input:0=$back_in" --input "1:x=$det_in" \
            --input "2:x=$rec_in" --frames 100 --private --json >>"$work/lane_private.jsonl"; }
    o() { node scripts/ort/bench_frames.js --model "$back" --input "$back_in" --model "$det" \
            --input "x=$det_in" --model "$rec" --input "x=$rec_in" --frames 100 --json >>"$work/lane_ort.jsonl"; }
    case $((r % 3)) in 1) l; p; o ;; 2) o; l; p ;; 0) p; o; l ;; esac
  done
  table lane "$work/lane_es.jsonl" "$work/lane_private.jsonl" "$work/lane_ort.jsonl"
fi

if want scaling || want load; then
  for r in $(seq 1 "$rounds"); do
    one() { "$es" bench "$det" --input "x=$det_in" --concurrency 2 --workers 1 --duration "$dur" --json >>"$work/w1.jsonl"; }
    two() { "$es" bench "$det" --input "x=$det_in" --concurrency 2 --workers 2 --duration "$dur" --json >>"$work/w2.jsonl"; }
    if [ $((r % 2)) -eq 1 ]; then one; two; else two; one; fi
  done
  table scaling "$work/w1.jsonl" "$work/w2.jsonl"
fi

if want load; then
  cap=$(node -e 'const l=require("fs").readFileSync(process.argv[1],"utf8").trim().split("\n").map(JSON.parse).map(j=>j.throughput_rps).sort((a,b)=>a-b);console.log(l[l.length>>1])' "$work/w2.jsonl")
  planned=$(head -1 "$work/w2.jsonl" | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).planned_arena_bytes))')
  budget=$((planned * 4))
  echo "capacity (det 640, 2 workers): $cap requests/s; overload budget 4 x planned arena = $budget B"
  for r in $(seq 1 "$rounds"); do
    rate80=$(node -e "console.log((0.8*$cap).toFixed(2))")
    rate3x=$(node -e "console.log((3*$cap).toFixed(2))")
    "$es" bench "$det" --input "x=$det_in" --rate "$rate80" --workers 2 --duration "$dur" --json >>"$work/load80.jsonl"
    "$es" bench "$det" --input "x=$det_in" --rate "$rate80" --paced --workers 2 --duration "$dur" --json >>"$work/load80p.jsonl"
    "$es" bench "$det" --input "x=$det_in" --rate "$rate3x" --workers 2 --duration "$dur" \
      --memory "$budget" --queue 4 --json >>"$work/load300.jsonl"
  done
  table load "$work/load80.jsonl" "$work/load80p.jsonl" "$work/load300.jsonl" "$budget"
fi
