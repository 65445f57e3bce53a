#!/usr/bin/env bash
# The layer check: every #include "..." under src/ must point down the
# layer table (README, "Architecture"), never up or sideways.
#
#   tests/layers/check_layers.sh [SRC_DIR]     (default: the tree's src/)
#
# A file's layer is its folder under src/. A quoted include names a file of
# ours by its path under src/ ("kernels/kernel.h") or a public header
# ("edgeserve/engine.h", which belongs to the layer that implements it).
# Prints each include that goes where its layer may not, and exits 1.
set -uo pipefail
src=${1:-"$(cd "$(dirname "$0")/../.." && pwd)/src"}
cd "$src" || exit 2

find . -type f \( -name '*.c' -o -name '*.h' \) | sort | sed 's#^\./##' |
  xargs grep -nHE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' | awk '
BEGIN {
  # layer: the layers it may include (itself always allowed)
  allow["common"] = ""
  allow["memory"] = "common"
  allow["model"] = "common memory"
  allow["kernels"] = "common memory"
  allow["engine"] = "common memory model kernels"
  allow["runtime"] = "common memory engine"
  allow["apps"] = "common memory engine runtime"
  allow["server"] = "common memory engine runtime apps"
  allow["cli"] = "common memory model kernels engine runtime apps server"
  # public header: the layer that implements it
  pub["error.h"] = "common"; pub["types.h"] = "common"; pub["memory.h"] = "memory"
  pub["engine.h"] = "engine"; pub["runtime.h"] = "runtime"; pub["apps.h"] = "apps"
  pub["server.h"] = "server"; pub["quantize.h"] = "engine"
  # generated code: the ONNX schema, for the loader and for the quantizer
  # (the engine layer: it calibrates on the engine and writes ONNX back)
  gen["onnx.pb-c.h"] = "model engine"
  bad = 0; n = 0
}
{
  split($0, f, ":"); file = f[1]; line = f[2]
  split(file, parts, "/"); layer = parts[1]
  match($0, /"[^"]+"/); inc = substr($0, RSTART + 1, RLENGTH - 2)
  n++
  if (!(layer in allow)) { print file ": folder " layer " is not a layer of the table"; bad++; next }
  if (inc ~ /^edgeserve\//) { h = substr(inc, 11); target = (h in pub) ? pub[h] : "" }
  else if (inc ~ /\//) { split(inc, ip, "/"); target = ip[1] }
  else { target = (inc in gen) ? gen[inc] : ""
         if (index(" " target " ", " " layer " ") == 0) { print file ":" line ": includes \"" inc "\", which is no layer'"'"'s header"; bad++ }
         next }
  if (!(target in allow)) { print file ":" line ": includes \"" inc "\", which belongs to no layer"; bad++; next }
  if (target != layer && index(" " allow[layer] " ", " " target " ") == 0) {
    print file ":" line ": " layer " may not include " target " (\"" inc "\")"; bad++
  }
}
END {
  if (bad) { print "layer check: " bad " include(s) against the layer table (" n " checked)"; exit 1 }
  print "layer check: " n " includes follow the layer table"
}'
