#!/usr/bin/env bash
# Load time against graph size: chains built in memory (Relu on [1,16]
# fused and unfused, Transpose on [4,4]) of 20,000, 40,000 and 80,000 nodes,
# then Relu chains of the sizes given (200,000 by default), each loaded and
# planned as es_model_load and a first es_model_plan do (parse, graph build,
# topological sort, pruning, folding, fusion, shape inference, sealing,
# planning). Prints wall and CPU seconds and the growth ratios (linear: 2
# and 4; quadratic: 4 and 16). It is tests/model/test_load_scale.c on a
# release build.
#   scripts/bench/bench_load.sh [NODES[,NODES...]]
set -euo pipefail
cd "$(dirname "$0")/../.."
nodes=${1:-200000}
dir=${ES_BUILD_DIR:-build-release}
[ -f "$dir/CMakeCache.txt" ] || cmake -S . -B "$dir" -DES_WERROR=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$dir" -j"$(nproc)" --target test_load_scale >/dev/null
ES_LOAD_SCALE_NODES=$nodes "$dir/tests/test_load_scale" | sed -n 's/^# //p'
