#!/usr/bin/env bash
# The five target models against ONNX Runtime on the same inputs.
#
# Deterministic inputs for every model (rec at widths 80, 320 and 1000; det at
# 320x320, 640x640 and 960x640) plus det on an image of rendered text (noise
# gives an all-zero probability map, text does not). Each output must match
# ORT within 1e-3 absolute for probability outputs and 1e-3 of the output's
# range otherwise (scripts/ort/compare.js). Latencies are printed, never
# asserted.
#   test_vs_ort.sh EDGESERVE_BINARY SOURCE_DIR
set -uo pipefail
es=$1
src=$2
models=${ES_MODEL_DIR:-$src/.cache/models}
ort="$src/scripts/ort"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# A missing tool or ONNX Runtime skips the test (exit 77, CTest's SKIP_RETURN_CODE).
for need in node convert; do
  command -v $need >/dev/null ||
    { echo "test_vs_ort: '$need' is missing (scripts/setup/deps.sh installs it): skipped"; exit 77; }
done
[ -f "$models/ppocr_det.onnx" ] || { echo "test_vs_ort: models missing (scripts/setup/fetch-models.sh)"; exit 1; }
node -e "require('$src/.cache/ort/node_modules/onnxruntime-node')" 2>/dev/null ||
  { echo "test_vs_ort: onnxruntime-node missing (scripts/setup/install-ort.sh): skipped"; exit 77; }

node "$ort/make_inputs.js" "$work/in" >/dev/null || exit 1
convert -size 640x640 xc:white -font DejaVu-Sans -fill black \
  -pointsize 36 -annotate +30+80 'edgeserve reads text' \
  -pointsize 24 -annotate +40+180 'Serial 4711-0815 OK' \
  -pointsize 48 -annotate +20+330 'HELLO 2026' \
  -pointsize 18 -annotate +60+450 'the quick brown fox jumps over the lazy dog' \
  -depth 8 "$work/text.ppm" || exit 1
node "$ort/image_npy.js" "$work/text.ppm" "$work/in/ppocr_det_text.npy" || exit 1

cases=(
  "blazeface_front_128 blazeface_front_128"
  "blazeface_back_256 blazeface_back_256"
  "ppocr_cls ppocr_cls"
  "ppocr_rec ppocr_rec_w80"
  "ppocr_rec ppocr_rec_w320"
  "ppocr_rec ppocr_rec_w1000"
  "ppocr_det ppocr_det_320"
  "ppocr_det ppocr_det_960x640"
  "ppocr_det ppocr_det_text"
)
fail=0
printf '%-22s %-8s %14s %12s %10s\n' case result "max abs err" "arena B" "es ms"
for c in "${cases[@]}"; do
  read -r model input <<<"$c"
  if ! "$es" run "$models/$model.onnx" "$work/in/$input.npy" --output-dir "$work/es/$input" \
       >"$work/es.log" 2>&1; then
    echo "FAIL $input: edgeserve run failed:"; cat "$work/es.log"; fail=1; continue
  fi
  if ! node "$ort/ort_run.js" "$models/$model.onnx" "$work/ort/$input" "$work/in/$input.npy" \
       >"$work/ort.log" 2>&1; then
    echo "FAIL $input: ORT failed:"; cat "$work/ort.log"; fail=1; continue
  fi
  if node "$ort/compare.js" "$work/es/$input" "$work/ort/$input" >"$work/cmp.log" 2>&1; then
    res=ok
  else
    res=FAIL; fail=1
  fi
  err=$(grep -o 'max abs err [^,]*' "$work/cmp.log" | awk '{print $4}' | sort -g | tail -1)
  arena=$(awk '/planned arena bytes/ {print $4}' "$work/es.log")
  ms=$(awk '/latency ms/ {print $4}' "$work/es.log")
  printf '%-22s %-8s %14s %12s %10s\n' "$input" "$res" "$err" "$arena" "$ms"
  [ $res = ok ] || cat "$work/cmp.log"
done
if [ $fail -eq 0 ]; then echo "all outputs match ONNX Runtime"; else echo "some outputs differ"; fi
exit $fail
