#!/usr/bin/env bash
# Builds deploy/Containerfile with podman and runs the image for real, on a
# machine with no image registry. Not part of CI: a base root, an image
# build (4 minutes on 2 cores) and three containers.
#
#   1. podman and runc (and debootstrap) are installed with apt when missing;
#   2. the base: debian:bookworm-slim cannot be pulled without a registry,
#      so a local stand-in is made once, a debootstrap --variant=minbase
#      bookworm root from this machine's own apt mirror (read from
#      /etc/apt/sources.list and sources.list.d, as scripts/fresh-check.sh
#      does), with this machine's apt settings (apt.conf.d), imported with
#      podman and tagged docker.io/library/debian:bookworm-slim, the name
#      the Containerfile's FROM resolves to: the Containerfile is unchanged.
#      Kept in podman's storage for the next run (--rebuild-base remakes it);
#   3. podman build (the default, model-less image; with --fetch also the
#      fetch variant);
#   4. runs, each as the image's non-root user with a read-only root, all
#      capabilities dropped, no new privileges and a 1 GiB memory limit (as
#      the Kubernetes manifests have it), on the host's network:
#      a. the default CMD with the target models mounted read-only at
#         /models: /v2/health/live and ready, the models' readiness, one
#         inference (ppocr_cls on a constant 1x3x48x192 input: 200 and two
#         probabilities), /metrics, the memory budget taken from the
#         container's cgroup limit (--memory auto; the budget must be below
#         the limit), then `podman stop` (SIGTERM): exit 0 with the
#         server's drain report;
#      b. a model repository at /mnt/models, as KServe's storage initializer
#         lays it out (one sub-folder per model with a config.json),
#         served with the ServingRuntime's args: ready, and an inference;
#      c. an empty model folder: the entrypoint must stop with exit 1 and
#         say why (the image without npm cannot fetch);
#      d. with --fetch: the fetch variant with an empty writable /models
#         fetches the models with npm at start and serves them (it uses
#         this machine's npm settings and CA bundle, mounted read-only).
# Prints "ok - ..." / "not ok - ..." per check; exits 1 if any failed.
#
#   scripts/container-check.sh [--rebuild-base] [--fetch] [--keep] [--mirror URI]
# --keep: leave the images (the base is always kept). Needs root, and the
# models fetched (scripts/setup/fetch-models.sh, into .cache/models or
# $ES_MODEL_DIR).
#
# This machine's quirks, handled here rather than in the image: crun cannot
# run on a hybrid (v1 + v2) cgroup layout, so runc is used whenever
# /sys/fs/cgroup is not a pure cgroup2 mount; podman's default rlimits
# (nproc, nofile above the current hard limit) cannot be set without
# CAP_SYS_RESOURCE, so explicit lower ones are given; the containers use the
# host's network (port 8080 must be free, or --port moves it), so that no
# bridge or firewall rule is set up on this machine.
set -uo pipefail
cd "$(dirname "$0")/.."
src=$PWD

rebuild_base=0 fetch=0 keep=0 mirror="" port=8080
while [ $# -gt 0 ]; do
  case $1 in
    --rebuild-base) rebuild_base=1; shift ;;
    --fetch) fetch=1; shift ;;
    --keep) keep=1; shift ;;
    --mirror) mirror=${2:?--mirror needs a URI}; shift 2 ;;
    --port) port=${2:?--port needs a number}; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "container-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" -eq 0 ] || { echo "container-check: needs root (podman, debootstrap)" >&2; exit 2; }
models=${ES_MODEL_DIR:-$src/.cache/models}
[ -f "$models/ppocr_cls.onnx" ] ||
  { echo "container-check: models missing in $models (scripts/setup/fetch-models.sh)" >&2; exit 2; }
models=$(cd "$models" && pwd)

base=docker.io/library/debian:bookworm-slim
image=localhost/edgeserve:check
image_fetch=localhost/edgeserve:check-fetch
names=()
work=$(mktemp -d /var/tmp/edgeserve-container.XXXXXX)
cleanup() {
  local n
  for n in "${names[@]}"; do podman rm -f "$n" >/dev/null 2>&1; done
  [ $keep -eq 1 ] || podman rmi -f "$image" "$image_fetch" >/dev/null 2>&1
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

n_ok=0 n_fail=0
ok() { echo "ok - $*"; n_ok=$((n_ok + 1)); }
notok() { echo "not ok - $*"; n_fail=$((n_fail + 1)); }

# ---- tools ------------------------------------------------------------------------------

need=()
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || need+=(runc)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v curl >/dev/null || need+=(curl)
if [ ${#need[@]} -gt 0 ]; then
  echo "container-check: installing ${need[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null ||
    { echo "container-check: could not install ${need[*]}" >&2; exit 1; }
fi
command -v node >/dev/null || { echo "container-check: node is needed (scripts/setup/deps.sh)" >&2; exit 2; }

pod=(podman)
[ "$(stat -fc %T /sys/fs/cgroup 2>/dev/null)" = cgroup2fs ] || pod+=(--runtime runc)
nofile=$(ulimit -Hn)
[ "$nofile" = unlimited ] && nofile=1048576
limits=(--ulimit "nofile=$nofile:$nofile" --ulimit nproc=4096:4096)

# ---- the base image -----------------------------------------------------------------------

# shellcheck source=setup/apt_sources.sh
. scripts/setup/apt_sources.sh

if [ $rebuild_base -eq 0 ] && podman image exists "$base"; then
  echo "container-check: base $base exists (made earlier; --rebuild-base remakes it)"
else
  if [ -z "$mirror" ]; then
    mirror=$(source_entries | awk '$2 == "bookworm" { print $1; exit }')
    [ -n "$mirror" ] || {
      echo "container-check: no 'bookworm' entry in this machine's apt sources; give --mirror URI" >&2
      exit 2
    }
  fi
  echo "container-check: debootstrap --variant=minbase bookworm (mirror $mirror)"
  t0=$(date +%s)
  if ! debootstrap --variant=minbase bookworm "$work/root" "$mirror" >"$work/debootstrap.log" 2>&1; then
    tail -n 20 "$work/debootstrap.log" >&2
    echo "container-check: debootstrap failed" >&2
    exit 1
  fi
  # This machine's apt settings (a proxy, say), so that apt-get in the build
  # reaches the mirror the way apt does here.
  for f in /etc/apt/apt.conf.d/*; do
    [ -f "$f" ] && [ ! -e "$work/root/etc/apt/apt.conf.d/$(basename "$f")" ] &&
      cp "$f" "$work/root/etc/apt/apt.conf.d/"
  done
  rm -rf "$work/root/var/cache/apt/archives/"*.deb "$work/root/var/lib/apt/lists/"*
  tar -C "$work/root" -c . | podman import --change 'CMD ["bash"]' - "$base" >/dev/null ||
    { echo "container-check: podman import failed" >&2; exit 1; }
  rm -rf --one-file-system "$work/root"
  echo "container-check: base made in $(($(date +%s) - t0)) s"
fi

# ---- the build ----------------------------------------------------------------------------

build() { # TAG [podman build options]
  local tag=$1 t0
  shift
  t0=$(date +%s)
  if "${pod[@]}" build --network host --pull=never "${limits[@]}" -f deploy/Containerfile -t "$tag" "$@" . \
      >"$work/build-${tag##*:}.log" 2>&1; then
    ok "podman build $* -t $tag ($(($(date +%s) - t0)) s, $(podman image inspect "$tag" --format '{{.Size}}' |
       awk '{ printf "%.0f MB", $1 / 1e6 }'))"
  else
    tail -n 30 "$work/build-${tag##*:}.log"
    notok "podman build $* -t $tag"
    return 1
  fi
}
echo "container-check: building $image (a few minutes)"
build "$image" || { echo "container-check: $n_ok passed, $n_fail failed"; exit 1; }
grep '^runtime packages: ' "$work/build-check.log" | head -n 1 | sed 's/^/# /'
cfg=$(podman image inspect "$image" --format '{{.Config.User}}|{{.Config.StopSignal}}|{{json .Config.Cmd}}')
[ "${cfg%%|*}" = "10001:10001" ] && ok "image user is 10001:10001" || notok "image user: ${cfg%%|*}"
case $cfg in *"|SIGTERM|"*) ok "stop signal SIGTERM" ;; *) notok "stop signal: $cfg" ;; esac

# ---- running --------------------------------------------------------------------------------

url=http://127.0.0.1:$port
secure=(--read-only --cap-drop ALL --security-opt no-new-privileges --memory 1g --network host "${limits[@]}")
start() { # NAME IMAGE [podman run options] -- [command]
  local name=$1
  names+=("$name")
  podman rm -f "$name" >/dev/null 2>&1
  shift
  "${pod[@]}" run -d --name "$name" "${secure[@]}" "$@" >/dev/null
}
wait_ready() { # NAME [SECONDS]: 0 once /v2/health/ready says 200 (within 90 s)
  local i
  for i in $(seq 1 $((${2:-90} * 2))); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' -m 2 "$url/v2/health/ready")" = 200 ] && return 0
    [ "$(podman inspect "$1" --format '{{.State.Running}}' 2>/dev/null)" = true ] || return 1
    sleep 0.5
  done
  return 1
}
code() { curl -s -o /dev/null -w '%{http_code}' -m 10 "$@"; }
infer_cls() { # LABEL: one ppocr_cls inference, JSON
  local out
  out=$(curl -s -m 30 -w '\n%{http_code}' -H 'Content-Type: application/json' \
    --data-binary @"$work/cls.json" "$url/v2/models/ppocr_cls/infer")
  if [ "${out##*$'\n'}" = 200 ] && node -e '
      const r = JSON.parse(process.argv[1]); const o = r.outputs[0];
      const s = o.data[0] + o.data[1];
      process.exit(o.shape.join("x") === "1x2" && Math.abs(s - 1) < 1e-3 ? 0 : 1)' "${out%$'\n'*}"; then
    ok "$1: ppocr_cls inference: 200, $(cut -c1-120 <<<"${out%$'\n'*}")"
  else
    notok "$1: ppocr_cls inference: $(cut -c1-300 <<<"$out")"
  fi
}
node -e 'const n = 3 * 48 * 192;
  require("fs").writeFileSync(process.argv[1], JSON.stringify({ inputs: [{ name: "x", datatype: "FP32",
    shape: [1, 3, 48, 192], data: new Array(n).fill(0.5) }] }))' "$work/cls.json"
if ss -ltn 2>/dev/null | awk '{ print $4 }' | grep -qE "[:.]$port\$"; then
  echo "container-check: port $port is in use here; give --port N" >&2
  exit 2
fi
# The image's CMD listens on 8080; another port means giving the arguments.
serve_args=()
[ "$port" = 8080 ] || serve_args=(serve --memory auto --host 0.0.0.0 --port "$port")

# a. the default image, the flat model folder, the default CMD.
echo "container-check: a. default CMD, models at /models (read-only)"
if start es-check-a -v "$models:/models:ro" "$image" "${serve_args[@]}" && wait_ready es-check-a; then
  ok "a: ready on $url within the limit (default CMD, --memory auto)"
  [ "$(code "$url/v2/health/live")" = 200 ] && ok "a: /v2/health/live 200" || notok "a: /v2/health/live"
  bad=""
  for m in blazeface_front blazeface_back ppocr_det ppocr_rec ppocr_cls; do
    [ "$(code "$url/v2/models/$m/ready")" = 200 ] || bad+=" $m"
  done
  [ -z "$bad" ] && ok "a: the five target models ready" || notok "a: not ready:$bad"
  infer_cls a
  curl -s -m 10 "$url/metrics" | grep -q '^edgeserve_requests_total{model="ppocr_cls",outcome="success"} 1$' &&
    ok "a: /metrics counts the inference" || notok "a: /metrics lacks the inference"
  budget=$(podman logs es-check-a 2>&1 | sed -n 's/.*budget \([0-9]*\) B).*/\1/p' | head -n 1)
  if [ -n "$budget" ] && [ "$budget" -gt 0 ] && [ "$budget" -lt $((1 << 30)) ]; then
    ok "a: --memory auto took the budget from the 1 GiB cgroup limit: $budget B"
  else
    notok "a: budget '$budget' is not below the container's 1 GiB limit"
  fi
  t0=$(date +%s%N)
  podman stop -t 30 es-check-a >/dev/null
  ms=$((($(date +%s%N) - t0) / 1000000))
  rc=$(podman inspect es-check-a --format '{{.State.ExitCode}}')
  log=$(podman logs es-check-a 2>&1)
  if [ "$rc" = 0 ] && grep -q "signal 15: draining" <<<"$log" && grep -q "stopped: .* cut off" <<<"$log"; then
    ok "a: podman stop (SIGTERM to PID 1): drained and exited 0 in $ms ms"
  else
    notok "a: podman stop: exit $rc; $(tail -n 3 <<<"$log")"
  fi
else
  notok "a: the server did not become ready"
  podman logs es-check-a 2>&1 | tail -n 15
fi

# b. a KServe-style repository at /mnt/models, the ServingRuntime's args.
echo "container-check: b. a model repository at /mnt/models (KServe's layout)"
repo=$work/repository
mk() { # NAME FILE [config.json text]
  mkdir -p "$repo/$1"
  ln "$models/$2" "$repo/$1/$2" 2>/dev/null || cp "$models/$2" "$repo/$1/$2"
  [ -z "${3:-}" ] || printf '%s\n' "$3" >"$repo/$1/config.json"
}
mk blazeface_front blazeface_front_128.onnx '{"priority": 1}'
mk ppocr_det ppocr_det.onnx '{"priority": 1, "shape": {"x": [1, 3, 640, 640]}}'
mk ppocr_cls ppocr_cls.onnx '{"priority": 2, "shape": {"x": [1, 3, 48, 192]}}'
chmod -R a+rX "$repo"
if start es-check-b -v "$repo:/mnt/models:ro" "$image" \
     serve --model-repository /mnt/models --memory auto --host 0.0.0.0 --port "$port" --grace-ms 10000 &&
   wait_ready es-check-b; then
  index=$(curl -s -m 10 -X POST "$url/v2/repository/index")
  n=$(grep -o '"state":"READY"' <<<"$index" | wc -l)
  [ "$n" = 3 ] && ok "b: repository index: 3 models READY" || notok "b: repository index: $index"
  infer_cls b
  podman stop -t 30 es-check-b >/dev/null
  rc=$(podman inspect es-check-b --format '{{.State.ExitCode}}')
  [ "$rc" = 0 ] && ok "b: stopped, exit 0" || notok "b: exit $rc"
else
  notok "b: the server did not become ready"
  podman logs es-check-b 2>&1 | tail -n 15
fi

# c. nothing mounted: the entrypoint refuses to start a server with no models.
echo "container-check: c. no models mounted"
start es-check-c "$image" "${serve_args[@]}"
rc=$(podman wait es-check-c 2>/dev/null)
log=$(podman logs es-check-c 2>&1)
if [ "$rc" = 1 ] && grep -q "no models" <<<"$log"; then
  ok "c: empty /models: exit 1, \"$(head -c 90 <<<"$log")...\""
else
  notok "c: empty /models: exit $rc: $log"
fi

# d. the fetch variant.
if [ $fetch -eq 1 ]; then
  echo "container-check: d. the fetch variant (npm in the image)"
  if build "$image_fetch" --target fetch; then
    # npm as this machine has it set up: its config files and CA bundle,
    # read-only (copies: root's own files are not readable by the image's user).
    npmrc=()
    for f in /etc/npmrc /usr/etc/npmrc; do [ -f "$f" ] && npmrc+=(-v "$f:$f:ro"); done
    userrc=${NPM_CONFIG_USERCONFIG:-$HOME/.npmrc}
    if [ -f "$userrc" ]; then
      install -m 0444 "$userrc" "$work/npmrc"
      npmrc+=(-v "$work/npmrc:/run/npmrc:ro" -e NPM_CONFIG_USERCONFIG=/run/npmrc)
    fi
    # The bundle goes where the image's own is: an npmrc here may name that
    # path as npm's cafile, which replaces the CAs npm trusts.
    [ -f /etc/ssl/certs/ca-certificates.crt ] &&
      npmrc+=(-v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
    # An empty writable folder for the models, as an emptyDir would be (with
    # podman's --tmpfs over /models, the image's user got "Permission
    # denied" writing there).
    mkdir -p "$work/fetched" && chmod 1777 "$work/fetched"
    if start es-check-d -v "$work/fetched:/models:rw" --tmpfs /tmp:rw,size=256m \
         "${npmrc[@]}" "$image_fetch" "${serve_args[@]}" && wait_ready es-check-d 600; then
      ok "d: fetched the models at start and became ready"
      infer_cls d
    else
      notok "d: the fetch variant did not become ready"
      podman logs es-check-d 2>&1 | tail -n 15
    fi
  fi
fi

echo
echo "container-check: $n_ok passed, $n_fail failed"
[ $n_fail -eq 0 ]
