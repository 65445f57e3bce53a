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

[ $fail -eq 0 ] && echo "test_ocr_cli: ok"
exit $fail
