#!/usr/bin/env bash
# Fetches the test images for the apps (face detection) into a cache folder.
#
# Why from Debian's python3-skimage: scikit-image ships a few small,
# well-known, freely licensed sample images, and Debian serves them from its
# own signed archive through apt, which the build machines already trust and
# reach. The package is downloaded, never installed (apt-get download + dpkg-deb
# -x in a temporary folder), so nothing on the machine changes.
#   astronaut.png  NASA portrait of astronaut Eileen Collins (public domain):
#                  one face, frontal, about a sixth of the frame wide
#   coffee.png     a cup of coffee: no face
#   page.png       a photo of a printed book page (384x191, letters about
#                  10 px high, tight lines, a code line): the OCR benchmark
#   bw_text.png    a paragraph of Moby-Dick rendered in black on white
#                  (516x333): the OCR benchmark
# Only the image files' sha256 are pinned, not the .deb's: a Debian point
# release rebuilds the package, the sample images inside stay the same.
# Safe to run again: verified files are kept and nothing is fetched.
#   scripts/setup/fetch-images.sh [DEST]      (default: $ES_IMAGE_DIR or .cache/images)
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=${1:-${ES_IMAGE_DIR:-.cache/images}}
mkdir -p "$dest"

pkg=python3-skimage
# file-in-package  sha256  name-in-cache
files=(
  "usr/lib/python3/dist-packages/skimage/data/astronaut.png 88431cd9653ccd539741b555fb0a46b61558b301d4110412b5bc28b5e3ea6cb5 astronaut.png"
  "usr/lib/python3/dist-packages/skimage/data/coffee.png cc02f8ca188b167c775a7101b5d767d1e71792cf762c33d6fa15a4599b5a8de7 coffee.png"
  "usr/lib/python3/dist-packages/skimage/data/page.png 341a6f0a61557662b02734a9b6e56ec33a915b2c41886b97509dedf2a43b47a3 page.png"
  "usr/lib/python3/dist-packages/skimage/data/bw_text.png 308c2b09f8975a69b212e103b18520e8cbb7a4eccfce0f757836cd371f1b9094 bw_text.png"
)

sha_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }

all_ok=1
for f in "${files[@]}"; do
  read -r _ sum name <<<"$f"
  sha_ok "$dest/$name" "$sum" || all_ok=0
done
if [ $all_ok -eq 1 ]; then
  echo "images: all verified in $dest"
  exit 0
fi

for tool in apt-get dpkg-deb sha256sum; do
  command -v "$tool" >/dev/null || { echo "fetch-images: $tool is needed (a Debian or Ubuntu system)" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "images: fetching $pkg (download only, not installed)"
# apt's own messages go to a log, shown only when the download fails (as
# root it warns that it downloads unsandboxed into a folder _apt cannot
# write: harmless here, the images' checksums are verified below).
if ! (cd "$work" && apt-get download -q "$pkg" >"$work/apt.log" 2>&1); then
  echo "fetch-images: apt-get download $pkg failed:" >&2
  sed 's/^/  /' "$work/apt.log" >&2
  echo "fetch-images: is the network up and the package index current (apt-get update)?" >&2
  exit 1
fi
deb=$(find "$work" -maxdepth 1 -name "*.deb" -print -quit)
[ -n "$deb" ] || { echo "fetch-images: apt-get download left no .deb" >&2; exit 1; }
dpkg-deb -x "$deb" "$work/x"
for f in "${files[@]}"; do
  read -r path sum name <<<"$f"
  if [ ! -f "$work/x/$path" ]; then
    echo "fetch-images: $path not in $(basename "$deb")" >&2
    exit 1
  fi
  if ! sha_ok "$work/x/$path" "$sum"; then
    echo "fetch-images: $path: checksum mismatch (want $sum)" >&2
    exit 1
  fi
  cp "$work/x/$path" "$dest/$name.tmp" && mv "$dest/$name.tmp" "$dest/$name"
done
echo "images: all verified in $dest"
