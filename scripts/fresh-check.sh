#!/usr/bin/env bash
# Runs the README's two commands on a brand-new Debian 12 (bookworm) root,
# the way a newcomer's machine with nothing on it would run them. Not part of
# CI: it takes 30 minutes or more (a root, every package, five builds).
#
#   1. debootstrap makes a bookworm root in a temporary folder (debootstrap
#      is installed with apt when missing), from this machine's own apt
#      sources, read from /etc/apt/sources.list and /etc/apt/sources.list.d
#      now (a bookworm "deb" entry gives the mirror);
#   2. the package clients' settings are copied in as this machine has them:
#      its apt sources (and the keyrings they name), /etc/apt/apt.conf.d,
#      npm's global and user npmrc files, the local CA certificates and the
#      generated bundle (so TLS to the registries works inside), and the DNS
#      and hosts files;
#   3. a clean copy of the project at HEAD (git archive: no .cache, no build
#      folders, nothing uncommitted) goes to /root/edgeserve in the root;
#   4. /proc, /sys and /dev are mounted in (/sys with its cgroup mounts, so
#      the memory cgroup tests can make their groups; they skip where they
#      cannot) and unmounted on exit, whatever happens;
#   5. `bash scripts/demo.sh` and `bash scripts/test.sh` run inside, as root,
#      with a login-like environment (HOME, PATH, TERM, USER); each one's
#      last lines and exit code are printed at the end.
# The root is deleted at the end unless --keep is given.
#   scripts/fresh-check.sh [--dir DIR] [--keep] [--reuse] [--only demo|test]
#                          [--mirror URI] [--demo-args "ARGS"] [--run "COMMAND"]
#                          [--copy FILE]...
# --dir: the folder to work in (default: a new one under /var/tmp); it holds
# root/ and the logs demo.log and test.log. --reuse: a root already in DIR
# is used as it is instead of making a new one (not fresh: for iterating on a
# fix; the project copy is always replaced). --only: run one of the two
# commands. --mirror: the Debian mirror for debootstrap when this machine's
# sources have no bookworm entry. --demo-args: arguments for demo.sh (the
# default is none: as the README runs it). --run: instead of the two
# commands, one other command that must work on a fresh machine, e.g. a
# benchmark that installs its own peer ("bash scripts/bench/bench_ocr.sh");
# its log is DIR/run.log. --copy: a file made on this machine (a package
# to install) is copied to /root/extra/ in the root; repeatable.
# Exits 0 when both commands exited 0.
set -uo pipefail
cd "$(dirname "$0")/.."
src=$PWD

dir="" keep=0 reuse=0 only="" mirror="" demo_args="" run="" copies=()
while [ $# -gt 0 ]; do
  case $1 in
    --dir) dir=${2:?--dir needs a folder}; shift 2 ;;
    --keep) keep=1; shift ;;
    --reuse) reuse=1; keep=1; shift ;;
    --only) only=${2:?--only needs demo or test}; shift 2 ;;
    --mirror) mirror=${2:?--mirror needs a URI}; shift 2 ;;
    --demo-args) demo_args=${2?--demo-args needs a string}; shift 2 ;;
    --run) run=${2:?--run needs a command}; shift 2 ;;
    --copy) [ -f "${2:-}" ] || { echo "fresh-check: --copy needs a file" >&2; exit 2; }
            copies+=("$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"); shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "fresh-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case $only in ""|demo|test) ;; *) echo "fresh-check: --only demo or --only test" >&2; exit 2 ;; esac
[ "$(id -u)" -eq 0 ] || { echo "fresh-check: needs root (debootstrap, chroot, mounts)" >&2; exit 2; }
command -v git >/dev/null && git -C "$src" rev-parse --verify -q HEAD >/dev/null ||
  { echo "fresh-check: needs git and a checkout with a HEAD commit" >&2; exit 2; }

# ---- this machine's apt sources ------------------------------------------------------

# shellcheck source=setup/apt_sources.sh
. scripts/setup/apt_sources.sh

if [ -z "$mirror" ]; then
  mirror=$(source_entries | awk '$2 == "bookworm" { print $1; exit }')
  [ -n "$mirror" ] || {
    echo "fresh-check: no 'bookworm' entry in this machine's apt sources; give --mirror URI" >&2
    exit 2
  }
fi

# ---- the folder, the mounts, the clean-up ------------------------------------------------

if [ -z "$dir" ]; then
  dir=$(mktemp -d /var/tmp/edgeserve-fresh.XXXXXX)
else
  mkdir -p "$dir"
fi
dir=$(cd "$dir" && pwd)
root=$dir/root
echo "fresh-check: working in $dir (mirror $mirror)"

# mounts_under PATH: the mount points at or below PATH, deepest first.
mounts_under() {
  awk -v p="$1" '$5 == p || index($5, p "/") == 1 { print $5 }' /proc/self/mountinfo | sort -r
}
# processes whose root is the fresh root (ours: started by the commands
# below); TERM, then KILL.
stop_root_processes() {
  local pids=() tries
  for tries in 1 2 3; do
    mapfile -t pids < <(find /proc -mindepth 2 -maxdepth 2 -name root -lname "$root" 2>/dev/null | cut -d/ -f3)
    [ ${#pids[@]} -gt 0 ] || return 0
    if [ $tries -lt 3 ]; then kill -TERM "${pids[@]}" 2>/dev/null; sleep 2
    else kill -KILL "${pids[@]}" 2>/dev/null; sleep 1; fi
  done
}
cleanup() {
  local m
  [ -d "$root" ] || return 0
  stop_root_processes
  for m in $(mounts_under "$root"); do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
  done
  if [ -n "$(mounts_under "$root")" ]; then
    echo "fresh-check: still mounted under $root, not deleting it:" >&2
    mounts_under "$root" >&2
    return 0
  fi
  if [ $keep -eq 0 ]; then
    rm -rf --one-file-system "$dir"
  else
    echo "fresh-check: kept $root (logs in $dir)"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- the root ---------------------------------------------------------------------------

if [ $reuse -eq 1 ] && [ -f "$root/etc/debian_version" ]; then
  echo "fresh-check: reusing the root in $root (NOT fresh: packages installed earlier stay)"
else
  [ ! -e "$root" ] || { echo "fresh-check: $root exists; use another --dir or --reuse" >&2; exit 2; }
  if ! command -v debootstrap >/dev/null; then
    echo "fresh-check: installing debootstrap"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null ||
      { echo "fresh-check: could not install debootstrap" >&2; exit 1; }
  fi
  echo "fresh-check: debootstrap bookworm (a few minutes)"
  t0=$(date +%s)
  if ! debootstrap bookworm "$root" "$mirror" >"$dir/debootstrap.log" 2>&1; then
    tail -n 30 "$dir/debootstrap.log" >&2
    echo "fresh-check: debootstrap failed (log: $dir/debootstrap.log)" >&2
    exit 1
  fi
  echo "fresh-check: root made in $(($(date +%s) - t0)) s"
fi

# apt: this machine's sources replace debootstrap's one line; the keyrings
# they name come along when the root lacks them.
rm -f "$root/etc/apt/sources.list"
rm -f "$root"/etc/apt/sources.list.d/*.list "$root"/etc/apt/sources.list.d/*.sources
mkdir -p "$root/etc/apt/sources.list.d" "$root/etc/apt/apt.conf.d"
[ -f /etc/apt/sources.list ] && cp /etc/apt/sources.list "$root/etc/apt/sources.list"
for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
  [ -f "$f" ] && cp "$f" "$root/etc/apt/sources.list.d/"
done
for k in $(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null |
           grep -oiE '(signed-by[=:][[:space:]]*)/[^] ,]+' | sed -E 's/^[^/]*//' | sort -u); do
  if [ -f "$k" ] && [ ! -e "$root$k" ]; then
    mkdir -p "$root$(dirname "$k")" && cp "$k" "$root$k"
  fi
done
for f in /etc/apt/apt.conf.d/*; do
  [ -f "$f" ] && [ ! -e "$root/etc/apt/apt.conf.d/$(basename "$f")" ] && cp "$f" "$root/etc/apt/apt.conf.d/"
done
# npm: the global config files (Debian's npm reads /etc/npmrc, a prefix-/usr
# npm /usr/etc/npmrc) and root's user config.
for f in /etc/npmrc /usr/etc/npmrc; do
  [ -f "$f" ] && mkdir -p "$root$(dirname "$f")" && cp -p "$f" "$root$f"
done
userrc=${NPM_CONFIG_USERCONFIG:-$HOME/.npmrc}
[ -f "$userrc" ] && mkdir -p "$root/root" && cp -p "$userrc" "$root/root/.npmrc"
# TLS: the local CAs (the ca-certificates package adds them to the bundle it
# generates when deps.sh installs it) and the bundle as it is now (used until then).
if [ -d /usr/local/share/ca-certificates ]; then
  mkdir -p "$root/usr/local/share/ca-certificates"
  cp -a /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/"
fi
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  mkdir -p "$root/etc/ssl/certs"
  cp -L /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
fi
# DNS and local names.
for f in /etc/resolv.conf /etc/hosts; do
  [ -e "$f" ] && { rm -f "$root$f"; cp -L "$f" "$root$f"; }
done

# The project at HEAD, nothing else.
rm -rf --one-file-system "$root/root/edgeserve"
mkdir -p "$root/root/edgeserve"
git -C "$src" archive --format=tar HEAD | tar -x -C "$root/root/edgeserve" ||
  { echo "fresh-check: git archive failed" >&2; exit 1; }
echo "fresh-check: project at $(git -C "$src" log -1 --format='%h %s' HEAD)"
rm -rf --one-file-system "$root/root/extra"
if [ ${#copies[@]} -gt 0 ]; then
  mkdir -p "$root/root/extra" && cp "${copies[@]}" "$root/root/extra/" ||
    { echo "fresh-check: cannot copy ${copies[*]}" >&2; exit 1; }
fi

# The kernel's file systems: a proc of its own; /sys and /dev bound with what
# is mounted below them (cgroups, /dev/pts, /dev/shm), as slaves so that
# unmounting them here never unmounts anything on this machine.
mount -t proc proc "$root/proc" || { echo "fresh-check: cannot mount proc" >&2; exit 1; }
for m in sys dev; do
  mount --rbind "/$m" "$root/$m" && mount --make-rslave "$root/$m" ||
    { echo "fresh-check: cannot bind /$m" >&2; exit 1; }
done

# ---- the two commands -------------------------------------------------------------------

# in_root LOG COMMAND: runs COMMAND with bash in the project folder inside the
# root with a login-like environment; output to LOG (and a line a minute
# here so a long run shows it is alive); the exit code.
in_root() {
  local log=$1 cmd=$2 pid rc t0
  t0=$(date +%s)
  chroot "$root" /usr/bin/env -i HOME=/root USER=root LOGNAME=root SHELL=/bin/bash TERM=dumb \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    /bin/bash -c "cd /root/edgeserve && $cmd" </dev/null >"$log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 60 & wait $! 2>/dev/null
    kill -0 "$pid" 2>/dev/null &&
      echo "fresh-check:   $(($(date +%s) - t0)) s: $(tail -n 1 "$log" | cut -c1-120)"
  done
  wait "$pid"
  rc=$?
  echo "fresh-check: '$cmd' exited $rc after $(($(date +%s) - t0)) s"
  return $rc
}

demo_rc=- test_rc=-
if [ -n "$run" ]; then
  echo "fresh-check: $run (log: $dir/run.log)"
  in_root "$dir/run.log" "$run"
  run_rc=$?
  echo
  echo "== $run, last lines:"
  tail -n 25 "$dir/run.log"
  echo
  echo "fresh-check: '$run' exit $run_rc"
  exit $((run_rc != 0))
fi
if [ "$only" != test ]; then
  echo "fresh-check: bash scripts/demo.sh $demo_args (log: $dir/demo.log)"
  in_root "$dir/demo.log" "bash scripts/demo.sh $demo_args"
  demo_rc=$?
fi
if [ "$only" != demo ]; then
  echo "fresh-check: bash scripts/test.sh (log: $dir/test.log)"
  in_root "$dir/test.log" "bash scripts/test.sh"
  test_rc=$?
fi

if [ "$demo_rc" != - ]; then
  echo
  echo "== demo.sh, last lines:"
  tail -n 25 "$dir/demo.log"
fi
if [ "$test_rc" != - ]; then
  echo
  echo "== test.sh, last lines:"
  tail -n 25 "$dir/test.log"
fi
echo
echo "fresh-check: demo.sh exit $demo_rc, test.sh exit $test_rc"
[ "$demo_rc" != - ] && [ "$demo_rc" != 0 ] && exit 1
[ "$test_rc" != - ] && [ "$test_rc" != 0 ] && exit 1
exit 0
