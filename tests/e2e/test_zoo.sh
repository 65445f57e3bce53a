#!/usr/bin/env bash
# The model zoo against ONNX Runtime: torchvision's architectures with random
# weights, exported by scripts/zoo/export.sh into .cache/zoo (plain and
# random-normalisation variants, the manifest names the shapes).
#
# For every export, at batch 1 and at its second shape (batch 4 at another
# H x W, or batch 2 where H and W are fixed), edgeserve (tests/e2e/zoo_run.c:
# the C API, one load for both shapes) and ORT run the same seeded input; the error max |es - ort| / max(1, range of
# ORT's output) must be at most 1e-3, and so must the scale-free one,
# max |es - ort| / max(range, max |ort|) ("rel"), since a random network can
# end in outputs of 1e-9 where the first passes anything. ORT is itself
# checked against PyTorch's outputs saved at export: where they disagree the
# export is not faithful at that shape and edgeserve's result there is
# reported, not judged.
#
# A model edgeserve refuses with ES_ENOTSUP (an operator, attribute or type
# it does not run yet; es_zoo_run gives the code) is "not supported yet",
# counted and listed, not a failure: operators are being added. A model that
# loads and plans but then fails to run, crashes, is refused with any other
# code, or mismatches ORT fails the test.
#
# Exit 77 (skipped) when node, ONNX Runtime or the exports are missing.
# The core models by default; ES_ZOO_ALL=1 adds the extra ones exported with
# export.sh --all, ES_ZOO_MODELS=a,b picks some. ES_ZOO_SECONDS (default
# 600) bounds the time: models not reached by then are listed as not run.
# Latencies are printed, never asserted.
#   test_zoo.sh ES_ZOO_RUN_BINARY SOURCE_DIR
set -uo pipefail
run=$1
src=$2
zoo=${ES_ZOO_DIR:-$src/.cache/zoo}
manifest=$zoo/manifest.json
tol=1e-3
budget=${ES_ZOO_SECONDS:-600}

command -v node >/dev/null ||
  { echo "test_zoo: 'node' is missing (scripts/setup/deps.sh installs it): skipped"; exit 77; }
node -e "require('$src/.cache/ort/node_modules/onnxruntime-node')" 2>/dev/null ||
  { echo "test_zoo: onnxruntime-node missing (scripts/setup/install-ort.sh): skipped"; exit 77; }
[ -f "$manifest" ] ||
  { echo "test_zoo: no zoo exports in $zoo (scripts/zoo/export.sh makes them): skipped"; exit 77; }

sel=()
[ "${ES_ZOO_ALL:-0}" = 1 ] && sel+=(--all)
[ -n "${ES_ZOO_MODELS:-}" ] && sel+=(--models "$ES_ZOO_MODELS")
list=$(node "$src/scripts/zoo/zoo.js" list "$manifest" "${sel[@]}") || exit 1
[ -n "$list" ] || { echo "test_zoo: the manifest lists no models to test: skipped"; exit 77; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# err_of A B: "E R" (scripts/zoo/zoo.js error: E against max(1, range), R
# scale-free), or why there is none ("shape ...").
err_of() { node "$src/scripts/zoo/zoo.js" error "$1" "$2" 2>&1 | head -1; }
# over "E R": either above the tolerance, or not numbers at all.
over() {
  awk -v e="$1" -v t="$tol" 'BEGIN { n = split(e, x, " "); num = "^[0-9.]+(e[-+]?[0-9]+)?$"
    exit !(n != 2 || x[1] !~ num || x[2] !~ num || x[1] + 0 > t + 0 || x[2] + 0 > t + 0) }'
}
# worst CURRENT VALUE: the larger number, "mismatch" once one is not a number.
worst() {
  if [ "$1" = mismatch ]; then echo mismatch; return; fi
  case $2 in
    [0-9]*) printf '%s\n' "$1" "$2" | grep -v '^-$' | sort -g | tail -1 ;;
    *) echo mismatch ;;
  esac
}

# judge K SHAPE TORCH_NPY: ORT against PyTorch (is the export faithful at
# this shape?), then edgeserve against ORT.
judge() {
  local k=$1 sh=$2 e faithful=1
  e=$(err_of "$w/ort$k/$outnpy" "$3")
  over "$e" && faithful=0
  rtmax=$(worst "$rtmax" "${e% *}")
  rtmax=$(worst "$rtmax" "${e#* }")
  e=$(err_of "$w/es$k/$outnpy" "$w/ort$k/$outnpy")
  errs[$((k - 1))]=${e% *}
  relmax=$(worst "$relmax" "${e#* }")
  over "$e" || return 0
  if [ $faithful = 1 ]; then
    res=FAIL why="${why}differs from ORT at $sh ($e); "
  elif [ $res = ok ]; then
    res=unfaithful why="${why}the export differs from PyTorch at $sh, so ORT is no reference there; "
  fi
}

# test_one: one export, at both shapes: es_zoo_run (one load, a plan and a
# run per shape) and ORT (one session) side by side; ORT is stopped when
# edgeserve does not support the model.
test_one() {
  local ortpid rc ortrc cases=(--out "$w/ort1" "$in1") escases=("$in1" "$w/es1")
  res=ok errs=(- -) es_ms=- arena=- ort_ms=- rtmax=- relmax=- why=""
  [ "$shape2" = - ] || { cases+=(--out "$w/ort2" "$in2"); escases+=("$in2" "$w/es2"); }
  node "$src/scripts/ort/zoo_ort.js" "$file" "${cases[@]}" >"$w/ort.log" 2>&1 &
  ortpid=$!
  "$run" "$file" "${escases[@]}" >"$w/es.log" 2>&1
  rc=$?
  es_ms=$(awk '/^case 1:/ { print $(NF - 1) }' "$w/es.log")
  arena=$(awk '/^case 1:/ { sub(",", "", $4); print $4 }' "$w/es.log")
  local last
  last=$(tail -1 "$w/es.log" | sed "s|$file: ||")
  case $rc in
    0) ;;
    3) res=unsup why=${last#ES_ENOTSUP: } ;;
    1) res=FAIL why="refused while loading or planning: $last" ;;
    4) res=FAIL why="planned, but a run fails: $last" ;;
    *) if [ $rc -ge 128 ]; then res=FAIL why="es_zoo_run crashed (signal $((rc - 128))): $(tail -3 "$w/es.log")"
       else res=FAIL why="es_zoo_run exit $rc: $last"; fi ;;
  esac
  if [ $res = unsup ] && [ ! -d "$w/es1" ]; then
    kill $ortpid 2>/dev/null
    wait $ortpid 2>/dev/null
    es_ms=- arena=-
    return
  fi
  wait $ortpid
  ortrc=$?
  if [ $ortrc -ne 0 ]; then
    [ $res != ok ] || res=noref why="ORT refuses the export: $(tail -1 "$w/ort.log")"
    return
  fi
  ort_ms=$(awk 'NR == 1 { print $(NF - 1) }' "$w/ort.log")
  # Whatever ran is judged, also when a later shape was refused.
  [ ! -d "$w/es1" ] || judge 1 "$shape" "$t1"
  [ ! -d "$w/es2" ] || judge 2 "$shape2" "$t2"
}

n=0 ok=0 unsup=0 fail=0 unfaithful=0 noexport=0 noref=0 weak=0 notrun=()
unsupported=()
start=$SECONDS
printf '%-38s %-8s %10s %10s %10s %10s %9s %9s %12s\n' model result "err b1" "err 2nd" "rel" \
  "ort-torch" "es ms" "ort ms" "arena B"
while IFS=$'\t' read -r name variant status file outnpy shape in1 shape2 in2 t1 t2 _ _ sens; do
  label=$name
  [ "$variant" = plain ] || label="$name.$variant"
  case $status in
    skip:*) continue ;;
    "export failed"*) printf '%-38s %s\n' "$label" "$status"; noexport=$((noexport + 1)); continue ;;
  esac
  if [ $((SECONDS - start)) -ge "$budget" ]; then notrun+=("$label"); continue; fi
  if [ ! -f "$file" ] || [ ! -f "$in1" ]; then
    printf '%-38s %s\n' "$label" "export missing: $file (scripts/zoo/export.sh)"
    noexport=$((noexport + 1)); continue
  fi
  n=$((n + 1))
  w=$work/$label
  mkdir -p "$w"
  test_one
  case $res in
    ok) ok=$((ok + 1)); shown=ok ;;
    unsup) unsup=$((unsup + 1)); shown=no; unsupported+=("$why") ;;
    unfaithful) unfaithful=$((unfaithful + 1)); shown=export? ;;
    noref) noref=$((noref + 1)); shown=no-ref ;;
    FAIL) fail=$((fail + 1)); shown=FAIL ;;
  esac
  printf '%-38s %-8s %10s %10s %10s %10s %9s %9s %12s\n' "$label" "$shown" "${errs[0]}" \
    "${errs[1]}" "$relmax" "$rtmax" "$es_ms" "$ort_ms" "$arena"
  case $res in
    unsup) echo "    not supported yet: $why" ;;
    FAIL | unfaithful | noref) echo "    $why" ;;
  esac
  if [ $res = ok ] && awk -v s="$sens" 'BEGIN { exit !(s != "-" && s + 0 < 1e-4) }'; then
    echo "    (its output barely depends on the input: sensitivity $sens, so this export checks little" \
      "before the last layers; the randnorm variant is the one that does)"
    weak=$((weak + 1))
  fi
  rm -rf "$w" # up to 50 MB of outputs a model
done <<<"$list"

echo "$n exports tested in $((SECONDS - start)) s: $ok match ONNX Runtime ($weak with an output that" \
  "barely depends on the input), $unsup not supported yet, $fail failed; $unfaithful unfaithful" \
  "exports, $noref refused by ORT, $noexport failed to export"
if [ ${#unsupported[@]} -gt 0 ]; then
  echo "not supported yet, by first missing operator:"
  printf '%s\n' "${unsupported[@]}" | grep -o "operator '[^']*'" | sort | uniq -c | sort -rn |
    awk '{ printf "  %s %s (%d)\n", $2, $3, $1 }'
fi
[ ${#notrun[@]} -eq 0 ] ||
  echo "not run (ES_ZOO_SECONDS=$budget reached): ${notrun[*]}"
[ $fail -eq 0 ]
