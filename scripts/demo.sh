#!/usr/bin/env bash
# The main job: install what is needed, build, and show what the project does
# today (the allocator benchmark in its quick form). Extra arguments go to
# bench-mem, e.g. scripts/demo.sh --ops 10000000 for the full run.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh build -DCMAKE_BUILD_TYPE=Release
build/edgeserve version
if [ $# -eq 0 ]; then set -- --quick; fi
exec build/edgeserve bench-mem "$@"
