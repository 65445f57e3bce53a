#!/usr/bin/env bash
# `edgeserve serve` against hostile clients, over real sockets.
#
# The client is es_hostile (tests/e2e/hostile.c): one epoll loop holding
# thousands of sockets, each bound to a loopback source address
# 127.0.x.y before connect, 8 per address, so that the server's per-client
# connection cap (16 here) never refuses the test's own load. Two servers,
# each serving blazeface_front and the face pipeline only (fast to start,
# also under ASan):
#   1. "flood" (default phase timeouts): 1000 clients at once, each posting
#      infer requests in a closed loop for 10 s (binary and JSON tensors to
#      blazeface_front, a JPEG to the face pipeline). Every answer must be
#      200, 429 or 503, every 429/503 must carry Retry-After, no connection
#      may be reset or cut, every request is answered within 60 s (120 s
#      under ASan: a generous bound, not a timing check).
#   2. "hostile" (header_timeout_s 2, idle_timeout_s 2, body_timeout_s 3,
#      max_body_bytes 512M, max_buffered_bytes 256M):
#      - hold: 334 idle, 333 slowloris (a header line a second, never
#        finished) and 333 trickle (Content-Length 64 MiB, a byte a second)
#        sockets, reopened when closed, for 8 s; health and a small infer
#        on fresh connections every 0.25 s must all answer 200 within 2 s
#        (latencies printed beside a baseline taken before); each kind must
#        be closed by the server within its phase limit + 3 s, and none
#        before half of it (held, not refused);
#      - cap: 16 keep-alive connections from one address answer 200, 8 more
#        from it are refused (closed, or 429/503) while another address is
#        served and the 16 keep working; once they close it is served again;
#      - refuse: Content-Length 600,000,000 (above max_body_bytes) is
#        answered 413 within 2 s without a body byte sent; Content-Length
#        300,000,000 (above max_buffered_bytes: it could never be admitted)
#        is refused (413, or 503 with Retry-After) within 2 s likewise;
#      then the server still answers, and SIGTERM gives exit 0;
#   3. charge, on a server of its own with the default body limit: 4 uploads
#      announcing 64 MiB each (the whole 256M buffered budget if charged as
#      announced) stay open while 10 small infers run: each must get 200
#      (bytes are charged as they arrive).
# A server that does not know a config key refuses to start ("unknown
# field"): that is a failure, and the test then runs the rest against the
# same config without the new keys (connection_timeout_s for the idle limit)
# so that the other checks still report their numbers.
# Every server's stderr is checked for sanitizer reports (ASAN_OPTIONS as
# test_server.sh). Prints "ok - ..." / "not ok - ..." per check (the numbers
# are in the lines and in "# ..." lines); exits 1 if any failed, 77 when a
# tool or the models are missing.
#   test_server_hostile.sh EDGESERVE_BINARY ES_HOSTILE_BINARY SOURCE_DIR
set -uo pipefail
es=$1
hostile=$2
src=$3
models=${ES_MODEL_DIR:-$src/.cache/models}
imgdir=${ES_IMAGE_DIR:-$src/.cache/images}
work=$(mktemp -d)
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
# An answer must come within this many seconds (a flood under ASan on two
# busy cores took up to 47 s per answer with thread-per-connection).
answer_s=60
grep -qa __asan_init "$es" && answer_s=120
t_start=$(date +%s)

declare -A servers # pid -> 1 while it is ours and not yet reaped
cleanup() {
  for p in "${!servers[@]}"; do
    kill -KILL "$p" 2>/dev/null
  done
  rm -rf "$work"
}
trap cleanup EXIT

command -v curl >/dev/null ||
  { echo "test_server_hostile: 'curl' is missing (scripts/setup/deps.sh installs it): skipped"; exit 77; }
[ -x "$hostile" ] || { echo "test_server_hostile: no client binary '$hostile'"; exit 1; }
[ -f "$models/blazeface_front_128.onnx" ] ||
  { echo "test_server_hostile: models missing (scripts/setup/fetch-models.sh): skipped"; exit 77; }
models=$(cd "$models" && pwd)

n_ok=0
n_fail=0
n_skip=0
ok() { echo "ok - $*"; n_ok=$((n_ok + 1)); }
skipped() { echo "# skipped: $*"; n_skip=$((n_skip + 1)); }
notok() { echo "not ok - $*"; n_fail=$((n_fail + 1)); }

# hostile DESC ARGS...: run the client against $port, echo its lines, count
# its checks; exit status 2 is the client failing to run at all.
hostile() {
  local desc=$1 st
  shift
  "$hostile" "$@" --port "$port" >"$work/h.out" 2>&1
  st=$?
  cat "$work/h.out"
  n_ok=$((n_ok + $(grep -c '^ok - ' "$work/h.out")))
  n_fail=$((n_fail + $(grep -c '^not ok - ' "$work/h.out")))
  if [ $st -ne 0 ] && ! grep -q '^not ok - ' "$work/h.out"; then
    notok "$desc: the client exited with status $st"
  fi
}

# ---- servers ------------------------------------------------------------------

source "$(dirname "$0")/serve_lib.sh"

# config FILE EXTRA_JSON_FIELDS: the served models (blazeface_front and the
# face pipeline) and the given fields.
config() {
  cat >"$1" <<EOF
{$2
 "models": {"blazeface_front": {"path": "$models/blazeface_front_128.onnx", "priority": 1},
            "face": {"pipeline": "face", "model": "blazeface_front", "priority": 1}}}
EOF
}

# start_server NAME NEW_FIELDS OLD_FIELDS: sets port and spid, or returns 1.
# NEW_FIELDS are the hardening keys; when the server refuses them as
# unknown, that fails and the server is started with OLD_FIELDS instead.
start_server() {
  local name=$1 new=$2 old=$3
  config "$work/$name.json" "$new"
  "$es" serve --quiet --port 0 --config "$work/$name.json" 2>"$work/$name.err" &
  spid=$!
  servers[$spid]=1
  if ! await_server "$name" "$spid" "$work/$name.err" >"$work/await.out"; then
    if grep -q 'unknown field' "$work/$name.err"; then
      n_fail=$((n_fail - 1)) # await_server's "not ok" is replaced by this one
      notok "server '$name' takes its config: $(grep -o 'unknown field.*' "$work/$name.err" | head -1); the rest runs with {${old%,}}"
      unset "servers[$spid]"
      wait "$spid" 2>/dev/null
      config "$work/$name.json" "$old"
      "$es" serve --quiet --port 0 --config "$work/$name.json" 2>"$work/$name.err" &
      spid=$!
      servers[$spid]=1
      await_server "$name" "$spid" "$work/$name.err" || return 1
    else
      cat "$work/await.out"
      return 1
    fi
  fi
  port=${url##*:}
  ok "server '$name' started on port $port (pid $spid): $(grep '^edgeserve: serving' "$work/$name.err")"
  local nofile
  nofile=$(awk '/^Max open files/ {print $4}' "/proc/$spid/limits" 2>/dev/null)
  echo "# server '$name': open-files limit $nofile"
  if [[ $nofile =~ ^[0-9]+$ ]] && [ "$nofile" -lt 1100 ]; then
    notok "server '$name': open-files limit $nofile is below the 1000+ connections of this test (serve should raise its soft limit)"
  fi
}

# stop_server NAME: SIGTERM, exit 0 within 30 s, no sanitizer report.
stop_server() {
  local name=$1 i st=255
  kill -TERM "$spid" 2>/dev/null
  for ((i = 0; i < 300; i++)); do
    st=$(ps -o stat= -p "$spid" 2>/dev/null)
    if [ -z "$st" ] || [[ $st == Z* ]]; then
      wait "$spid"
      st=$?
      unset "servers[$spid]"
      break
    fi
    st=255
    sleep 0.1
  done
  [ "$st" = 0 ] && ok "server '$name': SIGTERM, exit 0" ||
    notok "server '$name': SIGTERM gave exit $st (255: still running after 30 s): $(tail -3 "$work/$name.err")"
  if grep -Eq 'AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer|runtime error:' "$work/$name.err"; then
    notok "server '$name': sanitizer report on stderr:"
    grep -E -A30 'Sanitizer|runtime error:' "$work/$name.err" | head -60 | sed 's/^/#   /'
  else
    ok "server '$name': no sanitizer report"
  fi
}

face=()
if [ -f "$imgdir/astronaut.png" ]; then
  face=(--req "face-jpeg:$imgdir/astronaut.png")
else
  skipped "face pipeline in the flood (no test images; scripts/setup/fetch-images.sh)"
fi

# ---- 1. flood -------------------------------------------------------------------

common='"max_connections": 4096,'
if start_server flood "$common \"max_connections_per_client\": 16," "$common"; then
  hostile flood flood --src 127.0.1.1 --per-addr 8 --clients 1000 --seconds 10 \
    --timeout $answer_s --drain $answer_s --req front --req front-json "${face[@]}"
  [ "$(curl -s -m 10 -o /dev/null -w '%{http_code}' "$url/v2/health/ready")" = 200 ] &&
    ok "flood: the server still answers" || notok "flood: the server no longer answers"
  stop_server flood
fi

# ---- 2. idle, slowloris and trickle sockets; the cap; refusals; charging --------

limits='"header_timeout_s": 2, "idle_timeout_s": 2, "body_timeout_s": 3, "max_connections_per_client": 16,'
sizes='"max_body_bytes": "512M", "max_buffered_bytes": "256M",'
if start_server hostile "$common $sizes $limits" "$common $sizes \"connection_timeout_s\": 2,"; then
  hostile hold hold --src 127.0.4.1 --per-addr 8 --idle 334 --slowloris 333 --trickle 333 \
    --seconds 8 --interval 1 --limit-idle 2 --limit-header 2 --limit-body 3 --slack 3 \
    --probe-every 0.25 --probe-limit 2 --baseline 10
  hostile cap cap --src 127.0.8.1 --cap 16 --extra 8
  hostile refuse refuse --src 127.0.9.1 --content-length 600000000 --accept 413 --seconds 2
  hostile refuse refuse --src 127.0.9.1 --content-length 300000000 --accept 413,503 --seconds 2
  [ "$(curl -s -m 10 -o /dev/null -w '%{http_code}' "$url/v2/health/ready")" = 200 ] &&
    ok "hostile: the server still answers" || notok "hostile: the server no longer answers"
  stop_server hostile
fi
# The charge check on a server of its own with the default body limit (60 s):
# on a slow machine the probes beside the uploads can outlast the 3 s limit
# above, which then closes the uploads the probes were to be tested against.
if start_server charge "$common $sizes" "$common $sizes"; then
  hostile charge charge --src 127.0.9.10 --trickle 4 --probes 10 --interval 0.5
  stop_server charge
fi

echo "# $n_ok ok, $n_fail failed, $n_skip skipped in $(($(date +%s) - t_start)) s"
[ $n_fail -eq 0 ] || exit 1
[ $n_skip -eq 0 ] || exit 77
exit 0
