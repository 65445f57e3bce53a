#!/usr/bin/env bash
# Issue 16's classifier row: top-1 agreement of int8 (edgeserve quantize) and
# bf16 with FP32 on 1,000 structured inputs, for torchvision classifiers
# exported with random weights and randomised normalisation statistics
# (scripts/zoo/export.sh's "randnorm" variant, so that the classes differ
# from picture to picture). The inputs are pictures made from the
# scikit-image photos and a rendered page by random crops, flips, turns and
# light jitter (scripts/zoo/augment.js), 160x160; the calibration set is 16
# other pictures made the same way (another seed). Prints, per model, the
# agreement and how the FP32 top-1 margins of the flipped inputs compare.
#
# Random weights leave the best class of most pictures a hair ahead of the
# second, so any rounding flips many. --trained measures networks that have
# learnt their classes instead: the same architectures trained here from
# their initialisation (scripts/zoo/train_classifier.py, a few minutes on
# two cores) to tell which of ten sources a picture was cut from (the two
# photos, their negative and grey versions, six rendered pages), on 2,000
# pictures at 64x64 (seed 1); the 1,000 measured (seed 7) and the 16 for
# calibration (seed 99) are other pictures of the same sources. The trained
# .onnx files are kept in .cache/zoo (NAME.trained.onnx).
#   scripts/bench/classifier_agreement.sh [--models "resnet18 mobilenet_v2"] [--n 1000]
#                                         [--quantize "OPTIONS"]  (edgeserve quantize's, e.g. --method mse)
#                                         [--trained]
set -euo pipefail
cd "$(dirname "$0")/../.."
models="resnet18 mobilenet_v2" n=1000 qopts="" trained=0
while [ $# -gt 0 ]; do
  case $1 in
    --models) models=$2; shift 2 ;;
    --n) n=$2; shift 2 ;;
    --quantize) qopts=$2; shift 2 ;;
    --trained) trained=1; shift ;;
    *) echo "usage: $0 [--models \"resnet18 mobilenet_v2\"] [--n N] [--quantize \"OPTIONS\"] [--trained]" >&2; exit 2 ;;
  esac
done
es=${ES_BIN:-build-release/edgeserve}
scripts/setup/deps.sh >/dev/null # the build's packages, on a new machine
[ -x "$es" ] || scripts/build.sh build-release -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF >/dev/null
scripts/setup/fetch-images.sh >/dev/null
zoo=.cache/zoo
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for f in astronaut coffee; do convert ".cache/images/$f.png" -depth 8 "$work/$f.ppm"; done
convert -size 480x360 xc:white -font DejaVu-Sans -fill black -pointsize 40 -annotate +20+120 'INVOICE 2026' \
  -pointsize 28 -annotate +20+220 'edge boxes read text' -depth 8 "$work/page.ppm"
pics=("$work/astronaut.ppm" "$work/coffee.ppm" "$work/page.ppm")
size=160 variant=randnorm
if [ $trained = 1 ]; then
  size=64 variant=trained
  convert "$work/astronaut.ppm" -negate "$work/neg.ppm"
  convert "$work/coffee.ppm" -colorspace gray -colorspace sRGB -type TrueColor "$work/grey.ppm"
  pics+=("$work/neg.ppm" "$work/grey.ppm")
  i=0
  for t in 'Serial 4711-0815' 'camera gateway' 'HELLO 2026' 'edge box' 'KServe v2'; do
    i=$((i + 1))
    convert -size 400x300 "xc:rgb($((200 + i * 10)),$((255 - i * 12)),$((180 + i * 14)))" \
      -font DejaVu-Sans -fill "rgb($((i * 40)),20,$((200 - i * 30)))" -pointsize $((24 + i * 6)) \
      -annotate +$((10 + i * 7))+$((80 + i * 25)) "$t" -depth 8 "$work/page$i.ppm"
    pics+=("$work/page$i.ppm")
  done
  command -v /usr/bin/python3 >/dev/null && /usr/bin/python3 -c 'import torch, torchvision' 2>/dev/null ||
    scripts/setup/deps.sh --zoo
  node scripts/zoo/augment.js "$work/train" 2000 50 $size 1 "${pics[@]}"
  node scripts/zoo/augment.js "$work/in" "$n" 25 $size 7 "${pics[@]}"
  for m in $models; do
    [ -f "$zoo/$m.trained.onnx" ] && continue
    mkdir -p "$zoo"
    /usr/bin/python3 scripts/zoo/train_classifier.py "$m" "$work/train" ${#pics[@]} \
      "$zoo/$m.trained.onnx" --epochs 4 --val "$work/in"
  done
else
  for m in $models; do
    [ -f "$zoo/$m.randnorm.onnx" ] || scripts/zoo/export.sh --models "$(tr ' ' ',' <<<"$models")"
  done
fi
[ -d "$work/in" ] || node scripts/zoo/augment.js "$work/in" "$n" 25 $size 7 "${pics[@]}"
node scripts/zoo/augment.js "$work/cal" 16 1 $size 99 "${pics[@]}"
bf16=1
"$es" inspect "$zoo/$(cut -d' ' -f1 <<<"$models").$variant.onnx" --precision bf16 >/dev/null 2>&1 || bf16=0
for m in $models; do
  src="$zoo/$m.$variant.onnx"
  # shellcheck disable=SC2086
  "$es" quantize "$src" -o "$work/$m.int8.onnx" --calibrate "$work/cal" $qopts >"$work/$m.q.log"
  for b in "$work"/in/*.npy; do
    k=$(basename "$b" .npy)
    "$es" run "$src" "$b" --output-dir "$work/$m/fp32/$k" >/dev/null
    "$es" run "$work/$m.int8.onnx" "$b" --output-dir "$work/$m/int8/$k" >/dev/null
    [ $bf16 = 0 ] || "$es" run "$src" "$b" --precision bf16 --output-dir "$work/$m/bf16/$k" >/dev/null
  done
  node - "$work/$m" "$m" "$(grep -m1 'nodes in int8' "$work/$m.q.log" | sed 's/^ *//')" \
    "$([ $trained = 1 ] && echo ${#pics[@]} || echo 0)" <<'JS'
const fs = require('fs'), path = require('path');
const npy = require(path.resolve('scripts/ort/npy'));
const [dir, name, qline, kArg] = process.argv.slice(2);
const K = Number(kArg) || 0; // trained: picture i's source is i mod K
const top = (kind) => {
  const rows = [];
  for (const k of fs.readdirSync(path.join(dir, 'fp32')).sort()) {
    const d = path.join(dir, kind, k);
    if (!fs.existsSync(d)) return null;
    const t = npy.read(path.join(d, fs.readdirSync(d)[0]));
    const c = t.shape[t.shape.length - 1];
    for (let r = 0; r < t.data.length / c; r++) {
      let best = 0, second = -Infinity;
      for (let j = 1; j < c; j++) if (t.data[r * c + j] > t.data[r * c + best]) best = j;
      for (let j = 0; j < c; j++) if (j !== best) second = Math.max(second, t.data[r * c + j]);
      rows.push({ best, margin: t.data[r * c + best] - second });
    }
  }
  return rows;
};
const f = top('fp32'), classes = new Set(f.map((r) => r.best)).size;
const acc = (rows) => (100 * rows.filter((r, i) => r.best === i % K).length / rows.length).toFixed(1);
if (K) console.log(`${name} fp32: ${acc(f)}% of the pictures' sources right`);
for (const kind of ['int8', 'bf16']) {
  const o = top(kind);
  if (!o) continue;
  if (K) console.log(`${name} ${kind}: ${acc(o)}% of the pictures' sources right`);
  let same = 0;
  const flipped = [];
  o.forEach((r, i) => (r.best === f[i].best ? same++ : flipped.push(f[i].margin)));
  const med = (xs) => (xs.length ? xs.sort((a, b) => a - b)[xs.length >> 1] : NaN);
  console.log(`${name} ${kind}: top-1 agreement ${(100 * same / f.length).toFixed(1)}% of ${f.length} ` +
              `(${classes} distinct FP32 classes; FP32 margin of the flipped: median ${med(flipped).toExponential(2)}, ` +
              `of all: ${med(f.map((r) => r.margin)).toExponential(2)})` + (kind === 'int8' ? `; ${qline}` : ''));
}
JS
done
