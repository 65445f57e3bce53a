#!/usr/bin/env bash
# edgeserve vs ONNX Runtime on the five target models, same inputs, same
# machine, A/B interleaved: for each model and thread count, R rounds, each
# round one `edgeserve bench` then one ORT run (or the other way round on odd
# rounds), ITERS timed runs each after warm-up. Prints the median of the
# per-round medians, p99, the ratio edgeserve / ORT, and edgeserve's GFLOP/s
# against one core's FP32 peak (ES_PEAK_GFLOPS, default 210 per thread).
#   scripts/bench/bench_vs_ort.sh [--iters N] [--rounds R] [--threads "1 2"] [--models "det rec ..."]
set -euo pipefail
cd "$(dirname "$0")/../.."
iters=30 rounds=3 threads="1 2" only=""
while [ $# -gt 0 ]; do
  case $1 in
    --iters) iters=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --models) only=$2; shift 2 ;;
    *) echo "usage: $0 [--iters N] [--rounds R] [--threads \"1 2\"] [--models \"front back cls rec det\"]" >&2; exit 2 ;;
  esac
done
es=${ES_BIN:-build-release/edgeserve}
[ -x "$es" ] || { scripts/build.sh build-release -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF >/dev/null; }
scripts/setup/fetch-models.sh >/dev/null
scripts/setup/install-ort.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
node scripts/ort/make_inputs.js "$work" >/dev/null
m=.cache/models
peak=${ES_PEAK_GFLOPS:-210}

# short name, model file, input file
cases=(
  "front $m/blazeface_front_128.onnx $work/blazeface_front_128.npy"
  "back $m/blazeface_back_256.onnx $work/blazeface_back_256.npy"
  "cls $m/ppocr_cls.onnx $work/ppocr_cls.npy"
  "rec $m/ppocr_rec.onnx $work/ppocr_rec_w320.npy"
  "det $m/ppocr_det.onnx $work/ppocr_det_640.npy"
)

json_field() { sed -E "s/.*\"$2\": ?([0-9.e+-]+).*/\1/" <<<"$1"; }
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

printf '%-6s %3s %11s %11s %11s %11s %7s %9s %6s\n' model thr "es med ms" "es p99 ms" \
  "ort med ms" "ort p99 ms" ratio "GFLOP/s" "%peak"
for c in "${cases[@]}"; do
  read -r name model input <<<"$c"
  if [ -n "$only" ] && ! grep -qw "$name" <<<"$only"; then continue; fi
  for t in $threads; do
    : >"$work/es.txt"; : >"$work/ort.txt"
    for r in $(seq 1 "$rounds"); do
      run_es() { OMP_NUM_THREADS=$t "$es" bench "$model" "$input" --threads "$t" --iters "$iters" --json >>"$work/es.txt"; }
      run_ort() { node scripts/ort/ort_run.js "$model" - "$input" --threads "$t" --repeat "$iters" --warmup 5 --json >>"$work/ort.txt"; }
      if [ $((r % 2)) -eq 1 ]; then run_es; run_ort; else run_ort; run_es; fi
    done
    es_med=$(while read -r l; do json_field "$l" median_ms; done <"$work/es.txt" | median)
    es_p99=$(while read -r l; do json_field "$l" p99_ms; done <"$work/es.txt" | median)
    ort_med=$(while read -r l; do json_field "$l" median_ms; done <"$work/ort.txt" | median)
    ort_p99=$(while read -r l; do json_field "$l" p99_ms; done <"$work/ort.txt" | median)
    gflop=$(json_field "$(head -1 "$work/es.txt")" gflop)
    awk -v n="$name" -v t="$t" -v em="$es_med" -v ep="$es_p99" -v om="$ort_med" -v op="$ort_p99" \
        -v g="$gflop" -v pk="$peak" 'BEGIN {
      gf = g / (em / 1000); printf "%-6s %3d %11.3f %11.3f %11.3f %11.3f %7.3f %9.1f %5.0f%%\n",
      n, t, em, ep, om, op, em / om, gf, 100 * gf / (pk * t) }'
  done
done
echo "(ratio = edgeserve median / ORT median; ORT: onnxruntime-node, graph optimisation all,"
echo " intra-op threads as shown; $rounds interleaved rounds of $iters runs each)"
