# Sourced by the end-to-end accuracy tests (quantize, precision), after they
# set $work (a scratch folder), $src (the source tree) and fail=0.
#   check NAME COMMAND...: runs a check, prints its lines prefixed by NAME,
#     sets fail=1 when it fails.
#   bad WANT_STATUS WANT_TEXT COMMAND...: a refusal: the command must exit
#     WANT_STATUS with WANT_TEXT in its output, else fail=1.
#   text_ppm OUT.ppm WIDTH HEIGHT POINTSIZE X Y TEXT: black text on white.
#   ocr_page OUT.png: the seven-line page the OCR checks read (ocr_truth;
#     about 170 characters, so one misread is 0.6 points).
#   ocr_accuracy REF.json OTHER.json NAME: `ocr --json` answers' character
#     accuracy against ocr_truth (spaces aside: PP-OCRv4's dictionary reads
#     most of them as nothing); OTHER (called NAME) within 1 point of REF,
#     REF above 80%.
#   serve_start LOG SERVE_OPTIONS...: `$es serve --port 0` in the background;
#     sets spid, and port once it answers /v2/health/ready (empty if it
#     died or took over a minute; the caller's checks then fail).
check() {
  local name=$1
  shift
  if "$@" >"$work/check.log" 2>&1; then
    sed "s/^/  $name: /" "$work/check.log"
  else
    sed "s/^/  $name: /" "$work/check.log"
    echo "FAIL $name"
    fail=1
  fi
}
bad() {
  local want=$1 text=$2
  shift 2
  "$@" >"$work/bad.log" 2>&1
  local st=$?
  if [ $st -ne "$want" ] || ! grep -q -- "$text" "$work/bad.log"; then
    echo "FAIL refusal ($*): status $st, wanted $want and '$text':"; cat "$work/bad.log"; fail=1
  else
    echo "  ok: $(head -1 "$work/bad.log")"
  fi
}
text_ppm() {
  convert -size "$2x$3" xc:white -font DejaVu-Sans -fill black -pointsize "$4" \
    -annotate "+$5+$6" "$7" -depth 8 "$1"
}
serve_start() {
  local log=$1
  shift
  "$es" serve --port 0 "$@" >"$log" 2>&1 &
  spid=$!
  port=""
  for _ in $(seq 600); do
    port=$(sed -n 's#.*serving .* on http://[0-9.]*:\([0-9]*\)/v2.*#\1#p' "$log")
    [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/v2/health/ready" >/dev/null && return 0
    kill -0 $spid 2>/dev/null || break
    sleep 0.1
  done
  return 1
}
ocr_truth="Serial 4711-0815 OK|HELLO 2026 edge boxes|the quick brown fox jumps over the lazy dog|Invoice 0042 total 318.50 EUR|KServe v2 gateway camera 7|Pack my box with five dozen liquor jugs|Deliver to Dock 3, Gate B"
ocr_page() {
  text_ppm "$work/ocr_page.ppm" 640 640 36 30 80 'Serial 4711-0815 OK'
  convert "$work/ocr_page.ppm" -font DejaVu-Sans -pointsize 24 -annotate +40+170 'HELLO 2026 edge boxes' \
    -pointsize 16 -annotate +40+240 'the quick brown fox jumps over the lazy dog' \
    -pointsize 22 -annotate +40+320 'Invoice 0042 total 318.50 EUR' \
    -pointsize 20 -annotate +40+400 'KServe v2 gateway camera 7' \
    -pointsize 18 -annotate +40+480 'Pack my box with five dozen liquor jugs' \
    -pointsize 26 -annotate +40+560 'Deliver to Dock 3, Gate B' -depth 8 "$1"
}
ocr_accuracy() {
  node -e '
    const fs = require("fs");
    const truth = process.argv[4].split("|").join("").replace(/ /g, "");
    const read = (f) => JSON.parse(fs.readFileSync(f)).lines.map((l) => l.text).join("").replace(/ /g, "");
    const dist = require(process.argv[5] + "/scripts/bench/text_dist.js").editDistance;
    const acc = (s) => 100 * (1 - dist(s, truth) / truth.length);
    const a = acc(read(process.argv[1])), b = acc(read(process.argv[2]));
    console.log(`fp32 ${a.toFixed(1)}%, ${process.argv[3]} ${b.toFixed(1)}% of ${truth.length} characters`);
    process.exit(a > 80 && b >= a - 1 ? 0 : 1);
  ' "$1" "$2" "$3" "$ocr_truth" "$src"
}
