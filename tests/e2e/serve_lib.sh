# Sourced by the end-to-end server tests.
#   ok / notok DESCRIPTION: print a TAP-like line; notok counts n_fail.
#   check DESCRIPTION COMMAND...: ok when the command succeeds, else notok.
#   A test that defined its own before sourcing keeps them (and its count).
#   serve_begin NAME: exits 77 (skipped) when node or curl is missing; else
#   makes $work, a folder removed at exit, where a server whose pid the test
#   keeps in $pid is killed first, and sets ASan's defaults for the server.
#   await_server NAME PID ERRFILE: waits for an `edgeserve serve --port 0`
#   process to say where it listens and to be ready; sets url; returns 1
#   (after printing the server's stderr as a "not ok" line) when it never
#   said it was serving.
n_fail=${n_fail:-0}
serve_begin() {
  local need
  for need in node curl; do
    command -v $need >/dev/null || { echo "$1: '$need' is missing: skipped"; exit 77; }
  done
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
  work=$(mktemp -d)
  pid=
  trap '[ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null; rm -rf "$work"' EXIT
}
declare -F ok >/dev/null || ok() { echo "ok - $*"; }
declare -F notok >/dev/null || notok() { echo "not ok - $*"; n_fail=$((n_fail + 1)); }
declare -F check >/dev/null || check() {
  local what=$1
  shift
  if "$@"; then ok "$what"; else notok "$what"; fi
}

await_server() {
  local name=$1 pid=$2 err=$3 port="" i
  for ((i = 0; i < 1200; i++)); do # 120 s: five models under ASan
    port=$(sed -n 's#^edgeserve: serving [0-9]* models on http://[0-9.]*:\([0-9]*\)/v2.*#\1#p' "$err")
    [ -n "$port" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$port" ]; then
    notok "server '$name' started (no 'serving ... on http://...' line):"
    sed 's/^/#   /' "$err"
    return 1
  fi
  url="http://127.0.0.1:$port"
  for ((i = 0; i < 300; i++)); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/v2/health/ready")" = 200 ] && break
    sleep 0.1
  done
}
