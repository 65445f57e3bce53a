#!/usr/bin/env bash
# serve --mlock, end to end, on the target models: the server locks every
# model's weights and prepared weights in RAM, /metrics reports the bytes
# (edgeserve_weights_locked_bytes), and they equal what the kernel says the
# process has locked (VmLck); without CAP_IPC_LOCK and under a 64 KiB
# RLIMIT_MEMLOCK the server does not start: it exits 1 with a message that
# names the model, RLIMIT_MEMLOCK and the fix. Skipped (77) without node,
# curl or setpriv, or where dropping the capability does not take.
#   test_server_mlock.sh EDGESERVE_BINARY SOURCE_DIR
set -uo pipefail
es=$1
src=$2
export ES_MODEL_DIR=${ES_MODEL_DIR:-$src/.cache/models}
# shellcheck source=serve_lib.sh
. "$(dirname "$0")/serve_lib.sh"
serve_begin test_server_mlock
command -v setpriv >/dev/null || { echo "test_server_mlock: setpriv is missing: skipped"; exit 77; }
[ -f "$ES_MODEL_DIR/ppocr_det.onnx" ] || { echo "test_server_mlock: models missing (scripts/setup/fetch-models.sh)"; exit 1; }

# 1. Locked, and counted as the kernel counts it.
"$es" serve --port 0 --mlock 2>"$work/err" >/dev/null &
pid=$!
await_server mlock "$pid" "$work/err" || exit 1
locked=$(curl -s "$url/metrics" | awk '$1 == "edgeserve_weights_locked_bytes" { print $2 }')
vmlck=$(awk '/^VmLck:/ { print $2 * 1024 }' "/proc/$pid/status")
echo "# locked: metrics $locked B, VmLck $vmlck B"
check "metrics report locked weights" test "${locked:-0}" -gt 1000000
check "the metric equals the kernel's VmLck" test "${locked:-0}" = "$vmlck"
kill -TERM "$pid"
wait "$pid" 2>/dev/null
pid=

# 2. Too low a limit: refused at start, with the reason.
cat >"$work/low.sh" <<EOS
ulimit -l 64 || exit 99
grep -q '^CapEff:.*' /proc/self/status
cap=\$(awk '/^CapEff:/ { print \$2 }' /proc/self/status)
# CAP_IPC_LOCK is bit 14
[ \$(( 0x\$cap >> 14 & 1 )) -eq 0 ] || exit 98
exec "$es" serve --port 0 --mlock
EOS
timeout 120 setpriv --bounding-set=-ipc_lock bash "$work/low.sh" >"$work/low.out" 2>"$work/low.err"
rc=$?
if [ $rc -eq 98 ] || [ $rc -eq 99 ]; then
  echo "test_server_mlock: cannot drop CAP_IPC_LOCK or lower RLIMIT_MEMLOCK here: skipped"
  exit 77
fi
check "too low a limit: exit 1 (got $rc)" test $rc -eq 1
check "the message names the model, the limit and the fix" \
  grep -q "mlock: model '.*' cannot be locked in RAM: .*RLIMIT_MEMLOCK soft limit is 65536 B.*LimitMEMLOCK" "$work/low.err"
sed 's/^/#   /' "$work/low.err"
grep -q 'serving' "$work/low.err" && notok "it said it was serving"

[ $n_fail -eq 0 ] && echo "test_server_mlock: ok"
exit $((n_fail > 0))
