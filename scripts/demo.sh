#!/usr/bin/env bash
# The main job: install what is needed, build, and show what the project does
# today: the five target models run by edgeserve next to ONNX Runtime (same
# inputs, max error, planned arena bytes), then the allocator benchmark in
# its quick form. Extra arguments go to bench-mem, e.g.
#   scripts/demo.sh --ops 10000000        (the full benchmark)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/fetch-models.sh
scripts/ort/install.sh
scripts/build.sh build-release -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF
build-release/edgeserve version
echo
echo "== the target models, edgeserve vs ONNX Runtime"
bash tests/e2e/test_vs_ort.sh build-release/edgeserve "$PWD"
echo
echo "== allocators"
if [ $# -eq 0 ]; then set -- --quick; fi
exec build-release/edgeserve bench-mem "$@"
