#!/usr/bin/env bash
# Cross-builds edgeserve for 64-bit Arm (the boards' aarch64 Linux) on an
# x86-64 Debian 12 machine and checks the result under qemu-user:
#   1. installs what it needs with apt when something is missing (the arm64
#      architecture, crossbuild-essential-arm64, qemu-user and the arm64
#      multiarch -dev packages), after scripts/setup/deps.sh, the models and
#      ONNX Runtime for Node.js;
#   2. builds the tree with cmake/toolchain-aarch64-linux-gnu.cmake (Release,
#      tests on, warnings are errors) into BUILD (default build-arm64);
#   3. runs the unit tests through ctest, which starts each test executable
#      in qemu-aarch64 (the toolchain's CMAKE_CROSSCOMPILING_EMULATOR, a
#      Cortex-A76), with every timeout ten times longer (emulated, oneDNN's
#      portable kernels run whole models up to 200 times slower than x86
#      natively). Left out: the e2e label (bash scripts that exec the CLI
#      directly, which a host without binfmt_misc cannot, most of them
#      starting servers and timing their answers: under emulation that
#      measures the emulator; the five models' parity is step 4 instead),
#      and, unless --all: test_oom and test_server_oom (each reruns every
#      model hundreds of times with one allocation failing: 12 and 8 s on
#      x86, hours emulated; what they check does not depend on the CPU) and
#      test_server_races (its hammer case unloads models under load and
#      needs the server's 10 s unload drain to outlast any running request:
#      an emulated OCR request takes longer);
#   4. ONNX Runtime parity of the five target models: ORT on this x86 machine
#      computes the references for the inputs tests/e2e/test_vs_ort.sh uses
#      (seeded random tensors and a rendered text page) and for real images
#      (scripts/setup/fetch-images.sh: a face for BlazeFace, a text page for
#      the detector); the arm64 `edgeserve run` under qemu-aarch64 runs the
#      same inputs, and scripts/ort/compare.js holds its outputs to the x86
#      test's tolerances (1e-3 absolute for probabilities, 1e-3 of the
#      output's range otherwise). One line per case with the largest
#      absolute error and the largest error relative to the output's range
#      (large for a probability map of random input, all near zero: its
#      limit is absolute), then "N passed, N failed".
# Each stage's time is printed at the end. Not in CI: about 23 minutes on a
# 2-core machine from an empty build folder (build 2.5, unit tests 17,
# parity 3).
#   scripts/arm64-check.sh [--build DIR] [--no-install] [--skip-unit] [--all]
#                          [--skip-parity] [--ctest-args "ARGS"]
# --no-install: use what is installed, fail if something is missing.
# --ctest-args: more arguments for the unit tests' ctest (e.g. "-R test_k_").
# Exits non-zero when the build, a unit test or a parity case fails.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
src=$PWD

build=build-arm64 install=1 unit=1 parity=1 ctest_args="" unit_line=""
slow='^(test_oom|test_server_oom|test_server_races)$'

while [ $# -gt 0 ]; do
  case $1 in
    --build) build=${2:?--build needs a folder}; shift 2 ;;
    --no-install) install=0; shift ;;
    --skip-unit) unit=0; shift ;;
    --skip-parity) parity=0; shift ;;
    --all) slow=""; shift ;;
    --ctest-args) ctest_args=${2?--ctest-args needs a string}; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "arm64-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case $build in /*) ;; *) build=$src/$build ;; esac
triple=aarch64-linux-gnu
models=${ES_MODEL_DIR:-$src/.cache/models}
images=${ES_IMAGE_DIR:-$src/.cache/images}
# The same CPU the toolchain file gives ctest's emulator.
qemu_cpu=${ES_QEMU_CPU:-cortex-a76}

timings=()
stage_start=0
stage() { stage_start=$SECONDS; echo "== $1"; }
stage_end() { timings+=("$(printf '%-28s %5d s' "$1" $((SECONDS - stage_start)))"); }
summary() {
  echo "== stage times"
  printf '  %s\n' "${timings[@]}"
}
die() { echo "arm64-check: $*" >&2; summary; exit 1; }

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

# ---- 1. packages, models, ONNX Runtime -------------------------------------------
stage "setup"
# libdnnl-dev is not among them: it is Multi-Arch: same, but its
# dnnl_config.h differs between amd64 (GPU runtime OpenCL) and arm64 (none),
# so dpkg refuses the arm64 one beside the amd64 one the x86 build needs.
# The arm64 library (libdnnl2) co-installs; the arm64 -dev package's headers
# are unpacked into the build folder instead (below).
pkgs=(
  crossbuild-essential-arm64 qemu-user
  libdnnl2:arm64 libprotobuf-c-dev:arm64 libssl-dev:arm64 libjansson-dev:arm64
  libmicrohttpd-dev:arm64 libjpeg62-turbo-dev:arm64 libspng-dev:arm64 libsystemd-dev:arm64
  libcmocka-dev:arm64 zlib1g-dev:arm64
)
if [ $install -eq 1 ]; then
  scripts/setup/deps.sh || die "scripts/setup/deps.sh failed"
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    echo "adding the arm64 architecture to dpkg"
    $sudo dpkg --add-architecture arm64 || die "dpkg --add-architecture arm64 failed"
    $sudo apt-get update -qq || die "apt-get update failed"
  fi
  missing=()
  for p in "${pkgs[@]}"; do installed "$p" || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "installing: ${missing[*]}"
    $sudo apt-get update -qq
    # Multi-Arch: same packages must have one version on both architectures,
    # so apt may upgrade the amd64 twin of an arm64 library to the archive's
    # current point release; it removes nothing.
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
      "${missing[@]}" || die "apt-get install failed"
  fi
  if [ $parity -eq 1 ]; then
    scripts/setup/fetch-models.sh || die "scripts/setup/fetch-models.sh failed"
    scripts/setup/fetch-images.sh || die "scripts/setup/fetch-images.sh failed"
    scripts/setup/install-ort.sh || die "scripts/setup/install-ort.sh failed"
  fi
fi
for p in "${pkgs[@]}"; do installed "$p" || die "$p is not installed (run without --no-install)"; done
command -v qemu-aarch64 >/dev/null || die "qemu-aarch64 is missing (qemu-user)"

# The arm64 oneDNN headers: the installed -dev package's when there is one,
# else the package of the installed library's version unpacked (not
# installed) into the build folder. Only the headers are used from it; the
# library is libdnnl2:arm64's.
dnnl_args=()
if ! installed libdnnl-dev:arm64; then
  ver=$(dpkg-query -W -f='${Version}' libdnnl2:arm64)
  dnnl=$build/dnnl-dev-$ver
  if [ ! -f "$dnnl/usr/include/oneapi/dnnl/dnnl.h" ]; then
    mkdir -p "$build"
    tmp=$(mktemp -d)
    chown _apt "$tmp" 2>/dev/null || true # apt downloads as its sandbox user
    (cd "$tmp" && apt-get download -qq "libdnnl-dev:arm64=$ver") ||
      { rm -rf "$tmp"; die "apt-get download libdnnl-dev:arm64=$ver failed"; }
    rm -rf "$dnnl"
    dpkg-deb -x "$tmp"/libdnnl-dev_*_arm64.deb "$dnnl" || { rm -rf "$tmp"; die "dpkg-deb -x failed"; }
    rm -rf "$tmp"
  fi
  dnnl_args=(-DES_DNNL_INCLUDE="$dnnl/usr/include" -DES_DNNL_LIB="/usr/lib/$triple/libdnnl.so.2")
fi
stage_end "setup"

# ---- 2. cross build ----------------------------------------------------------------
stage "build ($build)"
scripts/build.sh "$build" -DCMAKE_TOOLCHAIN_FILE="$src/cmake/toolchain-$triple.cmake" \
  -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=ON -DES_QEMU_CPU="$qemu_cpu" \
  -DES_TEST_TIMEOUT_SCALE=10 "${dnnl_args[@]}" ||
  die "the cross build failed"
# ELF e_machine (bytes 18-19, little-endian) 183: EM_AARCH64.
[ "$(od -An -tx1 -j18 -N2 "$build/edgeserve" | tr -d ' ')" = b700 ] ||
  die "$build/edgeserve is not an aarch64 binary"
stage_end "build"

status=0

# ---- 3. unit tests under qemu ------------------------------------------------------------
if [ $unit -eq 1 ]; then
  stage "unit tests (qemu-aarch64 -cpu $qemu_cpu)"
  exclude=()
  [ -z "$slow" ] || exclude=(-E "$slow")
  # shellcheck disable=SC2086 # ctest_args is split on purpose
  ctest --test-dir "$build" -j"$(nproc)" -LE e2e "${exclude[@]}" --output-on-failure $ctest_args 2>&1 |
    tee "$build/unit-tests.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  unit_line=$(grep -E 'tests passed, [0-9]+ tests? failed out of' "$build/unit-tests.log" | tail -n 1)
  stage_end "unit tests"
fi

# ---- 4. ONNX Runtime parity --------------------------------------------------------------
if [ $parity -eq 1 ]; then
  stage "references (ONNX Runtime, x86)"
  ort=$src/scripts/ort
  work=$build/parity
  rm -rf "$work"
  mkdir -p "$work/in" "$work/ref" "$work/arm64"
  for f in ppocr_det.onnx ppocr_rec.onnx ppocr_cls.onnx blazeface_front_128.onnx \
           blazeface_back_256.onnx; do
    [ -f "$models/$f" ] || die "$models/$f is missing (scripts/setup/fetch-models.sh)"
  done
  node -e "require('$src/.cache/ort/node_modules/onnxruntime-node')" 2>/dev/null ||
    die "onnxruntime-node is missing (scripts/setup/install-ort.sh)"
  command -v convert >/dev/null || die "ImageMagick's convert is missing (scripts/setup/deps.sh)"
  node "$ort/make_inputs.js" "$work/in" >/dev/null || die "make_inputs.js failed"
  # The rendered page of tests/e2e/test_vs_ort.sh: on noise the detector's
  # probability map is all zeros, on text it is not.
  convert -size 640x640 xc:white -font DejaVu-Sans -fill black \
    -pointsize 36 -annotate +30+80 'edgeserve reads text' \
    -pointsize 24 -annotate +40+180 'Serial 4711-0815 OK' \
    -pointsize 48 -annotate +20+330 'HELLO 2026' \
    -pointsize 18 -annotate +60+450 'the quick brown fox jumps over the lazy dog' \
    -depth 8 "$work/text.ppm" || die "convert failed"
  node "$ort/image_npy.js" "$work/text.ppm" "$work/in/ppocr_det_text.npy" || die "image_npy.js failed"
  # Real photographs: a face (BlazeFace's inputs are NHWC in [-1, 1]) and a
  # printed page at the detector's multiple of 32.
  { [ -f "$images/astronaut.png" ] && [ -f "$images/bw_text.png" ]; } ||
    die "test images missing (scripts/setup/fetch-images.sh)"
  for s in 128 256; do
    convert "$images/astronaut.png" -resize "${s}x${s}!" -depth 8 "$work/face$s.ppm" || die "convert failed"
    node "$ort/image_npy.js" "$work/face$s.ppm" "$work/in/face$s.npy" --norm half --nhwc ||
      die "image_npy.js failed"
  done
  convert "$images/bw_text.png" -resize '512x320!' -depth 8 "$work/page.ppm" || die "convert failed"
  node "$ort/image_npy.js" "$work/page.ppm" "$work/in/ppocr_det_page.npy" || die "image_npy.js failed"

  cases=(
    "blazeface_front_128 blazeface_front_128"
    "blazeface_front_128 face128"
    "blazeface_back_256 blazeface_back_256"
    "blazeface_back_256 face256"
    "ppocr_cls ppocr_cls"
    "ppocr_rec ppocr_rec_w80"
    "ppocr_rec ppocr_rec_w320"
    "ppocr_rec ppocr_rec_w1000"
    "ppocr_det ppocr_det_320"
    "ppocr_det ppocr_det_960x640"
    "ppocr_det ppocr_det_text"
    "ppocr_det ppocr_det_page"
  )
  for c in "${cases[@]}"; do
    read -r model input <<<"$c"
    node "$ort/ort_run.js" "$models/$model.onnx" "$work/ref/$input" "$work/in/$input.npy" \
      >"$work/ref-$input.log" 2>&1 || { cat "$work/ref-$input.log"; die "ORT failed on $input"; }
  done
  stage_end "references (x86 ORT)"

  stage "parity (edgeserve arm64 under qemu-aarch64 -cpu $qemu_cpu)"
  pass=0 fail=0
  printf '%-20s %-20s %-5s %11s %11s %8s\n' model input result "max abs" "max rel" "qemu s"
  for c in "${cases[@]}"; do
    read -r model input <<<"$c"
    t0=$SECONDS
    if ! qemu-aarch64 -L / -cpu "$qemu_cpu" "$build/edgeserve" run "$models/$model.onnx" \
         "$work/in/$input.npy" --output-dir "$work/arm64/$input" >"$work/arm64-$input.log" 2>&1; then
      printf '%-20s %-20s %-5s %s\n' "$model" "$input" FAIL "edgeserve run failed:"
      cat "$work/arm64-$input.log"
      fail=$((fail + 1))
      continue
    fi
    secs=$((SECONDS - t0))
    if node "$ort/compare.js" "$work/arm64/$input" "$work/ref/$input" >"$work/cmp-$input.log" 2>&1
    then res=ok; pass=$((pass + 1)); else res=FAIL; fail=$((fail + 1)); status=1; fi
    # compare.js: "... max abs err E, range [LO, HI], limit ..." per output;
    # the relative error is E over the output's range (what the limit scales).
    read -r abs rel < <(sed -nE 's/.*max abs err ([^,]*), range \[([^,]*), ([^]]*)\].*/\1 \2 \3/p' \
      "$work/cmp-$input.log" | awk '{ r = $3 - $2; e = $1 + 0; q = r > 0 ? e / r : e
                                      if (e > a) a = e; if (q > m) m = q }
                                    END { printf "%.3e %.3e\n", a, m }')
    printf '%-20s %-20s %-5s %11s %11s %8d\n' "$model" "$input" "$res" "$abs" "$rel" "$secs"
    [ $res = ok ] || cat "$work/cmp-$input.log"
  done
  stage_end "parity (arm64 under qemu)"
  [ $fail -eq 0 ] || status=1
fi

summary
[ -z "$unit_line" ] || echo "unit tests: $unit_line"
[ $parity -eq 0 ] || echo "parity: $pass passed, $fail failed"
exit $status
