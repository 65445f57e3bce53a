#!/usr/bin/env bash
# Data-dependent output shapes, end to end: a detector's tail (NonMaxSuppression,
# then the kept boxes gathered and TopK of their scores with k from the kept
# count; tests/e2e/seq_model.c --nms) through the CLI and over KServe v2.
#   1. `edgeserve inspect --shape` prints the outputs' bounds and what sets
#      them (NonMaxSuppression: 1 batch x 1 class x 4 per class);
#   2. `edgeserve serve`: one request keeps 3 boxes (ONNX's suppress_by_IOU
#      example), its outputs come back at their actual shapes [1,3,4] and
#      [1,1,2] with the right values; one whose scores are all 0 keeps none:
#      shapes [1,0,4] and [1,1,0], empty data; the same plan serves both;
#   3. the server's stderr has no sanitizer report and it exits 0 on SIGTERM.
# Prints "ok - ..." / "not ok - ..." lines; exits 1 if any failed, 77 when
# node or curl is missing.
#   test_server_dynamic.sh EDGESERVE_BINARY ES_SEQ_MODEL_BINARY SOURCE_DIR
set -uo pipefail
es=$1
mk=$2
src=$3
. "$src/tests/e2e/serve_lib.sh"
serve_begin test_server_dynamic

mkdir -p "$work/repo/nms"
"$mk" --nms "$work/repo/nms/model.onnx" || { echo "not ok - es_seq_model wrote the model"; exit 1; }

# 1. the bounds, as inspect prints them
"$es" inspect "$work/repo/nms/model.onnx" --shape boxes=1x6x4 --shape scores=1x1x6 \
  >"$work/inspect" 2>&1
sed 's/^/# /' "$work/inspect" | grep -E 'output|bound|follow'
check "inspect prints output kept at its bound [1,4,4]" \
  grep -q "output kept \[1,4,4\] at most" "$work/inspect"
check "inspect says NonMaxSuppression's bound and what sets it" \
  grep -q "sel \[<=4,3\] from node 'sel' (#0 NonMaxSuppression), bounded by 1 batch x 1 class x 4 per class (max_output_boxes_per_class)" "$work/inspect"

# 2. served
"$es" serve --model-repository "$work/repo" --port 0 --workers 2 --memory 64M \
  >"$work/out" 2>"$work/err" &
pid=$!
await_server nms "$pid" "$work/err" || exit 1

body() { # SCORES (6 comma-separated): the request
  printf '{"inputs":[{"name":"boxes","shape":[1,6,4],"datatype":"FP32","data":[%s]},' \
    "0,0,1,1, 0,0.1,1,1.1, 0,-0.1,1,0.9, 0,10,1,11, 0,10.1,1,11.1, 0,100,1,101"
  printf '{"name":"scores","shape":[1,1,6],"datatype":"FP32","data":[%s]}]}' "$1"
}
infer() { # SCORES: the response body; the status in $work/status
  body "$1" >"$work/req"
  curl -s -o "$work/res" -w '%{http_code}' -H 'Content-Type: application/json' \
    --data-binary @"$work/req" "$url/v2/models/nms/infer" >"$work/status"
  cat "$work/res"
}
out_field() { # RESPONSE NAME EXPR(o): EXPR over output NAME
  node -e 'const j = JSON.parse(process.argv[1]);
           const o = j.outputs.find(x => x.name === process.argv[2]);
           console.log(JSON.stringify(eval(process.argv[3])))' "$1" "$2" "$3"
}

res=$(infer "0.9,0.75,0.6,0.95,0.5,0.3")
echo "# $res"
check "3 boxes kept: 200" test "$(cat "$work/status")" = 200
check "kept comes back at its actual shape [1,3,4]" test "$(out_field "$res" kept o.shape)" = "[1,3,4]"
check "kept holds boxes 3, 0 and 5" \
  test "$(out_field "$res" kept o.data)" = "[0,10,1,11,0,0,1,1,0,100,1,101]"
check "best comes back at [1,1,2]: min(3 kept, 2)" test "$(out_field "$res" best o.shape)" = "[1,1,2]"
check "best holds the two best scores" \
  test "$(out_field "$res" best 'o.data.map(v => v.toFixed(2))')" = '["0.95","0.90"]'

res=$(infer "0,0,0,0,0,0")
echo "# $res"
check "nothing kept: 200" test "$(cat "$work/status")" = 200
check "kept comes back empty, [1,0,4]" test "$(out_field "$res" kept o.shape)" = "[1,0,4]"
check "best comes back empty, [1,1,0]" test "$(out_field "$res" best o.shape)" = "[1,1,0]"
check "empty outputs carry no data" test "$(out_field "$res" kept o.data.length)" = 0

res=$(infer "0.9,0.75,0.6,0.95,0.5,0.3")
check "the same plan serves 3 boxes again" test "$(out_field "$res" kept o.shape)" = "[1,3,4]"

# 3. clean exit
kill -TERM "$pid"
wait "$pid"
rc=$?
pid=
check "server exits 0 on SIGTERM" test "$rc" = 0
if grep -qE 'Sanitizer|runtime error' "$work/err"; then
  notok "no sanitizer report"
  sed 's/^/#   /' "$work/err" | head -40
else
  ok "no sanitizer report"
fi
[ "$n_fail" = 0 ]
