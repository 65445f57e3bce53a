#!/usr/bin/env bash
# edgeserve ocr, end to end: the command as a script would use it.
#
# Renders a two-line PNG with ImageMagick (and a JPEG of it), runs
# `edgeserve ocr` and checks that stdout is one JSON object with the image's
# size, two lines whose text matches what was drawn (whitespace aside: the
# recogniser drops some inter-word spaces; and full-width forms such as
# U+FF01 for '!', which the Chinese model writes at times, count as their
# ASCII selves: NFKC), four-corner boxes inside the
# image and a positive "ms"; that --no-cls and the JPEG read the same; and
# that usage errors exit 2 and unreadable images exit 1 with a message.
# Then two fixes the OCR benchmark (scripts/bench/bench_ocr.sh) led to: a
# rendered page read with its word spaces, a photographed page with all of
# its lines.
#   test_ocr_cli.sh EDGESERVE_BINARY SOURCE_DIR
set -uo pipefail
es=$1
src=$2
models=${ES_MODEL_DIR:-$src/.cache/models}
export ES_MODEL_DIR=$models
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for f in ppocr_det.onnx ppocr_cls.onnx ppocr_rec.onnx ppocr_keys_v1.txt; do
  [ -f "$models/$f" ] || { echo "test_ocr_cli: $f missing (scripts/setup/fetch-models.sh)"; exit 1; }
done
# A missing tool skips the test (exit 77, CTest's SKIP_RETURN_CODE).
if ! command -v convert >/dev/null 2>&1; then
  echo "test_ocr_cli: ImageMagick's convert not installed (scripts/setup/deps.sh installs it): skipped"
  exit 77
fi
if command -v python3 >/dev/null 2>&1; then
  json=python3
else
  echo "test_ocr_cli: python3 not installed, needed to parse the JSON (scripts/setup/deps.sh installs it): skipped"
  exit 77
fi

fail=0
bad() { echo "FAIL: $*"; fail=1; }

# The font by file (fontconfig's fc-match), else by ImageMagick's own name
# for it: without -font ImageMagick falls back to Helvetica, which a Debian
# root without Ghostscript's fonts does not have.
font=$(fc-match -f '%{file}' DejaVuSans 2>/dev/null)
fontarg=(-font DejaVu-Sans)
[ -n "$font" ] && [ -f "$font" ] && fontarg=(-font "$font")
convert -size 720x170 xc:white "${fontarg[@]}" -pointsize 32 -fill black \
  -annotate +30+60 'Hello, edgeserve 2024!' -annotate +30+125 'Price: $12.50 (incl. tax)' \
  "$work/two.png" || { bad "convert failed"; exit 1; }
convert "$work/two.png" -quality 92 "$work/two.jpg"

# Parse one result: prints "W H N TEXT" with TEXT the lines joined, no
# whitespace, or fails on anything that is not the documented object.
parse() {
  $json - "$1" <<'EOF'
import json, sys, unicodedata
j = json.load(open(sys.argv[1]))
for k in ("image", "width", "height", "lines", "ms"):
    assert k in j, "no " + k
assert j["ms"] > 0
for l in j["lines"]:
    assert isinstance(l["text"], str) and 0.5 <= l["confidence"] <= 1
    assert len(l["box"]) == 4
    for x, y in l["box"]:
        assert 0 <= x < j["width"] and 0 <= y < j["height"], "box outside the image"
text = "".join("".join(l["text"].split()) for l in j["lines"])
print(j["width"], j["height"], len(j["lines"]), unicodedata.normalize("NFKC", text))
EOF
}

want="Hello,edgeserve2024!Price:\$12.50(incl.tax)"
"$es" ocr "$work/two.png" --json >"$work/png.json" 2>"$work/png.err" ||
  { bad "ocr two.png exited $?"; cat "$work/png.err"; }
cat "$work/png.json"
got=$(parse "$work/png.json") || bad "two.png: not the documented JSON"
[ "$got" = "720 170 2 $want" ] || bad "two.png: got '$got', want '720 170 2 $want'"

"$es" ocr "$work/two.png" --no-cls >"$work/nocls.json" 2>&1 || bad "--no-cls exited $?"
got=$(parse "$work/nocls.json") || bad "--no-cls: not the documented JSON"
[ "$got" = "720 170 2 $want" ] || bad "--no-cls: got '$got'"

"$es" ocr "$work/two.jpg" >"$work/jpg.json" 2>&1 || bad "two.jpg exited $?"
got=$(parse "$work/jpg.json") || bad "two.jpg: not the documented JSON"
[ "$got" = "720 170 2 $want" ] || bad "two.jpg: got '$got'"

"$es" ocr >/dev/null 2>&1
[ $? -eq 2 ] || bad "no image: want exit 2"
"$es" ocr "$work/two.png" --frobnicate >/dev/null 2>&1
[ $? -eq 2 ] || bad "unknown option: want exit 2"
"$es" ocr "$work/two.png" "$work/two.jpg" >/dev/null 2>&1
[ $? -eq 2 ] || bad "two images: want exit 2"
"$es" ocr "$work/nope.png" >/dev/null 2>"$work/nope.err"
[ $? -eq 1 ] && grep -q "nope.png" "$work/nope.err" || bad "missing file: want exit 1 naming it"
head -c 300 "$work/two.png" >"$work/cut.png"
"$es" ocr "$work/cut.png" >"$work/cut.out" 2>"$work/cut.err"
[ $? -eq 1 ] && [ -s "$work/cut.err" ] && [ ! -s "$work/cut.out" ] ||
  bad "truncated PNG: want exit 1, a message and no output"
printf 'not an image' >"$work/text.png"
"$es" ocr "$work/text.png" >/dev/null 2>"$work/text.err"
[ $? -eq 1 ] && grep -q "not a JPEG or PNG" "$work/text.err" || bad "text file: want exit 1"

# Lines with their spaces (the box margin where it is free, unclip_rect):
# a rendered page's five lines, word for word. With the boxes grown by 1.5
# on every side, three of them came out without a space.
page=("Edge gateways read camera streams" "and small models share one box."
      "Memory is planned before each run," "so requests never exceed the budget."
      "Serial 4711-0815 passed on 2026-12-04.")
convert -size 720x330 xc:white "${fontarg[@]}" -pointsize 26 -interline-spacing 10 -fill '#202020' \
  -gravity northwest -annotate +24+18 "$(printf '%s\n' "${page[@]}")" "$work/page.png"
"$es" ocr "$work/page.png" --json >"$work/page.json" 2>&1 || bad "page.png exited $?"
$json - "$work/page.json" "${page[@]}" <<'EOF' || bad "rendered page: not read word for word"
import json, sys, unicodedata
j = json.load(open(sys.argv[1]))
got = [unicodedata.normalize("NFKC", l["text"]).strip() for l in j["lines"]]
print("rendered page:", " | ".join(got))
sys.exit(0 if got == sys.argv[2:] else 1)
EOF

# A photographed book page (scikit-image's, 384x191, letters 10 px high):
# its bent lines leave background in their rectangles' corners, so the
# box score is taken over each line's outline. Over the rectangles two
# lines scored below 0.6 and were lost; all seven are read (the code
# line's symbols aside).
photo=$src/.cache/images/page.png
if [ -f "$photo" ]; then
  "$es" ocr "$photo" --json >"$work/photo.json" 2>&1 || bad "page.png (photo) exited $?"
  $json - "$work/photo.json" <<'EOF' || bad "photographed page: lines lost"
import json, sys
j = json.load(open(sys.argv[1]))
got = [l["text"] for l in j["lines"]]
print("photographed page:", " | ".join(got))
want = ["Region-based", "Let us first determine", "pixels that we can label", "unambiguously",
        "extreme parts", "histogram", "markers"]
sys.exit(0 if len(got) == 7 and all(w in g for w, g in zip(want, got)) else 1)
EOF
else
  echo "test_ocr_cli: $photo missing (scripts/setup/fetch-images.sh): the photo check is skipped"
fi

[ $fail -eq 0 ] && echo "test_ocr_cli: ok"
exit $fail
