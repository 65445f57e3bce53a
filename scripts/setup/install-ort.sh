#!/usr/bin/env bash
# Installs ONNX Runtime for Node.js (the reference engine for correctness
# tests and benchmarks) into .cache/ort, pinned. It ships its own native
# library, so install scripts are not run (--ignore-scripts).
set -euo pipefail
cd "$(dirname "$0")/../.."
version=1.30.0
dir=.cache/ort
if [ -f "$dir/node_modules/onnxruntime-node/package.json" ] &&
   grep -q "\"version\": \"$version\"" "$dir/node_modules/onnxruntime-node/package.json"; then
  exit 0
fi
command -v npm >/dev/null || { echo "ort: npm is needed (apt-get install npm)" >&2; exit 1; }
mkdir -p "$dir"
echo "ort: installing onnxruntime-node@$version"
npm install --prefix "$dir" --ignore-scripts --no-audit --no-fund --no-package-lock \
  --silent "onnxruntime-node@$version"
