#!/usr/bin/env bash
# edgeserve vs ONNX Runtime on the five target models, same inputs, same
# machine, A/B interleaved: for each model and thread count, R rounds, each
# round one `edgeserve bench` then one ORT run (or the other way round on odd
# rounds), ITERS timed runs each after warm-up. Prints the median of the
# per-round medians, p99, the ratio edgeserve / ORT, and edgeserve's GFLOP/s
# against one core's FP32 peak (ES_PEAK_GFLOPS, default 210 per thread).
#   scripts/bench/bench_vs_ort.sh [--iters N] [--rounds R] [--threads "1 2"] [--models "det rec ..."]
#
# --zoo: the model zoo instead (torchvision's architectures, random weights,
# exported by scripts/zoo/export.sh into .cache/zoo; the plain variant of each,
# the core set, or every export with --all), one thread, each at its usual
# size (224x224, inception_v3 299x299, segmentation 520x520, r3d_18
# 16x112x112). Per model: whether edgeserve loads it ("no: <reason>" if not),
# the error against ORT on one seeded input (max |es - ort| / max(1, range),
# and scale-free: / max(range, max |ort|)),
# R interleaved rounds of ITERS timed runs (default 10) of each engine,
# edgeserve's load + plan time (from the ONNX file, and from the model compiled
# once with `edgeserve compile`) and planned arena, ORT's session load time
# and the RSS growth of one more ORT session on the model (after both
# sessions' warm-up runs, as scripts/ort/bench_streams.js measures it).
#   scripts/bench/bench_vs_ort.sh --zoo [--all] [--iters N] [--rounds R] [--models "resnet18 vgg11"]
#
# --detectors: torchvision's detectors (scripts/zoo/export_detectors.py,
# .cache/zoo/detectors), one thread, on their test image: per model the
# detections each engine finds, R interleaved rounds of ITERS timed runs
# (default 10; ORT's session made once per round, its first run not timed),
# the medians and their ratio, edgeserve's planned arena and its bounded
# values' bytes against what the run used (edgeserve run --bounds).
#   scripts/bench/bench_vs_ort.sh --detectors [--iters N] [--rounds R] [--models "ssdlite320_mobilenet_v3_large"]
set -euo pipefail
cd "$(dirname "$0")/../.."
iters=30 rounds=3 threads="1 2" only="" zoo=0 all=0 iters_set=0 det=0
while [ $# -gt 0 ]; do
  case $1 in
    --iters) iters=$2; iters_set=1; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --models) only=$2; shift 2 ;;
    --zoo) zoo=1; shift ;;
    --detectors) det=1; shift ;;
    --all) all=1; shift ;;
    *) echo "usage: $0 [--iters N] [--rounds R] [--threads \"1 2\"] [--models \"front back cls rec det\"]" >&2
       echo "       $0 --zoo [--all] [--iters N] [--rounds R] [--models \"resnet18 vgg11 ...\"]" >&2; exit 2 ;;
  esac
done
es=${ES_BIN:-build-release/edgeserve}
scripts/setup/deps.sh >/dev/null # the build's packages, on a new machine
[ -x "$es" ] || { scripts/build.sh build-release -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF >/dev/null; }
[ $zoo -eq 1 ] || [ $det -eq 1 ] || scripts/setup/fetch-models.sh >/dev/null
scripts/setup/install-ort.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
json_field() { sed -E "s/.*\"$2\": ?([0-9.e+-]+).*/\1/" <<<"$1"; }
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

if [ $det -eq 1 ]; then
  ddir=${ES_ZOO_DIR:-.cache/zoo}/detectors
  [ -f "$ddir/manifest.json" ] ||
    { echo "bench_vs_ort: no detector exports ($ddir): run scripts/zoo/export.sh" >&2; exit 1; }
  [ $iters_set -eq 1 ] || iters=10
  echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); one thread each," \
    "$rounds interleaved rounds of $iters runs"
  printf '%-40s %9s %9s %10s %10s %7s %10s %8s %14s\n' model "es dets" "ort dets" "es ms" "ort ms" \
    ratio "arena MB" "heap KB" "bounds used"
  node -e 'const m = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
             for (const x of m.models) if (x.file) console.log(x.name, x.file, x.input, x.input_file)' \
    "$ddir/manifest.json" |
  while read -r name file input infile; do
    if [ -n "$only" ] && ! grep -qw "$name" <<<"$only"; then continue; fi
    w=$work/$name
    mkdir -p "$w"
    if ! "$es" run "$ddir/$file" --input "$input=$ddir/$infile" --bounds >"$w/run.log" 2>&1; then
      printf '%-40s no: %s\n' "$name" "$(grep -v '^ ' "$w/run.log" | tail -1)"
      continue
    fi
    dets=$(sed -n 's/^output scores *float32 *\[\([0-9]*\)\]/\1/p' "$w/run.log")
    used=$(sed -n 's/^  all [0-9]*: \([0-9]*\) of \([0-9]*\) bytes.*/\1 \2/p' "$w/run.log")
    for r in $(seq 1 "$rounds"); do
      run_es() { OMP_NUM_THREADS=1 "$es" bench "$ddir/$file" --input "$input=$ddir/$infile" \
        --threads 1 --iters "$iters" --json >>"$w/es.txt"; }
      run_ort() { node scripts/zoo/run_ort.js "$ddir/$file" "$ddir/$infile" "$w/ort" \
        --repeat "$((iters + 1))" --json >>"$w/ort.txt"; }
      if [ $((r % 2)) -eq 1 ]; then run_es; run_ort; else run_ort; run_es; fi
    done
    col() { while read -r l; do json_field "$l" "$2"; done <"$1" | median; }
    es_med=$(col "$w/es.txt" median_ms) ort_med=$(col "$w/ort.txt" median_ms)
    ort_dets=$(node -e 'const j = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")
      .trim().split("\n").pop()); console.log(j.outputs.scores.shape[0])' "$w/ort.txt")
    heap=$(sed -n 's/^run heap peak bytes: \([0-9]*\)/\1/p' "$w/run.log")
    awk -v n="$name" -v d="$dets" -v od="$ort_dets" -v em="$es_med" -v om="$ort_med" \
        -v ar="$(col "$w/es.txt" arena_bytes)" -v u="$used" -v h="${heap:-0}" 'BEGIN {
      split(u, b, " ");
      printf "%-40s %9s %9s %10.2f %10.2f %7.3f %10.1f %8.1f %7.1f KB of %.1f MB\n", n, d, od, em, om,
        em / om, ar / 1048576, h / 1024, b[1] / 1024, b[2] / 1048576 }'
  done
  echo "(ratio = edgeserve median / ORT median, medians over the rounds; ORT: onnxruntime-node,"
  echo " graph optimisation all; heap = the run heap's peak, the part no bound covers (a Loop's);"
  echo " bounds used = the bytes edgeserve's bounded values took in one run of the test image, of"
  echo " the bytes their bounds plan)"
  exit 0
fi
if [ $zoo -eq 1 ]; then
  manifest=${ES_ZOO_DIR:-.cache/zoo}/manifest.json
  [ -f "$manifest" ] || { echo "bench_vs_ort: no zoo exports ($manifest): run scripts/zoo/export.sh" >&2; exit 1; }
  [ $iters_set -eq 1 ] || iters=10
  sel=(--variants plain)
  [ $all -eq 0 ] || sel+=(--all)
  [ -z "$only" ] || sel+=(--models "$(tr ' ' ',' <<<"$only")")
  node scripts/zoo/zoo.js list "$manifest" "${sel[@]}" >"$work/list"
  echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); one thread each," \
    "$rounds interleaved rounds of $iters runs"
  printf '%-44s %-6s %10s %10s %9s %9s %7s %12s %10s %9s %9s %10s %10s %12s %12s %10s %13s\n' model loads \
    "max err" "rel err" "es ms" "ort ms" ratio "load+plan ms" "l+p again" "l+p user" "l+p sys" \
    "l+p write" "l+p cached" "esm l+p ms" "ort load ms" "arena MB" "ort +sess MB"
  while IFS=$'\t' read -r name _ status file outnpy _ _ _ _ _ _ bshape bin _; do
    if [ "$status" != ok ]; then printf '%-44s no: %s\n' "$name" "$status"; continue; fi
    w=$work/$name
    mkdir -p "$w"
    if ! "$es" run "$file" "$bin" --output-dir "$w/es" >"$w/run.log" 2>&1; then
      printf '%-44s no: %s\n' "$name" "$(tail -1 "$w/run.log" | sed "s|^edgeserve run: $file: ||")"
      continue
    fi
    if ! node scripts/ort/zoo_ort.js "$file" --out "$w/ort" "$bin" >"$w/ort.log" 2>&1; then
      printf '%-44s %-6s ORT refuses it: %s\n' "$name" yes "$(tail -1 "$w/ort.log")"; continue
    fi
    err=$(node scripts/zoo/zoo.js error "$w/es/$outnpy" "$w/ort/$outnpy" | head -1) || true
    case $err in [0-9]*) rel=${err#* } err=${err% *} ;; *) rel=- ;; esac
    # The same model compiled (.esm: mapped, weights already reordered),
    # planned at the bench shape (every zoo export names its input "input").
    esm_ok=0
    "$es" compile "$file" -o "$w/model.esm" --shape "input=$bshape" >"$w/compile.log" 2>&1 && esm_ok=1
    # The ONNX file with the prepared-weights cache: one run that writes
    # it, then every round's first load and plan in a new process maps it.
    cache_ok=0
    rm -rf "$w/cache"
    OMP_NUM_THREADS=1 "$es" bench "$file" "$bin" --threads 1 --iters 1 --warmup 0 \
      --cache-dir "$w/cache" --json >"$w/cachew.txt" 2>"$w/cachew.log" && cache_ok=1
    for r in $(seq 1 "$rounds"); do
      if [ $cache_ok -eq 1 ]; then
        OMP_NUM_THREADS=1 "$es" bench "$file" "$bin" --threads 1 --iters 1 --warmup 0 \
          --cache-dir "$w/cache" --json >>"$w/cache.txt" || cache_ok=0
      fi
      if [ $esm_ok -eq 1 ]; then
        OMP_NUM_THREADS=1 "$es" bench "$w/model.esm" "$bin" --threads 1 --iters 1 --warmup 0 --json \
          >>"$w/esm.txt" || esm_ok=0
      fi
      # --load-twice: also the load and plan again in the same process
      # (memory it has just used; oneDNN's primitive cache off so that the
      # second plan generates its kernels too).
      run_es() { OMP_NUM_THREADS=1 ONEDNN_PRIMITIVE_CACHE_CAPACITY=0 "$es" bench "$file" "$bin" \
        --threads 1 --iters "$iters" --load-twice --json >>"$w/es.txt"; }
      run_ort() { node scripts/ort/zoo_ort.js "$file" --bench "$bin" --iters "$iters" --json >>"$w/ort.txt"; }
      if [ $((r % 2)) -eq 1 ]; then run_es; run_ort; else run_ort; run_es; fi
    done
    col() { while read -r l; do json_field "$l" "$2"; done <"$1" | median; }
    es_med=$(col "$w/es.txt" median_ms) ort_med=$(col "$w/ort.txt" median_ms)
    load_plan() { # file [suffix]: the median of load + plan (load2 + plan2 with suffix 2)
      while read -r l; do
        awk -v a="$(json_field "$l" "load${2:-}_ms")" -v b="$(json_field "$l" "plan${2:-}_ms")" 'BEGIN { print a + b }'
      done <"$1" | median
    }
    lp=$(load_plan "$w/es.txt") lp2=$(load_plan "$w/es.txt" 2)
    elp=nan
    [ $esm_ok -eq 0 ] || elp=$(load_plan "$w/esm.txt")
    cwlp=nan clp=nan
    if [ $cache_ok -eq 1 ]; then cwlp=$(load_plan "$w/cachew.txt") clp=$(load_plan "$w/cache.txt"); fi
    rm -rf "$w/model.esm" "$w/cache"
    awk -v n="$name ($bshape)" -v e="$err" -v re="$rel" -v em="$es_med" -v om="$ort_med" -v lp="$lp" -v lp2="$lp2" \
        -v elp="$elp" -v cwlp="$cwlp" -v clp="$clp" \
        -v ol="$(col "$w/ort.txt" load_ms)" -v ar="$(col "$w/es.txt" arena_bytes)" \
        -v lu="$(col "$w/es.txt" lp_user_ms)" -v ls="$(col "$w/es.txt" lp_sys_ms)" \
        -v os="$(col "$w/ort.txt" rss_extra_session_bytes)" 'BEGIN {
      printf "%-44s %-6s %10s %10s %9.2f %9.2f %7.3f %12.1f %10.1f %9.1f %9.1f %10s %10s %12s %12.1f %10.1f %13.1f\n",
        n, "yes", e, re, em, om, em / om, lp, lp2, lu, ls,
        cwlp == "nan" ? "-" : sprintf("%.1f", cwlp), clp == "nan" ? "-" : sprintf("%.1f", clp),
        elp == "nan" ? "-" : sprintf("%.1f", elp), ol, ar / 1048576, os / 1048576 }'
  done <"$work/list"
  echo "(max err = max |edgeserve - ORT| / max(1, range of ORT's output) at the size shown,"
  echo " rel err the same / max(range, max |ORT|);"
  echo " ratio = edgeserve median / ORT median; ORT: onnxruntime-node, graph optimisation all;"
  echo " load+plan: from the ONNX file, the process's first; l+p again: the same in the same process"
  echo " once the first model is let go (edgeserve bench --load-twice, oneDNN's primitive cache off):"
  echo " the engine's own work, without the first touch of fresh memory, which a virtual machine"
  echo " whose host backs memory lazily makes cost up to ~3 ms per MB; l+p user / sys: the CPU"
  echo " time of l+p again, split into the engine's own work (user) and the kernel's (system:"
  echo " mostly faulting in and zeroing fresh pages); l+p write: the first load and plan with"
  echo " the prepared-weights cache on (--cache-dir), which reorders the weights and writes them"
  echo " (synced) for the next process; l+p cached: a new process's first load and plan of the"
  echo " same ONNX file, which maps them; esm l+p: from the model"
  echo " compiled once (edgeserve compile: mapped, weights already in the kernels' layouts);"
  echo " medians over the rounds;"
  echo " ort +sess MB = RSS growth of a second ORT session on the model)"
  exit 0
fi
node scripts/ort/make_inputs.js "$work" >/dev/null
m=.cache/models
peak=${ES_PEAK_GFLOPS:-210}

# short name, model file, input file
cases=(
  "front $m/blazeface_front_128.onnx $work/blazeface_front_128.npy"
  "back $m/blazeface_back_256.onnx $work/blazeface_back_256.npy"
  "cls $m/ppocr_cls.onnx $work/ppocr_cls.npy"
  "rec $m/ppocr_rec.onnx $work/ppocr_rec_w320.npy"
  "det $m/ppocr_det.onnx $work/ppocr_det_640.npy"
)

printf '%-6s %3s %11s %11s %11s %11s %7s %9s %6s\n' model thr "es med ms" "es p99 ms" \
  "ort med ms" "ort p99 ms" ratio "GFLOP/s" "%peak"
for c in "${cases[@]}"; do
  read -r name model input <<<"$c"
  if [ -n "$only" ] && ! grep -qw "$name" <<<"$only"; then continue; fi
  for t in $threads; do
    : >"$work/es.txt"; : >"$work/ort.txt"
    for r in $(seq 1 "$rounds"); do
      run_es() { OMP_NUM_THREADS=$t "$es" bench "$model" "$input" --threads "$t" --iters "$iters" --json >>"$work/es.txt"; }
      run_ort() { node scripts/ort/ort_run.js "$model" - "$input" --threads "$t" --repeat "$iters" --warmup 5 --json >>"$work/ort.txt"; }
      if [ $((r % 2)) -eq 1 ]; then run_es; run_ort; else run_ort; run_es; fi
    done
    es_med=$(while read -r l; do json_field "$l" median_ms; done <"$work/es.txt" | median)
    es_p99=$(while read -r l; do json_field "$l" p99_ms; done <"$work/es.txt" | median)
    ort_med=$(while read -r l; do json_field "$l" median_ms; done <"$work/ort.txt" | median)
    ort_p99=$(while read -r l; do json_field "$l" p99_ms; done <"$work/ort.txt" | median)
    gflop=$(json_field "$(head -1 "$work/es.txt")" gflop)
    awk -v n="$name" -v t="$t" -v em="$es_med" -v ep="$es_p99" -v om="$ort_med" -v op="$ort_p99" \
        -v g="$gflop" -v pk="$peak" 'BEGIN {
      gf = g / (em / 1000); printf "%-6s %3d %11.3f %11.3f %11.3f %11.3f %7.3f %9.1f %5.0f%%\n",
      n, t, em, ep, om, op, em / om, gf, 100 * gf / (pk * t) }'
  done
done
echo "(ratio = edgeserve median / ORT median; ORT: onnxruntime-node, graph optimisation all,"
echo " intra-op threads as shown; $rounds interleaved rounds of $iters runs each)"
