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
#   scripts/bench/classifier_agreement.sh [--models "resnet18 mobilenet_v2"] [--n 1000]
#                                         [--quantize "OPTIONS"]  (edgeserve quantize's, e.g. --method mse)
set -euo pipefail
cd "$(dirname "$0")/../.."
models="resnet18 mobilenet_v2" n=1000 qopts=""
while [ $# -gt 0 ]; do
  case $1 in
    --models) models=$2; shift 2 ;;
    --n) n=$2; shift 2 ;;
    --quantize) qopts=$2; shift 2 ;;
    *) echo "usage: $0 [--models \"resnet18 mobilenet_v2\"] [--n N] [--quantize \"OPTIONS\"]" >&2; exit 2 ;;
  esac
done
es=${ES_BIN:-build-release/edgeserve}
[ -x "$es" ] || scripts/build.sh build-release -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF >/dev/null
scripts/setup/fetch-images.sh >/dev/null
zoo=.cache/zoo
for m in $models; do
  [ -f "$zoo/$m.randnorm.onnx" ] || scripts/zoo/export.sh --models "$(tr ' ' ',' <<<"$models")"
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for f in astronaut coffee; do convert ".cache/images/$f.png" -depth 8 "$work/$f.ppm"; done
convert -size 480x360 xc:white -font DejaVu-Sans -fill black -pointsize 40 -annotate +20+120 'INVOICE 2026' \
  -pointsize 28 -annotate +20+220 'edge boxes read text' -depth 8 "$work/page.ppm"
pics=("$work/astronaut.ppm" "$work/coffee.ppm" "$work/page.ppm")
node scripts/zoo/augment.js "$work/in" "$n" 25 160 7 "${pics[@]}"
node scripts/zoo/augment.js "$work/cal" 16 1 160 99 "${pics[@]}"
bf16=1
"$es" inspect "$zoo/$(cut -d' ' -f1 <<<"$models").randnorm.onnx" --precision bf16 >/dev/null 2>&1 || bf16=0
for m in $models; do
  src="$zoo/$m.randnorm.onnx"
  # shellcheck disable=SC2086
  "$es" quantize "$src" -o "$work/$m.int8.onnx" --calibrate "$work/cal" $qopts >"$work/$m.q.log"
  for b in "$work"/in/*.npy; do
    k=$(basename "$b" .npy)
    "$es" run "$src" "$b" --output-dir "$work/$m/fp32/$k" >/dev/null
    "$es" run "$work/$m.int8.onnx" "$b" --output-dir "$work/$m/int8/$k" >/dev/null
    [ $bf16 = 0 ] || "$es" run "$src" "$b" --precision bf16 --output-dir "$work/$m/bf16/$k" >/dev/null
  done
  node - "$work/$m" "$m" "$(grep -m1 'nodes in int8' "$work/$m.q.log" | sed 's/^ *//')" <<'JS'
const fs = require('fs'), path = require('path');
const npy = require(path.resolve('scripts/ort/npy'));
const [dir, name, qline] = process.argv.slice(2);
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
for (const kind of ['int8', 'bf16']) {
  const o = top(kind);
  if (!o) continue;
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
