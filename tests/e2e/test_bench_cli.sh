#!/usr/bin/env bash
# edgeserve bench in-process, end to end, on BlazeFace front (the smallest
# target model): one JSON line whose arena equals what `inspect --shape`
# plans; --load-twice adds the second load and plan's times (and only then);
# --load-twice with --concurrency is a usage error (exit 2); a missing model
# is an error that names it (exit 1); --profile lists the ten slowest nodes
# in order; --cache-dir writes the prepared weights once and maps them after;
# --perf gives hardware counts or says why there are none. Times are only checked to be numbers
# above 0, never compared.
#   test_bench_cli.sh EDGESERVE_BINARY SOURCE_DIR
set -uo pipefail
es=$1
src=$2
models=${ES_MODEL_DIR:-$src/.cache/models}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
model=$models/blazeface_front_128.onnx
[ -f "$model" ] || { echo "test_bench_cli: models missing (scripts/setup/fetch-models.sh)"; exit 1; }

fail=0
bad() { echo "FAIL: $*"; fail=1; }
field() { sed -nE "s/.*\"$2\": ?([0-9.e+-]+).*/\1/p" "$1"; }
positive() { awk -v v="$1" 'BEGIN { exit !(v + 0 > 0) }'; }

"$es" bench "$model" --iters 2 --warmup 0 --load-twice --json >"$work/twice.json" 2>"$work/twice.err" ||
  { bad "bench --load-twice exited $?"; cat "$work/twice.err"; }
cat "$work/twice.json"
[ "$(grep -c '^{' "$work/twice.json")" -eq 1 ] || bad "not one JSON line"
for k in load_ms plan_ms load2_ms plan2_ms median_ms; do
  v=$(field "$work/twice.json" "$k")
  [ -n "$v" ] && positive "$v" || bad "$k is '$v', not a number above 0"
done
"$es" inspect "$model" >"$work/inspect.txt" 2>&1 || bad "inspect failed"
want=$(awk '/planned arena bytes:/ {print $4}' "$work/inspect.txt")
got=$(field "$work/twice.json" arena_bytes)
[ -n "$want" ] && [ "$want" = "$got" ] || bad "arena: bench says '$got', inspect says '$want'"

"$es" bench "$model" --iters 2 --warmup 0 --json >"$work/once.json" 2>&1 || bad "bench exited $?"
grep -q '"load_ms"' "$work/once.json" || bad "no load_ms without --load-twice"
grep -q '"load2_ms"' "$work/once.json" && bad "load2_ms without --load-twice"

"$es" bench "$model" --load-twice --concurrency 2 >"$work/usage.txt" 2>&1
rc=$?
[ $rc -eq 2 ] || bad "--load-twice --concurrency exited $rc, not 2"
grep -q -- '--load-twice is for the in-process mode' "$work/usage.txt" || bad "usage message: $(cat "$work/usage.txt")"

"$es" bench "$work/none.onnx" --iters 1 >"$work/missing.txt" 2>&1
rc=$?
[ $rc -eq 1 ] || bad "a missing model exited $rc, not 1"
grep -q 'none.onnx' "$work/missing.txt" || bad "the error does not name the file: $(cat "$work/missing.txt")"

# --profile: the table per operator, then the ten slowest nodes, slowest
# first, each with its time (and GFLOP/s where the node counts its work).
"$es" bench "$model" --iters 3 --warmup 0 --profile >"$work/profile.txt" 2>&1 || bad "bench --profile exited $?"
sed -n '/^slowest nodes/,$p' "$work/profile.txt" | tail -n +2 >"$work/slow.txt"
[ "$(wc -l <"$work/slow.txt")" -eq 10 ] || bad "not 10 slowest nodes: $(cat "$work/profile.txt")"
awk '{print $1}' "$work/slow.txt" | sort -g -r -c 2>/dev/null || bad "slowest nodes not in order: $(cat "$work/slow.txt")"
grep -q "GFLOP/s  node '.*' (#[0-9]* Conv)" "$work/slow.txt" || bad "no Conv with its GFLOP/s among them"

# The prepared-weights cache: the first process writes it, a second maps it
# (bench --cache-dir; EDGESERVE_CACHE_DIR in the environment does the same),
# with the same arena; a cache directory that cannot be made costs only the
# cache.
for run in 1 2 3; do
  if [ $run -eq 3 ]; then
    EDGESERVE_CACHE_DIR="$work/cache" "$es" bench "$model" --iters 1 --warmup 0 --json >"$work/cache$run.json" 2>&1
  else
    "$es" bench "$model" --iters 1 --warmup 0 --cache-dir "$work/cache" --json >"$work/cache$run.json" 2>&1
  fi || bad "bench with the cache (run $run) exited $?"
done
[ "$(field "$work/cache1.json" cache_writes)" = 1 ] && [ "$(field "$work/cache1.json" cache_hits)" = 0 ] ||
  bad "the first run did not write the cache: $(cat "$work/cache1.json")"
for run in 2 3; do
  [ "$(field "$work/cache$run.json" cache_hits)" = 1 ] && [ "$(field "$work/cache$run.json" cache_writes)" = 0 ] ||
    bad "run $run did not map the cache: $(cat "$work/cache$run.json")"
  [ "$(field "$work/cache$run.json" prepared_cached_bytes)" = "$(field "$work/cache$run.json" prepared_bytes)" ] ||
    bad "run $run: not all prepared weights from the cache"
  [ "$(field "$work/cache$run.json" arena_bytes)" = "$want" ] || bad "run $run: another arena"
done
[ "$(ls "$work/cache" | grep -c '\.esp$')" -ge 1 ] || bad "no cache file: $(ls -la "$work/cache")"
: >"$work/afile"
"$es" bench "$model" --iters 1 --warmup 0 --cache-dir "$work/afile/sub" --json >"$work/cachebad.json" 2>&1 ||
  bad "bench with an unusable cache directory exited $?"
[ "$(field "$work/cachebad.json" cache_errors)" = 1 ] || bad "no cache error counted: $(cat "$work/cachebad.json")"

# --perf: the timed runs' hardware counters, or, where the machine has none
# (virtual machines), a reason in their place; never zeros passed off as
# counts. Only in-process (exit 2 with --concurrency).
"$es" bench "$model" --iters 2 --warmup 0 --perf --json >"$work/perf.json" 2>&1 || bad "bench --perf exited $?"
cat "$work/perf.json"
[ "$(grep -c '^{' "$work/perf.json")" -eq 1 ] || bad "--perf: not one JSON line"
ins=$(field "$work/perf.json" perf_instructions_per_run)
why=$(sed -nE 's/.*"perf_unavailable": "([^"]+)".*/\1/p' "$work/perf.json")
if [ -n "$ins" ]; then
  positive "$ins" || bad "--perf: $ins instructions per run"
  [ -z "$why" ] || bad "--perf: both counts and a reason"
else
  grep -q 'perf_event_open' <<<"$why" || bad "--perf: neither counts nor a reason: $(cat "$work/perf.json")"
fi
"$es" bench "$model" --perf --concurrency 2 >"$work/perfusage.txt" 2>&1
rc=$?
[ $rc -eq 2 ] || bad "--perf --concurrency exited $rc, not 2"

[ $fail -eq 0 ] && echo "test_bench_cli: ok"
exit $fail
