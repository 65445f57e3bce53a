# Sourced by the end-to-end tests that run the server inside a memory
# cgroup they make (test_server_overload.sh, test_server_sequence_memory.sh):
# finding our own group (v1: the memory controller's mount from
# /proc/self/mountinfo and the "memory:" line of /proc/self/cgroup; else v2
# when the group can hand the memory controller down), making a child group,
# reading its OOM kills, failures and peak, removing it.
# Needs the caller's skip function.

# v1: the memory hierarchy's mount point and root, and our path in it.
find_v1() {
  local mnt root own
  read -r root mnt < <(awk '{
      for (i = 7; i <= NF && $i != "-"; i++) ;
      if ($(i + 1) == "cgroup" && $(i + 3) ~ /(^|,)memory(,|$)/) { print $4, $5; exit }
    }' /proc/self/mountinfo)
  [ -n "${mnt:-}" ] || return 1
  own=$(awk -F: '$2 ~ /(^|,)memory(,|$)/ {print $3; exit}' /proc/self/cgroup)
  [ -n "$own" ] || return 1
  local d
  for d in "$mnt${own#"${root%/}"}" "$mnt$own" "$mnt"; do
    if [ -f "$d/cgroup.procs" ] && grep -qx "$$" "$d/cgroup.procs" 2>/dev/null; then
      echo "$d"
      return 0
    fi
  done
  return 1
}
find_v2() {
  local mnt own
  mnt=$(awk '{ for (i = 7; i <= NF && $i != "-"; i++) ; if ($(i + 1) == "cgroup2") { print $5; exit } }' /proc/self/mountinfo)
  own=$(awk -F: '$1 == "0" {print $3; exit}' /proc/self/cgroup)
  [ -n "$mnt" ] && [ -n "$own" ] || return 1
  local d="$mnt${own%/}"
  [ -f "$d/cgroup.subtree_control" ] || return 1
  if ! grep -qw memory "$d/cgroup.subtree_control"; then
    echo +memory >"$d/cgroup.subtree_control" 2>/dev/null || return 1
  fi
  echo "$d"
}

# cg_make PREFIX: a new child group under ours, made and checked (a
# process can be moved in); sets cg, version and the file names f_limit,
# f_usage, f_peak. Calls the test's skip (exit 77) when none can be made.
cg_make() {
  version=""
  if parent=$(find_v1); then
    version=1
  elif parent=$(find_v2); then
    version=2
  else
    skip "no memory cgroup to make a group under (no v1 memory controller with our group in it, no v2 group that can enable memory for its children)"
  fi
  local name="$1_$$_$RANDOM"
  mkdir "$parent/$name" 2>/dev/null || skip "cannot create a cgroup under $parent (v$version): permission or read-only"
  cg="$parent/$name"
  if [ $version = 1 ]; then
    f_limit=memory.limit_in_bytes f_usage=memory.usage_in_bytes f_peak=memory.max_usage_in_bytes
  else
    f_limit=memory.max f_usage=memory.current f_peak=memory.peak
    [ -f "$cg/$f_peak" ] || skip "cgroup v2 without memory.peak (kernel < 5.19): the peak cannot be measured"
  fi
  (echo "$BASHPID" >"$cg/cgroup.procs") 2>/dev/null || skip "cannot move a process into $cg"
  echo "# cgroup v$version: $cg"
}

# cg_begin PREFIX: cg_make, with an EXIT trap that kills the server whose
# pid is in spid (if any), removes the group and the test's $work folder.
cg_begin() {
  cg=""
  spid=""
  trap cg_cleanup EXIT
  cg_make "$1"
}
cg_cleanup() {
  if [ -n "${spid:-}" ]; then
    kill -KILL "$spid" 2>/dev/null
    wait "$spid" 2>/dev/null
  fi
  cg_remove
  rm -rf "$work"
}

# cg_remove: the group, once its processes are gone (with retries).
cg_remove() {
  if [ -n "${cg:-}" ] && [ -d "$cg" ]; then
    local i
    for ((i = 0; i < 100; i++)); do
      rmdir "$cg" 2>/dev/null && break
      sleep 0.1
    done
    [ -d "$cg" ] && echo "# warning: could not remove the cgroup $cg"
  fi
}

oom_kills() {
  if [ $version = 1 ]; then
    awk '$1 == "oom_kill" {print $2; f = 1} END {if (!f) print "n/a"}' "$cg/memory.oom_control"
  else
    awk '$1 == "oom_kill" {print $2; f = 1} END {if (!f) print "n/a"}' "$cg/memory.events"
  fi
}
failcnt() {
  if [ $version = 1 ]; then cat "$cg/memory.failcnt"; else awk '$1 == "max" {print $2}' "$cg/memory.events"; fi
}
reset_peak() {
  if [ $version = 1 ]; then
    echo 0 >"$cg/memory.max_usage_in_bytes" 2>/dev/null
    echo 0 >"$cg/memory.failcnt" 2>/dev/null
    echo 0 >"$cg/memory.force_empty" 2>/dev/null # drop the page cache left by phase 1
  else
    echo 0 >"$cg/memory.peak" 2>/dev/null # kernel >= 6.12; else the peak is since mkdir
  fi
}
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }

wait_exit() { # PID SECONDS: exit status, 255 when still running
  local pid=$1 limit=$2 i st
  for ((i = 0; i < limit * 10; i++)); do
    st=$(ps -o stat= -p "$pid" 2>/dev/null)
    if [ -z "$st" ] || [[ $st == Z* ]]; then
      wait "$pid"
      return $?
    fi
    sleep 0.1
  done
  return 255
}
