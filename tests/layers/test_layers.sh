#!/usr/bin/env bash
# The layer check passes on the tree, and fails on copies of it with a
# back-edge added: a kernel including the engine, the loader including a
# kernel header, common including the memory layer.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../../src" && pwd)
check="$here/check_layers.sh"

"$check" "$src" || { echo "FAIL: the tree breaks the layer table"; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
# back_edge FILE INCLUDE: a copy of src/ with the include added to FILE must fail.
back_edge() {
  rm -rf "$tmp/src"
  cp -r "$src" "$tmp/src"
  printf '#include "%s"\n' "$2" >>"$tmp/src/$1"
  out=$("$check" "$tmp/src" 2>&1)
  if [ $? -eq 0 ] || ! grep -q "^$1:.*$2" <<<"$out"; then
    echo "FAIL: $1 including $2 was not caught:"
    echo "$out"
    fail=1
  else
    echo "caught: $(grep "^$1:" <<<"$out")"
  fi
}
back_edge kernels/conv.c engine/engine_internal.h
back_edge model/onnx.c kernels/kernel.h
back_edge common/op.c memory/ctx.h
back_edge memory/arena.c edgeserve/runtime.h
back_edge engine/plan.c server/codec.h
exit $fail
