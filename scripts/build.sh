#!/usr/bin/env bash
# Configures and builds one flavour of the tree.
#   scripts/build.sh DIR [cmake options...]
set -euo pipefail
dir=$1
shift
cmake -S . -B "$dir" -DES_WERROR=ON "$@" >/dev/null
cmake --build "$dir" -j"$(nproc)"
