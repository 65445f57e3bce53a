#!/usr/bin/env bash
# The install, as a user of the library and the service meets it:
# `cmake --install` into a fresh prefix puts the CLI, the fetch command,
# the static and the shared library (versioned SONAME), the headers, the
# pkg-config file, the man page, the service unit and the config there; the
# shared library exports exactly the functions the public headers mark
# ES_API; examples/run_model.c compiles against the installed files through
# pkg-config, linked shared and static, and runs a real model; the man page
# formats without a warning; the unit passes `systemd-analyze verify`
# (any message fails: unknown settings are only warnings to it).
#   test_install.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$1
src=$2
# ok / notok / check and the failure count (no server here: serve_begin is
# not called).
# shellcheck source=serve_lib.sh
. "$(dirname "$0")/serve_lib.sh"
for need in cc pkg-config nm objdump; do
  command -v $need >/dev/null || { echo "test_install: '$need' is missing: skipped"; exit 77; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

cmake --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1 ||
  { notok "cmake --install"; sed 's/^/#   /' "$work/install.log"; exit 1; }
ok "cmake --install into a new prefix"
libdir=$(dirname "$(find "$prefix" -name libedgeserve.so.0 | head -n 1)")
for f in bin/edgeserve bin/edgeserve-fetch-models include/edgeserve/server.h \
         include/edgeserve/engine.h share/man/man1/edgeserve.1 \
         lib/systemd/system/edgeserve.service etc/edgeserve/config.json; do
  check "installed: $f" test -e "$prefix/$f"
done
check "installed: the static library" test -f "$libdir/libedgeserve.a"
check "installed: the pkg-config file" test -f "$libdir/pkgconfig/edgeserve.pc"
check "the fetch command runs (--help)" sh -c "'$prefix/bin/edgeserve-fetch-models' --help >/dev/null"
check "the installed config is JSON the server reads" \
  sh -c "'$prefix/bin/edgeserve' serve --config '$prefix/etc/edgeserve/config.json' --help >/dev/null"

soname=$(objdump -p "$libdir/libedgeserve.so.0" | awk '$1 == "SONAME" { print $2 }')
check "SONAME is libedgeserve.so.0 (got '$soname')" test "$soname" = libedgeserve.so.0
check "libedgeserve.so links to the SONAME" test "$(readlink "$libdir/libedgeserve.so")" = libedgeserve.so.0

# Exports against the headers: every ES_API function, and nothing else.
nm -D --defined-only "$libdir/libedgeserve.so.0" | awk '$2 ~ /^[TtDdBbRrVWi]$/ { print $3 }' |
  sort -u >"$work/exported"
grep -h '^ES_API' "$prefix"/include/edgeserve/*.h | sed -E 's/\(.*//; s/.*[ *]//' | sort -u >"$work/declared"
extra=$(comm -23 "$work/exported" "$work/declared")
missing=$(comm -13 "$work/exported" "$work/declared")
echo "# exported $(wc -l <"$work/exported"), declared ES_API $(wc -l <"$work/declared")"
check "no symbol exported beyond the public API${extra:+: $(echo $extra)}" test -z "$extra"
check "every public function is exported${missing:+: missing $(echo $missing)}" test -z "$missing"
check "more than 150 public functions (the parse saw the headers)" test "$(wc -l <"$work/declared")" -gt 150

# A program against the installed files, found through pkg-config only.
export PKG_CONFIG_PATH=$libdir/pkgconfig
pc() { pkg-config --define-variable=prefix="$prefix" "$@" edgeserve; }
check "pkg-config knows the version" test "$(pc --modversion)" = "$(sed -n 's/^project(edgeserve VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")"
# shellcheck disable=SC2046
check "run_model.c compiles and links against the shared library" \
  cc -std=c11 -Wall -Werror "$src/examples/run_model.c" $(pc --cflags --libs) -o "$work/run_shared"
# shellcheck disable=SC2046
check "run_model.c links the static library (pkg-config --static)" \
  cc -std=c11 -Wall -Werror "$src/examples/run_model.c" $(pc --cflags) -static-libgcc \
  "$libdir/libedgeserve.a" $(pc --static --libs-only-l | sed 's/-ledgeserve//') -o "$work/run_static"
check "the shared build needs libedgeserve.so.0" \
  sh -c "objdump -p '$work/run_shared' | grep -q 'NEEDED *libedgeserve.so.0'"
check "the static build does not" \
  sh -c "! objdump -p '$work/run_static' | grep -q 'libedgeserve'"
model=$src/.cache/models/ppocr_cls.onnx
if [ -f "$model" ]; then
  LD_LIBRARY_PATH=$libdir "$work/run_shared" "$model" 1 48 192 >"$work/out_shared" 2>&1
  check "the shared program runs the cls model" grep -q '^output .*float32 \[1,2\]' "$work/out_shared"
  "$work/run_static" "$model" 1 48 192 >"$work/out_static" 2>&1
  check "the static program prints the same" cmp -s "$work/out_shared" "$work/out_static"
  sed 's/^/#   /' "$work/out_shared"
  LD_LIBRARY_PATH=$libdir "$work/run_shared" "$work/nothing.onnx" >"$work/out_bad" 2>&1
  check "a missing model is an error with its reason, exit 1" \
    sh -c "[ $? -eq 1 ] && grep -q nothing.onnx '$work/out_bad'"
else
  notok "models missing (scripts/setup/fetch-models.sh)"
fi

if command -v groff >/dev/null; then
  groff -man -Tutf8 -ww -z "$prefix/share/man/man1/edgeserve.1" >"$work/groff" 2>&1
  check "the man page formats without warnings" test ! -s "$work/groff"
  sed 's/^/#   /' "$work/groff"
else
  echo "# groff missing: the man page is not formatted"
fi

if command -v systemd-analyze >/dev/null; then
  unit=$work/unit/edgeserve.service
  mkdir -p "$work/unit"
  # The unit names the binary where the package puts it; here, the prefix's.
  sed -E "s#^ExecStart=[^ ]*/edgeserve #ExecStart=$prefix/bin/edgeserve #" \
    "$prefix/lib/systemd/system/edgeserve.service" >"$unit"
  systemd-analyze verify --man=no "$unit" >"$work/verify" 2>&1
  rc=$?
  check "systemd-analyze verify: exit 0 and no message" sh -c "[ $rc -eq 0 ] && [ ! -s '$work/verify' ]"
  sed 's/^/#   /' "$work/verify"
  check "the unit is Type=notify with a watchdog" sh -c "grep -q '^Type=notify' '$unit' && grep -q '^WatchdogSec=' '$unit'"
  check "the unit bounds memory (MemoryHigh, MemoryMax) and allows mlock (LimitMEMLOCK)" \
    sh -c "grep -q '^MemoryHigh=' '$unit' && grep -q '^MemoryMax=' '$unit' && grep -q '^LimitMEMLOCK=' '$unit'"
  # The checker itself: a setting it must reject.
  sed 's/^Type=notify/Type=notifyy/' "$unit" >"$work/unit/bad.service"
  systemd-analyze verify --man=no "$work/unit/bad.service" >"$work/verify_bad" 2>&1
  check "the check fails a broken unit" test -s "$work/verify_bad"
else
  echo "# systemd-analyze missing: the unit is not verified"
fi

echo "# $n_fail failed"
[ $n_fail -eq 0 ]
