#!/usr/bin/env bash
# Calibration images for det (edgeserve quantize --preprocess ocr-det):
# three rendered pages of text and the scikit-image coffee photo, into DIR.
# Shared by the benchmarks that quantize det.
#   scripts/bench/calib_pages.sh DIR
set -euo pipefail
dir=$1
images=$(dirname "$0")/../../.cache/images
mkdir -p "$dir"
i=0
for t in 'edgeserve reads text 1234' 'INVOICE No 2026-0042' 'the quick brown fox'; do
  i=$((i + 1))
  convert -size 640x480 xc:white -font DejaVu-Sans -fill black -pointsize $((20 + 8 * i)) \
    -annotate +8+360 "$t" -depth 8 "$dir/p$i.png"
done
cp "$images/coffee.png" "$dir/"
