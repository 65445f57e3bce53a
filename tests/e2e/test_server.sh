#!/usr/bin/env bash
# `edgeserve serve` end to end: the KServe v2 REST server over real HTTP.
#
# Starts the server on a free port (--port 0; the port is read from its
# "serving N models on http://HOST:PORT/v2" line), waits for
# /v2/health/ready, then checks with curl and tests/e2e/v2_client.js:
#   1. every endpoint: server and model metadata (also under /versions/1),
#      readiness, 404 for an unknown model and version, the repository index
#      (5 models READY), unload -> UNAVAILABLE / ready 503 / infer 404, load
#      -> READY and inference works again;
#      the control plane: 401 without or with another token, 403 for a
#      cross-origin web page's POST, 415 for a text/plain body, 409 for a
#      model a loaded pipeline runs on, 403 on a server without control;
#   2. inference, JSON and binary, on the five target models gives exactly
#      (max abs diff 0) what `edgeserve run` gives on the same .npy inputs:
#      blazeface front/back, cls, rec at 48x320 and 48x160 (dynamic width),
#      det at 640x640 (binary, and once JSON) and 320x320 (dynamic); an
#      output selection returns only that output;
#   3. priority and timeout parameters (a 1 us timeout on det: 503 with
#      Retry-After, or 200 when it ran anyway);
#   4. malformed requests each get their 4xx with a message naming the
#      problem (truncated binary body, bad Inference-Header-Content-Length,
#      binary_data_size not adding up, wrong rank / fixed dimension /
#      datatype, huge dimensions, invalid JSON, missing or unknown inputs,
#      unknown route, wrong method), and a good request after each batch
#      still gets 200; a client that hangs up mid-body does not hurt it;
#   5. GET /metrics passes `promtool check metrics` (skipped with a message
#      when promtool is missing) and its per-model counters moved exactly by
#      the requests made;
#   6. SIGTERM with det requests in flight: exit 0 within the grace period,
#      every in-flight request answered in full with 200 (or 503 when cut
#      off), the "stopped: ... cut off" report on stderr;
#   7. a second server from a config file (--config, max_body_bytes 2M):
#      413 for a larger body (Content-Length or chunked), chunked uploads
#      under the limit work, and SIGTERM with no grace cuts off cleanly;
#   8. --rt-priority 10: the idle workers wait as SCHED_FIFO 10 threads and
#      an HTTP thread runs at 9 (read from /proc); where real-time threads
#      are not allowed (or made so: no CAP_SYS_NICE, ulimit -r 0), the
#      server does not start and says why.
# Every server's stderr is checked for sanitizer reports (the script sets
# ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 unless already set, so an ASan
# build's leaks fail the exit-code check too).
# Prints one "ok - ..." / "not ok - ..." line per check; exits 1 if any
# failed. A check that cannot run here (no promtool, no test images, no
# ImageMagick or font) prints "# skipped: ..."; then, when nothing failed,
# the test exits 77 (CTest's SKIP_RETURN_CODE) so that CTest shows it as
# skipped, not passed; so does a missing node or curl, at the start.
# Request counts are small (det runs ~10 times) so that an ASan build
# finishes in a few minutes.
#   test_server.sh EDGESERVE_BINARY SOURCE_DIR
set -uo pipefail
es=$1
src=$2
models=${ES_MODEL_DIR:-$src/.cache/models}
client="$src/tests/e2e/v2_client.js"
work=$(mktemp -d)
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
t_start=$(date +%s)

declare -A servers # pid -> 1 while it is ours and not yet reaped
cleanup() {
  for p in "${!servers[@]}"; do
    kill -KILL "$p" 2>/dev/null
  done
  rm -rf "$work"
}
trap cleanup EXIT

for need in node curl; do
  command -v $need >/dev/null ||
    { echo "test_server: '$need' is missing (scripts/setup/deps.sh installs it): skipped"; exit 77; }
done
[ -f "$models/ppocr_det.onnx" ] || { echo "test_server: models missing (scripts/setup/fetch-models.sh)"; exit 1; }
models=$(cd "$models" && pwd)
export ES_MODEL_DIR=$models # the embedded default set finds them wherever we run

n_ok=0
n_fail=0
n_skip=0
ok() { echo "ok - $*"; n_ok=$((n_ok + 1)); }
skipped() { echo "# skipped: $*"; n_skip=$((n_skip + 1)); }
notok() { echo "not ok - $*"; n_fail=$((n_fail + 1)); }
get() { node "$client" get "$@"; }

# ---- servers ------------------------------------------------------------------

# start_server NAME ARGS...: sets url and spid, or returns 1.
source "$(dirname "$0")/serve_lib.sh"
start_server() {
  local name=$1
  shift
  "$es" serve --port 0 "$@" 2>"$work/$name.err" &
  spid=$!
  servers[$spid]=1
  await_server "$name" "$spid" "$work/$name.err" || return 1
  echo "# server '$name' on $url (pid $spid): $(grep '^edgeserve: serving' "$work/$name.err")"
}

# wait_exit PID SECONDS: the exit status, or 255 when it is still running.
wait_exit() {
  local pid=$1 limit=$2 i st
  for ((i = 0; i < limit * 10; i++)); do
    st=$(ps -o stat= -p "$pid" 2>/dev/null)
    if [ -z "$st" ] || [[ $st == Z* ]]; then
      wait "$pid"
      st=$?
      unset "servers[$pid]"
      return $st
    fi
    sleep 0.1
  done
  return 255
}

sanitizer_clean() { # NAME
  if grep -Eq 'AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer|runtime error:' "$work/$1.err"; then
    notok "server '$1': sanitizer report on stderr:"
    grep -E -A30 'Sanitizer|runtime error:' "$work/$1.err" | head -60 | sed 's/^/#   /'
  else
    ok "server '$1': no sanitizer report"
  fi
}

# ---- HTTP helpers ---------------------------------------------------------------

# http METHOD PATH [curl args]: code, $work/last.body, $work/last.hdr
http() {
  local m=$1 p=$2
  shift 2
  code=$(curl -s -m 120 -X "$m" -o "$work/last.body" -D "$work/last.hdr" -w '%{http_code}' "$@" "$url$p")
}
# expect "CODE|CODE" REGEX DESCRIPTION: the last response's status and body.
expect() {
  local want=$1 re=$2 desc=$3
  if [[ "|$want|" == *"|$code|"* ]] && { [ -z "$re" ] || grep -Eiq -- "$re" "$work/last.body"; }; then
    ok "$desc"
  else
    notok "$desc (want $want${re:+ and /$re/}, got $code: $(head -c 300 "$work/last.body"))"
  fi
}
header() { # NAME: the value in the last response, "" if absent
  tr -d '\r' <"$work/last.hdr" | awk -v h="$(echo "$1" | tr A-Z a-z)" -F': ' 'tolower($1) == h {print $2}' | tail -1
}

declare -A succ refused_deadline
count_success() { succ[$1]=$((${succ[$1]:-0} + 1)); }

n_out=0
mkdir -p "$work/out"
# infer_cmp DESC MODEL REF_DIR INPUT=FILE [client options]: 200, the expected
# kind of response (binary with --binary-output or an output ":bin"), and
# every output of REF_DIR equal in the response.
infer_cmp() {
  local desc=$1 model=$2 ref=$3 input=$4
  shift 4
  local out="$work/out/$((++n_out))" want_bin=false a
  for a in "$@"; do [[ $a == --binary-output || $a == *:bin ]] && want_bin=true; done
  node "$client" infer "$url" "$model" --input "$input" --out "$out" "$@" >"$out.json" 2>&1
  local st
  st=$(get "$out.json" 'j.status')
  if [ "$st" != 200 ]; then
    notok "$desc: status $st: $(head -c 300 "$out.json")"
    return 1
  fi
  count_success "${model%%/*}"
  local dec bin
  dec=$(get "$out.json" 'j.decode_error || ""')
  bin=$(get "$out.json" 'j.binary')
  if [ -n "$dec" ]; then
    notok "$desc: response does not decode: $dec"
  elif [ "$bin" != "$want_bin" ]; then
    notok "$desc: binary response $bin, wanted $want_bin"
  elif cmpout=$(node "$client" cmp "$ref" "$out" 2>&1); then
    ok "$desc"
  else
    notok "$desc: outputs differ from edgeserve run:"
    echo "$cmpout" | sed 's/^/#   /'
  fi
}

# good_cls DESC: a binary cls request must still get 200.
good_cls() {
  http POST /v2/models/ppocr_cls/infer -H "Inference-Header-Content-Length: $cls_hl" \
    -H 'Content-Type: application/octet-stream' --data-binary @"$work/cls.bin"
  expect 200 '"outputs"' "$1"
  [ "$code" = 200 ] && count_success ppocr_cls
}

# ---- inputs and references ----------------------------------------------------------

in="$work/in"
node "$src/scripts/ort/make_inputs.js" "$in" >/dev/null || { echo "test_server: make_inputs.js failed"; exit 1; }
node "$client" gen "$in/ppocr_rec_w160.npy" 1,3,48,160 160 || exit 1
ref="$work/ref"
refs=(
  "blazeface_front_128 blazeface_front_128"
  "blazeface_back_256 blazeface_back_256"
  "ppocr_cls ppocr_cls"
  "ppocr_rec ppocr_rec_w320"
  "ppocr_rec ppocr_rec_w160"
  "ppocr_det ppocr_det_640"
  "ppocr_det ppocr_det_320"
)
for r in "${refs[@]}"; do
  read -r file input <<<"$r"
  if ! "$es" run "$models/$file.onnx" "$in/$input.npy" --output-dir "$ref/$input" >"$work/run.log" 2>&1; then
    notok "edgeserve run $file $input (the reference) failed:"
    sed 's/^/#   /' "$work/run.log"
  fi
done
cls_hl=$(node "$client" build --input "x=$in/ppocr_cls.npy" --binary --binary-output --body "$work/cls.bin") || exit 1
echo "# inputs and references ready ($(($(date +%s) - t_start)) s)"

# Repository control on, with a token from a file (off by default: section 5
# checks the gate).
token=e2e-control-token-$RANDOM$RANDOM
echo "$token" >"$work/token"
auth=(-H "Authorization: Bearer $token" -H 'Content-Type: application/json')
start_server main --grace-ms 20000 --repository-control --control-token-file "$work/token" || exit 1
main_pid=$spid

# ---- 1. endpoints -----------------------------------------------------------------------

http GET /v2
expect 200 '"binary_tensor_data"' "GET /v2: server metadata with the binary extension"
http GET /v2/health/live
expect 200 '"live":true' "GET /v2/health/live"
http GET /v2/health/ready
expect 200 '"ready":true' "GET /v2/health/ready"
declare -A input_name=([blazeface_front]=input:0 [blazeface_back]=input:0 [ppocr_det]=x [ppocr_rec]=x [ppocr_cls]=x)
for m in blazeface_front blazeface_back ppocr_det ppocr_rec ppocr_cls; do
  for v in "" /versions/1; do
    http GET "/v2/models/$m$v"
    if [ "$code" = 200 ] && [ "$(get "$work/last.body" "j.name + ' ' + j.inputs[0].name + ' ' + j.inputs[0].datatype + ' ' + (j.outputs.length > 0)")" = "$m ${input_name[$m]} FP32 true" ]; then
      ok "GET /v2/models/$m$v: metadata"
    else
      notok "GET /v2/models/$m$v: metadata: $code $(head -c 300 "$work/last.body")"
    fi
    http GET "/v2/models/$m$v/ready"
    expect 200 '"ready":true' "GET /v2/models/$m$v/ready"
  done
done
http GET /v2/models/nosuchmodel
expect 404 "nosuchmodel" "GET /v2/models/nosuchmodel: 404 naming it"
http GET /v2/models/nosuchmodel/ready
expect 404 "nosuchmodel" "GET /v2/models/nosuchmodel/ready: 404"
# The URL arrives percent-decoded: a %0a in it must not write a line of its
# own into the access log.
http GET "/v2/models/evil%0aFORGED%20GET%20/v2%200.01%20ms"
expect 404 "" "GET with %0a in the path: 404"
sleep 0.2
if grep -q '^FORGED' "$work/main.err"; then
  notok "access log: a %0a in the URL wrote a forged line"
elif grep -qF 'evil\x0aFORGED' "$work/main.err"; then
  ok "access log: the %0a is written as \\x0a on the request's own line"
else
  notok "access log: the request with %0a is not logged: $(tail -n 3 "$work/main.err")"
fi
http GET /v2/models/ppocr_det/versions/2
expect 404 "version" "GET /v2/models/ppocr_det/versions/2: 404 naming the version"
http POST /v2/models/ppocr_det/versions/2/infer -d '{}'
expect 404 "version" "POST /v2/models/ppocr_det/versions/2/infer: 404"
http POST /v2/models/nosuchmodel/infer -d '{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]}]}'
expect 404 "nosuchmodel" "POST /v2/models/nosuchmodel/infer: 404"
http POST /v2/repository/index
if [ "$code" = 200 ] && [ "$(get "$work/last.body" "j.map(m => m.name + ':' + m.state).sort().join(' ')")" = \
     "blazeface_back:READY blazeface_front:READY face:READY ocr:READY ppocr_cls:READY ppocr_det:READY ppocr_rec:READY" ]; then
  ok "POST /v2/repository/index: the 5 models and 2 pipelines READY"
else
  notok "POST /v2/repository/index: $code $(head -c 400 "$work/last.body")"
fi

# ---- 2. inference equals `edgeserve run` ---------------------------------------------------

bf=input:0
infer_cmp "blazeface_front JSON = run" blazeface_front "$ref/blazeface_front_128" "$bf=$in/blazeface_front_128.npy"
infer_cmp "blazeface_front binary = run" blazeface_front "$ref/blazeface_front_128" "$bf=$in/blazeface_front_128.npy" --binary --binary-output
infer_cmp "blazeface_back binary = run" blazeface_back "$ref/blazeface_back_256" "$bf=$in/blazeface_back_256.npy" --binary --binary-output
infer_cmp "ppocr_cls JSON = run" ppocr_cls "$ref/ppocr_cls" "x=$in/ppocr_cls.npy"
infer_cmp "ppocr_cls binary = run" ppocr_cls "$ref/ppocr_cls" "x=$in/ppocr_cls.npy" --binary --binary-output
infer_cmp "ppocr_cls binary in, JSON out, via /versions/1 = run" ppocr_cls/versions/1 "$ref/ppocr_cls" "x=$in/ppocr_cls.npy" --binary
infer_cmp "ppocr_cls JSON in, output asked binary = run" ppocr_cls "$ref/ppocr_cls" "x=$in/ppocr_cls.npy" --output softmax_0.tmp_0:bin
infer_cmp "ppocr_rec 48x320 JSON = run" ppocr_rec "$ref/ppocr_rec_w320" "x=$in/ppocr_rec_w320.npy"
infer_cmp "ppocr_rec 48x320 binary = run" ppocr_rec "$ref/ppocr_rec_w320" "x=$in/ppocr_rec_w320.npy" --binary --binary-output
infer_cmp "ppocr_rec 48x160 (dynamic width) binary = run" ppocr_rec "$ref/ppocr_rec_w160" "x=$in/ppocr_rec_w160.npy" --binary --binary-output
infer_cmp "ppocr_det 640x640 binary = run" ppocr_det "$ref/ppocr_det_640" "x=$in/ppocr_det_640.npy" --binary --binary-output
t0=$(date +%s%N)
infer_cmp "ppocr_det 640x640 JSON (10 MB in, 5 MB out) = run" ppocr_det "$ref/ppocr_det_640" "x=$in/ppocr_det_640.npy"
echo "# det 640 JSON round trip: $((($(date +%s%N) - t0) / 1000000)) ms"
infer_cmp "ppocr_det 320x320 (dynamic) binary = run" ppocr_det "$ref/ppocr_det_320" "x=$in/ppocr_det_320.npy" --binary --binary-output

# Output selection: only the output asked for comes back.
out="$work/out/select"
node "$client" infer "$url" blazeface_front --input "$bf=$in/blazeface_front_128.npy" --binary \
  --output 'Identity_2:0:bin' --out "$out" >"$out.json" 2>&1
if [ "$(get "$out.json" "j.status + ' ' + (j.outputs || []).map(o => o.name).join(',')")" = "200 Identity_2:0" ] &&
   node "$client" cmp "$out" "$ref/blazeface_front_128" >/dev/null; then
  ok "blazeface_front: asking for one output returns only it, equal to run"
  count_success blazeface_front
else
  notok "blazeface_front output selection: $(head -c 300 "$out.json")"
fi

# ---- 3. priority and timeout ----------------------------------------------------------------

for p in 1 2 99; do
  infer_cmp "ppocr_cls with parameters.priority $p" ppocr_cls "$ref/ppocr_cls" "x=$in/ppocr_cls.npy" --binary --binary-output --priority $p
done
infer_cmp "ppocr_rec with timeout 60 s and priority 1" ppocr_rec "$ref/ppocr_rec_w320" "x=$in/ppocr_rec_w320.npy" --binary --binary-output --timeout 60000000 --priority 1
out="$work/out/tiny_timeout"
node "$client" infer "$url" ppocr_det --input "x=$in/ppocr_det_640.npy" --binary --binary-output --timeout 1 >"$out.json" 2>&1
st=$(get "$out.json" 'j.status')
ra=$(get "$out.json" 'j.headers["retry-after"] || ""')
if [ "$st" = 503 ] && [[ $ra =~ ^[0-9]+$ ]]; then
  ok "ppocr_det with timeout 1 us: 503 with Retry-After: $ra ($(get "$out.json" 'j.error'))"
  refused_deadline[ppocr_det]=1
elif [ "$st" = 200 ]; then
  ok "ppocr_det with timeout 1 us: 200 (it ran before the deadline was checked)"
  count_success ppocr_det
else
  notok "ppocr_det with timeout 1 us: want 503 with Retry-After or 200, got $(head -c 300 "$out.json")"
fi
http POST /v2/models/ppocr_cls/infer -d '{"inputs":[{"name":"x","shape":[1,3,1,1],"datatype":"FP32","data":[1,2,3]}],"parameters":{"priority":"high"}}'
expect 400 "priority" "parameters.priority \"high\": 400 naming priority"
http POST /v2/models/ppocr_cls/infer -d '{"inputs":[{"name":"x","shape":[1,3,1,1],"datatype":"FP32","data":[1,2,3]}],"parameters":{"timeout":-5}}'
expect 400 "timeout" "parameters.timeout -5: 400 naming timeout"

# ---- 4. malformed requests -------------------------------------------------------------------

cls_url=/v2/models/ppocr_cls/infer
bin=(-H 'Content-Type: application/octet-stream')
# Binary body problems.
head -c 1000 "$work/cls.bin" >"$work/trunc.bin"
http POST $cls_url "${bin[@]}" -H "Inference-Header-Content-Length: $cls_hl" --data-binary @"$work/trunc.bin"
expect 400 "past the end|truncated" "truncated binary body: 400"
http POST $cls_url "${bin[@]}" -H "Inference-Header-Content-Length: 99999999" --data-binary @"$work/cls.bin"
expect 400 "Inference-Header-Content-Length.*larger" "Inference-Header-Content-Length past the body: 400"
http POST $cls_url "${bin[@]}" -H "Inference-Header-Content-Length: -5" --data-binary @"$work/cls.bin"
expect 400 "Inference-Header-Content-Length" "Inference-Header-Content-Length -5: 400"
http POST $cls_url "${bin[@]}" -H "Inference-Header-Content-Length: twelve" --data-binary @"$work/cls.bin"
expect 400 "Inference-Header-Content-Length" "Inference-Header-Content-Length 'twelve': 400"
http POST $cls_url "${bin[@]}" -H "Inference-Header-Content-Length: 0" --data-binary @"$work/cls.bin"
expect 400 "Inference-Header-Content-Length" "Inference-Header-Content-Length 0: 400"
hl=$(node "$client" build --input "x=$in/ppocr_cls.npy" --binary --bds-add 4 --body "$work/bds.bin")
http POST $cls_url "${bin[@]}" -H "Inference-Header-Content-Length: $hl" --data-binary @"$work/bds.bin"
expect 400 "binary_data_size|needs [0-9]+ bytes" "binary_data_size 4 over the tensor: 400"
cat "$work/cls.bin" >"$work/extra.bin"
printf 'junk' >>"$work/extra.bin"
http POST $cls_url "${bin[@]}" -H "Inference-Header-Content-Length: $cls_hl" --data-binary @"$work/extra.bin"
expect 400 "4 bytes follow|add up" "4 bytes after the binary tensors: 400"
hl=$(node "$client" build --input "x=$in/ppocr_cls.npy" --binary --body "$work/nohdr.bin")
http POST $cls_url "${bin[@]}" --data-binary @"$work/nohdr.bin"
expect 400 "JSON|binary" "binary body without Inference-Header-Content-Length: 400"
good_cls "good request after the binary-body batch: 200"

# Tensor problems.
hl=$(node "$client" build --input "x=$in/ppocr_cls.npy" --binary --shape x=1,3,48 --body "$work/rank.bin")
http POST $cls_url "${bin[@]}" -H "Inference-Header-Content-Length: $hl" --data-binary @"$work/rank.bin"
expect 400 "'x'" "cls shape [1,3,48] (rank 3): 400 naming input x"
hl=$(node "$client" build --input "x=$in/ppocr_cls.npy" --binary --shape x=1,4,48,144 --body "$work/dim.bin")
http POST $cls_url "${bin[@]}" -H "Inference-Header-Content-Length: $hl" --data-binary @"$work/dim.bin"
expect 400 "'x'.*dimension 1|dimension 1.*'x'" "cls shape [1,4,48,144] (channels fixed to 3): 400 naming dimension 1"
out="$work/out/bfdim"
node "$client" infer "$url" blazeface_front --input "$bf=$in/ppocr_cls.npy" --binary >"$out.json" 2>&1
if [ "$(get "$out.json" 'j.status')" = 400 ] && grep -q "input:0" "$out.json"; then
  ok "blazeface_front given [1,3,48,192] (fixed [1,128,128,3]): 400 naming input:0"
else
  notok "blazeface_front given [1,3,48,192]: $(head -c 300 "$out.json")"
fi
hl=$(node "$client" build --input "x=$in/ppocr_cls.npy" --binary --datatype x=INT64 --shape x=1,3,48,96 --body "$work/dt.bin")
http POST $cls_url "${bin[@]}" -H "Inference-Header-Content-Length: $hl" --data-binary @"$work/dt.bin"
expect 400 "INT64" "cls x as INT64: 400 naming the datatype"
http POST $cls_url -d '{"inputs":[{"name":"x","shape":[1,3,48,192],"datatype":"FP64X","data":[1]}]}'
expect 400 "FP64X|datatype" "unknown datatype FP64X: 400"
http POST $cls_url -d '{"inputs":[{"name":"x","shape":[100000,100000,100000,3],"datatype":"FP32","data":[1,2,3]}]}'
expect 400 "100000|limit|too large" "shape [100000,100000,100000,3]: 400"
j='{"inputs":[{"name":"x","shape":[100000,100000,100000,3],"datatype":"FP32","parameters":{"binary_data_size":4}}]}'
http POST $cls_url "${bin[@]}" -H "Inference-Header-Content-Length: ${#j}" --data-binary "${j}abcd"
expect 400 "" "binary, shape [100000,100000,100000,3]: 400"
http POST $cls_url -d '{"inputs":[{"name":"x","shape":[1,3,-48,192],"datatype":"FP32","data":[1]}]}'
expect 400 "'x'|shape|negative" "negative dimension: 400"
http POST $cls_url -d '{"inputs":[{"name":"x","shape":[1,3,48,192],"datatype":"FP32","data":[1,2,3]}]}'
expect 400 "elements|fewer" "JSON data shorter than the shape: 400"
good_cls "good request after the tensor batch: 200"

# JSON problems.
http POST $cls_url -d '{"inputs":[{"name":"x",'
expect 400 "JSON" "invalid JSON (cut off): 400"
http POST $cls_url -d 'not json at all'
expect 400 "JSON" "invalid JSON (text): 400"
http POST $cls_url -d '{"outputs":[{"name":"softmax_0.tmp_0"}]}'
expect 400 '"inputs"|inputs' "no \"inputs\": 400"
http POST $cls_url -d '{"inputs":[]}'
expect 400 "inputs" "empty \"inputs\": 400"
http POST $cls_url -d '{"inputs":[{"name":"y","shape":[1,3,48,192],"datatype":"FP32","data":[0]}]}'
expect 400 "'y'|'x' is missing" "unknown input name 'y': 400 naming y (or the missing x)"
http POST $cls_url -d '{"inputs":[{"name":"x","shape":[1,3,1,1],"datatype":"FP32","data":[1,2,3]},{"name":"y","shape":[1],"datatype":"FP32","data":[1]}]}'
expect 400 "inputs|'y'" "an extra input 'y': 400"
http POST $cls_url -H 'Content-Type: application/json' --data-binary ''
expect 400 "empty|body" "empty body: 400"
good_cls "good request after the JSON batch: 200"

# Routes and methods.
http GET /v2/nothing
expect 404 "route" "GET /v2/nothing: 404"
http GET /v3
expect 404 "" "GET /v3: 404"
http GET /
expect 404 "" "GET /: 404"
http POST /v2/models/ppocr_cls/predict -d '{}'
expect 404 "route" "POST /v2/models/ppocr_cls/predict: 404"
http GET /v2/models/ppocr_cls/infer
expect "404|405" "" "GET on /infer: 404/405"
http DELETE /v2/models/ppocr_cls
expect "404|405" "" "DELETE /v2/models/ppocr_cls: 404/405"
http POST /v2/health/live -d ''
expect "404|405" "" "POST /v2/health/live: 404/405"
http GET /v2/repository/index
expect "404|405" "" "GET /v2/repository/index: 404/405"
http PUT /v2/repository/models/ppocr_cls/load -d ''
expect "404|405" "" "PUT .../load: 404/405"
good_cls "good request after the route batch: 200"

# Transport: chunked uploads, and a client that hangs up mid-body.
http POST $cls_url "${bin[@]}" -H "Inference-Header-Content-Length: $cls_hl" -H 'Transfer-Encoding: chunked' \
  --data-binary @"$work/cls.bin"
expect 200 '"outputs"' "chunked upload (no Content-Length) of a good cls request: 200"
[ "$code" = 200 ] && count_success ppocr_cls
port=${url##*:}
if exec 3<>"/dev/tcp/127.0.0.1/$port"; then
  printf 'POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/octet-stream\r\nInference-Header-Content-Length: %s\r\nContent-Length: %s\r\n\r\n' \
    "$cls_url" "$cls_hl" "$(stat -c %s "$work/cls.bin")" >&3
  head -c 5000 "$work/cls.bin" >&3
  exec 3>&- 3<&-
  sleep 0.2
fi
good_cls "good request after a client hung up mid-body: 200"

# ---- 4b. pipelines: answers from an image over HTTP ------------------------------------

# pipe MODEL FILE: POST the file as one BYTES element (binary extension);
# prints the status and the answer's JSON string on one line.
pipe() {
  node -e '
    const fs = require("fs");
    const [url, model, file] = process.argv.slice(1);
    const img = fs.readFileSync(file), len = Buffer.alloc(4);
    len.writeUInt32LE(img.length);
    const hdr = JSON.stringify({inputs: [{name: "image", shape: [1], datatype: "BYTES",
                                          parameters: {binary_data_size: img.length + 4}}]});
    fetch(url + "/v2/models/" + model + "/infer", {method: "POST",
      headers: {"Inference-Header-Content-Length": String(hdr.length)},
      body: Buffer.concat([Buffer.from(hdr), len, img])})
      .then(async (r) => { const t = await r.text(); let a = "";
        try { a = JSON.parse(t).outputs[0].data[0]; } catch (e) { a = t; }
        console.log(r.status + " " + a); })
      .catch((e) => console.log("000 " + e.message));' "$url" "$1" "$2"
}
imgdir=${ES_IMAGE_DIR:-$src/.cache/images}
inlined() { curl -s "$url/metrics" | sed -n 's/^edgeserve_task_stages_inline_total //p'; }
if [ -f "$imgdir/astronaut.png" ] && [ -f "$imgdir/coffee.png" ]; then
  # The face in FILE over HTTP against the box picked by hand in
  # tests/apps/test_face.c, [181, 80, 267, 186]: IoU at least 0.5.
  astronaut_face() { # FILE LABEL
    local res iou
    res=$(pipe face "$1")
    iou=$(node -e '
      const a = JSON.parse(process.argv[1].slice(4)).faces[0], h = [181, 80, 267, 186];
      if (!a) { console.log(0); process.exit(); }
      const b = a.box, ix = Math.max(0, Math.min(b[2], h[2]) - Math.max(b[0], h[0])),
            iy = Math.max(0, Math.min(b[3], h[3]) - Math.max(b[1], h[1])), i = ix * iy;
      console.log((i / ((b[2]-b[0])*(b[3]-b[1]) + (h[2]-h[0])*(h[3]-h[1]) - i)).toFixed(3));' "$res" 2>/dev/null || echo 0)
    [[ $res == 200* ]] && node -e 'process.exit(+process.argv[1] >= 0.5 ? 0 : 1)' "$iou" &&
      ok "face pipeline over HTTP: $2 face IoU $iou" ||
      notok "face pipeline on $2: IoU $iou: ${res:0:300}"
  }
  i0=$(inlined)
  astronaut_face "$imgdir/astronaut.png" astronaut.png
  i1=$(inlined)
  # A pipeline is one task: its decode and its detector ran on the worker
  # that took it (nothing else runs now: the detector's first queued
  # request is kept for the task).
  [ -n "$i0" ] && [ -n "$i1" ] && [ $((i1 - i0)) -ge 2 ] &&
    ok "face pipeline: decode and detector ran on the task's worker ($((i1 - i0)) stages inline)" ||
    notok "face pipeline stages inline: '$i0' -> '$i1'"
  if command -v convert >/dev/null; then
    # A JPEG is decoded no larger than the detector reads (512x512 at 1/4
    # for the front model's 128): the box still comes back in its pixels.
    convert "$imgdir/astronaut.png" -quality 90 "$work/astronaut.jpg"
    astronaut_face "$work/astronaut.jpg" "astronaut as a JPEG (decoded at 1/4)"
  else
    skipped "face pipeline on a JPEG (no ImageMagick; scripts/setup/deps.sh)"
  fi
  res=$(pipe face "$imgdir/coffee.png")
  [[ $res == '200 {"faces":[]}' ]] && ok "face pipeline over HTTP: no face in coffee.png" ||
    notok "face pipeline on coffee.png: ${res:0:300}"
else
  skipped "face pipeline over HTTP (no test images; scripts/setup/fetch-images.sh)"
fi
font=$(fc-match -f '%{file}' DejaVuSans 2>/dev/null || true)
if command -v convert >/dev/null && [ -f "$font" ]; then
  want="Serial AB-2024-7731 OK"
  convert -size 720x120 xc:white -font "$font" -pointsize 44 -fill black \
    -annotate +20+80 "$want" "$work/plate.png"
  res=$(pipe ocr "$work/plate.png")
  acc=$(node -e '
    const want = process.argv[1].replace(/\s/g, ""), r = process.argv[2];
    const got = (JSON.parse(r.slice(4)).lines || []).map((l) => l.text).join("").replace(/\s/g, "");
    const d = Array.from({length: want.length + 1}, (_, i) => [i]);
    for (let j = 1; j <= got.length; j++) d[0][j] = j;
    for (let i = 1; i <= want.length; i++) for (let j = 1; j <= got.length; j++)
      d[i][j] = Math.min(d[i-1][j] + 1, d[i][j-1] + 1, d[i-1][j-1] + (want[i-1] == got[j-1] ? 0 : 1));
    console.log((1 - d[want.length][got.length] / want.length).toFixed(3));' "$want" "$res" 2>/dev/null || echo 0)
  [[ $res == 200* ]] && node -e 'process.exit(+process.argv[1] >= 0.95 ? 0 : 1)' "$acc" &&
    ok "ocr pipeline over HTTP: character accuracy $acc" ||
    notok "ocr pipeline: accuracy $acc: ${res:0:300}"
else
  skipped "ocr pipeline over HTTP (no ImageMagick or DejaVu font; scripts/setup/deps.sh)"
fi
# The ocr pipeline over HTTP answers what `edgeserve ocr` answers: the
# photographed book page's lines, text for text (one code path, the same
# defaults; the plate stream of the main job reads through it too).
if [ -f "$imgdir/page.png" ]; then
  res=$(pipe ocr "$imgdir/page.png")
  "$es" ocr "$imgdir/page.png" --json >"$work/page_cli.json" 2>/dev/null
  if [[ $res == 200* ]] && node -e '
      const fs = require("fs");
      const http = JSON.parse(process.argv[1].slice(4)).lines.map((l) => l.text);
      const cli = JSON.parse(fs.readFileSync(process.argv[2])).lines.map((l) => l.text);
      console.log("# http: " + http.join(" | "));
      process.exit(http.length >= 6 && JSON.stringify(http) === JSON.stringify(cli) ? 0 : 1);' \
      "$res" "$work/page_cli.json"; then
    ok "ocr pipeline over HTTP = edgeserve ocr on the photographed page"
  else
    notok "ocr pipeline over HTTP differs from edgeserve ocr: ${res:0:300}"
  fi
else
  skipped "ocr over HTTP against the CLI (no page.png; scripts/setup/fetch-images.sh)"
fi
printf 'not an image' >"$work/bad.img"
res=$(pipe face "$work/bad.img")
[[ $res == 400* ]] && grep -q "not a JPEG or PNG" <<<"$res" && ok "pipeline: a corrupt image is a 400" ||
  notok "pipeline on a corrupt image: ${res:0:300}"

# ---- 5. unload and load ---------------------------------------------------------------------

# The control plane's gate: a token, the server's own origin, JSON or no body.
http POST /v2/repository/models/blazeface_back/unload -d ''
expect 401 "Bearer" "unload without a token: 401"
[[ $(header WWW-Authenticate) == Bearer* ]] && ok "401 carries WWW-Authenticate: Bearer" ||
  notok "401 without WWW-Authenticate: Bearer: '$(header WWW-Authenticate)'"
http POST /v2/repository/models/blazeface_back/unload -H "Authorization: Bearer x$token" -d ''
expect 401 "not the control token" "unload with another token: 401"
http POST /v2/repository/models/blazeface_back/unload -H "Authorization: Bearer $token" \
  -H 'Origin: http://evil.example' -H 'Content-Type: text/plain' -d '{}'
expect 403 "Origin" "a web page's cross-origin simple POST, even with the token: 403"
http POST /v2/repository/models/blazeface_back/unload -H "Authorization: Bearer $token" \
  -H 'Content-Type: text/plain' -d '{}'
expect 415 "application/json" "unload with a text/plain body: 415"
http POST /v2/repository/index
st=$(get "$work/last.body" "j.filter(m => m.name == 'blazeface_back').map(m => m.state).join()")
[ "$st" = READY ] && ok "the refused unloads left blazeface_back READY" || notok "blazeface_back is $st"
# A pipeline runs on ppocr_cls: it goes first (409 until then).
http POST /v2/repository/models/ppocr_cls/unload "${auth[@]}" -d ''
expect 409 "pipeline 'ocr'" "unload of ppocr_cls while the ocr pipeline runs on it: 409"
http POST /v2/repository/models/ocr/unload "${auth[@]}" -H "Origin: $url" -d '{}'
expect 200 "" "unload of the ocr pipeline (same-origin, JSON body): 200"
http POST /v2/repository/models/ppocr_cls/unload "${auth[@]}" -d ''
expect 200 "" "POST /v2/repository/models/ppocr_cls/unload: 200"
http POST /v2/repository/index
st=$(get "$work/last.body" "j.filter(m => m.name == 'ppocr_cls').map(m => m.state).join()")
[ "$code/$st" = 200/UNAVAILABLE ] && ok "index: ppocr_cls UNAVAILABLE after unload" ||
  notok "index after unload: $code $(head -c 400 "$work/last.body")"
http GET /v2/models/ppocr_cls/ready
expect 503 '"ready":false' "GET /v2/models/ppocr_cls/ready after unload: 503"
http GET /v2/models/ppocr_cls
expect 404 "not loaded" "GET /v2/models/ppocr_cls after unload: 404"
http POST $cls_url "${bin[@]}" -H "Inference-Header-Content-Length: $cls_hl" --data-binary @"$work/cls.bin"
expect 404 "not loaded" "infer on the unloaded ppocr_cls: 404"
http POST /v2/repository/models/ppocr_cls/unload "${auth[@]}" -d ''
expect 200 "" "unload again: 200 (no-op)"
http POST /v2/repository/models/nosuchmodel/unload "${auth[@]}" -d ''
expect 404 "nosuchmodel" "unload of an unknown model: 404"
http POST /v2/repository/models/ppocr_cls/load "${auth[@]}" -d ''
expect 200 "" "POST /v2/repository/models/ppocr_cls/load: 200"
http POST /v2/repository/index
st=$(get "$work/last.body" "j.filter(m => m.name == 'ppocr_cls').map(m => m.state).join()")
[ "$code/$st" = 200/READY ] && ok "index: ppocr_cls READY after load" ||
  notok "index after load: $code $(head -c 400 "$work/last.body")"
http GET /v2/models/ppocr_cls/ready
expect 200 '"ready":true' "GET /v2/models/ppocr_cls/ready after load: 200"
http POST /v2/repository/models/ocr/load "${auth[@]}" -d ''
expect 200 "" "POST /v2/repository/models/ocr/load: 200"
infer_cmp "ppocr_cls after unload + load = run" ppocr_cls "$ref/ppocr_cls" "x=$in/ppocr_cls.npy" --binary --binary-output

# ---- 6. metrics ---------------------------------------------------------------------------------

http GET /metrics
cp "$work/last.body" "$work/metrics.txt"
if [ "$code" != 200 ]; then
  notok "GET /metrics: $code"
elif command -v promtool >/dev/null; then
  if promtool check metrics <"$work/metrics.txt" >"$work/promtool.log" 2>&1; then
    ok "GET /metrics passes promtool check metrics"
  else
    notok "promtool check metrics:"
    head -20 "$work/promtool.log" | sed 's/^/#   /'
  fi
else
  skipped "promtool is missing, the exposition format is not checked (scripts/setup/deps.sh)"
fi
metric() { # NAME LABELS: the value, 0 when absent
  awk -v k="$1{$2}" '$1 == k {v = $2} END {print v == "" ? 0 : v}' "$work/metrics.txt"
}
for m in blazeface_front blazeface_back ppocr_det ppocr_rec ppocr_cls; do
  got=$(metric edgeserve_requests_total "model=\"$m\",outcome=\"success\"")
  [ "$got" = "${succ[$m]:-0}" ] && ok "metrics: $m success counter $got = the 200s received" ||
    notok "metrics: $m success counter $got, the test received ${succ[$m]:-0} 200s"
  got=$(metric edgeserve_compute_duration_seconds_count "model=\"$m\"")
  [ "$got" = "${succ[$m]:-0}" ] && ok "metrics: $m compute histogram count $got" ||
    notok "metrics: $m compute histogram count $got, want ${succ[$m]:-0}"
done
for m in face ocr; do # a pipeline's answers report the task's wait for a worker
  n=$(metric edgeserve_queue_duration_seconds_count "model=\"$m\"")
  t=$(metric edgeserve_queue_duration_seconds_sum "model=\"$m\"")
  [ "$n" -gt 0 ] 2>/dev/null || continue # no pipeline answers here (4b skipped)
  awk -v t="$t" 'BEGIN { exit !(t > 0) }' && ok "metrics: $m queue histogram: $n answers, $t s waiting in all" ||
    notok "metrics: $m queue histogram: $n answers but $t s waiting in all"
done
got=$(metric edgeserve_requests_total 'model="ppocr_cls",outcome="bad_request"')
[ "$got" -ge 15 ] 2>/dev/null && ok "metrics: ppocr_cls bad_request counter moved ($got)" ||
  notok "metrics: ppocr_cls bad_request counter is '$got' after more than 15 bad requests"
got=$(metric edgeserve_refused_total 'model="ppocr_det",reason="deadline"')
[ "$got" = "${refused_deadline[ppocr_det]:-0}" ] && ok "metrics: ppocr_det deadline refusals $got" ||
  notok "metrics: ppocr_det deadline refusals $got, want ${refused_deadline[ppocr_det]:-0}"
got=$(metric edgeserve_model_loaded 'model="ppocr_cls"')
[ "$got" = 1 ] && ok "metrics: ppocr_cls loaded" || notok "metrics: edgeserve_model_loaded ppocr_cls is '$got'"
got=$(awk '$1 == "edgeserve_http_responses_total" {print $2}' "$work/metrics.txt")
[ "${got:-0}" -gt 50 ] 2>/dev/null && ok "metrics: edgeserve_http_responses_total $got" ||
  notok "metrics: edgeserve_http_responses_total is '$got'"

# ---- 7. SIGTERM with requests in flight ------------------------------------------------------------

# sigterm_inflight NAME PID N BODY HL MODEL GRACE_S MIN: N concurrent
# requests (JSON outputs: a large response to encode and send), SIGTERM once
# the runtime holds MIN of them (or after 2 s), then every one must be
# answered in full: 200, or 503 when cut off.
sigterm_inflight() {
  local name=$1 pid=$2 n=$3 body=$4 hl=$5 model=$6 grace=$7 min=$8 i
  for ((i = 1; i <= n; i++)); do
    (curl -s -m 120 -o "$work/sig$name$i.body" -w '%{http_code}' -X POST \
       -H 'Content-Type: application/octet-stream' -H "Inference-Header-Content-Length: $hl" \
       --data-binary @"$body" "$url/v2/models/$model/infer" >"$work/sig$name$i.code"
     echo $? >"$work/sig$name$i.rc") &
  done
  local inflight=0
  for ((i = 0; i < 100 && inflight < min; i++)); do
    inflight=$(curl -s "$url/metrics" | awk '$1 == "edgeserve_inflight_requests" {print $2}')
    inflight=${inflight:-0}
    sleep 0.02
  done
  local t0
  t0=$(date +%s%N)
  kill -TERM "$pid"
  wait_exit "$pid" $((grace + 30))
  local rc=$? ms=$((($(date +%s%N) - t0) / 1000000))
  wait # the clients
  [ $rc = 0 ] && ok "server '$name': SIGTERM with $inflight+ requests in the runtime: exit 0 after $ms ms (grace ${grace}s)" ||
    notok "server '$name': SIGTERM: exit status $rc after $ms ms (255: still running after grace + 30 s)"
  local codes="" bad=0 c r
  for ((i = 1; i <= n; i++)); do
    c=$(cat "$work/sig$name$i.code" 2>/dev/null)
    r=$(cat "$work/sig$name$i.rc" 2>/dev/null)
    codes+=" $c/curl-rc$r"
    if ! { [ "$c" = 200 ] || [ "$c" = 503 ]; } || [ "$r" != 0 ]; then
      bad=$((bad + 1))
    elif [ "$c" = 200 ] && [ "$(get "$work/sig$name$i.body" '(j.outputs || []).length')" != 1 ]; then
      bad=$((bad + 1))
      codes+="(incomplete body)"
    fi
  done
  [ $bad = 0 ] && ok "server '$name': all $n in-flight requests answered in full with 200/503:$codes" ||
    notok "server '$name': $bad of $n in-flight requests not answered in full with 200/503 (status/curl exit):$codes"
  local line
  line=$(grep 'edgeserve: stopped: .* served; .* in flight at the signal, .* finished in the grace period, .* cut off; drained in' "$work/$name.err")
  [ -n "$line" ] && ok "server '$name': report line: ${line#edgeserve: }" ||
    notok "server '$name': no 'stopped: ... cut off' report on stderr: $(tail -3 "$work/$name.err")"
  sanitizer_clean "$name"
}

det_hl=$(node "$client" build --input "x=$in/ppocr_det_640.npy" --binary --body "$work/det640.bin")
sigterm_inflight main "$main_pid" 4 "$work/det640.bin" "$det_hl" ppocr_det 20 2

# ---- 8. a server from a config file: body limit, chunked uploads, no grace ---------------------------
# One worker, so that SIGTERM finds det requests queued and cuts them off.

cat >"$work/server.json" <<'EOF'
{"max_body_bytes": "2M", "workers": 1, "queue_capacity": 16}
EOF
if start_server small --config "$work/server.json" --grace-ms 0; then
  small_pid=$spid
  http POST /v2/repository/models/ppocr_cls/unload -d ''
  expect 403 "disabled" "repository control off by default: unload gets 403"
  http POST /v2/models/ppocr_det/infer "${bin[@]}" -H "Inference-Header-Content-Length: $det_hl" --data-binary @"$work/det640.bin"
  expect 413 "limit" "max_body_bytes 2M: a 4.9 MB body gets 413 naming the limit"
  http POST /v2/models/ppocr_det/infer "${bin[@]}" -H "Inference-Header-Content-Length: $det_hl" \
    -H 'Transfer-Encoding: chunked' --data-binary @"$work/det640.bin"
  expect 413 "limit" "max_body_bytes 2M: a chunked 4.9 MB upload gets 413"
  good_cls "good request after the 413s: 200"
  http POST $cls_url "${bin[@]}" -H "Inference-Header-Content-Length: $cls_hl" -H 'Transfer-Encoding: chunked' \
    --data-binary @"$work/cls.bin"
  expect 200 '"outputs"' "max_body_bytes 2M: a chunked 110 KB upload gets 200"
  det3_hl=$(node "$client" build --input "x=$in/ppocr_det_320.npy" --binary --body "$work/det320.bin")
  infer_cmp "config server: ppocr_det 320x320 (1.2 MB, under the limit) = run" ppocr_det "$ref/ppocr_det_320" "x=$in/ppocr_det_320.npy" --binary --binary-output
  sigterm_inflight small "$small_pid" 8 "$work/det320.bin" "$det3_hl" ppocr_det 0 6
fi

# ---- real-time scheduling of the urgent levels (--rt-priority) ----------------------------------
# threads_at PID PRIO: how many of the process's threads are SCHED_FIFO at
# PRIO (/proc/PID/task/*/stat: rt_priority and policy, fields 40 and 41).
threads_at() {
  local t n=0 f
  for t in /proc/"$1"/task/*/stat; do
    f=$(sed 's/.*) //' "$t" 2>/dev/null | awk '{print $38, $39}')
    [ "$f" = "$2 1" ] && n=$((n + 1))
  done
  echo $n
}
if chrt -f 10 true 2>/dev/null; then
  if start_server rt --rt-priority 10 --workers 2; then
    rt_pid=$spid
    good_cls "--rt-priority 10: a request gets 200"
    w=$(threads_at "$rt_pid" 10) h=$(threads_at "$rt_pid" 9)
    [ "$w" = 2 ] && [ "$h" -ge 1 ] && ok "--rt-priority 10: the 2 idle workers wait as SCHED_FIFO 10, $h HTTP thread(s) at 9" ||
      notok "--rt-priority 10: $w threads at SCHED_FIFO 10 (want the 2 workers), $h at 9 (want an HTTP thread)"
    kill -TERM "$rt_pid"
    wait_exit "$rt_pid" 30 && ok "--rt-priority 10: SIGTERM: exit 0" || notok "--rt-priority 10: SIGTERM: exit status $?"
    sanitizer_clean rt
  fi
  # the refusal: the same server without CAP_SYS_NICE (RLIMIT_RTPRIO 0)
  if command -v setpriv >/dev/null; then
    refuse() { ulimit -r 0 && exec setpriv --inh-caps=-sys_nice --bounding-set=-sys_nice "$@"; }
    (refuse "$es" serve --port 0 --rt-priority 10) 2>"$work/rt-refused.err" >/dev/null
    st=$?
  else
    st=skip
  fi
else
  "$es" serve --port 0 --rt-priority 10 2>"$work/rt-refused.err" >/dev/null
  st=$?
fi
if [ "$st" = skip ]; then
  skipped "--rt-priority refused: no setpriv to take CAP_SYS_NICE away"
elif [ "$st" = 1 ] && grep -q 'rt_priority 10: the system refuses real-time scheduling.*RLIMIT_RTPRIO' "$work/rt-refused.err"; then
  ok "--rt-priority 10 where real-time threads are not allowed: exit 1, $(grep -o 'the system refuses real-time scheduling' "$work/rt-refused.err")"
else
  notok "--rt-priority 10 where real-time threads are not allowed: exit $st, $(head -c 300 "$work/rt-refused.err")"
fi

echo "# $n_ok passed, $n_fail failed, $n_skip skipped in $(($(date +%s) - t_start)) s"
[ $n_fail -eq 0 ] || exit 1
[ $n_skip -eq 0 ] || exit 77
