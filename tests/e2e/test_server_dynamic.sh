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
#   3. a Loop no bound covers (seq_model.c --loop: m iterations, each step
#      of 16 KiB stacked): m = 5 answers 200 with acc0 + 5 and steps [5,4096];
#      m = 20000 (312 MiB of steps, past the 64 MiB budget) is refused 503
#      with a Retry-After while it runs, and the server keeps serving: m = 3
#      answers 200 after it; edgeserve_run_heap_bytes is back at 0;
#   4. the server's stderr has no sanitizer report and it exits 0 on SIGTERM.
# Prints "ok - ..." / "not ok - ..." lines; exits 1 if any failed, 77 when
# node or curl is missing.
#   test_server_dynamic.sh EDGESERVE_BINARY ES_SEQ_MODEL_BINARY SOURCE_DIR
set -uo pipefail
es=$1
mk=$2
src=$3
. "$src/tests/e2e/serve_lib.sh"
serve_begin test_server_dynamic

mkdir -p "$work/repo/nms" "$work/repo/loop"
"$mk" --nms "$work/repo/nms/model.onnx" || { echo "not ok - es_seq_model wrote the model"; exit 1; }
"$mk" --loop 4096 "$work/repo/loop/model.onnx" ||
  { echo "not ok - es_seq_model wrote the loop model"; exit 1; }

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

# 3. a Loop no bound covers: its memory from the buddy pool, charged to the request
loop_req() { # M: the request (acc0 = 0.5 everywhere; only acc asked for when M > 10)
  node -e 'const m = +process.argv[1];
    const r = {inputs: [{name: "m", shape: [], datatype: "INT64", data: [m]},
                        {name: "acc0", shape: [4096], datatype: "FP32", data: Array(4096).fill(0.5)}]};
    if (m > 10) r.outputs = [{name: "acc"}];
    console.log(JSON.stringify(r))' "$1" >"$work/req"
  curl -s -D "$work/hdr" -o "$work/res" -w '%{http_code}' -H 'Content-Type: application/json' \
    --data-binary @"$work/req" "$url/v2/models/loop/infer" >"$work/status"
  cat "$work/res"
}
res=$(loop_req 5)
check "a Loop of 5 iterations: 200" test "$(cat "$work/status")" = 200
check "acc = acc0 + 5" test "$(out_field "$res" acc 'o.data.every(v => v === 5.5)')" = true
check "steps come back at [5,4096]" test "$(out_field "$res" steps o.shape)" = "[5,4096]"
check "step 3 = acc0 + 4" test "$(out_field "$res" steps 'o.data[3 * 4096 + 17]')" = 4.5
res=$(loop_req 20000)
echo "# $(head -c 300 "$work/res")"
check "a Loop past the budget: 503" test "$(cat "$work/status")" = 503
check "its 503 carries Retry-After" grep -qi '^retry-after: [0-9]' "$work/hdr"
res=$(loop_req 3)
check "the model serves again: 200" test "$(cat "$work/status")" = 200
check "acc = acc0 + 3" test "$(out_field "$res" acc 'o.data.every(v => v === 3.5)')" = true
check "the run heap is back at 0 B" \
  sh -c "curl -s '$url/metrics' | grep -q '^edgeserve_run_heap_bytes 0\$'"

# 4. clean exit
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
