#!/usr/bin/env bash
# serve under systemd's notification protocol (Type=notify), against a
# listener that stands in for the manager (notify_listen.py): READY=1 comes
# once, after the models are loaded (the listener asks /v2/health/ready at
# that moment and gets 200) and carries a STATUS naming the port and a
# MAINPID that is the server's; with WATCHDOG_USEC set, WATCHDOG=1 comes
# every half period while the server answers; without it, none; SIGTERM
# sends STOPPING=1 before the server exits 0; a server that cannot start
# (a broken config) sends a STATUS with the reason and no READY=1. And
# readiness as a balancer sees it: 503 naming a model that failed to load
# at start, 200 again once it is unloaded on purpose.
# Skipped (77) without python3, node or curl.
#   test_server_notify.sh EDGESERVE_BINARY SOURCE_DIR
set -uo pipefail
es=$1
src=$2
export ES_MODEL_DIR=${ES_MODEL_DIR:-$src/.cache/models}
# shellcheck source=serve_lib.sh
. "$(dirname "$0")/serve_lib.sh"
serve_begin test_server_notify
command -v python3 >/dev/null || { echo "test_server_notify: python3 is missing: skipped"; exit 77; }
[ -f "$ES_MODEL_DIR/ppocr_det.onnx" ] || { echo "test_server_notify: models missing (scripts/setup/fetch-models.sh)"; exit 1; }
lpid=
trap '[ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null; [ -n "$lpid" ] && kill "$lpid" 2>/dev/null; rm -rf "$work"' EXIT

# listen NAME: a listener on $work/NAME.sock logging to $work/NAME.log.
listen() {
  [ -n "$lpid" ] && kill "$lpid" 2>/dev/null
  python3 "$(dirname "$0")/notify_listen.py" "$work/$1.sock" "$work/$1.log" &
  lpid=$!
  for _ in $(seq 50); do [ -S "$work/$1.sock" ] && return 0; sleep 0.1; done
  notok "the listener on $1.sock started"
  return 1
}
count() { grep -c " $2\$" "$work/$1.log"; }

# 1. With a watchdog of 2 s: READY once and when ready, pings, STOPPING.
listen wd || exit 1
NOTIFY_SOCKET=$work/wd.sock WATCHDOG_USEC=2000000 "$es" serve --port 0 2>"$work/err" >/dev/null &
pid=$!
await_server notify "$pid" "$work/err" || exit 1
for _ in $(seq 50); do grep -q ' PROBE ' "$work/wd.log" && break; sleep 0.1; done
check "READY=1 sent once" test "$(count wd READY=1)" = 1
check "the server was ready when it said so (PROBE 200)" grep -q ' PROBE 200$' "$work/wd.log"
check "STATUS names the port it serves on" grep -q " STATUS=serving [0-9]* models on 127.0.0.1:${url##*:}," "$work/wd.log"
check "MAINPID is the server's" grep -q " MAINPID=$pid\$" "$work/wd.log"
# Every 1 s: about 4 pings in 4.3 s. A loaded machine (a sanitizer build
# beside other tests) may delay one; twice as many would be a wrong period.
sleep 4.3
pings=$(count wd WATCHDOG=1)
echo "# watchdog pings in ~4.3 s at a 2 s watchdog: $pings"
check "WATCHDOG=1 at about every half period (2 to 8 in 4.3 s)" test "$pings" -ge 2 -a "$pings" -le 8
kill -TERM "$pid"
wait "$pid"
rc=$?
pid=
sleep 0.2
check "SIGTERM: exit 0" test $rc = 0
check "STOPPING=1 sent once" test "$(count wd STOPPING=1)" = 1
check "STOPPING=1 after READY=1" \
  test "$(grep -n ' STOPPING=1$' "$work/wd.log" | cut -d: -f1)" -gt "$(grep -n ' READY=1$' "$work/wd.log" | cut -d: -f1)"
sed 's/^/#   /' "$work/wd.log"

# 2. No watchdog asked for: no pings.
listen nowd || exit 1
NOTIFY_SOCKET=$work/nowd.sock "$es" serve --port 0 2>"$work/err2" >/dev/null &
pid=$!
await_server notify-nowd "$pid" "$work/err2" || exit 1
sleep 1.2
kill -TERM "$pid"
wait "$pid"
pid=
sleep 0.2
check "without WATCHDOG_USEC: READY=1, no WATCHDOG=1" \
  sh -c "[ $(count nowd READY=1) = 1 ] && [ $(count nowd WATCHDOG=1) = 0 ]"

# 3. A server that cannot start says why, and never READY=1.
listen bad || exit 1
echo '{"port": "eighty"}' >"$work/bad.json"
NOTIFY_SOCKET=$work/bad.sock "$es" serve --config "$work/bad.json" --port 0 2>"$work/err3" >/dev/null
rc=$?
sleep 0.3
check "a broken config: exit non-zero ($rc)" test $rc -ne 0
check "it sent a STATUS with the reason" grep -q ' STATUS=not started: .*port' "$work/bad.log"
check "and no READY=1" test "$(count bad READY=1)" = 0
sed 's/^/#   /' "$work/bad.log"

# 4. Readiness for a balancer or Kubernetes: a model the server was to serve
# failed to load, so /v2/health/ready says 503 and names it (live stays
# 200, the loaded model serves); once an operator unloads it on purpose the
# server is ready again.
mkdir -p "$work/repo/cls" "$work/repo/broken"
cp "$ES_MODEL_DIR/ppocr_cls.onnx" "$work/repo/cls/model.onnx"
head -c 4096 "$ES_MODEL_DIR/ppocr_cls.onnx" >"$work/repo/broken/model.onnx" # truncated
token=notify-test-token-$RANDOM$RANDOM
echo "$token" >"$work/token"
"$es" serve --port 0 --model-repository "$work/repo" --repository-control \
  --control-token-file "$work/token" 2>"$work/err4" >/dev/null &
pid=$!
await_server repo "$pid" "$work/err4" || exit 1
code=$(curl -s -o "$work/ready.json" -w '%{http_code}' "$url/v2/health/ready")
echo "# ready: $code $(cat "$work/ready.json")"
check "a model failed to load: ready 503, naming it" \
  sh -c "[ $code = 503 ] && grep -q '\"not_loaded\": *\"broken\"' '$work/ready.json'"
check "live is still 200" \
  test "$(curl -s -o /dev/null -w '%{http_code}' "$url/v2/health/live")" = 200
check "the loaded model is ready" \
  test "$(curl -s -o /dev/null -w '%{http_code}' "$url/v2/models/cls/ready")" = 200
curl -s -o /dev/null -X POST -H "Authorization: Bearer $token" -d '' \
  "$url/v2/repository/models/broken/unload"
check "unloaded on purpose: ready 200 again" \
  test "$(curl -s -o /dev/null -w '%{http_code}' "$url/v2/health/ready")" = 200
kill -TERM "$pid"
wait "$pid"
pid=

echo "# $n_fail failed"
[ $n_fail -eq 0 ]
