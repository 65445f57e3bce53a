#!/usr/bin/env bash
# torchvision's detectors against ONNX Runtime: SSDlite, Faster R-CNN
# (MobileNet 320), RetinaNet, Keypoint R-CNN and Mask R-CNN, exported with
# their post-processing (thresholds, top-k, NMS, a second stage on the kept
# boxes; If and Loop) by scripts/zoo/export_detectors.py into
# .cache/zoo/detectors, with classification heads calibrated so the test
# image gives real detections.
#
# For each: ORT (scripts/zoo/run_ort.js) and `edgeserve run` on the same
# input; scripts/zoo/det_compare.js then wants the same number of
# detections and, sorted by score, the same labels and every other output
# within 1e-3 of max(1, range). A model edgeserve cannot run yet (inspect
# lists what) is "not supported yet", listed, not a failure; one it runs
# and gets wrong, or that fails to run, fails the test. Latencies (median
# of the runs after the first) are printed, never asserted.
#
# Exit 77 (skipped) when node, ONNX Runtime or the exports are missing.
#   test_detectors.sh EDGESERVE_BINARY SOURCE_DIR
set -uo pipefail
es=$1
src=$2
dir=${ES_DETECTOR_DIR:-$src/.cache/zoo/detectors}
manifest=$dir/manifest.json
runs=${ES_DETECTOR_RUNS:-3}

command -v node >/dev/null || { echo "test_detectors: 'node' is missing: skipped"; exit 77; }
node -e "require('$src/.cache/ort/node_modules/onnxruntime-node')" 2>/dev/null ||
  { echo "test_detectors: onnxruntime-node missing (scripts/setup/install-ort.sh): skipped"; exit 77; }
[ -f "$manifest" ] ||
  { echo "test_detectors: no exports in $dir (scripts/zoo/export.sh makes them): skipped"; exit 77; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
models=$(node -e 'const m = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
  for (const x of m.models) if (x.file) console.log(x.name, x.file, x.input, x.input_file)' "$manifest")
[ -n "$models" ] || { echo "test_detectors: the manifest lists no models: skipped"; exit 77; }

n_fail=0 n_ok=0 n_unsup=0
printf '# %-40s %6s %10s %10s %7s\n' model dets "es ms" "ort ms" ratio
while read -r name file input infile; do
  model=$dir/$file
  if ! "$es" inspect "$model" >"$work/$name.inspect" 2>&1; then
    if grep -q '^cannot run:' "$work/$name.inspect"; then
      echo "# $name: not supported yet: $(sed -n '/^cannot run:/{n;p}' "$work/$name.inspect" | sed 's/^ *//')"
      n_unsup=$((n_unsup + 1))
      continue
    fi
    echo "not ok - $name: inspect failed"
    sed 's/^/#   /' "$work/$name.inspect" | tail -5
    n_fail=$((n_fail + 1))
    continue
  fi
  if ! node "$src/scripts/zoo/run_ort.js" "$model" "$dir/$infile" "$work/$name.ort" \
      --repeat "$runs" --json >"$work/$name.ortjson" 2>"$work/$name.orterr"; then
    echo "not ok - $name: ONNX Runtime failed"
    sed 's/^/#   /' "$work/$name.orterr" | tail -5
    n_fail=$((n_fail + 1))
    continue
  fi
  if ! "$es" run "$model" --input "$input=$dir/$infile" --output-dir "$work/$name.es" \
      --repeat "$runs" >"$work/$name.run" 2>&1; then
    echo "not ok - $name: edgeserve run failed"
    sed 's/^/#   /' "$work/$name.run" | tail -5
    n_fail=$((n_fail + 1))
    continue
  fi
  es_ms=$(sed -n 's/^latency ms: median \([0-9.]*\).*/\1/p' "$work/$name.run")
  ort_ms=$(node -e 'console.log(JSON.parse(require("fs").readFileSync(process.argv[1])).median_ms.toFixed(3))' \
    "$work/$name.ortjson")
  cmp=$(node "$src/scripts/zoo/det_compare.js" "$work/$name.ort" "$work/$name.es")
  rc=$?
  dets=$(echo "$cmp" | sed -n 's/^detections: \([0-9]*\).*/\1/p')
  printf '# %-40s %6s %10s %10s %7s\n' "$name" "$dets" "$es_ms" "$ort_ms" \
    "$(node -e "console.log((${es_ms:-0} / ${ort_ms:-1}).toFixed(3))")"
  echo "$cmp" | sed 's/^/#   /'
  if [ "$rc" = 0 ] && [ "${dets:-0}" -gt 0 ]; then
    echo "ok - $name matches ONNX Runtime ($dets detections)"
    n_ok=$((n_ok + 1))
  else
    echo "not ok - $name differs from ONNX Runtime"
    n_fail=$((n_fail + 1))
  fi
done <<<"$models"
echo "# detectors: $n_ok match, $n_fail failed, $n_unsup not supported yet"
[ "$n_fail" = 0 ] && [ "$n_ok" -gt 0 ]
