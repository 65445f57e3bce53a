#!/usr/bin/env bash
# Internal names are not API: in the library archive, every defined global
# symbol is either public (an es_* function declared in include/edgeserve/,
# exported with default visibility) or internal (es__*, hidden); nothing
# else is global but the ONNX schema's generated code (onnx__*, hidden).
#
#   tests/layers/check_api.sh LIBEDGESERVE.a INCLUDE_DIR
set -uo pipefail
lib=$1
inc=$2
pub=$(mktemp)
trap 'rm -f "$pub"' EXIT
# public functions: es_name( in the public headers, comments stripped
perl -0777 -pe 's#/\*.*?\*/##gs' "$inc"/edgeserve/*.h | grep -oE '\bes_[a-z0-9_]+[[:space:]]*\(' |
  sed -E 's/[[:space:](]//g' | grep -v '^es__' | sort -u >"$pub"

readelf -sW "$lib" | awk -v pubfile="$pub" '
BEGIN { while ((getline l < pubfile) > 0) pub[l] = 1; bad = 0; n = 0 }
/^File: / { obj = $2; next }
# Names that start with two underscores belong to the toolchain (sanitizer
# instrumentation, such as the ASan __odr_asan.* indicators), not to us.
$5 == "GLOBAL" && $7 != "UND" && ($4 == "FUNC" || $4 == "OBJECT") && $8 !~ /^__/ {
  name = $8; vis = $6; n++
  if (name ~ /^es__/) {
    if (vis != "HIDDEN") { print obj ": internal " name " is exported (" vis ")"; bad++ }
  } else if (name ~ /^es_/) {
    if (!(name in pub)) { print obj ": " name " has the public prefix but no public declaration (rename it es__" substr(name, 4) ")"; bad++ }
    else if (vis != "DEFAULT") { print obj ": public " name " is hidden (ES_API missing)"; bad++ }
    seen[name] = 1
  } else if (name ~ /^onnx__/) {
    if (vis != "HIDDEN") { print obj ": generated " name " is exported"; bad++ }
  } else {
    print obj ": global " name " has no es_ / es__ prefix"; bad++
  }
}
END {
  for (p in pub) if (!(p in seen)) { print "declared but not defined: " p; bad++ }
  if (bad) { print "API check: " bad " problem(s) among " n " global symbols"; exit 1 }
  print "API check: " n " global symbols, public ones declared and exported, the rest hidden"
}'
