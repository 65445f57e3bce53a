#!/usr/bin/env bash
# The scenario's frames (scripts/demo/scenario.js, scripts/demo.sh), made from the
# pinned public-domain sample images (scripts/setup/fetch-images.sh) and from text
# rendered here with ImageMagick and the DejaVu fonts. Deterministic: the
# same inputs give the same files (metadata stripped). Nothing is committed.
#   scripts/demo/make_images.sh [DEST]   (default .cache/scenario)
# Writes:
#   cam0.ppm .. cam3.ppm  640x640 RGB frames of the four detection cameras
#                          (astronaut, coffee, a rendered loading-dock sign,
#                          the astronaut mirrored with a caption); the driver
#                          normalises them into PP-OCR det tensors
#   door.jpg              the door camera: astronaut.png as a JPEG (quality 90)
#   plate.png             a 320x96 "serial plate" with the text ES-4711-B
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=${1:-.cache/scenario}
img=${ES_IMAGE_DIR:-.cache/images}
command -v convert >/dev/null || { echo "make_images: ImageMagick 'convert' is needed (scripts/setup/deps.sh)" >&2; exit 1; }
for f in astronaut.png coffee.png; do
  [ -f "$img/$f" ] || { echo "make_images: $img/$f missing (scripts/setup/fetch-images.sh)" >&2; exit 1; }
done
mkdir -p "$dest"
font=DejaVu-Sans
mono=DejaVu-Sans-Mono-Bold
ppm() { convert "$@" -strip -depth 8 -type TrueColor ppm:-; }

ppm "$img/astronaut.png" -resize '640x640!' >"$dest/cam0.ppm.tmp"
ppm "$img/coffee.png" -resize '640x640!' >"$dest/cam1.ppm.tmp"
ppm -size 640x640 xc:'#d8d8d0' -font "$font" -fill '#202020' \
  -pointsize 56 -annotate +40+110 'LOADING DOCK 3' \
  -pointsize 32 -annotate +40+200 'No parking 06:00-22:00' \
  -pointsize 32 -annotate +40+260 'Deliveries: ring the bell' \
  -fill '#a01010' -pointsize 72 -annotate +40+420 'STOP' \
  -fill '#202020' -pointsize 24 -annotate +40+560 'Gate 12 - camera 2 - zone B' >"$dest/cam2.ppm.tmp"
ppm "$img/astronaut.png" -flop -resize '640x640!' -fill white -stroke black -strokewidth 1 \
  -font "$font" -pointsize 40 -annotate +30+610 'HANGAR EXIT 4' >"$dest/cam3.ppm.tmp"
convert "$img/astronaut.png" -strip -quality 90 "jpg:$dest/door.jpg.tmp"
convert -size 320x96 xc:white -font "$mono" -fill black -pointsize 40 -gravity center \
  -annotate +0+0 'ES-4711-B' -strip -define png:exclude-chunks=date,time "png:$dest/plate.png.tmp"
for f in cam0.ppm cam1.ppm cam2.ppm cam3.ppm door.jpg plate.png; do
  mv "$dest/$f.tmp" "$dest/$f"
done
echo "scenario images: cam0..3.ppm (640x640), door.jpg, plate.png in $dest"
